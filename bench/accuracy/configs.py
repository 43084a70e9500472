"""The accuracy study's configurations, as data: what each K/V cache stores.

A :class:`Config` is a cache policy stated independently of the model: formats are
FormatParams keyword sets without ``n`` (resolved to ``n = head_dim`` of the model by
:meth:`Config.policy`, a :class:`sim_models.CachePolicy`), or a float
:class:`bench.accuracy.kvquant.Baseline`, or ``None`` (fp16). Layer-wise key precision names how
many of the most sensitive layers (calibration's ``k_sens``) get another format;
``reparam`` is an exact per-channel key reparametrization (bench.accuracy.kvquant.key_scales).

The format keyword sets are written relative to the version-1 quantizer
(:data:`STUDY_BASE`, the default when the study began): format version 2 changed
FormatParams' defaults, so the study applies them explicitly and every name keeps its
meaning. Version 2's default is ``midrise-max-near``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

import numpy as np

from sim_models import CachePolicy, FormatParams
from sim_models.policy import KEY_SCALES, POLICY_PRESETS

from .kvquant import Baseline, IPScaled, Quantizer, bits_per_element
from .peers import (BF16, OCTAVE_BLOCK, FP8PerTensor, KiviKey, KiviValue, Octave, Peer,
                    TurboQuantKey, UniformAsym, slot_bits)

#: How every result's ``bits`` (at the window's length) and ``bits_32k`` are counted
#: (:meth:`Config.bits`; the results files' ``meta.bits_rule``).
BITS_RULE = ("every stored byte per K/V element of one sequence (sim_models.CachePolicy.stored_bits "
             "for the study's formats): codes, scale and zero-point bytes, fp16 sink tokens, and "
             "the recent ring's fp16 rows beside the codes of the same tokens (every token after "
             "the sinks is encoded when written); peers: their own layouts (bench/accuracy/peers.py)")
#: A long context the stored bits are also counted at (``bits_32k`` of every result).
LONG_CONTEXT = 32768
#: Version-1 quantizer fields under every study format (module docstring).
STUDY_BASE = dict(mode="midtread", scale_round="up")
#: fp16 K or V (no quantization).
FP16 = None
_SAME = object()

#: How key scales are calibrated (bench.accuracy.kvquant.calibrated_key_scales).
KEY_SCALE_RULES = ("qaware", "keyonly")

FormatSpec = dict          # FormatParams keyword arguments without n
KVSpec = FormatSpec | Baseline | Peer | None


@dataclass(frozen=True, eq=False)
class Config:
    """One configuration of the study.

    Attributes (the policy fields carry :class:`sim_models.CachePolicy`'s names and values):
        name, group, note: table labels.
        k, v: FormatSpec, Baseline or None (fp16).
        sinks: leading tokens of each sequence kept fp16.
        center_keys: keys stored as k - mu (calibrated mu).
        layer_k: ``(top, FormatSpec)``: keys of the ``top`` most sensitive layers in that format;
            ``(top, FormatSpec, "boundary")``: the first top/2 and last top - top/2 layers;
            a float ``top`` in (0, 1) is a fraction of the model's layers (rounded half up).
        reparam: exact key reparametrization (bench.accuracy.kvquant.key_scales), or None.
        key_scale: per-channel key scales applied by the golden model (sim_models.scale_keys):
            ``"pow2"``, ``"fp16"`` or None (:data:`sim_models.policy.KEY_SCALES`).
        key_scale_rule: how the scales are calibrated (bench.accuracy.kvquant.calibrated_key_scales):
            ``"qaware"`` (the format's rule) or ``"keyonly"``.
        key_signs: calibrated sign flip per (layer, kv head) (keys).
        key_rot: calibrated 4x4 rotations after the FWHT per (layer, kv head) (keys).
        boundary: K and V of the first and last ``boundary`` layers stored in bf16 (at most
            half the layers), as peers that leave boundary layers uncompressed do.
        recent: the ``recent`` most recent tokens (the query's own included) are read in fp16
            (a ring of fp16 K/V, in the stored domain: centered and scaled keys, as sinks);
            a token is read from its quantized form once it leaves the ring. The ring's fp16
            rows are stored beside the codes of the same tokens
            (:attr:`sim_models.CachePolicy.recent`; :data:`BITS_RULE`).
        ip_scale: formats choose each block's scale byte so that ``y . y_hat = |y|^2``
            (bench.accuracy.kvquant.IPScaled); the stored bytes are unchanged in kind.
        key_fold: keys are encoded with the folded key front end
            (``sim_models.codec.encode_folded``: the key scale and the centering inside block
            floating point, no fp16 rounding per lane) instead of ``key_front`` then
            ``encode``; needs centering and power-of-two key scales. Sinks and the ring keep
            the key front end's fp16 rows.
    """

    name: str
    group: str
    k: KVSpec
    v: KVSpec
    sinks: int = 0
    center_keys: bool = False
    layer_k: tuple | None = None
    reparam: dict | None = None
    note: str = ""
    key_scale: str | None = None
    key_scale_rule: str = "qaware"
    key_signs: bool = False
    key_rot: bool = False
    boundary: int = 0
    recent: int = 0
    ip_scale: bool = False
    key_fold: bool = False

    def __post_init__(self):
        if self.key_scale not in (None, *KEY_SCALES):
            raise ValueError(f"{self.name}: key_scale must be one of {KEY_SCALES} or None, got {self.key_scale!r}")
        if self.boundary < 0:
            raise ValueError(f"{self.name}: boundary must be >= 0, got {self.boundary}")
        if isinstance(self.recent, bool) or not isinstance(self.recent, int) or self.recent < 0:
            raise ValueError(f"{self.name}: recent must be an int >= 0, got {self.recent!r}")
        if (self.recent or self.ip_scale) and self.peer:
            raise ValueError(f"{self.name}: recent and ip_scale apply to the study's formats, "
                             f"not to peer formats")
        if self.layer_k and isinstance(self.layer_k[0], float) and not 0 < self.layer_k[0] < 1:
            raise ValueError(f"{self.name}: a fractional layer_k top must be in (0, 1), "
                             f"got {self.layer_k[0]}")
        if self.key_fold and not (self.center_keys and self.key_scale == "pow2" and not self.peer
                                  and not self.ip_scale and not (self.key_signs or self.key_rot)):
            raise ValueError(f"{self.name}: key_fold needs center_keys and key_scale 'pow2' on the "
                             f"study's formats, without ip_scale, key_signs or key_rot")
        if self.key_scale_rule not in KEY_SCALE_RULES:
            raise ValueError(f"{self.name}: key_scale_rule must be one of {KEY_SCALE_RULES}, "
                             f"got {self.key_scale_rule!r}")

    @property
    def key_scale_kind(self) -> str | None:
        """``"<rule>-<key_scale>"`` (e.g. ``"qaware-pow2"``) for bench.accuracy.kvquant.calibrated_key_scales,
        or None without key scales."""
        return f"{self.key_scale_rule}-{self.key_scale}" if self.key_scale else None

    @property
    def tables(self) -> bool:
        """Whether the configuration reads calibrated per-model tables."""
        return bool(self.center_keys or self.reparam or self.layer_k or self.key_scale
                    or self.key_signs or self.key_rot)

    @property
    def peer(self) -> bool:
        """Whether K or V is stored by a peer format (bench.accuracy.peers)."""
        return isinstance(self.k, Peer) or isinstance(self.v, Peer)

    def boundary_layers(self, n_layers: int | None) -> list[int]:
        """Layers kept in bf16 (the first and last min(boundary, n_layers // 2))."""
        if not self.boundary:
            return []
        if n_layers is None:
            raise ValueError(f"{self.name}: boundary layers need the layer count")
        n = min(self.boundary, n_layers // 2)
        return sorted(set(range(n)) | set(range(n_layers - n, n_layers)))

    def _resolve(self, s: KVSpec, head_dim: int) -> Quantizer:
        if s is None or isinstance(s, (Baseline, Peer)):
            return s
        return FormatParams(n=head_dim, **s)

    def _stored(self, s: KVSpec, head_dim: int) -> Quantizer:
        """The quantizer of spec ``s`` (``ip_scale``: the format with the inner-product scale)."""
        q = self._resolve(s, head_dim)
        return IPScaled(q) if self.ip_scale and isinstance(q, FormatParams) else q

    def layer_top(self, n_layers: int) -> int:
        """How many layers ``layer_k`` names for a model of ``n_layers`` layers."""
        top = self.layer_k[0]
        if isinstance(top, float):
            return max(1, int(top * n_layers + 0.5))
        return top

    def wide_layers(self, k_sens: np.ndarray | None) -> list[int]:
        """Layers whose keys use ``layer_k``'s format (sorted)."""
        if not self.layer_k:
            return []
        if len(self.layer_k) > 2 and self.layer_k[2] == "boundary":
            n = len(k_sens) if k_sens is not None else None
            if n is None:
                raise ValueError(f"{self.name}: boundary layers need the layer count (k_sens)")
            top = self.layer_top(n)
            return sorted(set(range(top // 2)) | set(range(n - (top - top // 2), n)))
        if k_sens is None:
            raise ValueError(f"{self.name}: layer_k needs the calibration's k_sens")
        top = self.layer_top(len(k_sens))
        return sorted(int(l) for l in np.argsort(-np.asarray(k_sens), kind="stable")[:top])

    def quantizer(self, layer: int, kind: str, head_dim: int, k_sens=None,
                  n_layers: int | None = None) -> Quantizer:
        """Quantizer of ``kind`` ("k"/"v") in ``layer`` for a model of this head_dim
        (``n_layers``: the model's layer count, needed with ``boundary``)."""
        if layer in self.boundary_layers(n_layers):
            return BF16()
        if kind == "k" and layer in self.wide_layers(k_sens):
            return self._stored(self.layer_k[1], head_dim)
        return self._stored(self.k if kind == "k" else self.v, head_dim)

    def policy(self, head_dim: int, k_sens=None) -> CachePolicy | None:
        """The sim_models.CachePolicy of this configuration (None when a Baseline is used)."""
        if isinstance(self.k, (Baseline, Peer)) or isinstance(self.v, (Baseline, Peer)):
            return None
        lk = tuple((l, self._resolve(self.layer_k[1], head_dim))
                   for l in self.wide_layers(k_sens))
        return CachePolicy(k=self._resolve(self.k, head_dim), v=self._resolve(self.v, head_dim),
                           sinks=self.sinks, center_keys=self.center_keys, layer_k=lk,
                           key_scale=self.key_scale, key_signs=self.key_signs, key_rot=self.key_rot,
                           recent=self.recent)

    def policy_spec(self) -> str | None:
        """The :class:`sim_models.CachePolicy` spec string this configuration equals (a policy
        preset name where one matches, e.g. ``"v3"``), or None where it is no cache policy over
        the default per-vector format: baselines, reparametrizations, key-only scale rules,
        layers chosen by calibration, other per-vector fields."""
        if (self.reparam or self.layer_k or self.key_scale_rule != "qaware" or self.ip_scale
                or self.key_fold):
            return None
        pol = self.policy(64)
        if pol is None:
            return None
        default = FormatParams(n=64)
        for f in (pol.k, pol.v):
            if f is not None and f != dataclasses.replace(default, bits=f.bits):
                return None
        presets = [name for name, p in POLICY_PRESETS.items() if p.rebase(default) == pol]
        if presets:
            return presets[0]
        return "fp16" if pol.spec == "K16V16" else pol.spec

    def table_bytes(self, n_layers: int, n_kv_heads: int, head_dim: int) -> int:
        """Per-model calibration table bytes the configuration reads (0 for baselines)."""
        pol = self.policy(head_dim, np.zeros(n_layers))
        return 0 if pol is None else pol.table_bytes(n_layers, n_kv_heads, head_dim)

    def bits(self, n_layers: int, n_kv_heads: int, head_dim: int, context: int,
             k_sens=None) -> float:
        """Average stored bits per K/V element of one ``context``-token sequence
        (:data:`BITS_RULE`; mu and key scales are model constants, not counted)."""
        pol = self.policy(head_dim, k_sens)
        if pol is not None:
            return pol.bits_per_element(n_layers, n_kv_heads, head_dim, context)
        if self.peer:
            if self.sinks:
                raise ValueError(f"{self.name}: sinks are not counted for peer formats")
            qs = [[self.quantizer(l, kind, head_dim, k_sens, n_layers) for kind in ("k", "v")]
                  for l in range(n_layers)]
            if any(isinstance(q, (Baseline, FormatParams)) for lq in qs for q in lq):
                raise ValueError(f"{self.name}: a peer format is paired with a study format")
            return sum(slot_bits(k, v, head_dim, context, n_kv_heads) for k, v in qs) / n_layers
        s = min(self.sinks, context)
        ring = min(self.recent, context - s)          # fp16 rows beside the tokens' codes
        tot = 0.0
        for layer in range(n_layers):
            for kind in ("k", "v"):
                b = bits_per_element(self.quantizer(layer, kind, head_dim, k_sens), head_dim)
                tot += ((s + ring) * 16.0 + (context - s) * b) / context
        return tot / (2 * n_layers)

    def spec(self) -> dict:
        """JSON form of what is stored (results file, hash). Its keys are the results files'
        (``center``, ``signs``, ``rot``, ``key_scale`` as ``"<rule>-<scale>"``), unchanged so that
        stored results keep their hashes; the key treatments appear only when used."""
        def js(s):
            if isinstance(s, Peer):
                return s.spec()
            if isinstance(s, Baseline):
                return {"baseline": {"bits": s.bits, "rotate": s.rotate}}
            return "fp16" if s is None else {"fmt": s}
        d = {"k": js(self.k), "v": js(self.v), "sinks": self.sinks, "center": self.center_keys,
             "layer_k": None if not self.layer_k else {"top": self.layer_k[0],
                                                       "fmt": self.layer_k[1]},
             "reparam": self.reparam}
        if self.layer_k and len(self.layer_k) > 2:
            d["layer_k"]["rule"] = self.layer_k[2]
        if self.boundary:
            d["boundary_bf16"] = self.boundary
        if self.recent:
            d["recent"] = self.recent
        if self.ip_scale:
            d["ip_scale"] = True
        if self.key_fold:
            d["key_fold"] = True
        for k, v in (("key_scale", self.key_scale_kind), ("signs", self.key_signs), ("rot", self.key_rot)):
            if v:
                d[k] = v
        return d

    def spec_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.spec(), sort_keys=True).encode()).hexdigest()[:12]


def _f(**kw) -> FormatSpec:
    return {**STUDY_BASE, **kw}


def _cfg(name, k, v=_SAME, sinks=0, center_keys=False, layer_k=None, group="", note="",
         reparam=None, key_scale=None, key_scale_rule="qaware", key_signs=False, key_rot=False,
         boundary=0, recent=0, ip_scale=False, key_fold=False) -> Config:
    return Config(name=name, group=group, k=k, v=k if v is _SAME else v, sinks=sinks,
                  center_keys=center_keys, layer_k=layer_k, reparam=reparam, note=note,
                  key_scale=key_scale, key_scale_rule=key_scale_rule, key_signs=key_signs, key_rot=key_rot,
                  boundary=boundary, recent=recent, ip_scale=ip_scale, key_fold=key_fold)


V1 = {}
#: Lever study: fp16 recent-ring sizes, shares of layers with 4-bit keys, and the
#: combinations run (ring size or 0, layer share or 0, inner-product scale).
LEVER_RECENT = (8, 16, 32, 64)
LEVER_LAYER_SHARES = (0.10, 0.25)
LEVER_COMBOS = ((8, 0.10, False), (16, 0.10, False))
LM = dict(mode="lloydmax", scale_rule="rms", scale_round="nearest")
MR = dict(mode="midrise", scale_rule="rms", scale_round="nearest")


def configurations() -> list[Config]:
    """Every configuration of the study, in table order."""
    c = []
    add = c.append
    # baselines
    add(_cfg("fp16", FP16, group="baseline", note="K/V rounded to fp16"))
    add(_cfg("int4-asym", Baseline(4), group="baseline",
             note="naive INT4, per token-head min/max, fp16 scale + min"))
    add(_cfg("int4-asym-DH", Baseline(4, rotate=True), group="baseline",
             note="INT4 after orthonormal D*H (SAW-INT4-like)"))
    add(_cfg("int3-asym", Baseline(3), group="baseline", note="naive INT3"))
    add(_cfg("int3-asym-DH", Baseline(3, rotate=True), group="baseline", note="INT3 after D*H"))
    add(_cfg("published-H-midtread", _f(sign_seed=None), group="baseline",
             note="published 3-bit formula: H (no D) + 7-level mid-tread, max scale"))
    # quantizer mode x scale rule x rounding, b = 3, G = 64, ue5m3, no centering
    add(_cfg("v1-default", _f(), group="mode", note="D*H midtread, max, up (format version 1 default)"))
    add(_cfg("midtread-max-near", _f(scale_round="nearest"), group="mode"))
    add(_cfg("midtread-rms-near", _f(scale_rule="rms", scale_round="nearest"), group="mode"))
    add(_cfg("asym-max-up", _f(mode="asym"), group="mode", note="zero point byte per block"))
    add(_cfg("asym-max-near", _f(mode="asym", scale_round="nearest"), group="mode"))
    add(_cfg("midrise-max-up", _f(mode="midrise"), group="mode"))
    add(_cfg("midrise-max-near", _f(mode="midrise", scale_round="nearest"), group="mode"))
    add(_cfg("midrise-rms-up", _f(mode="midrise", scale_rule="rms"), group="mode"))
    add(_cfg("midrise-rms-near", _f(**MR), group="mode"))
    add(_cfg("midrise-absmean-near", _f(mode="midrise", scale_rule="absmean",
                                        scale_round="nearest"), group="mode"))
    add(_cfg("lloydmax-max-near", _f(mode="lloydmax", scale_round="nearest"), group="mode"))
    add(_cfg("lloydmax-rms-up", _f(mode="lloydmax", scale_rule="rms"), group="mode"))
    add(_cfg("lloydmax-rms-near", _f(**LM), group="mode"))
    add(_cfg("lloydmax-absmean-near", _f(mode="lloydmax", scale_rule="absmean",
                                         scale_round="nearest"), group="mode"))
    # clipping multiplier (rms rule): 0.9, 1.1 sigma
    add(_cfg("lloydmax-rms-near-x0.9", _f(**LM, scale_mult=230), group="mult"))
    add(_cfg("lloydmax-rms-near-x1.1", _f(**LM, scale_mult=282), group="mult"))
    add(_cfg("midrise-rms-near-x0.9", _f(**MR, scale_mult=135), group="mult"))
    add(_cfg("midrise-rms-near-x1.1", _f(**MR, scale_mult=165), group="mult"))
    # key centering and sinks
    for nm, kw in (("v1-default", {}), ("asym-max-up", dict(mode="asym")),
                   ("midrise-rms-near", MR), ("lloydmax-rms-near", LM)):
        add(_cfg(nm + "+C", _f(**kw), center_keys=True, group="center"))
    add(_cfg("lloydmax-rms-near+S4", _f(**LM), sinks=4, group="sinks"))
    for nm, kw in (("v1-default", {}), ("midrise-rms-near", MR), ("lloydmax-rms-near", LM)):
        add(_cfg(nm + "+C+S4", _f(**kw), center_keys=True, sinks=4, group="sinks"))
    add(_cfg("lloydmax-rms-near+C+S1", _f(**LM), center_keys=True, sinks=1, group="sinks"))
    add(_cfg("lloydmax-rms-near+C+S16", _f(**LM), center_keys=True, sinks=16, group="sinks"))
    # scale encodings (best mode, centered, sinks 4)
    for enc in ("e4m3fn", "e5m2", "ue4m4"):
        add(_cfg(f"lloydmax-rms-near-{enc}+C+S4", _f(**LM, scale=enc), center_keys=True, sinks=4,
                 group="scale"))
    add(_cfg("lloydmax-rms-up-e4m3fn+C+S4", _f(mode="lloydmax", scale_rule="rms", scale="e4m3fn"),
             center_keys=True, sinks=4, group="scale"))
    add(_cfg("lloydmax-rms-up+C+S4", _f(mode="lloydmax", scale_rule="rms"), center_keys=True, sinks=4,
             group="scale"))
    # block size (N = head_dim = 64, so G <= 64 here)
    add(_cfg("v1-default-G32", _f(block=32), group="block"))
    add(_cfg("lloydmax-rms-near-G32+C+S4", _f(**LM, block=32), center_keys=True, sinks=4, group="block"))
    add(_cfg("midrise-rms-near-G32+C+S4", _f(**MR, block=32), center_keys=True, sinks=4, group="block"))
    # code width
    for b in (2, 4):
        add(_cfg(f"lloydmax-rms-near-b{b}+C+S4", _f(**LM, bits=b), center_keys=True, sinks=4,
                 group="bits"))
    add(_cfg("v1-default-b4", _f(bits=4), group="bits", note="INT4 + D*H through the golden model"))
    add(_cfg("midrise-rms-near-b4+C+S4", _f(**MR, bits=4), center_keys=True, sinks=4, group="bits"))
    # K/V bit split and layer-wise key precision
    add(_cfg("K4V3-lloydmax+C+S4", _f(**LM, bits=4), _f(**LM), center_keys=True, sinks=4, group="kv"))
    add(_cfg("K4V2-lloydmax+C+S4", _f(**LM, bits=4), _f(**LM, bits=2), center_keys=True, sinks=4,
             group="kv"))
    add(_cfg("K3V2-lloydmax+C+S4", _f(**LM), _f(**LM, bits=2), center_keys=True, sinks=4, group="kv"))
    add(_cfg("K3V4-lloydmax+C+S4", _f(**LM), _f(**LM, bits=4), center_keys=True, sinks=4, group="kv"))
    for top in (2, 4):
        add(_cfg(f"lloydmax-rms-near+C+S4+K4top{top}", _f(**LM), center_keys=True, sinks=4,
                 layer_k=(top, _f(**LM, bits=4)), group="layer"))
    add(_cfg("K4V3-lloydmax-G32+C+S4", _f(**LM, bits=4, block=32), _f(**LM, block=32),
             center_keys=True, sinks=4, group="kv"))
    # midrise with the max rule rounded to nearest (robust to outlier channels), centered
    MM = dict(mode="midrise", scale_round="nearest")
    add(_cfg("midrise-max-near+C", _f(**MM), center_keys=True, group="center"))
    add(_cfg("midrise-max-near+C+S4", _f(**MM), center_keys=True, sinks=4, group="sinks"))
    add(_cfg("midrise-max-near+C+S1", _f(**MM), center_keys=True, sinks=1, group="sinks"))
    add(_cfg("lloydmax-max-near+C+S4", _f(mode="lloydmax", scale_round="nearest"), center_keys=True,
             sinks=4, group="sinks"))
    add(_cfg("midrise-max-up+C+S4", _f(mode="midrise"), center_keys=True, sinks=4, group="scale"))
    add(_cfg("midrise-max-near-G32+C+S4", _f(**MM, block=32), center_keys=True, sinks=4, group="block"))
    add(_cfg("midrise-max-near-b4+C+S4", _f(**MM, bits=4), center_keys=True, sinks=4, group="bits"))
    add(_cfg("midrise-max-near-b2+C+S4", _f(**MM, bits=2), center_keys=True, sinks=4, group="bits"))
    add(_cfg("K4V2-midrise-max-near+C+S4", _f(**MM, bits=4), _f(**MM, bits=2), center_keys=True,
             sinks=4, group="kv"))
    add(_cfg("K4V3-midrise-max-near+C+S4", _f(**MM, bits=4), _f(**MM), center_keys=True, sinks=4,
             group="kv"))
    add(_cfg("midrise-max-near+C+S4+K4top4", _f(**MM), center_keys=True, sinks=4,
             layer_k=(4, _f(**MM, bits=4)), group="layer"))
    # robustness: the same model with strong key outlier channels (exact reparametrization
    # q.k = (q/s).(k*s): the 2 channels of largest |mu| per (layer, kv-head) x4)
    out = {"kind": "outlier", "gain": 4, "top": 2}
    for nm, k, kw in (("fp16", FP16, {}), ("int4-asym-DH", Baseline(4, rotate=True), {}),
                      ("v1-default", _f(), {}), ("v1-default", _f(), dict(center_keys=True, sinks=4)),
                      ("midrise-max-near", _f(**MM), {}),
                      ("midrise-max-near", _f(**MM), dict(center_keys=True, sinks=4)),
                      ("midrise-rms-near", _f(**MR), dict(center_keys=True, sinks=4)),
                      ("lloydmax-rms-near", _f(**LM), {}),
                      ("lloydmax-rms-near", _f(**LM), dict(center_keys=True, sinks=4)),
                      ("lloydmax-max-near", _f(mode="lloydmax", scale_round="nearest"),
                       dict(center_keys=True, sinks=4)),
                      ("asym-max-near", _f(mode="asym", scale_round="nearest"),
                       dict(center_keys=True, sinks=4))):
        suffix = "+C+S4" if kw else ""
        add(_cfg(f"{nm}{suffix}+OUT4", k, group="outlier", reparam=out, **kw))
    # query-aware per-channel key scaling (exact reparametrization, powers of two)
    for nm, kw in (("midrise-max-near", MM), ("lloydmax-rms-near", LM)):
        add(_cfg(nm + "+C+S4+QS", _f(**kw), center_keys=True, sinks=4, group="qscale",
                 reparam={"kind": "qaware"}))
    add(_cfg("K4V3-midrise-max-near+C+S4+QS", _f(**MM, bits=4), _f(**MM), center_keys=True, sinks=4,
             group="qscale", reparam={"kind": "qaware"}))
    add(_cfg("midrise-max-near-b4+C+S4+QS", _f(**MM, bits=4), center_keys=True, sinks=4,
             group="qscale", reparam={"kind": "qaware"}))
    # towards 1% of fp16
    add(_cfg("K4V3-midrise-max-near-G32+C+S4", _f(**MM, bits=4, block=32), _f(**MM, block=32),
             center_keys=True, sinks=4, group="kv"))
    add(_cfg("midrise-max-near-b4-G32+C+S4", _f(**MM, bits=4, block=32), center_keys=True, sinks=4,
             group="bits"))
    add(_cfg("Kfp16-V4-midrise-max-near", FP16, _f(**MM, bits=4), group="kv",
             note="keys uncompressed"))
    add(_cfg("Kfp16-V3-midrise-max-near", FP16, _f(**MM), group="kv",
             note="keys uncompressed"))

    # streaming-safe key treatments in the golden model, on the v2 policy
    # (v2 quantizer + centering + 4 sinks); per-model tables from the calibration file
    V2 = dict(mode="midrise", scale_round="nearest")
    P = dict(center_keys=True, sinks=4)
    for tag, ks, rule in (("KS2", "pow2", "qaware"), ("KSf", "fp16", "qaware"), ("KSk", "pow2", "keyonly")):
        add(_cfg(f"v2+C+S4+{tag}", _f(**V2), **P, key_scale=ks, key_scale_rule=rule, group="v3"))
    add(_cfg("v2+C+S4+SG", _f(**V2), **P, key_signs=True, group="v3"))
    add(_cfg("v2+C+S4+KS2+SG", _f(**V2), **P, key_scale="pow2", key_signs=True, group="v3"))
    add(_cfg("v2+C+S4+KS2+R4", _f(**V2), **P, key_scale="pow2", key_rot=True, group="v3"))
    add(_cfg("v2+C+S4+KS2+SG+R4", _f(**V2), **P, key_scale="pow2", key_signs=True, key_rot=True,
             group="v3"))
    add(_cfg("v2+C+S4+KS2+KB2", _f(**V2), **P, key_scale="pow2",
             layer_k=(2, _f(**V2, bits=4), "boundary"), group="v3",
             note="4-bit keys in the first and last layer"))
    add(_cfg("v2+C+S4+KS2+K4top2", _f(**V2), **P, key_scale="pow2",
             layer_k=(2, _f(**V2, bits=4)), group="v3",
             note="4-bit keys in the 2 most sensitive layers (calibration)"))
    add(_cfg("v2-KG32+C+S1+KS2", _f(**V2, block=32), _f(**V2), center_keys=True, sinks=1,
             key_scale="pow2", group="v3", note="keys G = 32, values G = 64"))
    add(_cfg("v2-K4V2+C+S4+KS2", _f(**V2, bits=4), _f(**V2, bits=2), **P,
             key_scale="pow2", group="v3"))
    add(_cfg("v2+C+S1+KS2", _f(**V2), center_keys=True, sinks=1, key_scale="pow2",
             group="v3"))
    add(_cfg("v2-K4V3+C+S4+KS2", _f(**V2, bits=4), _f(**V2), **P, key_scale="pow2",
             group="v3"))
    add(_cfg("v2-K4V3+C+S4+KS2+SG", _f(**V2, bits=4), _f(**V2), **P, key_scale="pow2",
             key_signs=True, group="v3"))
    add(_cfg("v2-b4+C+S4+KS2", _f(**V2, bits=4), **P, key_scale="pow2", group="v3"))
    add(_cfg("v2-b4-KG32+C+S4+KS2", _f(**V2, bits=4, block=32), _f(**V2, bits=4), **P,
             key_scale="pow2", group="v3"))
    add(_cfg("v2-b4-KG16+C+S4+KS2", _f(**V2, bits=4, block=16), _f(**V2, bits=4), **P,
             key_scale="pow2", group="v3"))
    add(_cfg("v2-KG32+C+S1+KSf", _f(**V2, block=32), _f(**V2), center_keys=True, sinks=1,
             key_scale="fp16", group="v3", note="keys G = 32, values G = 64"))
    add(_cfg("v2-KG32+C+S1+KS2+SG", _f(**V2, block=32), _f(**V2), center_keys=True, sinks=1,
             key_scale="pow2", key_signs=True, group="v3"))
    add(_cfg("v2-K4V3+C+S4+KSf", _f(**V2, bits=4), _f(**V2), **P, key_scale="fp16",
             group="v3"))
    add(_cfg("v2-b4+C+S4+KSf", _f(**V2, bits=4), **P, key_scale="fp16", group="v3"))
    add(_cfg("v2-K4G32V3+C+S4+KS2", _f(**V2, bits=4, block=32), _f(**V2), **P,
             key_scale="pow2", group="v3"))

    # levers, each alone on the v3 policy, then combined: an fp16 ring of the most recent
    # tokens (W<R>; the ring of 16 is format version 4's policy v4), 4-bit keys on a share of
    # the layers ranked by the calibration's key sensitivity (K4top<p>%) or on the boundary
    # layers (K4B<p>%), the inner-product-preserving block scale (IP)
    V3 = dict(**P, key_scale="pow2")
    K4 = _f(**V2, bits=4)
    for r in LEVER_RECENT:
        add(_cfg(f"v3+W{r}", _f(**V2), **V3, recent=r, group="lever",
                 note=f"fp16 ring of the {r} most recent tokens"))
    for frac in LEVER_LAYER_SHARES:
        pc = round(100 * frac)
        add(_cfg(f"v3+K4top{pc}%", _f(**V2), **V3, layer_k=(frac, K4), group="lever",
                 note=f"4-bit keys in the {pc}% most key-sensitive layers (calibration)"))
        add(_cfg(f"v3+K4B{pc}%", _f(**V2), **V3, layer_k=(frac, K4, "boundary"), group="lever",
                 note=f"4-bit keys in {pc}% of the layers, first and last"))
    add(_cfg("v3+IP", _f(**V2), **V3, ip_scale=True, group="lever",
             note="inner-product-preserving block scale (K and V)"))
    for r, frac, ip in LEVER_COMBOS:
        name = "v3" + (f"+W{r}" if r else "") + (f"+K4top{round(100 * frac)}%" if frac else "") \
            + ("+IP" if ip else "")
        add(_cfg(name, _f(**V2), **V3, recent=r, layer_k=(frac, K4) if frac else None,
                 ip_scale=ip, group="lever", note="combined levers"))

    # a format change under study: the key front end folded into block floating point
    add(_cfg("v3+W16+KF", _f(**V2), **V3, recent=16, key_fold=True, group="fold",
             note="v4 with the folded key front end (sim_models.codec.encode_folded)"))

    # other projects' formats (bench/accuracy/peers.py cites each); int4-asym above is
    # LMDeploy's INT4 per (token, head)
    add(_cfg("fp8-e4m3", FP8PerTensor(), group="peer",
             note="vLLM kv_cache_dtype=fp8: e4m3, one scale per tensor (1.0)"))
    add(_cfg("kivi-2", KiviKey(2, 32, 128), KiviValue(2, 32, 128), group="peer",
             note="KIVI-2 as published: G = 32, fp16 residual R = 128"))
    add(_cfg("kivi-3-G128-R32", KiviKey(3, 128, 128), KiviValue(3, 128, 32), group="peer",
             note="KIVI at 3 bits: key groups of 128 tokens, value groups of 128 channels "
                  "(at most head_dim), fp16 residual 128 keys / 32 values"))
    add(_cfg("tq-3bit-nc", TurboQuantKey(3), UniformAsym(3), boundary=2, group="peer",
             note="vLLM turboquant_3bit_nc: first and last 2 layers bf16"))
    add(_cfg("tq-k3v4-nc", TurboQuantKey(3), UniformAsym(4), boundary=2, group="peer",
             note="vLLM turboquant_k3v4_nc: first and last 2 layers bf16"))
    add(_cfg("tq-3bit-nc-all", TurboQuantKey(3), UniformAsym(3), group="peer",
             note="turboquant_3bit_nc on every layer (no bf16 boundary layers)"))
    add(_cfg("octave-k3v3-compact", Octave(3, 0, 4), group="peer",
             note="vLLM octave_k3v3_compact: inner-product-preserving scale"))
    add(_cfg("octave-k3v3", Octave(4, OCTAVE_BLOCK, 8), Octave(3, 0, 8), group="peer",
             note="vLLM octave_k3v3 on a full-RoPE model: 4-bit keys per 64-dim block, "
                  "3-bit values"))
    return c


#: The configuration recommended as the version-2 default (docs/ACCURACY.md).
RECOMMENDED = "midrise-max-near+C+S4"
#: Leading configurations, also run on the CONFIRM_STARTS contexts (less noise).
CONFIRM = ["fp16", "int4-asym", "int4-asym-DH", "published-H-midtread", "v1-default",
           "v1-default+C+S4", "midrise-max-up", "midrise-rms-near+C+S4", "lloydmax-rms-near",
           "lloydmax-rms-near+C", "lloydmax-rms-near+C+S4", "lloydmax-rms-near-G32+C+S4",
           "K4V2-lloydmax+C+S4", "K4V3-lloydmax+C+S4", "midrise-max-near", "midrise-max-near+C+S4",
           "midrise-max-near-G32+C+S4", "K4V2-midrise-max-near+C+S4", "K4V3-midrise-max-near+C+S4",
           "midrise-max-near-b4+C+S4", "midrise-max-near+C+S4+QS", "midrise-max-near+C+S4+K4top4",
           "K4V3-midrise-max-near-G32+C+S4", "K4V3-midrise-max-near+C+S4+QS",
           "midrise-max-near-b4+C+S4+QS", "Kfp16-V4-midrise-max-near"]


#: The v3 candidates (key treatments), and the references they are compared with.
V3_STUDY = ["fp16", "midrise-max-near", "midrise-max-near+C+S4", "K4V3-midrise-max-near+C+S4",
            "midrise-max-near-b4+C+S4", "Kfp16-V4-midrise-max-near",
            "midrise-max-near-G32+C+S4", "K4V2-midrise-max-near+C+S4"] + [
    c.name for c in configurations() if c.group == "v3"]


#: The peers (bench/accuracy/peers.py) and the study's own configurations they are compared with
#: (the cache policies v4, v3, v3-K4V3: bench.accuracy.report.OURS).
PEER_STUDY = ["fp16", "int4-asym", "v3+W16", "v2+C+S4+KS2", "v2-K4V3+C+S4+KS2"] + [
    c.name for c in configurations() if c.group == "peer"]


#: The lever study (group "lever") and the references it is compared with.
LEVER_STUDY = ["fp16", "v2+C+S4+KS2", "v2-K4V3+C+S4+KS2", "v2+C+S4+KS2+SG",
               "kivi-3-G128-R32"] + [c.name for c in configurations() if c.group == "lever"]


#: Where each peer configuration's format is described (the peers table of docs/ACCURACY.md).
PEER_SOURCES = {
    "int4-asym": ("LMDeploy INT4 KV cache (quant_policy=4)",
                  "https://lmdeploy.readthedocs.io/en/latest/quantization/kv_quant.html"),
    "fp8-e4m3": ("vLLM kv_cache_dtype=fp8, default scales",
                 "https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/"),
    "kivi-2": ("KIVI (Liu et al., ICML 2024)", "https://arxiv.org/abs/2402.02750"),
    "kivi-3-G128-R32": ("KIVI at 3 bits (Liu et al., ICML 2024)",
                        "https://arxiv.org/abs/2402.02750"),
    "tq-3bit-nc": ("vLLM TurboQuant turboquant_3bit_nc",
                   "https://docs.vllm.ai/en/latest/api/vllm/model_executor/layers/quantization/turboquant/"),
    "tq-k3v4-nc": ("vLLM TurboQuant turboquant_k3v4_nc",
                   "https://docs.vllm.ai/en/latest/api/vllm/model_executor/layers/quantization/turboquant/"),
    "tq-3bit-nc-all": ("vLLM TurboQuant turboquant_3bit_nc, every layer compressed",
                       "https://docs.vllm.ai/en/latest/api/vllm/model_executor/layers/quantization/turboquant/"),
    "octave-k3v3-compact": ("vLLM Octave octave_k3v3_compact",
                            "https://docs.vllm.ai/en/latest/api/vllm/v1/attention/ops/rocm_octave/"),
    "octave-k3v3": ("vLLM Octave octave_k3v3",
                    "https://docs.vllm.ai/en/latest/api/vllm/v1/attention/ops/rocm_octave/"),
}


#: The version-2 default format alone (no policy).
V2_DEFAULT = "midrise-max-near"


def by_name(names=None) -> list[Config]:
    """Configurations named in ``names`` (all when None), in table order.

    Raises:
        ValueError: an unknown name.
    """
    allc = configurations()
    if names is None:
        return allc
    names = list(names)
    known = {c.name for c in allc}
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"unknown configuration names: {bad} (see --list)")
    return [c for c in allc if c.name in set(names)]
