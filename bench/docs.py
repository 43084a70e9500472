"""The generated blocks of the docs, rendered from the committed results under bench/results/.

Usage: ``python -m bench.docs [--check] [--only NAME[,NAME]]`` from the repository root.

A generated block in a markdown file is the text between

    <!-- BEGIN GENERATED NAME: python -m bench.docs; do not edit by hand -->
    <!-- END GENERATED NAME -->

(text outside the markers is written by hand and kept). The blocks (:data:`BLOCKS`):

  README.md             results   headline numbers, one row per domain, each with its record
  docs/HARDWARE.md      synth     synthesis records: area, Fmax, critical paths, parts, flow control,
                                  key front end, K/V error vs the BFP mantissa width
  docs/VERIFICATION.md  sim       make sim: vectors, mismatches, latency per config and vector set,
                                  functional coverage
  docs/GPU.md           gpu       GPU kernels: decode against SDPA bf16, write kernel, cache
                                  policies, paged pools
  docs/GPU.md           hf        a transformers model decoding from the packed cache: perplexity,
                                  attention error, decode step, concurrency, noise floor
  docs/ACCURACY.md      accuracy  the format study: the key-treatment table of both models, one
                                  table per model
  docs/ACCURACY.md      tasks     task quality: pass rates and agreement with the 16-bit cache per
                                  policy and backend (bench/accuracy/tasks.py)

Every block reads only the files :data:`INPUTS` names for it (tests/test_results.py holds the
committed results to that list). ``--check`` writes nothing and exits 1 when a block is not what
the results render (2 when a file or a block's markers are missing).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"

#: block name -> the markdown file holding it (relative to the repository root)
BLOCKS = {
    "results": "README.md",
    "synth": "docs/HARDWARE.md",
    "sim": "docs/VERIFICATION.md",
    "gpu": "docs/GPU.md",
    "hf": "docs/GPU.md",
    "peers": "docs/GPU.md",
    "serve_load": "docs/GPU.md",
    "accuracy": "docs/ACCURACY.md",
    "tasks": "docs/ACCURACY.md",
}
#: the key-treatment study's models, in table order
MODELS = ("smollm2-135m", "gemma3-270m")
#: the models the peers are compared on (the head_dim-128 model has no passkey record)
PEER_MODELS = (*MODELS, "qwen2.5-coder-1.5b")
#: the models with a task-quality record (bench/accuracy/tasks.py)
TASK_MODELS = ("smollm2-135m", "qwen2.5-coder-1.5b")
#: block name -> the files under bench/results it reads or shows (images)
INPUTS = {
    "results": ("sim_summary.json", "formal.json", "synth.json", "gpu_bench.json",
                "gpu_bench_write.json", "hf_bench.json",
                *(f"accuracy/{m}.json" for m in PEER_MODELS)),
    "synth": ("synth.json", "synth_mantissa.json", "synth_area.png", "synth_mantissa.png"),
    "sim": ("sim_summary.json",),
    "gpu": ("gpu_bench.json", "gpu_bench_write.json", "gpu_bench_policy.json",
            "gpu_bench_paging.json", "gpu_bench.png", "gpu_bench_write.png",
            "gpu_bench_policy.png"),
    "hf": ("hf_bench.json", "hf_floor_cpu.json", "hf_bench.png"),
    "peers": ("gpu_bench_peers.json", "gpu_bench_peers.png"),
    "serve_load": ("gpu_serve_load.json", "gpu_serve_load.png"),
    "accuracy": (*(f"accuracy/{m}{x}" for m in MODELS for x in (".json", "_passkey.json",
                                                                 "_pareto.png")),
                 *(f"accuracy/{m}{x}" for m in PEER_MODELS if m not in MODELS
                   for x in (".json", "_passkey.json", "_pareto.png")),
                 "accuracy/key_treatments.png", "accuracy/peers.png", "accuracy/levers.png"),
    "tasks": tuple(f"accuracy/{m}_tasks.json" for m in TASK_MODELS),
}
#: results file -> the command that writes it (named in the error of a missing file)
WRITERS = {
    "sim_summary.json": "make sim (copy build/sim_summary.json)",
    "formal.json": "make formal (copy build/formal.json)",
    "synth.json": "make synth",
    "synth_mantissa.json": "python -m bench.synth mantissa",
    "hf_bench.json": "python -m bench.gpu --routine hf --data DIR",
    "hf_floor_cpu.json": "python -m bench.gpu.hf floor --data DIR",
    "gpu_bench.json": "python -m bench.gpu --routine decode",
    "gpu_bench_write.json": "python -m bench.gpu --routine write",
    "gpu_bench_policy.json": "python -m bench.gpu --routine policy",
    "gpu_bench_paging.json": "python -m bench.gpu --routine paging",
    "gpu_bench_peers.json": "python -m bench.gpu --routine peers",
    "gpu_serve_load.json": "python -m bench.gpu --routine serve",
}
#: the study configuration the README's accuracy rows quote (it equals the recommended cache
#: policy preset v4)
HEADLINE_CONFIG = "v3+W16"


def begin(name: str) -> str:
    return f"<!-- BEGIN GENERATED {name}: python -m bench.docs; do not edit by hand -->"


def end(name: str) -> str:
    return f"<!-- END GENERATED {name} -->"


class DocsError(Exception):
    """A missing file or marker, or an unreadable results file (the message names it)."""


def inputs() -> set[str]:
    """Every file under bench/results (relative to it) that a block reads or shows."""
    return {f for files in INPUTS.values() for f in files}


def _load(results: Path, name: str) -> dict:
    path = results / name
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        how = WRITERS.get(name, ("python -m bench.accuracy --tasks" if name.endswith("_tasks.json") else
                                 "python -m bench.accuracy") if name.startswith("accuracy/") else "?")
        raise DocsError(f"{path}: no such results file (written by {how})") from None
    except ValueError as err:
        raise DocsError(f"{path}: not JSON ({err})") from None


def _table(columns, rows) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _ctx(t: int) -> str:
    return f"{t // 1024}K"


# ------------------------------------------------------------------------------------------ sim
def sim_block(d: dict) -> str:
    rows = d["rows"]
    n_vec = sum(r["vectors"] for r in rows)
    n_bad = sum(r["mismatches"] for r in rows)
    per_cfg = []
    for c in d["configs"]:
        cr = [r for r in rows if r["config"] == c["config"]]
        per_cfg.append([f"`{c['config']}`", c["kind"], f"{sum(r['vectors'] for r in cr):,}",
                        sum(r["mismatches"] for r in cr), c["manifest_latency_cycles"],
                        f"{c['build_s']:.0f}", f"{c['run_s']:.0f}"])
    first = d["configs"][0]["config"]
    detail = [[r["set"], f"{r['vectors']:,}", r["mismatches"], r["latency"],
               f"{r['cycles_per_vector']:.3f}", f"{r['vectors_per_s']:,.0f}",
               f"{r['vectors_per_cpu_s']:,.0f}"]
              for r in rows if r["config"] == first]
    parts = [
        f"`bench/results/sim_summary.json`: {len(d['configs'])} configs, {n_vec:,} vectors, "
        f"{n_bad} mismatches, {d['total_s']:.0f} s in all, seed {d['seed']}"
        f"{', --set quick' if d['quick'] else ''}; {'all passed' if d['ok'] else 'FAILED'}.",
        _table(["config", "kind", "vectors", "mismatches", "latency (cycles)", "build (s)",
                "run (s)"], per_cfg),
        f"Per vector set, `{first}` (latency ranges above the pipeline latency include the "
        f"random output stalls; cycles/vector above 1 come from the random gaps and stalls):",
        _table(["set", "vectors", "mismatches", "latency (cycles)", "cycles/vector",
                "vectors/s", "vectors/CPU s"], detail),
    ]
    cov = d.get("coverage")
    if cov:
        crow = [[f"`{cfg}`", c.get("reachable", "-"), c.get("hit", "-"),
                 f"{c['percent']:.1f}%" if "percent" in c else "-",
                 f"{c['floor']:g}%" if "floor" in c else "-", len(c.get("unreachable", {})),
                 ", ".join(c.get("missed", [])) or "-",
                 "" if c.get("sampling_s") is None else f"{c['sampling_s']:.1f}"]
                for cfg, c in cov.items()]
        parts += ["Functional coverage: reachable bins hit per config, the floor, bins declared "
                  "unreachable (reasons in the JSON), misses, cocotb-coverage sampling time:",
                  _table(["config", "reachable bins", "hit", "coverage", "floor", "unreachable",
                          "missed", "sampling (s)"], crow)]
    return "\n\n".join(parts)


# ------------------------------------------------------------------------------------------ gpu
def _run_of(d: dict) -> str:
    return f"{d['device']}, torch {d['torch']}, CuPy {d['cupy']}"


KEY_FRONT = {0: "-", 1: "key scales", 2: "centering", 3: "key scales + centering"}


def gpu_block(d: dict, w: dict, pol: dict, pg: dict, img: str) -> str:
    from bench.gpu.plots import policy_table
    dec = [[r["batch"], _ctx(r["context"]), f"{r['q_heads']}/{r['kv_heads']}",
            f"{r['ours_ms']:.4f}", f"{r['ours_GBps']:.0f}", f"{r['pct_copy']:.0f}",
            f"{r['sdpa_bf16_ms']:.4f}", f"{r['speedup']:.2f}x"]
           for r in d["decode"] if "ours_ms" in r]
    seen, wr = set(), []
    for r in w["write"]:
        key = (r["mode"], r["scale_round"], r["dtype"], r["bits"], r["keyf"])
        if r["impl"] != "new" or key in seen:
            continue
        seen.add(key)
        wr.append([f"{r['mode']}/{r['scale_round']}", r["dtype"], r["bits"], KEY_FRONT[r["keyf"]],
                   f"{r['ms']:.3f}", f"{r['GBps']:.0f}", f"{r['pct_copy']:.1f}",
                   "yes" if r.get("bit_exact_65536") else "no"])
    paging = []
    for s in pg["paging"]:
        for bits in dict.fromkeys(x["bits"] for x in s["rows"]):
            ms = {x["page"]: x["ms"] for x in s["rows"] if x["bits"] == bits and not x.get("sinks")}
            if None not in ms:
                continue
            paging.append([s["batch"], _ctx(s["context"]), f"{s['q_heads']}/{s['kv_heads']}", bits,
                           f"{ms[None]:.4f}"]
                          + [f"{ms[p]:.4f} ({100 * (ms[p] / ms[None] - 1):+.1f}%)" if p in ms
                             else "-" for p in (16, 64)])
    chk = d["decode_check"]["rel_err_vs_float64_packed"]
    return "\n\n".join([
        f"Decode attention, N = 128, K3/V3 (`bench/results/gpu_bench.json`: {_run_of(d)}; copy "
        f"kernel {d['copy']['GBps']:.0f} GB/s read + write in the same run). Medians of CUDA-graph "
        "replays against torch SDPA bf16 on the same shapes; GB/s = compressed bytes read per "
        "second, % of the copy kernel's bandwidth; the decode error against a float64 reference "
        f"over the golden-dequantized cache is {chk:.1e} relative.",
        _table(["batch", "context", "q/kv heads", "ours (ms)", "GB/s read", "% of copy",
                "SDPA bf16 (ms)", "speed-up"], dec),
        f"![decode]({img}gpu_bench.png)",
        f"Write kernel (encode), 16M vectors of N = 128 (`bench/results/gpu_bench_write.json`: "
        f"{_run_of(w)}; copy kernel {w['copy']['GBps']:.0f} GB/s); each variant checked "
        "bit-exact against the golden model on 65,536 mixed vectors first:",
        _table(["quantizer (mode/scale round)", "dtype", "b", "key front end", "ms", "GB/s",
                "% of copy", "bit-exact"], wr),
        f"![write]({img}gpu_bench_write.png)",
        f"Cache policies, GQA 64/8 (`bench/results/gpu_bench_policy.json`: {_run_of(pol)}): "
        "decode time per bits setting against SDPA bf16, and the cost of 4 fp16 sinks, of the 20 "
        "fp16 side rows of `v4` (4 sinks and the ring of 16 recent tokens) and of paged pools "
        "relative to the plain K3/V3 kernel:",
        policy_table(pol),
        f"![policy]({img}gpu_bench_policy.png)",
        f"Paged pools against the contiguous layout (`bench/results/gpu_bench_paging.json`: "
        f"{_run_of(pg)}), pages of all sequences in a shuffled pool, ms (cost):",
        _table(["batch", "context", "q/kv heads", "bits", "contiguous (ms)", "16-token pages",
                "64-token pages"], paging),
    ])


def peers_block(d: dict, img: str) -> str:
    """Per card: decode time of ours, FlashInfer bf16 / fp8 e4m3, SDPA bf16 and a read of our bytes."""
    out = []
    for card, c in d["cards"].items():
        rows = []
        for r in c["rows"]:
            us = {k: 1e3 * r[k]["ms"] for k in ("ours_K3V3", "ours_v3", "flashinfer_bf16",
                                                "flashinfer_fp8_e4m3", "sdpa_bf16", "read_same_bytes")}
            k3 = r["ours_K3V3"]
            rows.append([r["batch"], _ctx(r["context"]), f"{r['q_heads']}/{r['kv_heads']}",
                         *(f"{us[k]:.1f}" for k in us),
                         f"{k3['speedup_vs_best_bf16']:.2f}x", f"{k3['speedup_vs_flashinfer_fp8_e4m3']:.2f}x",
                         f"{k3['pct_read_limit']:.0f}%"])
        out += [f"{card} (`bench/results/gpu_bench_peers.json`: torch {c['torch']}, CuPy {c['cupy']}, "
                f"FlashInfer {c['flashinfer']}, whose bf16 decode is {c['flashinfer_check']['rel_err_vs_float64']:.1e} "
                "from float64 on its check case), N = 128, 16-token pages in random order for every "
                "paged implementation, us per decode step (medians of CUDA-graph replays, one process); "
                "read = a kernel reading our K3V3 bytes once (the floor for them):",
                _table(["batch", "context", "q/kv heads", "ours K3V3", "ours v3", "FlashInfer bf16",
                        "FlashInfer fp8 e4m3", "SDPA bf16", "read", "K3V3 vs best bf16",
                        "K3V3 vs FlashInfer fp8", "K3V3 % of read"], rows)]
    return "\n\n".join([*out, f"![peers]({img}gpu_bench_peers.png)"])


def serve_load_block(d: dict, img: str) -> str:
    """Per card: the load test's caches side by side (same workload, same pool bytes)."""
    out = []
    for card, e in d["cards"].items():
        w = e["workload"]
        rows = []
        for name, c in e["caches"].items():
            cb = c["concurrency_by_construction"]
            rows.append([name, c["spec"], f"{c['pool_bytes'] / 2**30:.2f}", f"{cb['at_longest']} / {cb['at_mean']}",
                         c["concurrency_observed"], f"{c['requests_completed']}/{c['requests_sent']}",
                         f"{c['requests_per_s']:.3f}", f"{c['output_tokens_per_s']:.1f}",
                         f"{c['ttft_s_p50']:.1f} / {c['ttft_s_p99']:.1f}",
                         f"{c['tpot_ms_p50']:.0f} / {c['tpot_ms_p99']:.0f}"])
        vs = "; ".join(f"{n}: {o['requests_per_s_vs_bf16']:.2f}x the requests/s and "
                       f"{o['concurrency_by_construction_vs_bf16']:.2f}x the sequences held at the mean request"
                       + (f", greedy text identical to bf16's in {round(o['greedy_identical_fraction'] * o['compared_requests'])}"
                          f" of {o['compared_requests']} requests (common prefix "
                          f"{100 * o.get('greedy_common_prefix_fraction', float('nan')):.0f} % of the text)"
                          if "greedy_common_prefix_fraction" in o else "")
                       for n, o in e.get("vs_bf16", {}).items())
        out += [f"{card} (`bench/results/gpu_serve_load.json`, {e['mode']} mode: {e['description']}, torch "
                f"{e['torch']}): {w['requests']} streaming requests from {w['clients']} clients, prompt + max_tokens "
                f"{_ctx(w['context_min'])}-{_ctx(w['context_max'])} tokens, {w['output_min']}-{w['output_max']} "
                f"output tokens, greedy; each cache in its own process with the same pool bytes. {vs}.",
                _table(["cache", "policy", "pool GiB", "sequences held (longest / mean request)", "observed",
                        "finished", "req/s", "output tok/s", "TTFT p50 / p99 (s)", "TPOT p50 / p99 (ms)"], rows)]
    return "\n\n".join([*out, f"![load]({img}gpu_serve_load.png)"])


