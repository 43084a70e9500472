"""Names of RTL configurations, one grammar for simulation (verif) and synthesis (rtl_gen.synth).

``<kind>_<preset>_n<N>_g<G>_b<b>_l<L>[_<change>...]``, e.g. ``enc_v2_n128_g64_b3_l2``,
``rt_v1_n64_g64_b3_l2``, ``dec_v2_n64_g32_b3_l2_e4m3fn``:

* kind: ``enc`` (write path), ``dec`` (read path), ``rt`` (round trip), see rtl_gen.KINDS;
* preset: a named quantizer (``FormatParams.preset``: ``v1`` = format version 1,
  mid-tread / scale rounded up; ``v2`` = format version 2, mid-rise / nearest), so the
  quantizer of a name never depends on today's defaults (the other fields: the
  FormatParams defaults, e.g. M = 12, sign seed 0, fp16);
* ``n g b``: N, block size G, code bits b; ``l``: FWHT pipeline registers (the
  components' ``latency`` argument, 0 .. log2 N; a decoder's up to its FWHT's steps, the
  block alignment included; the latency in cycles is in the manifest);
* optional ``p<k>`` (after ``l``): the register profile for Fmax (:meth:`RTLConfig.regs`):
  every optional register cut of the components placed and a register after
  every k levels of the encoder's reduction trees (``tree_every``; ``p0``: the
  cuts only; a decoder takes only ``p0``); without it, the components' default cuts. Registers change the
  latency, never the bytes;
* optional ``k<T>`` (after ``l`` / ``p``, encoder only): the cache policy's key front end
  (``hw.keyfront.KeyFrontEnd``) with T table slots, its ``cfg`` port and the ``slot`` /
  ``bypass`` input side band (``KVEpilogue(key_slots=T)``; with ``pK`` all its cuts);
* optional ``r<D>`` (after ``l`` / ``p`` / ``k``, encoder and round trip): a lane delay
  line of at least D register stages (D >= 3) is a block RAM circular buffer instead of
  flip-flops (``KVEpilogue(lane_ram=D)``, ``hw.pipeline.ram_delay``); same cycles and bytes;
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
  (``fold_align=True``, ``hw.ifwht.fold_align_stage``): the W-point network has log2 W
  steps, the fold 2 + ``hw.ifwht.FOLD_BRIDGE_REGS`` cycles more; the bytes unchanged;
* optional ``rc`` (after ``fa``, decoder and round trip): the decoder's reset through
  register copies, one per region of the die (``reset_copies=True``,
  ``hw.pipeline.ResetCopies``): every register reset one cycle later, the handshakes held
  off one cycle longer; the cycles of a vector and the bytes unchanged;
* changes against the preset, in FormatParams field order: ``m<M>`` (mant_bits), a bare
  value that belongs to one field (``bf16``, ``asym``, ``e4m3fn``, ``rms``, ``up``), or
  ``<field>-<value>`` with the field's underscores dropped (``scalemult-300``,
  ``signseed-none``).

:meth:`RTLConfig.name` picks the preset the parameters differ least from (the later one
on a tie), so ``RTLConfig.parse(c.name) == c``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from sim_models import params as _pm
from sim_models.params import FormatParams

#: Name prefix -> rtl_gen kind.
KIND_TAGS = {"enc": "encoder", "dec": "decoder", "rt": "roundtrip"}
_TAG_OF = {k: t for t, k in KIND_TAGS.items()}
#: Preset names that config names use: the distinct per-vector quantizers of
#: ``sim_models.params.PRESETS``, oldest first (version 3 keeps version 2's quantizer, so
#: its configurations are named ``v2``; ``v3`` is accepted when parsing).
PRESETS = tuple(n for n in _pm.PRESETS if FormatParams.preset(n).quantizer_preset == n)


#: Fields the fixed part of a name states.
_FIXED = {"n": "n", "g": "block", "b": "bits", "l": "latency"}
#: Optional parts of the fixed group: letter -> RTLConfig field.
_OPTIONAL = {"p": "pipe", "k": "key_slots", "r": "lane_ram", "c": "credit", "w": "lanes"}
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


def _check_count(v, msg: str) -> int:
    """``v`` if it is an int >= 0 (bool refused), else ValueError ``msg, got v``."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{msg}, got {v!r}")
    return v


