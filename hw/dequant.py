"""Read-path dequantization tables and the per-lane dequantizer of ``KVDecompressor``.

Bit-exact with ``sim_models.quant.dequantize`` (FORMAT.md 5): the
reconstructed FWHT output of lane i is ``yhat_i = level(code_i) * sig_k * 2^exp_k``
for lane i in block k, with the block's scale byte decoded to an integer
significand ``sig_k`` and a power-of-two exponent ``exp_k``.

The hardware never multiplies by the exponent: it keeps ``level * sig`` (a
small signed integer) per lane and the *exponent field* ``ef_k`` per block
(``exp_k = ef_k + SCALE_EXP_OFFSET``); :mod:`hw.ifwht` aligns blocks by
shifting and the float packer (:mod:`hw.tofloat`) applies the exponent.

Two tables define the format here, so another quantizer mode is a table swap,
not a restructuring:

* :class:`LevelTable`: code field (0 .. 2^b - 1, the raw b bits) -> integer
  level. Version 1 (``midtread``) is the two's-complement value of the field
  (``-2^(b-1) .. 2^(b-1) - 1``; the field ``-2^(b-1)`` is never written by the
  encoder but decodes like the golden model's ``unpack_codes``). A mode with
  half-integer levels (midrise) would use ``level = 2c + 1`` and
  ``exp_offset = -1``; Lloyd-Max would use its integer codebook.
* :class:`ScaleDecode`: scale byte -> (sig, exponent field). Version 1 is
  ``ue5m3``: ``sig = m`` (e == 0) or ``8 + m``, ``ef = max(e, 1)``,
  ``exp = ef - 10``.

Only the version-1 quantizer is implemented (``hw.epilogue.check_params``
refuses the others, naming the field).
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from sim_models.params import FormatParams

from .epilogue import check_params

#: Scale exponent = exponent field + SCALE_EXP_OFFSET (ue5m3: bias 7 + 3 mantissa bits).
SCALE_EXP_OFFSET = -10
#: Exponent field range of ue5m3 (field 0, the subnormals, reads as 1).
SCALE_EF_MIN, SCALE_EF_MAX = 1, 31
#: Largest scale significand (ue5m3: 8 + 7).
SCALE_SIG_MAX = 15


@dataclass(frozen=True)
class LevelTable:
    """Code field -> integer reconstruction level.

    Attributes:
        bits: code width b.
        levels: ``levels[f]`` is the level of the b-bit field value f.
        exp_offset: extra power of two, ``yhat = level * scale * 2^exp_offset``.
    """

    bits: int
    levels: tuple[int, ...]
    exp_offset: int = 0

    def __post_init__(self):
        if len(self.levels) != 1 << self.bits:
            raise ValueError(f"a {self.bits}-bit level table needs {1 << self.bits} entries")

    @property
    def is_twos_complement(self) -> bool:
        """True when level(f) is the two's-complement value of f (plain sign extension)."""
        b = self.bits
        return all(v == (f - (1 << b) if f >= 1 << (b - 1) else f)
                   for f, v in enumerate(self.levels))

    @property
    def shape(self) -> Shape:
        return Shape.cast(range(min(self.levels), max(self.levels) + 1))


def level_table(p: FormatParams) -> LevelTable:
    """The level table of ``p`` (version 1: midtread, two's-complement codes).

    Raises:
        ValueError: a quantizer the RTL does not implement (names the field).
    """
    check_params(p)
    b = p.bits
    return LevelTable(b, tuple(f - (1 << b) if f >= 1 << (b - 1) else f for f in range(1 << b)))


def product_shape(table: LevelTable) -> Shape:
    """Signed shape of ``level * sig`` over every level and sig in 0..15."""
    lo = min(0, min(table.levels)) * SCALE_SIG_MAX
    hi = max(0, max(table.levels)) * SCALE_SIG_MAX
    return Shape.cast(range(lo, hi + 1))


class ScaleDecode(wiring.Component):
    """ue5m3 scale byte -> significand (0..15) and exponent field (1..31). Combinational."""

    def __init__(self):
        super().__init__({
            "byte": In(8),
            "sig": Out(4),
            "ef": Out(5),
        })

    def elaborate(self, platform):
        m = Module()
        e, mm = self.byte[3:8], self.byte[:3]
        m.d.comb += [self.sig.eq(Mux(e == 0, mm, Cat(mm, Const(1, 1)))),
                     self.ef.eq(Mux(e == 0, 1, e))]
        return m


def level_negative(table: LevelTable, code):
    """1-bit Value: the level of the b-bit ``code`` field is negative."""
    neg = [f for f, v in enumerate(table.levels) if v < 0]
    if table.is_twos_complement:
        return code[-1]
    if not neg:
        return Const(0, 1)
    return Cat(*(code == f for f in neg)).any()


def dequant_lane(m: Module, table: LevelTable, code, sig, name: str) -> Signal:
    """One lane, combinational: code field -> level (table) -> ``level * sig``.

    Args:
        m: module to add the logic to.
        table: the level table.
        code: the lane's b-bit code field (unsigned Value).
        sig: the block's scale significand (4-bit unsigned Value).
        name: prefix of the created signals.

    Returns:
        Signal of :func:`product_shape` (signed).
    """
    level = Signal(table.shape, name=f"{name}_level")
    if table.is_twos_complement:
        m.d.comb += level.eq(code.as_signed())
    else:
        with m.Switch(code):
            for f, v in enumerate(table.levels):
                with m.Case(f):
                    m.d.comb += level.eq(v)
    prod = Signal(product_shape(table), name=f"{name}_prod")
    m.d.comb += prod.eq(level * sig)
    return prod


__all__ = ["LevelTable", "dequant_lane", "level_negative", "ScaleDecode", "level_table", "product_shape",
           "SCALE_EXP_OFFSET", "SCALE_EF_MIN", "SCALE_EF_MAX", "SCALE_SIG_MAX"]
