"""Stream payload layouts of the RTL ports, and their NumPy pack / unpack.

One definition of every stream word (LSB first, each field a little-endian
integer of its elements; FORMAT.md 4 and 7 give the planes' byte order):

* encoder output (``KVEncoder.o``): ``codes | scales | [zeros] | flags``;
* decoder input (``KVDecoder.i``): ``codes | scales | [zeros]``;
* lanes (encoder input, decoder output): N 16-bit fp16/bf16 patterns, lane k
  at bits [16k, 16k+16).

``zeros`` (one zero-point byte per block) exists for mode ``asym`` only. The
Amaranth ``data.StructLayout`` of each word is built from these field lists by
:mod:`hw.wire`; this module needs only NumPy, so cocotb code and tests import
it without Amaranth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .params import FormatParams

#: Bits per lane of the lane words (fp16 / bf16 bit patterns).
LANE_BITS = 16
#: Width of the flags field of the encoder output (FLAG_NAN | FLAG_INF | FLAG_SAT).
FLAG_BITS = 3


@dataclass(frozen=True)
class Field:
    """One payload field: ``count`` elements of ``elem_bits`` bits, element j at
    bits ``[offset + j*elem_bits, +elem_bits)`` of the word. ``array``: the RTL
    addresses the elements one by one (per-block bytes, lanes), else it treats
    the field as one integer (the packed code plane, the flags)."""

    name: str
    elem_bits: int
    count: int
    offset: int
    array: bool = False

    @property
    def width(self) -> int:
        return self.elem_bits * self.count


@dataclass(frozen=True)
class WireLayout:
    """Fields of one stream word, LSB first (no gaps)."""

    fields: tuple[Field, ...]

    @property
    def width(self) -> int:
        """Bits of the word."""
        return sum(f.width for f in self.fields)

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def __contains__(self, name: str) -> bool:
        return any(f.name == name for f in self.fields)

    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def offsets(self) -> dict:
        """{name: {"offset": bit, "width": bits}} (the manifest's form)."""
        return {f.name: {"offset": f.offset, "width": f.width} for f in self.fields}

    def pack(self, **planes) -> np.ndarray:
        """Planes -> little-endian byte rows uint8 [V, ceil(width / 8)].

        Every field but the last must be whole bytes: a byte field takes a
        uint8 [V, width/8] plane (its little-endian bytes); the last field may
        be narrower and then takes uint8 [V] values.

        Raises:
            ValueError: a plane is missing, unexpected, or of the wrong shape
                (the message names it).
        """
        extra = set(planes) - set(self.names())
        if extra:
            raise ValueError(f"unexpected plane(s) {sorted(extra)}; fields: {self.names()}")
        cols = []
        rows = None
        for f in self.fields:
            if f.name not in planes or planes[f.name] is None:
                raise ValueError(f"plane {f.name!r} is required (fields: {self.names()})")
            a = np.asarray(planes[f.name])
            if f.width % 8 == 0:
                want = (f.width // 8,)
            elif f is self.fields[-1]:
                want = ()
            else:
                raise ValueError(f"field {f.name!r} ({f.width} bits) is not whole bytes")
            if a.ndim != 1 + len(want) or a.shape[1:] != want or (rows is not None and
                                                                    a.shape[0] != rows):
                raise ValueError(f"plane {f.name!r}: expected shape [V, *{list(want)}], "
                                 f"got {list(a.shape)}")
            rows = a.shape[0]
            cols.append(a.astype(np.uint8).reshape(rows, -1))
        return np.ascontiguousarray(np.concatenate(cols, axis=1))

    def unpack(self, word: int) -> dict[str, int]:
        """One word (int) -> {field name: field value (int)}."""
        return {f.name: (word >> f.offset) & ((1 << f.width) - 1) for f in self.fields}

    def elements(self, word: int, name: str) -> list[int]:
        """The elements of field ``name`` of ``word``, element 0 first."""
        f = self[name]
        v = (word >> f.offset) & ((1 << f.width) - 1)
        return [(v >> (j * f.elem_bits)) & ((1 << f.elem_bits) - 1) for j in range(f.count)]


def _layout(*spec) -> WireLayout:
    fields, off = [], 0
    for name, elem_bits, count, array in spec:
        fields.append(Field(name, elem_bits, count, off, array))
        off += elem_bits * count
    return WireLayout(tuple(fields))


def _planes(p: FormatParams) -> list[tuple[str, int, int, bool]]:
    spec = [("codes", p.bits, p.n, False), ("scales", 8, p.n_blocks, True)]
    if p.zero_bytes:
        spec.append(("zeros", 8, p.zero_bytes, True))
    return spec


def encoder_output(p: FormatParams) -> WireLayout:
    """``KVEncoder.o`` payload: codes (N*b) | scales (8 per block) | [zeros (8 per
    block, mode asym)] | flags (3)."""
    return _layout(*_planes(p), ("flags", FLAG_BITS, 1, False))


def decoder_input(p: FormatParams) -> WireLayout:
    """``KVDecoder.i`` payload: codes | scales | [zeros (mode asym)] (the
    encoder output without the flags)."""
    return _layout(*_planes(p))


def lanes(p: FormatParams) -> WireLayout:
    """Encoder input / decoder output: N lanes of 16 bits."""
    return _layout(("lanes", LANE_BITS, p.n, True))


#: Bits of a key-front-end scale exponent e (two's complement; range
#: ``sim_models.keyscale.LOG2_S_RANGE``).
KEY_E_BITS = 5


def key_slot_bits(slots: int) -> int:
    """Bits of the slot select of a key front end with ``slots`` table slots (at least 1).

    Raises:
        ValueError: ``slots`` < 1 (the message names ``key_slots``).
    """
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ValueError(f"key_slots (table slots of the key front end) must be an int >= 1, "
                         f"got {slots!r}")
    return max(1, (slots - 1).bit_length())


def encoder_input(p: FormatParams, key_slots: int = 0) -> WireLayout:
    """``KVEncoder.i`` payload: the N lanes, and with a key front end (``key_slots`` > 0)
    the side band ``slot`` (table slot of the vector) and ``bypass`` (1: the lanes go to
    the encoder unchanged: values, keys without the front end) above them."""
    if not key_slots:
        return lanes(p)
    return _layout(("lanes", LANE_BITS, p.n, True), ("slot", key_slot_bits(key_slots), 1, False),
                   ("bypass", 1, 1, False))


def key_config(p: FormatParams, key_slots: int) -> WireLayout:
    """``KVEncoder.cfg`` payload (the key front end's table load port, one lane per word):
    ``mu_s`` (fp16 bits of RN16(mu * 2^e)) | ``e`` (KEY_E_BITS, two's complement) |
    ``lane`` (log2 N bits) | ``slot``."""
    return _layout(("mu_s", LANE_BITS, 1, False), ("e", KEY_E_BITS, 1, False),
                   ("lane", max(1, p.log2n), 1, False), ("slot", key_slot_bits(key_slots), 1, False))


def key_config_words(p: FormatParams, key_slots: int, slot: int, mu_s: np.ndarray,
                     log2_s: np.ndarray) -> list[int]:
    """The ``cfg`` words (ints) that load table ``slot``: lane 0 first, N words.

    Raises:
        ValueError: slot out of range, tables not of shape [N].
    """
    lay = key_config(p, key_slots)
    if not 0 <= slot < key_slots:
        raise ValueError(f"slot must be in [0, {key_slots}), got {slot}")
    mu_s, log2_s = np.asarray(mu_s).reshape(-1), np.asarray(log2_s).reshape(-1)
    if mu_s.shape != (p.n,) or log2_s.shape != (p.n,):
        raise ValueError(f"mu_s and log2_s must have shape [N={p.n}], got "
                         f"{list(mu_s.shape)}, {list(log2_s.shape)}")
    mb = mu_s.view(np.uint16) if mu_s.dtype == np.float16 else mu_s.astype(np.uint16)
    emask = (1 << KEY_E_BITS) - 1
    return [(int(mb[k]) << lay["mu_s"].offset) | ((int(log2_s[k]) & emask) << lay["e"].offset)
            | (k << lay["lane"].offset) | (slot << lay["slot"].offset) for k in range(p.n)]


def encoder_input_ints(bits: np.ndarray, p: FormatParams, key_slots: int, slot, bypass) -> list[int]:
    """Encoder input words (ints) of uint16 [V, N] lanes with the side band ``slot`` and
    ``bypass`` (scalars or [V])."""
    lay = encoder_input(p, key_slots)
    v = np.asarray(bits).shape[0]
    slot = np.broadcast_to(np.asarray(slot, dtype=np.int64), (v,))
    bypass = np.broadcast_to(np.asarray(bypass, dtype=np.int64), (v,))
    so, bo = lay["slot"].offset, lay["bypass"].offset
    return [w | (int(s) << so) | (int(b) << bo)
            for w, s, b in zip(rows_to_ints(lane_rows(bits)), slot, bypass)]


# --- NumPy side: planes -> words ------------------------------------------------------

def encoder_output_rows(p: FormatParams, codes, scales, flags, zeros=None) -> np.ndarray:
    """Encoder output words as byte rows uint8 [V, ceil(width/8)] from the planes of
    ``sim_models.encode`` (``zeros``: mode asym only, ignored otherwise).

    Raises:
        ValueError: mode asym without ``zeros``; a plane of the wrong shape.
    """
    lay = encoder_output(p)
    z = {"zeros": zeros} if "zeros" in lay else {}
    return lay.pack(codes=codes, scales=scales, flags=np.asarray(flags, np.uint8), **z)


def decoder_input_rows(p: FormatParams, codes, scales, zeros=None) -> np.ndarray:
    """Decoder input words as byte rows (``zeros``: mode asym only, ignored otherwise).

    Raises:
        ValueError: mode asym without ``zeros`` (the zero-point plane); a plane of
            the wrong shape.
    """
    lay = decoder_input(p)
    z = {"zeros": zeros} if "zeros" in lay else {}
    return lay.pack(codes=codes, scales=scales, **z)


def lane_rows(bits: np.ndarray) -> np.ndarray:
    """uint16 [V, N] lane patterns -> byte rows uint8 [V, 2N] (lane k at bits [16k, 16k+16))."""
    b = np.ascontiguousarray(np.asarray(bits).astype("<u2"))
    if b.ndim != 2:
        raise ValueError(f"bits: expected uint16 [V, N], got shape {list(b.shape)}")
    return b.view(np.uint8).reshape(b.shape[0], -1)


def rows_to_ints(rows: np.ndarray) -> list[int]:
    """Byte rows uint8 [V, nbytes] -> one Python int per row (little-endian)."""
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    raw, step = rows.tobytes(), rows.shape[1]
    return [int.from_bytes(raw[i:i + step], "little") for i in range(0, len(raw), step)]


def rows_to_binstr(rows: np.ndarray, width: int) -> list[str]:
    """Byte rows uint8 [V, nbytes] -> one MSB-first '0'/'1' string of ``width``
    characters per row (the VPI binary-string form of a ``width``-bit port).

    Raises:
        ValueError: ``width`` exceeds the bits of a row.
    """
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    if rows.ndim != 2 or width > 8 * rows.shape[1]:
        raise ValueError(f"width {width} does not fit rows of shape {list(rows.shape)}")
    bits = np.unpackbits(rows[:, ::-1], axis=1)[:, 8 * rows.shape[1] - width:]
    raw = (bits + ord("0")).astype(np.uint8).tobytes()
    return [raw[i:i + width].decode("ascii") for i in range(0, len(raw), width)]


def ints_to_binstr(words, width: int) -> list[str]:
    """Python ints -> MSB-first binary strings of ``width`` characters."""
    fmt = f"0{width}b"
    return [format(w, fmt) for w in words]


def int_to_lanes(word: int, n: int) -> np.ndarray:
    """One lane word (int) -> uint16 [n]."""
    return np.frombuffer(word.to_bytes(2 * n, "little"), dtype="<u2").astype(np.uint16)
