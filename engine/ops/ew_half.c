/* The CPU elementwise loop's 16-bit fast paths: see ew_half.h. */
#include "ew_half.h"
#include "ember/ops.h"
#include "vec_math.h"

/* vec_math.h's clones with x86-64-v4 (AVX-512 BW/VL) for avx512f: the
 * conversions need many registers, and with BW/VL the 16-bit packing and the
 * selects use mask registers, so the loops stop spilling (f16 add 1.25 ->
 * 0.66 ns an element hot). Integer operations and IEEE float ones only, no
 * contraction (-ffp-contract=off): every clone gives the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12   /* x86-64-v4: GCC 11+ */
#define EW_CLONES __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#else
#define EW_CLONES EM_SIMD_CLONES
#endif

/* Both values loaded unconditionally: a blend, not a branch per element. */
#define SEL_LOOP(T, CANON, CS, AS, BS)                                           \
  for (int64_t i = 0; i < n; i++) {                                              \
    T av = a[i * (AS)], bv = b[i * (BS)], v = c[i * (CS)] != 0 ? av : bv;        \
    o[i] = CANON(v);                                                             \
  }                                                                              \
  return

/* The unit-stride output with each input unit-stride or one value (the
 * attention mask over scores, masked_fill's constant) gets a loop of its own. */
#define SEL_BODY(T, CANON)                                                       \
  if (os == 1 && cs >= 0 && cs <= 1 && as >= 0 && as <= 1 && bs >= 0 && bs <= 1) { \
    switch (cs * 4 + as * 2 + bs) {                                              \
      case 7: SEL_LOOP(T, CANON, 1, 1, 1);                                       \
      case 6: SEL_LOOP(T, CANON, 1, 1, 0);                                       \
      case 5: SEL_LOOP(T, CANON, 1, 0, 1);                                       \
      case 4: SEL_LOOP(T, CANON, 1, 0, 0);                                       \
      case 3: SEL_LOOP(T, CANON, 0, 1, 1);                                       \
      case 2: SEL_LOOP(T, CANON, 0, 1, 0);                                       \
      case 1: SEL_LOOP(T, CANON, 0, 0, 1);                                       \
      default: SEL_LOOP(T, CANON, 0, 0, 0);                                      \
    }                                                                            \
  }                                                                              \
  for (int64_t i = 0; i < n; i++) {                                              \
    T v = c[i * cs] != 0 ? a[i * as] : b[i * bs];                                \
    o[i * os] = CANON(v);                                                        \
  }

EW_CLONES static void sel_bf16(uint16_t *o, int64_t os, const uint8_t *c, int64_t cs, const uint16_t *a,
                                    int64_t as, const uint16_t *b, int64_t bs, int64_t n) {
  SEL_BODY(uint16_t, CANON_BF16)
}

EW_CLONES static void sel_f16(uint16_t *o, int64_t os, const uint8_t *c, int64_t cs, const uint16_t *a,
                                   int64_t as, const uint16_t *b, int64_t bs, int64_t n) {
  SEL_BODY(uint16_t, CANON_F16)
}

/* The 32-bit select: no canonicalisation (a float is copied, never rounded). */
#define CANON_NONE(v) (v)
EW_CLONES static void sel_32(uint32_t *o, int64_t os, const uint8_t *c, int64_t cs, const uint32_t *a, int64_t as,
                             const uint32_t *b, int64_t bs, int64_t n) {
  SEL_BODY(uint32_t, CANON_NONE)
}

void em_ew_select32(uint32_t *o, int64_t os, const uint8_t *c, int64_t cs, const uint32_t *a, int64_t as,
                    const uint32_t *b, int64_t bs, int64_t n) {
  sel_32(o, os, c, cs, a, as, b, bs, n);
}

void em_ew_select16(uint16_t *o, int64_t os, const uint8_t *c, int64_t cs, const uint16_t *a, int64_t as,
                    const uint16_t *b, int64_t bs, int64_t n, bool f16) {
  if (f16) sel_f16(o, os, c, cs, a, as, b, bs, n);
  else sel_bf16(o, os, c, cs, a, as, b, bs, n);
}

