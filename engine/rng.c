/* The global Philox generator and the random ops (rand, randn, randint,
 * uniform_, normal_, trunc_normal_).
 *
 * Counter-based on purpose: a draw is a pure function of (seed, first counter,
 * element index), so the CUDA kernels reproduce the CPU stream exactly, a draw
 * can be split over threads/blocks without coordination, and the generator
 * state is two integers (seed, offset) that checkpoints save. Each op reserves
 * its blocks with one atomic add on the offset, then fills; the stream layout
 * is documented at the top of ember/rng.h and is a contract: change it only
 * together with the CUDA kernels and the known-answer tests.
 *
 * Values are computed in double and rounded once to the tensor's dtype
 * (through f32 for bf16/f16), except normal_/randn into f32/bf16/f16, which
 * run Box-Muller in f32 (rng_math.h). */
#include <stdatomic.h>
#include "internal.h"
#include "parallel.h"
#include "backend/rng_math.h"   /* the distributions, shared with kernels/rng.cu */

/* ---------------- the generator ---------------- */

#define EM_DEFAULT_SEED 0x5eedu

static _Atomic uint64_t rng_seed = EM_DEFAULT_SEED;
static _Atomic uint64_t rng_offset = 0;

void em_manual_seed(uint64_t seed) { em_rng_set_state(seed, 0); }
uint64_t em_rng_seed(void) { return atomic_load(&rng_seed); }
uint64_t em_rng_offset(void) { return atomic_load(&rng_offset); }

void em_rng_set_state(uint64_t seed, uint64_t offset) {
  atomic_store(&rng_seed, seed);
  atomic_store(&rng_offset, offset);
}

uint64_t em_rng_reserve(uint64_t blocks) { return atomic_fetch_add(&rng_offset, blocks); }

/* During a CUDA graph capture nothing runs, so nothing is reserved here: the
 * graph reserves its whole range from this generator at each replay. */
em_philox_state em_rng_cuda_state(uint64_t blocks) {
  em_philox_state s = {0, 0, NULL};
  s.cell = em_cuda_graph_rng_reserve(blocks, &s.offset);
  if (!s.cell) { s.seed = em_rng_seed(); s.offset = em_rng_reserve(blocks); }
  return s;
}

/* ---------------- distributions ---------------- */

/* The distributions and their double-precision math live in backend/rng_math.h,
 * one source shared with the CUDA kernels (so both devices agree bit for bit). */
typedef em_rng_dist dist;
enum { D_UNIFORM = EM_RNG_UNIFORM, D_NORMAL = EM_RNG_NORMAL, D_TRUNC = EM_RNG_TRUNC, D_RANDINT = EM_RNG_RANDINT };

static double norm_cdf(double x) { return (1.0 + erf(x / M_SQRT2)) / 2.0; }



/* Fill elements [j_begin, j_end) of a contiguous run of dtype dt whose
 * element 0 draws from counter ctr0 (j_begin a multiple of the block's
 * elements, so a range starts on a block). */
static void cpu_fill_range(void *dst, em_dtype dt, int64_t j_begin, int64_t j_end, uint64_t seed, uint64_t ctr0,
                           const dist *d) {
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  bool wide = d->kind == D_RANDINT && d->span > 0x100000000ull;
  int per = wide ? 2 : 4;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += per) {
    uint64_t c = ctr0 + (uint64_t)(j0 / per);
    em_philox_block b = em_philox4x32_10((uint32_t)c, (uint32_t)(c >> 32), 0, 0, k0, k1);
    int cnt = (int)EM_MIN((int64_t)per, j_end - j0);
    if (d->kind == D_RANDINT) {
      for (int k = 0; k < cnt; k++) {
        uint64_t u = wide ? ((uint64_t)b.v[2 * k] | ((uint64_t)b.v[2 * k + 1] << 32)) : b.v[k];
        em_store_i64(dst, dt, j0 + k, (int64_t)((uint64_t)d->lo + u % d->span));
      }
      continue;
    }
    double v[4];
    em_rng_block_values(d, &b, v, dt == EM_F64);
    for (int k = 0; k < cnt; k++) {
      em_store_f64(dst, dt, j0 + k, v[k]);
      if (d->kind == D_UNIFORM && em_rng_uniform_hits_hi(d, em_load_f64(dst, dt, j0 + k)))
        em_store_f64(dst, dt, j0 + k, d->p0);   /* [lo, hi) in every dtype */
    }
  }
}

