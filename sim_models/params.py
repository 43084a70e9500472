"""Format parameters of the fwht-kv KV-cache format, with validation.

Every implementation (golden model, RTL generator, CUDA kernels) takes one
:class:`FormatParams` and refuses parameters it does not support. The meaning
of each field is specified in ``docs/FORMAT.md`` section 2.
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, fields

import numpy as np

#: Version of the bit-level rules defined by this package (docs/FORMAT.md, the same number):
#: version 4 encodes keys with a key front end by the folded rule (FORMAT.md 8); a vector
#: without one is encoded as in versions 2 and 3. The quantizer of each version is a preset
#: (:data:`PRESETS`).
FORMAT_VERSION = 4
#: Format versions whose files ``python -m sim_models decode`` reads (every
#: field that differs between them is stored in the file's params).
READABLE_VERSIONS = (1, 2, 3, 4)

#: Input element types, as (exponent bits, stored mantissa bits, exponent bias).
INPUT_DTYPES = {
    "fp16": (5, 10, 15),
    "bf16": (8, 7, 127),
}

#: Quantizer modes (docs/FORMAT.md 3.6; sim_models/quant.py).
QUANT_MODES = ("midtread", "midrise", "asym", "lloydmax")
#: Scale-byte encodings (sim_models/minifloat.py). ``e4m3fn`` is the OCP FP8 E4M3
#: ("fn": finite, NaN only at S.1111.111; the name ``e4m3`` is reserved so that a bare
#: "e4m3" stays an error rather than silently meaning one of the E4M3 variants).
SCALE_ENCODINGS = ("ue5m3", "e4m3fn", "e5m2", "ue4m4")
#: Block statistic the scale is derived from (sim_models/scale.py).
SCALE_RULES = ("max", "rms", "absmean")
#: Rounding of the ideal scale to a scale byte.
SCALE_ROUNDING = ("up", "nearest")
#: Range of ``scale_mult`` (units of 1/256).
SCALE_MULT_RANGE = (1, 511)

#: Default seed of the random sign flip D (docs/FORMAT.md section 3.2).
DEFAULT_SIGN_SEED = 0

N_RANGE = (8, 4096)
MANT_BITS_RANGE = (6, 16)
BITS_RANGE = (2, 4)


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


def _check_int(name: str, value) -> int:
    """``value`` as a plain int (NumPy integers accepted); TypeError for bool and non-integers."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


