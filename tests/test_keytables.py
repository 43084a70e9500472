"""sim_models.KeyTables: format version 3's key front end and its per-model tables.

The front end ``RNE(RN16(k s) - RN16(mu s))`` against an independent float64 oracle on corner
inputs (overflow, subnormal results, exact cancellation, NaN/inf); the query-aware exponents; the
table file (round trip, model id and shape checked); the committed tables equal what the
calibration files give; the policy presets and their specs; the serving cache takes the tables.
"""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from sim_models import CachePolicy, FormatParams, KeyTables, center, scale_keys
from sim_models.keytables import LOG2_S_MAX, qaware_log2_scales
from sim_models.policy import POLICY_PRESETS

CALIB = Path(__file__).resolve().parents[1] / "bench" / "calib"
FMAX = 65504.0


def rne16(v: np.ndarray) -> np.ndarray:
    """float64 -> fp16 bits, round to nearest even, saturating to +-65504 (finite inputs)."""
    with np.errstate(over="ignore"):
        h = v.astype(np.float16)
    h = np.where(np.isinf(h), np.sign(v) * np.float16(FMAX), h).astype(np.float16)
    return h.view(np.uint16)


def oracle(k: np.ndarray, mu: np.ndarray, e: np.ndarray) -> np.ndarray:
    """The front end computed in float64 with one rounding per step (FORMAT.md 8)."""
    kf = k.astype(np.float64)
    s = np.exp2(e.astype(np.float64))
    ks = rne16(kf * s).view(np.float16).astype(np.float64)
    mus = rne16(mu.astype(np.float64) * s).view(np.float16).astype(np.float64)
    out = rne16(ks - mus)
    return np.where(np.isfinite(kf), out, k.view(np.uint16)).astype(np.uint16)


def tables(L=2, H=3, D=64, seed=0, scaled=True):
    rng = np.random.default_rng(seed)
    mu = rng.standard_normal((L, H, D)) * 4
    mu[0, 0] *= 1e-6                                  # fp16 subnormal mu: subnormal differences
    mu = mu.astype(np.float16)
    e = rng.integers(-4, 5, (L, H, D)).astype(np.int8) if scaled else None
    return KeyTables("tiny", mu, e)


def corner_keys(D: int, rng) -> np.ndarray:
    vals = np.array([0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, 40000.0, 6e-8, -6e-8, 6.1e-5,
                     1e-7, 3.0e-5, np.inf, -np.inf, np.nan, 4096.0, 2049.0], np.float64)
    k = rng.choice(vals, (64, D)).astype(np.float16)
    k[::3] = (rng.standard_normal((len(k[::3]), D)) * 10).astype(np.float16)
    return k


def test_front_end_matches_float64_oracle_on_corners():
    t = tables()
    rng = np.random.default_rng(1)
    hit_sat = hit_sub = hit_zero = 0
    for layer in range(2):
        for head in range(3):
            k = corner_keys(64, rng)
            mu_s = t.scaled_mu()[layer, head].view(np.float16)
            k[5] = (mu_s.astype(np.float64) / np.exp2(t.log2_s[layer, head].astype(np.float64))
                    ).astype(np.float16)                                 # exact cancellation row
            got = t.front_end(k, layer, head)
            want = oracle(k, t.mu[layer, head], t.log2_s[layer, head])
            assert np.array_equal(got, want), (layer, head)
            gf = got.view(np.float16)
            hit_sat += int((np.abs(gf) == FMAX).sum())
            hit_sub += int(((gf != 0) & (np.abs(gf) < 6.1e-5)).sum())
            hit_zero += int((got == 0).sum())
            assert not (got == 0x8000).any() or (k == np.float16(-0.0)).any()
    assert hit_sat and hit_sub and hit_zero                 # the corners were reached


def test_front_end_is_center_of_scale_keys_and_plain_without_scales():
    t = tables(scaled=False)
    k = (np.random.default_rng(2).standard_normal((8, 64)) * 3).astype(np.float16)
    p = FormatParams(n=64)
    assert np.array_equal(t.front_end(k, 1, 2), center(k, t.mu[1, 2], p))
    assert np.array_equal(t.scaled_mu(), t.mu.view(np.uint16))
    ts = tables()
    s = ts.scales()[0, 1]
    assert np.array_equal(ts.front_end(k, 0, 1), center(scale_keys(k, s, p), scale_keys(ts.mu[0, 1], s, p), p))


def test_qaware_exponents():
    L, H, Hq, D = 2, 2, 6, 8
    rng = np.random.default_rng(3)
    ke = rng.uniform(0.1, 10, (L, H, D))
    qe = rng.uniform(0.1, 10, (L, Hq, D))
    e = qaware_log2_scales(ke, qe)
    b = qe.reshape(L, H, 3, D).mean(axis=2)
    raw = 0.25 * np.log2(b / ke)
    want = np.clip(np.round(raw - raw.mean(-1, keepdims=True)), -LOG2_S_MAX, LOG2_S_MAX)
    assert e.dtype == np.int8 and np.array_equal(e, want)
    big = qaware_log2_scales(ke * 1e-12, qe)                  # clipped at +-LOG2_S_MAX
    assert np.abs(big).max() <= LOG2_S_MAX
    with pytest.raises(ValueError, match="k_energy"):
        qaware_log2_scales(ke, qe[:, :5])
    with pytest.raises(ValueError, match="log2_max"):
        qaware_log2_scales(ke, qe, log2_max=15)


