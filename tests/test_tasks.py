"""The task-quality prompt set (bench/accuracy/tasks.py): checkers, the code sandbox, the set's
determinism, and the runner on a tiny model through the serving engine."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench.accuracy import tasks as T  # noqa: E402


# ------------------------------------------------------------------------------ the set
def test_the_set_is_deterministic_and_well_formed():
    a, b = T.tasks(), T.tasks()
    assert a == b and T.fingerprint(a) == T.fingerprint(b)
    assert 30 <= len(a) <= 60
    assert len({t.id for t in a}) == len(a)
    assert {t.kind for t in a} == set(T.KINDS) and all(sum(t.kind == k for t in a) >= 10 for k in T.KINDS)
    for t in a:
        if t.kind == "code":
            assert t.tests and all(T.refusal(x) is None for x in t.tests)
        else:
            assert t.answer is not None
        if t.kind == "retrieval":          # the fact, once, in a few hundred words
            assert t.prompt.count(f"{t.answer:g}") == 1 and len(t.prompt.split()) > 250
    changed = [T.Task(**{**a[0].__dict__, "max_tokens": a[0].max_tokens + 1})] + a[1:]
    assert T.fingerprint(changed) != T.fingerprint(a)


def test_select_takes_the_first_of_each_kind():
    s = T.select(T.tasks(), 2)
    assert [t.kind for t in s] == ["code", "code", "number", "number", "retrieval", "retrieval"]
    assert T.select(T.tasks(), None) == T.tasks()
    with pytest.raises(ValueError, match="limit"):
        T.select(T.tasks(), 0)


def test_every_code_task_passes_a_correct_answer():
    """Hand-written reference solutions pass every code task's asserts (a test the set itself could fail)."""
    ref = {
        "add": "def add(a, b):\n    return a + b", "square": "def square(x):\n    return x * x",
        "is_even": "def is_even(n):\n    return n % 2 == 0",
        "reverse_string": "def reverse_string(s):\n    return s[::-1]",
        "list_sum": "def list_sum(numbers):\n    return sum(numbers)",
        "maximum": "def maximum(numbers):\n    return max(numbers)",
        "count_vowels": "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)",
        "factorial": "import math\ndef factorial(n):\n    return math.factorial(n)",
        "celsius_to_fahrenheit": "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32",
        "is_palindrome": "def is_palindrome(s):\n    return s == s[::-1]",
        "absolute": "def absolute(x):\n    return x if x >= 0 else -x",
        "string_length": "def string_length(s):\n    return len(s)",
        "average": "def average(numbers):\n    return sum(numbers) / len(numbers)",
        "first_element": "def first_element(items):\n    return items[0]",
        "to_upper": "def to_upper(s):\n    return s.upper()",
    }
    code = [t for t in T.tasks() if t.kind == "code"]
    assert {t.id.split("-", 2)[2] for t in code} == set(ref)
    for t in code:
        text = f"Here it is:\n\n```python\n{ref[t.id.split('-', 2)[2]]}\n```\n\nDone."
        assert T.check(t, text) == (True, "ok"), t.id


# ------------------------------------------------------------------------------ checkers
def test_code_checker_extracts_the_first_block_and_runs_the_asserts():
    t = next(t for t in T.tasks() if t.id.endswith("is_palindrome"))
    good = "Sure.\n```python\ndef is_palindrome(s):\n    return s == s[::-1]\n```\nAnd a second:\n```\nx = 1\n```"
    assert T.check(t, good) == (True, "ok")
    wrong = "```python\ndef is_palindrome(s):\n    return str(s) == str(s)\n```"       # always True
    ok, why = T.check(t, wrong)
    assert not ok and "is_palindrome('hello') is False" in why
    assert T.check(t, "def is_palindrome(s): return s == s[::-1]") == (False, "no code block")
    cut = "```py\ndef is_palindrome(s):\n    return s == s[::-1]\n"                 # cut by max_tokens
    assert T.check(t, cut) == (True, "ok")
    ok, why = T.check(t, "```python\ndef is_palindrome(s)\n    return s\n```")
    assert not ok and why.startswith("refused: syntax error")
    ok, why = T.check(t, "```python\ndef is_palindrome(s):\n    return s[::-1] == s.missing()\n```")
    assert not ok and "AttributeError" in why


