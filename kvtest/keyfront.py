"""Key-front-end streams: the table replayed from its cfg words, the golden words, and the ``key`` bins.

The hardware table (``hw.keyfold``, the key front end folded into the encoder's front end)
starts all zero (mu_s = +0, e = 0) and takes one lane per ``cfg`` word; a vector sees every
word written in an earlier cycle than its own input handshake (FORMAT.md 7).
:func:`seen_tables` applies that rule to recorded handshake cycles; :func:`key_trace` gives
each vector's golden write-path trace: the folded rule
(:func:`sim_models.codec.encode_trace_folded`) with the table of its slot, the value path
(:func:`sim_models.codec.encode_trace`) where ``bypass`` or a slot >= T.
:func:`key_bins` / :func:`key_hits`: the functional coverage group ``key`` (slots, bypass,
out-of-range slots, reloads seen mid-stream, and per lane of key vectors NaN/inf
pass-through, saturation and values below the fp16 normals of the scaling, rounding and
flushing in the alignment of the key and of mu_s, the vector's exponent set by mu_s, exact
cancellation, the clamp). Shared by the amaranth.sim tests and the cocotb bench.
"""

from __future__ import annotations

import numpy as np

from sim_models import wire
from sim_models.codec import Trace, encode_trace, encode_trace_folded
from sim_models.params import FormatParams


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

    def trace(self, x: np.ndarray, slot, bypass) -> Trace:
        """Golden trace (:func:`key_trace`) of vectors x [V, N] with side band slot / bypass
        ([V]) under the table as it is now."""
        shp = (len(x), self.slots, self.p.n)
        return vector_trace(self.p, self.slots, x, np.broadcast_to(self.mu_s, shp),
                            np.broadcast_to(self.e, shp), slot, bypass)


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


def key_trace(p: FormatParams, x: np.ndarray, mu_s, log2_s, bypass) -> Trace:
    """Golden write-path trace of a key-front-end stream: per vector (x uint16 [V, N], its
    table row mu_s / log2_s [V, N]) the folded rule, the value path where ``bypass`` [V]."""
    x = np.asarray(x, np.uint16)
    byp = np.asarray(bypass, bool)
    if byp.all():
        return encode_trace(x, p)
    k = encode_trace_folded(x, np.where(byp[:, None], 0, mu_s).astype(np.uint16),
                            np.where(byp[:, None], 0, log2_s), p)
    if not byp.any():
        return k
    v = encode_trace(x, p)

    def pick(a, b):
        if a is None:
            return None
        return np.where(byp.reshape(-1, *([1] * (a.ndim - 1))), b, a).astype(a.dtype)
    return Trace(**{f: pick(getattr(k, f), getattr(v, f))
                    for f in ("x", "u", "y", "scales", "codes", "flags", "zeros")})


def replay(p: FormatParams, slots: int, x: np.ndarray, slot, bypass, in_cycles,
           cfg_words, cfg_cycles, tables: "KeySlotTable | None" = None) -> Trace:
    """Golden trace of vectors accepted at ``in_cycles`` while ``cfg_words`` were written at
    ``cfg_cycles`` (both in handshake order; ``tables``: the state before, default all zero,
    updated in place)."""
    _, mu, e, _ = seen_tables(p, slots, in_cycles, cfg_words, cfg_cycles, tables)
    return vector_trace(p, slots, x, mu, e, slot, bypass)


def _row(tab: np.ndarray, slot: np.ndarray) -> np.ndarray:
    return tab[np.arange(tab.shape[0]), np.minimum(slot, tab.shape[1] - 1)]


def vector_trace(p: FormatParams, slots: int, x, mu, e, slot, bypass) -> Trace:
    """Golden trace (:func:`key_trace`) of vectors x [V, N] with per-vector tables mu / e
    [V, T, N]; a slot >= T passes like ``bypass``."""
    slot = np.asarray(slot, np.int64)
    byp = np.asarray(bypass, bool) | (slot >= slots)
    return key_trace(p, x, _row(mu, slot), _row(e, slot), byp)


