"""8 vs 12 warps per SM at the same split count (issue 12, round 11 item 2), and v3's q~ parts.

Run 23 timed ``minb 3, stages 2`` (3 CTAs = 12 warps per SM) -4.2 % at B8/128K, but the planner gave it 6 splits
where the default (2 CTAs, 8 warps) got 4: the two effects were confounded. Here both tunes run at each split count
of ``SPLITS`` (K3V3, GQA 64/8, N=128, vpair value layout, random planes rotated past L2, CUDA-graph medians, the
pair timed twice in the order A B A B), then the v3 decode (K3V3 + 4 sinks + key scales) with one and two q~ parts,
and SDPA bf16 on each shape in the same run. Usage (device): ``python3 bench/gpu_tune12.py --out $OUT``;
``--rule``: the planner rule that came of it (``gpu_ref.decode.LONG_TUNE``) against 8 warps where it picks 12.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import gpu_bench as gb  # noqa: E402  (timing helpers, inputs, SDPA bf16)
from gpu_bench import cp, gpu_ref, log, qparams  # noqa: E402

TUNES = {"8 warps": {"minb": 2}, "12 warps": {"minb": 3, "stages": 2}}  # minb set: no planner rule (LONG_TUNE)
#: (batch, context): split counts timed under both tunes (the planner's picks: B8 4 / 6, B32 1 / 1)
SPLITS = {(8, 131072): (4, 6, 8), (16, 131072): (2, 3, 4), (32, 131072): (1, 2)}
V3_SHAPES = ((1, 4096), (8, 131072))


def time_plan(pl, sets, q, lens, out, sk=None, sv=None, qs=None):
    ws = pl.workspace()
    fns = [gb.on_torch_stream(lambda s=s: gpu_ref.run(pl, ws, q, s[0], s[1], s[2], s[3], lens, k_sink=sk, v_sink=sv,
                                                      out=out, out_dtype="fp32", layout=pl.layout, q_scale=qs))
           for s in sets]
    ms, times, how = gb.graph_time(fns, reps=7)
    return ms, times


#: --rule: shapes where run 26's form of the rule picked LONG_TUNE (bits, sinks, key scales, q heads, page size), timed
#: against the same plan forced to 8 warps ({"minb": 2}: its own split count). Run 26 planned key scales with one q~
#: part; the final planner gives them two (no 12 warps), and its balance clause keeps B35 / B40 at 8 warps.
RULE_CASES = [((8, 131072), (3, 3), 0, False, 64, None), ((8, 131072), (4, 3), 0, False, 64, None),
              ((8, 131072), (3, 3), 4, True, 64, None), ((8, 131072), (3, 3), 0, False, 32, None),
              ((8, 131072), (3, 3), 0, False, 64, 16), ((8, 131072), (3, 3), 0, False, 64, 64),
              ((16, 131072), (3, 3), 0, False, 64, None), ((32, 131072), (3, 3), 0, False, 64, None),
              ((32, 131072), (4, 3), 4, True, 64, None), ((64, 131072), (3, 3), 0, False, 64, None),
              ((32, 32768), (3, 3), 0, False, 64, None), ((128, 32768), (3, 3), 0, False, 64, None),
              ((35, 131072), (3, 3), 0, False, 32, None), ((40, 131072), (3, 3), 0, False, 32, None),
              ((48, 131072), (3, 3), 0, False, 32, None)]  # the last three: partial waves (gpu_bench_waves.json)


def rule(out_dir):
    """The planner rule (gpu_ref.decode.LONG_TUNE) against 8 warps on every case of RULE_CASES, A B A B."""
    res = {"cases": []}
    path = os.path.join(out_dir, "gpu_rule12.json")
    hq_done = {}
    for (bsz, t), (kb, vb), sinks, kscale, hq, page in RULE_CASES:
        kvh, n = 8, 128
        kp, vp = qparams("midrise", "nearest", bits=kb), qparams("midrise", "nearest", bits=vb)
        packed, sets, cap, q, lens, out, sk, sv = gb.decode_inputs(bsz, hq, kvh, t, kp, vp, sinks, page, cp.float32)
        qs = cp.exp2(-cp.random.randint(-2, 3, (kvh, n)).astype(cp.float32)) if kscale else None
        kw = dict(batch=bsz, q_heads=hq, kv_heads=kvh, max_length=t, sinks=sinks, key_scales=kscale, layout="vpair")
        kw.update(dict(capacity=cap) if page is None else dict(page_size=page))
        row = {"batch": bsz, "context": t, "bits": f"K{kb}V{vb}", "sinks": sinks, "key_scales": kscale, "q_heads": hq,
               "page": page, "rows": []}
        plans = {"rule": gpu_ref.plan(kp, vp, **kw), "8 warps": gpu_ref.plan(kp, vp, tune={"minb": 2}, **kw)}
        row["rule_picks_12_warps"] = plans["rule"].targs[8] == "3"
        for rep in range(2):
            for name, pl in plans.items():
                ws = pl.workspace()
                fns = [gb.on_torch_stream(lambda s=s, pl=pl, ws=ws: gpu_ref.run(
                    pl, ws, q, s[0], s[1], s[2], s[3], lens, s[4], k_sink=sk, v_sink=sv, out=out, out_dtype="fp32",
                    layout="vpair", q_scale=qs)) for s in sets]
                ms, times, _ = gb.graph_time(fns, reps=7)
                row["rows"].append({"plan": name, "num_splits": pl.num_splits, "targs": list(pl.targs), "rep": rep,
                                    "ms": ms, "all_ms": times, "GBps": packed / (ms * 1e-3) / 1e9})
                log(f"rule B{bsz} T{t} K{kb}V{vb} S{sinks} KS{int(kscale)} Hq{hq} page {page} {name} "
                    f"({pl.num_splits} splits) rep {rep}: {ms * 1e3:.2f} us")
        del sets
        gb.free()
        key = (bsz, t, hq)
        if key not in hq_done:
            hq_done[key], _, _ = gb.sdpa_time(bsz, hq, kvh, t, n)
        row["sdpa_bf16_ms"] = hq_done[key]
        log(f"rule B{bsz} T{t} Hq{hq}: SDPA bf16 {row['sdpa_bf16_ms'] * 1e3:.2f} us")
        res["cases"].append(row)
        with open(path, "w") as f:
            json.dump(res, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--rule", action="store_true", help="time the planner rule (RULE_CASES) instead")
    a = ap.parse_args()
    if a.rule:
        rule(a.out)
        return
    res = {"tunes": TUNES, "splits": [], "v3": []}
    path = os.path.join(a.out, "gpu_tune12.json")
    hq, kvh, n = 64, 8, 128
    kp = vp = qparams("midrise", "nearest", bits=3)
    for (bsz, t), counts in SPLITS.items():
        packed, sets, cap, q, lens, out, _, _ = gb.decode_inputs(bsz, hq, kvh, t, kp, vp, 0, None, cp.float32)
        row = {"batch": bsz, "context": t, "rows": []}
        defaults = {}
        for name, tu in TUNES.items():
            pl = gpu_ref.plan(kp, vp, batch=bsz, q_heads=hq, kv_heads=kvh, max_length=t, capacity=cap,
                              tune=tu or None, layout="vpair")
            defaults[name] = pl.num_splits
        row["planner_splits"] = defaults
        for ns in counts:
            for rep in range(2):
                for name, tu in TUNES.items():
                    pl = gpu_ref.plan(kp, vp, batch=bsz, q_heads=hq, kv_heads=kvh, max_length=t, capacity=cap,
                                      num_splits=ns, tune=tu or None, layout="vpair")
                    ms, times = time_plan(pl, sets, q, lens, out)
                    row["rows"].append({"tune": name, "num_splits": pl.num_splits, "partials": pl.partials,
                                        "kernel": pl.kind, "rep": rep, "ms": ms, "all_ms": times,
                                        "GBps": packed / (ms * 1e-3) / 1e9})
                    log(f"B{bsz} T{t} splits {pl.num_splits} ({pl.kind}) {name} rep {rep}: {ms * 1e3:.2f} us")
        del sets
        gb.free()
        row["sdpa_bf16_ms"], _, _ = gb.sdpa_time(bsz, hq, kvh, t, n)
        log(f"B{bsz} T{t} SDPA bf16 {row['sdpa_bf16_ms'] * 1e3:.2f} us (planner splits {defaults})")
        res["splits"].append(row)
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    for bsz, t in V3_SHAPES:
        packed, sets, cap, q, lens, out, sk, sv = gb.decode_inputs(bsz, hq, kvh, t, kp, vp, 4, None, cp.float32)
        qs = cp.exp2(-cp.random.randint(-2, 3, (kvh, n)).astype(cp.float32))
        row = {"batch": bsz, "context": t, "rows": []}
        for rep in range(2):
            for qlo in (1, 0):
                pl = gpu_ref.plan(kp, vp, batch=bsz, q_heads=hq, kv_heads=kvh, max_length=t, capacity=cap, sinks=4,
                                  key_scales=True, tune={"qlo": qlo, "minb": 2}, layout="vpair")
                ms, times = time_plan(pl, sets, q, lens, out, sk, sv, qs)
                row["rows"].append({"qlo": qlo, "num_splits": pl.num_splits, "kernel": pl.kind, "rep": rep, "ms": ms,
                                    "all_ms": times})
                log(f"v3 B{bsz} T{t} qlo {qlo} rep {rep}: {ms * 1e3:.2f} us ({pl.num_splits} splits, {pl.kind})")
        del sets
        gb.free()
        row["sdpa_bf16_ms"], _, _ = gb.sdpa_time(bsz, hq, kvh, t, n)
        log(f"v3 B{bsz} T{t} SDPA bf16 {row['sdpa_bf16_ms'] * 1e3:.2f} us")
        res["v3"].append(row)
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    res["gpu_state"] = gb.gpu_state()
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
