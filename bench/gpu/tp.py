"""Tensor-parallel serving at 128K contexts: the engine over N GPUs, packed caches against the 16-bit cache.

    torchrun --nproc-per-node N -m bench.gpu.tp [--out DIR] [options]     (N = 1 also: python -m bench.gpu.tp)
    python -m bench.gpu.tp --dry-run                                      (CPU, gloo under torchrun, tiny shape)

Random bf16 weights at the Llama-3-70B shape (80 layers, 64 q / 8 KV heads, head_dim 128; ``--layers``
fewer where the weights do not fit the GPUs), sharded by transformers' tensor-parallel plan, one process
per GPU (:mod:`gpu_ref.serve.tp`, NCCL, NVLink multicast off). For each cache (``bf16``: the engine's
16-bit pool; ``K3V3`` and ``v3`` packed, on the kernels) the pool gets the GPU memory left after the
weights and ``--reserve-gib``; the largest number of concurrent ``--context`` sequences is the pool's
blocks over one sequence's blocks (the same on every rank). That many requests are put in the engine
as prefilled (their blocks reserved, the cache bytes left as allocated: decode time does not depend on
the values; a 128K prefill per sequence would take minutes), ending at exactly ``--context`` tokens,
and the engine steps: each step one batched decode forward writing every sequence's new token and
attending over its whole cache. Recorded (rank 0): max concurrency, sustained output tokens/s
(tokens over the timed steps' wall time), time per output token p50/p99 (the step times). One run is
one GPU count: its entry (keyed by GPU count) is merged into ``--out``/gpu_bench_tp.json and the
plot beside it redrawn with every count so far, the node named.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
FNAME = "gpu_bench_tp.json"
#: Llama-3-70B
SHAPE = dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
             num_attention_heads=64, num_key_value_heads=8, head_dim=128, rope_theta=500000.0)
#: --dry-run: the same code path at a CPU size (golden stores)
DRY_SHAPE = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=64)
DRY_POOL = 1 << 19
CACHES = {"bf16": "fp16", "K3V3": "K3V3", "v3": "v3"}


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.tp", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or RESULTS),
                    help="folder of the results file (default $OUT, else bench/results)")
    ap.add_argument("--caches", default=",".join(CACHES), help=f"of {', '.join(CACHES)} (default all)")
    ap.add_argument("--context", type=int, default=131072, help="tokens per sequence (default 131072)")
    ap.add_argument("--layers", type=int, help="decoder layers (default 80; fewer where the weights do not fit)")
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps (default 32)")
    ap.add_argument("--warmup", type=int, default=4, help="untimed decode steps first (default 4)")
    ap.add_argument("--block-size", type=int, default=64, help="tokens per pool block (default 64)")
    ap.add_argument("--reserve-gib", type=float, default=10.0,
                    help="GPU memory per rank kept out of the pool for activations (default 10)")
    ap.add_argument("--max-batch", type=int, default=512, help="concurrent sequences at most (default 512)")
    ap.add_argument("--dry-run", action="store_true", help="CPU: tiny shape, golden stores, 512 KiB pool per rank; "
                    "unless given context 160, block size 16, 1 + 3 steps; checks the code path")
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args(argv)
    caches = [c for c in a.caches.split(",") if c]
    bad = [c for c in caches if c not in CACHES]
    if bad or not caches:
        ap.error(f"--caches: unknown {bad or 'empty'}; choose from {', '.join(CACHES)}")
    a.caches = caches
    if a.dry_run:
        given = set(argv if argv is not None else sys.argv[1:])
        for flag, name, value in (("--context", "context", 160), ("--block-size", "block_size", 16),
                                  ("--steps", "steps", 3), ("--warmup", "warmup", 1)):
            if flag not in given:
                setattr(a, name, value)
    for name in ("context", "steps", "block_size", "max_batch"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.warmup < 0 or a.reserve_gib < 0:
        ap.error("--warmup and --reserve-gib must be >= 0")
    if a.context <= a.warmup + a.steps + 1:
        ap.error(f"--context {a.context} must exceed --warmup + --steps + 1")
    if a.layers is not None and a.layers < 1:
        ap.error("--layers must be >= 1")
    if a.out.exists() and not a.out.is_dir():
        ap.error(f"--out {a.out}: not a folder")
    return a


def _config(a):
    from transformers import LlamaConfig
    kw = dict(DRY_SHAPE if a.dry_run else SHAPE)
    if a.layers:
        kw["num_hidden_layers"] = a.layers
    return LlamaConfig(max_position_embeddings=a.context + 1024, **kw)


def _tables(cfg):
    from gpu_ref.hf import model_shape
    from sim_models import KeyTables
    n, _, kvh, d = model_shape(cfg)
    return KeyTables("timing", np.zeros((n, kvh, d), np.float16), np.zeros((n, kvh, d), np.int8))


def _sync(dev):
    import torch
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _free_bytes(dev):
    import torch
    if dev.type != "cuda":
        return None
    import cupy
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(dev)[0]


def _min_all(x: int, world: int, dev) -> int:
    import torch
    if world == 1:
        return x
    t = torch.tensor([x], dtype=torch.int64, device=dev)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
    return int(t.item())


def run_cache(a, model, name, world, dev, log):
    """One cache: its pool, max concurrency, then the timed decode steps at that batch."""
    import torch
    from gpu_ref.serve import Engine, SamplingParams
    spec = CACHES[name]
    backend = "golden" if a.dry_run else "cuda"
    tables = _tables(model.config) if spec == "v3" else None
    probe = Engine(model, spec, tables=tables, backend=backend, num_blocks=1, block_size=a.block_size,
                   max_batch=1, max_context=a.context, prefix_sharing=False)
    block = probe.block_bytes
    # the kernels' pool also keeps one flag byte per row and kind (not in the block's packed bytes)
    flags = 0 if spec == "fp16" else 2 * sum(w is None for w in probe.windows) * probe.shard.local_kv_heads \
        * a.block_size
    per_seq = probe.blocks_for(a.context)
    del probe
    free = _free_bytes(dev)
    avail = DRY_POOL if free is None else int(free - a.reserve_gib * 2 ** 30)
    num_blocks = _min_all(max(avail, 0) // (block + flags), world, dev)
    conc = min(num_blocks // per_seq, a.max_batch)
    r = dict(cache=name, spec=spec, block_bytes_per_rank=block, blocks=num_blocks, blocks_per_seq=per_seq,
             pool_gib_per_rank=num_blocks * block / 2 ** 30,
             seq_gib_per_rank=per_seq * block / 2 ** 30, max_concurrency=conc)
    log(f"{name}: pool {r['pool_gib_per_rank']:.1f} GiB/rank, {per_seq} blocks/seq -> max concurrency {conc}")
    if conc < 1:
        r["skipped"] = "no sequence of --context tokens fits the pool"
        return r
    e = Engine(model, spec, tables=tables, backend=backend, num_blocks=num_blocks, block_size=a.block_size,
               max_batch=conc, max_queue=conc, max_context=a.context, prefix_sharing=False)
    n_out = a.warmup + a.steps + 2                    # one more than the steps produce: none leaves the batch
    prompt = [1] * (a.context - n_out)                # the cache ends at --context tokens
    for _ in range(conc):                              # admitted as prefilled: blocks reserved, first token out
        req = e.submit(prompt, SamplingParams(max_tokens=n_out))
        e.waiting.remove(req)
        if not e._admit(req):
            raise RuntimeError("the pool did not admit the planned batch")
        req.segments, req.filled = [], len(prompt)
        req.output.append(1)
        e.running.append(req)
    times = []
    with torch.no_grad():
        for i in range(a.warmup + a.steps):
            _sync(dev)
            t0 = time.perf_counter()
            e.step()
            _sync(dev)
            if i >= a.warmup:
                times.append(time.perf_counter() - t0)
    ms = np.array(times) * 1e3
    if len(e.running) != conc or any(len(q.output) != n_out - 1 for q in e.running):
        raise RuntimeError("a request left the batch before the timed steps ended")
    r.update(batch=conc, steps=a.steps, tokens_per_s=conc * len(ms) / (ms.sum() / 1e3),
             tpot_ms_p50=float(np.percentile(ms, 50)), tpot_ms_p99=float(np.percentile(ms, 99)),
             step_ms_mean=float(ms.mean()))
    log(f"{name}: batch {conc}, {r['tokens_per_s']:.0f} tok/s, time per output token p50 {r['tpot_ms_p50']:.1f} ms, "
        f"p99 {r['tpot_ms_p99']:.1f} ms")
    for q in list(e.running):
        e.cancel(q)
    e.step()
    del e
    _free_bytes(dev)
    return r


def node(world, dev) -> dict:
    import torch
    n = dict(host=socket.gethostname(), gpus=world)
    if dev.type == "cuda":
        n["gpu"] = torch.cuda.get_device_name(dev)
        n["gpu_mem_gib"] = torch.cuda.get_device_properties(dev).total_memory / 2 ** 30
    else:
        n["gpu"] = "none (CPU dry run)"
    return n


def main(argv=None) -> int:
    a = parse(argv)
    import torch
    from gpu_ref.serve import tp
    if not a.dry_run:
        from bench.gpu import gpu_missing
        missing = gpu_missing()
        if missing:
            print(f"python -m bench.gpu.tp: error: {missing} (--dry-run runs on CPU)", file=sys.stderr)
            return 2
    rank, world, dev = tp.init("cpu" if a.dry_run else "cuda")

    def log(s):
        if rank == 0:
            print(s, flush=True)
    cfg = _config(a)
    if cfg.num_key_value_heads % world:
        print(f"error: {cfg.num_key_value_heads} KV heads do not split over {world} ranks", file=sys.stderr)
        return 2
    dtype = torch.float32 if a.dry_run else torch.bfloat16
    wbytes = 2 * (2 * cfg.vocab_size * cfg.hidden_size + cfg.num_hidden_layers * (
        cfg.hidden_size * cfg.head_dim * 2 * (cfg.num_attention_heads + cfg.num_key_value_heads)
        + 3 * cfg.hidden_size * cfg.intermediate_size))
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev).total_memory
        # embeddings and the LM head are replicated; the layers split over the ranks
        per_rank = 2 * 2 * cfg.vocab_size * cfg.hidden_size + (wbytes - 4 * cfg.vocab_size * cfg.hidden_size) / world
        if per_rank > total - a.reserve_gib * 2 ** 30:
            fit = int((total - a.reserve_gib * 2 ** 30 - 4 * cfg.vocab_size * cfg.hidden_size) * world
                      / ((wbytes - 4 * cfg.vocab_size * cfg.hidden_size) / cfg.num_hidden_layers))
            print(f"error: {per_rank / 2**30:.0f} GiB of weights per GPU do not fit {total / 2**30:.0f} GiB less "
                  f"--reserve-gib; use --layers {max(fit - 4, 1)} or more GPUs", file=sys.stderr)
            return 2
    log(f"node {socket.gethostname()}: {world} rank(s) on {dev.type}; {cfg.num_hidden_layers} layers, "
        f"{wbytes / 2**30:.0f} GiB of weights")
    model = tp.random_model(cfg, dtype, dev, world=world)
    results = []
    for name in a.caches:
        results.append(run_cache(a, model, name, world, dev, log))
    entry = dict(node=node(world, dev), layers=cfg.num_hidden_layers, context=a.context, block_size=a.block_size,
                 reserve_gib=a.reserve_gib, weights_gib=wbytes / 2 ** 30, dry_run=a.dry_run, caches=results)
    base = next((x for x in results if x["cache"] == "bf16" and x.get("tokens_per_s")), None)
    if base:
        for x in results:
            if x is not base and x.get("tokens_per_s"):
                x["concurrency_vs_bf16"] = x["max_concurrency"] / base["max_concurrency"]
                x["tokens_per_s_vs_bf16"] = x["tokens_per_s"] / base["tokens_per_s"]
    if rank == 0:
        a.out.mkdir(parents=True, exist_ok=True)
        path = a.out / FNAME
        doc = json.loads(path.read_text()) if path.exists() else {}
        doc.setdefault("runs", {})[str(world)] = entry
        doc["note"] = ("Llama-3-70B shape, random bf16 weights, tensor parallel (transformers' plan, one process "
                       "per GPU); one entry per GPU count (python -m bench.gpu.tp)")
        path.write_text(json.dumps(doc, indent=1) + "\n")
        log(f"wrote {path}")
        if not a.no_plot:
            plot(doc, path.with_suffix(".png"))
    if world > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


def plot(doc, dst):
    """Max concurrency and sustained tokens/s against GPU count, one line per cache; the node in the title."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = sorted(doc["runs"].items(), key=lambda kv: int(kv[0]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(dict.fromkeys(c["cache"] for _, e in runs for c in e["caches"]))
    for name in names:
        xs, conc, tps = [], [], []
        for g, e in runs:
            c = next((c for c in e["caches"] if c["cache"] == name), None)
            if c is not None:
                xs.append(int(g))
                conc.append(c["max_concurrency"])
                tps.append(c.get("tokens_per_s", 0.0))
        style = "o--" if name == "bf16" else "s-"
        axes[0].plot(xs, conc, style, label=name)
        axes[1].plot(xs, tps, style, label=name)
    last = runs[-1][1]
    for ax, t in zip(axes, (f"concurrent {last['context'] // 1024}K sequences", "sustained output tokens/s")):
        ax.set_xlabel("GPUs")
        ax.set_title(t)
        ax.set_xticks([int(g) for g, _ in runs])
        ax.grid(alpha=0.3)
        ax.legend()
    n = last["node"]
    fig.suptitle(f"{n['host']}: {n['gpu']}; {last['layers']} layers of the Llama-3-70B shape"
                 + (" (dry run)" if last.get("dry_run") else ""))
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
