/* The random distributions of ember/rng.h, shared verbatim by the CPU
 * (engine/rng.c) and the CUDA kernels (kernels/rng.cu): part of the
 * engine -> CUDA boundary (backend.h holds the distribution type and the
 * launcher). One copy of the math (uniform, Box-Muller in f32 for
 * f32/bf16/f16 and in double for f64, erfinv) serves both devices, so
 * f32/bf16/f16 results agree bit for bit.
 *
 * On the device every product that feeds a sum is written with __dmul_rn /
 * __dadd_rn: nvcc would otherwise fuse them into FMAs (one rounding instead
 * of two) and the GPU would drift from the CPU by an ulp. The remaining
 * differences are the libraries' log/sin/cos/erf/erfc/exp in double (CUDA's
 * and glibc's agree within an ulp or two), far below f32's resolution. */
#ifndef EMBER_BACKEND_RNG_MATH_H
#define EMBER_BACKEND_RNG_MATH_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "backend.h"   /* em_rng_dist */
#include "ember/half.h"

/* ---- the shared math ---- */

#if defined(__CUDA_ARCH__)
#define EM_RNG_MUL(a, b) __dmul_rn((a), (b))
#define EM_RNG_ADD(a, b) __dadd_rn((a), (b))
#else
#define EM_RNG_MUL(a, b) ((a) * (b))
#define EM_RNG_ADD(a, b) ((a) + (b))
#endif

#define EM_RNG_PI 3.14159265358979323846
#define EM_RNG_SQRT2 1.41421356237309504880
#define EM_RNG_2_SQRTPI 1.12837916709551257390

static inline EM_HOSTDEV double em_rng_u24(uint32_t w) { return (double)(w >> 8) * 0x1p-24; }

/* erfinv in double: Giles' single-precision approximation ("Approximating the
 * erfinv function", GPU Computing Gems, 2011) as the start, then Newton steps
 * until the step is below an ulp: on erf(x) = y in the body, on ln erfc(x) =
 * ln(1 - |y|) for |y| > 0.9 (1 - |y| is exact there, and the log keeps Newton
 * quadratic in the tail, where plain erfc steps crawl). */
static inline EM_HOSTDEV double em_rng_erfinv(double y) {
  if (isnan(y) || y < -1 || y > 1) return NAN;
  if (y == 1) return INFINITY;
  if (y == -1) return -INFINITY;
  double w = -log((1.0 - y) * (1.0 + y)), p;
  if (w < 5) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = EM_RNG_ADD(3.43273939e-07, EM_RNG_MUL(p, w)); p = EM_RNG_ADD(-3.5233877e-06, EM_RNG_MUL(p, w));
    p = EM_RNG_ADD(-4.39150654e-06, EM_RNG_MUL(p, w)); p = EM_RNG_ADD(0.00021858087, EM_RNG_MUL(p, w));
    p = EM_RNG_ADD(-0.00125372503, EM_RNG_MUL(p, w)); p = EM_RNG_ADD(-0.00417768164, EM_RNG_MUL(p, w));
    p = EM_RNG_ADD(0.246640727, EM_RNG_MUL(p, w)); p = EM_RNG_ADD(1.50140941, EM_RNG_MUL(p, w));
  } else {
    w = sqrt(w) - 3;
    p = -0.000200214257;
    p = EM_RNG_ADD(0.000100950558, EM_RNG_MUL(p, w)); p = EM_RNG_ADD(0.00134934322, EM_RNG_MUL(p, w));
    p = EM_RNG_ADD(-0.00367342844, EM_RNG_MUL(p, w)); p = EM_RNG_ADD(0.00573950773, EM_RNG_MUL(p, w));
    p = EM_RNG_ADD(-0.0076224613, EM_RNG_MUL(p, w)); p = EM_RNG_ADD(0.00943887047, EM_RNG_MUL(p, w));
    p = EM_RNG_ADD(1.00167406, EM_RNG_MUL(p, w)); p = EM_RNG_ADD(2.83297682, EM_RNG_MUL(p, w));
  }
  double x = p * y, ay = fabs(y), s = y < 0 ? -1 : 1, t = 1.0 - ay;   /* t exact for ay >= 0.5 */
  for (int it = 0; it < 8; it++) {
    double ax = fabs(x), d = EM_RNG_2_SQRTPI * exp(-ax * ax), step;
    if (ay > 0.9) {   /* tail: Newton on ln erfc(x) = ln t converges quadratically where erfc is tiny */
      double c = erfc(ax);
      step = -(log(c) - log(t)) * c / d;
    } else {
      step = (erf(ax) - ay) / d;
    }
    x = s * (ax - step);
    if (fabs(step) <= 1e-16 * ax) break;
  }
  return x;
}

