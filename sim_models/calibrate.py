"""Calibration of a model's key tables (:class:`sim_models.KeyTables`): the command and its steps.

    python -m sim_models.calibrate --model SPEC --out tables.npz [--text PATH] [--context 2048]

``SPEC`` is a model spec of :func:`sim_models.models.resolve` (an alias such as ``smollm2-135m``,
a ``.gguf`` file or a Hugging Face folder). The tables are what the ``v4`` and ``v3`` cache
policies read (docs/FORMAT.md 8): per (layer, kv head) the centering vector mu and the power-of-two
key-scale exponents. ``PackedCache(config, "v4", ..., tables=KeyTables.load("tables.npz"))`` and
``python -m gpu_ref.generate --tables tables.npz`` serve them.

Method: the model reads :data:`CALIB_WINDOWS` consecutive windows of ``context`` tokens from the
start of the calibration text (:class:`TokenizedText`; default text: the git release notes,
:data:`TEXT_DIR`, in version order, the accuracy study's text). Every attention layer's post-RoPE
keys and queries (as the model caches and reads them) are accumulated in float64 over the
positions ``>= MU_SKIP`` (the first positions are sinks): ``mu`` = the mean key rounded to fp16,
``k_energy`` = E (k - mu)^2 and ``q_energy`` = E q^2 per channel; the exponents are
:func:`sim_models.keytables.qaware_log2_scales` of the two energies. The accuracy study
(``python -m bench.accuracy``) computes its calibration with the same functions.

torch and transformers are imported only by the steps that run the model.
"""

from __future__ import annotations

import argparse
import bisect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .keytables import KeyTables

#: Calibration positions excluded from the statistics (attention sinks) at the start of every window.
MU_SKIP = 4
#: Consecutive calibration windows from the start of the text.
CALIB_WINDOWS = 2
#: Tokens per calibration window.
CONTEXT = 2048
#: The default calibration text: every ``*.txt`` here, in version order, joined by :data:`TEXT_SEPARATOR`.
TEXT_DIR = Path("/usr/share/doc/git/RelNotes")
TEXT_SEPARATOR = "\n\n"
#: transformers attention implementation the capture registers.
CAPTURE_NAME = "fwht_kv_calibrate"


# ---------------------------------------------------------------------------------------------- text
def _version_key(p: Path) -> tuple:
    """Sort key: '2.10.0.txt' -> (2, 10, 0); non-numeric parts sort after."""
    return tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in re.split(r"[.\-]", p.stem))


def text_files(path=None) -> list[Path]:
    """The files :func:`read_text` joins, in order: the file ``path``, or every ``*.txt`` of the folder
    ``path`` in version order (default folder :data:`TEXT_DIR`).

    Raises:
        FileNotFoundError: no such file, or a folder without ``*.txt`` files.
    """
    p = TEXT_DIR if path is None else Path(path)
    if p.is_file():
        return [p]
    files = sorted(p.glob("*.txt"), key=_version_key) if p.is_dir() else []
    if not files:
        raise FileNotFoundError(f"text: no text file and no *.txt files at {p}")
    return files


def read_text(path=None) -> str:
    """The calibration text: :func:`text_files` of ``path`` read as UTF-8 and joined by
    :data:`TEXT_SEPARATOR`.

    Raises:
        FileNotFoundError: no such file, or a folder without ``*.txt`` files.
    """
    return TEXT_SEPARATOR.join(f.read_text(encoding="utf-8", errors="replace") for f in text_files(path))


@dataclass(frozen=True)
class Window:
    """Attributes:
        name: label ("@<char offset>").
        char_start: character offset of the window's first text token.
        tokens: int64 [context] (BOS first when the tokenizer adds one).
        char_end: character offset just past the window's last token.
    """

    name: str
    char_start: int
    tokens: np.ndarray
    char_end: int


