"""Stimulus and expected results for the RTL of the write path (tests, cocotb).

``make_vectors`` builds a mix of directed and random fp16/bf16 bit-pattern
vectors; ``pack_input`` / ``expected_payloads`` convert between NumPy arrays and
the integer stream payloads of :class:`hw.epilogue.KVEpilogue`.
"""

from __future__ import annotations

import numpy as np

from sim_models.codec import encode
from sim_models.fwht import hadamard
from sim_models.params import FormatParams
from sim_models.signs import sign_mask


def pack_input(bits: np.ndarray) -> list[int]:
    """uint16 [V, N] -> list of input payload ints (lane k at bits [16k, 16k+16))."""
    bits = np.ascontiguousarray(bits, dtype="<u2")
    return [int.from_bytes(row.tobytes(), "little") for row in bits]


def expected_payloads(bits: np.ndarray, p: FormatParams) -> list[int]:
    """Golden output payloads: codes | scales << N*b | flags << (N*b + 8*N/G);
    mode asym: codes | scales | zeros << (N*b + 8*N/G) | flags << (N*b + 16*N/G)."""
    e = encode(np.ascontiguousarray(bits, dtype=np.uint16), p)
    cw = p.n * p.bits
    sw = 8 * p.n_blocks
    zw = 8 * p.zero_bytes
    zeros = e.zeros if zw else [None] * len(e.flags)
    out = []
    for c, s, z, f in zip(e.codes, e.scales, zeros, e.flags):
        out.append(int.from_bytes(c.tobytes(), "little")
                   | int.from_bytes(s.tobytes(), "little") << cw
                   | (int.from_bytes(z.tobytes(), "little") << (cw + sw) if zw else 0)
                   | int(f) << (cw + sw + zw))
    return out


def split_payload(v: int, p: FormatParams) -> tuple[int, int, int]:
    """Output payload int -> (codes, scales, flags) ints (asym: see :func:`zeros_of`)."""
    cw = p.n * p.bits
    sw = 8 * p.n_blocks
    zw = 8 * p.zero_bytes
    return v & ((1 << cw) - 1), (v >> cw) & ((1 << sw) - 1), v >> (cw + sw + zw)


def zeros_of(v: int, p: FormatParams) -> int:
    """The zero-point plane of an output payload int (mode asym; 0 bits otherwise)."""
    cw = p.n * p.bits
    sw = 8 * p.n_blocks
    return (v >> (cw + sw)) & ((1 << (8 * p.zero_bytes)) - 1)


