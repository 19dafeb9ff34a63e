/* Per-element dtype conversions on the device, bit for bit those of the CPU
 * reference (engine/dtype.c): floats go through double and are rounded once
 * to the target (bf16/f16 through f32, round to nearest even, the CPU's NaN
 * patterns), float -> int truncates toward zero with NaN -> 0 and clamping to
 * the int64 range, int -> int goes through int64 with C's wrap-around, bool
 * is "!= 0". Written by hand (not __float2bfloat16_rn) so NaN payloads and
 * every rounding agree with the CPU exactly. */
#ifndef EMBER_KERNELS_CONVERT_CUH
#define EMBER_KERNELS_CONVERT_CUH

#include <stdint.h>
#include "ember/dtype.h"

/* The scalar conversions are ember/half.h's, shared verbatim with the CPU. */
#define em_dev_bf16_to_f32 em_bf16_to_f32
#define em_dev_f32_to_bf16 em_f32_to_bf16
#define em_dev_f16_to_f32 em_f16_to_f32
#define em_dev_f32_to_f16 em_f32_to_f16
#define em_dev_f2i em_f2i

/* Load element i of a buffer of dtype DT as double / as int64. */
template <int DT>
__device__ __forceinline__ double em_dev_load_f64(const void *p, int64_t i) {
  switch (DT) {
    case EM_F32: return ((const float *)p)[i];
    case EM_F64: return ((const double *)p)[i];
    case EM_BF16: return em_dev_bf16_to_f32(((const uint16_t *)p)[i]);
    case EM_F16: return em_dev_f16_to_f32(((const uint16_t *)p)[i]);
    case EM_I32: return ((const int32_t *)p)[i];
    case EM_I64: return (double)((const int64_t *)p)[i];
    case EM_U16: return ((const uint16_t *)p)[i];
    case EM_U8: return ((const uint8_t *)p)[i];
    default: return ((const uint8_t *)p)[i] != 0;
  }
}
template <int DT>
__device__ __forceinline__ int64_t em_dev_load_i64(const void *p, int64_t i) {
  switch (DT) {
    case EM_I32: return ((const int32_t *)p)[i];
    case EM_I64: return ((const int64_t *)p)[i];
    case EM_U16: return ((const uint16_t *)p)[i];
    case EM_U8: return ((const uint8_t *)p)[i];
    case EM_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return em_dev_f2i(em_dev_load_f64<DT>(p, i));
  }
}
template <int DT>
__device__ __forceinline__ void em_dev_store_f64(void *p, int64_t i, double v) {
  switch (DT) {
    case EM_F32: ((float *)p)[i] = (float)v; break;
    case EM_F64: ((double *)p)[i] = v; break;
    case EM_BF16: ((uint16_t *)p)[i] = em_dev_f32_to_bf16((float)v); break;
    case EM_F16: ((uint16_t *)p)[i] = em_dev_f32_to_f16((float)v); break;
    case EM_I32: ((int32_t *)p)[i] = (int32_t)em_dev_f2i(v); break;
    case EM_I64: ((int64_t *)p)[i] = em_dev_f2i(v); break;
    case EM_U16: ((uint16_t *)p)[i] = (uint16_t)em_dev_f2i(v); break;
    case EM_U8: ((uint8_t *)p)[i] = (uint8_t)em_dev_f2i(v); break;
    default: ((uint8_t *)p)[i] = v != 0; break;
  }
}
template <int DT>
__device__ __forceinline__ void em_dev_store_i64(void *p, int64_t i, int64_t v) {
  switch (DT) {
    case EM_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case EM_I64: ((int64_t *)p)[i] = v; break;
    case EM_U16: ((uint16_t *)p)[i] = (uint16_t)v; break;
    case EM_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case EM_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: em_dev_store_f64<DT>(p, i, (double)v); break;
  }
}

/* Call F.template operator()<DT>() with DT the dtype as a template constant. */
#define EM_DTYPE_CASES(dt, DT, ...)                                   \
  switch (dt) {                                                      \
    case EM_F32: { constexpr int DT = EM_F32; __VA_ARGS__; } break;  \
    case EM_F64: { constexpr int DT = EM_F64; __VA_ARGS__; } break;  \
    case EM_BF16: { constexpr int DT = EM_BF16; __VA_ARGS__; } break;\
    case EM_F16: { constexpr int DT = EM_F16; __VA_ARGS__; } break;  \
    case EM_I32: { constexpr int DT = EM_I32; __VA_ARGS__; } break;  \
    case EM_I64: { constexpr int DT = EM_I64; __VA_ARGS__; } break;  \
    case EM_U16: { constexpr int DT = EM_U16; __VA_ARGS__; } break;  \
    case EM_U8: { constexpr int DT = EM_U8; __VA_ARGS__; } break;    \
    case EM_BOOL: { constexpr int DT = EM_BOOL; __VA_ARGS__; } break;\
    default: break;                                                  \
  }

/* Geometry of up to two strided operands over one logical shape (element
 * strides; src strides are 0 on broadcast dims). Dims are coalesced on the
 * host so the common cases run with one or two dims. */
struct em_geom {
  int ndim;
  int64_t shape[8];
  int64_t stride[2][8];
};

/* Offsets (elements) of logical row-major index i in both operands. IDX is
 * uint32_t when every index fits (cheap division), else int64_t. */
template <typename IDX>
__device__ __forceinline__ void em_geom_offsets(const em_geom &g, IDX i, int64_t &o0, int64_t &o1) {
  if (g.ndim == 1) { o0 = (int64_t)i * g.stride[0][0]; o1 = (int64_t)i * g.stride[1][0]; return; }
  o0 = 0; o1 = 0;
  for (int d = g.ndim - 1; d >= 0; d--) {
    IDX s = (IDX)g.shape[d], k = i % s;
    i /= s;
    o0 += (int64_t)k * g.stride[0][d];
    o1 += (int64_t)k * g.stride[1][d];
  }
}

/* Build a geometry: drop size-1 dims, merge dims that are contiguous with
 * each other in every operand (s1 may be NULL for one operand). */
static inline em_geom em_geom_make(int ndim, const int64_t *shape, const int64_t *s0, const int64_t *s1) {
  em_geom g;
  g.ndim = 0;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 1) continue;
    int64_t a = s0[d], b = s1 ? s1[d] : 0;
    int n = g.ndim;
    if (n > 0 && g.stride[0][n - 1] == a * shape[d] && g.stride[1][n - 1] == b * shape[d]) {
      g.shape[n - 1] *= shape[d];
      g.stride[0][n - 1] = a; g.stride[1][n - 1] = b;
      continue;
    }
    g.shape[n] = shape[d]; g.stride[0][n] = a; g.stride[1][n] = b;
    g.ndim++;
  }
  if (g.ndim == 0) { g.ndim = 1; g.shape[0] = 1; g.stride[0][0] = 0; g.stride[1][0] = 0; }
  return g;
}

#endif
