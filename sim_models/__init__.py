"""fwht-kv golden model: the NumPy definition of the 3-bit rotated KV-cache format.

The format is specified in docs/FORMAT.md; this package is its reference
implementation. The RTL (hw/) and the CUDA kernels (gpu_ref/) must reproduce
its code and scale bytes bit for bit.

Above the per-vector format: :mod:`sim_models.policy` (:class:`CachePolicy`, what a cache
stores per layer; ``CachePolicy.parse`` / ``.spec``), :mod:`sim_models.keytables` (a model's
:class:`KeyTables`), :mod:`sim_models.calibrate` (``python -m sim_models.calibrate --model SPEC
--out tables.npz``) and :mod:`sim_models.models` (the model resolver; torch and transformers
imported lazily).
"""

from .bfp import FLAG_INF, FLAG_NAN, FLAG_SAT
from .center import center
from .codec import Encoded, Trace, decode, decode_float, encode, encode_trace
from .fwht import fwht, hadamard
from .params import FORMAT_VERSION, PRESETS, FormatParams
from .keyscale import scale_keys
from .keytables import KeyTables
from .policy import CachePolicy
from .signs import sign_mask, sign_mask_int
from .transform import HeadTransform

__all__ = [
    "CachePolicy", "HeadTransform", "KeyTables", "center", "scale_keys",
    "FLAG_INF", "FLAG_NAN", "FLAG_SAT", "FORMAT_VERSION", "Encoded", "FormatParams", "PRESETS", "Trace",
    "decode", "decode_float", "encode", "encode_trace", "fwht", "hadamard", "sign_mask",
    "sign_mask_int",
]
