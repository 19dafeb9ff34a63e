/* f32 binary ops with streamed stores: see ew_nt.h. */
#include "ew_nt.h"
#include "ew_half.h"
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

/* ---- where / masked_fill with streamed stores ---- */
#if defined(__x86_64__) && defined(__GNUC__)
#define XBW __attribute__((target("avx512f,avx512bw,avx512vl")))

/* The lanes' value from a tensor (stride 1) or one broadcast value (stride 0). */
#define SEL_SRC(p, s, v, LOAD) ((s) ? LOAD((p) + i) : (v))
#define LD32(p) _mm512_loadu_si512(p)

XBW static void sel32_x512(uint32_t *o, const uint8_t *c, const uint32_t *a, int64_t as, const uint32_t *b, int64_t bs,
                           int64_t n) {
  const __m512i av = _mm512_set1_epi32((int)a[0]), bv = _mm512_set1_epi32((int)b[0]);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i m = _mm_loadu_si128((const __m128i *)(c + i));
    __mmask16 k = _mm_test_epi8_mask(m, m);                     /* c[i] != 0 */
    __m512i v = _mm512_mask_blend_epi32(k, SEL_SRC(b, bs, bv, LD32), SEL_SRC(a, as, av, LD32));
    _mm512_stream_si512((__m512i *)(o + i), v);
  }
  for (; i < n; i++) o[i] = c[i] != 0 ? a[i * as] : b[i * bs];
}

/* 16-bit values, then the dtype's NaN rule (ew_half.h's CANON_BF16 / CANON_F16). */
XBW static void sel16_x512(uint16_t *o, const uint8_t *c, const uint16_t *a, int64_t as, const uint16_t *b, int64_t bs,
                           int64_t n, bool f16) {
  const __m512i av = _mm512_set1_epi16((short)a[0]), bv = _mm512_set1_epi16((short)b[0]);
  const __m512i abs = _mm512_set1_epi16(0x7fff), inf = _mm512_set1_epi16(f16 ? 0x7c00 : 0x7f80);
  const __m512i sign = _mm512_set1_epi16((short)0x8000), q = _mm512_set1_epi16(f16 ? 0x7e00 : 0x40);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i m = _mm256_loadu_si256((const __m256i *)(c + i));
    __mmask32 k = _mm256_test_epi8_mask(m, m);
    __m512i v = _mm512_mask_blend_epi16(k, SEL_SRC(b, bs, bv, LD32), SEL_SRC(a, as, av, LD32));
    __mmask32 nan = _mm512_cmpgt_epu16_mask(_mm512_and_si512(v, abs), inf);
    __m512i fix = f16 ? _mm512_or_si512(_mm512_and_si512(v, sign), q) : _mm512_or_si512(v, q);
    _mm512_stream_si512((__m512i *)(o + i), _mm512_mask_mov_epi16(v, nan, fix));
  }
  for (; i < n; i++) {
    const uint16_t v = c[i] != 0 ? a[i * as] : b[i * bs];
    o[i] = f16 ? CANON_F16(v) : CANON_BF16(v);
  }
}
#undef SEL_SRC
#undef LD32

bool em_ew_select_nt(void *o, int es, const uint8_t *c, const void *a, int64_t as, const void *b, int64_t bs,
                     int64_t n, bool f16) {
  if (em_hand_simd() < EM_HAND_AVX512 || ((uintptr_t)o & 63) || as < 0 || as > 1 || bs < 0 || bs > 1) return false;
  if (es == 4) sel32_x512(o, c, a, as, b, bs, n);
  else sel16_x512(o, c, a, as, b, bs, n, f16);
  return true;
}
#else
bool em_ew_select_nt(void *o, int es, const uint8_t *c, const void *a, int64_t as, const void *b, int64_t bs,
                     int64_t n, bool f16) {
  (void)o; (void)es; (void)c; (void)a; (void)as; (void)b; (void)bs; (void)n; (void)f16;
  return false;
}
#endif
