/* Scalar conversions shared verbatim by the CPU reference and the CUDA
 * kernels (kernels/convert.cuh), so both devices agree bit for bit by
 * construction: bf16 and f16 round to nearest even (NaN stays a quiet NaN),
 * float -> integer truncates toward zero with NaN -> 0 and clamping to the
 * int64 range (C leaves those cases undefined). */
#ifndef EMBER_HALF_H
#define EMBER_HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define EM_HD static inline __host__ __device__
#else
#define EM_HD static inline
#endif

EM_HD float em_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
EM_HD uint32_t em_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

EM_HD float em_bf16_to_f32(uint16_t h) { return em_bits_f32((uint32_t)h << 16); }

EM_HD uint16_t em_f32_to_bf16(float f) {
  uint32_t u = em_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

EM_HD float em_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) u = sign;
    else {                                  /* subnormal: normalise */
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; exp--; }
      man &= 0x3ff;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) u = sign | 0x7f800000u | (man << 13);
  else u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  return em_bits_f32(u);
}

EM_HD uint16_t em_f32_to_f16(float f) {
  uint32_t u = em_f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000, absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00);          /* NaN */
  if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);          /* overflow -> inf (incl. rounding up) */
  if (absu < 0x38800000u) {                                           /* subnormal or zero in f16 */
    if (absu < 0x33000000u) return (uint16_t)sign;                    /* < 2^-25: rounds to 0 */
    uint32_t e = absu >> 23, man = (absu & 0x7fffff) | 0x800000;
    int shift = 126 - (int)e;      /* value = man * 2^(e-150) = res * 2^-24 */
    uint32_t res = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (res & 1))) res++;
    return (uint16_t)(sign | res);
  }
  uint32_t res = ((absu >> 13) - ((127 - 15) << 10));
  uint32_t rem = absu & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (res & 1))) res++;
  return (uint16_t)(sign | res);
}

EM_HD int64_t em_f2i(double v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (int64_t)v;
}

#endif
