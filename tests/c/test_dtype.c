/* Dtypes: bf16/f16 conversions bit for bit (round to nearest even, ties both
 * ways, overflow, subnormals, signed zero, NaN), exhaustive 16-bit round
 * trips, a sweep of f32 inputs against an independent reference rounding
 * (double arithmetic + nearbyint), the promotion table (PyTorch rules), names
 * and torch aliases, and float -> integer conversion (truncation toward zero,
 * NaN -> 0). */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include "test.h"

static float fbits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t bitsf(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* f32 bit pattern -> expected 16-bit pattern, with the line for the message. */
static void expect_bf16(uint32_t in, uint16_t want, int line) {
  uint16_t got = em_f32_to_bf16(fbits(in));
  test_checks++;
  if (got != want) {
    test_failures++;
    fprintf(stderr, "%s:%d: f32_to_bf16(0x%08x) = 0x%04x, expected 0x%04x\n", __FILE__, line, in, got, want);
  }
}
static void expect_f16(float in, uint16_t want, int line) {
  uint16_t got = em_f32_to_f16(in);
  test_checks++;
  if (got != want) {
    test_failures++;
    fprintf(stderr, "%s:%d: f32_to_f16(%a = 0x%08x) = 0x%04x, expected 0x%04x\n", __FILE__, line, (double)in,
            bitsf(in), got, want);
  }
}
#define BF16(in, want) expect_bf16((in), (want), __LINE__)
#define F16(in, want) expect_f16((in), (want), __LINE__)

static bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
static bool bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0; }

/* ---------------- bf16 ---------------- */

TEST(bf16_round_to_nearest_even) {
  BF16(0x3f800000, 0x3f80);                 /* 1.0 exact */
  BF16(0x3f807fff, 0x3f80);                 /* just below the tie */
  BF16(0x3f808000, 0x3f80);                 /* tie, 0x3f80 is even: down */
  BF16(0x3f808001, 0x3f81);                 /* just above the tie */
  BF16(0x3f818000, 0x3f82);                 /* tie, 0x3f81 is odd: up */
  BF16(0x3f817fff, 0x3f81);
  BF16(0xbf808000, 0xbf80);                 /* negative ties: same magnitude rule */
  BF16(0xbf818000, 0xbf82);
  BF16(0x3fff8000, 0x4000);                 /* carry into the exponent: 1.99... -> 2 */
  BF16(0x7f7f0000, 0x7f7f);                 /* max normal bf16 */
  BF16(0x7f7f7fff, 0x7f7f);
  BF16(0x7f7f8000, 0x7f80);                 /* tie above max (odd) rounds to inf */
  BF16(0x7f7fffff, 0x7f80);                 /* FLT_MAX -> inf */
  BF16(0xff7fffff, 0xff80);                 /* -FLT_MAX -> -inf */
  BF16(0x7f800000, 0x7f80);                 /* inf */
  BF16(0xff800000, 0xff80);
  BF16(0x00000000, 0x0000);
  BF16(0x80000000, 0x8000);                 /* -0 keeps its sign */
  BF16(0x00008000, 0x0000);                 /* f32 subnormal tie -> even (0) */
  BF16(0x00018000, 0x0002);                 /* tie -> even (2) */
  BF16(0x00010000, 0x0001);                 /* smallest bf16 subnormal */
  BF16(0x80008001, 0x8001);
  /* NaNs stay NaN, including signalling ones whose payload is only in the low bits */
  uint32_t nans[] = {0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7fffffff, 0x7f80ffff};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    uint16_t h = em_f32_to_bf16(fbits(nans[i]));
    CHECK(bf16_is_nan(h));
    CHECK((h & 0x8000) == ((nans[i] >> 16) & 0x8000));
    CHECK(isnan(em_bf16_to_f32(h)));
  }
  CHECK(bitsf(em_bf16_to_f32(0x3f80)) == 0x3f800000);
  CHECK(bitsf(em_bf16_to_f32(0x8000)) == 0x80000000);
  CHECK(bitsf(em_bf16_to_f32(0x7f7f)) == 0x7f7f0000);
  CHECK(bitsf(em_bf16_to_f32(0x0001)) == 0x00010000);
}

TEST(bf16_exhaustive_round_trip) {
  int bad = 0, nan_bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = em_bf16_to_f32((uint16_t)h);
    uint16_t back = em_f32_to_bf16(f);
    if (bf16_is_nan((uint16_t)h)) {
      if (!isnan(f) || !bf16_is_nan(back)) { if (!nan_bad++) fprintf(stderr, "  bf16 NaN 0x%04x lost\n", h); }
    } else if (back != h) {
      if (!bad++) fprintf(stderr, "  bf16 0x%04x -> %a -> 0x%04x\n", h, (double)f, back);
    }
  }
  CHECK(bad == 0);
  CHECK(nan_bad == 0);
}

