"""Command line: ``python -m sim_models encode IN.npy OUT.npz`` / ``decode IN.npz OUT.npy``.

encode: IN.npy holds fp16 values (float16) or raw bit patterns (uint16), shape
[vectors, N] (any leading axes). OUT.npz gets ``codes`` (uint8 [..., N*b/8]),
``scales`` (uint8 [..., N/G]), ``flags`` (uint8 [...]), ``params`` (JSON) and,
for mode asym, ``zeros`` (uint8 [..., N/G]).
decode: reads such an .npz (parameters from the file) and writes the
reconstruction as float16 (fp16 input type) or uint16 bf16 bit patterns.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from .codec import decode, encode
from .params import (DEFAULT_SIGN_SEED, INPUT_DTYPES, QUANT_MODES, SCALE_ENCODINGS,
                     SCALE_ROUNDING, SCALE_RULES, FormatParams)


def _params_from_args(a) -> FormatParams:
    return FormatParams(n=a.n, block=a.block, bits=a.bits, mode=a.mode, mant_bits=a.mant_bits,
                        scale=a.scale, dtype=a.dtype,
                        sign_seed=None if a.no_sign_flip else a.sign_seed,
                        scale_rule=a.scale_rule, scale_round=a.scale_round,
                        scale_mult=a.scale_mult)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim_models", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    enc = sub.add_parser("encode", help="fp16/bf16 vectors -> code plane, scale plane, flags")
    enc.add_argument("inp", help="input .npy, float16 or uint16 bit patterns, [..., N]")
    enc.add_argument("out", help="output .npz")
    enc.add_argument("--n", type=int, default=None, help="lanes N (default: last axis of input)")
    d = FormatParams()                      # defaults of the current format version
    enc.add_argument("--block", type=int, default=d.block, help=f"block size G (default {d.block})")
    enc.add_argument("--bits", type=int, default=d.bits, help=f"code bits b (default {d.bits})")
    enc.add_argument("--mode", choices=QUANT_MODES, default=d.mode,
                     help=f"quantizer mode (default {d.mode}; version 1: midtread)")
    enc.add_argument("--mant-bits", type=int, default=d.mant_bits,
                     help=f"BFP mantissa width M (default {d.mant_bits})")
    enc.add_argument("--scale", choices=SCALE_ENCODINGS, default=d.scale)
    enc.add_argument("--dtype", choices=tuple(INPUT_DTYPES), default=d.dtype)
    enc.add_argument("--sign-seed", type=int, default=DEFAULT_SIGN_SEED)
    enc.add_argument("--no-sign-flip", action="store_true", help="disable the sign flip D")
    enc.add_argument("--scale-rule", choices=SCALE_RULES, default=d.scale_rule)
    enc.add_argument("--scale-round", choices=SCALE_ROUNDING, default=d.scale_round,
                     help=f"rounding of the scale byte (default {d.scale_round}; version 1: up)")
    enc.add_argument("--scale-mult", type=int, default=None,
                     help="scale multiplier in units of 1/256 (default: the mode's)")
    dec = sub.add_parser("decode", help="code plane + scale plane -> reconstructed vectors")
    dec.add_argument("inp", help="input .npz written by encode")
    dec.add_argument("out", help="output .npy")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "encode":
            x = np.load(a.inp, allow_pickle=False)
            if a.n is None:
                if x.ndim == 0:
                    raise ValueError(f"{a.inp}: input must have shape [..., N], got a 0-d array")
                a.n = int(x.shape[-1])
            p = _params_from_args(a)
            e = encode(x, p)
            extra = {} if e.zeros is None else {"zeros": e.zeros}
            np.savez(a.out, codes=e.codes, scales=e.scales, flags=e.flags,
                     params=np.array(json.dumps(p.to_dict())), **extra)
            print(f"encoded {e.flags.size} vectors: {p.bytes_per_vector} bytes each "
                  f"({p.bits_per_element:.3f} bits/element); flags set on "
                  f"{int(np.count_nonzero(e.flags))}")
        else:
            z = np.load(a.inp, allow_pickle=False)
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError(f"{a.inp} is not an .npz written by 'encode'")
            with z:
                missing = {"params", "codes", "scales"} - set(z.files)
                if missing:
                    raise ValueError(f"{a.inp} lacks {sorted(missing)}; not written by 'encode'")
                try:
                    d = json.loads(str(z["params"]))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{a.inp}: params is not valid JSON ({err})") from None
                if not isinstance(d, dict):
                    raise ValueError(f"{a.inp}: params is not a JSON object; not written by 'encode'")
                if "format_version" not in d:
                    raise ValueError(f"{a.inp}: params lack format_version; not written by 'encode'")
                try:
                    p = FormatParams.from_dict(d)
                except (ValueError, TypeError) as err:
                    raise ValueError(f"{a.inp}: {err}") from None
                out = decode(z["codes"], z["scales"], p, z["zeros"] if "zeros" in z else None)
            np.save(a.out, out.view(np.float16) if p.dtype == "fp16" else out)
            print(f"decoded {out.size // p.n} vectors")
    except (ValueError, TypeError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
