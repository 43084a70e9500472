"""GPU kernels for the fwht-kv KV-cache format (CuPy RawModule, CUDA sources in this folder).

Two kernels, both defined by the golden model in ``sim_models`` (which fixes every bit):

* :func:`encode_kv` -- the write path (``kv_encode.cu``): K or V vectors ``[..., N]`` in fp16 or
  bf16 -> code plane ``[..., N*b/8]``, scale plane ``[..., N/G]`` and flags ``[...]`` in one
  launch, bit-exact with :func:`sim_models.encode` for every input (NaN, inf, subnormals, zeros
  included) and every :class:`sim_models.FormatParams` the golden model accepts whose quantizer is in
  :data:`SUPPORTED_QUANTIZER`: mode ``midtread`` or ``midrise`` x scale rounding ``up`` or
  ``nearest`` (scale ``ue5m3``, rule ``max``, multiplier 256), i.e. the version-1 quantizer
  (midtread/up), the version-2 one (midrise/nearest) and the two mixed ones. Keys may pass through the
  cache policy's key front end on the way (per-channel power-of-two scales, centering; fp16; the folded
  rule of docs/FORMAT.md 8), applied in registers by the same kernel (:func:`key_table`, :func:`key_front` for rows that are not encoded).
* :func:`plan` / :func:`run` (``run(plan, workspace, q, cache)``; :func:`run_planes` takes the planes one
  by one) and the one-call :func:`decode_attention` -- fused single-token
  decode attention (``kv_decode_attn.cu``)
  straight from the packed cache: q is rotated inside the kernel (``q~ = H D q``), logits and
  the online softmax run in the rotated domain (``q.k = q~ . (code*scale) / N``), the rotated V
  is accumulated and the output is rotated back once (``o = D H acc / N``); mid-tread codes
  reconstruct as ``c * scale``, mid-rise codes as ``(2c + 1) * scale / 2`` (the kernel feeds
  ``c + 1/2`` to the tensor cores). Split-KV
  (flash-decoding) with an in-kernel merge; GQA with any ratio; per-sequence lengths; 3- or 4-bit
  keys and values chosen separately; fp16 sink tokens merged by log-sum-exp; per-channel key scales
  folded into q; contiguous or paged planes (block table).
* :class:`KVCache` -- one layer's cache for a :class:`sim_models.CachePolicy` and the model's
  :class:`sim_models.KeyTables` (bits per K/V, sinks, key centering and scales, contiguous or paged),
  ``append`` / ``plan`` / ``run`` / ``attend``.
* :data:`CUDA` / :func:`supports` (:mod:`gpu_ref.backend`) -- what the kernels serve, declared once;
  ``supports(policy, head_dim, dtype)`` returns the named reasons a policy is not served.

Modules: ``backend`` (capabilities), ``_build`` (kernel cache), ``encode``, ``decode`` (plan/run), ``cache``,
``layout`` (the vpair storage order of the value codes), ``hf`` (transformers integration), ``generate``
(command line), ``serve`` (continuous-batching engine and OpenAI-compatible server). Tuning tables and launch internals (``decode.DECODE_TUNE``, ``decode.kernel_params``,
``encode.ENCODE_TUNE``, ``encode.launch_encode``) stay in their modules.

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

Decode accuracy: K codes enter the tensor cores exactly (``1 + (c+T) 2^(o-10)`` in fp16,
T = 2^(b-1), the constant removed through the accumulator start value); q~ enters as one fp16 part,
or as two (~22 bits) for plans with ``key_scales`` and for bf16 q (or ``tune={"qlo": 1}``); softmax weights times V
scales enter as fp16 (``precise_p=True`` splits them too); accumulation is fp32. Budget: no worse than torch SDPA bf16's
own error against float64 (see gpu_ref.decode and tests/test_gpu.py).

Cache layout: see :mod:`gpu_ref.decode` (page pools [P, KVH, page, row bytes] plus a block table;
contiguous planes [B, KVH, CAP, row bytes] are one page per sequence).

Requirements: CuPy (``cupy-cuda13x``) and an NVIDIA GPU of compute capability >= 8.0 (tuned for
sm_90). Importing this module needs neither; the functions raise ``RuntimeError`` without them.
"""

from __future__ import annotations

from ._build import SUPPORTED_QUANTIZER
from .backend import CUDA, supports
from .cache import KVCache
from .decode import DecodePlan, Workspace, decode_attention, decode_supported, plan, run, run_planes
from .encode import EncodedGPU, KeyFront, encode_kv, key_front, key_table

__all__ = [
    "CUDA", "supports", "EncodedGPU", "KVCache", "DecodePlan", "Workspace", "plan", "run", "run_planes",
    "decode_attention", "decode_supported", "encode_kv", "KeyFront", "key_table", "key_front", "SUPPORTED_QUANTIZER",
]
