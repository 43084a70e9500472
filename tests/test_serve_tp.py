"""Tensor-parallel engine on CPU: two gloo processes, transformers' tensor-parallel plan.

A tiny random Llama (4 q / 2 KV heads, saved once) is loaded sharded over 2 ranks (gpu_ref.serve.tp.load);
each rank runs the engine over its KV head (requests joining mid-batch, sinks, the v3 key front end with
its tables sliced to the rank's head). The greedy outputs of both ranks equal the 1-process engine's token
for token, and each rank's pool holds exactly its head's slice of the 1-process pool's packed bytes (codes,
scales, sink rows), half of its bytes. The benchmark's random sharded model (tp.random_model) and its CPU
dry run are checked here too.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_serve import _prompts, _tables  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("K3V3+S2", "v3")
MAXT = [6, 9, 4, 7]


def _run(model, policy, tables):
    """The engine's greedy outputs (two requests, then two more joining after a step) and its pools."""
    from gpu_ref.serve import Engine, SamplingParams
    prompts = _prompts(21, (5, 19, 3, 12))
    e = Engine(model, policy, tables=tables, num_blocks=12, block_size=8, max_batch=3)
    reqs = [e.submit(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts[:2], MAXT[:2])]
    e.step()
    reqs += [e.submit(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts[2:], MAXT[2:])]
    e.run_until_done()
    pools = [{f"{k}_{n}": getattr(st, n)[k] for k in st.codes for n in ("codes", "scales")}
             | {f"{k}_sinks": st.sink_hat[k].numpy() for k in "kv"} for st in e.stores]
    return [r.output for r in reqs], pools, e.block_bytes, list(e.shard.heads)


def _rank(rank, world, port, path, q):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        from gpu_ref.serve import tp
        tp.init("cpu")
        m = tp.load(path, dtype=torch.float64)
        res = {pol: _run(m, pol, _tables() if pol == "v3" else None) for pol in POLICIES}
        # the benchmark's sharded random model: this rank's shards only, the same logits on both ranks
        from transformers import LlamaConfig
        cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32)
        r = tp.random_model(cfg, torch.float32, torch.device("cpu"), world=world)
        attn = r.model.layers[0].self_attn
        with torch.no_grad():
            logits = r(torch.tensor([[1, 2, 3]])).logits
        res["random"] = (tuple(attn.k_proj.weight.to_local().shape), tuple(attn.o_proj.weight.to_local().shape),
                         sorted(n for n, p in r.named_parameters() if not hasattr(p, "to_local")),
                         (logits.to_local() if hasattr(logits, "to_local") else logits).numpy(),
                         float(r.model.rotary_emb.inv_freq[1]), tp.shard_of(r).heads)
        q.put((rank, res))
        torch.distributed.destroy_process_group()
    except Exception as err:                          # reported to the parent, never a hang
        q.put((rank, f"{type(err).__name__}: {err}"))
        raise


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tp2_engine_equals_one_process_and_pools_hold_their_heads(tmp_path):
    import torch.multiprocessing as mp
    from gpu_ref import hf
    from test_hf import tiny
    # 4 q heads, 2 KV heads, head_dim 64, 2 layers; float64 so that the row-parallel all-reduce's order of
    # summation never moves a K/V value across a 16-bit rounding boundary (float32 does, rarely)
    m = tiny().double()
    m.save_pretrained(tmp_path / "tiny")
    torch.set_num_threads(1)
    want = {pol: _run(m, pol, _tables() if pol == "v3" else None) for pol in POLICIES}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, str(tmp_path / "tiny"), q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    for r in range(2):
        assert not isinstance(got[r], str), got[r]
    hf.enable(m)
    for pol in POLICIES:
        outs, pools, block_bytes, _ = want[pol]
        for r in range(2):
            r_outs, r_pools, r_block, heads = got[r][pol]
            assert heads == [r]                      # rank r holds KV head r
            assert r_outs == outs, (pol, r)           # token for token
            assert 2 * r_block == block_bytes          # a block of the rank is half the 1-process block
            for layer, (ref, mine) in enumerate(zip(pools, r_pools)):
                assert set(mine) == set(ref)
                for name, a in ref.items():
                    assert mine[name].shape[1] == 1
                    assert np.array_equal(mine[name], a[:, heads]), (pol, r, layer, name)
            assert sum(a.nbytes for p_ in r_pools for n, a in p_.items() if not n.endswith("sinks")) * 2 == \
                sum(a.nbytes for p_ in pools for n, a in p_.items() if not n.endswith("sinks"))
        assert len({t for o in outs for t in o}) > 3     # the outputs are not one repeated token
    k_shape, o_shape, plain, logits, inv1, heads = got[0]["random"]
    assert k_shape == (32, 64) and o_shape == (64, 64) and heads == (0,)   # half the KV / q heads' rows, cols
    assert got[1]["random"][5] == (1,)
    assert "model.norm.weight" in plain and np.isfinite(logits).all() and logits.shape == (1, 3, 64)
    assert np.allclose(logits, got[1]["random"][3]) and inv1 == pytest.approx(10000.0 ** (-2 / 32))


def test_tp_bench_dry_run(tmp_path):
    """The benchmark's code path on CPU (one rank, golden stores): concurrency from the pool, timed steps,
    the JSON entry and the plot."""
    from bench.gpu import tp as bench
    assert bench.main(["--dry-run", "--caches", "bf16,K3V3", "--steps", "1", "--warmup", "0", "--context", "40",
                       "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gpu_bench_tp.json").read_text())
    run = doc["runs"]["1"]
    assert run["node"]["gpus"] == 1 and run["context"] == 40 and (tmp_path / "gpu_bench_tp.png").exists()
    bf, k3 = run["caches"]
    assert bf["max_concurrency"] == (1 << 19) // bf["block_bytes_per_rank"] // bf["blocks_per_seq"]
    assert k3["max_concurrency"] > 4 * bf["max_concurrency"] and k3["batch"] == k3["max_concurrency"]
    assert k3["tokens_per_s"] > 0 and k3["tpot_ms_p99"] >= k3["tpot_ms_p50"] > 0
    with pytest.raises(SystemExit):
        bench.parse(["--caches", "K5V5"])


def test_tp_shard_of_one_process_is_every_head():
    from gpu_ref.serve import tp
    from test_hf import tiny
    s = tp.shard_of(tiny())
    assert (s.world, s.heads, s.q_heads, s.local_kv_heads) == (1, (0, 1), 4, 2)
