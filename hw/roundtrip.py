"""``KVRoundTrip``: the write path feeding the read path, for round-trip verification.

``KVEpilogue.o`` (codes | scales [| zeros] | flags) drives ``KVDecompressor.i``
(the same fields without the flags, connected by name, ``hw.wire``) when ``sel`` =
0; with ``sel`` = 1 the decompressor takes its input from the ``d`` stream instead
(code and scale planes fed directly) and the epilogue is held (``i.ready`` = 0,
its output not taken). ``sel`` may change only while both modules are idle.
``status`` is the epilogue's sticky status (``status_clear`` tied low). Latency:
the sum of both modules'. ``flow`` (and ``credit_extra``) applies to both modules: in
credit flow each has its skid FIFO and credit counter, and the decompressor's
registered ``i.ready`` is the epilogue's ``o.ready``.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from sim_models.params import FormatParams

from .decompressor import DQ_CUTS, FLOAT_CUTS, KVDecompressor
from .epilogue import KVEpilogue
from .frontend import FE_CUTS
from .quantizer import QUANT_CUTS


class KVRoundTrip(wiring.Component):
    """Encoder -> decoder with a direct decoder input (see module docstring).

    Args:
        params: format parameters; both paths must implement them.
        latency: FWHT pipeline registers of both modules, in [0, log2 N].
        quant_regs, fe_regs, tree_every, lane_ram: the epilogue's register cuts and lane RAM
            (:class:`KVEpilogue`).
        float_regs, split_align, dq_regs, fold_align, reset_copies: the decompressor's float
            registers, alignment split, dequant registers, fold alignment and reset copies
            (:class:`KVDecompressor`).
        flow, credit_extra: the flow control of both modules (``hw.pipeline.FLOWS``).
        lanes: lanes per cycle W of both modules (None: N; N/2: two beats per vector).

    Raises:
        TypeError / ValueError: from either module's validation (names the argument).
    """

    def __init__(self, params: FormatParams, latency: int = 2, quant_regs=QUANT_CUTS.default,
                 fe_regs=FE_CUTS.default, float_regs=FLOAT_CUTS.default, tree_every: int = 0,
                 split_align: bool = False, lane_ram: int = 0, flow: str = "stall",
                 credit_extra: int = 0, lanes: int | None = None, dq_regs=DQ_CUTS.default,
                 fold_align: bool = False, reset_copies: bool = False):
        self.enc = KVEpilogue(params, latency, quant_regs, fe_regs, tree_every,
                              lane_ram=lane_ram, flow=flow, credit_extra=credit_extra, lanes=lanes)
        self.dec = KVDecompressor(params, latency, float_regs, split_align, flow=flow,
                                  credit_extra=credit_extra, lanes=lanes, dq_regs=dq_regs,
                                  fold_align=fold_align, reset_copies=reset_copies)
        self.lanes, self.beats = self.enc.lanes, self.enc.beats
        self.flow, self.credit_extra = flow, credit_extra
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
    def credits(self) -> int | None:
        """Credit flow: the most vectors in flight, both modules' credits together
        (each module counts its own); stall flow: None."""
        return self.enc.credits + self.dec.credits if self.flow == "credit" else None

    @property
    def latency_cycles(self) -> int:
        """Cycles from the ``i`` handshake to ``o.valid`` without stalls."""
        return sum(self.latency_breakdown.values())

    def elaborate(self, platform):
        m = Module()
        m.submodules.enc = enc = self.enc
        m.submodules.dec = dec = self.dec
        sel = self.sel
        # the encoder's output fields that the decoder reads (all but the flags), by name
        enc_planes = Signal(dec.i.payload.shape(), name="enc_planes")
        m.d.comb += [enc_planes[name].eq(enc.o.payload[name]) for name, _ in enc_planes.shape()]
        m.d.comb += [
            enc.i.valid.eq(self.i.valid & ~sel),
            enc.i.payload.eq(self.i.payload),
            self.i.ready.eq(enc.i.ready & ~sel),
            dec.i.valid.eq(Mux(sel, self.d.valid, enc.o.valid)),
            Value.cast(dec.i.payload).eq(Mux(sel, Value.cast(self.d.payload),
                                             Value.cast(enc_planes))),
            enc.o.ready.eq(dec.i.ready & ~sel),
            self.d.ready.eq(dec.i.ready & sel),
            self.status.eq(enc.status),
            enc.status_clear.eq(0),
        ]
        wiring.connect(m, wiring.flipped(self.o), dec.o)
        return m
