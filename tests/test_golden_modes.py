"""Unit tests of the format-study additions to the golden model.

Quantizer modes (midrise, asym, lloydmax), scale rules (max, rms, absmean),
scale rounding (up, nearest), scale encodings (ue5m3, e4m3fn, e5m2, ue4m4),
key centering and the cache policy. Exactness is checked against brute force
in ``fractions.Fraction`` arithmetic, as tests/test_golden.py does for the
version-1 default; the default itself must be unchanged (its checksums are
pinned there).
"""

from __future__ import annotations

import itertools
import zlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import sim_models as sm
from sim_models import FLAG_SAT, FormatParams
from sim_models.center import center
from sim_models.exact import first_true, ge_scaled
from sim_models.lloyd_max import LEVELS, gaussian_lloyd_max
from sim_models.minifloat import scale_encoding
from sim_models.pack import pack_codes, unpack_codes
from sim_models.params import (FORMAT_VERSION, PRESETS, QUANT_MODES, SCALE_ENCODINGS,
                               SCALE_ROUNDING, SCALE_RULES)
from sim_models.policy import CachePolicy
from sim_models.quant import dequantize, quantize, threshold_coefs
from sim_models.scale import choose_scale_bytes, max_units, scale_mult

F16 = np.float16
TWO = Fraction(2)


def _combos():
    for mode, rule, rnd, enc in itertools.product(QUANT_MODES, SCALE_RULES, SCALE_ROUNDING,
                                                  SCALE_ENCODINGS):
        if mode == "asym" and rule != "max":
            continue
        yield mode, rule, rnd, enc


# --------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("kw, exc, word", [
    (dict(scale_rule="mean"), ValueError, "scale_rule"),
    (dict(scale_rule=1), TypeError, "scale_rule"),
    (dict(scale_round="down"), ValueError, "scale_round"),
    (dict(scale_mult=0), ValueError, "scale_mult"),
    (dict(scale_mult=512), ValueError, "scale_mult"),
    (dict(scale_mult=1.5), TypeError, "scale_mult"),
    (dict(mode="asym", scale_rule="rms"), ValueError, "scale_rule"),
    (dict(mode="lloyd"), ValueError, "mode"),
    (dict(scale="e4m3"), ValueError, "scale"),
    (dict(scale="ue8m0"), ValueError, "scale"),
])
def test_bad_study_params_raise_naming_the_field(kw, exc, word):
    with pytest.raises(exc, match=word):
        FormatParams(**kw)


def test_sizes_count_zero_points():
    assert FormatParams(mode="asym").bytes_per_vector == 48 + 2 + 2
    assert FormatParams(mode="asym").bits_per_element == 3.25
    for mode in ("midrise", "lloydmax"):
        assert FormatParams(mode=mode).bits_per_element == 3.125


def test_version2_defaults():
    """Format version 2 (docs/FORMAT.md 2): mid-rise codes, scale rounded to nearest."""
    p = FormatParams()
    assert (p.mode, p.scale_round, p.scale, p.scale_rule) == ("midrise", "nearest", "ue5m3", "max")
    assert (p.n, p.block, p.bits, p.mant_bits) == (128, 64, 3, 12)
    assert p.bits_per_element == 3.125


@pytest.mark.parametrize("p", [
    FormatParams(), FormatParams.preset("v1", n=64, dtype="bf16", sign_seed=None),
    FormatParams(mode="lloydmax", scale_rule="rms", scale_round="nearest", scale="e4m3fn",
                 scale_mult=240)])
def test_params_roundtrip_through_dict(p):
    d = p.to_dict()
    assert d["format_version"] == FORMAT_VERSION
    assert FormatParams.from_dict(d) == p
    del d["format_version"]                                     # optional
    assert FormatParams.from_dict(d) == p
    assert FormatParams.from_dict({}) == FormatParams()


def test_from_dict_fills_missing_fields_from_its_version():
    """A version-1 dict written before ``scale_round`` existed means the version-1 quantizer
    (rounding up), not today's defaults."""
    old_v1 = {k: v for k, v in FormatParams.preset("v1").to_dict().items() if k != "scale_round"}
    old_v1["format_version"] = 1
    assert FormatParams.from_dict(old_v1) == FormatParams.preset("v1")
    assert FormatParams.from_dict({"format_version": 1, "n": 64}) == FormatParams.preset("v1", n=64)
    assert FormatParams.from_dict({"format_version": 2, "n": 64}) == FormatParams(n=64)


