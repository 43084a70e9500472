"""Proof harnesses (miters) for the transform blocks: Amaranth components whose
one-bit output ``ok`` is 1 for every input exactly when the RTL meets its spec.

The specs are written here in exact integer arithmetic (Amaranth widens every
sum, so ``a + b`` never wraps) and take the Hadamard matrix from
``sim_models.fwht.hadamard`` (Sylvester order, the golden definition):

* ``spec="direct"``: ``y_i = sum_j H[i, j] * x_j``, one row sum per lane (the
  matrix itself; expensive for SAT beyond N = 16).
* ``spec="stages"``: the butterfly factorization ``H_N = B_{S-1} ... B_1 B_0``
  with ``B_s`` mapping lanes (i, i + 2^s), bit s of i clear, to (a + b, a - b),
  at exact widths. That the product of the B_s equals ``hadamard(N)`` is an
  integer matrix identity, checked exactly by :func:`check_factorization`
  (tests/test_formal.py); the tool proves RTL == the stage product.

Used by :mod:`verif.formal.prove` (yosys ``sat -prove ok 1``).
"""

from __future__ import annotations

import numpy as np
from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.fwht import FWHT
from hw.ifwht import FOLD_ALIGN_CYCLES, BlockFWHT
from sim_models.fwht import hadamard

SPECS = ("direct", "stages")


def stage_matrix(n: int, s: int) -> np.ndarray:
    """Butterfly stage B_s as an int64 [n, n] matrix: (i, i + 2^s) -> (a + b, a - b)."""
    h = 1 << s
    b = np.zeros((n, n), dtype=np.int64)
    for i in range(n):
        if i & h:
            b[i, i - h], b[i, i] = 1, -1
        else:
            b[i, i], b[i, i + h] = 1, 1
    return b


def check_factorization(n: int) -> None:
    """Exact integer checks behind the stage proofs: B_{S-1} ... B_0 == H_N and H_N H_N == N I.

    Raises:
        AssertionError: an identity does not hold for ``n``.
    """
    prod = np.eye(n, dtype=np.int64)
    for s in range(n.bit_length() - 1):
        prod = stage_matrix(n, s) @ prod
    h = hadamard(n)
    assert np.array_equal(prod, h), f"stage product != hadamard({n})"
    assert np.array_equal(h @ h, n * np.eye(n, dtype=np.int64)), f"H H != N I for n={n}"


def spec_transform(lanes: list, spec: str) -> list:
    """H x on a list of Amaranth values, exact (see module docstring)."""
    n = len(lanes)
    if spec == "direct":
        h = hadamard(n)
        out = []
        for i in range(n):
            acc = 0
            for j in range(n):
                acc = acc + lanes[j] if h[i, j] > 0 else acc - lanes[j]
            out.append(acc)
        return out
    if spec == "stages":
        return butterflies(lanes, 0, n.bit_length() - 1)
    raise ValueError(f"spec must be one of {SPECS}, got {spec!r}")


def butterflies(lanes: list, first: int, stop: int) -> list:
    """Stages B_first .. B_(stop-1) applied to a list of Amaranth values, exact widths."""
    n = len(lanes)
    for s in range(first, stop):
        h = 1 << s
        lanes = [lanes[i] + lanes[i + h] if not i & h else lanes[i - h] - lanes[i]
                 for i in range(n)]
    return lanes


def _check_spec(spec: str) -> str:
    if spec not in SPECS:
        raise ValueError(f"spec must be one of {SPECS}, got {spec!r}")
    return spec


