"""Stream driver, monitor and scoreboard of the cocotb testbenches (one per-cycle loop).

Used inside the simulator by verif/tb_encoder.py and verif/tb_roundtrip.py on
the bench harness ``kvtb`` of verif/harness.py (DUT inputs latched from ``t_*`` at
the falling edge; ``m_ctl`` / ``m_o__payload`` capture at the rising edge what
that edge transferred; ``m_hold_err`` counts breaks of the output stream rule).

Per cycle, :meth:`Bench.stream` awaits one FallingEdge (its callback runs
before the simulator evaluates that edge, after the rising edge before it) and then

* samples ``m_ctl`` (one VPI read of a small vector) and, when the rising edge
  transferred an output word, ``m_o__payload`` as a binary string;
* drives the next cycle (latched by this falling edge): the next input word (a
  precomputed binary string; held until accepted, junk while valid is low),
  o__ready, status_clear and rst from precomputed random patterns (independent
  gaps / stalls plus long bursts), all 1-bit inputs as one write of ``t_ctl``.

No per-lane work and no comparison happen in the loop: it only drives and
records. The stimulus and the expected words are binary strings computed
beforehand with the vectorised golden model (kvtest.inputs / kvtest.planes,
sim_models.wire); after the loop, :func:`kvtest.streamcheck.phase_record`
scores all output words in order (loss, duplication and reordering show as
mismatches or counts), takes the latency of every word from the recorded
handshake cycles and replays the recorded per-cycle samples through the status
checker (:class:`kvtest.streamcheck.StatusChecker`).

The job (:class:`verif.job.Job`: configuration, harness layout, vector sets,
stall settings, seed) comes from the JSON file named by the environment variable
``KVTB_JOB`` (written by verif/run.py); every phase appends one record to the
results file named in the job.
"""

from __future__ import annotations

import gc
import os
import time
import zlib

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge

from kvtest.coverage import stream_events
from kvtest.streamcheck import StatusChecker, phase_record

from .job import Job

CLK_NS = 10
#: GPI write action vpiNoDelay: the value is in the model at once, so a write in
#: the FallingEdge callback (which runs before the simulator evaluates that edge)
#: is latched by the harness at this very edge. (A deposit is an inertial write
#: under COCOTB_TRUST_INERTIAL_WRITES=1: Verilator applies it after the eval.)
NOW = 3
#: Cycles a mid-stream reset may wait for a stalled output word (every second reset).
RESET_STALL_WAIT = 64


def pattern(rng: np.random.Generator, n: int, p_off: float, burst_p: float,
            burst_max: int) -> list[bool]:
    """[n] bools: True where a signal is asserted. Independent dropouts with
    probability ``p_off`` plus bursts of ``[8, burst_max]`` cycles deasserted."""
    on = rng.random(n) >= p_off
    if burst_p > 0:
        for s in np.flatnonzero(rng.random(n) < burst_p):
            on[s:s + int(rng.integers(8, max(burst_max, 8) + 1))] = False
    return on.tolist()


def inject_faults(exp: list[str], every: int, bits: int) -> tuple[list[str], int]:
    """Flip bit ``(i*7) % bits`` (from the LSB) of expected words i = 3, 3+every, ...

    The scoreboard self-test: exactly these words must be reported. Returns
    (new list, number of corrupted words)."""
    exp = list(exp)
    idx = range(3, len(exp), every) if every else range(0)
    for i in idx:
        w = exp[i]
        k = len(w) - 1 - (i * 7) % bits
        exp[i] = w[:k] + ("1" if w[k] == "0" else "0") + w[k + 1:]
    return exp, len(idx)


