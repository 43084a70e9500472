#!/usr/bin/env python3
"""GPU benchmark of the fwht-kv kernels (gpu_ref) against PyTorch SDPA (bf16, flash backend).

One run does everything on one GPU and writes JSON (and a log) under --out (default $OUT or
bench/results):

1. ceilings measured in the same run: device-to-device copy bandwidth (bytes read + written);
2. correctness spot checks: write kernel bit-exact vs the golden model, decode vs float64;
3. write kernel throughput (fp16 and bf16 input, N=128): bytes read + written per second;
4. decode attention, N=128, batch 1/8/32, context 4K..128K, GQA 64/8 and 32/8: median ms
   (CUDA-graph replays, inputs rotated so that the working set exceeds L2), effective GB/s of
   the bytes actually read, % of copy bandwidth, speed-up over SDPA bf16 on the same shapes
   (q heads packed as query rows of their KV head: the standard GQA decode layout, identical
   math; enable_gqa=True is timed too where the flash backend accepts it, the faster is used);
5. small tuning sweep (pipeline depth, split count) on the headline shape.

``--only versions`` (file gpu_bench_v2.json): the version-1 quantizer (mode midtread, scale
rounding up) and the version-2 one (midrise, nearest) side by side in one run: copy ceilings,
bit-exactness checks of both, write kernel fp16 16M x N=128 (bf16 and the mixed quantizers too),
decode GQA 64/8 N=128 at B1/4K, B8/128K, B32/128K for both (v1 timed twice, for the noise) and
SDPA bf16 on the same shapes. The quantizer fields are set explicitly (never FormatParams()'s
defaults).

``--only policy`` (file gpu_bench_policy.json): write kernel for b = 3 and 4; decode for
K3/V3, K4/V3, K4/V4, each plain, with 4 fp16 sinks, paged (16- and 64-token pages in a shuffled pool),
and with one q part (``qlo`` 0), at B 1/8/32 x T 4K/32K/128K, GQA 64/8 (32/8 for the plain
kernel), against SDPA bf16 on the same shapes.

``--only kernel`` (file gpu_bench_kernel.json): write kernel b = 3; decode K3/V3 and K4/V3, plain and
with 4 sinks, at B 1/8/32 x T 4K..128K (GQA 64/8), split counts at B1/4K, the current kernel with its
default plan and (``--baseline old=DIR,NAME=DIR``) previous kv_decode_attn.cu sources on the same planes in the same run
(e.g. a kernel with the workspace merge only), SDPA bf16; then workspace vs cluster merge where the
planner picks the cluster.

``--only write`` (file gpu_bench_write.json): the write kernel alone, 16M vectors of
N=128: the version-1 and version-2 quantizers in fp16 and bf16, b = 3 and 4, the key front end folded in
(key scales, centering, both; 8 kv heads), each checked bit-exact on 65536 mixed vectors first; with
``--baseline DIR`` (a folder holding a previous kv_encode.cu, kv_common.cuh and encode.py) the previous
kernel on the same inputs in the same run, and for the key front end its separate elementwise pass
(encode.py's ``_CENTER_SRC``) followed by the previous kernel.

``--only paging`` (file gpu_bench_paging.json): decode over paged pools (16- and 64-token pages)
against the contiguous layout, K3/V3 and K4/V3, GQA 64/8 and 32/8, B 1/8/32 x T 4K/32K/128K, SDPA bf16.

``--ncu-decode``: headline decode launches for ncu (default plan, then the tunes in $NCU_TUNES).

``--only waves`` (file gpu_bench_waves.json): decode K3/V3 GQA 32/8 at 128K, batches 32..64 (pairs of
(sequence, kv head) around the CTA slots), the planner's split count against fixed ones.

Usage: python -m bench.gpu --routine decode|write|policy|paging|waves|versions|kernel [--out DIR] [--quick]
       [--baseline NAME=DIR|DIR] [--baseline-tune JSON] [--tunes JSON] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings

warnings.filterwarnings("ignore", category=DeprecationWarning)

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cupy as cp  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gpu_ref  # noqa: E402
from gpu_ref.encode import launch_encode  # noqa: E402
from gpu_ref.layout import deinterleave, vpair_supported  # noqa: E402
from kvtest.gpu_cases import attention64, make_case, qparams, rel_err  # noqa: E402
from kvtest.inputs import mixed_bits  # noqa: E402
from kvtest.ties import count_ties, kernel_tie_vectors  # noqa: E402
from sim_models import FormatParams, decode_float, encode  # noqa: E402
from sim_models.params import PRESETS  # noqa: E402

L2_ROTATE_BYTES = 256 << 20   # rotate input sets until a graph touches at least this much


def log(*a):
    print(*a, flush=True)


def finish(result, save, t_start, tables=()):
    """End of a bench mode: the run's seconds into ``result``, saved; each (columns, row lines) of
    ``tables`` logged as a markdown table; the total logged."""
    result["seconds"] = time.time() - t_start
    save()
    for cols, lines in tables:
        log("\n| " + " | ".join(cols) + " |")
        log("|" + "---|" * len(cols))
        for line in lines:
            log(line)
    log(f"total {result['seconds']:.0f} s")


def graph_time(fn_list, reps=7, inner=None):
    """Median ms per call of the callables in fn_list (one graph replays them all, `inner` times).

    Falls back to timing a plain loop when capture fails (reported in the result).
    """
    torch.cuda.synchronize()
    for f in fn_list:
        f()
    torch.cuda.synchronize()
    n = len(fn_list)
    if inner is None:
        inner = max(1, 8 // n)
    calls = n * inner
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for f in fn_list:
                f()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(inner):
                for f in fn_list:
                    f()
        g.replay()
        torch.cuda.synchronize()
        run, how = g.replay, "cuda-graph"
    except Exception as err:  # noqa: BLE001
        log(f"  graph capture failed ({type(err).__name__}: {err}); timing a plain loop")
        torch.cuda.synchronize()

        def run():
            for _ in range(inner):
                for f in fn_list:
                    f()
        how = "loop"
    times = []
    for _ in range(reps):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        run()
        en.record()
        en.synchronize()
        times.append(st.elapsed_time(en) / calls)
    return statistics.median(times), times, how


def on_torch_stream(fn):
    def wrapped():
        with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            return fn()
    return wrapped


_BW_SRC = r"""
extern "C" __global__ void bw_copy(const uint4* __restrict__ a, uint4* __restrict__ b, long long n) {
  long long st = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += 4 * st) {
    uint4 v0 = a[i], v1 = i + st < n ? a[i + st] : v0, v2 = i + 2 * st < n ? a[i + 2 * st] : v0,
          v3 = i + 3 * st < n ? a[i + 3 * st] : v0;
    b[i] = v0; if (i + st < n) b[i + st] = v1; if (i + 2 * st < n) b[i + 2 * st] = v2;
    if (i + 3 * st < n) b[i + 3 * st] = v3;
  }
}
extern "C" __global__ void bw_read(const uint4* __restrict__ a, unsigned* out, long long n) {
  long long st = (long long)gridDim.x * blockDim.x;
  unsigned x = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += 4 * st) {
    uint4 v0 = a[i], v1 = i + st < n ? a[i + st] : v0, v2 = i + 2 * st < n ? a[i + 2 * st] : v0,
          v3 = i + 3 * st < n ? a[i + 3 * st] : v0;
    x ^= v0.x ^ v1.y ^ v2.z ^ v3.w;
  }
  if (x == 0x12345678u) out[0] = x;
}
"""


def kernel_bandwidth(nbytes):
    mod = cp.RawModule(code=_BW_SRC)
    kc, kr = mod.get_function("bw_copy"), mod.get_function("bw_read")
    a, b = cp.empty(nbytes, cp.uint8), cp.empty(nbytes, cp.uint8)
    a[:] = 7
    o = cp.zeros(1, cp.uint32)
    n16 = np.int64(nbytes // 16)
    grid = cp.cuda.Device().attributes["MultiProcessorCount"] * 8
    ms_c, _, _ = graph_time([on_torch_stream(lambda: kc((grid,), (512,), (a, b, n16)))], reps=9, inner=4)
    ms_r, _, _ = graph_time([on_torch_stream(lambda: kr((grid,), (512,), (a, o, n16)))], reps=9, inner=4)
    del a, b
    return 2 * nbytes / (ms_c * 1e-3) / 1e9, nbytes / (ms_r * 1e-3) / 1e9


def copy_bandwidth():
    nbytes = 4 << 30
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 255)
    ms, times, how = graph_time([lambda: b.copy_(a)], reps=9, inner=4)
    gbs = 2 * nbytes / (ms * 1e-3) / 1e9
    ca, cb = cp.empty(nbytes, cp.uint8), cp.empty(nbytes, cp.uint8)
    ms2, _, _ = graph_time([on_torch_stream(lambda: cb.data.copy_from_device_async(
        ca.data, nbytes, cp.cuda.get_current_stream()))], reps=9, inner=4)
    gbs2 = 2 * nbytes / (ms2 * 1e-3) / 1e9
    del a, b, ca, cb
    free()
    kcopy, kread = kernel_bandwidth(nbytes)
    free()
    return {"bytes": nbytes, "torch_copy_ms": ms, "torch_copy_GBps": gbs, "memcpy_ms": ms2,
            "memcpy_GBps": gbs2, "kernel_copy_GBps": kcopy, "kernel_read_GBps": kread,
            "GBps": max(gbs, gbs2, kcopy)}


def gpu_state():
    """SM clock (MHz), power (W) and temperature (C) right after a timing, via nvidia-smi (or None)."""
    import subprocess
    try:
        o = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
        c, pw, t = (x.strip() for x in o.strip().split("\n")[0].split(","))
        return {"sm_MHz": float(c), "power_W": float(pw), "temp_C": float(t)}
    except Exception:  # noqa: BLE001
        return None


def free():
    torch.cuda.synchronize()
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
def check_encode(count=32768):
    out = {}
    for dtype in ("fp16", "bf16"):
        p = FormatParams(dtype=dtype)
        bits = mixed_bits(128, count, seed=11, dtype=dtype)
        g = encode(bits, p)
        e = gpu_ref.encode_kv(cp.asarray(bits), p)
        ok = (np.array_equal(g.codes, cp.asnumpy(e.codes)) and np.array_equal(g.scales, cp.asnumpy(e.scales))
              and np.array_equal(g.flags, cp.asnumpy(e.flags)))
        out[dtype] = {"vectors": count, "bit_exact": bool(ok)}
    return out


def check_decode():
    lengths = [4096, 1500]
    p, cache, qb, q64, k64, v64 = make_case(2, 64, 8, 128, 64, lengths, seed=1)
    hp = cache.host_planes()  # golden byte order
    khat = decode_float(hp["k_codes"], hp["k_scales"], p)
    vhat = decode_float(hp["v_codes"], hp["v_scales"], p)
    ref = attention64(q64, khat, vhat, lengths, 1 / math.sqrt(128))
    exact = attention64(q64, k64, v64, lengths, 1 / math.sqrt(128))
    o32 = cp.asnumpy(cache.attend(cp.asarray(qb.view(np.float16)), out_dtype="fp32"))
    o32p = cp.asnumpy(cache.attend(cp.asarray(qb.view(np.float16)), out_dtype="fp32", precise_p=True))
    o32q = cp.asnumpy(cache.attend(cp.asarray(qb.view(np.float16)), out_dtype="fp32", tune={"qlo": 0}))
    # bf16 attention on the unquantized K/V, for scale
    qt = torch.tensor(q64, dtype=torch.bfloat16, device="cuda")
    errs_bf16 = []
    for b, L in enumerate(lengths):
        kt = torch.tensor(k64[b, :, :L], dtype=torch.bfloat16, device="cuda")
        vt = torch.tensor(v64[b, :, :L], dtype=torch.bfloat16, device="cuda")
        o = F.scaled_dot_product_attention(qt[b:b + 1, :, None], kt[None], vt[None], enable_gqa=True)
        errs_bf16.append(o[0, :, 0].float().cpu().numpy())
    ob = np.stack(errs_bf16)
    return {"shape": "B2 Hq64 KVH8 N128 lengths 4096,1500",
            "rel_err_vs_float64_packed": rel_err(o32, ref), "rel_err_precise_p": rel_err(o32p, ref), "rel_err_qlo0": rel_err(o32q, ref),
            "quant_rel_err_vs_exact": rel_err(o32, exact), "sdpa_bf16_rel_err_vs_exact": rel_err(ob, exact)}


# ---------------------------------------------------------------------------------------------
WRITE_VARIANTS = ({"lptm": 128, "minb": 3}, {"lptm": 128, "minb": 2}, {"lptm": 64, "minb": 4})


def write_variant_exact(p, tune, count=65536):
    """Bit-exactness of one write-kernel variant (tuning knobs) vs the golden model, mixed set."""
    bits = mixed_bits(p.n, count, seed=23, dtype=p.dtype)
    g = encode(bits, p)
    x = cp.asarray(bits)
    codes = cp.empty((count, p.code_bytes), cp.uint8)
    scales = cp.empty((count, p.n_blocks), cp.uint8)
    flags = cp.empty((count,), cp.uint8)
    launch_encode(x, p, codes, scales, flags, None, cp, tune)
    return bool(np.array_equal(g.codes, cp.asnumpy(codes)) and np.array_equal(g.scales, cp.asnumpy(scales))
                and np.array_equal(g.flags, cp.asnumpy(flags)))


def bench_write(nvec=16 << 20, variants=WRITE_VARIANTS, bf16_variants=2, cases=None):
    """Write-kernel timings; ``cases``: list of (label, FormatParams, tune) (default: the tuning variants
    of the default format in fp16 and bf16)."""
    res = []
    if cases is None:
        cases = [(None, FormatParams(dtype=dt), v) for dt, v in
                 [("fp16", v) for v in variants] + [("bf16", v) for v in variants[:bf16_variants]]]
    for label, p, tune in cases:
        dtype = p.dtype
        try:
            exact = write_variant_exact(p, tune)
        except Exception:  # noqa: BLE001
            exact = traceback.format_exc()[-300:]
        x = write_inputs(nvec, dtype, heads=1).reshape(nvec, 128)
        codes = cp.empty((nvec, 48), cp.uint8)
        scales = cp.empty((nvec, 2), cp.uint8)
        flags = cp.empty((nvec,), cp.uint8)
        # (tune None: the gpu_ref defaults, ENCODE_TUNE)
        launch_encode(x, p, codes, scales, flags, None, cp, tune)  # compile + warm
        fn = on_torch_stream(lambda: launch_encode(x, p, codes, scales, flags, None, cp, tune))
        ms, times, how = graph_time([fn], reps=9, inner=3)
        nbytes = nvec * (256 + 48 + 2 + 1)
        res.append({"dtype": dtype, "tune": tune, "bit_exact_65536": exact, "vectors": nvec, "ms": ms, "bytes": nbytes,
                    "GBps": nbytes / (ms * 1e-3) / 1e9, "timing": how, "all_ms": times})
        if label is not None:
            res[-1].update({"label": label, "mode": p.mode, "scale_round": p.scale_round,
                            "gpu_state_after": gpu_state()})
        del x, codes, scales, flags
        free()
    return res


def make_planes(bsz, kvh, t, n_sets, p):
    cb, nb = p.code_bytes, p.n_blocks
    sets = []
    for _ in range(n_sets):
        kc = cp.random.randint(0, 256, (bsz, kvh, t, cb), dtype=cp.uint8)
        vc = cp.random.randint(0, 256, (bsz, kvh, t, cb), dtype=cp.uint8)
        ks = cp.random.randint(40, 72, (bsz, kvh, t, nb), dtype=cp.uint8)
        vs = cp.random.randint(40, 72, (bsz, kvh, t, nb), dtype=cp.uint8)
        sets.append((kc, ks, vc, vs))
    return sets


def decode_inputs(bsz, hq, kvh, t, p):
    """Inputs of a decode timing: enough sets of random packed planes (:func:`make_planes`) that they
    rotate through more than L2, fp16 q, full lengths, an fp16 output, and the result row's shape
    fields. Returns (sets, q, lens, out, comp_bytes, row)."""
    comp_bytes = bsz * kvh * t * 2 * (p.code_bytes + p.n_blocks)
    n_sets = max(1, min(64, math.ceil(L2_ROTATE_BYTES / comp_bytes)))
    sets = make_planes(bsz, kvh, t, n_sets, p)
    q = (cp.random.standard_normal((bsz, hq, p.n), dtype=cp.float32)).astype(cp.float16)
    lens = cp.full((bsz,), t, dtype=cp.int32)
    out = cp.empty((bsz, hq, p.n), cp.float16)
    row = {"batch": bsz, "q_heads": hq, "kv_heads": kvh, "context": t, "N": p.n,
           "compressed_bytes": comp_bytes, "sets_rotated": n_sets}
    return sets, q, lens, out, comp_bytes, row


def bench_decode_one(bsz, hq, kvh, t, p, sdpa=True, variants=None):
    n = p.n
    sets, q, lens, out, comp_bytes, row = decode_inputs(bsz, hq, kvh, t, p)
    var_rows = []
    for var in (variants or [{}]):
        pl = gpu_ref.plan(p, batch=bsz, q_heads=hq, kv_heads=kvh, max_length=t, capacity=t, **var)
        ws = pl.workspace()
        fns = [on_torch_stream(lambda s=s, pl=pl, ws=ws: gpu_ref.run_planes(pl, ws, q, *s, lens, out=out))
               for s in sets]
        ms, times, how = graph_time(fns, reps=7)
        gbs = comp_bytes / (ms * 1e-3) / 1e9
        var_rows.append({"variant": var, "ms": ms, "GBps": gbs, "all_ms": times, "timing": how})
    best = min(var_rows, key=lambda r: r["ms"])
    row["gpu_state_after"] = gpu_state()
    row.update({"ours_ms": best["ms"], "ours_GBps": best["GBps"], "ours_timing": best["timing"],
                "ours_all_ms": best["all_ms"]})
    if variants:
        row["variants"] = var_rows
    del sets
    free()
    if sdpa:
        sms, bf_bytes, res = sdpa_time(bsz, hq, kvh, t, n)
        row["sdpa_variants"] = res
        if sms is not None:
            row.update({"sdpa_bf16_ms": sms, "sdpa_bytes": bf_bytes,
                        "sdpa_GBps": bf_bytes / (sms * 1e-3) / 1e9, "speedup": sms / row["ours_ms"]})
    return row


# ---------------------------------------------------------------------------------------------
# version 1 (midtread / up) vs version 2 (midrise / nearest), one run
#: compared format versions: names of FormatParams presets
VERSIONS = ("v1", "v2")


def check_versions(count=32768):
    """Bit-exactness of the write kernel (mixed set incl. NaN/inf/subnormal salt, and the tie vectors)
    and decode error vs float64 over the golden-dequantized cache, for v1 and v2."""
    out = {}
    for name in VERSIONS:
        r = {}
        for dtype in ("fp16", "bf16"):
            p = FormatParams.preset(name, dtype=dtype)
            bits = mixed_bits(128, count, seed=11, dtype=dtype)
            if dtype == "fp16":
                bits = np.concatenate([bits, kernel_tie_vectors(p)])
            g = encode(bits, p)
            e = gpu_ref.encode_kv(cp.asarray(bits), p)
            ok = (np.array_equal(g.codes, cp.asnumpy(e.codes)) and np.array_equal(g.scales, cp.asnumpy(e.scales))
                  and np.array_equal(g.flags, cp.asnumpy(e.flags)))
            r[f"encode_{dtype}"] = {"vectors": len(bits), "bit_exact": bool(ok)}
            if dtype == "fp16":
                r["tie_lanes_blocks"] = count_ties(kernel_tie_vectors(p), p)
        lengths = [4096, 1500]
        p, cache, qb, q64, k64, v64 = make_case(2, 64, 8, 128, 64, lengths, seed=1,
                                                 quant=(PRESETS[name]["mode"], PRESETS[name]["scale_round"]))
        hp = cache.host_planes()  # golden byte order
        khat = decode_float(hp["k_codes"], hp["k_scales"], p)
        vhat = decode_float(hp["v_codes"], hp["v_scales"], p)
        ref = attention64(q64, khat, vhat, lengths, 1 / math.sqrt(128))
        exact = attention64(q64, k64, v64, lengths, 1 / math.sqrt(128))
        o32 = cp.asnumpy(cache.attend(cp.asarray(qb.view(np.float16)), out_dtype="fp32"))
        r["decode"] = {"shape": "B2 Hq64 KVH8 N128 lengths 4096,1500",
                       "rel_err_vs_float64_packed": rel_err(o32, ref), "quant_rel_err_vs_exact": rel_err(o32, exact)}
        out[name] = r
    return out


def sdpa_time(bsz, hq, kvh, t, n):
    """SDPA bf16 (flash backend) on the same shape: packed-GQA and enable_gqa, the faster is used."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    group = hq // kvh
    bf_bytes = bsz * kvh * t * n * 2 * 2
    ns = max(1, min(16, math.ceil(L2_ROTATE_BYTES / bf_bytes)))
    kv = [(torch.randn(bsz, kvh, t, n, dtype=torch.bfloat16, device="cuda"),
           torch.randn(bsz, kvh, t, n, dtype=torch.bfloat16, device="cuda")) for _ in range(ns)]
    qp = torch.randn(bsz, kvh, group, n, dtype=torch.bfloat16, device="cuda")   # packed GQA
    qg = torch.randn(bsz, hq, 1, n, dtype=torch.bfloat16, device="cuda")
    res = {}
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        for key, fn in (("packed", lambda k, v: F.scaled_dot_product_attention(qp, k, v)),
                        ("enable_gqa", lambda k, v: F.scaled_dot_product_attention(qg, k, v, enable_gqa=True))):
            try:
                ms, times, how = graph_time([lambda k=k, v=v, fn=fn: fn(k, v) for k, v in kv], reps=7)
                res[key] = {"ms": ms, "timing": how, "all_ms": times}
            except Exception as err:  # noqa: BLE001
                res[key + "_error"] = f"{type(err).__name__}: {err}"
    del kv, qp, qg
    free()
    ok = [v["ms"] for k, v in res.items() if not k.endswith("_error")]
    return (min(ok) if ok else None), bf_bytes, res


