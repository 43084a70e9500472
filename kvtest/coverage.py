"""Functional coverage model of the RTL benches: bins, their reachability, and what hits them.

A bin is a named condition the stimulus should create at least once. Each config's bin
list (:func:`bins`) says for every bin whether it can be reached at all (and why not:
``Bin.unreachable``), derived from the format parameters and the golden model, never
from what a run happened to hit. The hits come from the golden model of the streamed,
scored vectors (vectorised, after each phase) and from the per-cycle handshake record of
the stream loop; verif/coverage.py samples them into cocotb-coverage and
:func:`evaluate` applies the floor.

Groups (``<group>.<detail>`` bin names):

* ``code``     encoder output: every code value in every block (``code.b1=-4``)
* ``tie``      decision points of the write path: a lane exactly on code threshold j
               (``tie.thr1+``, ``tie.thr1-`` by the sign of y), the asym zero point on
               threshold j (``tie.zero1``), a block's ideal scale exactly on the
               decision point of its byte (``tie.scale.subnormal`` / ``.normal`` by the
               chosen byte: the midpoint below it for rounding nearest, the value itself
               for up)
* ``scale``    encoder scale bytes per block: ``min`` (smallest byte), ``subnormal``
               (others with exponent field 0), ``normal``, ``max`` (largest byte),
               ``zero`` (0x00, never written), ``sat`` (ideal scale above the largest:
               FLAG_SAT)
* ``flag``     every value of the 3 flag bits (``flag=none``, ``flag=nan+inf``, ...)
* ``dec_code`` / ``dec_scale``  the same for the decoder's input planes (round
               trip and direct sets: any field, byte 0x00 included)
* ``dec_out``  decoder output lanes: round-to-nearest-even ties with an even / odd
               lower neighbour, saturation to the largest finite value, subnormals
* ``key``      the key front end (configs ``..._k<T>``, the folded rule,
               :mod:`kvtest.keyfront`): each slot, bypass, a slot >= T, a table reload
               seen mid-stream, and per lane of key vectors NaN/inf pass-through,
               saturation and values below the fp16 normals of the scaling, rounded and
               flushed alignment of the key, rounded alignment of mu_s, the vector's
               exponent set by mu_s, exact cancellation, the clamp
* ``stream``   handshakes: runs of back-pressure (``stall``: o__valid and not o__ready),
               input gaps (``gap``: no i__valid between two words), input held off
               (``iready_low``: i__valid and not i__ready), full-rate output runs, and
               mid-stream resets with words in flight / with the output stalled / with
               an input word presented
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim_models.codec import Trace, decode_float, encode_trace
from sim_models.exact import ge_scaled
from sim_models.lloyd_max import LEVEL_FRAC_BITS, levels
from sim_models.minifloat import scale_encoding
from sim_models.params import FormatParams
from sim_models.quant import threshold_coefs, threshold_ties
from sim_models.scale import max_units, rule_operands, scale_decisions

from .levels import code_range, is_asym

#: Bins of run lengths (cycles): (label, first, last); last None: no upper end.
RUN_BINS = (("1", 1, 1), ("2-7", 2, 7), ("8-63", 8, 63), ("64-255", 64, 255), ("256+", 256, None))
#: Full-rate output runs of at least this many consecutive handshakes.
FULL_RATE_RUN = 64
#: Flag bit names (``sim_models.bfp``: FLAG_NAN, FLAG_INF, FLAG_SAT).
FLAG_NAMES = ("nan", "inf", "sat")
#: Stimulus feature that long runs need: a set streamed with bursts beyond 255 cycles.
LONG_BURSTS = "long_bursts"


@dataclass(frozen=True)
class Bin:
    """One coverage bin.

    Attributes:
        name: ``<group>.<detail>`` (see the module docstring).
        unreachable: why no input can hit it (None: reachable, it must be hit).
        needs: a stimulus feature the run must contain for the bin to count
            (:data:`LONG_BURSTS`); None: any run.
    """

    name: str
    unreachable: str | None = None
    needs: str | None = None

    @property
    def group(self) -> str:
        return self.name.split(".", 1)[0].split("=", 1)[0]


def flag_name(v: int) -> str:
    """``flag=none`` / ``flag=nan+inf`` ... for a flags value 0..7."""
    return "flag=" + ("+".join(f for k, f in enumerate(FLAG_NAMES) if v >> k & 1) or "none")


def _unit_top(p: FormatParams) -> tuple[int, int]:
    """(largest |x| in mantissa units, its unit exponent u) of the block floating point."""
    e_bits, _, bias = p.in_format
    return (1 << (p.mant_bits - 1)) - 1, ((1 << e_bits) - 2) - bias - p.mant_bits + 2


def _rule_bound(p: FormatParams):
    """(power, C, X, u): X * 2^(power*u) bounds the scale rule's operand over every input
    (``sim_models.scale.rule_operands`` of a block that reaches the bound): |y| <= N xmax
    per lane (asym: hi - lo <= N xmax, two rows of H differ in N/2 lanes); sum |y| over a
    block <= sqrt(G) ||y|| <= sqrt(G) N xmax; sum y^2 <= ||y||^2 = N ||x||^2 <= (N xmax)^2."""
    xmax, u = _unit_top(p)
    ymax = p.n * xmax
    y = np.zeros((1, p.n), dtype=np.int64)
    if p.scale_rule == "absmean":
        y[0, :p.block] = math.isqrt(ymax * ymax // p.block) + 1
    else:
        y[0, 0] = ymax
    power, c, x = rule_operands(y, p)
    return power, c, x[0, 0], u


def _inf_forces_sat(p: FormatParams) -> bool:
    """True when every input with a lane at the largest finite value (how +-inf is read)
    saturates some block: that vector has ||y||^2 = N ||x||^2 >= N xmax^2, so some block
    holds y energy >= G xmax^2, hence max |y| >= xmax, sum |y| >= sqrt(G) xmax and
    sum y^2 >= G xmax^2 there; FLAG_INF alone is unreachable when even that exceeds the
    largest scale."""
    xmax, u = _unit_top(p)
    y = np.zeros((1, p.n), dtype=np.int64)
    if p.scale_rule == "absmean":
        y[0, 0] = math.isqrt(p.block * xmax * xmax)
    elif p.scale_rule == "rms":
        y[0, :p.block] = xmax
    else:
        y[0, 0] = xmax
    power, c, x = rule_operands(y, p)
    enc = scale_encoding(p.scale)
    return not _ge(int(c) * int(enc.sig[-1]) ** power, power * int(enc.exp[-1]),
                   int(x[0, 0]), power * u)


def _rule_unit(p: FormatParams) -> int:
    """X of a block whose statistic (A, sum |y| or sum y^2) is 1: the factor every X has."""
    y = np.zeros((1, p.n), dtype=np.int64)
    y[0, 0] = 1
    return int(rule_operands(y, p)[2][0, 0])


def _ge(a, ea, b, eb) -> bool:
    """a * 2^ea >= b * 2^eb for Python ints of any size (``sim_models.exact.ge_scaled``)."""
    return bool(ge_scaled(np.array([int(a)], dtype=object), int(ea),
                          np.array([int(b)], dtype=object), int(eb))[0])


def _scale_tie_reachable(p: FormatParams) -> dict[str, str | None]:
    """Reason per region (``subnormal`` / ``normal`` byte) why no scale tie exists, or None.

    A tie needs X 2^(pu) = C point^p (point = sig 2^e: a value for ``up``, a midpoint for
    ``nearest``) with X = m * statistic (m = :func:`_rule_unit`, the statistic a positive
    integer) and u >= u_min, the unit of the smallest exponent; so
    C sig^p 2^(p (e - u_min)) / m must be an integer (smaller u only divides by more),
    and the point must lie within the rule's bound (:func:`_rule_bound`)."""
    from fractions import Fraction

    enc = scale_encoding(p.scale)
    power, c, xb, ub = _rule_bound(p)
    m = _rule_unit(p)
    u_min = 3 - p.in_format[2] - p.mant_bits     # u of a vector whose largest lane is subnormal
    if p.scale_round == "up":
        pts = list(zip(enc.sig.tolist(), enc.exp.tolist(), enc.bytes.tolist()))
    else:
        pts = list(zip(enc.mid_sig.tolist(), enc.mid_exp.tolist(), enc.bytes[1:].tolist()))
    out = {}
    for region in ("subnormal", "normal"):
        mine = [(sg, e) for sg, e, b in pts if (b >> enc.mant_bits == 0) == (region == "subnormal")]
        if not mine:
            out[region] = f"{p.scale} has no {region} decision point"
            continue
        ok = any((Fraction(int(c) * sg ** power) * Fraction(2) ** (power * (e - u_min)) / m)
                 .denominator == 1 and _ge(xb, power * ub, int(c) * sg ** power, power * e)
                 for sg, e in mine)
        out[region] = None if ok else (
            f"rule {p.scale_rule} (X = {m} * statistic): no {region} decision point p of "
            f"{p.scale} has C p^{power} / {m} an integer multiple of the finest unit "
            f"2^{power * u_min} within the bound")
    return out