@dataclass(frozen=True)
class FormatParams:
    """Parameters of one configuration of the format.

    Attributes:
        n: lanes per vector N (head_dim, or several heads concatenated); a power
            of two in [8, 4096]. Default 128.
        block: lanes per scale block G; must divide ``n`` and be >= 8. Default 64.
        bits: code width b in {2, 3, 4}. Default 3.
        mode: quantizer mode (docs/FORMAT.md 3.6): ``"midrise"`` (default:
            all 2^b levels (c + 1/2) * scale, codes in [-2^(b-1), 2^(b-1)-1]),
            ``"midtread"`` (the published symmetric formula, version 1's
            default: 2^b - 1 levels c * scale), or the study modes
            ``"lloydmax"`` and ``"asym"`` (docs/ACCURACY.md).
        mant_bits: width M of the signed block-floating-point mantissas that
            enter the FWHT, sign included, in [6, 16]. Default 12 (exact for the
            largest fp16 lane).
        scale: scale-byte encoding; ``"ue5m3"`` (unsigned, 5 exponent bits,
            3 mantissa bits, bias 7), or the additive study encodings ``"e4m3fn"``,
            ``"e5m2"`` (OCP FP8; sign bit always 0) and ``"ue4m4"`` (unsigned,
            bias 7); see :mod:`sim_models.minifloat`.
        dtype: input element type, ``"fp16"`` or ``"bf16"``.
        sign_seed: seed of the random sign flip D, or ``None`` for no flip.
        scale_rule: block statistic the scale follows: ``"max"`` (max |y|, the
            default: no code ever clips), ``"rms"`` (sqrt(sum y^2 / G)) or
            ``"absmean"`` (sum |y| / G); ``asym`` needs ``"max"``.
        scale_round: ``"nearest"`` (nearest byte, ties up; default) or
            ``"up"`` (smallest byte >= the ideal scale; version 1's default).
        scale_mult: multiplier of the ideal scale in units of 1/256, in
            [1, 511], or ``None`` for the mode's default
            (:func:`sim_models.scale.default_scale_mult`).

    The modes ``asym`` and ``lloydmax``, the encodings other than ``ue5m3`` and
    the rms/absmean scale rules are format-study options (docs/ACCURACY.md);
    each implementation refuses, with a ValueError naming the field, what it
    does not implement (:func:`check_supported`; the RTL: ``hw.encoder.check_encoder_params``,
    ``hw.dequant``; the CUDA kernels: ``gpu_ref``).

    Raises:
        TypeError: a field has the wrong type.
        ValueError: a field is out of range; the message names the field.
    """

    n: int = 128
    block: int = 64
    bits: int = 3
    mode: str = "midrise"
    mant_bits: int = 12
    scale: str = "ue5m3"
    dtype: str = "fp16"
    sign_seed: int | None = DEFAULT_SIGN_SEED
    scale_rule: str = "max"
    scale_round: str = "nearest"
    scale_mult: int | None = None

    def __post_init__(self):
        for name in ("n", "block", "bits", "mant_bits", "sign_seed", "scale_mult"):
            value = getattr(self, name)
            if value is not None or name in ("n", "block", "bits", "mant_bits"):
                object.__setattr__(self, name, _check_int(name, value))
        n = _check_int("n", self.n)
        if not _is_pow2(n) or not N_RANGE[0] <= n <= N_RANGE[1]:
            raise ValueError(
                f"n (N) must be a power of two in [{N_RANGE[0]}, {N_RANGE[1]}], got {n}")
        g = _check_int("block", self.block)
        if g < 8 or g > n or n % g:
            raise ValueError(f"block (G) must divide n={n} and be >= 8, got {g}")
        b = _check_int("bits", self.bits)
        if not BITS_RANGE[0] <= b <= BITS_RANGE[1]:
            raise ValueError(f"bits (b) must be in {{2, 3, 4}}, got {b}")
        m = _check_int("mant_bits", self.mant_bits)
        if not MANT_BITS_RANGE[0] <= m <= MANT_BITS_RANGE[1]:
            raise ValueError(
                f"mant_bits (M) must be in [{MANT_BITS_RANGE[0]}, {MANT_BITS_RANGE[1]}], got {m}")
        for name, value, allowed in (("mode", self.mode, QUANT_MODES),
                                     ("scale", self.scale, SCALE_ENCODINGS),
                                     ("dtype", self.dtype, tuple(INPUT_DTYPES)),
                                     ("scale_rule", self.scale_rule, SCALE_RULES),
                                     ("scale_round", self.scale_round, SCALE_ROUNDING)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.sign_seed is not None:
            s = _check_int("sign_seed", self.sign_seed)
            if not 0 <= s < 2**64:
                raise ValueError(f"sign_seed must be in [0, 2^64) or None, got {s}")
        if self.scale_mult is not None:
            k = _check_int("scale_mult", self.scale_mult)
            if not SCALE_MULT_RANGE[0] <= k <= SCALE_MULT_RANGE[1]:
                raise ValueError(f"scale_mult must be in [{SCALE_MULT_RANGE[0]}, "
                                 f"{SCALE_MULT_RANGE[1]}] (units of 1/256) or None, got {k}")
        if self.mode == "asym" and self.scale_rule != "max":
            raise ValueError(f"scale_rule must be 'max' for mode 'asym' (its scale spans the "
                             f"block's range), got {self.scale_rule!r}")

    # Derived quantities -------------------------------------------------------
    @property
    def log2n(self) -> int:
        """Number of butterfly stages, log2(N)."""
        return self.n.bit_length() - 1

    @property
    def n_blocks(self) -> int:
        """Scale blocks per vector, N / G."""
        return self.n // self.block

    @property
    def qmax(self) -> int:
        """Largest code magnitude of the mid-tread quantizer, 2^(b-1) - 1."""
        return (1 << (self.bits - 1)) - 1

    @property
    def quantizer_preset(self) -> str | None:
        """Name of the first (oldest) :data:`PRESETS` entry whose quantizer fields ``self`` has,
        or None (``"v2"`` for version 3, which keeps version 2's quantizer)."""
        for name, quantizer in PRESETS.items():
            if all(getattr(self, k) == v for k, v in quantizer.items()):
                return name
        return None

    @property
    def zero_bytes(self) -> int:
        """Bytes of the zero-point plane per vector: N/G for ``asym``, else 0."""
        return self.n_blocks if self.mode == "asym" else 0

    @property
    def code_bytes(self) -> int:
        """Bytes of the code plane per vector, N*b/8."""
        return self.n * self.bits // 8

    @property
    def bytes_per_vector(self) -> int:
        """Stored bytes per vector: code plane, one scale byte per block, zero points (asym)."""
        return self.code_bytes + self.n_blocks + self.zero_bytes

    @property
    def bits_per_element(self) -> float:
        """Average stored bits per element, b + 8/G (b + 16/G for ``asym``)."""
        return 8 * self.bytes_per_vector / self.n

    @property
    def fwht_width(self) -> int:
        """Signed width of the FWHT output, M + log2(N) (one bit per stage)."""
        return self.mant_bits + self.log2n

    @property
    def in_format(self) -> tuple[int, int, int]:
        """(exponent bits, stored mantissa bits, bias) of the input type."""
        return INPUT_DTYPES[self.dtype]

    def to_dict(self) -> dict:
        """Plain dict of the fields plus the format version (for manifests)."""
        d = asdict(self)
        d["format_version"] = FORMAT_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict) -> FormatParams:
        """Inverse of :meth:`to_dict`: ``FormatParams.from_dict(p.to_dict()) == p``.

        Args:
            d: field -> value; ``format_version``, if present, must be one of
                :data:`READABLE_VERSIONS`. Missing fields take the values of that version's
                preset (a version-1 dict without ``scale_round`` means rounding up), else the
                defaults.

        Raises:
            TypeError: ``d`` is not a dict, or a field has the wrong type.
            ValueError: an unreadable ``format_version``, an unknown field, or a field
                out of range (the message names it).
        """
        if not isinstance(d, dict):
            raise TypeError(f"params must be a dict, got {type(d).__name__}")
        d = dict(d)
        if "format_version" in d:
            version = d.pop("format_version")
            if type(version) is not int or version not in READABLE_VERSIONS:
                raise ValueError(f"format_version {version!r} is not supported "
                                 f"(readable versions: {READABLE_VERSIONS})")
        else:
            version = None
        unknown = sorted(set(d) - set(_FIELDS))
        if unknown:
            raise ValueError(f"unknown FormatParams field(s) {unknown}; known: {list(_FIELDS)}")
        if version is not None and f"v{version}" in PRESETS:
            return cls.preset(f"v{version}", **d)
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides) -> FormatParams:
        """The quantizer of preset ``name`` (:data:`PRESETS`), other fields default.

        Args:
            name: ``"v1"`` (format version 1: midtread, scale rounded up), ``"v2"``
                (format version 2), ``"v3"`` (format version 3: version 2's per-vector
                quantizer; its key front end is :class:`sim_models.KeyTables`) or ``"v4"``
                (format version 4, the default: the same quantizer; keys with a key front end
                take the folded rule).
            overrides: any field; a quantizer field overrides the preset's value.

        Raises:
            ValueError: unknown ``name``, or a field out of range (names it).
            TypeError: a field has the wrong type.
        """
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name], **overrides})


