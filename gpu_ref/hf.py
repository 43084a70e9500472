"""Hugging Face transformers integration: a KV cache that stores every layer in the packed format.

:class:`PackedCache` is a ``transformers.Cache`` (one :class:`PackedLayer` per decoder layer) and
:func:`enable` registers the attention function ``"fwht_kv"`` that reads it. Usage::

    from gpu_ref import hf
    hf.enable(model)                                   # model.config._attn_implementation = "fwht_kv"
    cache = hf.PackedCache(model.config, "v3", batch_size=1, capacity=4096,
                           tables=KeyTables.load("bench/calib/smollm2-135m.keytables.npz"))
    hf.generate(model, ids, cache, max_new_tokens=64)  # model.generate with the cache argument

What each step does (Llama and Qwen2 families; GQA of any ratio):

* ``update`` (called by the model with post-RoPE K/V ``[B, KVH, T, D]``): K and V are rounded to
  the cache's 16-bit type and appended with the write kernel, which applies the key front end of
  format version 3 to the keys (FORMAT.md 8: ``RNE(RN16(k s) - RN16(mu s))``, per-channel
  power-of-two scales ``s`` and centering vectors ``mu`` from the model's :class:`sim_models.KeyTables`).
  The first ``policy.sinks`` tokens of each sequence are kept 16-bit instead, keys in the same
  front-end domain (:class:`sim_models.CachePolicy`).
* prefill (a chunk of T > 1 tokens into an empty layer), ``prefill="exact"`` (default): attention
  uses the chunk's *unquantized* K/V (SDPA, causal), as serving engines do; only later tokens see
  the packed prompt. A multi-token chunk after cached tokens (chunked prefill) raises
  ``NotImplementedError``. ``prefill="packed"``: every query of the chunk attends to the packed
  cache up to its own token (the fake-quant forward of bench/accuracy.py; with the kernels one
  decode launch of B*T queries per layer, each query pointed at its sequence's planes with its
  own length).
* decode (T = 1): the token is appended first, then the query (``q / s``) attends over the packed
  cache with the fused decode kernel, the new token included: the same thing the golden model's
  fake-quant forward computes (bench/accuracy.py). The kernel takes q in the cache's 16-bit type.
* layers whose K and V formats are both ``None`` keep a preallocated 16-bit cache (the model's
  dtype, fp16 for fp32 models) and attend with SDPA: the baseline.

Backends (the store behind each packed layer): ``"cuda"`` (the kernels through gpu_ref's plan/run
API, CUDA tensors; :class:`_CudaStore` holds every call into gpu_ref) and ``"golden"`` (NumPy
golden model: ``sim_models.encode`` + ``decode_float`` at write time, SDPA over the
reconstructions; any device, any format; the reference of tests/test_hf.py). What the kernels
cannot serve (head_dim not in {64, 128, 256}, K/V bits outside {3, 4}, more than 64 sinks, one
of K/V 16-bit) raises ``ValueError`` naming the field at cache creation. The key front end runs
inside the write kernel (cuda) or through ``sim_models.keyscale.key_front`` (golden), and the
query side ``q / s`` inside the decode kernel (cuda) or before SDPA (golden); a cache with a front
end stores fp16. A decode step of the cuda
backend allocates nothing on the CuPy side and makes no host<->device copy, so a whole model
step can be captured in a CUDA graph (bench/hf_bench.py does, for timing).

Sequences of a batch have equal lengths (no padding: a padded attention mask is not applied in
decode).
"""

from __future__ import annotations

import dataclasses
import re
import threading

import numpy as np

from sim_models import CachePolicy, FormatParams, KeyTables, decode_float, encode
from sim_models.keyscale import LOG2_S_RANGE, front_table, key_front
from sim_models.policy import POLICY_PRESETS, fit_format

__all__ = ["ATTN_NAME", "PackedCache", "PackedLayer", "enable", "parse_policy", "policy_spec"]

ATTN_NAME = "fwht_kv"
BACKENDS = ("cuda", "golden")
_pending = threading.local()   # the layer whose update() ran last, read by the attention function


# ============================================================================ policy
_SPEC_RE = re.compile(r"^K(\d|16)V(\d|16)$")


