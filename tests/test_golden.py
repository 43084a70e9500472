"""Unit tests of the golden model (sim_models): the definition of the format."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import sim_models as sm
from sim_models import FLAG_INF, FLAG_NAN, FLAG_SAT, FormatParams
from sim_models.bfp import decode_bits, to_block_fp
from sim_models.codec import round_to_input_type
from sim_models.pack import pack_codes, unpack_codes
from sim_models.exact import ge_scaled
from sim_models.minifloat import scale_encoding
from sim_models.quant import dequantize, quantize
from sim_models.scale import choose_scale_bytes

F16 = np.float16


def _fp16_exact(bits: np.ndarray) -> np.ndarray:
    v = bits.view(np.float16).astype(np.float64)
    return np.where(np.isnan(v), 0.0, np.clip(v, -65504, 65504))


# --------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("kw, exc, word", [
    (dict(n=12), ValueError, "n (N)"),
    (dict(n=80), ValueError, "n (N)"),
    (dict(n=0), ValueError, "n (N)"),
    (dict(n=-128), ValueError, "n (N)"),
    (dict(n=8192), ValueError, "n (N)"),
    (dict(n=128.0), TypeError, "n must be an int"),
    (dict(n=True), TypeError, "n must be an int"),
    (dict(block=48), ValueError, "block (G)"),
    (dict(block=4, n=8), ValueError, "block (G)"),
    (dict(block=256), ValueError, "block (G)"),
    (dict(bits=1), ValueError, "bits (b)"),
    (dict(bits=5), ValueError, "bits (b)"),
    (dict(mode="lloyd"), ValueError, "mode"),
    (dict(mode=3), TypeError, "mode"),
    (dict(mant_bits=5), ValueError, "mant_bits (M)"),
    (dict(mant_bits=17), ValueError, "mant_bits (M)"),
    (dict(scale="e4m3"), ValueError, "scale"),
    (dict(dtype="fp32"), ValueError, "dtype"),
    (dict(sign_seed=-1), ValueError, "sign_seed"),
    (dict(sign_seed=2**64), ValueError, "sign_seed"),
    (dict(sign_seed="0"), TypeError, "sign_seed"),
])
def test_bad_params_raise_naming_the_field(kw, exc, word):
    with pytest.raises(exc, match=word.replace("(", r"\(").replace(")", r"\)")):
        FormatParams(**kw)


def test_default_sizes():
    p = FormatParams()
    assert (p.n, p.block, p.bits, p.code_bytes, p.n_blocks) == (128, 64, 3, 48, 2)
    assert p.bytes_per_vector == 50 and p.bits_per_element == 3.125
    assert 256 / p.bytes_per_vector == pytest.approx(5.12)
    assert p.fwht_width == 19 and p.qmax == 3


# --------------------------------------------------------------------------- input checks
@pytest.mark.parametrize("x, exc", [
    ([[0] * 128], TypeError),
    (np.zeros((2, 128), np.float32), TypeError),
    (np.zeros((2, 128), np.int16), TypeError),
    (np.zeros((2, 64), np.uint16), ValueError),
    (np.zeros((), np.uint16), ValueError),
    (np.zeros((128, 2), np.float16), ValueError),
])
def test_encode_rejects_bad_input(x, exc):
    with pytest.raises(exc):
        sm.encode(x)


def test_float16_input_rejected_for_bf16():
    with pytest.raises(TypeError, match="bf16"):
        sm.encode(np.zeros((1, 128), np.float16), FormatParams(dtype="bf16"))


def test_decode_rejects_bad_planes():
    e = sm.encode(np.ones((3, 128), np.float16))
    with pytest.raises(ValueError):
        sm.decode(e.codes[:, :47], e.scales)
    with pytest.raises(ValueError):
        sm.decode(e.codes, e.scales[:2])
    with pytest.raises(TypeError):
        sm.decode(e.codes.astype(np.int16), e.scales)
    with pytest.raises(TypeError):
        sm.decode(e.codes, list(e.scales))


def test_leading_axes_are_kept():
    x = np.random.default_rng(0).standard_normal((5, 3, 128)).astype(np.float16)
    e = sm.encode(x)
    assert e.codes.shape == (5, 3, 48) and e.scales.shape == (5, 3, 2) and e.flags.shape == (5, 3)
    flat = sm.encode(x.reshape(15, 128))
    assert np.array_equal(flat.codes, e.codes.reshape(15, 48))
    assert sm.decode(e.codes, e.scales).shape == (5, 3, 128)


def test_empty_batch():
    e = sm.encode(np.zeros((0, 128), np.uint16))
    assert e.codes.shape == (0, 48) and e.scales.shape == (0, 2)


# --------------------------------------------------------------------------- FWHT
@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 64, 128, 256])
def test_hadamard_squares_to_n_identity(n):
    h = sm.hadamard(n)
    assert np.array_equal(h @ h, n * np.eye(n, dtype=np.int64))
    assert np.array_equal(sm.fwht(np.eye(n, dtype=np.int64)), h)


@given(hnp.arrays(np.int64, st.tuples(st.integers(1, 4), st.sampled_from([8, 64, 128])),
                  elements=st.integers(-2**11, 2**11)))
def test_fwht_matches_dense_and_inverts_exactly(x):
    n = x.shape[1]
    y = sm.fwht(x)
    assert np.array_equal(y, x @ sm.hadamard(n))
    assert np.array_equal(sm.fwht(y), n * x)
    assert np.abs(y).max() <= np.abs(x).max() * n          # one bit of growth per stage


@pytest.mark.parametrize("n", [3, 12, 80, 0])
def test_fwht_rejects_non_power_of_two(n):
    with pytest.raises(ValueError, match="power of two"):
        sm.fwht(np.zeros((2, n), np.int64))


# --------------------------------------------------------------------------- sign flip
def test_sign_mask_is_splitmix64_bits():
    # SplitMix64 reference output for seed 0 (first word), from the published algorithm
    from sim_models.signs import splitmix64
    assert splitmix64(0, 1)[0] == 0xE220A8397B1DCDAF
    m = sm.sign_mask(128, 0)
    assert m.dtype == np.uint8 and set(np.unique(m)) <= {0, 1}
    assert sm.sign_mask_int(64, 0) == 0xE220A8397B1DCDAF
    assert not sm.sign_mask(128, None).any()
    assert not np.array_equal(sm.sign_mask(128, 0), sm.sign_mask(128, 1))


# --------------------------------------------------------------------------- special values, BFP
def test_special_value_decoding():
    bits = np.array([[0x7E00, 0xFC00, 0x7C00, 0x0001, 0x8000, 0x7BFF, 0x3C00, 0xFE01]], np.uint16)
    p = FormatParams(n=8, block=8)
    sign, exp, sig, flags = decode_bits(bits, p)
    assert flags[0] == FLAG_NAN | FLAG_INF
    assert sig[0, 0] == 0 and sign[0, 0] == 0                 # NaN -> +0
    assert (sign[0, 1], exp[0, 1], sig[0, 1]) == (1, 30, 2047)  # -inf -> -65504
    assert (sign[0, 2], exp[0, 2], sig[0, 2]) == (0, 30, 2047)
    assert (exp[0, 3], sig[0, 3]) == (1, 1)                   # smallest subnormal
    assert sig[0, 4] == 0 and sig[0, 7] == 0                  # -0, negative NaN


def test_nan_encodes_like_zero_and_inf_like_max():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 128)).astype(F16)
    with_nan, zeroed = x.copy(), x.copy()
    with_nan[:, 5] = np.nan
    zeroed[:, 5] = 0
    a, b = sm.encode(with_nan), sm.encode(zeroed)
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
    assert (a.flags == FLAG_NAN).all() and (b.flags == 0).all()
    with_inf, maxed = x.copy(), x.copy()
    with_inf[:, 7], maxed[:, 7] = -np.inf, -65504
    a, b = sm.encode(with_inf), sm.encode(maxed)
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
    assert (a.flags == FLAG_INF).all() and (b.flags == 0).all()


def test_negative_zero_encodes_like_zero():
    a = sm.encode(np.full((1, 128), -0.0, F16))
    b = sm.encode(np.zeros((1, 128), F16))
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
    assert not a.codes.any() and a.scales.tolist() == [[1, 1]] and a.flags[0] == 0


@settings(max_examples=200)
@given(hnp.arrays(np.uint16, (3, 64)))
def test_block_fp_is_exact_at_top_binade_and_within_half_unit(bits):
    p = FormatParams(n=64, block=64, sign_seed=None)
    x, u, _ = to_block_fp(bits, p, sm.sign_mask(64, None))
    ref = _fp16_exact(bits)
    approx = np.ldexp(x.astype(np.float64), u[:, None].astype(np.int32))
    half_unit = np.ldexp(0.5, u.astype(np.int32))[:, None]
    assert (np.abs(approx - ref) <= half_unit).all()
    _, e, _, _ = decode_bits(bits, p)
    top = e == e.max(axis=1, keepdims=True)
    assert np.array_equal(approx[top], ref[top])             # M = 12: top binade exact
    assert np.abs(x).max() < 2**11


def test_subnormals_are_exact():
    bits = np.arange(1, 129, dtype=np.uint16).reshape(1, 128)   # all subnormal
    p = FormatParams(sign_seed=None)
    x, u, _ = to_block_fp(bits, p, sm.sign_mask(128, None))
    assert np.array_equal(np.ldexp(x.astype(np.float64), int(u[0])), _fp16_exact(bits))


def test_block_fp_narrow_mantissa_clamps():
    p = FormatParams(n=8, block=8, mant_bits=8, sign_seed=None)
    bits = np.full((1, 8), 0x7BFF, np.uint16)                 # 65504: 2047 >> 4 rounds to 128
    x, _, _ = to_block_fp(bits, p, sm.sign_mask(8, None))
    assert (x == 127).all()


# --------------------------------------------------------------------------- scale byte
def _ue5m3(s: int) -> Fraction:
    """Exact value of ue5m3 byte ``s`` (docs/FORMAT.md 3.5), the oracle of this file."""
    e, m = s >> 3, s & 7
    return Fraction(m if e == 0 else 8 + m) * Fraction(2) ** (max(e, 1) - 10)


def _step(scales: np.ndarray) -> np.ndarray:
    """float64 ue5m3 scale values of a byte array (exact)."""
    return np.vectorize(lambda s: float(_ue5m3(int(s))))(scales)


def test_ue5m3_values():
    enc = scale_encoding("ue5m3")
    assert enc.bytes.tolist() == list(range(1, 256))          # every byte but 0x00, in value order
    assert [Fraction(int(s)) * Fraction(2) ** int(e) for s, e in zip(enc.sig, enc.exp)] == [
        _ue5m3(s) for s in range(1, 256)]
    assert [float(_ue5m3(s)) for s in (1, 7, 8, 0x38, 0x39, 255)] == [
        2.0**-9, 7 * 2.0**-9, 2.0**-6, 1.0, 1.125, 1.875 * 2**24]


def _brute_scale(coef, a, u):
    need = Fraction(a) * Fraction(2) ** u
    for s in range(1, 256):
        if coef * _ue5m3(s) >= need:
            return s, False
    return 255, True


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_scale_selection_matches_brute_force(bits):
    """Version 1 (max rule rounded up): the smallest byte with K scale >= A 2^u, K = 2^(b-1) - 1."""
    p = FormatParams.preset("v1", n=8, block=8, bits=bits)
    rng = np.random.default_rng(2)
    a = np.concatenate([np.arange(0, 300), rng.integers(0, 2**27, 400), [2**27 - 1]])
    u = rng.integers(-40, 30, a.size)
    y = np.zeros((a.size, 8), np.int64)
    y[:, 0] = a
    s, sat = choose_scale_bytes(y, u, p)
    for ai, ui, si, ti in zip(a, u, s[:, 0], sat):
        assert (int(si), bool(ti)) == _brute_scale(p.qmax, int(ai), int(ui))


@given(st.integers(0, 2**61), st.integers(-80, 80), st.integers(0, 2**61), st.integers(-80, 80))
def test_ge_scaled_is_exact(a, ea, b, eb):
    ref = Fraction(a) * Fraction(2) ** ea >= Fraction(b) * Fraction(2) ** eb
    assert bool(ge_scaled(np.array(a), np.array(ea), np.array(b), np.array(eb))) == ref


def test_ge_scaled_rejects_large_operands():
    with pytest.raises(OverflowError, match="operand a"):
        ge_scaled(np.array([2**62]), np.array([0]), np.array([1]), np.array([0]))


# --------------------------------------------------------------------------- codes
def _round_half_away(fr: Fraction) -> int:
    return int(fr + Fraction(1, 2)) if fr >= 0 else -int(-fr + Fraction(1, 2))


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_codes_are_round_half_away_of_y_over_scale(bits):
    p = FormatParams.preset("v1", n=8, block=8, bits=bits)
    rng = np.random.default_rng(bits)
    y = rng.integers(-2**18, 2**18, size=(200, 8))
    y[:10] = rng.integers(-4, 5, size=(10, 8))
    u = rng.integers(-20, 5, 200)
    scales = rng.integers(1, 256, size=(200, 1)).astype(np.uint8)
    codes, _ = quantize(y, u, scales, p)
    for r in range(200):
        step = _ue5m3(int(scales[r, 0]))
        for i in range(8):
            ref = _round_half_away(Fraction(int(y[r, i])) * Fraction(2) ** int(u[r]) / step)
            assert codes[r, i] == max(-p.qmax, min(p.qmax, ref))


def test_ties_round_away_from_zero():
    p = FormatParams.preset("v1", n=8, block=8)
    # scale byte 0x38 = 1.0, unit 2^-1: y = 1 -> 0.5 (tie) -> 1; y = 3 -> 1.5 -> 2; y = -5 -> -2.5 -> -3
    y = np.array([[1, -1, 3, -3, 5, -5, 0, 2]])
    codes, _ = quantize(y, np.array([-1]), np.array([[0x38]], np.uint8), p)
    assert codes.tolist() == [[1, -1, 2, -2, 3, -3, 0, 1]]


# --------------------------------------------------------------------------- packing
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_pack_roundtrip(bits):
    rng = np.random.default_rng(bits)
    lim = 1 << (bits - 1)
    c = rng.integers(-lim, lim, size=(50, 128))
    plane = pack_codes(c, bits)
    assert plane.shape == (50, 128 * bits // 8) and plane.dtype == np.uint8
    assert np.array_equal(unpack_codes(plane, 128, bits), c)


def test_pack_bit_order():
    c = np.zeros((1, 8), np.int64)
    c[0, 0], c[0, 1], c[0, 2], c[0, 7] = 1, -1, 3, -3          # fields 001, 111, 011, ..., 101
    plane = pack_codes(c, 3)
    stream = 1 | (7 << 3) | (3 << 6) | (5 << 21)
    assert plane.tolist() == [[stream & 0xFF, (stream >> 8) & 0xFF, stream >> 16]]


def test_pack_rejects_bad_codes():
    with pytest.raises(ValueError):
        pack_codes(np.array([[4] * 8]), 3)
    with pytest.raises(ValueError):
        pack_codes(np.zeros((1, 5), np.int64), 3)


# --------------------------------------------------------------------------- whole format
@settings(max_examples=150, deadline=None)
@given(hnp.arrays(np.uint16, (4, 128)), st.sampled_from([2, 3, 4]), st.sampled_from([32, 64, 128]),
       st.sampled_from(["v2", "v1"]))
def test_fuzz_any_fp16_bits(bits, b, g, version):
    """Any fp16 bit patterns, the version-2 default and the version-1 quantizer (FORMAT.md 3.5-3.6)."""
    p = FormatParams.preset(version, bits=b, block=g)
    h = 1 << (b - 1)
    t = sm.encode_trace(bits, p)
    assert np.abs(t.y).max(initial=0) < 2 ** (p.fwht_width - 1)
    assert (t.scales >= 1).all()
    assert not (t.flags & FLAG_SAT).any()                  # fp16 never saturates the scale
    step = np.repeat(_step(t.scales), g, axis=1)
    yv = np.ldexp(t.y.astype(np.float64), t.u[:, None].astype(np.int32))
    if version == "v1":
        # mid-tread, scale rounded up: |y*2^u - code*scale| <= scale/2 per lane, no clipping
        assert (np.abs(t.codes) <= p.qmax).all()
        assert (np.abs(yv - t.codes * step) <= step / 2).all()
    else:
        # mid-rise, scale rounded to nearest: codes -h..h-1; the error is <= scale/2 except
        # above the top cell edge h*scale (the nearest scale may lie below A/h), where the
        # top code absorbs the excess
        assert t.codes.min() >= -h and t.codes.max() <= h - 1
        excess = np.maximum(np.abs(yv) - h * step, 0)
        assert (np.abs(yv - (2 * t.codes + 1) * step / 2) <= step / 2 + excess).all()
        # nearest of 4 significant bits (normal scales) or of the 2^-9 grid (subnormal scales)
        assert (excess <= h * np.maximum(step / 16, 2.0 ** -10)).all()
    e = sm.encode(bits, p)
    assert np.array_equal(unpack_codes(e.codes, 128, b), t.codes)
    assert np.isfinite(sm.decode_float(e.codes, e.scales, p)).all()


@pytest.mark.parametrize("version", ["v2", "v1"])
def test_bf16_large_values_saturate_with_flag(version):
    p = FormatParams.preset(version, dtype="bf16")
    bits = np.full((1, 128), 0x7F00, np.uint16)               # bf16 1.7e38
    e = sm.encode(bits, p)
    assert e.flags[0] & FLAG_SAT and (e.scales == 255).all()
    c = unpack_codes(e.codes, 128, 3)
    # the one non-zero FWHT lane clips to the outermost code (mid-tread +-3, mid-rise 3 or -4)
    assert np.abs(c).max() == 3 if version == "v1" else c.max() == 3 or c.min() == -4


def test_bf16_matches_fp16_on_common_values():
    x = np.random.default_rng(3).standard_normal((20, 128)).astype(np.float32)
    bf = (x.view(np.uint32) >> 16).astype(np.uint16)             # truncate to bf16
    as_f16 = (bf.astype(np.uint32) << 16).view(np.float32).astype(F16)
    a = sm.decode_float(*_planes(sm.encode(bf, FormatParams(dtype="bf16"))), FormatParams(dtype="bf16"))
    b = sm.decode_float(*_planes(sm.encode(as_f16)))
    assert np.allclose(a, b, rtol=0, atol=1e-12)


def _planes(e):
    return e.codes, e.scales


def test_roundtrip_error_on_gaussian_data():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2000, 128)).astype(F16)
    xr = sm.decode_float(*_planes(sm.encode(x)))
    ref = x.astype(np.float64)
    rel = np.linalg.norm(xr - ref) / np.linalg.norm(ref)
    assert 0.15 < rel < 0.30        # 7-level mid-tread on max-scaled Gaussian blocks: ~0.23-0.27


def test_rotation_helps_outlier_channels():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((500, 128))
    x[:, 3] *= 40                                              # one outlier channel
    x = x.astype(F16)
    ref = x.astype(np.float64)
    rot = sm.decode_float(*_planes(sm.encode(x)))
    # without rotation: quantize x itself with the same quantizer (H replaced by identity)
    p = FormatParams()
    bits = x.view(np.uint16)
    xi, u, _ = to_block_fp(bits, p, np.zeros(128, np.uint8))
    s, _ = choose_scale_bytes(xi, u, p)
    plain = dequantize(quantize(xi, u, s, p)[0], s, p)
    err_rot = np.linalg.norm(rot - ref)
    err_plain = np.linalg.norm(plain - ref)
    assert err_rot < 0.85 * err_plain                         # measured: 102 vs 764


def test_round_to_input_type_is_rne_and_saturates():
    rng = np.random.default_rng(6)
    v = rng.standard_normal(10000) * np.exp2(rng.uniform(-26, 17, 10000))
    p = FormatParams()
    got = round_to_input_type(v, p)
    ref = np.clip(v, -65504, 65504).astype(np.float16).view(np.uint16)
    assert np.array_equal(got, ref)
    assert round_to_input_type(np.array([1e9, -1e9]), p).view(np.float16).tolist() == [65504, -65504]
    # bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> even (1.0); 1 + 3*2^-8 -> 1 + 2^-6
    pb = FormatParams(dtype="bf16")
    assert round_to_input_type(np.array([1 + 2**-8, 1 + 3 * 2**-8]), pb).tolist() == [0x3F80, 0x3F82]
    with pytest.raises(ValueError):
        round_to_input_type(np.array([np.nan]), p)


def test_decode_bits_roundtrip_of_the_reconstruction():
    x = np.random.default_rng(7).standard_normal((10, 128)).astype(F16)
    e = sm.encode(x)
    exact = sm.decode_float(e.codes, e.scales)
    assert np.array_equal(sm.decode(e.codes, e.scales).view(F16), exact.astype(F16))


# --------------------------------------------------------------------------- attention identities
def test_attention_in_rotated_domain():
    rng = np.random.default_rng(8)
    p = FormatParams()
    t_len = 40
    k = rng.standard_normal((t_len, 128)).astype(F16)
    v = rng.standard_normal((t_len, 128)).astype(F16)
    q = rng.standard_normal(128)
    ek, ev = sm.encode(k, p), sm.encode(v, p)
    khat, vhat = sm.decode_float(ek.codes, ek.scales, p), sm.decode_float(ev.codes, ev.scales, p)
    d = np.where(sm.sign_mask(128, p.sign_seed) == 1, -1.0, 1.0)
    from sim_models.pack import unpack_codes as up
    yk = dequantize(up(ek.codes, 128, 3), ek.scales, p)
    yv = dequantize(up(ev.codes, 128, 3), ev.scales, p)
    rq = sm.fwht(d * q)
    logits_rot = yk @ rq / 128
    assert np.allclose(logits_rot, khat @ q, rtol=1e-12, atol=1e-9)
    w = np.exp(logits_rot - logits_rot.max())
    w /= w.sum()
    out_rot = d * sm.fwht(w @ yv) / 128
    assert np.allclose(out_rot, w @ vhat, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- test vectors, CLI
def test_vector_checksums_are_pinned():
    from sim_models import testvectors as tv
    assert {c for _, _, c in tv.CHECKSUMS} == set(tv.PINNED)
    for (name, n, config), want in tv.CHECKSUMS.items():
        p = tv.pinned_params(config, n)
        assert tv.checksum(tv.vector_set(name, n, 500), p) == want, (name, n, config)
    # the version-1 quantizer still writes the bytes pinned under format version 1
    # (the random set did not change between VECTORS_VERSION 1 and 2)
    v1_pins = {64: "1bf4b1bfd3bc7698", 128: "30f71e62d4b8145f", 256: "fdba45e0316bc307"}
    for n, want in v1_pins.items():
        assert tv.CHECKSUMS[("random", n, "v1")] == want


def test_key_front_checksums_are_pinned():
    """The key-front-end set (input, mu_s, e, slot, bypass -> bytes by the folded rule)."""
    from sim_models import testvectors as tv
    for n, want in tv.KEY_FRONT_CHECKSUMS.items():
        assert tv.key_front_checksum(n) == want, n


def test_key_front_set_hits_its_corners():
    """The pinned key-front-end set reaches every case it claims (and can fail)."""
    from sim_models import testvectors as tv
    p = tv.pinned_params("default", 64)
    x, mu, e, slot, byp = tv.key_front_set(64)
    xin = tv.key_front_inputs(x, mu, e, slot, byp, p)
    fx = ~byp.astype(bool)[:, None] & ((x & 0x7C00) != 0x7C00)     # lanes computed
    mag = xin & 0x7FFF
    assert (fx & (xin == 0x8000)).any() and (fx & (xin == 0)).any()       # both zeros
    assert (fx & (mag == 0x7BFF)).any()                                    # saturation
    assert (fx & (mag < 0x400) & (mag > 0)).any()                         # subnormal results
    assert set(np.unique(slot)) == set(range(tv.KEY_SLOTS)) and byp.any()
    special = (x & 0x7C00) == 0x7C00
    assert special.any() and (xin[special] == x[special]).all()
    # the folded rule (packed keys): saturated lanes (|x 2^e| >= 2^16) and the clamp of X - MU
    from sim_models.bfp import to_block_fp_keys
    k = ~byp.astype(bool)
    y, _, f = to_block_fp_keys(x[k], mu[slot[k]], e[slot[k]], p, np.zeros(64, np.uint8))
    scaled_ex = np.maximum((x[k] >> 10) & 31, 1) + e[slot[k]]
    assert (((x[k] & 0x7C00) != 0x7C00) & (scaled_ex > 30)).any()
    assert (np.abs(y) == (1 << (p.mant_bits - 1)) - 1).any()
    assert set(np.unique(f)) == {0, sm.FLAG_NAN, sm.FLAG_INF, sm.FLAG_NAN | sm.FLAG_INF}


def test_key_front_encode_is_folded_for_keys_and_plain_for_bypass():
    """key_front_encode: encode_folded with each vector's slot tables, encode where bypassed."""
    from sim_models import testvectors as tv
    from sim_models.codec import encode_folded
    p = tv.pinned_params("default", 64)
    x, mu, e, slot, byp = tv.key_front_set(64, 40)
    got = tv.key_front_encode(x, mu, e, slot, byp, p)
    for i in range(0, x.shape[0], 7):
        want = sm.encode(x[i:i + 1], p) if byp[i] else encode_folded(x[i:i + 1], mu[slot[i]], e[slot[i]], p)
        assert np.array_equal(got.codes[i], want.codes[0]) and np.array_equal(got.scales[i], want.scales[0])
        assert got.flags[i] == want.flags[0]
    # the version-3 bytes (the fp16 rule, then encode) differ
    old = sm.encode(tv.key_front_inputs(x, mu, e, slot, byp, p), p)
    assert not np.array_equal(old.codes, got.codes)


