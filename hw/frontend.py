"""Front end: 16-bit float lanes -> sign-flipped block-floating-point mantissas.

Bit-exact with ``sim_models.bfp.to_block_fp`` (FORMAT.md 3.1-3.3).
Combinational (the top level registers its outputs), except for the optional
pipeline registers (``en`` advances them, ``i_valid`` -> ``o_valid`` rides
along): the cuts ``regs`` (:data:`FE_CUTS`: ``dec`` after the lane decode,
``emax`` after the exponent max tree (one register copy of the max per
:data:`hw.pipeline.REPLICA_LEAF_LANES` lanes; with ``tree_every``, the tree's last
register is in as many copies, each reduced to its own root that loads its own
``emax`` copy), ``shamt`` after the
per-lane shift amounts, ``align`` after the alignment shifter, before the rounding
increment) and ``tree_every`` = k, a register after every k levels of the max tree
(:func:`hw.trees.tree_cut_levels`). Each register holds the rest of the vector
(decoded lanes, partial maxima with the OR of their lanes' NaN / Inf flags).
Latency = len(regs) + :func:`tree_cuts`. The decoded lanes (exponent,
significand, sign) only wait while the max tree runs, :func:`lane_delay` stages;
with ``lane_ram`` > 0 and at least that many stages they wait in block RAM
(:func:`hw.pipeline.ram_delay`) instead of in every cut's register.

Per lane k (bits [16k, 16k+16) of ``bits``):

* NaN  -> +0, sets flag NaN; +-inf -> +-(largest finite), sets flag Inf.
* subnormals/zero: exponent field 0 is read as exponent 1, no hidden bit.
* ``emax`` = max of the (adjusted) exponents over all N lanes (a max tree).
* alignment: mag = round_half_away(sig * 2^-(emax - exp - (M - 2 - mant))),
  clamped to 2^(M-1) - 1; a negative shift is an exact left shift.
* sign flip D: the lane is negated when sign XOR mask[k] is 1, where the mask
  is the constant ``sim_models.sign_mask_int(N, seed)``.

Outputs ``x`` (N signed M-bit mantissas), ``u`` (signed exponent of one
mantissa unit, u = emax - bias - M + 2) and ``flags`` (bit0 NaN, bit1 Inf).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from sim_models.params import FormatParams
from sim_models.signs import sign_mask_int
from .pipeline import (REPLICA_LEAF_LANES, Cuts, beat_groups, beat_of, check_lane_ram,
                       check_lanes, check_tree_every, ram_delay, ram_depth, replica_count,
                       replica_of, replicas, stage)
from .trees import tree_cut_levels, tree_levels, tree_reduce


def u_range(p: FormatParams) -> tuple[int, int]:
    """(min, max) of the unit exponent u = emax - bias - M + 2 for ``p``."""
    e_bits, _, bias = p.in_format
    emax_hi = (1 << e_bits) - 2          # largest finite biased exponent
    return 1 - bias - p.mant_bits + 2, emax_hi - bias - p.mant_bits + 2


def u_shape(p: FormatParams) -> Shape:
    lo, hi = u_range(p)
    return Shape.cast(range(lo, hi + 1))


#: Pipeline cut points of :class:`FrontEnd`, in data-flow order: after the lane
#: decode (NaN / inf / subnormal, before the max tree), after the exponent max
#: tree, after the per-lane shift amounts (emax - exp), after the alignment
#: shifter (before rounding). Default: ``emax`` (for Fmax; hw/README.md).
FE_CUTS = Cuts("fe_regs", ("dec", "emax", "shamt", "align"), default=("emax",))


def tree_cuts(n: int, tree_every: int) -> int:
    """Registers inside the N-lane exponent max tree for ``tree_every``."""
    return len(tree_cut_levels(tree_levels(n), tree_every))


def lane_delay(p: FormatParams, regs, tree_every: int) -> int:
    """Register stages the decoded lanes wait between the ``dec`` cut (or the input)
    and the shift amounts: the max tree's registers and the ``emax`` cut."""
    regs = FE_CUTS.check(regs)
    return tree_cuts(p.n, tree_every) + ("emax" in regs)


