/* Element loads and stores for Ember's kernels that mix dtypes
 * (elementwise.cu, reduce.cu): any storage dtype in, converted to the compute
 * type (float for f32/bf16/f16, double for f64, int64 for the integer types and
 * bool), and back out rounded once — with exactly the CPU's rules
 * (engine/ops/elementwise.c, its load and store helpers):
 *  - float -> integer saturates (NaN -> 0) and then truncates to the width of
 *    the destination, as the CPU's sat_i64 + cast does;
 *  - bf16/f16 round to nearest even from f32 (double goes through f32 first,
 *    like the CPU's em_f32_to_bf16((float)x));
 *  - bool reads as x != 0 and stores x != 0.
 * The dtype switch is uniform across a launch, so it costs a few instructions,
 * not divergence. Also: per-device SM count and a device guard. */
#ifndef EMBER_KERNELS_DTYPE_IO_CUH
#define EMBER_KERNELS_DTYPE_IO_CUH

#include "common.cuh"
#include <type_traits>

__host__ __device__ __forceinline__ int64_t em_sat_i64(double v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (int64_t)v;
}

/* Element i of a buffer of dtype dt, as compute type C. */
template <typename C> __device__ __forceinline__ C load_as(const void *p, int dt, int64_t i);

template <> __device__ __forceinline__ float load_as<float>(const void *p, int dt, int64_t i) {
  switch (dt) {
    case EM_F32: return ((const float *)p)[i];
    case EM_F64: return (float)((const double *)p)[i];
    case EM_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case EM_F16: return __half2float(((const __half *)p)[i]);
    case EM_I32: return (float)((const int32_t *)p)[i];
    case EM_I64: return (float)((const int64_t *)p)[i];
    case EM_U16: return (float)((const uint16_t *)p)[i];
    case EM_U8: return (float)((const uint8_t *)p)[i];
    default: return ((const uint8_t *)p)[i] != 0 ? 1.f : 0.f;
  }
}

template <> __device__ __forceinline__ double load_as<double>(const void *p, int dt, int64_t i) {
  switch (dt) {
    case EM_F32: return ((const float *)p)[i];
    case EM_F64: return ((const double *)p)[i];
    case EM_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case EM_F16: return __half2float(((const __half *)p)[i]);
    case EM_I32: return (double)((const int32_t *)p)[i];
    case EM_I64: return (double)((const int64_t *)p)[i];
    case EM_U16: return (double)((const uint16_t *)p)[i];
    case EM_U8: return (double)((const uint8_t *)p)[i];
    default: return ((const uint8_t *)p)[i] != 0 ? 1.0 : 0.0;
  }
}

template <> __device__ __forceinline__ int64_t load_as<int64_t>(const void *p, int dt, int64_t i) {
  switch (dt) {
    case EM_F32: return em_sat_i64(((const float *)p)[i]);
    case EM_F64: return em_sat_i64(((const double *)p)[i]);
    case EM_BF16: return em_sat_i64(__bfloat162float(((const __nv_bfloat16 *)p)[i]));
    case EM_F16: return em_sat_i64(__half2float(((const __half *)p)[i]));
    case EM_I32: return ((const int32_t *)p)[i];
    case EM_I64: return ((const int64_t *)p)[i];
    case EM_U16: return ((const uint16_t *)p)[i];
    case EM_U8: return ((const uint8_t *)p)[i];
    default: return ((const uint8_t *)p)[i] != 0;
  }
}

/* Store compute value x as element i of a buffer of dtype dt. */
template <typename C> __device__ __forceinline__ int64_t em_to_int(C x) { return em_sat_i64((double)x); }
template <> __device__ __forceinline__ int64_t em_to_int<int64_t>(int64_t x) { return x; }

template <typename C> __device__ __forceinline__ void store_as(void *p, int dt, int64_t i, C x) {
  switch (dt) {
    case EM_F32: ((float *)p)[i] = (float)x; break;
    case EM_F64: ((double *)p)[i] = (double)x; break;
    case EM_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)x); break;
    case EM_F16: ((__half *)p)[i] = __float2half_rn((float)x); break;
    case EM_I32: ((int32_t *)p)[i] = (int32_t)em_to_int<C>(x); break;
    case EM_I64: ((int64_t *)p)[i] = em_to_int<C>(x); break;
    case EM_U16: ((uint16_t *)p)[i] = (uint16_t)em_to_int<C>(x); break;
    case EM_U8: ((uint8_t *)p)[i] = (uint8_t)em_to_int<C>(x); break;
    default: ((uint8_t *)p)[i] = x != (C)0; break;
  }
}

/* Typed conversions for the fast paths (storage T <-> compute C). */
__device__ __forceinline__ double to_f64(double x) { return x; }
template <typename C, typename T> __device__ __forceinline__ C to_compute(T x) { return (C)to_f32(x); }
template <> __device__ __forceinline__ double to_compute<double, double>(double x) { return x; }
template <typename T, typename C> __device__ __forceinline__ T from_compute(C x) { return from_f32<T>((float)x); }
template <> __device__ __forceinline__ double from_compute<double, double>(double x) { return x; }

/* 16 bytes loaded as four 32-bit words, and element e of them (a compile-time
 * constant) in the compute type C. For the vector paths of reduce.cu and
 * elementwise.cu: a Packed128 of bf16/f16 holds each 16-bit element in a
 * register of its own, so eight of them in flight took twice the registers
 * (87-140 in the reductions, 2 blocks per SM instead of 4). */
__device__ __forceinline__ uint32_t word_at(const uint4 &w, int k) {
  return k == 0 ? w.x : k == 1 ? w.y : k == 2 ? w.z : w.w;
}
template <typename C, typename T> __device__ __forceinline__ C raw_elem(const uint4 &w, int e) {
  if constexpr (std::is_same<T, float>::value) return (C)__uint_as_float(word_at(w, e));
  else if constexpr (std::is_same<T, double>::value)
    return (C)__hiloint2double((int)word_at(w, 2 * e + 1), (int)word_at(w, 2 * e));
  else if constexpr (std::is_same<T, __nv_bfloat16>::value) {   /* bf16 -> f32 is exact: the high half */
    const uint32_t x = word_at(w, e >> 1);
    return (C)__uint_as_float((e & 1) ? (x & 0xffff0000u) : (x << 16));
  } else {
    const uint32_t x = word_at(w, e >> 1);
    return (C)__half2float(__ushort_as_half((unsigned short)((e & 1) ? (x >> 16) : (x & 0xffffu))));
  }
}

/* Make `device` current for the launches that follow (multi-GPU safety);
 * cudaGetDevice is a host-side query, no synchronisation. */
static inline int em_use_device(int device, const char *op) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) { cudaGetLastError(); cur = -1; }
  if (cur == device) return 0;
  return em_cuda_check(cudaSetDevice(device), op, "cudaSetDevice");
}

#endif
