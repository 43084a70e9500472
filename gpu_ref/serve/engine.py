"""A continuous-batching engine over the packed cache (see :mod:`gpu_ref.serve`).

Requests join and leave between steps. Each running request owns one slot: a batch-1
:class:`gpu_ref.hf.PackedCache` (its store: golden or CUDA, the same classes ``gpu_ref.hf`` uses) sized to
the request's prompt + ``max_tokens``. The pool is a count of blocks: a block is ``block_size`` tokens of
K/V of every layer *in the policy's packed bytes* (sinks, 16-bit layers and sliding-window rings counted
at what they store), so a request reserves ``ceil(bytes of its cache / block bytes)`` blocks at admission
and gives them back when it finishes. A request that fits the pool but not its free blocks waits in the
queue (FIFO); one that could never fit is refused when submitted. A step is: admit and prefill the
waiting requests that fit (one exact prefill each, as ``gpu_ref.hf`` does), then one batched decode
forward over every running request (``[B, 1]`` tokens at each request's own position): each layer's
update appends every row to its request's store, and the ``fwht_kv`` attention function reads each
request's packed cache.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import queue
import threading

import numpy as np

from sim_models import CachePolicy, KeyTables
from sim_models.policy import fit_format

from ..hf import attention as _attn
from ..hf.cache import PackedCache, layer_windows, model_shape

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


def cache_bytes(config, policy: CachePolicy, tokens: int, dtype: str = "fp16") -> int:
    """Bytes a batch-1 :class:`PackedCache` of ``tokens`` tokens stores for ``config`` under ``policy``:
    per layer the packed vectors, sinks (fp16 rows) and 16-bit kinds; a sliding layer ``min(tokens, W)``
    rows, no sinks (flags excluded, as :meth:`PackedCache.nbytes` of the golden store)."""
    n_layers, _, kvh, d = model_shape(config)
    total = 0
    for layer, w in enumerate(layer_windows(config)):
        kf = fit_format(policy.format_for(layer, "k"), d, dtype)
        vf = fit_format(policy.format_for(layer, "v"), d, dtype)
        rows = tokens if w is None else min(tokens, w)
        one = CachePolicy(k=kf, v=vf, sinks=policy.sinks if w is None else 0)
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
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise RequestError("seed", f"seed must be an int, got {self.seed!r}")


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
        self.blocks = 0
        self.cache = None
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
    """One decoder layer of the engine's batch: routes row ``b`` of a step's K/V to the packed layer of
    the request in row ``b`` and attends each query over its request's cache. Seen by the ``fwht_kv``
    attention function as a packed layer (``_pending.layer``)."""

    is_compileable = False

    def __init__(self, engine_cache, layer_idx, window):
        super().__init__()
        self.owner, self.layer_idx, self.window = engine_cache, layer_idx, window
        self.packed, self.prefill = True, "exact"
        self.is_initialized = True
        self.length = self.last_chunk = 0

    @property
    def is_sliding(self):
        return self.window is not None

    def _rows(self):
        return [r.cache.layers[self.layer_idx] for r in self.owner.batch]

    def update(self, key_states, value_states, *args, **kwargs):
        rows = self._rows()
        if key_states.shape[0] != len(rows):
            raise RuntimeError(f"layer {self.layer_idx}: {key_states.shape[0]} K/V rows for {len(rows)} requests")
        t = key_states.shape[2]
        self._kv = []
        for b, layer in enumerate(rows):
            self._kv.append(layer.update(key_states[b:b + 1], value_states[b:b + 1]))
        _attn._pending.layer = self
        self.last_chunk = t
        self.length = rows[0].length if len(rows) == 1 else t       # decode: every row ends its chunk
        if len(rows) == 1:
            return self._kv[0]
        return key_states, value_states

    def attend(self, query, scaling):
        """query ``[B, Hq, D]`` -> float32 ``[B, Hq, D]``: row b over its request's cache."""
        torch = _torch()
        out = []
        for b, (layer, kv) in enumerate(zip(self._rows(), self._kv)):
            q = query[b:b + 1]
            if layer.packed:
                out.append(layer.attend(q, scaling).float())
            else:                                       # a 16-bit layer: SDPA over what its update returned
                k, v = kv
                rep = q.shape[1] // k.shape[1]
                k, v = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
                o = torch.nn.functional.scaled_dot_product_attention(q.float()[:, :, None], k, v, scale=scaling)
                out.append(o[:, :, 0])
        return torch.cat(out, 0)

    def attend_chunk(self, query, scaling):
        raise NotImplementedError("the engine prefills with prefill='exact'")

    def get_mask_sizes(self, query_length):
        rows = self._rows()
        past = rows[0].length if len(rows) == 1 else 0
        return past + query_length, 0

    def get_seq_length(self):
        rows = self._rows()
        return rows[0].length if len(rows) == 1 else 0

    def get_max_length(self):
        return -1

    def lazy_initialization(self, key_states, value_states):
        pass

    def reset(self):
        pass