/* em_f16_to_f32 without its normalisation loop (F. Giesen's half_to_float):
 * a subnormal (or zero) is rebuilt exactly by one float subtraction,
 * 2^-14 (1 + m/1024) - 2^-14 = m 2^-24. Branch-free, so the loop is SIMD. */
EM_VEC float f16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)(h & 0x7fff) << 13, e = u & 0x0f800000u;
  u += (uint32_t)(127 - 15) << 23;
  uint32_t sub = em_f32_bits(em_bits_f32(u + (1u << 23)) - em_bits_f32(113u << 23));
  uint32_t r = e == 0x0f800000u ? u + ((uint32_t)(128 - 16) << 23) : e == 0 ? sub : u;   /* inf/NaN, subnormal */
  return em_bits_f32(r | (uint32_t)(h & 0x8000) << 16);
}

/* em_f32_to_f16 with selects for its early returns (Giesen's
 * float_to_half_fast3_rtne): a result below 2^-14 is rounded to nearest even
 * by the FPU, adding 0.5 (whose ulp is f16's least subnormal, 2^-24); a
 * normal one by adding 0xfff plus the kept mantissa's low bit. */
EM_VEC uint16_t f32_to_f16(float x) {
  uint32_t u = em_f32_bits(x), sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
  uint32_t special = a > 0x7f800000u ? 0x7e00 : 0x7c00;                      /* NaN, or inf / overflow */
  uint32_t sub = em_f32_bits(em_bits_f32(a) + em_bits_f32(126u << 23)) - (126u << 23);
  uint32_t nrm = (a - (112u << 23) + 0xfff + ((a >> 13) & 1)) >> 13;        /* 0x7c00 from 65520 on */
  uint32_t r = a >= 0x47800000u ? special : a < 0x38800000u ? sub : nrm;
  return (uint16_t)(sign | r);
}

bool em_ew_half_binary_has(int code) {
  return code == EM_ADD || code == EM_SUB || code == EM_MUL || code == EM_DIV;
}

#define BF(p, i) em_bits_f32((uint32_t)(p)[i] << 16)
#define HF(p, i) f16_to_f32((p)[i])
#define BIN_LOOP(X, Y, OP, RND)                                                   \
  for (int64_t i = 0; i < n; i++) {                                                \
    float x = (X), y = (Y);                                                        \
    o[i] = RND(x OP y);                                                            \
    pair |= (x != x) & (y != y);                                                   \
  }                                                                                \
  return pair
#define BIN_OPS(X, Y, RND)                                                         \
  switch (code) {                                                                  \
    case EM_ADD: BIN_LOOP(X, Y, +, RND);                                           \
    case EM_SUB: BIN_LOOP(X, Y, -, RND);                                           \
    case EM_MUL: BIN_LOOP(X, Y, *, RND);                                           \
    default: BIN_LOOP(X, Y, /, RND);                                               \
  }
/* Tensor with tensor, tensor with constant, constant with tensor, two constants. */
#define BIN_BODY(LD, RND)                                                          \
  int pair = 0;                                                                    \
  if (a && b) BIN_OPS(LD(a, i), LD(b, i), RND)                                     \
  if (a) BIN_OPS(LD(a, i), cb, RND)                                                \
  if (b) BIN_OPS(ca, LD(b, i), RND)                                                \
  BIN_OPS(ca, cb, RND)

EW_CLONES static int bf16_bin(int code, uint16_t *o, const uint16_t *a, float ca, const uint16_t *b, float cb,
                                    int64_t n) {
  BIN_BODY(BF, em_f32_to_bf16)
}

EW_CLONES static int f16_bin(int code, uint16_t *o, const uint16_t *a, float ca, const uint16_t *b, float cb,
                                   int64_t n) {
  BIN_BODY(HF, f32_to_f16)
}

#if defined(__x86_64__) && defined(__GNUC__)
#include "bf16_simd.h"
#define X512 __attribute__((target("avx512f,avx512bw")))

