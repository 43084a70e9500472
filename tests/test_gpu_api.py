"""gpu_ref checks that need no GPU (run in CI): parameter refusals happen before CuPy is needed,
the arithmetic of the write kernel's fast quantizer (scale rounding up/nearest, mid-tread/mid-rise
codes by one FMA) and the bit tricks the decode kernel uses reproduce the golden model (emulated in
NumPy).
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

import gpu_ref
from sim_models import FLAG_SAT, CachePolicy, FormatParams
from sim_models.codec import encode_trace
from sim_models.pack import pack_codes
from sim_models.minifloat import scale_encoding
from sim_models.scale import max_units
from sim_models.signs import sign_mask
from sim_models.testvectors import adversarial_vectors, random_vectors

from kvtest.gpu_cases import QUANT_IDS, QUANTIZERS, qparams
from kvtest.inputs import bf16_tiny_bits
from kvtest.ties import count_ties, kernel_tie_vectors


def scale_value(s: np.ndarray) -> np.ndarray:
    """float64 values of ue5m3 scale bytes (exact; byte 0x00 reads as 0)."""
    s = np.asarray(s)
    sig, exp = scale_encoding("ue5m3").sig_exp(np.maximum(s, 1))
    return np.where(s == 0, 0.0, np.ldexp(sig.astype(np.float64), exp.astype(np.int32)))


# --------------------------------------------------------------------------------------------
# NumPy emulation of the write kernel's fast quantizer (kv_encode.cu, FASTQ path)
# --------------------------------------------------------------------------------------------
_KINV = np.array([0.0] + [(1.0 + 1.5 / 4194304.0) / s for s in range(1, 16)]).astype(np.float32)


def emulate_fast_quantizer(bits: np.ndarray, p: FormatParams):
    """(scale bytes, codes, sat) as kv_encode.cu computes them on its fast path from the golden FWHT
    output: scale byte = smallest byte with K scale >= max|y| 2^u (exact compares), nearest: the
    byte below when K (2 sig + 1) 2^(ex-1) > max|y| 2^u; codes = RN (mid-tread) or RM (mid-rise) of
    y * kq with kq = float32(float32((1 + 1.5 2^-22) / sig) * 2^clamp(u - ex, -122, 127)), clamped
    to [-K, 2^(b-1) - 1] unless (mid-tread, up, no saturated block)."""
    tr = encode_trace(bits, p)
    y, u = tr.y, tr.u.astype(np.int64)
    h = 1 << (p.bits - 1)
    mr = p.mode == "midrise"
    k_units, _ = max_units(p)
    v, nb, g = len(y), p.n_blocks, p.block
    yb = y.reshape(v, nb, g)
    rhs = np.abs(yb).max(axis=2) * np.exp2(u.astype(np.float64))[:, None]   # exact in float64
    s = np.arange(1, 256)
    e, m = s >> 3, s & 7
    sig = np.where(e > 0, m + 8, m)
    ex = np.maximum(e, 1) - 10
    ok = k_units * (sig * np.exp2(ex.astype(np.float64)))[None, None, :] >= rhs[..., None]
    sup = np.where(ok.any(axis=-1), ok.argmax(axis=-1) + 1, 256)
    if p.scale_round == "nearest":
        c = sup - 1
        ci = np.clip(c, 1, 254) - 1
        mid = (2 * sig[ci] + 1) * np.exp2(ex[ci].astype(np.float64) - 1)
        byte = np.where((c >= 1) & (c <= 254) & (k_units * mid > rhs), c, np.minimum(sup, 255))
    else:
        byte = np.minimum(sup, 255)
    sat = (sup > 255).any(axis=1)
    sg, exb = sig[byte - 1], ex[byte - 1]
    ek = np.clip(u[:, None] - exb, -122, 127)
    kq = _KINV[sg] * np.exp2(ek.astype(np.float64)).astype(np.float32)     # float32 multiply
    assert np.all(kq >= np.float32(2.0 ** -126)), "kq subnormal: CuPy's -ftz=true would flush it"
    t = yb.astype(np.float64) * kq.astype(np.float64)[..., None]          # exact: < 2^21 x 24 bits
    if mr:
        codes = np.floor(t)
    else:
        half = np.floor(t + 0.5)
        small = np.abs(t) < 2.0 ** 20  # larger |t| clip anyway (saturated blocks)
        assert not np.any((t + 0.5 == half) & (t != 0) & small), "an exact .5 reached the RN rounding"
        codes = half
    clamp = mr or p.scale_round == "nearest"
    lo, hi = -k_units, h - 1
    if not clamp:  # the kernel clamps only saturated vectors here: the rest must already be in range
        inr = (codes >= lo) & (codes <= hi)
        assert np.all(inr | sat[:, None, None]), "mid-tread/up code out of range without saturation"
    codes = np.clip(codes, lo, hi).astype(np.int64).reshape(v, p.n)
    return byte.astype(np.uint8), codes, sat, tr


@pytest.mark.parametrize("mode,rnd", QUANTIZERS, ids=QUANT_IDS)
@pytest.mark.parametrize("kw", [dict(), dict(dtype="bf16"), dict(n=64, block=16, bits=2),
                                dict(n=256, block=32, bits=4, mant_bits=13), dict(n=32, block=8, sign_seed=None)],
                         ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()) or "default")
def test_fast_quantizer_emulation_matches_golden(mode, rnd, kw):
    p = qparams(mode, rnd, **kw)
    assert p.mant_bits - 1 + p.log2n <= 20  # the kernel's fast-quantizer condition
    sets = [random_vectors(p.n, 3000, seed=p.n + p.bits)]
    if p.dtype == "fp16":
        sets += [adversarial_vectors(p.n, p=FormatParams(n=p.n, block=min(64, p.n), sign_seed=p.sign_seed)),
                 np.arange(1 << 16, dtype=np.uint16).reshape(-1, p.n)]
        if p.mant_bits >= 11:
            sets.append(kernel_tie_vectors(p))
    bits = np.concatenate(sets)
    byte, codes, sat, tr = emulate_fast_quantizer(bits, p)
    bad = np.flatnonzero((byte != tr.scales).any(axis=1))
    assert bad.size == 0, f"scale bytes differ in {bad.size} vectors, first {bad[0]}: {byte[bad[0]]} vs {tr.scales[bad[0]]}"
    assert np.array_equal(sat, (tr.flags & FLAG_SAT) != 0)
    bad = np.flatnonzero((codes != tr.codes).any(axis=1))
    assert bad.size == 0, f"codes differ in {bad.size} vectors, first {bad[0]}"


def _round_half_even(v):
    return np.rint(v)


@pytest.mark.parametrize("mant_bits", [12, 16, 9, 6])
def test_bf16_block_fp_emulation_under_ftz(mant_bits):
    """kv_encode.cu's bf16 block floating point with CuPy's -ftz=true (subnormal float operands read
    as 0): for -u >= 126 the lanes are scaled by exponent arithmetic (bf16_x2p64, exact), otherwise a
    flushed subnormal lane must have mantissa 0 in the golden model too."""
    p = FormatParams(dtype="bf16", mant_bits=mant_bits)
    bits = np.concatenate([bf16_tiny_bits(128, 3000, mant_bits),
                           np.random.default_rng(3).integers(0, 1 << 16, size=(500, 128)).astype(np.uint16)])
    bits = bits[((bits & 0x7F80) != 0x7F80).all(axis=1)]       # finite vectors only (NaN/inf: other path)
    tr = encode_trace(bits, p)
    u = tr.u.astype(np.int64)
    mag = (bits & 0x7FFF).astype(np.int64)
    ef, fr = mag >> 7, mag & 0x7F
    f = np.where(ef > 0, (128 + fr) * np.exp2(ef - 134.0), fr * np.exp2(-133.0))   # |value|, exact
    sign = np.where(bits >> 15, -1.0, 1.0) * np.where(sign_mask(128, p.sign_seed) == 1, -1.0, 1.0)
    big = (-u >= 126)[:, None]
    scale = np.exp2(-u.astype(np.float64))[:, None]                                  # 2^-u
    flushed = np.where((ef == 0) & ~big, 0.0, f)     # FTZ: a subnormal float operand reads as 0
    v = flushed * scale
    if mant_bits - 2 - 7 >= 0:     # FASTB: RN(v (1 + 2^-20) + 1.5 2^23), ties pushed outwards
        x = _round_half_even(v * (1 + 2.0 ** -20) + 12582912.0) - 12582912.0
    else:                          # slow path: floor(v + 1/2), clamped to 2^(M-1) - 1
        x = np.minimum(np.floor(v + 0.5), 2 ** (mant_bits - 1) - 1)
    x = (sign * x).astype(np.int64)
    bad = np.flatnonzero((x != tr.x).any(axis=1))
    assert bad.size == 0, f"{bad.size} of {len(bits)} vectors: block floating point differs, first {bad[0]}"
    assert big.any() and (~big).any() and ((ef == 0) & big & (tr.x != 0)).any()


@pytest.mark.parametrize("mode,rnd", QUANTIZERS, ids=QUANT_IDS)
def test_tie_vectors_hit_ties(mode, rnd):
    p = qparams(mode, rnd)
    bits = kernel_tie_vectors(p)
    lanes, blocks = count_ties(bits, p)
    assert len(bits) >= 200 and lanes >= len(bits) * p.n // 2 and blocks >= len(bits), (len(bits), lanes, blocks)


def test_unsupported_params_refused_without_gpu():
    for field, kw in (("mode", dict(mode="lloydmax")), ("mode", dict(mode="asym")),
                      ("scale", dict(scale="e4m3fn")), ("scale_rule", dict(scale_rule="rms")),
                      ("scale_mult", dict(scale_mult=200))):
        with pytest.raises(ValueError, match=field):
            gpu_ref.encode_kv(None, FormatParams(**kw))
        with pytest.raises(ValueError, match=field):
            gpu_ref.KVCache(1, 1, 16, CachePolicy(k=FormatParams(**kw), v=FormatParams(**kw)))
        with pytest.raises(ValueError, match=field):
            gpu_ref.decode_attention(None, None, None, None, None, None, FormatParams(**kw))
        assert not gpu_ref.decode_supported(FormatParams(**kw))
    # every supported quantizer passes the parameter check (then fails on the missing array / CuPy)
    for mode, rnd in QUANTIZERS:
        p = qparams(mode, rnd, scale_mult=256)
        assert gpu_ref.decode_supported(p)
        with pytest.raises((TypeError, RuntimeError)):
            gpu_ref.encode_kv(None, p)
    with pytest.raises(ValueError, match="capacity"):
        gpu_ref.KVCache(1, 1, 0)
    with pytest.raises(ValueError, match="supports"):
        gpu_ref.decode_attention(None, None, None, None, None, None, FormatParams(bits=2))
    with pytest.raises(ValueError, match="support n=512:"):
        gpu_ref.decode_attention(None, None, None, None, None, None, FormatParams(n=512))
    with pytest.raises(ValueError, match="support bits=2:"):
        gpu_ref.plan(FormatParams(bits=2), batch=1, q_heads=1, kv_heads=1, max_length=1, num_sms=1)
    assert gpu_ref.decode_supported(FormatParams(bits=4))
    with pytest.raises(TypeError):
        gpu_ref.encode_kv(None, {"n": 128})
    assert gpu_ref.decode_supported(FormatParams())
    assert not gpu_ref.decode_supported(FormatParams(block=128))


def _byte_perm(x, y, s):
    b = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    return sum(b[(s >> (4 * n)) & 7] << (8 * n) for n in range(4))


def _lop_6a(x, a, b):  # lop3.b32 with LUT 0x6A: a ? (b ? ~x : x) : b
    return ((a & ((b & ~x) | (~b & x))) | (~a & b)) & 0xFFFFFFFF


def _h(bits):
    return float(np.array([bits], np.uint16).view(np.float16)[0])


def _h_int(v):  # h_int in kv_decode_attn.cu: fp16 bits of a small non-negative integer
    lg = v.bit_length() - 1
    return 0 if v == 0 else ((lg + 15) << 10) | ((v << (10 - lg)) & 0x3FF)


KPAIRS = {3: [[[0, 3], [1, 4]], [[8, 11], [9, 12]], [[6, 14], [7, 15]], [[2, 5], [10, 13]]],  # kv_decode_attn.cu
          4: [[[0, 2], [1, 3]], [[4, 6], [5, 7]], [[8, 10], [9, 11]], [[12, 14], [13, 15]]]}


@pytest.mark.parametrize("bits", [3, 4])
@pytest.mark.parametrize("mr", [0, 1], ids=["midtread", "midrise"])
def test_decode_fragment_tricks_match_golden_codes(mr, bits):
    """K: PRMT + LOP3 give 1 + (c+T) 2^(o-10) (T = 2^(b-1)); V: PRMT + LOP3 + HFMA2 (+ HADD2 1/2 for
    mid-rise lanes at bit offset 0) give c (mid-tread) or c + 1/2 (mid-rise) exactly; the mid-rise K
    offset 1 + (T - 1/2) 2^(o-10) leaves (c + 1/2) 2^(o-10). Also: every thread's four K lanes per
    16-lane chunk together cover the chunk once (the pairing is a permutation)."""
    kpairs = KPAIRS[bits]
    assert sorted(j for t in kpairs for pr in t for j in pr) == list(range(16))
    top, fm = 1 << (bits - 1), (1 << bits) - 1
    rng = np.random.default_rng(bits)
    n = 128
    codes = rng.integers(-top if mr else -top + 1, top, size=(2, n))
    rows = pack_codes(codes, bits)
    words = [np.concatenate([r, np.zeros(8, np.uint8)]).view("<u4").astype(np.int64) for r in rows]
    w = words[0]
    for tig in range(4):
        for p in range(2):
            jl, jh = kpairs[tig][p]
            bl, ol, bh, oh = (bits * jl) >> 3, (bits * jl) & 7, (bits * jh) >> 3, (bits * jh) & 7
            sel_e = bl | (min(bl + 1, 7) << 4) | (bh << 8) | (min(bh + 1, 7) << 12)
            sel_o = (bl + 2) | (min(bl + 3, 7) << 4) | ((bh + 2) << 8) | (min(bh + 3, 7) << 12)
            ma = (fm << ol) | (fm << (16 + oh))
            mb = (top << ol) | (top << (16 + oh)) | 0x3C003C00
            for c in range(n // 16):
                if bits == 4:
                    wl0, sel = 2 * c, sel_e
                else:
                    wl0 = (3 * c - 1) // 2 if c & 1 else (3 * c) // 2
                    sel = sel_o if c & 1 else sel_e
                r = _lop_6a(_byte_perm(int(w[wl0]), int(w[wl0 + 1]), sel), ma, mb)
                for half, j, o in ((0, jl, ol), (1, jh, oh)):
                    kv = _h((r >> (16 * half)) & 0xFFFF)
                    assert kv == 1 + (codes[0, 16 * c + j] + top) * 2.0 ** (o - 10)
                    koff = top - 0.5 if mr else float(top)
                    assert (kv - (1 + koff * 2.0 ** (o - 10))) * 2.0 ** (10 - o) == codes[0, 16 * c + j] + 0.5 * mr
    for g_blk in (16, 32, 64):
        segl = g_blk // 8
        for bb in range(n // g_blk):
            for g in range(8):
                boff = bits * (bb * g_blk + g * segl)
                segs = [int(((int(x[boff >> 5]) | (int(x[(boff >> 5) + 1]) << 32)) >> (boff & 31)) & 0xFFFFFFFF)
                        for x in words]
                for j in range(segl):
                    beta, o = (bits * j) >> 3, (bits * j) & 7
                    b1 = min(beta + 1, 3)
                    sel = beta | (b1 << 4) | ((beta + 4) << 8) | ((b1 + 4) << 12)
                    hbit = ((1 << (o - 1)) | (1 << (15 + o))) if (mr and o > 0) else 0
                    r = _lop_6a(_byte_perm(segs[0], segs[1], sel), (fm << o) | (fm << (16 + o)),
                                (top << o) | (top << (16 + o)) | 0x64006400 | hbit)
                    for half in range(2):
                        # fma.rn.f16x2: exact product and sum, one rounding to fp16
                        v = float(np.float16(_h((r >> (16 * half)) & 0xFFFF) * 2.0 ** -o
                                             + _h(0x8000 | _h_int((1 << (10 - o)) + top))))
                        if mr and o == 0:
                            v = float(np.float16(v + 0.5))
                        assert v == codes[half, bb * g_blk + g * segl + j] + 0.5 * mr


# kseg_* in kv_decode_attn.cu (3-bit keys, G = 64): half2 h of a thread's 16-lane segment of a block holds
# segment lanes (KSEG_JL[h], KSEG_JH[h]) at fp16 bit offsets (KSEG_OL[h], KSEG_OH[h]), from PRMT window pair
# KSEG_W[h] with selector KSEG_SEL[w] + 0x1111 * 2 (tig & 1); the segment starts at word 6 bb + (6 tig) / 4
KSEG_JL, KSEG_JH = [0, 1, 2, 8, 9, 10, 6, 7], [3, 4, 5, 11, 12, 13, 14, 15]
KSEG_OL, KSEG_OH = [0, 3, 6, 0, 3, 6, 2, 5], [1, 4, 7, 1, 4, 7, 2, 5]
KSEG_W, KSEG_SEL = [0, 0, 0, 1, 1, 1, 2, 2], [0x2110, 0x5443, 0x5532]


@pytest.mark.parametrize("mr", [0, 1], ids=["midtread", "midrise"])
def test_decode_key_segments_match_golden_codes(mr):
    """3-bit keys, 64-lane scale blocks: each thread's two words + 3 PRMT + 8 LOP3 per block and row give
    1 + (c+T) 2^(o-10) for the lanes the q fragment pairs them with, and the 4 threads' segments cover every
    lane of the row once."""
    bits, top = 3, 4
    rng = np.random.default_rng(7 + mr)
    for n in (64, 128, 256):
        codes = rng.integers(-top if mr else -top + 1, top, size=n)
        w = np.concatenate([pack_codes(codes[None], bits)[0], np.zeros(8, np.uint8)]).view("<u4").astype(np.int64)
        seen = []
        for tig in range(4):
            kw, ph = (6 * tig) >> 2, 2 * (tig & 1)
            for bb in range(n // 64):
                for h in range(8):
                    ol, oh = KSEG_OL[h], KSEG_OH[h]
                    sel = KSEG_SEL[KSEG_W[h]] + 0x1111 * ph
                    assert all(((sel >> (4 * i)) & 0xF) <= 7 for i in range(4))
                    r = _lop_6a(_byte_perm(int(w[6 * bb + kw]), int(w[6 * bb + kw + 1]), sel),
                                (7 << ol) | (7 << (16 + oh)), (top << ol) | (top << (16 + oh)) | 0x3C003C00)
                    for half, j, o in ((0, KSEG_JL[h], ol), (1, KSEG_JH[h], oh)):
                        lane = 64 * bb + 16 * tig + j
                        seen.append(lane)
                        assert _h((r >> (16 * half)) & 0xFFFF) == 1 + (codes[lane] + top) * 2.0 ** (o - 10)
        assert sorted(seen) == list(range(n))


def test_params_struct_matches_the_kernel():
    """gpu_ref.decode.PARAMS_DTYPE lists the fields of KvDecParams (kv_decode_attn.cu) in order, with their C
    types (pointers as uint64), so the struct passed by value lands field by field."""
    from gpu_ref.decode import PARAMS_DTYPE
    src = open(os.path.join(os.path.dirname(gpu_ref.__file__), "kv_decode_attn.cu"), encoding="utf-8").read()
    body = re.search(r"struct KvDecParams \{(.*?)\n\};", src, re.S).group(1)
    fields = []
    for line in body.splitlines():
        decl = line.split("//")[0].strip().rstrip(";")
        if not decl:
            continue
        first, *rest = decl.replace("*", " * ").split(",")
        words = first.split()
        ctype, names = " ".join(words[:-1]), [words[-1]] + [r.strip() for r in rest]
        kind = np.uint64 if "*" in ctype else {"long long": np.int64, "int": np.int32, "float": np.float32}[ctype]
        fields += [(n, np.dtype(kind)) for n in names]
    assert [(n, PARAMS_DTYPE.fields[n][0]) for n in PARAMS_DTYPE.names] == fields
    assert PARAMS_DTYPE.itemsize == 176 and PARAMS_DTYPE.isalignedstruct


def test_scale_byte_to_float_formula():
    """scale_f in kv_decode_attn.cu: (s << 20) + (120 << 23) for s >= 8, s * 2^-9 below."""
    s = np.arange(256, dtype=np.uint32)
    hi = ((s << 20) + (120 << 23)).view(np.float32).astype(np.float64)
    lo = s.astype(np.float64) * 2.0 ** -9
    assert np.array_equal(np.where(s >= 8, hi, lo), scale_value(np.arange(256)))


# ---------------------------------------------------------------------------------------------
# decode planning (no GPU: num_sms given)
# ---------------------------------------------------------------------------------------------
def test_plan_mqa_70000_tokens_within_merge_limit():
    """Batch 1, 16 q heads, 1 KV head, N=64, 70,000 tokens once raised 'num_splits must be in
    [1, 128], got 132'; the default split count is now clamped to what the merge stages."""
    for kb, vb in ((3, 3), (4, 3), (4, 4)):
        pl = gpu_ref.plan(FormatParams(n=64, bits=kb), FormatParams(n=64, bits=vb), batch=1, q_heads=16,
                          kv_heads=1, max_length=70000, num_sms=132)
        _, smem, _, wreg = gpu_ref.decode.kernel_params(FormatParams(n=64, bits=kb), FormatParams(n=64, bits=vb))
        assert 1 <= pl.num_splits <= wreg // 64 and pl.num_splits * pl.chunk >= 70000
        assert pl.smem == smem <= 227 * 1024


