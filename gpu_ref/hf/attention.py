"""The transformers attention function ``"fwht_kv"`` that reads :class:`gpu_ref.hf.PackedCache`, its
registration (:func:`enable`) and the ``generate`` helpers.
"""

from __future__ import annotations

import threading

ATTN_NAME = "fwht_kv"
_pending = threading.local()   # the layer whose update() ran last, read by the attention function


def cache_kwargs(model, cache) -> dict:
    """``{name: cache}`` for the model's forward / ``generate``: ``cache`` where the installed
    transformers' forward takes it (5.2x on; ``past_key_values`` is deprecated there and removed
    from forward in 5.40 and from generate in 6.0), else ``past_key_values`` (5.17 ..)."""
    import inspect
    return {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}


def generate(model, input_ids, cache, **kwargs):
    """``model.generate(input_ids, **cache_kwargs(model, cache), **kwargs)``."""
    return model.generate(input_ids, **cache_kwargs(model, cache), **kwargs)


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