def test_key_front_is_scale_then_center():
    """key_front == center(scale_keys(x, 2^e), RN16(mu 2^e)) (FORMAT.md 8), and the
    documented exact corners: (-0) - (+0) = -0, x - x = +0, overflow saturates."""
    from sim_models.keyscale import front_table, key_front, pow2_scales, scale_keys
    p = FormatParams(n=8, block=8)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((50, 8)).astype(np.float16).view(np.uint16)
    mu = rng.standard_normal(8).astype(np.float16)
    e = np.array([-14, -1, 3, 15, 0, 0, -7, 7])
    want = sm.center(scale_keys(x, pow2_scales(e), p), scale_keys(mu, pow2_scales(e), p), p)
    assert np.array_equal(key_front(x, front_table(mu, e, p), e, p), want)
    x = np.array([[0x8000, 0x3C00, 0x7BFF, 0x7E00, 0x8000, 0x0001, 0x0003, 0xFC00]], np.uint16)
    mu_s = np.array([0, 0x4000, 0xFBFF, 0, 0x8000, 0, 0, 0x3C00], np.uint16)
    got = key_front(x, mu_s, np.array([0, 1, 1, 0, 0, -1, -1, 3]), p)
    # -0, +0 (exact cancellation), max (overflow), NaN kept, (-0)-(-0) = +0, subnormal
    # ties 0.5 ulp -> 0 and 1.5 ulp -> 2 (even), -inf kept
    assert got.tolist() == [[0x8000, 0, 0x7BFF, 0x7E00, 0, 0, 2, 0xFC00]]
    with pytest.raises(ValueError, match="log2_s"):
        key_front(x, mu_s, np.array([0, 0, 16, 0, 0, 0, 0, 0]), p)
    with pytest.raises(ValueError, match="dtype"):
        key_front(x, mu_s, np.zeros(8), FormatParams(n=8, block=8, dtype="bf16"))