def ram_lines(p: FormatParams, regs, tree_every: int, lane_ram: int) -> dict:
    """The front end's delay lines in block RAM for ``lane_ram``: name -> {stages,
    width, depth} (empty: none, the lanes wait in registers)."""
    d = lane_delay(p, regs, tree_every)
    if not check_lane_ram(lane_ram) or d < lane_ram:
        return {}
    e_bits, m_bits, _ = p.in_format
    return {"lanes": {"stages": d, "width": p.n * (e_bits + m_bits + 2), "depth": ram_depth(d)}}


class FrontEnd(wiring.Component):
    """Front end (see module docstring).

    Args:
        p: format parameters.
        regs: pipeline cuts, a subset of :data:`FE_CUTS` (default none: combinational).
        tree_every: a register after every k levels of the max tree (0: none).
        lane_ram: 0 (default: the lanes wait in the cuts' registers) or the minimum
            :func:`lane_delay` that puts them into a block RAM delay line (:func:`ram_lines`).

        lanes: W, lanes per cycle (None: N; N/2: :func:`hw.pipeline.check_lanes`). With
            W = N/2 the ``beat`` input (0 or 1; :func:`hw.pipeline.beat_groups` equal copies,
            each read by its lane group) picks lanes [0, W) or [W, N) of ``bits``
            (the whole vector, held for both beats); ``emax`` and ``flags`` are the
            vector's, from all N lanes. The ``dec`` register holds all N decoded
            lanes and the beat's lanes are selected after it (the select is off the
            decode's path).

    Ports: ``bits`` (N x 16), ``en``, ``i_valid`` [, ``beat``] in; ``x`` (W signed M-bit),
    ``u``, ``flags`` (bit0 NaN, bit1 Inf), ``o_valid`` out.
    """

    def __init__(self, p: FormatParams, regs=(), tree_every: int = 0, lane_ram: int = 0,
                 lanes: int | None = None):
        self.p = p
        self.regs = FE_CUTS.check(regs)
        self.tree_every = check_tree_every(tree_every)
        self.lane_ram = check_lane_ram(lane_ram)
        self.lanes = check_lanes(p, lanes)
        if self.lane_ram and self.lanes != p.n:
            raise ValueError(f"lane_ram (block RAM lane delay) needs lanes=N={p.n}, "
                             f"got lanes={self.lanes}")
        self.mask = sign_mask_int(p.n, p.sign_seed)
        ports = {
            "bits": In(p.n * 16),
            "en": In(1),
            "i_valid": In(1),
            "x": Out(data.ArrayLayout(signed(p.mant_bits), self.lanes)),
            "u": Out(u_shape(p)),
            "flags": Out(2),
            "o_valid": Out(1),
        }
        if self.lanes != p.n:       # the beat index, one copy per lane group
            ports["beat"] = In(beat_groups(self.lanes))
        super().__init__(ports)

    @property
    def latency(self) -> int:
        """Register stages inside the front end."""
        return len(self.regs) + tree_cuts(self.p.n, self.tree_every)

    def elaborate(self, platform):
        m = Module()
        p = self.p
        e_bits, m_bits, bias = p.in_format
        e_special = (1 << e_bits) - 1
        M = p.mant_bits
        lim = (1 << (M - 1)) - 1
        off = m_bits + 2 - M                 # shift = (emax - exp) + off
        pre = max(-off, 0)                   # exact left pre-shift of the significand
        post = max(off, 0)                   # constant part of the right shift
        wsp = m_bits + 1 + pre               # width of the pre-shifted significand

        exps, sigs, signs, nans, infs = [], [], [], [], []
        for k in range(p.n):
            w = self.bits.word_select(k, 16)
            sign, exp, frac = w[15], w[m_bits:m_bits + e_bits], w[:m_bits]
            is_nan = Signal(name=f"nan{k}")
            is_inf = Signal(name=f"inf{k}")
            m.d.comb += [is_nan.eq((exp == e_special) & (frac != 0)),
                         is_inf.eq((exp == e_special) & (frac == 0))]
            e_eff = Signal(e_bits, name=f"exp{k}")
            sig = Signal(m_bits + 1, name=f"sig{k}")
            sgn = Signal(name=f"sign{k}")
            with m.If(is_nan):
                m.d.comb += [e_eff.eq(1), sig.eq(0), sgn.eq(0)]
            with m.Elif(is_inf):
                m.d.comb += [e_eff.eq(e_special - 1), sig.eq((1 << (m_bits + 1)) - 1),
                             sgn.eq(sign)]
            with m.Elif(exp == 0):
                m.d.comb += [e_eff.eq(1), sig.eq(frac), sgn.eq(sign)]
            with m.Else():
                m.d.comb += [e_eff.eq(exp), sig.eq(Cat(frac, 1)), sgn.eq(sign)]
            exps.append(e_eff)
            sigs.append(sig)
            signs.append(sgn)
            nans.append(is_nan)
            infs.append(is_inf)

        # the vector in flight; every register stage holds all of it
        w = self.lanes
        # the NaN / Inf flags of a lane ride with its exponent through the max tree (OR at
        # every node), so their N-lane OR is pipelined by the tree's registers
        vec = {"exp": exps, "sig": sigs, "sign": signs,
               "tflag": [Cat(a, b) for a, b in zip(nans, infs)], "valid": self.i_valid}
        if w != p.n:
            vec["beat"] = self.beat

        def cut(name: str, **more) -> None:
            vec.update(more)
            vec.update(stage(m, self.en, name, **vec))

        if "dec" in self.regs:      # all N decoded lanes (two beats: the select after it)
            cut("dec")
            exps = vec["exp"]
        if w != p.n:        # two beats: the max tree sees all N lanes, the rest the beat's W
            vec.update({k: [Mux(beat_of(vec["beat"], i, w), v[w + i], v[i]) for i in range(w)]
                        for k, v in ((k, vec[k]) for k in ("exp", "sig", "sign"))})
        lines = ram_lines(p, self.regs, self.tree_every, self.lane_ram)
        if lines:            # the lanes wait in block RAM, beside the max tree
            late = ram_delay(m, self.en, "lanes", Cat(*vec.pop("exp"), *vec.pop("sig"),
                                                      *vec.pop("sign")), lines["lanes"]["stages"])
            lw = [e_bits] * p.n + [m_bits + 1] * p.n + [1] * p.n
            at = [sum(lw[:i]) for i in range(len(lw))]
            parts = [late[a:a + w] for a, w in zip(at, lw)]

        # with the emax cut in copies, the tree's last register holds the partial maxima in
        # as many copies and each copy reduces its own to its root, which loads its own
        # emax copy (docs/DECISIONS.md, "Register replicas")
        ncopy = replica_count(w, REPLICA_LEAF_LANES) if "emax" in self.regs else 1
        last_cut = tree_cuts(p.n, self.tree_every) - 1
        part_copies = []

        def tree_cut(parts: list) -> list:
            c = tree_cut.count
            tree_cut.count += 1
            if c < last_cut or ncopy == 1:
                cut(f"emaxt{c}", part=parts)
                return vec.pop("part")
            cut(f"emaxt{c}")
            regs = [replicas(m, self.en, f"emaxt{c}_part{i}", v, ncopy)
                    for i, v in enumerate(parts)]
            part_copies.extend([r[k] for r in regs] for k in range(ncopy))
            return part_copies[0]
        tree_cut.count = 0

        def max_or(a, b):   # (exponent, flags): the larger exponent, the OR of the flags
            return Cat(Mux(a[:e_bits] > b[:e_bits], a[:e_bits], b[:e_bits]),
                       a[e_bits:] | b[e_bits:])

        root = tree_reduce(m, [Cat(e, f) for e, f in zip(exps, vec.pop("tflag"))], max_or,
                           "emax", every=self.tree_every, cut=tree_cut)
        vec["emax"], vec["flags"] = root[:e_bits], root[e_bits:]
        # the clamp test d > wsp + 1 as the sign of a second subtraction beside d:
        # d > wsp + 1  <=>  emax - (exp + wsp + 2 - post) >= 0. The constant goes to the
        # lanes (expc), off the max tree's last segment: beside the tree root from the
        # lanes' register, or after the cut where the lanes leave their block RAM.
        clamp = wsp + 2 - post

        def lane_clamps():
            vec["expc"] = []
            for k, e in enumerate(vec["exp"]):
                c = Signal(range(min(clamp, 0), (1 << e_bits) + max(clamp, 0)), name=f"expc{k}")
                m.d.comb += c.eq(e + clamp)
                vec["expc"].append(c)

        if not lines:
            lane_clamps()
        if "emax" in self.regs:     # the max exponent in one register copy per lane group
            roots = [vec.pop("emax")]
            roots += [tree_reduce(m, parts, max_or, f"emax_c{k}")[:e_bits]
                      for k, parts in enumerate(part_copies[1:], start=1)]
            cut("emax")
            emaxs = replicas(m, self.en, "emax_emax", roots if part_copies else roots[0],
                             replica_count(w, REPLICA_LEAF_LANES))
            vec["emax"] = emaxs[0]
        else:
            emaxs = [vec["emax"]]
        if lines:
            vec.update(exp=parts[:p.n], sig=parts[p.n:2 * p.n], sign=parts[2 * p.n:])
            lane_clamps()

        # right shift amount of the pre-shifted significand; >= wsp + 1 gives 0
        shs = []
        for k in range(w):
            sh = Signal(range(wsp + 2), name=f"sh{k}")
            d = Signal(range(-(1 << e_bits), (1 << e_bits) + post), name=f"shd{k}")
            emax = replica_of(emaxs, k, w)
            m.d.comb += d.eq(emax - vec["exp"][k] + post)
            t = Signal(range(-(1 << e_bits) - max(clamp, 0), (1 << e_bits) - min(clamp, 0)),
                       name=f"shc{k}")
            m.d.comb += t.eq(emax - vec["expc"][k])
            m.d.comb += sh.eq(Mux(t[-1], d, wsp + 1))
            shs.append(sh)
        del vec["exp"], vec["expc"]
        if "shamt" in self.regs:
            cut("shamt", sh=shs)
            shs = vec.pop("sh")
        # round half away from zero: ((sig_p >> (sh-1)) + 1) >> 1 for sh >= 1
        halves, rnds = [], []
        for k in range(w):
            sig_p = Signal(wsp, name=f"sigp{k}")
            m.d.comb += sig_p.eq(vec["sig"][k] << pre)
            v = Signal(wsp + 1, name=f"half{k}")
            m.d.comb += v.eq(Cat(Const(0, 1), sig_p) >> shs[k])
            halves.append(v)
            rnds.append(shs[k] != 0)
        del vec["sig"]
        rnd = Cat(*rnds)
        if "align" in self.regs:
            cut("align", half=halves, rnd=rnd)
            halves, rnd = vec.pop("half"), vec.pop("rnd")
        m.d.comb += [
            self.u.eq(vec["emax"] - (bias + M - 2)),
            self.flags.eq(vec["flags"]),
            self.o_valid.eq(vec["valid"]),
        ]
        # rounding, clamp and sign in one M-bit carry chain: mag = hi + c with
        # hi = half >> 1, c = half[0] & rnd; +-mag = (hi ^ s) + (c ^ s) mod 2^M for the
        # sign s (-mag = ~hi + 1 - c), exact while mag <= lim. The clamp test
        # mag > lim (hi >= 2^(M-1), or hi = lim and c) runs beside the chain, on hi.
        signs = vec["sign"]
        for k in range(w):
            d_lo = (self.mask >> k) & 1
            if w == p.n:
                neg = signs[k] ^ d_lo
            else:           # D of lane k of beat 0 or of lane w + k of beat 1
                d_hi = (self.mask >> (w + k)) & 1
                neg = signs[k] ^ Mux(beat_of(vec["beat"], k, w), d_hi, d_lo)
            s = Signal(name=f"neg{k}")
            m.d.comb += s.eq(neg)
            hi = Signal(max(wsp, M), name=f"hi{k}")
            m.d.comb += hi.eq(halves[k][1:])
            c = halves[k][0] & rnd[k]
            sx = Signal(M, name=f"sx{k}")
            m.d.comb += sx.eq((hi[:M] ^ s.replicate(M)) + (c ^ s))
            over = Signal(name=f"over{k}")
            m.d.comb += over.eq(hi[M - 1:].any() | (hi[:M - 1].all() & c))
            m.d.comb += self.x[k].eq(Mux(over, Mux(s, -lim, lim), sx.as_signed()))
        return m
