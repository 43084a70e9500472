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


# ---- key front end (docs/FORMAT.md 8, the folded rule: sim_models.bfp.to_block_fp_keys) -------

class KeyFoldMiter(wiring.Component):
    """The key front end (``hw.keyfold.FoldFrontEnd``, combinational, table
    entries as ports) against its definition ``sim_models.bfp.to_block_fp_keys`` (with
    ``key`` = 1; ``key`` = 0 drops the headroom bit, the plain vectors' path), for every
    vector of N fp16 keys, every finite mu_s and every e in ``LOG2_S_RANGE`` per lane
    (``key`` = 0: the identity entry, mu_s = +0 and e = 0, as the table's read register
    loads it): every lane's mantissa, u and the flags equal the spec's.

    The spec, written apart from the RTL in exact integers: FORMAT.md 3.1's decode, the
    exponent add and its saturation, ``emax`` as the plain maximum over the lanes (+
    ``key``), each of X and MU aligned by ``(v + 2^(sh-1)) >> sh`` (``sh`` > 0) or
    ``v << -sh``, then ``(-1)^d clamp(X - MU)``. To split the proof: ``root`` (optional)
    keeps one value of the lanes' maximum max(Ex, Em) (1..30), ``lane`` compares one
    lane's mantissa (u and the flags always). The lane logic is the same at every N (an
    N-lane tree of the same maximum)."""

    def __init__(self, n: int = 8, mant_bits: int = 12, root: int | None = None,
                 lane: int | None = None):
        from sim_models.params import FormatParams
        if root is not None and not 1 <= root <= 30:
            raise ValueError(f"root (the lanes' maximum exponent) must be in 1..30, got {root}")
        self.p = FormatParams(n=n, block=min(8, n), mant_bits=mant_bits)
        if lane is not None and not 0 <= lane < n:
            raise ValueError(f"lane must be in 0..{n - 1}, got {lane}")
        self.root, self.lane = root, lane
        super().__init__({"bits": In(16 * n), "mu": In(data.ArrayLayout(16, n)),
                          "e": In(data.ArrayLayout(signed(5), n)), "key": In(1), "ok": Out(1)})

    def elaborate(self, platform):
        from hw.keyfold import FoldFrontEnd
        from sim_models.keyscale import LOG2_S_RANGE
        from sim_models.signs import sign_mask_int
        m = Module()
        p, n, M = self.p, self.p.n, self.p.mant_bits
        m.submodules.dut = dut = FoldFrontEnd(p, None, ())
        m.d.comb += [dut.bits.eq(self.bits), dut.key.eq(self.key), dut.en.eq(1),
                     dut.i_valid.eq(1)]
        m.d.comb += [dut.mu[k].eq(self.mu[k]) for k in range(n)]
        m.d.comb += [dut.e[k].eq(self.e[k]) for k in range(n)]
        lo, hi = LOG2_S_RANGE
        care = Const(1, 1)
        lanes, flags, top = [], Const(0, 2), None
        for k in range(n):
            b, mb_in, e = self.bits[16 * k:16 * k + 16], self.mu[k], self.e[k]
            E, F = b[10:15], b[:10]
            special = E == 31
            nan, inf = special & (F != 0), special & (F == 0)
            ex = Signal(signed(8), name=f"spec_ex{k}")
            m.d.comb += ex.eq(Mux(special, Mux(nan, 1, 30), Mux(E == 0, 1, E))
                              + Mux(special, 0, e))
            sig0 = Mux(nan, 0, Mux(inf, 2047, Mux(E == 0, F, F + 1024)))
            sat = ex > 30
            exs = Signal(signed(8), name=f"spec_exs{k}")
            sig = Signal(11, name=f"spec_sig{k}")
            m.d.comb += [exs.eq(Mux(sat, 30, ex)), sig.eq(Mux(sat, 2047, sig0))]
            mb = Signal(16, name=f"spec_mb{k}")
            m.d.comb += mb.eq(Mux(special, 0, mb_in))
            em = Signal(signed(8), name=f"spec_em{k}")
            sigm = Signal(11, name=f"spec_sigm{k}")
            m.d.comb += [em.eq(Mux(mb[10:15] == 0, 1, mb[10:15])),
                         sigm.eq(Mux(mb[10:15] == 0, mb[:10], mb[:10] + 1024))]
            h = Mux(exs > em, exs, em)
            top = h if top is None else Mux(h > top, h, top)
            care = care & (e >= lo) & (e <= hi) & (mb_in[10:15] != 31) \
                & (self.key | ((e == 0) & (mb_in == 0)))
            lanes.append((Mux(nan, 0, b[15]), exs, sig, mb[15], em, sigm))
            flags = flags | Cat(nan, inf)
        rt = Signal(signed(8), name="spec_root")
        emax = Signal(signed(8), name="spec_emax")
        m.d.comb += [rt.eq(top), emax.eq(rt + self.key)]
        if self.root is not None:
            care = care & (rt == self.root)
        off = M - 12
        lim = (1 << (M - 1)) - 1
        mask = sign_mask_int(n, p.sign_seed)

        def align(v, ex, name):
            sh = Signal(signed(9), name=f"{name}_sh")
            m.d.comb += sh.eq(emax - ex - off)
            shl, shr = Signal(range(16), name=f"{name}_l"), Signal(range(14), name=f"{name}_r")
            # v < 2^11: a right shift past 12 gives 0, as 13 does
            m.d.comb += [shl.eq(Mux(sh < 0, -sh, 0)), shr.eq(Mux(sh > 13, 13, Mux(sh > 0, sh, 0)))]
            a = Signal(32, name=f"{name}_a")
            m.d.comb += a.eq(Mux(sh < 0, v << shl,
                                 (Cat(v, Const(0, 14)) + (Const(1, 25) << shr >> 1)) >> shr))
            return a

        same = Const(1, 1)
        for k, (s, exs, sig, sm, em, sigm) in enumerate(lanes):
            if self.lane is not None and k != self.lane:
                continue
            X, MU = align(sig, exs, f"spec_x{k}"), align(sigm, em, f"spec_m{k}")
            y = Signal(signed(34), name=f"spec_y{k}")
            m.d.comb += y.eq(Mux(s, -X, X) - Mux(sm, -MU, MU))
            yc = Mux(y > lim, lim, Mux(y < -lim, -lim, y))
            want = Signal(signed(M), name=f"spec_want{k}")
            m.d.comb += want.eq(-yc if (mask >> k) & 1 else yc)
            same = same & (dut.x[k] == want)
        same = same & (dut.u == emax - (15 + M - 2)) & (dut.flags == flags)
        m.d.comb += self.ok.eq(~care | same)
        return m
