"""Unit tests of the RTL blocks (amaranth.sim) against sim_models, bit for bit.

* ScaleSelect: every block maximum A in [0, 4096) at u values in the subnormal,
  normal and saturating ranges, plus every u in a wide range for every
  normalized mantissa pattern (A in [2^J, 2^(J+1)), with and without a sticky
  bit), plus random 18-bit A, for qmax = 1, 3, 7.
* Thresholds: every scale byte 1..255 at many u: each threshold is exactly the
  smallest |y| that the golden compare counts.
* FrontEnd vs sim_models.bfp.to_block_fp (fp16/bf16, several M).
* FWHT vs sim_models.fwht for every latency, with stalls.
"""

from __future__ import annotations

import os
import random
import re

import numpy as np
import pytest
from amaranth.hdl import ClockDomain, Elaboratable, Module, Signal, signed
from amaranth.back import rtlil
from amaranth.sim import Simulator

from hw.frontend import FrontEnd, tree_cuts, u_range
from hw.fwht import FWHT, register_positions
from hw.scale_select import ScaleSelect
from hw.thresholds import Thresholds
from kvtest.inputs import directed_vectors, random_patterns
from sim_models import wire
from sim_models.bfp import to_block_fp
from sim_models.exact import ge_scaled
from sim_models.fwht import fwht
from sim_models.params import FormatParams
from sim_models.minifloat import scale_encoding
from sim_models.quant import threshold_coefs
from sim_models.scale import choose_scale_bytes, max_units
from sim_models.signs import sign_mask

BANK = 64          # parallel copies of the unit under test per simulation step
U_SHAPE = signed(8)
A_WIDTH = 18       # |y| width of the default configuration (M - 1 + log2 N)
#: HW_FULL=1: exhaustive sweeps (minutes) instead of the quick selection
FULL = os.environ.get("HW_FULL", "") not in ("", "0")


def k_units(mode: str, bits: int) -> tuple[int, int]:
    """(k, k_shift) of ScaleSelect: K = k / 2^k_shift = ``sim_models.scale.max_units``."""
    kn, kd = max_units(FormatParams(mode=mode, bits=bits))
    return kn, kd.bit_length() - 1


class _Bank(Elaboratable):
    def __init__(self, units):
        self.units = units

    def elaborate(self, platform):
        m = Module()
        for i, s in enumerate(self.units):
            m.submodules[f"u{i}"] = s
        return m


def golden_scale(mode: str, bits: int, rounding: str, a, u, scale: str = "ue5m3"):
    """Golden (byte, sat) of the max rule for block maxima ``a`` at unit exponents ``u``:
    ``sim_models.scale.choose_scale_bytes`` on blocks whose lane 0 holds A."""
    a = np.asarray(a, dtype=np.int64)
    p = FormatParams(n=8, block=8, bits=bits, mode=mode, scale_round=rounding, scale=scale)
    y = np.zeros((a.size, 8), dtype=np.int64)
    y[:, 0] = a
    b, s = choose_scale_bytes(y, np.asarray(u, dtype=np.int64), p)
    return b[:, 0], s


def _check_scale_select(mode: str, bits: int, rounding: str, cases: list[tuple[int, int]],
                        scale: str = "ue5m3"):
    """cases: (A, u) pairs; compares byte and sat with the golden model."""
    a = np.array([c[0] for c in cases], dtype=np.int64)
    u = np.array([c[1] for c in cases], dtype=np.int64)
    exp_b, exp_s = golden_scale(mode, bits, rounding, a, u, scale)
    p = FormatParams(n=8, block=8, bits=bits, mode=mode, scale_round=rounding, scale=scale)
    bank = _Bank([ScaleSelect(p, A_WIDTH, U_SHAPE) for _ in range(BANK)])
    bad = []

    async def tb(ctx):
        for c0 in range(0, len(cases), BANK):
            chunk = range(c0, min(c0 + BANK, len(cases)))
            for s, i in zip(bank.units, chunk):
                ctx.set(s.a, int(a[i]))
                ctx.set(s.u, int(u[i]))
            for s, i in zip(bank.units, chunk):
                got = (ctx.get(s.byte), ctx.get(s.sat))
                if got != (int(exp_b[i]), int(exp_s[i])):
                    bad.append((int(a[i]), int(u[i]), got, (int(exp_b[i]), bool(exp_s[i]))))

    sim = Simulator(bank)
    sim.add_testbench(tb)
    sim.run()
    assert not bad, f"{len(bad)} mismatches (A, u, got, expected), first: {bad[:8]}"
    return exp_b, exp_s


def _j(mode: str, bits: int, rounding: str, scale: str = "ue5m3") -> int:
    """J = floor(log2(K c_top)) of hw.scale_select.ScaleSelect (k part of K)."""
    k, _ = k_units(mode, bits)
    top = (2 << scale_encoding(scale).mant_bits) - 1
    return ((2 * top + 1 if rounding == "nearest" else top) * k).bit_length() - 1


def _u_for_field(mode: str, bits: int, rounding: str, scale: str, a: int, e: int) -> int:
    """u that puts block maximum ``a`` at (virtual) exponent field ``e`` of ``scale``."""
    enc = scale_encoding(scale)
    _, ks = k_units(mode, bits)
    k = max(a.bit_length() - 1, 0)
    e0 = enc.bias + enc.mant_bits + (rounding == "nearest")
    return e - k - e0 + _j(mode, bits, rounding, scale) - ks


