"""Tests of hw.KVDecoder (amaranth.sim) against sim_models.decode.

Every output payload (N fp16/bf16 patterns) must equal the golden read path
bit for bit, in order, with no loss or duplication, under random input gaps and
random o.ready stalls; the testbench also checks the stream rules (payload and
valid held while stalled, ``i.ready == o.ready | ~o.valid``), the exact latency
(``latency_cycles``) and one vector per cycle while nothing stalls.

Inputs: the golden encoding of the shared fp16 test vectors (the round trip),
uniformly random code planes with random scale bytes, and the structured
worst cases of ``kvtest.planes.adversarial_planes`` (Hadamard rows, all-zero
blocks with scale 0x01, scale 0xFF, 0x01 next to 0xFF, scale 0x00, ties).
Every N in {64, 128, 256} and b in {2, 3, 4} runs in the quick selection (a
subset of the adversarial set for N >= 128); HW_FULL=1 streams the whole sets
and the N x b x latency cross product (slow). The float conversion is also
checked on its own against ``sim_models.codec.round_to_input_type`` with
targeted integers (ties, subnormal and saturation boundaries).
"""

from __future__ import annotations

import gc
import os
import re
import warnings

import numpy as np
import pytest
from amaranth.hdl import Module, Signal, UnusedElaboratable, signed
from amaranth.sim import Simulator

from hw import DecoderOptions, FoldOptions, KVDecoder
from hw.decoder import DQ_CUTS, FLOAT_CUTS, read_window
from kvtest.inputs import fp16_to_bf16
from kvtest.levels import code_range, pack_plane, scale_bytes
from kvtest.planes import adversarial_planes, decoder_rows, encoded_planes, random_planes
from hw.pipeline import REPLICA_SELECT_LANES, SKID_FIFO_CYCLES
from kvtest.simstream import check_run, flow_cases, run_stream, stream_get, stream_put
from kvtest.ties import tie_lanes
from hw.dequant import READ_SUPPORT, level_table, scale_format
from hw.fwht import FOLD_CYCLES
from hw import ifwht
from hw.ifwht import FOLD_ALIGN_CYCLES, MAX_ALIGN, BlockFWHT, default_align, out_width, steps_of
from hw.tofloat import PREP_PORTS, FloatConsts, FloatPack, FloatPrep
from sim_models import wire
from sim_models.codec import decode_float, encode, round_to_input_type
from sim_models.bfp import FLAG_INF, FLAG_NAN
from sim_models.fwht import fwht
from sim_models.params import FormatParams
from sim_models.signs import sign_mask, sign_mask_int
from sim_models.testvectors import adversarial_vectors, random_vectors

FULL = os.environ.get("HW_FULL", "") not in ("", "0")
pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")


def _three(p: FormatParams, t):
    """A plane set as (codes, scales, zeros); zeros all 0 (unused) except for asym."""
    if len(t) == 3:
        return t
    return t[0], t[1], np.zeros_like(t[1])


def planes_for(p: FormatParams, n_random: int, adv_stride: int, seed: int):
    """Round-trip encodings + random planes + (every adv_stride-th) adversarial planes,
    as (codes, scales, zeros)."""
    rt_bits = np.concatenate([adversarial_vectors(p.n, seed)[::adv_stride],
                              random_vectors(p.n, n_random, seed)])
    if p.dtype == "bf16":
        rt_bits = fp16_to_bf16(rt_bits)
    sets = [_three(p, encoded_planes(rt_bits, p)), _three(p, random_planes(p, n_random, seed))]
    sets.append(tuple(a[::adv_stride] for a in _three(p, adversarial_planes(p, seed))))
    return tuple(np.concatenate([s[j] for s in sets]) for j in range(3))


def make_decoder(p, fwht_regs=2, float_regs=FLOAT_CUTS.default, split_align=False,
                 flow="stall", credit_extra=0, lanes=None, dq_regs=DQ_CUTS.default,
                 fold_align=False, reset_copies=False, fold=None) -> KVDecoder:
    """``KVDecoder(p, DecoderOptions(...))`` with the options in their former order
    (``fold_align``: ``fold.align``)."""
    fold = FoldOptions(align=fold_align) if fold is None else fold
    return KVDecoder(p, DecoderOptions(fwht_regs, float_regs=float_regs, dq_regs=dq_regs,
                                       split_align=split_align, flow=flow,
                                       credit_extra=credit_extra, lanes=lanes, fold=fold,
                                       reset_copies=reset_copies))


def run_dut(p: FormatParams, latency: int, codes: np.ndarray, scales: np.ndarray,
            zeros: np.ndarray | None = None, seed: int = 1,
            *, p_valid: float = 0.8, p_ready: float = 0.7, free_run_first: int = 12,
            raw_scales: np.ndarray | None = None, float_regs=None, split_align: bool = False,
            flow: str = "stall", lanes: int | None = None, dq_regs=DQ_CUTS.default,
            fold_align: bool = False, fold: FoldOptions | None = None):
    """Stream the planes through the DUT (:func:`kvtest.simstream.run_stream`);
    returns (expected words, the run). ``raw_scales``: scale bytes fed to the DUT
    instead of ``scales`` (the expected outputs still come from ``scales``). ``flow``: the
    flow control (``hw.pipeline.FLOWS``); ``fold``: the fold's options (``fold_align``
    sets its ``align``)."""
    ins = wire.rows_to_ints(wire.decoder_input_rows(
        p, codes, scales if raw_scales is None else raw_scales, zeros))
    exp = wire.rows_to_ints(decoder_rows(codes, scales, p, zeros))
    if float_regs is None:
        dut = make_decoder(p, latency, flow=flow, lanes=lanes, dq_regs=dq_regs,
                           fold_align=fold_align, fold=fold)
        assert dut.float_regs == FLOAT_CUTS.default
    else:
        dut = make_decoder(p, latency, float_regs, split_align, flow=flow, lanes=lanes,
                           dq_regs=dq_regs, fold_align=fold_align, fold=fold)
    fifo = SKID_FIFO_CYCLES if flow == "credit" else 0
    # input register, second beat, fold stage (with or without the alignment in it)
    beats = 2 + (FOLD_ALIGN_CYCLES if dut.fold_align else FOLD_CYCLES) if dut.beats > 1 else 0
    assert dut.latency_cycles == (latency + 2 + len(dut.float_regs) + len(dut.dq_regs) + fifo
                                  + beats)
    assert len(dut.i.payload.as_value()) == wire.decoder_input(p).width
    run = run_stream(dut, ins, seed, p_valid=p_valid, p_ready=p_ready,
                     free_run_first=free_run_first)
    return exp, run


def check(p: FormatParams, latency: int, codes, scales, zeros=None, seed: int = 1, **kw):
    exp, run = run_dut(p, latency, codes, scales, zeros, seed, **kw)

    def describe(got, e):
        gl, el = wire.int_to_lanes(got, p.n), wire.int_to_lanes(e, p.n)
        lanes = np.flatnonzero(gl != el)
        return "lanes " + ", ".join(f"{k}: got {gl[k]:#06x} exp {el[k]:#06x}" for k in lanes[:6])

    check_run(run, exp, kw.get("free_run_first", 12), describe)
    if len(exp) > 20:
        assert run["stall_cycles"] > 0
    return exp


QUICK = [
    # (n, block, bits, latency, n_random, adversarial stride); (128, 64, 3) is test_default_config
    (64, 64, 2, 0, 12, 5),
    (64, 64, 3, 1, 12, 5),
    (64, 64, 4, 6, 12, 5),
    (64, 32, 3, 2, 12, 5),
    (64, 8, 4, 3, 8, 8),
    (128, 64, 2, 2, 6, 12),
    (128, 64, 4, 1, 6, 12),
    (256, 64, 2, 8, 2, 40),
    (256, 64, 3, 2, 2, 40),
    (256, 64, 4, 3, 2, 40),
]


@pytest.mark.parametrize("n,block,bits,latency,n_random,stride,flow",
                         flow_cases(QUICK, credit=(3, 5, 8), full=FULL))
def test_configs(n, block, bits, latency, n_random, stride, flow):
    p = FormatParams.preset("v1", n=n, block=block, bits=bits, sign_seed=n + bits)
    codes, scales, zeros = planes_for(p, 200 if FULL else n_random, 1 if FULL else stride,
                                      seed=n + bits + latency)
    check(p, latency, codes, scales, zeros, seed=n + bits + latency, flow=flow)


def test_default_config():
    """Version-1 quantizer (pinned), N=128, G=64, b=3, seed 0, latency 2: round trip of the shared sets, random
    planes and the adversarial planes (all of them with HW_FULL=1)."""
    p = FormatParams.preset("v1")
    check(p, 2, *planes_for(p, 200 if FULL else 8, 1 if FULL else 6, seed=0))


def test_bf16():
    p = FormatParams.preset("v1", n=64, block=32, bits=3, dtype="bf16", sign_seed=5)
    check(p, 2, *planes_for(p, 10, 8, seed=2))


def test_no_sign_flip():
    p = FormatParams.preset("v1", n=64, block=16, bits=2, sign_seed=None)
    check(p, 1, *planes_for(p, 10, 8, seed=3))