class _EngineCache(Cache):
    """The transformers ``Cache`` the engine passes to the model: ``batch`` is the list of requests of the
    current forward, in row order."""

    def __init__(self, config):
        self.batch: list[Request] = []
        super().__init__(layers=[_EngineLayer(self, i, w) for i, w in enumerate(layer_windows(config))])


class Engine:
    """Continuous batching over per-request packed caches (see the module docstring).

    Args:
        model: a transformers causal LM switched to ``fwht_kv`` (:func:`gpu_ref.hf.enable`; done here).
        policy: :class:`sim_models.CachePolicy` or its spec string.
        tables: the model's :class:`sim_models.KeyTables` (policies with centering / key scales).
        backend: ``"golden"`` or ``"cuda"`` (the store of every request's cache).
        block_size: tokens per block (the allocation unit of the pool).
        num_blocks: blocks in the pool; or ``pool_bytes``: the pool's bytes, divided by the packed bytes
            of one block.
        max_batch: requests decoded together at most (slots).
        max_queue: waiting requests at most; beyond it :meth:`submit` raises :class:`PoolFull`.
        max_context: prompt + max_tokens bound of one request (default: the model's
            ``max_position_embeddings``).

    Raises:
        ValueError: a parameter out of range (named), a policy the backend cannot serve.
    """

    def __init__(self, model, policy, *, tables: KeyTables | None = None, backend: str = "golden",
                 block_size: int = 16, num_blocks: int | None = None, pool_bytes: int | None = None,
                 max_batch: int = 8, max_queue: int = 64, max_context: int | None = None, dtype: str | None = None):
        from .. import hf
        for name, v in (("block_size", block_size), ("max_batch", max_batch), ("max_queue", max_queue)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if (num_blocks is None) == (pool_bytes is None):
            raise ValueError("pass exactly one of num_blocks and pool_bytes")
        self.policy = CachePolicy.parse(policy) if isinstance(policy, str) else policy
        self.model, self.tables, self.backend, self.dtype = model, tables, backend, dtype
        self.config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        hf.enable(model)
        # checks the policy, tables and backend once, as every request's cache will
        PackedCache(model.config, self.policy, 1, block_size, tables=tables, backend=backend, dtype=dtype)
        front = self.policy.center_keys or self.policy.key_scale
        self.cache_dtype = dtype or ("fp16" if front else ("bf16" if model.dtype == _torch().bfloat16 else "fp16"))
        self.block_size = block_size
        # a block: block_size tokens of every full-attention layer (past the sinks), in packed bytes; a model
        # of sliding layers only grows no further than its windows: a block is then block_size tokens of it
        big = max(block_size, self.policy.sinks) + max((w or 0) for w in layer_windows(self.config))
        self.block_bytes = (self._bytes(big + block_size) - self._bytes(big)) or self._bytes(block_size)
        if num_blocks is None:
            if isinstance(pool_bytes, bool) or not isinstance(pool_bytes, int) or pool_bytes < 1:
                raise ValueError(f"pool_bytes must be an int >= 1, got {pool_bytes!r}")
            num_blocks = pool_bytes // self.block_bytes
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1 (pool_bytes too small for one block of "
                             f"{self.block_bytes} bytes?), got {num_blocks!r}")
        self.num_blocks, self.free_blocks = num_blocks, num_blocks
        self.max_batch, self.max_queue = max_batch, max_queue
        mpe = getattr(self.config, "max_position_embeddings", None)
        self.max_context = int(max_context or mpe or 1 << 20)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._cache = _EngineCache(model.config)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self._stop = False
        self.steps = 0

    # ------------------------------------------------------------------ accounting
    def _bytes(self, tokens):
        """Bytes of one request's cache of ``tokens`` tokens."""
        return cache_bytes(self.config, self.policy, tokens, self.cache_dtype)

    def blocks_for(self, tokens: int) -> int:
        """Blocks a request of ``tokens`` tokens (prompt + max_tokens) reserves."""
        return -(-self._bytes(tokens) // self.block_bytes)

    @property
    def capacity_tokens(self) -> int:
        """The longest request (prompt + max_tokens) the whole pool can hold."""
        lo, hi = 1, self.num_blocks * self.block_size + 1
        if self.blocks_for(1) > self.num_blocks:
            return 0
        while lo < hi:                                   # blocks_for is monotone in tokens
            mid = (lo + hi + 1) // 2
            if self.blocks_for(mid) <= self.num_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def stats(self) -> dict:
        return dict(num_blocks=self.num_blocks, free_blocks=self.free_blocks, block_size=self.block_size,
                    block_bytes=self.block_bytes, running=len(self.running), waiting=len(self.waiting),
                    policy=self.policy.spec, backend=self.backend, steps=self.steps)

    # ------------------------------------------------------------------ requests
    def submit(self, prompt_ids, params: SamplingParams | None = None) -> Request:
        """Queue a request; returns it (its ``events`` queue receives the tokens).

        Raises:
            RequestError: an empty prompt, bad sampling parameters, prompt + max_tokens over the model's
                context or over what the whole pool holds (``param`` names which).
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
        if r.tokens > self.max_context:
            raise RequestError("max_tokens", f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) = "
                                             f"{r.tokens} exceeds the model's context of {self.max_context} tokens")
        r.blocks = self.blocks_for(r.tokens)
        if r.blocks > self.num_blocks:
            raise RequestError("max_tokens", f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) = "
                                             f"{r.tokens} tokens need {r.blocks} blocks; the pool has "
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
        probs = torch.softmax(logits.float().cpu() / p.temperature, -1)
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
        self.free_blocks += r.blocks
        r.cache = None
        r._emit("done", r.finish_reason)

    def _forward(self, batch, ids, pos):
        from ..hf import cache_kwargs
        self._cache.batch = batch
        try:
            out = self.model(input_ids=ids, position_ids=pos, **cache_kwargs(self.model, self._cache), use_cache=True,
                             logits_to_keep=1)
        finally:
            self._cache.batch = []
        return out.logits[:, -1]

    def step(self) -> bool:
        """One engine step (admit + prefill, then one batched decode). Returns whether work remains."""
        torch = _torch()
        dev = self.model.device
        with torch.no_grad():
            with self._lock:
                for r in [r for r in self.running if r.cancelled and r.finish_reason is None]:
                    r.finish_reason = "cancelled"
                    self._release(r)
                admitted = []
                while self.waiting and len(self.running) + len(admitted) < self.max_batch and \
                        self.waiting[0].blocks <= self.free_blocks:
                    r = self.waiting.pop(0)
                    self.free_blocks -= r.blocks
                    admitted.append(r)
            for r in admitted:
                r.cache = PackedCache(self.model.config, self.policy, 1, r.tokens, tables=self.tables,
                                      backend=self.backend, dtype=self.dtype)
                self.running.append(r)
                try:
                    ids = torch.tensor([r.prompt], device=dev)
                    logits = self._forward([r], ids, torch.arange(len(r.prompt), device=dev)[None])
                    if self._accept(r, self._sample(r, logits[0])):
                        self._release(r)
                except Exception as err:                 # one bad request never stops the others
                    r.finish_reason = "error"
                    self._release(r)
                    r._emit("error", f"{type(err).__name__}: {err}")
            batch = [r for r in self.running if r.finish_reason is None and not r.cancelled and r.output]
            batch = batch[:self.max_batch]
            if batch:
                ids = torch.tensor([[r.output[-1]] for r in batch], device=dev)
                pos = torch.tensor([[len(r.prompt) + len(r.output) - 1] for r in batch], device=dev)
                try:
                    logits = self._forward(batch, ids, pos)
                except Exception as err:
                    for r in batch:
                        r.finish_reason = "error"
                        self._release(r)
                        r._emit("error", f"{type(err).__name__}: {err}")
                    raise
                for r, lg in zip(batch, logits):
                    if self._accept(r, self._sample(r, lg)):
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
                except Exception:                       # reported to the requests of the failed step
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
