"""Test support shared by tests/, verif/ and bench/ (no hardware, no test cases).

Modules:
    inputs       input vector sets (directed, random, raw, real K/V, mixed) and the
                 golden encoder output words; built on sim_models.testvectors (the
                 pinned spec sets)
    levels       code values, levels and scale bytes of a format (plane building blocks)
    planes       decoder input planes (round trip, random, adversarial) and the golden
                 decoder output words
    ties         every tie generator and counter: encoder inputs on quantizer decision
                 points (RTL and GPU kernel sets), decoder outputs on rounding ties
    coverage     the functional coverage model of the RTL benches: bins, their
                 reachability (derived from the format), hits from the golden model,
                 the floor check, and the directed ``coverage`` sets
    gpu_cases    decode-attention cases and the float64 reference (needs CuPy)
    streamcheck  in-order scoreboard, latency, sticky-status reference model and the
                 phase record: pure functions, used by amaranth.sim tests and cocotb
    simstream    amaranth.sim stream driver / monitor (put / get helpers, random
                 gaps and stalls), scored by streamcheck

Payload layouts and packing are not here: they are sim_models.wire (NumPy) and
hw.wire (Amaranth).
"""
