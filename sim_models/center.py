"""Key centering: subtract a fixed per-(layer, kv-head) vector mu before encoding.

One concept. Attention logits are ``q . k_t`` for one query over all cached
keys t; replacing every key by ``k_t - mu`` changes each logit by ``q . mu``,
the same for every t, so softmax and the attention output are exactly
unchanged and nothing is ever added back (the read path is the plain decode).
Removing the keys' common offset lowers the energy the 3-bit code must cover
(post-RoPE keys of real models have a large mean in their slowly rotating
channels). mu comes from a calibration run (bench.accuracy ``calibrate``)
and is a model constant, like a weight: it is not part of the per-token cache.

Every key of a sequence must be in the same domain: tokens kept unquantized
(attention sinks) are also stored as ``k - mu``.

Exact rule (the encoder input): ``x' = RNE(x - mu)`` in the input type
(round to nearest even; results beyond the largest finite value saturate to
+-max, as :func:`sim_models.codec.round_to_input_type`); NaN and +-inf lanes
of x pass through unchanged (the encoder flags them). For fp16 the float64
difference is exact; for bf16 it is exact or differs from the exact value by
far less than half a bf16 ulp of x, which RNE maps to the same result.
In hardware: one fp16 subtractor per lane in front of the encoder, or,
equivalently up to this rounding, ``H D mu`` subtracted after the FWHT.
"""

from __future__ import annotations

import numpy as np

from .codec import as_bits, round_to_input_type
from .params import FormatParams


def bits_to_float(bits: np.ndarray, p: FormatParams) -> np.ndarray:
    """uint16 fp16/bf16 bit patterns -> float64 values (exact; inf and NaN kept)."""
    if p.dtype == "fp16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def table_operands(x, table: np.ndarray, name: str, p: FormatParams):
    """(x's uint16 bits [..., N], x as float64, ``table`` as float64) for an elementwise rule with a
    per-channel table (centering's mu, the key scales): ``table`` float16 (fp16 inputs) or uint16
    bit patterns of ``p.dtype``, broadcastable to x.

    Raises:
        TypeError, ValueError: bad x (:func:`sim_models.codec.as_bits`); a table of another dtype
            or shape (the message names it by ``name``).
    """
    lead = x.shape[:-1] if isinstance(x, np.ndarray) else ()
    bits = as_bits(x, p).reshape(*lead, p.n)
    if not isinstance(table, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(table).__name__}")
    if table.dtype == np.float16 and p.dtype == "fp16":
        table = table.view(np.uint16)
    if table.dtype != np.uint16:
        raise TypeError(f"{name} must be float16 or uint16 bit patterns of {p.dtype}, got {table.dtype}")
    try:
        np.broadcast_shapes(table.shape, bits.shape)
    except ValueError:
        raise ValueError(f"{name} of shape {list(table.shape)} does not broadcast to x "
                         f"{list(bits.shape)}") from None
    return bits, bits_to_float(bits, p), bits_to_float(table, p)


def center(x: np.ndarray, mu: np.ndarray, p: FormatParams | None = None) -> np.ndarray:
    """Centered encoder input ``RNE(x - mu)`` (module docstring).

    Args:
        x: uint16 bit patterns or float16 [..., N] (as :func:`sim_models.encode`).
        mu: the centering vector, float16 or uint16 bit patterns of ``p.dtype``,
            shape broadcastable to x (e.g. [N] for one (layer, head)).
        p: format parameters (only ``n`` and ``dtype`` are used).

    Returns:
        uint16 bit patterns, x's shape.

    Raises:
        TypeError, ValueError: bad x (see :func:`sim_models.codec.as_bits`); mu
        of another dtype, not broadcastable, or not finite.
    """
    p = p or FormatParams()
    bits, xv, mv = table_operands(x, mu, "mu", p)
    if not np.isfinite(mv).all():
        raise ValueError("mu must be finite")
    special = ~np.isfinite(xv)
    d = np.where(special, 0.0, xv - mv)
    out = round_to_input_type(d, p)
    return np.where(special, bits, out).astype(np.uint16)
