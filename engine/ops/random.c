/* Random sampling ops beyond the fills of engine/rng.c: bernoulli,
 * bernoulli_, randperm and multinomial. Same Philox stream, same rules
 * (ember/rng.h): a draw is a pure function of (seed, counter), so the CUDA
 * kernels (kernels/random.cu) give exactly what the CPU gives for one seed,
 * and inside a CUDA graph they read their counter from the graph's cell.
 *
 *   bernoulli   element j (row-major) = u(w_j) < p_j, word j % 4 of block j / 4.
 *   randperm    element i gets a 64-bit key (em_rng_u64: block i / 2, words
 *               2(i%2), 2(i%2)+1); the permutation lists 0..n-1 sorted by
 *               (key, i). A sort of random keys, not Fisher-Yates, because it
 *               parallelises (the CUDA side is one radix sort) and both
 *               devices agree; ties need two equal 64-bit keys.
 *   multinomial the exponential race: category j of a row gets the key
 *               p_j / E_j, E_j ~ Exp(1) (em_rng_race_key); the largest key is
 *               j with probability p_j / sum p. With replacement each sample
 *               s of row r races with fresh draws (element (r k + s) C + j);
 *               without, one race per row (element r C + j) and the k largest
 *               keys are the samples in order (Gumbel-top-k: sequential
 *               sampling without replacement). No cumulative sums: the
 *               result does not depend on the order of any float sum.
 * Errors on bad probabilities are checked on the CPU only: on CUDA a check
 * would read the device from the host (and could not be captured). */
#include <stdio.h>
#include "op.h"
#include "parallel.h"
#include "backend/rng_math.h"

/* The stream for an op drawing `blocks` blocks on t's device. */
static em_philox_state state_for(em_device dev, uint64_t blocks) {
  if (dev.type != EM_CPU) return em_rng_cuda_state(blocks);
  em_philox_state st = {em_rng_seed(), 0, NULL};
  st.offset = em_rng_reserve(blocks);
  return st;
}

/* ---------------- bernoulli ---------------- */

/* out (contiguous, n elements, any dtype) = u(w_j) < p_j; p NULL: the constant
 * pc. A range of Philox blocks a thread: element j draws word j % 4 of block
 * offset + j / 4 whichever thread holds it, so the bits do not depend on the
 * thread count. */
typedef struct { void *o; em_dtype dt; int64_t n; const double *p; double pc; em_philox_state st; } bern_job;

static void bernoulli_blocks(void *ctx, int64_t b0, int64_t b1) {
  const bern_job *jb = ctx;
  uint32_t k0 = (uint32_t)jb->st.seed, k1 = (uint32_t)(jb->st.seed >> 32);
  int64_t end = EM_MIN(b1 * 4, jb->n);
  for (int64_t j0 = b0 * 4; j0 < end; j0 += 4) {
    uint64_t c = jb->st.offset + (uint64_t)(j0 / 4);
    em_philox_block b = em_philox4x32_10((uint32_t)c, (uint32_t)(c >> 32), 0, 0, k0, k1);
    int cnt = (int)EM_MIN((int64_t)4, end - j0);
    for (int k = 0; k < cnt; k++)
      em_store_f64(jb->o, jb->dt, j0 + k, em_rng_below(b.v[k], jb->p ? jb->p[j0 + k] : jb->pc) ? 1.0 : 0.0);
  }
}

static void bernoulli_cpu(em_tensor *out, const double *p, double pc, em_philox_state st) {
  int64_t n = em_numel(out);
  bern_job jb = {em_data_ptr(out), out->dtype, n, p, pc, st};
  em_parallel_for((n + 3) / 4, em_grain(128), bernoulli_blocks, &jb);
}

static int check_probs_cpu(const char *op, const double *p, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!(p[i] >= 0 && p[i] <= 1))
      return em_error("%s: expected probabilities in [0, 1], got %g (at flat index %lld)", op, p[i], (long long)i);
  return 0;
}

