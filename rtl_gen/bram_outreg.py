"""The ECP5 block RAM's output register (DP16KD ``REGMODE OUTREG``) for the register behind
a read port: a netlist step between ``synth_ecp5`` and nextpnr.

Yosys maps a memory with a synchronous read port to DP16KD with ``REGMODE_A/B =
"NOREG"`` (``share/lattice/brams_map_16kd.v``): the read data comes straight from the
sense amplifiers, with a long clock-to-out in nextpnr's timing model
(docs/DECISIONS.md, "Skid FIFO slices"), and a fabric register that the RTL puts behind the read port
(``hw.pipeline.ram_delay``'s ``{name}_data``) stays a TRELLIS_FF. The block's own
output register does the same job one cycle after the read, inside the block: with
``OUTREG`` the data leaves the block from a register (Lattice TN1264, "ECP5 Memory
Usage Guide": the output register adds one cycle of read latency). Yosys does not
infer it; :func:`absorb` moves such fabric registers into the blocks.

A DP16KD qualifies when every one of its used read-data bits (``DOA*``/``DOB*``)
drives exactly one load, the ``DI`` of a plain TRELLIS_FF on the rising edge of the
block's clock: always enabled (``CEMUX`` 1), never reset or set (``LSR`` 0, ``GSR``
disabled), power-up 0 (``REGSET`` RESET), ``M`` unused, no ``keep``; and when both of
the block's ports share that clock, their clock enables are 1, their resets 0, and no
enable, reset or clock is inverted (:func:`_ram_ok`). Then the block's output
registers are enabled (``REGMODE_A/B`` ``OUTREG``, ``OCEA/OCEB`` 1: in the 36-bit
mode Yosys uses, both ports' outputs carry the read word, and nextpnr's own conversion
of PDPW16KD sets both REGMODEs), each bit's load net is driven by the block, and the
fabric registers are removed. The function is exact by the primitive's definition,
not by simulation: Yosys ships DP16KD as a black box.
"""

from __future__ import annotations

#: A DP16KD's pins and parameters by port letter: clock enable, reset, output clock
#: enable, output register mode.
_PORTS = {p: {"ce": f"CE{p}", "rst": f"RST{p}", "oce": f"OCE{p}", "regmode": f"REGMODE_{p}"}
          for p in "AB"}


def _param(cell: dict, name: str, default: str = "") -> str:
    """A cell parameter as a string (Yosys JSON pads strings of 0/1 with a space)."""
    return str(cell.get("parameters", {}).get(name, default)).strip()


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
    for port in netlist["modules"][top].get("ports", {}).values():
        if port.get("direction") == "input":
            continue
        for b in port.get("bits", []):     # a module output is a load no cell can replace
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


def _kept(cell: dict) -> bool:
    """The cell carries a ``keep`` attribute (e.g. :data:`hw.pipeline.REPLICA_ATTRS`)."""
    v = str(cell.get("attributes", {}).get("keep", "0")).strip()
    return any(ch not in "0" for ch in v)


def _ram_ok(ram: dict) -> bool:
    """The block's controls allow an output register equal to the fabric one: both ports
    on one clock net, rising edge, clock enables 1, resets 0, no inverted enables or
    resets, GSR off. Both ports are checked because in the 36-bit mode the read word
    comes out of both ports' outputs (DOA and DOB) while its controls are port B's."""
    conn = ram["connections"]
    if ram.get("type") != "DP16KD" or _param(ram, "GSR", "ENABLED") != "DISABLED":
        return False
    if conn.get("CLKA") != conn.get("CLKB") or not isinstance((conn.get("CLKB") or [""])[0], int):
        return False
    for p in "AB":
        if _param(ram, _PORTS[p]["regmode"], "NOREG") != "NOREG":
            return False                   # already registered
        if conn.get(_PORTS[p]["ce"]) != ["1"] or conn.get(_PORTS[p]["rst"], ["0"]) != ["0"]:
            return False
        for pin in ("CLK", "CE", "OCE", "RST"):
            if _param(ram, f"{pin}{p}MUX", f"{pin}{p}") != f"{pin}{p}":
                return False
    return True


def _ff_ok(ff: dict, clk: list) -> bool:
    """A plain register: TRELLIS_FF on ``clk``'s rising edge, always enabled, never
    reset or set (LSR 0, GSR off), power-up 0 (``REGSET`` RESET, as the block's output
    register), ``M`` unused, not kept apart on purpose (``keep``). Missing parameters
    read as the primitive's defaults (CEMUX CE, GSR ENABLED), which refuse."""
    fc = ff["connections"]
    return (ff["type"] == "TRELLIS_FF" and fc.get("CLK") == clk and not _kept(ff)
            and _param(ff, "CLKMUX", "CLK") == "CLK"
            and _param(ff, "CEMUX", "CE") == "1"
            and _param(ff, "GSR", "ENABLED") == "DISABLED"
            and _param(ff, "REGSET", "RESET") == "RESET"
            and fc.get("LSR", ["0"]) == ["0"]
            and _param(ff, "LSRMUX", "LSR") == "LSR"
            and not any(isinstance(b, int) for b in fc.get("M", [])))


def _plan(ram: dict, cells: dict, loads: dict) -> list | None:
    """[(read-data port, its fabric register)] of one DP16KD when every used read-data bit
    qualifies (module docstring), else None."""
    if not _ram_ok(ram):
        return None
    conn = ram["connections"]
    plan = []
    for port, bits in conn.items():
        if not (port.startswith(("DOA", "DOB")) and isinstance(bits[0], int)
                and loads.get(bits[0])):
            continue
        sinks = loads[bits[0]]
        if len(sinks) != 1 or sinks[0][0] is None or sinks[0][1] != "DI":
            return None
        if not _ff_ok(cells[sinks[0][0]], conn["CLKB"]):
            return None
        plan.append((port, sinks[0][0]))
    return plan or None
