// fwht-kv write path on the GPU: fp16/bf16 K or V vectors -> code plane, scale plane, flags.
//
// Bit-exact with the golden model sim_models.encode (sim_models/codec.py): the same integer
// pipeline, evaluated with exact arithmetic:
//   -> special values (NaN -> +0, +-inf -> +-max finite)  -> sign flip D (SplitMix64 mask)
//   -> block floating point (one shared exponent, M-bit mantissas, round half away from zero);
//      keys with KEYF != 0: the folded key front end instead (x s - mu' inside block floating point, below)
//   -> unnormalized Sylvester FWHT (log2 N butterfly stages)
//   -> per block of G lanes a ue5m3 scale byte for K*scale ~ max|y|*2^u (K = 2^(b-1)-1 mid-tread,
//      2^(b-1) mid-rise), rounded up (smallest byte with K*scale >= max|y|*2^u) or to nearest
//      (smallest byte whose midpoint (2 sig + 1) 2^(exp-1) satisfies K*mid > max|y|*2^u, ties up)
//   -> mid-tread codes (ties away from zero) or mid-rise codes (c = m if y >= 0 else -1 - m,
//      m = #{j in 1..2^(b-1)-1 : |y| 2^u >= j scale}) -> LSB-first packing.
// MODE (0 mid-tread, 1 mid-rise) and RND (0 up, 1 nearest) are template parameters
// (docs/FORMAT.md 3.7; sim_models/quant.py, sim_models/scale.py).
// No fp32 operation sees a subnormal operand or result where it matters (CuPy's NVRTC runs with
// -ftz=true): bf16 inputs are scaled by integer exponent arithmetic when -u >= 126 (the only case in
// which a subnormal lane can round to a nonzero mantissa), the code multiplier stays >= 2^-126.
// v6 shortcuts (fp32 butterflies, no mantissa clamp; fast quantizer when M - 1 + log2 N <= 20), each
// argued exact where it is used: mantissa rounding and sign in ONE FMA per lane, the scale byte from a
// double estimate plus two exact compares, codes by ONE FMA per lane plus one shift-add (LEA) per lane.
// Exactness argument (see gpu_ref/__init__.py "Method"): every float operation below acts on
// integers below 2^24 or multiplies by a power of two inside the normal range, so it is exact;
// the rounding of the mantissas uses two round-down adds, floor(RD(v + 1/2)) == floor(v + 1/2).
// When M - 1 + log2 N > 24 the butterflies run on int32 instead of fp32.
//
// Thread mapping: one thread holds LPT = min(N, 128) lanes of one vector in registers
// (TPV = N / LPT threads per vector, cross-thread butterfly stages by warp shuffles).
// A persistent grid of 128-thread blocks double-buffers 128*LPT input lanes per tile in
// shared memory with cp.async (coalesced 16-byte copies); the tile's output rows (out_rows, one 8-byte
// copy per vector) travel with it, so the stores at the end of a tile wait for no global load.
//
// Key front end (template KEYF: bit 0 per-channel key scales s = 2^e, bit 1 centering; fp16 keys only): the
// folded key front end of docs/FORMAT.md 8 (sim_models.bfp.to_block_fp_keys), in place of block floating
// point: per lane the exact scaled exponent Ex = E + e (saturated to +-65504 when Ex > 30), the centering
// entry mu' = RN16(mu s) decoded beside it, emax = 1 + max over the vector of max(Ex, Em), both
// significands aligned to emax as 3.3 aligns them (round half away from zero), one subtraction, a clamp to
// +-(2^(M-1) - 1), then D; NaN/inf lanes read as +0/+-max with e = 0, mu' = +0 (and flagged). Vectors of
// finite lanes: exponents two lanes per instruction, mantissas in fp32 (exact steps, argued below); a
// vector with a NaN or inf lane: the golden model's integer steps in int32; e is the exponent field of s
// minus 15. Rows that are not encoded (sink tokens) take the fp16 rule
// x' = RNE16(sat(RN16(x s)) - mu') of sim_models.keyscale.key_front (kv_key_front, key_front_pair: one
// fp16x2 multiply and one fp16x2 subtract per pair of lanes, IEEE round to nearest even, subnormals kept).
// Table (built by gpu_ref.encode.key_table): 16-byte entries tab[c * key_heads + h] holding, for words
// (lane pairs) c*WPC .. c*WPC+WPC-1 of kv head h, the fp16x2 words of s and/or mu' (s, mu' interleaved
// when both: WPC = 2; WPC = 4 with one of them), so the 32 vectors of a warp (consecutive kv heads)
// read one contiguous run per load.
//
// Arguments: one KvEncodeArgs struct (kv_common.cuh).
// Shared definitions: kv_common.cuh (NVRTC gets -I of this folder).

#include "kv_common.cuh"

