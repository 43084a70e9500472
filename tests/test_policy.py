"""The cache policy's one spelling (CachePolicy.parse / .spec, presets) and what the GPU backend
declares it serves (gpu_ref.backend.supports); no GPU needed."""

import dataclasses
import re

import numpy as np
import pytest

from gpu_ref import backend
from sim_models import CachePolicy, FormatParams
from sim_models.keyscale import LOG2_S_RANGE
from sim_models.policy import MAX_TOKENS, POLICY_PRESETS


# ------------------------------------------------------------------------- parse / spec
@pytest.mark.parametrize("spec", ["K3V3", "K4V3", "K16V16", "K3V16", "K3V3+C", "K3V3+S4", "K3V3+C+S4+KS2",
                                  "K4V3+C+S4+KSf+SG+R4", "K3V3+K4@0,1", "K3V3+K16@0+V4@1,2",
                                  "K2V4+C+S64+KS2+K4@3+V3@0", "K3V3+C+S4+KS2+W16", "K3V3+W1"])
def test_spec_round_trips(spec):
    p = CachePolicy.parse(spec)
    assert p.spec == spec
    assert CachePolicy.parse(p.spec) == p
    assert CachePolicy.parse(spec.lower()) == p


def test_parse_sets_the_named_fields():
    p = CachePolicy.parse("K4V3+C+S4+KSf+SG+R4+K16@0+V4@1,2")
    assert (p.k.bits, p.v.bits, p.sinks, p.center_keys, p.key_scale, p.key_signs, p.key_rot) == (
        4, 3, 4, True, "fp16", True, True)
    assert p.format_for(0, "k") is None and p.format_for(2, "v").bits == 4 and p.format_for(0, "v").bits == 3
    assert CachePolicy.parse("fp16") == CachePolicy(k=None, v=None)
    base = FormatParams(n=128, block=32, mode="midtread")
    q = CachePolicy.parse("K4V3+K3@1", base)
    assert q.k == dataclasses.replace(base, bits=4) and q.format_for(1, "k") == dataclasses.replace(base, bits=3)


def test_presets_are_objects_and_parse_to_them():
    for name, pol in POLICY_PRESETS.items():
        assert isinstance(pol, CachePolicy)
        assert CachePolicy.preset(name) is pol and CachePolicy.parse(name) is pol
        assert CachePolicy.parse(pol.spec) == pol
    assert CachePolicy.preset("v3").spec == "K3V3+C+S4+KS2"
    rebased = CachePolicy.parse("v3", FormatParams(n=128))
    assert rebased.k.n == 128 and rebased.sinks == 4
    with pytest.raises(ValueError, match="policy preset must be one of"):
        CachePolicy.preset("v5")
    assert CachePolicy.preset("v4") == CachePolicy.parse("K3V3+C+S4+KS2+W16")


def test_recent_ring_is_counted_beside_the_codes():
    """The ring's fp16 rows are stored beside the codes of the same tokens (both counted); at
    contexts shorter than sinks + ring every token after the sinks is in the ring."""
    v3, v4 = CachePolicy.preset("v3").fit(128), CachePolicy.preset("v4").fit(128)
    shape = (28, 2, 128)
    for ctx in (1, 3, 4, 5, 20, 2048, 131072):
        ring = min(16, max(ctx - 4, 0))
        assert v4.stored_bits(*shape, ctx) - v3.stored_bits(*shape, ctx) == 28 * 2 * 2 * ring * 16 * 128
    assert round(v4.bits_per_element(*shape, 2048), 3) == 3.275
    with pytest.raises(ValueError, match=r"recent must be an int in \[0, 2\*\*31 - 1\]"):
        CachePolicy(recent=-1)
    # positions are int32: the bound itself is a valid policy, one more is refused, for both counts
    assert CachePolicy.parse(f"K3V3+S{MAX_TOKENS}+W{MAX_TOKENS}").recent == MAX_TOKENS == 2**31 - 1
    for name in ("sinks", "recent"):
        with pytest.raises(ValueError, match=f"{name} must be an int in"):
            CachePolicy(**{name: MAX_TOKENS + 1})
    with pytest.raises(ValueError, match="field recent is set twice"):
        CachePolicy.parse("K3V3+W4+W8")


