"""Key front end of the cache policy: the key scale and centering folded into block floating point.

Bit-exact with :func:`sim_models.bfp.to_block_fp_keys` for key vectors and with
:func:`sim_models.bfp.to_block_fp` for plain ones (``bypass``, values): the encoder's front
end with the key front end inside it (FORMAT.md 8, the folded rule; the encoder's bytes are
:func:`sim_models.codec.encode_folded`'s), fp16 only, one beat (N lanes per cycle) or two
(W = N/2 lanes per cycle). No fp16 rounding per lane: per lane one exponent add, one lane
max in front of the exponent max tree, one more aligner (for mu_s) and one subtraction.

Table and config port (``slots`` = T, :func:`table`): one memory per lane of T rows of
(mu_s, e) (LUT RAM, one write port each; mu_s = RN16(mu 2^e) as fp16 bits, e 5-bit two's
complement, from :func:`sim_models.keyscale.front_table`), written one lane per ``cfg`` word
(``sim_models.wire.key_config``: mu_s | e | lane | slot; ``cfg.ready`` is always 1) and read
at the slot of the vector the input accepts into a register, non-transparent. So a lane
written in cycle t is seen by every vector accepted in a later cycle and by none accepted
in cycle t or before. The memory starts as all zero (mu_s = +0, e = 0). The read register
loads the identity entry (+0, 0) where ``bypass`` or a slot >= T; the lanes and ``key``
(not bypass: the headroom bit) wait in a register beside it. With ``slots`` None the
entries are ports (``mu``, ``e``, ``key``), for tests of the lane logic alone.

Per lane, after the table read (fp16 key k, entry (mu_s, e), ``hb`` = ``key``):

* decode k as FORMAT.md 3.1; NaN / inf lanes take e = 0 and mu_s = +0 (they pass);
* ``Ex = max(E, 1) + e`` (7-bit signed), ``Ex > 30`` saturates to (2047, 30);
* mu_s decoded (Em, significand, sign); the lane's exponent ``h = max(Ex, Em)``.

  The logic takes the lane as finite and forms its values beside the NaN / inf detection,
  which selects at the end between them and the constants of a NaN lane (Ex = 1,
  significand 0) or an inf lane ((2047, 30)), both with Em = 1, mu's significand and sign
  0 and h = Ex. For the finite lane, side by side from the two registers: the sum
  ``max(E, 1) + e``; the saturation without the sum, ``e >= 31 - max(E, 1)``
  (:func:`saturates`); and ``Ex > Em`` as ``max(E, 1) > Em - e``, with ``Em - e`` from the
  entry alone. Then ``h`` is ``max(30, Em)`` where saturated, else Ex or Em as that
  compare says;
* ``root`` = max of h over the lanes (a max tree, flags ORed along); ``emax = root + hb``;
  beside the tree, each lane's ``Ex - hb - post`` and ``Em - hb - post``;
* shift amounts ``emax - Ex + post``, ``emax - Em + post`` (limited, FrontEnd's), each
  one subtraction from ``root``, and two aligners (``(sig << pre) * 2 >> sh``: round half
  away from zero from the last bit);
* ``x = (-1)^d (X - MU)`` as ``((hx ^ s) + (cx ^ s)) + ((hm ^ t) + (cm ^ t))`` with
  s = sign ^ d and t = ~sign_mu ^ d (d the sign-flip bit, a constant): two carry chains
  of M + 1 bits, then the clamp to +-(2^(M-1) - 1), reached only at +-2^(M-1).

``u = emax - bias - M + 2``; with ``hb`` = 0, e = 0, mu_s = +0 every step is 3.3's.

Two beats (``lanes`` = N/2): ``bits`` holds the whole vector for both beats and ``beat``
picks lanes [0, W) or [W, N); the table is read per beat (:func:`table`: ``held``, the
row read at ``load`` and held, or each half at its beat). The lane logic up to the lane max and a W-lane max tree run per beat; the join
(:func:`join`) delays the lanes by two registers in a row while it takes the vector's
max from beat 0's (in the first register) and beat 1's, then beat 0's lanes and beat 1's
go on to the shift amounts in turn: it stands in for the ``emax`` cut, one cycle longer.
Register cuts (:data:`FOLD_CUTS`): after the lane logic (``dec``: each lane's exponents,
significands, signs, its h and flags, with the vector's valid and key bit), after the max
tree (``emax``), after the shift amounts (``shamt``), after the aligners (``align``); and
with ``tree_every`` = k a register after every k levels of the W-lane max tree
(:func:`hw.trees.tree_cut_levels`, the partial maxima with the rest of the vector), as
:class:`hw.frontend.FrontEnd`'s. Latency: 1 (the table read, with ``slots``) + the cuts +
the tree's registers; two beats: 2 + the cuts with ``emax`` + the tree's registers.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sim_models import wire
from sim_models.params import FormatParams
from sim_models.signs import sign_mask_int

from .frontend import tree_cuts, u_range
from .pipeline import (REPLICA_ATTRS, Cuts, beat_groups, beat_index, beat_of, check_lanes,
                       check_tree_every, gt_const, stage, when)
from .trees import tree_reduce
from .wire import key_config_layout

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


def saturates(ee, e) -> Value:
    """``ee + e > 30`` for the 5-bit unsigned ``ee`` and the 5-bit signed ``e``, without the
    sum: ``e >= 31 - ee`` (``31 - ee`` is ``~ee``), so e >= 0, ``ee`` >= 16 and a 4-bit
    compare of e's low bits against ``~ee``'s."""
    return ~e[4] & ee[4] & (e[:4] >= ~ee[:4])


#: Register cuts of the folded front end: after the lane logic (before the max tree), after
#: the exponent max tree, after the shift amounts, after the two aligners (before the carry
#: chains). Default: ``dec`` and ``emax``.
FOLD_CUTS = Cuts("fe_regs", ("dec", "emax", "shamt", "align"), ("dec", "emax"))


def fold_u_shape(p: FormatParams) -> Shape:
    """Shape of u with the folded front end: one value above :func:`hw.frontend.u_range`
    (emax up to 31 with the headroom bit); the same Shape for the default M = 12."""
    lo, hi = u_range(p)
    return Shape.cast(range(lo, hi + 2))


def table(m: Module, cfg, slot, en, byp, slots: int, n: int, w: int, beat, load) -> list:
    """The table and its read registers (module docstring): per lane of the beat, the
    entry (mu_s, e) of ``slot``, or the identity (+0, 0) where ``byp`` (a synchronous reset
    of the read register: the lane logic is then :func:`sim_models.bfp.to_block_fp`'s), in
    the cycle after the input.

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


class FoldFrontEnd(wiring.Component):
    """The folded key front end and block floating point (module docstring).

    Args:
        p: format parameters (fp16).
        slots: table slots T, or None (entries as ports ``mu``, ``e``, ``key``).
        regs: register cuts from :data:`FOLD_CUTS`.
        lanes: W, lanes per cycle: None (N) or N/2 (two beats, with ``slots``).
        held: two beats only: the table row read at ``load`` (the handshake; stalls may
            fall between it and the beats) and held, or (False, the credit flow) each half
            read at its beat (:func:`table`).
        tree_every: a register after every k levels of the W-lane max tree (0: none;
            :func:`hw.trees.tree_cut_levels`).

    Ports: ``bits`` (N x 16), ``en``, ``i_valid``; with slots ``slot``, ``bypass``, ``cfg``
    (always ready); without ``mu`` (N x 16), ``e`` (N x signed 5), ``key``; two beats
    ``beat`` (:func:`hw.pipeline.beat_groups` copies) [, ``load``]; out ``x`` (W signed
    M-bit), ``u``, ``flags`` (bit0 NaN, bit1 Inf), ``o_valid``.
    """

    def __init__(self, p: FormatParams, slots: int | None = None, regs=FOLD_CUTS.default,
                 lanes: int | None = None, held: bool = True, tree_every: int = 0):
        if p.dtype != "fp16":
            raise ValueError(f"FoldFrontEnd: dtype must be 'fp16', got {p.dtype!r}")
        if not isinstance(held, bool):
            raise TypeError(f"held must be a bool, got {type(held).__name__}")
        self.p = p
        self.slots = None if slots is None else check_key_slots(p, slots)
        self.regs = FOLD_CUTS.check(regs)
        self.lanes = w = check_lanes(p, lanes)
        self.held = held
        self.tree_every = check_tree_every(tree_every)
        if w != p.n and slots is None:
            raise ValueError("FoldFrontEnd: lanes=N/2 (two beats) needs slots (the table)")
        self.mask = sign_mask_int(p.n, p.sign_seed)
        n = p.n
        ports = {
            "bits": In(n * 16), "en": In(1), "i_valid": In(1),
            "x": Out(data.ArrayLayout(signed(p.mant_bits), w)), "u": Out(fold_u_shape(p)),
            "flags": Out(2), "o_valid": Out(1),
        }
        if w != n:
            ports["beat"] = In(beat_groups(w))
            if held:
                ports["load"] = In(1)
        if slots is None:
            ports.update(mu=In(data.ArrayLayout(16, n)),
                         e=In(data.ArrayLayout(signed(wire.KEY_E_BITS), n)), key=In(1))
        else:
            ports.update(slot=In(wire.key_slot_bits(slots)), bypass=In(1),
                         cfg=In(stream.Signature(key_config_layout(p, slots))))
        super().__init__(ports)

    @property
    def latency(self) -> int:
        """Cycles from a beat's input to its output: the table read register, the cuts, the
        max tree's registers; two beats: the join (beat 0 waits for beat 1) in place of the
        ``emax`` cut, one cycle more."""
        tree = tree_cuts(self.lanes, self.tree_every)
        if self.lanes != self.p.n:
            return 2 + len(set(self.regs) | {"emax"}) + tree
        return (self.slots is not None) + len(self.regs) + tree

    def elaborate(self, platform):
        m = Module()
        p, n, en = self.p, self.p.n, self.en
        M = p.mant_bits
        lim = (1 << (M - 1)) - 1
        off = 12 - M                          # 10 mantissa bits + 2 - M
        pre, post = max(-off, 0), max(off, 0)
        wsp = 11 + pre                        # pre-shifted significand width

        w, two = self.lanes, self.lanes != n
        lanes = [self.bits[16 * k:16 * k + 16] for k in range(n)]
        if self.slots is None:
            mus, es, hb, valid = list(self.mu), list(self.e), self.key, self.i_valid
        else:
            m.d.comb += self.cfg.ready.eq(1)
            byp = self.bypass
            if self.slots < (1 << len(self.slot)):
                byp = byp | (self.slot >= self.slots)
            load = self.load if two and self.held else None
            ents = table(m, self.cfg, self.slot, en, byp, self.slots, n, w,
                         self.beat if two else None, load)
            key = ~byp
            if two:             # the beat's lanes; held: the vector's key bit from its handshake
                lanes = [Mux(beat_of(self.beat, k, w), lanes[w + k], lanes[k]) for k in range(w)]
                if load is not None:
                    key = Signal(name="kf_rowkey", reset_less=True)
                    with m.If(load):
                        m.d.sync += key.eq(~byp)
            r = stage(m, en, "kf_in", valid=self.i_valid, bits=lanes, key=key)
            lanes, hb, valid = r["bits"], r["key"], r["valid"]
            mus, es = [e.mu_s for e in ents], [e.e for e in ents]

        vec = {"valid": valid, "hb": hb}
        ex_l, sig_l, s_l, em_l, ms_l, sm_l, h_l, fl_l = [], [], [], [], [], [], [], []
        for k in range(w):
            b = lanes[k]
            exp, frac = b[10:15], b[:10]
            eany, fany, special = exp.any(), frac.any(), exp.all()
            nan = Signal(name=f"nan{k}")
            inf = Signal(name=f"inf{k}")
            m.d.comb += [nan.eq(special & fany), inf.eq(special & ~fany)]
            # the key as a finite lane: E = max(exp, 1), E + e, E + e > 30
            ee = Signal(5, name=f"ee{k}")
            m.d.comb += ee.eq(Cat(exp[0] | ~eany, exp[1:]))
            exn = Signal(signed(7), name=f"exn{k}")
            m.d.comb += exn.eq(ee + es[k])
            sat = Signal(name=f"sat{k}")
            m.d.comb += sat.eq(saturates(ee, es[k]))
            # the entry alone: Em = max(exp(mu_s), 1), Em - e
            mexp = mus[k][10:15]
            many = mexp.any()
            emn = Signal(5, name=f"emn{k}")
            dm = Signal(signed(7), name=f"dm{k}")
            m.d.comb += [emn.eq(Cat(mexp[0] | ~many, mexp[1:])), dm.eq(emn - es[k])]
            gtm = Signal(name=f"gtm{k}")                 # E + e > Em
            m.d.comb += gtm.eq(ee > dm)
            # the finite lane's h = max(min(E + e, 30), Em); NaN / inf lanes (e = 0,
            # mu_s = +0): Ex = 1 / 30, Em = 1, h = Ex
            hn = Mux(sat, Cat(mexp.all(), Const(0b1111, 4)), Mux(gtm, exn[:5], emn))
            spx = Mux(fany, 1, 30)
            exs = Signal(signed(6), name=f"exs{k}")
            sigs = Signal(11, name=f"sigs{k}")
            em = Signal(5, name=f"em{k}")
            msig = Signal(11, name=f"msig{k}")
            h = Signal(5, name=f"h{k}")
            m.d.comb += [exs.eq(Mux(special, spx, Mux(sat, 30, exn))),
                         sigs.eq(Mux(special | sat, Mux(nan, 0, 0x7FF), Cat(frac, eany))),
                         em.eq(Mux(special, 1, emn)),
                         msig.eq(Mux(special, 0, Cat(mus[k][:10], many))),
                         h.eq(Mux(special, spx, hn))]
            ex_l.append(exs)
            sig_l.append(sigs)
            s_l.append(b[15] & ~nan)
            em_l.append(em)
            ms_l.append(msig)
            sm_l.append(mus[k][15] & ~special)
            h_l.append(h)
            fl_l.append(Cat(nan, inf))

        def max_or(a, b):
            return Cat(Mux(a[:5] > b[:5], a[:5], b[:5]), a[5:] | b[5:])

        # the vector in flight up to the max tree's root: every register stage holds all of it
        vec.update(ex=ex_l, sig=sig_l, s=s_l, em=em_l, ms=ms_l, sm=sm_l,
                   part=[Cat(h, f) for h, f in zip(h_l, fl_l)])
        if "dec" in self.regs:
            vec.update(stage(m, en, "fold_dec", **vec))

        def tree_cut(parts: list) -> list:
            vec["part"] = parts
            vec.update(stage(m, en, f"fold_emaxt{tree_cut.count}", **vec))
            tree_cut.count += 1
            return vec["part"]
        tree_cut.count = 0

        root = tree_reduce(m, vec.pop("part"), max_or, "emax", every=self.tree_every,
                           cut=tree_cut)
        vec.pop("part", None)
        valid, hb = vec.pop("valid"), vec.pop("hb")
        per_lane, vec = vec, {"valid": valid, "hb": hb}
        # the lanes' exponents less hb and post, beside the tree: a shift amount is then
        # root - that, one subtraction after the root
        for key in ("ex", "em"):
            offs = []
            for k, v in enumerate(per_lane[key]):
                a = Signal(range(-16 - 1 - post, 32), name=f"{key}o{k}")
                m.d.comb += a.eq(v - hb - post)
                offs.append(a)
            per_lane[key] = offs
        if two:     # the join: the lanes wait two cycles; the vector's max from both beats
            vec = join(m, en, valid, hb, root, per_lane, w, max_or)
        else:
            vec.update(root=root[:5], flags=root[5:], **per_lane)

        def cut(name):
            if name in self.regs and not (two and name == "emax"):
                vec.update(stage(m, en, f"fold_{name}", **vec))

        cut("emax")
        emax = Signal(6, name="emax")
        root = vec.pop("root")
        m.d.comb += emax.eq(root + vec.pop("hb"))
        vec["emax"] = emax

        def amount(a, name):      # root - a = emax - e + post, limited to wsp + 1 (shifts out to 0)
            d = Signal(signed(8), name=f"{name}_d")
            m.d.comb += d.eq(root - a)
            sh = Signal(range(wsp + 2), name=name)
            m.d.comb += sh.eq(Mux(gt_const(d, wsp + 1), wsp + 1, d))
            return sh

        vec["shx"] = [amount(vec["ex"][k], f"shx{k}") for k in range(w)]
        vec["shm"] = [amount(vec["em"][k], f"shm{k}") for k in range(w)]
        del vec["ex"], vec["em"]
        cut("shamt")

        def aligned(sig, sh, name):   # (sig << pre) * 2 >> sh: hi = the magnitude, c = round
            half = Signal(wsp + 1, name=f"{name}_half")
            m.d.comb += half.eq(Cat(Const(0, 1), sig << pre) >> sh)
            return half

        vec["hx"] = [aligned(vec["sig"][k], vec["shx"][k], f"ax{k}") for k in range(w)]
        vec["hm"] = [aligned(vec["ms"][k], vec["shm"][k], f"am{k}") for k in range(w)]
        vec["rx"] = Cat(*[sh != 0 for sh in vec["shx"]])
        vec["rm"] = Cat(*[sh != 0 for sh in vec["shm"]])
        for key in ("sig", "ms", "shx", "shm"):
            del vec[key]
        cut("align")

        m.d.comb += [self.u.eq(vec["emax"] - (15 + M - 2)), self.flags.eq(vec["flags"]),
                     self.o_valid.eq(vec["valid"])]
        W = M + 1
        for k in range(w):
            d = (self.mask >> k) & 1
            if two:         # D of lane k of beat 0 or of lane w + k of beat 1
                d = Mux(beat_of(vec["beat"], k, w), (self.mask >> (w + k)) & 1, d)
            s = Signal(name=f"fs{k}")
            t = Signal(name=f"ft{k}")
            m.d.comb += [s.eq(vec["s"][k] ^ d), t.eq(~vec["sm"][k] ^ d)]
            hx, hm = vec["hx"][k][1:], vec["hm"][k][1:]
            cx = vec["hx"][k][0] & vec["rx"][k]
            cm = vec["hm"][k][0] & vec["rm"][k]
            xs = Signal(W, name=f"fx{k}")        # (-1)^s X, M + 1 bits
            m.d.comb += xs.eq((hx[:M] ^ s.replicate(W)) + (cx ^ s))
            y = Signal(W, name=f"fy{k}")         # (-1)^d (X - MU)
            m.d.comb += y.eq(xs + (hm[:M] ^ t.replicate(W)) + (cm ^ t))
            pos = ~y[M] & y[M - 1]                      # y = 2^(M-1)
            neg = y[M] & ~y[:M - 1].any()               # y = -2^(M-1)
            m.d.comb += self.x[k].eq(Mux(pos, lim, Mux(neg, -lim, y[:M].as_signed())))
        return m


def join(m: Module, en, valid, hb, part, lanes: dict, w: int, max_or) -> dict:
    """Two beats: the lanes (``lanes``: name -> W values) and the lane max ``part`` go
    through two registers in a row (``fold_d1``, ``fold_d2``), moved on every enabled
    cycle; with beat 1 the vector's max (``fold_d1``'s, beat 0's, against beat 1's), and
    its key bit, into a register (``fold_root``) held while the vector's two beats leave
    ``fold_d2``, two cycles after each came (the beat index in
    :func:`hw.pipeline.beat_groups` copies, ``fold_beat``). Beats come in pairs, beat 1 in
    the enabled cycle after beat 0, so the two leave in a row as well; no multiplexer
    picks a beat.

    Returns:
        the vector in flight: valid, beat, hb, root, flags and the lanes of the beat.
    """
    jb = beat_index(m, en, "fold_join", valid)
    last = valid & jb
    d1 = stage(m, en, "fold_d1", reset=(), part=part, **lanes)
    full = Signal(len(part), name="fold_full")
    m.d.comb += full.eq(max_or(d1.pop("part"), part))
    d2 = stage(m, en, "fold_d2", reset=(), **d1)
    root = Signal(len(part), name="fold_root", reset_less=True)
    hb_r = Signal(name="fold_root_hb", reset_less=True)
    with when(m, en & last):
        m.d.sync += [root.eq(full), hb_r.eq(hb)]
    copies = beat_groups(w)
    v0 = Signal(name="fold_valid")
    beat = Signal(copies, name="fold_beat", attrs=REPLICA_ATTRS if copies > 1 else {})
    with when(m, en):
        m.d.sync += [v0.eq(last), beat.eq(v0.replicate(copies))]
    return {"valid": v0 | beat[0], "beat": beat, "hb": hb_r, "root": root[:5],
            "flags": root[5:], **d2}
