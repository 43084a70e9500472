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
