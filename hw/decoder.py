"""Top level of the read path: ``KVDecoder``.

Stream in (packed codes + scale bytes [+ zero points], the encoder's output
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
         ``fwht_regs`` registers; for N/G = 2 the block swap, whose per-lane sign
         flags ``flip`` FloatPrep folds into the sign; :mod:`hw.ifwht`)
      -> FloatPrep (saturation flag, leading one of 4-bit groups [REG abs] sign fold,
         leading one [REG lead]
         subnormal clamp, sign) [REG prep]
      -> FloatPack (shift by Lp's high bits + sticky [REG shift] shift by its low
         bits, one's complement correction, RNE [REG round] pack, saturate) -> REG
      -> o.payload

Options: :class:`hw.options.DecoderOptions`. ``latency_cycles = fwht_regs + 2 +
len(float_regs) + len(dq_regs)`` (5 with the defaults), + 3 for the skid FIFO in credit
flow, + the two beats' cycles; flow control as in ``KVEncoder``. Data registers have no
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
from .ifwht import (BlockFWHT, FOLD_ALIGN_CYCLES, effective_align, fold_window, out_width,
                    steps_of, window_kept)
from .fwht import FOLD_CYCLES
from .options import DecoderOptions, FoldOptions
from .pipeline import (Cuts, FlowControl, FlowTop, ResetCopies, beat_groups, beat_index, beat_of,
                       check_lanes, collect, flow_cycles, fold_cycles, reset_copy_count,
                       skid_slices, stage)
from .tofloat import PREP_PORTS, FloatConsts, FloatPack, FloatPrep
from .trees import tree_reduce
from .wire import decoder_input_layout, lanes_layout

#: Optional pipeline registers of the float conversion, in pipeline order:
#: ``"abs"`` after the saturation flag (before the sign fold and the leading-one
#: tree; the conversion never forms |S|, see hw/tofloat.py), ``"lead"`` after the
#: leading-one tree, ``"prep"`` after FloatPrep (subnormal clamp), ``"shift"``
#: inside FloatPack's right shifter (after the shift by Lp's high bits and their
#: sticky bit; ``hw.options.DecoderOptions.pack_shift_low_bits``), ``"round"`` after the RNE
#: increment. Default: ``"prep"``.
FLOAT_CUTS = Cuts("float_regs", ("abs", "lead", "prep", "shift", "round"), default=("prep",))

#: Optional pipeline registers of the dequant: ``"scale"`` after the scale decode (with
#: two beats, of the beat's blocks, and the beat's codes; every block's exponent field
#: for ef_min), so that the scale bytes' route from the input register ends in a register;
#: ``"table"`` after the per-block product tables (``hw.dequant.dequant_table``), ef_min
#: and the shifts, with the codes, so that the lanes' code select is the only logic
#: before the dequant register (docs/DECISIONS.md, "Dequant product tables"). Default:
#: none.
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


def read_fwht(params: FormatParams, opts: DecoderOptions) -> BlockFWHT:
    """The read path's inverse FWHT as :class:`KVDecoder` builds it with ``opts``: N, G,
    the dequant products' shape, the scale format's largest shift, the lanes per beat, the
    alignment (``split_align``; ``fold.align``: in the fold) and the side band ``ef_min``
    (the scale format's exponent bits) delayed alongside."""
    sf, fold = scale_format(params), opts.fold
    return BlockFWHT(params.n, params.block, product_shape(level_table(params)), opts.fwht_regs,
                     side_width=data.StructLayout({"ef_min": sf.exp_bits}),
                     max_align=sf.max_align, split_align=opts.split_align,
                     align="fold" if fold.align else None, lanes=opts.lanes or params.n,
                     window=read_window(params, fold) if fold.align else None,
                     window_exp="ef_min", window_step=fold.window_step,
                     shift_x_bits=fold.shift_x_bits)


def read_window(params: FormatParams, fold: FoldOptions = FoldOptions()) -> int | None:
    """The fold window D of the read path's two-beat fold (``hw.ifwht.fold_window``): the
    lanes into the fold are the products plus log2(N/2) bits, the precision that of the
    input type (stored mantissa bits + 1). None without ``fold.window``, or when D is not
    below the scale format's largest shift (no lane would be cut)."""
    if not fold.window:
        return None
    w = out_width(params.n // 2, params.block, product_shape(level_table(params)).width,
                  aligned=False)
    d = fold_window(w, params.in_format[1] + 1)
    return d if d < scale_format(params).max_align else None


def float_consts(params: FormatParams, fold: FoldOptions | None = None) -> FloatConsts:
    """The float conversion's constants of the read path of ``params``: the FWHT's output
    width (``hw.ifwht.out_width``; with ``fold.align`` the fold window D in place of the
    largest shift, :func:`read_window`), the input type, the exponent-field range of the
    scale encoding and ``T = ef_min + scale_offset + exp_offset - log2 N``."""
    sf, table = scale_format(params), level_table(params)
    window = read_window(params, fold) if fold is not None and fold.align else None
    w = out_width(params.n, params.block, product_shape(table).width,
                  window_kept(window, sf.max_align,
                              fold.window_step if fold is not None else None))
    return FloatConsts(w, params.in_format, (sf.ef_min, sf.ef_max),
                       sf.exp_offset + table.exp_offset - params.log2n)


def float_parts(params: FormatParams, opts: DecoderOptions) -> dict:
    """The read path's float conversion as :class:`KVDecoder` builds it with ``opts``:
    FloatPrep (with the fold window's per-lane exponent, ``alt_exp``, where the window
    applies) and FloatPack of the lanes per beat, with the ``float_regs`` cuts inside them:
    {"fprep": FloatPrep, "fpack": FloatPack}."""
    fold, regs, lanes = opts.fold, opts.float_regs, opts.lanes or params.n
    consts = float_consts(params, fold)
    return {"fprep": FloatPrep(lanes, consts.y_width, scale_format(params).exp_bits, consts,
                               abs_reg="abs" in regs, lead_reg="lead" in regs,
                               alt_exp=fold.align and read_window(params, fold) is not None,
                               lod_split=opts.lod_split),
            "fpack": FloatPack(lanes, consts, shift_reg="shift" in regs,
                               round_reg="round" in regs,
                               shift_low_bits=opts.pack_shift_low_bits if "shift" in regs
                               else None)}


class KVDecoder(FlowTop, wiring.Component):
    """KV-cache read path (see module docstring).

    Args:
        params: format parameters (``sim_models.FormatParams``); fp16 or bf16 output.
        opts: implementation options (:class:`hw.options.DecoderOptions`; default: its
            defaults). They change registers, flow control, lanes and the fold, never the
            bytes.

    Raises:
        TypeError / ValueError: ``params`` or ``opts`` refused (the message names the
            field; a format option the read path does not implement:
            :data:`hw.dequant.READ_SUPPORT`).
    """

    def __init__(self, params: FormatParams, opts: DecoderOptions | None = None):
        check_read_params(params)
        opts = DecoderOptions() if opts is None else opts
        if not isinstance(opts, DecoderOptions):
            raise TypeError(f"opts must be a DecoderOptions, got {type(opts).__name__}")
        opts.check(params)
        self.opts = opts
        self.dq_regs = opts.dq_regs
        self.flow, self.credit_extra = opts.flow, opts.credit_extra
        self.lanes = check_lanes(params, opts.lanes)
        self.beats = params.n // self.lanes
        self.float_regs = opts.float_regs
        self.split_align = opts.split_align
        self.fold_align = opts.fold.align
        self.reset_copies = opts.reset_copies
        self.params = params
        self.latency = opts.fwht_regs
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
            read_fwht(p, self.opts), 1)
        m.d.comb += [fw.en.eq(en), fw.i_valid.eq(dq["valid"]), fw.p.eq(dq["prod"]),
                     fw.d.eq(dq["shift"]), fw.side_i.ef_min.eq(dq["efmin"])]
        mask = sign_mask_int(p.n, p.sign_seed)
        if two:     # D of the output beat: lanes [0, W), then [W, N)
            ybeat = beat_index(m, en, "ifwht_out", fw.o_valid, beat_groups(w))
            mask = Cat(Mux(beat_of(ybeat, k, w), (mask >> (w + k)) & 1, (mask >> k) & 1)
                       for k in range(w))

        # ---- float conversion: prep [+ register] + pack + output register -------------
        regs = self.float_regs
        parts = float_parts(p, self.opts)
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
