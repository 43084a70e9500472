"""Top level of the write path: ``KVEncoder``.

Stream in (N fp16/bf16 bit patterns) -> stream out (packed codes, scale
bytes, flags), bit-exact with ``sim_models.encode``.

Interface (Verilog names after ``amaranth.back.verilog.convert``):

    clk, rst                      default sync domain, synchronous active-high reset
    i__valid, i__ready (out)      input stream
    i__payload [N*16]             lane k's 16-bit pattern at bits [16k, 16k+16)
    o__valid (out), o__ready      output stream
    o__payload [N*b + 8*N/G + 3]  codes | scales | [zeros (mode asym)] | flags
                                  (:func:`hw.wire.encoder_output_layout`, defined
                                  in :mod:`sim_models.wire`)
    status [3] (out)              sticky OR of the flags of accepted outputs
    status_clear                  clears ``status``

With ``key_slots`` = T > 0 (default 0: none) the front end is the cache policy's key front
end folded into block floating point (:mod:`hw.keyfold`; key vectors are encoded as
:func:`sim_models.codec.encode_folded`, bypassed ones as :func:`sim_models.encode`):
``i__payload`` = lanes | slot | bypass (:func:`hw.wire.encoder_input_layout`), a ``cfg``
stream loads its table one lane per word (:func:`hw.wire.key_config_layout`; docs/FORMAT.md
7), ``fe_regs`` from ``hw.keyfold.FOLD_CUTS`` (default ``dec``, ``emax``), ``tree_every``
registers in its W-lane max tree and no lane RAM of its own; the latency grows by the table read register (``latency_breakdown["keyfront"]``)
and, with two beats, the join of the beats (``keyfront_join``).

Options: :class:`hw.options.EncoderOptions`. Pipeline: front end (``fe_regs`` cuts) ->
register -> FWHT with ``fwht_regs`` registers (:mod:`hw.fwht`) -> quantizer with
``quant_regs`` cuts (:mod:`hw.quantizer`) -> lane compares + packer -> output register;
``tree_every`` = k adds a register after every k levels of the front end's max tree and
the quantizer's statistic trees. ``latency_cycles = frontend_tree + len(fe_regs) + 1 +
fwht_regs + quant_tree + len(quant_regs) + 1`` (:attr:`KVEncoder.latency_breakdown`; 10
with the defaults), + 3 for the skid FIFO in credit flow; the manifest records both.

Flow control (``flow``, :class:`hw.pipeline.FlowControl`; docs/DECISIONS.md, "Credit
flow control"): every register stage carries a valid bit. ``"stall"``: the pipeline
advances when ``en = o.ready | ~o.valid`` and ``i.ready = en``. ``"credit"``: the
pipeline never stalls, the output register writes a skid FIFO that drives ``o``, and
``i.ready`` is a register driven by a credit counter (:func:`hw.pipeline.credit_depth`
vectors in flight at most, + ``credit_extra``). Either way one vector per cycle (with
``lanes`` = N/2: per two cycles) while ``o.ready`` is high, with no loss, duplication or
reordering under back-pressure, the payload held while ``o.valid & ~o.ready``.

Status: ``status`` is a register, updated every cycle as
``status <= (status_clear ? 0 : status) | (o.valid & o.ready ? o.flags : 0)``:
a vector accepted in the same cycle as ``status_clear`` still sets its flags
(the clear acts first), and its flags are visible one cycle after the
handshake.
"""

from __future__ import annotations

from dataclasses import replace

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from sim_models.params import FormatParams, check_supported

from .frontend import FrontEnd, u_shape
from .frontend import ram_lines as frontend_ram_lines
from .frontend import tree_cuts as frontend_tree_cuts
from .fwht import FOLD_CYCLES, FWHT
from .keyfold import FoldFrontEnd
from .packer import Packer
from .options import EncoderOptions
from .pipeline import (FlowControl, FlowTop, beat_groups, check_lanes, collect, flow_cycles,
                       fold_cycles, stage)
from .quantizer import Quantizer
from .quantizer import ram_lines as quant_ram_lines
from .quantizer import tree_cuts as quant_tree_cuts
from .wire import encoder_input_layout, encoder_output_layout, key_config_layout


#: FormatParams fields the write path (KVEncoder) implements: field -> allowed values.
ENCODER_SUPPORT = {
    "mode": ("midtread", "midrise", "lloydmax", "asym"),
    "scale": ("ue5m3", "e4m3fn", "e5m2", "ue4m4"),
    "scale_rule": ("max", "absmean"),
    "scale_round": ("up", "nearest"),
}


