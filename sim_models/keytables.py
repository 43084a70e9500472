"""Per-model key front-end tables: centering vectors mu and power-of-two key scales.

One concept: the constants of the key front end (docs/FORMAT.md 8) for one model, one
entry per (layer, kv head): mu (fp16 per channel, sim_models/center.py) and the integer
exponents e of the key scales s = 2^e (sim_models/keyscale.py). Like weights, they are
fixed per model and calibrated once (``python -m sim_models.calibrate --model M --out
tables.npz``, :mod:`sim_models.calibrate`); the per-token bytes of a key depend only on the
key and these tables (streaming-safe).

The exponents are query-aware (docs/DECISIONS.md, "Key front end"; docs/ACCURACY.md): per channel
``e_i = clip(round(l_i - mean_j l_j), +-LOG2_S_MAX)`` with ``l_i = log2(E q_i^2 / E (k_i - mu_i)^2) / 4``
(centred over the head's channels, then rounded and clipped); this minimises the expected logit error
E (q . dk)^2 for a rotation-isotropic key error dk (queries averaged over the kv head's
query heads).

The file (``.npz``) holds ``model_id``, ``shape`` = (layers, kv heads, head_dim), ``mu``
(float16) and ``log2_s`` (int8); :meth:`KeyTables.load` checks the model id and shape
against what the caller serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .codec import Encoded, encode_folded
from .keyscale import LOG2_S_RANGE, front_table, key_front, pow2_scales
from .params import FormatParams

#: Largest |e| of a calibrated key-scale exponent (the study's range; the golden model and
#: the RTL accept :data:`sim_models.keyscale.LOG2_S_RANGE`, the CUDA kernels
#: ``gpu_ref.backend.CUDA.key_scale_log2``).
LOG2_S_MAX = 4


def qaware_log2_scales(k_energy: np.ndarray, q_energy: np.ndarray,
                       log2_max: int = LOG2_S_MAX, rounded: bool = True) -> np.ndarray:
    """Query-aware key-scale exponents (module docstring).

    Args:
        k_energy: float [L, H, D], E (k - mu)^2 per key channel.
        q_energy: float [L, Hq, D], E q^2 per query channel, Hq a multiple of H (GQA).
        log2_max: clip of |e| (>= 0).
        rounded: round to integers (powers of two; the format's rule) or keep the real
            exponents (the study's fp16-scale variant).

    Returns:
        int8 [L, H, D] (rounded) or float64 [L, H, D].

    Raises:
        ValueError: shapes that do not match, or log2_max out of [0, 14].
    """
    a = np.asarray(k_energy, dtype=np.float64)
    b = np.asarray(q_energy, dtype=np.float64)
    if a.ndim != 3 or b.ndim != 3 or b.shape[0] != a.shape[0] or b.shape[2] != a.shape[2] \
            or b.shape[1] % a.shape[1]:
        raise ValueError(f"k_energy [L, H, D] and q_energy [L, Hq, D] (Hq a multiple of H) "
                         f"expected, got {a.shape} and {b.shape}")
    if isinstance(log2_max, bool) or not isinstance(log2_max, int) or not 0 <= log2_max <= 14:
        raise ValueError(f"log2_max must be an int in [0, 14], got {log2_max!r}")
    b = b.reshape(a.shape[0], a.shape[1], -1, a.shape[2]).mean(axis=2)
    e = 0.25 * np.log2(np.maximum(b, 1e-12) / np.maximum(a, 1e-12))
    e = e - e.mean(axis=-1, keepdims=True)
    if not rounded:
        return np.clip(e, -log2_max, log2_max)
    return np.clip(np.round(e), -log2_max, log2_max).astype(np.int8)


@dataclass(frozen=True, eq=False)
class KeyTables:
    """Attributes:
        model_id: the model these tables belong to (checked on load).
        mu: float16 [L, H, D] centering vectors (finite).
        log2_s: int8 [L, H, D] key-scale exponents in [-14, 15], or None (no scaling).

    Raises:
        TypeError, ValueError: wrong dtypes, shapes or ranges (the message names the field).
    """

    model_id: str
    mu: np.ndarray
    log2_s: np.ndarray | None = None

    def __post_init__(self):
        if not isinstance(self.model_id, str) or not self.model_id:
            raise ValueError(f"model_id must be a non-empty string, got {self.model_id!r}")
        if not isinstance(self.mu, np.ndarray) or self.mu.dtype != np.float16 or self.mu.ndim != 3:
            raise TypeError(f"mu must be a float16 array [layers, kv_heads, head_dim], got "
                            f"{getattr(self.mu, 'dtype', type(self.mu).__name__)} "
                            f"{getattr(self.mu, 'shape', '')}")
        if not np.isfinite(self.mu).all():
            raise ValueError("mu must be finite")
        if self.log2_s is not None:
            e = self.log2_s
            if not isinstance(e, np.ndarray) or e.dtype != np.int8 or e.shape != self.mu.shape:
                raise TypeError(f"log2_s must be an int8 array of mu's shape {self.mu.shape}, got "
                                f"{getattr(e, 'dtype', type(e).__name__)} {getattr(e, 'shape', '')}")
            if e.min() < LOG2_S_RANGE[0] or e.max() > LOG2_S_RANGE[1]:
                raise ValueError(f"log2_s must be in {list(LOG2_S_RANGE)} (fp16-normal powers of two)")

    @property
    def shape(self) -> tuple[int, int, int]:
        """(layers, kv heads, head_dim)."""
        return tuple(int(v) for v in self.mu.shape)

    def scales(self) -> np.ndarray | None:
        """Key scales s = 2^e, float16 [L, H, D] (keys stored as k * s, queries read as q / s)."""
        return None if self.log2_s is None else pow2_scales(self.log2_s)

    def scaled_mu(self) -> np.ndarray:
        """The centering table of the front end, ``RN16(mu * s)`` as fp16 bit patterns (uint16
        [L, H, D]); mu itself when there are no scales. The RTL and CUDA front ends load this."""
        mu = self.mu.view(np.uint16)
        if self.log2_s is None:
            return mu.copy()
        d = self.shape[2]
        return front_table(mu, self.log2_s, FormatParams(n=d, block=min(64, d)))

    def _entry(self, layer: int, head: int):
        L, H, D = self.shape
        if not (0 <= layer < L and 0 <= head < H):
            raise IndexError(f"(layer, head) = ({layer}, {head}) outside the tables' [{L}, {H}]")
        e = np.zeros(D, np.int8) if self.log2_s is None else self.log2_s[layer, head]
        return self.scaled_mu()[layer, head], e

    def encode(self, k: np.ndarray, layer: int, head: int, p: FormatParams | None = None,
               t=None) -> Encoded:
        """Packed keys of (layer, head) (FORMAT.md 8): the folded key front end with this entry's
        tables, :func:`sim_models.codec.encode_folded` (``k 2^e - RN16(mu 2^e)`` inside block
        floating point, no fp16 rounding per lane).

        Args:
            k: fp16 keys, float16 or uint16 bits [..., D].
            layer, head: table entry.
            p: format parameters (``dtype`` fp16; ``n`` divides D; default n = D).
            t: transform tables of (layer, head) or None.

        Returns:
            :class:`sim_models.Encoded` with leading axes ``k.shape[:-1] + (D / n,)``.

        Raises:
            IndexError: layer / head out of range. ValueError: p.dtype not fp16, or the last
            axis of k not D.
        """
        D = self.shape[2]
        p = p or FormatParams(n=D, block=min(64, D))
        if p.dtype != "fp16":
            raise ValueError(f"the key front end is defined for fp16 keys, got dtype={p.dtype!r}")
        if not isinstance(k, np.ndarray) or k.shape[-1:] != (D,) or D % p.n:
            raise ValueError(f"k must be [..., D={D}] with D a multiple of p.n={p.n}, got "
                             f"{list(np.shape(k))}")
        mu_s, e = self._entry(layer, head)
        blocks = k.reshape(*k.shape[:-1], D // p.n, p.n)
        return encode_folded(blocks, mu_s.reshape(D // p.n, p.n), e.reshape(D // p.n, p.n), p, t)

    def front_end(self, k: np.ndarray, layer: int, head: int, p: FormatParams | None = None) -> np.ndarray:
        """Keys of (layer, head) in the key front end's domain as 16-bit rows (sinks, the recent
        ring): ``RNE(RN16(k s) - RN16(mu s))`` (FORMAT.md 8), :func:`sim_models.keyscale.key_front`
        with this entry's tables. Packed keys are encoded by :meth:`encode`.

        Args:
            k: fp16 keys, float16 or uint16 bits [..., D].
            layer, head: table entry.
            p: format parameters (``dtype`` fp16; ``n`` = D).

        Returns:
            uint16 fp16 bit patterns, k's shape.

        Raises:
            IndexError: layer / head out of range. ValueError: p.dtype not fp16.
        """
        D = self.shape[2]
        mu_s, e = self._entry(layer, head)
        p = p or FormatParams(n=D, block=min(64, D))
        if p.dtype != "fp16":
            raise ValueError(f"the key front end is defined for fp16 keys, got dtype={p.dtype!r}")
        return key_front(k, mu_s, e, p)

    # ---------------------------------------------------------------- files
    @classmethod
    def from_calibration(cls, calib: dict, model_id: str, key_scales: bool = True) -> KeyTables:
        """Tables from a calibration run's statistics: ``mu`` (float16 [L, H, D]) and, with
        ``key_scales``, ``k_energy`` / ``q_energy`` (:func:`qaware_log2_scales`)."""
        mu = np.asarray(calib["mu"]).astype(np.float16)
        e = qaware_log2_scales(calib["k_energy"], calib["q_energy"]) if key_scales else None
        return cls(model_id, mu, e)

    def save(self, path) -> Path:
        """Write the ``.npz`` file (module docstring); returns its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {"model_id": np.array(self.model_id), "shape": np.array(self.shape, np.int64),
                  "mu": self.mu}
        if self.log2_s is not None:
            arrays["log2_s"] = self.log2_s
        with open(path, "wb") as f:
            np.savez(f, **arrays)
        return path

    @classmethod
    def load(cls, path, model_id: str | None = None, shape=None) -> KeyTables:
        """Read a tables file, checking it against the model served.

        Args:
            path: the ``.npz`` written by :meth:`save`.
            model_id: expected model id, or None (not checked).
            shape: expected (layers, kv heads, head_dim), or None (not checked).

        Raises:
            FileNotFoundError: no such file. ValueError: not a tables file, or written for
            another model id / shape (the message names both).
        """
        path = Path(path)
        try:
            z = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise
        except (OSError, ValueError, EOFError) as err:
            raise ValueError(f"{path}: not a key-tables .npz file ({err}); python -m "
                             f"sim_models.calibrate writes one") from None
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError(f"{path}: not a key-tables .npz file (a single .npy array); python -m "
                             f"sim_models.calibrate writes one")
        with z:
            if "k_energy" in z.files:
                raise ValueError(f"{path}: a calibration statistics file, not key tables; the tables are "
                                 f"{path.with_suffix('.keytables.npz').name} (KeyTables.from_calibration)")
            if not {"model_id", "shape", "mu"} <= set(z.files):
                raise ValueError(f"{path}: not a key-tables file (needs model_id, shape, mu; has "
                                 f"{sorted(z.files)})")
            t = cls(str(z["model_id"]), z["mu"], z["log2_s"] if "log2_s" in z.files else None)
            stored = tuple(int(v) for v in z["shape"])
        if stored != t.shape:
            raise ValueError(f"{path}: shape {stored} does not match mu {t.shape}")
        if model_id is not None and t.model_id != model_id:
            raise ValueError(f"{path}: tables of model {t.model_id!r}, not of {model_id!r}")
        if shape is not None and tuple(shape) != t.shape:
            raise ValueError(f"{path}: tables of shape {t.shape} (layers, kv heads, head_dim), "
                             f"the model has {tuple(shape)}")
        return t
