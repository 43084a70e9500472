"""Amaranth 0.5 RTL of the fwht-kv write path (bit-exact with sim_models.encode).

Modules:
    frontend   special values, sign flip D, block floating point (combinational)
    fwht       log2(N)-stage butterfly FWHT with ``latency`` pipeline registers
    quantizer  per-block scale byte (ue5m3) and b-bit codes (2 pipeline stages)
    packer     b-bit two's-complement codes packed LSB first (combinational)
    epilogue   top level ``KVEpilogue`` (stream in, stream out, sticky status)

Read path (bit-exact with sim_models.decode):
    dequant       code -> level table, scale-byte decode, level * sig per lane
    ifwht         inverse FWHT on block-scaled integers (narrow inner stages,
                  exact block alignment, wide outer stages), pipelined
    tofloat       exact integer -> fp16/bf16 (leading one, RNE, saturation)
    decompressor  top level ``KVDecompressor`` (stream in, stream out)

Round trip (verification DUT): roundtrip ``KVRoundTrip`` = KVEpilogue -> KVDecompressor.
"""

from .decompressor import KVDecompressor
from .epilogue import KVEpilogue

__all__ = ["KVDecompressor", "KVEpilogue"]
