"""Write kernel in the vpair value order against the golden order (docs/DECISIONS.md, "Value layout
vpair" and "Write kernel row copy").

One device call: first the bytes of every kernel source -- the current tree and each ``--source NAME=DIR`` (a
folder with another kv_encode.cu + kv_common.cuh, compiled by gpu_ref._build from there) -- on mixed vectors
(special values, saturated blocks): golden order == sim_models.encode, vpair == layout.interleave(golden) with
row v for vector v (pair_vec 1) and with KVCache's rows ([B, KVH, T] planes of [B, T, KVH, N] input, pair_vec
KVH); N = 128 for every source, N = 64 / 256 for the current one. Then the write kernel at the size of the
write benchmark (2^24 vectors, N = 128, G = 64, b = 3, v2 quantizer, standard normal fp16 / bf16 input), every
source, golden order and vpair (rows v, and KVCache's rows: 16 sequences x 128K tokens x 8 kv heads), each next
to the copy kernel over the same byte count (read + written) in the same round; CUDA-graph medians, two rounds
with the sources in turn (A B C A B C). ``% copy`` is against the copy bandwidth of the write benchmark (a 4 GB copy,
``gpu_bench.copy_bandwidth``), ``% same-bytes copy`` against the copy kernel over the write kernel's own bytes.
``--ncu``: one launch of 2^21 vectors per (source, dtype, layout) for Nsight Compute, in the order printed
(``--ncu-cache``: each also with KVCache's rows).

Usage (device): python -m bench.gpu --routine layout --out DIR [--source old=DIR ...] [--ncu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

from bench.gpu import kernels as gb  # noqa: E402  (timing helpers, copy kernel, device state)
from bench.gpu.kernels import ROOT, cp, gpu_ref, log, np, qparams  # noqa: E402

from gpu_ref import _build  # noqa: E402
from gpu_ref.encode import encode_cfg  # noqa: E402
from gpu_ref.layout import interleave  # noqa: E402
from kvtest.inputs import mixed_bits  # noqa: E402
from sim_models import encode  # noqa: E402

NVEC, KVH = 1 << 24, 8
_K = {}


def encode_kernel(folder, p, layout):
    """(kernel, shared bytes, lanes per thread, CTAs per SM) of kv_encode from ``folder`` (None: gpu_ref's)."""
    targs, smem, lpt, minb = encode_cfg(p, None, 0, layout)
    key = (folder, targs)
    if key not in _K:
        here, cache = _build.HERE, _build._kernels
        _build.HERE, _build._kernels = folder or here, {}
        try:
            _K[key] = _build.kernel("encode", targs, smem)
        finally:
            _build.HERE, _build._kernels = here, cache
    return (_K[key], smem, lpt, minb)


def launch(folder, x, p, codes, scales, flags, rows, layout, pair_vec=1):
    """gpu_ref.encode.launch_encode with the kernel of ``folder`` (the same grid and argument struct)."""
    k, smem, lpt, minb = encode_kernel(folder, p, layout)
    nvec = x.size // p.n
    ntiles = (nvec + 128 // (p.n // lpt) - 1) // (128 // (p.n // lpt))
    grid = int(min(ntiles, minb * cp.cuda.Device().attributes["MultiProcessorCount"]))
    args = _build.kernel_struct(_build.ENCODE_ARGS, x=x, codes=codes, scales=scales, flags=flags, out_rows=rows,
                                key_tab=None, nvec=nvec, key_heads=1, pair_vec=int(pair_vec))
    k((grid,), (128,), (args,), shared_mem=smem)


def cache_rows(bsz, t, kvh):
    """KVCache's row of each vector of [B, T, KVH, N] input in [B, KVH, T] planes (int64, input order)."""
    return ((np.arange(bsz)[:, None, None] * kvh + np.arange(kvh)[None, None, :]) * t
            + np.arange(t)[None, :, None]).reshape(-1)


def check(folder, n, dtype):
    """Bytes of one source for N, dtype: golden order, vpair (rows v; KVCache's rows) -> dict of bools."""
    p = qparams("midrise", "nearest", bits=3, n=n, dtype=dtype)
    bsz, t = 4, 512
    bits = mixed_bits(n, bsz * t * KVH, seed=31 + n, dtype=dtype).reshape(bsz, t, KVH, n)
    g = encode(bits, p)
    x = cp.asarray(bits).reshape(-1, n)
    nv = bsz * t * KVH
    out = {}
    for name, layout, rows, pv in (("wire", "wire", None, 1), ("vpair rows v", "vpair", None, 1),
                                   ("vpair cache rows", "vpair", cache_rows(bsz, t, KVH), KVH)):
        codes = cp.full((nv, p.code_bytes), 0xA5, cp.uint8)
        scales, flags = cp.full((nv, p.n_blocks), 0xA5, cp.uint8), cp.full(nv, 0xA5, cp.uint8)
        launch(folder, x, p, codes, scales, flags, None if rows is None else cp.asarray(rows), layout, pv)
        gc, gs, gf = (a.reshape(nv, -1) for a in (g.codes, g.scales, g.flags))
        if rows is not None:
            gc, gs, gf = (a.reshape(bsz, t, KVH, -1).transpose(0, 2, 1, 3).reshape(nv, -1) for a in (gc, gs, gf))
        want = gc if layout == "wire" else interleave(gc)
        out[name] = bool(np.array_equal(cp.asnumpy(codes), want) and np.array_equal(cp.asnumpy(scales), gs)
                         and np.array_equal(cp.asnumpy(flags).reshape(nv, 1), gf))
    return out


def inputs(dtype, nvec=NVEC):
    """Standard normal fp16 / bf16 bit patterns [nvec, 128] (the write benchmark's input)."""
    return gb.write_inputs(nvec, dtype, heads=1).reshape(nvec, 128)


def copy_same_bytes(nbytes):
    """A callable running the copy kernel over nbytes / 2 bytes (nbytes read + written)."""
    mod = cp.RawModule(code=gb._BW_SRC)
    kc = mod.get_function("bw_copy")
    half = nbytes // 2 // 16 * 16
    a, b = cp.empty(half, cp.uint8), cp.empty(half, cp.uint8)
    a[:] = 7
    n16 = np.int64(half // 16)
    grid = cp.cuda.Device().attributes["MultiProcessorCount"] * 8
    return gb.on_torch_stream(lambda: kc((grid,), (512,), (a, b, n16))), 2 * half, (a, b)


def bench(sources, copy_gbs, rounds=2):
    """Timings: per dtype, the golden order and vpair (rows v, KVCache's rows) for every source + the copy."""
    rows_out = []
    for dtype in ("fp16", "bf16"):
        p = qparams("midrise", "nearest", bits=3, dtype=dtype)
        x = inputs(dtype)
        codes, scales = cp.empty((NVEC, p.code_bytes), cp.uint8), cp.empty((NVEC, p.n_blocks), cp.uint8)
        flags = cp.empty(NVEC, cp.uint8)
        crow = cp.asarray(cache_rows(NVEC // (131072 * KVH), 131072, KVH))
        byts = NVEC * (256 + p.code_bytes + p.n_blocks + 1)
        cfn, cbytes, keep = copy_same_bytes(byts)
        cases = [("golden order", "wire", None, 1), ("vpair", "vpair", None, 1),
                 ("golden order, cache rows", "wire", crow, KVH), ("vpair, cache rows", "vpair", crow, KVH)]
        times = {}
        for rnd in range(rounds):
            for label, layout, rows, pv in cases:
                for name, folder in sources:
                    if (name, layout) in SKIP:
                        continue
                    fn = gb.on_torch_stream(lambda f=folder, lay=layout, r=rows, v=pv:
                                            launch(f, x, p, codes, scales, flags, r, lay, v))
                    ms, ts, how = gb.graph_time([fn], reps=7, inner=2)
                    times.setdefault((label, name), []).append((ms, ts))
                    log(f"{dtype} {label:26s} {name:8s} round {rnd}: {ms:.4f} ms")
                ms, ts, how = gb.graph_time([cfn], reps=7, inner=2)
                times.setdefault((label, "copy"), []).append((ms, ts))
                log(f"{dtype} {label:26s} copy     round {rnd}: {ms:.4f} ms ({cbytes / (ms * 1e-3) / 1e9:.0f} GB/s)")
        for (label, name), reps in times.items():
            if name == "copy":
                continue
            allt = [t for _, ts in reps for t in ts]
            ms = statistics.median(allt)
            cms = statistics.median([t for _, ts in times[(label, "copy")] for t in ts])
            rows_out.append({"dtype": dtype, "case": label, "source": name, "vectors": NVEC, "bytes": byts,
                             "ms": ms, "round_ms": [r[0] for r in reps], "all_ms": allt,
                             "GBps": byts / (ms * 1e-3) / 1e9, "pct_copy": 100 * byts / (ms * 1e-3) / 1e9 / copy_gbs,
                             "copy_same_bytes_ms": cms, "pct_copy_same_bytes": 100 * cms / ms * byts / cbytes,
                             # the cache rows' cases also read one 8-byte output row per vector (not in "bytes")
                             "row_bytes": 8 * NVEC if "cache rows" in label else 0,
                             "gpu_state_after": gb.gpu_state()})
        del x, codes, scales, flags, crow, keep
        gb.free()
    return rows_out


SKIP = set()  # (source name, layout) pairs not timed (--skip-wire NAME: a variant that changes only vpair)


def ncu_launches(sources, with_cache=False):
    """One launch per (source, dtype, layout), 2^21 vectors, for ncu (-k regex:kv_encode): the order printed.
    ``with_cache``: each also with KVCache's rows (2 sequences x 128K tokens x 8 kv heads, pair_vec 8)."""
    order = []
    nv = 1 << 21
    for dtype in ("fp16", "bf16"):
        p = qparams("midrise", "nearest", bits=3, dtype=dtype)
        x = inputs(dtype, nv)
        codes, scales = cp.empty((nv, p.code_bytes), cp.uint8), cp.empty((nv, p.n_blocks), cp.uint8)
        flags = cp.empty(nv, cp.uint8)
        crow = cp.asarray(cache_rows(nv // (131072 * KVH), 131072, KVH))
        for name, folder in sources:
            for layout in ("wire", "vpair"):
                if (name, layout) in SKIP:
                    continue
                encode_kernel(folder, p, layout)  # compile first (no launch)
                for rows, pv, what in ((None, 1, ""), (crow, KVH, " cache rows"))[:2 if with_cache else 1]:
                    launch(folder, x, p, codes, scales, flags, rows, layout, pv)
                    cp.cuda.Device().synchronize()
                    order.append(f"{dtype} {layout}{what} {name}")
                    log(f"ncu launch {len(order)}: {order[-1]}")
    return order


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.write_layout")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--source", action="append", default=[], help="NAME=DIR: another kernel source folder")
    ap.add_argument("--skip-wire", action="append", default=[], help="source NAME whose golden order is not timed")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--ncu-cache", action="store_true", help="--ncu: each launch also with KVCache's rows")
    a = ap.parse_args(argv)
    sources = [("current", None)] + [tuple(s.split("=", 1)) for s in a.source]
    SKIP.update((n, "wire") for n in a.skip_wire)
    if a.ncu:
        log(json.dumps(ncu_launches(sources, a.ncu_cache)))
        return
    t0 = time.time()
    res = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "sources": sources, "nvec": NVEC, "kv_heads": KVH}
    path = os.path.join(a.out, "gpu_bench_layout.json")

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    res["checks"] = []
    for name, folder in sources:
        for n in ((64, 128, 256) if folder is None else (128,)):
            for dtype in ("fp16", "bf16"):
                try:
                    r = {"source": name, "N": n, "dtype": dtype, **check(folder, n, dtype)}
                except Exception:  # noqa: BLE001
                    r = {"source": name, "N": n, "dtype": dtype, "error": traceback.format_exc()}
                res["checks"].append(r)
                log(f"check {r}")
    save()
    res["copy"] = gb.copy_bandwidth()
    log(f"copy bandwidth {res['copy']['GBps']:.0f} GB/s (copy kernel {res['copy']['kernel_copy_GBps']:.0f}, "
        f"read-only kernel {res['copy']['kernel_read_GBps']:.0f})")
    res["write"] = bench(sources, res["copy"]["GBps"])
    res["seconds"] = time.time() - t0
    save()
    log("\n| dtype | case | source | ms | % copy | % same-bytes copy | rounds ms |\n|---|---|---|---|---|---|---|")
    for r in res["write"]:
        log(f"| {r['dtype']} | {r['case']} | {r['source']} | {r['ms']:.4f} | {r['pct_copy']:.1f} | "
            f"{r['pct_copy_same_bytes']:.1f} | {', '.join(f'{m:.4f}' for m in r['round_ms'])} |")
    ok = all(all(v for k, v in c.items() if k not in ("source", "N", "dtype")) for c in res["checks"])
    log(f"checks all true: {ok}; {res['seconds']:.0f} s")


if __name__ == "__main__":
    main()
