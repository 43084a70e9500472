#!/usr/bin/env python3
"""Plots of the GPU benchmark results (``python -m bench.gpu`` draws one per results file it writes).

The kind of plot follows from the file's content; the image goes next to it with the extension .png:

* decode (gpu_bench.json): decode time vs context per batch, packed 3-bit kernel vs SDPA bf16 (GQA 64/8),
  and the speed-up over SDPA bf16 for both GQA ratios;
* write (gpu_bench_write.json): write time per variant, the current kernel next to a previous source and,
  for the key front end, a separate elementwise pass + kernel; % of the copy bandwidth;
* policy (gpu_bench_policy.json): speed-up over SDPA bf16 per bits setting (GQA 64/8), cost of sinks and
  paging relative to the plain kernel;
* versions (gpu_bench_v2.json): write-kernel time per quantizer and decode time of the version-1
  (midtread/up) and version-2 (midrise/nearest) caches next to SDPA bf16;
* kernel (gpu_bench_kernel.json): K3/V3 decode time per shape for each implementation in the run;
* layout (gpu_bench_layout.json): % of the copy bandwidth per (dtype, row mapping, value order), one bar
  per kernel source in the run;
* serve (gpu_serve_load.json): per card, running requests over the run per cache (the construction at
  the workload's mean request dashed), output tokens/s and requests/s, TTFT and TPOT p50 / p99.

Usage: python -m bench.gpu.plots JSON [JSON ...]
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

plt = None          # matplotlib.pyplot, imported by plot() (the tables need no matplotlib)


def plot_versions(r, dst):
    """gpu_bench_v2.json -> bar charts (write kernel per quantizer; decode v1 / v2 / SDPA bf16)."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.6))
    copy = r.get("copy", {}).get("GBps", float("nan"))
    wr = [w for w in r.get("write", []) if isinstance(w, dict) and "ms" in w]
    labels = [w["label"] for w in wr]
    cols = ["tab:blue" if "v1" in w["label"] else ("tab:orange" if "v2" in w["label"] else "tab:gray") for w in wr]
    bars = a1.bar(range(len(wr)), [w["ms"] for w in wr], color=cols)
    for b, w in zip(bars, wr):
        a1.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{w['ms']:.3f}\n{w['pct_copy']:.0f}%",
                ha="center", va="bottom", fontsize=7)
    a1.set_xticks(range(len(wr)))
    a1.set_xticklabels(labels, rotation=25, ha="right", fontsize=7)
    a1.set_ylabel("ms (median), 16M vectors N=128")
    a1.set_title(f"write kernel; % of copy bandwidth ({copy:.0f} GB/s)", fontsize=9)
    a1.set_ylim(0, max([w["ms"] for w in wr] + [1]) * 1.25)
    dec = [d for d in r.get("decode", []) if "v1_ms" in d]
    x = range(len(dec))
    wdt = 0.27
    for k, (key, lab, col) in enumerate((("v1_ms", "v1 midtread/up", "tab:blue"),
                                         ("v2_ms", "v2 midrise/nearest", "tab:orange"),
                                         ("sdpa_bf16_ms", "SDPA bf16", "tab:gray"))):
        vals = [d.get(key, float("nan")) for d in dec]
        a2.bar([i + (k - 1) * wdt for i in x], vals, wdt, label=lab, color=col)
    for i, d in enumerate(dec):
        a2.text(i, d.get("sdpa_bf16_ms", 0) * 1.05, f"x{d.get('v1_speedup', float('nan')):.2f} / "
                f"x{d.get('v2_speedup', float('nan')):.2f}", ha="center", fontsize=7)
    a2.set_yscale("log")
    a2.set_xticks(list(x))
    a2.set_xticklabels([f"B{d['batch']} {d['q_heads']}/{d['kv_heads']} {d['context'] // 1024}K" for d in dec])
    a2.set_ylabel("decode step, ms (median)")
    a2.set_title(f"{r.get('device', '')}: decode, speed-up over SDPA (v1 / v2)", fontsize=9)
    a2.legend(fontsize=7)
    a2.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")


