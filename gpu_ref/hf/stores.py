"""The stores behind a packed layer of :class:`gpu_ref.hf.PackedCache`: the golden model (NumPy) and the
project's kernels (gpu_ref's plan/run API). Every call from the integration into gpu_ref is in
:class:`_CudaStore`.
"""

from __future__ import annotations

import numpy as np

from sim_models import CachePolicy, FormatParams, KeyTables, decode_float, encode
from sim_models.codec import encode_folded
from sim_models.keyscale import front_table, key_front


def _torch():
    import torch
    return torch


def layer_policy(fmts, sinks, kvh, d, mu16=None, s16=None, recent=0):
    """One layer's (CachePolicy, KeyTables or None) as gpu_ref.KVCache takes them: the layer's K/V formats,
    sinks, recent ring, centering vector ``mu16`` [KVH, D] fp16 and power-of-two key scales ``s16`` [KVH, D]
    fp16."""
    policy = CachePolicy(k=fmts[0], v=fmts[1], sinks=sinks, center_keys=mu16 is not None,
                         key_scale=None if s16 is None else "pow2", recent=recent)
    tables = None
    if mu16 is not None or s16 is not None:
        mu = np.zeros((kvh, d), np.float16) if mu16 is None else mu16
        e = None if s16 is None else np.log2(s16.astype(np.float64)).astype(np.int8)[None]
        tables = KeyTables("layer", mu[None], e)
    return policy, tables


