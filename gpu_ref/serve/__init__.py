"""Serving the packed cache: a continuous-batching engine (:mod:`~gpu_ref.serve.engine`) and an
OpenAI-compatible HTTP server over it (:mod:`~gpu_ref.serve.server`; ``python -m gpu_ref.serve``).

The engine keeps one batch-1 :class:`gpu_ref.hf.PackedCache` per running request (golden or CUDA store)
and a pool of blocks counted in the policy's packed bytes; see docs/GPU.md, *Serving*.
"""

from .engine import Engine, PoolFull, Request, RequestError, SamplingParams, cache_bytes

__all__ = ["Engine", "PoolFull", "Request", "RequestError", "SamplingParams", "cache_bytes"]
