"""cocotb testbench of ``kv_epilogue`` (the write-path epilogue of fwht-kv).

DUT ports (Verilog, as emitted by rtl_gen): clk, rst (synchronous, active high),
i__valid, i__ready, i__payload[N*16] (lane k fp16 bits at [16k, 16k+16)),
o__valid, o__ready, o__payload = codes | scales << (N*b) | flags << (N*b + 8*N/G),
status[3] (sticky OR of output flags), status_clear.

Structure (all per-cycle work is done by one coroutine, :meth:`Bench.stream`,
which calls the driver, monitor and scoreboard objects in turn, two triggers
per clock cycle):

* at the falling edge the :class:`Driver` presents the next input word (one
  big int per port) or a gap (valid low, junk payload), holding word and valid
  while valid & ~ready; o__ready, status_clear and rst are driven from
  precomputed random patterns (independent gaps / stalls plus long bursts);
* in the ReadOnly phase after it the :class:`Monitor` samples i__ready,
  o__valid, o__payload and status: that is exactly what the next rising edge
  transfers. It checks the output stream rule (o__valid and o__payload held
  while o__valid & ~o__ready);
* the :class:`Scoreboard` compares every transferred output word bit-exact with
  the expected word (precomputed with sim_models.encode) of the oldest input
  accepted and not yet output: this catches loss, duplication and reordering;
  count in == count out at the end and no spurious output when idle;
* the status port is checked every cycle against the flags of the words
  transferred since the last reset / status_clear (bounds that allow one cycle
  of registering), and exactly when idle.

The job (configuration, vector sets, stall settings, seed) comes from the JSON
file named by the environment variable ``KVTB_JOB`` (written by verif/dut.py).
Each test appends one record per phase to the results JSON named in the job.
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

from sim_models import FormatParams
from verif.vectors import (MODELS, describe_mismatch, flags_shift, get_set, injected_faults,
                           input_words, out_width)

CLK_NS = 10
MAX_ERRORS_KEPT = 10

DEFAULT_JOB = {
    "params": FormatParams().to_dict(),
    "latency": 2,
    "model": "golden",
    "seed": 1,
    # vector sets streamed by test_stream: [{"name", "count"|None, "seed"}]
    "sets": [{"name": "random", "count": 2000}, {"name": "adversarial", "count": None}],
    "fixture": None,
    # stall settings: probabilities per cycle
    "gap_p": 0.2,          # i__valid low (when the driver has a word ready)
    "stall_p": 0.3,        # o__ready low
    "burst_p": 0.002,      # start of a long gap / stall burst
    "burst_max": 200,      # its length is uniform in [8, burst_max]
    "clear_p": 0.002,      # status_clear pulse
    "latency_vectors": 16,
    "throughput_vectors": 1000,
    "reset_vectors": 3000,
    "resets": 12,
    "results": None,
}


def load_job() -> dict:
    job = dict(DEFAULT_JOB)
    path = os.environ.get("KVTB_JOB")
    if path:
        job.update(json.loads(Path(path).read_text()))
    return job


def record(job: dict, rec: dict) -> None:
    """Append one phase record to the results file of the job (if any)."""
    path = job.get("results")
    if not path:
        return
    p = Path(path)
    recs = json.loads(p.read_text()) if p.exists() else []
    recs.append(rec)
    p.write_text(json.dumps(recs, indent=1))


def pattern(rng: np.random.Generator, n: int, p_off: float, burst_p: float,
            burst_max: int) -> np.ndarray:
    """Bool [n]: True where a signal is asserted. Independent dropouts with
    probability ``p_off`` plus bursts of ``[8, burst_max]`` cycles deasserted."""
    on = rng.random(n) >= p_off
    if burst_p > 0:
        starts = np.flatnonzero(rng.random(n) < burst_p)
        for s in starts:
            on[s:s + int(rng.integers(8, max(burst_max, 8) + 1))] = False
    return on


class Port:
    """Fast int access to one DUT port.

    Uses the GPI object behind the cocotb handle (one call per access: no
    LogicArray round trip), falling back to the public ``.value`` API. Writes are
    plain deposits, applied at once: the Verilator runner sets
    COCOTB_TRUST_INERTIAL_WRITES=1, and every write here happens right after a
    FallingEdge, never in the ReadOnly phase.
    """

    def __init__(self, handle):
        self.handle = handle
        self.width = len(handle)
        self.fmt = f"0{self.width}b"
        g = getattr(handle, "_handle", None)
        fast = (g is not None and hasattr(g, "get_signal_val_binstr")
                and hasattr(g, "set_signal_val_binstr")
                and os.environ.get("COCOTB_TRUST_INERTIAL_WRITES") == "1")
        self.g = g if fast else None

    def get(self) -> int:
        """Value as an unsigned int (ValueError on X/Z)."""
        if self.g is None:
            return int(self.handle.value)
        if self.width <= 32:   # Verilator is two-state: no X/Z to lose here
            return self.g.get_signal_val_long()
        return int(self.g.get_signal_val_binstr(), 2)

    def set(self, v: int) -> None:
        if self.g is None:
            self.handle.value = v
        elif self.width <= 32:
            self.g.set_signal_val_int(0, v)
        else:
            self.g.set_signal_val_binstr(0, format(v, self.fmt))

    @property
    def value(self):          # so a Port can stand in for a handle in slow paths
        return self.get()

    @value.setter
    def value(self, v) -> None:
        self.set(int(v))


class Driver:
    """Drives i__valid / i__payload; a presented word is held until accepted."""

    def __init__(self, dut, width: int):
        self.valid_h = Port(dut.i__valid)
        self.payload_h = Port(dut.i__payload)
        self.mask = (1 << width) - 1
        self.valid = 0      # value on i__valid
        self.busy = False   # a word is presented and not yet accepted
        self.word = 0

    def present(self, word: int) -> None:
        if not self.valid:
            self.valid_h.set(1)
            self.valid = 1
        self.payload_h.set(word)
        self.word = word
        self.busy = True

    def idle(self) -> None:
        """Valid low (abandons a presented word: only used for reset)."""
        self.busy = False
        if self.valid:
            self.valid_h.set(0)
            self.valid = 0
            # junk on the payload while valid is low: the DUT must ignore it
            self.word = ~self.word & self.mask
            self.payload_h.set(self.word)


class Monitor:
    """Samples the output side; checks the hold rule of the output stream."""

    def __init__(self, dut, errors: list):
        self.valid_h = Port(dut.o__valid)
        self.payload_h = Port(dut.o__payload)
        self.errors = errors
        self.stalled_word = None   # word of the last cycle if it was valid & ~ready
        self.hold_violations = 0

    def sample(self, ready: int, cycle: int):
        """Returns (valid, word or None). Reads o__payload only when valid."""
        v = self.valid_h.get()
        w = self.payload_h.get() if v else None
        if self.stalled_word is not None and w != self.stalled_word:
            self.hold_violations += 1
            if len(self.errors) < MAX_ERRORS_KEPT:
                self.errors.append(
                    f"cycle {cycle}: output stream rule broken: o__valid/o__payload changed "
                    f"while o__valid & ~o__ready (valid now {v})")
        self.stalled_word = w if (v and not ready) else None
        return v, w


class Scoreboard:
    """In-order bit-exact comparison of output words with expected words."""

    def __init__(self, p: FormatParams, exp: list[int], errors: list):
        self.p = p
        self.exp = exp
        self.errors = errors
        self.queue: deque[int] = deque()   # indices of accepted inputs awaiting output
        self.n_in = 0
        self.n_out = 0
        self.mismatches = 0
        self.spurious = 0
        self.flushed = 0
        self.in_cycle: dict[int, int] = {}
        self.latencies: list[int] = []

    def accepted(self, idx: int, cycle: int) -> None:
        self.queue.append(idx)
        self.in_cycle[idx] = cycle
        self.n_in += 1

    def flush(self) -> None:
        """Reset of the DUT: the words in flight are gone."""
        self.flushed += len(self.queue)
        for i in self.queue:
            self.in_cycle.pop(i, None)
        self.queue.clear()

    def output(self, word: int, cycle: int) -> None:
        if not self.queue:
            self.spurious += 1
            self.mismatches += 1
            if len(self.errors) < MAX_ERRORS_KEPT:
                self.errors.append(f"cycle {cycle}: output with no input outstanding "
                                   f"(duplicate or spurious word)")
            return
        idx = self.queue.popleft()
        self.n_out += 1
        self.latencies.append(cycle - self.in_cycle.pop(idx))
        exp = self.exp[idx]
        if word != exp:
            self.mismatches += 1
            if len(self.errors) < MAX_ERRORS_KEPT:
                hint = ""
                if idx + 1 < len(self.exp) and word == self.exp[idx + 1]:
                    hint = " [equals the NEXT expected word: lost vector?]"
                elif idx > 0 and word == self.exp[idx - 1]:
                    hint = " [equals the PREVIOUS expected word: duplicate?]"
                self.errors.append(f"cycle {cycle}: vector {idx}: "
                                   f"{describe_mismatch(word, exp, self.p)}{hint}")


class StatusChecker:
    """status == OR of the flags of the words transferred since reset / clear.

    Observed in the ReadOnly phase of cycle c (after rising edge c-1), status
    must contain the flags of every word transferred at edges <= c-2 (one cycle
    of registering allowed) and nothing beyond the flags of words transferred at
    edges <= c-1 or of the word on o__payload now. A word transferred at the
    same edge as a clear may or may not be counted. The two cycles after a
    clear / reset are not checked; idle, status must equal the OR exactly.
    """

    def __init__(self, errors: list):
        self.errors = errors
        self.lo = 0          # flags that must be in status
        self.hi = 0          # flags of all transfers since the clear
        self.amb = 0         # flags that may be in status (same edge as the clear)
        self.pending: deque = deque()   # (edge, flags) not yet in lo
        self.skip_until = -1
        self.violations = 0
        self.checks = 0

    def cleared(self, edge: int, same_edge_flags: int = 0) -> None:
        self.lo = self.hi = 0
        self.amb = same_edge_flags
        self.pending.clear()
        self.skip_until = edge + 2

    def transfer(self, edge: int, flags: int) -> None:
        if flags:
            self.hi |= flags
            self.pending.append((edge, flags))

    def check(self, status: int, cycle: int, presented_flags: int, exact: bool = False) -> None:
        while self.pending and self.pending[0][0] <= cycle - 2:
            self.lo |= self.pending.popleft()[1]
        if cycle <= self.skip_until:
            return
        self.checks += 1
        if exact:
            need, allow = self.hi, self.hi | self.amb
        else:
            need, allow = self.lo, self.hi | self.amb | presented_flags
        if (need & ~status) or (status & ~allow):
            self.violations += 1
            if len(self.errors) < MAX_ERRORS_KEPT:
                self.errors.append(f"cycle {cycle}: status {status:03b}, expected it to contain "
                                   f"{need:03b} and stay within {allow:03b}")


class Bench:
    """Clock, reset and the streaming loop for one test."""

    def __init__(self, dut, job: dict, test_name: str):
        self.dut = dut
        self.job = job
        self.p = FormatParams(**{k: v for k, v in job["params"].items() if k != "format_version"})
        self.model = MODELS[job["model"]]
        self.latency = int(job["latency"])
        self.seed = int(job["seed"])
        self.rng = np.random.default_rng([self.seed, zlib.crc32(test_name.encode())])
        self.test_name = test_name
        self.cycle = 0
        self.fshift = flags_shift(self.p)
        self._fall = FallingEdge(dut.clk)
        self._ro = ReadOnly()
        self._check_ports()

    def _check_ports(self):
        d, p = self.dut, self.p
        for name, width in (("i__payload", p.n * 16), ("o__payload", out_width(p)), ("status", 3)):
            got = len(getattr(d, name))
            assert got == width, f"port {name} is {got} bits, expected {width}"
        ports = (self.job.get("manifest") or {}).get("ports")
        if isinstance(ports, dict):
            for name, width in (("i__payload", p.n * 16), ("o__payload", out_width(p))):
                w = ports.get(name)
                if isinstance(w, dict):
                    w = w.get("width")
                if isinstance(w, int):
                    assert w == width, f"manifest says {name} is {w} bits, expected {width}"

    async def start(self):
        d = self.dut
        d.rst.value = 1
        d.i__valid.value = 0
        d.i__payload.value = 0
        d.o__ready.value = 0
        d.status_clear.value = 0
        Clock(d.clk, CLK_NS, unit="ns").start()
        await self.reset(4)

    async def reset(self, cycles: int):
        d = self.dut
        await self._fall
        d.rst.value = 1
        d.i__valid.value = 0
        for _ in range(cycles):
            await self._fall
            self.cycle += 1
        d.rst.value = 0
        await self._ro
        assert int(d.o__valid.value) == 0, "o__valid high right after reset"
        assert int(d.status.value) == 0, f"status {int(d.status.value):03b} after reset"

    def vectors(self, name: str, count, seed=None) -> np.ndarray:
        return get_set(name, self.p.n, count, self.seed if seed is None else seed,
                       self.job.get("fixture") or None, self.p.dtype)

    async def stream(self, bits: np.ndarray, label: str, *, gap_p: float = 0.0,
                     stall_p: float = 0.0, burst_p: float = 0.0, burst_max: int = 0,
                     clear_p: float = 0.0, resets: int = 0, isolate: bool = False,
                     timeout: int = 5000, exp=None, status_init: int = 0) -> dict:
        """Send ``bits`` (uint16 [V, N]) through the DUT and check every output.

        Args:
            gap_p, stall_p, burst_p, burst_max: random i__valid gaps / o__ready
                stalls (see :func:`pattern`).
            clear_p: probability of a status_clear pulse per cycle.
            resets: mid-stream resets, at random times with words in flight; the
                words in flight are dropped and the abandoned input is re-sent.
            isolate: present a word only when the DUT is empty (latency).
            timeout: cycles without progress before giving up.
            exp: (words, flags) expected, default the job's model of ``bits``.
            status_init: status before the phase (sticky flags of earlier words).

        Returns:
            the phase record (see :meth:`finish`).
        """
        d, p = self.dut, self.p
        t_wall = time.perf_counter()
        words_in = input_words(bits)
        exp_words, exp_flags = self.model(bits, p) if exp is None else exp
        t_prep = time.perf_counter() - t_wall
        nv = len(words_in)
        errors: list[str] = []
        drv = Driver(d, p.n * 16)
        mon = Monitor(d, errors)
        sb = Scoreboard(p, exp_words, errors)
        st = StatusChecker(errors)
        st.lo = st.hi = status_init
        rng = self.rng
        chunk = 8192
        vpat = opat = cpat = None
        base = 0
        reset_at = []
        if resets and nv >= 8:
            reset_at = sorted(rng.choice(np.arange(1, nv), size=min(resets, nv - 1),
                                         replace=False).tolist())
        rst_on, rst_left, n_resets = False, 0, 0
        nxt = 0                                   # next input index to present
        first_out = last_out = None
        iready_low = 0                            # cycles with i__valid & ~i__ready
        c0 = self.cycle
        last_progress = self.cycle
        fshift = self.fshift
        o_ready_h, clear_h, rst_h = Port(d.o__ready), Port(d.status_clear), Port(d.rst)
        i_ready_h, status_h = Port(d.i__ready), Port(d.status)
        oready, clear = -1, 0
        timed_out = False
        idle_tail = 0
        fall, ro = self._fall, self._ro
        while True:
            c = self.cycle
            k = c - base
            if vpat is None or k >= chunk:
                base, k = c, 0
                vpat = pattern(rng, chunk, gap_p, burst_p, burst_max)
                opat = pattern(rng, chunk, stall_p, burst_p, burst_max)
                cpat = rng.random(chunk) < clear_p
            await fall
            # ---- drive, for the rising edge that ends cycle c ----
            if rst_on and rst_left == 0:
                rst_h.set(0)
                rst_on = False
            if not rst_on and reset_at and nxt >= reset_at[0] and sb.queue:
                reset_at.pop(0)
                rst_on, rst_left = True, int(rng.integers(1, 5))
                rst_h.set(1)
                n_resets += 1
            if rst_on:
                rst_left -= 1
                drv.idle()
            elif not drv.busy:
                if nxt < nv and vpat[k] and (not isolate or not sb.queue):
                    drv.present(words_in[nxt])
                else:
                    drv.idle()
            r = 1 if opat[k] else 0
            if r != oready:
                o_ready_h.set(r)
                oready = r
            cl = 1 if (cpat[k] and not rst_on) else 0
            if cl != clear:
                clear_h.set(cl)
                clear = cl
            await ro
            # ---- sample: what rising edge c transfers ----
            ov, w = mon.sample(r, c)
            if rst_on:
                mon.stalled_word = None
                sb.flush()
                st.cleared(c)
            else:
                if drv.busy:
                    if i_ready_h.get():
                        sb.accepted(nxt, c)
                        nxt += 1
                        drv.busy = False
                        last_progress = c
                    else:
                        iready_low += 1
                if not cl:
                    st.check(status_h.get(), c, (w >> fshift) & 7 if ov else 0)
                f = 0
                if ov and r:
                    sb.output(w, c)
                    f = (w >> fshift) & 7
                    st.transfer(c, f)
                    if first_out is None:
                        first_out = c
                    last_out = c
                    last_progress = c
                if cl:
                    st.cleared(c, f)
            self.cycle += 1
            if nxt >= nv and not sb.queue and not rst_on:
                idle_tail += 1
                if idle_tail > self.latency + 4:
                    break
            if self.cycle - last_progress > timeout:
                timed_out = True
                errors.append(f"cycle {self.cycle}: no progress for {timeout} cycles "
                              f"(sent {nxt}/{nv}, {len(sb.queue)} in flight): DUT hung?")
                break
        # idle at the end: drop valid, no clear, status must be exact
        await fall
        drv.idle()
        if clear:
            clear_h.set(0)
        await ro
        if int(d.o__valid.value):
            errors.append(f"cycle {self.cycle}: o__valid high with no input outstanding")
            sb.spurious += 1
            sb.mismatches += 1
        st.check(status_h.get(), self.cycle, 0, exact=True)
        self.cycle += 1
        wall = time.perf_counter() - t_wall
        span = (last_out - first_out + 1) if first_out is not None else 0
        lat = sorted(set(sb.latencies))
        lost = sb.n_in - sb.flushed - sb.n_out
        rec = {
            "test": self.test_name, "set": label, "vectors": nv,
            "accepted": sb.n_in, "outputs": sb.n_out, "flushed_by_reset": sb.flushed,
            "resets": n_resets, "mismatches": sb.mismatches, "spurious": sb.spurious,
            "hold_violations": mon.hold_violations, "status_violations": st.violations,
            "status_checks": st.checks, "lost": lost, "timed_out": timed_out,
            "cycles": self.cycle - c0, "output_span_cycles": span,
            "cycles_per_vector": ((self.cycle - c0) / sb.n_out) if sb.n_out else None,
            "span_cycles_per_vector": (span / sb.n_out) if sb.n_out else None,
            "latency_min": lat[0] if lat else None, "latency_max": lat[-1] if lat else None,
            "i_ready_low_cycles": iready_low,
            "flags_or": int(np.bitwise_or.reduce(exp_flags)) if len(exp_flags) else 0,
            "wall_s": wall, "prep_s": t_prep,
            "vectors_per_s": sb.n_out / max(wall - t_prep, 1e-9),
            "cycles_per_s": (self.cycle - c0) / max(wall - t_prep, 1e-9),
            "stalls": {"gap_p": gap_p, "stall_p": stall_p, "burst_p": burst_p,
                       "burst_max": burst_max, "clear_p": clear_p, "isolate": isolate},
            "errors": errors,
        }
        rec["ok"] = (sb.mismatches == 0 and mon.hold_violations == 0 and st.violations == 0
                     and not timed_out and lost == 0 and nxt == nv and not errors)
        rec["status_end"] = st.hi
        if self.job["model"] == "golden_faulty" and exp is None:
            rec["injected_faults"] = injected_faults(nv)
        return rec

    def finish(self, rec: dict, extra_errors=()) -> dict:
        """Add test-level errors to a phase record, log it, append it to the results."""
        rec["errors"] = list(rec["errors"]) + list(extra_errors)
        rec["ok"] = rec["ok"] and not extra_errors
        record(self.job, rec)
        lat = rec["latency_min"], rec["latency_max"]
        cocotb.log.info(
            f"{rec['set']}: {rec['outputs']}/{rec['vectors']} vectors out, {rec['mismatches']} "
            f"mismatches, {rec['cycles']} cycles ({rec['cycles_per_vector'] or 0:.3f}/vector), "
            f"latency {lat}, {rec['vectors_per_s']:.0f} vectors/s"
            + (" OK" if rec["ok"] else " FAILED\n  " + "\n  ".join(rec["errors"])))
        return rec

    async def clear_status(self) -> None:
        """Pulse status_clear for one cycle (idle DUT); status must read 0 after it."""
        d = self.dut
        await self._fall
        d.status_clear.value = 1
        await self._fall
        d.status_clear.value = 0
        self.cycle += 1
        await self._ro
        s = int(d.status.value)
        self.cycle += 1
        assert s == 0, f"status {s:03b} after status_clear"


# ---- tests ------------------------------------------------------------------

async def _bench(dut, name: str) -> Bench:
    b = Bench(dut, load_job(), name)
    await b.start()
    return b


def _stall_kw(job: dict) -> dict:
    return {k: job[k] for k in ("gap_p", "stall_p", "burst_p", "burst_max", "clear_p")}


def _assert_ok(recs) -> None:
    bad = [r for r in recs if not r["ok"]]
    assert not bad, "; ".join(f"{r['set']}: {r['mismatches']} mismatches, "
                              f"{len(r['errors'])} errors, first: {r['errors'][:1]}" for r in bad)


@cocotb.test()
async def test_latency(dut):
    """Isolated vectors, no stalls: cycles from i handshake to o handshake == manifest."""
    b = await _bench(dut, "test_latency")
    bits = b.vectors("random", b.job["latency_vectors"], seed=b.seed + 101)
    rec = await b.stream(bits, "latency", isolate=True)
    errs = []
    if not (rec["latency_min"] == rec["latency_max"] == b.latency):
        errs.append(f"latency measured {rec['latency_min']}..{rec['latency_max']} cycles, "
                    f"manifest latency_cycles = {b.latency}")
    rec["latency_measured"] = rec["latency_min"]
    _assert_ok([b.finish(rec, errs)])


@cocotb.test()
async def test_throughput(dut):
    """i__valid always 1, o__ready always 1: one vector per cycle, constant latency."""
    b = await _bench(dut, "test_throughput")
    bits = b.vectors("random", b.job["throughput_vectors"], seed=b.seed + 202)
    rec = await b.stream(bits, "throughput")
    errs = []
    if rec["i_ready_low_cycles"]:
        errs.append(f"i__ready low in {rec['i_ready_low_cycles']} cycles with o__ready always 1")
    if rec["span_cycles_per_vector"] != 1.0:
        errs.append(f"throughput {1 / rec['span_cycles_per_vector']:.4f} vectors/cycle, expected 1")
    if not (rec["latency_min"] == rec["latency_max"] == b.latency):
        errs.append(f"latency {rec['latency_min']}..{rec['latency_max']} under full load, "
                    f"manifest {b.latency}")
    rec["throughput_vectors_per_cycle"] = (1 / rec["span_cycles_per_vector"]
                                           if rec["span_cycles_per_vector"] else 0.0)
    _assert_ok([b.finish(rec, errs)])


@cocotb.test()
async def test_stream(dut):
    """Every configured vector set with random gaps, stalls, bursts and status clears."""
    b = await _bench(dut, "test_stream")
    recs = []
    for s in b.job["sets"]:
        bits = b.vectors(s["name"], s.get("count"), s.get("seed"))
        await b.clear_status()
        rec = await b.stream(bits, s.get("label", s["name"]), **_stall_kw(b.job))
        recs.append(b.finish(rec))
    _assert_ok(recs)


@cocotb.test()
async def test_reset_midstream(dut):
    """Resets with words in flight: afterwards exactly the words sent after the reset."""
    b = await _bench(dut, "test_reset_midstream")
    bits = b.vectors("random", b.job["reset_vectors"], seed=b.seed + 303)
    rec = await b.stream(bits, "reset_midstream", resets=b.job["resets"], **_stall_kw(b.job))
    errs = []
    if rec["resets"] == 0:
        errs.append("no reset happened with words in flight")
    _assert_ok([b.finish(rec, errs)])


@cocotb.test()
async def test_status_clear(dut):
    """Scripted: status collects the flags of the words out, status_clear clears it."""
    b = await _bench(dut, "test_status_clear")
    cand = np.concatenate([b.vectors("adversarial", None), b.vectors("random", 512, b.seed + 404)])
    words, flags = b.model(cand, b.p)
    by_flag = {f: np.flatnonzero(flags == f) for f in range(8)}
    present = sorted(f for f in range(8) if by_flag[f].size)
    errs = []
    if 0 not in present or len(present) < 3:
        errs.append(f"vector pool has too few flag values: {present}")
    steps = []   # (flag values of the words to send, clear before?)
    for f in present:
        steps.append(([0, f, 0], True))          # status == f after the words
    nz = [f for f in present if f]
    for i in range(len(nz) - 1):
        steps.append(([nz[i]], True))
        steps.append(([nz[i + 1], 0], False))    # sticky: status == nz[i] | nz[i+1]
    recs = []
    status = 0
    for fl, clear_first in steps:
        if clear_first:
            await b.clear_status()
            status = 0
        idx = np.array([by_flag[f][b.rng.integers(by_flag[f].size)] for f in fl])
        sel = cand[idx]
        rec = await b.stream(sel, f"status{fl}", status_init=status,
                             exp=([words[i] for i in idx], flags[idx]), gap_p=0.3, stall_p=0.3)
        want = status | int(np.bitwise_or.reduce(flags[idx]))
        got = int(b.dut.status.value)
        if got != want:
            rec["ok"] = False
            rec["errors"].append(f"status {got:03b} after words with flags {fl}, expected {want:03b}")
        status = want
        recs.append(rec)
    merged = {**recs[0], "set": "status_clear", "vectors": sum(r["vectors"] for r in recs),
              "outputs": sum(r["outputs"] for r in recs),
              "mismatches": sum(r["mismatches"] for r in recs),
              "errors": [e for r in recs for e in r["errors"]],
              "ok": all(r["ok"] for r in recs), "flag_values": present,
              "flags_or": int(np.bitwise_or.reduce([r["flags_or"] for r in recs])),
              "status_violations": sum(r["status_violations"] for r in recs),
              "wall_s": sum(r["wall_s"] for r in recs)}
    _assert_ok([b.finish(merged, errs)])
