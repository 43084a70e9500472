"""Packed K/V cache of one attention layer on the GPU, in the layout the decode kernel reads.

Policy (sim_models.policy.CachePolicy, per layer): key and value formats (bits 3 or 4 each), the
first ``sinks`` tokens of every sequence kept unquantized in side planes, the ``recent`` most recent
tokens kept unquantized too (a ring in the same side planes, after the sinks, beside the tokens'
codes: the decode kernel reads ``sinks + recent`` side rows and the packed tokens before them), key centering (mu per kv
head, sim_models.center) and per-channel power-of-two key scales ``s`` (keys stored as
``k * s - mu * s``, queries read as ``q / s``: q.k is unchanged up to the constant q.mu, to which
softmax is invariant). Layout: contiguous ``[B, KVH, CAP, *]`` planes, or a pool of fixed-size pages
with a per-sequence block table (vLLM/FlashInfer convention); pages are handed out on append. The value
code plane of 3-bit values in 64-lane blocks is stored in the token-pair order of :mod:`gpu_ref.layout`
(``layout == "vpair"``, written so by the write kernel and read so by the decode kernel); every other
plane, and other value formats, in the golden byte order (``"wire"``). :meth:`KVCache.host_planes`
exports the golden bytes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sim_models import CachePolicy, KeyTables

from . import backend as _backend
from . import decode as _dec
from ._build import check_cupy_array, cupy
from .encode import as_bits, key_front, key_table, launch_encode
from .layout import to_wire, vpair_supported


def side_row(pos, sinks: int, recent: int):
    """Side-plane row of token positions ``pos`` (ints or an int array): sink ``p < sinks`` in row ``p``,
    a later token in its ring row ``sinks + (p - sinks) % recent`` (it is the ring's while it is one of
    the ``recent`` most recent tokens)."""
    pos = np.asarray(pos, np.int64)
    if not recent:
        return pos
    return np.where(pos < sinks, pos, sinks + (pos - sinks) % recent)


def sliding_moves(t0: int, end: int, window: int, recent: int):
    """Where the tokens of a sliding-window layer with a recent ring go when positions ``t0 .. end - 1`` are
    appended (window W, r = ``recent`` <= W fp16 side rows, token ``p`` in side row ``p % r``, and W - r
    packed rows, token ``p`` in packed row ``p % (W - r)``): NumPy int arrays (``leave``, ``direct``,
    ``ring``) of positions: ``leave`` leave the side ring and are encoded from their side rows (keys with a
    key front end from the keys before it, which the stores keep beside them), ``direct`` are encoded from
    the input (they never enter the ring), ``ring`` go to their side rows. Only tokens
    still in the window after the append are written, so the packed rows then hold exactly the window's
    tokens older than the ring. In this order: ``leave`` reads side rows that ``ring`` overwrites."""
    r, w = recent, window
    e = np.zeros(0, np.int64)
    leave = np.arange(max(0, t0 - r, end - w), min(t0, end - r)) if r < w else e
    direct = np.arange(max(t0, end - w), end - r) if r < w else e
    return leave, direct, np.arange(max(t0, end - r), end)


def _check_pos(name, v, lo=1):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    return int(v)


class KVCache:
    """Packed K/V cache of one layer on the GPU, for a cache policy.

    Args:
        batch: number of sequences B.
        kv_heads: KV heads per token.
        capacity: tokens per sequence (incl. sinks); the packed rows are rounded up to a multiple of 16.
        policy: :class:`sim_models.CachePolicy`, its spec string (``"K4V3+S4"``, ``"v4"``) or None
            (``CachePolicy()``, the ``v2`` preset). The layer's K and V formats, sinks, centering and key
            scales come from it; what the kernels serve is :func:`gpu_ref.backend.supports`.
        tables: :class:`sim_models.KeyTables` of the model: mu (``policy.center_keys``) and the key-scale
            exponents (``policy.key_scale == "pow2"``) of entry ``layer``; shape ``[L, kv_heads, head_dim]``.
        layer: the decoder layer this cache holds (its overrides in the policy, its entry in ``tables``).
        head_dim: vector length N (default: the policy's key format's ``n``); the formats are fitted to it
            (:meth:`sim_models.CachePolicy.fit`).
        dtype: 16-bit type of K/V, ``"fp16"`` or ``"bf16"`` (default: the key format's).
        page_size: None (contiguous) or tokens per page (16, 32 or a power-of-two multiple of 64).
        num_pages: pages in the pool (default: enough for every sequence at capacity).
        layout: order of the value code plane, "vpair" or "wire" (default: "vpair" where the decode kernel
            reads it -- 3-bit values, 64-lane blocks -- else "wire"); see :mod:`gpu_ref.layout`.

    Attributes:
        policy: the policy fitted to head_dim and dtype; params, v_params: the layer's K / V formats;
        sinks: fp16 leading tokens; recent: the ring's tokens; side: ``sinks + recent``, the 16-bit side rows
        per sequence (sink ``p`` in row ``p``, later token ``p`` in ring row ``sinks + (p - sinks) % recent``);
        k_codes, v_codes, k_scales, v_scales: uint8 planes (contiguous
        ``[B, KVH, CAP, *]`` or pools ``[P, KVH, page, *]``); k_flags, v_flags: uint8 ``[B|P, KVH, CAP|page]``;
        k_sink, v_sink: uint16 ``[B, KVH, side, N]`` (None without sinks and ring); block_table: int32
        ``[B, max_pages]`` (paged); lengths: int32 cupy ``[B]`` tokens per sequence (host copy in
        ``host_lengths``); q_scale: float32 cupy ``[KVH, N]`` = 1/s (None without key scales); layout.

    Raises:
        ValueError: a bad size or page size, a policy the kernels cannot serve (every reason named),
            tables missing or of the wrong shape.
        TypeError: policy / tables of the wrong type.
    """

    def __init__(self, batch: int, kv_heads: int, capacity: int, policy: CachePolicy | str | None = None, *,
                 tables: KeyTables | None = None, layer: int = 0, head_dim: int | None = None,
                 dtype: str | None = None, page_size: int | None = None, num_pages: int | None = None,
                 layout: str | None = None):
        if policy is None:
            policy = CachePolicy()
        elif isinstance(policy, str):
            policy = CachePolicy.parse(policy)
        if not isinstance(policy, CachePolicy):
            raise TypeError(f"policy must be a sim_models.CachePolicy, a spec string or None, got "
                            f"{type(policy).__name__}")
        if tables is not None and not isinstance(tables, KeyTables):
            raise TypeError(f"tables must be a sim_models.KeyTables, got {type(tables).__name__}")
        self.layer = _check_pos("layer", layer, 0)
        self.batch = _check_pos("batch", batch)
        self.kv_heads = _check_pos("kv_heads", kv_heads)
        _check_pos("capacity", capacity)
        ref = policy.format_for(self.layer, "k") or policy.format_for(self.layer, "v")
        if ref is None:
            raise ValueError(f"policy stores layer {self.layer} 16-bit (k and v None): KVCache holds packed layers")
        n = ref.n if head_dim is None else _check_pos("head_dim", head_dim)
        dtype = ref.dtype if dtype is None else dtype
        one = dataclasses.replace(policy, k=policy.format_for(self.layer, "k"), v=policy.format_for(self.layer, "v"),
                                  layer_k=(), layer_v=())
        _backend.check(one, n, dtype)
        self.policy = policy.fit(n, dtype)
        kp, vp = one.fit(n, dtype).k, one.fit(n, dtype).v
        self.layout = _dec.check_layout(
            ("vpair" if vpair_supported(vp.bits, vp.block) else "wire") if layout is None else layout, vp)
        self.sinks, self.recent = policy.sinks, policy.recent
        self.side = self.sinks + self.recent
        mu16 = s = None
        if policy.center_keys or policy.key_scale:
            if tables is None:
                raise ValueError(f"policy {policy.spec} reads key tables (center_keys / key_scale): pass "
                                 f"tables=KeyTables (python -m sim_models.calibrate)")
            if tables.shape[1:] != (self.kv_heads, n) or not self.layer < tables.shape[0]:
                raise ValueError(f"tables of model {tables.model_id!r} have shape {tables.shape} (layers, kv heads, "
                                 f"head_dim); layer {self.layer} of kv_heads={self.kv_heads}, head_dim={n} needed")
            if policy.center_keys:
                mu16 = tables.mu[self.layer]
            if policy.key_scale:
                if tables.log2_s is None:
                    raise ValueError(f"policy key_scale {policy.key_scale!r} needs key scales; the tables of "
                                     f"{tables.model_id!r} have none (log2_s)")
                bad = _backend.CUDA.log2_scale_reasons(tables.log2_s[self.layer])
                if bad:
                    raise ValueError(f"tables of {tables.model_id!r}, layer {self.layer}: {bad[0]}")
                s = tables.scales()[self.layer].astype(np.float64)
        self.params, self.v_params = kp, vp
        packed = max(int(capacity) - self.sinks, 1)
        self.page_size = page_size
        if page_size is None:
            cap = (packed + 15) // 16 * 16
            self.capacity = cap + self.sinks
            rows, npool, self.max_pages = cap, self.batch, 1
        else:
            pg = _check_pos("page_size", page_size)
            if not _backend.CUDA.page_size_ok(pg):
                raise ValueError(f"page_size must be 16, 32 or a multiple of 64 (a power of two), got {pg}")
            self.max_pages = -(-packed // pg)
            self.capacity = self.max_pages * pg + self.sinks
            npool = self.batch * self.max_pages if num_pages is None else _check_pos("num_pages", num_pages)
            rows = pg
        self._rows = rows
        cp = cupy()
        shp = (npool, self.kv_heads, rows)
        self.k_codes = cp.zeros((*shp, kp.code_bytes), cp.uint8)
        self.v_codes = cp.zeros((*shp, vp.code_bytes), cp.uint8)
        self.k_scales = cp.ones((*shp, kp.n_blocks), cp.uint8)
        self.v_scales = cp.ones((*shp, vp.n_blocks), cp.uint8)
        self.k_flags = cp.zeros(shp, cp.uint8)
        self.v_flags = cp.zeros(shp, cp.uint8)
        self.k_sink = self.v_sink = None
        if self.side:
            self.k_sink = cp.zeros((self.batch, self.kv_heads, self.side, n), cp.uint16)
            self.v_sink = cp.zeros((self.batch, self.kv_heads, self.side, n), cp.uint16)
        self.q_scale = None
        if s is not None:
            self.q_scale = cp.asarray((1.0 / s).astype(np.float32))
        # the key front end, applied by the write kernel (and to sink rows by key_front)
        self._key = key_table(n, mu16, None if s is None else s.astype(np.float16), cp)
        self._host_table = np.full((self.batch, self.max_pages), -1, np.int64)
        self._free = list(range(npool - 1, -1, -1)) if page_size is not None else None
        self.block_table = None
        if page_size is not None:
            self.block_table = cp.zeros((self.batch, self.max_pages), cp.int32)
        self.host_lengths = np.zeros(self.batch, dtype=np.int64)
        self.lengths = cp.zeros(self.batch, dtype=cp.int32)

    # ---------------------------------------------------------------------------------- write
    def _packed_rows(self, b: np.ndarray, i: np.ndarray, h: np.ndarray) -> np.ndarray:
        """Flat plane rows of packed token i (0-based after the sinks) of sequence b, kv head h."""
        if self.page_size is None:
            return (b * self.kv_heads + h) * self._rows + i
        pg = self.page_size
        page = self._host_table[b, i // pg]
        return (page * self.kv_heads + h) * pg + i % pg

    def _allocate(self, b: int, n_packed: int):
        if self.page_size is None:
            return
        need = -(-n_packed // self.page_size)
        for j in range(need):
            if self._host_table[b, j] < 0:
                if not self._free:
                    raise ValueError("the page pool is exhausted (num_pages too small)")
                self._host_table[b, j] = self._free.pop()

    def append(self, k, v):
        """Encode and append ``T`` tokens to every sequence at its current length.

        Args:
            k, v: cupy ``[B, T, KVH, N]`` float16 or uint16 bit patterns of ``params.dtype``.

        Raises:
            ValueError: shapes do not match the cache, or a sequence would exceed the capacity.
            TypeError: wrong array type or dtype.
        """
        cp = cupy()
        kp, vp = self.params, self.v_params
        kb, vb = as_bits(k, kp, cp, "k"), as_bits(v, vp, cp, "v")
        if kb.shape != vb.shape or kb.ndim != 4 or kb.shape[0] != self.batch or kb.shape[2] != self.kv_heads:
            raise ValueError(f"k and v must both be [B={self.batch}, T, KVH={self.kv_heads}, N={kp.n}], "
                             f"got {list(kb.shape)} and {list(vb.shape)}")
        t = kb.shape[1]
        if np.any(self.host_lengths + t > self.capacity):
            raise ValueError(f"appending {t} tokens exceeds the capacity {self.capacity}")
        if t == 0:
            return
        s = self.sinks
        pos = self.host_lengths[:, None] + np.arange(t)[None, :]           # [B, T] token positions
        bi, ti = np.nonzero(pos >= s)                                        # packed tokens
        for b in range(self.batch):
            self._allocate(b, int(pos[b, -1]) + 1 - s)
        if bi.size:
            hh = np.arange(self.kv_heads)
            rows = self._packed_rows(np.repeat(bi, self.kv_heads), np.repeat(pos[bi, ti] - s, self.kv_heads),
                                     np.tile(hh, bi.size))
            sel_b, sel_t = cp.asarray(bi), cp.asarray(ti)
            rows_d = cp.asarray(rows.astype(np.int64))
            for bits, p, codes, scales, flags, key in (
                    (kb, kp, self.k_codes, self.k_scales, self.k_flags, self._key),
                    (vb, vp, self.v_codes, self.v_scales, self.v_flags, None)):
                src = bits if bi.size == self.batch * t else bits[sel_b, sel_t]
                launch_encode(cp.ascontiguousarray(src), p, codes, scales, flags, rows_d, cp, key=key,
                              layout=self.layout if codes is self.v_codes else "wire", pair_vec=self.kv_heads)
        side = pos < s                                                       # sink tokens
        if self.recent:                                                      # and the ring's last tokens
            side |= pos >= np.maximum(s, self.host_lengths[:, None] + t - self.recent)
        sb, st = np.nonzero(side)
        if sb.size:
            p = pos[sb, st]
            ib, it, ip = cp.asarray(sb), cp.asarray(st), cp.asarray(side_row(p, s, self.recent))
            ks = kb[ib, it]
            self.k_sink[ib, :, ip] = ks if self._key is None else key_front(ks, self._key, cp)
            self.v_sink[ib, :, ip] = vb[ib, it]
        self.host_lengths += t
        # in place: a CUDA graph captured over run() keeps these arrays' pointers
        self.lengths[...] = cp.asarray(self.host_lengths, dtype=cp.int32)
        if self.block_table is not None:
            self.block_table[...] = cp.asarray(np.maximum(self._host_table, 0).astype(np.int32))

    # ---------------------------------------------------------------------------------- read
    def plan(self, q_heads: int, max_length: int | None = None, **kw) -> "_dec.DecodePlan":
        """:func:`gpu_ref.decode.plan` for this cache (``max_length`` default: the capacity)."""
        ml = self.capacity if max_length is None else max_length
        if self.page_size is None:
            kw.setdefault("capacity", self._rows)
        else:
            kw.setdefault("max_pages", self.max_pages)
        kw.setdefault("key_scales", self.q_scale is not None)
        kw.setdefault("q_dtype", self.params.dtype)  # q has the type of the cached K/V
        kw.setdefault("layout", self.layout)
        return _dec.plan(self.params, self.v_params, batch=self.batch, q_heads=q_heads, kv_heads=self.kv_heads,
                         max_length=ml, page_size=self.page_size, sinks=self.side, **kw)

    def run(self, pl, ws, q, **kw):
        """``gpu_ref.run(pl, ws, q, self, **kw)``: decode over this cache with its current lengths."""
        return _dec.run(pl, ws, q, self, **kw)

    def host_planes(self) -> dict:
        """The packed planes as NumPy arrays in the golden byte order (the interchange format): ``k_codes``,
        ``k_scales``, ``v_codes`` (de-interleaved when ``layout == "vpair"``), ``v_scales``, ``k_flags``,
        ``v_flags``, same shapes as the attributes."""
        cp = cupy()
        out = {name: cp.asnumpy(getattr(self, name)) for name in
               ("k_codes", "k_scales", "v_codes", "v_scales", "k_flags", "v_flags")}
        out["v_codes"] = to_wire(out["v_codes"], self.layout, self.v_params.bits)
        return out

    def attend(self, q, *, lengths=None, num_splits=None, precise_p=False, tune=None, **kw):
        """One-call decode over the cache (plan for the current lengths, fresh workspace, run).

        ``lengths`` (host ints, optional) overrides the current lengths (each <= its current one; with a
        recent ring, each equal to its current one or at most ``sinks``: the ring holds the last tokens only).
        """
        cp = cupy()
        check_cupy_array("q", q, cp)
        if q.ndim != 3:
            raise ValueError(f"q must be [B, Hq, N], got {list(q.shape)}")
        host = self.host_lengths if lengths is None else np.asarray(lengths, dtype=np.int64)
        if host.shape != (self.batch,) or host.min(initial=0) < 0 or np.any(host > self.host_lengths):
            raise ValueError(f"lengths must be {self.batch} ints, each in [0, its appended length]; "
                             f"appended {self.host_lengths.tolist()}, got {host.tolist()}")
        if self.recent and np.any((host != self.host_lengths) & (host > self.sinks)):
            raise ValueError(f"lengths: with a recent ring of {self.recent} tokens each length is its appended "
                             f"length or at most sinks={self.sinks} (the ring holds the last tokens only); "
                             f"appended {self.host_lengths.tolist()}, got {host.tolist()}")
        pl = self.plan(q.shape[1], int(host.max(initial=0)), num_splits=num_splits, precise_p=precise_p,
                       tune=tune)
        saved = self.lengths
        self.lengths = cp.asarray(host, dtype=cp.int32)
        try:
            return self.run(pl, pl.workspace(), q, **kw)
        finally:
            self.lengths = saved
