// fwht-kv fused decode attention over the packed 3-bit cache (flash-decoding, split-KV).
//
// Reconstruction (sim_models/quant.py): mid-tread y_hat = c * scale; mid-rise (template MR = 1)
// y_hat = (2c + 1) * scale / 2 = (c + 1/2) * scale: the value fed to the tensor cores is c + 1/2 (exact
// in fp16), the scale is used as stored (the 1/2 folded into the code -> value map).
// Math (sim_models/fwht.py): with y = H D x and H H = N I,
//   q . k_hat = (H D q) . y_hat_k / N,      o = D H ( sum_t p_t y_hat_v,t ) / N,
// where y_hat = code * scale (scale per block of G lanes). So the kernel rotates q once
// (q~ = H D q: each warp rotates two rows in registers with shuffles, then one barrier), never
// rotates K or V, and rotates the output back once (again in registers).
//
// Cache layout (all uint8, 16-byte aligned): page pools (vLLM/FlashInfer convention, HND)
//   k_codes [P, KVH, page, N*KB/8], v_codes [P, KVH, page, N*VB/8]  golden code rows (LSB-first fields); with
//                                        VIL = 1 the value rows in the vpair order of gpu_ref/layout.py (token pairs)
//   k_scales, v_scales [P, KVH, page, N/G]                           ue5m3 scale bytes
// addressed by a block table [B, max_pages]; the contiguous layout [B, KVH, CAP, *] is one page of
// CAP rows per sequence (CAP a multiple of 16, so 16-byte copies of a partial tile stay inside).
// KB, VB (key / value bits) are 3 or 4 each. Optional: fp16/bf16 sink tokens (the first `sinks`
// tokens of each sequence, unquantized, side planes [B, KVH, sinks, N]) merged by log-sum-exp: up to SF = 8
// of them by the output stage (their rows are copied in with the first tiles; the sink term is added
// after the back-rotation, where no rotation is needed), more as one more split partial computed by
// their own CTA (the last split) in parallel with the token splits; and a per-(kv head, lane) factor on q
// (1/s of power-of-two key scales).
//
// Work split: grid (B * KVH * HT head tiles, S partials = token splits + 1 if sinks > SF). A CTA of 4
// warps handles one
// (batch, kv head, tile of <= 8 q heads of its GQA group) over one token range; each warp
// streams its own 64-token tiles through a STAGES-deep cp.async pipeline in shared memory.
// Per tile, in registers:
//   S^T[16 tokens x 8 heads] = Kcodes[16 x 16 lanes] . q~'[16 lanes x 8 heads]   (mma m16n8k16,
//      K codes as fp16 "1 + (c+4) 2^(o-10)" built by PRMT + LOP3 from the packed bytes (3-bit keys in
//      64-lane blocks: each thread only its segment of the row, see kseg_*); the constant part is removed by
//      starting the accumulator at -Z; q~' is one fp16 part, or hi+lo (QLO, plans with key scales) so q is
//      carried to ~2^-22), one accumulator per scale block, then times the K scale; full tiles and the
//      partial last tile of a range are separate instantiations of the tile body (no token masks in the former);
//   online softmax (exp2, running max) per head;
//   O^T[16 lanes x 8 heads] += Vcodes^T[16 lanes x 16 tokens] . P'^T[16 tokens x 8 heads]
//      with exact small-integer fp16 codes (PRMT + LOP3 + HFMA2) and P' = (p 2^-E) * v_scale, p 2^-E = ex2(x - m - E)
//      (E: running max exponent of the V scales, folded into the rescale), transposed into the
//      B operand with movmatrix.
// The 4 warps merge in shared memory. With one partial (S = 1) the CTA normalises, applies D H / N and
// writes the output. Otherwise the partials (fp32 m, l, acc in the rotated domain) are merged either
// through the workspace -- the last CTA of a (batch, head tile) (atomic ticket) merges them -- or, in the
// cluster entry (kv_decode_attn_cl), through distributed shared memory of the cluster of S CTAs.
// Nothing but the packed bytes (and the sink rows) is read from the cache.
//
// Shared definitions: kv_common.cuh (NVRTC gets -I of this folder).

#include "kv_common.cuh"

namespace kv_dec {
using namespace kv_common;

template <bool B>
struct kv_bool {
  static constexpr bool value = B;
};

// Lanes (within a 16-lane chunk = one mma k-step) that thread tig = lane % 4 feeds to the
// QK mma: pair 0 -> virtual k (2tig, 2tig+1), pair 1 -> (2tig+8, 2tig+9); (lo lane, hi lane).
// Chosen so that each pair's two 3-bit fields sit in byte pairs that one PRMT can gather.
// 3-bit keys:
__constant__ int kpairs3[4][2][2] = {{{0, 3}, {1, 4}}, {{8, 11}, {9, 12}}, {{6, 14}, {7, 15}}, {{2, 5}, {10, 13}}};
// 4-bit keys: thread tig reads bytes 2tig, 2tig+1 of the chunk (lanes 4tig..4tig+3); pair 0 takes the
// low nibbles (bit offset 0), pair 1 the high nibbles (offset 4).
__constant__ int kpairs4[4][2][2] = {{{0, 2}, {1, 3}}, {{4, 6}, {5, 7}}, {{8, 10}, {9, 11}}, {{12, 14}, {13, 15}}};

// 3-bit keys with 64-lane scale blocks (KSEG): thread tig reads only its segment of each block, lanes
// 64 bb + 16 tig .. + 15 = bytes 24 bb + 6 tig .. + 5 of the row, as the two words from word 6 bb + kseg_word(tig)
// (the segment starts at byte 0 or 2 of the first), and builds its 8 half2 per block and row with 3 PRMT + 8 LOP3
// (the general path: 16 PRMT + 16 LOP3): each PRMT gathers two byte pairs ("windows") whose fields start at
// fp16 mantissa bit offsets <= 7, and one LOP3 per field pair sets the exponent (as lop_field). Windows of
// segment bytes (0,1) (fields 0,1,2 at offsets 0,3,6), (1,2) (3,4,5 at 1,4,7), (3,4) (8,9,10 at 0,3,6),
// (4,5) (11,12,13 at 1,4,7), (2,3) (6,7 at 2,5), (5,-) (14,15 at 2,5). Half2 h (chunk 4 bb + h / 2, pair
// h % 2) holds segment fields (kseg_jl(h), kseg_jh(h)) at bit offsets (kseg_ol(h), kseg_oh(h)).
__host__ __device__ constexpr int kseg_jl(int h) { return h < 3 ? h : h < 6 ? h + 5 : h; }      // 0 1 2 8 9 10 6 7
__host__ __device__ constexpr int kseg_jh(int h) { return h < 3 ? h + 3 : h + 8; }               // 3 4 5 11 .. 15
__host__ __device__ constexpr int kseg_ol(int h) { return h < 6 ? 3 * (h % 3) : h == 6 ? 2 : 5; }  // 0 3 6 0 3 6 2 5
__host__ __device__ constexpr int kseg_oh(int h) { return h < 6 ? 3 * (h % 3) + 1 : h == 6 ? 2 : 5; }  // 1 4 7 1 4 7 2 5
__host__ __device__ constexpr int kseg_word(int tig) { return (6 * tig) >> 2; }                  // 0 1 3 4
// PRMT selectors (segment phase ph = 2 (tig & 1) bytes): windows (0,1)|(1,2), (3,4)|(4,5), (2,3)|(5,-)
__host__ __device__ constexpr kv_u32 kseg_sel(int w, int tig) {
  return (w == 0 ? 0x2110u : w == 1 ? 0x5443u : 0x5532u) + 0x1111u * (kv_u32)(2 * (tig & 1));
}

__device__ __forceinline__ kv_u32 f2h(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ kv_u32 pack_h2(float lo, float hi) {
  kv_u32 d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));  // ftz: no denormal range fix-up
  return y;
}
__device__ __forceinline__ kv_u32 lop_field(kv_u32 x, kv_u32 a, kv_u32 b) {
  // per bit: a ? (b ? ~x : x) : b   (field bits, XOR-4 bit, constant exponent bits)
  kv_u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(x), "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ kv_u32 hfma2(kv_u32 a, kv_u32 b, kv_u32 c) {
  kv_u32 d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ kv_u32 movtrans(kv_u32 a) {
  kv_u32 d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
  return d;
}
__device__ __forceinline__ void mma16816(float* c, kv_u32 a0, kv_u32 a1, kv_u32 a2, kv_u32 a3, kv_u32 b0, kv_u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
// ue5m3 scale byte -> float (exact): (8+m) 2^(e-10) for e >= 1, m 2^-9 for e == 0
__device__ __forceinline__ float scale_f(kv_u32 s) {
  return s >= 8 ? __int_as_float((int)((s << 20) + (120u << 23))) : (float)s * 0.001953125f;
}

// fp16 bit pattern of a small non-negative integer (< 2048) or of 2^-k (compile time)
__host__ __device__ constexpr kv_u32 h_int(int v) {
  return v == 0 ? 0u : ((kv_u32)(kv_ilog2(v) + 15) << 10) | (((kv_u32)v << (10 - kv_ilog2(v))) & 0x3FFu);
}

// half2 of the V values of segment lane J from two tokens' segments (lo <- sx, hi <- sy), exact:
// c (mid-tread) or c + 1/2 (mid-rise, MR = 1), for VB-bit fields (VB = 3 or 4; T = 2^(VB-1)).
// The LOP3 builds 1024 + (c + T) 2^O (the field's top bit flipped: two's complement -> offset binary),
// the HFMA2 multiplies by 2^-O and subtracts 2^(10-O) + T. Mid-rise: for O >= 1 the half is the
// mantissa bit below the field, set by the same LOP3; for O == 0 there is no such bit, so those lanes
// take one HADD2 of +1/2.
template <int J, int MR = 0, int VB = 3>
__device__ __forceinline__ kv_u32 vext(kv_u32 sx, kv_u32 sy) {
  constexpr int BETA = (VB * J) >> 3, O = (VB * J) & 7, T = 1 << (VB - 1), FM = (1 << VB) - 1;
  constexpr int B1 = BETA + 1 < 4 ? BETA + 1 : 3;  // second byte (only read when the field crosses)
  constexpr kv_u32 SEL = BETA | (B1 << 4) | ((BETA + 4) << 8) | ((B1 + 4) << 12);
  constexpr kv_u32 AM = ((kv_u32)FM << O) | ((kv_u32)FM << (16 + O));
  constexpr kv_u32 HALF = (MR && O > 0) ? ((1u << (O - 1)) | (1u << (15 + O))) : 0u;
  constexpr kv_u32 BM = ((kv_u32)T << O) | ((kv_u32)T << (16 + O)) | 0x64006400u | HALF;  // exponent of 1024
  constexpr kv_u32 MUL = ((kv_u32)(15 - O) << 10) * 0x10001u;                                // 2^-O
  constexpr kv_u32 ADD = (0x8000u | h_int((1 << (10 - O)) + T)) * 0x10001u;                 // -(2^(10-O) + T)
  static_assert(O + VB <= 10 && (VB == 4 || O + VB <= 16), "field inside the fp16 mantissa");
  kv_u32 r = __byte_perm(sx, sy, SEL);
  r = lop_field(r, AM, BM);  // 1024 + (c + T) 2^O  (+ 2^(O-1): mid-rise, O >= 1)
  r = hfma2(r, MUL, ADD);    // c  (c + 1/2)
  if (MR && O == 0) {
    kv_u32 d;
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(r), "r"(0x38003800u));  // + 1/2, exact
    r = d;
  }
  return r;
}

// half2 of a 3-bit V field at bit offset O of both 16-bit halves of x (the vpair layout puts the same lane of two
// tokens there): LOP3 + HFMA2 as in vext (+ HADD2 for mid-rise at O == 0), same values bit for bit.
template <int O, int MR>
__device__ __forceinline__ kv_u32 vfin(kv_u32 x) {
  constexpr int T = 4, FM = 7;
  constexpr kv_u32 AM = ((kv_u32)FM << O) | ((kv_u32)FM << (16 + O));
  constexpr kv_u32 HALF = (MR && O > 0) ? ((1u << (O - 1)) | (1u << (15 + O))) : 0u;
  constexpr kv_u32 BM = ((kv_u32)T << O) | ((kv_u32)T << (16 + O)) | 0x64006400u | HALF;
  constexpr kv_u32 MUL = ((kv_u32)(15 - O) << 10) * 0x10001u;
  constexpr kv_u32 ADD = (0x8000u | h_int((1 << (10 - O)) + T)) * 0x10001u;
  static_assert(O + 3 <= 10, "field inside the fp16 mantissa");
  kv_u32 r = hfma2(lop_field(x, AM, BM), MUL, ADD);
  if (MR && O == 0) {
    kv_u32 d;
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(r), "r"(0x38003800u));
    r = d;
  }
  return r;
}

