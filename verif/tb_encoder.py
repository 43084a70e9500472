"""cocotb tests of ``kv_encoder`` (the write path of fwht-kv), in the harness.

DUT ports (Verilog, as emitted by rtl_gen): clk, rst (synchronous, active high),
i__valid, i__ready, i__payload[N*16] (lane k fp16/bf16 bits at [16k, 16k+16)),
o__valid, o__ready, o__payload = codes | scales | [zeros (asym)] | flags
(``sim_models.wire.encoder_output``), status[3] (sticky OR of output flags),
status_clear.

Driver and monitor: verif/stream.py; scoreboard, latency and status checker:
kvtest.streamcheck. Expected words: the golden model (``sim_models.encode``) via
``kvtest.inputs.encoder_rows``. Tests:

* test_latency       isolated vectors: latency == the manifest's latency_cycles
* test_throughput    valid/ready always high: 1 vector per cycle (per 2 for two beats), constant latency
* test_stream        every vector set of the job under gaps, stalls, bursts, clears

Key-front-end configs (``..._k<T>``: ``i__payload`` = lanes | slot | bypass, table port
``cfg``): every test first loads tables (``kvtest.keyfront.bench_tables``) through
``cfg``; the generic sets get a random side band (``kvtest.keyfront.side_band``) and are
expected as the golden words of the tables held (``kvtest.keyfront.key_trace``: key
vectors by the folded rule, ``sim_models.codec.encode_folded``, bypassed ones by
``sim_models.encode``; a mirror of the hardware table, kept across the tests of the
run); the set ``keyfront`` streams the pinned
key-front-end set (``sim_models.testvectors.key_front_set``) while every slot is
reloaded mid-stream, its expected words computed after the run from the handshake
cycles (``kvtest.keyfront.seen_tables``). Coverage adds the ``key`` group.

Every phase samples the functional coverage (verif/coverage.py) of the vectors it scored
and of its handshakes.
* test_reset_midstream  resets with words in flight
* test_status_clear  scripted walk over every flag value
"""

from __future__ import annotations

import time
import zlib

import numpy as np

import cocotb

from kvtest.coverage import encoder_hits, take
from kvtest.inputs import encoder_rows, get_set
from kvtest.keyfront import (KeySlotTable, bench_tables, key_hits, seen_tables, side_band,
                             table_words, vector_trace)
from kvtest.streamcheck import describe_encoder_word, full_rate_record_errors
from sim_models import wire
from sim_models.codec import encode_trace
from sim_models.testvectors import key_front_set
from verif.stream import assert_ok, bench as _bench, inject_faults

#: The key front end's table as the DUT holds it (kept across the tests of one run: the
#: table memory has no reset).
_TABLES: list = [None]


def key_slots(b) -> int:
    from rtl_gen.config import RTLConfig
    return RTLConfig.parse(b.job.config).key_slots if b.job.config else 0


async def bench(dut, name: str):
    """verif.stream.bench, plus for a key-front-end DUT a table load through ``cfg``."""
    b = await _bench(dut, name)
    b.ks = key_slots(b)
    if b.ks:
        if _TABLES[0] is None:
            _TABLES[0] = KeySlotTable(b.p, b.ks)
        mu, e = bench_tables(b.p, b.ks, b.seed + zlib.crc32(name.encode()) % 1000)
        words = table_words(b.p, b.ks, mu, e)
        await b.load(wire.ints_to_binstr(words, b.widths["cfg__payload"]))
        for w in words:
            _TABLES[0].load(w)
    return b


def in_words(b, bits, slot, byp) -> list[str]:
    return wire.ints_to_binstr(wire.encoder_input_ints(bits, b.p, b.ks, slot, byp),
                               b.widths["i__payload"])


def exp_words(b, xin, trace):
    """Expected output strings and flags of inputs ``xin`` uint16 [V, N] (their golden
    ``trace``, or None: ``sim_models.encode``)."""
    rows, flags = encoder_rows(xin, b.p, trace)
    exp = wire.rows_to_binstr(rows, b.out_width)
    k = b.job.fault_every
    if k:
        exp, _ = inject_faults(exp, k, b.p.n * b.p.bits)
    return exp, flags


def vectors(b, name: str, count, seed=None) -> np.ndarray:
    return get_set(name, b.p.n, count, b.seed if seed is None else seed,
                   b.job.fixture, b.p.dtype, p=b.p)