@pytest.mark.parametrize("code,why", [
    ("import os\ndef f():\n    return os.listdir('.')", "refused: imports os"),
    ("from subprocess import run", "refused: imports subprocess"),
    ("import socket", "refused: imports socket"),
    ("def f():\n    return open('x', 'w')", "refused: uses open"),
    ("x = __import__('os')", "refused: uses __import__"),
    ("x = ().__class__.__base__.__subclasses__()", "refused: uses the attribute __subclasses__"),
])
def test_the_sandbox_refuses_system_access(code, why):
    assert T.run_code(code, []) == (False, why)


def test_the_sandbox_kills_a_loop_and_bounds_memory():
    t0 = time.perf_counter()
    ok, why = T.run_code("def f():\n    while True:\n        pass\nf()", [])
    assert not ok and why.startswith("killed") and time.perf_counter() - t0 < T.CODE_TIMEOUT_S + 5
    ok, why = T.run_code("x = [0] * (10 ** 10)", [])
    assert not ok and "MemoryError" in why


def test_the_sandbox_runtime_hook_stops_what_the_static_check_misses(tmp_path):
    """Past the refusal (the audit hook, the empty working folder, no file writes)."""
    import bench.accuracy.tasks as mod
    target = tmp_path / "written.txt"
    code = f"import io\nio.FileIO({str(target)!r}, 'w')"           # io is not on the list either
    assert T.run_code(code, []) == (False, "refused: imports io")
    # a module the list allows whose use would write: stopped by the hook at run time
    allowed = mod.ALLOWED_MODULES
    try:
        mod.ALLOWED_MODULES = allowed | {"io", "os"}
        ok, why = T.run_code(code, [])
        assert not ok and "blocked" in why and not target.exists()
        ok, why = T.run_code(f"import os\nos.system('touch {target}')", [])
        assert not ok and "blocked" in why and not target.exists()
    finally:
        mod.ALLOWED_MODULES = allowed


def test_number_checker_takes_the_first_number_the_question_does_not_write():
    q = "What is 6 times 7? Answer with the number."
    assert T.check_number("6 times 7 is 42.", 42, q) == (True, "ok")
    assert T.check_number("The answer is 3,000 grams.", 3000) == (True, "ok")
    assert T.check_number("1000 grams = 1 kilogram", 1000, "How many grams are in a kilogram?") == (True, "ok")
    assert T.check_number("12 times 7 is 72.", 84, "What is 12 times 7?") == (False, "answered 72, expected 84")
    assert T.check_number("2 days = 2 * 7 = 14 days", 48, "How many hours are in 2 days?") == \
        (False, "answered 7, expected 48")
    assert T.check_number("100 / 4 = 25.0", 25, "What is 100 divided by 4?") == (True, "ok")
    assert T.check_number("It is 6 times 7.", 42, q) == (False, "no number in the answer (but the question's)")
    assert T.check_number("-3", -3) == (True, "ok")
    for t in T.tasks():                        # no answer is one of its question's numbers
        if t.kind == "number":
            assert t.answer not in T.numbers(t.prompt)


def test_retrieval_checker_takes_the_first_number():
    t = next(t for t in T.tasks() if t.kind == "retrieval")
    assert T.check(t, f"The locker number of Anna is {t.answer:g}.") == (True, "ok")
    assert T.check(t, f"It is 1234, not {t.answer:g}.") == (False, f"first number 1234, expected {t.answer:g}")
    assert T.check(t, "Anna has a locker.") == (False, "no number in the answer")


# ------------------------------------------------------------------------------ runner
def test_runner_on_a_tiny_model_through_the_engine(tmp_path):
    """Two policies through the golden engine on a tiny random model: fp16 agrees with itself, the
    verdicts are the checkers' on the decoded text, the record merges another backend beside."""
    from test_hf import tiny
    from test_serve import CharTokenizer
    tok = CharTokenizer()
    ts = T.select(T.tasks(), 1)
    ts = [T.Task(**{**t.__dict__, "max_tokens": 6,
                    "prompt": t.prompt if t.kind != "retrieval" else t.prompt[-120:]}) for t in ts]
    m = tiny()
    runs = T.run_tasks(m, tok, ["K3V3"], ts=ts, max_batch=2, log=lambda s: None)
    assert list(runs) == ["fp16", "K3V3"]
    assert runs["fp16"]["bits"] == 16 and abs(runs["K3V3"]["bits"] - 3.125) < 0.01
    for r in runs.values():
        for t in ts:
            a = r["answers"][t.id]
            assert len(a["tokens"]) == 6 and a["text"] == tok.decode(a["tokens"])
            assert (a["pass"], a["reason"]) == T.check(t, a["text"])
    s = T.summary(runs["fp16"], ts, runs["fp16"])
    assert s["same_tokens"] == s["same_verdict"] == len(ts) and s["n"] == 3
    doc = T.record("tiny", "golden", "cpu", runs, ts)
    path = T.write(doc, tmp_path / "tiny_tasks.json")
    T.write(T.record("tiny", "cuda", "cuda", {"fp16": runs["fp16"]}, ts), path)
    got = json.loads(path.read_text())
    assert list(got["runs"]) == ["golden", "cuda"] and got["meta"]["fingerprint"] == T.fingerprint()
    table = T.table(got)
    assert table.count("\n") == 4 and "| golden (cpu) | `K3V3` | 3.125 |" in table


