"""The 8-bit block scale: unsigned E5M3 float ("ue5m3"), docs/FORMAT.md 3.5.

Byte ``s = e << 3 | m`` (e: 5-bit exponent field, m: 3-bit mantissa field),
no sign bit (scales are never negative). Value, exactly:

    sig(s) * 2^exp(s),  sig = m if e == 0 else 8 + m,  exp = max(e, 1) - 7 - 3

i.e. bias 7, subnormals for e == 0, no inf/NaN encodings. Byte values order
like the scales they encode (monotone), so "the smallest scale >= t" is a
search over bytes. Range: 2^-9 (byte 0x01) .. 1.875 * 2^24 (byte 0xFF); byte
0x00 (scale 0) is never written by the encoder.
"""

from __future__ import annotations

import numpy as np

SCALE_BIAS = 7
SCALE_MANT_BITS = 3
SCALE_MIN_BYTE = 1
SCALE_MAX_BYTE = 255
#: Largest shift that :func:`ge_pow2` ever applies (operands are < 2^31).
_SHIFT_CLAMP = 32


def scale_sig_exp(s: np.ndarray):
    """Integer significand and power-of-two exponent of scale bytes.

    Args:
        s: integer array of scale bytes (0..255).

    Returns:
        (sig, exp): int64 arrays with scale value = sig * 2^exp exactly.
    """
    s = np.asarray(s).astype(np.int64)
    e = s >> SCALE_MANT_BITS
    m = s & ((1 << SCALE_MANT_BITS) - 1)
    sig = np.where(e == 0, m, m + (1 << SCALE_MANT_BITS))
    exp = np.maximum(e, 1) - SCALE_BIAS - SCALE_MANT_BITS
    return sig, exp


def scale_value(s: np.ndarray) -> np.ndarray:
    """Scale bytes -> float64 scale values (exact)."""
    sig, exp = scale_sig_exp(s)
    return np.ldexp(sig.astype(np.float64), exp.astype(np.int32))


def ge_pow2(a: np.ndarray, ea: np.ndarray, b: np.ndarray, eb: np.ndarray) -> np.ndarray:
    """Exact compare ``a * 2^ea >= b * 2^eb`` for integers 0 <= a, b < 2^31.

    The difference of exponents is clamped to +-32, which leaves every result
    unchanged for operands below 2^31 (the larger side already wins).
    """
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if a.size and (a.max() >= 2**31 or b.max() >= 2**31 or a.min() < 0 or b.min() < 0):
        raise OverflowError("ge_pow2 operands must be in [0, 2^31)")
    d = np.clip(np.asarray(ea, dtype=np.int64) - np.asarray(eb, dtype=np.int64),
                -_SHIFT_CLAMP, _SHIFT_CLAMP)
    return np.left_shift(a, np.maximum(d, 0)) >= np.left_shift(b, np.maximum(-d, 0))


def smallest_scale_at_least(coef: np.ndarray, amax: np.ndarray, u: np.ndarray):
    """Smallest scale byte s with ``coef * scale(s) >= amax * 2^u`` (binary search).

    Args:
        coef: int, the scale multiplier (qmax for the mid-tread quantizer).
        amax: int64 array, non-negative block maxima in mantissa units.
        u: int64 array broadcastable to ``amax``, exponent of one unit.

    Returns:
        (s, sat): uint8 scale bytes in [1, 255] and a bool array, True where
        even byte 255 is too small (then s = 255).
    """
    amax = np.asarray(amax, dtype=np.int64)
    u = np.broadcast_to(np.asarray(u, dtype=np.int64), amax.shape)
    lo = np.full(amax.shape, SCALE_MIN_BYTE, dtype=np.int64)   # candidate answer
    hi = np.full(amax.shape, SCALE_MAX_BYTE + 1, dtype=np.int64)  # 256 = "none fits"
    while np.any(lo < hi):
        mid = (lo + hi) >> 1
        sig, exp = scale_sig_exp(np.minimum(mid, SCALE_MAX_BYTE))
        ok = ge_pow2(coef * sig, exp, amax, u) & (mid <= SCALE_MAX_BYTE)
        active = lo < hi
        hi = np.where(active & ok, mid, hi)
        lo = np.where(active & ~ok, mid + 1, lo)
    sat = lo > SCALE_MAX_BYTE
    return np.minimum(lo, SCALE_MAX_BYTE).astype(np.uint8), sat
