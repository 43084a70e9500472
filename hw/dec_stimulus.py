"""Stimulus and expected results for the read-path RTL (``KVDecompressor``).

Input payloads are ``codes | scales << N*b`` (code plane and scale plane as
little-endian integers); expected output payloads are the golden
``sim_models.decode`` results, lane k's 16-bit pattern at bits [16k, 16k+16).

Sets (all return ``(codes uint8 [V, N*b/8], scales uint8 [V, N/G])``):

* :func:`encoded_planes`: the golden encoding of fp16/bf16 vectors (what the
  epilogue writes: the round trip).
* :func:`random_planes`: uniformly random code planes (every field, including
  the code -2^(b-1) the encoder never writes) with random scale bytes, mixed
  per vector: all blocks alike, independent bytes over the whole range
  (0x00 .. 0xFF), and scale bytes within a few steps of each other.
* :func:`adversarial_planes`: Hadamard rows in the code domain (H / N maps them
  back to a one-hot times D: worst-case cancellation), all-zero blocks with
  scale 0x01, scale 0xFF with full codes (the largest values: saturation to
  +-65504 for fp16), the most extreme block-scale mixes (0x01 next to 0xFF, so
  the alignment spans all 30 binades), one-hot codes, ties of the final
  rounding (:func:`tie_planes`), scale byte 0x00 (the golden model's float64 signed zeros:
  -H rows give -0.0 before D) and every scale byte once.
"""

from __future__ import annotations

import numpy as np

from sim_models.codec import decode, decode_float, encode
from sim_models.fwht import hadamard
from sim_models.pack import pack_codes
from sim_models.params import FormatParams


def pack_planes(codes: np.ndarray, scales: np.ndarray, p: FormatParams) -> list[int]:
    """(code plane, scale plane) -> list of input payload ints."""
    planes = np.ascontiguousarray(np.concatenate([codes, scales], axis=1).astype(np.uint8))
    raw = planes.tobytes()
    step = planes.shape[1]
    return [int.from_bytes(raw[i * step:(i + 1) * step], "little") for i in range(planes.shape[0])]


def lanes_to_int(bits: np.ndarray) -> list[int]:
    """uint16 [V, N] -> list of ints (lane k at bits [16k, 16k+16))."""
    b = np.ascontiguousarray(bits.astype("<u2"))
    raw = b.tobytes()
    step = b.shape[1] * 2
    return [int.from_bytes(raw[i:i + step], "little") for i in range(0, len(raw), step)]


def int_to_lanes(v: int, n: int) -> np.ndarray:
    """One output payload int -> uint16 [N]."""
    return np.frombuffer(v.to_bytes(2 * n, "little"), dtype="<u2").astype(np.uint16)


def expected_outputs(codes: np.ndarray, scales: np.ndarray, p: FormatParams) -> list[int]:
    """Golden output payloads (``sim_models.decode``)."""
    return lanes_to_int(decode(codes, scales, p))


def encoded_planes(bits: np.ndarray, p: FormatParams):
    """Golden encoding of input vectors (uint16 [V, N])."""
    e = encode(np.ascontiguousarray(bits, dtype=np.uint16), p)
    return e.codes, e.scales


def _pack(c: np.ndarray, p: FormatParams) -> np.ndarray:
    return pack_codes(np.asarray(c, dtype=np.int64).reshape(-1, p.n), p.bits)


def random_planes(p: FormatParams, count: int, seed: int = 0):
    """Random code planes and scale bytes (see module docstring)."""
    rng = np.random.default_rng([seed, p.n, p.bits, 11])
    codes = rng.integers(0, 256, size=(count, p.code_bytes), dtype=np.uint8)
    kind = rng.integers(0, 3, size=(count, 1))
    same = np.repeat(rng.integers(0, 256, size=(count, 1)), p.n_blocks, axis=1)
    indep = rng.integers(0, 256, size=(count, p.n_blocks))
    base = rng.integers(8, 248, size=(count, 1))
    near = np.clip(base + rng.integers(-8, 9, size=(count, p.n_blocks)), 0, 255)
    scales = np.select([kind == 0, kind == 1], [same, indep], near).astype(np.uint8)
    return codes, scales