@dataclass(frozen=True)
class RTLConfig:
    """One RTL configuration: which top level, its format parameters, FWHT registers.

    Attributes:
        kind: ``"encoder"``, ``"decoder"`` or ``"roundtrip"`` (rtl_gen.KINDS).
        params: the format parameters.
        latency: FWHT pipeline registers, 0 .. log2 N; a decoder 0 .. its FWHT's steps
            (``hw.decompressor.fwht_steps``: the block alignment counts, two steps with
            ``pK``, three with the block swap).

    Raises:
        ValueError / TypeError: unknown kind, params not a FormatParams, latency out of
            range (the message names the field).
    """

    kind: str
    params: FormatParams
    latency: int = 2
    pipe: int | None = None
    key_slots: int = 0
    lane_ram: int = 0
    credit: int | None = None
    lanes: int | None = None
    fold_align: bool = False
    reset_copies: bool = False

    def __post_init__(self):
        if self.kind not in _TAG_OF:
            raise ValueError(f"kind must be one of {sorted(_TAG_OF)}, got {self.kind!r}")
        if not isinstance(self.params, FormatParams):
            raise TypeError(f"params must be a FormatParams, got {type(self.params).__name__}")
        lat, top = self.latency, self.params.log2n
        if not isinstance(self.fold_align, bool):
            raise TypeError(f"fold_align (fa) must be a bool, got {type(self.fold_align).__name__}")
        if self.fold_align and self.kind == "encoder":
            raise ValueError("fold_align (fa): the block alignment in the fold is the "
                             "decoder's (dec_, rt_); got kind 'encoder'")
        if not isinstance(self.reset_copies, bool):
            raise TypeError(f"reset_copies (rc) must be a bool, got "
                            f"{type(self.reset_copies).__name__}")
        if self.reset_copies and self.kind == "encoder":
            raise ValueError("reset_copies (rc): the reset copies are the decoder's (dec_, rt_); "
                             "got kind 'encoder'")
        if self.kind != "encoder" and (self.lanes is None or isinstance(self.lanes, int)):
            from hw.decompressor import fwht_steps     # the read path: one register per step
            try:
                steps = fwht_steps(self.params, self.lanes or self.params.n,
                                   self.pipe is not None, self.fold_align)
            except ValueError as e:     # only fold_align raises there (hw.ifwht.effective_align)
                raise ValueError(f"fold_align (fa): {e}") from None
            # a round trip's latency is both modules' (the encoder's: log2 W at most)
            top = steps if self.kind == "decoder" else \
                min(steps, (self.lanes or self.params.n).bit_length() - 1)
        if isinstance(lat, bool) or not isinstance(lat, int) or not 0 <= lat <= top:
            raise ValueError(f"latency (lL, FWHT pipeline registers) must be an int in "
                             f"0..{top}, got {lat!r}")
        pp = self.pipe
        if pp is not None:
            _check_count(pp, "pipe (pK, tree levels per register of the Fmax profile) must be "
                             "None or an int >= 0")
        ks = _check_count(self.key_slots, "key_slots (kT, key front end table slots) must be an int >= 0")
        if ks and self.kind != "encoder":
            raise ValueError(f"key_slots (kT): the key front end is built on the encoder (enc_) "
                             f"only, got kind {self.kind!r}")
        if ks and self.params.dtype != "fp16":
            raise ValueError(f"key_slots (kT): the key front end is fp16 only (docs/FORMAT.md 8), "
                             f"got dtype {self.params.dtype!r}")
        lr = _check_count(self.lane_ram, "lane_ram (rD, minimum lane delay in block RAM) must be an int >= 0")
        if lr and self.kind == "decoder":
            raise ValueError(f"lane_ram (rD): the lane delay lines in block RAM are the "
                             f"encoder's (enc_, rt_), got kind {self.kind!r}")
        if self.credit is not None:
            _check_count(self.credit, "credit (cE, credit flow control with E extra skid FIFO "
                                      "entries) must be None or an int >= 0")
        if self.lanes is not None:
            from hw.pipeline import check_lanes
            check_lanes(self.params, self.lanes)
        if pp and self.kind == "decoder":
            raise ValueError(f"pipe (pK) of a decoder must be 0 (p0): K sets the encoder's "
                             f"tree registers, the decoder has none; got {pp}")

    @property
    def regs(self) -> dict:
        """Register options of the component(s) (``rtl_gen.generate`` keywords): the FWHT
        ``latency``; with ``pipe`` = k every cut of ``FE_CUTS``, ``QUANT_CUTS`` and
        ``FLOAT_CUTS`` and ``DQ_CUTS``, ``tree_every`` = k (the encoder's reduction trees) and the
        decoder's block alignment in its FWHT steps (``split_align``)."""
        regs: dict = {"latency": self.latency}
        if self.key_slots:
            regs["key_slots"] = self.key_slots
        if self.lane_ram:
            regs["lane_ram"] = self.lane_ram
        if self.credit is not None:
            regs.update(flow="credit", credit_extra=self.credit)
        if self.lanes is not None:
            regs["lanes"] = self.lanes
        if self.fold_align:
            regs["fold_align"] = True
        if self.reset_copies:
            regs["reset_copies"] = True
        if self.pipe is None:
            return regs
        from hw.decompressor import DQ_CUTS, FLOAT_CUTS
        from hw.frontend import FE_CUTS
        from hw.quantizer import QUANT_CUTS
        if self.kind in ("encoder", "roundtrip"):
            regs.update(fe_regs=FE_CUTS.names, quant_regs=QUANT_CUTS.names, tree_every=self.pipe)
            if self.key_slots:
                from hw.keyfront import KF_CUTS
                regs["kf_regs"] = KF_CUTS.names
        if self.kind in ("decoder", "roundtrip"):
            regs.update(float_regs=FLOAT_CUTS.names, split_align=True, dq_regs=DQ_CUTS.names)
        return regs

    @property
    def roundtrip(self) -> bool:
        return self.kind == "roundtrip"

    @property
    def preset(self) -> str:
        """The preset the parameters differ least from (the later one on a tie)."""
        return min(reversed(PRESETS), key=lambda s: len(_changes(self.params, FormatParams.preset(s))))

    @property
    def name(self) -> str:
        p, ps = self.params, self.preset
        bare = _bare_values()
        parts = [_TAG_OF[self.kind], ps, f"n{p.n}", f"g{p.block}", f"b{p.bits}", f"l{self.latency}"]
        if self.pipe is not None:
            parts.append(f"p{self.pipe}")
        if self.key_slots:
            parts.append(f"k{self.key_slots}")
        if self.lane_ram:
            parts.append(f"r{self.lane_ram}")
        if self.credit is not None:
            parts.append(f"c{self.credit}")
        if self.lanes is not None:
            parts.append(f"w{self.lanes}")
        if self.fold_align:
            parts.append("fa")
        if self.reset_copies:
            parts.append("rc")
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
                unknown part, or FormatParams refuses the result (the message names the field).
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
        lat = fixed.pop("latency")
        pipe = fixed.pop("pipe", None)
        key_slots = fixed.pop("key_slots", 0)
        lane_ram = fixed.pop("lane_ram", 0)
        credit = fixed.pop("credit", None)
        lanes = fixed.pop("lanes", None)
        fold_align = fixed.pop("fold_align", False)
        reset_copies = fixed.pop("reset_copies", False)
        base = {f: getattr(FormatParams.preset(parts[1]), f) for f in _FIELDS}
        p = FormatParams(**{**base, **fixed, **kw})    # validates; the message names the field
        return cls(KIND_TAGS[parts[0]], p, lat, pipe, key_slots, lane_ram, credit, lanes,
                   fold_align, reset_copies)
