"""Implementation options of the RTL top levels: :class:`EncoderOptions` (``KVEncoder``),
:class:`DecoderOptions` (``KVDecoder``, with its two-beat fold in :class:`FoldOptions`) and
:class:`RoundTripOptions` (``KVRoundTrip``).

Options choose registers, flow control, lanes per cycle and structure; they never change
the bytes (the format is ``sim_models.FormatParams``). Each dataclass is frozen and
validates its fields on construction (errors name the field); the checks that need the
format parameters (``fwht_regs`` range, ``lanes``, ``key_slots``) are :meth:`check`, which
the top level's constructor calls. ``rtl_gen.config`` maps config-name letters to fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim_models.params import FormatParams

from .pipeline import check_flow, check_lane_ram, check_lanes, check_latency, check_tree_every


def _int(v, name: str, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    return v


def _bool(v, name: str) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    return v


def _set_cuts(opts, name: str, cuts) -> None:
    object.__setattr__(opts, name, cuts.check(getattr(opts, name)))


def _quant_default():
    from .quantizer import QUANT_CUTS
    return QUANT_CUTS.default


def _float_default():
    from .decoder import FLOAT_CUTS
    return FLOAT_CUTS.default


def _dq_default():
    from .decoder import DQ_CUTS
    return DQ_CUTS.default


@dataclass(frozen=True)
class EncoderOptions:
    """Options of the write path ``hw.encoder.KVEncoder`` (docs/HARDWARE.md has the table).

    Attributes:
        fwht_regs: registers in the FWHT's butterfly network, 0 .. log2 W.
        fe_regs / quant_regs: register cuts of the front end and the quantizer (names of
            ``hw.frontend.FE_CUTS``, ``hw.quantizer.QUANT_CUTS``; with ``key_slots`` the
            front end is ``hw.keyfold.FoldFrontEnd``: names of ``hw.keyfold.FOLD_CUTS``).
            ``fe_regs`` None (the default): the front end's default cuts,
            ``FOLD_CUTS.default`` with ``key_slots``, else ``FE_CUTS.default``.
        tree_every: a register after every k levels of the reduction trees (0: none).
        key_slots: table slots T of the key front end (0: none; fp16 only), folded into the
            front end (``hw.keyfold.FoldFrontEnd``: key vectors encoded as
            ``sim_models.codec.encode_folded``); ``tree_every`` registers in its W-lane max
            tree, lane RAM the quantizer's only.
        lane_ram: lane delay lines of at least this many stages in block RAM (0: none;
            docs/DECISIONS.md, "Lane RAM").
        flow: ``"stall"`` (global stall) or ``"credit"`` (credit flow, skid FIFO;
            docs/DECISIONS.md, "Credit flow control").
        credit_extra: skid FIFO entries beyond the minimum (credit flow only).
        lanes: lanes per cycle W: None (N) or N/2 (two beats per vector;
            docs/DECISIONS.md, "Two-beat lanes").
    """

    fwht_regs: int = 2
    fe_regs: tuple | None = None
    quant_regs: tuple = field(default_factory=_quant_default)
    tree_every: int = 0
    key_slots: int = 0
    lane_ram: int = 0
    flow: str = "stall"
    credit_extra: int = 0
    lanes: int | None = None

    def __post_init__(self):
        from .frontend import FE_CUTS
        from .quantizer import QUANT_CUTS
        from .keyfold import FOLD_CUTS
        _int(self.fwht_regs, "fwht_regs (FWHT pipeline registers)")
        _int(self.key_slots, "key_slots (key front end table slots)")
        if self.fe_regs is None:
            object.__setattr__(self, "fe_regs", (FOLD_CUTS if self.key_slots else FE_CUTS).default)
        _set_cuts(self, "fe_regs", FE_CUTS)
        _set_cuts(self, "quant_regs", QUANT_CUTS)
        check_tree_every(self.tree_every)
        check_lane_ram(self.lane_ram)
        check_flow(self.flow, self.credit_extra)
        if self.lanes is not None:
            _int(self.lanes, "lanes (lanes per cycle W)", 1)

    def check(self, params: FormatParams) -> "EncoderOptions":
        """The checks that need the format: ``fwht_regs`` in 0 .. log2 W, ``lanes`` N or
        N/2 (a multiple of G), ``key_slots`` (fp16), ``lane_ram`` (one beat)."""
        from .keyfold import check_key_slots
        w = check_lanes(params, self.lanes)
        if w < params.n and self.lane_ram:
            raise ValueError(f"lane_ram (block RAM lane delay) needs lanes=N={params.n}, "
                             f"got lanes={w}")
        if self.key_slots:
            from .keyfold import FOLD_CUTS
            check_key_slots(params, self.key_slots)
            FOLD_CUTS.check(self.fe_regs)
        check_latency(params, self.fwht_regs, w)
        return self


@dataclass(frozen=True)
class FoldOptions:
    """The decoder's fold of two beats of one block each (``lanes`` = G = N/2).

    Attributes:
        align: the block alignment in the fold's last butterfly stage across the beats
            (``hw.ifwht.fold_align_stage``) instead of a step of the W-point network
            (docs/DECISIONS.md, "Fold alignment").
        window: with ``align``, the fold rounds to its window D (``hw.ifwht.fold_window``;
            docs/DECISIONS.md, "Fold window").
        window_step: k, the window's shift rounded down to a multiple of k (a power of
            two; docs/DECISIONS.md, "Fold window").
        shift_x_bits: low bits of the shift amount applied before the fold's register X,
            the rest before register S (docs/DECISIONS.md, "Fold alignment").
    """

    align: bool = False
    window: bool = True
    window_step: int = 2
    shift_x_bits: int = 2

    def __post_init__(self):
        _bool(self.align, "fold.align (fold_align)")
        _bool(self.window, "fold.window")
        k = _int(self.window_step, "fold.window_step", 1)
        if k & (k - 1):
            raise ValueError(f"fold.window_step must be a power of two, got {k}")
        _int(self.shift_x_bits, "fold.shift_x_bits")


@dataclass(frozen=True)
class DecoderOptions:
    """Options of the read path ``hw.decoder.KVDecoder`` (docs/HARDWARE.md has the table).

    Attributes:
        fwht_regs: registers in the inverse FWHT, 0 .. its steps
            (``hw.decoder.fwht_steps``).
        float_regs / dq_regs: register cuts of the float conversion and the dequant (names
            of ``hw.decoder.FLOAT_CUTS``, ``hw.decoder.DQ_CUTS``).
        split_align: the FWHT's block alignment as its parts, one step each.
        flow, credit_extra, lanes: as :class:`EncoderOptions`.
        fold: the two-beat fold (:class:`FoldOptions`).
        reset_copies: the reset through one register copy per region
            (``hw.pipeline.ResetCopies``; docs/DECISIONS.md, "Reset copies").
        pack_shift_low_bits: low bits of Lp that FloatPack shifts by after its ``shift``
            register, with that cut (docs/DECISIONS.md, "Register cuts inside the float conversion").
        lod_split: levels of the leading-one tree before FloatPrep's ``abs`` register
            (docs/DECISIONS.md, "Register cuts inside the float conversion").
    """

    fwht_regs: int = 2
    float_regs: tuple = field(default_factory=_float_default)
    dq_regs: tuple = field(default_factory=_dq_default)
    split_align: bool = False
    flow: str = "stall"
    credit_extra: int = 0
    lanes: int | None = None
    fold: FoldOptions = FoldOptions()
    reset_copies: bool = False
    pack_shift_low_bits: int = 1
    lod_split: int = 2

    def __post_init__(self):
        from .decoder import DQ_CUTS, FLOAT_CUTS
        _int(self.fwht_regs, "fwht_regs (FWHT pipeline registers)")
        _set_cuts(self, "float_regs", FLOAT_CUTS)
        _set_cuts(self, "dq_regs", DQ_CUTS)
        _bool(self.split_align, "split_align")
        check_flow(self.flow, self.credit_extra)
        if self.lanes is not None:
            _int(self.lanes, "lanes (lanes per cycle W)", 1)
        if not isinstance(self.fold, FoldOptions):
            raise TypeError(f"fold must be a FoldOptions, got {type(self.fold).__name__}")
        _bool(self.reset_copies, "reset_copies")
        _int(self.pack_shift_low_bits, "pack_shift_low_bits")
        _int(self.lod_split, "lod_split")

    def check(self, params: FormatParams) -> "DecoderOptions":
        """The checks that need the format: ``lanes``, ``fold.align`` (two beats of one
        block each) and ``fwht_regs`` in 0 .. the FWHT's steps."""
        from .decoder import fwht_steps
        w = check_lanes(params, self.lanes)
        try:
            steps = fwht_steps(params, w, self.split_align, self.fold.align)
        except ValueError as e:
            if not self.fold.align:
                raise
            raise ValueError(f"fold.align (fold_align): {e}") from None
        check_latency(params, self.fwht_regs, w, steps)
        return self