def bench_decode_versions(bsz, hq, kvh, t, order=("v1", "v2", "v1")):
    """Decode timings of both versions on the same random packed planes (any byte is a valid code
    plane for both modes), v1 timed twice (first and last) to show the run-to-run spread."""
    ps = {k: FormatParams.preset(k) for k in VERSIONS}
    n = ps["v1"].n
    sets, q, lens, out, comp_bytes, row = decode_inputs(bsz, hq, kvh, t, ps["v1"])
    row["runs"] = []
    for name in order:
        p = ps[name]
        pl = gpu_ref.plan(p, batch=bsz, q_heads=hq, kv_heads=kvh, max_length=t, capacity=t)
        ws = pl.workspace()
        fns = [on_torch_stream(lambda s=s, pl=pl, ws=ws: gpu_ref.run_planes(pl, ws, q, *s, lens, out=out))
               for s in sets]
        ms, times, how = graph_time(fns, reps=7)
        row["runs"].append({"version": name, "mode": p.mode, "ms": ms, "GBps": comp_bytes / (ms * 1e-3) / 1e9,
                            "all_ms": times, "timing": how, "gpu_state_after": gpu_state()})
    del sets
    free()
    for name in VERSIONS:
        row[f"{name}_ms"] = min(r["ms"] for r in row["runs"] if r["version"] == name)
    sms, bf_bytes, res = sdpa_time(bsz, hq, kvh, t, n)
    row["sdpa_variants"] = res
    if sms is not None:
        row.update({"sdpa_bf16_ms": sms, "sdpa_bytes": bf_bytes, "sdpa_GBps": bf_bytes / (sms * 1e-3) / 1e9})
        for name in VERSIONS:
            row[f"{name}_speedup"] = sms / row[f"{name}_ms"]
    return row


