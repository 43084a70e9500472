"""Inverse FWHT of the read path on block-scaled integers, pipelined.

Input lane i is ``p_i * 2^(ef_k + c)`` with ``p_i`` a small signed integer
(``level * sig``) and ``ef_k`` the exponent field of its block k (lanes
[kG, kG + G)). Output lane i is the exact integer ``S_i`` with

    (H yhat)_i = S_i * 2^(ef_min + c),    ef_min = min_k ef_k

(H: Sylvester-order Hadamard, unnormalized; the /N and the exponent are applied
by :mod:`hw.tofloat`). The FWHT is computed as in ``sim_models.fwht``: stage s
(s = 0 .. log2 N - 1) maps lanes (i, i + 2^s) to (a + b, a - b); the stages
commute, and the order here is the golden one.

* Inner stages s < log2 G (stride < G) stay inside a block: every operand has
  the block's exponent, so they run on the narrow integers p (+1 bit per stage).
* Alignment (only when N/G > 1): before the first outer stage every lane of
  block k is shifted left by ``d_k = ef_k - ef_min`` (0 .. ``max_align``, the
  exponent-field span of the scale encoding: 30 for ue5m3; exact), so all
  lanes share the unit 2^(ef_min + c).
* Block swap (``align="swap"``, the default for N/G = 2, :func:`default_align`):
  the block t with ``d_t = 0`` (the lowest such index; the read path's contract
  guarantees one) is never shifted. The input blocks are permuted by XOR,
  slot j <- block ``j ^ t`` (an N/G:1 select per lane at the alignment; the
  inner stages commute with it), slot j is shifted by ``d_(j ^ t)`` and slot 0 not at all,
  so only N (1 - G/N) lanes have a shifter (half of them for N/G = 2). Since
  ``H_N = H_(N/G) (x) H_G`` and ``H[r, k ^ t] = (-1)^popcount(r & t) H[r, k]``,
  the result is ``S_i = (-1)^flip_i y_i`` with ``flip_i = popcount((i // G) & t)
  mod 2``: output port ``flip``, which the float conversion folds into the sign
  (:class:`hw.tofloat.FloatPrep`). Exact by construction: the network computes
  H of a block permutation of an in-contract input, with the same widths. With
  ``align="lane"`` every lane has a shifter and ``flip`` is 0.
* Outer stages s >= log2 G combine blocks on the aligned, wider integers
  (+1 bit per stage). Width of S: ``w_p + log2 N + max_align`` at most (46 bits
  for b = 4, N = 256, midtread/ue5m3), exact for every input.

Fold alignment (``fold_align``, two beats of one block each: W = G = N/2): the W-point
network runs the inner stages only, on the narrow integers, and the shift amounts ride
along; the alignment happens in the last stage across the beats
(:func:`fold_align_stage`), so no lane is wider than ``w_p + log2 W`` bits before the
fold. With beat-0 lane a (shift d_0), beat-1 lane b (d_1) and one of d_0, d_1 zero
(the contract), let ``sw = (d_0 == 0)``, X the shifted operand (b if sw else a), Y the
other and ``d = d_0 | d_1``: the outputs are ``a 2^d_0 + b 2^d_1 = X 2^d + Y`` and
``a 2^d_0 - b 2^d_1 = (-1)^sw (X 2^d - Y)`` (``flip`` = sw on output beat 1). Only X is
shifted (one left shift per lane, in two parts), and both outputs come from one addition
of the exact :func:`out_width` (N) bits, ``(X << d) + Y`` then ``(X << d) + (-Y)``. Three
registers: the swap's operands (X already shifted by d's low :data:`FOLD_SHIFT_X_BITS`
bits, and Y) with d's high bits; ``X << d`` (the shift by the high bits) and the addend
(Y, replaced by -Y one cycle later); the sum, then the difference; between the first
two, :data:`FOLD_BRIDGE_REGS` plain delays for the route between them. Exact for every input (the same integers
as the network alignment; checked bit-exact in simulation, and proven by BMC at N = 4
with 3-bit inputs and shifts up to 5 in ``tests/test_formal.py``).

Fold window (``window`` = D, with fold alignment): the fold's output need not be the exact
integer, only what the float conversion rounds the same way. Let ``s = max(d - D, 0)``
(per vector). A lane with X = 0 is ``+-Y``, exact, at unit 2^0. Every other lane is

    T = X 2^(d - s) +- RO(Y / 2^s) = RO((X 2^d +- Y) / 2^s)  at unit 2^s,

where RO rounds to odd (the quotient when exact, else the odd integer of the two around
it: ``floor`` with bit 0 set when bits fall off). The identity holds because X 2^(d-s)
is even when s > 0 (d - s = D >= 1), and an even integer added to a value does not
change which integers are odd; RO(-t) = -RO(t). Rounding to odd and then to nearest
even at p bits is one rounding to nearest even when the odd rounding keeps at least
p + 2 bits. For s > 0 and X != 0, |X 2^d +- Y| >= 2^d - 2^(w-1) >= 2^(d-1) since
d > D >= w - 1 (w: the lanes' signed width), so T has at least D bits and D >= p + 2
suffices (:func:`fold_window`; fp16 p = 11: at N=128, b=3, w = 14 and D = 13, so the
lanes are 28 bits against 45 exact; at N=64 w = 13, D = 13, 27 against 44). Subnormal
results round at a coarser position, never finer. With a step k (:data:`FOLD_WINDOW_STEP`)
s is rounded down to a multiple of k: X is shifted by d - s <= D + k - 1 (still >= D when
s > 0, so X 2^(d-s) is even and T keeps more than D bits), the lanes are k - 1 bits wider
(29 at N=128 with k = 2) and Y's shifter moves in steps of k. Per lane the output flag ``alt``
says X != 0 (unit 2^s: the float conversion takes T from ``exp_alt``, the side band's
exponent + s, :class:`hw.tofloat.FloatPrep` ``alt_exp``), else the side band's exponent
as it is. The shifts: X by
``dm = d - s`` (low :data:`FOLD_SHIFT_X_BITS` bits into register X, the rest into
register S), Y by s (capped where every larger s rounds Y alike, to -1, 0 or 1, at
>= w - 1) into register S, a round-to-odd log shifter (:func:`shift_right_odd`)
held where X = 0 (a zero test of X into register X).

Register placement (``latency`` = L in [0, S]): the steps are the
butterfly stages with the alignment counted as one more step (when N/G > 1;
with ``split_align`` its parts: the block swap's select (with the swap), the shift by
the high bits of d, then by its low :data:`ALIGN_LO_BITS` bits, so that registers can
sit between the swap's data movement across blocks and the shifter, and inside the
shifter), S steps in all; pipeline register r (r = 1 .. L) follows the first
``ceil(r * S / L)`` steps (:func:`hw.fwht.register_positions`), so the last one
is at the output. All registers advance together when ``en`` is high; a valid
bit and a side band (a plain width or a layout) travel with the data
(:func:`hw.pipeline.stage`). The swap index t and the shift amounts d ride in the
registers until the last alignment step (t to the output, for ``flip``): from the
register before an alignment step on, in one copy per
:data:`hw.pipeline.REPLICA_GROUP_LANES` lanes that read them
(:func:`hw.pipeline.replicas`; one register of t for 64 lanes' selects was the N=64
decoder's worst path, docs/SYNTH.md), and at the register whose next step reads them
(the shifters d, the block swap t) in one copy per
:data:`hw.pipeline.REPLICA_SELECT_LANES` lanes,
loaded from the copies of one register earlier, which has one per 16 lanes also when
its own next step is a butterfly stage (a fanout tree). A step that reads them further
from a register than the next step reads the last register's copies as they are.

Signed zeros: none. The format's exact-zero result is +0 before the sign flip D
(docs/FORMAT.md, read path), which the integers carry as they are.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal, Value, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .fwht import FOLD_CYCLES, butterfly_stage, fold_stage, register_positions
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

#: Plain delay registers of :func:`fold_align_stage` between register X and register S
#: (X, Y and d's high bits; beat 0's sw and the control along), for the route from the
#: network's side to the adder's, the N=128 decoder's worst path at 3 of its 4 runs
#: before (docs/SYNTH.md). With 1 the worst path moved to other nets of the fold and the
#: decoder did not get faster (106.58 and 105.22 MHz at seeds 1 and 2, against 107.43 at
#: seed 2 without), for 2,070 more FF and a cycle: 0.
FOLD_BRIDGE_REGS = 0

#: Whether the read path's two-beat fold (``fold_align``) rounds to its window
#: (:func:`fold_window`, module docstring "Fold window"; ``hw.decompressor.read_window``):
#: the lanes into the float conversion 29 bits instead of 45 at N=128 (28 with
#: :data:`FOLD_WINDOW_STEP` 1; docs/SYNTH.md).
FOLD_WINDOW = True

#: The fold window's step k (module docstring, "Fold window"): s rounded down to a multiple
#: of k, so Y's round-to-odd shifter has log2 k fewer levels (shift amounts 0, k, 2k, ...)
#: and the lanes keep shifts up to D + k - 1 (k - 1 bits more); 1: s as it is. 2: the
#: N=128 decoder's worst path without its reset net was that shifter, s's register
#: through five LUT levels into register S (8.10 ns at seed 1, docs/SYNTH.md); one level
#: fewer for one bit more per lane (29 instead of 28 at N=128).
FOLD_WINDOW_STEP = 2

#: Register stages of :func:`fold_align_stage` for the last beat of a vector.
FOLD_ALIGN_CYCLES = 4 + FOLD_BRIDGE_REGS

#: Low bits of d that :func:`fold_align_stage` shifts X by into register X; register S
#: shifts by the high bits. With one 31-position shifter into register S (0 here) each
#: bit of X went to up to 31 positions, the N=128 decoder's worst path at 21721cf; split
#: 2 + 3 bits, each bit goes to at most 4, then 8, and the fold alone has half the LUT4
#: (2 bits: the smallest of 0 .. 3, bench/synth_fold_shift.py). Its effect on the
#: decoder's Fmax is within the placement-seed spread (99.71 MHz at seed 1, 117.32 at
#: seed 2, against 102.52 at seed 1 without it; docs/SYNTH.md).
FOLD_SHIFT_X_BITS = 2


def default_align(n: int, block: int) -> str:
    """"swap" for N/G = 2, "lane" otherwise: from N/G = 4 on, the N/G:1 select per lane
    costs more than the one shifter in N/G it saves (measured, docs/SYNTH.md, Area)."""
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
            :data:`FOLD_WINDOW_STEP`; ``y`` then W + D + k bits).

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
                 window_exp: str | None = None, window_step: int | None = None):
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
        step = FOLD_WINDOW_STEP if window_step is None else window_step
        if isinstance(step, bool) or not isinstance(step, int) or step < 1 or step & (step - 1):
            raise ValueError(f"window_step must be a power of two >= 1, got {step!r}")
        self.window_step = step
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
                                 self.window_step)
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
    :data:`FOLD_WINDOW_STEP`), D + k - 1 (s rounded down to a multiple of k); without a
    window, ``max_align``."""
    if window is None:
        return max_align
    return window + (FOLD_WINDOW_STEP if step is None else step) - 1


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
                     side_exp: str | None = None, step: int = 1) -> dict:
    """Block alignment and the last butterfly stage of a two-beat vector of one block per
    beat (module docstring, "Fold alignment"), pipelined in three registers and
    :data:`FOLD_BRIDGE_REGS` plain delays between the first two.

    Beat 0 (lanes a, its shift amount d_0) waits in a register, as in
    :func:`hw.fwht.fold_stage`, with ``sw = (d_0 == 0)``. Register X takes, every enabled
    cycle, per lane the swapped operands of the waiting beat and the arriving one, X
    shifted by the low :data:`FOLD_SHIFT_X_BITS` bits of ``d = d_0 | d_1`` and Y, and per
    lane group d's high bits (the arriving beat's d from the network's last register, or
    from the input with network latency 0). After the bridge's delays, register S takes,
    on its clock enable (the cycle after beat 1 came, delayed as X), per lane ``X << d``
    (the shift by the high bits) and the addend Y, which it negates in the next cycle, and
    beat 0's sw (from register A, through the bridge's delays). The
    output register takes ``(X << d) + Y`` on output beat 0 and ``(X << d) + (-Y)`` on
    output beat 1 (one out_w-bit addition of two registers), and ``flip`` = sw with the
    difference, 0 with the sum. The per-vector registers are in one copy per
    :data:`hw.pipeline.REPLICA_SELECT_LANES` lanes. The last beat leaves
    :data:`FOLD_ALIGN_CYCLES` (4 plus the bridge's) enabled cycles after it came.

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
        step: k, the window's step (:data:`FOLD_WINDOW_STEP`).

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
    lo = min(FOLD_SHIFT_X_BITS, dmw)
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
    # the bridge: FOLD_BRIDGE_REGS plain delays of X, Y, d's high bits and the pair bit
    # (register S's operands and enable), and of register A's sw
    nb = FOLD_BRIDGE_REGS
    xb, yb, dxb, gb = [xo], [yo], [dx], [got]
    swb, sxb = [swa], [sx]
    # per lane X == 0 (with a window): its lane is +-Y at 2^0, so Y is not shifted and the
    # lane's flag ``alt`` (the lane's unit is 2^s) is 0
    xz = [[reg(1, f"xz{k}") for k in range(w)] if win else []]
    alt_s = [reg(1, f"alt_s{k}") for k in range(w)] if win else []
    alt_o = [reg(1, f"alt{k}") for k in range(w)] if win else []
    for r in range(nb):
        xb.append([reg(signed(width + xlo), f"xb{r}_{k}") for k in range(w)])
        xz.append([reg(1, f"xzb{r}_{k}") for k in range(w)] if win else [])
        yb.append([reg(signed(width), f"yb{r}_{k}") for k in range(w)])
        dxb.append(regs(dmw - lo, f"d_xb{r}_"))
        sxb.append(regs(sxw, f"s_xb{r}_"))
        gb.append(regs(1, f"pair_b{r}_"))
        swb.append(regs(1, f"sw_b{r}_"))
    lb = [Signal(name=f"{name}_l1")] + [Signal(name=f"{name}_lb{r}") for r in range(nb)]
    l1 = lb[0]
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
                m.d.sync += xz[0][k].eq(xk == 0)
            with m.If(~beat_of(beats, k, w)):
                m.d.sync += a[k].eq(lanes[k])
            for r in range(nb):
                m.d.sync += [xb[r + 1][k].eq(xb[r][k]), yb[r + 1][k].eq(yb[r][k])]
                if win:
                    m.d.sync += xz[r + 1][k].eq(xz[r][k])
            yk = yb[nb][k]
            if win:     # Y rounded to odd at 2^s, unless X == 0
                yk = shift_right_odd(m, yk, sxb[nb][j], f"{name}_yr{k}", hold=xz[nb][k],
                                     step=step)
                with m.If(gb[nb][j]):
                    m.d.sync += alt_s[k].eq(~xz[nb][k])
                m.d.sync += alt_o[k].eq(alt_s[k])
            with m.If(gb[nb][j]):   # a clock enable: no select behind the shifter
                m.d.sync += [xs[k].eq(xb[nb][k] << (dxb[nb][j] << lo)), ya[k].eq(yk)]
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
                         g1[j].eq(gb[nb][j])]
            for r in range(nb):
                m.d.sync += [dxb[r + 1][j].eq(dxb[r][j]), gb[r + 1][j].eq(gb[r][j]),
                             swb[r + 1][j].eq(swb[r][j])]
                if win:
                    m.d.sync += sxb[r + 1][j].eq(sxb[r][j])
            # beat 0's sw: register A is written only while the beat index is 0, so
            # from beat 0 to the pair bit's cycle (index 1 until beat 1) it holds beat
            # 0's, and the bridge delays it as it delays the pair bit
            with m.If(gb[nb][j]):
                m.d.sync += [sws[j].eq(swb[nb][j]), fl[j].eq(0)]
            with m.Else():
                m.d.sync += fl[j].eq(sws[j])
            m.d.sync += flo[j].eq(fl[j])
        m.d.sync += [out_v.eq(mid_v), mid_v.eq(lb[nb] | pend), pend.eq(lb[nb]),
                     l1.eq(valid & beats[0])]
        m.d.sync += [lb[r + 1].eq(lb[r]) for r in range(nb)]
    # the side band: taken with beat 1 (on a beat-index copy of its own), then the
    # bridge's delays and two more registers so that it stays with both output beats
    side_a = Signal.like(side, name=f"{name}_side", reset_less=True)
    sides = [side_a] + [Signal.like(side, name=f"{name}_side_br{r}", reset_less=True)
                        for r in range(nb)]
    side_b = Signal.like(side, name=f"{name}_side_b", reset_less=True)
    side_o = Signal.like(side, name=f"{name}_side_o", reset_less=True)
    # with a window, the vector's s (the exponent offset) taken and delayed as the side band
    es = [Signal(max(sb, 1), name=f"{name}_s") if win else None]
    es += [Signal(max(sb, 1), name=f"{name}_s_br{r}") for r in range(nb)] if win else []
    with when(m, en & copies[groups]):
        m.d.sync += side_a.eq(side)
        if win:
            m.d.sync += es[0].eq((da[0] | db[0])[dmw:])
    # the exponent of the lanes with ``alt``: the side band's (or its field side_exp) + s
    base = (lambda v: Value.cast(v)) if side_exp is None else (lambda v: getattr(v, side_exp))
    exp_b = Signal(len(base(side)), name=f"{name}_exp_alt_b") if win else None
    exp_o = Signal(len(base(side)), name=f"{name}_exp_alt") if win else None
    with when(m, en):
        m.d.sync += [sides[r + 1].eq(sides[r]) for r in range(nb)]
        m.d.sync += [side_b.eq(sides[nb]), side_o.eq(side_b)]
        if win:
            m.d.sync += [es[r + 1].eq(es[r]) for r in range(nb)]
            m.d.sync += [exp_b.eq(base(sides[nb]) + (es[nb] << (step.bit_length() - 1))),
                         exp_o.eq(exp_b)]
    return {"lane": y, "flip": [flo[k * nrep // w] for k in range(w)], "valid": out_v,
            "side": side_o, "alt": alt_o, "exp_alt": exp_o}