def _top_reach(p: FormatParams) -> tuple[str | None, str | None]:
    """(why the largest scale byte is unreachable or None, why saturation is or None),
    from the bound of :func:`_rule_bound`."""
    enc = scale_encoding(p.scale)
    power, c, xb, ub = _rule_bound(p)

    def bound_ge(sig, e):       # bound >= C sig^p 2^(p e)
        return _ge(xb, power * ub, int(c) * int(sig) ** power, power * int(e))

    def bound_gt(sig, e):
        return not _ge(int(c) * int(sig) ** power, power * int(e), xb, power * ub)

    what = (f"{p.dtype} input: the rule's operand is at most the bound of N = {p.n}, "
            f"M = {p.mant_bits} at the largest exponent")
    if p.scale_round == "nearest":
        top = bound_ge(enc.mid_sig[-1], enc.mid_exp[-1])
    else:
        top = bound_gt(enc.sig[-2], enc.exp[-2])
    sat = bound_gt(enc.sig[-1], enc.exp[-1])
    return (None if top else f"{what}, below the decision point of the largest {p.scale} byte",
            None if sat else f"{what}, not above the largest {p.scale} value")


def _scale_kinds(p: FormatParams, dec: bool) -> list[str]:
    return ["zero", "min", "subnormal", "normal", "max"] + ([] if dec else ["sat"])


