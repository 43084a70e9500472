"""KV-cache size of a model shape and context: fp16 vs the format.

``python -m sim_models.memory --layers 80 --kv-heads 8 --head-dim 128 --context 131072``
(Llama-3-70B at 128K: 40.0 GiB fp16, 7.81 GiB at 3.125 bits/element), or
``--preset llama-3-70b``; ``--policy v4`` (the recommended policy, or any
:meth:`sim_models.CachePolicy.parse` spec, docs/FORMAT.md 8) sizes a cache policy instead of
``--bits/--block/--mode/--sinks``. Counts every stored byte via
:class:`sim_models.CachePolicy`: codes, scale bytes, zero points (asym),
fp16 sink tokens, the recent ring's fp16 rows. One vector per (token, layer, kv-head, K or V)
with N = head_dim.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from .params import QUANT_MODES, FormatParams
from .policy import POLICY_PRESETS, CachePolicy

#: (layers, kv_heads, head_dim) from the models' published configs.
PRESETS = {
    "smollm2-135m": (30, 3, 64),
    "llama-2-7b": (32, 32, 128),
    "llama-3-8b": (32, 8, 128),
    "llama-3-70b": (80, 8, 128),
    "llama-3.1-405b": (126, 8, 128),
    "mistral-7b": (32, 8, 128),
    "qwen2.5-7b": (28, 4, 128),
}

GIB = 1 << 30


def cache_bytes(layers: int, kv_heads: int, head_dim: int, context: int,
                policy: CachePolicy | None, batch: int = 1) -> int:
    """Bytes of the K and V cache; ``policy=None`` means fp16.

    Raises:
        ValueError: a non-positive size, or head_dim not a multiple of the format's N.
    """
    for name, v in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim),
                    ("context", context), ("batch", batch)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if policy is None:
        return 2 * layers * kv_heads * head_dim * context * 2 * batch
    bits = policy.stored_bits(layers, kv_heads, head_dim, context)
    return (bits * batch + 7) // 8


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim_models.memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="model shape")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--policy", metavar="SPEC",
                    help=f"cache policy: a preset ({', '.join(POLICY_PRESETS)}; v4 recommended) or "
                         "a spec (K4V3+C+S4+KS2+W16, ...; docs/FORMAT.md 8) instead of "
                         "--bits/--block/--mode/--sinks")
    ap.add_argument("--bits", type=int, help="code width b (default 3)")
    ap.add_argument("--block", type=int, help="scale block G (default 64)")
    ap.add_argument("--mode", choices=QUANT_MODES, help=f"quantizer (default {FormatParams().mode})")
    ap.add_argument("--sinks", type=int, help="leading tokens kept in fp16 (default 0)")
    a = ap.parse_args(argv)
    fmt_opts = [f"--{n}" for n in ("bits", "block", "mode", "sinks") if getattr(a, n) is not None]
    if a.policy is not None and fmt_opts:
        ap.error(f"--policy states the format: drop {', '.join(fmt_opts)}")
    shape = PRESETS.get(a.preset, (None, None, None))
    layers = a.layers if a.layers is not None else shape[0]
    heads = a.kv_heads if a.kv_heads is not None else shape[1]
    hd = a.head_dim if a.head_dim is not None else shape[2]
    if None in (layers, heads, hd):
        ap.error("give --preset or all of --layers, --kv-heads, --head-dim")
    try:
        if a.policy is not None:
            pol = CachePolicy.parse(a.policy).fit(hd)           # one vector per head (--head-dim)
            try:
                pol.check_layers(layers)
            except ValueError as err:
                raise ValueError(f"--policy {a.policy!r}: {err}") from None
            what = f"policy {a.policy} = {CachePolicy.parse(a.policy).spec}"
        else:
            pol = CachePolicy(k=FormatParams(block=a.block or 64, bits=a.bits or 3,
                                             mode=a.mode or FormatParams().mode), sinks=a.sinks or 0)
            pol = dataclasses.replace(pol, v=pol.k).fit(hd)    # one vector per head (--head-dim)
            p = pol.k
            what = f"{p.mode} b={p.bits} G={p.block}, sinks {pol.sinks}"
        fp = cache_bytes(layers, heads, hd, a.context, None, a.batch)
        fm = cache_bytes(layers, heads, hd, a.context, pol, a.batch)
    except (ValueError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    bpe = pol.bits_per_element(layers, heads, hd, a.context)
    print(f"shape    : {layers} layers x {heads} kv-heads x head_dim {hd}, context {a.context}, "
          f"batch {a.batch}")
    print(f"fp16     : {fp:>16,d} bytes  {fp / GIB:9.2f} GiB")
    print(f"format   : {fm:>16,d} bytes  {fm / GIB:9.2f} GiB  ({bpe:.3f} bits/element, "
          f"{what})")
    print(f"ratio    : {fp / fm:.2f}x smaller" if fm < fp else
          f"ratio    : {fm / fp:.2f}x larger" if fm > fp else "ratio    : 1.00x (the same size)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
