"""Validation of pipeline-register placements shared by the RTL components.

Two kinds of knobs place registers: the FWHT ``latency`` (how many of the
log2 N butterfly stages end in a register, :mod:`hw.fwht` / :mod:`hw.ifwht`)
and named *cuts* (a subset of a component's fixed list of cut points, e.g.
``hw.quantizer.QUANT_CUTS``, ``hw.frontend.FE_CUTS``,
``hw.decompressor.FLOAT_REGS``). Every component validates them here, so the
error messages name the same fields everywhere.
"""

from __future__ import annotations

from sim_models.params import FormatParams


def check_latency(p: FormatParams, latency) -> int:
    """Validate the FWHT ``latency`` (registers in the butterfly network) for ``p``.

    Returns:
        ``latency`` as an int in [0, log2 N].

    Raises:
        TypeError: not an int (bool refused).
        ValueError: outside [0, log2 N].
    """
    if isinstance(latency, bool) or not isinstance(latency, int):
        raise TypeError(f"latency must be an int, got {type(latency).__name__}")
    if not 0 <= latency <= p.log2n:
        raise ValueError(f"latency (FWHT pipeline registers) must be in [0, log2(N)={p.log2n}] "
                         f"for n={p.n}, got {latency}")
    return latency


def check_cuts(field: str, regs, cuts: tuple[str, ...]) -> tuple[str, ...]:
    """Validate a register placement ``regs`` (names from ``cuts``) for the argument ``field``.

    Returns:
        The chosen cuts as a tuple in data-flow order (the order of ``cuts``).

    Raises:
        TypeError: ``regs`` is not a tuple/list/set, or an entry is not a str.
        ValueError: an unknown or repeated name; the message names ``field``.
    """
    if isinstance(regs, str) or not isinstance(regs, (tuple, list, set, frozenset)):
        raise TypeError(f"{field} must be a tuple of cut names from {cuts}, "
                        f"got {type(regs).__name__}")
    regs = list(regs)
    for r in regs:
        if not isinstance(r, str):
            raise TypeError(f"{field} entries must be str, got {type(r).__name__}")
        if r not in cuts:
            raise ValueError(f"{field}: unknown cut {r!r} (cuts: {', '.join(cuts)})")
    if len(set(regs)) != len(regs):
        raise ValueError(f"{field}: repeated cut in {tuple(regs)!r}")
    return tuple(c for c in cuts if c in regs)
