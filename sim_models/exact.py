"""Exact comparison of integers scaled by powers of two, ``a * 2^ea >= b * 2^eb``.

The only arithmetic the scale selection needs (:mod:`sim_models.scale`): int64 operands
up to 2^62 and, for parameter sets whose bounds exceed that (sums of squares of a
block), Python-int (object) arrays. No operation here rounds.
"""

from __future__ import annotations

import numpy as np

#: int64 operands must be below this bound.
I64_LIMIT = 1 << 62


def ge_scaled(a, ea, b, eb) -> np.ndarray:
    """Elementwise ``a * 2^ea >= b * 2^eb``, exactly.

    Args:
        a, b: non-negative integers: int64 arrays with values < 2^62, or object
            arrays of Python ints (any size). Broadcastable.
        ea, eb: int64 exponent arrays, broadcastable to ``a``/``b``.

    Returns:
        bool array of the broadcast shape.

    Method (int64, no overflow): with d = ea - eb, for d >= 0 the test is
    ``a >= ceil(b / 2^d)`` = ``a >= (b + 2^d - 1) >> d``; for d < 0 it is
    ``floor(a / 2^-d) >= b`` = ``(a >> -d) >= b`` (b is an integer). Shifts are
    clamped to 62, which changes nothing for operands below 2^62.

    Raises:
        OverflowError: an int64 operand is negative or >= 2^62.
    """
    a, b = np.asarray(a), np.asarray(b)
    d = np.asarray(ea, dtype=np.int64) - np.asarray(eb, dtype=np.int64)
    if a.dtype == object or b.dtype == object:
        a, b = a.astype(object), b.astype(object)
        dp = np.maximum(d, 0).astype(object)
        dn = np.maximum(-d, 0).astype(object)
        return np.asarray((a << dp) >= (b << dn), dtype=bool)
    a = a.astype(np.int64)
    b = b.astype(np.int64)
    for name, v in (("a", a), ("b", b)):
        if v.size and (v.min() < 0 or v.max() >= I64_LIMIT):
            raise OverflowError(f"ge_scaled operand {name} must be in [0, 2^62)")
    dp = np.clip(d, 0, 62)
    dn = np.clip(-d, 0, 62)
    one = np.int64(1)
    up = a >= ((b + (np.left_shift(one, dp) - 1)) >> dp)
    down = (a >> dn) >= b
    return np.where(d >= 0, up, down)


def first_true(pred, count: int, shape) -> np.ndarray:
    """Smallest index k in [0, count) with ``pred(k)`` True, per element (binary search).

    Args:
        pred: callable taking an int64 index array of ``shape`` and returning a
            bool array of ``shape``; must be monotone in k (False ... False True ... True).
        count: number of candidate indices.
        shape: shape of the answer.

    Returns:
        int64 array of ``shape``; ``count`` where pred is False for every index.
    """
    lo = np.zeros(shape, dtype=np.int64)
    hi = np.full(shape, count, dtype=np.int64)
    while np.any(lo < hi):
        mid = (lo + hi) >> 1
        ok = pred(np.minimum(mid, count - 1)) & (mid < count)
        active = lo < hi
        hi = np.where(active & ok, mid, hi)
        lo = np.where(active & ~ok, mid + 1, lo)
    return lo