def hf_block(r: dict, floor: dict, img: str) -> str:
    from bench.gpu.hf import floor_table, tables
    m = floor["meta"]
    return "\n\n".join([
        f"`bench/results/hf_bench.json`: {r['device']}, torch {r['torch']}, transformers "
        f"{r['transformers']}. Perplexity: SmolLM2-135M on a 2048-token window, one forward "
        "through the kernels (1 / 2 / 4 KV splits) and the golden fake-quant forward; attention "
        "error (second table): relative to float64 over the same reconstructions, median / max "
        "over the layers. Speed: random bf16 weights, one decode step captured in a CUDA graph, "
        "median of 10 replays; concurrency: the largest batch of 128K-token sequences that fits.",
        "\n".join(tables(r)),
        f"![decode step]({img}hf_bench.png)",
        f"The noise floor of that comparison (`bench/results/hf_floor_cpu.json`, "
        f"`python -m bench.gpu.hf floor --model smollm2-135m --data DIR`, DIR from "
        f"`python -m bench.gpu.hf prep --out DIR`; CPU, torch {m['torch']}, transformers "
        f"{m['transformers']}, {m['threads']} threads): the golden fake-quant forward's "
        f"perplexity on the same {m['tokens']}-token window as is, with q rounded to fp16, and "
        "with its attention outputs multiplied by 1 + eps N(0, 1) (two seeds each).",
        "\n".join(floor_table(floor)),
    ])