class TokenizedText:
    """A text tokenized once, with character offsets, by ``tokenizer``; windows are defined in the
    text (the first line start at or after a character offset), so every model reads the same text."""

    def __init__(self, text: str, tokenizer):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        self.text = text
        self.ids = np.asarray(enc["input_ids"], dtype=np.int64)
        self.starts = [int(a) for a, _ in enc["offset_mapping"]]
        self.ends = [int(b) for _, b in enc["offset_mapping"]]
        probe = tokenizer("a")["input_ids"]
        bos = tokenizer.bos_token_id
        self.prefix = [bos] if bos is not None and probe and probe[0] == bos else []

    def window(self, char_start: int, context: int) -> Window:
        """``context`` tokens from the first line start >= char_start.

        Raises:
            ValueError: context < 2, or the text ends first.
        """
        if context < 2:
            raise ValueError(f"context must be >= 2, got {context}")
        if not 0 <= char_start <= len(self.text):
            raise ValueError(f"char_start must be in 0..{len(self.text)}, got {char_start}")
        c = char_start
        if c and self.text[c - 1] != "\n":
            c = self.text.find("\n", c) + 1 or len(self.text)
        i = bisect.bisect_left(self.starts, c)
        n = context - len(self.prefix)
        if i + n > len(self.ids):
            raise ValueError(f"text has {len(self.ids)} tokens; a {context}-token window at "
                             f"character {c} needs {i + n}")
        toks = np.concatenate([np.asarray(self.prefix, dtype=np.int64), self.ids[i:i + n]])
        return Window(f"@{c}", c, toks, self.ends[i + n - 1])

    def calibration(self, context: int, count: int = CALIB_WINDOWS) -> list[Window]:
        """``count`` consecutive windows from character 0."""
        out, c = [], 0
        for _ in range(count):
            w = self.window(c, context)
            out.append(w)
            c = w.char_end
            while c < len(self.text) and self.text[c - 1] != "\n":
                c += 1
        return out

    def evaluation(self, context: int, count: int, calib_end: int, chars: tuple) -> list[Window]:
        """Windows at the first ``count`` character offsets of ``chars``, after the calibration text.

        Raises:
            ValueError: count outside 1..len(chars), or a window overlaps calibration.
        """
        if not 1 <= count <= len(chars):
            raise ValueError(f"windows must be in 1..{len(chars)}, got {count}")
        ws = [self.window(c, context) for c in chars[:count]]
        for w in ws:
            if w.char_start < calib_end:
                raise ValueError(f"evaluation window {w.name} overlaps the calibration text "
                                 f"(ends at character {calib_end})")
        return ws


# ---------------------------------------------------------------------------------------------- statistics
def accumulate(acc: dict, query, key, mu_skip: int = MU_SKIP) -> dict:
    """Add one attention call's keys ``[B, KVH, T, D]`` and queries ``[B, Hq, T, D]`` (torch) at positions
    ``>= mu_skip`` to ``acc`` (float64 sums ``n``, ``k``, ``k2``, ``q2``, NumPy per channel); returns acc."""
    kk = key[:, :, mu_skip:].detach().double()
    qq = query[:, :, mu_skip:].detach().double()
    acc["n"] = acc.get("n", 0) + kk.shape[0] * kk.shape[2]
    acc["k"] = acc.get("k", 0.0) + kk.sum(dim=(0, 2)).cpu().numpy()
    acc["k2"] = acc.get("k2", 0.0) + (kk ** 2).sum(dim=(0, 2)).cpu().numpy()
    acc["q2"] = acc.get("q2", 0.0) + (qq ** 2).sum(dim=(0, 2)).cpu().numpy()
    return acc


def moments(stats: dict, n_layers: int) -> dict:
    """Per-layer sums (``stats[layer]`` of :func:`accumulate`) -> ``mu`` float16 [L, H, D] (mean key),
    ``k_energy`` float64 [L, H, D] = E (k - mu)^2 with the fp16 mu, ``q_energy`` float64 [L, Hq, D] = E q^2.

    Raises:
        ValueError: a layer without statistics.
    """
    missing = [l for l in range(n_layers) if l not in stats or not stats[l].get("n")]
    if missing:
        raise ValueError(f"no key/query statistics for layers {missing}")
    mu = np.stack([stats[l]["k"] / stats[l]["n"] for l in range(n_layers)])
    mu16 = mu.astype(np.float16)
    m = mu16.astype(np.float64)
    k2 = np.stack([stats[l]["k2"] / stats[l]["n"] for l in range(n_layers)])
    k_energy = np.maximum(k2 - 2 * m * mu + m * m, 0.0)
    q_energy = np.stack([stats[l]["q2"] / stats[l]["n"] for l in range(n_layers)])
    return {"mu": mu16, "k_energy": k_energy, "q_energy": q_energy}


_CAPTURING: dict | None = None


