"""Front end: fp16/bf16 bit patterns -> signed block-floating-point integers.

docs/FORMAT.md sections 3.1 (special values), 3.2 (sign flip) and 3.3 (block
floating point). All arithmetic is exact integer arithmetic on int64.
"""

from __future__ import annotations

import numpy as np

from .params import FormatParams

#: Per-vector status flags (bit positions in the flags byte).
FLAG_NAN = 1 << 0  # a NaN lane was read as +0
FLAG_INF = 1 << 1  # an infinite lane was read as the largest finite value
FLAG_SAT = 1 << 2  # a block needed a scale above the largest scale byte; codes clipped


def decode_bits(bits: np.ndarray, p: FormatParams):
    """Split raw input bit patterns into sign, exponent and integer significand.

    Special values (FORMAT.md 3.1): NaN -> +0 and FLAG_NAN; +-inf -> +-(largest
    finite) and FLAG_INF; subnormals and +-0 are exact (exponent field 0 is read
    as exponent 1 with no hidden bit).

    Args:
        bits: uint16 array [V, N] of fp16 or bf16 bit patterns (per ``p.dtype``).
        p: format parameters.

    Returns:
        (sign, exp, sig, flags): ``sign`` int64 [V, N] in {0, 1}; ``exp`` int64
        [V, N], the biased exponent with subnormals/zero mapped to 1; ``sig``
        int64 [V, N], the integer significand (hidden bit included), so the lane
        value is (-1)^sign * sig * 2^(exp - bias - mantissa_bits); ``flags``
        uint8 [V].
    """
    e_bits, m_bits, _ = p.in_format
    b = bits.astype(np.int64)
    sign = (b >> 15) & 1
    exp = (b >> m_bits) & ((1 << e_bits) - 1)
    frac = b & ((1 << m_bits) - 1)
    e_special = (1 << e_bits) - 1
    is_nan = (exp == e_special) & (frac != 0)
    is_inf = (exp == e_special) & (frac == 0)
    # NaN -> +0
    sign = np.where(is_nan, 0, sign)
    frac = np.where(is_nan, 0, frac)
    exp = np.where(is_nan, 0, exp)
    # +-inf -> +-(largest finite)
    exp = np.where(is_inf, e_special - 1, exp)
    frac = np.where(is_inf, (1 << m_bits) - 1, frac)
    sig = np.where(exp == 0, frac, frac | (1 << m_bits))
    exp = np.maximum(exp, 1)
    flags = (np.where(is_nan.any(axis=1), FLAG_NAN, 0)
             | np.where(is_inf.any(axis=1), FLAG_INF, 0)).astype(np.uint8)
    return sign, exp, sig, flags


def round_shift_right(mag: np.ndarray, sh: np.ndarray) -> np.ndarray:
    """Shift non-negative integers right by ``sh`` (>= 0), rounding half away from zero.

    ``(mag + 2^(sh-1)) >> sh`` for sh > 0, ``mag`` for sh == 0; exact on int64
    for mag < 2^62. Shifts of 63 or more give 0 for mag < 2^62.
    """
    sh = np.minimum(sh, 63)
    half = np.where(sh > 0, np.left_shift(np.int64(1), np.maximum(sh - 1, 0)), 0)
    return np.right_shift(mag + half, sh)


def to_block_fp(bits: np.ndarray, p: FormatParams, mask: np.ndarray):
    """Sign flip D and conversion to block floating point (FORMAT.md 3.2-3.3).

    One shared exponent per vector: ``emax`` = largest (subnormal-adjusted)
    exponent of the vector's lanes. Each lane's significand is aligned to it
    with a right shift of ``emax - exp - (M - 2 - mantissa_bits)`` (a negative
    shift is an exact left shift), rounded half away from zero, and clamped to
    the M-bit signed range [-(2^(M-1)-1), 2^(M-1)-1].

    Args:
        bits: uint16 array [V, N] of input bit patterns.
        p: format parameters.
        mask: uint8 [N] sign-flip mask (1 = negate), from :func:`signs.sign_mask`.

    Returns:
        (x, u, flags): ``x`` int64 [V, N], the signed mantissas; ``u`` int64 [V],
        the exponent of one mantissa unit, so lane value ~= x * 2^u (exactly,
        when nothing was rounded); ``flags`` uint8 [V].
    """
    _, m_bits, bias = p.in_format
    sign, exp, sig, flags = decode_bits(bits, p)
    emax = exp.max(axis=1)
    sh = emax[:, None] - exp - (p.mant_bits - 2 - m_bits)
    left = np.left_shift(sig, np.maximum(-sh, 0))
    mag = np.where(sh <= 0, left, round_shift_right(sig, np.maximum(sh, 0)))
    mag = np.minimum(mag, (1 << (p.mant_bits - 1)) - 1)
    neg = sign ^ mask.astype(np.int64)[None, :]
    x = np.where(neg == 1, -mag, mag)
    u = emax - bias - p.mant_bits + 2
    return x, u, flags
