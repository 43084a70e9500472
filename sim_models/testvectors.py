"""Shared test-vector sets for the RTL and GPU checks (docs/FORMAT.md 6).

Every set is a deterministic function of (name, N, count, seed), so the RTL
testbenches and the CUDA tests draw the same inputs; :func:`checksum` hashes a
set together with its golden encoding so a silent change of either shows up.

Sets (uint16 fp16 bit patterns, [count, N]):
    random     mixed real-valued distributions: Gaussian with a random per-vector
               scale over 2^-14 .. 2^12, heavy-tailed (Student-t) lanes,
               channel outliers, and uniformly random bit patterns (which cover
               NaN, +-inf and subnormals).
    adversarial structured worst cases: zeros, +-0, all fp16 max, alternating
               +-max, single spikes (one lane, any magnitude), Hadamard rows
               (after the sign flip D, so all energy lands in one FWHT lane: the
               worst-case bit growth), subnormal-only vectors, NaN/inf mixed into
               normal data, smallest normals, exponent spread across the vector,
               and inputs sitting exactly on quantizer thresholds.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .codec import encode
from .fwht import hadamard
from .params import FormatParams
from .signs import sign_mask

FP16_MAX = np.float16(65504.0)
#: Version of the vector generators; bump when any set changes.
VECTORS_VERSION = 1
SETS = ("random", "adversarial")


def random_vectors(n: int, count: int, seed: int = 0) -> np.ndarray:
    """Mixed random fp16 vectors, uint16 [count, n] (see module docstring)."""
    rng = np.random.default_rng([seed, n, 1])
    kind = rng.integers(0, 4, size=(count, 1))
    scale = np.exp2(rng.uniform(-14, 12, size=(count, 1)))
    gauss = rng.standard_normal((count, n)) * scale
    heavy = rng.standard_t(2, size=(count, n)) * scale
    outl = gauss * np.where(rng.random((count, n)) < 0.03, rng.uniform(8, 64, (count, n)), 1)
    with np.errstate(over="ignore"):
        vals = np.select([kind == 0, kind == 1, kind == 2], [gauss, heavy, outl], gauss)
        bits = np.clip(vals, -65504, 65504).astype(np.float16).view(np.uint16)
    raw = rng.integers(0, 1 << 16, size=(count, n), dtype=np.uint16)
    return np.where(kind == 3, raw, bits).astype(np.uint16)


def adversarial_vectors(n: int, seed: int = 0, p: FormatParams | None = None) -> np.ndarray:
    """Structured worst-case fp16 vectors, uint16 [count, n] (count depends on n)."""
    p = p or FormatParams(n=n, block=min(64, n))
    rng = np.random.default_rng([seed, n, 2])
    f = np.float16
    out: list[np.ndarray] = []

    def add(v):
        out.append(np.asarray(v, dtype=np.float16).reshape(-1, n).view(np.uint16))

    add(np.zeros(n))
    add(np.full(n, -0.0))
    for v in (FP16_MAX, -FP16_MAX, f(1.0), f(6.1035e-05), f(5.96e-08), f(-5.96e-08)):
        add(np.full(n, v))
    add(np.where(np.arange(n) % 2 == 0, FP16_MAX, -FP16_MAX))
    # single spikes: every lane once at fp16 max, plus random magnitudes
    spikes = np.zeros((n, n), dtype=np.float16)
    spikes[np.arange(n), np.arange(n)] = np.where(np.arange(n) % 2, FP16_MAX, -FP16_MAX)
    add(spikes)
    mags = np.exp2(rng.uniform(-24, 15.99, size=n)).astype(np.float16)
    spikes = np.zeros((n, n), dtype=np.float16)
    spikes[np.arange(n), rng.permutation(n)] = mags
    add(spikes)
    # Hadamard rows pre-multiplied by D: D*x = H row -> FWHT output is N at one lane
    d = np.where(sign_mask(n, p.sign_seed) == 1, -1, 1)
    rows = hadamard(n)[rng.permutation(n)[: min(n, 64)]] * d
    for amp in (FP16_MAX, f(1.0), f(6.1035e-05)):
        add(rows * amp)
    # subnormal-only vectors and exponent spread
    add((rng.integers(-1023, 1024, size=(16, n)) * 2.0 ** -24))
    spread = np.exp2(rng.integers(-24, 16, size=(16, n)).astype(np.float64))
    add(np.clip(spread * rng.choice([-1, 1], size=(16, n)), -65504, 65504))
    # NaN / inf mixed into normal data
    base = rng.standard_normal((24, n))
    base[np.arange(24), rng.integers(0, n, 24)] = np.tile([np.nan, np.inf, -np.inf], 8)
    add(base)
    all_special = np.tile(np.array([np.nan, np.inf, -np.inf, 0.0]), n // 4)
    add(all_special)
    add(np.full(n, np.nan))
    add(np.full(n, np.inf))
    # threshold ties: small-integer vectors whose FWHT outputs land on (2j-1)/2 * scale
    ties = rng.integers(-3, 4, size=(64, n)).astype(np.float64) * d
    ties[:, 0] = 3 * d[0]
    add(ties)
    add(ties * 2.0 ** -20)
    return np.concatenate(out, axis=0)


def vector_set(name: str, n: int, count: int = 1000, seed: int = 0) -> np.ndarray:
    """One named set (``"random"`` or ``"adversarial"``), uint16 [*, n]."""
    if name == "random":
        return random_vectors(n, count, seed)
    if name == "adversarial":
        return adversarial_vectors(n, seed)
    raise ValueError(f"unknown vector set {name!r}; choose from {SETS}")


def checksum(bits: np.ndarray, p: FormatParams) -> str:
    """SHA-256 (hex, first 16 chars) over the inputs and their golden encoding."""
    e = encode(bits, p)
    h = hashlib.sha256()
    for a in (bits, e.codes, e.scales, e.flags):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


#: Pinned checksums of the sets (500 random vectors; default params with G = 64)
#: under format version 1 and VECTORS_VERSION 1. A change here is a format change.
CHECKSUMS = {
    ("random", 64): "1bf4b1bfd3bc7698",
    ("random", 128): "30f71e62d4b8145f",
    ("random", 256): "fdba45e0316bc307",
    ("adversarial", 64): "37ef2e0a6df96dd4",
    ("adversarial", 128): "b0ecd209dd47942c",
    ("adversarial", 256): "96312a1af3834de7",
}
