"""Tensor parallelism for the engine: transformers' tensor-parallel plan, one process per device.

Launch one process per device (``torchrun --nproc-per-node N ...``); every rank builds the same
:class:`~gpu_ref.serve.Engine` over its shard of the model and drives it with the same requests in the
same order. transformers shards the model by its ``base_model_tp_plan`` (Llama: q/k/v and the MLP's
gate/up column-parallel, o and down row-parallel with an all-reduce; embeddings, norms and the LM head
replicated), so a rank's attention sees its own ``kv_heads / world`` KV heads and their query heads. The
packed cache is per head vector, so a rank's pool is the same structure with its heads only (key tables
sliced to them) and needs no collective of its own; the engine agrees on every sampled token by a
broadcast from rank 0 (one small collective per forward), so the ranks never drift apart.

:func:`init` starts the process group (``nccl`` on CUDA, ``gloo`` on CPU) from torchrun's environment;
:func:`load` loads a checkpoint sharded; :func:`random_model` builds a sharded model of random weights
from a config without materializing the full model (the benchmark's Llama-3-70B shape);
:func:`shard_of` tells the engine which KV heads a model's ranks hold.
"""

from __future__ import annotations

import dataclasses
import os

#: NVLink multicast stays off (NCCL NVLS, torch symmetric memory, NVSHMEM), set before the group starts
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _torch():
    import torch
    return torch


@dataclasses.dataclass(frozen=True)
class Shard:
    """The KV heads of one rank: ``heads`` (global indices, contiguous) of ``kv_heads`` in the model,
    with ``q_heads`` query heads on this rank; ``rank`` of ``world``."""

    rank: int
    world: int
    kv_heads: int
    heads: tuple
    q_heads: int

    @property
    def local_kv_heads(self) -> int:
        return len(self.heads)


def init(device_type: str | None = None):
    """Start the default process group from torchrun's environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``): ``nccl`` on CUDA (the rank's device bound first),
    ``gloo`` on CPU, NVLink multicast off. Without ``WORLD_SIZE`` (a plain ``python`` launch) nothing is
    started. Returns ``(rank, world, device)``."""
    torch = _torch()
    for k, v in NO_MULTICAST.items():
        os.environ[k] = v
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type not in ("cuda", "cpu"):
        raise ValueError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(dev)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device_type == "cuda" else "gloo",
                                             device_id=dev if device_type == "cuda" else None)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    return rank, world, dev


def _dist_config(world: int):
    from transformers.distributed import DistributedConfig
    return DistributedConfig(tp_size=world)


def load(path, dtype=None, world: int | None = None):
    """``AutoModelForCausalLM.from_pretrained(path)`` sharded over ``world`` ranks (default
    ``WORLD_SIZE``) by the model's tensor-parallel plan; unsharded for one rank."""
    from transformers import AutoModelForCausalLM
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
    kw = dict(distributed_config=_dist_config(world)) if world > 1 else {}
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
    return m.eval()


def random_model(config, dtype, device, world: int = 1, seed: int = 0):
    """A causal LM of ``config`` with random weights (normal, std ``initializer_range``; norms 1),
    sharded over ``world`` ranks by transformers' tensor-parallel plan: built on the meta device, sharded,
    then only this rank's shards are allocated on ``device`` (the full model never exists). Replicated
    weights are equal on every rank (``seed``); shards are seeded per rank."""
    torch = _torch()
    from transformers import AutoModelForCausalLM
    from torch.distributed.tensor import DTensor
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(config, dtype=dtype)
    cls = type(m)
    if world > 1:
        dc, _, mesh = cls.prepare_distribute_model(_dist_config(world))
        m = cls.maybe_distribute_model(m, dc, mesh)
    m.to_empty(device=device)
    std = getattr(config, "initializer_range", 0.02)
    rank = torch.distributed.get_rank() if world > 1 else 0
    with torch.no_grad():
        for name, p in m.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            g = torch.Generator(device=device).manual_seed(seed + (1 + rank if isinstance(p, DTensor) else 0))
            if name.endswith("norm.weight"):
                local.fill_(1.0)
            elif name.endswith(".bias"):
                local.zero_()
            else:
                local.normal_(0.0, std, generator=g)
        for mod in m.modules():                       # non-persistent buffers (rotary frequencies)
            if hasattr(mod, "inv_freq") and hasattr(mod, "config"):
                fresh = type(mod)(config=mod.config)
                for bname, buf in fresh.named_buffers(recurse=False):
                    getattr(mod, bname).copy_(buf.to(device))
    return m.eval()


def shard_of(model) -> Shard:
    """The KV heads this rank's attention holds: the local rows of layer 0's ``k_proj`` (a DTensor
    shard under transformers' plan) over ``head_dim``; ranks hold contiguous equal slices.

    Raises:
        ValueError: the KV heads do not split evenly over the ranks (a head would straddle two ranks).
    """
    torch = _torch()
    from ..hf.cache import model_shape
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    _, hq, kvh, d = model_shape(cfg)
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    rank = torch.distributed.get_rank() if world > 1 else 0
    attn = _first_attention(model)
    local = kvh
    if attn is not None:
        w = attn.k_proj.weight
        rows = w.to_local().shape[0] if hasattr(w, "to_local") else w.shape[0]
        local = rows // d
    if local == kvh:
        return Shard(0, 1, kvh, tuple(range(kvh)), hq)
    if kvh % world or local * world != kvh:
        raise ValueError(f"tensor parallelism needs the {kvh} KV heads to split evenly over {world} ranks "
                         f"(this rank holds {local})")
    return Shard(rank, world, kvh, tuple(range(rank * local, (rank + 1) * local)), hq // world)


def _first_attention(model):
    for mod in model.modules():
        if hasattr(mod, "k_proj") and hasattr(mod.k_proj, "weight"):
            return mod
    return None


def agree(values, shard: Shard, device):
    """Rank 0's ``values`` (a list of ints) on every rank (a broadcast; as is for one rank)."""
    if shard.world == 1:
        return values
    torch = _torch()
    t = torch.tensor(values, dtype=torch.int64, device=device)
    torch.distributed.broadcast(t, 0)
    return [int(x) for x in t.tolist()]
