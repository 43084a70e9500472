"""Stream-interface harness: a top level (``KVEncoder`` / ``KVDecoder``)
never drops, duplicates or reorders a vector and holds its output while stalled.

:class:`StreamHarness` drives the design under test A (its ``o.ready``,
``i.valid`` and ``i.payload`` free every cycle). With ``reference=True`` it adds
a reference copy B of the same design that is never stalled (``o.ready`` = 1)
and accepts exactly the vectors A accepts, in the same cycle (properties 2 and
5; two copies of the data path make this proof far larger). B is a plain delay line of ``latency``
cycles (asserted: B's ``o.valid`` is A's input handshake ``latency`` cycles
earlier), so B's k-th output is the design's function of A's k-th input.
A symbolic index k (a free input, assumed constant) selects one vector: the
harness stores B's k-th output and asserts that A's k-th output handshake
carries the same payload. Assertions (``Assert``, every cycle):

1. hold: if ``o.valid & ~o.ready`` in the previous cycle, ``o.valid`` is still
   high and ``o.payload`` unchanged;
2. order: A's k-th output equals B's k-th output (no drop, duplicate or reorder:
   any of these makes some k-th output another vector's, visible for some inputs);
3. count: A never emits more vectors than it accepted, and holds at most
   its capacity: ``latency`` vectors in stall flow, ``credits`` in credit flow
   (``hw.pipeline.FlowControl``);
4. drain / delay: if ``o.ready`` was high in each of the last W cycles (W =
   ``latency`` in stall flow; W = ``credits`` = latency + 2 in credit flow, where
   a backlog in the skid FIFO drains while new vectors arrive on time),
   ``o.valid`` equals the input handshake ``latency`` cycles earlier and every
   vector accepted before then has been emitted (nothing lost or held back;
   asserted only without extra credits, ``credit_extra`` = 0, since extra credits
   allow a lasting backlog at full rate);
5. B's ``o.valid`` equals A's input handshake ``latency`` cycles earlier, and A
   never emits more vectors than B.

Without the reference copy (1, 3, 4) the vectors are counted, not identified: a
stage register that advances during a stall (dropping one vector and repeating
the next) keeps the counts and is caught only by property 2.

Checked by bounded model checking (:func:`verif.formal.prove.prove_bmc`) from
reset; ``rst`` is assumed low (reset in mid-stream is covered by ``make sim``).
"""

from __future__ import annotations

from amaranth.hdl import Assert, Assume, Cat, Module, ResetSignal, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In


class StreamHarness(wiring.Component):
    """See module docstring.

    Args:
        make_dut: a callable returning a fresh design (``i``/``o`` streams,
            ``latency_cycles``); called twice (A and B).
        mutate: optional callable ``(m, dut) -> (o_valid, o_payload, i_ready_hs)``
            for mutation tests: replaces what the harness sees of A's output.
        count_width: width of the vector counters (>= log2 of the BMC depth + 1).
        reference: add the reference copy B (properties 2 and 5).
    """

    def __init__(self, make_dut, mutate=None, count_width: int = 5, reference: bool = True):
        self.a = make_dut()
        self.b = make_dut() if reference else None
        self.mutate = mutate
        self.latency = self.a.latency_cycles
        credits = getattr(self.a, "credits", None)
        #: most vectors the design holds; cycles of o.ready after which it has no backlog
        self.capacity = credits or self.latency
        self.drain = credits or self.latency
        #: extra credits make a lasting backlog possible (the delay property needs none)
        self.check_delay = getattr(self.a, "credit_extra", 0) == 0
        self.count_width = count_width
        super().__init__({
            "i_valid": In(1),
            "i_payload": In(len(Value.cast(self.a.i.payload))),    # all payload bits
            "o_ready": In(1),
            "k": In(count_width),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.a = a = self.a
        b = self.b
        lat, cw = self.latency, self.count_width
        m.d.comb += Assume(~ResetSignal())
        m.d.comb += [a.i.valid.eq(self.i_valid), a.i.payload.eq(self.i_payload),
                     a.o.ready.eq(self.o_ready)]
        o_valid, o_payload = a.o.valid, Value.cast(a.o.payload)
        if self.mutate is not None:
            o_valid, o_payload = self.mutate(m, a, self.o_ready)
        in_hs = a.i.valid & a.i.ready
        out_hs = o_valid & self.o_ready
        if b is not None:
            m.submodules.b = b
            m.d.comb += [b.i.valid.eq(in_hs), b.i.payload.eq(self.i_payload), b.o.ready.eq(1)]

        # k is a constant chosen by the solver
        k_q = Signal(cw)
        started = Signal()
        m.d.sync += [k_q.eq(self.k), started.eq(1)]
        m.d.comb += Assume(~started | (self.k == k_q))

        n_in, n_a = Signal(cw), Signal(cw)
        with m.If(in_hs):
            m.d.sync += n_in.eq(n_in + 1)
        with m.If(out_hs):
            m.d.sync += n_a.eq(n_a + 1)
        # counters never wrap within the checked depth
        m.d.comb += Assume(n_in != (1 << cw) - 1)
        # history of the last `lat` cycles: o.ready and the input handshake ([0] = previous cycle)
        cap, win = self.capacity, self.drain
        ready_hist, hs_hist = Signal(win), Signal(lat)
        m.d.sync += [ready_hist.eq(Cat(self.o_ready, ready_hist[:-1])),
                     hs_hist.eq(Cat(in_hs, hs_hist[:-1]))]
        recent = Signal(cw)
        m.d.comb += recent.eq(sum(hs_hist[j] for j in range(lat)))

        # 1. hold while stalled
        stalled, prev = Signal(), Signal.like(o_payload)
        m.d.sync += [stalled.eq(o_valid & ~self.o_ready), prev.eq(o_payload)]
        with m.If(stalled):
            m.d.comb += Assert(o_valid & (o_payload == prev))

        # 3. count: nothing emitted that was not accepted; at most `cap` in flight
        m.d.comb += Assert((n_a <= n_in) & (n_in - n_a <= cap))

        # 4. drain / delay: o.ready high in each of the last `win` cycles -> the output is
        # exactly the input handshake `lat` cycles ago and every older vector has left
        if self.check_delay:
            with m.If(ready_hist.all()):
                m.d.comb += Assert((o_valid == hs_hist[lat - 1]) & (n_a == n_in - recent))

        if b is None:
            return m
        # 5. B is a delay line of `lat` cycles
        m.d.comb += Assert(b.o.valid == hs_hist[lat - 1])
        n_b = Signal(cw)
        with m.If(b.o.valid):
            m.d.sync += n_b.eq(n_b + 1)
        m.d.comb += Assert(n_a <= n_b)

        # 2. order: A's k-th output == B's k-th output
        ref, have = Signal.like(o_payload), Signal()
        with m.If(b.o.valid & (n_b == self.k)):
            m.d.sync += [ref.eq(Value.cast(b.o.payload)), have.eq(1)]
        with m.If(out_hs & (n_a == self.k)):
            m.d.comb += Assert((have & (o_payload == ref))
                               | (b.o.valid & (n_b == self.k)
                                  & (o_payload == Value.cast(b.o.payload))))
        return m
