"""Codes and reconstruction for every quantizer mode (docs/FORMAT.md 3.6 and 3.7).

:func:`quantize` maps each FWHT output ``y`` (int64, unit 2^u) to a b-bit code given
its block's scale byte, by exact threshold compares (no division, no rounding mode);
:func:`dequantize` maps codes back to ``yhat``. :func:`threshold_coefs` is the table of
threshold coefficients per mode, shared with the RTL (``hw.quantizer``).
"""

from __future__ import annotations

import numpy as np

from .exact import ge_scaled
from .lloyd_max import LEVEL_FRAC_BITS, levels, threshold_sums
from .minifloat import scale_encoding
from .params import QUANT_MODES, FormatParams
from .scale import block_range


def threshold_coefs(mode: str, bits: int) -> tuple[tuple[int, ...], int]:
    """(coefs, frac): lane threshold j of ``mode`` is ``|y| 2^u 2^frac >= coefs[j] * scale``.

    midtread: 2j-1, frac 1, j = 1..h-1; midrise: j, frac 0; lloydmax: L[j-1] + L[j],
    frac 9; asym: 2j-1, frac 1, j = 1..2h-1 (also the zero point's thresholds);
    h = 2^(bits-1) (docs/FORMAT.md 3.7).

    Raises:
        ValueError: unknown ``mode`` (the message names the field).
    """
    h = 1 << (bits - 1)
    if mode == "midtread":
        return tuple(range(1, 2 * h - 1, 2)), 1
    if mode == "midrise":
        return tuple(range(1, h)), 0
    if mode == "lloydmax":
        return tuple(int(v) for v in threshold_sums(bits)), LEVEL_FRAC_BITS + 1
    if mode == "asym":
        return tuple(range(1, 2 * (2 * h - 1), 2)), 1
    raise ValueError(f"mode must be one of {QUANT_MODES}, got {mode!r}")


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
    """Codes of FWHT outputs (docs/FORMAT.md 3.6).

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
    coefs, frac = threshold_coefs(p.mode, p.bits)
    mag = np.abs(y)
    neg = y < 0
    if p.mode == "asym":
        q = (1 << p.bits) - 1
        lo, _ = block_range(y, p)
        z = _count(-lo, u, coefs, frac, sig, exp, 1)        # one "lane" per block
        r = _count(mag, u, coefs, frac, sig, exp, g)
        codes = np.clip(np.repeat(z, g, axis=1) + np.where(neg, -r, r), 0, q)
        return codes, z.astype(np.uint8)
    m = _count(mag, u, coefs, frac, sig, exp, g)
    if p.mode == "midtread":
        return np.where(neg, -m, m), None
    return np.where(neg, -1 - m, m), None       # midrise, lloydmax


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
    # byte 0x00 is +0 in every encoding: the encoder never writes it, the read path (and the
    # RTL) decodes it as a zero scale
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


def threshold_ties(y: np.ndarray, u: np.ndarray, scales: np.ndarray, p: FormatParams):
    """Lanes (and asym zero points) exactly on a code threshold (docs/FORMAT.md 3.7).

    Args:
        y, u, scales, p: as :func:`quantize`.

    Returns:
        (lanes, zeros): ``lanes`` int64 [V, N], the threshold index j (1-based) that
        ``|y| 2^u 2^frac == coefs[j-1] * scale`` holds for, 0 where none; ``zeros``
        (asym) int64 [V, N/G], the same for the zero point's magnitude ``-lo``, else None.
    """
    sig, exp = _block_scale(scales, p)
    coefs, frac = threshold_coefs(p.mode, p.bits)
    table = np.array((0,) + tuple(int(c) for c in coefs), dtype=np.int64)

    def on(mag, width):
        """int64: 1-based index of the threshold ``mag`` sits on, 0 if none. Only the
        highest threshold met (the count m) can hold with equality."""
        m = _count(mag, u, coefs, frac, sig, exp, width)
        v, n = mag.shape
        mb = (mag << frac).reshape(v, n // width, width)
        t = table[m].reshape(mb.shape) * sig[:, :, None]
        e = np.broadcast_to(exp[:, :, None], mb.shape)
        ub = np.broadcast_to(u[:, None, None], mb.shape)
        eq = (m.reshape(mb.shape) > 0) & ge_scaled(mb, ub, t, e) & ge_scaled(t, e, mb, ub)
        return np.where(eq, m.reshape(mb.shape), 0).reshape(mag.shape)

    lanes = on(np.abs(y), p.block)
    zeros = None
    if p.mode == "asym":
        lo, _ = block_range(y, p)
        zeros = on(-lo, 1)
    return lanes, zeros