#: (mode, bits, rounding, scale) of every supported quantizer (HW_FULL) or a
#: selection: every mode/b/rounding with ue5m3, every encoding with three (mode, b)
ALL_QUANTS = [(mode, b, r, sc) for sc in ("ue5m3", "e4m3fn", "e5m2", "ue4m4")
              for mode in ("midtread", "midrise", "lloydmax") for r in ("up", "nearest")
              for b in (2, 3, 4)]
QUANTS = ALL_QUANTS if FULL else (
    [q for q in ALL_QUANTS if q[3] == "ue5m3" and (q[0] != "lloydmax" or q[1] == 3)]
    + [q for q in ALL_QUANTS if q[3] != "ue5m3" and (q[0], q[1]) in
       (("midrise", 3), ("lloydmax", 4))])
UE5M3 = [q for q in QUANTS if q[3] == "ue5m3" and (q[0] != "lloydmax" or FULL)]


@pytest.mark.parametrize("mode,bits,rounding,scale", UE5M3)
def test_scale_select_every_a_below_4096(mode, bits, rounding, scale):
    """Every A in [0, 4096), each at a u that puts its exponent field e next to a
    regime boundary (subnormal/normal at e = 0/1, saturation at e = 31/32) or
    mid-range; with HW_FULL=1 every A at every u in [-48, 40]."""
    if FULL:
        cases = [(a, uu) for uu in range(-48, 41) for a in range(4096)]
    else:
        targets = (-2, -1, 0, 1, 2, 17, 30, 31, 32, 33)
        cases = [(a, _u_for_field(mode, bits, rounding, scale, a,
                                  targets[(a * 7 + (a >> 4)) % len(targets)]))
                 for a in range(4096)]
    b, s = _check_scale_select(mode, bits, rounding, cases, scale)
    assert {1, 7, 8, 255} <= set(b.tolist())
    assert s.any() and (~s).any()


