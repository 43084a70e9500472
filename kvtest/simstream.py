"""amaranth.sim stream helpers: put / get, and a random-stall stream run.

:func:`stream_put` / :func:`stream_get` move one payload through a stream
interface (directed tests). :func:`run_stream` drives a component with
``i`` / ``o`` streams (and optionally ``status`` / ``status_clear``) with random
input gaps, output stalls and clear pulses in one per-cycle testbench, checks the
stream rules every cycle, and returns what it recorded; the scoring is
:mod:`kvtest.streamcheck`.
"""

from __future__ import annotations

import random

from amaranth.hdl import Value
from amaranth.sim import Simulator

from .streamcheck import full_rate_errors, score, sticky_status


async def stream_put(ctx, stream, payload: int) -> None:
    """Present ``payload`` (an int) on ``stream`` until the handshake, then drop valid."""
    ctx.set(stream.valid, 1)
    ctx.set(Value.cast(stream.payload), payload)
    await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


async def stream_get(ctx, stream) -> int:
    """Raise ready until ``stream`` transfers a payload; returns it as an int."""
    ctx.set(stream.ready, 1)
    (payload,) = await ctx.tick().sample(Value.cast(stream.payload)).until(stream.valid)
    ctx.set(stream.ready, 0)
    return payload


def flow_cases(cases, credit, full: bool = False) -> list[tuple]:
    """pytest parameter rows ``(*case, flow)``: every case with flow ``"stall"``, and with
    ``"credit"`` the cases at the indices ``credit`` (every case when ``full``, HW_FULL=1).
    The credit flow's own logic (hw.pipeline.FlowControl, skid_fifo) does not depend on
    the format: its stream properties are proven (tests/test_formal.py) and ``make sim``
    streams two credit configs in full, so the quick set streams a few formats in it."""
    return ([(*c, "stall") for c in cases]
            + [(*c, "credit") for k, c in enumerate(cases) if full or k in credit])


