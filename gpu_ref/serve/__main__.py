"""python -m gpu_ref.serve --model SPEC --policy v3 --tables tables.npz [--port 8000]

An OpenAI-compatible server (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``)
for a model whose KV cache is in the packed format; see :mod:`gpu_ref.serve.server` and docs/GPU.md,
*Serving*. Bad options exit 2 with one line naming the option, before the model loads.
"""

from __future__ import annotations

import argparse
import os
import sys


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m gpu_ref.serve", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="model spec: an alias (smollm2-135m), a .gguf file or a Hugging "
                                                   "Face folder (sim_models.models.resolve)")
    ap.add_argument("--policy", default="v3", help="cache policy spec (sim_models.CachePolicy.parse), e.g. v3, K3V3")
    ap.add_argument("--tables", help="the model's key tables (python -m sim_models.calibrate; needed for +C / +KS2)")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "golden"))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--served-model-name", help="the id clients pass as 'model' (default: the model spec)")
    ap.add_argument("--pool-mib", type=float, default=1024.0, help="KV pool size in MiB of packed bytes")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per pool block")
    ap.add_argument("--max-batch", type=int, default=32, help="requests decoded together at most")
    ap.add_argument("--max-queue", type=int, default=256, help="waiting requests at most (then 503)")
    a = ap.parse_args(argv)
    for name in ("port", "block_size", "max_batch", "max_queue"):
        if getattr(a, name) < (0 if name == "port" else 1) or (name == "port" and a.port > 65535):
            ap.error(f"--{name.replace('_', '-')} out of range: {getattr(a, name)}")
    if not a.pool_mib > 0:
        ap.error(f"--pool-mib must be > 0, got {a.pool_mib}")
    from sim_models import CachePolicy
    from sim_models.models import resolve
    try:
        a.src = resolve(a.model)
    except (ValueError, FileNotFoundError) as err:
        ap.error(f"--model: {err}")
    try:
        a.cache_policy = CachePolicy.parse(a.policy)
    except (ValueError, TypeError) as err:
        ap.error(f"--policy {a.policy!r}: {err}")
    if a.tables and not os.path.isfile(a.tables):
        ap.error(f"--tables: no such file {a.tables!r}")
    if (a.cache_policy.center_keys or a.cache_policy.key_scale) and not a.tables:
        ap.error(f"--policy {a.policy!r} centers / scales keys: it needs --tables (write them once per model with "
                 f"'python -m sim_models.calibrate --model {a.model} --out tables.npz'), or use --policy K3V3")
    a.ap = ap
    return a


def main(argv=None) -> int:
    a = parse(argv)
    ap = a.ap
    from sim_models import KeyTables
    from sim_models.models import load
    tables = None
    if a.tables:
        try:
            tables = KeyTables.load(a.tables)
        except ValueError as err:
            ap.error(f"--tables: {err}")
    import torch

    from .engine import Engine
    from .server import OpenAIServer
    if a.backend == "cuda" and not torch.cuda.is_available():
        ap.error("--backend cuda needs a CUDA GPU (torch.cuda.is_available() is False); use --backend golden")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    model, tok = load(a.src, dtype=dtype)
    model = model.to(device)
    try:
        engine = Engine(model, a.cache_policy, tables=tables, backend=a.backend, block_size=a.block_size,
                        pool_bytes=int(a.pool_mib * 2**20), max_batch=a.max_batch, max_queue=a.max_queue)
    except (ValueError, TypeError) as err:
        ap.error(f"{err}")
    name = a.served_model_name or a.model
    srv = OpenAIServer(engine, tok, name, (a.host, a.port), policy_names=(a.policy,))
    st = engine.stats()
    print(f"serving {name!r} ({a.src.description}) with policy {engine.policy.spec} on http://{a.host}:{a.port}/v1: "
          f"pool {st['num_blocks']} blocks of {a.block_size} tokens ({st['block_bytes']} B each), "
          f"<= {engine.capacity_tokens} tokens per request", file=sys.stderr)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