#: (mode, scale, n, block, bits, dtype, latency, extra FormatParams fields) of the quantizer
#: modes and scale encodings; decode does not depend on scale_rule / scale_round /
#: scale_mult, which vary here to show it (the golden decode runs through
#: sim_models.quant for all of these).
MODE_QUICK = [
    ("midrise", "ue5m3", 64, 64, 2, "fp16", 1, {}),
    ("midrise", "ue5m3", 64, 32, 3, "bf16", 2, {"scale_round": "nearest"}),
    ("midrise", "ue5m3", 64, 16, 4, "fp16", 0, {"scale_round": "nearest"}),
    ("midrise", "ue5m3", 64, 8, 2, "bf16", 4, {"scale_rule": "rms"}),
    ("midrise", "ue5m3", 128, 32, 4, "bf16", 3, {}),
    ("midrise", "ue5m3", 128, 64, 2, "fp16", 7, {"scale_round": "nearest", "sign_seed": None}),
    ("midtread", "ue5m3", 64, 32, 3, "fp16", 2, {"scale_round": "nearest", "scale_mult": 300}),
    ("lloydmax", "ue5m3", 64, 64, 2, "fp16", 2, {}),
    ("lloydmax", "ue5m3", 64, 16, 3, "bf16", 1, {"scale_rule": "rms"}),
    ("lloydmax", "ue5m3", 128, 32, 4, "fp16", 3, {"scale_round": "nearest"}),
    ("lloydmax", "ue4m4", 64, 16, 4, "fp16", 0, {}),
    ("midrise", "e4m3fn", 64, 16, 3, "fp16", 2, {}),
    ("midrise", "e5m2", 64, 16, 2, "bf16", 1, {"scale_round": "nearest"}),
    ("midrise", "ue4m4", 128, 32, 3, "fp16", 2, {}),
    ("midtread", "e4m3fn", 64, 8, 4, "bf16", 2, {}),
    ("midtread", "e5m2", 128, 64, 3, "fp16", 4, {}),
    ("lloydmax", "e5m2", 64, 32, 4, "bf16", 2, {}),
    ("lloydmax", "e4m3fn", 64, 32, 2, "fp16", 6, {}),
    ("asym", "ue5m3", 64, 64, 2, "fp16", 1, {}),
    ("asym", "ue5m3", 64, 16, 3, "bf16", 2, {"scale_round": "nearest"}),
    ("asym", "ue5m3", 128, 32, 4, "fp16", 3, {}),
    ("asym", "e4m3fn", 64, 32, 4, "fp16", 0, {}),
    ("asym", "ue4m4", 64, 8, 3, "bf16", 2, {"scale_round": "nearest"}),
    ("asym", "e5m2", 128, 64, 2, "fp16", 7, {}),
]


def _mode_cases():
    return [pytest.param(*c, id=f"{c[0]}-{c[1]}-n{c[2]}-g{c[3]}-b{c[4]}-{c[5]}-l{c[6]}")
            for c in MODE_QUICK if c[0] in READ_SUPPORT["mode"] and c[1] in READ_SUPPORT["scale"]]


@pytest.mark.parametrize("mode,scale,n,block,bits,dtype,latency,extra", _mode_cases())
def test_modes(mode, scale, n, block, bits, dtype, latency, extra):
    """Quantizer modes / scale encodings vs sim_models.codec.decode: round trip of
    the shared sets, random planes (valid scale bytes of the encoding) and the
    adversarial planes (every one with HW_FULL=1)."""
    p = FormatParams(n=n, block=block, bits=bits, mode=mode, scale=scale, dtype=dtype,
                     **{"sign_seed": n + bits, **extra})
    seed = n + bits + latency + 7 * len(mode)
    check(p, latency, *planes_for(p, 100 if FULL else 8, 1 if FULL else (4 if n <= 64 else 8),
                                  seed), seed=seed)


def test_v2_default_config():
    """The version-2 default of the format study (midrise, scale rounded to nearest,
    ue5m3) at N=128, G=64, b=3, latency 2."""
    p = FormatParams(mode="midrise", scale_round="nearest")
    check(p, 2, *planes_for(p, 200 if FULL else 8, 1 if FULL else 6, seed=5))


@pytest.mark.parametrize("scale", ["e4m3fn", "e5m2"])
def test_scale_sign_bit_ignored(scale):
    """OCP FP8 scale bytes with the sign bit set (never written, refused by the golden
    model) decode like the byte with the sign bit cleared (documented RTL behaviour)."""
    p = FormatParams(n=64, block=16, bits=3, mode="midrise", scale=scale)
    codes, scales = random_planes(p, 24, 3)
    rng = np.random.default_rng(4)
    raw = scales | (rng.integers(0, 2, scales.shape) << 7).astype(np.uint8)
    assert (raw != scales).any()
    exp, run = run_dut(p, 2, codes, scales, None, 3, raw_scales=raw)
    check_run(run, exp, 12)


def test_asym_payload_layout():
    """Mode asym: i.payload = codes | scales | zeros (sim_models.wire.decoder_input,
    published as the component's input layout); the other modes have no zero plane.
    A zero point moves every lane of its block only. One word in and out with
    stream_put / stream_get."""
    p = FormatParams(n=16, block=8, bits=3, mode="asym")
    lay = wire.decoder_input(p)
    assert lay.offsets() == {"codes": {"offset": 0, "width": 48},
                             "scales": {"offset": 48, "width": 16},
                             "zeros": {"offset": 64, "width": 16}}
    assert lay.width == 80 == 8 * p.bytes_per_vector
    assert "zeros" not in wire.decoder_input(FormatParams(n=16, block=8, mode="midrise"))
    codes = np.zeros((1, p.code_bytes), np.uint8)
    scales = np.array([[0x40, 0x40]], np.uint8)
    zeros = np.array([[0, 5]], np.uint8)
    word = wire.rows_to_ints(wire.decoder_input_rows(p, codes, scales, zeros))
    assert word == [(0x4040 << 48) | (0x0500 << 64)]
    with pytest.raises(ValueError, match="zeros"):
        wire.decoder_input_rows(p, codes, scales)
    dut = make_decoder(p, 1)
    assert dut.i.payload.shape().size == lay.width
    assert [dut.i.payload.shape()[f.name].offset for f in lay.fields] == [0, 48, 64]
    got = []

    async def tb(ctx):
        await stream_put(ctx, dut.i, word[0])
        got.append(await stream_get(ctx, dut.o))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    exp = wire.rows_to_ints(decoder_rows(codes, scales, p, zeros))
    assert got == exp
    lanes = wire.int_to_lanes(exp[0], 16)
    assert (lanes != 0).any()


@pytest.mark.parametrize("regs,latency,flow", flow_cases(
    [((), 0), (("abs",), 2), (("abs", "prep", "shift"), 1), (("shift", "abs"), 3),
     (("prep", "shift"), 2), (("lead", "round"), 2), (FLOAT_CUTS.names, 6)],
    credit=(0, 6), full=FULL))
def test_float_regs(regs, latency, flow):
    """Optional float-conversion registers: same outputs, latency + 2 + len(regs) cycles
    (checked exactly by run_dut), stalls handled."""
    p = FormatParams(n=64, block=16, bits=3, mode="midrise", sign_seed=9)
    codes, scales, zeros = planes_for(p, 6, 10, seed=len(regs) + latency)
    check(p, latency, codes, scales, zeros, seed=latency, float_regs=regs, flow=flow)


@pytest.mark.parametrize("n,block,latency,scale", [(64, 16, 6, "ue5m3"), (64, 32, 2, "ue5m3"),
                                                   (64, 8, 5, "e4m3fn"), (32, 16, 4, "ue4m4")])
def test_split_align(n, block, latency, scale):
    """The block alignment as two FWHT steps (high bits of d, then the low ones), every
    float register: same outputs, the same latency (hw/ifwht.py)."""
    p = FormatParams(n=n, block=block, bits=3, mode="midrise", scale=scale, sign_seed=5)
    codes, scales, zeros = planes_for(p, 6, 10, seed=latency)
    check(p, latency, codes, scales, zeros, seed=latency, float_regs=FLOAT_CUTS.names,
          split_align=True)


@pytest.mark.parametrize("name", ["dec_v2_n64_g32_b3_l9_p0_c0", "dec_v2_n16_g8_b3_l7_p0"])
def test_timing_profile(name):
    """A decoder as docs/SYNTH.md places and routes it (rtl_gen.config name: every float
    and dequant cut, the split alignment with a register after every step, credit flow;
    the alignment's and FloatPrep's register copies): bit-exact, the manifest latency;
    the N=16 one without credits (stalls)."""
    from rtl_gen.config import RTLConfig
    c = RTLConfig.parse(name)
    p, o = c.params, c.opts
    assert o.float_regs == FLOAT_CUTS.names and o.split_align
    assert o.credit_extra == 0      # run_dut's credit flow: the minimum credits
    codes, scales, zeros = planes_for(p, 6, 10, seed=o.fwht_regs)
    check(p, o.fwht_regs, codes, scales, zeros, seed=3, float_regs=o.float_regs,
          split_align=o.split_align, flow=o.flow, lanes=o.lanes, dq_regs=o.dq_regs)


@pytest.mark.parametrize("regs,err", [("abs", TypeError), ((1,), TypeError),
                                      (("abs", "abs"), ValueError), (("mult",), ValueError)])
def test_bad_float_regs(regs, err):
    with pytest.raises(err, match="float_regs"):
        make_decoder(FormatParams(), 2, regs)
    with pytest.raises(err, match="dq_regs"):
        make_decoder(FormatParams(), 2, dq_regs=regs)


@pytest.mark.parametrize("mode,scale,bits,block,lanes,flow", [
    ("midrise", "ue5m3", 3, 16, None, "stall"), ("midtread", "e4m3fn", 2, 8, None, "credit"),
    ("lloydmax", "ue5m3", 4, 16, None, "stall"), ("asym", "ue4m4", 3, 8, None, "credit"),
    ("midrise", "ue5m3", 3, 16, 32, "stall"), ("asym", "ue5m3", 4, 32, 32, "credit")])
def test_dq_table_reg(mode, scale, bits, block, lanes, flow):
    """The dequant's ``table`` register (the per-block product tables, codes, shifts and
    ef_min registered before the lanes' code select): same outputs for every mode (the
    zero point included) and both flows, one cycle more (checked exactly by run_dut)."""
    p = FormatParams(n=64, block=block, bits=bits, mode=mode, scale=scale, sign_seed=4)
    codes, scales, zeros = planes_for(p, 6, 10, seed=bits)
    check(p, 2, codes, scales, zeros, seed=bits, dq_regs=DQ_CUTS.names, lanes=lanes,
          flow=flow)