// Walsh-Hadamard butterflies of one length-N row held by a warp in registers, v[k] = row[lane + 32 k]:
// stages h = 1..16 through shuffles, h >= 32 inside the thread; the stage order h = 1, 2, 4, ... and
// each butterfly (a + b, a - b) are those of the textbook loop, so the result is the same bit for bit.
template <int N>
__device__ __forceinline__ void fwht_warp(float (&v)[N / 32], int lane) {
  constexpr int K = N / 32;
#pragma unroll
  for (int h = 1; h < 32; h <<= 1) {
    const bool up = (lane & h) != 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const float o = __shfl_xor_sync(0xffffffffu, v[k], h);
      v[k] = up ? o - v[k] : v[k] + o;
    }
  }
#pragma unroll
  for (int hk = 1; hk < K; hk <<= 1)
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (!(k & hk)) {
        const float a = v[k], b = v[k + hk];
        v[k] = a + b;
        v[k + hk] = a - b;
      }
}

}  // namespace kv_dec

#define KV_NEG_INF __int_as_float(0xff800000)

// KB, VB: key / value code bits (3 or 4). PSUB: pages per 64-token tile (1: the page holds whole
// tiles -- page size a multiple of 64, or the contiguous layout, one page per sequence; 2 or 4: pages
// of 32 or 16 tokens).
template <int N, int G, int KB, int VB, int PSPLIT, int STAGES, int PSUB>
struct KvDecCfg {
  static constexpr int TT = 64;             // tokens per tile
  static constexpr int CBK = N * KB / 8;    // key code bytes per token
  static constexpr int CBV = N * VB / 8;    // value code bytes per token
  static constexpr int NB = N / G;          // scale bytes per token
  static constexpr int NCH = N / 16;        // QK k-steps (16-lane chunks)
  static constexpr int NMT = N / 16;        // PV m-tiles (16 output lanes)
  static constexpr int MPB = G / 16;        // PV m-tiles per scale block
  static constexpr int SEGL = G / 8;        // lanes per V segment (per thread and block)
  static constexpr int PG = TT / PSUB;      // tokens per page when PSUB > 1
  static constexpr int STB = TT * CBK + TT * CBV + 2 * TT * NB;  // one pipeline stage
  static constexpr int SCF = 2 * NB * 64 * 4;                    // decoded scale floats
  static constexpr int WREG_RAW = STAGES * STB + 16 + SCF;
  static constexpr int WACC = 8 * N * 4;
  static constexpr int WREG = ((WREG_RAW > WACC + 2048 ? WREG_RAW : WACC + 2048) + 15) / 16 * 16;
  static constexpr int QS_OFF = 4 * WREG;                 // q~ / output rows [8][N] fp32
  // wm[4][8], wl[4][8] (per warp and head), wE[4] (+4 pad), hm[8], hl[8], eq[8] (q~ exponent per head),
  // hf[4][8] (merge factor per warp and head), last (+3 pad)
  static constexpr int MISC_OFF = QS_OFF + 8 * N * 4;
  static constexpr int LUT_OFF = MISC_OFF + (32 + 32 + 8 + 8 + 8 + 8 + 32 + 4) * 4;  // ue5m3 -> float [256]
  // up to SF sink tokens are merged by the output stage: their rows, 16-bit [2][SF][N] (SR_OFF), are copied
  // in with the first pipeline stage (4 KB at N = 128: K4/V4 still fits 2 CTAs per SM)
  static constexpr int SF = 8;
  static constexpr int SR_OFF = LUT_OFF + 256 * 4;
  static constexpr int SMEM = SR_OFF + 2 * SF * N * 2;
  // more sinks: the sink CTA stages its rows (16-bit) at 0 and SINKV_OFF, weights [8][64] fp32 at SINKP_OFF
  static constexpr int MAXS = 64;
  static constexpr int SINKV_OFF = MAXS * N * 2;
  static constexpr int SINKP_OFF = 2 * MAXS * N * 2;
  static_assert(SINKP_OFF + 8 * MAXS * 4 <= 4 * WREG, "sink rows fit in the warp regions");
  static_assert(PSUB == 1 || PSUB == 2 || PSUB == 4, "PSUB");
  static_assert((PG * CBK) % 16 == 0 && (PG * CBV) % 16 == 0 && (PG * NB) % 16 == 0 || PSUB == 1,
                "16-byte copies stay inside one page");
};

namespace kv_dec {

// Global address of byte `off` of a tile plane (row bytes RB) whose PSUB pages start at base[j].
template <int PSUB, int RB, int PG>
__device__ __forceinline__ const kv_u8* tile_addr(const kv_u8* const* base, int off) {
  if constexpr (PSUB == 1) {
    return base[0] + off;
  } else {
    const int j = off / (PG * RB);
    const kv_u8* p = base[0];
#pragma unroll
    for (int jj = 1; jj < PSUB; ++jj) p = j == jj ? base[jj] : p;  // select: no run-time array index
    return p + (off - j * PG * RB);
  }
}

// Sign of lane lane + 32 k under D (lane < 32, so its 64-bit mask word k / 2 is a compile-time constant
// once k is unrolled).
template <kv_u64 SEED, int HAS_SIGN>
__device__ __forceinline__ bool lane_sign(int k, int lane) {
  return HAS_SIGN != 0 && ((kv_splitmix64(SEED, k >> 1) >> ((lane + 32 * k) & 63)) & 1ull) != 0;
}

// The sink CTA (the last split of a plan with sinks): the fp16/bf16 sink tokens of one (batch, kv head,
// head tile) as one more split partial, computed while the other CTAs stream the packed tokens:
// m = max logit (log2 domain: scale * log2 e * (q * q_scale) . k), l = sum 2^(x - m),
// acc = H D sum_s 2^(x_s - m) v_s (the rotated domain of the packed tokens' sums, unnormalised like
// H D v = y). The sink rows are staged in shared memory with one batch of 16-byte loads.
template <int N, kv_u64 SEED, int HAS_SIGN, int SINKV_OFF, int SINKP_OFF>
__device__ __forceinline__ void sink_partial(const kv_u16* __restrict__ q, int q_bf16,
                                             const float* __restrict__ q_scale, const kv_u16* __restrict__ ksink,
                                             const kv_u16* __restrict__ vsink, int ns, int nh, float kap,
                                             kv_u8* smem, float* qs, float* __restrict__ pacc,
                                             float* __restrict__ pml, int tid) {
  auto ld = [&](kv_u16 bits) { return q_bf16 ? __int_as_float((kv_u32)bits << 16) : h2f(bits); };
  const kv_u16* ks16 = reinterpret_cast<const kv_u16*>(smem);
  const kv_u16* vs16 = reinterpret_cast<const kv_u16*>(smem + SINKV_OFF);
  float* sp = reinterpret_cast<float*>(smem + SINKP_OFF);  // [8][64] logits, then weights
  for (int c = tid; c < ns * N / 8; c += 128) {               // 16-byte chunks of both planes
    reinterpret_cast<uint4*>(smem)[c] = __ldg(reinterpret_cast<const uint4*>(ksink) + c);
    reinterpret_cast<uint4*>(smem + SINKV_OFF)[c] = __ldg(reinterpret_cast<const uint4*>(vsink) + c);
  }
  for (int i = tid; i < 8 * N; i += 128) {  // q (scaled), unrotated
    const int h = i / N, l = i % N;
    float v = 0.0f;
    if (h < nh) v = ld(q[(long long)h * N + l]) * (q_scale ? q_scale[l] : 1.0f);
    qs[i] = v;
  }
  for (int i = tid; i < 8 * 64; i += 128) sp[i] = KV_NEG_INF;
  __syncthreads();
  // logits: 4 threads per (head, token), each a quarter of the lanes, then 2 shuffles
  const int qq = tid & 3;
  for (int base = 0; base < nh * ns; base += 32) {  // CTA-uniform trip count
    const int pr = base + (tid >> 2);
    const bool ok = pr < nh * ns;
    const int h = ok ? pr / ns : 0, t = ok ? pr - h * ns : 0;
    float d = 0.0f;
#pragma unroll 8
    for (int i = qq; i < N; i += 4) d = fmaf(qs[h * N + i], ld(ks16[t * N + i]), d);
    d += __shfl_xor_sync(0xffffffffu, d, 1);
    d += __shfl_xor_sync(0xffffffffu, d, 2);
    if (ok && qq == 0) sp[h * 64 + t] = d * kap;
  }
  __syncthreads();
  if (tid < 8) {
    float m = KV_NEG_INF;
    for (int t = 0; t < ns; ++t) m = fmaxf(m, sp[tid * 64 + t]);
    float l = 0.0f;
    for (int t = 0; t < ns; ++t) {
      const float w = m > KV_NEG_INF ? exp2f(sp[tid * 64 + t] - m) : 0.0f;
      sp[tid * 64 + t] = w;
      l += w;
    }
    pml[tid] = m;
    pml[8 + tid] = l;
  }
  __syncthreads();
  // acc rows 2w, 2w+1 in registers: D sum_s w_s v_s, rotated in the warp, written as the partial
  const int warp = tid >> 5, lane = tid & 31;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = 2 * warp + r;
    float v[N / 32];
#pragma unroll
    for (int k = 0; k < N / 32; ++k) v[k] = 0.0f;
    for (int t = 0; t < ns; ++t) {
      const float w = sp[h * 64 + t];
#pragma unroll
      for (int k = 0; k < N / 32; ++k) v[k] = fmaf(w, ld(vs16[t * N + lane + 32 * k]), v[k]);
    }
#pragma unroll
    for (int k = 0; k < N / 32; ++k)
      if (lane_sign<SEED, HAS_SIGN>(k, lane)) v[k] = -v[k];
    fwht_warp<N>(v, lane);
#pragma unroll
    for (int k = 0; k < N / 32; ++k) pacc[h * N + lane + 32 * k] = v[k];
  }
}

