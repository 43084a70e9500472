"""The ECP5 block RAM's output register (DP16KD ``REGMODE OUTREG``) for the register behind
a read port: a netlist step between ``synth_ecp5`` and nextpnr.

Yosys maps a memory with a synchronous read port to DP16KD with ``REGMODE_A/B =
"NOREG"`` (``share/lattice/brams_map_16kd.v``): the read data comes straight from the
sense amplifiers, which nextpnr's timing model puts at 5.83 ns clock-to-out
(docs/SYNTH.md), and a fabric register that the RTL puts behind the read port
(``hw.pipeline.ram_delay``'s ``{name}_data``) stays a TRELLIS_FF. The block's own
output register does the same job one cycle after the read, inside the block: with
``OUTREG`` the data leaves the block from a register (Lattice TN1264, "ECP5 Memory
Usage Guide": the output register adds one cycle of read latency). Yosys does not
infer it; :func:`absorb` moves such fabric registers into the blocks.

A DP16KD qualifies when every one of its used read-data bits (``DOA*``/``DOB*`` of a
read port) drives exactly one load, the ``DI`` of a TRELLIS_FF that is clocked on the
rising edge of the block's read clock, always enabled (``CEMUX`` 1), never reset
(``LSR`` constant 0, ``GSR`` disabled) and has no other input in use (``M``); the
block's ports must share one clock and its read clock enable and read reset must be
constant (1 and 0). Then the block's
output registers are enabled (``REGMODE_A/B`` ``OUTREG``, ``OCEA/OCEB`` 1: in the
36-bit mode Yosys uses, both ports' outputs carry the read word, as nextpnr's own
conversion of PDPW16KD sets both), each bit's load net is driven by the block, and the
fabric registers are removed. The function is exact by the primitive's definition,
not by simulation: Yosys ships DP16KD as a black box.
"""

from __future__ import annotations

#: The read-data ports of a DP16KD, by port letter, and that port's clock, clock
#: enable and reset pins.
_PORTS = {p: {"clk": f"CLK{p}", "ce": f"CE{p}", "rst": f"RST{p}", "oce": f"OCE{p}",
              "regmode": f"REGMODE_{p}"} for p in "AB"}


def _param(cell: dict, name: str, default: str = "") -> str:
    """A cell parameter as a string (Yosys JSON pads strings of 0/1 with a space)."""
    return str(cell.get("parameters", {}).get(name, default)).strip()


def _is_const(bits: list, value: str) -> bool:
    return all(b == value for b in bits)


def absorb(netlist: dict, top: str) -> dict:
    """Move the fabric registers behind DP16KD read ports into the blocks' output
    registers, in place (module docstring).

    Args:
        netlist: Yosys JSON (``write_json`` / ``synth_ecp5 -json``), changed in place.
        top: the module whose cells are rewritten.

    Returns:
        ``{"rams": blocks given OUTREG, "ffs": fabric registers removed,
        "rams_left": DP16KD left as they were}``.

    Raises:
        KeyError: ``top`` is not a module of ``netlist``.
    """
    cells = netlist["modules"][top]["cells"]
    loads: dict = {}                       # net bit -> [(cell name, port)]
    for name, c in cells.items():
        for port, bits in c["connections"].items():
            if c.get("port_directions", {}).get(port) == "input":
                for b in bits:
                    if isinstance(b, int):
                        loads.setdefault(b, []).append((name, port))
    for bits in netlist["modules"][top].get("ports", {}).values():
        for b in bits.get("bits", []):     # a module output is a load no cell can replace
            if isinstance(b, int):
                loads.setdefault(b, []).append((None, None))
    done = {"rams": 0, "ffs": 0, "rams_left": 0}
    for name, c in list(cells.items()):
        if c["type"] != "DP16KD":
            continue
        plan = _plan(c, cells, loads)
        if plan is None:
            done["rams_left"] += 1
            continue
        for port, ff in plan:
            c["connections"][port] = list(cells[ff]["connections"]["Q"])
            del cells[ff]
        for p in "AB":
            c["parameters"][_PORTS[p]["regmode"]] = "OUTREG"
            c["connections"][_PORTS[p]["oce"]] = ["1"]
        done["rams"] += 1
        done["ffs"] += len(plan)
    return done


def _plan(ram: dict, cells: dict, loads: dict) -> list | None:
    """[(read-data port, its fabric register)] of one DP16KD when every used read-data bit
    qualifies (module docstring), else None."""
    conn = ram["connections"]
    if any(_param(ram, _PORTS[p]["regmode"], "NOREG") != "NOREG" for p in "AB"):
        return None                        # already registered
    if conn.get("CLKA") != conn.get("CLKB"):
        return None                        # 36-bit mode reads on both ports' outputs: one clock
    plan = []
    for p in "AB":
        used = [(port, bits[0]) for port, bits in conn.items()
                if port.startswith(f"DO{p}") and isinstance(bits[0], int) and loads.get(bits[0])]
        if not used:
            continue
        if not (_is_const(conn.get(_PORTS[p]["ce"], ["1"]), "1")
                and _is_const(conn.get(_PORTS[p]["rst"], ["0"]), "0")
                and _param(ram, f"CLK{p}MUX", f"CLK{p}") == f"CLK{p}"):
            return None
        clk = conn.get(_PORTS[p]["clk"])
        for port, bit in used:
            sinks = loads[bit]
            if len(sinks) != 1 or sinks[0][1] != "DI":
                return None
            ff = cells[sinks[0][0]]
            fc = ff["connections"]
            if not (ff["type"] == "TRELLIS_FF" and fc.get("CLK") == clk
                    and _param(ff, "CLKMUX", "CLK") == "CLK"
                    and _param(ff, "CEMUX", "1") == "1"
                    and _param(ff, "GSR", "DISABLED") == "DISABLED"
                    and _is_const(fc.get("LSR", ["0"]), "0")
                    and _param(ff, "LSRMUX", "LSR") == "LSR"
                    and not any(isinstance(b, int) for b in fc.get("M", []))):
                return None
            plan.append((port, sinks[0][0]))
    return plan or None
