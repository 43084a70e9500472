"""Task quality: greedy chat answers with checkable results, each cache policy against the 16-bit cache.

A fixed, versioned set of chat prompts (:func:`tasks`; :data:`VERSION`, fingerprint
:func:`fingerprint`) in three kinds, each with a checker:

* ``code``: a short Python function. The answer's first fenced code block is run against the task's
  asserts by :func:`run_code`: refused when it imports a module outside :data:`ALLOWED_MODULES` or
  names a builtin that reaches the system (:data:`DENIED_NAMES`); otherwise run in an isolated
  ``python -I`` subprocess in an empty temporary folder, with an audit hook that stops imports
  outside the list, writes, processes and sockets, CPU-time / memory / file-size limits, and a
  wall-clock timeout that kills it.
* ``number``: arithmetic and unit questions with one numeric answer; the answer's first number
  that the question does not write must equal it (:func:`check_number`).
* ``retrieval``: a fact with a number planted in a few hundred tokens of unrelated prose (at one of
  four depths), asked for at the end; the answer's first number must be the fact's
  (:func:`check_retrieval`).

Every prompt is one user message through the model's chat template, generated greedily by the
serving engine (:class:`gpu_ref.serve.Engine`; ``backend="golden"``: the NumPy golden model,
``"cuda"``: the kernels) until the end-of-turn token or the task's ``max_tokens``. Per policy:
the pass rate (per kind), and agreement with the 16-bit cache (``fp16``, run first): the share of
prompts whose generated tokens are identical, and the share with the same verdict. Bits per
element count every stored byte of the cache at 2048 tokens (:func:`gpu_ref.serve.cache_bytes`),
as the accuracy study counts them.

Run through the study's entry point::

    python -m bench.accuracy --tasks --model smollm2-135m                  # golden, CPU
    python -m bench.accuracy --tasks --model M.gguf --model-id smollm2-135m \\
        --backend cuda --device cuda --out OUT/smollm2-135m_tasks.json   # on a GPU machine
    python -m bench.accuracy --tasks --merge OUT/smollm2-135m_tasks.json   # here: into the record
    python -m bench.accuracy --tasks --report-only                         # the record's table

On a GPU machine the model file comes in two parts and the ``gguf`` wheel beside it, as
``python -m bench.gpu.hf prep`` writes and its module docstring describes; the key tables
(bench/calib/<model_id>.keytables.npz) travel with the tree.

Results: ``bench/results/accuracy/<model_id>_tasks.json`` (``runs[backend][policy]``; a run on
another backend is merged beside it); the doc block ``tasks`` of docs/ACCURACY.md
(``python -m bench.docs``).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "bench" / "results" / "accuracy"
CALIB_DIR = REPO / "bench" / "calib"

#: Version of the prompt set; change it with any change of a prompt, a test or a limit.
VERSION = 1
#: Policies of a default run (fp16 first: the reference of the agreement columns).
POLICIES = ("fp16", "v4", "v3", "v3-K4V3", "K3V3")
KINDS = ("code", "number", "retrieval")
#: Context length at which bits per element are counted (the accuracy study's).
BITS_CONTEXT = 2048

#: Modules an answer may import (pure computation).
ALLOWED_MODULES = frozenset({"math", "string", "re", "collections", "itertools", "functools", "operator",
                             "typing", "statistics", "fractions", "decimal", "heapq", "bisect"})
#: Builtins an answer may not name: they reach files, other code or the interpreter.
DENIED_NAMES = frozenset({"open", "exec", "eval", "compile", "__import__", "input", "breakpoint",
                          "globals", "vars", "getattr", "setattr", "delattr", "memoryview", "exit", "quit"})
#: Limits of one code run.
CODE_TIMEOUT_S = 10.0
CODE_CPU_S = 3
CODE_MEMORY_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class Task:
    """One prompt: ``id``, ``kind`` (:data:`KINDS`), the user message ``prompt``, ``max_tokens`` to
    generate, and the check: ``tests`` (code: assert statements) or ``answer`` (number, retrieval)."""

    id: str
    kind: str
    prompt: str
    max_tokens: int
    tests: tuple = ()
    answer: float | None = None


# ------------------------------------------------------------------------------------------- the set
_CODE_SUFFIX = " Reply with the code in one ```python block."
#: name(signature), what it does, asserts
_CODE = [
    ("add(a, b)", "returns the sum of a and b", ["add(2, 3) == 5", "add(-4, 4) == 0", "add(10, 15) == 25"]),
    ("square(x)", "returns x multiplied by itself", ["square(3) == 9", "square(-5) == 25", "square(0) == 0"]),
    ("is_even(n)", "returns True if the integer n is even and False otherwise",
     ["is_even(4) is True", "is_even(7) is False", "is_even(0) is True"]),
    ("reverse_string(s)", "returns the string s reversed",
     ["reverse_string('abc') == 'cba'", "reverse_string('') == ''", "reverse_string('racecar') == 'racecar'"]),
    ("list_sum(numbers)", "returns the sum of a list of numbers",
     ["list_sum([1, 2, 3]) == 6", "list_sum([]) == 0", "list_sum([-1, 1, 5]) == 5"]),
    ("maximum(numbers)", "returns the largest number in a non-empty list",
     ["maximum([1, 9, 3]) == 9", "maximum([-5, -2, -8]) == -2", "maximum([4]) == 4"]),
    ("count_vowels(s)", "returns the number of vowels (a, e, i, o, u) in the lowercase string s",
     ["count_vowels('hello') == 2", "count_vowels('xyz') == 0", "count_vowels('banana') == 3"]),
    ("factorial(n)", "returns the factorial of the non-negative integer n",
     ["factorial(0) == 1", "factorial(5) == 120", "factorial(3) == 6"]),
    ("celsius_to_fahrenheit(c)", "converts a temperature from Celsius to Fahrenheit",
     ["abs(celsius_to_fahrenheit(0) - 32) < 1e-9", "abs(celsius_to_fahrenheit(100) - 212) < 1e-9",
      "abs(celsius_to_fahrenheit(-40) + 40) < 1e-9"]),
    ("is_palindrome(s)", "returns True if the string s reads the same forwards and backwards",
     ["is_palindrome('level') is True", "is_palindrome('hello') is False", "is_palindrome('a') is True"]),
    ("absolute(x)", "returns the absolute value of the number x without using abs",
     ["absolute(-3) == 3", "absolute(4) == 4", "absolute(0) == 0"]),
    ("string_length(s)", "returns the number of characters in the string s",
     ["string_length('abc') == 3", "string_length('') == 0", "string_length('hello world') == 11"]),
    ("average(numbers)", "returns the average of a non-empty list of numbers",
     ["average([1, 2, 3]) == 2", "average([4]) == 4", "abs(average([1, 2]) - 1.5) < 1e-9"]),
    ("first_element(items)", "returns the first element of a non-empty list",
     ["first_element([7, 8, 9]) == 7", "first_element(['a']) == 'a'"]),
    ("to_upper(s)", "returns the string s in upper case",
     ["to_upper('abc') == 'ABC'", "to_upper('Hello') == 'HELLO'"]),
]

_NUMBER_SUFFIX = " Answer with the number."
#: question, answer
_NUMBER = [
    ("What is 2 + 3?", 5), ("What is 1 + 1?", 2), ("What is 10 + 10?", 20), ("What is 4 + 4?", 8),
    ("What is 5 + 5?", 10), ("What is 3 times 3?", 9), ("What is 10 minus 3?", 7),
    ("How many days are in a week?", 7), ("How many months are in a year?", 12),
    ("How many hours are in a day?", 24), ("How many minutes are in an hour?", 60),
    ("How many centimeters are in a meter?", 100), ("How many grams are in a kilogram?", 1000),
    ("How many legs does a spider have?", 8), ("How many sides does a triangle have?", 3),
    ("How many letters are in the English alphabet?", 26), ("How many degrees are in a right angle?", 90),
    ("At how many degrees Celsius does water boil at sea level?", 100),
]

#: The prose the retrieval facts are planted in (cycled, a sentence at a time).
_FILLER = [
    "The village sits at the edge of a quiet valley where a slow river bends around the hills.",
    "Every morning the baker opens his shop before sunrise and the smell of bread fills the street.",
    "In spring the fields turn green and farmers walk along the fences to check their sheep.",
    "The old library has wooden shelves that reach the ceiling and a ladder that rolls on a rail.",
    "Children play in the square after school while their parents talk on the benches.",
    "A narrow bridge of grey stone crosses the river near the mill, and carts pass over it slowly.",
    "In the evening the lamps are lit one by one and the windows glow yellow across the valley.",
    "The market on Saturday sells apples, cheese, honey and wool from the farms nearby.",
    "Travellers who stop at the inn are given soup, a warm bed and a map of the mountain paths.",
    "During winter the snow covers the roofs and the river freezes at its quiet edges.",
    "The church bell rings at noon and can be heard from every farm in the valley.",
    "Most people in the village know each other by name and greet one another on the road.",
]
#: (fact, question, its numeric answer)
_RETRIEVAL = [
    ("The locker number of Anna is 4127.", "What is the locker number of Anna?", 4127),
    ("The room number of Mr. Green is 317.", "What is the room number of Mr. Green?", 317),
    ("The code of the red box is 5823.", "What is the code of the red box?", 5823),
    ("The morning train leaves from platform 14.", "What is the platform number of the morning train?", 14),
    ("The house of Elena is at number 88 on Mill Street.", "At which number on Mill Street is the house of Elena?",
     88),
    ("The Falcons team scored 73 points in the final.", "How many points did the Falcons team score in the final?",
     73),
    ("The bag of Ivan weighs 640 grams.", "How many grams does the bag of Ivan weigh?", 640),
    ("The gold ticket costs 250 coins.", "How many coins does the gold ticket cost?", 250),
    ("The phone extension of the doctor is 7204.", "What is the phone extension of the doctor?", 7204),
    ("The north well is 36 meters deep.", "How many meters deep is the north well?", 36),
    ("The school bus has route number 406.", "What is the route number of the school bus?", 406),
    ("The secret number of Olga is 9351.", "What is the secret number of Olga?", 9351),
]
#: Filler sentences in a retrieval prompt; the fact goes after sentence 2, 8, 14 or 20 (by task).
_RETRIEVAL_SENTENCES = 24
_RETRIEVAL_DEPTHS = (2, 8, 14, 20)


def _retrieval_prompt(i: int, fact: str, question: str) -> str:
    text = []
    for s in range(_RETRIEVAL_SENTENCES):
        text.append(_FILLER[(s + i) % len(_FILLER)])
        if s == _RETRIEVAL_DEPTHS[i % len(_RETRIEVAL_DEPTHS)]:
            text.append(fact)
    return ("Read the text and answer the question.\n\n" + " ".join(text) + "\n\n" + question
            + " Answer with the number.")


def tasks() -> list[Task]:
    """The prompt set of :data:`VERSION`, in a fixed order (code, number, retrieval)."""
    out = []
    for i, (sig, what, tests) in enumerate(_CODE):
        out.append(Task(f"code-{i:02d}-{sig.split('(')[0]}", "code",
                        f"Write a Python function {sig} that {what}.{_CODE_SUFFIX}", 128, tests=tuple(tests)))
    for i, (q, a) in enumerate(_NUMBER):
        out.append(Task(f"number-{i:02d}", "number", q + _NUMBER_SUFFIX, 32, answer=a))
    for i, (fact, question, value) in enumerate(_RETRIEVAL):
        out.append(Task(f"retrieval-{i:02d}", "retrieval", _retrieval_prompt(i, fact, question), 24, answer=value))
    return out


def fingerprint(ts: list[Task] | None = None) -> str:
    """sha256 of the set (every field of every task): a results file names the set it measured."""
    ts = tasks() if ts is None else ts
    blob = json.dumps([dataclasses.asdict(t) for t in ts], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def select(ts: list[Task], limit: int | None) -> list[Task]:
    """The first ``limit`` tasks of each kind (all with None)."""
    if limit is None:
        return list(ts)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1 or None, got {limit!r}")
    seen: dict = {}
    out = []
    for t in ts:
        seen[t.kind] = seen.get(t.kind, 0) + 1
        if seen[t.kind] <= limit:
            out.append(t)
    return out


# ------------------------------------------------------------------------------------------ checkers
_NUM = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")


def numbers(text: str) -> list[float]:
    """The numbers written in ``text``, in order (thousands separators dropped; a leading minus kept)."""
    out = []
    for m in _NUM.finditer(text):
        s = m.group().rstrip(",").replace(",", "")
        try:
            out.append(float(s))
        except ValueError:
            continue
    return out


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def check_number(text: str, answer: float, question: str = "") -> tuple[bool, str]:
    """(pass, reason): the first number of ``text`` that ``question`` does not write equals ``answer``
    (so "3 times 5 is 15" and "1000 grams is 1 kilogram" pass, "10 minus 3 is 2" fails)."""
    asked = numbers(question)
    ns = [n for n in numbers(text) if not any(_same(n, q) for q in asked)]
    if not ns:
        return False, "no number in the answer (but the question's)"
    if _same(ns[0], answer):
        return True, "ok"
    return False, f"answered {ns[0]:g}, expected {answer:g}"


def check_retrieval(text: str, answer: float) -> tuple[bool, str]:
    """(pass, reason): the first number of ``text`` is the planted fact's value ``answer``."""
    ns = numbers(text)
    if not ns:
        return False, "no number in the answer"
    if _same(ns[0], answer):
        return True, "ok"
    return False, f"first number {ns[0]:g}, expected {answer:g}"


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(text: str) -> str | None:
    """The first fenced code block of ``text`` (an unterminated last block counts), or None."""
    m = _FENCE.search(text)
    return None if m is None else m.group(2)