@pytest.mark.parametrize("d, exc, word", [
    (dict(format_version=99), ValueError, "format_version 99"),
    (dict(format_version=True), ValueError, "format_version True"),
    (dict(format_version="2"), ValueError, "format_version '2'"),
    (dict(blocks=64), ValueError, "blocks"),
    (dict(format_version=1, mode="mid"), ValueError, "mode"),
    (dict(bits="3"), TypeError, "bits"),
    ([("n", 64)], TypeError, "dict"),
])
def test_from_dict_errors_name_the_field(d, exc, word):
    with pytest.raises(exc, match=word):
        FormatParams.from_dict(d)


def test_presets():
    """v1 = format version 1's quantizer (midtread, rounded up), v2 = today's default."""
    v1 = FormatParams.preset("v1")
    assert (v1.mode, v1.scale_round, v1.scale, v1.scale_rule, v1.scale_mult) == (
        "midtread", "up", "ue5m3", "max", None)
    assert FormatParams.preset("v2") == FormatParams()
    assert FormatParams.preset("v1", n=64, block=32, bits=4) == FormatParams(
        n=64, block=32, bits=4, mode="midtread", scale_round="up")
    assert FormatParams.preset("v1", scale_round="nearest") == FormatParams(mode="midtread")
    assert set(PRESETS) >= {"v1", "v2", "v3", "v4"}
    assert FormatParams.preset("v3") == FormatParams.preset("v2")     # v3 adds the key front end only
    assert FormatParams.preset("v4") == FormatParams.preset("v2")     # v4 changes the key front end only
    for name in PRESETS:
        first = "v2" if name in ("v3", "v4") else name               # the oldest version of a quantizer
        assert FormatParams.preset(name).quantizer_preset == first
        assert FormatParams.preset(name, n=64, dtype="bf16").quantizer_preset == first
    assert FormatParams(mode="midtread").quantizer_preset is None
    assert FormatParams(scale_mult=256).quantizer_preset is None


@pytest.mark.parametrize("name, kw, exc, word", [
    ("v9", {}, ValueError, "preset"),
    ("V1", {}, ValueError, "preset"),
    ("v1", dict(bits=5), ValueError, "bits"),
    ("v2", dict(mode="mid"), ValueError, "mode"),
])
def test_preset_errors_name_the_field(name, kw, exc, word):
    with pytest.raises(exc, match=word):
        FormatParams.preset(name, **kw)


@pytest.mark.parametrize("mode", QUANT_MODES)
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_threshold_coefs_and_max_units(mode, bits):
    """The tables shared with the RTL: thresholds lie between consecutive reconstruction levels,
    and the block maximum maps to the outermost level (or cell edge, or range)."""
    coefs, frac = threshold_coefs(mode, bits)
    kn, kd = max_units(FormatParams(mode=mode, bits=bits))
    h = 1 << (bits - 1)
    if mode == "midtread":
        assert coefs == tuple(range(1, 2 * h - 1, 2)) and frac == 1 and (kn, kd) == (h - 1, 1)
    elif mode == "midrise":
        assert coefs == tuple(range(1, h)) and frac == 0 and (kn, kd) == (h, 1)
    elif mode == "asym":
        assert coefs == tuple(range(1, 4 * h - 2, 2)) and frac == 1 and (kn, kd) == (2 * h - 1, 1)
    else:
        lv = LEVELS[bits]
        assert [Fraction(c, 2**frac) for c in coefs] == [
            Fraction(int(a) + int(b), 512) for a, b in zip(lv[:-1], lv[1:])]
        assert Fraction(kn, kd) == Fraction(int(lv[-1]), 256)
    with pytest.raises(ValueError, match="mode"):
        threshold_coefs("lloyd", bits)


# --------------------------------------------------------------------------- exact compare
@given(st.integers(0, 2**61), st.integers(-90, 90), st.integers(0, 2**61), st.integers(-90, 90))
def test_ge_scaled_is_exact(a, ea, b, eb):
    ref = Fraction(a) * TWO ** ea >= Fraction(b) * TWO ** eb
    assert bool(ge_scaled(np.array(a), np.array(ea), np.array(b), np.array(eb))) == ref
    big = np.array([a * 2**40], dtype=object)                  # object path
    ref2 = Fraction(a * 2**40) * TWO ** ea >= Fraction(b) * TWO ** eb
    assert bool(ge_scaled(big, np.array(ea), np.array([b], dtype=object), np.array(eb))[0]) == ref2


