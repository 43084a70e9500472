"""Command line: ``python -m rtl_gen --n 128 --block 64 --bits 3 --latency 2 --out DIR``.

Writes DIR/<top>.v (default top ``kv_epilogue``) and DIR/manifest.json.
``--module decompressor`` writes the read path instead (DIR/kv_decompressor.v,
DIR/manifest.json), ``--module roundtrip`` the round-trip DUT (DIR/kv_roundtrip.v);
``--module both`` writes encoder and decoder, a manifest per module
(DIR/<name>.manifest.json) and DIR/manifest.json (the epilogue's manifest plus
``modules``: both manifests). ``--latency`` is the FWHT pipeline registers (the
components' ``latency`` argument). Bad parameters exit with status 2 and a message
naming the parameter.
"""

from __future__ import annotations

import argparse
import sys

from hw.frontend import FE_CUTS
from hw.keyfront import KF_CUTS
from hw.pipeline import FLOWS
from hw.quantizer import QUANT_CUTS
from sim_models.params import (INPUT_DTYPES, QUANT_MODES, SCALE_ENCODINGS, SCALE_ROUNDING,
                               SCALE_RULES, FormatParams)

from . import KINDS, generate, generate_both, lint

#: --module choices -> rtl_gen kinds.
MODULES = {"epilogue": "encoder", "decompressor": "decoder", "roundtrip": "roundtrip"}

#: Largest N the command line generates (verified in make sim: N = 64, 128, 256; above
#: 512 elaboration takes minutes and nothing is verified).
RTL_N_MAX = 512


