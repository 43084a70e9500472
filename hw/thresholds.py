"""Per-block code thresholds: :class:`Thresholds`.

The golden rule (``sim_models.quant``, docs/FORMAT.md 3.7) counts j in 1..h-1 with |y| 2^u
2^f >= a_j scale, a_j = 2j-1, f = 1 (midtread) or a_j = j, f = 0 (midrise),
i.e. |y| >= T_j = ceil(a_j sig 2^(exp-u-f)). T_j is computed once per block by
a clamped shift (saturated to 2^W_y, "never", when it exceeds every |y|); each
lane then needs h-1 magnitude compares (in :mod:`hw.quantizer`).
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Shape, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from sim_models.params import FormatParams
from sim_models.quant import threshold_coefs

from .scale_select import encoding, shape_bounds, shape_range


class Thresholds(wiring.Component):
    """Per-block code thresholds T_j = ceil(a_j sig 2^(exp-u-f)) (module docstring).

    Args:
        p: format parameters: mode and bits give (a_j, f) (``sim_models.quant.threshold_coefs``),
            scale the encoding of ``byte``.
        y_width: width of |y|; thresholds saturate to 2^y_width (no |y| reaches it).
        u_shape: shape of u.

    Ports: ``byte``, ``u`` in; ``th`` (len(coefs) x (y_width+1) bits) out.
    Combinational.
    """

    def __init__(self, p: FormatParams, y_width: int, u_shape):
        self.coefs, self.frac = threshold_coefs(p.mode, p.bits)
        encoding(p.scale)
        self.scale = p.scale
        self.y_width, self.u_shape = y_width, Shape.cast(u_shape)
        super().__init__({
            "byte": In(8),
            "u": In(u_shape),
            "th": Out(data.ArrayLayout(unsigned(y_width + 1), len(self.coefs))),
        })

    def elaborate(self, platform):
        m = Module()
        enc = encoding(self.scale)
        mb, eb, bias = enc.mant_bits, enc.exp_bits, enc.bias
        wy = self.y_width
        cbits = (max(self.coefs) * ((2 << mb) - 1)).bit_length()
        e = self.byte[mb:mb + eb]
        mm = self.byte[:mb]
        sig = Signal(mb + 1)
        m.d.comb += sig.eq(Mux(e == 0, mm, mm + (1 << mb)))
        ulo, uhi = shape_bounds(self.u_shape)
        f = self.frac
        off = bias + mb + f
        d = Signal(shape_range(1 - off - uhi, (1 << eb) - 1 - off - ulo))
        m.d.comb += d.eq(Mux(e == 0, 1, e) - off - self.u)
        dp = Signal(range(wy + 1))
        m.d.comb += dp.eq(Mux(d < 0, 0, Mux(d > wy, wy, d)))
        dn = Signal(range(cbits + 1))
        m.d.comb += dn.eq(Mux(d >= 0, 0, Mux(-d > cbits, cbits, -d)))
        sat_val = 1 << wy
        for j, aj in enumerate(self.coefs, start=1):
            c = Signal(cbits, name=f"c{j}")
            m.d.comb += c.eq(sig * aj)
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
