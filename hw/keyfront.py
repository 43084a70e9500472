"""Key front end of the cache policy: ``KeyFrontEnd``, before the sign flip of the encoder.

Bit-exact with :func:`sim_models.keyscale.key_front` (fp16): per lane
``x' = RNE(RN16(x * 2^e) - mu_s)``, saturating to +-65504, NaN/inf lanes of x passed
through; ``mu_s = RN16(mu * 2^e)`` (fp16 bits) and ``e`` (5-bit two's complement, in
``LOG2_S_RANGE``) come from a table of ``slots`` slots x N lanes (one slot per (layer, kv
head) served), computed once in software (:func:`sim_models.keyscale.front_table`).

Table and config port: a memory of ``slots`` rows, each N lanes of (mu_s, e), written one
lane per ``cfg`` word (``sim_models.wire.key_config``: mu_s | e | lane | slot; ``cfg.ready``
is always 1) and read synchronously, non-transparent, at the slot of the vector the input
accepts. So a lane written in cycle t is seen by every vector accepted in a later cycle
and by none accepted in cycle t or before: a table load (N words) takes effect lane by
lane, for the vectors accepted after its last word; vectors of other slots stream
undisturbed meanwhile. The memory starts as all zero (mu_s = +0, e = 0: the identity).

Side band (per vector): ``slot`` and ``bypass``; ``bypass`` = 1 or a slot >= ``slots``
passes the lanes unchanged (values, keys without the policy).

Per lane, in steps with optional register cuts between them (:data:`KF_CUTS`):

0. decode (the input cycle, before the table read register): x's significand normalised
   by its leading-zero count (subnormal x), ``base = max(E, 1) - lz`` and ``1 - base``.
1. scale: ``x 2^e``: ``E2 = base + e``; ``E2 >= 31`` saturates to 0x7BFF,
   ``1 <= E2 <= 30`` is exact, ``E2 <= 0`` shifts the significand right by ``1 - E2``
   (``[shift]``) with round to nearest even (guard, sticky) into the subnormals (a carry
   gives the smallest normal by itself) (``[scale]``); +-0 keeps its sign. The scaled
   value stays unpacked (significand with hidden bit, effective exponent) for step 2.
   Lanes to pass (NaN/inf, bypass) keep x, which rides along to the output.
2. align: ``y - mu_s`` as ``y + (-mu_s)``: the operands ordered by magnitude (the larger
   sets the sign; ``[swap]``), the smaller significand shifted right by the exponent
   difference with 3 guard bits (guard, round, sticky ORed into the last; ``[align]``).
3. add (``[sum]``): one 15-bit adder (the subtrahend inverted, carry in); normalise: the
   leading-zero count of the 15-bit sum, its carry bit included (``[count]``), limited to
   reach exponent 1 (subnormal results) by a sentinel one, then one left shift by the
   count to put the leading one at bit 14, exponent ``eb + 1 - count`` (``[norm]``);
   round (``[out]``): RNE as one increment of ``exponent field | mantissa`` (a carry
   steps the exponent), a field of 31 saturates to 0x7BFF. An exact zero is +0 unless
   both ``y`` and ``-mu_s`` are -0 (IEEE: (-0) - (+0) = -0), as the golden float64 path.

Every carry chain stands alone in its step (range tests are logic, ``gt_const``; the
exponent differences are computed both ways in parallel); leading-zero counts are trees.

Latency: 1 (the table read register, always present) + ``len(regs)``.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sim_models import wire
from sim_models.params import FormatParams

from .pipeline import Cuts, beat_groups, beat_of, check_lanes, gt_const, stage
from .tofloat import shift_right_sticky
from .wire import key_config_layout

#: Register cut points of the key front end (``kf_regs``, module docstring): inside the
#: scaling (after its shift), after it, after the operand swap, after the alignment, after
#: the add, after the leading-zero count, after the normalisation, after the rounding (the
#: output register). Default: scale, sum, out (docs/DECISIONS.md, "Key front end").
KF_CUTS = Cuts("kf_regs", ("shift", "scale", "swap", "align", "sum", "count", "norm", "out"),
               ("scale", "sum", "out"))

_MAX = 0x7BFF                      # largest finite fp16 pattern (magnitude)
#: One table entry: the centering value mu_s (fp16 bits) and the exponent e.
ENTRY = data.StructLayout({"mu_s": 16, "e": signed(wire.KEY_E_BITS)})


def check_key_slots(p: FormatParams, slots) -> int:
    """Validate ``key_slots`` (table slots; fp16 keys only).

    Raises:
        ValueError: slots < 1, or a dtype other than fp16 (the message names the field).
    """
    wire.key_slot_bits(slots)
    if p.dtype != "fp16":
        raise ValueError(f"key_slots: the key front end is fp16 only, got dtype={p.dtype!r}")
    return slots


def _lzc(m: Module, v, name: str) -> Signal:
    """Leading zeros of ``v`` (len(v) when v == 0) as a tree of log2 levels: the low end
    is padded with ones to a power of two, each level picks the upper half's count or
    (upper half all zero) half the width plus the lower half's."""
    w = len(v)
    k = max(1, (w - 1).bit_length())
    cur = [(~b, Const(0, 0)) for b in Cat(Const((1 << ((1 << k) - w)) - 1, (1 << k) - w), v)]
    while len(cur) > 1:                          # cur[i]: (all zero, count) of a chunk, LSB first
        nxt = []
        for lo, hi in zip(cur[0::2], cur[1::2]):
            nxt.append((lo[0] & hi[0], Mux(hi[0], Cat(lo[1], Const(1, 1)), Cat(hi[1], Const(0, 1)))))
        cur = nxt
    out = Signal(range(w + 1), name=name)
    m.d.comb += out.eq(Mux(cur[0][0], w, cur[0][1]))
    return out


