#!/usr/bin/env python3
"""K/V reconstruction error on the real fixture vs the block-floating-point mantissa width M.

The golden model (``sim_models.encode`` -> ``sim_models.decode_float``) encodes
every post-RoPE key and every value of the SmolLM2-135M capture
``verif/data/smollm2_kv.npz`` (keys ``k``, ``v``: uint16 fp16 bits
[30 layers, 160 tokens, 3 heads, 64]) for each M in 6..16 and reports

* ``relmse``: sum ||x_hat - x||^2 / sum ||x||^2 over all vectors (K and V
  separately), for b = 2, 3, 4 (N = 64 = head_dim, G = 64; and the product
  default N = 128, G = 64 with adjacent heads concatenated, b = 3);
* ``bfp_relmse``: the error of the block-floating-point front end alone
  (``x * 2^u`` of ``sim_models.bfp.to_block_fp`` vs x): the floor M sets before
  any code quantization.

The write path's area grows with M (every FWHT adder is M + s + 1 bits; see
bench/results/synth.json): M is chosen where the total error stops improving.
Writes bench/results/synth_mantissa.json and bench/results/synth_mantissa.png
(default M marked). Usage: ``python -m bench.synth mantissa``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sim_models import FormatParams, decode_float, encode, sign_mask  # noqa: E402
from sim_models.bfp import to_block_fp  # noqa: E402
from sim_models.params import MANT_BITS_RANGE  # noqa: E402

FIXTURE = REPO / "verif" / "data" / "smollm2_kv.npz"
OUT = REPO / "bench" / "results"
DEFAULT_M = FormatParams().mant_bits


def vectors(a: np.ndarray, n: int) -> np.ndarray:
    """uint16 [L, T, H, hd] -> [V, n]: one head per vector (n == hd) or adjacent heads
    (h, h+1) concatenated (n == 2 hd)."""
    hd, heads = a.shape[-1], a.shape[-2]
    if n == hd:
        return a.reshape(-1, hd)
    return np.concatenate([np.concatenate([a[..., h, :], a[..., h + 1, :]], axis=-1)
                           .reshape(-1, n) for h in range(heads - 1)])


def relmse(x: np.ndarray, xh: np.ndarray) -> float:
    return float(((xh - x) ** 2).sum() / (x ** 2).sum())


def run(fixture: Path) -> dict:
    with np.load(fixture) as z:
        kv = {"k": z["k"], "v": z["v"]}
    ms = list(range(MANT_BITS_RANGE[0], MANT_BITS_RANGE[1] + 1))
    rows = []
    for name, a in kv.items():
        for n, bits_list in ((64, (2, 3, 4)), (128, (3,))):
            bits = vectors(a, n)
            x = bits.view(np.float16).astype(np.float64)
            for m in ms:
                for b in bits_list:
                    p = FormatParams(n=n, block=64, bits=b, mant_bits=m)
                    e = encode(bits, p)
                    xh = decode_float(e.codes, e.scales, p)
                    rows.append({"tensor": name, "n": n, "block": 64, "bits": b, "mant_bits": m,
                                 "relmse": relmse(x, xh)})
                p = FormatParams(n=n, block=64, mant_bits=m)
                xb, u, _ = to_block_fp(bits, p, sign_mask(n, p.sign_seed))
                xb = np.where(sign_mask(n, p.sign_seed)[None, :] == 1, -xb, xb)
                rows.append({"tensor": name, "n": n, "block": 64, "bits": None, "mant_bits": m,
                             "bfp_relmse": relmse(x, np.ldexp(xb.astype(np.float64),
                                                              u[:, None].astype(np.int32)))})
    return {"fixture": str(fixture.relative_to(REPO)), "default_mant_bits": DEFAULT_M,
            "quantizer": FormatParams().to_dict(),
            "vectors": {k: int(np.prod(v.shape[:-1])) for k, v in kv.items()},
            "metric": "sum ||x_hat - x||^2 / sum ||x||^2 (decode_float vs fp16 input)",
            "rows": rows}


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, t in zip(axes, ("k", "v")):
        for (n, b), style in (((64, 2), "o-"), ((64, 3), "s-"), ((64, 4), "^-"), ((128, 3), "s--")):
            rs = [r for r in res["rows"] if r["tensor"] == t and r["n"] == n and r["bits"] == b]
            ax.semilogy([r["mant_bits"] for r in rs], [r["relmse"] for r in rs], style,
                        label=f"N={n}, G=64, b={b}")
        rs = [r for r in res["rows"] if r["tensor"] == t and r["n"] == 64 and r["bits"] is None]
        ax.semilogy([r["mant_bits"] for r in rs], [r["bfp_relmse"] for r in rs], "k:",
                    label="BFP front end alone (N=64)")
        ax.axvline(res["default_mant_bits"], color="grey", lw=1)
        ax.text(res["default_mant_bits"] + 0.1, ax.get_ylim()[0] * 3 if ax.get_ylim()[0] > 0 else 1e-8,
                f"default M={res['default_mant_bits']}", color="grey", fontsize=8)
        ax.set_title(f"{t.upper()} (SmolLM2-135M fixture, {res['vectors'][t]} head vectors)")
        ax.set_xlabel("BFP mantissa width M (bits, sign included)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("relative MSE  sum|x^-x|^2 / sum|x|^2")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.synth mantissa", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture", type=Path, default=FIXTURE)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    res = run(a.fixture)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "synth_mantissa.json").write_text(json.dumps(res, indent=1) + "\n")
    plot(res, a.out / "synth_mantissa.png")
    for t in ("k", "v"):
        line = [f"{r['mant_bits']}:{r['relmse']:.4g}" for r in res["rows"]
                if r["tensor"] == t and r["n"] == 64 and r["bits"] == 3]
        print(t, "b=3 N=64 relmse by M:", " ".join(line))
    print(f"wrote {a.out / 'synth_mantissa.json'} and {a.out / 'synth_mantissa.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
