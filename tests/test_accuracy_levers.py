"""Lever configurations of the accuracy study (bench/accuracy/configs.py, group "lever"): the
fp16 ring of recent tokens, 4-bit keys on a share of the layers, the inner-product-preserving
block scale; hand-computed bits and masks, and properties of the quantizers."""

import math

import numpy as np
import pytest

from bench.accuracy.configs import LEVER_STUDY, Config, by_name
from bench.accuracy.kvquant import Baseline, IPScaled, golden_roundtrip, ip_roundtrip, ip_scale_bytes
from bench.accuracy.peers import KiviKey
from sim_models import FormatParams
from sim_models.minifloat import scale_encoding

V2 = dict(mode="midrise", scale_round="nearest")


def test_lever_configurations_are_named_and_run_in_the_study():
    names = [c.name for c in by_name() if c.group == "lever"]
    assert {"v3+W16", "v3+W32", "v3+W64", "v3+K4top10%", "v3+K4top25%", "v3+K4B10%",
            "v3+IP"} <= set(names)
    assert set(names) <= set(LEVER_STUDY)
    for c in by_name(names):          # every lever is the v3 policy plus the lever
        assert c.center_keys and c.sinks == 4 and c.key_scale == "pow2"
        # a ring alone is a cache policy (the ring of 16 the preset v4); calibration-chosen
        # layers and the IP scale are none
        want = {"v3+W16": "v4"}.get(c.name, f"K3V3+C+S4+KS2+W{c.recent}" if c.recent
                                    and not c.layer_k else None)
        assert c.policy_spec() == want, c.name


def test_ours_labels_are_the_presets_the_configurations_equal():
    from bench.accuracy.configs import PEER_STUDY
    from bench.accuracy.report import OURS
    assert OURS["v3+W16"] == "v4" and set(OURS) <= set(PEER_STUDY)    # --peers runs every row
    for name, preset in OURS.items():
        assert by_name([name])[0].policy_spec() == preset


def test_recent_ring_bits_are_counted_beside_the_codes_at_every_context():
    w32 = by_name(["v3+W32"])[0]
    # SmolLM2 shape: 30 layers, 3 kv heads, head_dim 64; b = 3 + 8/64 = 3.125 bits for every
    # token after the 4 fp16 sinks, plus 32 fp16 ring rows beside their codes
    assert w32.bits(30, 3, 64, 2048) == pytest.approx((36 * 16 + 2044 * 3.125) / 2048)
    assert w32.bits(30, 3, 64, 32768) == pytest.approx((36 * 16 + 32764 * 3.125) / 32768)
    # 20 tokens: the ring holds the 16 after the sinks, each also encoded
    assert w32.bits(30, 3, 64, 20) == pytest.approx((20 * 16 + 16 * 3.125) / 20)
    base = by_name(["v2+C+S4+KS2"])[0]
    assert base.bits(30, 3, 64, 2048) == pytest.approx((4 * 16 + 2044 * 3.125) / 2048)
    assert w32.spec()["recent"] == 32 and "recent" not in base.spec()
    w16 = by_name(["v3+W16"])[0]
    assert round(w16.bits(28, 2, 128, 2048), 3) == 3.275
    for ctx in (3, 20, 2048, 131072):     # the study counts what the cache policy stores
        assert w16.bits(28, 2, 128, ctx) == w16.policy(128).bits_per_element(28, 2, 128, ctx)
    # a float baseline with a ring counts it the same way
    b = Config("b", "x", Baseline(4), Baseline(4), sinks=4, recent=8)
    assert b.bits(30, 3, 64, 2048) == pytest.approx((12 * 16 + 2044 * 4.5) / 2048)


def test_recent_mask_reads_the_last_tokens_in_fp16():
    from bench.accuracy.attention import recent_mask
    m = recent_mask(2)(np.arange(4), np.arange(4))
    # the query at t reads t-1 and t in fp16 (its own key included), older ones quantized
    assert m.tolist() == [[True, True, True, True], [True, True, True, True],
                          [False, True, True, True], [False, False, True, True]]