// Output row of one head from its merged rotated-domain sums v (lanes lane + 32 k), normalised over the
// packed tokens (their max logit M and sum L, log2 domain): o = D H v / N, then, with ns > 0 sink tokens
// (<= SF, rows ksr / vsr in shared memory, same 16-bit type as q; qv: q * q_scale of the head, requested
// by the caller before its merge barriers), the sinks as
// one more softmax participant in the output domain (D H / N undoes the rotation, so sum p_s v_s adds as
// is): o = (2^(M - M') L o + sum_s 2^(x_s - M') v_s) / (2^(M - M') L + sum_s 2^(x_s - M')), M' = max(M, x_s).
// Written as fp16 (out_kind 0), bf16 (1) or fp32 (2) at out + o0 when `write`. The whole warp calls it.
template <int N, kv_u64 SEED, int HAS_SIGN, int SF>
__device__ __forceinline__ void store_out_row(float (&v)[N / 32], void* out, int out_kind, long long o0, bool write,
                                              int lane, float M, float L, int ns, const float (&qv)[N / 32],
                                              const kv_u16* ksr, const kv_u16* vsr, int q_bf16, float kap) {
  fwht_warp<N>(v, lane);
#pragma unroll
  for (int k = 0; k < N / 32; ++k) {
    v[k] *= (1.0f / (float)N);
    if (lane_sign<SEED, HAS_SIGN>(k, lane)) v[k] = -v[k];
  }
  if (ns > 0) {
    auto ld = [&](kv_u16 bits) { return q_bf16 ? __int_as_float((kv_u32)bits << 16) : h2f(bits); };
    float x[SF];
#pragma unroll
    for (int t = 0; t < SF; ++t) {
      float d = 0.0f;
      if (t < ns)
#pragma unroll
        for (int k = 0; k < N / 32; ++k) d = fmaf(qv[k], ld(ksr[t * N + lane + 32 * k]), d);
      x[t] = d;
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1)
#pragma unroll
      for (int t = 0; t < SF; ++t) x[t] += __shfl_xor_sync(0xffffffffu, x[t], o);
    float ms = KV_NEG_INF;
#pragma unroll
    for (int t = 0; t < SF; ++t) {
      x[t] = t < ns ? x[t] * kap : KV_NEG_INF;
      ms = fmaxf(ms, x[t]);
    }
    const float M2 = fmaxf(M, ms);  // finite: ns > 0
    const float al = (M > KV_NEG_INF && L > 0.0f) ? ex2(M - M2) * L : 0.0f;
    float L2 = al;
#pragma unroll
    for (int k = 0; k < N / 32; ++k) v[k] *= al;
#pragma unroll
    for (int t = 0; t < SF; ++t)
      if (t < ns) {
        const float be = ex2(x[t] - M2);
        L2 += be;
#pragma unroll
        for (int k = 0; k < N / 32; ++k) v[k] = fmaf(be, ld(vsr[t * N + lane + 32 * k]), v[k]);
      }
    const float inv = L2 > 0.0f ? 1.0f / L2 : 0.0f;
#pragma unroll
    for (int k = 0; k < N / 32; ++k) v[k] *= inv;
  }
  if (!write) return;
#pragma unroll
  for (int k = 0; k < N / 32; ++k) {
    const float x = v[k];
    const long long o = o0 + lane + 32 * k;
    if (out_kind == 2) {
      reinterpret_cast<float*>(out)[o] = x;
    } else if (out_kind == 1) {
      unsigned short rb;
      asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(rb) : "f"(x));
      reinterpret_cast<kv_u16*>(out)[o] = rb;
    } else {
      reinterpret_cast<kv_u16*>(out)[o] = (kv_u16)f2h(x);
    }
  }
}

// q * q_scale of one head (lanes lane + 32 k), for the sink logits of the output stage
template <int N>
__device__ __forceinline__ void load_q_row(float (&qv)[N / 32], const kv_u16* qg, const float* qsc, int q_bf16,
                                           int lane) {
#pragma unroll
  for (int k = 0; k < N / 32; ++k) {
    const kv_u32 bits = qg[lane + 32 * k];
    qv[k] = (q_bf16 ? __int_as_float(bits << 16) : h2f(bits)) * (qsc ? qsc[lane + 32 * k] : 1.0f);
  }
}

// Thread-block clusters (sm_90): barrier over every thread of the cluster (release / acquire), this CTA's
// rank, and a load from the same shared-memory variable in the CTA of rank r (distributed shared memory).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ int cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return (int)r;
}
__device__ __forceinline__ float ld_cluster(const float* p, int r) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p), ra;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(r));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ra) : "memory");
  return v;
}

}  // namespace kv_dec

// VIL: 1 = value codes in the vpair order (gpu_ref/layout.py; 3-bit values, G = 64), 0 = golden order.
// MINB: CTAs per SM for the register budget; QLO: also feed the low fp16 part of q~;
// ABL: ablation for profiling only (1: no PV, 2: no QK) -- results are wrong when ABL != 0.
// MR: 0 mid-tread (y_hat = c scale), 1 mid-rise (y_hat = (c + 1/2) scale).
//
// Cache addressing (vLLM/FlashInfer paged convention, HND): the four planes are page pools
// [pages, KVH, page, row bytes]; packed token i of sequence b (its token sinks + i) lives in page
// block_table[b * max_pages + i / page], row i % page (page = 2^page_shift). The contiguous layout
// [B, KVH, CAP, *] is the case page = CAP, page_shift = -1: sequence b is page b (the table is not read).
// lengths[b] counts every token of sequence b; the first `sinks` of them are in the fp16 side planes
// k_sink, v_sink [B, KVH, sinks, N] (same bits as q), the rest are packed (at most cap of them).
// q_scale: [KVH, N] factor applied to q (1/s of per-channel key scales s), or null.
// CL: 0, or the cluster size (2, 4, 8) of the kv_decode_attn_cl entry: the CTAs of one (batch, head tile)
// form one thread-block cluster (grid y = CL partials) and merge their partials through distributed
// shared memory instead of the workspace (no fences, tickets or global round trips).
#define KV_DEC_PARAMS                                                                                    \
  const kv_u16 *__restrict__ q, int q_bf16, const kv_u8 *__restrict__ kc, const kv_u8 *__restrict__ ks,  \
      const kv_u8 *__restrict__ vc, const kv_u8 *__restrict__ vs, const int *__restrict__ block_table,   \
      int max_pages, int page_shift, long long page, const int *__restrict__ lengths,                    \
      const kv_u16 *__restrict__ k_sink, const kv_u16 *__restrict__ v_sink, int sinks,                   \
      const float *__restrict__ q_scale, float *__restrict__ part_acc, float *__restrict__ part_ml,       \
      int *__restrict__ counters, void *__restrict__ out, int out_kind, int Hq, int KVH, int HT, int group, \
      long long cap, int S, int chunk, float sm_scale
// The kernels take these as one struct, passed by value (the launch parameters, as separate arguments would
// be): gpu_ref.decode.PARAMS_DTYPE mirrors it field by field (tests/test_gpu_api.py checks the two agree).
struct KvDecParams {
  const kv_u16* q;          // [B, Hq, N] fp16 or bf16 bits
  const kv_u8* kc;          // key codes pool
  const kv_u8* ks;          // key scales pool
  const kv_u8* vc;          // value codes pool
  const kv_u8* vs;          // value scales pool
  const int* block_table;   // [B, max_pages] (paged) or null
  const int* lengths;       // [B]
  const kv_u16* k_sink;     // [B, KVH, sinks, N] or null
  const kv_u16* v_sink;
  const float* q_scale;     // [KVH, N] or null
  float* part_acc;          // workspace: split partials
  float* part_ml;
  int* counters;
  void* out;                // [B, Hq, N]
  long long page;           // rows per page (contiguous: the capacity)
  long long cap;            // packed rows per sequence
  int q_bf16, max_pages, page_shift, sinks, out_kind, Hq, KVH, HT, group, S, chunk;
  float sm_scale;
};
#define KV_DEC_ARGS                                                                                              \
  p.q, p.q_bf16, p.kc, p.ks, p.vc, p.vs, p.block_table, p.max_pages, p.page_shift, p.page, p.lengths, p.k_sink, \
      p.v_sink, p.sinks, p.q_scale, p.part_acc, p.part_ml, p.counters, p.out, p.out_kind, p.Hq, p.KVH, p.HT,     \
      p.group, p.cap, p.S, p.chunk, p.sm_scale