def parse_policy(spec: str, base: FormatParams | None = None) -> CachePolicy:
    """Cache policy from a short spec: ``K<b>V<b>`` then optional ``+`` terms.

    Terms: ``C`` keys centered (needs mu), ``S<n>`` n fp16 sink tokens, ``KS2`` power-of-two
    per-channel key scales (needs key scales), ``K<b>@l,l,..`` keys of the listed layers at b bits
    (``V<b>@..`` for values). ``16`` as a width means unquantized (fp16/bf16). ``fp16`` alone is
    the unquantized cache; a preset name (``v2``, ``v3``, ``v3-K4V3``:
    :data:`sim_models.policy.POLICY_PRESETS`) alone is that policy (``v3`` = ``K3V3+C+S4+KS2``).
    Example: ``K3V3+C+S4+K4@0,1``.

    Args:
        spec: the spec string (case-insensitive).
        base: format of the other fields (default ``FormatParams()``; n is set per model).

    Returns:
        :class:`sim_models.CachePolicy`.

    Raises:
        ValueError: a malformed term (named in the message).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"policy spec must be a non-empty string, got {spec!r}")
    base = base or FormatParams()
    presets = {name.lower(): name for name in POLICY_PRESETS}
    if spec.strip().lower() in presets:
        return parse_policy(policy_spec(CachePolicy.preset(presets[spec.strip().lower()])), base)
    if spec.split("+")[0].strip().lower() in presets:
        raise ValueError(f"policy spec {spec!r}: a preset name ({', '.join(POLICY_PRESETS)}) stands alone; "
                         f"write the terms out instead (v3 = {policy_spec(CachePolicy.preset('v3'))})")
    terms = [t.strip().upper() for t in spec.split("+")]

    def fmt(bits: str):
        return None if bits == "16" else dataclasses.replace(base, bits=int(bits))

    if terms[0] == "FP16":
        k = v = None
    else:
        m = _SPEC_RE.match(terms[0])
        if not m:
            raise ValueError(f"policy spec {spec!r}: first term must be K<b>V<b> or fp16, got {terms[0]!r}")
        k, v = fmt(m.group(1)), fmt(m.group(2))
    sinks, centered, key_scale, layer_k, layer_v = 0, False, None, [], []
    for t in terms[1:]:
        if t == "C":
            centered = True
        elif t == "KS2":
            key_scale = "pow2"
        elif re.fullmatch(r"S\d+", t):
            sinks = int(t[1:])
        elif re.fullmatch(r"[KV](\d|16)@\d+(,\d+)*", t):
            bits, layers = t[1:].split("@")
            dest = layer_k if t[0] == "K" else layer_v
            dest.extend((int(l), fmt(bits)) for l in layers.split(","))
        else:
            raise ValueError(f"policy spec {spec!r}: unknown term {t!r} (C, S<n>, KS2, K<b>@layers, "
                             f"V<b>@layers)")
    return CachePolicy(k=k, v=v, sinks=sinks, center_keys=centered, layer_k=tuple(layer_k),
                       layer_v=tuple(layer_v), key_scale=key_scale)


def policy_spec(policy: CachePolicy) -> str:
    """Short name of a policy (inverse of :func:`parse_policy` for the fields it covers)."""
    w = lambda f: "16" if f is None else str(f.bits)  # noqa: E731
    s = f"K{w(policy.k)}V{w(policy.v)}"
    s += "+C" if policy.center_keys else ""
    s += f"+S{policy.sinks}" if policy.sinks else ""
    s += "+KS2" if policy.key_scale == "pow2" else ""
    for kind, over in (("K", policy.layer_k), ("V", policy.layer_v)):
        by_w: dict = {}
        for l, f in over:
            by_w.setdefault(w(f), []).append(str(l))
        s += "".join(f"+{kind}{b}@{','.join(ls)}" for b, ls in by_w.items())
    return s


# ============================================================================ model shape
def _shape(config):
    """(layers, q heads, kv heads, head_dim) of a transformers decoder config.

    Raises:
        ValueError: sliding-window attention layers (this cache attends over every cached token).
    """
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or ()) or (
            getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None)):
        raise ValueError(f"config: sliding-window attention layers (layer_types / sliding_window="
                         f"{getattr(cfg, 'sliding_window', None)}) are not supported; PackedCache attends over "
                         f"every cached token (Llama and Qwen2 without sliding windows)")
    hq = cfg.num_attention_heads
    kvh = getattr(cfg, "num_key_value_heads", None) or hq
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
    return cfg.num_hidden_layers, hq, kvh, d


def _check_cuda_layer(layer: int, kf, vf, sinks: int):
    """ValueError naming the field if the kernels cannot serve this layer (checked without a GPU)."""
    if kf is None and vf is None:
        return
    if kf is None or vf is None:
        raise ValueError(f"layer {layer}: backend 'cuda' needs both K and V packed or both 16-bit "
                         f"(got k={kf and kf.bits} bits, v={vf and vf.bits} bits)")
    from gpu_ref import decode as dec
    if sinks > dec.MAX_SINKS:
        raise ValueError(f"sinks={sinks}: the decode kernel keeps at most {dec.MAX_SINKS} sink tokens")
    try:
        dec.check_kv_pair(kf, vf)
    except ValueError as err:
        raise ValueError(f"layer {layer}: head_dim / format not served by the decode kernel: {err}") from None


# ============================================================================ stores
def _torch():
    import torch
    return torch


class _GoldenStore:
    """Golden-model store: encodes with ``sim_models.encode`` and keeps the reconstructions.

    Tensors (torch, on ``device``): ``hat[kind]`` float32 ``[B, KVH, CAP, D]`` (decode_float, or
    the 16-bit value for sinks / unquantized kinds); ``codes[kind]``/``scales[kind]`` NumPy uint8
    ``[B, KVH, CAP, D/N, bytes]`` (zeros for sink rows).
    """

    def __init__(self, fmts, sinks, batch, kvh, cap, d, torch_dtype, device, hq=None, mu16=None, s16=None):
        torch = _torch()
        self.fmts, self.sinks, self.dtype = fmts, sinks, torch_dtype
        # the key front end (FORMAT.md 8) as the golden model defines it: sim_models.keyscale.key_front
        self._fe = FormatParams(n=d, block=min(64, d))
        self._front = None
        if mu16 is not None or s16 is not None:
            e = (np.zeros((kvh, d), np.int8) if s16 is None
                 else np.log2(s16.astype(np.float64)).astype(np.int8))
            mu = np.zeros((kvh, d), np.float16) if mu16 is None else mu16
            self._front = (front_table(mu, e, self._fe), e)
        self._q_div = None if s16 is None else torch.as_tensor(s16.astype(np.float32), device=device)
        self.hat = {k: torch.zeros(batch, kvh, cap, d, dtype=torch.float32, device=device) for k in "kv"}
        self.codes, self.scales = {}, {}
        for kind, f in zip("kv", fmts):
            if f is not None:
                self.codes[kind] = np.zeros((batch, kvh, cap, d // f.n, f.code_bytes), np.uint8)
                self.scales[kind] = np.zeros((batch, kvh, cap, d // f.n, f.n_blocks), np.uint8)
        self.length = 0

    def keys_in(self, k16):
        """Keys ``[B, KVH, T, D]`` (torch fp16) -> the encoder input of the key front end (torch fp16)."""
        torch = _torch()
        if self._front is None:
            return k16
        mu_s, e = self._front
        bits = k16.cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
        bits = key_front(bits, mu_s[None, :, None, :], e[None, :, None, :], self._fe)
        return torch.from_numpy(bits.view(np.int16)).view(torch.float16).to(k16.device)

    def query(self, q):
        """Queries float32 ``[B, Hq, ..., D]`` -> ``q / s`` (the key scales' reparametrization)."""
        if self._q_div is None:
            return q
        rep = q.shape[1] // self._q_div.shape[0]
        div = self._q_div.repeat_interleave(rep, 0)
        return q / div.reshape(1, q.shape[1], *([1] * (q.dim() - 3)), q.shape[-1])

    def append(self, k16, v16):
        """k16, v16: torch 16-bit ``[B, KVH, T, D]`` (keys before the key front end)."""
        torch = _torch()
        k16 = self.keys_in(k16)
        t0, t = self.length, k16.shape[2]
        for kind, x, f in (("k", k16, self.fmts[0]), ("v", v16, self.fmts[1])):
            xf = x.float()
            out = xf.clone()
            if f is not None:
                bits = x.cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
                b, h, _, d = bits.shape
                e = encode(bits.reshape(b, h, t, d // f.n, f.n), f)
                rec = decode_float(e.codes, e.scales, f, e.zeros).reshape(b, h, t, d)
                first = max(0, min(self.sinks - t0, t))         # rows of this chunk that are sinks
                out[:, :, first:] = torch.from_numpy(rec[:, :, first:].astype(np.float32)).to(x.device)
                self.codes[kind][:, :, t0 + first:t0 + t] = e.codes[:, :, first:]
                self.scales[kind][:, :, t0 + first:t0 + t] = e.scales[:, :, first:]
            self.hat[kind][:, :, t0:t0 + t] = out
        self.length += t

    def attend(self, q, scaling):
        """q float32 ``[B, Hq, D]`` -> float32 ``[B, Hq, D]``."""
        torch = _torch()
        q = self.query(q)
        n = self.length
        k, v = self.hat["k"][:, :, :n], self.hat["v"][:, :, :n]
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = torch.nn.functional.scaled_dot_product_attention(q.float()[:, :, None], k, v, scale=scaling)
        return o[:, :, 0]

    def nbytes(self):
        """Bytes of the stored format (:meth:`sim_models.CachePolicy.stored_bits` of these formats
        and sinks at this capacity: packed vectors, fp16 sink rows, 16-bit unquantized kinds;
        flags, which the golden store does not keep, excluded)."""
        b, h, cap, d = self.hat["k"].shape
        pol = CachePolicy(k=self.fmts[0], v=self.fmts[1], sinks=self.sinks)
        return b * pol.stored_bits(1, h, d, cap) // 8


class _StreamHandle:
    """A raw ``cudaStream_t`` under the CUDA stream protocol (``__cuda_stream__``, version 0)."""

    def __init__(self, ptr: int):
        self.ptr = int(ptr)

    def __cuda_stream__(self):
        return (0, self.ptr)


class _CudaStore:
    """The project's kernels through gpu_ref's plan/run API; every call into gpu_ref is in this class.

    Planes: one :class:`gpu_ref.KVCache` (K and V formats, ``sinks`` 16-bit side rows). Appends
    launch the write kernel straight into the planes (rows computed on the device from the
    device lengths when one token is appended per sequence) and update the device lengths in
    place; decode runs a plan with a workspace and an output buffer owned here (one per
    power-of-two length bucket). A decode step therefore allocates nothing on the CuPy side and
    copies nothing between host and device: a whole model step can be captured in a CUDA graph
    (bench/hf_bench.py, tests/test_hf.py). With ``pow2_rows`` the packed rows per sequence are a
    power of two, so the planes double as a pool of one page per sequence and :meth:`attend_chunk`
    can point every query of a chunk at its sequence's page (one decode launch, per-query lengths).
    """

    _streams: dict = {}

    def __init__(self, fmts, sinks, batch, kvh, cap, d, torch_dtype, device, hq, pow2_rows=False, mu16=None,
                 s16=None):
        import cupy as cp
        from gpu_ref import KVCache
        torch = _torch()
        self.bf16 = torch_dtype != torch.float16
        self.hq, self.sinks = hq, sinks
        packed = max(cap - sinks, 1)
        if pow2_rows:
            packed = max(64, 1 << (packed - 1).bit_length())
        with self._stream():
            self.kv = KVCache(batch, kvh, packed + sinks, fmts[0], v_params=fmts[1], sinks=sinks, mu=mu16,
                              key_scale=None if s16 is None else s16.astype(np.float32))
            self._dlen = self.kv.lengths                       # device int32 [B], updated in place
            rows = self.kv.k_codes.shape[2]
            # plane row of packed token 0 of (b, h), in the write kernel's input order [B, (T,) KVH]
            self._base = ((cp.arange(batch, dtype=cp.int64)[:, None] * kvh
                           + cp.arange(kvh, dtype=cp.int64)[None, :]) * rows)
        self._rows = rows
        self._base_t = torch.from_dlpack(self._base)
        self._dlen_t = torch.from_dlpack(self._dlen)
        self._sink_t = None
        if sinks:                                              # torch views of the sink planes (uint16 bits)
            self._sink_t = [torch.from_dlpack(a.view(cp.int16)) for a in (self.kv.k_sink, self.kv.v_sink)]
        self._plans = {}
        self.length = 0

    @classmethod
    def _stream(cls):
        import cupy
        cur = _torch().cuda.current_stream()
        key = (cur.cuda_stream, cur.device.index)
        s = cls._streams.get(key)
        if s is None:
            wrap = getattr(cupy.cuda.Stream, "from_external", None)      # CuPy >= 14 (ExternalStream deprecated)
            s = cls._streams[key] = (wrap(_StreamHandle(cur.cuda_stream)) if wrap is not None
                                     else cupy.cuda.ExternalStream(cur.cuda_stream, cur.device.index))
        return s

    @staticmethod
    def _cp(x):
        """torch 16-bit (or fp32 / int) tensor -> cupy view (bf16 as uint16 bits)."""
        import cupy
        torch = _torch()
        x = x.contiguous()
        if x.dtype == torch.bfloat16:
            return cupy.from_dlpack(x.view(torch.int16)).view(cupy.uint16)
        return cupy.from_dlpack(x)

    def append(self, k16, v16):
        """k16, v16: torch 16-bit ``[B, KVH, T, D]`` (keys before the key front end, which the write kernel
        applies), all sequences at ``self.length``."""
        from gpu_ref import launch_encode
        from gpu_ref.encode import key_front
        torch = _torch()
        t0, t = self.length, k16.shape[2]
        ns = max(0, min(self.sinks - t0, t))                   # leading tokens of the chunk that are sinks
        front = self.kv._key                                   # the key front end (None: plain keys)
        if ns:
            ks = k16[:, :, :ns]
            if front is not None:                              # sink keys in the front end's domain too
                with self._stream():
                    y = key_front(self._cp(ks.transpose(1, 2)), front, _cupy())        # [B, ns, KVH, D]
                ks = torch.from_dlpack(y.view(_cupy().int16)).transpose(1, 2)
            self._sink_t[0][:, :, t0:t0 + ns] = ks.view(torch.int16)
            self._sink_t[1][:, :, t0:t0 + ns] = v16[:, :, :ns].view(torch.int16)
        if t > ns:
            if t == 1:                                         # from the device lengths: graph-safe
                rows = (self._base_t + (self._dlen_t.long() - self.sinks)[:, None]).reshape(-1)
            else:
                pos = torch.arange(t0 + ns - self.sinks, t0 + t - self.sinks, device=k16.device)
                rows = (self._base_t[:, None, :] + pos[None, :, None]).reshape(-1)
            kv = self.kv
            with self._stream():
                for x, p, codes, scales, flags, key, lay in (
                        (k16, kv.params, kv.k_codes, kv.k_scales, kv.k_flags, front, "wire"),
                        (v16, kv.v_params, kv.v_codes, kv.v_scales, kv.v_flags, None, kv.layout)):
                    bits = self._cp(x[:, :, ns:].transpose(1, 2))                # [B, T', KVH, D]
                    launch_encode(bits, p, codes, scales, flags, self._cp(rows), _cupy(), key=key, layout=lay,
                                  pair_vec=bits.shape[-2])
        self._dlen_t += t
        self.length += t
        self.kv.host_lengths[:] = self.length

    def _plan(self, key, make):
        if key not in self._plans:
            with self._stream():
                pl = make()
                self._plans[key] = (pl, pl.workspace())
        return self._plans[key]

    def attend(self, q, scaling):
        """q float32 ``[B, Hq, D]`` -> float32 ``[B, Hq, D]`` (the kernel reads q / s with key scales)."""
        torch = _torch()
        q16 = q.to(torch.bfloat16 if self.bf16 else torch.float16)
        bucket = min(self.kv.capacity, 1 << max(self.length - 1, 63).bit_length())
        qdt = "bf16" if self.bf16 else "fp16"
        pl, ws = self._plan(bucket, lambda: self.kv.plan(self.hq, bucket, q_dtype=qdt))
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        with self._stream():
            self.kv.run(pl, ws, self._cp(q16), scale=float(scaling), out=self._cp(out), out_dtype="fp32")
        return out

    def attend_chunk(self, q, scaling, num_splits=None):
        """Causal attention of the chunk's queries ``[B, Hq, T, D]`` (float32; the kernel reads q / s with
        key scales; the chunk is the last T cached tokens) over the packed cache: query i of sequence b
        reads the first ``length - T + i + 1`` tokens of b (sinks included) -> float32 ``[B, T, Hq, D]``.
        One decode launch of B*T queries, each pointed at its sequence's page (``pow2_rows``)."""
        import cupy as cp
        torch = _torch()
        b, hq, t, d = q.shape
        kv, n = self.kv, self.length
        q16 = q.transpose(1, 2).reshape(b * t, hq, d).to(torch.bfloat16 if self.bf16 else torch.float16)
        key = ("chunk", b * t, n, num_splits)
        pl, ws = self._plan(key, lambda: _dec_plan(kv, b * t, hq, n, self._rows, num_splits,
                                                   "bf16" if self.bf16 else "fp16"))
        lengths = torch.arange(n - t + 1, n + 1, dtype=torch.int32, device=q.device).repeat(b)
        table = torch.arange(b, dtype=torch.int32, device=q.device).repeat_interleave(t)[:, None]
        out = torch.empty(b * t, hq, d, dtype=torch.float32, device=q.device)
        from gpu_ref import run
        with self._stream():
            sink = {}
            if self.sinks:
                sink = {f"{k}_sink": self._cp(s.repeat_interleave(t, 0)).view(cp.uint16)
                        for k, s in zip("kv", self._sink_t)}
            run(pl, ws, self._cp(q16), kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, self._cp(lengths),
                self._cp(table), q_scale=kv.q_scale, scale=float(scaling), out=self._cp(out), out_dtype="fp32",
                layout=kv.layout,
                **sink)
        return out.reshape(b, t, hq, d)

    def set_length(self, n: int):
        self.length = n
        self.kv.host_lengths[:] = n
        self._dlen_t.fill_(n)

    def nbytes(self):
        kv = self.kv
        return sum(a.nbytes for a in (kv.k_codes, kv.v_codes, kv.k_scales, kv.v_scales, kv.k_flags, kv.v_flags,
                                      kv.k_sink, kv.v_sink) if a is not None)


def _cupy():
    import cupy
    return cupy


def _dec_plan(kv, queries, hq, max_length, rows, num_splits=None, q_dtype="fp16"):
    """Plan of :meth:`_CudaStore.attend_chunk`: ``queries`` sequences over a pool of one page of
    ``rows`` tokens per cached sequence."""
    from gpu_ref import plan
    return plan(kv.params, kv.v_params, batch=queries, q_heads=hq, kv_heads=kv.kv_heads, max_length=max_length,
                page_size=rows, max_pages=1, sinks=kv.sinks, num_splits=num_splits,
                key_scales=kv.q_scale is not None, q_dtype=q_dtype, layout=kv.layout)


def cache_kwargs(model, cache) -> dict:
    """``{name: cache}`` for the model's forward / ``generate``: ``cache`` where the installed
    transformers' forward takes it (5.2x on; ``past_key_values`` is deprecated there and removed
    from forward in 5.40 and from generate in 6.0), else ``past_key_values`` (5.17 ..)."""
    import inspect
    return {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}


def generate(model, input_ids, cache, **kwargs):
    """``model.generate(input_ids, **cache_kwargs(model, cache), **kwargs)``."""
    return model.generate(input_ids, **cache_kwargs(model, cache), **kwargs)


# ============================================================================ cache
try:
    from transformers.cache_utils import Cache, CacheLayerMixin
except ImportError:  # pragma: no cover - transformers is optional for the rest of gpu_ref
    Cache = CacheLayerMixin = object


class PackedLayer(CacheLayerMixin):
    """One decoder layer's K/V (see the module docstring).

    Args:
        layer_idx: decoder layer index.
        k_fmt, v_fmt: FormatParams (n = head_dim, dtype = the cache's 16-bit type) or None (16-bit).
        sinks: leading tokens kept 16-bit.
        mu: None or float16 ``[KVH, D]`` centering vectors (unscaled; the key front end,
            FORMAT.md 8, stores ``RNE(RN16(k s) - RN16(mu s))``).
        key_scale: None or float16 ``[KVH, D]`` per-channel key scales (powers of two).
        batch_size, capacity, num_heads, num_kv_heads, head_dim: the shapes.
        backend: ``"cuda"`` or ``"golden"``.
    """

    is_compileable = False
    is_sliding = False

    def __init__(self, layer_idx, k_fmt, v_fmt, sinks, mu, key_scale, batch_size, capacity,
                 num_heads, num_kv_heads, head_dim, backend):
        super().__init__()
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
        self.chunk_splits = None     # benchmarks: split-KV factor of the packed-prefill launch (None: planned)
        self.last_chunk = 0          # tokens appended by the last update (read by the attention function)

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
            args = ((self.k_fmt, self.v_fmt), self.sinks, b, h, self.capacity, d, self.dtype, self.device,
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
                self.store = _CudaStore(*args, pow2_rows=self.prefill == "packed", **front)
            else:
                self.store = _GoldenStore(*args, **front)
        else:
            self.keys = torch.zeros(b, h, self.capacity, d, dtype=self.dtype, device=self.device)
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
            self.keys[:, :, self.length:self.length + t] = key_states
            self.values[:, :, self.length:self.length + t] = value_states
            self.length += t
            return (self.keys[:, :, :self.length].to(self.model_dtype),
                    self.values[:, :, :self.length].to(self.model_dtype))
        self.store.append(key_states.to(self.dtype), value_states.to(self.dtype))
        self.length += t
        return key_states, value_states

    def attend(self, query, scaling):
        """Decode attention of ``query`` ``[B, Hq, D]`` over the packed layer -> float32 ``[B, Hq, D]``."""
        return self.store.attend(query.float(), scaling)

    def attend_chunk(self, query, scaling):
        """Causal attention of ``query`` ``[B, Hq, T, D]`` (the last T tokens) over the packed
        cache, every query seeing the tokens up to its own -> ``[B, T, Hq, D]`` (``prefill="packed"``:
        the golden model's fake-quant forward; with the kernels, one decode launch of B*T queries)."""
        torch = _torch()
        t, n = query.shape[2], self.length
        q = query.float()
        if self.backend == "cuda":
            return self.store.attend_chunk(q, scaling, self.chunk_splits).to(query.dtype)
        q = self.store.query(q)
        rep = self.num_heads // self.num_kv_heads
        k = self.store.hat["k"][:, :, :n].repeat_interleave(rep, 1)
        v = self.store.hat["v"][:, :, :n].repeat_interleave(rep, 1)
        mask = torch.arange(n, device=q.device)[None, :] <= torch.arange(n - t, n, device=q.device)[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)
        return o.to(query.dtype).transpose(1, 2)

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
        policy: :class:`sim_models.CachePolicy` or a spec for :func:`parse_policy`.
        batch_size: sequences B (equal lengths).
        capacity: tokens per sequence (prompt + generated).
        tables: :class:`sim_models.KeyTables` of this model (the calibration command's
            ``<model_id>.keytables.npz``): mu and the key scales; needed by ``v3`` (centering and
            ``KS2``). Exclusive with ``mu`` / ``key_scales``.
        mu: float ``[layers, KVH, D]`` centering vectors; required when ``policy.center_keys``
            and no ``tables``.
        key_scales: float32 ``[layers, KVH, D]`` per-channel power-of-two key scales, or None.
        backend: ``"cuda"`` (the kernels) or ``"golden"`` (NumPy golden model).
        prefill: ``"exact"`` (multi-token chunks attend to their unquantized K/V) or ``"packed"``
            (every query of a chunk attends to the packed cache up to its own token: the
            fake-quant forward of bench/accuracy.py; with ``backend="cuda"`` one decode-kernel
            launch per layer and chunk, the planes' rows rounded up to a power of two).
        dtype: 16-bit type of the stored values, ``"fp16"`` or ``"bf16"`` (default: fp16 when keys
            pass the key front end, which FORMAT.md 8 defines on fp16 keys; else bf16 for bf16 models
            and fp16 otherwise, decided at the first update). K/V of a bf16 model outside fp16's
            range become +-inf in an fp16 cache (flagged by the format, FORMAT.md 3.1).

    Raises:
        ValueError: a parameter out of range (named), head_dim or a format the backend cannot
            serve, mu/key_scales of the wrong shape or not powers of two, centering without mu.
    """

    def __init__(self, config, policy, batch_size: int, capacity: int, mu=None, key_scales=None,
                 backend: str = "cuda", dtype: str | None = None, prefill: str = "exact",
                 tables: KeyTables | None = None):
        if tables is not None:
            if not isinstance(tables, KeyTables):
                raise TypeError(f"tables must be a sim_models.KeyTables, got {type(tables).__name__}")
            if mu is not None or key_scales is not None:
                raise ValueError("pass either tables or mu / key_scales, not both")
            n_layers, _, kvh, d = _shape(config)
            if tables.shape != (n_layers, kvh, d):
                raise ValueError(f"tables of model {tables.model_id!r} have shape {tables.shape} (layers, kv heads, "
                                 f"head_dim), the model has {(n_layers, kvh, d)}")
        if isinstance(policy, str):
            policy = parse_policy(policy)
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
        n_layers, hq, kvh, d = _shape(config)
        for name, l in (("layer_k", policy.layer_k), ("layer_v", policy.layer_v)):
            bad = [e[0] for e in l if e[0] >= n_layers]
            if bad:
                raise ValueError(f"policy.{name} names layers {bad}, the model has {n_layers}")
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
                             "are study options the kernels and this cache do not apply")
        if policy.key_scale == "fp16":
            raise ValueError("policy.key_scale 'fp16' is not served: key_scales must be powers of two ('pow2')")
        if policy.key_scale == "pow2" and arrays["key_scales"] is None:
            raise ValueError("policy.key_scale 'pow2' needs key_scales (the calibration file's 'key_scales')")
        ks = arrays["key_scales"]
        if ks is not None and (np.any(ks <= 0) or np.any(np.frexp(ks)[0] != 0.5)):
            raise ValueError("key_scales must be positive powers of two (the reparametrization is exact)")
        if ks is not None:
            lo, hi = LOG2_S_RANGE if backend == "golden" else (LOG2_S_RANGE[0], LOG2_S_RANGE[1] - 1)
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
        layers = []
        for l in range(n_layers):
            kf = fit_format(policy.format_for(l, "k"), d, fmt_dtype)
            vf = fit_format(policy.format_for(l, "v"), d, fmt_dtype)
            for kind, f in (("k", kf), ("v", vf)):
                if f is not None and d % f.n:
                    raise ValueError(f"head_dim {d} is not a multiple of the {kind} format's n={f.n}")
            if backend == "cuda":
                _check_cuda_layer(l, kf, vf, policy.sinks)
            m = arrays["mu"][l].astype(np.float16) if (policy.center_keys and kf is not None) else None
            s = ks[l].astype(np.float16) if (ks is not None and kf is not None) else None
            layers.append(PackedLayer(l, kf, vf, policy.sinks, m, s, self.n_seqs, self.capacity,
                                      hq, kvh, d, backend))
            layers[-1].prefill = prefill
            layers[-1].cache_dtype = dtype
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


# ============================================================================ attention function
def fwht_kv_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function ``"fwht_kv"`` (signature of ``sdpa_attention_forward``).

    query ``[B, Hq, T, D]``; returns ``([B, T, Hq, D], None)``. Decode (T = 1) on a packed layer:
    the fused decode kernel (or the golden store); anything else: SDPA over what the cache's
    ``update`` returned (prefill: the chunk's unquantized K/V).

    Raises:
        RuntimeError: the cache's last update was for another layer.
        NotImplementedError: a multi-token chunk after cached tokens on a packed layer.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    layer = getattr(_pending, "layer", None)
    _pending.layer = None
    if query.shape[2] == 1:
        attention_mask = None      # one query, equal lengths: nothing to mask (keeps SDPA's GQA path)
    if layer is None or not layer.packed:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if layer.layer_idx != getattr(module, "layer_idx", layer.layer_idx):
        raise RuntimeError(f"attention of layer {module.layer_idx} after the cache update of layer {layer.layer_idx}")
    b, hq, t, d = query.shape
    if scaling is None:
        scaling = d ** -0.5
    if t == 1:
        o = layer.attend(query[:, :, 0], scaling)                       # [B, Hq, D]
        return o.to(query.dtype)[:, None], None
    if layer.prefill == "packed":
        return layer.attend_chunk(query, scaling), None
    if layer.length != layer.last_chunk:
        raise NotImplementedError(f"layer {layer.layer_idx}: a {t}-token chunk after {layer.length - t} cached "
                                  "tokens (chunked prefill) is not supported; feed one token at a time")
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, **kwargs)


def enable(model=None):
    """Register ``"fwht_kv"`` with transformers' attention and mask interfaces; switch ``model`` to it.

    Returns:
        the attention implementation name.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(ATTN_NAME, fwht_kv_attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
    if model is not None:
        model.set_attn_implementation(ATTN_NAME)
    return ATTN_NAME