/* ---------------- f16 ---------------- */

TEST(f16_round_to_nearest_even) {
  F16(1.0f, 0x3c00);
  F16(fbits(0x3f801000), 0x3c00);           /* 1 + 2^-11: tie, 0x3c00 even: down */
  F16(fbits(0x3f801001), 0x3c01);           /* just above the tie */
  F16(fbits(0x3f800fff), 0x3c00);
  F16(fbits(0x3f803000), 0x3c02);           /* 1 + 3*2^-11: tie, 0x3c01 odd: up */
  F16(-1.0f, 0xbc00);
  F16(fbits(0xbf803000), 0xbc02);
  F16(fbits(0x3fffffff), 0x4000);           /* carry into the exponent */
  F16(0.333333343f, 0x3555);
  F16(65504.0f, 0x7bff);                    /* max normal */
  F16(65519.0f, 0x7bff);
  F16(nextafterf(65520.0f, 0.0f), 0x7bff);  /* just below the overflow threshold */
  F16(65520.0f, 0x7c00);                    /* tie above max (odd): inf */
  F16(-65520.0f, 0xfc00);
  F16(65536.0f, 0x7c00);
  F16(1e10f, 0x7c00);
  F16(INFINITY, 0x7c00);
  F16(-INFINITY, 0xfc00);
  F16(FLT_MAX, 0x7c00);
  /* subnormals */
  F16(ldexpf(1, -14), 0x0400);              /* min normal */
  F16(ldexpf(1, -24), 0x0001);              /* min subnormal */
  F16(ldexpf(1, -25), 0x0000);              /* tie between 0 and 2^-24: to even (0) */
  F16(nextafterf(ldexpf(1, -25), 1.0f), 0x0001);
  F16(nextafterf(ldexpf(1, -25), 0.0f), 0x0000);
  F16(3 * ldexpf(1, -25), 0x0002);          /* 1.5 * 2^-24: tie -> 2^-23 */
  F16(5 * ldexpf(1, -25), 0x0002);          /* 2.5 * 2^-24: tie -> 2 (even) */
  F16(7 * ldexpf(1, -25), 0x0004);          /* 3.5 * 2^-24: tie -> 4 */
  F16(-ldexpf(1, -25), 0x8000);             /* rounds to -0 */
  F16(-3 * ldexpf(1, -25), 0x8002);
  F16(ldexpf(1, -14) - ldexpf(1, -25), 0x0400); /* 1023.5 * 2^-24: tie -> 1024 = min normal */
  F16(ldexpf(1, -14) - ldexpf(1, -24), 0x03ff); /* max subnormal */
  F16(ldexpf(1, -30), 0x0000);
  F16(1e-45f, 0x0000);                      /* f32 subnormal */
  F16(0.0f, 0x0000);
  F16(-0.0f, 0x8000);
  /* NaN stays NaN, sign kept */
  uint32_t nans[] = {0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7f801fff, 0x7fffffff};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    uint16_t h = em_f32_to_f16(fbits(nans[i]));
    CHECK(f16_is_nan(h));
    CHECK((h & 0x8000) == ((nans[i] >> 16) & 0x8000));
  }
  /* f16 -> f32 of crafted patterns */
  CHECK(em_f16_to_f32(0x0001) == ldexpf(1, -24));
  CHECK(em_f16_to_f32(0x8001) == -ldexpf(1, -24));
  CHECK(em_f16_to_f32(0x03ff) == 1023 * ldexpf(1, -24));
  CHECK(em_f16_to_f32(0x0400) == ldexpf(1, -14));
  CHECK(em_f16_to_f32(0x7bff) == 65504.0f);
  CHECK(em_f16_to_f32(0x3555) == 0.333251953125f);
  CHECK(isinf(em_f16_to_f32(0x7c00)) && em_f16_to_f32(0x7c00) > 0);
  CHECK(isinf(em_f16_to_f32(0xfc00)) && em_f16_to_f32(0xfc00) < 0);
  CHECK(bitsf(em_f16_to_f32(0x8000)) == 0x80000000);
  CHECK(isnan(em_f16_to_f32(0x7e00)) && isnan(em_f16_to_f32(0x7c01)) && isnan(em_f16_to_f32(0xfc01)));
}

