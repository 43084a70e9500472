"""The proof sets of ``python -m verif.formal``: ``full`` (``make formal``), ``ci`` and
``open`` (the proofs without a reliable verdict, :data:`OPEN_PROOFS`).

Each entry is (name, what it proves, thunk returning a proof record of
:mod:`verif.formal.prove`). Widths come from the default format
(``sim_models.FormatParams``: FWHT input = ``mant_bits``; read path: the
dequantized product shape and the ue5m3 alignment span).
"""

from __future__ import annotations

import gc
import warnings
from functools import partial
from pathlib import Path

from amaranth.hdl import UnusedElaboratable

from hw.decoder import KVDecoder, float_consts
from hw.ifwht import FOLD_ALIGN_CYCLES
from hw.options import DecoderOptions, EncoderOptions, FoldOptions
from hw.pipeline import SKID_SLICE_BITS, check_slice_bits
from hw.tofloat import FloatPack
from hw.dequant import level_table, product_shape, scale_format
from hw.encoder import KVEncoder
from sim_models.params import FormatParams

#: FloatPack's split of the Fmax profile (the decoder's default).
PACK_SHIFT_LOW_BITS = DecoderOptions.pack_shift_low_bits

from .prove import FormalError, prove_bmc, prove_comb
from .specs import (BlockFWHTMiter, FloatMiter, FoldAlignMiter, FoldFWHTMiter, FWHTMiter, FWHTPipeMiter,
                    KeyFoldMiter, RoundTripMiter, check_factorization, check_swap)
from .stream import StreamHarness


def fwht_width() -> int:
    """FWHT input width of the default format (``FormatParams.mant_bits``)."""
    return FormatParams.__dataclass_fields__["mant_bits"].default


def read_widths(n: int, block: int) -> tuple[int, int]:
    """(BlockFWHT input width, max_align) of the read path for the default format at (n, block)."""
    p = FormatParams(n=n, block=block)
    return product_shape(level_table(p)).width, scale_format(p).max_align


def _fwht(n, spec, work, timeout):
    check_factorization(n)
    return prove_comb(FWHTMiter(n, fwht_width(), spec), f"fwht_n{n}_{spec}",
                      work, timeout)


def _pipe(n, width, latency, work, timeout):
    return prove_bmc(FWHTPipeMiter(n, width, latency), f"fwht_pipe_n{n}_w{width}_l{latency}",
                     work, depth=latency + 2, timeout=timeout)


def _fold(n, width, latency, work, timeout):
    # one pair from reset: 2 input beats, the network's latency, 2 output beats
    return prove_bmc(FoldFWHTMiter(n, width, latency), f"fwht_fold_n{n}_w{width}_l{latency}",
                     work, depth=latency + 4, timeout=timeout)


#: BMC depth of the fold-alignment proof: one pair from reset (2 input beats), the fold's
#: cycles and one spare.
FOLD_ALIGN_DEPTH = 2 + FOLD_ALIGN_CYCLES + 1


def _fold_align(n, width, max_align, work, timeout, window=None):
    tag = f"_D{window}" if window else ""
    return prove_bmc(FoldAlignMiter(n, width, max_align, 0, window=window),
                     f"ifwht_fold_{'window' if window else 'align'}_n{n}_w{width}_a{max_align}"
                     f"{tag}", work, depth=FOLD_ALIGN_DEPTH, timeout=timeout)


def _block(n, g, spec, work, timeout):
    check_factorization(n)
    check_swap(n, g)
    w, ma = read_widths(n, g)
    return prove_comb(BlockFWHTMiter(n, g, w, ma, spec), f"ifwht_n{n}_g{g}_{spec}", work, timeout)


def _roundtrip(n, g, work, timeout):
    return prove_comb(RoundTripMiter(n, g, fwht_width()), f"roundtrip_n{n}_g{g}",
                      work, timeout)


#: Read-path configurations (``rtl_gen.config`` names) whose float conversion is proved.
#: The float proof again with FloatPack's shifter split (the N=128 and N=64 decoders'
#: Fmax profiles use it); in both sets.
FLOAT_SPLIT_CONFIGS = ("dec_v2_n128_g64_b3_l2", "dec_v2_n64_g32_b3_l2")
FLOAT_CONFIGS = {"ci": ("dec_v2_n16_g8_b3_l1", "dec_v2_n128_g64_b3_l2",
                        "dec_v2_n128_g64_b3_l6_p0_c0_w64_fa"),
                 "full": ("dec_v2_n16_g8_b3_l1", "dec_v2_n128_g64_b3_l2",
                          "dec_v2_n128_g64_b3_l6_p0_c0_w64_fa", "dec_v2_n64_g32_b3_l2_w32_fa",
                          "dec_v2_n128_g64_b3_l2_bf16", "dec_v1_n128_g64_b3_l2",
                          "dec_v2_n128_g64_b3_l2_lloydmax", "dec_v2_n128_g64_b3_l2_asym",
                          "dec_v2_n64_g32_b4_l2_e4m3fn", "dec_v2_n128_g64_b3_l2_e5m2",
                          "dec_v2_n128_g64_b3_l2_ue4m4")}


