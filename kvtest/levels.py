"""Code values, levels and scale bytes of a format: building blocks of the plane sets.

A plane set is ``(codes uint8 [V, N*b/8], scales uint8 [V, N/G])`` and, for
mode ``asym``, ``(codes, scales, zeros uint8 [V, N/G])``.

Scale bytes: the sets use the encoding's positive finite bytes
(``ScaleEncoding.bytes``), plus byte 0x00 (a zero scale) for the "v1" preset's
quantizer.
"""

from __future__ import annotations

import numpy as np

from sim_models.minifloat import scale_encoding
from sim_models.pack import pack_codes
from sim_models.params import FormatParams


def scale_bytes(p: FormatParams) -> np.ndarray:
    """uint8 [K]: the scale bytes the sets draw from for ``p``, ascending by value
    (``ScaleEncoding.bytes``, with 0x00 in front for the "v1" preset)."""
    if p.quantizer_preset == "v1":
        return np.arange(256, dtype=np.uint8)
    return scale_encoding(p.scale).bytes


def nominal_scale_bytes(p: FormatParams, nominal) -> np.ndarray:
    """Map nominal ue5m3 bytes (1 .. 255) to the bytes of ``p`` at the same relative
    position in value order (identity for ue5m3: 1 -> smallest, 255 -> largest)."""
    v = scale_bytes(p)
    nominal = np.asarray(nominal, dtype=np.int64)
    if v.size == 256:
        return nominal.astype(np.uint8)
    idx = np.rint((np.clip(nominal, 1, 255) - 1) * (v.size - 1) / 254).astype(np.int64)
    return v[idx]


def is_asym(p: FormatParams) -> bool:
    """Mode asym: the planes carry a zero-point plane."""
    return p.mode == "asym"


def plane_set(p: FormatParams, codes, scales, zeros):
    """(codes, scales, zeros) for mode asym, else (codes, scales)."""
    if is_asym(p):
        return codes, scales, zeros
    return codes, scales


def zeros_arg(p: FormatParams, zeros):
    """The zero-point plane for the golden decode: required for asym, None otherwise.

    Raises:
        ValueError: mode asym without ``zeros``.
    """
    if is_asym(p):
        if zeros is None:
            raise ValueError("zeros (the zero-point plane) is required for mode 'asym'")
        return np.ascontiguousarray(zeros, dtype=np.uint8)
    return None


def pack_plane(c: np.ndarray, p: FormatParams) -> np.ndarray:
    """Code values int [V, N] -> the packed code plane uint8 [V, N*b/8]."""
    return pack_codes(np.asarray(c, dtype=np.int64).reshape(-1, p.n), p.bits, not is_asym(p))


def code_range(p: FormatParams) -> tuple[int, int]:
    """(lo, hi) of the code values of ``p.mode`` (two's complement; asym unsigned)."""
    if is_asym(p):
        return 0, (1 << p.bits) - 1
    return -(1 << (p.bits - 1)), (1 << (p.bits - 1)) - 1


def sm_codes(p: FormatParams, sgn, mag, z=None) -> np.ndarray:
    """Codes of level sign ``sgn`` (+-1) and magnitude index ``mag`` (0 .. h-1): the
    level is ``sgn * |level|(mag)``, so ``sgn`` = a Hadamard row gives a scaled row.
    midtread: c = sgn mag; midrise/lloydmax: mag or -1 - mag; asym: z + sgn mag."""
    sgn = np.asarray(sgn, dtype=np.int64)
    mag = np.broadcast_to(np.asarray(mag, dtype=np.int64), sgn.shape)
    if p.mode == "midtread":
        return sgn * mag
    if p.mode in ("midrise", "lloydmax"):
        return np.where(sgn < 0, -1 - mag, mag)
    return np.asarray(z, dtype=np.int64) + sgn * mag
