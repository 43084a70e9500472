"""Functional coverage model (kvtest.coverage, verif/coverage.py): the golden tie and
saturation facts against brute force, the reachability claims against the golden model,
the floor check (fails when a bin is missing), and the cocotb-coverage round trip."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from kvtest.coverage import (LONG_BURSTS, Bin, bins, coverage_planes, coverage_vectors,
                             decoder_hits, encoder_hits, evaluate, stream_events)
from kvtest.inputs import get_set
from kvtest.planes import adversarial_planes, encoded_planes, random_planes
from kvtest.ties import scale_tie_vectors, threshold_tie_vectors
from sim_models import FormatParams
from sim_models.bfp import FLAG_SAT
from sim_models.codec import encode_trace
from sim_models.minifloat import scale_encoding
from sim_models.quant import threshold_coefs, threshold_ties
from sim_models.scale import rule_operands, scale_decisions

PARAMS = [
    {},
    {"mode": "midtread", "scale_round": "up"},
    {"mode": "asym", "n": 64, "block": 32, "scale": "ue4m4"},
    {"mode": "lloydmax", "n": 64, "block": 32, "scale": "e5m2"},
    {"mode": "midtread", "scale_round": "up", "n": 64, "block": 32, "scale": "e4m3fn",
     "scale_rule": "absmean"},
    {"n": 64, "block": 64, "dtype": "bf16"},
    {"n": 16, "block": 8, "bits": 2, "mode": "lloydmax", "scale_round": "up"},
]
IDS = ["v2", "v1", "asym", "lloydmax", "absmean", "bf16", "n16b2"]


def stimulus(p: FormatParams, n_random: int = 200) -> np.ndarray:
    parts = [coverage_vectors(p, 1), get_set("adversarial", p.n, None, 1, dtype=p.dtype),
             get_set("random", p.n, n_random, 1, dtype=p.dtype)]
    if p.dtype == "bf16":
        parts.append(get_set("raw", p.n, n_random, 1, dtype=p.dtype))
    return np.concatenate(parts)


def _exact(a: int, e: int) -> Fraction:
    return Fraction(int(a)) * Fraction(2) ** int(e)


@pytest.mark.parametrize("kw", PARAMS, ids=IDS)
def test_threshold_ties_brute_force(kw):
    """sim_models.quant.threshold_ties == every threshold j tested with exact fractions;
    the directed sets really produce ties."""
    p = FormatParams(**kw)
    bits = np.concatenate([threshold_tie_vectors(p, np.random.default_rng(2), 16),
                           stimulus(p, 20)[:120]])
    t = encode_trace(bits, p)
    lanes, zeros = threshold_ties(t.y, t.u, t.scales, p)
    enc = scale_encoding(p.scale)
    sig, exp = enc.sig_exp(t.scales)
    coefs, frac = threshold_coefs(p.mode, p.bits)
    n_tie = 0
    for v in range(len(bits)):
        for i in range(p.n):
            k = i // p.block
            lhs = _exact(abs(int(t.y[v, i])) << frac, t.u[v])
            want = [j for j, c in enumerate(coefs, 1) if lhs == _exact(c * sig[v, k], exp[v, k])]
            assert lanes[v, i] == (want[0] if want else 0), (v, i, want, lanes[v, i])
            n_tie += bool(want) and t.y[v, i] != 0
        if zeros is not None:
            for k in range(p.n_blocks):
                lo = -min(int(t.y[v, k * p.block:(k + 1) * p.block].min()), 0)
                lhs = _exact(lo << frac, t.u[v])
                want = [j for j, c in enumerate(coefs, 1) if lhs == _exact(c * sig[v, k], exp[v, k])]
                assert zeros[v, k] == (want[0] if want else 0)
    assert n_tie > 0, "the directed sets put no lane on a threshold"


@pytest.mark.parametrize("kw", PARAMS, ids=IDS)
def test_scale_decisions_brute_force(kw):
    """sim_models.scale.scale_decisions: tie == the ideal scale t equals the decision
    point of the chosen byte (exact fractions); sat per vector == FLAG_SAT."""
    p = FormatParams(**kw)
    bits = np.concatenate([scale_tie_vectors(p), stimulus(p, 20)[:150]])
    t = encode_trace(bits, p)
    tie, sat = scale_decisions(t.y, t.u, t.scales, p)
    assert np.array_equal(sat.any(axis=1), (t.flags & FLAG_SAT) > 0)
    enc = scale_encoding(p.scale)
    power, c, x = rule_operands(t.y, p)
    idx = enc.index_of(t.scales)
    for v in range(len(bits)):
        for k in range(p.n_blocks):
            target = Fraction(int(x[v, k])) * Fraction(2) ** int(power * t.u[v]) / int(c)
            i = int(idx[v, k])
            if p.scale_round == "up":
                pt = _exact(enc.sig[i], enc.exp[i]) ** power
            else:
                pt = _exact(enc.mid_sig[i - 1], enc.mid_exp[i - 1]) ** power if i else None
            assert tie[v, k] == (pt is not None and target == pt), (v, k)
    if p.scale_rule == "max":
        assert tie.any(), "scale_tie_vectors produced no scale tie"


DEFAULT_CONFIGS = ["enc_v2_n128_g64_b3_l2", "enc_v2_n64_g64_b2_l6", "enc_v2_n64_g64_b3_l2_bf16",
                   "enc_v1_n64_g32_b3_l2_e4m3fn_absmean", "enc_v2_n64_g32_b3_l2_lloydmax_e5m2",
                   "enc_v2_n64_g32_b3_l2_asym_ue4m4", "rt_v2_n64_g32_b2_l6", "rt_v1_n64_g64_b3_l2"]


@pytest.mark.parametrize("name", DEFAULT_CONFIGS)
def test_reachability_claims(name):
    """Against the golden model: no stimulus hits a bin declared unreachable, and the
    directed coverage set with a few hundred random vectors hits every reachable
    write-path and read-path bin (the full make sim adds far more)."""
    from verif.build import sim_config
    cfg = sim_config(name)
    p = cfg.params
    kind = "roundtrip" if cfg.roundtrip else "encoder"
    model = bins(p, kind)
    bits = stimulus(p, 600)
    names, m = encoder_hits(bits, p)
    hits = dict(zip(names, m.sum(axis=0).tolist()))
    if cfg.roundtrip:
        for pl in (encoded_planes(bits, p), random_planes(p, 600, 1), adversarial_planes(p, 1),
                   coverage_planes(p, 1)):
            n2, m2 = decoder_hits(pl, p)
            for k, v in zip(n2, m2.sum(axis=0).tolist()):
                hits[k] = hits.get(k, 0) + v
    for b in model:
        if b.group == "stream":
            hits[b.name] = 1          # streams: the cocotb bench
    r = evaluate(model, hits, {LONG_BURSTS}, 100.0)
    assert not r["unreachable_hit"], r["unreachable_hit"]
    assert not r["unknown"], r["unknown"]
    assert r["ok"], f"missed {r['missed']}"


def test_floor_fails_when_a_bin_is_missing():
    """evaluate: 100 % passes; one reachable bin without hits fails and names it; a hit
    on a bin declared unreachable fails; a hit outside the model fails; a bin whose
    stimulus the run lacks is not counted."""
    model = bins(FormatParams(), "encoder")
    full = {b.name: 3 for b in model if b.unreachable is None}
    r = evaluate(model, full, {LONG_BURSTS}, 100.0)
    assert r["ok"] and r["percent"] == 100.0 and not r["missed"]
    for gone in ("code.b1=-4", "tie.scale.subnormal", "flag=nan+inf", "stream.stall=256+"):
        hits = {k: v for k, v in full.items() if k != gone}
        r = evaluate(model, hits, {LONG_BURSTS}, 100.0)
        assert not r["ok"] and r["missed"] == [gone], (gone, r["missed"])
        assert r["percent"] < 100.0
    r = evaluate(model, {k: v for k, v in full.items() if k != "code.b1=-4"}, {LONG_BURSTS},
                 r["percent"])
    assert r["ok"], "a floor below 100 % accepts one miss"
    r = evaluate(model, {**full, "scale.b0.zero": 1}, {LONG_BURSTS}, 100.0)
    assert not r["ok"] and r["unreachable_hit"] == ["scale.b0.zero"]
    r = evaluate(model, {**full, "code.b0=9": 1}, {LONG_BURSTS}, 100.0)
    assert not r["ok"] and r["unknown"] == ["code.b0=9"]
    short = {k: v for k, v in full.items() if not k.endswith("256+")}
    r = evaluate(model, short, set(), 100.0)
    assert r["ok"] and len(r["not_exercised"]) == 3


def test_model_reachability_facts():
    """Spot checks of the derivations: fp16 at N <= 256 never saturates ue5m3 (FORMAT.md
    3.5), bf16 does; midtread never writes -2^(b-1); the encoder never writes 0x00;
    e4m3fn with absmean saturates whenever a lane is inf; a multiplier with an odd
    factor 209 has no scale ties in e4m3fn."""
    why = {b.name: b.unreachable for b in bins(FormatParams(n=256, block=64), "encoder")}
    assert why["scale.b0.sat"] and why["flag=sat"] and why["scale.b0.zero"]
    assert why["flag=inf"] is None and why["tie.scale.subnormal"] is None
    why = {b.name: b.unreachable for b in bins(FormatParams(n=64, block=64, dtype="bf16"),
                                               "encoder")}
    assert why["scale.b0.sat"] is None and why["flag=nan+inf+sat"] is None
    p = FormatParams.preset("v1", n=64, block=64, scale="e4m3fn", scale_rule="absmean")
    why = {b.name: b.unreachable for b in bins(p, "roundtrip")}
    assert why["code.b0=-4"] and why["dec_code.b0=-4"] is None
    assert why["flag=inf"] and why["tie.scale.normal"] and why["dec_out.sat"]
    e = encode_trace(np.full((1, 64), 0x7C00, dtype=np.uint16), p)   # all +inf
    assert e.flags[0] & FLAG_SAT


def test_stream_events():
    """Run lengths of stalls, interior gaps and held-off inputs; full-rate runs; resets."""
    n = 400
    o_valid = np.zeros(n, bool)
    o_ready = np.ones(n, bool)
    o_valid[10:300] = True
    o_ready[20:21] = False              # stall of 1
    o_ready[30:35] = False              # 5
    o_ready[40:340] = False             # 260 (o_valid up to 299: a run of 260)
    i_valid = np.ones(n, bool)
    i_valid[0:3] = False                # leading: not a gap
    i_valid[50:60] = False              # gap of 10
    i_fire = i_valid.copy()
    i_fire[100:110] = False             # held off for 10
    o_fire = o_valid & o_ready
    rst = np.zeros(n, bool)
    ev = stream_events(o_valid, o_ready, o_fire, i_valid, i_fire, rst,
                       [(3, True, False), (0, False, True)])
    assert ev.count("stream.stall=1") == 1 and ev.count("stream.stall=2-7") == 1
    assert ev.count("stream.stall=256+") == 1
    assert ev.count("stream.gap=8-63") == 1 and not [e for e in ev if e.startswith("stream.gap=1")]
    assert ev.count("stream.iready_low=8-63") == 1
    assert ev.count("stream.reset.in_flight") == 1 and ev.count("stream.reset.output_stalled") == 1
    assert ev.count("stream.reset.input_presented") == 1
    assert "stream.full_rate=64+" not in ev
    ev = stream_events(o_valid, np.ones(n, bool), o_valid, i_valid, i_fire, rst, [])
    assert ev.count("stream.full_rate=64+") == 1
    # two beats per vector: an output every second cycle is full rate (interval 2), a
    # gap of one more cycle ends the run
    every2 = np.zeros(n, bool)
    every2[10:210:2] = True
    every2[150] = False
    every2[151] = True
    for interval, runs in ((1, 0), (2, 1)):
        ev = stream_events(every2, np.ones(n, bool), every2, i_valid, i_fire, rst, [],
                           interval=interval)
        assert ev.count("stream.full_rate=64+") == runs


def test_sampler_roundtrip(tmp_path):
    """verif.coverage.Sampler (cocotb-coverage): the exported database counts, per bin,
    the distinct hit sets (per group) that contain it, and leaving out the vectors that
    hit a bin makes it a miss."""
    from verif.coverage import Sampler, read_hits
    p = FormatParams(n=64, block=32)
    model = bins(p, "encoder")
    bits = stimulus(p, 100)
    names, m = encoder_hits(bits, p)
    s = Sampler("cfg_a", model, str(tmp_path / "a.yml"))
    s.vectors(names, m)
    s.events(["stream.stall=1"] * 3)
    s.export()
    hits = read_hits(tmp_path / "a.yml", "cfg_a")
    want = {}
    for g in s.groups:
        cols = [j for j, n in enumerate(names) if Bin(n).group == g]
        if cols:
            uniq = np.unique(m[:, cols], axis=0)
            want.update({names[j]: int(uniq[:, i].sum()) for i, j in enumerate(cols)})
    assert hits == {**want, **{k: 0 for k in hits if k not in want}, "stream.stall=1": 1}
    assert all((hits[n] > 0) == bool(m[:, j].any()) for j, n in enumerate(names))
    col = names.index("tie.scale.subnormal")
    assert m[:, col].any()
    s2 = Sampler("cfg_b", model, str(tmp_path / "b.yml"))
    s2.vectors(names, m[~m[:, col]])
    s2.export()
    hits = read_hits(tmp_path / "b.yml", "cfg_b")
    hits.update({b.name: 1 for b in model if b.group == "stream"})
    r = evaluate(model, hits, {LONG_BURSTS}, 100.0)
    assert not r["ok"] and r["missed"] == ["tie.scale.subnormal"]
    with pytest.raises(ValueError, match="outside the model"):
        s.vectors(["code.b0=99"], np.ones((1, 1), bool))


def test_bin_group():
    assert Bin("code.b0=-1").group == "code" and Bin("flag=nan").group == "flag"
    assert Bin("stream.stall=1").group == "stream"


@pytest.mark.parametrize("slots", [3, 4])
def test_key_front_bins(slots):
    """The key group: the pinned key-front-end set with a mid-stream reload (as the bench
    streams it) hits every reachable key bin; a slot >= T is unreachable exactly when the
    slot field holds only slots, and the side band of the generic sets respects that."""
    from kvtest.keyfront import key_hits, seen_tables, side_band, table_words
    from sim_models import wire
    from sim_models.testvectors import key_front_set
    p = FormatParams(n=64, block=32)
    model = [b for b in bins(p, "encoder", slots) if b.group == "key"]
    assert len(model) == slots + 3 + 10
    x, mu, e, slot, byp = key_front_set(64, 300, 0)
    words = table_words(p, slots, mu, e, range(slots))
    reload = wire.key_config_words(p, slots, 1, mu[0], e[0])
    cyc = list(range(len(words))) + [len(words) + 50 + k for k in range(len(reload))]
    acc = [len(words) + 10 + k for k in range(len(x))]
    _, mus, es, rl = seen_tables(p, slots, acc, words + reload, cyc)
    names, m = key_hits(p, slots, x, mus, es, slot, byp, rl)
    hits = dict(zip(names, m.sum(axis=0).tolist()))
    r = evaluate(model, hits, set(), 100.0)
    assert r["ok"], r["missed"] or r["unreachable_hit"]
    oor = {b.name: b.unreachable for b in model}["key.slot_out_of_range"]
    assert (oor is None) == (slots == 3)
    s, _ = side_band(4000, slots, 1)
    assert (s >= slots).any() == (slots == 3)


def test_full_rate_record_errors():
    """The full-load check: one output every ``interval`` cycles at the manifest latency;
    i__ready low only allowed with two beats per vector."""
    from kvtest.streamcheck import full_rate_record_errors
    rec = {"i_ready_low_cycles": 0, "outputs": 10, "output_span_cycles": 10,
           "latency_min": 5, "latency_max": 5}
    assert full_rate_record_errors(dict(rec), 5) == []
    assert full_rate_record_errors(dict(rec), 6)                 # wrong latency
    assert full_rate_record_errors(dict(rec), 5, interval=2)     # too fast for 2 beats
    two = {**rec, "i_ready_low_cycles": 9, "output_span_cycles": 19}
    assert full_rate_record_errors(dict(two), 5, interval=2) == []
    assert full_rate_record_errors(dict(two), 5)                 # ready low, half rate
    r = dict(two)
    full_rate_record_errors(r, 5, interval=2)
    assert r["throughput_vectors_per_cycle"] == 0.5
