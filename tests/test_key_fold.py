"""The folded key front end (sim_models.bfp.to_block_fp_keys): the key scale 2^e and the
centering mu_s inside block floating point, a study of a format change beside FORMAT.md 8."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sim_models import FLAG_INF, FLAG_NAN, FormatParams, encode, sign_mask
from sim_models.bfp import to_block_fp, to_block_fp_keys
from sim_models.codec import encode_folded

F16_MAX = 65504.0


def _h(*vals) -> np.ndarray:
    """fp16 bit patterns of the values (exact in fp16) or of given uint16 patterns."""
    return np.array([v if isinstance(v, int) else np.float16(v).view(np.uint16) for v in vals],
                    np.uint16)


def _f64(bits: np.ndarray) -> np.ndarray:
    return bits.view(np.float16).astype(np.float64)


def test_hand_computed_vector():
    # N = 8, M = 12, no sign flip. Lanes (k, e, mu_s):
    #   0: 1.5 (E 15, sig 1536),  e 1  -> Ex 16;  mu 1.0  (Em 15, m 1024)
    #   1: -2.0 (E 16, sig 1024), e 0  -> Ex 16;  mu 0.5  (Em 14, m 1024)
    #   2: 0.25 (E 13, sig 1024), e -1 -> Ex 12;  mu +0   (Em 1, m 0)
    #   3: +0 (E 1, sig 0),       e 3  -> Ex 4;   mu -0.75 (Em 14, m 1536)
    #   4: 3.0 (E 16, sig 1536),  e 0  -> Ex 16;  mu 3.0  (exact cancellation)
    #   5: 1 + 2^-10 (sig 1025),  e 0  -> Ex 15;  mu +0   (1025 / 4 = 256.25 -> 256)
    #   6: -(1 + 2^-9) (sig 1026), e 0 -> Ex 15;  mu +0   (1026 / 4 = 256.5 -> 257, a tie away)
    #   7: NaN, e 5, mu 2.0: passes as +0 (e and mu ignored), FLAG_NAN
    # emax = max(Ex, Em) + 1 = 16 + 1 = 17; u = 17 - 15 - 12 + 2 = -8; sh = 17 - exponent.
    #   X = 768, -512, 32, 0, 768, 256, -257, 0;  MU = 256, 128, 0, -192, 768, 0, 0, 0
    p = FormatParams(n=8, block=8, sign_seed=None)
    k = _h(1.5, -2.0, 0.25, 0.0, 3.0, 0x3C01, 0xBC02, 0x7E00)[None]
    mu = _h(1.0, 0.5, 0.0, -0.75, 3.0, 0.0, 0.0, 2.0)
    e = np.array([1, 0, -1, 3, 0, 0, 0, 5])
    x, u, flags = to_block_fp_keys(k, mu, e, p, np.zeros(8, np.uint8))
    assert x.tolist() == [[512, -640, 32, 192, 0, 256, -257, 0]]
    assert u.tolist() == [-8]
    assert flags.tolist() == [FLAG_NAN]
    # the sign flip negates the lanes of its mask, after the subtraction
    mask = sign_mask(8, 0)
    xd, ud, _ = to_block_fp_keys(k, mu, e, p, mask)
    assert np.array_equal(xd, np.where(mask == 1, -x, x)) and np.array_equal(ud, u)


def test_clamp_edge():
    p = FormatParams(n=8, block=8, sign_seed=None)
    z = np.zeros(8, np.uint8)
    # +-65504 against -+65504: X = 1024 (2047 / 2 rounded), MU = -1024, X - MU = 2048 -> 2047
    k = _h(F16_MAX, -F16_MAX, F16_MAX, 1.0, 0.0, 0.0, 0.0, 0.0)[None]
    mu = _h(-F16_MAX, F16_MAX, -32752.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    x, u, _ = to_block_fp_keys(k, mu, np.zeros(8, int), p, z)
    assert u.tolist() == [31 - 25]
    # lane 2: 1024 + round(2047 / 4) = 1024 + 512 = 1536, no clamp; lane 3: 1 = 2^10 * 2^-16 -> 0
    # (2^-16 units of 2^6: 1.0 / 64 = 0.015625 units -> 0)
    assert x[0, :4].tolist() == [2047, -2047, 1536, 0]


def test_scaled_overflow_saturates_like_rn16():
    p = FormatParams(n=8, block=8, sign_seed=None)
    z = np.zeros(8, np.uint8)
    # 49152 * 2 = 98304 >= 2^16: the lane is read as 65504 (Ex 30, sig 2047), as RN16(k 2^e)
    k = _h(49152.0, -49152.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0)[None]
    mu = _h(*[0.0] * 8)
    e = np.array([1, 15, 15, 0, 0, 0, 0, 0])
    x, u, flags = to_block_fp_keys(k, mu, e, p, z)
    ref, uref, _ = to_block_fp_keys(_h(F16_MAX, -F16_MAX, 16384.0, 0, 0, 0, 0, 0)[None], mu,
                                    np.zeros(8, int), p, z)
    assert np.array_equal(x, ref) and np.array_equal(u, uref) and flags.tolist() == [0]


def test_special_lanes_pass_unscaled_and_uncentered():
    p = FormatParams(n=8, block=8, sign_seed=None)
    z = np.zeros(8, np.uint8)
    k = _h(0x7C00, 0xFC00, 0x7E01, 0xFE00, 1.0, -3.0, 0.0, 2.0)[None]
    mu = _h(100.0, -7.0, 3.0, -2.0, 0.25, 0.5, 0.0, 0.0)
    e = np.array([-14, 15, 4, -3, 0, 1, 0, 0])
    x, u, flags = to_block_fp_keys(k, mu, e, p, z)
    # the same as +-65504 / +0 lanes read with e = 0, mu = +0
    k2 = _h(F16_MAX, -F16_MAX, 0.0, 0.0, 1.0, -3.0, 0.0, 2.0)[None]
    mu2 = _h(0.0, 0.0, 0.0, 0.0, 0.25, 0.5, 0.0, 0.0)
    e2 = np.array([0, 0, 0, 0, 0, 1, 0, 0])
    x2, u2, flags2 = to_block_fp_keys(k2, mu2, e2, p, z)
    assert np.array_equal(x, x2) and np.array_equal(u, u2)
    assert flags.tolist() == [FLAG_NAN | FLAG_INF] and flags2.tolist() == [0]
    assert x[0, 0] == 1024 and x[0, 1] == -1024 and x[0, 2] == 0 and x[0, 3] == 0


def test_identity_tables_equal_the_plain_block_fp_one_bit_wider():
    # with e = 0 and mu = +0 the folded rule at M + 1 is 3.3 at M (the headroom bit is the
    # extra mantissa bit): same x, same u, same flags, so the same bytes after it
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 1 << 16, (64, 64), dtype=np.uint64).astype(np.uint16)
    bits[::7, 3] = 0x7C00
    bits[::5, 9] = 0xFE01
    p12, p13 = FormatParams(n=64), FormatParams(n=64, mant_bits=13)
    mask = sign_mask(64, 0)
    x, u, f = to_block_fp(bits, p12, mask)
    xk, uk, fk = to_block_fp_keys(bits, np.zeros(64, np.uint16), np.zeros(64, int), p13, mask)
    assert np.array_equal(x, xk) and np.array_equal(u, uk) and np.array_equal(f, fk)
    a, b = encode(bits, p12), encode_folded(bits, np.zeros(64, np.uint16), np.zeros(64, int), p13)
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
    assert np.array_equal(a.flags, b.flags)


def _finite(bits: np.ndarray) -> np.ndarray:
    return np.where(((bits >> 10) & 0x1F) == 0x1F, bits & 0x83FF, bits).astype(np.uint16)


@settings(max_examples=300)
@given(hnp.arrays(np.uint16, (3, 16)), hnp.arrays(np.uint16, (16,)),
       hnp.arrays(np.int64, (16,), elements=st.integers(-14, 15)),
       st.sampled_from([8, 12, 16]))
def test_within_one_unit_of_scaled_minus_centre(k, mu, e, m):
    """x 2^u is within one unit of sat(k 2^e) - mu_s (float64, exact), or clamped."""
    k, mu = _finite(k), _finite(mu)
    p = FormatParams(n=16, block=16, mant_bits=m)
    mask = sign_mask(16, 0)
    x, u, flags = to_block_fp_keys(k, mu, e, p, mask)
    assert flags.tolist() == [0, 0, 0]
    y = np.where(mask == 1, -x, x).astype(np.float64)
    r = _f64(k) * np.exp2(e)
    r = np.where(np.abs(r) >= 2.0 ** 16, np.sign(r) * F16_MAX, r)
    ref = (r - _f64(mu)) / np.exp2(u.astype(np.float64))[:, None]        # in units
    lim = (1 << (m - 1)) - 1
    clamped = np.abs(y) == lim
    assert np.all(np.abs(y - ref)[~clamped] <= 1.0)
    # a clamp only where the exact difference is beyond the range
    assert np.all(np.abs(ref)[clamped] >= lim - 1.0)
    assert np.all(np.sign(y[clamped]) == np.sign(ref[clamped]))
    # the exponent keeps version 3's range: u <= 31 - bias - M + 2
    assert np.all(u <= 31 - 15 - m + 2)


def test_errors_name_the_parameter():
    p = FormatParams(n=8, block=8)
    k = _h(*[1.0] * 8)[None]
    z, mu, e = np.zeros(8, np.uint8), np.zeros(8, np.uint16), np.zeros(8, int)
    with pytest.raises(ValueError, match="dtype"):
        to_block_fp_keys(k, mu, e, FormatParams(n=8, block=8, dtype="bf16"), z)
    with pytest.raises(ValueError, match="mu_s"):
        to_block_fp_keys(k, _h(*[0.0] * 7, 0x7C00), e, p, z)
    with pytest.raises(TypeError, match="mu_s"):
        to_block_fp_keys(k, np.zeros(8, np.float32), e, p, z)
    with pytest.raises(ValueError, match="log2_s"):
        to_block_fp_keys(k, mu, np.full(8, 16), p, z)
    with pytest.raises(ValueError, match="log2_s"):
        to_block_fp_keys(k, mu, np.full(8, 0.5), p, z)
    with pytest.raises(ValueError, match="broadcast"):
        to_block_fp_keys(k, np.zeros(4, np.uint16), e, p, z)
