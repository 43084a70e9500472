"""Every tie generator and counter of the tests, in one place.

Encoder inputs on the quantizer's decision points:

* :func:`threshold_tie_vectors`: the RTL tests' set, any mode / scale encoding /
  rounding (random exponents, lanes on thresholds +-1 unit, block maxima on scale
  values and midpoints, subnormal scale bytes);
* :func:`kernel_tie_vectors`: the GPU kernels' set, deterministic, scale ue5m3,
  modes midtread / midrise;
* :func:`scale_tie_vectors`: block maxima exactly on every subnormal-region decision
  point of the scale (and a sample of the normal ones), any mode (max rule);
* :func:`zero_point_tie_vectors`: asym zero points exactly on each threshold;
* :func:`count_ties`: how many lanes / blocks of a set really sit on a tie (golden
  trace, exact integer compares; every mode and encoding).

Decoder outputs on rounding ties: :func:`tie_lanes` (which lanes tie; :func:`rounding_ties`
of decoded values),
:func:`tie_planes` (plane sets with odd and even ties).
"""

from __future__ import annotations

import numpy as np

from sim_models.codec import decode_float, encode_trace
from sim_models.fwht import hadamard
from sim_models.minifloat import scale_encoding
from sim_models.params import FormatParams
from sim_models.quant import threshold_coefs, threshold_ties
from sim_models.scale import max_units, scale_decisions
from sim_models.signs import sign_mask

from .inputs import float_bits
from .levels import is_asym, pack_plane, scale_bytes, sm_codes, zeros_arg


