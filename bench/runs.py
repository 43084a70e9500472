"""Runs of the accuracy study: load a model, calibrate it, evaluate configurations on windows.

Metrics of one (configuration, window), streamed over the vocabulary so that no
[tokens, vocab] array of a whole window is ever held (262k-token vocabularies):
  nll, n        sum of next-token cross-entropy (nats) over the window's n = T - 1 targets;
  ppl           exp(nll / n);
  kl            mean over the n positions of KL(p_fp16 || p_config) of the next-token
                distribution; p_fp16 comes from the window's fp16-cache run, of which only
                the final hidden states [T, hidden] are kept (the output head is reapplied
                chunk by chunk);
  k_relmse[l], v_relmse[l], attn_err[l]   per layer (bench.attention.KVFakeQuant);
  bits          average stored bits per K/V element at the window's length;
  seconds       wall time of the configuration's forward pass and metrics.

Calibration (bench/calib/<model_id>.npz): over the calibration windows
(bench/windows.py), positions >= MU_SKIP: ``mu`` fp16 [L, H, D] mean post-RoPE key;
``k_energy`` E (k - mu)^2 [L, H, D]; ``q_energy`` E q^2 [L, Hq, D]; ``k_sens``/``v_sens``
[L] each layer's attention-output error with only its keys (values) quantized by
CALIB_FORMAT (keys centered), which ranks layers for layer-wise precision. The file
records the model id and shapes; loading checks them.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np

from .attention import ATTN_NAME, ATTN_STRIDE, KVFakeQuant, register
from .configs import Config, _cfg
from .kvquant import key_scales
from .models import load, resolve
from .smollm2 import load_text
from .windows import TokenizedText

REPO = Path(__file__).resolve().parent.parent
CALIB_DIR = REPO / "bench" / "calib"
RESULTS_DIR = REPO / "bench" / "results" / "accuracy"

MU_SKIP = 4                          # calibration positions excluded from mu (sinks)
CALIB_FORMAT = dict(mode="lloydmax", scale_rule="rms", scale_round="nearest")
VOCAB_CHUNK = 128                    # positions per output-head chunk
#: Bump when the meaning of a result changes (invalidates cached results).
PROTOCOL = 2


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


class Study:
    """One model with the study's attention function; calibration and evaluation.

    Args:
        model: ``--model`` value (bench/models.py).
        context: tokens per window.
        windows: evaluation windows (1..4, bench/windows.py).
        threads: torch threads.
    """

    def __init__(self, model: str, context: int = 2048, windows: int = 4, threads: int = 1):
        import torch
        torch.set_num_threads(threads)
        self.torch = torch
        register()
        self.src = resolve(model)
        t0 = time.perf_counter()
        self.model, self.tok = load(self.src, ATTN_NAME)
        self.load_s = time.perf_counter() - t0
        c = self.model.config
        self.family = c.model_type
        self.L, self.H, self.Hq = c.num_hidden_layers, c.num_key_value_heads, c.num_attention_heads
        self.D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.context = context
        self.decoder = self.model.get_decoder()
        self.head = self.model.get_output_embeddings()
        self.softcap = getattr(c, "final_logit_softcapping", None)
        text = TokenizedText(load_text(), self.tok)
        self.n_text_tokens = len(text.ids)
        self.calib_windows = text.calibration(context)
        self.windows = text.evaluation(context, windows, self.calib_windows[-1].char_end)
        self.calib = None
        self._ref = {}
        self._check_head()

    # ------------------------------------------------------------------ forward pieces
    def _hidden(self, toks: np.ndarray, fq: KVFakeQuant):
        """Final hidden states [B, T, hidden] of int64 tokens [B, T] under ``fq``."""
        torch = self.torch
        with torch.no_grad(), fq:
            h = self.decoder(input_ids=torch.from_numpy(toks), use_cache=False).last_hidden_state
        fq.check_fired()
        return h

    def _logp(self, h):
        """log-probabilities [P, vocab] of hidden states [P, hidden] (the model's own head)."""
        logits = self.head(h).float()
        if self.softcap:
            logits = self.torch.tanh(logits / self.softcap) * self.softcap
        return self.torch.log_softmax(logits, dim=-1)

    def _check_head(self):
        """The decoder + head path gives the model's own logits (softcap etc. included)."""
        torch = self.torch
        x = self.calib_windows[0].tokens[None, :16]
        with torch.no_grad(), KVFakeQuant(self.L, self.H, self.D, metrics=False):
            ref = torch.log_softmax(self.model(input_ids=torch.from_numpy(x),
                                               use_cache=False).logits[0].float(), dim=-1)
        with torch.no_grad():
            mine = self._logp(self._hidden(x, KVFakeQuant(self.L, self.H, self.D,
                                                           metrics=False))[0])
        err = float((ref - mine).abs().max())
        if err > 1e-3:
            raise RuntimeError(f"decoder + output head differ from the model's logits by {err}")

    def quantizers(self, cfg: Config):
        ks = None if self.calib is None else self.calib.get("k_sens")
        return [(cfg.quantizer(l, "k", self.D, ks), cfg.quantizer(l, "v", self.D, ks))
                for l in range(self.L)]

    def _fq(self, cfg: Config, metrics=True) -> KVFakeQuant:
        needs = cfg.center or cfg.reparam or cfg.layer_k
        if needs and self.calib is None:
            raise RuntimeError(f"{cfg.name} needs the calibration file (run --calibrate)")
        return KVFakeQuant(self.L, self.H, self.D, self.quantizers(cfg), sinks=cfg.sinks,
                           mu16=self.calib["mu"] if cfg.center else None,
                           kscale=key_scales(cfg.reparam, self.calib) if cfg.reparam else None,
                           metrics=metrics)

    # ------------------------------------------------------------------ evaluation
    def ref_hidden(self, w):
        """fp16-cache final hidden states [T, hidden] of window ``w`` (kept per window)."""
        if w.name not in self._ref:
            self._ref[w.name] = self._hidden(w.tokens[None], self._fq(_cfg("fp16", None),
                                                                       metrics=False))[0]
        return self._ref[w.name]

    def evaluate(self, cfgs: list[Config], w) -> list[dict]:
        """Metrics (module docstring) of each configuration on window ``w``.

        The configurations share the window's output-head passes: the fp16 reference's
        log-probabilities of a chunk of positions are computed once for all of them.
        ``seconds``: the configuration's decoder pass, metrics and own head passes.
        """
        torch = self.torch
        ref_spec = _cfg("fp16", None).spec()
        ks = None if self.calib is None else self.calib.get("k_sens")
        runs = []
        for cfg in cfgs:
            t0 = time.perf_counter()
            fq = self._fq(cfg)
            h = self._hidden(w.tokens[None], fq)[0]
            if cfg.spec() == ref_spec:
                self._ref.setdefault(w.name, h)
            runs.append({"cfg": cfg, "h": h, "fq": fq, "t": time.perf_counter() - t0,
                         "nll": 0.0, "kl": 0.0})
        href = self.ref_hidden(w)
        tgt = torch.from_numpy(w.tokens[1:])
        n = len(tgt)
        with torch.no_grad():
            for a in range(0, n, VOCAB_CHUNK):
                b = min(a + VOCAB_CHUNK, n)
                lr = self._logp(href[a:b])
                for r in runs:
                    t0 = time.perf_counter()
                    lp = self._logp(r["h"][a:b])
                    r["nll"] -= float(lp.gather(1, tgt[a:b, None]).sum())
                    r["kl"] += float((lr.exp() * (lr - lp)).sum())
                    r["t"] += time.perf_counter() - t0
        out = []
        for r in runs:
            cfg = r["cfg"]
            res = {"ppl": math.exp(r["nll"] / n), "nll": r["nll"], "n": n, "kl": r["kl"] / n,
                   **r["fq"].relative(),
                   "bits": cfg.bits(self.L, self.H, self.D, len(w.tokens), ks),
                   "seconds": r["t"]}
            if cfg.layer_k:
                res["layer_k_layers"] = cfg.wide_layers(ks)
            out.append(res)
        return out

    # ------------------------------------------------------------------ calibration
    def calibrate(self, path: Path) -> dict:
        """Compute and write the calibration file (module docstring); returns its arrays."""
        seqs = np.stack([w.tokens for w in self.calib_windows])
        fq = KVFakeQuant(self.L, self.H, self.D, capture=True, metrics=False, mu_skip=MU_SKIP)
        self._hidden(seqs, fq)
        st = fq.stats
        mu = np.stack([st[l]["k"] / st[l]["n"] for l in range(self.L)])             # [L, H, D]
        mu16 = mu.astype(np.float16)
        m = mu16.astype(np.float64)
        k2 = np.stack([st[l]["k2"] / st[l]["n"] for l in range(self.L)])
        k_energy = np.maximum(k2 - 2 * m * mu + m * m, 0.0)                         # E (k-mu)^2
        q_energy = np.stack([st[l]["q2"] / st[l]["n"] for l in range(self.L)])       # [L, Hq, D]
        self.calib = {"mu": mu16}
        sens = {}
        for kind in ("k", "v"):
            cfg = _cfg("calib", None, center=True)
            cfg = Config(**{**cfg.__dict__, kind: dict(CALIB_FORMAT)})
            fq = self._fq(cfg)
            self._hidden(seqs, fq)
            sens[kind] = np.asarray(fq.relative()["attn_err"])
        calib = {"mu": mu16, "k_sens": sens["k"], "v_sens": sens["v"], "k_energy": k_energy,
                 "q_energy": q_energy}
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **calib, model_id=np.array(self.src.model_id),
                 shape=np.array([self.L, self.H, self.Hq, self.D]),
                 calib_chars=np.array([[w.char_start, w.char_end] for w in self.calib_windows]),
                 context=np.int64(self.context), mu_skip=np.int64(MU_SKIP),
                 calib_format=np.array(json.dumps(CALIB_FORMAT)),
                 note=np.array("mu: mean post-RoPE key per (layer, kv head) over calibration "
                               "positions >= mu_skip; k_energy E (k - mu)^2 and q_energy E q^2 "
                               "per channel; k_sens/v_sens: per-layer attention-output relative "
                               "error with only that kind quantized (calib_format, keys "
                               "centered), all layers at once"))
        self.calib = calib
        return calib

    def load_calibration(self, path: Path) -> dict:
        """Read and check a calibration file; sets and returns the calibration.

        Raises:
            ValueError: written for another model id or shape.
        """
        with np.load(path) as z:
            mid = str(z["model_id"]) if "model_id" in z else None
            shape = z["shape"].tolist() if "shape" in z else None
            calib = {k: z[k] for k in ("mu", "k_sens", "v_sens", "k_energy", "q_energy")}
        want = [self.L, self.H, self.Hq, self.D]
        if mid != self.src.model_id or shape != want:
            raise ValueError(f"{path}: calibration of model {mid!r} shape {shape}, not of "
                             f"{self.src.model_id!r} {want}: rerun with --calibrate")
        self.calib = calib
        return calib

    def calib_path(self) -> Path:
        return CALIB_DIR / f"{self.src.model_id}.npz"

    def results_path(self) -> Path:
        return RESULTS_DIR / f"{self.src.model_id}.json"

    def run_key(self, cfg: Config, w) -> str:
        """Cache key of a result: configuration spec, window tokens, calibration used."""
        h = hashlib.sha256()
        h.update(json.dumps([PROTOCOL, cfg.spec()], sort_keys=True).encode())
        h.update(w.tokens.tobytes())
        if (cfg.center or cfg.reparam or cfg.layer_k) and self.calib is not None:
            h.update(self.calib["mu"].tobytes())
            h.update(self.calib["k_sens"].tobytes())
        return h.hexdigest()[:16]

    def meta(self) -> dict:
        c = self.calib or {}
        return {"model_id": self.src.model_id, "source": self.src.description,
                "family": self.family, "layers": self.L, "kv_heads": self.H,
                "q_heads": self.Hq, "head_dim": self.D,
                "vocab": int(self.model.config.vocab_size), "context": self.context,
                "bos": bool(len(self.windows[0].tokens) and self.tok.bos_token_id is not None
                            and int(self.windows[0].tokens[0]) == self.tok.bos_token_id),
                "windows": [{"name": w.name, "chars": [w.char_start, w.char_end]}
                            for w in self.windows],
                "calib_windows": [{"name": w.name, "chars": [w.char_start, w.char_end]}
                                  for w in self.calib_windows],
                "text_tokens": self.n_text_tokens, "calib_file": _rel(self.calib_path()),
                "k_sens": np.asarray(c.get("k_sens", [])).tolist(),
                "v_sens": np.asarray(c.get("v_sens", [])).tolist(),
                "attn_stride": ATTN_STRIDE, "protocol": PROTOCOL,
                "torch_threads": self.torch.get_num_threads(), "load_seconds": self.load_s}
