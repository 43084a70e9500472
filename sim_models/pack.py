"""Packing of b-bit codes into the code plane, docs/FORMAT.md 4.

Code of lane i, as a b-bit two's-complement field, occupies bits
[i*b, i*b + b) of the vector's bit stream, least significant bit first; stream
bit k is bit (k mod 8) of byte (k div 8). For b = 3, lanes 0..7 fill bytes 0..2.
Mode ``asym`` stores unsigned codes 0 .. 2^b - 1 in the same fields
(``signed=False``); the bit layout is identical.
"""

from __future__ import annotations

import numpy as np


def pack_codes(codes: np.ndarray, bits: int, signed: bool = True) -> np.ndarray:
    """Codes int [V, N] -> code plane uint8 [V, N*bits/8].

    Args:
        codes: signed codes in [-2^(b-1), 2^(b-1)) (``signed``), else unsigned in [0, 2^b).
        bits: field width b.
        signed: two's-complement fields (default) or unsigned fields (mode asym).

    Raises:
        ValueError: N*bits is not a multiple of 8, or a code does not fit.
    """
    v, n = codes.shape
    if (n * bits) % 8:
        raise ValueError(f"N*bits must be a multiple of 8, got N={n}, bits={bits}")
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
    if codes.size and (codes.min() < lo or codes.max() >= hi):
        raise ValueError(f"codes out of the {bits}-bit {'signed' if signed else 'unsigned'} range")
    field = codes.astype(np.int64) & ((1 << bits) - 1)
    stream = ((field[:, :, None] >> np.arange(bits)) & 1).astype(np.uint8)
    return np.packbits(stream.reshape(v, n * bits), axis=1, bitorder="little")


def unpack_codes(plane: np.ndarray, n: int, bits: int, signed: bool = True) -> np.ndarray:
    """Code plane uint8 [V, N*bits/8] -> codes int64 [V, N] (signed, or unsigned if not ``signed``).

    Raises:
        ValueError: the plane has the wrong shape or dtype.
    """
    if plane.dtype != np.uint8:
        raise TypeError(f"code plane must be uint8, got {plane.dtype}")
    if plane.ndim != 2 or plane.shape[1] * 8 != n * bits:
        raise ValueError(f"code plane must be [V, {n * bits // 8}], got {list(plane.shape)}")
    stream = np.unpackbits(plane, axis=1, bitorder="little").reshape(plane.shape[0], n, bits)
    field = (stream.astype(np.int64) << np.arange(bits)).sum(axis=2)
    if not signed:
        return field
    return np.where(field >= (1 << (bits - 1)), field - (1 << bits), field)
