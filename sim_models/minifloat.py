"""8-bit scale-byte encodings (minifloats) for the block scale, docs/FORMAT.md 3.5.

One concept: the map between a scale byte and the exact scale value
``sig * 2^exp`` it encodes, for every encoding a :class:`FormatParams` may
name. Only strictly positive, finite values are ever written; the encoder
chooses among :attr:`ScaleEncoding.bytes` (ascending by value, so "byte index"
order is value order).

| name     | sign | exp bits | mant bits | bias | specials              | smallest | largest        |
|----------|------|----------|-----------|------|-----------------------|----------|----------------|
| ue5m3    | no   | 5        | 3         | 7    | none                  | 2^-9     | 1.875 * 2^24   |
| e4m3fn   | yes  | 4        | 3         | 7    | NaN = S.1111.111      | 2^-9     | 448            |
| e5m2     | yes  | 5        | 2         | 15   | inf/NaN at exp 11111  | 2^-16    | 57344          |
| ue4m4    | no   | 4        | 4         | 7    | none                  | 2^-10    | 1.9375 * 2^8   |

All have subnormals (exponent field 0: ``sig = m``, exponent as for field 1).
``ue5m3`` is the format's encoding (docs/FORMAT.md 3.5). ``e4m3fn`` and ``e5m2`` are the OCP
8-bit floating point formats (OCP FP8 spec v1.0, 2023; ``torch.float8_e4m3fn``,
``torch.float8_e5m2``): scales are never negative, so their sign bit is always 0
and half the byte's codes are wasted. ``ue4m4`` spends that bit on the mantissa
instead, with the range of e4m3fn.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class ScaleEncoding:
    """One scale-byte encoding.

    Attributes:
        name: encoding name (a value of ``FormatParams.scale``).
        exp_bits, mant_bits, bias: minifloat layout; value of a normal byte
            ``(2^mant_bits + m) * 2^(e - bias - mant_bits)``, subnormal
            ``m * 2^(1 - bias - mant_bits)``.
        signed: whether bit 7 is a sign bit (then always written 0).
        bytes: uint8 [K], every byte that encodes a positive finite value,
            ascending by value (the encoder's search space).
        sig, exp: int64 [K], the exact value of ``bytes[i]`` is ``sig[i] * 2^exp[i]``.
        mid_sig, mid_exp: int64 [K-1], exact midpoints between consecutive
            values, ``(value[i] + value[i+1]) / 2 = mid_sig[i] * 2^mid_exp[i]``
            (the decision thresholds of round-to-nearest).
    """

    name: str
    exp_bits: int
    mant_bits: int
    bias: int
    signed: bool
    bytes: np.ndarray
    sig: np.ndarray
    exp: np.ndarray
    mid_sig: np.ndarray
    mid_exp: np.ndarray

    def values(self) -> np.ndarray:
        """float64 [K] exact values of :attr:`bytes`."""
        return np.ldexp(self.sig.astype(np.float64), self.exp.astype(np.int32))

    def index_of(self, byte: np.ndarray) -> np.ndarray:
        """Index into :attr:`bytes` of each byte (int64, same shape).

        Raises:
            ValueError: a byte encodes no positive finite value in this encoding.
        """
        lut = np.full(256, -1, dtype=np.int64)
        lut[self.bytes] = np.arange(self.bytes.size)
        idx = lut[np.asarray(byte).astype(np.int64) & 0xFF]
        if idx.size and idx.min() < 0:
            raise ValueError(f"scale byte not a positive finite {self.name} value")
        return idx

    def sig_exp(self, byte: np.ndarray):
        """(sig, exp) int64 arrays of scale bytes; value = sig * 2^exp exactly."""
        i = self.index_of(byte)
        return self.sig[i], self.exp[i]


#: (exponent bits, mantissa bits, bias, signed, kind of specials)
_LAYOUTS = {
    "ue5m3": (5, 3, 7, False, "none"),
    "e4m3fn": (4, 3, 7, True, "fn"),
    "e5m2": (5, 2, 15, True, "ieee"),
    "ue4m4": (4, 4, 7, False, "none"),
}


def _positive_finite(e_bits: int, m_bits: int, signed: bool, specials: str) -> list[int]:
    top = 1 << (e_bits + m_bits)            # bytes 0 .. top-1 carry no sign bit
    out = []
    for byte in range(1, top):
        e, m = byte >> m_bits, byte & ((1 << m_bits) - 1)
        if specials == "ieee" and e == (1 << e_bits) - 1:
            continue                         # inf / NaN
        if specials == "fn" and e == (1 << e_bits) - 1 and m == (1 << m_bits) - 1:
            continue                         # NaN
        out.append(byte)
    assert signed == (top == 128)
    return out


@lru_cache(maxsize=None)
def scale_encoding(name: str) -> ScaleEncoding:
    """The :class:`ScaleEncoding` called ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name not in _LAYOUTS:
        raise ValueError(f"scale must be one of {tuple(_LAYOUTS)}, got {name!r}")
    e_bits, m_bits, bias, signed, specials = _LAYOUTS[name]
    b = np.array(_positive_finite(e_bits, m_bits, signed, specials), dtype=np.int64)
    e, m = b >> m_bits, b & ((1 << m_bits) - 1)
    sig = np.where(e == 0, m, m + (1 << m_bits))
    exp = np.maximum(e, 1) - bias - m_bits
    # midpoints: (s0 2^e0 + s1 2^e1) / 2 = (s0 2^(e0-lo) + s1 2^(e1-lo)) * 2^(lo-1)
    lo = np.minimum(exp[:-1], exp[1:])
    mid_sig = (sig[:-1] << (exp[:-1] - lo)) + (sig[1:] << (exp[1:] - lo))
    mid_exp = lo - 1
    v = np.ldexp(sig.astype(np.float64), exp.astype(np.int32))
    assert (np.diff(v) > 0).all()
    return ScaleEncoding(name=name, exp_bits=e_bits, mant_bits=m_bits, bias=bias, signed=signed,
                         bytes=b.astype(np.uint8), sig=sig, exp=exp, mid_sig=mid_sig,
                         mid_exp=mid_exp)
