"""The accuracy study's model-independent parts: configurations, windows, baselines, --model.

(The model runs themselves need torch + transformers + a model wheel: `make accuracy`.)
"""

import numpy as np
import pytest

from bench.accuracy.configs import CONFIRM, RECOMMENDED, V2_DEFAULT, Config, by_name
from bench.accuracy.kvquant import Baseline, baseline_roundtrip, roundtrip
from sim_models import CachePolicy, FormatParams
from sim_models.calibrate import TokenizedText
from sim_models.models import resolve, slug


def test_table_names_unique_and_leading_known():
    names = [c.name for c in by_name()]
    assert len(names) == len(set(names))
    assert set(CONFIRM) <= set(names)
    assert {RECOMMENDED, V2_DEFAULT} <= set(names)
    with pytest.raises(ValueError, match="unknown configuration"):
        by_name(["no-such-config"])


@pytest.mark.parametrize("head_dim", [64, 256])
def test_v2_default_is_format_v2_at_head_dim(head_dim):
    (c,) = by_name([V2_DEFAULT])
    pol = c.policy(head_dim)
    assert pol == CachePolicy(k=FormatParams(n=head_dim), v=FormatParams(n=head_dim))
    assert c.bits(18, 1, head_dim, 2048) == pytest.approx(3.125)


def test_policy_bits_sinks_layers_and_baselines():
    (c,) = by_name(["midrise-max-near+C+S4+K4top4"])
    k_sens = np.arange(10.0)
    pol = c.policy(64, k_sens)
    assert pol.sinks == 4 and pol.center_keys
    assert [l for l, _ in pol.layer_k] == [6, 7, 8, 9]
    assert c.bits(10, 3, 64, 2048, k_sens) == pol.bits_per_element(10, 3, 64, 2048)
    with pytest.raises(ValueError, match="k_sens"):
        c.policy(64)
    (b,) = by_name(["int4-asym-DH"])
    assert b.policy(64) is None
    assert b.bits(30, 3, 64, 2048) == pytest.approx(4.5)
    assert len({c.spec_hash() for c in by_name()}) == len(by_name())


def test_baseline_roundtrip_error_bounded():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 64)).astype(np.float32)
    y = baseline_roundtrip(x, Baseline(4))
    # half a step of the 4-bit grid over each vector's range (+ fp16 rounding of scale, min)
    step = np.ptp(x, axis=-1) / 15
    assert (np.abs(y - x).max(axis=-1) <= 0.5 * step * 1.01 + 1e-2).all()
    yr = baseline_roundtrip(x, Baseline(4, rotate=True))
    rel = np.sum((yr - x) ** 2) / np.sum(x ** 2)
    assert 1e-4 < rel < 0.02          # rotated: Gaussian lanes, 4 bits, ~0.5% relative MSE
    assert not np.array_equal(yr, y)
    assert np.array_equal(roundtrip(x, None), x.astype(np.float16).astype(np.float32))
    with pytest.raises(ValueError, match="bits"):
        Baseline(0)


class _WordTokenizer:
    """Whitespace tokenizer with character offsets; BOS id 1 first when ``bos``."""

    def __init__(self, bos: bool):
        self.bos_token_id = 1 if bos else None
        self.bos = bos

    def __call__(self, text, add_special_tokens=True, return_offsets_mapping=False):
        import re
        spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
        ids = [2 + (hash(text[a:b]) % 1000) for a, b in spans]
        if add_special_tokens and self.bos:
            ids = [1] + ids
        out = {"input_ids": ids}
        if return_offsets_mapping:
            out["offset_mapping"] = spans
        return out


