"""Amaranth 0.5 RTL of the fwht-kv write path (bit-exact with sim_models.encode).

Modules:
    frontend   special values, sign flip D, block floating point (combinational)
    fwht       log2(N)-stage butterfly FWHT with ``latency`` pipeline registers
    quantizer  per-block scale byte (ue5m3) and b-bit codes (2 pipeline stages)
    packer     b-bit two's-complement codes packed LSB first (combinational)
    epilogue   top level ``KVEpilogue`` (stream in, stream out, sticky status)
"""

from .epilogue import KVEpilogue

__all__ = ["KVEpilogue"]
