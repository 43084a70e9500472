"""Top level of the read path: ``KVDecompressor``.

Stream in (packed codes + scale bytes [+ zero points], the epilogue's output
without the flags) -> stream out (N fp16/bf16 bit patterns), bit-exact with
``sim_models.codec.decode`` (docs/FORMAT.md 5; 3.7 for the quantizer
modes): ``x_hat = D * (H yhat) / N``,
``yhat_i = level(c_i) * scale_k`` (:mod:`hw.dequant`), computed exactly and
rounded once to the input type (round to nearest even, saturating at the
largest finite value, never inf/NaN; an exact zero keeps the sign of D as in
the golden model).

Interface (Verilog names after ``amaranth.back.verilog.convert``):

    clk, rst                  default sync domain, synchronous active-high reset
    i__valid, i__ready (out)  input stream
    i__payload                codes | scales | [zeros (mode asym)]
                              (code plane, scale plane and, for mode asym only,
                              the zero-point plane, each a little-endian integer
                              of its bytes, FORMAT.md 4 and 7;
                              :func:`hw.wire.decoder_input_layout`)
    o__valid (out), o__ready  output stream
    o__payload [16*N]         lane k's fp16/bf16 pattern at bits [16k, 16k+16)

Pipeline (no stalls; [REG name] = optional register of ``dq_regs`` / ``float_regs``):

    i.payload -> scale decode [REG scale] per block the 2^b products level * sig,
      ef_min, shifts [REG table] -> each lane selects its product by code -> REG
      -> BlockFWHT (inner stages on narrow ints, block alignment, outer stages;
         ``latency`` registers; for N/G = 2 the block swap, whose per-lane sign
         flags ``flip`` FloatPrep folds into the sign; see hw/ifwht.py)
      -> FloatPrep (saturation flag, leading one of 4-bit groups [REG abs] sign fold,
         leading one [REG lead]
         subnormal clamp, sign) [REG prep]
      -> FloatPack (shift by Lp's high bits + sticky [REG shift] shift by its low
         bits, one's complement correction, RNE [REG round] pack, saturate) -> REG
      -> o.payload

``latency_cycles = latency + 2 + len(float_regs) + len(dq_regs)`` (5 for the defaults:
latency 2, float_regs ("prep",)), plus 3 for the skid FIFO in credit flow. Flow
control as in ``KVEpilogue`` (``flow``: :class:`hw.pipeline.FlowControl`): every
register stage carries a valid bit; ``"stall"``: the whole pipeline advances when
``en = o.ready | ~o.valid`` and ``i.ready = en``; ``"credit"``: it never stalls, the
output goes through a skid FIFO and ``i.ready`` is a credit register. One vector per
cycle (``lanes`` = N/2: per two cycles) while ``o.ready`` is high; data registers have no
reset, valid bits do.

Supported options: :data:`hw.dequant.READ_SUPPORT` (mode and scale encoding);
decoding does not depend on scale_rule / scale_round / scale_mult / mant_bits,
which are accepted at any value. Others are refused (ValueError naming the
field). The quantizer enters only through :func:`hw.dequant.level_table`
(code -> level) and :class:`hw.dequant.ScaleDecode` (byte -> significand,
exponent field).
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from sim_models.params import FormatParams
from sim_models.signs import sign_mask_int

from .dequant import (ScaleDecode, check_read_params, dequant_table, level_table, product_shape,
                      scale_format)
from . import ifwht
from .ifwht import (BlockFWHT, FOLD_ALIGN_CYCLES, effective_align, fold_window, out_width,
                    steps_of, window_kept)
from .fwht import FOLD_CYCLES
from .pipeline import (Cuts, FlowControl, FlowTop, ResetCopies, beat_groups, beat_index, beat_of,
                       check_flow, check_lanes, check_latency, collect, flow_cycles, fold_cycles,
                       reset_copy_count, skid_slices, stage)
from .tofloat import PREP_PORTS, FloatConsts, FloatPack, FloatPrep
from .trees import tree_reduce
from .wire import decoder_input_layout, lanes_layout

#: Optional pipeline registers of the float conversion, in pipeline order:
#: ``"abs"`` after the saturation flag (before the sign fold and the leading-one
#: tree; the conversion never forms |S|, see hw/tofloat.py), ``"lead"`` after the
#: leading-one tree, ``"prep"`` after FloatPrep (subnormal clamp), ``"shift"``
#: inside FloatPack's right shifter (after the shift by Lp's high bits and their
#: sticky bit; ``hw.tofloat.PACK_SHIFT_LOW_BITS``), ``"round"`` after the RNE
#: increment. Default: ``"prep"``.
FLOAT_CUTS = Cuts("float_regs", ("abs", "lead", "prep", "shift", "round"), default=("prep",))

#: Optional pipeline registers of the dequant: ``"scale"`` after the scale decode (with
#: two beats, of the beat's blocks, and the beat's codes; every block's exponent field
#: for ef_min), so that the scale bytes' route from the input register ends in a register
#: (the N=128 decoder's worst path once the product tables were LUT logic: 5.1 ns of
#: routing from the input register to the tables); ``"table"`` after the per-block
#: product tables (``hw.dequant.dequant_table``), ef_min and the shifts, with the codes,
#: so that the lanes' code select is the only logic before the dequant register (the
#: N=128 decoder's worst path ran from a scale byte through the decode and the product of
#: all lanes of its block). Default: none.
DQ_CUTS = Cuts("dq_regs", ("scale", "table"), default=())


def fwht_step_list(params: FormatParams, lanes: int, split_align: bool = False,
                   fold_align: bool = False) -> list:
    """Steps of the read path's FWHT (``hw.ifwht.BlockFWHT`` over ``lanes`` = W lanes,
    ``hw.ifwht.steps_of``): log2 W butterfly stages and the block alignment (with
    ``split_align`` its parts: the block swap's select for N/G = 2 in one beat, the
    shifts by the high and the low bits of d; none for N = G, nor with ``fold_align``:
    it is in the fold). ValueError: ``fold_align`` without two beats of one block each."""
    align = effective_align(params.n, params.block, lanes, "fold" if fold_align else None)
    return steps_of(lanes, params.block, split_align,
                    params.n > params.block and align != "fold", align == "swap")


def fwht_steps(params: FormatParams, lanes: int, split_align: bool = False,
               fold_align: bool = False) -> int:
    """The number of :func:`fwht_step_list`: the most FWHT registers ``latency`` can
    place, one per step."""
    return len(fwht_step_list(params, lanes, split_align, fold_align))


def read_fwht(params: FormatParams, latency: int, split_align: bool = False,
              fold_align: bool = False, lanes: int | None = None) -> BlockFWHT:
    """The read path's inverse FWHT as :class:`KVDecompressor` builds it: N, G, the
    dequant products' shape, the scale format's largest shift, ``lanes`` per beat (default
    N), the alignment (``split_align``; ``fold_align``: in the fold) and the side band
    ``ef_min`` (the scale format's exponent bits) delayed alongside."""
    sf = scale_format(params)
    return BlockFWHT(params.n, params.block, product_shape(level_table(params)), latency,
                     side_width=data.StructLayout({"ef_min": sf.exp_bits}),
                     max_align=sf.max_align, split_align=split_align,
                     align="fold" if fold_align else None, lanes=lanes or params.n,
                     window=read_window(params) if fold_align else None,
                     window_exp="ef_min")


def read_window(params: FormatParams) -> int | None:
    """The fold window D of the read path's two-beat fold (``hw.ifwht.fold_window``): the
    lanes into the fold are the products plus log2(N/2) bits, the precision that of the
    input type (stored mantissa bits + 1). None when ``hw.ifwht.FOLD_WINDOW`` is off or
    D is not below the scale format's largest shift (no lane would be cut)."""
    if not ifwht.FOLD_WINDOW:
        return None
    w = out_width(params.n // 2, params.block, product_shape(level_table(params)).width,
                  aligned=False)
    d = fold_window(w, params.in_format[1] + 1)
    return d if d < scale_format(params).max_align else None


def float_consts(params: FormatParams, fold_align: bool = False) -> FloatConsts:
    """The float conversion's constants of the read path of ``params``: the FWHT's output
    width (``hw.ifwht.out_width``; with ``fold_align`` the fold window D in place of the
    largest shift, :func:`read_window`), the input type, the exponent-field range of the
    scale encoding and ``T = ef_min + scale_offset + exp_offset - log2 N``."""
    sf, table = scale_format(params), level_table(params)
    window = read_window(params) if fold_align else None
    w = out_width(params.n, params.block, product_shape(table).width,
                  window_kept(window, sf.max_align))
    return FloatConsts(w, params.in_format, (sf.ef_min, sf.ef_max),
                       sf.exp_offset + table.exp_offset - params.log2n)


def float_parts(params: FormatParams, lanes: int, float_regs, fold_align: bool = False) -> dict:
    """The read path's float conversion as :class:`KVDecompressor` builds it: FloatPrep
    (with the fold window's per-lane exponent, ``alt_exp``, where the window applies) and
    FloatPack of ``lanes`` lanes, with the ``float_regs`` cuts inside them:
    {"fprep": FloatPrep, "fpack": FloatPack}."""
    consts = float_consts(params, fold_align)
    return {"fprep": FloatPrep(lanes, consts.y_width, scale_format(params).exp_bits, consts,
                               abs_reg="abs" in float_regs, lead_reg="lead" in float_regs,
                               alt_exp=fold_align and read_window(params) is not None),
            "fpack": FloatPack(lanes, consts, shift_reg="shift" in float_regs,
                               round_reg="round" in float_regs)}


class KVDecompressor(FlowTop, wiring.Component):
    """KV-cache read path (see module docstring).

    Args:
        params: format parameters (``sim_models.FormatParams``); fp16 or bf16 output.
        latency: FWHT pipeline registers, in [0, S] (default 2): S = :func:`fwht_steps`,
            log2 W butterfly stages and the block alignment (one register per step at most).
        float_regs: which optional registers of the float conversion to place
            (names from :data:`FLOAT_CUTS`, any order; default
            ``FLOAT_CUTS.default``); each adds one cycle of latency.
        split_align: the FWHT's block alignment as its parts, one step each (the block
            swap's select, the high and the low shift), so that ``latency`` registers can
            sit between them (``hw.ifwht.BlockFWHT``; default False).
        flow: flow control, ``"stall"`` (default) or ``"credit"`` (:class:`KVEpilogue`).
        credit_extra: credit flow only: skid FIFO entries beyond the minimum
            (:func:`hw.pipeline.credit_depth`).
        lanes: W, lanes per cycle: None / N (default) or N/2, each vector as two beats
            (ef_min over all N/G blocks, the last butterfly stage across the beats; one
            vector every two cycles, ``latency_cycles`` + 4; ``latency`` in [0, log2 W];
            G must divide W; hw/README.md).
        dq_regs: optional registers of the dequant (names from :data:`DQ_CUTS`; default
            none); each adds one cycle of latency.
        fold_align: two beats of one block each (``lanes`` = G = N/2) only: the block
            alignment in the last stage across the beats instead of a W-point network step
            (``hw.ifwht.fold_align_stage``: no lane wider than the narrow integers before
            the fold; the fold takes 2 + ``hw.ifwht.FOLD_BRIDGE_REGS`` cycles more; default
            False).
        reset_copies: the reset through register copies, one per region (this module's
            registers, the FWHT's, every ``hw.pipeline.RESET_SKID_SLICES`` slices of the
            skid FIFO with their valid copies; ``hw.pipeline.ResetCopies``): every register
            is reset one cycle later, and ``i.ready`` / ``o.valid`` are low in the cycle
            after ``rst`` falls (default False).

    Raises:
        TypeError: ``params`` is not a FormatParams / ``latency`` not an int.
        ValueError: ``latency`` out of range, or a format option the read path does
            not implement (:data:`hw.dequant.READ_SUPPORT`; the message names the field).
    """

    def __init__(self, params: FormatParams, latency: int = 2,
                 float_regs=FLOAT_CUTS.default, split_align: bool = False, flow: str = "stall",
                 credit_extra: int = 0, lanes: int | None = None, dq_regs=DQ_CUTS.default,
                 fold_align: bool = False, reset_copies: bool = False):
        check_read_params(params)
        self.dq_regs = DQ_CUTS.check(dq_regs)
        self.flow, self.credit_extra = check_flow(flow, credit_extra)
        self.lanes = check_lanes(params, lanes)
        self.beats = params.n // self.lanes
        self.float_regs = FLOAT_CUTS.check(float_regs)
        if not isinstance(split_align, bool):
            raise TypeError(f"split_align must be a bool, got {type(split_align).__name__}")
        self.split_align = split_align
        if not isinstance(fold_align, bool):
            raise TypeError(f"fold_align must be a bool, got {type(fold_align).__name__}")
        try:
            steps = fwht_steps(params, self.lanes, split_align, fold_align)
        except ValueError as e:
            if not fold_align:
                raise
            raise ValueError(f"fold_align: {e}") from None
        self.fold_align = fold_align
        if not isinstance(reset_copies, bool):
            raise TypeError(f"reset_copies must be a bool, got {type(reset_copies).__name__}")
        self.reset_copies = reset_copies
        self.params = params
        self.latency = check_latency(params, latency, self.lanes, steps)
        self.table = level_table(params)
        self.scale_fmt = scale_format(params)
        super().__init__({
            "i": In(stream.Signature(decoder_input_layout(params))),
            "o": Out(stream.Signature(lanes_layout(params))),
        })

    @property
    def latency_breakdown(self) -> dict:
        """Register stages per pipeline section (sums to :attr:`latency_cycles`); the
        float registers appear only where placed (``float_abs_reg`` / ``float_prep_reg``
        / ``float_shift_reg``)."""
        return {**fold_cycles(self.beats, "beat_data"),
                **{f"dq_{r}_reg": 1 for r in self.dq_regs}, "dequant_reg": 1, "fwht": self.latency,
                **({"fold_stage": FOLD_ALIGN_CYCLES if self.fold_align else FOLD_CYCLES}
                   if self.beats > 1 else {}),
                **{f"float_{r}_reg": 1 for r in self.float_regs}, "output_reg": 1,
                **flow_cycles(self.flow)}

    @property
    def latency_cycles(self) -> int:
        """Cycles from the ``i`` handshake to ``o.valid`` without stalls."""
        return sum(self.latency_breakdown.values())

    def elaborate(self, platform):
        top = Module()
        p = self.params
        n, g, nb = p.n, p.block, p.n_blocks
        pshape = product_shape(self.table)
        # regions of the reset copies: 0 this module (the float conversion's registers have
        # no reset), 1 the FWHT, then the skid FIFO's slices and their valid copies
        slices = skid_slices(len(Value.cast(self.o.payload))) if self.flow == "credit" else 0
        rc = ResetCopies(top, reset_copy_count(slices, 2) if self.reset_copies else 0,
                         skid_first=2)
        m = Module() if self.reset_copies else top
        i, o = rc.gate(top, self.i, self.o)

        fc = FlowControl(m, self.flow, i, o, self.latency_cycles, self.credit_extra,
                         beats=self.beats,
                         skid_domains=rc.skid_domain if self.reset_copies else None)
        en = fc.en
        w, two = self.lanes, self.beats > 1

        # ---- dequant: per block the 2^b products level * sig, lanes select by code ------
        sf = self.scale_fmt
        pay = data.View(decoder_input_layout(p), fc.payload) if two else i.payload
        sigs, efs, zeros = [], [], []
        for k in range(nb):
            sd = ScaleDecode(sf)
            m.submodules[f"scale{k}"] = sd
            m.d.comb += sd.byte.eq(pay.scales[k])
            sigs.append(sd.sig)
            efs.append(sd.ef)
            zeros.append(pay.zeros[k] if p.zero_bytes else None)
        ef_all = efs            # ef_min is over all N/G blocks (both beats)
        codes = [pay.codes[i * p.bits:(i + 1) * p.bits] for i in range(n)]
        if two:     # beat 0: lanes [0, W) and their blocks, beat 1: [W, N)
            # one copy per lane group for the code selects, one more for the blocks' scale
            # logic (placed beside the tables, not beside the lanes of group 0)
            beat = fc.beat_copies(beat_groups(w) + 1)
            codes = [Mux(beat_of(beat[:-1], i, w), codes[w + i], codes[i]) for i in range(w)]
            sigs, efs = ([Mux(beat[-1], v[w // g + k], v[k]) for k in range(w // g)]
                         for v in (sigs, efs))
            if p.zero_bytes:
                zeros = [Mux(beat[-1], zeros[w // g + k], zeros[k]) for k in range(w // g)]
            n, nb = w, w // g
        valid = fc.i_valid
        if "scale" in self.dq_regs:     # the decoded scales (of the beat) and codes registered
            more = {"efall": ef_all} if two else {}     # one beat: efs are all of them
            if p.zero_bytes:
                more["zero"] = zeros[:nb]
            sc = stage(m, en, "dqs", sig=sigs, ef=efs, code=codes, valid=valid, **more)
            sigs, efs, codes, valid = (sc[k] for k in ("sig", "ef", "code", "valid"))
            ef_all = sc["efall"] if two else efs
            zeros = sc["zero"] if p.zero_bytes else zeros
        tables = [dequant_table(m, self.table, sigs[k], f"dq{k}", zeros[k]) for k in range(nb)]
        ef_min = tree_reduce(m, ef_all, lambda a, b: Mux(a < b, a, b), "efmin")
        dw = max(1, sf.max_align.bit_length())
        shifts = [Signal(dw, name=f"dq_shift{k}") for k in range(nb)]
        m.d.comb += [shifts[k].eq(efs[k] - ef_min) for k in range(nb)]
        if "table" in self.dq_regs:     # the block tables, codes and shifts registered
            t = stage(m, en, "dqt", table=tables, code=codes, shift=shifts, efmin=ef_min,
                      valid=valid)
            tables, codes, shifts, ef_min, valid = (t[k] for k in ("table", "code", "shift",
                                                                   "efmin", "valid"))
        pw = pshape.width       # a lane's product: its block table's entry at its code
        entries = [Array(Value.cast(v)[f * pw:(f + 1) * pw] for f in range(1 << p.bits))
                   for v in tables]
        prod = Signal(data.ArrayLayout(pshape, n), name="dq_prod_c")
        m.d.comb += [prod[i].eq(entries[i // g][codes[i]]) for i in range(n)]
        shift = Signal(data.ArrayLayout(dw, nb), name="dq_shift_c")
        m.d.comb += [shift[k].eq(shifts[k]) for k in range(nb)]
        dq = stage(m, en, "dq", prod=prod, shift=shift, efmin=ef_min, valid=valid)

        # ---- inverse FWHT (ef_min rides along as side band) ------------------------------
        m.submodules.ifwht = fw = rc.place(
            read_fwht(p, self.latency, self.split_align, self.fold_align, w), 1)
        m.d.comb += [fw.en.eq(en), fw.i_valid.eq(dq["valid"]), fw.p.eq(dq["prod"]),
                     fw.d.eq(dq["shift"]), fw.side_i.ef_min.eq(dq["efmin"])]
        mask = sign_mask_int(p.n, p.sign_seed)
        if two:     # D of the output beat: lanes [0, W), then [W, N)
            ybeat = beat_index(m, en, "ifwht_out", fw.o_valid, beat_groups(w))
            mask = Cat(Mux(beat_of(ybeat, k, w), (mask >> (w + k)) & 1, (mask >> k) & 1)
                       for k in range(w))

        # ---- float conversion: prep [+ register] + pack + output register -------------
        regs = self.float_regs
        parts = float_parts(p, n, regs, self.fold_align)
        m.submodules.fprep = fp = parts["fprep"]
        assert fp.c.y_width == fw.out_width and fp.alt_exp == (fw.window is not None)
        m.d.comb += [fp.y.eq(fw.y), fp.flip.eq(fw.flip), fp.ef_min.eq(fw.side_o.ef_min),
                     fp.mask.eq(mask)]
        if fw.window is not None:   # the fold window: lanes at 2^s, the rest at 2^0
            m.d.comb += [fp.ef_alt.eq(fw.exp_alt), fp.alt.eq(fw.alt)]
        valid = fw.o_valid
        if "abs" in regs or "lead" in regs:
            m.d.comb += fp.en.eq(en)
        for r in ("abs", "lead"):       # the data registers are inside FloatPrep
            if r in regs:
                valid = stage(m, en, r, valid=valid)["valid"]
        prep = {k: getattr(fp, k) for k in PREP_PORTS}
        if "prep" in regs:
            prep = stage(m, en, "fp", **prep, valid=valid)
            valid = prep["valid"]
        m.submodules.fpack = pk = parts["fpack"]
        m.d.comb += [getattr(pk, k).eq(prep[k]) for k in PREP_PORTS]
        if "shift" in regs or "round" in regs:
            m.d.comb += pk.en.eq(en)
        for r in ("shift", "round"):    # the data registers are inside FloatPack
            if r in regs:
                valid = stage(m, en, r, valid=valid)["valid"]
        if not two:
            fc.output(pk.bits, valid)
        else:
            first, last = collect(m, en, "first", pk.bits, valid)
            fc.output(Cat(first, pk.bits), last)
        rc.core(top, m)
        return top
