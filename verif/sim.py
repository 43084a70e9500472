"""``python -m verif.sim``: simulate the RTL against the golden model (``make sim``).

``--set default`` (``make sim``): a few configs that together cover every RTL module, flow
and feature (:data:`FEATURES`, every quantizer mode the RTL implements); ``--set quick``
(``make test``, CI), ``--set full`` (``make sim-full``), ``--set all``; ``--configs`` names
configs instead; ``--list`` prints them. Vectors per set: :data:`SIZES`.

For each configuration: generate the Verilog (rtl_gen) and the bench harness
into build/rtl/<config>/, build it with Verilator (cached in
build/sim/<config>/) (verif/build.py), and run its cocotb testbench (verif/run.py).

Configurations are named in the grammar of rtl_gen/config.py:
``<kind>_<preset>_nN_gG_bB_lL[_change...]``, e.g. ``enc_v2_n128_g64_b3_l2`` (the
write path, format-version-2 quantizer, FWHT pipeline registers L) or
``rt_v1_n64_g64_b3_l2`` (round trip, version-1 quantizer).

Encoder configs ``enc_...`` (verif/tb_encoder.py, kv_encoder vs
sim_models.encode, every output word bit-exact: codes, scales, flags):

* latency      isolated vectors, no stalls: measured == manifest latency_cycles
* throughput   valid and ready always high: 1 vector / cycle (two beats per vector,
               ``w<N/2>``: 1 vector / 2 cycles)
* random       sim_models.testvectors.random_vectors (:data:`SIZES`: 10,000 per config in
               the full set, 4,000 default, 1,000 quick)
* adversarial  the whole sim_models.testvectors.adversarial_vectors set: zeros,
               +-0, fp16 max / full-scale, subnormals, single spikes, Hadamard rows
               times D at full scale (worst-case FWHT bit growth), NaN / inf,
               threshold ties
* long_stalls  random vectors under long random stall / gap patterns
               (bursts of up to 1,000 cycles, P(gap) = P(stall) = 0.5)
* real         the SmolLM2-135M K/V capture verif/data/smollm2_kv.npz
               (N=64: every head vector; N=128: heads concatenated; default set 4,000,
               quick 2,000)
* raw          (bf16) uniformly random bit patterns: FLAG_SAT, NaN, inf
* keyfront     (key-front-end configs ``..._k<T>``) the pinned key-front-end set
               (sim_models.testvectors.key_front_set, 2,048 + directed; quick 256)
               while every table slot is reloaded mid-stream; every other set runs with
               a random slot / bypass side band through the tables loaded at the start
               of each test (verif/tb_encoder.py)
* reset        mid-stream resets with words in flight
* status       scripted status / status_clear checks

Round-trip configs ``rt_...`` (verif/tb_roundtrip.py, kv_encoder ->
kv_decoder vs sim_models.decode(encode(x)), plus arbitrary code/scale
planes fed to the decoder directly vs sim_models.decode).

Quantizer modes: every non-default value of a field the RTL implements
(hw.encoder.ENCODER_SUPPORT for the write path, hw.dequant.READ_SUPPORT for
the read path: round-trip configs for combinations both paths implement)
is covered by a config. The values of different fields are combined (config k has
the k-th value of every field, e.g. midtread + e4m3fn + absmean + up). The default set
runs combination k through both modules on its k-th base (:func:`default_mode_configs`);
the full set adds every combination on the encoder at N=64, G=32, b=3 and the round trip
of the first (:func:`mode_configs`); ``--set all`` adds the round trips of the other
combinations, one config per value and the combinations on b = 2 and 4. Adding a mode
to the RTL adds it here.

The streaming sets run with random valid gaps, o__ready stalls, long stall
bursts and status_clear pulses. Prints a summary table (with simulated
vectors per wall-clock second of the streaming loop and per CPU second of the
simulator process, the latter less sensitive to other load on the machine) and writes it as JSON to build/sim_summary.json; exits 1 on any
mismatch or error. A failing test is rerun with FST tracing: the waveform's
path is printed (build/waves/<config>/...; KV_WAVES=0 turns this off).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import sys
import threading
import time
import traceback
from pathlib import Path

from kvtest.inputs import FIXTURE
from sim_models import FormatParams

from rtl_gen.config import RTLConfig, print_names

from kvtest.coverage import FLOORS, LONG_BURSTS, evaluate

from .build import BUILD, build, generate, sim_config
from .coverage import model_of, read_hits
from .coverage import table as coverage_table
from .job import Job
from .run import run

#: ``--set default`` (``make sim``): every RTL module, flow and feature at least once
#: (:data:`FEATURES`; tests/test_verif_cli.py checks that the set covers each), in few configs
#: because each costs a Verilator build (the C++ compile dominates a run on 2 cores):
#: the N = 128 encoder that ``rtl_gen.synth`` places and routes (its fmax set: two beats per
#: vector ``w64``, register profile ``p1``, credit flow ``c0``) behind the key front end
#: (``k8``, 64 lanes wide; its tables reloaded mid-stream); the decoder as synthesised,
#: through the round trip (``p0``, credit flow, two beats, block alignment in the fold ``fa``,
#: reset through register copies ``rc``); the key front end (``k3``: a slot value >= T exists;
#: its tables reloaded mid-stream) with every register cut (``p2``), lane delay lines in block
#: RAM (``r3``: the quantizer's; the folded key front end keeps its lanes in registers),
#: one-beat credit flow and two blocks; then the quantizer modes
#: (:func:`default_mode_configs`: combination k of the modes the RTL implements on
#: :data:`DEFAULT_MODE_BASES` [k], round trips where the read path has the combination).
DEFAULT_CONFIGS = ("enc_v2_n128_g64_b3_l6_p1_k8_c0_w64", "rt_v2_n128_g64_b3_l6_p0_c0_w64_fa_rc",
                   "enc_v2_n64_g32_b3_l6_p2_k3_r3_c0")
#: Bases of the default set's quantizer-mode configs (cycled): N = 256 in two beats with bf16
#: input, code bits 4 and 2, a block of N (G = N) and two blocks, FWHT latency 1 and 2 (each
#: base's combination reaches every coverage bin with the default set's vectors).
DEFAULT_MODE_BASES = ("rt_v2_n256_g64_b3_l2_w128_bf16", "rt_v2_n64_g64_b4_l1",
                      "rt_v2_n64_g32_b2_l2")
#: Every feature the default set covers (:func:`features` of its configs).
FEATURES = ("kind=encoder", "kind=roundtrip", "n=64", "n=128", "n=256", "g<n", "g=n",
            "bits=2", "bits=3", "bits=4", "lanes", "pipe=0", "pipe=1", "pipe=2", "key_slots",
            "lane_ram", "credit", "credit+lanes", "fold_align", "reset_copies",
            "dtype=bf16", "dtype=fp16")

#: ``--set full`` (``make sim-full``): the wider list. Encoder configs: N = 64 / 128 / 256;
#: b = 2 / 3 / 4; FWHT latency 1, 2 and log2 N (N = 64 and
#: 256); bf16 input (the only way to reach FLAG_SAT); the N = 128 Fmax register
#: profile (``p2``); the key front end of the cache policy (``kT``:
#: T = 3 slots, so a slot value >= T exists, with the default cuts; T = 8 in the N = 64
#: Fmax profile, every cut); credit-based flow control (``c0``: the pipeline never stalls,
#: output skid FIFO, registered i__ready) on the N = 64 Fmax profile; two beats per vector
#: (``w64``: 64 lanes per cycle) on the N = 128 encoder that ``rtl_gen.synth`` places and
#: routes (``p1``, its fmax set; every encoder of that set is here by name).
#: Quantizer modes are added by mode_configs().
FULL_CONFIGS = ("enc_v2_n128_g64_b3_l2", "enc_v2_n64_g64_b2_l6", "enc_v2_n64_g32_b4_l1",
                "enc_v2_n256_g64_b3_l8", "enc_v2_n64_g64_b3_l2_bf16",
                "enc_v2_n128_g64_b3_l7_p2", "enc_v2_n64_g32_b3_l2_k3",
                "enc_v2_n64_g64_b3_l6_p1_k8", "enc_v2_n64_g64_b3_l6_p1_c0",
                "enc_v2_n128_g64_b3_l6_p1_c0_w64")
#: Round-trip configs of the full set: the default, N = 64, G = 32, b = 2 at log2 N, and
#: the format-version-1 quantizer (mid-tread, scale rounded up) through both modules;
#: the Fmax register profiles (``pK``: every register cut, a register every K tree
#: levels) through both modules, at N = 64 with two blocks (block alignment); both modules
#: with credit flow control (``c0``), the encoder's skid FIFO feeding the decoder's credits;
#: both modules with two beats per vector (``w64``) at N = 128, the decoder as synthesised
#: (``p0``: every float cut, split alignment; credit flow), the same with the
#: decoder's block alignment in the fold (``fa``) and with its reset through register
#: copies (``fa_rc``).
FULL_RT_CONFIGS = ("rt_v2_n128_g64_b3_l2", "rt_v2_n64_g32_b2_l6", "rt_v1_n64_g64_b3_l2",
                   "rt_v2_n64_g32_b3_l6_p1", "rt_v2_n64_g32_b3_l6_p2", "rt_v2_n64_g32_b3_l2_c0",
                   "rt_v2_n128_g64_b3_l6_p0_c0_w64", "rt_v2_n128_g64_b3_l6_p0_c0_w64_fa",
                   "rt_v2_n128_g64_b3_l6_p0_c0_w64_fa_rc")
#: ``--set quick`` (make test, CI): the two N of the real K/V fixture (N=64 with the
#: first mode combination the RTL implements, see quick_configs()), one small
#: round trip with block alignment (N/G = 2), and the same round trip with two beats per
#: vector (``w32``), with the decoder's block alignment in the fold (``w32_fa``), and
#: that with credit flow and the decoder's reset through register copies (``c0_w32_fa_rc``).
QUICK_CONFIGS = ("enc_v2_n128_g64_b3_l2", "enc_v2_n64_g64_b3_l2", "rt_v2_n64_g32_b3_l2",
                 "rt_v2_n64_g32_b3_l2_w32", "rt_v2_n64_g32_b3_l2_w32_fa",
                 "rt_v2_n64_g32_b3_l2_c0_w32_fa_rc")
#: Added by ``--set all`` (with the quick set's): the Fmax profiles p1 (N = 64) and p2 (N = 128 round
#: trip; N = 128 encoder with its lane delay lines in block RAM, ``_r3``; the N = 128
#: encoder in two beats with a register every two tree levels), G = 32, FWHT
#: latency 0, the remaining N / b / latency pairs, bf16 at N = 128, more round trips.
EXTRA_CONFIGS = ("enc_v2_n64_g64_b3_l6_p1", "rt_v2_n128_g64_b3_l7_p2", "enc_v2_n128_g64_b3_l7_p2_r3",
                 "enc_v2_n128_g64_b3_l6_p2_c0_w64",
                 "enc_v2_n128_g64_b2_l7", "enc_v2_n128_g32_b3_l2", "enc_v2_n64_g64_b3_l0",
                 "enc_v2_n64_g64_b3_l2", "enc_v2_n256_g64_b3_l1", "enc_v2_n128_g64_b4_l1",
                 "enc_v2_n128_g64_b3_l2_bf16", "rt_v2_n256_g64_b4_l1",
                 "rt_v2_n64_g64_b4_l0", "rt_v2_n128_g64_b2_l7", "rt_v2_n128_g64_b4_l1",
                 "rt_v2_n256_g64_b2_l8", "rt_v2_n256_g64_b3_l2", "rt_v2_n128_g64_b3_l2_bf16")
#: N for which the real fixture supplies vectors.
REAL_NS = (64, 128)
#: FormatParams fields whose RTL-supported values get a config each.
MODE_FIELDS = ("mode", "scale", "scale_rule", "scale_round")


#: Bases of the quantizer-mode configs: the default set / added by the ``all`` set.
MODE_BASES = ("enc_v2_n64_g32_b3_l2",)
MODE_BASES_ALL = ("enc_v2_n64_g32_b2_l1", "enc_v2_n64_g32_b4_l6")


def mode_values() -> tuple[dict, dict]:
    """Non-default values the RTL implements per field of MODE_FIELDS: (write path
    ``hw.encoder.ENCODER_SUPPORT``, read path ``hw.dequant.READ_SUPPORT``
    (fields it does not list: every value the write path has))."""
    from hw.dequant import READ_SUPPORT as read
    from hw.encoder import ENCODER_SUPPORT as epi
    default = FormatParams()
    w = {f: [v for v in epi.get(f, ()) if v != getattr(default, f)] for f in MODE_FIELDS}
    r = {f: [v for v in (read[f] if f in read else w[f]) if v != getattr(default, f)]
         for f in MODE_FIELDS}
    return w, r


def mode_configs(bases=MODE_BASES, combine: bool = True, rt_limit: int | None = 1) -> list[str]:
    """Configs that cover every non-default quantizer mode / scale encoding / scale
    rule / rounding the RTL implements (:func:`mode_values`), on each base.

    ``combine``: config k takes the k-th value of every field at once (e.g.
    midrise + e4m3fn + nearest), so max(values per field) configs cover all
    values; a combination FormatParams refuses is split into one config per
    value. Otherwise one config per value. A round-trip config is added for a
    combination the read path implements too (at most ``rt_limit`` per base;
    None: all), first combination first.
    """
    epi, dec = mode_values()
    out = []
    for base in bases:
        b = sim_config(base)
        n_rt = 0
        if combine:
            groups = mode_groups()
        else:
            groups = [{f: v} for f, vs in epi.items() for v in vs]
        for g in groups:
            try:
                ps = [dataclasses.replace(b.params, **g)]
            except (ValueError, TypeError):
                ps = [dataclasses.replace(b.params, **{f: v}) for f, v in g.items()]
            for p in ps:
                out.append(RTLConfig.of("encoder", p, b.fwht_regs).name)
                if (rt_limit is None or n_rt < rt_limit) and all(
                        getattr(p, f) in dec[f] or getattr(p, f) == getattr(FormatParams(), f)
                        for f in MODE_FIELDS):
                    out.append(RTLConfig.of("roundtrip", p, b.fwht_regs).name)
                    n_rt += 1
    return list(dict.fromkeys(out))


@dataclasses.dataclass(frozen=True)
class Sizing:
    """Vectors of each streamed set in one kind of run (``--set``); None: the whole set.

    Attributes:
        random / rt_random: random vectors of an encoder / of each round-trip mode (through
            both modules, and fed to the decoder directly); ``--random`` overrides both.
        real / rt_real: vectors of the real K/V capture (encoder / round trip).
        keyfront: vectors of the key-front-end set (configs ``..._k<T>``).
        reset / rt_reset: vectors of the mid-stream reset phase; rt_throughput: of the
            round trip's full-load phase.
        long_stalls: stream the long-stall set (bursts of up to 1,000 cycles) and the
            directed coverage set; floor: the coverage floor (``kvtest.coverage.FLOORS`` key).
    """

    random: int
    rt_random: int
    real: int | None
    rt_real: int | None
    keyfront: int
    reset: int
    rt_reset: int
    rt_throughput: int
    long_stalls: bool
    floor: str


#: Sizing per ``--set`` (``--configs`` takes the sizing of ``--set``). The default set keeps
#: every set of the full one and its coverage floor, with fewer random and real vectors.
SIZES = {
    "quick": Sizing(random=1000, rt_random=300, real=2000, rt_real=1000, keyfront=256,
                    reset=1000, rt_reset=300, rt_throughput=300, long_stalls=False, floor="quick"),
    "default": Sizing(random=4000, rt_random=1500, real=4000, rt_real=2000, keyfront=2048,
                      reset=2000, rt_reset=1000, rt_throughput=500, long_stalls=True, floor="full"),
    "full": Sizing(random=10000, rt_random=3000, real=None, rt_real=None, keyfront=2048,
                   reset=3000, rt_reset=2000, rt_throughput=1000, long_stalls=True, floor="full"),
}
SIZES["all"] = SIZES["full"]
#: The run kinds of ``--set``.
SETS = tuple(SIZES)


def sets_for(cfg: RTLConfig, size: Sizing, n_random: int | None, fixture: Path, seed: int) -> list:
    """The streamed sets of one config (see the module docstring)."""
    real = cfg.params.n in REAL_NS and cfg.params.dtype == "fp16"
    long_stalls = {"gap_p": 0.5, "stall_p": 0.5, "burst_p": 0.001, "burst_max": 1000}
    if cfg.roundtrip:
        nr = n_random if n_random is not None else size.rt_random
        sets = [{"name": "random", "mode": "rt", "count": nr, "seed": seed},
                {"name": "adversarial", "mode": "rt", "count": None, "seed": seed},
                {"name": "random", "mode": "direct", "count": nr, "seed": seed},
                {"name": "adversarial", "mode": "direct", "count": None, "seed": seed}]
        if size.long_stalls:
            sets += [{"name": "random", "mode": "rt", "label": "long_stalls",
                      "count": max(nr // 5, 200), "seed": seed + 7, "stalls": long_stalls},
                     {"name": "coverage", "mode": "rt", "count": None, "seed": seed},
                     {"name": "coverage", "mode": "direct", "count": None, "seed": seed}]
        if real:
            sets.append({"name": "real", "mode": "rt", "count": size.rt_real, "seed": seed})
        return sets
    nr = n_random if n_random is not None else size.random
    sets = [{"name": "random", "count": nr, "seed": seed},
            {"name": "adversarial", "count": None, "seed": seed}]
    if size.long_stalls:
        sets.append({"name": "random", "label": "long_stalls", "count": max(nr // 5, 200),
                     "seed": seed + 7, "stalls": long_stalls})
        sets.append({"name": "coverage", "count": None, "seed": seed})
    if real:
        sets.append({"name": "real", "count": size.real})
    if cfg.params.dtype == "bf16":
        sets.append({"name": "raw", "count": max(nr // 4, 250), "seed": seed})
    if cfg.key_slots:
        sets.append({"name": "keyfront", "count": size.keyfront, "seed": seed})
    return sets


def job_for(cfg: RTLConfig, size: Sizing, n_random, fixture: Path, seed: int, stall: dict) -> Job:
    sets = sets_for(cfg, size, n_random, fixture, seed)
    if cfg.roundtrip:
        vectors = {"reset_vectors": size.rt_reset, "throughput_vectors": size.rt_throughput}
    else:
        vectors = {"reset_vectors": size.reset}
    return Job(seed=seed, sets=sets, fixture=str(fixture), **stall, **vectors)


def expected_phases(cfg: RTLConfig, sets: list) -> set:
    if cfg.roundtrip:
        return {"latency_rt", "latency_direct", "throughput", "rt:reset_midstream",
                *(f"{s['mode']}:{s.get('label', s['name'])}" for s in sets)}
    return {"latency", "throughput", "reset_midstream", "status_clear",
            *(s.get("label", s["name"]) for s in sets)}


def coverage_of(cfg: RTLConfig, job: Job, res: dict, floor: str) -> dict:
    """The functional coverage of one config's run (kvtest.coverage.evaluate of the
    database the testbench exported), with the floor of the run kind."""
    if not res.get("coverage"):
        return {"ok": False, "error": "the testbench wrote no coverage database"}
    hits = read_hits(res["coverage"], cfg.name)
    long_bursts = any((s.get("stalls") or {}).get("burst_max", job.burst_max) >= 256
                      for s in job.sets) or job.burst_max >= 256
    out = evaluate(model_of(cfg.name, cfg.params), hits, {LONG_BURSTS} if long_bursts else set(),
                   FLOORS[floor])
    cs = [ph.get("coverage_s") for ph in res["phases"] if ph.get("coverage_s") is not None]
    ns = [ph.get("coverage_samples") for ph in res["phases"] if ph.get("coverage_samples") is not None]
    out.update(database=res["coverage"], sampling_s=max(cs) if cs else None,
               samples=max(ns) if ns else None, hits=dict(sorted(hits.items())))
    return out


def build_weight(cfg: RTLConfig) -> int:
    """Rough relative cost of a config's build (lanes per cycle times modules), to start the
    longest builds first."""
    return (cfg.lanes or cfg.params.n) * (2 if cfg.roundtrip else 1)


def _fmt_row(cols, widths):
    return "  ".join(str(c).rjust(w) if i >= 2 else str(c).ljust(w)
                     for i, (c, w) in enumerate(zip(cols, widths)))


HEADER = ("config", "vector set", "vectors", "mismatches", "latency cycles",
          "cycles/vector", "sim vectors/s", "vectors/CPU s", "result")


def table(rows: list[dict]) -> str:
    cells = [HEADER]
    for r in rows:
        cells.append((r["config"], r["set"], r["vectors"], r["mismatches"], r["latency"],
                      "-" if r["cycles_per_vector"] is None else f"{r['cycles_per_vector']:.3f}",
                      "-" if r["vectors_per_s"] is None else f"{r['vectors_per_s']:.0f}",
                      "-" if r.get("vectors_per_cpu_s") is None else f"{r['vectors_per_cpu_s']:.0f}",
                      "ok" if r["ok"] else "FAIL"))
    widths = [max(len(str(c[i])) for c in cells) for i in range(len(HEADER))]
    lines = [_fmt_row(cells[0], widths), _fmt_row(["-" * w for w in widths], widths)]
    lines += [_fmt_row(c, widths) for c in cells[1:]]
    return "\n".join(lines)


def row_of(name: str, ph: dict) -> dict:
    lat = (ph.get("latency_min"), ph.get("latency_max"))
    latency = "-" if lat[0] is None else (str(lat[0]) if lat[0] == lat[1] else f"{lat[0]}..{lat[1]}")
    cpv = ph.get("span_cycles_per_vector") if ph["set"] == "throughput" else ph.get("cycles_per_vector")
    return {"config": name, "set": ph["set"], "vectors": ph["vectors"],
            "mismatches": ph["mismatches"], "latency": latency, "cycles_per_vector": cpv,
            "vectors_per_s": ph.get("vectors_per_s"),
            "vectors_per_cpu_s": ph.get("vectors_per_cpu_s"), "ok": bool(ph["ok"])}


def _error_row(name: str, what: str) -> dict:
    return {"config": name, "set": what, "vectors": 0, "mismatches": "-", "latency": "-",
            "cycles_per_vector": None, "vectors_per_s": None, "ok": False}


def quick_configs() -> list[str]:
    """QUICK_CONFIGS with the N=64 config in the first mode combination of
    :func:`mode_configs` (e.g. midrise + nearest), if the RTL implements any."""
    modes = [n for n in mode_configs(("enc_v2_n64_g64_b3_l2",)) if not n.startswith("rt_")]
    return [modes[0] if (c == "enc_v2_n64_g64_b3_l2" and modes) else c for c in QUICK_CONFIGS]


def mode_groups() -> list[dict]:
    """The combinations of :func:`mode_configs` (``combine``): group k has the k-th
    non-default value of every field the write path implements."""
    epi, _ = mode_values()
    return [{f: vs[k] for f, vs in epi.items() if k < len(vs)}
            for k in range(max((len(vs) for vs in epi.values()), default=0))]


def default_mode_configs(bases=DEFAULT_MODE_BASES) -> list[str]:
    """The default set's quantizer-mode configs: combination k of :func:`mode_groups` on
    ``bases[k % len(bases)]`` (every other option of the base kept), a round trip where the
    read path implements the combination, else the encoder; a combination FormatParams
    refuses is split into one config per value."""
    _, dec = mode_values()
    default = FormatParams()
    out = []
    for k, g in enumerate(mode_groups()):
        base = sim_config(bases[k % len(bases)])
        try:
            ps = [dataclasses.replace(base.params, **g)]
        except (ValueError, TypeError):
            ps = [dataclasses.replace(base.params, **{f: v}) for f, v in g.items()]
        for p in ps:
            rt = all(getattr(p, f) in dec[f] or getattr(p, f) == getattr(default, f)
                     for f in MODE_FIELDS)
            out.append(dataclasses.replace(base, kind="roundtrip" if rt else "encoder",
                                           params=p).name)
    return list(dict.fromkeys(out))


def features(cfg: RTLConfig) -> set[str]:
    """What one config exercises, in the terms of :data:`FEATURES` plus the quantizer
    fields (``mode=...``, ``scale=...``, ``scale_rule=...``, ``scale_round=...``; a round
    trip's ``read.mode=...`` and so on: the read path's)."""
    p = cfg.params
    out = {f"kind={cfg.kind}", f"n={p.n}", "g=n" if p.block == p.n else "g<n",
           f"bits={p.bits}", f"dtype={p.dtype}"}
    out |= {f"{f}={getattr(p, f)}" for f in MODE_FIELDS}
    if cfg.roundtrip:
        out |= {f"read.{f}={getattr(p, f)}" for f in MODE_FIELDS}
    if cfg.pipe is not None:
        out.add(f"pipe={cfg.pipe}")
    for flag, on in (("key_slots", cfg.key_slots), ("lane_ram", cfg.lane_ram),
                     ("credit", cfg.credit is not None), ("lanes", cfg.lanes is not None),
                     ("fold_align", cfg.fold_align), ("reset_copies", cfg.reset_copies)):
        if on:
            out.add(flag)
    if cfg.credit is not None and cfg.lanes is not None:
        out.add("credit+lanes")
    return out


def required_features() -> set[str]:
    """:data:`FEATURES` and every quantizer value the RTL implements (:func:`mode_values`:
    the write path's, and through a round trip the read path's)."""
    epi, dec = mode_values()
    out = set(FEATURES)
    out |= {f"{f}={v}" for f, vs in epi.items() for v in vs}
    out |= {f"read.{f}={v}" for f, vs in dec.items() for v in vs}
    return out


def config_names(spec: str | None, set_name: str = "default") -> list[str]:
    """The configs of a run: ``spec`` (comma-separated names) or, without it, those of
    ``set_name`` (:data:`SETS`)."""
    if spec is not None:
        names = [s.strip() for s in spec.split(",") if s.strip()]
        for n in names:
            if n in SIZES:
                raise ValueError(f"--configs {n}: that is a set, run --set {n}")
        return names
    if set_name not in SIZES:
        raise ValueError(f"set must be one of {list(SETS)}, got {set_name!r}")
    if set_name == "quick":
        return quick_configs()
    if set_name == "default":
        return list(dict.fromkeys([*DEFAULT_CONFIGS, *default_mode_configs()]))
    names = list(FULL_CONFIGS) + mode_configs() + list(FULL_RT_CONFIGS) \
        + list(DEFAULT_CONFIGS) + default_mode_configs()
    if set_name == "all":
        names += list(EXTRA_CONFIGS) + mode_configs(MODE_BASES, rt_limit=None) \
            + mode_configs(MODE_BASES, combine=False, rt_limit=None) \
            + mode_configs(MODE_BASES_ALL, rt_limit=None) + quick_configs()
    return list(dict.fromkeys(names))


def _probability(s: str) -> float:
    """argparse type: a per-cycle probability in [0, 1) (1 would never let a vector through)."""
    v = float(s)
    if not 0.0 <= v < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {s}")
    return v


def _count(lo: int):
    """argparse type: an int >= lo."""
    def parse(s: str) -> int:
        v = int(s)
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be an int >= {lo}, got {s}")
        return v
    return parse


def _existing_file(s: str) -> Path:
    """argparse type: a path that exists."""
    if not Path(s).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {s}")
    return Path(s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verif.sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", choices=SETS, default="default", dest="set_name",
                    help="default (make sim): every RTL module, flow and feature once, "
                         f"{', '.join(config_names(None, 'default'))}; "
                         "quick (make test, CI): the fixture's N and small round trips, fewer "
                         "vectors, no long-stall set, coverage floor "
                         f"{FLOORS['quick']:g}%%; full (make sim-full): the wider list, every "
                         "vector of the real capture; all: full and more sizes, profiles and "
                         "round trips. --list prints a set's configs")
    ap.add_argument("--configs", default=None,
                    help="comma-separated configs instead of the set's (vectors per set: "
                         "--set's) (enc|rt)_(v1|v2)_nN_gG_bB_lL[_pK][_kT][_rD][_cE][_wW][_fa][_rc]"
                         "[_bf16][_asym]... (lL: FWHT pipeline registers; rt_: encoder -> "
                         "decoder round trip; see rtl_gen.config)")
    ap.add_argument("--list", action="store_true", help="print the configs and exit")
    ap.add_argument("--seed", type=int, default=1, help="seed of vectors and stall patterns")
    ap.add_argument("--random", type=_count(1), default=None, help="random vectors per config")
    ap.add_argument("--gap-p", type=_probability, default=0.2, help="P(i__valid gap) per cycle, [0, 1)")
    ap.add_argument("--stall-p", type=_probability, default=0.3, help="P(o__ready low) per cycle, [0, 1)")
    ap.add_argument("--burst-p", type=_probability, default=0.002, help="P(long gap/stall burst starts), [0, 1)")
    ap.add_argument("--fixture", type=_existing_file, default=FIXTURE, help="real K/V capture (.npz)")
    ap.add_argument("--summary", type=Path, default=BUILD / "sim_summary.json")
    ap.add_argument("--no-waves", action="store_true",
                    help="do not rerun failing tests with FST tracing")
    ap.add_argument("--jobs", type=_count(1), default=2,
                    help="configs built at once while the built ones simulate (default 2: "
                         "a build leaves a core idle for a while); 1: build and simulate one "
                         "at a time")
    a = ap.parse_args(argv)

    size = SIZES[a.set_name]
    try:
        names = list(dict.fromkeys(config_names(a.configs, a.set_name)))
        if not names:
            raise ValueError("--configs names no configuration")
        cfgs = [sim_config(s) for s in names]
    except (ValueError, TypeError) as err:
        hint = (" (--configs: names in the rtl_gen.config grammar; `python -m verif.sim "
                "--set default --list` prints valid ones)") if a.configs is not None else ""
        print(f"error: {err}{hint}", file=sys.stderr)
        return 2
    if a.list:
        return print_names(c.name for c in cfgs)
    try:                    # the summary's place, before hours of simulation
        a.summary.parent.mkdir(parents=True, exist_ok=True)
        if a.summary.is_dir() or not os.access(a.summary.parent, os.W_OK) \
                or (a.summary.exists() and not os.access(a.summary, os.W_OK)):
            raise OSError("not a writable file path")
    except OSError as err:
        print(f"error: --summary {a.summary}: {err}", file=sys.stderr)
        return 2
    t_start = time.time()
    stall = {"gap_p": a.gap_p, "stall_p": a.stall_p, "burst_p": a.burst_p}
    print(f"verif.sim: {len(cfgs)} config(s), seed {a.seed}{' (' + a.set_name + ' set sizes)' if a.configs else ' (set ' + a.set_name + ')'}: "
          + ", ".join(c.name for c in cfgs), flush=True)

    def log(s):
        print(s, flush=True)

    built: dict[str, dict] = {}
    done: queue.Queue = queue.Queue()      # names of built configs, in the order they finish
    gen_lock = threading.Lock()     # one elaboration at a time (Python); builds in parallel

    def do_build(cfg):
        info = {"build_s": 0.0, "gen_s": 0.0}
        try:
            with gen_lock:
                t0 = time.time()
                files, man = generate(cfg)
                info["gen_s"] = time.time() - t0
            bdir, dt = build(cfg, files, log=log)
            info.update(files=files, manifest=man, bdir=bdir, build_s=dt)
        except Exception as err:  # reported per config
            info["error"] = f"{type(err).__name__}: {err}"
            info["traceback"] = traceback.format_exc()
        built[cfg.name] = info
        done.put(cfg.name)

    if a.jobs > 1:   # builds run ahead in threads (yosys, Verilator and make are subprocesses)
        from concurrent.futures import ThreadPoolExecutor
        pool = ThreadPoolExecutor(a.jobs, thread_name_prefix="build")
        for c in sorted(cfgs, key=build_weight, reverse=True):    # the longest builds first
            pool.submit(do_build, c)
        pool.shutdown(wait=False)

    results, rows = [], []
    coverage: dict[str, dict] = {}
    ok_all = True
    by_name = {c.name: c for c in cfgs}
    for cfg in cfgs:
        if a.jobs <= 1:
            do_build(cfg)
        cfg = by_name[done.get()]       # simulate whichever is built
        info = built[cfg.name]
        entry = {"config": cfg.name, "kind": cfg.kind,
                 "params": cfg.params.to_dict(), "latency_param": cfg.fwht_regs,
                 "gen_s": round(info["gen_s"], 2), "build_s": round(info["build_s"], 2)}
        if "error" in info:
            log(f"[{cfg.name}] ERROR generating/building: {info['error']}")
            print(info["traceback"], file=sys.stderr)
            entry["error"] = info["error"]
            rows.append(_error_row(cfg.name, "build"))
            coverage[cfg.name] = {"ok": False, "error": "not built"}
            results.append(entry)
            ok_all = False
            continue
        man = info["manifest"]
        entry["manifest_latency_cycles"] = man["latency"]
        job = job_for(cfg, size, a.random, a.fixture, a.seed, stall)
        if any(s["name"] == "real" for s in job.sets) and not a.fixture.exists():
            job.sets = [s for s in job.sets if s["name"] != "real"]
            log(f"[{cfg.name}] ERROR: real fixture {a.fixture} missing")
            rows.append(_error_row(cfg.name, "real"))
            entry.setdefault("errors", []).append(f"real fixture {a.fixture} missing")
            ok_all = False
        log(f"[{cfg.name}] simulating (latency {man['latency']} cycles): "
            + ", ".join(s.get("label", s["name"]) if not cfg.roundtrip else
                        f"{s['mode']}:{s['name']}" for s in job.sets) + " ...")
        try:
            res = run(cfg, info["files"], info["bdir"], man, job, tag="sim",
                      waves=False if a.no_waves else None, log=log)
        except Exception as err:
            res = {"phases": [], "tests": {"passed": 0, "failed": 1}, "wall_s": 0.0,
                   "error": f"{type(err).__name__}: {err}", "waves": []}
        entry.update(run_s=round(res["wall_s"], 2), tests=res["tests"], log=res.get("log"),
                     phases=res["phases"], waves=res.get("waves", []))
        expected = expected_phases(cfg, job.sets)
        got = {ph["set"] for ph in res["phases"]}
        if got != expected or res["tests"]["failed"] or "error" in res:
            why = res.get("error") or (f"missing phases {sorted(expected - got)}"
                                       if got != expected else
                                       f"{res['tests']['failed']} cocotb test(s) failed")
            entry.setdefault("errors", []).append(why)
            ok_all = False
            log(f"[{cfg.name}] ERROR: {why} (log: {res.get('log')})")
        for ph in res["phases"]:
            rows.append(row_of(cfg.name, ph))
            ok_all &= bool(ph["ok"])
            if not ph["ok"]:
                log(f"[{cfg.name}] {ph['set']}: FAILED:\n    " + "\n    ".join(ph["errors"][:10]))
        for w in res.get("waves", []):
            log(f"[{cfg.name}] FST of the failing run: {w}")
        cov = coverage_of(cfg, job, res, size.floor)
        entry["coverage"] = coverage[cfg.name] = cov
        ok_all &= bool(cov["ok"])
        if "error" not in cov:
            log(f"[{cfg.name}] functional coverage {cov['hit']}/{cov['reachable']} reachable bins "
                f"({cov['percent']:.1f}%, floor {cov['floor']:g}%; {cov['samples']} samples in "
                f"{cov['sampling_s']:.2f} s){'' if cov['ok'] else ': UNDER THE FLOOR / WRONG'}")
        nv = sum(ph["outputs"] for ph in res["phases"])
        log(f"[{cfg.name}] {nv} vectors in {res['wall_s']:.1f} s (build {info['build_s']:.1f} s"
            f"{', cached' if info['build_s'] == 0 else ''}): "
            f"{'ok' if res['phases'] and all(ph['ok'] for ph in res['phases']) else 'FAILED'}")
        results.append(entry)

    pos = {c.name: k for k, c in enumerate(cfgs)}       # the report in the order of the list
    results.sort(key=lambda e: pos[e["config"]])
    rows.sort(key=lambda r: pos[r["config"]])
    coverage = {c.name: coverage[c.name] for c in cfgs if c.name in coverage}
    print()
    print(table(rows))
    print("\nFunctional coverage (kvtest.coverage: reachable bins hit; floor "
          f"{FLOORS[size.floor]:g}% of them)\n")
    print(coverage_table(coverage))
    total = time.time() - t_start
    n_mism = sum(r["mismatches"] for r in rows if isinstance(r["mismatches"], int))
    n_vec = sum(r["vectors"] for r in rows)
    print(f"\n{n_vec} vectors, {n_mism} mismatches, {total:.0f} s total: "
          f"{'PASS' if ok_all else 'FAIL'}")
    summary = {"ok": ok_all, "seed": a.seed, "set": a.set_name, "quick": a.set_name == "quick",
               "total_s": round(total, 1),
               "rows": rows, "coverage": {k: {f: v[f] for f in v if f != "hits"}
                                          for k, v in coverage.items()},
               "configs": results}
    a.summary.parent.mkdir(parents=True, exist_ok=True)
    a.summary.write_text(json.dumps(summary, indent=1, default=str))
    print(f"summary: {a.summary}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
