"""Read-path dequantization tables and the per-lane dequantizer of ``KVDecoder``.

Bit-exact with ``sim_models.quant.dequantize`` (every mode; docs/FORMAT.md 3.7
and 5): the reconstructed FWHT output of lane i is

    yhat_i = level(c_i) * sig_k * 2^(ef_k + scale_offset + exp_offset)

for lane i in block k, with the block's scale byte decoded to an integer
significand ``sig_k`` and an exponent field ``ef_k`` (:class:`ScaleDecode`).

The hardware never multiplies by the exponent: it keeps ``level * sig`` (a
small signed integer) per lane and the exponent field ``ef_k`` per block;
:mod:`hw.ifwht` aligns blocks by shifting and the float packer
(:mod:`hw.tofloat`) applies ``2^(ef_min + scale_offset + exp_offset - log2 N)``.

Two tables define the quantizer here, so a mode is a table swap:

* :class:`LevelTable` (:func:`level_table`): code field f (0 .. 2^b - 1, the raw
  b bits) -> integer level, and ``exp_offset``:

  - ``midtread``: the two's-complement value c of f
    (``-2^(b-1) .. 2^(b-1) - 1``; the field ``-2^(b-1)`` is never written by the
    encoder but decodes like the golden model's ``unpack_codes``), exp_offset 0.
  - ``midrise`` (mid-rise, all 2^b levels, none at zero): ``2c + 1``,
    exp_offset -1 (``yhat = (2c + 1) * scale / 2``).
  - ``lloydmax``: ``+-L[m]`` with m = c (c >= 0) or -1 - c (c < 0) and the
    integer Lloyd-Max codebook L (``sim_models.lloyd_max.LEVELS``, units 1/256),
    exp_offset -8.
  - ``asym``: the unsigned field f minus the block's zero point z (one byte per
    block, 0 .. 255: ``level = f - z`` in -255 .. 2^b - 1), exp_offset 0.

* :class:`ScaleFormat` / :class:`ScaleDecode`: scale byte -> (sig, ef) for every
  encoding of ``sim_models.minifloat`` (``ue5m3``, ``e4m3fn``, ``e5m2``,
  ``ue4m4``): with e the exponent field and m the mantissa field,
  ``sig = m`` (e == 0, subnormal) or ``2^mant_bits + m``, ``ef = max(e, 1)``,
  scale = ``sig * 2^(ef - bias - mant_bits)``.

Bytes that the golden model refuses (``ScaleEncoding.index_of``: the sign bit of
``e4m3fn``/``e5m2`` set, ``e5m2`` exponent field 31, ``e4m3fn`` 0x7F, and byte
0x00 for every quantizer but the version-1 one) have no golden output; the RTL
decodes them by the same bit-field rule (sign bit ignored), deterministically.

:data:`READ_SUPPORT` lists the options the read path implements;
:func:`check_read_params` refuses the others (ValueError naming the field).
Decoding does not depend on ``scale_rule``, ``scale_round``, ``scale_mult`` or
``mant_bits`` (encoder-only fields), so every value of those is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from sim_models.lloyd_max import LEVEL_FRAC_BITS, LEVELS
from sim_models.minifloat import scale_encoding
from sim_models.params import FormatParams, check_supported

#: FormatParams fields the read path implements only at some values: field -> allowed
#: values. Fields not listed (n, block, bits, mant_bits, dtype, sign_seed, scale_rule,
#: scale_round, scale_mult) are supported at every value FormatParams accepts.
READ_SUPPORT = {
    "mode": ("midtread", "midrise", "lloydmax", "asym"),
    "scale": ("ue5m3", "e4m3fn", "e5m2", "ue4m4"),
}


def check_read_params(p: FormatParams) -> FormatParams:
    """Refuse format options the read path does not implement (see :data:`READ_SUPPORT`).

    Raises:
        TypeError: ``p`` is not a FormatParams.
        ValueError: a field outside :data:`READ_SUPPORT`; the message names the field.
    """
    return check_supported(p, READ_SUPPORT, "read path RTL")


# ---- scale byte ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ScaleFormat:
    """Bit layout of a scale-byte encoding (``sim_models.minifloat``).

    Attributes:
        name: ``FormatParams.scale`` value.
        exp_bits, mant_bits, bias: minifloat layout (bit 7 is a sign bit, ignored,
            when exp_bits + mant_bits == 7).
    """

    name: str
    exp_bits: int
    mant_bits: int
    bias: int

    @property
    def sig_width(self) -> int:
        """Bits of the significand (hidden bit included)."""
        return self.mant_bits + 1

    @property
    def sig_max(self) -> int:
        """Largest significand, 2^(mant_bits + 1) - 1."""
        return (1 << self.sig_width) - 1

    @property
    def ef_min(self) -> int:
        """Smallest exponent field after the subnormal clamp (field 0 reads as 1)."""
        return 1

    @property
    def ef_max(self) -> int:
        """Largest exponent field the bit layout can hold (2^exp_bits - 1)."""
        return (1 << self.exp_bits) - 1

    @property
    def exp_offset(self) -> int:
        """scale = sig * 2^(ef + exp_offset): -bias - mant_bits."""
        return -self.bias - self.mant_bits

    @property
    def max_align(self) -> int:
        """Largest block-exponent difference ef_k - ef_min."""
        return self.ef_max - self.ef_min


def scale_format(p: FormatParams) -> ScaleFormat:
    """The :class:`ScaleFormat` of ``p.scale`` (layout from ``sim_models.minifloat``).

    Raises:
        ValueError: an encoding outside :data:`READ_SUPPORT` (names the field ``scale``).
    """
    if p.scale not in READ_SUPPORT["scale"]:
        raise ValueError(f"scale={p.scale!r} is not implemented by the read path RTL "
                         f"(supported: {', '.join(repr(a) for a in READ_SUPPORT['scale'])})")
    enc = scale_encoding(p.scale)
    return ScaleFormat(enc.name, enc.exp_bits, enc.mant_bits, enc.bias)


class ScaleDecode(wiring.Component):
    """Scale byte -> significand and exponent field (see module docstring). Combinational.

    Args:
        fmt: the encoding's :class:`ScaleFormat` (default ue5m3).

    Ports: ``byte`` (8) in; ``sig`` (mant_bits + 1), ``ef`` (exp_bits; 1 .. ef_max) out.
    """

    def __init__(self, fmt: ScaleFormat | None = None):
        self.fmt = fmt or ScaleFormat("ue5m3", 5, 3, 7)
        super().__init__({
            "byte": In(8),
            "sig": Out(self.fmt.sig_width),
            "ef": Out(self.fmt.exp_bits),
        })

    def elaborate(self, platform):
        m = Module()
        f = self.fmt
        mm = self.byte[:f.mant_bits]
        e = self.byte[f.mant_bits:f.mant_bits + f.exp_bits]
        m.d.comb += [self.sig.eq(Mux(e == 0, mm, Cat(mm, Const(1, 1)))),
                     self.ef.eq(Mux(e == 0, 1, e))]
        return m


# ---- code -> level --------------------------------------------------------------------------

@dataclass(frozen=True)
class LevelTable:
    """Code field -> integer reconstruction level.

    Attributes:
        bits: code width b.
        levels: ``levels[f]`` is the level of the b-bit field value f (mode asym:
            the unsigned field, from which the block's zero point is subtracted).
        exp_offset: extra power of two, ``yhat = level * scale * 2^exp_offset``.
        zero_point: True for mode asym (``level = levels[f] - z``, z a byte 0..255).
        sig_max: largest scale significand of the scale encoding (for widths).
    """

    bits: int
    levels: tuple[int, ...]
    exp_offset: int = 0
    zero_point: bool = False
    sig_max: int = 15                   # ue5m3: 2^4 - 1

    def __post_init__(self):
        if len(self.levels) != 1 << self.bits:
            raise ValueError(f"a {self.bits}-bit level table needs {1 << self.bits} entries")

    def _tc(self, f: int) -> int:
        b = self.bits
        return f - (1 << b) if f >= 1 << (b - 1) else f

    @property
    def is_twos_complement(self) -> bool:
        """True when level(f) is the two's-complement value of f (plain sign extension)."""
        return not self.zero_point and all(v == self._tc(f) for f, v in enumerate(self.levels))

    @property
    def is_odd_twos_complement(self) -> bool:
        """True when level(f) = 2 c + 1, c the two's-complement value of f (mid-rise)."""
        return not self.zero_point and all(v == 2 * self._tc(f) + 1
                                           for f, v in enumerate(self.levels))

    @property
    def is_unsigned(self) -> bool:
        """True when level(f) = f (asym before the zero point)."""
        return all(v == f for f, v in enumerate(self.levels))

    @property
    def level_range(self) -> tuple[int, int]:
        """(min, max) of the level, zero point included."""
        lo, hi = min(self.levels), max(self.levels)
        return (lo - 255, hi) if self.zero_point else (lo, hi)

    @property
    def shape(self) -> Shape:
        lo, hi = self.level_range
        return Shape.cast(range(min(lo, 0), max(hi, 0) + 1))


def level_table(p: FormatParams) -> LevelTable:
    """The level table of ``p`` (module docstring), for its mode, bits and scale encoding.

    Raises:
        TypeError: ``p`` is not a FormatParams.
        ValueError: a mode or scale encoding the read path does not implement (names the field).
    """
    check_read_params(p)
    b = p.bits
    sig_max = scale_format(p).sig_max
    tc = [f - (1 << b) if f >= 1 << (b - 1) else f for f in range(1 << b)]
    if p.mode == "midtread":
        return LevelTable(b, tuple(tc), 0, sig_max=sig_max)
    if p.mode == "midrise":
        return LevelTable(b, tuple(2 * c + 1 for c in tc), -1, sig_max=sig_max)
    if p.mode == "lloydmax":
        lv = LEVELS[b]
        return LevelTable(b, tuple(lv[c] if c >= 0 else -lv[-1 - c] for c in tc),
                          -LEVEL_FRAC_BITS, sig_max=sig_max)
    assert p.mode == "asym", p.mode
    return LevelTable(b, tuple(range(1 << b)), 0, zero_point=True, sig_max=sig_max)


def product_shape(table: LevelTable) -> Shape:
    """Signed shape of ``level * sig`` over every level and sig in 0 .. table.sig_max."""
    lo, hi = table.level_range
    return Shape.cast(range(min(0, lo) * table.sig_max, max(0, hi) * table.sig_max + 1))


def dequant_table(m: Module, table: LevelTable, sig, name: str, zero=None):
    """One block, combinational: the products ``level(f) * sig`` of its 2^b code values f
    (a lane then selects its own by its code field, ``table[code]``; the block's scale
    significand drives 2^b constant products instead of one product per lane).

    Args:
        m: module to add the logic to.
        table: the level table.
        sig: the block's scale significand (unsigned Value).
        name: prefix of the created signal.
        zero: the block's zero point (8-bit unsigned Value); required when
            ``table.zero_point`` (level = f - zero), ignored otherwise.

    Returns:
        A Signal of ``ArrayLayout(product_shape(table), 2^b)``.

    Raises:
        ValueError: ``zero`` missing for a zero-point table.
    """
    if table.zero_point and zero is None:
        raise ValueError("zero (the block's zero point) is required for a zero-point table")
    tbl = Signal(data.ArrayLayout(product_shape(table), 1 << table.bits), name=f"{name}_table")
    if table.zero_point:
        for f, v in enumerate(table.levels):
            m.d.comb += tbl[f].eq((Const(v, table.shape) - zero) * sig)
        return tbl
    # constant levels: one row of constant products per significand value, so each bit
    # is LUT logic of sig's few bits, not a carry chain (docs/DECISIONS.md, "Dequant
    # product tables")
    with m.Switch(sig):
        for s in range(1 << len(sig)):
            with m.Case(s):
                m.d.comb += [tbl[f].eq(v * s) for f, v in enumerate(table.levels)]
    return tbl


__all__ = ["LevelTable", "READ_SUPPORT", "ScaleDecode", "ScaleFormat", "check_read_params",
           "dequant_table", "level_table", "product_shape", "scale_format"]
