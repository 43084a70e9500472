"""Scale-byte selection without dividers: :class:`ScaleSelect`, and the leading-one detector.

Bit-exact with the golden model's scale rule (``sim_models.scale``,
docs/FORMAT.md 3.7; this docstring is its hardware derivation). Block statistic A (the maximum |y|,
the range hi - lo for mode asym, or sum |y| for absmean; units of 2^u), K =
the scale units A maps to (:func:`rule_units`). Every byte s has a *decision
value* D(s) = c(s) 2^x(s):

* ``up``:      D(s) = scale(s) = sig 2^exp;   byte = smallest s in 1..255 with
  A 2^u <= K D(s), else 255.
* ``nearest``: D(s) = (scale(s) + scale(s+1)) / 2 = (2 sig + 1) 2^(exp-1);
  byte = smallest s in 1..254 with A 2^u < K D(s), else 255.
* FLAG_SAT (both): A 2^u > K scale(255).

Written for ue5m3 (the other encodings change Mb, the bias and the largest
byte): normal bytes (exponent field e >= 1) have D = c_m 2^(e - E0) with c_m =
8 + m (``up``, E0 = 10) or 17 + 2m (``nearest``, E0 = 11), m = 0..7. Let Cmax =
K c_7, J = floor(log2 Cmax). Leading-one detect k = floor(log2 A)
(:func:`leading_one`), normalize A_n = A << (W-1-k) and take R = ceil(A
2^(J-k)) (``up``: the top J+1 bits of A_n plus a sticky bit) or R = floor(A
2^(J-k)) + 1 (``nearest``: top J+1 bits plus one, which turns the strict
compare into ``<=``). Then for an integer C and j <= J, the byte predicate at
exponent e = k + u + E0 - j is exactly R <= C 2^(J-j):

* j = J if R <= Cmax, else j = J - 1 (which always fits, since 2 K c_0 > Cmax);
  m = #{m' in 0..6 : R > K c_m' 2^(J-j)} (compares against constants).
* That virtual exponent e > 31 -> 0xFF. e >= 1 -> byte e << 3 | m (every
  smaller byte lies on or below the virtual e-1 grid, which does not fit).
* e <= 0 -> a byte s in 1..8: bytes 1..15 have D(s) = K d_s 2^-9 (``up``,
  d_s = s) or K d_s 2^-10 (``nearest``, d_s = 2s+1), so with
  z = J - 9 - k - u (``up``) or J - 10 - k - u (``nearest``), z >= 1 here
  (clamped to [0, J+1]), s = 1 + #{s' in 1..7 : ceil(R / 2^z) > K d_s'}.
* A == 0 -> byte 0x01.
* FLAG_SAT: the ``up`` rule's virtual exponent exceeds 31 (for ``nearest`` a
  second, cheap R with J' = floor(log2 15K) gives it).

Scale rule and multiplier: the golden compare is C D(s) >= mult Kd X 2^u with
C = 256 Kn (max) or 256 G (absmean), X = max|y| / hi - lo / sum|y|. With mult
= odd 2^p it is fed to ScaleSelect as Kn' D(s) >= (odd X) 2^(u + p + log2 Kd -
8) (absmean: Kn' = 1 and the shift lowered by log2 G): one constant multiplier
by the odd part per block, in the quantizer.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Shape, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from sim_models.minifloat import scale_encoding
from sim_models.params import SCALE_ENCODINGS, SCALE_ROUNDING, FormatParams
from sim_models.scale import max_units, scale_mult

from .pipeline import gt_const, stage


def shape_range(lo: int, hi: int) -> Shape:
    """The smallest shape holding every integer in [lo, hi]."""
    return Shape.cast(range(lo, hi + 1))


def shape_bounds(shape) -> tuple[int, int]:
    """(min, max) of the integers of ``shape``."""
    shape = Shape.cast(shape)
    if shape.signed:
        return -(1 << (shape.width - 1)), (1 << (shape.width - 1)) - 1
    return 0, (1 << shape.width) - 1


def leading_one(m: Module, a, name: str, levels: int | None = None, start=None):
    """Position of the highest set bit of ``a`` (0 when a == 0), log depth.

    A binary tree over the bits padded to 2^k: a node over two children reports
    ``any = any_lo | any_hi`` and ``pos = Cat(any_hi ? pos_hi : pos_lo, any_hi)``,
    one 3-input function per position bit and level (k levels in all). All
    nodes of one level share a Signal pair (``{name}_any{level}``,
    ``{name}_pos{level}``), which keeps the netlist readable and the Python
    simulation small.

    The tree may be built in parts with a register between them: ``levels`` builds
    only levels 1..levels and returns the nodes there, ``start`` (those nodes,
    possibly registered) builds the rest.

    Args:
        levels: the last level to build (default k, the root).
        start: ``(j, any, pos)`` from a call with ``levels=j``: continue from level j.

    Returns:
        (pos, any): ``pos`` unsigned, max(1, ceil(log2 len(a))) bits; ``any`` 1 bit.
        With ``levels`` below k: ``(levels, any, pos)``, the 2^(k - levels) nodes'
        any bits and their ``levels``-bit positions (node j's at [j*levels:]).
    """
    w = len(a)
    k = max(1, (w - 1).bit_length())
    if start is None:
        level, pos_v = 0, None
        any_v = Signal(1 << k, name=f"{name}_any0")
        m.d.comb += any_v.eq(a)
    else:
        level, any_v, pos_v = start
    last = k if levels is None else levels
    if not level <= last <= k:
        raise ValueError(f"levels must be in [{level}, {k}], got {levels}")
    pw, cnt = level, len(any_v)
    for level in range(level + 1, last + 1):
        cnt //= 2
        na = Signal(cnt, name=f"{name}_any{level}")
        npos = Signal(cnt * (pw + 1), name=f"{name}_pos{level}")
        m.d.comb += na.eq(Cat(*(any_v[2 * j] | any_v[2 * j + 1] for j in range(cnt))))
        if pos_v is None:
            m.d.comb += npos.eq(Cat(*(any_v[2 * j + 1] for j in range(cnt))))
        else:
            m.d.comb += npos.eq(Cat(*(
                Cat(Mux(any_v[2 * j + 1], pos_v[(2 * j + 1) * pw:(2 * j + 2) * pw],
                        pos_v[2 * j * pw:(2 * j + 1) * pw]), any_v[2 * j + 1])
                for j in range(cnt))))
        any_v, pos_v, pw = na, npos, pw + 1
    if last < k:
        return last, any_v, pos_v
    return pos_v, any_v[0]


def _k_units(p: FormatParams) -> tuple[int, int]:
    """(k, k_shift) with K = k / 2^k_shift = ``sim_models.scale.max_units`` (Kn / Kd)."""
    kn, kd = max_units(p)
    return kn, kd.bit_length() - 1


def rule_units(p: FormatParams) -> tuple[int, int, int]:
    """(k, k_shift, mult_odd) of ``p``'s scale rule and multiplier (module docstring):
    ScaleSelect compares k D(s) >= A 2^(u + k_shift) with A = mult_odd * the block
    statistic (mult_odd: the odd part of ``scale_mult``).

    Raises:
        ValueError: a scale rule, mode, rounding or encoding not built here, a
            scale_mult outside [1, 511], or mode asym with a rule other than max
            (the message names the field).
    """
    if p.scale_rule not in ("max", "absmean"):     # rms: refused by hw.encoder.ENCODER_SUPPORT
        raise ValueError(f"scale_rule must be 'max' or 'absmean' in the RTL quantizer, "
                         f"got {p.scale_rule!r}")
    mult = scale_mult(p)
    if not isinstance(mult, int) or not 1 <= mult <= 511:
        raise ValueError(f"scale_mult must be an int in [1, 511], got {mult!r}")
    if p.mode == "asym" and p.scale_rule != "max":
        raise ValueError(f"scale_rule must be 'max' for mode 'asym', got {p.scale_rule!r}")
    p2 = (mult & -mult).bit_length() - 1
    if p.scale_rule == "max":
        k, ks = _k_units(p)
    else:
        k, ks = 1, -(p.block.bit_length() - 1)
    _scale_rule(k, p.scale_round, p.scale)
    return k, ks + p2 - 8, mult >> p2


def encoding(name: str):
    """The sim_models ScaleEncoding ``name`` (ValueError naming ``scale`` if not built here)."""
    if name not in SCALE_ENCODINGS:
        raise ValueError(f"scale must be one of {SCALE_ENCODINGS}, got {name!r}")
    return scale_encoding(name)


def _scale_rule(k: int, rounding: str, scale: str):
    """Constants of the decision values of encoding ``scale`` (module docstring).

    Returns (c_m for m = 0 .. 2^Mb - 1, E0, d_s for s = 1 .. 2^Mb - 1, z offset, ceil?).
    """
    enc = encoding(scale)
    mb, bias = enc.mant_bits, enc.bias
    nm = 1 << mb
    if rounding == "up":
        return ([k * (nm + i) for i in range(nm)], bias + mb, [k * s for s in range(1, nm)],
                bias + mb - 1, True)
    if rounding == "nearest":
        return ([k * (2 * (nm + i) + 1) for i in range(nm)], bias + mb + 1,
                [k * (2 * s + 1) for s in range(1, nm)], bias + mb, False)
    raise ValueError(f"scale_round must be one of {SCALE_ROUNDING}, got {rounding!r}")


#: The registers of :class:`ScaleSelect`, in data-flow order: ``norm`` is its
#: ``pipelined`` register, the others are its optional ``regs``.
SELECT_CUTS = ("lead", "nshift", "norm", "sexp")


class ScaleSelect(wiring.Component):
    """Combinational scale-byte selector (see module docstring).

    Args:
        p: format parameters: mode, bits, scale_rule, scale_mult, block give K
            (:func:`rule_units`), scale_round the rounding, scale the encoding.
        a_width: width of the unsigned block statistic A (already times mult_odd).
        u_shape: shape of the signed unit exponent u.
        pipelined: register (advanced by ``en``) after the leading-one detect and
            normalization: ``byte``/``sat`` then follow ``a``/``u`` by one cycle.
        regs: further registers, a subset of :data:`SELECT_CUTS` other than ``norm`` (``lead``:
            after the leading-one detect; ``nshift``: after the normalization
            shifter, before its ceiling increment; ``sexp``: after the exponent
            arithmetic, before the byte compares); one cycle each.

    Ports: ``a``, ``u``, ``en`` in; ``byte`` (8), ``sat`` (1) out.

    Raises:
        ValueError: a format option not built here (the message names the field).
    """

    def __init__(self, p: FormatParams, a_width: int, u_shape, pipelined: bool = False,
                 regs=()):
        self.k, self.k_shift, _ = rule_units(p)
        self.rounding, self.scale = p.scale_round, p.scale
        self.a_width, self.u_shape = a_width, Shape.cast(u_shape)
        self.pipelined = bool(pipelined)
        self.regs = tuple(regs)
        allowed = tuple(r for r in SELECT_CUTS if r != "norm")
        if not set(self.regs) <= set(allowed):
            raise ValueError(f"ScaleSelect regs must be from {allowed}, got {self.regs!r}")
        super().__init__({
            "a": In(a_width),
            "u": In(u_shape),
            "en": In(1),
            "byte": Out(8),
            "sat": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        K = self.k
        enc = encoding(self.scale)
        mb, nm = enc.mant_bits, 1 << enc.mant_bits
        e_top = (int(enc.bytes[-1]) >> mb)          # largest exponent field in use
        byte_max = int(enc.bytes[-1])
        sig_top, exp_top = int(enc.sig[-1]), int(enc.exp[-1])
        cn, e0, cs, zoff, ceil = _scale_rule(K, self.rounding, self.scale)
        J = cn[-1].bit_length() - 1
        J_s = (K * sig_top).bit_length() - 1       # FLAG_SAT: compare with K scale(byte_max)
        W = max(self.a_width, J + 1, J_s + 1)
        ulo, uhi = shape_bounds(self.u_shape)
        ulo, uhi = ulo + self.k_shift, uhi + self.k_shift

        a = Signal(W)
        m.d.comb += a.eq(self.a)
        k, nz = leading_one(m, a, "lead")
        u_in = self.u
        if "lead" in self.regs:
            st = stage(m, self.en, "lead", reset=("nz",), a=a, k=k, nz=nz, u=u_in)
            a, k, nz, u_in = st["a"], st["k"], st["nz"], st["u"]
        lz = Signal(range(W))
        m.d.comb += lz.eq(W - 1 - k)
        an = Signal(W)
        m.d.comb += an.eq(a << lz)
        if "nshift" in self.regs:
            st = stage(m, self.en, "nshift", reset=("nz",), an=an, k=k, nz=nz, u=u_in)
            an, k, nz, u_in = st["an"], st["k"], st["nz"], st["u"]

        def top_bits(jj: int, up: bool, name: str):
            """ceil(A 2^(jj-k)) (up) or floor(A 2^(jj-k)) + 1, jj+2 bits."""
            low = W - 1 - jj
            r = Signal(jj + 2, name=name)
            if up:
                m.d.comb += r.eq(an[low:] + an[:low].any() if low > 0 else an)
            else:
                m.d.comb += r.eq(an[low:] + 1)
            return r

        r = top_bits(J, ceil, "r")
        r_s = top_bits(J_s, True, "r_sat")
        # exponent arithmetic on k and u only (beside the normalization)
        u = Signal(shape_range(ulo, uhi), name="u_eff")
        m.d.comb += u.eq(u_in + self.k_shift)
        ku = Signal(shape_range(ulo, W - 1 + uhi), name="ku")
        m.d.comb += ku.eq(k + u)
        # bytes 1 .. 2^Mb: D(s) = K d_s 2^-(zoff)
        zr = Signal(shape_range(J - zoff - (W - 1) - uhi, J - zoff - ulo))
        m.d.comb += zr.eq(J - zoff - ku)
        z = Signal(range(J + 2))
        m.d.comb += z.eq(Mux(zr[-1], 0, Mux(gt_const(zr, J + 1), J + 1, zr)))
        if self.pipelined:
            # nz has a reset only so that the module's rst port is used (lint)
            st = stage(m, self.en, "norm", reset=("nz",), nz=nz, r=r, r_sat=r_s, ku=ku, z=z)
            nz, r, r_s, ku, z = st["nz"], st["r"], st["r_sat"], st["ku"], st["z"]
        fit_j = Signal()
        m.d.comb += fit_j.eq(~gt_const(r, cn[-1]))
        mant = Signal(mb)
        with m.If(fit_j):
            m.d.comb += mant.eq(sum(gt_const(r, cn[i]) for i in range(nm - 1)))
        with m.Else():
            m.d.comb += mant.eq(sum(gt_const(r, 2 * cn[i]) for i in range(nm - 1)))
        # virtual exponent field e = k + u + E0 - j
        ev = Signal(shape_range(ulo + e0 - J, W - 1 + uhi + e0 - J + 1))
        m.d.comb += ev.eq(ku + (e0 - J) + ~fit_j)
        rs = Signal(J + 2)
        m.d.comb += rs.eq(r >> z)
        lost = Signal()
        m.d.comb += lost.eq((rs << z) != r)
        if "sexp" in self.regs:
            st = stage(m, self.en, "sexp", reset=("nz",), nz=nz, r_sat=r_s, ku=ku, ev=ev,
                       mant=mant, rs=rs, lost=lost)
            nz, r_s, ku, ev, mant, rs, lost = (st[x] for x in ("nz", "r_sat", "ku", "ev", "mant",
                                                              "rs", "lost"))
        rc = Signal(J + 3)
        m.d.comb += rc.eq(rs + lost)
        sub = Signal(mb + 1)
        m.d.comb += sub.eq(1 + sum(gt_const(rc, c) for c in cs))

        # FLAG_SAT: A 2^u > K scale(byte_max) = K sig_top 2^exp_top, in [2^kv, 2^(kv+1))
        kv = J_s + exp_top
        m.d.comb += self.sat.eq(nz & (gt_const(ku, kv) | ((ku == kv) & gt_const(r_s, K * sig_top))))

        vbyte = Signal(mb + enc.exp_bits + 1, name="vbyte")     # virtual byte, unclamped
        m.d.comb += vbyte.eq(Cat(mant, ev[:enc.exp_bits + 1]))
        with m.If(~nz):
            m.d.comb += self.byte.eq(1)
        with m.Elif(gt_const(ev, e_top)):
            m.d.comb += self.byte.eq(byte_max)
        with m.Elif(gt_const(ev, 0)):
            m.d.comb += self.byte.eq(Mux(gt_const(vbyte, byte_max), byte_max, vbyte))
        with m.Else():
            m.d.comb += self.byte.eq(sub)
        return m
