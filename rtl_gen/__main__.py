"""Command line: ``python -m rtl_gen --config NAME --out DIR`` or
``python -m rtl_gen --n 128 --block 64 --bits 3 --fwht-regs 2 --out DIR``.

``--config`` emits a named configuration (``rtl_gen.config`` grammar, e.g.
``enc_v2_n128_g64_b3_l2``, ``dec_v2_n128_g64_b3_l6_p0_c0_w64_fa_rc``); the option flags
then override its options. Without it, the format flags and ``--module`` state the
configuration. Writes DIR/<top>.v and DIR/manifest.json (``--module encoder``, the
default: DIR/kv_encoder.v; ``decoder``: DIR/kv_decoder.v; ``roundtrip``:
DIR/kv_roundtrip.v); ``--module both`` writes encoder and decoder, a manifest per module
(DIR/<name>.manifest.json) and DIR/manifest.json (the encoder's manifest plus
``modules``: both manifests). Every option flag builds the same ``hw.options`` object
that names do. Bad arguments exit with status 2 and a message naming the parameter.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from hw.decoder import DQ_CUTS, FLOAT_CUTS
from hw.frontend import FE_CUTS
from hw.keyfold import FOLD_CUTS
from hw.options import DecoderOptions, EncoderOptions, RoundTripOptions
from hw.pipeline import FLOWS
from hw.quantizer import QUANT_CUTS
from sim_models.params import (INPUT_DTYPES, QUANT_MODES, SCALE_ENCODINGS, SCALE_ROUNDING,
                               SCALE_RULES, FormatParams)

from . import KINDS, generate, generate_both, lint
from .config import RTLConfig

#: --module choices (the rtl_gen kinds, and both modules).
MODULES = (*KINDS, "both")

#: Largest N the command line generates (verified in make sim: N = 64, 128, 256; above
#: 512 elaboration takes minutes and nothing is verified).
RTL_N_MAX = 512

#: Option flags: dest -> (the options' field, which modules' options have it).
ENC_FLAGS = {"quant_regs": "quant_regs", "fe_regs": "fe_regs", "tree_every": "tree_every",
             "key_slots": "key_slots", "lane_ram": "lane_ram"}
DEC_FLAGS = {"float_regs": "float_regs", "dq_regs": "dq_regs", "split_align": "split_align",
             "reset_copies": "reset_copies"}
BOTH_FLAGS = {"fwht_regs": "fwht_regs", "flow": "flow", "credit_extra": "credit_extra",
              "lanes": "lanes"}
#: Format flags that set a FormatParams field of the same name (and --seed /
#: --no-sign-flip: sign_seed); refused with --config, whose name states the format.
FORMAT_FIELDS = ("n", "block", "bits", "mant_bits", "dtype", "mode", "scale", "scale_rule",
                 "scale_round", "scale_mult")
FORMAT_FLAGS = (*FORMAT_FIELDS, "seed", "no_sign_flip")


def _cuts(text: str) -> tuple[str, ...]:
    """A cut list flag: comma-separated cut names, or "none" (an empty list is refused:
    "none" says it)."""
    if text.strip() == "none":
        return ()
    cuts = tuple(c.strip() for c in text.split(",") if c.strip())
    if not cuts:
        raise argparse.ArgumentTypeError(f"empty cut list {text!r}: name cuts or write 'none'")
    return cuts


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m rtl_gen",
                                 description="Generate the Verilog of the fwht-kv write path "
                                             "(KVEncoder) and/or read path (KVDecoder) "
                                             "and the manifest.json.")
    ap.add_argument("--config", default=None,
                    help="a configuration name (e.g. enc_v2_n128_g64_b3_l2; rtl_gen/config.py): "
                         "its kind, format and options; option flags override its options")
    ap.add_argument("--module", choices=MODULES, default=None,
                    help="which top level(s) to emit without --config (default encoder; "
                         "roundtrip: encoder -> decoder with a direct decoder input)")
    d = FormatParams()     # every format default comes from sim_models.params
    S = argparse.SUPPRESS  # a flag not given is absent: the options' default applies
    ap.add_argument("--n", type=int, default=S, help=f"lanes N, power of two (default {d.n})")
    ap.add_argument("--block", type=int, default=S, help=f"block size G (default {d.block})")
    ap.add_argument("--bits", type=int, default=S, help=f"code bits b in {{2,3,4}} (default {d.bits})")
    ap.add_argument("--mant-bits", type=int, default=S,
                    help=f"BFP mantissa width M (default {d.mant_bits})")
    ap.add_argument("--seed", type=int, default=S, help=f"sign-flip seed (default {d.sign_seed})")
    ap.add_argument("--no-sign-flip", action="store_true", default=S, help="disable the sign flip D")
    ap.add_argument("--dtype", choices=tuple(INPUT_DTYPES), default=S)
    ap.add_argument("--mode", choices=QUANT_MODES, default=S, help=f"quantizer mode (default {d.mode})")
    ap.add_argument("--scale", choices=SCALE_ENCODINGS, default=S,
                    help=f"scale-byte encoding (default {d.scale})")
    ap.add_argument("--scale-rule", choices=SCALE_RULES, default=S,
                    help=f"block statistic of the scale (default {d.scale_rule})")
    ap.add_argument("--scale-round", choices=SCALE_ROUNDING, default=S,
                    help=f"rounding of the scale to a byte (default {d.scale_round})")
    ap.add_argument("--scale-mult", type=int, default=S,
                    help="scale multiplier in units of 1/256 (default: the rule's default)")
    e, o = EncoderOptions(), DecoderOptions()
    ap.add_argument("--fwht-regs", type=int, default=S,
                    help=f"FWHT pipeline registers, 0..log2(N) (a decoder: 0..its FWHT's steps; "
                         f"default {e.fwht_regs})")
    ap.add_argument("--quant-regs", type=_cuts, default=S,
                    help=f"encoder: quantizer register cuts, comma-separated from "
                         f"{','.join(QUANT_CUTS.names)} or 'none' (default {','.join(e.quant_regs)})")
    ap.add_argument("--fe-regs", type=_cuts, default=S,
                    help=f"encoder: front-end register cuts from {','.join(FE_CUTS.names)} "
                         f"(with --key-slots: {','.join(FOLD_CUTS.names)}) or 'none' (default "
                         f"{','.join(e.fe_regs) or 'none'}; with --key-slots "
                         f"{','.join(FOLD_CUTS.default)})")
    ap.add_argument("--tree-every", type=int, default=S,
                    help="encoder: a register after every K levels of the reduction trees "
                         "(default 0: none)")
    ap.add_argument("--key-slots", type=int, default=S,
                    help="encoder: key front end table slots T, the front end folding the key "
                         "scale and centering in (fp16 only; default 0: none)")
    ap.add_argument("--lane-ram", type=int, default=S,
                    help="encoder: lane delay lines of at least D register stages (D >= 3) in "
                         "block RAM (default 0: none)")
    ap.add_argument("--float-regs", type=_cuts, default=S,
                    help=f"decoder: float conversion register cuts from {','.join(FLOAT_CUTS.names)} "
                         f"or 'none' (default {','.join(o.float_regs)})")
    ap.add_argument("--dq-regs", type=_cuts, default=S,
                    help=f"decoder: dequant register cuts from {','.join(DQ_CUTS.names)} or "
                         f"'none' (default none)")
    ap.add_argument("--split-align", action="store_true", default=S,
                    help="decoder: the FWHT's block alignment as its parts, one step each")
    ap.add_argument("--fold-align", action="store_true", default=S,
                    help="decoder: the block alignment in the two-beat fold (--lanes N/2 = G)")
    ap.add_argument("--reset-copies", action="store_true", default=S,
                    help="decoder: the reset through one register copy per region")
    ap.add_argument("--flow", choices=FLOWS, default=S,
                    help="flow control (default stall; credit: the pipeline never stalls, an "
                         "output skid FIFO, i__ready a register; +3 cycles of latency)")
    ap.add_argument("--credit-extra", type=int, default=S,
                    help="with --flow credit: skid FIFO entries beyond the minimum (default 0)")
    ap.add_argument("--lanes", type=int, default=S,
                    help="lanes per cycle W: N (default) or N/2, each vector as two beats")
    ap.add_argument("--top", default=None,
                    help="Verilog module name (default: " + ", ".join(
                        f"{v.top} for {k}" for k, v in KINDS.items())
                        + "; with --module both: the encoder's)")
    ap.add_argument("--dec-top", default=None,
                    help=f"module name of the decoder with --module both (default {KINDS['decoder'].top})")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--lint", action="store_true",
                    help="also run verilator --lint-only -Wall (with rtl_gen's waivers)")
    return ap


def _override(opts, flags: dict):
    """``opts`` with the given option flags (fold_align into ``fold``)."""
    if "fold_align" in flags:
        flags = dict(flags)
        flags["fold"] = replace(opts.fold, align=flags.pop("fold_align"))
    return replace(opts, **flags)


def _targets(a: argparse.Namespace, given: dict) -> tuple[str, FormatParams, object, object]:
    """(module, params, encoder options, decoder options) of the arguments."""
    if a.config is not None:
        if a.module is not None:
            raise ValueError("--module: --config states the kind (enc_, dec_, rt_)")
        fmt = [_flag(f) for f in FORMAT_FLAGS if f in given]
        if fmt:
            raise ValueError(f"{', '.join(fmt)}: --config states the format")
        cfg = RTLConfig.parse(a.config)
        return cfg.kind, cfg.params, cfg.enc, cfg.dec
    module = a.module or "encoder"
    if given.get("n", 0) > RTL_N_MAX:
        raise ValueError(f"n (N) = {given['n']} is above the largest RTL size {RTL_N_MAX} "
                         f"(verified: N = 64, 128, 256; a 16*N-bit port per lane set)")
    kw = {f: given[f] for f in FORMAT_FIELDS if f in given}
    if "seed" in given or "no_sign_flip" in given:
        kw["sign_seed"] = (None if given.get("no_sign_flip")
                           else given.get("seed", FormatParams().sign_seed))
    p = FormatParams(**kw)
    enc = EncoderOptions() if module != "decoder" else None
    dec = DecoderOptions() if module != "encoder" else None
    return module, p, enc, dec


def main(argv=None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    given = {k: v for k, v in vars(a).items()
             if k not in ("config", "module", "top", "dec_top", "out", "lint")}
    try:
        if a.dec_top is not None and a.module != "both":
            raise ValueError("--dec-top names the decoder of --module both; use --top")
        module, p, enc, dec = _targets(a, given)
        for table, opts, who in ((ENC_FLAGS, enc, "encoder"),
                                 ({**DEC_FLAGS, "fold_align": "fold_align"}, dec, "decoder")):
            bad = [_flag(f) for f in table if f in given and opts is None]
            if bad:
                raise ValueError(f"{', '.join(bad)} configure(s) the {who}; not part of "
                                 f"{a.config or '--module ' + module}")
        if module == "roundtrip" and given.get("key_slots"):
            raise ValueError("--key-slots: the round trip has no key front end")
        both = {f: given[f] for f in BOTH_FLAGS if f in given}
        if enc is not None:
            kw = {f: given[f] for f in ENC_FLAGS if f in given}
            if "key_slots" in kw and "fe_regs" not in kw and \
                    enc.fe_regs == EncoderOptions(key_slots=enc.key_slots).fe_regs:
                kw["fe_regs"] = None        # the default cuts of the front end chosen
            enc = replace(enc, **both, **kw)
        if dec is not None:
            dec = _override(dec, {**both, **{f: given[f] for f in (*DEC_FLAGS, "fold_align")
                                             if f in given}})
        if module == "both":
            mans = list(generate_both(p, a.out, enc, dec, top=a.top, dec_top=a.dec_top)
                        ["modules"].values())
        else:
            opts = {"encoder": enc, "decoder": dec}.get(module) or RoundTripOptions(enc, dec)
            mans = [generate(module, p, a.out, opts, top=a.top)]
    except (ValueError, TypeError) as err:
        ap.error(str(err))
    except OSError as err:
        ap.error(f"cannot write --out {a.out}: {err}")
    for man in mans:
        width = man["ports"]["o__payload"]["width"]
        print(f"wrote {a.out}/{man['verilog']} and {a.out}/manifest.json: "
              f"latency {man['latency_cycles']} cycles, o__payload {width} bits")
    if a.lint:
        for man in mans:
            r = lint(f"{a.out}/{man['verilog']}", man["top"])
            sys.stdout.write(r.stdout)
            sys.stderr.write(r.stderr)
            if r.returncode:
                return 1
            print(f"verilator lint ({man['top']}): clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
