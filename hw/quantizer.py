"""Block quantizer pipeline: one scale byte per block of G lanes, then b-bit codes.

Bit-exact with the golden model (``sim_models.scale.choose_scale_bytes``
+ ``sim_models.quant.quantize``), without dividers. Rules: docs/FORMAT.md
3.7; the scale byte is chosen by :class:`hw.scale_select.ScaleSelect`, the
code thresholds come from :class:`hw.thresholds.Thresholds`.

Steps: |y| + block statistic tree (max |y|; sum |y| for absmean; for mode
asym max(y, 0) and max(-y, 0), whose sum is the range hi - lo) -> times the
odd part of scale_mult -> scale select -> thresholds -> lane compares. Code:
midtread c = sign(y) m (ties away from zero); midrise and lloydmax c = m if y
>= 0 else -1-m (y = 0 -> c = 0); asym c = clip(z + sign(y) m, 0, Q) with the
zero point z = #{j : -lo >= T_j} (round half up; the ``zeros`` output, one
byte per block), m = #{j : |y| >= T_j}.

Optional registers (``regs``, names in :data:`QUANT_CUTS`): ``maxhalf`` in
the middle of the statistic tree, ``max`` after it, ``norm`` inside the scale
select, ``scale`` after it, ``thr`` after the thresholds (one register copy per
:data:`hw.pipeline.REPLICA_LEAF_LANES` lanes of a block), ``code`` after the lane
compares (the b-bit codes, not the lanes' |y|); ``tree_every`` = k
adds a register after every k levels of each half of the statistic tree. Every
register carries the rest of the vector (:class:`_Vector`) and advances with
``en``. The outputs are combinational from the last register (the top level
registers them again). Latency = len(regs) + :func:`tree_cuts` cycles.

The lanes (|y| and the sign, N (M + log2 N) bits) only wait while the block
scale and thresholds are computed, :func:`lane_delay` stages; with ``lane_ram``
> 0 and at least that many stages they wait in block RAM
(:func:`hw.pipeline.ram_delay`) instead of in every cut's register.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from amaranth.hdl import Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from sim_models.params import FormatParams
from sim_models.quant import threshold_coefs

from .frontend import u_shape
from .pipeline import (REPLICA_LEAF_LANES, Cuts, check_lane_ram, check_lanes, check_tree_every,
                       ram_delay, ram_depth, replica_count, replica_of, replicas, stage)
from .scale_select import SELECT_CUTS, ScaleSelect, rule_units
from .thresholds import Thresholds
from .trees import reduce_level, sum_level, tree_cut_levels, tree_levels

#: Register cut points of :class:`Quantizer`, in data-flow order: after |y|, in
#: the middle of the block statistic tree (after floor(log2(G)/2) levels), after
#: the tree, inside the scale select (:data:`hw.scale_select.SELECT_CUTS`: after the
#: leading one, after the normalization shifter, after the normalization, after the
#: exponent arithmetic), after the scale select, inside the thresholds (after the
#: exponent differences, after the shift amounts, after the shifts), after the
#: thresholds, after the lane compares (the codes, scale bytes and flags). Default:
#: maxhalf, max, norm, scale, thr (hw/README.md).
QUANT_CUTS = Cuts("quant_regs", ("abs", "maxhalf", "max", "lead", "nshift", "norm", "sexp",
                                 "scale", "tsd", "tsh", "tsel", "thr", "code"),
                  default=("maxhalf", "max", "norm", "scale", "thr"))


def _split(copies: list, like: list) -> list:
    """Each register of ``copies`` (a Cat of the Values of ``like``) cut back into
    Values of their widths: a list per copy."""
    out = []
    for r in copies:
        parts, lo = [], 0
        for v in like:
            w = len(Value.cast(v))
            parts.append(r[lo:lo + w].as_signed() if Value.cast(v).shape().signed else r[lo:lo + w])
            lo += w
        out.append(parts)
    return out


def tree_cuts(p: FormatParams, tree_every: int) -> int:
    """Registers inside the block statistic trees for ``tree_every`` (counted in each
    half: the ``floor(log2(G)/2)`` levels before the ``maxhalf`` cut and the rest)."""
    half = (p.block.bit_length() - 1) // 2
    rest = p.block.bit_length() - 1 - half
    return len(tree_cut_levels(half, tree_every)) + len(tree_cut_levels(rest, tree_every))


def lane_delay(p: FormatParams, regs, tree_every: int) -> int:
    """Register stages the lanes (|y|, sign) wait between the ``abs`` cut (or the
    input) and the lane compares: every quantizer register but ``abs`` and ``code``."""
    regs = QUANT_CUTS.check(regs)
    return len(regs) - ("abs" in regs) - ("code" in regs) + tree_cuts(p, tree_every)


def ram_lines(p: FormatParams, regs, tree_every: int, lane_ram: int) -> dict:
    """The quantizer's delay lines in block RAM for ``lane_ram``: name -> {stages,
    width, depth} (empty: none, the lanes wait in registers)."""
    d = lane_delay(p, regs, tree_every)
    if not check_lane_ram(lane_ram) or d < lane_ram:
        return {}
    return {"lanes": {"stages": d, "width": p.n * p.fwht_width, "depth": ram_depth(d)}}


@dataclass
class _Vector:
    """The vector in flight between two quantizer cuts; ``None``: not carried there.

    Lists are per lane (``mags``) or per block (the others; ``partial``: tree
    name -> per block a list of partial tree results). The thresholds are not carried:
    their cut ``thr`` is the last before the compares and has register copies of its own.
    """

    valid: Value
    u: Value | None
    flags: Value                # NaN, Inf (+ SAT after the scale select)
    neg: Value | None           # N bits: y < 0 (None: in the lane RAM)
    mags: list | None           # |y|
    partial: dict | None = None
    stat: list | None = None    # the scale statistic A (times mult_odd)
    nlo: list | None = None     # mode asym: -lo, for the zero point
    scales: list | None = None

    def cut(self, m: Module, en, name: str, regs: tuple) -> "_Vector":
        """The vector after cut ``name``: registered (:func:`hw.pipeline.stage`) if
        ``name`` is in ``regs``, else unchanged."""
        if name not in regs:
            return self
        flat = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "partial" and v is not None:
                flat.update({f"p{t}{b}_": parts for t, blocks in v.items()
                             for b, parts in enumerate(blocks)})
            elif v is not None:
                flat[f.name] = v
        r = stage(m, en, name, **flat)
        out = {f.name: r.get(f.name) for f in fields(self)}
        if self.partial is not None:
            out["partial"] = {t: [r[f"p{t}{b}_"] for b in range(len(blocks))]
                              for t, blocks in self.partial.items()}
        return _Vector(**out)


class Quantizer(wiring.Component):
    """Pipelined block quantizer (see module docstring).

    Args:
        p: format parameters (mode, bits, block, scale, scale_rule, scale_mult,
            scale_round; the input lanes are ``p.fwht_width`` bits signed).
        regs: register cut points, a subset of :data:`QUANT_CUTS`.
        tree_every: a register after every k levels of the block statistic trees
            (0: none; in each half of the tree, see :func:`tree_cuts`).
            Latency = len(regs) + :func:`tree_cuts`.
        lane_ram: 0 (default: the lanes wait in the cuts' registers) or the minimum
            :func:`lane_delay` that puts them into a block RAM delay line
            (:func:`ram_lines`); same cycles and bytes either way.
        lanes: W, lanes per cycle (None: N; N/2: one beat of a two-beat vector, W/G
            blocks; :func:`hw.pipeline.check_lanes`). Every block is quantized on its own,
            so a beat needs nothing from the other.

    Ports: ``en`` (advance the registers), ``i_valid``, ``y``, ``u``, ``flags_i``
    (NaN, Inf) in; ``o_valid``, ``codes``, ``scales``, ``flags`` (NaN, Inf, SAT)
    out, combinational from the last register (or the inputs when ``regs`` is
    empty); mode asym adds ``zeros`` (one zero-point byte per block).

    Raises:
        ValueError: a format option not built here, or a bad ``regs`` (the message names it).
    """

    def __init__(self, p: FormatParams, regs=QUANT_CUTS.default, tree_every: int = 0,
                 lane_ram: int = 0, lanes: int | None = None):
        self.lanes = check_lanes(p, lanes)
        if lane_ram and self.lanes != p.n:
            raise ValueError(f"lane_ram (block RAM lane delay) needs lanes=N={p.n}, "
                             f"got lanes={self.lanes}")
        _, _, self.mult_odd = rule_units(p)
        self.coefs, _ = threshold_coefs(p.mode, p.bits)
        self.p = p
        self.regs = QUANT_CUTS.check(regs)
        self.tree_every = check_tree_every(tree_every)
        self.lane_ram = check_lane_ram(lane_ram)
        self.u_shape = u_shape(p)
        self.y_width = p.fwht_width - 1   # |y| < 2^(M-1+log2 N)
        ports = {
            "en": In(1),
            "i_valid": In(1),
            "y": In(data.ArrayLayout(signed(p.fwht_width), self.lanes)),
            "u": In(self.u_shape),
            "flags_i": In(2),
            "o_valid": Out(1),
            "codes": Out(data.ArrayLayout(signed(p.bits), self.lanes)),
            "scales": Out(data.ArrayLayout(8, self.lanes // p.block)),
            "flags": Out(3),
        }
        if p.mode == "asym":
            ports["zeros"] = Out(data.ArrayLayout(8, self.lanes // p.block))
        super().__init__(ports)

    @property
    def latency(self) -> int:
        """Register stages inside the quantizer."""
        return len(self.regs) + tree_cuts(self.p, self.tree_every)

    def elaborate(self, platform):
        m = Module()
        p = self.p
        n, g, wy = self.lanes, p.block, self.y_width
        nb = n // g
        asym = p.mode == "asym"

        def cut(vec: _Vector, name: str) -> _Vector:
            return vec.cut(m, self.en, name, self.regs)

        # ---- |y|, block statistic ---------------------------------------------------
        mags, negs = [], Signal(n, name="neg")
        for i in range(n):
            yv = self.y[i]
            mag = Signal(wy, name=f"abs{i}")
            m.d.comb += mag.eq(Mux(yv < 0, -yv, yv))
            mags.append(mag)
            m.d.comb += negs[i].eq(yv < 0)

        def vmax(a, b):
            return Mux(a > b, a, b)

        def forest(vec: _Vector, trees: dict, names: dict, tag: str):
            """Reduce every tree of ``trees`` (tree name -> list of item lists) level by
            level; a register after the levels of ``tree_cut_levels`` (``tree_every``)."""
            levels = tree_levels(len(next(iter(trees.values()))[0]))
            after = tree_cut_levels(levels, self.tree_every)
            for lv in range(levels):
                trees = {t: [sum_level(m, items, names[t][j], lv) if t == "sum" else
                             reduce_level(m, items, vmax, names[t][j], lv)
                             for j, items in enumerate(tt)] for t, tt in trees.items()}
                if lv + 1 in after:
                    vec = replace(vec, partial=trees).cut(m, self.en, f"{tag}{lv + 1}",
                                                          (f"{tag}{lv + 1}",))
                    trees = vec.partial
            return replace(vec, partial=None), {t: [tr[0] for tr in tt] for t, tt in trees.items()}

        vec = cut(_Vector(valid=self.i_valid, u=self.u, flags=self.flags_i, neg=negs, mags=mags),
                  "abs")
        negs, mags = vec.neg, vec.mags
        lines = ram_lines(p, self.regs, self.tree_every, self.lane_ram)
        if lines:            # the lanes wait in block RAM, beside the cuts
            late = ram_delay(m, self.en, "lanes", Cat(negs, *mags), lines["lanes"]["stages"])
            late_neg, late_mags = late[:n], [late[n + i * wy:n + (i + 1) * wy] for i in range(n)]
            vec = replace(vec, neg=None, mags=None)
        # trees: of |y| (symmetric modes); asym: of max(y, 0) ("hi") and of
        # max(-y, 0) ("nlo" = -lo), whose sum is the block range hi - lo
        if asym:
            trees = {"hi": [Mux(negs[i], 0, mags[i]) for i in range(n)],
                     "nlo": [Mux(negs[i], mags[i], 0) for i in range(n)]}
        elif p.scale_rule == "absmean":
            trees = {"sum": mags}
        else:
            trees = {"max": mags}
        half = (g.bit_length() - 1) // 2         # tree levels before the "maxhalf" cut
        per = g >> half
        lows, names = {}, {}
        for t, items in trees.items():
            if asym:
                items = [Signal(wy, name=f"{t}{i}") for i in range(n)]
                m.d.comb += [d.eq(v) for d, v in zip(items, trees[t])]
            lows[t] = [items[b * g + (i << half):b * g + ((i + 1) << half)]
                       for b in range(nb) for i in range(per)]
            names[t] = [f"b{t}{b}_{i}" for b in range(nb) for i in range(per)]
        vec, res = forest(vec, lows, names, "tlo")
        vec = cut(replace(vec, partial={t: [r[b * per:(b + 1) * per] for b in range(nb)]
                                        for t, r in res.items()}), "maxhalf")
        vec, tops = forest(vec, vec.partial, {t: [f"b{t}{b}" for b in range(nb)] for t in trees},
                           "thi")
        if asym:
            stat = []
            for b in range(nb):
                rng_ = Signal(wy + 1, name=f"range{b}")
                m.d.comb += rng_.eq(tops["hi"][b] + tops["nlo"][b])
                stat.append(rng_)
        else:
            stat = tops[next(iter(trees))]
        if self.mult_odd != 1:       # the statistic times the odd part of scale_mult
            for b in range(nb):
                x = Signal(len(stat[b]) + self.mult_odd.bit_length(), name=f"stat{b}")
                m.d.comb += x.eq(stat[b] * self.mult_odd)
                stat[b] = x
        vec = cut(replace(vec, stat=stat, nlo=tops["nlo"] if asym else None), "max")

        # ---- scale select -------------------------------------------------------------
        bytes_, sats = [], []
        for b in range(nb):
            sel = ScaleSelect(p, len(vec.stat[b]), self.u_shape, pipelined="norm" in self.regs,
                              regs=[r for r in SELECT_CUTS if r != "norm" and r in self.regs])
            m.submodules[f"scale{b}"] = sel
            m.d.comb += [sel.a.eq(vec.stat[b]), sel.u.eq(vec.u), sel.en.eq(self.en)]
            bytes_.append(sel.byte)
            sats.append(sel.sat)
        vec = replace(vec, stat=None)      # the rest, in step with ScaleSelect
        for r in SELECT_CUTS:
            vec = cut(vec, r)
        flags = Signal(3, name="qflags")
        m.d.comb += flags.eq(Cat(vec.flags, Cat(*sats).any()))
        vec = cut(replace(vec, flags=flags, scales=bytes_), "scale")

        # ---- thresholds ---------------------------------------------------------------
        nth = len(self.coefs)
        copies = replica_count(g)
        ths = []       # per block: the nth thresholds of each lane group's copy
        for b in range(nb):
            th = Thresholds(p, wy, self.u_shape, pipelined="tsh" in self.regs,
                            diff_reg="tsd" in self.regs, sel_reg="tsel" in self.regs,
                            copies=copies if "tsh" in self.regs else 1)
            m.submodules[f"thr{b}"] = th
            m.d.comb += [th.byte.eq(vec.scales[b]), th.u.eq(vec.u)]
            if {"tsd", "tsh", "tsel"} & set(self.regs):
                m.d.comb += th.en.eq(self.en)
            ths.append([[th.th[k % th.copies][j] for j in range(nth)] for k in range(copies)])
        vec = replace(vec, u=None)
        for r in ("tsd", "tsh", "tsel"):     # in step with Thresholds
            vec = cut(vec, r)
        if "thr" in self.regs:     # the thresholds in one register copy per leaf group
            vec = cut(vec, "thr")
            leaves = replica_count(g, REPLICA_LEAF_LANES)
            ths = [_split(replicas(m, self.en, f"thr_th{b}", [Cat(*t) for t in tb], leaves),
                          tb[0]) for b, tb in enumerate(ths)]
        if not lines:
            late_neg, late_mags = vec.neg, vec.mags

        # ---- lane compares ------------------------------------------------------------
        codes, zeros = [], []
        for b in range(nb):
            if asym:       # zero point z = round(-lo / scale), ties up (Q thresholds)
                zp = Signal(range(nth + 1), name=f"zero{b}")
                m.d.comb += zp.eq(sum(vec.nlo[b] >= ths[b][0][j] for j in range(nth)))
                zeros.append(zp)
            for i in range(b * g, (b + 1) * g):
                cnt = Signal(range(nth + 1), name=f"cnt{i}")
                th = replica_of(ths[b], i - b * g, g)
                m.d.comb += cnt.eq(sum(late_mags[i] >= th[j] for j in range(nth)))
                neg = late_neg[i]
                code = Signal(signed(p.bits), name=f"code{i}")
                if p.mode == "midtread":
                    m.d.comb += code.eq(Mux(neg, -cnt, cnt))
                elif asym:
                    v = Signal(range(-nth, 2 * nth + 1), name=f"zr{i}")
                    m.d.comb += v.eq(zp + Mux(neg, -cnt, cnt))
                    m.d.comb += code.eq(Mux(v < 0, 0, Mux(v > nth, nth, v)))
                else:
                    m.d.comb += code.eq(Mux(neg, -1 - cnt, cnt))
                codes.append(code)
        out = {"valid": vec.valid, "flags": vec.flags, "scales": vec.scales, "codes": codes}
        if asym:
            out["zeros"] = zeros
        if "code" in self.regs:
            out = stage(m, self.en, "code", **out)
        m.d.comb += [self.o_valid.eq(out["valid"]), self.flags.eq(out["flags"])]
        m.d.comb += [self.codes[i].eq(c) for i, c in enumerate(out["codes"])]
        m.d.comb += [self.scales[b].eq(s) for b, s in enumerate(out["scales"])]
        if asym:
            m.d.comb += [self.zeros[b].eq(z) for b, z in enumerate(out["zeros"])]
        return m