def refusal(code: str) -> str | None:
    """Why ``code`` is refused before running (syntax, an import outside :data:`ALLOWED_MODULES`,
    a name of :data:`DENIED_NAMES`, a dunder attribute), or None."""
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        return f"syntax error: {err.msg} (line {err.lineno})"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mods = [node.module or "."] if node.level == 0 else ["."]
        else:
            mods = []
        bad = [m for m in mods if m.split(".")[0] not in ALLOWED_MODULES]
        if bad:
            return f"imports {bad[0]}"
        if isinstance(node, ast.Name) and node.id in DENIED_NAMES:
            return f"uses {node.id}"
        if isinstance(node, ast.Attribute) and node.attr.startswith("__") and node.attr.endswith("__"):
            return f"uses the attribute {node.attr}"
    return None


#: Run in the subprocess: reads {"code", "tests"} from stdin, stops imports outside the list, writes,
#: processes and sockets with an audit hook, runs the code and then each assert; prints one JSON line.
_RUNNER = r"""
import json, sys
job = json.loads(sys.stdin.read())
allowed = frozenset(job["allowed"])
blocked = ("os.", "subprocess.", "socket.", "shutil.", "ctypes.", "sys._getframe", "urllib.", "http.",
           "ftplib.", "smtplib.", "webbrowser.", "pty.", "fcntl.", "glob.", "sqlite3.", "resource.")
def hook(event, args):
    if event == "import":
        if str(args[0]).split(".")[0] not in allowed:
            raise PermissionError(f"import of {args[0]} blocked")
    elif event == "open":
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & 0o3):
            raise PermissionError("writing files blocked")
    elif event.startswith(blocked):
        raise PermissionError(f"{event} blocked")
out = sys.stdout
sys.addaudithook(hook)
env = {"__name__": "__answer__"}
try:
    exec(compile(job["code"], "<answer>", "exec"), env)
except BaseException as err:
    out.write(json.dumps({"ok": False, "reason": f"the code raised {type(err).__name__}: {err}"[:200]}) + "\n")
    raise SystemExit(0)
for t in job["tests"]:
    try:
        good = eval(compile(t, "<test>", "eval"), env)
    except BaseException as err:
        out.write(json.dumps({"ok": False, "reason": f"{t}: {type(err).__name__}: {err}"[:200]}) + "\n")
        raise SystemExit(0)
    if not good:
        out.write(json.dumps({"ok": False, "reason": f"failed: {t}"}) + "\n")
        raise SystemExit(0)
out.write(json.dumps({"ok": True, "reason": "ok"}) + "\n")
"""


