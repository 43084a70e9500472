"""A continuous-batching engine over the packed cache (see :mod:`gpu_ref.serve`).

Requests join and leave between steps. The K/V of every running request live in one paged pool per
layer (:mod:`gpu_ref.serve.paged`): a block is one page of ``block_size`` packed tokens in every
full-attention layer, sized in the policy's packed bytes; each running request owns a slot (a block-table
row, its sink rows and its sliding-window rings) and the blocks of prompt + ``max_tokens`` past the sinks,
reserved at admission (so a running request never runs out of cache) and given back when it finishes. A
request that fits the pool but not its free blocks waits in the queue (FIFO); one that could never fit is
refused when submitted. Prompts sharing whole blocks share them (reference counts; full prompt blocks are
immutable). A step is: a prefill forward of every request still prefilling (one chunk each with
``prefill_chunk``), then of the requests admitted now, then one batched decode forward over every other
running request (``[B, 1]`` tokens at each request's own position): each layer writes every row into its
pool and attends the whole batch in one call (one kernel launch with the ``"cuda"`` store). Under tensor
parallelism (:mod:`gpu_ref.serve.tp`) each rank's pools hold its KV heads only and the ranks agree on
every sampled token.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import queue
import sys
import threading
import traceback

import numpy as np

from sim_models import CachePolicy, KeyTables
from sim_models.policy import fit_format

from ..hf import attention as _attn
from ..hf.cache import PackedCache, layer_windows, model_shape
from . import paged as _paged
from . import tp as _tp

try:
    from transformers.cache_utils import Cache, CacheLayerMixin
except ImportError:  # pragma: no cover - transformers is optional for the rest of gpu_ref
    Cache = CacheLayerMixin = object


def _torch():
    import torch
    return torch


class RequestError(ValueError):
    """A request the engine refuses; ``param`` names the offending parameter."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class PoolFull(RuntimeError):
    """The block pool has no room now and the queue is full (retry later)."""


