"""Peer KV-cache formats of the accuracy study (bench/accuracy/peers.py): each against a small
hand-computed case, their byte counts, and the windowed attention KIVI needs."""

import math

import numpy as np
import pytest

from bench.accuracy.configs import PEER_STUDY, by_name
from bench.accuracy.peers import (BF16, FP8PerTensor, KiviKey, KiviValue, Octave, TurboQuantKey,
                                  UniformAsym, lloyd_max_levels, octave_block_quantize,
                                  octave_lut, slot_bits)


def test_fp8_per_tensor_rounds_to_e4m3_and_saturates():
    x = np.array([0.3, 17.0, 19.0, 500.0, -1000.0, 2.0 ** -9, 0.0], dtype=np.float32)
    # 0.3 lies between 0.28125 and 0.3125 (step 2^-5 in [0.25, 0.5)): nearer 0.3125; 17 is a
    # tie of 16 and 18 -> even mantissa 16; 19 -> 20 (tie of 18 and 20, even); +-448 saturate;
    # 2^-9 is the smallest subnormal
    want = [0.3125, 16.0, 20.0, 448.0, -448.0, 2.0 ** -9, 0.0]
    np.testing.assert_array_equal(FP8PerTensor().roundtrip(x), want)
    np.testing.assert_array_equal(FP8PerTensor(scale=2.0).roundtrip(x[:2]), [0.3125, 16.0])
    assert FP8PerTensor().vector_bytes(64, 2048, 3) == 64 + 4 / (2048 * 3)
    with pytest.raises(ValueError, match="scale"):
        FP8PerTensor(scale=0.0)


def test_bf16_keeps_eight_significant_bits():
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -7], dtype=np.float32)
    np.testing.assert_array_equal(BF16().roundtrip(x), [1.0, 1 + 2 ** -6, 1 + 2 ** -7])
    assert BF16().vector_bytes(128, 10, 1) == 256


def test_uniform_asym_value_store():
    x = np.array([[0.0, 1.0, 2.0, 3.1]])
    s16 = float(np.float16(3.1 / 3))                 # fp16 scale the decoder reads
    # codes floor(x / s + 0.5) = 0, 1, 2, 3
    np.testing.assert_allclose(UniformAsym(2).roundtrip(x)[0], [0, s16, 2 * s16, 3 * s16],
                               rtol=1e-6)
    assert UniformAsym(3).vector_bytes(128, 1, 1) == 48 + 4
    assert UniformAsym(4).vector_bytes(64, 1, 1) == 32 + 4


def test_turboquant_key_hand_case_and_norm_correction():
    # d = 4: x = (2, 0, 0, 0) -> unit vector (1,0,0,0) -> H/2 rotation: all 0.5 -> nearest
    # level of N(0, 1/4): 0.7560 / 2 = 0.378 (the 0.378 / 0.672 midpoint is 0.525)
    x = np.array([[2.0, 0.0, 0.0, 0.0]])
    lv = lloyd_max_levels(3) / 2
    assert abs(lv[5] - 0.378) < 1e-3
    raw = TurboQuantKey(3, norm_correction=False).roundtrip(x)[0]
    # decode: c = 0.378 per lane, c H/2 = (0.756, 0, 0, 0), times the norm 2
    np.testing.assert_allclose(raw, [4 * lv[5], 0, 0, 0], atol=1e-6)
    # norm correction: c / |c| = all 0.5 -> exactly (1, 0, 0, 0) * 2
    np.testing.assert_allclose(TurboQuantKey(3).roundtrip(x)[0], [2, 0, 0, 0], atol=1e-6)
    assert TurboQuantKey(3).vector_bytes(128, 1, 1) == 48 + 2


def test_octave_tables_are_the_published_int8_codebooks():
    assert octave_lut(3).tolist() == [-127, -79, -45, -14, 14, 45, 79, 127]
    assert octave_lut(4).tolist()[8:] == [6, 18, 30, 43, 58, 74, 95, 126]