/* dropout and bernoulli: element j is kept (is 1) when u(w_j) < q, with
 * q = 1 - p for dropout and q = p_j for bernoulli, compared in double. */
static inline EM_HOSTDEV int em_rng_below(uint32_t w, double q) { return em_rng_u24(w) < q; }
/* The same test with integers: em_rng_below(w, q) == ((w >> 8) < em_rng_keep_threshold(q)) for every w
 * and q. u(w) = m 2^-24 (m = w >> 8 < 2^24) is below q exactly when the integer m is below q 2^24 (exact in
 * double), that is below its ceiling; NaN and q <= 0 keep nothing, q >= 1 keeps all. For the kernels, which
 * would otherwise convert every word to double. */
static inline EM_HOSTDEV uint32_t em_rng_keep_threshold(double q) {
  if (!(q > 0)) return 0;
  if (q >= 1) return 1u << 24;
  return (uint32_t)ceil(q * 0x1p24);
}
/* One compare a word on the device: for thr >= 1, w <= em_rng_keep_limit(thr) is (w >> 8) < thr (thr = 2^24:
 * the limit is 2^32 - 1, every word). For thr = 0 it holds for every word as well, so a caller makes a
 * kept element equal a dropped one then (dropout's scale, bernoulli's `one`, are 0). */
static inline EM_HOSTDEV uint32_t em_rng_keep_limit(uint32_t thr) { return (uint32_t)(((uint64_t)thr << 8) - 1); }

/* multinomial and randperm take 64-bit draws: two words of a block per
 * element (element e uses block e / 2, words 2(e%2) and 2(e%2)+1). */
static inline EM_HOSTDEV uint64_t em_rng_u64(const em_philox_block *b, int half) {
  return (uint64_t)b->v[2 * half] | ((uint64_t)b->v[2 * half + 1] << 32);
}
/* multinomial's race key p / E, E = -log(1 - u) ~ Exp(1) with u of 53 bits:
 * the largest key over a row is category j with probability p_j / sum p. */
static inline EM_HOSTDEV double em_rng_race_key(double p, uint64_t r) {
  double u = (double)(r >> 11) * 0x1p-53;
  return p > 0 ? p / -log1p(-u) : 0.0;
}

/* Philox blocks ctr .. ctr + nb - 1 (nb <= 4, a constant where it matters: the device callers unroll it) into
 * out[0 .. nb), em_philox4x32_10's bits, with less multiply work when the nb counters share their high word
 * (lo = ctr mod 2^32 <= 2^32 - nb, always but once in 2^32 / nb): the first round's two products are M0 (lo + k)
 * = M0 lo + M0 k, one product and 64-bit adds of constants (M1 c2 is 0: c2 = c3 = 0), and it leaves c0 =
 * hi ^ k0 in every block, so the second round's M0 c0 is one product for all nb. 2 + 17 nb 32x32 products
 * instead of 19 nb (the multiply pipe bounds the Philox fills: docs/perf.md). `shared` = 0 (EMBER_PHILOX_RUN_OLD
 * in the kernels) takes the plain blocks, as does a run that crosses a multiple of 2^32. */
/* For the CUDA launches, host side: whether em_philox_run may share the first rounds' products
 * (EMBER_PHILOX_RUN_OLD=1: not, every block computed whole as before; the same bits either way). */