class FWHTMiter(wiring.Component):
    """``ok`` = (``hw.fwht.FWHT(n, in_width, latency=0)`` output == H x) for input ``x``.

    Args:
        n, in_width: the FWHT parameters (latency 0: the combinational core;
            the registers are covered by :class:`FWHTPipeMiter`).
        spec: ``"direct"`` or ``"stages"``.
        dut: a component to check instead of the FWHT (mutation tests); same ports.
    """

    def __init__(self, n: int, in_width: int, spec: str = "stages", dut=None):
        self.n, self.in_width, self.spec = n, in_width, _check_spec(spec)
        self.dut = dut if dut is not None else FWHT(n, in_width, 0)
        super().__init__({"x": In(data.ArrayLayout(signed(in_width), n)), "ok": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        m.d.comb += [dut.x.eq(self.x), dut.en.eq(1), dut.i_valid.eq(1)]
        want = spec_transform([self.x[i] for i in range(self.n)], self.spec)
        m.d.comb += self.ok.eq(Cat(*(dut.y[i] == want[i] for i in range(self.n))).all())
        return m


def signed_result(fw, i: int):
    """Lane i's result ``S_i = (-1)^flip_i y_i`` of a ``BlockFWHT`` (its block swap,
    hw/ifwht.py), one bit wider than ``y`` so that the negation is exact."""
    y = fw.y[i]
    return Mux(fw.flip[i], -y, y)


def check_swap(n: int, block: int) -> None:
    """Exact integer checks behind the block swap's proof (hw/ifwht.py), for every t:
    H_N P_t == diag((-1)^popcount((i // G) & t)) H_N and P_t commutes with the inner
    stages B_0 .. B_(log2 G - 1), where P_t moves block k ^ t into slot k.

    Raises:
        AssertionError: an identity does not hold.
    """
    nb = n // block
    h = hadamard(n)
    inner = np.eye(n, dtype=np.int64)
    for s in range(block.bit_length() - 1):
        inner = stage_matrix(n, s) @ inner
    idx = np.arange(n)
    for t in range(nb):
        pt = np.zeros((n, n), dtype=np.int64)
        pt[idx, ((idx // block) ^ t) * block + idx % block] = 1
        sign = np.array([-1 if bin((i // block) & t).count("1") % 2 else 1 for i in idx])
        assert np.array_equal(h @ pt, sign[:, None] * h), f"H P_{t} != D_{t} H (n={n})"
        assert np.array_equal(pt @ inner, inner @ pt), f"P_{t} B_inner != B_inner P_{t}"


class BlockFWHTMiter(wiring.Component):
    """``ok`` = (``hw.ifwht.BlockFWHT`` output == H (p_i << d_{i // G})) whenever every
    d_k <= max_align and some d_k == 0 (d_k = ef_k - ef_min in the read path).
    With the block swap (``dut.align == "swap"``) the claim is ``y == B_outer P_t (p <<
    d)`` (after the inner stages) and ``flip`` == the signs of :func:`check_swap`, t the
    lowest block with d_t = 0: with that check, ``(-1)^flip y == H (p << d)``.

    This is the read path's spec (hw/ifwht.py): output S with (H yhat)_i =
    S_i * 2^(ef_min + c), lane i of block k entering as p_i * 2^(d_k + ef_min + c).
    Latency 0 (the combinational core).

    Args:
        n, block, in_width, max_align: the BlockFWHT parameters (``in_shape`` signed).
        spec: ``"direct"`` or ``"stages"``.
        dut: a component to check instead (mutation tests); same ports.
    """

    def __init__(self, n: int, block: int, in_width: int, max_align: int, spec: str = "stages",
                 dut=None):
        self.n, self.block, self.spec = n, block, _check_spec(spec)
        self.max_align = max_align
        self.dut = dut if dut is not None else BlockFWHT(n, block, signed(in_width), 0,
                                                         max_align=max_align)
        super().__init__({
            "p": In(data.ArrayLayout(signed(in_width), n)),
            "d": In(data.ArrayLayout(self.dut.d_width, n // block)),
            "ok": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        nb = self.n // self.block
        m.d.comb += [dut.p.eq(self.p), dut.d.eq(self.d), dut.en.eq(1), dut.i_valid.eq(1)]
        g, log2n = self.block, self.n.bit_length() - 1
        d = [self.d[k] for k in range(nb)]
        swap = getattr(dut, "align", "lane") == "swap"
        if swap:
            # the block swap (hw/ifwht.py): t = the lowest block with d_t = 0, slot k <-
            # block k ^ t; H P_t = diag((-1)^popcount(r & t)) H and P_t B_inner = B_inner
            # P_t (check_swap), so H (p << d) = diag(flip) B_outer P_t (p << d)
            t = Const(0, range(nb))
            for k in range(nb - 1, -1, -1):
                t = Mux(d[k] == 0, k, t)

            def pick(values):           # values[t], a 2:1 multiplexer per bit of t
                j = 0
                while len(values) > 1:
                    values = [Mux(t[j], values[2 * q + 1], values[2 * q])
                              for q in range(len(values) // 2)]
                    j += 1
                return values[0]

            def perm(lanes):
                return [pick([lanes[((i // g) ^ u) * g + i % g] for u in range(nb)])
                        for i in range(self.n)]
            shifts = [pick([d[k ^ u] for u in range(nb)]) for k in range(nb)]
            flip_want = Cat(*((t & (i // g)).xor() for i in range(self.n)))
        else:
            def perm(lanes):
                return lanes
            shifts, flip_want = d, Const(0, self.n)
        if self.spec == "stages":
            # H (p << d) = B_outer (align (B_inner p)): inside a block every lane has the
            # same shift d_k, and (a << d) +- (b << d) == (a +- b) << d in exact integers
            inner = perm(butterflies([self.p[i] for i in range(self.n)], 0, g.bit_length() - 1))
            aligned = [inner[i] << shifts[i // g] for i in range(self.n)]
            want = butterflies(aligned, g.bit_length() - 1, log2n)
        else:
            want = spec_transform(perm([self.p[i] << d[i // g] for i in range(self.n)]),
                                  "direct")
        # the read path's contract: d_k = ef_k - ef_min, so every d_k <= max_align and
        # some d_k == 0 (with one block, d is 0 and the RTL has no shifter)
        d_ok = (Cat(*(self.d[k] <= self.max_align for k in range(nb))).all()
                & Cat(*(self.d[k] == 0 for k in range(nb))).any())
        match = Cat(*(dut.y[i] == want[i] for i in range(self.n))).all() & (dut.flip == flip_want)
        m.d.comb += self.ok.eq(~d_ok | match)
        return m


class RoundTripMiter(wiring.Component):
    """``ok`` = (BlockFWHT(FWHT(x)) == N x): the inverse path returns N times the
    forward transform's input (one block exponent: d = 0). Latency 0.

    Args:
        n, block, in_width: the forward FWHT's input width; the BlockFWHT takes its
            output width (``in_width + log2 N``).
        fwd, inv: components to check instead (mutation tests).
    """

    def __init__(self, n: int, block: int, in_width: int, fwd=None, inv=None):
        self.n = n
        self.fwd = fwd if fwd is not None else FWHT(n, in_width, 0)
        self.inv = inv if inv is not None else BlockFWHT(n, block, signed(self.fwd.out_width), 0)
        super().__init__({"x": In(data.ArrayLayout(signed(in_width), n)), "ok": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.fwd, m.submodules.inv = fwd, inv = self.fwd, self.inv
        m.d.comb += [fwd.x.eq(self.x), fwd.en.eq(1), fwd.i_valid.eq(1),
                     inv.p.eq(fwd.y), inv.d.eq(0), inv.en.eq(1), inv.i_valid.eq(1)]
        m.d.comb += self.ok.eq(Cat(*(signed_result(inv, i) == self.x[i] * self.n
                                     for i in range(self.n))).all())
        return m


class FWHTPipeMiter(wiring.Component):
    """The pipelined FWHT against H applied to its input ``latency`` enabled cycles earlier.

    A shadow delay line (``latency`` registers of x that advance with ``en``, as
    the FWHT's do) and a counter of enabled cycles (saturating at ``latency``);
    ``Assert``: once ``latency`` enabled cycles have passed, y == H (delayed x)
    and ``o_valid`` == the delayed ``i_valid``. ``en``, ``i_valid`` and ``x`` are
    free every cycle (checked by bounded model checking, :mod:`verif.formal.prove`).

    Args:
        n, in_width, latency: the FWHT parameters (latency >= 1).
        spec: ``"direct"`` or ``"stages"``.
        dut: a component to check instead (mutation tests); same ports.
    """

    def __init__(self, n: int, in_width: int, latency: int, spec: str = "stages", dut=None):
        if latency < 1:
            raise ValueError(f"latency must be >= 1 (latency 0 is FWHTMiter), got {latency}")
        self.n, self.latency, self.spec = n, latency, _check_spec(spec)
        self.dut = dut if dut is not None else FWHT(n, in_width, latency)
        super().__init__({
            "en": In(1), "i_valid": In(1),
            "x": In(data.ArrayLayout(signed(in_width), n)),
        })

    def elaborate(self, platform):
        from amaranth.hdl import Assert
        m = Module()
        m.submodules.dut = dut = self.dut
        m.d.comb += [dut.x.eq(self.x), dut.en.eq(self.en), dut.i_valid.eq(self.i_valid)]
        xs, vs = self.x, self.i_valid
        for r in range(self.latency):
            xr = Signal.like(self.x, name=f"shadow_x{r}")
            vr = Signal(name=f"shadow_v{r}")
            with m.If(self.en):
                m.d.sync += [xr.eq(xs), vr.eq(vs)]
            xs, vs = xr, vr
        filled = Signal(range(self.latency + 1))
        with m.If(self.en & (filled < self.latency)):
            m.d.sync += filled.eq(filled + 1)
        want = spec_transform([xs[i] for i in range(self.n)], self.spec)
        match = Cat(*(dut.y[i] == want[i] for i in range(self.n))).all()
        with m.If(filled == self.latency):
            m.d.comb += Assert(match & (dut.o_valid == vs))
        return m


class FloatMiter(wiring.Component):
    """``ok`` = (one lane of ``hw.tofloat.FloatPrep`` -> ``FloatPack`` == the rounding of
    ``(-1)^D S 2^T`` to the input type) for every y with |y| < 2^(W-1), flip, D and every
    ef_min in range.

    The spec, written from the definition (docs/FORMAT.md 5, round_to_input_type) with
    Amaranth's own shifts and comparisons: ``a = |y|``, L its leading one (a priority
    chain), binade ``E = max(L + T, 1 - bias)``, ``q = E - mb`` the ulp's exponent;
    ``sig = a 2^(T - q)`` exact when T >= q, else ``a >> (q - T)`` rounded to nearest
    even from the remainder compared with half the divisor; ``sig = 2^(mb+1)`` moves to
    the next binade; a subnormal has field 0; a biased exponent of 2^e - 1 or more
    saturates to the largest finite pattern; a = 0 gives +-0. Sign: D xor (S < 0)
    (an exact zero is +0 before D), S = (-1)^flip y.

    Args:
        consts: the ``hw.tofloat.FloatConsts`` of the configuration.
        ef_width: bits of ef_min.
    """

    def __init__(self, consts, ef_width: int, dut=None):
        from hw.tofloat import FloatPack, FloatPrep
        self.c, self.ef_width = consts, ef_width
        self.prep = FloatPrep(1, consts.y_width, ef_width, consts)
        self.pack = dut if dut is not None else FloatPack(1, consts)
        super().__init__({"y": In(signed(consts.y_width)), "ef": In(ef_width), "mask": In(1),
                          "flip": In(1), "ok": Out(1)})

    def elaborate(self, platform):
        from hw.tofloat import PREP_PORTS
        m = Module()
        c = self.c
        m.submodules.prep, m.submodules.pack = prep, pack = self.prep, self.pack
        m.d.comb += [prep.y[0].eq(self.y), prep.ef_min.eq(self.ef), prep.mask.eq(self.mask),
                     prep.flip.eq(self.flip)]
        m.d.comb += [getattr(pack, k).eq(getattr(prep, k)) for k in PREP_PORTS]
        w, mb, bias = c.y_width, c.m_bits, c.bias
        y = self.y
        a = Signal(w - 1, name="spec_a")
        m.d.comb += a.eq(Mux(y < 0, -y, y))
        lead = Const(0, range(w))
        for j in range(w - 1):                       # priority chain, lowest bit first
            lead = Mux(a[j], j, lead)
        t = Signal(signed(8), name="spec_t")
        m.d.comb += t.eq(self.ef + c.exp_add)
        e = Signal(signed(10), name="spec_e")          # binade, clamped at the subnormals
        m.d.comb += e.eq(Mux(lead + t > 1 - bias, lead + t, 1 - bias))
        d = Signal(signed(10), name="spec_d")          # T - q: left shift if >= 0
        m.d.comb += d.eq(t - (e - mb))
        ls = Signal(range(64), name="spec_ls")
        rs = Signal(range(128), name="spec_rs")
        m.d.comb += [ls.eq(Mux(d >= 0, d, 0)), rs.eq(Mux(d < 0, -d, 0))]
        quo = Signal(w - 1, name="spec_quo")
        m.d.comb += quo.eq(a >> rs)
        rem = Signal(w - 1, name="spec_rem")
        m.d.comb += rem.eq(a - (quo << rs))
        half = Signal(w, name="spec_half")
        m.d.comb += half.eq((Const(1, w + 1) << rs)[1:])         # 2^(rs-1), 0 for rs = 0
        up = (rs != 0) & ((rem > half) | ((rem == half) & quo[0]))
        sig = Signal(mb + 3, name="spec_sig")
        m.d.comb += sig.eq(Mux(d >= 0, a << ls, quo + up))
        field = Signal(signed(12), name="spec_field")
        mant = Signal(mb, name="spec_mant")
        with m.If(sig[mb + 1]):                       # 2^(mb+1): next binade
            m.d.comb += [field.eq(e + 1 + bias), mant.eq(0)]
        with m.Elif(sig[mb]):
            m.d.comb += [field.eq(e + bias), mant.eq(sig[:mb])]
        with m.Else():                                # subnormal (e = 1 - bias)
            m.d.comb += [field.eq(0), mant.eq(sig[:mb])]
        maxf = c.max_finite
        mag = Signal(15, name="spec_mag")
        m.d.comb += mag.eq(Mux(a == 0, 0, Mux(field >= (1 << c.e_bits) - 1, maxf,
                                                Cat(mant, field[:c.e_bits]))))
        sneg = Mux(y == 0, 0, (y < 0) ^ self.flip) ^ self.mask
        want = Cat(mag, sneg)
        in_range = ((self.ef >= c.ef_lo) & (self.ef <= c.ef_hi)
                    & (y != -(1 << (w - 1))))                   # |y| < 2^(W-1)
        m.d.comb += self.ok.eq(~in_range | (pack.bits[0] == want))
        return m


def due_beats(m: Module, en, done, pair, stages: int):
    """Shadow of a two-beat pipeline for a BMC harness: ``done`` (a pair completes) and
    ``pair`` (its data) delayed by ``stages`` enabled cycles, then (due0, due1, held): high
    in the first / second enabled cycle after that, and the pair, held for both."""
    for r in range(stages):
        dn, pr = Signal(name=f"shadow_done{r}"), Signal(len(pair), name=f"shadow_pair{r}")
        with m.If(en):
            m.d.sync += [dn.eq(done), pr.eq(pair)]
        done, pair = dn, pr
    due0, due1 = Signal(), Signal()          # output beat 0, then beat 1
    held = Signal(len(pair))
    with m.If(en):
        m.d.sync += [due0.eq(done), due1.eq(due0)]
        with m.If(done):
            m.d.sync += held.eq(pair)
    return due0, due1, held


def assert_beats(m: Module, o_valid, due0, due1, got, want) -> None:
    """``Assert`` that ``o_valid`` is high exactly when an output beat is due, and that the
    W lanes ``got`` are ``want[:W]`` on output beat 0 and ``want[W:]`` on beat 1."""
    from amaranth.hdl import Assert
    w = len(got)
    m.d.comb += Assert(o_valid == (due0 | due1))
    with m.If(due0):
        m.d.comb += Assert(Cat(*(got[i] == want[i] for i in range(w))).all())
    with m.If(due1):
        m.d.comb += Assert(Cat(*(got[i] == want[w + i] for i in range(w))).all())


class FoldFWHTMiter(wiring.Component):
    """The FWHT of N points streamed as two beats of W = N/2 lanes
    (``hw.fwht.FWHT(n, in_width, latency, lanes=n // 2)``: the W-point network, then
    ``fold_stage``) against H_N of the last two input beats.

    ``en``, ``i_valid`` and ``x`` (W lanes) are free every cycle. The harness takes the
    valid beats in pairs (beat 0 = lanes [0, W), beat 1 = [W, N); the first valid beat
    after reset is a beat 0) and, when a pair is complete, keeps it; a shadow delay line
    of ``latency`` enabled cycles then says when the output beats are due: ``Assert``
    that ``o_valid`` is high exactly in the two enabled cycles after a pair's delay and
    that ``y`` is lanes [0, W) of H_N (pair), then lanes [W, N).

    Args:
        n, in_width, latency: the FWHT parameters (latency of the W-point network).
        spec: ``"direct"`` or ``"stages"``.
    """

    def __init__(self, n: int, in_width: int, latency: int, spec: str = "stages"):
        self.n, self.w, self.latency, self.spec = n, n // 2, latency, _check_spec(spec)
        self.dut = FWHT(n, in_width, latency, lanes=self.w)
        super().__init__({
            "en": In(1), "i_valid": In(1),
            "x": In(data.ArrayLayout(signed(in_width), self.w)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        en, w = self.en, self.w
        m.d.comb += [dut.x.eq(self.x), dut.en.eq(en), dut.i_valid.eq(self.i_valid)]
        beat = Signal()                          # index of the next valid input beat
        first = Signal.like(self.x)              # beat 0 of the pair in progress
        with m.If(en & self.i_valid):
            m.d.sync += beat.eq(~beat)
            with m.If(~beat):
                m.d.sync += first.eq(self.x)
        done = self.i_valid & beat               # a pair completes with this beat
        pair = Cat(first, self.x)
        # the W-point network's registers
        due0, due1, held = due_beats(m, en, done, pair, self.latency)
        xw = len(pair) // self.n
        lanes = [held[i * xw:(i + 1) * xw].as_signed() for i in range(self.n)]
        assert_beats(m, dut.o_valid, due0, due1, dut.y, spec_transform(lanes, self.spec))
        return m


class FoldAlignMiter(wiring.Component):
    """The read path's FWHT of N points as two beats of one block each with the block
    alignment in the fold (``hw.ifwht.BlockFWHT(n, n // 2, ..., lanes=n // 2,
    align="fold")``: the W-point network, then ``fold_align_stage``) against
    ``H_N (p << d)`` of the last two input beats.

    ``en``, ``i_valid``, ``p`` (W lanes) and ``d`` (the beat's shift amount) are free
    every cycle, under the read path's contract (``Assume``): a taken beat has
    ``d <= max_align``, and of a pair's two d one is 0. The harness pairs the taken beats
    (the first after reset is a beat 0) and a shadow delay line of ``latency`` +
    FOLD_ALIGN_CYCLES - 2 enabled cycles says when the output beats are due: ``Assert`` that ``o_valid`` is high exactly
    in the two enabled cycles after that, with ``(-1)^flip y`` = lanes [0, W) of
    ``H_N (p << d)`` (pair), then lanes [W, N).

    With a fold window D (``window``; ``hw.ifwht``, "Fold window"): lane i of the pair
    is ``RO(S_i / 2^e)`` with e = k floor(max(d_0 | d_1 - D, 0) / k) (k: the window's step,
    ``hw.options.FoldOptions.window_step``) where X_(i mod W) != 0 (X = H_W of the beat with the
    larger d, unshifted) and S_i exact elsewhere; ``alt`` is X != 0.

    Args:
        n, in_width, max_align, latency: the BlockFWHT parameters (``in_shape`` signed;
            latency of the W-point network).
        spec: ``"direct"`` or ``"stages"``.
        window: the fold window D, or None (exact).
    """

    def __init__(self, n: int, in_width: int, max_align: int, latency: int,
                 spec: str = "stages", window: int | None = None):
        self.n, self.w, self.latency, self.spec = n, n // 2, latency, _check_spec(spec)
        self.max_align = max_align
        self.dut = BlockFWHT(n, n // 2, signed(in_width), latency, max_align=max_align,
                             align="fold", lanes=self.w, window=window)
        self.window = self.dut.window
        super().__init__({
            "en": In(1), "i_valid": In(1),
            "p": In(data.ArrayLayout(signed(in_width), self.w)),
            "d": In(self.dut.d_width),
        })

    def elaborate(self, platform):
        from amaranth.hdl import Assume
        m = Module()
        m.submodules.dut = dut = self.dut
        en, w = self.en, self.w
        m.d.comb += [dut.p.eq(self.p), dut.d[0].eq(self.d), dut.en.eq(en),
                     dut.i_valid.eq(self.i_valid)]
        beat = Signal()                          # index of the next valid input beat
        first = Signal.like(self.p)              # beat 0 of the pair in progress
        d0 = Signal.like(self.d)
        take = en & self.i_valid
        with m.If(take):
            m.d.sync += beat.eq(~beat)
            with m.If(~beat):
                m.d.sync += [first.eq(self.p), d0.eq(self.d)]
        m.d.comb += Assume(~take | (self.d <= self.max_align))
        m.d.comb += Assume(~(take & beat) | (d0 == 0) | (self.d == 0))
        done = self.i_valid & beat               # a pair completes with this beat
        pair = Cat(first, self.p, d0, self.d)
        # the network's registers and the fold's, less the two output beats (due0, due1)
        due0, due1, held = due_beats(m, en, done, pair, self.latency + FOLD_ALIGN_CYCLES - 2)
        xw, dw = len(Value.cast(self.p)) // w, len(self.d)
        lanes = [held[i * xw:(i + 1) * xw].as_signed() for i in range(self.n)]
        ds = [held[2 * w * xw:2 * w * xw + dw], held[2 * w * xw + dw:]]
        want = spec_transform([lanes[i] << ds[i // w] for i in range(self.n)], self.spec)
        got = [Mux(dut.flip[i], -dut.y[i], dut.y[i]) for i in range(w)]
        if self.window:
            d = ds[0] | ds[1]
            lb = self.dut.window_step.bit_length() - 1      # e a multiple of the step
            e = Mux(d > self.window, (d - self.window)[:len(d)] >> lb << lb, 0)
            big = [Mux(ds[0] == 0, lanes[w + k], lanes[k]) for k in range(w)]
            alt = [x != 0 for x in spec_transform(big, self.spec)]
            want = [Mux(alt[i % w], _round_odd(v, e), v) for i, v in enumerate(want)]
            got += [dut.alt[i] for i in range(w)]
            want = want[:w] + alt + want[w:] + alt
        assert_beats(m, dut.o_valid, due0, due1, got, want)
        return m


def _round_odd(v, e):
    """RO(v / 2^e) of a signed Value by a Value e: the arithmetic shift, bit 0 set when any
    of the e bits shifted out is set."""
    v = Value.cast(v)
    lost = (v.as_unsigned() & ((Const(1, len(v) + 1) << e) - 1)[:len(v)]) != 0
    return (v >> e) | lost


# ---- key front end (one lane; docs/FORMAT.md 8, sim_models.keyscale.key_front) -------------

#: 65504, the largest finite fp16, in units of 2^-24 (the smallest subnormal).
FP16_MAX_UNITS = 0x7FF << 29


def fp16_units(m: Module, b, name: str) -> Signal:
    """|b| of finite fp16 bits ``b`` as an integer in units of 2^-24 (exact, 41 bits)."""
    ex = b[10:15]
    sig = Signal(11, name=f"{name}_sig")
    sh = Signal(5, name=f"{name}_sh")
    u = Signal(41, name=f"{name}_u")
    m.d.comb += [sig.eq(Cat(b[:10], ex.any())), sh.eq(Mux(ex.any(), ex - 1, 0)),
                 u.eq(sig << sh)]
    return u


def units_to_fp16(m: Module, a, name: str) -> Signal:
    """fp16 magnitude bits (15) of the integer ``a`` (units of 2^-24): round to nearest even
    at the fp16 ulp (2^max(L - 10, 0) units for a leading one at bit L), a value past 65504
    saturating to 0x7BFF. Written from the definition: a priority chain for L, the quotient
    and remainder of the division by the ulp, the remainder against half the ulp."""
    w = len(a)
    lead = Const(0, range(w))
    for j in range(w):                           # priority chain, lowest bit first
        lead = Mux(a[j], j, lead)
    q = Signal(range(w), name=f"{name}_q")
    m.d.comb += q.eq(Mux(lead > 10, lead - 10, 0))
    quo, rem = Signal(w, name=f"{name}_quo"), Signal(w, name=f"{name}_rem")
    half = Signal(w + 1, name=f"{name}_half")
    m.d.comb += [quo.eq(a >> q), rem.eq(a - (quo << q)), half.eq((Const(1, w + 1) << q)[1:])]
    up = (q != 0) & ((rem > half) | ((rem == half) & quo[0]))
    sig = Signal(13, name=f"{name}_s")
    m.d.comb += sig.eq(quo + up)
    # sig 2^q units; 2^11: the next binade. fp16 field E >= 1 has the ulp 2^(E-1) units
    qq, s2 = Signal(range(w + 2), name=f"{name}_qq"), Signal(12, name=f"{name}_s2")
    m.d.comb += [qq.eq(Mux(sig[11], q + 1, q)), s2.eq(Mux(sig[11], sig[1:], sig))]
    field = Signal(range(w + 3), name=f"{name}_f")
    m.d.comb += field.eq(Mux(s2[10], qq + 1, 0))
    out = Signal(15, name=f"{name}_o")
    m.d.comb += out.eq(Mux(field >= 31, 0x7BFF, Cat(s2[:10], field[:5])))
    return out


def fp16_fields(m: Module, b, name: str):
    """(significand with hidden bit, max(E, 1)) of fp16 bits, as the key front end reads them."""
    from hw.keyfront import _fields
    return _fields(m, b, name)


class KeyScaleMiter(wiring.Component):
    """The key front end's scaling (steps 0-1 of ``hw.keyfront``: decode, shift, round)
    against the definition ``y = RN16(x 2^e)`` (``sim_models.keyscale.scale_keys``), for
    every finite fp16 x and every e in ``LOG2_S_RANGE``: the unpacked output (significand
    with hidden bit, max(E, 1), sign) equals the fields of y.

    The spec: x in units of 2^-24; e >= 0: ``x << e``, exact, past 65504 saturating
    (an 11-bit significand above 65504 is >= 65536, which rounds to inf); e < 0: the
    quotient by 2^-e rounded to nearest even (a value below the subnormal step; a normal
    result loses no bits); then :func:`units_to_fp16` (exact here), x's sign (+-0 kept)."""

    def __init__(self):
        super().__init__({"x": In(16), "e": In(signed(5)), "ok": Out(1)})

    def elaborate(self, platform):
        from hw import keyfront as kf
        from sim_models.keyscale import LOG2_S_RANGE
        m = Module()
        x, e = self.x, self.e
        y = kf.scale_round(m, kf.scale_shift(m, kf.decode_lane(m, x, "dc"), e, "sc"), "sr")
        xu = fp16_units(m, x, "spec_x")
        sh = Signal(5, name="spec_sh")
        q, rem = Signal(41, name="spec_q"), Signal(41, name="spec_rem")
        half = Signal(42, name="spec_half")
        m.d.comb += [sh.eq(-e), q.eq(xu >> sh), rem.eq(xu - (q << sh)),
                     half.eq((Const(1, 42) << sh)[1:])]
        up = (sh != 0) & ((rem > half) | ((rem == half) & q[0]))
        big = Signal(57, name="spec_big")
        m.d.comb += big.eq(xu << e[:4])
        yu = Signal(41, name="spec_yu")
        m.d.comb += yu.eq(Mux(e >= 0, Mux(big > FP16_MAX_UNITS, FP16_MAX_UNITS, big), q + up))
        sig, eff = fp16_fields(m, Cat(units_to_fp16(m, yu, "spec_r"), x[15]), "spec_y")
        lo, hi = LOG2_S_RANGE
        care = (x[10:15] != 0x1F) & (e >= lo) & (e <= hi)
        m.d.comb += self.ok.eq(~care | ((y["sig"] == sig) & (y["eff"] == eff)
                                        & (y["s"] == x[15])))
        return m


class KeySubMiter(wiring.Component):
    """The key front end's centering (steps 2-3 of ``hw.keyfront``: swap, align, sum,
    count, norm, round) against the definition ``RNE_fp16(y - mu)`` (saturating at
    +-65504; an exact zero is +0 unless y = -0 and mu = +0), for every pair of finite
    fp16 y, mu whose exponents max(E, 1) differ by ``d`` (one proof per d in -29..29
    covers every pair; the split keeps each SAT problem small).

    The spec: y and mu in units of 2^-24, the exact signed difference, its magnitude
    through :func:`units_to_fp16`. Together with :class:`KeyScaleMiter` (which shows that
    the scaling hands over exactly the fields of ``RN16(x 2^e)``), the lane equals
    ``sim_models.keyscale.key_front`` for every input and table entry; the lane logic
    is the same at every N."""

    def __init__(self, d: int):
        if not -29 <= d <= 29:
            raise ValueError(f"d (exponent difference) must be in -29..29, got {d}")
        self.d = d
        super().__init__({"y": In(16), "mu": In(16), "ok": Out(1)})

    def elaborate(self, platform):
        from hw import keyfront as kf
        m = Module()
        y, mu = self.y, self.mu
        sig, eff = fp16_fields(m, y, "dut_y")
        sw = kf.align_swap(m, {"sig": sig, "eff": eff, "s": y[15]}, mu, "sw")
        nc = kf.norm_count(m, kf.add_lane(m, kf.align_shift(m, sw, "al"), "ad"), "nc")
        got = kf.round_lane(m, kf.norm_shift(m, nc, "nm"), "rd")
        yu, mu_u = fp16_units(m, y, "spec_y"), fp16_units(m, mu, "spec_m")
        dd = Signal(signed(43), name="spec_d")
        m.d.comb += dd.eq(Mux(y[15], -yu, yu) - Mux(mu[15], -mu_u, mu_u))
        a = Signal(42, name="spec_a")
        m.d.comb += a.eq(Mux(dd < 0, -dd, dd))
        zsign = y[15] & ~mu[15] & (yu == 0) & (mu_u == 0)
        want = Cat(units_to_fp16(m, a, "spec_r"), Mux(dd == 0, zsign, dd < 0))
        _, em = fp16_fields(m, mu, "spec_mf")
        diff = Signal(signed(7), name="spec_diff")
        m.d.comb += diff.eq(eff - em)
        care = (y[10:15] != 0x1F) & (mu[10:15] != 0x1F) & (diff == self.d)
        m.d.comb += self.ok.eq(~care | (got == want))
        return m