template <int N, int G, int KB, int VB, int PSPLIT, int STAGES, kv_u64 SEED, int HAS_SIGN, int MINB, int QLO,
          int ABL, int MR, int PSUB, int VIL, int CL>
__device__ __forceinline__ void kv_decode_body(KV_DEC_PARAMS) {
  using namespace kv_dec;
  typedef KvDecCfg<N, G, KB, VB, PSPLIT, STAGES, PSUB> C;
  constexpr int TT = C::TT, CBK = C::CBK, CBV = C::CBV, NB = C::NB, NCH = C::NCH, NMT = C::NMT,
                MPB = C::MPB, SEGL = C::SEGL, PG = C::PG;
  static_assert(N == 64 || N == 128 || N == 256, "N");
  static_assert(G == 16 || G == 32 || G == 64, "G");
  static_assert(N % G == 0, "G | N");
  static_assert(KB == 3 || KB == 4, "KB");
  static_assert(VB == 3 || VB == 4, "VB");
  static_assert(VIL == 0 || (VB == 3 && G == 64), "vpair value layout: 3-bit values, 64-lane scale blocks");

  extern __shared__ __align__(16) kv_u8 smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  // grid (B * KVH * HT, S): the (batch, head tile) index in x has no 65535 limit
  const int split = blockIdx.y;
  const int pair = blockIdx.x;
  const int b = pair / (KVH * HT), hh = pair - b * (KVH * HT);
  const int kvh = hh / HT, ht = hh - kvh * HT;
  const int h0 = kvh * group + ht * 8;
  const int nh = min(8, group - ht * 8);
  const int total = max(lengths[b], 0);
  const int nsink = min(total, sinks);
  const int len = (int)min((long long)(total - nsink), cap);  // packed tokens; never read past the planes
  const int tbeg = split * chunk;
  const int tend = min(len, tbeg + chunk);
  const int ntile = tend > tbeg ? (tend - tbeg + TT - 1) / TT : 0;

  float* qs = reinterpret_cast<float*>(smem + C::QS_OFF);
  float* wm = reinterpret_cast<float*>(smem + C::MISC_OFF);
  float* wl = wm + 32;
  int* wE = reinterpret_cast<int*>(wl + 32);
  float* hm = reinterpret_cast<float*>(wE + 8);
  float* hl = hm + 8;
  int* s_eq = reinterpret_cast<int*>(hl + 8);
  float* hf = reinterpret_cast<float*>(s_eq + 8);
  int* s_last = reinterpret_cast<int*>(hf + 32);
  const kv_u16* ksr = reinterpret_cast<const kv_u16*>(smem + C::SR_OFF);
  const kv_u16* vsr = ksr + C::SF * N;
  const long long pidx = ((long long)b * KVH * HT + hh) * S + split;  // this CTA's partial
  const float LOG2E = 1.4426950408889634f;

  const int nfold = sinks <= C::SF ? nsink : 0;  // sink tokens merged by the output stage
  // their q rows (rows 2 warp, 2 warp + 1; cluster merge: the merged head), loaded before the merge barriers
  float qv[2][N / 32];
  const float* qsc = q_scale ? q_scale + kvh * N : nullptr;
  const kv_u16* qb = q + ((long long)b * Hq + h0) * N;
  if (sinks > C::SF && split == S - 1) {
    // ---- the sink CTA: one more partial, in parallel with the token splits ----------------------
    const long long sb = ((long long)b * KVH + kvh) * sinks * N;
    kv_dec::sink_partial<N, SEED, HAS_SIGN, C::SINKV_OFF, C::SINKP_OFF>(
        q + ((long long)b * Hq + h0) * N, q_bf16, q_scale ? q_scale + kvh * N : nullptr, k_sink + sb, v_sink + sb,
        nsink, nh, sm_scale * LOG2E, smem, qs, CL ? qs : part_acc + pidx * 8 * N, CL ? hm : part_ml + pidx * 16,
        tid);
  } else {
  // ---- cp.async pipeline: the first STAGES-1 tiles are requested before the q setup, so their
  // latency overlaps the rotation of q (what dominates short contexts) ----------------------
  kv_u8* wbase = smem + warp * C::WREG;
  float* scf = reinterpret_cast<float*>(wbase + STAGES * C::STB + 16);  // [2][NB][8][8]
  const int ntw = ntile > warp ? (ntile - warp + 3) / 4 : 0;
  const int* bt = block_table + (long long)b * max_pages;

  const int page0 = b;  // contiguous layout (page_shift < 0): page b, the block table is not read
  // pool pages of the PSUB page slots of tile ti (block-table reads, issued one tile ahead of use)
  auto tile_pages = [&](int ti, int* pgs) {
    const int t0 = tbeg + (warp + 4 * ti) * TT;
#pragma unroll
    for (int j = 0; j < PSUB; ++j)
      pgs[j] = page_shift < 0 ? page0 : __ldg(bt + min((t0 + j * PG) >> page_shift, max_pages - 1));
  };
  auto issue = [&](int ti, int st, const int* pgs) {
    const int t0 = tbeg + (warp + 4 * ti) * TT;
    const int nv = min(TT, tend - t0);
    kv_u8* dst = wbase + st * C::STB;
    // first row of each page of this tile in the pools
    const kv_u8* gkc[PSUB];
    const kv_u8* gvc[PSUB];
    const kv_u8* gks[PSUB];
    const kv_u8* gvs[PSUB];
#pragma unroll
    for (int j = 0; j < PSUB; ++j) {
      const int t = t0 + j * PG;
      const int row = page_shift < 0 ? t : t & ((1 << page_shift) - 1);
      const long long rb = ((long long)pgs[j] * KVH + kvh) * page + row;
      gkc[j] = kc + rb * CBK;
      gvc[j] = vc + rb * CBV;
      gks[j] = ks + rb * NB;
      gvs[j] = vs + rb * NB;
    }
    kv_u8* dkc = dst;
    kv_u8* dvc = dst + TT * CBK;
    kv_u8* dks = dst + TT * (CBK + CBV);
    kv_u8* dvs = dks + TT * NB;
    if (nv == TT) {  // full tile: fixed, unrolled copies
      static_assert((TT * CBK / 16) % 32 == 0 && (TT * CBV / 16) % 32 == 0, "code chunks per lane");
#pragma unroll
      for (int k = 0; k < TT * CBK / 16 / 32; ++k) {
        const int c = lane + 32 * k;
        cp_async16(dkc + 16 * c, tile_addr<PSUB, CBK, PG>(gkc, 16 * c));
      }
#pragma unroll
      for (int k = 0; k < TT * CBV / 16 / 32; ++k) {
        const int c = lane + 32 * k;
        cp_async16(dvc + 16 * c, tile_addr<PSUB, CBV, PG>(gvc, 16 * c));
      }
      constexpr int NSC = TT * NB / 16;  // chunks per scale plane (4 NB)
#pragma unroll
      for (int c0 = 0; c0 < 2 * NSC; c0 += 32) {
        const int c = c0 + lane;
        if (c < 2 * NSC) {
          const bool isv = c >= NSC;
          const int cc = isv ? c - NSC : c;
          const kv_u8* srck = tile_addr<PSUB, NB, PG>(gks, 16 * cc);
          const kv_u8* srcv = tile_addr<PSUB, NB, PG>(gvs, 16 * cc);
          cp_async16((isv ? dvs : dks) + 16 * cc, isv ? srcv : srck);
        }
      }
      return;
    }
    // (vpair: whole token pairs, the last valid token's bytes are spread over its pair's 2 CBV bytes)
    const int nck = (nv * CBK + 15) >> 4, ncv = (((VIL ? (nv + 1) & ~1 : nv) * CBV) + 15) >> 4,
              ns = (nv * NB + 15) >> 4;
    for (int c = lane; c < nck; c += 32) cp_async16(dkc + 16 * c, tile_addr<PSUB, CBK, PG>(gkc, 16 * c));
    for (int c = lane; c < ncv; c += 32) cp_async16(dvc + 16 * c, tile_addr<PSUB, CBV, PG>(gvc, 16 * c));
    for (int c = lane; c < ns; c += 32) {
      cp_async16(dks + 16 * c, tile_addr<PSUB, NB, PG>(gks, 16 * c));
      cp_async16(dvs + 16 * c, tile_addr<PSUB, NB, PG>(gvs, 16 * c));
    }
  };

  if (nfold > 0) {  // sink rows for the output stage, in the first cp.async group
    const long long sb = ((long long)b * KVH + kvh) * sinks * N;
    for (int c = tid; c < nfold * N / 8; c += 128) {
      cp_async16(smem + C::SR_OFF + 16 * c, reinterpret_cast<const uint4*>(k_sink + sb) + c);
      cp_async16(smem + C::SR_OFF + C::SF * N * 2 + 16 * c, reinterpret_cast<const uint4*>(v_sink + sb) + c);
    }
  }
  int pf[PSUB];  // pages of the next tile to issue
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ntw) {
      tile_pages(s, pf);
      issue(s, s, pf);
    }
    cp_async_commit();
  }
  tile_pages(STAGES - 1, pf);

  // ue5m3 byte -> float table (exact; read once per scale byte in the token loop)
  float* slut = reinterpret_cast<float*>(smem + C::LUT_OFF);
  for (int i = tid; i < 256; i += 128) slut[i] = scale_f((kv_u32)i);

  // ---- q~ = H D (q * q_scale): warp w rotates rows 2w, 2w+1 in registers, one barrier -------------
  // head h: exponent eq[h] so that max|q~| 2^(10-eq) < 2^15
  // both rows (and q_scale) are requested before the first use: one global round trip, not two
  kv_u32 qbits[2][N / 32];
  float qsf[N / 32];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int k = 0; k < N / 32; ++k)
      qbits[r][k] = __ldg(q + ((long long)b * Hq + h0 + min(2 * warp + r, nh - 1)) * N + lane + 32 * k);
#pragma unroll
  for (int k = 0; k < N / 32; ++k) qsf[k] = q_scale ? __ldg(q_scale + kvh * N + lane + 32 * k) : 1.0f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = 2 * warp + r;
    float v[N / 32];
