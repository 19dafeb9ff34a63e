/* Dtype table, promotion and scalar conversions. The slow per-element
 * load/store switches are the generic path; hot loops specialise f32. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ember/dtype.h"
#include "internal.h"   /* em_env_pick */
#include "ops/vec_math.h"

static const struct { const char *name; size_t size; } dtypes[EM_NDTYPES] = {
  [EM_F32] = {"f32", 4}, [EM_F64] = {"f64", 8}, [EM_BF16] = {"bf16", 2},
  [EM_F16] = {"f16", 2}, [EM_I32] = {"i32", 4}, [EM_I64] = {"i64", 8},
  [EM_U16] = {"u16", 2}, [EM_U8] = {"u8", 1}, [EM_BOOL] = {"bool", 1},
};

size_t em_dtype_size(em_dtype t) { return (unsigned)t < EM_NDTYPES ? dtypes[t].size : 0; }
const char *em_dtype_name(em_dtype t) { return (unsigned)t < EM_NDTYPES ? dtypes[t].name : "?"; }

int em_dtype_from_name(const char *s, em_dtype *out) {
  static const struct { const char *alias; em_dtype t; } aliases[] = {
    {"float32", EM_F32}, {"float", EM_F32}, {"float64", EM_F64}, {"double", EM_F64},
    {"bfloat16", EM_BF16}, {"float16", EM_F16}, {"half", EM_F16}, {"int32", EM_I32},
    {"int", EM_I32}, {"int64", EM_I64}, {"long", EM_I64}, {"uint16", EM_U16},
    {"uint8", EM_U8}, {"byte", EM_U8},
  };
  for (int i = 0; i < EM_NDTYPES; i++)
    if (strcmp(s, dtypes[i].name) == 0) { *out = (em_dtype)i; return 0; }
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(s, aliases[i].alias) == 0) { *out = aliases[i].t; return 0; }
  return -1;
}

int em_dtype_is_float(em_dtype t) { return t == EM_F32 || t == EM_F64 || t == EM_BF16 || t == EM_F16; }
int em_dtype_is_int(em_dtype t) { return t == EM_I32 || t == EM_I64 || t == EM_U16 || t == EM_U8; }

/* Rank within a category, for promotion. */
static int rank(em_dtype t) {
  switch (t) {
    case EM_BOOL: return 0;
    case EM_U8: return 1; case EM_U16: return 2; case EM_I32: return 3; case EM_I64: return 4;
    case EM_F16: case EM_BF16: return 10; case EM_F32: return 11; case EM_F64: return 12;
    default: return -1;
  }
}

em_dtype em_promote(em_dtype a, em_dtype b) {
  if (a == b) return a;
  if ((a == EM_F16 && b == EM_BF16) || (a == EM_BF16 && b == EM_F16)) return EM_F32;
  if (a == EM_U16 && b == EM_U8) return EM_U16;
  if (a == EM_U8 && b == EM_U16) return EM_U16;
  /* i32 with u16: i32 holds every u16 */
  return rank(a) >= rank(b) ? a : b;
}

double em_load_f64(const void *p, em_dtype t, int64_t i) {
  switch (t) {
    case EM_F32: return ((const float *)p)[i];
    case EM_F64: return ((const double *)p)[i];
    case EM_BF16: return em_bf16_to_f32(((const uint16_t *)p)[i]);
    case EM_F16: return em_f16_to_f32(((const uint16_t *)p)[i]);
    case EM_I32: return ((const int32_t *)p)[i];
    case EM_I64: return (double)((const int64_t *)p)[i];
    case EM_U16: return ((const uint16_t *)p)[i];
    case EM_U8: return ((const uint8_t *)p)[i];
    case EM_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return 0;
  }
}