# ------------------------------------------------------------------------------------- accuracy
def accuracy_block(models: dict, img: str, peer_models: dict | None = None) -> str:
    from bench.accuracy.configs import V3_STUDY, by_name
    from bench.accuracy.report import LEVER_LONG, lever_table, passkey_table, peers_table, section, v3_table
    cfg = {c.name: c for c in by_name(V3_STUDY)}

    def tb(n, meta):
        return cfg[n].table_bytes(meta["layers"], meta["kv_heads"], meta["head_dim"])
    parts = [
        "Key treatments, both models: the study configuration (its `python -m bench.accuracy "
        "--list` name), the cache policy it equals (a `CachePolicy` spec or preset, FORMAT.md "
        "section 8; '--' where it is none), bits per element at 2048 tokens of context, "
        "perplexity against fp16 (geometric mean over the model's windows; '--' where not all "
        "were run), on the first window alone, mean KL, passkey retrieved / trials (mean log p "
        "of the key tokens):",
        v3_table(models, V3_STUDY, tb, lambda n: cfg[n].policy_spec()),
        f"![key treatments]({img}accuracy/key_treatments.png)",
    ]
    peer_models = peer_models or models
    parts += [
        "Peers, every model: other projects' KV-cache formats in the same harness "
        "(bench/accuracy/peers.py; bits count every stored byte at 2048 tokens, bf16 "
        "layers and fp16 residual tokens included), against the study's `v4` (recommended), "
        "`v3` and `v3-K4V3`; vs fp16 = geometric mean of PPL / PPL_fp16 over the windows run:",
        peers_table(peer_models),
        f"![peers]({img}accuracy/peers.png)",
        "Levers on `v3`, every model: each on the `v3` policy alone, then combined "
        "(bench/accuracy/configs.py, group `lever`; the ring of 16, `v3+W16`, is the cache "
        "policy `v4`), against `v3`, `v3-K4V3`, calibrated sign masks and KIVI-3; bits count "
        "every stored byte at the windows' 2048 tokens and at "
        f"{LEVER_LONG} tokens (a ring's fp16 rows beside the codes of the same tokens); vs fp16 "
        "= geometric mean of PPL / PPL_fp16 over the windows run:",
        lever_table(peer_models),
        f"![levers]({img}accuracy/levers.png)",
        "Passkey retrieval at 8192 tokens, every configuration with trials (bench/accuracy/passkey.py: "
        "five depths; `v3+W16` is `v4` with format version 3's key rule, `v3+W16+KF` with the folded "
        "key front end of version 4): retrieved / trials (mean log p of the key tokens):",
        passkey_table(peer_models or models),
    ]
    for mid, d in peer_models.items():
        parts += [section(d["results"], by_name()).rstrip("\n"),
                  f"![{mid}]({img}accuracy/{mid}_pareto.png)"]
    return "\n\n".join(parts)


