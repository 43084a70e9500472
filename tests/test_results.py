"""Every committed file under bench/results is read by python -m bench.docs, named by path in the
docs (README.md, docs/*.md) or read by a test (tests/*.py); raw logs and profiler output stay out
of git."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from bench import docs

REPO = Path(__file__).resolve().parent.parent
PREFIX = "bench/results/"


def committed() -> list[str]:
    """Files under bench/results that git tracks (relative to bench/results)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", PREFIX], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"no git checkout: {err}")
    return [p[len(PREFIX):] for p in out.split("\0") if p]


def named_in_docs(root: Path = REPO) -> set[str]:
    """Files under bench/results that README.md or a docs/*.md names by path (links included)."""
    names = set()
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        if doc.is_file():
            names |= set(re.findall(r"bench/results/([\w./-]*\w)", doc.read_text()))
    return names


def read_by_tests(root: Path = REPO) -> set[str]:
    """Files under bench/results that a test names: the path, or its parts joined by os.path.join
    (``"bench", "results", "x.json"``)."""
    names = set()
    for t in sorted((root / "tests").glob("*.py")):
        text = t.read_text()
        names |= set(re.findall(r"bench/results/([\w./-]*\w)", text))
        names |= set(re.findall(r'"bench",\s*"results",\s*"([\w.-]+)"', text))
    return names


def unread(files, names) -> list[str]:
    return sorted(f for f in files if f not in docs.inputs() and f not in names)


def test_every_committed_result_is_read_or_named():
    stray = unread(committed(), named_in_docs() | read_by_tests())
    assert not stray, ("committed under bench/results, read by no generator (bench.docs.INPUTS) "
                       f"or test and named by no doc: {stray}")


def test_every_input_of_the_docs_is_committed():
    files = set(committed())
    assert docs.inputs() <= files, sorted(docs.inputs() - files)


def test_no_logs_or_profiler_dumps_are_committed():
    bad = [f for f in committed() if f.startswith("raw/") or f.endswith((".log", ".txt"))]
    assert not bad, bad


def test_the_raw_folder_is_ignored():
    out = subprocess.run(["git", "check-ignore", "-q", PREFIX + "raw/x.log"], cwd=REPO)
    assert out.returncode == 0


def test_the_check_flags_an_unnamed_file(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "DECISIONS.md").write_text(
        "Record: [formal](../bench/results/formal.json), `bench/results/gpu_bench_v2.json`.\n")
    names = named_in_docs(tmp_path)
    assert names == {"formal.json", "gpu_bench_v2.json"}
    files = ["formal.json", "gpu_bench_v2.json", "synth.json", "old_run.log", "accuracy/x.json"]
    assert unread(files, names) == ["accuracy/x.json", "old_run.log"]
    assert "gpu_bench_waves.json" in read_by_tests()          # tests/test_gpu_api.py reads it