namespace kv_enc {
using namespace kv_common;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  int n = pred ? 16 : 0;  // src-size 0: zero fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, bool pred) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  int n = pred ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async16_full(void* smem, const void* gmem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
// fp16 half `hi` (0: bits 0-15, 1: bits 16-31) of a packed pair -> float, no extraction op
__device__ __forceinline__ float h2f_half(kv_u32 w, int hi) {
  float f;
  if (hi) asm("{ .reg .f16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "r"(w));
  else asm("{ .reg .f16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, l; }" : "=f"(f) : "r"(w));
  return f;
}
__device__ __forceinline__ kv_u32 max_u16x2(kv_u32 a, kv_u32 b) {
  kv_u32 d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ kv_u32 max_s16x2(kv_u32 a, kv_u32 b) {
  kv_u32 d;
  asm("max.s16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ kv_u32 relu_max_s16x2(kv_u32 a) {  // each signed half, negative -> 0
  kv_u32 d;
  asm("max.relu.s16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(0u));
  return d;
}
// Two packed bf16 values times 2^64, exact, as bf16 patterns (exponent fields <= 190). Normal
// lanes: exponent field + 64; subnormal lanes (F 2^-133) become the normal bf16 F 2^-69 (F < 2^7
// fits the 8-bit significand), built by an integer -> float conversion: CuPy compiles with
// -ftz=true, so a float multiply would flush them to zero.
__device__ __forceinline__ kv_u32 bf16x2_x2p64(kv_u32 w) {
  kv_u32 r = 0;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const kv_u32 h = (w >> (16 * hh)) & 0xFFFFu, fr = h & 0x7Fu;
    kv_u32 o = h;
    if (h & 0x7F80u) o = h + (64u << 7);
    else if (fr) o = (h & 0x8000u) | (__float_as_uint(__uint2float_rn(fr) * exp2i(-69)) >> 16);
    r |= o << (16 * hh);
  }
  return r;
}

// exact a*2^ea >= b*2^eb for 0 <= a, b < 2^31 (sim_models.exact.ge_scaled); the shift is clamped at 32
// (operands < 2^63), beyond which the outcome depends only on which of a, b is zero
__device__ __forceinline__ bool ge_pow2(long long a, int ea, long long b, int eb) {
  int d = ea - eb;
  d = d < -32 ? -32 : (d > 32 ? 32 : d);
  long long l = d > 0 ? (a << d) : a;
  long long r = d < 0 ? (b << (-d)) : b;
  return l >= r;
}
__device__ __forceinline__ void scale_sig_exp(int s, int& sig, int& ex) {
  int e = s >> 3, m = s & 7;
  sig = e ? m + 8 : m;
  ex = (e > 1 ? e : 1) - 10;
}

// 2^e as double, e in [-1022, 1023]
__device__ __forceinline__ double exp2d(int e) { return __longlong_as_double((long long)(e + 1023) << 52); }
// (1 + 1.5 * 2^-22) / sig, rounded to nearest float: the code-multiplier table (fast quantizer)
#define KV_KI(s) (float)((1.0 + 1.5 / 4194304.0) / (s))
__constant__ float kinv_tab[16] = {0.0f, KV_KI(1), KV_KI(2), KV_KI(3), KV_KI(4), KV_KI(5), KV_KI(6), KV_KI(7),
                                   KV_KI(8), KV_KI(9), KV_KI(10), KV_KI(11), KV_KI(12), KV_KI(13), KV_KI(14), KV_KI(15)};
#undef KV_KI
// smallest ue5m3 byte s with qmax*scale(s) >= rhs (rhs = amax*2^u, exact in double); 256 when none.
// A double-precision estimate (relative error ~2^-52, so off by at most one byte), then two exact
// compares pick s-1, s or s+1.
template <int QMAX>
__device__ __forceinline__ int scale_search(double rhs) {
  auto ok = [&](int s) {
    int e = s >> 3, m = s & 7;
    int sg = e ? m + 8 : m, ex = (e > 1 ? e : 1) - 10;
    return (double)(QMAX * sg) * exp2d(ex) >= rhs;
  };
  double q = rhs * (512.0 / QMAX);  // scale in units of 2^-9
  int s;
  if (q <= 16.0) {
    s = max(1, (int)ceil(q));
  } else {
    int e = (int)((__double_as_longlong(q) >> 52) & 0x7FF) - 1023 - 2;  // (8+m) 2^(e-1) = q
    s = e > 31 ? 256 : min(256, (e << 3) + (int)ceil(q * exp2d(1 - e)) - 8);
  }
  const bool below = s > 1 && ok(s - 1), at = s <= 255 && ok(min(s, 255));
  return below ? s - 1 : (at ? s : s + 1);
}
// Scale rounding "nearest" (ties up): the smallest byte c in 1..254 with QMAX*mid(c) > amax*2^u,
// mid(c) = (2 sig(c) + 1) 2^(exp(c)-1), else 255. `sup` = scale_search<QMAX>(amax*2^u) (smallest byte
// with QMAX*scale >= amax*2^u, 256 when none). Every byte below sup-1 has mid(c) < scale(c+1) <=
// scale(sup-1) < amax*2^u/QMAX, and mid(sup) > scale(sup) >= amax*2^u/QMAX, so the answer is sup-1 or
// sup: one exact integer compare (ge_pow2: amax < 2^31, QMAX (2 sig + 1) < 2^8), branch-free.
template <int QMAX>
__device__ __forceinline__ int scale_nearest(int sup, int amax, int u) {
  const int c = sup - 1;
  int sg, ex;
  scale_sig_exp(min(max(c, 1), 254), sg, ex);
  const bool below = !ge_pow2(amax, u, QMAX * (2 * sg + 1), ex - 1);  // QMAX mid(c) > amax 2^u
  return (c >= 1 && c <= 254 && below) ? c : min(sup, 255);
}

// Mid-rise scale byte (K = 2^(b-1), a power of two) from fp32 bit patterns, for the fast quantizer:
// r = max|y| 2^u / K = am 2^(u-b+1) is exact (am integer < 2^21, a power-of-two factor) when it stays a
// normal float (always for fp16: u in [-24, 5]; the caller checks bf16). ue5m3 bytes s >= 8 are the
// floats (1 + m/8) 2^(e-7), whose bit patterns are (s << 20) + 0x3C000000 (increasing in s), so the
// smallest s >= 8 with scale(s) >= r is ceil((bits(r) - 0x3C000000) / 2^20); bytes 1..8 are s 2^-9, so
// for r <= 2^-6 it is max(1, ceil(r 2^9)) (one FMA rounding up on the 2^23 binade). `sup` > 255: no byte
// reaches r (FLAG_SAT). Nearest (scale_nearest's argument): sup - 1 when its midpoint mid(c) = scale(c)
// + half a mantissa unit exceeds r -- bits (c << 20) + 0x3C080000 for c >= 8, (2c + 1) 2^-10 below.
template <int BITS, int RND>
__device__ __forceinline__ int scale_mr_f32(float am, int u, bool& sat) {
  const float r = am * exp2i(u - (BITS - 1));
  const int rb = __float_as_int(r);
  const int sn = (rb - 0x3C000000 + 0xFFFFF) >> 20;
  const int cs = max(__float_as_int(__fmaf_ru(r, 512.0f, 8388608.0f)) - 0x4B000000, 1);
  const int sup = rb <= 0x3C800000 ? cs : sn;
  sat = sup > 255;
  if (!RND) return min(sup, 255);
  const int c = sup - 1;
  const float mid = c >= 8 ? __int_as_float((c << 20) + 0x3C080000) : (float)(2 * c + 1) * 0.0009765625f;
  return (c >= 1 && c <= 254 && mid > r) ? c : min(sup, 255);
}

template <bool B>
struct bconst { static constexpr bool value = B; };

// fp16x2 arithmetic with IEEE round to nearest even and subnormals kept (explicit PTX: no .ftz, and an
// explicit rounding mode is never contracted into an FMA)
__device__ __forceinline__ kv_u32 hmul2_rn(kv_u32 a, kv_u32 b) {
  kv_u32 d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ kv_u32 hsub2_rn(kv_u32 a, kv_u32 b) {
  kv_u32 d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// each signed 16-bit half of v clamped to [0, hi] (hi < 2^15): one VIMNMX.S16x2.RELU
__device__ __forceinline__ kv_u32 relu_min_s16x2(kv_u32 v, kv_u32 hi) {
  kv_u32 d;
  asm("min.relu.s16x2 %0, %1, %2;" : "=r"(d) : "r"(v), "r"(hi));
  return d;
}
// fp16 bits of the integer y (exact for |y| <= 2048)
__device__ __forceinline__ kv_u32 int_to_f16(int y) {
  unsigned short h;
  asm("cvt.rn.f16.s32 %0, %1;" : "=h"(h) : "r"(y));
  return h;
}
// the fp16 key front end on a pair (side rows, kv_key_front): NaN/inf input lanes unchanged, infinite
// intermediates saturated to +-max
template <int KEYF>
__device__ __noinline__ kv_u32 key_front_pair(kv_u32 x, kv_u32 s2, kv_u32 m2) {
  auto sat = [](kv_u32 h) { return (h & 0x7FFFu) == 0x7C00u ? (h & 0x8000u) | 0x7BFFu : h; };
  kv_u32 r = 0;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    kv_u32 h = (x >> (16 * hh)) & 0xFFFFu;
    if ((h & 0x7C00u) != 0x7C00u) {
      if (KEYF & 1) h = sat(hmul2_rn(h, (s2 >> (16 * hh)) & 0xFFFFu) & 0xFFFFu);
      if (KEYF & 2) h = sat(hsub2_rn(h, (m2 >> (16 * hh)) & 0xFFFFu) & 0xFFFFu);
    }
    r |= h << (16 * hh);
  }
  return r;
}
// table words (s2, m2) of word k (lanes 2k, 2k+1) from one 16-byte entry t holding words k - k % WPC ..
template <int KEYF>
__device__ __forceinline__ void key_words(const uint4& t, int j, kv_u32& s2, kv_u32& m2) {
  constexpr int E = KEYF == 3 ? 2 : 1;
  const kv_u32 tt[4] = {t.x, t.y, t.z, t.w};
  s2 = (KEYF & 1) ? tt[E * j] : 0u;
  m2 = (KEYF & 2) ? tt[E * j + E - 1] : 0u;
}

template <typename T>
__device__ __forceinline__ T shfl_xor_t(T v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
// a step count as a type (a loop's unroll inside a generic lambda)
template <int V>
struct kv_steps { static constexpr int value = V; };

}  // namespace kv_enc

// a:      KvEncodeArgs (kv_common.cuh): input rows, the three planes, optional output rows and key table
// MODE:   0 mid-tread, 1 mid-rise;  RND: scale rounding, 0 up, 1 nearest (ties up)
// KEYF:   key front end, bit 0 per-channel key scales, bit 1 centering (fp16 only; 0: none)
// IL:     1: store the code rows in the vpair order (gpu_ref/layout.py, 3-bit codes): per 16-lane group the
//         16-bit units (g0 g1), (g2 g5), (g3 g4), interleaved with the other token of the row pair
//         (row r & ~1, r | 1) -- 2-byte stores, so one token of a pair can be written alone
template <int N, int G, int BITS, int M, int DT, kv_u64 SEED, int HAS_SIGN, int LPTM = 128, int MINB = 2,
          int MODE = 0, int RND = 0, int KEYF = 0, int IL = 0>
__global__ void __launch_bounds__(128, MINB)
kv_encode(const KvEncodeArgs a) {
  using namespace kv_enc;
  const kv_u16* __restrict__ x = a.x;
  kv_u8* __restrict__ codes = a.codes;
  kv_u8* __restrict__ scales = a.scales;
  kv_u8* __restrict__ flags = a.flags;
  const long long* __restrict__ out_rows = a.out_rows;
  const long long nvec = a.nvec;
  constexpr int LPT0 = N < LPTM ? N : LPTM;
  constexpr int LPT = LPT0 * 32 < N ? N / 32 : LPT0;  // lanes per thread (<= 32 threads per vector)
  constexpr int TPV = N / LPT;                  // threads per vector
  constexpr int VPB = 128 / TPV;                // vectors per tile
  constexpr int LOG2N = kv_ilog2(N);
  constexpr int MB = DT == 0 ? 10 : 7;          // stored mantissa bits of the input type
  constexpr int EMASK = DT == 0 ? 31 : 255;
  constexpr int BIAS = DT == 0 ? 15 : 127;
  constexpr int QMAX = (1 << (BITS - 1)) - 1;  // thresholds per lane (both modes)
  constexpr bool MR = MODE == 1;                // mid-rise
  constexpr int KU = MR ? QMAX + 1 : QMAX;      // scale units the block maximum maps to (K)
  constexpr bool FLT = (M - 1 + LOG2N) <= 24;   // fp32 butterflies are exact
  constexpr bool CLAMP = (M - 2 - MB) < 0;      // rounding can reach 2^(M-1)
  constexpr int ROWB = LPT * 2 + 16;            // padded smem row (bank-conflict free LDS.128)
  constexpr int CPR = LPT / 8;                  // 16-byte chunks per row
  constexpr int TILEB = 128 * ROWB;
  constexpr int NB = N / G;
  constexpr int CB = N * BITS / 8;
  constexpr int NBT = G <= LPT ? LPT / G : 1;   // scale blocks per thread
  constexpr int TPB = G <= LPT ? 1 : G / LPT;   // threads per scale block
  constexpr int CBT = LPT * BITS / 8;           // code bytes per thread
  constexpr int CW = (LPT * BITS + 31) / 32;    // code words per thread
  static_assert(IL == 0 || (BITS == 3 && CBT % 6 == 0), "vpair layout: 3-bit codes, whole 16-lane groups");
  static_assert(N >= 8 && (N & (N - 1)) == 0 && N <= 4096, "N");
  static_assert(G >= 8 && N % G == 0, "G");
  static_assert(BITS >= 2 && BITS <= 4, "BITS");
  static_assert((MODE == 0 || MODE == 1) && (RND == 0 || RND == 1), "MODE/RND");
  static_assert(KEYF >= 0 && KEYF <= 3 && (KEYF == 0 || DT == 0), "KEYF: fp16 keys only");
  constexpr int KWPC = KEYF == 3 ? 2 : 4;      // key-table words (lane pairs) per 16-byte entry

  extern __shared__ __align__(16) kv_u8 smem[];
  const int tid = threadIdx.x;
  const long long ntiles = (nvec + VPB - 1) / VPB;

  // output rows of the tile (out_rows given): copied with its input, one tile ahead, behind the input buffers
  long long* const srows = reinterpret_cast<long long*>(smem + 2 * TILEB);
  auto issue = [&](long long tile, int buf) {
    kv_u8* dst = smem + buf * TILEB;
    const kv_u16* src = x + tile * (long long)VPB * N;
    if (out_rows != nullptr && tid < VPB) {
      const long long v = tile * VPB + tid;
      cp_async8(srows + buf * VPB + tid, v < nvec ? out_rows + v : out_rows, v < nvec);
    }
    if ((tile + 1) * VPB <= nvec) {  // full tile (all but the last): a contiguous 128*LPT*2-byte run
      // chunk tid + 128 j: global byte offset 16 (tid + 128 j), row tid / CPR + j * (128 / CPR)
      kv_u8* d0 = dst + (tid / CPR) * ROWB + (tid % CPR) * 16;
      const kv_u8* s0 = reinterpret_cast<const kv_u8*>(src) + tid * 16;
#pragma unroll
      for (int j = 0; j < CPR; ++j) cp_async16_full(d0 + j * (128 / CPR) * ROWB, s0 + j * 2048);
      return;
    }
#pragma unroll 4
    for (int ci = tid; ci < 128 * CPR; ci += 128) {
      int row = ci / CPR, col = ci % CPR;
      bool ok = tile * VPB + row / TPV < nvec;
      cp_async16(dst + row * ROWB + col * 16, ok ? (const void*)(src + row * LPT + col * 8) : (const void*)x, ok);
    }
  };

  long long tile = blockIdx.x;
  if (tile < ntiles) issue(tile, 0);
  cp_async_commit();
  for (int it = 0; tile < ntiles; ++it, tile += gridDim.x) {
    {
      long long nxt = tile + gridDim.x;
      if (nxt < ntiles) issue(nxt, (it + 1) & 1);
      cp_async_commit();
    }
    cp_async_wait<1>();
    __syncthreads();

    const kv_u8* row = smem + (it & 1) * TILEB + tid * ROWB;
    kv_u32 w[LPT / 2];
#pragma unroll
    for (int k = 0; k < LPT / 8; ++k) {
      uint4 v = *reinterpret_cast<const uint4*>(row + 16 * k);
      w[4 * k] = v.x; w[4 * k + 1] = v.y; w[4 * k + 2] = v.z; w[4 * k + 3] = v.w;
    }
    const long long vec = tile * VPB + tid / TPV;
    const int part = tid % TPV;
    // key table row (vec may pass nvec in the last tile: any row will do); nvec < 2^32 (launch_encode)
    const uint4* ktab = KEYF ? reinterpret_cast<const uint4*>(a.key_tab) +
                                   (unsigned)vec % (unsigned)a.key_heads + (part * (LPT / 2) / KWPC) * a.key_heads
                             : nullptr;
    // ---- per-vector rule: the folded key front end (keys, KEYF != 0) or block floating point ----
    kv_u32 flg = 0;
    int u;               // exponent of one mantissa unit
    float P1 = 1.0f;     // 2^-u (block floating point)
    kv_u64 mw[2] = {0ull, 0ull};
    if (TPV > 2 && HAS_SIGN) {
      mw[0] = kv_splitmix64(SEED, part * (LPT / 64));
      if (LPT > 64) mw[1] = kv_splitmix64(SEED, part * (LPT / 64) + 1);
    }
    float yf[FLT ? LPT : 1];
    int yi[FLT ? 1 : LPT];
    constexpr bool FASTB = FLT && !CLAMP;
    // D of lane i of this thread
    auto dsign = [&](int i) -> bool {
      return TPV == 1 ? kv_sign(SEED, HAS_SIGN, i)
             : TPV == 2 ? (part ? kv_sign(SEED, HAS_SIGN, LPT + i) : kv_sign(SEED, HAS_SIGN, i))
                        : (HAS_SIGN != 0 && ((mw[(i >> 6) & 1] >> (i & 63)) & 1ull) != 0);
    };
    if (KEYF) {
      // Folded key front end (module comment; sim_models.bfp.to_block_fp_keys), fp16 keys. Integer steps only:
      // lane (sign, exponent, significand) of k with exponent Ex = E + e (saturated to +-65504 above 30) and
      // of mu'; emax = 1 + max over the vector of max(Ex, Em); both significands aligned to emax (exact left
      // shift or round half away from zero), subtracted, clamped to +-(2^(M-1) - 1), then D. NaN / inf lanes
      // read as +0 / +-65504 with e = 0, mu' = +0. Two passes: the exponents (registers), then the mantissas (below).
      constexpr int OFF = M - 2 - MB;
      constexpr int LIM = (1 << (M - 1)) - 1;
      // one lane: word k (lanes 2k + hh) with table words s2, m2
      auto lane = [&](kv_u32 wk, int hh, kv_u32 s2, kv_u32 m2, int& sx, int& ex, int& gx, int& sm, int& em, int& gm,
                      kv_u32& fl) {
        kv_u32 h = (wk >> (16 * hh)) & 0xFFFFu;
        kv_u32 f = (h >> 10) & 31u, fr = h & 1023u;
        int e = (KEYF & 1) ? (int)((s2 >> (16 * hh + 10)) & 31u) - 15 : 0;    // s = 2^e, an fp16 normal
        kv_u32 mh = (KEYF & 2) ? (m2 >> (16 * hh)) & 0xFFFFu : 0u;
        if (f == 31u) {
          e = 0;
          mh = 0;
          if (fr) { h = 0; f = 0; fr = 0; fl |= 1u; }             // NaN -> +0
          else { f = 30; fr = 1023; fl |= 2u; }                    // +-inf -> +-65504
        }
        sx = (int)(h >> 15);
        gx = (int)(f ? (fr | 1024u) : fr);
        ex = (int)(f ? f : 1u) + e;
        if (ex > 30) { ex = 30; gx = 2047; }                       // |k 2^e| >= 2^16: +-65504
        const kv_u32 fm = (mh >> 10) & 31u;
        sm = (int)(mh >> 15);
        gm = (int)(fm ? ((mh & 1023u) | 1024u) : (mh & 1023u));
        em = (int)(fm ? fm : 1u);
      };
      auto align = [](int g, int sh) -> int {                      // g < 2^11
        return sh <= 0 ? (g << (-sh)) : (sh > 12 ? 0 : (g + (1 << (sh - 1))) >> sh);
      };
      // first pass, two lanes per step: exponent fields + 15 in 16-bit halves, Ex + 15 = max(E, 1) + (e + 15)
      // (the exponent field of s), Em + 15 likewise; the largest |pattern| finds NaN / inf lanes
      // (the words from the thread's shared-memory row, 8 lanes per step: a rolled loop holds few table entries)
      kv_u32 xm2 = 0u, sp2 = 0u;
      uint4 tq;
#pragma unroll 2
      for (int q = 0; q < LPT / 8; ++q) {
        const uint4 r4 = *reinterpret_cast<const uint4*>(row + 16 * q);
        const kv_u32 rw[4] = {r4.x, r4.y, r4.z, r4.w};
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          if (jj % KWPC == 0) tq = __ldg(ktab + (q * (4 / KWPC) + jj / KWPC) * a.key_heads);
          kv_u32 s2, m2;
          key_words<KEYF>(tq, jj % KWPC, s2, m2);
          const kv_u32 wk = rw[jj];
          sp2 = max_u16x2(sp2, wk & 0x7FFF7FFFu);
          kv_u32 f2 = max_u16x2((wk >> 10) & 0x001F001Fu, 0x00010001u);
          f2 += (KEYF & 1) ? (s2 >> 10) & 0x001F001Fu : 0x000F000Fu;
          if (KEYF & 2) f2 = max_u16x2(f2, max_u16x2((m2 >> 10) & 0x001F001Fu, 0x00010001u) + 0x000F000Fu);
          xm2 = max_u16x2(xm2, f2);
        }
      }
      // Ex saturates at 30; Em >= 1 (mu' = +0 without centering)
      int xm = max(min((int)max(xm2 & 0xFFFFu, xm2 >> 16) - 15, 30), 1);
      int spec = max(sp2 & 0xFFFFu, sp2 >> 16) >= 0x7C00u;
      if (spec) {  // a NaN or inf lane (rare): the integer steps, lane by lane
        xm = 0;
#pragma unroll
        for (int c = 0; c < LPT / 2 / KWPC; ++c) {
          const uint4 t = __ldg(ktab + c * a.key_heads);
#pragma unroll
          for (int j = 0; j < KWPC; ++j) {
            kv_u32 s2, m2;
            key_words<KEYF>(t, j, s2, m2);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              int sx, ex, gx, sm, em, gm;
              lane(w[c * KWPC + j], hh, s2, m2, sx, ex, gx, sm, em, gm, flg);
              xm = max(xm, max(ex, em));
            }
          }
        }
      }
#pragma unroll
      for (int o = 1; o < TPV; o <<= 1) {
        xm = max(xm, shfl_xor_t(xm, o));
        flg |= shfl_xor_t(flg, o);
        spec |= shfl_xor_t(spec, o);
      }
      const int emax = xm + 1;                                     // one bit of headroom for the difference
      u = emax - BIAS - M + 2;
      // second pass: y = clamp(X - MU) per lane from the input words and the table read again. With M <= 12,
      // |y| <= 2047 is an fp16 integer: the pass writes y as fp16 (exact) over the thread's own input row in
      // shared memory, 16 bytes (8 lanes) per step of a rolled loop, and w is read back from it with P1 = 1;
      // the block-floating-point step below then quantizes y as it would an input lane (D included:
      // floor(|y| + 1/2) = |y|). A loop of few steps in flight holds few table entries (the whole table in
      // registers spills). Wider M: y into yf / yi.
      constexpr bool VIA16 = M <= 12;
      if (VIA16) {
        kv_u8* const wrow = const_cast<kv_u8*>(row);
        // one step of 8 lanes: the row's 16 bytes, the table's entries, pair(word, s2, m2) -> y of the two lanes
        // as fp16x2 for each word, the 16 bytes written back; STEPS: steps in flight (unroll)
        auto pass2 = [&](auto pair, auto steps) {
          constexpr int STEPS = decltype(steps)::value;
#pragma unroll STEPS
          for (int q = 0; q < LPT / 8; ++q) {
            const uint4 r4 = *reinterpret_cast<const uint4*>(row + 16 * q);
            const kv_u32 rw[4] = {r4.x, r4.y, r4.z, r4.w};
            kv_u32 ow[4];
#pragma unroll
            for (int c2 = 0; c2 < 4 / KWPC; ++c2) {
              const uint4 t = __ldg(ktab + (q * (4 / KWPC) + c2) * a.key_heads);
#pragma unroll
              for (int j = 0; j < KWPC; ++j) {
                kv_u32 s2, m2;
                key_words<KEYF>(t, j, s2, m2);
                ow[c2 * KWPC + j] = pair(rw[c2 * KWPC + j], s2, m2);
              }
            }
            *reinterpret_cast<uint4*>(wrow + 16 * q) = make_uint4(ow[0], ow[1], ow[2], ow[3]);
          }
        };
        if (!spec) {
          // finite lanes: the same steps in fp32, each exact. X = k s is a product of an fp16 and a power of two
          // (exact, normal: |X| >= 2^-38), clamped to +-65504 (|X| >= 2^16 iff Ex > 30); v = X 2^-u has at most
          // 11 significant bits and |v| < 2^(M-2), so ONE FMA, RN(X 2^-u (1 + 2^-20) + 1.5 2^23), gives
          // 1.5 2^23 + round half away from zero (v) (block floating point's argument below); the same for
          // mu'; the difference of the two sums is exact. The alignment shift's cases (exact left shift,
          // rounding right shift, 0 beyond 12 places) are this rounding of v.
          const float PK = exp2i(-u) * (1.0f + 0x1p-20f), C23 = 12582912.0f;
          pass2([&](kv_u32 wd, kv_u32 s2, kv_u32 m2) -> kv_u32 {
            float y[2];
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              float xv = h2f_half(wd, hh);
              if (KEYF & 1) xv = fminf(fmaxf(__fmul_rn(xv, h2f_half(s2, hh)), -65504.0f), 65504.0f);
              float yv = __fmaf_rn(xv, PK, C23) - ((KEYF & 2) ? __fmaf_rn(h2f_half(m2, hh), PK, C23) : C23);
              y[hh] = fminf(fmaxf(yv, (float)-LIM), (float)LIM);
            }
            kv_u32 outw;
            asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(outw) : "f"(y[1]), "f"(y[0]));
            return outw;
          }, kv_steps<2>{});
        } else {  // a NaN or inf lane: integer steps
          pass2([&](kv_u32 wd, kv_u32 s2, kv_u32 m2) -> kv_u32 {
            kv_u32 outw = 0;
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              int sx, ex, gx, sm, em, gm;
              kv_u32 fl = 0;
              lane(wd, hh, s2, m2, sx, ex, gx, sm, em, gm, fl);
              const int xa = align(gx, emax - ex - OFF), ma = align(gm, emax - em - OFF);
              const int y = min(max((sx ? -xa : xa) - (sm ? -ma : ma), -LIM), LIM);
              outw |= int_to_f16(y) << (16 * hh);
            }
            return outw;
          }, kv_steps<1>{});
        }
#pragma unroll
        for (int k = 0; k < LPT / 8; ++k) {
          const uint4 v = *reinterpret_cast<const uint4*>(row + 16 * k);
          w[4 * k] = v.x; w[4 * k + 1] = v.y; w[4 * k + 2] = v.z; w[4 * k + 3] = v.w;
        }
        P1 = 1.0f;
      } else {
#pragma unroll
        for (int c = 0; c < LPT / 2 / KWPC; ++c) {
          const uint4 t = __ldg(ktab + c * a.key_heads);
#pragma unroll
          for (int j = 0; j < KWPC; ++j) {
            kv_u32 s2, m2;
            key_words<KEYF>(t, j, s2, m2);
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
              const int i = 2 * (c * KWPC + j) + hh;
              int sx, ex, gx, sm, em, gm;
              kv_u32 fl = 0;
              lane(w[c * KWPC + j], hh, s2, m2, sx, ex, gx, sm, em, gm, fl);
              const int xa = align(gx, emax - ex - OFF), ma = align(gm, emax - em - OFF);
              int y = min(max((sx ? -xa : xa) - (sm ? -ma : ma), -LIM), LIM);
              if (dsign(i)) y = -y;
              // FASTB: the butterflies take the lanes offset by 1.5 2^23, as the rounding FMA leaves them
              if (FLT) yf[FLT ? i : 0] = FASTB ? (float)y + 12582912.0f : (float)y;
              else yi[FLT ? 0 : i] = y;
            }
          }
        }
      }
    } else {
      // ---- special values and the shared exponent ------------------------------------------
      // max |pattern| per 16-bit half without masking each word: the unsigned max is 0x8000 + the largest
      // negative magnitude when a negative lane exists (else the largest positive), the signed max the
      // largest non-negative pattern when one exists (else negative: relu -> 0); the larger of the two
      // (sign cleared) is the largest magnitude. Two chains of 3-input VIMNMX3 (2 lanes per instruction).
      kv_u32 mu2 = w[0], ms2 = w[0];
#pragma unroll
      for (int k = 1; k < LPT / 2; ++k) { mu2 = max_u16x2(mu2, w[k]); ms2 = max_s16x2(ms2, w[k]); }
      kv_u32 rm2 = max_u16x2(relu_max_s16x2(ms2), mu2 & 0x7FFF7FFFu);
      kv_u32 rmax = max(rm2 & 0xFFFFu, rm2 >> 16);
      if (rmax >= (kv_u32)(EMASK << MB)) {  // a NaN or inf among this thread's lanes (rare)
        rm2 = 0;
#pragma unroll
        for (int k = 0; k < LPT / 2; ++k) {
          kv_u32 outw = 0;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            kv_u32 h = (w[k] >> (16 * hh)) & 0xFFFFu;
            kv_u32 e = (h >> MB) & EMASK, fr = h & ((1u << MB) - 1);
            if (e == (kv_u32)EMASK) {
              if (fr != 0) { h = 0; flg |= 1u; }                                    // NaN -> +0
              else { h = (h & 0x8000u) | ((kv_u32)(EMASK - 1) << MB) | ((1u << MB) - 1); flg |= 2u; }  // inf
            }
            outw |= h << (16 * hh);
          }
          w[k] = outw;
          rm2 = max_u16x2(rm2, outw & 0x7FFF7FFFu);
        }
        rmax = max(rm2 & 0xFFFFu, rm2 >> 16);
      }
#pragma unroll
      for (int o = 1; o < TPV; o <<= 1) {
        rmax = max(rmax, shfl_xor_t(rmax, o));
        flg |= shfl_xor_t(flg, o);
      }
      const int emax = max((int)(rmax >> MB), 1);
      u = emax - BIAS - M + 2;  // exponent of one mantissa unit
      if (DT != 0 && -u >= 126) {
        // bf16, tiny vector (emax <= M - 1 <= 15; rare): 2^-u is not a normal float, and subnormal
        // lanes (mantissa floor(|f| 2^-u + 1/2) may be nonzero only here) must not be flushed: scale
        // every lane by 2^64 in its bit pattern (exact, subnormals made normal) and use P1 = 2^(-u-64).
        // For -u <= 125 a subnormal lane has |f| 2^-u < 1/2 (mantissa 0), which the FTZ flush also gives.
#pragma unroll
        for (int k = 0; k < LPT / 2; ++k) w[k] = bf16x2_x2p64(w[k]);
        P1 = exp2i(-u - 64);
      } else {
        P1 = exp2i(-u);
      }
    }

    // ---- block floating point (+ sign flip D folded in) ----------------------------------
    // D is a compile-time constant when one thread holds the whole vector; otherwise the
    // thread's 128 mask bits are generated once per vector.
    // (two threads per vector: both halves' masks are constants, selected by `part`)
    // Fast path (fp32 butterflies, no mantissa clamp): the sign (input sign XOR D) is applied to the
    // packed input pair with one XOR, then ONE rounding FMA per lane: F = RN(f * 2^-u (1 + 2^-20) + 1.5*2^23)
    // = 1.5*2^23 + sign * floor(|f| 2^-u + 1/2). Exact: the sum lies in [2^23, 2^24) (unit spacing); the
    // factor (1 + 2^-20) moves exact ties |v| = k + 1/2 strictly away from zero, so round-to-nearest
    // rounds them away from zero; a non-tie v = |f| 2^-u has at most 11 significant bits (fp16; 8 for
    // bf16), so it is at least min(1/2, 2^-11 |v|) away from every half-integer, more than the
    // perturbation |v| 2^-20 (|v| < 2^(M-1) <= 2^15).
    if (KEYF && M > 12) {
      // the folded key front end wrote yf / yi above (M <= 12: y in w, quantized below)
    } else if (FASTB) {
      auto sgn_pair = [&](int k) -> kv_u32 {  // packed D mask (bit 15 / bit 31) of lanes 2k, 2k+1
        const int i = 2 * k;
        if (TPV == 1) return (kv_sign(SEED, HAS_SIGN, i) ? 0x8000u : 0u) | (kv_sign(SEED, HAS_SIGN, i + 1) ? 0x80000000u : 0u);
        if (TPV == 2) {
          kv_u32 m0 = (kv_sign(SEED, HAS_SIGN, i) ? 0x8000u : 0u) | (kv_sign(SEED, HAS_SIGN, i + 1) ? 0x80000000u : 0u);
          kv_u32 m1 = (kv_sign(SEED, HAS_SIGN, LPT + i) ? 0x8000u : 0u) | (kv_sign(SEED, HAS_SIGN, LPT + i + 1) ? 0x80000000u : 0u);
          return part ? m1 : m0;
        }
        if (!HAS_SIGN) return 0u;
        kv_u64 mm = mw[(i >> 6) & 1] >> (i & 63);
        return ((kv_u32)(mm & 1ull) << 15) | ((kv_u32)((mm >> 1) & 1ull) << 31);
      };
      constexpr float CM = 12582912.0f;                    // 1.5 * 2^23
      const float P1p = __int_as_float(__float_as_int(P1) | 8);  // P1 (1 + 2^-20), P1 a power of two
#pragma unroll
      for (int k = 0; k < LPT / 2; ++k) {
        // one thread per vector: D is a compile-time sign on the multiplier (free FFMA negation)
        const kv_u32 ww = TPV == 1 ? w[k] : w[k] ^ sgn_pair(k);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float f = DT == 0 ? h2f_half(ww, hh) : __int_as_float(hh ? (ww & 0xFFFF0000u) : (ww << 16));
          const bool dn = TPV == 1 && kv_sign(SEED, HAS_SIGN, 2 * k + hh);
          yf[FLT ? 2 * k + hh : 0] = __fmaf_rn(f, dn ? -P1p : P1p, CM);  // = CM + lane value (removed in stage 1)
        }
      }
    } else {
#pragma unroll
    for (int i = 0; i < LPT; ++i) {
      kv_u32 h = (w[i >> 1] >> (16 * (i & 1))) & 0xFFFFu;
      float f = DT == 0 ? h2f(h) : __int_as_float(h << 16);
      float v = fabsf(f) * P1;
      float r = __fadd_rd(v, 0.5f);
      float n23 = __fadd_rd(r, 8388608.0f);  // 2^23 + floor(v + 1/2), exact
      const bool dneg = dsign(i);
      bool neg = ((h >> 15) != 0) != dneg;
      if (FLT) {
        float m = n23 - 8388608.0f;
        if (CLAMP) m = fminf(m, (float)((1 << (M - 1)) - 1));
        yf[FLT ? i : 0] = neg ? -m : m;
      } else {
        int m = __float_as_int(n23) - 0x4B000000;
        if (CLAMP) m = min(m, (1 << (M - 1)) - 1);
        yi[FLT ? 0 : i] = neg ? -m : m;
      }
    }
    }

    // ---- FWHT: in-thread stages, then cross-thread stages -----------------------------------
    // BM (one thread per vector, fp32 butterflies, G <= LPT): the stages commute (exact integer
    // arithmetic), so they run in the order LPT/2 (when > G/2), .., G, 1, 2, .., G/2, the last one pairing
    // lanes of one scale block; that stage's max(|a + b|, |a - b|) = |a| + |b| gives the block maximum
    // as one FADD per pair and a 3-input integer max (VIMNMX3) per two pairs (non-negative floats order
    // as their bit patterns), instead of one FMNMX per lane after the transform.
    constexpr bool BM = FASTB && TPV == 1 && G <= LPT && LPT >= 2;
    constexpr int HS0 = (BM && LPT > G) ? LPT / 2 : 1;  // the first stage (it also removes the CM offset)
    kv_u32 bmax[BM ? NBT : 1];                           // BM: the bit patterns of the block maxima
    if (FASTB && LPT >= 2) {  // first stage on CM-offset values: (a-CM)+(b-CM) = a+(b-2CM), (a-CM)-(b-CM) = a-b (exact)
#pragma unroll
      for (int i = 0; i < LPT; ++i) {
        if ((i & HS0) == 0) {
          float a = yf[FLT ? i : 0], b = yf[FLT ? i + HS0 : 0];
          yf[FLT ? i : 0] = __fadd_rn(a, __fsub_rn(b, 25165824.0f));
          yf[FLT ? i + HS0 : 0] = __fsub_rn(a, b);
        }
      }
    } else if (FASTB) {
      yf[0] = __fsub_rn(yf[0], 12582912.0f);
    }
    if (BM) {
      auto bfly = [&](int hs) {
#pragma unroll
        for (int i = 0; i < LPT; ++i) {
          if ((i & hs) == 0) {
            float a = yf[FLT ? i : 0], b = yf[FLT ? i + hs : 0];
            yf[FLT ? i : 0] = a + b; yf[FLT ? i + hs : 0] = a - b;
          }
        }
      };
#pragma unroll
      for (int hs = LPT / 4; hs >= G; hs >>= 1) bfly(hs);
#pragma unroll
      for (int hs = HS0 == 1 ? 2 : 1; hs < G / 2; hs <<= 1) bfly(hs);
      constexpr int H = G / 2;  // the last stage, with the block maxima
#pragma unroll
      for (int bb = 0; bb < (BM ? NBT : 1); ++bb) {
        kv_u32 m0 = 0, m1 = 0;  // two chains (latency)
#pragma unroll
        for (int i = bb * G; i < bb * G + G; ++i) {
          if ((i & H) == 0) {
            const float a = yf[FLT ? i : 0], b = yf[FLT ? i + H : 0];
            yf[FLT ? i : 0] = a + b; yf[FLT ? i + H : 0] = a - b;
            const kv_u32 t = __float_as_uint(fabsf(a) + fabsf(b));  // exact: integer < 2^24
            if (i & 1) m1 = max(m1, t); else m0 = max(m0, t);
          }
        }
        bmax[bb] = max(m0, m1);
      }
    }
