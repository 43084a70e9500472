"""Generated documentation matches the results it is generated from."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _report(name="measurements_report"):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_measurements_md_is_generated_from_the_results():
    """docs/MEASUREMENTS.md is what bench/measurements_report.py renders from bench/results/."""
    assert _report().main(["--check"]) == 0


def test_measurements_check_catches_a_stale_file(tmp_path, monkeypatch):
    mod = _report()
    stale = tmp_path / "MEASUREMENTS.md"
    stale.write_text(mod.render().replace("0 mismatches", "1 mismatches", 1))
    monkeypatch.setattr(mod, "DOC", stale)
    monkeypatch.setattr(mod, "REPO", tmp_path)
    assert mod.main(["--check"]) == 1


def test_synth_md_is_generated_from_the_results():
    """docs/SYNTH.md's generated part is what bench/synth_report.py renders from synth.json."""
    assert _report("synth_report").main(["--check"]) == 0


def test_synth_check_catches_a_stale_file(tmp_path, capsys):
    mod = _report("synth_report")
    stale = tmp_path / "SYNTH.md"
    stale.write_text((REPO / "docs" / "SYNTH.md").read_text().replace("| 141.8 |", "| 151.8 |", 1))
    assert stale.read_text() != (REPO / "docs" / "SYNTH.md").read_text()
    assert mod.main(["--check", "--doc", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err
    stale.write_text("no generated part\n")
    assert mod.main(["--check", "--doc", str(stale)]) == 2
    assert "--doc" in capsys.readouterr().err


def test_synth_report_bad_inputs_name_the_option(tmp_path, capsys):
    mod = _report("synth_report")
    empty, zero, noconf = tmp_path / "empty.json", tmp_path / "zero.json", tmp_path / "c.json"
    empty.write_text("{}")
    zero.write_text("")
    noconf.write_text('{"configs": []}')
    for argv, word in ((["--results", str(tmp_path / "nope.json")], "--results"),
                       (["--results", str(empty)], "--results"),
                       (["--results", str(noconf)], "tools"),
                       (["--mantissa", str(tmp_path / "nope.json")], "--mantissa"),
                       (["--mantissa", str(zero)], "--mantissa"),
                       (["--mantissa", str(empty)], "--mantissa"),
                       (["--doc", str(tmp_path / "nope.md")], "--doc"),
                       (["--doc", str(tmp_path)], "--doc")):
        assert mod.main(["--check", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert word in err and "Traceback" not in err, (argv, err)


def test_the_fmax_records_are_the_fmax_set():
    """Every design of make synth's fmax set has a placed-and-routed record at the 150 MHz
    target under the current harness (the Fmax numbers the docs quote)."""
    import json
    from rtl_gen.synth import HARNESS_VERSION, SETS, harness_version
    recs = {r["config"]: r for r in
            json.loads((REPO / "bench" / "results" / "synth.json").read_text())["configs"]}
    for name, pnr in SETS["fmax"]:
        r = recs[name]
        assert pnr and r["ok"] and r["nextpnr"]["target_mhz"] == 150, name
        assert harness_version(r) == HARNESS_VERSION, name