static inline int em_philox_run_shared(void) {
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("EMBER_PHILOX_RUN_OLD");
    on = !(e && *e && e[0] != '0');
  }
  return on;
}
static inline EM_HOSTDEV void em_philox_round(uint32_t *c, uint32_t k0, uint32_t k1) {
  const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
#if defined(__CUDA_ARCH__)
  const uint32_t hi0 = __umulhi(M0, c[0]), lo0 = M0 * c[0], hi1 = __umulhi(M1, c[2]), lo1 = M1 * c[2];
#else
  const uint64_t p0 = (uint64_t)M0 * c[0], p1 = (uint64_t)M1 * c[2];
  const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
#endif
  const uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
  c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
}
static inline EM_HOSTDEV void em_philox_run(uint64_t ctr, int nb, int shared, uint32_t k0, uint32_t k1,
                                            em_philox_block *out) {
  const uint32_t M0 = 0xD2511F53u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  const uint32_t lo = (uint32_t)ctr, hi = (uint32_t)(ctr >> 32);
  if (!shared || lo > 0xFFFFFFFFu - (uint32_t)(nb - 1)) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < 4; k++)
      if (k < nb) {
        const uint64_t c = ctr + (uint64_t)k;
        out[k] = em_philox4x32_10((uint32_t)c, (uint32_t)(c >> 32), 0, 0, k0, k1);
      }
    return;
  }
  uint32_t st[4][4];
  /* round 1 (key k0, k1): c = (lo + k, hi, 0, 0) -> (hi ^ k0, 0, hi(M0 (lo + k)) ^ k1, lo(M0 (lo + k))) */
  const uint64_t p = (uint64_t)M0 * lo;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 4; k++) {
    if (k >= nb) break;
    const uint64_t pk = p + (uint64_t)M0 * (uint32_t)k;   /* M0 (lo + k) exactly: lo + k < 2^32 */
    st[k][2] = (uint32_t)(pk >> 32) ^ k1;
    st[k][3] = (uint32_t)pk;
  }
  /* round 2: c0 = hi ^ k0 and c1 = 0 in every block, so M0 c0 is one product */
  const uint32_t c0 = hi ^ k0;
  k0 += W0; k1 += W1;
  {
    const uint64_t q = (uint64_t)M0 * c0;
    const uint32_t hi0 = (uint32_t)(q >> 32), lo0 = (uint32_t)q, M1 = 0xCD9E8D57u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < 4; k++) {
      if (k >= nb) break;
#if defined(__CUDA_ARCH__)
      const uint32_t hi1 = __umulhi(M1, st[k][2]), lo1 = M1 * st[k][2];
#else
      const uint64_t p1 = (uint64_t)M1 * st[k][2];
      const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
#endif
      const uint32_t n0 = hi1 ^ k0, n2 = hi0 ^ st[k][3] ^ k1;   /* c1 = 0 after round 1 */
      st[k][0] = n0; st[k][1] = lo1; st[k][2] = n2; st[k][3] = lo0;
    }
  }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 2; r < 10; r++) {
    k0 += W0; k1 += W1;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int k = 0; k < 4; k++)
      if (k < nb) em_philox_round(st[k], k0, k1);
  }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 4; k++)
    if (k < nb) { out[k].v[0] = st[k][0]; out[k].v[1] = st[k][1]; out[k].v[2] = st[k][2]; out[k].v[3] = st[k][3]; }
}

/* The key and first counter of a CUDA op's stream (backend.h, em_philox_state):
 * read from the capturing graph's device cell when there is one. */
#if defined(__CUDACC__)
static inline __device__ void em_philox_resolve(const em_philox_state &s, uint64_t *seed, uint64_t *ctr0) {
  if (s.cell) { *seed = s.cell[0]; *ctr0 = s.cell[1] + s.offset; }
  else { *seed = s.seed; *ctr0 = s.offset; }
}
#endif