def _fields(m: Module, b, name: str):
    """(significand with hidden bit, effective biased exponent max(E, 1)) of fp16 bits."""
    sig = Signal(11, name=f"{name}_sig")
    eff = Signal(5, name=f"{name}_eff")
    m.d.comb += [sig.eq(Cat(b[:10], b[10:15].any())), eff.eq(Mux(b[10:15].any(), b[10:15], 1))]
    return sig, eff


def decode_lane(m: Module, x, name: str) -> dict:
    """Step 0 (the input cycle, x only): x normalised, ``x = sig_n 2^(base - 25)`` with
    ``sig_n`` the 10 bits below the leading one, ``base = max(E, 1) - lz``, and
    ``nb = 1 - base`` (for the subnormal shift of step 1)."""
    sig, eff = _fields(m, x, name)
    lz = _lzc(m, sig, f"{name}_lz")
    sig_n = Signal(10, name=f"{name}_sign")
    base = Signal(signed(6), name=f"{name}_base")
    nb = Signal(signed(6), name=f"{name}_nb")
    m.d.comb += [sig_n.eq((sig << lz)[:10]), base.eq(eff - lz), nb.eq(1 - eff + lz)]
    return {"x": x, "sig_n": sig_n, "base": base, "nb": nb, "zero": ~sig.any()}


def scale_shift(m: Module, d: dict, e, name: str) -> dict:
    """Step 1a: the exponent ``E2 = base + e`` and the subnormal right shift by
    ``1 - E2 = nb - e`` (two parallel adders; the range tests are logic, ``gt_const``)."""
    e2 = Signal(signed(8), name=f"{name}_e2")
    shf = Signal(signed(8), name=f"{name}_shf")
    m.d.comb += [e2.eq(d["base"] + e), shf.eq(d["nb"] - e)]
    sh = Signal(4, name=f"{name}_sh")
    m.d.comb += sh.eq(Mux(gt_const(shf, 15), 15, shf[:4]))
    t, sticky = shift_right_sticky(m, Cat(Const(0, 1), d["sig_n"], Const(1, 1)), sh, 12,
                                   f"{name}_dn")
    return {"t": t, "sticky": sticky, "big": gt_const(e2, 30), "norm": gt_const(e2, 0),
            "e2": e2[:5], "sig_n": d["sig_n"], "zero": d["zero"], "s": d["x"][15]}


