/* Float math the compiler vectorises, for the CPU ops' exp-bound rows
 * (softmax, the fused attention softmax, cross-entropy, swiglu).
 *
 * glibc's expf is a call per element (about 2 ns): a softmax or a
 * cross-entropy row spent most of its time there. em_exp_f32 is Cephes'
 * expf written with plain arithmetic and selects, no calls and no branches,
 * so a loop over it becomes SIMD code (4 lanes with the portable SSE2
 * baseline, 8 or 16 with -DEMBER_NATIVE=ON): within 2 ulp of the exact
 * value over the whole float range, subnormal results included, exp(-inf) =
 * 0, exp(+inf) = inf, NaN stays NaN (tests/c/test_vec_math.c sweeps it
 * against glibc). Scalar and vector code compute the same IEEE operations,
 * so a result does not depend on where a thread's range starts or ends.
 *
 * The sums and maxima run in EM_LANES fixed lanes (lane k takes elements
 * k, k + 16, ...), combined pairwise in one fixed order: the vectoriser keeps
 * the lanes in registers (16 doubles: two AVX-512 registers, enough
 * independent adds to hide their latency), and the result depends on the
 * row alone.
 *
 * EM_SIMD_CLONES: a hot row kernel marked with it is compiled for the
 * baseline (SSE2), AVX2 and AVX-512, and the loader picks the widest the CPU
 * has, so the portable build runs at the machine's width (SSE2 gains little:
 * no 8-lane int ops). Every clone computes the same IEEE operations in the
 * same order (no FMA contraction: -ffp-contract=off), so the results do not
 * depend on which clone runs. */
#ifndef EMBER_OPS_VEC_MATH_H
#define EMBER_OPS_VEC_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "ember/half.h"

#define EM_LANES 16

#if defined(__x86_64__) && defined(__GNUC__)
#define EM_SIMD_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define EM_SIMD_CLONES
#endif
/* Which hand-written loops the 16-bit casts and the bf16 binary ops run
 * (engine/dtype.c, engine/ops/ew_half.c): EM_HAND_BF16 (AVX-512 F/BW/DQ and
 * the BF16 extension's rounding instruction), EM_HAND_AVX512 (F/BW/DQ),
 * EM_HAND_AVX2, or EM_HAND_NONE (the compiler's clones). The widest the CPU
 * has, capped by EMBER_CPU_SIMD ("clones", "avx2", "avx512" or "bf16", read
 * once at load) to compare speed: every level gives the same bits. */
enum { EM_HAND_NONE, EM_HAND_AVX2, EM_HAND_AVX512, EM_HAND_BF16 };
/* The BF16 level's intrinsics and CPU feature name: GCC 12 on (as ew_half.c's x86-64-v4 clones). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define EM_HAVE_BF16_INSN 1
#endif
int em_hand_simd(void);

/* Always inlined: an out-of-line copy would be compiled for the baseline
 * only, whichever clone calls it. */
#define EM_VEC static inline __attribute__((always_inline))

EM_VEC float em_exp_f32(float x) {
  /* clamp (NaN: 0, restored at the end) so the exponent fits an int */
  float c = x == x ? x : 0.0f;
  c = c < -104.0f ? -104.0f : c;
  c = c > 89.0f ? 89.0f : c;
  /* c = n ln2 + r, |r| <= ln2 / 2, with n rounded to nearest (1.5 * 2^23 trick) */
  float t = c * 1.44269504088896341f + 12582912.0f;
  float n = t - 12582912.0f;
  float r = c - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  /* p * 2^n in two factors, so n in [-151, 129] neither overflows the
   * exponent field nor skips the subnormal rounding */
  int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
  uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
  float s1, s2;
  memcpy(&s1, &b1, 4);
  memcpy(&s2, &b2, 4);
  float y = p * s1 * s2;
  return x == x ? y : x;
}

/* Lanes of a float max: four AVX-512 registers of independent maxima (with
 * 16 lanes GCC 12 left the loop scalar: 0.14 ns an element against 0.015). */
#define EM_MAX_LANES 64