@pytest.mark.parametrize("mode,bits,rounding,scale", QUANTS)
def test_scale_select_every_u(mode, bits, rounding, scale):
    """Normalized mantissa patterns R = top J+1 bits (all of them, or 256 spread
    over the range when there are more; + sticky variants) at u from deep
    subnormal to saturation, plus random 18-bit A at random u."""
    j = _j(mode, bits, rounding, scale)
    enc = scale_encoding(scale)
    base = list(range(1 << j, 1 << (j + 1)))
    if not FULL and len(base) > 256:
        base = base[::len(base) // 256] + base[-8:]
    avals = base + [(v << 2) | 1 for v in base[-4:]] + [1, 3, (1 << A_WIDTH) - 1]
    e_top = int(enc.bytes[-1]) >> enc.mant_bits
    lo = _u_for_field(mode, bits, rounding, scale, 1 << j, -enc.mant_bits - 2)
    hi = _u_for_field(mode, bits, rounding, scale, 1 << j, e_top + 2)
    step = 1 if FULL or len(avals) <= 64 else 2
    cases = [(a, uu) for uu in range(lo, hi + 1, step) for a in avals]
    rng = np.random.default_rng(bits + 10 * len(rounding) + len(scale))
    ra = rng.integers(0, 1 << A_WIDTH, 256)
    ra[::3] >>= rng.integers(0, A_WIDTH, len(ra[::3]))
    cases += list(zip(ra.tolist(), rng.integers(-40, 20, len(ra)).tolist()))
    b, s = _check_scale_select(mode, bits, rounding, cases, scale)
    assert {1, int(enc.bytes[-1])} <= set(b.tolist())
    assert s.any() and (~s).any()


def _decision_values(mode: str, bits: int, rounding: str, scale: str):
    """(c, x) with K * D(s) = c * 2^x for every byte s that has a decision value
    (up: the scale value; nearest: the midpoint to the next byte)."""
    k, ks = k_units(mode, bits)
    enc = scale_encoding(scale)
    if rounding == "up":
        return k * enc.sig, enc.exp - ks
    return k * enc.mid_sig, enc.mid_exp - ks


@pytest.mark.parametrize("mode,bits,rounding,scale", QUANTS)
def test_scale_select_exact_ties(mode, bits, rounding, scale):
    """A 2^u exactly on K * D(s) (a scale value for "up", a midpoint of two
    scale values for "nearest"), one unit below and one above, for every byte,
    and around the FLAG_SAT edge A 2^u = K scale(largest byte)."""
    c, x = _decision_values(mode, bits, rounding, scale)
    cases = []
    for ci, xi in zip(c.tolist(), x.tolist()):
        for sh in (0, 1, A_WIDTH - 1 - ci.bit_length()):
            for d in (-1, 0, 1):
                a = (ci << sh) + d
                if 0 <= a < (1 << A_WIDTH):
                    cases.append((a, xi - sh))
    k, ks = k_units(mode, bits)
    enc = scale_encoding(scale)
    top, etop = k * int(enc.sig[-1]), int(enc.exp[-1]) - ks     # K scale(largest)
    for sh in range(0, A_WIDTH - top.bit_length()):
        for d in (-1, 0, 1):
            cases.append(((top << sh) + d, etop - sh))
    b, s = _check_scale_select(mode, bits, rounding, cases, scale)
    assert s.any() and (~s).any()
    assert len(set(b.tolist())) > len(enc.bytes) - 8


THR_CASES = [(m, b, "ue5m3") for m in ("midtread", "midrise", "lloydmax") for b in (2, 3, 4)] + \
    [(m, b, sc) for sc in ("e4m3fn", "e5m2", "ue4m4") for m, b in
     (("midtread", 3), ("midrise", 4), ("lloydmax", 3), ("lloydmax", 2))]


@pytest.mark.parametrize("mode,bits,scale", THR_CASES)
def test_thresholds_every_byte(mode, bits, scale):
    """Each threshold T_j is exactly the smallest |y| that the golden compare
    |y| 2^u 2^f >= a_j scale counts (every byte of the encoding, many u)."""
    coefs, frac = threshold_coefs(mode, bits)
    enc = scale_encoding(scale)
    nth = len(coefs)
    wy = A_WIDTH
    sat_val = 1 << wy
    us = range(-40, 31) if FULL else range(-40, 31, 10)
    cases = [(int(byte), u) for u in us for byte in enc.bytes]
    p = FormatParams(n=8, block=8, bits=bits, mode=mode, scale=scale)
    bank = _Bank([Thresholds(p, wy, U_SHAPE) for _ in range(BANK)])
    got = []

    async def tb(ctx):
        for c0 in range(0, len(cases), BANK):
            chunk = cases[c0:c0 + BANK]
            for t, (byte, u) in zip(bank.units, chunk):
                ctx.set(t.byte, byte)
                ctx.set(t.u, u)
            for t, _ in zip(bank.units, chunk):
                got.append([ctx.get(t.th[0][j]) for j in range(nth)])

    sim = Simulator(bank)
    sim.add_testbench(tb)
    sim.run()
    th = np.array(got, dtype=np.int64)
    byte = np.array([c[0] for c in cases])
    u = np.array([c[1] for c in cases])
    sig, exp = enc.sig_exp(byte)
    for j, aj in enumerate(coefs):
        t = th[:, j]
        c = aj * sig
        assert (t >= 1).all() and (t <= sat_val).all()
        below = t - 1
        # |y| = t - 1 must not count (also when t is saturated, 2^wy - 1 is the largest |y|)
        assert not ge_scaled(below << frac, u, c, exp).any()
        ok = t < sat_val
        assert ge_scaled(t[ok] << frac, u[ok], c[ok], exp[ok]).all()
        assert ok.any() and (~ok).any()


@pytest.mark.parametrize("copies", [0, -1, 1.0, True])
def test_thresholds_bad_copies(copies):
    with pytest.raises(ValueError, match="copies"):
        Thresholds(FormatParams(n=8, block=8), A_WIDTH, U_SHAPE, copies=copies)


@pytest.mark.parametrize("sel_reg,diff_reg", [(False, False), (True, False), (True, True)])
def test_thresholds_copies_agree(sel_reg, diff_reg):
    """Pipelined thresholds in 3 copies (each from its own register before the shifts,
    with ``sel_reg`` each also registered after its shifts, with ``diff_reg`` also
    after the exponent differences): every copy equals the combinational unit's
    thresholds one to three cycles later."""
    p = FormatParams(n=8, block=8, bits=3, mode="midrise")
    enc = scale_encoding(p.scale)
    cases = [(int(b), u) for u in (-40, -30, -3, 0, 5, 30) for b in enc.bytes[::7]]
    ref = Thresholds(p, A_WIDTH, U_SHAPE)
    cop = Thresholds(p, A_WIDTH, U_SHAPE, True, copies=3, sel_reg=sel_reg, diff_reg=diff_reg)
    delay = 1 + sel_reg + diff_reg
    bank = _Bank([ref, cop])
    nth = len(ref.coefs)
    seen = []

    async def tb(ctx):
        ctx.set(cop.en, 1)
        hist = []
        for byte, u in cases + [cases[-1]] * delay:
            for t in (ref, cop):
                ctx.set(t.byte, byte)
                ctx.set(t.u, u)
            if len(hist) >= delay:
                want = hist[-delay]
                got = [[ctx.get(cop.th[k][j]) for j in range(nth)] for k in range(3)]
                assert got == [want] * 3
                seen.append(want)
            hist.append([ctx.get(ref.th[0][j]) for j in range(nth)])
            await ctx.tick()

    sim = Simulator(bank)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert len(seen) == len(cases) and len({tuple(s) for s in seen}) > 10


@pytest.mark.parametrize("dtype,mant_bits,n", [
    ("fp16", 12, 16), ("fp16", 6, 16), ("fp16", 11, 8), ("fp16", 16, 16),
    ("bf16", 12, 16), ("bf16", 6, 8), ("bf16", 16, 8),
])
def test_frontend_matches_bfp(dtype, mant_bits, n):
    p = FormatParams(n=n, block=8, mant_bits=mant_bits, dtype=dtype, sign_seed=3)
    rng = np.random.default_rng(mant_bits)
    vecs = np.concatenate([directed_vectors(p, rng), random_patterns(p, 48, rng)])
    x, u, flags = to_block_fp(vecs, p, sign_mask(p.n, p.sign_seed))
    lo, hi = u_range(p)
    assert lo <= u.min() and u.max() <= hi
    fe = FrontEnd(p)
    ins = wire.rows_to_ints(wire.lane_rows(vecs))
    bad = []

    async def tb(ctx):
        for v, word in enumerate(ins):
            ctx.set(fe.bits, word)
            gx = [ctx.get(fe.x[k]) for k in range(n)]
            gu, gf = ctx.get(fe.u), ctx.get(fe.flags)
            if gx != x[v].tolist() or gu != u[v] or gf != flags[v]:
                bad.append(v)

    sim = Simulator(fe)
    sim.add_testbench(tb)
    sim.run()
    assert not bad, f"front end mismatches on vectors {bad[:10]}"


@pytest.mark.parametrize("dtype,mant_bits,n,tree_every", [
    ("fp16", 12, 16, 0), ("bf16", 8, 8, 0), ("fp16", 12, 64, 1), ("bf16", 6, 64, 2),
])
def test_frontend_emax_register(dtype, mant_bits, n, tree_every):
    """FrontEnd(regs=("emax",), tree_every): the same results ``latency`` enabled cycles
    later, held while en is low. With tree registers and N = 64 (8 copies of emax) the
    tree's last register is in 8 copies, each reduced to its own root: each copy feeds
    its own 8 lanes, so a wrong copy shows in those lanes' x."""
    p = FormatParams(n=n, block=8, mant_bits=mant_bits, dtype=dtype, sign_seed=3)
    rng = np.random.default_rng(n + tree_every)
    vecs = np.concatenate([directed_vectors(p, rng), random_patterns(p, 24, rng)])
    x, u, flags = to_block_fp(vecs, p, sign_mask(p.n, p.sign_seed))
    fe = FrontEnd(p, ("emax",), tree_every=tree_every)
    cuts = tree_cuts(n, tree_every)
    assert fe.latency == 1 + cuts
    if cuts:
        names = rtlil.convert(fe)
        for k in range(8):
            assert f"emaxt{cuts - 1}_part0_r{k}" in names and f"emax_emax_r{k}" in names
            assert k == 0 or f"emax_c{k}_l0_0" in names
        assert f"emaxt{cuts - 1}_part0_r8" not in names
    ins = wire.rows_to_ints(wire.lane_rows(vecs))
    bad, seen = [], []
    rnd = random.Random(n)

    async def tb(ctx):
        idx, pipe = 0, [None] * fe.latency      # the vector index in each register stage
        for _ in range(3 * len(ins) + 4 * fe.latency):
            en = rnd.random() < 0.7
            ctx.set(fe.en, en)
            ctx.set(fe.i_valid, idx < len(ins))
            if idx < len(ins):
                ctx.set(fe.bits, ins[idx])
            v = pipe[-1]
            if ctx.get(fe.o_valid) != (v is not None):
                bad.append(("valid", v))
            elif v is not None:
                gx = [ctx.get(fe.x[k]) for k in range(n)]
                if gx != x[v].tolist() or ctx.get(fe.u) != u[v] or ctx.get(fe.flags) != flags[v]:
                    bad.append(v)
            if en:
                if v is not None:
                    seen.append(v)
                pipe = [idx if idx < len(ins) else None] + pipe[:-1]
                idx += 1
            await ctx.tick()

    sim = Simulator(fe)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert not bad, f"front end (emax cut) mismatches on vectors {bad[:10]}"
    assert seen == list(range(len(ins)))


def test_register_positions():
    assert register_positions(7, 2) == [4, 7]
    assert register_positions(7, 1) == [7]
    assert register_positions(7, 0) == []
    assert register_positions(7, 7) == [1, 2, 3, 4, 5, 6, 7]
    assert register_positions(6, 4) == [2, 3, 5, 6]
    assert register_positions(8, 3) == [3, 6, 8]
    with pytest.raises(ValueError, match="latency"):
        register_positions(7, 8)


@pytest.mark.parametrize("n,latency", [(8, 0), (8, 1), (8, 2), (8, 3), (16, 2), (64, 6)])
def test_fwht_matches_golden_with_stalls(n, latency):
    width = 12
    rng = np.random.default_rng(n + latency)
    xs = rng.integers(-(1 << (width - 1)) + 1, 1 << (width - 1), (40, n))
    xs[0] = (1 << (width - 1)) - 1          # largest growth: all lanes max
    xs[1] = -(1 << (width - 1)) + 1
    want = fwht(xs)
    dut = FWHT(n, width, latency, side_width=4)
    top = Module()
    top.submodules.dut = dut
    tick = Signal()
    top.d.sync += tick.eq(~tick)      # gives latency 0 a clock domain too
    got = []
    rnd = random.Random(latency)

    async def tb(ctx):
        idx = 0
        for _ in range(200):
            en = rnd.random() < 0.7
            ctx.set(dut.en, en)
            ctx.set(dut.i_valid, idx < len(xs))
            if idx < len(xs):
                for k in range(n):
                    ctx.set(dut.x[k], int(xs[idx, k]))
                ctx.set(dut.side_i, idx & 15)
            if latency == 0 or en:
                if ctx.get(dut.o_valid):
                    got.append(([ctx.get(dut.y[k]) for k in range(n)], ctx.get(dut.side_o)))
                if idx < len(xs):
                    idx += 1
            await ctx.tick()

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert len(got) >= len(xs) - latency
    for i, (y, side) in enumerate(got):
        assert y == want[i].tolist(), f"vector {i}"
        assert side == i & 15


@pytest.mark.parametrize("n,latency", [(16, 0), (16, 2), (64, 5)])
def test_fwht_two_beats_with_bubbles(n, latency):
    """FWHT(lanes = N/2): vectors as two beats with random cycles without a beat (also
    between beat 0 and beat 1) and random stalls: every vector is the Sylvester product,
    in order, once, its side band with it (hw.fwht.fold_stage takes beat 0 whenever its
    beat index is 0 and a - b whenever it is 1, never gated by ``valid``)."""
    width, w = 10, n // 2
    rng = np.random.default_rng(n + latency)
    xs = rng.integers(-(1 << (width - 1)) + 1, 1 << (width - 1), (30, n))
    want = fwht(xs)
    dut = FWHT(n, width, latency, side_width=4, lanes=w)
    top = Module()
    top.submodules.dut = dut
    tick = Signal()
    top.d.sync += tick.eq(~tick)
    got, beats_out = [], []
    rnd = random.Random(n * 7 + latency)

    async def tb(ctx):
        idx, beat = 0, 0
        for _ in range(400):
            en = rnd.random() < 0.8
            send = idx < len(xs) and rnd.random() < 0.6
            ctx.set(dut.en, en)
            ctx.set(dut.i_valid, send)
            vec = xs[idx] if idx < len(xs) else xs[0]
            for k in range(w):
                ctx.set(dut.x[k], int(vec[beat * w + k]) if send else rnd.randrange(-500, 500))
            ctx.set(dut.side_i, idx & 15 if send else rnd.randrange(16))
            if en:
                if ctx.get(dut.o_valid):
                    beats_out.append(([ctx.get(dut.y[k]) for k in range(w)], ctx.get(dut.side_o)))
                if send:
                    beat ^= 1
                    idx += beat == 0
            await ctx.tick()

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    got = [(b0 + b1, s0, s1) for (b0, s0), (b1, s1) in zip(beats_out[::2], beats_out[1::2])]
    assert len(got) >= len(xs) - 2
    for i, (y, s0, s1) in enumerate(got):
        assert y == want[i].tolist(), f"vector {i}"
        assert s0 == s1 == i & 15


def test_cuts():
    """hw.pipeline.Cuts: placements come back in data-flow order; bad ones are refused
    with the option's name; the latency is the number of cuts."""
    from hw.pipeline import Cuts
    c = Cuts("demo_regs", ("a", "b", "c"), default=("c", "a"))
    assert c.default == ("a", "c") and list(c) == ["a", "b", "c"] and "b" in c
    assert c.check(["c", "b"]) == ("b", "c") and c.latency(("c", "b", "a")) == 3
    for bad, err in ((("d",), ValueError), (("a", "a"), ValueError), ("a", TypeError),
                     ((1,), TypeError), (None, TypeError)):
        with pytest.raises(err, match="demo_regs"):
            c.check(bad)
    with pytest.raises(ValueError, match="demo_regs"):
        Cuts("demo_regs", ("a",), default=("z",))


def test_stage():
    """hw.pipeline.stage: registers advance only while en is high; valid resets to 0,
    data keeps no reset; lists are registered element by element."""
    from hw.pipeline import stage
    m = Module()
    en, valid, x = Signal(), Signal(), Signal(signed(6))
    xs = [Signal(3), Signal(4)]
    r = stage(m, en, "s", valid=valid, x=x, xs=xs)
    assert [v.name for v in r["xs"]] == ["s_xs0", "s_xs1"] and r["x"].name == "s_x"
    assert r["valid"].reset_less is False and r["x"].reset_less and r["xs"][1].reset_less
    assert r["x"].shape() == signed(6) and len(r["xs"][1]) == 4

    async def tb(ctx):
        assert ctx.get(r["valid"]) == 0
        ctx.set(valid, 1)
        ctx.set(x, -5)
        ctx.set(xs[1], 9)
        await ctx.tick()                # en low: nothing moves
        assert ctx.get(r["valid"]) == 0
        ctx.set(en, 1)
        await ctx.tick()
        assert (ctx.get(r["valid"]), ctx.get(r["x"]), ctx.get(r["xs"][1])) == (1, -5, 9)
        ctx.set(en, 0)
        ctx.set(x, 3)
        await ctx.tick()
        assert ctx.get(r["x"]) == -5

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()


def test_replicas_fanout_tree():
    """hw.pipeline.replicas from upstream copies: copy k loads value[k * len // copies]
    (two leaves per source for 2 -> 4, every other source for 8 -> 4), every copy equals
    the value one cycle later; counts where neither divides the other are refused."""
    from hw.pipeline import REPLICA_GROUP_LANES, REPLICA_LEAF_LANES, replica_count, replicas
    assert REPLICA_GROUP_LANES % REPLICA_LEAF_LANES == 0
    assert replica_count(64, REPLICA_LEAF_LANES) == 2 * replica_count(64)
    m = Module()
    src = [Signal(5, name=f"src{k}") for k in range(2)]
    regs = replicas(m, 1, "t", src, 4)
    assert [r.name for r in regs] == [f"t_r{k}" for k in range(4)]
    assert all(r.attrs.get("keep") == 1 for r in regs)

    async def tb(ctx):
        for v in (3, 17, 31, 0):
            ctx.set(src[0], v)
            ctx.set(src[1], v ^ 1)           # tells which source a copy loads from
            await ctx.tick()
            assert [ctx.get(r) for r in regs] == [v, v, v ^ 1, v ^ 1]

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    m = Module()
    many = [Signal(5, name=f"many{k}") for k in range(8)]
    fewer = replicas(m, 1, "f", many, 4)

    async def tb_fewer(ctx):
        for v in (5, 30):
            for k, s in enumerate(many):
                ctx.set(s, v ^ k)            # source k tells itself apart
            await ctx.tick()
            assert [ctx.get(r) for r in fewer] == [v ^ k for k in (0, 2, 4, 6)]

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(tb_fewer)
    sim.run()
    for copies in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="copies"):
            replicas(m, 1, "t", src, copies)
    for bad in ([Signal(5)] * 3, [Signal(5)] * 6, []):
        with pytest.raises(ValueError, match="value"):
            replicas(m, 1, "t", bad, 4)