def threshold_tie_vectors(p: FormatParams, rng: np.random.Generator, count: int = 48) -> np.ndarray:
    """Vectors whose FWHT output sits exactly on the quantizer's decision points.

    Each vector is x = (A H[r] + T H[r+1]) * 2^s / N (after the sign flip D), so
    the FWHT output is exactly A 2^s in lane r and T 2^s in lane r+1 (same block),
    zero elsewhere. With K = k / 2^ks the max rule's scale units
    (``sim_models.scale.max_units``) and sig a significand of ``p.scale``:
    A = K sig 2^t, the block maximum of an exact scale value (rule ``up``, and
    ``nearest`` as the value is its own nearest), with T = a_j sig 2^t / 2^f a
    lane threshold of that scale (``sim_models.quant.threshold_coefs``), or one unit
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
    n = p.n
    k, kd = max_units(p)
    ks = kd.bit_length() - 1              # K = k / 2^ks
    coefs, f = threshold_coefs(p.mode, p.bits)
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
        out.append(float_bits(vals, p))
    return np.array(out, dtype=np.uint16).reshape(-1, n)


def kernel_tie_vectors(p: FormatParams) -> np.ndarray:
    """fp16 vectors (uint16 [V, N]) whose FWHT outputs sit exactly on the code thresholds of ``p``'s
    mode and whose block maxima sit exactly on a scale midpoint (``nearest``: the tie goes up) or on a
    scale value (``up``: max|y| 2^u = K * scale, so mid-rise codes must clip at 2^(b-1) - 1).

    Construction: x = D w with w = (w0, w1, 0, ...), so y_i = w0 + (-1)^i w1: every block holds
    |y| = A = |w0| + |w1| and |y| = T = ||w0| - |w1||, with A = K * mid (or K * scale) and T = a
    threshold of the rounded scale, for every scale significand (normal 8..15 over exponents -9..6,
    subnormal 1..7), every threshold j and all four sign patterns. Exact in fp16 and in the block
    floating point for mant_bits >= 11.
    """
    k_units, _ = max_units(p)
    coefs, frac = threshold_coefs(p.mode, p.bits)
    d = np.where(sign_mask(p.n, p.sign_seed) == 1, -1.0, 1.0)
    rows = []
    for sigs, exps in ((range(8, 16), range(-9, 7)), (range(1, 8), (-9,))):
        for s in sigs:
            for ex in exps:
                if p.scale_round == "nearest":
                    sv = (s + 1) * 2.0 ** ex                   # the tie rounds up to the next value
                    amax = k_units * (2 * s + 1) * 2.0 ** (ex - 1)
                else:
                    sv = s * 2.0 ** ex
                    amax = k_units * sv
                for c in coefs:
                    t = c / 2**frac * sv
                    if t >= amax:
                        continue
                    a, b = (amax + t) / 2, (amax - t) / 2
                    for w0, w1 in ((a, b), (-a, -b), (b, a), (-b, -a)):
                        x = np.zeros(p.n)
                        x[0], x[1] = w0 * d[0], w1 * d[1]
                        if np.all(x.astype(np.float16).astype(np.float64) == x):
                            rows.append(x)
    return np.array(rows).astype(np.float16).view(np.uint16)


def _row_vector(p: FormatParams, r: int, total: int, e: int, spread: bool) -> np.ndarray | None:
    """Input bits (uint16 [N]) whose FWHT output is ``total * 2^e`` at lane r and smaller
    elsewhere, exactly: lane i = D_i H[r, i] c_i 2^e with positive integers c_i summing to
    ``total``, all in one binade of the input type (so the block floating point keeps
    them: same unit 2^e) or, at the smallest exponent, any c_i (subnormals share the unit).
    ``spread``: c_i may differ (|y_j| < total for j != r); otherwise all c_i are equal, so
    the output is one-hot (asym: the block range is exactly ``total``). None if no such
    c_i exist."""
    n = p.n
    _, mb, bias = p.in_format
    e_min = 1 - bias - mb
    if e < e_min or total <= 0:
        return None
    lo = 1 if e == e_min else 1 << mb
    hi = (1 << (mb + 1)) - 1
    if spread:
        if not n * lo <= total <= n * hi:
            return None
        c = np.full(n, total // n, dtype=np.int64)
        c[: total % n] += 1
    else:
        if total % n or not lo <= total // n <= hi:
            return None
        c = np.full(n, total // n, dtype=np.int64)
    e_bits = p.in_format[0]
    if (hi + 1) * 2.0 ** e > 2.0 ** ((1 << e_bits) - 1 - bias):
        return None                   # beyond the largest finite value
    flip = np.where(sign_mask(n, p.sign_seed) == 1, -1.0, 1.0)
    return float_bits(hadamard(n)[r] * flip * c * 2.0 ** e, p)


def scale_tie_vectors(p: FormatParams, normal_every: int = 16) -> np.ndarray:
    """Vectors whose block maximum (asym: block range) puts the ideal scale exactly on a
    decision point of the max rule: every midpoint (rounding ``nearest``) or value
    (``up``) of ``p.scale`` whose byte above it is subnormal, and every
    ``normal_every``-th of the others. Block max A 2^u = K * point with K = Kn / Kd
    (``sim_models.scale.max_units``): one FWHT lane r (:func:`_row_vector`) carries
    ``Kn sig 2^j`` units of ``2^(exp - log2 Kd - j)``, j chosen so that the lanes fit one
    binade; one-hot for asym (whose range counts negative lanes too), spread over the
    lanes otherwise (Lloyd-Max constants need more bits than one fp16 lane holds).

    Returns:
        uint16 [V, N] bit patterns of ``p.dtype``, only those the golden model confirms
        (``sim_models.scale.scale_decisions``); empty for other scale rules.
    """
    if p.scale_rule != "max":
        return np.zeros((0, p.n), dtype=np.uint16)
    enc = scale_encoding(p.scale)
    kn, kd = max_units(p)
    lkd = kd.bit_length() - 1
    if p.scale_round == "nearest":
        pts = list(zip(enc.mid_sig.tolist(), enc.mid_exp.tolist(), enc.bytes[1:].tolist()))
    else:
        pts = list(zip(enc.sig.tolist(), enc.exp.tolist(), enc.bytes.tolist()))
    rows = []
    k_normal = 0
    for i, (sig, ex, byte) in enumerate(pts):
        if byte >> enc.mant_bits:
            k_normal += 1
            if k_normal % normal_every:
                continue
        r = (7 * i) % p.n
        for j in range(-8, 40):
            total, e = kn * sig, ex - lkd - j
            if j >= 0:
                total <<= j
            elif total % (1 << -j):
                continue
            else:
                total >>= -j
            v = _row_vector(p, r, total, e, spread=p.mode != "asym")
            if v is not None:
                rows.append(v)
                break
    out = np.array(rows, dtype=np.uint16).reshape(-1, p.n)
    t = encode_trace(out, p)
    return out[scale_decisions(t.y, t.u, t.scales, p)[0].any(axis=1)]


def zero_point_tie_vectors(p: FormatParams, rng: np.random.Generator, count: int = 24) -> np.ndarray:
    """Mode asym: vectors whose block minimum puts the zero point exactly on its threshold
    j (``-lo 2^u = (2j - 1) / 2 * scale``) for every j in turn. FWHT lane r is
    a = K sig 2^t - T and lane r+1 is -T with T = (2j - 1) sig 2^(t-1), zero elsewhere
    (x = (a H[r] - T H[r+1]) D / N), so the block range is exactly K sig 2^t (the scale
    value sig 2^t under both roundings) and -lo = T. Exact while a + T fits the input
    type's significand. Returns uint16 [V, N] (empty for other modes)."""
    if p.mode != "asym":
        return np.zeros((0, p.n), dtype=np.uint16)
    n = p.n
    kn, _ = max_units(p)
    coefs, _ = threshold_coefs(p.mode, p.bits)
    nm = 1 << scale_encoding(p.scale).mant_bits
    h = hadamard(n).astype(np.float64)
    flip = np.where(sign_mask(n, p.sign_seed) == 1, -1.0, 1.0)
    s_lo, s_hi = (-12, 6) if p.dtype == "fp16" else (-20, 16)
    out = []
    for i in range(count):
        cj = coefs[i % len(coefs)]
        sig = int(rng.integers(nm, 2 * nm)) if p.dtype == "fp16" else nm
        a, t = 2 * kn * sig - cj * sig, cj * sig          # units of sig 2^(t-1) / sig
        r = 2 * int(rng.integers(0, n // 2))
        s = int(rng.integers(s_lo, s_hi))
        vals = (a * h[r] - t * h[r + 1]) * flip * 2.0 ** (s - 1) / n
        out.append(float_bits(vals, p))
    return np.array(out, dtype=np.uint16).reshape(-1, n)


def count_ties(bits: np.ndarray, p: FormatParams) -> tuple[int, int]:
    """(nonzero lanes exactly on a code threshold, blocks whose ideal scale lies exactly
    on the decision point of their scale byte: a midpoint (nearest) or a value (up)),
    by the golden trace (``sim_models.quant.threshold_ties``,
    ``sim_models.scale.scale_decisions``: exact integer compares, every mode, rule and
    encoding), so that tie tests can check that ties really occur."""
    t = encode_trace(bits, p)
    lanes, _ = threshold_ties(t.y, t.u, t.scales, p)
    blocks, _ = scale_decisions(t.y, t.u, t.scales, p)
    return int(((lanes > 0) & (t.y != 0)).sum()), int(blocks.sum())


def tie_lanes(codes: np.ndarray, scales: np.ndarray, p: FormatParams,
              zeros: np.ndarray | None = None):
    """Bool [V, N]: the exact decoded value lies exactly halfway between two
    neighbours of the output type (a tie of round-to-nearest-even), and whether
    the lower neighbour is odd: (tie, odd). ``zeros``: the zero plane (asym)."""
    return rounding_ties(decode_float(codes, scales, p, zeros_arg(p, zeros)), p)


def rounding_ties(x: np.ndarray, p: FormatParams):
    """(tie, odd) of :func:`tie_lanes` for exact decoded values ``x`` (float64)."""
    _, mb, bias = p.in_format
    v = np.abs(x)
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
    asym = is_asym(p)
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
            c = sm_codes(p, sgn, mag, zh)
        cp = pack_plane(c, p)
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