def test_recent_ring_attention_uses_stored_domain_keys():
    """KVFakeQuant with a ring hands the windowed attention the fp16 keys in the stored
    domain (centered), and a ring as long as the sequence gives fp16 attention."""
    torch = pytest.importorskip("torch")
    from bench.accuracy.attention import KVFakeQuant, windowed_attention

    class Layer:
        layer_idx = 0
    g = torch.Generator().manual_seed(1)
    b, h, t, d = 1, 2, 6, 64
    q = torch.randn(b, 2 * h, t, d, generator=g)
    k = torch.randn(b, h, t, d, generator=g) + 3.0
    v = torch.randn(b, h, t, d, generator=g)
    mu = np.full((1, h, d), 3.0, dtype=np.float16)
    p = FormatParams(n=d, **V2)
    fq = KVFakeQuant(1, h, d, [(p, p)], mu16=mu, recent=t, metrics=False)
    _, kh, vh = fq.transform(Layer(), q, k, v, None, {})
    kf, vf, kfn, vfn = fq.pending
    np.testing.assert_allclose(kf.numpy(), (k.numpy().astype(np.float16) - np.float16(3.0))
                               .astype(np.float32), atol=1e-3)
    assert not np.allclose(kh.numpy(), kf.numpy(), atol=1e-3)     # quantized differs
    out = windowed_attention(q, kf, kh, vf, vh, None, kfn, vfn)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, (k - 3.0).repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=2e-3, atol=2e-3)


def test_layer_share_picks_calibration_ranked_and_boundary_layers():
    top, bnd = by_name(["v3+K4top10%", "v3+K4B10%"])
    ks = np.linspace(0, 1, 30)[::-1].copy()             # layer 0 most sensitive
    ks[17] = 5.0
    assert top.wide_layers(ks) == [0, 1, 17]            # 10% of 30 layers = 3
    assert top.wide_layers(np.arange(18.0)) == [16, 17]  # 1.8 -> 2 of 18
    assert bnd.wide_layers(ks) == [0, 28, 29]
    # 3 of 30 layers' keys at 4 + 8/64 bits, 4 fp16 sinks of 2048 tokens
    body = (3 * 4.125 + 27 * 3.125 + 30 * 3.125) / 60
    assert top.bits(30, 3, 64, 2048, ks) == pytest.approx((4 * 16 + 2044 * body) / 2048)
    with pytest.raises(ValueError, match="fractional layer_k top"):
        Config("x", "lever", dict(V2), dict(V2), layer_k=(1.5, dict(V2, bits=4)))


def test_ip_scale_bytes_hand_case():
    p = FormatParams(n=8, block=8, **V2)
    enc = scale_encoding(p.scale)
    one = enc.bytes[np.argmin(np.abs(enc.values() - 1.0))]
    two = enc.bytes[np.argmin(np.abs(enc.values() - 2.0))]
    y = np.ones((2, 8))
    # y_hat = y / 2 with scale 1: y . y_hat = 4, |y|^2 = 8 -> scale 1 * 8 / 4 = 2
    yhat = np.vstack([np.full(8, 0.5), -np.ones(8)])
    got = ip_scale_bytes(y, yhat, np.array([[one], [one]], dtype=np.uint8), p)
    assert got[0, 0] == two
    assert got[1, 0] == one                          # y . y_hat <= 0: the byte is kept


def test_ip_scale_moves_inner_products_towards_the_norm():
    p = FormatParams(n=64, **V2)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((400, 64)) * np.exp(rng.standard_normal((400, 1)))).astype(
        np.float16)
    xf = x.astype(np.float64)
    gold = golden_roundtrip(x, p).astype(np.float64)
    ip = ip_roundtrip(x, IPScaled(p)).astype(np.float64)
    ratio = lambda r: (r * xf).sum(1) / (xf * xf).sum(1)  # noqa: E731
    # the golden max-rule scale shrinks x . x_hat below |x|^2; the IP scale moves the
    # ratio towards 1 (within the scale byte's rounding)
    assert abs(np.mean(ratio(ip)) - 1) < abs(np.mean(ratio(gold)) - 1) / 2
    assert np.mean(np.abs(ratio(ip) - 1)) < 0.04
    # same code plane; only scale bytes may differ
    assert IPScaled(p).bits_per_element == p.bits_per_element
    with pytest.raises(ValueError, match="asym"):
        IPScaled(FormatParams(n=64, mode="asym"))
    with pytest.raises(ValueError, match="peer"):
        Config("x", "lever", KiviKey(), KiviKey(), recent=4)
    with pytest.raises(ValueError, match="recent"):
        Config("x", "lever", dict(V2), dict(V2), recent=-1)


def test_ring_attention_equals_the_windowed_attention():
    torch = pytest.importorskip("torch")
    from bench.accuracy.attention import recent_mask, ring_attention, windowed_attention
    g = torch.Generator().manual_seed(2)
    b, hq, h, t, d = 1, 4, 2, 11, 8
    q = torch.randn(b, hq, t, d, generator=g)
    kf, kh, vf, vh = (torch.randn(b, h, t, d, generator=g) for _ in range(4))
    sliding = torch.ones(t, t, dtype=torch.bool).tril() & ~torch.ones(t, t, dtype=torch.bool).tril(-5)
    for r in (1, 3, 20):
        m = recent_mask(r)
        for mask in (None, sliding[None, None], torch.where(sliding, 0.0, -math.inf)[None, None]):
            torch.testing.assert_close(ring_attention(q, kf, kh, vf, vh, mask, r, 0.3),
                                       windowed_attention(q, kf, kh, vf, vh, mask, m, m, 0.3,
                                                          chunk=4), rtol=1e-5, atol=1e-6)


