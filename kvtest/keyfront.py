"""Expected encoder inputs of a key-front-end stream: the table replayed from its cfg words.

The hardware table (``hw.keyfront.KeyFrontEnd``) starts all zero (mu_s = +0, e = 0) and
takes one lane per ``cfg`` word; a vector sees every word written in an earlier cycle
than its own input handshake (FORMAT.md 7). :func:`replay` applies that rule to recorded
handshake cycles and computes each vector's encoder input with the golden
:func:`sim_models.testvectors.key_front_inputs` (a slot >= T passes like ``bypass``).
Shared by the amaranth.sim tests and the cocotb bench.
"""

from __future__ import annotations

import numpy as np

from sim_models import wire
from sim_models.params import FormatParams
from sim_models.testvectors import key_front_inputs


class KeyTables:
    """mu_s (uint16 [T, N]) and e (int64 [T, N]) as the hardware holds them."""

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


def replay(p: FormatParams, slots: int, x: np.ndarray, slot, bypass, in_cycles,
           cfg_words, cfg_cycles) -> np.ndarray:
    """Encoder inputs uint16 [V, N] of vectors accepted at ``in_cycles`` while ``cfg_words``
    were written at ``cfg_cycles`` (both in handshake order)."""
    tab = KeyTables(p, slots)
    slot, bypass = np.asarray(slot), np.asarray(bypass)
    out = np.empty_like(x)
    j, start = 0, 0
    cuts = []                               # vector index where the table changes
    for i, c in enumerate(in_cycles):
        if j < len(cfg_cycles) and cfg_cycles[j] < c:
            cuts.append(i)
            while j < len(cfg_cycles) and cfg_cycles[j] < c:
                j += 1
    cuts.append(len(in_cycles))
    j = 0
    for end in cuts:
        if end > start:
            out[start:end] = tab.inputs(x[start:end], slot[start:end], bypass[start:end])
        c = in_cycles[end] if end < len(in_cycles) else None
        while c is not None and j < len(cfg_cycles) and cfg_cycles[j] < c:
            tab.load(cfg_words[j])
            j += 1
        start = end
    return out
