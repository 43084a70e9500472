"""Packing of b-bit codes into the code plane, docs/FORMAT.md 4.

Code of lane i, as a b-bit two's-complement field, occupies bits
[i*b, i*b + b) of the vector's bit stream, least significant bit first; stream
bit k is bit (k mod 8) of byte (k div 8). For b = 3, lanes 0..7 fill bytes 0..2.
"""

from __future__ import annotations

import numpy as np


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Signed codes int [V, N] -> code plane uint8 [V, N*bits/8].

    Raises:
        ValueError: N*bits is not a multiple of 8, or a code does not fit.
    """
    v, n = codes.shape
    if (n * bits) % 8:
        raise ValueError(f"N*bits must be a multiple of 8, got N={n}, bits={bits}")
    lim = 1 << (bits - 1)
    if codes.size and (codes.min() < -lim or codes.max() >= lim):
        raise ValueError(f"codes out of the {bits}-bit signed range")
    field = codes.astype(np.int64) & ((1 << bits) - 1)
    stream = ((field[:, :, None] >> np.arange(bits)) & 1).astype(np.uint8)
    return np.packbits(stream.reshape(v, n * bits), axis=1, bitorder="little")


def unpack_codes(plane: np.ndarray, n: int, bits: int) -> np.ndarray:
    """Code plane uint8 [V, N*bits/8] -> signed codes int64 [V, N].

    Raises:
        ValueError: the plane has the wrong shape or dtype.
    """
    if plane.dtype != np.uint8:
        raise TypeError(f"code plane must be uint8, got {plane.dtype}")
    if plane.ndim != 2 or plane.shape[1] * 8 != n * bits:
        raise ValueError(f"code plane must be [V, {n * bits // 8}], got {list(plane.shape)}")
    stream = np.unpackbits(plane, axis=1, bitorder="little").reshape(plane.shape[0], n, bits)
    field = (stream.astype(np.int64) << np.arange(bits)).sum(axis=2)
    return np.where(field >= (1 << (bits - 1)), field - (1 << bits), field)
