"""Tests of the Verilog generator rtl_gen: files, manifest, CLI, errors, lint."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

import rtl_gen
from hw.decoder import FLOAT_CUTS
from hw.options import DecoderOptions, EncoderOptions, RoundTripOptions
from hw.frontend import FE_CUTS
from hw.keyfold import FOLD_CUTS
from hw.quantizer import QUANT_CUTS
from rtl_gen.__main__ import main as cli_main
from sim_models import FORMAT_VERSION, FormatParams, sign_mask_int

#: Register stages outside the FWHT with the default placements: encoder front-end
#: cuts, front-end register, quantizer cuts, output register (8); decoder dequant
#: register, float registers, output register (3).
ENC_FIXED = len(FE_CUTS.default) + 2 + len(QUANT_CUTS.default)
DEC_FIXED = 2 + len(FLOAT_CUTS.default)

PORTS = {  # name: (dir, width) for the default configuration
    "clk": ("input", 1), "rst": ("input", 1),
    "i__valid": ("input", 1), "i__ready": ("output", 1), "i__payload": ("input", 2048),
    "o__valid": ("output", 1), "o__ready": ("input", 1), "o__payload": ("output", 403),
    "status": ("output", 3), "status_clear": ("input", 1),
}


def verilog_ports(text: str, top: str) -> dict:
    body = text[text.index(f"module {top}("):]
    body = body[:body.index("endmodule")]
    ports = {}
    for d, msb, name in re.findall(r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+)\s*;", body, re.M):
        ports[name] = (d, int(msb) + 1 if msb else 1)
    return ports


@pytest.fixture(scope="module")
def default_gen(tmp_path_factory):
    out = tmp_path_factory.mktemp("rtl_default")
    man = rtl_gen.generate("encoder", FormatParams(), out, EncoderOptions(fwht_regs=2))
    return out, man


def test_default_files_and_manifest(default_gen):
    out, man = default_gen
    v = (out / "kv_encoder.v").read_text()
    assert verilog_ports(v, "kv_encoder") == PORTS
    disk = json.loads((out / "manifest.json").read_text())
    assert disk == man
    p = FormatParams()
    assert man["params"] == p.to_dict()
    assert man["format_version"] == FORMAT_VERSION
    assert man["top"] == "kv_encoder" and man["verilog"] == "kv_encoder.v"
    assert man["latency_cycles"] == 2 + ENC_FIXED == 10 == sum(man["latency_breakdown"].values())
    assert man["latency_breakdown"]["fwht"] == 2
    assert man["quant_register_cuts"] == list(QUANT_CUTS.default)
    assert man["frontend_register_cuts"] == list(FE_CUTS.default)
    assert man["fwht_register_after_stages"] == [4, 7]
    assert {k: (d["dir"], d["width"]) for k, d in man["ports"].items()} == PORTS
    assert man["o_payload"]["fields"] == {
        "codes": {"offset": 0, "width": 384},
        "scales": {"offset": 384, "width": 16},
        "flags": {"offset": 400, "width": 3},
    }
    assert int(man["sign_mask_hex"], 16) == sign_mask_int(128, 0)
    assert len(man["sign_mask_hex"]) == 32
    assert man["amaranth_version"].startswith("0.5")
    assert "/work/" not in v      # no absolute source paths (emit_src=False)


def test_lint_default(default_gen):
    out, man = default_gen
    if rtl_gen.find_tool("verilator") is None:
        pytest.skip("verilator not installed")
    r = rtl_gen.lint(out / man["verilog"], man["top"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "%Warning" not in r.stdout + r.stderr


def test_lint_waivers_cover_only_generator_artifacts(default_gen):
    """Without the waiver file: only the waived rules fire, no port is unused or
    undriven, and every WIDTHTRUNC is the `!multi_bit` form."""
    out, man = default_gen
    if rtl_gen.find_tool("verilator") is None:
        pytest.skip("verilator not installed")
    r = rtl_gen.lint(out / man["verilog"], man["top"], waivers=False)
    msgs = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("%Warning")]
    rules = {re.match(r"%Warning-(\w+)", ln).group(1) for ln in msgs}
    assert rules <= {"UNUSEDSIGNAL", "WIDTHEXPAND", "WIDTHTRUNC", "PROCASSINIT", "DECLFILENAME"}
    for ln in msgs:
        if "UNUSEDSIGNAL" in ln:
            name = re.search(r"'([^']+)'", ln).group(1)
            assert name not in PORTS, ln
        if "WIDTHTRUNC" in ln:
            assert "Logical operator LOGNOT expects 1 bit" in ln, ln
    assert not any("%Error" in ln and "Exiting" not in ln for ln in (r.stdout + r.stderr).splitlines())


def test_cli_small(tmp_path, capsys):
    out = tmp_path / "g"
    rc = cli_main(["--n", "16", "--block", "8", "--bits", "2", "--fwht-regs", "4",
                   "--mant-bits", "10", "--seed", "5", "--dtype", "bf16", "--top", "kv16",
                   "--out", str(out)])
    assert rc == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["params"]["n"] == 16 and man["params"]["dtype"] == "bf16"
    assert man["params"]["sign_seed"] == 5 and man["latency_cycles"] == 4 + ENC_FIXED
    v = (out / "kv16.v").read_text()
    ports = verilog_ports(v, "kv16")
    assert ports["i__payload"] == ("input", 256)
    assert ports["o__payload"] == ("output", 16 * 2 + 16 + 3)
    assert f"latency {4 + ENC_FIXED} cycles" in capsys.readouterr().out


def test_cli_no_sign_flip(tmp_path):
    assert cli_main(["--n", "8", "--block", "8", "--fwht-regs", "0", "--no-sign-flip",
                     "--out", str(tmp_path)]) == 0
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["params"]["sign_seed"] is None and man["sign_mask_hex"] == "00"
    assert man["latency_cycles"] == ENC_FIXED


def test_deterministic(tmp_path):
    a = rtl_gen.generate("encoder", FormatParams(n=8, block=8), tmp_path / "a", EncoderOptions(fwht_regs=1))
    b = rtl_gen.generate("encoder", FormatParams(n=8, block=8), tmp_path / "b", EncoderOptions(fwht_regs=1))
    assert a["verilog_sha256"] == b["verilog_sha256"]


@pytest.mark.parametrize("args,word", [
    (["--fwht-regs", "8"], "fwht_regs"),
    (["--fwht-regs", "-1"], "fwht_regs"),
    (["--n", "100"], "n (N)"),
    (["--n", "4"], "n (N)"),
    (["--block", "48"], "block"),
    (["--bits", "5"], "bits"),
    (["--mant-bits", "5"], "mant_bits"),
    (["--seed", "-1"], "sign_seed"),
    (["--dtype", "fp8"], "dtype"),
    (["--top", "9bad"], "top"),
    (["--n", "x"], "--n"),
    (["--mode", "asym", "--scale-rule", "absmean"], "scale_rule"),
    (["--scale", "e6m1"], "--scale"),
    (["--scale-rule", "rms"], "scale_rule"),
    (["--scale-mult", "600"], "scale_mult"),
    (["--scale-round", "down"], "--scale-round"),
    (["--quant-regs", "max,bogus"], "quant_regs"),
    (["--quant-regs", "max,max"], "quant_regs"),
    (["--fe-regs", "max"], "fe_regs"),
    (["--n", "4096"], "n (N)"),
    (["--module", "decoder", "--quant-regs", "none"], "--quant-regs"),
    (["--quant-regs", ""], "--quant-regs"),
    (["--fe-regs", " , "], "--fe-regs"),
    (["--dec-top", "d"], "--dec-top"),
    (["--key-slots", "-1"], "--key-slots"),
    (["--module", "decoder", "--key-slots", "2"], "--key-slots"),
    (["--kf-regs", "out"], "--kf-regs"),            # no such flag: the front end's cuts
    (["--module", "roundtrip", "--key-slots", "2"], "--key-slots"),
    (["--top", "module"], "reserved word"),
    (["--module", "both", "--dec-top", "1x"], "dec_top"),
    (["--module", "both", "--dec-top", "wire"], "dec_top"),
    (["--key-slots", "2", "--fe-regs", "tree"], "fe_regs"),
    (["--key-slots", "2", "--dtype", "bf16"], "fp16"),
    (["--credit-extra", "2"], "credit_extra"),
    (["--flow", "credit", "--credit-extra", "-1"], "credit_extra"),
    (["--flow", "credits"], "--flow"),
])
def test_cli_errors(tmp_path, capsys, args, word):
    with pytest.raises(SystemExit) as e:
        cli_main(args + ["--out", str(tmp_path / "x")])
    assert e.value.code == 2
    assert word in capsys.readouterr().err
    assert not (tmp_path / "x" / "manifest.json").exists()


def test_generate_errors(tmp_path):
    with pytest.raises(ValueError, match="fwht_regs"):
        rtl_gen.generate("encoder", FormatParams(n=64, block=64), tmp_path, EncoderOptions(fwht_regs=7))
    with pytest.raises(TypeError, match="fwht_regs"):
        EncoderOptions(fwht_regs="2")
    with pytest.raises(TypeError, match="params"):
        rtl_gen.generate("encoder", {"n": 64}, tmp_path, EncoderOptions(fwht_regs=2))
    with pytest.raises(ValueError, match="top"):
        rtl_gen.generate("encoder", FormatParams(n=8, block=8), tmp_path, EncoderOptions(1), top="a-b")
    with pytest.raises(ValueError, match="kind"):
        rtl_gen.generate("epilogue", FormatParams(n=8, block=8), tmp_path)
    with pytest.raises(TypeError, match="DecoderOptions"):
        rtl_gen.generate("decoder", FormatParams(n=8, block=8), tmp_path, EncoderOptions())
    assert not (tmp_path / "manifest.json").exists()


def test_cli_defaults_are_format_params_defaults(tmp_path):
    """No format flag given -> the manifest's params are exactly FormatParams()."""
    assert cli_main(["--out", str(tmp_path), "--fwht-regs", "1", "--n", "128"]) == 0
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["params"] == FormatParams().to_dict()