def _cuts(text: str) -> tuple[str, ...]:
    """``--quant-regs`` / ``--fe-regs`` / ``--kf-regs``: comma-separated cut names, or "none"
    (an empty list is refused: "none" says it)."""
    if text.strip() == "none":
        return ()
    cuts = tuple(c.strip() for c in text.split(",") if c.strip())
    if not cuts:
        raise argparse.ArgumentTypeError(f"empty cut list {text!r}: name cuts or write 'none'")
    return cuts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rtl_gen",
                                 description="Generate the Verilog of the fwht-kv write path "
                                             "(KVEpilogue) and/or read path (KVDecompressor) "
                                             "and the manifest.json.")
    ap.add_argument("--module", choices=(*MODULES, "both"), default="epilogue",
                    help="which top level(s) to emit (default epilogue; roundtrip: epilogue -> "
                         "decompressor with a direct decompressor input, the round-trip DUT)")
    d = FormatParams()     # every format default comes from sim_models.params
    ap.add_argument("--n", type=int, default=d.n, help=f"lanes N, power of two (default {d.n})")
    ap.add_argument("--block", type=int, default=d.block, help=f"block size G (default {d.block})")
    ap.add_argument("--bits", type=int, default=d.bits,
                    help=f"code bits b in {{2,3,4}} (default {d.bits})")
    ap.add_argument("--latency", type=int, default=2,
                    help="FWHT pipeline registers, 0..log2(N) (default 2); the total latency (the manifest's "
                         "latency_cycles and latency_breakdown) adds the --quant-regs / --fe-regs cuts, the "
                         "--tree-every registers and the key front end (table read + --kf-regs cuts)")
    ap.add_argument("--quant-regs", type=_cuts, default=QUANT_CUTS.default,
                    help=f"quantizer register cuts, comma-separated from {','.join(QUANT_CUTS.names)} "
                         f"or 'none' (default {','.join(QUANT_CUTS.default) or 'none'}); "
                         f"each adds one cycle of latency")
    ap.add_argument("--fe-regs", type=_cuts, default=FE_CUTS.default,
                    help=f"front-end register cuts, comma-separated from {','.join(FE_CUTS.names)} "
                         f"or 'none' (default {','.join(FE_CUTS.default) or 'none'})")
    ap.add_argument("--tree-every", type=int, default=0,
                    help="a register after every K levels of the epilogue's reduction trees "
                         "(exponent max tree, block statistic trees; default 0: none)")
    ap.add_argument("--key-slots", type=int, default=0,
                    help="key front end table slots T of the epilogue (docs/FORMAT.md 8; fp16 only; "
                         "default 0: no key front end)")
    ap.add_argument("--kf-regs", type=_cuts, default=KF_CUTS.default,
                    help=f"key front end register cuts, comma-separated from {','.join(KF_CUTS.names)} "
                         f"or 'none' (default {','.join(KF_CUTS.default)}; with --key-slots)")
    ap.add_argument("--lane-ram", type=int, default=0,
                    help="lane delay lines of at least D register stages (D >= 3) in block RAM "
                         "instead of flip-flops (epilogue; default 0: none)")
    ap.add_argument("--flow", choices=FLOWS, default="stall",
                    help="flow control (default stall: every register advances with o__ready | ~o__valid; "
                         "credit: credit-based flow control, the pipeline never stalls, an output skid "
                         "FIFO in block RAM, i__ready a register; +3 cycles of latency)")
    ap.add_argument("--credit-extra", type=int, default=0,
                    help="with --flow credit: skid FIFO entries beyond the minimum, latency + 1 "
                         "(two beats: latency // 2 + 1) (default 0)")
    ap.add_argument("--lanes", type=int, default=None,
                    help="lanes per cycle W: N (default) or N/2, each vector as two beats "
                         "(one vector every two cycles; --latency then counts the W-point "
                         "network's registers, 0 .. log2 W)")
    ap.add_argument("--mant-bits", type=int, default=d.mant_bits,
                    help=f"BFP mantissa width M (default {d.mant_bits})")
    ap.add_argument("--seed", type=int, default=d.sign_seed,
                    help=f"sign-flip seed (default {d.sign_seed})")
    ap.add_argument("--no-sign-flip", action="store_true", help="disable the sign flip D")
    ap.add_argument("--dtype", choices=tuple(INPUT_DTYPES), default=d.dtype)
    ap.add_argument("--mode", choices=QUANT_MODES, default=d.mode,
                    help=f"quantizer mode (default {d.mode})")
    ap.add_argument("--scale", choices=SCALE_ENCODINGS, default=d.scale,
                    help=f"scale-byte encoding (default {d.scale})")
    ap.add_argument("--scale-rule", choices=SCALE_RULES, default=d.scale_rule,
                    help=f"block statistic of the scale (default {d.scale_rule})")
    ap.add_argument("--scale-round", choices=SCALE_ROUNDING, default=d.scale_round,
                    help=f"rounding of the scale to a byte (default {d.scale_round})")
    ap.add_argument("--scale-mult", type=int, default=d.scale_mult,
                    help="scale multiplier in units of 1/256 (default: the rule's default)")
    ap.add_argument("--top", default=None,
                    help="Verilog module name (default: " + ", ".join(
                        f"{KINDS[k].top} for --module {m}" for m, k in MODULES.items())
                        + "; with --module both: the epilogue's)")
    ap.add_argument("--dec-top", default=None,
                    help=f"module name of the decompressor with --module both (default {KINDS['decoder'].top})")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--lint", action="store_true",
                    help="also run verilator --lint-only -Wall (with rtl_gen's waivers)")
    a = ap.parse_args(argv)
    try:
        if a.n > RTL_N_MAX:
            raise ValueError(f"n (N) = {a.n} is above the largest RTL size {RTL_N_MAX} "
                             f"(verified: N = 64, 128, 256; a 16*N-bit port per lane set)")
        if a.module == "decompressor" and (a.quant_regs != QUANT_CUTS.default
                                           or a.fe_regs != FE_CUTS.default or a.tree_every
                                           or a.lane_ram):
            raise ValueError("--quant-regs/--fe-regs/--tree-every/--lane-ram configure the epilogue (write "
                             "path); they do not apply to --module decompressor")
        if a.dec_top is not None and a.module != "both":
            raise ValueError("--dec-top names the decompressor of --module both; with --module "
                             f"{a.module} use --top")
        if a.key_slots < 0:
            raise ValueError(f"--key-slots must be >= 0, got {a.key_slots}")
        if a.module in ("decompressor", "roundtrip") and a.key_slots:
            raise ValueError("--key-slots configures the epilogue's key front end (write path); it does not "
                             f"apply to --module {a.module}")
        if a.kf_regs != KF_CUTS.default and not a.key_slots:
            raise ValueError("--kf-regs needs --key-slots > 0 (the key front end)")
        p = FormatParams(n=a.n, block=a.block, bits=a.bits, mode=a.mode, mant_bits=a.mant_bits,
                         scale=a.scale, dtype=a.dtype,
                         sign_seed=None if a.no_sign_flip else a.seed,
                         scale_rule=a.scale_rule, scale_round=a.scale_round,
                         scale_mult=a.scale_mult)
        regs = {"latency": a.latency}
        if a.flow != "stall" or a.credit_extra:
            regs.update(flow=a.flow, credit_extra=a.credit_extra)
        if a.lanes is not None:
            regs["lanes"] = a.lanes
        if a.module != "decompressor":
            regs.update(quant_regs=a.quant_regs, fe_regs=a.fe_regs, tree_every=a.tree_every,
                        lane_ram=a.lane_ram)
            if a.key_slots:
                regs.update(key_slots=a.key_slots, kf_regs=a.kf_regs)
        if a.module == "both":
            mans = list(generate_both(p, a.out, top=a.top, dec_top=a.dec_top, **regs)
                        ["modules"].values())
        else:
            mans = [generate(MODULES[a.module], p, a.out, top=a.top, **regs)]
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