# --------------------------------------------------------------------------- key front end

@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_keyfront_arguments():
    """key_slots is checked where it is given (the folded key front end, the encoder's
    options); no cfg port without it."""
    from hw import EncoderOptions, KVEncoder
    from hw.keyfold import FoldFrontEnd
    p = FormatParams(n=16, block=8)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="key_slots"):
            FoldFrontEnd(p, bad)
    with pytest.raises(ValueError, match="key_slots.*fp16"):
        KVEncoder(FormatParams(n=16, block=8, dtype="bf16"), EncoderOptions(1, key_slots=2))
    with pytest.raises(ValueError, match="fe_regs"):
        KVEncoder(p, EncoderOptions(1, key_slots=2, fe_regs=("tree",)))
    assert "cfg" not in KVEncoder(p, EncoderOptions(1)).signature.members


# ---- lane delay line in block RAM (hw.pipeline.ram_delay) ---------------------------

@pytest.mark.parametrize("stages", [3, 4, 5, 6, 9, 11, 18])
def test_ram_delay_equals_register_chain(stages):
    """``ram_delay`` against ``stages`` chained ``stage`` registers under the same random
    enable (long stall runs included) and random resets: every cycle the valid bits
    agree (they are the chain's), and wherever the chain's output is valid the RAM's
    data equals the chain's; after the last reset a stall-free stretch checks every
    cycle, valid or not."""
    from hw.pipeline import LANE_RAM_MIN, ram_delay, ram_depth, stage
    width = 24
    top = Module()
    top.domains.sync = cd = ClockDomain("sync")
    en, val, vin = Signal(), Signal(width), Signal()
    top.submodules.sub = sub = Module()          # the helper adds a memory submodule
    chain = {"data": val, "valid": vin}
    for s in range(stages):
        chain = stage(sub, en, f"c{s}", **chain)
    ram = ram_delay(sub, en, "lanes", val, stages)
    assert ram_depth(stages) >= stages - 1 and LANE_RAM_MIN == 3
    rnd = random.Random(stages)
    stats = {"valid_cmp": 0, "resets": 0, "long_stalls": 0}

    async def tb(ctx):
        stall = 0
        for cyc in range(1500):
            tail = cyc >= 1300                   # no resets, no stalls
            if stall == 0 and not tail and rnd.random() < 0.02:
                stall = rnd.randrange(stages, 4 * stages + 8)     # beyond the buffer depth
                stats["long_stalls"] += 1
            e = tail or (stall == 0 and rnd.random() < 0.7)
            stall = max(stall - 1, 0)
            r = not tail and rnd.random() < 0.01
            stats["resets"] += r
            ctx.set(en, e)
            ctx.set(cd.rst, r)
            ctx.set(val, rnd.getrandbits(width))
            ctx.set(vin, rnd.random() < 0.8)
            if ctx.get(chain["valid"]) or cyc >= 1300 + stages:
                assert ctx.get(ram) == ctx.get(chain["data"]), f"cycle {cyc}"
                stats["valid_cmp"] += 1
            await ctx.tick()

    sim = Simulator(top)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert stats["resets"] >= 5 and stats["long_stalls"] >= 5 and stats["valid_cmp"] > 500


