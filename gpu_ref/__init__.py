"""GPU kernels for the fwht-kv KV-cache format (CuPy RawModule, CUDA sources in this folder).

Two kernels, both defined by the golden model in ``sim_models`` (which fixes every bit):

* :func:`encode_kv` -- the write path (``kv_encode.cu``): K or V vectors ``[..., N]`` in fp16 or
  bf16 -> code plane ``[..., N*b/8]``, scale plane ``[..., N/G]`` and flags ``[...]`` in one
  launch, bit-exact with :func:`sim_models.encode` for every input (NaN, inf, subnormals, zeros
  included) and every :class:`sim_models.FormatParams` the golden model accepts whose quantizer is in
  :data:`SUPPORTED_QUANTIZER`: mode ``midtread`` or ``midrise`` x scale rounding ``up`` or
  ``nearest`` (scale ``ue5m3``, rule ``max``, multiplier 256), i.e. the version-1 quantizer
  (midtread/up), the version-2 one (midrise/nearest) and the two mixed ones.
* :func:`decode_attention` -- fused single-token decode attention (``kv_decode_attn.cu``)
  straight from the packed cache: q is rotated inside the kernel (``q~ = H D q``), logits and
  the online softmax run in the rotated domain (``q.k = q~ . (code*scale) / N``), the rotated V
  is accumulated and the output is rotated back once (``o = D H acc / N``); mid-tread codes
  reconstruct as ``c * scale``, mid-rise codes as ``(2c + 1) * scale / 2`` (the kernel feeds
  ``c + 1/2`` to the tensor cores). Split-KV
  (flash-decoding) with an in-kernel merge; GQA with any ratio; per-sequence lengths.

Method and sources
------------------
Format: ``sim_models`` (docs/FORMAT.md). Randomized Hadamard rotation before quantization as in
QuaRot (Ashkboos et al., 2024) and QuIP# (Tseng et al., 2024); attention in the rotated domain
follows from ``H H = N I``. Split-KV decoding follows flash-decoding (Dao et al., 2023), the
online softmax Milakov & Gimelshein (2018). Tensor-core operand layouts: PTX ISA,
``mma.sync.m16n8k16`` and ``movmatrix``.

Exactness of the write kernel: the BFP mantissa of a lane is ``floor(|f| 2^-u + 1/2)``; the kernel
forms ``|f| 2^-u`` with one or two exact power-of-two multiplies and rounds with two round-down
adds (``floor(RD(v + 1/2)) == floor(v + 1/2)`` because ``floor(v + 1/2)`` is representable);
butterflies run in fp32 when ``M - 1 + log2 N <= 24`` (all partial sums are integers < 2^24,
hence exact) and in int32 otherwise; scales use the golden binary search with exact integer
compares; codes compare ``|y|`` with the exact integer thresholds ``ceil((2j-1) sig 2^(e-u-1))``
(mid-tread) or ``ceil(j sig 2^(e-u))`` (mid-rise); scale rounding ``nearest`` takes the byte below
the rounded-up one when ``K (2 sig + 1) 2^(e-1) > max|y| 2^u`` (one more exact compare).
Since v6 the common configurations take shortcuts proven equal to these steps (comments in
``kv_encode.cu``): one FMA per lane rounds the mantissa (``RN(f 2^-u (1+2^-20) + 1.5*2^23)``: the
factor pushes exact ties away from zero), the scale byte is a double-precision estimate plus two
exact compares, and when ``M - 1 + log2 N <= 20`` one FMA per lane gives the code
(``RN(y k + 1.5*2^23 + 2^(b-1))`` with ``k = (1 + ~1.5*2^-22) / (2 sig 2^sh)``), packed by
shift-adds of offset-binary fields and one XOR per word; mid-rise codes are ``floor(y k)`` by the
same FMA rounding toward minus infinity (``RM(y k + 1.5*2^23 + 2^(b-1))``), clamped to
``[-2^(b-1), 2^(b-1)-1]`` (two FMNMX per lane; also for nearest scale rounding, whose scale can lie
below ``max|y|/K``).

Decode accuracy: K codes enter the tensor cores exactly (``1 + (c+4) 2^(o-10)`` in fp16, the
constant removed through the accumulator start value); q~ is split into two fp16 parts
(~22 bits); softmax weights times V scales enter as fp16 (``precise_p=True`` splits them too);
accumulation is fp32. Relative error against a float64 reference over the same packed cache is
~1e-4 (see tests/test_gpu.py).

Cache layout (what :class:`KVCache` allocates; what :func:`decode_attention` reads)
-----------------------------------------------------------------------------------
Four uint8 planes, C-contiguous, 16-byte aligned, capacity ``CAP`` a multiple of 16:
``k_codes, v_codes: [B, KVH, CAP, N*3/8]`` (the golden code rows), ``k_scales, v_scales:
[B, KVH, CAP, N/G]`` (ue5m3 bytes); plus flags ``[B, KVH, CAP]`` (not read by decode). Rows of one
(batch, kv head) are contiguous, so a 64-token tile of K or V is one contiguous 3.2 KB run.

Requirements: CuPy (``cupy-cuda13x``) and an NVIDIA GPU of compute capability >= 8.0 (tuned for
sm_90). Importing this module needs neither; the functions raise ``RuntimeError`` without them.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

import numpy as np

from sim_models.params import FormatParams, check_supported

__all__ = [
    "EncodedGPU", "KVCache", "decode_attention", "decode_supported", "encode_kv",
    "decode_kernel_params", "SUPPORTED_QUANTIZER",
]

_HERE = os.path.dirname(os.path.abspath(__file__))
_ENCODE_SRC = os.path.join(_HERE, "kv_encode.cu")
_DECODE_SRC = os.path.join(_HERE, "kv_decode_attn.cu")
_lock = threading.Lock()
_modules: dict = {}
_workspaces: dict = {}


def _cupy():
    try:
        import cupy  # noqa: WPS433
    except ImportError as err:  # pragma: no cover - depends on the machine
        raise RuntimeError("gpu_ref needs CuPy (pip install cupy-cuda13x) and an NVIDIA GPU") from err
    return cupy


#: Quantizer fields the kernels implement (docs/ACCURACY.md "Exact integer rules"): the version-1
#: quantizer (midtread, up) and the version-2 one (midrise, nearest), and the two cross terms.
SUPPORTED_QUANTIZER = {
    "mode": ("midtread", "midrise"),
    "scale": ("ue5m3",),
    "scale_rule": ("max",),
    "scale_round": ("up", "nearest"),
    "scale_mult": (None, 256),
}
_MODE_ID = {"midtread": 0, "midrise": 1}
_ROUND_ID = {"up": 0, "nearest": 1}


def _params(params) -> FormatParams:
    """Checked FormatParams (None -> ``FormatParams()``).

    Raises:
        TypeError: not a FormatParams.
        ValueError: a quantizer field outside :data:`SUPPORTED_QUANTIZER`; the message names the field.
    """
    if params is None:
        params = FormatParams()
    return check_supported(params, SUPPORTED_QUANTIZER, "gpu_ref CUDA kernels")


def _kernel(kind: str, targs: tuple, smem: int):
    """Compiled RawKernel for one template instantiation (cached per process and device)."""
    cp = _cupy()
    dev = cp.cuda.Device().id
    key = (kind, targs, dev)
    with _lock:
        k = _modules.get(key)
        if k is None:
            path = _ENCODE_SRC if kind == "encode" else _DECODE_SRC
            with open(path, encoding="utf-8") as f:
                src = f.read()
            name = ("kv_encode" if kind == "encode" else "kv_decode_attn") + "<" + ",".join(targs) + ">"
            mod = cp.RawModule(code=src, options=("-std=c++17", "-DKV_NVRTC", f"-I{_HERE}"), name_expressions=[name])
            k = mod.get_function(name)
            if smem > 48 * 1024:
                k.max_dynamic_shared_size_bytes = smem
            _modules[key] = k
    return k


def _check_cupy_array(name, a, cp):
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{name} must be a cupy.ndarray on the GPU, got {type(a).__name__}")
    if a.device.id != cp.cuda.Device().id:
        raise ValueError(f"{name} is on device {a.device.id}, the current device is {cp.cuda.Device().id}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")


# --------------------------------------------------------------------------------------------
# write path
# --------------------------------------------------------------------------------------------
@dataclass
class EncodedGPU:
    """Encoded vectors on the GPU (cupy arrays), same meaning as :class:`sim_models.Encoded`.

    Attributes:
        codes: uint8 ``[..., N*b/8]`` code plane.
        scales: uint8 ``[..., N/G]`` ue5m3 scale bytes.
        flags: uint8 ``[...]`` FLAG_NAN | FLAG_INF | FLAG_SAT per vector.
    """

    codes: object
    scales: object
    flags: object


#: write-kernel tuning: lanes per thread (128: one thread per N=128 vector; 64: two threads per
#: vector, cross-thread butterflies by shuffles) and CTAs per SM (v6 kernel: 157 registers at
#: 128 lanes, so 3 CTAs = 12 warps per SM fit; see bench/GPU_NOTES.md for the measurements).
ENCODE_TUNE = {"lptm": 128, "minb": 3}


def _encode_cfg(p: FormatParams, tune=None):
    t = dict(ENCODE_TUNE, **(tune or {}))
    lpt = max(min(p.n, int(t["lptm"])), p.n // 32)  # at most 32 threads (one warp) per vector
    if "minb" not in (tune or {}) and p.mant_bits - 1 + int(math.log2(p.n)) > 20:
        t["minb"] = min(int(t["minb"]), 2)  # threshold-compare path: more registers, 3 CTAs/SM would spill
    seed = 0 if p.sign_seed is None else p.sign_seed
    targs = (str(p.n), str(p.block), str(p.bits), str(p.mant_bits), "0" if p.dtype == "fp16" else "1",
             f"{seed}ull", "0" if p.sign_seed is None else "1", str(int(t["lptm"])), str(int(t["minb"])),
             str(_MODE_ID[p.mode]), str(_ROUND_ID[p.scale_round]))
    return targs, 2 * 128 * (lpt * 2 + 16), lpt, int(t["minb"])


def _as_bits(x, p: FormatParams, cp):
    _check_cupy_array("x", x, cp)
    if x.dtype == cp.float16:
        if p.dtype != "fp16":
            raise TypeError(f"float16 input given for dtype={p.dtype!r}; pass uint16 bit patterns")
        x = x.view(cp.uint16)
    elif x.dtype != cp.uint16:
        raise TypeError(f"x must be float16 or uint16 bit patterns ({p.dtype}), got {x.dtype}")
    if x.ndim < 1 or x.shape[-1] != p.n:
        raise ValueError(f"x must have shape [..., N={p.n}], got {list(x.shape)}")
    return x


def _launch_encode(bits, p, codes, scales, flags, rows, cp, tune=None):
    nvec = bits.size // p.n
    if nvec == 0:
        return
    targs, smem, lpt, minb = _encode_cfg(p, tune)
    k = _kernel("encode", targs, smem)
    vpb = 128 // (p.n // lpt)
    ntiles = (nvec + vpb - 1) // vpb
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    grid = int(min(ntiles, minb * sms))
    rows_arg = rows if rows is not None else np.uint64(0)
    k((grid,), (128,), (bits, codes, scales, flags, rows_arg, np.int64(nvec)), shared_mem=smem)


def encode_kv(x, params: FormatParams | None = None) -> EncodedGPU:
    """Encode K or V head vectors on the GPU (write path), bit-exact with :func:`sim_models.encode`.

    Args:
        x: cupy array ``[..., N]`` on the current device, C-contiguous: ``float16`` values
            (``params.dtype == "fp16"``) or ``uint16`` bit patterns of ``params.dtype``
            (fp16 or bf16; CuPy has no bfloat16 dtype, so bf16 always travels as uint16).
            Any number of vectors (no tile-size restriction).
        params: :class:`sim_models.FormatParams` (default ``FormatParams()``: N=128, G=64, b=3,
            M=12, fp16, seed 0, whatever quantizer FormatParams() defaults to). Every N, G, b, M,
            dtype and seed the golden model accepts is supported, with ``mode`` in
            {midtread, midrise}, ``scale_round`` in {up, nearest}, ``scale`` ue5m3, ``scale_rule``
            max, ``scale_mult`` None or 256 (:data:`SUPPORTED_QUANTIZER`); other format-study
            modes/encodings/rules raise ValueError naming the field.

    Returns:
        :class:`EncodedGPU` with cupy arrays ``codes`` uint8 ``[..., N*b/8]``, ``scales`` uint8
        ``[..., N/G]``, ``flags`` uint8 ``[...]`` (leading axes of ``x`` kept).

    Raises:
        TypeError: ``x`` is not a cupy array, or has the wrong dtype; ``params`` has the wrong type.
        ValueError: last axis != N, not C-contiguous, or on another device; unsupported quantizer
            field (checked before CuPy is needed).
        RuntimeError: CuPy is not installed.
    """
    p = _params(params)
    cp = _cupy()
    bits = _as_bits(x, p, cp)
    lead = bits.shape[:-1]
    codes = cp.empty((*lead, p.code_bytes), dtype=cp.uint8)
    scales = cp.empty((*lead, p.n_blocks), dtype=cp.uint8)
    flags = cp.empty(lead, dtype=cp.uint8)
    _launch_encode(bits, p, codes, scales, flags, None, cp)
    return EncodedGPU(codes=codes, scales=scales, flags=flags)


# --------------------------------------------------------------------------------------------
# cache
# --------------------------------------------------------------------------------------------
class KVCache:
    """Packed K/V cache on the GPU in the layout :func:`decode_attention` reads.

    Args:
        batch: number of sequences B.
        kv_heads: KV heads per token.
        capacity: tokens per sequence; rounded up to a multiple of 16.
        params: format (decode needs bits=3, N in {64, 128, 256}, G in {16, 32, 64}; quantizer in
            :data:`SUPPORTED_QUANTIZER`, else ValueError naming the field).

    Attributes:
        k_codes, v_codes: uint8 ``[B, KVH, CAP, N*3/8]``; k_scales, v_scales: uint8
        ``[B, KVH, CAP, N/G]``; k_flags, v_flags: uint8 ``[B, KVH, CAP]``;
        lengths: int32 cupy ``[B]`` tokens written per sequence (host copy in ``host_lengths``).
    """

    def __init__(self, batch: int, kv_heads: int, capacity: int, params: FormatParams | None = None):
        p = _check_decode(params)
        for name, v in (("batch", batch), ("kv_heads", kv_heads), ("capacity", capacity)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        cp = _cupy()
        cap = (int(capacity) + 15) // 16 * 16
        self.params = p
        self.batch, self.kv_heads, self.capacity = int(batch), int(kv_heads), cap
        shp = (self.batch, self.kv_heads, cap)
        self.k_codes = cp.zeros((*shp, p.code_bytes), cp.uint8)
        self.v_codes = cp.zeros((*shp, p.code_bytes), cp.uint8)
        self.k_scales = cp.ones((*shp, p.n_blocks), cp.uint8)
        self.v_scales = cp.ones((*shp, p.n_blocks), cp.uint8)
        self.k_flags = cp.zeros(shp, cp.uint8)
        self.v_flags = cp.zeros(shp, cp.uint8)
        self.host_lengths = np.zeros(self.batch, dtype=np.int64)
        self.lengths = cp.zeros(self.batch, dtype=cp.int32)

    def append(self, k, v):
        """Encode and append ``T`` tokens to every sequence at its current length.

        Args:
            k, v: cupy ``[B, T, KVH, N]`` float16 or uint16 bit patterns of ``params.dtype``.

        Raises:
            ValueError: shapes do not match the cache, or a sequence would exceed the capacity.
            TypeError: wrong array type or dtype.
        """
        cp = _cupy()
        p = self.params
        kb, vb = _as_bits(k, p, cp), _as_bits(v, p, cp)
        if kb.shape != vb.shape or kb.ndim != 4 or kb.shape[0] != self.batch or kb.shape[2] != self.kv_heads:
            raise ValueError(f"k and v must both be [B={self.batch}, T, KVH={self.kv_heads}, N={p.n}], "
                             f"got {list(kb.shape)} and {list(vb.shape)}")
        t = kb.shape[1]
        if np.any(self.host_lengths + t > self.capacity):
            raise ValueError(f"appending {t} tokens exceeds the capacity {self.capacity}")
        bidx = cp.arange(self.batch, dtype=cp.int64)[:, None, None]
        tidx = cp.arange(t, dtype=cp.int64)[None, :, None]
        hidx = cp.arange(self.kv_heads, dtype=cp.int64)[None, None, :]
        start = cp.asarray(self.host_lengths, dtype=cp.int64)[:, None, None]
        rows = ((bidx * self.kv_heads + hidx) * self.capacity + start + tidx).ravel()
        for bits, codes, scales, flags in ((kb, self.k_codes, self.k_scales, self.k_flags),
                                           (vb, self.v_codes, self.v_scales, self.v_flags)):
            _launch_encode(bits, p, codes, scales, flags, rows, cp)
        self.host_lengths += t
        self.lengths = cp.asarray(self.host_lengths, dtype=cp.int32)

    def attend(self, q, **kw):
        """:func:`decode_attention` over this cache (lengths = the current lengths)."""
        kw.setdefault("lengths", self.host_lengths)
        return decode_attention(q, self.k_codes, self.k_scales, self.v_codes, self.v_scales,
                                params=self.params, **kw)


# --------------------------------------------------------------------------------------------
# decode attention
# --------------------------------------------------------------------------------------------
_DECODE_N = (64, 128, 256)
_DECODE_G = (16, 32, 64)
_TT = 64
_MAX_SPLITS = 128  # the split merge stages (m, l) of all splits in shared memory


def decode_supported(p: FormatParams) -> bool:
    """True when :func:`decode_attention` has a kernel for these parameters (shape and quantizer).

    Raises:
        TypeError: ``p`` is not a FormatParams.
    """
    if not isinstance(p, FormatParams):
        raise TypeError(f"params must be a sim_models.FormatParams, got {type(p).__name__}")
    quant_ok = all(getattr(p, f) in allowed for f, allowed in SUPPORTED_QUANTIZER.items())
    return quant_ok and p.bits == 3 and p.n in _DECODE_N and p.block in _DECODE_G and p.block <= p.n


def _decode_stages(n: int) -> int:
    return {64: 4, 128: 3, 256: 2}[n]


def _decode_smem(p: FormatParams, stages: int) -> int:
    cb, nb = p.code_bytes, p.n_blocks
    stb = 2 * _TT * cb + 2 * _TT * nb
    wraw = stages * stb + 16 + 2 * nb * 64 * 4
    wreg = (max(wraw, 8 * p.n * 4) + 15) // 16 * 16
    return 4 * wreg + 8 * p.n * 4 + (32 + 32 + 4 + 8 + 8 + 4) * 4 + 256 * 4  # + ue5m3 table


#: decode tuning defaults: CTAs per SM for the register budget, q~ low part on/off, ablation
#: (profiling only: 1 = no PV, 2 = no QK; gives wrong results).
DECODE_TUNE = {"minb": 2, "qlo": 1, "abl": 0}


def _check_decode(params) -> FormatParams:
    """``params`` (default FormatParams()) if the decode kernel supports it; ValueError naming
    the unsupported field otherwise (before CuPy is needed)."""
    p = _params(params)
    if not decode_supported(p):
        raise ValueError(f"decode_attention supports bits=3, n in {_DECODE_N}, block in {_DECODE_G}; got "
                         f"bits={p.bits}, n={p.n}, block={p.block}")
    return p


def decode_kernel_params(p: FormatParams, precise_p: bool = False, stages: int | None = None, tune=None):
    """(template arguments, dynamic shared memory bytes, CTAs per SM) of the decode kernel.

    Raises:
        TypeError, ValueError: parameters the decode kernel does not support (see
        :func:`decode_attention`).
    """
    p = _check_decode(p)
    t = dict(DECODE_TUNE, **(tune or {}))
    st = int(t.get("stages") or stages or _decode_stages(p.n))
    seed = 0 if p.sign_seed is None else p.sign_seed
    targs = (str(p.n), str(p.block), "1" if precise_p else "0", str(st), f"{seed}ull",
             "0" if p.sign_seed is None else "1", str(int(t["minb"])), str(int(t["qlo"])), str(int(t["abl"])),
             str(_MODE_ID[p.mode]))
    return targs, _decode_smem(p, st), int(t["minb"])


def _workspace(cp, key, nbytes_acc, n_ml, n_cnt):
    ws = _workspaces.get(key)
    if ws is None or ws[0].size < nbytes_acc or ws[1].size < n_ml or ws[2].size < n_cnt:
        ws = (cp.empty(max(nbytes_acc, 1), cp.float32), cp.empty(max(n_ml, 1), cp.float32),
              cp.zeros(max(n_cnt, 1), cp.int32))
        _workspaces[key] = ws
    return ws


def decode_attention(q, k_codes, k_scales, v_codes, v_scales, lengths, params: FormatParams | None = None,
                     *, scale: float | None = None, out_dtype: str | None = None,
                     num_splits: int | None = None, precise_p: bool = False, max_length: int | None = None,
                     stages: int | None = None, out=None, tune: dict | None = None):
    """Single-token decode attention straight from the packed cache (fused, split-KV).

    Computes, per sequence b and query head h (kv head ``h // (Hq // KVH)``),
    ``softmax(scale * q . k_hat_t) @ v_hat_t`` over tokens ``t < lengths[b]``, where
    ``k_hat, v_hat`` are the golden-model reconstructions (:func:`sim_models.decode_float`) of the
    cached codes; nothing but the packed bytes is read and no fp16 K/V is written anywhere.

    Args:
        q: cupy ``[B, Hq, N]``, C-contiguous: float16, or uint16 bf16 bit patterns.
        k_codes, v_codes: cupy uint8 ``[B, KVH, CAP, N*3/8]``; k_scales, v_scales: cupy uint8
            ``[B, KVH, CAP, N/G]`` (see the module docstring; :class:`KVCache` makes them).
            CAP must be a multiple of 16, the planes 16-byte aligned and C-contiguous.
        lengths: tokens per sequence, ``[B]``: a host sequence/NumPy array (checked against CAP), or
            a cupy int32 array (then checked with one device->host copy unless ``max_length`` is
            given, in which case the caller guarantees ``lengths <= max_length``; the kernel still
            clamps to CAP so it never reads outside the planes). A length of 0 gives zeros.
        params: format (default ``FormatParams()``); needs bits=3, N in {64, 128, 256},
            G in {16, 32, 64}, mode midtread (``c * scale``) or midrise (``(2c+1) * scale / 2``);
            the scale rounding does not matter to the read path, but must be one the write path
            supports (:data:`SUPPORTED_QUANTIZER`).
        scale: softmax scale (default ``1/sqrt(N)``).
        out_dtype: ``"fp16"`` (float16), ``"bf16"`` (uint16 bit patterns) or ``"fp32"``;
            default: the type of ``q``.
        num_splits: split-KV factor (default: enough CTAs for one wave on this GPU).
        precise_p: also split the softmax weights into two fp16 parts (slower, ~1e-6 error).
        stages: cp.async pipeline depth (tuning; default by N).
        out: optional preallocated output (cupy, right shape and dtype).
        tune: kernel variant for benchmarks (see ``DECODE_TUNE``).

    Returns:
        cupy ``[B, Hq, N]`` in ``out_dtype``.

    Raises:
        TypeError: a non-cupy argument or a wrong dtype.
        ValueError: shape mismatch (incl. N not a power of two, e.g. head_dim 80, or q's last axis
            != params.n), Hq not a multiple of KVH, CAP not a multiple of 16, lengths outside
            [0, CAP], unsupported parameters, arrays on another device or not contiguous.
        RuntimeError: CuPy missing.
    """
    p = _check_decode(params)
    cp = _cupy()
    _check_cupy_array("q", q, cp)
    if q.ndim != 3:
        raise ValueError(f"q must be [B, Hq, N], got {list(q.shape)}")
    hd = q.shape[-1]
    if hd != p.n:
        extra = "" if hd > 0 and hd & (hd - 1) == 0 else " (head_dim must be a power of two)"
        raise ValueError(f"q head_dim {hd} != params.n {p.n}{extra}")
    if q.dtype == cp.float16:
        q_bf16 = 0
    elif q.dtype == cp.uint16:
        q_bf16 = 1
    else:
        raise TypeError(f"q must be float16 or uint16 (bf16 bit patterns), got {q.dtype}")
    bsz, hq, _ = q.shape
    planes = (("k_codes", k_codes, p.code_bytes), ("k_scales", k_scales, p.n_blocks),
              ("v_codes", v_codes, p.code_bytes), ("v_scales", v_scales, p.n_blocks))
    shp = None
    for name, a, w in planes:
        _check_cupy_array(name, a, cp)
        if a.dtype != cp.uint8:
            raise TypeError(f"{name} must be uint8, got {a.dtype}")
        if a.ndim != 4 or a.shape[-1] != w:
            raise ValueError(f"{name} must be [B, KVH, CAP, {w}], got {list(a.shape)}")
        if shp is None:
            shp = a.shape[:3]
        elif a.shape[:3] != shp:
            raise ValueError(f"{name} shape {list(a.shape)} does not match the other planes {list(shp)}")
        if a.data.ptr % 16:
            raise ValueError(f"{name} must be 16-byte aligned")
    b2, kvh, cap = shp
    if b2 != bsz:
        raise ValueError(f"q batch {bsz} != cache batch {b2}")
    if cap % 16:
        raise ValueError(f"cache capacity {cap} must be a multiple of 16")
    if hq % kvh:
        raise ValueError(f"q heads {hq} must be a multiple of kv heads {kvh}")
    group = hq // kvh
    # lengths
    if isinstance(lengths, cp.ndarray):
        if lengths.shape != (bsz,):
            raise ValueError(f"lengths must be [B={bsz}], got {list(lengths.shape)}")
        if max_length is None:
            host = cp.asnumpy(lengths).astype(np.int64)
        else:
            host = None
        dev_len = lengths.astype(cp.int32, copy=False)
        if not dev_len.flags.c_contiguous:
            dev_len = cp.ascontiguousarray(dev_len)
    else:
        host = np.asarray(lengths)
        if host.shape != (bsz,) or not np.issubdtype(host.dtype, np.integer):
            raise ValueError(f"lengths must be {bsz} integers, got {host!r}")
        host = host.astype(np.int64)
        dev_len = None
    if host is not None:
        if host.min(initial=0) < 0 or host.max(initial=0) > cap:
            raise ValueError(f"lengths must be in [0, capacity={cap}], got min {host.min()} max {host.max()}")
        maxlen = int(host.max(initial=0))
        if dev_len is None:
            dev_len = cp.asarray(host, dtype=cp.int32)
    else:
        if not 0 <= int(max_length) <= cap:
            raise ValueError(f"max_length must be in [0, capacity={cap}], got {max_length}")
        maxlen = int(max_length)
    # output
    odt = out_dtype or ("bf16" if q_bf16 else "fp16")
    kinds = {"fp16": (0, cp.float16), "bf16": (1, cp.uint16), "fp32": (2, cp.float32)}
    if odt not in kinds:
        raise ValueError(f"out_dtype must be one of {tuple(kinds)}, got {odt!r}")
    okind, ocp = kinds[odt]
    if out is None:
        out = cp.empty((bsz, hq, p.n), dtype=ocp)
    else:
        _check_cupy_array("out", out, cp)
        if out.shape != (bsz, hq, p.n) or out.dtype != ocp:
            raise ValueError(f"out must be {ocp.__name__} [{bsz}, {hq}, {p.n}]")
    if scale is None:
        scale = 1.0 / math.sqrt(p.n)
    # work split
    ht = (group + 7) // 8
    pairs = bsz * kvh * ht
    targs, smem, minb = decode_kernel_params(p, precise_p, stages, tune)
    k = _kernel("decode", targs, smem)
    if num_splits is None:
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        per_sm = max(1, min(minb, (227 * 1024) // (smem + 1024)))
        slots = sms * per_sm
        # >= 2 tiles per warp: at 4K/B=1, 8 splits ran 2 % faster than 16 (bench/GPU_NOTES.md, round 4)
        max_split = max(1, -(-maxlen // (_TT * 4 * 2)))
        num_splits = max(1, min(slots // pairs, max_split)) if pairs < slots else 1
    num_splits = int(num_splits)
    if not 1 <= num_splits <= _MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {_MAX_SPLITS}], got {num_splits}")
    chunk = -(-max(maxlen, 1) // num_splits)
    chunk = -(-chunk // _TT) * _TT
    num_splits = max(1, -(-max(maxlen, 1) // chunk))
    acc_ws, ml_ws, cnt_ws = _workspace(cp, cp.cuda.Device().id, pairs * num_splits * 8 * p.n,
                                       pairs * num_splits * 16, pairs)
    k((num_splits, kvh * ht, bsz), (128,),
      (q, np.int32(q_bf16), k_codes, k_scales, v_codes, v_scales, dev_len, acc_ws, ml_ws, cnt_ws,
       out, np.int32(okind), np.int32(hq), np.int32(kvh), np.int32(ht), np.int32(group), np.int64(cap),
       np.int32(num_splits), np.int32(chunk), np.float32(scale)),
      shared_mem=smem)
    return out
