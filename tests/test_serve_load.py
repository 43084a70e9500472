"""bench.gpu.serve_load: the serving load test's CPU smoke (``python -m bench.gpu --routine serve --cpu``).

The OpenAI server in-process on an ephemeral port, concurrent streaming clients over stdlib http.client,
tiny random Llama, golden backend, a 16-bit pool and a packed pool of the same bytes: the report's counts
add up, every request finished with the tokens it asked for, percentiles are ordered, both pools are whole
again, and the packed pool holds more concurrent sequences than the 16-bit one, by construction and as
observed. The numbers are no performance claim.
"""

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from bench.gpu import serve_load  # noqa: E402


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    from bench.gpu.__main__ import main
    out = tmp_path_factory.mktemp("serve_load")
    assert main(["--routine", "serve", "--out", str(out), "--cpu"]) == 0
    first = json.loads((out / serve_load.FNAME).read_text())
    # a second command adds a cache to the same card's entry (same workload and pool)
    assert serve_load.main(["--out", str(out), "--cpu", "--caches", "K3V3", "--no-plot"]) == 0
    return out, first, json.loads((out / serve_load.FNAME).read_text())


def test_smoke_report_invariants(smoke):
    out, first, doc = smoke
    assert (out / "gpu_serve_load.png").stat().st_size > 10000
    assert doc["benchmark"] == "serve_load"
    entry = doc["cards"]["CPU (golden backend, smoke)"]
    assert list(first["cards"]["CPU (golden backend, smoke)"]["caches"]) == ["bf16", "v4"]
    assert set(entry["caches"]) == {"bf16", "v4", "K3V3"}
    assert entry["invariants_violated"] == [] and serve_load.check(entry) == []
    w = entry["workload"]
    rng = np.random.default_rng(w["seed"])
    sizes = rng.integers(w["context_min"], w["context_max"] + 1, w["requests"])
    outs = rng.integers(w["output_min"], w["output_max"] + 1, w["requests"])
    for name, c in entry["caches"].items():
        assert c["requests_sent"] == c["requests_completed"] == w["requests"], name
        assert c["requests_incomplete"] == c["requests_not_sent"] == 0
        assert [r["i"] for r in c["requests"]] == list(range(w["requests"]))
        for r, n, o in zip(c["requests"], sizes, outs):
            assert r["complete"] and r["finish_reason"] == "length"
            assert r["tokens"] == r["chunks"] == r["max_tokens"] == o and r["prompt_tokens"] == n - o
            assert 0 < r["ttft_s"] <= r["e2e_s"]
        assert c["output_tokens"] == outs.sum()
        assert c["output_tokens_per_s"] == pytest.approx(outs.sum() / c["wall_s"])
        assert c["requests_per_s"] == pytest.approx(w["requests"] / c["wall_s"])
        for k in ("ttft_s", "tpot_ms", "e2e_s"):
            assert 0 < c[f"{k}_p50"] <= c[f"{k}_p99"], (name, k)
        held = c["concurrency_by_construction"]
        assert 1 <= held["at_longest"] <= held["at_mean"] <= held["at_shortest"]
        assert held["at_longest"] == c["num_blocks"] // c["blocks_per_request"]["longest"]
        assert 1 <= c["concurrency_observed"] <= min(held["at_shortest"], w["clients"])
        assert max(x[1] for x in c["timeline"]) <= c["concurrency_observed"]
        assert c["free_blocks_after"] == c["num_blocks"]
    bf16 = entry["caches"]["bf16"]
    for name in ("v4", "K3V3"):
        c = entry["caches"][name]
        assert abs(c["pool_bytes"] - bf16["pool_bytes"]) <= bf16["block_bytes"]          # the same memory
        assert c["block_bytes"] * 4 < bf16["block_bytes"]
        for k, v in c["concurrency_by_construction"].items():
            assert v > bf16["concurrency_by_construction"][k], (name, k)
        assert c["concurrency_observed"] > bf16["concurrency_observed"]
        assert entry["vs_bf16"][name]["compared_requests"] == w["requests"]


