"""Unnormalized fast Walsh-Hadamard transform in Sylvester (natural) order.

docs/FORMAT.md 3.4. ``H_N = H_2 (x) H_{N/2}``, ``H[i, j] = (-1)^popcount(i & j)``.
The transform is computed as log2(N) exact integer butterfly stages; stage s
(s = 0 .. log2(N)-1) pairs lanes i and i + 2^s (bit s of i clear) and writes
(a + b, a - b). Each stage grows the magnitude by at most one bit. The
1/sqrt(N) normalization is never applied to data: ``H @ H = N * I``, so the
inverse is ``H / N`` (exact, a power of two), and attention uses
``q . k = (H q) . (H k) / N``.
"""

from __future__ import annotations

import numpy as np


def _check_lanes(x: np.ndarray) -> int:
    n = x.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"FWHT length N must be a power of two, got {n}")
    return n


def fwht(x: np.ndarray) -> np.ndarray:
    """Unnormalized FWHT along the last axis: ``y = x @ H`` (H is symmetric).

    Args:
        x: integer or float array [..., N], N a power of two.

    Returns:
        Array of the same shape and dtype. For int64 input the result is exact
        while |x| * N < 2^63.

    Raises:
        ValueError: N is not a power of two.
    """
    n = _check_lanes(x)
    y = np.array(x, copy=True)
    h = 1
    while h < n:
        y = y.reshape(*x.shape[:-1], n // (2 * h), 2, h)
        a = y[..., 0, :].copy()
        b = y[..., 1, :]
        y[..., 0, :] = a + b
        y[..., 1, :] = a - b
        y = y.reshape(x.shape)
        h *= 2
    return y


def hadamard(n: int) -> np.ndarray:
    """Dense Sylvester Hadamard matrix H_N, int64 [n, n] (for tests and references)."""
    idx = np.arange(n)
    pc = np.vectorize(lambda v: bin(v).count("1"))(idx[:, None] & idx[None, :])
    return np.where(pc % 2 == 0, 1, -1).astype(np.int64)
