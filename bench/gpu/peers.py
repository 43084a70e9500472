"""Decode attention against the kernels a serving engineer would otherwise use: one run, one card.

    python -m bench.gpu --routine peers [--quick]

Per shape (N = 128, 64 q / 8 KV heads, every sequence at the full context, q for one token):
  * ours, K3V3 and the default policy v3 (K3V3, 4 sinks, key scales: FORMAT.md 8), through
    ``gpu_ref.run_planes`` on contiguous packed planes, fp16 q and output;
  * FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` over a paged cache of 16-token pages (vLLM's
    default block size) in a random page order, KV in bf16 and in fp8 e4m3 (per-tensor scale 1), q
    bf16; its CUDA-core and tensor-core decode paths are both timed and the faster is the row;
  * torch SDPA bf16 (flash backend, the faster of packed GQA and ``enable_gqa``: ``kernels.sdpa_time``);
  * the read-only copy kernel over as many bytes as our packed planes hold (the byte limit).
Every timing is the median of CUDA-graph replays over input sets rotated past L2 (``kernels.graph_time``).

FlashInfer is imported from the Python path; where it is missing or fails the rows say why and the
rest is timed. Results: ``gpu_bench_peers.json``, one entry per card under ``cards`` (a run replaces
its own card's entry and keeps the others), each with its own baselines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import traceback

import cupy as cp
import numpy as np
import torch

import gpu_ref
from bench.gpu.kernels import (L2_ROTATE_BYTES, _BW_SRC, copy_bandwidth, free, gpu_state, graph_time, log,
                               on_torch_stream, policy_inputs, sdpa_time)
from kvtest.gpu_cases import qparams

N, HQ, KVH = 128, 64, 8
SHAPES = ((1, 4096), (1, 32768), (1, 131072), (8, 4096), (8, 32768), (8, 131072), (32, 131072))
QUICK_SHAPES = ((1, 4096), (8, 131072))
PAGE = 16
#: ours: name -> (sinks, key scales); v3's decode side (its centering needs nothing at decode time)
OURS = {"K3V3": (0, False), "v3": (4, True)}
FLASHINFER_KV = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}


def ours_time(bsz, t, sinks, kscale, quick):
    kp = vp = qparams("midrise", "nearest", bits=3)
    packed, sets, cap, q, lens, out, sk, sv = policy_inputs(bsz, HQ, KVH, t, kp, vp, sinks, None, cp.float16)
    qs = cp.exp2(-cp.random.randint(-2, 3, (KVH, N)).astype(cp.float32)) if kscale else None
    pl = gpu_ref.plan(kp, vp, batch=bsz, q_heads=HQ, kv_heads=KVH, max_length=t, sinks=sinks, capacity=cap,
                      layout="vpair", key_scales=kscale)
    ws = pl.workspace()
    fns = [on_torch_stream(lambda s=s: gpu_ref.run_planes(pl, ws, q, s[0], s[1], s[2], s[3], lens, k_sink=sk,
                                                          v_sink=sv, out=out, layout=pl.layout, q_scale=qs))
           for s in sets]
    ms, times, how = graph_time(fns, reps=5 if quick else 7)
    del sets
    free()
    return {"ms": ms, "all_ms": times, "timing": how, "bytes": packed, "splits": pl.num_splits}


def read_time(nbytes, quick):
    """The read-only copy kernel over ``nbytes`` (rotated past L2 like the decode inputs)."""
    mod = cp.RawModule(code=_BW_SRC)
    kr = mod.get_function("bw_read")
    n_sets = max(1, min(32, math.ceil(L2_ROTATE_BYTES / nbytes)))
    bufs = [cp.full(nbytes, 7, cp.uint8) for _ in range(n_sets)]
    o = cp.zeros(1, cp.uint32)
    n16 = np.int64(nbytes // 16)
    grid = cp.cuda.Device().attributes["MultiProcessorCount"] * 8
    fns = [on_torch_stream(lambda b=b: kr((grid,), (512,), (b, o, n16))) for b in bufs]
    ms, times, how = graph_time(fns, reps=5 if quick else 7)
    del bufs
    free()
    return {"ms": ms, "all_ms": times, "timing": how, "bytes": nbytes}


def flashinfer_paged(bsz, t, kv_dtype, seed=0):
    """A paged bf16 / fp8 cache in FlashInfer's NHD layout ``[pages, 2, PAGE, KVH, N]`` with pages in a random
    order: (cache, indptr, indices, last_page_len)."""
    mp = -(-t // PAGE)
    g = torch.Generator(device="cuda").manual_seed(seed)
    cache = torch.randn(bsz * mp, 2, PAGE, KVH, N, device="cuda", generator=g, dtype=torch.bfloat16)
    if kv_dtype != torch.bfloat16:
        cache = cache.to(kv_dtype)
    indices = torch.randperm(bsz * mp, device="cuda", generator=g).to(torch.int32)
    indptr = torch.arange(0, bsz + 1, device="cuda", dtype=torch.int32) * mp
    last = torch.full((bsz,), t - (mp - 1) * PAGE, device="cuda", dtype=torch.int32)
    return cache, indptr, indices, last


def flashinfer_time(fi, bsz, t, kv_name, quick):
    """FlashInfer batch decode over paged KV: the faster of its CUDA-core and tensor-core paths."""
    kv_dtype = FLASHINFER_KV[kv_name]
    nbytes = bsz * t * KVH * N * 2 * kv_dtype.itemsize
    n_sets = max(1, min(16, math.ceil(L2_ROTATE_BYTES / nbytes)))
    sets = [flashinfer_paged(bsz, t, kv_dtype, seed=i) for i in range(n_sets)]
    q = torch.randn(bsz, HQ, N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    paths = {}
    for tc in (False, True):
        name = "tensor_cores" if tc else "cuda_cores"
        try:
            wrappers = []
            for cache, indptr, indices, last in sets:
                ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
                w = fi.BatchDecodeWithPagedKVCacheWrapper(
                    ws, "NHD", use_cuda_graph=True, use_tensor_cores=tc, paged_kv_indptr_buffer=indptr.clone(),
                    paged_kv_indices_buffer=indices.clone(), paged_kv_last_page_len_buffer=last.clone())
                w.plan(indptr, indices, last, HQ, KVH, N, PAGE, q_data_type=torch.bfloat16, kv_data_type=kv_dtype)
                wrappers.append((w, cache))
            kw = {} if kv_dtype == torch.bfloat16 else {"k_scale": 1.0, "v_scale": 1.0}
            fns = [lambda w=w, c=c: w.run(q, c, out=out, **kw) for w, c in wrappers]
            ms, times, how = graph_time(fns, reps=5 if quick else 7)
            paths[name] = {"ms": ms, "all_ms": times, "timing": how}
            del wrappers
        except Exception as err:  # noqa: BLE001
            paths[name] = {"error": f"{type(err).__name__}: {err}"[:600]}
            log(f"    FlashInfer {kv_name} {name}: {paths[name]['error'][:200]}")
        free()
    del sets
    free()
    ok = {k: v for k, v in paths.items() if "ms" in v}
    best = min(ok, key=lambda k: ok[k]["ms"]) if ok else None
    return {"ms": ok[best]["ms"] if best else None, "path": best, "paths": paths, "bytes": nbytes}


def flashinfer_check(fi):
    """FlashInfer bf16 decode against float64 attention on one small paged case: its relative error (so the
    timed call is the attention it claims to be)."""
    bsz, t = 2, 1000
    cache, indptr, indices, last = flashinfer_paged(bsz, t, torch.bfloat16, seed=7)
    q = torch.randn(bsz, HQ, N, device="cuda", dtype=torch.bfloat16)
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(indptr, indices, last, HQ, KVH, N, PAGE, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    o = w.run(q, cache).double()
    mp = -(-t // PAGE)
    pages = cache[indices.long()].view(bsz, mp, 2, PAGE, KVH, N).double()
    k = pages[:, :, 0].reshape(bsz, mp * PAGE, KVH, N)[:, :t]
    v = pages[:, :, 1].reshape(bsz, mp * PAGE, KVH, N)[:, :t]
    qg = q.double().view(bsz, KVH, HQ // KVH, N)
    s = torch.einsum("bhgn,bthn->bhgt", qg, k) / math.sqrt(N)
    ref = torch.einsum("bhgt,bthn->bhgn", s.softmax(-1), v).reshape(bsz, HQ, N)
    return {"case": f"B{bsz} T{t} Hq{HQ}/{KVH} N{N} page {PAGE}",
            "rel_err_vs_float64": float((o - ref).norm() / ref.norm())}


def shape_row(fi, bsz, t, quick):
    row = {"batch": bsz, "context": t, "q_heads": HQ, "kv_heads": KVH, "N": N}
    for name, (sinks, kscale) in OURS.items():
        row[f"ours_{name}"] = ours_time(bsz, t, sinks, kscale, quick)
    row["read_same_bytes"] = read_time(row["ours_K3V3"]["bytes"], quick)
    if fi is not None:
        for kv in FLASHINFER_KV:
            row[f"flashinfer_{kv}"] = flashinfer_time(fi, bsz, t, kv, quick)
    sms, bf_bytes, res = sdpa_time(bsz, HQ, KVH, t, N)
    row["sdpa_bf16"] = {"ms": sms, "bytes": bf_bytes, "variants": res}
    bf16 = [x for x in (sms, row.get("flashinfer_bf16", {}).get("ms")) if x]
    row["best_bf16_ms"] = min(bf16) if bf16 else None
    for name in OURS:
        r = row[f"ours_{name}"]
        r["pct_read_limit"] = 100 * row["read_same_bytes"]["ms"] / r["ms"]
        for peer in ("sdpa_bf16", "flashinfer_bf16", "flashinfer_fp8_e4m3"):
            pm = row.get(peer, {}).get("ms")
            r[f"speedup_vs_{peer}"] = pm / r["ms"] if pm else None
        r["speedup_vs_best_bf16"] = row["best_bf16_ms"] / r["ms"] if row["best_bf16_ms"] else None
    row["gpu_state_after"] = gpu_state()
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.gpu --routine peers")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    ap.add_argument("--quick", action="store_true", help=f"shapes {QUICK_SHAPES} only")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "gpu_bench_peers.json")
    doc = {"cards": {}}
    if os.path.exists(path):
        doc = json.load(open(path))
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    card = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
            "cupy": cp.__version__, "quick": a.quick}
    doc["cards"][props.name] = card

    def save():
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, default=float)

    try:
        import flashinfer as fi
        card["flashinfer"] = fi.__version__
        card["flashinfer_check"] = flashinfer_check(fi)
        log(f"FlashInfer {fi.__version__}: {card['flashinfer_check']}")
    except Exception:  # noqa: BLE001
        fi = None
        card["flashinfer_error"] = traceback.format_exc()[-1500:]
        log(f"FlashInfer unavailable: {card['flashinfer_error']}")
    card["copy"] = copy_bandwidth()
    log(f"{props.name}: copy {card['copy']['GBps']:.0f} GB/s, read {card['copy']['kernel_read_GBps']:.0f} GB/s")
    save()
    card["rows"] = []
    for bsz, t in (QUICK_SHAPES if a.quick else SHAPES):
        try:
            r = shape_row(fi, bsz, t, a.quick)
        except Exception:  # noqa: BLE001
            r = {"batch": bsz, "context": t, "error": traceback.format_exc()}
            log(r["error"])
            free()
        card["rows"].append(r)
        if "error" not in r:
            def us(x):
                return f"{x * 1e3:8.1f}" if x else "     n/a"
            log(f"B{bsz} T{t}: K3V3 {us(r['ours_K3V3']['ms'])} us, v3 {us(r['ours_v3']['ms'])}, "
                f"read {us(r['read_same_bytes']['ms'])}, FI bf16 {us(r.get('flashinfer_bf16', {}).get('ms'))}, "
                f"FI fp8 {us(r.get('flashinfer_fp8_e4m3', {}).get('ms'))}, SDPA {us(r['sdpa_bf16']['ms'])}; "
                f"K3V3 x{r['ours_K3V3']['speedup_vs_best_bf16'] or float('nan'):.2f} vs best bf16, "
                f"{r['ours_K3V3']['pct_read_limit']:.0f}% of the read limit")
        save()
    card["seconds"] = time.time() - t0
    save()
    log(f"total {card['seconds']:.0f} s -> {path}")


if __name__ == "__main__":
    main()
