"""Unnormalized fast Walsh-Hadamard transform, Sylvester order, pipelined.

Bit-exact with ``sim_models.fwht.fwht``: stage s (s = 0 .. log2(N)-1) pairs
lanes i and i + 2^s (bit s of i clear) and writes (a + b, a - b); each stage
widens the lanes by one bit, so the output is (in_width + log2 N) bits signed
and never overflows.

Register placement (``latency`` = L in [0, S], S = log2 N stages): the stages
are cut into L consecutive segments and a pipeline register follows each
segment, so the last register is always at the output (for L >= 1) and the
input is not registered here. Register r (r = 1 .. L) sits after the first
``ceil(r * S / L)`` stages (see :func:`register_positions`): segment lengths
differ by at most one, the longer ones first. Examples: N=128 (S=7), L=2 ->
registers after stages 4 and 7 (4 + 3 adder levels per cycle); L=1 -> one
register at the output; L=S -> one register after every stage; L=0 -> purely
combinational.

All registers advance together when ``en`` is high (global stall,
:func:`hw.pipeline.stage`). A ``valid`` bit and an arbitrary side band
(``side_i`` -> ``side_o``, a plain width or a layout) travel through the same
registers.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .pipeline import stage


def register_positions(log2n: int, latency: int) -> list[int]:
    """Cumulative stage counts after which a pipeline register is placed."""
    if not 0 <= latency <= log2n:
        raise ValueError(f"latency must be in [0, log2(N)={log2n}], got {latency}")
    return [-(-r * log2n // latency) for r in range(1, latency + 1)]


def butterfly_stage(m: Module, lanes: list, s: int, width: int) -> list:
    """Butterfly stage ``s`` of the Sylvester-order FWHT, combinational: lanes i and
    i + 2^s (i with bit s clear) -> their sum (lane i) and difference (lane i + 2^s),
    as new signed ``width``-bit Signals ``st{s}_{i}`` (width: one bit more than the
    inputs', so exact). Returns the N new lanes."""
    h = 1 << s
    nxt = [Signal(signed(width), name=f"st{s}_{i}") for i in range(len(lanes))]
    for i in range(len(lanes)):
        if not i & h:
            a, b = lanes[i], lanes[i + h]
            m.d.comb += [nxt[i].eq(a + b), nxt[i + h].eq(a - b)]
    return nxt


class FWHT(wiring.Component):
    """Pipelined butterfly FWHT.

    Args:
        n: lanes N (a power of two, >= 2).
        in_width: signed width of the input lanes.
        latency: pipeline registers L in [0, log2 N] (cycles from ``x`` to ``y``).
        side_width: width of the side band delayed alongside the data, or its
            shape (e.g. a ``data.StructLayout``: ``side_i``/``side_o`` are then Views).
    """

    def __init__(self, n: int, in_width: int, latency: int, side_width=0):
        if n < 2 or n & (n - 1):
            raise ValueError(f"n must be a power of two >= 2, got {n}")
        self.n = n
        self.log2n = n.bit_length() - 1
        self.in_width = in_width
        self.out_width = in_width + self.log2n
        self.latency = latency
        self.positions = register_positions(self.log2n, latency)
        super().__init__({
            "en": In(1),
            "i_valid": In(1),
            "x": In(data.ArrayLayout(signed(in_width), n)),
            "side_i": In(side_width),
            "o_valid": Out(1),
            "y": Out(data.ArrayLayout(signed(self.out_width), n)),
            "side_o": Out(side_width),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.n
        lanes = [self.x[i] for i in range(n)]
        valid, side = self.i_valid, self.side_i
        width = self.in_width
        for s in range(self.log2n):
            width += 1
            lanes = butterfly_stage(m, lanes, s, width)
            if s + 1 in self.positions:
                r = stage(m, self.en, f"r{s}", lane=lanes, valid=valid, side=side)
                lanes, valid, side = r["lane"], r["valid"], r["side"]
        m.d.comb += [self.y[i].eq(lanes[i]) for i in range(n)]
        m.d.comb += [self.o_valid.eq(valid), self.side_o.eq(side)]
        return m
