"""sim_models.wire (stream payload layouts, NumPy pack / unpack) and hw.wire (the same
layouts as Amaranth StructLayouts, published by the components)."""

from __future__ import annotations

import numpy as np
import pytest

from hw import KVDecoder, KVEncoder
from hw.wire import decoder_input_layout, encoder_output_layout
from kvtest.inputs import encoder_rows
from sim_models import FormatParams, encode, wire


def test_lane_words():
    bits = np.arange(2 * 8, dtype=np.uint16).reshape(2, 8) * 0x1111
    w = wire.rows_to_ints(wire.lane_rows(bits))
    for v in range(2):
        for k in range(8):
            assert (w[v] >> (16 * k)) & 0xFFFF == bits[v, k]
        assert (wire.int_to_lanes(w[v], 8) == bits[v]).all()
    rnd = np.random.default_rng(0).integers(0, 1 << 16, size=(5, 64), dtype=np.uint16)
    assert wire.rows_to_binstr(wire.lane_rows(rnd), 1024) == \
        wire.ints_to_binstr(wire.rows_to_ints(wire.lane_rows(rnd)), 1024)
    rows = np.array([[0x01, 0x80], [0xFF, 0x00]], dtype=np.uint8)
    assert wire.rows_to_binstr(rows, 12) == ["000000000001", "000011111111"]
    with pytest.raises(ValueError, match="width"):
        wire.rows_to_binstr(rows, 17)


def test_encoder_output_word():
    p = FormatParams(n=64, block=32, bits=3)
    bits = np.zeros((1, 64), dtype=np.uint16)
    bits[0, 5] = 0x7E00            # NaN -> flag bit 0
    bits[0, 9] = 0x3C00            # 1.0
    rows, flags = encoder_rows(bits, p)
    e = encode(bits, p)
    w = wire.rows_to_ints(rows)[0]
    assert w & ((1 << 192) - 1) == int.from_bytes(e.codes[0].tobytes(), "little")
    assert (w >> 192) & 0xFFFF == int.from_bytes(e.scales[0].tobytes(), "little")
    assert w >> 208 == int(e.flags[0]) == 1 == flags[0]
    lay = wire.encoder_output(p)
    assert lay.width == 211 and lay.unpack(w)["flags"] == 1
    assert lay.elements(w, "scales") == e.scales[0].tolist()


@pytest.mark.parametrize("mode,block", [("midrise", 16), ("asym", 16), ("midtread", 32)])
def test_layouts_match_components(mode, block):
    """The components publish the layouts of sim_models.wire: same fields, offsets,
    widths; scale bytes and zero points are arrays also with one block (N = G)."""
    p = FormatParams(n=32, block=block, bits=3, mode=mode)
    nb = 32 // block
    enc, dec = wire.encoder_output(p), wire.decoder_input(p)
    names = ["codes", "scales"] + (["zeros"] if mode == "asym" else [])
    assert enc.names() == names + ["flags"] and dec.names() == names
    assert enc["flags"].offset == 96 + 8 * nb + (8 * nb if mode == "asym" else 0)
    assert decoder_input_layout(p)["scales"].shape.length == nb
    for lay, sl, port in ((enc, encoder_output_layout(p), KVEncoder(p).o),
                          (dec, decoder_input_layout(p), KVDecoder(p).i)):
        assert port.payload.shape() == sl and sl.size == lay.width
        assert {n: (f.offset, f.width) for n, f in sl} == \
            {f.name: (f.offset, f.width) for f in lay.fields}
    assert KVEncoder(p).i.payload.shape().size == wire.lanes(p).width == 16 * 32


def test_pack_errors():
    p = FormatParams(n=16, block=8, bits=3, mode="asym")
    codes = np.zeros((2, p.code_bytes), np.uint8)
    scales = np.ones((2, 2), np.uint8)
    with pytest.raises(ValueError, match="zeros"):
        wire.decoder_input_rows(p, codes, scales)
    with pytest.raises(ValueError, match="scales"):
        wire.decoder_input_rows(p, codes, scales[:, :1], scales)
    with pytest.raises(ValueError, match="unexpected"):
        wire.decoder_input(p).pack(codes=codes, scales=scales, zeros=scales, flags=scales)
    rows = wire.decoder_input_rows(p, codes, scales, np.full((2, 2), 7, np.uint8))
    assert wire.rows_to_ints(rows) == [(0x0101 << 48) | (0x0707 << 64)] * 2
