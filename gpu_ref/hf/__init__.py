"""Hugging Face transformers integration: a KV cache that stores every layer in the packed format.

:class:`PackedCache` is a ``transformers.Cache`` (one :class:`PackedLayer` per decoder layer) and
:func:`enable` registers the attention function ``"fwht_kv"`` that reads it. Usage::

    from gpu_ref import hf
    hf.enable(model)                                   # model.config._attn_implementation = "fwht_kv"
    cache = hf.PackedCache(model.config, "v4", batch_size=1, capacity=4096,
                           tables=KeyTables.load("smollm2-135m.keytables.npz"))   # python -m sim_models.calibrate
    hf.generate(model, ids, cache, max_new_tokens=64)  # model.generate with the cache argument

What each step does (Llama, Qwen2 and Gemma 3 families; GQA of any ratio):

* ``update`` (called by the model with post-RoPE K/V ``[B, KVH, T, D]``): K and V are rounded to
  the cache's 16-bit type and appended with the write kernel, which applies the key front end of
  format version 3 to the keys (FORMAT.md 8: ``RNE(RN16(k s) - RN16(mu s))``, per-channel
  power-of-two scales ``s`` and centering vectors ``mu`` from the model's :class:`sim_models.KeyTables`).
  The first ``policy.sinks`` tokens of each sequence are kept 16-bit instead, keys in the same
  front-end domain (:class:`sim_models.CachePolicy`). With a recent ring (``policy.recent``, 16 in
  ``v4``) a query reads the ``recent`` most recent tokens of its sequence from 16-bit rows kept beside
  their codes, and older tokens through their codes.
* prefill (a chunk of T > 1 tokens into an empty layer), ``prefill="exact"`` (default): attention
  uses the chunk's *unquantized* K/V (SDPA, causal), as serving engines do; only later tokens see
  the packed prompt. A multi-token chunk after cached tokens (chunked prefill) raises
  ``NotImplementedError``. ``prefill="packed"``: every query of the chunk attends to the packed
  cache up to its own token (the fake-quant forward of bench.accuracy; with the kernels one
  decode launch of B*T queries per layer, each query pointed at its sequence's planes with its
  own length).
* decode (T = 1): the token is appended first, then the query (``q / s``) attends over the packed
  cache with the fused decode kernel, the new token included: the same thing the golden model's
  fake-quant forward computes (bench.accuracy). The kernel takes q in the cache's 16-bit type.
* layers whose K and V formats are both ``None`` keep a preallocated 16-bit cache (the model's
  dtype, fp16 for fp32 models) and attend with SDPA: the baseline.

Backends (the store behind each packed layer): ``"cuda"`` (the kernels through gpu_ref's plan/run
API, CUDA tensors; :class:`_CudaStore` holds every call into gpu_ref) and ``"golden"`` (NumPy
golden model: ``sim_models.encode`` + ``decode_float`` at write time, SDPA over the
reconstructions; any device, any format; the reference of tests/test_hf.py). What the kernels
cannot serve (:func:`gpu_ref.backend.supports`: head dims, K/V bits, sinks, key-scale range, one of
K/V 16-bit, ...) raises ``ValueError`` naming every field at cache creation. The key front end runs
inside the write kernel (cuda) or through ``sim_models.codec.encode_folded`` (golden; the folded
rule of docs/FORMAT.md 8, side rows by ``sim_models.keyscale.key_front``), and the
query side ``q / s`` inside the decode kernel (cuda) or before SDPA (golden); a cache with a front
end stores fp16. A decode step of the cuda
backend allocates nothing on the CuPy side and makes no host<->device copy, so a whole model
step can be captured in a CUDA graph (bench.gpu.hf does, for timing).

Sliding-window layers (Gemma 3: window 512 on 5 of 6 layers; Qwen2 / Mistral with the window on,
:func:`layer_windows`): the layer keeps a ring of the last W tokens (token ``p`` in row ``p % W``) and a
decode query attends to exactly them, as the model's own sliding-window mask does; no sinks on these
layers (tokens before the window are outside what the model was trained to see). A prefill chunk
longer than W attends to its unquantized K/V under the model's mask and leaves its last W tokens
in the ring.

Sequences of a batch have equal lengths (no padding: a padded attention mask is not applied in
decode).

Modules: :mod:`~gpu_ref.hf.cache` (:class:`PackedCache`, :class:`PackedLayer`),
:mod:`~gpu_ref.hf.stores` (the golden and CUDA stores), :mod:`~gpu_ref.hf.attention` (the attention
function, :func:`enable`, :func:`generate`).
"""

from __future__ import annotations

from .attention import ATTN_NAME, cache_kwargs, enable, fwht_kv_attention, generate
from .cache import BACKENDS, PackedCache, PackedLayer, layer_windows, model_shape

__all__ = ["ATTN_NAME", "BACKENDS", "PackedCache", "PackedLayer", "cache_kwargs", "enable", "fwht_kv_attention",
           "generate", "layer_windows", "model_shape"]
