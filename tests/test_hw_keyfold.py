"""hw.keyfold.FoldFrontEnd (the key front end folded into the encoder's front end) against the golden
sim_models.bfp.to_block_fp_keys (key vectors) and to_block_fp (plain vectors), lane for
lane, in amaranth.sim: random and corner vectors, random table entries, random stalls."""

from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from hw.keyfold import FOLD_CUTS, FoldFrontEnd
from sim_models import sign_mask, wire
from sim_models.bfp import to_block_fp, to_block_fp_keys
from sim_models.params import FormatParams

N = 16


def fold_vectors(n: int, count: int, seed: int):
    """(k uint16 [V, n], mu_s uint16 [V, n], e int64 [V, n], key bool [V]): random finite
    and special keys, random finite table entries over every exponent, and corners: the
    clamp (+-65504 against -+65504), scaled overflow, subnormal keys scaled down by 2^-14,
    exact cancellation, all-zero vectors; every 6th vector plain (key = 0: e = 0, mu = +0)."""
    rng = np.random.default_rng([seed, n, 5])
    k = rng.integers(0, 1 << 16, (count, n)).astype(np.uint16)
    mu = rng.integers(0, 1 << 16, (count, n)).astype(np.uint16)
    mu = np.where(((mu >> 10) & 0x1F) == 0x1F, mu & 0x83FF, mu).astype(np.uint16)
    e = rng.integers(-14, 16, (count, n))
    # corners, one per row block
    c = count // 8
    k[:c, :4] = [0x7BFF, 0xFBFF, 0x7BFF, 0x7A00]
    mu[:c, :4] = [0xFBFF, 0x7BFF, 0x7BFF, 0x0000]
    e[:c, :4] = [0, 0, 0, 15]
    k[c:2 * c] = rng.integers(0, 0x400, (c, n)) | (rng.integers(0, 2, (c, n)) << 15)
    e[c:2 * c] = -14
    mu[c:2 * c] = rng.integers(0, 0x400, (c, n))
    k[2 * c:3 * c] = mu[2 * c:3 * c]
    e[2 * c:3 * c] = 0
    k[3 * c, :], mu[3 * c, :], e[3 * c, :] = 0, 0, 0
    k[4 * c:5 * c, ::5] = rng.choice(np.array([0x7C00, 0xFC00, 0x7E00, 0xFD55]), (c, (n + 4) // 5))
    key = (np.arange(count) % 6) != 5
    mu[~key], e[~key] = 0, 0
    return k, mu, e, key


def golden(p: FormatParams, k, mu, e, key):
    mask = sign_mask(p.n, p.sign_seed)
    x, u, f = to_block_fp_keys(k, mu, e, p, mask)
    xp, up, fp = to_block_fp(k, p, mask)
    return (np.where(key[:, None], x, xp), np.where(key, u, up), np.where(key, f, fp))


@pytest.mark.parametrize("regs, mant_bits, every", [
    ((), 12, 0), (("emax",), 12, 0), (FOLD_CUTS.names, 12, 0), (("shamt",), 8, 0),
    (("emax", "align"), 16, 0), (FOLD_CUTS.default, 12, 0), (("dec",), 12, 1),
    (FOLD_CUTS.names, 8, 2), ((), 12, 3)])
def test_fold_lanes_match_golden(regs, mant_bits, every):
    """The lane logic with every cut placement and registers in the max tree (``every``:
    after every k levels of its log2 N = 4, counted back from the root)."""
    p = FormatParams(n=N, block=8, mant_bits=mant_bits)
    k, mu, e, key = fold_vectors(N, 240, len(regs) + mant_bits + 7 * every)
    wx, wu, wf = golden(p, k, mu, e, key)
    dut = FoldFrontEnd(p, None, regs, tree_every=every)
    assert dut.latency == len(regs) + {0: 0, 1: 3, 2: 1, 3: 1}[every]
    ins = wire.rows_to_ints(wire.lane_rows(k))
    rnd = random.Random(3)
    bad, seen = [], []

    async def tb(ctx):
        idx, pipe = 0, [None] * dut.latency
        for _ in range(3 * len(ins) + 10):
            en = rnd.random() < 0.75
            ctx.set(dut.en, en)
            iv = idx < len(ins)
            ctx.set(dut.i_valid, iv)
            if iv:
                ctx.set(dut.bits, ins[idx])
                for j in range(N):
                    ctx.set(dut.mu[j], int(mu[idx, j]))
                    ctx.set(dut.e[j], int(e[idx, j]))
                ctx.set(dut.key, int(key[idx]))
            v = pipe[-1] if pipe else idx
            if en and ctx.get(dut.o_valid):
                got = [ctx.get(dut.x[j]) for j in range(N)]
                gu, gf = ctx.get(dut.u), ctx.get(dut.flags)
                if got != wx[v].tolist() or gu != wu[v] or gf != wf[v]:
                    bad.append((v, bool(key[v]), got, wx[v].tolist(), gu, int(wu[v]), gf, int(wf[v])))
                seen.append(v)
            if en:
                pipe = ([idx if iv else None] + pipe[:-1]) if pipe else []
                idx += iv
            if dut.latency:
                await ctx.tick()
            else:
                await ctx.delay(1e-6)

    sim = Simulator(dut)
    if dut.latency:
        sim.add_clock(1e-6)
    sim.add_testbench(tb)
    sim.run()
    assert not bad, f"{len(bad)} mismatches (vector, key, got, want, u, u want, flags, want): {bad[:2]}"
    assert seen == list(range(len(ins)))


def test_fold_arguments():
    with pytest.raises(ValueError, match="dtype"):
        FoldFrontEnd(FormatParams(n=16, block=8, dtype="bf16"))
    with pytest.raises(ValueError, match="fe_regs"):
        FoldFrontEnd(FormatParams(n=16, block=8), None, ("tree",))
    with pytest.raises(ValueError, match="tree_every"):
        FoldFrontEnd(FormatParams(n=16, block=8), None, tree_every=-1)
    with pytest.raises(ValueError, match="slots"):
        FoldFrontEnd(FormatParams(n=16, block=8), None, lanes=8)
    with pytest.raises(ValueError, match="lanes"):
        FoldFrontEnd(FormatParams(n=16, block=8), 2, lanes=4)
    with pytest.raises(TypeError, match="held"):
        FoldFrontEnd(FormatParams(n=16, block=8), 2, lanes=8, held=1)


def test_saturates_every_exponent_and_e():
    """``saturates(ee, e)`` (the lane's saturation without the sum) is ``ee + e > 30`` for
    every 5-bit ``ee`` and every 5-bit signed ``e``."""
    from amaranth.hdl import Module, Signal, signed

    from hw.keyfold import saturates
    m = Module()
    ee, e, sat = Signal(5), Signal(signed(5)), Signal()
    m.d.comb += sat.eq(saturates(ee, e))
    got = {}

    async def tb(ctx):
        for a in range(32):
            for b in range(-16, 16):
                ctx.set(ee, a)
                ctx.set(e, b)
                got[a, b] = ctx.get(sat)

    sim = Simulator(m)
    sim.add_testbench(tb)
    sim.run()
    want = {(a, b): int(a + b > 30) for a in range(32) for b in range(-16, 16)}
    assert got == want
    assert 0 < sum(want.values()) < len(want)      # both outcomes occur

@pytest.mark.parametrize("n, slots, fe_regs, flow, lanes", [
    (N, 3, ("emax",), "stall", None), (N, 4, FOLD_CUTS.names, "credit", None),
    (N, 3, ("shamt",), "stall", N // 2), (N, 4, FOLD_CUTS.names, "credit", N // 2),
    (N, 2, (), "credit", N // 2), (32, 4, FOLD_CUTS.names, "stall", 16)])
def test_encoder_with_fold_stream(n, slots, fe_regs, flow, lanes):
    """KVEncoder(key_slots=T) (the folded key front end): the pinned key-front-end set and random fold
    vectors with their side band, tables loaded through cfg before and while vectors stream;
    every output word equals sim_models.codec.encode_folded under the table the vector saw
    at its handshake (bypass and slots >= T: sim_models.encode of the lanes); one beat
    and two (lanes N/2: the table read per beat, the beats joined before the shifts; at
    N = 32 two copies of the beat index)."""
    from hw import EncoderOptions, KVEncoder
    from kvtest.inputs import encoder_rows
    from kvtest.keyfront import seen_tables
    from kvtest.simstream import check_run, run_stream
    from kvtest.streamcheck import describe_encoder_word
    from sim_models import encode
    from sim_models.codec import encode_folded
    from sim_models.keyscale import front_table
    from sim_models.testvectors import key_front_set
    p = FormatParams(n=n, block=8, bits=3)
    x, mu, e, slot, byp = key_front_set(n, 48, slots)
    kx, _, _, _ = fold_vectors(n, 48, slots)
    rng = np.random.default_rng(slots)
    x = np.concatenate([x, kx])
    slot = np.concatenate([slot, rng.integers(0, 4, len(kx))])
    byp = np.concatenate([byp, (rng.random(len(kx)) < 0.15).astype(np.int64)])
    cfg = [(0, w) for s in range(slots) for w in wire.key_config_words(p, slots, s, mu[s], e[s])]
    e2 = rng.integers(-14, 16, size=n)
    cfg += [(40, w) for w in wire.key_config_words(
        p, slots, 1, front_table(rng.standard_normal(n).astype(np.float16), e2, p), e2)]
    dut = KVEncoder(p, EncoderOptions(1, fe_regs=fe_regs, key_slots=slots,
                                      flow=flow, lanes=lanes))
    assert dut.latency_breakdown["keyfront"] == 1
    # two beats: the join in place of the emax cut, one cycle more
    bd = dut.latency_breakdown
    assert bd.get("keyfront_join", 0) + bd["frontend_cuts"] == \
        (len(fe_regs) if lanes is None else 1 + len(set(fe_regs) | {"emax"}))
    ins = wire.encoder_input_ints(x, p, slots, slot, byp)
    flags_at = wire.encoder_output(p)["flags"].offset
    run = run_stream(dut, ins, slots, p_valid=0.8, p_ready=0.7, p_clear=0.05, free_run_first=12,
                     flags_of=lambda w: w >> flags_at, cfg=cfg)
    _, mus, es, _ = seen_tables(p, slots, run["in_cycles"], [w for _, w in cfg], run["cfg_cycles"])
    rows = []
    for i in range(len(x)):
        if byp[i] or slot[i] >= slots:
            enc = encode(x[i:i + 1], p)
        else:
            enc = encode_folded(x[i:i + 1], mus[i, slot[i]], es[i, slot[i]], p)
        rows.append(wire.encoder_output_rows(p, enc.codes, enc.scales, enc.flags.astype(np.uint8)))
    exp = wire.rows_to_ints(np.concatenate(rows))
    check_run(run, exp, 12, describe=lambda g, w: describe_encoder_word(g, w, p))
    # the key vectors' words differ from the value path's (the test sees the rule)
    assert exp != wire.rows_to_ints(encoder_rows(x, p)[0])


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_encoder_fold_options():
    """With key_slots the front end's cuts are FOLD_CUTS' (default ``dec``, ``emax``; a name
    of neither FE_CUTS nor FOLD_CUTS refused), tree_every puts registers in its W-lane max
    tree as in the quantizer's trees, and lane_ram reaches the quantizer only."""
    from hw import EncoderOptions, KVEncoder
    from hw.frontend import FE_CUTS
    p = FormatParams(n=64, block=32)
    with pytest.raises(ValueError, match="fe_regs"):
        KVEncoder(p, EncoderOptions(key_slots=2, fe_regs=("tree",)))
    assert EncoderOptions(key_slots=2).fe_regs == FOLD_CUTS.default == ("dec", "emax")
    assert EncoderOptions().fe_regs == FE_CUTS.default
    dut = KVEncoder(p, EncoderOptions(6, key_slots=2, fe_regs=FOLD_CUTS.names, tree_every=2,
                                      lane_ram=3))
    assert dut.latency_breakdown["frontend_tree"] == 2        # 6 levels: after levels 2, 4
    two = KVEncoder(p, EncoderOptions(5, key_slots=2, tree_every=1, lanes=32))
    assert two.latency_breakdown["frontend_tree"] == 4        # the W = 32-lane tree
    assert dut.ram_lines and all(k.startswith("quant.") for k in dut.ram_lines)


def test_keyfold_area_cli_names_a_bad_option(capsys):
    from bench.synth.keyfold import main
    assert main(["--only", "nope"]) == 2
    assert "--only" in capsys.readouterr().err
    assert main(["--n", "12"]) == 2
    assert "--n" in capsys.readouterr().err