/* max of x[0..n) ignoring NaN (-inf for none). */
EM_VEC float em_max_f32(const float *x, int64_t n) {
  float m[EM_MAX_LANES];
  for (int k = 0; k < EM_MAX_LANES; k++) m[k] = -INFINITY;
  int64_t i = 0;
  for (; i + EM_MAX_LANES <= n; i += EM_MAX_LANES)
    for (int k = 0; k < EM_MAX_LANES; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
  for (int k = 0; i + k < n; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
  for (int k = 1; k < EM_MAX_LANES; k++) m[0] = m[k] > m[0] ? m[k] : m[0];
  return m[0];
}

/* The extreme (max, or min when !is_max) of x[0..n) ignoring NaN, and
 * whether a NaN is there: the largest |bits| as integers (a NaN's exceed
 * +inf's), so both are plain SIMD maxima with no per-element branch.
 * EM_EXTREME(LOAD) is the body, LOAD(j) the j-th value as a float; f32 and
 * bf16 (widened in the register: one pass, no buffer) share it. */
#define EM_EXTREME(LOAD)                                                         \
  float m[EM_MAX_LANES];                                                         \
  int32_t a[EM_MAX_LANES];                                                       \
  for (int k = 0; k < EM_MAX_LANES; k++) { m[k] = is_max ? -INFINITY : INFINITY; a[k] = 0; } \
  int64_t i = 0;                                                                 \
  if (is_max) {                                                                  \
    for (; i + EM_MAX_LANES <= n; i += EM_MAX_LANES)                             \
      for (int k = 0; k < EM_MAX_LANES; k++) EM_EXT_STEP(LOAD, k, >)             \
    for (int k = 0; i + k < n; k++) EM_EXT_STEP(LOAD, k, >)                      \
  } else {                                                                       \
    for (; i + EM_MAX_LANES <= n; i += EM_MAX_LANES)                             \
      for (int k = 0; k < EM_MAX_LANES; k++) EM_EXT_STEP(LOAD, k, <)             \
    for (int k = 0; i + k < n; k++) EM_EXT_STEP(LOAD, k, <)                      \
  }                                                                              \
  int32_t am = 0;                                                                \
  float r = m[0];                                                                \
  for (int k = 0; k < EM_MAX_LANES; k++) {                                       \
    am = a[k] > am ? a[k] : am;                                                  \
    r = is_max ? (m[k] > r ? m[k] : r) : (m[k] < r ? m[k] : r);                  \
  }                                                                              \
  *has_nan = am > 0x7f800000;                                                    \
  return r;
#define EM_EXT_STEP(LOAD, k, CMP)                                                \
  { float v = LOAD(i + (k)); int32_t b; memcpy(&b, &v, 4); b &= 0x7fffffff;      \
    a[k] = b > a[k] ? b : a[k]; m[k] = v CMP m[k] ? v : m[k]; }
#define EM_LOAD_F32(j) x[j]
#define EM_LOAD_BF16(j) em_bits_f32((uint32_t)x[j] << 16)

EM_VEC float em_extreme_f32(const float *x, int64_t n, int is_max, int *has_nan) { EM_EXTREME(EM_LOAD_F32) }
EM_VEC float em_extreme_bf16(const uint16_t *x, int64_t n, int is_max, int *has_nan) { EM_EXTREME(EM_LOAD_BF16) }

/* The first i with x[i] == v (v == v), or the first NaN (v != v); n when
 * none: 64 elements tested at a time as one SIMD compare, then the block
 * that holds it element by element. */
#define EM_FIND(LOAD)                                                            \
  int nan = v != v;                                                              \
  int64_t i = 0;                                                                 \
  for (; i + EM_MAX_LANES <= n; i += EM_MAX_LANES) {                             \
    int32_t hit = 0;                                                             \
    for (int k = 0; k < EM_MAX_LANES; k++) { float y = LOAD(i + k); hit |= nan ? y != y : y == v; } \
    if (hit) break;                                                              \
  }                                                                              \
  for (; i < n; i++) { float y = LOAD(i); if (nan ? y != y : y == v) return i; } \
  return n;

EM_VEC int64_t em_find_f32(const float *x, int64_t n, float v) { EM_FIND(EM_LOAD_F32) }
EM_VEC int64_t em_find_bf16(const uint16_t *x, int64_t n, float v) { EM_FIND(EM_LOAD_BF16) }

/* ((a0 + a1) + (a2 + a3)) + ... : pairwise, in a fixed order (acc is consumed). */
EM_VEC double em_lanes_total(double *acc) {
  for (int w = 1; w < EM_LANES; w *= 2)
    for (int k = 0; k < EM_LANES; k += 2 * w) acc[k] += acc[k + w];
  return acc[0];
}

/* sum of x[0..n) in double. */
EM_VEC double em_sum_f32(const float *x, int64_t n) {
  double acc[EM_LANES] = {0};
  int64_t i = 0;
  for (; i + EM_LANES <= n; i += EM_LANES)
    for (int k = 0; k < EM_LANES; k++) acc[k] += (double)x[i + k];
  for (int k = 0; k < EM_LANES && i + k < n; k++) acc[k] += (double)x[i + k];
  return em_lanes_total(acc);
}

/* Lanes of a bf16 sum in double: four AVX-512 registers of independent adds.
 * A bf16 value is half an f32's bytes for the same conversion and add, so
 * em_sum_f32's two registers, or a widening pass into a buffer first, leave a
 * bf16 sum bound by the core, not by memory (2-core VM, one thread: ~13 GB/s
 * against a 30 GB/s read). Lane k takes values k, k + 32, ... */
#define EM_SUM16_LANES 32

/* The values x[i..n) (fewer than EM_SUM16_LANES) into their lanes, then the
 * lanes pairwise in a fixed order: the end every bf16 sum shares. A run
 * shorter than the lanes skips the pairs whose second lane it never reached:
 * that lane is +0, and x + (+0) is x for every lane value (a lane is never
 * -0: it starts at +0), so the result is the same bits, in fewer adds (rows
 * of 8 values paid 31). */
EM_VEC double em_sum_bf16_end(double *acc, const uint16_t *x, int64_t i, int64_t n) {
  for (int k = 0; i + k < n; k++) acc[k] += (double)EM_LOAD_BF16(i + k);
  int lim = n < EM_SUM16_LANES ? (int)n : EM_SUM16_LANES;
  for (int w = 1; w < EM_SUM16_LANES; w *= 2)
    for (int k = 0; k + w < lim; k += 2 * w) acc[k] += acc[k + w];
  return acc[0];
}

/* sum of the bf16 values x[0..n) in double (each exact: bf16 is f32's upper
 * half), portable C; GCC vectorises the lanes but keeps them in 256-bit
 * registers with shuffles between them, so AVX-512 machines take the
 * intrinsics below, the same additions in the same order. */
EM_VEC double em_sum_bf16(const uint16_t *x, int64_t n) {
  double acc[EM_SUM16_LANES] = {0};
  int64_t i = 0;
  for (; i + EM_SUM16_LANES <= n; i += EM_SUM16_LANES)
    for (int k = 0; k < EM_SUM16_LANES; k++) acc[k] += (double)EM_LOAD_BF16(i + k);
  return em_sum_bf16_end(acc, x, i, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* em_sum_bf16 with AVX-512 intrinsics: eight values a step widened
 * (zero-extend, shift: f32 bits) and converted to eight doubles in one
 * register, the four registers being lanes 0-7, 8-15, 16-23, 24-31. */
__attribute__((target("avx512f"))) static inline double em_sum_bf16_avx512(const uint16_t *x, int64_t n) {
#define EM_W8(p) _mm512_cvtps_pd(_mm256_castsi256_ps(                                   \
    _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16)))
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + EM_SUM16_LANES <= n; i += EM_SUM16_LANES) {
    a0 = _mm512_add_pd(a0, EM_W8(x + i));
    a1 = _mm512_add_pd(a1, EM_W8(x + i + 8));
    a2 = _mm512_add_pd(a2, EM_W8(x + i + 16));
    a3 = _mm512_add_pd(a3, EM_W8(x + i + 24));
  }
#undef EM_W8
  double acc[EM_SUM16_LANES];
  _mm512_storeu_pd(acc, a0);
  _mm512_storeu_pd(acc + 8, a1);
  _mm512_storeu_pd(acc + 16, a2);
  _mm512_storeu_pd(acc + 24, a3);
  return em_sum_bf16_end(acc, x, i, n);
}

