"""Cache policy: which format each layer's K and V use, sinks, recent ring, centering; stored bits.

One concept: the per-cache decisions above the per-vector format. A
:class:`CachePolicy` names a :class:`FormatParams` (or ``None`` = keep fp16)
for keys and for values, per-layer overrides (layer-wise precision), how many
leading tokens of each sequence are kept in fp16 (attention sinks), how many of
its most recent tokens are read in fp16 before they are encoded (the recent ring), and
whether keys are centered (sim_models/center.py), scaled per channel
(sim_models/keyscale.py) and given per-(layer, kv head) transform tables
(sim_models/transform.py). :meth:`CachePolicy.stored_bits` counts every byte the
cache holds, so average bits per element are honest: codes, scale bytes, zero
points, fp16 sink and ring tokens and wider layers. The per-model tables (mu, s, signs,
rotations) are model constants, like weights: not per-token, counted separately
by :meth:`CachePolicy.table_bytes`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

import numpy as np

from .params import PRESETS as FORMAT_PRESETS
from .params import FormatParams

FP16_BITS = 16
#: Most tokens :attr:`CachePolicy.sinks` and :attr:`CachePolicy.recent` may name: token positions are
#: int32 on the GPU, so no sequence holds more than 2**31 - 1 tokens.
MAX_TOKENS = 2**31 - 1
#: Values of :attr:`CachePolicy.key_scale`: per-channel key scales as powers of two
#: (stored as one exponent byte per channel) or as fp16 values.
KEY_SCALES = ("pow2", "fp16")


@dataclass(frozen=True)
class CachePolicy:
    """Attributes:
        k, v: format of keys / values, ``None`` for fp16.
        sinks: the first ``sinks`` tokens of every sequence stay fp16 (>= 0).
        recent: a query reads the ``recent`` most recent tokens of its sequence (its own included)
            in fp16, from a ring of fp16 rows kept beside their codes (>= 0; sinks are not in the
            ring; keys in the front end's domain, as sink keys); older tokens are read through
            their codes, which are the ones they get without the ring.
        center_keys: keys are stored as ``k - mu`` (sinks too).
        layer_k, layer_v: overrides, tuples of (layer, FormatParams or None).
        key_scale: keys stored as ``k * s`` per channel (queries use ``q / s``):
            ``"pow2"``, ``"fp16"`` (:data:`KEY_SCALES`) or None.
        key_signs: keys use a calibrated sign flip per (layer, kv head).
        key_rot: keys use calibrated 4x4 rotations after the FWHT per (layer, kv head).

    Raises:
        TypeError: a format is not a FormatParams / None.
        ValueError: sinks or recent outside [0, :data:`MAX_TOKENS`], or a duplicate / negative override
            layer.
    """

    k: FormatParams | None = field(default_factory=FormatParams)
    v: FormatParams | None = field(default_factory=FormatParams)
    sinks: int = 0
    center_keys: bool = False
    layer_k: tuple = ()
    layer_v: tuple = ()
    key_scale: str | None = None
    key_signs: bool = False
    key_rot: bool = False
    recent: int = 0

    def __post_init__(self):
        if self.key_scale is not None and self.key_scale not in KEY_SCALES:
            raise ValueError(f"key_scale must be one of {KEY_SCALES} or None, "
                             f"got {self.key_scale!r}")
        for name in ("k", "v"):
            f = getattr(self, name)
            if f is not None and not isinstance(f, FormatParams):
                raise TypeError(f"{name} must be a FormatParams or None, got {type(f).__name__}")
        for name in ("sinks", "recent"):
            n = getattr(self, name)
            if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOKENS:
                raise ValueError(f"{name} must be an int in [0, 2**31 - 1] (token positions are int32), "
                                 f"got {n!r}")
        for name in ("layer_k", "layer_v"):
            layers = [entry[0] for entry in getattr(self, name)]
            if any(isinstance(l, bool) or not isinstance(l, (int, np.integer)) for l in layers):
                raise ValueError(f"{name} layers must be ints, got {layers}")
            if len(set(layers)) != len(layers) or any(l < 0 for l in layers):
                raise ValueError(f"{name} layers must be distinct and >= 0, got {layers}")
            for _, f in getattr(self, name):
                if f is not None and not isinstance(f, FormatParams):
                    raise TypeError(f"{name} formats must be FormatParams or None")

    def format_for(self, layer: int, kind: str) -> FormatParams | None:
        """Format of ``kind`` ("k" or "v") in ``layer`` (override, else the default)."""
        if kind not in ("k", "v"):
            raise ValueError(f"kind must be 'k' or 'v', got {kind!r}")
        for l, f in (self.layer_k if kind == "k" else self.layer_v):
            if l == layer:
                return f
        return self.k if kind == "k" else self.v

    def check_layers(self, n_layers: int):
        """Raises ValueError naming :attr:`layer_k` / :attr:`layer_v` if an override names a layer a model
        of ``n_layers`` layers does not have."""
        _check_counts(n_layers=n_layers)
        for name in ("layer_k", "layer_v"):
            bad = [l for l, _ in getattr(self, name) if l >= n_layers]
            if bad:
                raise ValueError(f"policy.{name} names layers {bad}, the model has {n_layers} "
                                 f"(layers 0-{n_layers - 1})")

    def stored_bits(self, n_layers: int, n_kv_heads: int, head_dim: int, context: int) -> int:
        """Total bits the cache stores for one sequence of ``context`` tokens (K and V): the recent
        ring's fp16 rows are counted for packed kinds only (a 16-bit kind stores nothing extra).

        Raises:
            ValueError: n_layers, n_kv_heads, head_dim or context not an int >= 1, head_dim
                not a multiple of some format's N, or an override of a layer >= n_layers
                (:meth:`check_layers`).
        """
        _check_counts(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, context=context)
        self.check_layers(n_layers)
        total = 0
        sink = min(self.sinks, context)
        ring = min(self.recent, context - sink)        # fp16 copies of the most recent tokens, beside their codes
        for layer in range(n_layers):
            for kind in ("k", "v"):
                f = self.format_for(layer, kind)
                if f is None:
                    per_head = FP16_BITS * head_dim
                    rows = sink                        # a 16-bit kind is its own ring: no copies
                else:
                    rows = sink + ring
                    if head_dim % f.n:
                        raise ValueError(f"head_dim {head_dim} is not a multiple of n={f.n} (a cache with "
                                         f"one vector per head uses policy.fit(head_dim))")
                    per_head = 8 * f.bytes_per_vector * (head_dim // f.n)
                q_tokens = context - sink
                total += n_kv_heads * (rows * FP16_BITS * head_dim + q_tokens * per_head)
        return total

    def bits_per_element(self, n_layers: int, n_kv_heads: int, head_dim: int, context: int) -> float:
        """Average stored bits per cached K/V element for one sequence of ``context`` tokens."""
        elems = 2 * n_layers * n_kv_heads * head_dim * context
        return self.stored_bits(n_layers, n_kv_heads, head_dim, context) / elems

    def table_bytes(self, n_layers: int, n_kv_heads: int, head_dim: int) -> int:
        """Bytes of the per-model tables this policy reads (model constants, not per
        token): mu (fp16 per key channel), key scales (one exponent byte or an fp16 per
        channel), sign masks (head_dim bits) and rotations (head_dim / 4 int16 4x4 blocks),
        each per (layer, kv head)."""
        per = 0
        if self.center_keys:
            per += 2 * head_dim
        if self.key_scale:
            per += (1 if self.key_scale == "pow2" else 2) * head_dim
        if self.key_signs:
            per += head_dim // 8
        if self.key_rot:
            per += (head_dim // 4) * 16 * 2
        return per * n_layers * n_kv_heads

    def fit(self, head_dim: int, dtype: str | None = None) -> CachePolicy:
        """This policy with every format (defaults and overrides) passed through
        :func:`fit_format`: one vector per head, as the integrations store it.

        Raises:
            ValueError: ``head_dim`` cannot be one vector of some format.
        """
        _check_counts(head_dim=head_dim)

        def fit_layers(layers):
            return tuple((l, fit_format(f, head_dim, dtype)) for l, f in layers)
        return dataclasses.replace(self, k=fit_format(self.k, head_dim, dtype),
                                   v=fit_format(self.v, head_dim, dtype),
                                   layer_k=fit_layers(self.layer_k), layer_v=fit_layers(self.layer_v))

    @classmethod
    def preset(cls, name: str) -> CachePolicy:
        """A named policy (:data:`POLICY_PRESETS`; docs/FORMAT.md 8), case-insensitive.

        Raises:
            ValueError: unknown name.
        """
        names = {n.lower(): n for n in POLICY_PRESETS}
        if not isinstance(name, str) or name.strip().lower() not in names:
            raise ValueError(f"policy preset must be one of {tuple(POLICY_PRESETS)}, got {name!r}")
        return POLICY_PRESETS[names[name.strip().lower()]]

    # ------------------------------------------------------------------ spec strings
    @classmethod
    def parse(cls, spec: str, base: FormatParams | None = None) -> CachePolicy:
        """Policy from its spec string (the inverse of :attr:`spec`), case-insensitive.

        Grammar: a preset name alone (:data:`POLICY_PRESETS`), ``fp16`` (both kinds 16-bit),
        or ``K<b>V<b>`` (``fp16`` = ``K16V16``) followed by ``+`` terms: ``C`` centered keys (:attr:`center_keys`),
        ``S<n>`` n fp16 sink tokens (:attr:`sinks`), ``W<n>`` a ring of the n most recent
        tokens in fp16 (:attr:`recent`), ``KS2`` / ``KSf`` power-of-two / fp16
        per-channel key scales (:attr:`key_scale` ``"pow2"`` / ``"fp16"``), ``SG`` calibrated
        key sign flips (:attr:`key_signs`), ``R4`` calibrated 4x4 key rotations
        (:attr:`key_rot`), ``K<b>@layers`` / ``V<b>@layers`` the keys / values of the listed
        layers at b bits (:attr:`layer_k` / :attr:`layer_v`; layers are a comma list of layer
        indices and inclusive ranges, ``0,1`` or ``0-3,7``). A width of ``16`` means
        unquantized. Example: ``K3V3+C+S4+KS2+W16+K4@0,1``. docs/FORMAT.md 8 states the grammar.

        Args:
            spec: the string.
            base: the per-vector format every width is applied to (default ``FormatParams()``;
                integrations set ``n`` per model with :meth:`fit`).

        Raises:
            ValueError: a malformed spec; the message names the term and the field it sets.
        """
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(f"policy spec must be a non-empty string, got {spec!r}")
        if base is not None and not isinstance(base, FormatParams):
            raise TypeError(f"base must be a FormatParams or None, got {type(base).__name__}")
        presets = {n.lower(): n for n in POLICY_PRESETS}
        key = spec.strip().lower()
        if key in presets:
            pol = POLICY_PRESETS[presets[key]]
            return pol if base is None else pol.rebase(base)
        if spec.split("+")[0].strip().lower() in presets:
            name = presets[spec.split("+")[0].strip().lower()]
            raise ValueError(f"policy spec {spec!r}: a preset name ({', '.join(POLICY_PRESETS)}) stands alone; "
                             f"write the terms out instead ({name} = {POLICY_PRESETS[name].spec})")
        first = spec.split("+")[0].strip()
        if first.lower() in {n.lower() for n in FORMAT_PRESETS}:
            raise ValueError(f"policy spec {spec!r}: {first!r} is a per-vector format preset "
                             f"(sim_models.params.PRESETS, FormatParams.preset), not a cache policy; "
                             f"cache policy presets are {', '.join(POLICY_PRESETS)}, or write K<b>V<b> terms")
        base = base or FormatParams()
        written = [t.strip() for t in spec.split("+")]
        terms = [t.upper() for t in written]

        def fmt(bits: str, term: str, name: str):
            if bits == "16":
                return None
            try:
                return dataclasses.replace(base, bits=int(bits))
            except ValueError as err:
                raise ValueError(f"policy spec {spec!r}: term {term!r} sets {name}: {err}") from None

        if terms[0] == "FP16":
            k = v = None
        else:
            m = _KV_TERM.fullmatch(terms[0])
            if not m:
                raise ValueError(f"policy spec {spec!r}: first term must be K<b>V<b> or fp16 (fields k, v), "
                                 f"got {written[0]!r}")
            k, v = fmt(m.group(1), written[0], "k"), fmt(m.group(2), written[0], "v")
        out = dict(k=k, v=v, sinks=0, center_keys=False, key_scale=None, key_signs=False, key_rot=False,
                   recent=0)
        layer_k, layer_v, seen = [], [], set()
        for t, w in zip(terms[1:], written[1:]):
            flag = _FLAG_TERMS.get(t)
            if flag is not None:
                name, value = flag
            elif t[:1] in _COUNT_TERMS:
                name = _COUNT_TERMS[t[0]]
                if not re.fullmatch(r"[0-9]+", t[1:]):
                    raise ValueError(f"policy spec {spec!r}: term {w!r} sets {name}: write {t[0]}<n> with n >= 0 "
                                     f"in ASCII digits (e.g. {t[0]}4)")
                value = int(t[1:])
            elif _LAYER_TERM.fullmatch(t):
                bits, layers = t[1:].split("@")
                name = "layer_k" if t[0] == "K" else "layer_v"
                dest = layer_k if t[0] == "K" else layer_v
                f = fmt(bits, w, name)
                for item in layers.split(","):
                    lo, _, hi = item.partition("-")
                    if hi and int(hi) < int(lo):
                        raise ValueError(f"policy spec {spec!r}: term {w!r} sets {name}: layer range {item!r} "
                                         f"is empty (write lo-hi with lo <= hi)")
                    dest.extend((l, f) for l in range(int(lo), int(hi or lo) + 1))
                continue
            elif "@" in t:
                raise ValueError(f"policy spec {spec!r}: term {w!r}: layers are written K<b>@l,l,.. or "
                                 f"K<b>@lo-hi (e.g. K4@0,1 or K4@0-3)")
            else:
                raise ValueError(f"policy spec {spec!r}: unknown term {w!r} (C, S<n>, W<n>, KS2, KSf, SG, R4, "
                                 f"K<b>@layers, V<b>@layers)")
            if name in seen:
                raise ValueError(f"policy spec {spec!r}: field {name} is set twice (term {w!r})")
            seen.add(name)
            out[name] = value
        try:
            return cls(**out, layer_k=tuple(layer_k), layer_v=tuple(layer_v))
        except (TypeError, ValueError) as err:
            raise ValueError(f"policy spec {spec!r}: {err}") from None

    @property
    def spec(self) -> str:
        """The spec string of this policy (:meth:`parse` gives it back for the default base).

        Raises:
            ValueError: a format differs from the others in a field other than ``bits`` (a spec
                states widths only; the field is named).
        """
        fmts = [f for f in (self.k, self.v, *(f for _, f in self.layer_k + self.layer_v)) if f is not None]
        for f in fmts[1:]:
            for name in _FORMAT_FIELDS:
                if name != "bits" and getattr(f, name) != getattr(fmts[0], name):
                    raise ValueError(f"policy has no spec string: its formats differ in {name} "
                                     f"({getattr(fmts[0], name)!r} != {getattr(f, name)!r}); a spec states bits only")
        w = lambda f: "16" if f is None else str(f.bits)  # noqa: E731
        s = f"K{w(self.k)}V{w(self.v)}"
        s += "+C" if self.center_keys else ""
        s += f"+S{self.sinks}" if self.sinks else ""
        s += {"pow2": "+KS2", "fp16": "+KSf", None: ""}[self.key_scale]
        s += "+SG" if self.key_signs else ""
        s += "+R4" if self.key_rot else ""
        s += f"+W{self.recent}" if self.recent else ""
        for kind, over in (("K", self.layer_k), ("V", self.layer_v)):
            by_w: dict = {}
            for l, f in over:
                by_w.setdefault(w(f), []).append(str(l))
            s += "".join(f"+{kind}{b}@{','.join(ls)}" for b, ls in by_w.items())
        return s

    def rebase(self, base: FormatParams) -> CachePolicy:
        """This policy with every format replaced by ``base`` at that format's bits (fp16 stays)."""
        def rb(f):
            return None if f is None else dataclasses.replace(base, bits=f.bits)
        return dataclasses.replace(self, k=rb(self.k), v=rb(self.v),
                                   layer_k=tuple((l, rb(f)) for l, f in self.layer_k),
                                   layer_v=tuple((l, rb(f)) for l, f in self.layer_v))


# digits are ASCII only ([0-9], not \d: int() would read other scripts' digits too)
_KV_TERM = re.compile(r"K([0-9]+)V([0-9]+)")
_LAYER_TERM = re.compile(r"[KV][0-9]+@[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")
#: spec terms ``<letter><n>`` that set one count
_COUNT_TERMS = {"S": "sinks", "W": "recent"}
#: spec terms that set one field to one value
_FLAG_TERMS = {"C": ("center_keys", True), "KS2": ("key_scale", "pow2"), "KSF": ("key_scale", "fp16"),
               "SG": ("key_signs", True), "R4": ("key_rot", True)}
_FORMAT_FIELDS = tuple(f.name for f in dataclasses.fields(FormatParams))


def _check_counts(**counts):
    """ValueError naming the first count that is not an int >= 1."""
    for name, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")


def fit_format(f: FormatParams | None, head_dim: int, dtype: str | None = None) -> FormatParams | None:
    """``f`` with ``n = head_dim`` (one vector per head), ``block = min(block, head_dim)`` and,
    if given, the input ``dtype``; ``None`` (fp16) stays ``None``.

    Raises:
        ValueError: naming ``head_dim`` if no vector of that length exists in the format
            (not a power of two >= 8, ...).
    """
    if f is None:
        return None
    changes = dict(n=head_dim, block=min(f.block, head_dim))
    if dtype is not None:
        changes["dtype"] = dtype
    try:
        return dataclasses.replace(f, **changes)
    except ValueError as err:
        raise ValueError(f"head_dim {head_dim} cannot be stored in the packed format (one vector per "
                         f"head): {err}") from None


#: Named cache policies (the *policy* preset namespace: what a cache stores per layer, above the
#: per-vector format; not :data:`sim_models.params.PRESETS`, which names per-vector quantizers, nor
#: rtl_gen's configuration presets, which name RTL builds). The names follow the format version
#: whose deployment they describe (docs/FORMAT.md 8):
#:
#: * ``v2``: the version-2 deployment, per-vector format at b = 3 for keys and values, no per-model
#:   tables (spec ``K3V3``);
#: * ``v3``: format version 3's recommended policy, ``v2`` plus key centering, 4 fp16 sink tokens and
#:   query-aware power-of-two key scales, the tables from :class:`sim_models.KeyTables`
#:   (spec ``K3V3+C+S4+KS2``; 3.150 bits at 2048 tokens);
#: * ``v3-K4V3``: its quality tier with 4-bit keys (spec ``K4V3+C+S4+KS2``; 3.649 bits);
#: * ``v4``: format version 4's recommended policy, ``v3`` plus a ring of the 16 most recent tokens in
#:   fp16 (spec ``K3V3+C+S4+KS2+W16``; 3.275 bits at 2048 tokens, 3.127 at 128K).
POLICY_PRESETS = {
    "v2": CachePolicy(),
    "v3": CachePolicy(sinks=4, center_keys=True, key_scale="pow2"),
    "v3-K4V3": CachePolicy(k=FormatParams(bits=4), sinks=4, center_keys=True, key_scale="pow2"),
    "v4": CachePolicy(sinks=4, center_keys=True, key_scale="pow2", recent=16),
}
