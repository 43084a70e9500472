"""Input vector sets (uint16 fp16/bf16 bit patterns [V, N]) and golden encoder words.

Built on :mod:`sim_models.testvectors` (the pinned spec sets ``random`` and
``adversarial``):

* :func:`make_vectors` = :func:`directed_vectors` + :func:`random_patterns`: the
  amaranth.sim tests' own corner cases and random mix, for any ``p.dtype``;
* :func:`real_vectors`: the SmolLM2-135M K/V capture (``verif/data/smollm2_kv.npz``,
  keys ``k``, ``v``: uint16 [layers, tokens, kv_heads, head_dim]); N == head_dim:
  every head vector of K then V; N == 2*head_dim: adjacent heads (h, h+1) concatenated;
* :func:`raw_vectors`: uniformly random 16-bit patterns;
* :func:`mixed_bits`: a fast large mixed set (Gaussian, heavy-tailed, spikes, sparse,
  raw bits, salted specials) for the GPU kernels;
* :func:`get_set`: a set by name (the cocotb benches).

:func:`encoder_rows` gives the golden ``KVEncoder`` output words
(:func:`sim_models.wire.encoder_output`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim_models import wire
from sim_models.codec import Trace, encode, encoded
from sim_models.fwht import hadamard
from sim_models.params import FormatParams
from sim_models.signs import sign_mask
from sim_models.testvectors import adversarial_vectors, random_vectors

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "verif" / "data" / "smollm2_kv.npz"


def encoder_rows(bits: np.ndarray, p: FormatParams,
                 trace: Trace | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Golden ``KVEncoder`` output words of uint16 [V, N] inputs, as byte rows
    (:func:`sim_models.wire.encoder_output_rows`), and their flags uint8 [V]. ``trace``:
    their ``sim_models.codec.encode_trace`` if already computed."""
    e = (encode(np.ascontiguousarray(bits, dtype=np.uint16), p) if trace is None
         else encoded(trace, p))
    flags = e.flags.astype(np.uint8)
    return wire.encoder_output_rows(p, e.codes, e.scales, flags, e.zeros), flags


def float_bits(vals: np.ndarray, p: FormatParams) -> np.ndarray:
    """float64 values -> uint16 patterns of ``p.dtype`` (fp16 RNE; bf16 truncated)."""
    if p.dtype == "fp16":
        return np.asarray(vals, dtype=np.float64).astype(np.float16).view(np.uint16)
    f32 = np.asarray(vals, dtype=np.float64).astype(np.float32).view(np.uint32)
    return (f32 >> 16).astype(np.uint16)   # truncation is fine for stimulus