typedef struct { void *dst; em_dtype dt; int64_t n; uint64_t seed, ctr0; const dist *d; int per; } fill_job;

static void fill_blocks(void *ctx, int64_t b0, int64_t b1) {
  const fill_job *f = ctx;
  cpu_fill_range(f->dst, f->dt, b0 * f->per, EM_MIN(b1 * f->per, f->n), f->seed, f->ctr0, f->d);
}

/* Fill n contiguous elements from counter ctr0 on, a range of Philox blocks a
 * thread: each element's draw depends on its index only, so the bits are the
 * same at any thread count. */
static void cpu_fill(void *dst, em_dtype dt, int64_t n, uint64_t seed, uint64_t ctr0, const dist *d) {
  int per = (d->kind == D_RANDINT && d->span > 0x100000000ull) ? 2 : 4;
  fill_job f = {dst, dt, n, seed, ctr0, d, per};
  /* a block: one Philox call (~100 simple operations) and `per` maps */
  em_parallel_for((n + per - 1) / per, em_grain(128), fill_blocks, &f);
}

static uint64_t blocks_for(const dist *d, int64_t n) {
  int per = (d->kind == D_RANDINT && d->span > 0x100000000ull) ? 2 : 4;
  return (uint64_t)((n + per - 1) / per);
}

/* Reserve the stream for t's elements (in logical row-major order) and fill t. */
static int fill(const char *op, em_tensor *t, const dist *d) {
  int64_t n = em_numel(t);
  if (t->device.type != EM_CPU)   /* the same stream, drawn on the device (capturable) */
    return em_rng_fill_cuda(t, d, em_rng_cuda_state(blocks_for(d, n)));
  uint64_t seed = em_rng_seed(), ctr0 = em_rng_reserve(blocks_for(d, n));
  if (em_is_contiguous(t)) { cpu_fill(em_data_ptr(t), t->dtype, n, seed, ctr0, d); return 0; }
  em_tensor *tmp = em_empty(t->ndim, t->shape, t->dtype, t->device);
  if (!tmp) return -1;
  cpu_fill(em_data_ptr(tmp), tmp->dtype, n, seed, ctr0, d);
  bool g = em_set_grad_enabled(false);
  int rc = em_copy_(t, tmp);
  em_set_grad_enabled(g);
  em_tensor_release(tmp);
  return rc;
}

static int check_float_tensor(const char *op, const em_tensor *t) {
  if (!t) return em_error("%s: expected a tensor, got NULL", op);
  if (!em_dtype_is_float(t->dtype))
    return em_error("%s: expected a floating-point tensor (f32, f64, bf16, f16), got %s", op, em_dtype_name(t->dtype));
  return em_check_inplace(op, t);
}

/* ---------------- in-place fills ---------------- */

int em_uniform_(em_tensor *t, double lo, double hi) {
  EM_OP_SCOPE("uniform_");
  if (check_float_tensor("uniform_", t)) return -1;
  if (!(lo <= hi) || !isfinite(lo) || !isfinite(hi))
    return em_error("uniform_: expected finite lo <= hi, got lo=%g and hi=%g", lo, hi);
  em_bump_version(t);
  dist d = {.kind = D_UNIFORM, .p0 = lo, .p1 = hi};
  return fill("uniform_", t, &d);
}

int em_normal_(em_tensor *t, double mean, double std) {
  EM_OP_SCOPE("normal_");
  if (check_float_tensor("normal_", t)) return -1;
  if (!(std >= 0) || !isfinite(std) || !isfinite(mean))
    return em_error("normal_: expected a finite mean and std >= 0, got mean=%g and std=%g", mean, std);
  em_bump_version(t);
  dist d = {.kind = D_NORMAL, .p0 = mean, .p1 = std};
  return fill("normal_", t, &d);
}

