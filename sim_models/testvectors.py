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
               inputs sitting exactly on quantizer thresholds (mid-tread
               (2j-1)/2 * scale and mid-rise j * scale), and blocks whose ideal
               scale lies exactly on the midpoint of two scale bytes (the tie of
               ``scale_round="nearest"``).

:func:`key_front_set` adds the key front end of the cache policy (FORMAT.md 8): vectors,
per-slot tables (mu_s, e), slot and bypass side band, pinned with the bytes they give
(:func:`key_front_encode`: the folded key front end, bypassed vectors as values) in
:data:`KEY_FRONT_CHECKSUMS`. :func:`key_front_inputs` gives the same vectors' 16-bit rows in
the front end's domain (the fp16 rule of side rows, :func:`sim_models.keyscale.key_front`).

:data:`PINNED` lists the parameter sets whose checksums are pinned in
:data:`CHECKSUMS`: the version-2 default at N = 64/128/256, the version-1
quantizer, and every study mode, scale rule and scale encoding at N = 128.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .codec import Encoded, encode, encode_folded
from .keyscale import LOG2_S_RANGE, key_front, pow2_scales, scale_keys
from .fwht import hadamard
from .params import PRESETS, FormatParams
from .signs import sign_mask

FP16_MAX = np.float16(65504.0)
#: Version of the vector generators; bump when any set changes.
#: 2: mid-rise threshold ties and scale-midpoint ties added to "adversarial".
VECTORS_VERSION = 2
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
    # mid-rise ties: D * (sparse small integers); FWHT outputs are sums of 1-3 of them, so
    # many lanes land exactly on j * scale when the block maximum is a multiple of 2^(b-1)
    sparse = np.zeros((64, n))
    for r in range(64):
        idx = rng.choice(n, size=1 + r % 3, replace=False)
        sparse[r, idx] = rng.integers(1, 5, size=idx.size) * rng.choice([-1, 1], size=idx.size)
    add(sparse * d)
    add(sparse * d * 2.0 ** -16)
    # scale-midpoint ties: a Hadamard row (one FWHT lane = N * amp) with amp = (2s + 1) 2^k,
    # s = 8..15, puts A * 2^u / 2^(b-1) on a 5-significant-bit value ending in 1, i.e. on the
    # midpoint of two ue5m3 values (b = 3, N = 128: t = 32 amp)
    amps = np.array([(2 * s + 1) * 2.0 ** k for s in range(8, 16) for k in (-12, -4, 0, 6)])
    rows = hadamard(n)[rng.integers(0, n, size=amps.size)] * d
    add(rows * amps[:, None])
    return np.concatenate(out, axis=0)


def vector_set(name: str, n: int, count: int = 1000, seed: int = 0) -> np.ndarray:
    """One named set (``"random"`` or ``"adversarial"``), uint16 [*, n]."""
    if name == "random":
        return random_vectors(n, count, seed)
    if name == "adversarial":
        return adversarial_vectors(n, seed)
    raise ValueError(f"unknown vector set {name!r}; choose from {SETS}")


def checksum(bits: np.ndarray, p: FormatParams) -> str:
    """SHA-256 (hex, first 16 chars) over the inputs and their golden encoding
    (codes, scales, flags, and the zero-point plane of mode ``asym``)."""
    e = encode(bits, p)
    h = hashlib.sha256()
    planes = (bits, e.codes, e.scales, e.flags) + (() if e.zeros is None else (e.zeros,))
    for a in planes:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


#: Parameter sets with pinned checksums: name -> FormatParams fields besides n and block
#: (block = min(64, n)). "default" is the current format version's default.
PINNED = {
    "default": {},
    "v1": PRESETS["v1"],
    "midtread-nearest": {"mode": "midtread"},
    "midrise-up": {"scale_round": "up"},
    "lloydmax-rms": {"mode": "lloydmax", "scale_rule": "rms"},
    "asym": {"mode": "asym"},
    "absmean": {"scale_rule": "absmean"},
    "e4m3fn": {"scale": "e4m3fn"},
    "e5m2": {"scale": "e5m2"},
    "ue4m4": {"scale": "ue4m4"},
    "bf16": {"dtype": "bf16"},
}


def pinned_params(config: str, n: int) -> FormatParams:
    """FormatParams of a :data:`PINNED` configuration at N = n."""
    return FormatParams(n=n, block=min(64, n), **PINNED[config])


