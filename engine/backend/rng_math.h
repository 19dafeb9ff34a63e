/* The random distributions of ember/rng.h, shared verbatim by the CPU
 * (engine/rng.c) and the CUDA kernels (kernels/rng.cu): part of the
 * engine -> CUDA boundary (backend.h holds the distribution type and the
 * launcher). One copy of the double-precision math (uniform, Box-Muller,
 * erfinv) serves both devices, so f32/bf16 results agree bit for bit.
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
#include "backend.h"   /* em_rng_dist */

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

/* The values of a block's four elements as doubles, one function per
 * distribution (the CUDA kernels are instantiated per distribution, so the
 * uniform fill does not carry Box-Muller's and erfinv's registers). */
static inline EM_HOSTDEV void em_rng_block_uniform(const em_rng_dist *d, const em_philox_block *b, double *v) {
  for (int k = 0; k < 4; k++) v[k] = EM_RNG_ADD(d->p0, EM_RNG_MUL(d->p1 - d->p0, em_rng_u24(b->v[k])));
}
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
static inline EM_HOSTDEV void em_rng_block_values(const em_rng_dist *d, const em_philox_block *b, double *v) {
  switch (d->kind) {
    case EM_RNG_UNIFORM: em_rng_block_uniform(d, b, v); break;
    case EM_RNG_NORMAL: em_rng_block_normal(d, b, v); break;
    case EM_RNG_TRUNC: em_rng_block_trunc(d, b, v); break;
    default: break;
  }
}

#endif