/* em_extreme_bf16 with AVX-512 intrinsics: the same 64 lanes (four
 * registers of 16: lanes 0-15, ..., 48-63) and the same selects
 * (max_ps(v, m) is v > m ? v : m, min_ps(v, m) is v < m ? v : m), the tail
 * and the lanes' combination as the C body does them. GCC's code for the C
 * body kept its 128 lanes in 256-bit halves spilled to the stack. */
__attribute__((target("avx512f"))) static inline float em_extreme_bf16_avx512(const uint16_t *x, int64_t n, int is_max,
                                                                              int *has_nan) {
  __m512 m0 = _mm512_set1_ps(is_max ? -INFINITY : INFINITY), m1 = m0, m2 = m0, m3 = m0;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, abs = _mm512_set1_epi32(0x7fffffff);
  int64_t i = 0;
#define EM_V16(p) _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16)
#define EM_STEP(M, A, off, OP) { __m512i b = EM_V16(x + i + (off));                               \
    A = _mm512_max_epi32(A, _mm512_and_si512(b, abs)); M = OP(_mm512_castsi512_ps(b), M); }
  if (is_max) {
    for (; i + EM_MAX_LANES <= n; i += EM_MAX_LANES) {
      EM_STEP(m0, a0, 0, _mm512_max_ps) EM_STEP(m1, a1, 16, _mm512_max_ps)
      EM_STEP(m2, a2, 32, _mm512_max_ps) EM_STEP(m3, a3, 48, _mm512_max_ps)
    }
  } else {
    for (; i + EM_MAX_LANES <= n; i += EM_MAX_LANES) {
      EM_STEP(m0, a0, 0, _mm512_min_ps) EM_STEP(m1, a1, 16, _mm512_min_ps)
      EM_STEP(m2, a2, 32, _mm512_min_ps) EM_STEP(m3, a3, 48, _mm512_min_ps)
    }
  }