def test_check_flags_broken_reports(smoke):
    _, _, doc = smoke
    entry = json.loads(json.dumps(doc["cards"]["CPU (golden backend, smoke)"]))
    entry["caches"]["v4"]["requests"][3]["tokens"] -= 1
    entry["caches"]["v4"]["ttft_s_p99"] = entry["caches"]["v4"]["ttft_s_p50"] / 2
    entry["caches"]["K3V3"]["concurrency_observed"] = entry["caches"]["bf16"]["concurrency_observed"]
    entry["caches"]["bf16"]["free_blocks_after"] -= 1
    bad = serve_load.check(entry)
    assert any("v4: request 3 finished" in b for b in bad)
    assert any("v4: ttft_s" in b for b in bad)
    assert any("K3V3: observed" in b for b in bad)
    assert any("bf16: 1 blocks still held" in b for b in bad)
    assert len(bad) == 4


@pytest.mark.parametrize("argv,word", [
    (["--cpu", "--quick"], "choose one"),
    (["--cpu", "--caches", "bf16,K5"], "--caches"),
    (["--cpu", "--context-min", "10", "--output-max", "16"], "--context-min"),
    (["--cpu", "--requests", "0"], "--requests"),
    (["--cpu", "--tables", "t.npz"], "--tables"),
    (["--cpu", "--pool-gib", "-1"], "--pool-gib"),
])
def test_bad_options_name_the_option(argv, word, capsys):
    with pytest.raises(SystemExit) as stop:
        serve_load.parse(argv)
    assert stop.value.code == 2 and word in capsys.readouterr().err


def test_one_process_per_cache_shares_the_pool(tmp_path):
    """The GPU's several-caches path (one child process per cache, the first sizing the pool): run here on
    the CPU smoke, the children merge into one entry with equal pool bytes and a clean check."""
    argv = ["--out", str(tmp_path), "--cpu", "--no-plot", "--caches", "bf16,v3"]
    a = serve_load.parse(argv)
    assert serve_load._one_process_per_cache(a, argv) == 0
    entry = json.loads((tmp_path / serve_load.FNAME).read_text())["cards"]["CPU (golden backend, smoke)"]
    assert list(entry["caches"]) == ["bf16", "v3"]
    assert entry["caches"]["bf16"]["pool_bytes"] >= entry["caches"]["v3"]["pool_bytes"] > 0
    assert entry["invariants_violated"] == []


def test_routine_exits_nonzero_when_the_load_test_fails(tmp_path, monkeypatch):
    """`python -m bench.gpu --routine serve` returns 1 when the load test reports a failure or a violated
    invariant (serve_load.main != 0), not 0 with a message."""
    from bench.gpu.__main__ import main
    monkeypatch.setattr(serve_load, "main", lambda argv: 1)
    assert main(["--routine", "serve", "--out", str(tmp_path), "--cpu", "--no-plot"]) == 1


def test_real_model_runs_have_their_own_entry(smoke):
    """A real model's run is kept beside the random model's on the same card (``CARD: MODEL_ID``), and the
    docs name the greedy-text agreement only where texts were kept (a real model)."""
    import argparse

    from bench import docs
    from sim_models.models import ModelSource
    card = "CPU (golden backend, smoke)"
    rnd = argparse.Namespace(cpu=True, model=None)
    real = argparse.Namespace(cpu=True, model="some.gguf", src=ModelSource("m-1", None, "a file"))
    assert serve_load._entry_key(rnd) == card
    assert serve_load._entry_key(real) == f"{card}: m-1"
    _, _, doc = smoke
    entry = doc["cards"][card]
    assert "greedy text" not in docs.serve_load_block({"cards": {card: entry}}, "")
    pairs = {"requests_per_s_vs_bf16": 1.5, "concurrency_by_construction_vs_bf16": 5.0,
             "greedy_identical_fraction": 0.75, "greedy_common_prefix_fraction": 0.9, "compared_requests": 4}
    text = docs.serve_load_block({"cards": {f"{card}: m-1": dict(entry, vs_bf16={"v4": pairs})}}, "")
    assert "greedy text identical to bf16's in 3 of 4 requests (common prefix 90 % of the text)" in text