def adversarial_planes(p: FormatParams, seed: int = 0):
    """Structured worst cases (see module docstring)."""
    rng = np.random.default_rng([seed, p.n, p.bits, 12])
    n, nb, q = p.n, p.n_blocks, p.qmax
    lo = -(1 << (p.bits - 1))
    cs, ss = [], []

    def add(c, s):
        c = np.asarray(c, dtype=np.int64).reshape(-1, n)
        s = np.broadcast_to(np.asarray(s, dtype=np.uint8).reshape(-1, nb) if np.ndim(s) else
                            np.full((1, nb), s, dtype=np.uint8), (c.shape[0], nb))
        cs.append(_pack(c, p))
        ss.append(np.ascontiguousarray(s, dtype=np.uint8))

    z = np.zeros(n, dtype=np.int64)
    add(z, 0x01)                                         # all-zero blocks, scale 0x01
    add(z, 0x00)
    add(z, 0xFF)
    for s in (0x01, 0x08, 0x40, 0x7F, 0xA0, 0xFF):
        add(np.full(n, q), s)                            # full-scale codes
        add(np.full(n, lo), s)                           # the never-written -2^(b-1)
        add(np.where(np.arange(n) % 2, q, -q), s)
    h = hadamard(n)
    rows = rng.permutation(n)[: min(n, 32)]
    for s in (0x01, 0x38, 0xFF):
        add(h[rows] * q, s)                              # Hadamard rows: one-hot after H/N
        add(-h[rows], s)
    # scale 0x00: golden float64 signed zeros (-1 * 0.0 = -0.0); -H row r gives -0.0 at lane r
    add(-h[rows], 0x00)
    add(h[rows[:8]] * q, 0x00)
    # extreme block-scale mixes: block k at 0xFF, the others at 0x01 (and vice versa)
    for k in range(nb):
        s = np.full(nb, 0x01, dtype=np.uint8)
        s[k] = 0xFF
        add(rng.integers(lo, q + 1, size=(4, n)), s)
        add(np.full(n, q), s)
        add(h[rows[:8]] * q, s)
        s2 = np.full(nb, 0xFF, dtype=np.uint8)
        s2[k] = 0x01
        add(rng.integers(lo, q + 1, size=(4, n)), s2)
        s3 = np.full(nb, 0xFF, dtype=np.uint8)
        s3[k] = 0x00
        add(rng.integers(lo, q + 1, size=(2, n)), s3)
    # alternating extreme scales, random and sparse codes
    alt = np.where(np.arange(nb) % 2, 0xFF, 0x01).astype(np.uint8)
    add(rng.integers(lo, q + 1, size=(8, n)), alt)
    sparse = rng.integers(lo, q + 1, size=(8, n)) * (rng.random((8, n)) < 0.05)
    add(sparse, alt)
    add(sparse, rng.integers(0, 256, size=(8, nb)))
    # one-hot codes at assorted lanes and scales (outputs +-scale*c/N: subnormals)
    oh = np.zeros((8, n), dtype=np.int64)
    oh[np.arange(8), rng.integers(0, n, 8)] = rng.choice([1, -1, q, lo], 8)
    add(oh, 0x01)
    add(oh, 0x09)
    add(oh, rng.integers(0, 256, size=(8, nb)))
    # every scale byte once, random codes
    for s0 in range(0, 256, 8):
        add(rng.integers(lo, q + 1, size=(8, n)), np.arange(s0, s0 + 8, dtype=np.uint8)[:, None]
            .repeat(nb, axis=1))
    # neighbouring scale bytes (small exponent differences, near-ties after alignment)
    base = rng.integers(1, 250, size=(16, 1))
    add(rng.integers(lo, q + 1, size=(16, n)), base + rng.integers(0, 6, size=(16, nb)))
    c, s = tie_planes(p, 24, seed)
    cs.append(c)
    ss.append(s)
    return np.concatenate(cs), np.concatenate(ss)