def _full_cases():
    cases = []
    for n in (64, 128, 256):
        for b in (2, 3, 4):
            for lat in sorted({0, 1, 2, n.bit_length() - 1}):
                cases.append((n, 64, b, lat))
    cases += [(128, 32, 3, 3), (128, 8, 2, 4), (256, 16, 3, 5), (256, 256, 4, 2)]
    return cases


@pytest.mark.skipif(not FULL, reason="set HW_FULL=1 for the full cross product (slow)")
@pytest.mark.parametrize("n,block,bits,latency", _full_cases())
def test_full_cross_product(n, block, bits, latency):
    p = FormatParams.preset("v1", n=n, block=block, bits=bits)
    check(p, latency, *planes_for(p, 100 if n <= 128 else 30, 1, seed=3 * n + bits + latency),
          seed=latency)


@pytest.mark.parametrize("mode", ["midtread", "midrise", "lloydmax", "asym", "v1"])
def test_adversarial_coverage(mode):
    """The adversarial planes reach what they claim (per golden decode): saturation,
    subnormal outputs, the full alignment span of the encoding, exact rounding ties
    to both even and odd neighbours, exact zeros signed by D alone, and ("v1" preset)
    scale 0x00 under negative levels."""
    for n, b in ((64, 2), (128, 3), (256, 4)):
        p = (FormatParams.preset("v1", n=n, block=64, bits=b) if mode == "v1" else
             FormatParams(n=n, block=64, bits=b, mode=mode))
        codes, scales, zeros = _three(p, adversarial_planes(p, 1))
        out = round_to_input_type(decode_float(codes, scales, p,
                                               zeros if mode == "asym" else None), p)
        mask = sign_mask(n, p.sign_seed)
        assert ((out & 0x7FFF) == 0x7BFF).any()
        assert (((out & 0x7C00) == 0) & ((out & 0x3FF) != 0)).any()
        zero = (out & 0x7FFF) == 0                 # an exact zero is +0 before D
        assert ((out[zero] >> 15) == np.broadcast_to(mask, out.shape)[zero]).all()
        if mode == "v1":                           # scale 0x00 under negative levels
            assert (zero & (mask == 0)).any() and (zero & (mask == 1)).any()
        sb = scale_bytes(p)
        if p.n_blocks > 1:
            assert ((scales.min(axis=1) <= max(1, sb[0])) & (scales.max(axis=1) == sb[-1])).any()
        assert set(np.unique(scales)) <= set(sb.tolist())
        tie, odd = tie_lanes(codes, scales, p, zeros)
        if p.n_blocks == 1 and b == 2 and p.mode in ("midtread", "midrise"):
            continue                      # |S| < 2^11 or S even: no fp16 tie exists
        assert (tie & odd).sum() >= 5 and (tie & ~odd).sum() >= 5, (tie & odd).sum()


@pytest.mark.parametrize("scale", ["e4m3fn", "e5m2", "ue4m4"])
def test_adversarial_coverage_encodings(scale):
    """Per scale encoding: subnormal outputs, the full exponent span (smallest next
    to largest byte), ties both ways, and saturation where the encoding reaches
    it (e5m2: 57344 * 3/N > 65504 is possible; e4m3fn / ue4m4 top out below)."""
    for mode in ("midrise", "lloydmax"):
        for n, b in ((64, 2), (128, 3), (256, 4)):
            p = FormatParams(n=n, block=64 if n > 64 else 16, bits=b, mode=mode, scale=scale)
            codes, scales = adversarial_planes(p, 1)
            out = round_to_input_type(decode_float(codes, scales, p), p)
            sb = scale_bytes(p)
            assert (((out & 0x7C00) == 0) & ((out & 0x3FF) != 0)).any()
            assert ((scales.min(axis=1) == sb[0]) & (scales.max(axis=1) == sb[-1])).any()
            assert ((out & 0x7FFF) == 0x7BFF).any() == (scale == "e5m2")
            tie, odd = tie_lanes(codes, scales, p)
            assert (tie & odd).sum() >= 5 and (tie & ~odd).sum() >= 5


# ---- the float conversion on its own ---------------------------------------------------

@pytest.mark.parametrize("dtype,w,log2n,prep_regs", [
    ("fp16", 28, 7, False), ("fp16", 28, 7, True), ("bf16", 27, 7, True), ("fp16", 27, 6, True)])
def test_tofloat_alt_exp(dtype, w, log2n, prep_regs):
    """FloatPrep with ``alt_exp`` (the fold window's lanes at unit 2^s) -> FloatPack vs
    round_to_input_type of each lane at its own exponent (ef_alt where alt, else ef_min):
    random ef_min, ef_alt and alt bits per vector, combinational or with every FloatPrep
    and FloatPack register (a vector every cycle, ``en`` low a quarter of the time: an alt
    bit or per-vector value that does not ride with its lane fails)."""
    p = FormatParams(n=1 << log2n, block=1 << log2n, dtype=dtype)
    lanes = 32
    consts = FloatConsts(w, p.in_format, (1, 31), -10 - log2n)
    m = Module()
    m.submodules.prep = prep = FloatPrep(lanes, w, 5, consts, abs_reg=prep_regs,
                                         lead_reg=prep_regs, alt_exp=True)
    m.submodules.pack = pack = FloatPack(lanes, consts, shift_reg=prep_regs,
                                         round_reg=prep_regs)
    if prep_regs:
        m.d.comb += prep.en.eq(pack.en)
    rng = np.random.default_rng(w + log2n + prep_regs)

    def vectors():
        for _ in range(300 if FULL else 120):
            ef, ea = (int(x) for x in rng.integers(1, 32, 2))
            alt = rng.integers(0, 2, lanes)
            yield (_tofloat_values(rng, w, lanes),
                   {"ef_min": ef, "ef_alt": ea, "alt": sum(int(a) << i for i, a in enumerate(alt))},
                   np.where(alt == 1, ea, ef))

    fails, checked = _drive_tofloat(m, prep, pack, p, w, log2n, vectors, 4 if prep_regs else 0,
                                    rng)
    assert not fails, fails
    assert checked >= 60


def _drive_tofloat(m, prep, pack, p, w: int, log2n: int, vectors, depth: int, rng):
    """Simulate FloatPrep -> FloatPack (``m`` holds both; PREP_PORTS connected here) on
    ``vectors()``: (lanes S, {FloatPrep port: value}, per-lane exponent field ef) each, the
    sign flip D a random mask; each output lane against round_to_input_type of
    ``(-1)^D S 2^(ef - 10 - log2 N)``. ``depth`` registers (FloatPack's ``en`` low a quarter
    of the cycles), or 0: combinational. Returns (failures, vectors checked)."""
    lanes = len(prep.y)
    m.d.comb += [getattr(pack, k).eq(getattr(prep, k)) for k in PREP_PORTS]
    mask = int(rng.integers(0, 1 << (lanes - 2))) << 1
    neg = np.array([(mask >> i) & 1 for i in range(lanes)]) == 1
    fails, checked = [], [0]

    def check(allbits, want):
        s, efs, exp = want
        checked[0] += 1
        for i in range(lanes):
            got = (allbits >> (16 * i)) & 0xFFFF
            if got != exp[i] and len(fails) < 5:
                fails.append(f"S={s[i]} ef={efs[i]}: got {got:#06x} exp {int(exp[i]):#06x}")

    async def tb(ctx):
        ctx.set(prep.mask, mask)
        pipe = [None] * max(depth, 1)
        for s, ports, efs in vectors():
            for k, v in ports.items():
                ctx.set(getattr(prep, k), v)
            ctx.set(prep.y.as_value(),      # all lanes at once: one settle
                    sum((int(x) & ((1 << w) - 1)) << (w * i) for i, x in enumerate(s)))
            v = np.array([float(x) for x in s]) * 2.0 ** (np.asarray(efs) - 10 - log2n)
            want = (s, efs, round_to_input_type(np.where(neg, -v, v), p))
            if not depth:
                await ctx.delay(1e-9)
                check(ctx.get(pack.bits.as_value()), want)
                continue
            en = int(rng.random() < 0.75)
            ctx.set(pack.en, en)
            await ctx.tick()
            if en:
                pipe = [want] + pipe[:-1]
            if pipe[depth - 1] is not None:
                check(ctx.get(pack.bits.as_value()), pipe[depth - 1])

    sim = Simulator(m)
    if depth:
        sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return fails, checked[0]


def _tofloat_values(rng, w: int, count: int) -> np.ndarray:
    """Signed integers < 2^(w-1) in magnitude, biased towards rounding corner cases."""
    vals = []
    for _ in range(count):
        k = int(rng.integers(0, 6))
        top = int(rng.integers(0, w - 1))
        if k == 0:
            v = int(rng.integers(0, 1 << top)) if top else 0
        elif k == 1:                          # exact tie: ...1 1000...0
            lo = int(rng.integers(0, max(top - 11, 0) + 1))
            v = ((int(rng.integers(0, 1 << 12)) << 1 | 1) << lo) if lo else 1 << top
        elif k == 2:                          # tie +- 1 unit
            lo = int(rng.integers(1, max(top - 10, 1) + 1))
            v = (int(rng.integers(0, 1 << 11)) << 1 | 1) << lo
            v += int(rng.choice([-1, 1]))
        elif k == 3:                          # all ones below the top (rounding carry)
            v = (1 << top) - 1
        elif k == 4:
            v = 1 << top
        else:
            v = 0
        v = min(abs(v), (1 << (w - 1)) - 1)
        vals.append(-v if rng.random() < 0.5 else v)
    return np.array(vals, dtype=object)


@pytest.mark.parametrize("abs_reg,lead_reg,lanes", [
    (True, True, 64), (True, False, 64), (False, True, 64), (True, True, 16), (True, True, 8)])
