"""Block scale selection for every mode, scale rule, rounding and encoding (docs/FORMAT.md 3.5, 3.7).

:func:`choose_scale_bytes` gives the scale byte of each block of G FWHT outputs and the
FLAG_SAT condition, by exact integer compares against the encoding's values and midpoints
(:mod:`sim_models.minifloat`). :func:`max_units` (the scale units K the block maximum maps
to) and :func:`scale_mult` are the constant tables the RTL (``hw.quantizer``) shares.
"""

from __future__ import annotations

import numpy as np

from .exact import I64_LIMIT, first_true, ge_scaled
from .lloyd_max import LEVEL_FRAC_BITS, levels
from .minifloat import scale_encoding
from .params import FormatParams

#: Default multipliers (units 1/256) for the rms rule: the step minimising the
#: MSE of a uniform quantizer with that many levels on N(0, 1) (numerical
#: optimum, e.g. 0.586 sigma for 8 levels, 0.651 sigma for 7: Max 1960 Table II),
#: and sigma itself (256) for lloydmax.
_RMS_MULT = {
    "midtread": {2: 313, 3: 167, 4: 90},
    "midrise": {2: 255, 3: 150, 4: 86},
    "lloydmax": {2: 256, 3: 256, 4: 256},
}
#: absmean: E|X| = sigma * sqrt(2/pi) for a Gaussian, so mult = rms mult * sqrt(pi/2).
_ABSMEAN_MULT = {
    "midtread": {2: 392, 3: 209, 4: 113},
    "midrise": {2: 320, 3: 188, 4: 108},
    "lloydmax": {2: 321, 3: 321, 4: 321},
}


def default_scale_mult(p: FormatParams) -> int:
    """The multiplier used when ``p.scale_mult`` is None (units of 1/256).

    256 for the max rule (the block maximum maps exactly to K scale units, so
    no code clips); for rms/absmean the Gaussian MSE-optimal value (tables above).
    """
    if p.scale_rule == "max":
        return 256
    table = _RMS_MULT if p.scale_rule == "rms" else _ABSMEAN_MULT
    return table[p.mode][p.bits]


def scale_mult(p: FormatParams) -> int:
    """``p.scale_mult`` or its default."""
    return default_scale_mult(p) if p.scale_mult is None else p.scale_mult


def max_units(p: FormatParams) -> tuple[int, int]:
    """(Kn, Kd): the block maximum (asym: the block range hi - lo) maps to K = Kn / Kd scale
    units: midtread h-1, midrise h, asym 2h-1, lloydmax L_top / 256; h = 2^(b-1).

    Args:
        p: format parameters (only ``mode`` and ``bits`` are read).
    """
    h = 1 << (p.bits - 1)
    if p.mode == "midtread":
        return h - 1, 1
    if p.mode == "midrise":
        return h, 1
    if p.mode == "asym":
        return 2 * h - 1, 1
    return int(levels(p.bits)[-1]), 1 << LEVEL_FRAC_BITS


def _blocks(y: np.ndarray, p: FormatParams) -> np.ndarray:
    return y.reshape(y.shape[0], p.n_blocks, p.block)


def block_range(y: np.ndarray, p: FormatParams):
    """(lo, hi) int64 [V, N/G]: min(min y, 0) and max(max y, 0) per block (mode asym)."""
    yb = _blocks(y, p)
    return np.minimum(yb.min(axis=2, initial=0), 0), np.maximum(yb.max(axis=2, initial=0), 0)


def rule_operands(y: np.ndarray, p: FormatParams):
    """(power, C, X) of the compare ``C * scale^p >= X * 2^(p*u)`` per block
    (docs/FORMAT.md 3.7): the ideal scale t of a block solves ``C * t^p = X * 2^(p*u)``."""
    mult = scale_mult(p)
    yb = _blocks(y, p)
    if p.scale_rule == "max":
        kn, kd = max_units(p)
        if p.mode == "asym":
            lo, hi = block_range(y, p)
            a = hi - lo
        else:
            a = np.abs(yb).max(axis=2, initial=0)
        return 1, 256 * kn, mult * kd * a
    if p.scale_rule == "absmean":
        return 1, 256 * p.block, mult * np.abs(yb).sum(axis=2)
    # rms: sum of squares; int64 when the static bound allows, else Python ints
    ymax = 1 << (p.fwht_width - 1)
    if mult * mult * p.block * ymax * ymax < I64_LIMIT:
        s2 = (yb * yb).sum(axis=2)
        return 2, 65536 * p.block, mult * mult * s2
    obj = yb.astype(object)
    return 2, 65536 * p.block, (obj * obj).sum(axis=2) * (mult * mult)


def choose_scale_bytes(y: np.ndarray, u: np.ndarray, p: FormatParams):
    """Scale byte per block (docs/FORMAT.md 3.5, 3.7).

    Args:
        y: int64 [V, N], FWHT output in units of 2^u.
        u: int64 [V], unit exponent per vector.
        p: format parameters (any mode, rule, rounding, encoding).

    Returns:
        (scales, sat): uint8 [V, N/G] scale bytes of ``p.scale``; bool [V], some
        block's ideal scale exceeded the largest value.
    """
    enc = scale_encoding(p.scale)
    power, c, x = rule_operands(y, p)
    ub = np.broadcast_to(u[:, None], x.shape) * power
    k = enc.bytes.size
    shape = x.shape

    def value_ge_target(i):          # scale(bytes[i]) >= t
        return ge_scaled(c * enc.sig[i] ** power, power * enc.exp[i], x, ub)

    above = first_true(value_ge_target, k, shape)      # k: none is large enough
    sat = above >= k
    if p.scale_round == "up":
        idx = np.minimum(above, k - 1)
    else:
        def mid_gt_target(i):        # midpoint(i, i+1) > t, i.e. not (t >= midpoint)
            return ~ge_scaled(x, ub, c * enc.mid_sig[i] ** power, power * enc.mid_exp[i])
        idx = first_true(mid_gt_target, k - 1, shape)  # k-1: above every midpoint
    return enc.bytes[idx], sat.any(axis=1)


def scale_decisions(y: np.ndarray, u: np.ndarray, scales: np.ndarray, p: FormatParams):
    """Which blocks sit on a decision point of the scale rule, and which saturate.

    Args:
        y, u: FWHT output and unit exponent (as :func:`choose_scale_bytes`).
        scales: uint8 [V, N/G], the bytes :func:`choose_scale_bytes` chose.
        p: format parameters.

    Returns:
        (tie, sat), bool [V, N/G]. ``tie``: the ideal scale t is exactly the decision
        point that chose the byte: rounding ``nearest``, t equals the midpoint below
        the chosen value (the tie went up); ``up``, t equals the chosen value (a
        rounding up that did not round). ``sat``: t exceeds the largest value
        (FLAG_SAT, per block).
    """
    enc = scale_encoding(p.scale)
    power, c, x = rule_operands(y, p)
    ub = np.broadcast_to(u[:, None], x.shape) * power
    idx = enc.index_of(scales)
    if p.scale_round == "up":
        sig, ex, valid = enc.sig[idx], enc.exp[idx], np.ones(idx.shape, dtype=bool)
    else:
        j = np.maximum(idx - 1, 0)
        sig, ex, valid = enc.mid_sig[j], enc.mid_exp[j], idx > 0
    point = c * sig ** power
    tie = valid & ge_scaled(point, power * ex, x, ub) & ge_scaled(x, ub, point, power * ex)
    sat = ~ge_scaled(c * int(enc.sig[-1]) ** power, power * int(enc.exp[-1]), x, ub)
    return tie, sat
