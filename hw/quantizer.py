"""Block quantizer: ue5m3 scale byte per block of G lanes, then b-bit codes.

Bit-exact with ``sim_models.quant`` / ``sim_models.scale`` without dividers.

Scale selection (:class:`ScaleSelect`), for a block maximum A = max|y| in
units of 2^u and q = qmax: the golden rule is "smallest byte s in [1, 255]
with q * scale(s) >= A * 2^u" (else 0xFF and FLAG_SAT).

* A == 0 -> byte 0x01.
* Leading-one detect: k = floor(log2 A). Normalize A_n = A << (W-1-k) (exact)
  and take R = ceil(A_n / 2^(W-1-J)), J = floor(log2(15 q)) (R is the top J+1
  bits of A_n plus a sticky bit; 2^J <= R <= 2^(J+1)). For an integer C,
  A <= C * 2^(k-j) exactly iff R <= C * 2^(J-j).
* Normal bytes e >= 1: scale = (8+m) 2^(e-10). Writing e = k + u + 10 - j, the
  smallest fitting scale has j = J if R <= 15q (else j = J-1, which always
  fits), and m = #{m' in 0..6 : R > q(8+m') 2^(J-j)} -- compares against the
  constants (8+m') q and 2 (8+m') q.
* If that virtual exponent e exceeds 31 -> 0xFF, FLAG_SAT. If it is >= 1 it
  is the answer (byte e<<3 | m): every smaller byte, subnormals included, is
  below the virtual e-1 grid, which does not fit.
* If e <= 0, the answer is a byte s in 1..8 (scale s * 2^-9): with
  z = J - 9 - k - u (>= 1 here, clamped to J+1), s = 1 + #{s' in 1..7 :
  ceil(R / 2^z) > q s'}.

Codes (:class:`Thresholds` + per-lane compares): with scale = sig * 2^exp,
the golden rule counts j in 1..q with 2|y| 2^u >= (2j-1) sig 2^exp, i.e.
|y| >= T_j = ceil((2j-1) sig 2^(exp-u-1)). T_j is computed once per block by a
clamped shift (saturated to 2^W_y, "never", when it exceeds every |y|); each
lane then needs q magnitude compares; code = sign(y) * count, ties away from
zero by construction.

Pipeline (:class:`Quantizer`): stage A (|y|, block max tree, scale select) is
combinational from the input and ends in one register; stage B (thresholds,
compares) is combinational from that register. The top level registers the
packed result, so the quantizer adds 2 cycles of latency in the top level.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .frontend import tree_reduce

SCALE_MAX_E = 31


def _shape_range(lo: int, hi: int) -> Shape:
    return Shape.cast(range(lo, hi + 1))


def _bounds(shape: Shape) -> tuple[int, int]:
    shape = Shape.cast(shape)
    if shape.signed:
        return -(1 << (shape.width - 1)), (1 << (shape.width - 1)) - 1
    return 0, (1 << shape.width) - 1


class ScaleSelect(wiring.Component):
    """Combinational scale-byte selector (see module docstring).

    Args:
        a_width: width of the unsigned block maximum A.
        u_shape: shape of the signed unit exponent u.
        qmax: largest code magnitude q (1, 3 or 7).
    """

    def __init__(self, a_width: int, u_shape, qmax: int):
        self.a_width, self.u_shape, self.qmax = a_width, Shape.cast(u_shape), qmax
        super().__init__({
            "a": In(a_width),
            "u": In(u_shape),
            "byte": Out(8),
            "sat": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        q = self.qmax
        J = (15 * q).bit_length() - 1
        W = max(self.a_width, J + 1)
        L = W - 1 - J
        ulo, uhi = _bounds(self.u_shape)

        a = Signal(W)
        m.d.comb += a.eq(self.a)
        # leading-one detect: k = floor(log2 a) (the highest set bit wins)
        k = Signal(range(W))
        for i in range(W):
            with m.If(a[i]):
                m.d.comb += k.eq(i)
        lz = Signal(range(W))
        m.d.comb += lz.eq(W - 1 - k)
        an = Signal(W)
        m.d.comb += an.eq(a << lz)
        r = Signal(J + 2)
        if L > 0:
            m.d.comb += r.eq(an[L:] + an[:L].any())
        else:
            m.d.comb += r.eq(an)

        fit_j = Signal()
        m.d.comb += fit_j.eq(r <= 15 * q)
        mant = Signal(3)
        with m.If(fit_j):
            m.d.comb += mant.eq(sum(r > q * (8 + i) for i in range(7)))
        with m.Else():
            m.d.comb += mant.eq(sum(r > 2 * q * (8 + i) for i in range(7)))
        # virtual exponent field e = k + u + 10 - j
        ev = Signal(_shape_range(ulo + 10 - J, W - 1 + uhi + 11 - J))
        m.d.comb += ev.eq(k + self.u + (10 - J) + ~fit_j)

        # subnormal range: s in 1..8, scale s * 2^-9
        zr = Signal(_shape_range(J - 9 - (W - 1) - uhi, J - 9 - ulo))
        m.d.comb += zr.eq(J - 9 - k - self.u)
        z = Signal(range(J + 2))
        m.d.comb += z.eq(Mux(zr < 0, 0, Mux(zr > J + 1, J + 1, zr)))
        rs = Signal(J + 2)
        m.d.comb += rs.eq(r >> z)
        rc = Signal(J + 3)
        m.d.comb += rc.eq(rs + ((rs << z) != r))
        sub = Signal(4)
        m.d.comb += sub.eq(1 + sum(rc > q * s for s in range(1, 8)))

        with m.If(a == 0):
            m.d.comb += self.byte.eq(1)
        with m.Elif(ev > SCALE_MAX_E):
            m.d.comb += [self.byte.eq(0xFF), self.sat.eq(1)]
        with m.Elif(ev >= 1):
            m.d.comb += self.byte.eq(Cat(mant, ev[:5]))
        with m.Else():
            m.d.comb += self.byte.eq(sub)
        return m


class Thresholds(wiring.Component):
    """Per-block code thresholds T_j = ceil((2j-1) sig 2^(exp-u-1)), j = 1..q.

    Saturated to 2^y_width (no |y| reaches it). Combinational.
    """

    def __init__(self, y_width: int, u_shape, qmax: int):
        self.y_width, self.u_shape, self.qmax = y_width, Shape.cast(u_shape), qmax
        super().__init__({
            "byte": In(8),
            "u": In(u_shape),
            "th": Out(data.ArrayLayout(unsigned(y_width + 1), qmax)),
        })

    def elaborate(self, platform):
        m = Module()
        wy = self.y_width
        cmax = (2 * self.qmax - 1) * 15
        cbits = cmax.bit_length()
        e = self.byte[3:8]
        mm = self.byte[:3]
        sig = Signal(4)
        m.d.comb += sig.eq(Mux(e == 0, mm, mm + 8))
        ulo, uhi = _bounds(self.u_shape)
        d = Signal(_shape_range(1 - 10 - uhi - 1, 31 - 10 - ulo - 1))
        m.d.comb += d.eq(Mux(e == 0, 1, e) - 10 - self.u - 1)
        dp = Signal(range(wy + 1))
        m.d.comb += dp.eq(Mux(d < 0, 0, Mux(d > wy, wy, d)))
        dn = Signal(range(cbits + 1))
        m.d.comb += dn.eq(Mux(d >= 0, 0, Mux(-d > cbits, cbits, -d)))
        sat_val = 1 << wy
        for j in range(1, self.qmax + 1):
            c = Signal(cbits, name=f"c{j}")
            m.d.comb += c.eq(sig * (2 * j - 1))
            tp = Signal(cbits + wy, name=f"tpos{j}")
            m.d.comb += tp.eq(c << dp)
            cs = Signal(cbits, name=f"cshr{j}")
            m.d.comb += cs.eq(c >> dn)
            tn = Signal(cbits + 1, name=f"tneg{j}")
            m.d.comb += tn.eq(cs + ((cs << dn) != c))
            with m.If(d >= 0):
                m.d.comb += self.th[j - 1].eq(Mux(tp >= sat_val, sat_val, tp))
            with m.Else():
                m.d.comb += self.th[j - 1].eq(tn)
        return m


class Quantizer(wiring.Component):
    """Two-stage block quantizer (see module docstring).

    Args:
        n, block, bits: N, G, b.
        y_in_width: signed width of the FWHT output lanes (M + log2 N).
        u_shape: shape of the unit exponent.

    Ports: ``en`` (advance the register), ``i_valid``, ``y``, ``u``, ``flags_i``
    (NaN, Inf) in; ``o_valid``, ``codes``, ``scales``, ``flags`` (NaN, Inf, SAT)
    out, combinational from the internal register.
    """

    def __init__(self, n: int, block: int, bits: int, y_in_width: int, u_shape):
        self.n, self.block, self.bits = n, block, bits
        self.qmax = (1 << (bits - 1)) - 1
        self.n_blocks = n // block
        self.y_in_width = y_in_width
        self.y_width = y_in_width - 1   # |y| < 2^(M-1+log2 N)
        self.u_shape = Shape.cast(u_shape)
        super().__init__({
            "en": In(1),
            "i_valid": In(1),
            "y": In(data.ArrayLayout(signed(y_in_width), n)),
            "u": In(u_shape),
            "flags_i": In(2),
            "o_valid": Out(1),
            "codes": Out(data.ArrayLayout(signed(bits), n)),
            "scales": Out(data.ArrayLayout(8, self.n_blocks)),
            "flags": Out(3),
        })

    def elaborate(self, platform):
        m = Module()
        n, g, wy = self.n, self.block, self.y_width

        # ---- stage A: |y|, block max, scale byte --------------------------------
        mags, negs = [], []
        for i in range(n):
            yv = self.y[i]
            mag = Signal(wy, name=f"abs{i}")
            m.d.comb += mag.eq(Mux(yv < 0, -yv, yv))
            mags.append(mag)
            negs.append(yv < 0)
        bytes_a, sats = [], []
        for blk in range(self.n_blocks):
            amax = tree_reduce(m, mags[blk * g:(blk + 1) * g],
                               lambda a, b: Mux(a > b, a, b), f"bmax{blk}")
            sel = ScaleSelect(wy, self.u_shape, self.qmax)
            m.submodules[f"scale{blk}"] = sel
            m.d.comb += [sel.a.eq(amax), sel.u.eq(self.u)]
            bytes_a.append(sel.byte)
            sats.append(sel.sat)

        # ---- register ---------------------------------------------------------------
        r_mag = [Signal(wy, name=f"q_abs{i}", reset_less=True) for i in range(n)]
        r_neg = [Signal(name=f"q_neg{i}", reset_less=True) for i in range(n)]
        r_byte = [Signal(8, name=f"q_scale{b}", reset_less=True) for b in range(self.n_blocks)]
        r_u = Signal(self.u_shape, name="q_u", reset_less=True)
        r_flags = Signal(3, name="q_flags", reset_less=True)
        r_valid = Signal(name="q_valid")
        with m.If(self.en):
            m.d.sync += [d.eq(s) for d, s in zip(r_mag, mags)]
            m.d.sync += [d.eq(s) for d, s in zip(r_neg, negs)]
            m.d.sync += [d.eq(s) for d, s in zip(r_byte, bytes_a)]
            m.d.sync += [r_u.eq(self.u), r_valid.eq(self.i_valid),
                         r_flags.eq(Cat(self.flags_i, Cat(*sats).any()))]

        # ---- stage B: thresholds and codes -------------------------------------
        for blk in range(self.n_blocks):
            th = Thresholds(wy, self.u_shape, self.qmax)
            m.submodules[f"thr{blk}"] = th
            m.d.comb += [th.byte.eq(r_byte[blk]), th.u.eq(r_u),
                         self.scales[blk].eq(r_byte[blk])]
            for i in range(blk * g, (blk + 1) * g):
                cnt = Signal(range(self.qmax + 1), name=f"cnt{i}")
                m.d.comb += cnt.eq(sum(r_mag[i] >= th.th[j] for j in range(self.qmax)))
                m.d.comb += self.codes[i].eq(Mux(r_neg[i], -cnt, cnt))
        m.d.comb += [self.o_valid.eq(r_valid), self.flags.eq(r_flags)]
        return m