# -------------------------------------------------------------------------------------- results
def results_block(load) -> str:
    from bench.accuracy.report import partial_summary
    from rtl_gen.synth import SETS, synth_config
    sim, formal, syn = load("sim_summary.json"), load("formal.json"), load("synth.json")
    gpu, wr, hf = load("gpu_bench.json"), load("gpu_bench_write.json"), load("hf_bench.json")
    rows = []
    n_vec = sum(r["vectors"] for r in sim["rows"])
    n_bad = sum(r["mismatches"] for r in sim["rows"])
    cov = [c["percent"] for c in sim.get("coverage", {}).values() if "percent" in c]
    rows.append(["RTL against the golden model (`make sim`)",
                 f"{len(sim['configs'])} configs, {n_vec:,} vectors, {n_bad} mismatches"
                 + ("" if not cov else ", 100% functional coverage on each" if min(cov) == 100
                    else f", functional coverage {min(cov):.1f}% or more"),
                 "sim_summary.json"])
    proved = sum(p["result"] == "proved" for p in formal["proofs"])
    rows.append(["Formal proofs (`make formal`)", f"{proved} of {len(formal['proofs'])} proved",
                 "formal.json"])
    recs = {r["config"]: r for r in syn["configs"]}
    for name, _ in SETS["fmax"]:
        rec = recs.get(name)
        if not rec or not rec.get("ok") or synth_config(name).params.n != 128:
            continue
        from bench.synth.report import derived
        dv = derived(rec)
        rows.append([f"{synth_config(name).kind.capitalize()}, N = 128, ECP5-85F",
                     f"{dv['fmax']:.1f} MHz, {dv['luts']:,} LUTs, {dv['ffs']:,} FF",
                     "synth.json"])
    w = next(r for r in wr["write"] if r["impl"] == "new" and r["dtype"] == "fp16"
             and r["bits"] == 3 and r["keyf"] == 0 and r["mode"] == "midrise")
    rows.append([f"GPU write kernel, fp16, N = 128 ({wr['device']})",
                 f"{w['GBps']:.0f} GB/s, {w['pct_copy']:.0f}% of a copy", "gpu_bench_write.json"])
    top = max((r for r in gpu["decode"] if "speedup" in r),
              key=lambda r: (r["context"], r["batch"], r["q_heads"]))
    rows.append([f"GPU decode attention K3/V3, batch {top['batch']}, {_ctx(top['context'])} "
                 f"tokens, GQA {top['q_heads']}/{top['kv_heads']}",
                 f"{top['ours_ms']:.2f} ms, {top['speedup']:.1f}x SDPA bf16", "gpu_bench.json"])
    ppl = [x for name, x in hf.get("ppl", {}).items() if name != "fp16"]
    if ppl:
        rows.append(["SmolLM2-135M perplexity through the kernels (golden model)",
                     ", ".join(f"{x['spec']} {x['ppl_kernels_by_splits']['1']:.2f} "
                               f"({x['ppl_golden']:.2f})" for x in ppl), "hf_bench.json"])
    conc = {c["cache"]: c for c in hf.get("concurrency", [])}
    if "bf16" in conc and len(conc) > 1:
        best = max((c for k, c in conc.items() if k != "bf16"), key=lambda c: c["tokens_per_s"])
        b16 = conc["bf16"]
        rows.append([f"Llama-3-8B shape, 128K-token sequences on one {hf['device']}",
                     f"{best['cache']}: {best['max_batch']} sequences, "
                     f"{best['tokens_per_s']:.0f} tokens/s (bf16: {b16['max_batch']}, "
                     f"{b16['tokens_per_s']:.0f})", "hf_bench.json"])
    from bench.accuracy.configs import by_name
    from sim_models import CachePolicy
    spec = by_name([HEADLINE_CONFIG])[0].policy_spec()
    full = CachePolicy.parse(spec).spec
    policy_label = f"`{spec}`" + ("" if full == spec else f" (`{full}`)")
    for mid in PEER_MODELS:
        res = load(f"accuracy/{mid}.json")
        s = partial_summary(res, HEADLINE_CONFIG)
        if s is None:
            continue
        rows.append([f"{mid}, cache policy {policy_label}",
                     f"{s['bits']:.3f} bits per element, perplexity {100 * (s['ratio'] - 1):+.1f}% "
                     f"vs fp16 ({s['windows']} windows)", f"accuracy/{mid}.json"])
    return _table(["result", "value", "record"],
                  [[a, b, f"[{c}](bench/results/{c})"] for a, b, c in rows])


