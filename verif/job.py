"""``Job``: what one cocotb run of a testbench does (vector sets, stalls, seed, DUT facts).

Built by the caller (verif/sim.py, the pytest files), completed by
:func:`verif.run.run` with the DUT facts (params, latency, harness layout), written as
JSON into the run folder and read inside the simulator (``Job.load``, from the file
named by ``KVTB_JOB``). Each phase of the testbench appends a record to ``results``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from sim_models import FormatParams

#: Environment variable naming the job file inside the simulator.
JOB_ENV = "KVTB_JOB"


@dataclass
class Job:
    """Settings of one testbench run.

    DUT facts (filled in by :func:`verif.run.run` from the configuration and manifest):
        params: format parameters. config: configuration name.
        latency: cycles from input to output handshake without stalls (manifest
            ``latency_cycles``; the round trip's whole latency).
        latency_dec: the decoder's latency in cycles (round trip only).
        interval: cycles per vector at full load (1; 2 for two beats per vector, the
            manifest's ``throughput_vectors_per_cycle`` = 1/2).
        harness: bit layout of the harness control vectors (verif.harness.harness_layout).
        model: reference model name.
    Stimulus:
        seed: vectors and stall patterns. sets: the vector sets ``test_stream`` streams
            (dicts; their keys depend on the testbench: name, count, seed, label, mode,
            stalls). fixture: path of the real K/V capture.
        gap_p / stall_p: per-cycle probability of an i__valid gap / o__ready stall;
        burst_p: per-cycle probability that a long gap / stall burst starts, its length
            uniform in [8, burst_max] cycles; clear_p: status_clear pulse (DUTs with status).
        latency_vectors, throughput_vectors, reset_vectors: vectors of those phases;
            resets: mid-stream resets in the reset phase.
        fault_every: scoreboard self-test, corrupt every k-th expected word (0: off).
        results: JSON file the phases append their records to (None: not recorded).
        coverage: YAML file the functional coverage database is exported to after each
            phase (verif/coverage.py; None: coverage not sampled).
    """

    params: FormatParams = field(default_factory=FormatParams)
    config: str = ""
    latency: int = 0
    latency_dec: int | None = None
    interval: int = 1
    harness: dict = field(default_factory=dict)
    model: str = "golden"
    seed: int = 1
    sets: list = field(default_factory=list)
    fixture: str | None = None
    gap_p: float = 0.2
    stall_p: float = 0.3
    burst_p: float = 0.002
    burst_max: int = 200
    clear_p: float = 0.002
    latency_vectors: int = 16
    throughput_vectors: int = 1000
    reset_vectors: int = 3000
    resets: int = 12
    fault_every: int = 0
    results: str | None = None
    coverage: str | None = None

    def stalls(self) -> dict:
        """The stall settings as keyword arguments of ``Bench.stream``."""
        return {k: getattr(self, k) for k in ("gap_p", "stall_p", "burst_p", "burst_max", "clear_p")}

    def to_json(self) -> str:
        d = asdict(self)
        d["params"] = self.params.to_dict()
        return json.dumps(d, indent=1, default=str)

    @classmethod
    def from_json(cls, text: str) -> "Job":
        """Raises ValueError naming keys that are not Job fields."""
        d = json.loads(text)
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"job: unknown keys {unknown}")
        if "params" in d:
            d["params"] = FormatParams.from_dict(d["params"])
        return cls(**d)

    @classmethod
    def load(cls) -> "Job":
        """The job of this simulation (file named by ``KVTB_JOB``; defaults without it)."""
        path = os.environ.get(JOB_ENV)
        return cls.from_json(Path(path).read_text()) if path else cls()

    def record(self, rec: dict) -> None:
        """Append one phase record to ``results`` (if set)."""
        if not self.results:
            return
        p = Path(self.results)
        recs = json.loads(p.read_text()) if p.exists() else []
        recs.append(rec)
        p.write_text(json.dumps(recs, indent=1))