#pragma unroll
    for (int hs = (FASTB && LPT >= 2) ? 2 : 1; hs < (BM ? 1 : LPT); hs <<= 1) {
#pragma unroll
      for (int i = 0; i < LPT; ++i) {
        if ((i & hs) == 0) {
          if (FLT) {
            float a = yf[FLT ? i : 0], b = yf[FLT ? i + hs : 0];
            yf[FLT ? i : 0] = a + b; yf[FLT ? i + hs : 0] = a - b;
          } else {
            int a = yi[FLT ? 0 : i], b = yi[FLT ? 0 : i + hs];
            yi[FLT ? 0 : i] = a + b; yi[FLT ? 0 : i + hs] = a - b;
          }
        }
      }
    }
#pragma unroll
    for (int o = 1; o < TPV; o <<= 1) {
#pragma unroll
      for (int i = 0; i < LPT; ++i) {
        if (FLT) {
          float mine = yf[FLT ? i : 0], oth = shfl_xor_t(mine, o);
          yf[FLT ? i : 0] = (part & o) ? oth - mine : mine + oth;
        } else {
          int mine = yi[FLT ? 0 : i], oth = shfl_xor_t(mine, o);
          yi[FLT ? 0 : i] = (part & o) ? oth - mine : mine + oth;
        }
      }
    }

    // ---- scales (exact, as the golden model) and code thresholds ------------------------------
    // Fast quantizer when |y| < 2^21 (M - 1 + log2 N <= 20, fp32 butterflies), with
    // kq = (1 + d) / S, S = sig 2^(ex-u) (the scale in units of 2^u), d in [1.25, 1.75] 2^-22:
    //  mid-tread: code = RN(y kq + C) - C: the thresholds (j - 1/2) S are met exactly when y kq lands
    //    at or beyond j - 1/2; d moves exact ties strictly outwards (round half away from zero);
    //  mid-rise: code = RM(y kq + C) - C = floor(y kq): |y| = j S gives j (1 + d) -> j for y > 0 and
    //    -j - 1 for y < 0 (the outer level, = -1 - m), y = 0 gives 0; clamped to [-2^(b-1), 2^(b-1)-1].
    // A non-tie is far enough from every threshold: with S >= 1 (integer), |y kq - j| >= 1/S while the
    // perturbation is |y| d / S < 0.875 / S (|y| < 2^21); with S < 1 both y and j S are multiples of
    // 2^(ex-u), and only |y| < 2^(b-1) S (<= 120 2^(ex-u)) matters, where |y| d << 2^(ex-u).
    // FMA: y kq is exact before the single rounding, C = 1.5*2^23 + 2^(b-1) keeps the sum in
    // [2^23, 2^24) (unit spacing). The low BITS bits of the sum are the offset-binary field.
    // Codes clip (clamp of the sum) for mid-rise (|y| = 2^(b-1) S is possible), for nearest scale
    // rounding (the scale may lie below max|y|/K) and in saturated blocks.
    constexpr bool FASTQ = FLT && (M - 1 + LOG2N) <= 20;
    int sbyte[NBT];
    long long thr[NBT][QMAX];
    float kq[NBT];
    bool anysat = false;
