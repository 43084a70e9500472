"""K/V fake quantization inside any transformers model, through its attention interface.

``register()`` adds the attention implementation :data:`ATTN_NAME` to transformers'
``AttentionInterface`` (and its mask function, sdpa's, to ``AttentionMaskInterface``).
Every attention layer of a model loaded with ``attn_implementation=ATTN_NAME`` calls
:func:`fake_quant_attention` with the post-RoPE (post k-norm, for Gemma 3) keys and the
values it would cache, [batch, kv_heads, tokens, head_dim]; while a :class:`KVFakeQuant`
is active, they are replaced by their reconstructions (keys first centered with the
golden model's ``center`` when the configuration says so, and reparametrized by
per-channel key scales with the inverse scales on the queries), then attention runs as
transformers' sdpa. No architecture's module is patched: Llama, Qwen2 and Gemma 3 (with
its sliding-window layers: the mask comes from transformers) go through the same path.

Peers that keep recent tokens unquantized (bench.accuracy.peers, ``windowed``) need a
different key/value set per query: their layers run :func:`windowed_attention`, which mixes,
per (query, cached token), the fp16 and the quantized key and value. The study's own fp16
ring of recent tokens (``recent``, :func:`recent_mask`) runs the same way, its fp16 keys
taken in the stored domain (centered and scaled, as the sinks).
"""

from __future__ import annotations

import math

import numpy as np

from sim_models import FormatParams, center, scale_keys

from .kvquant import roundtrip
from .peers import Peer

ATTN_NAME = "fwht_kv_study"
#: attention error on every ATTN_STRIDE-th query position
ATTN_STRIDE = 8

_ACTIVE: "KVFakeQuant | None" = None