#pragma unroll
    for (int k = 0; k < N / 32; ++k) {
      float x = 0.0f;
      if (h < nh) {
        x = q_bf16 ? __int_as_float(qbits[r][k] << 16) : h2f(qbits[r][k]);
        if (q_scale) x *= qsf[k];
      }
      v[k] = lane_sign<SEED, HAS_SIGN>(k, lane) ? -x : x;
    }
    fwht_warp<N>(v, lane);
    float mx = 0.0f;
#pragma unroll
    for (int k = 0; k < N / 32; ++k) {
      qs[h * N + lane + 32 * k] = v[k];
      mx = fmaxf(mx, fabsf(v[k]));
    }
    mx = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(mx)));  // mx >= 0
    if (lane == 0) s_eq[h] = mx > 0.0f ? max(-100, min(120, (((__float_as_int(mx) >> 23) & 0xFF) - 126) - 5)) : 0;
  }
  __syncthreads();

  // ---- per-thread constant fragments -----------------------------------------------------------
  const int eqg = s_eq[g];
  kv_u32 qh[NCH][2], ql[NCH][2];
  float zp[NB];
#pragma unroll
  for (int bb = 0; bb < NB; ++bb) zp[bb] = 0.0f;
  kv_u32 selE[2], selO[2], mA[2], mB[2];
  constexpr int KT = 1 << (KB - 1), KFM = (1 << KB) - 1;
  constexpr bool KSEG = KB == 3 && G == 64;  // per-thread K segments (kseg_* above)
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    int jl = KB == 3 ? kpairs3[tig][p][0] : kpairs4[tig][p][0];
    int jh = KB == 3 ? kpairs3[tig][p][1] : kpairs4[tig][p][1];
    int bl = (KB * jl) >> 3, ol = (KB * jl) & 7, bh = (KB * jh) >> 3, oh = (KB * jh) & 7;
    selE[p] = bl | (min(bl + 1, 7) << 4) | (bh << 8) | (min(bh + 1, 7) << 12);
    selO[p] = (bl + 2) | (min(bl + 3, 7) << 4) | ((bh + 2) << 8) | (min(bh + 3, 7) << 12);
    mA[p] = ((kv_u32)KFM << ol) | ((kv_u32)KFM << (16 + oh));
    mB[p] = ((kv_u32)KT << ol) | ((kv_u32)KT << (16 + oh)) | 0x3C003C00u;  // exponent of 1.0
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      // lanes and bit offsets of this thread's pair p in chunk c
      int ll = 16 * c + jl, lh = 16 * c + jh;
      if (KSEG) {
        const int h = 2 * (c % 4) + p, sb = 64 * (c / 4) + 16 * tig;
        ll = sb + kseg_jl(h); lh = sb + kseg_jh(h); ol = kseg_ol(h); oh = kseg_oh(h);
      }
      float vlo = qs[g * N + ll] * exp2i(10 - ol - eqg);
      float vhi = qs[g * N + lh] * exp2i(10 - oh - eqg);
      kv_u32 hlo = f2h(vlo), hhi = f2h(vhi);
      float rlo = vlo - h2f(hlo), rhi = vhi - h2f(hhi);
      kv_u32 llo = f2h(rlo), lhi = f2h(rhi);
      qh[c][p] = hlo | (hhi << 16);
      ql[c][p] = llo | (lhi << 16);
      // constant part of the K operand: 1 + T * 2^(o-10) (exactly the fp16 values the tensor cores
      // will see); mid-rise removes only 1 + (T - 1/2) * 2^(o-10), leaving (c + 1/2) 2^(o-10)
      constexpr float KOFF = MR ? (float)KT - 0.5f : (float)KT;
      zp[(16 * c) / G] += (h2f(hlo) + (QLO ? h2f(llo) : 0.0f)) * (1.0f + KOFF * exp2i(ol - 10)) +
                          (h2f(hhi) + (QLO ? h2f(lhi) : 0.0f)) * (1.0f + KOFF * exp2i(oh - 10));
    }
  }
  float z0[NB], z1[NB];
#pragma unroll
  for (int bb = 0; bb < NB; ++bb) {
    zp[bb] += __shfl_xor_sync(0xffffffffu, zp[bb], 1);
    zp[bb] += __shfl_xor_sync(0xffffffffu, zp[bb], 2);
    z0[bb] = -__shfl_sync(0xffffffffu, zp[bb], 8 * tig);      // -Z of head 2tig
    z1[bb] = -__shfl_sync(0xffffffffu, zp[bb], 8 * tig + 4);  // -Z of head 2tig+1
  }
  const int eq0 = __shfl_sync(0xffffffffu, eqg, 8 * tig), eq1 = __shfl_sync(0xffffffffu, eqg, 8 * tig + 4);
  const float kap0 = sm_scale * LOG2E * exp2i(eq0) / (float)N;
  const float kap1 = sm_scale * LOG2E * exp2i(eq1) / (float)N;
  // V segment of this thread in block bb: lanes [bb*G + g*SEGL, +SEGL), bit offset VB*lane
  int vwi[NB], vsh[NB];
#pragma unroll
  for (int bb = 0; bb < NB; ++bb) {
    int boff = VB * (bb * G + g * SEGL);
    vwi[bb] = boff >> 5;
    vsh[bb] = boff & 31;
  }

  // vpair value layout (VIL): thread g's lanes 64 bb + 8 g .. + 7 are half (g & 1) of 16-lane group 4 bb + g / 2,
  // whose units are words 3 j .. 3 j + 2 of a token pair: its own unit (H0 even g, H2 odd g) and the shared H1
  const int vdw = 3 * (g >> 1) + 2 * (g & 1), vsw = 3 * (g >> 1) + 1;
  const kv_u32 vsel = (g & 1) ? 0x7351u : 0x6341u;  // (own, H1) -> segment bits 8..23 of both tokens
  kv_u32 ksel[3];  // KSEG: this thread's PRMT selectors
#pragma unroll
  for (int w = 0; w < 3; ++w) ksel[w] = kseg_sel(w, tig);

  // ---- token loop (per warp) ---------------------------------------------------------------
  float acc[NMT][4];