#undef EM_STEP
#undef EM_V16
  float m[EM_MAX_LANES];
  int32_t a[EM_MAX_LANES];
  _mm512_storeu_ps(m, m0); _mm512_storeu_ps(m + 16, m1); _mm512_storeu_ps(m + 32, m2); _mm512_storeu_ps(m + 48, m3);
  _mm512_storeu_si512(a, a0); _mm512_storeu_si512(a + 16, a1); _mm512_storeu_si512(a + 32, a2);
  _mm512_storeu_si512(a + 48, a3);
  if (is_max) { for (int k = 0; i + k < n; k++) EM_EXT_STEP(EM_LOAD_BF16, k, >) }
  else { for (int k = 0; i + k < n; k++) EM_EXT_STEP(EM_LOAD_BF16, k, <) }
  int32_t am = 0;
  float r = m[0];
  for (int k = 0; k < EM_MAX_LANES; k++) {
    am = a[k] > am ? a[k] : am;
    r = is_max ? (m[k] > r ? m[k] : r) : (m[k] < r ? m[k] : r);
  }
  *has_nan = am > 0x7f800000;
  return r;
}

/* em_find_bf16 with AVX-512 intrinsics: 16 values a compare (the f32
 * compare of the widened values: -0 == +0 as in C), the first set bit of
 * the first mask that has one. */
__attribute__((target("avx512f"))) static inline int64_t em_find_bf16_avx512(const uint16_t *x, int64_t n, float v) {
#define EM_V16(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
  int64_t i = 0;
  if (v != v) {
    for (; i + 16 <= n; i += 16) {
      __m512 y = EM_V16(x + i);
      unsigned k = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
      if (k) return i + __builtin_ctz(k);
    }
  } else {
    __m512 w = _mm512_set1_ps(v);
    for (; i + 16 <= n; i += 16) {
      unsigned k = _mm512_cmp_ps_mask(EM_V16(x + i), w, _CMP_EQ_OQ);
      if (k) return i + __builtin_ctz(k);
    }
  }
#undef EM_V16
  for (; i < n; i++) { float y = EM_LOAD_BF16(i); if (v != v ? y != y : y == v) return i; }
  return n;
}
#endif

