"""KV-cache formats other projects ship, as fake quantizers of the accuracy study.

Each class here is a quantizer of one K or V stream of one layer (the role a
``sim_models.FormatParams`` or a :class:`bench.accuracy.kvquant.Baseline` plays), written from
the format's public description (cited per class). Every peer reports the bytes it stores per
(token, kv head) vector at the evaluated context (:meth:`Peer.vector_bytes`: codes, scales,
zero points, norms, full-precision residual tokens, per-tensor scales), so the study counts
bits the same way for them as for its own formats; ``slot_align`` is the byte alignment of a
(token, head) slot holding K and V together, where the format pads one.

Peers (the configurations built from them are in bench/accuracy/configs.py, group "peer"):

* :class:`FP8PerTensor`: fp8 e4m3 with one scale per tensor, vLLM's ``kv_cache_dtype="fp8"``
  without calibration (all scales 1.0). https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/
* :class:`BF16`: K/V kept in bf16 (layers a peer leaves uncompressed).
* :class:`TurboQuantKey`, :class:`UniformAsym`: vLLM's TurboQuant presets
  (``--kv-cache-dtype turboquant_3bit_nc`` / ``turboquant_k3v4_nc``): keys stored as their
  fp16 norm and 3-bit Lloyd-Max codes of the unit vector after an orthonormal Sylvester
  Hadamard rotation (codebook for N(0, 1/d)), with norm correction (the decoded centroid
  vector renormalized to unit length); values asymmetric uniform per (token, head) with fp16
  scale and minimum; the first and last two layers uncompressed. Sources:
  https://docs.vllm.ai/en/latest/api/vllm/model_executor/layers/quantization/turboquant/ and
  vLLM's vllm/model_executor/layers/quantization/turboquant/config.py (presets, byte layout,
  boundary layers) and vllm/v1/attention/ops/triton_turboquant_store.py (the store).
* :class:`Octave`: vLLM's Octave format (``octave_k3v3_compact``, ``octave_k3v3``): random sign
  flips and an orthonormal Walsh-Hadamard transform per block, nearest Lloyd-Max N(0, 1)
  code (int8 tables) of the block divided by its RMS, one fp16 scale per block chosen so that
  ``x . x_hat = |x|^2`` (inner-product preserving), slots padded to 4 (compact) or 8 bytes.
  https://docs.vllm.ai/en/latest/api/vllm/v1/attention/ops/rocm_octave/
* :class:`KiviKey`, :class:`KiviValue`: KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit
  Quantization for KV Cache", ICML 2024, arXiv:2402.02750; github.com/jy-yuan/KIVI): keys
  quantized per channel over groups of ``group`` tokens once ``residual`` new tokens have
  accumulated, values per token over groups of ``group`` channels once they leave the window
  of the ``residual`` most recent tokens; asymmetric min/max with fp16 scale and minimum;
  tokens not yet quantized stay fp16. Which tokens are still full precision depends on the
  query position (:meth:`Peer.full_mask`), so the study's attention mixes the two per query
  (bench.accuracy.attention).

INT4 per (token, head) with asymmetric min/max and fp16 scale and minimum, as LMDeploy's
``quant_policy=4`` stores it (https://lmdeploy.readthedocs.io/en/latest/quantization/kv_quant.html),
is the study's ``int4-asym`` baseline (bench.accuracy.kvquant.Baseline).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sim_models.lloyd_max import gaussian_lloyd_max
from sim_models.signs import sign_mask

#: Largest finite fp8 e4m3fn magnitude.
E4M3_MAX = 448.0


def _f16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


def lloyd_max_levels(bits: int) -> np.ndarray:
    """All 2^bits Lloyd-Max levels of N(0, 1), ascending, float64."""
    pos = np.array(gaussian_lloyd_max(1 << bits))
    return np.concatenate([-pos[::-1], pos])


def hadamard_orth(n: int) -> np.ndarray:
    """Orthonormal Sylvester Hadamard matrix H / sqrt(n), float64 [n, n] (symmetric)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"head_dim must be a power of two for a Hadamard rotation, got {n}")
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(n)


