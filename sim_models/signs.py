"""The fixed random sign flip D applied before the FWHT (docs/FORMAT.md 3.2).

Random signs before a Hadamard transform make the rotation a randomized
Hadamard transform (as in OIQ / QuaRot), so a vector aligned with a Hadamard
row cannot concentrate into one output lane. The signs are a fixed function of
a 64-bit seed so that hardware can hold them as a constant.

Generator: SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014). Word w (w = 0, 1, ...) is the w-th output of
SplitMix64 started at state ``seed``; lane i is negated when bit (i mod 64) of
word (i div 64) is 1.
"""

from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1


def splitmix64(seed: int, count: int) -> list[int]:
    """First ``count`` outputs of SplitMix64 from state ``seed`` (Python ints)."""
    state = seed & _MASK64
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        out.append(z ^ (z >> 31))
    return out


def sign_mask(n: int, seed: int | None) -> np.ndarray:
    """Sign-flip mask of D.

    Args:
        n: number of lanes N (> 0).
        seed: SplitMix64 seed, or ``None`` for no flip.

    Returns:
        uint8 array [n]; 1 where lane i is negated, 0 where it is kept.
    """
    if seed is None:
        return np.zeros(n, dtype=np.uint8)
    words = splitmix64(seed, (n + 63) // 64)
    return np.array([(words[i // 64] >> (i % 64)) & 1 for i in range(n)], dtype=np.uint8)


def sign_mask_int(n: int, seed: int | None) -> int:
    """The same mask as one integer, bit i = 1 when lane i is negated (for RTL/CUDA)."""
    return sum(int(b) << i for i, b in enumerate(sign_mask(n, seed)))
