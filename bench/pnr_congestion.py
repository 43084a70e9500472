#!/usr/bin/env python3
"""Where a placement's routing congestion sits: a summary of nextpnr router2 heatmaps.

nextpnr-ecp5 ``--router router2 --router2-heatmap PREFIX`` writes, after each routing
iteration i, ``PREFIX_congestion_by_net_i.csv`` (net name; over the overused wires it
is on, the sum of the other nets bound there: ``net_overuse``),
``PREFIX_congestion_by_wiretype_i.csv`` (wire type, count of wires with 0, 1, 2, ...
nets bound) and ``PREFIX_congestion_by_coordinate_i.csv`` (per tile, the nets bound to
its overused wires; one CSV line per X column, its values along Y). This script reads
one iteration and writes JSON:

* ``by_module``: ``net_overuse`` per DUT submodule (the net name's first two parts,
  ``dut.ifwht``; ``dut`` alone for the top level; every other net is ``harness``),
  with its share of the total;
* ``by_net_family``: the same per net name with indexes and digits folded
  (``dut.ifwht.r#_lane#``), the largest ``--top``; ``by_net_stage`` with the first of
  two or more digit runs of the net's own name kept (``dut.ifwht.r7_lane#``: a register
  stage; ``fold_a#`` stays one family);
* ``by_wiretype``: overused wires (two or more nets bound) per wire type;
* ``blocks``: nets on overused wires per ``--block`` x ``--block`` tile block (``x``,
  ``y`` of its first tile), the densest ``--top``, and the share of the total in the
  densest quarter of the non-empty blocks;
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from rtl_gen.synth import HARNESS_DUT  # noqa: E402


def module_of(net: str) -> str:
    """Submodule of a net: ``dut.<sub>`` for ``dut.<sub>.<name>``, ``dut`` for a top-level
    DUT net, ``harness`` for anything outside the DUT (``rtl_gen.synth.HARNESS_DUT``)."""
    parts = net.split(".")
    if parts[0] != HARNESS_DUT:
        return "harness"
    return ".".join(parts[:2]) if len(parts) > 2 else HARNESS_DUT


def family_of(net: str, keep_first: bool = False) -> str:
    """A net name with bit indexes removed and digit runs folded to ``#``; with
    ``keep_first`` the first digit run of its last dotted part is kept when that part
    has two or more (a stage number before a lane number)."""
    net = re.sub(r"\[\d+\]", "", net)
    head, _, last = net.rpartition(".")
    if not keep_first or len(re.findall(r"\d+", last)) < 2:
        return re.sub(r"\d+", "#", net)
    m = re.search(r"\d+", last)
    last = last[:m.end()] + re.sub(r"\d+", "#", last[m.end():])
    return f"{head}.{last}" if head else last


def _int(path: Path, line: int, field: str) -> int:
    """A non-negative integer CSV field; ValueError naming the file and line otherwise."""
    if not field.strip().isdigit():
        raise ValueError(f"{path}:{line}: expected a non-negative integer, got {field!r}")
    return int(field)


def _fields(row: list[str]) -> list[str]:
    """A CSV row without the empty field after nextpnr's trailing comma."""
    return row[:-1] if row and row[-1] == "" else row


def read_by_net(path: Path) -> list[tuple[str, int]]:
    """(net, net_overuse) rows of a congestion-by-net CSV; ValueError on a malformed row."""
    rows = []
    for i, r in enumerate(csv.reader(path.open(errors="replace")), 1):
        if not r:
            continue
        if len(r) < 2 or not r[0]:
            raise ValueError(f"{path}:{i}: expected 'net,count', got {','.join(r)!r}")
        rows.append((r[0], _int(path, i, r[1])))
    return rows


def read_wiretypes(path: Path) -> dict[str, int]:
    """Overused wires (bound to two or more nets) per wire type of a by-wiretype CSV."""
    out = {}
    rows = list(csv.reader(path.open(errors="replace")))
    for i, r in enumerate(rows[1:], 2):
        fields = _fields(r)[1:]
        if fields:
            out[r[0]] = sum(_int(path, i, x) for x in fields[2:])
    return out