def _nearest(y: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Index of the nearest level (ties upward), as a bucketize on the midpoints."""
    return np.searchsorted((levels[1:] + levels[:-1]) / 2, y, side="right")


class Peer:
    """A peer quantizer of one K or V stream (module docstring)."""

    #: Byte alignment of a (token, head) slot holding K and V (1: none).
    slot_align = 1
    #: Whether some cached tokens stay unquantized for some queries (:meth:`full_mask`).
    windowed = False

    def roundtrip(self, x: np.ndarray) -> np.ndarray:
        """float32 [B, H, T, D] -> reconstruction float32 [B, H, T, D] (every token
        quantized; for windowed peers the tokens :meth:`full_mask` keeps are read from the
        original instead)."""
        raise NotImplementedError

    def vector_bytes(self, head_dim: int, context: int, n_kv_heads: int) -> float:
        """Average stored bytes per (token, kv head) vector of a ``context``-token sequence."""
        raise NotImplementedError

    def full_mask(self, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray | None:
        """bool [Q, K]: where the query at q_pos reads the key/value at k_pos unquantized
        (fp16), or None when every cached token is quantized."""
        return None

    def spec(self) -> dict:
        return {"peer": type(self).__name__, **asdict(self)}


@dataclass(frozen=True)
class BF16(Peer):
    """Stored in bf16 (round to nearest even)."""

    def roundtrip(self, x):
        import torch
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(
            torch.bfloat16).float().numpy()

    def vector_bytes(self, head_dim, context, n_kv_heads):
        return 2.0 * head_dim


@dataclass(frozen=True)
class FP8PerTensor(Peer):
    """fp8 e4m3 (OCP e4m3fn) with one fp32 scale per (layer, K or V) tensor: x -> e4m3(x /
    scale) * scale, saturating at +-448 (vLLM's cache write converts with saturation);
    ``scale`` = 1.0 is vLLM's default without calibration."""

    scale: float = 1.0

    def __post_init__(self):
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")

    def roundtrip(self, x):
        import torch
        y = np.clip(np.asarray(x, dtype=np.float32) / self.scale, -E4M3_MAX, E4M3_MAX)
        q = torch.from_numpy(np.ascontiguousarray(y)).to(torch.float8_e4m3fn).float().numpy()
        return (q * self.scale).astype(np.float32)

    def vector_bytes(self, head_dim, context, n_kv_heads):
        return head_dim + 4.0 / (context * n_kv_heads)


@dataclass(frozen=True)
class UniformAsym(Peer):
    """Asymmetric uniform ``bits`` per (token, head), TurboQuant's value store: min/max of the
    vector, scale = (max - min) / (2^b - 1) (at least 1e-8), code = clamp(floor((x - min) /
    scale + 0.5)); stored: packed codes, fp16 scale, fp16 minimum (the decoder reads those)."""

    bits: int = 4

    def __post_init__(self):
        if not 2 <= self.bits <= 8:
            raise ValueError(f"bits must be in 2..8, got {self.bits}")

    def roundtrip(self, x):
        x = np.asarray(x, dtype=np.float64)
        lo = x.min(axis=-1, keepdims=True)
        top = (1 << self.bits) - 1
        s = np.maximum((x.max(axis=-1, keepdims=True) - lo) / top, 1e-8)
        c = np.clip(np.floor((x - lo) / s + 0.5), 0, top)
        return (c * _f16(s) + _f16(lo)).astype(np.float32)

    def vector_bytes(self, head_dim, context, n_kv_heads):
        return math.ceil(head_dim * self.bits / 8) + 4.0


@dataclass(frozen=True)
class TurboQuantKey(Peer):
    """TurboQuant key store (module docstring): n = |k| (stored fp16), y = (k / (n + 1e-8)) H
    with H the orthonormal Sylvester Hadamard matrix, code = nearest Lloyd-Max level of N(0,
    1/d) per coordinate; decode c = levels[code] (divided by |c| with ``norm_correction``),
    k_hat = n * c H. Stored: packed codes and the fp16 norm."""

    bits: int = 3
    norm_correction: bool = True

    def __post_init__(self):
        if not 2 <= self.bits <= 4:
            raise ValueError(f"bits must be in 2..4, got {self.bits}")

    def roundtrip(self, x):
        x = np.asarray(x, dtype=np.float64)
        d = x.shape[-1]
        h = hadamard_orth(d)
        n = np.linalg.norm(x, axis=-1, keepdims=True)
        y = (x / (n + 1e-8)) @ h
        lv = lloyd_max_levels(self.bits) / math.sqrt(d)
        c = lv[_nearest(y, lv)]
        if self.norm_correction:
            c = c / np.maximum(np.linalg.norm(c, axis=-1, keepdims=True), 1e-30)
        return ((c @ h) * _f16(n)).astype(np.float32)

    def vector_bytes(self, head_dim, context, n_kv_heads):
        return math.ceil(head_dim * self.bits / 8) + 2.0


#: Octave's int8 code tables: round(Lloyd-Max N(0, 1) level * OCTAVE_MULT[bits]).
OCTAVE_MULT = {3: 59.0, 4: 46.0}
#: Octave's scale fixed point (a code stands for LUT[c] * scale / OCTAVE_ONE).
OCTAVE_ONE = 64.0
#: Octave's Hadamard block of block-K layouts.
OCTAVE_BLOCK = 64
#: Sign-flip seed of the study's Octave reproduction (Octave draws its own fixed pattern).
OCTAVE_SIGN_SEED = 0x5E17


def octave_lut(bits: int) -> np.ndarray:
    """Octave's int8 code table for ``bits`` (3 or 4), ascending, float64."""
    if bits not in OCTAVE_MULT:
        raise ValueError(f"Octave codes are 3 or 4 bits, got {bits}")
    return np.round(lloyd_max_levels(bits) * OCTAVE_MULT[bits])


def octave_block_quantize(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """One Octave block per last-axis row: codes (nearest LUT level to x / rms * mult) and the
    fp16 scale s with x_hat = LUT[code] * s / OCTAVE_ONE and x . x_hat = |x|^2 (before the
    scale's fp16 rounding; 0 where x . LUT[code] <= 0)."""
    lut = octave_lut(bits)
    x = np.asarray(x, dtype=np.float64)
    ss = (x * x).sum(axis=-1, keepdims=True)
    rms = np.maximum(np.sqrt(ss / x.shape[-1]), 1e-12)
    codes = _nearest(x / rms * OCTAVE_MULT[bits], lut)
    dot = (x * lut[codes]).sum(axis=-1, keepdims=True)
    scale = np.where(dot > 0, ss / np.maximum(dot, 1e-30), 0.0) * OCTAVE_ONE
    return codes, _f16(scale)


@dataclass(frozen=True)
class Octave(Peer):
    """One stream of vLLM's Octave format (module docstring). ``block``: Hadamard block (0:
    the whole head, as compact K and V use); ``bits``: code width; ``scales``: fp16 scales per
    vector = head_dim / block. ``pad``: the slot's alignment (4 compact, 8 block layouts)."""

    bits: int = 3
    block: int = 0
    pad: int = 4

    def __post_init__(self):
        if self.bits not in OCTAVE_MULT:
            raise ValueError(f"bits must be 3 or 4, got {self.bits}")
        if self.pad not in (4, 8):
            raise ValueError(f"pad must be 4 or 8, got {self.pad}")

    @property
    def slot_align(self):
        return self.pad

    def _blk(self, d):
        b = self.block or d
        if d % b or b & (b - 1):
            raise ValueError(f"Octave block {b} must be a power of two dividing head_dim {d}")
        return b

    def roundtrip(self, x):
        x = np.asarray(x, dtype=np.float64)
        d = x.shape[-1]
        b = self._blk(d)
        sg = np.where(sign_mask(d, OCTAVE_SIGN_SEED) == 1, -1.0, 1.0)
        h = hadamard_orth(b)
        y = (x * sg).reshape(*x.shape[:-1], d // b, b) @ h
        codes, s = octave_block_quantize(y, self.bits)
        yh = octave_lut(self.bits)[codes] * s / OCTAVE_ONE
        return ((yh @ h).reshape(x.shape) * sg).astype(np.float32)

    def vector_bytes(self, head_dim, context, n_kv_heads):
        return head_dim * self.bits / 8 + 2.0 * (head_dim // self._blk(head_dim))


def _minmax_roundtrip(x: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Asymmetric min/max quantization along ``axis`` (KIVI's quantizer): fp16 scale =
    (max - min) / (2^b - 1) and fp16 min, code = round((x - min) / scale)."""
    lo = _f16(x.min(axis=axis, keepdims=True))
    top = (1 << bits) - 1
    s = _f16((x.max(axis=axis, keepdims=True) - lo) / top)
    safe = np.where(s > 0, s, 1.0)
    c = np.clip(np.round((x - lo) / safe), 0, top)
    return c * s + lo


@dataclass(frozen=True)
class KiviKey(Peer):
    """KIVI keys: per channel over groups of ``group`` consecutive tokens, flushed in chunks
    of ``residual`` tokens (a multiple of ``group``). A query at position t reads keys
    j >= (t // residual) * residual (the unflushed chunk, its own key included) in fp16."""

    bits: int = 2
    group: int = 32
    residual: int = 128
    windowed = True

    def __post_init__(self):
        if not 1 <= self.bits <= 8 or self.group < 1 or self.residual % self.group:
            raise ValueError(f"KiviKey: bits 1..8 and residual a multiple of group, got "
                             f"bits={self.bits} group={self.group} residual={self.residual}")

    def roundtrip(self, x):
        x = np.asarray(x, dtype=np.float64)
        t = x.shape[-2]
        n = t // self.group * self.group
        out = x.copy()
        if n:
            g = x[..., :n, :].reshape(*x.shape[:-2], n // self.group, self.group, x.shape[-1])
            out[..., :n, :] = _minmax_roundtrip(g, self.bits, axis=-2).reshape(
                *x.shape[:-2], n, x.shape[-1])
        return out.astype(np.float32)

    def full_mask(self, q_pos, k_pos):
        return k_pos[None, :] >= (q_pos[:, None] // self.residual) * self.residual

    def vector_bytes(self, head_dim, context, n_kv_heads):
        nq = context // self.residual * self.residual
        quant = head_dim * self.bits / 8 + 4.0 * head_dim / self.group
        return (nq * quant + (context - nq) * 2.0 * head_dim) / context


@dataclass(frozen=True)
class KiviValue(Peer):
    """KIVI values: per token over groups of ``group`` channels (capped at head_dim); a query
    at position t reads values j >= t - residual in fp16 (the sliding full-precision window)."""

    bits: int = 2
    group: int = 32
    residual: int = 128
    windowed = True

    def __post_init__(self):
        if not 1 <= self.bits <= 8 or self.group < 1 or self.residual < 0:
            raise ValueError(f"KiviValue: bits 1..8, group >= 1, residual >= 0, got "
                             f"bits={self.bits} group={self.group} residual={self.residual}")

    def _g(self, d):
        g = min(self.group, d)
        if d % g:
            raise ValueError(f"KIVI value group {g} must divide head_dim {d}")
        return g

    def roundtrip(self, x):
        x = np.asarray(x, dtype=np.float64)
        d = x.shape[-1]
        g = self._g(d)
        y = x.reshape(*x.shape[:-1], d // g, g)
        return _minmax_roundtrip(y, self.bits, axis=-1).reshape(x.shape).astype(np.float32)

    def full_mask(self, q_pos, k_pos):
        return k_pos[None, :] >= q_pos[:, None] - self.residual

    def vector_bytes(self, head_dim, context, n_kv_heads):
        nf = min(context, self.residual)
        quant = head_dim * self.bits / 8 + 4.0 * head_dim / self._g(head_dim)
        return ((context - nf) * quant + nf * 2.0 * head_dim) / context


def slot_bits(k, v, head_dim: int, context: int, n_kv_heads: int) -> float:
    """Average stored bits per K/V element of one layer whose keys and values are stored by
    ``k`` and ``v`` (Peer, or None for fp16): both vectors' bytes, the slot padded to the
    larger alignment."""
    def b(q):
        return 2.0 * head_dim if q is None else q.vector_bytes(head_dim, context, n_kv_heads)
    align = max(getattr(q, "slot_align", 1) for q in (k, v))
    tot = b(k) + b(v)
    if align > 1:
        tot = math.ceil(tot / align - 1e-9) * align
    return tot * 8.0 / (2 * head_dim)