def _capture_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers attention function :data:`CAPTURE_NAME`: accumulates, then runs SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if _CAPTURING is not None:
        st = _CAPTURING
        accumulate(st["layers"].setdefault(module.layer_idx, {}), query, key, st["mu_skip"])
        st["fired"][module.layer_idx] = st["fired"].get(module.layer_idx, 0) + 1
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register() -> str:
    """Register :data:`CAPTURE_NAME` with transformers (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(CAPTURE_NAME, _capture_attention)
    AttentionMaskInterface.register(CAPTURE_NAME, sdpa_mask)
    return CAPTURE_NAME


def capture(model, sequences: np.ndarray, mu_skip: int = MU_SKIP) -> dict:
    """Run the decoder of ``model`` (loaded with ``attn_implementation=CAPTURE_NAME``, or switched to
    it here) on int64 tokens ``[B, T]`` and return the per-layer sums of :func:`accumulate`.

    Raises:
        RuntimeError: some layer's attention did not run exactly once.
    """
    global _CAPTURING
    import torch
    register()
    if getattr(model.config, "_attn_implementation", None) != CAPTURE_NAME:
        model.set_attn_implementation(CAPTURE_NAME)
    n_layers = model.config.get_text_config().num_hidden_layers
    device = next(model.parameters()).device
    _CAPTURING = {"layers": {}, "fired": {}, "mu_skip": mu_skip}
    try:
        with torch.no_grad():
            model.get_decoder()(input_ids=torch.from_numpy(np.asarray(sequences, np.int64)).to(device),
                                use_cache=False)
        st = _CAPTURING
    finally:
        _CAPTURING = None
    fired = [st["fired"].get(l, 0) for l in range(n_layers)]
    if fired != [1] * n_layers:
        raise RuntimeError(f"attention ran {fired} times per layer, expected once each")
    return st["layers"]


def calibrate(model: str, text: str | None = None, context: int = CONTEXT, windows: int = CALIB_WINDOWS,
              threads: int | None = 1, device: str = "cpu") -> KeyTables:
    """Key tables of ``model`` (a spec for :func:`sim_models.models.resolve`; module docstring).

    Args:
        model: the model spec.
        text: the calibration text (default: :func:`read_text` of :data:`TEXT_DIR`).
        context: tokens per window (>= ``MU_SKIP + 2``).
        windows: calibration windows (>= 1).
        threads: torch CPU threads (None: torch's default); the study calibrates with one.
        device: torch device of the model.

    Raises:
        ValueError: a bad model spec, context or windows (named), or a text too short.
        FileNotFoundError: an alias whose wheel is not installed, or no default text.
    """
    from .models import load, resolve
    if isinstance(context, bool) or not isinstance(context, int) or context < MU_SKIP + 2:
        raise ValueError(f"context must be an int >= {MU_SKIP + 2}, got {context!r}")
    if isinstance(windows, bool) or not isinstance(windows, int) or windows < 1:
        raise ValueError(f"windows must be an int >= 1, got {windows!r}")
    src = resolve(model)
    text = read_text() if text is None else text
    import torch
    if threads is not None:
        torch.set_num_threads(threads)
    m, tok = load(src, register())
    m.to(device)
    ws = TokenizedText(text, tok).calibration(context, windows)
    cfg = m.config.get_text_config()
    stats = capture(m, np.stack([w.tokens for w in ws]))
    return KeyTables.from_calibration(moments(stats, cfg.num_hidden_layers), src.model_id)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim_models.calibrate", description=__doc__.split("\n")[0])
    from .models import spec_help
    ap.add_argument("--model", required=True, help=spec_help())
    ap.add_argument("--out", required=True, help="the key tables file to write (.npz)")
    ap.add_argument("--text", help=f"calibration text: a text file or a folder of *.txt (default {TEXT_DIR})")
    ap.add_argument("--context", type=int, default=CONTEXT, help=f"tokens per window (default {CONTEXT})")
    ap.add_argument("--windows", type=int, default=CALIB_WINDOWS,
                    help=f"calibration windows (default {CALIB_WINDOWS})")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--device", default="cpu", help="torch device of the model (cpu, cuda)")
    a = ap.parse_args(argv)
    from .models import resolve
    if a.context < MU_SKIP + 2:
        ap.error(f"--context must be >= {MU_SKIP + 2}, got {a.context}")
    if a.windows < 1:
        ap.error(f"--windows must be >= 1, got {a.windows}")
    if a.threads < 1:
        ap.error(f"--threads must be >= 1, got {a.threads}")
    out = Path(a.out)
    if out.suffix != ".npz":
        ap.error(f"--out must name a .npz file, got {a.out!r}")
    try:
        resolve(a.model)
        text = read_text(a.text)
    except (ValueError, FileNotFoundError) as err:
        ap.error(str(err))
    try:
        tables = calibrate(a.model, text, a.context, a.windows, a.threads, a.device)
    except ValueError as err:
        ap.error(str(err))
    tables.save(out)
    L, H, D = tables.shape
    print(f"key tables of {tables.model_id} ({L} layers, {H} kv heads, head_dim {D}) written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