#pragma unroll
    for (int bb = 0; bb < NBT; ++bb) {
      constexpr int BL = G <= LPT ? G : LPT;
      int amax;
      float amf = 0.0f;  // the same as a float (FLT)
      if (BM) {
        amf = __uint_as_float(bmax[bb]);
        amax = (int)amf;
      } else if (FLT) {
        float t8[8];  // 8 independent chains (latency), then a tree
#pragma unroll
        for (int k = 0; k < 8; ++k) t8[k] = 0.0f;
#pragma unroll
        for (int i = 0; i < BL; ++i) t8[i & 7] = fmaxf(t8[i & 7], fabsf(yf[FLT ? bb * BL + i : 0]));
        float am = fmaxf(fmaxf(fmaxf(t8[0], t8[1]), fmaxf(t8[2], t8[3])), fmaxf(fmaxf(t8[4], t8[5]), fmaxf(t8[6], t8[7])));
        amax = (int)am;  // exact: integer < 2^24
        amf = am;
      } else {
        int am = 0;
#pragma unroll
        for (int i = 0; i < BL; ++i) am = max(am, abs(yi[FLT ? 0 : bb * BL + i]));
        amax = am;
      }
#pragma unroll
      for (int o = 1; o < TPB; o <<= 1) amax = max(amax, shfl_xor_t(amax, o));
      int lo;
      if (MR && FASTQ && (DT == 0 || (u >= -100 && u <= 100))) {  // fp32 bit patterns (scale_mr_f32)
        bool sat;
        lo = scale_mr_f32<BITS, RND>(TPB > 1 ? (float)amax : amf, u, sat);
        if (sat) { flg |= 4u; anysat = true; }
      } else {
        const double rhs = (double)amax * exp2d(u);  // exact (amax < 2^31)
        lo = scale_search<KU>(rhs);
        if (lo > 255) { flg |= 4u; anysat = true; }  // FLAG_SAT: K*scale(255) < max|y| 2^u (both roundings)
        lo = RND ? scale_nearest<KU>(lo, amax, u) : min(lo, 255);
      }
      sbyte[bb] = lo;
      int sg, ex;
      scale_sig_exp(lo, sg, ex);
      if (FASTQ) {  // (1 + ~1.5 2^-22) / (sig 2^(ex-u)); exponent clamped to [-122, 127]: below 2^-122
        // |y kq| < 2^-100 (codes 0, or -1 for mid-rise y < 0), and kq >= 2^-126 / 15 stays normal, so
        // FTZ cannot make it 0; above 2^127 only when y == 0
        kq[bb] = kinv_tab[sg] * exp2i(min(max(u - ex, -122), 127));
        continue;
      }
      // mid-tread: |y| 2^u >= (2j-1) sig 2^(ex-1);  mid-rise: |y| 2^u >= j sig 2^ex;
      // as integers: |y| >= ceil(num * 2^sh)
      const int sh = MR ? ex - u : ex - u - 1;
#pragma unroll
      for (int j = 1; j <= QMAX; ++j) {
        long long num = (long long)((MR ? j : 2 * j - 1) * sg);
        long long t;
        if (sh >= 0) t = sh >= 31 ? (1ll << 31) : min(num << sh, 1ll << 31);
        else { int r = -sh > 40 ? 40 : -sh; t = (num + (1ll << r) - 1) >> r; }
        thr[bb][j - 1] = t;
      }
    }
