"""Names of RTL configurations, one grammar for simulation (verif) and synthesis (rtl_gen.synth).

``<kind>_<preset>_n<N>_g<G>_b<b>_l<L>[_<change>...]``, e.g. ``enc_v2_n128_g64_b3_l2``,
``rt_v1_n64_g64_b3_l2``, ``dec_v2_n64_g32_b3_l2_e4m3fn``:

* kind: ``enc`` (write path), ``dec`` (read path), ``rt`` (round trip), see rtl_gen.KINDS;
* preset: a named quantizer (``FormatParams.preset``: ``v1`` = format version 1,
  mid-tread / scale rounded up; ``v2`` = format version 2, mid-rise / nearest), so the
  quantizer of a name never depends on today's defaults (the other fields: the
  FormatParams defaults, e.g. M = 12, sign seed 0, fp16);
* ``n g b``: N, block size G, code bits b; ``l``: FWHT pipeline registers
  (``fwht_regs``, 0 .. log2 N; a decoder's up to its FWHT's steps, the block alignment
  included; the latency in cycles is in the manifest);
* optional ``p<k>`` (after ``l``): the register profile for Fmax: every optional register
  cut of the components placed (``fe_regs``, ``quant_regs``; ``float_regs``,
  ``dq_regs``, ``split_align``) and a register after every k levels of the encoder's
  reduction trees (``tree_every``; ``p0``: the cuts only; a decoder takes only ``p0``);
  without it, the components' default cuts. Registers change the latency, never the bytes;
* optional ``k<T>`` (after ``l`` / ``p``, encoder only): the cache policy's key front end
  folded into the front end (``hw.keyfold.FoldFrontEnd``, FORMAT.md 8's folded rule) with
  T table slots, its ``cfg`` port and the ``slot`` / ``bypass`` input side band
  (``key_slots=T``; with ``pK`` all its cuts, ``hw.keyfold.FOLD_CUTS``);
* optional ``r<D>`` (after ``l`` / ``p`` / ``k``, encoder and round trip): a lane delay
  line of at least D register stages (D >= 3) is a block RAM circular buffer instead of
  flip-flops (``lane_ram=D``, ``hw.pipeline.ram_delay``); same cycles and bytes;
* optional ``c<E>`` (after ``l`` / ``p`` / ``k`` / ``r``, every kind): credit-based flow control
  instead of the global stall: the pipeline never stalls, an output skid FIFO in block RAM
  with E credits beyond the minimum (``flow="credit", credit_extra=E``;
  ``hw.pipeline.FlowControl``; ``c0``: latency + 2 credits, one vector per cycle; two beats: (latency + 1) // 2 + 1); the
  latency grows by the FIFO's 3 cycles, never the bytes;
* optional ``w<W>`` (after ``l`` / ``p`` / ``k`` / ``r`` / ``c``, every kind): W = N/2 lanes
  per cycle, each vector streamed as two beats (``lanes=W``, ``hw.pipeline.check_lanes``;
  ``l`` then counts registers of the W-point network, 0 .. log2 W); one vector every two
  cycles, the bytes unchanged;
* optional ``fa`` (after ``w<W>``, decoder and round trip, two beats of one block each: W =
  G = N/2): the decoder's block alignment in the last butterfly stage across the beats
  (``fold.align``, ``hw.ifwht.fold_align_stage``): the W-point network has log2 W
  steps, the fold 2 cycles more; the bytes unchanged;
* optional ``rc`` (after ``fa``, decoder and round trip): the decoder's reset through
  register copies, one per region of the die (``reset_copies``,
  ``hw.pipeline.ResetCopies``): every register reset one cycle later, the handshakes held
  off one cycle longer; the cycles of a vector and the bytes unchanged;
* changes against the preset, in FormatParams field order: ``m<M>`` (mant_bits), a bare
  value that belongs to one field (``bf16``, ``asym``, ``e4m3fn``, ``rms``, ``up``), or
  ``<field>-<value>`` with the field's underscores dropped (``scalemult-300``,
  ``signseed-none``).

The letters set fields of ``hw.options`` (:class:`RTLConfig` ``opts``); options without a
letter keep their defaults in a named configuration. :meth:`RTLConfig.name` picks the
preset the parameters differ least from (the later one on a tie), so
``RTLConfig.parse(c.name) == c``.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, fields

from sim_models import params as _pm
from hw.options import DecoderOptions, EncoderOptions, FoldOptions, RoundTripOptions
from sim_models.params import FormatParams

#: Name prefix -> rtl_gen kind.
KIND_TAGS = {"enc": "encoder", "dec": "decoder", "rt": "roundtrip"}
_TAG_OF = {k: t for t, k in KIND_TAGS.items()}
#: Preset names that config names use: the distinct per-vector quantizers of
#: ``sim_models.params.PRESETS``, oldest first (version 3 keeps version 2's quantizer, so
#: its configurations are named ``v2``; ``v3`` is accepted when parsing).
PRESETS = tuple(n for n in _pm.PRESETS if FormatParams.preset(n).quantizer_preset == n)


#: Fields the fixed part of a name states (``l``: the options' ``fwht_regs``).
_FIXED = {"n": "n", "g": "block", "b": "bits", "l": "fwht_regs"}
#: Optional numbered parts of a name, in name order: letter -> what it sets.
_OPTIONAL = {"p": "pipe", "k": "key_slots", "r": "lane_ram", "c": "credit", "w": "lanes"}
#: Option classes by kind.
OPTIONS = {"encoder": EncoderOptions, "decoder": DecoderOptions, "roundtrip": RoundTripOptions}
_FIELDS = [f.name for f in fields(FormatParams)]
#: String-valued fields whose values may stand bare in a name.
_ENUMS = {"mode": _pm.QUANT_MODES, "scale": _pm.SCALE_ENCODINGS, "dtype": tuple(_pm.INPUT_DTYPES),
          "scale_rule": _pm.SCALE_RULES, "scale_round": _pm.SCALE_ROUNDING}
_SQUASHED = {f.replace("_", ""): f for f in _FIELDS}


def _bare_values() -> dict[str, str]:
    """bare value -> field, for values that belong to exactly one field."""
    seen: dict[str, list[str]] = {}
    for f, vals in _ENUMS.items():
        for v in vals:
            seen.setdefault(str(v), []).append(f)
    return {v: fs[0] for v, fs in seen.items() if len(fs) == 1}


def _changes(p: FormatParams, base: FormatParams) -> list[str]:
    return [f for f in _FIELDS if f not in ("n", "block", "bits") and getattr(p, f) != getattr(base, f)]


def _profile(kind: str, key_slots: int = 0) -> dict:
    """The register profile's cut fields (config part ``pK``) of an encoder (with
    ``key_slots``: the folded key front end's cuts) or decoder."""
    if kind == "encoder":
        from hw.frontend import FE_CUTS
        from hw.keyfold import FOLD_CUTS
        from hw.quantizer import QUANT_CUTS
        fe = FOLD_CUTS if key_slots else FE_CUTS
        return {"fe_regs": fe.names, "quant_regs": QUANT_CUTS.names}
    from hw.decoder import DQ_CUTS, FLOAT_CUTS
    return {"float_regs": FLOAT_CUTS.names, "dq_regs": DQ_CUTS.names, "split_align": True}