def expected(b, bits: np.ndarray):
    """(input strings, expected output strings, flags, seconds, golden trace) of uint16
    [V, N]."""
    t0 = time.perf_counter()
    b.side = None
    if getattr(b, "ks", 0):
        slot, byp = side_band(len(bits), b.ks, b.seed + len(bits))
        trace = _TABLES[0].trace(bits, slot, byp)
        b.side = (bits, slot, byp)
    else:
        trace = encode_trace(bits, b.p)
    b.xin = bits
    exp, flags = exp_words(b, bits, trace)
    win = (in_words(b, bits, *b.side[1:]) if b.side else
           wire.rows_to_binstr(wire.lane_rows(bits), wire.lanes(b.p).width))
    return win, exp, flags, time.perf_counter() - t0, trace


async def run_set(b, bits, label: str, **kw) -> dict:
    win, exp, flags, prep, trace = expected(b, bits)
    rec = await b.stream(win, exp, label, prep_s=prep, **kw,
                         describe=lambda g, e: describe_encoder_word(int(g, 2), int(e, 2), b.p))
    rec["flags_or"] = int(np.bitwise_or.reduce(flags)) if len(flags) else 0
    if b.cov is not None and b.scored.size:     # functional coverage of the scored vectors
        b.cov.sample(encoder_hits, b.xin[b.scored], b.p, take(trace, b.scored))
        if b.side:
            x, slot, byp = (a[b.scored] for a in b.side)
            t = _TABLES[0]
            shp = (len(x), b.ks, b.p.n)
            b.cov.sample(key_hits, b.p, b.ks, x, np.broadcast_to(t.mu_s, shp),
                         np.broadcast_to(t.e, shp), slot, byp)
    if b.job.fault_every:
        rec["injected_faults"] = len(range(3, len(exp), b.job.fault_every))
    return rec


@cocotb.test()
async def test_latency(dut):
    """Isolated vectors, no stalls: cycles from i handshake to o handshake == manifest."""
    b = await bench(dut, "test_latency")
    rec = await run_set(b, vectors(b, "random", b.job.latency_vectors, b.seed + 101),
                        "latency", isolate=True, status_init=0)
    errs = []
    if not (rec["latency_min"] == rec["latency_max"] == b.latency):
        errs.append(f"latency measured {rec['latency_min']}..{rec['latency_max']} cycles, "
                    f"manifest latency_cycles = {b.latency}")
    rec["latency_measured"] = rec["latency_min"]
    assert_ok([b.finish(rec, errs)])


@cocotb.test()
async def test_throughput(dut):
    """i__valid always 1, o__ready always 1: one vector per cycle (two beats per vector:
    per two cycles), constant latency."""
    b = await bench(dut, "test_throughput")
    rec = await run_set(b, vectors(b, "random", b.job.throughput_vectors, b.seed + 202),
                        "throughput", status_init=0)
    errs = full_rate_record_errors(rec, b.latency, b.job.interval)
    assert_ok([b.finish(rec, errs)])


@cocotb.test()
async def test_stream(dut):
    """Every configured vector set with random gaps, stalls, bursts and status clears."""
    b = await bench(dut, "test_stream")
    recs = []
    for s in b.job.sets:
        await b.clear_status()
        kw = b.job.stalls()
        kw.update(s.get("stalls") or {})     # per-set stall settings (e.g. long bursts)
        if s["name"] == "keyfront":
            rec = await run_keyfront(b, s, kw)
        else:
            bits = vectors(b, s["name"], s.get("count"), s.get("seed"))
            rec = await run_set(b, bits, s.get("label", s["name"]), status_init=0, **kw)
        recs.append(b.finish(rec))
    assert_ok(recs)


