"""cocotb testbench of the round trip ``kv_epilogue -> kv_decompressor`` (``kv_roundtrip``).

DUT (Verilog wrapper written by verif/roundtrip.py around the two generated
modules): clk, rst (synchronous, active high), sel (held per phase),

* sel = 0, round trip: i__valid / i__ready / i__payload[16N] (fp16/bf16 lanes)
  -> kv_epilogue -> its codes | scales (flags dropped) -> kv_decompressor;
* sel = 1, direct: d__valid / d__ready / d__payload[N*b + 8N/G] (any code and
  scale planes, including what the encoder never writes) -> kv_decompressor;

o__valid / o__ready / o__payload[16N]: the decompressor's output, lane k at
bits [16k, 16k+16).

Every output word is compared bit-exact, in order, with the golden read path:
``sim_models.decode(sim_models.encode(x))`` for the round trip and
``sim_models.decode(codes, scales)`` for the direct planes. Phases: latency
(isolated vectors: round trip == both manifests' latency_cycles added), full
rate (1 vector / cycle), the streamed sets with random i/d__valid gaps,
o__ready stalls and long bursts, and mid-stream resets.

The per-cycle structure follows verif/tb_epilogue.py (falling edge: drive;
ReadOnly: sample what the next rising edge transfers) and reuses its fast port
access and stall patterns. The job comes from the JSON file named by
``KVTB_JOB`` (written by verif/roundtrip.py); each phase appends a record to
the results file named in the job.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections import deque
from pathlib import Path

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly

from hw.dec_stimulus import (adversarial_planes, encoded_planes, expected_outputs, int_to_lanes,
                             pack_planes, random_planes)
from sim_models import FormatParams
from verif.tb_epilogue import CLK_NS, MAX_ERRORS_KEPT, Port, pattern, record
from verif.vectors import get_set, input_words

DEFAULT_JOB = {
    "params": FormatParams().to_dict(),
    "latency_rt": 10,
    "latency_dec": 5,
    "seed": 1,
    # [{"name", "mode": "rt"|"direct", "count"|None, "seed"}]
    "sets": [{"name": "random", "mode": "rt", "count": 500},
             {"name": "adversarial", "mode": "direct", "count": None}],
    "fixture": None,
    "gap_p": 0.2, "stall_p": 0.3, "burst_p": 0.002, "burst_max": 200,
    "latency_vectors": 16, "throughput_vectors": 500,
    "reset_vectors": 1000, "resets": 8,
    "results": None,
}


def load_job() -> dict:
    job = dict(DEFAULT_JOB)
    path = os.environ.get("KVTB_JOB")
    if path:
        job.update(json.loads(Path(path).read_text()))
    return job


def params_of(job: dict) -> FormatParams:
    return FormatParams(**{k: v for k, v in job["params"].items() if k != "format_version"})


def words_for(p: FormatParams, mode: str, name: str, count, seed: int, fixture):
    """(input words, expected output words) of one set."""
    if mode == "rt":
        bits = get_set(name, p.n, count, seed, fixture, p.dtype)
        codes, scales = encoded_planes(bits, p)
        return input_words(bits), expected_outputs(codes, scales, p)
    if name == "random":
        codes, scales = random_planes(p, 1000 if count is None else count, seed)
    elif name == "adversarial":
        codes, scales = adversarial_planes(p, seed)
        if count is not None:
            codes, scales = codes[:count], scales[:count]
    else:
        raise ValueError(f"unknown direct set {name!r} (random, adversarial)")
    return pack_planes(codes, scales, p), expected_outputs(codes, scales, p)


def describe(got: int, exp: int, n: int) -> str:
    g, e = int_to_lanes(got, n), int_to_lanes(exp, n)
    lanes = np.flatnonzero(g != e)
    return f"{lanes.size} lanes differ (first: " + ", ".join(
        f"lane {int(k)} got {int(g[k]):#06x} exp {int(e[k]):#06x}" for k in lanes[:6]) + ")"


class Bench:
    def __init__(self, dut, job: dict, test_name: str):
        self.dut, self.job = dut, job
        self.p = params_of(job)
        self.seed = int(job["seed"])
        self.rng = np.random.default_rng([self.seed, zlib.crc32(test_name.encode())])
        self.test_name = test_name
        self.cycle = 0
        self._fall, self._ro = FallingEdge(dut.clk), ReadOnly()
        assert len(dut.o__payload) == 16 * self.p.n, "o__payload width"
        assert len(dut.i__payload) == 16 * self.p.n, "i__payload width"
        assert len(dut.d__payload) == self.p.n * self.p.bits + 8 * self.p.n_blocks, "d__payload"

    async def start(self):
        d = self.dut
        for h in (d.rst,):
            h.value = 1
        for h in (d.sel, d.i__valid, d.d__valid, d.o__ready, d.i__payload, d.d__payload):
            h.value = 0
        Clock(d.clk, CLK_NS, unit="ns").start()
        await self._fall
        for _ in range(4):
            await self._fall
            self.cycle += 1
        d.rst.value = 0
        await self._ro
        assert int(d.o__valid.value) == 0, "o__valid high right after reset"

    async def stream(self, mode: str, words_in: list, exp: list, label: str, *,
                     gap_p=0.0, stall_p=0.0, burst_p=0.0, burst_max=0, resets=0,
                     isolate=False, timeout=5000) -> dict:
        d, p = self.dut, self.p
        t_wall = time.perf_counter()
        # sel only changes while the pipeline is empty (between phases)
        await self._fall
        d.sel.value = 1 if mode == "direct" else 0
        self.cycle += 1
        pre = "d" if mode == "direct" else "i"
        valid_h, payload_h = Port(getattr(d, f"{pre}__valid")), Port(getattr(d, f"{pre}__payload"))
        ready_h = Port(getattr(d, f"{pre}__ready"))
        ovalid_h, opayload_h, oready_h, rst_h = (Port(d.o__valid), Port(d.o__payload),
                                                 Port(d.o__ready), Port(d.rst))
        wmask = (1 << len(payload_h.handle)) - 1
        nv = len(words_in)
        errors: list[str] = []
        queue: deque = deque()
        in_cycle: dict = {}
        lat: list[int] = []
        mism = spurious = flushed = n_out = hold_viol = 0
        rng = self.rng
        chunk, vpat, opat, base = 8192, None, None, 0
        reset_at = (sorted(rng.choice(np.arange(1, nv), size=min(resets, nv - 1),
                                      replace=False).tolist()) if resets and nv >= 8 else [])
        rst_on, rst_left, n_resets = False, 0, 0
        nxt, busy, vcur, word = 0, False, 0, 0
        oready, stalled = -1, None
        c0 = self.cycle
        last_progress = self.cycle
        first_out = last_out = None
        iready_low, idle_tail, timed_out = 0, 0, False
        fall, ro = self._fall, self._ro
        while True:
            c = self.cycle
            k = c - base
            if vpat is None or k >= chunk:
                base, k = c, 0
                vpat = pattern(rng, chunk, gap_p, burst_p, burst_max)
                opat = pattern(rng, chunk, stall_p, burst_p, burst_max)
            await fall
            if rst_on and rst_left == 0:
                rst_h.set(0)
                rst_on = False
            if not rst_on and reset_at and nxt >= reset_at[0] and queue:
                reset_at.pop(0)
                rst_on, rst_left = True, int(rng.integers(1, 5))
                rst_h.set(1)
                n_resets += 1
            if rst_on:
                rst_left -= 1
                busy = False
            if not busy:
                if not rst_on and nxt < nv and vpat[k] and (not isolate or not queue):
                    word, busy = words_in[nxt], True
                    payload_h.set(word)
                    if not vcur:
                        valid_h.set(1)
                        vcur = 1
                elif vcur:
                    valid_h.set(0)
                    vcur = 0
                    word = ~word & wmask            # junk while valid is low
                    payload_h.set(word)
            r = 1 if opat[k] else 0
            if r != oready:
                oready_h.set(r)
                oready = r
            await ro
            ov = ovalid_h.get()
            w = opayload_h.get() if ov else None
            if stalled is not None and w != stalled:
                hold_viol += 1
                if len(errors) < MAX_ERRORS_KEPT:
                    errors.append(f"cycle {c}: o__valid/o__payload changed while stalled")
            stalled = w if (ov and not r) else None
            if rst_on:
                stalled = None
                flushed += len(queue)
                queue.clear()
            else:
                if busy:
                    if ready_h.get():
                        queue.append(nxt)
                        in_cycle[nxt] = c
                        nxt += 1
                        busy = False
                        last_progress = c
                    else:
                        iready_low += 1
                if ov and r:
                    last_progress = c
                    if not queue:
                        spurious += 1
                        mism += 1
                        if len(errors) < MAX_ERRORS_KEPT:
                            errors.append(f"cycle {c}: output with no input outstanding")
                    else:
                        idx = queue.popleft()
                        n_out += 1
                        lat.append(c - in_cycle.pop(idx))
                        if w != exp[idx]:
                            mism += 1
                            if len(errors) < MAX_ERRORS_KEPT:
                                errors.append(f"cycle {c}: vector {idx}: "
                                              f"{describe(w, exp[idx], p.n)}")
                        first_out = c if first_out is None else first_out
                        last_out = c
            self.cycle += 1
            if nxt >= nv and not queue and not rst_on:
                idle_tail += 1
                if idle_tail > 4:
                    break
            if self.cycle - last_progress > timeout:
                timed_out = True
                errors.append(f"cycle {self.cycle}: no progress for {timeout} cycles "
                              f"(sent {nxt}/{nv}, {len(queue)} in flight)")
                break
        await fall
        if vcur:
            valid_h.set(0)
        await ro
        if int(d.o__valid.value):
            errors.append(f"cycle {self.cycle}: o__valid high with no input outstanding")
            spurious += 1
            mism += 1
        self.cycle += 1
        wall = time.perf_counter() - t_wall
        span = (last_out - first_out + 1) if first_out is not None else 0
        lats = sorted(set(lat))
        lost = nxt - flushed - n_out
        rec = {
            "test": self.test_name, "set": label, "mode": mode, "vectors": nv,
            "accepted": nxt, "outputs": n_out, "flushed_by_reset": flushed, "resets": n_resets,
            "mismatches": mism, "spurious": spurious, "hold_violations": hold_viol,
            "lost": lost, "timed_out": timed_out, "cycles": self.cycle - c0,
            "cycles_per_vector": (self.cycle - c0) / n_out if n_out else None,
            "span_cycles_per_vector": span / n_out if n_out else None,
            "latency_min": lats[0] if lats else None, "latency_max": lats[-1] if lats else None,
            "i_ready_low_cycles": iready_low, "wall_s": wall,
            "vectors_per_s": n_out / max(wall, 1e-9), "errors": errors,
        }
        rec["ok"] = (mism == 0 and hold_viol == 0 and not timed_out and lost == 0
                     and nxt == nv and not errors)
        return rec

    def finish(self, rec: dict, extra_errors=()) -> dict:
        rec["errors"] = list(rec["errors"]) + list(extra_errors)
        rec["ok"] = rec["ok"] and not extra_errors
        record(self.job, rec)
        cocotb.log.info(f"{rec['set']}: {rec['outputs']}/{rec['vectors']} out, "
                        f"{rec['mismatches']} mismatches, latency "
                        f"{rec['latency_min']}..{rec['latency_max']}, "
                        f"{rec['vectors_per_s']:.0f} vectors/s"
                        + (" OK" if rec["ok"] else " FAILED\n  " + "\n  ".join(rec["errors"])))
        return rec


def _stall_kw(job):
    return {k: job[k] for k in ("gap_p", "stall_p", "burst_p", "burst_max")}


def _assert_ok(recs):
    bad = [r for r in recs if not r["ok"]]
    assert not bad, "; ".join(f"{r['set']}: {r['mismatches']} mismatches, first: "
                              f"{r['errors'][:1]}" for r in bad)


async def _bench(dut, name):
    b = Bench(dut, load_job(), name)
    await b.start()
    return b


@cocotb.test()
async def test_latency(dut):
    """Isolated vectors: round trip latency == epilogue + decompressor latency_cycles;
    direct latency == decompressor latency_cycles."""
    b = await _bench(dut, "test_latency")
    recs = []
    for mode, want in (("rt", b.job["latency_rt"]), ("direct", b.job["latency_dec"])):
        w, e = words_for(b.p, mode, "random", b.job["latency_vectors"], b.seed + 101,
                         b.job.get("fixture"))
        rec = await b.stream(mode, w, e, f"latency_{mode}", isolate=True)
        errs = [] if rec["latency_min"] == rec["latency_max"] == want else [
            f"latency {rec['latency_min']}..{rec['latency_max']}, expected {want}"]
        recs.append(b.finish(rec, errs))
    _assert_ok(recs)


@cocotb.test()
async def test_throughput(dut):
    """Valid and ready always high: one vector per cycle through both modules."""
    b = await _bench(dut, "test_throughput")
    w, e = words_for(b.p, "rt", "random", b.job["throughput_vectors"], b.seed + 202,
                     b.job.get("fixture"))
    rec = await b.stream("rt", w, e, "throughput")
    errs = []
    if rec["span_cycles_per_vector"] != 1.0 or rec["i_ready_low_cycles"]:
        errs.append(f"{rec['span_cycles_per_vector']} cycles/vector, i__ready low "
                    f"{rec['i_ready_low_cycles']} cycles")
    _assert_ok([b.finish(rec, errs)])


@cocotb.test()
async def test_stream(dut):
    """Every configured set (round trip and direct) with random gaps, stalls, bursts."""
    b = await _bench(dut, "test_stream")
    recs = []
    k = int(b.job.get("fault_every") or 0)
    for s in b.job["sets"]:
        w, e = words_for(b.p, s["mode"], s["name"], s.get("count"), s.get("seed", b.seed),
                         b.job.get("fixture"))
        if k:       # scoreboard self-test: corrupt one bit of every k-th expected word
            e = list(e)
            for i in range(3, len(e), k):
                e[i] ^= 1 << ((i * 7) % (16 * b.p.n))
        rec = await b.stream(s["mode"], w, e, f"{s['mode']}:{s['name']}", **_stall_kw(b.job))
        if k:
            rec["injected_faults"] = len(range(3, len(e), k))
        recs.append(b.finish(rec))
    _assert_ok(recs)


@cocotb.test()
async def test_reset_midstream(dut):
    """Resets with words in flight in both modules: afterwards exactly the words sent
    after the reset come out, bit-exact."""
    b = await _bench(dut, "test_reset_midstream")
    w, e = words_for(b.p, "rt", "random", b.job["reset_vectors"], b.seed + 303,
                     b.job.get("fixture"))
    rec = await b.stream("rt", w, e, "rt:reset_midstream", resets=b.job["resets"],
                         **_stall_kw(b.job))
    errs = [] if rec["resets"] else ["no reset happened with words in flight"]
    _assert_ok([b.finish(rec, errs)])
