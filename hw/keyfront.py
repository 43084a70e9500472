"""Key front end of the cache policy: ``KeyFrontEnd``, before the sign flip of the encoder.

Bit-exact with :func:`sim_models.keyscale.key_front` (fp16): per lane
``x' = RNE(RN16(x * 2^e) - mu_s)``, saturating to +-65504, NaN/inf lanes of x passed
through; ``mu_s = RN16(mu * 2^e)`` (fp16 bits) and ``e`` (5-bit two's complement, in
``LOG2_S_RANGE``) come from a table of ``slots`` slots x N lanes (one slot per (layer, kv
head) served), computed once in software (:func:`sim_models.keyscale.front_table`).

Table and config port: one memory per lane of ``slots`` rows of (mu_s, e) (LUT RAM, one
write port each), written one lane per ``cfg`` word (``sim_models.wire.key_config``: mu_s |
e | lane | slot; ``cfg.ready`` is always 1) and read at the slot of the vector the input
accepts into a register, non-transparent (:func:`table`). So a lane written in cycle t is
seen by every vector accepted in a later cycle and by none accepted in cycle t or before:
a table load (N words) takes effect lane by lane, for the vectors accepted after its last
word; vectors of other slots stream undisturbed meanwhile. The memory starts as all zero
(mu_s = +0, e = 0: the identity).

Side band (per vector): ``slot`` and ``bypass``; ``bypass`` = 1 or a slot >= ``slots``
passes the lanes unchanged (values, keys without the policy): the table read register
loads the identity entry instead, which leaves every finite lane unchanged, so only
NaN/inf lanes need a path of their own.

Per lane, in steps with optional register cuts between them (:data:`KF_CUTS`):

0. decode (the input cycle, before the table read register): x's significand normalised
   by its leading-zero count (subnormal x), ``base = max(E, 1) - lz`` and ``1 - base``.
1. scale: ``x 2^e``: ``E2 = base + e``; ``E2 >= 31`` saturates to 0x7BFF,
   ``1 <= E2 <= 30`` is exact, ``E2 <= 0`` shifts the significand right by ``1 - E2``
   (``[shift]``) with round to nearest even (guard, sticky) into the subnormals (a carry
   gives the smallest normal by itself) (``[scale]``); +-0 keeps its sign. The scaled
   value stays unpacked (significand with hidden bit, effective exponent) for step 2.
   NaN/inf lanes pass: their sign and 10 payload bits ride along to the output (the
   exponent field is 31), with one pass bit.
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

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
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
    return {"s": x[15], "sig_n": sig_n, "base": base, "nb": nb, "zero": ~sig.any()}


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
            "e2": e2[:5], "sig_n": d["sig_n"], "zero": d["zero"], "s": d["s"]}


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


def table(m: Module, cfg, slot, en, byp, slots: int, n: int, w: int, beat, load) -> list:
    """The table and its read registers (module docstring): per lane of the beat, the
    entry (mu_s, e) of ``slot``, or the identity (+0, 0) where ``byp`` (a synchronous reset
    of the read register: a finite lane then leaves the lane logic unchanged,
    ``RNE(RN16(x 2^0) - (+0)) = x``, -0 kept), in the cycle after the input.

    * One beat (``beat`` None): one memory of N lanes, each ``cfg`` word written in its
      handshake cycle, read into one register of N entries while ``en``.
    * Two beats, ``load`` None (beat 1 always the cycle after beat 0: the encoder's credit
      flow): one memory per half of the lanes, read at the beat of the vector (lanes
      [0, W) on beat 0, [W, N) on beat 1) into one register of W entries; the words to the
      first half are written one cycle after their handshake, those to the second half
      two, so a word accepted in cycle t is seen by the vectors whose beat 0 comes after
      t + 1 (accepted after t), by both beats or neither.
    * Two beats with ``load`` (stalls may fall between a vector's handshake and its beats):
      one memory of N lanes, each word written in its handshake cycle, its row read into
      a register of N entries in the cycles with ``load`` (the vector's handshake; ``slot``
      and ``byp`` are the accepted vector's then) and held; the beat's W entries are
      registered from it while ``en``.

    Returns:
        the W entries (:data:`ENTRY`) of the beat, registered.
    """
    halves = 2 if beat is not None and load is None else 1
    c, cv = cfg.payload, cfg.valid
    reads = []
    for h in range(halves):
        if halves > 1:             # half h written 1 + h cycles after the handshake
            c2 = Signal.like(c, name=f"kf_cfg{h}", reset_less=True)
            cv2 = Signal(name=f"kf_cfg{h}_valid")
            m.d.sync += [c2.eq(c), cv2.eq(cv)]
            c, cv = c2, cv2
        lanes = n // halves
        for k in range(lanes):      # one memory per lane: one write port, one enable
            mem = Memory(shape=ENTRY, depth=slots, init=[])
            m.submodules[f"table{h * lanes + k}"] = mem
            wp = mem.write_port()
            rp = mem.read_port(domain="comb")
            m.d.comb += [wp.addr.eq(c.slot), rp.addr.eq(slot), wp.data.mu_s.eq(c.mu_s),
                         wp.data.e.eq(c.e), wp.en.eq(cv & (c.lane == h * lanes + k))]
            reads.append(Value.cast(rp.data))

    def register(name, values, ld, reset):
        regs = []
        for k, v in enumerate(values):
            r = Signal(len(v), name=f"{name}{k}", reset_less=True)
            with m.If(ld):
                m.d.sync += r.eq(Mux(reset, 0, v))
            regs.append(r)
        return regs

    if beat is not None and load is None:
        ents = register("kf_entry", [Mux(beat_of(beat, k, w), reads[w + k], reads[k])
                                     for k in range(w)], en, byp)
    elif beat is not None:
        row = register("kf_row", reads, load, byp)
        ents = register("kf_entry", [Mux(beat_of(beat, k, w), row[w + k], row[k])
                                     for k in range(w)], en, 0)
    else:
        ents = register("kf_entry", reads, en, byp)
    return [data.View(ENTRY, e) for e in ents]


class KeyFrontEnd(wiring.Component):
    """The key front end (module docstring): table, config port, per-lane pipeline.

    Args:
        params: format parameters (fp16; ``n`` lanes).
        slots: table slots T (>= 1).
        regs: register cuts from :data:`KF_CUTS`.
        lanes: W, lanes per cycle: None (N) or N/2 (two beats per vector,
            :func:`hw.pipeline.check_lanes`). With W = N/2, ``bits`` holds the whole vector
            for both beats and ``beat`` (0 then 1; :func:`hw.pipeline.beat_groups` equal
            copies) picks lanes [0, W) or [W, N) and their table entries; a ``cfg`` word
            accepted in cycle t is seen by the vectors whose beat 0 comes after t + 1 (the
            encoder's two-beat input register: the vectors accepted after t).
        held: two beats only: stalls (``en`` low) may fall between a vector's handshake and
            its beats, so the table row is read in the cycle ``load`` is high (the
            handshake; ``slot`` and ``bypass`` then the accepted vector's) and held, N
            entries; False (beat 1 always the cycle after beat 0, the encoder's credit
            flow): each half of the lanes read at its beat, W entries (:func:`table`).

    Ports: ``en`` (pipeline enable), ``i_valid``, ``bits`` (N lanes), ``slot``, ``bypass``
    [, ``beat`` [, ``load``]]; ``o_valid``, ``o_bits`` (W lanes, one beat); ``cfg`` (stream of
    ``sim_models.wire.key_config`` words, always ready).
    """

    def __init__(self, params: FormatParams, slots: int, regs=KF_CUTS.default,
                 lanes: int | None = None, held: bool = True):
        self.params = params
        if not isinstance(held, bool):
            raise TypeError(f"held must be a bool, got {type(held).__name__}")
        self.held = held
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
            if held:
                ports["load"] = In(1)
        super().__init__(ports)

    @property
    def latency(self) -> int:
        """Cycles from input to output: the table read register plus the cuts."""
        return 1 + len(self.regs)

    def elaborate(self, platform):
        m = Module()
        n, w, en = self.params.n, self.lanes, self.en
        two = w != n
        m.d.comb += self.cfg.ready.eq(1)
        byp = self.bypass
        if self.slots < (1 << len(self.slot)):
            byp = byp | (self.slot >= self.slots)
        entries = table(m, self.cfg, self.slot, en, byp, self.slots, n, w,
                        self.beat if two else None, self.load if two and self.held else None)
        bits = list(self.bits) if not two else \
            [Mux(beat_of(self.beat, k, w), self.bits[w + k], self.bits[k]) for k in range(w)]
        # step 0 (input cycle): decode and normalise x, registered with the table read; a
        # lane to pass (NaN/inf) keeps only its sign and payload (its exponent field is 31)
        dec = [decode_lane(m, bits[k], f"kf_dc{k}") for k in range(w)]
        flat = {f"{key}{k}": v for k in range(w) for key, v in dec[k].items()}
        r0 = stage(m, en, "kf_in", valid=self.i_valid,
                   x=[Cat(b[:10], b[15]) for b in bits], p=[b[10:15].all() for b in bits],
                   **flat)
        dec = [{key: r0[f"{key}{k}"] for key in dec[k]} for k in range(w)]
        xs, pas, valid = r0["x"], r0["p"], r0["valid"]

        def cut(name, lanes):
            """Register the per-lane dicts ``lanes`` with x, pass and valid at cut ``name``."""
            nonlocal xs, pas, valid
            if name not in self.regs:
                return lanes
            flat = {f"{key}{k}": v for k in range(w) for key, v in lanes[k].items()}
            r = stage(m, en, f"kf_{name}", x=xs, p=pas, valid=valid, **flat)
            xs, pas, valid = r["x"], r["p"], r["valid"]
            return [{key: r[f"{key}{k}"] for key in lanes[k]} for k in range(w)]

        shs = cut("shift", [{**scale_shift(m, dec[k], entries[k].e, f"kf_sc{k}"),
                             "mu": entries[k].mu_s} for k in range(w)])
        ys = cut("scale", [{**scale_round(m, shs[k], f"kf_sr{k}"), "mu": shs[k]["mu"]}
                           for k in range(w)])
        sws = cut("swap", [align_swap(m, ys[k], ys[k]["mu"], f"kf_sw{k}") for k in range(w)])
        als = cut("align", [align_shift(m, sws[k], f"kf_al{k}") for k in range(w)])
        sums = cut("sum", [add_lane(m, als[k], f"kf_ad{k}") for k in range(w)])
        ncs = cut("count", [norm_count(m, sums[k], f"kf_nc{k}") for k in range(w)])
        nms = cut("norm", [norm_shift(m, ncs[k], f"kf_nm{k}") for k in range(w)])
        out = [Mux(pas[k], Cat(xs[k][:10], Const(0x1F, 5), xs[k][10]),
                   round_lane(m, nms[k], f"kf_rd{k}")) for k in range(w)]
        if "out" in self.regs:
            r = stage(m, en, "kf_out", d=out, valid=valid)
            out, valid = r["d"], r["valid"]
        m.d.comb += [self.o_valid.eq(valid)] + [self.o_bits[k].eq(out[k]) for k in range(w)]
        return m