def test_ge_scaled_rejects_out_of_range():
    with pytest.raises(OverflowError):
        ge_scaled(np.array([2**62]), 0, np.array([1]), 0)
    with pytest.raises(OverflowError):
        ge_scaled(np.array([1]), 0, np.array([-1]), 0)


def test_first_true():
    t = np.array([0, 3, 7, 9])
    assert first_true(lambda i: i >= t, 8, t.shape).tolist() == [0, 3, 7, 8]


# --------------------------------------------------------------------------- scale encodings
@pytest.mark.parametrize("name, count, smallest, largest, first_byte, last_byte", [
    ("ue5m3", 255, 2.0**-9, 1.875 * 2**24, 0x01, 0xFF),
    ("e4m3fn", 126, 2.0**-9, 448.0, 0x01, 0x7E),
    ("e5m2", 123, 2.0**-16, 57344.0, 0x01, 0x7B),
    ("ue4m4", 255, 2.0**-10, 1.9375 * 2**8, 0x01, 0xFF),
])
def test_scale_encoding_ranges(name, count, smallest, largest, first_byte, last_byte):
    enc = scale_encoding(name)
    v = enc.values()
    assert enc.bytes.size == count and v[0] == smallest and v[-1] == largest
    assert (enc.bytes[0], enc.bytes[-1]) == (first_byte, last_byte)
    assert (np.diff(v) > 0).all()
    mids = np.ldexp(enc.mid_sig.astype(np.float64), enc.mid_exp.astype(np.int32))
    assert np.array_equal(mids, (v[:-1] + v[1:]) / 2)          # exact in float64


@pytest.mark.parametrize("name, tdtype", [("e4m3fn", "float8_e4m3fn"), ("e5m2", "float8_e5m2")])
def test_fp8_encodings_match_torch(name, tdtype):
    torch = pytest.importorskip("torch")
    dt = getattr(torch, tdtype, None)
    if dt is None:
        pytest.skip(f"torch has no {tdtype}")
    enc = scale_encoding(name)
    ref = torch.tensor(enc.bytes.astype(np.uint8)).view(dt).to(torch.float64).numpy()
    assert np.array_equal(ref, enc.values())


def test_scale_encoding_rejects_bad_bytes():
    with pytest.raises(ValueError, match="e4m3fn"):
        scale_encoding("e4m3fn").sig_exp(np.array([0x7F]))      # NaN
    with pytest.raises(ValueError, match="scale"):
        scale_encoding("nope")


# --------------------------------------------------------------------------- scale selection
def _ideal_scale_sq(yb, u, p):
    """t^2 as a Fraction (squares avoid the irrational sqrt of the rms rule)."""
    mult = Fraction(scale_mult(p), 256)
    unit = TWO ** u
    g = len(yb)
    if p.scale_rule == "max":
        kn, kd = max_units(p)
        a = (max(max(yb), 0) - min(min(yb), 0)) if p.mode == "asym" else max(abs(v) for v in yb)
        t = mult * a * unit / Fraction(kn, kd)
        return t * t
    if p.scale_rule == "absmean":
        t = mult * Fraction(sum(abs(v) for v in yb), g) * unit
        return t * t
    return mult * mult * Fraction(sum(v * v for v in yb), g) * unit * unit


def _brute_scale(yb, u, p):
    enc = scale_encoding(p.scale)
    vals = [Fraction(int(s)) * TWO ** int(e) for s, e in zip(enc.sig, enc.exp)]
    t2 = _ideal_scale_sq(yb, u, p)
    sat = vals[-1] ** 2 < t2
    if p.scale_round == "up":
        idx = next((i for i, v in enumerate(vals) if v * v >= t2), len(vals) - 1)
    else:
        mids = [(vals[i] + vals[i + 1]) / 2 for i in range(len(vals) - 1)]
        idx = sum(1 for m in mids if m * m <= t2)
    return int(enc.bytes[idx]), sat


def _random_y(rng, v, n, width):
    y = np.round(rng.standard_normal((v, n)) * 2.0 ** rng.integers(0, width - 2, (v, 1)))
    y = np.clip(y, -(2 ** (width - 1) - 1), 2 ** (width - 1) - 1).astype(np.int64)
    y[0] = 0
    y[1, :] = 2 ** (width - 1) - 1
    y[2, ::3] = 1
    y[3] = np.abs(y[3])                                       # one-sided blocks (asym)
    return y


