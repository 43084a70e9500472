"""Write path: fp16/bf16 K or V head vectors -> code plane, scale plane, flags (``kv_encode.cu``).

Bit-exact with :func:`sim_models.encode` for every input and every :class:`sim_models.FormatParams`
the golden model accepts whose quantizer is in :data:`gpu_ref.SUPPORTED_QUANTIZER`.
The key side of the cache policy (per-channel power-of-two key scales s = 2^e, then centering by mu)
runs inside the write kernel, in registers (:class:`KeyFront`, built by :func:`key_table`): keys are
encoded by the folded key front end of docs/FORMAT.md 8, ``k 2^e - mu'`` inside block floating point
with ``mu' = RN16(mu 2^e)`` and no fp16 rounding per lane, bit-exact with
:func:`sim_models.codec.encode_folded` (the same integer steps). :func:`key_front` gives rows that are
not encoded (fp16 sink tokens, the recent ring) in the front end's domain by the fp16 rule
``RNE16(sat(RN16(k s)) - mu')`` of :func:`sim_models.keyscale.key_front`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim_models.params import FormatParams

from ._build import ENCODE_ARGS, MODE_ID, ROUND_ID, check_cupy_array, checked_params, cupy, kernel, kernel_struct
from .layout import LAYOUTS


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
#: vector, cross-thread butterflies by shuffles) and CTAs per SM (at 128 lanes per thread the kernel's
#: registers let 3 CTAs = 12 warps share an SM).
ENCODE_TUNE = {"lptm": 128, "minb": 3}


@dataclass(frozen=True)
class KeyFront:
    """Key front end of the write kernel (kv_encode.cu, template KEYF).

    Attributes:
        table: cupy uint32 ``[chunks, heads, 4]``: 16-byte entries holding the fp16x2 words of s and/or
            mu' for the lane pairs of one chunk of one kv head (layout in kv_encode.cu).
        heads: kv heads (table rows); input vector v uses head ``v % heads``.
        keyf: 1 key scales, 2 centering, 3 both.
    """

    table: object
    heads: int
    keyf: int


def key_table(n: int, mu16=None, s16=None, cp=None) -> KeyFront | None:
    """:class:`KeyFront` for fp16 keys of head dimension ``n``, or None when neither is given.

    Args:
        n: head dimension N.
        mu16: NumPy float16 ``[KVH, N]`` centering vectors (unscaled: the table holds
            ``sim_models.keyscale.front_table(mu, log2 s)``, the golden rule's ``RN16(mu s)``), or None.
        s16: NumPy float16 ``[KVH, N]`` per-channel key scales (powers of two), or None.
        cp: the cupy module (default: imported; NumPy works for inspecting the table).
    """
    from sim_models.keyscale import LOG2_S_RANGE, front_table
    if mu16 is None and s16 is None:
        return None
    if s16 is not None:
        sv = np.asarray(s16, np.float16).astype(np.float64)
        e = np.log2(np.where(sv > 0, sv, 1.0))
        lo, hi = LOG2_S_RANGE
        if not ((sv > 0).all() and np.isfinite(sv).all() and (e == np.round(e)).all()
                and e.min() >= lo and e.max() <= hi):
            raise ValueError(f"s16 must hold powers of two 2^e with e in [{lo}, {hi}]")
    if mu16 is not None and not np.isfinite(np.asarray(mu16, np.float16)).all():
        raise ValueError("mu16 must be finite")
    cp = cp or cupy()
    p = FormatParams(n=n, block=min(64, n))
    words = []
    if s16 is not None:
        words.append(np.ascontiguousarray(s16, np.float16).view(np.uint32))            # [KVH, N/2]
    if mu16 is not None:
        m = mu16 if s16 is None else front_table(np.ascontiguousarray(mu16, np.float16),
                                                 np.log2(s16.astype(np.float64)).astype(np.int8), p).view(np.float16)
        words.append(np.ascontiguousarray(m, np.float16).view(np.uint32))
    heads = words[0].shape[0]
    w = np.stack(words, axis=-1).reshape(heads, -1, 4)                                  # [KVH, chunks, 4]
    keyf = (1 if s16 is not None else 0) | (2 if mu16 is not None else 0)
    return KeyFront(table=cp.asarray(np.ascontiguousarray(w.transpose(1, 0, 2))), heads=heads, keyf=keyf)


def encode_cfg(p: FormatParams, tune=None, keyf: int = 0, layout: str = "wire"):
    """(template arguments, dynamic shared memory bytes, lanes per thread, CTAs per SM); ``layout``: order of
    the code rows written ("wire", or "vpair" of :mod:`gpu_ref.layout` for 3-bit codes)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "vpair" and p.bits != 3:
        raise ValueError(f"layout 'vpair' is defined for 3-bit codes, got bits={p.bits}")
    t = dict(ENCODE_TUNE, **(tune or {}))
    lpt = max(min(p.n, int(t["lptm"])), p.n // 32)  # at most 32 threads (one warp) per vector
    if layout == "vpair" and lpt % 64:
        raise ValueError(f"layout 'vpair' needs >= 64 lanes per thread (tune['lptm']), got {lpt}")
    if "minb" not in (tune or {}) and p.mant_bits - 1 + int(math.log2(p.n)) > 20:
        t["minb"] = min(int(t["minb"]), 2)  # threshold-compare path: more registers, 3 CTAs/SM would spill
    seed = 0 if p.sign_seed is None else p.sign_seed
    targs = (str(p.n), str(p.block), str(p.bits), str(p.mant_bits), "0" if p.dtype == "fp16" else "1",
             f"{seed}ull", "0" if p.sign_seed is None else "1", str(int(t["lptm"])), str(int(t["minb"])),
             str(MODE_ID[p.mode]), str(ROUND_ID[p.scale_round]), str(int(keyf)), "1" if layout == "vpair" else "0")
    return targs, encode_smem(lpt), lpt, int(t["minb"])


def encode_smem(lpt: int) -> int:
    """Dynamic shared memory of kv_encode: two input tiles of 128 padded rows, two tiles of output rows."""
    return 2 * 128 * (lpt * 2 + 16) + 2 * 128 * 8


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


def launch_encode(bits, p, codes, scales, flags, rows, cp, tune=None, key: KeyFront | None = None,
                  layout: str = "wire", pair_vec: int = 1):
    """Encode ``bits`` (uint16 [V, N] contiguous) into rows ``rows`` (int64 [V] or None: row v) of the
    planes ``codes``/``scales``/``flags`` (any shapes whose rows are the last axes); ``key``: the key
    front end (vector v uses kv head ``v % key.heads``; fp16 only, V < 2^32); ``layout``: "vpair" writes
    the code rows in the token-pair order of :mod:`gpu_ref.layout` (row r pairs with r ^ 1, so the code
    plane must hold an even number of rows); ``pair_vec``: the input vectors from one token of a row pair to
    the other (KVH for ``[B, T, KVH, N]`` input), a hint that lets the two writers of a pair exchange bytes and
    store whole words (any value is correct; a wrong one only takes the slower 2-byte stores)."""
    nvec = bits.size // p.n
    if nvec == 0:
        return
    if key is not None and (p.dtype != "fp16" or nvec >= 1 << 32):
        raise ValueError(f"the key front end needs dtype fp16 and < 2^32 vectors, got {p.dtype!r}, {nvec}")
    targs, smem, lpt, minb = encode_cfg(p, tune, key.keyf if key is not None else 0, layout)
    if layout == "vpair" and (codes.size // p.code_bytes) % 2:
        raise ValueError(f"layout 'vpair' needs an even number of code rows, got {codes.size // p.code_bytes}")
    k = kernel("encode", targs, smem)
    vpb = 128 // (p.n // lpt)
    ntiles = (nvec + vpb - 1) // vpb
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    grid = int(min(ntiles, minb * sms))
    args = kernel_struct(ENCODE_ARGS, x=bits, codes=codes, scales=scales, flags=flags, out_rows=rows,
                         key_tab=None if key is None else key.table, nvec=nvec,
                         key_heads=1 if key is None else key.heads, pair_vec=int(pair_vec))
    k((grid,), (128,), (args,), shared_mem=smem)


def key_front(bits, key: KeyFront, cp=None, out=None):
    """Rows that are not encoded (sink tokens, the recent ring) in the key front end's domain: the fp16
    rule of :func:`sim_models.keyscale.key_front` (kv_encode.cu ``key_front_pair``) on fp16 rows, uint16
    ``[..., KVH, N]`` -> uint16, same shape.

    ``out``: a C-contiguous 16-bit array of that shape to write (allocated by the caller: no CuPy
    allocation then, as inside a CUDA graph capture, which CuPy's pool refuses); None: a new one."""
    cp = cp or cupy()
    bits = cp.ascontiguousarray(bits)
    if bits.ndim < 2 or bits.shape[-2] != key.heads:
        raise ValueError(f"rows must be [..., KVH={key.heads}, N], got {list(bits.shape)}")
    n = bits.shape[-1]
    if out is None:
        out = cp.empty_like(bits)
    elif out.shape != bits.shape or out.dtype.itemsize != 2 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous 16-bit array of shape {list(bits.shape)}, got "
                         f"{out.dtype} {list(out.shape)}")
    nwords = bits.size // 2
    if nwords:
        k = kernel("key_front", (str(n), str(key.keyf)), 0)
        grid = int(min((nwords + 255) // 256, 4096))
        k((grid,), (256,), (bits.view(cp.uint32), out.view(cp.uint32), key.table, np.int64(nwords),
                            np.int64(key.heads)))
    return out


def encode_kv(x, params: FormatParams | None = None, key: KeyFront | None = None) -> EncodedGPU:
    """Encode K or V head vectors on the GPU (write path), bit-exact with :func:`sim_models.encode`.

    Args:
        x: cupy array ``[..., N]`` on the current device, C-contiguous: ``float16`` values
            (``params.dtype == "fp16"``) or ``uint16`` bit patterns of ``params.dtype``
            (fp16 or bf16; CuPy has no bfloat16 dtype, so bf16 always travels as uint16).
        params: :class:`sim_models.FormatParams` (default ``FormatParams()``). Every N, G, b, M,
            dtype and seed the golden model accepts, with the quantizer in
            :data:`gpu_ref.SUPPORTED_QUANTIZER`; other modes/encodings/rules raise ValueError
            naming the field.
        key: optional key front end (:func:`key_table`; fp16): ``x`` is ``[..., KVH, N]`` keys, encoded
            by the folded key front end (:func:`sim_models.codec.encode_folded` with kv head h's
            ``RN16(mu s)`` and ``log2 s``).

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
    if key is not None and (bits.ndim < 2 or bits.shape[-2] != key.heads):
        raise ValueError(f"with a key front end x must be [..., KVH={key.heads}, N], got {list(bits.shape)}")
    launch_encode(bits, p, codes, scales, flags, None, cp, key=key)
    return EncodedGPU(codes=codes, scales=scales, flags=flags)
