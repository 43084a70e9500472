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


def align(sig: np.ndarray, sh: np.ndarray) -> np.ndarray:
    """FORMAT.md 3.3's alignment of significands ``sig`` (>= 0) by ``sh``: an exact left
    shift by ``-sh`` where sh <= 0, else :func:`round_shift_right` (half away from zero)."""
    left = np.left_shift(sig, np.maximum(-sh, 0))
    return np.where(sh <= 0, left, round_shift_right(sig, np.maximum(sh, 0)))


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
    mag = align(sig, emax[:, None] - exp - (p.mant_bits - 2 - m_bits))
    mag = np.minimum(mag, (1 << (p.mant_bits - 1)) - 1)
    neg = sign ^ mask.astype(np.int64)[None, :]
    x = np.where(neg == 1, -mag, mag)
    u = emax - bias - p.mant_bits + 2
    return x, u, flags


def to_block_fp_keys(bits: np.ndarray, mu_s: np.ndarray, log2_s: np.ndarray, p: FormatParams,
                     mask: np.ndarray):
    """Folded key front end (FORMAT.md 8): the key scale and centering inside block floating point.

    The rule of keys encoded with a key front end, in place of 3.3 (format version 4; version 3
    encoded ``to_block_fp(key_front(k, mu_s, e))``, two fp16 roundings per lane): no fp16 rounding
    per lane, one exponent add, one more aligner (for mu_s) and one subtraction per lane. Per
    vector, fp16 keys:

    1. ``k`` decoded as FORMAT.md 3.1 (:func:`decode_bits`): sign s, exponent E (1 for
       zero and subnormals), significand sig. NaN and +-inf lanes pass the front end
       unchanged (+0 and +-65504 with their flags): they take ``e = 0`` and ``mu = +0``.
    2. scaled exponent ``Ex = E + e`` (exact); ``Ex > 30`` (``|k 2^e| >= 2^16``) saturates
       the lane to +-65504 (sig 2047, Ex 30), as RN16 does, so the exponents and the unit u
       keep the range of version 3. ``mu_s`` decoded the same way: sm, Em, m.
    3. ``emax = max over lanes of max(Ex, Em)``, plus 1 (headroom for the difference).
    4. X from (s, sig, Ex), MU from (sm, m, Em), each aligned to emax as 3.3 does
       (``sh = emax - exponent - (M - 2 - 10)``, exact left shift for sh <= 0, else
       rounded half away from zero), signed; with the headroom |X|, |MU| <= 2^(M-2).
    5. ``x = (-1)^d clamp(X - MU, +-(2^(M-1) - 1))`` (the clamp acts only at
       X - MU = +-2^(M-1)); ``u = emax - bias - M + 2``.

    So ``x 2^u`` is within one unit 2^u of ``sat(k 2^e) - mu_s`` (two roundings of half a
    unit), or clamped.

    Args:
        bits: uint16 [V, N] fp16 key bit patterns.
        mu_s: uint16 fp16 bits (or float16) broadcastable to [V, N], finite: the centering
            table ``RN16(mu 2^e)`` (:func:`sim_models.keyscale.front_table`).
        log2_s: integer exponents e in :data:`sim_models.keyscale.LOG2_S_RANGE`,
            broadcastable to [V, N].
        p: format parameters (``dtype`` fp16).
        mask: uint8 [N] sign-flip mask (1 = negate).

    Returns:
        (x, u, flags) as :func:`to_block_fp`.

    Raises:
        ValueError: dtype other than fp16, mu_s not finite, an exponent out of range or
            not an integer, shapes that do not broadcast (the message names the parameter).
        TypeError: mu_s of another dtype.
    """
    from .keyscale import LOG2_S_RANGE
    if p.dtype != "fp16":
        raise ValueError(f"to_block_fp_keys: dtype must be 'fp16', got {p.dtype!r}")
    mu = np.asarray(mu_s)
    if mu.dtype == np.float16:
        mu = mu.view(np.uint16)
    if mu.dtype != np.uint16:
        raise TypeError(f"mu_s must be float16 or uint16 fp16 bit patterns, got {mu.dtype}")
    if ((mu >> 10) & 0x1F == 0x1F).any():
        raise ValueError("mu_s must be finite")
    e = np.asarray(log2_s)
    lo, hi = LOG2_S_RANGE
    if e.size and (not np.array_equal(e, np.round(e)) or e.min() < lo or e.max() > hi):
        raise ValueError(f"log2_s must be integers in [{lo}, {hi}]")
    try:
        mu = np.broadcast_to(mu, bits.shape)
        e = np.broadcast_to(e.astype(np.int64), bits.shape)
    except ValueError:
        raise ValueError(f"mu_s {list(np.shape(mu_s))} and log2_s {list(np.shape(log2_s))} must "
                         f"broadcast to the keys {list(bits.shape)}") from None
    _, m_bits, bias = p.in_format
    e_top = (1 << p.in_format[0]) - 2                   # largest finite exponent (30)
    special = ((bits >> m_bits) & 0x1F) == 0x1F         # NaN / inf: passed through
    sign, ex, sig, flags = decode_bits(bits, p)
    ex = ex + np.where(special, 0, e)
    sat = ex > e_top
    sig = np.where(sat, (1 << (m_bits + 1)) - 1, sig)
    ex = np.where(sat, e_top, ex)
    sm, em, sig_m, _ = decode_bits(np.where(special, 0, mu).astype(np.uint16), p)
    emax = np.maximum(ex, em).max(axis=1) + 1
    off = p.mant_bits - 2 - m_bits
    xs = align(sig, emax[:, None] - ex - off)
    ms = align(sig_m, emax[:, None] - em - off)
    y = np.where(sign == 1, -xs, xs) - np.where(sm == 1, -ms, ms)
    lim = (1 << (p.mant_bits - 1)) - 1
    y = np.clip(y, -lim, lim)
    x = np.where(mask.astype(np.int64)[None, :] == 1, -y, y)
    u = emax - bias - p.mant_bits + 2
    return x, u, flags