def float_miter(config: str, dut=None) -> FloatMiter:
    """The float conversion miter of a read-path configuration (one lane, its constants
    from ``hw.decoder.float_consts``: with ``fold_align`` the fold window's lane
    width)."""
    from rtl_gen.config import RTLConfig
    cfg = RTLConfig.parse(config)
    p = cfg.params
    return FloatMiter(float_consts(p, cfg.dec.fold),
                      scale_format(p).exp_bits, dut=dut)


def _float(config, work, timeout):
    return prove_comb(float_miter(config), f"float_{config}", work, timeout)


def _float_split(config, work, timeout):
    """The float miter with FloatPack's right shifter split as in the Fmax profile
    (``DecoderOptions.pack_shift_low_bits``; the two shifters in series, without the
    register between)."""
    from rtl_gen.config import RTLConfig
    c = float_consts(RTLConfig.parse(config).params)
    dut = FloatPack(1, c, shift_low_bits=PACK_SHIFT_LOW_BITS)
    return prove_comb(float_miter(config, dut=dut),
                      f"float_{config}_split{PACK_SHIFT_LOW_BITS}", work, timeout)


def stream_design(kind: str, n: int, g: int, cuts: str, flow: str = "stall",
                  lanes: int | None = None, rc: bool = False):
    """A factory for the stream proofs: kind "enc" (KVEncoder) or "dec" (KVDecoder);
    cuts "min" (FWHT latency 1, no optional registers) or "default"; ``flow`` the flow
    control (``hw.pipeline.FLOWS``); ``lanes`` W (None: N; N/2: two beats per vector);
    ``rc``: the decoder's reset through register copies (``reset_copies``)."""
    p = FormatParams(n=n, block=g)
    if kind == "enc":
        if cuts == "min":
            return lambda: KVEncoder(p, EncoderOptions(fwht_regs=1, quant_regs=(), fe_regs=(),
                                                       flow=flow, lanes=lanes))
        return lambda: KVEncoder(p, EncoderOptions(flow=flow, lanes=lanes))
    if cuts == "min":
        return lambda: KVDecoder(p, DecoderOptions(fwht_regs=1, float_regs=(), flow=flow,
                                                   lanes=lanes, reset_copies=rc))
    return lambda: KVDecoder(p, DecoderOptions(flow=flow, lanes=lanes, reset_copies=rc))


def stream_depth(kind: str, n: int, g: int, cuts: str, flow: str,
                 lanes: int | None = None) -> int:
    """BMC depth of a stream proof: stall flow, latency + 2 (the drain window plus two);
    credit flow, 2 x credits + 1 (fill the skid FIFO while stalled, then drain it)."""
    with warnings.catch_warnings():     # a probe, never elaborated
        warnings.simplefilter("ignore", UnusedElaboratable)
        dut = stream_design(kind, n, g, cuts, flow, lanes)()
        depth = dut.latency_cycles + 2 if flow == "stall" else 2 * dut.credits + 1
        del dut
        gc.collect()
    return depth


def _stream(kind, n, g, cuts, depth, ref, flow, lanes, work, timeout, rc=False):
    h = StreamHarness(stream_design(kind, n, g, cuts, flow, lanes, rc), reference=ref)
    tag = ("_ref" if ref else "") + ("_credit" if flow == "credit" else "") + \
        (f"_w{lanes}" if lanes else "") + ("_rc" if rc else "")
    return prove_bmc(h, f"stream_{kind}_n{n}_g{g}_{cuts}_d{depth}{tag}", work, depth=depth,
                     timeout=timeout)


#: Proofs of the folded key front end (``KeyFoldMiter``, N = 8) as (lane, root, M): ``full``
#: every lane, every root, M = 12, and lane 0 at M = 8 and 16 (the other shift offsets);
#: ``ci``: a lane of each sign-flip bit (mask 0b10101111), one root each.
KEY_FOLD_CASES = {"ci": ((0, 30, 12), (4, 16, 12)),
                  "full": tuple((k, None, 12) for k in range(8)) + ((0, None, 8), (0, None, 16))}


def key_fold_name(lane: int, root, mant_bits: int) -> str:
    return f"keyfold_n8_m{mant_bits}_lane{lane}" + ("" if root is None else f"_root{root}")


def _key_fold(lane, root, mant_bits, work, timeout):
    return prove_comb(KeyFoldMiter(8, mant_bits, root, lane), key_fold_name(lane, root, mant_bits),
                      work, timeout)