/* nn.init.trunc_normal_: u ~ U[2 Phi(a') - 1, 2 Phi(b') - 1], x = erfinv(u) std sqrt2 + mean,
 * clamped to [a, b]; a' = (a - mean) / std. */
int em_trunc_normal_(em_tensor *t, double mean, double std, double a, double b) {
  EM_OP_SCOPE("trunc_normal_");
  if (check_float_tensor("trunc_normal_", t)) return -1;
  if (!(std >= 0) || !isfinite(std) || !isfinite(mean))
    return em_error("trunc_normal_: expected a finite mean and std >= 0, got mean=%g and std=%g", mean, std);
  if (!(a <= b)) return em_error("trunc_normal_: expected a <= b, got a=%g and b=%g", a, b);
  em_bump_version(t);
  dist d = {.kind = D_TRUNC, .p0 = mean, .p1 = std, .a = a, .b = b};
  if (std == 0) { d.v0 = d.v1 = 0; }   /* every value is mean, clamped */
  else { d.v0 = 2 * norm_cdf((a - mean) / std) - 1; d.v1 = 2 * norm_cdf((b - mean) / std) - 1; }
  return fill("trunc_normal_", t, &d);
}

/* ---------------- creation ---------------- */

static em_tensor *random_float(const char *op, int ndim, const int64_t *shape, em_dtype dt, em_device dev,
                               const dist *d) {
  if (!em_dtype_is_float(dt)) {
    em_error("%s: expected a floating-point dtype (f32, f64, bf16, f16), got %s", op, em_dtype_name(dt));
    return NULL;
  }
  em_tensor *t = em_empty(ndim, shape, dt, dev);
  if (t && fill(op, t, d)) { em_tensor_release(t); return NULL; }
  return t;
}

em_tensor *em_rand(int ndim, const int64_t *shape, em_dtype dt, em_device dev) {
  EM_OP_SCOPE("rand");
  dist d = {.kind = D_UNIFORM, .p0 = 0, .p1 = 1};
  return random_float("rand", ndim, shape, dt, dev, &d);
}

em_tensor *em_randn(int ndim, const int64_t *shape, em_dtype dt, em_device dev) {
  EM_OP_SCOPE("randn");
  dist d = {.kind = D_NORMAL, .p0 = 0, .p1 = 1};
  return random_float("randn", ndim, shape, dt, dev, &d);
}

/* The integer range a dtype holds (floats: everything). */
static void dtype_range(em_dtype dt, int64_t *lo, int64_t *hi) {
  switch (dt) {
    case EM_BOOL: *lo = 0; *hi = 1; break;
    case EM_U8: *lo = 0; *hi = UINT8_MAX; break;
    case EM_U16: *lo = 0; *hi = UINT16_MAX; break;
    case EM_I32: *lo = INT32_MIN; *hi = INT32_MAX; break;
    default: *lo = INT64_MIN; *hi = INT64_MAX; break;
  }
}

em_tensor *em_randint(int64_t lo, int64_t hi, int ndim, const int64_t *shape, em_dtype dt, em_device dev) {
  EM_OP_SCOPE("randint");
  if (lo >= hi) {
    em_error("randint: expected lo < hi, got lo=%lld and hi=%lld", (long long)lo, (long long)hi);
    return NULL;
  }
  int64_t mn, mx;
  dtype_range(dt, &mn, &mx);
  if (lo < mn || hi - 1 > mx) {
    em_error("randint: the range [%lld, %lld) does not fit dtype %s", (long long)lo, (long long)hi, em_dtype_name(dt));
    return NULL;
  }
  em_tensor *t = em_empty(ndim, shape, dt, dev);
  if (!t) return NULL;
  dist d = {.kind = D_RANDINT, .lo = lo, .span = (uint64_t)hi - (uint64_t)lo};
  if (fill("randint", t, &d)) { em_tensor_release(t); return NULL; }
  return t;
}