def encoder_options(fwht_regs: int = 2, pipe: int | None = None, key_slots: int = 0,
                    lane_ram: int = 0, credit: int | None = None,
                    lanes: int | None = None) -> EncoderOptions:
    """The encoder options a name's parts state (module docstring)."""
    kw: dict = {"fwht_regs": fwht_regs, "key_slots": key_slots, "lane_ram": lane_ram,
                "lanes": lanes}
    if credit is not None:
        kw.update(flow="credit", credit_extra=credit)
    if pipe is not None:
        kw.update(_profile("encoder", key_slots), tree_every=pipe)
    return EncoderOptions(**kw)


def decoder_options(fwht_regs: int = 2, pipe: int | None = None, credit: int | None = None,
                    lanes: int | None = None, fold_align: bool = False,
                    reset_copies: bool = False) -> DecoderOptions:
    """The decoder options a name's parts state (module docstring; ``pipe``: None or 0)."""
    kw: dict = {"fwht_regs": fwht_regs, "lanes": lanes, "reset_copies": reset_copies,
                "fold": FoldOptions(align=fold_align)}
    if credit is not None:
        kw.update(flow="credit", credit_extra=credit)
    if pipe is not None:
        kw.update(_profile("decoder"))
    return DecoderOptions(**kw)


def _pipe_of(opts, kind: str) -> int | None:
    """The ``pK`` part of encoder / decoder options (None: the default cuts); ValueError
    when the cuts are neither the defaults nor the profile (no name states them)."""
    prof = _profile(kind, opts.key_slots if kind == "encoder" else 0)
    base = OPTIONS[kind](key_slots=opts.key_slots) if kind == "encoder" else OPTIONS[kind]()
    if kind == "encoder":
        if all(getattr(opts, f) == v for f, v in prof.items()):
            return opts.tree_every
        fields_ = (*prof, "tree_every")
    else:
        if all(getattr(opts, f) == v for f, v in prof.items()):
            return 0
        fields_ = tuple(prof)
    if all(getattr(opts, f) == getattr(base, f) for f in fields_):
        return None
    raise ValueError(f"no config name states these register cuts ({', '.join(fields_)}: the "
                     f"defaults or all of them, part pK), got {opts}")


