"""Kernel build and shared checks of gpu_ref: CuPy import, parameter checks, compiled-kernel cache.

One place renders template arguments into a kernel name and compiles it (NVRTC through CuPy
``RawModule``). Both sources ``#include "kv_common.cuh"``; nvcc finds it next to them, and here the
header text replaces the include line before compiling, so CuPy's on-disk kernel cache (keyed by
the source text) sees header changes too.
"""

from __future__ import annotations

import os
import re
import threading

import numpy as np

from sim_models.params import FormatParams, check_supported

HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCES = {"encode": ("kv_encode.cu", "kv_encode"), "key_front": ("kv_encode.cu", "kv_key_front"),
            "decode": ("kv_decode_attn.cu", "kv_decode_attn"), "decode_cl": ("kv_decode_attn.cu", "kv_decode_attn_cl")}
_lock = threading.Lock()
_kernels: dict = {}

#: Quantizer fields the kernels implement (docs/FORMAT.md 3.7): the version-1
#: quantizer (midtread, up) and the version-2 one (midrise, nearest), and the two cross terms.
SUPPORTED_QUANTIZER = {
    "mode": ("midtread", "midrise"),
    "scale": ("ue5m3",),
    "scale_rule": ("max",),
    "scale_round": ("up", "nearest"),
    "scale_mult": (None, 256),
}
MODE_ID = {"midtread": 0, "midrise": 1}
ROUND_ID = {"up": 0, "nearest": 1}


def cupy():
    """The cupy module; RuntimeError when CuPy is missing."""
    try:
        import cupy as cp  # noqa: WPS433
    except ImportError as err:  # pragma: no cover - depends on the machine
        raise RuntimeError("gpu_ref needs CuPy (pip install cupy-cuda13x) and an NVIDIA GPU") from err
    return cp


def checked_params(params) -> FormatParams:
    """Checked FormatParams (None -> ``FormatParams()``).

    Raises:
        TypeError: not a FormatParams.
        ValueError: a quantizer field outside :data:`SUPPORTED_QUANTIZER`; the message names the field.
    """
    if params is None:
        params = FormatParams()
    return check_supported(params, SUPPORTED_QUANTIZER, "gpu_ref CUDA kernels")


def struct_fields(name: str) -> tuple:
    """Member names of ``struct name`` in kv_common.cuh, in order (every member 8 bytes: a pointer or a
    long long, so the layout needs no padding rules)."""
    with open(os.path.join(HERE, "kv_common.cuh"), encoding="utf-8") as f:
        body = re.search(r"struct " + name + r" \{(.*?)\};", f.read(), re.S)
    if body is None:
        raise RuntimeError(f"struct {name} not found in kv_common.cuh")
    members = re.findall(r"^\s*(?:const\s+)?[\w ]+?\*?\s*(\w+);", body.group(1), re.M)
    return tuple(members)


#: Members of ``KvEncodeArgs`` (the write kernel's argument struct), read from kv_common.cuh.
ENCODE_ARGS = struct_fields("KvEncodeArgs")


def kernel_struct(fields: tuple, **values) -> np.ndarray:
    """A kernel argument passed by value as a struct of 8-byte members ``fields`` (CuPy passes a
    one-element NumPy array of a structured dtype as the struct's bytes): cupy arrays become their
    device pointers, None a null pointer, ints 64-bit integers.

    Raises:
        ValueError: a member missing from ``values``, or a name that is not a member.
    """
    if set(values) != set(fields):
        raise ValueError(f"struct members {sorted(fields)} expected, got {sorted(values)}")
    dt = np.dtype({"names": list(fields), "formats": [np.uint64] * len(fields),
                   "offsets": [8 * i for i in range(len(fields))], "itemsize": 8 * len(fields)})
    out = np.zeros(1, dtype=dt)
    for k, v in values.items():
        if v is None:
            v = 0
        elif hasattr(v, "data") and hasattr(v.data, "ptr"):
            v = v.data.ptr
        out[k] = np.uint64(v) if v >= 0 else np.int64(v).view(np.uint64)
    return out


def kernel(kind: str, targs: tuple, smem: int):
    """Compiled RawKernel ``kind`` ("encode" / "key_front" / "decode" / "decode_cl") for one template instantiation (strings),
    cached per process and device; raises the dynamic shared-memory limit when ``smem`` > 48 KB."""
    cp = cupy()
    key = (kind, targs, cp.cuda.Device().id)
    with _lock:
        k = _kernels.get(key)
        if k is None:
            fname, entry = _SOURCES[kind]
            with open(os.path.join(HERE, fname), encoding="utf-8") as f:
                src = f.read()
            with open(os.path.join(HERE, "kv_common.cuh"), encoding="utf-8") as f:
                src = src.replace('#include "kv_common.cuh"', f.read())
            name = entry + "<" + ",".join(targs) + ">"
            mod = cp.RawModule(code=src, options=("-std=c++17", "-DKV_NVRTC"),
                               name_expressions=[name])
            k = mod.get_function(name)
            if smem > 48 * 1024:
                k.max_dynamic_shared_size_bytes = smem
            _kernels[key] = k
    return k


def check_cupy_array(name, a, cp):
    """TypeError unless ``a`` is a cupy array; ValueError if on another device or not C-contiguous."""
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{name} must be a cupy.ndarray on the GPU, got {type(a).__name__}")
    if a.device.id != cp.cuda.Device().id:
        raise ValueError(f"{name} is on device {a.device.id}, the current device is {cp.cuda.Device().id}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
