"""Exact integers -> fp16 / bf16 bit patterns, round to nearest even, saturating.

Bit-exact with ``sim_models.codec.round_to_input_type`` applied to the exact
value ``v_i = (-1)^(D_i) * S_i * 2^T`` of lane i, where ``S_i`` is the signed
integer from :mod:`hw.ifwht` and ``T = ef_min + scale_offset + exp_offset
- log2 N`` is shared by the vector (the /N of the inverse transform is this
exponent offset: no divider). Input type: ``e`` exponent bits, ``mb`` stored
mantissa bits, bias ``bias`` (fp16 5/10/15, bf16 8/7/127).

Two combinational halves, with a pipeline register between them in the top
level (``KVDecoder``). Neither takes ``|S|``: the magnitude is handled in
one's complement, ``m1 = y xor s`` (s = the sign bit of y; ``m1 = |y| - s``),
and the +s is added to the mb + 2 bits that the conversion keeps.

:class:`FloatPrep` (per lane): ``m1``; ``L`` = position of its leading
one (:func:`hw.scale_select.leading_one`), ``Lp = max(L, K)`` with ``K = (1 -
bias) - T`` (the leading-one position of the smallest normal
number: below it the value is subnormal and the ulp stays at
``2^(1 - bias - mb)``), the sign ``(S < 0) xor D_i`` (an exact zero is +0 before D) and
``nz = (S != 0)``, and the exponent part ``Lp + B`` with ``B = T + bias - 1`` per vector
(as ``max(L + B, K + B)``: the addition beside the test L > K, which is "m1 has a bit
above position K", an AND-OR of m1 with a per-vector mask).
``S = (-1)^flip_i y_i`` (the FWHT's block swap, hw/ifwht.py): ``|S| = |y|``, and
``S < 0`` is ``(y < 0) xor flip_i`` for ``y != 0``.
Only the low ``Lsat = 2^(e-1) - T_min`` bits of m1 (:attr:`FloatConsts.mag_width`;
T_min: T at the smallest ef_min) reach the leading-one tree and the shifter: any
higher bit set means ``|S| 2^T >= 2^(2^(e-1))``, above the largest finite value
for every ef_min, and only sets the per-lane flag ``sat`` (fp16 at N=128: 33 of the
44 bits; bf16 keeps every bit). L is the leading one of m1, not of |y|: they differ
only for y = -2^k (m1 = 2^k - 1), where the kept bits below overflow into the next
binade and the packing's exponent addition absorbs the carry (below).

:class:`FloatPack` (per lane): with ``sh = Lp - mb`` (the ulp is 2^sh units),
the right shifter gives ``w = (y << (mb + 1)) >> Lp`` cut to mb + 2 bits (bits Lp - mb - 1
.. Lp of y; a left shift when ``sh < 1``, then exact) and sticky = OR of the bits of
y below them, collected from the bits each shifter level drops
(:func:`shift_right_sticky`; a nonzero remainder stays nonzero under negation, so it
is also the sticky bit of |y|). With the ``shift`` register the shifter is two in
series, by Lp's high bits before the register and by its ``shift_low_bits`` low bits
after it (docs/DECISIONS.md, "Register cuts inside the float conversion"), the two sticky bits ORed. For
y < 0, ``|y| = ~y + 1``, so the kept bits of |y|
are ``t = (w xor s) + (s & ~sticky)`` (mb + 3 bits: the +1 carries into them exactly
when every lower bit of y is 0). ``t`` holds the significand ``r0 = t >> 1`` above
the guard bit g = t[0]. RNE: ``r = r0 + (g & (sticky | r0[0]))``, computed in the
same carry chain as t: ``r = (t + 1) >> 1`` (r0 + g), with bit 0 cleared at a tie
(g = 1, sticky = 0: r0 + 1 is then odd exactly when r0 is even), where
``t + 1 = (w xor s) + 1 + (s & ~sticky)`` is one addition. The
result is ``((Lp + B) << mb) + r``, computed as ``Lp + B + (r >> mb)`` above the mb
low bits of r: for a normal number r carries the hidden bit
into the exponent field (biased exponent Lp + T + bias), for a subnormal
(Lp = K, field 0) r < 2^mb, and a rounding carry out of the significand (or the
one's complement carry of y = -2^k: r = 2^(mb+1)) increments the exponent by
itself. Anything above the largest finite pattern
(0x7BFF fp16, 0x7F7F bf16), or with ``sat``, becomes it (the golden model
saturates, never inf); S = 0 gives +-0 with the sign of D_i (the golden model
negates +0.0).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, Value, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .options import DecoderOptions
from .pipeline import REPLICA_SELECT_LANES, gt_const, replica_count, replica_of, replicas, stage
from .scale_select import leading_one, shape_bounds


def shift_right_sticky(m: Module, v, amount, out_width: int, name: str, amount_max=None,
                       step: int = 1):
    """``(v >> (amount * step))[:out_width]`` and the OR of the bits shifted out below bit 0.

    A log shifter, largest shift first; at level k the ``step * 2^k`` bits that fall
    off are ORed into the sticky bit, and the value is cut to the bits that can
    still reach the output (``out_width + step * (2^k - 1)``): bits of ``v`` that would
    land at or above ``out_width`` are dropped (the result is exactly bits
    [amount * step, amount * step + out_width) of v, zero above the top of v).
    ``amount_max`` (default: every value of ``amount``): the largest amount the
    caller drives; when it is 2^(k-1) for a k-bit amount, the top bit means
    "exactly 2^(k-1)" and becomes one out_width-bit select after a (k-1)-level
    shifter instead of a first level of out_width + step * 2^(k-1) - 1 multiplexers.
    ``step``: the shift unit in bits (the high part of a shifter split across a
    register, :class:`FloatPack`).

    Returns:
        (shifted, sticky): Signal(out_width), Signal().
    """
    k = len(amount)
    if k == 0:
        out = Signal(out_width, name=f"{name}_out")
        m.d.comb += out.eq(v[:out_width])
        return out, Const(0, 1)
    top = step << (k - 1)
    if amount_max is not None and k > 1 and amount_max == 1 << (k - 1):
        low, low_st = shift_right_sticky(m, v, amount[:k - 1], out_width, f"{name}_lo",
                                         step=step)
        hi = v[top:top + out_width] if top < len(v) else Const(0, out_width)
        out, st = Signal(out_width, name=f"{name}_out"), Signal(name=f"{name}_st")
        m.d.comb += [out.eq(Mux(amount[k - 1], hi, low)),
                     st.eq(Mux(amount[k - 1], v[:top].any(), low_st))]
        return out, st
    cur = v
    sticky = None
    for j in range(k - 1, -1, -1):
        h = step << j
        keep = min(len(cur), out_width + h - step)       # the levels below shift < h
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
        y_width: signed width W of the integers y (|y| < 2^(W-1)).
        in_format: (exponent bits, mantissa bits, bias) of the output type.
        ef_range: (min, max) of the shared exponent field ef_min.
        exp_add: T = ef_min + exp_add (scale_offset + exp_offset - log2 N).

    Attributes:
        lsat: |y| >= 2^lsat saturates at every ef_min (2^lsat 2^T_min = 2^(2^(e-1)),
            above the largest finite value).
        mag_width: low bits of y that the leading-one tree and the shifter see
            (min(W - 1, max(lsat, K_max + 1))); the bits above only feed ``sat``.
        k_var: the bits 1..k_var of the mask "positions above K" that depend on ef_min
            (min(K_max, mag_width - 1); bit 0 is never above K, the bits above K_max
            always are).
    """

    def __init__(self, y_width: int, in_format, ef_range, exp_add: int):
        self.e_bits, self.m_bits, self.bias = in_format
        self.y_width = y_width
        self.ef_lo, self.ef_hi = ef_range
        self.exp_add = exp_add
        t_lo, t_hi = self.ef_lo + exp_add, self.ef_hi + exp_add
        # K = (1 - bias) - T, clamped at 0 (Lp >= L >= 0 anyway)
        self.k_hi = max(0, (1 - self.bias) - t_lo)
        self.lsat = max(0, (1 << (self.e_bits - 1)) - t_lo)
        self.mag_width = max(1, min(y_width - 1, max(self.lsat, self.k_hi + 1)))
        # bit j of "the positions above K" is j > K: 0 at j = 0 and 1 above k_hi for every
        # ef_min, so only bits 1..k_var depend on the vector
        self.k_var = min(self.k_hi, self.mag_width - 1)
        self.lp_max = max(self.mag_width - 1, self.k_hi)
        self.lp_width = self.lp_max.bit_length() or 1
        # B = T + bias - 1; the exponent part Lp + B of a lane
        self.b_shape = _rng(t_lo + self.bias - 1, t_hi + self.bias - 1)
        self.eb_shape = _rng(min(0, t_lo + self.bias - 1), self.lp_max + t_hi + self.bias - 1)
        self.max_finite = (((1 << self.e_bits) - 2) << self.m_bits) | ((1 << self.m_bits) - 1)