@pytest.mark.parametrize("mode, rule, rnd, enc", list(_combos()))
def test_scale_selection_matches_brute_force(mode, rule, rnd, enc):
    rng = np.random.default_rng(zlib.crc32(f"{mode}{rule}{rnd}{enc}".encode()))
    p = FormatParams(n=16, block=8, mode=mode, scale_rule=rule, scale_round=rnd, scale=enc)
    y = _random_y(rng, 24, 16, p.fwht_width)
    u = rng.integers(-30, 20, 24)
    u[:4] = -10
    s, sat = choose_scale_bytes(y, u, p)
    for r in range(24):
        want_sat = False
        for k in range(2):
            yb = [int(v) for v in y[r, 8 * k: 8 * k + 8]]
            byte, bsat = _brute_scale(yb, int(u[r]), p)
            assert int(s[r, k]) == byte, (r, k)
            want_sat |= bsat
        assert bool(sat[r]) == want_sat


def test_nearest_rounding_ties_go_up():
    # midtread, max rule: t = A 2^u / 3; ue5m3 values 1.0 (0x38) and 1.125 (0x39), midpoint 17/16
    p = FormatParams(n=8, block=8, mode="midtread", scale_round="nearest")
    y = np.array([[51, 0, 0, 0, 0, 0, 0, 0], [50, 0, 0, 0, 0, 0, 0, 0]])   # t = 17/16, 50/48
    s, sat = choose_scale_bytes(y, np.array([-4, -4]), p)
    assert s[:, 0].tolist() == [0x39, 0x38] and not sat.any()
    up = choose_scale_bytes(y, np.array([-4, -4]), FormatParams.preset("v1", n=8, block=8))[0]
    assert up[:, 0].tolist() == [0x39, 0x39]
    # version-2 default (midrise, K = 4): t = A 2^u / 4; A = 68 -> t = 17/16, the midpoint
    y2 = np.array([[68, 0, 0, 0, 0, 0, 0, 0], [67, 0, 0, 0, 0, 0, 0, 0]])
    s2, _ = choose_scale_bytes(y2, np.array([-4, -4]), FormatParams(n=8, block=8))
    assert s2[:, 0].tolist() == [0x39, 0x38]
    # rms, G = 8: sum y^2 = 8 * 64 -> sigma = 8; lloydmax mult 256 -> t = 8 * 2^u exactly
    p = FormatParams(n=8, block=8, mode="lloydmax", scale_rule="rms", scale_round="nearest")
    s, _ = choose_scale_bytes(np.full((1, 8), 8), np.array([-3]), p)
    assert s[0, 0] == 0x38                                          # exactly 1.0


def test_saturation_flag_for_narrow_encodings():
    p = FormatParams(n=64, block=64, scale="e4m3fn")
    x = np.full((1, 64), 1000.0, F16)                               # y = 64000 at one lane
    e = sm.encode(x, p)
    assert e.flags[0] & FLAG_SAT and e.scales[0, 0] == 0x7E


@pytest.mark.parametrize("mult", [100, 256, 511])
def test_scale_mult_and_object_path(mult):
    # N = 4096, M = 16, G = 4096: sum y^2 needs Python ints (rms) -> object path
    rng = np.random.default_rng(mult)
    p = FormatParams(n=4096, block=4096, mant_bits=16, mode="midrise", scale_rule="rms",
                     scale_mult=mult)
    y = rng.integers(-2**27 + 1, 2**27, (2, 4096))
    u = np.array([-20, 3])
    s, _ = choose_scale_bytes(y, u, p)
    for r in range(2):
        assert int(s[r, 0]) == _brute_scale([int(v) for v in y[r]], int(u[r]), p)[0]


# --------------------------------------------------------------------------- codes
def _rha(fr: Fraction) -> int:
    """round half away from zero"""
    return int(fr + Fraction(1, 2)) if fr >= 0 else -int(-fr + Fraction(1, 2))