def test_float_prep_copies(abs_reg, lead_reg, lanes):
    """FloatPrep's per-vector K, B, K + B in the last register in one copy per
    REPLICA_SELECT_LANES = 4 lanes, with both registers loaded from the abs register's copies
    (one per REPLICA_GROUP_LANES lanes; the fanout form is hw.pipeline.replicas', tested
    in test_hw_units); the mask of the positions above K in one copy per 4 lanes at abs;
    each copy read as often as the others of its register, give or take one; exactness is
    the decoder's register tests'."""
    from amaranth.back import rtlil
    from hw.pipeline import replica_count
    assert REPLICA_SELECT_LANES == 4
    p = FormatParams(n=256, block=256)
    consts = FloatConsts(46, p.in_format, (1, 31), -18)
    assert consts.k_var > 0
    prep = FloatPrep(lanes, 46, 5, consts, abs_reg=abs_reg, lead_reg=lead_reg)
    text = rtlil.convert(prep, ports=None)
    wires = set(re.findall(r"wire width \d+ (?:signed )?\\((?:abs|lead)_[a-z]+_r\d+)\n", text))
    leaf, group = replica_count(lanes, REPLICA_SELECT_LANES), replica_count(lanes)
    want = set()
    for k in ("kc", "b", "kb"):
        if lead_reg:
            want |= {f"lead_{k}_r{j}" for j in range(leaf)}
        if abs_reg:
            want |= {f"abs_{k}_r{j}" for j in range(group if lead_reg else leaf)}
    if abs_reg:
        want |= {f"abs_above_r{j}" for j in range(leaf)}
    assert wires == want
    for fam in {w.rsplit("_r", 1)[0] for w in wires}:   # every lane group reads its own copy
        reads = [_copy_reads(text, w) for w in wires if w.rsplit("_r", 1)[0] == fam]
        assert max(reads) - min(reads) <= 1, (fam, reads)


@pytest.mark.parametrize("dtype,w,log2n,low_bits", [
    ("fp16", 46, 8, None), ("fp16", 14, 6, None), ("bf16", 44, 7, None),
    ("fp16", 46, 8, 0), ("fp16", 46, 8, 1), ("fp16", 46, 8, 2), ("fp16", 46, 8, 3),
    ("fp16", 45, 7, 2), ("fp16", 44, 6, 2), ("fp16", 14, 6, 9), ("bf16", 44, 7, 2),
    ("bf16", 44, 7, 4)])
def test_tofloat_unit(dtype, w, log2n, low_bits):
    """FloatPrep -> FloatPack vs round_to_input_type, every ef_min: combinational
    (``low_bits`` None), or with FloatPack's ``shift`` and ``round`` registers and the
    shifter split ``shift_low_bits`` = low_bits (9: clamped to Lp's width, the whole
    shift after the register), a new vector every cycle and ``en`` low in a quarter of
    the cycles (a value that bypasses a register, or moves while ``en`` is low, fails)."""
    p = FormatParams(n=1 << log2n, block=1 << log2n, dtype=dtype)
    lanes = 64
    efs = range(1, 32)
    consts = FloatConsts(w, p.in_format, (1, 31), -10 - log2n)
    m = Module()
    m.submodules.prep = prep = FloatPrep(lanes, w, 5, consts)
    regs = low_bits is not None
    m.submodules.pack = pack = FloatPack(lanes, consts, shift_reg=regs, round_reg=regs,
                                         shift_low_bits=low_bits)
    if regs:
        assert pack.shift_low_bits == min(low_bits, consts.lp_width)
    rng = np.random.default_rng(w + log2n)

    def vectors():
        for ef in efs:
            for _ in range(8 if FULL else 2):
                yield _tofloat_values(rng, w, lanes), {"ef_min": ef}, np.full(lanes, ef)

    fails, checked = _drive_tofloat(m, prep, pack, p, w, log2n, vectors, 2 if regs else 0, rng)
    assert not fails, fails
    assert checked >= len(efs)


def test_float_pack_shift_low_bits_negative():
    """FloatPack rejects a negative shift_low_bits, naming it."""
    consts = FloatConsts(46, FormatParams(n=256, block=256).in_format, (1, 31), -18)
    with pytest.raises(ValueError, match="shift_low_bits"):
        FloatPack(4, consts, shift_reg=True, shift_low_bits=-1)


@pytest.mark.parametrize("w,split", [(1, None), (2, None), (3, None), (3, 1), (5, None),
                                     (5, 2), (8, 1), (8, 2), (9, None), (9, 3), (13, 1),
                                     (13, 2), (13, 3)])
def test_leading_one_exhaustive(w, split):
    """hw.scale_select.leading_one (log-depth tree): position of the highest set bit and
    the any bit, for every value of a w-bit input (widths around powers of two); with
    ``split``, built in two parts (levels 1..split, then the rest from those nodes)."""
    from amaranth.hdl import Signal
    from hw.scale_select import leading_one
    m = Module()
    a = Signal(w)
    if split is None:
        pos, any_ = leading_one(m, a, "t")
    else:
        part = leading_one(m, a, "t", levels=split)
        assert part[0] == split and len(part[1]) << split == 1 << (w - 1).bit_length()
        pos, any_ = leading_one(m, a, "t", start=part)
    assert len(pos) == max(1, (w - 1).bit_length())
    ps, an = Signal(len(pos)), Signal()
    m.d.comb += [ps.eq(pos), an.eq(any_)]
    bad = []

    async def tb(ctx):
        for v in range(1 << w):
            ctx.set(a, v)
            await ctx.delay(1e-9)
            if ctx.get(ps) != max(v.bit_length() - 1, 0) or ctx.get(an) != (v != 0):
                bad.append(v)

    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()
    assert not bad, bad[:5]


@pytest.mark.parametrize("levels", [-1, 5])
def test_leading_one_bad_levels(levels):
    from amaranth.hdl import Signal
    from hw.scale_select import leading_one
    with pytest.raises(ValueError, match="levels"):
        leading_one(Module(), Signal(9), "t", levels=levels)


# ---- structure and error paths ------------------------------------------------------------

def test_widths():
    """Exact alignment width: w_p + log2 N + 30 (46 bits at b=4, N=256)."""
    p = FormatParams.preset("v1", n=256, block=64, bits=4)
    dut = make_decoder(p, 2)
    assert out_width(256, 64, 8) == 8 + 8 + MAX_ALIGN == 46
    assert dut.i.payload.shape().size == 256 * 4 + 32 and dut.o.payload.shape().size == 256 * 16
    assert level_table(p).levels == (0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1)
    assert sign_mask_int(256, 0) != 0


@pytest.mark.parametrize("latency", [-1, 9, 99])
def test_bad_latency(latency):
    """N = 128, G = 64: 8 steps (7 butterfly stages and the alignment), so 0 .. 8."""
    with pytest.raises(ValueError, match="fwht_regs"):
        make_decoder(FormatParams(), latency)


def test_latency_up_to_the_steps(monkeypatch):
    """A register after every step of the read path's FWHT (the alignment as one or two
    steps, two beats): latency = S places one per step, S + 1 is refused naming S; the
    payloads match the golden model with L = S (split alignment, two beats)."""
    from hw.decoder import fwht_steps
    p = FormatParams(n=16, block=8, bits=3, sign_seed=1)
    # split: the swap's select, the high and the low shift (one beat, N/G = 2); two beats
    # align every lane: no swap step
    assert fwht_steps(p, 16) == 5 and fwht_steps(p, 16, True) == 7 and fwht_steps(p, 8, True) == 5
    assert fwht_steps(FormatParams(n=16, block=16), 16) == 4          # no alignment
    for lanes, split in ((16, False), (16, True), (8, True)):
        s = fwht_steps(p, lanes, split)
        assert make_decoder(p, s, split_align=split, lanes=lanes).latency == s
        with pytest.raises(ValueError, match=f"S={s}"):
            make_decoder(p, s + 1, split_align=split, lanes=lanes)
    from rtl_gen.config import RTLConfig        # config names: pK splits the alignment
    assert RTLConfig.parse("dec_v2_n128_g64_b3_l8_p0_c0_w64").fwht_regs == 8
    assert RTLConfig.parse("dec_v2_n64_g32_b3_l9_p0_c0").fwht_regs == 9   # + the swap step
    for bad, top in (("dec_v2_n64_g32_b3_l8_c0", 7), ("dec_v2_n64_g32_b3_l10_p0", 9),
                     ("enc_v2_n64_g64_b3_l7", 6)):
        with pytest.raises(ValueError, match=f"0..{top}, got"):
            RTLConfig.parse(bad)
    codes, scales = random_planes(p, 24, 3)
    check(p, 7, codes, scales, None, seed=6, float_regs=FLOAT_CUTS.default, split_align=True)
    check(p, 5, codes, scales, None, seed=5, float_regs=FLOAT_CUTS.default, split_align=True,
          lanes=8)


@pytest.mark.parametrize("latency", ["2", 2.0, True, None])
def test_bad_latency_type(latency):
    with pytest.raises(TypeError, match="fwht_regs"):
        make_decoder(FormatParams(), latency)


def test_bad_params_type():
    with pytest.raises(TypeError, match="params"):
        make_decoder({"n": 128}, 2)


def _option_cases():
    from sim_models.params import QUANT_MODES, SCALE_ENCODINGS
    return [("mode", v) for v in QUANT_MODES] + [("scale", v) for v in SCALE_ENCODINGS]


@pytest.mark.parametrize("field,value", _option_cases())
def test_format_options(field, value):
    """Every mode / scale encoding of the golden model is either built (in
    READ_SUPPORT) or refused with a ValueError naming the field."""
    p = FormatParams(**{field: value})
    if value in READ_SUPPORT[field]:
        dut = make_decoder(p, 2)
        assert len(dut.i.payload.as_value()) == wire.decoder_input(p).width
    else:
        with pytest.raises(ValueError, match=field):
            make_decoder(p, 2)
        with pytest.raises(ValueError, match=field):
            level_table(p)


