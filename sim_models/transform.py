"""Per-(layer, kv head) transform tables: a calibrated sign flip and post-FWHT 4x4 rotations.

The format's transform is ``y = H D x`` (D: the fixed sign flip of ``p.sign_seed``, H:
the integer FWHT). A :class:`HeadTransform` replaces it, for the vectors of one
(layer, kv head), by ``y = B H D' x``:

* ``signs``: uint8 [N], the sign flip D' (1 = negate lane), chosen per (layer, kv head)
  on calibration text instead of the one seeded mask (``None``: ``p.sign_seed``'s mask);
* ``rot``: int16 [N/4, 4, 4], B: block-diagonal 4x4 rotations applied to the FWHT output
  in groups of 4 consecutive lanes, in fixed point with :data:`ROT_FRAC` fractional bits
  (``None``: B = I). Exact rule (the encoder): ``y'_i = rnd(sum_j R[i, j] y_j / 2^ROT_FRAC)``,
  rnd = round half away from zero, on the integer FWHT output (same unit 2^u); the block
  scale and codes are then taken on y'. |y'| <= 2 max|y| (a row of a 4x4 rotation has
  L1 norm <= 2), so the quantizer input is one bit wider than the FWHT output.
  Read path: ``x_hat = D' H (R^T yhat / 2^ROT_FRAC) / N``; the attention kernel instead
  rotates the query, ``q~ = R H D' q / 2^ROT_FRAC``, and uses ``q~ . yhat / N`` (the same
  number: R^T in the read path is the transpose of the stored integers, not an inverse).

Both are model constants from the calibration file (like the centering vector mu): N bits
(signs) and 16 * N / 4 * 2 bytes (rot) per (layer, kv head), not part of the per-token
cache. In hardware: the sign mask becomes a loadable N-bit register per (layer, kv head)
instead of a constant; B is 4 multiply-accumulates per lane (16 int16 x (M + log2 N)-bit
products per 4 lanes) after the butterfly, and the same 4x4 product on the query in the
decode kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Fractional bits of the fixed-point rotation entries (|entry| <= 1 fits int16).
ROT_FRAC = 14
#: Lanes per rotation block.
ROT_LANES = 4


@dataclass(frozen=True, eq=False)
class HeadTransform:
    """Transform tables of one (layer, kv head) (module docstring).

    Attributes:
        signs: uint8 [N] in {0, 1}, or None.
        rot: int16 [N/4, 4, 4], or None.

    Raises:
        TypeError, ValueError: wrong dtype, shape or values (the message names the field).
    """

    signs: np.ndarray | None = None
    rot: np.ndarray | None = None

    def __post_init__(self):
        if self.signs is not None:
            s = self.signs
            if not isinstance(s, np.ndarray) or s.dtype != np.uint8 or s.ndim != 1:
                raise TypeError("signs must be a uint8 numpy array [N]")
            if not np.isin(s, (0, 1)).all():
                raise ValueError("signs must hold only 0 and 1")
        if self.rot is not None:
            r = self.rot
            if not isinstance(r, np.ndarray) or r.dtype != np.int16 or r.ndim != 3 \
                    or r.shape[1:] != (ROT_LANES, ROT_LANES):
                raise TypeError("rot must be an int16 numpy array [N/4, 4, 4]")
            if np.abs(r.astype(np.int64)).max() > (1 << ROT_FRAC):
                raise ValueError(f"rot entries must be in [-2^{ROT_FRAC}, 2^{ROT_FRAC}]")

    def check(self, n: int) -> "HeadTransform":
        """``self`` if its tables fit N = ``n`` lanes; ValueError naming the field otherwise."""
        if self.signs is not None and self.signs.shape != (n,):
            raise ValueError(f"signs must have shape [{n}], got {list(self.signs.shape)}")
        if self.rot is not None and self.rot.shape[0] * ROT_LANES != n:
            raise ValueError(f"rot must have shape [{n // ROT_LANES}, 4, 4], got "
                             f"{list(self.rot.shape)}")
        return self


def _rnd_shift(v: np.ndarray, sh: int) -> np.ndarray:
    """round(v / 2^sh), half away from zero, exact on int64."""
    mag = (np.abs(v) + (1 << (sh - 1))) >> sh
    return np.where(v < 0, -mag, mag)


def rotate_forward(y: np.ndarray, rot: np.ndarray) -> np.ndarray:
    """Encoder rule: int64 [V, N] FWHT output -> int64 [V, N] ``rnd(R y / 2^ROT_FRAC)``."""
    v, n = y.shape
    yb = y.reshape(v, n // ROT_LANES, ROT_LANES)
    acc = np.einsum("bij,vbj->vbi", rot.astype(np.int64), yb)
    return _rnd_shift(acc, ROT_FRAC).reshape(v, n)


def rotate_back(yhat: np.ndarray, rot: np.ndarray) -> np.ndarray:
    """Read path: float64 [V, N] -> ``R^T yhat / 2^ROT_FRAC`` (exact in float64)."""
    v, n = yhat.shape
    yb = yhat.reshape(v, n // ROT_LANES, ROT_LANES)
    out = np.einsum("bji,vbj->vbi", rot.astype(np.float64), yb)
    return np.ldexp(out, -ROT_FRAC).reshape(v, n)


def fixed_rotation(m: np.ndarray) -> np.ndarray:
    """float [..., 4, 4] rotation(s) -> int16 fixed point (round to nearest)."""
    return np.clip(np.rint(np.ldexp(m, ROT_FRAC)), -(1 << ROT_FRAC), 1 << ROT_FRAC).astype(np.int16)


def random_rotations(blocks: int, rng: np.random.Generator) -> np.ndarray:
    """``blocks`` Haar-random SO(4) matrices, float64 [blocks, 4, 4]."""
    a = rng.standard_normal((blocks, ROT_LANES, ROT_LANES))
    q, r = np.linalg.qr(a)
    q = q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]
    det = np.linalg.det(q)
    q[det < 0, :, 0] *= -1
    return q


def identity_rotation(n: int) -> np.ndarray:
    """B = I as a ``rot`` table for N = ``n`` lanes."""
    return fixed_rotation(np.broadcast_to(np.eye(ROT_LANES), (n // ROT_LANES, 4, 4)))
