"""``python -m verif.sim``: simulate the kv_epilogue RTL against the golden model.

For each configuration: generate the Verilog (rtl_gen.generate) into
build/rtl/<config>/, build it with Verilator (cached in build/sim/<config>/),
and run the cocotb testbench verif/tb_epilogue.py on it:

* latency      isolated vectors, no stalls: measured == manifest latency_cycles
* throughput   valid and ready always high: 1 vector / cycle
* random       sim_models.testvectors.random_vectors (10,000 per config; --quick 1,000)
* adversarial  the whole sim_models.testvectors.adversarial_vectors set
* real         the whole SmolLM2-135M K/V capture verif/data/smollm2_kv.npz
               (N=64: every head vector; N=128: heads 0+1 and 1+2 concatenated;
               --quick: an evenly strided subsample of 2,000)
* reset        mid-stream resets with words in flight
* status       scripted status / status_clear checks

Round trip (configs ``rt_<config>``, verif/roundtrip.py + verif/tb_roundtrip.py):
kv_epilogue -> kv_decompressor in one Verilog wrapper, every decoded word
compared bit-exact with sim_models.decode(encode(x)), plus arbitrary code/scale
planes fed to the decompressor directly (compared with sim_models.decode);
added to the default, --quick and 'all' config lists.

The streaming sets run with random i__valid gaps, o__ready stalls, long stall
bursts and status_clear pulses. Every output word is compared bit-exact (codes,
scales, flags) in order. Prints a summary table and writes it as JSON to
build/sim_summary.json; exits 1 on any mismatch or error.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import traceback
from pathlib import Path

from . import roundtrip
from .dut import BUILD, SimConfig, build, generate, run
from .vectors import FIXTURE

#: Configurations of a plain ``python -m verif.sim`` (first one = the product default):
#: N = 128 / 64 / 256, b = 3 / 2 / 4, and bf16 input (the only way to reach FLAG_SAT).
DEFAULT_CONFIGS = ("n128_g64_b3_l2", "n64_g64_b3_l2", "n256_g64_b3_l2", "n128_g64_b2_l2",
                   "n128_g64_b4_l2", "n128_g64_b3_l2_bf16")
#: ``--quick`` without ``--configs``: the two configurations of the real K/V fixture.
QUICK_CONFIGS = ("n128_g64_b3_l2", "n64_g64_b3_l2")
#: Extra configurations for ``--configs all``: G = 32, FWHT latency 0 and log2(N).
EXTRA_CONFIGS = ("n128_g32_b3_l2", "n64_g64_b3_l0", "n64_g64_b3_l6")
#: Sets streamed per configuration; "real" only where the fixture supplies N.
REAL_NS = (64, 128)


def sets_for(cfg: SimConfig, n_random: int, real_limit: int | None, fixture: Path,
             seed: int) -> list[dict]:
    sets = [{"name": "random", "count": n_random, "seed": seed},
            {"name": "adversarial", "count": None, "seed": seed}]
    if cfg.n in REAL_NS and cfg.dtype == "fp16":
        sets.append({"name": "real", "count": real_limit, "fixture": str(fixture)})
    if cfg.dtype == "bf16":
        # uniformly random bf16 bit patterns: huge magnitudes (FLAG_SAT), NaN, inf
        sets.append({"name": "raw", "count": max(n_random // 4, 250), "seed": seed})
    return sets


def _fmt_row(cols, widths):
    return "  ".join(str(c).rjust(w) if i >= 2 else str(c).ljust(w)
                     for i, (c, w) in enumerate(zip(cols, widths)))


HEADER = ("config", "vector set", "vectors", "mismatches", "latency cycles",
          "cycles/vector", "sim vectors/s", "result")


def table(rows: list[dict]) -> str:
    cells = [HEADER]
    for r in rows:
        cells.append((r["config"], r["set"], r["vectors"], r["mismatches"], r["latency"],
                      "-" if r["cycles_per_vector"] is None else f"{r['cycles_per_vector']:.3f}",
                      "-" if r["vectors_per_s"] is None else f"{r['vectors_per_s']:.0f}",
                      "ok" if r["ok"] else "FAIL"))
    widths = [max(len(str(c[i])) for c in cells) for i in range(len(HEADER))]
    lines = [_fmt_row(cells[0], widths), _fmt_row(["-" * w for w in widths], widths)]
    lines += [_fmt_row(c, widths) for c in cells[1:]]
    return "\n".join(lines)


def row_of(cfg: SimConfig, ph: dict) -> dict:
    lat = (ph.get("latency_min"), ph.get("latency_max"))
    if lat[0] is None:
        latency = "-"
    elif lat[0] == lat[1]:
        latency = str(lat[0])
    else:
        latency = f"{lat[0]}..{lat[1]}"
    cpv = ph.get("span_cycles_per_vector") if ph["set"] == "throughput" else ph.get("cycles_per_vector")
    return {"config": cfg.name, "set": ph["set"], "vectors": ph["vectors"],
            "mismatches": ph["mismatches"], "latency": latency, "cycles_per_vector": cpv,
            "vectors_per_s": ph.get("vectors_per_s"), "ok": bool(ph["ok"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verif.sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="1,000 random vectors per config, real set subsampled to 2,000 (make test)")
    ap.add_argument("--configs", default=None,
                    help="comma-separated configs nN_gG_bB_lL[_bf16] (lL: FWHT pipeline registers), "
                         "rt_nN_gG_bB_lL[_bf16] for the epilogue -> decompressor round trip; "
                         f"default {','.join(DEFAULT_CONFIGS)}; with --quick "
                         f"{','.join(QUICK_CONFIGS)}; 'all' adds {','.join(EXTRA_CONFIGS)}")
    ap.add_argument("--seed", type=int, default=1, help="seed of vectors and stall patterns")
    ap.add_argument("--random", type=int, default=None, help="random vectors per config")
    ap.add_argument("--gap-p", type=float, default=0.2, help="P(i__valid gap) per cycle")
    ap.add_argument("--stall-p", type=float, default=0.3, help="P(o__ready low) per cycle")
    ap.add_argument("--burst-p", type=float, default=0.002, help="P(long gap/stall burst starts)")
    ap.add_argument("--fixture", type=Path, default=FIXTURE, help="real K/V capture (.npz)")
    ap.add_argument("--summary", type=Path, default=BUILD / "sim_summary.json")
    ap.add_argument("--jobs", type=int, default=2,
                    help="2: build the next config while simulating this one; 1: one at a time")
    a = ap.parse_args(argv)

    rt_auto = a.configs is None          # round-trip configs rt_* (verif/roundtrip.py)
    if a.configs is None:
        a.configs = ",".join(QUICK_CONFIGS if a.quick else DEFAULT_CONFIGS)
    names = [s.strip() for s in a.configs.split(",") if s.strip()]
    if not names:
        print("error: --configs names no configuration", file=sys.stderr)
        return 2
    if names == ["all"]:
        names = list(DEFAULT_CONFIGS) + list(EXTRA_CONFIGS)
        names += list(roundtrip.DEFAULT_RT_CONFIGS) + list(roundtrip.EXTRA_RT_CONFIGS)
    elif rt_auto:
        names += list(roundtrip.QUICK_RT_CONFIGS if a.quick else roundtrip.DEFAULT_RT_CONFIGS)
    rt_names = [s for s in names if roundtrip.is_rt(s)]
    names = [s for s in names if not roundtrip.is_rt(s)]
    try:
        [roundtrip.parse(s) for s in rt_names]
        cfgs = [SimConfig.parse(s) for s in names]
    except (ValueError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    n_random = a.random if a.random is not None else (1000 if a.quick else 10000)
    real_limit = 2000 if a.quick else None
    t_start = time.time()
    print(f"verif.sim: {len(cfgs)} config(s), {n_random} random vectors each, seed {a.seed}"
          f"{' (quick)' if a.quick else ''}", flush=True)

    # builds run ahead in a thread (Verilator + make are subprocesses)
    built: dict[str, dict] = {}
    ready = {c.name: threading.Event() for c in cfgs}
    # round-trip builds start once the epilogue builds are done
    rt_builds = roundtrip.Builds(rt_names, after=list(ready.values()),
                                 log=lambda s: print(s, flush=True)) if rt_names else None

    def do_build(cfg):
        info = {"build_s": 0.0, "gen_s": 0.0}
        try:
            t0 = time.time()
            v, man = generate(cfg)
            info["gen_s"] = time.time() - t0
            bdir, dt = build(cfg, v, log=lambda s: print(s, flush=True))
            info.update(verilog=str(v), manifest=man, bdir=bdir, build_s=dt)
        except Exception as err:  # reported per config
            info["error"] = f"{type(err).__name__}: {err}"
            info["traceback"] = traceback.format_exc()
        built[cfg.name] = info
        ready[cfg.name].set()

    def builder():
        for cfg in cfgs:
            do_build(cfg)

    if a.jobs > 1:
        threading.Thread(target=builder, daemon=True).start()

    results, rows = [], []
    ok_all = True
    for cfg in cfgs:
        if a.jobs <= 1:
            do_build(cfg)
        ready[cfg.name].wait()
        info = built[cfg.name]
        entry = {"config": cfg.name, "params": cfg.params.to_dict(), "latency_param": cfg.latency,
                 "gen_s": round(info["gen_s"], 2), "build_s": round(info["build_s"], 2)}
        if "error" in info:
            print(f"[{cfg.name}] ERROR generating/building: {info['error']}", flush=True)
            print(info["traceback"], file=sys.stderr)
            entry["error"] = info["error"]
            rows.append({"config": cfg.name, "set": "build", "vectors": 0, "mismatches": "-",
                         "latency": "-", "cycles_per_vector": None, "vectors_per_s": None,
                         "ok": False})
            results.append(entry)
            ok_all = False
            continue
        man = info["manifest"]
        entry["manifest_latency_cycles"] = man.get("latency_cycles")
        sets = sets_for(cfg, n_random, real_limit, a.fixture, a.seed)
        missing = [s for s in sets if s["name"] == "real" and not Path(s["fixture"]).exists()]
        for s in missing:
            sets.remove(s)
            print(f"[{cfg.name}] ERROR: real fixture {s['fixture']} missing", flush=True)
            rows.append({"config": cfg.name, "set": "real", "vectors": 0, "mismatches": "-",
                         "latency": "-", "cycles_per_vector": None, "vectors_per_s": None,
                         "ok": False})
            entry.setdefault("errors", []).append(f"real fixture {s['fixture']} missing")
            ok_all = False
        fixture = next((s["fixture"] for s in sets if s["name"] == "real"), None)
        job = {"seed": a.seed, "sets": sets, "fixture": fixture, "gap_p": a.gap_p,
               "stall_p": a.stall_p, "burst_p": a.burst_p,
               "reset_vectors": 1000 if a.quick else 3000}
        print(f"[{cfg.name}] simulating: latency, throughput, "
              + ", ".join(f"{s['name']}" for s in sets) + ", reset, status ...", flush=True)
        try:
            res = run(cfg, info["bdir"], man, job, tag="sim")
        except Exception as err:
            res = {"phases": [], "tests": {"passed": 0, "failed": 1}, "wall_s": 0.0,
                   "error": f"{type(err).__name__}: {err}"}
        entry.update(run_s=round(res["wall_s"], 2), tests=res["tests"],
                     log=res.get("log"), phases=res["phases"])
        expected = {"latency", "throughput", "reset_midstream", "status_clear",
                    *(s["name"] for s in sets)}
        got = {ph["set"] for ph in res["phases"]}
        if got != expected or res["tests"]["failed"] or "error" in res:
            why = res.get("error") or f"missing phases {sorted(expected - got)}" \
                if got != expected else f"{res['tests']['failed']} cocotb test(s) failed"
            entry.setdefault("errors", []).append(why)
            ok_all = False
            print(f"[{cfg.name}] ERROR: {why} (log: {res.get('log')})", flush=True)
        for ph in res["phases"]:
            rows.append(row_of(cfg, ph))
            ok_all &= bool(ph["ok"])
            if not ph["ok"]:
                print(f"[{cfg.name}] {ph['set']}: FAILED:\n    " + "\n    ".join(ph["errors"][:10]),
                      flush=True)
        nv = sum(ph["outputs"] for ph in res["phases"])
        print(f"[{cfg.name}] {nv} vectors in {res['wall_s']:.1f} s "
              f"(build {info['build_s']:.1f} s{', cached' if info['build_s'] == 0 else ''}): "
              f"{'ok' if all(ph['ok'] for ph in res['phases']) else 'FAILED'}", flush=True)
        results.append(entry)

    if rt_builds is not None:
        ok_rt, rt_rows, rt_results = roundtrip.run_configs(
            rt_builds, quick=a.quick, seed=a.seed, n_random=a.random, fixture=a.fixture,
            stall={"gap_p": a.gap_p, "stall_p": a.stall_p, "burst_p": a.burst_p})
        ok_all &= ok_rt
        rows += rt_rows
        results += rt_results

    print()
    print(table(rows))
    total = time.time() - t_start
    n_mism = sum(r["mismatches"] for r in rows if isinstance(r["mismatches"], int))
    n_vec = sum(r["vectors"] for r in rows)
    print(f"\n{n_vec} vectors, {n_mism} mismatches, {total:.0f} s total: "
          f"{'PASS' if ok_all else 'FAIL'}")
    summary = {"ok": ok_all, "seed": a.seed, "quick": a.quick, "total_s": round(total, 1),
               "rows": rows, "configs": results}
    a.summary.parent.mkdir(parents=True, exist_ok=True)
    a.summary.write_text(json.dumps(summary, indent=1, default=str))
    print(f"summary: {a.summary}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