#pragma unroll
  for (int i = 0; i < NMT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  float m0 = KV_NEG_INF, m1 = KV_NEG_INF, l0 = 0.0f, l1 = 0.0f;
  int Erun = -1000;

  for (int it = 0; it < ntw; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncwarp();
    {
      int nx = it + STAGES - 1;
      if (nx < ntw) {
        issue(nx, nx % STAGES, pf);
        tile_pages(nx + 1, pf);  // used next iteration: the load latency overlaps this tile
      }
      cp_async_commit();
    }
    const kv_u8* st = wbase + (it % STAGES) * C::STB;
    const kv_u8* sKC = st;
    const kv_u8* sVC = st + TT * CBK;
    const kv_u8* sKS = st + TT * (CBK + CBV);
    const kv_u8* sVS = sKS + TT * NB;
    const int nv = min(TT, tend - (tbeg + (warp + 4 * it) * TT));
    // the tile body, compiled twice: full tiles (no token masks: ~36 selects and compares fewer per tile) and
    // the partial last tile of a range
    auto tile = [&](auto full_tag) {
      constexpr bool FULL = decltype(full_tag)::value;

      // scales of this tile -> floats [kv][bb][t % 8][t / 8]; invalid tokens -> 0
      float vmax = 0.0f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int t = 2 * lane + r;
        const bool ok = FULL || t < nv;
#pragma unroll
        for (int bb = 0; bb < NB; ++bb) {
          // bytes read unconditionally (inside the stage buffer), table lookup, then select
          const float lk = slut[sKS[t * NB + bb]], lv = slut[sVS[t * NB + bb]];
          const float fk = ok ? lk : 0.0f;
          const float fv = ok ? lv : 0.0f;
          scf[((0 * NB + bb) * 8 + (t & 7)) * 8 + (t >> 3)] = fk;
          scf[((1 * NB + bb) * 8 + (t & 7)) * 8 + (t >> 3)] = fv;
          vmax = fmaxf(vmax, fv);
        }
      }
      vmax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(vmax)));  // vmax >= 0
      __syncwarp();
      // >= -16: a tile whose V scales are all 0 (ue5m3's smallest nonzero scale is 2^-9) keeps p 2^-E and their
      // sums (<= 2^22) finite
      const int Et = max(((__float_as_int(vmax) >> 23) & 0xFF) - 127, -16);
      const int Enew = max(Erun, Et);
      const float escale = Erun == -1000 ? 1.0f : exp2i(Erun - Enew);
      Erun = Enew;

      // ---- logits: S^T = Kcodes . q~' per scale block, times K scale ----------------------------
      float lg[4][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const int ta = 16 * mt + g;
        float cs[NB][4], cl[NB][4];  // hi and lo parts: two shorter mma dependency chains
#pragma unroll
        for (int bb = 0; bb < NB; ++bb) {
          cs[bb][0] = z0[bb]; cs[bb][1] = z1[bb]; cs[bb][2] = z0[bb]; cs[bb][3] = z1[bb];  // -Z
          cl[bb][0] = cl[bb][1] = cl[bb][2] = cl[bb][3] = 0.0f;
        }
        if constexpr (KSEG) {
          const kv_u32* ka = reinterpret_cast<const kv_u32*>(sKC + ta * CBK) + kseg_word(tig);
          const kv_u32* kb8 = reinterpret_cast<const kv_u32*>(sKC + (ta + 8) * CBK) + kseg_word(tig);
#pragma unroll
          for (int bb = 0; bb < (ABL == 2 ? 0 : NB); ++bb) {
            kv_u32 fa[8], fb[8];  // half2 h of rows ta, ta + 8
            const kv_u32 xa = ka[6 * bb], ya = ka[6 * bb + 1], xb = kb8[6 * bb], yb = kb8[6 * bb + 1];
            kv_u32 ua[3], ub[3];
#pragma unroll
            for (int w = 0; w < 3; ++w) {
              ua[w] = __byte_perm(xa, ya, ksel[w]);
              ub[w] = __byte_perm(xb, yb, ksel[w]);
            }
#pragma unroll
            for (int h = 0; h < 8; ++h) {
              const int w = h < 3 ? 0 : h < 6 ? 1 : 2;
              const kv_u32 am = ((kv_u32)KFM << kseg_ol(h)) | ((kv_u32)KFM << (16 + kseg_oh(h)));
              const kv_u32 bm = ((kv_u32)KT << kseg_ol(h)) | ((kv_u32)KT << (16 + kseg_oh(h))) | 0x3C003C00u;
              fa[h] = lop_field(ua[w], am, bm);
              fb[h] = lop_field(ub[w], am, bm);
            }
#pragma unroll
            for (int cb = 0; cb < 4; ++cb) {
              const int c = 4 * bb + cb;
              mma16816(cs[bb], fa[2 * cb], fb[2 * cb], fa[2 * cb + 1], fb[2 * cb + 1], qh[c][0], qh[c][1]);
              if (QLO) mma16816(cl[bb], fa[2 * cb], fb[2 * cb], fa[2 * cb + 1], fb[2 * cb + 1], ql[c][0], ql[c][1]);
            }
          }
        } else {
          kv_u32 RA[CBK / 4 + 1], RB[CBK / 4 + 1];
          RA[CBK / 4] = RB[CBK / 4] = 0u;
          if (CBK % 16 == 0) {
#pragma unroll
            for (int k = 0; k < CBK / 16; ++k) {
              uint4 va = *reinterpret_cast<const uint4*>(sKC + ta * CBK + 16 * k);
              uint4 vb = *reinterpret_cast<const uint4*>(sKC + (ta + 8) * CBK + 16 * k);
              RA[4 * k] = va.x; RA[4 * k + 1] = va.y; RA[4 * k + 2] = va.z; RA[4 * k + 3] = va.w;
              RB[4 * k] = vb.x; RB[4 * k + 1] = vb.y; RB[4 * k + 2] = vb.z; RB[4 * k + 3] = vb.w;
            }
          } else {
#pragma unroll
            for (int k = 0; k < CBK / 8; ++k) {
              uint2 va = *reinterpret_cast<const uint2*>(sKC + ta * CBK + 8 * k);
              uint2 vb = *reinterpret_cast<const uint2*>(sKC + (ta + 8) * CBK + 8 * k);
              RA[2 * k] = va.x; RA[2 * k + 1] = va.y;
              RB[2 * k] = vb.x; RB[2 * k + 1] = vb.y;
            }
          }
#pragma unroll
          for (int c = 0; c < (ABL == 2 ? 0 : NCH); ++c) {
            // chunk c = key bits [16 KB c, 16 KB (c+1)): 3-bit chunks start at byte 0 (even c) or 2 (odd c)
            // of word (3c)/2 resp. (3c-1)/2; 4-bit chunks are words 2c, 2c+1
            const int wl0 = KB == 4 ? 2 * c : ((c & 1) ? (3 * c - 1) / 2 : (3 * c) / 2);
            const kv_u32 sa = (KB == 3 && (c & 1)) ? selO[0] : selE[0];
            const kv_u32 sb = (KB == 3 && (c & 1)) ? selO[1] : selE[1];
            kv_u32 a0 = lop_field(__byte_perm(RA[wl0], RA[wl0 + 1], sa), mA[0], mB[0]);
            kv_u32 a1 = lop_field(__byte_perm(RB[wl0], RB[wl0 + 1], sa), mA[0], mB[0]);
            kv_u32 a2 = lop_field(__byte_perm(RA[wl0], RA[wl0 + 1], sb), mA[1], mB[1]);
            kv_u32 a3 = lop_field(__byte_perm(RB[wl0], RB[wl0 + 1], sb), mA[1], mB[1]);
            const int bb = (16 * c) / G;
            mma16816(cs[bb], a0, a1, a2, a3, qh[c][0], qh[c][1]);
            if (QLO) mma16816(cl[bb], a0, a1, a2, a3, ql[c][0], ql[c][1]);
          }
        }
#pragma unroll
        for (int bb = 0; bb < NB; ++bb)
#pragma unroll
          for (int r = 0; r < 4; ++r) cs[bb][r] += cl[bb][r];
        float x0 = 0.0f, x1 = 0.0f, x2 = 0.0f, x3 = 0.0f;
#pragma unroll
        for (int bb = 0; bb < NB; ++bb) {
          float2 skk = *reinterpret_cast<const float2*>(scf + ((0 * NB + bb) * 8 + g) * 8 + 2 * mt);
          x0 += cs[bb][0] * skk.x; x1 += cs[bb][1] * skk.x;
          x2 += cs[bb][2] * skk.y; x3 += cs[bb][3] * skk.y;
        }
        const bool oka = FULL || ta < nv, okb = FULL || ta + 8 < nv;
        lg[mt][0] = oka ? x0 * kap0 : KV_NEG_INF;
        lg[mt][1] = oka ? x1 * kap1 : KV_NEG_INF;
        lg[mt][2] = okb ? x2 * kap0 : KV_NEG_INF;
        lg[mt][3] = okb ? x3 * kap1 : KV_NEG_INF;
      }

      // ---- online softmax (log2 domain) ---------------------------------------------------------
      float t0m = KV_NEG_INF, t1m = KV_NEG_INF;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        t0m = fmaxf(t0m, fmaxf(lg[mt][0], lg[mt][2]));
        t1m = fmaxf(t1m, fmaxf(lg[mt][1], lg[mt][3]));
      }
#pragma unroll
      for (int o = 4; o <= 16; o <<= 1) {
        t0m = fmaxf(t0m, __shfl_xor_sync(0xffffffffu, t0m, o));
        t1m = fmaxf(t1m, __shfl_xor_sync(0xffffffffu, t1m, o));
      }
      const float mn0 = fmaxf(m0, t0m), mn1 = fmaxf(m1, t1m);
      const float al0 = ex2(m0 - mn0), al1 = ex2(m1 - mn1);
      m0 = mn0; m1 = mn1;
      // weights p 2^-E (E: running V-scale exponent) straight from the exponent: the PV operand p v_scale 2^-E
      // needs no per-scale multiply; the sums l get 2^E back (exact: a power of two)
      const float me0 = mn0 + (float)Enew, me1 = mn1 + (float)Enew;
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        lg[mt][0] = ex2(lg[mt][0] - me0); lg[mt][2] = ex2(lg[mt][2] - me0);
        lg[mt][1] = ex2(lg[mt][1] - me1); lg[mt][3] = ex2(lg[mt][3] - me1);
        s0 += lg[mt][0] + lg[mt][2];
        s1 += lg[mt][1] + lg[mt][3];
      }
      const float pe = exp2i(Enew);
      l0 = fmaf(s0, pe, l0 * al0);
      l1 = fmaf(s1, pe, l1 * al1);
      const float f0 = al0 * escale, f1 = al1 * escale;
      if (__any_sync(0xffffffffu, f0 != 1.0f || f1 != 1.0f)) {  // rare once the maxima settle
#pragma unroll
        for (int i = 0; i < NMT; ++i) {
          acc[i][0] *= f0; acc[i][1] *= f1; acc[i][2] *= f0; acc[i][3] *= f1;
        }
      }

      // ---- O^T += Vcodes^T . P'^T ------------------------------------------------------------
