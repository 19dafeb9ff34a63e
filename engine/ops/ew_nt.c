/* f32 binary ops with streamed stores: see ew_nt.h. */
#include "ew_nt.h"
#include "ember/ops.h"
#include "vec_math.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* The values past the last whole vector, one at a time (the same IEEE op). */
#define NT_TAIL(OP)                                                    \
  for (; i < n; i++) {                                                 \
    float r = a[i] OP b[i];                                            \
    o[i] = r;                                                          \
    any |= r != r;                                                     \
  }

/* Four lines a step: four loads of each input in flight before the stores. */
#define NT512(OPV, OP)                                                                   \
  for (; i + 64 <= n; i += 64) {                                                         \
    __m512 r0 = OPV(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));                     \
    __m512 r1 = OPV(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16));           \
    __m512 r2 = OPV(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32));           \
    __m512 r3 = OPV(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48));           \
    nan |= _mm512_cmp_ps_mask(r0, r1, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(r2, r3, _CMP_UNORD_Q); \
    _mm512_stream_ps(o + i, r0);                                                         \
    _mm512_stream_ps(o + i + 16, r1);                                                    \
    _mm512_stream_ps(o + i + 32, r2);                                                    \
    _mm512_stream_ps(o + i + 48, r3);                                                    \
  }                                                                                      \
  for (; i + 16 <= n; i += 16) {                                                         \
    __m512 r0 = OPV(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i));                     \
    nan |= _mm512_cmp_ps_mask(r0, r0, _CMP_UNORD_Q);                                     \
    _mm512_stream_ps(o + i, r0);                                                         \
  }                                                                                      \
  NT_TAIL(OP)                                                                            \
  break

__attribute__((target("avx512f"))) static int nt_x512(int code, float *o, const float *a, const float *b, int64_t n) {
  __mmask16 nan = 0;
  int any = 0;
  int64_t i = 0;
  switch (code) {
    case EM_ADD: NT512(_mm512_add_ps, +);
    case EM_SUB: NT512(_mm512_sub_ps, -);
    case EM_MUL: NT512(_mm512_mul_ps, *);
    default: NT512(_mm512_div_ps, /);
  }
  return nan != 0 || any;
}

/* AVX2: 8 lanes, two registers a line. */
#define NT256(OPV, OP)                                                                   \
  for (; i + 32 <= n; i += 32) {                                                         \
    __m256 r0 = OPV(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i));                     \
    __m256 r1 = OPV(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8));             \
    __m256 r2 = OPV(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16));           \
    __m256 r3 = OPV(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24));           \
    nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_cmp_ps(r0, r1, _CMP_UNORD_Q),            \
                                         _mm256_cmp_ps(r2, r3, _CMP_UNORD_Q)));          \
    _mm256_stream_ps(o + i, r0);                                                         \
    _mm256_stream_ps(o + i + 8, r1);                                                     \
    _mm256_stream_ps(o + i + 16, r2);                                                    \
    _mm256_stream_ps(o + i + 24, r3);                                                    \
  }                                                                                      \
  NT_TAIL(OP)                                                                            \
  break

__attribute__((target("avx2"))) static int nt_x2(int code, float *o, const float *a, const float *b, int64_t n) {
  __m256 nan = _mm256_setzero_ps();
  int any = 0;
  int64_t i = 0;
  switch (code) {
    case EM_ADD: NT256(_mm256_add_ps, +);
    case EM_SUB: NT256(_mm256_sub_ps, -);
    case EM_MUL: NT256(_mm256_mul_ps, *);
    default: NT256(_mm256_div_ps, /);
  }
  return _mm256_movemask_ps(nan) != 0 || any;
}

bool em_ew_f32_nt_has(int code) {
  return (code == EM_ADD || code == EM_SUB || code == EM_MUL || code == EM_DIV) && em_hand_simd() >= EM_HAND_AVX2;
}

bool em_ew_f32_binary_nt(int code, float *o, const float *a, const float *b, int64_t n) {
  return (em_hand_simd() >= EM_HAND_AVX512 ? nt_x512(code, o, a, b, n) : nt_x2(code, o, a, b, n)) != 0;
}
#else
bool em_ew_f32_nt_has(int code) { (void)code; return false; }
bool em_ew_f32_binary_nt(int code, float *o, const float *a, const float *b, int64_t n) {
  (void)code; (void)o; (void)a; (void)b; (void)n;
  return true;
}
#endif