/* t (any strides) = draws with probability p (tensor broadcast to t, or the constant pc). */
static int bernoulli_fill(const char *op, em_tensor *t, em_tensor *p, double pc) {
  int64_t n = em_numel(t);
  em_tensor *pe = NULL, *pd = NULL;
  if (p) {   /* p broadcast to t's shape, contiguous (f64 on the CPU, its own dtype on CUDA): element j lines up with t's element j */
    bool g = em_set_grad_enabled(false);   /* sampling has no gradient: no view node for p */
    pe = em_expand(p, t->ndim, t->shape);
    em_set_grad_enabled(g);
    if (!pe) return -1;
    pd = em_contiguous_as(pe, t->device.type == EM_CPU ? EM_F64 : pe->dtype);
    em_tensor_release(pe);
    if (!pd) return -1;
    if (t->device.type == EM_CPU && check_probs_cpu(op, em_data_ptr(pd), n)) { em_tensor_release(pd); return -1; }
  }
  em_tensor *o = em_is_contiguous(t) ? em_tensor_retain(t) : em_empty(t->ndim, t->shape, t->dtype, t->device);
  int rc = o ? 0 : -1;
  if (rc == 0) {
    em_philox_state st = state_for(t->device, (uint64_t)((n + 3) / 4));
    if (t->device.type == EM_CPU) bernoulli_cpu(o, pd ? em_data_ptr(pd) : NULL, pc, st);
    else rc = em_bernoulli_cuda(o, pd, pc, st);
  }
  if (rc == 0 && o != t) {
    bool g = em_set_grad_enabled(false);
    rc = em_copy_(t, o);
    em_set_grad_enabled(g);
  }
  em_tensor_release(o); em_tensor_release(pd);
  return rc;
}

em_tensor *em_bernoulli(em_tensor *p) {
  EM_OP_SCOPE("bernoulli");
  if (!p) { em_error("bernoulli: expected a tensor of probabilities, got NULL"); return NULL; }
  if (em_check_float("bernoulli", "p", p)) return NULL;
  em_tensor *t = em_empty(p->ndim, p->shape, p->dtype, p->device);
  if (t && bernoulli_fill("bernoulli", t, p, 0)) { em_tensor_release(t); return NULL; }
  return t;
}

int em_bernoulli_(em_tensor *t, em_tensor *p, double pc) {
  EM_OP_SCOPE("bernoulli_");
  if (!t) return em_error("bernoulli_: expected a tensor, got NULL");
  if (em_check_inplace("bernoulli_", t)) return -1;
  if (p) {
    if (em_check_float("bernoulli_", "p", p) || em_check_same_device("bernoulli_", t, p)) return -1;
    int nd; int64_t shape[EM_MAX_DIMS];
    if (em_broadcast_shape("bernoulli_", t->ndim, t->shape, p->ndim, p->shape, &nd, shape)) return -1;
    if (nd != t->ndim || memcmp(shape, t->shape, sizeof(int64_t) * (size_t)nd) != 0) {
      char a[160], b[160];
      return em_error("bernoulli_: expected p broadcastable to the tensor's shape %s, got p of shape %s",
                      em_shape_str(t->ndim, t->shape, a, 160), em_shape_str(p->ndim, p->shape, b, 160));
    }
  } else if (!(pc >= 0 && pc <= 1)) {
    return em_error("bernoulli_: expected p in [0, 1], got %g", pc);
  }
  em_bump_version(t);
  return bernoulli_fill("bernoulli_", t, p, pc);
}

/* ---------------- randperm ---------------- */

typedef struct { uint64_t key; int64_t i; } keyed;

static int keyed_cmp(const void *a, const void *b) {
  const keyed *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return x->i < y->i ? -1 : x->i > y->i;
}

