"""cocotb tests of the round trip ``kv_epilogue -> kv_decompressor`` (``kv_roundtrip``).

DUT (Verilog wrapper written by verif/dut.py around the two generated modules,
inside the bench harness): clk, rst (synchronous, active high), sel (held per phase),

* sel = 0, round trip: i__valid / i__ready / i__payload[16N] (fp16/bf16 lanes)
  -> kv_epilogue -> kv_decompressor;
* sel = 1, direct: d__valid / d__ready / d__payload (any code and scale
  planes, including what the encoder never writes) -> kv_decompressor;

o__valid / o__ready / o__payload[16N]: the decompressor's output, lane k at
bits [16k, 16k+16).

Every output word is compared bit-exact, in order, with the golden read path:
``sim_models.decode(sim_models.encode(x))`` for the round trip and
``sim_models.decode(codes, scales)`` for the direct planes. Driver, monitor and
scoreboard: verif/stream.py and kvtest.streamcheck (the same per-cycle loop as
the epilogue bench).
"""

from __future__ import annotations

import time

import numpy as np

import cocotb

from kvtest.inputs import get_set
from kvtest.planes import adversarial_planes, decoder_rows, encoded_planes, random_planes
from kvtest.streamcheck import full_rate_record_errors
from sim_models import wire
from verif.stream import assert_ok, bench, inject_faults, stall_kw


def words_for(b, mode: str, name: str, count, seed: int):
    """(input strings, expected output strings, prep seconds) of one set."""
    p = b.p
    t0 = time.perf_counter()
    if mode == "rt":
        bits = get_set(name, p.n, count, seed, b.job.get("fixture"), p.dtype)
        win = wire.rows_to_binstr(wire.lane_rows(bits), wire.lanes(p).width)
        exp = decoder_rows(*encoded_planes(bits, p), p)
    else:
        if name == "random":
            planes = random_planes(p, 1000 if count is None else count, seed)
        elif name == "adversarial":
            planes = adversarial_planes(p, seed)
            if count is not None:
                planes = tuple(x[:count] for x in planes)
        else:
            raise ValueError(f"unknown direct set {name!r} (random, adversarial)")
        win = wire.rows_to_binstr(wire.decoder_input_rows(p, *planes), b.widths["d__payload"])
        exp = decoder_rows(*planes[:2], p, *planes[2:])
    exp = wire.rows_to_binstr(exp, b.out_width)
    return win, exp, time.perf_counter() - t0


def describe(n: int):
    def f(got: str, exp: str) -> str:
        g, e = wire.int_to_lanes(int(got, 2), n), wire.int_to_lanes(int(exp, 2), n)
        lanes = np.flatnonzero(g != e)
        return f"{lanes.size} lanes differ (first: " + ", ".join(
            f"lane {int(k)} got {int(g[k]):#06x} exp {int(e[k]):#06x}" for k in lanes[:6]) + ")"
    return f


async def run_set(b, mode: str, name: str, count, seed: int, label: str, **kw) -> dict:
    win, exp, prep = words_for(b, mode, name, count, seed)
    k = int(b.job.get("fault_every") or 0)
    n_faults = 0
    if k:
        exp, n_faults = inject_faults(exp, k, 16 * b.p.n)
    rec = await b.stream(win, exp, label, port="d" if mode == "direct" else "i",
                         fixed=b.bit("sel") if mode == "direct" else 0,
                         describe=describe(b.p.n), prep_s=prep, **kw)
    rec["mode"] = mode
    if k:
        rec["injected_faults"] = n_faults
    return rec


@cocotb.test()
async def test_latency(dut):
    """Isolated vectors: round trip latency == epilogue + decompressor latency_cycles;
    direct latency == decompressor latency_cycles."""
    b = await bench(dut, "test_latency")
    recs = []
    for mode, want in (("rt", b.job["latency"]), ("direct", b.job["latency_dec"])):
        rec = await run_set(b, mode, "random", b.job["latency_vectors"], b.seed + 101,
                            f"latency_{mode}", isolate=True)
        errs = [] if rec["latency_min"] == rec["latency_max"] == want else [
            f"latency {rec['latency_min']}..{rec['latency_max']}, expected {want}"]
        recs.append(b.finish(rec, errs))
    assert_ok(recs)


@cocotb.test()
async def test_throughput(dut):
    """Valid and ready always high: one vector per cycle through both modules."""
    b = await bench(dut, "test_throughput")
    rec = await run_set(b, "rt", "random", b.job["throughput_vectors"], b.seed + 202, "throughput")
    assert_ok([b.finish(rec, full_rate_record_errors(rec, b.latency))])


@cocotb.test()
async def test_stream(dut):
    """Every configured set (round trip and direct) with random gaps, stalls, bursts."""
    b = await bench(dut, "test_stream")
    recs = []
    for s in b.job["sets"]:
        kw = stall_kw(b.job)
        kw.update(s.get("stalls") or {})
        rec = await run_set(b, s["mode"], s["name"], s.get("count"), s.get("seed", b.seed),
                            f"{s['mode']}:{s.get('label', s['name'])}", **kw)
        recs.append(b.finish(rec))
    assert_ok(recs)


@cocotb.test()
async def test_reset_midstream(dut):
    """Resets with words in flight in both modules: afterwards exactly the words sent
    after the reset come out, bit-exact."""
    b = await bench(dut, "test_reset_midstream")
    rec = await run_set(b, "rt", "random", b.job["reset_vectors"], b.seed + 303,
                        "rt:reset_midstream", resets=b.job["resets"], **stall_kw(b.job))
    errs = [] if rec["resets"] else ["no reset happened with words in flight"]
    assert_ok([b.finish(rec, errs)])
