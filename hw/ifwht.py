"""Inverse FWHT of the read path on block-scaled integers, pipelined (:class:`BlockFWHT`).

Input lane i is ``p_i * 2^(ef_k + c)`` (``p_i = level * sig``, ``ef_k`` the exponent field
of its block k); output lane i is the exact integer ``S_i`` with
``(H yhat)_i = S_i * 2^(ef_min + c)``, ``ef_min = min_k ef_k`` (H unnormalized,
Sylvester order, the stages in ``sim_models.fwht``'s order; :mod:`hw.tofloat` applies
the /N and the exponent).

* Inner stages (stride < G) run on the narrow integers p (+1 bit per stage).
* Alignment (N/G > 1): every lane of block k is shifted left by ``d_k = ef_k - ef_min``
  (0 .. ``max_align``), exact. ``align="swap"`` (default for N/G = 2,
  :func:`default_align`; docs/DECISIONS.md, "Block swap"): the blocks are permuted by XOR
  with the index t of a block with d = 0, which needs no shifter; the result is
  ``S_i = (-1)^flip_i y_i``, ``flip_i = popcount((i // G) & t) mod 2`` (port ``flip``).
  ``align="lane"``: a shifter on every lane, ``flip`` = 0.
* Outer stages combine blocks on the aligned integers: ``y`` is :func:`out_width` bits.

Two beats (``lanes`` W = N/2): the W-point network, then the last stage across the beats
(:func:`hw.fwht.fold_stage`). With ``align="fold"`` (one block per beat, W = G;
docs/DECISIONS.md, "Fold alignment") the network has the inner stages only and
:func:`fold_align_stage` aligns and adds: with ``sw = (d_0 == 0)``, X the operand to
shift, Y the other and ``d = d_0 | d_1``, the outputs are ``X 2^d + Y`` and
``(-1)^sw (X 2^d - Y)``. Fold window D (``window``; docs/DECISIONS.md, "Fold window"):
with ``s = k floor(max(d - D, 0) / k)`` (k = ``window_step``) a lane with X != 0 is
``RO((X 2^d +- Y) / 2^s)`` at unit 2^s (RO: round to odd; output ``alt``, exponent
``exp_alt`` = the side band's + s), a lane with X = 0 is ``+-Y`` at unit 2^0. Rounding
to odd keeping at least p + 2 bits, then to nearest even at p bits, is one rounding to
nearest even, so D = :func:`fold_window` keeps the float conversion bit-exact.

Registers (``latency`` = L in [0, S]): the S steps are the butterfly stages and the
alignment (with ``split_align`` its parts: the block swap's select, the shift by d's
high bits, the shift by its low :data:`ALIGN_LO_BITS` bits); register r follows the
first ``ceil(r S / L)`` steps (:func:`hw.fwht.register_positions`). All registers
advance on ``en``; a valid bit and a side band travel along. The shift amounts and the
swap index ride in register copies (:func:`hw.pipeline.replicas`; docs/DECISIONS.md,
"Register replicas").
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, Value, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .fwht import FOLD_CYCLES, butterfly_stage, fold_stage, register_positions
from .options import FoldOptions
from .pipeline import (REPLICA_ATTRS, REPLICA_SELECT_LANES, beat_groups, beat_index, beat_of,
                       replica_count, replica_of, replicas, stage, when)

#: Largest block-exponent difference of ue5m3 (exponent fields 1 .. 31); the
#: default of ``max_align``.
MAX_ALIGN = 30
#: Bits of d that the second alignment step shifts by when the alignment is split.
ALIGN_LO_BITS = 2
ALIGN_LO = (1 << ALIGN_LO_BITS) - 1


def steps_of(n: int, block: int, split_align: bool = False,
             aligned: bool | None = None, swap: bool = False) -> list[tuple[str, int]]:
    """The pipeline steps: ("bf", s) butterfly stage s, ("align", 0) the block alignment;
    with ``split_align`` the alignment in its parts, one step each: ("swap", 0) the block
    swap's select when ``swap``, ("align", 0) the shift by the high bits of d (a multiple
    of 2^:data:`ALIGN_LO_BITS`) and ("align", 1) by its low bits. ``aligned``: whether
    there is an alignment (default: n > block; a beat of a two-beat vector has one
    even when it is one block)."""
    log2n, log2g = n.bit_length() - 1, block.bit_length() - 1
    steps = [("bf", s) for s in range(log2g)]
    if n > block if aligned is None else aligned:
        if split_align:
            steps += [("swap", 0)] * swap + [("align", 0), ("align", 1)]
        else:
            steps += [("align", 0)]
    steps += [("bf", s) for s in range(log2g, log2n)]
    return steps


#: Block alignments: "lane" = a shifter on every lane, "swap" = the block with d = 0
#: permuted into slot 0, which has no shifter, "fold" = in the last stage across two
#: beats of one block each (module docstring).
ALIGNS = ("lane", "swap", "fold")

#: Register stages of :func:`fold_align_stage` for the last beat of a vector.
FOLD_ALIGN_CYCLES = 4


def default_align(n: int, block: int) -> str:
    """"swap" for N/G = 2, "lane" otherwise: from N/G = 4 on, the N/G:1 select per lane
    costs more than the one shifter in N/G it saves (docs/DECISIONS.md, "Block swap")."""
    return "swap" if n // block == 2 else "lane"


def effective_align(n: int, block: int, lanes: int | None = None, align=None) -> str:
    """The alignment :class:`BlockFWHT` (n, block, align=align, lanes=lanes) builds: "fold"
    when asked for; else ``align`` (default :func:`default_align`) when the W = ``lanes``
    lanes are the whole vector and more than one block, else "lane" (the swap needs a block
    with d = 0 among its lanes, given only for the whole vector). ValueError: ``align`` not
    in :data:`ALIGNS`, or "fold" without two beats of one block each (W = G = n/2)."""
    w = n if lanes is None else lanes
    align = default_align(w, block) if align is None else align
    if align not in ALIGNS:
        raise ValueError(f"align must be one of {ALIGNS}, got {align!r}")
    if align == "fold":
        if not w == block == n // 2:
            raise ValueError(f"align='fold' needs two beats of one block each (lanes = block "
                             f"= n/2), got n={n}, block={block}, lanes={w}")
        return align
    return align if w // block > 1 and w == n else "lane"


def _select(values: list, sel):
    """``values[sel]`` as a tree of 2:1 multiplexers on the bits of ``sel``
    (len(values) a power of two)."""
    j = 0
    while len(values) > 1:
        values = [Mux(sel[j], values[2 * k + 1], values[2 * k]) for k in range(len(values) // 2)]
        j += 1
    return values[0]


def out_width(n: int, block: int, in_width: int, max_align: int = MAX_ALIGN,
              aligned: bool | None = None) -> int:
    """Signed width of the output lanes (``aligned``: as in :func:`steps_of`); with the fold
    window (module docstring, "Fold window") ``max_align`` = :func:`window_kept`, the
    largest shift kept."""
    al = n > block if aligned is None else aligned
    return in_width + (n.bit_length() - 1) + (max_align if al else 0)


class BlockFWHT(wiring.Component):
    """Pipelined FWHT over block-scaled lanes (see module docstring).

    Args:
        n, block: N and G.
        in_shape: signed shape of the input integers p.
        latency: pipeline registers L in [0, log2 N].
        side_width: width of the side band delayed alongside the data, or its
            shape (e.g. a ``data.StructLayout``).
        max_align: largest shift amount d (default :data:`MAX_ALIGN`, ue5m3).
        split_align: the alignment as two steps (see the module docstring).
        align: "lane", "swap" or "fold" (:data:`ALIGNS`, module docstring; "fold" only
            with two beats of one block each); default :func:`default_align`.
        lanes: W, lanes per cycle: n (default) or n/2, a multiple of ``block``: a vector as
            two beats (lanes [0, W), then [W, n)) with ``p`` / ``d`` / ``y`` / ``flip`` of W
            lanes / W/G blocks; the W-point network aligns every lane (``d`` from ef_min of
            all n/G blocks, so "lane" alignment, even when W == G) and :func:`hw.fwht.fold_stage`
            adds the last stage across the beats (with ``align="fold"`` the W-point network
            has the inner stages only and :func:`fold_align_stage` aligns and adds, the
            shift amounts riding along); ``y`` is :func:`out_width` (n) bits.
        window: the fold window D (module docstring, "Fold window"; ``align="fold"`` only;
            none when D >= max_align): ``y`` is W + 1 + D bits, W the network's lane width.
        window_exp: the side band's field that holds the exponent (``exp_alt`` is it + s);
            default the whole side band.
        window_step: k, s rounded down to a multiple of k (default
            ``hw.options.FoldOptions.window_step``; ``y`` then W + D + k bits).
        shift_x_bits: low bits of d that the fold shifts X by before its register X
            (:func:`fold_align_stage`).

    Ports: ``en``, ``i_valid``, ``p`` (N lanes), ``d`` (N/G shift amounts,
    ``max_align.bit_length()`` bits, each <= max_align, at least one 0), ``side_i`` in;
    ``o_valid``, ``y`` (N lanes, :func:`out_width` bits), ``flip`` (N bits: the
    result is ``S_i = (-1)^flip_i y_i``), ``side_o`` out; with a window also ``alt`` (N
    bits: lane i is ``RO(S_i / 2^s)`` at unit 2^s, else S_i) and ``exp_alt`` (the side
    band's exponent + s).
    """

    def __init__(self, n: int, block: int, in_shape, latency: int, side_width=0,
                 max_align: int = MAX_ALIGN, split_align: bool = False, align=None,
                 lanes: int | None = None, window: int | None = None,
                 window_exp: str | None = None, window_step: int = FoldOptions.window_step,
                 shift_x_bits: int = FoldOptions.shift_x_bits):
        if n < 2 or n & (n - 1) or block < 1 or block & (block - 1) or n % block:
            raise ValueError(f"n and block must be powers of two with block | n, got {n}, {block}")
        w = n if lanes is None else lanes
        if w not in (n, n // 2) or w % block:
            raise ValueError(f"lanes must be n={n} or n/2 and a multiple of block={block}, "
                             f"got {lanes}")
        self.n_total, self.lanes = n, w
        aligned = None if w == n else n > block
        n = w                       # the network below is W lanes wide
        self.n, self.block = n, block
        self.n_blocks = n // block
        self.in_shape = Shape.cast(in_shape)
        self.align = effective_align(self.n_total, block, w, align)
        self.fold_align = self.align == "fold"
        self.aligned = (n > block if aligned is None else bool(aligned)) and not self.fold_align
        self.steps = steps_of(n, block, split_align, self.aligned, self.align == "swap")
        if latency > len(self.steps):
            raise ValueError(f"latency must be in [0, S={len(self.steps)}] (the steps), got {latency}")
        self.positions = register_positions(len(self.steps), latency) if latency else []
        self.latency = latency
        if not isinstance(max_align, int) or max_align < 0:
            raise ValueError(f"max_align must be a non-negative int, got {max_align!r}")
        self.max_align = max_align
        self.d_width = max(1, max_align.bit_length())
        self.net_width = out_width(n, block, self.in_shape.width, max_align, self.aligned)
        if window is not None:
            if not self.fold_align:
                raise ValueError(f"window needs align='fold', got align={self.align!r}")
            if not isinstance(window, int) or window < 1:
                raise ValueError(f"window must be a positive int, got {window!r}")
        step = window_step
        if isinstance(step, bool) or not isinstance(step, int) or step < 1 or step & (step - 1):
            raise ValueError(f"window_step must be a power of two >= 1, got {step!r}")
        self.window_step = step
        self.shift_x_bits = shift_x_bits
        # a window that keeps max_align or more never cuts: the exact fold
        self.window = (window if window is not None and window_kept(window, max_align, step)
                       < max_align else None)
        self.window_exp = window_exp
        self.out_width = (out_width(self.n_total, block, self.in_shape.width,
                                    window_kept(self.window, max_align, step))
                          if self.fold_align else
                          self.net_width + (self.n_total.bit_length() - n.bit_length()))
        super().__init__({
            "en": In(1),
            "i_valid": In(1),
            "p": In(data.ArrayLayout(self.in_shape, n)),
            "d": In(data.ArrayLayout(self.d_width, self.n_blocks)),
            "side_i": In(side_width),
            "o_valid": Out(1),
            "y": Out(data.ArrayLayout(signed(self.out_width), n)),
            "flip": Out(n),
            "side_o": Out(side_width),
            **({"alt": Out(n), "exp_alt": Out(self._exp_width(side_width))}
               if self.window else {}),
        })

    def _exp_width(self, side_width) -> int:
        """Width of the side band's exponent (its field ``window_exp``, or all of it)."""
        if self.window_exp is None:
            return Shape.cast(side_width).width
        return Shape.cast(side_width[self.window_exp].shape).width

    @property
    def cycles(self) -> int:
        """Register stages from ``p`` to ``y`` (the last beat's, with two beats)."""
        if self.lanes == self.n_total:
            return self.latency
        return self.latency + (FOLD_ALIGN_CYCLES if self.fold_align else FOLD_CYCLES)

    def elaborate(self, platform):
        m = Module()
        n, g = self.n, self.block
        lanes = [self.p[i] for i in range(n)]
        width = self.in_shape.width
        d = [self.d[k] for k in range(self.n_blocks)]
        if self.window:     # d as (dm = d - s, s / k), s = k floor(max(d - D, 0) / k)
            dm, k = self.window, self.window_step
            lb, kept = k.bit_length() - 1, window_kept(dm, self.max_align, k)
            d = [Cat(Mux(dk > dm, dm + (dk - dm)[:lb], dk)[:kept.bit_length()],
                     Mux(dk > dm, (dk - dm) >> lb, 0)[:((self.max_align - dm) // k).bit_length()])
                 for dk in d]
        valid, side = self.i_valid, self.side_i
        nb, t = self.n_blocks, None
        if self.align == "swap":
            # t: the lowest block with d == 0; slot j <- block j ^ t, shifted by d_(j ^ t)
            t = Signal(range(nb), name="swap_t")
            pick = Const(0, range(nb))
            for k in range(nb - 1, -1, -1):
                pick = Mux(d[k] == 0, k, pick)
            m.d.comb += t.eq(pick)
            ds = [Const(0, self.d_width)]
            for k in range(1, nb):
                dk = Signal(self.d_width, name=f"sw_d{k}")
                m.d.comb += dk.eq(_select([d[k ^ u] for u in range(nb)], t))
                ds.append(dk)
            d = ds
        # t and each block's d as lists of register copies: one until the register before
        # an alignment step, then one per REPLICA_GROUP_LANES lanes that read it, and one
        # per REPLICA_SELECT_LANES at a register whose next step reads it, loaded from the
        # group copies (module docstring); lane i of block k reads
        # replica_of(dc[k], i % g, g), its t replica_of(tc, i, n)
        tc = [t] if t is not None else []
        dc = [[dk] for dk in d]
        first = 1 if t is not None else 0       # slot 0 of the swap is never shifted
        copy = False                            # t and d in copies from here on
        split = ("align", 1) in self.steps
        swap_step = ("swap", 0) in self.steps
        permute = ("swap", 0) if swap_step else ("align", 0)    # the step that reads t

        def copies(lanes: int, pos: int, reads) -> int:
            """Copies of a value that ``lanes`` lanes read, at the register after step
            ``pos - 1``; ``reads(step)``: whether a step reads it."""
            def leaf(p):
                return p < len(self.steps) and reads(self.steps[p])
            if leaf(pos):
                return replica_count(lanes, REPLICA_SELECT_LANES)
            later = [p for p in self.positions if p > pos]
            return replica_count(lanes) if copy or later and leaf(later[0]) else 1
        for idx, (kind, s) in enumerate(self.steps):
            if self.align == "swap" and (kind == "swap" or kind == "align" and s == 0
                                         and not swap_step):
                # the block permutation, on the inner stages' results (commutes with them)
                perm = [Signal(signed(width), name=f"sw_{i}") for i in range(n)]
                for i in range(n):
                    k, lane = divmod(i, g)
                    m.d.comb += perm[i].eq(_select([lanes[(k ^ u) * g + lane]
                                                    for u in range(nb)], replica_of(tc, i, n)))
                lanes = perm
            if kind == "align":
                if not split:
                    lo, hi, add = 0, self.d_width, self.max_align
                elif s == 0:        # high bits of d: 0 .. max_align rounded down
                    lo, hi, add = ALIGN_LO_BITS, self.d_width, self.max_align & ~ALIGN_LO
                else:               # low bits: the rest of the exact max_align growth
                    lo, hi = 0, ALIGN_LO_BITS
                    add = self.max_align - (self.max_align & ~ALIGN_LO)
                width += add
                nxt = [Signal(signed(width), name=f"al{s}_{i}") for i in range(n)]
                for i in range(n):
                    # exact: d <= max_align, so the shifted value fits; with the block
                    # swap slot 0 holds the block with d = 0 and has no shifter
                    k = i // g
                    if k < first:
                        m.d.comb += nxt[i].eq(lanes[i])
                        continue
                    dk = replica_of(dc[k], i % g, g)
                    m.d.comb += nxt[i].eq(lanes[i] << (dk[lo:hi] << lo))
            elif kind == "bf":
                width += 1
                nxt = butterfly_stage(m, lanes, s, width)
            else:                   # the swap step: the permutation only
                nxt = lanes
            lanes = nxt
            if idx + 1 in self.positions:
                # the shift amounts ride along while the alignment is still ahead (to the
                # fold with fold alignment, in copies from the last register on)
                carry_d = self.fold_align or any(k == "align" for k, _ in self.steps[idx + 1:])
                r = stage(m, self.en, f"r{idx}", lane=lanes, valid=valid, side=side)
                lanes, valid, side = r["lane"], r["valid"], r["side"]
                copy = copy or (carry_d and (idx + 1 == len(self.steps)
                                             or self.steps[idx + 1][0] != "bf"))
                if tc:
                    c = copies(n, idx + 1, lambda st: st == permute)
                    tc = replicas(m, self.en, f"r{idx}_t", tc, c)
                if carry_d:
                    c = copies(g, idx + 1, lambda st: st[0] == "align")
                    dc = [None] * first + [replicas(m, self.en, f"r{idx}_d{k}", dc[k], c)
                                           for k in range(first, nb)]
        assert width == self.net_width
        if self.fold_align:                 # the alignment and the last stage, across beats
            f = fold_align_stage(m, self.en, "fold", lanes, dc[0], valid, side,
                                 self.out_width, self.max_align, self.window, self.window_exp,
                                 self.window_step, self.shift_x_bits)
            m.d.comb += self.flip.eq(Cat(*f["flip"]))
            if self.window:
                m.d.comb += [self.alt.eq(Cat(*f["alt"])), self.exp_alt.eq(f["exp_alt"])]
        elif self.lanes < self.n_total:     # the last stage, across the two beats
            f = fold_stage(m, self.en, "fold", lanes, valid, side)
        if self.lanes < self.n_total:
            lanes, valid, side = f["lane"], f["valid"], f["side"]
        m.d.comb += [self.y[i].eq(lanes[i]) for i in range(n)]
        if tc:
            # H[r, k ^ t] = (-1)^popcount(r & t) H[r, k], r = i // G the output's block
            m.d.comb += self.flip.eq(Cat(*((replica_of(tc, i, n) & (i // g)).xor()
                                           for i in range(n))))
        m.d.comb += [self.o_valid.eq(valid), self.side_o.eq(side)]
        return m


def shift_right_odd(m: Module, v, amount, name: str, hold=None, step: int = 1):
    """``RO(v / 2^(k amount))``, k = ``step`` (a power of two): v shifted right
    (arithmetic) with bit 0 set when any bit shifted out is set (round to odd: exact
    when nothing falls off, else the odd integer of the two around the quotient). A log
    shifter of plain 2:1 selects; the sticky bit comes beside it from v and a thermometer
    of the amount (``i < amount`` per bit i, the same for every lane of one amount, so
    shared), not from the shifter's levels (a chain through them).

    Args:
        v: signed Value; amount: unsigned Value (any value: beyond the width the result
            is -1, 0 or 1 by v's sign).
        hold: 1-bit Value, or None: where it is 1 the result is v (no shift).
        step: k, the unit of ``amount`` (level j shifts by k 2^j).

    Returns:
        Signal of v's shape.
    """
    v = Value.cast(v)
    width = len(v)
    go = amount if hold is None else amount & ~hold.replicate(len(amount))
    cur = v
    for j in range(len(amount) - 1, -1, -1):
        h = 1 << j
        nv = Signal(signed(width), name=f"{name}_v{j}")
        m.d.comb += nv.eq(Mux(go[j], cur >> min(h * step, width - 1), cur))
        cur = nv
    below = Cat(*(amount > i // step for i in range(width)))   # bit i: i < k amount
    sticky = Signal(name=f"{name}_st")
    m.d.comb += sticky.eq((v.as_unsigned() & below).any() & (1 if hold is None else ~hold))
    out = Signal(signed(width), name=f"{name}_out")
    m.d.comb += out.eq(cur | sticky)
    return out


def window_kept(window: int | None, max_align: int, step: int | None = None) -> int:
    """The largest shift of X the fold keeps: with the window D and step k (default
    ``hw.options.FoldOptions.window_step``), D + k - 1 (s rounded down to a multiple of
    k); without a window, ``max_align``."""
    if window is None:
        return max_align
    return window + (FoldOptions.window_step if step is None else step) - 1


def fold_window(lane_width: int, precision: int) -> int:
    """The fold's window D (module docstring, "Fold window"): the least D with D >= p + 2
    (rounding to odd then to nearest even at p significant bits is one rounding) and
    D >= w - 1 (|X 2^d +- Y| >= 2^(d-1) for d > D, so the p + 2 bits are all kept).

    Args:
        lane_width: w, the signed width of the lanes into the fold.
        precision: p, significant bits of the output type (stored mantissa + 1).
    """
    return max(precision + 2, lane_width - 1)


def fold_align_stage(m: Module, en, name: str, lanes: list, d: list, valid, side,
                     out_w: int, d_max: int, window: int | None = None,
                     side_exp: str | None = None, step: int = 1,
                     shift_x_bits: int = FoldOptions.shift_x_bits) -> dict:
    """Block alignment and the last butterfly stage of a two-beat vector of one block per
    beat (module docstring; docs/DECISIONS.md, "Fold alignment"), pipelined in three
    registers.

    Beat 0 (lanes a, its shift amount d_0) waits in a register, as in
    :func:`hw.fwht.fold_stage`, with ``sw = (d_0 == 0)``. Register X takes, every enabled
    cycle, per lane the swapped operands of the waiting beat and the arriving one, X
    shifted by the low ``shift_x_bits`` bits of ``d = d_0 | d_1`` and Y, and per
    lane group d's high bits (the arriving beat's d from the network's last register, or
    from the input with network latency 0). Register S takes,
    on its clock enable (the cycle after beat 1 came), per lane ``X << d``
    (the shift by the high bits) and the addend Y, which it negates in the next cycle, and
    beat 0's sw (from register A). The
    output register takes ``(X << d) + Y`` on output beat 0 and ``(X << d) + (-Y)`` on
    output beat 1 (one out_w-bit addition of two registers), and ``flip`` = sw with the
    difference, 0 with the sum. The per-vector registers are in one copy per
    :data:`hw.pipeline.REPLICA_SELECT_LANES` lanes. The last beat leaves
    :data:`FOLD_ALIGN_CYCLES` enabled cycles after it came.

    Args:
        lanes: W signed Values of equal width w (the network's output of the beat).
        d: copies of the beat's shift amount (each equal; lane k reads
            ``replica_of(d, k, W)``); one of d_0, d_1 must be 0, each <= ``d_max``.
        valid, side: the beat's valid bit and side band (taken with beat 1, held for both
            output beats).
        out_w: signed width of the output lanes (exact: w + 1 + d_max; windowed w + D + k).
        d_max: the largest shift amount.
        window: the fold window D (module docstring, "Fold window"), or None (exact); with
            it each d copy is ``Cat(dm, s / k)``, s = k floor(max(d - D, 0) / k) and dm =
            d - s in :func:`window_kept`.bit_length() bits.
        side_exp: the side band's field that ``exp_alt`` adds s to (None: all of it).
        step: k, the window's step (``hw.options.FoldOptions.window_step``).
        shift_x_bits: low bits of d shifted before register X, the rest before register S
            (docs/DECISIONS.md, "Fold alignment").

    Returns:
        {"lane": W Signals (``{name}_y{k}``, signed ``out_w``), "flip": W Values,
        "valid": the output beat's valid, "side": the side band, registered; with a window
        "alt": W Signals (X != 0: the lane is at unit 2^s), "exp_alt": the exponent + s}.
    """
    w = len(lanes)
    width = len(Value.cast(lanes[0]))
    dw = len(Value.cast(d[0]))
    win = window is not None
    kept = window_kept(window, d_max, step)     # X's largest shift
    dmw = kept.bit_length() if win else dw      # d's bits (with a window: dm's; s / k above)
    sb = dw - dmw                               # s's bits, 0 without a window
    groups = beat_groups(w)
    copies = beat_index(m, en, name, valid, groups + 1)
    beats = copies[:groups]
    nrep = replica_count(w, REPLICA_SELECT_LANES)
    attrs = REPLICA_ATTRS if nrep > 1 else {}

    def reg(shape, nm, **kw):
        return Signal(shape, name=f"{name}_{nm}", reset_less=True, **kw)

    def regs(shape, nm):            # one per lane group j (lanes [j W / nrep, (j + 1) W / nrep))
        return [reg(shape, f"{nm}{j}", attrs=attrs) for j in range(nrep)]

    # per lane group: the arriving beat's d; beat 0's d and sw (waiting with beat 0); the
    # vector's d's high bits in register X, sw in register S; the pair-complete bit
    # (register S's enable) and it one cycle later (the addend's negation), the flip bits
    db = [replica_of(d, j * w // nrep, w) for j in range(nrep)]
    da, swa = regs(dw, "d_a"), regs(1, "sw_a")
    lo = min(shift_x_bits, dmw)
    # s / k for Y's shift, at most 2^sxw - 1 with (2^sxw - 1) k >= width - 1 (every larger
    # s rounds Y alike)
    sxw = min(sb, (-(-(width - 1) // step)).bit_length())
    dx, sws = regs(dmw - lo, "d_x"), regs(1, "sw_s")
    sx = regs(sxw, "s_x")
    got, g1 = regs(1, "pair"), regs(1, "pair_d")
    fl, flo = regs(1, "fl"), regs(1, "flip_r")

    a = [reg(signed(width), f"a{k}") for k in range(w)]
    xlo = (1 << lo) - 1                                               # d's low bits' largest
    xo = [reg(signed(width + xlo), f"x{k}") for k in range(w)]       # X << (d's low bits)
    yo = [reg(signed(width), f"yop{k}") for k in range(w)]           # Y
    xs = [reg(signed(width + (kept if win else d_max)), f"xs{k}")     # X << d (or dm)
          for k in range(w)]
    ya = [reg(signed(width + 1), f"yadd{k}") for k in range(w)]      # Y, then -Y: the addend
    y = [reg(signed(out_w), f"y{k}") for k in range(w)]
    # per lane X == 0 (with a window): its lane is +-Y at 2^0, so Y is not shifted and the
    # lane's flag ``alt`` (the lane's unit is 2^s) is 0
    xz = [reg(1, f"xz{k}") for k in range(w)] if win else []
    alt_s = [reg(1, f"alt_s{k}") for k in range(w)] if win else []
    alt_o = [reg(1, f"alt{k}") for k in range(w)] if win else []
    l1 = Signal(name=f"{name}_l1")
    pend = Signal(name=f"{name}_pend")
    mid_v = Signal(name=f"{name}_mid_valid")
    out_v = Signal(name=f"{name}_valid")
    with when(m, en):
        for k in range(w):
            j = k * nrep // w
            # register X every cycle: register S reads it only in the cycle after beat 1
            dd = da[j] | db[j]
            xk = Mux(swa[j], lanes[k], a[k])
            m.d.sync += [xo[k].eq(xk << dd[:lo]), yo[k].eq(Mux(swa[j], a[k], lanes[k]))]
            if win:
                m.d.sync += xz[k].eq(xk == 0)
            with m.If(~beat_of(beats, k, w)):
                m.d.sync += a[k].eq(lanes[k])
            yk = yo[k]
            if win:     # Y rounded to odd at 2^s, unless X == 0
                yk = shift_right_odd(m, yk, sx[j], f"{name}_yr{k}", hold=xz[k], step=step)
                with m.If(got[j]):
                    m.d.sync += alt_s[k].eq(~xz[k])
                m.d.sync += alt_o[k].eq(alt_s[k])
            with m.If(got[j]):      # a clock enable: no select behind the shifter
                m.d.sync += [xs[k].eq(xo[k] << (dx[j] << lo)), ya[k].eq(yk)]
            with m.Elif(g1[j]):     # after the sum's cycle, the difference's addend
                m.d.sync += ya[k].eq(-ya[k])
            # output beat 0 the sum, output beat 1 the difference: no select before the adder
            m.d.sync += y[k].eq(xs[k] + ya[k])
        for j in range(nrep):
            m.d.sync += dx[j].eq((da[j] | db[j])[lo:dmw])
            if win:
                sj = (da[j] | db[j])[dmw:]
                m.d.sync += sx[j].eq(Mux(sj >> sxw != 0, (1 << sxw) - 1, sj[:sxw]))
            with m.If(~beat_of(beats, j * w // nrep, w)):
                m.d.sync += [da[j].eq(db[j]), swa[j].eq(db[j] == 0)]
            m.d.sync += [got[j].eq(valid & beat_of(beats, j * w // nrep, w)),
                         g1[j].eq(got[j])]
            # beat 0's sw: register A is written only while the beat index is 0, so
            # from beat 0 to the pair bit's cycle (index 1 until beat 1) it holds beat 0's
            with m.If(got[j]):
                m.d.sync += [sws[j].eq(swa[j]), fl[j].eq(0)]
            with m.Else():
                m.d.sync += fl[j].eq(sws[j])
            m.d.sync += flo[j].eq(fl[j])
        m.d.sync += [out_v.eq(mid_v), mid_v.eq(l1 | pend), pend.eq(l1),
                     l1.eq(valid & beats[0])]
    # the side band: taken with beat 1 (on a beat-index copy of its own), then two more
    # registers so that it stays with both output beats
    side_a = Signal.like(side, name=f"{name}_side", reset_less=True)
    side_b = Signal.like(side, name=f"{name}_side_b", reset_less=True)
    side_o = Signal.like(side, name=f"{name}_side_o", reset_less=True)
    # with a window, the vector's s (the exponent offset) taken and delayed as the side band
    es = Signal(max(sb, 1), name=f"{name}_s") if win else None
    with when(m, en & copies[groups]):
        m.d.sync += side_a.eq(side)
        if win:
            m.d.sync += es.eq((da[0] | db[0])[dmw:])
    # the exponent of the lanes with ``alt``: the side band's (or its field side_exp) + s
    base = (lambda v: Value.cast(v)) if side_exp is None else (lambda v: getattr(v, side_exp))
    exp_b = Signal(len(base(side)), name=f"{name}_exp_alt_b") if win else None
    exp_o = Signal(len(base(side)), name=f"{name}_exp_alt") if win else None
    with when(m, en):
        m.d.sync += [side_b.eq(side_a), side_o.eq(side_b)]
        if win:
            m.d.sync += [exp_b.eq(base(side_a) + (es << (step.bit_length() - 1))),
                         exp_o.eq(exp_b)]
    return {"lane": y, "flip": [flo[k * nrep // w] for k in range(w)], "valid": out_v,
            "side": side_o, "alt": alt_o, "exp_alt": exp_o}