@pytest.mark.parametrize("bos", [False, True])
def test_windows_start_at_lines_and_skip_calibration(bos):
    text = "\n".join(f"line {i} has some words" for i in range(2000))
    tt = TokenizedText(text, _WordTokenizer(bos))
    cal = tt.calibration(64, count=2)
    assert cal[0].char_start == 0 and cal[1].char_start > cal[0].char_end - 30
    assert text[cal[1].char_start - 1] == "\n"
    w = tt.window(1000, 64)
    assert len(w.tokens) == 64 and text[w.char_start - 1] == "\n" and w.char_start >= 1000
    assert (w.tokens[0] == 1) == bos
    first = tt.ids[np.searchsorted(tt.starts, w.char_start)]
    assert w.tokens[1 if bos else 0] == first
    with pytest.raises(ValueError, match="tokens"):
        tt.window(len(text) - 10, 64)
    with pytest.raises(ValueError, match="overlaps"):
        tt.evaluation(8, 1, calib_end=cal[1].char_end, chars=(100,))
    ev = tt.evaluation(8, 2, calib_end=cal[1].char_end, chars=(30000, 20000))
    assert [w.char_start >= c for w, c in zip(ev, (30000, 20000))] == [True, True]
    with pytest.raises(ValueError, match="windows"):
        tt.evaluation(8, 3, calib_end=0, chars=(30000, 20000))


def test_model_argument_errors(tmp_path):
    assert slug("SmolLM2-135M-Instruct.Q4_1") == "smollm2-135m-instruct.q4_1"
    with pytest.raises(ValueError, match="--model"):
        resolve(str(tmp_path / "missing.gguf"))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert resolve(str(tmp_path / "m.gguf")).model_id == "m"
    d = tmp_path / "Qwen2-0.5B"
    d.mkdir()
    (d / "config.json").write_text("{}")
    assert resolve(str(d)).model_id == "qwen2-0.5b"


def test_v3_key_treatments_spec_scales_and_layers():
    """The key treatments appear in a spec only when used (earlier results keep
    their cache keys); calibrated key scales are powers of two / fp16 of geometric mean 1
    that follow the query / key energy ratio; boundary layers are the first and last."""
    import numpy as np
    from bench.accuracy.configs import V3_STUDY, by_name
    from bench.accuracy.kvquant import KEY_SCALE_LOG2_MAX, calibrated_key_scales
    old = by_name(["midrise-max-near+C+S4"])[0].spec()
    assert set(old) == {"k", "v", "sinks", "center", "layer_k", "reparam"}
    c = by_name(["v2+C+S4+KS2+SG+R4"])[0]
    assert c.spec()["key_scale"] == "qaware-pow2" and c.spec()["signs"] and c.spec()["rot"]
    pol = c.policy(64, np.zeros(30))
    assert (pol.key_scale, pol.key_signs, pol.key_rot) == ("pow2", True, True)
    assert by_name(["v2+C+S4+KS2+KB2"])[0].wide_layers(np.zeros(30)) == [0, 29]
    assert len(set(V3_STUDY)) == len(V3_STUDY)
    rng = np.random.default_rng(0)
    calib = {"k_energy": rng.uniform(0.01, 10, (2, 1, 64)),
             "q_energy": rng.uniform(0.01, 10, (2, 4, 64))}
    s2 = calibrated_key_scales("qaware-pow2", calib).astype(np.float64)
    e = np.log2(s2)
    assert np.array_equal(e, np.round(e)) and np.abs(e).max() <= KEY_SCALE_LOG2_MAX
    sf = calibrated_key_scales("qaware-fp16", calib).astype(np.float64)
    assert abs(np.log2(sf).mean()) < 0.01
    ratio = calib["q_energy"].mean(axis=1) / calib["k_energy"][:, 0]
    assert np.corrcoef(np.log2(ratio).ravel(), np.log2(sf[:, 0]).ravel())[0, 1] > 0.9
    with pytest.raises(ValueError, match="key_scale"):
        calibrated_key_scales("qaware", calib)


def test_selection_never_worse_than_default_on_calibration():
    import numpy as np
    from bench.accuracy.kvquant import select_head_transform
    from sim_models import FormatParams
    rng = np.random.default_rng(1)
    k = (rng.standard_normal((128, 64)) * np.linspace(0.1, 4, 64)).astype(np.float16)
    q = rng.standard_normal((256, 64)) * np.linspace(3, 0.1, 64)
    signs, rot, loss = select_head_transform((k, q.T @ q / len(q), FormatParams(n=64), 3))
    assert signs.shape == (64,) and rot.shape == (16, 4, 4)
    assert loss["signs_rot"] <= loss["signs"] <= loss["default"]