/* sum of x[i] * y[i] in double (y may be x: a sum of squares). */
EM_VEC double em_dot_f32(const float *x, const float *y, int64_t n) {
  double acc[EM_LANES] = {0};
  int64_t i = 0;
  for (; i + EM_LANES <= n; i += EM_LANES)
    for (int k = 0; k < EM_LANES; k++) acc[k] += (double)x[i + k] * y[i + k];
  for (int k = 0; k < EM_LANES && i + k < n; k++) acc[k] += (double)x[i + k] * y[i + k];
  return em_lanes_total(acc);
}

/* y[i] = exp(x[i] - shift), and their sum in double (two passes: faster than one). */
EM_VEC double em_exp_shift_f32(const float *x, float shift, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = em_exp_f32(x[i] - shift);
  return em_sum_f32(y, n);
}

/* sum of exp(x[i] - shift) in double, nothing stored. */
EM_VEC double em_sum_exp_f32(const float *x, float shift, int64_t n) {
  double acc[EM_LANES] = {0};
  int64_t i = 0;
  for (; i + EM_LANES <= n; i += EM_LANES)
    for (int k = 0; k < EM_LANES; k++) acc[k] += (double)em_exp_f32(x[i + k] - shift);
  for (int k = 0; k < EM_LANES && i + k < n; k++) acc[k] += (double)em_exp_f32(x[i + k] - shift);
  return em_lanes_total(acc);
}

/* y = softmax(x), or log_softmax(x) with log_out, over n contiguous floats
 * (y may be x). The max ignores NaN; a NaN or an all -inf row gives NaN. */
EM_VEC void em_softmax_row_f32(const float *x, float *y, int64_t n, int log_out) {
  float mx = em_max_f32(x, n);
  if (log_out) {
    double sh = (double)mx + log(em_sum_exp_f32(x, mx, n));
    for (int64_t i = 0; i < n; i++) y[i] = (float)((double)x[i] - sh);
    return;
  }
  double inv = 1.0 / em_exp_shift_f32(x, mx, y, n);
  for (int64_t i = 0; i < n; i++) y[i] = (float)((double)y[i] * inv);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* em_extreme_bf16_avx512 that also says where the extreme first lies, so the
 * find pass reads EM_EXT_SUB values instead of the run (a max over rows of
 * 4096 spent ~40% of its time finding; 2-core VM, L2-resident). Every
 * EM_EXT_SUB values the four registers' running extremes are folded into
 * one register, each of whose 16 lanes remembers the sub-block in which it
 * last became strictly better: the first value equal to the extreme lies in
 * the earliest such sub-block among the lanes that hold the extreme (a
 * lane's earlier values are worse, its later ones never strictly better).
 * *from = that sub-block's start, or the tail's (the values past the last 64,
 * taken one by one) when the tail holds something strictly better, or 0 when
 * a NaN is there. The value and *has_nan compare equal to those of
 * em_extreme_bf16_avx512 (extremes of the same values; the caller reads
 * the result from x at the position found). AVX-512 BW: 6 instructions per
 * 32 values against 10 (uops.info: all on ports 0 and 5). */
#define EM_EXT_SUB 256
__attribute__((target("avx512f,avx512bw"))) static inline float em_extreme_from_bf16_avx512(const uint16_t *x,
                                                                                           int64_t n, int is_max,
                                                                                           int *has_nan,
                                                                                           int64_t *from) {
  const __m512 init = _mm512_set1_ps(is_max ? -INFINITY : INFINITY);
  __m512 m0 = init, m1 = init, m2 = init, m3 = init, run = init;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, sub = a0, z = a0, abs = _mm512_set1_epi16(0x7fff);
  int64_t i = 0;
  int32_t blk = 0;
  /* 32 values a load: |bits| maxima on the 16-bit words (a NaN's exceed
   * +inf's 0x7f80), the values widened by unpacks with zero (within 128-bit
   * halves: the lanes are permuted, which no extreme and no sub-block sees) */
#define EM_STEP(MA, MB, A, off, OP) { __m512i w = _mm512_loadu_si512((const void *)(x + i + (off)));    \
    A = _mm512_max_epu16(A, _mm512_and_si512(w, abs));                                                \
    MA = OP(_mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w)), MA);                                    \
    MB = OP(_mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w)), MB); }