def _brute_code(yv: Fraction, step: Fraction, p, zero=None, lo=None):
    h = 1 << (p.bits - 1)
    if p.mode == "midtread":
        return max(-(h - 1), min(h - 1, _rha(yv / step)))
    if p.mode == "midrise":
        m = min(int(abs(yv) / step), h - 1)                   # floor, ties up (away from 0)
        return m if yv >= 0 else -1 - m
    if p.mode == "lloydmax":
        lv = [Fraction(v, 256) * step for v in LEVELS[p.bits]]
        a = abs(yv)
        m = sum(1 for j in range(1, h) if a >= (lv[j - 1] + lv[j]) / 2)
        # nearest level, ties to the outer one
        dist = [abs(a - v) for v in lv]
        best = min(dist)
        assert m == max(i for i, d in enumerate(dist) if d == best)
        return m if yv >= 0 else -1 - m
    q = 2 * h - 1
    z = min(q, int(-lo / step + Fraction(1, 2)))
    assert z == zero
    return max(0, min(q, z + _rha(yv / step)))


def _recon(c, step, p, z=None):
    if p.mode == "midtread":
        return c * step
    if p.mode == "midrise":
        return (c + Fraction(1, 2)) * step
    if p.mode == "lloydmax":
        m = c if c >= 0 else -1 - c
        v = Fraction(LEVELS[p.bits][m], 256) * step
        return v if c >= 0 else -v
    return (c - z) * step


@pytest.mark.parametrize("mode, bits, enc", [
    (m, b, e) for m in QUANT_MODES for b in (2, 3, 4) for e in ("ue5m3", "e5m2")])
def test_codes_and_reconstruction_match_brute_force(mode, bits, enc):
    p = FormatParams(n=8, block=8, bits=bits, mode=mode, scale=enc)
    rng = np.random.default_rng(bits * 7 + len(mode))
    e = scale_encoding(enc)
    v = 300
    y = rng.integers(-2**18, 2**18, size=(v, 8))
    y[:40] = rng.integers(-12, 13, size=(40, 8))               # small values: many exact ties
    u = rng.integers(-20, 5, v)
    u[:40] = -2
    scales = e.bytes[rng.integers(0, e.bytes.size, (v, 1))]
    scales[:40] = e.bytes[np.searchsorted(e.values(), 1.0)]    # scale 1.0 -> ties on the grid
    codes, zeros = quantize(y, u, scales, p)
    yhat = dequantize(codes, scales, p, zeros)
    sig, ex = e.sig_exp(scales)
    for r in range(v):
        step = Fraction(int(sig[r, 0])) * TWO ** int(ex[r, 0])
        lo = Fraction(min(int(y[r].min()), 0)) * TWO ** int(u[r])
        z = None if zeros is None else int(zeros[r, 0])
        for i in range(8):
            yv = Fraction(int(y[r, i])) * TWO ** int(u[r])
            c = _brute_code(yv, step, p, z, lo)
            assert codes[r, i] == c, (r, i, yv, step)
            assert Fraction(float(yhat[r, i])) == _recon(c, step, p, z)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_lloyd_max_constants(bits):
    lv = gaussian_lloyd_max(2 ** bits)
    assert [round(v * 256) for v in lv] == list(LEVELS[bits])


def test_midrise_max_rule_error_bound_and_code_range():
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((400, 128)) * np.exp2(rng.uniform(-8, 8, (400, 1)))).astype(F16)
    for b in (2, 3, 4):
        p = FormatParams(mode="midrise", bits=b, scale_round="up")
        t = sm.encode_trace(x.view(np.uint16), p)
        step = np.repeat(scale_encoding("ue5m3").values()[t.scales.astype(int) - 1], 64, axis=1)
        yv = np.ldexp(t.y.astype(np.float64), t.u[:, None].astype(np.int32))
        yhat = (2 * t.codes + 1) * step / 2
        assert (np.abs(yv - yhat) <= step / 2).all()           # max rule: nothing clips
        assert t.codes.min() >= -(1 << (b - 1)) and t.codes.max() < (1 << (b - 1))


# --------------------------------------------------------------------------- whole format
@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.uint16, (3, 64)), st.sampled_from(list(_combos())), st.sampled_from([2, 3, 4]),
       st.sampled_from([32, 64]))
