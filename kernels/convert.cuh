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

__device__ __forceinline__ float em_dev_bf16_to_f32(uint16_t h) {
  return __uint_as_float((uint32_t)h << 16);
}
__device__ __forceinline__ uint16_t em_dev_f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
__device__ __forceinline__ float em_dev_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) u = sign;
    else {
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; exp--; }
      man &= 0x3ff;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) u = sign | 0x7f800000u | (man << 13);
  else u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  return __uint_as_float(u);
}
__device__ __forceinline__ uint16_t em_dev_f32_to_f16(float f) {
  uint32_t u = __float_as_uint(f);
  uint32_t sign = (u >> 16) & 0x8000, absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00);
  if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
  if (absu < 0x38800000u) {
    if (absu < 0x33000000u) return (uint16_t)sign;
    uint32_t e = absu >> 23, man = (absu & 0x7fffff) | 0x800000;
    int shift = 126 - (int)e;
    uint32_t res = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (res & 1))) res++;
    return (uint16_t)(sign | res);
  }
  uint32_t res = ((absu >> 13) - ((127 - 15) << 10));
  uint32_t rem = absu & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (res & 1))) res++;
  return (uint16_t)(sign | res);
}

/* Float -> int64 as the CPU's f2i: NaN -> 0, out of range clamps. */
__device__ __forceinline__ int64_t em_dev_f2i(double v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (int64_t)v;
}

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