def tie_lanes(codes: np.ndarray, scales: np.ndarray, p: FormatParams):
    """Bool [V, N]: the exact decoded value lies exactly halfway between two
    neighbours of the output type (a tie of round-to-nearest-even), and whether
    the lower neighbour is odd: (tie, odd)."""
    _, mb, bias = p.in_format
    v = np.abs(decode_float(codes, scales, p))
    _, e = np.frexp(v)
    ulp = np.ldexp(1.0, np.maximum(e - 1, 1 - bias) - mb)
    k = np.floor(v / ulp)
    tie = (v / ulp - k == 0.5) & (v > 0)
    return tie, (k % 2 == 1)


def tie_planes(p: FormatParams, count: int, seed: int = 0):
    """Vectors with rounding ties in their output (both odd and even lower
    neighbours): two blocks carrying a scaled Hadamard row r each (so output
    lane r is ``(a sig0 2^e0 + b sig1 2^e1) G / N``) with exponent gaps around
    the output precision, and for N = G full random codes; filtered with the
    golden model. (For N = G, b = 2 no tie exists: |S| < 2^11.)"""
    rng = np.random.default_rng([seed, p.n, p.bits, 13])
    n, g, nb, q = p.n, p.block, p.n_blocks, p.qmax
    lo = -(1 << (p.bits - 1))
    hg = hadamard(g)
    _, mb, _ = p.in_format
    found_c, found_s, n_odd, n_even = [], [], 0, 0
    for _ in range(200):
        m = 64
        c = np.zeros((m, n), dtype=np.int64)
        s = np.zeros((m, nb), dtype=np.int64)
        if nb >= 2:
            r = rng.integers(0, g, m)
            a = rng.integers(-q, q + 1, m)
            b = rng.choice(np.r_[np.arange(-q, 0), np.arange(1, q + 1)], m)
            k0, k1 = (rng.permuted(np.tile(np.arange(nb), (m, 1)), axis=1)[:, :2].T)
            c[np.arange(m)[:, None], k0[:, None] * g + np.arange(g)] = a[:, None] * hg[r]
            c[np.arange(m)[:, None], k1[:, None] * g + np.arange(g)] = b[:, None] * hg[r]
            s1 = rng.integers(0x10, 0xE0, m)
            gap = rng.integers(mb - 5, mb + 4, m)          # exponent gap in binades
            s[:] = s1[:, None]
            s[np.arange(m), k0] = np.clip(s1 + 8 * gap, 1, 255)
            s[np.arange(m), k1] = s1
        else:
            # near-full Hadamard rows (|sum| ~ N q), a few lanes moved by one: odd sums
            r = rng.integers(0, n, m)
            c = q * hadamard(n)[r] * rng.choice([-1, 1], (m, 1))
            c = c - (rng.random((m, n)) < 0.05) * np.sign(c)
            c = np.where(rng.random((m, n)) < 0.02, np.where(c < 0, lo, c), c)
            s[:] = rng.integers(0x08, 0xF8, (m, 1))
        cp = _pack(c, p)
        sp = s.astype(np.uint8)
        tie, odd = tie_lanes(cp, sp, p)
        for i in np.flatnonzero(tie.any(axis=1)):
            has_odd, has_even = (tie[i] & odd[i]).any(), (tie[i] & ~odd[i]).any()
            if (has_odd and n_odd < count // 2) or (has_even and n_even < count - count // 2):
                found_c.append(cp[i])
                found_s.append(sp[i])
                n_odd += has_odd
                n_even += has_even
        if n_odd >= count // 2 and n_even >= count - count // 2:
            break
    if not found_c:
        return np.zeros((0, p.code_bytes), np.uint8), np.zeros((0, nb), np.uint8)
    return np.array(found_c, dtype=np.uint8), np.array(found_s, dtype=np.uint8)
