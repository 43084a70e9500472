"""A toy top level on the shared flow control (``hw.pipeline.FlowControl``), for the
flow-control unit tests (tests/test_hw_units.py) and the stream proofs of
``verif.formal`` (small and fast: no data path beyond a counter per stage)."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.pipeline import (FOLDS, SKID_SLICE_BITS, FlowControl, FlowTop, check_flow,
                         check_slice_bits, collect, flow_cycles, fold_cycles, stage)


class FlowPipe(FlowTop, wiring.Component):
    """A toy top level on the shared flow control: ``stages`` register stages that each add
    1 to a ``width``-bit payload, then :meth:`FlowControl.output` (the same plumbing as
    KVEncoder / KVDecoder, without their data path). With ``beats`` = 2 the payload
    goes as two beats of ``width / 2`` bits (low half first), each counted up on its own,
    joined again at the output (:func:`hw.pipeline.collect`), like a top level of
    ``lanes`` = N/2. ``slice_bits``: bits per skid FIFO slice (credit flow;
    :func:`hw.pipeline.skid_fifo`)."""

    def __init__(self, flow: str, stages: int, credit_extra: int = 0, width: int = 12,
                 beats: int = 1, slice_bits: int = SKID_SLICE_BITS):
        self.flow, self.credit_extra = check_flow(flow, credit_extra)
        self.slice_bits = check_slice_bits(slice_bits)
        if beats not in FOLDS or width % beats:
            raise ValueError(f"beats must be one of {FOLDS} and divide width={width}, "
                             f"got {beats!r}")
        self.stages, self.width, self.beats = stages, width, beats
        super().__init__({"i": In(stream.Signature(width)), "o": Out(stream.Signature(width))})

    @property
    def latency_cycles(self) -> int:
        return (self.stages + 1 + sum(flow_cycles(self.flow).values())
                + sum(fold_cycles(self.beats, "beat_data").values()))

    def elaborate(self, platform):
        m = Module()
        fc = FlowControl(m, self.flow, self.i, self.o, self.latency_cycles, self.credit_extra,
                         beats=self.beats, slice_bits=self.slice_bits)
        w = self.width // self.beats
        x, v = fc.payload, fc.i_valid
        if self.beats > 1:
            x = Mux(fc.beat, x[w:], x[:w])
        for s in range(self.stages):
            r = stage(m, fc.en, f"s{s}", x=(x + 1)[:w], valid=v)
            x, v = r["x"], r["valid"]
        if self.beats > 1:
            first, v = collect(m, fc.en, "first", x, v)
            x = Cat(first, x)
        fc.output(x, v)
        return m