def test_plan_split_bound_over_shape_space():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.choice([64, 128, 256]))
        kvh = int(rng.integers(1, 65))
        hq = kvh * int(rng.choice([1, 2, 3, 4, 7, 8, 16, 32]))
        if hq > 256:
            continue
        kb, vb = [(3, 3), (4, 3), (4, 4)][int(rng.integers(3))]
        page = [None, 16, 32, 64, 128][int(rng.integers(5))]
        sinks = int(rng.choice([0, 4, 64]))
        t = int(rng.choice([0, 1, 63, 64, 5000, 70000, 1 << 20]))
        pl = gpu_ref.plan(FormatParams(n=n, bits=kb), FormatParams(n=n, bits=vb), batch=int(rng.integers(1, 65)),
                          q_heads=hq, kv_heads=kvh, max_length=t, page_size=page, sinks=sinks,
                          num_sms=int(rng.choice([1, 78, 132])))
        wreg = gpu_ref.decode.kernel_params(FormatParams(n=n, bits=kb), FormatParams(n=n, bits=vb))[3]
        assert 1 <= pl.num_splits <= wreg // 64
        assert pl.num_splits * pl.chunk >= max(t - sinks, 1) and pl.chunk % 64 == 0
        assert pl.smem <= 227 * 1024
        assert pl.capacity >= t - sinks


