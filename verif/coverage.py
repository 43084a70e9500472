"""Functional coverage with cocotb-coverage: sampling inside the simulator, report and floor.

The bins and their reachability are ``kvtest.coverage`` (golden model, no simulator).
Inside the simulator, :class:`Sampler` holds one cocotb-coverage ``CoverPoint`` per bin
group of the config (trie ``<config>.<group>``) and samples it after every phase, from
the vectorised hit matrices of the scored vectors and the stream events (runs of stalls
/ gaps / held-off input, resets): one sample per *distinct* hit set of a phase, so a
bin's count is the number of (phase, distinct hit set) samples that contain it, not of
vectors (sampling every vector would spend a large part of a run in cocotb-coverage's
bookkeeping). It exports the database with
``coverage_db.export_to_yaml`` to the job's ``coverage`` file after each phase.
``python -m verif.sim`` reads that file (:func:`read_hits`) and scores it
(``kvtest.coverage.evaluate``; table: :func:`table`).
"""

from __future__ import annotations

import time
from itertools import compress
from pathlib import Path

import numpy as np

from kvtest.coverage import Bin, bins


def kind_of(config: str) -> str:
    """``encoder`` or ``roundtrip`` from a config name (rtl_gen.config grammar)."""
    return "roundtrip" if config.startswith("rt_") else "encoder"


class Sampler:
    """cocotb-coverage cover points of one config (inside the simulator).

    Args:
        config: the config name (root of the coverage trie).
        model: its bins (``kvtest.coverage.bins``).
        path: YAML file the database is exported to (None: no export).
    """

    def __init__(self, config: str, model: list[Bin], path: str | None):
        from cocotb_coverage.coverage import CoverPoint

        self.config, self.path = config, path
        self.seconds = 0.0          # time spent in cocotb-coverage: sampling and exporting
        self.hit_seconds = 0.0      # time spent computing the hit matrices (golden model)
        self.samples = 0
        groups: dict[str, list[str]] = {}
        for b in model:
            groups.setdefault(b.group, []).append(b.name)
        self.groups = groups
        self._point = {}
        for g, names in groups.items():
            cp = CoverPoint(f"{config}.{g}", rel=lambda hit, name: name in hit, bins=names,
                            inj=False)
            self._point[g] = cp(lambda hit: None)

    def sample(self, hits_fn, *args) -> None:
        """Sample the hit matrix ``hits_fn(*args)`` -> (bin names, bool [V, B]) with
        :meth:`vectors`, timing its computation."""
        t0 = time.perf_counter()
        names, hits = hits_fn(*args)
        self.hit_seconds += time.perf_counter() - t0
        self.vectors(names, hits)

    def vectors(self, names: list[str], hits: np.ndarray) -> None:
        """Sample the rows of ``hits`` (bool [V, len(names)]: the bins each vector hits),
        one sample per distinct row in each group. A bin name outside the model raises
        ValueError."""
        unknown = set(names) - {n for ns in self.groups.values() for n in ns}
        if unknown:
            raise ValueError(f"coverage: hits name bins outside the model: {sorted(unknown)[:5]}")
        t0 = time.perf_counter()
        col = {n: i for i, n in enumerate(names)}
        for g, gnames in self.groups.items():
            gn = [n for n in gnames if n in col]
            if not gn or not hits.shape[0]:
                continue
            sub = hits[:, [col[n] for n in gn]]
            packed = np.ascontiguousarray(np.packbits(sub, axis=1))
            _, first = np.unique(packed.view(np.dtype((np.void, packed.shape[1]))).ravel(),
                                 return_index=True)
            f = self._point[g]
            for row in sub[np.sort(first)].tolist():
                f(frozenset(compress(gn, row)))
                self.samples += 1
        self.seconds += time.perf_counter() - t0

    def events(self, names: list[str]) -> None:
        """One sample per distinct event (a bin name, e.g. ``stream.stall=8-63``)."""
        t0 = time.perf_counter()
        for n in dict.fromkeys(names):
            self._point[n.split(".", 1)[0]](frozenset((n,)))
            self.samples += 1
        self.seconds += time.perf_counter() - t0

    def export(self) -> None:
        """Write the database (YAML, cocotb-coverage's format) to ``path``."""
        if not self.path:
            return
        from cocotb_coverage.coverage import coverage_db
        t0 = time.perf_counter()
        coverage_db.export_to_yaml(self.path)
        self.seconds += time.perf_counter() - t0


def read_hits(path: Path | str, config: str) -> dict[str, int]:
    """bin name -> hits of ``config`` from a cocotb-coverage YAML export."""
    import yaml
    with open(path) as f:
        db = yaml.safe_load(f) or {}
    hits: dict[str, int] = {}
    for node, rec in db.items():
        if node.startswith(config + ".") and "bins:_hits" in rec:
            for name, n in rec["bins:_hits"].items():
                hits[str(name)] = hits.get(str(name), 0) + int(n)
    return hits


def table(results: dict[str, dict]) -> str:
    """Per config and bin group: reachable bins hit / reachable, %, then the total and
    the floor; misses named below the table."""
    head = ("config", "group", "bins", "reachable", "hit", "coverage", "result")
    rows = [head]
    notes = []
    for cfg, r in results.items():
        if "error" in r:
            rows.append((cfg, "-", "-", "-", "-", "-", "ERROR"))
            notes.append(f"{cfg}: {r['error']}")
            continue
        for g, s in r["groups"].items():
            pct = f"{100.0 * s['hit'] / s['reachable']:.1f}%" if s["reachable"] else "-"
            rows.append((cfg, g, s["bins"], s["reachable"], s["hit"], pct, ""))
        rows.append((cfg, "all", sum(s["bins"] for s in r["groups"].values()), r["reachable"],
                     r["hit"], f"{r['percent']:.1f}%",
                     ("ok" if r["ok"] else "FAIL") + f" (floor {r['floor']:g}%)"))
        if r["missed"]:
            notes.append(f"{cfg}: missed {', '.join(r['missed'])}")
        if r["unreachable_hit"]:
            notes.append(f"{cfg}: bins declared unreachable were hit: {', '.join(r['unreachable_hit'])}")
        if r["unknown"]:
            notes.append(f"{cfg}: hits outside the model: {', '.join(r['unknown'])}")
        if r["not_exercised"]:
            notes.append(f"{cfg}: not counted (this run streams no bursts beyond 255 cycles): "
                         + ", ".join(r["not_exercised"]))
    w = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(c).rjust(w[i]) if 2 <= i <= 5 else str(c).ljust(w[i])  # noqa: E731
                              for i, c in enumerate(r)).rstrip()
    lines = [fmt(rows[0]), fmt(["-" * x for x in w])] + [fmt(r) for r in rows[1:]]
    return "\n".join(lines + notes)


def model_of(config: str, params) -> list[Bin]:
    """The bins of a config (``kvtest.coverage.bins``; the key front end's from the name)."""
    from rtl_gen.config import RTLConfig
    return bins(params, kind_of(config), RTLConfig.parse(config).key_slots)