/* uniform_/rand: a value that rounds to hi in the tensor's dtype (bf16/f16
 * near 1, say) is replaced by lo -- PyTorch's rule on CUDA -- so every dtype
 * draws from [lo, hi). `stored` is the value as stored (rounded). */
static inline EM_HOSTDEV int em_rng_uniform_hits_hi(const em_rng_dist *d, double stored) {
  return d->kind == EM_RNG_UNIFORM && stored == d->p1 && d->p1 > d->p0;
}

/* For the CUDA fills (kernels/rng.cu), host side: the smallest f32 z whose value stored in dtype dt (f32,
 * bf16, f16, by the CPU's round-to-nearest-even conversions) is >= hi, when uniform_'s rule above can fire
 * (hi > lo and hi exact in the dtype), else NaN. Every f32 value z = (float)(lo + (hi - lo) u) of a fill is
 * <= hi (u <= 1 - 2^-24 keeps the double below hi, and rounding is monotone), so "z >= bound" is "z is
 * stored as hi": one compare before the rounding. Found by bisection over the f32 patterns in order. */
static inline double em_rng_stored_f32(float z, int dt) {
  if (dt == EM_BF16) return em_bf16_to_f32(em_f32_to_bf16(z));
  if (dt == EM_F16) return em_f16_to_f32(em_f32_to_f16(z));
  return z;
}
static inline float em_rng_ordered_f32(int64_t key) {   /* -(2^31 - 1) .. 2^31 - 1: the floats in order, -0 skipped */
  return em_bits_f32(key >= 0 ? (uint32_t)key : 0x80000000u | (uint32_t)(-key));
}
static inline float em_rng_hi_bound(const em_rng_dist *d, int dt) {
  const double hi = d->p1;
  if (d->kind != EM_RNG_UNIFORM || !(hi > d->p0) || (double)(float)hi != hi || em_rng_stored_f32((float)hi, dt) != hi)
    return NAN;
  const uint32_t hu = em_f32_bits((float)hi);
  int64_t lo_k = -(int64_t)0x7f800000;                                      /* -inf: stored below hi */
  int64_t hi_k = (hu & 0x80000000u) ? -(int64_t)(hu & 0x7fffffffu) : (int64_t)hu;   /* hi: stored as hi */
  while (hi_k - lo_k > 1) {                                                  /* stored(lo_k) < hi <= stored(hi_k) */
    const int64_t mid = lo_k + (hi_k - lo_k) / 2;
    if (em_rng_stored_f32(em_rng_ordered_f32(mid), dt) >= hi) hi_k = mid;
    else lo_k = mid;
  }
  return em_rng_ordered_f32(hi_k);
}

/* For the CUDA fills, host side: whether uniform_'s f32/bf16/f16 values (float)(lo + span u24(w)), computed
 * in double (em_rng_block_uniform), are one FFMA fmaf(span_s, m, lo) for u24 = m 2^-24, bit for bit: lo and
 * span = hi - lo exact in f32, span_s = span 2^-24 a normal f32 (or span 0), and the double product and sum
 * exact (span u has at most 48 significant bits; the sum's bits lie between the top of |lo| + |span| and the
 * lowest set bit e of lo or of span 2^-24: at most 53 of them). Then both round the exact value once to f32
 * (ties to even, signed zeros alike). Sets *span_s when true. */
