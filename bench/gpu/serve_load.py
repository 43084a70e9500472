"""Serving under load: the OpenAI server in-process, concurrent streaming clients, a packed cache against the
16-bit cache in the same pool bytes.

    python -m bench.gpu --routine serve [--quick] [options]          (GPU: kernels, random Llama-3-8B shape)
    python -m bench.gpu.serve_load --cpu [--out DIR]                  (CPU smoke: golden backend, tiny model)

Per cache (``--caches``; ``bf16``: the engine's 16-bit pool, :class:`gpu_ref.serve.paged.Paged16Store` on the
GPU; ``v4`` / ``v3`` / ``K3V3``: packed, :class:`~gpu_ref.serve.paged.CudaPagedStore`) an :class:`gpu_ref.serve.Engine`
gets a pool of the same ``--pool-gib`` bytes (the packed pool's flag bytes counted, as ``bench.gpu.tp``
does, and the kernels' 16-bit side rows of every slot: sinks and the recent ring), and :class:`gpu_ref.serve.server.OpenAIServer` listens on an ephemeral loopback port. ``--clients``
threads (``http.client``) send ``POST /v1/completions`` with ``stream: true`` back to back, each taking the
next request of one workload drawn from ``--seed``: ``--requests`` requests whose total tokens (prompt +
``max_tokens``) are uniform in ``[--context-min, --context-max]`` and whose ``max_tokens`` are uniform in
``[--output-min, --output-max]``, greedy, prompts as token ids; the same workload for every cache. No request
starts after ``--max-seconds``; those still running ``--grace-seconds`` later are cut (the client closes its
connection, which cancels them) and counted as incomplete. The server ignores EOS here, so a finished
request has exactly its ``max_tokens`` tokens (``stream_options.include_usage`` reports them).

Recorded per cache: requests/s and output tokens/s over the run's wall time, TTFT (request sent to first
token, queueing included) and TPOT (``(last token - first token) / (tokens - 1)`` per request) p50 / p99,
end-to-end latency, and the largest number of concurrent sequences the pool holds: by construction (pool
blocks over one request's blocks, at the workload's longest, mean and shortest request) and observed (the
engine's most running requests; the engine's slots are not the limit: ``max_batch`` is the construction at
the shortest request). With ``--model SPEC`` (a real model, ``--tables`` for v4 / v3) the prompts are windows of
real text and the greedy texts of each packed cache are compared with the 16-bit cache's (identical
fraction, common prefix); without it the model is the Llama-3-8B shape (32 layers, 32 q / 8 KV heads,
head_dim 128) with random bf16 weights, as ``bench.gpu.hf``'s step benchmark, and key tables mu = 0, s = 1.

Results: ``gpu_serve_load.json``, one entry per card under ``cards`` (a real model's run: per card and
model, ``"CARD: MODEL_ID"``); a run replaces its caches in its entry and keeps the others while the
workload and pool are the same (so ``--caches bf16`` and ``--caches v4`` may run as separate commands),
and the plot ``gpu_serve_load.png`` beside it. ``--cpu``
(smoke: tiny random Llama, golden backend, short contexts, a pool of 2.5 16-bit sequences) checks the code
path and the report's invariants (:func:`check`); its numbers are no performance claim.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import http.client
import itertools
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
FNAME = "gpu_serve_load.json"
#: cache name -> policy spec ("fp16": the 16-bit pool)
CACHES = {"bf16": "fp16", "v4": "v4", "v3": "v3", "K3V3": "K3V3"}


def _tabled(name: str) -> bool:
    """The cache's policy reads the model's key tables (centering / key scales)."""
    from sim_models import CachePolicy
    pol = CachePolicy.parse(CACHES[name])
    return bool(pol.center_keys or pol.key_scale)
#: the random model's shape (bench.gpu.hf's Llama-3-8B)
SHAPE = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, head_dim=128, vocab_size=128256, rope_theta=500000.0)
#: --cpu: a tiny random Llama (the golden stores run it in seconds)
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, vocab_size=512)
#: defaults per mode: (context min, max, output min, max, requests, clients, max seconds, block size)
MODES = {"gpu": (32768, 131072, 128, 512, 32, 24, 180.0, 64),
         "quick": (32768, 65536, 64, 256, 12, 12, 150.0, 64),
         "cpu": (96, 160, 4, 16, 16, 8, 120.0, 16)}
#: random prompts draw token ids below this (a 128K-token prompt stays under the server's 1 MiB body)
PROMPT_IDS = 100000
NAME = "load"


def log(s):
    print(s, flush=True)


class IdTokenizer:
    """The random models' tokenizer: token ids as text (``' 17 4 ...'``), no EOS."""

    eos_token_id = None

    def __init__(self):
        self._s: dict = {}

    def encode(self, text, add_special_tokens=True):
        return [int(x) for x in text.split()]

    def decode(self, ids):
        s = self._s
        return "".join(s.get(i) or s.setdefault(i, f" {int(i)}") for i in ids)


