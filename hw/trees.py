"""Balanced reduction trees whose every node is a named Signal (readable Verilog).

Both trees take an optional pipeline: ``cut`` (a callable) is applied to the
list of partial results after the levels :func:`tree_cut_levels` names, so the
caller registers them together with whatever else of its vector must stay in
step (``hw.pipeline.stage``); the tree itself never owns a register.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal


def tree_levels(count: int) -> int:
    """Levels of a balanced binary tree over ``count`` items (0 for one item)."""
    return max(0, (count - 1).bit_length())


def tree_cut_levels(levels: int, every: int) -> list[int]:
    """Levels (1-based, ascending) after which a tree of ``levels`` levels is cut when a
    register follows every ``every`` levels (0: none). Counted back from the root and
    never after the root itself (the caller's next cut point sits there), so the
    last segment is always ``every`` levels long: levels 7, every 2 -> [1, 3, 5]."""
    if every <= 0:
        return []
    return list(range(levels - every, 0, -every))[::-1]


def reduce_level(m: Module, items: list, fn, name: str, level: int) -> list:
    """One level of a reduction by ``fn``: nodes ``{name}_l{level}_{i}`` with the shape
    of their left operand; an odd item out passes on unchanged."""
    nxt = []
    for i in range(0, len(items) - 1, 2):
        s = Signal.like(items[i], name=f"{name}_l{level}_{i // 2}")
        m.d.comb += s.eq(fn(items[i], items[i + 1]))
        nxt.append(s)
    if len(items) % 2:
        nxt.append(items[-1])
    return nxt


def sum_level(m: Module, items: list, name: str, level: int) -> list:
    """One level of a widening adder tree (an even number of unsigned items)."""
    nxt = []
    for i in range(0, len(items), 2):
        v = Signal(len(items[i]) + 1, name=f"{name}_l{level}_{i // 2}")
        m.d.comb += v.eq(items[i] + items[i + 1])
        nxt.append(v)
    return nxt


def tree_reduce(m: Module, items: list, fn, name: str, every: int = 0, cut=None):
    """Balanced binary reduction of ``items`` by ``fn`` (e.g. a max), level by level
    (:func:`reduce_level`). With ``every`` > 0 the list of partial results goes
    through ``cut`` after each level of :func:`tree_cut_levels` (a register stage
    of the caller)."""
    after = tree_cut_levels(tree_levels(len(items)), every)
    level = 0
    while len(items) > 1:
        items = reduce_level(m, items, fn, name, level)
        level += 1
        if level in after:
            items = list(cut(items))
    return items[0]


def tree_sum(m: Module, items: list, name: str):
    """Balanced adder tree over a power-of-two number of unsigned ``items``; each
    level widens the nodes by one bit (never overflows)."""
    level = 0
    while len(items) > 1:
        items, level = sum_level(m, items, name, level), level + 1
    return items[0]
