/* engine/ops/vec_math.h: em_exp_f32 against exp in double over a sweep of
 * float bit patterns (within 2 ulp, subnormal results within one subnormal
 * step), its special values, the same bits from the vectorised loop and from
 * scalar calls at every offset, the lane sums and maxima, and the
 * extreme/NaN search max and min run on. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include "test.h"
#include "ops/vec_math.h"

static float fbits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t bitsf(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* Distance in units of the last place between got and the correctly rounded ref. */
static double ulps(float got, double ref) {
  float r = (float)ref;
  if (got == r) return 0;
  double ulp = fabs(r) < FLT_MIN ? FLT_TRUE_MIN : (double)nextafterf(fabsf(r), INFINITY) - fabsf(r);
  return fabs((double)got - ref) / ulp;
}

TEST(exp_matches_double_over_a_sweep) {
  double worst = 0;
  float worst_x = 0;
  for (int sign = 0; sign < 2; sign++)
    for (uint32_t u = 0; u < 0x7f800000u; u += 4099) {
      float x = fbits(u | (sign ? 0x80000000u : 0));
      if (x > 88.72f || x < -104.0f) continue;
      double e = ulps(em_exp_f32(x), exp((double)x));
      if (e > worst) { worst = e; worst_x = x; }
    }
  if (worst > 2) fprintf(stderr, "  worst error %.2f ulp at x = %a\n", worst, (double)worst_x);
  CHECK(worst <= 2);
}

TEST(exp_special_values) {
  CHECK(em_exp_f32(0.0f) == 1.0f);
  CHECK(em_exp_f32(-0.0f) == 1.0f);
  CHECK(em_exp_f32(-INFINITY) == 0.0f);
  CHECK(em_exp_f32(INFINITY) == INFINITY);
  CHECK(em_exp_f32(89.0f) == INFINITY);          /* past FLT_MAX */
  CHECK(em_exp_f32(88.7f) < FLT_MAX && em_exp_f32(88.7f) > 3e38f);
  CHECK(em_exp_f32(-120.0f) == 0.0f);
  float sub = em_exp_f32(-100.0f);                /* 3.7e-44: a subnormal */
  CHECK(sub > 0 && sub < FLT_MIN);
  CHECK(isnan(em_exp_f32(NAN)));
  CHECK(isnan(em_exp_f32(-NAN)));
  CHECK(fabsf(em_exp_f32(1.0f) - (float)M_E) <= FLT_EPSILON * 3);
}

/* The vectorised loop (the widest clone this CPU runs) and one call per
 * element give the same bits, wherever the loop starts (a thread's range)
 * and however long it is. */
static float scalar_exp(volatile float x) { return em_exp_f32(x); }
EM_SIMD_CLONES static void exp_loop(const float *x, float *y, int n) {
  for (int i = 0; i < n; i++) y[i] = em_exp_f32(x[i]);
}

TEST(vector_and_scalar_agree) {
  enum { N = 4096 };
  float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
  uint32_t s = 12345;
  for (int i = 0; i < N; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)((double)s / 4294967296.0 * 200.0 - 105.0);
  }
  x[7] = NAN; x[100] = -INFINITY; x[101] = INFINITY;
  int diff = 0;
  for (int off = 0; off < 17; off++) {
    int n = N - off - 3 * off;
    exp_loop(x + off, y, n);
    for (int i = 0; i < n; i++) {
      float r = scalar_exp(x[off + i]);
      if (bitsf(r) != bitsf(y[i])) diff++;
    }
  }
  CHECK(diff == 0);
  free(x); free(y);
}

TEST(lane_sums_and_maxima) {
  float v[37];
  double want = 0;
  for (int i = 0; i < 37; i++) { v[i] = (float)(i * 0.25 - 3); want += v[i]; }
  CHECK(em_sum_f32(v, 37) == want);               /* exact: quarters */
  double sq = 0;
  for (int i = 0; i < 37; i++) sq += (double)v[i] * v[i];
  CHECK(em_dot_f32(v, v, 37) == sq);              /* exact too: sixteenths */
  CHECK(em_sum_f32(v, 0) == 0);
  CHECK(em_max_f32(v, 37) == v[36]);
  v[3] = NAN;
  CHECK(em_max_f32(v, 37) == v[36]);              /* NaN ignored */
  CHECK(em_max_f32(v, 0) == -INFINITY);
  float z[9] = {0};
  CHECK(em_sum_exp_f32(z, 0.0f, 9) == 9.0);
  float y[9];
  CHECK(em_exp_shift_f32(z, 1.0f, y, 9) == 9.0 * (double)em_exp_f32(-1.0f));
}

