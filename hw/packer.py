"""Code packer: N signed b-bit codes -> the N*b-bit code plane.

Bit-exact with ``sim_models.pack.pack_codes``: lane i's b-bit two's-complement
field occupies bits [i*b, i*b + b) of the plane, least significant bit first,
so plane bit k is bit (k mod 8) of golden byte (k div 8). Pure wiring.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out


class Packer(wiring.Component):
    def __init__(self, n: int, bits: int):
        self.n, self.bits = n, bits
        super().__init__({
            "codes": In(data.ArrayLayout(signed(bits), n)),
            "plane": Out(n * bits),
        })

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.plane.eq(Cat(*(self.codes[i] for i in range(self.n))))
        return m