@dataclass(frozen=True)
class RoundTripOptions:
    """Options of ``hw.roundtrip.KVRoundTrip``: its encoder's and its decoder's (the same
    lanes per cycle and flow control; no key front end: the round trip's input is the
    plain lanes)."""

    enc: EncoderOptions = field(default_factory=EncoderOptions)
    dec: DecoderOptions = field(default_factory=DecoderOptions)

    def __post_init__(self):
        if not isinstance(self.enc, EncoderOptions):
            raise TypeError(f"enc must be an EncoderOptions, got {type(self.enc).__name__}")
        if not isinstance(self.dec, DecoderOptions):
            raise TypeError(f"dec must be a DecoderOptions, got {type(self.dec).__name__}")
        for f in ("lanes", "flow", "credit_extra"):
            e, d = getattr(self.enc, f), getattr(self.dec, f)
            if e != d:
                raise ValueError(f"{f}: the encoder's ({e!r}) and the decoder's ({d!r}) "
                                 f"must be equal")
        if self.enc.key_slots:
            raise ValueError("enc.key_slots: the round trip has no key front end")

    def check(self, params: FormatParams) -> "RoundTripOptions":
        self.enc.check(params)
        self.dec.check(params)
        return self


__all__ = ["DecoderOptions", "EncoderOptions", "FoldOptions", "RoundTripOptions"]
