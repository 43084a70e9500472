"""The vpair storage order of the value code plane (gpu_ref/layout.py): a permutation of the golden bytes.

CPU only (runs in CI): round trips on every byte pattern of a row and on random rows, the permutation
property bit by bit, the decode kernel's reading of the layout emulated bit for bit against the golden
codes, and the errors. The device tests (tests/test_gpu.py) check the write kernel's bytes against
``interleave(golden bytes)`` and decode over vpair caches.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu_ref import layout as L
from sim_models.pack import pack_codes, unpack_codes

NS = (64, 128, 256)


def _all_bytes_rows(r: int) -> np.ndarray:
    """256 rows of r bytes in which every byte position takes each of the 256 values once."""
    i = np.arange(256)[:, None]
    j = np.arange(r)[None, :]
    return ((i + 37 * j) % 256).astype(np.uint8)


@pytest.mark.parametrize("n", NS)
def test_round_trip_every_byte_pattern(n):
    r = n * 3 // 8
    x = _all_bytes_rows(r)
    for perm in (x, x[::-1].copy(), np.roll(x, 1, axis=0)):  # each value next to different partners
        y = L.interleave(perm)
        assert y.shape == perm.shape and y.dtype == np.uint8
        assert np.array_equal(L.deinterleave(y), perm)
        assert np.array_equal(L.interleave(L.deinterleave(perm)), perm)
        # a byte permutation inside each token pair: same multiset of bytes per pair
        a = np.sort(perm.reshape(128, 2 * r), axis=1)
        b = np.sort(y.reshape(128, 2 * r), axis=1)
        assert np.array_equal(a, b)


@pytest.mark.parametrize("n", NS)
def test_round_trip_random_rows(n):
    rng = np.random.default_rng(n)
    x = rng.integers(0, 256, (3, 2, 40, n * 3 // 8), dtype=np.uint8)
    assert np.array_equal(L.deinterleave(L.interleave(x)), x)
    assert not np.array_equal(L.interleave(x), x)


@pytest.mark.parametrize("n", NS)
def test_bit_permutation_within_pairs(n):
    """Every single set bit of a token pair lands on one distinct bit of the same pair (a bijection)."""
    r = n * 3 // 8
    nbits = 2 * r * 8
    x = np.zeros((nbits, 2 * r), np.uint8)
    x[np.arange(nbits), np.arange(nbits) // 8] = 1 << (np.arange(nbits) % 8)
    y = L.interleave(x.reshape(nbits, 2, r)).reshape(nbits, 2 * r)
    bits = np.unpackbits(y, axis=1, bitorder="little")
    assert np.all(bits.sum(axis=1) == 1)
    pos = bits.argmax(axis=1)
    assert len(set(pos.tolist())) == nbits


def _prmt(x: int, y: int, sel: int) -> int:
    b = [(x >> (8 * k)) & 0xFF for k in range(4)] + [(y >> (8 * k)) & 0xFF for k in range(4)]
    return sum(b[(sel >> (4 * k)) & 7] << (8 * k) for k in range(4))


@pytest.mark.parametrize("n", NS)
def test_decode_reading_matches_golden_codes(n):
    """The decode kernel's V read (kv_decode_attn.cu, VIL): thread g of block bb takes word 3 (g >> 1) + 2 (g & 1)
    (d) and word 3 (g >> 1) + 1 (h) of each 64-lane block of a token pair, w = PRMT(d, h, 0x6341 / 0x7351), z = w >> 8;
    item i (lane 64 bb + 8 g + i) is the 3-bit field at offsets (d 0, d 3, d 6, w 1, w 4, w 7, z 2, z 5) of both
    16-bit halves (low: token 2i, high: token 2i + 1). Emulated for every thread on random golden codes."""
    rng = np.random.default_rng(7 + n)
    codes = rng.integers(-4, 4, (6, n))
    rows = pack_codes(codes, 3)                                    # golden bytes [6, 3N/8]
    assert np.array_equal(unpack_codes(rows, n, 3), codes)
    st = L.interleave(rows)
    items = (("d", 0), ("d", 3), ("d", 6), ("w", 1), ("w", 4), ("w", 7), ("z", 2), ("z", 5))
    for pair in range(3):
        words = st[2 * pair:2 * pair + 2].reshape(-1).view("<u4")
        for bb in range(n // 64):
            for g in range(8):
                d = int(words[12 * bb + 3 * (g >> 1) + 2 * (g & 1)])
                h = int(words[12 * bb + 3 * (g >> 1) + 1])
                w = _prmt(d, h, 0x7351 if g & 1 else 0x6341)
                src = {"d": d, "w": w, "z": w >> 8}
                for i, (reg, o) in enumerate(items):
                    lane = 64 * bb + 8 * g + i
                    for half in (0, 1):
                        f = (src[reg] >> (16 * half + o)) & 7
                        c = f - 8 if f & 4 else f                  # two's complement field
                        assert c == codes[2 * pair + half, lane], (pair, bb, g, i, half)


def test_errors():
    x = np.zeros((4, 48), np.uint8)
    with pytest.raises(ValueError, match="bits=4"):
        L.interleave(x, bits=4)
    with pytest.raises(ValueError, match="even token count"):
        L.interleave(np.zeros((3, 48), np.uint8))
    with pytest.raises(ValueError, match="multiple of 6"):
        L.deinterleave(np.zeros((4, 32), np.uint8))
    with pytest.raises(TypeError, match="uint8"):
        L.interleave(x.astype(np.int16))
    with pytest.raises(ValueError, match="layout must be"):
        L.to_wire(x, "pairs", 3)
    assert L.to_wire(x, "wire", 3) is x
    assert L.vpair_supported(3, 64) and not L.vpair_supported(4, 64) and not L.vpair_supported(3, 32)


def test_plan_and_write_config_carry_the_layout():
    """plan/run and the write kernel's configuration name the layout; a mismatch is refused before any launch."""
    import gpu_ref
    from gpu_ref.encode import encode_cfg
    from sim_models.params import FormatParams

    p3, p4 = FormatParams(n=128, bits=3), FormatParams(n=128, bits=4)
    args = dict(batch=2, q_heads=8, kv_heads=2, max_length=1000, num_sms=132, num_splits=2)
    pw = gpu_ref.plan(p4, p3, **args)
    pv = gpu_ref.plan(p4, p3, layout="vpair", **args)
    assert (pw.layout, pw.targs[13]) == ("wire", "0") and (pv.layout, pv.targs[13]) == ("vpair", "1")
    with pytest.raises(ValueError, match="layout 'vpair' needs 3-bit values"):
        gpu_ref.plan(p3, p4, layout="vpair", **args)
    with pytest.raises(ValueError, match="layout must be one of"):
        gpu_ref.plan(p3, layout="golden", **args)
    with pytest.raises(ValueError, match="does not match the plan's layout 'vpair'"):
        gpu_ref.run_planes(pv, None, None, None, None, None, None, None)
    with pytest.raises(ValueError, match="does not match the plan's layout 'wire'"):
        gpu_ref.run_planes(pw, None, None, None, None, None, None, None, layout="vpair")
    assert encode_cfg(p3, layout="vpair")[0][-1] == "1" and encode_cfg(p3)[0][-1] == "0"
    with pytest.raises(ValueError, match="bits=4"):
        encode_cfg(p4, layout="vpair")
    with pytest.raises(ValueError, match="lptm"):
        encode_cfg(p3, tune={"lptm": 32}, layout="vpair")
    assert encode_cfg(FormatParams(n=64, bits=3), layout="vpair")[2] == 64
