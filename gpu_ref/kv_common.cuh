// fwht-kv: definitions shared by kv_encode.cu and kv_decode_attn.cu.
// Included by both; NVRTC (CuPy RawModule) gets this folder through -I, nvcc finds it next to the
// source. Nothing here is specific to one kernel.
#pragma once

typedef unsigned long long kv_u64;
typedef unsigned int kv_u32;
typedef unsigned short kv_u16;
typedef unsigned char kv_u8;

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

// Arguments of the write kernel kv_encode, passed by value (one struct instead of a positional list).
// gpu_ref._build.ENCODE_ARGS lists the members in this order; every member is 8 bytes (a pointer or a
// long long), so the layout is the same for NVRTC, nvcc and the NumPy struct the host builds
// (_build.kernel_struct; tests/test_gpu_api.py checks the two agree).
struct KvEncodeArgs {
  const kv_u16* x;            // [nvec, N] input bit patterns (fp16 or bf16)
  kv_u8* codes;               // code plane rows of N*b/8 bytes
  kv_u8* scales;              // scale plane rows of N/G bytes
  kv_u8* flags;               // one byte per row
  const long long* out_rows;  // output row of input vector v (nullptr: row v)
  const kv_u32* key_tab;      // key front-end table (KEYF != 0), see kv_encode.cu
  long long nvec;             // input vectors
  long long key_heads;        // rows of the key table (kv heads); vector v uses row v % key_heads
  long long pair_vec;         // vpair layout (IL): vectors from one token of a row pair to the other (the kv
                              // heads of a [B, T, KVH, N] input); only a hint, the rows decide (kv_encode.cu)
};
static_assert(sizeof(KvEncodeArgs) == 72, "KvEncodeArgs: nine 8-byte members");

namespace kv_common {
// fp16 bit pattern (low 16 bits of h) -> float, exact
__device__ __forceinline__ float h2f(kv_u32 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
  return f;
}
// 2^e as float, e in [-126, 127]
__device__ __forceinline__ float exp2i(int e) { return __int_as_float((e + 127) << 23); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int K>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(K)); }
}  // namespace kv_common