@pytest.mark.parametrize("stages", [0, 1, 2])
def test_ram_delay_refuses_short_delays(stages):
    from hw.pipeline import ram_delay
    with pytest.raises(ValueError, match="stages"):
        ram_delay(Module(), Signal(), "lanes", Signal(8), stages)


@pytest.mark.parametrize("value,exc", [(1, ValueError), (2, ValueError), (-1, ValueError),
                                       (True, TypeError), (3.0, TypeError), ("3", TypeError)])
def test_check_lane_ram(value, exc):
    from hw.pipeline import check_lane_ram
    with pytest.raises(exc, match="lane_ram"):
        check_lane_ram(value)
    assert check_lane_ram(0) == 0 and check_lane_ram(3) == 3


# ---- flow control: stall vs credit (hw.pipeline.FlowControl, skid_fifo) ----------------

from amaranth.hdl import Value  # noqa: E402

from hw.pipeline import FLOWS, check_flow  # noqa: E402
from kvtest.flowpipe import FlowPipe  # noqa: E402
from kvtest.simstream import check_run, run_stream  # noqa: E402


def held_high(dut, cycles: int, stall_from: int | None = None, stall_for: int = 0) -> dict:
    """i.valid and o.ready high for ``cycles`` cycles (``o.ready`` low for ``stall_for``
    cycles from ``stall_from``); i.ready read twice per cycle, with o.ready high and low.
    Returns the handshake cycles, the payloads out and the cycles where i.ready followed
    o.ready combinationally."""
    rec = {"in": [], "out": [], "got": [], "comb": []}
    ipay, opay = Value.cast(dut.i.payload), Value.cast(dut.o.payload)

    async def tb(ctx):
        for cyc in range(cycles):
            stalled = stall_from is not None and stall_from <= cyc < stall_from + stall_for
            ctx.set(dut.i.valid, 1)
            ctx.set(ipay, len(rec["in"]) % (1 << len(ipay)))
            ctx.set(dut.o.ready, 0)
            r0 = ctx.get(dut.i.ready)
            ctx.set(dut.o.ready, 1)
            r1 = ctx.get(dut.i.ready)
            ctx.set(dut.o.ready, int(not stalled))
            if r0 != r1:
                rec["comb"].append(cyc)
            if ctx.get(dut.i.ready):
                rec["in"].append(cyc)
            if ctx.get(dut.o.valid) and not stalled:
                rec["out"].append(cyc)
                rec["got"].append(ctx.get(opay))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return rec


