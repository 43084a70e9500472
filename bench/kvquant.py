"""Fake quantization of cached K/V for the accuracy study: golden-model formats and float baselines.

A quantizer is a :class:`sim_models.FormatParams` (through the golden model:
``encode`` -> ``decode_float``), a :class:`Baseline` (float reference quantizers the
format is compared with) or ``None`` (fp16: the value rounded to fp16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim_models import FormatParams, decode_float, encode
from sim_models.signs import sign_mask


@dataclass(frozen=True)
class Baseline:
    """Naive asymmetric INT-``bits`` per vector (token-head): fp16 scale and fp16 minimum
    stored with it (bits + 32 / head_dim per element). With ``rotate``, the vector is
    quantized after the orthonormal rotation D*H (D = the golden model's sign flip, seed 0)
    and rotated back."""

    bits: int
    rotate: bool = False

    def __post_init__(self):
        if not 1 <= self.bits <= 8:
            raise ValueError(f"bits must be in 1..8, got {self.bits}")

    def bits_per_element(self, head_dim: int) -> float:
        return self.bits + 32.0 / head_dim


Quantizer = FormatParams | Baseline | None


def _hadamard_orth(d: int) -> np.ndarray:
    h = np.array([[1.0]])
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(d)


def baseline_roundtrip(x: np.ndarray, b: Baseline) -> np.ndarray:
    """float32 [..., D] -> its :class:`Baseline` reconstruction, float32 [..., D]."""
    d = x.shape[-1]
    if b.rotate:
        sgn = np.where(sign_mask(d, 0) == 1, -1.0, 1.0)
        h = _hadamard_orth(d)
        x = (x.astype(np.float64) * sgn) @ h
    lo = x.min(axis=-1, keepdims=True).astype(np.float16).astype(np.float64)
    hi = x.max(axis=-1, keepdims=True)
    q = (1 << b.bits) - 1
    scale = ((hi - lo) / q).astype(np.float16).astype(np.float64)
    scale = np.where(scale > 0, scale, 1.0)
    c = np.clip(np.round((x - lo) / scale), 0, q)
    xh = c * scale + lo
    if b.rotate:
        xh = (xh @ h) * sgn
    return xh.astype(np.float32)


def golden_roundtrip(x16: np.ndarray, p: FormatParams) -> np.ndarray:
    """float16 [..., D] (D a multiple of p.n) -> golden encode -> decode_float -> float32."""
    shape = x16.shape
    e = encode(x16.reshape(-1, p.n), p)
    return decode_float(e.codes, e.scales, p, e.zeros).astype(np.float32).reshape(shape)


def roundtrip(x: np.ndarray, q: Quantizer) -> np.ndarray:
    """Fake-quantize float32 [..., D] (already in the stored domain, e.g. centered)."""
    if q is None:
        return x.astype(np.float16).astype(np.float32)
    if isinstance(q, Baseline):
        return baseline_roundtrip(x, q)
    return golden_roundtrip(x.astype(np.float16), q)


def bits_per_element(q: Quantizer, head_dim: int) -> float:
    if q is None:
        return 16.0
    if isinstance(q, Baseline):
        return q.bits_per_element(head_dim)
    return q.bits_per_element


def key_scales(reparam: dict | None, calib: dict) -> np.ndarray | None:
    """Per-channel power-of-two key scales s, float32 [L, H, D], of the exact
    reparametrization q.k = (q / s).(k * s), or None.

    ``{"kind": "outlier", "gain": g, "top": t}``: the t channels of largest |mu| of every
    (layer, kv head) times g: an outlier-heavy model with identical fp16 outputs.
    ``{"kind": "qaware"}``: s_i = (E q_i^2 / E (k_i - mu_i)^2)^(1/4) rounded to a power of
    two (geometric mean 1, |log2 s| <= 4), which minimises E (q . dk)^2 for a rotation-
    isotropic key error dk.

    Raises:
        ValueError: unknown kind.
    """
    if not reparam:
        return None
    mu = calib["mu"].astype(np.float32)
    if reparam["kind"] == "outlier":
        s = np.ones_like(mu)
        top = np.argsort(-np.abs(mu), axis=-1)[..., :reparam["top"]]
        np.put_along_axis(s, top, float(reparam["gain"]), axis=-1)
        return s
    if reparam["kind"] == "qaware":
        hq, h = calib["q_energy"].shape[1], mu.shape[1]
        b = calib["q_energy"].reshape(mu.shape[0], h, hq // h, -1).mean(axis=2)
        a = np.maximum(calib["k_energy"], 1e-12)
        e = 0.25 * np.log2(np.maximum(b, 1e-12) / a)
        e = np.clip(np.round(e - e.mean(axis=-1, keepdims=True)), -4, 4)
        return np.exp2(e).astype(np.float32)
    raise ValueError(f"unknown reparam kind {reparam['kind']!r}")