#define EM_PASS(OP, CMP)                                                                          \
  while (i + EM_MAX_LANES <= n) {                                                                 \
    for (int s = 0; s < EM_EXT_SUB / EM_MAX_LANES && i + EM_MAX_LANES <= n; s++, i += EM_MAX_LANES) { \
      EM_STEP(m0, m1, a0, 0, OP) EM_STEP(m2, m3, a1, 32, OP)                                      \
    }                                                                                             \
    __m512 c = OP(OP(m0, m1), OP(m2, m3));                                                        \
    sub = _mm512_mask_mov_epi32(sub, _mm512_cmp_ps_mask(c, run, CMP), _mm512_set1_epi32(blk));   \
    run = c;                                                                                      \
    blk++;                                                                                        \
  }
  if (is_max) { EM_PASS(_mm512_max_ps, _CMP_GT_OQ) } else { EM_PASS(_mm512_min_ps, _CMP_LT_OQ) }
#undef EM_PASS
#undef EM_STEP
  /* the ends in registers too: rows of 4096 values pay them once per pass */
  int nan = _mm512_cmpgt_epu16_mask(_mm512_max_epu16(a0, a1), _mm512_set1_epi16(0x7f80)) != 0;
  float r = is_max ? _mm512_reduce_max_ps(run) : _mm512_reduce_min_ps(run), t = is_max ? -INFINITY : INFINITY;
  int64_t tail = i;
  for (; i < n; i++) {
    uint16_t w = x[i];
    float v = EM_LOAD_BF16(i);
    nan |= (w & 0x7fff) > 0x7f80;
    t = is_max ? (v > t ? v : t) : (v < t ? v : t);
  }
  *has_nan = nan;
  if (nan) { *from = 0; return r; }
  if (is_max ? t > r : t < r) { *from = tail; return t; }
  /* the lanes holding the extreme (there is one when blk > 0): the earliest sub-block among theirs */
  __mmask16 hold = _mm512_cmp_ps_mask(run, _mm512_set1_ps(r), _CMP_EQ_OQ);
  *from = blk ? (int64_t)_mm512_mask_reduce_min_epi32(hold, sub) * EM_EXT_SUB : tail;
  return r;
}
#endif

#if defined(__x86_64__) && defined(__GNUC__)
/* em_sum_bf16_avx512 with fewer instructions a value: sixteen values are
 * widened by two unpacks with zero (a bf16 is the upper half of its f32)
 * instead of two zero-extends and two shifts. An unpack works within 128-bit
 * halves, so the four registers hold the 32 lanes permuted (lanes 0-3 and
 * 8-11, 4-7 and 12-15, 16-19 and 24-27, 20-23 and 28-31); each lane still
 * takes the same values in the same order, and the lanes are put back in
 * order before em_sum_bf16_end: the same bits. Intel (uops.info, Ice Lake /
 * Sapphire Rapids): 16 uops per 32 values on ports 0 and 5 against 20. */
__attribute__((target("avx512f"))) static inline double em_sum_bf16_avx512u(const uint16_t *x, int64_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  const __m256i z = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + EM_SUM16_LANES <= n; i += EM_SUM16_LANES) {
    __m256i p = _mm256_loadu_si256((const __m256i *)(x + i)), q = _mm256_loadu_si256((const __m256i *)(x + i + 16));
    a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, p))));
    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, p))));
    a2 = _mm512_add_pd(a2, _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, q))));
    a3 = _mm512_add_pd(a3, _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, q))));
  }
  double acc[EM_SUM16_LANES];      /* lanes back in order: low halves, then high halves, of each pair */
  _mm512_storeu_pd(acc, _mm512_shuffle_f64x2(a0, a1, 0x44));
  _mm512_storeu_pd(acc + 8, _mm512_shuffle_f64x2(a0, a1, 0xee));
  _mm512_storeu_pd(acc + 16, _mm512_shuffle_f64x2(a2, a3, 0x44));
  _mm512_storeu_pd(acc + 24, _mm512_shuffle_f64x2(a2, a3, 0xee));
  return em_sum_bf16_end(acc, x, i, n);
}