#: Pinned checksums (:func:`checksum`) of the sets (500 random vectors; the whole
#: adversarial set) under format version 2 and VECTORS_VERSION 2, keyed by
#: (set, N, :data:`PINNED` config). A change here is a format change.
CHECKSUMS = {
    ("random", 64, "default"): "556e992d94abd779",
    ("adversarial", 64, "default"): "8b6c36cd3af6fd23",
    ("random", 128, "default"): "686422981cf79989",
    ("adversarial", 128, "default"): "1e901641209100a0",
    ("random", 256, "default"): "9a5a9e79ad83a641",
    ("adversarial", 256, "default"): "0ae0a3c145c3f979",
    ("random", 64, "v1"): "1bf4b1bfd3bc7698",
    ("adversarial", 64, "v1"): "39104ac111c4a580",
    ("random", 128, "v1"): "30f71e62d4b8145f",
    ("adversarial", 128, "v1"): "825e03e599413ab0",
    ("random", 256, "v1"): "fdba45e0316bc307",
    ("adversarial", 256, "v1"): "a073236b52a516f9",
    ("random", 128, "midtread-nearest"): "278db654bbb5a66c",
    ("adversarial", 128, "midtread-nearest"): "4ff6b8d1f5779aac",
    ("random", 128, "midrise-up"): "8d46b3bcf81ee366",
    ("adversarial", 128, "midrise-up"): "5afdb9c091687847",
    ("random", 128, "lloydmax-rms"): "3730106c97f8d7fd",
    ("adversarial", 128, "lloydmax-rms"): "05881b320f1ca663",
    ("random", 128, "asym"): "7be52ba835673740",
    ("adversarial", 128, "asym"): "68aaa3583c26320e",
    ("random", 128, "absmean"): "e159a8306bfab154",
    ("adversarial", 128, "absmean"): "75c02c8a72e96529",
    ("random", 128, "e4m3fn"): "db98da9a1bb33095",
    ("adversarial", 128, "e4m3fn"): "0ac61a71aae6f128",
    ("random", 128, "e5m2"): "622564c45309fdf0",
    ("adversarial", 128, "e5m2"): "95a9db2e86627b9c",
    ("random", 128, "ue4m4"): "fd72708053980add",
    ("adversarial", 128, "ue4m4"): "5c598b2c26970d8b",
    ("random", 128, "bf16"): "e1cb7ba7f40fd8e1",
    ("adversarial", 128, "bf16"): "247f117cf5914dea",
}


#: Version of :func:`key_front_set`; bump when it changes.
KEY_VECTORS_VERSION = 1
#: Table slots of :func:`key_front_set`.
KEY_SLOTS = 4


def _finite_bits(rng: np.random.Generator, shape) -> np.ndarray:
    """Finite fp16 patterns with exponents spread evenly (subnormals, +-0, max included)."""
    sign = rng.integers(0, 2, size=shape) << 15
    ex = rng.integers(0, 31, size=shape)
    mant = rng.integers(0, 1024, size=shape)
    pick = rng.random(shape)
    mant = np.select([pick < 0.1, pick < 0.2, pick < 0.25], [0, 0x3FF, 1], mant)
    return (sign | (ex << 10) | mant).astype(np.uint16)


