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
    "hw: fix wip-state handling",                           # WIP only as a word of its own
    "verif: drop the wiped buffers",
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
    ("WIP: hw: add the credit counter", "WIP"),
    ("hw: add the credit counter, wip", "WIP"),
    ("fixup! hw: add the credit counter", "squash it"),
    ("squash! hw: add the credit counter", "squash it"),
])
def test_bad_messages(msg, word):
    errs = check.problems(msg)
    assert errs and any(word in e for e in errs), errs


@pytest.mark.parametrize("msg", ["fixup! hw: add the credit counter",
                                 "squash! hw: add the credit counter\n\nfold in the compare",
                                 "amend! hw: add the credit counter\n\nhw: add the counter"])
def test_hook_accepts_autosquash_commits(msg, tmp_path):
    """The commit-msg hook lets a branch collect fixup! / squash! commits (the range check
    rejects them: test_bad_messages, test_range_check)."""
    assert check.problems(msg, autosquash=True) == []
    f = tmp_path / "COMMIT_EDITMSG"
    f.write_text(msg + "\n")
    r = subprocess.run([str(REPO / ".githooks" / "commit-msg"), str(f)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


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
    git("commit", "-q", "--allow-empty", "-m", "fixup! docs: describe the rule")
    r = run("--since", "HEAD~1")
    assert r.returncode == 1 and "squash it" in r.stdout, r.stdout + r.stderr
    for rev in ("0" * 40, "typo"):
        r = run("--since", rev)
        assert r.returncode == 2 and f"--since {rev}: unknown revision" in r.stderr, r.stderr
        assert "shallow" not in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_range_check_names_a_shallow_clone(tmp_path):
    """An unknown --since revision in a shallow clone: the message says to fetch the history."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null"}
    full, shallow = tmp_path / "full", tmp_path / "shallow"
    full.mkdir()
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "docs: one"],
                 ["commit", "-q", "--allow-empty", "-m", "docs: two"]):
        subprocess.run(["git", *args], cwd=full, env=env, check=True, capture_output=True)
    first = subprocess.run(["git", "rev-parse", "HEAD~1"], cwd=full, env=env, check=True,
                           capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{full}", str(shallow)],
                   env=env, check=True, capture_output=True)
    r = subprocess.run([sys.executable, str(CHECKER), "--since", first], cwd=shallow, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown revision" in r.stderr
    assert "shallow" in r.stderr and "git fetch --unshallow" in r.stderr


def test_usage_errors(tmp_path, capsys):
    assert check.main([]) == 2
    assert check.main(["--since"]) == 2
    capsys.readouterr()
    assert check.main([str(tmp_path / "nonexistent")]) == 2
    err = capsys.readouterr().err
    assert "cannot read the message file" in err and "nonexistent" in err


def test_help_lists_the_common_areas():
    r = subprocess.run([sys.executable, str(CHECKER), "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for area in ("hw", "rtl_gen", "verif", "gpu_ref", "bench", "docs", "build"):
        assert f" {area}," in r.stdout or f" {area} (" in r.stdout, area
    assert "any lower-case word" in r.stdout


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("make") is None,
                    reason="needs git and make")
def test_make_installs_the_hook(tmp_path):
    """make setup / sim / sim-full / test point git at .githooks every time (not only when
    .venv is created); make hooks sets core.hooksPath in a checkout without it."""
    rules = {}
    for line in (REPO / "Makefile").read_text().splitlines():
        if line and not line[0].isspace() and ":" in line and "=" not in line.split(":")[0]:
            target, deps = line.split(":", 1)
            rules[target.strip()] = deps.split()
    for target in ("setup", "sim", "sim-full", "test"):
        assert "hooks" in rules[target], (target, rules[target])
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null"}
    shutil.copy2(REPO / "Makefile", tmp_path / "Makefile")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, env=env, check=True)

    def hooks_path():
        return subprocess.run(["git", "config", "core.hooksPath"], cwd=tmp_path, env=env,
                              capture_output=True, text=True).stdout.strip()

    assert hooks_path() == ""
    r = subprocess.run(["make", "-s", "hooks"], cwd=tmp_path, env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0 and hooks_path() == ".githooks", r.stdout + r.stderr
    r = subprocess.run(["make", "-s", "hooks"], cwd=tmp_path, env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout == ""                  # already set: nothing to do
