"""gpu_ref.hf: the transformers cache over the packed format.

CPU tests (tiny randomly initialised Llama / Qwen2 built here, golden backend): policy parsing,
errors naming the parameter, shapes and seen tokens through ``generate``, the stored bytes equal
``sim_models.encode`` of the model's post-RoPE keys/values (centered, key-scaled, sinks), and
decode one token at a time == the fake-quant forward. GPU tests (skipped without CUDA/CuPy):
the kernels' bytes equal the golden store's at every layer for a prefill and a few decode steps,
and their logits agree. Skipped when torch or transformers are missing (the ``hf`` extra).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gpu_ref import hf  # noqa: E402
from sim_models import CachePolicy, FormatParams, center, encode  # noqa: E402
from sim_models.codec import encode_folded  # noqa: E402

torch.set_num_threads(1)


def _gpu():
    if not torch.cuda.is_available():
        return False
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


gpu = pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU, torch with CUDA and CuPy")


def tiny(family="llama", head_dim=64, layers=2, heads=4, kv_heads=2, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    cls_cfg, cls = (LlamaConfig, LlamaForCausalLM) if family == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    cfg = cls_cfg(vocab_size=96, hidden_size=heads * head_dim // 2, intermediate_size=128,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  head_dim=head_dim, max_position_embeddings=512)
    torch.manual_seed(seed)
    m = cls(cfg).eval()
    hf.enable(m)
    return m


# ------------------------------------------------------------------------- policy specs
def test_policy_specs_of_the_integration():
    p = CachePolicy.parse("K4V3+C+S4+K16@0+V4@1,2")
    assert p.k.bits == 4 and p.v.bits == 3 and p.sinks == 4 and p.center_keys
    assert p.format_for(0, "k") is None and p.format_for(1, "k").bits == 4
    assert p.format_for(2, "v").bits == 4 and p.format_for(0, "v").bits == 3
    assert CachePolicy.parse("fp16") == CachePolicy(k=None, v=None)
    assert CachePolicy.parse("k3v3") == CachePolicy()
    for spec in ("K3V3", "K4V3+C+S4", "K3V3+K4@0,1", "K16V16"):
        assert CachePolicy.parse(spec).spec == spec


@pytest.mark.parametrize("spec,word", [("", "non-empty"), ("K3", "first term"), ("K3V3+X", "unknown term"),
                                        ("K3V3+S-1", "sets sinks"), ("K9V3", "bits")])
def test_policy_spec_errors(spec, word):
    with pytest.raises(ValueError, match=word):
        CachePolicy.parse(spec)


def test_module_docstring_example_uses_the_default_policy_and_states_the_ring():
    """gpu_ref.hf's usage example builds the cache of the CLIs' default policy (v4) and the docstring
    says what its recent ring does."""
    import argparse
    import re
    from gpu_ref.cli import add_model_options
    ap = argparse.ArgumentParser()
    add_model_options(ap)
    default = ap.get_default("policy")
    example = re.search(r'hf.PackedCache\(model.config, "([^"]+)"', hf.__doc__)
    assert example and example.group(1) == default == "v4"
    assert CachePolicy.parse(default).recent and "recent ring" in hf.__doc__ and "policy.recent" in hf.__doc__


# ------------------------------------------------------------------------- cache creation errors
def test_errors_name_the_parameter():
    m = tiny()
    c = m.config
    with pytest.raises(ValueError, match="batch_size"):
        hf.PackedCache(c, "K3V3", 0, 16, backend="golden")
    with pytest.raises(ValueError, match="capacity"):
        hf.PackedCache(c, "K3V3", 1, -1, backend="golden")
    with pytest.raises(ValueError, match="backend"):
        hf.PackedCache(c, "K3V3", 1, 16, backend="tpu")
    with pytest.raises(ValueError, match="needs mu"):
        hf.PackedCache(c, "K3V3+C", 1, 16, backend="golden")
    with pytest.raises(ValueError, match=r"mu must have shape \[layers, kv_heads, head_dim\] = \[2, 2, 64\]"):
        hf.PackedCache(c, "K3V3+C", 1, 16, mu=np.zeros((2, 2, 32)), backend="golden")
    with pytest.raises(ValueError, match="key_scales must be positive powers of two"):
        hf.PackedCache(c, "K3V3", 1, 16, key_scales=np.full((2, 2, 64), 3.0), backend="golden")
    with pytest.raises(ValueError, match=r"policy.layer_k names layers \[5\]"):
        hf.PackedCache(c, "K3V3+K4@5", 1, 16, backend="golden")
    with pytest.raises(ValueError, match="prefill"):
        hf.PackedCache(c, "K3V3", 1, 16, prefill="chunked", backend="cuda")
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="num_splits"):
            hf.PackedCache(c, "K3V3", 1, 16, backend="golden", num_splits=bad)
    with pytest.raises(TypeError, match="policy"):
        hf.PackedCache(c, 3, 1, 16)
    # study-only key treatments are refused, never silently dropped
    for kw, word in ((dict(key_signs=True), "key_signs"), (dict(key_rot=True), "key_rot"),
                     (dict(key_scale="fp16"), "key_scale 'fp16'"), (dict(key_scale="pow2"), "needs key_scales")):
        for backend in ("golden", "cuda"):
            with pytest.raises(ValueError, match=word):
                hf.PackedCache(c, CachePolicy(**kw), 1, 16, backend=backend)


def test_cuda_backend_refuses_what_the_kernels_cannot_serve():
    """Checked at cache creation, without a GPU: head_dim the decode kernel lacks, formats it lacks."""
    with pytest.raises(ValueError, match="head_dim 80 cannot be stored.*power of two"):
        hf.PackedCache(tiny(head_dim=80, heads=2).config, "K3V3", 1, 16, backend="cuda")
    with pytest.raises(ValueError, match=r"k\.n=32 \(head_dim\): the kernels serve head dims"):
        hf.PackedCache(tiny(head_dim=32, heads=4).config, "K3V3", 1, 16, backend="cuda")
    with pytest.raises(ValueError, match="both packed or both 16-bit"):
        hf.PackedCache(tiny().config, "K3V16", 1, 16, backend="cuda")
    hf.PackedCache(tiny().config, "K4V3+S4", 1, 16, backend="cuda")
    with pytest.raises(ValueError, match="sinks=65"):
        hf.PackedCache(tiny().config, "K3V3+S65", 1, 128, backend="cuda")
    with pytest.raises(ValueError, match=r"k\.bits=2: the kernels store \(3, 4\)-bit codes"):
        hf.PackedCache(tiny().config, "K2V3", 1, 16, backend="cuda")
    hf.PackedCache(tiny(head_dim=128).config, "K3V3", 1, 16, backend="cuda")   # served: no error


def test_capacity_and_shape_errors_at_update():
    m = tiny()
    c = hf.PackedCache(m.config, "K3V3", 1, 8, backend="golden")
    with torch.no_grad(), pytest.raises(ValueError, match="capacity=8"):
        m(torch.zeros(1, 9, dtype=torch.long), **hf.cache_kwargs(m, c))
    c = hf.PackedCache(m.config, "K3V3", 2, 8, backend="golden")
    with torch.no_grad(), pytest.raises(ValueError, match="batch_size=2"):
        m(torch.zeros(1, 3, dtype=torch.long), **hf.cache_kwargs(m, c))


def test_chunked_prefill_after_cached_tokens_is_refused():
    m = tiny()
    c = hf.PackedCache(m.config, "K3V3", 1, 16, backend="golden")
    with torch.no_grad():
        m(torch.zeros(1, 3, dtype=torch.long), **hf.cache_kwargs(m, c))
        with pytest.raises(NotImplementedError, match="chunked prefill"):
            m(torch.zeros(1, 2, dtype=torch.long), **hf.cache_kwargs(m, c))


# ------------------------------------------------------------------------- bookkeeping
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_generate_shapes_and_seen_tokens(family):
    m = tiny(family)
    ids = torch.randint(0, 96, (2, 7), generator=torch.Generator().manual_seed(1))
    c = hf.PackedCache(m.config, "K3V3+S2", 2, 32, backend="golden")
    with torch.no_grad():
        out = hf.generate(m, ids, c, attention_mask=torch.ones_like(ids), max_new_tokens=5,
                         min_new_tokens=5, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 12)
    assert torch.equal(out[:, :7], ids)
    assert c.get_seq_length() == 11          # the last generated token is never fed back
    assert all(l.get_seq_length() == 11 for l in c.layers)
    assert c.layers[0].store.hat["k"].shape == (2, 2, 32, 64)
    p = FormatParams(n=64)
    # layers * (K, V) * B * KVH * (30 packed rows + 2 fp16 sink rows of 64 lanes)
    assert c.nbytes() == 2 * 2 * 2 * 2 * (30 * (p.code_bytes + p.n_blocks) + 2 * 64 * 2)


def test_fp16_policy_matches_dynamic_cache():
    """The 16-bit baseline layer returns the same attention as transformers' own cache."""
    from transformers import DynamicCache
    m = tiny()
    ids = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = m(ids, **hf.cache_kwargs(m, DynamicCache(config=m.config))).logits
        c = hf.PackedCache(m.config, "fp16", 1, 16, backend="golden")
        got = torch.cat([m(ids[:, i:i + 1], **hf.cache_kwargs(m, c)).logits for i in range(10)], 1)
    assert c.get_seq_length() == 10
    assert torch.allclose(got, ref, atol=2e-3), float((got - ref).abs().max())


