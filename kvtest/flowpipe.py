"""A toy top level on the shared flow control (``hw.pipeline.FlowControl``), for the
flow-control unit tests (tests/test_hw_units.py) and the stream proofs of
``verif.formal`` (small and fast: no data path beyond a counter per stage)."""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.pipeline import FlowControl, FlowTop, check_flow, flow_cycles, stage


class FlowPipe(FlowTop, wiring.Component):
    """A toy top level on the shared flow control: ``stages`` register stages that each add
    1 to a ``width``-bit payload, then :meth:`FlowControl.output` (the same plumbing as
    KVEpilogue / KVDecompressor, without their data path)."""

    def __init__(self, flow: str, stages: int, credit_extra: int = 0, width: int = 12):
        self.flow, self.credit_extra = check_flow(flow, credit_extra)
        self.stages, self.width = stages, width
        super().__init__({"i": In(stream.Signature(width)), "o": Out(stream.Signature(width))})

    @property
    def latency_cycles(self) -> int:
        return self.stages + 1 + sum(flow_cycles(self.flow).values())

    def elaborate(self, platform):
        m = Module()
        fc = FlowControl(m, self.flow, self.i, self.o, self.latency_cycles, self.credit_extra)
        x, v = self.i.payload, fc.i_valid
        for s in range(self.stages):
            r = stage(m, fc.en, f"s{s}", x=(x + 1)[:self.width], valid=v)
            x, v = r["x"], r["valid"]
        fc.output(x, v)
        return m