class Bench:
    """Clock, reset and the streaming loop on the harness, for one cocotb test."""

    def __init__(self, dut, job: Job, test_name: str):
        self.dut = dut
        self.job = job
        self.p = job.params
        self.lay = job.harness
        self.latency = job.latency
        self.seed = job.seed
        self.rng = np.random.default_rng([self.seed, zlib.crc32(test_name.encode())])
        self.test_name = test_name
        self.cycle = 0
        self.ctl = 0              # value on t_ctl
        self.last_m = 0           # last m_ctl sample
        self.has_status = "status" in self.lay["m_ctl"]
        self.cov = None           # verif.coverage.Sampler (bench(), when the job names a file)
        self.scored = np.zeros(0, dtype=np.int64)   # inputs whose output the last phase scored
        self._edge = FallingEdge(dut.clk)
        trusted = os.environ.get("COCOTB_TRUST_INERTIAL_WRITES") == "1"

        def raw(h):   # GPI object: one call per access, no LogicArray round trip
            g = getattr(h, "_handle", None)
            if trusted and g is not None and hasattr(g, "set_signal_val_binstr"):
                return g
            return _SlowPort(h)

        self.t_ctl = raw(dut.t_ctl)
        self.t_wide = {n: raw(getattr(dut, f"t_{n}")) for n in self.lay["wide_in"]}
        self.m_ctl = raw(dut.m_ctl)
        self.m_pay = raw(dut.m_o__payload)
        self.m_hold_err = raw(dut.m_hold_err)
        self.m_hold_first = raw(dut.m_hold_first)
        self.widths = {n: len(getattr(dut, f"t_{n}")) for n in self.lay["wide_in"]}
        self.out_width = len(dut.m_o__payload)
        assert self.out_width == self.lay["out_payload"], "m_o__payload width"

    async def load(self, words: list[str]) -> list[int]:
        """Write ``words`` (binary strings) through the ``cfg`` stream, one per cycle, with
        the DUT otherwise idle; returns their handshake cycles."""
        cv, fire = self.bit("cfg__valid"), 1 << self.lay["m_ctl"]["cfg_fire"][0]
        pay, done = self.t_wide["cfg__payload"], []
        for w in words:
            pay.set_signal_val_binstr(NOW, w)
            while True:
                m = await self.idle(1, cv)
                if m & fire:
                    done.append(self.cycle)
                    break
        await self.idle(1)
        return done

    def bit(self, name: str) -> int:
        """t_ctl mask of a 1-bit DUT input (0 if the DUT has no such input)."""
        k = self.lay["t_ctl"].get(name)
        return 0 if k is None else 1 << k

    def mfield(self, m: int, name: str) -> int:
        pos, w = self.lay["m_ctl"][name]
        return (m >> pos) & ((1 << w) - 1)

    async def start(self, reset_cycles: int = 4):
        """Zero every input, start the clock, hold rst for ``reset_cycles`` edges."""
        self.ctl = self.bit("rst")
        self.t_ctl.set_signal_val_int(NOW, self.ctl)
        for n, g in self.t_wide.items():
            g.set_signal_val_binstr(NOW, "0" * self.widths[n])
        Clock(self.dut.clk, CLK_NS, unit="ns").start()
        for _ in range(reset_cycles):
            await self._edge
            self.cycle += 1
        await self.idle(2)
        assert not self.last_m & 2, "o__valid high right after reset"
        if self.has_status:
            assert self.mfield(self.last_m, "status") == 0, "status not 0 after reset"

    async def idle(self, cycles: int = 1, ctl: int = 0) -> int:
        """Drive t_ctl = ``ctl`` for ``cycles`` cycles; returns the last m_ctl sample."""
        for _ in range(cycles):
            if ctl != self.ctl:
                self.t_ctl.set_signal_val_int(NOW, ctl)
                self.ctl = ctl
            await self._edge
            self.cycle += 1
            self.last_m = self.m_ctl.get_signal_val_long()
        return self.last_m

    async def clear_status(self) -> None:
        """Pulse status_clear for one cycle (idle DUT); status must read 0 after it."""
        await self.idle(1, self.bit("status_clear"))
        m = await self.idle(1)
        s = self.mfield(m, "status")
        assert s == 0, f"status {s:03b} after status_clear"

    async def stream(self, words_in: list[str], exp: list[str], label: str, *,
                     port: str = "i", fixed: int = 0, gap_p: float = 0.0,
                     stall_p: float = 0.0, burst_p: float = 0.0, burst_max: int = 0,
                     clear_p: float = 0.0, resets: int = 0, isolate: bool = False,
                     timeout: int = 5000, status_init: int | None = None,
                     describe=None, prep_s: float = 0.0, cfg=None) -> dict:
        """Send ``words_in`` through input stream ``port`` and check every output.

        Args:
            words_in: input payloads as binary strings (width of ``t_<port>__payload``).
            exp: expected output payloads, binary strings of the o__payload width,
                one per input, in order; or a callable (input handshake cycles, cfg
                handshake cycles) -> that list, called after the loop (expected words
                that depend on when the table words landed).
            fixed: t_ctl bits held during the phase (e.g. ``sel``).
            gap_p, stall_p, burst_p, burst_max: random valid gaps / o__ready
                stalls (see :func:`pattern`).
            clear_p: probability of a status_clear pulse per cycle (DUTs with status).
            resets: mid-stream resets, at random times with words in flight (every
                second one waits up to :data:`RESET_STALL_WAIT` cycles for an output
                word held by back-pressure); the words in flight are dropped and the
                abandoned input is re-sent.
            isolate: present a word only when the DUT is empty (latency).
            timeout: cycles without progress before giving up.
            status_init: status before the phase (sticky flags of earlier words);
                None: do not check status.
            describe: (got int, expected int) -> text for mismatch messages.
            prep_s: seconds spent preparing stimulus / expected words (reported).
            cfg: (input index, binary string) words for the ``cfg`` stream (the key
                front end's table port), offered in order, word j once ``index_j``
                inputs were accepted, with the input stream's gap pattern; their
                handshake cycles go to the record (``cfg_cycles``).

        Returns:
            the phase record (see :meth:`finish`).
        """
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        timeout = max(timeout, 3 * burst_max)
        nv = len(words_in)
        errors: list[str] = []
        rng = self.rng
        rst_b, clr_b = self.bit("rst"), self.bit("status_clear")
        val_b, ordy_b = self.bit(f"{port}__valid"), self.bit("o__ready")
        ifire = 1 << self.lay["m_ctl"][f"{port}_fire"][0]
        tpay = self.t_wide[f"{port}__payload"]
        junk = "".join(rng.choice(["0", "1"], size=self.widths[f"{port}__payload"]).tolist())
        set_ctl, get_m, get_pay = (self.t_ctl.set_signal_val_int, self.m_ctl.get_signal_val_long,
                                   self.m_pay.get_signal_val_binstr)
        check_status = self.has_status and status_init is not None
        hist: list[int] = []
        hold0 = self.m_hold_err.get_signal_val_long()
        chunk = 8192
        vp = op = cp = None
        cfg = cfg or []
        cfg_c: list[int] = []
        cfg_on = False
        if cfg:
            cval_b = self.bit("cfg__valid")
            cfire = 1 << self.lay["m_ctl"]["cfg_fire"][0]
            cpay = self.t_wide["cfg__payload"]
        base = 0
        reset_at = []
        reset_events = []         # (words in flight, output stalled, input presented)
        if resets and nv >= 8:
            reset_at = sorted(rng.choice(np.arange(1, nv), size=min(resets, nv - 1),
                                         replace=False).tolist())
        rst_on, rst_left, n_resets = False, 0, 0
        wait0 = None              # cycle the pending reset started waiting for a stall
        nxt = head = 0            # next input to present / oldest accepted not yet out
        busy, valid = False, False
        acc_c: list[int] = []     # cycle of the input handshake of vector i
        out_w: list[str] = []
        out_c: list[int] = []
        out_i: list[int] = []     # input index of each output word (-1: none outstanding)
        flushed = iready_low = idle_tail = 0
        timed_out = False
        c0 = c = self.cycle
        last_progress = c
        cur = self.ctl
        edge = self._edge
        latency = self.latency
        # the loop allocates only short-lived ints/strings (no cycles): Python's
        # cyclic GC, triggered by those allocations, was ~20 % of the run time
        # (re-enabled after the loop, and by bench() for every test)
        gc_on = gc.isenabled()
        gc.disable()
        while True:
            k = c - base
            if vp is None or k >= chunk:
                base, k = c, 0
                vp = pattern(rng, chunk, gap_p, burst_p, burst_max)
                op = pattern(rng, chunk, stall_p, burst_p, burst_max)
                cp = (rng.random(chunk) < clear_p).tolist() if clr_b and clear_p else [False] * chunk
            # ---- drive, for the rising edge c+1 ----
            if rst_on and rst_left == 0:
                rst_on = False
            if not rst_on and reset_at and nxt >= reset_at[0] and head < nxt:
                # every second reset waits (at most RESET_STALL_WAIT cycles) for an
                # output word held by o__ready low: reset with back-pressure applied
                stalled = bool(m & 2) and not cur & ordy_b
                wait0 = c if wait0 is None else wait0
                if stalled or n_resets % 2 == 0 or c - wait0 >= RESET_STALL_WAIT:
                    reset_at.pop(0)
                    wait0 = None
                    reset_events.append((nxt - head, stalled, valid))
                    rst_on, rst_left = True, int(rng.integers(1, 5))
                    n_resets += 1
            if rst_on:
                rst_left -= 1
                busy = False
                if valid:
                    valid = False
                    tpay.set_signal_val_binstr(NOW, junk)
            elif not busy:
                if nxt < nv and vp[k] and (not isolate or head == nxt):
                    tpay.set_signal_val_binstr(NOW, words_in[nxt])
                    busy = valid = True
                elif valid:
                    valid = False     # junk on the payload while valid is low
                    tpay.set_signal_val_binstr(NOW, junk)
            if cfg and not cfg_on and len(cfg_c) < len(cfg) and nxt >= cfg[len(cfg_c)][0] \
                    and not rst_on and vp[k]:
                cpay.set_signal_val_binstr(NOW, cfg[len(cfg_c)][1])
                cfg_on = True
            ctl = fixed | (rst_b if rst_on else 0) | (val_b if valid else 0) \
                | (cval_b if cfg_on else 0) \
                | (ordy_b if op[k] else 0) | (clr_b if cp[k] and not rst_on else 0)
            if ctl != cur:
                set_ctl(NOW, ctl)
                cur = ctl
            await edge
            c += 1
            # ---- sample: what rising edge c transferred ----
            m = get_m()
            hist.append(m | (ctl << 32))
            if cfg_on and m & cfire:
                cfg_c.append(c)
                cfg_on = False
                last_progress = c
            if rst_on:
                flushed += nxt - head
                head = nxt
            else:
                if busy:
                    if m & ifire:
                        acc_c.append(c)
                        nxt += 1
                        busy = False
                        last_progress = c
                    else:
                        iready_low += 1
                if m & 1:
                    out_w.append(get_pay())
                    out_c.append(c)
                    if head < nxt:
                        out_i.append(head)
                        head += 1
                    else:
                        out_i.append(-1)
                    last_progress = c
                if nxt >= nv and head == nxt and len(cfg_c) == len(cfg):
                    idle_tail += 1
                    if idle_tail > latency + 4:
                        break
            if c - last_progress > timeout:
                timed_out = True
                errors.append(f"cycle {c}: no progress for {timeout} cycles "
                              f"(sent {nxt}/{nv}, {nxt - head} in flight): DUT hung?")
                break
        self.cycle, self.ctl = c, cur
        if gc_on:
            gc.enable()
        # idle at the end: valid low, no clear: no output, status exact
        m = await self.idle(1, fixed | (ordy_b if cur & ordy_b else 0))
        t_loop = time.perf_counter() - t0
        cpu_loop = time.process_time() - cpu0
        self.scored = np.array([i for i in out_i if i >= 0], dtype=np.int64)
        self.cfg_cycles = cfg_c
        if callable(exp):
            exp = exp(acc_c, cfg_c)
        if self.cov is not None:
            h = np.array(hist, dtype=np.int64)
            d, mm = h >> 32, h & 0xFFFFFFFF
            self.cov.events(stream_events(
                o_valid=(mm & 2) != 0, o_ready=(d & ordy_b) != 0, o_fire=(mm & 1) != 0,
                i_valid=(d & val_b) != 0, i_fire=(mm & ifire) != 0, rst=(d & rst_b) != 0,
                resets=reset_events, interval=self.job.interval))
        # ---- scoreboard, latency, status: kvtest.streamcheck ----
        extra, spurious_end = [], 0
        if m & 2:
            extra.append(f"cycle {self.cycle}: o__valid high with no input outstanding")
            spurious_end = 1
        hold = self.m_hold_err.get_signal_val_long() - hold0
        if hold:
            extra.append(f"output stream rule broken {hold} times: o__valid/o__payload changed "
                         f"while o__valid & ~o__ready (first at harness cycle "
                         f"{self.m_hold_first.get_signal_val_long()})")
        st = None
        if check_status:
            mf, tb = self.lay["m_ctl"], self.lay["t_ctl"]
            st = StatusChecker([], status_init)
            st.replay(hist, c0, status_pos=mf["status"][0], flags_pos=mf["o_flags"][0],
                      out_valid=2, out_fire=1, rst=1 << (32 + tb["rst"]),
                      clear=1 << (32 + tb["status_clear"]))
            st.check(self.mfield(m, "status"), self.cycle, 0, exact=True)
        return phase_record(
            test=self.test_name, label=label, vectors=nv, accepted=nxt, out_words=out_w,
            out_index=out_i, out_cycles=out_c, acc_cycles=acc_c, expected=exp,
            describe=describe, flushed=flushed, resets=n_resets, extra_errors=errors + extra,
            spurious_extra=spurious_end, hold_violations=hold, status=st, timed_out=timed_out,
            cycles=self.cycle - c0, i_ready_low=iready_low,
            timing={"wall_s": time.perf_counter() - t0, "prep_s": prep_s, "loop_s": t_loop,
                    "cpu_s": cpu_loop},
            stalls={"gap_p": gap_p, "stall_p": stall_p, "burst_p": burst_p,
                    "burst_max": burst_max, "clear_p": clear_p, "isolate": isolate})

    def finish(self, rec: dict, extra_errors=()) -> dict:
        """Add test-level errors to a phase record, export the coverage database, log the
        record, append it to the results."""
        rec["errors"] = list(rec["errors"]) + list(extra_errors)
        rec["ok"] = rec["ok"] and not extra_errors
        if self.cov is not None:
            self.cov.export()
            # cumulative over the run: samples, cocotb-coverage seconds, hit-matrix seconds
            rec["coverage_samples"] = self.cov.samples
            rec["coverage_s"] = round(self.cov.seconds, 3)
            rec["coverage_hits_s"] = round(self.cov.hit_seconds, 3)
        self.job.record(rec)
        lat = rec["latency_min"], rec["latency_max"]
        cocotb.log.info(
            f"{rec['set']}: {rec['outputs']}/{rec['vectors']} vectors out, {rec['mismatches']} "
            f"mismatches, {rec['cycles']} cycles ({rec['cycles_per_vector'] or 0:.3f}/vector), "
            f"latency {lat}, {rec['vectors_per_s']:.0f} vectors/s"
            + (" OK" if rec["ok"] else " FAILED\n  " + "\n  ".join(rec["errors"])))
        return rec


