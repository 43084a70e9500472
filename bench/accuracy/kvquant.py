"""Fake quantization of cached K/V for the accuracy study: golden-model formats and float baselines.

A quantizer is a :class:`sim_models.FormatParams` (through the golden model:
``encode`` -> ``decode_float``), a :class:`Baseline` (float reference quantizers the
format is compared with), a :class:`bench.accuracy.peers.Peer` (other projects' formats) or
``None`` (fp16: the value rounded to fp16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim_models import FormatParams, decode_float, encode
from sim_models.codec import as_bits, encode_trace, encoded
from sim_models.minifloat import scale_encoding
from sim_models.quant import dequantize
from sim_models.keytables import LOG2_S_MAX, qaware_log2_scales
from sim_models.signs import sign_mask

from .peers import Peer


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


@dataclass(frozen=True)
class IPScaled:
    """The format ``p`` with an inner-product-preserving block scale (the rule of vLLM's
    Octave format, bench.accuracy.peers.octave_block_quantize, applied within this format):
    the golden model's codes are kept, and each block's scale byte is re-chosen as the byte
    nearest to the scale s with ``y . y_hat(s) = |y|^2`` (y: the block's FWHT output, y_hat
    its reconstruction). The stored bytes are ordinary format bytes (the read path is
    unchanged); only the encoder's choice of scale byte differs."""

    p: FormatParams

    def __post_init__(self):
        if not isinstance(self.p, FormatParams):
            raise TypeError(f"IPScaled.p must be a FormatParams, got {type(self.p).__name__}")
        if self.p.mode == "asym":
            raise ValueError("IPScaled: mode 'asym' has a zero point, the inner-product "
                             "scale is defined for the symmetric modes")

    @property
    def bits_per_element(self) -> float:
        return self.p.bits_per_element


def ip_scale_bytes(y: np.ndarray, yhat: np.ndarray, scales: np.ndarray, p: FormatParams):
    """Scale bytes uint8 [V, N/G] with ``y . y_hat = |y|^2`` per block, rounded to the nearest
    byte of ``p.scale`` (``y``, ``yhat``: float64 [V, N] FWHT output and its reconstruction
    with the bytes ``scales``; a block with ``y . y_hat <= 0`` keeps its byte)."""
    enc = scale_encoding(p.scale)
    vals = enc.values()
    g = p.block
    yb = y.reshape(len(y), -1, g)
    hb = yhat.reshape(len(y), -1, g)
    num = (yb * yb).sum(axis=2)
    den = (yb * hb).sum(axis=2)
    idx = enc.index_of(np.where(scales == 0, enc.bytes[0], scales))
    target = np.where(den > 0, vals[idx] * num / np.where(den > 0, den, 1.0), vals[idx])
    hi = np.clip(np.searchsorted(vals, target), 1, len(vals) - 1)
    near = np.where(target - vals[hi - 1] <= vals[hi] - target, hi - 1, hi)
    return np.where((den > 0) & (scales != 0), enc.bytes[near], scales).astype(np.uint8)


def ip_roundtrip(x16: np.ndarray, q: IPScaled, t=None) -> np.ndarray:
    """float16 [..., D] -> golden encode, scale bytes re-chosen by :func:`ip_scale_bytes`
    -> golden decode_float -> float32 (``t`` as :func:`golden_roundtrip`)."""
    p = q.p
    shape = x16.shape
    tr = encode_trace(as_bits(x16.reshape(-1, p.n), p), p, t)
    y = np.ldexp(tr.y.astype(np.float64), tr.u[:, None].astype(np.int32))
    yhat = dequantize(tr.codes, tr.scales, p, tr.zeros)
    tr.scales = ip_scale_bytes(y, yhat, tr.scales, p)
    e = encoded(tr, p)
    return decode_float(e.codes, e.scales, p, e.zeros, t).astype(np.float32).reshape(shape)


Quantizer = FormatParams | IPScaled | Baseline | Peer | None


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


def golden_roundtrip(x16: np.ndarray, p: FormatParams, t=None) -> np.ndarray:
    """float16 [..., D] (D a multiple of p.n) -> golden encode -> decode_float -> float32
    (``t``: a sim_models.HeadTransform for every vector, D == p.n)."""
    shape = x16.shape
    e = encode(x16.reshape(-1, p.n), p, t)
    return decode_float(e.codes, e.scales, p, e.zeros, t).astype(np.float32).reshape(shape)


