// fwht-kv write path on the GPU: fp16/bf16 K or V vectors -> code plane, scale plane, flags.
//
// Bit-exact with the golden model sim_models.encode (sim_models/codec.py): the same integer
// pipeline, evaluated with exact arithmetic:
//   special values (NaN -> +0, +-inf -> +-max finite)  -> sign flip D (SplitMix64 mask)
//   -> block floating point (one shared exponent, M-bit mantissas, round half away from zero)
//   -> unnormalized Sylvester FWHT (log2 N butterfly stages)
//   -> per block of G lanes the smallest ue5m3 scale byte with qmax*scale >= max|y|*2^u
//   -> mid-tread codes by threshold compares (ties away from zero) -> LSB-first packing.
// Exactness argument (see gpu_ref/__init__.py "Method"): every float operation below acts on
// integers below 2^24 or multiplies by a power of two inside the normal range, so it is exact;
// the rounding of the mantissas uses two round-down adds, floor(RD(v + 1/2)) == floor(v + 1/2).
// When M - 1 + log2 N > 24 the butterflies run on int32 instead of fp32.
//
// Thread mapping: one thread holds LPT = min(N, 128) lanes of one vector in registers
// (TPV = N / LPT threads per vector, cross-thread butterfly stages by warp shuffles).
// A persistent grid of 128-thread blocks double-buffers 128*LPT input lanes per tile in
// shared memory with cp.async (coalesced 16-byte copies).
//
// Self-contained (no headers) so that NVRTC (CuPy) and nvcc both compile it.

typedef unsigned long long kv_u64;
typedef unsigned int kv_u32;
typedef unsigned short kv_u16;
typedef unsigned char kv_u8;