#pragma unroll
    for (int o = 1; o < TPV; o <<= 1) flg |= shfl_xor_t(flg, o);

    // ---- codes and packing ----------------------------------------------------------------
    kv_u32 cw[CW];
#pragma unroll
    for (int k = 0; k < CW; ++k) cw[k] = 0;
    auto put = [&](int i, kv_u32 fld) {
      const int bit = i * BITS;
      cw[bit >> 5] |= (fld << (bit & 31));
      if ((bit & 31) + BITS > 32) cw[(bit >> 5) + 1] |= fld >> (32 - (bit & 31));
    };
    if (FASTQ) {
      // offset-binary fields d = c + 2^(BITS-1) in [1, 2^BITS - 1] (no carries between fields) come as the
      // low bits of F = bits(1.5*2^23 + 2^(BITS-1) + c); each F is added shifted into its word
      // (one LEA per lane), the constant part of F is subtracted per word at the end, and flipping
      // each field's top bit turns d into the two's-complement code.
      constexpr float CMQ = 12582912.0f + (float)(1 << (BITS - 1));
      constexpr float FLO = CMQ - (float)KU, FHI = CMQ + (float)QMAX;  // code range [-K, qmax]
      constexpr int BL = G <= LPT ? G : LPT;
      constexpr kv_u32 FM = (1u << BITS) - 1;
      auto qf = [&](float y, float k) { return MR ? __fmaf_rd(y, k, CMQ) : __fmaf_rn(y, k, CMQ); };
      auto putq = [&](int i, kv_u32 F) {
        const int bit = i * BITS, s = bit & 31;
        cw[bit >> 5] += F << s;
        if (s + BITS > 32) cw[(bit >> 5) + 1] += (F & FM) >> (32 - s);
      };
      // mid-rise without a saturated block: |c| < 2^14 (the scale is at least max|y| / (2 K) up to the
      // ue5m3 grid, subnormal scales included), so the low 16 bits of F, read as a signed integer, are the
      // field d = c + 2^(b-1) itself (c = -2^(b-1) - 1 gives 0xFFFF = -1); one VIMNMX.S16x2.RELU clamps d
      // to [0, 2^b - 1] and clears the high half (min with 0), so the field is packed clean (no constant to
      // subtract) -- instead of two FMNMX per lane on the float.
      auto kc_word = [&](int k) {  // the constant part of the F added into word k (compile time)
        kv_u32 kc = 0;
#pragma unroll
        for (int i = 0; i < LPT; ++i)
          if (((i * BITS) >> 5) == k) kc += (__float_as_uint(CMQ) & ~FM) << ((i * BITS) & 31);
        return kc;
      };
      const bool relu = MR && !anysat;
      if (relu) {
#pragma unroll
        for (int i = 0; i < LPT; ++i) {  // add, not or: the fields are disjoint, and a shift-add is one LEA
          const kv_u32 d = relu_min_s16x2(__float_as_uint(qf(yf[FLT ? i : 0], kq[i / BL])), FM);
          const int bit = i * BITS, sh = bit & 31;
          cw[bit >> 5] += d << sh;
          if (sh + BITS > 32) cw[(bit >> 5) + 1] += d >> (32 - sh);
        }
      } else if (!MR && !RND && !anysat) {  // version-1 quantizer, no saturated block: no code can clip
#pragma unroll
        for (int i = 0; i < LPT; ++i) putq(i, __float_as_uint(qf(yf[FLT ? i : 0], kq[i / BL])));
#pragma unroll
        for (int k = 0; k < CW; ++k) cw[k] -= kc_word(k);  // in the branch: the relu path skips it
      } else {  // clamp the sum (monotone, so clamping after the rounding equals clipping the code)
#pragma unroll
        for (int i = 0; i < LPT; ++i) putq(i, __float_as_uint(fminf(fmaxf(qf(yf[FLT ? i : 0], kq[i / BL]), FLO), FHI)));
#pragma unroll
        for (int k = 0; k < CW; ++k) cw[k] -= kc_word(k);
      }
#pragma unroll
      for (int k = 0; k < CW; ++k) {
        kv_u32 flip = 0;  // compile-time per word
#pragma unroll
        for (int i = 0; i < LPT; ++i) {
          const int bit = i * BITS;
          if (((bit + BITS - 1) >> 5) == k) flip |= 1u << ((bit + BITS - 1) & 31);
        }
        cw[k] ^= flip;
      }
    } else
    {
      float tf[NBT][QMAX];
#pragma unroll
      for (int bb = 0; bb < NBT; ++bb)
#pragma unroll
        for (int j = 0; j < QMAX; ++j) tf[bb][j] = (float)thr[bb][j];  // exact below 2^24
#pragma unroll
      for (int i = 0; i < LPT; ++i) {
        constexpr int BL = G <= LPT ? G : LPT;
        const int bb = i / BL;
        int cnt = 0;
        bool negy;
        if (FLT) {
          float y = yf[FLT ? i : 0], a = fabsf(y);
#pragma unroll
          for (int j = 0; j < QMAX; ++j) cnt += (a >= tf[bb][j]) ? 1 : 0;
          negy = y < 0.0f;  // -0.0 counts as y >= 0 (mid-rise y = 0 -> code 0)
        } else {
          int y = yi[FLT ? 0 : i];
          long long a = y < 0 ? -(long long)y : (long long)y;
#pragma unroll
          for (int j = 0; j < QMAX; ++j) cnt += (a >= thr[bb][j]) ? 1 : 0;
          negy = y < 0;
        }
        kv_u32 fld = (kv_u32)(negy ? (MR ? -1 - cnt : -cnt) : cnt) & ((1u << BITS) - 1);
        const int bit = i * BITS;
        cw[bit >> 5] |= fld << (bit & 31);
        if ((bit & 31) + BITS > 32) cw[(bit >> 5) + 1] |= fld >> (32 - (bit & 31));
      }
    }

    // ---- stores ---------------------------------------------------------------------------
    // vpair order (IL): when the thread of the same part of vector vec ^ pair_vec (lane ^ pair_vec TPV, a power
    // of two below 32) writes the other row of this row pair, the two exchange half of their code words (CW / 2
    // shuffles: the even row's writer keeps the first half of its part and sends the second, the odd row's writer
    // the reverse) and each writes whole 32-bit words [unit of row 2i | unit of row 2i + 1] of its half of the units
    // (16-byte stores); otherwise (a lone token, e.g. one decode step) three 16-bit stores per group.
    // The pair words come from the golden words by byte permutes (PRMT) alone: per two groups (three words w0 w1 w2
    // of each row; group q = w0.b0-3 w1.b0-1, group q+1 = w1.b2-3 w2.b0-3) the units are H0 = w0.b0 b1,
    // H1 = w0.b2 w1.b1, H2 = w0.b3 w1.b0, H0' = w1.b2 b3, H1' = w2.b0 b3, H2' = w2.b1 b2; one PRMT per pair word
    // takes a unit from each row's word, after one PRMT per row gathers [H1 | H2] (x = bytes 2 5 3 4 of w0:w1).
    // The selector below is for (row 2i, row 2i + 1) as (first, second) source; the odd row's writer holds the
    // second row in its own words, so it flips bit 2 of every selector nibble (xor 0x4444) to swap the sources.
    // output row (-2: none); out_rows from shared memory: a global load here would put one DRAM round trip
    // between the packing and the stores of every tile (GPU_NOTES round 12c)
    const long long orow = vec < nvec ? (out_rows ? srows[(it & 1) * VPB + tid / TPV] : vec) : -2;
    bool paired = false;
    if constexpr (IL != 0) {
      static_assert(CW % 2 == 0 && CBT % 12 == 0 && TPV < 32, "vpair: halves of whole groups per thread");
      constexpr int HW = CW / 2;  // words of half a part (a whole number of group pairs: 3 words each)
      const int pm = (int)min(a.pair_vec, 32ll) * TPV;  // partner lane distance (uniform)
      const int pl = pm > 0 && pm < 32 && (pm & (pm - 1)) == 0 ? pm : 0;
      const long long orow_p = shfl_xor_t(orow, pl);
      const bool odd = (orow & 1) != 0;
      paired = orow >= 0 && orow_p == (orow ^ 1);
      kv_u32 own[HW], oth[HW];  // this row's and the partner row's words of the half this thread writes
#pragma unroll
      for (int k = 0; k < HW; ++k) {
        own[k] = odd ? cw[HW + k] : cw[k];
        oth[k] = shfl_xor_t(odd ? cw[k] : cw[HW + k], pl);  // what the partner needs
      }
      if (paired) {
        const kv_u32 f = odd ? 0x4444u : 0u;
        const kv_u32 s10 = 0x5410u ^ f, s32 = 0x7632u ^ f, s30 = 0x7430u ^ f, s21 = 0x6521u ^ f;
        kv_u32 w[CBT / 4];  // this half's pair words: 3 units per group (g0 g1, g2 g5, g3 g4) of both rows
#pragma unroll
        for (int m = 0; m < HW / 3; ++m) {
          const kv_u32* o = own + 3 * m;
          const kv_u32* t = oth + 3 * m;
          const kv_u32 xo = __byte_perm(o[0], o[1], 0x4352u), xt = __byte_perm(t[0], t[1], 0x4352u);  // [H1 | H2]
          w[6 * m] = __byte_perm(o[0], t[0], s10);      // H0
          w[6 * m + 1] = __byte_perm(xo, xt, s10);      // H1
          w[6 * m + 2] = __byte_perm(xo, xt, s32);      // H2
          w[6 * m + 3] = __byte_perm(o[1], t[1], s32);  // H0'
          w[6 * m + 4] = __byte_perm(o[2], t[2], s30);  // H1'
          w[6 * m + 5] = __byte_perm(o[2], t[2], s21);  // H2'
        }
        // first unit: part * CBT / 2 + (odd ? CBT / 4 : 0) of the pair, i.e. byte 2 part CBT + (odd ? CBT : 0)
        kv_u8* pdst = codes + (orow & ~1ll) * CB + 2 * part * CBT + (odd ? CBT : 0);
        if (CBT % 16 == 0 && CB % 8 == 0) {
#pragma unroll
          for (int k = 0; k < CBT / 16; ++k)
            *reinterpret_cast<uint4*>(pdst + 16 * k) = make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
        } else {
#pragma unroll
          for (int k = 0; k < CBT / 4; ++k) reinterpret_cast<kv_u32*>(pdst)[k] = w[k];
        }
      }
    }
    if (vec < nvec) {
      kv_u8* cdst = codes + orow * CB + part * CBT;
      if (IL && paired) {
      } else if (IL) {  // vpair order: unit u of row r at byte 4u + 2(r & 1) of the pair's 2 CB bytes
        kv_u16* hd = reinterpret_cast<kv_u16*>(codes + (orow & ~1ll) * CB) + (orow & 1);
#pragma unroll
        for (int m = 0; m < CBT / 12; ++m) {  // two groups (words w0 w1 w2, units as in the paired case)
          const int u = 6 * (part * (CBT / 12) + m);  // first unit of the two groups in the row
          const kv_u32 w0 = cw[3 * m], w1 = cw[3 * m + 1], w2 = cw[3 * m + 2], x = __byte_perm(w0, w1, 0x4352u);
          hd[2 * u] = (kv_u16)w0;
          hd[2 * u + 2] = (kv_u16)x;
          hd[2 * u + 4] = (kv_u16)(x >> 16);
          hd[2 * u + 6] = (kv_u16)(w1 >> 16);
          hd[2 * u + 8] = (kv_u16)__byte_perm(w2, 0u, 0x30u);
          hd[2 * u + 10] = (kv_u16)(w2 >> 8);
        }
      } else if (CBT % 16 == 0 && CB % 16 == 0) {
#pragma unroll
        for (int k = 0; k < CBT / 16; ++k)
          *reinterpret_cast<uint4*>(cdst + 16 * k) =
              make_uint4(cw[4 * k], cw[4 * k + 1], cw[4 * k + 2], cw[4 * k + 3]);
      } else if (CBT % 4 == 0 && CB % 4 == 0) {
#pragma unroll
        for (int k = 0; k < CBT / 4; ++k) reinterpret_cast<kv_u32*>(cdst)[k] = cw[k];
      } else {
#pragma unroll
        for (int k = 0; k < CBT; ++k) cdst[k] = (kv_u8)(cw[k >> 2] >> (8 * (k & 3)));
      }
      if (G <= LPT) {
#pragma unroll
        for (int bb = 0; bb < NBT; ++bb) scales[orow * NB + part * NBT + bb] = (kv_u8)sbyte[bb];
      } else if (part % TPB == 0) {
        scales[orow * NB + part / TPB] = (kv_u8)sbyte[0];
      }
      if (part == 0) flags[orow] = (kv_u8)flg;
    }
    __syncthreads();  // the buffer is refilled by the next iteration's prefetch
  }
  cp_async_wait<0>();
}