def test_recent_ring_is_counted_for_packed_kinds_only():
    """A 16-bit kind reads its own rows (no fp16 copies): fp16+W16 stores what fp16 stores, K3V16+W16
    counts the ring for keys only, a 16-bit override layer none; an override past the model's layers is
    refused."""
    shape, ctx = (4, 2, 64), 100
    bits = lambda spec: CachePolicy.parse(spec).fit(64).stored_bits(*shape, ctx)  # noqa: E731
    assert bits("fp16+W16") == bits("fp16") == 2 * 4 * 2 * 64 * ctx * 16
    ring = 4 * 2 * 16 * 16 * 64                                  # layers x heads x rows x fp16 x head_dim
    assert bits("K3V16+W16") - bits("K3V16") == ring
    assert bits("K3V3+W16") - bits("K3V3") == 2 * ring
    assert bits("K3V3+W16+K16@0+V16@0") - bits("K3V3+K16@0+V16@0") == 2 * ring * 3 // 4
    with pytest.raises(ValueError, match=r"policy.layer_v names layers \[4\], the model has 4 \(layers 0-3\)"):
        bits("K3V3+V4@1,4")


@pytest.mark.parametrize("spec, words", [
    ("", "non-empty"),
    ("K3", "first term .*fields k, v"),
    ("K3V3+X", "unknown term 'X'"),
    ("K3V3+S-1", r"term 'S-1' sets sinks: write S<n> with n >= 0"),
    ("K3V3+W-1", r"term 'W-1' sets recent: write W<n> with n >= 0"),
    ("K3V3+W", r"term 'W' sets recent: write W<n>"),
    ("K3V3+S", r"term 'S' sets sinks: write S<n>"),
    ("K3V3+W99999999999999999999", r"recent must be an int in \[0, 2\*\*31 - 1\]"),
    ("K3V3+S2147483648", r"sinks must be an int in \[0, 2\*\*31 - 1\]"),
    ("K3V3+W\u0663", "term 'W\u0663' sets recent: .*ASCII digits"),
    ("K3V3+S\uff11\uff16", "sets sinks: .*ASCII digits"),
    ("K\u0663V3", "first term must be K<b>V<b>"),
    ("K3V3+K4@\u0663", "K<b>@lo-hi"),
    ("K3V3+V4@1-\uff13", "K<b>@lo-hi"),
    ("K9V3", "term 'K9V3' sets k: bits"),
    ("K3V9", "term 'K3V9' sets v: bits"),
    ("K3V3+K5@1", "term 'K5@1' sets layer_k: bits"),
    ("K3V3+C+C", "field center_keys is set twice"),
    ("K3V3+KS2+KSf", "field key_scale is set twice"),
    ("K3V3+S4+S2", "field sinks is set twice"),
    ("K3V3+K4@1+K4@1", "layer_k layers must be distinct"),
    ("v3+S8", r"stands alone; write the terms out instead \(v3 = K3V3\+C\+S4\+KS2\)"),
    ("V4+W32", r"stands alone; .*\(v4 = K3V3\+C\+S4\+KS2\+W16\)"),
    ("K3V3+KSf+KSf", "term 'KSf'"),
    ("K3V3+Foo", "unknown term 'Foo'"),
    ("v1", "'v1' is a per-vector format preset .*not a cache policy"),
    ("K3V3+K4@3-1", "layer range '3-1' is empty"),
    ("K3V3+K4@a", "K<b>@lo-hi"),
])
def test_parse_errors_name_the_field(spec, words):
    with pytest.raises(ValueError, match=words):
        CachePolicy.parse(spec)