def test_fuzz_modes_any_fp16_bits(bits, combo, b, g):
    mode, rule, rnd, enc = combo
    p = FormatParams(n=64, block=g, bits=b, mode=mode, scale_rule=rule, scale_round=rnd, scale=enc)
    e = sm.encode(bits, p)
    assert e.codes.shape == (3, 8 * b) and e.scales.shape == (3, 64 // g)
    assert (e.zeros is not None) == (mode == "asym")
    scale_encoding(enc).sig_exp(e.scales)                      # every byte is a valid value
    d = sm.decode_float(e.codes, e.scales, p, e.zeros)
    assert np.isfinite(d).all()
    if enc == "ue5m3" and rnd == "up" and rule == "max":
        assert not (e.flags & FLAG_SAT).any()


def test_decode_of_each_mode_is_the_inverse_rotation_of_yhat():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((50, 128)).astype(F16)
    for mode, rule, rnd, enc in _combos():
        p = FormatParams(mode=mode, scale_rule=rule, scale_round=rnd, scale=enc)
        t = sm.encode_trace(x.view(np.uint16), p)
        e = sm.encode(x, p)
        c = unpack_codes(e.codes, 128, 3, mode != "asym")
        assert np.array_equal(c, t.codes)
        yhat = dequantize(c, e.scales, p, e.zeros)
        d = np.where(sm.sign_mask(128, 0) == 1, -1.0, 1.0)
        ref = d * (yhat @ sm.hadamard(128)) / 128
        assert np.array_equal(sm.decode_float(e.codes, e.scales, p, e.zeros), ref)


def test_asym_decode_needs_zeros():
    p = FormatParams(mode="asym")
    e = sm.encode(np.ones((2, 128), F16), p)
    with pytest.raises(ValueError, match="zeros"):
        sm.decode_float(e.codes, e.scales, p)
    with pytest.raises(ValueError, match="zeros"):
        sm.decode_float(e.codes, e.scales, p, e.zeros[:, :1])


def test_unsigned_packing_roundtrip():
    rng = np.random.default_rng(13)
    for b in (2, 3, 4):
        c = rng.integers(0, 1 << b, (20, 64))
        assert np.array_equal(unpack_codes(pack_codes(c, b, False), 64, b, False), c)
        with pytest.raises(ValueError, match="unsigned"):
            pack_codes(np.full((1, 8), 1 << b), b, False)


def test_gaussian_mse_ranking():
    """After D*H, near-Gaussian lanes: 8 levels (midrise, Lloyd-Max) beat 7 (midtread)."""
    rng = np.random.default_rng(14)
    x = rng.standard_normal((3000, 128)).astype(F16)
    ref = x.astype(np.float64)

    def rel(**kw):
        p = FormatParams(**kw)
        e = sm.encode(x, p)
        r = sm.decode_float(e.codes, e.scales, p, e.zeros)
        return np.sum((r - ref) ** 2) / np.sum(ref ** 2)

    mt = rel(**PRESETS["v1"])
    mr = rel(mode="midrise", scale_round="up")
    mr_rms = rel(mode="midrise", scale_rule="rms", scale_round="nearest")
    lm = rel(mode="lloydmax", scale_rule="rms", scale_round="nearest")
    assert lm < mr_rms < mr < mt
    assert lm == pytest.approx(0.0345, rel=0.08)               # Max 1960: 0.03455 for 8 levels


# --------------------------------------------------------------------------- centering
def test_center_is_rne_of_exact_difference():
    rng = np.random.default_rng(15)
    x = (rng.standard_normal((200, 64)) * 4).astype(F16)
    mu = (rng.standard_normal(64) * 3).astype(F16)
    out = center(x, mu, FormatParams(n=64, block=64)).view(F16)
    for r in range(0, 200, 17):
        for i in range(64):
            exact = Fraction(float(x[r, i])) - Fraction(float(mu[i]))
            assert Fraction(float(out[r, i])) == Fraction(float(F16(float(exact))))  # exact -> RNE


def test_center_specials_and_saturation():
    p = FormatParams(n=8, block=8)
    x = np.array([[np.nan, np.inf, -np.inf, 65504, -65504, 1, 0, -0.0]], F16)
    mu = np.array([1, 1, 1, -65504, 65504, 1, 0, 0], F16)
    out = center(x, mu, p).view(F16)[0]
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == -np.inf
    assert out[3] == 65504 and out[4] == -65504 and out[5] == 0
    with pytest.raises(ValueError, match="mu"):
        center(x, np.full(8, np.nan, F16), p)
    with pytest.raises(TypeError, match="mu"):
        center(x, np.zeros(8, np.float32), p)
    with pytest.raises(ValueError, match="mu"):
        center(x, np.zeros(5, F16), p)


def test_centering_leaves_attention_unchanged():
    """q.(k - mu) = q.k - q.mu: a per-query constant, so softmax is unchanged."""
    rng = np.random.default_rng(16)
    k = (rng.standard_normal((30, 64)) + 3).astype(np.float64)
    mu = np.full(64, 3.0)
    q = rng.standard_normal(64)

    def soft(z):
        w = np.exp(z - z.max())
        return w / w.sum()

    assert np.allclose(soft(k @ q), soft((k - mu) @ q), rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------- cache policy
def test_policy_bits_count_every_byte():
    L, H, D, T = 30, 3, 64, 2048
    base = FormatParams(n=64, block=64)
    pol = CachePolicy(k=base, v=base)
    assert pol.bits_per_element(L, H, D, T) == base.bits_per_element == 3.125
    fp = CachePolicy(k=None, v=None)
    assert fp.bits_per_element(L, H, D, T) == 16
    sinks = CachePolicy(k=base, v=base, sinks=4)
    assert sinks.bits_per_element(L, H, D, T) == pytest.approx(3.125 + 4 * (16 - 3.125) / T)
    k4 = FormatParams(n=64, block=64, bits=4)
    lw = CachePolicy(k=base, v=base, layer_k=((0, k4), (5, k4)))
    assert lw.bits_per_element(L, H, D, T) == pytest.approx(3.125 + 2 / (2 * L))
    assert lw.format_for(5, "k") == k4 and lw.format_for(5, "v") == base
    asym = FormatParams(n=64, block=32, mode="asym")
    assert CachePolicy(k=asym, v=asym).bits_per_element(L, H, D, T) == 3.5


def test_policy_validation():
    with pytest.raises(ValueError, match="sinks"):
        CachePolicy(sinks=-1)
    with pytest.raises(TypeError, match="k must be"):
        CachePolicy(k="fp16")
    with pytest.raises(ValueError, match="layer_k"):
        CachePolicy(layer_k=((1, None), (1, None)))
    with pytest.raises(ValueError, match="head_dim"):
        CachePolicy().stored_bits(1, 1, 96, 10)


def test_cli_roundtrip_study_modes(tmp_path):
    from sim_models.__main__ import main
    x = np.random.default_rng(17).standard_normal((6, 64)).astype(F16)
    np.save(tmp_path / "x.npy", x)
    for mode, rule in (("asym", "max"), ("lloydmax", "rms")):
        args = ["encode", str(tmp_path / "x.npy"), str(tmp_path / "e.npz"), "--mode", mode,
                "--scale-rule", rule, "--scale-round", "nearest", "--scale", "e5m2"]
        assert main(args) == 0
        assert main(["decode", str(tmp_path / "e.npz"), str(tmp_path / "y.npy")]) == 0
        p = FormatParams(n=64, mode=mode, scale_rule=rule, scale_round="nearest", scale="e5m2")
        e = sm.encode(x, p)
        y = np.load(tmp_path / "y.npy")
        assert np.array_equal(y.view(np.uint16), sm.decode(e.codes, e.scales, p, e.zeros))


# --------------------------------------------------------------------------- memory CLI
def test_memory_llama3_70b_at_128k(capsys):
    from sim_models.memory import GIB, cache_bytes, main
    p = FormatParams()
    fp = cache_bytes(80, 8, 128, 131072, None)
    fm = cache_bytes(80, 8, 128, 131072, CachePolicy(k=p, v=p))
    assert fp == 40 * GIB and fm / GIB == pytest.approx(7.8125)
    assert main(["--preset", "llama-3-70b"]) == 0
    out = capsys.readouterr().out
    assert "40.00 GiB" in out and "7.81 GiB" in out and "5.12x" in out
    assert main(["--layers", "0", "--kv-heads", "8", "--head-dim", "128"]) == 2
    assert "layers" in capsys.readouterr().err


def test_memory_sizes_a_cache_policy(capsys):
    from sim_models.memory import main
    assert main(["--preset", "llama-3-70b", "--policy", "v3", "--context", "2048"]) == 0
    out = capsys.readouterr().out
    assert "3.150 bits/element" in out and "K3V3+C+S4+KS2" in out
    assert main(["--preset", "llama-3-70b", "--policy", "v3-K4V3", "--context", "2048"]) == 0
    assert "3.649 bits/element" in capsys.readouterr().out
    # v4: the 16-token fp16 ring beside the codes
    assert main(["--preset", "llama-3-70b", "--policy", "v4", "--context", "2048"]) == 0
    out = capsys.readouterr().out
    assert "3.275 bits/element" in out and "K3V3+C+S4+KS2+W16" in out
    assert main(["--preset", "llama-3-70b", "--policy", "v4"]) == 0
    assert "3.127 bits/element" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "v3-K4V3, v4; v4 recommended" in " ".join(capsys.readouterr().out.split())
    assert main(["--preset", "llama-3-70b", "--policy", "K3V3+X"]) == 2
    assert "unknown term 'X'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--preset", "llama-3-70b", "--policy", "v3", "--bits", "4"])
    assert e.value.code == 2 and "--bits" in capsys.readouterr().err


