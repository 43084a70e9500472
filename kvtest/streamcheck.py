"""Stream checker: in-order scoreboard, latency, sticky-status reference model, phase record.

Pure functions over what a stream run recorded (no simulator), shared by the
amaranth.sim tests (:mod:`kvtest.simstream`) and the cocotb bench
(``verif/stream.py``), in the roles of cocotb's matrix_multiplier example
(model, in-order checker) while the drivers stay single per-cycle loops:

* :func:`score`: every output word against the expected word of the input it
  belongs to, in order (loss, duplication and reordering show as mismatches,
  spurious words or missing outputs);
* :func:`latencies`, :func:`full_rate_errors`: cycles from input to output
  handshake; the no-stall contract (one word per cycle, fixed latency);
* :func:`sticky_status` (the reference model of the ``status`` register) and
  :class:`StatusChecker` (its bounds when status is sampled through a harness);
* :func:`phase_record`: the record of one streamed phase (verif's results JSON);
* :func:`describe_encoder_word`: a readable diff of two encoder output words.
"""

from __future__ import annotations

import numpy as np

from sim_models import wire
from sim_models.pack import unpack_codes
from sim_models.params import FormatParams

#: Error messages kept per phase (the counts are always complete).
MAX_ERRORS_KEPT = 10


def sticky_status(status: int, clear: bool, fire: bool, flags: int) -> int:
    """Next ``status``: ``(clear ? 0 : status) | (fire ? flags : 0)`` (``fire``: the
    output handshake of this cycle; a word accepted with a clear still counts)."""
    return (0 if clear else status) | (flags if fire else 0)


def score(out_words: list, out_index: list[int], expected: list, out_cycles: list[int] | None = None,
          describe=None) -> tuple[list[int], int, list[str]]:
    """In-order scoreboard.

    Args:
        out_words: the output words, in handshake order (ints or binary strings).
        out_index: the input index each output belongs to (-1: none outstanding).
        expected: the expected word of every input, same type as ``out_words``.
        out_cycles: handshake cycle of each output (messages only).
        describe: (got, expected) -> text for a mismatch message.

    Returns:
        (indices j of bad outputs, spurious outputs, error messages, at most
        :data:`MAX_ERRORS_KEPT`).
    """
    bad = [j for j, (w, i) in enumerate(zip(out_words, out_index)) if i < 0 or w != expected[i]]
    errors = []
    for j in bad[:MAX_ERRORS_KEPT]:
        i = out_index[j]
        at = f"cycle {out_cycles[j]}: " if out_cycles is not None else ""
        if i < 0:
            errors.append(f"{at}output with no input outstanding (duplicate or spurious word)")
            continue
        hint = ""
        if i + 1 < len(expected) and out_words[j] == expected[i + 1]:
            hint = " [equals the NEXT expected word: lost vector?]"
        elif i > 0 and out_words[j] == expected[i - 1]:
            hint = " [equals the PREVIOUS expected word: duplicate?]"
        what = describe(out_words[j], expected[i]) if describe else \
            f"got {out_words[j]!r} exp {expected[i]!r}"
        errors.append(f"{at}vector {i}: {what}{hint}")
    return bad, sum(1 for i in out_index if i < 0), errors


def latencies(acc_cycles: list[int], out_cycles: list[int], out_index: list[int]) -> np.ndarray:
    """int64 [outputs with an input]: output handshake cycle - input handshake cycle."""
    oi = np.asarray(out_index, dtype=np.int64)
    ok = oi >= 0
    if not ok.any():
        return np.zeros(0, np.int64)
    return np.asarray(out_cycles, dtype=np.int64)[ok] - np.asarray(acc_cycles, dtype=np.int64)[oi[ok]]


def full_rate_errors(acc_cycles: list[int], out_cycles: list[int], latency: int,
                     count: int | None = None, interval: int = 1) -> list[str]:
    """The no-stall contract over the first ``count`` vectors (all: None): each
    output exactly ``latency`` cycles after its input, inputs and outputs
    ``interval`` cycles apart (1: consecutive cycles; 2: a top level of two beats
    per vector)."""
    k = len(out_cycles) if count is None else min(count, len(out_cycles))
    errs = []
    for i in range(k):
        if out_cycles[i] - acc_cycles[i] != latency:
            errs.append(f"latency of vector {i}: {out_cycles[i] - acc_cycles[i]}, expected {latency}")
        elif i and not (acc_cycles[i] == acc_cycles[i - 1] + interval
                        and out_cycles[i] == out_cycles[i - 1] + interval):
            errs.append(f"vector {i}: not one vector per {interval} cycle(s) at full rate")
    return errs