def bins(p: FormatParams, kind: str, key_slots: int = 0) -> list[Bin]:
    """Every bin of a config (``kind``: ``encoder`` or ``roundtrip``; ``key_slots``: table
    slots of its key front end, 0 = none), with reachability."""
    if kind not in ("encoder", "roundtrip"):
        raise ValueError(f"kind must be 'encoder' or 'roundtrip', got {kind!r}")
    lo, hi = code_range(p)
    out: list[Bin] = []
    never_top = (f"mode midtread writes codes -{p.qmax}..{p.qmax} only (docs/FORMAT.md 3.6)"
                 if p.mode == "midtread" else None)
    for k in range(p.n_blocks):
        for v in range(lo, hi + 1):
            out.append(Bin(f"code.b{k}={v}", never_top if v == lo else None))
    coefs, _ = threshold_coefs(p.mode, p.bits)
    for j in range(1, len(coefs) + 1):
        out += [Bin(f"tie.thr{j}+"), Bin(f"tie.thr{j}-")]
        if is_asym(p):
            out.append(Bin(f"tie.zero{j}"))
    st = _scale_tie_reachable(p)
    out += [Bin("tie.scale.subnormal", st["subnormal"]), Bin("tie.scale.normal", st["normal"])]
    top, sat = _top_reach(p)
    for k in range(p.n_blocks):
        for s in _scale_kinds(p, dec=False):
            why = {"zero": "the encoder never writes byte 0x00 (docs/FORMAT.md 3.5)",
                   "max": top, "sat": sat}.get(s)
            out.append(Bin(f"scale.b{k}.{s}", why))
    inf_sat = (f"a lane at the {p.dtype} maximum (how inf is read) saturates a block "
               f"under {p.scale} / {p.scale_rule}" if _inf_forces_sat(p) else None)
    for v in range(8):
        out.append(Bin(flag_name(v), sat if v & 4 else inf_sat if v & 2 else None))
    if kind == "roundtrip":
        for k in range(p.n_blocks):
            out += [Bin(f"dec_code.b{k}={v}") for v in range(lo, hi + 1)]
        for k in range(p.n_blocks):
            out += [Bin(f"dec_scale.b{k}.{s}") for s in _scale_kinds(p, dec=True)]
        out += [Bin(f"dec_out.{s}", why) for s, why in _dec_out_reach(p).items()]
    for what in ("stall", "gap", "iready_low"):
        for label, first, _last in RUN_BINS:
            out.append(Bin(f"stream.{what}={label}", needs=LONG_BURSTS if first >= 256 else None))
    out.append(Bin(f"stream.full_rate={FULL_RATE_RUN}+"))
    out += [Bin("stream.reset.in_flight"), Bin("stream.reset.output_stalled"),
            Bin("stream.reset.input_presented")]
    if key_slots:
        from .keyfront import key_bins
        out += [Bin(name, why) for name, why in key_bins(key_slots)]
    return out