def _policy_rows(r):
    out = []
    for d in r.get("decode", []):
        for row in d.get("rows", []):
            out.append(dict(row, batch=d["batch"], context=d["context"], q_heads=d["q_heads"],
                            sdpa=d.get("sdpa_bf16_ms")))
    return out


def _variant(row):
    if row.get("tune"):
        return "one q part"
    parts = []
    if row.get("sinks"):
        parts.append(f"{row['sinks']} sinks")
    if row.get("page"):
        parts.append(f"page {row['page']}")
    return ", ".join(parts) or "plain"


def policy_table(r) -> str:
    """Markdown: per (B, T), GQA 64/8, ms of each bits setting (plain), SDPA bf16, speed-ups, and the
    cost of 4 sinks / 20 side rows (v4: 4 sinks and a ring of 16 recent tokens) / 16-token pages /
    64-token pages relative to plain (K3/V3)."""
    rows = [x for x in _policy_rows(r) if x["q_heads"] == 64]
    shapes = sorted({(x["batch"], x["context"]) for x in rows})
    lines = ["| batch | context | K3/V3 ms | K4/V3 ms | K4/V4 ms | SDPA bf16 ms | speed-up K3/V3, K4/V3, K4/V4 "
             "| K3/V3 + 4 sinks | K3/V3 + 20 side rows (v4) | K3/V3 paged 16 | K3/V3 paged 64 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for b, t in shapes:
        sel = [x for x in rows if (x["batch"], x["context"]) == (b, t)]

        def ms(bits, var):
            m = [x["ms"] for x in sel if x["bits"] == bits and _variant(x) == var]
            return m[0] if m else float("nan")
        sd = sel[0]["sdpa"] or float("nan")
        plain = [ms(bits, "plain") for bits in ("K3V3", "K4V3", "K4V4")]
        cost = [100 * (ms("K3V3", v) / plain[0] - 1) for v in ("4 sinks", "20 sinks", "page 16", "page 64")]
        lines.append(f"| {b} | {t // 1024}K | " + " | ".join(f"{m:.4f}" for m in plain) + f" | {sd:.4f} | "
                     + ", ".join(f"{sd / m:.2f}x" for m in plain) + " | "
                     + " | ".join("--" if c != c else f"{c:+.1f}%" for c in cost) + " |")
    return "\n".join(lines)


def plot_policy(r, dst):
    rows = _policy_rows(r)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.6))
    colors = {"K3V3": "tab:blue", "K4V3": "tab:orange", "K4V4": "tab:green"}
    marks = {1: "o", 8: "s", 32: "^"}
    for bits, col in colors.items():
        for b, mk in marks.items():
            sel = sorted([x for x in rows if x["bits"] == bits and x["batch"] == b and x["q_heads"] == 64
                          and _variant(x) == "plain" and x.get("sdpa")], key=lambda x: x["context"])
            if sel:
                a1.plot([x["context"] / 1024 for x in sel], [x["sdpa"] / x["ms"] for x in sel], mk + "-",
                        color=col, label=f"{bits}, B={b}")
    a1.axhline(1.0, color="gray", ls=":", lw=1)
    a1.set_xscale("log", base=2)
    a1.set_xlabel("context (K tokens)")
    a1.set_ylabel("speed-up over SDPA bf16 (same run)")
    a1.set_title("decode, GQA 64/8, N=128, plain kernel")
    a1.legend(fontsize=7, ncol=3)
    a1.grid(alpha=0.3)
    vars_ = ["4 sinks", "20 sinks", "page 16", "page 64", "4 sinks, page 16", "one q part"]
    shapes = sorted({(x["batch"], x["context"]) for x in rows if x["q_heads"] == 64})
    w = 0.8 / len(vars_)
    for i, v in enumerate(vars_):
        ys = []
        for b, t in shapes:
            p = [x["ms"] for x in rows if (x["batch"], x["context"], x["bits"], x["q_heads"]) == (b, t, "K3V3", 64)
                 and _variant(x) == "plain"]
            q = [x["ms"] for x in rows if (x["batch"], x["context"], x["bits"], x["q_heads"]) == (b, t, "K3V3", 64)
                 and _variant(x) == v]
            ys.append(100 * (q[0] / p[0] - 1) if p and q else float("nan"))
        a2.bar([j + i * w for j in range(len(shapes))], ys, width=w, label=v)
    a2.axhline(3, color="k", ls=":", lw=1)
    a2.axhline(-3, color="k", ls=":", lw=1)
    a2.set_xticks([j + 0.4 - w / 2 for j in range(len(shapes))])
    a2.set_xticklabels([f"B{b}\n{t // 1024}K" for b, t in shapes], fontsize=7)
    a2.set_ylabel("time vs plain kernel, % (K3/V3)")
    copy = r.get("copy", {}).get("GBps", float("nan"))
    a2.set_title(f"{r.get('device', '')}: copy {copy:.0f} GB/s; target within 3%")
    a2.legend(fontsize=7)
    a2.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")
    print(policy_table(r))


