"""Text and windows of the accuracy study, defined in the text (not in one tokenizer's tokens).

Text: the git release notes (bench/accuracy/smollm2.py ``load_text``: /usr/share/doc/git/RelNotes,
version order, ~1.6 MB). A window is the ``context`` tokens that start at the first
line at or after a character offset: tokenized with the model's own tokenizer (its
BOS token first when the tokenizer adds one), so every model reads the same text.

Evaluation windows: :data:`EVAL_CHARS` (the first is the main evaluation window, all four
give the "four contexts" protocol). They are the first line starts at or after SmolLM2's
tokens 200000, 100000, 300000 and 400000, the absolute token offsets of the earlier
protocol: on SmolLM2 (no BOS) the windows start 13, 1, 10 and 6 tokens later than there. Calibration: :data:`CALIB_WINDOWS` consecutive windows from the start
of the text; every evaluation window must begin after the calibration text ends.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

#: Character offsets (line starts) of the evaluation windows; the first is the main one.
EVAL_CHARS = (777791, 392997, 1163786, 1516169)
#: Consecutive calibration windows from character 0.
CALIB_WINDOWS = 2


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
    """The study text tokenized once, with character offsets, by ``tokenizer``."""

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

    def evaluation(self, context: int, count: int, calib_end: int,
                   chars: tuple = EVAL_CHARS) -> list[Window]:
        """Windows at the first ``count`` character offsets of ``chars``.

        Raises:
            ValueError: count outside 1..len(EVAL_CHARS), or a window overlaps calibration.
        """
        if not 1 <= count <= len(chars):
            raise ValueError(f"windows must be in 1..{len(chars)}, got {count}")
        ws = [self.window(c, context) for c in chars[:count]]
        for w in ws:
            if w.char_start < calib_end:
                raise ValueError(f"evaluation window {w.name} overlaps the calibration text "
                                 f"(ends at character {calib_end})")
        return ws