def _level_top_and_quantum(p: FormatParams) -> tuple[float, float]:
    """(largest |reconstructed level| in scale units over every code / zero point, the
    smallest nonzero one)."""
    h = 1 << (p.bits - 1)
    if p.mode == "midtread":
        return float(h), 1.0           # decoder input: code -h too
    if p.mode == "midrise":
        return h - 0.5, 0.5
    if p.mode == "lloydmax":
        lv = levels(p.bits)
        return float(lv[-1]) / 256, 2.0 ** -LEVEL_FRAC_BITS
    return 255.0, 1.0                  # asym: (c - z) with z a whole byte


def _dec_out_reach(p: FormatParams) -> dict[str, str | None]:
    """dec_out bins and why unreachable: |x_hat| = |H yhat| / N <= max |yhat| (saturation
    needs max level * largest scale above the largest finite value); the smallest nonzero
    |x_hat| is at least quantum * smallest scale / N (subnormal outputs need it below the
    smallest normal); round-to-nearest ties: none for N = G, b = 2, midtread
    (``kvtest.ties.tie_planes``: |S| < 2^11)."""
    enc = scale_encoding(p.scale)
    e_bits, mb, bias = p.in_format
    max_fin = (2.0 - 2.0 ** -mb) * 2.0 ** ((1 << e_bits) - 2 - bias)
    min_norm = 2.0 ** (1 - bias)
    top, quantum = _level_top_and_quantum(p)
    vals = enc.values()
    no_tie = (f"N = G, b = 2, midtread: every output is below 2^11 units of its ulp"
              if p.n == p.block and p.bits == 2 and p.mode == "midtread" else None)
    return {"tie_even": no_tie, "tie_odd": no_tie,
            "sat": None if top * vals[-1] > max_fin else
            f"max |level| * largest scale = {top * vals[-1]:g} <= {p.dtype} max {max_fin:g}",
            "subnormal": None if quantum * vals[0] / p.n < min_norm else
            f"smallest nonzero output >= {quantum * vals[0] / p.n:g} >= {p.dtype} smallest normal"}


# ---------------------------------------------------------------- hits (vectorised)

def _scale_class(scales: np.ndarray, p: FormatParams) -> dict[str, np.ndarray]:
    """bool [V, N/G] per scale-byte kind (:func:`_scale_kinds`, without sat)."""
    enc = scale_encoding(p.scale)
    s = scales.astype(np.int64)
    first, last = int(enc.bytes[0]), int(enc.bytes[-1])
    sub = (s >> enc.mant_bits) == 0
    return {"zero": s == 0, "min": s == first, "subnormal": sub & (s != 0) & (s != first),
            "normal": ~sub & (s != last), "max": s == last}


