"""Codes and reconstruction for every quantizer mode, by exact threshold compares.

One concept: given a block's scale (``scale = sig * 2^exp``, from
:mod:`sim_models.scale_rules`), map each FWHT output ``y`` (integer, unit 2^u)
to a b-bit code, and a code back to its reconstruction ``yhat``. ``h = 2^(b-1)``.
No division and no rounding mode: every decision is ``a * 2^ea >= b * 2^eb``.

midtread (version-1 default; sim_models/quant.py is the specialised path)
    m = #{ j in 1..h-1 : 2|y| 2^u >= (2j - 1) scale }        c = sign(y) m
    yhat = c * scale.                        2^b - 1 levels; ties away from zero.

midrise (all 2^b levels, none at zero)
    m = #{ j in 1..h-1 : |y| 2^u >= j * scale }               c = m if y >= 0 else -1 - m
    yhat = (c + 1/2) * scale = (2c + 1) * scale / 2.
    Ties (|y| exactly on a cell edge) go away from zero; y = 0 takes c = 0 (+scale/2).

lloydmax (Gaussian Lloyd-Max levels L[0..h-1], integers / 256, sim_models/lloyd_max.py)
    m = #{ j in 1..h-1 : 2^9 |y| 2^u >= (L[j-1] + L[j]) * scale }   c as midrise
    yhat = sign * L[m] * scale / 256   (sign = + for c >= 0, m = c or -1 - c).
    Same tie and zero rules as midrise: the thresholds are the midpoints of the
    stored levels, so this is nearest-level decoding of the table itself.

asym (unsigned codes and a zero point per block, 2^b levels 0 .. Q, Q = 2^b - 1)
    lo = min(min y, 0), hi = max(max y, 0) over the block
    z = #{ j in 1..Q : 2 (-lo) 2^u >= (2j - 1) scale }        (round(-lo/scale), ties up)
    r = sign(y) #{ j in 1..Q : 2|y| 2^u >= (2j - 1) scale }   (round(y/scale), ties away)
    c = clip(z + r, 0, Q);   yhat = (c - z) * scale.
    The zero point is stored as one byte per block (values 0..Q) in a zero plane.

Codes are stored as b-bit fields (two's complement for the signed modes,
plain unsigned for asym; sim_models/pack.py).
"""

from __future__ import annotations

import numpy as np

from .lloyd_max import LEVEL_FRAC_BITS, levels, threshold_sums
from .minifloat import scale_encoding
from .params import FormatParams
from .scale_rules import block_range


def _block_scale(scales: np.ndarray, p: FormatParams):
    """(sig, exp) int64 [V, N/G] of the block scales."""
    return scale_encoding(p.scale).sig_exp(scales)


#: Integer thresholds are capped here: |y| < 2^(M-1+log2 N) <= 2^27 < 2^40.
_CAP_SHIFT = 40


def _ceil_scaled(a: np.ndarray, e: np.ndarray) -> np.ndarray:
    """ceil(a * 2^e) for int64 a in [1, 2^20), exactly; values above 2^40 may be capped
    (to a value still above every |y|)."""
    e = np.clip(e, -62, _CAP_SHIFT)
    up = np.left_shift(a, np.maximum(e, 0))
    k = np.maximum(-e, 0)
    down = (a + (np.left_shift(np.int64(1), k) - 1)) >> k
    return np.where(e >= 0, up, down)


