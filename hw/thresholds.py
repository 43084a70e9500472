"""Per-block code thresholds: :class:`Thresholds`.

The golden rule (``sim_models.quant``, docs/FORMAT.md 3.7) counts j in 1..h-1 with |y| 2^u
2^f >= a_j scale, a_j = 2j-1, f = 1 (midtread) or a_j = j, f = 0 (midrise),
i.e. |y| >= T_j = ceil(a_j sig 2^(exp-u-f)). T_j is computed once per block by
a clamped shift (saturated to 2^W_y, "never", when it exceeds every |y|); each
lane then needs h-1 magnitude compares (in :mod:`hw.quantizer`).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, unsigned
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
            them (docs/DECISIONS.md, "Register replicas"); without, every copy is the same
            logic.

    Ports: ``byte``, ``u`` in; ``th`` (copies x len(coefs) x (y_width+1) bits) out.
    Combinational, or with registers advanced by ``en`` (In): ``diff_reg`` after the
    exponent differences d = e - off - u and -d (two carry chains), ``pipelined`` after
    the shift amounts, the products ``a_j sig``, their left shift by dp mod 4 and the
    saturation test (a bit at or above y_width), before the rest of the shifts (by
    4 (dp div 4) left, by dn right), ``sel_reg`` after those shifts (in each copy),
    before the select by the sign of d.
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
        # the saturation test c_j 2^dp >= 2^wy (c_j = a_j sig, dp = clamp(d, 0, wy)) is
        # d > k_j = wy - bitlen(c_j) (c_j != 0; k_j = max of d: never): k_j a constant row
        # per sig, computed (and registered) beside d so that the test is one compare
        _, dhi = shape_bounds(d.shape())
        ks = []
        for j, aj in enumerate(self.coefs, start=1):
            k = Signal(range(-1, max(dhi, wy) + 1), name=f"tover_k{j}")
            with m.Switch(sig):
                for s_ in range(1 << (mb + 1)):
                    with m.Case(s_):
                        m.d.comb += k.eq(wy - (aj * s_).bit_length() if s_ else dhi)
            ks.append(k)
        if self.diff_reg:
            st = stage(m, self.en, "tsd", d=d, nd=nd, sig=sig, k=ks)
            d, nd, sig, ks = st["d"], st["nd"], st["sig"], st["k"]
        dneg = d[-1]
        dp = Signal(range(wy + 1))
        m.d.comb += dp.eq(Mux(dneg, 0, Mux(gt_const(d, wy), wy, d)))
        dn = Signal(range(cbits + 1))
        m.d.comb += dn.eq(Mux(~dneg, 0, Mux(gt_const(nd, cbits), cbits, nd)))
        cs_, cls, sats = [], [], []
        for j, aj in enumerate(self.coefs, start=1):
            c = Signal(cbits, name=f"c{j}")
            m.d.comb += c.eq(sig * aj)
            cs_.append(c)
            # the left shift in two steps: by dp's two low bits here, by 4 x the rest after
            # the register; the saturation test here as well
            cl = Signal(cbits + 3, name=f"cl{j}")
            m.d.comb += cl.eq(c << dp[:2])
            sat = Signal(name=f"tover{j}")
            m.d.comb += sat.eq(d > ks[j - 1])
            cls.append(cl)
            sats.append(sat)
        pos = Signal(name="d_pos")
        m.d.comb += pos.eq(~dneg)
        # ceil(c / 2^dn) = (c + 2^dn - 1) >> dn; the mask 2^dn - 1 as logic from dn
        low = Signal(cbits, name="dn_mask")
        m.d.comb += low.eq(Cat(*(gt_const(dn, i) for i in range(cbits))))
        parts = [*cs_, *cls, Cat(*sats), dp[2:], dn, low, pos]
        if not self.pipelined:
            self._shifts(m, "", *self._unpack(parts), self.th[0])
            for k in range(1, self.copies):
                m.d.comb += self.th[k].eq(self.th[0])
            return m
        for k, r in enumerate(replicas(m, self.en, "tsh", Cat(*parts), self.copies)):
            lo, regs = 0, []
            for v in parts:
                regs.append(r[lo:lo + len(v)])
                lo += len(v)
            self._shifts(m, f"_{k}" if self.copies > 1 else "", *self._unpack(regs),
                         self.th[k])
        return m

    def _unpack(self, parts: list) -> tuple:
        """``parts`` ([c_j..., cl_j..., sat bits, dp >> 2, dn, low, pos]) as the
        arguments of :meth:`_shifts`."""
        nc = len(self.coefs)
        return (parts[:nc], parts[nc:2 * nc], parts[2 * nc], *parts[2 * nc + 1:])

    def _shifts(self, m: Module, sfx: str, cs_, cls, sats, dph, dn, low, pos, th) -> None:
        """The thresholds ``th`` (one copy) from the products ``a_j sig`` (``cs_``), the
        products shifted left by dp mod 4 (``cls``), their saturation bits ``sats``,
        dp // 4 (``dph``), the right shift ``dn``, its rounding mask ``low`` and ``pos``
        (d >= 0)."""
        wy = self.y_width
        tps, tns = [], []
        for j, (c, cl) in enumerate(zip(cs_, cls), start=1):
            tp = Signal(wy, name=f"tpos{j}{sfx}")
            m.d.comb += tp.eq(cl << Cat(Const(0, 2), dph))
            ts = Signal(wy + 1, name=f"tsat{j}{sfx}")       # saturated: 2^wy alone
            m.d.comb += ts.eq(Cat(tp & ~sats[j - 1].replicate(wy), sats[j - 1]))
            tr = Signal(len(c) + 1, name=f"tround{j}{sfx}")
            m.d.comb += tr.eq(c + low)
            tn = Signal(len(c) + 1, name=f"tneg{j}{sfx}")
            m.d.comb += tn.eq(tr >> dn)
            tps.append(ts)
            tns.append(tn)
        if self.sel_reg:
            r = stage(m, self.en, f"tsel{sfx}", tp=tps, tn=tns, pos=pos)
            tps, tns, pos = r["tp"], r["tn"], r["pos"]
        for j in range(len(cs_)):
            m.d.comb += th[j].eq(Mux(pos, tps[j], tns[j]))