def test_16bit_layers_with_a_ring_store_what_fp16_stores():
    """K16V16+W16 keeps the 16-bit baseline layers (no ring copies): the cache's bytes equal fp16's and
    CachePolicy.stored_bits counts them so."""
    m = tiny()
    ids = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(2))
    sizes = []
    for spec in ("fp16", "K16V16+W16"):
        c = hf.PackedCache(m.config, spec, 1, 32, backend="golden")
        with torch.no_grad():
            m(ids, **hf.cache_kwargs(m, c))
        pol = CachePolicy.parse(spec).fit(64)
        assert c.nbytes() == pol.stored_bits(2, 2, 64, 32) // 8
        sizes.append(c.nbytes())
    assert sizes[0] == sizes[1]


def _record_updates(cache):
    """Wrap every layer's update to record the post-RoPE K/V ``[B, KVH, T, D]`` it was given."""
    seen = [[] for _ in cache.layers]
    for layer, rec in zip(cache.layers, seen):
        def update(k, v, *a, _orig=layer.update, _rec=rec, **kw):
            _rec.append((k.clone(), v.clone()))
            return _orig(k, v, *a, **kw)
        layer.update = update
    return seen


def test_stored_bytes_equal_golden_encode():
    """Centered, key-scaled keys with sinks and per-layer K bits: the store holds exactly the folded
    key front end's encode of k (sim_models.codec.encode_folded with RN16(mu s) and log2 s) for every
    non-sink token, and the fp16 rows RNE(RN16(k s) - RN16(mu s)) for the sinks."""
    m = tiny()
    rng = np.random.default_rng(3)
    ids = torch.tensor(rng.integers(0, 96, (2, 9)))
    mu = (rng.normal(size=(2, 2, 64)) * 0.3).astype(np.float16)
    ks = np.exp2(rng.integers(-2, 3, size=(2, 2, 64))).astype(np.float32)
    pol = CachePolicy.parse("K3V3+C+S2+KS2+K4@1")
    c = hf.PackedCache(m.config, pol, 2, 16, mu=mu, key_scales=ks, backend="golden")
    seen = _record_updates(c)
    with torch.no_grad():
        m(ids[:, :5], **hf.cache_kwargs(m, c))
        for i in range(5, 9):
            m(ids[:, i:i + 1], **hf.cache_kwargs(m, c))
    for layer, rec in enumerate(seen):
        k, v = (torch.cat(x, 2) for x in zip(*rec))
        st = c.layers[layer].store
        kf = pol.format_for(layer, "k")
        p = FormatParams(**{**kf.__dict__, "n": 64})
        k16 = (k.float() * torch.from_numpy(ks[layer])[None, :, None, :]).half().numpy()
        mu_s = (mu[layer].astype(np.float32) * ks[layer]).astype(np.float16)    # mu in the scaled domain
        kc = center(np.ascontiguousarray(k16), np.broadcast_to(mu_s[None, :, None, :], k16.shape), p)
        kraw = k.half().numpy()[:, :, 2:]
        e = encode_folded(kraw, mu_s.view(np.uint16)[None, :, None, :],
                          np.log2(ks[layer]).astype(np.int64)[None, :, None, :], p)
        assert np.array_equal(st.codes["k"][:, :, 2:9, 0], e.codes), f"layer {layer} key codes"
        assert np.array_equal(st.scales["k"][:, :, 2:9, 0], e.scales)
        # not the version-3 rule (the encoder input RNE(RN16(k s) - RN16(mu s))): the two differ here
        assert not np.array_equal(encode(kc[:, :, 2:], p).codes, e.codes)
        ev = encode(v.half().numpy()[:, :, 2:], FormatParams(n=64))
        assert np.array_equal(st.codes["v"][:, :, 2:9, 0], ev.codes), f"layer {layer} value codes"
        assert not st.codes["k"][:, :, :2].any()                        # sinks are not encoded
        sink = torch.from_numpy(kc[:, :, :2].view(np.float16).astype(np.float32))
        assert torch.equal(st.hat["k"][:, :, :2], sink)