#: The ports FloatPrep hands to FloatPack (same names on both; the top level may
#: register them in between).
PREP_PORTS = ("low", "lp", "eb", "ysign", "sat", "neg", "nz")


class FloatPrep(wiring.Component):
    """Sign fold, leading-one detect, subnormal clamp, saturation flag (module docstring).

    Combinational, or with ``abs_reg`` one pipeline register after the saturation
    flag and the first ``lod_split`` levels of the leading-one tree (docs/DECISIONS.md,
    "Register cuts inside the float conversion"), and/or with
    ``lead_reg`` one after the leading-one tree (before the subnormal clamp):
    then ``en`` (In) advances them and every output is one cycle behind
    ``y``/``ef_min``/``mask`` per register. The last of them holds the per-vector K,
    B and K + B in one copy per :data:`hw.pipeline.REPLICA_SELECT_LANES` lanes
    (:func:`hw.pipeline.replicas`), with both registers four per copy of the ``abs``
    register (one per 16 lanes): a fanout tree (docs/DECISIONS.md, "Register replicas");
    the test L > K is an AND-OR of m1 with the mask of the positions above K, beside the
    leading-one tree (the mask in one copy per :data:`hw.pipeline.REPLICA_SELECT_LANES` lanes
    in the ``abs`` register).

    With ``alt_exp`` (the read path's fold window, ``hw.ifwht`` "Fold window") lane i
    takes T from ``ef_alt`` where ``alt`` bit i is set, else from ``ef_min``: both
    exponents' per-vector values (K, B, K + B, the mask) are built and kept in copies,
    and each lane selects its own (a 2:1 select per bit, the bit riding in the registers).

    Ports: ``y`` (N signed lanes), ``flip`` (N bits: S = (-1)^flip y), ``ef_min``,
    ``mask`` (N bits: D) in (with ``alt_exp`` also ``ef_alt`` and ``alt``, N bits); per
    lane ``low`` (the low ``mag_width`` bits of y), ``lp``, ``ysign`` (y < 0), ``sat``,
    ``neg`` (the output sign), ``nz`` (y != 0), ``eb`` (Lp + B) out (:data:`PREP_PORTS`).
    """

    def __init__(self, n: int, y_width: int, ef_width: int, consts: FloatConsts,
                 abs_reg: bool = False, lead_reg: bool = False, alt_exp: bool = False,
                 lod_split: int = DecoderOptions.lod_split):
        if y_width != consts.y_width:
            raise ValueError(f"y_width {y_width} != consts.y_width {consts.y_width}")
        self.n, self.c, self.abs_reg, self.lead_reg = n, consts, bool(abs_reg), bool(lead_reg)
        self.alt_exp = bool(alt_exp)
        self.lod_split = lod_split
        ports = {
            "y": In(data.ArrayLayout(signed(y_width), n)),
            "ef_min": In(ef_width),
            "mask": In(n),
            "flip": In(n),
            "low": Out(data.ArrayLayout(consts.mag_width, n)),
            "lp": Out(data.ArrayLayout(consts.lp_width, n)),
            "ysign": Out(n),
            "sat": Out(n),
            "neg": Out(n),
            "nz": Out(n),
            "eb": Out(data.ArrayLayout(consts.eb_shape, n)),
        }
        if self.alt_exp:    # per lane: T from ef_alt instead of ef_min
            ports.update(ef_alt=In(ef_width), alt=In(n))
        if self.abs_reg or self.lead_reg:
            ports["en"] = In(1)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        c = self.c
        w, mw = c.y_width, c.mag_width
        # the per-vector values of ef_min (and of ef_alt); the last register keeps them in copies
        pvs = [self._per_vector(m, self.ef_min, "")]
        if self.alt_exp:
            pvs.append(self._per_vector(m, self.ef_alt, "_alt"))
        alts = self.alt if self.alt_exp else None
        alt_kw = {"alt": alts} if self.alt_exp else {}
        lows = [Signal(mw, name=f"low{i}") for i in range(self.n)]
        sgn = Signal(self.n, name="ysgn")
        sat = Signal(self.n, name="sat")
        negs = Signal(self.n, name="neg")
        split = min(self.lod_split, (mw - 1).bit_length() - 1)
        lods = []       # the leading-one trees' nodes at level ``split`` (before ``abs``)
        for i in range(self.n):
            yv = Value.cast(self.y[i])
            s = yv[w - 1]
            m1 = yv.as_unsigned() ^ s.replicate(w)          # |y| - s: one's complement
            m.d.comb += [lows[i].eq(yv[:mw]), sgn[i].eq(s),
                         sat[i].eq(m1[c.lsat:w - 1].any() if c.lsat < w - 1 else 0),
                         negs[i].eq(s ^ self.mask[i])]
            if split:
                lods.append(leading_one(m, m1[:mw], f"lod{i}", levels=split))
        flips = self.flip
        kv = c.k_var
        aboves = [[pv.pop("above")] if kv else [] for pv in pvs]
        leaf = replica_count(self.n, REPLICA_SELECT_LANES)   # the last copies' count
        if self.abs_reg:
            r = stage(m, self.en, "abs", low=lows, s=sgn, sat=sat, neg=negs, flip=flips,
                      lany=[t[1] for t in lods], lpos=[t[2] for t in lods], **alt_kw)
            lows, sgn, sat, negs, flips = r["low"], r["s"], r["sat"], r["neg"], r["flip"]
            alts = r.get("alt")
            alt_kw = {"alt": alts} if self.alt_exp else {}
            lods = [(split, a, p) for a, p in zip(r["lany"], r["lpos"])]
            pvs = [self._copies(m, f"abs{sfx}", pv,
                                replica_count(self.n) if self.lead_reg else leaf)
                   for pv, sfx in zip(pvs, ("", "_alt"))]
            if kv:
                aboves = [replicas(m, self.en, f"abs_above{sfx}", ab[0], leaf)
                          for ab, sfx in zip(aboves, ("", "_alt"))]
        # L > K as "m1 has a bit above K" (an AND-OR with the per-vector mask beside the
        # leading-one tree, before the lead register), not a compare after it; only the
        # mask's bits 1..k_var vary, the OR of m1's bits above k_var is the lane's own
        poss, nzs, ups = [], [], []
        for i in range(self.n):
            mag = Signal(mw, name=f"m1_{i}")
            m.d.comb += mag.eq(lows[i] ^ sgn[i].replicate(mw))
            pos, any_ = leading_one(m, mag, f"lod{i}", start=lods[i] if split else None)
            poss.append(pos)
            nzs.append(any_ | sgn[i] | sat[i])          # y != 0
            if split:      # the bits of whole groups from the tree's nodes at level split
                g0 = -(-(kv + 1) // (1 << split))
                fixed = mag[kv + 1:min(mw, g0 << split)].any() | lods[i][1][g0:].any()
            else:
                fixed = mag[kv + 1:].any() if kv + 1 < mw else Const(0, 1)
            if kv:
                ab = replica_of(aboves[0], i, self.n)
                if self.alt_exp:
                    ab = Mux(alts[i], replica_of(aboves[1], i, self.n), ab)
                var = (mag[1:kv + 1] & ab).any()
            else:
                var = Const(0, 1)
            ups.append(fixed | var)
        if self.lead_reg:
            r = stage(m, self.en, "lead", low=lows, pos=poss, nz=Cat(*nzs), s=sgn, sat=sat,
                      neg=negs, flip=flips, up=Cat(*ups), **alt_kw)
            lows, poss, negs, alts = r["low"], r["pos"], r["neg"], r.get("alt")
            pvs = [self._copies(m, f"lead{sfx}", pv, leaf) for pv, sfx in zip(pvs, ("", "_alt"))]
            sgn, sat, flips = r["s"], r["sat"], r["flip"]
            nzs = [r["nz"][i] for i in range(self.n)]
            ups = [r["up"][i] for i in range(self.n)]
        nz = Cat(*nzs)
        m.d.comb += [self.neg.eq(negs ^ (flips & nz)), self.nz.eq(nz),
                     self.ysign.eq(sgn), self.sat.eq(sat)]
        if not (self.abs_reg or self.lead_reg):
            pvs = [{k: [v] for k, v in pv.items()} for pv in pvs]
        # Lp + B = max(L + B, K + B): the addition beside the test L > K, not after the max
        for i in range(self.n):
            kc_i, b_i, kb_i = (replica_of(pvs[0][k], i, self.n) for k in ("kc", "b", "kb"))
            if self.alt_exp:
                kc_i, b_i, kb_i = (Mux(alts[i], replica_of(pvs[1][k], i, self.n), v)
                                   for k, v in (("kc", kc_i), ("b", b_i), ("kb", kb_i)))
            up = Signal(name=f"lp_up{i}")                # L > K
            lb = Signal(c.eb_shape, name=f"lb{i}")
            m.d.comb += [up.eq(ups[i]), lb.eq(poss[i] + b_i),
                         self.low[i].eq(lows[i]), self.lp[i].eq(Mux(up, poss[i], kc_i)),
                         self.eb[i].eq(Mux(up, lb, kb_i))]
        return m

    def _per_vector(self, m: Module, exp, sfx: str) -> dict:
        """K (clamped at 0), B, K + B and the mask of the bit positions above K of the
        vector: {"kc", "b", "kb", "above"} (module docstring; ``above`` has the
        ``k_var`` bits 1..k_var, bit j - 1 = j > K; absent when k_var = 0), functions of
        ef_min alone, so they are one constant row per ef_min value (values outside
        [ef_lo, ef_hi] never occur and read as the nearest end): each bit is a small LUT
        function of ef_min's bits, not three chained additions (docs/DECISIONS.md,
        "Register cuts inside the float conversion"). ``exp``: the
        exponent field they are of (``ef_min``, or ``ef_alt``); ``sfx``: the signals' name
        suffix."""
        c = self.c
        kc = Signal(range(max(c.k_hi, 1) + 1), name=f"k_min_lead{sfx}")
        b = Signal(c.b_shape, name=f"b_bias{sfx}")
        kb = Signal(c.eb_shape, name=f"k_bias{sfx}")    # K + B: Lp + B of a lane with L <= K
        above = Signal(max(c.k_var, 1), name=f"k_above{sfx}")
        var = (1 << c.k_var) - 1
        with m.Switch(exp):
            for ef in range(1 << len(exp)):
                t = min(max(ef, c.ef_lo), c.ef_hi) + c.exp_add      # T = ef_min + exp_add
                k = max(0, (1 - c.bias) - t)                      # K = (1 - bias) - T
                with m.Case(ef):
                    m.d.comb += [kc.eq(k), b.eq(t + c.bias - 1), kb.eq(k + t + c.bias - 1),
                                 above.eq(var & ~((1 << k) - 1))]
        out = {"kc": kc, "b": b, "kb": kb}
        return {**out, "above": above} if c.k_var else out

    def _copies(self, m: Module, name: str, values: dict, copies: int) -> dict:
        """Each per-vector value (a Value, or its upstream copies) in ``copies`` registers
        (:func:`hw.pipeline.replicas`): name -> its list of copies."""
        return {k: replicas(m, self.en, f"{name}_{k}", v, copies) for k, v in values.items()}


class FloatPack(wiring.Component):
    """Shift, one's complement correction, round to nearest even, saturate, pack
    (module docstring).

    Combinational, or with ``shift_reg`` one pipeline register inside the right
    shifter (the shift by Lp's high bits and its sticky bit before it, the shift by
    its ``shift_low_bits`` low bits after it, then the correction, rounding, packing
    and saturation), and/or with ``round_reg`` one after the rounding increment
    (before packing and saturation): then ``en`` (In) advances them and ``bits`` is
    one cycle behind the inputs per register.

    Args:
        shift_low_bits: low bits of Lp shifted by after the ``shift_reg`` register
            (default ``hw.options.DecoderOptions.pack_shift_low_bits``; 0: the whole
            shifter before it;
            clamped to Lp's width); without ``shift_reg`` the two shifters in series
            when given (the formal proof of the split), else one. ValueError if
            negative.

    Ports: :data:`PREP_PORTS` in; ``bits`` (N x 16) out.
    """

    def __init__(self, n: int, consts: FloatConsts, shift_reg: bool = False,
                 round_reg: bool = False, shift_low_bits: int | None = None):
        self.n, self.c = n, consts
        self.shift_reg, self.round_reg = bool(shift_reg), bool(round_reg)
        lo = DecoderOptions.pack_shift_low_bits if shift_low_bits is None else shift_low_bits
        if lo < 0:
            raise ValueError(f"shift_low_bits must be >= 0, got {lo}")
        given = self.shift_reg or shift_low_bits is not None
        self.shift_low_bits = min(lo, consts.lp_width) if given else 0
        ports = {
            "low": In(data.ArrayLayout(consts.mag_width, n)),
            "lp": In(data.ArrayLayout(consts.lp_width, n)),
            "ysign": In(n),
            "sat": In(n),
            "neg": In(n),
            "nz": In(n),
            "eb": In(data.ArrayLayout(consts.eb_shape, n)),
            "bits": Out(data.ArrayLayout(16, n)),
        }
        if self.shift_reg or self.round_reg:
            ports["en"] = In(1)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        c = self.c
        mb = c.m_bits
        eb_lo, eb_hi = shape_bounds(c.eb_shape)
        top = c.max_finite >> mb            # X: the exponent part of max_finite
        ws, sts, ebs, ovs = [], [], [], []
        lo = self.shift_low_bits
        los = []                            # Lp's low bits, shifted by after ``shr``
        for i in range(self.n):
            lp = self.lp[i]
            # the high part keeps the mb + 2 bits and the 2^lo - 1 above them that the
            # low part can still shift down into them; its sticky bit is the OR of the
            # bits below the high part's window, the low part's of those it shifts out
            wv, sticky = shift_right_sticky(m, Cat(Const(0, mb + 1), self.low[i]), lp[lo:],
                                            mb + 1 + (1 << lo), f"sh{i}",
                                            amount_max=c.lp_max >> lo, step=1 << lo)
            los.append(lp[:lo])
            ws.append(wv)
            sts.append(sticky)
            eb = self.eb[i]      # exponent part of the result: Lp + B (FloatPrep)
            ebs.append(eb)
            # saturation: the packed value ((eb << mb) + r) > max_finite, whose mb low
            # bits are all ones, is (eb + (r >> mb)) > X with r >> mb in {0, 1, 2}
            fl = Signal(3, name=f"ebx{i}")
            m.d.comb += fl.eq(Cat(gt_const(eb, top), eb == top, eb == top - 1))
            ovs.append(fl)
        neg, nz, sgn, sat = self.neg, self.nz, self.ysign, self.sat
        if self.shift_reg:
            r = stage(m, self.en, "shr", w=ws, eb=ebs, ov=ovs, sticky=Cat(*sts), neg=neg,
                      nz=nz, s=sgn, sat=sat, **({"lo": los} if lo else {}))
            ws, sts, ebs = r["w"], [r["sticky"][i] for i in range(self.n)], r["eb"]
            neg, nz, ovs, sgn, sat = r["neg"], r["nz"], r["ov"], r["s"], r["sat"]
            los = r.get("lo", los)
        for i in range(self.n if lo else 0):
            wv, st = shift_right_sticky(m, ws[i], los[i], mb + 2, f"shl{i}")
            ws[i], sts[i] = wv, sts[i] | st
        rs = []
        for i in range(self.n):
            sticky, s = sts[i], sgn[i]
            # kept bits of |y| t = (w ^ s) + ci (one's complement plus the +1 that
            # reaches them) and RNE in one carry chain: r = (t + 1) >> 1 with bit 0
            # cleared at a tie (g = t[0] = 1, sticky = 0; then ci = s and g = w[0])
            ci = s & ~sticky
            t1 = Signal(mb + 3, name=f"kept1_{i}")             # t + 1
            m.d.comb += t1.eq((ws[i] ^ s.replicate(mb + 2)) + Cat(~ci, ci))
            tie = ws[i][0] & ~sticky
            r = Signal(mb + 2, name=f"rnd{i}")
            m.d.comb += r.eq(Cat(t1[1] & ~tie, t1[2:]))
            rs.append(r)
        if self.round_reg:
            r = stage(m, self.en, "rnd", r=rs, eb=ebs, ov=ovs, neg=neg, nz=nz, sat=sat)
            rs, ebs, neg, nz, ovs, sat = r["r"], r["eb"], r["neg"], r["nz"], r["ov"], r["sat"]
        for i in range(self.n):
            rh, fl = rs[i][mb:], ovs[i]            # r >> mb; eb > X, eb == X, eb == X - 1
            # ((eb << mb) + r): the mb low bits of r pass, r >> mb adds to the exponent
            ex = Signal(_rng(eb_lo, eb_hi + 2), name=f"pkexp{i}")
            m.d.comb += ex.eq(ebs[i] + rh)
            over = Signal(name=f"over{i}")
            m.d.comb += over.eq(sat[i] | fl[0] | (fl[1] & (rh != 0)) | (fl[2] & rh[1]))
            mbits = Signal(15, name=f"magbits{i}")
            m.d.comb += mbits.eq(Mux(~nz[i], 0, Mux(over, c.max_finite, Cat(rs[i][:mb], ex))))
            m.d.comb += self.bits[i].eq(Cat(mbits, neg[i]))
        return m
