"""``python -m verif.sim``: bad arguments are refused before building anything (exit 2 and one
line naming the option or the format field, no traceback, no simulation); the sets and what
the default set (``make sim``) covers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verif.build import sim_config
from verif.sim import (DEFAULT_CONFIGS, SETS, SIZES, config_names, features, main, mode_values,
                       required_features)


@pytest.mark.parametrize("argv, word", [
    (["--configs", "enc_v2_n64_g64_b3_l2_rms", "--list"], "scale_rule"),
    (["--configs", "rt_v2_n64_g64_b3_l2_rms", "--list"], "scale_rule"),
    (["--configs", "nonexistent", "--list"], "nonexistent"),
    (["--set", "huge", "--list"], "--set"),
    (["--configs", "all", "--list"], "--set all"),
    (["--configs", ",", "--list"], "--configs"),
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


@pytest.mark.parametrize("set_name", SETS)
def test_list_prints_each_set(set_name, capsys):
    assert main(["--set", set_name, "--list"]) == 0
    assert capsys.readouterr().out.split() == config_names(None, set_name)


def test_list_of_explicit_configs(capsys):
    assert main(["--configs", "enc_v2_n64_g64_b3_l2, rt_v2_n64_g32_b3_l2", "--list"]) == 0
    assert capsys.readouterr().out.split() == ["enc_v2_n64_g64_b3_l2", "rt_v2_n64_g32_b3_l2"]



def test_bad_config_name_points_at_list(capsys):
    assert main(["--configs", "enc_v2_n64", "--list"]) == 2
    err = capsys.readouterr().err
    assert "--configs" in err and "--list" in err and "Traceback" not in err


def test_list_into_a_closed_pipe():
    """``python -m verif.sim --list | head``: a reader that goes away gives no
    BrokenPipeError traceback, exit 0."""
    repo = Path(__file__).resolve().parent.parent
    r, w = os.pipe()
    os.close(r)                            # the reader is gone before the first line
    try:
        p = subprocess.run([sys.executable, "-m", "verif.sim", "--set", "all", "--list"], cwd=repo,
                           stdout=w, stderr=subprocess.PIPE, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(repo)})
    finally:
        os.close(w)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr


def test_default_build_tree_is_the_working_directory():
    """build/ under the current directory (the Makefile runs from the repository root), not
    beside the installed package (tests/test_packaging.py checks an installed wheel)."""
    from verif.build import BUILD
    assert BUILD == Path("build")


def test_sets_nest():
    """quick and default are small; full runs every default config; all every full one; each
    name is a valid config of a simulated kind."""
    sets = {s: config_names(None, s) for s in SETS}
    for names in sets.values():
        assert len(names) == len(set(names))
        for n in names:
            assert sim_config(n).name == n
    assert len(sets["quick"]) <= 6 and len(sets["default"]) <= 7
    assert set(sets["default"]) <= set(sets["full"]) <= set(sets["all"])
    assert set(sets["quick"]) <= set(sets["all"])
    assert SIZES["default"].floor == SIZES["full"].floor == "full"
    assert SIZES["default"].long_stalls
    with pytest.raises(ValueError, match="set"):
        config_names(None, "huge")


def test_default_set_covers_every_feature():
    """make sim exercises each RTL module, flow and feature at least once: the union of the
    features of its parsed configs holds FEATURES and every quantizer value both paths
    implement."""
    union = set()
    for n in config_names(None, "default"):
        union |= features(sim_config(n))
    missing = sorted(required_features() - union)
    assert not missing, missing
    epi, dec = mode_values()
    assert all(f"read.{f}={v}" in union for f, vs in dec.items() for v in vs)
    assert {"kind=encoder", "kind=roundtrip", "key_slots", "fold_align"} <= union


def test_features_of_a_config():
    f = features(sim_config("rt_v2_n128_g64_b3_l6_p0_c0_w64_fa_rc"))
    assert {"kind=roundtrip", "n=128", "g<n", "bits=3", "pipe=0", "credit", "lanes",
            "credit+lanes", "fold_align", "reset_copies", "read.mode=midrise"} <= f
    assert "key_slots" not in f and "lane_ram" not in f
    f = features(sim_config("enc_v2_n64_g64_b4_l1_bf16"))
    assert {"kind=encoder", "g=n", "bits=4", "dtype=bf16"} <= f
    assert not any(x.startswith("read.") for x in f)


def test_make_sim_runs_the_placed_and_routed_designs():
    """Every encoder whose Fmax the synthesis records quote (rtl_gen.synth's fmax set) is
    simulated by make sim-full as synthesised, and every decoder through the round trip of
    the same parameters where one exists (a round trip's FWHT latency is at most log2 W; the
    N=64 decoder's 9 registers are checked in tests/test_hw_decoder.py
    test_timing_profile); make sim runs the N=128 encoder and decoder pair."""
    from rtl_gen.config import RTLConfig
    from rtl_gen.synth import SETS as SYNTH_SETS
    runs = config_names(None, "full")
    for name, _ in SYNTH_SETS["fmax"]:
        if name.startswith("enc_"):
            assert name in runs, name
            continue
        rt = "rt_" + name.removeprefix("dec_")
        try:
            RTLConfig.parse(rt)
        except ValueError as e:
            assert "fwht_regs" in str(e), (name, e)
            continue
        assert rt in runs, name
    default = config_names(None, "default")
    assert "enc_v2_n128_g64_b3_l6_p1_k8_c0_w64" in default     # with the key front end
    assert "rt_v2_n128_g64_b3_l6_p0_c0_w64_fa_rc" in default
    assert set(DEFAULT_CONFIGS) <= set(default)