def test_octave_block_scale_hand_case_and_inner_product():
    # x = (1, -1, 1, -1): rms 1, x * 59 = +-59 -> nearest code +-45 (the 45/79 midpoint is 62);
    # x . LUT = 180, |x|^2 = 4 -> scale 4 / 180 * 64, x_hat = 45 * scale / 64 = 1
    x = np.array([[1.0, -1.0, 1.0, -1.0]])
    codes, s = octave_block_quantize(x, 3)
    assert octave_lut(3)[codes[0]].tolist() == [45, -45, 45, -45]
    assert s[0, 0] == np.float16(4 / 180 * 64)
    rng = np.random.default_rng(0)
    for blk, bits in ((0, 3), (64, 4)):
        y = rng.standard_normal((200, 128)) * rng.uniform(0.1, 10, (200, 1))
        yh = Octave(bits, blk, 8).roundtrip(y).astype(np.float64)
        np.testing.assert_allclose((y * yh).sum(-1), (y * y).sum(-1), rtol=2e-3)


def test_kivi_key_groups_tokens_per_channel():
    # one head, 5 tokens, 2 channels, groups of 2 tokens, 2 bits: channel 0 of tokens 0..1 is
    # (0, 3): min 0, scale 1, exact; channel 1 (1, 2): scale fp16(1/3), code 3 -> 1 + 3 * that;
    # the 5th token (no full group) stays
    x = np.array([[[[0.0, 1.0], [3.0, 2.0], [0.0, 0.0], [1.5, 3.0], [0.7, 0.9]]]])
    out = KiviKey(2, 2, 4).roundtrip(x)[0, 0]
    np.testing.assert_allclose(out[:2], [[0, 1], [3, 1 + 3 * float(np.float16(1 / 3))]],
                               rtol=1e-6)
    # tokens 2..3, channel 0: (0, 1.5): scale 0.5 -> exact; channel 1: (0, 3) exact
    np.testing.assert_allclose(out[2:4], [[0, 0], [1.5, 3]])
    np.testing.assert_allclose(out[4], [0.7, 0.9], rtol=1e-6)
    m = KiviKey(2, 2, 4).full_mask(np.arange(10), np.arange(10))
    assert m[5, 4] and not m[5, 3] and m[3, 0] and not m[8, 7] and m[8, 8]


def test_kivi_value_window_and_bytes():
    m = KiviValue(2, 32, 4).full_mask(np.arange(12), np.arange(12))
    assert m[10, 6] and not m[10, 5] and m[2, 0]
    x = np.array([[0.0, 1.0, 2.0, 3.0, 10.0, 10.0, 10.0, 13.0]])
    # groups of 4 channels: (0..3) scale 1 exact; (10, 10, 10, 13) scale 1 exact
    np.testing.assert_allclose(KiviValue(2, 4, 0).roundtrip(x), x)
    # KIVI-2 at D = 64, 2048 tokens: 16 code bytes + 4 bytes per 32 elements = 24 bytes per
    # quantized vector; keys all flushed, values: 128 fp16 tokens
    assert KiviKey(2, 32, 128).vector_bytes(64, 2048, 1) == 24
    assert KiviValue(2, 32, 128).vector_bytes(64, 2048, 1) == (1920 * 24 + 128 * 128) / 2048


def test_slot_bits_pads_octave_and_counts_turboquant_layout():
    # octave_k3v3_compact: 48 + 48 code bytes + 2 fp16 scales = 100 bytes (4-aligned) at D=128
    assert slot_bits(Octave(3, 0, 4), Octave(3, 0, 4), 128, 2048, 2) == 100 * 8 / 256
    # block K at D = 64: 32 + 2 (4-bit K, one 64-dim block) + 24 + 2 = 60 -> 64 bytes
    assert slot_bits(Octave(4, 64, 8), Octave(3, 0, 8), 64, 2048, 3) == 4.0
    # turboquant_3bit_nc: 50 + 52 bytes at D = 128 (vLLM's 3.19 bits)
    assert slot_bits(TurboQuantKey(3), UniformAsym(3), 128, 2048, 2) == 102 * 8 / 256
    assert slot_bits(None, None, 64, 1, 1) == 16