def test_passkey_prompt_places_the_needle():
    from bench.accuracy import passkey

    class Tok:
        bos_token_id = 1

        def __call__(self, s, add_special_tokens=True):
            return {"input_ids": [1] * add_special_tokens + [ord(ch) for ch in s]}

    ids, a = passkey.prompt(Tok(), 2000, 0.5, 12345)
    assert len(ids) <= 2000 and ids[0] == 1
    text = "".join(chr(i) for i in ids[1:])
    assert text.endswith(passkey.QUESTION + " 12345") and a == len(ids) - 6
    assert abs(text.index("The pass key is 12345") / len(text) - 0.5) < 0.05


@pytest.mark.parametrize("argv, word", [(["--windows", "0"], "--windows"), (["--windows", "5"], "--windows"),
                                        (["--context", "8"], "--context"), (["--threads", "0"], "--threads"),
                                        (["--only", "nope"], "--only"), (["--device", "banana"], "--device"),
                                        (["--tasks", "--device", "gpu0"], "--device"),
                                        (["--model", "/nope", "--report-only"], "--model")])
def test_accuracy_cli_refuses_bad_arguments_before_loading(argv, word, capsys):
    """python -m bench.accuracy: exit 2 naming the option, before any model is loaded."""
    from bench.accuracy.__main__ import main
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert word in err and "Traceback" not in err


class _ChatTokenizer(_WordTokenizer):
    """_WordTokenizer with a chat template, as ``python -m bench.gpu.hf prep`` uses."""

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        assert not tokenize
        return "".join(f"<{m['role']}> {m['content']}\n" for m in messages) + ("<assistant>" if add_generation_prompt else "")


def _study_text(lines: int = 40000) -> str:
    return "\n".join(f"line {i} has some words" for i in range(lines))


@pytest.mark.parametrize("bos", [False, True])
def test_hf_eval_window_is_the_studys_main_window(bos):
    """bench.gpu.hf's perplexity window is the accuracy study's first evaluation window."""
    from bench.accuracy.windows import EVAL_CHARS
    from bench.gpu.hf import eval_window
    text = _study_text()
    tok = _WordTokenizer(bos)
    ids = eval_window(tok, text, context=64)
    tt = TokenizedText(text, tok)
    start = text.index("\n", EVAL_CHARS[0] - 1) + 1 if text[EVAL_CHARS[0] - 1] != "\n" else EVAL_CHARS[0]
    first = tt.ids[np.searchsorted(tt.starts, start)]
    assert ids.dtype == np.int64 and len(ids) == 64
    assert (ids[0] == 1) == bos and ids[1 if bos else 0] == first
    with pytest.raises(ValueError, match="tokens"):
        eval_window(tok, text[:EVAL_CHARS[0] + 100], context=64)


def test_hf_prep_writes_tokens_and_gguf_parts(tmp_path, monkeypatch):
    """python -m bench.gpu.hf prep: the study's window, the chat prompt and the GGUF in two parts."""
    import hashlib

    import transformers

    import sim_models.calibrate as cal
    from bench.accuracy import smollm2
    from bench.gpu import hf
    gguf = tmp_path / "model" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(bytes(range(256)) * (3 << 16) + b"tail")          # 48 MiB + 4 bytes: two parts
    monkeypatch.setattr(smollm2, "gguf_path", lambda: gguf)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        staticmethod(lambda *a, **k: _ChatTokenizer(False)))
    monkeypatch.setattr(cal, "read_text", lambda path=None: _study_text())
    out = tmp_path / "out"
    assert hf.main(["prep", "--out", str(out)]) == 0
    toks = np.load(out / "tokens.npz")
    assert toks["eval"].shape == (hf.CONTEXT,) and toks["prompt"].dtype == np.int64
    assert len(toks["prompt"]) == len(hf.PROMPT.split()) + 2
    data = (out / "gguf.part1").read_bytes() + (out / "gguf.part2").read_bytes()
    assert data == gguf.read_bytes()
    assert (out / "gguf.sha256").read_text().split()[0] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("argv, word", [(["prep"], "--out"), (["floor"], "--data"),
                                        (["nope"], "cmd")])