def _count(mag: np.ndarray, u: np.ndarray, coefs, frac: int, sig, exp, block: int) -> np.ndarray:
    """#{ j : mag * 2^u >= coefs[j] * sig * 2^(exp - frac) } per lane (int64, shape of ``mag``).

    ``mag`` int64 [V, N] >= 0; ``sig``, ``exp`` int64 [V, N/G]. Computed as integer
    thresholds per block, T_j = ceil(coefs[j] * sig * 2^(exp - frac - u)), so that
    ``mag * 2^u >= coefs[j] * scale * 2^-frac``  <=>  ``mag >= T_j`` (mag is an integer);
    this is the form the RTL uses (one threshold set per block, lane compares).
    """
    v, n = mag.shape
    mb = mag.reshape(v, n // block, block)
    count = np.zeros(mb.shape, dtype=np.int64)
    e = exp - frac - u[:, None]
    for cj in coefs:
        t = _ceil_scaled(int(cj) * sig, e)
        count += mb >= t[:, :, None]
    return count.reshape(v, n)


def quantize(y: np.ndarray, u: np.ndarray, scales: np.ndarray, p: FormatParams):
    """Codes of FWHT outputs (module docstring).

    Args:
        y: int64 [V, N] FWHT output in units of 2^u.
        u: int64 [V].
        scales: uint8 [V, N/G] scale bytes of ``p.scale``.
        p: format parameters.

    Returns:
        (codes, zeros): int64 [V, N] codes (signed modes: [-2^(b-1), 2^(b-1) - 1],
        midtread [-(2^(b-1) - 1), 2^(b-1) - 1]; asym [0, 2^b - 1]), and for
        asym the uint8 [V, N/G] zero points (None otherwise).
    """
    sig, exp = _block_scale(scales, p)
    g = p.block
    h = 1 << (p.bits - 1)
    mag = np.abs(y)
    neg = y < 0
    if p.mode == "midtread":
        m = _count(mag, u, range(1, 2 * h - 1, 2), 1, sig, exp, g)
        return np.where(neg, -m, m), None
    if p.mode == "midrise":
        m = _count(mag, u, range(1, h), 0, sig, exp, g)
        return np.where(neg, -1 - m, m), None
    if p.mode == "lloydmax":
        m = _count(mag, u, threshold_sums(p.bits), LEVEL_FRAC_BITS + 1, sig, exp, g)
        return np.where(neg, -1 - m, m), None
    # asym
    q = 2 * h - 1
    lo, _ = block_range(y, p)
    odd = range(1, 2 * q, 2)
    z = _count(-lo, u, odd, 1, sig, exp, 1)            # one "lane" per block
    r = _count(mag, u, odd, 1, sig, exp, g)
    codes = np.clip(np.repeat(z, g, axis=1) + np.where(neg, -r, r), 0, q)
    return codes, z.astype(np.uint8)


def dequantize(codes: np.ndarray, scales: np.ndarray, p: FormatParams,
               zeros: np.ndarray | None = None) -> np.ndarray:
    """Reconstructed FWHT output yhat, float64 [V, N] (exact: small integer * 2^k).

    Args:
        codes: int64 [V, N] codes as returned by :func:`quantize` (asym: unsigned).
        scales: uint8 [V, N/G].
        p: format parameters.
        zeros: uint8 [V, N/G] zero points; required for asym, ignored otherwise.

    Raises:
        ValueError: asym without ``zeros``, or zeros of the wrong shape.
    """
    # byte 0x00 is +0 in every encoding: the encoder never writes it, the read path (like the
    # version-1 path, sim_models/quant.py, and the RTL) decodes it as a zero scale
    zero = scales == 0
    sig, exp = _block_scale(np.where(zero, 1, scales), p)
    sig = np.where(zero, 0, sig)
    step = np.repeat(np.ldexp(sig.astype(np.float64), exp.astype(np.int32)), p.block, axis=1)
    c = codes.astype(np.int64)
    if p.mode == "midtread":
        return c * step
    if p.mode == "midrise":
        return (2 * c + 1) * step / 2
    if p.mode == "lloydmax":
        m = np.where(c < 0, -1 - c, c)
        lv = levels(p.bits)[m]
        return np.where(c < 0, -lv, lv) * step / (1 << LEVEL_FRAC_BITS)
    if zeros is None:
        raise ValueError("zeros (the zero-point plane) is required for mode 'asym'")
    if zeros.shape != scales.shape:
        raise ValueError(f"zeros must have the scale plane's shape {list(scales.shape)}, "
                         f"got {list(zeros.shape)}")
    z = np.repeat(zeros.astype(np.int64), p.block, axis=1)
    return (c - z) * step
