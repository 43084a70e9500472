"""What the CUDA kernels serve, declared once (in the manner of vLLM's attention backends).

:data:`CUDA` lists every capability of the write and decode kernels: K/V widths, head dims
(one vector per head, ``n = head_dim``), block sizes, quantizers, the most fp16 sink tokens, the
key-scale exponent range, page sizes and 16-bit types. :func:`supports` checks a
:class:`sim_models.CachePolicy` for a head dim and dtype against it and returns the named
reasons it cannot be served (empty: served); :func:`check` raises them. :class:`gpu_ref.KVCache`,
:func:`gpu_ref.plan` and the transformers integration (:mod:`gpu_ref.hf`) check through here and
nowhere else. Importing this module needs neither CuPy nor a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim_models.keyscale import LOG2_S_RANGE
from sim_models.params import FormatParams
from sim_models.policy import CachePolicy

from ._build import SUPPORTED_QUANTIZER

#: format fields K and V must share (they may differ in ``bits`` only)
SHARED_FIELDS = ("n", "block", "mode", "dtype", "sign_seed", "mant_bits", "scale", "scale_round")


def _exponent_range(lo: int, hi: int) -> tuple[int, int]:
    """Exponents e of key scales s = 2^e with s and the query factor 1/s both normal fp16."""
    return max(lo, -hi), min(hi, -lo)


@dataclass(frozen=True)
class Backend:
    """Capabilities of one kernel backend (all tuples of accepted values)."""

    name: str
    bits: tuple
    head_dims: tuple
    blocks: tuple
    quantizer: dict
    max_sinks: int
    #: inclusive range of key-scale exponents e (s = 2^e)
    key_scale_log2: tuple
    #: key scale kinds (:data:`sim_models.policy.KEY_SCALES`) served
    key_scales: tuple
    dtypes: tuple
    #: 16-bit types a key front end (centering, key scales) is served in (docs/FORMAT.md 8)
    key_front_dtypes: tuple
    #: page sizes below one 64-token tile; larger pages are powers of two that are multiples of ``tile``
    small_pages: tuple
    tile: int

    def format_reasons(self, f: FormatParams, what: str) -> list[str]:
        """Named reasons the kernels cannot store format ``f`` (``what``: "k", "v", "layer 3 k", ...)."""
        out = []
        if f.bits not in self.bits:
            out.append(f"{what}.bits={f.bits}: the kernels store {self.bits}-bit codes")
        if f.n not in self.head_dims:
            out.append(f"{what}.n={f.n} (head_dim): the kernels serve head dims {self.head_dims}")
        if f.block not in self.blocks or f.block > f.n:
            out.append(f"{what}.block={f.block}: the kernels serve blocks {self.blocks} (block <= n)")
        for field, allowed in self.quantizer.items():
            if getattr(f, field) not in allowed:
                out.append(f"{what}.{field}={getattr(f, field)!r}: the kernels serve {allowed}")
        return out

    def pair_reasons(self, kf: FormatParams, vf: FormatParams, what: str = "") -> list[str]:
        """Named reasons a K/V format pair cannot be served together (both checked, then shared fields)."""
        out = self.format_reasons(kf, f"{what}k") + self.format_reasons(vf, f"{what}v")
        for field in SHARED_FIELDS:
            if getattr(kf, field) != getattr(vf, field):
                out.append(f"{what}k.{field} != {what}v.{field} ({getattr(kf, field)!r} != {getattr(vf, field)!r}): "
                           f"K and V formats may differ only in bits")
        return out

    def sinks_reasons(self, sinks: int, recent: int = 0) -> list[str]:
        """The decode kernel's 16-bit side rows per sequence: ``sinks`` sink tokens and the ``recent`` ring."""
        if sinks + recent > self.max_sinks:
            what = f"sinks={sinks} + recent={recent}" if recent else f"sinks={sinks}"
            return [f"{what}: the decode kernel reads at most {self.max_sinks} 16-bit side rows (sink tokens "
                    f"and the recent ring)"]
        return []

    def page_size_ok(self, page_size: int) -> bool:
        pg = int(page_size)
        return pg > 0 and not pg & (pg - 1) and (pg in self.small_pages or pg % self.tile == 0)

    def log2_scale_reasons(self, log2_s) -> list[str]:
        """Named reason when key-scale exponents fall outside :attr:`key_scale_log2`."""
        e = np.asarray(log2_s)
        lo, hi = self.key_scale_log2
        if e.size and (e.min() < lo or e.max() > hi):
            return [f"key scales: exponents in [{int(e.min())}, {int(e.max())}], the kernels serve 2^e with e in "
                    f"[{lo}, {hi}]"]
        return []


