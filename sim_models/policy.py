"""Cache policy: which format each layer's K and V use, sinks, centering; stored bits.

One concept: the per-cache decisions above the per-vector format. A
:class:`CachePolicy` names a :class:`FormatParams` (or ``None`` = keep fp16)
for keys and for values, per-layer overrides (layer-wise precision), how many
leading tokens of each sequence are kept in fp16 (attention sinks), and
whether keys are centered (sim_models/center.py). :meth:`CachePolicy.stored_bits`
counts every byte the cache holds, so average bits per element are honest:
codes, scale bytes, zero points, fp16 sink tokens and wider layers.
(mu is a model constant, like a weight, and is not counted.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .params import FormatParams

FP16_BITS = 16


@dataclass(frozen=True)
class CachePolicy:
    """Attributes:
        k, v: format of keys / values, ``None`` for fp16.
        sinks: the first ``sinks`` tokens of every sequence stay fp16 (>= 0).
        center_keys: keys are stored as ``k - mu`` (sinks too).
        layer_k, layer_v: overrides, tuples of (layer, FormatParams or None).

    Raises:
        TypeError: a format is not a FormatParams / None.
        ValueError: negative sinks, or a duplicate / negative override layer.
    """

    k: FormatParams | None = field(default_factory=FormatParams)
    v: FormatParams | None = field(default_factory=FormatParams)
    sinks: int = 0
    center_keys: bool = False
    layer_k: tuple = ()
    layer_v: tuple = ()

    def __post_init__(self):
        for name in ("k", "v"):
            f = getattr(self, name)
            if f is not None and not isinstance(f, FormatParams):
                raise TypeError(f"{name} must be a FormatParams or None, got {type(f).__name__}")
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or self.sinks < 0:
            raise ValueError(f"sinks must be an int >= 0, got {self.sinks!r}")
        for name in ("layer_k", "layer_v"):
            layers = [entry[0] for entry in getattr(self, name)]
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

    def stored_bits(self, n_layers: int, n_kv_heads: int, head_dim: int, context: int) -> int:
        """Total bits the cache stores for one sequence of ``context`` tokens (K and V).

        Raises:
            ValueError: head_dim is not a multiple of some format's N.
        """
        total = 0
        sink = min(self.sinks, context)
        for layer in range(n_layers):
            for kind in ("k", "v"):
                f = self.format_for(layer, kind)
                if f is None:
                    per_head = FP16_BITS * head_dim
                else:
                    if head_dim % f.n:
                        raise ValueError(f"head_dim {head_dim} is not a multiple of n={f.n}")
                    per_head = 8 * f.bytes_per_vector * (head_dim // f.n)
                q_tokens = context - sink
                total += n_kv_heads * (sink * FP16_BITS * head_dim + q_tokens * per_head)
        return total

    def bits_per_element(self, n_layers: int, n_kv_heads: int, head_dim: int, context: int) -> float:
        """Average stored bits per cached K/V element for one sequence of ``context`` tokens."""
        elems = 2 * n_layers * n_kv_heads * head_dim * context
        return self.stored_bits(n_layers, n_kv_heads, head_dim, context) / elems
