"""GPU benchmarks of the gpu_ref kernels: one entry point, one routine per benchmark.

    python -m bench.gpu --routine ROUTINE [--out DIR] [--quick] [--ncu] [routine options]

Routines (results file under --out, a plot beside it; the log of the run and profiler output go to
DIR/raw/, which git ignores):

  decode    copy ceilings, bit-exactness checks, write kernel, decode attention N=128, batch 1/8/32,
            context 4K..128K, GQA 64/8 and 32/8, against torch SDPA bf16 (gpu_bench.json)
  write     the write kernel alone: quantizer versions, fp16/bf16, b = 3/4, the key front end folded
            in; ``--baseline DIR`` times a previous kv_encode.cu beside it (gpu_bench_write.json)
  policy    cache policies: K3/V3, K4/V3, K4/V4, sinks, paged pools (gpu_bench_policy.json)
  paging    paged pools (16- and 64-token pages) against the contiguous layout (gpu_bench_paging.json)
  hf        a transformers model decoding from the packed cache: perplexity through the kernels,
            generation, whole-model decode step and concurrency; needs ``--data DIR`` from
            ``python -m bench.gpu.hf prep`` (hf_bench.json)
  waves     decode at batches around the GPU's CTA slots, planner split count against fixed ones
            (gpu_bench_waves.json)
  versions  the version-1 and version-2 quantizers side by side (gpu_bench_v2.json)
  kernel    the decode kernel against previous sources (``--baseline NAME=DIR``) and tunes
            (``--tunes``) in one run (gpu_bench_kernel.json)
  layout    the write kernel's value orders (golden, vpair) and row mappings, each against the copy
            kernel over the same bytes; ``--source NAME=DIR`` adds another kernel source
            (gpu_bench_layout.json)
  peers     decode against FlashInfer's paged decode (bf16, fp8 e4m3), SDPA bf16 and the read limit
            of the same bytes, K3V3 and v3, one entry per card (gpu_bench_peers.json); FlashInfer is
            imported from the Python path
  serve     serving under load: the OpenAI server in-process, concurrent streaming clients, a packed
            cache against the 16-bit cache in the same pool bytes (random Llama-3-8B shape, 32K-128K
            tokens); ``--cpu`` runs the smoke on the CPU, golden backend (gpu_serve_load.json;
            bench/gpu/serve_load.py)
  all       decode, write, policy, paging, and hf where ``--data`` is given: every GPU result the
            generated docs read (``python -m bench.docs``)

``--ncu`` runs the routine's profiling driver under Nsight Compute instead (decode: the headline decode
launch, with the tunes of $NCU_TUNES; layout: one write launch per source, dtype and order) into
DIR/raw/ncu_ROUTINE.txt. Options this entry point does not know are passed to the routine;
``--routine ROUTINE --help`` lists them after the entry point's own.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"

#: routine -> (the kernels.py mode or None, results file name)
ROUTINES = {
    "decode": ("decode", "gpu_bench.json"),
    "write": ("write", "gpu_bench_write.json"),
    "policy": ("policy", "gpu_bench_policy.json"),
    "paging": ("paging", "gpu_bench_paging.json"),
    "hf": (None, "hf_bench.json"),
    "waves": ("waves", "gpu_bench_waves.json"),
    "versions": ("versions", "gpu_bench_v2.json"),
    "kernel": ("kernel", "gpu_bench_kernel.json"),
    "layout": (None, "gpu_bench_layout.json"),
    "peers": (None, "gpu_bench_peers.json"),
    "serve": (None, "gpu_serve_load.json"),
}
ALL = ("decode", "write", "policy", "paging", "hf")
#: routines with a profiling driver: the module and its argument
NCU_DRIVERS = {"decode": ("bench.gpu.kernels", "--ncu-decode"),
               "layout": ("bench.gpu.write_layout", "--ncu")}
NCU_SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats", "SchedulerStats")
NCU_METRICS = ("smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,"
               r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")


class _Tee:
    """Writes to a stream and a log file."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, s):
        self.stream.write(s)
        self.log.write(s)
        return len(s)

    def flush(self):
        self.stream.flush()
        self.log.flush()