def directed_vectors(p: FormatParams, rng: np.random.Generator) -> np.ndarray:
    """Corner cases: zeros, max finite, inf/NaN, subnormals, Hadamard rows, ..."""
    n = p.n
    e_bits, m_bits, _ = p.in_format
    exp_sh = m_bits
    max_fin = ((1 << e_bits) - 2) << exp_sh | ((1 << m_bits) - 1)
    inf = ((1 << e_bits) - 1) << exp_sh
    nan = inf | 1
    vecs = []
    z = np.zeros(n, np.uint16)
    vecs.append(z.copy())                                  # +0
    vecs.append(np.full(n, 0x8000, np.uint16))             # -0
    vecs.append(np.full(n, max_fin, np.uint16))            # all +max
    v = np.full(n, max_fin, np.uint16)
    v[1::2] |= 0x8000
    vecs.append(v)                                         # alternating +-max
    v = np.full(n, max_fin | 0x8000, np.uint16)
    vecs.append(v)                                         # all -max
    v = z.copy(); v[3] = inf; vecs.append(v)               # +inf
    v = rng.integers(0, 0x3C00, n).astype(np.uint16); v[5] = inf | 0x8000
    vecs.append(v)                                         # -inf in random data
    v = rng.integers(0, 0x3C00, n).astype(np.uint16); v[0] = nan
    vecs.append(v)                                         # NaN
    v = z.copy(); v[:] = nan | 0x8000 | 0x55; vecs.append(v)  # all NaN (negative payload)
    v = z.copy(); v[0] = nan; v[1] = inf; vecs.append(v)   # NaN + inf
    vecs.append(np.full(n, 1, np.uint16))                  # smallest subnormal
    vecs.append(rng.integers(0, 1 << m_bits, n).astype(np.uint16)
                | (rng.integers(0, 2, n).astype(np.uint16) << 15))  # random subnormals
    v = z.copy(); v[n - 1] = 1; vecs.append(v)             # one tiny lane
    v = z.copy(); v[n - 2] = max_fin; v[1] = 1; vecs.append(v)  # huge + tiny (shift > M)
    # Hadamard rows: after the sign flip the vector is c * H[r], so the FWHT puts
    # all the energy (N * c) into lane r
    h = hadamard(n)
    mask = sign_mask(n, p.sign_seed).astype(np.int64)
    for r in (0, 1, n // 2 + 3, n - 1):
        for c in (1.0, 0.5, 3.0, 65504.0 if p.dtype == "fp16" else 2.0 ** 120, 2.0 ** -20):
            vals = c * h[r] * np.where(mask == 1, -1, 1)
            vecs.append(float_bits(vals, p))
    # one-hot lanes of assorted magnitudes
    for k, c in ((0, 1.0), (n // 3, -7.5), (n - 1, 1000.0)):
        vals = np.zeros(n); vals[k] = c
        vecs.append(float_bits(vals, p))
    # values that round up at the BFP alignment (all-ones significands)
    v = np.full(n, (((1 << e_bits) >> 1) - 2) << exp_sh | ((1 << m_bits) - 1), np.uint16)
    v[0] = ((1 << e_bits) >> 1) << exp_sh
    vecs.append(v)
    return np.array(vecs, dtype=np.uint16)


def random_patterns(p: FormatParams, count: int, rng: np.random.Generator) -> np.ndarray:
    """Random vectors of ``p.dtype`` (the RTL tests' own set): Gaussian with outlier lanes at random scales, raw random
    bit patterns (NaN/inf included), and narrow exponent ranges."""
    n = p.n
    out = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            scale = 2.0 ** rng.integers(-20, 14)
            vals = rng.standard_normal(n) * scale
            vals[rng.integers(0, n, 2)] *= 30
            out.append(float_bits(np.clip(vals, -65504, 65504) if p.dtype == "fp16" else vals, p))
        elif kind == 1:
            out.append(rng.integers(0, 1 << 16, n).astype(np.uint16))
        elif kind == 2:
            # exponents within a few of each other
            e_bits, m_bits, _ = p.in_format
            e0 = int(rng.integers(1, (1 << e_bits) - 1))
            ex = np.clip(e0 - rng.integers(0, 4, n), 0, (1 << e_bits) - 2)
            fr = rng.integers(0, 1 << m_bits, n)
            sg = rng.integers(0, 2, n)
            out.append((sg << 15 | ex << m_bits | fr).astype(np.uint16))
        else:
            vals = rng.uniform(-1, 1, n) * 2.0 ** rng.integers(-24, 16)
            out.append(float_bits(np.clip(vals, -65504, 65504) if p.dtype == "fp16" else vals, p))
    return np.array(out, dtype=np.uint16).reshape(-1, n)


def make_vectors(p: FormatParams, count: int, seed: int = 0) -> np.ndarray:
    """Directed vectors followed by random ones; ``count`` random vectors."""
    rng = np.random.default_rng(seed)
    return np.concatenate([directed_vectors(p, rng), random_patterns(p, count, rng)])


def real_vectors(n: int, path: Path | str = FIXTURE, limit: int | None = None) -> np.ndarray:
    """Real K/V vectors from the capture, uint16 [V, n] (see module docstring).

    ``limit`` takes an evenly strided subsample of at most ``limit`` vectors
    (deterministic), used by quick runs.

    Raises:
        FileNotFoundError: the fixture is missing.
        ValueError: unexpected keys, dtype or shape, or n not in {hd, 2*hd}.
    """
    path = Path(path)
    with np.load(path, allow_pickle=False) as z:
        if "k" not in z or "v" not in z:
            raise ValueError(f"{path}: expected keys 'k' and 'v', got {sorted(z.files)}")
        k, v = z["k"], z["v"]
    for name, a in (("k", k), ("v", v)):
        if a.dtype != np.uint16 or a.ndim != 4:
            raise ValueError(f"{path}: {name} must be uint16 [layers, tokens, heads, head_dim], "
                             f"got {a.dtype} {list(a.shape)}")
    hd, heads = k.shape[-1], k.shape[-2]
    parts = []
    for a in (k, v):
        if n == hd:
            parts.append(a.reshape(-1, hd))
        elif n == 2 * hd and heads >= 2:
            for h in range(heads - 1):
                parts.append(np.concatenate([a[..., h, :], a[..., h + 1, :]], axis=-1).reshape(-1, n))
        else:
            raise ValueError(f"real vectors: N={n} is neither head_dim={hd} nor 2*head_dim")
    out = np.ascontiguousarray(np.concatenate(parts, axis=0))
    if limit is not None and out.shape[0] > limit:
        idx = np.linspace(0, out.shape[0] - 1, limit).round().astype(np.int64)
        out = out[idx]
    return out


def fp16_to_bf16(bits: np.ndarray) -> np.ndarray:
    """fp16 bit patterns -> bf16 bit patterns of the same values (RNE; NaN stays NaN)."""
    f32 = bits.view(np.float16).astype(np.float32).view(np.uint32).astype(np.uint64)
    r = (f32 + 0x7FFF + ((f32 >> 16) & 1)) >> 16
    nan = np.isnan(bits.view(np.float16))
    return np.where(nan, 0x7FC0 | ((f32 >> 16) & 0x8000), r).astype(np.uint16)


def raw_vectors(n: int, count: int, seed: int = 0) -> np.ndarray:
    """Uniformly random 16-bit patterns, uint16 [count, n] (every special value;
    for bf16 also huge magnitudes that saturate the scale: FLAG_SAT)."""
    rng = np.random.default_rng([seed, n, 3])
    return rng.integers(0, 1 << 16, size=(count, n), dtype=np.uint16)


def get_set(name: str, n: int, count: int | None = None, seed: int = 0,
            fixture: Path | str | None = FIXTURE, dtype: str = "fp16",
            p: FormatParams | None = None) -> np.ndarray:
    """One vector set by name: ``random`` (count vectors), ``adversarial``, ``real``, ``raw``,
    ``coverage`` (``kvtest.coverage.coverage_vectors`` of ``p``: directed stimulus for the
    coverage bins; needs ``p``).

    For ``adversarial`` and ``real`` a ``count`` limits the set (``None``: all).
    For ``dtype == "bf16"`` the fp16 sets are converted to bf16 patterns of the
    same values (``raw`` stays raw bits).
    """
    if name == "random":
        out = random_vectors(n, 1000 if count is None else count, seed)
    elif name == "adversarial":
        out = adversarial_vectors(n, seed)
        out = out if count is None else out[:count]
    elif name == "real":
        out = real_vectors(n, FIXTURE if fixture is None else fixture, count)
    elif name == "raw":
        return raw_vectors(n, 1000 if count is None else count, seed)
    elif name == "coverage":
        from .coverage import coverage_vectors   # (coverage imports this module)
        if p is None or p.n != n or p.dtype != dtype:
            raise ValueError("set 'coverage' needs the config's FormatParams p (same n and dtype)")
        out = coverage_vectors(p, seed)
        return out if count is None else out[:count]
    else:
        raise ValueError(f"unknown vector set {name!r}")
    return fp16_to_bf16(out) if dtype == "bf16" else out


def mixed_bits(n: int, count: int, seed: int, dtype: str = "fp16") -> np.ndarray:
    """uint16 [count, n] fp16/bf16 patterns, a fast mixed set: scaled Gaussians, heavy
    tails, spikes, sparse, random bit patterns, special values salted in."""
    rng = np.random.default_rng([seed, n, 99])
    kind = rng.integers(0, 6, size=(count, 1))
    lo, hi = (-26, 17) if dtype == "fp16" else (-140, 130)
    sc = np.exp2(rng.uniform(lo, hi, size=(count, 1)))
    g = rng.standard_normal((count, n)) * sc
    heavy = rng.standard_t(1.5, size=(count, n)) * sc
    spikes = np.where(rng.random((count, n)) < 0.02, g * 100, g * 1e-3)
    sparse = np.where(rng.random((count, n)) < 0.1, g, 0.0)
    vals = np.select([kind == 0, kind == 1, kind == 2, kind == 3], [g, heavy, spikes, sparse], g)
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            bits = np.clip(vals, -65504, 65504).astype(np.float16).view(np.uint16)
    else:
        with np.errstate(over="ignore"):
            f32 = vals.astype(np.float32)
        bits = (f32.view(np.uint32) >> 16).astype(np.uint16)  # truncation: any bf16 pattern is valid
    raw = rng.integers(0, 1 << 16, size=(count, n), dtype=np.uint16)
    out = np.where(kind >= 4, raw, bits).astype(np.uint16)
    # salt special values into some vectors
    m = rng.random(count) < 0.05
    idx = rng.integers(0, n, size=count)
    special = np.array([0x7E00, 0x7C00, 0xFC00, 0x0001, 0x8000] if dtype == "fp16"
                       else [0x7FC0, 0x7F80, 0xFF80, 0x0001, 0x8000], dtype=np.uint16)
    out[np.flatnonzero(m), idx[m]] = special[rng.integers(0, len(special), m.sum())]
    return out


def bf16_tiny_bits(n: int, count: int, mant_bits: int, seed: int = 0) -> np.ndarray:
    """bf16 patterns (uint16 [count, n]) where subnormal lanes matter: all-subnormal vectors with random
    signs, and vectors whose largest exponent field is near M - 1 (u = -126 +- a few) with subnormal
    and tiny normal lanes. (With -ftz=true a float multiply would flush the subnormal lanes.)"""
    rng = np.random.default_rng([seed, n, mant_bits, 7])
    sub = rng.integers(0, 128, size=(count, n)) | (rng.integers(0, 2, size=(count, n)) << 15)
    out = sub.copy()
    half = count // 2
    emax = rng.integers(max(1, mant_bits - 4), mant_bits + 3, size=half)
    lane = rng.integers(0, n, size=half)
    out[np.arange(half), lane] = (emax << 7) | rng.integers(0, 128, size=half) | (rng.integers(0, 2, size=half) << 15)
    third = count // 3   # a few tiny normal lanes too
    e2 = rng.integers(1, 3, size=(third, n))
    mix = rng.random((third, n)) < 0.2
    out[:third] = np.where(mix, (e2 << 7) | (out[:third] & 0x807F), out[:third])
    return out.astype(np.uint16)