def full_rate_record_errors(rec: dict, latency: int, interval: int = 1) -> list[str]:
    """Checks of a phase streamed with valid and ready always high: i__ready never
    low (``interval`` = 1), one vector per ``interval`` cycles (2: a DUT of two beats
    per vector, whose i__ready is low while beat 0 is on), every word with the same
    latency == ``latency``."""
    errs = []
    if rec["i_ready_low_cycles"] and interval == 1:
        errs.append(f"i__ready low in {rec['i_ready_low_cycles']} cycles with o__ready always 1")
    n, span = rec["outputs"], rec["output_span_cycles"]
    if not n or span != interval * (n - 1) + 1:    # one output every ``interval`` cycles
        errs.append(f"{n} outputs over {span} cycles at full load, expected one every "
                    f"{interval} cycle(s)")
    if not (rec["latency_min"] == rec["latency_max"] == latency):
        errs.append(f"latency {rec['latency_min']}..{rec['latency_max']} under full load, "
                    f"manifest {latency}")
    rec["throughput_vectors_per_cycle"] = ((n - 1) / (span - 1) if n > 1 else 0.0)
    return errs


class StatusChecker:
    """``status`` == OR of the flags of the words transferred since reset / clear
    (:func:`sticky_status`), checked on samples taken through a harness.

    Fed after the run with the recorded samples, in cycle order. The status seen
    in cycle c (captured at edge c) must contain the flags of every word
    transferred at edges <= c-2 (one cycle of registering allowed) and nothing
    beyond the flags of words transferred at edges <= c-1 or of the word
    presented now. A word transferred at the same edge as a clear may or may
    not be counted. The two cycles after a clear / reset are not checked; when
    idle (the final check), status must equal the OR exactly.
    """

    def __init__(self, errors: list, status_init: int = 0):
        self.errors = errors
        self.lo = self.hi = status_init
        self.amb = 0
        self.pending: list = []
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
            self.lo |= self.pending.pop(0)[1]
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

    def replay(self, hist: list[int], c0: int, *, status_pos: int, flags_pos: int,
               out_valid: int, out_fire: int, rst: int, clear: int) -> None:
        """Run the checks over recorded cycles: ``hist[j]`` is the sample of edge
        c0+1+j, with status and the presented word's flags (3 bits each) at
        ``status_pos`` / ``flags_pos`` and the masks ``out_valid``, ``out_fire``
        (output handshake), ``rst`` and ``clear`` (the inputs driven for that edge)."""
        for j, h in enumerate(hist):
            c = c0 + 1 + j
            if h & rst:
                self.cleared(c)
                continue
            ov = h & out_valid
            if not h & clear:
                self.check((h >> status_pos) & 7, c, (h >> flags_pos) & 7 if ov else 0)
            f = (h >> flags_pos) & 7 if (ov and h & out_fire) else 0
            self.transfer(c, f)
            if h & clear:
                self.cleared(c, f)