# --------------------------------------------------------------------------------------- render
def render(name: str, results: Path = RESULTS) -> str:
    """The text of block ``name`` (between its markers) from the files under ``results``."""
    if name not in BLOCKS:
        raise DocsError(f"no block {name!r} (blocks: {', '.join(BLOCKS)})")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    img = "../bench/results/" if "/" in BLOCKS[name] else "bench/results/"

    def load(f):
        return _load(results, f)
    if name == "results":
        return results_block(load)
    if name == "sim":
        return sim_block(load("sim_summary.json"))
    if name == "gpu":
        return gpu_block(load("gpu_bench.json"), load("gpu_bench_write.json"),
                         load("gpu_bench_policy.json"), load("gpu_bench_paging.json"), img)
    if name == "hf":
        return hf_block(load("hf_bench.json"), load("hf_floor_cpu.json"), img)
    if name == "peers":
        return peers_block(load("gpu_bench_peers.json"), img)
    if name == "serve_load":
        return serve_load_block(load("gpu_serve_load.json"), img)
    if name == "synth":
        from bench.synth.report import generated
        return generated(load("synth.json"), load("synth_mantissa.json"))
    if name == "tasks":
        from bench.accuracy.tasks import doc_block
        return doc_block({m: load(f"accuracy/{m}_tasks.json") for m in TASK_MODELS})
    models = {}
    for mid in MODELS:
        pk = results / f"accuracy/{mid}_passkey.json"
        models[mid] = {"results": load(f"accuracy/{mid}.json"),
                       "passkey": load(f"accuracy/{mid}_passkey.json") if pk.exists() else {}}
    peer_models = {**models, **{m: {"results": load(f"accuracy/{m}.json"),
                                    "passkey": load(f"accuracy/{m}_passkey.json")
                                    if (results / f"accuracy/{m}_passkey.json").exists() else {}}
                                for m in PEER_MODELS if m not in models}}
    return accuracy_block(models, img, peer_models)


