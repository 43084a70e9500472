"""Amaranth layouts of the stream payloads, built from :mod:`sim_models.wire`.

The components publish them in their signatures (``KVEpilogue.o``,
``KVDecompressor.i``, the lane words of ``KVEpilogue.i`` / ``KVDecompressor.o``);
the field list, offsets and the NumPy pack / unpack are defined once, in
:mod:`sim_models.wire`. A field of several elements is an ``ArrayLayout`` of
them, except the code plane, which stays one packed integer.
"""

from __future__ import annotations

from amaranth.lib import data

from sim_models import wire
from sim_models.params import FormatParams


def struct_layout(lay: wire.WireLayout) -> data.StructLayout:
    """The ``StructLayout`` of a :class:`sim_models.wire.WireLayout` (same offsets)."""
    fields = {}
    for f in lay.fields:
        fields[f.name] = (data.ArrayLayout(f.elem_bits, f.count)
                          if f.count > 1 and f.name != "codes" else f.width)
    out = data.StructLayout(fields)
    assert all(out[f.name].offset == f.offset for f in lay.fields) and out.size == lay.width
    return out


def encoder_output_layout(p: FormatParams) -> data.StructLayout:
    """``KVEpilogue.o`` payload: codes | scales[k] | [zeros[k] (asym)] | flags."""
    return struct_layout(wire.encoder_output(p))


def decoder_input_layout(p: FormatParams) -> data.StructLayout:
    """``KVDecompressor.i`` payload: codes | scales[k] | [zeros[k] (asym)]."""
    return struct_layout(wire.decoder_input(p))


def lanes_layout(p: FormatParams) -> data.ArrayLayout:
    """Encoder input / decoder output: N lanes of 16 bits."""
    return data.ArrayLayout(wire.LANE_BITS, p.n)