@pytest.mark.parametrize("stages", [0, 1, 5, 12])
def test_credit_full_rate_registered_ready(stages):
    """Credit flow with o.ready held high: one vector per cycle for many times the credits
    (i.ready never drops, the outputs leave exactly latency_cycles after their input), and
    i.ready is not combinational from o.ready. Stall flow, the same run: i.ready does
    follow o.ready (the check sees it)."""
    dut = FlowPipe("credit", stages)
    n = 4 * dut.credits + 20
    rec = held_high(dut, n)
    assert rec["in"] == list(range(n)), "i.ready dropped with o.ready high (credits too few?)"
    lat = dut.latency_cycles
    assert rec["out"] == list(range(lat, n))
    assert rec["got"] == [(k + stages) % 4096 for k in range(n - lat)]
    assert rec["comb"] == []
    stall = held_high(FlowPipe("stall", stages), stages + 8)
    assert stall["comb"] != []


def test_credit_full_rate_check_can_fail(monkeypatch):
    """One credit fewer (latency_cycles + 1 instead of latency_cycles + 2): the input
    pauses one cycle in every latency + 2, and test_credit_full_rate_registered_ready's
    check fails."""
    import hw.pipeline
    monkeypatch.setattr(hw.pipeline, "credit_depth", lambda lat, extra=0, beats=1: lat + 1 + extra)
    dut = FlowPipe("credit", 5)
    n = 4 * (dut.latency_cycles + 2) + 20
    rec = held_high(dut, n)
    assert rec["in"] != list(range(n))
    # steady state: the input pauses once in every latency + 2 cycles
    lat = dut.latency_cycles
    late = [t for t in rec["in"] if t >= 2 * lat]
    span = range(2 * lat, n)
    assert len(span) - len(late) >= len(span) // (lat + 2)