def test_peer_configurations_count_bf16_boundary_layers():
    cfg = {c.name: c for c in by_name(PEER_STUDY)}
    tq = cfg["tq-3bit-nc"]
    assert tq.boundary_layers(28) == [0, 1, 26, 27]
    assert tq.bits(28, 2, 128, 2048) == pytest.approx((24 * 102 * 8 / 256 + 4 * 16) / 28)
    assert tq.bits(30, 3, 64, 2048) == pytest.approx((26 * 54 * 8 / 128 + 4 * 16) / 30)
    assert isinstance(tq.quantizer(27, "v", 128, n_layers=28), BF16)
    assert isinstance(tq.quantizer(2, "v", 128, n_layers=28), UniformAsym)
    assert cfg["kivi-2"].bits(30, 3, 64, 2048) == pytest.approx((3.0 + 30.5 * 8 / 64) / 2)
    assert cfg["fp8-e4m3"].policy(64) is None and cfg["fp8-e4m3"].table_bytes(30, 3, 64) == 0
    specs = {c.spec_hash() for c in cfg.values()}
    assert len(specs) == len(cfg)


def test_windowed_attention_mixes_full_and_quantized_tokens():
    torch = pytest.importorskip("torch")
    from bench.accuracy.attention import windowed_attention
    g = torch.Generator().manual_seed(0)
    b, hq, h, t, d = 1, 4, 2, 9, 8
    q = torch.randn(b, hq, t, d, generator=g)
    kf, kh = torch.randn(b, h, t, d, generator=g), torch.randn(b, h, t, d, generator=g)
    vf, vh = torch.randn(b, h, t, d, generator=g), torch.randn(b, h, t, d, generator=g)
    kfn = KiviKey(2, 2, 4).full_mask
    vfn = KiviValue(2, 2, 3).full_mask
    out = windowed_attention(q, kf, kh, vf, vh, None, kfn, vfn, scaling=0.3, chunk=4)
    # brute force, one query at a time
    for i in range(t):
        for hh in range(hq):
            kv = hh // (hq // h)
            ks = torch.stack([kf[0, kv, j] if kfn(np.array([i]), np.array([j]))[0, 0]
                              else kh[0, kv, j] for j in range(i + 1)])
            vs = torch.stack([vf[0, kv, j] if vfn(np.array([i]), np.array([j]))[0, 0]
                              else vh[0, kv, j] for j in range(i + 1)])
            p = torch.softmax(ks @ q[0, hh, i] * 0.3, dim=0)
            torch.testing.assert_close(out[0, i, hh], p @ vs, rtol=1e-5, atol=1e-6)
    # no window: plain causal attention over the quantized tokens (sdpa)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, kh.repeat_interleave(2, 1), vh.repeat_interleave(2, 1), is_causal=True, scale=0.3)
    torch.testing.assert_close(windowed_attention(q, kf, kh, vf, vh, None, None, None, 0.3),
                               ref.transpose(1, 2), rtol=1e-5, atol=1e-6)


def test_peer_arguments_are_checked():
    with pytest.raises(ValueError, match="residual"):
        KiviKey(2, 32, 100)
    with pytest.raises(ValueError, match="bits"):
        Octave(2)
    with pytest.raises(ValueError, match="power of two"):
        TurboQuantKey(3).roundtrip(np.ones((1, 6)))
    assert math.isclose(lloyd_max_levels(2)[-1], 1.5104, abs_tol=1e-4)


def test_peers_table_cites_sources_and_counts_windows(tmp_path):
    from bench.accuracy.configs import PEER_SOURCES
    from bench.accuracy.report import peers_plot, peers_table
    wins = [{"name": "@1"}, {"name": "@2"}]

    def run(ppl, bits=3.0):
        return {"ppl": ppl, "bits": bits, "kl": 0.01}
    res = {"meta": {"windows": wins, "model_id": "m"},
           "runs": {"fp16@1": run(10.0, 16), "fp16@2": run(20.0, 16),
                    "v2+C+S4+KS2@1": run(11.0, 3.15), "v2+C+S4+KS2@2": run(22.0, 3.15),
                    "kivi-2@1": run(12.1, 3.4)}}
    text = peers_table({"m": {"results": res}})
    rows = {r.split("|")[1].strip(" `"): r for r in text.splitlines()[2:]}
    assert "+10.0%" in rows["v2+C+S4+KS2"] and "3.150" in rows["v2+C+S4+KS2"]
    assert "+21.0% (1 of 2 windows)" in rows["kivi-2"]
    assert "-- | --" in rows["tq-3bit-nc"]
    for n, (label, url) in PEER_SOURCES.items():
        assert f"[{label}]({url})" in rows[n]
    peers_plot({"m": {"results": res}}, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