def test_memory_refuses_layers_the_model_lacks_and_says_larger(capsys):
    """An override of a layer past the model's last is refused (the check PackedCache makes); a cache
    bigger than fp16 (a ring of 16 fp16 rows beside the codes of 17 tokens) is "larger", not "smaller"."""
    from sim_models.memory import main
    assert main(["--preset", "smollm2-135m", "--policy", "K3V3+C+S4+KS2+W16+K4@0,30"]) == 2
    err = capsys.readouterr().err
    assert "--policy" in err and "policy.layer_k names layers [30], the model has 30 (layers 0-29)" in err
    assert main(["--preset", "smollm2-135m", "--policy", "K3V3+C+S4+KS2+W16+K4@0,29"]) == 0
    assert "x smaller" in capsys.readouterr().out
    assert main(["--preset", "smollm2-135m", "--policy", "K4V4+W16", "--context", "17"]) == 0
    out = capsys.readouterr().out
    assert "1.20x larger" in out and "smaller" not in out
    assert main(["--preset", "smollm2-135m", "--policy", "fp16+W16"]) == 0
    out = capsys.readouterr().out
    assert "16.000 bits/element" in out and "1.00x (the same size)" in out


# --------------------------------------------------------------------------- read-path edge cases
def test_zero_scale_byte_decodes_to_zero_independent_of_encoder_options():
    """Scale byte 0x00 is +0 in every encoding; decode must not depend on scale_round."""
    codes = np.full((2, 48), 0xA5, np.uint8)
    scales = np.zeros((2, 2), np.uint8)
    outs = []
    for kw in (PRESETS["v1"], dict(mode="midtread"), {},
               dict(scale_round="up")):
        p = FormatParams(**kw)
        v = sm.decode_float(codes, scales, p)
        assert (v == 0).all()
        if p.mode == "midrise":
            outs.append(sm.decode(codes, scales, p))
    assert np.array_equal(outs[0], outs[1])