/* bf16_bin with AVX-512 BW intrinsics, 32 values a step and no shuffles: the
 * even values of a 32-value load are widened by a shift (each dword's low
 * half to its upper half), the odd ones by a mask (already there), so a step
 * is two independent 16-lane ops; each result is rounded in its lane as
 * em_f32_to_bf16 does (u + 0x7fff plus the kept half's low bit, a masked add;
 * NaN lanes, an unordered compare, become u | 0x400000, i.e. (u >> 16) |
 * 0x40), and one masked word move puts the odd results' upper halves beside
 * the even ones' (shifted down). ~20 vector ops per 32 values against ~45 in
 * GCC's x86-64-v4 clone, whose widening and narrowing shuffles and per-value
 * NaN-pair test kept it core-bound: the pair test is left to the rare piece
 * with a NaN result, scanned after (a NaN with NaN gives a NaN). The same
 * IEEE operation per value, so the same bits (tests/c/test_ew_half.c). */

/* A step's 32 results: streamed (nt: o is 64-byte aligned, ew_half.h's
 * em_ew_half_binary_nt) or stored. */
#define X_ST(p, v) (nt ? _mm512_stream_si512((__m512i *)(p), (v)) : _mm512_storeu_si512((p), (v)))

/* The last values of a piece one at a time, as em_f32_to_bf16 rounds them; a NaN result noted in `any`. */
#define X_TAIL(OP)                                                                                 \
  for (; i < n; i++) {                                                                             \
    float r = (a ? BF(a, i) : ca) OP (b ? BF(b, i) : cb);                                          \
    o[i] = em_f32_to_bf16(r);                                                                      \
    any |= r != r;                                                                                 \
  }

#define X_TEN(p, E, O) { __m512i w = _mm512_loadu_si512((p) + i);                                  \
    E = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));                                              \
    O = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u))); }
#define X_CST(p, E, O) { E = O = (p##v); }
/* A row widened once for many rows (em_ew_bf16_widen): the block's 16 even
 * values, then its 16 odd ones, already f32 (two loads for a load, a shift and an and). */
#define X_PRE(p, E, O) { E = _mm512_loadu_ps(p##w + i); O = _mm512_loadu_ps(p##w + i + 16); }
#define X_LOOP(LA, LB, OPV, OP)                                                                     \
  for (; i + 32 <= n; i += 32) {                                                                   \
    __m512 xe, xo, ye, yo;                                                                         \
    LA(a, xe, xo) LB(b, ye, yo)                                                                    \
    __m512i re = em_x512_bf16_round(OPV(xe, ye), &nan);                                            \
    __m512i ro = em_x512_bf16_round(OPV(xo, yo), &nan);                                            \
    X_ST(o + i, _mm512_mask_mov_epi16(_mm512_srli_epi32(re, 16), 0xaaaaaaaau, ro));                 \
  }                                                                                                \
  X_TAIL(OP)                                                                                       \
  break
