"""Gaussian Lloyd-Max quantizer constants for mode ``lloydmax`` (fixed point).

One concept: the level table. After the randomized Hadamard rotation the lanes
of a block are close to Gaussian, for which the minimum-MSE scalar quantizer
with 2^b levels is the Lloyd-Max quantizer (J. Max, "Quantizing for minimum
distortion", IRE Trans. Inf. Theory 6(1), 1960; S. P. Lloyd, "Least squares
quantization in PCM", 1957/1982). Its levels, in units of the standard
deviation sigma, rounded to LEVEL_FRAC_BITS = 8 fractional bits:

    b = 2:  +-0.4528  +-1.5104                          -> 116, 387
    b = 3:  +-0.2451  +-0.7560  +-1.3439  +-2.1519      -> 63, 194, 344, 551
    b = 4:  +-0.1284 ... +-2.7326                       -> 33, 99, 168, 241, 322, 414, 530, 700

(published table: Max 1960, Table I). The decision thresholds are the exact
midpoints of the *rounded* levels, so encoding is nearest-level to the table
that decoding uses: threshold j (between positive levels j-1 and j) is
``(L[j-1] + L[j]) / 2^(LEVEL_FRAC_BITS + 1)`` sigma units.

:func:`gaussian_lloyd_max` recomputes the table from the Gaussian density
(Lloyd's iteration, pure Python) so the constants are checked, not trusted.
"""

from __future__ import annotations

import math

import numpy as np

#: Fractional bits of the level constants (levels are integers / 2^8).
LEVEL_FRAC_BITS = 8

#: Positive half of the level table per code width b, ascending (the negative
#: half mirrors it): level m of a block with scale s is ``LEVELS[b][m] * s / 256``.
LEVELS = {
    2: (116, 387),
    3: (63, 194, 344, 551),
    4: (33, 99, 168, 241, 322, 414, 530, 700),
}


def levels(bits: int) -> np.ndarray:
    """int64 [2^(b-1)] positive levels (units 2^-8 of the scale), ascending.

    Raises:
        ValueError: ``bits`` not in {2, 3, 4}.
    """
    if bits not in LEVELS:
        raise ValueError(f"bits (b) must be in {{2, 3, 4}} for lloydmax, got {bits}")
    return np.array(LEVELS[bits], dtype=np.int64)


def threshold_sums(bits: int) -> np.ndarray:
    """int64 [2^(b-1) - 1]: ``L[j-1] + L[j]`` for j = 1 .. 2^(b-1)-1 (units 2^-9 of the scale)."""
    lv = levels(bits)
    return lv[:-1] + lv[1:]


def _phi(x: float) -> float:
    return math.exp(-x * x / 2) / math.sqrt(2 * math.pi) if math.isfinite(x) else 0.0


def _cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2))) if math.isfinite(x) else (1.0 if x > 0 else 0.0)


def gaussian_lloyd_max(n_levels: int, iterations: int = 5000) -> list[float]:
    """Positive levels of the n-level Lloyd-Max quantizer for N(0, 1), ascending.

    Lloyd's fixed point: thresholds are midpoints of adjacent levels, each
    level is the conditional mean E[X | X in its cell] (closed form for the
    Gaussian: (phi(a) - phi(b)) / (Phi(b) - Phi(a))). ``n_levels`` even.
    """
    half = n_levels // 2
    lv = [0.5 + i for i in range(half)]
    for _ in range(iterations):
        t = [0.0] + [(lv[i] + lv[i + 1]) / 2 for i in range(half - 1)] + [math.inf]
        lv = [(_phi(t[i]) - _phi(t[i + 1])) / (_cdf(t[i + 1]) - _cdf(t[i])) for i in range(half)]
    return lv
