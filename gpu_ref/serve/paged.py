"""The engine's shared paged pool: a block allocator with prefix sharing, and the per-layer paged stores.

A *block* is one page of ``block_size`` packed tokens in **every** full-attention layer: page ``p`` of
layer 0 and page ``p`` of layer 5 belong to the same block, so one block table row per slot serves every
layer. Packed token ``i`` (position ``sinks + i``) of the sequence in slot ``s`` is row ``i % P`` of page
``table[s, i // P]``, the layout :func:`gpu_ref.decode.run_planes` reads (vLLM/FlashInfer convention).
Per slot, outside the pool: the ``sinks`` 16-bit rows of each full layer and the ring of each sliding
layer (page ``s`` of a pool of one page per slot; token ``p`` in row ``p % W``). With the policy's recent
ring of R tokens (``CachePolicy.recent``) a full layer's side rows are ``sinks + R`` per slot (token ``p``
past the sinks also in side row ``sinks + (p - sinks) % R``, beside its codes in the pool), and a
sliding layer keeps r = min(R, W) side rows per slot and W - r packed rows, a token entering the
packed rows when it leaves the side ring (as :class:`gpu_ref.hf.stores._CudaStore`).

Stores (one per layer, same interface): :class:`GoldenPagedStore` (NumPy golden model: the codes and
scales of ``sim_models.encode`` in the pool's pages, SDPA over the reconstructions; also the 16-bit
layers of either backend) and :class:`CudaPagedStore` (``gpu_ref.KVCache`` planes of ``num_pages``
pages, the write kernel at rows computed from the block table, one :func:`gpu_ref.decode.run_planes`
launch per layer for the whole batch).
"""

from __future__ import annotations

import numpy as np


from ..hf.stores import (_CudaStore, _GoldenStore, _torch, key_domain, layer_policy, mixed_attention,
                         recent_per_query, recent_rows)