void em_store_f64(void *p, em_dtype t, int64_t i, double v) {
  switch (t) {
    case EM_F32: ((float *)p)[i] = (float)v; break;
    case EM_F64: ((double *)p)[i] = v; break;
    case EM_BF16: ((uint16_t *)p)[i] = em_f32_to_bf16((float)v); break;
    case EM_F16: ((uint16_t *)p)[i] = em_f32_to_f16((float)v); break;
    case EM_I32: ((int32_t *)p)[i] = (int32_t)em_f2i(v); break;
    case EM_I64: ((int64_t *)p)[i] = em_f2i(v); break;
    case EM_U16: ((uint16_t *)p)[i] = (uint16_t)em_f2i(v); break;
    case EM_U8: ((uint8_t *)p)[i] = (uint8_t)em_f2i(v); break;
    case EM_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: break;
  }
}

int64_t em_load_i64(const void *p, em_dtype t, int64_t i) {
  switch (t) {
    case EM_I32: return ((const int32_t *)p)[i];
    case EM_I64: return ((const int64_t *)p)[i];
    case EM_U16: return ((const uint16_t *)p)[i];
    case EM_U8: return ((const uint8_t *)p)[i];
    case EM_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return em_f2i(em_load_f64(p, t, i));
  }
}

void em_store_i64(void *p, em_dtype t, int64_t i, int64_t v) {
  switch (t) {
    case EM_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case EM_I64: ((int64_t *)p)[i] = v; break;
    case EM_U16: ((uint16_t *)p)[i] = (uint16_t)v; break;
    case EM_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case EM_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: em_store_f64(p, t, i, (double)v); break;
  }
}

/* n elements of p (dtype t) from index i into d, as doubles or int64: the
 * dtype switch is taken once per chunk, not per element. */
