"""Why plans with key scales feed q~ as two fp16 parts (issue 12, round 11): a measurement.

For key-scale caches built like tests/test_gpu.py's policy cases (KVCache write kernel, K3V3 / K4V3, 4 sinks,
centering), prints and saves per case: the decode kernel's relative error against float64 over the same cache with
one q~ part (``qlo`` 0) and two (``qlo`` 1), torch SDPA bf16's own error on the unscaled K/V (the budget), and two
diagnostics that separate the hypotheses:

* exponent range: the fp16 q~ part as the kernel forms it (per-head power of two ``2^(10 - eq)`` so the largest
  magnitude sits in [2^14, 2^15), times ``2^-o`` for the code's bit offset o), emulated on the host with a
  Hadamard rotation: the fraction of its entries that are fp16 subnormal or zero, and the smallest exponent;
* conditioning: ``rho = rms(|q / s| |k s|) / rms(sqrt(N) |q * k|)`` over (query head, token; ``q * k`` the
  channel products). One fp16 part of the rotated q~ leaves an error isotropic in the channel domain,
  ~2^-12 |q / s| per head, whose logit error is ~2^-12 |q / s| |k s| / sqrt(N); SDPA bf16 rounds q and k per
  channel, a logit error ~2^-9 |q * k|. So the one-part error over SDPA's should grow as rho / 8 (rho = 1 for
  balanced channels without key scales), whatever the exponent range.

Scale modes: ``random3`` (the tests' data: e uniform in [-3, 3] per channel, independent of q and k, whose channels
are balanced: rho ~ 12), ``random14`` (e in [-14, 14], -14 and 14 present), ``calib4`` / ``calib14`` (the
calibration rule of sim_models.keyscale, s ~ (E q^2 / E k^2)^(1/4): q channels ~2^e, k channels ~2^-e, s = 2^e,
e in [-4, 4] / [-14, 14] with both extremes present, mixed signs: q / s and k s balanced, rho ~ 1).
Usage (device): ``python3 bench/gpu_qparts.py --out $OUT`` -> ``$OUT/gpu_qparts.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import cupy as cp  # noqa: E402

import gpu_ref  # noqa: E402
import test_gpu as T  # noqa: E402  (the policy-case helpers: reference, SDPA budget)
from kvtest.gpu_cases import key_scale_rho, qparams, rel_err  # noqa: E402
from sim_models.fwht import hadamard  # noqa: E402


def exps(rng, lo, hi, shape):
    e = rng.integers(lo, hi + 1, shape)
    e[..., 0], e[..., 1] = lo, hi  # both extremes present in every kv head
    return e


def make(mode, bsz, hq, kvh, n, lengths, kb, vb, sinks=4, seed=0):
    rng = np.random.default_rng([seed, kb, vb, len(mode)])
    t = int(max(lengths))
    kf = rng.standard_normal((bsz, t, kvh, n)) * np.exp(rng.normal(0, 0.8, (bsz, t, kvh, 1)))
    vf = rng.standard_normal((bsz, t, kvh, n)) * np.exp(rng.normal(0, 0.8, (bsz, t, kvh, 1)))
    qf = rng.standard_normal((bsz, hq, n)) * 1.5
    hi = int(mode[-2:] if mode[-2:].isdigit() else mode[-1])
    e = exps(rng, -hi, hi, (kvh, n))
    if mode.startswith("calib"):  # q channel ~2^e, k channel ~2^-e: the calibration rule gives s = 2^e
        grp = hq // kvh
        qf = np.clip(qf, -3.9, 3.9) * np.exp2(np.repeat(e, grp, axis=0))[None]
        kf = np.clip(kf, -3.9, 3.9) * np.exp2(-e)[None, None]
    s = np.exp2(e).astype(np.float32)
    k16, v16, q16 = kf.astype(np.float16), vf.astype(np.float16), qf.astype(np.float16)
    mu16 = (rng.normal(0, 0.1, (kvh, n)) * np.exp2(-e if mode.startswith("calib") else 0)).astype(np.float16)
    kp = qparams("midrise", "nearest", n=n, block=64, bits=kb)
    vp = qparams("midrise", "nearest", n=n, block=64, bits=vb)
    cache = gpu_ref.KVCache(bsz, kvh, t, kp, v_params=vp, sinks=sinks, mu=mu16, key_scale=s)
    cache.append(cp.asarray(k16), cp.asarray(v16))
    cache.host_lengths[:] = np.asarray(lengths)
    cache.lengths = cp.asarray(np.asarray(lengths), dtype=cp.int32)
    return cache, q16, k16, v16, s


def diagnostics(q16, k16, s, kvh, lengths):
    """(rho, fraction of subnormal or zero fp16 q~ entries, smallest nonzero exponent of the fp16 part)."""
    bsz, hq, n = q16.shape
    grp = hq // kvh
    qs = q16.astype(np.float64) / np.repeat(s.astype(np.float64), grp, axis=0)[None]   # q / s  [B, Hq, N]
    rho = key_scale_rho(q16, k16, s, lengths)
    qt = (qs.reshape(-1, n) @ hadamard(n).T).astype(np.float32)                          # rotated, unnormalised
    mx = np.abs(qt).max(axis=1, keepdims=True)
    eq = np.floor(np.log2(mx)) + 1 - 5                    # the kernel's eq: max |q~| 2^(10 - eq) in [2^14, 2^15)
    off = (3 * np.arange(n)) % 8                          # bit offsets of 3-bit codes
    part = (qt * np.exp2(10 - eq - off[None])).astype(np.float16)
    a = np.abs(part.astype(np.float32))
    sub = float(np.mean((a < 2.0 ** -14)))
    emin = int(np.floor(np.log2(a[a > 0].min())))
    return rho, sub, emin


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    rows = []
    shape = dict(bsz=2, hq=32, kvh=8, n=128, lengths=[1000, 300])
    for mode in ("none", "random3", "random14", "calib4", "calib14"):
        for kb, vb in ((3, 3), (4, 3)):
            for seed in (0, 1):
                if mode == "none":
                    cache, q16, k16, v16, mu16, s = T._policy_case(2, 32, 8, 128, 64, shape["lengths"], kb, vb, 4,
                                                                   True, False, None, seed=seed)
                    k_in = k16
                else:
                    cache, q16, k16, v16, s = make(mode, **shape, kb=kb, vb=vb, seed=seed)
                    k_in = k16
                lengths = shape["lengths"]
                scale = 1.0 / math.sqrt(128)
                ref = T._reference(cache, q16, lengths, scale)
                budget = T._sdpa_bf16_error(q16, k_in, v16, lengths, scale)
                errs = {}
                for qlo in (0, 1):
                    pl = cache.plan(32, tune={"qlo": qlo})
                    out = cp.asnumpy(cache.run(pl, pl.workspace(), cp.asarray(q16), out_dtype="fp32"))
                    errs[qlo] = rel_err(out, ref)
                sv = s if s is not None else np.ones((8, 128), np.float32)
                rho, sub, emin = diagnostics(q16, k16, sv, 8, lengths)
                r = {"mode": mode, "bits": f"K{kb}V{vb}", "seed": seed, "err_one_part": errs[0],
                     "err_two_parts": errs[1], "sdpa_bf16": budget, "rho": rho, "qpart_subnormal_frac": sub,
                     "qpart_min_exp": emin, "one_part_ok": errs[0] <= budget, "two_parts_ok": errs[1] <= budget}
                rows.append(r)
                print(f"{mode:9s} K{kb}V{vb} seed {seed}: one part {errs[0]:.2e}  two parts {errs[1]:.2e}  "
                      f"SDPA bf16 {budget:.2e}  rho {rho:.3g}  subnormal q~ {sub:.1e} min exp {emin}", flush=True)
                with open(os.path.join(a.out, "gpu_qparts.json"), "w") as f:
                    json.dump({"shape": shape, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