def test_bf16_model_stores_bf16_and_a_lone_layer_agrees_with_the_cache():
    """The stored 16-bit type follows the model (bf16 here) whether a layer is updated through the
    cache or on its own (as the benchmark's side-by-side cache does)."""
    m = tiny().to(torch.bfloat16)
    ids = torch.tensor(np.random.default_rng(9).integers(0, 96, (1, 6)))
    c = hf.PackedCache(m.config, "K3V3", 1, 8, backend="golden")
    seen = _record_updates(c)
    with torch.no_grad():
        m(ids, **hf.cache_kwargs(m, c))
    lone = hf.PackedCache(m.config, "K3V3", 1, 8, backend="golden")
    for i, rec in enumerate(seen):
        lone.layers[i].update(*rec[0])
        for layer in (c.layers[i], lone.layers[i]):
            assert layer.k_fmt.dtype == layer.v_fmt.dtype == "bf16" and layer.dtype == torch.bfloat16
        bits = rec[0][1].contiguous().view(torch.int16).numpy().view(np.uint16)
        e = encode(bits, FormatParams(n=64, dtype="bf16"))
        for layer in (c.layers[i], lone.layers[i]):
            assert np.array_equal(layer.store.codes["v"][:, :, :6, 0], e.codes), f"layer {i}"


def test_v3_policy_with_key_tables_equals_explicit_tables():
    """PackedCache(policy "v3", tables=KeyTables) stores the bytes of the same policy given mu and
    key_scales; the tables are checked against the model and the policy."""
    from sim_models import KeyTables
    m = tiny()
    rng = np.random.default_rng(4)
    t = KeyTables("tiny", (rng.normal(size=(2, 2, 64)) * 0.3).astype(np.float16),
                  rng.integers(-2, 3, size=(2, 2, 64)).astype(np.int8))
    ids = torch.tensor(rng.integers(0, 96, (2, 9)))
    a = hf.PackedCache(m.config, "v3", 2, 16, tables=t, backend="golden")
    b = hf.PackedCache(m.config, "K3V3+C+S4+KS2", 2, 16, mu=t.mu, key_scales=t.scales(), backend="golden")
    with torch.no_grad():
        la, lb = m(ids, **hf.cache_kwargs(m, a)).logits, m(ids, **hf.cache_kwargs(m, b)).logits
    assert torch.equal(la, lb)
    for x, y in zip(a.layers, b.layers):
        assert np.array_equal(x.store.codes["k"], y.store.codes["k"]) and x.store.codes["k"].any()
    with pytest.raises(ValueError, match="the model has"):
        hf.PackedCache(m.config, "v3", 2, 16, tables=KeyTables("x", t.mu[:1], t.log2_s[:1]), backend="golden")
    with pytest.raises(ValueError, match="not both"):
        hf.PackedCache(m.config, "v3", 2, 16, tables=t, mu=t.mu, backend="golden")
    with pytest.raises(ValueError, match="log2_s"):
        hf.PackedCache(m.config, "v3", 2, 16, tables=KeyTables("x", t.mu), backend="golden")
    with pytest.raises(TypeError, match="KeyTables"):
        hf.PackedCache(m.config, "v3", 2, 16, tables={"mu": t.mu}, backend="golden")


def test_refused_at_creation_key_scale_range_policy_and_layer_types():
    """Key scales outside the backend's exponent range, key scales without the policy's KS2 term,
    a preset combined with terms, and layer types other than full / sliding attention are refused by
    name at creation."""
    from transformers import Qwen2Config
    m = tiny()
    z = np.zeros((2, 2, 64), np.float16)
    for e, backend in ((16, "golden"), (-15, "golden"), (15, "cuda")):
        with pytest.raises(ValueError, match="key_scales must be 2"):
            hf.PackedCache(m.config, "v3", 1, 8, mu=z, key_scales=np.full((2, 2, 64), 2.0 ** e), backend=backend)
    hf.PackedCache(m.config, "v3", 1, 8, mu=z, key_scales=np.full((2, 2, 64), 2.0 ** 15), backend="golden")
    with pytest.raises(ValueError, match="KS2"):
        hf.PackedCache(m.config, "K3V3", 1, 8, key_scales=np.full((2, 2, 64), 4.0), backend="golden")
    with pytest.raises(ValueError, match="stands alone"):
        CachePolicy.parse("v3+S8")
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, layer_types=["full_attention", "chunked_attention"])
    with pytest.raises(ValueError, match=r"config.layer_types: \['chunked_attention'\]"):
        hf.PackedCache(cfg, "K3V3", 1, 8, backend="golden")