def test_hf_cli_names_a_missing_option(argv, word, capsys):
    """python -m bench.gpu.hf: exit 2 naming what is missing, before any model is loaded."""
    from bench.gpu.hf import main
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert word in err and "Traceback" not in err


@pytest.mark.parametrize("argv, word", [(["--text", "t.txt", "--out", "o"], "--model"),
                                        (["--model", "/nope", "--text", "t.txt", "--out", "o"], "--model"),
                                        (["--model", "smollm2-135m"], "--text, --out")])
def test_accuracy_device_cli_takes_a_model_spec(argv, word, capsys):
    """python -m bench.accuracy.device: --model SPEC through the shared resolver; exit 2 naming
    what is missing, before any model is loaded."""
    from bench.accuracy.device import main
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert word in err and "Traceback" not in err


def test_accuracy_device_model_id_names_the_records(tmp_path, capsys, monkeypatch):
    """--model-id keys the device run's records (a GGUF file's own id is its stem); a bad id exits 2."""
    import bench.accuracy.device as dev
    (tmp_path / "config.json").write_text("{}")
    seen = []
    monkeypatch.setattr(dev, "device_main", lambda a, src: seen.append(src.model_id) or 0)
    base = ["--model", str(tmp_path), "--text", "t.txt", "--out", "o"]
    assert dev.main(base + ["--model-id", "smollm2-135m"]) == 0
    assert dev.main(base) == 0
    assert seen[0] == "smollm2-135m" and seen[1] != "smollm2-135m"
    with pytest.raises(SystemExit) as stop:
        dev.main(base + ["--model-id", "Bad Id"])
    assert stop.value.code == 2 and "--model-id" in capsys.readouterr().err


def test_accuracy_device_merge_of_passkey_trials_keeps_the_runs_record(tmp_path, monkeypatch):
    """--merge of a passkey-only device result adds its trials and leaves the runs' record (meta included)
    as it was; a result with runs replaces them by key and takes its meta."""
    import json
    import bench.accuracy.device as dev
    import bench.accuracy.runs as runs
    res, cal = tmp_path / "results", tmp_path / "calib"
    res.mkdir()
    cal.mkdir()
    monkeypatch.setattr(runs, "RESULTS_DIR", res)
    monkeypatch.setattr(runs, "CALIB_DIR", cal)
    rec = {"runs": {"a@0": {"ppl": 1.0}}, "meta": {"model_id": "m", "source": "wheel"}}
    (res / "m.json").write_text(json.dumps(rec))
    trial = {"retrieved": True, "depth": 0.5}
    out = tmp_path / "out" / "study_m.json"
    out.parent.mkdir()
    out.write_text(json.dumps({"meta": {"model_id": "m", "source": "file"}, "runs": {},
                               "passkey": {"v": {"2": trial}}, "device": "cuda"}))
    assert dev.merge(out) == 0
    assert json.loads((res / "m.json").read_text()) == rec
    assert json.loads((res / "m_passkey.json").read_text())["trials"] == {"v": {"2": trial}}
    out.write_text(json.dumps({"meta": {"model_id": "m", "source": "file"}, "runs": {"b@0": {"ppl": 2.0}}}))
    assert dev.merge(out) == 0
    got = json.loads((res / "m.json").read_text())
    assert got["runs"] == {"a@0": {"ppl": 1.0}, "b@0": {"ppl": 2.0}} and got["meta"]["source"] == "file"


def test_passkey_table_lists_every_configuration_with_trials():
    """One row per configuration with trials on any model; '--' where a model has none."""
    from bench.accuracy.report import passkey_table
    t = {"0": {"retrieved": True, "logp": -1.0}, "1": {"retrieved": False, "logp": -3.0}}
    models = {"a": {"passkey": {"trials": {"x": t}}}, "b": {"passkey": {"trials": {"y": {"0": t["0"]}}}},
              "c": {"passkey": {}}}
    rows = passkey_table(models).splitlines()
    assert rows[0] == "| configuration | a | b |"
    assert rows[2:] == ["| x | 1/2 (-2.00) | -- |", "| y | -- | 1/1 (-1.00) |"]
    assert passkey_table({"c": {"passkey": {}}}) == "(no passkey trials committed)"