TEST(f16_exhaustive_round_trip) {
  int bad = 0, nan_bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = em_f16_to_f32((uint16_t)h);
    uint16_t back = em_f32_to_f16(f);
    if (f16_is_nan((uint16_t)h)) {
      if (!isnan(f) || !f16_is_nan(back)) { if (!nan_bad++) fprintf(stderr, "  f16 NaN 0x%04x lost\n", h); }
    } else if (back != h) {
      if (!bad++) fprintf(stderr, "  f16 0x%04x -> %a -> 0x%04x\n", h, (double)f, back);
    }
  }
  CHECK(bad == 0);
  CHECK(nan_bad == 0);
}

/* Reference rounding of x to a binary format with mbits stored mantissa bits
 * and exponents emin..emax (subnormals below 2^emin), done in double with
 * nearbyint (round half to even in the default mode): all steps are exact. */
static double ref_round(double x, int mbits, int emin, int emax) {
  if (isnan(x) || isinf(x) || x == 0) return x;
  int e;
  frexp(fabs(x), &e);
  int lead = e - 1 < emin ? emin : e - 1;
  double q = ldexp(1.0, lead - mbits);
  double r = nearbyint(x / q) * q;
  if (fabs(r) >= ldexp(1.0, emax + 1)) return copysign(INFINITY, x);
  return r;
}

TEST(sweep_against_reference) {
  /* every 251st f32 bit pattern (~17M values, both signs, all exponents) */
  int bad16 = 0, badb = 0;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 251) {
    float f = fbits((uint32_t)u);
    if (isnan(f)) {
      if (!f16_is_nan(em_f32_to_f16(f))) bad16++;
      if (!bf16_is_nan(em_f32_to_bf16(f))) badb++;
      continue;
    }
    float r16 = (float)ref_round(f, 10, -14, 15), rb = (float)ref_round(f, 7, -126, 127);
    float g16 = em_f16_to_f32(em_f32_to_f16(f)), gb = em_bf16_to_f32(em_f32_to_bf16(f));
    if (bitsf(g16) != bitsf(r16)) { if (!bad16++) fprintf(stderr, "  f16(%a) = %a, ref %a\n", (double)f, (double)g16, (double)r16); }
    if (bitsf(gb) != bitsf(rb)) { if (!badb++) fprintf(stderr, "  bf16(%a) = %a, ref %a\n", (double)f, (double)gb, (double)rb); }
  }
  CHECK(bad16 == 0);
  CHECK(badb == 0);
  /* the reference itself agrees with the crafted cases (guards the sweep) */
  CHECK(ref_round(65520.0, 10, -14, 15) == INFINITY);
  CHECK(ref_round(ldexp(1, -25), 10, -14, 15) == 0);
  CHECK(ref_round(3 * ldexp(1, -25), 10, -14, 15) == ldexp(1, -23));
}

/* ---------------- promotion, names ---------------- */

static void expect_promote(em_dtype a, em_dtype b, em_dtype want, int line) {
  em_dtype x = em_promote(a, b), y = em_promote(b, a);
  test_checks++;
  if (x != want || y != want) {
    test_failures++;
    fprintf(stderr, "%s:%d: promote(%s, %s) = %s / %s, expected %s\n", __FILE__, line, em_dtype_name(a),
            em_dtype_name(b), em_dtype_name(x), em_dtype_name(y), em_dtype_name(want));
  }
}
#define PROMOTE(a, b, want) expect_promote(a, b, want, __LINE__)

TEST(promotion_table) {
  PROMOTE(EM_BF16, EM_F16, EM_F32);
  PROMOTE(EM_I64, EM_F32, EM_F32);
  PROMOTE(EM_U8, EM_I32, EM_I32);
  PROMOTE(EM_BOOL, EM_U8, EM_U8);
  PROMOTE(EM_F16, EM_F64, EM_F64);
  PROMOTE(EM_BF16, EM_F32, EM_F32);
  PROMOTE(EM_BF16, EM_F64, EM_F64);
  PROMOTE(EM_F32, EM_F64, EM_F64);
  PROMOTE(EM_I64, EM_BF16, EM_BF16);       /* a float type wins over any integer */
  PROMOTE(EM_I64, EM_F16, EM_F16);
  PROMOTE(EM_I32, EM_I64, EM_I64);
  PROMOTE(EM_U8, EM_I64, EM_I64);
  PROMOTE(EM_U8, EM_U16, EM_U16);
  PROMOTE(EM_BOOL, EM_I64, EM_I64);
  PROMOTE(EM_BOOL, EM_F16, EM_F16);
  PROMOTE(EM_BOOL, EM_BOOL, EM_BOOL);
  for (int t = 0; t < EM_NDTYPES; t++) PROMOTE((em_dtype)t, (em_dtype)t, (em_dtype)t);
}

