"""gpu_ref checks that need no GPU (run in CI): parameter refusals happen before CuPy is needed,
and the bit tricks the decode kernel uses reproduce the golden model (emulated in NumPy).
"""

from __future__ import annotations

import numpy as np
import pytest

import gpu_ref
from sim_models import FormatParams
from sim_models.pack import pack_codes
from sim_models.scale import scale_value


def test_unsupported_params_refused_without_gpu():
    with pytest.raises(ValueError, match="version-1"):
        gpu_ref.encode_kv(None, FormatParams(mode="midrise"))
    with pytest.raises(ValueError, match="version-1"):
        gpu_ref.KVCache(1, 1, 16, FormatParams(mode="lloydmax"))
    with pytest.raises(ValueError, match="capacity"):
        gpu_ref.KVCache(1, 1, 0)
    with pytest.raises(ValueError, match="supports"):
        gpu_ref.decode_attention(None, None, None, None, None, None, FormatParams(bits=4))
    with pytest.raises(ValueError, match="supports"):
        gpu_ref.decode_attention(None, None, None, None, None, None, FormatParams(n=512))
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


def test_decode_fragment_tricks_match_golden_codes():
    """K: PRMT + LOP3 give 1 + (c+4) 2^(o-10); V: PRMT + LOP3 + HFMA2 give c exactly."""
    kpairs = [[[0, 3], [1, 4]], [[8, 11], [9, 12]], [[6, 14], [7, 15]], [[2, 5], [10, 13]]]  # kv_decode_attn.cu
    rng = np.random.default_rng(0)
    n = 128
    codes = rng.integers(-3, 4, size=(2, n))
    rows = pack_codes(codes, 3)
    words = [np.concatenate([r, np.zeros(8, np.uint8)]).view("<u4").astype(np.int64) for r in rows]
    w = words[0]
    for tig in range(4):
        for p in range(2):
            jl, jh = kpairs[tig][p]
            bl, ol, bh, oh = (3 * jl) >> 3, (3 * jl) & 7, (3 * jh) >> 3, (3 * jh) & 7
            sel_e = bl | (min(bl + 1, 7) << 4) | (bh << 8) | (min(bh + 1, 7) << 12)
            sel_o = (bl + 2) | (min(bl + 3, 7) << 4) | ((bh + 2) << 8) | (min(bh + 3, 7) << 12)
            ma = (7 << ol) | (7 << (16 + oh))
            mb = (4 << ol) | (4 << (16 + oh)) | 0x3C003C00
            for c in range(n // 16):
                wl0 = (3 * c - 1) // 2 if c & 1 else (3 * c) // 2
                r = _lop_6a(_byte_perm(int(w[wl0]), int(w[wl0 + 1]), sel_o if c & 1 else sel_e), ma, mb)
                for half, j, o in ((0, jl, ol), (1, jh, oh)):
                    assert _h((r >> (16 * half)) & 0xFFFF) == 1 + (codes[0, 16 * c + j] + 4) * 2.0 ** (o - 10)
    for g_blk in (16, 32, 64):
        segl = g_blk // 8
        for bb in range(n // g_blk):
            for g in range(8):
                boff = 3 * (bb * g_blk + g * segl)
                segs = [int(((int(x[boff >> 5]) | (int(x[(boff >> 5) + 1]) << 32)) >> (boff & 31)) & 0xFFFFFFFF)
                        for x in words]
                for j in range(segl):
                    beta, o = (3 * j) >> 3, (3 * j) & 7
                    sel = beta | ((beta + 1) << 4) | ((beta + 4) << 8) | ((beta + 5) << 12)
                    r = _lop_6a(_byte_perm(segs[0], segs[1], sel), (7 << o) | (7 << (16 + o)),
                                (4 << o) | (4 << (16 + o)) | 0x64006400)
                    for half in range(2):
                        v = np.float32(_h((r >> (16 * half)) & 0xFFFF)) * np.float32(2.0 ** -o) \
                            - np.float32(2.0 ** (10 - o) + 4)
                        assert float(np.float16(v)) == codes[half, bb * g_blk + g * segl + j]


def test_scale_byte_to_float_formula():
    """scale_f in kv_decode_attn.cu: (s << 20) + (120 << 23) for s >= 8, s * 2^-9 below."""
    s = np.arange(256, dtype=np.uint32)
    hi = ((s << 20) + (120 << 23)).view(np.float32).astype(np.float64)
    lo = s.astype(np.float64) * 2.0 ** -9
    assert np.array_equal(np.where(s >= 8, hi, lo), scale_value(np.arange(256)))