#define X_OPS(LA, LB, W)                                                                            \
  switch (code) {                                                                                  \
    case EM_ADD: X_LOOP(LA, LB, W##_add_ps, +);                                                    \
    case EM_SUB: X_LOOP(LA, LB, W##_sub_ps, -);                                                    \
    case EM_MUL: X_LOOP(LA, LB, W##_mul_ps, *);                                                    \
    default: X_LOOP(LA, LB, W##_div_ps, /);                                                        \
  }

/* Whether some a_i and b_i are both NaN (a piece with a NaN result). */
static int nan_pair(const uint16_t *a, float ca, const uint16_t *b, float cb, int64_t n) {
  int pair = 0;
  for (int64_t i = 0; i < n && !pair; i++) {
    float x = a ? BF(a, i) : ca, y = b ? BF(b, i) : cb;
    pair = (x != x) & (y != y);
  }
  return pair;
}

/* a or b (or both) a tensor: the constant-with-constant case stays in bf16_bin. */
X512 static int bf16_bin_x512(int code, uint16_t *o, const uint16_t *a, float ca, const uint16_t *b, float cb,
                              int64_t n, bool nt, const float *aw, const float *bw) {
  const __m512 av = _mm512_set1_ps(ca), bv = _mm512_set1_ps(cb);
  __mmask16 nan = 0;
  int any = 0;
  int64_t i = 0;
  if (a && b && aw) X_OPS(X_PRE, X_TEN, _mm512)
  else if (a && b && bw) X_OPS(X_TEN, X_PRE, _mm512)
  else if (a && b) X_OPS(X_TEN, X_TEN, _mm512)
  else if (a) X_OPS(X_TEN, X_CST, _mm512)
  else X_OPS(X_CST, X_TEN, _mm512)
  if (!nan && !any) return 0;
  return nan_pair(a, ca, b, cb, n);
}

#ifdef EM_HAVE_BF16_INSN
/* With the AVX-512 BF16 extension: the same widening and op, then one
 * vcvtne2ps2bf16 rounds both halves (em_f32_to_bf16's bits except that it
 * flushes subnormals, see f32_to_bf16s_bf16 in engine/dtype.c) and one word
 * permute interleaves them; a step whose results hold a NaN or a subnormal
 * (one class test a register) is recomputed by bf16_bin_x512, which also
 * reports a NaN pair. ~16 instructions per 32 values against ~27. */
#undef X_LOOP
/* The step to recompute leaves the inner loop, so its call does not clobber
 * the loop's constants (GCC rebuilt the widening mask every step), and the two
 * class masks are tested by one kortest, not two moves to integer registers and an or. */
#define X_LOOP(LA, LB, OPV, OP)                                                                     \
  while (i + 32 <= n) {                                                                            \
    for (; i + 32 <= n; i += 32) {                                                                 \
      __m512 xe, xo, ye, yo;                                                                       \
      LA(a, xe, xo) LB(b, ye, yo)                                                                  \
      __m512 re = OPV(xe, ye), ro = OPV(xo, yo);                                                   \
      if (!_kortestz_mask16_u8(_mm512_fpclass_ps_mask(re, 0xa1), _mm512_fpclass_ps_mask(ro, 0xa1))) break; \
      X_ST(o + i, _mm512_permutexvar_epi16(ilv, (__m512i)_mm512_cvtne2ps_pbh(ro, re)));            \
    }                                                                                              \
    if (i + 32 > n) break;                                                                         \
    pair |= bf16_bin_x512(code, o + i, a ? a + i : NULL, ca, b ? b + i : NULL, cb, 32, nt, NULL, NULL); \
    i += 32;                                                                                       \
  }                                                                                                \
  break

__attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16"))) static int bf16_bin_bf16(
    int code, uint16_t *o, const uint16_t *a, float ca, const uint16_t *b, float cb, int64_t n, bool nt,
    const float *aw, const float *bw) {
  /* word w of the output: even value w / 2 (word w / 2 of the rounding), odd ones from word 16 + w / 2 */
  _Alignas(64) static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                  8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i ilv = _mm512_load_si512(order);
  const __m512 av = _mm512_set1_ps(ca), bv = _mm512_set1_ps(cb);
  int pair = 0;
  int64_t i = 0;
  if (a && b && aw) X_OPS(X_PRE, X_TEN, _mm512)
  else if (a && b && bw) X_OPS(X_TEN, X_PRE, _mm512)
  else if (a && b) X_OPS(X_TEN, X_TEN, _mm512)
  else if (a) X_OPS(X_TEN, X_CST, _mm512)
  else X_OPS(X_CST, X_TEN, _mm512)
  if (i < n) pair |= bf16_bin_x512(code, o + i, a ? a + i : NULL, ca, b ? b + i : NULL, cb, n - i, nt, NULL, NULL);
  return pair;
}
#endif
#undef X_TEN
#undef X_CST
#undef X_PRE
#undef X_LOOP

/* em_ew_bf16_widen's blocks: the even values by a shift, the odd by a mask, as X_TEN splits them. */
X512 static void widen_x512(float *w, const uint16_t *x, int64_t n) {
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    __m512i v = _mm512_loadu_si512(x + i);
    _mm512_storeu_si512(w + i, _mm512_slli_epi32(v, 16));
    _mm512_storeu_si512(w + i + 16, _mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
  }
}

/* The same with AVX2, 16 values a step (no mask registers): the kept half's
 * low bit added by a shift and an and, NaN lanes by a blend, the NaN results
 * gathered in a register, and the halves merged by a word blend. */

#define X_TEN(p, E, O) { __m256i w = _mm256_loadu_si256((const __m256i *)((p) + i));               \
    E = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));                                              \
    O = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u))); }