def scale_round(m: Module, d: dict, name: str) -> dict:
    """Step 1b: RN16(x * 2^e) unpacked for the subtraction (x finite; module docstring):
    significand with its hidden bit, effective exponent max(E, 1), sign."""
    t = d["t"]
    r = Signal(11, name=f"{name}_r")
    m.d.comb += r.eq(t[1:] + (t[0] & (d["sticky"] | t[1])))
    sig = Signal(11, name=f"{name}_sig")
    eff = Signal(5, name=f"{name}_eff")
    with m.If(d["zero"]):
        m.d.comb += [sig.eq(0), eff.eq(1)]
    with m.Elif(d["big"]):
        m.d.comb += [sig.eq(0x7FF), eff.eq(30)]
    with m.Elif(d["norm"]):
        m.d.comb += [sig.eq(Cat(d["sig_n"], Const(1, 1))), eff.eq(d["e2"])]
    with m.Else():                               # subnormal, or the smallest normal by a carry
        m.d.comb += [sig.eq(r), eff.eq(1)]
    return {"sig": sig, "eff": eff, "s": d["s"]}


def align_swap(m: Module, y: dict, mu, name: str) -> dict:
    """Step 2a: ``y + (-mu)`` ordered by magnitude (the larger sets the sign; y unpacked,
    :func:`scale_round`); the compare and both exponent differences are parallel adders."""
    sig_m, e_m = _fields(m, mu, f"{name}_m")
    sm = ~mu[15]
    sig_y, e_y = y["sig"], y["eff"]
    swap = Signal(name=f"{name}_swap")
    m.d.comb += swap.eq(Cat(sig_m, e_m) > Cat(sig_y, e_y))
    dy, dm = Signal(signed(6), name=f"{name}_dy"), Signal(signed(6), name=f"{name}_dm")
    m.d.comb += [dy.eq(e_y - e_m), dm.eq(e_m - e_y)]
    d = Signal(signed(6), name=f"{name}_d")
    m.d.comb += d.eq(Mux(swap, dm, dy))
    da = Signal(4, name=f"{name}_da")
    m.d.comb += da.eq(Mux(gt_const(d, 15), 15, d[:4]))
    return {"sig_b": Mux(swap, sig_m, sig_y), "sig_s": Mux(swap, sig_y, sig_m), "da": da,
            "eb": Mux(swap, e_m, e_y), "sub": y["s"] ^ sm,
            "sign": Mux(swap, sm, y["s"]), "zsign": y["s"] & sm}


def align_shift(m: Module, sw: dict, name: str) -> dict:
    """Step 2b: the smaller significand shifted right by the exponent difference with 3
    guard bits (guard, round, sticky ORed into the last)."""
    bs, st = shift_right_sticky(m, Cat(Const(0, 3), sw["sig_s"]), sw["da"], 14, f"{name}_al")
    return {"a": Cat(Const(0, 3), sw["sig_b"]), "b": bs | st, "eb": sw["eb"], "sub": sw["sub"],
            "sign": sw["sign"], "zsign": sw["zsign"]}


def add_lane(m: Module, al: dict, name: str) -> dict:
    """Step 3a: the 15-bit sum or difference of the aligned significands (one adder with
    the subtrahend inverted and a carry in)."""
    r = Signal(15, name=f"{name}_sum")
    bx = Signal(15, name=f"{name}_bx")
    m.d.comb += [bx.eq(Cat(al["b"], Const(0, 1)) ^ al["sub"].replicate(15)),
                 r.eq(Cat(al["a"], Const(0, 1)) + bx + al["sub"])]
    return {"r": r, "eb": al["eb"], "sign": al["sign"], "zsign": al["zsign"]}


def norm_count(m: Module, sm: dict, name: str) -> dict:
    """Step 3b: the left shift of the normalisation: the leading zeros of the 15-bit sum
    (its carry bit included), limited to ``eb`` (the result's exponent field stays >= 1) by
    a sentinel one at bit 14 - eb (no compare)."""
    r, eb = sm["r"], sm["eb"]
    mask = Signal(15, name=f"{name}_mask")
    for i in range(14):                          # sentinel at bit 14 - eb (eb = 1..14)
        m.d.comb += mask[i].eq(eb == 14 - i)
    lz = _lzc(m, r | mask, f"{name}_lz")
    return {**sm, "lz": lz}