@pytest.mark.parametrize("field,value,narrow", [("mode", "midrise", ("midtread",)),
                                                 ("scale", "ue5m3", ("e4m3fn",))])
def test_refusal_names_field(monkeypatch, field, value, narrow):
    """The refusal path itself: with READ_SUPPORT narrowed, the option is refused."""
    monkeypatch.setitem(READ_SUPPORT, field, narrow)
    with pytest.raises(ValueError, match=f"{field}="):
        make_decoder(FormatParams(**{field: value}), 2)


@pytest.mark.parametrize("kw", [{"scale_rule": "rms"}, {"scale_rule": "absmean"},
                                {"scale_round": "nearest"}, {"scale_mult": 300},
                                {"mant_bits": 8}])
def test_decode_independent_options(kw):
    """Encoder-only fields do not change the read path: same netlist inputs/outputs."""
    a = make_decoder(FormatParams(n=16, block=8, **kw), 1)
    b = make_decoder(FormatParams(n=16, block=8), 1)
    assert a.table == b.table and a.scale_fmt == b.scale_fmt
    assert a.i.payload.shape() == b.i.payload.shape()


def test_latency_property():
    for lat in range(8):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnusedElaboratable)
            dut = make_decoder(FormatParams(), lat)
            # dequant register, the default float register ("prep"), output register
            assert dut.latency_cycles == lat + 2 + len(FLOAT_CUTS.default) == lat + 3
            assert (make_decoder(FormatParams(), lat, FLOAT_CUTS.names).latency_cycles
                    == lat + 2 + len(FLOAT_CUTS.names) == lat + 7)
            del dut
            gc.collect()


@pytest.mark.parametrize("regs", [(), ("prep",), ("abs", "shift"), FLOAT_CUTS.names])
def test_latency_breakdown(regs):
    """KVDecoder.latency_breakdown: one entry per register section, summing to
    latency_cycles; the default placement gives the keys rtl_gen's manifest records."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        dut = make_decoder(FormatParams(n=16, block=8), 3, regs)
    bd = dut.latency_breakdown
    assert sum(bd.values()) == dut.latency_cycles == 3 + 2 + len(regs)
    assert bd["fwht"] == 3 and bd["dequant_reg"] == bd["output_reg"] == 1
    assert [k for k in bd if k.startswith("float_")] == [f"float_{r}_reg" for r in regs]
    if regs == FLOAT_CUTS.default:
        assert bd == {"dequant_reg": 1, "fwht": 3, "float_prep_reg": 1, "output_reg": 1}


# ---- rtl_gen: Verilog, manifest, CLI, lint ------------------------------------------------

def _verilog_ports(text: str, top: str) -> dict:
    import re
    body = text[text.index(f"module {top}("):]
    body = body[:body.index("endmodule")]
    return {name: (d, int(msb) + 1 if msb else 1) for d, msb, name in re.findall(
        r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+)\s*;", body, re.M)}


@pytest.fixture(scope="module")
def dec_gen(tmp_path_factory):
    import rtl_gen
    out = tmp_path_factory.mktemp("rtl_dec")
    p = FormatParams(n=16, block=8, bits=3)
    return out, rtl_gen.generate("decoder", p, out, DecoderOptions(fwht_regs=2)), p


def test_rtl_gen_decoder(dec_gen):
    import json
    out, man, p = dec_gen
    v = (out / "kv_decoder.v").read_text()
    ports = _verilog_ports(v, "kv_decoder")
    assert ports == {k: (d["dir"], d["width"]) for k, d in man["ports"].items()}
    assert ports["i__payload"] == ("input", 16 * 3 + 16)
    assert ports["o__payload"] == ("output", 16 * 16)
    assert json.loads((out / "manifest.json").read_text()) == man
    assert man["top"] == "kv_decoder" and man["kind"] == "decoder"
    assert man["latency_cycles"] == 5 and man["params"] == p.to_dict()
    assert man["fwht_steps"] == ["stage0", "stage1", "stage2", "align", "stage3"]
    assert man["fwht_register_after_steps"] == [3, 5]
    assert man["i_payload"]["fields"]["scales"] == {"offset": 48, "width": 16}
    assert "/work/" not in v


def test_rtl_gen_decoder_lint(dec_gen):
    """Lint-clean with rtl_gen's waivers; without them only the waived generator
    artifacts fire and no port is unused."""
    import re
    import rtl_gen
    out, man, _ = dec_gen
    if rtl_gen.find_tool("verilator") is None:
        pytest.skip("verilator not installed")
    r = rtl_gen.lint(out / man["verilog"], man["top"])
    assert r.returncode == 0 and "%Warning" not in r.stdout + r.stderr, r.stdout + r.stderr
    r = rtl_gen.lint(out / man["verilog"], man["top"], waivers=False)
    msgs = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("%Warning")]
    rules = {re.match(r"%Warning-(\w+)", ln).group(1) for ln in msgs}
    assert rules <= {"UNUSEDSIGNAL", "WIDTHEXPAND", "WIDTHTRUNC", "PROCASSINIT", "DECLFILENAME"}
    for ln in msgs:
        if "UNUSEDSIGNAL" in ln:
            assert re.search(r"'([^']+)'", ln).group(1) not in man["ports"], ln
        if "WIDTHTRUNC" in ln:
            assert "Logical operator LOGNOT expects 1 bit" in ln, ln


def test_rtl_gen_cli_modules(tmp_path, capsys):
    import json
    from rtl_gen.__main__ import main as cli_main
    args = ["--n", "16", "--block", "8", "--bits", "2", "--fwht-regs", "1"]
    assert cli_main(args + ["--module", "decoder", "--out", str(tmp_path / "d")]) == 0
    man = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert man["top"] == "kv_decoder" and man["latency_cycles"] == 4
    assert cli_main(args + ["--module", "both", "--dec-top", "dec16", "--out",
                            str(tmp_path / "b")]) == 0
    both = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert both["top"] == "kv_encoder" and set(both["modules"]) == {"kv_encoder", "dec16"}
    for name in ("kv_encoder", "dec16"):
        assert (tmp_path / "b" / f"{name}.v").exists()
        assert json.loads((tmp_path / "b" / f"{name}.manifest.json").read_text()) \
            == both["modules"][name]
    with pytest.raises(SystemExit):
        cli_main(["--n", "16", "--block", "32", "--module", "decoder", "--out",
                  str(tmp_path / "x")])
    assert "block" in capsys.readouterr().err


def test_zero_scale_block_exact_zero():
    """A zero-scale block (byte 0x00, never written by the encoder) next to a nonzero
    block, vectors with an exact-zero output lane (the golden float64 FWHT of a negative
    level times 0.0 once gave -0.0 there and the RTL +0.0): the format's exact zero is +0
    before D, and the RTL gives it (rt_v2_n64_g32_b2_l6's coverage planes found it)."""
    p = FormatParams(n=64, block=32, bits=2)
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 256, size=(400, p.code_bytes), dtype=np.uint8)
    scales = np.tile(np.array([[0, 1]], dtype=np.uint8), (400, 1))
    x = decode_float(codes, scales, p)
    zero = x == 0
    pre = np.where(sign_mask(p.n, p.sign_seed)[None, :] == 1, -x, x)
    assert not np.signbit(pre[zero]).any()                  # +0 before D, -0 where D flips
    hit = zero.any(axis=1)
    assert hit.sum() >= 2
    check(p, 6, codes[hit], scales[hit], free_run_first=2)


# ---- block alignment: the block swap (hw/ifwht.py) ---------------------------------------------

def _fwht_run(fw, vectors):
    """Drive (p lanes, d per block) pairs one per cycle with en and i_valid high; returns
    the (y, flip) of each, ``fw.latency`` cycles later."""
    n, nb = fw.n, fw.n_blocks
    out = []

    async def tb(ctx):
        ctx.set(fw.en, 1)
        ctx.set(fw.i_valid, 1)
        for k in range(len(vectors) + fw.latency):
            if k < len(vectors):
                p, d = vectors[k]
                for i in range(n):
                    ctx.set(fw.p[i], int(p[i]))
                for j in range(nb):
                    ctx.set(fw.d[j], int(d[j]))
            if k >= fw.latency:
                assert ctx.get(fw.o_valid) == 1
                out.append(([ctx.get(fw.y[i]) for i in range(n)], ctx.get(fw.flip)))
            if fw.latency:
                await ctx.tick()
            else:
                await ctx.delay(1e-6)

    sim = Simulator(fw)
    if fw.latency:
        sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return out


def _align_vectors(n, block, w, max_align, seed):
    """(p, d) pairs: equal exponents, the maximum span with the unshifted block at every
    position, zero blocks, the extreme products (worst bit growth), random."""
    rng = np.random.default_rng([seed, n, block])
    nb = n // block
    lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
    vecs = []
    for t in range(nb):
        for span in (0, 1, max_align):
            d = np.full(nb, span)
            d[t] = 0
            for p in (rng.integers(lo, hi + 1, n), np.full(n, lo), np.full(n, hi),
                      np.where(np.arange(n) % 2, lo, hi)):
                vecs.append((p, d.copy()))
            zero = rng.integers(lo, hi + 1, n)
            zero[t * block:(t + 1) * block] = 0          # the unshifted block is zero
            vecs.append((zero, d.copy()))
            zero = rng.integers(lo, hi + 1, n)
            zero[((t + 1) % nb) * block:((t + 1) % nb + 1) * block] = 0
            vecs.append((zero, d.copy()))
        d = rng.integers(0, max_align + 1, nb)          # several zeros, random others
        d[t] = 0
        vecs.append((rng.integers(lo, hi + 1, n), d))
    for _ in range(8):
        d = rng.integers(0, max_align + 1, nb)
        d[rng.integers(0, nb)] = 0
        vecs.append((rng.integers(lo, hi + 1, n), d))
    return vecs


