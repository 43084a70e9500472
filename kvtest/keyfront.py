"""Key-front-end streams: the table replayed from its cfg words, and the ``key`` coverage bins.

The hardware table (``hw.keyfront.KeyFrontEnd``) starts all zero (mu_s = +0, e = 0) and
takes one lane per ``cfg`` word; a vector sees every word written in an earlier cycle
than its own input handshake (FORMAT.md 7). :func:`replay` applies that rule to recorded
handshake cycles and computes each vector's encoder input with the golden
:func:`sim_models.testvectors.key_front_inputs` (a slot >= T passes like ``bypass``).
:func:`key_bins` / :func:`key_hits`: the functional coverage group ``key`` (slots,
bypass, out-of-range slots, reloads seen mid-stream, and per lane NaN/inf pass-through,
saturation, subnormal and rounded results of the scaling and of the subtraction, exact
cancellation to +0, the -0 result). Shared by the amaranth.sim tests and the cocotb bench.
"""

from __future__ import annotations

import numpy as np

from sim_models import wire
from sim_models.params import FormatParams
from sim_models.testvectors import key_front_inputs


class KeySlotTable:
    """The RTL key front end's table slots: mu_s (uint16 [T, N]) and e (int64 [T, N]) as the hardware
    holds them (not :class:`sim_models.KeyTables`, the per-model calibrated tables they are loaded from)."""

    def __init__(self, p: FormatParams, slots: int):
        self.p, self.slots = p, slots
        self.mu_s = np.zeros((slots, p.n), np.uint16)
        self.e = np.zeros((slots, p.n), np.int64)
        self._lay = wire.key_config(p, slots)

    def load(self, word: int) -> None:
        """Apply one cfg word (a slot >= T writes nothing)."""
        f = self._lay.unpack(word)
        if f["slot"] >= self.slots or f["lane"] >= self.p.n:
            return
        e = f["e"] - (1 << wire.KEY_E_BITS) if f["e"] >> (wire.KEY_E_BITS - 1) else f["e"]
        self.mu_s[f["slot"], f["lane"]] = f["mu_s"]
        self.e[f["slot"], f["lane"]] = e

    def inputs(self, x: np.ndarray, slot, bypass) -> np.ndarray:
        """Encoder inputs of vectors x [V, N] with side band slot / bypass ([V])."""
        slot = np.asarray(slot, np.int64)
        byp = np.asarray(bypass, bool) | (slot >= self.slots)
        return key_front_inputs(x, self.mu_s, self.e, np.where(byp, 0, slot), byp, self.p)


def seen_tables(p: FormatParams, slots: int, in_cycles, cfg_words, cfg_cycles,
                tables: "KeySlotTable | None" = None):
    """Per vector the table it saw: (KeySlotTable after the last word, mu_s uint16 [V, T, N],
    e int64 [V, T, N] as views per segment, reload bool [V, T]).

    ``tables``: the state before the first word (default all zero; updated in place).
    ``reload[i, s]``: a word of slot s was accepted after the first vector's handshake and
    before vector i's (a table reload mid-stream that vector i sees)."""
    tab = tables if tables is not None else KeySlotTable(p, slots)
    v = len(in_cycles)
    mu = np.empty((v, slots, p.n), np.uint16)
    e = np.empty((v, slots, p.n), np.int64)
    reload = np.zeros((v, slots), bool)
    mid = np.zeros(slots, bool)
    lay = wire.key_config(p, slots)
    j = 0
    for i, c in enumerate(in_cycles):
        while j < len(cfg_cycles) and cfg_cycles[j] < c:
            tab.load(cfg_words[j])
            if v and cfg_cycles[j] > in_cycles[0]:
                sl = lay.unpack(cfg_words[j])["slot"]
                if sl < slots:
                    mid[sl] = True
            j += 1
        mu[i], e[i], reload[i] = tab.mu_s, tab.e, mid
    for w in cfg_words[j:]:
        tab.load(w)
    return tab, mu, e, reload


def replay(p: FormatParams, slots: int, x: np.ndarray, slot, bypass, in_cycles,
           cfg_words, cfg_cycles, tables: "KeySlotTable | None" = None) -> np.ndarray:
    """Encoder inputs uint16 [V, N] of vectors accepted at ``in_cycles`` while ``cfg_words``
    were written at ``cfg_cycles`` (both in handshake order; ``tables``: the state before,
    default all zero, updated in place)."""
    _, mu, e, _ = seen_tables(p, slots, in_cycles, cfg_words, cfg_cycles, tables)
    return vector_inputs(p, slots, x, mu, e, slot, bypass)


def _row(tab: np.ndarray, slot: np.ndarray) -> np.ndarray:
    return tab[np.arange(tab.shape[0]), np.minimum(slot, tab.shape[1] - 1)]


def vector_inputs(p: FormatParams, slots: int, x, mu, e, slot, bypass) -> np.ndarray:
    """Encoder inputs of vectors x [V, N] with per-vector tables mu / e [V, T, N]."""
    slot = np.asarray(slot, np.int64)
    byp = np.asarray(bypass, bool) | (slot >= slots)
    v = np.arange(x.shape[0])
    return key_front_inputs(x, _row(mu, slot), _row(e, slot), v, byp, p)