static inline int em_rng_lsb_exp(double x) {   /* the exponent of the last set bit of x (finite, nonzero, an f32) */
  int ex;
  const double f = frexp(fabs(x), &ex);         /* |x| = f 2^ex, f in [0.5, 1) */
  int64_t m = (int64_t)ldexp(f, 24);             /* exact: at most 24 significant bits */
  ex -= 24;
  while (!(m & 1)) { m >>= 1; ex++; }
  return ex;
}
static inline int em_rng_uniform_f32_exact(const em_rng_dist *d, float *span_s) {
  const double lo = d->p0, span = d->p1 - d->p0;
  if (!isfinite(lo) || !isfinite(span) || (double)(float)lo != lo || (double)(float)span != span) return 0;
  const float ss = (float)span * 0x1p-24f;
  if ((double)ss * 0x1p24 != span || (span != 0 && fabs(span) < 0x1p-102)) return 0;   /* exact and normal */
  if (span != 0) {   /* span 0: lo + 0 is lo (+0 for -0) on both */
    int e = em_rng_lsb_exp(span) - 24;
    if (lo != 0 && em_rng_lsb_exp(lo) < e) e = em_rng_lsb_exp(lo);
    if (!(fabs(lo) + fabs(span) <= ldexp(1.0, 52 + e))) return 0;
  }
  *span_s = ss;
  return 1;
}

/* ---- normal_/randn in f32 (f32/bf16/f16 tensors) ----
 * Box-Muller in single precision, bit-identical on the CPU and the GPU
 * without relying on either device's math library: every operation is an
 * IEEE f32 +, -, *, / or sqrt (correctly rounded everywhere), written
 * through EM_F32_* so nvcc cannot fuse a product into an FMA (the CPU
 * build has -ffp-contract=off), plus integer bit operations. No fmaf:
 * tests/lua/rng_spec.lua re-derives the values in Lua, where an f32 op is
 * one double op rounded to f32 (exact for + - * / sqrt, not for fma).
 * Accuracy, exhaustively over the 2^24 inputs (docs/perf.md): logf within
 * 0.83 ulp, sin/cos within 1.72 ulp of the exact values. */
#if defined(__CUDA_ARCH__)
#define EM_F32_MUL(a, b) __fmul_rn((a), (b))
#define EM_F32_ADD(a, b) __fadd_rn((a), (b))
#define EM_F32_SUB(a, b) __fsub_rn((a), (b))
#define EM_F32_DIV(a, b) __fdiv_rn((a), (b))
#define EM_F32_SQRT(a) __fsqrt_rn(a)
static inline __device__ uint32_t em_rng_f2u(float x) { return __float_as_uint(x); }
static inline __device__ float em_rng_u2f(uint32_t u) { return __uint_as_float(u); }
#else
#define EM_F32_MUL(a, b) ((float)(a) * (float)(b))
#define EM_F32_ADD(a, b) ((float)(a) + (float)(b))
#define EM_F32_SUB(a, b) ((float)(a) - (float)(b))
#define EM_F32_DIV(a, b) ((float)(a) / (float)(b))
#define EM_F32_SQRT(a) sqrtf(a)
static inline uint32_t em_rng_f2u(float x) { union { float f; uint32_t u; } c; c.f = x; return c.u; }
static inline float em_rng_u2f(uint32_t u) { union { float f; uint32_t u; } c; c.u = u; return c.f; }
#endif

/* ln x for x = m 2^-24, 1 <= m <= 2^24 (1 - u: positive, normal, <= 1).
 * FreeBSD's logf: x = 2^k (1 + f) with 1 + f in [sqrt(2)/2, sqrt(2)),
 * s = f / (2 + f), ln(1 + f) = f - f^2/2 + s (f^2/2 + R(s^2)), R a minimax
 * polynomial; k ln 2 in two parts (ln2_hi has 17 significant bits and
 * |k| <= 24, so k * ln2_hi is exact). */