@pytest.mark.parametrize("n,block,align,latency,split", [
    (16, 16, "swap", 0, False), (16, 8, "swap", 0, False), (16, 8, "lane", 0, False),
    (16, 8, "swap", 3, True), (16, 4, "swap", 0, False), (16, 4, "swap", 2, False),
    (32, 8, "swap", 4, True), (16, 4, "lane", 1, False), (32, 16, "swap", 5, False),
    (16, 8, "swap", 7, True), (32, 8, "swap", 8, True)])
def test_block_swap_exact(n, block, align, latency, split):
    """BlockFWHT, block swap and per-lane shifters: (-1)^flip y == H (p_i << d_(i // G))
    exactly (sim_models.fwht on int64), for N/G = 1, 2, 4 and 8: equal exponents, the ue5m3 span 30 with the
    unshifted block at every position, zero blocks, extreme and random products; split,
    a register after every step (the swap's select one step, its own register)."""
    w, ma = 8, MAX_ALIGN
    fw = BlockFWHT(n, block, signed(w), latency, max_align=ma, split_align=split, align=align)
    assert fw.align == (align if n > block else "lane")
    assert (("swap", 0) in fw.steps) == (split and fw.align == "swap")
    vecs = _align_vectors(n, block, w, ma, seed=latency)
    got = _fwht_run(fw, vecs)
    ref = _fwht_run(BlockFWHT(n, block, signed(w), 0, max_align=ma, align="lane"), vecs)
    flips = 0
    for (p, d), (y, flip), (_, flip0) in zip(vecs, got, ref):
        want = fwht(np.asarray(p, dtype=np.int64) << np.repeat(d, block).astype(np.int64))
        s = [-y[i] if flip >> i & 1 else y[i] for i in range(n)]
        assert s == want.tolist(), (p.tolist(), d.tolist())
        assert flip0 == 0
        flips |= flip
    # the swap is exercised: some vector had its unshifted block elsewhere than block 0
    assert (flips != 0) == (fw.align == "swap")


def test_default_align():
    """The swap where it is smaller (N/G = 2), per-lane shifters elsewhere; bad values refused."""
    assert [default_align(64, g) for g in (64, 32, 16, 8)] == ["lane", "swap", "lane", "lane"]
    with pytest.raises(ValueError, match="align"):
        BlockFWHT(16, 8, signed(8), 0, align="pair")