def test_merge_adds_a_backend_and_refuses_another_prompt_set(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "RESULTS_DIR", tmp_path / "acc")
    ids = [t.id for t in T.tasks()]
    ans = {i: {"tokens": [1, 2], "text": "x", "pass": i.startswith("code"), "reason": ""} for i in ids}
    run = {"spec": "fp16", "bits": 16.0, "seconds": 1.0, "answers": ans}
    T.write(T.record("m", "golden", "cpu", {"fp16": run}, T.tasks()), T.results_path("m"))
    src = tmp_path / "dev.json"
    T.write(T.record("m", "cuda", "H100", {"fp16": run}, T.tasks()), src)
    assert T.merge(src) == T.results_path("m")
    got = json.loads(T.results_path("m").read_text())
    assert set(got["runs"]) == {"golden", "cuda"} and got["runs"]["cuda"]["device"] == "H100"
    s = T.summary(got["runs"]["cuda"]["policies"]["fp16"], ids)
    nc, nn = (sum(t.kind == k for t in T.tasks()) for k in ("code", "number"))
    assert s["code"] == (nc, nc) and s["number"] == (0, nn) and s["pass"] == nc
    doc = json.loads(src.read_text())
    doc["meta"]["fingerprint"] = "0" * 64
    src.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="another prompt set"):
        T.merge(src)


def test_write_keeps_the_other_policies_of_the_same_reference(tmp_path):
    """A run of one more policy adds it beside the record's others when its fp16 answers are the record's;
    another fp16 answer or device replaces the backend's run (the agreement columns would mix references)."""
    ids = [t.id for t in T.tasks()]

    def run(spec, tokens):
        return {"spec": spec, "bits": 3.0, "seconds": 1.0,
                "answers": {i: {"tokens": tokens, "text": "x", "pass": False, "reason": ""} for i in ids}}
    path = tmp_path / "m_tasks.json"
    T.write(T.record("m", "golden", "cpu", {"fp16": run("fp16", [1]), "v3": run("v3", [2])}, T.tasks()), path)
    T.write(T.record("m", "golden", "cpu", {"fp16": run("fp16", [1]), "v4": run("v4", [3])}, T.tasks()), path)
    got = json.loads(path.read_text())["runs"]["golden"]["policies"]
    assert list(got) == ["fp16", "v3", "v4"] and got["v4"]["answers"][ids[0]]["tokens"] == [3]
    T.write(T.record("m", "golden", "cpu", {"fp16": run("fp16", [9]), "v4": run("v4", [3])}, T.tasks()), path)
    assert list(json.loads(path.read_text())["runs"]["golden"]["policies"]) == ["fp16", "v4"]
    T.write(T.record("m", "golden", "other", {"fp16": run("fp16", [9])}, T.tasks()), path)
    assert list(json.loads(path.read_text())["runs"]["golden"]["policies"]) == ["fp16"]


@pytest.mark.parametrize("argv, word", [(["--backend", "cuda"], "--backend cuda needs --device cuda"),
                                        (["--policies", "fp16,K9V3"], "--policies 'K9V3'"),
                                        (["--limit", "0"], "--limit"), (["--max-batch", "0"], "--max-batch"),
                                        (["--model-id", "Bad Name"], "--model-id"),
                                        (["--merge", "/nope.json"], "--merge"),
                                        (["--model", "/nope"], "--model"),
                                        (["--windows", "2"], "--windows: the perplexity study's option"),
                                        (["--context", "512", "--peers"], "--context, --peers: the perplexity"),
                                        (["--only", "fp16,K9V3"], "--only 'K9V3'"),
                                        (["--only", "v3", "--policies", "K3V3"], "--only and --policies")])