// Key front end alone, for the rows the write kernel does not encode (fp16 sink tokens): y = the rule of
// key_front_pair on every word of x (rows of N/2 words; row r uses kv head r % key_heads of the table).
template <int N, int KEYF>
__global__ void __launch_bounds__(256)
kv_key_front(const kv_u32* __restrict__ x, kv_u32* __restrict__ y, const kv_u32* __restrict__ key_tab,
             long long nwords, long long key_heads) {
  using namespace kv_enc;
  constexpr int KWPC = KEYF == 3 ? 2 : 4;
  const uint4* tab = reinterpret_cast<const uint4*>(key_tab);
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < nwords; i += 256ll * gridDim.x) {
    const long long r = i / (N / 2);
    const int k = (int)(i % (N / 2));
    kv_u32 s2, m2;
    key_words<KEYF>(tab[(k / KWPC) * key_heads + r % key_heads], k % KWPC, s2, m2);
    y[i] = key_front_pair<KEYF>(x[i], s2, m2);
  }
}

#ifndef KV_NVRTC
// Default instantiations so that `nvcc --ptx kv_encode.cu` emits code (CI compile check).
#define KV_ENC(...) template __global__ void kv_encode<__VA_ARGS__>(const KvEncodeArgs);
KV_ENC(128, 64, 3, 12, 0, 0ull, 1)
KV_ENC(128, 64, 3, 12, 1, 0ull, 1)
KV_ENC(256, 64, 4, 16, 0, 0ull, 1)
KV_ENC(4096, 64, 2, 16, 0, 0ull, 0)
KV_ENC(128, 64, 3, 12, 0, 0ull, 1, 64, 4)
// every (MODE, RND) on the fast path (default shape, 3 CTAs/SM) and on the threshold paths
#define KV_ENC_MODES(N_, G_, B_, M_, DT_, LPTM_, MINB_) \
  KV_ENC(N_, G_, B_, M_, DT_, 0ull, 1, LPTM_, MINB_, 0, 0) KV_ENC(N_, G_, B_, M_, DT_, 0ull, 1, LPTM_, MINB_, 0, 1) \
  KV_ENC(N_, G_, B_, M_, DT_, 0ull, 1, LPTM_, MINB_, 1, 0) KV_ENC(N_, G_, B_, M_, DT_, 0ull, 1, LPTM_, MINB_, 1, 1)