#pragma unroll
      for (int mt = 0; mt < (ABL == 1 ? 0 : 4); ++mt) {
        kv_u32 B0[NB], B1[NB], B0l[NB], B1l[NB];
#pragma unroll
        for (int bb = 0; bb < NB; ++bb) {
          float2 svv = *reinterpret_cast<const float2*>(scf + ((1 * NB + bb) * 8 + g) * 8 + 2 * mt);
          const float sa = svv.x, sb = svv.y;
          const float p00 = lg[mt][0] * sa, p01 = lg[mt][1] * sa, p10 = lg[mt][2] * sb, p11 = lg[mt][3] * sb;
          const kv_u32 x0 = pack_h2(p00, p01), x1 = pack_h2(p10, p11);
          B0[bb] = movtrans(x0);
          B1[bb] = movtrans(x1);
          if (PSPLIT) {
            const kv_u32 y0 = pack_h2(p00 - h2f(x0 & 0xFFFFu), p01 - h2f(x0 >> 16));
            const kv_u32 y1 = pack_h2(p10 - h2f(x1 & 0xFFFFu), p11 - h2f(x1 >> 16));
            B0l[bb] = movtrans(y0);
            B1l[bb] = movtrans(y1);
          }
        }
        if constexpr (VIL) {
          // pairs P = 8 mt + tig (tokens 16 mt + 2 tig, + 1) and Q = P + 4 (+ 8, + 9): per block, word d holds segment
          // bits 0..15 of both tokens (lanes 0, 1, 2 at 0, 3, 6), w = PRMT(d, H1) bits 8..23 (lanes 3, 4, 5 at 1, 4, 7),
          // w >> 8 lanes 6, 7 at 2, 5; item i = lane 8 g + i feeds row g (even i) / g + 8 (odd i) of m-tile i / 2
          const kv_u32* pd = reinterpret_cast<const kv_u32*>(sVC + (16 * mt + 2 * tig) * CBV);
#pragma unroll
          for (int bb = 0; bb < NB; ++bb) {
            constexpr int WQ = 2 * CBV;  // words from pair P to pair Q (8 rows)
            const kv_u32 dP = pd[12 * bb + vdw], hP = pd[12 * bb + vsw];
            const kv_u32 dQ = pd[WQ + 12 * bb + vdw], hQ = pd[WQ + 12 * bb + vsw];
            const kv_u32 wP = __byte_perm(dP, hP, vsel), wQ = __byte_perm(dQ, hQ, vsel);
            const kv_u32 zP = wP >> 8, zQ = wQ >> 8;
            mma16816(acc[bb * 4 + 0], vfin<0, MR>(dP), vfin<3, MR>(dP), vfin<0, MR>(dQ), vfin<3, MR>(dQ), B0[bb], B1[bb]);
            mma16816(acc[bb * 4 + 1], vfin<6, MR>(dP), vfin<1, MR>(wP), vfin<6, MR>(dQ), vfin<1, MR>(wQ), B0[bb], B1[bb]);
            mma16816(acc[bb * 4 + 2], vfin<4, MR>(wP), vfin<7, MR>(wP), vfin<4, MR>(wQ), vfin<7, MR>(wQ), B0[bb], B1[bb]);
            mma16816(acc[bb * 4 + 3], vfin<2, MR>(zP), vfin<5, MR>(zP), vfin<2, MR>(zQ), vfin<5, MR>(zQ), B0[bb], B1[bb]);
            if (PSPLIT) {
              mma16816(acc[bb * 4 + 0], vfin<0, MR>(dP), vfin<3, MR>(dP), vfin<0, MR>(dQ), vfin<3, MR>(dQ), B0l[bb], B1l[bb]);
              mma16816(acc[bb * 4 + 1], vfin<6, MR>(dP), vfin<1, MR>(wP), vfin<6, MR>(dQ), vfin<1, MR>(wQ), B0l[bb], B1l[bb]);
              mma16816(acc[bb * 4 + 2], vfin<4, MR>(wP), vfin<7, MR>(wP), vfin<4, MR>(wQ), vfin<7, MR>(wQ), B0l[bb], B1l[bb]);
              mma16816(acc[bb * 4 + 3], vfin<2, MR>(zP), vfin<5, MR>(zP), vfin<2, MR>(zQ), vfin<5, MR>(zQ), B0l[bb], B1l[bb]);
            }
          }
          continue;
        }
        const int tv = 16 * mt + 2 * tig;
        const kv_u8* r0 = sVC + tv * CBV;
        const kv_u8* r1 = r0 + CBV;
        const kv_u8* r2 = r0 + 8 * CBV;
        const kv_u8* r3 = r0 + 9 * CBV;
#pragma unroll
        for (int bb = 0; bb < NB; ++bb) {
          const kv_u32* w0 = reinterpret_cast<const kv_u32*>(r0) + vwi[bb];
          const kv_u32* w1 = reinterpret_cast<const kv_u32*>(r1) + vwi[bb];
          const kv_u32* w2 = reinterpret_cast<const kv_u32*>(r2) + vwi[bb];
          const kv_u32* w3 = reinterpret_cast<const kv_u32*>(r3) + vwi[bb];
          kv_u32 s0v, s1v, s2v, s3v;
          if (VB == 4 && SEGL * 4 <= 32 && (4 * SEGL) % 32 == 0) {  // segment = one aligned word
            s0v = w0[0]; s1v = w1[0]; s2v = w2[0]; s3v = w3[0];
          } else {
            s0v = __funnelshift_r(w0[0], w0[1], vsh[bb]);
            s1v = __funnelshift_r(w1[0], w1[1], vsh[bb]);
            s2v = __funnelshift_r(w2[0], w2[1], vsh[bb]);
            s3v = __funnelshift_r(w3[0], w3[1], vsh[bb]);
          }
#pragma unroll
          for (int ip = 0; ip < MPB; ++ip) {
            kv_u32 a0, a1, a2, a3;
            switch (ip) {  // J must be a compile-time constant
              case 0: a0 = vext<0, MR, VB>(s0v, s1v); a1 = vext<1, MR, VB>(s0v, s1v); a2 = vext<0, MR, VB>(s2v, s3v); a3 = vext<1, MR, VB>(s2v, s3v); break;
              case 1: a0 = vext<2, MR, VB>(s0v, s1v); a1 = vext<3, MR, VB>(s0v, s1v); a2 = vext<2, MR, VB>(s2v, s3v); a3 = vext<3, MR, VB>(s2v, s3v); break;
              case 2: a0 = vext<4, MR, VB>(s0v, s1v); a1 = vext<5, MR, VB>(s0v, s1v); a2 = vext<4, MR, VB>(s2v, s3v); a3 = vext<5, MR, VB>(s2v, s3v); break;
              default: a0 = vext<6, MR, VB>(s0v, s1v); a1 = vext<7, MR, VB>(s0v, s1v); a2 = vext<6, MR, VB>(s2v, s3v); a3 = vext<7, MR, VB>(s2v, s3v); break;
            }
            mma16816(acc[bb * MPB + ip], a0, a1, a2, a3, B0[bb], B1[bb]);
            if (PSPLIT) mma16816(acc[bb * MPB + ip], a0, a1, a2, a3, B0l[bb], B1l[bb]);
          }
        }
      }
    };
    if (nv == TT)
      tile(kv_dec::kv_bool<true>{});
    else
      tile(kv_dec::kv_bool<false>{});
    __syncwarp();  // this stage is refilled by a later iteration
  }
  cp_async_wait<0>();
  __syncwarp();
  if (!CL && nfold > 0)
#pragma unroll
    for (int r = 0; r < 2; ++r) load_q_row<N>(qv[r], qb + min(2 * warp + r, nh - 1) * N, qsc, q_bf16, lane);

  // ---- merge the 4 warps (shared memory) --------------------------------------------------------
#pragma unroll
  for (int o = 4; o <= 16; o <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
  }
  float* wacc = reinterpret_cast<float*>(wbase);  // [8][N], this warp's region
#pragma unroll
  for (int i = 0; i < NMT; ++i) {
    const int bb = i / MPB, ip = i % MPB;
    const int L0 = bb * G + g * SEGL + 2 * ip;
    wacc[(2 * tig) * N + L0] = acc[i][0];
    wacc[(2 * tig + 1) * N + L0] = acc[i][1];
    wacc[(2 * tig) * N + L0 + 1] = acc[i][2];
    wacc[(2 * tig + 1) * N + L0 + 1] = acc[i][3];
  }
  if (g == 0) {
    wm[warp * 8 + 2 * tig] = m0; wm[warp * 8 + 2 * tig + 1] = m1;
    wl[warp * 8 + 2 * tig] = l0; wl[warp * 8 + 2 * tig + 1] = l1;
  }
  if (lane == 0) wE[warp] = Erun;
  __syncthreads();
  if (tid < 32) {  // factor of warp w for head h (2^(m_w - M) 2^E_w) and the head's sum l
    const int w = tid >> 3, h = tid & 7;
    float M = KV_NEG_INF;
#pragma unroll
    for (int x = 0; x < 4; ++x) M = fmaxf(M, wm[x * 8 + h]);
    const float mw = wm[tid];
    const float f = mw > KV_NEG_INF ? ex2(mw - M) : 0.0f;
    hf[tid] = mw > KV_NEG_INF ? f * exp2i(wE[w]) : 0.0f;
    float L = f * wl[tid];
    L += __shfl_xor_sync(0xffffffffu, L, 8);
    L += __shfl_xor_sync(0xffffffffu, L, 16);
    if (tid < 8) {
      hm[h] = M;
      hl[h] = L;
    }
  }
  __syncthreads();
  {
    constexpr int EPT = 8 * N / 128;  // elements per thread
#pragma unroll
    for (int k = 0; k < EPT; ++k) {
      const int e = tid + 128 * k, h = e / N;
      float a = 0.0f;
#pragma unroll
      for (int w = 0; w < 4; ++w) a += hf[w * 8 + h] * reinterpret_cast<const float*>(smem + w * C::WREG)[e];
      if (S == 1) {  // the only partial (no sinks): normalise here, no workspace round trip
        const float M = hm[h], L = hl[h];
        qs[e] = (M > KV_NEG_INF && L > 0.0f) ? a * (1.0f / L) : 0.0f;
      } else if (CL) {
        qs[e] = a;  // the partial stays in shared memory (hm, hl: its m, l)
      } else {
        part_acc[pidx * 8 * N + e] = a;
      }
    }
    if (!CL && S > 1 && tid < 8) {
      part_ml[pidx * 16 + tid] = hm[tid];
      part_ml[pidx * 16 + 8 + tid] = hl[tid];
    }
  }
  }  // token CTA

  if constexpr (CL > 0) {
    // ---- cluster merge: CTA rank r merges heads r*HPC .. (r+1)*HPC-1 of all CL partials, one warp per head,
    // reading the other CTAs' qs / hm / hl through distributed shared memory ------------------------------
    constexpr int HPC = 8 / CL;
    static_assert(CL == 2 || CL == 4 || CL == 8, "CL");
    if (nfold > 0 && warp < HPC) load_q_row<N>(qv[0], qb + min(cluster_rank() * HPC + warp, nh - 1) * N, qsc, q_bf16, lane);
    cluster_sync();  // every partial complete and visible in the cluster
    if (warp < HPC) {
      const int h = cluster_rank() * HPC + warp;
      float ms[CL], ls[CL], wt[CL];
#pragma unroll
      for (int r = 0; r < CL; ++r) {
        ms[r] = ld_cluster(hm + h, r);
        ls[r] = ld_cluster(hl + h, r);
      }
      float v[CL][N / 32];
#pragma unroll
      for (int r = 0; r < CL; ++r)
#pragma unroll
        for (int k = 0; k < N / 32; ++k) v[r][k] = ld_cluster(qs + h * N + lane + 32 * k, r);
      float M = KV_NEG_INF;
#pragma unroll
      for (int r = 0; r < CL; ++r) M = fmaxf(M, ms[r]);
      float L = 0.0f;
      if (M > KV_NEG_INF)
#pragma unroll
        for (int r = 0; r < CL; ++r)
          if (ms[r] > KV_NEG_INF) L += ex2(ms[r] - M) * ls[r];
#pragma unroll
      for (int r = 0; r < CL; ++r)  // weights as the workspace merge computes them (same rounding)
        wt[r] = (M > KV_NEG_INF && L > 0.0f && ms[r] > KV_NEG_INF) ? ex2(ms[r] - M) / L : 0.0f;
      float o[N / 32];
#pragma unroll
      for (int k = 0; k < N / 32; ++k) {
        o[k] = 0.0f;
#pragma unroll
        for (int r = 0; r < CL; ++r) o[k] += wt[r] * v[r][k];
      }
      store_out_row<N, SEED, HAS_SIGN, C::SF>(o, out, out_kind, ((long long)b * Hq + h0 + h) * N, h < nh, lane, M,
                                              L, nfold, qv[0], ksr, vsr, q_bf16, sm_scale * LOG2E);
    }
    cluster_sync();  // no CTA leaves while another reads its shared memory
    return;
  }

  if (S > 1) {
    __threadfence();
    __syncthreads();
    if (tid == 0) {
      const int prev = atomicAdd(&counters[(long long)b * KVH * HT + hh], 1);
      *s_last = prev == S - 1;
    }
    __syncthreads();
    if (!*s_last) return;
    __threadfence();

    // ---- last CTA: merge the splits ----------------------------------------------------------------
    // the partial rows of the first U splits are requested first (they do not depend on the weights), then
    // (m, l) of all splits -> shared (warp region 0 is free now), per-head max and sum, per-split weights:
    // one L2 round trip for S <= U
    const long long pbase = ((long long)b * KVH * HT + hh) * S;
    constexpr int EPT = 8 * N / 128;  // elements per thread
    constexpr int U = 128 / EPT;      // splits whose rows are in flight together (128 floats per thread)
    float v[U][EPT];
    auto load_rows = [&](int s0) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const float* src = part_acc + (pbase + min(s0 + u, S - 1)) * 8 * N;
#pragma unroll
        for (int k = 0; k < EPT; ++k) v[u][k] = __ldcg(src + tid + 128 * k);
      }
    };
    load_rows(0);
    float* sml = reinterpret_cast<float*>(smem);  // [S][16], S * 64 B <= WREG (checked on the host)
    for (int i0 = 0; i0 < S * 16; i0 += 512) {
      float t[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = i0 + tid + 128 * j;
        t[j] = i < S * 16 ? __ldcg(part_ml + pbase * 16 + i) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (i0 + tid + 128 * j < S * 16) sml[i0 + tid + 128 * j] = t[j];
    }
    __syncthreads();
    if (tid < 8) {
      float M = KV_NEG_INF;
#pragma unroll 4
      for (int s = 0; s < S; ++s) M = fmaxf(M, sml[s * 16 + tid]);
      float L = 0.0f;
      if (M > KV_NEG_INF)
#pragma unroll 4
        for (int s = 0; s < S; ++s) {
          const float ms = sml[s * 16 + tid];
          if (ms > KV_NEG_INF) L += ex2(ms - M) * sml[s * 16 + 8 + tid];
        }
      hm[tid] = M;
      hl[tid] = L;
    }
    __syncthreads();
    for (int i = tid; i < S * 8; i += 128) {  // weight of split s for head h, 1/L folded in
      const int s = i >> 3, h = i & 7;
      const float M = hm[h], L = hl[h], ms = sml[s * 16 + h];
      sml[s * 16 + 8 + h] = (M > KV_NEG_INF && L > 0.0f && ms > KV_NEG_INF) ? ex2(ms - M) / L : 0.0f;
    }
    __syncthreads();
    float a[EPT];
#pragma unroll
    for (int k = 0; k < EPT; ++k) a[k] = 0.0f;
    for (int s0 = 0; s0 < S; s0 += U) {
      if (s0 > 0) load_rows(s0);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (s0 + u < S) {
#pragma unroll
          for (int k = 0; k < EPT; ++k) a[k] += sml[(s0 + u) * 16 + 8 + (tid + 128 * k) / N] * v[u][k];
        }
    }
#pragma unroll
    for (int k = 0; k < EPT; ++k) qs[tid + 128 * k] = a[k];
  }
  __syncthreads();

  // ---- rotate back (D H / N, warp w: rows 2w, 2w+1 in registers) and write ------------------------
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = 2 * warp + r;
    float v[N / 32];