def test_cli_midrise_nearest(tmp_path):
    out = tmp_path / "mr"
    rc = cli_main(["--n", "16", "--block", "8", "--bits", "3", "--mode", "midrise",
                   "--scale-round", "nearest", "--scale-mult", "256", "--fwht-regs", "1",
                   "--quant-regs", "max,scale,thr", "--fe-regs", "none", "--out", str(out)])
    assert rc == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["params"]["mode"] == "midrise" and man["params"]["scale_round"] == "nearest"
    assert man["params"]["scale_mult"] == 256
    assert man["quant_register_cuts"] == ["max", "scale", "thr"]
    assert man["frontend_register_cuts"] == []
    assert man["latency_cycles"] == 1 + 2 + 3 == sum(man["latency_breakdown"].values())
    if rtl_gen.find_tool("verilator") is not None:
        r = rtl_gen.lint(out / man["verilog"], man["top"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert "%Warning" not in r.stdout + r.stderr


def test_both_refuses_before_writing(tmp_path):
    """--module both validates both paths first: an option only one path implements
    leaves no files behind (the read path has its own table)."""
    from hw.encoder import ENCODER_SUPPORT
    p = FormatParams(n=16, block=8, mode="midrise", scale_round="nearest")
    try:
        rtl_gen.generate_both(p, tmp_path / "b", EncoderOptions(1), DecoderOptions(1))
    except ValueError as err:
        assert "mode" in str(err) or "scale_round" in str(err)
        assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())
    else:
        assert "midrise" in ENCODER_SUPPORT["mode"]
        assert (tmp_path / "b" / "manifest.json").exists()


@pytest.mark.parametrize("args", [
    ["--mode", "lloydmax", "--bits", "4", "--scale", "e4m3fn"],
    ["--mode", "midrise", "--scale", "e5m2", "--scale-round", "nearest"],
    ["--mode", "midtread", "--bits", "2", "--scale", "ue4m4"],
])
def test_cli_encodings_and_lloydmax(tmp_path, args):
    out = tmp_path / "g"
    assert cli_main(["--n", "16", "--block", "8", "--fwht-regs", "1", "--out", str(out)] + args) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["params"]["scale"] == args[args.index("--scale") + 1]
    assert man["params"]["mode"] == args[1]


def test_asym_manifest(tmp_path):
    """Mode asym: the zero-point plane sits between the scales and the flags."""
    out = tmp_path / "a"
    assert cli_main(["--n", "16", "--block", "8", "--bits", "3", "--mode", "asym", "--fwht-regs", "1",
                     "--out", str(out)]) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["o_payload"]["fields"] == {
        "codes": {"offset": 0, "width": 48},
        "scales": {"offset": 48, "width": 16},
        "zeros": {"offset": 64, "width": 16},
        "flags": {"offset": 80, "width": 3},
    }
    assert man["o_payload"]["width"] == 83 == man["ports"]["o__payload"]["width"]
    assert man["derived"]["zero_bytes"] == 2
    if rtl_gen.find_tool("verilator") is not None:
        r = rtl_gen.lint(out / man["verilog"], man["top"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert "%Warning" not in r.stdout + r.stderr


def test_cli_unwritable_out_is_a_clean_error(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(SystemExit) as e:
        cli_main(["--n", "16", "--block", "8", "--out", str(f)])
    assert e.value.code == 2 and "cannot write --out" in capsys.readouterr().err


def test_roundtrip_kind(tmp_path):
    """The round-trip DUT: ports from its signature match the Verilog; its latency is
    the sum of both modules'; --module roundtrip writes it."""
    p = FormatParams(n=16, block=8, bits=3)
    man = rtl_gen.generate("roundtrip", p, tmp_path / "r",
                           RoundTripOptions(EncoderOptions(1), DecoderOptions(1)))
    v = (tmp_path / "r" / "kv_roundtrip.v").read_text()
    assert verilog_ports(v, "kv_roundtrip") == {k: (d["dir"], d["width"])
                                                for k, d in man["ports"].items()}
    assert man["ports"]["d__payload"] == {"dir": "input", "width": 16 * 3 + 16}
    assert man["ports"]["i__payload"]["width"] == man["ports"]["o__payload"]["width"] == 256
    assert man["ports"]["sel"] == {"dir": "input", "width": 1}
    assert man["latency_breakdown"] == {"encoder": 1 + ENC_FIXED, "decoder": 1 + DEC_FIXED}
    assert man["latency_cycles"] == 2 + ENC_FIXED + DEC_FIXED
    assert man["kind"] == "roundtrip" and man["decoder"]["i_payload"]["width"] == 64
    assert cli_main(["--n", "16", "--block", "8", "--fwht-regs", "1", "--module", "roundtrip",
                     "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "kv_roundtrip.v").read_text() == v


def test_key_front_manifest_and_lint(tmp_path):
    """Config part kT: the key front end's ports (cfg stream, side band above the lanes),
    its manifest entry and latency, lint-clean Verilog; without it nothing changes."""
    from rtl_gen.config import RTLConfig
    from sim_models import wire
    c = RTLConfig.parse("enc_v2_n16_g8_b3_l1_k3")
    assert c.key_slots == 3 and c.name == "enc_v2_n16_g8_b3_l1_k3"
    assert c.opts == EncoderOptions(fwht_regs=1, key_slots=3)
    assert c.opts.fe_regs == FOLD_CUTS.default == ("dec", "emax")
    assert RTLConfig.parse("enc_v2_n16_g8_b3_l4_p1_k8").opts.fe_regs == FOLD_CUTS.names
    assert FOLD_CUTS.names == ("dec", "emax", "shamt", "align")
    for bad in ("rt_v2_n16_g8_b3_l1_k3", "dec_v2_n16_g8_b3_l1_k3", "enc_v2_n16_g8_b3_l1_k3_k4"):
        with pytest.raises(ValueError):
            RTLConfig.parse(bad)
    p = c.params
    man = rtl_gen.generate("encoder", p, tmp_path, c.opts)
    kf = man["key_front"]
    assert kf["slots"] == 3 and kf["register_cuts"] == ["dec", "emax"]
    assert "encode_folded" in kf["rule"]
    assert man["latency_breakdown"]["keyfront"] == 1
    lay = wire.encoder_input(p, 3)
    assert kf["i_payload"]["fields"]["slot"] == {"offset": 16 * 16, "width": 2}
    assert kf["i_payload"]["width"] == lay.width == man["ports"]["i__payload"]["width"]
    assert kf["cfg_payload"]["fields"] == wire.key_config(p, 3).offsets()
    assert man["ports"]["cfg__payload"]["width"] == 16 + 5 + 4 + 2
    plain = rtl_gen.generate("encoder", p, tmp_path / "plain", EncoderOptions(fwht_regs=1))
    assert "key_front" not in plain and "cfg__valid" not in plain["ports"]
    assert plain["latency_cycles"] == man["latency_cycles"] - 1 - 1     # table read, dec cut
    if rtl_gen.find_tool("verilator") is not None:
        r = rtl_gen.lint(tmp_path / man["verilog"], man["top"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert "%Warning" not in r.stdout + r.stderr


def test_config_names_use_the_distinct_quantizer_presets():
    """Version 3 keeps version 2's per-vector quantizer: its configurations are named v2 (names
    and records stay comparable across versions), and a v3 name parses to the same config."""
    from rtl_gen.config import PRESETS, RTLConfig
    assert PRESETS == ("v1", "v2")
    assert RTLConfig.parse("enc_v3_n64_g32_b4_l1").name == "enc_v2_n64_g32_b4_l1"
    assert RTLConfig.parse("rt_v1_n64_g32_b3_l2").name == "rt_v1_n64_g32_b3_l2"
    with pytest.raises(ValueError, match="fp16 only"):            # refused when parsed, not at elaboration
        RTLConfig.parse("enc_v2_n16_g8_b3_l1_bf16_k8")


def test_cli_key_front(tmp_path):
    """--key-slots builds the encoder with the folded key front end; the manifest records its
    slots, cuts (the front end's) and cfg port, and the latency grows by the table read
    register plus one cycle per cut beyond the plain front end's; without --fe-regs its
    cuts are FOLD_CUTS.default."""
    base = ["--n", "16", "--block", "8", "--fwht-regs", "1"]
    assert cli_main(base + ["--out", str(tmp_path / "a")]) == 0
    assert cli_main(base + ["--key-slots", "4", "--fe-regs", "emax,shamt", "--out", str(tmp_path / "b")]) == 0
    a = json.loads((tmp_path / "a" / "manifest.json").read_text())
    b = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert "key_front" not in a
    assert b["key_front"]["slots"] == 4 and b["key_front"]["register_cuts"] == ["emax", "shamt"]
    assert b["latency_cycles"] == a["latency_cycles"] + 1 + 1
    # without --fe-regs: the key front end's default cuts (dec, emax)
    assert cli_main(base + ["--key-slots", "4", "--out", str(tmp_path / "c")]) == 0
    c = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert c["key_front"]["register_cuts"] == list(FOLD_CUTS.default) == ["dec", "emax"]
    assert c["latency_cycles"] == a["latency_cycles"] + 1 + 1


def test_lane_ram_config_and_manifest(tmp_path):
    """Config part rD: the lane delay lines of D or more stages in block RAM (encoder and
    round trip), named in the manifest with their delay, width and buffer depth; same
    latency and ports as without; a memory with ram_style block in the Verilog,
    lint-clean."""
    from rtl_gen.config import RTLConfig
    c = RTLConfig.parse("enc_v2_n16_g8_b3_l4_p1_r3")
    assert c.opts.lane_ram == 3 and c.name == "enc_v2_n16_g8_b3_l4_p1_r3"
    assert c.opts.tree_every == 1
    assert RTLConfig.parse("enc_v2_n16_g8_b3_l1").opts.lane_ram == 0
    assert RTLConfig.parse("rt_v2_n16_g8_b3_l2_r4").opts == RoundTripOptions(
        EncoderOptions(2, lane_ram=4), DecoderOptions(2))
    for bad, word in (("dec_v2_n16_g8_b3_l1_r3", "lane_ram"), ("enc_v2_n16_g8_b3_l1_r3_r4", "twice")):
        with pytest.raises(ValueError, match=word):
            RTLConfig.parse(bad)
    man = rtl_gen.generate("encoder", c.params, tmp_path, c.opts)
    plain = rtl_gen.generate("encoder", c.params, tmp_path / "ff", replace(c.opts, lane_ram=0))
    assert man["lane_ram"] == {"min_stages": 3, "lines": {
        "frontend.lanes": {"stages": 4, "width": 16 * 17, "depth": 4},
        "quant.lanes": {"stages": 12, "width": 16 * 16, "depth": 16}}}
    assert plain["lane_ram"] == {"min_stages": 0, "lines": {}}
    assert man["latency_cycles"] == plain["latency_cycles"] == 27     # every cut, code included
    assert man["ports"] == plain["ports"]
    v = (tmp_path / man["verilog"]).read_text()
    assert v.count('ram_style = "block"') == 2 and 'ram_style' not in \
        (tmp_path / "ff" / plain["verilog"]).read_text()
    with pytest.raises(ValueError, match="lane_ram"):
        rtl_gen.generate("encoder", c.params, tmp_path / "bad", EncoderOptions(1, lane_ram=2))
    if rtl_gen.find_tool("verilator") is not None:
        r = rtl_gen.lint(tmp_path / man["verilog"], man["top"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert "%Warning" not in r.stdout + r.stderr


def test_flow_config_and_manifest(tmp_path, capsys):
    """Config part cE: credit flow control with E extra credits on every kind (regs
    flow / credit_extra), round trip of the name; the manifest's flow_control and
    latency (+ the skid FIFO's cycles); the CLI's --flow / --credit-extra; lint-clean."""
    from hw.pipeline import SKID_FIFO_CYCLES
    from rtl_gen.__main__ import main as cli_main
    from rtl_gen.config import RTLConfig
    for name in ("enc_v2_n16_g8_b3_l4_p1_r3_c0", "dec_v2_n16_g8_b3_l4_p0_c2",
                 "rt_v2_n64_g32_b3_l2_c0", "enc_v2_n16_g8_b3_l1_k3_c1"):
        c = RTLConfig.parse(name)
        o = c.enc or c.dec
        assert c.name == name and o.flow == "credit"
        assert o.credit_extra == int(name.rsplit("_c", 1)[1])
    assert RTLConfig.parse("enc_v2_n16_g8_b3_l1").opts.flow == "stall"
    for bad, word in (("enc_v2_n16_g8_b3_l1_c0_c1", "twice"),):
        with pytest.raises(ValueError, match=word):
            RTLConfig.parse(bad)
    with pytest.raises(ValueError, match="credit"):
        RTLConfig.of("encoder", FormatParams(n=16, block=8), 1, credit=-1)
    c = RTLConfig.parse("dec_v2_n16_g8_b3_l1_c2")
    man = rtl_gen.generate("decoder", c.params, tmp_path / "c", c.opts)
    plain = rtl_gen.generate("decoder", c.params, tmp_path / "s", DecoderOptions(fwht_regs=1))
    assert man["latency_cycles"] == plain["latency_cycles"] + SKID_FIFO_CYCLES
    assert man["latency_breakdown"]["skid_fifo"] == SKID_FIFO_CYCLES
    assert man["flow_control"]["flow"] == "credit"
    assert man["flow_control"]["credits"] == man["latency_cycles"] + 2 + 2     # c2: 2 extra
    assert plain["flow_control"]["flow"] == "stall"
    assert "skid_fifo" not in plain["latency_breakdown"]
    assert man["ports"] == plain["ports"]
    assert cli_main(["--n", "16", "--block", "8", "--fwht-regs", "1", "--flow", "credit",
                     "--module", "roundtrip", "--out", str(tmp_path / "rt")]) == 0
    rt = json.loads((tmp_path / "rt" / "manifest.json").read_text())
    assert rt["flow_control"]["flow"] == "credit" and rt["latency_cycles"] == sum(
        rt["latency_breakdown"].values())
    if rtl_gen.find_tool("verilator") is not None:
        r = rtl_gen.lint(tmp_path / "c" / man["verilog"], man["top"])
        assert r.returncode == 0 and "%Warning" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_lanes_config_and_manifest(tmp_path, capsys):
    """Config part wW: two beats per vector on every kind (regs lanes), round trip of the
    name; refusals name ``lanes``; the manifest's lanes, throughput (1/2), beats entry and
    latency (+4); the CLI's --lanes; lint-clean."""
    from rtl_gen.__main__ import main as cli_main
    from rtl_gen.config import RTLConfig
    for name in ("enc_v2_n128_g64_b3_l6_p2_c0_w64", "dec_v2_n128_g64_b3_l6_p0_c0_w64",
                 "rt_v2_n64_g32_b3_l2_w32", "enc_v2_n16_g8_b3_l1_w8"):
        c = RTLConfig.parse(name)
        assert c.name == name and c.lanes == c.params.n // 2
    assert RTLConfig.parse("enc_v2_n16_g8_b3_l1").lanes is None
    for bad in ("enc_v2_n16_g8_b3_l1_w4", "enc_v2_n16_g16_b3_l1_w8", "enc_v2_n16_g8_b3_l1_w32"):
        with pytest.raises(ValueError, match="lanes"):
            RTLConfig.parse(bad)
    c = RTLConfig.parse("dec_v2_n16_g8_b3_l1_w8")
    man = rtl_gen.generate("decoder", c.params, tmp_path / "w", c.opts)
    plain = rtl_gen.generate("decoder", c.params, tmp_path / "s", DecoderOptions(fwht_regs=1))
    assert man["latency_cycles"] == plain["latency_cycles"] + 4
    assert (man["lanes_per_cycle"], man["throughput_vectors_per_cycle"]) == (8, 0.5)
    assert (plain["lanes_per_cycle"], plain["throughput_vectors_per_cycle"]) == (16, 1)
    assert man["beats"]["beats_per_vector"] == 2 and "beats" not in plain
    assert man["ports"] == plain["ports"]        # the same stream interface
    assert cli_main(["--n", "16", "--block", "8", "--fwht-regs", "3", "--lanes", "8",
                     "--module", "roundtrip", "--out", str(tmp_path / "rt")]) == 0
    rt = json.loads((tmp_path / "rt" / "manifest.json").read_text())
    assert rt["throughput_vectors_per_cycle"] == 0.5
    assert rt["latency_cycles"] == sum(rt["latency_breakdown"].values())
    with pytest.raises(SystemExit):
        cli_main(["--n", "16", "--block", "8", "--fwht-regs", "4", "--lanes", "8",
                  "--out", str(tmp_path / "bad")])
    assert "log2(W)=3" in capsys.readouterr().err
    if rtl_gen.find_tool("verilator") is not None:
        r = rtl_gen.lint(tmp_path / "w" / man["verilog"], man["top"])
        assert r.returncode == 0 and "%Warning" not in r.stdout + r.stderr, r.stdout + r.stderr
