"""Long-context retrieval: passkey at the model's long context, fp16 cache vs compressed caches.

A prompt of ``context`` tokens: an instruction, filler sentences ("The grass is green. ..."),
at a given depth the needle "The pass key is NNNNN. Remember it. NNNNN is the pass key.",
more filler, then "What is the pass key? The pass key is" followed by the key. One forward
pass with every K/V of the sequence fake-quantized (bench/accuracy/attention.py), teacher-forced: a
trial retrieves the key when the argmax at every key token is that token; ``logp`` is the
sum of the key tokens' log-probabilities. The prompt tokens are the same for every
configuration (depths :data:`DEPTHS`, keys from a fixed seed).
"""

from __future__ import annotations

import time

import numpy as np

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and "
         "memorize it. I will quiz you about the important information there.\n")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "What is the pass key? The pass key is"
#: Needle depths of the trials (fraction of the filler before the needle).
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
SEED = 13


def _ids(tok, s: str) -> list[int]:
    return tok(s, add_special_tokens=False)["input_ids"]


def prompt(tok, context: int, depth: float, key: int) -> tuple[np.ndarray, int]:
    """(int64 token ids [<= context], index of the first key token) of one trial."""
    probe = tok("a")["input_ids"]                    # BOS first when the tokenizer adds one
    bos = [tok.bos_token_id] if tok.bos_token_id is not None and probe and \
        probe[0] == tok.bos_token_id else []
    intro, fill = _ids(tok, INTRO), _ids(tok, FILLER)
    needle, tail = _ids(tok, NEEDLE.format(key=key)), _ids(tok, QUESTION)
    ans = _ids(tok, f" {key}")
    room = context - len(bos) - len(intro) - len(needle) - len(tail) - len(ans)
    reps = room // len(fill)
    before = int(round(depth * reps))
    ids = bos + intro + fill * before + needle + fill * (reps - before) + tail + ans
    return np.asarray(ids, dtype=np.int64), len(ids) - len(ans)


def trials(tok, context: int) -> list[dict]:
    """The trials: depth, key, tokens, answer start."""
    rng = np.random.default_rng(SEED)
    out = []
    for d in DEPTHS:
        key = int(rng.integers(10000, 100000))
        ids, a = prompt(tok, context, d, key)
        out.append({"depth": d, "key": key, "tokens": ids, "answer_start": a})
    return out


def run_trial(study, cfg, trial: dict) -> dict:
    """Retrieval of one trial under configuration ``cfg`` (a bench.accuracy.configs.Config)."""
    torch = study.torch
    t0 = time.perf_counter()
    ids, a = trial["tokens"], trial["answer_start"]
    h = study._hidden(ids[None], study._fq(cfg, metrics=False))[0]
    with torch.no_grad():
        lp = study._logp(h[a - 1:len(ids) - 1])
    tgt = torch.from_numpy(ids[a:]).to(lp.device)
    got = lp.argmax(dim=-1)
    return {"depth": trial["depth"], "key": trial["key"], "tokens": int(len(ids)),
            "retrieved": bool((got == tgt).all()),
            "digits_right": int((got == tgt).sum()), "digits": int(len(tgt)),
            "logp": float(lp.gather(1, tgt[:, None]).sum()),
            "seconds": time.perf_counter() - t0}
