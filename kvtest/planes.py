"""Decoder input planes and golden outputs for the read-path RTL (``KVDecoder``).

Input words are :func:`sim_models.wire.decoder_input_rows` of the planes; the
expected output words are the golden ``sim_models.codec.decode`` lanes
(:func:`decoder_rows`).

Sets (return ``(codes uint8 [V, N*b/8], scales uint8 [V, N/G])``, and for mode
``asym`` ``(codes, scales, zeros uint8 [V, N/G])``):

* :func:`encoded_planes`: the golden encoding of fp16/bf16 vectors (what the
  encoder writes: the round trip).
* :func:`random_planes`: uniformly random code planes (every field, including
  the midtread code -2^(b-1) the encoder never writes) with random scale bytes
  of the encoding (:func:`kvtest.levels.scale_bytes`), mixed per vector: all blocks alike,
  independent bytes over the whole range, and scale bytes within a few steps of
  each other; asym: zero points mostly in 0 .. 2^b - 1 (what the encoder
  writes), a quarter over the whole byte range.
* :func:`adversarial_planes`: Hadamard rows in the level domain (H / N maps them
  back to a one-hot times D: worst-case cancellation), all-zero blocks (midtread)
  with the smallest scale, the largest scale with full codes (the largest values:
  saturation to +-65504 for fp16), the most extreme block-scale mixes (smallest
  next to largest, so the alignment spans every binade of the encoding),
  one-hot codes, ties of the final rounding (:func:`kvtest.ties.tie_planes`),
  scale byte 0x00 (the "v1" preset only: negative levels times a zero scale,
  whose exact zeros are +0 before D) and every scale byte once.

Scale bytes: :func:`kvtest.levels.scale_bytes`.
"""

from __future__ import annotations

import numpy as np

from sim_models import wire
from sim_models.codec import decode, encode
from sim_models.fwht import hadamard
from sim_models.params import FormatParams

from .levels import (code_range, is_asym, nominal_scale_bytes, pack_plane, plane_set, scale_bytes,
                     sm_codes, zeros_arg)
from .ties import tie_planes


def decoder_rows(codes: np.ndarray, scales: np.ndarray, p: FormatParams,
                 zeros: np.ndarray | None = None) -> np.ndarray:
    """Golden ``KVDecoder`` output words as byte rows uint8 [V, 2N]
    (``sim_models.codec.decode`` lanes; ``zeros`` for asym)."""
    return wire.lane_rows(decode(codes, scales, p, zeros_arg(p, zeros)))


def encoded_planes(bits: np.ndarray, p: FormatParams):
    """Golden encoding of input vectors (uint16 [V, N]): (codes, scales[, zeros])."""
    e = encode(np.ascontiguousarray(bits, dtype=np.uint16), p)
    return plane_set(p, e.codes, e.scales, e.zeros)


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
    return plane_set(p, codes, scales.astype(np.uint8), zeros)


def adversarial_planes(p: FormatParams, seed: int = 0):
    """Structured worst cases (see module docstring)."""
    rng = np.random.default_rng([seed, p.n, p.bits, 12])
    n, nb = p.n, p.n_blocks
    h = 1 << (p.bits - 1)
    lo, hi = code_range(p)
    asym = is_asym(p)
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
        cs.append(pack_plane(c, p))
        ss.append(np.ascontiguousarray(s, dtype=np.uint8))
        zs.append(np.ascontiguousarray(z, dtype=np.uint8))

    def rnd(m):
        return rng.integers(lo, hi + 1, size=(m, n))

    top = np.full(n, h - 1)                    # top magnitude index
    zc = sm_codes(p, np.ones(n), 0, zh) if p.mode != "midtread" else np.zeros(n, np.int64)
    add(zc, smallest)                          # smallest levels (midtread: all-zero blocks)
    add(zc, largest)
    if v1:
        add(zc, 0x00)
    for s in (0x01, 0x08, 0x40, 0x7F, 0xA0, 0xFF):
        s = int(nominal_scale_bytes(p, s))
        add(np.full(n, hi), s, 0)              # full-scale codes (asym: z = 0, level Q)
        add(np.full(n, lo), s, 255)            # most negative field (asym: level -255)
        add(sm_codes(p, np.where(np.arange(n) % 2, 1, -1), top, zh), s)
    hm = hadamard(n)
    rows = rng.permutation(n)[: min(n, 32)]
    for s in (0x01, 0x38, 0xFF):
        s = int(nominal_scale_bytes(p, s))
        add(sm_codes(p, hm[rows], top, zh), s)     # Hadamard rows: one-hot after H/N
        add(sm_codes(p, -hm[rows], 1 if p.mode in ("midtread", "asym") else 0, zh), s)
    if v1:
        # scale 0x00 under negative levels: float64 gives -0.0 there, the format +0 before D
        add(-hm[rows], 0x00)
        add(hm[rows[:8]] * (h - 1), 0x00)
    # extreme block-scale mixes: block k largest, the others smallest (and vice versa)
    for k in range(nb):
        s = np.full(nb, smallest, dtype=np.uint8)
        s[k] = largest
        add(rnd(4), s)
        add(np.full(n, hi), s, 0)
        add(sm_codes(p, hm[rows[:8]], top, zh), s)
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
    oh[np.arange(8), rng.integers(0, n, 8)] = rng.choice([lo, hi, sm_codes(p, -1, h - 1, zh),
                                                          sm_codes(p, 1, 1, zh)], 8)
    add(oh, smallest)
    add(oh, nominal_scale_bytes(p, 0x09))
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
    return plane_set(p, np.concatenate(cs), np.concatenate(ss), np.concatenate(zs))
