#!/usr/bin/env python3
"""Format study: perplexity of a language model with every cached K and V fake-quantized.

Any Llama-, Qwen2- or Gemma-3-family model (``--model``: a wheel alias, a .gguf file or
a Hugging Face folder; the product's resolver, sim_models.models) runs with the study's attention function
(bench/accuracy/attention.py, registered with transformers' ``AttentionInterface``): every
post-RoPE key and every value the model caches is replaced by its reconstruction, for
format configurations through the golden model (``sim_models.center`` -> ``encode`` ->
``decode_float``), for the float baselines by bench/accuracy/kvquant.py. Configurations:
bench/accuracy/configs.py; windows (defined in the text, disjoint from calibration):
bench/accuracy/windows.py and sim_models.calibrate; metrics and calibration: bench/accuracy/runs.py (its key
statistics and tables are the product's, sim_models.calibrate); tables and plot:
bench/accuracy/report.py.

Outputs, keyed by model id:
  bench/calib/<model_id>.npz                 calibration (automatic when missing and a
                                             configuration needs it)
  bench/calib/<model_id>.keytables.npz       the key tables format version 3 serves
                                             (sim_models.KeyTables; with the calibration; the
                                             same as python -m sim_models.calibrate writes)
  bench/results/accuracy/<model_id>.json     every (configuration, window) run
  bench/results/accuracy/<model_id>_pareto.png
  docs/ACCURACY.md                           its accuracy block (python -m bench.docs)

Usage:
    python -m bench.accuracy --model gemma3-270m --only fp16,midrise-max-near
    python -m bench.accuracy --model path/to/model.gguf --windows 2 --context 1024
    python -m bench.accuracy --model smollm2-135m --report-only
    python -m bench.accuracy --model gemma3-270m --calibrate    # recompute the calibration first
    python -m sim_models.calibrate --model gemma3-270m --out t.npz   # key tables alone (the product's)
    python -m bench.accuracy --list
    python -m bench.accuracy --v3-report          # key-treatment plot + doc block, both models
    python -m bench.accuracy --model smollm2-135m --peers   # the peers and v4 / v3 / v3-K4V3
    python -m bench.accuracy --peers-report       # peers plot + doc block, every model
    python -m bench.accuracy --tasks --model smollm2-135m   # task quality (bench/accuracy/tasks.py)
    python -m bench.accuracy --model smollm2-135m --levers  # the levers and their references
    python -m bench.accuracy --levers-report      # levers plot + doc block, every model
    python -m bench.accuracy --recount-bits       # recount the stored bits of every result

The test fixture verif/data/smollm2_kv.npz (real post-RoPE K/V of SmolLM2-135M) is written by
``python -m bench.accuracy.capture_kv``; the whole study in one call on a GPU machine:
``python -m bench.accuracy.device``.

A rerun skips results whose configuration, window tokens and calibration are
unchanged (``--force`` recomputes). CPU, one torch thread by default.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.accuracy.configs import CONFIRM, by_name  # noqa: E402
from bench.accuracy.report import report  # noqa: E402
from bench.accuracy.tasks import POLICIES as TASK_POLICIES  # noqa: E402

#: the study's defaults of --windows and --context (options the task runner refuses)
WINDOWS, CONTEXT = 4, 2048
#: the task runner's defaults of --backend and --max-batch (options the perplexity study refuses)
TASK_BACKEND, TASK_MAX_BATCH = "golden", 16
#: options of --tasks alone (dest -> option)
TASK_OPTIONS = {"policies": "--policies", "backend": "--backend", "limit": "--limit", "max_batch": "--max-batch",
                "tables": "--tables", "model_id": "--model-id", "out": "--out", "merge": "--merge"}


def run(args) -> int:
    if args.tasks:
        from bench.accuracy import tasks
        if args.report_only:
            from sim_models.models import resolve
            path = tasks.results_path(args.model_id or resolve(args.model).model_id)
            print(tasks.table(json.loads(path.read_text())))
            return 0
        return tasks.main(args)
    if args.v3_report:
        from bench.accuracy.report import v3_report
        v3_report()
        return 0
    if args.peers_report:
        from bench.accuracy.report import peers_report
        peers_report()
        return 0
    if args.levers_report:
        from bench.accuracy.report import levers_report
        levers_report()
        return 0
    if args.recount_bits:
        from bench.accuracy.report import recount_report
        for mid, keys in recount_report().items():
            print(f"{mid}: bits recounted, {len(keys)} runs changed")
        return 0
    if args.list:
        for c in by_name():
            print(f"{c.group:9s} {c.name}{'  (leading)' if c.name in CONFIRM else ''}")
        return 0
    from bench.accuracy.configs import LEVER_STUDY, PEER_STUDY
    names = (args.only.split(",") if args.only else PEER_STUDY if args.peers
             else LEVER_STUDY if args.levers else CONFIRM)
    configs = by_name(names)
    from sim_models.models import resolve
    from bench.accuracy.runs import RESULTS_DIR
    path = RESULTS_DIR / f"{resolve(args.model).model_id}.json"
    results = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    if args.report_only:
        if "meta" not in results:
            print(f"no results in {path}", file=sys.stderr)
            return 2
        if args.windows < len(results["meta"]["windows"]):      # report the first ones
            results["meta"]["windows"] = results["meta"]["windows"][:args.windows]
        report(results, by_name())
        return 0
    from bench.accuracy.runs import Study
    st = Study(args.model, args.context, args.windows, args.threads, device=args.device)
    print(f"loaded {st.src.model_id} ({st.family}: {st.L} layers, {st.H} KV heads, head_dim "
          f"{st.D}) in {st.load_s:.0f} s; {st.n_text_tokens} tokens of text", flush=True)
    cpath = st.calib_path()
    needs = any(c.tables for c in configs)
    if not (needs or args.calibrate):
        pass                                   # no configuration reads the calibration
    elif args.calibrate or not cpath.exists() or not st.calibration_complete(cpath):
        t0 = time.perf_counter()
        st.calibrate(cpath)
        print(f"calibration written to {cpath}, key tables to {st.tables_path()} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    else:
        st.load_calibration(cpath)
    results["meta"] = st.meta()
    runs = results.setdefault("runs", {})
    order = sorted(configs, key=lambda c: c.name != "fp16")       # fp16 first (reference)
    for w in st.windows:
        todo = [c for c in order if args.force
                or runs.get(f"{c.name}{w.name}", {}).get("key") != st.run_key(c, w)]
        if not todo:
            continue
        for c, r in zip(todo, st.evaluate(todo, w)):
            key = f"{c.name}{w.name}"
            r.update(key=st.run_key(c, w), name=c.name, group=c.group, note=c.note,
                     window=w.name, spec=c.spec())
            runs[key] = r
            print(f"{key:48s} bits {r['bits']:.3f} ppl {r['ppl']:.3f} kl {r['kl']:.4f} "
                  f"({r['seconds']:.0f} s)", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1))
    report(results, by_name())
    return 0


def _check_tasks(ap, args) -> int:
    study = [opt for opt, given in (("--windows", args.windows is not None), ("--context", args.context is not None),
                                    ("--peers", args.peers), ("--levers", args.levers),
                                    ("--calibrate", args.calibrate), ("--list", args.list),
                                    ("--v3-report", args.v3_report), ("--peers-report", args.peers_report),
                                    ("--levers-report", args.levers_report),
                                    ("--recount-bits", args.recount_bits)) if given]
    if study:
        ap.error(f"{', '.join(study)}: the perplexity study's option{'s' if len(study) > 1 else ''}, no meaning "
                 f"for --tasks (whole prompts, no windows; choose its policies with --policies or --only)")
    if args.only is not None and args.policies is not None:
        ap.error("--only and --policies both name the cache policies of --tasks: give one")
    opt = "--only" if args.only is not None else "--policies"
    given = args.only if args.only is not None else args.policies
    if given is not None and not given.strip():
        ap.error(f"{opt} is empty: name the cache policies (e.g. {','.join(TASK_POLICIES)}), or drop it for that set")
    args.policies = given or ",".join(TASK_POLICIES)
    args.backend = args.backend or TASK_BACKEND
    args.max_batch = TASK_MAX_BATCH if args.max_batch is None else args.max_batch
    if args.merge:
        if not args.merge.is_file():
            ap.error(f"--merge: no such file {str(args.merge)!r}")
        return run(args)
    if args.limit is not None and args.limit < 1:
        ap.error(f"--limit must be >= 1, got {args.limit}")
    if args.max_batch < 1:
        ap.error(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    if args.backend == "cuda" and args.device == "cpu":
        ap.error("--backend cuda needs --device cuda (the kernels attend to a model on the GPU)")
    if args.tables and not Path(args.tables).is_file():
        ap.error(f"--tables: no such file {args.tables!r}")
    from sim_models import CachePolicy
    specs = [s.strip() for s in args.policies.split(",")]
    for s in specs:
        try:
            CachePolicy.parse(s)
        except (ValueError, TypeError) as err:
            ap.error(f"{opt} {s!r}: {err}")
    from bench.accuracy.tasks import unique_specs
    kept = unique_specs(specs)
    dropped = list(specs)
    for s in kept:
        dropped.remove(s)                                   # the first of each name is kept
    if dropped:
        print(f"{opt}: {', '.join(map(repr, dropped))} name{'s' if len(dropped) == 1 else ''} a policy listed "
              f"before: run once", file=sys.stderr)
    args.policies = ",".join(kept)
    from sim_models.models import is_model_id, resolve
    if args.model_id is not None and not is_model_id(args.model_id):
        ap.error(f"--model-id must be lower case [a-z0-9._-], got {args.model_id!r}")
    try:
        resolve(args.model)
    except (ValueError, FileNotFoundError) as err:
        ap.error(f"{err}")
    return run(args)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.accuracy", description=__doc__.split("\n")[0])
    from sim_models.models import spec_help
    ap.add_argument("--model", default="smollm2-135m", help=f"{spec_help()} (default smollm2-135m)")
    ap.add_argument("--only", help="comma-separated configuration names (default: the "
                                   "leading ones, bench/accuracy/configs.py CONFIRM); with --tasks: "
                                   "the cache policy specs to run, as --policies")
    ap.add_argument("--peers", action="store_true",
                    help="run the peers and the study's v4 / v3 / v3-K4V3 (configs.PEER_STUDY)")
    ap.add_argument("--windows", type=int, help=f"evaluation windows, 1..4 (default {WINDOWS}; not with --tasks)")
    ap.add_argument("--context", type=int, help=f"tokens per window (default {CONTEXT}; not with --tasks)")
    ap.add_argument("--list", action="store_true", help="print configuration names")
    ap.add_argument("--force", action="store_true", help="recompute cached results")
    ap.add_argument("--calibrate", action="store_true", help="recompute the calibration file")
    ap.add_argument("--device", default="cpu", help="torch device of the model (cpu, cuda)")
    ap.add_argument("--v3-report", action="store_true",
                    help="the key-treatment plot of both models and the accuracy block of "
                         "docs/ACCURACY.md from the committed JSON")
    ap.add_argument("--peers-report", action="store_true",
                    help="the peers plot of every model (bench/results/accuracy/peers.png) and "
                         "the accuracy block of docs/ACCURACY.md from the committed JSON")
    ap.add_argument("--levers", action="store_true",
                    help="run the lever study and its references (configs.LEVER_STUDY)")
    ap.add_argument("--levers-report", action="store_true",
                    help="the levers plot of every model (bench/results/accuracy/levers.png) and "
                         "the accuracy block of docs/ACCURACY.md from the committed JSON")
    ap.add_argument("--recount-bits", action="store_true",
                    help="recount bits and bits_32k of every run in the committed results of every "
                         "model from its configuration (configs.BITS_RULE); no model runs")
    ap.add_argument("--report-only", action="store_true", help="tables and plot from the JSON")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    t = ap.add_argument_group("task quality (--tasks; bench/accuracy/tasks.py)",
                              "--only names the cache policies as --policies does; the study's --windows, "
                              "--context, --peers, --levers, --calibrate, --list, --recount-bits and --*-report "
                              "options exit 2 with --tasks (whole prompts, no windows), and these options without "
                              "it; a policy named twice (v4, V4 or its spec) runs once")
    t.add_argument("--tasks", action="store_true",
                   help="greedy answers to the checkable prompt set through the serving engine, per policy")
    t.add_argument("--policies", help=f"comma-separated cache policy specs (default {','.join(TASK_POLICIES)}; "
                                      "fp16 is run first in any case)")
    t.add_argument("--backend", choices=("golden", "cuda"),
                   help=f"the engine's packed store: golden (NumPy) or cuda (the kernels; --device cuda); "
                        f"default {TASK_BACKEND}")
    t.add_argument("--limit", type=int, help="the first N prompts of each kind (default all)")
    t.add_argument("--max-batch", type=int, help=f"requests decoded together (default {TASK_MAX_BATCH})")
    t.add_argument("--tables", help="key tables file (default bench/calib/<model id>.keytables.npz)")
    t.add_argument("--model-id", help="results key of the model (default the resolver's; a .gguf path on "
                                      "another machine names its alias with this)")
    t.add_argument("--out", help="results file (default bench/results/accuracy/<model id>_tasks.json)")
    t.add_argument("--merge", type=Path, help="merge a results file written elsewhere into the record")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        ap.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    if args.tasks:
        return _check_tasks(ap, args)
    task_only = [o for d, o in TASK_OPTIONS.items() if getattr(args, d) is not None]
    if task_only:
        ap.error(f"{', '.join(task_only)}: option{'s' if len(task_only) > 1 else ''} of --tasks; add --tasks "
                 f"or drop {'them' if len(task_only) > 1 else 'it'} (the perplexity study names configurations "
                 f"with --only)")
    args.windows = WINDOWS if args.windows is None else args.windows
    args.context = CONTEXT if args.context is None else args.context
    from bench.accuracy.windows import EVAL_CHARS
    if not 1 <= args.windows <= len(EVAL_CHARS):
        ap.error(f"--windows must be in 1..{len(EVAL_CHARS)}, got {args.windows}")
    if args.context < 64:
        ap.error(f"--context must be >= 64 tokens, got {args.context}")
    if args.threads < 1:
        ap.error(f"--threads must be >= 1, got {args.threads}")
    if sum(map(bool, (args.only, args.peers, args.levers))) > 1:
        ap.error("--only, --peers and --levers are exclusive")
    if args.only:
        try:
            by_name(args.only.split(","))
        except ValueError as err:
            ap.error(f"--only: {err}")
    if not (args.v3_report or args.peers_report or args.levers_report or args.recount_bits
            or args.list):
        from sim_models.models import resolve
        try:
            resolve(args.model)
        except (ValueError, FileNotFoundError) as err:
            ap.error(f"{err}")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