def test_decode_one_token_at_a_time_equals_fake_quant_forward():
    """prefill='packed' (the golden fake-quant forward) == appending and decoding token by token."""
    m = tiny("qwen2")
    rng = np.random.default_rng(4)
    ids = torch.tensor(rng.integers(0, 96, (1, 12)))
    mu = (rng.normal(size=(2, 2, 64)) * 0.3).astype(np.float16)
    a = hf.PackedCache(m.config, "K3V3+C+S1", 1, 16, mu=mu, backend="golden", prefill="packed")
    b = hf.PackedCache(m.config, "K3V3+C+S1", 1, 16, mu=mu, backend="golden")
    with torch.no_grad():
        full = m(ids, **hf.cache_kwargs(m, a)).logits
        step = torch.cat([m(ids[:, i:i + 1], **hf.cache_kwargs(m, b)).logits for i in range(12)], 1)
        exact = m(ids).logits
    # the one-row and 12-row projections round differently in the last bit of fp32
    assert torch.allclose(full, step, atol=1e-3), float((full - step).abs().max())
    assert not torch.allclose(full, exact, atol=1e-3)       # the quantization is really applied


# ------------------------------------------------------------------------- GPU: kernels vs golden
@gpu
@pytest.mark.parametrize("spec", ["K3V3+C+KS2", "K3V3+C+S2+KS2+W5"])
@pytest.mark.parametrize("family,head_dim,dtype", [("llama", 64, torch.float32), ("qwen2", 128, torch.bfloat16),
                                                  ("llama", 128, torch.float16)])
def test_kernels_bytes_and_logits_equal_golden(family, head_dim, dtype, spec):
    m = tiny(family, head_dim=head_dim, heads=8, kv_heads=2).to("cuda", dtype)
    rng = np.random.default_rng(5)
    ids = torch.tensor(rng.integers(0, 96, (2, 20)), device="cuda")
    mu = (rng.normal(size=(2, 2, head_dim)) * 0.3).astype(np.float16)
    ks = np.exp2(rng.integers(-1, 2, size=(2, 2, head_dim))).astype(np.float32)
    caches = {be: hf.PackedCache(m.config, spec, 2, 64, mu=mu, key_scales=ks, backend=be)
              for be in ("cuda", "golden")}
    seen = _record_updates(caches["cuda"])
    logits = {}
    with torch.no_grad():
        for be, c in caches.items():
            out = [m(ids[:, :12], **hf.cache_kwargs(m, c)).logits[:, -1:]]
            for i in range(12, 20):                                  # 8 decode steps
                out.append(m(ids[:, i:i + 1], **hf.cache_kwargs(m, c)).logits)
            logits[be] = torch.cat(out, 1).float()
    # the bytes: the K/V the kernels were given (each layer's input depends on the earlier layers'
    # attention, which differs in float rounding between the two runs), written by the golden store
    ref = hf.PackedCache(m.config, spec, 2, 64, mu=mu, key_scales=ks, backend="golden")
    s0 = ref.layers[0].sinks
    for i, (lk, rec) in enumerate(zip(caches["cuda"].layers, seen)):
        for k, v in rec:
            ref.layers[i].update(k, v)
        lg, kv = ref.layers[i], lk.store.kv
        assert kv.host_lengths.tolist() == [20, 20]
        hp = kv.host_planes()  # golden byte order (value codes de-interleaved from the vpair layout)
        for kind in "kv":
            assert np.array_equal(hp[f"{kind}_codes"][:, :, :20 - s0], lg.store.codes[kind][:, :, s0:20, 0]), \
                f"layer {i} {kind} codes"
            assert np.array_equal(hp[f"{kind}_scales"][:, :, :20 - s0], lg.store.scales[kind][:, :, s0:20, 0])
        if lg.store.recent:                 # the ring: the last 5 tokens' 16-bit rows (keys after the front end)
            k16 = lg.store.raw["k"][:, :, 15:20].half()
            rows = [2 + (p - 2) % 5 for p in range(15, 20)]
            assert torch.equal(torch.from_dlpack(kv.k_sink.view("float16"))[:, :, rows].cpu(), k16.cpu())
    err = (logits["cuda"] - logits["golden"]).abs().max() / logits["golden"].abs().max()
    assert err < 2e-2, float(err)          # the kernels take q in 16 bits


@gpu
def test_generate_on_gpu_with_kernels():
    m = tiny(head_dim=128, heads=8, kv_heads=2).to("cuda", torch.bfloat16)
    ids = torch.randint(0, 96, (3, 5), device="cuda", generator=torch.Generator("cuda").manual_seed(6))
    c = hf.PackedCache(m.config, "K3V3", 3, 40, backend="cuda")
    with torch.no_grad():
        out = hf.generate(m, ids, c, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                         min_new_tokens=16, do_sample=False, pad_token_id=0)
    assert out.shape == (3, 21) and c.get_seq_length() == 20
    assert all(l.store.kv.host_lengths.tolist() == [20] * 3 for l in c.layers)


@gpu
@pytest.mark.parametrize("spec", ["K3V3", "K4V3+C+S4", "K4V3+C+S4+W6"])
def test_packed_prefill_through_kernels_equals_decode_steps_and_golden(spec):
    """prefill='packed' on the kernels (one decode launch of T queries per layer, each with its own
    length) == feeding the tokens one at a time through the decode kernel, and ~ the golden
    fake-quant forward; the planes hold the golden bytes of the K/V they were given."""
    m = tiny("qwen2", head_dim=64, heads=6, kv_heads=2).to("cuda")
    rng = np.random.default_rng(7)
    ids = torch.tensor(rng.integers(0, 96, (2, 40)), device="cuda")
    mu = (rng.normal(size=(2, 2, 64)) * 0.3).astype(np.float16)
    mk = lambda be, pf: hf.PackedCache(m.config, spec, 2, 40, mu=mu, backend=be, prefill=pf)  # noqa: E731
    chunk, steps, gold = mk("cuda", "packed"), mk("cuda", "exact"), mk("golden", "packed")
    seen = _record_updates(chunk)
    with torch.no_grad():
        a = m(ids, **hf.cache_kwargs(m, chunk)).logits
        b = torch.cat([m(ids[:, i:i + 1], **hf.cache_kwargs(m, steps)).logits for i in range(40)], 1)
        g = m(ids, **hf.cache_kwargs(m, gold)).logits
    scale = g.abs().max()
    # same definition; the one-row and 40-row projections round differently, which can move a K/V
    # element across a 3-bit threshold in the next layer
    assert float((a - b).abs().max() / scale) < 1e-2
    assert float((a - g).abs().max() / scale) < 2e-2          # 16-bit q in the kernels
    ref = hf.PackedCache(m.config, spec, 2, 40, mu=mu, backend="golden")
    s0 = chunk.layers[0].sinks
    for i, (lk, rec) in enumerate(zip(chunk.layers, seen)):
        ref.layers[i].update(*rec[0])
        kv, lg = lk.store.kv, ref.layers[i].store
        hp = kv.host_planes()  # golden byte order
        for kind in "kv":
            assert np.array_equal(hp[f"{kind}_codes"][:, :, :40 - s0], lg.codes[kind][:, :, s0:40, 0])
    if s0:
        k16 = ref.layers[0].store.keys_in(seen[0][0][0].to(torch.float16))     # the golden key front end
        assert torch.equal(torch.from_dlpack(chunk.layers[0].store.kv.k_sink.view("float16"))[:, :, :s0],
                           k16[:, :, :s0].contiguous())