def norm_shift(m: Module, nc: dict, name: str) -> dict:
    """Step 3c: normalise: the sum shifted left by the count (the leading one, or the
    sentinel's place, at bit 14), exponent ``eb + 1 - lz``."""
    r, eb, lz = nc["r"], nc["eb"], nc["lz"]
    r1 = Signal(15, name=f"{name}_r1")
    e1 = Signal(5, name=f"{name}_e1")
    m.d.comb += [r1.eq((r << lz)[:15]), e1.eq(eb + 1 - lz)]
    return {"r1": r1, "e1": e1, "zero": ~r.any(), "sign": nc["sign"], "zsign": nc["zsign"]}


def round_lane(m: Module, nm: dict, name: str) -> Signal:
    """Step 3d: round to nearest even (guard bit 3, sticky bits 2..0) as one increment of
    ``exponent field | mantissa`` (field 0 for a subnormal result), saturate where the
    field reaches 31."""
    r1 = nm["r1"]
    pre = Signal(15, name=f"{name}_pre")
    m.d.comb += pre.eq(Cat(r1[4:14], Mux(r1[14], nm["e1"], 0)))
    inc = r1[3] & (r1[2] | r1[1] | r1[0] | r1[4])
    bits = Signal(16, name=f"{name}_bits")
    m.d.comb += bits.eq(pre + inc)
    out = Signal(16, name=f"{name}_d")
    with m.If(nm["zero"]):
        m.d.comb += out.eq(Cat(Const(0, 15), nm["zsign"]))
    with m.Elif(bits[15] | bits[10:15].all()):
        m.d.comb += out.eq(Cat(Const(_MAX, 15), nm["sign"]))
    with m.Else():
        m.d.comb += out.eq(Cat(bits[:15], nm["sign"]))
    return out


