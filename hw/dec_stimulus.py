"""Stimulus and expected results for the read-path RTL (``KVDecompressor``).

Input payloads are ``codes | scales << N*b [| zeros << (N*b + 8*N/G)]`` (code
plane, scale plane and, for mode ``asym`` only, the zero-point plane, as
little-endian integers; ``hw.decompressor.input_fields``); expected output
payloads are the golden ``sim_models.codec.decode`` results, lane k's 16-bit
pattern at bits [16k, 16k+16).

Sets (return ``(codes uint8 [V, N*b/8], scales uint8 [V, N/G])``, and for mode
``asym`` ``(codes, scales, zeros uint8 [V, N/G])``):

* :func:`encoded_planes`: the golden encoding of fp16/bf16 vectors (what the
  epilogue writes: the round trip).
* :func:`random_planes`: uniformly random code planes (every field, including
  the midtread code -2^(b-1) the encoder never writes) with random scale bytes
  of the encoding (:func:`scale_bytes`), mixed per vector: all blocks alike,
  independent bytes over the whole range, and scale bytes within a few steps of
  each other; asym: zero points mostly in 0 .. 2^b - 1 (what the encoder
  writes), a quarter over the whole byte range.
* :func:`adversarial_planes`: Hadamard rows in the level domain (H / N maps them
  back to a one-hot times D: worst-case cancellation), all-zero blocks (midtread)
  with the smallest scale, the largest scale with full codes (the largest values:
  saturation to +-65504 for fp16), the most extreme block-scale mixes (smallest
  next to largest, so the alignment spans every binade of the encoding),
  one-hot codes, ties of the final rounding (:func:`tie_planes`), scale byte 0x00
  (the "v1" preset only: the golden model's float64 signed zeros, -H rows
  give -0.0 before D) and every scale byte once.

Scale bytes: the sets use the encoding's positive finite bytes
(``ScaleEncoding.bytes``), plus byte 0x00 (a zero scale) for the "v1" preset's
quantizer.
"""

from __future__ import annotations

import numpy as np

from sim_models.codec import decode, decode_float, encode
from sim_models.fwht import hadamard
from sim_models.minifloat import scale_encoding
from sim_models.pack import pack_codes
from sim_models.params import FormatParams


def scale_bytes(p: FormatParams) -> np.ndarray:
    """uint8 [K]: the scale bytes the sets draw from for ``p``, ascending by value
    (``ScaleEncoding.bytes``, with 0x00 in front for the "v1" preset)."""
    if p.quantizer_preset == "v1":
        return np.arange(256, dtype=np.uint8)
    return scale_encoding(p.scale).bytes


def _sb(p: FormatParams, nominal) -> np.ndarray:
    """Map nominal ue5m3 bytes (1 .. 255) to the bytes of ``p`` at the same relative
    position in value order (identity for ue5m3: 1 -> smallest, 255 -> largest)."""
    v = scale_bytes(p)
    nominal = np.asarray(nominal, dtype=np.int64)
    if v.size == 256:
        return nominal.astype(np.uint8)
    idx = np.rint((np.clip(nominal, 1, 255) - 1) * (v.size - 1) / 254).astype(np.int64)
    return v[idx]


def _is_asym(p: FormatParams) -> bool:
    return p.mode == "asym"


def _ret(p: FormatParams, codes, scales, zeros):
    if _is_asym(p):
        return codes, scales, zeros
    return codes, scales


def _zeros_arg(p: FormatParams, zeros):
    if _is_asym(p):
        if zeros is None:
            raise ValueError("zeros (the zero-point plane) is required for mode 'asym'")
        return np.ascontiguousarray(zeros, dtype=np.uint8)
    return None


def pack_planes(codes: np.ndarray, scales: np.ndarray, p: FormatParams,
                zeros: np.ndarray | None = None) -> list[int]:
    """(code plane, scale plane[, zero plane]) -> list of input payload ints.

    Raises:
        ValueError: mode asym without ``zeros``.
    """
    z = _zeros_arg(p, zeros)
    parts = [codes, scales] + ([z] if z is not None else [])
    planes = np.ascontiguousarray(np.concatenate(parts, axis=1).astype(np.uint8))
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


def expected_outputs(codes: np.ndarray, scales: np.ndarray, p: FormatParams,
                     zeros: np.ndarray | None = None) -> list[int]:
    """Golden output payloads (``sim_models.codec.decode``; ``zeros`` for asym)."""
    return lanes_to_int(decode(codes, scales, p, _zeros_arg(p, zeros)))


