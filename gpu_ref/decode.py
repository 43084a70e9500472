"""Fused decode attention over the packed cache (``kv_decode_attn.cu``): plan once, run many times.

``plan(...)`` fixes everything that depends only on shapes and a bound on the lengths (kernel
variant, split count, chunk, shared memory, workspace size); ``run(plan, workspace, q, cache)``
(or :func:`run_planes`, the planes passed one by one) checks the arrays against the plan and
launches one kernel. The caller owns the workspace
(:meth:`DecodePlan.workspace`), so a CUDA graph that captures ``run`` keeps pointing at memory the
caller keeps alive (the FlashInfer ``BatchDecodeWithPagedKVCacheWrapper`` convention).
:func:`decode_attention` is the one-call form (plan + private workspace + run).

Computes, per sequence b and query head h (kv head ``h // (Hq // KVH)``),
``softmax(scale * (q * q_scale) . k_hat_t) @ v_hat_t`` over the ``lengths[b]`` tokens of b: the first
``sinks`` of them from the fp16/bf16 side planes, the rest from the packed planes, where
``k_hat, v_hat`` are the golden-model reconstructions (:func:`sim_models.decode_float`). Nothing
but the packed bytes (and the sink rows) is read; no fp16 K/V is written anywhere.

Layout (paged, vLLM/FlashInfer convention, HND): ``k_codes [P, KVH, page, N*KB/8]``,
``v_codes [P, KVH, page, N*VB/8]``, ``k_scales, v_scales [P, KVH, page, N/G]`` uint8 pools, a block
table int32 ``[B, max_pages]``: packed token i of sequence b is row ``i % page`` of page
``block_table[b, i // page]``. Contiguous ``[B, KVH, CAP, *]`` planes are the case ``page = CAP``,
sequence b in page b (no block table). Page sizes: 16, 32 or any multiple of 64 (powers of two).
The value code plane is in the golden byte order (``layout="wire"``) or, for 3-bit values in 64-lane blocks,
in the token-pair order of :mod:`gpu_ref.layout` (``layout="vpair"``, what :class:`gpu_ref.KVCache` stores);
a plan is made for one of them and :func:`run` refuses planes declared in the other.

Numerical budget (docs/FORMAT.md, implementation notes): K codes enter the tensor cores exactly, q~ as
one fp16 part (a power of two per head puts its largest entry in [2^14, 2^15); undone on the fp32 logits), or two
(``qlo``; the default for plans with ``key_scales`` and for bf16 q, whose data leave SDPA bf16 a smaller error),
softmax weights times V scales as fp16, fp32 accumulation. With key scales s the one-part error grows with
``rho = rms(|q / s| |k s|) / rms(sqrt(N) |q * k|)`` (kvtest.gpu_cases.key_scale_rho; channel products q * k), not
with the exponents of s: q~ is rotated, so its fp16 rounding error is isotropic over the channels (no entry is
subnormal). Scales calibrated as FORMAT.md 8 says (``s ~ (E q^2 / E k^2)^(1/4)``) give rho ~ 1 and one part ~1/10
of the budget at any |log2 s| <= 14; scales drawn independently of q and k (the tests' data, |log2 s| <= 3) give
rho ~ 12, and one part exceeded the budget on some shapes, so two parts stay the default there
(docs/DECISIONS.md, "Two q parts with key scales"). The relative error against a float64 reference
over the same dequantized cache must not exceed torch SDPA bf16's own error against float64 on unquantized K/V of
the same shape (tests/test_gpu.py measures both; docs/DECISIONS.md, "Numerical budget").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sim_models.params import FormatParams

from ._build import MODE_ID, SUPPORTED_QUANTIZER, check_cupy_array, checked_params, cupy, kernel
from .backend import CUDA as _CUDA
from .backend import SHARED_FIELDS
from .layout import LAYOUTS, vpair_supported

# what the kernels serve is declared once, in gpu_ref.backend
DECODE_N = _CUDA.head_dims
DECODE_G = _CUDA.blocks
DECODE_BITS = _CUDA.bits
MAX_SINKS = _CUDA.max_sinks
#: sink counts up to this are merged by the kernel's output stage (rows copied in with the first tiles);
#: more get their own CTA, one more split partial (KvDecCfg::SF in kv_decode_attn.cu)
SINK_FOLD = 8
TT = 64  # tokens per tile
SMEM_MAX = 227 * 1024  # dynamic shared memory per CTA on sm_90
#: token counts and indices are int32 in the kernels (lengths, chunk, max_pages, rows)
MAX_TOKENS = 2 ** 31 - 1
#: a last wave of CTAs filled below this fraction of the CTA slots still takes this fraction of a full
#: wave's time (a CTA streams at most ~2x its fair share of DRAM bandwidth); H200, K3/V3 GQA 32/8 at
#: 128K: 264 slots, 280 CTAs ran 1.53x the time of 256 (bench/results/gpu_bench_waves.json)
WAVE_FLOOR = 0.5
#: when the (sequence, head tile) pairs fill the CTA slots, a larger split count must be predicted to
#: save more than this fraction of the time to be chosen (every split adds a partial to merge)
SPLIT_GAIN = 0.02


def wave_splits(pairs: int, slots: int, tiles: int, cap: int) -> int:
    """Split count for ``pairs`` >= ``slots`` (int): the smallest power of two in [1, cap] (equal splits
    of power-of-two tile counts) whose predicted time (whole waves of ``pairs * splits`` CTAs, a partial
    last wave as ``max(fill, WAVE_FLOOR)`` of one, times the tiles per split) is within ``SPLIT_GAIN``
    of the best. ``tiles``: 64-token tiles per sequence. Measured on the H200 (gpu_bench_waves.json,
    GQA 32/8 at 128K): batch 35 picks 8 splits (2.13 -> 1.53 ms), batch 40 picks 4 (2.13 -> 1.76 ms),
    both the fastest measured; batch 48 picks 2 (2.15 -> 2.13 ms; 4 splits: 2.09); 33 and 64 keep 1."""
    def cost(ns: int) -> float:
        full, rest = divmod(pairs * ns, slots)
        return (full + (max(rest / slots, WAVE_FLOOR) if rest else 0.0)) * -(-tiles // ns)
    counts = [1 << i for i in range(max(1, cap).bit_length()) if 1 << i <= max(1, cap)]
    costs = [cost(ns) for ns in counts]
    best = min(costs)
    return next(ns for ns, c in zip(counts, costs) if c <= best * (1 + SPLIT_GAIN))

#: decode tuning defaults: CTAs per SM for the register budget, q~ low part on/off (None: on for plans
#: with ``key_scales`` or bf16 q only -- one fp16 part keeps the error within the budget for fp16 q without
#: key scales, not with uncalibrated ones (rho ~ 12), and not always for bf16 data: docs/DECISIONS.md,
#: "Two q parts with key scales"), ablation
#: (profiling only: 1 = no PV, 2 = no QK; gives wrong results), cluster merge (1: a plan with 2..8
#: partials whose grid fits one CTA per multiprocessor runs each (batch, head tile)'s partials as one
#: thread-block cluster, padded to 2, 4 or 8, merged in distributed shared memory instead of the
#: workspace; 0: never. Larger grids lose occupancy to clusters: docs/DECISIONS.md, "Cluster merge for
#: single-wave grids").
DECODE_TUNE = {"minb": 2, "qlo": None, "abl": 0, "cluster": 1}
#: the 12-warp tune (3 CTAs per SM, 2 pipeline stages) that :func:`plan` picks for long splits: N = 128, one q~
#: part, no ``precise_p``, 3 CTAs fit in shared memory (K3V3, K4V3), the plan under this tune gives every split at
#: least ``LONG_CHUNK`` tokens, and its CTAs load the multiprocessors evenly (total >= ``LONG_BALANCE`` x SMs x the
#: most on one SM). Short splits and uneven waves keep 8 warps (docs/DECISIONS.md, "12-warp planner rule").
LONG_TUNE = {"minb": 3, "stages": 2}
LONG_CHUNK = 16384
LONG_BALANCE = 0.9


#: the kernel's parameter struct ``KvDecParams`` (kv_decode_attn.cu), field by field in its order, with C
#: alignment: 14 device pointers, two int64, eleven int32, one float32
PARAMS_DTYPE = np.dtype(
    [(f, np.uint64) for f in ("q", "kc", "ks", "vc", "vs", "block_table", "lengths", "k_sink", "v_sink", "q_scale",
                              "part_acc", "part_ml", "counters", "out")]
    + [("page", np.int64), ("cap", np.int64)]
    + [(f, np.int32) for f in ("q_bf16", "max_pages", "page_shift", "sinks", "out_kind", "Hq", "KVH", "HT", "group",
                               "S", "chunk")]
    + [("sm_scale", np.float32)], align=True)


def decode_supported(p: FormatParams) -> bool:
    """True when the decode kernel reads caches of this format (shape, bits and quantizer).

    Raises:
        TypeError: ``p`` is not a FormatParams.
    """
    if not isinstance(p, FormatParams):
        raise TypeError(f"params must be a sim_models.FormatParams, got {type(p).__name__}")
    return not _CUDA.format_reasons(p, "params")


def check_decode(params) -> FormatParams:
    """``params`` (default FormatParams()) if the decode kernel supports it; ValueError naming
    the unsupported field otherwise (before CuPy is needed)."""
    p = checked_params(params)
    if not decode_supported(p):
        bad = [f"{f}={getattr(p, f)!r}" for f, ok in
               (("bits", p.bits in DECODE_BITS), ("n", p.n in DECODE_N),
                ("block", p.block in DECODE_G and p.block <= p.n))
               if not ok]
        bad += [f"{f}={getattr(p, f)!r}" for f, allowed in SUPPORTED_QUANTIZER.items()
                if getattr(p, f) not in allowed]
        raise ValueError(f"decode_attention does not support {', '.join(bad)}: it supports bits in "
                         f"{DECODE_BITS}, n in {DECODE_N}, block in {DECODE_G} (block <= n) and "
                         f"the quantizers of gpu_ref.SUPPORTED_QUANTIZER")
    return p


def check_kv_pair(k_params, v_params) -> tuple[FormatParams, FormatParams]:
    """(K format, V format): both decodable, equal in every field but ``bits`` (V defaults to K).

    Raises:
        ValueError: naming the first field that differs, or an unsupported one.
    """
    kp = check_decode(k_params)
    vp = kp if v_params is None else check_decode(v_params)
    for f in SHARED_FIELDS:
        if getattr(kp, f) != getattr(vp, f):
            raise ValueError(f"K and V formats may differ only in bits; {f}: {getattr(kp, f)!r} != "
                             f"{getattr(vp, f)!r}")
    return kp, vp


def _stages(n: int) -> int:
    return {64: 4, 128: 3, 256: 2}[n]


def _smem(kp: FormatParams, vp: FormatParams, stages: int) -> tuple[int, int]:
    """(dynamic shared memory bytes, one warp region's bytes) -- KvDecCfg in kv_decode_attn.cu."""
    n, nb = kp.n, kp.n_blocks
    stb = TT * kp.code_bytes + TT * vp.code_bytes + 2 * TT * nb
    wraw = stages * stb + 16 + 2 * nb * 64 * 4
    wacc = 8 * n * 4
    wreg = (max(wraw, wacc + 2048) + 15) // 16 * 16
    misc = (32 + 32 + 8 + 8 + 8 + 8 + 32 + 4) * 4 + 256 * 4 + 2 * SINK_FOLD * n * 2
    return 4 * wreg + 8 * n * 4 + misc, wreg


def _pages_per_tile(page: int | None) -> int:
    if page is None or page % TT == 0:
        return 1
    return TT // page


def check_layout(layout, vp: FormatParams) -> str:
    """``layout`` checked against the value format (ValueError naming it)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "vpair" and not vpair_supported(vp.bits, vp.block):
        raise ValueError(f"layout 'vpair' needs 3-bit values in 64-lane blocks, got bits={vp.bits} "
                         f"block={vp.block}")
    return layout


def kernel_params(kp: FormatParams, vp: FormatParams | None = None, precise_p: bool = False,
                  stages: int | None = None, tune=None, page_size: int | None = None, two_q_parts: bool = False,
                  layout: str = "wire"):
    """(template arguments, dynamic shared memory bytes, CTAs per SM, warp region bytes).

    Raises:
        TypeError, ValueError: parameters the decode kernel does not support.
    """
    kp, vp = check_kv_pair(kp, vp)
    check_layout(layout, vp)
    if not isinstance(precise_p, (bool, np.bool_)):
        raise ValueError(f"precise_p must be a bool, got {precise_p!r}")
    if tune is not None and not isinstance(tune, dict):
        raise ValueError(f"tune must be a dict, got {type(tune).__name__}")
    unknown = sorted(set(tune or {}) - set(DECODE_TUNE) - {"stages"})
    if unknown:
        raise ValueError(f"tune has unknown keys {unknown}; known: {sorted(DECODE_TUNE) + ['stages']}")
    t = dict(DECODE_TUNE, **(tune or {}))
    if t["qlo"] is None:
        t["qlo"] = 1 if two_q_parts else 0
    for key in DECODE_TUNE:
        _pos_int(f"tune[{key!r}]", t[key], 1 if key == "minb" else 0)
    st = _pos_int("stages", t.get("stages") or stages or _stages(kp.n))
    if _smem(kp, vp, st)[0] > SMEM_MAX:
        raise ValueError(f"stages {st} needs {_smem(kp, vp, st)[0]} bytes of shared memory per CTA, more than "
                         f"the {SMEM_MAX} of sm_90")
    seed = 0 if kp.sign_seed is None else kp.sign_seed
    targs = (str(kp.n), str(kp.block), str(kp.bits), str(vp.bits), "1" if precise_p else "0", str(st),
             f"{seed}ull", "0" if kp.sign_seed is None else "1", str(int(t["minb"])), str(int(t["qlo"])),
             str(int(t["abl"])), str(MODE_ID[kp.mode]), str(_pages_per_tile(page_size)),
             "1" if layout == "vpair" else "0")
    smem, wreg = _smem(kp, vp, st)
    return targs, smem, int(t["minb"]), wreg


def _pos_int(name, v, lo=1):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    return int(v)


@dataclass
class Workspace:
    """Split-KV scratch owned by the caller (cupy arrays; keep it alive while a graph uses it).

    Attributes: acc float32 partial outputs, ml float32 (max, sum) pairs, counters int32 tickets
    (zero between runs: the kernel resets them).
    """

    acc: object
    ml: object
    counters: object


@dataclass(frozen=True)
class DecodePlan:
    """What :func:`plan` fixed. Attributes are plain values (see :func:`plan`)."""

    k_params: FormatParams
    v_params: FormatParams
    batch: int
    q_heads: int
    kv_heads: int
    max_length: int
    capacity: int
    page_size: int | None
    max_pages: int
    sinks: int
    num_splits: int
    #: planned for a q_scale (key scales) at run time; such plans feed q~ as two fp16 parts by default
    key_scales: bool
    #: type of q at run time, "fp16" or "bf16" (bf16 plans feed q~ as two fp16 parts by default)
    q_dtype: str
    chunk: int
    head_tiles: int
    targs: tuple
    smem: int
    workspace_floats: tuple = field(default=(0, 0, 0))
    #: split partials the kernel merges: ``num_splits`` token splits plus one sink CTA when ``sinks`` > SINK_FOLD
    #: (grid y); 1 means the single CTA per (batch, head tile) writes the output with no merge.
    partials: int = 1
    #: kernel entry: "decode" (workspace merge) or "decode_cl" (cluster of ``partials`` CTAs, see DECODE_TUNE)
    kind: str = "decode"
    #: order of the value code plane the plan reads: "wire" (golden) or "vpair" (gpu_ref.layout)
    layout: str = "wire"

    @property
    def workspace_bytes(self) -> int:
        a, m, c = self.workspace_floats
        return 4 * (a + m + c)

    def workspace(self) -> Workspace:
        """A fresh workspace for this plan (zeroed counters)."""
        cp = cupy()
        a, m, c = self.workspace_floats
        return Workspace(cp.empty(max(a, 1), cp.float32), cp.empty(max(m, 1), cp.float32),
                         cp.zeros(max(c, 1), cp.int32))


def plan(k_params: FormatParams | None = None, v_params: FormatParams | None = None, *, batch: int,
         q_heads: int, kv_heads: int, max_length: int, capacity: int | None = None,
         page_size: int | None = None, max_pages: int | None = None, sinks: int = 0,
         num_splits: int | None = None, precise_p: bool = False, stages: int | None = None,
         tune: dict | None = None, num_sms: int | None = None, key_scales: bool = False,
         q_dtype: str = "fp16", layout: str = "wire") -> DecodePlan:
    """Plan decode attention for fixed shapes and a bound on the sequence lengths.

    Args:
        k_params, v_params: key / value formats (V defaults to K); bits 3 or 4 each, otherwise equal.
        batch, q_heads, kv_heads: B, Hq (a multiple of KVH), KVH.
        max_length: bound on every ``lengths[b]`` passed to :func:`run` (tokens incl. sinks).
        capacity: contiguous layout: packed rows per sequence (CAP, multiple of 16; default
            ``max_length - sinks`` rounded up). Ignored when ``page_size`` is given.
        page_size: paged layout: tokens per page (16, 32 or a multiple of 64, power of two);
            None = contiguous.
        max_pages: paged layout: block-table columns (default: enough for max_length).
        sinks: fp16 sink tokens per sequence (0..64).
        num_splits: split-KV factor (default: one wave of CTAs, clamped to the merge limit).
        precise_p: also split the softmax weights into two fp16 parts.
        key_scales: :func:`run` will get a ``q_scale`` (per-channel key scales); picks two fp16 q~ parts
            unless ``tune`` sets ``qlo``.
        q_dtype: "fp16" or "bf16", the type of q :func:`run` will get ("bf16" picks two q~ parts too).
        stages, tune: kernel tuning (benchmarks). Without them, ``num_splits`` and ``precise_p``, an N = 128 plan with
            one q~ part takes ``LONG_TUNE`` (12 warps per SM) when that gives every split >= ``LONG_CHUNK`` tokens
            and loads the multiprocessors evenly (``LONG_BALANCE``).
        num_sms: multiprocessors to plan for (default: the current device's).
        layout: order of the value code plane, "wire" (golden bytes) or "vpair" (:mod:`gpu_ref.layout`;
            3-bit values, G = 64).

    Returns:
        :class:`DecodePlan`.

    Raises:
        ValueError: a bad shape, length bound, page size, sink count or split count (named).
    """
    kp, vp = check_kv_pair(k_params, v_params)
    user = tune if isinstance(tune, dict) else {}
    qlo = user.get("qlo", DECODE_TUNE["qlo"])
    if (kp.n == 128 and stages is None and num_splits is None and (tune is None or isinstance(tune, dict))
            and isinstance(precise_p, (bool, np.bool_)) and not precise_p and not set(LONG_TUNE) & set(user)
            and (qlo == 0 or (qlo is None and q_dtype == "fp16" and not key_scales))
            and 3 * (_smem(kp, vp, LONG_TUNE["stages"])[0] + 1024) <= 228 * 1024):
        p12 = plan(kp, vp, batch=batch, q_heads=q_heads, kv_heads=kv_heads, max_length=max_length,
                   capacity=capacity, page_size=page_size, max_pages=max_pages, sinks=sinks,
                   tune=dict(user, **LONG_TUNE), num_sms=num_sms, key_scales=key_scales, q_dtype=q_dtype,
                   layout=layout)
        ctas = p12.batch * p12.kv_heads * p12.head_tiles * p12.partials
        sms = int(num_sms) if num_sms is not None else cupy().cuda.Device().attributes["MultiProcessorCount"]
        if p12.chunk >= LONG_CHUNK and ctas >= LONG_BALANCE * sms * -(-ctas // sms):
            return p12
    bsz = _pos_int("batch", batch)
    hq = _pos_int("q_heads", q_heads)
    kvh = _pos_int("kv_heads", kv_heads)
    if hq % kvh:
        raise ValueError(f"q_heads {hq} must be a multiple of kv_heads {kvh}")
    maxlen = _pos_int("max_length", max_length, 0)
    if maxlen > MAX_TOKENS:
        raise ValueError(f"max_length must be <= {MAX_TOKENS} (int32 token indices), got {maxlen}")
    if num_sms is not None:
        num_sms = _pos_int("num_sms", num_sms)
    s = _pos_int("sinks", sinks, 0)
    if _CUDA.sinks_reasons(s):
        raise ValueError(f"sinks must be in [0, {MAX_SINKS}], got {s}")
    packed = max(maxlen - s, 0)
    if page_size is None:
        cap = _pos_int("capacity", capacity) if capacity is not None else max(16, -(-packed // 16) * 16)
        if cap % 16:
            raise ValueError(f"capacity must be a multiple of 16, got {cap}")
        if packed > cap:
            raise ValueError(f"max_length - sinks = {packed} exceeds the capacity {cap}")
        mp = 1
    else:
        pg = _pos_int("page_size", page_size)
        if not _CUDA.page_size_ok(pg):
            raise ValueError(f"page_size must be 16, 32 or a multiple of 64 (a power of two), got {pg}")
        need = max(1, -(-packed // pg))
        mp = need if max_pages is None else _pos_int("max_pages", max_pages)
        if mp < need:
            raise ValueError(f"max_pages {mp} cannot hold max_length - sinks = {packed} tokens of {pg}")
        cap = mp * pg
    if cap > MAX_TOKENS:
        raise ValueError(f"the cache rows per sequence (capacity or max_pages * page_size) must be <= "
                         f"{MAX_TOKENS} (int32 token indices), got {cap}")
    group = hq // kvh
    ht = (group + 7) // 8
    pairs = bsz * kvh * ht
    if not isinstance(key_scales, (bool, np.bool_)):
        raise ValueError(f"key_scales must be a bool, got {key_scales!r}")
    if q_dtype not in ("fp16", "bf16"):
        raise ValueError(f"q_dtype must be 'fp16' or 'bf16', got {q_dtype!r}")
    targs, smem, minb, wreg = kernel_params(kp, vp, precise_p, stages, tune, page_size,
                                            bool(key_scales) or q_dtype == "bf16", layout)
    # the last CTA stages (m, l) of every partial in one warp region; a plan with more than SINK_FOLD sinks
    # has one more partial (the sink CTA) than token splits
    hs = 1 if s > SINK_FOLD else 0
    max_splits = min(wreg // 64, 65535) - hs
    use_cl = bool(int(dict(DECODE_TUNE, **(tune or {}))["cluster"]))
    if num_sms is None and (num_splits is None or use_cl):
        num_sms = cupy().cuda.Device().attributes["MultiProcessorCount"]
    if num_splits is None:
        # CTAs per SM: 228 KB of shared memory per SM on sm_90, 1 KB of it reserved per CTA
        per_sm = max(1, min(minb, (228 * 1024) // (smem + 1024)))
        slots = int(num_sms) * per_sm
        # at least 2 tiles per warp in each split
        want = max(1, -(-packed // (TT * 4 * 2)))
        if pairs < slots:
            num_splits = min(max(1, min(slots // pairs, want)), max_splits)
        else:  # a partial last wave: more splits can fill it (bench/results/gpu_bench_waves.json)
            num_splits = wave_splits(pairs, slots, -(-packed // TT), min(want, max_splits))
        if use_cl and hs and num_splits == 8 and pairs * 8 <= int(num_sms):
            num_splits = 7  # the sink CTA still fits in a cluster of 8
    ns = _pos_int("num_splits", num_splits)
    if ns > max_splits:
        raise ValueError(f"num_splits must be in [1, {max_splits}], got {ns}")
    chunk = -(-max(packed, 1) // ns)
    chunk = -(-chunk // TT) * TT
    ns = max(1, -(-max(packed, 1) // chunk))
    n = kp.n
    parts = ns + hs
    kind = "decode"
    if use_cl and 2 <= parts <= 8:
        cl = 1 << (parts - 1).bit_length()  # cluster size 2, 4 or 8; the extra token splits are empty
        # one CTA per multiprocessor at most: docs/DECISIONS.md, "Cluster merge for single-wave grids"
        if pairs * cl <= int(num_sms):
            parts, kind, targs = cl, "decode_cl", targs + (str(cl),)
    return DecodePlan(k_params=kp, v_params=vp, batch=bsz, q_heads=hq, kv_heads=kvh, max_length=maxlen,
                      capacity=cap, page_size=page_size, max_pages=mp, sinks=s, num_splits=ns,
                      key_scales=bool(key_scales), q_dtype=q_dtype, chunk=chunk,
                      head_tiles=ht, targs=targs, smem=smem,
                      workspace_floats=(pairs * parts * 8 * n, pairs * parts * 16, pairs), partials=parts,
                      kind=kind, layout=layout)


def _check_plane(name, a, width, lead, cp):
    check_cupy_array(name, a, cp)
    if a.dtype != cp.uint8:
        raise TypeError(f"{name} must be uint8, got {a.dtype}")
    if a.ndim != 4 or a.shape[-1] != width or (lead is not None and a.shape[1:3] != lead):
        want = f"[*, {lead[0]}, {lead[1]}, {width}]" if lead is not None else f"[*, KVH, rows, {width}]"
        raise ValueError(f"{name} must be {want}, got {list(a.shape)}")
    if a.data.ptr % 16:
        raise ValueError(f"{name} must be 16-byte aligned")


def run(pl: DecodePlan, ws: Workspace, q, cache, *, scale: float | None = None, out=None,
        out_dtype: str | None = None):
    """Launch the planned decode over ``cache`` (a :class:`gpu_ref.KVCache`, or any object with its
    plane attributes ``k_codes``, ``k_scales``, ``v_codes``, ``v_scales``, ``lengths``, ``block_table``,
    ``k_sink``, ``v_sink``, ``q_scale`` and ``layout``) with its current device lengths. No device->host
    copies: capturable in a CUDA graph.

    Args:
        pl: from :func:`plan` (or :meth:`gpu_ref.KVCache.plan`); ws: its :meth:`DecodePlan.workspace`.
        q: cupy ``[B, Hq, N]`` float16, or uint16 bf16 bit patterns.
        scale, out, out_dtype: as :func:`run_planes`.

    Returns:
        cupy ``[B, Hq, N]``.
    """
    return run_planes(pl, ws, q, cache.k_codes, cache.k_scales, cache.v_codes, cache.v_scales, cache.lengths,
                      cache.block_table, k_sink=cache.k_sink, v_sink=cache.v_sink, q_scale=cache.q_scale,
                      scale=scale, out=out, out_dtype=out_dtype, layout=cache.layout)


def run_planes(pl: DecodePlan, ws: Workspace, q, k_codes, k_scales, v_codes, v_scales, lengths, block_table=None, *,
               k_sink=None, v_sink=None, q_scale=None, scale: float | None = None, out=None,
               out_dtype: str | None = None, layout: str = "wire"):
    """:func:`run` over planes passed one by one (tests, benchmarks, callers with their own planes).

    Args:
        pl: from :func:`plan`; ws: its :meth:`DecodePlan.workspace` (not shared by concurrent runs).
        q: cupy ``[B, Hq, N]`` float16, or uint16 bf16 bit patterns.
        k_codes, k_scales, v_codes, v_scales: uint8 pools ``[P, KVH, page, *]`` (contiguous:
            ``[B, KVH, CAP, *]``), 16-byte aligned, C-contiguous.
        lengths: cupy int32 ``[B]``, tokens per sequence incl. sinks, each <= ``pl.max_length``
            (the kernel clamps the packed part to the capacity; it never reads outside the planes).
        block_table: cupy int32 ``[B, max_pages]`` (paged), ignored / None for contiguous planes.
        k_sink, v_sink: ``[B, KVH, sinks, N]`` rows of the same type as q (when ``pl.sinks`` > 0).
        q_scale: cupy float32 ``[KVH, N]`` factor on q (``1 / s`` for key scales ``s``), or None; only
            with a plan made with ``key_scales=True``.
        scale: softmax scale (default ``1/sqrt(N)``).
        out: optional output; out_dtype "fp16", "bf16" (uint16 bits) or "fp32" (default: q's type).
        layout: order of ``v_codes`` ("wire" or "vpair"); must be the plan's.

    Returns:
        cupy ``[B, Hq, N]``.

    Raises:
        TypeError, ValueError: arrays that do not match the plan (named).
    """
    if layout != pl.layout:
        raise ValueError(f"layout {layout!r} of the value codes does not match the plan's layout {pl.layout!r} "
                         f"(plan(..., layout={layout!r}))")
    if q_scale is not None and not pl.key_scales:
        raise ValueError("q_scale given, but the plan was made with key_scales=False (plan(..., key_scales=True) "
                         "plans for it)")
    cp = cupy()
    kp, vp = pl.k_params, pl.v_params
    n = kp.n
    check_cupy_array("q", q, cp)
    if q.shape != (pl.batch, pl.q_heads, n):
        raise ValueError(f"q must be [{pl.batch}, {pl.q_heads}, {n}], got {list(q.shape)}")
    if q.dtype == cp.float16:
        q_bf16 = 0
    elif q.dtype == cp.uint16:
        q_bf16 = 1
    else:
        raise TypeError(f"q must be float16 or uint16 (bf16 bit patterns), got {q.dtype}")
    if ("bf16" if q_bf16 else "fp16") != pl.q_dtype:
        raise ValueError(f"q is {'bf16' if q_bf16 else 'fp16'}, but the plan was made for q_dtype={pl.q_dtype!r}")
    contiguous = pl.page_size is None
    rows = pl.capacity if contiguous else pl.page_size
    lead = (pl.kv_heads, rows)
    for name, a, w in (("k_codes", k_codes, kp.code_bytes), ("k_scales", k_scales, kp.n_blocks),
                       ("v_codes", v_codes, vp.code_bytes), ("v_scales", v_scales, vp.n_blocks)):
        _check_plane(name, a, w, lead, cp)
    npool = k_codes.shape[0]
    if any(a.shape[0] != npool for a in (k_scales, v_codes, v_scales)):
        raise ValueError("the four planes must have the same number of pages")
    check_cupy_array("lengths", lengths, cp)
    if lengths.dtype != cp.int32 or lengths.shape != (pl.batch,):
        raise ValueError(f"lengths must be cupy int32 [{pl.batch}], got {lengths.dtype} {list(lengths.shape)}")
    if contiguous:
        if npool != pl.batch:
            raise ValueError(f"contiguous planes must have batch {pl.batch} as first axis, got {npool}")
        bt_arg, bt_cols, page_shift = np.uint64(0), 1, -1  # sequence b is page b; no table read
    else:
        if block_table is None:
            raise ValueError("block_table is required for a paged plan")
        check_cupy_array("block_table", block_table, cp)
        if block_table.dtype != cp.int32 or block_table.shape != (pl.batch, pl.max_pages):
            raise ValueError(f"block_table must be cupy int32 [{pl.batch}, {pl.max_pages}], got "
                             f"{block_table.dtype} {list(block_table.shape)}")
        bt_arg, bt_cols, page_shift = block_table, pl.max_pages, int(pl.page_size).bit_length() - 1
    sink_args = (np.uint64(0), np.uint64(0))
    if pl.sinks:
        for name, a in (("k_sink", k_sink), ("v_sink", v_sink)):
            if a is None:
                raise ValueError(f"{name} is required: the plan has sinks={pl.sinks}")
            check_cupy_array(name, a, cp)
            if a.dtype not in (cp.float16, cp.uint16) or a.shape != (pl.batch, pl.kv_heads, pl.sinks, n):
                raise ValueError(f"{name} must be float16/uint16 [{pl.batch}, {pl.kv_heads}, {pl.sinks}, {n}], "
                                 f"got {a.dtype} {list(a.shape)}")
            if a.data.ptr % 16:
                raise ValueError(f"{name} must be 16-byte aligned")
        sink_args = (k_sink, v_sink)
    qs_arg = np.uint64(0)
    if q_scale is not None:
        check_cupy_array("q_scale", q_scale, cp)
        if q_scale.dtype != cp.float32 or q_scale.shape != (pl.kv_heads, n):
            raise ValueError(f"q_scale must be cupy float32 [{pl.kv_heads}, {n}], got {q_scale.dtype} "
                             f"{list(q_scale.shape)}")
        qs_arg = q_scale
    odt = out_dtype or ("bf16" if q_bf16 else "fp16")
    kinds = {"fp16": (0, cp.float16), "bf16": (1, cp.uint16), "fp32": (2, cp.float32)}
    if odt not in kinds:
        raise ValueError(f"out_dtype must be one of {tuple(kinds)}, got {odt!r}")
    okind, ocp = kinds[odt]
    if out is None:
        out = cp.empty((pl.batch, pl.q_heads, n), dtype=ocp)
    else:
        check_cupy_array("out", out, cp)
        if out.shape != (pl.batch, pl.q_heads, n) or out.dtype != ocp:
            raise ValueError(f"out must be {ocp.__name__} [{pl.batch}, {pl.q_heads}, {n}]")
    a, m, c = pl.workspace_floats
    if ws.acc.size < a or ws.ml.size < m or ws.counters.size < c:
        raise ValueError("workspace is smaller than the plan needs (use plan.workspace())")
    if scale is None:
        scale = 1.0 / math.sqrt(n)
    kvh, ht = pl.kv_heads, pl.head_tiles
    prm = np.zeros((), PARAMS_DTYPE)
    for name, v in (("q", q), ("kc", k_codes), ("ks", k_scales), ("vc", v_codes), ("vs", v_scales),
                    ("block_table", bt_arg), ("lengths", lengths), ("k_sink", sink_args[0]),
                    ("v_sink", sink_args[1]), ("q_scale", qs_arg), ("part_acc", ws.acc), ("part_ml", ws.ml),
                    ("counters", ws.counters), ("out", out)):
        prm[name] = v.data.ptr if isinstance(v, cp.ndarray) else int(v)
    for name, v in (("page", rows), ("cap", pl.capacity), ("q_bf16", q_bf16), ("max_pages", bt_cols),
                    ("page_shift", page_shift), ("sinks", pl.sinks), ("out_kind", okind), ("Hq", pl.q_heads),
                    ("KVH", kvh), ("HT", ht), ("group", pl.q_heads // kvh), ("S", pl.partials),
                    ("chunk", pl.chunk), ("sm_scale", scale)):
        prm[name] = v
    kernel(pl.kind, pl.targs, pl.smem)((pl.batch * kvh * ht, pl.partials), (128,), (prm,), shared_mem=pl.smem)
    return out


def decode_attention(q, k_codes, k_scales, v_codes, v_scales, lengths, params: FormatParams | None = None,
                     *, v_params: FormatParams | None = None, scale: float | None = None,
                     out_dtype: str | None = None, num_splits: int | None = None, precise_p: bool = False,
                     max_length: int | None = None, stages: int | None = None, out=None,
                     tune: dict | None = None, layout: str = "wire"):
    """One-call decode over contiguous planes ``[B, KVH, CAP, *]`` (plan + fresh workspace + run).

    Not for CUDA-graph capture (the workspace is allocated per call): use :func:`plan` / :func:`run`.

    Args:
        q: cupy ``[B, Hq, N]`` float16 or uint16 bf16 bits.
        k_codes, k_scales, v_codes, v_scales: contiguous planes (see the module docstring).
        lengths: host ints / NumPy ``[B]`` (checked against CAP), or cupy int32 ``[B]`` (checked with
            one device->host copy unless ``max_length`` bounds it).
        params, v_params: key / value formats (V defaults to K).
        Other arguments as :func:`plan` and :func:`run`.

    Raises:
        TypeError, ValueError: as :func:`plan` and :func:`run`; lengths outside [0, CAP].
    """
    kp, vp = check_kv_pair(params, v_params)
    cp = cupy()
    check_cupy_array("q", q, cp)
    if q.ndim != 3:
        raise ValueError(f"q must be [B, Hq, N], got {list(q.shape)}")
    hd = q.shape[-1]
    if hd != kp.n:
        extra = "" if hd > 0 and hd & (hd - 1) == 0 else " (head_dim must be a power of two)"
        raise ValueError(f"q head_dim {hd} != params.n {kp.n}{extra}")
    check_cupy_array("k_codes", k_codes, cp)
    if k_codes.ndim != 4:
        raise ValueError(f"k_codes must be [B, KVH, CAP, {kp.code_bytes}], got {list(k_codes.shape)}")
    bsz, kvh, cap = k_codes.shape[:3]
    if q.shape[0] != bsz:
        raise ValueError(f"q batch {q.shape[0]} != cache batch {bsz}")
    if cap % 16:
        raise ValueError(f"cache capacity {cap} must be a multiple of 16")
    if q.shape[1] % kvh:
        raise ValueError(f"q heads {q.shape[1]} must be a multiple of kv heads {kvh}")
    if isinstance(lengths, cp.ndarray):
        if lengths.shape != (bsz,):
            raise ValueError(f"lengths must be [B={bsz}], got {list(lengths.shape)}")
        host = cp.asnumpy(lengths).astype(np.int64) if max_length is None else None
        dev = cp.ascontiguousarray(lengths.astype(cp.int32, copy=False))
    else:
        host = np.asarray(lengths)
        if host.shape != (bsz,) or not np.issubdtype(host.dtype, np.integer):
            raise ValueError(f"lengths must be {bsz} integers, got {host!r}")
        host = host.astype(np.int64)
        dev = None
    if host is not None:
        if host.min(initial=0) < 0 or host.max(initial=0) > cap:
            raise ValueError(f"lengths must be in [0, capacity={cap}], got min {host.min()} max {host.max()}")
        maxlen = int(host.max(initial=0))
        if dev is None:
            dev = cp.asarray(host, dtype=cp.int32)
    else:
        if not 0 <= int(max_length) <= cap:
            raise ValueError(f"max_length must be in [0, capacity={cap}], got {max_length}")
        maxlen = int(max_length)
    pl = plan(kp, vp, batch=bsz, q_heads=q.shape[1], kv_heads=kvh, max_length=maxlen, capacity=cap,
              num_splits=num_splits, precise_p=precise_p, stages=stages, tune=tune,
              q_dtype="bf16" if q.dtype == cp.uint16 else "fp16", layout=layout)
    return run_planes(pl, pl.workspace(), q, k_codes, k_scales, v_codes, v_scales, dev, scale=scale, out=out,
                      out_dtype=out_dtype, layout=layout)