def test_parse_accepts_layer_ranges():
    p = CachePolicy.parse("K3V3+K4@0-3,7+V4@2-2")
    assert [l for l, _ in p.layer_k] == [0, 1, 2, 3, 7] and [l for l, _ in p.layer_v] == [2]
    assert p == CachePolicy.parse("K3V3+K4@0,1,2,3,7+V4@2")
    assert all(f.bits == 4 for _, f in p.layer_k)


def test_spec_refuses_formats_a_spec_cannot_state():
    with pytest.raises(ValueError, match="differ in block"):
        CachePolicy(k=FormatParams(block=32), v=FormatParams()).spec
    with pytest.raises(TypeError, match="base"):
        CachePolicy.parse("K3V3", base={"n": 64})


# ------------------------------------------------------------------------- backend capabilities
def test_backend_declares_the_kernels_once():
    cuda = backend.CUDA
    lo, hi = LOG2_S_RANGE
    # s = 2^e and the query factor 2^-e both normal fp16
    assert cuda.key_scale_log2 == (max(lo, -hi), min(hi, -lo)) == (-14, 14)
    from gpu_ref import decode
    assert (decode.DECODE_N, decode.DECODE_G, decode.DECODE_BITS, decode.MAX_SINKS) == (
        cuda.head_dims, cuda.blocks, cuda.bits, cuda.max_sinks)
    assert [pg for pg in (8, 16, 24, 32, 48, 64, 96, 128, 256) if cuda.page_size_ok(pg)] == [16, 32, 64, 128, 256]


def test_supports_serves_the_presets():
    for name, pol in POLICY_PRESETS.items():
        for d in backend.CUDA.head_dims:
            assert backend.supports(pol, d, "fp16") == (), (name, d)
    assert backend.supports(CachePolicy(), 128, "bf16") == ()
    assert backend.supports(CachePolicy(k=None, v=None), 80, "fp16") == ()      # nothing packed


@pytest.mark.parametrize("policy, head_dim, dtype, words", [
    (CachePolicy(), 32, "fp16", [r"k\.n=32 \(head_dim\)", r"v\.n=32 \(head_dim\)"]),
    (CachePolicy(), 80, "fp16", ["head_dim=80"]),
    (CachePolicy.parse("K2V3"), 64, "fp16", [r"k\.bits=2"]),
    (CachePolicy.parse("K3V16"), 64, "fp16", ["both packed or both 16-bit"]),
    (CachePolicy.parse("K3V3+K16@2"), 64, "fp16", ["layer 2 k/v: both packed"]),
    (CachePolicy.parse("K3V3+S65"), 64, "fp16", ["sinks=65"]),
    (CachePolicy.parse("K3V3+S4+W61"), 64, "fp16", [r"sinks=4 \+ recent=61: .* at most 64"]),
    (CachePolicy.parse("K3V3+KSf"), 64, "fp16", ["key_scale='fp16'"]),
    (CachePolicy.parse("K3V3+SG+R4"), 64, "fp16", ["key_signs", "key_rot"]),
    (CachePolicy.parse("K3V3+C"), 64, "bf16", ["dtype='bf16': the key front end"]),
    (CachePolicy(), 64, "fp32", ["dtype='fp32'"]),
    (CachePolicy(k=FormatParams(mode="lloydmax"), v=FormatParams(mode="lloydmax")), 64, "fp16",
     [r"k\.mode='lloydmax'", r"v\.mode='lloydmax'"]),
    (CachePolicy(k=FormatParams(block=32), v=FormatParams()), 128, "fp16", [r"k\.block != v\.block"]),
])
def test_supports_returns_named_reasons(policy, head_dim, dtype, words):
    reasons = backend.supports(policy, head_dim, dtype, n_layers=4)
    assert reasons, "expected a reason"
    text = "; ".join(reasons)
    for w in words:
        assert any(re.search(w, r) for r in reasons), (w, text)
    with pytest.raises(ValueError, match="backend 'cuda' cannot serve policy"):
        backend.check(policy, head_dim, dtype, n_layers=4)


def test_supports_checks_types_and_exponents():
    with pytest.raises(TypeError, match="CachePolicy"):
        backend.supports("K3V3", 64)
    assert backend.CUDA.log2_scale_reasons(np.array([-14, 0, 14])) == []
    assert "e in [-14, 14]" in backend.CUDA.log2_scale_reasons(np.array([15]))[0]