#: The CUDA kernels of this package (kv_encode.cu, kv_decode_attn.cu).
CUDA = Backend(
    name="cuda",
    bits=(3, 4),
    head_dims=(64, 128, 256),
    blocks=(16, 32, 64),
    quantizer=dict(SUPPORTED_QUANTIZER),
    max_sinks=64,
    key_scale_log2=_exponent_range(*LOG2_S_RANGE),
    key_scales=("pow2",),
    dtypes=("fp16", "bf16"),
    key_front_dtypes=("fp16",),
    small_pages=(16, 32),
    tile=64,
)


def supports(policy: CachePolicy, head_dim: int, dtype: str = "fp16", n_layers: int = 1,
             backend: Backend = CUDA) -> tuple[str, ...]:
    """Why ``backend`` cannot serve ``policy`` for this head dim and 16-bit type: a tuple of
    reasons, each naming the field (empty: served).

    Every format of the policy (defaults and the overrides of layers < ``n_layers``) is first
    fitted to one vector per head (:meth:`sim_models.CachePolicy.fit`); a layer keeps both kinds
    packed or both 16-bit.

    Raises:
        TypeError: ``policy`` not a CachePolicy.
    """
    if not isinstance(policy, CachePolicy):
        raise TypeError(f"policy must be a sim_models.CachePolicy, got {type(policy).__name__}")
    out: list[str] = []
    if dtype not in backend.dtypes:
        return (f"dtype={dtype!r}: the kernels serve {backend.dtypes}",)
    try:
        fitted = policy.fit(head_dim, dtype)
    except ValueError as err:
        return (f"head_dim={head_dim}: {err}",)
    layers = sorted({0, *(l for l, _ in policy.layer_k + policy.layer_v if l < n_layers)})
    packed = False
    for l in layers:
        kf, vf = fitted.format_for(l, "k"), fitted.format_for(l, "v")
        what = "" if l == 0 and not (policy.layer_k or policy.layer_v) else f"layer {l} "
        if kf is None and vf is None:
            continue
        packed = True
        if kf is None or vf is None:
            out.append(f"{what}k/v: both packed or both 16-bit (got k={kf and kf.bits} bits, v={vf and vf.bits} bits)")
            continue
        out += [r for r in backend.pair_reasons(kf, vf, what) if r not in out]
    if not packed:
        return tuple(out)
    out += backend.sinks_reasons(policy.sinks, policy.recent)
    if policy.key_scale is not None and policy.key_scale not in backend.key_scales:
        out.append(f"key_scale={policy.key_scale!r}: the kernels serve key scales {backend.key_scales}")
    if policy.key_signs:
        out.append("key_signs: calibrated per-head sign flips are not applied by the kernels")
    if policy.key_rot:
        out.append("key_rot: calibrated per-head rotations are not applied by the kernels")
    if (policy.center_keys or policy.key_scale) and dtype not in backend.key_front_dtypes:
        out.append(f"dtype={dtype!r}: the key front end (center_keys / key_scale) is served in "
                   f"{backend.key_front_dtypes} (docs/FORMAT.md 8)")
    return tuple(out)


def check(policy: CachePolicy, head_dim: int, dtype: str = "fp16", n_layers: int = 1,
          backend: Backend = CUDA) -> None:
    """:func:`supports`, raising ``ValueError`` with every reason when there is one."""
    reasons = supports(policy, head_dim, dtype, n_layers, backend)
    if reasons:
        raise ValueError(f"backend {backend.name!r} cannot serve policy: " + "; ".join(reasons))