def run_versions(a, result, save, t_start):
    """--only versions: v1 vs v2 in one run (module docstring)."""
    copy_gbs = result["copy"]["GBps"]
    t0 = time.time()
    try:
        result["checks"] = check_versions()
    except Exception:  # noqa: BLE001
        result["checks"] = {"error": traceback.format_exc()}
    log(f"checks ({time.time() - t0:.1f}s): {json.dumps(result['checks'], default=float)[:900]}")
    save()
    v1, v2 = FormatParams.preset("v1"), FormatParams.preset("v2")
    cases = [("v1 fp16", v1, None), ("v2 fp16", v2, None), ("v1 fp16 again", v1, None),
             ("v1 bf16", FormatParams.preset("v1", dtype="bf16"), None),
             ("v2 bf16", FormatParams.preset("v2", dtype="bf16"), None),
             ("midtread/nearest fp16", qparams("midtread", "nearest"), None),
             ("midrise/up fp16", qparams("midrise", "up"), None)]
    try:
        result["write"] = bench_write(cases=cases)
        for r in result["write"]:
            r["pct_copy"] = 100 * r["GBps"] / copy_gbs
            log(f"write {r['label']}: {r['ms']:.3f} ms, {r['GBps']:.0f} GB/s = {r['pct_copy']:.1f}% of copy "
                f"(bit-exact 64K: {r['bit_exact_65536']}) {r.get('gpu_state_after')}")
    except Exception:  # noqa: BLE001
        result["write"] = {"error": traceback.format_exc()}
        log(result["write"]["error"])
    save()
    rows = []
    for bsz, hq, kvh, t in ((1, 64, 8, 4096), (8, 64, 8, 131072), (32, 64, 8, 131072)):
        t0 = time.time()
        try:
            r = bench_decode_versions(bsz, hq, kvh, t)
            for name in VERSIONS:
                r[f"{name}_pct_copy"] = 100 * r["compressed_bytes"] / (r[f"{name}_ms"] * 1e-3) / 1e9 / copy_gbs
            rows.append(r)
            log(f"B{bsz} {hq}/{kvh} T{t}: " + ", ".join(f"{x['version']} {x['ms']:.4f}" for x in r["runs"]) +
                f" ms | sdpa bf16 {r.get('sdpa_bf16_ms', float('nan')):.4f} ms [{time.time() - t0:.1f}s]")
        except Exception:  # noqa: BLE001
            rows.append({"batch": bsz, "q_heads": hq, "kv_heads": kvh, "context": t, "error": traceback.format_exc()})
            log(rows[-1]["error"])
            free()
        result["decode"] = rows
        save()
    finish(result, save, t_start, (
        (("write 16M x N=128", "ms", "GB/s", "% copy"),
         [f"| {r['label']} | {r['ms']:.3f} | {r['GBps']:.0f} | {r['pct_copy']:.1f} |"
          for r in (result["write"] if isinstance(result["write"], list) else [])]),
        (("batch", "GQA", "context", "v1 ms", "v2 ms", "SDPA bf16 ms", "v1 speed-up", "v2 speed-up"),
         [f"| {r['batch']} | {r['q_heads']}/{r['kv_heads']} | {r['context']} | {r['v1_ms']:.4f} | {r['v2_ms']:.4f} | "
          f"{r.get('sdpa_bf16_ms', float('nan')):.4f} | {r.get('v1_speedup', float('nan')):.2f} | "
          f"{r.get('v2_speedup', float('nan')):.2f} |" for r in rows if "v1_ms" in r])))