@dataclass(frozen=True)
class RTLConfig:
    """One RTL configuration: which top level, its format parameters, its options.

    Attributes:
        kind: ``"encoder"``, ``"decoder"`` or ``"roundtrip"`` (rtl_gen.KINDS).
        params: the format parameters.
        opts: the implementation options of the kind (:data:`OPTIONS`: ``hw.options``
            EncoderOptions, DecoderOptions or RoundTripOptions; None: the defaults).

    Raises:
        ValueError / TypeError: unknown kind, params not a FormatParams, options of another
            kind or refused for these params (the message names the field).
    """

    kind: str
    params: FormatParams
    opts: EncoderOptions | DecoderOptions | RoundTripOptions | None = None

    def __post_init__(self):
        if self.kind not in _TAG_OF:
            raise ValueError(f"kind must be one of {sorted(_TAG_OF)}, got {self.kind!r}")
        if not isinstance(self.params, FormatParams):
            raise TypeError(f"params must be a FormatParams, got {type(self.params).__name__}")
        cls = OPTIONS[self.kind]
        if self.opts is None:
            object.__setattr__(self, "opts", cls())
        if not isinstance(self.opts, cls):
            raise TypeError(f"opts of kind {self.kind!r} must be a {cls.__name__}, got "
                            f"{type(self.opts).__name__}")
        self.opts.check(self.params)

    @classmethod
    def of(cls, kind: str, params: FormatParams, fwht_regs: int = 2, **parts) -> "RTLConfig":
        """The configuration of ``kind`` with the name parts ``parts`` (keywords of
        :func:`encoder_options` / :func:`decoder_options`; a round trip takes both; a part
        at its absent value, 0 / None / False, may be given to any kind)."""
        if kind not in OPTIONS:
            raise ValueError(f"kind must be one of {sorted(OPTIONS)}, got {kind!r}")
        enc_kw = ("pipe", "key_slots", "lane_ram", "credit", "lanes")
        dec_kw = ("pipe", "credit", "lanes", "fold_align", "reset_copies")
        allowed = {"encoder": enc_kw, "decoder": dec_kw,
                   "roundtrip": tuple(dict.fromkeys(enc_kw + dec_kw))}[kind]
        for k, v in list(parts.items()):
            if k not in allowed:
                if v not in (None, 0, False):
                    raise ValueError(f"{k}: not a name part of kind {kind!r} (allowed: "
                                     f"{allowed})")
                del parts[k]

        def enc():
            return encoder_options(fwht_regs, **{k: v for k, v in parts.items() if k in enc_kw})

        def dec():
            kw = {k: v for k, v in parts.items() if k in dec_kw}
            if kind == "roundtrip" and kw.get("pipe"):
                kw["pipe"] = 0          # the decoder's profile has no tree registers
            return decoder_options(fwht_regs, **kw)
        if kind == "encoder":
            return cls(kind, params, enc())
        if kind == "decoder":
            return cls(kind, params, dec())
        return cls(kind, params, RoundTripOptions(enc(), dec()))

    @property
    def enc(self) -> EncoderOptions | None:
        """The encoder's options (None for a decoder)."""
        return self.opts.enc if self.kind == "roundtrip" else \
            self.opts if self.kind == "encoder" else None

    @property
    def dec(self) -> DecoderOptions | None:
        """The decoder's options (None for an encoder)."""
        return self.opts.dec if self.kind == "roundtrip" else \
            self.opts if self.kind == "decoder" else None

    @property
    def fwht_regs(self) -> int:
        return (self.enc or self.dec).fwht_regs

    @property
    def key_slots(self) -> int:
        return self.enc.key_slots if self.enc else 0

    @property
    def lanes(self) -> int | None:
        return self.opts.lanes if self.kind != "roundtrip" else self.opts.enc.lanes

    @property
    def roundtrip(self) -> bool:
        return self.kind == "roundtrip"

    @property
    def preset(self) -> str:
        """The preset the parameters differ least from (the later one on a tie)."""
        return min(reversed(PRESETS), key=lambda s: len(_changes(self.params, FormatParams.preset(s))))

    @property
    def parts(self) -> dict:
        """The name parts of the options: {fwht_regs, pipe, key_slots, lane_ram, credit,
        lanes, fold_align, reset_copies} (the keywords of :meth:`of`; ``pipe`` / ``credit``
        None when absent). ValueError for options that no name states."""
        enc, dec = self.enc, self.dec
        if dec is not None:
            d0, f0 = DecoderOptions(), FoldOptions()
            extra = [f for f in ("pack_shift_low_bits", "lod_split")
                     if getattr(dec, f) != getattr(d0, f)]
            extra += [f"fold.{f}" for f in ("window", "window_step", "shift_x_bits")
                      if getattr(dec.fold, f) != getattr(f0, f)]
            if extra:
                raise ValueError(f"no config name states {', '.join(extra)} (not the default)")
        if enc is not None and dec is not None and enc.fwht_regs != dec.fwht_regs:
            raise ValueError(f"fwht_regs: a round trip's name states one for both, got "
                             f"{enc.fwht_regs} and {dec.fwht_regs}")
        pipes = [_pipe_of(o, k) for o, k in ((enc, "encoder"), (dec, "decoder")) if o is not None]
        if enc is not None and dec is not None and (pipes[0] is None) != (pipes[1] is None):
            raise ValueError("a round trip's name states the register profile for both "
                             "modules or for neither")
        one = enc or dec
        return {"fwht_regs": one.fwht_regs, "pipe": pipes[0],
                "key_slots": enc.key_slots if enc else 0,
                "lane_ram": enc.lane_ram if enc else 0,
                "credit": one.credit_extra if one.flow == "credit" else None,
                "lanes": one.lanes,
                "fold_align": dec.fold.align if dec else False,
                "reset_copies": dec.reset_copies if dec else False}

    @property
    def pipe(self) -> int | None:
        """The register profile ``pK`` (None: the default cuts)."""
        return self.parts["pipe"]

    @property
    def credit(self) -> int | None:
        """Credit flow's extra credits ``cE`` (None: stall flow)."""
        return self.parts["credit"]

    @property
    def lane_ram(self) -> int:
        return self.enc.lane_ram if self.enc else 0

    @property
    def fold_align(self) -> bool:
        return self.dec.fold.align if self.dec else False

    @property
    def reset_copies(self) -> bool:
        return self.dec.reset_copies if self.dec else False

    def _parts(self) -> list[str]:
        """The option parts of the name, after ``n g b``."""
        d = self.parts
        parts = [f"l{d['fwht_regs']}"]
        for key, letter in (("pipe", "p"), ("key_slots", "k"), ("lane_ram", "r"),
                            ("credit", "c"), ("lanes", "w")):
            if d[key] is not None and (d[key] or key in ("pipe", "credit")):
                parts.append(f"{letter}{d[key]}")
        if d["fold_align"]:
            parts.append("fa")
        if d["reset_copies"]:
            parts.append("rc")
        return parts

    @property
    def name(self) -> str:
        p, ps = self.params, self.preset
        bare = _bare_values()
        parts = [_TAG_OF[self.kind], ps, f"n{p.n}", f"g{p.block}", f"b{p.bits}", *self._parts()]
        for f in _changes(p, FormatParams.preset(ps)):
            v = getattr(p, f)
            if f == "mant_bits":
                parts.append(f"m{v}")
            elif bare.get(str(v)) == f:
                parts.append(str(v))
            else:
                parts.append(f"{f.replace('_', '')}-{'none' if v is None else v}")
        return "_".join(parts)

    @classmethod
    def parse(cls, s: str) -> "RTLConfig":
        """The configuration a name states (grammar: module docstring).

        Raises:
            ValueError: unknown kind or preset, a missing or repeated ``n g b l`` part, an
                unknown part, a part the kind does not take, or FormatParams / the options
                refuse the result (the message names the field).
        """
        if not isinstance(s, str):
            raise TypeError(f"config name must be a str, got {type(s).__name__}")
        parts = s.strip().split("_")
        if len(parts) < 2 or parts[0] not in KIND_TAGS or parts[1] not in _pm.PRESETS:
            raise ValueError(f"bad config name {s!r}: start with a kind {sorted(KIND_TAGS)} and a "
                             f"preset {list(PRESETS)}, e.g. enc_v2_n128_g64_b3_l2")
        kw: dict = {}
        fixed: dict = {}
        bare = _bare_values()
        for part in parts[2:]:
            m = re.fullmatch(r"([ngblmpkrcw])(\d+)", part)
            if m and m.group(1) in _FIXED:
                name, tgt, val = _FIXED[m.group(1)], fixed, int(m.group(2))
            elif m and m.group(1) in _OPTIONAL:
                name, tgt, val = _OPTIONAL[m.group(1)], fixed, int(m.group(2))
            elif m:
                name, tgt, val = "mant_bits", kw, int(m.group(2))
            elif part == "fa":
                name, tgt, val = "fold_align", fixed, True
            elif part == "rc":
                name, tgt, val = "reset_copies", fixed, True
            elif part in bare:
                name, tgt, val = bare[part], kw, part
            elif "-" in part and part.split("-", 1)[0] in _SQUASHED:
                f, v = part.split("-", 1)
                name, tgt = _SQUASHED[f], kw
                val = None if v == "none" else int(v) if re.fullmatch(r"-?\d+", v) else v
            else:
                raise ValueError(f"bad part {part!r} in config name {s!r}: use nN gG bB lL, pK, kT, rD, "
                                 f"cE, wW, fa, rc, mM, a bare "
                                 f"value of {sorted(_ENUMS)} or field-value (field without underscores)")
            if name in tgt:
                raise ValueError(f"config name {s!r} sets {name} twice")
            tgt[name] = val
        missing = [f"{k} ({v})" for k, v in _FIXED.items() if v not in fixed]
        if missing:
            raise ValueError(f"config name {s!r} must state {', '.join(missing)}")
        kind = KIND_TAGS[parts[0]]
        regs = fixed.pop("fwht_regs")
        opt = {k: fixed.pop(k) for k in (*_OPTIONAL.values(), "fold_align", "reset_copies")
               if k in fixed}
        if kind != "encoder" and opt.get("key_slots"):
            raise ValueError(f"key_slots (kT): the key front end is built on the encoder (enc_) "
                             f"only, got kind {kind!r}")
        if kind == "decoder" and opt.get("lane_ram"):
            raise ValueError(f"lane_ram (rD): the lane delay lines in block RAM are the "
                             f"encoder's (enc_, rt_), got kind {kind!r}")
        if kind == "decoder" and opt.get("pipe"):
            raise ValueError(f"pipe (pK) of a decoder must be 0 (p0): K sets the encoder's "
                             f"tree registers, the decoder has none; got {opt['pipe']}")
        for flag, letter in (("fold_align", "fa"), ("reset_copies", "rc")):
            if kind == "encoder" and opt.get(flag):
                raise ValueError(f"{flag} ({letter}): a decoder option (dec_, rt_); got kind "
                                 f"'encoder'")
        base = {f: getattr(FormatParams.preset(parts[1]), f) for f in _FIELDS}
        p = FormatParams(**{**base, **fixed, **kw})    # validates; the message names the field
        return cls.of(kind, p, regs, **opt)


def print_names(names) -> int:
    """Print ``names`` to stdout, one a line (the ``--list`` of verif.sim and rtl_gen.synth);
    returns 0, also when the reader goes away early (``--list | head``: the rest is
    dropped, no BrokenPipeError traceback)."""
    try:
        for name in names:
            print(name)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush succeeds
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
