#!/usr/bin/env python3
"""docs/MEASUREMENTS.md: every measured number of the project, as tables generated from JSON.

Reads bench/results/sim_summary.json (``make sim``), gpu_bench.json and gpu_bench_v2.json
(``bench/gpu_bench.py``), manual_measurements.json (measurements taken by hand) and
hf_bench.json (``bench/hf_bench.py``), and
writes docs/MEASUREMENTS.md. Synthesis results have their own generated file,
docs/SYNTH.md (``bench/synth_report.py``). READMEs link here instead of copying numbers.

Usage: ``.venv/bin/python bench/measurements_report.py [--check]``; ``--check`` exits 1
when docs/MEASUREMENTS.md differs from what the JSON gives (tests/test_docs.py runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "MEASUREMENTS.md"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _table(columns, rows) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _ctx(t: int) -> str:
    return f"{t // 1024}K"


def sim_section(d: dict) -> str:
    rows = d["rows"]
    n_vec = sum(r["vectors"] for r in rows)
    n_bad = sum(r["mismatches"] for r in rows)
    per_cfg = []
    for c in d["configs"]:
        cr = [r for r in rows if r["config"] == c["config"]]
        per_cfg.append([c["config"], c["kind"], f"{sum(r['vectors'] for r in cr):,}",
                        sum(r["mismatches"] for r in cr), c["manifest_latency_cycles"],
                        f"{c['build_s']:.0f}", f"{c['run_s']:.0f}"])
    first = d["configs"][0]["config"]
    detail = [[r["set"], f"{r['vectors']:,}", r["mismatches"], r["latency"],
               f"{r['cycles_per_vector']:.3f}", f"{r['vectors_per_s']:,.0f}",
               f"{r['vectors_per_cpu_s']:,.0f}"]
              for r in rows if r["config"] == first]
    return "\n\n".join([
        "## RTL against the golden model (`make sim`)",
        f"`bench/results/sim_summary.json` (a copy of `build/sim_summary.json`): "
        f"{len(d['configs'])} configs, {n_vec:,} vectors, {n_bad} mismatches, "
        f"{d['total_s']:.0f} s in all, seed {d['seed']}{', --quick' if d['quick'] else ''}; "
        f"{'all passed' if d['ok'] else 'FAILED'}.",
        _table(["config", "kind", "vectors", "mismatches", "latency (cycles)", "build (s)",
                "run (s)"], per_cfg),
        f"Per vector set, `{first}` (latency ranges above the pipeline latency include the "
        f"random output stalls; cycles/vector above 1 come from the random gaps and stalls):",
        _table(["set", "vectors", "mismatches", "latency (cycles)", "cycles/vector",
                "vectors/s", "vectors/CPU s"], detail),
    ] + coverage_section(d))


def coverage_section(d: dict) -> list[str]:
    """The functional coverage table of a sim summary (absent in older summaries)."""
    cov = d.get("coverage")
    if not cov:
        return []
    rows = [[cfg, c.get("reachable", "-"), c.get("hit", "-"),
             f"{c['percent']:.1f}%" if "percent" in c else "-",
             f"{c['floor']:g}%" if "floor" in c else "-", len(c.get("unreachable", {})),
             ", ".join(c.get("missed", [])) or "-",
             "" if c.get("sampling_s") is None else f"{c['sampling_s']:.1f}"]
            for cfg, c in cov.items()]
    return ["Functional coverage (verif/README.md, *Functional coverage*): reachable bins hit "
            "per config, the floor, bins declared unreachable (reasons in the JSON), misses, "
            "cocotb-coverage sampling time:",
            _table(["config", "reachable bins", "hit", "coverage", "floor", "unreachable",
                    "missed", "sampling (s)"], rows)]


def gpu_section(d: dict, v: dict) -> str:
    copy = d["copy"]["GBps"]
    dec = [[r["batch"], _ctx(r["context"]), f"{r['q_heads']}/{r['kv_heads']}",
            f"{r['ours_ms']:.4f}", f"{r['ours_GBps']:.0f}", f"{r['pct_copy']:.0f}",
            f"{r['sdpa_bf16_ms']:.4f}", f"{r['speedup']:.2f}x"] for r in d["decode"]]
    wcopy = d.get("write_copy", d["copy"])["GBps"]
    wr = [[r["dtype"], ", ".join(f"{k} {x}" for k, x in (r.get("tune") or {}).items()),
           f"{r['vectors']:,}", f"{r['ms']:.3f}", f"{r['GBps']:.0f}", f"{r['pct_copy']:.1f}",
           "yes" if r.get("bit_exact_65536") else "no"] for r in d["write"]]
    vw = [[r["label"], r["mode"], r["scale_round"], f"{r['ms']:.3f}", f"{r['GBps']:.0f}",
           f"{r['pct_copy']:.1f}"] for r in v["write"]]
    vd = [[r["batch"], _ctx(r["context"]),
           ", ".join(f"{x['version']} {x['ms']:.4f}" for x in r["runs"]),
           f"{r['v1_speedup']:.2f}x", f"{r['v2_speedup']:.2f}x", f"{r['sdpa_bf16_ms']:.4f}"]
          for r in v["decode"]]
    checks = "; ".join(
        f"{k}: fp16 {c['encode_fp16']['vectors']:,} vectors bit-exact "
        f"{c['encode_fp16']['bit_exact']}, bf16 {c['encode_bf16']['vectors']:,} "
        f"{c['encode_bf16']['bit_exact']}, decode rel. error vs float64 "
        f"{c['decode']['rel_err_vs_float64_packed']:.1e}"
        for k, c in v["checks"].items())
    prov = "; ".join(f"{k}: {x}" for k, x in d.get("provenance", {}).items())
    return "\n\n".join([
        "## GPU kernels (`bench/gpu_bench.py`)",
        f"`bench/results/gpu_bench.json`: {d['device']}, torch {d['torch']}, CuPy {d['cupy']}, "
        f"{d['date']}; same-run copy kernel {copy:.0f} GB/s read+write. {prov}.",
        f"Decode attention, N = 128, against torch SDPA bf16 in the same run, medians of "
        f"CUDA-graph replays; GB/s = compressed bytes read per second, % of the copy kernel's "
        f"bandwidth; decode error vs a float64 reference over the golden-dequantized cache: "
        f"{d['decode_check']['rel_err_vs_float64_packed']:.1e} relative.",
        _table(["batch", "context", "q/kv heads", "ours (ms)", "GB/s read", "% of copy",
                "SDPA bf16 (ms)", "speed-up"], dec),
        f"Write kernel (encode), N = 128 (copy kernel of that run {wcopy:.0f} GB/s):",
        _table(["dtype", "tuning", "vectors", "ms", "GB/s", "% of copy", "bit-exact"], wr),
        f"Format version 1 against version 2, `bench/results/gpu_bench_v2.json` "
        f"({v['device']}, {v['date']}; copy {v['copy']['GBps']:.0f} GB/s; {v['provenance']}). "
        f"Checks: {checks}.",
        _table(["write, N = 128", "mode", "scale_round", "ms", "GB/s", "% of copy"], vw),
        _table(["decode batch", "context", "runs (ms)", "v1 speed-up", "v2 speed-up",
                "SDPA bf16 (ms)"], vd),
    ])


def manual_section(m: dict) -> str:
    parts = ["## Measured by hand (`bench/results/manual_measurements.json`)", m["about"]]
    for r in m["records"]:
        head = f"### {r['title']}"
        meta = ", ".join(f"{k.replace('_', ' ')}: {r[k]}"
                         for k in ("date", "rtl_commit", "old_bench", "config", "conditions")
                         if k in r)
        parts += [head, meta + ".", _table(r["columns"], r["rows"])]
        parts += [n for n in r.get("notes", [])]
    return "\n\n".join(parts)


def hf_section(r: dict) -> str:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from bench.hf_bench import floor_table, tables          # the same tables as the README's
    floor = []
    if (RESULTS / "hf_floor_cpu.json").exists():
        f = _load("hf_floor_cpu.json")
        m = f["meta"]
        floor = [f"`bench/results/hf_floor_cpu.json` (`python bench/hf_bench.py floor`; CPU, torch {m['torch']}, "
                 f"transformers {m['transformers']}, {m['threads']} threads): the golden fake-quant forward's "
                 f"perplexity on the same {m['tokens']}-token window as is, with q rounded to fp16, and with "
                 "its attention outputs multiplied by 1 + eps N(0, 1) (two seeds each).",
                 "\n".join(floor_table(f))]
    return "\n\n".join([
        "## A Hugging Face model decoding from the packed cache (`bench/hf_bench.py`)",
        f"`bench/results/hf_bench.json`: {r['device']}, torch {r['torch']}, transformers "
        f"{r['transformers']}. Perplexity: SmolLM2-135M on bench/accuracy.py's 2048-token window, "
        "one forward through the kernels (1 / 2 / 4 KV splits) and the golden fake-quant forward; "
        "attention error (second table): relative to float64 over the same reconstructions, "
        "median / max over the layers. Speed: random bf16 weights, one decode step captured in a CUDA graph, "
        "median of 10 replays; concurrency: largest batch of 128K-token sequences that fits.",
        "\n".join(tables(r)),
        *floor,
    ])


def render() -> str:
    return "\n\n".join([
        "# Measurements",
        "<!-- generated by bench/measurements_report.py from bench/results/*.json; "
        "do not edit by hand -->",
        "Every number here comes from a results file under `bench/results/`; edit the JSON "
        "(or rerun the tool that writes it), then `python bench/measurements_report.py`. "
        "Synthesis (area, Fmax): [SYNTH.md](SYNTH.md). Accuracy of the format: "
        "[ACCURACY.md](ACCURACY.md).",
        sim_section(_load("sim_summary.json")),
        gpu_section(_load("gpu_bench.json"), _load("gpu_bench_v2.json")),
        manual_section(_load("manual_measurements.json")),
        hf_section(_load("hf_bench.json")),
    ]) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if docs/MEASUREMENTS.md is not what the JSON gives")
    a = ap.parse_args(argv)
    text = render()
    if a.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC.relative_to(REPO)} is stale: run bench/measurements_report.py",
                  file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
