"""Balanced reduction trees whose every node is a named Signal (readable Verilog)."""

from __future__ import annotations

from amaranth.hdl import Module, Signal


def tree_reduce(m: Module, items: list, fn, name: str):
    """Balanced binary reduction of ``items`` by ``fn`` (e.g. a max); each node has
    the shape of its left operand and the name ``{name}_l{level}_{i}``; an odd
    item out passes to the next level unchanged."""
    level = 0
    while len(items) > 1:
        nxt = []
        for i in range(0, len(items) - 1, 2):
            s = Signal.like(items[i], name=f"{name}_l{level}_{i // 2}")
            m.d.comb += s.eq(fn(items[i], items[i + 1]))
            nxt.append(s)
        if len(items) % 2:
            nxt.append(items[-1])
        items = nxt
        level += 1
    return items[0]


def tree_sum(m: Module, items: list, name: str):
    """Balanced adder tree over a power-of-two number of unsigned ``items``; each
    level widens the nodes by one bit (never overflows)."""
    level = 0
    while len(items) > 1:
        nxt = []
        for i in range(0, len(items), 2):
            v = Signal(len(items[i]) + 1, name=f"{name}_l{level}_{i // 2}")
            m.d.comb += v.eq(items[i] + items[i + 1])
            nxt.append(v)
        items, level = nxt, level + 1
    return items[0]