def read_grid(path: Path) -> list[list[int]]:
    """The per-tile matrix of a by-coordinate CSV, ``grid[x][y]`` (one line per X column,
    blank lines kept as empty columns)."""
    grid = []
    for i, r in enumerate(csv.reader(path.open(errors="replace")), 1):
        grid.append([_int(path, i, x) for x in _fields(r)])
    return grid


def block_summary(grid: list[list[int]], block: int, top: int) -> dict:
    """``grid[x][y]`` summed over block x block tiles: the densest ``top`` blocks (x and y
    of their first tile) and the share of the total in the densest quarter of the
    non-empty blocks."""
    sums = Counter()
    for x, col in enumerate(grid):
        for y, v in enumerate(col):
            sums[(x // block * block, y // block * block)] += v
    total = sum(sums.values())
    nonzero = sorted((v for v in sums.values() if v), reverse=True)
    quarter = nonzero[:max(1, len(nonzero) // 4)] if nonzero else []
    return {"block_tiles": block, "total": total, "nonempty_blocks": len(nonzero),
            "densest_quarter_share": round(sum(quarter) / total, 4) if total else 0.0,
            "densest": [{"x": x, "y": y, "nets": v}
                        for (x, y), v in sums.most_common(top) if v]}


def log_iterations(path: Path) -> list[dict]:
    """router2's ``iter=N wires=W overused=O overuse=U`` lines of a nextpnr log."""
    pat = re.compile(r"iter=(\d+) wires=(\d+) overused=(\d+) overuse=(\d+)")
    return [{"iter": int(a), "wires": int(b), "overused": int(c), "overuse": int(d)}
            for a, b, c, d in pat.findall(path.read_text(errors="replace"))]


def summarize(d: Path, prefix: str = "heat_", it: int | None = None, top: int = 20,
              block: int = 8, log: Path | None = None) -> dict:
    """The JSON summary (module docstring) of iteration ``it`` (default: the last one
    with a by-net CSV) of the heatmaps ``d/{prefix}_congestion_by_*_{it}.csv``; the
    wire type and tile parts only when their CSVs exist. Raises FileNotFoundError when
    no such heatmap exists, ValueError on a malformed CSV."""
    pat = re.compile(re.escape(prefix) + r"_congestion_by_net_(\d+)\.csv$")
    its = sorted(int(m.group(1)) for p in d.iterdir() if (m := pat.match(p.name)))
    if not its:
        raise FileNotFoundError(f"no {prefix}_congestion_by_net_<i>.csv in {d}")
    it = its[-1] if it is None else it
    if it not in its:
        raise FileNotFoundError(f"no iteration {it} in {d} (iterations: {its})")
    f = lambda kind: d / f"{prefix}_congestion_by_{kind}_{it}.csv"   # noqa: E731
    nets = read_by_net(f("net"))
    total = sum(c for _, c in nets)
    mods, fams, stages = Counter(), Counter(), Counter()
    for n, c in nets:
        mods[module_of(n)] += c
        fams[family_of(n)] += c
        stages[family_of(n, keep_first=True)] += c
    def ranked(counts: Counter, key: str, n: int | None) -> list[dict]:
        return [{key: k, "net_overuse": v, "share": round(v / total, 4) if total else 0.0}
                for k, v in counts.most_common(n)]

    out = {"iteration": it, "iterations_available": its,
           "nets_on_overused_wires": sum(1 for _, c in nets if c), "net_overuse": total,
           "by_module": ranked(mods, "module", None),
           "by_net_family": ranked(fams, "family", top),
           "by_net_stage": ranked(stages, "family", top)}
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
        text = json.dumps(res, indent=1) + "\n"
        if a.out is None:
            sys.stdout.write(text)
        else:
            a.out.write_text(text)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
