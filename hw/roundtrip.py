"""``KVRoundTrip``: the write path feeding the read path, for round-trip verification.

``KVEpilogue.o`` (codes | scales [| zeros] | flags) drives ``KVDecompressor.i``
(the same fields without the flags) when ``sel`` = 0; with ``sel`` = 1 the
decompressor takes its input from the ``d`` stream instead (code and scale planes
fed directly) and the epilogue is held (``i.ready`` = 0, its output not taken).
``sel`` may change only while both modules are idle. ``status`` is the epilogue's
sticky status (``status_clear`` tied low). Latency: the sum of both modules'.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from sim_models.params import FormatParams

from .decompressor import DEFAULT_FLOAT_REGS, KVDecompressor
from .epilogue import DEFAULT_FE_REGS, DEFAULT_QUANT_REGS, KVEpilogue


class KVRoundTrip(wiring.Component):
    """Encoder -> decoder with a direct decoder input (see module docstring).

    Args:
        params: format parameters; both paths must implement them.
        latency: FWHT pipeline registers of both modules, in [0, log2 N].
        quant_regs, fe_regs: the epilogue's register cuts (:class:`KVEpilogue`).
        float_regs: the decompressor's float registers (:class:`KVDecompressor`).

    Raises:
        TypeError / ValueError: from either module's validation (names the argument).
    """

    def __init__(self, params: FormatParams, latency: int = 2, quant_regs=DEFAULT_QUANT_REGS,
                 fe_regs=DEFAULT_FE_REGS, float_regs=DEFAULT_FLOAT_REGS):
        self.enc = KVEpilogue(params, latency, quant_regs, fe_regs)
        self.dec = KVDecompressor(params, latency, float_regs)
        self.params = params
        self.latency = latency
        enc_m, dec_m = self.enc.signature.members, self.dec.signature.members
        super().__init__({
            "sel": In(1),
            "i": In(enc_m["i"].signature.flip()),
            "d": In(dec_m["i"].signature.flip()),
            "o": Out(dec_m["o"].signature),
            "status": Out(3),
        })

    @property
    def latency_breakdown(self) -> dict:
        """Cycles of each module (sums to :attr:`latency_cycles`)."""
        return {"encoder": self.enc.latency_cycles, "decoder": self.dec.latency_cycles}

    @property
    def latency_cycles(self) -> int:
        """Cycles from the ``i`` handshake to ``o.valid`` without stalls."""
        return sum(self.latency_breakdown.values())

    def elaborate(self, platform):
        m = Module()
        m.submodules.enc = enc = self.enc
        m.submodules.dec = dec = self.dec
        sel = self.sel
        dw = len(Value.cast(dec.i.payload))
        m.d.comb += [
            enc.i.valid.eq(self.i.valid & ~sel),
            enc.i.payload.eq(self.i.payload),
            self.i.ready.eq(enc.i.ready & ~sel),
            dec.i.valid.eq(Mux(sel, self.d.valid, enc.o.valid)),
            Value.cast(dec.i.payload).eq(Mux(sel, Value.cast(self.d.payload),
                                             Value.cast(enc.o.payload)[:dw])),
            enc.o.ready.eq(dec.i.ready & ~sel),
            self.d.ready.eq(dec.i.ready & sel),
            self.status.eq(enc.status),
            enc.status_clear.eq(0),
        ]
        wiring.connect(m, wiring.flipped(self.o), dec.o)
        return m
