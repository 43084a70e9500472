"""Write path: fp16/bf16 K or V head vectors -> code plane, scale plane, flags (``kv_encode.cu``).

Bit-exact with :func:`sim_models.encode` for every input and every :class:`sim_models.FormatParams`
the golden model accepts whose quantizer is in :data:`gpu_ref.SUPPORTED_QUANTIZER`.
Also: :func:`center_scale_keys`, the key-side cache policy (per-channel power-of-two key scales,
then centering), one fused elementwise pass in front of the write kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim_models.params import FormatParams

from ._build import MODE_ID, ROUND_ID, check_cupy_array, checked_params, cupy, kernel


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


def encode_cfg(p: FormatParams, tune=None):
    """(template arguments, dynamic shared memory bytes, lanes per thread, CTAs per SM)."""
    t = dict(ENCODE_TUNE, **(tune or {}))
    lpt = max(min(p.n, int(t["lptm"])), p.n // 32)  # at most 32 threads (one warp) per vector
    if "minb" not in (tune or {}) and p.mant_bits - 1 + int(math.log2(p.n)) > 20:
        t["minb"] = min(int(t["minb"]), 2)  # threshold-compare path: more registers, 3 CTAs/SM would spill
    seed = 0 if p.sign_seed is None else p.sign_seed
    targs = (str(p.n), str(p.block), str(p.bits), str(p.mant_bits), "0" if p.dtype == "fp16" else "1",
             f"{seed}ull", "0" if p.sign_seed is None else "1", str(int(t["lptm"])), str(int(t["minb"])),
             str(MODE_ID[p.mode]), str(ROUND_ID[p.scale_round]))
    return targs, 2 * 128 * (lpt * 2 + 16), lpt, int(t["minb"])


def as_bits(x, p: FormatParams, cp, name: str = "x"):
    """``x`` as uint16 bit patterns of ``p.dtype`` (float16 viewed), last axis checked against N."""
    check_cupy_array(name, x, cp)
    if x.dtype == cp.float16:
        if p.dtype != "fp16":
            raise TypeError(f"float16 {name} given for dtype={p.dtype!r}; pass uint16 bit patterns")
        x = x.view(cp.uint16)
    elif x.dtype != cp.uint16:
        raise TypeError(f"{name} must be float16 or uint16 bit patterns ({p.dtype}), got {x.dtype}")
    if x.ndim < 1 or x.shape[-1] != p.n:
        raise ValueError(f"{name} must have shape [..., N={p.n}], got {list(x.shape)}")
    return x


def launch_encode(bits, p, codes, scales, flags, rows, cp, tune=None):
    """Encode ``bits`` (uint16 [V, N] contiguous) into rows ``rows`` (int64 [V] or None: row v) of the
    planes ``codes``/``scales``/``flags`` (any shapes whose rows are the last axes)."""
    nvec = bits.size // p.n
    if nvec == 0:
        return
    targs, smem, lpt, minb = encode_cfg(p, tune)
    k = kernel("encode", targs, smem)
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
        params: :class:`sim_models.FormatParams` (default ``FormatParams()``). Every N, G, b, M,
            dtype and seed the golden model accepts, with the quantizer in
            :data:`gpu_ref.SUPPORTED_QUANTIZER`; other modes/encodings/rules raise ValueError
            naming the field.

    Returns:
        :class:`EncodedGPU`: ``codes`` uint8 ``[..., N*b/8]``, ``scales`` uint8 ``[..., N/G]``,
        ``flags`` uint8 ``[...]`` (leading axes of ``x`` kept).

    Raises:
        TypeError: ``x`` is not a cupy array, or has the wrong dtype; ``params`` has the wrong type.
        ValueError: last axis != N, not C-contiguous, or on another device; unsupported quantizer
            field (checked before CuPy is needed).
        RuntimeError: CuPy is not installed.
    """
    p = checked_params(params)
    cp = cupy()
    bits = as_bits(x, p, cp)
    lead = bits.shape[:-1]
    codes = cp.empty((*lead, p.code_bytes), dtype=cp.uint8)
    scales = cp.empty((*lead, p.n_blocks), dtype=cp.uint8)
    flags = cp.empty(lead, dtype=cp.uint8)
    launch_encode(bits, p, codes, scales, flags, None, cp)
    return EncodedGPU(codes=codes, scales=scales, flags=flags)


_CENTER_PRE = r"""
__device__ __forceinline__ float kvc_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short kvc_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
"""
_CENTER_SRC = r"""
unsigned short hb = x;
float f = kvc_h2f(hb);
unsigned short out = hb;                         // NaN / inf lanes pass unchanged
if (isfinite(f)) {
  unsigned short th = kvc_f2h(f * s);             // RN16(k * s): exact unless over/underflow
  float t = kvc_h2f(th);
  if (!isfinite(t)) {
    out = th;                                     // overflow -> +-inf, passed on
  } else {
    float d = t - mu;                             // fp32 difference of two fp16 values, then one
    unsigned short r = kvc_f2h(d);                // more rounding: innocuous (24 >= 2 * 11 + 2)
    if ((r & 0x7FFFu) == 0x7C00u) r = (r & 0x8000u) | 0x7BFFu;  // saturate, as round_to_input_type
    out = r;
  }
}
y = out;
"""
_center_kernel = None


def center_scale_keys(k, mu=None, key_scale=None):
    """Key-side cache policy in one fused pass: ``RNE(RN16(k * s) - RN16(mu * s))`` per lane.

    Matches the golden rule (:func:`sim_models.center.center` applied to ``RN16(k * s)`` with
    ``mu' = RN16(mu * s)``, as bench/accuracy.py forms it); ``s`` = 1 and/or ``mu`` = 0 when not
    given. NaN/inf lanes pass unchanged (an overflow of ``k * s`` becomes inf); results beyond fp16
    max saturate. fp16 only.

    Args:
        k: cupy float16/uint16 ``[..., KVH, N]``.
        mu: cupy float32 ``[KVH, N]`` holding ``RN16(mu * s)`` (fp16 values), or None.
        key_scale: cupy float32 ``[KVH, N]`` powers of two, or None.

    Returns:
        cupy uint16 ``k.shape``.
    """
    global _center_kernel
    cp = cupy()
    if _center_kernel is None:
        _center_kernel = cp.ElementwiseKernel("uint16 x, float32 s, float32 mu", "uint16 y", _CENTER_SRC,
                                              "kv_center_scale_keys", preamble=_CENTER_PRE)
    kb = k.view(cp.uint16) if k.dtype == cp.float16 else k
    shp = kb.shape[-2:]
    s = key_scale if key_scale is not None else cp.ones(shp, cp.float32)
    m = mu if mu is not None else cp.zeros(shp, cp.float32)
    return _center_kernel(kb, s, m)
