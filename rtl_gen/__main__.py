"""Command line: ``python -m rtl_gen --n 128 --block 64 --bits 3 --latency 2 --out DIR``.

Writes DIR/<top>.v (default top ``kv_epilogue``) and DIR/manifest.json.
Bad parameters exit with status 2 and a message naming the parameter.
"""

from __future__ import annotations

import argparse
import sys

from sim_models.params import DEFAULT_SIGN_SEED, INPUT_DTYPES, QUANT_MODES, SCALE_ENCODINGS, FormatParams

from . import TOP_NAME, generate, lint


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rtl_gen",
                                 description="Generate the Verilog of the fwht-kv write path "
                                             "(KVEpilogue) and its manifest.json.")
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
    ap.add_argument("--top", default=TOP_NAME, help=f"Verilog module name (default {TOP_NAME})")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--lint", action="store_true",
                    help="also run verilator --lint-only -Wall (with rtl_gen's waivers)")
    a = ap.parse_args(argv)
    try:
        p = FormatParams(n=a.n, block=a.block, bits=a.bits, mode=a.mode, mant_bits=a.mant_bits,
                         scale=a.scale, dtype=a.dtype,
                         sign_seed=None if a.no_sign_flip else a.seed)
        man = generate(p, a.latency, a.out, top=a.top)
    except (ValueError, TypeError) as err:
        ap.error(str(err))
    print(f"wrote {a.out}/{man['verilog']} and {a.out}/manifest.json: "
          f"latency {man['latency_cycles']} cycles, o__payload {man['o_payload']['width']} bits")
    if a.lint:
        r = lint(f"{a.out}/{man['verilog']}", man["top"])
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        if r.returncode:
            return 1
        print("verilator lint: clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