def test_plan_fills_the_last_wave_as_measured():
    """The default split count of 8-warp plans (``minb`` 2, as measured) is within 3% of the fastest one measured
    on the H200 and never slower than one split (bench/results/gpu_bench_waves.json: GQA 32/8, 128K, batch 32..64,
    splits 1..16; batch 35 ran 1.53 ms with 8 splits, 2.13 ms with the earlier choice of 1)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "bench", "results", "gpu_bench_waves.json")) as f:
        result = json.load(f)
    p = FormatParams(n=128, bits=3)
    for row in result["waves"]:
        ms = {r["num_splits"]: r["ms"] for r in row["rows"] if r["split_arg"] is not None}
        pl = gpu_ref.plan(p, p, batch=row["batch"], q_heads=row["q_heads"], kv_heads=row["kv_heads"],
                          max_length=row["context"], num_sms=result["sms"], tune={"minb": 2})
        assert pl.num_splits in ms, (row["batch"], pl.num_splits)
        assert ms[pl.num_splits] <= 1.03 * min(ms.values()), (row["batch"], pl.num_splits, ms)
        assert ms[pl.num_splits] <= 1.005 * ms[1], (row["batch"], pl.num_splits, ms)
    assert len(result["waves"]) >= 6


def test_plan_q_parts_follow_key_scales():
    """One fp16 q~ part for fp16 q without key scales (within the SDPA-bf16 budget, tests/test_gpu.py), two
    with them or for bf16 q (scales drawn independently of q and k push one part over the budget: docs/DECISIONS.md,
    "Two q parts with key scales");
    ``tune`` overrides; a q_scale on a plan made without key_scales is refused before any GPU work."""
    p = FormatParams()
    args = dict(batch=2, q_heads=8, kv_heads=2, max_length=1000, num_sms=132)
    qlo = 9  # template argument QLO of kv_decode_attn
    assert gpu_ref.plan(p, **args).targs[qlo] == "0"
    assert gpu_ref.plan(p, key_scales=True, **args).targs[qlo] == "1"
    assert gpu_ref.plan(p, tune={"qlo": 1}, **args).targs[qlo] == "1"
    assert gpu_ref.plan(p, key_scales=True, tune={"qlo": 0}, **args).targs[qlo] == "0"
    assert gpu_ref.plan(p, q_dtype="bf16", **args).targs[qlo] == "1"
    with pytest.raises(ValueError, match="key_scales"):
        gpu_ref.run_planes(gpu_ref.plan(p, **args), None, None, None, None, None, None, None, q_scale=object())


def test_plan_picks_12_warps_for_long_even_splits():
    """LONG_TUNE where the rule picks it (docs/DECISIONS.md, "12-warp planner rule"), 8 warps elsewhere:
    short splits, uneven single waves, two q~ parts, explicit tunes or split counts, N != 128, K4V4 (3 CTAs do not
    fit)."""
    p3, p4 = FormatParams(n=128, bits=3), FormatParams(n=128, bits=4)

    def minb(batch, t, hq=64, kp=p3, vp=p3, **kw):
        return gpu_ref.plan(kp, vp, batch=batch, q_heads=hq, kv_heads=8, max_length=t, num_sms=132, **kw).targs[8]
    for b, t, hq in ((8, 131072, 64), (8, 131072, 32), (16, 131072, 64), (32, 131072, 64), (64, 131072, 64),
                     (128, 32768, 64), (48, 131072, 32)):
        assert minb(b, t, hq) == "3", (b, t, hq)
    assert minb(8, 131072, kp=p4) == "3"
    for b, t, hq in ((1, 4096, 64), (1, 32768, 64), (1, 131072, 64), (8, 4096, 64), (4, 131072, 64),
                     (35, 131072, 32), (40, 131072, 32)):
        assert minb(b, t, hq) == "2", (b, t, hq)
    assert minb(8, 131072, key_scales=True) == "2"
    assert minb(8, 131072, q_dtype="bf16") == "2"
    assert minb(8, 131072, tune={"qlo": 1}) == "2"
    assert minb(8, 131072, precise_p=True) == "2"
    assert minb(8, 131072, tune={"minb": 2}) == "2"
    assert minb(8, 131072, num_splits=6) == "2"            # an explicit split count keeps the 8-warp default
    assert minb(8, 131072, kp=p4, vp=p4) == "2"
    assert minb(8, 131072, key_scales=True, tune={"qlo": 0}) == "3"
    pl = gpu_ref.plan(p3, p3, batch=8, q_heads=64, kv_heads=8, max_length=131072, num_sms=132)
    assert pl.targs[5] == "2" and pl.num_splits == 6


def test_plan_refusals_name_the_parameter():
    p = FormatParams()
    for kw, word in ((dict(q_heads=3, kv_heads=2), "multiple"), (dict(sinks=65), "sinks"),
                     (dict(page_size=48), "page_size"), (dict(page_size=96), "page_size"),
                     (dict(num_splits=0), "num_splits"), (dict(num_splits=10**6), "num_splits"),
                     (dict(batch=0), "batch"), (dict(max_length=-1), "max_length"),
                     (dict(capacity=100), "capacity"), (dict(max_length=5000, capacity=1024), "capacity"),
                     (dict(page_size=16, max_pages=2, max_length=100), "max_pages"),
                     (dict(num_sms=0), "num_sms"), (dict(num_sms=-1), "num_sms"), (dict(num_sms=2.5), "num_sms"),
                     (dict(num_sms=True), "num_sms"), (dict(max_length=2 ** 31 + 5), "max_length"),
                     (dict(max_length=2 ** 40, page_size=16), "max_length"),
                     (dict(page_size=64, max_pages=2 ** 26), "max_pages \\* page_size"),
                     (dict(stages=-1), "stages"), (dict(stages=100), "stages"),
                     (dict(tune={"foo": 1}), "tune"), (dict(tune={"minb": 0}), "minb"),
                     (dict(precise_p="yes"), "precise_p"), (dict(key_scales=1), "key_scales"),
                     (dict(tune={"qlo": -1}), "qlo"), (dict(q_dtype="fp32"), "q_dtype")):
        args = dict(batch=2, q_heads=8, kv_heads=2, max_length=1000, num_sms=132)
        args.update(kw)
        with pytest.raises(ValueError, match=word):
            gpu_ref.plan(p, **args)
    with pytest.raises(ValueError, match="bits"):
        gpu_ref.plan(FormatParams(bits=2), batch=1, q_heads=1, kv_heads=1, max_length=1, num_sms=1)
    with pytest.raises(ValueError, match="block"):
        gpu_ref.plan(FormatParams(block=32), FormatParams(block=64), batch=1, q_heads=1, kv_heads=1,
                     max_length=1, num_sms=1)
    with pytest.raises(ValueError, match="sinks"):
        gpu_ref.KVCache(1, 1, 16, CachePolicy(sinks=65))
    with pytest.raises(ValueError, match="page_size"):
        gpu_ref.KVCache(1, 1, 16, page_size=24)


# --------------------------------------------------------------------------------------------
# write kernel: argument struct, mid-rise scale bytes from fp32 bit patterns, key front end
# --------------------------------------------------------------------------------------------
def test_encode_args_struct_matches_header():
    """The host struct (one 8-byte member per field of KvEncodeArgs, read from kv_common.cuh) has the
    member order and layout the kernel expects; values become pointers / null / 64-bit ints."""
    from gpu_ref._build import ENCODE_ARGS, kernel_struct
    assert ENCODE_ARGS == ("x", "codes", "scales", "flags", "out_rows", "key_tab", "nvec", "key_heads", "pair_vec")

    class FakeArray:
        class data:  # noqa: N801 - mimics cupy's MemoryPointer
            ptr = 0x7F0012345600
    s = kernel_struct(ENCODE_ARGS, x=FakeArray(), codes=None, scales=3, flags=4, out_rows=None, key_tab=None,
                      nvec=2**40 + 5, key_heads=-1, pair_vec=8)
    assert s.dtype.itemsize == 72 and [s.dtype.fields[f][1] for f in ENCODE_ARGS] == list(range(0, 72, 8))
    w = np.frombuffer(s.tobytes(), np.uint64)
    assert list(w) == [0x7F0012345600, 0, 3, 4, 0, 0, 2**40 + 5, 2**64 - 1, 8]
    with pytest.raises(ValueError, match="members"):
        kernel_struct(ENCODE_ARGS, x=None)


def _scale_mr_f32(am: np.ndarray, u: int, bits: int, nearest: bool):
    """kv_encode.cu scale_mr_f32 in NumPy (float32 values and int32 bit patterns)."""
    r = am.astype(np.float32) * np.float32(2.0 ** (u - (bits - 1)))                   # exact
    rb = r.view(np.int32).astype(np.int64)
    sn = (rb - 0x3C000000 + 0xFFFFF) >> 20
    cs = np.maximum(np.ceil(np.minimum(r.astype(np.float64), 1.0) * 512), 1).astype(np.int64)  # FMA rounding up (used for r <= 2^-6)
    sup = np.where(rb <= 0x3C800000, cs, sn)
    sat = sup > 255
    if not nearest:
        return np.minimum(sup, 255), sat
    c = sup - 1
    midn = ((np.clip(c, 0, 1100) << 20) + 0x3C080000).astype(np.int32).view(np.float32).astype(np.float64)
    mid = np.where(c >= 8, midn, (2 * c + 1) * 2.0 ** -10)
    return np.where((c >= 1) & (c <= 254) & (mid > r), c, np.minimum(sup, 255)), sat


@pytest.mark.parametrize("rnd", ["up", "nearest"])
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_midrise_scale_byte_from_float_bits_matches_golden(bits, rnd):
    """The write kernel's mid-rise scale byte from fp32 bit patterns (scale_mr_f32) equals the golden
    choose_scale_bytes for every block maximum below 2^21 at the fp16 unit exponents' ends and middle,
    and for random (max, u) over the bf16 range the kernel sends there (|u| <= 100)."""
    from sim_models.scale import choose_scale_bytes
    p = qparams("midrise", rnd, n=8, block=8, bits=bits)
    rng = np.random.default_rng(bits)
    cases = [(np.arange(1 << 21, dtype=np.int64), u) for u in (-24, -12, 5)]
    cases += [(rng.integers(0, 1 << 21, 4096), int(u)) for u in rng.integers(-100, 101, 64)]
    for am, u in cases:
        y = np.zeros((am.size, 8), np.int64)
        y[:, 3] = am * np.where(am % 3 == 0, -1, 1)                                     # sign does not matter
        gold, gsat = choose_scale_bytes(y, np.full(am.size, u, np.int64), p)
        got, sat = _scale_mr_f32(am, u, bits, rnd == "nearest")
        bad = np.flatnonzero(got != gold[:, 0])
        assert bad.size == 0, f"u={u}: {bad.size} maxima differ, first max {am[bad[0]]}: {got[bad[0]]} vs {gold[bad[0], 0]}"
        assert np.array_equal(sat, gsat)


def _key_rule_f16(x: np.ndarray, s16, mu16):
    """kv_encode.cu key_front_pair in NumPy float16 (IEEE round to nearest even: a float16 product or
    difference rounds once; the float32 intermediate is exact for products and innocuous for sums)."""
    f = x.view(np.float16)
    big = np.float16(65504)
    with np.errstate(over="ignore", invalid="ignore"):
        t = f if s16 is None else np.clip(f * s16, -big, big)       # sat(RN16(x s)) (+-inf -> +-max)
        if mu16 is not None:
            t = np.clip(t - mu16, -big, big)
    return np.where(np.isfinite(f), t, f).view(np.uint16)


@pytest.mark.parametrize("keyf", [1, 2, 3])
def test_key_front_rule_and_table_match_golden(keyf):
    """The key front end's rule (fp16 multiply, saturate, fp16 subtract, saturate; NaN/inf lanes pass)
    equals sim_models.center(scale_keys(x, s), scale_keys(mu, s)) on every fp16 pattern against scales
    2^-14..2^14 and centering vectors with fp16 max, subnormals and signed zeros; the table the kernel
    reads (key_table, entry c * heads + h, word j of it) holds exactly s and that mu'."""
    from sim_models import center, scale_keys
    from gpu_ref.encode import key_table
    n, heads = 128, 4
    p = FormatParams(n=n)
    rng = np.random.default_rng(keyf)
    e = rng.integers(-14, 15, (heads, n))
    e[0, :4] = [-14, 14, 0, 13]
    s16 = np.exp2(e).astype(np.float16) if keyf & 1 else None
    mu = (rng.standard_normal((heads, n)) * 3).astype(np.float16) if keyf & 2 else None
    if mu is not None:
        mu[1, :8] = np.array([65504, -65504, 6e-8, -6e-8, 0.0, -0.0, 1e-5, 2.0], np.float16)
    x = np.arange(1 << 16, dtype=np.uint16).reshape(-1, heads, n)                         # every pattern
    x = np.concatenate([x, rng.permutation(np.arange(1 << 16, dtype=np.uint16)).reshape(-1, heads, n)])
    gold = x
    if s16 is not None:
        gold = scale_keys(gold, s16, p)
    if mu is not None:
        gold = center(gold, mu if s16 is None else scale_keys(mu, s16, p).view(np.float16), p)
    mus = None if mu is None else (mu if s16 is None else scale_keys(mu, s16, p).view(np.float16))
    got = _key_rule_f16(x, s16, mus)
    nan = np.isnan(x.view(np.float16))
    assert np.array_equal(got[~nan], gold[~nan]) and np.array_equal(got[nan], x[nan])
    kf = key_table(n, mu, s16, cp=np)
    assert kf.keyf == keyf and kf.heads == heads and kf.table.dtype == np.uint32
    wpc = 2 if keyf == 3 else 4
    for h in range(heads):
        for k in range(n // 2):
            t = kf.table[k // wpc, h]
            j = k % wpc
            e_ = 2 if keyf == 3 else 1
            s2, m2 = t[e_ * j], t[e_ * j + e_ - 1]
            if s16 is not None:
                assert s2 == s16[h, 2 * k:2 * k + 2].view(np.uint32)[0]
            if mus is not None:
                assert m2 == mus[h, 2 * k:2 * k + 2].view(np.uint32)[0]


def test_key_table_rejects_bad_tables():
    """key_table: scales that are not powers of two in the kernels' range and centering vectors that are
    not finite get an error naming the parameter."""
    from gpu_ref.encode import key_table
    ok = np.ones((2, 64), np.float16)
    for bad in (np.float16(3.0), np.float16(0.0), np.float16(-1.0), np.float16(np.inf), np.float16(2.0 ** -15),
                np.float16(2.0 ** -24)):
        s = ok.copy()
        s[1, 5] = bad
        with pytest.raises(ValueError, match="s16"):
            key_table(64, None, s, cp=np)
    for bad in (np.inf, -np.inf, np.nan):
        mu = np.zeros((2, 64), np.float16)
        mu[0, 3] = bad
        with pytest.raises(ValueError, match="mu16"):
            key_table(64, mu, ok, cp=np)
        with pytest.raises(ValueError, match="mu16"):
            key_table(64, mu, None, cp=np)
    s = ok.copy()
    s[0, :2] = [2.0 ** -14, 2.0 ** 15]
    assert key_table(64, None, s, cp=np).keyf == 1


def _folded_kernel_i32(x: np.ndarray, s16, mu16, m: int, mask: np.ndarray):
    """kv_encode.cu's folded key front end (KEYF) in NumPy int32, step for step: e from the exponent field
    of the table's s (or 0), mu' from the table (or +0); the lane decode with NaN -> +0 and inf -> +-65504
    (e = 0, mu' = +0 there), the scaled exponent saturated above 30, emax = 1 + max(Ex, Em), the two
    aligners (sh > 12 gives 0), the subtraction, the clamp and D. Returns (x, u, flags) of the vectors."""
    h = x.astype(np.int32)
    f, fr = (h >> 10) & 31, h & 1023
    e = ((s16.view(np.uint16).astype(np.int32) >> 10) & 31) - 15 if s16 is not None else np.zeros_like(h)
    mh = mu16.view(np.uint16).astype(np.int32) if mu16 is not None else np.zeros_like(h)
    e, mh = np.broadcast_to(e, h.shape), np.broadcast_to(mh, h.shape)
    spec = f == 31
    nan, inf = spec & (fr != 0), spec & (fr == 0)
    e, mh = np.where(spec, 0, e), np.where(spec, 0, mh)
    h, f, fr = np.where(nan, 0, h), np.where(nan, 0, np.where(inf, 30, f)), np.where(nan, 0, np.where(inf, 1023, fr))
    sx, gx, ex = h >> 15, np.where(f > 0, fr | 1024, fr), np.maximum(f, 1) + e
    sat = ex > 30
    ex, gx = np.where(sat, 30, ex), np.where(sat, 2047, gx)
    fm = (mh >> 10) & 31
    sm, gm, em = mh >> 15, np.where(fm > 0, (mh & 1023) | 1024, mh & 1023), np.maximum(fm, 1)
    emax = np.maximum(ex, em).max(axis=-1, keepdims=True) + 1
    off, lim = m - 12, (1 << (m - 1)) - 1

    def align(g, sh):
        left = g << np.maximum(-sh, 0)
        right = (g + (1 << np.clip(sh - 1, 0, 30))) >> np.clip(sh, 0, 31)
        return np.where(sh <= 0, left, np.where(sh > 12, 0, right))
    xa, ma = align(gx, emax - ex - off), align(gm, emax - em - off)
    y = np.clip(np.where(sx == 1, -xa, xa) - np.where(sm == 1, -ma, ma), -lim, lim)
    y = np.where(mask[None, :] == 1, -y, y)
    flags = np.where(nan.any(-1), 1, 0) | np.where(inf.any(-1), 2, 0)
    return y, (emax[:, 0] - 15 - m + 2), flags


def _folded_kernel_f32(x: np.ndarray, s16, mu16, m: int, mask: np.ndarray):
    """The fp32 steps kv_encode.cu's folded key front end takes on vectors without NaN / inf lanes:
    Ex + 15 = max(E, 1) + (exponent field of s) and Em + 15 in 16-bit halves, emax = 1 + max(1, min(30,
    max)), X = sat(k s) in fp32, each side one FMA RN(X 2^-u (1 + 2^-20) + 1.5 2^23) (the exact product
    and sum in float64, then one rounding to float32), the difference, the clamp and D. Returns (x, u)."""
    h = x.astype(np.int32)
    es = (s16.view(np.uint16).astype(np.int32) >> 10) & 31 if s16 is not None else np.full_like(h, 15)
    ex = np.maximum((h >> 10) & 31, 1) + np.broadcast_to(es, h.shape)
    if mu16 is not None:
        ex = np.maximum(ex, np.maximum((mu16.view(np.uint16).astype(np.int32) >> 10) & 31, 1) + 15)
    emax = np.maximum(np.minimum(ex.max(axis=-1, keepdims=True) - 15, 30), 1) + 1
    u = emax - 15 - m + 2
    pk = np.exp2(-u).astype(np.float32) * np.float32(1 + 2.0 ** -20)
    c23 = np.float32(1.5 * 2 ** 23)

    def fma_round(v):
        return (v.astype(np.float64) * pk.astype(np.float64) + np.float64(c23)).astype(np.float32)
    xv = x.view(np.float16).astype(np.float32)
    if s16 is not None:
        xv = np.clip(xv * s16.astype(np.float32), np.float32(-65504), np.float32(65504))
    mq = fma_round(mu16.view(np.float16).astype(np.float32)) if mu16 is not None else c23
    lim = np.float32((1 << (m - 1)) - 1)
    y = np.clip(fma_round(xv) - mq, -lim, lim).astype(np.int32)
    return np.where(mask[None, :] == 1, -y, y), u[:, 0]


@pytest.mark.parametrize("keyf", [1, 2, 3])
def test_folded_key_front_kernel_steps_match_golden(keyf):
    """The write kernel's folded key front end (its int32 steps and, on vectors of finite lanes, its fp32
    steps, in NumPy) == sim_models.bfp.to_block_fp_keys on the pinned key-front-end set and on every fp16
    pattern, for M = 12 (the instantiated width) and 8, 16;
    with the table's s the exponent field minus 15 is e for every e the kernels take."""
    from sim_models.bfp import to_block_fp_keys
    from sim_models.keyscale import front_table
    from sim_models.testvectors import key_front_set
    n = 128
    for e in range(-14, 15):
        assert ((int(np.float16(2.0 ** e).view(np.uint16)) >> 10) & 31) - 15 == e
    x, mu, e, slot, _ = key_front_set(n, 256)
    allp = np.arange(1 << 16, dtype=np.uint16).reshape(-1, n)
    rng = np.random.default_rng(keyf)
    x = np.concatenate([x, allp])
    slot = np.concatenate([slot, rng.integers(0, mu.shape[0], allp.shape[0])])
    e = np.clip(e, -14, 14) if keyf & 1 else np.zeros_like(e)
    if not keyf & 2:
        mu = np.zeros_like(mu)
    s16 = np.exp2(e).astype(np.float16) if keyf & 1 else None
    for m in (12, 8, 16):
        p = FormatParams(n=n, mant_bits=m)
        mask = sign_mask(n, 0)
        gold = to_block_fp_keys(x, mu[slot], e[slot], p, mask)
        got = _folded_kernel_i32(x, None if s16 is None else s16[slot], mu[slot] if keyf & 2 else None, m, mask)
        for name, a, b in zip(("x", "u", "flags"), gold, got):
            assert np.array_equal(a, b), f"M={m} {name}: {(a != b).sum()} differ"
        fin = ((x & 0x7C00) != 0x7C00).all(axis=-1)                 # the fp32 steps: vectors of finite lanes
        assert fin.sum() > 500
        got = _folded_kernel_f32(x[fin], None if s16 is None else s16[slot[fin]],
                                 mu[slot[fin]] if keyf & 2 else None, m, mask)
        for name, a, b in zip(("x", "u"), (gold[0][fin], gold[1][fin]), got):
            assert np.array_equal(a, b), f"M={m} fp32 steps {name}: {(a != b).sum()} differ"