class NoEos:
    """A real tokenizer with its EOS hidden from the server: every request runs to ``max_tokens``."""

    eos_token_id = None

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)


# ----------------------------------------------------------------------------------------------- options
def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.serve_load", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or RESULTS),
                    help="folder of the results file (default $OUT, else bench/results)")
    ap.add_argument("--cpu", action="store_true", help="smoke on the CPU: tiny random model, golden backend")
    ap.add_argument("--quick", action="store_true", help="GPU, shorter: contexts 32K-64K, 12 requests")
    ap.add_argument("--caches", default="bf16,v4", help=f"of {', '.join(CACHES)} (default bf16,v4)")
    ap.add_argument("--model", metavar="SPEC", help="a real model (sim_models.models.resolve) instead of the "
                                                    "random Llama-3-8B shape")
    ap.add_argument("--tables", help="--model's key tables (v4, v3)")
    ap.add_argument("--text", help="--model: the text prompts are drawn from (default: "
                                   "sim_models.calibrate.read_text)")
    ap.add_argument("--layers", type=int, help="decoder layers of the random model (default 32)")
    ap.add_argument("--pool-gib", type=float, help="pool bytes of every cache, GiB (default: the GPU memory free "
                                                   "after the weights less --reserve-gib; --cpu: 2.5 16-bit "
                                                   "sequences of --context-max)")
    ap.add_argument("--reserve-gib", type=float, default=16.0, help="GPU memory kept out of the default pool for "
                                                                    "prefill activations (default 16)")
    for flag, i, what in (("--context-min", 0, "fewest tokens (prompt + max_tokens) of a request"),
                          ("--context-max", 1, "most tokens of a request"),
                          ("--output-min", 2, "fewest max_tokens"), ("--output-max", 3, "most max_tokens"),
                          ("--requests", 4, "requests of the workload"), ("--clients", 5, "concurrent clients"),
                          ("--block-size", 7, "tokens per pool block")):
        ap.add_argument(flag, type=int, help=f"{what} (default gpu / --quick / --cpu: "
                                             f"{' / '.join(str(m[i]) for m in MODES.values())})")
    ap.add_argument("--max-seconds", type=float, help="no request starts later (default 180 / 150 / 120)")
    ap.add_argument("--grace-seconds", type=float, help="requests still running this long after --max-seconds "
                                                        "are cut (default a sixth of --max-seconds)")
    ap.add_argument("--max-batch", type=int, default=256, help="engine slots at most (default 256)")
    ap.add_argument("--seed", type=int, default=0, help="the workload's seed (default 0)")
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args(argv)
    if a.cpu and a.quick:
        ap.error("--cpu and --quick: choose one")
    a.mode = "cpu" if a.cpu else ("quick" if a.quick else "gpu")
    d = MODES[a.mode]
    for name, v in zip(("context_min", "context_max", "output_min", "output_max", "requests", "clients",
                        "max_seconds", "block_size"), d):
        if getattr(a, name) is None:
            setattr(a, name, v)
    if a.grace_seconds is None:
        a.grace_seconds = a.max_seconds / 6
    a.caches = [c for c in a.caches.split(",") if c]
    bad = [c for c in a.caches if c not in CACHES]
    if bad or not a.caches:
        ap.error(f"--caches: unknown {bad or 'empty'}; choose from {', '.join(CACHES)}")
    for name in ("context_min", "output_min", "requests", "clients", "block_size", "max_batch"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.output_max < a.output_min:
        ap.error(f"--output-max {a.output_max} < --output-min {a.output_min}")
    if a.context_max < a.context_min:
        ap.error(f"--context-max {a.context_max} < --context-min {a.context_min}")
    if a.context_min <= a.output_max:
        ap.error(f"--context-min {a.context_min} must exceed --output-max {a.output_max} (every prompt has a token)")
    if not a.max_seconds > 0 or a.grace_seconds < 0:
        ap.error("--max-seconds must be > 0 and --grace-seconds >= 0")
    if a.pool_gib is not None and not a.pool_gib > 0:
        ap.error(f"--pool-gib must be > 0, got {a.pool_gib}")
    if a.reserve_gib < 0:
        ap.error(f"--reserve-gib must be >= 0, got {a.reserve_gib}")
    if a.layers is not None and (a.layers < 1 or a.model):
        ap.error("--layers: >= 1, for the random model only")
    if a.tables and not a.model:
        ap.error("--tables goes with --model (the random model uses tables mu = 0, s = 1)")
    if a.text and not a.model:
        ap.error("--text goes with --model")
    if a.out.exists() and not a.out.is_dir():
        ap.error(f"--out {a.out}: not a folder")
    a.ap = ap
    return a


# ----------------------------------------------------------------------------------------------- model
def _device(a):
    import torch
    return torch.device("cpu" if a.cpu else "cuda")


def build_model(a):
    """(model, tokenizer, tables or None, description) of the run."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    dev = _device(a)
    if a.model:
        from gpu_ref.cli import check_model_options, check_tables_fit
        from sim_models.models import load
        tabled = [c for c in a.caches if _tabled(c)]
        a.policy, a.backend = CACHES[tabled[0]] if tabled else a.caches[-1], "golden" if a.cpu else "cuda"
        check_model_options(a.ap, a)
        if tabled and a.key_tables is None:
            a.ap.error(f"--caches {tabled[0]} with --model needs --tables (python -m sim_models.calibrate)")
        model, tok = load(a.src, dtype=torch.float32 if a.cpu else torch.bfloat16)
        model = model.to(dev).eval()
        check_tables_fit(a.ap, a, model)
        mpe = getattr(model.config, "max_position_embeddings", None)
        if mpe and a.context_max > mpe:
            a.ap.error(f"--context-max {a.context_max} exceeds --model's context of {mpe} tokens")
        return model, NoEos(tok), a.key_tables, f"{a.src.description}"
    kw = dict(TINY if a.cpu else SHAPE)
    if a.layers:
        kw["num_hidden_layers"] = a.layers
    cfg = LlamaConfig(max_position_embeddings=a.context_max + 1024, **kw)
    torch.manual_seed(0)
    if a.cpu:
        model = LlamaForCausalLM(cfg).eval()
        desc = f"tiny random Llama ({kw['num_hidden_layers']} layers, {kw['num_attention_heads']} q / " \
               f"{kw['num_key_value_heads']} KV heads, head_dim {kw['head_dim']}), fp32"
    else:
        with torch.device(dev):
            model = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16).eval()
        desc = f"Llama-3-8B shape ({kw['num_hidden_layers']} layers, 32 q / 8 KV heads, head_dim 128), random bf16"
    from gpu_ref.hf import model_shape
    from sim_models import KeyTables
    n, _, kvh, d = model_shape(cfg)
    tables = KeyTables("timing", np.zeros((n, kvh, d), np.float16), np.zeros((n, kvh, d), np.int8))
    return model, IdTokenizer(), tables, desc


# ----------------------------------------------------------------------------------------------- workload
def workload(a, tok, vocab: int) -> list[dict]:
    """The seeded requests: ``prompt`` (token ids), ``max_tokens``."""
    rng = np.random.default_rng(a.seed)
    total = rng.integers(a.context_min, a.context_max + 1, a.requests)
    out = rng.integers(a.output_min, a.output_max + 1, a.requests)
    reqs = []
    if a.model:
        from sim_models.calibrate import read_text
        try:
            text = read_text(a.text)
        except FileNotFoundError as err:
            a.ap.error(f"--text: {err}")
        ids = np.asarray(tok.encode(text[:max(40 * a.context_max, 1 << 20)], add_special_tokens=False))
        if len(ids) <= a.context_max:
            a.ap.error(f"--text: {len(ids)} tokens, fewer than --context-max {a.context_max}")
    for t, o in zip(total, out):
        n = int(t - o)
        if a.model:
            start = int(rng.integers(0, len(ids) - n))
            prompt = ids[start:start + n].tolist()
        else:
            prompt = rng.integers(0, min(vocab, PROMPT_IDS), n).tolist()
        reqs.append({"prompt": prompt, "max_tokens": int(o)})
    return reqs


def _body(r) -> bytes:
    return json.dumps({"model": NAME, "prompt": r["prompt"], "max_tokens": r["max_tokens"], "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}, separators=(",", ":")).encode()


# ----------------------------------------------------------------------------------------------- client
class _Live:
    """The clients' open connections (the main thread cuts them at the hard deadline)."""

    def __init__(self):
        self.lock, self.conns, self.cut = threading.Lock(), set(), False

    def add(self, c):
        with self.lock:
            if self.cut:
                return False
            self.conns.add(c)
            return True

    def remove(self, c):
        with self.lock:
            self.conns.discard(c)

    def cut_all(self):
        with self.lock:
            self.cut = True
            for c in self.conns:
                try:
                    c.sock.shutdown(socket.SHUT_RDWR)
                except (OSError, AttributeError):
                    pass


def one_request(addr, i, r, body, live, keep_text) -> dict:
    """Send request ``i``, read its stream; timings in seconds from the send."""
    rec = {"i": i, "prompt_tokens": len(r["prompt"]), "max_tokens": r["max_tokens"], "tokens": 0, "chunks": 0,
           "finish_reason": None, "complete": False}
    conn = http.client.HTTPConnection(*addr, timeout=3600)
    t0 = time.perf_counter()
    rec["t_send"] = time.monotonic()
    first = last = None
    parts = []
    try:
        conn.connect()
        if not live.add(conn):
            rec["error"] = "not sent (the run was cut)"
            return rec
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}"
            return rec
        done = False
        while True:
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                done = True
                break
            msg = json.loads(data)
            now = time.perf_counter()
            if msg.get("usage"):
                rec["tokens"] = msg["usage"]["completion_tokens"]
            for ch in msg.get("choices", []):
                if ch.get("text"):
                    rec["chunks"] += 1
                    parts.append(ch["text"])
                    first = now if first is None else first
                    last = now
                if ch.get("finish_reason"):
                    rec["finish_reason"] = ch["finish_reason"]
        rec["complete"] = done and rec["finish_reason"] == "length"
        if not done:
            rec["error"] = "cut (stream ended before [DONE])"
    except (OSError, http.client.HTTPException, ValueError) as err:
        rec["error"] = f"{type(err).__name__}: {err}"[:300]
    finally:
        live.remove(conn)
        conn.close()
    end = time.perf_counter()
    if not rec["complete"]:
        rec["tokens"] = rec["tokens"] or rec["chunks"]
    rec["e2e_s"] = end - t0
    if first is not None:
        rec["ttft_s"] = first - t0
        if rec["tokens"] > 1:
            rec["tpot_s"] = (last - first) / (rec["tokens"] - 1)
    text = "".join(parts)
    rec["text_sha1"] = hashlib.sha1(text.encode()).hexdigest()
    if keep_text:
        rec["text"] = text
    return rec


