"""python -m gpu_ref.serve --model SPEC --policy v4 --tables tables.npz [--port 8000]

An OpenAI-compatible server (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``)
for a model whose KV cache is in the packed format; see :mod:`gpu_ref.serve.server` and docs/GPU.md,
*Serving*. Bad options exit 2 with one line naming the option, before the model loads; what only the
loaded model shows (tables of another model, a pool too small for one block) the same way after it loads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


#: engine parameter (:class:`gpu_ref.serve.ConfigError`) -> the option that sets it
OPTION_OF = {"pool_bytes": "--pool-mib", "num_blocks": "--pool-mib", "block_size": "--block-size",
             "max_batch": "--max-batch", "max_queue": "--max-queue"}


def parse(argv=None):
    from gpu_ref.cli import add_model_options, check_model_options
    ap = argparse.ArgumentParser(prog="python -m gpu_ref.serve", description=__doc__.split("\n")[0])
    add_model_options(ap)
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    ap.add_argument("--port", type=int, default=8000,
                    help="port to listen on; 0: a free port, printed at the start (default: %(default)s)")
    ap.add_argument("--served-model-name", nargs="+", metavar="NAME",
                    help="the names clients pass as 'model', the first one reported in /v1/models and responses "
                         "(default: the alias, also when --model is its .gguf file, else the file or folder name; "
                         "requests may also name the --model string)")
    ap.add_argument("--pool-mib", type=float, default=1024.0, help="KV pool size in MiB of packed bytes (default: %(default)s)")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per pool block (default: %(default)s)")
    ap.add_argument("--max-batch", type=int, default=32, help="requests decoded together at most (default: %(default)s)")
    ap.add_argument("--max-queue", type=int, default=256, help="waiting requests at most, then 503 (default: %(default)s)")
    a = ap.parse_args(argv)
    for name in ("port", "block_size", "max_batch", "max_queue"):
        if getattr(a, name) < (0 if name == "port" else 1) or (name == "port" and a.port > 65535):
            ap.error(f"--{name.replace('_', '-')} out of range: {getattr(a, name)}")
    if not 0 < a.pool_mib < 2**30:                     # finite: MiB, at most 1 PiB
        ap.error(f"--pool-mib must be > 0 and finite, got {a.pool_mib}")
    check_model_options(ap, a)
    a.served_names = served_names(ap, a)
    a.ap = ap
    return a


def served_names(ap, a) -> list[str]:
    """The names a request's ``model`` may use, the reported id first: ``--served-model-name``'s, else the
    alias (``--model`` an alias or the .gguf file it resolves to) or the file / folder name without its
    directory, then the ``--model`` string itself."""
    if a.served_model_name:
        bad = [n for n in a.served_model_name if not n.strip()]
        if bad:
            ap.error(f"--served-model-name: names must be non-empty, got {bad[0]!r}")
        return list(dict.fromkeys(a.served_model_name))
    from sim_models.models import WHEELS, alias_of
    own = a.model in WHEELS or (a.src.is_gguf and alias_of(a.src.path) is not None)
    return list(dict.fromkeys([a.src.model_id if own else (Path(a.model).name or a.model), a.model]))


def main(argv=None) -> int:
    a = parse(argv)
    ap = a.ap
    import torch

    from gpu_ref.cli import check_tables_fit, torch_dtype
    from sim_models.models import load

    from .engine import ConfigError, Engine
    from .server import OpenAIServer
    if a.backend == "cuda" and not torch.cuda.is_available():
        ap.error("--backend cuda needs a CUDA GPU (torch.cuda.is_available() is False); use --backend golden")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        model, tok = load(a.src, dtype=torch_dtype(a.dtype))
    except (ValueError, OSError) as err:
        ap.error(f"--model {a.model!r}: cannot load it: {err}")
    model = model.to(device)
    check_tables_fit(ap, a, model)
    try:
        engine = Engine(model, a.cache_policy, tables=a.key_tables, backend=a.backend, block_size=a.block_size,
                        pool_bytes=int(a.pool_mib * 2**20), max_batch=a.max_batch, max_queue=a.max_queue)
    except ConfigError as err:
        opt = OPTION_OF.get(err.param, f"--{err.param.replace('_', '-')}")
        if err.param == "pool_bytes":
            ap.error(f"--pool-mib {a.pool_mib:g} is too small for one sequence: {err}")
        ap.error(f"{opt}: {err}")
    except (torch.OutOfMemoryError, MemoryError) as err:
        where = "device" if a.backend == "cuda" else "host (the golden stores keep float32 reconstructions)"
        ap.error(f"--pool-mib {a.pool_mib:g}: the pool does not fit the {where} memory "
                 f"({(str(err).splitlines() or [type(err).__name__])[0]})")
    except (ValueError, TypeError) as err:
        ap.error(f"--policy {a.policy!r} / --backend {a.backend}: {err}")
    name = a.served_names[0]
    try:
        srv = OpenAIServer(engine, tok, name, (a.host, a.port), policy_names=(a.policy,),
                           model_names=a.served_names[1:])
    except OSError as err:
        ap.error(f"--host {a.host} --port {a.port}: cannot listen there: {err}")
    st = engine.stats()
    host, port = srv.server_address[:2]                 # the bound port (--port 0: the one the system chose)
    print(f"serving {name!r} ({a.src.description}) with policy {engine.policy.spec} on http://{host}:{port}/v1: "
          f"pool {st['num_blocks']} blocks of {a.block_size} tokens ({st['block_bytes']} B each), "
          f"<= {min(engine.capacity_tokens, engine.max_context)} tokens per request", file=sys.stderr)
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