#define LOAD_AS(NAME, R, FLOATS)                                                              \
  static void NAME(R *d, const void *p, em_dtype t, int64_t i, int64_t n) {                  \
    switch (t) {                                                                             \
      case EM_F32: { const float *s = (const float *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (R)FLOATS(s[k]); break; } \
      case EM_F64: { const double *s = (const double *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (R)FLOATS(s[k]); break; } \
      case EM_BF16: { const uint16_t *s = (const uint16_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (R)FLOATS(em_bf16_to_f32(s[k])); break; } \
      case EM_F16: { const uint16_t *s = (const uint16_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (R)FLOATS(em_f16_to_f32(s[k])); break; } \
      case EM_I32: { const int32_t *s = (const int32_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (R)s[k]; break; } \
      case EM_I64: { const int64_t *s = (const int64_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (R)s[k]; break; } \
      case EM_U16: { const uint16_t *s = (const uint16_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (R)s[k]; break; } \
      case EM_U8: { const uint8_t *s = (const uint8_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (R)s[k]; break; } \
      case EM_BOOL: { const uint8_t *s = (const uint8_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (R)(s[k] != 0); break; } \
      default: break;                                                                        \
    }                                                                                        \
  }
#define AS_DOUBLE(x) ((double)(x))
LOAD_AS(load_f64s, double, AS_DOUBLE)
LOAD_AS(load_i64s, int64_t, em_f2i)
#undef LOAD_AS
#undef AS_DOUBLE

static void store_f64s(void *p, em_dtype t, int64_t i, const double *v, int64_t n) {
  switch (t) {
    case EM_F32: { float *d = (float *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (float)v[k]; break; }
    case EM_F64: { double *d = (double *)p + i; for (int64_t k = 0; k < n; k++) d[k] = v[k]; break; }
    case EM_BF16: { uint16_t *d = (uint16_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = em_f32_to_bf16((float)v[k]); break; }
    case EM_F16: { uint16_t *d = (uint16_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = em_f32_to_f16((float)v[k]); break; }
    default: for (int64_t k = 0; k < n; k++) em_store_f64(p, t, i + k, v[k]); break;
  }
}

static void store_i64s(void *p, em_dtype t, int64_t i, const int64_t *v, int64_t n) {
  switch (t) {
    case EM_I32: { int32_t *d = (int32_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (int32_t)v[k]; break; }
    case EM_I64: { int64_t *d = (int64_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = v[k]; break; }
    case EM_U16: { uint16_t *d = (uint16_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (uint16_t)v[k]; break; }
    case EM_U8: { uint8_t *d = (uint8_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = (uint8_t)v[k]; break; }
    case EM_BOOL: { uint8_t *d = (uint8_t *)p + i; for (int64_t k = 0; k < n; k++) d[k] = v[k] != 0; break; }
    default: for (int64_t k = 0; k < n; k++) em_store_i64(p, t, i + k, v[k]); break;
  }
}

/* The casts mixed precision runs most, compiled for SSE2, AVX2 and AVX-512
 * (ops/vec_math.h's clones): the same integer operations at every width. */
EM_SIMD_CLONES static void f32_to_bf16s(uint16_t *d, const float *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = em_f32_to_bf16(s[i]);
}
EM_SIMD_CLONES static void bf16_to_f32s(float *d, const uint16_t *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = em_bf16_to_f32(s[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include "ops/bf16_simd.h"
/* f32_to_bf16s with AVX-512 BW intrinsics, 32 floats a step in 14 vector
 * operations (the avx512f clone above stays in 256-bit registers and spends
 * ~2 a value): em_f32_to_bf16 per lane, u + 0x7fff plus the kept half's low
 * bit (a masked add), NaN lanes (an unordered compare, exactly
 * (u & 0x7fffffff) > 0x7f800000) replaced by u | 0x400000, i.e. (u >> 16) |
 * 0x40; then one two-register word permute keeps each lane's upper half. The
 * last n % 32 values take the same steps with masked loads and stores: the
 * same bits as em_f32_to_bf16 for every float (tests/c/test_ew_half.c). */
__attribute__((target("avx512f,avx512bw"))) static inline __m512i rne_bf16_hi(__m512i u) {
  __mmask16 unused = 0;
  return em_x512_bf16_round(_mm512_castsi512_ps(u), &unused);
}

__attribute__((target("avx512f,avx512bw"))) static void f32_to_bf16s_x512(uint16_t *d, const float *s, int64_t n) {
  _Alignas(64) static const uint16_t odd[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                                33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  const __m512i hi = _mm512_load_si512(odd);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512i r0 = rne_bf16_hi(_mm512_loadu_si512(s + i)), r1 = rne_bf16_hi(_mm512_loadu_si512(s + i + 16));
    _mm512_storeu_si512(d + i, _mm512_permutex2var_epi16(r0, hi, r1));
  }
  if (i < n) {   /* masked: lanes past n are neither read nor written */
    int64_t k = n - i;
    __mmask16 m0 = (__mmask16)(k >= 16 ? 0xffff : (1u << k) - 1), m1 = (__mmask16)(k > 16 ? (1u << (k - 16)) - 1 : 0);
    __m512i r0 = rne_bf16_hi(_mm512_maskz_loadu_epi32(m0, s + i)), r1 = rne_bf16_hi(_mm512_maskz_loadu_epi32(m1, s + i + 16));
    _mm512_mask_storeu_epi16(d + i, (__mmask32)(((uint64_t)1 << k) - 1), _mm512_permutex2var_epi16(r0, hi, r1));
  }
}

#ifdef EM_HAVE_BF16_INSN
/* With the AVX-512 BF16 extension: vcvtne2ps2bf16 rounds 32 floats as
 * em_f32_to_bf16 does (round to nearest even by the same integer add, NaN
 * quieted as (u >> 16) | 0x40, infinities kept) except that it flushes a
 * subnormal float to a signed zero, so a step with a subnormal (one class
 * test a register) goes through the loop above; 9 instructions per 32
 * values against 17. test_ew_half checks every float. */
__attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16"))) static void f32_to_bf16s_bf16(uint16_t *d, const float *s,
                                                                                          int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 lo = _mm512_loadu_ps(s + i), hi = _mm512_loadu_ps(s + i + 16);
    if (_mm512_fpclass_ps_mask(lo, 0x20) | _mm512_fpclass_ps_mask(hi, 0x20)) f32_to_bf16s_x512(d + i, s + i, 32);
    else _mm512_storeu_si512(d + i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
  if (i < n) f32_to_bf16s_x512(d + i, s + i, n - i);
}
#endif

/* The same with AVX2 (no mask registers): the kept half's low bit added by a
 * shift and an and, NaN lanes by a blend, and the narrowing by a pack
 * (within 128-bit lanes) and a quadword permute; the tail as em_f32_to_bf16. */
__attribute__((target("avx2"))) static inline __m256i rne_bf16_x2(__m256i u) {
  __m256 unused = _mm256_setzero_ps();
  return _mm256_srli_epi32(em_x2_bf16_round(_mm256_castsi256_ps(u), &unused), 16);
}

__attribute__((target("avx2"))) static void f32_to_bf16s_x2(uint16_t *d, const float *s, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i r0 = rne_bf16_x2(_mm256_loadu_si256((const __m256i *)(s + i)));
    __m256i r1 = rne_bf16_x2(_mm256_loadu_si256((const __m256i *)(s + i + 8)));
    _mm256_storeu_si256((__m256i *)(d + i), _mm256_permute4x64_epi64(_mm256_packus_epi32(r0, r1), 0xd8));
  }
  for (; i < n; i++) d[i] = em_f32_to_bf16(s[i]);
}
#define HAVE_HAND 1
#endif

static int hand_level;
#ifdef HAVE_HAND
__attribute__((constructor)) static void hand_init(void) {
  __builtin_cpu_init();
  static const int caps[] = {EM_HAND_BF16, EM_HAND_NONE, EM_HAND_AVX2, EM_HAND_AVX512};
  int cap = caps[em_env_pick("EMBER_CPU_SIMD", (const char *const[]){"bf16", "clones", "avx2", "avx512"}, 4)];
  bool x512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512dq");
  int have = x512 ? EM_HAND_AVX512 : __builtin_cpu_supports("avx2") ? EM_HAND_AVX2 : EM_HAND_NONE;
#ifdef EM_HAVE_BF16_INSN
  if (x512 && __builtin_cpu_supports("avx512bf16")) have = EM_HAND_BF16;
#endif
  hand_level = have < cap ? have : cap;
}
#endif
int em_hand_simd(void) { return hand_level; }

/* The f32 -> bf16 cast: the widest hand-written loop em_hand_simd allows, else the clones. */
static void f32_to_bf16_run(uint16_t *d, const float *s, int64_t n) {
#ifdef HAVE_HAND
  int lv = em_hand_simd();
#ifdef EM_HAVE_BF16_INSN
  if (lv == EM_HAND_BF16) { f32_to_bf16s_bf16(d, s, n); return; }
#endif
  if (lv >= EM_HAND_AVX512) { f32_to_bf16s_x512(d, s, n); return; }
  if (lv == EM_HAND_AVX2) { f32_to_bf16s_x2(d, s, n); return; }
#endif
  f32_to_bf16s(d, s, n);
}

void em_convert(void *dst, em_dtype dt, const void *src, em_dtype st, int64_t n) {
  if (dt == st) { memcpy(dst, src, (size_t)n * em_dtype_size(dt)); return; }
  if (st == EM_F32 && dt == EM_BF16) { f32_to_bf16_run(dst, src, n); return; }
  if (st == EM_BF16 && dt == EM_F32) { bf16_to_f32s(dst, src, n); return; }
  /* everything else through a chunk of doubles (int64 between integer types),
   * the same conversions as em_store_f64(em_load_f64()) per element */
  enum { C = 256 };
  int ints = !em_dtype_is_float(st) && !em_dtype_is_float(dt);
  union { double d[C]; int64_t i[C]; } buf;
  for (int64_t i = 0; i < n; i += C) {
    int64_t k = n - i < C ? n - i : C;
    if (ints) { load_i64s(buf.i, src, st, i, k); store_i64s(dst, dt, i, buf.i, k); }
    else { load_f64s(buf.d, src, st, i, k); store_f64s(dst, dt, i, buf.d, k); }
  }
}