class KeyFrontEnd(wiring.Component):
    """The key front end (module docstring): table, config port, per-lane pipeline.

    Args:
        params: format parameters (fp16; ``n`` lanes).
        slots: table slots T (>= 1).
        regs: register cuts from :data:`KF_CUTS`.
        lanes: W, lanes per cycle: None (N) or N/2 (two beats per vector,
            :func:`hw.pipeline.check_lanes`). With W = N/2, ``bits``, ``slot`` and
            ``bypass`` hold the whole vector for both beats and ``beat`` (0 then 1;
            :func:`hw.pipeline.beat_groups` equal copies) picks lanes [0, W) or [W, N) and
            their table entries; the table is read once per vector, on beat 0, and held
            for beat 1, and a ``cfg`` word is written one cycle after its handshake, so a
            word accepted in cycle t is seen by the vectors whose beat 0 comes after t + 1
            (the encoder's two-beat input register: the vectors accepted after t).

    Ports: ``en`` (pipeline enable), ``i_valid``, ``bits`` (N lanes), ``slot``, ``bypass``
    [, ``beat``]; ``o_valid``, ``o_bits`` (W lanes, one beat); ``cfg`` (stream of
    ``sim_models.wire.key_config`` words, always ready).
    """

    def __init__(self, params: FormatParams, slots: int, regs=KF_CUTS.default,
                 lanes: int | None = None):
        self.params = params
        self.slots = check_key_slots(params, slots)
        self.regs = KF_CUTS.check(regs)
        self.lanes = w = check_lanes(params, lanes)
        n = params.n
        ports = {
            "en": In(1), "i_valid": In(1), "bits": In(data.ArrayLayout(16, n)),
            "slot": In(wire.key_slot_bits(slots)), "bypass": In(1),
            "o_valid": Out(1), "o_bits": Out(data.ArrayLayout(16, w)),
            "cfg": In(stream.Signature(key_config_layout(params, slots))),
        }
        if w != n:
            ports["beat"] = In(beat_groups(w))
        super().__init__(ports)

    @property
    def latency(self) -> int:
        """Cycles from input to output: the table read register plus the cuts."""
        return 1 + len(self.regs)

    def elaborate(self, platform):
        m = Module()
        n, en = self.params.n, self.en
        m.submodules.table = mem = Memory(shape=data.ArrayLayout(ENTRY, n), depth=self.slots,
                                          init=[])
        wp = mem.write_port(granularity=1)
        rp = mem.read_port(domain="sync")
        w = self.lanes
        c, cv = self.cfg.payload, self.cfg.valid
        m.d.comb += self.cfg.ready.eq(1)
        if w != n:       # two beats: the word one cycle later, the table read on beat 0 only
            c = Signal.like(self.cfg.payload, name="kf_cfg", reset_less=True)
            cv = Signal(name="kf_cfg_valid")
            m.d.sync += [c.eq(self.cfg.payload), cv.eq(self.cfg.valid)]
            m.d.comb += rp.en.eq(en & ~self.beat[0])
        else:
            m.d.comb += rp.en.eq(en)
        m.d.comb += [wp.addr.eq(c.slot), rp.addr.eq(self.slot)]
        for k in range(n):
            m.d.comb += [wp.data[k].mu_s.eq(c.mu_s), wp.data[k].e.eq(c.e),
                         wp.en[k].eq(cv & (c.lane == k))]
        byp = self.bypass
        if self.slots < (1 << len(self.slot)):
            byp = byp | (self.slot >= self.slots)
        bits = list(self.bits) if w == n else \
            [Mux(beat_of(self.beat, k, w), self.bits[w + k], self.bits[k]) for k in range(w)]
        # step 0 (input cycle): decode and normalise x, registered with the table read
        dec = [decode_lane(m, bits[k], f"kf_dc{k}") for k in range(w)]
        flat = {f"{key}{k}": v for k in range(w) for key, v in dec[k].items()}
        side = {} if w == n else {"beat": self.beat}
        r0 = stage(m, en, "kf_in", byp=byp, valid=self.i_valid, **side, **flat)
        dec = [{key: r0[f"{key}{k}"] for key in dec[k]} for k in range(w)]
        if w == n:
            entries = [rp.data[k] for k in range(n)]
        else:            # the beat's table entries (the row read on beat 0, held for beat 1)
            entries = []
            for k in range(w):
                ent = Signal(ENTRY, name=f"kf_entry{k}")
                m.d.comb += ent.eq(Mux(beat_of(r0["beat"], k, w), rp.data[w + k], rp.data[k]))
                entries.append(ent)
        n = w

        # lanes passed unchanged (NaN/inf, bypass): x and the pass flag ride along
        xs, pas = [], []
        for k in range(n):
            x = dec[k]["x"]
            p = Signal(name=f"kf_pass{k}")
            m.d.comb += p.eq(r0["byp"] | (x[10:15] == 0x1F))
            xs.append(x)
            pas.append(p)
        valid = r0["valid"]

        def cut(name, lanes):
            """Register the per-lane dicts ``lanes`` with x, pass and valid at cut ``name``."""
            nonlocal xs, pas, valid
            if name not in self.regs:
                return lanes
            flat = {f"{key}{k}": v for k in range(n) for key, v in lanes[k].items()}
            r = stage(m, en, f"kf_{name}", x=xs, p=pas, valid=valid, **flat)
            xs, pas, valid = r["x"], r["p"], r["valid"]
            return [{key: r[f"{key}{k}"] for key in lanes[k]} for k in range(n)]

        shs = cut("shift", [{**scale_shift(m, dec[k], entries[k].e, f"kf_sc{k}"),
                             "mu": entries[k].mu_s} for k in range(n)])
        ys = cut("scale", [{**scale_round(m, shs[k], f"kf_sr{k}"), "mu": shs[k]["mu"]}
                           for k in range(n)])
        sws = cut("swap", [align_swap(m, ys[k], ys[k]["mu"], f"kf_sw{k}") for k in range(n)])
        als = cut("align", [align_shift(m, sws[k], f"kf_al{k}") for k in range(n)])
        sums = cut("sum", [add_lane(m, als[k], f"kf_ad{k}") for k in range(n)])
        ncs = cut("count", [norm_count(m, sums[k], f"kf_nc{k}") for k in range(n)])
        nms = cut("norm", [norm_shift(m, ncs[k], f"kf_nm{k}") for k in range(n)])
        out = [Mux(pas[k], xs[k], round_lane(m, nms[k], f"kf_rd{k}")) for k in range(n)]
        if "out" in self.regs:
            r = stage(m, en, "kf_out", d=out, valid=valid)
            out, valid = r["d"], r["valid"]
        m.d.comb += [self.o_valid.eq(valid)] + [self.o_bits[k].eq(out[k]) for k in range(n)]
        return m