def _edge_planes(p: FormatParams, seed: int):
    """Decoder planes at the block alignment's corners: every block order of the
    smallest and the largest exponent field (the ue5m3 span 30 both ways), equal
    exponents, zero blocks (code level 0 or scale 0x00 where decodable), extreme codes."""
    rng = np.random.default_rng([seed, p.n, p.bits, 21])
    n, nb, g = p.n, p.n_blocks, p.block
    lo, hi = code_range(p)
    sb = scale_bytes(p)
    sb = sb[sb != 0]
    small, mid, large = int(sb[0]), int(sb[len(sb) // 2]), int(sb[-1])
    cs, ss = [], []
    for t in range(nb):
        for other in (small, mid, large):
            s = np.full(nb, other)
            s[t] = small if other != small else large
            for c in (rng.integers(lo, hi + 1, n), np.full(n, hi), np.full(n, lo)):
                cs.append(c)
                ss.append(s.copy())
            if lo < 0 <= hi:                  # a zero block (level 0 where the mode has one)
                c = rng.integers(lo, hi + 1, n)
                c[t * g:(t + 1) * g] = 0
                cs.append(c)
                ss.append(s.copy())
    if p.quantizer_preset == "v1":            # scale byte 0x00: a zero block, ef 1
        for t in range(nb):
            s = np.full(nb, large)
            s[t] = 0
            cs.append(rng.integers(lo, hi + 1, n))
            ss.append(s)
    codes = pack_plane(np.stack(cs), p)
    scales = np.stack(ss).astype(np.uint8)
    return codes, scales, np.zeros_like(scales)


def _special_vectors(n: int, block: int, seed: int) -> np.ndarray:
    """fp16 vectors (uint16) with NaN / +-inf lanes in one block and the other block(s)
    large or tiny: the encoder's flags and saturated scales next to the span."""
    rng = np.random.default_rng([seed, n, 22])
    out = []
    for special in (np.nan, np.inf, -np.inf):
        for scale in (6e4, 1e-6):
            x = rng.standard_normal(n) * scale
            x[rng.integers(0, block)] = special
            out.append(x)
            y = rng.standard_normal(n) * 1e-6
            y[n - 1 - rng.integers(0, block)] = special
            out.append(y)
    return np.stack(out).astype(np.float16).view(np.uint16)


@pytest.mark.parametrize("preset,n,block,bits,regs", [
    ("v1", 32, 16, 3, None), ("v2", 32, 16, 3, FLOAT_CUTS.names), ("v2", 64, 32, 4, None),
    ("v2", 128, 64, 3, None), ("v1", 64, 64, 2, None), ("v2", 64, 16, 3, None)])
def test_alignment_edges(preset, n, block, bits, regs):
    """The decoder against the golden model at the block alignment's corners (N/G = 1, 2,
    4): _edge_planes, and golden encodings of vectors with NaN/inf lanes (flags set)."""
    p = (FormatParams.preset("v1", n=n, block=block, bits=bits, sign_seed=n + 3)
         if preset == "v1" else FormatParams(n=n, block=block, bits=bits, mode="midrise",
                                             scale_round="nearest", sign_seed=n + 3))
    edge = _edge_planes(p, seed=bits)
    bits16 = _special_vectors(n, block, seed=bits)
    flags = encode(bits16, p).flags
    assert (flags & FLAG_NAN).any() and (flags & FLAG_INF).any()
    enc = _three(p, encoded_planes(bits16, p))
    codes, scales, zeros = (np.concatenate([a, b]) for a, b in zip(edge, enc))
    check(p, 2, codes, scales, zeros, seed=n + bits,
          **({} if regs is None else {"float_regs": regs}))


# ---- two beats per vector (lanes = N/2) ---------------------------------------------

#: (preset, n, block, bits, latency, mode, float_regs, split_align, n_random, adv stride)
LANES_CASES = [
    ("v2", 16, 8, 3, 2, None, None, False, 20, 4),
    ("v1", 32, 8, 4, 3, None, None, False, 16, 4),        # two blocks per beat
    ("v2", 64, 32, 2, 0, "asym", None, False, 12, 5),       # zero points per beat
    ("v2", 128, 64, 3, 6, None, FLOAT_CUTS.names, False, 6, 12),    # the synthesised profile
    ("v2", 32, 16, 3, 4, "lloydmax", ("lead",), True, 12, 5),      # split alignment
]


@pytest.mark.parametrize("preset,n,block,bits,latency,mode,float_regs,split,n_random,stride,flow",
                         flow_cases(LANES_CASES, credit=(0, 2, 3), full=FULL))
def test_two_beats(preset, n, block, bits, latency, mode, float_regs, split, n_random, stride,
                   flow):
    """lanes = N/2: each vector as two beats (ef_min over all blocks, every beat lane
    aligned to it, the last butterfly stage across the beats, D per beat, the lanes
    joined): the golden model's bits for round-trip, random and adversarial planes, one
    vector every two cycles, latency + 4 cycles, in both flow controls."""
    kw = {"mode": mode} if mode else {}
    p = FormatParams.preset(preset, n=n, block=block, bits=bits, sign_seed=n + bits, **kw)
    codes, scales, zeros = planes_for(p, 200 if FULL else n_random, 1 if FULL else stride,
                                      seed=n + latency)
    profile = float_regs == FLOAT_CUTS.names      # the synthesised profile: every cut
    check(p, latency, codes, scales, zeros, seed=n + latency, flow=flow, lanes=n // 2,
          float_regs=float_regs, split_align=split, free_run_first=8,
          dq_regs=DQ_CUTS.names if profile else DQ_CUTS.default)


@pytest.mark.parametrize("kw,exc,word", [
    ({"lanes": 4}, ValueError, "lanes"),
    ({"lanes": 8.0}, TypeError, "lanes"),
    ({"lanes": 8, "fwht_regs": 5}, ValueError, r"fwht_regs .*S=4"),
])
def test_bad_lanes(kw, exc, word):
    kw = {"fwht_regs": 1, **kw}
    with pytest.raises(exc, match=word):
        make_decoder(FormatParams(n=16, block=8), **kw)
    with pytest.raises(ValueError, match="multiple of the block"):
        make_decoder(FormatParams(n=16, block=16), lanes=8)


def _copy_reads(text: str, wire: str) -> int:
    """References to RTLIL wire ``wire`` in ``text``, its declaration included."""
    return len(re.findall(rf"\\{wire}(?![\w$])", text))


@pytest.mark.parametrize("n,block,lanes,split,latency,t_copies,d_copies", [
    # registers r0 .. r(S-1) (0: no register after that step); d: copies per shifted block
    (64, 32, None, True, 9, [1, 1, 1, 4, 16, 4, 4, 4, 4], [1, 1, 1, 1, 2, 8, 8, 0, 0]),
    # registers after steps 1, 2, 4, 5, 7, 8: align1 reads r5's copies
    (64, 32, None, True, 6, [0, 1, 4, 0, 16, 4, 0, 4, 4], [0, 1, 1, 0, 2, 8, 0, 0, 0]),
    (64, 32, None, False, 7, [1, 1, 1, 4, 16, 4, 4], [1, 1, 1, 2, 8, 0, 0]),
    (128, 64, 64, True, 8, [0] * 8, [1, 1, 1, 1, 4, 16, 16, 0]),
    (16, 8, None, True, 7, [1, 1, 4, 1, 1, 1, 1], [1, 1, 1, 2, 2, 0, 0])])
def test_align_copies(n, block, lanes, split, latency, t_copies, d_copies):
    """The swap index t and the shift amounts d in register copies: single, then one per
    REPLICA_GROUP_LANES lanes from the register before the first alignment step on (t to
    the output) and at the register before one whose next step reads them, and one per
    REPLICA_SELECT_LANES = 4 lanes at a register whose next step reads them (t: the block
    swap; d: an alignment step), each kept apart (``keep``) and read as often as the
    others of its register, give or take one (every lane group reads its own copy, every
    copy loads from its own upstream copy); exactness is test_block_swap_exact's."""
    from amaranth.back import rtlil
    assert REPLICA_SELECT_LANES == 4
    steps = steps_of(lanes or n, block, split, aligned=True, swap=t_copies[1] > 0 and split)
    fw = BlockFWHT(n, block, signed(8), latency, split_align=split, lanes=lanes)
    assert fw.steps == steps and len(steps) == len(t_copies) == len(d_copies)
    text = rtlil.convert(fw, ports=None)
    wires = set(re.findall(r"wire width \d+ (?:signed )?\\(r\d+_[td]\d*_r\d+)", text))
    for idx in range(len(fw.steps)):
        t = sorted(w for w in wires if w.startswith(f"r{idx}_t_r"))
        assert len(t) == t_copies[idx], (idx, t)
        for k in range(fw.n_blocks):
            d = sorted(w for w in wires if w.startswith(f"r{idx}_d{k}_r"))
            shifted = k > 0 or fw.align != "swap"
            assert len(d) == d_copies[idx] * shifted, (idx, k, d)
            for family in (t, d):       # one read more where a copy also loads one of
                reads = [_copy_reads(text, w) for w in family]  # the next register's fewer
                assert max(reads, default=0) - min(reads, default=0) <= 1, (idx, reads)
    assert re.search(r"attribute \\keep 1\s+wire width \d+ \\r\d+_[td]\d*_r1\n", text)


@pytest.mark.parametrize("window,step", [(True, 1), (False, 1), (True, 2)])
@pytest.mark.parametrize("n,latency,flow,cuts", [(16, 3, "stall", False), (16, 0, "credit", True),
                                                 (32, 4, "stall", True)])
def test_fold_align(n, latency, flow, cuts, window, step):
    """Two beats of one block each with the block alignment in the fold (fold_align): bit-exact
    with the golden model on round-trip, random (every scale byte spread, so every shift
    amount) and adversarial planes, with the fold window (``fold.window``, steps 1 and 2:
    ``fold.window_step``) and without; the network has log2 W steps, the fold
    FOLD_ALIGN_CYCLES."""
    fold = FoldOptions(align=True, window=window, window_step=step)
    p = FormatParams(n=n, block=n // 2)
    assert (read_window(p, fold) is not None) == window
    codes, scales, zeros = planes_for(p, 20, 3, seed=n + latency)
    kw = dict(float_regs=FLOAT_CUTS.names, split_align=True) if cuts else {}
    check(p, latency, codes, scales, zeros, seed=latency, lanes=n // 2, fold=fold,
          flow=flow, **kw)
    s = (n // 2).bit_length() - 1
    with warnings.catch_warnings():     # probes, never elaborated
        warnings.simplefilter("ignore", UnusedElaboratable)
        assert make_decoder(p, s, lanes=n // 2, fold_align=True).latency_breakdown[
            "fold_stage"] == FOLD_ALIGN_CYCLES
        with pytest.raises(ValueError, match=f"S={s}"):
            make_decoder(p, s + 1, lanes=n // 2, fold_align=True)
        gc.collect()


@pytest.mark.parametrize("step", [1, 2])
def test_fold_window_round_to_odd_decides(step):
    """Decoder planes where the fold window's rounding to odd (not floor) decides the fp16
    result: N=128 midtread, the large block at exponent field 21 with an odd significand
    and an odd lane sum (X odd), the small one at field 1 with a few nonzero lanes (s >= w,
    so Y rounds to -1, 0 or 1); bit-exact with the golden model (the fold with its sticky
    bit dropped fails 17 of 40), at window steps 1 and 2 (``fold.window_step``)."""
    p = FormatParams(n=128, block=64, bits=3, mode="midtread")
    mb = scale_format(p).mant_bits
    rng = np.random.default_rng(7)
    codes, scales = [], []
    for _ in range(40):
        big = np.full(64, 3)
        big[rng.choice(64, int(rng.integers(0, 30)) * 2 + 1, replace=False)] = 2
        small = np.zeros(64, dtype=int)
        small[rng.choice(64, int(rng.integers(1, 16)), replace=False)] = 1
        pair = [(big, (21 << mb) | int(rng.choice([1, 3, 5, 7]))), (small, 1 << mb)]
        if rng.random() < 0.5:
            pair.reverse()
        codes.append(np.concatenate([pair[0][0], pair[1][0]]))
        scales.append([pair[0][1], pair[1][1]])
    check(p, 2, pack_plane(np.array(codes), p), np.array(scales, dtype=np.uint8), None,
          seed=1, lanes=64, fold=FoldOptions(align=True, window_step=step))


def test_fold_align_refused():
    """fold_align needs two beats of one block each; the message names fold_align."""
    for p, lanes in ((FormatParams(n=16, block=8), None), (FormatParams(n=32, block=8), 16)):
        with pytest.raises(ValueError, match="fold_align"):
            make_decoder(p, 1, lanes=lanes, fold_align=True)
    with pytest.raises(TypeError, match="fold_align"):
        make_decoder(FormatParams(n=16, block=8), 1, lanes=8, fold_align=1)
    from rtl_gen.config import RTLConfig
    c = RTLConfig.parse("dec_v2_n128_g64_b3_l6_p0_c0_w64_fa")
    assert c.name == "dec_v2_n128_g64_b3_l6_p0_c0_w64_fa" and c.opts.fold.align is True
    for bad in ("dec_v2_n128_g64_b3_l7_p0_c0_w64_fa", "enc_v2_n128_g64_b3_l6_w64_fa",
                "dec_v2_n128_g32_b3_l6_w64_fa", "dec_v2_n128_g64_b3_l6_fa"):
        with pytest.raises(ValueError, match="fold_align|0..6, got 7"):
            RTLConfig.parse(bad)
    # a round trip's latency is bounded by both modules (two beats: log2 W)
    with pytest.raises(ValueError, match="0..6, got 7"):
        RTLConfig.parse("rt_v2_n128_g64_b3_l7_w64")


def _round_odd(v: int, e: int) -> int:
    """RO(v / 2^e): floor, with bit 0 set when bits fall off (the fold window's rounding)."""
    return (v >> e) | int(v & ((1 << e) - 1) != 0)


@pytest.mark.parametrize("width,abits,step", [(5, 3, 1), (6, 2, 1), (4, 4, 1), (6, 2, 2),
                                             (7, 2, 4)])
def test_shift_right_odd_every_input(width, abits, step):
    """hw.ifwht.shift_right_odd for every signed v of ``width`` bits, every amount of
    ``abits`` bits (beyond the width too), steps 1, 2, 4, and hold 0 / 1: RO(v / 2^(step
    amount)), or v where held."""
    m = Module()
    v, amt, hold = Signal(signed(width)), Signal(abits), Signal()
    out = ifwht.shift_right_odd(m, v, amt, "ro", hold=hold, step=step)
    out_free = ifwht.shift_right_odd(m, v, amt, "rf", step=step)
    bad = []

    async def tb(ctx):
        for x in range(-(1 << width - 1), 1 << width - 1):
            for a in range(1 << abits):
                for h in (0, 1):
                    ctx.set(v, x)
                    ctx.set(amt, a)
                    ctx.set(hold, h)
                    want = x if h else _round_odd(x, a * step)
                    got = (ctx.get(out), ctx.get(out_free))
                    if got != (want, _round_odd(x, a * step)):
                        bad.append((x, a, h, got, want))

    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()
    assert not bad, bad[:5]


@pytest.mark.parametrize("window,step", [(None, 1), (1, 1), (3, 1), (1, 2), (3, 2)])
@pytest.mark.parametrize("n,latency,mode", [(8, 0, "bubble"), (8, 2, "stall"), (16, 3, "mix"),
                                            (16, 0, "mix")])
def test_fold_align_stream(n, latency, mode, window, step):
    """BlockFWHT with the alignment in the fold under stream patterns the decoder never
    makes: bubbles between a vector's two beats (``bubble``), stalls (``stall``), both with
    synchronous resets mid-stream (``mix``); garbage d on bubbles. Every output beat, its flip and side band equal H_N (p << d) of
    its pair (with a window D: rounded to odd at 2^e, e = max(d - D, 0), and the side
    band + e; with the window's step k, e = k floor(max(d - D, 0) / k)), due latency +
    FOLD_ALIGN_CYCLES - 1 and FOLD_ALIGN_CYCLES enabled cycles after the pair's second beat."""
    from amaranth.hdl import ClockDomain
    w, width, amax = n // 2, 4, 30
    dut = BlockFWHT(n, w, signed(width), latency, side_width=8, max_align=amax, align="fold",
                    lanes=w, window=window, window_step=step)
    m = Module()
    m.domains.sync = cd = ClockDomain()
    m.submodules.dut = dut
    rng = np.random.default_rng(n * 10 + latency)
    fails, seen = [], {"pairs": 0, "outs": 0, "far": 0, "xzero": 0}

    async def tb(ctx):
        beat, first, enabled, due = 0, None, 0, {}
        for cyc in range(400):
            en = int(mode == "bubble" or rng.random() < 0.6)
            v = int(mode == "stall" or rng.random() < 0.6)
            rst = int(mode == "mix" and rng.random() < 0.02)
            p = [int(x) for x in rng.integers(-(1 << width - 1), 1 << width - 1, w)]
            if rng.random() < 0.3:          # equal lanes: the beat's FWHT is 0 but in lane 0
                p = [p[0]] * w
            d = int(rng.choice([0, 0, int(rng.integers(0, amax + 1)), amax]))
            if v and beat == 1 and first[1]:
                d = 0                            # the contract: one of a pair's d is 0
            d = d if v else int(rng.integers(0, 1 << dut.d_width))
            side = int(rng.integers(0, 256))
            ctx.set(dut.en, en)
            ctx.set(dut.i_valid, v)
            ctx.set(cd.rst, rst)
            ctx.set(dut.p.as_value(), sum((x & 15) << (4 * i) for i, x in enumerate(p)))
            ctx.set(dut.d[0], d)
            ctx.set(dut.side_i, side)
            if en and not rst:
                exp = due.pop(enabled, None)
                if ctx.get(dut.o_valid) != (exp is not None):
                    fails.append((cyc, "valid"))
                elif exp is not None:
                    fl = ctx.get(dut.flip)
                    got = [(-1) ** ((fl >> i) & 1) * ctx.get(dut.y[i]) for i in range(w)]
                    seen["outs"] += 1
                    if got != exp[0] or ctx.get(dut.side_o) != exp[1]:
                        fails.append((cyc, "data", got, exp))
                    if window and ([(ctx.get(dut.alt) >> i) & 1 for i in range(w)] != exp[2]
                                   or ctx.get(dut.exp_alt) != exp[3] & 255):
                        fails.append((cyc, "alt", ctx.get(dut.alt), ctx.get(dut.exp_alt), exp))
            if rst:
                beat, first, due = 0, None, {}
            elif en:
                if v and beat == 0:
                    first = (p, d)
                elif v:
                    y = fwht(np.array([x << first[1] for x in first[0]] + [x << d for x in p],
                                      dtype=np.int64))
                    e = max((first[1] | d) - window, 0) // step * step if window else 0
                    # X, the lane of the beat with the larger d (beat 1 when d_0 = 0)
                    xl = fwht(np.array(p if first[1] == 0 else first[0], dtype=np.int64))
                    alt = [int(x != 0) for x in xl] * 2
                    seen["far"] += e > 0
                    seen["xzero"] += e > 0 and 0 in xl
                    y = [_round_odd(int(t), e * a) for t, a in zip(y, alt)]
                    at = enabled + dut.cycles - 1
                    due[at], due[at + 1] = ((y[:w], side, alt[:w], side + e),
                                            (y[w:], side, alt[w:], side + e))
                    seen["pairs"] += 1
                beat ^= v
                enabled += 1
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert dut.cycles == latency + FOLD_ALIGN_CYCLES == latency + 4
    assert dut.out_width == width + (w.bit_length() - 1) + 1 + \
        (window + step - 1 if window else amax)
    assert not fails, fails[:3]
    assert seen["outs"] >= seen["pairs"] >= 40, seen
    assert not window or seen["far"] >= 10 and seen["xzero"] >= 3, seen


@pytest.mark.parametrize("flow,n,block,lanes,fa", [("credit", 16, 8, None, False),
                                                   ("credit", 16, 8, 8, True),
                                                   ("stall", 16, 8, None, False),
                                                   ("stall", 16, 8, 8, True)])
def test_reset_copies(flow, n, block, lanes, fa):
    """``reset_copies``: the decoder behaves as the same decoder without copies whose reset
    lasts one cycle longer (``rst`` or ``rst`` one cycle earlier): the ports equal in every
    cycle without reset, and in the cycle after ``rst`` falls ``i.ready`` and ``o.valid``
    are low. Random payloads, valid / ready and resets of 1 to 3 cycles, also while words
    are in flight; fails if a register sees the reset on time (left out of the copies'
    domains) or if the hold-off misses that cycle."""
    from amaranth.hdl import ClockDomain, DomainRenamer
    p = FormatParams(n=n, block=block, sign_seed=3)
    kw = dict(fwht_regs=1, flow=flow, lanes=lanes, fold_align=fa)
    a = make_decoder(p, reset_copies=True, **kw)
    c = make_decoder(p, **kw)
    m = Module()
    m.domains.sync = cd = ClockDomain()
    m.domains.ext = ext = ClockDomain()         # the reference: the reset one cycle longer
    m.d.comb += ext.clk.eq(cd.clk)
    m.submodules.a = a
    m.submodules.c = DomainRenamer("ext")(c)
    rng = np.random.default_rng(n + (lanes or 0) + len(flow))
    width = len(a.i.payload.as_value())
    seen = {"out": 0, "held": 0, "in_flight_resets": 0}
    fails = []

    async def tb(ctx):
        rst_prev, rst_left, accepted, taken = 0, 3, 0, 0
        for cyc in range(1500):
            if rst_left == 0 and rng.random() < 0.02:
                rst_left = int(rng.integers(1, 4))
                seen["in_flight_resets"] += accepted > taken
            rst = int(rst_left > 0)
            rst_left -= rst
            v, r = int(rng.random() < 0.7), int(rng.random() < 0.6)
            pay = int.from_bytes(rng.bytes(-(-width // 8)), "little") & ((1 << width) - 1)
            ctx.set(cd.rst, rst)
            ctx.set(ext.rst, rst | rst_prev)
            for dut in (a, c):
                ctx.set(dut.i.valid, v)
                ctx.set(dut.o.ready, r)
                ctx.set(dut.i.payload.as_value(), pay)
            ai, av = ctx.get(a.i.ready), ctx.get(a.o.valid)
            ci, cv = ctx.get(c.i.ready), ctx.get(c.o.valid)
            if rst_prev and not rst:             # the cycle after rst: held off
                seen["held"] += 1
                if ai or av:
                    fails.append((cyc, "not held off", ai, av))
            elif not rst:                        # a cycle without reset: as the reference
                if (ai, av) != (ci, cv):
                    fails.append((cyc, "handshake", (ai, av), (ci, cv)))
                elif av and ctx.get(a.o.payload.as_value()) != ctx.get(c.o.payload.as_value()):
                    fails.append((cyc, "payload"))
                seen["out"] += av & r
            accepted = 0 if rst else accepted + (v & ai)
            taken = 0 if rst else taken + (av & r)
            rst_prev = rst
            await ctx.tick()
            if len(fails) > 5:
                break

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert not fails, fails
    assert seen["out"] > 100 and seen["held"] > 10 and seen["in_flight_resets"] > 5, seen


def test_reset_copies_config(tmp_path):
    """``reset_copies``: a bool (the message names it); config part ``rc`` of decoders and
    round trips, refused on an encoder; the manifest states the reset's lag and hold-off;
    the copies are one per region: 3 + one per 4 skid FIFO slices."""
    from rtl_gen import generate
    from rtl_gen.config import RTLConfig
    from hw.pipeline import RESET_SKID_SLICES, reset_copy_count, skid_slices
    p = FormatParams(n=16, block=8)
    with pytest.raises(TypeError, match="reset_copies"):
        make_decoder(p, reset_copies=1)
    for name in ("dec_v2_n128_g64_b3_l6_p0_c0_w64_fa_rc", "rt_v2_n64_g32_b3_l2_c0_w32_fa_rc",
                 "dec_v2_n16_g8_b3_l1_rc"):
        c = RTLConfig.parse(name)
        assert c.name == name and c.dec.reset_copies is True
    assert RTLConfig.parse("dec_v2_n16_g8_b3_l1").opts.reset_copies is False
    with pytest.raises(ValueError, match="reset_copies"):
        RTLConfig.parse("enc_v2_n16_g8_b3_l1_rc")
    with pytest.raises(ValueError, match="sets reset_copies twice"):
        RTLConfig.parse("dec_v2_n16_g8_b3_l1_rc_rc")
    # N=128 two beats: 2,048 output bits, 29 slices of 72 -> 8 skid copies
    assert skid_slices(2048) == 29 and reset_copy_count(29, 3) == 3 + -(-29 // RESET_SKID_SLICES)
    # N=32: 512 output bits, 8 slices -> 2 + 2 copies: this module's registers, the FWHT's,
    # the skid FIFO's slices 0-3 and 4-7 with their valid copies
    c = RTLConfig.parse("dec_v2_n32_g16_b3_l1_c0_rc")
    man = generate(c.kind, c.params, tmp_path, c.opts)
    assert man["reset"]["register_reset_delay_cycles"] == 1
    assert man["reset"]["held_off_cycles_after_rst"] == 1
    text = (tmp_path / man["verilog"]).read_text()
    assert reset_copy_count(skid_slices(32 * 16), 2) == 4
    assert sorted(set(re.findall(r"reg (rst\d+)_rst\b", text))) == [f"rst{k}" for k in range(4)]

    def reset_of(reg):          # the copy whose reset the register's next value takes
        nxt = re.search(rf"\n +{re.escape(reg)} <= (\\\$\d+) ;", text)
        assert nxt, reg
        got = re.search(rf"{re.escape(nxt.group(1))}  = [^;]*;(?:(?!always).)*?"
                        rf"if \(rst(\d+)_rst\)", text, re.S)
        assert got, (reg, nxt.group(1))
        return int(got.group(1))
    for k in range(8):          # slice k and its valid copy reset from copy 2 + k // 4
        sn = "skid" if k == 0 else f"skid{k}"
        # the valid copy's register (named after the RAM's write enable it drives)
        ov = re.search(rf"assign {'out_valid' if k == 0 else f'out_valid{k}'} = (.+?);", text)
        assert reset_of(f"{sn}_wp") == reset_of(ov.group(1)) == 2 + k // RESET_SKID_SLICES, k
    assert reset_of("credit_count") == 0
    ifwht_mod = text[text.index("module \\kv_decoder.core.ifwht"):]
    ifwht_mod = ifwht_mod[:ifwht_mod.index("endmodule")]
    assert set(re.findall(r"if \((rst\d+)_rst\)", ifwht_mod)) == {"rst1"}
    base = generate(c.kind, c.params, tmp_path / "b",
                    DecoderOptions(fwht_regs=1, flow="credit", credit_extra=0))
    assert "rst0" not in (tmp_path / "b" / base["verilog"]).read_text()
    assert set(base["reset"]) == {"port", "kind", "active"}
