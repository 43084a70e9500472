"""Write path (encode) and read path (decode) of the format, docs/FORMAT.md.

Encode, per vector of N lanes: special values -> sign flip D -> block floating
point -> unnormalized FWHT (log2 N butterfly stages) -> per-block scale byte
-> b-bit codes -> packing. Decode: unpack -> code * scale -> H / N -> D ->
round to the input type (round to nearest even, saturating).
Scale bytes: :mod:`sim_models.scale`; codes: :mod:`sim_models.quant`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bfp import FLAG_SAT, to_block_fp, to_block_fp_keys
from .fwht import fwht
from .pack import pack_codes, unpack_codes
from .params import FormatParams
from .quant import dequantize, quantize
from .scale import choose_scale_bytes
from .signs import sign_mask
from .transform import HeadTransform, rotate_back, rotate_forward


@dataclass
class Encoded:
    """Encoded vectors.

    Attributes:
        codes: uint8 [..., N*b/8], the code plane (FORMAT.md 4).
        scales: uint8 [..., N/G], scale bytes (``p.scale``), block k of lanes [kG, kG+G).
        flags: uint8 [...], per-vector status bits FLAG_NAN | FLAG_INF | FLAG_SAT.
        zeros: uint8 [..., N/G] zero points (mode ``asym`` only; else None).
    """

    codes: np.ndarray
    scales: np.ndarray
    flags: np.ndarray
    zeros: np.ndarray | None = None


@dataclass
class Trace:
    """Intermediate values of the write path (for RTL/GPU debugging), [V, ...]."""

    x: np.ndarray       # int64 [V, N] block-floating-point mantissas (after D)
    u: np.ndarray       # int64 [V]    exponent of one mantissa unit
    y: np.ndarray       # int64 [V, N] FWHT output (after the rotation B, if any), same unit
    scales: np.ndarray  # uint8 [V, N/G]
    codes: np.ndarray   # int64 [V, N] codes (signed; unsigned for asym)
    flags: np.ndarray   # uint8 [V]
    zeros: np.ndarray | None = None  # uint8 [V, N/G] zero points (asym), else None


def as_bits(x: np.ndarray, p: FormatParams) -> np.ndarray:
    """Validate an input array and return its raw 16-bit patterns.

    Args:
        x: array [..., N]: uint16 bit patterns (fp16 or bf16 per ``p.dtype``),
            or float16 values when ``p.dtype == "fp16"``.
        p: format parameters.

    Returns:
        uint16 array [V, N] (a flattened view of the leading axes).

    Raises:
        TypeError: not a NumPy array, or a dtype other than uint16 / float16.
        ValueError: fewer than one axis, or last axis != N.
    """
    if not isinstance(x, np.ndarray):
        raise TypeError(f"input must be a numpy array, got {type(x).__name__}")
    if x.dtype == np.float16:
        if p.dtype != "fp16":
            raise TypeError(f"float16 input given for dtype={p.dtype!r}; pass uint16 bit patterns")
        x = x.view(np.uint16)
    elif x.dtype != np.uint16:
        raise TypeError(f"input dtype must be uint16 bit patterns or float16, got {x.dtype}")
    if x.ndim < 1 or x.shape[-1] != p.n:
        raise ValueError(f"input must have shape [..., N={p.n}], got {list(x.shape)}")
    return np.ascontiguousarray(x).reshape(-1, p.n)


def _signs(p: FormatParams, t: HeadTransform | None) -> np.ndarray:
    """The sign-flip mask: ``t.signs`` when given, else ``p.sign_seed``'s."""
    if t is not None and t.signs is not None:
        return t.signs
    return sign_mask(p.n, p.sign_seed)


def _check_transform(t, p: FormatParams) -> HeadTransform | None:
    if t is None:
        return None
    if not isinstance(t, HeadTransform):
        raise TypeError(f"t must be a sim_models.HeadTransform or None, got {type(t).__name__}")
    return t.check(p.n)


def encode_trace(bits: np.ndarray, p: FormatParams, t: HeadTransform | None = None) -> Trace:
    """Write path with all intermediates, for RTL/GPU debugging.

    Args:
        bits: uint16 bit patterns or float16, [..., N] (checked as :func:`as_bits`;
            leading axes are flattened to V).
        p: format parameters.
        t: per-(layer, kv head) transform tables (sim_models/transform.py), or None.

    Returns:
        :class:`Trace` with [V, ...] arrays.

    Raises:
        TypeError, ValueError: see :func:`as_bits`.
    """
    bits = as_bits(bits, p)
    t = _check_transform(t, p)
    x, u, flags = to_block_fp(bits, p, _signs(p, t))
    return _trace_from_bfp(x, u, flags, p, t)