@gpu
@pytest.mark.parametrize("spec", ["fp16", "K3V3", "K4V3+C+S4", "K3V3+C+S4+W6"])
def test_decode_step_replays_from_a_cuda_graph(spec):
    """A whole model decode step captured in a CUDA graph replays to the eager step's logits
    (the cuda store allocates nothing on the CuPy side and copies nothing to the host in a step)."""
    m = tiny(head_dim=128, heads=8, kv_heads=2).to("cuda", torch.bfloat16)
    rng = np.random.default_rng(8)
    ids = torch.tensor(rng.integers(0, 96, (2, 9)), device="cuda")
    mu = (rng.normal(size=(2, 2, 128)) * 0.3).astype(np.float16)
    c = hf.PackedCache(m.config, spec, 2, 64, mu=mu if "+C" in spec else None, backend="cuda")
    tok = ids[:, 8:9].clone()
    with torch.no_grad():
        m(ids[:, :8], **hf.cache_kwargs(m, c))
        for i in range(6):                                   # past the 4 sinks
            m(ids[:, i:i + 1], **hf.cache_kwargs(m, c))
        n = c.get_seq_length()
        want = m(tok, **hf.cache_kwargs(m, c)).logits.clone()
        c.set_length(n)

        def step():
            out = m(tok, **hf.cache_kwargs(m, c)).logits
            c.set_length(n)
            return out
        st = torch.cuda.Stream()
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            step()
        torch.cuda.current_stream().wait_stream(st)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = step()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
    err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
    assert err < 1e-2, err                # same kernels; only the capture may pick other GEMM algorithms


