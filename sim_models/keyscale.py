"""Static per-channel key scaling, folded into the query: store ``k * s``, attend with ``q / s``.

One concept. ``q . k = (q / s) . (k * s)`` for any per-channel s > 0, so attention is
unchanged while the key the encoder sees has its channels rescaled. s is a calibrated
model constant per (layer, kv head, channel) (``python -m sim_models.calibrate``;
KVQuant / SmoothAttention style, here query-aware: ``s_i ~ (E q_i^2 / E k_i^2)^(1/4)``
minimises E (q . dk)^2 for the rotation-isotropic error dk of the format). With s a
power of two the scaling is exact (barring fp16 range) and the query side is an exponent
add; with s any fp16 value it is one rounding per lane.

Exact rule (the encoder input): ``x' = RNE(x * s)`` in the input type (round to nearest
even, saturating at +-max as :func:`sim_models.codec.round_to_input_type`); NaN and +-inf
lanes pass through. s is fp16 (or bf16 for bf16 keys), positive and finite. When keys are
also centered (sim_models/center.py), scaling comes first and the centering vector is the
scaled one: ``x' = center(scale_keys(x, s), scale_keys(mu, s))`` = ``RNE(RN16(x s) - RN16(mu s))``,
the rule of gpu_ref's write kernel (its key front end, ``gpu_ref.encode.key_table``). For powers of two
this equals ``RNE(RNE(x - mu) * s)`` except where fp16 subnormals round. In hardware: one fp16 multiply
per lane in front of the encoder (an exponent add for powers of two), and one multiply
per query lane (or folded into W_q when s is equal on each RoPE pair).
"""

from __future__ import annotations

import numpy as np

from .center import center, table_operands
from .codec import round_to_input_type
from .params import FormatParams


def scale_keys(x: np.ndarray, s: np.ndarray, p: FormatParams | None = None) -> np.ndarray:
    """Scaled encoder input ``RNE(x * s)`` (module docstring).

    Args:
        x: uint16 bit patterns or float16 [..., N].
        s: float16 (or uint16 bit patterns of ``p.dtype``), positive and finite,
            broadcastable to x (e.g. [N] for one (layer, kv head)).
        p: format parameters (``n`` and ``dtype`` are used).

    Returns:
        uint16 bit patterns, x's shape.

    Raises:
        TypeError, ValueError: bad x (:func:`sim_models.codec.as_bits`); s of another
        dtype, not broadcastable, not positive or not finite.
    """
    p = p or FormatParams()
    bits, xv, sv = table_operands(x, s, "s", p)
    if not (np.isfinite(sv).all() and (sv > 0).all()):
        raise ValueError("s must be positive and finite")
    special = ~np.isfinite(xv)
    out = round_to_input_type(np.where(special, 0.0, xv * sv), p)
    return np.where(special, bits, out).astype(np.uint16)


#: Range of the power-of-two key scale exponents e (s = 2^e, :func:`pow2_scales`): normal fp16.
LOG2_S_RANGE = (-14, 15)

def pow2_scales(log2_s: np.ndarray) -> np.ndarray:
    """Integer exponents -> float16 powers of two (exact), for :func:`scale_keys`.

    Raises:
        ValueError: an exponent outside [-14, 15] (not a normal fp16).
    """
    e = np.asarray(log2_s)
    lo, hi = LOG2_S_RANGE
    if not np.array_equal(e, np.round(e)) or e.min() < lo or e.max() > hi:
        raise ValueError(f"log2_s must be integers in [{lo}, {hi}]")
    return np.exp2(e).astype(np.float16)



def front_table(mu: np.ndarray, log2_s: np.ndarray, p: FormatParams | None = None) -> np.ndarray:
    """The centering table of the key front end: ``mu_s = RN16(mu * 2^e)`` (uint16 fp16 bits).

    Computed once per (layer, kv head) in software (as gpu_ref's cache does) and loaded
    into the hardware table next to ``e``; :func:`key_front` consumes it.

    Args:
        mu: centering vector, float16 or uint16 bits, [..., N]; finite.
        log2_s: integer scale exponents in :data:`LOG2_S_RANGE`, broadcastable to mu.
    """
    p = p or FormatParams()
    return scale_keys(mu, pow2_scales(log2_s), p)


def key_front(x: np.ndarray, mu_s: np.ndarray, log2_s: np.ndarray,
              p: FormatParams | None = None) -> np.ndarray:
    """Key front end from its loaded tables: ``RNE(RN16(x * 2^e) - mu_s)`` per lane (fp16).

    The rule of keys kept as 16-bit side rows (sinks, the recent ring; FORMAT.md 8), which
    the CUDA kernel (``gpu_ref.key_front``) and the golden stores use: :func:`scale_keys`
    by the power of two ``2^e`` (exact, or RNE into the subnormals, saturating at
    +-65504), then :func:`sim_models.center.center` by the precomputed
    ``mu_s = RN16(mu * 2^e)`` (:func:`front_table`). NaN/inf lanes of x pass through. With ``mu_s = front_table(mu, e)`` this is FORMAT.md 8's
    ``RNE_fp16(RN16(x s) - RN16(mu s))``.

    Args:
        x: uint16 bits or float16 [..., N].
        mu_s: uint16 fp16 bits (or float16), finite, broadcastable to x.
        log2_s: integer exponents in :data:`LOG2_S_RANGE`, broadcastable to x.

    Returns:
        uint16 bits, x's shape.

    Raises:
        ValueError: a dtype other than fp16 (the RTL front end is fp16 only), an exponent
            out of range, mu_s not finite; TypeError / ValueError of :func:`center`.
    """
    if p is None:
        n = np.shape(x)[-1]
        p = FormatParams(n=n, block=min(64, n))
    if p.dtype != "fp16":
        raise ValueError(f"key_front: dtype must be 'fp16', got {p.dtype!r}")
    with np.errstate(invalid="ignore"):         # NaN lanes: passed through, not computed
        return center(scale_keys(x, pow2_scales(log2_s), p), np.asarray(mu_s), p)