#define X_CST(p, E, O) { E = O = (p##v); }
#define X_LOOP(LA, LB, OPV, OP)                                                                     \
  for (; i + 16 <= n; i += 16) {                                                                   \
    __m256 xe, xo, ye, yo;                                                                         \
    LA(a, xe, xo) LB(b, ye, yo)                                                                    \
    __m256i re = em_x2_bf16_round(OPV(xe, ye), &nan);                                              \
    __m256i ro = em_x2_bf16_round(OPV(xo, yo), &nan);                                              \
    _mm256_storeu_si256((__m256i *)(o + i), _mm256_blend_epi16(_mm256_srli_epi32(re, 16), ro, 0xaa)); \
  }                                                                                                \
  X_TAIL(OP)                                                                                       \
  break

__attribute__((target("avx2"))) static int bf16_bin_x2(int code, uint16_t *o, const uint16_t *a, float ca,
                                                       const uint16_t *b, float cb, int64_t n) {
  const __m256 av = _mm256_set1_ps(ca), bv = _mm256_set1_ps(cb);
  __m256 nan = _mm256_setzero_ps();
  int any = 0;
  int64_t i = 0;
  if (a && b) X_OPS(X_TEN, X_TEN, _mm256)
  else if (a) X_OPS(X_TEN, X_CST, _mm256)
  else X_OPS(X_CST, X_TEN, _mm256)
  if (!_mm256_movemask_ps(nan) && !any) return 0;
  return nan_pair(a, ca, b, cb, n);
}
#undef X_TEN
#undef X_CST
#undef X_LOOP
#undef X_OPS
#undef X_TAIL
#define HAVE_HAND 1
#endif

bool em_ew_half_binary(int code, em_dtype dt, uint16_t *o, const uint16_t *a, float ca, const uint16_t *b, float cb,
                       int64_t n) {
#ifdef HAVE_HAND
  int lv = dt == EM_BF16 && (a || b) ? em_hand_simd() : EM_HAND_NONE;
#ifdef EM_HAVE_BF16_INSN
  if (lv == EM_HAND_BF16) return bf16_bin_bf16(code, o, a, ca, b, cb, n, false, NULL, NULL) != 0;
#endif
  if (lv >= EM_HAND_AVX512) return bf16_bin_x512(code, o, a, ca, b, cb, n, false, NULL, NULL) != 0;
  if (lv == EM_HAND_AVX2) return bf16_bin_x2(code, o, a, ca, b, cb, n) != 0;
#endif
  return (dt == EM_F16 ? f16_bin(code, o, a, ca, b, cb, n) : bf16_bin(code, o, a, ca, b, cb, n)) != 0;
}

int em_ew_half_binary_nt(int code, uint16_t *o, const uint16_t *a, float ca, const uint16_t *b, float cb,
                         int64_t n, const float *aw, const float *bw) {
#ifdef HAVE_HAND
  int lv = a || b ? em_hand_simd() : EM_HAND_NONE;
  if (!a || !b) aw = bw = NULL;
#ifdef EM_HAVE_BF16_INSN
  if (lv == EM_HAND_BF16) return bf16_bin_bf16(code, o, a, ca, b, cb, n, true, aw, bw) != 0;
#endif
  if (lv >= EM_HAND_AVX512) return bf16_bin_x512(code, o, a, ca, b, cb, n, true, aw, bw) != 0;
#endif
  (void)code; (void)o; (void)a; (void)ca; (void)b; (void)cb; (void)n; (void)aw; (void)bw;
  return -1;
}

bool em_ew_bf16_widen(float *w, const uint16_t *x, int64_t n) {
#ifdef HAVE_HAND
  if (em_hand_simd() >= EM_HAND_AVX512) { widen_x512(w, x, n); return true; }
#endif
  (void)w; (void)x; (void)n;
  return false;
}

EW_CLONES static void to_f16s(uint16_t *d, const float *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = f32_to_f16(s[i]);
}

EW_CLONES static void from_f16s(float *d, const uint16_t *s, int64_t n) {
  for (int64_t i = 0; i < n; i++) d[i] = f16_to_f32(s[i]);
}

void em_ew_load_f16(float *d, const uint16_t *s, int64_t n) { from_f16s(d, s, n); }

void em_ew_store16(uint16_t *d, em_dtype dt, const float *s, int64_t n) {
  if (dt == EM_F16) to_f16s(d, s, n);
  else em_convert(d, EM_BF16, s, EM_F32, n);
}