def replace_block(text: str, name: str, body: str, where: str) -> str:
    """``text`` with block ``name``'s content replaced by ``body``; DocsError naming ``where``
    and the block if its markers are missing, repeated or out of order."""
    a, b = begin(name), end(name)
    if text.count(a) != 1 or text.count(b) != 1 or text.index(a) > text.index(b):
        raise DocsError(f"{where}: no block {name!r} (one '{a}' and, after it, one '{b}')")
    head, rest = text.split(a, 1)
    return head + a + "\n" + body + "\n" + b + rest.split(b, 1)[1]


def update(names=None, check: bool = False, root: Path = REPO, results: Path = RESULTS,
           out=sys.stdout) -> list[str]:
    """Render the blocks ``names`` (default: all) into their files under ``root``; with ``check``
    write nothing. Returns the names of the blocks that were (check: are) stale."""
    names = list(BLOCKS) if names is None else list(names)
    for n in names:
        if n not in BLOCKS:
            raise DocsError(f"no block {n!r} (blocks: {', '.join(BLOCKS)})")
    stale = []
    for doc in dict.fromkeys(BLOCKS[n] for n in names):
        path = root / doc
        if not path.is_file():
            raise DocsError(f"{doc}: no such file (it holds the block(s) "
                            f"{', '.join(n for n in names if BLOCKS[n] == doc)})")
        text = old = path.read_text()
        for n in (n for n in names if BLOCKS[n] == doc):
            new = replace_block(text, n, render(n, results), doc)
            if new != text:
                stale.append(n)
            text = new
        if text != old and not check:
            path.write_text(text)
            print(f"wrote {doc}", file=out)
    return stale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.docs", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a block is not what the results render")
    ap.add_argument("--only", help=f"comma-separated blocks ({', '.join(BLOCKS)}); default all")
    ap.add_argument("--root", type=Path, default=REPO,
                    help="the folder holding README.md and docs/ (default the repository)")
    ap.add_argument("--results", type=Path, default=RESULTS,
                    help="the results folder (default bench/results)")
    a = ap.parse_args(argv)
    names = None
    if a.only:
        names = [n.strip() for n in a.only.split(",")]
        if not all(names):
            ap.error(f"--only {a.only!r}: an empty block name (give comma-separated blocks: "
                     f"{', '.join(BLOCKS)})")
        bad = [n for n in names if n not in BLOCKS]
        if bad:
            ap.error(f"--only: no block {', '.join(bad)} (blocks: {', '.join(BLOCKS)})")
    if not a.results.is_dir():
        ap.error(f"--results {a.results}: no such folder")
    if not a.root.is_dir():
        ap.error(f"--root {a.root}: no such folder")
    try:
        stale = update(names, a.check, a.root, a.results)
    except DocsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if a.check and stale:
        print(f"stale generated blocks: {', '.join(stale)} (run python -m bench.docs)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
