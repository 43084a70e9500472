"""Block quantizer: one ue5m3 scale byte per block of G lanes, then b-bit codes.

Bit-exact with the golden model (``sim_models.scale.choose_scale_bytes``
+ ``sim_models.quant.quantize``), without dividers. Rules: docs/FORMAT.md 3.7;
this docstring is their hardware derivation. Supported here: mode ``midtread`` / ``midrise`` /
``lloydmax`` / ``asym``, scale rules ``max`` / ``absmean`` with any
multiplier (see "Scale rule and multiplier" below), rounding ``up`` /
``nearest``, encodings ``ue5m3`` / ``e4m3fn`` / ``e5m2`` / ``ue4m4`` (written
below for ue5m3; the others change Mb, the bias and the largest byte).

Scale selection (:class:`ScaleSelect`). Block maximum A = max|y| (units of
2^u), K = the number of scale units A maps to (midtread h-1, midrise h,
lloydmax L_top/256 = k/2^8, computed as k with u + 8; asym 2h-1 for the
block range hi - lo; h = 2^(b-1)). Every byte s has a *decision value*
D(s) = c(s) 2^x(s):

* ``up``:      D(s) = scale(s) = sig 2^exp;   byte = smallest s in 1..255 with
  A 2^u <= K D(s), else 255.
* ``nearest``: D(s) = (scale(s) + scale(s+1)) / 2 = (2 sig + 1) 2^(exp-1);
  byte = smallest s in 1..254 with A 2^u < K D(s), else 255.
* FLAG_SAT (both): A 2^u > K scale(255).

Normal bytes (exponent field e >= 1) have D = c_m 2^(e - E0) with c_m = 8 + m
(``up``, E0 = 10) or 17 + 2m (``nearest``, E0 = 11), m = 0..7. Let
Cmax = K c_7, J = floor(log2 Cmax). Leading-one detect k = floor(log2 A)
(a log-depth tree, :func:`leading_one`), normalize A_n = A << (W-1-k) and take
R = ceil(A 2^(J-k)) (``up``: the top J+1 bits of A_n plus a sticky bit) or
R = floor(A 2^(J-k)) + 1 (``nearest``: top J+1 bits plus one, which turns the
strict compare into ``<=``). Then for an integer C and j <= J, the byte
predicate at exponent e = k + u + E0 - j is exactly R <= C 2^(J-j):

* j = J if R <= Cmax, else j = J - 1 (which always fits, since 2 K c_0 > Cmax);
  m = #{m' in 0..6 : R > K c_m' 2^(J-j)} (compares against constants).
* That virtual exponent e > 31 -> 0xFF. e >= 1 -> byte e << 3 | m (every
  smaller byte lies on or below the virtual e-1 grid, which does not fit).
* e <= 0 -> a byte s in 1..8: bytes 1..15 have D(s) = K d_s 2^-9 (``up``,
  d_s = s) or K d_s 2^-10 (``nearest``, d_s = 2s+1), so with
  z = J - 9 - k - u (``up``) or J - 10 - k - u (``nearest``), z >= 1 here
  (clamped to [0, J+1]), s = 1 + #{s' in 1..7 : ceil(R / 2^z) > K d_s'}.
* A == 0 -> byte 0x01.
* FLAG_SAT: the ``up`` rule's virtual exponent exceeds 31 (for ``nearest`` a
  second, cheap R with J' = floor(log2 15K) gives it).

Codes (:class:`Thresholds` + per-lane compares): the golden rule counts
j in 1..h-1 with |y| 2^u 2^f >= a_j scale, a_j = 2j-1, f = 1 (midtread) or
a_j = j, f = 0 (midrise), i.e. |y| >= T_j = ceil(a_j sig 2^(exp-u-f)). T_j is
computed once per block by a clamped shift (saturated to 2^W_y, "never", when
it exceeds every |y|); each lane needs h-1 magnitude compares. Code:
midtread c = sign(y) m (ties away from zero); midrise c = m if y >= 0 else
-1-m (ties to the outer level, y = 0 -> c = 0).

Scale rule and multiplier: the golden compare is C D(s) >= mult Kd X 2^u with
C = 256 Kn (max) or 256 G (absmean), X = max|y| / hi - lo / sum|y|
(sim_models.scale). With mult = odd 2^p it is fed to ScaleSelect as
Kn' D(s) >= (odd X) 2^(u + p + log2 Kd - 8) (absmean: Kn' = 1 and the shift
lowered by log2 G): one constant multiplier by the odd part per block.

Mode ``asym`` (unsigned codes 0..Q, Q = 2^b - 1, one zero point per block):
two max trees give hi = max(y, 0) and -lo = max(-y, 0) per block; the scale
select sees A = hi - lo with K = Q; the Q thresholds are the midtread ones
(a_j = 2j-1, f = 1, j = 1..Q); the zero point z = #{j : -lo >= T_j} (round
half up) goes to the ``zeros`` output (one byte per block) and each lane's code
is clip(z + sign(y) #{j : |y| >= T_j}, 0, Q).

Pipeline (:class:`Quantizer`): the steps |y| + block max tree -> leading-one
+ normalize -> rest of the scale select -> thresholds -> lane compares, with
optional registers (``regs``, names in :data:`QUANT_CUTS`): ``maxhalf`` in the
middle of the max tree, ``max`` after it, ``norm`` inside the scale select,
``scale`` after it, ``thr`` after the thresholds. Every register carries the
rest of the vector (|y|, signs, u, flags, valid) and advances with ``en``. The
outputs are combinational from the last register (the top level registers
them again). Latency = len(regs) cycles.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from sim_models.minifloat import scale_encoding
from sim_models.params import SCALE_ENCODINGS, SCALE_ROUNDING, FormatParams
from sim_models.quant import threshold_coefs
from sim_models.scale import max_units

from .frontend import tree_reduce
from .pipeline import check_cuts

#: Pipeline cut points of :class:`Quantizer`, in data-flow order: in the middle
#: of the block max tree (after floor(log2(G)/2) levels), after the block max
#: tree, inside the scale select (after leading-one + normalization), after the
#: scale select, after the thresholds.
QUANT_CUTS = ("maxhalf", "max", "norm", "scale", "thr")


def _shape_range(lo: int, hi: int) -> Shape:
    return Shape.cast(range(lo, hi + 1))


def _bounds(shape: Shape) -> tuple[int, int]:
    shape = Shape.cast(shape)
    if shape.signed:
        return -(1 << (shape.width - 1)), (1 << (shape.width - 1)) - 1
    return 0, (1 << shape.width) - 1


def _k_units(mode: str, bits: int) -> tuple[int, int]:
    """(k, k_shift) with K = k / 2^k_shift = ``sim_models.scale.max_units``."""
    kn, kd = max_units(FormatParams(mode=mode, bits=bits))
    return kn, kd.bit_length() - 1


def leading_one(m: Module, a, name: str):
    """Position of the highest set bit of ``a`` (0 when a == 0), log depth.

    Binary tree over the bits padded to 2^k: a node reports ``any = any_lo |
    any_hi`` and ``pos = Cat(any_hi ? pos_hi : pos_lo, any_hi)``, one 3-input
    function per position bit and level (ceil(log2 width) levels).

    Returns:
        (pos, any): ``pos`` unsigned, max(1, ceil(log2 len(a))) bits.
    """
    w = len(a)
    k = max(1, (w - 1).bit_length())
    nodes = [(a[i], None) if i < w else (0, None) for i in range(1 << k)]
    level = 0
    while len(nodes) > 1:
        nxt = []
        for j in range(len(nodes) // 2):
            (alo, plo), (ahi, phi) = nodes[2 * j], nodes[2 * j + 1]
            an = Signal(name=f"{name}_a{level}_{j}")
            pn = Signal(level + 1, name=f"{name}_p{level}_{j}")
            m.d.comb += an.eq(alo | ahi)
            if plo is None:
                m.d.comb += pn.eq(ahi)
            else:
                m.d.comb += pn.eq(Cat(Mux(ahi, phi, plo), ahi))
            nxt.append((an, pn))
        nodes = nxt
        level += 1
    return nodes[0][1], nodes[0][0]


def _encoding(name: str):
    """The sim_models ScaleEncoding ``name`` (ValueError naming ``scale`` if unknown)."""
    if name not in SCALE_ENCODINGS:
        raise ValueError(f"scale must be one of {SCALE_ENCODINGS}, got {name!r}")
    return scale_encoding(name)


def _scale_rule(k: int, rounding: str, scale: str = "ue5m3"):
    """Constants of the decision values of encoding ``scale`` (module docstring).

    Returns (c_m for m = 0 .. 2^Mb - 1, E0, d_s for s = 1 .. 2^Mb - 1, z offset, ceil?).
    """
    enc = _encoding(scale)
    mb, bias = enc.mant_bits, enc.bias
    nm = 1 << mb
    if rounding == "up":
        return ([k * (nm + i) for i in range(nm)], bias + mb, [k * s for s in range(1, nm)],
                bias + mb - 1, True)
    if rounding == "nearest":
        return ([k * (2 * (nm + i) + 1) for i in range(nm)], bias + mb + 1,
                [k * (2 * s + 1) for s in range(1, nm)], bias + mb, False)
    raise ValueError(f"scale_round must be one of {SCALE_ROUNDING}, got {rounding!r}")


class ScaleSelect(wiring.Component):
    """Combinational scale-byte selector for the max rule (see module docstring).

    Args:
        a_width: width of the unsigned block maximum A.
        u_shape: shape of the signed unit exponent u.
        k: K (times 2^k_shift), scale units the block maximum maps to
            (``sim_models.scale.max_units``), an int >= 1.
        rounding: ``"up"`` or ``"nearest"`` (``FormatParams.scale_round``).
        pipelined: register (advanced by ``en``) after the leading-one detect and
            normalization: ``byte``/``sat`` then follow ``a``/``u`` by one cycle.
        scale: scale-byte encoding (``FormatParams.scale``), default ``"ue5m3"``.
        k_shift: K = k / 2^k_shift (lloydmax: L_top / 256); the rule compares
            ``k D(s) >= A 2^(u + k_shift)``; any int (negative: K = k 2^-k_shift).

    Ports: ``a``, ``u``, ``en`` in; ``byte`` (8), ``sat`` (1) out.

    Raises:
        ValueError: ``k`` < 1, an unknown ``rounding`` or ``scale``.
    """

    def __init__(self, a_width: int, u_shape, k: int, rounding: str, pipelined: bool = False,
                 scale: str = "ue5m3", k_shift: int = 0):
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k (scale units of the block maximum) must be an int >= 1, got {k!r}")
        if not isinstance(k_shift, int):
            raise ValueError(f"k_shift must be an int, got {k_shift!r}")
        _scale_rule(k, rounding, scale)
        self.a_width, self.u_shape, self.k, self.rounding = a_width, Shape.cast(u_shape), k, rounding
        self.pipelined = bool(pipelined)
        self.scale, self.k_shift = scale, k_shift
        super().__init__({
            "a": In(a_width),
            "u": In(u_shape),
            "en": In(1),
            "byte": Out(8),
            "sat": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        K = self.k
        enc = _encoding(self.scale)
        mb, nm = enc.mant_bits, 1 << enc.mant_bits
        e_top = (int(enc.bytes[-1]) >> mb)          # largest exponent field in use
        byte_max = int(enc.bytes[-1])
        sig_top, exp_top = int(enc.sig[-1]), int(enc.exp[-1])
        cn, e0, cs, zoff, ceil = _scale_rule(K, self.rounding, self.scale)
        J = cn[-1].bit_length() - 1
        J_s = (K * sig_top).bit_length() - 1       # FLAG_SAT: compare with K scale(byte_max)
        W = max(self.a_width, J + 1, J_s + 1)
        ulo, uhi = _bounds(self.u_shape)
        ulo, uhi = ulo + self.k_shift, uhi + self.k_shift

        a = Signal(W)
        m.d.comb += a.eq(self.a)
        k, nz = leading_one(m, a, "lead")
        lz = Signal(range(W))
        m.d.comb += lz.eq(W - 1 - k)
        an = Signal(W)
        m.d.comb += an.eq(a << lz)

        def top_bits(jj: int, up: bool, name: str):
            """ceil(A 2^(jj-k)) (up) or floor(A 2^(jj-k)) + 1, jj+2 bits."""
            low = W - 1 - jj
            r = Signal(jj + 2, name=name)
            if up:
                m.d.comb += r.eq(an[low:] + an[:low].any() if low > 0 else an)
            else:
                m.d.comb += r.eq(an[low:] + 1)
            return r

        r = top_bits(J, ceil, "r")
        r_s = top_bits(J_s, True, "r_sat")
        u = Signal(_shape_range(ulo, uhi), name="u_eff")
        m.d.comb += u.eq(self.u + self.k_shift)
        if self.pipelined:
            def reg(v, name, reset_less=True):
                q = Signal.like(v, name=name, reset_less=reset_less)
                with m.If(self.en):
                    m.d.sync += q.eq(v)
                return q
            # norm_nz has a reset only so that the module's rst port is used (lint)
            k, nz, r, u = (reg(k, "norm_k"), reg(nz, "norm_nz", False), reg(r, "norm_r"),
                           reg(u, "norm_u"))
            r_s = reg(r_s, "norm_r_sat")
        fit_j = Signal()
        m.d.comb += fit_j.eq(r <= cn[-1])
        mant = Signal(mb)
        with m.If(fit_j):
            m.d.comb += mant.eq(sum(r > cn[i] for i in range(nm - 1)))
        with m.Else():
            m.d.comb += mant.eq(sum(r > 2 * cn[i] for i in range(nm - 1)))
        # virtual exponent field e = k + u + E0 - j
        ev = Signal(_shape_range(ulo + e0 - J, W - 1 + uhi + e0 - J + 1))
        m.d.comb += ev.eq(k + u + (e0 - J) + ~fit_j)

        # bytes 1 .. 2^Mb: D(s) = K d_s 2^-(zoff)
        zr = Signal(_shape_range(J - zoff - (W - 1) - uhi, J - zoff - ulo))
        m.d.comb += zr.eq(J - zoff - k - u)
        z = Signal(range(J + 2))
        m.d.comb += z.eq(Mux(zr < 0, 0, Mux(zr > J + 1, J + 1, zr)))
        rs = Signal(J + 2)
        m.d.comb += rs.eq(r >> z)
        rc = Signal(J + 3)
        m.d.comb += rc.eq(rs + ((rs << z) != r))
        sub = Signal(mb + 1)
        m.d.comb += sub.eq(1 + sum(rc > c for c in cs))

        # FLAG_SAT: A 2^u > K scale(byte_max) = K sig_top 2^exp_top, in [2^kv, 2^(kv+1))
        kv = J_s + exp_top
        ku = Signal(_shape_range(ulo, W - 1 + uhi), name="ku")
        m.d.comb += ku.eq(k + u)
        m.d.comb += self.sat.eq(nz & ((ku > kv) | ((ku == kv) & (r_s > K * sig_top))))

        vbyte = Signal(mb + enc.exp_bits + 1, name="vbyte")     # virtual byte, unclamped
        m.d.comb += vbyte.eq(Cat(mant, ev[:enc.exp_bits + 1]))
        with m.If(~nz):
            m.d.comb += self.byte.eq(1)
        with m.Elif(ev > e_top):
            m.d.comb += self.byte.eq(byte_max)
        with m.Elif(ev >= 1):
            m.d.comb += self.byte.eq(Mux(vbyte > byte_max, byte_max, vbyte))
        with m.Else():
            m.d.comb += self.byte.eq(sub)
        return m


class Thresholds(wiring.Component):
    """Per-block code thresholds T_j = ceil(a_j sig 2^(exp-u-f)), j = 1..h-1.

    Args:
        y_width: width of |y|; thresholds saturate to 2^y_width (no |y| reaches it).
        u_shape: shape of u.
        coefs: a_j (positive ints), frac: f (``sim_models.quant.threshold_coefs``).
        scale: scale-byte encoding of ``byte`` (default ``"ue5m3"``).

    Ports: ``byte``, ``u`` in; ``th`` (len(coefs) x (y_width+1) bits) out.
    Combinational.
    """

    def __init__(self, y_width: int, u_shape, coefs, frac: int, scale: str = "ue5m3"):
        self.y_width, self.u_shape = y_width, Shape.cast(u_shape)
        self.coefs, self.frac = tuple(int(c) for c in coefs), int(frac)
        if not self.coefs or min(self.coefs) < 1 or self.frac < 0:
            raise ValueError(f"coefs must be positive ints and frac >= 0, got {coefs!r}, {frac!r}")
        _encoding(scale)
        self.scale = scale
        super().__init__({
            "byte": In(8),
            "u": In(u_shape),
            "th": Out(data.ArrayLayout(unsigned(y_width + 1), len(self.coefs))),
        })

    def elaborate(self, platform):
        m = Module()
        enc = _encoding(self.scale)
        mb, eb, bias = enc.mant_bits, enc.exp_bits, enc.bias
        wy = self.y_width
        cbits = (max(self.coefs) * ((2 << mb) - 1)).bit_length()
        e = self.byte[mb:mb + eb]
        mm = self.byte[:mb]
        sig = Signal(mb + 1)
        m.d.comb += sig.eq(Mux(e == 0, mm, mm + (1 << mb)))
        ulo, uhi = _bounds(self.u_shape)
        f = self.frac
        off = bias + mb + f
        d = Signal(_shape_range(1 - off - uhi, (1 << eb) - 1 - off - ulo))
        m.d.comb += d.eq(Mux(e == 0, 1, e) - off - self.u)
        dp = Signal(range(wy + 1))
        m.d.comb += dp.eq(Mux(d < 0, 0, Mux(d > wy, wy, d)))
        dn = Signal(range(cbits + 1))
        m.d.comb += dn.eq(Mux(d >= 0, 0, Mux(-d > cbits, cbits, -d)))
        sat_val = 1 << wy
        for j, aj in enumerate(self.coefs, start=1):
            c = Signal(cbits, name=f"c{j}")
            m.d.comb += c.eq(sig * aj)
            tp = Signal(cbits + wy, name=f"tpos{j}")
            m.d.comb += tp.eq(c << dp)
            cs = Signal(cbits, name=f"cshr{j}")
            m.d.comb += cs.eq(c >> dn)
            tn = Signal(cbits + 1, name=f"tneg{j}")
            m.d.comb += tn.eq(cs + ((cs << dn) != c))
            with m.If(d >= 0):
                m.d.comb += self.th[j - 1].eq(Mux(tp >= sat_val, sat_val, tp))
            with m.Else():
                m.d.comb += self.th[j - 1].eq(tn)
        return m


def check_regs(regs) -> tuple[str, ...]:
    """Validate a quantizer register placement (names from :data:`QUANT_CUTS`); see
    :func:`hw.pipeline.check_cuts`."""
    return check_cuts("quant_regs", regs, QUANT_CUTS)


class Quantizer(wiring.Component):
    """Pipelined block quantizer (see module docstring).

    Args:
        n, block, bits: N, G, b.
        y_in_width: signed width of the FWHT output lanes (M + log2 N).
        u_shape: shape of the unit exponent.
        mode: ``"midtread"``, ``"midrise"``, ``"lloydmax"`` or ``"asym"`` (adds
            the ``zeros`` output: one zero-point byte per block).
        rounding: scale rounding, ``"up"`` or ``"nearest"``.
        regs: register cut points, a subset of :data:`QUANT_CUTS`; latency = len(regs).
        scale: scale-byte encoding (``FormatParams.scale``).

    Ports: ``en`` (advance the registers), ``i_valid``, ``y``, ``u``, ``flags_i``
    (NaN, Inf) in; ``o_valid``, ``codes``, ``scales``, ``flags`` (NaN, Inf, SAT)
    out, combinational from the last register (or the inputs when ``regs`` is empty).
    """

    def __init__(self, n: int, block: int, bits: int, y_in_width: int, u_shape, *,
                 mode: str, rounding: str, regs=("scale",), scale: str = "ue5m3",
                 rule: str = "max", mult: int = 256):
        self.n, self.block, self.bits = n, block, bits
        if rule not in ("max", "absmean"):      # rms: refused by hw.epilogue.EPILOGUE_SUPPORT
            raise ValueError(f"scale_rule must be 'max' or 'absmean' in the RTL quantizer, got {rule!r}")
        if not isinstance(mult, int) or not 1 <= mult <= 511:
            raise ValueError(f"scale_mult must be an int in [1, 511], got {mult!r}")
        if mode == "asym" and rule != "max":
            raise ValueError(f"scale_rule must be 'max' for mode 'asym', got {rule!r}")
        self.rule, self.mult = rule, mult
        # the rule: C D(s) >= mult Kd stat 2^u, C = 256 Kn (max) or 256 G (absmean);
        # with mult = odd 2^p: Kn' D(s) >= (odd stat) 2^(u + p + log2 Kd - 8)
        p2 = (mult & -mult).bit_length() - 1
        self.mult_odd = mult >> p2
        if rule == "max":
            self.kunits, ks = _k_units(mode, bits)
        else:
            self.kunits, ks = 1, -(block.bit_length() - 1)
        self.k_shift = ks + p2 - 8
        self.coefs, self.frac = threshold_coefs(mode, bits)
        _scale_rule(self.kunits, rounding, scale)
        self.scale = scale
        self.mode, self.rounding = mode, rounding
        self.regs = check_regs(regs)
        self.n_blocks = n // block
        self.y_in_width = y_in_width
        self.y_width = y_in_width - 1   # |y| < 2^(M-1+log2 N)
        self.u_shape = Shape.cast(u_shape)
        ports = {
            "en": In(1),
            "i_valid": In(1),
            "y": In(data.ArrayLayout(signed(y_in_width), n)),
            "u": In(u_shape),
            "flags_i": In(2),
            "o_valid": Out(1),
            "codes": Out(data.ArrayLayout(signed(bits), n)),
            "scales": Out(data.ArrayLayout(8, self.n_blocks)),
            "flags": Out(3),
        }
        if mode == "asym":
            ports["zeros"] = Out(data.ArrayLayout(8, self.n_blocks))
        super().__init__(ports)

    @property
    def latency(self) -> int:
        """Register stages inside the quantizer."""
        return len(self.regs)

    def elaborate(self, platform):
        m = Module()
        n, g, wy, nb = self.n, self.block, self.y_width, self.n_blocks

        def cut(name, values: dict) -> dict:
            """Register every value of ``values`` (a dict name -> Value) at cut ``name``."""
            if name not in self.regs:
                return values
            out = {}
            for key, v in values.items():
                if key == "valid":
                    r = Signal(name=f"{name}_valid")
                else:
                    r = Signal.like(v, name=f"{name}_{key}", reset_less=True) \
                        if isinstance(v, Signal) else Signal(len(v), name=f"{name}_{key}",
                                                             reset_less=True)
                with m.If(self.en):
                    m.d.sync += r.eq(v)
                out[key] = r
            return out

        # ---- |y|, block max -------------------------------------------------------
        mags, negs = [], Signal(n, name="neg")
        for i in range(n):
            yv = self.y[i]
            mag = Signal(wy, name=f"abs{i}")
            m.d.comb += mag.eq(Mux(yv < 0, -yv, yv))
            mags.append(mag)
            m.d.comb += negs[i].eq(yv < 0)
        def vmax(a, b):
            return Mux(a > b, a, b)

        asym = self.mode == "asym"
        # max trees: of |y| (symmetric modes); asym: of max(y, 0) ("hi") and of
        # max(-y, 0) ("nlo" = -lo), whose sum is the block range hi - lo
        if asym:
            trees = {"hi": [Mux(negs[i], 0, mags[i]) for i in range(n)],
                     "nlo": [Mux(negs[i], mags[i], 0) for i in range(n)]}
        elif self.rule == "absmean":
            trees = {"sum": mags}
        else:
            trees = {"max": mags}

        def vsum(a, b):
            return a + b

        def reduce(items, fn, name):
            if fn is vmax:
                return tree_reduce(m, items, fn, name)
            level = 0                        # sums: one more bit per level
            while len(items) > 1:
                nxt = []
                for i in range(0, len(items), 2):
                    v = Signal(len(items[i]) + 1, name=f"{name}_l{level}_{i // 2}")
                    m.d.comb += v.eq(items[i] + items[i + 1])
                    nxt.append(v)
                items, level = nxt, level + 1
            return items[0]
        half = (g.bit_length() - 1) // 2         # tree levels before the "maxhalf" cut
        per = g >> half
        st = {"valid": self.i_valid, "u": self.u, "flags": self.flags_i, "neg": negs,
              **{f"abs{i}": mags[i] for i in range(n)}}
        for t, items in trees.items():
            if asym:
                items = [Signal(wy, name=f"{t}{i}") for i in range(n)]
                m.d.comb += [d.eq(v) for d, v in zip(items, trees[t])]
            fn = vsum if t == "sum" else vmax
            for b in range(nb):
                for i in range(per):
                    lo_i = b * g + (i << half)
                    st[f"p{t}{b}_{i}"] = reduce(items[lo_i:lo_i + (1 << half)], fn,
                                                f"b{t}{b}_{i}")
        st = cut("maxhalf", st)
        for t in trees:
            fn = vsum if t == "sum" else vmax
            for b in range(nb):
                st[f"{t}{b}"] = reduce([st.pop(f"p{t}{b}_{i}") for i in range(per)], fn,
                                       f"b{t}{b}")
        if asym:
            for b in range(nb):
                rng_ = Signal(wy + 1, name=f"range{b}")
                m.d.comb += rng_.eq(st.pop(f"hi{b}") + st[f"nlo{b}"])
                st[f"amax{b}"] = rng_
        else:
            for b in range(nb):
                st[f"amax{b}"] = st.pop(f"{next(iter(trees))}{b}")
        if self.mult_odd != 1:       # the statistic times the odd part of scale_mult
            for b in range(nb):
                v = st[f"amax{b}"]
                x = Signal(len(v) + self.mult_odd.bit_length(), name=f"stat{b}")
                m.d.comb += x.eq(v * self.mult_odd)
                st[f"amax{b}"] = x
        st = cut("max", st)

        # ---- scale select -------------------------------------------------------------
        bytes_, sats = [], []
        for b in range(nb):
            sel = ScaleSelect(len(st[f"amax{b}"]), self.u_shape, self.kunits, self.rounding,
                              pipelined="norm" in self.regs, scale=self.scale,
                              k_shift=self.k_shift)
            m.submodules[f"scale{b}"] = sel
            m.d.comb += [sel.a.eq(st[f"amax{b}"]), sel.u.eq(st["u"]), sel.en.eq(self.en)]
            bytes_.append(sel.byte)
            sats.append(sel.sat)
        st = {k: v for k, v in st.items() if not k.startswith("amax")}
        st = cut("norm", st)            # the rest of the vector, in step with ScaleSelect
        flags = Signal(3, name="qflags")
        m.d.comb += flags.eq(Cat(st["flags"], Cat(*sats).any()))
        st.update({"flags": flags, **{f"scale{b}": bytes_[b] for b in range(nb)}})
        st = cut("scale", st)

        # ---- thresholds ---------------------------------------------------------------
        nth = len(self.coefs)
        for b in range(nb):
            th = Thresholds(wy, self.u_shape, self.coefs, self.frac, self.scale)
            m.submodules[f"thr{b}"] = th
            m.d.comb += [th.byte.eq(st[f"scale{b}"]), th.u.eq(st["u"])]
            for j in range(nth):
                st[f"th{b}_{j}"] = th.th[j]
        del st["u"]
        st = cut("thr", st)

        # ---- lane compares ------------------------------------------------------------
        for b in range(nb):
            m.d.comb += self.scales[b].eq(st[f"scale{b}"])
            if asym:       # zero point z = round(-lo / scale), ties up (Q thresholds)
                zp = Signal(range(nth + 1), name=f"zero{b}")
                m.d.comb += zp.eq(sum(st[f"nlo{b}"] >= st[f"th{b}_{j}"] for j in range(nth)))
                m.d.comb += self.zeros[b].eq(zp)
            for i in range(b * g, (b + 1) * g):
                cnt = Signal(range(nth + 1), name=f"cnt{i}")
                m.d.comb += cnt.eq(sum(st[f"abs{i}"] >= st[f"th{b}_{j}"] for j in range(nth)))
                neg = st["neg"][i]
                if self.mode == "midtread":
                    m.d.comb += self.codes[i].eq(Mux(neg, -cnt, cnt))
                elif asym:
                    v = Signal(range(-nth, 2 * nth + 1), name=f"zr{i}")
                    m.d.comb += v.eq(zp + Mux(neg, -cnt, cnt))
                    m.d.comb += self.codes[i].eq(Mux(v < 0, 0, Mux(v > nth, nth, v)))
                else:
                    m.d.comb += self.codes[i].eq(Mux(neg, -1 - cnt, cnt))
        m.d.comb += [self.o_valid.eq(st["valid"]), self.flags.eq(st["flags"])]
        return m