# ---------------------------------------------------------------- functional coverage

#: Lane conditions of the folded key front end on key vectors (``key.<name>`` bins), see
#: :func:`key_hits`.
LANE_BINS = ("pass.nan", "pass.inf", "scale.sat", "scale.low", "align.key_rounded",
             "align.key_flushed", "align.mu_rounded", "emax.mu", "out.cancel", "out.clamp")


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
    :func:`seen_tables`; ``reload``: its [V, T] result or None). Lane conditions of the
    folded rule (:func:`sim_models.bfp.to_block_fp_keys`), on key vectors only:
    ``scale.sat`` E + e > 30 (saturated to 65504), ``scale.low`` a nonzero finite lane with
    E + e < 1 (below the fp16 normals, kept exact), ``align.key_rounded`` /
    ``align.mu_rounded`` the alignment to the vector's exponent drops nonzero bits of the
    key / of mu_s, ``align.key_flushed`` a nonzero key lane aligns to 0, ``emax.mu`` the
    vector's exponent is set by a mu_s lane above every scaled key lane, ``out.cancel``
    X = MU != 0, ``out.clamp`` |X - MU| = 2^(M-1) (clamped)."""
    from sim_models.bfp import align, decode_bits
    slot = np.asarray(slot, np.int64)
    byp = np.asarray(bypass, bool)
    x = np.asarray(x, np.uint16)
    oor = slot >= slots
    on = ~byp & ~oor
    m16, e16 = _row(mu, slot), _row(e, slot)
    special = ((x >> 10) & 0x1F) == 0x1F
    nan = special & ((x & 0x3FF) != 0)
    e16 = np.where(special, 0, e16)
    sign, ex, sig, _ = decode_bits(x, p)
    ex = ex + e16
    sat = ~special & (ex > 30)
    sig = np.where(sat, 2047, sig)
    exs = np.where(sat, 30, ex)
    sm, em, sig_m, _ = decode_bits(np.where(special, 0, m16).astype(np.uint16), p)
    emax = np.maximum(exs, em).max(axis=1, keepdims=True) + 1
    off = p.mant_bits - 12
    shx, shm = emax - exs - off, emax - em - off
    xs, ms = align(sig, shx), align(sig_m, shm)
    big_x = np.where(sign == 1, -xs, xs)
    big_m = np.where(sm == 1, -ms, ms)
    lo = np.ldexp(1.0, -np.minimum(np.maximum(shx, 0), 60))
    lom = np.ldexp(1.0, -np.minimum(np.maximum(shm, 0), 60))
    cond = {
        "pass.nan": nan, "pass.inf": special & ~nan,
        "scale.sat": sat,
        "scale.low": ~special & (sig != 0) & (ex < 1),
        "align.key_rounded": ~special & (shx > 0) & (xs != sig * lo),
        "align.key_flushed": ~special & (sig != 0) & (xs == 0),
        "align.mu_rounded": (shm > 0) & (ms != sig_m * lom),
        "emax.mu": np.broadcast_to(em.max(axis=1, keepdims=True) > exs.max(axis=1, keepdims=True),
                                   x.shape),
        "out.cancel": (big_x == big_m) & (big_x != 0),
        "out.clamp": np.abs(big_x - big_m) == (1 << (p.mant_bits - 1)),
    }
    names = [f"key.slot{s}" for s in range(slots)] + ["key.bypass", "key.slot_out_of_range",
                                                      "key.reload"]
    rl = (np.zeros(len(slot), bool) if reload is None
          else on & np.asarray(reload)[np.arange(len(slot)), np.minimum(slot, slots - 1)])
    cols = [on & (slot == s) for s in range(slots)] + [byp, oor & ~byp, rl]
    lane = on[:, None]
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
