"""Version-1 block quantizer (mode midtread, scale rounded up), docs/FORMAT.md 3.5-3.6 and A.1.

The specialised, fast path for ``FormatParams.is_v1_quantizer``; every other
quantizer (the version-2 default included) is sim_models/scale_rules.py +
sim_models/quant_modes.py.

Mode ``midtread`` (the published symmetric formula): per block of G lanes of
the FWHT output y (integers, one unit = 2^u), with qmax = 2^(b-1) - 1,

    scale  s = smallest ue5m3 byte with qmax * scale(s) >= max|y| * 2^u
    code   c = sign(y) * #{ j in 1..qmax : 2|y| * 2^u >= (2j - 1) * scale(s) }

i.e. c = clip(round(y / scale), -qmax, qmax) with ties rounded away from zero,
computed only by exact integer compares against thresholds (no division).
The first rule guarantees |y| / scale <= qmax, so codes never need clipping
except when the scale saturates (FLAG_SAT).
"""

from __future__ import annotations

import numpy as np

from .params import FormatParams
from .scale import ge_pow2, scale_sig_exp, smallest_scale_at_least


def block_max(y: np.ndarray, p: FormatParams) -> np.ndarray:
    """max |y| per block: int64 [V, N] -> int64 [V, N/G]."""
    return np.abs(y).reshape(y.shape[0], p.n_blocks, p.block).max(axis=2)


def choose_scales(y: np.ndarray, u: np.ndarray, p: FormatParams):
    """Scale bytes per block.

    Args:
        y: int64 [V, N], FWHT output in units of 2^u.
        u: int64 [V], unit exponent per vector.
        p: format parameters.

    Returns:
        (scales, sat): uint8 [V, N/G] and bool [V] (some block saturated).
    """
    amax = block_max(y, p)
    s, sat = smallest_scale_at_least(p.qmax, amax, u[:, None])
    return s, sat.any(axis=1)


def quantize_codes(y: np.ndarray, u: np.ndarray, scales: np.ndarray, p: FormatParams) -> np.ndarray:
    """Codes by threshold compares.

    Args:
        y: int64 [V, N]; u: int64 [V]; scales: uint8 [V, N/G]; p: parameters.

    Returns:
        int64 [V, N], codes in [-qmax, qmax].
    """
    sig, exp = scale_sig_exp(scales)
    sig = np.repeat(sig, p.block, axis=1)
    exp = np.repeat(exp, p.block, axis=1)
    mag2 = 2 * np.abs(y)
    count = np.zeros(y.shape, dtype=np.int64)
    for j in range(1, p.qmax + 1):
        count += ge_pow2(mag2, u[:, None], (2 * j - 1) * sig, exp)
    return np.where(y < 0, -count, count)


def dequantize(codes: np.ndarray, scales: np.ndarray, p: FormatParams) -> np.ndarray:
    """Reconstructed FWHT output: code * scale, float64 [V, N] (exact)."""
    sig, exp = scale_sig_exp(scales)
    step = np.ldexp(sig.astype(np.float64), exp.astype(np.int32))
    return codes.astype(np.float64) * np.repeat(step, p.block, axis=1)
