"""GPU storage order of the value code plane: a tested permutation of the golden bytes.

The golden model (:func:`sim_models.encode`, ``sim_models.pack``) defines the code bytes of a token: lane j's
b-bit field at bits ``b j .. b j + b - 1`` of the row, LSB first (the *wire* order, the interchange format).
The decode kernel's value operand pairs two tokens of one lane in a half2 (the mma's k axis is the token
axis), so :class:`gpu_ref.KVCache` stores 3-bit value rows in the *vpair* order instead, which the write
kernel produces and the decode kernel reads:

* per token, every 16-lane group (6 bytes ``g0..g5``: lanes 0-7 in ``g0 g1 g2``, lanes 8-15 in
  ``g3 g4 g5``) is stored as the three 16-bit units ``H0 = g0 g1``, ``H1 = g2 g5``, ``H2 = g3 g4``;
* the two tokens ``2i`` (A) and ``2i + 1`` (B) of a pair are interleaved in 16-bit units: the pair's
  ``2 R`` bytes (R bytes per row) are the 32-bit words ``[A unit k | B unit k]``, k = 0 .. R/2 - 1.

So a 32-bit word holds the same bits of two tokens (one LOP3 makes a half2 of both), and the decode
thread for lanes 0-7 (8-15) of a group reads unit H0 (H2) plus the shared unit H1 (kv_decode_attn.cu,
``VIL``). Rows move as a whole between pages; the permutation stays inside a token pair, so the token
axis (a page, or the contiguous capacity) must have an even length.

:func:`interleave` and :func:`deinterleave` are the one definition; the write kernel's bytes are tested
against ``interleave(golden bytes)`` bit for bit on the device (tests/test_gpu.py).
"""

from __future__ import annotations

import numpy as np

#: cache layouts of the value code plane: golden byte order, or the token-pair order above (3-bit codes)
LAYOUTS = ("wire", "vpair")

# stored byte s of a 6-byte group = wire byte _PERM[s] (as slices: wire bytes 0..2, 5, 3..4); _INV the inverse
_PERM = (slice(0, 3), slice(5, 6), slice(3, 5))
_INV = (slice(0, 3), slice(4, 6), slice(3, 4))


def _xp(a):
    if isinstance(a, np.ndarray):
        return np
    from ._build import cupy
    return cupy()


def _bytes(x, parts):
    return _xp(x).concatenate([x[..., s] for s in parts], axis=-1)


def _check(codes, bits: int, name: str):
    if bits != 3:
        raise ValueError(f"the vpair layout is defined for 3-bit codes, got bits={bits}")
    if getattr(codes, "dtype", None) != np.uint8 or not hasattr(codes, "reshape"):
        raise TypeError(f"{name} must be a NumPy or CuPy uint8 array, got "
                        f"{getattr(codes, 'dtype', type(codes).__name__)}")
    if codes.ndim < 2 or codes.shape[-2] % 2 or codes.shape[-1] % 6:
        raise ValueError(f"{name} must be [..., T, R] with an even token count T and R a multiple of 6 "
                         f"(16 lanes of 3 bits), got {list(codes.shape)}")
    return codes


def interleave(codes: np.ndarray, bits: int = 3) -> np.ndarray:
    """Golden (wire) code rows -> the vpair storage order.

    Args:
        codes: NumPy (or CuPy) uint8 ``[..., T, R]``: T token rows (T even; token 2i pairs with 2i + 1) of R = N*bits/8 bytes.
        bits: code bits (3).

    Returns:
        uint8 ``[..., T, R]`` (a new array of the same kind): the same bytes, rows 2i and 2i + 1 holding pair i as above.

    Raises:
        ValueError: bits != 3, odd T or R not a multiple of 6 (named). TypeError: not a uint8 array.
    """
    c = _check(codes, bits, "codes")
    *lead, t, r = c.shape
    x = _bytes(c.reshape(*lead, t, r // 6, 6), _PERM)             # units H0 H1 H2 of every group
    x = x.reshape(*lead, t // 2, 2, r // 2, 2).swapaxes(-3, -2)  # [pair, unit, token, 2 bytes]
    return x.copy().reshape(*lead, t, r)


def deinterleave(codes: np.ndarray, bits: int = 3) -> np.ndarray:
    """Inverse of :func:`interleave`: vpair storage order -> golden (wire) rows, same shapes and dtype."""
    c = _check(codes, bits, "codes")
    *lead, t, r = c.shape
    x = c.reshape(*lead, t // 2, r // 2, 2, 2).swapaxes(-3, -2)  # [pair, token, unit, 2 bytes]
    x = _bytes(x.copy().reshape(*lead, t, r // 6, 6), _INV)
    return x.reshape(*lead, t, r)


def to_wire(codes: np.ndarray, layout: str, bits: int) -> np.ndarray:
    """Code rows stored in ``layout`` -> golden rows (a copy for "vpair", the array itself for "wire")."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return codes if layout == "wire" else deinterleave(codes, bits)


def vpair_supported(bits: int, block: int) -> bool:
    """Whether the decode kernel reads value codes of ``bits`` bits and scale blocks of ``block`` lanes in
    the vpair layout (its per-thread segments are 8 lanes of 3 bits: G = 64)."""
    return bits == 3 and block == 64
