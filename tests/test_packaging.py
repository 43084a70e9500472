"""A non-editable install carries every runtime file: the wheel built from pyproject.toml holds
each .py of the packages (every subpackage, verif.formal included) and the files the code
reads beside itself (the CUDA kernels, rtl_gen's Verilator waivers, verif's K/V capture)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("sim_models", "hw", "rtl_gen", "verif", "gpu_ref", "kvtest")
#: Runtime files that are not Python, by pattern under the repository root.
DATA = ("gpu_ref/**/*.cu", "gpu_ref/**/*.cuh", "rtl_gen/verilator_waivers.vlt", "verif/data/*.npz")


def _sources() -> set[str]:
    """Every .py of the packages and the runtime data files, as paths in a wheel."""
    out = {str(f.relative_to(REPO)) for p in PACKAGES for f in (REPO / p).rglob("*.py")
           if "__pycache__" not in f.parts}
    out |= {str(f.relative_to(REPO)) for pat in DATA for f in REPO.glob(pat)}
    return out


@pytest.fixture(scope="module")
def wheel_file(tmp_path_factory) -> Path:
    """The wheel of a copy of the tree (setuptools writes build/ and *.egg-info
    beside the sources: the copy keeps the checkout clean)."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.fail("building the wheel needs setuptools (pip install -e .[test])")
    src = tmp_path_factory.mktemp("src")
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / f, src / f)
    for p in PACKAGES:
        shutil.copytree(REPO / p, src / p, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(out), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("fwht_kv-*.whl")
    return whl


@pytest.fixture(scope="module")
def wheel(wheel_file) -> set[str]:
    """Names in the wheel."""
    with zipfile.ZipFile(wheel_file) as z:
        return set(z.namelist())


def test_wheel_carries_every_module_and_data_file(wheel):
    expected = _sources()
    assert {"verif/formal/prove.py", "rtl_gen/verilator_waivers.vlt",
            "verif/data/smollm2_kv.npz", "gpu_ref/kv_common.cuh"} <= expected
    missing = sorted(expected - wheel)
    assert not missing, missing


def test_wheel_holds_only_the_packages(wheel):
    """No tests, bench scripts or build output in the wheel: top-level entries are the
    packages and the metadata."""
    tops = {n.split("/", 1)[0] for n in wheel}
    extra = {t for t in tops if t not in PACKAGES and not t.endswith(".dist-info")}
    assert not extra, extra


def test_installed_outputs_follow_the_working_directory(wheel_file, tmp_path):
    """Installed (not editable), the default build tree of verif and rtl_gen.synth and the
    synthesis record are under the current working directory, never in site-packages."""
    site, cwd = tmp_path / "site", tmp_path / "work"
    cwd.mkdir()
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                        str(site), str(wheel_file)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    code = ("import verif.build as b, verif.sim, rtl_gen.synth as s\n"
            "assert b.__file__.startswith(%r), b.__file__\n"
            "print(b.BUILD.resolve()); print(s.BUILD.resolve()); print(s.DEFAULT_OUT.resolve())"
            % str(site))
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == [str(cwd / "build"), str(cwd / "build" / "synth"),
                                str(cwd / "bench" / "results" / "synth.json")]
