"""Per-model key treatments of the golden model: per-channel key scales, calibrated
per-(layer, kv head) sign masks and post-FWHT 4x4 rotations."""

import numpy as np
import pytest

from sim_models import (CachePolicy, FormatParams, HeadTransform, decode_float, encode,
                        encode_trace, fwht, scale_keys, sign_mask)
from sim_models.keyscale import pow2_scales
from sim_models.transform import (ROT_FRAC, fixed_rotation, identity_rotation,
                                  random_rotations, rotate_forward)


def _keys(n, v=512, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((v, n)) * np.linspace(0.2, 3.0, n)       # unequal channels
    return x.astype(np.float16)


def test_scale_keys_pow2_is_exact_and_fp16_rounds_once():
    x = _keys(64)
    x = (np.sign(x) * np.maximum(np.abs(x), 0.01)).astype(np.float16)   # no fp16 subnormals
    e = np.random.default_rng(2).integers(-3, 4, 64)
    s = pow2_scales(e)
    y = scale_keys(x, s, FormatParams(n=64)).view(np.float16)
    assert np.array_equal(y.astype(np.float64), x.astype(np.float64) * np.exp2(e))
    s2 = np.full(64, 1.3, np.float16)
    y2 = scale_keys(x, s2, FormatParams(n=64)).view(np.float16)
    assert np.array_equal(y2, (x.astype(np.float64) * float(s2[0])).astype(np.float16))
    xs = x.copy()
    xs[0, 0] = np.nan
    assert np.isnan(scale_keys(xs, s, FormatParams(n=64)).view(np.float16)[0, 0])
    with pytest.raises(ValueError, match="positive"):
        scale_keys(x, np.zeros(64, np.float16), FormatParams(n=64))
    with pytest.raises(ValueError, match="log2_s"):
        pow2_scales(np.array([20]))


def test_head_transform_defaults_are_the_plain_format():
    p = FormatParams(n=64)
    x = _keys(64)
    a = encode(x, p)
    t = HeadTransform(signs=sign_mask(64, p.sign_seed), rot=identity_rotation(64))
    b = encode(x, p, t)
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
    # an explicit mask is the same as the seed that generates it
    c = encode(x, FormatParams(n=64, sign_seed=7))
    d = encode(x, p, HeadTransform(signs=sign_mask(64, 7)))
    assert np.array_equal(c.codes, d.codes) and np.array_equal(c.scales, d.scales)
    assert np.array_equal(decode_float(c.codes, c.scales, FormatParams(n=64, sign_seed=7)),
                          decode_float(d.codes, d.scales, p,
                                       t=HeadTransform(signs=sign_mask(64, 7))))


@pytest.mark.parametrize("n", [64, 256])
def test_rotation_round_trip_and_query_side(n):
    p = FormatParams(n=n)
    rng = np.random.default_rng(3)
    r = fixed_rotation(random_rotations(n // 4, rng))
    t = HeadTransform(signs=sign_mask(n, 5), rot=r)
    x = _keys(n)
    e = encode(x, p, t)
    xh = decode_float(e.codes, e.scales, p, t=t)
    rel = np.sum((xh - x) ** 2) / np.sum(x.astype(np.float64) ** 2)
    assert rel < 0.05                                # 3-bit error, not garbage
    # decoding without the rotation is wrong (the rotation is really applied)
    wrong = decode_float(e.codes, e.scales, p, t=HeadTransform(signs=sign_mask(n, 5)))
    assert np.sum((wrong - x) ** 2) / np.sum(x.astype(np.float64) ** 2) > 5 * rel
    # the kernel's query side: q~ = R H D q / 2^ROT_FRAC, q.x_hat = q~.yhat / N
    q = rng.standard_normal(n)
    d = np.where(sign_mask(n, 5) == 1, -1.0, 1.0)
    hq = fwht(q * d).reshape(n // 4, 4)
    qt = np.einsum("bij,bj->bi", r.astype(np.float64), hq).reshape(n) / 2 ** ROT_FRAC
    from sim_models.quant import dequantize
    from sim_models.pack import unpack_codes
    yhat = dequantize(unpack_codes(e.codes, n, 3, True), e.scales, p)
    assert np.allclose(yhat @ qt / n, xh @ q, rtol=1e-9, atol=1e-9)


def test_rotation_rule_is_integer_and_bounded():
    rng = np.random.default_rng(4)
    r = fixed_rotation(random_rotations(16, rng))
    y = rng.integers(-2 ** 18, 2 ** 18, (100, 64)).astype(np.int64)
    out = rotate_forward(y, r)
    assert out.dtype == np.int64
    assert np.abs(out).max() <= 2 * np.abs(y).max()
    tr = encode_trace(_keys(64), FormatParams(n=64), HeadTransform(rot=r))
    assert np.abs(tr.y).max() < 2 ** (FormatParams(n=64).fwht_width + 1)


def test_transform_validation_names_the_field():
    with pytest.raises(TypeError, match="signs"):
        HeadTransform(signs=np.zeros(64, np.int32))
    with pytest.raises(ValueError, match="signs"):
        HeadTransform(signs=np.full(64, 2, np.uint8))
    with pytest.raises(TypeError, match="rot"):
        HeadTransform(rot=np.zeros((16, 4, 4), np.int32))
    with pytest.raises(ValueError, match="rot"):
        encode(_keys(64), FormatParams(n=64), HeadTransform(rot=identity_rotation(128)))
    with pytest.raises(TypeError, match="HeadTransform"):
        encode(_keys(64), FormatParams(n=64), "signs")


def test_policy_tables_and_key_scale_field():
    pol = CachePolicy(center_keys=True, key_scale="pow2", key_signs=True, key_rot=True)
    assert pol.table_bytes(30, 3, 64) == 30 * 3 * (128 + 64 + 8 + 16 * 32)
    assert CachePolicy().table_bytes(30, 3, 64) == 0
    assert pol.bits_per_element(30, 3, 128, 2048) == CachePolicy().bits_per_element(30, 3, 128, 2048)
    with pytest.raises(ValueError, match="key_scale"):
        CachePolicy(key_scale="log")


def test_scale_then_center_equals_center_then_scale_for_powers_of_two():
    """The policy order (scale, then center by RN16(mu s): the write kernel's key front end) and the
    other order agree for power-of-two scales away from fp16 subnormals."""
    from sim_models import center
    p = FormatParams(n=64)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((256, 64)) * 4 + 1).astype(np.float16)
    mu = (rng.standard_normal(64) * 0.01 + 1).astype(np.float16)   # |x - mu| >> 2^-14 mostly
    s = pow2_scales(rng.integers(-2, 3, 64))
    a = center(scale_keys(x, s, p), scale_keys(mu, s, p), p)
    b = scale_keys(center(x, mu, p), s, p)
    ok = np.abs(x.astype(np.float64) - mu) > 2.0 ** -10
    assert np.array_equal(a[ok], b[ok]) and ok.mean() > 0.95
