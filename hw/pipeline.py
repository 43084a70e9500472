"""Pipeline plumbing shared by the RTL components: register stages, their placements
and the top levels' flow control.

Every pipeline register of the design advances with one enable ``en``
(:func:`stage` builds one such register stage). The top level's ``flow``
(:data:`FLOWS`, :class:`FlowControl`) chooses what drives it: ``"stall"``
(default), a global stall ``en = o.ready | ~o.valid`` with ``i.ready = en``; or
``"credit"``, credit-based flow control: ``en`` is the constant 1 (registers
without enable), the output goes through a skid FIFO (:func:`skid_fifo`) and
``i.ready`` is a register fed by a credit counter.

Two kinds of knobs place the optional registers: the FWHT ``latency`` (how many
of the log2 N butterfly stages end in a register, :mod:`hw.fwht` /
:mod:`hw.ifwht`, checked by :func:`check_latency`) and named
*cuts*, a subset of a component's cut points (:class:`Cuts`:
``hw.frontend.FE_CUTS``, ``hw.quantizer.QUANT_CUTS``,
``hw.decoder.FLOAT_CUTS``), and ``tree_every`` = k, a register after every
k levels of the reduction trees (:mod:`hw.trees`: the front end's exponent max
tree, the quantizer's block statistic trees; checked by :func:`check_tree_every`).
Every component validates them here, so the error messages name the same
fields everywhere. Registers change the latency, never the bytes.

A lane delay line (a wide value that only waits while a narrow computation
beside it takes several stages) can live in block RAM instead of a chain of
register stages: :func:`ram_delay`, chosen by ``lane_ram`` (the minimum delay
in stages that goes to RAM; :func:`check_lane_ram`). It is cycle-for-cycle the
same as the register chain under the same enable, stalls and resets included.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

from amaranth.hdl import (Cat, ClockDomain, ClockSignal, Const, DomainRenamer, Module, Mux,
                          ResetSignal, Signal, Value)
from amaranth.lib import stream
from amaranth.lib.memory import Memory

from sim_models.params import FormatParams


def stage(m: Module, en, name: str, *, reset=("valid",), **values) -> dict:
    """One pipeline register stage: every value of ``values`` registered while ``en`` is high.

    The entries named in ``reset`` (default: ``valid``, so that a stage is empty
    after reset) get registers with reset; every other register is reset-less
    (data). A list of Values is registered element by element.

    Args:
        m: the module to add the registers to (``sync`` domain).
        en: 1-bit enable of the stage.
        reset: keys whose registers have a (synchronous) reset to 0.
        name: prefix of the register names: ``{name}_{key}``, ``{name}_{key}{i}`` for lists.
        values: key -> Value (or View), or list of Values.

    Returns:
        key -> the registered Signal (View for a View, list for a list), in the order given.
    """
    out = {}
    for key, v in values.items():
        if isinstance(v, (list, tuple)):
            regs = [Signal.like(e, name=f"{name}_{key}{i}", reset_less=key not in reset)
                    for i, e in enumerate(v)]
            srcs = list(v)
        else:
            regs = [Signal.like(v, name=f"{name}_{key}", reset_less=key not in reset)]
            srcs = [v]
        with when(m, en):
            m.d.sync += [r.eq(s) for r, s in zip(regs, srcs)]
        out[key] = regs if isinstance(v, (list, tuple)) else regs[0]
    return out


#: The attribute that marks a register copy (:func:`replicas`) as one to keep apart:
#: ``keep`` on the register's wire. A synthesis tool merges registers of equal inputs
#: unless told not to (Vivado and Radiant honour ``keep`` on a register; Yosys needs it on
#: the flip-flop cell, which ``rtl_gen.synth.KEEP_REPLICAS`` sets from the wire's).
REPLICA_ATTRS = {"keep": 1}


#: Lanes per register copy (:func:`replicas`) of a value that every lane reads: the
#: block's thresholds in the quantizer (one compare per lane and threshold), the max
#: exponent in the front end (two subtractions per lane): a copy's net has 16-32 loads
#: per bit (docs/DECISIONS.md, "Register replicas").
REPLICA_GROUP_LANES = 16


#: Lanes per copy of the last register copies before the lanes' own logic (the
#: quantizer's thresholds ``thr``, the front end's max exponent ``emax``): each loads
#: from the upstream copy of its lanes (one per :data:`REPLICA_GROUP_LANES`), two
#: leaves per upstream copy, a register fanout tree (docs/DECISIONS.md, "Register
#: replicas").
REPLICA_LEAF_LANES = 8


#: Lanes per copy of a per-vector value at the register whose next logic reads it in
#: every lane's selects and shifters (many loads per lane and bit, where the compares of
#: :data:`REPLICA_LEAF_LANES` read a copy once): the decoder's block alignment (the
#: shift amounts d, the block swap index t, the fold's d and selects, :mod:`hw.ifwht`)
#: and FloatPrep's K, B, K + B and the mask above K (:mod:`hw.tofloat`)
#: (docs/DECISIONS.md, "Register replicas").
REPLICA_SELECT_LANES = 4


def replica_count(lanes: int, group: int = REPLICA_GROUP_LANES) -> int:
    """Register copies for ``lanes`` readers: one per ``group`` lanes, at least one."""
    return max(1, -(-lanes // group))


def replica_of(copies: list, lane: int, lanes: int):
    """The copy (of the list ``copies``) that lane ``lane`` of ``lanes`` reads."""
    return copies[lane * len(copies) // lanes]


def replicas(m: Module, en, name: str, value, copies: int) -> list:
    """``copies`` registers of ``value`` (loaded while ``en``, no reset), named
    ``{name}_r{k}``, each marked :data:`REPLICA_ATTRS` so that synthesis keeps them apart
    and each drives only its own loads (a register that feeds every lane of a block of 64
    reaches them over one net with 64+ loads per bit). ``value``: a Value, or a list of
    Values equal in every cycle, computed in copies upstream, whose count divides
    ``copies`` or is a multiple of it (copy k loads ``value[k * len(value) // copies]``:
    a fanout tree, or every len(value) / copies-th upstream copy). Every copy equals the
    others in every cycle. Returns the list of registers of the value's shape (one: a
    plain register). ValueError when neither count divides the other."""
    if not isinstance(copies, int) or isinstance(copies, bool) or copies < 1:
        raise ValueError(f"copies must be an int >= 1, got {copies!r}")
    srcs = [Value.cast(v) for v in value] if isinstance(value, (list, tuple)) \
        else [Value.cast(value)]
    if not srcs or copies % len(srcs) and len(srcs) % copies:
        raise ValueError(f"value: {len(srcs)} copies given for {copies} registers "
                         f"(one count must divide the other)")
    srcs = [srcs[k * len(srcs) // copies] for k in range(copies)]
    attrs = REPLICA_ATTRS if copies > 1 else {}
    regs = [Signal(srcs[0].shape(), name=f"{name}_r{k}", reset_less=True, attrs=attrs)
            for k in range(copies)]
    with when(m, en):
        m.d.sync += [r.eq(v) for r, v in zip(regs, srcs)]
    return regs


def when(m: Module, en):
    """``m.If(en)``, or no condition when ``en`` is the constant 1 (credit flow: the
    registers have no enable, so the Verilog has no enable mux to optimise away)."""
    if isinstance(en, Const) and en.value == 1:
        return nullcontext()
    return m.If(en)


def gt_const(x, c: int) -> Value:
    """``x > c`` for a Value ``x`` (signed or unsigned) and an int ``c``, as AND/OR logic.

    Synthesis maps a ``>`` to a carry chain even against a constant; on a short
    path between two registers the chain's entry and exit cost more than the
    few LUT levels of this form: from the top bit down, ``x_t & gt(rest)`` where
    bit t of c is 1 and ``x_t | gt(rest)`` where it is 0.
    """
    x = Value.cast(x)
    w = len(x)
    if x.shape().signed:
        sign, low = x[w - 1], x[:w - 1]
        if c >= 0:
            return ~sign & gt_const(low, c)
        return ~sign | gt_const(low, c + (1 << (w - 1)))
    if c < 0:
        return Const(1, 1)
    if c >= (1 << w) - 1:
        return Const(0, 1)
    out = Const(0, 1)
    for i in range(w):                  # from bit 0 up: out = gt(x[:i+1], c[:i+1])
        out = (x[i] & out) if (c >> i) & 1 else (x[i] | out)
    return out


def check_latency(p: FormatParams, latency, lanes: int | None = None,
                  steps: int | None = None) -> int:
    """Validate ``fwht_regs`` (``latency``: registers in the butterfly network) for ``p``;
    with ``lanes`` = W < N (:func:`check_lanes`) the spatial network has log2 W stages;
    ``steps``: the network's steps when it has more than its butterfly stages (the
    decoder's block alignment, :func:`hw.ifwht.steps_of`), at most one register each.

    Returns:
        ``latency`` as an int in [0, log2 W] (W = N unless given), or [0, ``steps``].

    Raises:
        TypeError: not an int (bool refused).
        ValueError: outside that range.
    """
    if isinstance(latency, bool) or not isinstance(latency, int):
        raise TypeError(f"fwht_regs (FWHT pipeline registers) must be an int, got "
                        f"{type(latency).__name__}")
    w = p.n if lanes is None else lanes
    top = w.bit_length() - 1
    if steps is not None and not 0 <= latency <= steps:
        raise ValueError(f"fwht_regs (FWHT pipeline registers, config part lL; S={steps}: the "
                         f"steps of the read path's FWHT, log2(W)={top} butterfly stages and "
                         f"the block alignment's steps, if any, for n={p.n}, lanes={w}) must be "
                         f"in 0..{steps}, got {latency}")
    if steps is None and not 0 <= latency <= top:
        where = f"log2(N)={top} for n={p.n}" if w == p.n else f"log2(W)={top} for lanes={w}"
        raise ValueError(f"fwht_regs (FWHT pipeline registers, config part lL; {where}) must "
                         f"be in 0..{top}, got {latency}")
    return latency


#: Beats per vector that a top level's ``lanes`` argument allows: W = N (one beat, the
#: whole vector per cycle) or W = N/2 (two beats, one vector every two cycles).
FOLDS = (1, 2)


def check_lanes(p: FormatParams, lanes) -> int:
    """Validate ``lanes`` (W, lanes per cycle of a top level; None: N) for ``p``.

    W = N/2 streams a vector as two beats of W lanes: the last butterfly stage runs
    across the beats (:func:`hw.fwht.fold_stage`) and every block of G lanes lies in
    one beat, so G must divide W.

    Returns:
        W as an int (N or N/2).

    Raises:
        TypeError: not an int or None (bool refused).
        ValueError: not N or N/2, or G does not divide W (the message names ``lanes``).
    """
    if lanes is None:
        return p.n
    if isinstance(lanes, bool) or not isinstance(lanes, int):
        raise TypeError(f"lanes must be an int or None, got {type(lanes).__name__}")
    if lanes not in (p.n, p.n // 2):
        raise ValueError(f"lanes (lanes per cycle W) must be N={p.n} or N/2={p.n // 2}, "
                         f"got {lanes}")
    if lanes % p.block:
        raise ValueError(f"lanes (lanes per cycle W={lanes}) must be a multiple of the "
                         f"block G={p.block}: a scale block lies in one beat")
    return lanes


def check_tree_every(every) -> int:
    """Validate ``tree_every`` (a register after every k levels of a reduction tree; 0: none).

    Raises:
        TypeError: not an int (bool refused). ValueError: negative.
    """
    if isinstance(every, bool) or not isinstance(every, int):
        raise TypeError(f"tree_every must be an int, got {type(every).__name__}")
    if every < 0:
        raise ValueError(f"tree_every (tree levels per register, 0 = none) must be >= 0, "
                         f"got {every}")
    return every


@dataclass(frozen=True)
class Cuts:
    """The optional register positions (cut points) of one component.

    Iterating a ``Cuts`` gives its cut names in data-flow order; every chosen
    cut adds one register stage, so a placement's latency is its length.

    Args:
        option: the constructor option that chooses them (``"quant_regs"``), used in errors.
        names: the cut points, in data-flow order.
        default: the placement of the top level's default configuration.
    """

    option: str
    names: tuple[str, ...]
    default: tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "default", self.check(self.default))

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name) -> bool:
        return name in self.names

    def check(self, regs) -> tuple[str, ...]:
        """Validate a register placement ``regs`` (names from :attr:`names`).

        Returns:
            The chosen cuts as a tuple in data-flow order.

        Raises:
            TypeError: ``regs`` is not a tuple/list/set, or an entry is not a str.
            ValueError: an unknown or repeated name; the message names :attr:`option`.
        """
        field, cuts = self.option, self.names
        if isinstance(regs, str) or not isinstance(regs, (tuple, list, set, frozenset)):
            raise TypeError(f"{field} must be a tuple of cut names from {cuts}, "
                            f"got {type(regs).__name__}")
        regs = list(regs)
        for r in regs:
            if not isinstance(r, str):
                raise TypeError(f"{field} entries must be str, got {type(r).__name__}")
            if r not in cuts:
                raise ValueError(f"{field}: unknown cut {r!r} (cuts: {', '.join(cuts)})")
        if len(set(regs)) != len(regs):
            raise ValueError(f"{field}: repeated cut in {tuple(regs)!r}")
        return tuple(c for c in cuts if c in regs)

    def latency(self, regs) -> int:
        """Register stages (cycles) that the placement ``regs`` adds."""
        return len(self.check(regs))


#: Smallest delay (register stages) :func:`ram_delay` builds: one stage is the
#: memory's read register, one a register behind it (the block RAM's slow
#: clock-to-out stays off the datapath), and the read address must differ from
#: the write address of the same cycle (no read-during-write).
LANE_RAM_MIN = 3


def check_lane_ram(lane_ram) -> int:
    """Validate ``lane_ram``: 0 (every delay line in registers) or the minimum delay in
    register stages that goes to block RAM, >= :data:`LANE_RAM_MIN`.

    Raises:
        TypeError: not an int (bool refused). ValueError: 1 .. LANE_RAM_MIN - 1 or negative.
    """
    if isinstance(lane_ram, bool) or not isinstance(lane_ram, int):
        raise TypeError(f"lane_ram must be an int, got {type(lane_ram).__name__}")
    if lane_ram != 0 and lane_ram < LANE_RAM_MIN:
        raise ValueError(f"lane_ram (minimum delay in stages that goes to block RAM) must be 0 "
                         f"(none) or >= {LANE_RAM_MIN}, got {lane_ram}")
    return lane_ram


def ram_depth(stages: int) -> int:
    """Entries of the circular buffer of a ``stages``-stage :func:`ram_delay`: the
    smallest power of two above ``stages - 2`` (the read pointer trails the write
    pointer by ``stages - 2``)."""
    return 1 << (stages - 2).bit_length()


def ram_delay(m: Module, en, name: str, value, stages: int) -> Signal:
    """``value`` delayed by ``stages`` register stages that advance with ``en``, in a
    block RAM: what the last of ``stages`` chained :func:`stage` registers holds.

    A circular buffer of :func:`ram_depth` entries: while ``en`` is high the
    value is written at the pointer, the pointer advances, and the synchronous
    read port (enabled by ``en`` too) reads the entry written ``stages - 2``
    enabled cycles ago into its data register; one more register (``{name}_data``)
    follows. So an entry written at the k-th enabled cycle is at the output after
    the (k + stages - 1)-th, exactly like the register chain, and nothing moves
    while ``en`` is low. There is no valid bit here: the caller's valid bits (in
    registers with reset) say which entries are vectors, so a reset needs no
    clearing of the buffer. Yosys maps the memory (``ram_style`` block) to ECP5
    DP16KD.

    Raises:
        ValueError: ``stages`` < :data:`LANE_RAM_MIN`.
    """
    if stages < LANE_RAM_MIN:
        raise ValueError(f"ram_delay {name!r}: a block RAM delay needs >= {LANE_RAM_MIN} "
                         f"stages, got {stages}")
    value = Value.cast(value)
    depth = ram_depth(stages)
    mem = Memory(shape=len(value), depth=depth, init=[], attrs={"ram_style": "block"})
    m.submodules[f"{name}_ram"] = mem
    wr = mem.write_port()
    rd = mem.read_port(domain="sync", transparent_for=())
    ptr = Signal(range(depth), name=f"{name}_ptr")
    m.d.comb += [wr.addr.eq(ptr), wr.data.eq(value), wr.en.eq(en),
                 rd.addr.eq(ptr - (stages - 2)), rd.en.eq(en)]
    with when(m, en):
        m.d.sync += ptr.eq(ptr + 1)
    return stage(m, en, name, reset=(), data=rd.data)["data"]


# ---- flow control of the top levels ----------------------------------------------------

#: Flow-control modes of a top level (its ``flow`` argument): ``"stall"``, a global
#: stall enable (every register advances when ``o.ready | ~o.valid``, ``i.ready`` is
#: that enable, combinational from ``o.ready``); ``"credit"``, credit-based flow control
#: (the pipeline never stalls, a skid FIFO at the output, a registered ``i.ready``).
FLOWS = ("stall", "credit")

#: Cycles the skid FIFO adds between the pipeline's output register and ``o.valid``
#: (:func:`skid_fifo`: the write, the RAM's read into its data register, the
#: output register).
SKID_FIFO_CYCLES = 3


def check_flow(flow, credit_extra=0) -> tuple[str, int]:
    """Validate ``flow`` (one of :data:`FLOWS`) and ``credit_extra`` (skid FIFO entries
    beyond the minimum for one vector per cycle, an int >= 0; only with ``"credit"``).

    Raises:
        TypeError: a str / int of the wrong type (bool refused).
        ValueError: an unknown mode, a negative ``credit_extra``, or ``credit_extra`` > 0
            with ``flow="stall"`` (the message names the argument).
    """
    if not isinstance(flow, str):
        raise TypeError(f"flow must be a str of {FLOWS}, got {type(flow).__name__}")
    if flow not in FLOWS:
        raise ValueError(f"flow (flow control) must be one of {FLOWS}, got {flow!r}")
    if isinstance(credit_extra, bool) or not isinstance(credit_extra, int):
        raise TypeError(f"credit_extra must be an int, got {type(credit_extra).__name__}")
    if credit_extra < 0:
        raise ValueError(f"credit_extra (skid FIFO entries beyond the minimum) must be >= 0, "
                         f"got {credit_extra}")
    if credit_extra and flow != "credit":
        raise ValueError(f"credit_extra (skid FIFO entries) needs flow='credit', "
                         f"got flow={flow!r}")
    return flow, credit_extra


def credit_depth(latency: int, extra: int = 0, beats: int = 1) -> int:
    """Credits of a credit-flow top level whose ``latency_cycles`` is ``latency`` (its
    skid FIFO included) and that takes one vector every ``beats`` cycles:
    ``(latency + 1) // beats + 1 + extra`` vectors in flight at most.

    Why: a vector accepted in cycle t leaves (with ``o.ready`` high) in cycle t + latency;
    the counter decrements from the registered output handshake (``credit_taken``, one
    cycle later), so the vector is counted from cycle t + 1 through t + latency + 1. At
    one vector every ``beats`` cycles the count in a cycle that accepts one is
    ``(latency + 1) // beats`` (the vectors accepted in the ``latency + 1`` cycles before
    it, every ``beats``-th); ``i.ready`` is a register, computed from the count without
    the current cycle's handshakes, so full rate needs ``count < depth`` there. For
    ``beats`` = 1: ``latency + 2``; with one credit fewer the input would pause one cycle
    in every ``latency + 2`` (tests/test_hw_units.py). The FIFO must hold all of them:
    every vector in flight lands in it when ``o.ready`` stays low, so two beats halve the
    skid FIFO.
    """
    return (latency + 1) // beats + 1 + extra


#: Bits per slice of a skid FIFO (the default ``slice_bits`` of skid_fifo and
#: FlowControl): two ECP5 block RAMs (DP16KD, 36 bits wide in their 512 x 36 mode). Each
#: slice has its own copy of the FIFO's control (see skid_fifo).
SKID_SLICE_BITS = 72

#: Largest skid FIFO (bits: width x entries) kept in LUT RAM (``ram_style`` distributed:
#: ECP5 TRELLIS_DPR16X4, 16 entries x 4 bits, read without a clock into the read data
#: flip-flops): 32 Kbit is 512 DPR16X4. Larger ones go to block RAM, which costs no LUT
#: sites but whose read without its output register (Yosys maps a behavioural memory with
#: REGMODE NOREG) has a long clock-to-out (docs/DECISIONS.md, "Skid FIFO slices").
SKID_LUTRAM_BITS = 32768

#: Entries up to which a skid FIFO of any width is kept in LUT RAM: 16 is one
#: TRELLIS_DPR16X4 deep (no read multiplexer), where a block RAM would use 16 of its 512
#: words and bring its clock-to-out (docs/DECISIONS.md, "Skid FIFO slices").
SKID_LUTRAM_ENTRIES = 16


def skid_ram(width: int, depth: int) -> tuple[int, str]:
    """The skid FIFO's RAM for ``width``-bit entries and ``depth`` credits: (entries, the
    smallest power of two >= depth; ``ram_style``: "distributed" (LUT RAM) up to
    :data:`SKID_LUTRAM_BITS` bits of width x entries or up to
    :data:`SKID_LUTRAM_ENTRIES` entries, else "block")."""
    size = 1 << (depth - 1).bit_length()
    lut = width * size <= SKID_LUTRAM_BITS or size <= SKID_LUTRAM_ENTRIES
    return size, "distributed" if lut else "block"


def skid_read_enable(nonempty, rv, load):
    """The skid FIFO's RAM read enable (1-bit Value): the RAM holds an entry
    (``nonempty``) and its read data register is empty (``~rv``) or moves on to the
    output register this cycle (``load``). Reading otherwise would overwrite a held entry."""
    return nonempty & (~rv | load)


def check_slice_bits(slice_bits: int) -> int:
    """``slice_bits`` (bits per skid FIFO slice), checked: a positive int."""
    if not isinstance(slice_bits, int) or isinstance(slice_bits, bool):
        raise TypeError(f"slice_bits must be an int, got {slice_bits!r}")
    if slice_bits < 1:
        raise ValueError(f"slice_bits must be >= 1, got {slice_bits}")
    return slice_bits


def skid_slices(width: int, slice_bits: int = SKID_SLICE_BITS) -> int:
    """Slices of a ``width``-bit skid FIFO (:func:`skid_fifo`): one per ``slice_bits``
    bits (default :data:`SKID_SLICE_BITS`)."""
    return -(-width // check_slice_bits(slice_bits))


def skid_fifo(m: Module, data, valid, o, depth: int, name: str = "skid",
              domains=None, slice_bits: int = SKID_SLICE_BITS) -> None:
    """The skid FIFO of credit flow: ``data`` (written while ``valid``) -> the stream ``o``.
    ``valid``: a Value, or a list of :func:`skid_slices` copies equal in every cycle,
    slice k written while copy k (docs/DECISIONS.md, "Skid FIFO slices").
    ``domains``: None (every slice in ``sync``) or one clock domain name per slice (the
    domain of its control registers: :meth:`ResetCopies.domain`).

    A circular buffer of the smallest power of two >= ``depth`` entries, in LUT RAM up
    to :data:`SKID_LUTRAM_BITS` bits and in block RAM (ECP5 DP16KD) above
    (:func:`skid_ram`), with
    write and read pointers one bit wider than its address (full and empty apart), then
    two places for the head: the RAM's read data register (``rv``: it holds an entry)
    and the output register ``o.payload`` (valid: ``ov``). The output register loads
    the read data when that holds an entry and the output is empty or taken (``load =
    rv & (~ov | o.ready)``); the RAM is read when it is not empty and its read data
    register is empty or being moved on (:func:`skid_read_enable`). So ``o.payload``
    comes from flip-flops and while ``o.valid & ~o.ready`` nothing moves.

    The data is cut into slices of ``slice_bits`` bits (default
    :data:`SKID_SLICE_BITS`), each with its own RAM and its own copy of the control
    (``wp``, ``rp``, ``rv``, ``ov``, ``load``, the read enable; names ``{name}{k}_...``
    for k > 0): every copy sees the same ``valid`` (or its own copy of it), ``o.ready``
    and reset, so all hold the same entries and step together, and ``o.valid`` is slice
    0's ``ov``. Whether the RAM holds an entry (``wp != rp``) is a register of its own
    (``nonempty``, updated from ``rp + 1``, also a register), so the read enable is one
    LUT from registers. Each pointer drives the addresses of one slice's RAMs and each
    ``load`` the enables of its slice's output flip-flops (docs/DECISIONS.md, "Skid FIFO
    slices"). Yosys keeps the copies: each counter's next value depends on itself.

    The caller guarantees (credits) that at most ``depth`` vectors are in the FIFO
    and the pipeline before it; then a write never meets a full buffer, and the
    read and write addresses of one cycle differ whenever both are enabled (a
    read needs a stored entry, written in an earlier cycle). A value written in
    cycle t is at the output (``o.valid``) in cycle t + :data:`SKID_FIFO_CYCLES`
    when the FIFO was empty.
    """
    data = Value.cast(data)
    size, style = skid_ram(len(data), depth)
    abits = size.bit_length() - 1
    nsl = skid_slices(len(data), slice_bits)
    valids = list(valid) if isinstance(valid, (list, tuple)) else [valid] * nsl
    if len(valids) != nsl:
        raise ValueError(f"valid: {len(valids)} copies for {nsl} slices")
    doms = ["sync"] * nsl if domains is None else list(domains)
    if len(doms) != nsl:
        raise ValueError(f"domains: {len(doms)} names for {nsl} slices")
    qs, ov0 = [], None
    for k, lo in enumerate(range(0, len(data), slice_bits)):
        part, valid, sync = data[lo:lo + slice_bits], valids[k], m.d[doms[k]]
        sn = name if k == 0 else f"{name}{k}"
        wp = Signal(abits + 1, name=f"{sn}_wp")
        rp = Signal(abits + 1, name=f"{sn}_rp")
        rp1 = Signal(abits + 1, init=1, name=f"{sn}_rp1")       # rp + 1
        ne = Signal(name=f"{sn}_nonempty")                       # wp != rp, registered
        rv = Signal(name=f"{sn}_rv")
        ov = Signal(name=f"{sn}_valid")
        q = Signal(len(part), name=f"{sn}_q", reset_less=True)
        load = Signal(name=f"{sn}_load")
        take = Signal(name=f"{sn}_take")
        mem = Memory(shape=len(part), depth=size, init=[], attrs={"ram_style": style})
        m.submodules[f"{sn}_ram"] = mem
        wr = mem.write_port()
        rd = mem.read_port(domain="sync", transparent_for=())
        m.d.comb += [wr.addr.eq(wp[:abits]), wr.data.eq(part), wr.en.eq(valid),
                     rd.addr.eq(rp[:abits]), rd.en.eq(take),
                     load.eq(rv & (~ov | o.ready)),
                     take.eq(skid_read_enable(ne, rv, load))]
        with m.If(valid):
            sync += wp.eq(wp + 1)
        with m.If(valid & ~take):
            sync += ne.eq(1)
        with m.Elif(take & ~valid):
            sync += ne.eq(wp != rp1)
        with m.If(take):
            sync += [rp.eq(rp1), rp1.eq(rp1 + 1), rv.eq(1)]
        with m.Elif(load):
            sync += rv.eq(0)
        with m.If(load):
            sync += [q.eq(rd.data), ov.eq(1)]
        with m.Elif(o.ready):
            sync += ov.eq(0)
        qs.append(q)
        ov0 = ov if ov0 is None else ov0
    m.d.comb += [o.valid.eq(ov0), Value.cast(o.payload).eq(Cat(*qs))]


def beat_register_free_next(i_valid, gate, free):
    """Whether the two-beat input register (:class:`FlowControl` with ``beats`` = 2) can
    take a vector in the next enabled cycle: it is then empty or on its last beat, which
    is the case exactly when it takes none in this one (no handshake
    ``i_valid & gate & free``, ``gate`` being the rest of ``i.ready``: after a handshake
    it holds beat 0 next; otherwise it was empty, or on beat 0 and moves to beat 1, or
    on beat 1 and empties). Taking one while beat 0 is on would overwrite the vector
    before its beat 1. ``free``: the copy of the register's free bit whose next value
    this is (each copy's loop stays local, :meth:`FlowControl._serializer`)."""
    return ~(i_valid & gate & free)


class FlowTop:
    """Mixin of a top level with ``flow``, ``credit_extra``, ``beats`` (see
    :class:`FlowControl`) and a ``latency_cycles`` property: its declared :attr:`credits`."""

    @property
    def credits(self) -> int | None:
        """Credit flow: the most vectors in flight (pipeline and skid FIFO),
        :func:`credit_depth`; stall flow: None (the pipeline holds at most
        ``latency_cycles``)."""
        if self.flow != "credit":
            return None
        return credit_depth(self.latency_cycles, self.credit_extra, self.beats)


class FlowControl:
    """The flow control of one top level, built into its module ``m``.

    With ``beats`` = 2 (a top level of W = N/2 lanes per cycle) a vector is accepted into
    a register (``beat_data``) that feeds the pipeline for two enabled cycles, beat 0 then
    beat 1 (:attr:`beat`); ``i.ready`` is also low while beat 0 is on (one vector per two
    cycles, one more cycle of latency). :attr:`payload`, :attr:`i_valid` and
    :attr:`beat` are what the pipeline reads: the input stream's, or the register's.

    ``flow="stall"``: ``en = o.ready | ~o.valid``, ``i.ready = en``; the input's valid
    enters the pipeline as is (a vector is accepted exactly when the pipeline moves),
    and :meth:`output` is the output register, advanced by ``en``, driving ``o``.

    ``flow="credit"``: ``en`` is the constant 1 (every pipeline register loads every
    cycle; only the valid bits have a reset). A counter holds the vectors accepted and
    not yet taken from ``o`` (in the pipeline or in the skid FIFO), decremented one
    cycle after the output handshake (a register, ``credit_taken``); ``i.ready`` is a
    register, set for the next cycle when the next count is below :attr:`depth`
    (:func:`credit_depth`), so neither ``i.ready`` nor any pipeline register depends
    combinationally on ``o.ready``. The pipeline's input valid is the handshake
    ``i.valid & i.ready``; :meth:`output` is the output register (no enable) writing
    the skid FIFO (:func:`skid_fifo`, :data:`SKID_FIFO_CYCLES` more cycles), which
    drives ``o``. The counter never exceeds ``depth``, so nothing is lost; the FIFO
    keeps the order and holds its output while stalled.

    Args:
        m: the top level's module.
        flow: one of :data:`FLOWS` (validated by :func:`check_flow`).
        i, o: the top level's input and output streams.
        latency: its ``latency_cycles`` (with the FIFO's cycles in credit flow).
        credit_extra: credits beyond the minimum (:func:`credit_depth`).
        beats: beats per vector, 1 or 2 (:data:`FOLDS`).
        skid_domains: None, or a function slice -> clock domain name of the skid FIFO's
            slices (:func:`skid_fifo`, :meth:`ResetCopies.skid_domain`).
        slice_bits: bits per skid FIFO slice (:func:`skid_fifo`).
    """

    def __init__(self, m: Module, flow: str, i, o, latency: int, credit_extra: int = 0,
                 beats: int = 1, skid_domains=None, slice_bits: int = SKID_SLICE_BITS):
        check_flow(flow, credit_extra)
        self.slice_bits = check_slice_bits(slice_bits)
        if beats not in FOLDS:
            raise ValueError(f"beats (per vector) must be one of {FOLDS}, got {beats!r}")
        self.m, self.flow, self.o = m, flow, o
        self.skid_domains = skid_domains
        self.payload, self.beat = Value.cast(i.payload), Const(0, 1)
        if flow == "stall":
            self.depth = None
            self.en = Signal(name="en")
            m.d.comb += self.en.eq(o.ready | ~o.valid)
            if beats == 1:
                m.d.comb += i.ready.eq(self.en)
                self.i_valid = i.valid
                return
            free = Signal(name="beat_free")
            m.d.comb += i.ready.eq(self.en & free)
            self._serializer(i, free, i.valid & i.ready, self.en)
            return
        self.depth = credit_depth(latency, credit_extra, beats)
        self.en = Const(1, 1)
        count = Signal(range(self.depth + 1), name="credit_count")
        ready = Signal(init=1, name="credit_ready")
        accept, taken = Signal(name="credit_accept"), Signal(name="credit_taken")
        if beats == 1:
            m.d.comb += i.ready.eq(ready)
        else:
            free = Signal(name="beat_free")
            m.d.comb += i.ready.eq(ready & free)
        # the output handshake, registered: the counter and i.ready sit at the input
        # end, o.valid (the skid FIFO's) and o.ready at the output end of the die
        m.d.comb += accept.eq(i.valid & i.ready)
        m.d.sync += taken.eq(o.valid & o.ready)
        # the next count and i.ready for both values of accept, from registers only; the
        # input handshake (the far end of i.valid) only selects between them
        held = Signal.like(count, name="credit_held")        # count - taken
        more = Signal.like(count, name="credit_more")        # count + 1 - taken
        m.d.comb += [held.eq(count - taken), more.eq(count + ~taken)]
        # i.ready without the sums: taken <= count <= depth, so held < depth unless
        # count = depth and nothing was taken, and more < depth unless count = depth, or
        # count = depth - 1 and nothing was taken (two compares with constants, no chain)
        full, near = Signal(name="credit_full"), Signal(name="credit_near")
        m.d.comb += [full.eq(count == self.depth), near.eq(count == self.depth - 1)]
        m.d.sync += [count.eq(Mux(accept, more, held)),
                     ready.eq(Mux(accept, ~full & (taken | ~near), ~full | taken))]
        self.i_valid = accept
        if beats == 2:
            self._serializer(i, free, accept, ready)

    def _serializer(self, i, free, accept, gate) -> None:
        """Two beats per vector: the accepted payload waits in a register (``beat_data``)
        for two enabled cycles, beat 0 then beat 1 (``beat``). ``free`` (the register can
        take the next vector this cycle: empty, or on its last beat) is a register of its
        own, :func:`beat_register_free_next` of the previous enabled cycle, so that the
        input handshake and the credit counter do not wait on the far ends of
        ``beat_valid`` / ``beat``; ``beat_data`` loads whenever it is free (a load without
        a handshake leaves ``beat_valid`` low). Its clock enable is a copy of that register
        per :data:`ENABLE_GROUP_BITS` bits (``beat_load{k}``, same update rule and reset,
        kept apart by :data:`REPLICA_ATTRS`; docs/DECISIONS.md, "Register replicas"). Each
        copy's next value reads the copy itself with ``i.valid`` and ``gate`` (the rest of
        ``i.ready``), not the handshake ``accept``, so that no loop runs from the copies
        to the handshake logic and back."""
        m = self.m
        data = Signal(len(self.payload), name="beat_data", reset_less=True)
        valid = Signal(name="beat_valid")
        free_r = Signal(init=1, name="beat_free")
        m.d.comb += free.eq(free_r)
        self.i_valid = valid
        beat = self._beat_register(1, "beat")
        slices = range(0, len(data), ENABLE_GROUP_BITS)
        attrs = REPLICA_ATTRS if len(slices) > 1 else {}
        loads = [Signal(init=1, name=f"beat_load{k}", attrs=attrs) for k in range(len(slices))]
        with when(m, self.en):
            m.d.sync += [r.eq(beat_register_free_next(i.valid, gate, r)) for r in [free_r, *loads]]
            for load, lo in zip(loads, slices):
                with m.If(load):
                    m.d.sync += data[lo:lo + ENABLE_GROUP_BITS].eq(
                        self.payload[lo:lo + ENABLE_GROUP_BITS])
            with m.If(accept):
                m.d.sync += valid.eq(1)
            with m.Elif(valid):
                m.d.sync += valid.eq(~beat)
        self.payload, self.beat = data, beat

    def _beat_register(self, count: int, name: str) -> Signal:
        """``count`` bits, each the beat index of the two-beat input register: toggled on
        every enabled cycle with a beat on (``beat_valid``). Beats come in pairs (a
        handshake is taken only while the register is empty or on beat 1), so the index
        is 0 whenever no beat is on and after every beat 1: it needs no reset from the
        handshake, whose input side (``i.valid``) then reaches no copy."""
        r = Signal(count, name=name)
        with when(self.m, self.en):
            with self.m.If(self.i_valid):
                self.m.d.sync += r.eq(~r)
        return r

    def beat_copies(self, count: int) -> Value:
        """``count`` copies of :attr:`beat` (two beats per vector): registers with its
        update rule (:meth:`_beat_register`), every bit equal to it in every cycle. Each
        copy's next value depends on itself, so synthesis keeps them apart and each drives
        only its own lanes' beat select (:func:`beat_of`)."""
        return self.beat if count == 1 else self._beat_register(count, "beat_copy")

    def output(self, payload, valid) -> None:
        """The output register of ``payload`` (a Value or View) and ``valid`` (the
        pipeline's last valid bit), then (credit flow) the skid FIFO, driving ``o``; with
        credits the valid bit in one copy per FIFO slice (``out_valid``,
        ``out_valid{k}``; kept apart by :data:`REPLICA_ATTRS`), each writing its slice."""
        m, o = self.m, self.o
        payload = Value.cast(payload)
        out = Signal(len(payload), name="out_reg", reset_less=True)
        copies = 1 if self.flow == "stall" else skid_slices(len(payload), self.slice_bits)
        attrs = REPLICA_ATTRS if copies > 1 else {}
        out_vs = [Signal(name="out_valid" if k == 0 else f"out_valid{k}", attrs=attrs)
                  for k in range(copies)]
        # with reset copies, each valid copy in its FIFO slice's domain (beside the slice)
        doms = None if self.skid_domains is None or self.flow == "stall" else \
            [self.skid_domains(k, copies) for k in range(copies)]
        with when(m, self.en):
            m.d.sync += out.eq(payload)
            if doms is None:
                m.d.sync += [v.eq(valid) for v in out_vs]
            else:
                for v, dom in zip(out_vs, doms):
                    m.d[dom] += v.eq(valid)
        if self.flow == "stall":
            m.d.comb += [Value.cast(o.payload).eq(out), o.valid.eq(out_vs[0])]
        else:
            skid_fifo(m, out, out_vs, o, self.depth, domains=doms,
                      slice_bits=self.slice_bits)


#: Bits of the two-beat input register (``beat_data``) per copy of its load enable
#: (:meth:`FlowControl._serializer`): the loads of a beat index copy, 8 lanes of 16 bits.
ENABLE_GROUP_BITS = 128

#: Lanes per copy of a beat index (:func:`beat_groups`): the beat select of a two-beat top
#: level drives a multiplexer in every bit of every lane, so each group of this many
#: lanes reads its own copy of the register (docs/DECISIONS.md, "Register replicas").
BEAT_GROUP_LANES = 8


def beat_groups(lanes: int) -> int:
    """Copies of a beat index for ``lanes`` lanes per beat (one per
    :data:`BEAT_GROUP_LANES` lanes, at least one)."""
    return max(1, -(-lanes // BEAT_GROUP_LANES))


def beat_of(beat, lane: int, lanes: int):
    """The copy of the beat index (a Value of :func:`beat_groups` bits, every bit equal)
    that lane ``lane`` of ``lanes`` reads."""
    beat = Value.cast(beat)
    return beat[lane * len(beat) // lanes]


def fold_cycles(beats: int, name: str) -> dict:
    """The latency_breakdown entries of two beats per vector (``beats`` = 2): the input
    register ``name`` (:class:`FlowControl`) and ``"second_beat"``, beat 1 one cycle
    behind beat 0; nothing for one beat."""
    return {name: 1, "second_beat": 1} if beats == 2 else {}


def flow_cycles(flow: str) -> dict:
    """The latency_breakdown entry of the flow control: ``{"skid_fifo":``
    :data:`SKID_FIFO_CYCLES` ``}`` in credit flow, nothing in stall flow."""
    return {"skid_fifo": SKID_FIFO_CYCLES} if flow == "credit" else {}


def collect(m: Module, en, name: str, value, valid) -> tuple[Signal, Value]:
    """The first of two beats of a vector, held: a register (``{name}_first``) loaded
    with ``value`` when beat 0 is ``valid`` (and ``en``), and the beat index at this
    point (``{name}_beat``, toggled by every valid beat: beats arrive in order, beat 0
    first, and nothing is in flight after reset).

    Returns:
        (the register, ``valid`` of beat 1: the whole vector is here this cycle).
    """
    value = Value.cast(value)
    first = Signal(len(value), name=f"{name}_first", reset_less=True)
    beat = beat_index(m, en, name, valid)
    with when(m, en & valid & ~beat):
        m.d.sync += first.eq(value)
    return first, valid & beat


def beat_index(m: Module, en, name: str, valid, copies: int = 1) -> Signal:
    """The beat index (0, 1) of the beat that is ``valid`` at one point of a pipeline of
    two beats per vector: a register (``{name}_beat``, reset 0) toggled by every valid
    beat that moves on (``en``). Beats keep their order, beat 0 first, and nothing is in
    flight after reset, so no index needs to travel with the data. ``copies`` > 1: that
    many such registers, every bit equal (each toggles itself, so synthesis keeps them
    apart; :func:`beat_of` picks a lane's)."""
    beat = Signal(copies, name=f"{name}_beat")
    with when(m, en & valid):
        m.d.sync += beat.eq(~beat)
    return beat


#: Skid FIFO slices (:func:`skid_fifo`) per copy of the reset (:class:`ResetCopies`): the
#: control of 4 slices of 72 bits, 64 flip-flops with reset.
RESET_SKID_SLICES = 4


class ResetCopies:
    """The synchronous reset of a top level through one level of register copies, one
    per region of the die (``reset_copies=True`` of a top level).

    Each copy is a flip-flop loading ``rst`` (kept apart by :data:`REPLICA_ATTRS`) and the
    reset of a local clock domain ``rst{k}`` on the ``sync`` clock; the top level puts the
    registers of one region in one domain (its own registers, a submodule through
    :meth:`place`, the skid FIFO's slices through :meth:`skid_domain`), so that nextpnr
    can place each copy beside its loads (docs/DECISIONS.md, "Reset copies").

    Every register then sees ``rst`` one cycle late: the top level is the same design with
    a reset one cycle longer (its registers in their reset state one cycle after ``rst``
    falls). :meth:`gate` holds ``i.ready`` and ``o.valid`` low while copy 0 is high
    (``busy``, a register: no path from ``rst`` to a port or into the design), so no
    transfer happens in the cycle after ``rst`` falls, whose state the late reset
    discards; a handshake in a cycle with ``rst`` high is void, as without copies. With
    ``count`` = 0 nothing is built: every domain is ``sync`` and :meth:`gate` returns the
    streams as they are.

    Args:
        m: the top level's module (the domains are local to it and its submodules).
        count: copies, 0 (none) or >= 2 (copy 0: the module's own registers).
        skid_first: the first copy of the skid FIFO's slices (copies ``skid_first`` ..
            ``count - 1``, :data:`RESET_SKID_SLICES` slices each).
    """

    def __init__(self, m: Module, count: int, skid_first: int = 1):
        self.count, self.skid_first = count, skid_first
        self.busy = None
        if not count:
            return
        copies = [Signal(name=f"rst_copy{k}", reset_less=True, attrs=REPLICA_ATTRS)
                  for k in range(count)]
        for k, r in enumerate(copies):
            cd = ClockDomain(f"rst{k}", local=True)
            m.domains += cd
            m.d.comb += [cd.clk.eq(ClockSignal("sync")), cd.rst.eq(r)]
        m.d.sync += [r.eq(ResetSignal("sync")) for r in copies]
        self.busy = copies[0]

    def domain(self, k: int) -> str:
        """The clock domain of region ``k`` (``sync`` without copies)."""
        return f"rst{k}" if self.count else "sync"

    def place(self, elaboratable, k: int):
        """``elaboratable`` with its ``sync`` registers in region ``k``'s domain."""
        return DomainRenamer(self.domain(k))(elaboratable) if self.count else elaboratable

    def skid_domain(self, k: int, slices: int) -> str:
        """The domain of skid FIFO slice ``k`` of ``slices``: one copy per
        :data:`RESET_SKID_SLICES` slices, from copy ``skid_first`` on (the last copy
        takes the rest)."""
        if not self.count:
            return "sync"
        return self.domain(min(self.skid_first + k // RESET_SKID_SLICES, self.count - 1))

    def core(self, m: Module, core: Module) -> None:
        """Add ``core`` (the top level's registers, in ``sync``) to ``m`` in region 0."""
        if self.count:
            m.submodules.core = DomainRenamer(self.domain(0))(core)

    def gate(self, m: Module, i, o) -> tuple:
        """The input and output streams the design sees: ``i`` and ``o`` themselves
        without copies; else streams whose ``ready`` (input) and ``valid`` (output) reach
        the ports low while ``busy`` (``i.ready = ready & ~busy``, ``o.valid = valid &
        ~busy``), everything else passed through: what the design takes or gives in that
        cycle the late reset discards at its end."""
        if not self.count:
            return i, o
        ii = stream.Signature(i.payload.shape()).create(path=("core_i",))
        oo = stream.Signature(o.payload.shape()).create(path=("core_o",))
        m.d.comb += [ii.payload.eq(i.payload), ii.valid.eq(i.valid),
                     i.ready.eq(ii.ready & ~self.busy),
                     o.payload.eq(oo.payload), o.valid.eq(oo.valid & ~self.busy),
                     oo.ready.eq(o.ready)]
        return ii, oo


def reset_copy_count(slices: int, regions: int) -> int:
    """Copies of the reset (:class:`ResetCopies`) for ``regions`` regions besides the skid
    FIFO and a FIFO of ``slices`` slices (0: no FIFO)."""
    return regions + -(-slices // RESET_SKID_SLICES)
