"""Deliberately broken designs for the mutation tests (tests/test_formal.py):
each proof must FAIL on one of these, so no proof passes vacuously."""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal, Value
from amaranth.lib import wiring

from hw.fwht import FWHT
from hw.fwht import fold_stage as _fold_stage
from hw.ifwht import BlockFWHT
from hw.ifwht import fold_align_stage as _fold_align_stage


class SwappedFWHT(wiring.Component):
    """``hw.fwht.FWHT`` with output lanes ``a`` and ``b`` swapped (same ports)."""

    def __init__(self, n: int, in_width: int, latency: int, side_width: int = 0, a: int = 1,
                 b: int = 2):
        self.inner = FWHT(n, in_width, latency, side_width)
        self.n, self.out_width, self.swap = n, self.inner.out_width, (a, b)
        super().__init__(self.inner.signature)

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = f = self.inner
        a, b = self.swap
        m.d.comb += [f.en.eq(self.en), f.i_valid.eq(self.i_valid), f.x.eq(self.x),
                     f.side_i.eq(self.side_i), self.o_valid.eq(f.o_valid),
                     self.side_o.eq(f.side_o)]
        for i in range(self.n):
            j = b if i == a else a if i == b else i
            m.d.comb += self.y[i].eq(f.y[j])
        return m


class NoFlipBlockFWHT(wiring.Component):
    """``hw.ifwht.BlockFWHT`` (latency 0, block swap) with its sign flags dropped (0)."""

    def __init__(self, n: int, block: int, in_shape, max_align: int):
        self.inner = BlockFWHT(n, block, in_shape, 0, max_align=max_align, align="swap")
        self.n, self.align, self.d_width = n, self.inner.align, self.inner.d_width
        super().__init__(self.inner.signature)

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = f = self.inner
        m.d.comb += [f.en.eq(self.en), f.i_valid.eq(self.i_valid), f.p.eq(self.p),
                     f.d.eq(self.d), f.side_i.eq(self.side_i),
                     self.o_valid.eq(f.o_valid), self.y.eq(f.y), self.side_o.eq(f.side_o),
                     self.flip.eq(0)]
        return m


class FreeRunningFWHT(FWHT):
    """``hw.fwht.FWHT`` whose pipeline registers ignore ``en`` (advance during stalls)."""

    def elaborate(self, platform):
        en = self.en
        self.en = Const(1)
        try:
            return super().elaborate(platform)
        finally:
            self.en = en


def drop_first(m, dut, o_ready):
    """Hide the first output vector from the consumer while still acknowledging it."""
    seen = Signal()
    with m.If(dut.o.valid & o_ready):
        m.d.sync += seen.eq(1)
    return dut.o.valid & seen, Value.cast(dut.o.payload)


def flip_while_stalled(m, dut, o_ready):
    """Flip payload bit 0 in the second cycle of a stall."""
    stalled = Signal()
    m.d.sync += stalled.eq(dut.o.valid & ~o_ready)
    return dut.o.valid, Value.cast(dut.o.payload) ^ stalled


def duplicate_first(m, dut, o_ready):
    """Show the first output vector once more in the cycle after its handshake."""
    again, done = Signal(), Signal()
    last = Signal.like(Value.cast(dut.o.payload))
    first = dut.o.valid & o_ready & ~done
    m.d.sync += [again.eq(first), last.eq(Value.cast(dut.o.payload))]
    with m.If(first):
        m.d.sync += done.eq(1)
    return dut.o.valid | again, Mux(again, last, Value.cast(dut.o.payload))


class NoSignFloatPack(wiring.Component):
    """``hw.tofloat.FloatPack`` with its ``ysign`` input tied to 0: the one's complement
    correction of negative y (xor and the +1 into the kept bits) dropped."""

    def __init__(self, n: int, consts):
        from hw.tofloat import FloatPack
        self.inner = FloatPack(n, consts)
        super().__init__(self.inner.signature)

    def elaborate(self, platform):
        from hw.tofloat import PREP_PORTS
        m = Module()
        m.submodules.inner = f = self.inner
        m.d.comb += [getattr(f, k).eq(0 if k == "ysign" else getattr(self, k)) for k in PREP_PORTS]
        m.d.comb += self.bits.eq(f.bits)
        return m


def skid_read_enable_ahead(nonempty, rv, load):
    """``hw.pipeline.skid_read_enable`` that reads the block RAM whenever it holds an
    entry, also while the head waits in the read data register behind a stalled output
    (the entry there is overwritten: a vector lost)."""
    return nonempty


def beat_register_free_early(i_valid, gate, free):
    """``hw.pipeline.beat_register_free_next`` that keeps the two-beat input register free
    after a handshake too (beat 0 included): the next vector overwrites it before its
    beat 1."""
    return Const(1, 1)


def fold_stage_skewed(m, en, name, lanes, valid, side=None):
    """``hw.fwht.fold_stage`` fed with lane 0 of every beat negated (a sign error in
    front of the stage that runs across the beats)."""
    return _fold_stage(m, en, name, [-lanes[0], *lanes[1:]], valid, side)


def fold_align_no_flip(*args, **kwargs):
    """``hw.ifwht.fold_align_stage`` with its ``flip`` outputs tied to 0 (the difference
    X 2^d - Y then has the wrong sign whenever beat 0 is the unshifted operand)."""
    f = _fold_align_stage(*args, **kwargs)
    return {**f, "flip": [Const(0, 1)] * len(f["flip"])}


def shift_right_floor(m, v, amount, name, hold=None, step=1):
    """``hw.ifwht.shift_right_odd`` without the sticky bit: the plain arithmetic shift
    (floor), where the fold window's rounding to odd needs bit 0 set."""
    go = amount if hold is None else amount & ~hold.replicate(len(amount))
    out = Signal.like(Value.cast(v), name=f"{name}_floor")
    m.d.comb += out.eq(Value.cast(v) >> (go * step))
    return out


def fold_window_all_alt(*args, **kwargs):
    """``hw.ifwht.fold_align_stage`` with every lane's ``alt`` flag 1 (the lanes with X = 0,
    exact at unit 2^0, then read at 2^s)."""
    f = _fold_align_stage(*args, **kwargs)
    return {**f, "alt": [Const(1, 1)] * len(f["alt"])} if f.get("alt") else f