@pytest.mark.parametrize("kw,exc,word", [
    (dict(model_id=""), ValueError, "model_id"),
    (dict(mu=np.zeros((2, 3, 64), np.float32)), TypeError, "mu"),
    (dict(mu=np.zeros((3, 64), np.float16)), TypeError, "mu"),
    (dict(mu=np.full((2, 3, 64), np.nan, np.float16)), ValueError, "mu"),
    (dict(log2_s=np.zeros((2, 3, 64), np.int16)), TypeError, "log2_s"),
    (dict(log2_s=np.zeros((2, 3, 32), np.int8)), TypeError, "log2_s"),
    (dict(log2_s=np.full((2, 3, 64), 16, np.int8)), ValueError, "log2_s"),
])
def test_tables_refuse_bad_fields(kw, exc, word):
    base = dict(model_id="m", mu=np.zeros((2, 3, 64), np.float16), log2_s=None)
    with pytest.raises(exc, match=word):
        KeyTables(**{**base, **kw})


def test_front_end_refuses_bad_entry_and_dtype():
    t = tables()
    k = np.zeros((1, 64), np.float16)
    with pytest.raises(IndexError, match="layer"):
        t.front_end(k, 2, 0)
    with pytest.raises(ValueError, match="dtype"):
        t.front_end(k, 0, 0, FormatParams(n=64, dtype="bf16"))


def test_file_round_trip_and_checks(tmp_path):
    t = tables()
    path = t.save(tmp_path / "tiny.keytables.npz")
    u = KeyTables.load(path, model_id="tiny", shape=(2, 3, 64))
    assert u.model_id == "tiny" and np.array_equal(u.mu.view(np.uint16), t.mu.view(np.uint16))
    assert np.array_equal(u.log2_s, t.log2_s)
    with pytest.raises(ValueError, match="not of 'other'"):
        KeyTables.load(path, model_id="other")
    with pytest.raises(ValueError, match="the model has"):
        KeyTables.load(path, shape=(2, 3, 128))
    np.savez(tmp_path / "x.npz", mu=t.mu)
    with pytest.raises(ValueError, match="not a key-tables file"):
        KeyTables.load(tmp_path / "x.npz")
    t0 = tables(scaled=False)
    assert KeyTables.load(t0.save(tmp_path / "plain.npz")).log2_s is None


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_committed_tables_are_the_calibration(model):
    """bench/calib/<model>.keytables.npz = KeyTables.from_calibration of the committed
    calibration, and the scales equal the study bench's qaware-pow2 scales."""
    with np.load(CALIB / f"{model}.npz") as z:
        calib = {k: z[k] for k in z.files}
    t = KeyTables.load(CALIB / f"{model}.keytables.npz", model_id=model,
                       shape=tuple(int(v) for v in calib["shape"][[0, 1, 3]]))
    want = KeyTables.from_calibration(calib, model)
    assert np.array_equal(t.mu.view(np.uint16), want.mu.view(np.uint16))
    assert np.array_equal(t.log2_s, want.log2_s)
    kvquant = pytest.importorskip("bench.accuracy.kvquant")
    assert np.array_equal(t.scales(), kvquant.calibrated_key_scales("qaware-pow2", calib))
    L, H, D = t.shape
    assert CachePolicy.preset("v3").table_bytes(L, H, D) == 3 * L * H * D


def test_policy_presets():
    v3 = CachePolicy.preset("v3")
    assert v3.center_keys and v3.sinks == 4 and v3.key_scale == "pow2" and v3.k == v3.v == FormatParams()
    assert CachePolicy.preset("v2") == CachePolicy()
    assert CachePolicy.preset("v3-K4V3").k.bits == 4
    assert round(v3.bits_per_element(18, 1, 256, 2048), 3) == 3.150
    assert set(POLICY_PRESETS) == {"v2", "v3", "v3-K4V3", "v4"}
    assert CachePolicy.preset("v4") == dataclasses.replace(v3, recent=16)
    with pytest.raises(ValueError, match="policy preset"):
        CachePolicy.preset("v5")
    assert CachePolicy.preset(" V3 ") == v3                    # as CachePolicy.parse: case and spaces
    hf = pytest.importorskip("gpu_ref.hf")
    assert CachePolicy.parse("v3") == v3 and CachePolicy.parse("V3-K4V3") == CachePolicy.preset("v3-K4V3")
    assert v3.spec == "K3V3+C+S4+KS2" and CachePolicy.parse("K3V3+C+S4+KS2") == v3