#pragma unroll
    for (int k = 0; k < N / 32; ++k) v[k] = qs[h * N + lane + 32 * k];
    store_out_row<N, SEED, HAS_SIGN, C::SF>(v, out, out_kind, ((long long)b * Hq + h0 + h) * N, h < nh, lane, hm[h],
                                            hl[h], nfold, qv[r], ksr, vsr, q_bf16, sm_scale * LOG2E);
  }
  if (S > 1 && tid == 0) counters[(long long)b * KVH * HT + hh] = 0;
}

template <int N, int G, int KB, int VB, int PSPLIT, int STAGES, kv_u64 SEED, int HAS_SIGN, int MINB = 2,
          int QLO = 1, int ABL = 0, int MR = 0, int PSUB = 1, int VIL = 0>
__global__ void __launch_bounds__(128, MINB) kv_decode_attn(const KvDecParams p) {
  kv_decode_body<N, G, KB, VB, PSPLIT, STAGES, SEED, HAS_SIGN, MINB, QLO, ABL, MR, PSUB, VIL, 0>(KV_DEC_ARGS);
}

// The same kernel with the CTAs of one (batch, head tile) as one cluster of CL (grid y = CL partials).
template <int N, int G, int KB, int VB, int PSPLIT, int STAGES, kv_u64 SEED, int HAS_SIGN, int MINB, int QLO,
          int ABL, int MR, int PSUB, int VIL, int CL>
__global__ void __launch_bounds__(128, MINB) __cluster_dims__(1, CL, 1) kv_decode_attn_cl(const KvDecParams p) {
  kv_decode_body<N, G, KB, VB, PSPLIT, STAGES, SEED, HAS_SIGN, MINB, QLO, ABL, MR, PSUB, VIL, CL>(KV_DEC_ARGS);
}

#ifndef KV_NVRTC
#define KV_DEC_SIG (const KvDecParams)
#define KV_DEC_INSTQ(N_, G_, KB_, VB_, P_, S_, QLO_, MR_, PS_) \
  template __global__ void kv_decode_attn<N_, G_, KB_, VB_, P_, S_, 0ull, 1, 2, QLO_, 0, MR_, PS_> KV_DEC_SIG;
#define KV_DEC_INST(N_, G_, KB_, VB_, P_, S_, MR_, PS_) KV_DEC_INSTQ(N_, G_, KB_, VB_, P_, S_, 1, MR_, PS_)
// every N and G the Python side launches, both reconstructions (MR 0: mid-tread, 1: mid-rise), q~ as two fp16
// parts (QLO 1: plans with key scales) and, for mid-rise, as one (QLO 0: the default without key scales)
#define KV_DEC_MODES(N_, G_, KB_, VB_, P_, S_) \
  KV_DEC_INST(N_, G_, KB_, VB_, P_, S_, 0, 1) KV_DEC_INST(N_, G_, KB_, VB_, P_, S_, 1, 1) \
  KV_DEC_INSTQ(N_, G_, KB_, VB_, P_, S_, 0, 1, 1)
#define KV_DEC_BITS(N_, G_, P_, S_) \
  KV_DEC_MODES(N_, G_, 3, 3, P_, S_) KV_DEC_MODES(N_, G_, 4, 3, P_, S_) KV_DEC_MODES(N_, G_, 4, 4, P_, S_)
KV_DEC_BITS(128, 64, 0, 3)
KV_DEC_BITS(128, 64, 1, 3)
KV_DEC_BITS(64, 64, 0, 4)
KV_DEC_BITS(64, 32, 0, 4)
KV_DEC_BITS(64, 16, 0, 4)
KV_DEC_BITS(256, 64, 0, 2)
KV_DEC_BITS(256, 32, 0, 2)
KV_DEC_BITS(256, 16, 0, 2)
KV_DEC_BITS(128, 32, 0, 3)
KV_DEC_BITS(128, 16, 0, 3)
// paged pools with 16- and 32-token pages (PSUB 4, 2)
KV_DEC_INST(128, 64, 3, 3, 0, 3, 1, 4)
KV_DEC_INST(128, 64, 4, 3, 0, 3, 1, 4)
KV_DEC_INST(128, 64, 3, 3, 0, 3, 0, 2)
KV_DEC_INST(64, 16, 4, 4, 0, 4, 1, 4)
KV_DEC_INST(256, 32, 4, 4, 0, 2, 1, 4)
// cluster merge (CL = 2, 4, 8) for the headline format
#define KV_DEC_CL(KB_, VB_, VIL_, CL_) \
  template __global__ void kv_decode_attn_cl<128, 64, KB_, VB_, 0, 3, 0ull, 1, 2, 1, 0, 1, 1, VIL_, CL_> KV_DEC_SIG;
KV_DEC_CL(3, 3, 0, 2) KV_DEC_CL(3, 3, 0, 4) KV_DEC_CL(3, 3, 0, 8) KV_DEC_CL(4, 3, 0, 2) KV_DEC_CL(4, 3, 0, 4) KV_DEC_CL(4, 3, 0, 8)
KV_DEC_CL(3, 3, 1, 2) KV_DEC_CL(3, 3, 1, 4) KV_DEC_CL(3, 3, 1, 8) KV_DEC_CL(4, 3, 1, 2) KV_DEC_CL(4, 3, 1, 4) KV_DEC_CL(4, 3, 1, 8)
// the vpair value layout (VIL 1; 3-bit values, G = 64), as KVCache stores it: both reconstructions, one and two
// q~ parts, the paged variants
#define KV_DEC_INSTV(N_, KB_, S_, QLO_, MR_, PS_) \
  template __global__ void kv_decode_attn<N_, 64, KB_, 3, 0, S_, 0ull, 1, 2, QLO_, 0, MR_, PS_, 1> KV_DEC_SIG;
#define KV_DEC_VPAIR(N_, S_) \
  KV_DEC_INSTV(N_, 3, S_, 1, 0, 1) KV_DEC_INSTV(N_, 3, S_, 1, 1, 1) KV_DEC_INSTV(N_, 3, S_, 0, 1, 1) \
  KV_DEC_INSTV(N_, 4, S_, 1, 0, 1) KV_DEC_INSTV(N_, 4, S_, 1, 1, 1) KV_DEC_INSTV(N_, 4, S_, 0, 1, 1)
KV_DEC_VPAIR(128, 3)
KV_DEC_VPAIR(64, 4)
KV_DEC_VPAIR(256, 2)
KV_DEC_INSTV(128, 3, 3, 1, 1, 4) KV_DEC_INSTV(128, 4, 3, 1, 1, 4) KV_DEC_INSTV(128, 3, 3, 1, 1, 2)
KV_DEC_INSTV(128, 3, 3, 0, 1, 4) KV_DEC_INSTV(128, 4, 3, 0, 1, 2)
// the 12-warp tune the planner picks for long, even splits (decode.py LONG_TUNE: MINB 3, 2 stages; one q~ part,
// mid-rise), both value orders, contiguous and paged
#define KV_DEC_LONG(KB_, PS_, VIL_) \
  template __global__ void kv_decode_attn<128, 64, KB_, 3, 0, 2, 0ull, 1, 3, 0, 0, 1, PS_, VIL_> KV_DEC_SIG;
KV_DEC_LONG(3, 1, 0) KV_DEC_LONG(4, 1, 0) KV_DEC_LONG(3, 1, 1) KV_DEC_LONG(4, 1, 1) KV_DEC_LONG(3, 4, 1)
KV_DEC_LONG(3, 2, 1) KV_DEC_LONG(4, 4, 1) KV_DEC_LONG(4, 2, 1)
#endif