def test_cli_roundtrip(tmp_path):
    from sim_models.__main__ import main
    x = np.random.default_rng(9).standard_normal((6, 64)).astype(F16)
    np.save(tmp_path / "x.npy", x)
    assert main(["encode", str(tmp_path / "x.npy"), str(tmp_path / "e.npz"), "--bits", "4"]) == 0
    assert main(["decode", str(tmp_path / "e.npz"), str(tmp_path / "y.npy")]) == 0
    y = np.load(tmp_path / "y.npy")
    p = FormatParams(n=64, bits=4)
    e = sm.encode(x, p)
    assert y.dtype == F16 and np.array_equal(y.view(np.uint16), sm.decode(e.codes, e.scales, p))


def test_cli_errors(tmp_path, capsys):
    from sim_models.__main__ import main
    np.save(tmp_path / "x.npy", np.zeros((2, 80), F16))
    assert main(["encode", str(tmp_path / "x.npy"), str(tmp_path / "e.npz")]) == 2
    assert "power of two" in capsys.readouterr().err
    np.save(tmp_path / "f.npy", np.zeros((2, 64), np.float32))
    assert main(["encode", str(tmp_path / "f.npy"), str(tmp_path / "e.npz")]) == 2
    assert "dtype" in capsys.readouterr().err
    assert main(["decode", str(tmp_path / "missing.npz"), str(tmp_path / "y.npy")]) == 2