static int64_t dtype_max(em_dtype dt) {
  switch (dt) {
    case EM_U8: return UINT8_MAX;
    case EM_U16: return UINT16_MAX;
    case EM_I32: return INT32_MAX;
    case EM_BF16: return 256;        /* consecutive integers a float holds exactly */
    case EM_F16: return 2048;
    case EM_F32: return 1 << 24;
    case EM_F64: return INT64_C(1) << 53;
    default: return INT64_MAX;
  }
}

em_tensor *em_randperm(int64_t n, em_dtype dt, em_device dev) {
  EM_OP_SCOPE("randperm");
  if (n < 0) { em_error("randperm: expected n >= 0, got %lld", (long long)n); return NULL; }
  if (dt == EM_BOOL || (n > 0 && n - 1 > dtype_max(dt))) {
    em_error("randperm: n = %lld does not fit dtype %s", (long long)n, em_dtype_name(dt));
    return NULL;
  }
  em_tensor *idx = em_empty(1, &n, EM_I64, dev);
  if (!idx) return NULL;
  em_philox_state st = state_for(dev, (uint64_t)((n + 1) / 2));
  int rc = 0;
  if (dev.type != EM_CPU) {
    rc = em_randperm_cuda(idx, st);
  } else if (n > 0) {
    keyed *k = malloc(sizeof(keyed) * (size_t)n);
    if (!k) rc = em_error("randperm: out of memory for %lld keys", (long long)n);
    uint32_t k0 = (uint32_t)st.seed, k1 = (uint32_t)(st.seed >> 32);
    for (int64_t i = 0; k && i < n; i++) {
      uint64_t c = st.offset + (uint64_t)(i / 2);
      em_philox_block b = em_philox4x32_10((uint32_t)c, (uint32_t)(c >> 32), 0, 0, k0, k1);
      k[i].key = em_rng_u64(&b, (int)(i % 2));
      k[i].i = i;
    }
    if (k) {
      qsort(k, (size_t)n, sizeof(keyed), keyed_cmp);
      int64_t *o = em_data_ptr(idx);
      for (int64_t i = 0; i < n; i++) o[i] = k[i].i;
      free(k);
    }
  }
  if (rc) { em_tensor_release(idx); return NULL; }
  if (dt == EM_I64) return idx;
  em_tensor *r = em_contiguous_as(idx, dt);
  em_tensor_release(idx);
  return r;
}

/* ---------------- multinomial ---------------- */

static int multinomial_validate(em_tensor *probs, int64_t k, bool replacement) {
  char s[160];
  if (!probs) return em_error("multinomial: expected a tensor of probabilities, got NULL");
  if (em_check_float("multinomial", "probs", probs)) return -1;
  if (probs->ndim != 1 && probs->ndim != 2)
    return em_error("multinomial: expected probs with 1 or 2 dims, got %d dims (shape %s)", probs->ndim,
                    em_shape_str(probs->ndim, probs->shape, s, 160));
  int64_t C = probs->shape[probs->ndim - 1];
  if (C == 0) return em_error("multinomial: expected at least one category, got probs of shape %s",
                              em_shape_str(probs->ndim, probs->shape, s, 160));
  if (k <= 0) return em_error("multinomial: expected num_samples >= 1, got %lld", (long long)k);
  if (!replacement && k > C)
    return em_error("multinomial: cannot draw %lld samples without replacement from %lld categories",
                    (long long)k, (long long)C);
  return 0;
}

/* Every row: finite non-negative entries, a positive sum, and enough non-zero
 * categories to draw k without replacement. */
static int check_rows(const double *p, int64_t N, int64_t C, int64_t k, bool replacement) {
  for (int64_t r = 0; r < N; r++, p += C) {
    double sum = 0;
    int64_t nz = 0;
    for (int64_t j = 0; j < C; j++) {
      if (!(p[j] >= 0) || isinf(p[j]))
        return em_error("multinomial: expected finite, non-negative probabilities, got %g (row %lld, category %lld)",
                        p[j], (long long)r, (long long)j);
      sum += p[j];
      nz += p[j] > 0;
    }
    if (!(sum > 0)) return em_error("multinomial: row %lld of probs sums to 0", (long long)r);
    if (!replacement && nz < k)
      return em_error("multinomial: cannot draw %lld samples without replacement: row %lld has %lld non-zero "
                      "categories", (long long)k, (long long)r, (long long)nz);
  }
  return 0;
}