/* em_extreme_f32 and em_find_f32 against a plain loop, on rows of every
 * length up to 200 (the 64-lane blocks and their tails) holding ties, -0/+0,
 * infinities and NaNs at random places. */
TEST(extreme_and_find_match_a_loop) {
  float v[200];
  const float pool[] = {0.0f, -0.0f, 1.5f, -2.0f, INFINITY, -INFINITY, 7.0f, 7.0f, NAN};
  srand(17);
  int ok = 1;
  for (int n = 1; n <= 200; n++)
    for (int rep = 0; rep < 8; rep++) {
      for (int i = 0; i < n; i++) v[i] = pool[rand() % (rep < 4 ? 8 : 9)];   /* half the rows without NaN */
      for (int is_max = 0; is_max < 2; is_max++) {
        float m = is_max ? -INFINITY : INFINITY;
        int nan = 0;
        for (int i = 0; i < n; i++) {
          if (v[i] != v[i]) nan = 1;
          else if (is_max ? v[i] > m : v[i] < m) m = v[i];
        }
        int got_nan;
        float got = em_extreme_f32(v, n, is_max, &got_nan);
        ok = ok && got == m && got_nan == nan;
        int64_t first = 0;
        while (first < n && (nan ? v[first] == v[first] : v[first] != m)) first++;
        ok = ok && em_find_f32(v, n, nan ? NAN : m) == first;
      }
      ok = ok && em_find_f32(v, n, 123.0f) == n;
    }
  CHECK(ok);
}

/* The bf16 kernels: em_extreme_bf16 / em_find_bf16 give what the f32 ones
 * give on the widened values, and em_sum_bf16 is the 32-lane sum written
 * out here, bit for bit, on values spanning 2^100 (so any change of
 * order shows in the double); the AVX-512 sum, where the CPU has it, too. */
static uint16_t bf16_of(float f) { return (uint16_t)(bitsf(f) >> 16); }

TEST(bf16_kernels_match_f32_and_the_lane_order) {
  enum { N = 4200 };
  static uint16_t h[N];
  static float w[N];
  const float pool[] = {0.0f, -0.0f, 1.5f, -2.0f, INFINITY, -INFINITY, 7.0f, 7.0f, NAN};
  srand(23);
  int ok = 1;
  for (int n = 0; n <= 300; n++) {
    for (int rep = 0; rep < 4; rep++) {
      for (int i = 0; i < n; i++) { h[i] = bf16_of(pool[rand() % (rep < 2 ? 8 : 9)]); w[i] = fbits((uint32_t)h[i] << 16); }
      for (int is_max = 0; is_max < 2 && n > 0; is_max++) {
        int nan16, nan32;
        float a = em_extreme_bf16(h, n, is_max, &nan16), b = em_extreme_f32(w, n, is_max, &nan32);
        ok = ok && nan16 == nan32 && (a == b || (a != a && b != b)) && bitsf(a) == bitsf(b);
#if defined(__x86_64__) && defined(__GNUC__)
        if (__builtin_cpu_supports("avx512f")) {
          int nan512;
          float c = em_extreme_bf16_avx512(h, n, is_max, &nan512);
          ok = ok && nan512 == nan32 && bitsf(c) == bitsf(a);
        }
#endif
        float v = nan32 ? NAN : b;
        ok = ok && em_find_bf16(h, n, v) == em_find_f32(w, n, v);
#if defined(__x86_64__) && defined(__GNUC__)
        if (__builtin_cpu_supports("avx512f")) ok = ok && em_find_bf16_avx512(h, n, v) == em_find_f32(w, n, v);
#endif
      }
    }
  }
  CHECK(ok);
  int exact = 1;
  for (int n = 0; n < N; n += n < 100 ? 1 : 37) {
    for (int i = 0; i < n; i++) {   /* random signs and exponents from 2^-50 to 2^50 */
      float f = ldexpf(1.0f + (float)(rand() % 128) / 128.0f, rand() % 101 - 50);
      h[i] = bf16_of(rand() & 1 ? -f : f);
    }
    double acc[32] = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
      for (int k = 0; k < 32; k++) acc[k] += (double)fbits((uint32_t)h[i + k] << 16);
    for (int k = 0; i + k < n; k++) acc[k] += (double)fbits((uint32_t)h[i + k] << 16);
    for (int s = 1; s < 32; s *= 2)
      for (int k = 0; k < 32; k += 2 * s) acc[k] += acc[k + s];
    double got = em_sum_bf16(h, n);
    exact = exact && memcmp(&got, &acc[0], 8) == 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f")) {
      double g512 = em_sum_bf16_avx512(h, n), u512 = em_sum_bf16_avx512u(h, n), s512 = em_sum_bf16_avx512s(h, n);
      exact = exact && memcmp(&g512, &acc[0], 8) == 0 && memcmp(&u512, &acc[0], 8) == 0 &&
              memcmp(&s512, &acc[0], 8) == 0;
    }
    if (__builtin_cpu_supports("avx2")) {
      double s2 = em_sum_bf16_avx2s(h, n);
      exact = exact && memcmp(&s2, &acc[0], 8) == 0;
    }
#endif
  }
  CHECK(exact);
}