@pytest.mark.parametrize("argv, word", [
    (["--model", "/nonexistent"], "--model"),
    (["--model", "{tmp}", "--policy", "K5V3"], "--policy"),
    (["--model", "{tmp}/missing.gguf"], "--model"),
    (["--model", "{tmp}", "--tables", "/nonexistent.npz"], "--tables"),
    (["--model", "{tmp}", "--batch", "0"], "--batch"),
    (["--model", "{tmp}"], "--tables"),                        # the default policy v3 needs tables
    (["--model", "{tmp}", "--policy", "K3V3+C"], "--tables"),
])
def test_generate_refuses_bad_arguments_before_loading(argv, word, tmp_path, capsys):
    """python -m gpu_ref.generate: exit 2 with one line naming the option, before any model load ({tmp}: a
    Hugging Face folder as the model resolver sees one)."""
    from gpu_ref.generate import main
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as stop:
        main([x.replace("{tmp}", str(tmp_path)) for x in argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert word in err and "Traceback" not in err


def test_cache_kwargs_follow_the_forward_signature():
    """The cache keyword is the one the model's forward takes: cache (transformers 5.2x on),
    else past_key_values (5.17 ..); generate is called with the same name, without warnings."""
    class New:
        def forward(self, input_ids, cache=None):
            pass

    class Old:
        def forward(self, input_ids, past_key_values=None):
            pass

    assert hf.cache_kwargs(New(), 1) == {"cache": 1}
    assert hf.cache_kwargs(Old(), 1) == {"past_key_values": 1}


def test_golden_store_nbytes_counts_zero_points():
    """The golden store's bytes are CachePolicy.stored_bits of its formats: asym vectors carry
    a zero-point plane (26 bytes per 64-lane vector at b = 3, not codes + scale = 25)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    m = LlamaForCausalLM(cfg).eval()
    asym = FormatParams(mode="asym")
    c = hf.PackedCache(cfg, CachePolicy(k=asym, v=asym), 1, 16, backend="golden")
    with torch.no_grad():
        m(torch.zeros(1, 4, dtype=torch.long), **hf.cache_kwargs(m, c))
    assert FormatParams(mode="asym", n=64).bytes_per_vector == 26
    assert c.nbytes() == 2 * 16 * 26            # K and V x capacity x one 64-lane vector


# ------------------------------------------------------------------------- sliding-window layers
def tiny_gemma3(window=8, seed=0, head_dim=64, dtype=None):
    """Gemma 3 shape in miniature: sliding, full, sliding layers (the real model: 5 sliding of 6)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    cfg = Gemma3TextConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, sliding_window=window,
                           query_pre_attn_scalar=head_dim, max_position_embeddings=512,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    torch.manual_seed(seed)
    return Gemma3ForCausalLM(cfg).eval()


def test_layer_windows_of_the_families():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config
    assert hf.layer_windows(tiny_gemma3().config) == [8, None, 8]
    assert hf.layer_windows(LlamaConfig(num_hidden_layers=2)) == [None, None]
    q = Qwen2Config(num_hidden_layers=4, use_sliding_window=True, sliding_window=16, max_window_layers=2)
    assert hf.layer_windows(q) == [None, None, 16, 16]
    assert hf.layer_windows(Qwen2Config(num_hidden_layers=2, sliding_window=16)) == [None, None]  # window off
    assert hf.layer_windows(MistralConfig(num_hidden_layers=2, sliding_window=32)) == [32, 32]
    assert hf.layer_windows(MistralConfig(num_hidden_layers=2, sliding_window=None)) == [None, None]


def _eager_fake_quant(model, spec, ids, prefill, exact):
    """The reference: the model's own eager attention (its sliding-window mask, transformers'
    DynamicCache whose sliding layers keep the window) over golden fake-quantized K/V: 16-bit
    rounding, encode + decode_float of the policy's formats, the first ``sinks`` tokens of
    full-attention layers 16-bit. ``exact``: the first chunk attends to its unquantized K/V (what
    PackedCache's prefill='exact' does). Logits of ``ids[:, :prefill]`` in one chunk, then one token
    at a time."""
    from transformers import DynamicCache
    from sim_models import decode_float
    from sim_models.policy import fit_format
    pol = CachePolicy.parse(spec)
    windows = hf.layer_windows(model.config)
    d = model.config.head_dim
    cache = DynamicCache(config=model.config)

    def fq(x, f, first):
        x16 = x.to(torch.float16)
        bits = x16.contiguous().view(torch.int16).numpy().view(np.uint16)
        b, h, t, _ = bits.shape
        e = encode(bits.reshape(b, h, t, d // f.n, f.n), f)
        rec = torch.from_numpy(decode_float(e.codes, e.scales, f, e.zeros).reshape(b, h, t, d).astype(np.float32))
        rec[:, :, :first] = x16[:, :, :first].float()
        return rec.to(x.dtype)

    for i, layer in enumerate(cache.layers):
        def update(k, v, *a, _orig=layer.update, _i=i, _seen=[0], **kw):
            t0, t = _seen[0], k.shape[2]
            first = 0 if windows[_i] is not None else max(0, min(pol.sinks - t0, t))
            kq = fq(k, fit_format(pol.format_for(_i, "k"), d, "fp16"), first)
            vq = fq(v, fit_format(pol.format_for(_i, "v"), d, "fp16"), first)
            _seen[0] += t
            out = _orig(kq, vq, *a, **kw)
            return (k, v) if exact and t > 1 and t0 == 0 else out
        layer.update = update
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = [model(ids[:, :prefill], **hf.cache_kwargs(model, cache), use_cache=True).logits]
            for i in range(prefill, ids.shape[1]):
                out.append(model(ids[:, i:i + 1], **hf.cache_kwargs(model, cache), use_cache=True).logits)
    finally:
        model.set_attn_implementation(hf.ATTN_NAME)
    return torch.cat(out, 1)


def _packed_run(model, cache, ids, prefill):
    with torch.no_grad():
        out = [model(ids[:, :prefill], **hf.cache_kwargs(model, cache)).logits]
        for i in range(prefill, ids.shape[1]):
            out.append(model(ids[:, i:i + 1], **hf.cache_kwargs(model, cache)).logits)
    return torch.cat(out, 1)


@pytest.mark.parametrize("prefill", [1, 12])
def test_sliding_window_layers_equal_eager_attention_over_fake_quant(prefill):
    """A Gemma-3-shaped model (window 8 on 2 of 3 layers) on the golden store, decoding 3x past the
    window, == the model's own eager attention over fake-quantized K/V with transformers' sliding
    cache; prefill 12 > window exercises the exact prefill of a chunk longer than the window."""
    m = tiny_gemma3()
    hf.enable(m)
    ids = torch.tensor(np.random.default_rng(11).integers(0, 96, (2, 26)))
    c = hf.PackedCache(m.config, "K3V3+S2", 2, 26, backend="golden")
    got = _packed_run(m, c, ids, prefill)
    want = _eager_fake_quant(m, "K3V3+S2", ids, prefill, exact=True)
    assert got.shape == want.shape
    # equal up to float rounding (SDPA vs eager sums) at almost every (sequence, position); where such
    # a last-bit difference rounds one K/V element to the other side of a 3-bit threshold, the positions
    # whose window holds that token move by ~1e-3
    err = (got - want).abs().amax(-1)
    assert float((err < 2e-5).float().mean()) >= 0.8 and float(err.max()) < 1e-2, err
    # without the window (or with the 16-bit K/V) the answer is another one: the test can tell
    full = _eager_fake_quant(tiny_gemma3(window=64), "K3V3+S2", ids, prefill, exact=True)
    assert not torch.allclose(got[:, 10:], full[:, 10:], atol=1e-3)
    assert [l.store.hat["k"].shape[2] for l in c.layers] == [8, 26, 8]
    assert [l.sinks for l in c.layers] == [0, 2, 0]


def test_sliding_ring_holds_the_window_bytes():
    """A sliding layer's store keeps exactly the last W tokens, token p in row p % W, with the golden
    bytes of its K/V; nbytes counts W rows (no sinks), a full layer its capacity."""
    m = tiny_gemma3()
    hf.enable(m)
    ids = torch.tensor(np.random.default_rng(12).integers(0, 96, (1, 19)))
    c = hf.PackedCache(m.config, "K3V3+S2", 1, 32, backend="golden")
    seen = _record_updates(c)
    _packed_run(m, c, ids, 5)
    p = FormatParams(n=64)
    for i in (0, 2):
        k = torch.cat([x[0] for x in seen[i]], 2).half().numpy()        # all 19 tokens
        e = encode(k, p)
        rows = np.arange(19 - 8, 19) % 8
        assert np.array_equal(c.layers[i].store.codes["k"][:, :, rows, 0], e.codes[:, :, -8:]), f"layer {i}"
        assert c.layers[i].get_seq_length() == 19
    assert c.layers[0].nbytes() == 2 * 2 * 8 * (p.code_bytes + p.n_blocks)
    assert c.layers[1].nbytes() == 2 * 2 * (30 * (p.code_bytes + p.n_blocks) + 2 * 64 * 2)


def test_sliding_layers_packed_prefill_equals_decode_steps():
    """prefill='packed' (one chunk of 20 > window, each query over its own window of the packed
    cache) == feeding the tokens one at a time; the 16-bit policy keeps a 16-bit ring."""
    m = tiny_gemma3()
    hf.enable(m)
    ids = torch.tensor(np.random.default_rng(13).integers(0, 96, (1, 20)))
    a = hf.PackedCache(m.config, "K3V3+S2", 1, 20, backend="golden", prefill="packed")
    b = hf.PackedCache(m.config, "K3V3+S2", 1, 20, backend="golden")
    with torch.no_grad():
        full = m(ids, **hf.cache_kwargs(m, a)).logits
    step = _packed_run(m, b, ids, 1)
    assert torch.allclose(full, step, atol=1e-4), float((full - step).abs().max())
    c16 = hf.PackedCache(m.config, "fp16", 1, 20, backend="golden")
    got = _packed_run(m, c16, ids, 12)
    m.set_attn_implementation("eager")
    with torch.no_grad():
        want = m(ids).logits
    m.set_attn_implementation(hf.ATTN_NAME)
    assert torch.allclose(got, want, atol=5e-3), float((got - want).abs().max())   # fp16 K/V rounding
    assert c16.layers[0].keys.shape[2] == 8
    with pytest.raises(ValueError, match="prefill='packed'"):
        hf.PackedCache(m.config, "K3V3", 1, 20, backend="cuda", prefill="packed")


@gpu
@pytest.mark.parametrize("spec,window", [("K3V3", 16), ("v3", 16), ("v4", 16), ("K3V3+W4", 16), ("v4", 32)])
def test_sliding_window_kernels_equal_golden(spec, window):
    """Gemma-3-shaped model (head_dim 128, window 16) on the kernels, decoding past the window: the
    ring planes hold the golden store's bytes (row p % W, for the K/V the kernels' run wrote) and the
    logits agree up to the first decode step. Later steps are not compared: each run's K/V come from its
    own attention outputs, so a float-rounding difference can move a K/V element across a 3-bit
    threshold and the two runs then quantize different vectors (a divergence of the feedback loop,
    not of the kernels, which the byte check covers)."""
    from sim_models import KeyTables
    m = tiny_gemma3(window=window, head_dim=128).to("cuda")
    hf.enable(m)
    rng = np.random.default_rng(14)
    t = KeyTables("tiny", (rng.normal(size=(3, 2, 128)) * 0.3).astype(np.float16),
                  rng.integers(-1, 2, size=(3, 2, 128)).astype(np.int8))
    ids = torch.tensor(rng.integers(0, 96, (2, 44)), device="cuda")
    kw = dict(tables=t) if spec in ("v3", "v4") else {}
    cu = hf.PackedCache(m.config, spec, 2, 48, backend="cuda", **kw)
    go = hf.PackedCache(m.config, spec, 2, 48, backend="golden", **kw)
    seen = _record_updates(cu)
    a = _packed_run(m, cu, ids, 20)
    b = _packed_run(m, go, ids, 20)
    assert float((a[:, :20] - b[:, :20]).abs().max()) < 1e-4 * float(b.abs().max())   # exact prefill
    assert float((a[:, 20] - b[:, 20]).abs().max()) < 2e-2 * float(b.abs().max())     # same bytes read
    ref = hf.PackedCache(m.config, spec, 2, 48, backend="golden", **kw)
    for i in (0, 2):
        for k, v in seen[i]:
            ref.layers[i].update(k, v)
        hp = cu.layers[i].store.kv.host_planes()
        w = window
        assert cu.layers[i].store.kv.host_lengths.tolist() == [w, w]
        r = cu.layers[i].store.recent              # the ring's tokens are 16-bit rows; the rest packed, p % (w - r)
        pos = np.arange(44 - w, 44 - r)
        for kind in "kv":
            assert np.array_equal(hp[f"{kind}_codes"][:, :, pos % (w - r)],
                                  ref.layers[i].store.codes[kind][:, :, pos % w, 0])
        if r:
            pos = np.arange(44 - r, 44)
            got = torch.from_dlpack(cu.layers[i].store.kv.v_sink.view("float16"))[:, :, pos % r].cpu()
            assert torch.equal(got.float(), ref.layers[i].store.raw["v"][:, :, pos % w].cpu())


def test_layer_policy_matches_the_layer_tables():
    """The one place a layer's KVCache policy and key tables are built (hf stores and the serving pool)."""
    from gpu_ref.hf.stores import layer_policy
    from sim_models import FormatParams
    f = FormatParams.preset("v2")
    pol, tab = layer_policy((f, f), 4, 2, 128)
    assert pol.sinks == 4 and not pol.center_keys and pol.key_scale is None and tab is None
    mu = np.full((2, 128), 0.5, np.float16)
    s = np.full((2, 128), 4.0, np.float16)
    pol, tab = layer_policy((f, f), 0, 2, 128, mu16=mu, s16=s)
    assert pol.center_keys and pol.key_scale == "pow2"
    assert np.array_equal(tab.mu[0], mu) and np.array_equal(tab.log2_s[0], np.full((2, 128), 2, np.int8))


# ------------------------------------------------------------------------- the recent ring
def _eager_ring(model, spec, ids):
    """Reference of a recent ring, token by token: the model's eager attention over a DynamicCache of
    golden fake-quantized K/V in which the ``recent`` most recent tokens past the sinks are replaced by
    their 16-bit values at every step (full-attention models; no key front end)."""
    from transformers import DynamicCache
    from sim_models import decode_float
    from sim_models.policy import fit_format
    pol = CachePolicy.parse(spec)
    d = model.config.head_dim
    cache = DynamicCache(config=model.config)

    def fq(x, f):
        x16 = x.to(torch.float16)
        bits = x16.contiguous().view(torch.int16).numpy().view(np.uint16)
        b, h, t, _ = bits.shape
        e = encode(bits.reshape(b, h, t, d // f.n, f.n), f)
        return torch.from_numpy(decode_float(e.codes, e.scales, f, e.zeros).reshape(b, h, t, d).astype(np.float32))

    raw = [[] for _ in cache.layers]
    for i, layer in enumerate(cache.layers):
        def update(k, v, *a, _orig=layer.update, _i=i, **kw):
            raw[_i].append((k.to(torch.float16).float(), v.to(torch.float16).float()))
            kq, vq = (fq(x, fit_format(pol.format_for(_i, kind), d, "fp16")) for x, kind in ((k, "k"), (v, "v")))
            kk, vv = (x.clone() for x in _orig(kq.to(k.dtype), vq.to(v.dtype), *a, **kw))
            n = kk.shape[2]
            kr, vr = (torch.cat([r[j] for r in raw[_i]], 2) for j in (0, 1))
            fresh = [p for p in range(n) if p < pol.sinks or p >= n - pol.recent]
            kk[:, :, fresh], vv[:, :, fresh] = kr[:, :, fresh].to(kk.dtype), vr[:, :, fresh].to(vv.dtype)
            return kk, vv
        layer.update = update
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = [model(ids[:, i:i + 1], **hf.cache_kwargs(model, cache), use_cache=True).logits
                   for i in range(ids.shape[1])]
    finally:
        model.set_attn_implementation(hf.ATTN_NAME)
    return torch.cat(out, 1)


def test_recent_ring_equals_eager_attention_over_fake_quant():
    """A query reads its last R tokens (and the sinks) in 16 bits and the others through their codes:
    the golden store, token by token, == the model's eager attention over such a cache; the ring moves
    the answer (against R = 0), and a ring as long as the sequence is the 16-bit cache."""
    # one layer: both runs quantize the same K/V (with more, a float32-vs-float64 difference in one
    # layer's attention can move the next layer's K/V across a 3-bit threshold)
    m = tiny("llama", layers=1)
    hf.enable(m)
    ids = torch.tensor(np.random.default_rng(21).integers(0, 96, (2, 20)))
    got = _packed_run(m, hf.PackedCache(m.config, "K3V3+S2+W5", 2, 20, backend="golden"), ids, 1)
    want = _eager_ring(m, "K3V3+S2+W5", ids)
    assert float((got - want).abs().max()) < 1e-4, float((got - want).abs().max())
    plain = _packed_run(m, hf.PackedCache(m.config, "K3V3+S2", 2, 20, backend="golden"), ids, 1)
    assert float((got - plain)[:, 8:].abs().max()) > 1e-2
    whole = _packed_run(m, hf.PackedCache(m.config, "K3V3+W20", 2, 20, backend="golden"), ids, 1)
    fp16 = _packed_run(m, hf.PackedCache(m.config, "fp16", 2, 20, backend="golden"), ids, 1)
    assert float((whole - fp16).abs().max()) < 1e-4


@pytest.mark.parametrize("model, spec", [("llama", "K3V3+C+S2+KS2+W5"), ("gemma3", "K3V3+S2+W3")])
def test_recent_ring_packed_prefill_equals_decode_steps(model, spec):
    """prefill='packed' with a ring (each query of the chunk reads its own last R tokens in 16 bits) ==
    feeding the tokens one at a time; Gemma 3's sliding layers (window 8) keep the ring in their window."""
    from sim_models import KeyTables
    m = tiny("llama") if model == "llama" else tiny_gemma3()
    hf.enable(m)
    rng = np.random.default_rng(22)
    n_layers = m.config.num_hidden_layers
    t = KeyTables("tiny", (rng.normal(size=(n_layers, 2, 64)) * 0.3).astype(np.float16),
                  rng.integers(-1, 2, size=(n_layers, 2, 64)).astype(np.int8))
    kw = dict(tables=t) if "+C" in spec else {}
    ids = torch.tensor(rng.integers(0, 96, (1, 20)))
    a = hf.PackedCache(m.config, spec, 1, 20, backend="golden", prefill="packed", **kw)
    b = hf.PackedCache(m.config, spec, 1, 20, backend="golden", **kw)
    with torch.no_grad():
        full = m(ids, **hf.cache_kwargs(m, a)).logits
    step = _packed_run(m, b, ids, 1)
    assert torch.allclose(full, step, atol=1e-4), float((full - step).abs().max())
    plain = hf.PackedCache(m.config, spec.replace("+W5", "").replace("+W3", ""), 1, 20, backend="golden",
                           prefill="packed", **kw)
    with torch.no_grad():
        other = m(ids, **hf.cache_kwargs(m, plain)).logits
    assert not torch.allclose(full, other, atol=1e-3)


@pytest.mark.parametrize("window,recent", [(8, 3), (8, 4), (8, 7), (8, 8), (16, 16), (12, 1), (512, 16)])
def test_sliding_moves_keep_the_window_older_than_the_ring_in_the_packed_rows(window, recent):
    """gpu_ref.cache.sliding_moves, the write plan of a sliding layer with a recent ring (the CUDA stores'):
    after every append of a random chunk (single tokens and chunks longer than the window), the decode
    kernel's reads -- side rows 0 .. min(L, r) - 1, packed rows 0 .. min(L, W) - r - 1 -- are exactly the
    window's last r tokens and the window's older tokens, each once."""
    from gpu_ref.cache import sliding_moves
    rng = np.random.default_rng([window, recent])
    w, r = window, recent
    wp = max(w - r, 1)
    side, packed = {}, {}
    n = 0
    for t in list(rng.integers(1, 2 * w + 3, 12)) + [1] * (2 * w + 5):
        t0, end = n, n + int(t)
        leave, direct, ring = sliding_moves(t0, end, w, r)
        for q in leave:
            assert side[q % r] == q                      # read from the side row before it is overwritten
            packed[q % wp] = q
        for p in direct:
            packed[p % wp] = p
        for p in ring:
            side[p % r] = p
        n = end
        length = min(n, w)
        got_side = {side[i] for i in range(min(length, r))}
        got_packed = [packed[i] for i in range(max(length - r, 0))]
        assert got_side == set(range(max(0, n - r), n)), (t0, end)
        assert sorted(got_packed) == list(range(max(0, n - w), n - r)), (t0, end)


@pytest.mark.parametrize("window,recent", [(8, 3), (8, 7), (12, 1), (16, 4)])
def test_sliding_decode_step_rows_from_the_device_position(window, recent):
    """The graph-safe decode step of gpu_ref.hf's CUDA store (one token at device position p): it always
    encodes side row p % r into packed row (p - r) % (W - r), also before any token has left the ring
    (p < r: a row nobody reads yet); the kernel's reads still see exactly the window's tokens."""
    w, r = window, recent
    wp = w - r
    side, packed = {}, {}
    for p in range(3 * w):
        packed[(p - r) % wp] = side.get(p % r, -1)       # -1: a row written before anything left the ring
        side[p % r] = p
        n = p + 1
        length = min(n, w)
        assert {side[i] for i in range(min(length, r))} == set(range(max(0, n - r), n))
        assert sorted(packed[i] for i in range(max(length - r, 0))) == list(range(max(0, n - w), n - r))