def _float_bits(vals: np.ndarray, p: FormatParams) -> np.ndarray:
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
            vecs.append(_float_bits(vals, p))
    # one-hot lanes of assorted magnitudes
    for k, c in ((0, 1.0), (n // 3, -7.5), (n - 1, 1000.0)):
        vals = np.zeros(n); vals[k] = c
        vecs.append(_float_bits(vals, p))
    # values that round up at the BFP alignment (all-ones significands)
    v = np.full(n, (((1 << e_bits) >> 1) - 2) << exp_sh | ((1 << m_bits) - 1), np.uint16)
    v[0] = ((1 << e_bits) >> 1) << exp_sh
    vecs.append(v)
    return np.array(vecs, dtype=np.uint16)


def random_vectors(p: FormatParams, count: int, rng: np.random.Generator) -> np.ndarray:
    """Random vectors: Gaussian with outlier lanes at random scales, raw random
    bit patterns (NaN/inf included), and narrow exponent ranges."""
    n = p.n
    out = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            scale = 2.0 ** rng.integers(-20, 14)
            vals = rng.standard_normal(n) * scale
            vals[rng.integers(0, n, 2)] *= 30
            out.append(_float_bits(np.clip(vals, -65504, 65504) if p.dtype == "fp16" else vals, p))
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
            out.append(_float_bits(np.clip(vals, -65504, 65504) if p.dtype == "fp16" else vals, p))
    return np.array(out, dtype=np.uint16).reshape(-1, n)


def make_vectors(p: FormatParams, count: int, seed: int = 0) -> np.ndarray:
    """Directed vectors followed by random ones; ``count`` random vectors."""
    rng = np.random.default_rng(seed)
    return np.concatenate([directed_vectors(p, rng), random_vectors(p, count, rng)])


def tie_vectors(p: FormatParams, rng: np.random.Generator, count: int = 48) -> np.ndarray:
    """Vectors whose FWHT output sits exactly on the quantizer's decision points.

    Each vector is x = (A H[r] + T H[r+1]) * 2^s / N (after the sign flip D), so
    the FWHT output is exactly A 2^s in lane r and T 2^s in lane r+1 (same block),
    zero elsewhere. With K = k / 2^ks the max rule's scale units
    (``hw.scale_select.k_units``) and sig a significand of ``p.scale``:
    A = K sig 2^t, the block maximum of an exact scale value (rule ``up``, and
    ``nearest`` as the value is its own nearest), with T = a_j sig 2^t / 2^f a
    lane threshold of that scale (``hw.thresholds.code_coefs``), or one unit
    above/below it; or A = K (2 sig + 1) 2^t, exactly on the midpoint of two
    scale values (rule ``nearest``: ties go up), +-0/1 unit; or small maxima
    (subnormal scale bytes). s is random, so the scale exponents range over
    subnormal, normal and (bf16) saturating bytes. Exact when the input type
    holds A +- T (fp16: 11 significant bits; bf16: 8, so bf16 uses
    significands with few bits and lone spikes for the midpoints) and the BFP
    keeps them (mant_bits >= 12); otherwise still valid stimulus.

    Returns:
        uint16 [count, N] fp16/bf16 bit patterns (``p.dtype``).
    """
    from hw.scale_select import k_units              # noqa: PLC0415 (hw imports stimulus)
    from hw.thresholds import code_coefs             # noqa: PLC0415
    from sim_models.minifloat import scale_encoding  # noqa: PLC0415

    n = p.n
    k, ks = k_units(p.mode, p.bits)
    coefs, f = code_coefs(p.mode, p.bits)
    nm = 1 << scale_encoding(p.scale).mant_bits
    sh = max(f, ks)                       # A and T as integers: common factor 2^-sh
    h = hadamard(n).astype(np.float64)
    flip = np.where(sign_mask(n, p.sign_seed) == 1, -1.0, 1.0)
    s_lo, s_hi = (-12, 6) if p.dtype == "fp16" else (-20, 16)
    out = []
    for i in range(count):
        kind = i % 4
        few_bits = (p.dtype == "bf16" and kind == 0) or ks > 0
        sig = int(rng.choice((nm, nm + nm // 2)) if few_bits else rng.integers(nm, 2 * nm))
        if p.dtype == "bf16" and kind == 2:       # K (2 sig + 1) within 8 significant bits
            sig = int(rng.choice([sg for sg in (nm, nm + 1) if k * (2 * sg + 1) < 256] or [nm]))
        cj = coefs[int(rng.integers(0, len(coefs)))]
        if kind == 0:                       # block max exactly K * scale, lane on a threshold
            a = (k * sig) << (sh - ks)
            t = (cj * sig) << (sh - f)
        elif kind == 1:                     # lane one unit below / above a threshold
            a = (k * sig) << (sh - ks + 1)
            t = ((cj * sig) << (sh - f + 1)) + int(rng.choice((-1, 1)))
        elif kind == 2:                     # block max exactly on a scale midpoint (+-0/1 unit)
            a = 2 * k * (2 * sig + 1) + int(rng.choice((-1, 0, 0, 0, 0, 1)))
            t = 0 if p.dtype == "bf16" else int(rng.integers(0, a + 1))
        else:                               # subnormal scale bytes: small maxima
            a = int(rng.integers(1, 32)) * k
            t = int(rng.integers(0, a + 1))
        r = 2 * int(rng.integers(0, n // 2))
        s = int(rng.integers(s_lo, s_hi) if kind != 3 else rng.integers(s_lo - 8, s_lo + 4))
        vals = (a * h[r] + t * h[r + 1]) * flip * (2.0 ** (s - sh)) / n
        out.append(_float_bits(vals, p))
    return np.array(out, dtype=np.uint16).reshape(-1, n)
