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

Per lane, in three steps with optional register cuts between them (:data:`KF_CUTS`):

1. scale (``[scale]``): ``x 2^e``: a subnormal x is normalised (leading-one count),
   the exponent ``E2 = E_x - lz + e``; ``E2 >= 31`` saturates to 0x7BFF, ``1 <= E2 <= 30``
   is exact, ``E2 <= 0`` shifts the significand right by ``1 - E2`` with round to nearest
   even (guard, sticky) into the subnormals (a carry gives the smallest normal by itself);
   +-0 keeps its sign. Lanes to pass (NaN/inf, bypass) keep x.
2. align (``[align]``): ``y - mu_s`` as ``y + (-mu_s)``: the operands ordered by magnitude
   (the larger sets the sign), the smaller significand shifted right by the exponent
   difference with 3 guard bits (guard, round, sticky ORed into the last).
3. add (``[sum]``), normalise, round (``[out]``): 15-bit add or subtract; a carry shifts
   right by one
   (sticky kept), else a left shift by the leading-zero count, limited to reach exponent 1
   (subnormal results); RNE; the pattern ``((E - 1) << 10) + r`` lets a rounding carry
   step the exponent; above 0x7BFF saturates. An exact zero is +0 unless both
   ``y`` and ``-mu_s`` are -0 (IEEE: (-0) - (+0) = -0), as the golden float64 path.

Latency: 1 (the table read register, always present) + ``len(regs)``.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sim_models import wire
from sim_models.params import FormatParams

from .pipeline import Cuts, stage
from .tofloat import shift_right_sticky
from .wire import key_config_layout

#: Register cut points of the key front end (``kf_regs``): after the scaling, after the
#: alignment, after the add, after the rounding (the output register). Default: scale, out.
KF_CUTS = Cuts("kf_regs", ("scale", "align", "sum", "out"), ("scale", "out"))

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
    """Leading zeros of ``v`` (len(v) when v == 0), as a priority chain."""
    w = len(v)
    out = Signal(range(w + 1), name=name)
    expr = Const(w, out.shape())
    for i in range(w):                  # the highest set bit wins: evaluated last
        expr = Mux(v[i], w - 1 - i, expr)
    m.d.comb += out.eq(expr)
    return out


def _fields(m: Module, b, name: str):
    """(significand with hidden bit, effective biased exponent max(E, 1)) of fp16 bits."""
    sig = Signal(11, name=f"{name}_sig")
    eff = Signal(5, name=f"{name}_eff")
    m.d.comb += [sig.eq(Cat(b[:10], b[10:15].any())), eff.eq(Mux(b[10:15].any(), b[10:15], 1))]
    return sig, eff


def scale_lane(m: Module, x, e, name: str) -> Signal:
    """fp16 bits of RNE(x * 2^e), saturating; x finite (step 1 of the module docstring)."""
    s = x[15]
    sig, eff = _fields(m, x, name)
    lz = _lzc(m, sig, f"{name}_lz")
    sig_n = Signal(11, name=f"{name}_sign")
    e2 = Signal(signed(8), name=f"{name}_e2")
    m.d.comb += [sig_n.eq(sig << lz), e2.eq(eff - lz + e)]
    sh = Signal(4, name=f"{name}_sh")
    m.d.comb += sh.eq(Mux(e2 < -13, 15, 1 - e2))
    t, sticky = shift_right_sticky(m, Cat(Const(0, 1), sig_n), sh, 12, f"{name}_dn")
    r = Signal(11, name=f"{name}_r")
    m.d.comb += r.eq(t[1:] + (t[0] & (sticky | t[1])))
    out = Signal(16, name=f"{name}_y")
    with m.If(sig == 0):
        m.d.comb += out.eq(Cat(Const(0, 15), s))
    with m.Elif(e2 >= 31):
        m.d.comb += out.eq(Cat(Const(_MAX, 15), s))
    with m.Elif(e2 >= 1):
        m.d.comb += out.eq(Cat(sig_n[:10], e2[:5], s))
    with m.Else():
        m.d.comb += out.eq(Cat(r, Const(0, 4), s))
    return out


def align_lane(m: Module, y, mu, name: str) -> dict:
    """Step 2: operands of ``y + (-mu)`` ordered and aligned (module docstring)."""
    nmu = Cat(mu[:15], ~mu[15])
    swap = Signal(name=f"{name}_swap")
    m.d.comb += swap.eq(nmu[:15] > y[:15])
    big, small = Signal(16, name=f"{name}_big"), Signal(16, name=f"{name}_small")
    m.d.comb += [big.eq(Mux(swap, nmu, y)), small.eq(Mux(swap, y, nmu))]
    sig_b, e_b = _fields(m, big, f"{name}_b")
    sig_s, e_s = _fields(m, small, f"{name}_s")
    d = Signal(5, name=f"{name}_d")
    m.d.comb += d.eq(e_b - e_s)
    da = Signal(4, name=f"{name}_da")
    m.d.comb += da.eq(Mux(d > 15, 15, d))
    bs, st = shift_right_sticky(m, Cat(Const(0, 3), sig_s), da, 14, f"{name}_al")
    return {"a": Cat(Const(0, 3), sig_b), "b": bs | st, "eb": e_b, "sub": y[15] ^ nmu[15],
            "sign": big[15], "zsign": y[15] & nmu[15]}


def add_lane(m: Module, al: dict, name: str) -> dict:
    """Step 3a: the 15-bit sum or difference of the aligned significands."""
    r = Signal(15, name=f"{name}_sum")
    m.d.comb += r.eq(Mux(al["sub"], al["a"] - al["b"], al["a"] + al["b"]))
    return {"r": r, "eb": al["eb"], "sign": al["sign"], "zsign": al["zsign"]}