@contextlib.contextmanager
def tee(path: Path):
    """stdout also into ``path`` while the block runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as log:
        old, sys.stdout = sys.stdout, _Tee(sys.stdout, log)
        try:
            yield
        finally:
            sys.stdout = old


def call_routine(name: str, out: Path, extra: list[str], data: Path | None) -> bool:
    """Call the routine's module with its arguments; whether its own checks passed."""
    mode, fname = ROUTINES[name]
    if mode is not None:
        from bench.gpu import kernels
        kernels.main(["--only", mode, "--out", str(out), *extra])
    elif name == "layout":
        from bench.gpu import write_layout
        write_layout.main(["--out", str(out), *extra])
    elif name == "peers":
        from bench.gpu import peers
        peers.main(["--out", str(out), *extra])
    elif name == "serve":
        from bench.gpu import serve_load
        if serve_load.main(["--out", str(out), "--no-plot", *extra]):
            print(f"serve: failed or invariants violated (listed in {out / fname}, invariants_violated)")
            return False
    else:
        from bench.gpu import hf
        hf.main(["run", "--data", str(data), "--out", str(out / fname), *extra])
    return True


def run_routine(name: str, out: Path, extra: list[str], data: Path | None) -> tuple[Path, bool]:
    """Run one routine; returns its results file and whether its own checks passed."""
    with tee(out / "raw" / f"{name}.log"):
        ok = call_routine(name, out, extra, data)
    return out / ROUTINES[name][1], ok


def routine_help(name: str) -> str:
    """The help of the routine's own options (its module's parser, given ``--help``), or where to find it
    when the module cannot be imported here (the GPU routines import CuPy)."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            call_routine(name, RESULTS, ["--help"], None)
    except SystemExit:
        pass
    except ImportError as err:
        return (f"(not listed here: its module needs {err.name or 'a missing module'} to load ({err}); "
                f"where it loads, this lists them)\n")
    return buf.getvalue()


def profile(name: str, out: Path, extra: list[str]) -> int:
    """The routine's profiling driver under Nsight Compute, the report into out/raw/ncu_NAME.txt."""
    module, flag = NCU_DRIVERS[name]
    dst = out / "raw" / f"ncu_{name}.txt"
    dst.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["ncu", "--clock-control", "none"]
    cmd += [x for s in NCU_SECTIONS for x in ("--section", s)] + ["--metrics", NCU_METRICS]
    if name == "decode":
        cmd += ["-k", "regex:kv_decode_attn"]
    cmd += [sys.executable, "-m", module, flag, *extra]
    with open(dst, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
    print(f"ncu exit {rc}: {dst}")
    return rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0],
                                 allow_abbrev=False, epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routine", required=True, choices=(*ROUTINES, "all"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or RESULTS),
                    help="folder of the results files (default $OUT, else bench/results)")
    ap.add_argument("--data", type=Path, help="hf: the folder python -m bench.gpu.hf prep wrote")
    ap.add_argument("--ncu", action="store_true", help="profile the routine under Nsight Compute "
                    f"({', '.join(NCU_DRIVERS)})")
    ap.add_argument("--no-plot", action="store_true", help="write no plots")
    argv = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(argv):                     # with --routine: the routine's options too
        pre = argparse.ArgumentParser(prog=ap.prog, add_help=False, allow_abbrev=False)
        pre.add_argument("--routine", choices=(*ROUTINES, "all"))
        name = pre.parse_known_args(argv)[0].routine
        if name in ROUTINES:
            print(ap.format_help())
            print(f"options of --routine {name} (its module's parser; given after the entry point's own):\n")
            print(routine_help(name), end="")
            ap.exit()
    a, extra = ap.parse_known_args(argv)
    if a.out.exists() and not a.out.is_dir():
        ap.error(f"--out {a.out}: not a folder")
    if a.routine == "hf" and a.data is None:
        ap.error("--routine hf needs --data (the folder python -m bench.gpu.hf prep writes)")
    if a.data is not None and not a.data.is_dir():
        ap.error(f"--data {a.data}: no such folder")
    if a.ncu and a.routine not in NCU_DRIVERS:
        ap.error(f"--ncu: no profiling driver for --routine {a.routine} (one of {', '.join(NCU_DRIVERS)})")
    if a.routine == "all" and extra:
        ap.error(f"--routine all takes no routine options: {' '.join(extra)}")
    from bench.gpu import gpu_missing
    missing = None if a.routine == "serve" and "--cpu" in extra else gpu_missing()
    if missing:
        print(f"{ap.prog}: error: {missing}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    if a.ncu:
        return profile(a.routine, a.out, extra)
    names = [r for r in ALL if r != "hf" or a.data is not None] if a.routine == "all" else [a.routine]
    failed = []
    for name in names:
        path, ok = run_routine(name, a.out, extra, a.data)
        if not ok:
            failed.append(name)
        if not a.no_plot and path.exists():
            if name == "hf":
                from bench.gpu import hf
                r = json.loads(path.read_text())
                if "speed" in r:
                    hf._plot(r, path.with_suffix(".png"))
            else:
                from bench.gpu import plots
                plots.plot(str(path))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
