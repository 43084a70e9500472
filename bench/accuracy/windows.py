"""Evaluation windows of the accuracy study, defined in the text (not in one tokenizer's tokens).

Text: :func:`sim_models.calibrate.read_text` (the git release notes, version order, ~1.6 MB).
Windows: :class:`sim_models.calibrate.TokenizedText`; a window is the ``context`` tokens that
start at the first line at or after a character offset, tokenized with the model's own tokenizer
(its BOS token first when the tokenizer adds one), so every model reads the same text.
Calibration: :data:`sim_models.calibrate.CALIB_WINDOWS` consecutive windows from the start of the
text; every evaluation window must begin after the calibration text ends.

:data:`EVAL_CHARS`: the first is the main evaluation window, all four give the "four contexts"
protocol. They are the first line starts at or after SmolLM2's tokens 200000, 100000, 300000 and
400000 of the text: on SmolLM2 (no BOS) the windows start 13, 1, 10 and 6 tokens later than those
token offsets.
"""

#: Character offsets (line starts) of the evaluation windows; the first is the main one.
EVAL_CHARS = (777791, 392997, 1163786, 1516169)