def _kernel_ms(row, impl, bits="K3V3", sinks=0, key_scales=False):
    for x in row.get("rows", []):
        if (x["impl"] == impl and x["bits"] == bits and x["sinks"] == sinks and x["split_arg"] is None
                and bool(x.get("key_scales")) == key_scales):
            return x["ms"]
    return float("nan")


def _impl_order(rows, names):
    """Implementations in the run: those ``provenance`` names first, in its order."""
    seen = list(dict.fromkeys(x["impl"] for d in rows for x in d["rows"]))
    return [i for i in names if i in seen] + [i for i in seen if i not in names]


def kernel_table(r) -> str:
    """Markdown table of a gpu_bench_kernel.json (``python -m bench.gpu --routine kernel``): K3/V3 at each shape for
    every implementation in the run (``provenance`` names them), SDPA bf16, the cost of 4 fp16 sinks."""
    rows = [d for d in r.get("decode", []) if d.get("rows")]
    names = r.get("provenance", {}).get("impls", {})
    impls = _impl_order(rows, names)
    head = ["batch", "context"] + [f"{names.get(i, i)} us" for i in impls] + ["SDPA bf16 us"] + \
        [f"speed-up {i}" for i in impls] + ["+4 sinks ('new' source)", "v3 us (4 sinks + key scales)",
                                             "v3 speed-up"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in rows:
        ms = [_kernel_ms(d, i) for i in impls]
        sd = d.get("sdpa_bf16_ms") or float("nan")
        sink = _kernel_ms(d, "new", sinks=4) / _kernel_ms(d, "new") - 1
        v3 = _kernel_ms(d, "new", sinks=4, key_scales=True)
        out.append("| " + " | ".join([str(d["batch"]), f"{d['context'] // 1024}K"] + [f"{m * 1e3:.2f}" for m in ms]
                                      + [f"{sd * 1e3:.2f}"] + [f"{sd / m:.2f}x" for m in ms] + [f"{100 * sink:+.1f}%"]
                                      + [f"{v3 * 1e3:.2f}", f"{sd / v3:.2f}x"]) + " |")
    return "\n".join(out)


def plot_kernel(r, dst):
    """gpu_bench_kernel*.json -> decode time per shape for each implementation and SDPA bf16 (left), speed-up
    over SDPA bf16 (right); K3/V3, GQA 64/8, N=128, default plans."""
    rows = [d for d in r.get("decode", []) if d.get("rows")]
    names = r.get("provenance", {}).get("impls", {})
    impls = _impl_order(rows, names)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8))
    x = range(len(rows))
    wdt = 0.8 / (len(impls) + 1)
    cols = ["tab:blue", "tab:gray", "tab:orange", "tab:green", "tab:purple"]
    for k, i in enumerate(impls + ["sdpa"]):
        vals = [(d.get("sdpa_bf16_ms") if i == "sdpa" else _kernel_ms(d, i)) * 1e3 for d in rows]
        a1.bar([j + (k - len(impls) / 2) * wdt for j in x], vals, wdt, color="k" if i == "sdpa" else cols[k % 5],
               label="SDPA bf16" if i == "sdpa" else names.get(i, i))
        if i != "sdpa":
            a2.plot(list(x), [d["sdpa_bf16_ms"] / _kernel_ms(d, i) for d in rows], "o-", color=cols[k % 5],
                    label=names.get(i, i))
    labels = [f"B{d['batch']}/{d['context'] // 1024}K" for d in rows]
    for a in (a1, a2):
        a.set_xticks(list(x))
        a.set_xticklabels(labels)
        a.grid(alpha=0.3)
    a1.set_yscale("log")
    a1.set_ylabel("decode step, us (median of CUDA-graph replays)")
    a1.set_title("K3/V3, GQA 64/8, N=128", fontsize=9)
    a1.legend(fontsize=7)
    a2.axhline(1.0, color="gray", ls=":", lw=1)
    a2.axhline(4.5, color="k", ls=":", lw=1)
    a2.set_ylabel("speed-up over SDPA bf16 (same run)")
    copy = r.get("copy", {}).get("GBps", float("nan"))
    a2.set_title(f"{r.get('device', '')}: copy bandwidth {copy:.0f} GB/s", fontsize=9)
    a2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")
    print(kernel_table(r))