TEST(names_and_aliases) {
  const char *names[EM_NDTYPES] = {"f32", "f64", "bf16", "f16", "i32", "i64", "u16", "u8", "bool"};
  const size_t sizes[EM_NDTYPES] = {4, 8, 2, 2, 4, 8, 2, 1, 1};
  for (int t = 0; t < EM_NDTYPES; t++) {
    em_dtype d = EM_NDTYPES;
    CHECK(strcmp(em_dtype_name((em_dtype)t), names[t]) == 0);
    CHECK(em_dtype_size((em_dtype)t) == sizes[t]);
    CHECK(em_dtype_from_name(names[t], &d) == 0 && d == (em_dtype)t);
  }
  struct { const char *s; em_dtype t; } al[] = {
    {"float32", EM_F32}, {"float", EM_F32}, {"float64", EM_F64}, {"double", EM_F64},
    {"bfloat16", EM_BF16}, {"float16", EM_F16}, {"half", EM_F16}, {"int32", EM_I32}, {"int", EM_I32},
    {"int64", EM_I64}, {"long", EM_I64}, {"uint8", EM_U8}, {"byte", EM_U8}, {"uint16", EM_U16},
  };
  for (size_t i = 0; i < sizeof al / sizeof al[0]; i++) {
    em_dtype d = EM_NDTYPES;
    int rc = em_dtype_from_name(al[i].s, &d);
    test_checks++;
    if (rc != 0 || d != al[i].t) {
      test_failures++;
      fprintf(stderr, "%s:%d: dtype_from_name(\"%s\") = %d, %d\n", __FILE__, __LINE__, al[i].s, rc, (int)d);
    }
  }
  const char *bad[] = {"", "F32", "float8", "int8", "complex64", "f32 ", "floa"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    em_dtype d = EM_F64;
    CHECK(em_dtype_from_name(bad[i], &d) == -1);
  }
  CHECK(em_dtype_is_float(EM_BF16) && em_dtype_is_float(EM_F16) && !em_dtype_is_float(EM_I64));
  CHECK(!em_dtype_is_float(EM_BOOL) && !em_dtype_is_int(EM_BOOL));
  CHECK(em_dtype_is_int(EM_U8) && em_dtype_is_int(EM_U16) && !em_dtype_is_int(EM_F32));
  CHECK(em_dtype_size(EM_NDTYPES) == 0 && strcmp(em_dtype_name(EM_NDTYPES), "?") == 0);
}

/* ---------------- float -> int ---------------- */

TEST(float_to_int_truncates) {
  const double v[] = {2.9, -2.9, 0.5, -0.5, -0.999, 7.0, -7.0, 1e-300, 255.75};
  const int64_t want[] = {2, -2, 0, 0, 0, 7, -7, 0, 255};
  em_dtype ints[] = {EM_I32, EM_I64};
  for (size_t k = 0; k < 2; k++) {
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
      int64_t buf = 0x5a5a5a5a5a5a5a5a;
      em_store_f64(&buf, ints[k], 0, v[i]);
      CHECK(em_load_i64(&buf, ints[k], 0) == want[i]);
    }
  }
  uint8_t b = 0;
  em_store_f64(&b, EM_U8, 0, 200.9);
  CHECK(b == 200);
  uint16_t w = 0;
  em_store_f64(&w, EM_U16, 0, 40000.99);
  CHECK(w == 40000);
  /* reading a float as an integer truncates too */
  float fs[3] = {-3.75f, 3.75f, NAN};
  CHECK(em_load_i64(fs, EM_F32, 0) == -3 && em_load_i64(fs, EM_F32, 1) == 3);
  uint16_t hb = em_f32_to_bf16(-5.5f), hh = em_f32_to_f16(5.5f);
  CHECK(em_load_i64(&hb, EM_BF16, 0) == -5 && em_load_i64(&hh, EM_F16, 0) == 5);
  /* bulk conversion (em_convert) and through tensors (em_to) agree */
  float src[6] = {1.5f, -1.5f, 2.999f, -2.999f, NAN, -0.0f};
  int32_t d32[6]; int64_t d64[6]; uint8_t d8[6];
  em_convert(d32, EM_I32, src, EM_F32, 6);
  em_convert(d64, EM_I64, src, EM_F32, 6);
  em_convert(d8, EM_U8, src, EM_F32, 6);
  const int64_t e[6] = {1, -1, 2, -2, 0, 0};
  for (int i = 0; i < 6; i++) { CHECK(d32[i] == e[i]); CHECK(d64[i] == e[i]); }
  CHECK(d8[0] == 1 && d8[2] == 2 && d8[4] == 0 && d8[5] == 0);
  int64_t shape[1] = {6};
  em_tensor *t = em_empty(1, shape, EM_F32, em_cpu());
  memcpy(em_data_ptr(t), src, sizeof src);
  em_tensor *ti = em_to(t, EM_I64, em_cpu());
  CHECK(ti && ti->dtype == EM_I64);
  for (int i = 0; ti && i < 6; i++) CHECK(((int64_t *)em_data_ptr(ti))[i] == e[i]);
  em_tensor_release(ti);
  em_tensor_release(t);
}