def ncu_decode_driver():
    """Headline decode launches (B8/128K K3/V3 GQA 64/8, v2 quantizer) for ncu: the default plan, then each
    tune of the JSON list in $NCU_TUNES (one launch each, after one warm-up launch of all)."""
    p = qparams("midrise", "nearest", bits=3)
    s = make_planes(8, 8, 131072, 1, p)[0]
    q = cp.random.standard_normal((8, 64, 128), dtype=cp.float32).astype(cp.float16)
    lens = cp.full((8,), 131072, dtype=cp.int32)
    tunes = [None] + json.loads(os.environ.get("NCU_TUNES", "[]"))
    for tu in tunes:  # the cache's layout (vpair; the random bytes are valid codes in any order)
        gpu_ref.decode_attention(q, *s, lens, p, max_length=131072, tune=tu, layout="vpair")
    if os.environ.get("NCU_WIRE"):  # and the same source on the golden order
        gpu_ref.decode_attention(q, *s, lens, p, max_length=131072, layout="wire")
    cp.cuda.Device().synchronize()


def ncu_driver():
    """One headline decode and one write launch (run under ncu)."""
    p = FormatParams()
    s = make_planes(8, 8, 131072, 1, p)[0]
    q = cp.random.standard_normal((8, 64, 128), dtype=cp.float32).astype(cp.float16)
    lens = cp.full((8,), 131072, dtype=cp.int32)
    for tune in (None, {"stages": 2, "minb": 3}):
        gpu_ref.decode_attention(q, *s, lens, p, max_length=131072, tune=tune)
    x = cp.random.standard_normal((1 << 22, 128), dtype=cp.float32).astype(cp.float16)
    for tune in ({"lptm": 64, "minb": 4}, {"lptm": 128, "minb": 2}):
        gpu_ref.encode_kv(x, p) if tune is None else launch_encode(
            x.view(cp.uint16), p, cp.empty((1 << 22, 48), cp.uint8), cp.empty((1 << 22, 2), cp.uint8),
            cp.empty((1 << 22,), cp.uint8), None, cp, tune)
    cp.cuda.Device().synchronize()


# ---------------------------------------------------------------------------------------------
# cache policy: bits per tensor, sinks, paging, against SDPA bf16
POLICY_BITS = ((3, 3), (4, 3), (4, 4))
POLICY_SHAPES = ((1, 4096), (1, 32768), (1, 131072), (8, 4096), (8, 32768), (8, 131072),
                 (32, 131072))