def _trace_from_bfp(x, u, flags, p: FormatParams, t: HeadTransform | None) -> Trace:
    """The write path after block floating point (FORMAT.md 3.4-3.7): FWHT, [rotation B],
    scale bytes, codes, FLAG_SAT."""
    y = fwht(x)
    if t is not None and t.rot is not None:
        y = rotate_forward(y, t.rot)
    scales, sat = choose_scale_bytes(y, u, p)
    codes, zeros = quantize(y, u, scales, p)
    flags = flags | np.where(sat, FLAG_SAT, 0).astype(np.uint8)
    return Trace(x=x, u=u, y=y, scales=scales, codes=codes, flags=flags, zeros=zeros)


def encode(x: np.ndarray, p: FormatParams | None = None,
           t: HeadTransform | None = None) -> Encoded:
    """Encode K or V head vectors.

    Args:
        x: uint16 bit patterns or float16, shape [..., N].
        p: format parameters (default :class:`FormatParams` ()).
        t: transform tables of the vectors' (layer, kv head) (sim_models/transform.py),
            or None (the format's own D and no rotation).

    Returns:
        :class:`Encoded` with leading axes of ``x`` kept.

    Raises:
        TypeError, ValueError: see :func:`as_bits`.
    """
    p = _check_params(p)
    lead = x.shape[:-1] if isinstance(x, np.ndarray) else ()
    return encoded(encode_trace(as_bits(x, p), p, t), p, lead)


def _key_tables(mu_s, log2_s, shape: tuple, n: int):
    """The key tables broadcast to keys of ``shape`` ([..., N]) and flattened to [V, N]; tables
    already shaped for the flattened keys ([V, N] or [N]) pass unchanged."""
    mu, e = np.asarray(mu_s), np.asarray(log2_s)
    if len(shape) <= 2:
        return mu, e
    try:
        return (np.broadcast_to(mu, shape).reshape(-1, n), np.broadcast_to(e, shape).reshape(-1, n))
    except ValueError:
        return mu, e                    # [V, N] of the flattened keys (to_block_fp_keys checks)


def encode_trace_folded(bits: np.ndarray, mu_s: np.ndarray, log2_s: np.ndarray,
                        p: FormatParams, t: HeadTransform | None = None) -> Trace:
    """Write path of keys with a key front end: the folded key front end of FORMAT.md 8
    (:func:`sim_models.bfp.to_block_fp_keys`: the scale 2^e and the centering mu_s inside block
    floating point), then FORMAT.md 3.4-3.7 unchanged.

    Args:
        bits: fp16 keys, uint16 bit patterns or float16, [..., N] (flattened to V).
        mu_s: fp16 centering table ``RN16(mu 2^e)`` (uint16 bits or float16), broadcastable
            to the keys' shape [..., N] or to the flattened [V, N] (e.g. [N] for one
            (layer, kv head)).
        log2_s: integer key-scale exponents, broadcastable as ``mu_s``.
        p: format parameters (fp16).
        t: transform tables, as :func:`encode_trace`.

    Raises:
        TypeError, ValueError: :func:`as_bits`, :func:`sim_models.bfp.to_block_fp_keys`.
    """
    shape = bits.shape if isinstance(bits, np.ndarray) else ()
    bits = as_bits(bits, p)
    mu_s, log2_s = _key_tables(mu_s, log2_s, shape, p.n)
    t = _check_transform(t, p)
    x, u, flags = to_block_fp_keys(bits, mu_s, log2_s, p, _signs(p, t))
    return _trace_from_bfp(x, u, flags, p, t)


def encode_folded(k: np.ndarray, mu_s: np.ndarray, log2_s: np.ndarray,
                  p: FormatParams | None = None, t: HeadTransform | None = None) -> Encoded:
    """Encode keys with the key front end (FORMAT.md 8, the folded rule:
    :func:`encode_trace_folded`); the planes and the read path are those of :func:`encode`
    (the decoder returns ``k 2^e - mu_s``).

    Args:
        k: fp16 keys, uint16 bit patterns or float16, [..., N]; leading axes kept.
        mu_s, log2_s: the key tables of the vectors' (layer, kv head), broadcastable to the
            keys' shape or to [V, N] of the flattened keys.
        p: format parameters (default :class:`FormatParams` ()).
        t: transform tables or None.
    """
    p = _check_params(p)
    lead = k.shape[:-1] if isinstance(k, np.ndarray) else ()
    return encoded(encode_trace_folded(k, mu_s, log2_s, p, t), p, lead)


def encoded(t: Trace, p: FormatParams, lead: tuple | None = None) -> Encoded:
    """The :class:`Encoded` planes of a write-path trace (codes packed); ``lead``: the
    leading axes to give them (default: one axis of V vectors)."""
    lead = t.codes.shape[:1] if lead is None else lead
    zeros = None if t.zeros is None else t.zeros.reshape(*lead, p.n_blocks)
    return Encoded(codes=pack_codes(t.codes, p.bits, p.mode != "asym").reshape(*lead, p.code_bytes),
                   scales=t.scales.reshape(*lead, p.n_blocks),
                   flags=t.flags.reshape(lead), zeros=zeros)


