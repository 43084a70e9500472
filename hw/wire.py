"""Amaranth layouts of the stream payloads, built from :mod:`sim_models.wire`.

The components publish them in their signatures (``KVEncoder.o``,
``KVDecoder.i``, the lane words of ``KVEncoder.i`` / ``KVDecoder.o``);
the field list, offsets and the NumPy pack / unpack are defined once, in
:mod:`sim_models.wire`. A field the RTL addresses element by element
(``Field.array``: scale bytes, zero points, lanes) is an ``ArrayLayout``, also
with one element (N = G); the code plane and the flags are plain integers.
"""

from __future__ import annotations

from amaranth.lib import data

from sim_models import wire
from sim_models.params import FormatParams


def struct_layout(lay: wire.WireLayout) -> data.StructLayout:
    """The ``StructLayout`` of a :class:`sim_models.wire.WireLayout` (same offsets)."""
    fields = {}
    for f in lay.fields:
        fields[f.name] = data.ArrayLayout(f.elem_bits, f.count) if f.array else f.width
    out = data.StructLayout(fields)
    assert all(out[f.name].offset == f.offset for f in lay.fields) and out.size == lay.width
    return out


def encoder_output_layout(p: FormatParams) -> data.StructLayout:
    """``KVEncoder.o`` payload: codes | scales[k] | [zeros[k] (asym)] | flags."""
    return struct_layout(wire.encoder_output(p))


def decoder_input_layout(p: FormatParams) -> data.StructLayout:
    """``KVDecoder.i`` payload: codes | scales[k] | [zeros[k] (asym)]."""
    return struct_layout(wire.decoder_input(p))


def encoder_input_layout(p: FormatParams, key_slots: int = 0):
    """``KVEncoder.i`` payload: the lanes (:func:`lanes_layout`), or with a key front end
    (``key_slots`` > 0) lanes | slot | bypass."""
    if not key_slots:
        return lanes_layout(p)
    return struct_layout(wire.encoder_input(p, key_slots))


def key_config_layout(p: FormatParams, key_slots: int) -> data.StructLayout:
    """``KVEncoder.cfg`` payload: mu_s | e | lane | slot (the key front end's table port)."""
    return struct_layout(wire.key_config(p, key_slots))


def lanes_layout(p: FormatParams) -> data.ArrayLayout:
    """Encoder input / decoder output: N lanes of 16 bits."""
    (f,) = wire.lanes(p).fields
    return data.ArrayLayout(f.elem_bits, f.count)