# ---------------------------------------------------------------- functional coverage

#: Lane conditions of the key front end (``key.<name>`` bins), see :func:`key_hits`.
LANE_BINS = ("pass.nan", "pass.inf", "scale.sat", "scale.subnormal", "scale.rounded",
             "scale.underflow", "out.sat", "out.subnormal", "out.rounded", "out.cancel",
             "out.negzero")


def key_bins(slots: int) -> list[tuple[str, str | None]]:
    """(bin name, why unreachable or None) of the ``key`` group of a key-front-end config."""
    width = wire.key_slot_bits(slots)
    oor = None if slots < (1 << width) else (
        f"the slot field has {width} bits and T = {slots} slots: every value is a slot")
    return ([(f"key.slot{s}", None) for s in range(slots)]
            + [("key.bypass", None), ("key.slot_out_of_range", oor), ("key.reload", None)]
            + [(f"key.{b}", None) for b in LANE_BINS])


def key_hits(p: FormatParams, slots: int, x, mu, e, slot, bypass, reload=None):
    """(bin names, bool [V, B]): the ``key`` bins each vector hits (tables per vector as
    :func:`seen_tables`; ``reload``: its [V, T] result or None)."""
    from sim_models.center import bits_to_float
    from sim_models.keyscale import pow2_scales, scale_keys
    slot = np.asarray(slot, np.int64)
    byp = np.asarray(bypass, bool)
    oor = slot >= slots
    on = ~byp & ~oor
    m16, e16 = _row(mu, slot), _row(e, slot)
    xv = bits_to_float(x, p)
    fin = np.isfinite(xv)
    lane = on[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        exact = np.where(fin, xv, 0.0) * np.exp2(e16)
        y = scale_keys(x, pow2_scales(e16), p)
        yv = bits_to_float(y, p)
        d = np.where(fin, yv, 0.0) - bits_to_float(m16, p)
    out = key_front_inputs(x, m16, e16, np.arange(x.shape[0]), np.zeros_like(byp), p)
    ov = bits_to_float(out, p)
    ymag, omag = y & 0x7FFF, out & 0x7FFF
    top = 65504.0
    cond = {
        "pass.nan": np.isnan(xv), "pass.inf": np.isinf(xv),
        "scale.sat": fin & (np.abs(exact) > top),
        "scale.subnormal": fin & (ymag > 0) & (ymag < 0x400),
        "scale.rounded": fin & (np.abs(exact) <= top) & (yv != exact),
        "scale.underflow": fin & (xv != 0) & (ymag == 0),
        "out.sat": fin & (np.abs(d) > top),
        "out.subnormal": fin & (omag > 0) & (omag < 0x400),
        "out.rounded": fin & (np.abs(d) <= top) & (ov != d),
        "out.cancel": fin & (yv != 0) & (d == 0),
        "out.negzero": fin & (out == 0x8000),
    }
    names = [f"key.slot{s}" for s in range(slots)] + ["key.bypass", "key.slot_out_of_range",
                                                      "key.reload"]
    rl = (np.zeros(len(slot), bool) if reload is None
          else on & np.asarray(reload)[np.arange(len(slot)), np.minimum(slot, slots - 1)])
    cols = [on & (slot == s) for s in range(slots)] + [byp, oor & ~byp, rl]
    for b in LANE_BINS:
        names.append(f"key.{b}")
        cols.append((cond[b] & lane).any(axis=1))
    return names, np.stack(cols, axis=1)


# ---------------------------------------------------------------- bench stimulus

def bench_tables(p: FormatParams, slots: int, seed: int):
    """Tables for a bench: (mu_s uint16 [T, N], e int64 [T, N]): the pinned set's four
    (``sim_models.testvectors.key_front_set``: extreme exponents, +-0, +-max, a Gaussian
    mean), then random ``front_table``s of Gaussian means at random exponents."""
    from sim_models.keyscale import LOG2_S_RANGE, front_table
    from sim_models.testvectors import key_front_set
    _, mu, e, _, _ = key_front_set(p.n, 1, seed)
    rng = np.random.default_rng([seed, p.n, 31])
    lo, hi = LOG2_S_RANGE
    mus, es = list(mu[:slots]), list(e[:slots])
    while len(mus) < slots:
        ex = rng.integers(lo, hi + 1, size=p.n)
        m = (rng.standard_normal(p.n) * np.exp2(rng.integers(-8, 8))).astype(np.float16)
        mus.append(front_table(m, ex, p))
        es.append(ex)
    return np.array(mus, np.uint16), np.array(es, np.int64)


def table_words(p: FormatParams, slots: int, mu, e, which=None) -> list[int]:
    """cfg words loading slots ``which`` (default all) of tables mu / e [T, N]."""
    return [w for s in (range(slots) if which is None else which)
            for w in wire.key_config_words(p, slots, s, mu[s], e[s])]


def side_band(count: int, slots: int, seed: int):
    """(slot [V], bypass [V]) of a generic vector set: slots uniform over the slot field
    (values >= T included where the field has them), bypass with probability 1/8."""
    rng = np.random.default_rng([seed, slots, 37])
    return (rng.integers(0, 1 << wire.key_slot_bits(slots), size=count),
            (rng.random(count) < 0.125).astype(np.int64))