/* em_sum_bf16_avx512u with the widening on port 0 instead of port 5 (Intel,
 * uops.info: a 256-bit unpack and the lane-crossing half of each
 * f32 -> double conversion are port 5's alone, so the unpack loop put 8 of
 * its 16 uops a 32 values there, plus whichever of its 4 adds the allocator
 * sent there). Here each 16 values are widened by a shift (the even ones) and
 * an and (the odd ones), each 8 straight into one conversion, no unpack: 4
 * uops of 16 bound to port 5, 6 to port 0, 6 free. The lanes are permuted
 * (register 0 holds lanes 0, 2, ..., 14; 1: 1, 3, ..., 15; 2 and 3 the same
 * from 16), each still takes its values in the same order, and they are put
 * back in order before em_sum_bf16_end: the same bits. */
__attribute__((target("avx512f,avx512vl"))) static inline double em_sum_bf16_avx512s(const uint16_t *x, int64_t n) {
  __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
  const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
  int64_t i = 0;
  for (; i + EM_SUM16_LANES <= n; i += EM_SUM16_LANES) {
    __m256i p = _mm256_loadu_si256((const __m256i *)(x + i)), q = _mm256_loadu_si256((const __m256i *)(x + i + 16));
    a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(p, 16))));
    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_and_si256(p, hi))));
    a2 = _mm512_add_pd(a2, _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(q, 16))));
    a3 = _mm512_add_pd(a3, _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_and_si256(q, hi))));
  }
  const __m512i lo8 = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), hi8 = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
  double acc[EM_SUM16_LANES];      /* lanes back in order: even and odd interleaved */
  _mm512_storeu_pd(acc, _mm512_permutex2var_pd(a0, lo8, a1));
  _mm512_storeu_pd(acc + 8, _mm512_permutex2var_pd(a0, hi8, a1));
  _mm512_storeu_pd(acc + 16, _mm512_permutex2var_pd(a2, lo8, a3));
  _mm512_storeu_pd(acc + 24, _mm512_permutex2var_pd(a2, hi8, a3));
  return em_sum_bf16_end(acc, x, i, n);
}

/* The same widening with AVX2 (GCC's AVX2 clone of em_sum_bf16 shuffled its
 * 256-bit halves: 37 instructions a 32 values under callgrind): eight
 * registers of four lanes, register r holding lanes base_r + 0, 2, 4, 6
 * (base 0, 8, 1, 9, 16, 24, 17, 25), each taking its values in the same
 * order; the lanes put back in order before em_sum_bf16_end: the same bits. */
__attribute__((target("avx2"))) static inline double em_sum_bf16_avx2s(const uint16_t *x, int64_t n) {
  __m256d a[8];
  for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_pd();
  const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
  int64_t i = 0;
  for (; i + EM_SUM16_LANES <= n; i += EM_SUM16_LANES) {
    for (int h = 0; h < 2; h++) {
      __m256i p = _mm256_loadu_si256((const __m256i *)(x + i + 16 * h));
      __m256 e = _mm256_castsi256_ps(_mm256_slli_epi32(p, 16)), o = _mm256_castsi256_ps(_mm256_and_si256(p, hi));
      a[4 * h] = _mm256_add_pd(a[4 * h], _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
      a[4 * h + 1] = _mm256_add_pd(a[4 * h + 1], _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
      a[4 * h + 2] = _mm256_add_pd(a[4 * h + 2], _mm256_cvtps_pd(_mm256_castps256_ps128(o)));
      a[4 * h + 3] = _mm256_add_pd(a[4 * h + 3], _mm256_cvtps_pd(_mm256_extractf128_ps(o, 1)));
    }
  }
  static const int base[8] = {0, 8, 1, 9, 16, 24, 17, 25};
  double t[4], acc[EM_SUM16_LANES];
  for (int r = 0; r < 8; r++) {
    _mm256_storeu_pd(t, a[r]);
    for (int k = 0; k < 4; k++) acc[base[r] + 2 * k] = t[k];
  }
  return em_sum_bf16_end(acc, x, i, n);
}
#endif

#endif
