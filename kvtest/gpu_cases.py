"""GPU test cases shared by tests/test_gpu*.py and bench/gpu/kernels.py.

The quantizers the kernels implement (:data:`QUANTIZERS`, the presets first),
decode-attention cases (:func:`make_case`; needs CuPy and a device), the float64
attention reference (:func:`attention64`), the error measure (:func:`rel_err`) and the conditioning of
key scales (:func:`key_scale_rho`).
"""

from __future__ import annotations

import numpy as np

import gpu_ref
from sim_models import CachePolicy, FormatParams
from sim_models.params import PRESETS

#: the four quantizers the kernels implement, (mode, scale_round): the "v1" and "v2" presets, then
#: the other two combinations; never relying on what FormatParams() defaults to
QUANTIZERS = [(PRESETS[v]["mode"], PRESETS[v]["scale_round"]) for v in ("v1", "v2")] + [
    ("midtread", "nearest"), ("midrise", "up")]
QUANT_IDS = [f"{m}-{r}" for m, r in QUANTIZERS]


def qparams(mode: str, scale_round: str, **kw) -> FormatParams:
    return FormatParams(mode=mode, scale_round=scale_round, scale="ue5m3", scale_rule="max", **kw)


def attention64(q, k, v, lengths, scale):
    """float64 reference: q [B, Hq, N], k/v [B, KVH, T, N] -> [B, Hq, N]."""
    bsz, hq, n = q.shape
    kvh = k.shape[1]
    grp = hq // kvh
    out = np.zeros((bsz, hq, n))
    for b in range(bsz):
        L = int(lengths[b])
        if L == 0:
            continue
        for h in range(hq):
            kk, vv = k[b, h // grp, :L], v[b, h // grp, :L]
            s = kk @ q[b, h] * scale
            w = np.exp(s - s.max())
            out[b, h] = (w / w.sum()) @ vv
    return out


def rel_err(a, b):
    """||a - b|| / ||b|| (Frobenius; b == 0 counts as 1e-300)."""
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def key_scale_rho(q16, k16, s, lengths) -> float:
    """rms(|q / s| |k s|) / rms(sqrt(N) |q * k|) over (query head, token), ``q * k`` the channel products.

    The factor by which per-channel key scales s grow one fp16 q~ part's error (isotropic over the channels
    after the rotation: ~2^-12 |q / s| |k s| / sqrt(N) per logit) relative to SDPA bf16's (~2^-9 |q * k|);
    1 for balanced channels without scales or with calibrated ones. q16 [B, Hq, N], k16 [B, T, KVH, N]
    (unscaled keys), s [KVH, N] or None.
    """
    bsz, hq, n = q16.shape
    kvh = k16.shape[2]
    grp = hq // kvh
    sv = np.ones((kvh, n)) if s is None else np.asarray(s, np.float64)
    q = q16.astype(np.float64)
    num = den = 0.0
    for b in range(bsz):
        kk = k16[b, :int(lengths[b])].astype(np.float64)                      # [L, KVH, N]
        for h in range(hq):
            g = h // grp
            num += np.sum((np.linalg.norm(q[b, h] / sv[g]) * np.linalg.norm(kk[:, g] * sv[g], axis=1)) ** 2)
            den += n * np.sum((q[b, h][None] * kk[:, g]) ** 2)
    return float(np.sqrt(num / den)) if den > 0 else 1.0


def make_case(bsz, hq, kvh, n, g, lengths, dtype="fp16", seed=0, quant=QUANTIZERS[0]):
    """A decode-attention case: (params, a filled ``gpu_ref.KVCache``, query bits uint16
    [B, Hq, N], and float64 q [B, Hq, N], k, v [B, KVH, T, N]) with per-token magnitudes
    spread over ~3 decades; ``lengths[b]`` tokens count in sequence b."""
    import cupy as cp

    p = qparams(*quant, n=n, block=g, dtype=dtype)
    rng = np.random.default_rng(seed)
    t = int(max(lengths))
    cache = gpu_ref.KVCache(bsz, kvh, max(t, 1), CachePolicy(k=p, v=p))
    # per-token magnitudes spread over ~3 decades so that scales differ between tokens
    kf = rng.standard_normal((bsz, t, kvh, n)) * np.exp(rng.normal(0, 0.8, (bsz, t, kvh, 1)))
    vf = rng.standard_normal((bsz, t, kvh, n)) * np.exp(rng.normal(0, 0.8, (bsz, t, kvh, 1)))
    qf = rng.standard_normal((bsz, hq, n)) * 1.5

    def bits(a):
        if dtype == "fp16":
            return a.astype(np.float16).view(np.uint16)
        return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)

    def back(bb):
        if dtype == "fp16":
            return bb.view(np.float16).astype(np.float64)
        return (bb.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    kb, vb, qb = bits(kf), bits(vf), bits(qf)
    if t:
        cache.append(cp.asarray(kb), cp.asarray(vb))
    # a sequence shorter than t: only its first lengths[b] tokens count
    cache.host_lengths[:] = np.asarray(lengths)
    return p, cache, qb, back(qb), back(kb).transpose(0, 2, 1, 3), back(vb).transpose(0, 2, 1, 3)
