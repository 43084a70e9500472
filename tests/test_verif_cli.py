"""``python -m verif.sim`` refuses bad arguments before building anything: exit 2 and one line
naming the option or the format field (no traceback, no simulation)."""

from __future__ import annotations

import pytest

from verif.sim import main


@pytest.mark.parametrize("argv, word", [
    (["--configs", "enc_v2_n64_g64_b3_l2_rms", "--list"], "scale_rule"),
    (["--configs", "rt_v2_n64_g64_b3_l2_rms", "--list"], "scale_rule"),
    (["--configs", "nonexistent", "--list"], "nonexistent"),
    (["--gap-p", "2", "--list"], "--gap-p"),
    (["--stall-p", "1", "--list"], "--stall-p"),
    (["--burst-p", "-0.1", "--list"], "--burst-p"),
    (["--jobs", "0", "--list"], "--jobs"),
    (["--random", "-5", "--list"], "--random"),
    (["--random", "0", "--list"], "--random"),
    (["--configs", "enc_v2_n64_g64_b3_l2", "--summary", "/proc/nope/x.json"], "--summary"),
    (["--configs", "enc_v2_n64_g64_b3_l2", "--summary", "/"], "--summary"),
    (["--fixture", "/nonexistent.npz", "--list"], "--fixture"),
])
def test_bad_arguments_exit_2_naming_the_option(argv, word, capsys):
    try:
        rc = main(argv)
    except SystemExit as stop:  # argparse
        rc = stop.code
    assert rc == 2
    err = capsys.readouterr().err
    assert word in err and "Traceback" not in err


def test_default_and_quick_lists():
    assert main(["--list"]) == 0
    assert main(["--quick", "--list"]) == 0


def test_readme_names_every_config_of_the_default_and_quick_runs():
    """verif/README.md's table lists each config ``make sim`` and ``--quick`` run."""
    from pathlib import Path
    from verif.sim import config_names
    text = (Path(__file__).resolve().parent.parent / "verif" / "README.md").read_text()
    for quick in (False, True):
        missing = [n for n in config_names(None, quick) if f"`{n}`" not in text]
        assert not missing, (quick, missing)


def test_make_sim_runs_the_placed_and_routed_designs():
    """Every encoder whose Fmax docs/SYNTH.md quotes (rtl_gen.synth's fmax set) is simulated
    by make sim as synthesised, and every decoder through the round trip of the same
    parameters where one exists (a round trip's FWHT latency is at most log2 W; the N=64
    decoder's 9 registers are checked in tests/test_hw_decompressor.py test_timing_profile)."""
    from rtl_gen.config import RTLConfig
    from rtl_gen.synth import SETS
    from verif.sim import config_names
    runs = config_names(None, False)
    for name, _ in SETS["fmax"]:
        if name.startswith("enc_"):
            assert name in runs, name
            continue
        rt = "rt_" + name.removeprefix("dec_")
        try:
            RTLConfig.parse(rt)
        except ValueError as e:
            assert "latency" in str(e), (name, e)
            continue
        assert rt in runs, name