def test_encode_trace_checks_its_input():
    x = np.random.default_rng(10).standard_normal((3, 128)).astype(F16)
    a, b = sm.encode_trace(x, FormatParams()), sm.encode_trace(x.view(np.uint16), FormatParams())
    assert np.array_equal(a.codes, b.codes)                    # float16 is read as values, like encode
    with pytest.raises(TypeError):
        sm.encode_trace(x.astype(np.float32), FormatParams())
    with pytest.raises(TypeError):
        sm.encode_trace(x.view(np.uint16).astype(np.int64), FormatParams())
    with pytest.raises(ValueError):
        sm.encode_trace(x[:, :64], FormatParams())


def test_numpy_integers_are_accepted_as_params():
    p = FormatParams(n=np.int64(128), block=np.int32(64), bits=np.uint8(3), sign_seed=np.uint64(5))
    assert p == FormatParams(sign_seed=5) and type(p.n) is int and type(p.sign_seed) is int
    with pytest.raises(TypeError):
        FormatParams(n=np.bool_(True))


def test_cli_decode_refuses_foreign_files(tmp_path, capsys):
    import json

    from sim_models.__main__ import main
    np.save(tmp_path / "x.npy", np.zeros((2, 64), F16))
    assert main(["decode", str(tmp_path / "x.npy"), str(tmp_path / "y.npy")]) == 2
    assert "not an .npz" in capsys.readouterr().err
    e = sm.encode(np.ones((2, 64), F16), FormatParams(n=64))
    d = FormatParams(n=64).to_dict()
    d["format_version"] = 99
    np.savez(tmp_path / "v.npz", codes=e.codes, scales=e.scales, params=np.array(json.dumps(d)))
    assert main(["decode", str(tmp_path / "v.npz"), str(tmp_path / "y.npy")]) == 2
    assert "format_version 99" in capsys.readouterr().err
    np.savez(tmp_path / "n.npz", codes=e.codes)
    assert main(["decode", str(tmp_path / "n.npz"), str(tmp_path / "y.npy")]) == 2
    assert "lacks" in capsys.readouterr().err
