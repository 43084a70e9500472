"""Amaranth RTL of fwht-kv: the write path ``KVEncoder`` (bit-exact with
``sim_models.encode``) and the read path ``KVDecoder`` (bit-exact with
``sim_models.decode``), configured by ``hw.options``.

Write path: frontend (special values, sign flip D, block floating point), fwht
(butterfly FWHT), quantizer (scale byte and codes; scale_select, thresholds), packer,
encoder (top level). Read path: dequant (code -> level, scale decode), ifwht (inverse
FWHT on block-scaled integers), tofloat (exact integer -> fp16/bf16), decoder (top
level). Both: pipeline (register stages, cuts, flow control), trees, wire (the stream
payload layouts, from ``sim_models.wire``). Round trip (verification DUT): roundtrip.
"""

from .decoder import KVDecoder
from .encoder import KVEncoder
from .options import DecoderOptions, EncoderOptions, FoldOptions, RoundTripOptions

__all__ = ["DecoderOptions", "EncoderOptions", "FoldOptions", "KVDecoder", "KVEncoder",
           "RoundTripOptions"]