KV_ENC_MODES(128, 64, 3, 12, 0, 128, 3)   // fast quantizer (FMA codes)
KV_ENC_MODES(128, 64, 3, 12, 1, 128, 3)
KV_ENC_MODES(256, 64, 4, 16, 1, 128, 2)   // fp32 butterflies, threshold compares (bf16)
KV_ENC_MODES(4096, 64, 2, 16, 0, 128, 2)  // int32 butterflies, threshold compares
// the key front end (KEYF 1 scales, 2 centering, 3 both) on the cache's key formats (v2 quantizer)
#define KV_ENC_KEYF(N_, B_)                                                                        \
  KV_ENC(N_, 64, B_, 12, 0, 0ull, 1, 128, 3, 1, 1, 1) KV_ENC(N_, 64, B_, 12, 0, 0ull, 1, 128, 3, 1, 1, 2) \
  KV_ENC(N_, 64, B_, 12, 0, 0ull, 1, 128, 3, 1, 1, 3)
KV_ENC_KEYF(128, 3)
KV_ENC_KEYF(128, 4)
KV_ENC_KEYF(64, 3)
KV_ENC_KEYF(256, 4)
// the vpair value layout (IL 1) for the cache's value formats (3-bit, both dtypes, v2 quantizer)
KV_ENC(128, 64, 3, 12, 0, 0ull, 1, 128, 3, 1, 1, 0, 1)
KV_ENC(128, 64, 3, 12, 1, 0ull, 1, 128, 3, 1, 1, 0, 1)
KV_ENC(64, 64, 3, 12, 0, 0ull, 1, 128, 3, 1, 1, 0, 1)
KV_ENC(256, 64, 3, 12, 0, 0ull, 1, 128, 3, 1, 1, 0, 1)
template __global__ void kv_key_front<128, 1>(const kv_u32*, kv_u32*, const kv_u32*, long long, long long);
template __global__ void kv_key_front<128, 2>(const kv_u32*, kv_u32*, const kv_u32*, long long, long long);
template __global__ void kv_key_front<128, 3>(const kv_u32*, kv_u32*, const kv_u32*, long long, long long);
#endif