@pytest.mark.parametrize("stages", [0, 1, 4, 7])
@pytest.mark.parametrize("fewer", [False, True])
def test_credit_full_rate_two_beats(stages, fewer, monkeypatch):
    """Two beats per vector with o.ready held high: (latency + 1) // 2 + 1 credits
    (hw.pipeline.credit_depth) take a vector every two cycles without a pause, and each
    leaves latency_cycles after its input; one credit fewer and the input pauses."""
    import hw.pipeline
    if fewer:
        depth = hw.pipeline.credit_depth
        monkeypatch.setattr(hw.pipeline, "credit_depth",
                            lambda lat, extra=0, beats=1: depth(lat, extra, beats) - 1)
    dut = FlowPipe("credit", stages, beats=2)
    lat = dut.latency_cycles
    assert dut.credits == (lat + 1) // 2 + 1 - fewer
    n = 8 * (lat + 2) + 20
    rec = held_high(dut, n)
    late = [t for t in rec["in"] if t >= 2 * lat]
    if fewer:
        assert late != list(range(late[0], n, 2)), "one credit fewer still at full rate"
        return
    assert rec["in"] == list(range(0, n, 2))
    assert rec["out"] == [t + lat for t in rec["in"] if t + lat < n]
    half = [(v + stages) % 64 for v in range(64)]        # each 6-bit beat counted up
    assert rec["got"] == [half[k % 64] | half[(k >> 6) % 64] << 6
                          for k in range(len(rec["got"]))]


@pytest.mark.parametrize("extra", [0, 3])
def test_credit_long_stall_holds_every_vector(extra):
    """o.ready low for many cycles: the input takes exactly ``credits`` vectors (all land
    in the skid FIFO) and stops; after the stall every vector comes out, in order, once."""
    dut = FlowPipe("credit", 4, extra)
    c = dut.credits
    rec = held_high(dut, 10 * c, stall_from=0, stall_for=5 * c)
    assert [t for t in rec["in"] if t < 5 * c] == list(range(c))     # c taken, then i.ready low
    assert rec["out"][:c] == list(range(5 * c, 6 * c))               # all held, all out
    assert rec["got"] == [(k + 4) % 4096 for k in range(len(rec["got"]))]  # once, in order
    assert len(rec["got"]) >= len(rec["in"]) - c


