"""``KVRoundTrip``: the write path feeding the read path, for round-trip verification.

``KVEncoder.o`` (codes | scales [| zeros] | flags) drives ``KVDecoder.i`` (the same
fields without the flags, connected by name, ``hw.wire``) when ``sel`` = 0; with ``sel`` =
1 the decoder takes its input from the ``d`` stream instead (code and scale planes fed
directly) and the encoder is held (``i.ready`` = 0, its output not taken). ``sel`` may
change only while both modules are idle. ``status`` is the encoder's sticky status
(``status_clear`` tied low). Latency: the sum of both modules'. In credit flow each module
has its skid FIFO and credit counter, and the decoder's registered ``i.ready`` is the
encoder's ``o.ready``.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from sim_models.params import FormatParams

from .decoder import KVDecoder
from .encoder import KVEncoder
from .options import RoundTripOptions


class KVRoundTrip(wiring.Component):
    """Encoder -> decoder with a direct decoder input (see module docstring).

    Args:
        params: format parameters; both paths must implement them.
        opts: :class:`hw.options.RoundTripOptions` (the encoder's and the decoder's
            options; default: their defaults).

    Raises:
        TypeError / ValueError: from either module's validation (names the field).
    """

    def __init__(self, params: FormatParams, opts: RoundTripOptions | None = None):
        opts = RoundTripOptions() if opts is None else opts
        if not isinstance(opts, RoundTripOptions):
            raise TypeError(f"opts must be a RoundTripOptions, got {type(opts).__name__}")
        self.opts = opts
        self.enc = KVEncoder(params, opts.enc)
        self.dec = KVDecoder(params, opts.dec)
        self.lanes, self.beats = self.enc.lanes, self.enc.beats
        self.flow, self.credit_extra = opts.enc.flow, opts.enc.credit_extra
        self.latency = opts.enc.fwht_regs
        self.params = params
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
