#!/usr/bin/env python3
"""Where a placement's routing congestion sits: a summary of nextpnr router2 heatmaps.

nextpnr-ecp5 ``--router router2 --router2-heatmap PREFIX`` writes, after each routing
iteration i, ``PREFIX_congestion_by_net_i.csv`` (net name, overused wires it uses),
``PREFIX_congestion_by_wiretype_i.csv`` (wire type, count of wires with 0, 1, 2, ...
nets bound) and ``PREFIX_congestion_by_coordinate_i.csv`` (overused wires per tile, one
CSV row per grid row). This script reads one iteration and writes JSON:

* ``by_module``: overused wire uses per DUT submodule (the net name's first two parts,
  ``dut.ifwht``; ``dut`` alone for the top level; every non-``dut`` net is ``harness``),
  with its share of the total;
* ``by_net_family``: the same per net name with indexes and digits folded
  (``dut.ifwht.r#_lane#``), the largest ``--top``; ``by_net_stage`` with the first
  digit run of the net's own name kept (``dut.ifwht.r7_lane#``: a register stage);
* ``by_wiretype``: overused wires (two or more nets bound) per wire type;
* ``blocks``: overuse per ``--block`` x ``--block`` tile block, the densest ``--top``,
  and the share of the total in the densest quarter of the non-empty blocks;
* ``iterations``: overused wires per iteration from the router2 log (``--log``).

Usage: ``.venv/bin/python bench/pnr_congestion.py DIR [--prefix heat_] [--iter N]
[--log DIR/nextpnr.log] [--out FILE.json]`` (default: the last iteration in DIR).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections import Counter
from pathlib import Path


def module_of(net: str) -> str:
    """Submodule of a net: ``dut.<sub>`` for ``dut.<sub>.<name>``, ``dut`` for a top-level
    DUT net, ``harness`` for anything outside ``dut``."""
    parts = net.split(".")
    if parts[0] != "dut":
        return "harness"
    return ".".join(parts[:2]) if len(parts) > 2 else "dut"


def family_of(net: str, keep_first: bool = False) -> str:
    """A net name with bit indexes removed and digit runs folded to ``#``; with
    ``keep_first`` the first digit run of its last dotted part is kept."""
    net = re.sub(r"\[\d+\]", "", net)
    if not keep_first:
        return re.sub(r"\d+", "#", net)
    head, _, last = net.rpartition(".")
    m = re.search(r"\d+", last)
    if m is None:
        return net
    last = last[:m.end()] + re.sub(r"\d+", "#", last[m.end():])
    return f"{head}.{last}" if head else last


def read_by_net(path: Path) -> list[tuple[str, int]]:
    """(net, overused wires) rows of a congestion-by-net CSV."""
    rows = []
    for r in csv.reader(path.open()):
        if len(r) >= 2 and r[1].strip().isdigit():
            rows.append((r[0], int(r[1])))
    return rows


def read_wiretypes(path: Path) -> dict[str, int]:
    """Overused wires (bound to two or more nets) per wire type of a by-wiretype CSV."""
    out = {}
    rows = list(csv.reader(path.open()))
    for r in rows[1:]:
        counts = [int(x) for x in r[1:] if x.strip()]
        if counts:
            out[r[0]] = sum(counts[2:])
    return out


def read_grid(path: Path) -> list[list[int]]:
    """The per-tile overuse matrix of a by-coordinate CSV (ragged rows kept)."""
    grid = [[int(x) for x in r if x.strip()] for r in csv.reader(path.open())]
    return [r for r in grid if r]


def block_summary(grid: list[list[int]], block: int, top: int) -> dict:
    """Overuse summed over block x block tiles: the densest ``top`` blocks (row and column
    of their first tile) and the share of the total in the densest quarter of the
    non-empty blocks."""
    sums = Counter()
    for y, row in enumerate(grid):
        for x, v in enumerate(row):
            sums[(y // block * block, x // block * block)] += v
    total = sum(sums.values())
    nonzero = sorted((v for v in sums.values() if v), reverse=True)
    quarter = nonzero[:max(1, len(nonzero) // 4)] if nonzero else []
    return {"block_tiles": block, "total": total, "nonempty_blocks": len(nonzero),
            "densest_quarter_share": round(sum(quarter) / total, 4) if total else 0.0,
            "densest": [{"row": r, "col": c, "overuse": v}
                        for (r, c), v in sums.most_common(top) if v]}


def log_iterations(path: Path) -> list[dict]:
    """router2's ``iter=N wires=W overused=O overuse=U`` lines of a nextpnr log."""
    pat = re.compile(r"iter=(\d+) wires=(\d+) overused=(\d+) overuse=(\d+)")
    return [{"iter": int(a), "wires": int(b), "overused": int(c), "overuse": int(d)}
            for a, b, c, d in pat.findall(path.read_text(errors="replace"))]