def key_front_set(n: int, count: int = 512, seed: int = 0):
    """Key-front-end stimulus: (x [V, n], mu_s [KEY_SLOTS, n], log2_s [KEY_SLOTS, n],
    slot [V], bypass [V]); V = count + the directed vectors.

    Tables: slot 0 random exponents over :data:`sim_models.keyscale.LOG2_S_RANGE` and
    spread mu_s; slot 1 the extreme exponents -14 / 15 and mu_s = +-0; slot 2 e = 0 and
    mu_s = +-65504; slot 3 small exponents and mu_s of a Gaussian mean (``front_table``).
    Vectors: the ``random`` set, spread finite patterns, NaN/inf lanes, exact and 1-ulp
    cancellation of RN16(x 2^e) against mu_s (sign of zero), +-0, fp16 max (overflow of
    x 2^e), subnormal results with rounding ties; every 8th vector bypassed.
    """
    rng = np.random.default_rng([seed, n, 3])
    pn = FormatParams(n=n, block=min(64, n))
    lo, hi = LOG2_S_RANGE
    t = KEY_SLOTS
    e = np.stack([rng.integers(lo, hi + 1, size=n), np.where(np.arange(n) % 2, hi, lo),
                  np.zeros(n, dtype=np.int64), rng.integers(-3, 4, size=n)]).astype(np.int64)
    mu = np.stack([_finite_bits(rng, n),
                   np.where(np.arange(n) % 3 == 0, 0x8000, 0).astype(np.uint16),
                   np.where(np.arange(n) % 2, 0xFBFF, 0x7BFF).astype(np.uint16),
                   scale_keys((rng.standard_normal(n) * 0.5).astype(np.float16),
                              pow2_scales(rng.integers(-3, 4, size=n)), pn)])
    mu = mu.astype(np.uint16)
    xs = [random_vectors(n, count, seed), _finite_bits(rng, (64, n))]
    special = _finite_bits(rng, (24, n))
    special[np.arange(24), rng.integers(0, n, 24)] = np.tile([0x7E00, 0x7C00, 0xFC00], 8)
    xs.append(special)
    xs.append(np.tile(np.array([0x0000, 0x8000, 0x7BFF, 0xFBFF], np.uint16), (t, n // 4 or 1))[:, :n])
    slots = [rng.integers(0, t, size=count + 64 + 24), np.arange(t)]
    # cancellation: x = RN16(mu_s 2^-e) where exact, then 0 / +-1 ulp off
    for s in range(t):
        back = scale_keys(mu[s], pow2_scales(np.clip(-e[s], lo, hi)), pn)
        for d in (0, 1, -1):
            xs.append((back.astype(np.int64) + d).clip(0, 0xFFFF).astype(np.uint16)[None])
            slots.append(np.array([s]))
    # subnormal results with ties: small mantissas under the largest negative exponents
    for s in range(t):
        xs.append(((rng.integers(0, 2, size=(8, n)) << 15) | rng.integers(1, 64, size=(8, n))
                   | (rng.integers(1, 4, size=(8, n)) << 10)).astype(np.uint16))
        slots.append(np.full(8, s))
    x = np.concatenate(xs)
    x[(x & 0x7C00) == 0x7C00] = np.where(rng.random(((x & 0x7C00) == 0x7C00).sum()) < 0.5,
                                         0x7E00, x[(x & 0x7C00) == 0x7C00])
    slot = np.concatenate(slots).astype(np.int64)
    bypass = (np.arange(x.shape[0]) % 8 == 7).astype(np.int64)
    return x, mu, e, slot, bypass


def key_front_inputs(x, mu_s, log2_s, slot, bypass, p: FormatParams) -> np.ndarray:
    """16-bit rows of a key-front-end stream in the front end's domain (side rows: sinks, the
    recent ring): :func:`sim_models.keyscale.key_front` with the tables of each vector's slot,
    the lanes unchanged where ``bypass``."""
    out = key_front(x, mu_s[slot], log2_s[slot], p)
    return np.where(np.asarray(bypass, bool)[:, None], x, out).astype(np.uint16)


def key_front_encode(x, mu_s, log2_s, slot, bypass, p: FormatParams) -> Encoded:
    """Golden bytes of a key-front-end stream (FORMAT.md 8): the folded key front end
    (:func:`sim_models.codec.encode_folded`) with the tables of each vector's slot, and
    :func:`sim_models.encode` (the value path) where ``bypass``."""
    k = encode_folded(x, mu_s[slot], log2_s[slot], p)
    v = encode(x, p)
    byp = np.asarray(bypass, bool)
    return Encoded(codes=np.where(byp[:, None], v.codes, k.codes),
                   scales=np.where(byp[:, None], v.scales, k.scales),
                   flags=np.where(byp, v.flags, k.flags).astype(np.uint8), zeros=None)


def key_front_checksum(n: int, count: int = 512, seed: int = 0) -> str:
    """SHA-256 (16 hex) over :func:`key_front_set` and its golden bytes
    (:func:`key_front_encode`, default format at N = n)."""
    p = pinned_params("default", n)
    x, mu, e, slot, byp = key_front_set(n, count, seed)
    enc = key_front_encode(x, mu, e, slot, byp, p)
    h = hashlib.sha256()
    for a in (x, mu, e.astype(np.int64), slot, byp):
        h.update(np.ascontiguousarray(a).tobytes())
    g = hashlib.sha256()
    for a in (enc.codes, enc.scales, enc.flags):
        g.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:8] + g.hexdigest()[:8]


#: Pinned :func:`key_front_checksum` (512 random vectors + the directed ones, seed 0) under
#: KEY_VECTORS_VERSION 1 and format version 4 (the folded key front end), by N. A change here
#: changes the key front end.
KEY_FRONT_CHECKSUMS = {
    64: "1fdcfe568644386c",
    128: "070059dd6a81bee8",
}