#ifndef KV_COMMON_DEFINED
#define KV_COMMON_DEFINED
// SplitMix64 (Steele, Lea, Flood 2014): word w of the sign mask is output w of the generator
// started at state `seed` (sim_models/signs.py).
__host__ __device__ constexpr kv_u64 kv_splitmix64(kv_u64 seed, int w) {
  kv_u64 z = seed + (kv_u64)(w + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// true when lane i is negated by D
__host__ __device__ constexpr bool kv_sign(kv_u64 seed, int has_sign, int i) {
  return has_sign != 0 && ((kv_splitmix64(seed, i >> 6) >> (i & 63)) & 1ull) != 0;
}
__host__ __device__ constexpr int kv_ilog2(int v) { return v <= 1 ? 0 : 1 + kv_ilog2(v >> 1); }
#endif

namespace kv_enc {

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  int n = pred ? 16 : 0;  // src-size 0: zero fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int K>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(K)); }

__device__ __forceinline__ float h2f(kv_u32 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
  return f;
}
__device__ __forceinline__ kv_u32 max_u16x2(kv_u32 a, kv_u32 b) {
  kv_u32 d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// 2^e as float, e in [-126, 127]
__device__ __forceinline__ float exp2i(int e) { return __int_as_float((e + 127) << 23); }

// exact a*2^ea >= b*2^eb for 0 <= a < 2^8, 0 <= b < 2^31 (sim_models.scale.ge_pow2)
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

template <typename T>
__device__ __forceinline__ T shfl_xor_t(T v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }

}  // namespace kv_enc

// x:      [nvec, N] uint16 input bit patterns (fp16 when DT == 0, bf16 when DT == 1)
// codes:  code plane rows of N*BITS/8 bytes; scales: rows of N/G bytes; flags: one byte per row
// rows:   output row of input vector v is out_rows[v] when out_rows != nullptr, else v
template <int N, int G, int BITS, int M, int DT, kv_u64 SEED, int HAS_SIGN, int LPTM = 128, int MINB = 2>
__global__ void __launch_bounds__(128, MINB)
kv_encode(const kv_u16* __restrict__ x, kv_u8* __restrict__ codes, kv_u8* __restrict__ scales,
          kv_u8* __restrict__ flags, const long long* __restrict__ out_rows, long long nvec) {
  using namespace kv_enc;
  constexpr int LPT0 = N < LPTM ? N : LPTM;
  constexpr int LPT = LPT0 * 32 < N ? N / 32 : LPT0;  // lanes per thread (<= 32 threads per vector)
  constexpr int TPV = N / LPT;                  // threads per vector
  constexpr int VPB = 128 / TPV;                // vectors per tile
  constexpr int LOG2N = kv_ilog2(N);
  constexpr int MB = DT == 0 ? 10 : 7;          // stored mantissa bits of the input type
  constexpr int EMASK = DT == 0 ? 31 : 255;
  constexpr int BIAS = DT == 0 ? 15 : 127;
  constexpr int QMAX = (1 << (BITS - 1)) - 1;
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
  static_assert(N >= 8 && (N & (N - 1)) == 0 && N <= 4096, "N");
  static_assert(G >= 8 && N % G == 0, "G");
  static_assert(BITS >= 2 && BITS <= 4, "BITS");

  extern __shared__ __align__(16) kv_u8 smem[];
  const int tid = threadIdx.x;
  const long long ntiles = (nvec + VPB - 1) / VPB;

  auto issue = [&](long long tile, int buf) {
    kv_u8* dst = smem + buf * TILEB;
    const kv_u16* src = x + tile * (long long)VPB * N;
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

    // ---- special values and the shared exponent ------------------------------------------
    kv_u32 rm2 = 0;
#pragma unroll
    for (int k = 0; k < LPT / 2; ++k) rm2 = max_u16x2(rm2, w[k] & 0x7FFF7FFFu);
    kv_u32 rmax = max(rm2 & 0xFFFFu, rm2 >> 16);
    kv_u32 flg = 0;
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
    const int u = emax - BIAS - M + 2;  // exponent of one mantissa unit
    float P1, P2 = 1.0f;
    if (DT == 0) {
      P1 = exp2i(-u);
    } else {
      bool big = -u > 126;
      P1 = big ? exp2i(64) : exp2i(-u);
      P2 = big ? exp2i(-u - 64) : 1.0f;
    }

    // ---- block floating point (+ sign flip D folded in) ----------------------------------
    // D is a compile-time constant when one thread holds the whole vector; otherwise the
    // thread's 128 mask bits are generated once per vector.
    // (two threads per vector: both halves' masks are constants, selected by `part`)
    kv_u64 mw[2] = {0ull, 0ull};
    if (TPV > 2 && HAS_SIGN) {
      mw[0] = kv_splitmix64(SEED, part * (LPT / 64));
      if (LPT > 64) mw[1] = kv_splitmix64(SEED, part * (LPT / 64) + 1);
    }
    float yf[FLT ? LPT : 1];
    int yi[FLT ? 1 : LPT];
#pragma unroll
    for (int i = 0; i < LPT; ++i) {
      kv_u32 h = (w[i >> 1] >> (16 * (i & 1))) & 0xFFFFu;
      float f = DT == 0 ? h2f(h) : __int_as_float(h << 16);
      float v = fabsf(f) * P1;
      if (DT != 0) v *= P2;
      float r = __fadd_rd(v, 0.5f);
      float n23 = __fadd_rd(r, 8388608.0f);  // 2^23 + floor(v + 1/2), exact
      const bool dneg = TPV == 1 ? kv_sign(SEED, HAS_SIGN, i)
                        : TPV == 2 ? (part ? kv_sign(SEED, HAS_SIGN, LPT + i) : kv_sign(SEED, HAS_SIGN, i))
                                   : (HAS_SIGN != 0 && ((mw[(i >> 6) & 1] >> (i & 63)) & 1ull) != 0);
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

    // ---- FWHT: in-thread stages, then cross-thread stages -----------------------------------
#pragma unroll
    for (int hs = 1; hs < LPT; hs <<= 1) {
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

    // ---- scales (exact binary search, as the golden model) and code thresholds ----------------
    int sbyte[NBT];
    long long thr[NBT][QMAX];
#pragma unroll
    for (int bb = 0; bb < NBT; ++bb) {
      constexpr int BL = G <= LPT ? G : LPT;
      int amax;
      if (FLT) {
        float t8[8];  // 8 independent chains (latency), then a tree
#pragma unroll
        for (int k = 0; k < 8; ++k) t8[k] = 0.0f;
#pragma unroll
        for (int i = 0; i < BL; ++i) t8[i & 7] = fmaxf(t8[i & 7], fabsf(yf[FLT ? bb * BL + i : 0]));
        float am = fmaxf(fmaxf(fmaxf(t8[0], t8[1]), fmaxf(t8[2], t8[3])), fmaxf(fmaxf(t8[4], t8[5]), fmaxf(t8[6], t8[7])));
        amax = (int)am;  // exact: integer < 2^24
      } else {
        int am = 0;
#pragma unroll
        for (int i = 0; i < BL; ++i) am = max(am, abs(yi[FLT ? 0 : bb * BL + i]));
        amax = am;
      }
#pragma unroll
      for (int o = 1; o < TPB; o <<= 1) amax = max(amax, shfl_xor_t(amax, o));
      int lo = 1, hi = 256;
#pragma unroll
      for (int itr = 0; itr < 8; ++itr) {
        if (lo < hi) {
          int mid = (lo + hi) >> 1;
          int sg, ex;
          scale_sig_exp(mid > 255 ? 255 : mid, sg, ex);
          bool ok = mid <= 255 && ge_pow2((long long)(QMAX * sg), ex, (long long)amax, u);
          if (ok) hi = mid; else lo = mid + 1;
        }
      }
      if (lo > 255) { flg |= 4u; lo = 255; }  // FLAG_SAT
      sbyte[bb] = lo;
      int sg, ex;
      scale_sig_exp(lo, sg, ex);
      int sh = ex - u - 1;  // |y| >= (2j-1)*sig*2^sh  <=>  |y| >= ceil((2j-1)*sig*2^sh)
#pragma unroll
      for (int j = 1; j <= QMAX; ++j) {
        long long num = (long long)((2 * j - 1) * sg);
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
          negy = __float_as_int(y) < 0;
        } else {
          int y = yi[FLT ? 0 : i];
          long long a = y < 0 ? -(long long)y : (long long)y;
#pragma unroll
          for (int j = 0; j < QMAX; ++j) cnt += (a >= thr[bb][j]) ? 1 : 0;
          negy = y < 0;
        }
        kv_u32 fld = (kv_u32)(negy ? -cnt : cnt) & ((1u << BITS) - 1);
        const int bit = i * BITS;
        cw[bit >> 5] |= fld << (bit & 31);
        if ((bit & 31) + BITS > 32) cw[(bit >> 5) + 1] |= fld >> (32 - (bit & 31));
      }
    }

    // ---- stores ---------------------------------------------------------------------------
    if (vec < nvec) {
      const long long orow = out_rows ? out_rows[vec] : vec;
      kv_u8* cdst = codes + orow * CB + part * CBT;
      if (CBT % 16 == 0 && CB % 16 == 0) {
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

#ifndef KV_NVRTC
// Default instantiations so that `nvcc --ptx kv_encode.cu` emits code (CI compile check).
template __global__ void kv_encode<128, 64, 3, 12, 0, 0ull, 1>(const kv_u16*, kv_u8*, kv_u8*, kv_u8*, const long long*, long long);
template __global__ void kv_encode<128, 64, 3, 12, 1, 0ull, 1>(const kv_u16*, kv_u8*, kv_u8*, kv_u8*, const long long*, long long);
template __global__ void kv_encode<256, 64, 4, 16, 0, 0ull, 1>(const kv_u16*, kv_u8*, kv_u8*, kv_u8*, const long long*, long long);
template __global__ void kv_encode<4096, 64, 2, 16, 0, 0ull, 0>(const kv_u16*, kv_u8*, kv_u8*, kv_u8*, const long long*, long long);
template __global__ void kv_encode<128, 64, 3, 12, 0, 0ull, 1, 64, 4>(const kv_u16*, kv_u8*, kv_u8*, kv_u8*, const long long*, long long);
#endif