def check_encoder_params(p: FormatParams) -> FormatParams:
    """Refuse format options the write path (KVEncoder) does not implement.

    Supported (:data:`ENCODER_SUPPORT`): mode midtread / midrise / lloydmax / asym,
    scale encodings ue5m3 / e4m3fn / e5m2 / ue4m4, scale rules max / absmean
    with any scale_mult, scale rounding up / nearest; every n / block / bits /
    mant_bits / dtype / sign_seed that FormatParams accepts. Not built: rule rms.

    Raises:
        TypeError: not a FormatParams. ValueError: the message names the field.
    """
    return check_supported(p, ENCODER_SUPPORT, "RTL write path")


def write_fwht(params: FormatParams, latency: int, lanes: int | None = None) -> FWHT:
    """The write path's FWHT as :class:`KVEncoder` builds it: N, the mantissa width,
    ``lanes`` per beat (default N) and the side band (the block exponent u and the two
    flags) delayed alongside."""
    side = data.StructLayout({"u": u_shape(params), "flags": 2})
    return FWHT(params.n, params.mant_bits, latency, side_width=side, lanes=lanes or params.n)


class KVEncoder(FlowTop, wiring.Component):
    """KV-cache write path (see module docstring).

    Args:
        params: format parameters (``sim_models.FormatParams``); fp16 and bf16.
        opts: implementation options (:class:`hw.options.EncoderOptions`; default: its
            defaults). They change registers, flow control and lanes, never the bytes.

    Raises:
        TypeError / ValueError: ``params`` or ``opts`` refused (the message names the
            field; a format option the RTL does not implement: :data:`ENCODER_SUPPORT`).
    """

    def __init__(self, params: FormatParams, opts: EncoderOptions | None = None):
        check_encoder_params(params)
        opts = EncoderOptions() if opts is None else opts
        if not isinstance(opts, EncoderOptions):
            raise TypeError(f"opts must be an EncoderOptions, got {type(opts).__name__}")
        opts.check(params)
        self.opts = opts
        self.flow, self.credit_extra = opts.flow, opts.credit_extra
        self.lanes = check_lanes(params, opts.lanes)
        self.beats = params.n // self.lanes
        self.key_slots = key_slots = opts.key_slots
        self.params = params
        self.latency = opts.fwht_regs
        self.quant_regs = opts.quant_regs
        self.fe_regs = opts.fe_regs
        self.tree_every = opts.tree_every
        self.lane_ram = opts.lane_ram
        members = {
            "i": In(stream.Signature(encoder_input_layout(params, key_slots))),
            "o": Out(stream.Signature(encoder_output_layout(params))),
            "status": Out(3),
            "status_clear": In(1),
        }
        if key_slots:
            members["cfg"] = In(stream.Signature(key_config_layout(params, key_slots)))
        super().__init__(members)

    @property
    def latency_breakdown(self) -> dict:
        """Register stages per pipeline section (sums to :attr:`latency_cycles`)."""
        p, k = self.params, self.tree_every
        two = self.beats > 1
        # the key front end: the table read register [+ the join of the beats]
        kf = {"keyfront": 1, **({"keyfront_join": 1} if two else {})} if self.key_slots else {}
        fold = {"fold_stage": FOLD_CYCLES} if two else {}
        return {**kf, **fold_cycles(self.beats, "beat_data"),
                "frontend_tree": frontend_tree_cuts(self.lanes if self.key_slots else p.n, k),
                "frontend_cuts": len(set(self.fe_regs) | ({"emax"} if two and self.key_slots
                                                         else set())),
                "frontend_reg": 1, "fwht": self.latency, **fold, "quant_tree": quant_tree_cuts(p, k),
                "quant_regs": len(self.quant_regs), "output_reg": 1, **flow_cycles(self.flow)}

    @property
    def ram_lines(self) -> dict:
        """Lane delay lines in block RAM: name -> {stages, width, depth} (empty: none)."""
        p, k, r = self.params, self.tree_every, self.lane_ram
        fe = {} if self.key_slots else frontend_ram_lines(p, self.fe_regs, k, r)
        qz = quant_ram_lines(p, self.quant_regs, k, r)
        return {**{f"frontend.{n}": v for n, v in fe.items()},
                **{f"quant.{n}": v for n, v in qz.items()}}

    @property
    def latency_cycles(self) -> int:
        """Cycles from the ``i`` handshake to ``o.valid`` without stalls."""
        return sum(self.latency_breakdown.values())

    def elaborate(self, platform):
        m = Module()
        p = self.params

        fc = FlowControl(m, self.flow, self.i, self.o, self.latency_cycles, self.credit_extra,
                         beats=self.beats)
        en, i_valid = fc.en, fc.i_valid
        w, two = self.lanes, self.beats > 1

        # front end (with key_slots: the folded key front end) + register
        if self.key_slots:
            m.submodules.frontend = fe = FoldFrontEnd(p, self.key_slots, self.fe_regs, lanes=w,
                                                      held=self.flow != "credit",
                                                      tree_every=self.tree_every)
            wiring.connect(m, wiring.flipped(self.cfg), fe.cfg)
            pay = data.View(encoder_input_layout(p, self.key_slots), fc.payload)
            # the table row is read at the vector's beat, or (two beats with stalls: held)
            # at its handshake, from the accepted payload
            side = data.View(encoder_input_layout(p, self.key_slots), self.i.payload) \
                if fe.held and two else pay
            m.d.comb += [fe.bits.eq(pay.lanes), fe.slot.eq(side.slot),
                         fe.bypass.eq(side.bypass), fe.i_valid.eq(i_valid)]
            if two:
                m.d.comb += fe.beat.eq(fc.beat_copies(beat_groups(w)))
                if fe.held:
                    m.d.comb += fe.load.eq(self.i.ready)
        else:
            m.submodules.frontend = fe = FrontEnd(p, self.fe_regs, self.tree_every,
                                                  self.lane_ram, lanes=w)
            if two:
                m.d.comb += fe.beat.eq(fc.beat_copies(beat_groups(w)))
            m.d.comb += [fe.bits.eq(fc.payload), fe.i_valid.eq(i_valid)]
        m.d.comb += fe.en.eq(en)
        fe_r = stage(m, en, "fe", x=fe.x, u=fe.u, flags=fe.flags, valid=fe.o_valid)

        # FWHT (u and the flags ride along as side band)
        m.submodules.fwht = fw = write_fwht(p, self.latency, w)
        m.d.comb += [fw.en.eq(en), fw.i_valid.eq(fe_r["valid"]), fw.x.eq(fe_r["x"]),
                     fw.side_i.u.eq(fe_r["u"]), fw.side_i.flags.eq(fe_r["flags"])]

        # quantizer
        m.submodules.quant = qz = Quantizer(p, self.quant_regs, self.tree_every, self.lane_ram,
                                            lanes=w)
        m.d.comb += [qz.en.eq(en), qz.i_valid.eq(fw.o_valid), qz.y.eq(fw.y),
                     qz.u.eq(fw.side_o.u), qz.flags_i.eq(fw.side_o.flags)]

        # packer [+ the first beat, held] + output register [+ skid FIFO]
        m.submodules.packer = pk = Packer(w, p.bits)
        m.d.comb += pk.codes.eq(qz.codes)
        res = Signal(encoder_output_layout(p), name="result")
        if not two:
            m.d.comb += [res.codes.eq(pk.plane), res.scales.eq(qz.scales), res.flags.eq(qz.flags)]
            if p.zero_bytes:
                m.d.comb += res.zeros.eq(qz.zeros)
            fc.output(res, qz.o_valid)
        else:
            pw = replace(p, n=w)            # one beat's planes: W lanes, W/G blocks
            beat = Signal(encoder_output_layout(pw), name="beat_result")
            m.d.comb += [beat.codes.eq(pk.plane), beat.scales.eq(qz.scales),
                         beat.flags.eq(qz.flags)]
            if p.zero_bytes:
                m.d.comb += beat.zeros.eq(qz.zeros)
            held, last = collect(m, en, "first", beat, qz.o_valid)
            first = data.View(encoder_output_layout(pw), held)
            m.d.comb += [res.codes.eq(Cat(first.codes, beat.codes)),
                         res.scales.eq(Cat(first.scales, beat.scales)),
                         res.flags.eq(first.flags | beat.flags)]
            if p.zero_bytes:
                m.d.comb += res.zeros.eq(Cat(first.zeros, beat.zeros))
            fc.output(res, last)

        # sticky status
        accepted = self.o.valid & self.o.ready
        m.d.sync += self.status.eq(Mux(self.status_clear, 0, self.status)
                                   | Mux(accepted, self.o.payload.flags, 0))
        return m