def encoded_planes(bits: np.ndarray, p: FormatParams):
    """Golden encoding of input vectors (uint16 [V, N]): (codes, scales[, zeros])."""
    e = encode(np.ascontiguousarray(bits, dtype=np.uint16), p)
    return _ret(p, e.codes, e.scales, e.zeros)


def _pack(c: np.ndarray, p: FormatParams) -> np.ndarray:
    return pack_codes(np.asarray(c, dtype=np.int64).reshape(-1, p.n), p.bits, not _is_asym(p))


def code_range(p: FormatParams) -> tuple[int, int]:
    """(lo, hi) of the code values of ``p.mode`` (two's complement; asym unsigned)."""
    if _is_asym(p):
        return 0, (1 << p.bits) - 1
    return -(1 << (p.bits - 1)), (1 << (p.bits - 1)) - 1


def _sm_codes(p: FormatParams, sgn, mag, z=None) -> np.ndarray:
    """Codes of level sign ``sgn`` (+-1) and magnitude index ``mag`` (0 .. h-1): the
    level is ``sgn * |level|(mag)``, so ``sgn`` = a Hadamard row gives a scaled row.
    midtread: c = sgn mag; midrise/lloydmax: mag or -1 - mag; asym: z + sgn mag."""
    sgn = np.asarray(sgn, dtype=np.int64)
    mag = np.broadcast_to(np.asarray(mag, dtype=np.int64), sgn.shape)
    if p.mode == "midtread":
        return sgn * mag
    if p.mode in ("midrise", "lloydmax"):
        return np.where(sgn < 0, -1 - mag, mag)
    return np.asarray(z, dtype=np.int64) + sgn * mag


def random_planes(p: FormatParams, count: int, seed: int = 0):
    """Random code planes and scale bytes (see module docstring)."""
    rng = np.random.default_rng([seed, p.n, p.bits, 11])
    codes = rng.integers(0, 256, size=(count, p.code_bytes), dtype=np.uint8)
    sb = scale_bytes(p)
    k = sb.size
    kind = rng.integers(0, 3, size=(count, 1))
    same = np.repeat(rng.integers(0, k, size=(count, 1)), p.n_blocks, axis=1)
    indep = rng.integers(0, k, size=(count, p.n_blocks))
    base = rng.integers(8, k - 8, size=(count, 1))
    near = np.clip(base + rng.integers(-8, 9, size=(count, p.n_blocks)), 0, k - 1)
    scales = sb[np.select([kind == 0, kind == 1], [same, indep], near)]
    q = (1 << p.bits) - 1
    zeros = np.where(rng.random((count, p.n_blocks)) < 0.25,
                     rng.integers(0, 256, size=(count, p.n_blocks)),
                     rng.integers(0, q + 1, size=(count, p.n_blocks))).astype(np.uint8)
    return _ret(p, codes, scales.astype(np.uint8), zeros)