def round_lane(m: Module, al: dict, name: str) -> Signal:
    """Step 3b: normalise, round to nearest even, saturate."""
    r = al["r"]
    lz = _lzc(m, r[:14], f"{name}_nlz")
    lim = Signal(5, name=f"{name}_lim")
    m.d.comb += lim.eq(al["eb"] - 1)
    shl = Signal(5, name=f"{name}_shl")
    m.d.comb += shl.eq(Mux(lz > lim, lim, lz))
    r1 = Signal(14, name=f"{name}_r1")
    e1 = Signal(6, name=f"{name}_e1")
    with m.If(r[14]):
        m.d.comb += [r1.eq(Cat(r[0] | r[1], r[2:15])), e1.eq(al["eb"] + 1)]
    with m.Else():
        m.d.comb += [r1.eq((r[:14] << shl)[:14]), e1.eq(al["eb"] - shl)]
    rnd = Signal(12, name=f"{name}_rnd")
    m.d.comb += rnd.eq(r1[3:] + (r1[2] & (r1[1] | r1[0] | r1[3])))
    mag = Signal(17, name=f"{name}_mag")
    m.d.comb += mag.eq(((e1 - 1) << 10) + rnd)
    out = Signal(16, name=f"{name}_d")
    with m.If(r == 0):
        m.d.comb += out.eq(Cat(Const(0, 15), al["zsign"]))
    with m.Else():
        m.d.comb += out.eq(Cat(Mux(mag > _MAX, _MAX, mag[:15]), al["sign"]))
    return out


class KeyFrontEnd(wiring.Component):
    """The key front end (module docstring): table, config port, per-lane pipeline.

    Args:
        params: format parameters (fp16; ``n`` lanes).
        slots: table slots T (>= 1).
        regs: register cuts from :data:`KF_CUTS`.

    Ports: ``en`` (pipeline enable), ``i_valid``, ``bits`` (N lanes), ``slot``, ``bypass``;
    ``o_valid``, ``o_bits``; ``cfg`` (stream of ``sim_models.wire.key_config`` words,
    always ready).
    """

    def __init__(self, params: FormatParams, slots: int, regs=KF_CUTS.default):
        self.params = params
        self.slots = check_key_slots(params, slots)
        self.regs = KF_CUTS.check(regs)
        n = params.n
        super().__init__({
            "en": In(1), "i_valid": In(1), "bits": In(data.ArrayLayout(16, n)),
            "slot": In(wire.key_slot_bits(slots)), "bypass": In(1),
            "o_valid": Out(1), "o_bits": Out(data.ArrayLayout(16, n)),
            "cfg": In(stream.Signature(key_config_layout(params, slots))),
        })

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
        c = self.cfg.payload
        m.d.comb += [self.cfg.ready.eq(1), wp.addr.eq(c.slot), rp.addr.eq(self.slot),
                     rp.en.eq(en)]
        for k in range(n):
            m.d.comb += [wp.data[k].mu_s.eq(c.mu_s), wp.data[k].e.eq(c.e),
                         wp.en[k].eq(self.cfg.valid & (c.lane == k))]
        byp = self.bypass
        if self.slots < (1 << len(self.slot)):
            byp = byp | (self.slot >= self.slots)
        r0 = stage(m, en, "kf_in", x=self.bits, byp=byp, valid=self.i_valid)
        tab = rp.data

        # step 1: scale
        y, pas = [], []
        for k in range(n):
            x = r0["x"][k]
            p = Signal(name=f"kf_pass{k}")
            m.d.comb += p.eq(r0["byp"] | (x[10:15] == 0x1F))
            y.append(Mux(p, x, scale_lane(m, x, tab[k].e, f"kf_sc{k}")))
            pas.append(p)
        mu = [tab[k].mu_s for k in range(n)]
        valid = r0["valid"]
        if "scale" in self.regs:
            r = stage(m, en, "kf_scale", y=y, p=pas, mu=mu, valid=valid)
            y, pas, mu, valid = r["y"], r["p"], r["mu"], r["valid"]

        # step 2: align
        als = [align_lane(m, y[k], mu[k], f"kf_al{k}") for k in range(n)]
        if "align" in self.regs:
            flat = {f"{key}{k}": v for k in range(n) for key, v in als[k].items()}
            r = stage(m, en, "kf_align", y=y, p=pas, valid=valid, **flat)
            y, pas, valid = r["y"], r["p"], r["valid"]
            als = [{key: r[f"{key}{k}"] for key in als[k]} for k in range(n)]

        # step 3: add, normalise, round
        sums = [add_lane(m, als[k], f"kf_ad{k}") for k in range(n)]
        if "sum" in self.regs:
            flat = {f"{key}{k}": v for k in range(n) for key, v in sums[k].items()}
            r = stage(m, en, "kf_sum", y=y, p=pas, valid=valid, **flat)
            y, pas, valid = r["y"], r["p"], r["valid"]
            sums = [{key: r[f"{key}{k}"] for key in sums[k]} for k in range(n)]
        out = [Mux(pas[k], y[k], round_lane(m, sums[k], f"kf_rd{k}")) for k in range(n)]
        if "out" in self.regs:
            r = stage(m, en, "kf_out", d=out, valid=valid)
            out, valid = r["d"], r["valid"]
        m.d.comb += [self.o_valid.eq(valid)] + [self.o_bits[k].eq(out[k]) for k in range(n)]
        return m