def encoder_hits(bits: np.ndarray, p: FormatParams, trace: Trace | None = None
                 ) -> tuple[list[str], np.ndarray]:
    """(bin names, bool [V, B]): the write-path bins (code, tie, scale, flag) each input
    vector (uint16 [V, N]) hits, from its golden trace (``trace``: already computed, the
    ``sim_models.codec.encode_trace`` of ``bits``)."""
    t = encode_trace(bits, p) if trace is None else trace
    v = t.y.shape[0]
    nb, g = p.n_blocks, p.block
    names, cols = [], []
    lo, hi = code_range(p)
    cb = t.codes.reshape(v, nb, g)
    for k in range(nb):
        for c in range(lo, hi + 1):
            names.append(f"code.b{k}={c}")
            cols.append((cb[:, k] == c).any(axis=1))
    lanes, zeros = threshold_ties(t.y, t.u, t.scales, p)
    coefs, _ = threshold_coefs(p.mode, p.bits)
    pos, neg = t.y > 0, t.y < 0
    for j in range(1, len(coefs) + 1):
        on = lanes == j
        names += [f"tie.thr{j}+", f"tie.thr{j}-"]
        cols += [(on & pos).any(axis=1), (on & neg).any(axis=1)]
        if zeros is not None:
            names.append(f"tie.zero{j}")
            cols.append(((zeros == j) & (zeros > 0)).any(axis=1))
    tie, sat = scale_decisions(t.y, t.u, t.scales, p)
    cls = _scale_class(t.scales, p)
    names += ["tie.scale.subnormal", "tie.scale.normal"]
    cols += [(tie & (cls["min"] | cls["subnormal"])).any(axis=1),
             (tie & (cls["normal"] | cls["max"])).any(axis=1)]
    for k in range(nb):
        for s in _scale_kinds(p, dec=False):
            names.append(f"scale.b{k}.{s}")
            cols.append(sat[:, k] if s == "sat" else cls[s][:, k])
    for f in range(8):
        names.append(flag_name(f))
        cols.append(t.flags == f)
    return names, np.stack(cols, axis=1) if cols else np.zeros((v, 0), bool)


def decoder_hits(planes: tuple, p: FormatParams) -> tuple[list[str], np.ndarray]:
    """(bin names, bool [V, B]): the read-path bins (dec_code, dec_scale, dec_out) each
    decoder input ``(codes, scales[, zeros])`` hits, from the golden decode."""
    from sim_models.pack import unpack_codes

    from .ties import rounding_ties
    codes, scales = planes[0], planes[1]
    zeros = planes[2] if len(planes) > 2 else None
    v = codes.shape[0]
    nb, g = p.n_blocks, p.block
    c = unpack_codes(codes, p.n, p.bits, not is_asym(p)).reshape(v, nb, g)
    lo, hi = code_range(p)
    names, cols = [], []
    for k in range(nb):
        for val in range(lo, hi + 1):
            names.append(f"dec_code.b{k}={val}")
            cols.append((c[:, k] == val).any(axis=1))
    cls = _scale_class(scales, p)
    for k in range(nb):
        for s in _scale_kinds(p, dec=True):
            names.append(f"dec_scale.b{k}.{s}")
            cols.append(cls[s][:, k])
    e_bits, mb, bias = p.in_format
    max_fin = (2.0 - 2.0 ** -mb) * 2.0 ** ((1 << e_bits) - 2 - bias)
    x = decode_float(codes, scales, p, zeros)
    tie, odd = rounding_ties(x, p)
    x = np.abs(x)
    names += ["dec_out.tie_even", "dec_out.tie_odd", "dec_out.sat", "dec_out.subnormal"]
    cols += [(tie & ~odd).any(axis=1), (tie & odd).any(axis=1), (x > max_fin).any(axis=1),
             ((x > 0) & (x < 2.0 ** (1 - bias))).any(axis=1)]
    return names, np.stack(cols, axis=1)


def _runs(on: np.ndarray, interior: bool = False) -> np.ndarray:
    """Lengths of the runs of True in a bool array (``interior``: only runs with a False
    on both sides)."""
    d = np.diff(np.concatenate([[0], on.astype(np.int8), [0]]))
    start, end = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    if interior:
        keep = (start > 0) & (end < on.size)
        start, end = start[keep], end[keep]
    return end - start