class ConfigError(ValueError):
    """An engine parameter out of range; ``param`` names it (the CLI maps it to its option)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def cache_bytes(config, policy: CachePolicy, tokens: int, dtype: str = "fp16", kv_heads: int | None = None) -> int:
    """Bytes a batch-1 :class:`PackedCache` of ``tokens`` tokens stores for ``config`` under ``policy``:
    per layer the packed vectors, sinks (fp16 rows) and 16-bit kinds; a sliding layer ``min(tokens, W)``
    rows, no sinks (flags excluded, as :meth:`PackedCache.nbytes` of the golden store). ``kv_heads``:
    the KV heads counted (a tensor-parallel rank's; default the model's)."""
    n_layers, _, kvh, d = model_shape(config)
    kvh = kvh if kv_heads is None else kv_heads
    total = 0
    for layer, w in enumerate(layer_windows(config)):
        kf = fit_format(policy.format_for(layer, "k"), d, dtype)
        vf = fit_format(policy.format_for(layer, "v"), d, dtype)
        rows = tokens if w is None else min(tokens, w)
        # a sliding layer's recent ring replaces codes (W - r packed rows), a full layer's is beside them
        one = (CachePolicy(k=kf, v=vf, sinks=policy.sinks, recent=policy.recent) if w is None
               else CachePolicy(k=kf, v=vf, sinks=min(policy.recent, w)))
        total += one.stored_bits(1, kvh, d, max(rows, 1)) // 8
    return total


@dataclasses.dataclass
class SamplingParams:
    """Per request: ``max_tokens`` new tokens at most; ``temperature`` 0 is greedy; ``top_p`` nucleus
    sampling; ``seed`` of the request's sampler; ``stop_token_ids`` end the request (the tokenizer's
    EOS is added by the server)."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple = ()

    def check(self):
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise RequestError("max_tokens", f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or \
                not 0 <= self.temperature <= 100 or math.isnan(self.temperature):
            raise RequestError("temperature", f"temperature must be a number in [0, 100], got {self.temperature!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise RequestError("top_p", f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not -2**63 <= self.seed < 2**64):
            raise RequestError("seed", f"seed must be an int in [-2^63, 2^64), got {self.seed!r}")


class Request:
    """One request: prompt token ids, its sampling parameters, the generated ids and an event queue
    (``("token", id)`` per token, then ``("done", finish_reason)`` with ``"stop"`` or ``"length"``, or
    ``("error", message)``)."""

    _ids = itertools.count()

    def __init__(self, prompt_ids, params: SamplingParams):
        self.id = next(self._ids)
        self.prompt = [int(t) for t in prompt_ids]
        self.params = params
        self.output: list[int] = []
        self.events: queue.Queue = queue.Queue()
        self.finish_reason = None
        self.cancelled = False
        self.nblocks = 0          # blocks reserved for prompt + max_tokens
        self.slot = None
        self.shared = 0           # leading blocks shared with other requests
        self.filled = 0           # prompt tokens prefilled
        self.segments: list = []  # prefill forwards still to run
        self.keys: list = []
        self.registered = 0
        self.rng = None
        self.done = threading.Event()

    @property
    def tokens(self):
        return len(self.prompt) + self.params.max_tokens

    def _emit(self, kind, value):
        self.events.put((kind, value))
        if kind != "token":
            self.done.set()


class _EngineLayer(CacheLayerMixin):
    """One decoder layer of the engine's forward: writes the forward's K/V rows into the layer's paged
    store (:mod:`gpu_ref.serve.paged`) and attends every query of the batch in one call. Seen by the
    ``fwht_kv`` attention function as a packed layer (``_pending.layer``)."""

    is_compileable = False

    def __init__(self, engine_cache, layer_idx, window, store, prefill, unpacked):
        super().__init__()
        self.owner, self.layer_idx, self.window, self.store = engine_cache, layer_idx, window, store
        self.packed, self.prefill, self.unpacked = True, prefill, unpacked
        self.is_initialized = True
        self.length = self.last_chunk = 0

    @property
    def is_sliding(self):
        return self.window is not None

    def _rows(self):
        return self.owner.rows("full" if self.window is None else ("ring", self.window))

    def update(self, key_states, value_states, *args, **kwargs):
        rows = self._rows()
        if key_states.shape[0] != len(rows.slots):
            raise RuntimeError(f"layer {self.layer_idx}: {key_states.shape[0]} K/V rows for {len(rows.slots)} "
                               "requests")
        dt = self.owner.dtype
        k16, v16 = key_states.to(dt), value_states.to(dt)
        self.store.write(k16, v16, rows)
        _attn._pending.layer = self
        self.last_chunk = self.length = key_states.shape[2]     # exact prefill: the chunk is the whole prompt
        if self.unpacked:                                       # a 16-bit layer attends to the 16-bit values
            return k16.to(key_states.dtype), v16.to(value_states.dtype)
        return key_states, value_states

    def attend(self, query, scaling):
        """query ``[B, Hq, D]`` -> float32 ``[B, Hq, D]``: one call for the batch (one kernel launch)."""
        return self.store.attend(query.float(), scaling, self._rows())

    def attend_chunk(self, query, scaling):
        return self.store.attend_chunk(query.float(), scaling, self._rows()).to(query.dtype)

    def get_mask_sizes(self, query_length):
        return self.owner.past + query_length, 0

    def get_seq_length(self):
        return self.owner.past

    def get_max_length(self):
        return -1

    def lazy_initialization(self, key_states, value_states):
        pass

    def reset(self):
        pass


class _EngineCache(Cache):
    """The transformers ``Cache`` the engine passes to the model: ``items`` are the rows of the current
    forward, ``(slot, t0, T, skip)`` (:func:`gpu_ref.serve.paged.full_rows`), ``past`` the cached tokens
    before a one-row forward (0 for a batched decode, whose mask is not used)."""

    def __init__(self, engine, layers):
        self.engine = engine
        self.items, self.past, self._rows = [], 0, {}
        self.dtype = engine._torch_dtype
        super().__init__(layers=layers)

    def set(self, items, past):
        self.items, self.past, self._rows = items, past, {}

    def rows(self, kind):
        r = self._rows.get(kind)
        if r is None:
            e = self.engine
            if kind == "full":
                r = _paged.full_rows(self.items, e.sinks, e.block_size, e._tables, e.policy.recent)
            else:
                r = _paged.ring_rows(self.items, kind[1])
            self._rows[kind] = r
        return r


class Engine:
    """Continuous batching over one shared paged pool per layer (see the module docstring).

    Args:
        model: a transformers causal LM switched to ``fwht_kv`` (:func:`gpu_ref.hf.enable`; done here).
        policy: :class:`sim_models.CachePolicy` or its spec string.
        tables: the model's :class:`sim_models.KeyTables` (policies with centering / key scales).
        backend: ``"golden"`` or ``"cuda"`` (the paged store of every packed layer; 16-bit layers keep
            their values in a paged torch store on the model's device: ``"cuda"`` in the 16-bit type,
            :class:`gpu_ref.serve.paged.Paged16Store`).
        block_size: tokens per block (a page of every full-attention layer; ``"cuda"``: 16, 32 or a
            power-of-two multiple of 64).
        num_blocks: blocks in the pool; or ``pool_bytes``: the pool's bytes, divided by the packed bytes
            of one block.
        max_batch: requests running together at most (slots: each has a block-table row, sink rows and
            sliding-window rings).
        max_queue: waiting requests at most; beyond it :meth:`submit` raises :class:`PoolFull`.
        max_context: prompt + max_tokens bound of one request (default: the model's
            ``max_position_embeddings``).
        prefill: ``"exact"`` (the prompt attends to its unquantized K/V in one forward, as ``gpu_ref.hf``
            does by default) or ``"packed"`` (every prompt query attends to the packed cache up to its
            own token, ``gpu_ref.hf`` ``prefill="packed"``; what chunked prefill and skipping the shared
            prefix's forward need; full-attention models).
        prefill_chunk: with ``prefill="packed"``, prompt tokens per chunk (one chunk per request and
            step, interleaved with the others' decode); None: the whole prompt in one step.
        prefix_sharing: requests whose prompts share whole blocks reuse those blocks (reference counts).
        num_splits: split-KV factor of every decode launch (``backend="cuda"``), or None: planned per
            launch. It changes only the order of the fp32 sums; fixed, the engine gives the bits of a
            ``gpu_ref.hf.PackedCache`` with the same ``num_splits``.

    Raises:
        ConfigError: a parameter out of range (``param`` names it; a ValueError).
        ValueError: a policy the backend cannot serve, tables that do not fit the model.
    """

    def __init__(self, model, policy, *, tables: KeyTables | None = None, backend: str = "golden",
                 block_size: int = 16, num_blocks: int | None = None, pool_bytes: int | None = None,
                 max_batch: int = 8, max_queue: int = 64, max_context: int | None = None, dtype: str | None = None,
                 prefill: str = "exact", prefill_chunk: int | None = None, prefix_sharing: bool = True,
                 num_splits: int | None = None):
        from .. import hf
        torch = _torch()
        for name, v in (("block_size", block_size), ("max_batch", max_batch), ("max_queue", max_queue)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(name, f"{name} must be an int >= 1, got {v!r}")
        if (num_blocks is None) == (pool_bytes is None):
            raise ValueError("pass exactly one of num_blocks and pool_bytes")
        if prefill not in ("exact", "packed"):
            raise ValueError(f"prefill must be 'exact' or 'packed', got {prefill!r}")
        if prefill_chunk is not None:
            if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
                raise ValueError(f"prefill_chunk must be an int >= 1 or None, got {prefill_chunk!r}")
            if prefill != "packed":
                raise ValueError("prefill_chunk needs prefill='packed' (with exact prefill a later chunk would attend "
                                 "to the packed earlier chunks, which single-batch exact prefill never does)")
        self.policy = CachePolicy.parse(policy) if isinstance(policy, str) else policy
        self.shard = _tp.shard_of(model)                  # this rank's KV heads (all of them on one rank)
        self.model, self.tables, self.backend, self.dtype = model, tables, backend, dtype
        self.config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        windows = layer_windows(self.config)
        if prefill == "packed" and any(w is not None for w in windows):
            raise ValueError("prefill='packed' (and prefill_chunk) serve full-attention models; this model has "
                             "sliding-window layers: use prefill='exact'")
        if backend == "cuda":
            from .. import backend as _backend
            if not _backend.CUDA.page_size_ok(block_size):
                raise ConfigError("block_size", f"block_size must be 16, 32 or a power-of-two multiple of 64 for "
                                                f"backend 'cuda' (a page of the kernels' pool), got {block_size}")
        hf.enable(model)
        # checks the policy, tables, backend and num_splits once; its layers give each layer's formats and
        # key tables
        ref = PackedCache(model.config, self.policy, 1, block_size, tables=tables, backend=backend, dtype=dtype,
                          num_splits=num_splits)
        self.num_splits = num_splits
        front = self.policy.center_keys or self.policy.key_scale
        self.cache_dtype = dtype or ("fp16" if front else ("bf16" if model.dtype == torch.bfloat16 else "fp16"))
        self._torch_dtype = torch.bfloat16 if self.cache_dtype == "bf16" else torch.float16
        self.block_size, self.prefill, self.prefill_chunk = block_size, prefill, prefill_chunk
        self.prefix_sharing = bool(prefix_sharing)
        self.windows = windows
        self.sinks = self.policy.sinks
        self.has_pool = any(w is None for w in windows)
        # a block: block_size tokens of every full-attention layer (past the sinks), in packed bytes; a model
        # of sliding layers only grows no further than its windows: a block is then block_size tokens of it
        big = max(block_size, self.policy.sinks + self.policy.recent) + max((w or 0) for w in windows)
        self.block_bytes = (self._bytes(big + block_size) - self._bytes(big)) or self._bytes(block_size)
        if num_blocks is None:
            if isinstance(pool_bytes, bool) or not isinstance(pool_bytes, int) or pool_bytes < 1:
                raise ConfigError("pool_bytes", f"pool_bytes must be an int >= 1, got {pool_bytes!r}")
            if pool_bytes < self.block_bytes:
                raise ConfigError("pool_bytes", f"pool_bytes {pool_bytes} holds no block: one block of {block_size} "
                                                f"tokens is {self.block_bytes} bytes under policy {self.policy.spec}")
            num_blocks = pool_bytes // self.block_bytes
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ConfigError("num_blocks", f"num_blocks must be an int >= 1, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.allocator = _paged.BlockAllocator(num_blocks)
        self.max_batch, self.max_queue = max_batch, max_queue
        mpe = getattr(self.config, "max_position_embeddings", None)
        self.max_context = int(max_context or mpe or 1 << 20)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._slots = list(range(max_batch - 1, -1, -1))
        self._tables: dict = {}                          # slot -> its block list (the block-table row)
        self.stores = [self._store(l, ref.layers[l], w) for l, w in enumerate(windows)]
        self._cache = _EngineCache(self, [_EngineLayer(None, l, w, st, prefill, ref.layers[l].k_fmt is None and
                                                       ref.layers[l].v_fmt is None)
                                          for l, (w, st) in enumerate(zip(windows, self.stores))])
        for layer in self._cache.layers:
            layer.owner = self._cache
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self._stop = False
        self.steps = 0                                   # steps that did work (idle polls are not counted)
        self.max_running = 0                             # the most requests running together so far

    def _store(self, idx, ref, window):
        """The paged store of layer ``idx`` (``ref``: the layer of a batch-1 PackedCache, for its formats)."""
        fmts = tuple(None if f is None else dataclasses.replace(f, dtype=self.cache_dtype)
                     for f in (ref.k_fmt, ref.v_fmt))
        _, _, _, d = model_shape(self.config)
        hq, kvh, heads = self.shard.q_heads, self.shard.local_kv_heads, list(self.shard.heads)
        front = {}
        if fmts[0] is not None and (ref.mu is not None or ref.key_scale is not None):    # this rank's heads
            front = dict(mu16=None if ref.mu is None else ref.mu[heads],
                         s16=None if ref.key_scale is None else ref.key_scale[heads])
        dev = self.model.device
        if window is None:
            pages, page, sinks = self.num_blocks, self.block_size, self.sinks
        else:                                         # a ring of W rows per slot, no sinks
            pages, page, sinks = self.max_batch, window, 0
        if self.backend == "cuda" and fmts != (None, None):
            if dev.type != "cuda":
                raise ValueError(f"backend 'cuda' needs a model on a CUDA device, got {dev}")
            if window is not None:                    # the kernels' page sizes: 16, 32, 64 * 2^k
                page = max(16, 1 << (window - 1).bit_length())
            return _paged.CudaPagedStore(fmts, sinks, self.max_batch, kvh, d, self._torch_dtype, dev, pages, page,
                                         hq, num_splits=self.num_splits, recent=self.policy.recent, window=window,
                                         packed_prefill=self.prefill == "packed", **front)
        if self.backend == "cuda":                    # 16-bit layers: the 16-bit pool, torch SDPA
            return _paged.Paged16Store(sinks, self.max_batch, kvh, d, self._torch_dtype, dev, pages, page)
        return _paged.GoldenPagedStore(fmts, sinks, self.max_batch, kvh, d, self._torch_dtype, dev, pages, page,
                                       recent=self.policy.recent if fmts != (None, None) else 0, window=window,
                                       **front)

    # ------------------------------------------------------------------ accounting
    def _bytes(self, tokens):
        """Bytes of one request's cache of ``tokens`` tokens."""
        return cache_bytes(self.config, self.policy, tokens, self.cache_dtype, self.shard.local_kv_heads)

    def blocks_for(self, tokens: int) -> int:
        """Blocks a request of ``tokens`` tokens (prompt + max_tokens) reserves: pages of its packed
        tokens past the sinks (0 for a model of sliding layers only)."""
        if not self.has_pool:
            return 0
        return -(-max(tokens - self.sinks, 0) // self.block_size)

    @property
    def free_blocks(self) -> int:
        return self.allocator.free

    @property
    def capacity_tokens(self) -> int:
        """The longest request (prompt + max_tokens) the whole pool can hold."""
        if not self.has_pool:
            return self.max_context
        return self.num_blocks * self.block_size + self.sinks

    def stats(self) -> dict:
        return dict(num_blocks=self.num_blocks, free_blocks=self.free_blocks, shared_blocks=self.allocator.shared,
                    block_size=self.block_size, block_bytes=self.block_bytes, running=len(self.running),
                    waiting=len(self.waiting), max_running=self.max_running, policy=self.policy.spec,
                    backend=self.backend, prefill=self.prefill, prefill_chunk=self.prefill_chunk, steps=self.steps)

    # ------------------------------------------------------------------ requests
    def submit(self, prompt_ids, params: SamplingParams | None = None) -> Request:
        """Queue a request; returns it (its ``events`` queue receives the tokens).

        Raises:
            RequestError: an empty prompt, bad sampling parameters, prompt + max_tokens over the model's
                context or over what the whole pool holds (``param`` names which: ``prompt`` when the
                prompt and one new token are already over, else ``max_tokens``).
            PoolFull: the queue holds ``max_queue`` requests.
        """
        params = params or SamplingParams()
        params.check()
        prompt = list(prompt_ids)
        if not prompt:
            raise RequestError("prompt", "the prompt is empty")
        vocab = self.config.vocab_size
        if any((not isinstance(t, (int, np.integer))) or not 0 <= t < vocab for t in prompt):
            raise RequestError("prompt", f"prompt token ids must be ints in [0, {vocab})")
        r = Request(prompt, params)
        if len(prompt) >= self.max_context:             # no max_tokens >= 1 fits: the prompt is at fault
            raise RequestError("prompt", f"the prompt ({len(prompt)} tokens) leaves no room for a new token in the "
                                         f"model's context of {self.max_context} tokens")
        if self.blocks_for(len(prompt) + 1) > self.num_blocks:
            raise RequestError("prompt", f"the prompt ({len(prompt)} tokens) and one new token need "
                                         f"{self.blocks_for(len(prompt) + 1)} blocks; the pool has {self.num_blocks} "
                                         f"(at most {self.capacity_tokens} tokens per request)")
        if r.tokens > self.max_context:
            raise RequestError("max_tokens", f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) = "
                                             f"{r.tokens} exceeds the model's context of {self.max_context} tokens")
        r.nblocks = self.blocks_for(r.tokens)
        if r.nblocks > self.num_blocks:
            raise RequestError("max_tokens", f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) = "
                                             f"{r.tokens} tokens need {r.nblocks} blocks; the pool has "
                                             f"{self.num_blocks} (at most {self.capacity_tokens} tokens per request)")
        with self._lock:
            if len(self.waiting) >= self.max_queue:
                raise PoolFull(f"the queue is full ({self.max_queue} requests waiting)")
            self.waiting.append(r)
        self._wake.set()
        return r

    def cancel(self, r: Request):
        """Drop a request (waiting or running); its blocks return to the pool."""
        with self._lock:
            if r in self.waiting:
                self.waiting.remove(r)
                r.finish_reason = "cancelled"
                r._emit("done", "cancelled")
            else:
                r.cancelled = True                       # released by the engine thread at its next step

    # ------------------------------------------------------------------ stepping
    def _sample(self, r: Request, logits):
        torch = _torch()
        p = r.params
        if p.temperature == 0:
            return int(torch.argmax(logits))
        if r.rng is None:
            r.rng = torch.Generator(device="cpu").manual_seed(p.seed if p.seed is not None else r.id)
        lg = logits.double().cpu()
        probs = torch.softmax((lg - lg.max()) / p.temperature, -1)   # finite for any temperature > 0
        if p.top_p < 1:
            sp, idx = torch.sort(probs, descending=True)
            keep = torch.cumsum(sp, 0) - sp < p.top_p
            probs = torch.zeros_like(probs).scatter_(0, idx[keep], sp[keep])
        return int(torch.multinomial(probs, 1, generator=r.rng))

    def _accept(self, r: Request, tok: int) -> bool:
        """Record a sampled token; True when the request is finished."""
        r.output.append(tok)
        r._emit("token", tok)
        if tok in r.params.stop_token_ids:
            r.finish_reason = "stop"
        elif len(r.output) >= r.params.max_tokens:
            r.finish_reason = "length"
        return r.finish_reason is not None

    def _release(self, r: Request):
        self.running.remove(r)
        if r.slot is not None:
            self.allocator.release(self._tables.pop(r.slot))
            self._slots.append(r.slot)
            r.slot = None
        r._emit("done", r.finish_reason)

    @staticmethod
    def _log_failure(err: Exception, what: str):
        """An engine failure on stderr, the exception and its traceback (once per failure; the requests it
        ends get ``("error", message)`` events, which the server answers with 500 ``engine_error``)."""
        print(f"fwht-kv engine: {what} failed:", file=sys.stderr)
        traceback.print_exception(err, file=sys.stderr)

    def _fail(self, r: Request, err: Exception):
        r.finish_reason = "error"
        self._release(r)
        r._emit("error", f"{type(err).__name__}: {err}")

    def _forward(self, items, ids, pos, past):
        from ..hf import cache_kwargs
        self._cache.set(items, past)
        try:
            out = self.model(input_ids=ids, position_ids=pos, **cache_kwargs(self.model, self._cache), use_cache=True,
                             logits_to_keep=1)
        finally:
            self._cache.set([], 0)
        return out.logits[:, -1]

    # ------------------------------------------------------------------ blocks and prefill
    def _prefix_keys(self, r: Request) -> list:
        """Keys of the request's whole prompt blocks (:class:`gpu_ref.serve.paged.BlockAllocator`), each
        as a function of the parent block: computed as the blocks are known."""
        s, p = self.sinks, self.block_size
        return [tuple(r.prompt[:s + p]) if j == 0 else tuple(r.prompt[s + j * p:s + (j + 1) * p])
                for j in range(max(len(r.prompt) - s, 0) // p)]

    def _admit(self, r: Request) -> bool:
        """Give ``r`` a slot and its blocks (the shared prefix looked up first); False when they are not free."""
        if not self._slots:
            return False
        shared = []
        keys = self._prefix_keys(r) if self.prefix_sharing and self.has_pool else []
        # at least one prompt token is forwarded (the first output token's logits)
        usable = max(len(r.prompt) - 1 - self.sinks, 0) // self.block_size
        parent = -1
        for key in keys[:usable]:
            b = self.allocator.lookup((parent, key))
            if b is None:
                break
            shared.append(b)
            parent = b
        fresh = r.nblocks - len(shared)
        if fresh > self.allocator.free:
            self.allocator.release(shared)
            return False
        r.slot = self._slots.pop()
        self._tables[r.slot] = shared + self.allocator.alloc(fresh)
        r.shared, r.keys, r.registered = len(shared), keys, len(shared)
        r.filled = 0
        r.segments = self._segments(r)
        return True

    def _segments(self, r: Request) -> list:
        """The prompt's prefill forwards ``(t0, t1)``: exact prefill the whole prompt (shared blocks are
        recomputed, not written); packed prefill skips the shared blocks (their sinks and the recent ring's
        tokens before the first unshared one recomputed first, not written), in chunks of ``prefill_chunk``."""
        n = len(r.prompt)
        if self.prefill == "exact":
            return [(0, n)]
        skip = self.sinks + r.shared * self.block_size if r.shared else 0
        lo = max(self.sinks, skip - self.policy.recent) if r.shared else 0
        spans = ([(0, self.sinks)] if r.shared and self.sinks else []) + [(lo, n)]
        c = self.prefill_chunk or n
        return [(a, min(a + c, b)) for a, b in spans for a in range(a, b, c)]

    def _register(self, r: Request):
        """Enter the request's prompt blocks that its prefill has written into the prefix table."""
        table = self._tables[r.slot]
        while r.registered < len(r.keys) and self.sinks + (r.registered + 1) * self.block_size <= r.filled:
            j = r.registered
            self.allocator.register((table[j - 1] if j else -1, r.keys[j]), table[j])
            r.registered += 1

    def _prefill(self, r: Request):
        """The prefill forwards of ``r`` in this step (its next chunk with ``prefill_chunk``, else all of
        them); samples the first token after the last one."""
        self._prefill_one(r)
        while r.segments and self.prefill_chunk is None:
            self._prefill_one(r)

    def _prefill_one(self, r: Request):
        torch = _torch()
        dev = self.model.device
        t0, t1 = r.segments.pop(0)
        ids = torch.tensor([r.prompt[t0:t1]], device=dev)
        item = (r.slot, t0, t1 - t0, r.shared * self.block_size)
        logits = self._forward([item], ids, torch.arange(t0, t1, device=dev)[None], t0)
        r.filled = max(r.filled, t1)
        if self.prefix_sharing:
            self._register(r)
        if not r.segments:
            tok, = _tp.agree([self._sample(r, logits[0])], self.shard, dev)
            if self._accept(r, tok):
                self._release(r)

    def step(self) -> bool:
        """One engine step: a prefill forward of every request still prefilling (one chunk each), of every
        request admitted now, then one batched decode forward of every other running request. Returns
        whether work remains."""
        torch = _torch()
        dev = self.model.device
        with self._lock:
            if not self.running and not self.waiting:
                return False                             # idle: not a step
        with torch.no_grad():
            with self._lock:
                for r in [r for r in self.running if r.cancelled and r.finish_reason is None]:
                    r.finish_reason = "cancelled"
                    self._release(r)
            for r in [r for r in self.running if r.segments]:
                try:
                    self._prefill(r)
                except Exception as err:                 # one bad request never stops the others
                    self._log_failure(err, f"the prefill of request {r.id}")
                    self._fail(r, err)
            while True:
                with self._lock:
                    if not self.waiting or not self._admit(self.waiting[0]):
                        break
                    r = self.waiting.pop(0)
                    self.running.append(r)
                    self.max_running = max(self.max_running, len(self.running))
                try:
                    self._prefill(r)
                except Exception as err:
                    self._log_failure(err, f"the prefill of request {r.id}")
                    self._fail(r, err)
            batch = [r for r in self.running if r.finish_reason is None and not r.cancelled and not r.segments
                     and r.output]
            if batch:
                ids = torch.tensor([[r.output[-1]] for r in batch], device=dev)
                pos = [len(r.prompt) + len(r.output) - 1 for r in batch]
                items = [(r.slot, p, 1, 0) for r, p in zip(batch, pos)]
                try:
                    logits = self._forward(items, ids, torch.tensor(pos, device=dev)[:, None], 0)
                except Exception as err:
                    for r in batch:
                        self._fail(r, err)
                    raise                                # logged by the caller (the background loop)
                toks = _tp.agree([self._sample(r, lg) for r, lg in zip(batch, logits)], self.shard, dev)
                for r, tok in zip(batch, toks):
                    if self._accept(r, tok):
                        self._release(r)
            self.steps += 1
        with self._lock:
            return bool(self.running or self.waiting)

    def run_until_done(self, max_steps: int = 1 << 30):
        """Step until no request waits or runs (``max_steps`` bound)."""
        for _ in range(max_steps):
            if not self.step():
                return

    def generate(self, prompts, params: SamplingParams | list | None = None) -> list[list[int]]:
        """Submit every prompt, step until all are done, return the generated ids in prompt order."""
        ps = params if isinstance(params, list) else [params] * len(prompts)
        reqs = [self.submit(p, q) for p, q in zip(prompts, ps)]
        self.run_until_done()
        return [r.output for r in reqs]

    # ------------------------------------------------------------------ background loop
    def start(self):
        """Run :meth:`step` in a background thread while there is work (for the server)."""
        if self._thread is not None:
            return
        self._stop = False

        def loop():
            while not self._stop:
                busy = False
                try:
                    busy = self.step()
                except Exception as err:                # reported to the requests of the failed step
                    self._log_failure(err, "an engine step")
                    busy = True
                if not busy:
                    self._wake.wait(0.5)
                    self._wake.clear()
        self._thread = threading.Thread(target=loop, name="fwht-kv-engine", daemon=True)
        self._thread.start()

    def stop(self):
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
