"""Runs of the accuracy study: load a model, calibrate it, evaluate configurations on windows.

Metrics of one (configuration, window), streamed over the vocabulary so that no
[tokens, vocab] array of a whole window is ever held (262k-token vocabularies):
  nll, n        sum of next-token cross-entropy (nats) over the window's n = T - 1 targets;
  ppl           exp(nll / n);
  kl            mean over the n positions of KL(p_fp16 || p_config) of the next-token
                distribution; p_fp16 comes from the window's fp16-cache run, of which only
                the final hidden states [T, hidden] are kept (the output head is reapplied
                chunk by chunk);
  k_relmse[l], v_relmse[l], attn_err[l]   per layer (bench.accuracy.attention.KVFakeQuant);
  bits          average stored bits per K/V element at the window's length;
  seconds       wall time of the configuration's forward pass and metrics.

Calibration (bench/calib/<model_id>.npz): over the calibration windows
(sim_models.calibrate), positions >= MU_SKIP, with the product's statistics
(``sim_models.calibrate.moments``; the key tables are those ``python -m
sim_models.calibrate`` writes): ``mu`` fp16 [L, H, D] mean post-RoPE key;
``k_energy`` E (k - mu)^2 [L, H, D]; ``q_energy`` E q^2 [L, Hq, D]; ``k_sens``/``v_sens``
[L] each layer's attention-output error with only its keys (values) quantized by
CALIB_FORMAT (keys centered), which ranks layers for layer-wise precision. The file
records the model id and shapes; loading checks them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np

from sim_models import KeyTables
from sim_models.calibrate import MU_SKIP, TokenizedText, moments, read_text

from .attention import ATTN_NAME, ATTN_STRIDE, KVFakeQuant, register
from .configs import BITS_RULE, LONG_CONTEXT, Config, _cfg
from .kvquant import (SELECT_KEYS, calibrated_key_scales, key_scales,
                      select_head_transform)
from sim_models.models import ModelSource, load, resolve
from .windows import EVAL_CHARS

REPO = Path(__file__).resolve().parents[2]
CALIB_DIR = REPO / "bench" / "calib"
RESULTS_DIR = REPO / "bench" / "results" / "accuracy"

#: Arrays of a calibration file (besides model id, shapes and provenance).
CALIB_ARRAYS = ("mu", "k_sens", "v_sens", "k_energy", "q_energy", "signs_c", "rot_c",
                "select_loss_c", "signs_cq", "rot_cq", "select_loss_cq")
CALIB_FORMAT = dict(mode="lloydmax", scale_rule="rms", scale_round="nearest")
#: Format the sign / rotation selection is made for (the v2 quantizer, 3 bits).
SELECT_FORMAT = dict(mode="midrise", scale_round="nearest")
#: Key-scale domains the sign / rotation tables are selected in: "c" (centered keys),
#: "cq" (centered, then qaware-pow2 key scales).
SELECT_DOMAINS = {"c": None, "cq": "qaware-pow2"}
VOCAB_CHUNK = 128                    # positions per output-head chunk
#: Bump when the meaning of a result changes (invalidates cached results).
PROTOCOL = 2


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


class Study:
    """One model with the study's attention function; calibration and evaluation.

    Args:
        model: ``--model`` value or a ModelSource (sim_models.models).
        context: tokens per window.
        windows: evaluation windows (1..4, bench/accuracy/windows.py).
        threads: torch threads.
        device: torch device of the model ("cpu", "cuda"); K/V go through the golden model
            (NumPy) on the CPU either way.
        text: the study text (default sim_models.calibrate.read_text()).
    """

    def __init__(self, model: str, context: int = 2048, windows: int = 4, threads: int = 1,
                 device: str = "cpu", text: str | None = None):
        import torch
        torch.set_num_threads(threads)
        self.torch = torch
        self.device = device
        register()
        self.src = model if isinstance(model, ModelSource) else resolve(model)
        t0 = time.perf_counter()
        self.model, self.tok = load(self.src, ATTN_NAME)
        self.model.to(device)
        self.load_s = time.perf_counter() - t0
        c = self.model.config
        self.family = c.model_type
        self.L, self.H, self.Hq = c.num_hidden_layers, c.num_key_value_heads, c.num_attention_heads
        self.D = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.context = context
        self.decoder = self.model.get_decoder()
        self.head = self.model.get_output_embeddings()
        self.softcap = getattr(c, "final_logit_softcapping", None)
        text = TokenizedText(read_text() if text is None else text, self.tok)
        self.n_text_tokens = len(text.ids)
        self.calib_windows = text.calibration(context)
        self.windows = text.evaluation(context, windows, self.calib_windows[-1].char_end, EVAL_CHARS)
        self.calib = None
        self._ref = {}
        self._check_head()

    # ------------------------------------------------------------------ forward pieces
    def _hidden(self, toks: np.ndarray, fq: KVFakeQuant):
        """Final hidden states [B, T, hidden] of int64 tokens [B, T] under ``fq``."""
        torch = self.torch
        with torch.no_grad(), fq:
            h = self.decoder(input_ids=torch.from_numpy(toks).to(self.device),
                             use_cache=False).last_hidden_state
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
            ref = torch.log_softmax(self.model(input_ids=torch.from_numpy(x).to(self.device),
                                               use_cache=False).logits[0].float(), dim=-1)
        with torch.no_grad():
            mine = self._logp(self._hidden(x, KVFakeQuant(self.L, self.H, self.D,
                                                           metrics=False))[0])
        err = float((ref - mine).abs().max())
        if err > 1e-3:
            raise RuntimeError(f"decoder + output head differ from the model's logits by {err}")

    def quantizers(self, cfg: Config):
        ks = None if self.calib is None else self.calib.get("k_sens")
        return [(cfg.quantizer(l, "k", self.D, ks, self.L), cfg.quantizer(l, "v", self.D, ks, self.L))
                for l in range(self.L)]

    def transforms(self, cfg: Config):
        """Per layer, the keys' sim_models.HeadTransform per kv head, or None."""
        if not (cfg.key_signs or cfg.key_rot):
            return None
        from sim_models import HeadTransform
        dom = {v: k for k, v in SELECT_DOMAINS.items()}.get(cfg.key_scale_kind)
        if dom is None or not cfg.center_keys:
            raise ValueError(f"{cfg.name}: sign / rotation tables are selected for centered "
                             f"keys with key_scale in {list(SELECT_DOMAINS.values())}")
        sg, rt = self.calib[f"signs_{dom}"], self.calib[f"rot_{dom}"]
        return [[HeadTransform(signs=sg[l, h] if cfg.key_signs else None,
                               rot=rt[l, h] if cfg.key_rot else None) for h in range(self.H)]
                for l in range(self.L)]

    def _fq(self, cfg: Config, metrics=True) -> KVFakeQuant:
        if cfg.tables and self.calib is None:
            raise RuntimeError(f"{cfg.name} needs the calibration file (run --calibrate)")
        return KVFakeQuant(self.L, self.H, self.D, self.quantizers(cfg), sinks=cfg.sinks,
                           mu16=self.calib["mu"] if cfg.center_keys else None,
                           kscale=key_scales(cfg.reparam, self.calib) if cfg.reparam else None,
                           key_s16=(calibrated_key_scales(cfg.key_scale_kind, self.calib)
                                    if cfg.key_scale else None),
                           transforms=self.transforms(cfg), metrics=metrics, recent=cfg.recent,
                           key_fold=cfg.key_fold)

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
        tgt = torch.from_numpy(w.tokens[1:]).to(self.device)
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
                   "bits_32k": cfg.bits(self.L, self.H, self.D, LONG_CONTEXT, ks),
                   "table_bytes": cfg.table_bytes(self.L, self.H, self.D),
                   "seconds": r["t"]}
            if cfg.layer_k:
                res["layer_k_layers"] = cfg.wide_layers(ks)
            out.append(res)
        return out

    # ------------------------------------------------------------------ calibration
    def select_tables(self, calib: dict, qq: np.ndarray, ks: list, pool=None) -> dict:
        """Sign masks and 4x4 rotations per (layer, kv head), best of K on the calibration
        keys by the logit-error loss E (q . dk)^2 (bench.accuracy.kvquant.select_head_transform),
        for each domain of SELECT_DOMAINS."""
        from sim_models import FormatParams, center, scale_keys
        p = FormatParams(n=self.D, **SELECT_FORMAT)
        g = self.Hq // self.H
        out = {}
        for dom, kind in SELECT_DOMAINS.items():
            s16 = None if kind is None else calibrated_key_scales(kind, calib)
            jobs = []
            for l in range(self.L):
                for h in range(self.H):
                    k16 = ks[l][h, :SELECT_KEYS].astype(np.float16)
                    mu = calib["mu"][l, h]
                    cq = qq[l, h * g:(h + 1) * g].mean(axis=0)
                    if s16 is not None:                 # as bench/accuracy/attention.py: scale, center
                        sb = np.ascontiguousarray(np.broadcast_to(s16[l, h], k16.shape))
                        k16 = scale_keys(k16, sb, p).view(np.float16)
                        mu = scale_keys(mu, s16[l, h], p).view(np.float16)
                        inv = 1.0 / s16[l, h].astype(np.float64)
                        cq = cq * inv[:, None] * inv[None, :]
                    mu = np.ascontiguousarray(np.broadcast_to(mu, k16.shape))
                    k16 = center(np.ascontiguousarray(k16), mu, p)
                    jobs.append((k16.view(np.float16), cq, p, 1000 * l + h))
            res = list(pool.map(select_head_transform, jobs) if pool else
                       map(select_head_transform, jobs))
            out[f"signs_{dom}"] = np.stack([r[0] for r in res]).reshape(self.L, self.H, self.D)
            out[f"rot_{dom}"] = np.stack([r[1] for r in res]).reshape(self.L, self.H,
                                                                     self.D // 4, 4, 4)
            out[f"select_loss_{dom}"] = np.array([[r[2]["default"], r[2]["signs"],
                                                   r[2]["signs_rot"]] for r in res]
                                                 ).reshape(self.L, self.H, 3)
        return out

    def calibrate(self, path: Path, pool=None) -> dict:
        """Compute and write the calibration file (module docstring); returns its arrays."""
        seqs = np.stack([w.tokens for w in self.calib_windows])
        fq = KVFakeQuant(self.L, self.H, self.D, capture=True, metrics=False, mu_skip=MU_SKIP)
        self._hidden(seqs, fq)
        st = fq.stats
        mom = moments(st, self.L)              # the product's calibration (sim_models.calibrate)
        mu16, k_energy, q_energy = mom["mu"], mom["k_energy"], mom["q_energy"]
        self.calib = {"mu": mu16}
        sens = {}
        for kind in ("k", "v"):
            cfg = _cfg("calib", None, center_keys=True)
            cfg = dataclasses.replace(cfg, **{kind: dict(CALIB_FORMAT)})
            fq = self._fq(cfg)
            self._hidden(seqs, fq)
            sens[kind] = np.asarray(fq.relative()["attn_err"])
        calib = {"mu": mu16, "k_sens": sens["k"], "v_sens": sens["v"], "k_energy": k_energy,
                 "q_energy": q_energy}
        qq = np.stack([st[l]["qq"] / st[l]["n"] for l in range(self.L)])           # [L,Hq,D,D]
        ks = [np.concatenate(st[l]["ks"], axis=1) for l in range(self.L)]         # [H, T', D]
        calib.update(self.select_tables(calib, qq, ks, pool))
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
                               "centered), all layers at once; signs_<d>/rot_<d>: per (layer, "
                               "kv head) sign mask and 4x4 post-FWHT rotations (int16, "
                               "2^-14), best of K by E (q . dk)^2 on calibration keys, for "
                               "domain d (c: centered, cq: centered + qaware-pow2 key "
                               "scales); select_loss_<d>: that loss for the default, the "
                               "chosen signs, signs + rotations"))
        KeyTables.from_calibration(calib, self.src.model_id).save(self.tables_path())
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
            calib = {k: z[k] for k in z.files if k in CALIB_ARRAYS}
        want = [self.L, self.H, self.Hq, self.D]
        if mid != self.src.model_id or shape != want:
            raise ValueError(f"{path}: calibration of model {mid!r} shape {shape}, not of "
                             f"{self.src.model_id!r} {want}: rerun with --calibrate")
        self.calib = calib
        return calib

    @staticmethod
    def calibration_complete(path: Path) -> bool:
        """Whether a calibration file holds every array of CALIB_ARRAYS (older files lack
        the key-treatment tables)."""
        with np.load(path) as z:
            return set(CALIB_ARRAYS) <= set(z.files)

    def calib_path(self) -> Path:
        return CALIB_DIR / f"{self.src.model_id}.npz"

    def tables_path(self) -> Path:
        """The model's key tables (sim_models.KeyTables: mu and the qaware pow2 key-scale
        exponents), written with the calibration; what gpu_ref.hf / gpu_ref.generate load."""
        return CALIB_DIR / f"{self.src.model_id}.keytables.npz"

    def results_path(self) -> Path:
        return RESULTS_DIR / f"{self.src.model_id}.json"

    def run_key(self, cfg: Config, w) -> str:
        """Cache key of a result: configuration spec, window tokens, calibration used."""
        h = hashlib.sha256()
        h.update(json.dumps([PROTOCOL, cfg.spec()], sort_keys=True).encode())
        h.update(w.tokens.tobytes())
        if (cfg.center_keys or cfg.reparam or cfg.layer_k) and self.calib is not None:
            h.update(self.calib["mu"].tobytes())
            h.update(self.calib["k_sens"].tobytes())
        if cfg.key_scale and self.calib is not None:
            h.update(calibrated_key_scales(cfg.key_scale_kind, self.calib).tobytes())
        for t in (self.transforms(cfg) or []):
            for x in t:
                for a in (x.signs, x.rot):
                    if a is not None:
                        h.update(a.tobytes())
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
                "attn_stride": ATTN_STRIDE, "protocol": PROTOCOL, "bits_rule": BITS_RULE,
                "torch_threads": self.torch.get_num_threads(), "load_seconds": self.load_s}