def run_bin_names(what: str, lengths: np.ndarray) -> list[str]:
    """``stream.<what>=<label>`` of every run length (:data:`RUN_BINS`)."""
    out = []
    for label, first, last in RUN_BINS:
        n = int(((lengths >= first) & (lengths <= (last if last is not None else 1 << 62))).sum())
        out += [f"stream.{what}={label}"] * n
    return out


def stream_events(o_valid, o_ready, o_fire, i_valid, i_fire, rst, resets,
                  interval: int = 1) -> list[str]:
    """Stream bin names of one phase, one per event, from its per-cycle record (bool
    arrays, one entry per clock edge) and its resets (``(words in flight, output
    stalled, input presented)`` at each reset). ``interval``: cycles per vector at full
    rate (2: two beats per vector; a full-rate run is then an output every 2 cycles, and
    its cycles count from the first output to one cycle past the last)."""
    run = ~rst
    if interval > 1:
        o_fire = np.asarray(o_fire, bool)
        o_fire = o_fire | np.concatenate([[False], o_fire[:-1]])
    ev = run_bin_names("stall", _runs(o_valid & ~o_ready & run))
    ev += run_bin_names("gap", _runs(~i_valid & run, interior=True))
    ev += run_bin_names("iready_low", _runs(i_valid & ~i_fire & run))
    ev += [f"stream.full_rate={FULL_RATE_RUN}+"] * int((_runs(o_fire) >= FULL_RATE_RUN).sum())
    for in_flight, stalled, presented in resets:
        ev += ["stream.reset.in_flight"] * (in_flight > 0)
        ev += ["stream.reset.output_stalled"] * bool(stalled)
        ev += ["stream.reset.input_presented"] * bool(presented)
    return ev


# ---------------------------------------------------------------- floor

#: Coverage floor (% of the reachable bins that must be hit) per run kind. The full run
#: (``make sim``) must hit every reachable bin. ``--set quick`` (CI) keeps its vector sets
#: (no directed ``coverage`` set, no long-burst set), so bins only those reach are
#: missed there by design: its floor guards against losing more than that.
FLOORS = {"full": 100.0, "quick": 95.0}


def evaluate(model: list[Bin], hits: dict[str, int], features: set[str], floor: float) -> dict:
    """Score the hits of one config against its bin model.

    Args:
        model: :func:`bins` of the config.
        hits: bin name -> hit count (missing: 0).
        features: the stimulus features of the run (:data:`LONG_BURSTS`).
        floor: % of the counted reachable bins that must be hit.

    Returns:
        {"ok", "percent", "reachable", "hit", "floor", "missed": [names], "unreachable":
        {name: why}, "not_exercised": [names (needs a feature the run lacks)],
        "unreachable_hit": [names], "unknown": [hit names not in the model],
        "groups": {group: {"bins", "reachable", "hit"}}}. Not ok when under the floor, when
        a bin declared unreachable was hit (the reachability claim is wrong) or a hit
        names no bin.
    """
    names = {b.name for b in model}
    counted = [b for b in model if b.unreachable is None and (b.needs is None or b.needs in features)]
    missed = [b.name for b in counted if hits.get(b.name, 0) <= 0]
    unreach_hit = [b.name for b in model if b.unreachable is not None and hits.get(b.name, 0) > 0]
    unknown = sorted(n for n, c in hits.items() if n not in names and c > 0)
    groups: dict[str, dict] = {}
    for b in model:
        g = groups.setdefault(b.group, {"bins": 0, "reachable": 0, "hit": 0})
        g["bins"] += 1
        if b in counted:
            g["reachable"] += 1
            g["hit"] += hits.get(b.name, 0) > 0
    n_hit = len(counted) - len(missed)
    pct = 100.0 * n_hit / len(counted) if counted else 100.0
    return {"ok": pct >= floor and not unreach_hit and not unknown, "percent": round(pct, 2),
            "reachable": len(counted), "hit": n_hit, "floor": floor, "missed": missed,
            "unreachable": {b.name: b.unreachable for b in model if b.unreachable is not None},
            "not_exercised": [b.name for b in model if b.unreachable is None and b.needs is not None
                              and b.needs not in features],
            "unreachable_hit": unreach_hit, "unknown": unknown, "groups": groups}


