"""Generated documentation blocks match the results they are rendered from (python -m bench.docs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import docs

REPO = Path(__file__).resolve().parent.parent


def _skeleton(root: Path, names=None) -> None:
    """Each doc of :data:`docs.BLOCKS` under ``root`` with empty blocks between hand-written text."""
    names = list(docs.BLOCKS) if names is None else names
    for doc in dict.fromkeys(docs.BLOCKS[n] for n in names):
        path = root / doc
        path.parent.mkdir(parents=True, exist_ok=True)
        body = "".join(f"text before {n}\n\n{docs.begin(n)}\nold\n{docs.end(n)}\n\ntext after {n}\n"
                       for n in names if docs.BLOCKS[n] == doc)
        path.write_text(f"# {doc}\n\n{body}")


def test_every_block_renders_from_its_inputs_only(tmp_path):
    """Each block renders from a results folder holding only the files INPUTS names for it."""
    for name, files in docs.INPUTS.items():
        res = tmp_path / name
        for f in files:
            (res / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(docs.RESULTS / f, res / f)
        text = docs.render(name, res)
        assert "|---|" in text, name                       # at least one table
        for word in ("issue", "round ", "run 1", "run 2", "2026-"):
            assert word not in text, (name, word)


def test_render_into_markers_then_check_passes(tmp_path, capsys):
    _skeleton(tmp_path)
    assert docs.main(["--check", "--root", str(tmp_path)]) == 1      # every block stale
    assert "stale" in capsys.readouterr().err
    assert docs.main(["--root", str(tmp_path)]) == 0
    readme = (tmp_path / "README.md").read_text()
    assert "text before results" in readme and "text after results" in readme
    assert "\nold\n" not in readme and "[sim_summary.json](bench/results/sim_summary.json)" in readme
    assert "](../bench/results/gpu_bench.png)" in (tmp_path / "docs" / "GPU.md").read_text()
    assert docs.main(["--check", "--root", str(tmp_path)]) == 0
    before = {p: p.read_text() for p in tmp_path.rglob("*.md")}
    assert docs.main(["--root", str(tmp_path)]) == 0                 # idempotent
    assert {p: p.read_text() for p in tmp_path.rglob("*.md")} == before


def test_a_stale_block_fails_the_check(tmp_path, capsys):
    _skeleton(tmp_path)
    assert docs.main(["--root", str(tmp_path)]) == 0
    gpu = tmp_path / "docs" / "GPU.md"
    gpu.write_text(gpu.read_text().replace("| 1 | 4K |", "| 1 | 5K |", 1))
    assert docs.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "gpu" in err and "hf" not in err.split("stale generated blocks:")[1]
    assert docs.main(["--check", "--only", "hf,sim", "--root", str(tmp_path)]) == 0


def test_a_changed_result_makes_the_block_stale(tmp_path):
    _skeleton(tmp_path, ["sim"])
    res = tmp_path / "results"
    res.mkdir()
    d = json.loads((docs.RESULTS / "sim_summary.json").read_text())
    (res / "sim_summary.json").write_text(json.dumps(d))
    args = ["--only", "sim", "--root", str(tmp_path), "--results", str(res)]
    assert docs.main(args) == 0 and docs.main(["--check", *args]) == 0
    d["rows"][0]["mismatches"] += 1
    (res / "sim_summary.json").write_text(json.dumps(d))
    assert docs.main(["--check", *args]) == 1


def test_a_missing_marker_or_file_names_the_file_and_block(tmp_path, capsys):
    _skeleton(tmp_path)
    acc = tmp_path / "docs" / "ACCURACY.md"
    acc.write_text(acc.read_text().replace(docs.end("accuracy"), ""))
    assert docs.main(["--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "docs/ACCURACY.md" in err and "'accuracy'" in err and "Traceback" not in err
    (tmp_path / "docs" / "VERIFICATION.md").unlink()
    assert docs.main(["--check", "--only", "sim", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "docs/VERIFICATION.md" in err and "sim" in err


def test_a_missing_results_file_names_it_and_its_writer(tmp_path, capsys):
    _skeleton(tmp_path, ["hf"])
    res = tmp_path / "results"
    res.mkdir()
    shutil.copy(docs.RESULTS / "hf_bench.json", res / "hf_bench.json")
    assert docs.main(["--only", "hf", "--root", str(tmp_path), "--results", str(res)]) == 2
    err = capsys.readouterr().err
    assert "hf_floor_cpu.json" in err and "bench.gpu.hf floor" in err


@pytest.mark.parametrize("argv, word", [(["--only", "nope"], "--only"),
                                        (["--only", ","], "empty block name"),
                                        (["--results", "/nonexistent"], "--results"),
                                        (["--root", "/nonexistent"], "--root")])
def test_bad_options_name_the_option(argv, word, capsys):
    with pytest.raises(SystemExit) as e:
        docs.main(argv)
    assert e.value.code == 2 and word in capsys.readouterr().err


def test_the_repository_docs_are_current():
    """README.md and docs/ hold every generated block as python -m bench.docs renders it."""
    assert docs.main(["--check"]) == 0


def test_synth_report_bad_inputs_name_the_option(tmp_path, capsys):
    from bench.synth.report import main
    empty, noconf = tmp_path / "empty", tmp_path / "noconf"
    empty.mkdir()
    noconf.mkdir()
    (noconf / "synth.json").write_text('{"configs": []}')
    for folder, word in ((tmp_path / "nope", "--results"), (empty, "--results"), (noconf, "tools")):
        assert main(["--results", str(folder), "--no-doc"]) == 2, folder
        err = capsys.readouterr().err
        assert word in err and "Traceback" not in err, (folder, err)


def test_synth_cli_names_a_bad_command(capsys):
    from bench.synth.__main__ import main
    assert main(["nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_the_fmax_records_are_the_fmax_set():
    """Every design of make synth's fmax set has a placed-and-routed record at the 150 MHz
    target under the current harness (the Fmax numbers the docs quote)."""
    from rtl_gen.synth import HARNESS_VERSION, SETS, harness_version
    recs = {r["config"]: r for r in
            json.loads((REPO / "bench" / "results" / "synth.json").read_text())["configs"]}
    for name, pnr in SETS["fmax"]:
        r = recs[name]
        assert pnr and r["ok"] and r["nextpnr"]["target_mhz"] == 150, name
        assert harness_version(r) == HARNESS_VERSION, name


@pytest.mark.parametrize("argv, word", [(["--routine", "nope"], "--routine"),
                                        (["--routine", "hf"], "--data"),
                                        (["--routine", "hf", "--data", "/nonexistent"], "--data"),
                                        (["--routine", "policy", "--ncu"], "--ncu"),
                                        (["--routine", "all", "--quick"], "--routine all")])
def test_gpu_entry_point_names_a_bad_option(argv, word, capsys):
    """python -m bench.gpu refuses bad options before anything touches a GPU."""
    from bench.gpu.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and word in capsys.readouterr().err


def test_gpu_entry_point_help_lists_the_routine_options(tmp_path, capsys, monkeypatch):
    """--routine R --help lists the entry point's options and then R's own (serve: bench.gpu.serve_load's);
    a routine whose module does not load here says so; plain --help lists the entry point's alone. Nothing
    runs and nothing is written."""
    import sys
    from bench.gpu.__main__ import main
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    plain = capsys.readouterr().out
    assert e.value.code == 0 and "--ncu" in plain and "--clients" not in plain
    with pytest.raises(SystemExit) as e:
        main(["--routine", "serve", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--ncu" in out and "options of --routine serve" in out
    assert all(opt in out for opt in ("--clients", "--caches", "--pool-gib", "--context-max", "--cpu")), out
    monkeypatch.setitem(sys.modules, "bench.gpu.kernels", None)         # as without CuPy: no import
    with pytest.raises(SystemExit) as e:
        main(["--help", "--routine", "decode"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "options of --routine decode" in out and "not listed here" in out
    assert not list(tmp_path.iterdir())


def test_gpu_entry_point_without_a_gpu_exits_2_before_any_work(tmp_path, capsys, monkeypatch):
    """python -m bench.gpu and python -m bench.gpu.hf run say that CuPy / a CUDA GPU is needed
    and exit 2 before writing anything (here: a GPU made missing)."""
    import bench.gpu
    from bench.gpu import hf
    from bench.gpu.__main__ import main
    monkeypatch.setattr(bench.gpu, "gpu_missing", lambda: "CuPy is not installed: needs a CUDA GPU")
    out = tmp_path / "out"
    assert main(["--routine", "write", "--out", str(out)]) == 2
    assert "CuPy" in capsys.readouterr().err and not out.exists()
    assert hf.main(["run", "--data", str(tmp_path), "--out", str(out / "hf.json")]) == 2
    assert "CUDA GPU" in capsys.readouterr().err and not out.exists()


def test_gpu_missing_names_what_is_missing():
    from bench.gpu import gpu_missing
    missing = gpu_missing()
    try:
        import cupy  # noqa: F401
        import torch
        have = cupy.cuda.runtime.getDeviceCount() > 0 and torch.cuda.is_available()
    except Exception:
        have = False
    assert (missing is None) == have
    if missing is not None:
        assert "CuPy" in missing or "CUDA" in missing


def test_cited_decisions_exist():
    """Every title that code cites from docs/DECISIONS.md is a heading there."""
    import re
    import subprocess
    headings = set(re.findall(r"^#{2,4} (.+?)\s*$", (REPO / "docs" / "DECISIONS.md").read_text(), re.M))
    files = subprocess.run(["git", "ls-files", "*.py", "*.cuh", "*.cu", "Makefile"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    cited = {}
    for f in files:
        text = (REPO / f).read_text()
        for title in re.findall(r'DECISIONS\.md,\s*"([^"]+)"', text):
            # a title wrapped over comment lines: join the lines
            cited.setdefault(" ".join(re.sub(r"\n\s*(#:?|//)?\s*", " ", title).split()), f)
    assert cited, "no code cites docs/DECISIONS.md"
    missing = {t: f for t, f in cited.items() if t not in headings}
    assert not missing, f"cited titles with no heading in docs/DECISIONS.md: {missing}"