def test_small_head_dims_default_params_and_the_calibration_file_is_named(tmp_path):
    """head_dim 32 tables work (block clipped to N); key_front's default p follows x's last axis;
    loading the calibration statistics file instead of the tables says which file to load."""
    from sim_models.keyscale import key_front
    rng = np.random.default_rng(5)
    t = KeyTables("m", (rng.standard_normal((1, 2, 32)) * 2).astype(np.float16),
                  rng.integers(-3, 4, (1, 2, 32)).astype(np.int8))
    k = (rng.standard_normal((4, 32)) * 3).astype(np.float16)
    got = t.front_end(k, 0, 1)
    assert np.array_equal(got, oracle(k, t.mu[0, 1], t.log2_s[0, 1]))
    assert np.array_equal(key_front(k, t.scaled_mu()[0, 1], t.log2_s[0, 1]), got)
    np.savez(tmp_path / "m.npz", mu=t.mu, k_energy=np.ones((1, 2, 32)), model_id="m", shape=[1, 2, 2, 32])
    with pytest.raises(ValueError, match="m.keytables.npz"):
        KeyTables.load(tmp_path / "m.npz")


def test_policy_fit_head_dim():
    """A preset (n = 128) fitted to a 64-wide head counts one 64-lane vector per head, as the
    integrations store it; without fit the shape is refused naming head_dim and fit."""
    from sim_models.policy import fit_format
    v3 = CachePolicy.preset("v3")
    with pytest.raises(ValueError, match=r"head_dim 64.*fit\(head_dim\)"):
        v3.bits_per_element(30, 3, 64, 2048)
    fitted = v3.fit(64)
    assert fitted.k.n == fitted.v.n == 64 and fitted.k.block == 64
    # 64 codes x 3 bits + 1 scale byte = 200 bits per vector, 4 fp16 sinks per 2048 tokens
    assert fitted.bits_per_element(30, 3, 64, 2048) == pytest.approx((2044 * 200 / 64 + 4 * 16) / 2048)
    assert fitted.sinks == 4 and fitted.center_keys and fitted.key_scale == "pow2"
    assert fit_format(None, 64) is None
    assert fit_format(FormatParams(), 256).block == 64
    over = CachePolicy(layer_k=((0, FormatParams(bits=4)),)).fit(64, "bf16")
    assert over.layer_k[0][1].n == 64 and over.layer_k[0][1].dtype == "bf16"
    with pytest.raises(ValueError, match="head_dim 48"):
        v3.fit(48)
    for args, word in (((0, 1, 64, 2048), "n_layers"), ((1, 0, 64, 2048), "n_kv_heads"),
                       ((1, 1, 64, 0), "context"), ((1, 1, 64, -5), "context"), ((1, 1, 64.0, 8), "head_dim")):
        with pytest.raises(ValueError, match=word):
            fitted.bits_per_element(*args)
    with pytest.raises(ValueError, match="head_dim"):
        v3.fit("64")
    with pytest.raises(ValueError, match="layer_k"):
        CachePolicy(layer_k=(("a", None),))


@pytest.mark.parametrize("content", [b"not an npz file at all", b"", "npy"])
def test_load_of_a_file_that_is_no_npz_names_the_path(tmp_path, content):
    path = tmp_path / "t.npz"
    if content == "npy":
        with open(path, "wb") as f:
            np.save(f, np.zeros(3))
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=r"t\.npz: not a key-tables \.npz file"):
        KeyTables.load(path)


def test_encode_is_the_folded_key_front_end():
    """KeyTables.encode == encode_folded with the entry's RN16(mu s) and e (per block of N when
    N < D); front_end (side rows) keeps the fp16 rule."""
    from sim_models.codec import encode_folded
    from sim_models.keyscale import key_front
    rng = np.random.default_rng(11)
    mu = (rng.standard_normal((2, 3, 128)) * 0.5).astype(np.float16)
    t = KeyTables("m", mu, rng.integers(-4, 5, (2, 3, 128)).astype(np.int8))
    k = (rng.standard_normal((5, 128)) * 2).astype(np.float16)
    got = t.encode(k, 1, 2)
    want = encode_folded(k, t.scaled_mu()[1, 2], t.log2_s[1, 2], FormatParams(n=128, block=64))
    assert np.array_equal(got.codes[:, 0], want.codes) and np.array_equal(got.scales[:, 0], want.scales)
    p64 = FormatParams(n=64)
    half = t.encode(k, 1, 2, p64)
    assert half.codes.shape == (5, 2, p64.code_bytes)
    w2 = encode_folded(k[:, 64:], t.scaled_mu()[1, 2, 64:], t.log2_s[1, 2, 64:], p64)
    assert np.array_equal(half.codes[:, 1], w2.codes)
    assert np.array_equal(t.front_end(k, 1, 2), key_front(k, t.scaled_mu()[1, 2], t.log2_s[1, 2]))
    with pytest.raises(ValueError, match="D=128"):
        t.encode(k[:, :64], 0, 0)
    with pytest.raises(IndexError):
        t.encode(k, 2, 0)