def test_lever_table_counts_bits_at_both_contexts(tmp_path):
    from bench.accuracy.report import lever_plot, lever_table
    wins = [{"name": "@1"}, {"name": "@2"}]

    def run(ppl, bits=3.0):
        return {"ppl": ppl, "bits": bits, "kl": 0.01}
    meta = {"windows": wins, "model_id": "m", "layers": 30, "kv_heads": 3, "head_dim": 64,
            "k_sens": list(np.linspace(1, 0, 30))}
    res = {"meta": meta,
           "runs": {"fp16@1": run(10.0, 16), "fp16@2": run(20.0, 16),
                    "v2+C+S4+KS2@1": run(11.0, 3.15), "v2+C+S4+KS2@2": run(22.0, 3.15),
                    "v3+W16@1": run(10.2, 3.251), "v3+W16@2": run(20.4, 3.251),
                    "v3+IP@1": run(11.5, 3.15)}}
    text = lever_table({"m": {"results": res}})
    rows = {r.split("|")[1].strip(" `"): r for r in text.splitlines()[2:]}
    # 4 sinks + 16 ring rows in fp16 of 32768 tokens, every token after the sinks at 3.125 bits
    assert f"{(20 * 16 + 32764 * 3.125) / 32768:.3f}" in rows["v3+W16"]
    assert "cache policy `v4`" in rows["v3+W16"]
    assert "+2.0%" in rows["v3+W16"] and "+10.0%" in rows["v2+C+S4+KS2"]
    assert "+15.0% (1 of 2)" in rows["v3+IP"]
    assert "v3+W32" not in rows                       # not run: no row
    lever_plot({"m": {"results": res}}, tmp_path / "l.png")
    assert (tmp_path / "l.png").stat().st_size > 1000


def test_recount_bits_changes_only_bits_and_records_the_rule():
    from bench.accuracy.configs import BITS_RULE
    from bench.accuracy.report import recount_bits
    meta = {"layers": 30, "kv_heads": 3, "head_dim": 64, "k_sens": list(np.linspace(1, 0, 30))}
    runs = {"v3+W16@1": {"name": "v3+W16", "n": 2047, "ppl": 10.5, "bits": 3.251, "bits_32k": 3.133},
            "v2+C+S4+KS2@1": {"name": "v2+C+S4+KS2", "n": 2047, "ppl": 11.0, "bits": 0.0},
            "v3+W8@1": {"name": "v3+W8", "n": 1023, "ppl": 9.0, "bits": 3.2}}
    res = {"meta": meta, "runs": runs}
    assert recount_bits(res) == list(runs)
    assert runs["v3+W16@1"]["bits"] == pytest.approx((20 * 16 + 2044 * 3.125) / 2048)
    assert runs["v3+W16@1"]["bits_32k"] == pytest.approx((20 * 16 + 32764 * 3.125) / 32768)
    assert runs["v3+W8@1"]["bits"] == pytest.approx((12 * 16 + 1020 * 3.125) / 1024)
    assert "bits_32k" not in runs["v3+W8@1"]            # only recounted where present
    assert runs["v3+W16@1"]["ppl"] == 10.5 and meta["bits_rule"] == BITS_RULE
    assert recount_bits(res) == []                       # exact: a second recount changes nothing
    runs["x@1"] = {"name": "no-such", "n": 10, "bits": 1.0}
    with pytest.raises(ValueError, match="no-such"):
        recount_bits(res)


@pytest.mark.parametrize("mid", ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b"])
def test_committed_results_count_bits_as_the_configurations_do(mid):
    """Every run of bench/results/accuracy/<model>.json stores the bits its configuration counts
    (python -m bench.accuracy --recount-bits keeps them so), and says how they are counted."""
    import copy
    import json
    from pathlib import Path
    from bench.accuracy.configs import BITS_RULE
    from bench.accuracy.report import recount_bits
    path = Path(__file__).resolve().parents[1] / "bench" / "results" / "accuracy" / f"{mid}.json"
    res = json.loads(path.read_text())
    assert res["meta"]["bits_rule"] == BITS_RULE
    assert recount_bits(copy.deepcopy(res)) == []
    if mid == "smollm2-135m":
        assert round(res["runs"]["v3+W16@777791"]["bits"], 3) == 3.275
