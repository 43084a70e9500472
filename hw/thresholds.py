"""Per-block code thresholds: :class:`Thresholds`.

The golden rule (``sim_models.quant``, docs/FORMAT.md 3.7) counts j in 1..h-1 with |y| 2^u
2^f >= a_j scale, a_j = 2j-1, f = 1 (midtread) or a_j = j, f = 0 (midrise),
i.e. |y| >= T_j = ceil(a_j sig 2^(exp-u-f)). T_j is computed once per block by
a clamped shift (saturated to 2^W_y, "never", when it exceeds every |y|); each
lane then needs h-1 magnitude compares (in :mod:`hw.quantizer`).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Shape, Signal, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from sim_models.params import FormatParams
from sim_models.quant import threshold_coefs

from .pipeline import gt_const, replicas, stage
from .scale_select import encoding, shape_bounds, shape_range


class Thresholds(wiring.Component):
    """Per-block code thresholds T_j = ceil(a_j sig 2^(exp-u-f)) (module docstring).

    Args:
        p: format parameters: mode and bits give (a_j, f) (``sim_models.quant.threshold_coefs``),
            scale the encoding of ``byte``.
        y_width: width of |y|; thresholds saturate to 2^y_width (no |y| reaches it).
        u_shape: shape of u.
        copies: copies of the thresholds (``th[k]``), each for its own group of lanes.
            With ``pipelined``, the register before the shifts is kept in that many
            copies (``tsh_r{k}``, :func:`hw.pipeline.replicas`) and each copy computes its
            own shifts, so the thresholds of a copy are made next to the lanes that read
            them (one copy feeding every lane group was the N=64 encoder's worst path,
            docs/SYNTH.md); without, every copy is the same logic.

    Ports: ``byte``, ``u`` in; ``th`` (copies x len(coefs) x (y_width+1) bits) out.
    Combinational, or with registers advanced by ``en`` (In): ``diff_reg`` after the
    exponent differences d = e - off - u and -d (two carry chains), ``pipelined`` after
    the shift amounts and the products ``a_j sig``, before the shifts, ``sel_reg`` after
    the shifts (the saturated left shift and the rounded right shift of each T_j, in each
    copy), before the select by the sign of d.
    """

    def __init__(self, p: FormatParams, y_width: int, u_shape, pipelined: bool = False,
                 diff_reg: bool = False, copies: int = 1, sel_reg: bool = False):
        self.coefs, self.frac = threshold_coefs(p.mode, p.bits)
        encoding(p.scale)
        self.scale = p.scale
        self.y_width, self.u_shape = y_width, Shape.cast(u_shape)
        self.pipelined, self.diff_reg = bool(pipelined), bool(diff_reg)
        self.sel_reg = bool(sel_reg)
        if not isinstance(copies, int) or isinstance(copies, bool) or copies < 1:
            raise ValueError(f"copies (of the thresholds) must be an int >= 1, got {copies!r}")
        self.copies = copies
        ports = {
            "byte": In(8),
            "u": In(u_shape),
            "th": Out(data.ArrayLayout(data.ArrayLayout(unsigned(y_width + 1), len(self.coefs)),
                                       copies)),
        }
        if self.pipelined or self.diff_reg or self.sel_reg:
            ports["en"] = In(1)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        enc = encoding(self.scale)
        mb, eb, bias = enc.mant_bits, enc.exp_bits, enc.bias
        wy = self.y_width
        cbits = (max(self.coefs) * ((2 << mb) - 1)).bit_length()
        e = self.byte[mb:mb + eb]
        mm = self.byte[:mb]
        sig = Signal(mb + 1)
        m.d.comb += sig.eq(Cat(mm, e != 0))                 # hidden bit unless subnormal
        ulo, uhi = shape_bounds(self.u_shape)
        f = self.frac
        off = bias + mb + f
        e1 = Signal(eb)
        m.d.comb += e1.eq(e | (e == 0))                     # field 0 reads as 1
        # d and -d side by side (no negation after the subtraction), clamps as logic
        d = Signal(shape_range(1 - off - uhi, (1 << eb) - 1 - off - ulo))
        m.d.comb += d.eq(e1 - off - self.u)
        nd = Signal(shape_range(off + ulo - (1 << eb) + 1, off + uhi - 1))
        m.d.comb += nd.eq(off + self.u - e1)
        if self.diff_reg:
            st = stage(m, self.en, "tsd", d=d, nd=nd, sig=sig)
            d, nd, sig = st["d"], st["nd"], st["sig"]
        dneg = d[-1]
        dp = Signal(range(wy + 1))
        m.d.comb += dp.eq(Mux(dneg, 0, Mux(gt_const(d, wy), wy, d)))
        dn = Signal(range(cbits + 1))
        m.d.comb += dn.eq(Mux(~dneg, 0, Mux(gt_const(nd, cbits), cbits, nd)))
        cs_ = []
        for j, aj in enumerate(self.coefs, start=1):
            c = Signal(cbits, name=f"c{j}")
            m.d.comb += c.eq(sig * aj)
            cs_.append(c)
        pos = Signal(name="d_pos")
        m.d.comb += pos.eq(~dneg)
        # ceil(c / 2^dn) = (c + 2^dn - 1) >> dn; the mask 2^dn - 1 as logic from dn
        low = Signal(cbits, name="dn_mask")
        m.d.comb += low.eq(Cat(*(gt_const(dn, i) for i in range(cbits))))
        if not self.pipelined:
            self._shifts(m, "", cs_, dp, dn, low, pos, self.th[0])
            for k in range(1, self.copies):
                m.d.comb += self.th[k].eq(self.th[0])
            return m
        parts = [*cs_, dp, dn, low, pos]
        for k, r in enumerate(replicas(m, self.en, "tsh", Cat(*parts), self.copies)):
            lo, regs = 0, []
            for v in parts:
                regs.append(r[lo:lo + len(v)])
                lo += len(v)
            nc = len(cs_)
            self._shifts(m, f"_{k}" if self.copies > 1 else "", regs[:nc], *regs[nc:],
                         self.th[k])
        return m

    def _shifts(self, m: Module, sfx: str, cs_, dp, dn, low, pos, th) -> None:
        """The thresholds ``th`` (one copy) from the products ``a_j sig`` (``cs_``), the
        shift amounts ``dp``, ``dn``, the rounding mask ``low`` and ``pos`` (d >= 0)."""
        wy, cbits = self.y_width, len(cs_[0])
        tps, tns = [], []
        for j, c in enumerate(cs_, start=1):
            tp = Signal(cbits + wy, name=f"tpos{j}{sfx}")
            m.d.comb += tp.eq(c << dp)
            ts = Signal(wy + 1, name=f"tsat{j}{sfx}")       # tp >= 2^wy: a bit at or above wy
            m.d.comb += ts.eq(Mux(tp[wy:].any(), 1 << wy, tp))
            tr = Signal(cbits + 1, name=f"tround{j}{sfx}")
            m.d.comb += tr.eq(c + low)
            tn = Signal(cbits + 1, name=f"tneg{j}{sfx}")
            m.d.comb += tn.eq(tr >> dn)
            tps.append(ts)
            tns.append(tn)
        if self.sel_reg:
            r = stage(m, self.en, f"tsel{sfx}", tp=tps, tn=tns, pos=pos)
            tps, tns, pos = r["tp"], r["tn"], r["pos"]
        for j in range(len(cs_)):
            m.d.comb += th[j].eq(Mux(pos, tps[j], tns[j]))