static inline EM_HOSTDEV float em_rng_logf(float x) {
  const float ln2_hi = 0x1.62e3p-1f, ln2_lo = 0x1.2fefa2p-17f;              /* 0x3f317180, 0x3717f7d1 */
  const float Lg1 = 0x1.555554p-1f, Lg2 = 0x1.999c26p-2f, Lg3 = 0x1.23d3dcp-2f, Lg4 = 0x1.f13c4cp-3f;
  uint32_t ix = em_rng_f2u(x);
  int k = (int)(ix >> 23) - 127;
  ix &= 0x007fffffu;
  const uint32_t i = (ix + 0x4afb20u) & 0x800000u;                          /* mantissa >= sqrt(2) - 1 */
  const float m = em_rng_u2f(ix | (i ^ 0x3f800000u));                       /* x or x / 2 scaled to [0.707, 1.414) */
  k += (int)(i >> 23);
  const float f = EM_F32_SUB(m, 1.0f);                                       /* exact */
  const float s = EM_F32_DIV(f, EM_F32_ADD(2.0f, f));
  const float z = EM_F32_MUL(s, s), w = EM_F32_MUL(z, z);
  const float t1 = EM_F32_MUL(w, EM_F32_ADD(Lg2, EM_F32_MUL(w, Lg4)));
  const float t2 = EM_F32_MUL(z, EM_F32_ADD(Lg1, EM_F32_MUL(w, Lg3)));
  const float R = EM_F32_ADD(t2, t1);
  const float hfsq = EM_F32_MUL(EM_F32_MUL(0.5f, f), f);
  const float dk = (float)k;
  /* dk ln2_hi - ((hfsq - (s (hfsq + R) + dk ln2_lo)) - f) */
  const float inner = EM_F32_ADD(EM_F32_MUL(s, EM_F32_ADD(hfsq, R)), EM_F32_MUL(dk, ln2_lo));
  return EM_F32_SUB(EM_F32_MUL(dk, ln2_hi), EM_F32_SUB(EM_F32_SUB(hfsq, inner), f));
}

/* sin and cos of 2 pi u for u = m 2^-24, 0 <= m < 2^24: exact range
 * reduction in integers, u = j/4 + r with j = round(4u) and |r| <= 1/8 turn
 * (r = (m - j 2^22) 2^-24, exact), then Taylor polynomials in r (turns: the
 * coefficients are (2 pi)^n / n!, so no 2 pi product rounds) of degree 9 (sin,
 * truncation < 2e-9) and 10 (cos, < 1.2e-10), and the quadrant's swap/sign. */
static inline EM_HOSTDEV void em_rng_sincos2pi(uint32_t m, float *sn, float *cs) {
  const float S1 = 0x1.921fb6p+2f, S3 = -0x1.4abbcep+5f, S5 = 0x1.466bc6p+6f,
              S7 = -0x1.32d2ccp+6f, S9 = 0x1.507834p+5f;   /* (-1)^k (2 pi)^n / n! in f32 */
  const float C2 = -0x1.3bd3ccp+4f, C4 = 0x1.03c1fp+6f, C6 = -0x1.55d3c8p+6f,
              C8 = 0x1.e1f506p+5f, C10 = -0x1.a6d1f2p+4f;
  const uint32_t j = (m + 0x200000u) >> 22;                                  /* 0..4 */
  const float r = (float)((int32_t)m - (int32_t)(j << 22)) * 0x1p-24f;       /* exact, |r| <= 1/8 */
  const float r2 = EM_F32_MUL(r, r);
  float ps = EM_F32_ADD(S7, EM_F32_MUL(r2, S9));
  ps = EM_F32_ADD(S5, EM_F32_MUL(r2, ps));
  ps = EM_F32_ADD(S3, EM_F32_MUL(r2, ps));
  ps = EM_F32_ADD(S1, EM_F32_MUL(r2, ps));
  const float sr = EM_F32_MUL(r, ps);
  float pc = EM_F32_ADD(C8, EM_F32_MUL(r2, C10));
  pc = EM_F32_ADD(C6, EM_F32_MUL(r2, pc));
  pc = EM_F32_ADD(C4, EM_F32_MUL(r2, pc));
  pc = EM_F32_ADD(C2, EM_F32_MUL(r2, pc));
  const float cr = EM_F32_ADD(1.0f, EM_F32_MUL(r2, pc));
  /* quadrant j & 3: (sin, cos) = (sr, cr), (cr, -sr), (-sr, -cr), (-cr, sr): a swap for odd j, then
   * sign flips (exact: the sign bit) for sin in quadrants 2, 3 and cos in 1, 2 -- no branches or
   * four-way selects on the device */
  const uint32_t q = j & 3u, swap = q & 1u;
  const float a = swap ? cr : sr, b = swap ? sr : cr;
  *sn = em_rng_u2f(em_rng_f2u(a) ^ ((q >> 1) << 31));
  *cs = em_rng_u2f(em_rng_f2u(b) ^ (((q ^ (q >> 1)) & 1u) << 31));
}