def plot_write(r, dst):
    """gpu_bench_write.json -> bars per write variant: current kernel vs the previous source (same run)."""
    rows = [w for w in r.get("write", []) if "ms" in w]
    labels = list(dict.fromkeys(w["label"] for w in rows))
    impls = list(dict.fromkeys(w["impl"] for w in rows))
    cols = {"new": "tab:orange", "old": "tab:blue", "old: separate pass + kernel": "tab:gray",
            "old: separate pass alone": "tab:olive"}
    fig, ax = plt.subplots(figsize=(12, 4.8))
    wdt = 0.8 / max(len(impls), 1)
    for k, im in enumerate(impls):
        for i, lab in enumerate(labels):
            sel = [w for w in rows if w["label"] == lab and w["impl"] == im]
            if sel:
                w = sel[0]
                b = ax.bar(i + (k - (len(impls) - 1) / 2) * wdt, w["ms"], wdt, color=cols.get(im, "k"),
                           label=im if i == next(j for j, lb in enumerate(labels)
                                                 if any(x["label"] == lb and x["impl"] == im for x in rows)) else None)
                ax.text(b[0].get_x() + wdt / 2, w["ms"], f"{w['ms']:.2f}\n{w['pct_copy']:.0f}%", ha="center",
                        va="bottom", fontsize=6)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms (median), 16M vectors N=128 (log)")
    copy = r.get("copy", {}).get("GBps", float("nan"))
    ax.set_title(f"write kernel, {r.get('device', '')}; labels: ms and % of the copy bandwidth ({copy:.0f} GB/s)",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")


def plot_layout(r, dst):
    """gpu_bench_layout.json -> % of copy per (dtype, case), one bar per source (same run), 85 % target line."""
    rows = [w for w in r.get("write", []) if "pct_copy" in w]
    groups = list(dict.fromkeys((w["dtype"], w["case"]) for w in rows))
    srcs = list(dict.fromkeys(w["source"] for w in rows))
    fig, ax = plt.subplots(figsize=(11, 4.4))
    wdt = 0.8 / max(len(srcs), 1)
    for k, src in enumerate(srcs):
        xs, ys = [], []
        for i, (dt, case) in enumerate(groups):
            sel = [w for w in rows if (w["dtype"], w["case"], w["source"]) == (dt, case, src)]
            if sel:
                xs.append(i + (k - (len(srcs) - 1) / 2) * wdt)
                ys.append(sel[0]["pct_copy"])
        bars = ax.bar(xs, ys, wdt, label=src)
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + wdt / 2, y, f"{y:.1f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(85, color="k", ls="--", lw=0.8, label="target 85 %")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([f"{dt}\n{case}" for dt, case in groups], fontsize=7)
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of copy bandwidth (median)")
    copy = r.get("copy", {}).get("GBps", float("nan"))
    ax.set_title(f"write kernel, {r.get('nvec', 0)} vectors N=128, {r.get('device', '')}; "
                 f"copy {copy:.0f} GB/s", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")


def plot_peers(r, dst):
    """gpu_bench_peers.json -> per card, decode time of every implementation relative to the card's best bf16
    kernel (FlashInfer or SDPA), per shape; above 1 is faster."""
    cards = list(r["cards"].values())
    fig, axes = plt.subplots(1, len(cards), figsize=(6.5 * len(cards), 4.6), squeeze=False)
    impls = (("ours_K3V3", "ours K3V3", "tab:blue"), ("ours_v3", "ours v3", "tab:cyan"),
             ("flashinfer_fp8_e4m3", "FlashInfer fp8 e4m3", "tab:orange"),
             ("flashinfer_bf16", "FlashInfer bf16", "tab:red"), ("sdpa_bf16", "SDPA bf16", "tab:gray"),
             ("read_same_bytes", "read of our bytes", "k"))
    for ax, c in zip(axes[0], cards):
        rows = [x for x in c.get("rows", []) if x.get("best_bf16_ms")]
        w = 0.8 / len(impls)
        for k, (key, lab, col) in enumerate(impls):
            vals = [x["best_bf16_ms"] / x[key]["ms"] if (x.get(key) or {}).get("ms") else float("nan") for x in rows]
            ax.bar([i + (k - len(impls) / 2 + 0.5) * w for i in range(len(rows))], vals, w, label=lab, color=col)
        ax.axhline(1.0, color="gray", ls=":", lw=1)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([f"B{x['batch']}/{x['context'] // 1024}K" for x in rows])
        ax.set_ylabel("speed-up over the best bf16 kernel")
        ax.set_title(f"{c['device']}: decode, N=128, GQA 64/8", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")


def plot(src, dst=None):
    """The plot of the results file ``src`` (its kind read from its content) into ``dst``, by default the
    file's name with .png."""
    global plt
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot
    plt = matplotlib.pyplot
    dst = dst or os.path.splitext(src)[0] + ".png"
    with open(src) as f:
        r = json.load(f)
    if r.get("benchmark") == "serve_load":
        return plot_serve_load(r, dst)
    if "cards" in r:
        return plot_peers(r, dst)
    if r.get("write") and isinstance(r["write"], list) and "case" in r["write"][0]:
        return plot_layout(r, dst)
    if r.get("write") and isinstance(r["write"], list) and "impl" in r["write"][0]:
        return plot_write(r, dst)
    if r.get("decode") and "impl" in (r["decode"][0].get("rows") or [{}])[0]:
        return plot_kernel(r, dst)
    if r.get("decode") and "rows" in r["decode"][0]:
        return plot_policy(r, dst)
    if "versions" in r:
        return plot_versions(r, dst)
    if r.get("decode"):
        return plot_decode(r, dst)
    return None


def plot_serve_load(r, dst):
    """gpu_serve_load.json -> one row per card: running requests over time per cache, throughput, TTFT and
    TPOT (p50 solid, p99 hatched)."""
    cards = [(k, e) for k, e in r.get("cards", {}).items() if any("wall_s" in c for c in e["caches"].values())]
    if not cards:
        return None
    fig, axes = plt.subplots(len(cards), 4, figsize=(17, 3.8 * len(cards)), squeeze=False)
    colors = {"bf16": "tab:gray", "v3": "tab:blue", "K3V3": "tab:orange"}
    for (card, e), (a0, a1, a2, a3) in zip(cards, axes):
        caches = [(n, c) for n, c in e["caches"].items() if "wall_s" in c]
        for n, c in caches:
            tl = c.get("timeline") or []
            col = colors.get(n)
            a0.plot([x[0] for x in tl], [x[1] for x in tl], "-", color=col, label=f"{n} running")
            a0.axhline(c["concurrency_by_construction"]["at_mean"], color=col, ls="--", lw=1)
        a0.set_xlabel("s")
        a0.set_ylabel("requests running")
        a0.set_title(f"{card}\nrunning requests (dashed: the pool holds at the mean)", fontsize=9)
        a0.legend(fontsize=7)
        a0.grid(alpha=0.3)
        x = np.arange(len(caches))
        names = [n for n, _ in caches]
        cols = [colors.get(n, "tab:green") for n in names]
        a1.bar(x - 0.2, [c["output_tokens_per_s"] for _, c in caches], 0.4, color=cols)
        a1b = a1.twinx()
        a1b.bar(x + 0.2, [c["requests_per_s"] for _, c in caches], 0.4, color=cols, hatch="//", alpha=0.5)
        a1.set_ylabel("output tokens/s (solid)")
        a1b.set_ylabel("requests/s (hatched)")
        for ax, key, unit, scale in ((a2, "ttft_s", "TTFT, s", 1), (a3, "tpot_ms", "TPOT, ms", 1)):
            ax.bar(x - 0.2, [(c[f"{key}_p50"] or 0) * scale for _, c in caches], 0.4, color=cols, label="p50")
            ax.bar(x + 0.2, [(c[f"{key}_p99"] or 0) * scale for _, c in caches], 0.4, color=cols, hatch="//",
                   alpha=0.5, label="p99")
            ax.set_ylabel(unit)
            ax.legend(fontsize=7)
        for ax in (a1, a2, a3):
            ax.set_xticks(x)
            ax.set_xticklabels(names)
            ax.grid(alpha=0.3, axis="y")
        w = e["workload"]
        pool = max(c["pool_bytes"] for _, c in caches)

        def tok(n):
            return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)
        a1.set_title(f"{w['requests']} requests, {w['clients']} clients, {tok(w['context_min'])}-"
                     f"{tok(w['context_max'])} tokens,\npool {pool / 2**30:.3g} GiB each", fontsize=9)
        a2.set_title("TTFT p50 / p99 (hatched)\n" + e.get("description", "")[:70], fontsize=8)
        a3.set_title("TPOT p50 / p99 (hatched)", fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    plt.close(fig)
    print(f"wrote {dst}")


def plot_decode(r, dst):
    """gpu_bench.json -> decode time vs context per batch (packed kernel vs SDPA bf16, GQA 64/8), speed-ups."""
    rows = [d for d in r.get("decode", []) if "ours_ms" in d]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.6))
    colors = {1: "tab:blue", 8: "tab:orange", 32: "tab:green"}
    for b in sorted({d["batch"] for d in rows}):
        sel = sorted([d for d in rows if d["batch"] == b and d["q_heads"] == 64], key=lambda d: d["context"])
        if not sel:
            continue
        x = [d["context"] / 1024 for d in sel]
        a1.plot(x, [d["ours_ms"] for d in sel], "o-", color=colors.get(b), label=f"3-bit fused, B={b}")
        a1.plot(x, [d.get("sdpa_bf16_ms", float("nan")) for d in sel], "s--", color=colors.get(b),
                alpha=0.6, label=f"SDPA bf16, B={b}")
    a1.set_xscale("log", base=2)
    a1.set_yscale("log")
    a1.set_xlabel("context (K tokens)")
    a1.set_ylabel("decode step, ms (median)")
    a1.set_title("GQA 64/8, N=128")
    a1.legend(fontsize=7)
    a1.grid(alpha=0.3)
    for hq, mk in ((64, "o"), (32, "^")):
        for b in sorted({d["batch"] for d in rows}):
            sel = sorted([d for d in rows if d["batch"] == b and d["q_heads"] == hq], key=lambda d: d["context"])
            if sel:
                a2.plot([d["context"] / 1024 for d in sel], [d.get("speedup", float("nan")) for d in sel],
                        mk + "-", color=colors.get(b), label=f"B={b}, {hq}/8")
    a2.axhline(4.5, color="k", ls=":", lw=1)
    a2.axhline(1.0, color="gray", ls=":", lw=1)
    a2.set_xscale("log", base=2)
    a2.set_xlabel("context (K tokens)")
    a2.set_ylabel("speed-up over SDPA bf16")
    copy = r.get("copy", {}).get("GBps", float("nan"))
    a2.set_title(f"{r.get('device', '')}: copy bandwidth {copy:.0f} GB/s")
    a2.legend(fontsize=7, ncol=2)
    a2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        plot(path)