def drive(addr, reqs, bodies, clients, max_s, grace_s, keep_text, sample) -> tuple[list, float, list]:
    """Closed loop: ``clients`` threads take the next request until all are sent or ``max_s`` passed; cut
    the rest at ``max_s + grace_s``. Returns (records, wall seconds, timeline of ``sample()``)."""
    nxt = itertools.count()
    recs, lock, live = [], threading.Lock(), _Live()
    t0 = time.monotonic()

    def client():
        while True:
            i = next(nxt)
            if i >= len(reqs) or time.monotonic() - t0 > max_s:
                return
            rec = one_request(addr, i, reqs[i], bodies[i], live, keep_text)
            rec["t_send"] -= t0
            with lock:
                recs.append(rec)
    threads = [threading.Thread(target=client, name=f"client-{k}", daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    timeline = []
    while any(t.is_alive() for t in threads):
        now = time.monotonic() - t0
        timeline.append([round(now, 2), *sample()])
        if now > max_s + grace_s and not live.cut:
            live.cut_all()
        time.sleep(0.1 if now < 10 else 0.5)
    wall = time.monotonic() - t0
    for t in threads:
        t.join()
    timeline.append([round(wall, 3), *sample()])
    return sorted(recs, key=lambda r: r["i"]), wall, timeline


# ----------------------------------------------------------------------------------------------- one cache
def _pct(x, q):
    return float(np.percentile(x, q)) if len(x) else None


def _free(dev):
    gc.collect()
    if dev.type == "cuda":
        import torch
        try:
            import cupy
            cupy.get_default_memory_pool().free_all_blocks()
        except ImportError:
            pass
        torch.cuda.empty_cache()


def run_cache(a, model, tok, tables, name, reqs, bodies, pool_bytes) -> dict:
    from gpu_ref.serve import Engine
    from gpu_ref.serve.server import OpenAIServer
    spec = CACHES[name]
    backend = "golden" if a.cpu else "cuda"
    dev = _device(a)
    tabs = tables if _tabled(name) else None
    ctx = max(len(r["prompt"]) + r["max_tokens"] for r in reqs) + 64
    probe = Engine(model, spec, tables=tabs, backend=backend, num_blocks=1, block_size=a.block_size, max_batch=1,
                   max_context=ctx, prefix_sharing=False)
    block = probe.block_bytes
    # the kernels' pool also keeps one flag byte per row, kind and KV head (not in a block's packed bytes)
    flags = 0 if spec == "fp16" or backend == "golden" else \
        2 * sum(w is None for w in probe.windows) * probe.shard.local_kv_heads * a.block_size
    sizes = [len(r["prompt"]) + r["max_tokens"] for r in reqs]
    per = {k: probe.blocks_for(v) for k, v in (("longest", max(sizes)), ("mean", round(float(np.mean(sizes)))),
                                               ("shortest", min(sizes)))}
    # per slot, outside the pool: the kernels' 16-bit side rows (sinks and the recent ring) of every full layer
    from gpu_ref.hf import model_shape
    pol = probe.policy
    _, _, _, d = model_shape(probe.config)
    side = (0 if spec == "fp16" or backend == "golden" else 2 * (pol.sinks + pol.recent) * sum(w is None for w in probe.windows)
            * probe.shard.local_kv_heads * d * 2)
    del probe
    num_blocks = pool_bytes // (block + flags)
    slots = max(1, min(a.max_batch, num_blocks // per["shortest"]))
    num_blocks = max(pool_bytes - slots * side, 0) // (block + flags)       # the side rows from the same memory
    held = {f"at_{k}": int(num_blocks // v) for k, v in per.items()}
    res = dict(cache=name, spec=spec, backend=backend, block_size=a.block_size, block_bytes=block,
               flag_bytes_per_block=flags, side_bytes_per_slot=side, side_slots=int(slots),
               num_blocks=int(num_blocks), pool_bytes=int(num_blocks * (block + flags) + slots * side),
               blocks_per_request=per, concurrency_by_construction=held)
    log(f"{name}: {num_blocks} blocks of {block + flags} B ({_size(res['pool_bytes'])}); holds "
        f"{held['at_longest']} / {held['at_mean']} / {held['at_shortest']} requests at the longest / mean / "
        f"shortest request")
    if held["at_longest"] < 1:
        res["skipped"] = "the pool holds no request of the workload's longest"
        return res
    max_batch = max(1, min(a.max_batch, held["at_shortest"]))
    e = Engine(model, spec, tables=tabs, backend=backend, num_blocks=int(num_blocks), block_size=a.block_size,
               max_batch=max_batch, max_queue=len(reqs) + a.clients + 4, max_context=ctx, prefix_sharing=False)
    if dev.type == "cuda":
        import torch
        torch.cuda.reset_peak_memory_stats()
    srv = OpenAIServer(e, tok, NAME, ("127.0.0.1", 0), policy_names=(name,))
    srv.serve_in_thread()
    addr = srv.server_address[:2]
    try:
        # warm-up, not timed: short requests decoded together at every batch size up to min(clients, 8) (the
        # kernels compile on first use)
        warm = [{"prompt": r["prompt"][:64], "max_tokens": 4 + 2 * k} for k, r in enumerate(reqs[:min(a.clients, 8)])]
        w, _, _ = drive(addr, warm, [_body(r) for r in warm], len(warm), 600.0, 60.0, False, lambda: ())
        if not all(r["complete"] for r in w):
            raise RuntimeError(f"warm-up request failed: {[r.get('error') for r in w if not r['complete']]}")
        e.max_running, steps0 = 0, e.steps

        def sample(e=e):
            return len(e.running), len(e.waiting)
        recs, wall, timeline = drive(addr, reqs, bodies, a.clients, a.max_seconds, a.grace_seconds,
                                     bool(a.model), sample)
        st = e.stats()
    finally:
        srv.close()
    if dev.type == "cuda":
        import torch
        res["torch_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        try:
            import cupy
            res["cupy_pool_gib"] = cupy.get_default_memory_pool().total_bytes() / 2**30
        except ImportError:
            pass
    done = [r for r in recs if r["complete"]]
    ttft = [r["ttft_s"] for r in done]
    tpot = [r["tpot_s"] for r in done if "tpot_s" in r]
    e2e = [r["e2e_s"] for r in done]
    tokens = sum(r["tokens"] for r in recs)
    res.update(max_batch=max_batch, clients=a.clients, requests_sent=len(recs), requests_completed=len(done),
               requests_incomplete=len(recs) - len(done), requests_not_sent=len(reqs) - len(recs),
               wall_s=wall, requests_per_s=len(done) / wall, output_tokens_per_s=tokens / wall,
               output_tokens=tokens, prompt_tokens=sum(r["prompt_tokens"] for r in done),
               ttft_s_p50=_pct(ttft, 50), ttft_s_p99=_pct(ttft, 99), tpot_ms_p50=_pct(np.array(tpot) * 1e3, 50),
               tpot_ms_p99=_pct(np.array(tpot) * 1e3, 99), e2e_s_p50=_pct(e2e, 50), e2e_s_p99=_pct(e2e, 99),
               concurrency_observed=st["max_running"], steps=st["steps"] - steps0,
               free_blocks_after=st["free_blocks"], timeline=timeline, requests=recs)
    log(f"{name}: {len(done)}/{len(reqs)} requests in {wall:.1f} s: {res['requests_per_s']:.3f} req/s, "
        f"{res['output_tokens_per_s']:.1f} output tok/s; TTFT p50 {_fmt(res['ttft_s_p50'])} s, p99 "
        f"{_fmt(res['ttft_s_p99'])} s; TPOT p50 {_fmt(res['tpot_ms_p50'])} ms, p99 {_fmt(res['tpot_ms_p99'])} ms; "
        f"concurrency observed {res['concurrency_observed']} (by construction {held['at_mean']} at the mean)")
    del e, srv
    _free(dev)
    return res


def _fmt(x):
    return "n/a" if x is None else f"{x:.3g}"


def _size(b) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.3g} MiB"


# ----------------------------------------------------------------------------------------------- report
def compare(caches: dict) -> dict:
    """Each packed cache against ``bf16``: ratios, and the agreement of the greedy texts."""
    base = caches.get("bf16")
    out = {}
    if not base or "requests" not in base:
        return out
    btext = {r["i"]: r for r in base["requests"] if r["complete"]}
    for name, c in caches.items():
        if name == "bf16" or "requests" not in c:
            continue
        o = {}
        for k in ("requests_per_s", "output_tokens_per_s", "concurrency_observed"):
            if base.get(k):
                o[f"{k}_vs_bf16"] = c[k] / base[k]
        cb = c["concurrency_by_construction"]["at_mean"]
        bb = base["concurrency_by_construction"]["at_mean"]
        o["concurrency_by_construction_vs_bf16"] = cb / bb if bb else None
        pairs = [(r, btext[r["i"]]) for r in c["requests"] if r["complete"] and r["i"] in btext]
        if pairs:
            o["greedy_identical_fraction"] = sum(p["text_sha1"] == q["text_sha1"] for p, q in pairs) / len(pairs)
            if all("text" in p and "text" in q for p, q in pairs):
                pre = [os.path.commonprefix([p["text"], q["text"]]) for p, q in pairs]
                o["greedy_common_prefix_fraction"] = float(np.mean(
                    [len(x) / max(len(q["text"]), 1) for x, (_, q) in zip(pre, pairs)]))
            o["compared_requests"] = len(pairs)
        out[name] = o
    return out


def check(entry: dict) -> list[str]:
    """The report's invariants; returns the violations (empty: all hold). Per cache: counts add up, every
    completed request has exactly its ``max_tokens`` tokens (one streamed chunk each), percentiles are
    ordered, the observed concurrency stays within the construction at the shortest request, the pool is
    whole again after the run; between caches: the same pool bytes (within one block), and each packed
    pool holds more sequences than the 16-bit one by construction and by observation."""
    bad = []
    caches = entry["caches"]
    for name, c in caches.items():
        if "skipped" in c:
            continue
        n = entry["workload"]["requests"]
        if c["requests_sent"] + c["requests_not_sent"] != n or \
                c["requests_completed"] + c["requests_incomplete"] != c["requests_sent"]:
            bad.append(f"{name}: request counts do not add up")
        one = entry.get("one_chunk_per_token", True)      # the random models' tokenizer: a chunk per token
        for r in c["requests"]:
            if r["complete"] and not (r["tokens"] == r["max_tokens"] and r["finish_reason"] == "length"
                                      and (r["chunks"] == r["tokens"] if one else 1 <= r["chunks"] <= r["tokens"])):
                bad.append(f"{name}: request {r['i']} finished with {r['tokens']} tokens / {r['chunks']} chunks, "
                           f"asked {r['max_tokens']}")
        for k in ("ttft_s", "tpot_ms", "e2e_s"):
            p50, p99 = c[f"{k}_p50"], c[f"{k}_p99"]
            if c["requests_completed"] and not (p50 is not None and p99 is not None and 0 <= p50 <= p99):
                bad.append(f"{name}: {k} p50 {p50} and p99 {p99} out of order")
        held = c["concurrency_by_construction"]
        if not held["at_longest"] <= held["at_mean"] <= held["at_shortest"]:
            bad.append(f"{name}: construction not ordered {held}")
        if not 1 <= c["concurrency_observed"] <= min(held["at_shortest"], c["max_batch"], c["clients"]):
            bad.append(f"{name}: observed concurrency {c['concurrency_observed']} outside 1..{held['at_shortest']}")
        if c["free_blocks_after"] != c["num_blocks"]:
            bad.append(f"{name}: {c['num_blocks'] - c['free_blocks_after']} blocks still held after the run")
    base = caches.get("bf16")
    for name, c in caches.items():
        if name == "bf16" or base is None or "skipped" in c or "skipped" in base:
            continue
        if abs(c["pool_bytes"] - base["pool_bytes"]) > max(c["block_bytes"] + c["flag_bytes_per_block"],
                                                           base["block_bytes"]):
            bad.append(f"{name}: pool of {c['pool_bytes']} B, bf16's {base['pool_bytes']} B")
        for k in ("at_longest", "at_mean", "at_shortest"):
            if not c["concurrency_by_construction"][k] > base["concurrency_by_construction"][k]:
                bad.append(f"{name}: holds {c['concurrency_by_construction'][k]} requests {k}, not more than "
                           f"bf16's {base['concurrency_by_construction'][k]}")
        if not c["concurrency_observed"] > base["concurrency_observed"]:
            bad.append(f"{name}: observed {c['concurrency_observed']} concurrent requests, not more than bf16's "
                       f"{base['concurrency_observed']}")
    return bad


def _card(a):
    if a.cpu:
        return "CPU (golden backend, smoke)"
    import torch
    return torch.cuda.get_device_name()


def _entry_key(a) -> str:
    """The run's entry in the results file: the card, and the model's id after it for a real model (a
    real model's run and the random model's are kept side by side)."""
    return _card(a) if not a.model else f"{_card(a)}: {a.src.model_id}"


def _one_process_per_cache(a, argv) -> int:
    """On the GPU, several caches: one child process per cache, in order, the first sizing the pool and the
    others given its exact bytes (memory one cache's run frees inside a process is not reliably available
    to the next one's CUDA allocations). The children merge into one card entry; the last checks it."""
    import subprocess
    rest, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x == "--caches":
            skip = True
        elif not x.startswith("--caches="):
            rest.append(x)
    rc, pool = 0, (None if a.pool_gib is None else int(a.pool_gib * 2**30))
    for name in a.caches:
        extra = [] if pool is None else ["--pool-gib", repr(pool / 2**30)]
        r = subprocess.run([sys.executable, "-m", "bench.gpu.serve_load", *rest, "--caches", name, *extra])
        rc = max(rc, r.returncode)
        if r.returncode == 2:
            return rc
        if pool is None:
            doc = json.loads((a.out / FNAME).read_text())
            pool = doc["cards"][_entry_key(a)]["pool_bytes_asked"]
    return rc


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse(argv)
    if not a.cpu and len(a.caches) > 1:
        return _one_process_per_cache(a, argv)
    import torch
    if not a.cpu:
        from bench.gpu import gpu_missing
        missing = gpu_missing()
        if missing:
            print(f"python -m bench.gpu.serve_load: error: {missing} (--cpu runs the smoke on the CPU)",
                  file=sys.stderr)
            return 2
    else:
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    t_start = time.time()
    model, tok, tables, desc = build_model(a)
    dev = _device(a)
    from gpu_ref import hf
    from gpu_ref.serve import cache_bytes
    from sim_models import CachePolicy
    hf.enable(model)
    cfg = model.config
    reqs = workload(a, tok, cfg.vocab_size)
    bodies = [_body(r) for r in reqs]
    from gpu_ref.serve.server import MAX_BODY
    if max(map(len, bodies)) > MAX_BODY:
        a.ap.error(f"--context-max {a.context_max}: a prompt's body is over the server's {MAX_BODY} bytes")
    wbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if a.pool_gib is not None:
        pool = int(a.pool_gib * 2**30)
    elif a.cpu:
        pool = int(2.5 * cache_bytes(cfg, CachePolicy.parse("fp16"), a.context_max, "fp16"))
    else:
        _free(dev)
        pool = int(torch.cuda.mem_get_info()[0] - a.reserve_gib * 2**30)
        if pool <= 0:
            a.ap.error(f"--reserve-gib {a.reserve_gib}: no GPU memory is left for the pool")
    log(f"{_card(a)}: {desc}, {_size(wbytes)} of weights; pool {_size(pool)} per cache; "
        f"{len(reqs)} requests of {a.context_min}-{a.context_max} tokens ({a.output_min}-{a.output_max} out), "
        f"{a.clients} clients")
    wl = dict(seed=a.seed, requests=len(reqs), clients=a.clients, context_min=a.context_min,
              context_max=a.context_max, output_min=a.output_min, output_max=a.output_max,
              max_seconds=a.max_seconds, grace_seconds=a.grace_seconds,
              prompt_tokens_mean=float(np.mean([len(r["prompt"]) for r in reqs])),
              max_tokens_mean=float(np.mean([r["max_tokens"] for r in reqs])))
    setup = dict(mode=a.mode, model=a.model or ("tiny random Llama" if a.cpu else "random Llama-3-8B shape"),
                 layers=cfg.num_hidden_layers, pool_bytes_asked=pool, block_size=a.block_size, workload=wl)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / FNAME
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.update(benchmark="serve_load", note="python -m bench.gpu --routine serve (bench/gpu/serve_load.py): the "
               "OpenAI server in-process, concurrent streaming clients, packed caches against the 16-bit cache in "
               "the same pool bytes; one entry per card (a real model's: per card and model)")
    cards = doc.setdefault("cards", {})
    key = _entry_key(a)
    entry = cards.get(key)
    if entry is None or {k: entry.get(k) for k in setup} != setup:
        entry = cards[key] = dict(setup, caches={})
    entry.update(description=desc, weights_gib=wbytes / 2**30, torch=torch.__version__,
                 one_chunk_per_token=not a.model)
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(0)
        entry.update(device=p.name, gpu_mem_gib=p.total_memory / 2**30)
    for name in a.caches:
        entry["caches"][name] = run_cache(a, model, tok, tables, name, reqs, bodies, pool)
        entry["vs_bf16"] = compare(entry["caches"])
        entry["invariants_violated"] = check(entry)
        path.write_text(json.dumps(doc, indent=1) + "\n")
    entry["seconds"] = time.time() - t_start
    path.write_text(json.dumps(doc, indent=1) + "\n")
    for name, o in entry["vs_bf16"].items():
        log(f"{name} vs bf16: " + ", ".join(f"{k} {_fmt(v)}" for k, v in o.items()))
    for v in entry["invariants_violated"]:
        log(f"invariant violated: {v}")
    log(f"wrote {path}")
    if not a.no_plot:
        from bench.gpu import plots
        plots.plot(str(path))
    return 1 if entry["invariants_violated"] else 0


if __name__ == "__main__":
    sys.exit(main())
