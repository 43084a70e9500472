"""Vector sources and expected output words for the kv_epilogue testbench.

Everything here is plain NumPy, shared by the cocotb testbench (which runs
inside the simulator process) and the pytest / ``python -m verif.sim`` drivers.

Vector sets (uint16 fp16 bit patterns, [V, N]):
    random       sim_models.testvectors.random_vectors(N, count, seed)
    adversarial  sim_models.testvectors.adversarial_vectors(N, seed) (whole set)
    real         the SmolLM2-135M K/V capture verif/data/smollm2_kv.npz (keys
                 ``k``, ``v``: uint16 [layers, tokens, kv_heads, head_dim]).
                 N == head_dim: every head vector of K then V. N == 2*head_dim:
                 adjacent heads concatenated (h, h+1) for h = 0 .. kv_heads-2.

Port encodings (docs in tb_epilogue.py): the input payload is lane k's fp16 bits
at [16k, 16k+16); the output payload is
``codes | scales << (N*b) | flags << (N*b + 8*N/G)``, in mode asym
``codes | scales << (N*b) | zeros << (N*b + 8*N/G) | flags << (N*b + 16*N/G)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim_models import FormatParams, encode
from sim_models.testvectors import adversarial_vectors, random_vectors

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "verif" / "data" / "smollm2_kv.npz"


def out_width(p: FormatParams) -> int:
    """Width of o__payload: N*b code bits + 8 bits per block (scales) [+ 8 bits
    per block (zero points, mode asym)] + 3 flag bits."""
    return flags_shift(p) + 3


def _zero_bytes(p: FormatParams) -> int:
    return int(getattr(p, "zero_bytes", 0) or 0)


def flags_shift(p: FormatParams) -> int:
    """Bit offset of the flags in o__payload: codes | scales | [zeros] | flags."""
    return p.n * p.bits + 8 * p.n_blocks + 8 * _zero_bytes(p)


# --- vector sets -------------------------------------------------------------

def real_vectors(n: int, path: Path | str = FIXTURE, limit: int | None = None) -> np.ndarray:
    """Real K/V vectors from the capture, uint16 [V, n] (see module docstring).

    ``limit`` takes an evenly strided subsample of at most ``limit`` vectors
    (deterministic), used by quick runs.

    Raises:
        FileNotFoundError: the fixture is missing.
        ValueError: unexpected keys, dtype or shape, or n not in {hd, 2*hd}.
    """
    path = Path(path)
    with np.load(path, allow_pickle=False) as z:
        if "k" not in z or "v" not in z:
            raise ValueError(f"{path}: expected keys 'k' and 'v', got {sorted(z.files)}")
        k, v = z["k"], z["v"]
    for name, a in (("k", k), ("v", v)):
        if a.dtype != np.uint16 or a.ndim != 4:
            raise ValueError(f"{path}: {name} must be uint16 [layers, tokens, heads, head_dim], "
                             f"got {a.dtype} {list(a.shape)}")
    hd, heads = k.shape[-1], k.shape[-2]
    parts = []
    for a in (k, v):
        if n == hd:
            parts.append(a.reshape(-1, hd))
        elif n == 2 * hd and heads >= 2:
            for h in range(heads - 1):
                parts.append(np.concatenate([a[..., h, :], a[..., h + 1, :]], axis=-1).reshape(-1, n))
        else:
            raise ValueError(f"real vectors: N={n} is neither head_dim={hd} nor 2*head_dim")
    out = np.ascontiguousarray(np.concatenate(parts, axis=0))
    if limit is not None and out.shape[0] > limit:
        idx = np.linspace(0, out.shape[0] - 1, limit).round().astype(np.int64)
        out = out[idx]
    return out


def fp16_to_bf16(bits: np.ndarray) -> np.ndarray:
    """fp16 bit patterns -> bf16 bit patterns of the same values (RNE; NaN stays NaN)."""
    f32 = bits.view(np.float16).astype(np.float32).view(np.uint32).astype(np.uint64)
    r = (f32 + 0x7FFF + ((f32 >> 16) & 1)) >> 16
    nan = np.isnan(bits.view(np.float16))
    return np.where(nan, 0x7FC0 | ((f32 >> 16) & 0x8000), r).astype(np.uint16)


def raw_vectors(n: int, count: int, seed: int = 0) -> np.ndarray:
    """Uniformly random 16-bit patterns, uint16 [count, n] (every special value;
    for bf16 also huge magnitudes that saturate the scale: FLAG_SAT)."""
    rng = np.random.default_rng([seed, n, 3])
    return rng.integers(0, 1 << 16, size=(count, n), dtype=np.uint16)


def get_set(name: str, n: int, count: int | None = None, seed: int = 0,
            fixture: Path | str | None = FIXTURE, dtype: str = "fp16") -> np.ndarray:
    """One vector set by name: ``random`` (count vectors), ``adversarial``, ``real``, ``raw``.

    For ``adversarial`` and ``real`` a ``count`` limits the set (``None``: all).
    For ``dtype == "bf16"`` the fp16 sets are converted to bf16 patterns of the
    same values (``raw`` stays raw bits).
    """
    if name == "random":
        out = random_vectors(n, 1000 if count is None else count, seed)
    elif name == "adversarial":
        out = adversarial_vectors(n, seed)
        out = out if count is None else out[:count]
    elif name == "real":
        out = real_vectors(n, FIXTURE if fixture is None else fixture, count)
    elif name == "raw":
        return raw_vectors(n, 1000 if count is None else count, seed)
    else:
        raise ValueError(f"unknown vector set {name!r}")
    return fp16_to_bf16(out) if dtype == "bf16" else out


# --- port words --------------------------------------------------------------

def rows_to_binstr(rows: np.ndarray, width: int) -> list[str]:
    """Little-endian words as byte rows (uint8 [V, nbytes]) -> one MSB-first
    '0'/'1' string of ``width`` characters per row (the VPI binary-string
    format of a ``width``-bit port), vectorised.

    Raises:
        ValueError: ``width`` exceeds the bits of a row.
    """
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    if rows.ndim != 2 or width > 8 * rows.shape[1]:
        raise ValueError(f"width {width} does not fit rows of shape {rows.shape}")
    bits = np.unpackbits(rows[:, ::-1], axis=1)[:, 8 * rows.shape[1] - width:]
    raw = (bits + ord("0")).astype(np.uint8).tobytes()
    return [raw[i:i + width].decode("ascii") for i in range(0, len(raw), width)]


def ints_to_binstr(words, width: int) -> list[str]:
    """Python ints -> MSB-first binary strings of ``width`` characters."""
    fmt = f"0{width}b"
    return [format(w, fmt) for w in words]


def input_binstr(bits: np.ndarray) -> list[str]:
    """uint16 [V, N] -> the i__payload binary string of each vector (lane k at
    bits [16k, 16k+16)), vectorised."""
    b = np.ascontiguousarray(bits.astype("<u2"))
    return rows_to_binstr(b.view(np.uint8).reshape(b.shape[0], -1), 16 * b.shape[1])


def input_words(bits: np.ndarray) -> list[int]:
    """uint16 [V, N] -> one Python int per vector (lane k at bits [16k, 16k+16))."""
    b = np.ascontiguousarray(bits.astype("<u2"))
    raw = b.tobytes()
    step = b.shape[1] * 2
    return [int.from_bytes(raw[i:i + step], "little") for i in range(0, len(raw), step)]


def expected_golden(bits: np.ndarray, p: FormatParams):
    """Golden output words (codes | scales | [zeros, mode asym] | flags, LSB first)
    and their flags: (list[int], uint8 [V])."""
    e = encode(bits, p)
    parts = [e.codes, e.scales] + ([e.zeros] if _zero_bytes(p) else [])
    planes = np.ascontiguousarray(np.concatenate(parts, axis=1).astype(np.uint8))
    raw = planes.tobytes()
    step = planes.shape[1]
    sh = flags_shift(p)
    flags = e.flags.astype(np.uint8)
    words = [int.from_bytes(raw[i * step:(i + 1) * step], "little") | (int(f) << sh)
             for i, f in enumerate(flags.tolist())]
    return words, flags


def split_word(w: int, p: FormatParams) -> dict:
    """Output word -> {'codes', 'scales', 'zeros': bytes, 'flags': int} (for messages)."""
    cb, nb, zb = p.code_bytes, p.n_blocks, _zero_bytes(p)
    codes = (w & ((1 << (8 * cb)) - 1)).to_bytes(cb, "little")
    scales = ((w >> (8 * cb)) & ((1 << (8 * nb)) - 1)).to_bytes(nb, "little")
    zeros = ((w >> (8 * (cb + nb))) & ((1 << (8 * zb)) - 1)).to_bytes(zb, "little")
    return {"codes": codes, "scales": scales, "zeros": zeros, "flags": (w >> flags_shift(p)) & 7}


def describe_mismatch(got: int, exp: int, p: FormatParams) -> str:
    """Short human-readable diff of two output words."""
    g, e = split_word(got, p), split_word(exp, p)
    parts = []
    if g["flags"] != e["flags"]:
        parts.append(f"flags got {g['flags']:03b} exp {e['flags']:03b}")
    sd = [j for j in range(p.n_blocks) if g["scales"][j] != e["scales"][j]]
    if sd:
        parts.append("scales differ in blocks " + ", ".join(
            f"{j}: got 0x{g['scales'][j]:02x} exp 0x{e['scales'][j]:02x}" for j in sd[:4]))
    zd = [j for j in range(len(e["zeros"])) if g["zeros"][j] != e["zeros"][j]]
    if zd:
        parts.append("zero points differ in blocks " + ", ".join(
            f"{j}: got {g['zeros'][j]} exp {e['zeros'][j]}" for j in zd[:4]))
    if g["codes"] != e["codes"]:
        from sim_models.pack import unpack_codes
        sg = p.mode != "asym"
        gc = unpack_codes(np.frombuffer(g["codes"], np.uint8)[None], p.n, p.bits, sg)[0]
        ec = unpack_codes(np.frombuffer(e["codes"], np.uint8)[None], p.n, p.bits, sg)[0]
        lanes = np.flatnonzero(gc != ec)
        parts.append(f"codes differ in {lanes.size} lanes (first: " + ", ".join(
            f"lane {int(k)} got {int(gc[k])} exp {int(ec[k])}" for k in lanes[:6]) + ")")
    if got >> (flags_shift(p) + 3):
        parts.append("bits above the flags field set")
    return "; ".join(parts) or "identical"