def flow_design(flow: str = "credit", stages: int = 0, width: int = 4, beats: int = 1,
                slice_bits: int = SKID_SLICE_BITS):
    """A factory for the order proof of the flow control alone (``kvtest.flowpipe.FlowPipe``:
    the shared FlowControl [and skid FIFO] behind ``stages`` register stages of a
    ``width``-bit counter; ``beats`` = 2: the two-beat input register and the join;
    ``slice_bits``: bits per skid FIFO slice)."""
    from kvtest.flowpipe import FlowPipe
    check_slice_bits(slice_bits)
    return lambda: FlowPipe(flow, stages, width=width, beats=beats, slice_bits=slice_bits)


def _flow(flow, stages, width, beats, work, timeout):
    h = StreamHarness(flow_design(flow, stages, width, beats), reference=True)
    depth = 2 * h.a.credits + 1 if flow == "credit" else h.a.latency_cycles + 6
    tag = f"_b{beats}" if beats > 1 else ""
    return prove_bmc(h, f"stream_flow_{flow}_s{stages}_w{width}_d{depth}{tag}_ref", work,
                     depth=depth, timeout=timeout)


#: Proofs of the complete list that have not reliably reached a verdict on this machine
#: (docs/FORMAL.md, "Sizes and times"; the direct spec at N = 16 once did, in 71 s):
#: ``make formal`` (the ``full`` set) leaves them out, so that it ends with a verdict on
#: every proof it runs; ``--set open`` runs them. Their claims rest on
#: the proofs of the full set plus the arguments in docs/FORMAL.md (the FWHT's stage
#: product; ``H H = N I``; BMC at N = 16 and the reference copy at N = 8 on the encoder).
OPEN_PROOFS = ("fwht_n16_direct", "fwht_pipe_n8_w12_l3", "ifwht_n128_g64_stages",
               "ifwht_n256_g64_stages", "roundtrip_n16_g8", "stream_dec_n8_g8_min_d6_ref")


def plan(name: str) -> list:
    """[(proof name, claim, callable(work, timeout))] of the set ``name``: ``ci``, ``full``
    (``make formal``: every proof but :data:`OPEN_PROOFS`) or ``open`` (those)."""
    if name in ("full", "open"):
        return [it for it in _plan("full") if (it[0] in OPEN_PROOFS) == (name == "open")]
    return _plan(name)