def test_cli_names_bad_options_before_loading(argv, word, capsys, monkeypatch):
    from bench.accuracy.__main__ import main
    monkeypatch.setattr(T, "main", lambda args: pytest.fail(f"{argv} ran the task runner"))
    with pytest.raises(SystemExit) as e:
        main(["--tasks", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert word in err and "Traceback" not in err


def test_cli_only_names_the_policies_of_the_task_run(tmp_path, monkeypatch):
    """--tasks --only SPECS runs those cache policies (as --policies does); without either, the default set."""
    import bench.accuracy.tasks as tasks_mod
    from bench.accuracy.__main__ import main
    (tmp_path / "config.json").write_text("{}")
    seen = []
    monkeypatch.setattr(tasks_mod, "main", lambda args: seen.append(args.policies) or 0)
    for argv in (["--only", "v3,K3V3"], ["--policies", "v3,K3V3"], []):
        assert main(["--tasks", "--model", str(tmp_path), *argv]) == 0
    assert seen == ["v3,K3V3", "v3,K3V3", ",".join(T.POLICIES)]


def test_cli_runs_a_policy_named_twice_once(tmp_path, monkeypatch, capsys):
    """Names of the same parsed policy (a preset in another case, a preset and its spec) run once, the first
    name kept; the library's run_tasks drops them the same way (fp16 and K16V16)."""
    import bench.accuracy.tasks as tasks_mod
    from bench.accuracy.__main__ import main
    (tmp_path / "config.json").write_text("{}")
    seen = []
    monkeypatch.setattr(tasks_mod, "main", lambda args: seen.append(args.policies) or 0)
    for argv in (["--policies", "v4,V4"], ["--policies", "v4,K3V3+C+S4+KS2+W16,K3V3"], ["--only", "K3V3,k3v3,K3V3"]):
        assert main(["--tasks", "--model", str(tmp_path), *argv]) == 0
    assert seen == ["v4", "v4,K3V3", "K3V3"]
    assert "'V4' names a policy listed before" in capsys.readouterr().err
    assert T.unique_specs(["fp16", "K16V16", "v3", "K3V3+C+S4+KS2", "V3", "v4"]) == ["fp16", "v3", "v4"]


def test_cli_refuses_a_model_without_a_chat_template(monkeypatch, capsys):
    """A base model (no chat template, as gemma3-270m's GGUF) exits 2 naming --model, before any run."""
    import sim_models.models as models
    from types import SimpleNamespace
    from bench.accuracy.__main__ import main
    tok = SimpleNamespace(apply_chat_template=lambda *a, **k: pytest.fail("rendered a chat turn"), chat_template=None)
    monkeypatch.setattr(models, "resolve", lambda spec: SimpleNamespace(model_id="base", description=spec))
    monkeypatch.setattr(models, "load", lambda src: (SimpleNamespace(to=lambda d: pytest.fail("moved the model")), tok))
    monkeypatch.setattr(T, "run_tasks", lambda *a, **k: pytest.fail("ran the tasks"))
    assert main(["--tasks", "--model", "base-model", "--policies", "fp16"]) == 2
    err = capsys.readouterr().err
    assert "--model base-model" in err and "no chat template" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, word", [(["--policies", "v4"], "--policies: option of --tasks"),
                                        (["--limit", "3", "--backend", "golden"], "--backend, --limit: options of --tasks"),
                                        (["--max-batch", "4"], "--max-batch"), (["--merge", "x.json"], "--merge"),
                                        (["--model-id", "m"], "--model-id"), (["--out", "o.json"], "--out"),
                                        (["--tables", "t.npz"], "--tables")])
def test_cli_refuses_task_options_without_tasks(argv, word, capsys, monkeypatch):
    """A task option without --tasks exits 2 naming it, before any study runs."""
    import bench.accuracy.__main__ as cli
    monkeypatch.setattr(cli, "run", lambda args: pytest.fail(f"{argv} ran the perplexity study"))
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and word in err and "Traceback" not in err


@pytest.mark.parametrize("opt", ["--policies", "--only"])
def test_cli_refuses_an_empty_policy_list(opt, capsys, monkeypatch):
    from bench.accuracy.__main__ import main
    monkeypatch.setattr(T, "main", lambda args: pytest.fail("ran the task runner"))
    for value in ("", " "):
        with pytest.raises(SystemExit) as e:
            main(["--tasks", opt, value])
        assert e.value.code == 2 and f"{opt} is empty" in capsys.readouterr().err