TEST(nan_and_inf_to_int_defined) {
  int64_t x = 123;
  em_store_f64(&x, EM_I64, 0, NAN);
  CHECK(x == 0);
  em_store_f64(&x, EM_I64, 0, -NAN);
  CHECK(x == 0);
  int32_t y = 123;
  em_store_f64(&y, EM_I32, 0, NAN);
  CHECK(y == 0);
  uint8_t z = 9;
  em_store_f64(&z, EM_U8, 0, NAN);
  CHECK(z == 0);
  double d = NAN;
  CHECK(em_load_i64(&d, EM_F64, 0) == 0);
  em_store_f64(&x, EM_I64, 0, INFINITY);
  CHECK(x == INT64_MAX);
  em_store_f64(&x, EM_I64, 0, -INFINITY);
  CHECK(x == INT64_MIN);
  em_store_f64(&x, EM_I64, 0, 1e300);
  CHECK(x == INT64_MAX);
  /* NaN -> bool is true (nonzero), as in PyTorch */
  uint8_t bo = 0;
  em_store_f64(&bo, EM_BOOL, 0, NAN);
  CHECK(bo == 1);
  em_store_f64(&bo, EM_BOOL, 0, -0.0);
  CHECK(bo == 0);
}

TEST(integer_conversions_exact) {
  /* i64 values beyond 2^53 convert between integer types without going through double */
  int64_t big[3] = {((int64_t)1 << 53) + 1, -(((int64_t)1 << 40) + 5), INT64_MAX};
  int64_t back[3];
  int32_t i32[3];
  em_convert(back, EM_I64, big, EM_I64, 3);
  CHECK(back[0] == big[0] && back[2] == INT64_MAX);
  em_convert(i32, EM_I32, big, EM_I64, 3);
  CHECK(i32[0] == 1 && i32[1] == (int32_t)big[1]);
  uint8_t u8[3];
  em_convert(u8, EM_U8, big, EM_I64, 3);
  CHECK(u8[0] == 1 && u8[2] == 0xff);
  /* bool <-> numbers */
  uint8_t bools[3] = {0, 1, 1};
  float f[3];
  em_convert(f, EM_F32, bools, EM_BOOL, 3);
  CHECK(f[0] == 0 && f[1] == 1 && f[2] == 1);
  int64_t iv[3] = {0, -7, 2};
  uint8_t bo[3];
  em_convert(bo, EM_BOOL, iv, EM_I64, 3);
  CHECK(bo[0] == 0 && bo[1] == 1 && bo[2] == 1);
  /* f32 -> bf16 bulk path rounds like the scalar one */
  float fx[2] = {fbits(0x3f808000), fbits(0x3f818000)};
  uint16_t hx[2];
  em_convert(hx, EM_BF16, fx, EM_F32, 2);
  CHECK(hx[0] == 0x3f80 && hx[1] == 0x3f82);
  double dx[2] = {65520.0, ldexp(1, -24)};
  uint16_t h16[2];
  em_convert(h16, EM_F16, dx, EM_F64, 2);
  CHECK(h16[0] == 0x7c00 && h16[1] == 0x0001);
}

int main(void) {
  RUN(bf16_round_to_nearest_even);
  RUN(bf16_exhaustive_round_trip);
  RUN(f16_round_to_nearest_even);
  RUN(f16_exhaustive_round_trip);
  RUN(sweep_against_reference);
  RUN(promotion_table);
  RUN(names_and_aliases);
  RUN(float_to_int_truncates);
  RUN(nan_and_inf_to_int_defined);
  RUN(integer_conversions_exact);
  TEST_MAIN_END();
}
