"""The commit message rule (.githooks/check_subject.py): the commit-msg hook and CI's check
of the history share it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHECKER = REPO / ".githooks" / "check_subject.py"


def _checker():
    spec = importlib.util.spec_from_file_location("check_subject", CHECKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


check = _checker()


@pytest.mark.parametrize("msg", [
    "hw: add the credit counter's near compare",
    "gpu_ref: split the cache module by role",
    "bench/gpu: run the paging benchmark from the entry point",
    "docs: describe make sim",
    "hw, rtl_gen: pass typed options to the encoder",
    "verif.formal: name the missing yosys extra",
    "build: install only the sim extra for make sim\n\nThe body explains why.\nMore lines.",
    "x" * 10 + ": " + "y" * 60,                               # 72 characters
    "verif: size the vector sets\n# Please enter the commit message\n# comment",
    "\n\nverif: leading blank lines are dropped by git",
    "verif: keep the part above the scissors\n"
    "# ------------------------ >8 ------------------------\nWIP.",
    "Merge branch 'sim-fast'",
])
def test_good_messages(msg):
    assert check.problems(msg) == []


@pytest.mark.parametrize("msg, word", [
    ("Add the credit counter", "area"),
    ("HW: add the credit counter", "area"),
    ("hw:add the credit counter", "area"),
    ("hw: ", "area"),
    (": add something", "area"),
    ("hw: add the credit counter.", "period"),
    ("hw: WIP credit counter", "WIP"),
    ("hw: credit counter (wip)", "WIP"),
    ("hw: " + "a" * 69, "73 characters"),
    ("hw: added the credit counter", "imperative"),
    ("hw: fixes the credit counter", "imperative"),
    ("hw: add the credit counter\nbody without a blank line", "second line"),
    ("", "empty"),
    ("# only a comment", "empty"),
    ("fixup! hw: add the credit counter", "area"),
])
def test_bad_messages(msg, word):
    errs = check.problems(msg)
    assert errs and any(word in e for e in errs), errs


def test_hook_runs_the_checker(tmp_path):
    hook = REPO / ".githooks" / "commit-msg"
    assert os.access(hook, os.X_OK) and os.access(CHECKER, os.X_OK)
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("verif: add the default set's feature test\n")
    bad.write_text("Added things.\n")
    assert subprocess.run([str(hook), str(good)], capture_output=True).returncode == 0
    r = subprocess.run([str(hook), str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and "area" in r.stderr and "period" in r.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_range_check(tmp_path):
    """--since REV checks the commits after REV (merges skipped) and fails on a REV the clone
    lacks."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null"}

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, check=True).stdout.strip()

    def run(*args):
        return subprocess.run([sys.executable, str(CHECKER), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True)

    git("init", "-q")
    git("commit", "-q", "--allow-empty", "-m", "An old subject of any form.")
    base = git("rev-parse", "HEAD")
    git("commit", "-q", "--allow-empty", "-m", "docs: describe the rule")
    r = run("--since", base)
    assert r.returncode == 0 and "1 commit(s)" in r.stdout, r.stdout + r.stderr
    git("commit", "-q", "--allow-empty", "-m", "WIP")
    r = run("--since", base)
    assert r.returncode == 1 and "WIP" in r.stdout and "1 breaking" in r.stdout
    r = run("--since", "0" * 40)
    assert r.returncode == 1 and "not in this clone" in r.stderr


def test_usage_errors():
    assert check.main([]) == 2
    assert check.main(["--since"]) == 2
