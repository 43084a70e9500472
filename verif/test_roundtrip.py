"""pytest entry points: kv_encoder -> kv_decoder round trip (Verilator + cocotb).

Builds ``rt_<config>`` (verif/build.py; cached in build/sim/rt_<config>/) and runs
verif/tb_roundtrip.py on it. Settings from the environment:

    KV_RT_CONFIGS  comma-separated round-trip configs (default rt_v2_n64_g32_b3_l2)
    KV_VECTORS     random vectors per set (default 300)
    KV_SEED        seed (default 1)

The full regression is ``python -m verif.sim`` (rt_* rows in its table).
"""

from __future__ import annotations

import os

import pytest

from verif.build import prepare
from verif.job import Job
from verif.run import run

CONFIGS = [c for c in os.environ.get("KV_RT_CONFIGS", "rt_v2_n64_g32_b3_l2").split(",") if c]
N_RANDOM = int(os.environ.get("KV_VECTORS", "300"))
SEED = int(os.environ.get("KV_SEED", "1"))


@pytest.fixture(scope="module", params=CONFIGS)
def rt_build(request):
    cfg, files, bdir, man = prepare(request.param)
    assert cfg.roundtrip, f"{request.param}: round-trip configs start with rt_"
    return cfg, files, bdir, man


def _job(sets, **kw) -> Job:
    return Job(**{"seed": SEED, "sets": sets, "reset_vectors": 300, "throughput_vectors": 300,
                  **kw})


def test_roundtrip_all_phases(rt_build):
    """Latency (round trip = sum of both manifests), full rate, round-trip and direct
    sets under stalls, mid-stream resets: every decoded word bit-exact."""
    cfg, files, bdir, man = rt_build
    sets = [{"name": "random", "mode": "rt", "count": N_RANDOM, "seed": SEED},
            {"name": "adversarial", "mode": "direct", "count": None, "seed": SEED},
            {"name": "random", "mode": "direct", "count": N_RANDOM, "seed": SEED}]
    res = run(cfg, files, bdir, man, _job(sets), tag="pytest_rt")
    bad = [ph for ph in res["phases"] if not ph["ok"]]
    assert res["tests"]["failed"] == 0 and not bad, \
        [ph["errors"][:3] for ph in bad] or res["log"]
    by = {ph["set"]: ph for ph in res["phases"]}
    assert by["latency_rt"]["latency_min"] == man["latency_rt"] == (
        man["latency_breakdown"]["encoder"] + man["latency_breakdown"]["decoder"])
    assert by["latency_direct"]["latency_min"] == man["latency_dec"]
    assert by["throughput"]["span_cycles_per_vector"] == 1.0
    assert by["rt:reset_midstream"]["resets"] > 0


def test_scoreboard_catches_faults(rt_build):
    """Corrupted expected words must be reported as exactly those mismatches."""
    cfg, files, bdir, man = rt_build
    sets = [{"name": "random", "mode": "direct", "count": 200, "seed": SEED}]
    res = run(cfg, files, bdir, man, _job(sets, fault_every=37), tag="pytest_fault",
              testcase="test_stream", waves=False)
    ph = res["phases"][0]
    assert not ph["ok"] and res["tests"]["failed"] == 1
    assert ph["mismatches"] == ph["injected_faults"] == len(range(3, 200, 37))
    assert ph["outputs"] == ph["vectors"] and ph["lost"] == 0