class BlockAllocator:
    """Blocks ``0 .. num_blocks - 1`` with reference counts and a table of full, immutable prompt blocks.

    A shared block is looked up by ``(parent block, its tokens)``: the first block's tokens are the
    prompt's first ``sinks + P`` tokens (the sinks included: its K/V depend on them), a later block's
    the ``P`` prompt tokens it holds, so equal keys mean equal prefixes. A block leaves the table when
    its last reference goes.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))   # pop() hands out the lowest free block first
        self.refs = np.zeros(num_blocks, np.int64)
        self._table: dict = {}
        self._key_of: dict = {}

    @property
    def free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list:
        if n > len(self._free):
            raise RuntimeError(f"{n} blocks asked, {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        self.refs[out] = 1
        return out

    def lookup(self, key):
        """The block registered under ``key`` (its count incremented), or None."""
        b = self._table.get(key)
        if b is not None:
            self.refs[b] += 1
        return b

    def register(self, key, block: int):
        if key not in self._table and block not in self._key_of:
            self._table[key] = block
            self._key_of[block] = key

    def release(self, blocks):
        for b in blocks:
            self.refs[b] -= 1
            if self.refs[b] == 0:
                key = self._key_of.pop(b, None)
                if key is not None:
                    del self._table[key]
                self._free.append(b)

    @property
    def shared(self) -> int:
        """Blocks referenced by more than one sequence."""
        return int((self.refs > 1).sum())


class Rows:
    """Where one forward's K/V rows go and what its queries read, for one kind of layer (``"full"``:
    the pool's pages; ``"ring"``: one page of W rows per slot), computed once per forward and shared
    by every layer of that kind.

    Host arrays: ``src`` (indices into the forward's flattened ``[B * T]`` tokens) with ``page`` and
    ``row`` (their destination); ``sink_src`` with ``sink_slot`` and ``sink_pos``; ``ring_src`` with
    ``ring_slot`` and ``ring_row`` (a full layer's recent ring: side rows); for attention
    ``slots`` ``[B]``, ``lengths`` ``[B]`` (tokens a row's last query sees, sinks included) and
    ``table`` int32 ``[B, cols]``; ``t`` tokens per row; ``starts``, ``ends`` ``[B]`` the positions of a
    row's first token and one past its last. ``dev`` caches the device copies.
    """

    def __init__(self, src, page, row, sink_src, sink_slot, sink_pos, slots, lengths, table, t, starts, ends,
                 ring_src=None, ring_slot=None, ring_row=None):
        self.src, self.page, self.row = src, page, row
        self.sink_src, self.sink_slot, self.sink_pos = sink_src, sink_slot, sink_pos
        e = np.zeros(0, np.int64)
        self.ring_src, self.ring_slot, self.ring_row = (e if x is None else x for x in (ring_src, ring_slot, ring_row))
        self.slots, self.lengths, self.table, self.t = slots, lengths, table, t
        self.starts, self.ends = starts, ends
        self.dev: dict = {}


def full_rows(items, sinks, page_size, tables, recent=0):
    """:class:`Rows` of the full layers. ``items``: per batch row ``(slot, t0, T, skip)``: tokens at
    positions ``t0 .. t0 + T - 1``, of which packed tokens before ``skip`` (already in shared
    blocks) are not written; ``tables[slot]`` the slot's block list; ``recent``: the ring's tokens (the
    row's last ``recent`` tokens past the sinks also go to their side rows)."""
    from gpu_ref.cache import side_row
    src, page, row, ss, sslot, spos, lengths = [], [], [], [], [], [], []
    rs, rslot, rrow = [], [], []
    t = items[0][2]
    cols = 1
    for b, (slot, t0, n, skip) in enumerate(items):
        pos = np.arange(t0, t0 + n)
        idx = b * t + np.arange(n)
        sk = pos < sinks
        ss.append(idx[sk]), sslot.append(np.full(sk.sum(), slot)), spos.append(pos[sk])
        i = pos[~sk] - sinks
        keep = i >= skip
        i = i[keep]
        blocks = np.asarray(tables[slot], np.int64)
        src.append(idx[~sk][keep]), page.append(blocks[i // page_size]), row.append(i % page_size)
        lengths.append(t0 + n)
        cols = max(cols, -(-max(t0 + n - sinks, 1) // page_size))
        ring = (pos >= sinks) & (pos >= t0 + n - recent) if recent else np.zeros(n, bool)
        rs.append(idx[ring]), rslot.append(np.full(ring.sum(), slot)), rrow.append(side_row(pos[ring], sinks, recent))
    table = np.zeros((len(items), cols), np.int32)
    for b, (slot, *_) in enumerate(items):
        bl = tables[slot][:cols]
        table[b, :len(bl)] = bl
    cat = (lambda x: np.concatenate(x).astype(np.int64))
    return Rows(cat(src), cat(page), cat(row), cat(ss), cat(sslot), cat(spos),
                np.array([it[0] for it in items], np.int64), np.array(lengths, np.int64), table, t,
                np.array([it[1] for it in items], np.int64), np.array(lengths, np.int64),
                cat(rs), cat(rslot), cat(rrow))


def ring_rows(items, window):
    """:class:`Rows` of the sliding layers (ring of ``window`` rows in page ``slot``; the last
    ``window`` tokens of a chunk are written, every token of it when shorter)."""
    src, page, row, lengths = [], [], [], []
    t = items[0][2]
    for b, (slot, t0, n, _) in enumerate(items):
        keep = min(n, window)
        pos = np.arange(t0 + n - keep, t0 + n)
        src.append(b * t + np.arange(n - keep, n)), page.append(np.full(keep, slot)), row.append(pos % window)
        lengths.append(min(t0 + n, window))
    e = np.zeros(0, np.int64)
    slots = np.array([it[0] for it in items], np.int64)
    return Rows(np.concatenate(src), np.concatenate(page).astype(np.int64), np.concatenate(row).astype(np.int64),
                e, e, e, slots, np.array(lengths, np.int64), slots[:, None].astype(np.int32), t,
                np.array([it[1] for it in items], np.int64), np.array([it[1] + it[2] for it in items], np.int64))


class GoldenPagedStore:
    """Golden-model paged store of one layer (any device, any format, 16-bit kinds too).

    ``hat[kind]`` float32 ``[pages, KVH, P, D]`` (reconstructions, or the 16-bit values); ``codes[kind]``,
    ``scales[kind]`` NumPy uint8 ``[pages, KVH, P, D/N, bytes]`` in the golden byte order;
    ``sink_hat[kind]`` float32 ``[slots, KVH, sinks, D]`` (keys in the key front end's domain, as the
    batch-1 golden store keeps them). With a recent ring (``recent``; a sliding layer, ``window`` W, at most
    W) ``raw[kind]`` keeps the 16-bit values beside ``hat`` and a query reads its ``recent`` most recent
    tokens from there (:func:`gpu_ref.hf.stores.recent_rows`).
    """

    def __init__(self, fmts, sinks, slots, kvh, d, torch_dtype, device, pages, page_size, mu16=None, s16=None,
                 recent=0, window=None):
        torch = _torch()
        self.fmts, self.sinks, self.dtype, self.page_size = fmts, sinks, torch_dtype, page_size
        self.window = window
        self.recent = min(recent, window) if window else recent
        # the key front end and the query side of the batch-1 golden store (a one-row instance)
        self._one = _GoldenStore(fmts, 0, 1, kvh, 1, d, torch_dtype, device, mu16=mu16, s16=s16)
        self.hat = {k: torch.zeros(pages, kvh, page_size, d, dtype=torch.float32, device=device) for k in "kv"}
        self.sink_hat = {k: torch.zeros(slots, kvh, sinks, d, dtype=torch.float32, device=device) for k in "kv"}
        self.raw = ({k: torch.zeros(pages, kvh, page_size, d, dtype=torch_dtype, device=device) for k in "kv"}
                    if self.recent else None)
        self.codes, self.scales = {}, {}
        for kind, f in zip("kv", fmts):
            if f is not None:
                self.codes[kind] = np.zeros((pages, kvh, page_size, d // f.n, f.code_bytes), np.uint8)
                self.scales[kind] = np.zeros((pages, kvh, page_size, d // f.n, f.n_blocks), np.uint8)

    def write(self, k16, v16, rows: Rows):
        """k16, v16: ``[B, KVH, T, D]`` in the store's 16-bit type (keys before the key front end)."""
        torch = _torch()
        b, h, t, d = k16.shape
        k_raw, k16 = k16, self._one.keys_in(k16)
        src = torch.as_tensor(rows.src, device=k16.device)
        ssrc = torch.as_tensor(rows.sink_src, device=k16.device)
        pg, rw = torch.as_tensor(rows.page, device=k16.device), torch.as_tensor(rows.row, device=k16.device)
        for kind, x, f in (("k", k16, self.fmts[0]), ("v", v16, self.fmts[1])):
            flat = x.transpose(1, 2).reshape(b * t, h, 1, d)                  # [B*T, KVH, 1, D]
            if len(rows.sink_src):
                at = (torch.as_tensor(rows.sink_slot, device=k16.device), slice(None),
                      torch.as_tensor(rows.sink_pos, device=k16.device))
                self.sink_hat[kind][at] = flat[ssrc, :, 0].float()
            if not len(rows.src):
                continue
            raw = k_raw.transpose(1, 2).reshape(b * t, h, 1, d)[src] if kind == "k" else None
            rec, codes, scales = self._one._reconstruct(flat[src], f, raw)   # [M, KVH, 1, D]
            self.hat[kind][pg, :, rw] = rec[:, :, 0]
            if self.raw is not None:
                self.raw[kind][pg, :, rw] = flat[src][:, :, 0]
            if codes is not None:
                self.codes[kind][rows.page, :, rows.row] = codes[:, :, 0]
                self.scales[kind][rows.page, :, rows.row] = scales[:, :, 0]

    def _kv(self, rows: Rows, b: int, n: int, raw=False):
        """float32 (k, v) ``[1, KVH, n, D]``: the first ``n`` tokens of batch row ``b``, sinks first (a
        sliding layer: its ring's rows); ``raw``: the 16-bit values instead of the reconstructions."""
        torch = _torch()
        s = min(n, self.sinks)
        i = np.arange(n - s)
        pages = torch.as_tensor(rows.table[b][i // self.page_size].astype(np.int64), device=self.hat["k"].device)
        r = torch.as_tensor(i % self.page_size, device=self.hat["k"].device)
        out = []
        for kind in "kv":
            packed = (self.raw if raw else self.hat)[kind][pages, :, r].transpose(0, 1).float()   # [KVH, n - s, D]
            out.append(torch.cat([self.sink_hat[kind][rows.slots[b], :, :s], packed], 1)[None])
        return out

    def _positions(self, rows: Rows, b: int, n: int):
        """Token positions of the ``n`` rows :meth:`_kv` returns for batch row ``b``."""
        if self.window is None:
            return np.arange(n)
        j, end = np.arange(n), int(rows.ends[b])
        return j + self.window * ((end - 1 - j) // self.window)       # ring row j: the window's token there

    def _attend_rows(self, q, scaling, rows, b, n, qpos):
        """Queries ``[1, Hq, T, D]`` at positions ``qpos`` over the ``n`` rows of batch row ``b``."""
        torch = _torch()
        kpos = torch.as_tensor(self._positions(rows, b, n), device=q.device)
        qp = torch.as_tensor(qpos, device=q.device)[:, None]
        mask = kpos[None, :] <= qp
        if self.window is not None:
            mask &= kpos[None, :] > qp - self.window
        quant = self._kv(rows, b, n)
        if self.raw is None:
            k, v = quant
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)
        fresh = recent_rows(qp, kpos[None, :], self.sinks, self.recent)
        return mixed_attention(q, quant, self._kv(rows, b, n, raw=True), mask, fresh, scaling)

    def attend(self, q, scaling, rows: Rows):
        """q float32 ``[B, Hq, D]`` -> float32 ``[B, Hq, D]``: row b over its ``lengths[b]`` tokens."""
        torch = _torch()
        q = self._one.query(q)
        out = []
        for b in range(q.shape[0]):
            end = int(rows.ends[b])
            o = self._attend_rows(q[b:b + 1, :, None], scaling, rows, b, int(rows.lengths[b]), [end - 1])
            out.append(o[:, :, 0])
        return torch.cat(out, 0)

    def attend_chunk(self, q, scaling, rows: Rows):
        """Queries ``[1, Hq, T, D]`` (float32) of the row's last T tokens, each over the tokens up to its
        own -> float32 ``[1, T, Hq, D]``."""
        q = self._one.query(q)
        n, t, end = int(rows.lengths[0]), q.shape[2], int(rows.ends[0])
        return self._attend_rows(q, scaling, rows, 0, n, np.arange(end - t, end)).transpose(1, 2)

    def page_bytes(self, pages) -> dict:
        """The golden bytes of ``pages`` (``{"k_codes", "k_scales", "v_codes", "v_scales"}``, packed kinds),
        ``[pages, KVH, page_size, bytes per vector]`` as :meth:`CudaPagedStore.page_bytes`."""
        out = {}
        for k in self.codes:
            for n in ("codes", "scales"):
                a = getattr(self, n)[k][pages]
                out[f"{k}_{n}"] = a.reshape(*a.shape[:3], -1).copy()
        return out


class CudaPagedStore:
    """The kernels over a paged pool of one layer: a :class:`gpu_ref.KVCache` of ``pages`` pages of
    ``page_size`` rows (the pool) and ``slots`` sink rows; the engine's block table and lengths per
    forward (:class:`Rows`) are passed to :func:`gpu_ref.decode.run_planes`, one launch for the batch."""

    def __init__(self, fmts, sinks, slots, kvh, d, torch_dtype, device, pages, page_size, hq, mu16=None,
                 s16=None, num_splits=None, recent=0, window=None, packed_prefill=False):
        from gpu_ref import KVCache
        torch = _torch()
        self.bf16 = torch_dtype != torch.float16
        self.packed_prefill = packed_prefill  # attend_chunk is called (it reads the ring as it was before)
        self.hq, self.sinks, self.page_size, self.kvh = hq, sinks, page_size, kvh
        self.num_splits = num_splits          # split-KV factor of every launch (None: planned)
        self.window = window
        self.recent = min(recent, window) if window else recent
        self._chunk_side = None
        policy, tables = layer_policy(fmts, sinks, kvh, d, mu16, s16, self.recent)
        with _CudaStore._stream():
            # KVCache allocates the planes; its own block table and page allocator are not used
            self.kv = KVCache(slots, kvh, sinks + page_size, policy, tables=tables, page_size=page_size,
                              num_pages=pages)
        self.side = self.kv.side
        self._sink_t = None
        if self.side:
            import cupy as cp
            self._sink_t = [torch.from_dlpack(a.view(cp.int16)) for a in (self.kv.k_sink, self.kv.v_sink)]
        # a sliding layer with a ring and a key front end: the ring's keys before the front end, which the write
        # kernel encodes (the folded key front end) when their token leaves the ring
        self._ring_raw = (torch.zeros(slots, kvh, self.recent, d, dtype=torch.int16, device=device)
                          if window and 0 < self.recent < window and self.kv._key is not None else None)
        self._plans: dict = {}

    def _dev(self, rows: Rows, name, make):
        if name not in rows.dev:
            rows.dev[name] = make()
        return rows.dev[name]

    def write(self, k16, v16, rows: Rows):
        """k16, v16: torch ``[B, KVH, T, D]`` in the store's 16-bit type (keys before the key front end,
        which the write kernel applies)."""
        import cupy as cp
        from gpu_ref.encode import launch_encode
        torch = _torch()
        b, h, t, d = k16.shape
        kv, dev = self.kv, k16.device
        if self.window is not None and self.recent:
            return self._write_ring(k16, v16, rows)
        if self.recent and t > 1 and self.packed_prefill:     # attend_chunk reads the ring per query
            sl = torch.as_tensor(rows.slots, device=dev)
            self._chunk_side = ([x[sl].clone() for x in self._sink_t], self._front(k16), v16)
        if len(rows.ring_src):
            rsrc = self._dev(rows, "ring_src", lambda: torch.as_tensor(rows.ring_src, device=dev))
            rslot = self._dev(rows, "ring_slot", lambda: torch.as_tensor(rows.ring_slot, device=dev))
            rrow = self._dev(rows, "ring_row", lambda: torch.as_tensor(rows.ring_row, device=dev))
            ks = key_domain(kv, k16.transpose(1, 2).reshape(b * t, h, d)[rsrc])
            vs = v16.transpose(1, 2).reshape(b * t, h, d)[rsrc]
            self._sink_t[0][rslot, :, rrow] = ks.contiguous().view(torch.int16)
            self._sink_t[1][rslot, :, rrow] = vs.contiguous().view(torch.int16)
        if len(rows.sink_src):
            ssrc = self._dev(rows, "sink_src", lambda: torch.as_tensor(rows.sink_src, device=dev))
            sslot = self._dev(rows, "sink_slot", lambda: torch.as_tensor(rows.sink_slot, device=dev))
            spos = self._dev(rows, "sink_pos", lambda: torch.as_tensor(rows.sink_pos, device=dev))
            ks = k16.transpose(1, 2).reshape(b * t, h, d)[ssrc]                 # [M, KVH, D]
            vs = v16.transpose(1, 2).reshape(b * t, h, d)[ssrc]
            ks = key_domain(kv, ks)
            self._sink_t[0][sslot, :, spos] = ks.contiguous().view(torch.int16)
            self._sink_t[1][sslot, :, spos] = vs.contiguous().view(torch.int16)
        if not len(rows.src):
            return
        src = self._dev(rows, "src", lambda: torch.as_tensor(rows.src, device=dev))
        plane = self._dev(rows, "plane", lambda: torch.as_tensor(
            ((rows.page[:, None] * h + np.arange(h)[None, :]) * self.page_size + rows.row[:, None]).reshape(-1),
            device=dev))
        with _CudaStore._stream():
            for x, p, codes, scales, flags, key, lay in (
                    (k16, kv.params, kv.k_codes, kv.k_scales, kv.k_flags, kv._key, "wire"),
                    (v16, kv.v_params, kv.v_codes, kv.v_scales, kv.v_flags, None, kv.layout)):
                sel = x.transpose(1, 2).reshape(b * t, h, d)[src][None]          # [1, M, KVH, D]
                bits = _CudaStore._cp(sel)
                launch_encode(bits, p, codes, scales, flags, _CudaStore._cp(plane), cp, key=key, layout=lay,
                              pair_vec=h)

    def _front(self, k16):
        """Keys ``[B, KVH, T, D]`` -> the key front end's domain (same tensor without one)."""
        return key_domain(self.kv, k16.transpose(1, 2)).transpose(1, 2)

    def _encode(self, k, v, plane, key):
        """Write kernel: ``k``, ``v`` ``[M, KVH, D]`` into the flat plane rows ``plane`` (int64 ``[M * KVH]``);
        ``key``: apply the key front end (False: keys already in its domain)."""
        import cupy as cp
        from gpu_ref.encode import launch_encode
        kv = self.kv
        with _CudaStore._stream():
            for x, p, codes, scales, flags, kf, lay in (
                    (k, kv.params, kv.k_codes, kv.k_scales, kv.k_flags, kv._key if key else None, "wire"),
                    (v, kv.v_params, kv.v_codes, kv.v_scales, kv.v_flags, None, kv.layout)):
                launch_encode(_CudaStore._cp(x[None]), p, codes, scales, flags, _CudaStore._cp(plane), cp, key=kf,
                              layout=lay, pair_vec=x.shape[1])

    def _write_ring(self, k16, v16, rows: Rows):
        """A sliding layer with a recent ring of r rows: per batch row, the tokens leaving the side ring
        (row ``p % r``) are encoded from it into packed row ``p % (W - r)`` of the slot's page if still in
        the window, the chunk's tokens that never enter the ring are encoded there directly, and its last
        r tokens go to the side ring."""
        torch = _torch()
        b, h, t, d = k16.shape
        w, r, dev = self.window, self.recent, k16.device
        wp = max(w - r, 1)
        flat = [x.transpose(1, 2).reshape(b * t, h, d) for x in (k16, v16)]
        ev, evrow, di, dirow, ri, rirow = [], [], [], [], [], []
        from gpu_ref.cache import sliding_moves
        for j in range(b):
            slot, t0, end = int(rows.slots[j]), int(rows.starts[j]), int(rows.ends[j])
            base = slot * self.page_size
            q, p, ring = sliding_moves(t0, end, w, r)
            ev.append(slot * r + q % r), evrow.append(base + q % wp)
            di.append(j * t + p - t0), dirow.append(base + p % wp)
            ri.append(j * t + ring - t0), rirow.append(slot * r + ring % r)
        cat = (lambda x: torch.as_tensor(np.concatenate(x).astype(np.int64), device=dev))  # noqa: E731
        planes = (lambda rr: ((rr[:, None] // self.page_size * h + torch.arange(h, device=dev)[None, :])
                              * self.page_size + rr[:, None] % self.page_size).reshape(-1))  # noqa: E731
        if r < w and sum(len(x) for x in ev):
            e, er = cat(ev), cat(evrow)
            old = [x[e // r, :, e % r].view(k16.dtype) for x in self._sink_t]              # [M, KVH, D]
            raw = self._ring_raw is not None
            if raw:                                             # keys: from the ring's keys before the front end
                old[0] = self._ring_raw[e // r, :, e % r].view(k16.dtype)
            self._encode(old[0], old[1], planes(er), raw)
        if r < w and sum(len(x) for x in di):
            i, ir = cat(di), cat(dirow)
            self._encode(flat[0][i], flat[1][i], planes(ir), True)
        i, ir = cat(ri), cat(rirow)
        ks = key_domain(self.kv, k16.transpose(1, 2).reshape(b * t, h, d)[i])
        self._sink_t[0][ir // r, :, ir % r] = ks.view(torch.int16)
        self._sink_t[1][ir // r, :, ir % r] = flat[1][i].contiguous().view(torch.int16)
        if self._ring_raw is not None:
            self._ring_raw[ir // r, :, ir % r] = flat[0][i].contiguous().view(torch.int16)

    def _plan(self, nq, max_len, cols):
        from gpu_ref import plan
        kv = self.kv
        key = (nq, max_len, cols)
        if key not in self._plans:
            with _CudaStore._stream():
                pl = plan(kv.params, kv.v_params, batch=nq, q_heads=self.hq, kv_heads=self.kvh, max_length=max_len,
                          page_size=self.page_size, max_pages=cols, sinks=self.side, num_splits=self.num_splits,
                          key_scales=kv.q_scale is not None, q_dtype="bf16" if self.bf16 else "fp16",
                          layout=kv.layout)
                self._plans[key] = (pl, pl.workspace())
        return self._plans[key]

    def _launch(self, q16, lengths, table, slots, max_len, scaling, per_query=None):
        """One decode launch of ``q16`` ``[Q, Hq, D]`` with per-query lengths / table rows / sink slots."""
        import cupy as cp
        from gpu_ref.decode import run_planes
        torch = _torch()
        kv = self.kv
        bucket = 1 << max(max_len - 1, 63).bit_length()
        cols = max(1, -(-(bucket - self.side) // self.page_size))
        if table.shape[1] < cols:
            table = torch.nn.functional.pad(table, (0, cols - table.shape[1]))
        pl, ws = self._plan(q16.shape[0], bucket, table.shape[1])
        out = torch.empty(q16.shape, dtype=torch.float32, device=q16.device)
        sink = {}
        if self.side:
            side = [s[slots].contiguous() for s in self._sink_t]
            if per_query is not None:
                per_query(side)
            sink = {f"{k}_sink": _CudaStore._cp(x).view(cp.uint16) for k, x in zip("kv", side)}
        with _CudaStore._stream():
            run_planes(pl, ws, _CudaStore._cp(q16), kv.k_codes, kv.k_scales, kv.v_codes, kv.v_scales,
                       _CudaStore._cp(lengths), _CudaStore._cp(table.contiguous()), q_scale=kv.q_scale,
                       scale=float(scaling), out=_CudaStore._cp(out), out_dtype="fp32", layout=kv.layout, **sink)
        return out

    def attend(self, q, scaling, rows: Rows):
        torch = _torch()
        dev = q.device
        q16 = q.to(torch.bfloat16 if self.bf16 else torch.float16)
        lengths = self._dev(rows, "lengths", lambda: torch.as_tensor(rows.lengths, dtype=torch.int32, device=dev))
        table = self._dev(rows, "table", lambda: torch.as_tensor(rows.table, device=dev))
        slots = self._dev(rows, "slots", lambda: torch.as_tensor(rows.slots, device=dev))
        return self._launch(q16, lengths, table, slots, int(rows.lengths.max()), scaling)

    def attend_chunk(self, q, scaling, rows: Rows):
        """Queries ``[1, Hq, T, D]`` of the row's last T tokens: one launch of T queries, query i over the
        first ``n - T + i + 1`` tokens -> float32 ``[1, T, Hq, D]``."""
        torch = _torch()
        _, hq, t, d = q.shape
        n, dev = int(rows.lengths[0]), q.device
        q16 = q[0].transpose(0, 1).to(torch.bfloat16 if self.bf16 else torch.float16).contiguous()
        lengths = torch.arange(n - t + 1, n + 1, dtype=torch.int32, device=dev)
        table = torch.as_tensor(rows.table, device=dev).expand(t, -1).contiguous()
        slots = torch.as_tensor(rows.slots, device=dev).expand(t)
        per_query = None
        if self.window is not None and self.recent and t > 1:
            raise NotImplementedError("packed prefill of a sliding layer with a recent ring on the kernels")
        if self.recent and t > 1:
            if self._chunk_side is None:
                raise RuntimeError("attend_chunk over a recent ring: the store was built without packed_prefill")
            per_query = (lambda side: recent_per_query(side, *self._chunk_side, t, n, self.sinks,  # noqa: E731
                                                       self.recent))
        return self._launch(q16, lengths, table, slots, n, scaling, per_query)[None]

    def page_bytes(self, pages) -> dict:
        """The golden bytes of ``pages`` (:meth:`gpu_ref.KVCache.host_planes` of those pages),
        ``[pages, KVH, page_size, bytes per vector]``."""
        planes = self.kv.host_planes()
        return {n: planes[n][pages] for n in ("k_codes", "k_scales", "v_codes", "v_scales")}



class Paged16Store:
    """The 16-bit layers of the ``"cuda"`` engine: K and V pools ``[pages, KVH, P, D]`` in the cache's
    16-bit type (the bytes the engine's block accounting counts) and ``[slots, KVH, sinks, D]`` sink rows.
    Attention gathers each batch row's pages (sinks first) and runs torch SDPA in the 16-bit type, the
    query heads of a KV head as one group (no copy per query head), rows past a row's length masked."""

    def __init__(self, sinks, slots, kvh, d, torch_dtype, device, pages, page_size):
        torch = _torch()
        self.sinks, self.dtype, self.page_size = sinks, torch_dtype, page_size
        self.pool = {k: torch.zeros(pages, kvh, page_size, d, dtype=torch_dtype, device=device) for k in "kv"}
        self.sink = {k: torch.zeros(slots, kvh, sinks, d, dtype=torch_dtype, device=device) for k in "kv"}

    def write(self, k16, v16, rows: Rows):
        """k16, v16: ``[B, KVH, T, D]`` in the store's 16-bit type."""
        torch = _torch()
        b, h, t, d = k16.shape
        dev = k16.device
        for kind, x in (("k", k16), ("v", v16)):
            flat = x.transpose(1, 2).reshape(b * t, h, d)
            if len(rows.sink_src):
                at = (torch.as_tensor(rows.sink_slot, device=dev), slice(None), torch.as_tensor(rows.sink_pos, device=dev))
                self.sink[kind][at] = flat[torch.as_tensor(rows.sink_src, device=dev)]
            if len(rows.src):
                at = (torch.as_tensor(rows.page, device=dev), slice(None), torch.as_tensor(rows.row, device=dev))
                self.pool[kind][at] = flat[torch.as_tensor(rows.src, device=dev)]

    def _gather(self, rows: Rows):
        """(k, v) ``[B, KVH, sinks + cols * P, D]`` of the batch rows (token ``j`` at index ``j``)."""
        torch = _torch()
        dev = self.pool["k"].device
        table = torch.as_tensor(rows.table.astype(np.int64), device=dev)
        slots = torch.as_tensor(rows.slots, device=dev)
        out = []
        for kind in "kv":
            pages = self.pool[kind][table]                                   # [B, cols, KVH, P, D]
            b, cols, h, p, d = pages.shape
            pages = pages.permute(0, 2, 1, 3, 4).reshape(b, h, cols * p, d)
            out.append(torch.cat([self.sink[kind][slots], pages], 2))
        return out

    def attend(self, q, scaling, rows: Rows):
        """q float32 ``[B, Hq, D]`` -> float32 ``[B, Hq, D]``: row b over its ``lengths[b]`` tokens."""
        torch = _torch()
        k, v = self._gather(rows)
        b, hq, d = q.shape
        h, n = k.shape[1], k.shape[2]
        lengths = torch.as_tensor(rows.lengths, device=q.device)
        mask = (torch.arange(n, device=q.device)[None, :] < lengths[:, None])[:, None, None]    # [B, 1, 1, N]
        qg = q.to(self.dtype).reshape(b, h, hq // h, d)                     # query heads of a KV head
        o = torch.nn.functional.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scaling)
        return o.reshape(b, hq, d).float()

    def attend_chunk(self, q, scaling, rows: Rows):
        """Queries ``[1, Hq, T, D]`` (float32) of the row's last T tokens, each over the tokens up to its
        own -> float32 ``[1, T, Hq, D]``."""
        torch = _torch()
        n, t = int(rows.lengths[0]), q.shape[2]
        k, v = (x[:, :, :n] for x in self._gather(rows))
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        mask = torch.arange(n, device=q.device)[None, :] <= torch.arange(n - t, n, device=q.device)[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(q.to(self.dtype), k, v, attn_mask=mask, scale=scaling)
        return o.transpose(1, 2).float()
