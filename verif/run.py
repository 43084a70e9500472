"""Run a cocotb testbench on a built configuration; rerun failing tests with FST tracing.

:func:`run` writes the :class:`verif.job.Job` as JSON into the run folder
build/sim/<config>/runs/<tag>/ (named to the simulator by ``KVTB_JOB``); the
testbench appends one record per phase to the job's results file. When a test
fails, :func:`run` rebuilds the configuration with FST tracing and reruns the
failing tests with the same job and seed: the waveform is kept under
build/waves/<config>/<tag>/<test>.fst and its path printed and returned.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

from rtl_gen.config import RTLConfig

from .build import BUILD, TESTBENCH, build, runner, tool_env
from .harness import HARNESS
from .job import JOB_ENV, Job


def _simulate(cfg: RTLConfig, bdir: Path, job: Job, tdir: Path, testcase,
              fst: Path | None = None) -> dict:
    from cocotb_tools.check_results import get_results

    if tdir.exists():
        shutil.rmtree(tdir)
    tdir.mkdir(parents=True)
    job = dataclasses.replace(job, results=str(tdir / "phases.json"),
                              coverage=str(tdir / "coverage.yml"))
    job_path = tdir / "job.json"
    job_path.write_text(job.to_json())
    seed = job.seed
    t0 = time.time()
    xml = tdir / "results.xml"
    try:
        runner().test(test_module=TESTBENCH[cfg.kind], hdl_toplevel=HARNESS,
                      hdl_toplevel_lang="verilog", build_dir=bdir, test_dir=tdir,
                      testcase=testcase, seed=seed, waves=fst is not None,
                      test_args=["--trace-file", str(fst)] if fst is not None else [],
                      plusargs=["+verilator+rand+reset+2", f"+verilator+seed+{seed % 2**31 + 1}"],
                      extra_env={JOB_ENV: str(job_path)}, results_xml=str(xml),
                      log_file=tdir / "sim.log", timescale=("1ns", "1ps"))
    except (RuntimeError, SystemExit) as err:
        # RuntimeError: the simulator exited non-zero; SystemExit: under pytest the
        # runner exits on failed cocotb tests. Either way: read the results below.
        if isinstance(err, RuntimeError):
            print(f"[{cfg.name}] simulator failed: {err} (log: {tdir / 'sim.log'})",
                  file=sys.stderr)
    wall = time.time() - t0
    try:
        ntests, nfail = get_results(xml)
    except (RuntimeError, SystemExit, FileNotFoundError) as err:  # crashed: no results
        ntests, nfail = 0, 1
        print(f"[{cfg.name}] no cocotb results: {err}", file=sys.stderr)
    phases = json.loads((tdir / "phases.json").read_text()) if (tdir / "phases.json").exists() else []
    cov = tdir / "coverage.yml"
    return {"phases": phases, "coverage": str(cov) if cov.exists() else None,
            "tests": {"passed": ntests - nfail, "failed": nfail},
            "failed_tests": _failed_tests(xml), "wall_s": wall, "log": str(tdir / "sim.log")}


def _failed_tests(xml: Path) -> list[str]:
    import xml.etree.ElementTree as ET
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return []
    return [tc.get("name") for tc in root.iter("testcase")
            if tc.find("failure") is not None or tc.find("error") is not None]


def waves_enabled() -> bool:
    """FST of failing runs on (default) unless ``KV_WAVES=0``."""
    return os.environ.get("KV_WAVES", "1") not in ("0", "", "no", "off")


def run(cfg: RTLConfig, files: list[Path], bdir: Path, manifest: dict, job: Job,
        tag: str = "run", testcase: str | list[str] | None = None, model: str = "golden",
        waves: bool | None = None, log=print) -> dict:
    """Run the cocotb testbench of ``cfg`` on a built harness.

    Args:
        files: the Verilog (for the FST rebuild on failure).
        job: testbench settings (:class:`verif.job.Job`); params, config, latency,
            harness layout and model are filled in here.
        tag: name of the results folder build/sim/<config>/runs/<tag>/.
        waves: keep an FST of failing tests (default :func:`waves_enabled`).

    Returns:
        {"phases": [...], "coverage": the coverage YAML (None: none written),
         "tests": {"passed", "failed"}, "failed_tests": [...],
         "wall_s", "log", "waves": [FST paths of the failing tests' reruns]}.
    """
    tool_env()
    job = dataclasses.replace(job, params=cfg.params, config=cfg.name, model=model,
                              latency=int(manifest["latency"]),
                              latency_dec=manifest.get("latency_dec"),
                              interval=round(1 / manifest.get("throughput_vectors_per_cycle", 1)),
                              harness=manifest["harness"])
    res = _simulate(cfg, bdir, job, bdir / "runs" / tag, testcase)
    res["waves"] = []
    if (waves if waves is not None else waves_enabled()) and res["tests"]["failed"]:
        failed = res["failed_tests"] or ([testcase] if isinstance(testcase, str) else testcase)
        try:
            fbdir, _ = build(cfg, files, log=log, waves=True)
            wdir = (BUILD / "waves" / cfg.name / tag).resolve()
            for t in failed or [None]:
                fst = wdir / f"{t or 'all'}.fst"
                fst.parent.mkdir(parents=True, exist_ok=True)
                if fst.exists():
                    fst.unlink()
                _simulate(cfg, fbdir, job, fbdir / "runs" / f"{tag}_{t or 'all'}", t, fst=fst)
                if fst.exists():
                    res["waves"].append(str(fst))
                    log(f"[{cfg.name}] waveform of failing {t or 'run'}: {fst}")
                else:
                    log(f"[{cfg.name}] rerun with tracing wrote no {fst}")
        except Exception as err:   # the failure itself is already reported
            log(f"[{cfg.name}] could not record a waveform: {type(err).__name__}: {err}")
    return res