def _plan(name: str) -> list:
    """The proofs of ``ci``, or with ``full`` every proof (OPEN_PROOFS included)."""
    fw = "FWHT(latency 0) == H x, all inputs"
    items = [(f"fwht_n{n}_stages", fw + " (stage product)", partial(_fwht, n, "stages"))
             for n in ((16, 32) if name == "ci" else (16, 32, 64, 128, 256))]
    if name == "full":
        items.append(("fwht_n16_direct", fw + " (matrix row sums)", partial(_fwht, 16, "direct")))
    pipes = [(4, 12, 1), (4, 12, 2)] if name == "ci" else \
        [(8, 12, 1), (8, 12, 2), (8, 12, 3), (16, 12, 2)]
    items += [(f"fwht_pipe_n{n}_w{w}_l{lat}", f"FWHT(latency {lat}): y == H x({lat} enabled "
               "cycles earlier), BMC", partial(_pipe, n, w, lat)) for n, w, lat in pipes]
    folds = [(8, 4, 0)] if name == "ci" else [(8, 4, 0), (8, 4, 1)]
    items += [(f"fwht_fold_n{n}_w{w}_l{lat}", f"FWHT of N points as two beats of N/2 lanes "
               f"(latency {lat}): output beats == H_N (last input pair), BMC {lat + 4}",
               partial(_fold, n, w, lat)) for n, w, lat in folds]
    items.append(("ifwht_fold_align_n4_w3_a5", "read-path FWHT as two beats with the "
                  "alignment in the fold (3-bit inputs, shifts <= 5): (-1)^flip y == "
                  f"H_4 (p << d) of the last pair, BMC {FOLD_ALIGN_DEPTH}", partial(_fold_align, 4, 3, 5)))
    if name == "full":
        items.append(("ifwht_fold_window_n4_w3_a5_D1", "the same with the fold window D = 1: "
                      f"lane i == RO(S_i / 2^e), e = {FoldOptions.window_step} floor(max(d - 1, 0) / "
                      f"{FoldOptions.window_step}), "
                      "where X != 0, exact where "
                      f"X = 0, alt == (X != 0), BMC {FOLD_ALIGN_DEPTH}",
                      partial(_fold_align, 4, 3, 5, window=1)))
    blocks = [(16, 8)] if name == "ci" else [(16, 8), (32, 8), (64, 64), (128, 64), (256, 64)]
    items += [(f"ifwht_n{n}_g{g}_stages", "BlockFWHT == H (p << d), all p, d <= max_align",
               partial(_block, n, g, "stages")) for n, g in blocks]
    items += [(f"float_{c}", "FloatPrep -> FloatPack == RNE-saturating rounding of "
               "(-1)^D S 2^T, every S and ef_min", partial(_float, c)) for c in FLOAT_CONFIGS[name]]
    items += [(f"float_{c}_split{PACK_SHIFT_LOW_BITS}", "the same with FloatPack's right "
               f"shifter split as in the Fmax profile (Lp's {PACK_SHIFT_LOW_BITS} low bit(s) "
               "after the high ones)", partial(_float_split, c)) for c in FLOAT_SPLIT_CONFIGS]
    if name == "full":
        items.append(("roundtrip_n16_g8", "BlockFWHT(FWHT(x)) == N x, all x",
                      partial(_roundtrip, 16, 8)))
    items += [(key_fold_name(k, r, mb), "key front end (folded) == to_block_fp_keys (key; plain: "
               "the identity entry), lane's mantissa, u, flags, every fp16 vector, finite mu_s, "
               "e in LOG2_S_RANGE" + ("" if r is None else f", lanes' max exponent {r}"),
               partial(_key_fold, k, r, mb)) for k, r, mb in KEY_FOLD_CASES[name]]
    cd = stream_depth("enc", 16, 8, "min", "credit")     # 17: 2 x 8 credits + 1 (latency 6)
    wd = stream_depth("enc", 16, 8, "min", "stall", 8)   # two beats: latency 7, + 2
    streams = [("enc", 16, 8, "min", 5, False, "stall", None),
               ("dec", 16, 8, "min", 5, False, "stall", None),
               ("enc", 16, 8, "min", cd, False, "credit", None),
               ("enc", 16, 8, "min", wd, False, "stall", 8)]
    if name == "full":
        streams += [("dec", 16, 8, "min", cd, False, "credit", None),
                    ("enc", 8, 8, "min", 6, True, "stall", None),
                    ("dec", 8, 8, "min", 6, True, "stall", None),
                    ("dec", 16, 8, "min", stream_depth("dec", 16, 8, "min", "stall", 8), False,
                     "stall", 8)]
    items.append(("stream_flow_credit_ref", "credit flow control + skid FIFO alone: hold, "
                  "count, drain, order (reference copy), BMC 2 x credits + 1",
                  partial(_flow, "credit", 0, 4, 1)))
    for f in ("stall", "credit"):
        items.append((f"stream_flow_{f}_b2_ref", f"{f} flow control with two beats per vector "
                      "(input register, join) alone: hold, count, drain, order (reference "
                      "copy)", partial(_flow, f, 1, 4, 2)))
    items += [(f"stream_{k}_n{n}_g{g}_{c}_d{d}{'_ref' if r else ''}"
               f"{'_credit' if f == 'credit' else ''}{f'_w{w}' if w else ''}",
               f"stream ({f} flow{', two beats' if w else ''}): hold, count, drain"
               f"{', order (reference copy)' if r else ''} (BMC {d} cycles)",
               partial(_stream, k, n, g, c, d, r, f, w))
              for k, n, g, c, d, r, f, w in streams]
    if name == "full":      # the decoder's reset through register copies (its domains)
        items.append((f"stream_dec_n16_g8_min_d{cd}_credit_rc", "stream (credit flow, "
                      f"reset copies): hold, count, drain (BMC {cd} cycles)",
                      partial(_stream, "dec", 16, 8, "min", cd, False, "credit", None, rc=True)))
    return items


PLANS = {"full": "make formal", "ci": "the CI subset (tests/test_formal.py)",
         "open": "the proofs without a verdict so far (OPEN_PROOFS; hours, may time out)"}


def run_plan(name: str, work, only=None, timeout: int = 1800, log=print):
    """Run the set; returns (records, exit status: 0 all proved, 1 a proof failed, 2 no verdict)."""
    records, status = [], 0
    log(f"{'proof':34s} {'result':8s} {'cells':>7s} {'SAT vars':>9s} {'clauses':>9s} {'s':>7s}")
    for pname, claim, fn in plan(name):
        if only and only not in pname:
            continue
        try:
            rec = fn(Path(work), timeout)
        except FormalError as err:
            rec, status = {"name": pname, "result": "error", "error": str(err)}, 2
        rec["claim"] = claim
        if rec["result"] == "failed":
            status = max(status, 1)
        records.append(rec)
        log(f"{pname:34s} {rec['result']:8s} {rec.get('cells') or '':>7} "
            f"{rec.get('sat_vars') or '':>9} {rec.get('sat_clauses') or '':>9} "
            f"{rec.get('seconds', ''):>7}")
    return records, status