def test_encode_refuses_non_params():
    x = np.zeros((1, 128), F16)
    with pytest.raises(TypeError, match="FormatParams"):
        sm.encode(x, {"n": 128})
    with pytest.raises(TypeError, match="FormatParams"):
        sm.decode_float(np.zeros((1, 48), np.uint8), np.ones((1, 2), np.uint8), {})


def test_cli_decode_refuses_malformed_params(tmp_path, capsys):
    import json
    from sim_models.__main__ import main
    e = sm.encode(np.zeros((1, 64), F16), FormatParams(n=64))
    for params in ("null", "5", '"x"', "[1, 2]",
                   json.dumps(dict(FormatParams(n=64).to_dict(), format_version=True))):
        f = tmp_path / "bad.npz"
        np.savez(f, codes=e.codes, scales=e.scales, params=np.array(params))
        assert main(["decode", str(f), str(tmp_path / "y.npy")]) == 2
        assert "error:" in capsys.readouterr().err
    np.save(tmp_path / "s.npy", np.float16(1.0))
    assert main(["encode", str(tmp_path / "s.npy"), str(tmp_path / "e.npz")]) == 2
    assert "shape [..., N]" in capsys.readouterr().err


def test_decode_refuses_a_zero_point_plane_outside_asym():
    """A zeros plane for a mode without zero points would be ignored: refused, naming zeros."""
    p = FormatParams(n=64)
    e = sm.encode(np.zeros((2, 64), np.float16), p)
    with pytest.raises(ValueError, match="zeros"):
        sm.decode(e.codes, e.scales, p, np.zeros((2, p.n_blocks), np.uint8))
    assert sm.decode(e.codes, e.scales, p).shape == (2, 64)