async def run_keyfront(b, s: dict, kw: dict) -> dict:
    """The pinned key-front-end set with its own side band; its four tables loaded at the
    start and every slot reloaded (new tables) mid-stream, spread over the stream."""
    seed = s.get("seed") or 0
    x, mu0, e0, slot, byp = key_front_set(b.p.n, s.get("count") or 512, seed)
    ks = b.ks
    cfg = [(0, w) for w in table_words(b.p, ks, mu0, e0, range(min(ks, len(mu0))))]
    mu1, e1 = bench_tables(b.p, ks, seed + 1000)
    for j in range(ks):
        at = (j + 1) * len(x) // (ks + 1)
        cfg += [(at, w) for w in table_words(b.p, ks, mu1, e1, [j])]
    words = [w for _, w in cfg]
    start = _TABLES[0]
    seen = {}

    def expect(acc, cfgc):
        tab = KeySlotTable(b.p, ks)
        tab.mu_s[:], tab.e[:] = start.mu_s, start.e
        tab, mu, e, rl = seen_tables(b.p, ks, acc, words, cfgc, tab)
        xin = x[:len(acc)]
        trace = vector_trace(b.p, ks, xin, mu, e, slot[:len(acc)], byp[:len(acc)])
        seen.update(tab=tab, mu=mu, e=e, rl=rl, xin=xin, trace=trace)
        return exp_words(b, xin, trace)[0]

    t0 = time.perf_counter()
    win = in_words(b, x, slot, byp)
    cbits = wire.ints_to_binstr(words, b.widths["cfg__payload"])
    rec = await b.stream(win, expect, s.get("label", "keyfront"), status_init=0,
                         cfg=[(at, c) for (at, _), c in zip(cfg, cbits)], prep_s=0.0, **kw,
                         describe=lambda g, e: describe_encoder_word(int(g, 2), int(e, 2), b.p))
    rec["prep_s"] = time.perf_counter() - t0
    _TABLES[0] = seen["tab"]
    errs = []
    if len(b.cfg_cycles) != len(cfg):
        errs.append(f"{len(b.cfg_cycles)} of {len(cfg)} cfg words accepted")
    if b.cov is not None and b.scored.size:
        i = b.scored
        b.cov.sample(encoder_hits, seen["xin"][i], b.p, take(seen["trace"], i))
        b.cov.sample(key_hits, b.p, ks, x[i], seen["mu"][i], seen["e"][i], slot[i], byp[i],
                     seen["rl"][i])
    rec["cfg_words"] = len(b.cfg_cycles)
    if errs:
        rec["ok"] = False
        rec["errors"] = list(rec["errors"]) + errs
    return rec


@cocotb.test()
async def test_reset_midstream(dut):
    """Resets with words in flight: afterwards exactly the words sent after the reset."""
    b = await bench(dut, "test_reset_midstream")
    rec = await run_set(b, vectors(b, "random", b.job.reset_vectors, b.seed + 303),
                        "reset_midstream", resets=b.job.resets, status_init=0,
                        **b.job.stalls())
    errs = [] if rec["resets"] else ["no reset happened with words in flight"]
    assert_ok([b.finish(rec, errs)])


@cocotb.test()
async def test_status_clear(dut):
    """Scripted: status collects the flags of the words out, status_clear clears it."""
    b = await bench(dut, "test_status_clear")
    cand = np.concatenate([vectors(b, "adversarial", None),
                           vectors(b, "random", 512, b.seed + 404)])
    _, flags = encoder_rows(cand, b.p)
    by_flag = {f: np.flatnonzero(flags == f) for f in range(8)}
    present = sorted(f for f in range(8) if by_flag[f].size)
    errs = []
    if 0 not in present or len(present) < 3:
        errs.append(f"vector pool has too few flag values: {present}")
    steps = [([0, f, 0], True) for f in present]      # status == f after the words
    nz = [f for f in present if f]
    for i in range(len(nz) - 1):
        steps.append(([nz[i]], True))
        steps.append(([nz[i + 1], 0], False))          # sticky: status == nz[i] | nz[i+1]
    recs = []
    status = 0
    for fl, clear_first in steps:
        if clear_first:
            await b.clear_status()
            status = 0
        idx = np.array([by_flag[f][b.rng.integers(by_flag[f].size)] for f in fl])
        rec = await run_set(b, cand[idx], f"status{fl}", status_init=status,
                            gap_p=0.3, stall_p=0.3)
        want = status | int(np.bitwise_or.reduce(flags[idx]))
        got = b.mfield(b.last_m, "status")
        if got != want:
            rec["ok"] = False
            rec["errors"].append(f"status {got:03b} after words with flags {fl}, expected {want:03b}")
        status = want
        recs.append(rec)
    merged = {**recs[0], "set": "status_clear", "vectors": sum(r["vectors"] for r in recs),
              "outputs": sum(r["outputs"] for r in recs),
              "mismatches": sum(r["mismatches"] for r in recs),
              "cycles": sum(r["cycles"] for r in recs),
              "errors": [e for r in recs for e in r["errors"]],
              "ok": all(r["ok"] for r in recs), "flag_values": present,
              "flags_or": int(np.bitwise_or.reduce([r["flags_or"] for r in recs])),
              "status_violations": sum(r["status_violations"] for r in recs),
              "wall_s": sum(r["wall_s"] for r in recs)}
    merged["cycles_per_vector"] = merged["cycles"] / max(merged["outputs"], 1)
    merged["vectors_per_s"] = merged["outputs"] / max(merged["wall_s"], 1e-9)
    assert_ok([b.finish(merged, errs)])
