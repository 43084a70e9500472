#!/usr/bin/env python3
"""Format study: perplexity of SmolLM2-135M with every cached K and V fake-quantized.

Every post-RoPE key and every value that the model caches is replaced, inside
the forward pass, by its reconstruction: for format configurations through the
golden model (``sim_models.encode`` -> ``sim_models.decode_float``; keys first
centered with ``sim_models.center`` when the config says so), for the float
baselines (naive INT-b, INT-b after an orthonormal D*H rotation) by the
implementation below. Outputs:

  bench/results/accuracy.json        every configuration: spec, average bits,
                                     perplexity (one 2048-token context and
                                     4 x 512-token chunks of the same tokens),
                                     per-layer K/V relative MSE and attention-output error
  bench/results/accuracy_pareto.png  perplexity vs average bits, Pareto frontier marked
  docs/ACCURACY.md                   the tables (between the BEGIN/END markers)

Hooks (transformers 5.24, ``models/llama/modeling_llama.py``): ``LlamaAttention.forward``
computes k_proj/v_proj, then calls the module-level ``apply_rotary_pos_emb(q, k, cos,
sin)`` and hands the result to ``cache.update`` and the attention kernel. We
replace that module attribute with a wrapper that quantizes the returned keys
(post-RoPE, exactly what is cached), and register a forward hook on each
``v_proj`` that quantizes its output (values carry no positional transform).
A forward pre-hook on each ``self_attn`` tells the wrapper the layer index. The
run asserts that the wrapper and the hooks fired once per layer.

Metrics, per configuration:
  ppl_2048     exp(mean next-token cross-entropy) over the 2047 predictions of
               one 2048-token context of git release notes (bench/smollm2.py);
  ppl_512      the same 2048 tokens as 4 independent 512-token sequences
               (sinks and centering apply per sequence);
  k_relmse[l]  sum ||k_hat - k||^2 / sum ||k||^2 over all tokens and heads of
               layer l (k_hat in the original domain: + mu when centered);
  v_relmse[l]  likewise for values;
  attn_err[l]  ||o_hat - o||_F / ||o||_F of the layer's attention output
               (before o_proj) for every 8th query position, where o uses the
               unquantized K/V and o_hat the quantized ones, both with the same
               queries of the quantized run (local damage of layer l);
  bits         average stored bits per K/V element at the given context:
               codes, scale bytes, zero points, fp16 sink tokens, wider layers;
               baseline INT-b stores an fp16 scale and an fp16 minimum per
               token-head (b + 32/64 bits).

Calibration (``--calibrate``; automatic when the file is missing) runs on the
first 4096 tokens of the text (two 2048-token sequences), disjoint from the
evaluation tokens, and writes bench/calib/smollm2-135m.npz: ``mu`` fp16
[layers, kv_heads, head_dim], the mean post-RoPE key over positions >= 4 of the
calibration sequences (the first tokens, attention sinks, are excluded), and
``k_sens``/``v_sens`` [layers], each layer's attention-output error with only
its keys (values) quantized by CALIB_FORMAT, which ranks layers for layer-wise
precision.

Usage:
    .venv/bin/python bench/accuracy.py                 # calibrate if needed, run all, report
    .venv/bin/python bench/accuracy.py --only NAME,... # some configurations
    .venv/bin/python bench/accuracy.py --report-only   # tables + plot from the JSON
    .venv/bin/python bench/accuracy.py --list          # configuration names

Results are cached in the JSON by configuration name and spec; a rerun skips
finished ones (``--force`` recomputes). Runs on CPU with one torch thread.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
try:
    from bench.smollm2 import MODEL_NAME, load_model, load_text
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(REPO / "bench"))
    from smollm2 import MODEL_NAME, load_model, load_text

from sim_models import CachePolicy, FormatParams, center, decode_float, encode  # noqa: E402
from sim_models.signs import sign_mask  # noqa: E402

RESULTS = REPO / "bench" / "results" / "accuracy.json"
PLOT = REPO / "bench" / "results" / "accuracy_pareto.png"
DOC = REPO / "docs" / "ACCURACY.md"
CALIB = REPO / "bench" / "calib" / "smollm2-135m.npz"

CTX = 2048
CHUNK = 512
CALIB_TOKENS = (0, 4096)            # two 2048-token calibration sequences
EVAL_START = 200_000                # evaluation context: tokens [EVAL_START, EVAL_START + 2048)
CONFIRM_STARTS = (100_000, 300_000, 400_000)   # more contexts, for the leading configurations
MU_SKIP = 4                         # calibration positions excluded from mu (sinks)
ATTN_STRIDE = 8                     # attention error on every 8th query position
CALIB_FORMAT = dict(mode="lloydmax", scale_rule="rms", scale_round="nearest")
FP16_MAX = 65504.0


# =========================================================================== configurations
def _f(**kw):
    return {"fmt": kw}


V1 = {}                                                  # version-1 quantizer (STUDY_BASE)
LM = dict(mode="lloydmax", scale_rule="rms", scale_round="nearest")
MR = dict(mode="midrise", scale_rule="rms", scale_round="nearest")


def _cfg(name, k, v=None, sinks=0, center=False, layer_k=None, group="", note="", reparam=None):
    return {"name": name, "k": k, "v": k if v is None else v, "sinks": sinks, "center": center,
            "layer_k": layer_k, "group": group, "note": note, "reparam": reparam}


def configurations() -> list[dict]:
    """Every configuration of the study (name -> spec). Order = table order."""
    c = []
    add = c.append
    # baselines
    add(_cfg("fp16", "fp16", group="baseline", note="K/V rounded to fp16"))
    add(_cfg("int4-asym", {"int": 4, "rot": False}, group="baseline",
             note="naive INT4, per token-head min/max, fp16 scale + min"))
    add(_cfg("int4-asym-DH", {"int": 4, "rot": True}, group="baseline",
             note="INT4 after orthonormal D*H (SAW-INT4-like)"))
    add(_cfg("int3-asym", {"int": 3, "rot": False}, group="baseline", note="naive INT3"))
    add(_cfg("int3-asym-DH", {"int": 3, "rot": True}, group="baseline", note="INT3 after D*H"))
    add(_cfg("published-H-midtread", _f(sign_seed=None), group="baseline",
             note="published 3-bit formula: H (no D) + 7-level mid-tread, max scale"))
    # quantizer mode x scale rule x rounding, b = 3, G = 64, ue5m3, no centering
    add(_cfg("v1-default", _f(), group="mode", note="D*H midtread, max, up (format version 1 default)"))
    add(_cfg("midtread-max-near", _f(scale_round="nearest"), group="mode"))
    add(_cfg("midtread-rms-near", _f(scale_rule="rms", scale_round="nearest"), group="mode"))
    add(_cfg("asym-max-up", _f(mode="asym"), group="mode", note="zero point byte per block"))
    add(_cfg("asym-max-near", _f(mode="asym", scale_round="nearest"), group="mode"))
    add(_cfg("midrise-max-up", _f(mode="midrise"), group="mode"))
    add(_cfg("midrise-max-near", _f(mode="midrise", scale_round="nearest"), group="mode"))
    add(_cfg("midrise-rms-up", _f(mode="midrise", scale_rule="rms"), group="mode"))
    add(_cfg("midrise-rms-near", _f(**MR), group="mode"))
    add(_cfg("midrise-absmean-near", _f(mode="midrise", scale_rule="absmean",
                                        scale_round="nearest"), group="mode"))
    add(_cfg("lloydmax-max-near", _f(mode="lloydmax", scale_round="nearest"), group="mode"))
    add(_cfg("lloydmax-rms-up", _f(mode="lloydmax", scale_rule="rms"), group="mode"))
    add(_cfg("lloydmax-rms-near", _f(**LM), group="mode"))
    add(_cfg("lloydmax-absmean-near", _f(mode="lloydmax", scale_rule="absmean",
                                         scale_round="nearest"), group="mode"))
    # clipping multiplier (rms rule): 0.9, 1.1 sigma
    add(_cfg("lloydmax-rms-near-x0.9", _f(**LM, scale_mult=230), group="mult"))
    add(_cfg("lloydmax-rms-near-x1.1", _f(**LM, scale_mult=282), group="mult"))
    add(_cfg("midrise-rms-near-x0.9", _f(**MR, scale_mult=135), group="mult"))
    add(_cfg("midrise-rms-near-x1.1", _f(**MR, scale_mult=165), group="mult"))
    # key centering and sinks
    for nm, kw in (("v1-default", {}), ("asym-max-up", dict(mode="asym")),
                   ("midrise-rms-near", MR), ("lloydmax-rms-near", LM)):
        add(_cfg(nm + "+C", _f(**kw), center=True, group="center"))
    add(_cfg("lloydmax-rms-near+S4", _f(**LM), sinks=4, group="sinks"))
    for nm, kw in (("v1-default", {}), ("midrise-rms-near", MR), ("lloydmax-rms-near", LM)):
        add(_cfg(nm + "+C+S4", _f(**kw), center=True, sinks=4, group="sinks"))
    add(_cfg("lloydmax-rms-near+C+S1", _f(**LM), center=True, sinks=1, group="sinks"))
    add(_cfg("lloydmax-rms-near+C+S16", _f(**LM), center=True, sinks=16, group="sinks"))
    # scale encodings (best mode, centered, sinks 4)
    for enc in ("e4m3fn", "e5m2", "ue4m4"):
        add(_cfg(f"lloydmax-rms-near-{enc}+C+S4", _f(**LM, scale=enc), center=True, sinks=4,
                 group="scale"))
    add(_cfg("lloydmax-rms-up-e4m3fn+C+S4", _f(mode="lloydmax", scale_rule="rms", scale="e4m3fn"),
             center=True, sinks=4, group="scale"))
    add(_cfg("lloydmax-rms-up+C+S4", _f(mode="lloydmax", scale_rule="rms"), center=True, sinks=4,
             group="scale"))
    # block size (N = head_dim = 64, so G <= 64 here)
    add(_cfg("v1-default-G32", _f(block=32), group="block"))
    add(_cfg("lloydmax-rms-near-G32+C+S4", _f(**LM, block=32), center=True, sinks=4, group="block"))
    add(_cfg("midrise-rms-near-G32+C+S4", _f(**MR, block=32), center=True, sinks=4, group="block"))
    # code width
    for b in (2, 4):
        add(_cfg(f"lloydmax-rms-near-b{b}+C+S4", _f(**LM, bits=b), center=True, sinks=4,
                 group="bits"))
    add(_cfg("v1-default-b4", _f(bits=4), group="bits", note="INT4 + D*H through the golden model"))
    add(_cfg("midrise-rms-near-b4+C+S4", _f(**MR, bits=4), center=True, sinks=4, group="bits"))
    # K/V bit split and layer-wise key precision
    add(_cfg("K4V3-lloydmax+C+S4", _f(**LM, bits=4), _f(**LM), center=True, sinks=4, group="kv"))
    add(_cfg("K4V2-lloydmax+C+S4", _f(**LM, bits=4), _f(**LM, bits=2), center=True, sinks=4,
             group="kv"))
    add(_cfg("K3V2-lloydmax+C+S4", _f(**LM), _f(**LM, bits=2), center=True, sinks=4, group="kv"))
    add(_cfg("K3V4-lloydmax+C+S4", _f(**LM), _f(**LM, bits=4), center=True, sinks=4, group="kv"))
    for top in (2, 4):
        add(_cfg(f"lloydmax-rms-near+C+S4+K4top{top}", _f(**LM), center=True, sinks=4,
                 layer_k={"top": top, "fmt": dict(LM, bits=4)}, group="layer"))
    add(_cfg("K4V3-lloydmax-G32+C+S4", _f(**LM, bits=4, block=32), _f(**LM, block=32),
             center=True, sinks=4, group="kv"))
    # midrise with the max rule rounded to nearest (robust to outlier channels), centered
    MM = dict(mode="midrise", scale_round="nearest")
    add(_cfg("midrise-max-near+C", _f(**MM), center=True, group="center"))
    add(_cfg("midrise-max-near+C+S4", _f(**MM), center=True, sinks=4, group="sinks"))
    add(_cfg("midrise-max-near+C+S1", _f(**MM), center=True, sinks=1, group="sinks"))
    add(_cfg("lloydmax-max-near+C+S4", _f(mode="lloydmax", scale_round="nearest"), center=True,
             sinks=4, group="sinks"))
    add(_cfg("midrise-max-up+C+S4", _f(mode="midrise"), center=True, sinks=4, group="scale"))
    add(_cfg("midrise-max-near-G32+C+S4", _f(**MM, block=32), center=True, sinks=4, group="block"))
    add(_cfg("midrise-max-near-b4+C+S4", _f(**MM, bits=4), center=True, sinks=4, group="bits"))
    add(_cfg("midrise-max-near-b2+C+S4", _f(**MM, bits=2), center=True, sinks=4, group="bits"))
    add(_cfg("K4V2-midrise-max-near+C+S4", _f(**MM, bits=4), _f(**MM, bits=2), center=True,
             sinks=4, group="kv"))
    add(_cfg("K4V3-midrise-max-near+C+S4", _f(**MM, bits=4), _f(**MM), center=True, sinks=4,
             group="kv"))
    add(_cfg("midrise-max-near+C+S4+K4top4", _f(**MM), center=True, sinks=4,
             layer_k={"top": 4, "fmt": dict(MM, bits=4)}, group="layer"))
    # robustness: the same model with strong key outlier channels (exact reparametrization
    # q.k = (q/s).(k*s): the 2 channels of largest |mu| per (layer, kv-head) x4)
    out = {"kind": "outlier", "gain": 4, "top": 2}
    for nm, k, kw in (("fp16", "fp16", {}), ("int4-asym-DH", {"int": 4, "rot": True}, {}),
                      ("v1-default", _f(), {}), ("v1-default", _f(), dict(center=True, sinks=4)),
                      ("midrise-max-near", _f(**MM), {}),
                      ("midrise-max-near", _f(**MM), dict(center=True, sinks=4)),
                      ("midrise-rms-near", _f(**MR), dict(center=True, sinks=4)),
                      ("lloydmax-rms-near", _f(**LM), {}),
                      ("lloydmax-rms-near", _f(**LM), dict(center=True, sinks=4)),
                      ("lloydmax-max-near", _f(mode="lloydmax", scale_round="nearest"),
                       dict(center=True, sinks=4)),
                      ("asym-max-near", _f(mode="asym", scale_round="nearest"),
                       dict(center=True, sinks=4))):
        suffix = "+C+S4" if kw else ""
        add(_cfg(f"{nm}{suffix}+OUT4", k, group="outlier", reparam=out, **kw))
    # query-aware per-channel key scaling (exact reparametrization, powers of two)
    for nm, kw in (("midrise-max-near", MM), ("lloydmax-rms-near", LM)):
        add(_cfg(nm + "+C+S4+QS", _f(**kw), center=True, sinks=4, group="qscale",
                 reparam={"kind": "qaware"}))
    add(_cfg("K4V3-midrise-max-near+C+S4+QS", _f(**MM, bits=4), _f(**MM), center=True, sinks=4,
             group="qscale", reparam={"kind": "qaware"}))
    add(_cfg("midrise-max-near-b4+C+S4+QS", _f(**MM, bits=4), center=True, sinks=4,
             group="qscale", reparam={"kind": "qaware"}))
    # towards 1% of fp16
    add(_cfg("K4V3-midrise-max-near-G32+C+S4", _f(**MM, bits=4, block=32), _f(**MM, block=32),
             center=True, sinks=4, group="kv"))
    add(_cfg("midrise-max-near-b4-G32+C+S4", _f(**MM, bits=4, block=32), center=True, sinks=4,
             group="bits"))
    add(_cfg("Kfp16-V4-midrise-max-near", "fp16", _f(**MM, bits=4), group="kv",
             note="keys uncompressed"))
    add(_cfg("Kfp16-V3-midrise-max-near", "fp16", _f(**MM), group="kv",
             note="keys uncompressed"))
    return c


#: The configuration recommended as the version-2 default (docs/ACCURACY.md).
RECOMMENDED = "midrise-max-near+C+S4"
#: Leading configurations, also run on the CONFIRM_STARTS contexts (less noise).
CONFIRM = ["fp16", "int4-asym", "int4-asym-DH", "published-H-midtread", "v1-default",
           "v1-default+C+S4", "midrise-max-up", "midrise-rms-near+C+S4", "lloydmax-rms-near",
           "lloydmax-rms-near+C", "lloydmax-rms-near+C+S4", "lloydmax-rms-near-G32+C+S4",
           "K4V2-lloydmax+C+S4", "K4V3-lloydmax+C+S4", "midrise-max-near", "midrise-max-near+C+S4",
           "midrise-max-near-G32+C+S4", "K4V2-midrise-max-near+C+S4", "K4V3-midrise-max-near+C+S4",
           "midrise-max-near-b4+C+S4", "midrise-max-near+C+S4+QS", "midrise-max-near+C+S4+K4top4",
           "K4V3-midrise-max-near-G32+C+S4", "K4V3-midrise-max-near+C+S4+QS",
           "midrise-max-near-b4+C+S4+QS", "Kfp16-V4-midrise-max-near"]


def spec_hash(cfg: dict) -> str:
    keep = {k: cfg[k] for k in ("k", "v", "sinks", "center", "layer_k")}
    if cfg.get("reparam"):
        keep["reparam"] = cfg["reparam"]
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:12]


# =========================================================================== quantizers
def _hadamard_orth(d: int) -> np.ndarray:
    h = np.array([[1.0]])
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(d)


def int_baseline(x: np.ndarray, bits: int, rot: bool) -> np.ndarray:
    """Naive asymmetric INT-b per vector (last axis): fp16 scale and fp16 minimum.

    x float32 [..., D]. With ``rot``, quantize (x * d) @ H / sqrt(D) and rotate back
    (d = the golden model's sign flip for seed 0).
    """
    d = x.shape[-1]
    if rot:
        sgn = np.where(sign_mask(d, 0) == 1, -1.0, 1.0)
        h = _hadamard_orth(d)
        x = (x.astype(np.float64) * sgn) @ h
    lo = x.min(axis=-1, keepdims=True).astype(np.float16).astype(np.float64)
    hi = x.max(axis=-1, keepdims=True)
    q = (1 << bits) - 1
    scale = ((hi - lo) / q).astype(np.float16).astype(np.float64)
    scale = np.where(scale > 0, scale, 1.0)
    c = np.clip(np.round((x - lo) / scale), 0, q)
    xh = c * scale + lo
    if rot:
        xh = (xh @ h) * sgn
    return xh.astype(np.float32)


#: The study's format specs are written relative to the version-1 quantizer (the
#: default when the study ran); format version 2 changed FormatParams' defaults, so
#: they are applied explicitly and every cached spec keeps its meaning.
STUDY_BASE = dict(mode="midtread", scale_round="up")


def fmt_params(kw: dict, d: int) -> FormatParams:
    kw = {**STUDY_BASE, **kw}
    n = kw.pop("n", d)
    return FormatParams(n=n, **kw)


def golden_roundtrip(x16: np.ndarray, p: FormatParams) -> np.ndarray:
    """fp16 [..., D] -> golden encode -> decode_float -> float32 (D a multiple of N)."""
    shape = x16.shape
    v = x16.reshape(-1, p.n)
    e = encode(v, p)
    return decode_float(e.codes, e.scales, p, e.zeros).astype(np.float32).reshape(shape)


def quant_spec(spec, layer: int, kind: str, cfg: dict, sens: dict | None):
    """The quantizer of (layer, kind): 'fp16', ('int', bits, rot) or FormatParams-kwargs dict."""
    if kind == "k" and cfg.get("layer_k"):
        top = cfg["layer_k"]["top"]
        if layer in set(np.argsort(-sens["k_sens"])[:top].tolist()):
            return {"fmt": cfg["layer_k"]["fmt"]}
    return spec


def apply_quant(x: np.ndarray, q, d: int) -> np.ndarray:
    """Fake-quantize float32 [..., D] (already in the stored domain, e.g. centered)."""
    if q == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if "int" in q:
        return int_baseline(x, q["int"], q["rot"])
    return golden_roundtrip(x.astype(np.float16), fmt_params(q["fmt"], d))


def elem_bits(q, d: int) -> float:
    if q == "fp16":
        return 16.0
    if "int" in q:
        return q["int"] + 32.0 / d
    return fmt_params(q["fmt"], d).bits_per_element


def average_bits(cfg: dict, n_layers: int, d: int, context: int, sens) -> float:
    """Average stored bits per K/V element for one sequence of ``context`` tokens."""
    s = min(cfg["sinks"], context)
    tot = 0.0
    for layer in range(n_layers):
        for kind in ("k", "v"):
            q = quant_spec(cfg[kind], layer, kind, cfg, sens)
            tot += (s * 16.0 + (context - s) * elem_bits(q, d)) / context
    return tot / (2 * n_layers)


def policy_of(cfg: dict, n_layers: int, d: int, sens) -> CachePolicy | None:
    """The sim_models.CachePolicy of a pure-format configuration (None for baselines)."""
    def fp(q):
        return None if q == "fp16" else fmt_params(q["fmt"], d)
    if any(q != "fp16" and "int" in q for q in (cfg["k"], cfg["v"])):
        return None
    lk = ()
    if cfg.get("layer_k"):
        top = np.argsort(-sens["k_sens"])[:cfg["layer_k"]["top"]]
        lk = tuple((int(l), fmt_params(cfg["layer_k"]["fmt"], d)) for l in sorted(top))
    return CachePolicy(k=fp(cfg["k"]), v=fp(cfg["v"]), sinks=cfg["sinks"],
                       center_keys=cfg["center"], layer_k=lk)


# =========================================================================== model hooks
class Hooked:
    """SmolLM2 with K/V fake-quantization hooks; one instance per process."""

    def __init__(self, threads: int = 1):
        import torch
        torch.set_num_threads(threads)
        import transformers.models.llama.modeling_llama as ml
        self.torch, self.ml = torch, ml
        t0 = time.perf_counter()
        self.model, self.tok = load_model(torch.float32)
        self.load_s = time.perf_counter() - t0
        cfg = self.model.config
        self.L = cfg.num_hidden_layers
        self.H = cfg.num_key_value_heads
        self.Hq = cfg.num_attention_heads
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.cfg = None            # active configuration (None: unmodified model)
        self.sens = None
        self.mu = None             # float32 [L, H, D] (fp16 values)
        self.capture = None        # dict layer -> list of post-RoPE keys (calibration)
        self.layer = None
        self.fired = {"k": 0, "v": 0}
        self._v = {}
        self._ref = {}
        self.kscale = None
        self.calib = None
        self.reset_metrics()
        self._orig_rope = ml.apply_rotary_pos_emb
        ml.apply_rotary_pos_emb = self._rope
        for i, layer in enumerate(self.model.model.layers):
            att = layer.self_attn
            att.register_forward_pre_hook(lambda m, a, i=i: setattr(self, "layer", i))
            att.v_proj.register_forward_hook(lambda m, a, o, i=i: self._vhook(i, o))
        text = load_text()
        self.ids = self.tok(text, add_special_tokens=False)["input_ids"]

    # ---------------------------------------------------------------- metrics
    def reset_metrics(self):
        self.m = {k: np.zeros(self.L) for k in ("k_num", "k_den", "v_num", "v_den", "a_num",
                                                "a_den")}

    def _quant_tokens(self, x: np.ndarray, q, sinks: int) -> np.ndarray:
        """x float32 [B, T, H, D] -> fake-quantized; the first ``sinks`` positions fp16."""
        out = apply_quant(x, q, self.D)
        if sinks:
            out[:, :sinks] = x[:, :sinks].astype(np.float16).astype(np.float32)
        return out

    def _vhook(self, layer, out):
        self.fired["v"] += 1
        if self.cfg is None:
            return None
        torch = self.torch
        b, t, _ = out.shape
        v = out.detach().float().numpy().reshape(b, t, self.H, self.D)
        q = quant_spec(self.cfg["v"], layer, "v", self.cfg, self.sens)
        vh = self._quant_tokens(v, q, self.cfg["sinks"])
        self.m["v_num"][layer] += float(np.sum((vh.astype(np.float64) - v) ** 2))
        self.m["v_den"][layer] += float(np.sum(v.astype(np.float64) ** 2))
        self._v[layer] = (out.detach().clone(), torch.from_numpy(vh.reshape(b, t, -1)))
        return self._v[layer][1].to(out.dtype)

    def _rope(self, q, k, cos, sin, *a, **kw):
        qe, ke = self._orig_rope(q, k, cos, sin, *a, **kw)
        self.fired["k"] += 1
        layer = self.layer
        if self.capture is not None:
            self.capture.setdefault(layer, []).append(
                (qe.detach().float().numpy().copy(), ke.detach().float().numpy().copy()))
        if self.cfg is None:
            return qe, ke
        torch = self.torch
        mu16 = self.mu16[layer]                                       # [H, D] fp16
        scale = self.kscale[layer] if self.kscale is not None else None
        if scale is not None:
            # exact reparametrization q.k = (q / s).(k * s), s a power of two per channel
            st = torch.from_numpy(scale)
            ke = ke * st[None, :, None, :]
            qe = qe / st.repeat_interleave(self.Hq // self.H, dim=0)[None, :, None, :]
            mu16 = (mu16.astype(np.float32) * scale).astype(np.float16)
        kn = ke.detach().float().numpy().transpose(0, 2, 1, 3)      # [B, T, H, D]
        k16 = kn.astype(np.float16)
        dom = k16
        if self.cfg["center"]:
            p = FormatParams(n=self.D, block=self.D)
            dom = center(np.ascontiguousarray(k16), np.ascontiguousarray(
                np.broadcast_to(mu16, k16.shape)), p).view(np.float16)
        qspec = quant_spec(self.cfg["k"], layer, "k", self.cfg, self.sens)
        kh = self._quant_tokens(dom.astype(np.float32), qspec, self.cfg["sinks"])
        back = kh.astype(np.float64) + (mu16.astype(np.float64) if self.cfg["center"] else 0.0)
        self.m["k_num"][layer] += float(np.sum((back - kn) ** 2))
        self.m["k_den"][layer] += float(np.sum(kn.astype(np.float64) ** 2))
        kt = torch.from_numpy(kh.transpose(0, 2, 1, 3).copy()).to(ke.dtype)
        self._attn_err(layer, qe, ke, kt)
        return qe, kt

    def _attn_err(self, layer, qe, k_ref, k_hat):
        torch = self.torch
        v_ref, v_hat = self._v.pop(layer)
        b, _, t, d = qe.shape
        rep = self.Hq // self.H
        sel = torch.arange(ATTN_STRIDE - 1, t, ATTN_STRIDE)
        mask = sel[:, None] >= torch.arange(t)[None, :]               # causal, [S, T]

        def attn(k, v):
            v = v.view(b, t, self.H, d).transpose(1, 2)
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            return torch.nn.functional.scaled_dot_product_attention(
                qe[:, :, sel], k, v, attn_mask=mask)
        with torch.no_grad():
            o_ref, o_hat = attn(k_ref, v_ref), attn(k_hat, v_hat)
        self.m["a_num"][layer] += float(((o_hat - o_ref) ** 2).sum())
        self.m["a_den"][layer] += float((o_ref ** 2).sum())

    # ---------------------------------------------------------------- runs
    def nll(self, seqs: np.ndarray, cfg: dict | None, want_logp: bool = False):
        """Total next-token NLL (nats) and count over sequences int64 [B, T] (and the
        log-probabilities [B*(T-1), vocab] of the predicting positions if ``want_logp``)."""
        torch = self.torch
        self.cfg = cfg
        self.kscale = key_scales(cfg.get("reparam"), self.calib) if cfg else None
        self.fired = {"k": 0, "v": 0}
        x = torch.tensor(seqs, dtype=torch.long)
        with torch.no_grad():
            out = self.model(input_ids=x, use_cache=False)
        assert self.fired == {"k": self.L, "v": self.L}, f"hooks fired {self.fired}"
        logits = out.logits[:, :-1].float()
        logits = logits.reshape(-1, logits.shape[-1])
        ce = torch.nn.functional.cross_entropy(logits, x[:, 1:].reshape(-1), reduction="sum")
        self.cfg = None
        logp = torch.log_softmax(logits, dim=-1) if want_logp else None
        return float(ce), int(x[:, 1:].numel()), logp

    def ref_logp(self, start: int):
        """fp16-cache log-probabilities of the 2048-token context at ``start`` (cached)."""
        if start not in self._ref:
            ref = _cfg("fp16", "fp16")
            self._ref[start] = self.nll(self.tokens(start, CTX)[None, :], ref, True)[2]
        return self._ref[start]

    def tokens(self, start: int, count: int) -> np.ndarray:
        if start + count > len(self.ids):
            raise ValueError(f"text has only {len(self.ids)} tokens")
        return np.asarray(self.ids[start:start + count], dtype=np.int64)

    def set_calibration(self, calib: dict):
        self.mu16 = calib["mu"].astype(np.float16)
        self.sens = {"k_sens": calib["k_sens"], "v_sens": calib["v_sens"]}
        self.calib = calib



# =========================================================================== calibration
def calibrate(hm: Hooked, out: Path) -> dict:
    """mu (mean post-RoPE key, positions >= MU_SKIP) and per-layer sensitivities."""
    seqs = hm.tokens(CALIB_TOKENS[0], CALIB_TOKENS[1] - CALIB_TOKENS[0]).reshape(-1, CTX)
    hm.capture = {}
    hm.nll(seqs, None)[:2]
    cap, hm.capture = hm.capture, None
    keys = [cap[l][0][1][:, :, MU_SKIP:] for l in range(hm.L)]             # [B, H, T, D]
    mu = np.stack([k.mean(axis=(0, 2)) for k in keys])                      # [L, H, D]
    mu16 = mu.astype(np.float16)
    k_energy = np.stack([((k - m16.astype(np.float32)[None, :, None, :]) ** 2).mean(axis=(0, 2))
                         for k, m16 in zip(keys, mu16)])                    # [L, H, D]
    q_energy = np.stack([(cap[l][0][0][:, :, MU_SKIP:] ** 2).mean(axis=(0, 2))
                         for l in range(hm.L)])                             # [L, Hq, D]
    del keys, cap
    hm.mu16 = mu16
    hm.sens = None
    sens = {}
    for kind in ("k", "v"):
        cfg = _cfg("calib", "fp16", group="calib", center=True)
        cfg[kind] = {"fmt": CALIB_FORMAT}
        hm.reset_metrics()
        hm.nll(seqs, cfg)[:2]
        sens[kind] = np.sqrt(hm.m["a_num"] / hm.m["a_den"])
    calib = {"mu": mu16, "k_sens": sens["k"], "v_sens": sens["v"], "k_energy": k_energy,
             "q_energy": q_energy}
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **calib, calib_tokens=np.array(CALIB_TOKENS), mu_skip=np.int64(MU_SKIP),
             calib_format=np.array(json.dumps(CALIB_FORMAT)), model=np.array(MODEL_NAME),
             note=np.array("mu: mean post-RoPE key per (layer, kv-head) over calibration "
                           "positions >= mu_skip; k_sens/v_sens: per-layer attention-output "
                           "relative error with only that kind quantized (calib_format, "
                           "keys centered), all layers at once; k_energy: E (k - mu)^2 and "
                           "q_energy: E q^2 per channel (post-RoPE, positions >= mu_skip)"))
    return calib


def load_calibration(path: Path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in ("mu", "k_sens", "v_sens", "k_energy", "q_energy") if k in z}


def key_scales(reparam: dict | None, calib: dict) -> np.ndarray | None:
    """Per-channel power-of-two key scales s [L, H, D] (float32) of an exact reparametrization
    q.k = (q / s).(k * s), or None.

    ``{"kind": "outlier", "gain": g, "top": t}``: multiply the t channels of largest |mu| of
    every (layer, kv-head) by g: an outlier-heavy model with *identical* fp16 outputs, to
    test robustness (the held-back model has strong key outlier channels).
    ``{"kind": "qaware"}``: s_i = (E q_i^2 / E (k_i - mu_i)^2)^(1/4) rounded to a power of
    two (geometric mean 1, |log2 s| <= 4), which minimises E (q . dk)^2 for a rotation-
    isotropic key error dk: the key error is moved to channels the queries do not read.
    """
    if not reparam:
        return None
    mu = calib["mu"].astype(np.float32)
    if reparam["kind"] == "outlier":
        s = np.ones_like(mu)
        top = np.argsort(-np.abs(mu), axis=-1)[..., :reparam["top"]]
        np.put_along_axis(s, top, float(reparam["gain"]), axis=-1)
        return s
    if reparam["kind"] == "qaware":
        hq, h = calib["q_energy"].shape[1], mu.shape[1]
        b = calib["q_energy"].reshape(mu.shape[0], h, hq // h, -1).mean(axis=2)
        a = np.maximum(calib["k_energy"], 1e-12)
        e = 0.25 * np.log2(np.maximum(b, 1e-12) / a)
        e = np.clip(np.round(e - e.mean(axis=-1, keepdims=True)), -4, 4)
        return np.exp2(e).astype(np.float32)
    raise ValueError(f"unknown reparam kind {reparam['kind']!r}")


# =========================================================================== evaluation
def evaluate(hm: Hooked, cfg: dict, start: int, chunks: bool) -> dict:
    toks = hm.tokens(start, CTX)
    ref = hm.ref_logp(start)
    t0 = time.perf_counter()
    hm.reset_metrics()
    nll, cnt, logp = hm.nll(toks[None, :], cfg, True)
    kl = float((ref.exp() * (ref - logp)).sum(dim=-1).mean())
    m = hm.m
    safe = lambda a, b: (a / np.where(b > 0, b, 1)).tolist()  # noqa: E731
    r = {"ppl_2048": math.exp(nll / cnt), "nll_2048": nll, "n_2048": cnt, "kl_2048": kl,
         "k_relmse": safe(m["k_num"], m["k_den"]), "v_relmse": safe(m["v_num"], m["v_den"]),
         "attn_err": np.sqrt(safe(m["a_num"], m["a_den"])).tolist()}
    if chunks:
        nll, cnt, _ = hm.nll(toks.reshape(-1, CHUNK), cfg)
        r["ppl_512"] = math.exp(nll / cnt)
    r["seconds"] = time.perf_counter() - t0
    return r


def run(args) -> int:
    allc = configurations()
    if args.list:
        for c in allc:
            print(f"{c['group']:9s} {c['name']}")
        return 0
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results.setdefault("configs", {})
    results.setdefault("confirm", {})
    if not args.report_only:
        names = set(args.only.split(",")) if args.only else None
        todo = [c for c in allc if names is None or c["name"] in names]
        if names and len(todo) != len(names):
            print(f"unknown names: {names - {c['name'] for c in todo}}", file=sys.stderr)
            return 2
        hm = Hooked(args.threads)
        print(f"loaded {MODEL_NAME} in {hm.load_s:.0f} s; {len(hm.ids)} tokens of text", flush=True)
        if args.calibrate or not CALIB.exists():
            t0 = time.perf_counter()
            calibrate(hm, CALIB)
            print(f"calibration written to {CALIB} ({time.perf_counter() - t0:.0f} s)", flush=True)
        calib = load_calibration(CALIB)
        hm.set_calibration(calib)
        results["meta"] = {
            "model": MODEL_NAME, "layers": hm.L, "kv_heads": hm.H, "q_heads": hm.Hq,
            "head_dim": hm.D, "context": CTX, "chunk": CHUNK, "eval_tokens": [EVAL_START,
                                                                            EVAL_START + CTX],
            "confirm_starts": list(CONFIRM_STARTS),
            "calib_tokens": list(CALIB_TOKENS), "calib_file": str(CALIB.relative_to(REPO)),
            "k_sens": calib["k_sens"].tolist(), "v_sens": calib["v_sens"].tolist(),
            "attn_stride": ATTN_STRIDE, "torch_threads": args.threads}
        jobs = [(c, "configs", c["name"], EVAL_START, not args.no_chunks) for c in todo]
        if args.confirm:
            jobs += [(c, "confirm", f"{c['name']}@{st}", st, False) for st in CONFIRM_STARTS
                     for c in allc if c["name"] in CONFIRM and (names is None or c["name"] in names)]
        for c, where, key, start, chunks in jobs:
            h = spec_hash(c)
            old = results[where].get(key)
            if old and old.get("hash") == h and not args.force and "kl_2048" in old and (
                    not chunks or "ppl_512" in old):
                continue
            r = evaluate(hm, c, start, chunks)
            r.update(hash=h, name=c["name"], group=c["group"], note=c["note"],
                     spec={k: c[k] for k in ("k", "v", "sinks", "center", "layer_k", "reparam")},
                     bits_2048=average_bits(c, hm.L, hm.D, CTX, hm.sens),
                     bits_512=average_bits(c, hm.L, hm.D, CHUNK, hm.sens))
            pol = policy_of(c, hm.L, hm.D, hm.sens)
            if pol is not None:
                pb = pol.bits_per_element(hm.L, hm.H, hm.D, CTX)
                assert abs(pb - r["bits_2048"]) < 1e-12, (pb, r["bits_2048"])
            if c.get("layer_k"):
                r["layer_k_layers"] = sorted(int(l) for l in np.argsort(
                    -hm.sens["k_sens"])[:c["layer_k"]["top"]])
            r["start"] = start
            results[where][key] = r
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(results, indent=1))
            print(f"{where:7s} {key:40s} bits {r['bits_2048']:.3f} ppl2048 "
                  f"{r['ppl_2048']:.3f} kl {r['kl_2048']:.4f} ppl512 "
                  f"{r.get('ppl_512', float('nan')):.3f} ({r['seconds']:.0f} s)", flush=True)
    report(results, allc)
    return 0


# =========================================================================== report
def _pareto(points):
    """Indices of the Pareto-optimal (bits, ppl) points (lower is better in both)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    best, keep = float("inf"), []
    for i in order:
        if points[i][1] < best:
            keep.append(i)
            best = points[i][1]
    return set(keep)


def report(results: dict, allc: list[dict]):
    rs = results.get("configs", {})
    names = [c["name"] for c in allc if c["name"] in rs and c["group"] != "outlier"]
    onames = [c["name"] for c in allc if c["name"] in rs and c["group"] == "outlier"]
    if not names:
        return
    fp = rs.get("fp16", {}).get("ppl_2048")
    pts = [(rs[n]["bits_2048"], rs[n]["ppl_2048"]) for n in names]
    par = _pareto(pts)
    fp512 = rs.get("fp16", {}).get("ppl_512")
    lines = ["| group | configuration | bits/elem (2048) | PPL 2048 | vs fp16 | KL vs fp16 | "
             "PPL 512 | vs fp16 | mean K relMSE | mean V relMSE | mean attn err | Pareto |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, n in enumerate(names):
        r = rs[n]
        rel = f"{100 * (r['ppl_2048'] / fp - 1):+.1f}%" if fp else ""
        p512 = f"{r['ppl_512']:.2f}" if "ppl_512" in r else ""
        r512 = f"{100 * (r['ppl_512'] / fp512 - 1):+.1f}%" if fp512 and p512 else ""
        lines.append(f"| {r['group']} | `{n}` | {r['bits_2048']:.3f} | {r['ppl_2048']:.2f} | "
                     f"{rel} | {r.get('kl_2048', float('nan')):.4f} | {p512} | {r512} | "
                     f"{np.mean(r['k_relmse']):.4f} | "
                     f"{np.mean(r['v_relmse']):.4f} | {np.mean(r['attn_err']):.4f} | "
                     f"{'*' if i in par else ''} |")
    table = "\n".join(lines)
    ctab = confirm_table(results)
    otab = ""
    if onames and "fp16+OUT4" in rs:
        fo = rs["fp16+OUT4"]["ppl_2048"]
        ol = ["| configuration | bits/elem | PPL 2048 | vs fp16 | KL | same config on the plain "
              "model: PPL, KL | mean K relMSE |", "|---|---|---|---|---|---|---|"]
        for n in onames:
            r = rs[n]
            base = rs.get(n.replace("+OUT4", ""))
            bs = f"{base['ppl_2048']:.2f}, {base['kl_2048']:.4f}" if base else ""
            ol.append(f"| `{n}` | {r['bits_2048']:.3f} | {r['ppl_2048']:.2f} | "
                      f"{100 * (r['ppl_2048'] / fo - 1):+.1f}% | {r['kl_2048']:.4f} | {bs} | "
                      f"{np.mean(r['k_relmse']):.4f} |")
        otab = "\n".join(ol)
    # per-layer table for a few configurations
    show = [n for n in ("v1-default", "midrise-max-near", RECOMMENDED,
                        "K4V3-midrise-max-near+C+S4") if n in rs]
    L = len(rs[names[0]]["k_relmse"])
    pl = ["| layer | " + " | ".join(f"K relMSE `{n}`" for n in show) + " | "
          + " | ".join(f"V relMSE `{n}`" for n in show) + " | "
          + " | ".join(f"attn err `{n}`" for n in show) + " |",
          "|---|" + "---|" * (3 * len(show))]
    for l in range(L):
        pl.append(f"| {l} | " + " | ".join(f"{rs[n]['k_relmse'][l]:.4f}" for n in show) + " | "
                  + " | ".join(f"{rs[n]['v_relmse'][l]:.4f}" for n in show) + " | "
                  + " | ".join(f"{rs[n]['attn_err'][l]:.4f}" for n in show) + " |")
    per_layer = "\n".join(pl)
    block = (f"<!-- BEGIN TABLE (generated by bench/accuracy.py; do not edit by hand) -->\n"
             f"### All configurations (evaluation context)\n\n{table}\n\n"
             + (f"### Four contexts (tokens {EVAL_START} and {', '.join(map(str, CONFIRM_STARTS))}, "
                f"2048 each)\n\n{ctab}\n\n" if ctab else "")
             + (f"### Outlier robustness (keys x4 on the 2 largest-|mu| channels per head, "
                f"exact reparametrization: fp16 output unchanged)\n\n{otab}\n\n" if otab else "")
             + f"### Per layer\n\n{per_layer}\n<!-- END TABLE -->")
    if DOC.exists():
        doc = DOC.read_text()
        a, b = doc.find("<!-- BEGIN TABLE"), doc.find("<!-- END TABLE -->")
        if a >= 0 and b > a:
            doc = doc[:a] + block + doc[b + len("<!-- END TABLE -->"):]
        else:
            doc = doc + "\n\n" + block + "\n"
    else:
        doc = "# Accuracy of the format on SmolLM2-135M\n\n" + block + "\n"
    DOC.write_text(doc)
    _plot(rs, names, par, fp)


def confirm_contexts(results: dict, name: str):
    """[(ppl, kl, fp16 ppl)] over the evaluation context and the confirm contexts."""
    rs, conf = results.get("configs", {}), results.get("confirm", {})
    out = []
    for st in (EVAL_START,) + CONFIRM_STARTS:
        r = rs.get(name) if st == EVAL_START else conf.get(f"{name}@{st}")
        f = rs.get("fp16") if st == EVAL_START else conf.get(f"fp16@{st}")
        if r is None or f is None:
            return None
        out.append((r["ppl_2048"], r.get("kl_2048", float("nan")), f["ppl_2048"]))
    return out


def confirm_table(results: dict) -> str:
    rows = []
    for n in CONFIRM:
        cc = confirm_contexts(results, n)
        if cc is None:
            continue
        b = results["configs"][n]["bits_2048"]
        ratios = [p / f for p, _, f in cc]
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        rows.append(f"| `{n}` | {b:.3f} | " + " | ".join(f"{p:.2f}" for p, _, _ in cc)
                    + f" | {100 * (geo - 1):+.1f}% | {100 * (min(ratios) - 1):+.1f}% .. "
                    f"{100 * (max(ratios) - 1):+.1f}% | {np.mean([k for _, k, _ in cc]):.4f} |")
    if not rows:
        return ""
    head = ("| configuration | bits/elem | " + " | ".join(
        f"PPL @{st}" for st in (EVAL_START,) + CONFIRM_STARTS)
        + " | vs fp16 (geo. mean) | range | mean KL |\n|---|---|" + "---|" * (len(CONFIRM_STARTS) + 4))
    return head + "\n" + "\n".join(rows)


def _plot(rs, names, par, fp):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 6.5))
    colors = {"baseline": "k", "mode": "tab:blue", "mult": "tab:cyan", "center": "tab:green",
              "sinks": "tab:olive", "scale": "tab:purple", "block": "tab:brown",
              "bits": "tab:red", "kv": "tab:orange", "layer": "tab:pink", "qscale": "gold"}
    for i, n in enumerate(names):
        r = rs[n]
        if n == "fp16":
            continue
        ax.scatter(r["bits_2048"], r["ppl_2048"], c=colors.get(r["group"], "gray"), s=22,
                   marker="*" if i in par else "o", zorder=3)
    for g, col in colors.items():
        ax.scatter([], [], c=col, label=g)
    front = sorted((rs[names[i]]["bits_2048"], rs[names[i]]["ppl_2048"], names[i]) for i in par
                   if names[i] != "fp16")
    ax.plot([f[0] for f in front], [f[1] for f in front], "k--", lw=1, label="Pareto frontier")
    for b, p, n in front:
        if b <= 4.8:
            ax.annotate(n, (b, p), fontsize=6, xytext=(4, 2), textcoords="offset points")
    for n in ("published-H-midtread", "v1-default", "int4-asym", "int3-asym"):
        if n in rs and n not in [f[2] for f in front]:
            ax.annotate(n, (rs[n]["bits_2048"], rs[n]["ppl_2048"]), fontsize=6,
                        xytext=(4, 2), textcoords="offset points")
    rec = RECOMMENDED
    if rec in rs:
        ax.scatter(rs[rec]["bits_2048"], rs[rec]["ppl_2048"], s=160, facecolors="none",
                   edgecolors="r", lw=1.5, zorder=4, label=f"recommended: {rec}")
    xmax = 4.8
    off = [n for n in names if rs[n]["bits_2048"] > xmax and n != "fp16"]
    if off:
        ax.text(0.99, 0.02, "off scale: " + "; ".join(
            f"{n} ({rs[n]['bits_2048']:.2f} bits, PPL {rs[n]['ppl_2048']:.2f})" for n in off),
            transform=ax.transAxes, ha="right", va="bottom", fontsize=6)
    ax.set_xlim(2.0, xmax)
    if fp:
        ax.axhline(fp, color="gray", lw=1, label=f"fp16 {fp:.2f}")
        ax.axhline(fp * 1.05, color="gray", lw=0.8, ls=":", label="fp16 + 5%")
        ax.axhline(fp * 1.01, color="gray", lw=0.8, ls="-.", label="fp16 + 1%")
    ax.set_yscale("log")
    ax.set_xlabel("average stored bits per K/V element (2048-token context)")
    ax.set_ylabel("perplexity (2048-token context, log scale)")
    ax.set_title("SmolLM2-135M, all post-RoPE K and V fake-quantized")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated configuration names")
    ap.add_argument("--list", action="store_true", help="print configuration names")
    ap.add_argument("--force", action="store_true", help="recompute cached results")
    ap.add_argument("--no-chunks", action="store_true", help="skip the 4 x 512-token run")
    ap.add_argument("--confirm", action="store_true",
                    help="also run the leading configurations on a second 2048-token context")
    ap.add_argument("--calibrate", action="store_true", help="recompute the calibration file")
    ap.add_argument("--report-only", action="store_true", help="tables and plot from the JSON")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
