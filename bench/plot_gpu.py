#!/usr/bin/env python3
"""Plot bench/results/gpu_bench.json (written by bench/gpu_bench.py) -> bench/results/gpu_bench.png.

Left: decode time vs context for each batch size, packed 3-bit kernel vs SDPA bf16 (GQA 64/8).
Right: speed-up over SDPA bf16 and % of the measured copy bandwidth, both GQA ratios.

Usage: python3 bench/plot_gpu.py [JSON] [PNG]
"""

from __future__ import annotations

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    src = argv[0] if argv else os.path.join(HERE, "results", "gpu_bench.json")
    dst = argv[1] if len(argv) > 1 else os.path.join(HERE, "results", "gpu_bench.png")
    with open(src) as f:
        r = json.load(f)
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
    main()