def policy_planes(bsz, kvh, t, n_sets, kp, vp, page):
    """Random packed planes (any byte is a valid code) for K/V formats; paged: a pool with the pages
    of all sequences in a random order and its block table."""
    sets = []
    rng = np.random.default_rng(0)
    for _ in range(n_sets):
        if page is None:
            shp, bt = (bsz, kvh, t), None
        else:
            mp = -(-t // page)
            shp = (bsz * mp, kvh, page)
            bt = cp.asarray(rng.permutation(bsz * mp).reshape(bsz, mp).astype(np.int32))
        kc = cp.random.randint(0, 256, (*shp, kp.code_bytes), dtype=cp.uint8)
        vc = cp.random.randint(0, 256, (*shp, vp.code_bytes), dtype=cp.uint8)
        ks = cp.random.randint(40, 72, (*shp, kp.n_blocks), dtype=cp.uint8)
        vs = cp.random.randint(40, 72, (*shp, vp.n_blocks), dtype=cp.uint8)
        sets.append((kc, ks, vc, vs, bt))
    return sets


def policy_inputs(bsz, hq, kvh, t, kp, vp, sinks, page, out_dtype):
    """Everything one decode timing needs: (packed bytes, sets of planes rotated past L2, capacity
    rows, q, lengths, out, k_sink, v_sink); q and the sink rows fp16, every length ``t``."""
    n = kp.n
    packed = bsz * kvh * t * (kp.code_bytes + vp.code_bytes + 2 * kp.n_blocks)
    n_sets = max(1, min(32, math.ceil(L2_ROTATE_BYTES / packed)))
    rows = -(-(t - sinks) // 16) * 16  # contiguous capacity: packed tokens rounded up to 16
    sets = policy_planes(bsz, kvh, rows, n_sets, kp, vp, page)
    q = cp.random.standard_normal((bsz, hq, n), dtype=cp.float32).astype(cp.float16)
    lens = cp.full((bsz,), t, dtype=cp.int32)
    out = cp.empty((bsz, hq, n), out_dtype)
    sk = sv = None
    if sinks:
        sk = cp.random.standard_normal((bsz, kvh, sinks, n), dtype=cp.float32).astype(cp.float16)
        sv = cp.random.standard_normal((bsz, kvh, sinks, n), dtype=cp.float32).astype(cp.float16)
    return packed, sets, rows, q, lens, out, sk, sv


def bench_policy_shape(bsz, hq, kvh, t, bits_list, variants, quick=False):
    """Decode ms for each (bits, variant) on one shape, plus SDPA bf16 on the same shape."""
    n = 128
    out_rows = []
    for kb, vb in bits_list:
        kp = qparams("midrise", "nearest", bits=kb)
        vp = qparams("midrise", "nearest", bits=vb)
        for var in variants:
            sinks, page = var.get("sinks", 0), var.get("page")
            packed, sets, rows, q, lens, out, sk, sv = policy_inputs(bsz, hq, kvh, t, kp, vp, sinks, page,
                                                                    cp.float16)
            n_sets = len(sets)
            # KVCache's value layout (the random bytes are valid codes in any order)
            lay = var.get("layout") or ("vpair" if vpair_supported(vp.bits, vp.block) else "wire")
            pl = gpu_ref.plan(kp, vp, batch=bsz, q_heads=hq, kv_heads=kvh, max_length=t, sinks=sinks,
                              page_size=page, capacity=None if page else rows, tune=var.get("tune"), layout=lay)
            ws = pl.workspace()
            fns = [on_torch_stream(lambda s=s, pl=pl, ws=ws: gpu_ref.run_planes(
                pl, ws, q, s[0], s[1], s[2], s[3], lens, s[4], k_sink=sk, v_sink=sv, out=out, layout=pl.layout))
                for s in sets]
            ms, times, how = graph_time(fns, reps=5 if quick else 7)
            out_rows.append({"bits": f"K{kb}V{vb}", "sinks": sinks, "page": page, "tune": var.get("tune"),
                             "layout": lay,
                         "ms": ms, "all_ms": times, "timing": how, "packed_bytes": packed,
                         "GBps": packed / (ms * 1e-3) / 1e9, "splits": pl.num_splits, "sets": n_sets})
            log(f"  B{bsz} T{t} Hq{hq}/{kvh} K{kb}V{vb} sinks {sinks} page {page} {lay} {var.get('tune') or ''}: "
                f"{ms:.4f} ms, {out_rows[-1]['GBps']:.0f} GB/s, {pl.num_splits} splits")
            del sets
            free()
    sms, bf_bytes, res = sdpa_time(bsz, hq, kvh, t, n)
    return {"batch": bsz, "q_heads": hq, "kv_heads": kvh, "context": t, "N": n, "rows": out_rows,
            "sdpa_bf16_ms": sms, "sdpa_bytes": bf_bytes, "sdpa_variants": res,
            "gpu_state_after": gpu_state()}


def run_policy(a, result, save, t_start):
    """--only policy: write kernel per bits, decode for K3/V3, K4/V3, K4/V4 x (plain, 4 sinks, pages of
    16 and 64 tokens) at B 1/8/32 x T 4K..128K, GQA 64/8 (and 32/8 for the plain kernel), SDPA bf16."""
    copy_gbs = result["copy"]["GBps"]
    result["write"] = []
    for kb in (3, 4):
        for dt in ("fp16", "bf16"):
            p = qparams("midrise", "nearest", bits=kb, dtype=dt)
            nvec = 1 << 24 if not a.quick else 1 << 22
            g = cp.random.standard_normal((nvec, 128), dtype=cp.float32)
            x = g.astype(cp.float16).view(cp.uint16) if dt == "fp16" else (g.view(cp.uint32) >> 16).astype(cp.uint16)
            del g
            codes = cp.empty((nvec, p.code_bytes), cp.uint8)
            scales = cp.empty((nvec, p.n_blocks), cp.uint8)
            flags = cp.empty((nvec,), cp.uint8)
            fn = on_torch_stream(lambda: launch_encode(x, p, codes, scales, flags, None, cp))
            ms, times, how = graph_time([fn], reps=7, inner=2)
            byts = nvec * (256 + p.code_bytes + p.n_blocks + 1)
            r = {"bits": kb, "dtype": dt, "vectors": nvec, "ms": ms, "GBps": byts / (ms * 1e-3) / 1e9,
                 "pct_copy": 100 * byts / (ms * 1e-3) / 1e9 / copy_gbs, "timing": how}
            result["write"].append(r)
            log(f"write b={kb} {dt}: {ms:.3f} ms, {r['GBps']:.0f} GB/s = {r['pct_copy']:.1f}% of copy")
            del x, codes, scales, flags
            free()
    save()
    # sinks 20: the side rows of v4 (4 sinks and a ring of 16 recent tokens)
    variants = [{}, {"sinks": 4}, {"sinks": 20}, {"page": 16}, {"page": 64}, {"sinks": 4, "page": 16}]
    shapes = POLICY_SHAPES if not a.quick else ((1, 4096), (8, 32768))
    result["decode"] = []
    for bsz, t in shapes:
        for hq, kvh in ((64, 8), (32, 8)):
            bl = POLICY_BITS if hq == 64 else POLICY_BITS[:2]
            vs = variants if hq == 64 else [{}, {"tune": {"qlo": 0}}]
            if hq == 64:
                vs = vs + [{"tune": {"qlo": 0}}]
            try:
                row = bench_policy_shape(bsz, hq, kvh, t, bl, vs, a.quick)
            except Exception:  # noqa: BLE001
                row = {"batch": bsz, "context": t, "q_heads": hq, "error": traceback.format_exc()}
                log(row["error"])
            result["decode"].append(row)
            if row.get("sdpa_bf16_ms"):
                for r in row["rows"]:
                    r["speedup"] = row["sdpa_bf16_ms"] / r["ms"]
                    r["pct_copy"] = 100 * r["GBps"] / copy_gbs
                log(f"  SDPA bf16 {row['sdpa_bf16_ms']:.4f} ms")
            save()
    finish(result, save, t_start)


# ---------------------------------------------------------------------------------------------
# decode kernel: the current kernel against a previous source in the same run
KERNEL_SHAPES = ((1, 4096), (1, 32768), (1, 131072), (8, 4096), (8, 131072), (32, 131072))
KERNEL_VARIANTS = ({"bits": (3, 3)}, {"bits": (3, 3), "sinks": 4}, {"bits": (4, 3)}, {"bits": (4, 3), "sinks": 4},
                   {"bits": (3, 3), "sinks": 4, "key_scales": True}, {"bits": (4, 3), "sinks": 4, "key_scales": True})
#: the decode side of format version 3's policies (FORMAT.md 8): v3 = K3V3 + 4 sinks + key scales (q / s in the
#: kernel: a plan with key_scales feeds q~ as two fp16 parts); centering needs nothing at decode time


class kernel_source:  # noqa: N801 - used as a context manager
    """Compile gpu_ref's decode kernel from another folder (a previous kv_decode_attn.cu) inside the block."""

    def __init__(self, folder):
        from gpu_ref import _build
        self.b, self.folder = _build, folder

    def __enter__(self):
        self.here = self.b.HERE
        self.b.HERE, self.b._kernels = self.folder, {}
        return self

    def __exit__(self, *exc):
        self.b.HERE, self.b._kernels = self.here, {}


def legacy_run(pl, ws, q, kc, ks, vc, vs, lens, k_sink, v_sink, out):
    """gpu_ref.run for kernel sources without the KvDecParams struct (positional kernel
    arguments): contiguous planes, fp16 q, fp32 out, no key scales. Used inside ``kernel_source`` only."""
    from gpu_ref import _build
    n = pl.k_params.n
    kvh, ht = pl.kv_heads, pl.head_tiles
    z = np.uint64(0)
    _build.kernel(pl.kind, pl.targs, pl.smem)(
        (pl.batch * kvh * ht, pl.partials), (128,),
        (q, np.int32(0), kc, ks, vc, vs, z, np.int32(1), np.int32(-1), np.int64(pl.capacity), lens,
         z if k_sink is None else k_sink, z if v_sink is None else v_sink, np.int32(pl.sinks), z, ws.acc, ws.ml,
         ws.counters, out, np.int32(2), np.int32(pl.q_heads), np.int32(kvh), np.int32(ht),
         np.int32(pl.q_heads // kvh), np.int64(pl.capacity), np.int32(pl.partials), np.int32(pl.chunk),
         np.float32(1.0 / math.sqrt(n))), shared_mem=pl.smem)
    return out


def bench_kernel_shape(bsz, t, variants, baseline=None, hq=64, kvh=8, splits=(None,), quick=False, cluster=False,
                       tunes=(), base_tune=None):
    """Decode ms of the current kernel (and of ``baseline``'s sources, planned with ``base_tune``; of the
    current kernel with each of ``tunes``; or with ``cluster``: of the cluster merge; same planes, timed right
    after) per variant and split count on one shape, the relative difference of each output to the first
    one's, SDPA bf16. Baselines and tunes: K3/V3 variants, default split count."""
    import dataclasses
    n = 128
    rows = []
    for vi, var in enumerate(variants):
        kb, vb = var["bits"]
        sinks, kscale = var.get("sinks", 0), bool(var.get("key_scales"))
        kp, vp = qparams("midrise", "nearest", bits=kb), qparams("midrise", "nearest", bits=vb)
        packed, sets, cap, q, lens, out, sk, sv = policy_inputs(bsz, hq, kvh, t, kp, vp, sinks, None, cp.float32)
        # key scales 2^e, e in [-2, 2] per channel (the calibrated tables' spread): q_scale = 1 / s
        qs = (cp.exp2(-cp.random.randint(-2, 3, (kvh, n)).astype(cp.float32)) if kscale else None)
        n_sets = len(sets)
        # the random value planes are read as vpair by the current kernel (KVCache's layout); the wire path and the
        # baseline sources read the same values de-interleaved (gpu_ref.layout), so every output is comparable
        lay = "vpair" if vpair_supported(vp.bits, vp.block) else "wire"
        wsets = sets if lay == "wire" else [(a, b, deinterleave(c), d, e) for a, b, c, d, e in sets]
        for ns in (splits if vi == 0 else (None,)):  # split counts: first variant only
            def mk(layout=lay, **tune):
                return gpu_ref.plan(kp, vp, batch=bsz, q_heads=hq, kv_heads=kvh, max_length=t, sinks=sinks,
                                    capacity=cap, num_splits=ns, tune=tune or None, layout=layout,
                                    key_scales=kscale)
            pl = mk()  # the defaults (cluster merge where the planner picks it)
            pw = mk(cluster=0)
            ws = pw.workspace()
            impls = [("new", pl, None)]
            if lay == "vpair" and ns is None and not cluster and not sinks and not kscale:
                impls.append(("wire", mk(layout="wire"), None))  # the same source on the golden order
            k33 = (kb, vb) == (3, 3) and ns is None and not kscale
            for bname, bdir in baseline or ():
                if bname == "old":  # a kernel with sinks inside split 0, grid y = token splits, workspace merge
                    pw0 = mk(layout="wire", cluster=0)
                    impls.append(("old", dataclasses.replace(pw0, partials=pw0.num_splits), bdir))
                elif k33:  # an intermediate source with the current plan layout
                    bt = base_tune or {}
                    bt = bt.get(bname, {}) if bt and all(isinstance(v, dict) for v in bt.values()) else bt
                    impls.append((bname, mk(layout="wire", **bt), bdir))
            if k33:
                for tu in tunes:
                    impls.append(("tune " + json.dumps(tu, sort_keys=True), mk(**tu), None))
            if cluster:
                pc = mk(cluster=1)
                if pc.kind != "decode_cl":
                    continue
                impls = [("ws", pw, None), ("cl", pc, None)]
            outs = {}
            for name, p_, src in impls:
                wsi = ws if p_.workspace_floats == pw.workspace_floats else p_.workspace()

                legacy = bool(src) and "struct KvDecParams" not in open(os.path.join(src, "kv_decode_attn.cu")).read()
                if src and "int VIL" not in open(os.path.join(src, "kv_decode_attn.cu")).read():
                    # a source without the layout template argument (index 13 of the targs)
                    p_ = dataclasses.replace(p_, targs=p_.targs[:13] + p_.targs[14:])
                psets = sets if p_.layout == "vpair" else wsets

                def call(s, p_=p_, wsi=wsi, legacy=legacy):
                    if legacy:  # a source without KvDecParams: positional kernel arguments
                        return legacy_run(p_, wsi, q, s[0], s[1], s[2], s[3], lens, sk, sv, out)
                    return gpu_ref.run_planes(p_, wsi, q, s[0], s[1], s[2], s[3], lens, k_sink=sk, v_sink=sv,
                                              out=out, out_dtype="fp32", layout=p_.layout, q_scale=qs)
                ctx = kernel_source(src) if src else None
                try:
                    if ctx:
                        ctx.__enter__()
                    outs[name] = cp.asnumpy(call(psets[0]))
                    fns = [on_torch_stream(lambda s=s: call(s)) for s in psets]
                    ms, times, how = graph_time(fns, reps=5 if quick else 7)
                finally:
                    if ctx:
                        ctx.__exit__()
                rows.append({"impl": name, "bits": f"K{kb}V{vb}", "sinks": sinks, "key_scales": kscale,
                             "layout": p_.layout,
                             "num_splits": p_.num_splits,
                             "partials": p_.partials, "kernel": p_.kind, "targs": list(p_.targs), "split_arg": ns,
                             "ms": ms, "all_ms": times, "timing": how,
                             "packed_bytes": packed, "GBps": packed / (ms * 1e-3) / 1e9, "sets": n_sets})
                log(f"  B{bsz} T{t} Hq{hq}/{kvh} K{kb}V{vb} sinks {sinks} splits {p_.num_splits} {p_.kind} {name}: "
                    f"{ms * 1e3:.2f} us, {rows[-1]['GBps']:.0f} GB/s")
            first = impls[0][0]
            for k, (other, _, _) in enumerate(impls[1:]):
                if other in outs:
                    d = float(np.linalg.norm(outs[first] - outs[other]) / max(np.linalg.norm(outs[first]), 1e-30))
                    rows[len(rows) - len(impls) + 1 + k][f"rel_diff_vs_{first}"] = d
                    log(f"    {first} vs {other} output: relative difference {d:.2e}")
        del sets, wsets
        free()
    sms, bf_bytes, res = sdpa_time(bsz, hq, kvh, t, n)
    for r in rows:
        r["speedup"] = sms / r["ms"] if sms else None
    log(f"  SDPA bf16 {sms * 1e3:.2f} us")
    return {"batch": bsz, "q_heads": hq, "kv_heads": kvh, "context": t, "N": n, "rows": rows,
            "sdpa_bf16_ms": sms, "sdpa_bytes": bf_bytes, "sdpa_variants": res, "gpu_state_after": gpu_state()}


def shape_or_error(bsz, t, fn):
    """``fn()`` (one shape's result dict), or ``{batch, context, error}`` with the traceback when it
    raises, so one failing shape does not lose the rest of the run."""
    try:
        return fn()
    except Exception:  # noqa: BLE001
        row = {"batch": bsz, "context": t, "error": traceback.format_exc()}
        log(row["error"])
        free()
        return row


def run_kernel(a, result, save, t_start):
    """--only kernel: write kernel b=3 fp16/bf16; decode K3/V3 and K4/V3, plain and with 4 sinks,
    at KERNEL_SHAPES (GQA 64/8, N=128), the current kernel and (``--baseline DIR``) a previous source in the
    same run; split counts at B1/4K; SDPA bf16 on each shape."""
    copy_gbs = result["copy"]["GBps"]
    # --baseline NAME=DIR[,NAME=DIR]: "old" names a kernel with the workspace merge and sinks in split 0
    baselines = [tuple(x.split("=", 1)) for x in a.baseline.split(",")] if a.baseline else []
    result["baselines"] = baselines
    tunes = json.loads(a.tunes) if a.tunes else []
    base_tune = json.loads(a.baseline_tune) if a.baseline_tune else None
    result["tunes"], result["baseline_tune"] = tunes, base_tune
    result["write"] = []
    # the golden order for both dtypes, and the vpair order of KVCache's value planes (gpu_ref.layout) for fp16
    for dt, lay in ((("fp16", "wire"), ("bf16", "wire"), ("fp16", "vpair")) if not a.no_write else ()):
        p = qparams("midrise", "nearest", bits=3, dtype=dt)
        nvec = 1 << 24
        g = cp.random.standard_normal((nvec, 128), dtype=cp.float32)
        x = g.astype(cp.float16).view(cp.uint16) if dt == "fp16" else (g.view(cp.uint32) >> 16).astype(cp.uint16)
        del g
        codes, scales = cp.empty((nvec, p.code_bytes), cp.uint8), cp.empty((nvec, p.n_blocks), cp.uint8)
        flags = cp.empty((nvec,), cp.uint8)
        fn = on_torch_stream(lambda: launch_encode(x, p, codes, scales, flags, None, cp, layout=lay))
        ms, times, how = graph_time([fn], reps=7, inner=2)
        byts = nvec * (256 + p.code_bytes + p.n_blocks + 1)
        r = {"bits": 3, "dtype": dt, "layout": lay, "vectors": nvec, "ms": ms, "GBps": byts / (ms * 1e-3) / 1e9,
             "pct_copy": 100 * byts / (ms * 1e-3) / 1e9 / copy_gbs, "timing": how, "all_ms": times,
             "bit_exact_65536": write_variant_exact(p, None) if lay == "wire" else None}
        result["write"].append(r)
        log(f"write b=3 {dt} {lay}: {ms:.3f} ms, {r['GBps']:.0f} GB/s = {r['pct_copy']:.1f}% of copy, "
            f"bit-exact {r['bit_exact_65536']}")
        del x, codes, scales, flags
        free()
    save()
    if a.no_decode:
        finish(result, save, t_start)
        return
    result["decode"] = []
    for bsz, t in KERNEL_SHAPES:
        splits = (None, 4, 8, 16, 32) if (bsz, t) == (1, 4096) else (None,)
        row = shape_or_error(bsz, t, lambda: bench_kernel_shape(bsz, t, KERNEL_VARIANTS, baselines, splits=splits,
                                                                quick=a.quick, tunes=tunes, base_tune=base_tune))
        for r in row.get("rows", ()):
            r["pct_copy"] = 100 * r["GBps"] / copy_gbs
        result["decode"].append(row)
        save()
    # workspace merge vs cluster merge on the shapes where the planner picks the cluster
    result["decode_cluster"] = []
    for bsz, t in ((1, 4096), (2, 4096)):
        splits = (None, 4, 8) if (bsz, t) == (1, 4096) else (None,)
        row = shape_or_error(bsz, t, lambda: bench_kernel_shape(bsz, t, KERNEL_VARIANTS[:2], splits=splits,
                                                                quick=a.quick, cluster=True))
        result["decode_cluster"].append(row)
        save()
    finish(result, save, t_start)


def write_inputs(nvec, dtype, heads=8):
    """Random normal fp16/bf16 bit patterns [nvec / heads, heads, 128] (standard normal keys)."""
    x = cp.empty((nvec, 128), cp.uint16)
    step = 1 << 21
    for i in range(0, nvec, step):
        v = cp.random.standard_normal((min(step, nvec - i), 128), dtype=cp.float32)
        x[i:i + step] = v.astype(cp.float16).view(cp.uint16) if dtype == "fp16" else \
            (v.view(cp.uint32) >> 16).astype(cp.uint16)
    return x.reshape(nvec // heads, heads, 128)


def write_key_tables(heads=8, n=128, seed=0):
    """Key scales 2^-2..2^2 and centering vectors ~ N(0, 0.5) per (kv head, channel), NumPy float16."""
    rng = np.random.default_rng(seed)
    return ((rng.standard_normal((heads, n)) * 0.5).astype(np.float16),
            np.exp2(rng.integers(-2, 3, (heads, n))).astype(np.float16))


class BaselineWrite:
    """A previous write kernel (positional arguments: x, codes, scales, flags, rows, nvec) and its separate
    key pass (an ElementwiseKernel from the previous encode.py's _CENTER_PRE / _CENTER_SRC), from ``folder``."""

    def __init__(self, folder):
        import re
        self.folder, self.kernels = folder, {}
        src = open(os.path.join(folder, "encode.py"), encoding="utf-8").read()
        pre, body = (re.search(name + r' = r"""(.*?)"""', src, re.S).group(1) for name in ("_CENTER_PRE", "_CENTER_SRC"))
        self.center = cp.ElementwiseKernel("uint16 x, float32 s, float32 mu", "uint16 y", body, "kv_center_old",
                                           preamble=pre)

    def launch(self, bits, p, codes, scales, flags):
        from gpu_ref import _build
        targs, smem, lpt, minb = gpu_ref.encode.encode_cfg(p)
        k = self.kernels.get(targs)
        if k is None:  # compiled once, outside any graph capture (the first call is the warm-up)
            with kernel_source(self.folder):
                k = self.kernels[targs] = _build.kernel("encode", targs[:-2], smem)   # no KEYF, IL arguments
        nvec = bits.size // p.n
        grid = int(min((nvec + 127) // 128, minb * cp.cuda.Device().attributes["MultiProcessorCount"]))
        k((grid,), (128,), (bits, codes, scales, flags, np.uint64(0), np.int64(nvec)), shared_mem=smem)


def run_write(a, result, save, t_start):
    """--only write (module docstring)."""
    copy_gbs = result["copy"]["GBps"]
    base = BaselineWrite(a.baseline) if a.baseline else None
    result["baseline"] = a.baseline
    nvec, heads = 1 << 24, 8
    mu16, s16 = write_key_tables(heads)
    v1, v2 = qparams("midtread", "up"), qparams("midrise", "nearest")
    cases = [("v2 fp16", v2, 0), ("v2 bf16", qparams("midrise", "nearest", dtype="bf16"), 0),
             ("v1 fp16", v1, 0), ("v1 bf16", qparams("midtread", "up", dtype="bf16"), 0),
             ("v2 fp16 b=4", qparams("midrise", "nearest", bits=4), 0),
             ("v2 fp16 +scale", v2, 1), ("v2 fp16 +center", v2, 2), ("v2 fp16 +scale+center", v2, 3),
             ("v2 fp16 again", v2, 0)]
    rows = []
    for label, p, keyf in cases:
        t0 = time.time()
        try:
            key = None if keyf == 0 else gpu_ref.key_table(128, mu16 if keyf & 2 else None, s16 if keyf & 1 else None)
            # bit-exactness of this variant on 65536 mixed vectors (golden folded key front end for keyf)
            bits = mixed_bits(128, 65536, seed=23, dtype=p.dtype).reshape(-1, heads, 128)
            if keyf:
                from sim_models.codec import encode_folded
                from sim_models.keyscale import front_table
                le = (np.log2(s16.astype(np.float64)).astype(np.int64) if keyf & 1
                      else np.zeros((heads, 128), np.int64))
                mu_ = mu16 if keyf & 2 else np.zeros((heads, 128), np.float16)
                g = encode_folded(bits, front_table(mu_, le, FormatParams(n=128)), le, p)
            else:
                g = encode(bits, p)
            e = gpu_ref.encode_kv(cp.asarray(bits), p, key=key)
            exact = bool(np.array_equal(g.codes, cp.asnumpy(e.codes)) and np.array_equal(g.scales, cp.asnumpy(e.scales))
                         and np.array_equal(g.flags, cp.asnumpy(e.flags)))
            x = write_inputs(nvec, p.dtype, heads)
            codes, scales = cp.empty((nvec, p.code_bytes), cp.uint8), cp.empty((nvec, p.n_blocks), cp.uint8)
            flags = cp.empty((nvec,), cp.uint8)
            byts = nvec * (256 + p.code_bytes + p.n_blocks + 1)
            impls = [("new", lambda: launch_encode(x, p, codes, scales, flags, None, cp, key=key))]
            if base is not None and not label.endswith("again"):
                if keyf:
                    s32 = cp.asarray(s16.astype(np.float32)) if keyf & 1 else None
                    m32 = None
                    if keyf & 2:
                        from sim_models import scale_keys
                        m32 = cp.asarray((scale_keys(mu16, s16, p).view(np.float16) if keyf & 1 else mu16).astype(np.float32))
                    s32 = s32 if s32 is not None else cp.ones((heads, 128), cp.float32)
                    m32 = m32 if m32 is not None else cp.zeros((heads, 128), cp.float32)
                    y = cp.empty_like(x)

                    def old(x=x, y=y, s32=s32, m32=m32):
                        base.center(x, s32, m32, y)
                        base.launch(y, p, codes, scales, flags)
                    impls.append(("old: separate pass + kernel", old))
                    impls.append(("old: separate pass alone", lambda x=x, y=y, s32=s32, m32=m32: base.center(x, s32, m32, y)))
                else:
                    impls.append(("old", lambda: base.launch(x, p, codes, scales, flags)))
            for name, fn in impls:
                fn()
                ms, times, how = graph_time([on_torch_stream(fn)], reps=9, inner=3)
                r = {"label": label, "impl": name, "mode": p.mode, "scale_round": p.scale_round, "dtype": p.dtype,
                     "bits": p.bits, "keyf": keyf, "kv_heads": heads, "vectors": nvec, "bytes": byts, "ms": ms,
                     "GBps": byts / (ms * 1e-3) / 1e9, "pct_copy": 100 * byts / (ms * 1e-3) / 1e9 / copy_gbs,
                     "bit_exact_65536": exact if name == "new" else None, "timing": how, "all_ms": times,
                     "gpu_state_after": gpu_state()}
                rows.append(r)
                log(f"write {label} [{name}]: {ms:.3f} ms, {r['GBps']:.0f} GB/s = {r['pct_copy']:.1f}% of copy"
                    + (f", bit-exact {exact}" if name == "new" else "") + f" [{time.time() - t0:.1f}s]")
            del x, codes, scales, flags
            free()
        except Exception:  # noqa: BLE001
            rows.append({"label": label, "error": traceback.format_exc()})
            log(rows[-1]["error"])
            free()
        result["write"] = rows
        save()
    finish(result, save, t_start, ((
        ("write 16M x N=128", "impl", "ms", "GB/s", "% copy", "bit-exact"),
        [f"| {r['label']} | {r['impl']} | {r['ms']:.3f} | {r['GBps']:.0f} | {r['pct_copy']:.1f} | "
         f"{r['bit_exact_65536']} |" for r in rows if "ms" in r]),))


PAGING_SHAPES = tuple((b, t) for b in (1, 8, 32) for t in (4096, 32768, 131072))


def run_paging(a, result, save, t_start):
    """--only paging (file gpu_bench_paging.json): decode over a paged pool (16- and 64-token
    pages, shuffled) against the contiguous layout, K3/V3 and K4/V3 (GQA 64/8) and K3/V3 (GQA 32/8), N=128, at
    B 1/8/32 x T 4K/32K/128K, SDPA bf16 on each shape; the cost of paging = paged ms / contiguous ms - 1."""
    copy_gbs = result["copy"]["GBps"]
    result["paging"] = []
    variants = [{}, {"page": 16}, {"page": 64}]
    for bsz, t in (PAGING_SHAPES[::4] if a.quick else PAGING_SHAPES):
        for hq, bits in ((64, ((3, 3), (4, 3))), (32, ((3, 3),))):
            row = shape_or_error(bsz, t, lambda: bench_policy_shape(bsz, hq, 8, t, bits, variants, a.quick))
            for r in row.get("rows", ()):
                r["pct_copy"] = 100 * r["GBps"] / copy_gbs
                r["speedup"] = row["sdpa_bf16_ms"] / r["ms"] if row.get("sdpa_bf16_ms") else None
                base = [c for c in row["rows"] if c["bits"] == r["bits"] and c["page"] is None]
                if base:
                    r["cost_vs_contiguous"] = r["ms"] / base[0]["ms"] - 1
            result["paging"].append(row)
            save()
    lines = []
    for row in result["paging"]:
        for bits in sorted({r["bits"] for r in row.get("rows", ())}):
            rs = {r["page"]: r for r in row["rows"] if r["bits"] == bits}
            if None in rs:
                lines.append(f"| {row['batch']} | {row['context']} | {row['q_heads']}/8 | {bits} | {rs[None]['ms']:.4f} | "
                             + " | ".join(f"{100 * rs[pg]['cost_vs_contiguous']:+.1f}%" if pg in rs else "-"
                                          for pg in (16, 64)) + " |")
    finish(result, save, t_start, ((("B", "T", "GQA", "bits", "contiguous ms", "page 16", "page 64"), lines),))


WAVE_BATCHES = (32, 33, 35, 40, 48, 64)   # GQA 32/8 at 128K: (sequence, kv head) pairs around the CTA slots
WAVE_SPLITS = (None, 1, 2, 3, 4, 8, 16)


def run_waves(a, result, save, t_start):
    """--only waves (file gpu_bench_waves.json): decode K3/V3, GQA 32/8 (the Llama-3-8B shape), N=128, 128K
    tokens, at batches whose (sequence, kv head) pairs lie just below and above the CTA slots of the GPU,
    for the planner's split count and fixed ones: how a partial last wave costs, measured."""
    result["waves"] = []
    for bsz in (WAVE_BATCHES[:3] if a.quick else WAVE_BATCHES):
        row = shape_or_error(bsz, 131072, lambda: bench_kernel_shape(bsz, 131072, KERNEL_VARIANTS[:1], hq=32, kvh=8,
                                                                     splits=WAVE_SPLITS, quick=a.quick))
        result["waves"].append(row)
        save()
    finish(result, save, t_start)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--ncu-driver" in argv:
        ncu_driver()
        return
    if "--ncu-decode" in argv:
        ncu_decode_driver()
        return
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.kernels")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--baseline", default=None, help="--only kernel: NAME=DIR[,NAME=DIR], folders with previous "
                    "kv_decode_attn.cu (and kv_common.cuh) timed in the same run; NAME old = a kernel with the workspace merge and sinks in split 0")
    ap.add_argument("--tunes", default=None, help="--only kernel: JSON list of tune dicts, each timed as one more "
                    "implementation of the K3/V3 rows")
    ap.add_argument("--baseline-tune", default=None, help="--only kernel: JSON tune dict for the baseline sources' "
                    "plans, or {NAME: tune dict} per baseline")
    ap.add_argument("--no-write", action="store_true", help="--only kernel: skip the write-kernel timings")
    ap.add_argument("--no-decode", action="store_true", help="--only kernel: the write-kernel timings alone")
    ap.add_argument("--only", choices=("decode", "write", "versions", "policy", "kernel", "waves", "paging"), default="decode",
                    help="write: the write kernel alone (gpu_bench_write.json); paging: paged vs contiguous "
                         "decode (gpu_bench_paging.json); "
                         "versions: version-1 vs version-2 quantizer side by side (gpu_bench_v2.json)")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    t_start = time.time()
    props = torch.cuda.get_device_properties(0)
    result = {"device": props.name, "sms": props.multi_processor_count,
              "torch": torch.__version__, "cupy": cp.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    log(f"device {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, cupy {cp.__version__}")

    fname = {"versions": "gpu_bench_v2.json", "policy": "gpu_bench_policy.json",
             "kernel": "gpu_bench_kernel.json", "waves": "gpu_bench_waves.json",
             "write": "gpu_bench_write.json", "paging": "gpu_bench_paging.json"}.get(a.only, "gpu_bench.json")

    def save():
        with open(os.path.join(a.out, fname), "w") as f:
            json.dump(result, f, indent=1, default=float)

    result["copy"] = copy_bandwidth()
    copy_gbs = result["copy"]["GBps"]
    log(f"copy bandwidth {copy_gbs:.0f} GB/s (torch {result['copy']['torch_copy_GBps']:.0f}, "
        f"memcpy {result['copy']['memcpy_GBps']:.0f}, copy kernel {result['copy']['kernel_copy_GBps']:.0f}; "
        f"read-only kernel {result['copy']['kernel_read_GBps']:.0f})")
    save()
    if a.only == "versions":
        result["versions"] = {k: {f: PRESETS[k][f] for f in ("mode", "scale_round")} for k in VERSIONS}
    modes = {"policy": run_policy, "kernel": run_kernel, "waves": run_waves, "write": run_write,
             "paging": run_paging, "versions": run_versions}
    if a.only in modes:
        modes[a.only](a, result, save, t_start)
        return
    if not a.skip_checks:
        checks = (("encode_check", check_encode), ("decode_check", check_decode))
        for name, fn in checks:
            t0 = time.time()
            try:
                result[name] = fn()
            except Exception:  # noqa: BLE001
                result[name] = {"error": traceback.format_exc()}
            log(f"{name} ({time.time() - t0:.1f}s): {json.dumps(result[name], default=float)[:600]}")
            save()
    p = FormatParams()
    try:
        result["write"] = bench_write()
        for r in result["write"]:
            r["pct_copy"] = 100 * r["GBps"] / copy_gbs
            log(f"write {r['dtype']} {r['tune']}: {r['ms']:.3f} ms, {r['GBps']:.0f} GB/s = {r['pct_copy']:.1f}% of copy"
                f" (bit-exact 64K: {r['bit_exact_65536']})")
    except Exception:  # noqa: BLE001
        result["write"] = {"error": traceback.format_exc()}
        log(result["write"]["error"])
    result["write_gpu_state"] = gpu_state()
    save()

    # tuning sweep on the headline shape
    try:
        hv = [{}, {"tune": {"qlo": 0}}, {"tune": {"stages": 4}}, {"tune": {"stages": 2, "minb": 3}},
              {"num_splits": 8}, {"precise_p": True}, {"tune": {"abl": 1}}, {"tune": {"abl": 2}}]
        r = bench_decode_one(8, 64, 8, 131072, p, sdpa=False, variants=hv)
        result["tuning_B8_T128K_64_8"] = r["variants"]
        for v in r["variants"]:
            log(f"tune {v['variant']}: {v['ms']:.4f} ms, {v['GBps']:.0f} GB/s")
        full = [v for v in r["variants"] if not v["variant"].get("precise_p") and "num_splits" not in v["variant"]
                and v["variant"].get("tune", {}).get("abl", 0) == 0 and v["variant"].get("tune", {}).get("qlo", 1) == 1]
        best = min(full, key=lambda v: v["ms"])["variant"]
    except Exception:  # noqa: BLE001
        result["tuning_B8_T128K_64_8"] = {"error": traceback.format_exc()}
        log(result["tuning_B8_T128K_64_8"]["error"])
        best = {}
    result["chosen_variant"] = best
    save()
    # short context, batch 1: split count (the fixed chain q rotation -> tile -> merges dominates)
    try:
        sv = [{}, {"num_splits": 4}, {"num_splits": 8}, {"num_splits": 32}]
        r = bench_decode_one(1, 64, 8, 4096, p, sdpa=False, variants=sv)
        result["tuning_B1_T4K_64_8"] = r["variants"]
        for v in r["variants"]:
            log(f"tune B1/4K {v['variant']}: {v['ms'] * 1e3:.2f} us")
    except Exception:  # noqa: BLE001
        result["tuning_B1_T4K_64_8"] = {"error": traceback.format_exc()}
        log(result["tuning_B1_T4K_64_8"]["error"])
    save()

    shapes = []
    ctxs = (4096, 16384, 65536, 131072) if not a.quick else (4096, 131072)
    for bsz in (1, 8, 32):
        for hq in (64, 32):
            for t in ctxs:
                shapes.append((bsz, hq, 8, t))
    rows = []
    for bsz, hq, kvh, t in shapes:
        t0 = time.time()
        try:
            r = bench_decode_one(bsz, hq, kvh, t, p, variants=[best] if best else None)
            r["pct_copy"] = 100 * r["ours_GBps"] / copy_gbs
            rows.append(r)
            log(f"B{bsz:<3d} {hq}/{kvh} T{t:>6d}: ours {r['ours_ms']:.4f} ms {r['ours_GBps']:.0f} GB/s "
                f"({r['pct_copy']:.0f}% copy) | sdpa bf16 {r.get('sdpa_bf16_ms', float('nan')):.4f} ms "
                f"-> x{r.get('speedup', float('nan')):.2f}  [{time.time() - t0:.1f}s] {r.get('gpu_state_after')}")
        except Exception:  # noqa: BLE001
            rows.append({"batch": bsz, "q_heads": hq, "kv_heads": kvh, "context": t, "error": traceback.format_exc()})
            log(rows[-1]["error"])
            free()
        result["decode"] = rows
        save()
    finish(result, save, t_start, ((
        ("batch", "GQA", "context", "ours ms", "GB/s", "% copy", "SDPA bf16 ms", "speed-up"),
        [f"| {r['batch']} | {r['q_heads']}/{r['kv_heads']} | {r['context']} | {r['ours_ms']:.4f} | "
         f"{r['ours_GBps']:.0f} | {r['pct_copy']:.0f} | {r.get('sdpa_bf16_ms', float('nan')):.4f} | "
         f"{r.get('speedup', float('nan')):.2f} |" for r in rows if "ours_ms" in r]),))


if __name__ == "__main__":
    main()