/* em_extreme_from_bf16_avx512: the extreme and the NaN flag of the f32
 * kernel, and a start from which em_find_bf16 finds the same first position
 * as a search of the whole run: lengths around the 64-value steps, the
 * 256-value sub-blocks and EXT16's 4096; the extreme placed in one or two
 * sub-blocks (the later one in a lower lane), in the tail, on -0/+0 ties,
 * behind a NaN, or everywhere (-inf rows). */
TEST(bf16_extreme_from_names_the_first_sub_block) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (!__builtin_cpu_supports("avx512bw")) return;
  enum { N = 4200 };
  static uint16_t h[N];
  static float w[N];
  const int lens[] = {1, 5, 63, 64, 65, 127, 255, 256, 257, 300, 511, 512, 513, 1000, 4095, 4096, 4097, 4200};
  srand(29);
  int ok = 1, cases = 0;
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
    int n = lens[li];
    for (int kind = 0; kind < 7; kind++) {
      for (int rep = 0; rep < 12; rep++) {
        for (int i = 0; i < n; i++) {
          float f = (float)(rand() % 100) - 100.0f;           /* below the extremes placed next */
          if (kind == 2) f = rand() & 1 ? -0.0f : 0.0f;        /* +-0 ties everywhere, and negatives */
          if (kind == 2 && rand() % 3 == 0) f = -(float)(1 + rand() % 9);
          if (kind == 5) f = -INFINITY;
          h[i] = bf16_of(f);
        }
        int p = rand() % n, q = rand() % n;
        if (kind == 0) h[p] = bf16_of(5.0f);                                          /* one maximum */
        if (kind == 1) { h[p] = bf16_of(5.0f); h[q] = bf16_of(5.0f); }                /* two, anywhere */
        if (kind == 3) { h[p] = bf16_of(5.0f); h[q] = bf16_of(NAN); }                 /* a NaN wins */
        if (kind == 4) { h[p] = bf16_of(5.0f); h[n - 1] = bf16_of(9.0f); }            /* the tail's */
        if (kind == 6) { int a = p & ~255, b = (a + 256 + (p & 63)) % n;              /* tie in a lower lane */
                         h[p] = bf16_of(5.0f); h[b] = bf16_of(5.0f); h[a + (p & 15)] = bf16_of(-0.0f); }
        for (int i = 0; i < n; i++) w[i] = fbits((uint32_t)h[i] << 16);
        for (int is_max = 0; is_max < 2; is_max++) {
          int nan32, nan512;
          int64_t from = -1;
          float b = em_extreme_f32(w, n, is_max, &nan32), c = em_extreme_from_bf16_avx512(h, n, is_max, &nan512, &from);
          ok = ok && nan512 == nan32 && (nan32 || c == b) && from >= 0 && from <= n;
          float v = nan32 ? NAN : b;
          int64_t first = em_find_f32(w, n, v);
          ok = ok && from <= first && from + em_find_bf16(h + from, n - from, v) == first;
          cases++;
        }
      }
    }
  }
  CHECK(ok);
  CHECK(cases == 18 * 7 * 12 * 2);
#endif
}

int main(void) {
  RUN(exp_matches_double_over_a_sweep);
  RUN(exp_special_values);
  RUN(vector_and_scalar_agree);
  RUN(lane_sums_and_maxima);
  RUN(extreme_and_find_match_a_loop);
  RUN(bf16_kernels_match_f32_and_the_lane_order);
  RUN(bf16_extreme_from_names_the_first_sub_block);
  TEST_MAIN_END();
}