# ---------------------------------------------------------------- directed stimulus

def flag_vectors(p: FormatParams) -> np.ndarray:
    """Every combination of NaN and inf lanes (none, NaN, inf, both) on a zero vector and
    on a full-scale one (a Hadamard row times D at the largest finite value: the
    largest FWHT output, N * max, so the block saturates wherever any input can):
    uint16 [8, N] of ``p.dtype``."""
    from sim_models.fwht import hadamard
    from sim_models.signs import sign_mask

    e_bits, mb, _ = p.in_format
    inf = ((1 << e_bits) - 1) << mb
    top = inf - 1                                  # largest finite pattern
    d = sign_mask(p.n, p.sign_seed).astype(np.int64)
    row = (hadamard(p.n)[1] < 0).astype(np.int64) ^ d
    full = (top | (row << 15)).astype(np.uint16)
    out = []
    for base in (np.zeros(p.n, dtype=np.uint16), full):
        for nan, inf_lane in ((False, False), (True, False), (False, True), (True, True)):
            v = base.copy()
            if nan:
                v[0] = inf | 1
            if inf_lane:
                v[p.n - 1] = inf | (v[p.n - 1] & 0x8000)
            out.append(v)
    return np.array(out, dtype=np.uint16)


def coverage_vectors(p: FormatParams, seed: int = 0) -> np.ndarray:
    """The directed encoder set ``coverage`` (uint16 [V, N] of ``p.dtype``): bins the
    random, adversarial and real sets leave out (docs/VERIFICATION.md, "Coverage"): lanes on every code
    threshold (``kvtest.ties.threshold_tie_vectors``, and the same vectors negated for
    the ties of negative lanes), block maxima on the scale's
    decision points, subnormal bytes included (``scale_tie_vectors``), asym zero points
    on their thresholds (``zero_point_tie_vectors``) and every flag combination with and
    without saturation (:func:`flag_vectors`)."""
    from .ties import scale_tie_vectors, threshold_tie_vectors, zero_point_tie_vectors

    rng = np.random.default_rng([seed, p.n, 17])
    ties = threshold_tie_vectors(p, rng, 64)
    return np.concatenate([ties, ties ^ np.uint16(0x8000), scale_tie_vectors(p),
                           zero_point_tie_vectors(p, rng), flag_vectors(p)])


def coverage_planes(p: FormatParams, seed: int = 0):
    """The directed decoder set ``coverage``: random codes with scale byte 0x00 (a
    zero scale: every encoding reads it as +0, ``sim_models.quant.dequantize``) in each
    block in turn and in all blocks, next to the smallest and largest bytes (exactly
    cancelling lanes among them: an exact zero is +0 before D). Returns ``(codes, scales[, zeros])`` (``kvtest.levels.plane_set``)."""
    from .levels import plane_set, scale_bytes

    rng = np.random.default_rng([seed, p.n, p.bits, 19])
    sb = scale_bytes(p)
    nb = p.n_blocks
    scales = []
    for k in range(nb):
        for other in (sb[0] if sb[0] else sb[1], sb[-1]):
            s = np.full(nb, other, dtype=np.uint8)
            s[k] = 0
            scales.append(s)
    scales.append(np.zeros(nb, dtype=np.uint8))
    scales = np.repeat(np.array(scales, dtype=np.uint8), 4, axis=0)
    v = scales.shape[0]
    codes = rng.integers(0, 256, size=(v, p.code_bytes), dtype=np.uint8)
    q = (1 << p.bits) - 1
    zeros = rng.integers(0, q + 1, size=(v, nb)).astype(np.uint8)
    return plane_set(p, codes, scales, zeros)


def take(t: Trace, idx: np.ndarray) -> Trace:
    """The trace of the vectors ``idx`` (rows of every field)."""
    return Trace(**{f: (None if getattr(t, f) is None else getattr(t, f)[idx])
                    for f in Trace.__dataclass_fields__})
