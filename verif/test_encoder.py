"""pytest entry points: kv_encoder in Verilator + cocotb vs the golden model, and the
testbench's own parts (harness, config names, status checker, faults).

Each configuration is generated and built once (cached in build/sim/<config>/,
verif/build.py); the cocotb testbench verif/tb_encoder.py runs on it. Settings
come from environment variables:

    KV_CONFIGS   comma-separated configs (default enc_v2_n128_g64_b3_l2,enc_v2_n64_g64_b3_l2)
    KV_VECTORS   random vectors per config (default 1000)
    KV_REAL      real-fixture vectors per config (default 1000, 0 = skip, all = whole set)
    KV_STALL_P   P(o__ready low) per cycle (default 0.3)
    KV_GAP_P     P(i__valid gap) per cycle (default 0.2)
    KV_SEED      seed (default 1)
    KV_WAVES     0: no FST rerun of failing tests

The full regression with summary table is ``python -m verif.sim``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from sim_models import FormatParams
from kvtest.inputs import FIXTURE, real_vectors
from kvtest.streamcheck import StatusChecker
from rtl_gen.config import RTLConfig
from verif.build import BUILD, PUBLIC_ALL, prepare, runner, sim_config, tool_env
from verif.harness import harness_layout, harness_verilog, module_ports, public_vlt
from verif.job import Job
from verif.run import run
from verif.stream import inject_faults

CONFIGS = [c for c in os.environ.get("KV_CONFIGS", "enc_v2_n128_g64_b3_l2,enc_v2_n64_g64_b3_l2").split(",") if c]
N_RANDOM = int(os.environ.get("KV_VECTORS", "1000"))
_real = os.environ.get("KV_REAL", "1000")
N_REAL = None if _real == "all" else int(_real)
STALL_P = float(os.environ.get("KV_STALL_P", "0.3"))
GAP_P = float(os.environ.get("KV_GAP_P", "0.2"))
SEED = int(os.environ.get("KV_SEED", "1"))
#: The smallest configuration: the deliberate-failure / waveform test.
TINY = "enc_v2_n8_g8_b2_l1"


def _job(sets, **kw) -> Job:
    return Job(**{"seed": SEED, "sets": sets, "gap_p": GAP_P, "stall_p": STALL_P,
                  "reset_vectors": 1000, **kw})


def _failures(res: dict) -> str:
    bad = [ph for ph in res["phases"] if not ph["ok"]]
    msg = [f"{ph['set']}: {ph['mismatches']} mismatches; " + " | ".join(ph["errors"][:5])
           for ph in bad]
    if res["tests"]["failed"] and not bad:
        msg.append(f"{res['tests']['failed']} cocotb test(s) failed, see {res['log']}")
    return "\n".join(msg + [f"waveform: {w}" for w in res.get("waves", [])])


@pytest.fixture(scope="module", params=CONFIGS)
def dut_build(request):
    """(config, files, build dir, manifest) of one configuration, built once."""
    return prepare(request.param)


# --- testbench parts without a simulator ----------------------------------------

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


def test_config_names():
    """One grammar for sim and synth: kind, preset and every changed field are in the name."""
    c = RTLConfig.parse("enc_v2_n64_g32_b4_l0_bf16")
    assert (c.kind, c.params.n, c.params.block, c.params.bits, c.fwht_regs, c.params.dtype) == \
        ("encoder", 64, 32, 4, 0, "bf16")
    assert c.name == "enc_v2_n64_g32_b4_l0_bf16" and c.params.mode == "midrise"
    v1 = RTLConfig.parse("rt_v1_n64_g64_b3_l2")
    assert v1.roundtrip and (v1.params.mode, v1.params.scale_round) == ("midtread", "up")
    m = RTLConfig.parse("rt_v2_n128_g64_b3_l2_lloydmax_e5m2")
    assert (m.params.mode, m.params.scale) == ("lloydmax", "e5m2")
    # the name picks the nearest preset: v1 fields plus one change is not "v2 + 3 changes"
    p = FormatParams(n=64, block=64, mode="midtread", scale_round="up", scale="e4m3fn")
    assert RTLConfig.of("encoder", p, 2).name == "enc_v1_n64_g64_b3_l2_e4m3fn"
    for name in ("enc_v2_n128_g64_b3_l2_scalemult-300", "enc_v2_n8_g8_b2_l0_signseed-none",
                 "enc_v2_n128_g64_b3_l2_e4m3fn_rms", "dec_v2_n16_g8_b3_l1_m10", m.name):
        assert RTLConfig.parse(name).name == name
    p = FormatParams(n=64, block=32, mode="lloydmax", scale="e5m2", scale_rule="absmean")
    assert RTLConfig.parse(RTLConfig.of("roundtrip", p, 3).name) == RTLConfig.of("roundtrip", p, 3)
    with pytest.raises(ValueError, match="fwht_regs"):
        RTLConfig.parse("enc_v2_n64_g64_b3_l7")
    with pytest.raises(ValueError, match="mode"):
        RTLConfig.parse("enc_v2_n64_g64_b3_l2_mode-sideways")
    with pytest.raises(ValueError, match="bad part"):
        RTLConfig.parse("enc_v2_n64_g64_b3_l2_x3")
    with pytest.raises(ValueError, match="must state"):
        RTLConfig.parse("enc_v2_n64")
    with pytest.raises(ValueError, match="preset"):
        RTLConfig.parse("n128_g64_b3_l2")          # the old, default-relative names
    with pytest.raises(ValueError, match="simulates"):
        sim_config("dec_v2_n64_g64_b3_l2")


def test_sim_config_lists():
    from verif import sim
    names = sim.config_names(None, "all")
    for name in names + sim.config_names(None, "quick") + sim.config_names(None, "default"):
        sim_config(name)
    lat = {(c.params.n, c.fwht_regs) for c in map(sim_config, sim.config_names(None, "full"))
           if not c.roundtrip}
    assert {n for n, _ in lat} == {64, 128, 256}
    assert {1, 2} <= {l for _, l in lat} and any(l == int(np.log2(n)) for n, l in lat)
    from hw.encoder import ENCODER_SUPPORT
    for f in sim.MODE_FIELDS:       # every value the RTL implements has a config
        for v in ENCODER_SUPPORT.get(f, ()):
            assert any(getattr(sim_config(n).params, f) == v for n in names), (f, v)


def test_harness_verilog():
    ports = {"clk": ("input", 1), "rst": ("input", 1), "i__valid": ("input", 1),
             "i__ready": ("output", 1), "i__payload": ("input", 32), "o__valid": ("output", 1),
             "o__ready": ("input", 1), "o__payload": ("output", 11), "status": ("output", 3),
             "status_clear": ("input", 1)}
    watch = {"status": ("status", 3), "o_flags": ("o__payload[10:8]", 3)}
    v = harness_verilog("dut_top", ports, watch)
    lay = harness_layout(ports, watch)
    assert lay["t_ctl"] == {"rst": 0, "i__valid": 1, "o__ready": 2, "status_clear": 3}
    assert lay["m_ctl"] == {"o_fire": (0, 1), "o_valid": (1, 1), "i_fire": (2, 1),
                            "status": (3, 3), "o_flags": (6, 3)}
    assert "m_ctl <= {o__payload[10:8], status, r_i__valid & i__ready, o__valid, " \
           "o__valid & r_o__ready};" in v
    assert "always @(negedge clk)" in v and ".i__payload(r_i__payload)" in v
    hp = module_ports(v, "kvtb")
    assert hp["t_i__payload"] == ("input", 32) and hp["m_o__payload"] == ("output", 11)
    vlt = public_vlt(v)
    assert 'public_flat_rw -module "kvtb" -var "t_ctl"' in vlt
    assert 'public_flat_rd -module "kvtb" -var "m_ctl"' in vlt and '"*"' not in vlt


def test_status_checker_replay():
    """A flag that shows up in status two cycles late is a violation; one cycle is allowed."""
    bits = {"status_pos": 3, "flags_pos": 6, "out_valid": 2, "out_fire": 1, "rst": 1 << 32,
            "clear": 1 << (32 + 3)}

    def hist(delay):
        h = []
        for c in range(12):
            m = 0
            if c == 3:
                m |= 1 | 2 | (4 << 6)          # transfer of a word with flag 4
            if c >= 4 + delay:
                m |= 4 << 3                    # status shows flag 4
            h.append(m)
        return h
    for delay, bad in ((0, 0), (1, 0), (2, 1)):
        errs = []
        st = StatusChecker(errs)
        st.replay(hist(delay), -1, **bits)
        assert (st.violations > 0) == bool(bad), (delay, errs)
    errs = []
    st = StatusChecker(errs)
    h = hist(0)
    h[8] |= 1 << (32 + 3)                      # clear at cycle 8, status stays: violation
    st.replay(h, -1, **bits)
    assert st.violations and "status 100" in errs[0]


def test_inject_faults():
    exp = ["0000", "1111", "0101", "0011", "1100", "1010", "0110"]
    out, n = inject_faults(exp, 2, 4)
    assert n == 2 and [i for i in range(7) if out[i] != exp[i]] == [3, 5]
    assert sum(a != b for a, b in zip(out[3], exp[3])) == 1


def test_runner_canary(tmp_path):
    """The cocotb runner API verif/build.py overrides (the private
    ``Verilator._build_command``): its first command still carries --public-flat-rw
    and --vpi, and runner() drops exactly that option. Fails when cocotb changes it."""
    import cocotb_tools.runner as cr
    assert hasattr(cr.Verilator, "_build_command"), "cocotb removed Verilator._build_command"
    tool_env()
    cmds = []
    r = runner()
    r._execute = lambda c, cwd=None: cmds.extend(c)      # record instead of running
    (tmp_path / "t.v").write_text("module t(input wire clk); endmodule\n")
    try:
        r.build(sources=[tmp_path / "t.v"], hdl_toplevel="t", build_dir=tmp_path / "b",
                always=True)
    except RuntimeError as err:                             # the override's own check
        pytest.fail(str(err))
    base = cr.Verilator._build_command(r)
    assert PUBLIC_ALL in base[0] and "--vpi" in base[0]
    assert cmds and cmds[0] == [a for a in base[0] if a != PUBLIC_ALL]


def test_job_json_round_trip():
    job = Job(params=FormatParams(n=64, block=32, mode="asym"), seed=7,
              sets=[{"name": "random", "count": 5}], fault_every=3)
    assert Job.from_json(job.to_json()) == job
    assert job.stalls() == {"gap_p": 0.2, "stall_p": 0.3, "burst_p": 0.002, "burst_max": 200,
                            "clear_p": 0.002}
    with pytest.raises(ValueError, match="lattency"):
        Job.from_json('{"lattency": 3}')


def test_sim_cli_rejects_bad_config(capsys):
    from verif.sim import main
    assert main(["--configs", "enc_v2_n100_g64_b3_l2"]) == 2
    assert "n (N) must be a power of two" in capsys.readouterr().err
    assert main(["--configs", ","]) == 2


# --- RTL ------------------------------------------------------------------------

def _passing(dut_build, tag: str, tests: list[str]) -> dict:
    """Run cocotb ``tests`` (one phase each); all must pass. Returns {set: phase}."""
    cfg, files, bdir, man = dut_build
    res = run(cfg, files, bdir, man, _job([]), tag=tag, testcase=tests)
    assert res["tests"]["failed"] == 0 and len(res["phases"]) == len(tests), _failures(res)
    return {ph["set"]: ph for ph in res["phases"]}


def test_latency_throughput(dut_build):
    """Measured latency == manifest latency_cycles; 1 vector/cycle at full load."""
    lat = _passing(dut_build, "pytest_lat", ["test_latency", "test_throughput"])
    man = dut_build[3]
    assert lat["latency"]["latency_min"] == man["latency_cycles"] == lat["latency"]["latency_max"]
    assert lat["throughput"]["span_cycles_per_vector"] == 1.0


def test_vectors_with_stalls(dut_build):
    """Random + adversarial (+ real) vectors, random stalls: every word bit-exact, in order."""
    cfg, files, bdir, man = dut_build
    sets = [{"name": "random", "count": N_RANDOM, "seed": SEED},
            {"name": "adversarial", "count": None, "seed": SEED}]
    fixture = None
    if N_REAL != 0 and cfg.params.n in (64, 128) and cfg.params.dtype == "fp16":
        if not FIXTURE.exists():
            pytest.fail(f"real fixture {FIXTURE} missing")
        sets.append({"name": "real", "count": N_REAL})
        fixture = str(FIXTURE)
    res = run(cfg, files, bdir, man, _job(sets, fixture=fixture), tag="pytest_stream",
              testcase="test_stream")
    assert res["tests"]["failed"] == 0 and len(res["phases"]) == len(sets), _failures(res)
    assert sum(ph["mismatches"] for ph in res["phases"]) == 0
    assert sum(ph["outputs"] for ph in res["phases"]) == sum(ph["vectors"] for ph in res["phases"])


def test_reset_and_status(dut_build):
    """Mid-stream resets; sticky status and status_clear."""
    by = _passing(dut_build, "pytest_reset", ["test_reset_midstream", "test_status_clear"])
    assert by["reset_midstream"]["resets"] > 0 and by["status_clear"]["status_violations"] == 0


def test_scoreboard_catches_faults(dut_build):
    """Self-check of the testbench: expected words with injected bit flips must be
    reported as exactly those mismatches (and nothing else)."""
    cfg, files, bdir, man = dut_build
    res = run(cfg, files, bdir, man,
              _job([{"name": "random", "count": 300, "seed": SEED}], fault_every=37),
              tag="pytest_fault", testcase="test_stream", waves=False)
    ph = res["phases"][0]
    assert not ph["ok"] and res["tests"]["failed"] == 1
    assert ph["mismatches"] == ph["injected_faults"] == len(range(3, 300, 37))
    assert ph["outputs"] == ph["vectors"] and ph["lost"] == 0


def test_failure_keeps_waveform():
    """A deliberately failing run (one expected word corrupted) is reported as that one
    mismatch AND leaves an FST of the rerun under build/waves/ (the test itself passes)."""
    cfg, files, bdir, man = prepare(TINY)
    res = run(cfg, files, bdir, man,
              _job([{"name": "random", "count": 40, "seed": SEED}], fault_every=1000),
              tag="pytest_waves", testcase="test_stream", waves=True)
    ph = res["phases"][0]
    assert res["tests"]["failed"] == 1 and ph["mismatches"] == ph["injected_faults"] == 1
    assert "vector 3:" in ph["errors"][0], ph["errors"]
    fst = (BUILD / "waves" / cfg.name / "pytest_waves" / "test_stream.fst").resolve()
    assert res["waves"] == [str(fst)], res["waves"]
    data = fst.read_bytes()
    assert len(data) > 1000 and data[0] == 0   # FST: starts with a header block (type 0)