def adversarial_planes(p: FormatParams, seed: int = 0):
    """Structured worst cases (see module docstring)."""
    rng = np.random.default_rng([seed, p.n, p.bits, 12])
    n, nb = p.n, p.n_blocks
    h = 1 << (p.bits - 1)
    lo, hi = code_range(p)
    asym = _is_asym(p)
    v1 = p.quantizer_preset == "v1"
    sb = scale_bytes(p)
    smallest = 0x01 if v1 else int(sb[0])
    largest = int(sb[-1])
    zh = h if asym else 0                      # zero point that centres the asym range
    cs, ss, zs = [], [], []

    def add(c, s, z=zh):
        c = np.asarray(c, dtype=np.int64).reshape(-1, n)
        s = np.broadcast_to(np.asarray(s, dtype=np.uint8).reshape(-1, nb) if np.ndim(s) else
                            np.full((1, nb), s, dtype=np.uint8), (c.shape[0], nb))
        z = np.broadcast_to(np.asarray(z, dtype=np.uint8).reshape(-1, nb) if np.ndim(z) else
                            np.full((1, nb), z, dtype=np.uint8), (c.shape[0], nb))
        cs.append(_pack(c, p))
        ss.append(np.ascontiguousarray(s, dtype=np.uint8))
        zs.append(np.ascontiguousarray(z, dtype=np.uint8))

    def rnd(m):
        return rng.integers(lo, hi + 1, size=(m, n))

    top = np.full(n, h - 1)                    # top magnitude index
    zc = _sm_codes(p, np.ones(n), 0, zh) if p.mode != "midtread" else np.zeros(n, np.int64)
    add(zc, smallest)                          # smallest levels (midtread: all-zero blocks)
    add(zc, largest)
    if v1:
        add(zc, 0x00)
    for s in (0x01, 0x08, 0x40, 0x7F, 0xA0, 0xFF):
        s = int(_sb(p, s))
        add(np.full(n, hi), s, 0)              # full-scale codes (asym: z = 0, level Q)
        add(np.full(n, lo), s, 255)            # most negative field (asym: level -255)
        add(_sm_codes(p, np.where(np.arange(n) % 2, 1, -1), top, zh), s)
    hm = hadamard(n)
    rows = rng.permutation(n)[: min(n, 32)]
    for s in (0x01, 0x38, 0xFF):
        s = int(_sb(p, s))
        add(_sm_codes(p, hm[rows], top, zh), s)     # Hadamard rows: one-hot after H/N
        add(_sm_codes(p, -hm[rows], 1 if p.mode in ("midtread", "asym") else 0, zh), s)
    if v1:
        # scale 0x00: golden float64 signed zeros (-1 * 0.0 = -0.0); -H row r gives -0.0 at lane r
        add(-hm[rows], 0x00)
        add(hm[rows[:8]] * (h - 1), 0x00)
    # extreme block-scale mixes: block k largest, the others smallest (and vice versa)
    for k in range(nb):
        s = np.full(nb, smallest, dtype=np.uint8)
        s[k] = largest
        add(rnd(4), s)
        add(np.full(n, hi), s, 0)
        add(_sm_codes(p, hm[rows[:8]], top, zh), s)
        s2 = np.full(nb, largest, dtype=np.uint8)
        s2[k] = smallest
        add(rnd(4), s2)
        if v1:
            s3 = np.full(nb, 0xFF, dtype=np.uint8)
            s3[k] = 0x00
            add(rnd(2), s3)
    # alternating extreme scales, random and sparse codes
    alt = np.where(np.arange(nb) % 2, largest, smallest).astype(np.uint8)
    add(rnd(8), alt)
    sparse = np.where(rng.random((8, n)) < 0.05, rnd(8), zc)
    add(sparse, alt)
    add(sparse, sb[rng.integers(0, sb.size, size=(8, nb))])
    # one-hot codes at assorted lanes and scales (outputs +-scale*c/N: subnormals)
    oh = np.repeat(zc[None, :], 8, axis=0)
    oh[np.arange(8), rng.integers(0, n, 8)] = rng.choice([lo, hi, _sm_codes(p, -1, h - 1, zh),
                                                          _sm_codes(p, 1, 1, zh)], 8)
    add(oh, smallest)
    add(oh, _sb(p, 0x09))
    add(oh, sb[rng.integers(0, sb.size, size=(8, nb))])
    # every scale byte once, random codes
    for i0 in range(0, sb.size, 8):
        blk = sb[i0:i0 + 8]
        add(rnd(blk.size), blk[:, None].repeat(nb, axis=1))
    # neighbouring scale bytes (small exponent differences, near-ties after alignment)
    base = rng.integers(1, sb.size - 6, size=(16, 1))
    add(rnd(16), sb[base + rng.integers(0, 6, size=(16, nb))])
    # asym: zero points over the whole byte range
    if asym:
        zr = rng.integers(0, 256, size=(16, nb))
        add(rnd(16), sb[rng.integers(0, sb.size, size=(16, nb))], zr)
    t = tie_planes(p, 24, seed)
    cs.append(t[0])
    ss.append(t[1])
    zs.append(t[2] if asym else np.zeros_like(t[1]))
    return _ret(p, np.concatenate(cs), np.concatenate(ss), np.concatenate(zs))


def tie_lanes(codes: np.ndarray, scales: np.ndarray, p: FormatParams,
              zeros: np.ndarray | None = None):
    """Bool [V, N]: the exact decoded value lies exactly halfway between two
    neighbours of the output type (a tie of round-to-nearest-even), and whether
    the lower neighbour is odd: (tie, odd). ``zeros``: the zero plane (asym)."""
    _, mb, bias = p.in_format
    v = np.abs(decode_float(codes, scales, p, _zeros_arg(p, zeros)))
    _, e = np.frexp(v)
    ulp = np.ldexp(1.0, np.maximum(e - 1, 1 - bias) - mb)
    k = np.floor(v / ulp)
    tie = (v / ulp - k == 0.5) & (v > 0)
    return tie, (k % 2 == 1)