static double race_key(const double *p, int64_t j, uint64_t e, em_philox_state st) {
  uint64_t c = st.offset + e / 2;
  em_philox_block b = em_philox4x32_10((uint32_t)c, (uint32_t)(c >> 32), 0, 0, (uint32_t)st.seed,
                                       (uint32_t)(st.seed >> 32));
  return em_rng_race_key(p[j], em_rng_u64(&b, (int)(e % 2)));
}

typedef struct { double key; int64_t j; } raced;

/* Largest key first, the lower index on ties (what the CUDA argmax does). */
static int raced_cmp(const void *a, const void *b) {
  const raced *x = a, *y = b;
  if (x->key != y->key) return x->key > y->key ? -1 : 1;
  return x->j < y->j ? -1 : x->j > y->j;
}

static int multinomial_cpu(const double *p, int64_t N, int64_t C, int64_t k, bool replacement, em_philox_state st,
                           int64_t *out) {
  if (replacement) {
    for (int64_t r = 0; r < N; r++)
      for (int64_t s = 0; s < k; s++) {
        uint64_t e0 = (uint64_t)((r * k + s) * C);
        int64_t best = 0;
        double bk = -1;
        for (int64_t j = 0; j < C; j++) {
          double key = race_key(p + r * C, j, e0 + (uint64_t)j, st);
          if (key > bk) { bk = key; best = j; }
        }
        out[r * k + s] = best;
      }
    return 0;
  }
  raced *keys = malloc(sizeof(raced) * (size_t)C);
  if (!keys) return em_error("multinomial: out of memory for %lld keys", (long long)C);
  for (int64_t r = 0; r < N; r++) {
    for (int64_t j = 0; j < C; j++) {
      keys[j].key = race_key(p + r * C, j, (uint64_t)(r * C + j), st);
      keys[j].j = j;
    }
    qsort(keys, (size_t)C, sizeof(raced), raced_cmp);
    for (int64_t s = 0; s < k; s++) out[r * k + s] = keys[s].j;
  }
  free(keys);
  return 0;
}

em_tensor *em_multinomial(em_tensor *probs, int64_t k, bool replacement) {
  EM_OP_SCOPE("multinomial");
  if (multinomial_validate(probs, k, replacement)) return NULL;
  int64_t C = probs->shape[probs->ndim - 1], N = probs->ndim == 2 ? probs->shape[0] : 1;
  int64_t oshape[2] = {N, k};
  em_tensor *out = em_empty(probs->ndim, probs->ndim == 2 ? oshape : &oshape[1], EM_I64, probs->device);
  if (!out) return NULL;
  uint64_t elems = (uint64_t)(N * C * (replacement ? k : 1));
  int rc;
  if (probs->device.type != EM_CPU) {
    em_tensor *pc = em_contiguous(probs);
    rc = pc ? em_multinomial_cuda(pc, out, replacement, em_rng_cuda_state((elems + 1) / 2)) : -1;
    em_tensor_release(pc);
  } else {
    em_tensor *pd = em_contiguous_as(probs, EM_F64);
    rc = pd ? check_rows(em_data_ptr(pd), N, C, k, replacement) : -1;
    if (rc == 0) rc = multinomial_cpu(em_data_ptr(pd), N, C, k, replacement, state_for(probs->device, (elems + 1) / 2),
                                      em_data_ptr(out));
    em_tensor_release(pd);
  }
  if (rc) { em_tensor_release(out); return NULL; }
  return out;
}
