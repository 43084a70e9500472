"""Amaranth 0.5 RTL of the fwht-kv write path (bit-exact with sim_models.encode).

Modules:
    frontend      special values, sign flip D, block floating point (``fe_regs`` cut)
    fwht          log2(N)-stage butterfly FWHT with ``latency`` pipeline registers
    quantizer     per-block scale byte and b-bit codes (``quant_regs`` pipeline cuts)
    scale_select  scale byte without dividers; the leading-one detector
    thresholds    per-block code thresholds
    packer        b-bit two's-complement codes packed LSB first (combinational)
    epilogue      top level ``KVEpilogue`` (stream in, stream out, sticky status)
    pipeline      register stages (``stage``) and placements (``Cuts``); trees: reduction trees

Read path (bit-exact with sim_models.decode):
    dequant       code -> level table, scale-byte decode, level * sig per lane
    ifwht         inverse FWHT on block-scaled integers (narrow inner stages,
                  exact block alignment, wide outer stages), pipelined
    tofloat       exact integer -> fp16/bf16 (leading one, RNE, saturation)
    decompressor  top level ``KVDecompressor`` (stream in, stream out)

Both: wire (the stream payload ``StructLayout``s, from ``sim_models.wire``).
Round trip (verification DUT): roundtrip ``KVRoundTrip`` = KVEpilogue -> KVDecompressor.
"""

from .decompressor import KVDecompressor
from .epilogue import KVEpilogue

__all__ = ["KVDecompressor", "KVEpilogue"]