@pytest.mark.parametrize("slice_bits", [1, 5])
def test_skid_fifo_slices_step_together(slice_bits):
    """The skid FIFO cut into slices (``slice_bits``; 12 slices of 1 bit, or 5 + 5 + 2):
    each slice's own control copy keeps the same entries, so under a long stall and random
    gaps and stalls every vector comes out whole, once, in order; one block RAM and one
    copy of the output valid bit per slice."""
    dut = FlowPipe("credit", 3, slice_bits=slice_bits)
    c = dut.credits
    rec = held_high(dut, 10 * c, stall_from=0, stall_for=5 * c)
    assert rec["out"][:c] == list(range(5 * c, 6 * c))
    assert rec["got"] == [(k + 3) % 4096 for k in range(len(rec["got"]))]
    run = run_stream(FlowPipe("credit", 3, slice_bits=slice_bits), list(range(300)), 5,
                     p_valid=0.8, p_ready=0.5, free_run_first=12)
    check_run(run, [(x + 3) % 4096 for x in range(300)], 12)
    from amaranth.back import rtlil
    text = rtlil.convert(FlowPipe("credit", 3, slice_bits=slice_bits))
    assert text.count("cell $memrd_v2") == -(-12 // slice_bits)
    # the output valid bit in one copy per slice, kept apart
    copies = set(re.findall(r"wire width 1 \\(out_valid\d*)\n", text))
    assert copies == {"out_valid"} | {f"out_valid{k}" for k in range(1, -(-12 // slice_bits))}
    assert re.search(r"attribute \\keep 1\s+wire width 1 \\out_valid1\n", text)


@pytest.mark.parametrize("bits,exc", [(0, ValueError), (-3, ValueError), (True, TypeError),
                                      (4.0, TypeError)])
def test_skid_slice_bits_checked(bits, exc):
    """A slice width that is not a positive int is refused, naming ``slice_bits``."""
    import gc
    import warnings
    from amaranth.hdl import UnusedElaboratable
    from hw.pipeline import skid_slices
    with warnings.catch_warnings():     # the refused FlowPipe is never elaborated
        warnings.simplefilter("ignore", UnusedElaboratable)
        with pytest.raises(exc, match="slice_bits"):
            FlowPipe("credit", 3, slice_bits=bits)
        gc.collect()
    with pytest.raises(exc, match="slice_bits"):
        skid_slices(12, bits)


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("stages", [0, 3, 9])
def test_flow_random_stream(flow, stages):
    """Random gaps and stalls (kvtest.simstream.run_stream: stream rules every cycle, the
    i.ready rule of the flow, at most ``credits`` in flight): every vector once, in order."""
    dut = FlowPipe(flow, stages)
    ins = list(range(400))
    run = run_stream(dut, ins, stages, p_valid=0.8, p_ready=0.6, free_run_first=12)
    check_run(run, [(x + stages) % 4096 for x in ins], 12)
    assert run["stall_cycles"] > 50


@pytest.mark.parametrize("flow,extra,exc", [("credits", 0, ValueError), (1, 0, TypeError),
                                            ("stall", 1, ValueError), ("credit", -1, ValueError),
                                            ("credit", True, TypeError)])
def test_check_flow(flow, extra, exc):
    with pytest.raises(exc, match="flow" if flow != "credit" else "credit_extra"):
        check_flow(flow, extra)


@pytest.mark.parametrize("width,extra,style", [(12, 40, "distributed"), (200, 0, "distributed"),
                                               (500, 40, "distributed"), (600, 40, "block"),
                                               (2100, 6, "distributed"), (2100, 10, "block")])
def test_skid_fifo_ram_style(width, extra, style):
    """The skid FIFO in LUT RAM up to hw.pipeline.SKID_LUTRAM_BITS bits (width x entries:
    12 x 64, 200 x 8, 500 x 64) or up to SKID_LUTRAM_ENTRIES entries (2100 x 16), in block
    RAM above (600 x 64, 2100 x 32)."""
    from amaranth.back import rtlil
    from hw.pipeline import SKID_LUTRAM_BITS, SKID_LUTRAM_ENTRIES, skid_ram
    dut = FlowPipe("credit", 3, extra, width=width)
    size, got = skid_ram(width, dut.credits)
    assert size in (8, 16, 32, 64) and got == style
    assert (width * size <= SKID_LUTRAM_BITS
            or size <= SKID_LUTRAM_ENTRIES) == (style == "distributed")
    text = rtlil.convert(dut)
    assert f'attribute \\ram_style "{style}"' in text


@pytest.mark.parametrize("flow", FLOWS)
def test_beat_copies_equal_beat(flow):
    """FlowControl.beat_copies: every copy of the beat index equals ``beat`` in every cycle
    (random i.valid / o.ready, a reset in mid-stream), the index is 0 whenever no beat is
    on (the invariant that lets it toggle without a reset from the handshake), and
    beat_groups / beat_of give each group of BEAT_GROUP_LANES lanes its own copy."""
    from amaranth.lib import stream, wiring
    from amaranth.lib.wiring import In, Out
    from hw.pipeline import BEAT_GROUP_LANES, FlowControl, beat_groups, beat_of

    class Top(wiring.Component):
        def __init__(self):
            super().__init__({"i": In(stream.Signature(8)), "o": Out(stream.Signature(8)),
                              "beat": Out(1), "copies": Out(3), "on": Out(1)})
            self.cd = ClockDomain("sync")

        def elaborate(self, platform):
            m = Module()
            m.domains.sync = self.cd
            fc = FlowControl(m, flow, self.i, self.o, 2, beats=2)
            m.d.comb += [self.beat.eq(fc.beat), self.copies.eq(fc.beat_copies(3)),
                         self.on.eq(fc.i_valid)]
            fc.output(fc.payload, fc.i_valid & fc.beat)
            return m

    dut = Top()
    rng = np.random.default_rng(3)
    seen = set()

    async def tb(ctx):
        for cyc in range(400):
            ctx.set(dut.i.valid, int(rng.random() < 0.7))
            ctx.set(dut.o.ready, int(rng.random() < 0.6))
            ctx.set(Value.cast(dut.i.payload), cyc % 256)
            b, c = ctx.get(dut.beat), ctx.get(dut.copies)
            assert c == (0b111 if b else 0), f"cycle {cyc}: beat {b}, copies {c:03b}"
            assert ctx.get(dut.on) or not b, f"cycle {cyc}: beat 1 with no beat on"
            seen.add(b)
            ctx.set(dut.cd.rst, int(cyc == 200))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert seen == {0, 1}
    assert [beat_groups(w) for w in (4, 8, 9, 32, 64)] == [1, 1, 2, 4, 8]
    two = Signal(2)         # 2 groups of BEAT_GROUP_LANES lanes: the copy by lane
    assert [beat_of(two, i, 2 * BEAT_GROUP_LANES).start
            for i in (0, BEAT_GROUP_LANES - 1, BEAT_GROUP_LANES, 2 * BEAT_GROUP_LANES - 1)] \
        == [0, 0, 1, 1]
