"""The transformers ``Cache`` of the integration: :class:`PackedCache`, one :class:`PackedLayer` per
decoder layer (see :mod:`gpu_ref.hf`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sim_models import CachePolicy, KeyTables
from sim_models.keyscale import LOG2_S_RANGE
from sim_models.policy import fit_format

from .. import backend as _backend

from .attention import _pending
from .stores import _CudaStore, _GoldenStore, _torch

BACKENDS = ("cuda", "golden")


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def model_shape(config):
    """(layers, q heads, kv heads, head_dim) of a transformers decoder config."""
    cfg = _text_config(config)
    hq = cfg.num_attention_heads
    kvh = getattr(cfg, "num_key_value_heads", None) or hq
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
    return cfg.num_hidden_layers, hq, kvh, d


def layer_windows(config) -> list:
    """Per decoder layer, the sliding window (tokens a query sees, itself included, as transformers'
    ``sliding_window_overlay`` defines it: key ``j`` is visible from query ``i`` when ``i - W < j <= i``)
    or None for a full-attention layer. ``layer_types`` decides where the config has it (Gemma 3,
    Qwen2); a config without it and with ``sliding_window`` set (Mistral) slides on every layer.

    Raises:
        ValueError: a layer type other than full or sliding attention, or a window that is not a
            positive int.
    """
    cfg = _text_config(config)
    n = cfg.num_hidden_layers
    w = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types is None:
        use = getattr(cfg, "use_sliding_window", True)
        types = ["sliding_attention" if (w is not None and use) else "full_attention"] * n
    bad = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
    if bad:
        raise ValueError(f"config.layer_types: {bad} are not served (PackedCache holds full and sliding-window "
                         f"attention layers)")
    if "sliding_attention" in types and (isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1):
        raise ValueError(f"config.sliding_window must be a positive int for sliding_attention layers, got {w!r}")
    return [int(w) if t == "sliding_attention" else None for t in types[:n]]


try:
    from transformers.cache_utils import Cache, CacheLayerMixin
except ImportError:  # pragma: no cover - transformers is optional for the rest of gpu_ref
    Cache = CacheLayerMixin = object


class PackedLayer(CacheLayerMixin):
    """One decoder layer's K/V (see :mod:`gpu_ref.hf`).

    Args:
        layer_idx: decoder layer index.
        k_fmt, v_fmt: FormatParams (n = head_dim, dtype = the cache's 16-bit type) or None (16-bit).
        sinks: leading tokens kept 16-bit.
        mu: None or float16 ``[KVH, D]`` centering vectors (unscaled; the key front end,
            FORMAT.md 8, stores ``RNE(RN16(k s) - RN16(mu s))``).
        key_scale: None or float16 ``[KVH, D]`` per-channel key scales (powers of two).
        batch_size, capacity, num_heads, num_kv_heads, head_dim: the shapes.
        backend: ``"cuda"`` or ``"golden"``.
        window: None (full attention) or the sliding window W of this layer: the layer keeps the
            last W tokens only (a ring of W rows; no sinks, whatever ``sinks`` says) and a query
            attends to exactly those (transformers' sliding-window mask: itself and the W - 1
            tokens before it).
        recent: the policy's recent ring (:attr:`sim_models.CachePolicy.recent`): a query reads the
            ``recent`` most recent tokens in 16 bits (a sliding layer at most its window's).
    """

    is_compileable = False

    def __init__(self, layer_idx, k_fmt, v_fmt, sinks, mu, key_scale, batch_size, capacity,
                 num_heads, num_kv_heads, head_dim, backend, window=None, recent=0):
        super().__init__()
        self.window, self.recent = window, recent
        if window is not None:
            sinks = 0          # the model never sees tokens outside the window (docs/GPU.md, Sliding windows)
        self.layer_idx, self.k_fmt, self.v_fmt, self.sinks = layer_idx, k_fmt, v_fmt, sinks
        self.mu, self.key_scale = mu, key_scale
        self.batch_size, self.capacity = batch_size, capacity
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.backend = backend
        self.packed = k_fmt is not None or v_fmt is not None
        self.length = 0
        self.store = None
        self.prefill = "exact"
        self.cache_dtype = None      # "fp16" / "bf16", or None: from the first K/V (lazy_initialization)
        self.num_splits = None       # split-KV factor of the kernels' launches (None: planned; PackedCache)
        self.last_chunk = 0          # tokens appended by the last update (read by the attention function)

    @property
    def is_sliding(self):
        return self.window is not None

    @property
    def rows(self):
        """Token rows the layer holds per sequence: the capacity, or the window of a sliding layer."""
        return self.capacity if self.window is None else min(self.capacity, self.window)

    # ---------------------------------------------------------------- transformers API
    def lazy_initialization(self, key_states, value_states):
        torch = _torch()
        self.model_dtype, self.device = key_states.dtype, key_states.device
        # the stored 16-bit type: the cache's dtype, else bf16 for bf16 models and fp16 otherwise;
        # decided here so that a layer updated on its own agrees with one updated through the cache
        kind = self.cache_dtype or ("bf16" if key_states.dtype == torch.bfloat16 else "fp16")
        self.dtype = torch.bfloat16 if kind == "bf16" else torch.float16
        for f in ("k_fmt", "v_fmt"):
            if getattr(self, f) is not None:
                setattr(self, f, dataclasses.replace(getattr(self, f), dtype=kind))
        b, h, d = self.batch_size, self.num_kv_heads, self.head_dim
        if self.packed:
            args = ((self.k_fmt, self.v_fmt), self.sinks, b, h, self.rows, d, self.dtype, self.device,
                    self.num_heads)
            front = {}
            if self.k_fmt is not None and (self.mu is not None or self.key_scale is not None):
                if kind != "fp16":                 # PackedCache picks fp16; a lone layer may not
                    raise ValueError(f"layer {self.layer_idx}: the key front end (centering / key scales) is "
                                     f"defined on fp16 keys (docs/FORMAT.md 8), got cache dtype {kind!r}")
                front = dict(mu16=self.mu, s16=self.key_scale)
            if self.backend == "cuda":
                if self.device.type != "cuda":
                    raise ValueError(f"backend 'cuda' needs CUDA tensors, got K/V on {self.device}")
                self.store = _CudaStore(*args, pow2_rows=self.prefill == "packed", ring=self.is_sliding,
                                        recent=self.recent, **front)
            else:
                self.store = _GoldenStore(*args, ring=self.is_sliding, recent=self.recent, **front)
        else:
            self.keys = torch.zeros(b, h, self.rows, d, dtype=self.dtype, device=self.device)
            self.values = torch.zeros_like(self.keys)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        b, h, t, d = key_states.shape
        if (b, h, d) != (self.batch_size, self.num_kv_heads, self.head_dim):
            raise ValueError(f"layer {self.layer_idx}: K/V of shape {list(key_states.shape)} do not match the "
                             f"cache [batch_size={self.batch_size}, kv_heads={self.num_kv_heads}, T, "
                             f"head_dim={self.head_dim}]")
        if self.length + t > self.capacity:
            raise ValueError(f"layer {self.layer_idx}: {self.length} + {t} tokens exceed capacity={self.capacity}")
        _pending.layer = self
        self.last_chunk = t
        if not self.packed:
            if self.is_sliding:
                return self._update_ring16(key_states, value_states)
            self.keys[:, :, self.length:self.length + t] = key_states
            self.values[:, :, self.length:self.length + t] = value_states
            self.length += t
            return (self.keys[:, :, :self.length].to(self.model_dtype),
                    self.values[:, :, :self.length].to(self.model_dtype))
        self.store.append(key_states.to(self.dtype), value_states.to(self.dtype))
        self.length += t
        return key_states, value_states

    def _update_ring16(self, key_states, value_states):
        """16-bit sliding layer: a ring of W rows; returns what SDPA attends to (the prefill chunk
        itself, or the ring's rows -- the window, in ring order -- for one token)."""
        torch = _torch()
        t, w, n = key_states.shape[2], self.rows, self.length
        if t > 1 and n:
            raise NotImplementedError(f"layer {self.layer_idx}: a {t}-token chunk after {n} cached tokens on a "
                                      "sliding-window layer is not supported; feed one token at a time")
        keep = min(t, w)
        rows = torch.arange(n + t - keep, n + t, device=key_states.device) % w
        self.keys[:, :, rows] = key_states[:, :, t - keep:].to(self.dtype)
        self.values[:, :, rows] = value_states[:, :, t - keep:].to(self.dtype)
        self.length += t
        if t > 1:
            return key_states, value_states
        m = min(self.length, w)
        return self.keys[:, :, :m].to(self.model_dtype), self.values[:, :, :m].to(self.model_dtype)

    def attend(self, query, scaling):
        """Decode attention of ``query`` ``[B, Hq, D]`` over the packed layer -> float32 ``[B, Hq, D]``."""
        if self.backend == "cuda":
            return self.store.attend(query.float(), scaling, self.num_splits)
        return self.store.attend(query.float(), scaling)

    def attend_chunk(self, query, scaling):
        """Causal attention of ``query`` ``[B, Hq, T, D]`` (the last T tokens) over the packed
        cache, every query seeing the tokens up to its own -> ``[B, T, Hq, D]`` (``prefill="packed"``:
        the golden model's fake-quant forward; with the kernels, one decode launch of B*T queries)."""
        q = query.float()
        if self.backend == "cuda":
            return self.store.attend_chunk(q, scaling, self.num_splits).to(query.dtype)
        return self.store.attend_chunk(q, scaling, self.window).to(query.dtype)

    def get_mask_sizes(self, query_length):
        return self.length + query_length, 0

    def get_seq_length(self):
        return self.length

    def get_max_length(self):
        return self.capacity

    def reset(self):
        self.length = 0
        self.is_initialized = False
        self.store = self.keys = self.values = None

    def reorder_cache(self, beam_idx):
        raise NotImplementedError("PackedCache does not support beam search")

    def crop(self, tokens_to_remove):
        raise NotImplementedError("PackedCache does not support cropping")

    def nbytes(self) -> int:
        """Bytes this layer holds on its device (packed planes, or the 16-bit K/V)."""
        if not self.is_initialized:
            return 0
        if self.packed:
            return self.store.nbytes()
        return self.keys.nbytes + self.values.nbytes


class PackedCache(Cache):
    """A transformers ``Cache`` keeping every layer's K/V in the packed format.

    Args:
        config: the model's transformers config (Llama / Qwen2 family).
        policy: :class:`sim_models.CachePolicy` or its spec string (:meth:`sim_models.CachePolicy.parse`).
        batch_size: sequences B (equal lengths).
        capacity: tokens per sequence (prompt + generated).
        tables: :class:`sim_models.KeyTables` of this model (``python -m sim_models.calibrate``
            writes them): mu and the key scales; needed by ``v3`` (centering and
            ``KS2``). Exclusive with ``mu`` / ``key_scales``.
        mu: float ``[layers, KVH, D]`` centering vectors; required when ``policy.center_keys``
            and no ``tables``.
        key_scales: float32 ``[layers, KVH, D]`` per-channel power-of-two key scales, or None.
        backend: ``"cuda"`` (the kernels) or ``"golden"`` (NumPy golden model).
        prefill: ``"exact"`` (multi-token chunks attend to their unquantized K/V) or ``"packed"``
            (every query of a chunk attends to the packed cache up to its own token: the
            fake-quant forward of bench.accuracy; with ``backend="cuda"`` one decode-kernel
            launch per layer and chunk, the planes' rows rounded up to a power of two).
        dtype: 16-bit type of the stored values, ``"fp16"`` or ``"bf16"`` (default: fp16 when keys
            pass the key front end, which FORMAT.md 8 defines on fp16 keys; else bf16 for bf16 models
            and fp16 otherwise, decided at the first update). K/V of a bf16 model outside fp16's
            range become +-inf in an fp16 cache (flagged by the format, FORMAT.md 3.1).
        num_splits: split-KV factor of every kernel launch (``backend="cuda"``), or None: the
            planner's choice per launch. Results depend on the split count only through the order
            of the fp32 sums; fixing it makes two caches of the same bytes give the same bits.

    Raises:
        ValueError: a parameter out of range (named), head_dim or a format the backend cannot
            serve, mu/key_scales of the wrong shape or not powers of two, centering without mu.
    """

    def __init__(self, config, policy, batch_size: int, capacity: int, mu=None, key_scales=None,
                 backend: str = "cuda", dtype: str | None = None, prefill: str = "exact",
                 tables: KeyTables | None = None, num_splits: int | None = None):
        if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, (int, np.integer))
                                       or num_splits < 1):
            raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
        if tables is not None:
            if not isinstance(tables, KeyTables):
                raise TypeError(f"tables must be a sim_models.KeyTables, got {type(tables).__name__}")
            if mu is not None or key_scales is not None:
                raise ValueError("pass either tables or mu / key_scales, not both")
            n_layers, _, kvh, d = model_shape(config)
            if tables.shape != (n_layers, kvh, d):
                raise ValueError(f"tables of model {tables.model_id!r} have shape {tables.shape} (layers, kv heads, "
                                 f"head_dim), the model has {(n_layers, kvh, d)}")
        if isinstance(policy, str):
            policy = CachePolicy.parse(policy)
        if tables is not None and isinstance(policy, CachePolicy):   # what the policy reads
            mu = tables.mu if policy.center_keys else None
            key_scales = tables.scales() if policy.key_scale else None
            if policy.key_scale and key_scales is None:
                raise ValueError(f"policy.key_scale {policy.key_scale!r} needs key scales; the tables of "
                                 f"{tables.model_id!r} have none (log2_s)")
        if not isinstance(policy, CachePolicy):
            raise TypeError(f"policy must be a CachePolicy or a spec string, got {type(policy).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        for name, v in (("batch_size", batch_size), ("capacity", capacity)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if prefill not in ("exact", "packed"):
            raise ValueError(f"prefill must be 'exact' or 'packed', got {prefill!r}")
        if dtype not in (None, "fp16", "bf16"):
            raise ValueError(f"dtype must be 'fp16', 'bf16' or None, got {dtype!r}")
        n_layers, hq, kvh, d = model_shape(config)
        windows = layer_windows(config)
        if backend == "cuda" and prefill == "packed" and any(w is not None for w in windows):
            raise ValueError("prefill='packed' with backend 'cuda' is not served on sliding-window layers (the ring "
                             "keeps only the last window of a chunk); use prefill='exact' or backend='golden'")
        self.windows = windows
        policy.check_layers(n_layers)
        want = (n_layers, kvh, d)
        arrays = {}
        for name, a in (("mu", mu), ("key_scales", key_scales)):
            if a is not None:
                a = np.asarray(a, np.float32)
                if a.shape != want:
                    raise ValueError(f"{name} must have shape [layers, kv_heads, head_dim] = {list(want)}, "
                                     f"got {list(a.shape)}")
                if not np.isfinite(a).all():
                    raise ValueError(f"{name} must be finite")
            arrays[name] = a
        if policy.center_keys and arrays["mu"] is None:
            raise ValueError("policy.center_keys needs mu (the calibration file's 'mu')")
        if policy.key_signs or policy.key_rot:
            raise ValueError("policy.key_signs / policy.key_rot (calibrated per-head transforms, docs/FORMAT.md 8) "
                             "are study options neither backend of this cache applies")
        if policy.key_scale == "fp16":
            raise ValueError("policy.key_scale 'fp16' is not served: key_scales must be powers of two ('pow2')")
        if policy.key_scale == "pow2" and arrays["key_scales"] is None:
            raise ValueError("policy.key_scale 'pow2' needs key_scales (the calibration file's 'key_scales')")
        ks = arrays["key_scales"]
        if ks is not None and (np.any(ks <= 0) or np.any(np.frexp(ks)[0] != 0.5)):
            raise ValueError("key_scales must be positive powers of two (the reparametrization is exact)")
        if ks is not None:
            lo, hi = LOG2_S_RANGE if backend == "golden" else _backend.CUDA.key_scale_log2
            e = np.log2(ks)
            if e.min() < lo or e.max() > hi:
                raise ValueError(f"key_scales must be 2^e with e in [{lo}, {hi}] for backend {backend!r}, got e in "
                                 f"[{e.min():.0f}, {e.max():.0f}]")
            if policy.key_scale is None:
                raise ValueError("key_scales given but the policy does not scale keys: add the KS2 term "
                                 "(e.g. K3V3+C+KS2) or use the v3 preset")
        self.policy, self.backend, self.n_seqs, self.capacity = policy, backend, int(batch_size), int(capacity)
        self.shape = dict(layers=n_layers, q_heads=hq, kv_heads=kvh, head_dim=d)
        front = any(policy.format_for(l, "k") is not None for l in range(n_layers)) and (
            (policy.center_keys and arrays["mu"] is not None) or ks is not None)
        if front:                 # the key front end is defined on fp16 keys (FORMAT.md 8)
            if dtype == "bf16":
                raise ValueError("dtype 'bf16' cannot hold a key front end (centering / key scales are defined on "
                                 "fp16 keys, docs/FORMAT.md 8): use dtype='fp16' or None")
            dtype = "fp16"
        fmt_dtype = dtype or "fp16"
        if backend == "cuda":
            _backend.check(policy, d, fmt_dtype, n_layers)
        layers = []
        for l in range(n_layers):
            kf = fit_format(policy.format_for(l, "k"), d, fmt_dtype)
            vf = fit_format(policy.format_for(l, "v"), d, fmt_dtype)
            for kind, f in (("k", kf), ("v", vf)):
                if f is not None and d % f.n:
                    raise ValueError(f"head_dim {d} is not a multiple of the {kind} format's n={f.n}")
            m = arrays["mu"][l].astype(np.float16) if (policy.center_keys and kf is not None) else None
            s = ks[l].astype(np.float16) if (ks is not None and kf is not None) else None
            layers.append(PackedLayer(l, kf, vf, policy.sinks, m, s, self.n_seqs, self.capacity,
                                      hq, kvh, d, backend, window=windows[l], recent=policy.recent))
            layers[-1].prefill = prefill
            layers[-1].cache_dtype = dtype
            layers[-1].num_splits = None if num_splits is None else int(num_splits)
        super().__init__(layers=layers)

    def nbytes(self) -> int:
        """Bytes the cache holds on its device (all layers)."""
        return sum(l.nbytes() for l in self.layers)

    def set_length(self, n: int):
        """Benchmarks only: declare that every sequence holds ``n`` tokens (whatever the planes hold:
        zeros after allocation); the layers must be initialized (one update done)."""
        if not 0 <= n <= self.capacity:
            raise ValueError(f"n must be in [0, capacity={self.capacity}], got {n}")
        for l in self.layers:
            if not l.is_initialized:
                raise ValueError("set_length needs initialized layers (run one forward first)")
            l.length = n
            if l.packed:
                if isinstance(l.store, _CudaStore):
                    l.store.set_length(n)
                else:
                    l.store.length = n


