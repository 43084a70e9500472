"""Serving the packed cache: a continuous-batching engine (:mod:`~gpu_ref.serve.engine`) and an
OpenAI-compatible HTTP server over it (:mod:`~gpu_ref.serve.server`; ``python -m gpu_ref.serve``).

The engine keeps every running request's K/V in one paged pool per layer shared by the batch
(:mod:`~gpu_ref.serve.paged`: block allocator with prefix sharing, golden and CUDA paged stores), sized
in the policy's packed bytes; see docs/GPU.md, *Serving*.
"""

from .engine import ConfigError, Engine, PoolFull, Request, RequestError, SamplingParams, cache_bytes

__all__ = ["ConfigError", "Engine", "PoolFull", "Request", "RequestError", "SamplingParams", "cache_bytes"]
