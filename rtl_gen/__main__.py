"""Command line: ``python -m rtl_gen --n 128 --block 64 --bits 3 --latency 2 --out DIR``.

Writes DIR/<top>.v (default top ``kv_epilogue``) and DIR/manifest.json.
``--module decompressor`` writes the read path instead (DIR/kv_decompressor.v,
DIR/manifest.json); ``--module both`` writes both modules, a manifest per module
(DIR/<name>.manifest.json) and DIR/manifest.json (the epilogue's manifest plus
``modules``: both manifests). Bad parameters exit with status 2 and a message
naming the parameter.
"""

from __future__ import annotations

import argparse
import sys

from sim_models.params import DEFAULT_SIGN_SEED, INPUT_DTYPES, QUANT_MODES, SCALE_ENCODINGS, FormatParams

from . import DEC_TOP_NAME, TOP_NAME, generate, generate_both, generate_decompressor, lint


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rtl_gen",
                                 description="Generate the Verilog of the fwht-kv write path "
                                             "(KVEpilogue) and/or read path (KVDecompressor) "
                                             "and the manifest.json.")
    ap.add_argument("--module", choices=("epilogue", "decompressor", "both"), default="epilogue",
                    help="which top level(s) to emit (default epilogue)")
    ap.add_argument("--n", type=int, default=128, help="lanes N, power of two (default 128)")
    ap.add_argument("--block", type=int, default=64, help="block size G (default 64)")
    ap.add_argument("--bits", type=int, default=3, help="code bits b in {2,3,4} (default 3)")
    ap.add_argument("--latency", type=int, default=2,
                    help="FWHT pipeline registers, 0..log2(N) (default 2); "
                         "total latency = latency + 3")
    ap.add_argument("--mant-bits", type=int, default=12, help="BFP mantissa width M (default 12)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SIGN_SEED,
                    help=f"sign-flip seed (default {DEFAULT_SIGN_SEED})")
    ap.add_argument("--no-sign-flip", action="store_true", help="disable the sign flip D")
    ap.add_argument("--dtype", choices=tuple(INPUT_DTYPES), default="fp16")
    ap.add_argument("--mode", choices=QUANT_MODES, default="midtread")
    ap.add_argument("--scale", choices=SCALE_ENCODINGS, default="ue5m3")
    ap.add_argument("--top", default=None,
                    help=f"Verilog module name (default {TOP_NAME}; with --module decompressor "
                         f"{DEC_TOP_NAME}; with --module both: the epilogue's)")
    ap.add_argument("--dec-top", default=DEC_TOP_NAME,
                    help=f"module name of the decompressor with --module both (default {DEC_TOP_NAME})")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--lint", action="store_true",
                    help="also run verilator --lint-only -Wall (with rtl_gen's waivers)")
    a = ap.parse_args(argv)
    try:
        p = FormatParams(n=a.n, block=a.block, bits=a.bits, mode=a.mode, mant_bits=a.mant_bits,
                         scale=a.scale, dtype=a.dtype,
                         sign_seed=None if a.no_sign_flip else a.seed)
        if a.module == "epilogue":
            mans = [generate(p, a.latency, a.out, top=a.top or TOP_NAME)]
        elif a.module == "decompressor":
            mans = [generate_decompressor(p, a.latency, a.out, top=a.top or DEC_TOP_NAME)]
        else:
            mans = list(generate_both(p, a.latency, a.out, top=a.top or TOP_NAME,
                                      dec_top=a.dec_top)["modules"].values())
    except (ValueError, TypeError) as err:
        ap.error(str(err))
    for man in mans:
        width = man["o_payload"].get("width", 16 * man["params"]["n"])
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
