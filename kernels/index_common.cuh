/* Device helpers shared by the indexing kernels (indexing.cu, scatter_smem.cu, gather_smem.cu).
 *
 * alpha * v for the index adds (scatter_add, index_add): kernels/indexing.cu's
 * atomic kernels add scaled(v, alpha) in T, kernels/scatter_smem.cu's
 * shared-memory sums add scaled_f32(v, alpha), the same value widened to f32
 * (the rounding to T kept, so both paths add the same numbers). Floats scale
 * in f32 (f64 for f64; f32 with alpha != 1 through f64, as the CPU does),
 * integers in i64 (wrapping like the CPU). */
#pragma once
#include "common.cuh"

template <typename T> __device__ __forceinline__ T scaled(T v, double a) { return from_f32<T>(to_f32(v) * (float)a); }
template <> __device__ __forceinline__ double scaled<double>(double v, double a) { return v * a; }
template <> __device__ __forceinline__ float scaled<float>(float v, double a) { return a == 1.0 ? v : (float)((double)v * a); }
template <> __device__ __forceinline__ int32_t scaled<int32_t>(int32_t v, double a) { return (int32_t)((int64_t)v * (int64_t)a); }
template <> __device__ __forceinline__ int64_t scaled<int64_t>(int64_t v, double a) {
  return (int64_t)((uint64_t)v * (uint64_t)(int64_t)a);
}

/* scaled() of an f32, bf16 or f16 value, widened to f32 for a shared-memory sum. */
template <typename T> __device__ __forceinline__ float scaled_f32(T v, double a) { return to_f32(scaled<T>(v, a)); }

/* VEC consecutive indices from p as 16-byte loads (8 bytes when VEC * sizeof(I) is 8; p aligned to that). */
template <typename I, int VEC>
__device__ __forceinline__ void load_idx(const I *p, I (&out)[VEC]) {
  constexpr int B = VEC * (int)sizeof(I);
  if constexpr (B >= 16) {
#pragma unroll
    for (int c = 0; c < B / 16; c++) {
      const uint4 u = __ldg(reinterpret_cast<const uint4 *>(p) + c);
      memcpy(out + c * (16 / (int)sizeof(I)), &u, 16);
    }
  } else {
    const uint2 u = __ldg(reinterpret_cast<const uint2 *>(p));
    memcpy(out, &u, 8);
  }
}