/* The four standard normals of a block (words (0,1) -> elements 0, 1;
 * (2,3) -> 2, 3), then mean + std z in f32 (two roundings). */
static inline EM_HOSTDEV void em_rng_block_normal_f32(const em_rng_dist *d, const em_philox_block *b, float *v) {
  const float mean = (float)d->p0, sd = (float)d->p1;
  for (int k = 0; k < 4; k += 2) {
    const float x = EM_F32_SUB(1.0f, (float)(b->v[k] >> 8) * 0x1p-24f);     /* exact, in (0, 1] */
    const float r = EM_F32_SQRT(EM_F32_MUL(-2.0f, em_rng_logf(x)));
    float sn, cs;
    em_rng_sincos2pi(b->v[k + 1] >> 8, &sn, &cs);
    v[k] = EM_F32_ADD(mean, EM_F32_MUL(sd, EM_F32_MUL(r, cs)));
    v[k + 1] = EM_F32_ADD(mean, EM_F32_MUL(sd, EM_F32_MUL(r, sn)));
  }
}

/* The values of a block's four elements as doubles, one function per
 * distribution (the CUDA kernels are instantiated per distribution, so the
 * uniform fill does not carry Box-Muller's and erfinv's registers). */
static inline EM_HOSTDEV void em_rng_block_uniform(const em_rng_dist *d, const em_philox_block *b, double *v) {
  for (int k = 0; k < 4; k++) v[k] = EM_RNG_ADD(d->p0, EM_RNG_MUL(d->p1 - d->p0, em_rng_u24(b->v[k])));
}
/* normal_ of an f64 tensor: Box-Muller in double (libm's log, sin, cos). */
static inline EM_HOSTDEV void em_rng_block_normal(const em_rng_dist *d, const em_philox_block *b, double *v) {
  for (int k = 0; k < 4; k += 2) {
    double r = sqrt(-2.0 * log(1.0 - em_rng_u24(b->v[k]))), th = 2.0 * EM_RNG_PI * em_rng_u24(b->v[k + 1]);
    v[k] = EM_RNG_ADD(d->p0, EM_RNG_MUL(d->p1, r * cos(th)));
    v[k + 1] = EM_RNG_ADD(d->p0, EM_RNG_MUL(d->p1, r * sin(th)));
  }
}
static inline EM_HOSTDEV void em_rng_block_trunc(const em_rng_dist *d, const em_philox_block *b, double *v) {
  for (int k = 0; k < 4; k++) {
    double u = EM_RNG_ADD(d->v0, EM_RNG_MUL(d->v1 - d->v0, em_rng_u24(b->v[k])));
    double x = EM_RNG_ADD(EM_RNG_MUL(em_rng_erfinv(u), d->p1 * EM_RNG_SQRT2), d->p0);
    v[k] = x < d->a ? d->a : x > d->b ? d->b : x;
  }
}
/* f64: whether the tensor is f64 (normal_ in double) or f32/bf16/f16 (in f32,
 * the values exact as doubles). */
static inline EM_HOSTDEV void em_rng_block_values(const em_rng_dist *d, const em_philox_block *b, double *v,
                                                  int f64) {
  switch (d->kind) {
    case EM_RNG_UNIFORM: em_rng_block_uniform(d, b, v); break;
    case EM_RNG_NORMAL:
      if (f64) em_rng_block_normal(d, b, v);
      else {
        float z[4];
        em_rng_block_normal_f32(d, b, z);
        for (int k = 0; k < 4; k++) v[k] = z[k];
      }
      break;
    case EM_RNG_TRUNC: em_rng_block_trunc(d, b, v); break;
    default: break;
  }
}

#endif