def summarize(d: Path, prefix: str = "heat_", it: int | None = None, top: int = 20,
              block: int = 8, log: Path | None = None) -> dict:
    """The JSON summary (module docstring) of iteration ``it`` (default: the last one
    with a by-net CSV) of the heatmaps ``d/{prefix}_congestion_by_*_{it}.csv``.
    Raises FileNotFoundError when no such heatmap exists."""
    pat = re.compile(re.escape(prefix) + r"_congestion_by_net_(\d+)\.csv$")
    its = sorted(int(m.group(1)) for p in d.iterdir() if (m := pat.match(p.name)))
    if not its:
        raise FileNotFoundError(f"no {prefix}_congestion_by_net_<i>.csv in {d}")
    it = its[-1] if it is None else it
    f = lambda kind: d / f"{prefix}_congestion_by_{kind}_{it}.csv"   # noqa: E731
    nets = read_by_net(f("net"))
    total = sum(c for _, c in nets)
    mods, fams, stages = Counter(), Counter(), Counter()
    for n, c in nets:
        mods[module_of(n)] += c
        fams[family_of(n)] += c
        stages[family_of(n, keep_first=True)] += c
    share = lambda v: round(v / total, 4) if total else 0.0          # noqa: E731
    out = {"iteration": it, "iterations_available": its, "nets_on_overused_wires": len(nets),
           "overused_wire_uses": total,
           "by_module": [{"module": k, "uses": v, "share": share(v)} for k, v in mods.most_common()],
           "by_net_family": [{"family": k, "uses": v, "share": share(v)}
                             for k, v in fams.most_common(top)],
           "by_net_stage": [{"family": k, "uses": v, "share": share(v)}
                            for k, v in stages.most_common(top)]}
    if f("wiretype").exists():
        wt = read_wiretypes(f("wiretype"))
        out["by_wiretype"] = dict(sorted(((k, v) for k, v in wt.items() if v),
                                         key=lambda kv: -kv[1]))
    if f("coordinate").exists():
        out["blocks"] = block_summary(read_grid(f("coordinate")), block, top)
    if log is not None:
        out["iterations"] = log_iterations(log)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="directory of the router2 heatmap CSVs")
    ap.add_argument("--prefix", default="heat_", help="the --router2-heatmap prefix (default: %(default)s)")
    ap.add_argument("--iter", type=int, default=None, help="routing iteration (default: the last)")
    ap.add_argument("--top", type=int, default=20, help="net families and blocks listed")
    ap.add_argument("--block", type=int, default=8, help="tiles per block side")
    ap.add_argument("--log", type=Path, default=None, help="the routing run's nextpnr log")
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default: stdout)")
    a = ap.parse_args(argv)
    if a.top < 1 or a.block < 1:
        ap.error(f"--top and --block must be >= 1, got {a.top}, {a.block}")
    try:
        res = summarize(a.dir, a.prefix, a.iter, a.top, a.block, a.log)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = json.dumps(res, indent=1) + "\n"
    if a.out is None:
        sys.stdout.write(text)
    else:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