def run_stream(dut, ins: list[int], seed: int = 1, *, p_valid: float = 0.8, p_ready: float = 0.7,
               p_clear: float | None = None, free_run_first: int = 12, flags_of=None,
               cfg: list[tuple[int, int]] | None = None) -> dict:
    """Stream ``ins`` (payload ints) through ``dut`` in amaranth.sim.

    The first ``free_run_first`` vectors go with i.valid and o.ready held high;
    then random gaps (``p_valid``), stalls (``p_ready``) and, when ``p_clear`` is
    given, ``status_clear`` pulses. Checked every cycle (assert): the flow control's
    ``i.ready`` rule (``dut.flow``: ``"stall"``, ``i.ready == o.ready | ~o.valid``;
    ``"credit"``, ``i.ready`` the same with ``o.ready`` inverted in the same cycle, i.e.
    not combinational from it, and at most ``dut.credits`` vectors in flight; a DUT of
    ``dut.beats`` = 2 beats per vector may also hold ``i.ready`` low, never high while
    stalled), payload
    and valid held while stalled, and, with
    ``p_clear``, ``status`` against :func:`kvtest.streamcheck.sticky_status` of
    ``flags_of(payload)`` (exact, one cycle after the handshake).
    ``cfg``: (input index, word) pairs for a ``cfg`` stream (the key front end's table
    port), in order: word j is offered (with random gaps) once ``index_j`` input vectors
    have been accepted, concurrently with the input stream.

    Returns:
        {"got": output ints, "in_cycles", "out_cycles", "cfg_cycles": handshake cycles,
        "stall_cycles", "clears", "latency": dut.latency_cycles, "interval": cycles per
        vector at full rate (``dut.beats``, 1 without)}.
    """
    rnd = random.Random(seed)
    lat = dut.latency_cycles
    credits = dut.credits if getattr(dut, "flow", "stall") == "credit" else None
    beats = getattr(dut, "beats", 1)
    ipay, opay = Value.cast(dut.i.payload), Value.cast(dut.o.payload)
    win = len(ipay)
    status = p_clear is not None
    got, in_cyc, out_cyc, cfg_cyc = [], [], [], []
    cfg = cfg or []
    cpay = Value.cast(dut.cfg.payload) if cfg else None
    stats = {"stall_cycles": 0, "clears": 0}

    async def tb(ctx):
        idx, cyc, held, status_model = 0, 0, None, 0
        while len(got) < len(ins) or len(cfg_cyc) < len(cfg):
            assert cyc < 40 * len(ins) + 100, "DUT stopped producing outputs"
            free = cyc < free_run_first * beats + lat   # phase 1: no stalls, no gaps
            if free:
                iv = idx < min(free_run_first, len(ins))
            else:
                iv = idx < len(ins) and rnd.random() < p_valid
            ordy = free or rnd.random() < p_ready
            clr = status and not free and rnd.random() < p_clear
            ctx.set(dut.i.valid, iv)
            ctx.set(ipay, ins[idx] if iv else rnd.getrandbits(win))
            ctx.set(dut.o.ready, ordy)
            j = len(cfg_cyc)
            cv = j < len(cfg) and idx >= cfg[j][0] and rnd.random() < p_valid
            if cfg:
                ctx.set(dut.cfg.valid, cv)
                ctx.set(cpay, cfg[j][1] if cv else 0)
                if cv and ctx.get(dut.cfg.ready):
                    cfg_cyc.append(cyc)
            if status:
                ctx.set(dut.status_clear, clr)
            ov = ctx.get(dut.o.valid)
            op = ctx.get(opay)
            ir = ctx.get(dut.i.ready)
            if status:
                assert ctx.get(dut.status) == status_model, f"status at cycle {cyc}"
            if credits is None and beats > 1:   # ready only while the pipeline moves
                assert not ir or ordy or not ov, f"i.ready at cycle {cyc}"
            elif credits is None:
                assert ir == (ordy or not ov), f"i.ready at cycle {cyc}"
            else:
                ctx.set(dut.o.ready, not ordy)
                assert ctx.get(dut.i.ready) == ir, \
                    f"i.ready depends combinationally on o.ready at cycle {cyc}"
                ctx.set(dut.o.ready, ordy)
                assert len(in_cyc) - len(got) <= credits, f"over {credits} in flight at cycle {cyc}"
            if held is not None:
                assert ov and op == held, f"output changed while stalled at cycle {cyc}"
            if iv and ir:
                in_cyc.append(cyc)
                idx += 1
            if ov and ordy:
                got.append(op)
                out_cyc.append(cyc)
            stats["stall_cycles"] += bool(ov and not ordy)
            stats["clears"] += clr
            held = op if ov and not ordy else None
            if status:
                status_model = sticky_status(status_model, clr, ov and ordy, flags_of(op))
            await ctx.tick()
            cyc += 1

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    return {"got": got, "in_cycles": in_cyc, "out_cycles": out_cyc, "cfg_cycles": cfg_cyc,
            "latency": lat, "interval": beats, **stats}


def check_run(run: dict, expected: list[int], free_run_first: int, describe=None) -> None:
    """Assert a :func:`run_stream` result: every word equal to ``expected`` in order
    (:func:`kvtest.streamcheck.score`), the exact latency and full rate over the
    first ``free_run_first`` vectors, and no word faster than the latency."""
    got = run["got"]
    assert len(got) == len(expected), f"{len(got)} outputs for {len(expected)} inputs"
    bad, _, errors = score(got, list(range(len(got))), expected, run["out_cycles"], describe)
    assert not bad, f"{len(bad)}/{len(expected)} vectors differ; first: {errors[0]}"
    errs = full_rate_errors(run["in_cycles"], run["out_cycles"], run["latency"], free_run_first,
                            run.get("interval", 1))
    assert not errs, errs[0]
    assert all(o - i >= run["latency"] for i, o in zip(run["in_cycles"], run["out_cycles"]))