_FIELDS = tuple(f.name for f in fields(FormatParams))

#: Named quantizers (the *per-vector quantizer* preset namespace): format version -> the quantizer
#: fields (mode, scale encoding, rule, rounding, multiplier) of that version's per-vector format
#: (docs/FORMAT.md 2); :meth:`FormatParams.preset`. ``"v3"`` here is version 3's per-vector
#: quantizer, which is version 2's; the cache policy of version 3 (key front end, sinks) is
#: :data:`sim_models.policy.POLICY_PRESETS` ``"v3"``, and rtl_gen's configuration names
#: (``enc_v2_...``) name RTL builds by the quantizer preset they implement.
PRESETS = {
    "v1": {"mode": "midtread", "scale": "ue5m3", "scale_rule": "max", "scale_round": "up",
           "scale_mult": None},
    "v2": {"mode": "midrise", "scale": "ue5m3", "scale_rule": "max", "scale_round": "nearest",
           "scale_mult": None},
    # version 3 keeps version 2's per-vector encoding; it adds the key front end (docs/FORMAT.md 8)
    "v3": {"mode": "midrise", "scale": "ue5m3", "scale_rule": "max", "scale_round": "nearest",
           "scale_mult": None},
    # version 4 keeps the quantizer; keys with a key front end take the folded rule (FORMAT.md 8)
    "v4": {"mode": "midrise", "scale": "ue5m3", "scale_rule": "max", "scale_round": "nearest",
           "scale_mult": None},
}


def check_supported(p, table: dict, implementer: str) -> FormatParams:
    """Refuse parameters an implementation does not build (docs/FORMAT.md 2).

    Args:
        p: the parameters to check.
        table: field -> tuple of the values ``implementer`` supports (fields not
            listed: every value).
        implementer: named in the message (e.g. "RTL write path").

    Returns:
        ``p``.

    Raises:
        TypeError: ``p`` is not a FormatParams.
        ValueError: a field outside ``table``; the message names the field.
    """
    if not isinstance(p, FormatParams):
        raise TypeError(f"params must be a sim_models.FormatParams, got {type(p).__name__}")
    for field, allowed in table.items():
        value = getattr(p, field)
        if value not in allowed:
            raise ValueError(f"{field}={value!r} is not implemented by the {implementer} "
                             f"(supported: {', '.join(repr(a) for a in allowed)})")
    return p
