"""pytest entry points: the kv_epilogue RTL in Verilator + cocotb vs the golden model.

Each configuration is generated with ``rtl_gen.generate`` into build/rtl/<config>/
and built once (cached in build/sim/<config>/); the cocotb testbench
verif/tb_epilogue.py then runs on it. Settings come from environment variables:

    KV_CONFIGS   comma-separated configs (default n128_g64_b3_l2,n64_g64_b3_l2)
    KV_VECTORS   random vectors per config (default 1000)
    KV_REAL      real-fixture vectors per config (default 1000, 0 = skip, all = whole set)
    KV_STALL_P   P(o__ready low) per cycle (default 0.3)
    KV_GAP_P     P(i__valid gap) per cycle (default 0.2)
    KV_SEED      seed (default 1)

The full regression with summary table is ``python -m verif.sim``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from sim_models import FormatParams
from verif.dut import SimConfig, build, generate, run
from verif.vectors import FIXTURE, expected_golden, input_words, real_vectors

CONFIGS = [c for c in os.environ.get("KV_CONFIGS", "n128_g64_b3_l2,n64_g64_b3_l2").split(",") if c]
N_RANDOM = int(os.environ.get("KV_VECTORS", "1000"))
_real = os.environ.get("KV_REAL", "1000")
N_REAL = None if _real == "all" else int(_real)
STALL_P = float(os.environ.get("KV_STALL_P", "0.3"))
GAP_P = float(os.environ.get("KV_GAP_P", "0.2"))
SEED = int(os.environ.get("KV_SEED", "1"))

def _job(sets, **kw) -> dict:
    job = {"seed": SEED, "sets": sets, "gap_p": GAP_P, "stall_p": STALL_P,
           "reset_vectors": 1000}
    job.update(kw)
    return job


def _failures(res: dict) -> str:
    bad = [ph for ph in res["phases"] if not ph["ok"]]
    msg = [f"{ph['set']}: {ph['mismatches']} mismatches; " + " | ".join(ph["errors"][:5])
           for ph in bad]
    if res["tests"]["failed"] and not bad:
        msg.append(f"{res['tests']['failed']} cocotb test(s) failed, see {res['log']}")
    return "\n".join(msg)


@pytest.fixture(scope="module", params=CONFIGS)
def dut_build(request):
    """(config, build dir, manifest) of one configuration, built once per session."""
    cfg = SimConfig.parse(request.param)
    v, man = generate(cfg)
    bdir, _ = build(cfg, v)
    return cfg, bdir, man


# --- testbench helpers without a simulator -------------------------------------

def test_input_word_layout():
    bits = np.arange(2 * 8, dtype=np.uint16).reshape(2, 8) * 0x1111
    w = input_words(bits)
    for v in range(2):
        for k in range(8):
            assert (w[v] >> (16 * k)) & 0xFFFF == bits[v, k]


def test_expected_word_layout():
    p = FormatParams(n=64, block=32, bits=3)
    bits = np.zeros((1, 64), dtype=np.uint16)
    bits[0, 5] = 0x7E00            # NaN -> flag bit 0
    bits[0, 9] = 0x3C00            # 1.0
    words, flags = expected_golden(bits, p)
    from sim_models import encode
    e = encode(bits, p)
    w = words[0]
    assert w & ((1 << 192) - 1) == int.from_bytes(e.codes[0].tobytes(), "little")
    assert (w >> 192) & 0xFFFF == int.from_bytes(e.scales[0].tobytes(), "little")
    assert w >> 208 == int(e.flags[0]) == 1 == flags[0]


def test_real_vectors_layout(tmp_path):
    rng = np.random.default_rng(0)
    k = rng.integers(0, 1 << 16, size=(2, 3, 3, 64), dtype=np.uint16)
    v = rng.integers(0, 1 << 16, size=(2, 3, 3, 64), dtype=np.uint16)
    path = tmp_path / "kv.npz"
    np.savez(path, k=k, v=v)
    r64 = real_vectors(64, path)
    assert r64.shape == (2 * 2 * 3 * 3, 64)
    assert (r64[0] == k[0, 0, 0]).all() and (r64[18] == v[0, 0, 0]).all()
    r128 = real_vectors(128, path)
    assert r128.shape == (2 * 2 * 2 * 3, 128)
    assert (r128[0] == np.concatenate([k[0, 0, 0], k[0, 0, 1]])).all()
    assert (r128[6] == np.concatenate([k[0, 0, 1], k[0, 0, 2]])).all()
    assert (r128[12] == np.concatenate([v[0, 0, 0], v[0, 0, 1]])).all()
    assert real_vectors(128, path, limit=5).shape == (5, 128)
    with pytest.raises(ValueError):
        real_vectors(256, path)


# --- RTL ------------------------------------------------------------------------

def test_latency_throughput(dut_build):
    """Measured latency == manifest latency_cycles; 1 vector/cycle at full load."""
    cfg, bdir, man = dut_build
    res = run(cfg, bdir, man, _job([]), tag="pytest_lat",
              testcase=["test_latency", "test_throughput"])
    assert res["tests"]["failed"] == 0 and len(res["phases"]) == 2, _failures(res)
    lat = {ph["set"]: ph for ph in res["phases"]}
    assert lat["latency"]["latency_min"] == man["latency_cycles"]
    assert lat["throughput"]["span_cycles_per_vector"] == 1.0


def test_vectors_with_stalls(dut_build):
    """Random + adversarial (+ real) vectors, random stalls: every word bit-exact, in order."""
    cfg, bdir, man = dut_build
    sets = [{"name": "random", "count": N_RANDOM, "seed": SEED},
            {"name": "adversarial", "count": None, "seed": SEED}]
    fixture = None
    if N_REAL != 0 and cfg.n in (64, 128) and cfg.dtype == "fp16":
        if not FIXTURE.exists():
            pytest.fail(f"real fixture {FIXTURE} missing")
        sets.append({"name": "real", "count": N_REAL})
        fixture = str(FIXTURE)
    res = run(cfg, bdir, man, _job(sets, fixture=fixture), tag="pytest_stream",
              testcase="test_stream")
    assert res["tests"]["failed"] == 0 and len(res["phases"]) == len(sets), _failures(res)
    assert sum(ph["mismatches"] for ph in res["phases"]) == 0


def test_reset_and_status(dut_build):
    """Mid-stream resets; sticky status and status_clear."""
    cfg, bdir, man = dut_build
    res = run(cfg, bdir, man, _job([]), tag="pytest_reset",
              testcase=["test_reset_midstream", "test_status_clear"])
    assert res["tests"]["failed"] == 0 and len(res["phases"]) == 2, _failures(res)


def test_scoreboard_catches_faults(dut_build):
    """Self-check of the testbench: expected words with injected bit flips must be
    reported as exactly those mismatches (and nothing else)."""
    cfg, bdir, man = dut_build
    res = run(cfg, bdir, man, _job([{"name": "random", "count": 300, "seed": SEED}]),
              tag="pytest_fault", testcase="test_stream", model="golden_faulty")
    ph = res["phases"][0]
    assert not ph["ok"] and res["tests"]["failed"] == 1
    assert ph["mismatches"] == ph["injected_faults"] > 0, ph["errors"][:3]
    assert ph["outputs"] == ph["vectors"] and ph["lost"] == 0


def test_sim_cli_rejects_bad_config(capsys):
    from verif.sim import main
    assert main(["--configs", "n100_g64_b3_l2"]) == 2
    assert "n (N) must be a power of two" in capsys.readouterr().err


def test_config_names():
    c = SimConfig.parse("n64_g32_b4_l0_bf16")
    assert (c.n, c.block, c.bits, c.latency, c.dtype) == (64, 32, 4, 0, "bf16")
    assert c.name == "n64_g32_b4_l0_bf16" and SimConfig.parse("n128").name == "n128_g64_b3_l2"
