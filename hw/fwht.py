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

from amaranth.hdl import Module, Signal, Value, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .pipeline import beat_groups, beat_index, beat_of, stage, when


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


#: Register stages of :func:`fold_stage` for the last beat of a vector.
FOLD_CYCLES = 2


class FWHT(wiring.Component):
    """Pipelined butterfly FWHT.

    Args:
        n: points N (a power of two, >= 2).
        in_width: signed width of the input lanes.
        latency: pipeline registers L in [0, log2 W] (cycles from ``x`` to ``y``, plus
            :data:`FOLD_CYCLES` with two beats).
        side_width: width of the side band delayed alongside the data, or its
            shape (e.g. a ``data.StructLayout``: ``side_i``/``side_o`` are then Views).
        lanes: W, lanes per cycle: N (default) or N/2, a vector as two beats (lanes
            [0, W), then [W, N)) through a W-point network and :func:`fold_stage`.
    """

    def __init__(self, n: int, in_width: int, latency: int, side_width=0,
                 lanes: int | None = None):
        if n < 2 or n & (n - 1):
            raise ValueError(f"n must be a power of two >= 2, got {n}")
        w = n if lanes is None else lanes
        if w not in (n, n // 2):
            raise ValueError(f"lanes must be n={n} or n/2, got {lanes}")
        self.n, self.lanes = n, w
        self.log2n = n.bit_length() - 1
        self.in_width = in_width
        self.out_width = in_width + self.log2n
        self.latency = latency
        self.positions = register_positions(w.bit_length() - 1, latency)
        super().__init__({
            "en": In(1),
            "i_valid": In(1),
            "x": In(data.ArrayLayout(signed(in_width), w)),
            "side_i": In(side_width),
            "o_valid": Out(1),
            "y": Out(data.ArrayLayout(signed(self.out_width), w)),
            "side_o": Out(side_width),
        })

    @property
    def cycles(self) -> int:
        """Register stages from ``x`` to ``y`` (the last beat's, with two beats)."""
        return self.latency + (FOLD_CYCLES if self.lanes < self.n else 0)

    def elaborate(self, platform):
        m = Module()
        w = self.lanes
        lanes = [self.x[i] for i in range(w)]
        valid, side = self.i_valid, self.side_i
        width = self.in_width
        for s in range(w.bit_length() - 1):
            width += 1
            lanes = butterfly_stage(m, lanes, s, width)
            if s + 1 in self.positions:
                r = stage(m, self.en, f"r{s}", lane=lanes, valid=valid, side=side)
                lanes, valid, side = r["lane"], r["valid"], r["side"]
        if w < self.n:          # the last stage, across the two beats
            f = fold_stage(m, self.en, "fold", lanes, valid, side)
            lanes, valid, side = f["lane"], f["valid"], f["side"]
        m.d.comb += [self.y[i].eq(lanes[i]) for i in range(w)]
        m.d.comb += [self.o_valid.eq(valid), self.side_o.eq(side)]
        return m


def fold_stage(m: Module, en, name: str, lanes: list, valid, side=None) -> dict:
    """The last butterfly stage of an N-point FWHT streamed as two beats of W = N/2 lanes
    (beat 0: lanes [0, W), beat 1: lanes [W, N), in order, beat 0 first).

    Stage log2 N - 1 pairs lane k of beat 0 (a) with lane k of beat 1 (b): beat 0 waits
    in a register; when beat 1 arrives the output register takes a + b (output beat 0,
    lanes [0, W)) and a register beside it a - b, which the output register takes on the
    next enabled cycle (output beat 1, lanes [W, N)). A beat 0 that arrives in that
    cycle only waits, so the stage keeps pace with one beat per cycle. The last beat
    leaves 2 enabled cycles after it came (the first 1). Lanes grow by one bit (exact).
    ``side`` (a Value or View) is taken with beat 1 and held for both output beats
    (its enable is a copy of the beat index of its own).
    All registers advance with ``en``; valid bits and the beat index have reset.

    Returns:
        {"lane": W Signals (``{name}_y{k}``), "valid": the output beat's valid,
        "side": the registered side band (None without one)}.
    """
    w = len(lanes)
    width = len(Value.cast(lanes[0])) + 1
    # the beat index, one copy per BEAT_GROUP_LANES lanes (each toggles itself, so
    # synthesis keeps them apart): the lanes' loads, selects and enables read only
    # their copy, never ``valid``. Beat 0 is taken whenever the index is 0 (a cycle
    # without a beat loads a value that the next beat 0 overwrites), a - b whenever it
    # is 1, and the output takes a + b while it is 1 (out of a cycle without a beat the
    # output is not valid: ``pend`` is 0 then).
    groups = beat_groups(w)
    copies = beat_index(m, en, name, valid, groups + (side is not None))
    beats = copies[:groups]
    beat = beats[0]
    pend = Signal(name=f"{name}_pend")
    out_v = Signal(name=f"{name}_valid")
    a = [Signal(signed(width - 1), name=f"{name}_a{k}", reset_less=True) for k in range(w)]
    d = [Signal(signed(width), name=f"{name}_d{k}", reset_less=True) for k in range(w)]
    y = [Signal(signed(width), name=f"{name}_y{k}", reset_less=True) for k in range(w)]
    last = valid & beat
    out = {"lane": y, "valid": out_v, "side": None}
    with when(m, en):
        for k in range(w):
            bk = beat_of(beats, k, w)
            with m.If(bk):
                m.d.sync += [y[k].eq(a[k] + lanes[k]), d[k].eq(a[k] - lanes[k])]
            with m.Else():
                m.d.sync += [a[k].eq(lanes[k]), y[k].eq(d[k])]
        m.d.sync += [out_v.eq(last | pend), pend.eq(last)]
    if side is not None:
        # loaded on the index alone (1 only in a cycle with beat 1), from a copy of its
        # own (docs/DECISIONS.md, "Register replicas")
        side_r = Signal.like(side, name=f"{name}_side", reset_less=True)
        with when(m, en & copies[groups]):
            m.d.sync += side_r.eq(side)
        out["side"] = side_r
    return out