def test_kvcache_refuses_what_the_backend_refuses_without_a_gpu():
    """KVCache checks through the backend (and the key tables) before it needs CuPy."""
    import gpu_ref
    from sim_models import KeyTables
    with pytest.raises(ValueError, match="sinks=65"):
        gpu_ref.KVCache(1, 1, 16, "K3V3+S65")
    with pytest.raises(ValueError, match=r"k\.bits=2"):
        gpu_ref.KVCache(1, 1, 16, "K2V3")
    with pytest.raises(ValueError, match="16-bit"):
        gpu_ref.KVCache(1, 1, 16, "K16V16")
    with pytest.raises(ValueError, match="reads key tables"):
        gpu_ref.KVCache(1, 2, 16, "v3")
    mu = np.zeros((1, 2, 128), np.float16)
    with pytest.raises(ValueError, match="shape"):
        gpu_ref.KVCache(1, 3, 16, "v3", tables=KeyTables("m", mu, np.zeros((1, 2, 128), np.int8)))
    with pytest.raises(ValueError, match="have none"):
        gpu_ref.KVCache(1, 2, 16, "v3", tables=KeyTables("m", mu))
    with pytest.raises(ValueError, match=r"e in \[-14, 14\]"):
        gpu_ref.KVCache(1, 2, 16, "v3", tables=KeyTables("m", mu, np.full((1, 2, 128), 15, np.int8)))
    with pytest.raises(TypeError, match="KeyTables"):
        gpu_ref.KVCache(1, 2, 16, "v3", tables={"mu": mu})
    with pytest.raises(TypeError, match="policy"):
        gpu_ref.KVCache(1, 2, 16, FormatParams())
    with pytest.raises(ValueError, match="layer"):
        gpu_ref.KVCache(1, 2, 16, "v3", layer=-1)


def test_gpu_ref_exports_no_tuning_internals():
    import gpu_ref
    assert not {"DECODE_TUNE", "ENCODE_TUNE", "decode_kernel_params", "launch_encode"} & set(gpu_ref.__all__)
    assert {"KVCache", "plan", "run", "run_planes", "supports", "CUDA"} <= set(gpu_ref.__all__)
    from gpu_ref.decode import DECODE_TUNE, kernel_params  # noqa: F401 - still importable from their modules
    from gpu_ref.encode import ENCODE_TUNE, launch_encode  # noqa: F401


def test_format_md_preset_table_states_every_preset():
    """docs/FORMAT.md 8's preset table: one row per preset with its spec and its bits at 2048 and
    128K tokens (head_dim 128), and the recommended row is v4."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md").read_text()
    head = "| preset | spec | keys / values | front end | sinks | ring | bits (T = 2048) | bits (T = 128K) |"
    assert text.count(head) == 1
    got = {}
    for line in text.split(head)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        m = re.fullmatch(r"(\*\*)?`([\w-]+)`(?: \(recommended\)\*\*)?", cells[0])
        got[m.group(2)] = (m.group(1), cells[1].strip("`"), int(cells[4]), int(cells[5]), float(cells[6]),
                           float(cells[7]))
    assert set(got) == set(POLICY_PRESETS)
    for name, pol in POLICY_PRESETS.items():
        bold, spec, sinks, ring, b2k, b128k = got[name]
        assert spec == pol.spec and (sinks, ring) == (pol.sinks, pol.recent) and bool(bold) == (name == "v4")
        p = pol.fit(128)
        assert round(p.bits_per_element(28, 2, 128, 2048), 3) == b2k
        assert round(p.bits_per_element(28, 2, 128, 131072), 3) == b128k
    # the spec grammar table has a row for every term the parser takes
    for term in ("`K<b>V<b>` (first)", "`C`", "`S<n>`", "`W<n>`", "`KS2`", "`KSf`", "`SG`", "`R4`"):
        assert f"| {term} |" in text
