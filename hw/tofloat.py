"""Exact integers -> fp16 / bf16 bit patterns, round to nearest even, saturating.

Bit-exact with ``sim_models.codec.round_to_input_type`` applied to the exact
value ``v_i = (-1)^(D_i) * S_i * 2^T`` of lane i, where ``S_i`` is the signed
integer from :mod:`hw.ifwht` and ``T = ef_min + scale_offset + exp_offset
- log2 N`` is shared by the vector (the /N of the inverse transform is this
exponent offset: no divider). Input type: ``e`` exponent bits, ``mb`` stored
mantissa bits, bias ``bias`` (fp16 5/10/15, bf16 8/7/127).

Two combinational halves, with a pipeline register between them in the top
level (``KVDecompressor``):

:class:`FloatPrep` (per lane): ``mag = |S|``, ``L`` = position of its leading
one (:func:`hw.scale_select.leading_one`), ``Lp = max(L, K)`` with ``K = (1 -
bias) - T`` (the leading-one position of the smallest normal
number: below it the value is subnormal and the ulp stays at
``2^(1 - bias - mb)``), the sign ``((S < 0) | zneg_i) xor D_i`` (``zneg_i``:
the exact zero is -0.0 in the golden float64 path, see hw/ifwht.py) and
``nz = (S != 0)``. Per
vector it passes on ``B = T + bias - 1``. ``S = (-1)^flip_i y_i`` (the FWHT's
block swap, hw/ifwht.py): ``|S| = |y|``, and ``S < 0`` is ``(y < 0) xor flip_i``
for ``y != 0`` (from the leading-one tree's "any"; a zero keeps the rule above).

:class:`FloatPack` (per lane): with ``sh = Lp - mb`` (the ulp is 2^sh units),
``t = (mag << (mb + 1)) >> Lp`` holds the kept significand ``r0`` above the
guard bit g (a right shifter with mb + 2 output bits; a left shift when
``sh < 1``, then exact); sticky = OR of the bits of mag below position sh - 1,
collected from the bits each shifter level drops (:func:`shift_right_sticky`). RNE: ``r = r0 + (g & (sticky | r0[0]))``. The
result is ``((Lp + B) << mb) + r``: for a normal number r carries the hidden bit
into the exponent field (biased exponent Lp + T + bias), for a subnormal
(Lp = K, field 0) r < 2^mb, and a rounding carry out of the significand
increments the exponent by itself. Anything above the largest finite pattern
(0x7BFF fp16, 0x7F7F bf16) becomes it (the golden model saturates, never inf);
S = 0 gives +-0 with the sign of D_i (the golden model negates +0.0).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .pipeline import gt_const, stage
from .scale_select import leading_one


def shift_right_sticky(m: Module, v, amount, out_width: int, name: str):
    """``(v >> amount)[:out_width]`` and the OR of the bits shifted out below bit 0.

    A log shifter, largest shift first; at level k the 2^k bits that fall off
    are ORed into the sticky bit, and the value is cut to the bits that can
    still reach the output (``out_width + 2^k - 1``). Bits of ``v`` that would
    land at or above ``out_width`` must be zero (the caller guarantees it: the
    shift amount is at least the leading-one position minus out_width - 1).

    Returns:
        (shifted, sticky): Signal(out_width), Signal().
    """
    k = len(amount)
    cur = v
    sticky = None
    for j in range(k - 1, -1, -1):
        h = 1 << j
        keep = min(len(cur), out_width + h - 1)
        nv = Signal(keep, name=f"{name}_v{j}")
        dropped = cur[:h].any() if h <= len(cur) else cur.any()
        m.d.comb += nv.eq(Mux(amount[j], cur[h:h + keep] if h < len(cur) else 0, cur[:keep]))
        st = Signal(name=f"{name}_st{j}")
        m.d.comb += st.eq((amount[j] & dropped) | (sticky if sticky is not None else 0))
        cur, sticky = nv, st
    out = Signal(out_width, name=f"{name}_out")
    m.d.comb += out.eq(cur)
    return out, sticky


def _rng(lo: int, hi: int) -> Shape:
    return Shape.cast(range(lo, hi + 1))


class FloatConsts:
    """Per-configuration constants of the conversion.

    Args:
        y_width: signed width W of the integers S (|S| < 2^(W-1)).
        log2n: log2 N.
        in_format: (exponent bits, mantissa bits, bias) of the output type.
        ef_range: (min, max) of the shared exponent field ef_min.
        exp_add: T = ef_min + exp_add (scale_offset + exp_offset - log2 N).
    """

    def __init__(self, y_width: int, in_format, ef_range, exp_add: int):
        self.e_bits, self.m_bits, self.bias = in_format
        self.mag_width = y_width - 1
        self.ef_lo, self.ef_hi = ef_range
        self.exp_add = exp_add
        t_lo, t_hi = self.ef_lo + exp_add, self.ef_hi + exp_add
        # K = (1 - bias) - T, clamped at 0 (Lp >= L >= 0 anyway)
        self.k_hi = max(0, (1 - self.bias) - t_lo)
        self.lp_width = max(self.mag_width - 1, self.k_hi).bit_length() or 1
        # B = T + bias - 1
        self.b_shape = _rng(t_lo + self.bias - 1, t_hi + self.bias - 1)
        self.max_finite = (((1 << self.e_bits) - 2) << self.m_bits) | ((1 << self.m_bits) - 1)


class FloatPrep(wiring.Component):
    """abs, leading-one detect, subnormal clamp (see module docstring).

    Combinational, or with ``abs_reg`` one pipeline register after ``|S|`` (the
    negation's carry chain) and before the leading-one tree, and/or with
    ``lead_reg`` one after the leading-one tree (before the subnormal clamp):
    then ``en`` (In) advances them and every output is one cycle behind
    ``y``/``ef_min``/``mask``/``zneg`` per register.

    Ports: ``y`` (N signed lanes), ``flip`` (N bits: S = (-1)^flip y), ``ef_min``,
    ``mask`` (N bits: D), ``zneg`` in;
    ``mag``, ``lp``, ``neg``, ``nz`` (per lane) and ``b`` (per vector) out.
    """

    def __init__(self, n: int, y_width: int, ef_width: int, consts: FloatConsts,
                 abs_reg: bool = False, lead_reg: bool = False):
        self.n, self.c, self.abs_reg, self.lead_reg = n, consts, bool(abs_reg), bool(lead_reg)
        ports = {
            "y": In(data.ArrayLayout(signed(y_width), n)),
            "ef_min": In(ef_width),
            "mask": In(n),
            "zneg": In(n),
            "flip": In(n),
            "mag": Out(data.ArrayLayout(consts.mag_width, n)),
            "lp": Out(data.ArrayLayout(consts.lp_width, n)),
            "neg": Out(n),
            "nz": Out(n),
            "b": Out(consts.b_shape),
        }
        if self.abs_reg or self.lead_reg:
            ports["en"] = In(1)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        c = self.c
        t = Signal(_rng(c.ef_lo + c.exp_add, c.ef_hi + c.exp_add), name="t_unit")
        m.d.comb += t.eq(self.ef_min + c.exp_add)
        k = Signal(_rng(min(0, (1 - c.bias) - (c.ef_hi + c.exp_add)), c.k_hi), name="k_raw")
        m.d.comb += k.eq((1 - c.bias) - t)
        kc = Signal(range(max(c.k_hi, 1) + 1), name="k_min_lead")
        m.d.comb += kc.eq(Mux(k < 0, 0, k))
        b = Signal(c.b_shape, name="b_bias")
        m.d.comb += b.eq(t + (c.bias - 1))
        mags = Signal(data.ArrayLayout(c.mag_width, self.n), name="mag")
        negs = Signal(self.n, name="neg")
        for i in range(self.n):
            yv = self.y[i]
            m.d.comb += [mags[i].eq(Mux(yv < 0, -yv, yv)),
                         negs[i].eq(((yv < 0) | self.zneg[i]) ^ self.mask[i])]
        flips = self.flip
        if self.abs_reg:
            r = stage(m, self.en, "abs", mag=mags, neg=negs, flip=flips, kc=kc, b=b)
            mags, negs, flips, kc, b = r["mag"], r["neg"], r["flip"], r["kc"], r["b"]
        poss, anys = [], []
        for i in range(self.n):
            mag = Signal(c.mag_width, name=f"mag{i}")
            m.d.comb += mag.eq(mags[i])
            pos, any_ = leading_one(m, mag, f"lod{i}")
            poss.append(pos)
            anys.append(any_)
        if self.lead_reg:
            r = stage(m, self.en, "lead", mag=[mags[i] for i in range(self.n)], pos=poss,
                      nz=Cat(*anys), neg=negs, flip=flips, kc=kc, b=b)
            mags, poss, negs, kc, b = r["mag"], r["pos"], r["neg"], r["kc"], r["b"]
            flips = r["flip"]
            anys = [r["nz"][i] for i in range(self.n)]
        m.d.comb += [self.b.eq(b), self.neg.eq(negs ^ (flips & Cat(*anys)))]
        for i in range(self.n):
            m.d.comb += [self.mag[i].eq(mags[i]),
                         self.lp[i].eq(Mux(poss[i] > kc, poss[i], kc)),
                         self.nz[i].eq(anys[i])]
        return m


class FloatPack(wiring.Component):
    """Shift, round to nearest even, saturate, pack (see module docstring).

    Combinational, or with ``shift_reg`` one pipeline register after the right
    shifter and its sticky bit (before rounding, packing and saturation), and/or
    with ``round_reg`` one after the rounding increment (before packing and
    saturation): then ``en`` (In) advances them and ``bits`` is one cycle behind
    the inputs per register.

    Ports: ``mag``, ``lp``, ``neg``, ``nz`` (per lane), ``b`` in; ``bits`` (N x 16) out.
    """

    def __init__(self, n: int, consts: FloatConsts, shift_reg: bool = False,
                 round_reg: bool = False):
        self.n, self.c = n, consts
        self.shift_reg, self.round_reg = bool(shift_reg), bool(round_reg)
        ports = {
            "mag": In(data.ArrayLayout(consts.mag_width, n)),
            "lp": In(data.ArrayLayout(consts.lp_width, n)),
            "neg": In(n),
            "nz": In(n),
            "b": In(consts.b_shape),
            "bits": Out(data.ArrayLayout(16, n)),
        }
        if self.shift_reg or self.round_reg:
            ports["en"] = In(1)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        c = self.c
        mb = c.m_bits
        lp_max = (1 << c.lp_width) - 1
        blo, bhi = -(1 << (c.b_shape.width - 1)), (1 << (c.b_shape.width - 1)) - 1
        top = c.max_finite >> mb            # X: the exponent part of max_finite
        ts, sts, ebs, ovs = [], [], [], []
        for i in range(self.n):
            t, sticky = shift_right_sticky(m, Cat(Const(0, mb + 1), self.mag[i]), self.lp[i],
                                           mb + 2, f"sh{i}")
            ts.append(t)
            sts.append(sticky)
            # exponent part of the result, beside the shifter: Lp + B
            eb = Signal(_rng(min(0, blo), lp_max + bhi), name=f"eb{i}")
            m.d.comb += eb.eq(self.lp[i] + self.b)
            ebs.append(eb)
            # saturation: the packed value ((eb << mb) + r) > max_finite, whose mb low
            # bits are all ones, is (eb + (r >> mb)) > X with r >> mb in {0, 1, 2}
            fl = Signal(3, name=f"ebx{i}")
            m.d.comb += fl.eq(Cat(gt_const(eb, top), eb == top, eb == top - 1))
            ovs.append(fl)
        neg, nz = self.neg, self.nz
        if self.shift_reg:
            r = stage(m, self.en, "shr", t=ts, eb=ebs, ov=ovs, sticky=Cat(*sts), neg=neg, nz=nz)
            ts, sts, ebs = r["t"], [r["sticky"][i] for i in range(self.n)], r["eb"]
            neg, nz, ovs = r["neg"], r["nz"], r["ov"]
        rs = []
        for i in range(self.n):
            t, sticky = ts[i], sts[i]
            r0, g = t[1:], t[0]
            r = Signal(mb + 2, name=f"rnd{i}")
            m.d.comb += r.eq(r0 + (g & (sticky | r0[0])))
            rs.append(r)
        if self.round_reg:
            r = stage(m, self.en, "rnd", r=rs, eb=ebs, ov=ovs, neg=neg, nz=nz)
            rs, ebs, neg, nz, ovs = r["r"], r["eb"], r["neg"], r["nz"], r["ov"]
        for i in range(self.n):
            pk = Signal(_rng(min(0, blo) << mb, ((lp_max + bhi) << mb) + (1 << (mb + 1))),
                        name=f"packed{i}")
            m.d.comb += pk.eq((ebs[i] << mb) + rs[i])
            rh, fl = rs[i][mb:], ovs[i]            # r >> mb; eb > X, eb == X, eb == X - 1
            over = Signal(name=f"over{i}")
            m.d.comb += over.eq(fl[0] | (fl[1] & (rh != 0)) | (fl[2] & rh[1]))
            mbits = Signal(15, name=f"magbits{i}")
            m.d.comb += mbits.eq(Mux(~nz[i], 0, Mux(over, c.max_finite, pk)))
            m.d.comb += self.bits[i].eq(Cat(mbits, neg[i]))
        return m