def roundtrip(x: np.ndarray, q: Quantizer, transforms=None) -> np.ndarray:
    """Fake-quantize float32 [B, H, T, D] or [..., D] (already in the stored domain, e.g.
    centered). ``transforms``: one sim_models.HeadTransform per head (axis 1), formats only."""
    if q is None:
        return x.astype(np.float16).astype(np.float32)
    if isinstance(q, Baseline):
        return baseline_roundtrip(x, q)
    if isinstance(q, Peer):
        return q.roundtrip(x)
    x16 = x.astype(np.float16)
    rt = ip_roundtrip if isinstance(q, IPScaled) else golden_roundtrip
    if transforms is None:
        return rt(x16, q)
    n = q.p.n if isinstance(q, IPScaled) else q.n
    if n != x.shape[-1]:
        raise ValueError(f"per-head transforms need n = head_dim = {x.shape[-1]}, got n={n}")
    return np.stack([rt(np.ascontiguousarray(x16[:, h]), q, t)
                     for h, t in enumerate(transforms)], axis=1)


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
        e = qaware_log2_scales(calib["k_energy"], calib["q_energy"])
        return np.exp2(e.astype(np.float64)).astype(np.float32)
    raise ValueError(f"unknown reparam kind {reparam['kind']!r}")


#: Largest |log2| of a calibrated key scale (the format's calibration rule).
KEY_SCALE_LOG2_MAX = LOG2_S_MAX


def calibrated_key_scales(kind: str, calib: dict) -> np.ndarray:
    """Per-channel key scales s, float16 [L, H, D], for sim_models.scale_keys (keys stored
    as k * s, queries q / s).

    ``qaware-*``: s_i ~ (E q_i^2 / E (k_i - mu_i)^2)^(1/4), the format's rule
    (:func:`sim_models.keytables.qaware_log2_scales`); ``keyonly-*``: s_i ~ (E (k_i -
    mu_i)^2)^(-1/2) (equal key channel RMS, the query ignored). ``-pow2``: rounded to powers
    of two (exact scaling); ``-fp16``: fp16 values. Normalized to geometric mean 1 per
    (layer, kv head), |log2 s| <= KEY_SCALE_LOG2_MAX.

    Raises:
        ValueError: unknown kind.
    """
    rule, _, rnd = kind.partition("-")
    if rule not in ("qaware", "keyonly") or rnd not in ("pow2", "fp16"):
        raise ValueError(f"key_scale must be qaware-pow2, qaware-fp16 or keyonly-pow2, got {kind!r}")
    if rule == "qaware":
        e = qaware_log2_scales(calib["k_energy"], calib["q_energy"], rounded=rnd == "pow2")
        return np.exp2(e.astype(np.float64)).astype(np.float16)
    e = -0.5 * np.log2(np.maximum(calib["k_energy"], 1e-12))
    e = e - e.mean(axis=-1, keepdims=True)
    if rnd == "pow2":
        e = np.round(e)
    e = np.clip(e, -KEY_SCALE_LOG2_MAX, KEY_SCALE_LOG2_MAX)
    return np.exp2(e).astype(np.float16)


#: Candidates per (layer, kv head) of the sign and rotation selection (the first is the
#: format's own: seed-0 signs, B = I, so the selection is never worse on calibration).
SELECT_CANDIDATES = 12
#: Calibration keys per (layer, kv head) the selection loss is measured on.
SELECT_KEYS = 512


def selection_loss(k16: np.ndarray, cq: np.ndarray, p: FormatParams, t) -> float:
    """E_t dk_t^T C dk_t = E (q . dk)^2: logit error of the keys k16 (float16 [T, D], the
    stored domain) quantized by ``p`` with transform ``t``, for queries of second moment
    ``cq`` [D, D] (in the same domain)."""
    e = encode(k16, p, t)
    dk = decode_float(e.codes, e.scales, p, e.zeros, t) - k16.astype(np.float64)
    return float(np.einsum("td,de,te->", dk, cq, dk) / len(dk))


def select_head_transform(job) -> tuple:
    """Best-of-K sign mask, then best-of-K 4x4 rotations given it, for one (layer, kv head).

    ``job`` = (k16 [T, D] stored-domain keys, cq [D, D] query second moment in that domain,
    FormatParams, seed). Returns (signs uint8 [D], rot int16 [D/4, 4, 4], losses dict).
    """
    from sim_models import HeadTransform, sign_mask
    from sim_models.transform import fixed_rotation, identity_rotation, random_rotations
    k16, cq, p, seed = job
    d = p.n
    best = None
    for c in range(SELECT_CANDIDATES):
        t = HeadTransform(signs=sign_mask(d, c))
        loss = selection_loss(k16, cq, p, t)
        if best is None or loss < best[0]:
            best = (loss, t.signs)
    loss0 = selection_loss(k16, cq, p, None)
    signs = best[1]
    rng = np.random.default_rng(seed)
    rbest = (best[0], identity_rotation(d))
    for _ in range(SELECT_CANDIDATES - 1):
        r = fixed_rotation(random_rotations(d // 4, rng))
        loss = selection_loss(k16, cq, p, HeadTransform(signs=signs, rot=r))
        if loss < rbest[0]:
            rbest = (loss, r)
    return signs, rbest[1], {"default": loss0, "signs": best[0], "signs_rot": rbest[0]}
