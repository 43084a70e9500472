"""Generate with a Hugging Face model whose KV cache is in the packed format (gpu_ref.hf).

    python -m gpu_ref.generate --model SPEC --tables tables.npz --prompt "..." --max-new-tokens 128

``SPEC`` is a model spec of :func:`sim_models.models.resolve`: an alias (``smollm2-135m``), a
``.gguf`` file or a Hugging Face folder. The default policy is format version 4's (``v4`` =
``K3V3+C+S4+KS2+W16``, docs/FORMAT.md 8): it needs the model's key tables, written once per model by
``python -m sim_models.calibrate --model SPEC --out tables.npz``. ``--policy K3V3`` (version 2, no
tables) runs without them.

Loads the model (offline), switches its attention to ``fwht_kv``, generates greedily while
streaming the text (special tokens such as ``<|im_end|>`` not shown), and prints the time to the
first new token (prefill), the decode tokens/s from the first new token on, and the cache bytes
(packed and what a 16-bit cache of the same length would hold). ``--policy fp16`` runs the 16-bit cache for comparison.
Needs a CUDA GPU and CuPy for ``--backend cuda``.
"""

from __future__ import annotations

import argparse
import sys
import time


def _decode_clock(inner, sync):
    """A ``transformers`` streamer that notes when the first new token arrives (its second ``put``: the first
    is the prompt), so that decode is timed from there; passes everything on to ``inner`` (or None)."""
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        first = None
        _puts = 0

        def put(self, value):
            self._puts += 1
            if self._puts == 2:
                sync()
                self.first = time.perf_counter()
            if inner is not None:
                inner.put(value)

        def end(self):
            if inner is not None:
                inner.end()
    return Clock()


def main(argv=None) -> int:
    from gpu_ref.cli import (NO_CHAT_TEMPLATE, add_model_options, check_model_options, check_tables_fit,
                             has_chat_template, torch_dtype)
    ap = argparse.ArgumentParser(prog="python -m gpu_ref.generate", description=__doc__.split("\n")[0])
    add_model_options(ap)
    ap.add_argument("--prompt", default="Explain in a few sentences what a KV cache is.",
                    help="the prompt text (default: %(default)r)")
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default: %(default)s)")
    ap.add_argument("--batch", type=int, default=1, help="copies of the prompt decoded together (default: %(default)s)")
    a = ap.parse_args(argv)
    if a.max_new_tokens < 1:
        ap.error(f"--max-new-tokens must be >= 1, got {a.max_new_tokens}")
    if a.batch < 1:
        ap.error(f"--batch must be >= 1, got {a.batch}")
    check_model_options(ap, a)
    from sim_models.models import load
    src, policy, tables = a.src, a.cache_policy, a.key_tables

    import torch
    from transformers import TextStreamer

    from gpu_ref import hf

    if a.backend == "cuda" and not torch.cuda.is_available():
        ap.error("--backend cuda needs a CUDA GPU (torch.cuda.is_available() is False); use --backend golden")
    device = "cuda" if a.backend == "cuda" else ("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    try:
        model, tok = load(src, dtype=torch_dtype(a.dtype))
    except (ValueError, OSError) as err:
        ap.error(f"--model {a.model!r}: cannot load it: {err}")
    if a.chat and not has_chat_template(tok):
        ap.error(f"--chat: {NO_CHAT_TEMPLATE}; drop --chat (the prompt is then the model's input as written)")
    model = model.to(device)
    check_tables_fit(ap, a, model)
    print(f"loaded {src.description} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    hf.enable(model)
    text = a.prompt
    if a.chat:
        text = tok.apply_chat_template([{"role": "user", "content": a.prompt}], add_generation_prompt=True,
                                       tokenize=False)
    ids = tok(text, return_tensors="pt", add_special_tokens=not a.chat)["input_ids"].to(device)
    ids = ids.repeat(a.batch, 1)
    cap = ids.shape[1] + a.max_new_tokens
    try:
        cache = hf.PackedCache(model.config, policy, a.batch, cap, tables=tables, backend=a.backend)
    except (ValueError, TypeError) as err:
        ap.error(f"{err}")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    streamer = TextStreamer(tok, skip_prompt=True, skip_special_tokens=True) if a.batch == 1 else None
    clock = _decode_clock(streamer, sync)
    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(model, ids, cache, attention_mask=torch.ones_like(ids),
                          max_new_tokens=a.max_new_tokens, do_sample=False, streamer=clock,
                          pad_token_id=tok.pad_token_id or tok.eos_token_id)
    sync()
    t1 = time.perf_counter()
    new = out.shape[1] - ids.shape[1]
    if streamer is None:
        print(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    first = (clock.first or t1) - t0                   # prefill and the first new token
    rate = (f"{(new - 1) * a.batch / (t1 - clock.first):.1f} tokens/s" if new > 1 and clock.first is not None and t1 > clock.first
            else "n/a (one new token)")
    s = cache.shape
    full = 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2 * a.batch * cap
    print(f"policy {cache.policy.spec}, backend {a.backend}: {new} tokens x batch {a.batch} in {t1 - t0:.2f} s; "
          f"first token after {first:.2f} s (prefill), then decode {rate}; cache {cache.nbytes() / 2**20:.2f} MiB "
          f"for {cap} tokens x {a.batch} (16-bit: {full / 2**20:.2f} MiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