def tie_planes(p: FormatParams, count: int, seed: int = 0):
    """Vectors with rounding ties in their output (both odd and even lower
    neighbours): two blocks carrying a scaled Hadamard row r each (in the level
    domain, so output lane r is ``(La sig0 2^e0 + Lb sig1 2^e1) G / N``) with
    exponent gaps around the output precision, and for N = G near-full Hadamard
    rows with a few lanes moved one level inwards; filtered with the golden
    model; asym with N = G uses random codes and zero points over the whole byte
    range. Returns ``(codes, scales, zeros)`` (zeros: the asym zero points; all 0
    for the other modes). (For N = G, b = 2, midtread no tie
    exists: |S| < 2^11.)"""
    rng = np.random.default_rng([seed, p.n, p.bits, 13])
    n, g, nb = p.n, p.block, p.n_blocks
    h = 1 << (p.bits - 1)
    asym = _is_asym(p)
    zh = h if asym else 0
    hg = hadamard(g)
    sb = scale_bytes(p)
    first = 0 if sb[0] else 1                  # index of the smallest nonzero byte
    per_binade = 1 << scale_encoding(p.scale).mant_bits
    _, mb, _ = p.in_format
    found_c, found_s, found_z, n_odd, n_even = [], [], [], 0, 0
    for _ in range(200):
        m = 64
        sgn = np.ones((m, n), dtype=np.int64)
        mag = np.zeros((m, n), dtype=np.int64)
        s = np.zeros((m, nb), dtype=np.int64)
        z = np.full((m, nb), zh, dtype=np.int64)
        if nb >= 2:
            r = rng.integers(0, g, m)
            sa = rng.choice([-1, 1], m)
            ma = rng.integers(0, h, m)
            sb_ = rng.choice([-1, 1], m)
            mb_ = rng.integers(1 if p.mode == "midtread" else 0, h, m)
            k0, k1 = (rng.permuted(np.tile(np.arange(nb), (m, 1)), axis=1)[:, :2].T)
            rows = np.arange(m)[:, None]
            sgn[rows, k0[:, None] * g + np.arange(g)] = sa[:, None] * hg[r]
            sgn[rows, k1[:, None] * g + np.arange(g)] = sb_[:, None] * hg[r]
            mag[rows, k0[:, None] * g + np.arange(g)] = ma[:, None]
            mag[rows, k1[:, None] * g + np.arange(g)] = mb_[:, None]
            lo_i = max(first, per_binade)
            i1 = rng.integers(lo_i, max(lo_i + 1, sb.size - 3 * per_binade), m)
            gap = rng.integers(mb - 5, mb + 4, m)          # exponent gap in binades
            s[:] = i1[:, None]
            s[np.arange(m), k0] = np.clip(i1 + per_binade * gap, first, sb.size - 1)
            s[np.arange(m), k1] = i1
        else:
            # near-full Hadamard rows (|sum| ~ N top level), a few lanes moved one
            # level inwards: odd sums
            r = rng.integers(0, n, m)
            sgn = hadamard(n)[r] * rng.choice([-1, 1], (m, 1))
            mag = np.full((m, n), h - 1) - (rng.random((m, n)) < 0.05)
            if p.mode == "midtread":
                c = sgn * mag
                lo = -h
                c = np.where(rng.random((m, n)) < 0.02, np.where(c < 0, lo, c), c)
                sgn, mag = np.where(c < 0, -1, 1), np.abs(c)
            else:
                mag = np.where(rng.random((m, n)) < 0.02, np.maximum(mag - 1, 0), mag)
            s[:] = rng.integers(min(first + 8, sb.size - 1), max(first + 9, sb.size - 8), (m, 1))
        if p.mode == "midtread":
            c = sgn * mag
        elif asym and nb == 1:
            # wide zero points (levels down to -255) and random codes: large |S|
            z = rng.integers(0, 256, (m, 1))
            c = rng.integers(0, 2 * h, (m, n))
        else:
            c = _sm_codes(p, sgn, mag, zh)
        cp = _pack(c, p)
        sp = sb[s]
        zp = z.astype(np.uint8)
        tie, odd = tie_lanes(cp, sp, p, zp)
        for i in np.flatnonzero(tie.any(axis=1)):
            has_odd, has_even = (tie[i] & odd[i]).any(), (tie[i] & ~odd[i]).any()
            if (has_odd and n_odd < count // 2) or (has_even and n_even < count - count // 2):
                found_c.append(cp[i])
                found_s.append(sp[i])
                found_z.append(zp[i])
                n_odd += has_odd
                n_even += has_even
        if n_odd >= count // 2 and n_even >= count - count // 2:
            break
    if not found_c:
        return (np.zeros((0, p.code_bytes), np.uint8), np.zeros((0, nb), np.uint8),
                np.zeros((0, nb), np.uint8))
    return (np.array(found_c, dtype=np.uint8), np.array(found_s, dtype=np.uint8),
            np.array(found_z, dtype=np.uint8))