class _SlowPort:
    """Stand-in with the GPI method names over the public ``.value`` API (used
    when writes cannot be trusted to apply at once)."""

    def __init__(self, h):
        self.h = h

    def set_signal_val_int(self, _action, v):
        self.h.value = v

    def set_signal_val_binstr(self, _action, s):
        self.h.value = int(s, 2)

    def get_signal_val_long(self):
        return int(self.h.value)

    def get_signal_val_binstr(self):
        return format(int(self.h.value), f"0{len(self.h)}b")




def assert_ok(recs) -> None:
    bad = [r for r in recs if not r["ok"]]
    assert not bad, "; ".join(f"{r['set']}: {r['mismatches']} mismatches, "
                              f"{len(r['errors'])} errors, first: {r['errors'][:1]}" for r in bad)


#: The coverage sampler of this simulator process (one config; kept across tests).
_SAMPLER = None


def sampler(job: Job):
    """The process's :class:`verif.coverage.Sampler` for ``job`` (None: no coverage file)."""
    global _SAMPLER
    if job.coverage and _SAMPLER is None:
        from .coverage import Sampler, model_of
        _SAMPLER = Sampler(job.config, model_of(job.config, job.params), job.coverage)
    return _SAMPLER


async def bench(dut, name: str) -> Bench:
    gc.enable()
    job = Job.load()
    b = Bench(dut, job, name)
    b.cov = sampler(job)
    await b.start()
    return b
