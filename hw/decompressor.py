"""Top level of the read path: ``KVDecompressor``.

Stream in (packed codes + scale bytes [+ zero points], the epilogue's output
without the flags) -> stream out (N fp16/bf16 bit patterns), bit-exact with
``sim_models.codec.decode`` (FORMAT.md 5; docs/ACCURACY.md "Exact integer
rules" for the quantizer modes): ``x_hat = D * (H yhat) / N``,
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

Pipeline (no stalls; [REG name] = optional register of ``float_regs``):

    i.payload -> dequant (comb: scale decode, level * sig, ef_min, shifts) -> REG
      -> BlockFWHT (inner stages on narrow ints, block alignment, outer stages;
         ``latency`` registers, see hw/ifwht.py)
      -> FloatPrep (|S| [REG abs] leading one, subnormal clamp, sign) [REG prep]
      -> FloatPack (shift + sticky [REG shift] RNE, pack, saturate) -> REG -> o.payload

``latency_cycles = latency + 2 + len(float_regs)`` (5 for the defaults:
latency 2, float_regs ("prep",)). Flow control as
in ``KVEpilogue``: every register stage carries a valid bit, the whole pipeline
advances when ``en = o.ready | ~o.valid`` and ``i.ready = en``; one vector per
cycle while ``o.ready`` is high; data registers have no reset, valid bits do.

Supported options: :data:`hw.dequant.READ_SUPPORT` (mode and scale encoding);
decoding does not depend on scale_rule / scale_round / scale_mult / mant_bits,
which are accepted at any value. Others are refused (ValueError naming the
field). The quantizer enters only through :func:`hw.dequant.level_table`
(code -> level) and :class:`hw.dequant.ScaleDecode` (byte -> significand,
exponent field).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from sim_models.params import FormatParams
from sim_models.signs import sign_mask_int

from .dequant import (ScaleDecode, check_read_params, dequant_lane, level_table, product_shape,
                      scale_format)
from .frontend import tree_reduce
from .pipeline import check_cuts, check_latency
from .ifwht import BlockFWHT
from .tofloat import FloatConsts, FloatPack, FloatPrep
from .wire import decoder_input_layout, lanes_layout

#: Optional pipeline registers of the float conversion, in pipeline order:
#: ``"abs"`` after |S| (before the leading-one tree), ``"prep"`` after FloatPrep
#: (leading one, subnormal clamp), ``"shift"`` after FloatPack's right shifter and
#: sticky bit (before RNE, packing, saturation).
FLOAT_REGS = ("abs", "prep", "shift")
#: Default float-conversion registers.
DEFAULT_FLOAT_REGS = ("prep",)
#: Register stages outside the FWHT with the default placement: dequant register,
#: the default float registers, output register.
FIXED_LATENCY = 2 + len(DEFAULT_FLOAT_REGS)



def check_float_regs(float_regs) -> tuple[str, ...]:
    """Validate ``float_regs`` (names from :data:`FLOAT_REGS`); see
    :func:`hw.pipeline.check_cuts`."""
    return check_cuts("float_regs", float_regs, FLOAT_REGS)


class KVDecompressor(wiring.Component):
    """KV-cache read path (see module docstring).

    Args:
        params: format parameters (``sim_models.FormatParams``); fp16 or bf16 output.
        latency: FWHT pipeline registers, in [0, log2 N] (default 2).
        float_regs: which optional registers of the float conversion to place
            (a subset of :data:`FLOAT_REGS`, any order; default
            :data:`DEFAULT_FLOAT_REGS`); each adds one cycle of latency.

    Raises:
        TypeError: ``params`` is not a FormatParams / ``latency`` not an int.
        ValueError: ``latency`` out of range, or a format option the read path does
            not implement (:data:`hw.dequant.READ_SUPPORT`; the message names the field).
    """

    def __init__(self, params: FormatParams, latency: int = 2,
                 float_regs=DEFAULT_FLOAT_REGS):
        check_read_params(params)
        self.float_regs = check_float_regs(float_regs)
        self.params = params
        self.latency = check_latency(params, latency)
        self.table = level_table(params)
        self.scale_fmt = scale_format(params)
        super().__init__({
            "i": In(stream.Signature(decoder_input_layout(params))),
            "o": Out(stream.Signature(lanes_layout(params))),
        })

    @property
    def latency_cycles(self) -> int:
        """Cycles from the ``i`` handshake to ``o.valid`` without stalls."""
        return self.latency + 2 + len(self.float_regs)

    def elaborate(self, platform):
        m = Module()
        p = self.params
        n, g, nb = p.n, p.block, p.n_blocks
        pshape = product_shape(self.table)

        en = Signal()
        m.d.comb += [en.eq(self.o.ready | ~self.o.valid), self.i.ready.eq(en)]

        # ---- dequant (combinational) + register -----------------------------------
        sf = self.scale_fmt
        pay = self.i.payload
        sigs, efs = [], []
        for k in range(nb):
            sd = ScaleDecode(sf)
            m.submodules[f"scale{k}"] = sd
            m.d.comb += sd.byte.eq(pay.scales[k])
            sigs.append(sd.sig)
            efs.append(sd.ef)
        zeros = [pay.zeros[k] for k in range(nb)] if p.zero_bytes else [None] * nb
        ef_min = tree_reduce(m, efs, lambda a, b: Mux(a < b, a, b), "efmin")
        codes = [pay.codes[i * p.bits:(i + 1) * p.bits] for i in range(n)]
        prods, negs = [], []
        for i in range(n):
            pr, ng = dequant_lane(m, self.table, codes[i], sigs[i // g], f"dq{i}", zeros[i // g])
            prods.append(pr)
            negs.append(ng)
        # signed zeros of the golden float64 path: yhat_i = level * 0.0 is -0.0 for a
        # negative level (sig 0: scale byte 0x00); see hw/ifwht.py
        zneg = Signal(n, name="dq_zneg_c")
        m.d.comb += zneg.eq(Cat(*(negs[i] & (sigs[i // g] == 0) for i in range(n))))
        allzero = Signal(name="dq_allzero_c")
        m.d.comb += allzero.eq(~Cat(*(pr != 0 for pr in prods)).any())

        efw = sf.exp_bits
        dw = max(1, sf.max_align.bit_length())
        p_r = Signal(data.ArrayLayout(pshape, n), name="dq_prod", reset_less=True)
        d_r = Signal(data.ArrayLayout(dw, nb), name="dq_shift", reset_less=True)
        ef_r = Signal(efw, name="dq_efmin", reset_less=True)
        z_r = Signal(n, name="dq_zneg", reset_less=True)
        az_r = Signal(name="dq_allzero", reset_less=True)
        v_r = Signal(name="dq_valid")
        with m.If(en):
            m.d.sync += [p_r[i].eq(prods[i]) for i in range(n)]
            m.d.sync += [d_r[k].eq(efs[k] - ef_min) for k in range(nb)]
            m.d.sync += [ef_r.eq(ef_min), z_r.eq(zneg), az_r.eq(allzero), v_r.eq(self.i.valid)]

        # ---- inverse FWHT ------------------------------------------------------------
        m.submodules.ifwht = fw = BlockFWHT(n, g, pshape, self.latency, side_width=efw + 1,
                                            max_align=sf.max_align)
        m.d.comb += [fw.en.eq(en), fw.i_valid.eq(v_r), fw.p.eq(p_r), fw.d.eq(d_r),
                     fw.side_i.eq(Cat(ef_r, az_r)), fw.zneg.eq(z_r)]

        # ---- float conversion: prep + register + pack + output register -------------
        consts = FloatConsts(fw.out_width, p.in_format, (sf.ef_min, sf.ef_max),
                             sf.exp_offset + self.table.exp_offset - p.log2n)
        regs = self.float_regs
        m.submodules.fprep = fp = FloatPrep(n, fw.out_width, efw, consts, abs_reg="abs" in regs)
        m.d.comb += [fp.y.eq(fw.y), fp.ef_min.eq(fw.side_o[:efw]),
                     fp.zneg.eq(Mux(fw.side_o[efw], fw.zneg_o, 0)),
                     fp.mask.eq(sign_mask_int(n, p.sign_seed))]
        valid = fw.o_valid
        if "abs" in regs:
            m.d.comb += fp.en.eq(en)
            va = Signal(name="abs_valid")
            with m.If(en):
                m.d.sync += va.eq(valid)
            valid = va
        m.submodules.fpack = pk = FloatPack(n, consts, shift_reg="shift" in regs)
        if "prep" in regs:
            mag_r = Signal.like(fp.mag, name="fp_mag", reset_less=True)
            lp_r = Signal.like(fp.lp, name="fp_lead", reset_less=True)
            neg_r = Signal(n, name="fp_neg", reset_less=True)
            nz_r = Signal(n, name="fp_nz", reset_less=True)
            b_r = Signal(consts.b_shape, name="fp_bexp", reset_less=True)
            v2_r = Signal(name="fp_valid")
            with m.If(en):
                m.d.sync += [mag_r.eq(fp.mag), lp_r.eq(fp.lp), neg_r.eq(fp.neg), nz_r.eq(fp.nz),
                             b_r.eq(fp.b), v2_r.eq(valid)]
            m.d.comb += [pk.mag.eq(mag_r), pk.lp.eq(lp_r), pk.neg.eq(neg_r), pk.nz.eq(nz_r),
                         pk.b.eq(b_r)]
            valid = v2_r
        else:
            m.d.comb += [pk.mag.eq(fp.mag), pk.lp.eq(fp.lp), pk.neg.eq(fp.neg), pk.nz.eq(fp.nz),
                         pk.b.eq(fp.b)]
        if "shift" in regs:
            m.d.comb += pk.en.eq(en)
            vs = Signal(name="shift_valid")
            with m.If(en):
                m.d.sync += vs.eq(valid)
            valid = vs
        out = Signal(16 * n, name="out_reg", reset_less=True)
        out_v = Signal(name="out_valid")
        with m.If(en):
            m.d.sync += [out.eq(pk.bits), out_v.eq(valid)]
        m.d.comb += [self.o.payload.eq(out), self.o.valid.eq(out_v)]
        return m