def _check_params(p) -> FormatParams:
    """``p`` or the default :class:`FormatParams`; TypeError for anything else."""
    if p is None:
        return FormatParams()
    if not isinstance(p, FormatParams):
        raise TypeError(f"p must be a sim_models.FormatParams or None, got {type(p).__name__}")
    return p


def _check_plane(name: str, a, lead, width: int) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != np.uint8:
        raise TypeError(f"{name} must be uint8, got {a.dtype}")
    if a.ndim < 1 or a.shape[-1] != width or (lead is not None and a.shape[:-1] != lead):
        raise ValueError(f"{name} must have shape [..., {width}] matching the other plane, "
                         f"got {list(a.shape)}")
    return a.reshape(-1, width)


def decode_float(codes: np.ndarray, scales: np.ndarray, p: FormatParams | None = None,
                 zeros: np.ndarray | None = None, t: HeadTransform | None = None) -> np.ndarray:
    """Read path to exact real values: x_hat = D * (H @ yhat) / N, yhat = dequantized codes
    (with a :class:`HeadTransform`: its signs as D, and ``R^T yhat / 2^ROT_FRAC`` for yhat).

    Args:
        codes: uint8 code plane [..., N*b/8].
        scales: uint8 scale plane [..., N/G] (same leading axes).
        p: format parameters.
        zeros: uint8 zero-point plane [..., N/G]; mode ``asym`` only (required there).
        t: the transform tables the vectors were encoded with, or None.

    Returns:
        float64 [..., N]; an exact zero is +0.0 before D (so -0.0 exactly where D
        flips it). Exact: every term is an integer of < 8 bits (lloydmax:
        < 14 bits) times a power of two, and the partial sums stay within
        float64's 53 bits while a vector's block scales lie within 2^30 of each
        other (always, for real data).

    Raises:
        TypeError, ValueError: wrong dtype or shape of a plane; asym without zeros; zeros
            given for another mode.
    """
    p = _check_params(p)
    t = _check_transform(t, p)
    lead = codes.shape[:-1] if isinstance(codes, np.ndarray) else None
    c = unpack_codes(_check_plane("codes", codes, None, p.code_bytes), p.n, p.bits,
                     p.mode != "asym")
    s = _check_plane("scales", scales, lead, p.n_blocks)
    if zeros is not None and p.mode != "asym":
        raise ValueError(f"zeros is a plane of mode 'asym' only, got mode={p.mode!r} (a zero-point "
                         f"plane here would be ignored)")
    z = None if zeros is None else _check_plane("zeros", zeros, lead, p.n_blocks)
    yhat = dequantize(c, s, p, z)
    if t is not None and t.rot is not None:
        yhat = rotate_back(yhat, t.rot)
    xhat = fwht(yhat) / p.n
    # an exact zero is +0 before D (FORMAT.md, read path): float64's -0.0 (a negative
    # level times a zero scale, and the sums it enters) is not part of the format
    xhat = np.where(xhat == 0, 0.0, xhat)
    xhat = np.where(_signs(p, t)[None, :] == 1, -xhat, xhat)
    return xhat.reshape(*lead, p.n)


def round_to_input_type(v: np.ndarray, p: FormatParams) -> np.ndarray:
    """float64 -> uint16 bit patterns of ``p.dtype``; round to nearest even, saturating.

    Values beyond the largest finite magnitude become +-max (never inf); NaN is
    not produced by decode and is rejected.
    """
    if np.isnan(v).any():
        raise ValueError("cannot round NaN")
    _, m_bits, bias = p.in_format
    e_bits = p.in_format[0]
    max_fin = np.ldexp(2.0 - 2.0 ** -m_bits, (1 << e_bits) - 2 - bias)
    _, e = np.frexp(v)
    q = np.maximum(e - 1, 1 - bias) - m_bits          # exponent of one ulp
    r = np.ldexp(np.rint(np.ldexp(v, -q)), q)         # rint: round half to even
    r = np.clip(r, -max_fin, max_fin)
    if p.dtype == "fp16":
        return r.astype(np.float16).view(np.uint16)
    return (r.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def decode(codes: np.ndarray, scales: np.ndarray, p: FormatParams | None = None,
           zeros: np.ndarray | None = None, t: HeadTransform | None = None) -> np.ndarray:
    """Read path to the input type: uint16 bit patterns [..., N] (see :func:`decode_float`)."""
    p = _check_params(p)
    return round_to_input_type(decode_float(codes, scales, p, zeros, t), p)