def phase_record(*, test: str, label: str, vectors: int, accepted: int, out_words: list,
                 out_index: list[int], out_cycles: list[int], acc_cycles: list[int],
                 expected: list, describe=None, flushed: int = 0, resets: int = 0,
                 extra_errors: list[str] = (), spurious_extra: int = 0, hold_violations: int = 0,
                 status: StatusChecker | None = None, timed_out: bool = False, cycles: int = 0,
                 i_ready_low: int = 0, timing: dict | None = None, stalls: dict | None = None) -> dict:
    """The record of one streamed phase (verif's results JSON): scoreboard
    (:func:`score`), latency, status (a replayed :class:`StatusChecker`), rates.

    ``extra_errors`` / ``spurious_extra``: what the driver saw beyond the output
    words (a hang, o.valid with nothing outstanding at the end, hold breaks);
    ``timing``: {"wall_s", "prep_s", "loop_s", "cpu_s"} of the run.
    """
    errors = list(extra_errors)
    bad, spurious, errs = score(out_words, out_index, expected, out_cycles, describe)
    errors[:0] = errs
    spurious += spurious_extra
    n_bad = len(bad) + spurious_extra
    lat = latencies(acc_cycles, out_cycles, out_index)
    n_out = sum(1 for i in out_index if i >= 0)
    span = (out_cycles[-1] - out_cycles[0] + 1) if out_cycles else 0
    t = {"wall_s": 0.0, "prep_s": 0.0, "loop_s": 0.0, "cpu_s": 0.0, **(timing or {})}
    wall, prep = t["wall_s"], t["prep_s"]
    lost = accepted - flushed - n_out
    if status is not None:
        errors += status.errors
    rec = {
        "test": test, "set": label, "vectors": vectors,
        "accepted": accepted, "outputs": n_out, "flushed_by_reset": flushed,
        "resets": resets, "mismatches": n_bad, "spurious": spurious,
        "hold_violations": hold_violations,
        "status_violations": status.violations if status else 0,
        "status_checks": status.checks if status else 0, "lost": lost, "timed_out": timed_out,
        "cycles": cycles, "output_span_cycles": span,
        "cycles_per_vector": cycles / n_out if n_out else None,
        "span_cycles_per_vector": span / n_out if n_out else None,
        "latency_min": int(lat.min()) if lat.size else None,
        "latency_max": int(lat.max()) if lat.size else None,
        "i_ready_low_cycles": i_ready_low,
        "wall_s": wall + prep, "prep_s": prep, "loop_s": t["loop_s"],
        "vectors_per_s": n_out / max(wall, 1e-9),
        "vectors_per_s_with_prep": n_out / max(wall + prep, 1e-9),
        "cycles_per_s": cycles / max(t["loop_s"], 1e-9),
        # per CPU second of the simulator process: less sensitive to other load
        "vectors_per_cpu_s": n_out / max(t["cpu_s"], 1e-9),
        "stalls": stalls or {},
        "errors": errors,
    }
    rec["ok"] = (not n_bad and not hold_violations and not (status and status.violations)
                 and not timed_out and lost == 0 and accepted == vectors and not errors)
    rec["status_end"] = status.hi if status else None
    return rec


def describe_encoder_word(got: int, exp: int, p: FormatParams) -> str:
    """Short human-readable diff of two encoder output words (:func:`sim_models.wire.encoder_output`)."""
    lay = wire.encoder_output(p)
    g, e = lay.unpack(got), lay.unpack(exp)
    gz, ez = (lay.elements(got, "zeros"), lay.elements(exp, "zeros")) if "zeros" in lay else ([], [])
    gs, es = lay.elements(got, "scales"), lay.elements(exp, "scales")
    parts = []
    if g["flags"] != e["flags"]:
        parts.append(f"flags got {g['flags']:03b} exp {e['flags']:03b}")
    sd = [j for j in range(p.n_blocks) if gs[j] != es[j]]
    if sd:
        parts.append("scales differ in blocks " + ", ".join(
            f"{j}: got 0x{gs[j]:02x} exp 0x{es[j]:02x}" for j in sd[:4]))
    zd = [j for j in range(len(ez)) if gz[j] != ez[j]]
    if zd:
        parts.append("zero points differ in blocks " + ", ".join(
            f"{j}: got {gz[j]} exp {ez[j]}" for j in zd[:4]))
    if g["codes"] != e["codes"]:
        sg = p.mode != "asym"
        cb = p.code_bytes
        gc = unpack_codes(np.frombuffer(g["codes"].to_bytes(cb, "little"), np.uint8)[None],
                          p.n, p.bits, sg)[0]
        ec = unpack_codes(np.frombuffer(e["codes"].to_bytes(cb, "little"), np.uint8)[None],
                          p.n, p.bits, sg)[0]
        lanes = np.flatnonzero(gc != ec)
        parts.append(f"codes differ in {lanes.size} lanes (first: " + ", ".join(
            f"lane {int(k)} got {int(gc[k])} exp {int(ec[k])}" for k in lanes[:6]) + ")")
    return "; ".join(parts) or "identical"