class _GoldenStore:
    """Golden-model store: encodes with ``sim_models.encode`` (keys with a key front end:
    ``sim_models.codec.encode_folded``, FORMAT.md 8) and keeps the reconstructions.

    Tensors (torch, on ``device``): ``hat[kind]`` float32 ``[B, KVH, CAP, D]`` (decode_float, or
    the 16-bit value for sinks / unquantized kinds); ``codes[kind]``/``scales[kind]`` NumPy uint8
    ``[B, KVH, CAP, D/N, bytes]`` (zeros for sink rows). With ``ring`` (a sliding-window layer,
    ``cap`` = the window W, no sinks) token ``p`` lives in row ``p % W`` and only the last W tokens
    are kept; attention reads the ``min(length, W)`` rows in ring order (softmax does not depend
    on the order of the keys). With ``recent`` R (the policy's recent ring) ``raw[kind]`` keeps the
    16-bit values beside ``hat`` (keys in the front end's domain) and a query reads the R most recent
    tokens (its own included, sinks excluded) from ``raw``: :func:`recent_rows`.
    """

    def __init__(self, fmts, sinks, batch, kvh, cap, d, torch_dtype, device, hq=None, mu16=None, s16=None,
                 ring=False, recent=0):
        torch = _torch()
        if ring and sinks:
            raise ValueError(f"a ring (sliding-window layer) keeps no sinks, got sinks={sinks}")
        self.fmts, self.sinks, self.dtype, self.ring, self.rows = fmts, sinks, torch_dtype, ring, cap
        self.recent = min(recent, cap) if ring else recent
        self._prev = None        # ring: the window before the last multi-token append (attend_chunk)
        # the key front end (FORMAT.md 8) as the golden model defines it: packed keys by the folded rule
        # (sim_models.codec.encode_folded from the raw keys), side rows (sinks, the recent ring) by the fp16
        # rule sim_models.keyscale.key_front
        self._fe = FormatParams(n=d, block=min(64, d))
        self._front = None
        if mu16 is not None or s16 is not None:
            e = (np.zeros((kvh, d), np.int8) if s16 is None
                 else np.log2(s16.astype(np.float64)).astype(np.int8))
            mu = np.zeros((kvh, d), np.float16) if mu16 is None else mu16
            self._front = (front_table(mu, e, self._fe), e)
        self._q_div = None if s16 is None else torch.as_tensor(s16.astype(np.float32), device=device)
        self.hat = {k: torch.zeros(batch, kvh, cap, d, dtype=torch.float32, device=device) for k in "kv"}
        self.raw = ({k: torch.zeros(batch, kvh, cap, d, dtype=torch.float32, device=device) for k in "kv"}
                    if self.recent else None)
        self.codes, self.scales = {}, {}
        for kind, f in zip("kv", fmts):
            if f is not None:
                self.codes[kind] = np.zeros((batch, kvh, cap, d // f.n, f.code_bytes), np.uint8)
                self.scales[kind] = np.zeros((batch, kvh, cap, d // f.n, f.n_blocks), np.uint8)
        self.length = 0

    def keys_in(self, k16):
        """Keys ``[B, KVH, T, D]`` (torch fp16) -> their 16-bit rows in the key front end's domain (torch fp16;
        sinks and the recent ring keep them): ``sim_models.keyscale.key_front``."""
        torch = _torch()
        if self._front is None:
            return k16
        mu_s, e = self._front
        bits = k16.cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
        bits = key_front(bits, mu_s[None, :, None, :], e[None, :, None, :], self._fe)
        return torch.from_numpy(bits.view(np.int16)).view(torch.float16).to(k16.device)

    def query(self, q):
        """Queries float32 ``[B, Hq, ..., D]`` -> ``q / s`` (the key scales' reparametrization)."""
        if self._q_div is None:
            return q
        rep = q.shape[1] // self._q_div.shape[0]
        div = self._q_div.repeat_interleave(rep, 0)
        return q / div.reshape(1, q.shape[1], *([1] * (q.dim() - 3)), q.shape[-1])

    def append(self, k16, v16):
        """k16, v16: torch 16-bit ``[B, KVH, T, D]`` (keys before the key front end)."""
        torch = _torch()
        k_raw, k16 = k16, self.keys_in(k16)
        t0, t = self.length, k16.shape[2]
        if self.ring:
            return self._append_ring(k16, v16, t0, t, k_raw)
        for kind, x, f in (("k", k16, self.fmts[0]), ("v", v16, self.fmts[1])):
            xf = x.float()
            out = xf.clone()
            if f is not None:
                e = self._encode(k_raw if kind == "k" else x, f, kind == "k")
                b, h, _, d = x.shape
                rec = decode_float(e.codes, e.scales, f, e.zeros).reshape(b, h, t, d)
                first = max(0, min(self.sinks - t0, t))         # rows of this chunk that are sinks
                out[:, :, first:] = torch.from_numpy(rec[:, :, first:].astype(np.float32)).to(x.device)
                self.codes[kind][:, :, t0 + first:t0 + t] = e.codes[:, :, first:]
                self.scales[kind][:, :, t0 + first:t0 + t] = e.scales[:, :, first:]
            self.hat[kind][:, :, t0:t0 + t] = out
            if self.raw is not None:
                self.raw[kind][:, :, t0:t0 + t] = x.float()
        self.length += t

    def _encode(self, x, f, key=False):
        """16-bit ``[B, KVH, T, D]`` -> ``sim_models.Encoded`` ``[B, KVH, T, D/N]`` of format ``f``; ``key``:
        ``x`` are keys before the key front end, encoded by the folded rule with this store's tables (when
        it has a key front end)."""
        torch = _torch()
        bits = x.cpu().contiguous().view(torch.int16).numpy().view(np.uint16)
        b, h, t, d = bits.shape
        bits = bits.reshape(b, h, t, d // f.n, f.n)
        if key and self._front is not None:
            mu_s, e = (a.reshape(1, h, 1, d // f.n, f.n) for a in self._front)
            return encode_folded(bits, mu_s.view(np.uint16), e, f)
        return encode(bits, f)

    def _reconstruct(self, x, f, k_raw=None):
        """16-bit ``[B, KVH, T, D]`` -> (float32 reconstructions, codes, scales) of format ``f`` (None: 16-bit);
        ``k_raw``: the keys before the key front end (``x`` is then their rows in its domain), which encode."""
        torch = _torch()
        if f is None:
            return x.float(), None, None
        b, h, t, d = x.shape
        e = self._encode(x if k_raw is None else k_raw, f, k_raw is not None)
        rec = decode_float(e.codes, e.scales, f, e.zeros).reshape(b, h, t, d)
        return torch.from_numpy(rec.astype(np.float32)).to(x.device), e.codes, e.scales

    def window(self, raw=False):
        """The rows a query attends to now, oldest first: float32 (k, v) ``[B, KVH, min(length, rows), D]``
        (``raw``: the 16-bit values instead of the reconstructions)."""
        torch = _torch()
        n, w = self.length, self.rows
        src = self.raw if raw else self.hat
        if not self.ring or n <= w:
            return src["k"][:, :, :n], src["v"][:, :, :n]
        order = torch.arange(n - w, n, device=self.hat["k"].device) % w
        return src["k"][:, :, order], src["v"][:, :, order]

    def _append_ring(self, k16, v16, t0, t, k_raw):
        torch = _torch()
        w = self.rows
        if t > 1:                                   # attend_chunk reads the window before this chunk
            self._prev = tuple(x.clone() for x in self.window())
            if self.raw is not None:
                self._prev_raw = tuple(x.clone() for x in self.window(raw=True))
        keep = min(t, w)
        rows = (np.arange(t0 + t - keep, t0 + t) % w)
        rows_t = torch.as_tensor(rows, device=self.hat["k"].device)
        self._chunk = {}
        for kind, x, f in (("k", k16, self.fmts[0]), ("v", v16, self.fmts[1])):
            rec, codes, scales = self._reconstruct(x, f, k_raw if kind == "k" else None)
            self._chunk[kind] = rec
            self.hat[kind][:, :, rows_t] = rec[:, :, t - keep:]
            if self.raw is not None:
                self.raw[kind][:, :, rows_t] = x[:, :, t - keep:].float()
                self._chunk["raw_" + kind] = x.float()
            if codes is not None:
                self.codes[kind][:, :, rows] = codes[:, :, t - keep:]
                self.scales[kind][:, :, rows] = scales[:, :, t - keep:]
        self.length += t

    def attend_chunk(self, q, scaling, window=None):
        """Causal attention of the last T tokens' queries ``[B, Hq, T, D]`` (float32) over the stored
        reconstructions, each query seeing the tokens up to its own (and, with ``window`` W, only the
        last W of them) -> float32 ``[B, T, Hq, D]`` (``prefill="packed"``: the fake-quant forward)."""
        torch = _torch()
        t, n = q.shape[2], self.length
        q = self.query(q)
        kr = vr = None
        if self.ring:
            pk, pv = self._prev if t > 1 else self.window()
            if t > 1:
                k, v = (torch.cat([p, self._chunk[x]], 2) for p, x in ((pk, "k"), (pv, "v")))
            else:
                k, v = pk, pv
            if self.raw is not None:
                rk, rv = self._prev_raw if t > 1 else self.window(raw=True)
                kr, vr = ((torch.cat([p, self._chunk["raw_" + x]], 2) for p, x in ((rk, "k"), (rv, "v")))
                          if t > 1 else (rk, rv))
            kpos = torch.arange(n - k.shape[2], n, device=q.device)
        else:
            k, v = self.hat["k"][:, :, :n], self.hat["v"][:, :, :n]
            if self.raw is not None:
                kr, vr = self.raw["k"][:, :, :n], self.raw["v"][:, :, :n]
            kpos = torch.arange(n, device=q.device)
        qpos = torch.arange(n - t, n, device=q.device)[:, None]
        mask = kpos[None, :] <= qpos
        if window is not None:
            mask &= kpos[None, :] > qpos - window
        if kr is not None:
            fresh = recent_rows(qpos, kpos[None, :], self.sinks, self.recent)
            return mixed_attention(q, (k, v), (kr, vr), mask, fresh, scaling).transpose(1, 2)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)
        return o.transpose(1, 2)

    def attend(self, q, scaling):
        """q float32 ``[B, Hq, D]`` -> float32 ``[B, Hq, D]``."""
        torch = _torch()
        q = self.query(q)
        k, v = self.window()
        if self.raw is not None:
            kr, vr = self.window(raw=True)
            n = k.shape[2]
            fresh = recent_rows(self.length - 1, self.length - n + torch.arange(n, device=q.device),
                                self.sinks, self.recent)
            k, v = torch.where(fresh[:, None], kr, k), torch.where(fresh[:, None], vr, v)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = torch.nn.functional.scaled_dot_product_attention(q.float()[:, :, None], k, v, scale=scaling)
        return o[:, :, 0]

    def nbytes(self):
        """Bytes of the stored format (:meth:`sim_models.CachePolicy.stored_bits` of these formats
        and sinks at this capacity: packed vectors, fp16 sink rows, 16-bit unquantized kinds;
        flags, which the golden store does not keep, excluded)."""
        b, h, cap, d = self.hat["k"].shape
        pol = CachePolicy(k=self.fmts[0], v=self.fmts[1], sinks=self.sinks, recent=self.recent)
        return b * pol.stored_bits(1, h, d, cap) // 8


def recent_rows(qpos, kpos, sinks: int, recent: int):
    """Which keys a query reads from the recent ring (16-bit) rather than through their codes: key
    position ``kpos`` is one of the ``recent`` most recent tokens of query position ``qpos`` (its own
    included) and not a sink (sinks are 16-bit anyway). Broadcasting torch/NumPy ints -> bool."""
    return (kpos > qpos - recent) & (kpos >= sinks)


def mixed_attention(q, quant, raw, mask, fresh, scaling):
    """Attention of float32 queries ``[B, Hq, T, D]`` over keys / values read from ``raw`` (16-bit values)
    where ``fresh`` ``[T, K]`` holds and from ``quant`` (reconstructions) elsewhere, under ``mask`` ``[T, K]``
    -> ``[B, Hq, T, D]`` (golden: float32 scores and softmax)."""
    torch = _torch()
    (k, v), (kr, vr) = quant, raw
    rep = q.shape[1] // k.shape[1]
    k, v, kr, vr = (x.repeat_interleave(rep, 1) for x in (k, v, kr, vr))
    s = torch.where(fresh, q @ kr.transpose(-1, -2), q @ k.transpose(-1, -2)) * scaling
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
    return (p * fresh) @ vr + (p * ~fresh) @ v


def recent_per_query(side, before, kc, vc, t, n, sinks, recent):
    """Packed prefill over a recent ring: query i of a chunk of ``t`` tokens (length ``m = n - t + i + 1``)
    reads its own ring, the tokens ``[max(sinks, m - recent), m)``. ``side``: the side rows per query,
    int16 bits ``[B * t, KVH, rows, D]`` (the current rows, repeated; rewritten in place); ``before``: the
    side rows before the chunk was written (k, v) ``[B, KVH, rows, D]``; ``kc``, ``vc``: the chunk
    ``[B, KVH, t, D]`` (keys in the key front end's domain)."""
    from gpu_ref.cache import side_row
    torch = _torch()
    dev, b = kc.device, kc.shape[0]
    qi, pos = [], []
    for i in range(t):
        m = n - t + i + 1
        p = np.arange(max(sinks, m - recent), m)
        qi.append(np.full(p.size, i)), pos.append(p)
    qi, pos = np.concatenate(qi), np.concatenate(pos)
    rows = side_row(pos, sinks, recent)
    new = pos >= n - t
    for x, src, old in zip(side, (kc, vc), before):
        x = x.view(b, t, *x.shape[1:])
        if (~new).any():
            qo, ro = torch.as_tensor(qi[~new], device=dev), torch.as_tensor(rows[~new], device=dev)
            x[:, qo, :, ro] = old[:, :, ro].permute(2, 0, 1, 3)
        qn, rn = torch.as_tensor(qi[new], device=dev), torch.as_tensor(rows[new], device=dev)
        pn = torch.as_tensor(pos[new] - (n - t), device=dev)
        x[:, qn, :, rn] = src[:, :, pn].view(torch.int16).permute(2, 0, 1, 3)


class _StreamHandle:
    """A raw ``cudaStream_t`` under the CUDA stream protocol (``__cuda_stream__``, version 0)."""

    def __init__(self, ptr: int):
        self.ptr = int(ptr)

    def __cuda_stream__(self):
        return (0, self.ptr)


class _CudaStore:
    """The project's kernels through gpu_ref's plan/run API; every call into gpu_ref is in this class.

    Planes: one :class:`gpu_ref.KVCache` (K and V formats, ``sinks`` 16-bit side rows). Appends
    launch the write kernel straight into the planes (rows computed on the device from the
    device lengths when one token is appended per sequence) and update the device lengths in
    place; decode runs a plan with a workspace and an output buffer owned here (one per
    power-of-two length bucket). A decode step therefore allocates nothing on the CuPy side and
    copies nothing between host and device: a whole model step can be captured in a CUDA graph
    (bench.gpu.hf, tests/test_hf.py). With ``pow2_rows`` the packed rows per sequence are a
    power of two, so the planes double as a pool of one page per sequence and :meth:`attend_chunk`
    can point every query of a chunk at its sequence's page (one decode launch, per-query lengths).

    With ``ring`` (a sliding-window layer: ``cap`` = the window W, no sinks) token ``p`` is written to
    row ``p % W`` and the kernel's length is ``min(p + 1, W)``: the decode kernel reads rows
    ``0 .. length - 1`` of a sequence, which are then exactly the window (in ring order, which
    softmax does not see). The absolute positions are a device counter, so a decode step stays
    free of host copies (graph-capturable). No kernel change: plan/run have no start offset, the
    ring needs none.

    With ``recent`` R (the policy's recent ring): a full layer writes every token's codes as before and
    also its 16-bit row into side row ``sinks + (p - sinks) % R`` (:func:`gpu_ref.cache.side_row`); the
    kernel, planned with ``sinks + R`` side rows, reads the packed tokens before the last R. A sliding
    layer keeps r = min(R, W) side rows (token ``p`` in row ``p % r``) and W - r packed rows: a token is
    encoded (from its side row, already in the key front end's domain) when it leaves the side ring,
    into packed row ``p % (W - r)``, so the kernel's ``min(length, W) - r`` packed rows are the window's
    older tokens. Decode steps compute these rows from the device counters (graph-capturable); before
    the first eviction a step encodes a row nobody reads yet, which the real eviction overwrites before
    it is read.
    """

    _streams: dict = {}

    def __init__(self, fmts, sinks, batch, kvh, cap, d, torch_dtype, device, hq, pow2_rows=False, mu16=None,
                 s16=None, ring=False, recent=0):
        import cupy as cp
        from gpu_ref import KVCache
        torch = _torch()
        if ring and (sinks or pow2_rows):
            raise ValueError("a ring (sliding-window layer) keeps no sinks and has no packed-prefill rows")
        self.ring, self.window = ring, cap
        self.bf16 = torch_dtype != torch.float16
        self.hq, self.sinks = hq, sinks
        self.recent = min(recent, cap) if ring else recent
        packed = max(cap - sinks - (self.recent if ring else 0), 1)
        self._wp = packed if ring else None                    # packed rows of a sliding layer's window
        if pow2_rows:
            packed = max(64, 1 << (packed - 1).bit_length())
        policy, tables = layer_policy(fmts, sinks, kvh, d, mu16, s16, self.recent)
        with self._stream():
            self.kv = KVCache(batch, kvh, packed + sinks, policy, tables=tables)
            self._dlen = self.kv.lengths                       # device int32 [B], updated in place
            rows = self.kv.k_codes.shape[2]
            # plane row of packed token 0 of (b, h), in the write kernel's input order [B, (T,) KVH]
            self._base = ((cp.arange(batch, dtype=cp.int64)[:, None] * kvh
                           + cp.arange(kvh, dtype=cp.int64)[None, :]) * rows)
        self._rows = rows
        self._base_t = torch.from_dlpack(self._base)
        self._dlen_t = torch.from_dlpack(self._dlen)
        self._dpos_t = torch.zeros(batch, dtype=torch.int64, device=device) if ring else None   # tokens seen
        self._sink_t = None
        if self.kv.side:                                       # torch views of the side planes (uint16 bits)
            self._sink_t = [torch.from_dlpack(a.view(cp.int16)) for a in (self.kv.k_sink, self.kv.v_sink)]
        # a sliding layer with a ring and a key front end: the ring's keys before the front end, which the write
        # kernel encodes (the folded key front end) when their token leaves the ring
        self._ring_raw = (torch.zeros(batch, kvh, self.recent, d, dtype=torch.int16, device=device)
                          if ring and 0 < self.recent < cap and self.kv._key is not None else None)
        self._plans = {}
        self._chunk_side = None                                # packed prefill: (side rows before, chunk rows)
        self._packed_prefill = pow2_rows
        self.length = 0

    @classmethod
    def _stream(cls):
        import cupy
        cur = _torch().cuda.current_stream()
        key = (cur.cuda_stream, cur.device.index)
        s = cls._streams.get(key)
        if s is None:
            wrap = getattr(cupy.cuda.Stream, "from_external", None)      # CuPy >= 14 (ExternalStream deprecated)
            s = cls._streams[key] = (wrap(_StreamHandle(cur.cuda_stream)) if wrap is not None
                                     else cupy.cuda.ExternalStream(cur.cuda_stream, cur.device.index))
        return s

    @staticmethod
    def _cp(x):
        """torch 16-bit (or fp32 / int) tensor -> cupy view (bf16 as uint16 bits)."""
        import cupy
        torch = _torch()
        x = x.contiguous()
        if x.dtype == torch.bfloat16:
            return cupy.from_dlpack(x.view(torch.int16)).view(cupy.uint16)
        return cupy.from_dlpack(x)

    def _front(self, k16):
        """Keys ``[B, KVH, T, D]`` -> the key front end's domain (same tensor without one)."""
        return key_domain(self.kv, k16.transpose(1, 2)).transpose(1, 2)

    def _encode(self, k, v, rows, key):
        """Write kernel: ``k``, ``v`` ``[B, KVH, T, D]`` into the flat plane rows ``rows`` (torch int64, the
        order ``[B, T, KVH]``); ``key``: apply the key front end (False: keys already in its domain)."""
        from gpu_ref.encode import launch_encode
        kv = self.kv
        with self._stream():
            for x, p, codes, scales, flags, kf, lay in (
                    (k, kv.params, kv.k_codes, kv.k_scales, kv.k_flags, kv._key if key else None, "wire"),
                    (v, kv.v_params, kv.v_codes, kv.v_scales, kv.v_flags, None, kv.layout)):
                bits = self._cp(x.transpose(1, 2))                                        # [B, T, KVH, D]
                launch_encode(bits, p, codes, scales, flags, self._cp(rows), _cupy(), key=kf, layout=lay,
                              pair_vec=bits.shape[-2])

    def append(self, k16, v16):
        """k16, v16: torch 16-bit ``[B, KVH, T, D]`` (keys before the key front end, which the write kernel
        applies), all sequences at ``self.length``."""
        torch = _torch()
        t0, t = self.length, k16.shape[2]
        if self.ring:
            self._append_ring(k16, v16, t0, t)
        else:
            ns = max(0, min(self.sinks - t0, t))               # leading tokens of the chunk that are sinks
            if ns:                                             # sink keys in the front end's domain too
                self._sink_t[0][:, :, t0:t0 + ns] = self._front(k16[:, :, :ns]).view(torch.int16)
                self._sink_t[1][:, :, t0:t0 + ns] = v16[:, :, :ns].view(torch.int16)
            if self.recent:
                self._append_recent(k16, v16, t0, t)
            if t > ns and t == 1:                              # from the device lengths: graph-safe
                rows = (self._base_t + (self._dlen_t.long() - self.sinks)[:, None]).reshape(-1)
            elif t > ns:
                pos = torch.arange(t0 + ns - self.sinks, t0 + t - self.sinks, device=k16.device)
                rows = (self._base_t[:, None, :] + pos[None, :, None]).reshape(-1)
            if t > ns:
                self._encode(k16[:, :, ns:], v16[:, :, ns:], rows, True)
        self.length += t
        if self.ring:
            self._dpos_t += t
            self._dlen_t.copy_(torch.clamp(self._dpos_t, max=self.window))
            self.kv.host_lengths[:] = min(self.length, self.window)
        else:
            self._dlen_t += t
            self.kv.host_lengths[:] = self.length

    def _append_recent(self, k16, v16, t0, t):
        """A full layer's recent ring: the chunk's last tokens (past the sinks) into their side rows."""
        from gpu_ref.cache import side_row
        torch = _torch()
        s, r = self.sinks, self.recent
        lo = max(s, t0, t0 + t - r)                             # first position of the chunk in the ring
        if lo >= t0 + t:
            return
        if t > 1 and self._packed_prefill:                      # attend_chunk reads the ring per query
            self._chunk_side = ([x.clone() for x in self._sink_t], self._front(k16), v16)
        ks = self._front(k16[:, :, lo - t0:])
        vs = v16[:, :, lo - t0:]
        if t == 1:                                              # graph-safe: the row from the device length
            row = s + (self._dlen_t.long() - s) % r                                   # [B]
            b = torch.arange(k16.shape[0], device=k16.device)
            self._sink_t[0][b, :, row] = ks[:, :, 0].view(torch.int16)
            self._sink_t[1][b, :, row] = vs[:, :, 0].view(torch.int16)
        else:
            row = torch.as_tensor(side_row(np.arange(lo, t0 + t), s, r), device=k16.device)
            self._sink_t[0][:, :, row] = ks.view(torch.int16)
            self._sink_t[1][:, :, row] = vs.view(torch.int16)

    def _append_ring(self, k16, v16, t0, t):
        """A sliding layer: the last W tokens, row ``p % W``; with a recent ring of r rows, the side ring
        (row ``p % r``) and W - r packed rows (``p % (W - r)``) that a token enters when it leaves the ring."""
        torch = _torch()
        w, r, dev = self.window, self.recent, k16.device
        if not r:
            keep = min(t, w)
            k16, v16 = k16[:, :, t - keep:], v16[:, :, t - keep:]
            if t == 1:
                rows = (self._base_t + (self._dpos_t % w)[:, None]).reshape(-1)
            else:
                pos = torch.arange(t0 + t - keep, t0 + t, device=dev) % w
                rows = (self._base_t[:, None, :] + pos[None, :, None]).reshape(-1)
            self._encode(k16, v16, rows, True)
            return
        wp, b = self._wp, torch.arange(k16.shape[0], device=dev)
        if t == 1:                                             # graph-safe: rows from the device position
            slot = self._dpos_t % r                                                   # [B]
            if r < w:                                          # the token leaving the ring: slot's row
                old = [x[b, :, slot][:, :, None].view(k16.dtype) for x in self._sink_t]   # [B, KVH, 1, D]
                raw = self._ring_raw is not None
                if raw:                                        # its key before the front end
                    old[0] = self._ring_raw[b, :, slot][:, :, None].view(k16.dtype)
                rows = (self._base_t + ((self._dpos_t - r) % wp)[:, None]).reshape(-1)
                self._encode(old[0], old[1], rows, raw)
                if raw:
                    self._ring_raw[b, :, slot] = k16[:, :, 0].view(torch.int16)
            self._sink_t[0][b, :, slot] = self._front(k16)[:, :, 0].view(torch.int16)
            self._sink_t[1][b, :, slot] = v16[:, :, 0].view(torch.int16)
            return
        from gpu_ref.cache import sliding_moves
        q, p, ring = sliding_moves(t0, t0 + t, w, r)
        raw = self._ring_raw is not None
        if q.size:                                              # leave the ring: from their side rows
            sl = torch.as_tensor(q % r, device=dev)
            old = [x[:, :, sl].view(k16.dtype) for x in self._sink_t]
            if raw:                                             # keys: from the ring's keys before the front end
                old[0] = self._ring_raw[:, :, sl].view(k16.dtype)
            rows = (self._base_t[:, None, :] + torch.as_tensor(q % wp, device=dev)[None, :, None]).reshape(-1)
            self._encode(old[0], old[1], rows, raw)
        if p.size:                                              # never in the ring: from the input
            rows = (self._base_t[:, None, :] + torch.as_tensor(p % wp, device=dev)[None, :, None]).reshape(-1)
            self._encode(k16[:, :, p - t0], v16[:, :, p - t0], rows, True)
        p = ring
        sl = torch.as_tensor(p % r, device=dev)
        self._sink_t[0][:, :, sl] = self._front(k16[:, :, p - t0]).view(torch.int16)
        self._sink_t[1][:, :, sl] = v16[:, :, p - t0].view(torch.int16)
        if raw and r < w:
            self._ring_raw[:, :, sl] = k16[:, :, p - t0].view(torch.int16)

    def _plan(self, key, make):
        if key not in self._plans:
            with self._stream():
                pl = make()
                self._plans[key] = (pl, pl.workspace())
        return self._plans[key]

    def attend(self, q, scaling, num_splits=None):
        """q float32 ``[B, Hq, D]`` -> float32 ``[B, Hq, D]`` (the kernel reads q / s with key scales;
        ``num_splits``: the split-KV factor, None: planned)."""
        torch = _torch()
        q16 = q.to(torch.bfloat16 if self.bf16 else torch.float16)
        n = min(self.length, self.window) if self.ring else self.length
        # the longest length the kernel is given: a sliding layer's window (its ring's rows are side rows,
        # not packed rows the cache's capacity counts)
        cap = self.window if self.ring else self.kv.capacity
        bucket = min(cap, 1 << max(n - 1, 63).bit_length())
        qdt = "bf16" if self.bf16 else "fp16"
        pl, ws = self._plan((bucket, num_splits),
                            lambda: self.kv.plan(self.hq, bucket, q_dtype=qdt, num_splits=num_splits))
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        with self._stream():
            self.kv.run(pl, ws, self._cp(q16), scale=float(scaling), out=self._cp(out), out_dtype="fp32")
        return out

    def attend_chunk(self, q, scaling, num_splits=None):
        """Causal attention of the chunk's queries ``[B, Hq, T, D]`` (float32; the kernel reads q / s with
        key scales; the chunk is the last T cached tokens) over the packed cache: query i of sequence b
        reads the first ``length - T + i + 1`` tokens of b (sinks included) -> float32 ``[B, T, Hq, D]``.
        One decode launch of B*T queries, each pointed at its sequence's page (``pow2_rows``)."""
        import cupy as cp
        torch = _torch()
        if self.ring:
            raise NotImplementedError("attend_chunk on a ring (sliding-window layer)")
        b, hq, t, d = q.shape
        kv, n = self.kv, self.length
        q16 = q.transpose(1, 2).reshape(b * t, hq, d).to(torch.bfloat16 if self.bf16 else torch.float16)
        key = ("chunk", b * t, n, num_splits)
        pl, ws = self._plan(key, lambda: _dec_plan(kv, b * t, hq, n, self._rows, num_splits,
                                                   "bf16" if self.bf16 else "fp16"))
        lengths = torch.arange(n - t + 1, n + 1, dtype=torch.int32, device=q.device).repeat(b)
        table = torch.arange(b, dtype=torch.int32, device=q.device).repeat_interleave(t)[:, None]
        out = torch.empty(b * t, hq, d, dtype=torch.float32, device=q.device)
        from gpu_ref.decode import run_planes
        with self._stream():
            sink = {}
            if self.kv.side:
                side = [x.repeat_interleave(t, 0) for x in self._sink_t]                 # [B*T, KVH, side, D]
                if self.recent and t > 1:
                    recent_per_query(side, *self._chunk_side, t, n, self.sinks, self.recent)
                sink = {f"{k}_sink": self._cp(x).view(cp.uint16) for k, x in zip("kv", side)}
            run_planes(pl, ws, self._cp(q16), kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales, self._cp(lengths),
                       self._cp(table), q_scale=kv.q_scale, scale=float(scaling), out=self._cp(out), out_dtype="fp32",
                       layout=kv.layout, **sink)
        return out.reshape(b, t, hq, d)

    def set_length(self, n: int):
        self.length = n
        m = min(n, self.window) if self.ring else n
        self.kv.host_lengths[:] = m
        self._dlen_t.fill_(m)
        if self.ring:
            self._dpos_t.fill_(n)

    def nbytes(self):
        kv = self.kv
        return sum(a.nbytes for a in (kv.k_codes, kv.v_codes, kv.k_scales, kv.v_scales, kv.k_flags, kv.v_flags,
                                      kv.k_sink, kv.v_sink) if a is not None)


def key_domain(kv, keys):
    """16-bit keys ``[..., KVH, D]`` (torch, on the GPU) -> the key front end's domain under the
    table of ``kv`` (a :class:`gpu_ref.KVCache`; the write kernel's rule, for the 16-bit side rows);
    ``keys`` itself without a table."""
    from gpu_ref.encode import key_front as gpu_key_front
    if kv._key is None:
        return keys
    keys = keys.contiguous()
    out = _torch().empty_like(keys)             # torch's allocator: safe inside a CUDA graph capture
    with _CudaStore._stream():
        gpu_key_front(_CudaStore._cp(keys), kv._key, _cupy(), out=_CudaStore._cp(out))
    return out


def _cupy():
    import cupy
    return cupy


def _dec_plan(kv, queries, hq, max_length, rows, num_splits=None, q_dtype="fp16"):
    """Plan of :meth:`_CudaStore.attend_chunk`: ``queries`` sequences over a pool of one page of
    ``rows`` tokens per cached sequence."""
    from gpu_ref import plan
    return plan(kv.params, kv.v_params, batch=queries, q_heads=hq, kv_heads=kv.kv_heads, max_length=max_length,
                page_size=rows, max_pages=1, sinks=kv.side, num_splits=num_splits,
                key_scales=kv.q_scale is not None, q_dtype=q_dtype, layout=kv.layout)


