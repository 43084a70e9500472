"""The model resolver (sim_models.models) and the calibration command (sim_models.calibrate) on a tiny
synthetic Hugging Face folder (CPU, offline): the tables equal the accuracy study's statistics path."""

import numpy as np
import pytest

from sim_models import KeyTables
from sim_models import calibrate as cal
from sim_models.models import WHEELS, ModelSource, resolve

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

WORDS = [f"w{i}" for i in range(60)]


def _folder(tmp_path):
    """A tiny random Llama + word-level fast tokenizer saved as a Hugging Face folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    d = tmp_path / "Tiny-Llama"
    vocab = {w: i for i, w in enumerate(["[UNK]", *WORDS])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]").save_pretrained(d)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(d)
    return d


def _text(lines=80, seed=0):
    rng = np.random.default_rng(seed)
    return "\n".join(" ".join(rng.choice(WORDS, 6)) for _ in range(lines)) + "\n"


def test_resolver_forms_and_errors(tmp_path):
    d = _folder(tmp_path)
    src = resolve(str(d))
    assert isinstance(src, ModelSource) and src.model_id == "tiny-llama" and not src.is_gguf
    (tmp_path / "Some-Model.Q4.gguf").write_bytes(b"GGUF")
    g = resolve(str(tmp_path / "Some-Model.Q4.gguf"))
    assert g.is_gguf and g.model_id == "some-model.q4"
    assert set(WHEELS) == {"smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b"}
    for bad in ("no-such-alias", str(tmp_path / "missing.gguf"), str(tmp_path)):
        with pytest.raises(ValueError, match="--model .*not one of .*a .gguf file or a Hugging Face folder"):
            resolve(bad)
    with pytest.raises(ValueError, match="--model must be a non-empty string"):
        resolve("")


def test_calibrate_tiny_model_equals_the_study_statistics(tmp_path):
    """python -m sim_models.calibrate's tables == KeyTables.from_calibration of the statistics the
    accuracy study captures (bench.accuracy.attention.KVFakeQuant) on the same windows."""
    from bench.accuracy.attention import ATTN_NAME, KVFakeQuant, register
    from sim_models.models import load
    d = _folder(tmp_path)
    text = _text()
    out = tmp_path / "tiny.keytables.npz"
    assert cal.main(["--model", str(d), "--out", str(out), "--context", "24", "--text", _write(tmp_path, text)]) == 0
    got = KeyTables.load(out, model_id="tiny-llama", shape=(2, 2, 32))
    assert got.log2_s is not None and np.abs(got.log2_s).max() <= 4

    register()
    model, tok = load(resolve(str(d)), ATTN_NAME)
    ws = cal.TokenizedText(text, tok).calibration(24)
    fq = KVFakeQuant(2, 2, 32, capture=True, metrics=False, mu_skip=cal.MU_SKIP)
    with torch.no_grad(), fq:
        model.get_decoder()(input_ids=torch.from_numpy(np.stack([w.tokens for w in ws])), use_cache=False)
    want = KeyTables.from_calibration(cal.moments(fq.stats, 2), "tiny-llama")
    assert np.array_equal(got.mu.view(np.uint16), want.mu.view(np.uint16))
    assert np.array_equal(got.log2_s, want.log2_s)
    # mu is the mean key over the positions after the sinks
    acc = {}
    k = torch.randn(2, 2, 10, 32)
    cal.accumulate(acc, torch.randn(2, 4, 10, 32), k)
    assert acc["n"] == 2 * (10 - cal.MU_SKIP)
    assert np.allclose(acc["k"] / acc["n"], k[:, :, cal.MU_SKIP:].double().mean(dim=(0, 2)).numpy())


def _write(tmp_path, text):
    p = tmp_path / "text.txt"
    p.write_text(text)
    return str(p)


def test_read_text_orders_release_notes_by_version(tmp_path):
    for name, body in (("2.10.0.txt", "c"), ("2.9.5.txt", "b"), ("1.5.0.txt", "a")):
        (tmp_path / name).write_text(body)
    assert cal.read_text(tmp_path) == "a\n\nb\n\nc"
    assert cal.read_text(tmp_path / "2.9.5.txt") == "b"
    with pytest.raises(FileNotFoundError, match="text"):
        cal.read_text(tmp_path / "none")


@pytest.mark.parametrize("argv, word", [
    (["--model", "no-such-model", "--out", "t.npz"], "--model"),
    (["--model", "{folder}", "--out", "t.txt"], "--out"),
    (["--model", "{folder}", "--out", "t.npz", "--context", "3"], "--context"),
    (["--model", "{folder}", "--out", "t.npz", "--windows", "0"], "--windows"),
    (["--model", "{folder}", "--out", "t.npz", "--text", "/nonexistent"], "text"),
])
def test_calibrate_refuses_bad_arguments_before_loading(argv, word, tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as stop:
        cal.main([a.replace("{folder}", str(tmp_path)) for a in argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert word in err and "Traceback" not in err


def test_calibrate_function_checks_its_arguments():
    with pytest.raises(ValueError, match="context"):
        cal.calibrate("smollm2-135m", text="x", context=2)
    with pytest.raises(ValueError, match="windows"):
        cal.calibrate("smollm2-135m", text="x", windows=0)
    with pytest.raises(ValueError, match="no key/query statistics for layers \\[1\\]"):
        cal.moments({0: {"n": 1, "k": np.zeros(2), "k2": np.zeros(2), "q2": np.zeros(2)}}, 2)