def register():
    """Register :data:`ATTN_NAME` with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(ATTN_NAME, fake_quant_attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)


def fake_quant_attention(module, query, key, value, attention_mask, **kwargs):
    """The registered attention function (transformers' signature; returns (output, None))."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if _ACTIVE is not None:
        query, key, value = _ACTIVE.transform(module, query, key, value, attention_mask, kwargs)
        win, _ACTIVE.pending = _ACTIVE.pending, None
        if win is not None:
            kf, vf, kfn, vfn = win
            if isinstance(kfn, RecentMask) and query.shape[2] == kf.shape[2]:
                return ring_attention(query, kf, key, vf, value, attention_mask, kfn.recent,
                                      kwargs.get("scaling")), None
            return windowed_attention(query, kf, key, vf, value, attention_mask, kfn, vfn,
                                      kwargs.get("scaling")), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def windowed_attention(query, k_full, k_hat, v_full, v_hat, mask, k_fn, v_fn, scaling=None,
                       q_pos=None, chunk: int = 256):
    """Causal attention where each query reads some cached tokens unquantized.

    Args:
        query: [B, Hq, Q, D]; k_full/k_hat, v_full/v_hat: [B, H, T, D] fp16 and quantized
            keys / values (Hq a multiple of H).
        mask: None (causal), bool [B, 1, Q, T] (True: attend) or additive float [B, 1, Q, T].
        k_fn, v_fn: ``full_mask(q_pos, k_pos)`` of the key / value peer (bool [Q', T]: read
            the fp16 token), or None (always the quantized one).
        scaling: score scale (default 1/sqrt(D)); q_pos: int positions of the queries
            (default 0..Q-1).

    Returns:
        [B, Q, Hq, D] (sdpa_attention_forward's layout).
    """
    torch = __import__("torch")
    b, hq, nq, d = query.shape
    t = k_hat.shape[2]
    rep = hq // k_hat.shape[1]
    ex = lambda x: x.repeat_interleave(rep, dim=1).to(query.dtype)  # noqa: E731
    kf, kh, vf, vh = ex(k_full), ex(k_hat), ex(v_full), ex(v_hat)
    scale = d ** -0.5 if scaling is None else scaling
    qp = np.arange(nq) if q_pos is None else np.asarray(q_pos)
    kp = np.arange(t)
    out = torch.empty(b, hq, nq, d, dtype=query.dtype, device=query.device)
    dev = query.device
    for a in range(0, nq, chunk):
        e = min(a + chunk, nq)
        q = query[:, :, a:e]
        s = q @ kh.transpose(-1, -2)
        if k_fn is not None:
            km = torch.from_numpy(k_fn(qp[a:e], kp)).to(dev)
            s = torch.where(km, q @ kf.transpose(-1, -2), s)
        s = s * scale
        if mask is None:
            s = s.masked_fill(torch.from_numpy(kp[None, :] > qp[a:e, None]).to(dev), -math.inf)
        elif mask.dtype == torch.bool:
            s = s.masked_fill(~mask[:, :, a:e], -math.inf)
        else:
            s = s + mask[:, :, a:e]
        p = torch.softmax(s.float(), dim=-1).to(query.dtype)
        if v_fn is not None:
            vm = torch.from_numpy(v_fn(qp[a:e], kp)).to(dev, query.dtype)
            out[:, :, a:e] = (p * vm) @ vf + (p * (1 - vm)) @ vh
        else:
            out[:, :, a:e] = p @ vh
    return out.transpose(1, 2).contiguous()


class RecentMask:
    """``full_mask(q_pos, k_pos)`` of an fp16 ring of the ``recent`` most recent tokens: the
    query at t reads k_pos in (t - recent, t] in fp16 (bool [Q, K])."""

    def __init__(self, recent: int):
        self.recent = recent

    def __call__(self, q_pos, k_pos):
        return k_pos[None, :] > q_pos[:, None] - self.recent


def recent_mask(recent: int) -> RecentMask:
    """The :class:`RecentMask` of a ring of ``recent`` tokens."""
    return RecentMask(recent)


def ring_attention(query, k_full, k_hat, v_full, v_hat, mask, recent: int, scaling=None):
    """:func:`windowed_attention` with :func:`recent_mask` (``recent``) for every query of the
    sequence (query i at position i), computed as attention over the quantized tokens plus
    the fp16 - quantized differences on the ``recent`` diagonals of the score and weight
    matrices (the same result at the cost of one attention).

    Returns:
        [B, Q, Hq, D] (sdpa_attention_forward's layout).
    """
    torch = __import__("torch")
    b, hq, t, d = query.shape
    rep = hq // k_hat.shape[1]
    ex = lambda x: x.repeat_interleave(rep, dim=1).to(query.dtype)  # noqa: E731
    kh, vh = ex(k_hat), ex(v_hat)
    dk, dv = ex(k_full) - kh, ex(v_full) - vh
    scale = d ** -0.5 if scaling is None else scaling
    s = query @ kh.transpose(-1, -2)
    for o in range(min(recent, t)):               # s[i, i - o] += q_i . dk_(i - o)
        s.diagonal(offset=-o, dim1=-2, dim2=-1).add_(
            (query[:, :, o:] * dk[:, :, :t - o]).sum(-1))
    s = s * scale
    if mask is None:
        causal = torch.ones(t, t, dtype=torch.bool, device=query.device).triu(1)
        s = s.masked_fill(causal, -math.inf)
    elif mask.dtype == torch.bool:
        s = s.masked_fill(~mask, -math.inf)
    else:
        s = s + mask
    p = torch.softmax(s.float(), dim=-1).to(query.dtype)
    out = p @ vh
    for o in range(min(recent, t)):               # out_i += p[i, i - o] * dv_(i - o)
        out[:, :, o:] += p.diagonal(offset=-o, dim1=-2, dim2=-1)[..., None] * dv[:, :, :t - o]
    return out.transpose(1, 2).contiguous()


class KVFakeQuant:
    """What the attention function does for one forward pass (use as a context manager).

    Args:
        n_layers, n_kv_heads, head_dim: the model's shape.
        quantizers: per layer, (key quantizer, value quantizer) (bench.accuracy.kvquant), or None to
            leave K/V untouched (capture only).
        sinks: leading positions kept fp16.
        mu16: float16 [L, H, D] key centering vectors, or None (no centering).
        kscale: float32 [L, H, D] power-of-two key scales of a bench reparametrization
            (bench.accuracy.kvquant.key_scales), or None.
        key_s16: float16 [L, H, D] key scales applied by the golden model
            (sim_models.scale_keys, after centering; queries divided by them), or None.
        transforms: per layer, a list of sim_models.HeadTransform per kv head for the keys,
            or None.
        capture: accumulate per-channel key/query statistics (calibration) when True.
        recent: the most recent tokens each query reads in fp16 (:func:`recent_mask`), 0: none.
        metrics: accumulate K/V relative MSE and attention-output error per layer.
        key_fold: encode keys with the folded key front end (sim_models.codec.encode_folded,
            tables ``RN16(mu s)`` and ``log2 s``) instead of the key front end then encode; the
            sinks and the ring keep the key front end's fp16 rows. Needs mu16 and key_s16.
    """

    def __init__(self, n_layers, n_kv_heads, head_dim, quantizers=None, sinks=0, mu16=None,
                 kscale=None, capture=False, metrics=True, mu_skip=0, key_s16=None,
                 transforms=None, capture_stride=4, recent=0, key_fold=False):
        import torch
        if key_fold and (mu16 is None or key_s16 is None or kscale is not None
                         or transforms is not None):
            raise ValueError("key_fold needs mu16 and key_s16, and no kscale or transforms")
        self.key_fold = key_fold
        self.recent = recent
        self.torch = torch
        self.key_s16, self.transforms = key_s16, transforms
        self.capture_stride = capture_stride
        self.L, self.H, self.D = n_layers, n_kv_heads, head_dim
        self.quantizers, self.sinks, self.mu16, self.kscale = quantizers, sinks, mu16, kscale
        self.metrics = metrics
        self.mu_skip = mu_skip
        self.fired = np.zeros(n_layers, dtype=np.int64)
        z = lambda: np.zeros(n_layers)  # noqa: E731
        self.m = {k: z() for k in ("k_num", "k_den", "v_num", "v_den", "a_num", "a_den")}
        self.stats = {} if capture else None
        self.pending = None        # a windowed peer layer's (k16, v16, k_fn, v_fn)

    def __enter__(self):
        global _ACTIVE
        if _ACTIVE is not None:
            raise RuntimeError("another KVFakeQuant is active")
        _ACTIVE = self
        return self

    def __exit__(self, *exc):
        global _ACTIVE
        _ACTIVE = None
        return False

    # ------------------------------------------------------------------------------ per layer
    def _quant(self, x: np.ndarray, q, transforms=None) -> np.ndarray:
        """float32 [B, H, T, D] -> reconstruction; the first ``sinks`` positions fp16."""
        out = roundtrip(x, q, transforms)
        s = self.sinks
        if s:
            out[:, :, :s] = x[:, :, :s].astype(np.float16).astype(np.float32)
        return out

    def _quant_folded(self, k16: np.ndarray, dom: np.ndarray, mu_s: np.ndarray,
                      s16: np.ndarray, q) -> np.ndarray:
        """Keys float16 [B, H, T, D] -> reconstructions of ``k s - mu_s`` through the folded
        key front end (per kv head its tables: ``mu_s`` float16 [H, D], ``s16`` powers of two
        [H, D]); the first ``sinks`` positions are the key front end's fp16 rows ``dom``."""
        from sim_models import decode_float
        from sim_models.codec import encode_folded
        if not isinstance(q, FormatParams):
            raise ValueError(f"key_fold applies to the study's formats, got {type(q).__name__}")
        e = np.log2(s16.astype(np.float64)).astype(np.int64)
        out = np.empty(k16.shape, np.float32)
        for h in range(k16.shape[1]):
            kh = np.ascontiguousarray(k16[:, h]).reshape(-1, q.n)
            enc = encode_folded(kh, mu_s[h].view(np.uint16), e[h], q)
            out[:, h] = decode_float(enc.codes, enc.scales, q).astype(np.float32).reshape(
                k16[:, h].shape)
        s = self.sinks
        if s:
            out[:, :, :s] = dom[:, :, :s].astype(np.float32)
        return out

    def _capture(self, layer, q, k):
        s = self.mu_skip
        kk = k[:, :, s:].detach().double()
        qq = q[:, :, s:].detach().double()
        acc = self.stats.setdefault(layer, {"n": 0, "k": 0.0, "k2": 0.0, "q2": 0.0, "qq": 0.0,
                                             "ks": []})
        acc["n"] += kk.shape[0] * kk.shape[2]
        acc["k"] = acc["k"] + kk.sum(dim=(0, 2)).cpu().numpy()
        acc["k2"] = acc["k2"] + (kk ** 2).sum(dim=(0, 2)).cpu().numpy()
        acc["q2"] = acc["q2"] + (qq ** 2).sum(dim=(0, 2)).cpu().numpy()
        # second-moment matrix of the queries per query head [Hq, D, D] (selection loss)
        acc["qq"] = acc["qq"] + self.torch.einsum("bhtd,bhte->hde", qq, qq).cpu().numpy()
        # a sample of keys [H, T', D] (every capture_stride-th position)
        acc["ks"].append(kk[:, :, ::self.capture_stride].permute(1, 0, 2, 3)
                         .reshape(kk.shape[1], -1, kk.shape[3]).float().cpu().numpy())

    def transform(self, module, query, key, value, mask, kwargs):
        torch = self.torch
        layer = module.layer_idx
        self.fired[layer] += 1
        if self.stats is not None:
            self._capture(layer, query, key)
        if self.quantizers is None:
            return query, key, value
        kq, vq = self.quantizers[layer]
        mu16 = None if self.mu16 is None else self.mu16[layer]                   # [H, D]
        s16 = None if self.key_s16 is None else self.key_s16[layer]              # [H, D]
        tr = None if self.transforms is None else self.transforms[layer]
        if self.kscale is not None:
            st = torch.from_numpy(self.kscale[layer]).to(query.device)           # [H, D]
            rep = query.shape[1] // key.shape[1]
            key = key * st[None, :, None, :]
            query = query / st.repeat_interleave(rep, dim=0)[None, :, None, :]
            if mu16 is not None:
                mu16 = (mu16.astype(np.float32) * self.kscale[layer]).astype(np.float16)
        k = key.detach().float().cpu().numpy()                                    # [B, H, T, D]
        k16 = k.astype(np.float16)
        dom = k16
        p16 = FormatParams(n=self.D, block=min(64, self.D))
        q_ref = query
        if s16 is not None:             # keys k * s, mu * s (sim_models/keyscale.py), queries q / s
            sb = np.ascontiguousarray(np.broadcast_to(s16[None, :, None, :], k16.shape))
            dom = scale_keys(np.ascontiguousarray(dom), sb, p16).view(np.float16)
            if mu16 is not None:
                mu16 = scale_keys(mu16, s16, FormatParams(n=self.D)).view(np.float16)
            st = torch.from_numpy(s16.astype(np.float32)).to(query.device)
            rep = query.shape[1] // key.shape[1]
            query = query / st.repeat_interleave(rep, dim=0)[None, :, None, :].to(query.dtype)
        if mu16 is not None:
            m = np.ascontiguousarray(np.broadcast_to(mu16[None, :, None, :], k16.shape))
            dom = center(np.ascontiguousarray(dom), m, p16).view(np.float16)
        if self.key_fold:
            kh = self._quant_folded(k16, dom, mu16, s16, kq)
        else:
            kh = self._quant(dom.astype(np.float32), kq, tr)
        v = value.detach().float().cpu().numpy()
        vh = self._quant(v, vq)
        k_hat = torch.from_numpy(kh).to(key.device, key.dtype)
        v_hat = torch.from_numpy(vh).to(value.device, value.dtype)
        fn = [q.full_mask if isinstance(q, Peer) and q.windowed else None for q in (kq, vq)]
        if fn[0] or fn[1]:
            if s16 is not None or mu16 is not None or self.kscale is not None or self.sinks:
                raise ValueError("windowed peers take no key centering, scales or sinks")
            kf = torch.from_numpy(k16.astype(np.float32)).to(key.device, key.dtype)
            vf = torch.from_numpy(v.astype(np.float16).astype(np.float32)).to(value.device,
                                                                              value.dtype)
            self.pending = (kf, vf, fn[0], fn[1])
        elif self.recent:
            kf = torch.from_numpy(dom.astype(np.float32)).to(key.device, key.dtype)
            vf = torch.from_numpy(v.astype(np.float16).astype(np.float32)).to(value.device,
                                                                              value.dtype)
            full = recent_mask(self.recent)
            self.pending = (kf, vf, full, full)
        if self.metrics:
            back = kh.astype(np.float64) + (0.0 if mu16 is None else
                                             mu16.astype(np.float64)[None, :, None, :])
            if s16 is not None:
                back = back / s16.astype(np.float64)[None, :, None, :]
            self.m["k_num"][layer] += float(np.sum((back - k) ** 2))
            self.m["k_den"][layer] += float(np.sum(k.astype(np.float64) ** 2))
            self.m["v_num"][layer] += float(np.sum((vh.astype(np.float64) - v) ** 2))
            self.m["v_den"][layer] += float(np.sum(v.astype(np.float64) ** 2))
            self._attn_err(module, layer, q_ref, query, key, value, k_hat, v_hat, mask, kwargs,
                           self.pending)
        return query, k_hat, v_hat

    def _attn_err(self, module, layer, query, q_hat, k_ref, v_ref, k_hat, v_hat, mask, kwargs,
                  window=None):
        """||o_hat - o||^2 and ||o||^2 on every ATTN_STRIDE-th query (same queries; o with
        the unquantized K/V; for centered keys k_ref is the uncentered key, which gives the
        same attention output as k_ref - mu; q_hat: the query the quantized keys are read
        with, query / s under key scales)."""
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        torch = self.torch
        t = query.shape[2]
        sel = torch.arange(ATTN_STRIDE - 1, t, ATTN_STRIDE, device=query.device)
        if mask is None:
            m = (sel[:, None] >= torch.arange(k_ref.shape[2], device=query.device)[None, :])[None, None]
        else:
            m = mask[:, :, sel]
        kw = {k: v for k, v in kwargs.items() if k in ("scaling", "dropout")}
        with torch.no_grad():
            o_ref = sdpa_attention_forward(module, query[:, :, sel], k_ref, v_ref, m, **kw)[0]
            if window is None:
                o_hat = sdpa_attention_forward(module, q_hat[:, :, sel], k_hat, v_hat, m, **kw)[0]
            else:
                kf, vf, kfn, vfn = window
                o_hat = windowed_attention(q_hat[:, :, sel], kf, k_hat, vf, v_hat, m, kfn, vfn,
                                           kw.get("scaling"), q_pos=sel.cpu().numpy())
        self.m["a_num"][layer] += float(((o_hat - o_ref) ** 2).sum())
        self.m["a_den"][layer] += float((o_ref ** 2).sum())

    def check_fired(self, times: int = 1):
        """Raise if some layer's attention did not run ``times`` times in this pass."""
        if not (self.fired == times).all():
            raise RuntimeError(f"attention hook fired {self.fired.tolist()} times per layer, "
                               f"expected {times}: is the model loaded with "
                               f"attn_implementation={ATTN_NAME!r}?")

    def relative(self) -> dict:
        """Per-layer k_relmse, v_relmse, attn_err (lists)."""
        m = self.m
        safe = lambda a, b: a / np.where(b > 0, b, 1)  # noqa: E731
        return {"k_relmse": safe(m["k_num"], m["k_den"]).tolist(),
                "v_relmse": safe(m["v_num"], m["v_den"]).tolist(),
                "attn_err": np.sqrt(safe(m["a_num"], m["a_den"])).tolist()}