def _limits():                                   # in the forked child, before exec (no imports there)
    resource.setrlimit(resource.RLIMIT_CPU, (CODE_CPU_S, CODE_CPU_S))
    resource.setrlimit(resource.RLIMIT_AS, (CODE_MEMORY_BYTES, CODE_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_code(code: str, tests, timeout: float = CODE_TIMEOUT_S) -> tuple[bool, str]:
    """(pass, reason): ``code`` refused (:func:`refusal`) or run in the sandbox (module docstring), then
    each expression of ``tests`` must be true. A run past ``timeout`` seconds is killed."""
    why = refusal(code)
    if why is not None:
        return False, f"refused: {why}"
    tests = list(tests)
    for t in tests:
        if not isinstance(t, str):
            raise TypeError(f"tests must be strings, got {t!r}")
        if refusal(t) is not None:                        # a test is an expression of the same language
            raise ValueError(f"test {t!r}: {refusal(t)}")
    job = json.dumps({"code": code, "tests": tests, "allowed": sorted(ALLOWED_MODULES)})
    with tempfile.TemporaryDirectory(prefix="fwht-kv-task-") as d:
        try:
            p = subprocess.run([sys.executable, "-I", "-S", "-c", _RUNNER], input=job, capture_output=True,
                               text=True, cwd=d, env={}, timeout=timeout, preexec_fn=_limits)
        except subprocess.TimeoutExpired:
            return False, f"killed: ran past {timeout:g} s"
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        if p.returncode < 0:
            return False, f"killed by signal {-p.returncode} (CPU {CODE_CPU_S} s, memory {CODE_MEMORY_BYTES >> 20} MiB)"
        return False, f"crashed: {tail}"[:200]
    r = json.loads(lines[-1])
    return bool(r["ok"]), r["reason"]


def check(task: Task, text: str) -> tuple[bool, str]:
    """(pass, reason) of the answer ``text`` to ``task``."""
    if task.kind == "code":
        code = extract_code(text)
        if code is None:
            return False, "no code block"
        return run_code(code, task.tests)
    if task.kind == "number":
        return check_number(text, task.answer, task.prompt)
    if task.kind == "retrieval":
        return check_retrieval(text, task.answer)
    raise ValueError(f"task {task.id}: kind must be one of {KINDS}, got {task.kind!r}")


# -------------------------------------------------------------------------------------------- runner
def prompt_ids(tok, task: Task) -> list[int]:
    """The token ids of ``task``'s chat prompt (as the server renders a chat request)."""
    text = tok.apply_chat_template([{"role": "user", "content": task.prompt}], add_generation_prompt=True,
                                   tokenize=False)
    return list(tok.encode(text, add_special_tokens=False))


def bits_per_element(config, spec: str, tokens: int = BITS_CONTEXT) -> float:
    """Stored bits per K/V element of a batch-1 cache of ``tokens`` tokens under ``spec``."""
    from gpu_ref.hf.cache import model_shape
    from gpu_ref.serve import cache_bytes
    from sim_models import CachePolicy
    n_layers, _, kvh, d = model_shape(config)
    return cache_bytes(config, CachePolicy.parse(spec), tokens) * 8 / (2 * n_layers * kvh * d * tokens)


def run_policy(model, tok, ts: list[Task], spec: str, *, backend: str = "golden", tables=None,
               max_batch: int = 16, log=print) -> dict:
    """Greedy answers to every task of ``ts`` under the cache policy ``spec`` through the serving engine;
    returns ``{"spec", "bits", "seconds", "generated_tokens", "answers": {task id: {"prompt_tokens", "tokens",
    "text", "pass", "reason"}}}``."""
    from gpu_ref.serve import Engine, SamplingParams
    from sim_models import CachePolicy
    pol = CachePolicy.parse(spec)
    eos = tok.eos_token_id
    stop = () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))
    ids = [prompt_ids(tok, t) for t in ts]
    blocks = sum(-(-(len(p) + t.max_tokens + pol.sinks) // 16) + 1 for p, t in zip(ids, ts))
    eng = Engine(model, pol, tables=tables if (pol.center_keys or pol.key_scale) else None, backend=backend,
                 block_size=16, num_blocks=blocks, max_batch=max_batch, max_queue=max(64, len(ts)))
    t0 = time.perf_counter()
    outs = eng.generate(ids, [SamplingParams(max_tokens=t.max_tokens, stop_token_ids=stop) for t in ts])
    gen_s = time.perf_counter() - t0
    answers = {}
    for t, p, o in zip(ts, ids, outs):
        text = tok.decode([i for i in o if i not in stop])
        ok, why = check(t, text)
        answers[t.id] = {"prompt_tokens": len(p), "tokens": [int(i) for i in o], "text": text, "pass": ok,
                         "reason": why}
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    r = {"spec": pol.spec, "bits": bits_per_element(cfg, spec), "seconds": gen_s,
         "generated_tokens": sum(len(o) for o in outs), "answers": answers}
    log(f"{spec:10s} {summary(r, ts)['pass']}/{len(ts)} pass, {r['generated_tokens']} tokens in {gen_s:.0f} s")
    return r


def summary(run: dict, ids, ref: dict | None = None) -> dict:
    """Pass counts (all and per kind: a task id starts with its kind) of ``run`` over the task ids
    ``ids``; with ``ref`` (the fp16 run) the counts of identical generated tokens and of the same verdict."""
    ans = run["answers"]
    ids = [getattr(i, "id", i) for i in ids]
    s = {"n": len(ids), "pass": sum(ans[i]["pass"] for i in ids)}
    for k in KINDS:
        mine = [i for i in ids if i.split("-")[0] == k]
        s[k] = (sum(ans[i]["pass"] for i in mine), len(mine))
    if ref is not None:
        ra = ref["answers"]
        s["same_tokens"] = sum(ans[i]["tokens"] == ra[i]["tokens"] for i in ids)
        s["same_verdict"] = sum(ans[i]["pass"] == ra[i]["pass"] for i in ids)
    return s


def unique_specs(specs) -> list[str]:
    """``specs`` without the ones that name a policy named before (the same parsed
    :class:`sim_models.CachePolicy`: ``v4`` and ``V4`` or ``K3V3+C+S4+KS2+W16``), the first name kept.

    Raises:
        ValueError: a spec :meth:`sim_models.CachePolicy.parse` refuses.
    """
    from sim_models import CachePolicy
    seen = {}
    for s in specs:
        seen.setdefault(CachePolicy.parse(s), s)
    return list(seen.values())


def run_tasks(model, tok, specs, *, ts: list[Task] | None = None, backend: str = "golden", tables=None,
              max_batch: int = 16, log=print) -> dict:
    """Every policy of ``specs`` over ``ts`` (default :func:`tasks`), each once (:func:`unique_specs`); fp16 is
    added first when missing. Returns ``{spec: run}`` (:func:`run_policy`)."""
    ts = tasks() if ts is None else ts
    specs = unique_specs(["fp16", *specs])
    return {s: run_policy(model, tok, ts, s, backend=backend, tables=tables, max_batch=max_batch, log=log)
            for s in specs}


# --------------------------------------------------------------------------------------- results file
def results_path(model_id: str) -> Path:
    return RESULTS_DIR / f"{model_id}_tasks.json"


def record(model_id: str, backend: str, device: str, runs: dict, ts: list[Task], extra: dict | None = None) -> dict:
    """A results document of one (model, backend) measurement."""
    return {"meta": {"model_id": model_id, "version": VERSION, "fingerprint": fingerprint(),
                     "tasks": [t.id for t in ts], "bits_context": BITS_CONTEXT, **(extra or {})},
            "runs": {backend: {"device": device, "policies": runs}}}


def _fp16_answers(run: dict):
    """The generated token ids of a backend run's ``fp16`` policy (None without one)."""
    f = run.get("policies", {}).get("fp16")
    return None if f is None else {k: a.get("tokens") for k, a in f.get("answers", {}).items()}


def write(doc: dict, path: Path) -> Path:
    """Write ``doc`` to ``path``, keeping what a file that measured the same prompt set holds: the other
    backends' runs, and on the same backend and device the other policies' runs when the new run's
    ``fp16`` answers are the old ones (the agreement columns compare every policy with them). A different
    prompt set, device or ``fp16`` answer replaces them."""
    path = Path(path)
    if path.exists():
        old = json.loads(path.read_text())
        om = old.get("meta", {})
        same = (om.get("fingerprint"), om.get("tasks")) == (doc["meta"]["fingerprint"], doc["meta"]["tasks"])
        if same:
            for b, r in doc["runs"].items():
                prev = old["runs"].get(b)
                if prev and prev.get("device") == r.get("device") and _fp16_answers(prev) == _fp16_answers(r):
                    r = {**r, "policies": {**prev["policies"], **r["policies"]}}
                old["runs"][b] = r
            old["meta"] = {**om, **doc["meta"]}
            doc = old
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def merge(src: Path) -> Path:
    """Merge a results file written elsewhere (``--out`` on a GPU machine) into the committed record."""
    doc = json.loads(Path(src).read_text())
    if doc.get("meta", {}).get("fingerprint") != fingerprint():
        raise ValueError(f"{src}: measured another prompt set (fingerprint {doc.get('meta', {}).get('fingerprint')}, "
                         f"this one {fingerprint()})")
    return write(doc, results_path(doc["meta"]["model_id"]))


# ---------------------------------------------------------------------------------------------- table
def table(doc: dict) -> str:
    """Markdown table of a results document: one row per (backend, policy)."""
    ids = doc["meta"]["tasks"]
    cols = ["backend (device)", "policy", "bits", "pass", *KINDS, "same tokens as fp16", "same verdict as fp16",
            "generation s"]
    rows = []
    for backend, b in doc["runs"].items():
        pols = b["policies"]
        ref = pols.get("fp16")
        for spec, r in pols.items():
            s = summary(r, ids, ref)
            n = s["n"]
            rows.append([f"{backend} ({b['device']})", f"`{spec}`", f"{r['bits']:.3f}", f"{s['pass']}/{n}",
                         *(f"{s[k][0]}/{s[k][1]}" for k in KINDS),
                         f"{s['same_tokens']}/{n}" if ref else "--", f"{s['same_verdict']}/{n}" if ref else "--",
                         f"{r['seconds']:.0f}"])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def doc_block(docs: dict) -> str:
    """The ``tasks`` block of docs/ACCURACY.md from ``{model_id: results document}``."""
    parts = []
    for mid, d in docs.items():
        m = d["meta"]
        parts.append(f"**{mid}** (prompt set version {m['version']}, {len(m['tasks'])} prompts, "
                     f"fingerprint `{m['fingerprint'][:12]}`; "
                     f"[record](../bench/results/accuracy/{mid}_tasks.json)):\n\n{table(d)}")
    return "\n\n".join(parts)


# ------------------------------------------------------------------------------------------- command
def main(args) -> int:
    """``python -m bench.accuracy --tasks`` (the parsed options of bench/accuracy/__main__.py)."""
    if args.merge:
        p = merge(args.merge)
        print(f"merged {args.merge} into {p}")
        return 0
    import torch
    from sim_models import KeyTables
    from sim_models.models import load, resolve
    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {args.device}: no CUDA GPU here (torch.cuda.is_available() is False); use --device cpu "
              "--backend golden", file=sys.stderr)
        return 2
    src = resolve(args.model)
    mid = args.model_id or src.model_id
    ts = select(tasks(), args.limit)
    specs = [s.strip() for s in args.policies.split(",") if s.strip()]
    t0 = time.perf_counter()
    model, tok = load(src)
    from gpu_ref.cli import has_chat_template
    if not has_chat_template(tok):
        print(f"--model {args.model}: its tokenizer has no chat template, and every task prompt is a chat turn; "
              "use an instruct (chat) model", file=sys.stderr)
        return 2
    model = model.to(args.device)
    tpath = Path(args.tables) if args.tables else CALIB_DIR / f"{mid}.keytables.npz"
    tables = KeyTables.load(tpath) if tpath.exists() else None
    print(f"loaded {mid} in {time.perf_counter() - t0:.0f} s; {len(ts)} prompts, policies {', '.join(specs)}, "
          f"backend {args.backend} on {args.device}", flush=True)
    runs = run_tasks(model, tok, specs, ts=ts, backend=args.backend, tables=tables, max_batch=args.max_batch,
                     log=lambda s: print(s, flush=True))
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    doc = record(mid, args.backend, device, runs, ts,
                 {"model": src.description, "threads": args.threads, "tables": tpath.name if tables else None})
    path = write(doc, Path(args.out) if args.out else results_path(mid))
    print(table(json.loads(path.read_text())))
    print(f"written {path} ({time.perf_counter() - t0:.0f} s in all)")
    return 0
