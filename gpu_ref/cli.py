"""Command-line options shared by ``python -m gpu_ref.generate`` and ``python -m gpu_ref.serve``: the model,
its cache policy and its key tables, checked before the model loads (:func:`check_model_options`), then
the tables checked against the loaded model (:func:`check_tables_fit`). Every error exits 2 with one line
naming the option. Also the tokenizer checks both make (and the server's chat route): :func:`has_chat_template`.
"""

from __future__ import annotations

import os
import sys

DTYPES = ("bf16", "fp16", "fp32")


def add_model_options(ap):
    """``--model``, ``--policy``, ``--tables``, ``--backend``, ``--dtype``."""
    from sim_models.models import spec_help
    ap.add_argument("--model", required=True, help=f"{spec_help()} (sim_models.models.resolve)")
    ap.add_argument("--policy", default="v4", help="cache policy spec (sim_models.CachePolicy.parse), e.g. v4, K3V3 "
                                                   "(default: %(default)s)")
    ap.add_argument("--tables", help="the model's key tables, written once per model by python -m "
                                     "sim_models.calibrate (needed by v4, the default, and v3: any policy with "
                                     "+C or +KS2)")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "golden"),
                    help="the packed store: the CUDA kernels or the NumPy golden model (default: %(default)s)")
    ap.add_argument("--dtype", default="bf16", choices=DTYPES, help="model weights (default: %(default)s)")


def check_model_options(ap, a):
    """Resolve ``--model`` (``a.src``), parse ``--policy`` (``a.cache_policy``) and load ``--tables``
    (``a.key_tables``, None without the option) before the model loads; ``ap.error`` names the option."""
    from sim_models import CachePolicy, KeyTables
    from sim_models.models import resolve
    try:
        a.src = resolve(a.model)
    except (ValueError, FileNotFoundError) as err:
        msg = str(err)
        ap.error(msg if msg.startswith("--model") else f"--model {a.model!r}: {msg}")
    try:
        a.cache_policy = CachePolicy.parse(a.policy)
    except (ValueError, TypeError) as err:
        ap.error(f"--policy {a.policy!r}: {err}")
    pol = a.cache_policy
    if (pol.center_keys or pol.key_scale) and not a.tables:
        ap.error(f"--policy {a.policy!r} centers / scales keys: it needs --tables (write them once per model with "
                 f"'python -m sim_models.calibrate --model {a.model} --out tables.npz'), or use --policy K3V3")
    a.key_tables = None
    if a.tables:
        if not os.path.isfile(a.tables):
            ap.error(f"--tables: no such file {a.tables!r}")
        try:
            a.key_tables = KeyTables.load(a.tables)
        except ValueError as err:
            ap.error(f"--tables: {err}")
        if pol.key_scale and a.key_tables.log2_s is None:
            ap.error(f"--policy {a.policy!r} scales keys (KS2) but --tables {a.tables!r} hold no key scales (log2_s)")


def check_tables_fit(ap, a, model):
    """After the model loads: ``--tables`` must have the model's (layers, KV heads, head_dim) (``ap.error``
    otherwise); tables calibrated under another model id of that shape get a warning line."""
    t = a.key_tables
    if t is None:
        return
    from .hf.cache import model_shape
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n_layers, _, kvh, d = model_shape(cfg)
    if t.shape != (n_layers, kvh, d):
        ap.error(f"--tables {a.tables!r}: tables of model {t.model_id!r} with (layers, kv heads, head_dim) = "
                 f"{t.shape}; --model {a.model!r} has {(n_layers, kvh, d)}: calibrate this model's tables with "
                 f"'python -m sim_models.calibrate --model {a.model} --out tables.npz'")
    if t.model_id != a.src.model_id:
        print(f"warning: --tables {a.tables!r} were calibrated for model {t.model_id!r}, --model is "
              f"{a.src.model_id!r} (same shape; use them only if it is the same model)", file=sys.stderr)


#: what a tokenizer without a chat template cannot do (generate's --chat, the server's chat route)
NO_CHAT_TEMPLATE = "this model's tokenizer has no chat template"


def has_chat_template(tok) -> bool:
    """Whether ``tok`` renders chat messages: it has ``apply_chat_template`` and a template (a transformers
    tokenizer has the method also when its ``chat_template`` is None, e.g. gemma3-270m's)."""
    return callable(getattr(tok, "apply_chat_template", None)) and getattr(tok, "chat_template", "") is not None


def torch_dtype(name: str):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]
