"""hw.options: one typed options object per top level, validated once, naming the field;
config names map to it and back; no module global of hw/ changes a netlist."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import hw
from hw.options import DecoderOptions, EncoderOptions, FoldOptions, RoundTripOptions
from rtl_gen.config import RTLConfig
from sim_models.params import FormatParams

REPO = Path(__file__).resolve().parent.parent

#: Module globals that once changed a netlist when reassigned; they are option fields now.
FORMER_GLOBALS = {"ifwht": ("FOLD_WINDOW", "FOLD_WINDOW_STEP", "FOLD_BRIDGE_REGS",
                            "FOLD_SHIFT_X_BITS"),
                  "tofloat": ("PACK_SHIFT_LOW_BITS", "LOD_SPLIT")}


def test_former_globals_are_gone():
    import hw.ifwht
    import hw.tofloat
    for mod, names in FORMER_GLOBALS.items():
        for name in names:
            assert not hasattr(getattr(hw, mod), name), f"hw.{mod}.{name}"


def test_no_module_global_is_reassigned():
    """Every module-level name of hw/ is bound once: a constant, never a setting that a
    caller reassigns (the options carry those)."""
    for path in sorted((REPO / "hw").glob("*.py")):
        tree = ast.parse(path.read_text())
        seen: dict[str, int] = {}
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                if isinstance(t, ast.Name):
                    seen[t.id] = seen.get(t.id, 0) + 1
        for fn in ast.walk(tree):
            if isinstance(fn, ast.Global):
                raise AssertionError(f"{path.name}: 'global {', '.join(fn.names)}'")
        twice = [n for n, k in seen.items() if k > 1]
        assert not twice, f"{path.name}: {twice} bound more than once"


def test_no_test_sets_a_hw_constant():
    """No test reassigns a module constant of hw/ (``monkeypatch.setattr(hw.mod,
    "NAME", ...)`` with an upper-case NAME): a netlist's settings travel as arguments
    (options, ``slice_bits``), never as module state."""
    found = []
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "setattr" and len(node.args) >= 2):
                continue
            target, name = node.args[0], node.args[1]
            if (ast.unparse(target).split(".")[0] == "hw" and isinstance(name, ast.Constant)
                    and isinstance(name.value, str) and name.value.isupper()):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(target)}.{name.value}")
    assert not found, found


@pytest.mark.parametrize("make,exc,word", [
    (lambda: EncoderOptions(fwht_regs=-1), ValueError, "fwht_regs"),
    (lambda: EncoderOptions(fwht_regs=True), TypeError, "fwht_regs"),
    (lambda: EncoderOptions(quant_regs=("bogus",)), ValueError, "quant_regs"),
    (lambda: EncoderOptions(fe_regs="emax"), TypeError, "fe_regs"),
    (lambda: EncoderOptions(tree_every=-1), ValueError, "tree_every"),
    (lambda: EncoderOptions(key_slots=-2), ValueError, "key_slots"),
    (lambda: EncoderOptions(lane_ram=2), ValueError, "lane_ram"),
    (lambda: EncoderOptions(flow="push"), ValueError, "flow"),
    (lambda: EncoderOptions(credit_extra=1), ValueError, "credit_extra"),
    (lambda: EncoderOptions(lanes=0), ValueError, "lanes"),
    (lambda: DecoderOptions(float_regs=("abs", "abs")), ValueError, "float_regs"),
    (lambda: DecoderOptions(dq_regs=("x",)), ValueError, "dq_regs"),
    (lambda: DecoderOptions(split_align=1), TypeError, "split_align"),
    (lambda: DecoderOptions(reset_copies=None), TypeError, "reset_copies"),
    (lambda: DecoderOptions(pack_shift_low_bits=-1), ValueError, "pack_shift_low_bits"),
    (lambda: DecoderOptions(lod_split=1.5), TypeError, "lod_split"),
    (lambda: DecoderOptions(fold=True), TypeError, "fold"),
    (lambda: FoldOptions(window_step=3), ValueError, "window_step"),
    (lambda: FoldOptions(shift_x_bits=-1), ValueError, "shift_x_bits"),
    (lambda: FoldOptions(align="yes"), TypeError, "align"),
    (lambda: RoundTripOptions(EncoderOptions(lanes=8), DecoderOptions()), ValueError, "lanes"),
    (lambda: RoundTripOptions(EncoderOptions(flow="credit"), DecoderOptions()), ValueError,
     "flow"),
    (lambda: RoundTripOptions(EncoderOptions(key_slots=2)), ValueError, "key_slots"),
])
def test_options_refuse_naming_the_field(make, exc, word):
    with pytest.raises(exc, match=word):
        make()


def test_checks_with_the_format_name_the_field():
    p = FormatParams(n=16, block=8)
    with pytest.raises(ValueError, match="fwht_regs"):
        EncoderOptions(fwht_regs=5).check(p)
    with pytest.raises(ValueError, match="lanes"):
        DecoderOptions(lanes=4).check(p)
    with pytest.raises(ValueError, match="fold.align"):
        DecoderOptions(fold=FoldOptions(align=True)).check(p)
    with pytest.raises(ValueError, match="key_slots"):
        EncoderOptions(key_slots=2).check(FormatParams(n=16, block=8, dtype="bf16"))
    assert EncoderOptions(key_slots=2, lanes=8).check(p).lanes == 8    # two beats
    assert EncoderOptions(fwht_regs=4).check(p) == EncoderOptions(fwht_regs=4)
    with pytest.raises(TypeError, match="EncoderOptions"):
        hw.KVEncoder(p, DecoderOptions())


def test_the_fold_options_change_the_netlist():
    """Each fold field reaches the hardware: a different value, a different Verilog."""
    from amaranth.back import verilog
    p = FormatParams(n=16, block=8)
    texts = set()
    for fold in (FoldOptions(align=True), FoldOptions(align=True, window=False),
                 FoldOptions(align=True, window_step=1), FoldOptions(align=True, shift_x_bits=1)):
        dut = hw.KVDecoder(p, DecoderOptions(fwht_regs=1, lanes=8, fold=fold))
        texts.add(verilog.convert(dut, name="d", emit_src=False))
    assert len(texts) == 4


def _all_names() -> list[str]:
    from rtl_gen.synth import SETS
    names = [c["config"] for c in json.loads(
        (REPO / "bench" / "results" / "synth.json").read_text())["configs"]]
    names += [n for plan in SETS.values() for n, _ in plan]
    return list(dict.fromkeys(names))


def test_every_recorded_name_parses_and_round_trips():
    """The names of the synthesis records and sets parse to options and back unchanged."""
    for name in _all_names():
        c = RTLConfig.parse(name)
        assert c.name == name
        assert RTLConfig.parse(c.name) == c


def test_name_letters_map_to_fields():
    c = RTLConfig.parse("dec_v2_n128_g64_b3_l6_p0_c0_w64_fa_rc")
    o = c.opts
    assert (o.fwht_regs, o.flow, o.credit_extra, o.lanes, o.fold.align, o.reset_copies,
            o.split_align) == (6, "credit", 0, 64, True, True, True)
    e = RTLConfig.parse("enc_v2_n16_g8_b3_l4_p1_k8").opts
    assert e.tree_every == 1 and e.key_slots == 8 and e.fe_regs == ("dec", "emax", "shamt", "align")
    rt = RTLConfig.parse("rt_v2_n64_g32_b3_l6_p2").opts
    assert rt.enc.tree_every == 2 and rt.dec.split_align and rt.dec.fwht_regs == 6
    # options without a letter have no name
    p = FormatParams(n=16, block=8)
    for opts in (DecoderOptions(fwht_regs=1, lod_split=1),
                 DecoderOptions(fwht_regs=1, float_regs=("abs",))):
        with pytest.raises(ValueError, match="name"):
            RTLConfig("decoder", p, opts).name


def test_cli_config_emits_the_named_design(tmp_path):
    """--config NAME writes the design the name states; option flags override it."""
    from rtl_gen.__main__ import main
    assert main(["--config", "dec_v2_n16_g8_b3_l1_w8_fa", "--out", str(tmp_path / "a")]) == 0
    man = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert man["kind"] == "decoder" and man["fold_align"] is True and man["top"] == "kv_decoder"
    assert main(["--config", "enc_v2_n16_g8_b3_l1", "--fwht-regs", "2",
                 "--out", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["fwht_latency"] == 2
    with pytest.raises(SystemExit):
        main(["--config", "enc_v2_n16_g8_b3_l1", "--n", "32", "--out", str(tmp_path / "c")])
    with pytest.raises(SystemExit):
        main(["--config", "enc_v2_n16_g8_b3_l1", "--float-regs", "abs",
              "--out", str(tmp_path / "d")])
