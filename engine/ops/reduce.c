/* Reductions: sum, mean, max/min (+ indices), argmax/argmin, var, logsumexp,
 * softmax, log_softmax — the CPU forward and their backward formulas.
 *
 * Why it is shaped this way:
 *  - Every reduction splits the input's dims into kept dims (one output element
 *    per position) and reduced dims (walked for each output). The reduced dims
 *    are coalesced where memory allows, so "sum over everything" of a
 *    contiguous tensor is one long row. Rows are walked in chunks loaded into a
 *    double buffer (or int64 for integer inputs: exact sums and maxima), and a
 *    small accumulator callback consumes each chunk — one walker, many reductions.
 *  - Accuracy before speed: float inputs (f32, bf16, f16 and f64) accumulate in
 *    double with four partial sums, so a long f32 sum is not limited by f32
 *    rounding and the CUDA result can be checked against it. Softmax-like ops
 *    subtract the row maximum and compute in double, then round once.
 *  - The walk visits reduced elements in logical (row-major) order, so the
 *    running count is the flat index argmax/argmin return.
 *  - Backward formulas are compositions of public ops (device-agnostic), except
 *    max/min over a dim, which scatters the gradient to the saved indices.
 *  - Each op: validate -> device implementation (the CPU walk here, or the
 *    CUDA launchers of backend/backend.h over the same rplan) -> record autograd.
 *    On CUDA, softmax/log_softmax backward is one fused kernel instead of the
 *    composed formula, and max/min over a dim scatter with a kernel.
 *  - Threads (engine/parallel.h): outputs are spread over the threads, each
 *    reduced serially. An output whose reduced space is longer than
 *    EM_RED_BLOCK is cut into blocks of EM_RED_BLOCK elements (fixed by the
 *    shape, not the thread count), the blocks are reduced in parallel from
 *    fresh accumulators and their partials combined in block order, so
 *    every result is bit-identical at any thread count (red_run). */
#include "op.h"
#include "cost.h"
#include "parallel.h"
#include "stream.h"
#include "vec_math.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 256
#define EXT16 4096  /* bf16 values a max/min pass takes at a time (8 KiB: L1) */

/* ---------------- dims ---------------- */

typedef struct {
  int ndim;                          /* input dims */
  uint32_t mask;                     /* bit d set: dim d is reduced */
  int out_ndim;
  int64_t out_shape[EM_MAX_DIMS];
  int64_t keep_shape[EM_MAX_DIMS];   /* input shape with reduced dims set to 1 */
  int64_t n_red;                     /* input elements per output element */
} rdims;

static void rdims_from_mask(const em_tensor *a, uint32_t mask, bool keepdim, rdims *r) {
  r->ndim = a->ndim; r->mask = mask; r->out_ndim = 0; r->n_red = 1;
  for (int d = 0; d < a->ndim; d++) {
    bool red = mask & (1u << d);
    r->keep_shape[d] = red ? 1 : a->shape[d];
    if (red) r->n_red *= a->shape[d];
    if (!red || keepdim) r->out_shape[r->out_ndim++] = red ? 1 : a->shape[d];
  }
}

/* dims == NULL or ndims == 0: every dim. Errors on out-of-range and repeated dims. */
static int parse_dims(const char *name, const em_tensor *a, int ndims, const int64_t *dims, bool keepdim, rdims *r) {
  uint32_t mask = 0;
  if (!dims || ndims <= 0) mask = (1u << a->ndim) - 1;
  for (int j = 0; dims && j < ndims; j++) {
    int d;
    if (em_wrap_dim(name, dims[j], a->ndim, &d)) return -1;
    if (mask & (1u << d)) return em_error("%s: dim %d appears multiple times in the list of dims", name, d);
    mask |= 1u << d;
  }
  if (a->ndim == 0) mask = 0;
  rdims_from_mask(a, mask, keepdim, r);
  return 0;
}

/* ---------------- the walk ---------------- */

/* Kept (outer) and reduced (inner) dims, coalesced; nr >= 1. Shared with the
 * CUDA launchers (backend/backend.h). */
typedef em_red_plan rplan;

static void push_dim(int *n, int64_t *shape, int64_t *stride, int64_t size, int64_t st) {
  if (size == 1) return;
  if (*n > 0 && stride[*n - 1] == st * size) { shape[*n - 1] *= size; stride[*n - 1] = st; return; }
  shape[*n] = size; stride[*n] = st; (*n)++;
}

static void plan_init(rplan *p, const em_tensor *a, uint32_t mask) {
  p->nk = p->nr = 0; p->n_out = 1; p->n_red = 1;
  for (int d = 0; d < a->ndim; d++) {
    if (mask & (1u << d)) { push_dim(&p->nr, p->rshape, p->rstride, a->shape[d], a->stride[d]); p->n_red *= a->shape[d]; }
    else { push_dim(&p->nk, p->kshape, p->kstride, a->shape[d], a->stride[d]); p->n_out *= a->shape[d]; }
  }
  if (p->nr == 0) { p->rshape[0] = 1; p->rstride[0] = 0; p->nr = 1; }
}

/* Next output position: returns the input offset of its first reduced element. */
typedef struct { int64_t idx[EM_MAX_DIMS]; int64_t off; } kiter;
static void kiter_next(kiter *it, const rplan *p) {
  for (int d = p->nk - 1; d >= 0; d--) {
    it->off += p->kstride[d];
    if (++it->idx[d] < p->kshape[d]) return;
    it->off -= p->kstride[d] * p->kshape[d];
    it->idx[d] = 0;
  }
}

static void load_f64(double *d, const em_tensor *t, int64_t off, int64_t st, int64_t n) {
  const void *p = t->storage->data;
  if (st == 1 && t->dtype == EM_F32) {   /* the common case, as a loop the compiler vectorises */
    const float *s = (const float *)p + off;
    for (int64_t i = 0; i < n; i++) d[i] = s[i];
    return;
  }
  if (st == 1 && t->dtype == EM_BF16) {  /* the same for bf16 (f32's upper half): column sums' rows */
    const uint16_t *s = (const uint16_t *)p + off;
    for (int64_t i = 0; i < n; i++) d[i] = em_bf16_to_f32(s[i]);
    return;
  }
  switch (t->dtype) {
    case EM_F32: { const float *s = (const float *)p + off; for (int64_t i = 0; i < n; i++) d[i] = s[i * st]; break; }
    case EM_F64: { const double *s = (const double *)p + off; for (int64_t i = 0; i < n; i++) d[i] = s[i * st]; break; }
    case EM_BF16: { const uint16_t *s = (const uint16_t *)p + off; for (int64_t i = 0; i < n; i++) d[i] = em_bf16_to_f32(s[i * st]); break; }
    default: for (int64_t i = 0; i < n; i++) d[i] = em_load_f64(p, t->dtype, off + i * st); break;
  }
}

static void load_i64(int64_t *d, const em_tensor *t, int64_t off, int64_t st, int64_t n) {
  const void *p = t->storage->data;
  for (int64_t i = 0; i < n; i++) d[i] = em_load_i64(p, t->dtype, off + i * st);
}

/* Consumes one chunk of reduced elements; base = how many came before. */
typedef void (*chunk_fn)(void *state, const void *v, int64_t n, int64_t base);

/* The accumulators' states (the chunk functions below consume chunks into them). */
typedef struct { double acc, ref; } fsum;       /* ref: shift (sum of exp) or mean (squared deviations) */
typedef struct { int64_t acc; } isum;
typedef struct { double v; int64_t idx; bool is_max, any; } fext;
typedef struct { int64_t v; int64_t idx; bool is_max, any; } iext;
typedef struct { double acc, p; } fpow;         /* p: a vector norm's order */

static void sum_f(void *s, const void *vv, int64_t n, int64_t base);

/* The sum of a contiguous f32 run in double, 16 lanes (vec_math.h), clones. */
EM_SIMD_CLONES static double sum_run_f32(const float *x, int64_t n) { return em_sum_f32(x, n); }

static void ext_f(void *s, const void *vv, int64_t n, int64_t base);
static void ext_run_f32(void *s, const float *x, int64_t n, int64_t base);

/* The same over contiguous bf16 runs, each value widened in its register. */
EM_SIMD_CLONES static double sum_run_bf16_c(const uint16_t *x, int64_t n) { return em_sum_bf16(x, n); }
/* EMBER_CPU_SUM16=unpack (read once at load): the bf16 sums before the
 * shift-widened loops (AVX-512: the unpack loop; AVX2: the compiler's clone),
 * to compare on a host. The same bits. */
static bool sum16_unpack = false;
__attribute__((constructor)) static void sum16_init(void) {
  sum16_unpack = em_env_pick("EMBER_CPU_SUM16", (const char *const[]){"shift", "unpack"}, 2) == 1;
}
static double sum_run_bf16(const uint16_t *x, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f"))   /* avx512vl: every AVX-512 CPU but Knights Landing / Mill */
    return sum16_unpack || !__builtin_cpu_supports("avx512vl") ? em_sum_bf16_avx512u(x, n) : em_sum_bf16_avx512s(x, n);
  if (!sum16_unpack && __builtin_cpu_supports("avx2")) return em_sum_bf16_avx2s(x, n);
#endif
  return sum_run_bf16_c(x, n);
}
static void ext_run_bf16(void *s, const uint16_t *x, int64_t n, int64_t base);

/* Walk reduced elements [start, end) of the output element whose first input
 * element is at `off`, as doubles (ints: as int64 when `ints`), in chunks of
 * at most CHUNK that never cross a row of the innermost reduced dim. */
static void walk_range(const em_tensor *t, const rplan *p, int64_t off, int64_t start, int64_t end, bool ints,
                       chunk_fn fn, void *state) {
  if (end <= start) return;
  union { double d[CHUNK]; int64_t i[CHUNK]; } buf;
  int last = p->nr - 1;
  int64_t len = p->rshape[last], st = p->rstride[last], s = start % len, count = start;
  int64_t idx[EM_MAX_DIMS] = {0};
  for (int64_t d = last - 1, r = start / len; d >= 0; d--) {   /* the row holding `start` */
    idx[d] = r % p->rshape[d];
    r /= p->rshape[d];
    off += idx[d] * p->rstride[d];
  }
  size_t es = em_dtype_size(t->dtype);
  /* a plain f32 or bf16 sum or max/min: whole runs in SIMD lanes, read where
   * they lie, bf16 widened in the register (one shift a value: the
   * per-value double conversion held bf16 reductions to ~6 GB/s a core, a
   * widening pass into a buffer and 16 lanes to ~13). A bf16 sum in double
   * is exact in any order unless its values span 2^45, so the lanes change
   * no result in practice. A bf16 max/min takes EXT16 values at a time, so
   * the pass that finds the extreme's first position reads them from L1. */
  bool plain = (fn == sum_f || fn == ext_f) && st == 1;
  bool run = plain && t->dtype == EM_F32, run16 = plain && t->dtype == EM_BF16;
  int64_t most = run || (run16 && fn == sum_f) ? len : run16 ? EXT16 : CHUNK;
  while (count < end) {
    int64_t n = EM_MIN(most, EM_MIN(len - s, end - count)), o = off + s * st;
    if (run || run16) {
      const void *x = (const char *)t->storage->data + o * (int64_t)es;
      if (fn == sum_f) ((fsum *)state)->acc += run ? sum_run_f32(x, n) : sum_run_bf16(x, n);
      else if (run) ext_run_f32(state, x, n, count);
      else ext_run_bf16(state, x, n, count);
      count += n;
      s += n;
      if (s < len) continue;
      s = 0;
      for (int d = last - 1; d >= 0; d--) {
        off += p->rstride[d];
        if (++idx[d] < p->rshape[d]) break;
        off -= p->rstride[d] * p->rshape[d];
        idx[d] = 0;
      }
      continue;
    }
    const void *v = buf.d;
    if (st == 1 && t->dtype == (ints ? EM_I64 : EM_F64)) v = (const char *)t->storage->data + o * (int64_t)es;
    else if (ints) load_i64(buf.i, t, o, st, n);
    else load_f64(buf.d, t, o, st, n);
    fn(state, v, n, count);
    count += n;
    s += n;
    if (s < len) continue;
    s = 0;
    for (int d = last - 1; d >= 0; d--) {
      off += p->rstride[d];
      if (++idx[d] < p->rshape[d]) break;
      off -= p->rstride[d] * p->rshape[d];
      idx[d] = 0;
    }
  }
}

/* The whole reduced space of one output. */
static void walk(const em_tensor *t, const rplan *p, int64_t off, bool ints, chunk_fn fn, void *state) {
  walk_range(t, p, off, 0, p->n_red, ints, fn, state);
}

/* The input offset of output o's first reduced element. */
static int64_t kept_offset(const rplan *p, int64_t base, int64_t o) {
  for (int d = p->nk - 1; d >= 0; d--) {
    base += (o % p->kshape[d]) * p->kstride[d];
    o /= p->kshape[d];
  }
  return base;
}

/* A kiter positioned at output o (a parallel range's first). */
static kiter kiter_at(const rplan *p, int64_t base, int64_t o) {
  kiter it = {{0}, kept_offset(p, base, o)};
  for (int d = p->nk - 1; d >= 0; d--) { it.idx[d] = o % p->kshape[d]; o /= p->kshape[d]; }
  return it;
}

/* ---------------- accumulators ---------------- */


static void sum_f(void *s, const void *vv, int64_t n, int64_t base) {
  const double *v = vv;
  double p0 = 0, p1 = 0, p2 = 0, p3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) { p0 += v[i]; p1 += v[i + 1]; p2 += v[i + 2]; p3 += v[i + 3]; }
  for (; i < n; i++) p0 += v[i];
  ((fsum *)s)->acc += (p0 + p1) + (p2 + p3);
  EM_UNUSED(base);
}

static void sqdev_f(void *s, const void *vv, int64_t n, int64_t base) {
  const double *v = vv; fsum *f = s;
  double acc = 0;
  for (int64_t i = 0; i < n; i++) { double d = v[i] - f->ref; acc += d * d; }
  f->acc += acc;
  EM_UNUSED(base);
}

static void sumexp_f(void *s, const void *vv, int64_t n, int64_t base) {
  const double *v = vv; fsum *f = s;
  double acc = 0;
  for (int64_t i = 0; i < n; i++) acc += exp(v[i] - f->ref);
  f->acc += acc;
  EM_UNUSED(base);
}

static void sum_i(void *s, const void *vv, int64_t n, int64_t base) {
  const int64_t *v = vv;
  uint64_t acc = (uint64_t)((isum *)s)->acc;
  for (int64_t i = 0; i < n; i++) acc += (uint64_t)v[i];
  ((isum *)s)->acc = (int64_t)acc;
  EM_UNUSED(base);
}

/* First extreme wins; a NaN wins over everything and stays (PyTorch).
 * Two passes over the chunk (it is in cache): the extreme and whether a NaN
 * is there, as loops the compiler vectorises, then the first position
 * holding it. */
static void ext_f(void *s, const void *vv, int64_t n, int64_t base) {
  const double *v = vv; fext *e = s;
  if (n == 0 || (e->any && isnan(e->v))) return;
  enum { L = 8 };                 /* independent lanes: a SIMD max, not a chain of maxsd */
  double ml[L];
  int64_t nl[L], i = 0;
  for (int k = 0; k < L; k++) { ml[k] = e->is_max ? -INFINITY : INFINITY; nl[k] = 0; }
  if (e->is_max) {
    for (; i + L <= n; i += L)
      for (int k = 0; k < L; k++) { double x = v[i + k]; nl[k] |= x != x; ml[k] = x > ml[k] ? x : ml[k]; }
  } else {
    for (; i + L <= n; i += L)
      for (int k = 0; k < L; k++) { double x = v[i + k]; nl[k] |= x != x; ml[k] = x < ml[k] ? x : ml[k]; }
  }
  double m = ml[0];
  int64_t nan = 0;
  for (int k = 0; k < L; k++) {
    nan |= nl[k];
    m = e->is_max ? (ml[k] > m ? ml[k] : m) : (ml[k] < m ? ml[k] : m);
  }
  for (; i < n; i++) { double x = v[i]; nan |= x != x; m = e->is_max ? (x > m ? x : m) : (x < m ? x : m); }
  int64_t at = 0;
  if (nan) {
    while (v[at] == v[at]) at++;
  } else {
    if (e->any && !(e->is_max ? m > e->v : m < e->v)) return;   /* not better: the earlier one stays */
    while (v[at] != m) at++;                                     /* the first of the extreme (-0 == +0) */
  }
  e->v = v[at]; e->idx = base + at; e->any = true;
}

/* em_extreme_f32 compiled for each SIMD width. */
EM_SIMD_CLONES static float ext_lanes_f32(const float *x, int64_t n, bool is_max, int *has_nan) {
  return em_extreme_f32(x, n, is_max, has_nan);
}
EM_SIMD_CLONES static int64_t find_f32(const float *x, int64_t n, float v) { return em_find_f32(x, n, v); }

/* ext_f over a contiguous f32 run, read in place: the same result (the first
 * extreme, or the first NaN) without the copy into doubles. */
static void ext_run_f32(void *s, const float *x, int64_t n, int64_t base) {
  fext *e = s;
  if (n == 0 || (e->any && isnan(e->v))) return;
  int nan;
  float m = ext_lanes_f32(x, n, e->is_max, &nan);
  if (!nan && e->any && !(e->is_max ? m > e->v : m < e->v)) return;   /* not better: the earlier one stays */
  int64_t at = find_f32(x, n, nan ? NAN : m);    /* the first NaN, or the first of the extreme (-0 == +0) */
  e->v = x[at]; e->idx = base + at; e->any = true;
}

EM_SIMD_CLONES static float ext_lanes_bf16_c(const uint16_t *x, int64_t n, bool is_max, int *has_nan) {
  return em_extreme_bf16(x, n, is_max, has_nan);
}
static float ext_lanes_bf16(const uint16_t *x, int64_t n, bool is_max, int *has_nan) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) return em_extreme_bf16_avx512(x, n, is_max, has_nan);
#endif
  return ext_lanes_bf16_c(x, n, is_max, has_nan);
}
EM_SIMD_CLONES static int64_t find_bf16_c(const uint16_t *x, int64_t n, float v) { return em_find_bf16(x, n, v); }
static int64_t find_bf16(const uint16_t *x, int64_t n, float v) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) return em_find_bf16_avx512(x, n, v);
#endif
  return find_bf16_c(x, n, v);
}

/* ext_run_f32 over a contiguous bf16 run. On AVX-512 the pass also gives
 * the sub-block where the extreme first lies, and the search starts there. */
static void ext_run_bf16(void *s, const uint16_t *x, int64_t n, int64_t base) {
  fext *e = s;
  if (n == 0 || (e->any && isnan(e->v))) return;
  int nan;
  int64_t from = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  float m = __builtin_cpu_supports("avx512bw") ? em_extreme_from_bf16_avx512(x, n, e->is_max, &nan, &from)
                                              : ext_lanes_bf16(x, n, e->is_max, &nan);
#else
  float m = ext_lanes_bf16(x, n, e->is_max, &nan);
#endif
  if (!nan && e->any && !(e->is_max ? m > e->v : m < e->v)) return;
  int64_t at = from + find_bf16(x + from, n - from, nan ? NAN : m);
  e->v = em_bf16_to_f32(x[at]); e->idx = base + at; e->any = true;
}

static void ext_i(void *s, const void *vv, int64_t n, int64_t base) {
  const int64_t *v = vv; iext *e = s;
  for (int64_t i = 0; i < n; i++) {
    if (!e->any || (e->is_max ? v[i] > e->v : v[i] < e->v)) { e->v = v[i]; e->idx = base + i; e->any = true; }
  }
}

/* ---------------- the parallel runner ---------------- */

/* Combining two partial states (the second follows the first in the walk). */
static void comb_sum_f(void *a, const void *b) { ((fsum *)a)->acc += ((const fsum *)b)->acc; }
static void comb_sum_i(void *a, const void *b) {
  ((isum *)a)->acc = (int64_t)((uint64_t)((isum *)a)->acc + (uint64_t)((const isum *)b)->acc);
}
static void comb_ext_f(void *a, const void *b) {
  fext *e = a; const fext *x = b;
  if (x->any && (!e->any || (!isnan(e->v) && (isnan(x->v) || (e->is_max ? x->v > e->v : x->v < e->v))))) *e = *x;
}
static void comb_ext_i(void *a, const void *b) {
  iext *e = a; const iext *x = b;
  if (x->any && (!e->any || (e->is_max ? x->v > e->v : x->v < e->v))) *e = *x;
}

/* One reduction over every output: init gives output o a fresh state, fn
 * consumes chunks, combine folds a later block's state into an earlier one,
 * finish writes output o. States are at most sizeof(rstate). */
typedef union { fsum f; isum i; fext e; iext x; fpow w; } rstate;
typedef struct red_op red_op;
struct red_op {
  const em_tensor *a;
  const rplan *p;
  bool ints;
  chunk_fn fn;
  void (*init)(const red_op *r, int64_t o, rstate *st);
  void (*combine)(void *acc, const void *part);
  void (*finish)(const red_op *r, int64_t o, rstate *st);
  void *out;                 /* what finish writes (a tensor, an array) */
  em_tensor *out2;           /* a second output (extreme indices) */
  const double *aux;         /* per-output values of a first pass (mean, max) */
  double x;                  /* a constant (div, dof, the norm's order) */
  int kind;                  /* which reduction (math ops) */
  int64_t nblk;
  rstate *parts;             /* n_out * nblk block states */
};

static void red_outputs(void *ctx, int64_t o0, int64_t o1) {
  const red_op *r = ctx;
  kiter it = kiter_at(r->p, r->a->offset, o0);
  for (int64_t o = o0; o < o1; o++) {
    rstate st;
    r->init(r, o, &st);
    walk(r->a, r->p, it.off, r->ints, r->fn, &st);
    r->finish(r, o, &st);
    kiter_next(&it, r->p);
  }
}

static void red_blocks(void *ctx, int64_t w0, int64_t w1) {
  const red_op *r = ctx;
  for (int64_t w = w0; w < w1; w++) {
    int64_t o = w / r->nblk, b = w % r->nblk;
    r->init(r, o, &r->parts[w]);
    walk_range(r->a, r->p, kept_offset(r->p, r->a->offset, o), b * EM_RED_BLOCK,
               EM_MIN((b + 1) * EM_RED_BLOCK, r->p->n_red), r->ints, r->fn, &r->parts[w]);
  }
}

static void red_combine(void *ctx, int64_t o0, int64_t o1) {
  const red_op *r = ctx;
  for (int64_t o = o0; o < o1; o++) {
    rstate *st = &r->parts[o * r->nblk];
    for (int64_t b = 1; b < r->nblk; b++) r->combine(st, &r->parts[o * r->nblk + b]);
    r->finish(r, o, st);
  }
}

/* Run r over every output (see the file's opening comment); 0 or -1 (out of memory). */
static int red_run(red_op *r) {
  const rplan *p = r->p;
  if (p->n_out == 0) return 0;
  r->nblk = em_red_blocks(p->n_red);
  if (r->nblk == 1) {
    em_parallel_for_mem(p->n_out, em_grain(p->n_red), red_outputs, r);
    return 0;
  }
  r->parts = malloc(sizeof(rstate) * (size_t)(p->n_out * r->nblk));
  if (!r->parts) return em_error_oom("out of memory: reduction partials (%lld)", (long long)(p->n_out * r->nblk));
  em_parallel_for_mem(p->n_out * r->nblk, 1, red_blocks, r);
  em_parallel_for(p->n_out, em_grain(r->nblk), red_combine, r);
  free(r->parts);
  r->parts = NULL;
  return 0;
}

/* ---------------- backward helpers ---------------- */

/* The node's input shape with the reduced dims (n->i[0], a bitmask) set to 1. */
static void keep_shape_of(const em_node *n, int64_t *shape) {
  for (int d = 0; d < n->in_ndim[0]; d++) shape[d] = (n->i[0] & (1 << d)) ? 1 : n->in_shape[0][d];
}

/* g viewed with the reduced dims kept (size 1), ready to broadcast against the input. */
static em_tensor *unsqueeze_grad(const em_node *n, em_tensor *g) {
  int64_t ks[EM_MAX_DIMS];
  keep_shape_of(n, ks);
  return em_reshape(g, n->in_ndim[0], ks);
}

static em_tensor *expand_grad(const em_node *n, em_tensor *g) {
  em_tensor *k = unsqueeze_grad(n, g);
  if (!k) return NULL;
  em_tensor *e = em_expand(k, n->in_ndim[0], n->in_shape[0]);
  em_tensor_release(k);
  return e;
}

static int mask_dims(int64_t mask, int ndim, int64_t *dims) {
  int nd = 0;
  for (int d = 0; d < ndim; d++) if (mask & (1 << d)) dims[nd++] = d;
  return nd;
}

/* Record a reduction's node (em_op_record) with its attributes: i[0] =
 * reduced-dims mask, i[1] = keepdim, f[0] = n_red; saved s0, s1 (NULLs
 * skipped). *node (may be NULL) gets the node for more attributes. */
static em_tensor *record_reduction(em_tensor *res, em_node **node, const char *op, em_backward_fn bw, em_tensor *a,
                                   const rdims *r, bool keepdim, em_tensor *s0, em_tensor *s1) {
  em_node *n;
  res = em_op_record(res, &n, op, bw, 1, &a, 2, (em_tensor *[]){s0, s1});
  if (n) { n->i[0] = r->mask; n->i[1] = keepdim; n->f[0] = (double)r->n_red; }
  if (node) *node = n;
  return res;
}

/* ---------------- sum, mean ---------------- */

/* Column mode: when the innermost kept dim is contiguous and the reduced dims
 * are not (sum over the batch dims of (B*T, D), the bias-gradient shape),
 * walking one output at a time would stride through memory. Instead add whole
 * contiguous rows of K outputs into K accumulators, once per reduced position. */
static bool column_mode(const rplan *p) {
  return p->nk > 0 && p->n_out > 0 && p->kstride[p->nk - 1] == 1 && p->rstride[p->nr - 1] != 1 && p->n_red > 1;
}

/* Column mode in parallel: tasks are (outer position, band of <= COL_WIDTH
 * columns, block of COL_ROWS reduced positions). A band is wide so each row
 * is read as one long run (short runs at a large stride leave the
 * prefetchers idle: 1 KiB runs 16 KiB apart ran at 2 GB/s). With one block
 * the sums go straight to the result; with more, each block's column sums
 * are kept and added in block order (the split depends on n_red only, and
 * every column is summed over its rows in order either way). */
#define COL_ROWS (EM_RED_BLOCK / CHUNK)
#define COL_WIDTH 4096

typedef struct {
  em_tensor *res;
  const em_tensor *a;
  const rplan *p;
  rplan ko;                  /* the outer kept dims only */
  bool ints;
  double div;
  int64_t K, kch, slot, nb;  /* columns, column chunks, columns per chunk slot, row blocks */
  void *parts;               /* (outer, kch, nb, slot) partial sums, double or int64 */
} col_job;

static void col_store(const col_job *j, int64_t at, const double *acc, const int64_t *iacc, int64_t n) {
  void *out = em_data_ptr(j->res);
  for (int64_t q = 0; q < n; q++) {
    if (j->ints) em_store_i64(out, j->res->dtype, at + q, iacc[q]);
    else em_store_f64(out, j->res->dtype, at + q, acc[q] / j->div);
  }
}

/* A bf16 value as a double (exact). */
static inline double bf16_d(uint16_t h) { return em_bf16_to_f32(h); }

#if defined(__x86_64__) && defined(__GNUC__)
/* The bf16 eight-row step below with AVX-512 intrinsics, eight columns a
 * register: the same additions in the same order as the C loop (GCC
 * vectorises that one in 256-bit halves with shuffles between them, bound by
 * the core at ~12 GB/s on the 2-core VM). Returns the columns done (a
 * multiple of 8); the C loop takes the rest. noipa: see col_run. */
__attribute__((target("avx512f"), noipa)) static int64_t col8_bf16_avx512(double *acc, const uint16_t *const y[8], int64_t n) {
#define D8(r) _mm512_cvtps_pd(_mm256_castsi256_ps(                                     \
    _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(y[r] + q))), 16)))
  int64_t q = 0;
  /* sixteen columns a step widened by unpacks with zero (8 rows: 48 uops
   * against 64): each register holds columns 0-3 and 8-11, or 4-7 and
   * 12-15, put back in order before the accumulator; each column's
   * additions are the same */
  const __m256i z = _mm256_setzero_si256();
#define LH(r) __m256i p##r = _mm256_loadu_si256((const __m256i *)(y[r] + q));                        \
  __m512d l##r = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, p##r)));               \
  __m512d h##r = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, p##r)));
  for (; q + 16 <= n; q += 16) {
    LH(0) LH(1) LH(2) LH(3) LH(4) LH(5) LH(6) LH(7)
    __m512d lo = _mm512_add_pd(_mm512_add_pd(_mm512_add_pd(l0, l1), _mm512_add_pd(l2, l3)),
                               _mm512_add_pd(_mm512_add_pd(l4, l5), _mm512_add_pd(l6, l7)));
    __m512d hi = _mm512_add_pd(_mm512_add_pd(_mm512_add_pd(h0, h1), _mm512_add_pd(h2, h3)),
                               _mm512_add_pd(_mm512_add_pd(h4, h5), _mm512_add_pd(h6, h7)));
    _mm512_storeu_pd(acc + q, _mm512_add_pd(_mm512_loadu_pd(acc + q), _mm512_shuffle_f64x2(lo, hi, 0x44)));
    _mm512_storeu_pd(acc + q + 8, _mm512_add_pd(_mm512_loadu_pd(acc + q + 8), _mm512_shuffle_f64x2(lo, hi, 0xee)));
  }
#undef LH
  for (; q + 8 <= n; q += 8) {
    __m512d a = _mm512_add_pd(_mm512_add_pd(D8(0), D8(1)), _mm512_add_pd(D8(2), D8(3)));
    __m512d b = _mm512_add_pd(_mm512_add_pd(D8(4), D8(5)), _mm512_add_pd(D8(6), D8(7)));
    _mm512_storeu_pd(acc + q, _mm512_add_pd(_mm512_loadu_pd(acc + q), _mm512_add_pd(a, b)));
  }
#undef D8
  return q;
}
#endif

/* Per-thread column accumulators (64 KiB: off the workers' stacks). */
typedef union { double d[2 * COL_WIDTH]; int64_t i[2 * COL_WIDTH]; } col_accs;
static _Thread_local col_accs col_tls;

/* Tasks [w0, w1) with the calling thread's accumulators t, passed in rather
 * than read from col_tls here: the engine is compiled as position-independent
 * code, and GCC propagated col_tls's address into col8_bf16_avx512 and
 * recomputed it there once per eight columns, as a __tls_get_addr call with a
 * vzeroupper and a spill of the sum around it (the linker relaxes the call to
 * a %fs load in the ember executable; the vzeroupper and the spill stay, and
 * a shared build would keep the call). noipa on col8_bf16_avx512 keeps acc a
 * parameter. */
EM_SIMD_CLONES static void col_run(const col_job *j, int64_t w0, int64_t w1, col_accs *t) {
  const rplan *p = j->p;
  double *acc = t->d, *buf = t->d + COL_WIDTH;
  int64_t *iacc = t->i, *ibuf = t->i + COL_WIDTH;
  for (int64_t w = w0; w < w1; w++) {
    int64_t b = w % j->nb, kc = (w / j->nb) % j->kch, o = w / j->nb / j->kch;
    int64_t k0 = kc * COL_WIDTH, n = EM_MIN(COL_WIDTH, j->K - k0), r0 = b * COL_ROWS, r1 = EM_MIN(r0 + COL_ROWS, p->n_red);
    int64_t idx[EM_MAX_DIMS] = {0}, off = kept_offset(&j->ko, j->a->offset, o) + k0;
    for (int64_t d = p->nr - 1, r = r0; d >= 0; d--) {      /* reduced position r0 */
      idx[d] = r % p->rshape[d];
      r /= p->rshape[d];
      off += idx[d] * p->rstride[d];
    }
    for (int64_t q = 0; q < n; q++) { acc[q] = 0; iacc[q] = 0; }
    const float *base = (const float *)j->a->storage->data;
    for (int64_t r = r0; r < r1;) {
      /* f32 and bf16: eight rows at a time, added pairwise in double before the
       * accumulator (a 4096-column band's 32 KiB of doubles is read and
       * written once per eight rows instead of every row: that traffic, not
       * memory, held the one-row loop at ~30% of bandwidth; 2-core VM,
       * (4096, 4096): 6.4 -> 3.4 ms on one thread, four rows 3.6-3.9).
       * Groups start at the block's first row, so the order depends on the
       * shape only. */
      if (!j->ints && (j->a->dtype == EM_F32 || j->a->dtype == EM_BF16) && r1 - r >= 8) {
        int64_t o4[8];
        for (int g = 0; g < 8; g++) {
          o4[g] = off;
          for (int d = p->nr - 1; d >= 0; d--) {
            off += p->rstride[d];
            if (++idx[d] < p->rshape[d]) break;
            off -= p->rstride[d] * p->rshape[d];
            idx[d] = 0;
          }
        }
        if (j->a->dtype == EM_F32) {
          const float *x0 = base + o4[0], *x1 = base + o4[1], *x2 = base + o4[2], *x3 = base + o4[3];
          const float *x4 = base + o4[4], *x5 = base + o4[5], *x6 = base + o4[6], *x7 = base + o4[7];
          for (int64_t q = 0; q < n; q++)
            acc[q] += (((double)x0[q] + (double)x1[q]) + ((double)x2[q] + (double)x3[q])) +
                      (((double)x4[q] + (double)x5[q]) + ((double)x6[q] + (double)x7[q]));
        } else {                  /* bf16: the same eight rows, each value widened (exact) on the way */
          const uint16_t *h = (const uint16_t *)j->a->storage->data;
          const uint16_t *y0 = h + o4[0], *y1 = h + o4[1], *y2 = h + o4[2], *y3 = h + o4[3];
          const uint16_t *y4 = h + o4[4], *y5 = h + o4[5], *y6 = h + o4[6], *y7 = h + o4[7];
          int64_t q = 0;
#if defined(__x86_64__) && defined(__GNUC__)
          if (__builtin_cpu_supports("avx512f")) q = col8_bf16_avx512(acc, (const uint16_t *const[8]){y0, y1, y2, y3, y4, y5, y6, y7}, n);
#endif
          for (; q < n; q++)
            acc[q] += ((bf16_d(y0[q]) + bf16_d(y1[q])) + (bf16_d(y2[q]) + bf16_d(y3[q]))) +
                      ((bf16_d(y4[q]) + bf16_d(y5[q])) + (bf16_d(y6[q]) + bf16_d(y7[q])));
        }
        r += 8;
        continue;
      }
      if (j->ints) { load_i64(ibuf, j->a, off, 1, n); for (int64_t q = 0; q < n; q++) iacc[q] = (int64_t)((uint64_t)iacc[q] + (uint64_t)ibuf[q]); }
      else if (j->a->dtype == EM_F32) {   /* straight from the row: one pass, no buffer */
        const float *x = base + off;
        for (int64_t q = 0; q < n; q++) acc[q] += (double)x[q];
      }
      else { load_f64(buf, j->a, off, 1, n); for (int64_t q = 0; q < n; q++) acc[q] += buf[q]; }
      for (int d = p->nr - 1; d >= 0; d--) {
        off += p->rstride[d];
        if (++idx[d] < p->rshape[d]) break;
        off -= p->rstride[d] * p->rshape[d];
        idx[d] = 0;
      }
      r++;
    }
    if (j->nb == 1) { col_store(j, o * j->K + k0, acc, iacc, n); continue; }
    size_t at = (size_t)(w * j->slot);
    if (j->ints) memcpy((int64_t *)j->parts + at, iacc, sizeof(int64_t) * (size_t)n);
    else memcpy((double *)j->parts + at, acc, sizeof(double) * (size_t)n);
  }
}

static void col_tasks(void *ctx, int64_t w0, int64_t w1) { col_run(ctx, w0, w1, &col_tls); }

/* Blocks' column sums added in block order, in tasks of (outer, COMBINE
 * columns): one task per 4096-column band left a 32-block combine (1 MiB of
 * partials for a (4096, 4096) sum over dim 0) on one thread while the others
 * waited, ~10% of that sum at 16 threads. Each column's order is the same. */
#define COMBINE 256   /* divides COL_WIDTH: a task never crosses a band */

static void col_combine(void *ctx, int64_t c0, int64_t c1) {
  const col_job *j = ctx;
  double *acc = col_tls.d;
  int64_t *iacc = col_tls.i, per = (j->K + COMBINE - 1) / COMBINE;
  for (int64_t c = c0; c < c1; c++) {
    int64_t o = c / per, k0 = c % per * COMBINE, n = EM_MIN(COMBINE, j->K - k0), kc = k0 / COL_WIDTH;
    size_t first = (size_t)((o * j->kch + kc) * j->nb * j->slot + k0 % COL_WIDTH);
    for (int64_t b = 0; b < j->nb; b++) {
      size_t at = first + (size_t)(b * j->slot);
      for (int64_t q = 0; q < n; q++) {
        if (j->ints) {
          int64_t v = ((const int64_t *)j->parts)[at + q];
          iacc[q] = b ? (int64_t)((uint64_t)iacc[q] + (uint64_t)v) : v;
        } else {
          double v = ((const double *)j->parts)[at + q];
          acc[q] = b ? acc[q] + v : v;
        }
      }
    }
    col_store(j, o * j->K + k0, acc, iacc, n);
  }
}

static int column_sum(em_tensor *res, const em_tensor *a, const rplan *p, bool ints, double div) {
  col_job j = {res, a, p, *p, ints, div, p->kshape[p->nk - 1], 0, 0, 0, NULL};
  j.ko.nk = p->nk - 1;
  j.kch = (j.K + COL_WIDTH - 1) / COL_WIDTH;
  j.slot = EM_MIN(j.K, COL_WIDTH);
  j.nb = (p->n_red + COL_ROWS - 1) / COL_ROWS;
  int64_t outer = p->n_out / j.K, tasks = outer * j.kch * j.nb;
  if (j.nb > 1 && !(j.parts = malloc(8 * (size_t)(tasks * j.slot))))
    return em_error_oom("out of memory: sum partials (%lld)", (long long)(tasks * j.slot));
  em_parallel_for_mem(tasks, em_grain(EM_MIN(COL_ROWS, p->n_red) * j.slot), col_tasks, &j);
  /* a partial read in the combine is another core's write (a cache miss, not a
   * simple op): cost 4 a value, so a (4096, 4096) sum over dim 0 (32 blocks, 1 MiB
   * of partials) spreads its 16 tasks over 16 threads rather than 4 */
  if (j.nb > 1) em_parallel_for(outer * ((j.K + COMBINE - 1) / COMBINE), em_grain(4 * j.nb * EM_MIN(j.K, COMBINE)),
                                col_combine, &j);
  free(j.parts);
  return 0;
}

static void init_sum(const red_op *r, int64_t o, rstate *st) {
  EM_UNUSED(r); EM_UNUSED(o);
  memset(st, 0, sizeof *st);
}

static void finish_sum(const red_op *r, int64_t o, rstate *st) {
  em_tensor *res = r->out;
  if (r->ints) em_store_i64(em_data_ptr(res), res->dtype, o, st->i.acc);
  else em_store_f64(em_data_ptr(res), res->dtype, o, st->f.acc / r->x);
}

/* Sum (divided by div: 1 for sum, n for mean) over the reduced dims of r. */
static int cpu_sum(em_tensor *res, const em_tensor *a, const rdims *r, bool ints, double div) {
  rplan p; plan_init(&p, a, r->mask);
  if (column_mode(&p)) return column_sum(res, a, &p, ints, div);
  red_op op = {.a = a, .p = &p, .ints = ints, .fn = ints ? sum_i : sum_f, .init = init_sum,
               .combine = ints ? comb_sum_i : comb_sum_f, .finish = finish_sum, .out = res, .x = div};
  return red_run(&op);
}

/* The device switch for sum and mean. */
static int run_sum(const char *name, em_tensor *res, const em_tensor *a, const rdims *r, bool ints, double div) {
  EM_OP_COST(em_cost_nbytes(a) + em_cost_nbytes(res), em_numel(a), em_cost_simt_class(a->dtype));
  if (a->device.type == EM_CPU) return cpu_sum(res, a, r, ints, div);
  if (a->device.type == EM_CUDA) { rplan p; plan_init(&p, a, r->mask); return em_sum_cuda(name, res, a, &p, div); }
  return em_error_device(name, a);
}

static int sum_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  gin[0] = expand_grad(n, gout[0]);
  return gin[0] ? 0 : -1;
}

static int mean_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *s = em_binary_scalar(EM_DIV, gout[0], n->f[0], false, NULL);
  if (!s) return -1;
  gin[0] = expand_grad(n, s);
  em_tensor_release(s);
  return gin[0] ? 0 : -1;
}

/* sum is on autocast's f32 list (as in PyTorch; mean and var are not: they
 * accumulate in f32 and return the input's dtype): true when a must be
 * upcast first. */
#define AUTOCAST_F32(a) (em_autocast_enabled() && ((a)->dtype == EM_BF16 || (a)->dtype == EM_F16))

em_tensor *em_sum(em_tensor *a, int ndims, const int64_t *dims, bool keepdim) {
  EM_OP_SCOPE("sum");
  EM_CHECK_NULL(a, "sum: expected a tensor, got NULL");
  if (AUTOCAST_F32(a)) {
    em_tensor *u = em_autocast_upper(a), *r = u ? em_sum(u, ndims, dims, keepdim) : NULL;
    em_tensor_release(u);
    return r;
  }
  rdims r;
  if (parse_dims("sum", a, ndims, dims, keepdim, &r)) return NULL;
  bool ints = !em_dtype_is_float(a->dtype);
  em_tensor *res = em_empty(r.out_ndim, r.out_shape, ints ? EM_I64 : a->dtype, a->device);
  if (!res) return NULL;
  if (run_sum("sum", res, a, &r, ints, 1.0)) { em_tensor_release(res); return NULL; }
  return record_reduction(res, NULL, "sum", sum_backward, a, &r, keepdim, NULL, NULL);
}

em_tensor *em_mean(em_tensor *a, int ndims, const int64_t *dims, bool keepdim) {
  EM_OP_SCOPE("mean");
  EM_CHECK_NULL(a, "mean: expected a tensor, got NULL");
  EM_CHECK_NULL(em_dtype_is_float(a->dtype), "mean: expected a floating-point input, got %s",
                em_dtype_name(a->dtype));
  rdims r;
  if (parse_dims("mean", a, ndims, dims, keepdim, &r)) return NULL;
  em_tensor *res = em_empty(r.out_ndim, r.out_shape, a->dtype, a->device);
  if (!res) return NULL;
  if (run_sum("mean", res, a, &r, false, (double)r.n_red)) {   /* empty: 0/0 = NaN */
    em_tensor_release(res);
    return NULL;
  }
  return record_reduction(res, NULL, "mean", mean_backward, a, &r, keepdim, NULL, NULL);
}

/* ---------------- var ---------------- */

static int var_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *a = n->saved[0];
  int64_t dims[EM_MAX_DIMS];
  int nd = mask_dims(n->i[0], n->in_ndim[0], dims);
  double dof = EM_MAX(0.0, n->f[0] - n->f[1]);
  em_scratch s = {0};
  em_tensor *m = EM_TMP(&s, nd ? em_mean(a, nd, dims, true) : em_clone(a));
  em_tensor *d = EM_TMP(&s, em_binary(EM_SUB, a, m, NULL));
  em_tensor *gk = EM_TMP(&s, unsqueeze_grad(n, gout[0]));
  em_tensor *t = EM_TMP(&s, em_binary(EM_MUL, d, gk, NULL));
  em_tensor *r = EM_TMP(&s, em_binary_scalar(EM_MUL, t, 2.0 / dof, false, NULL));
  return em_scratch_end_into(&s, r, &gin[0]);
}

/* Two passes per output: the mean, then the squared deviations from it. */
static void finish_mean(const red_op *r, int64_t o, rstate *st) {
  ((double *)r->out)[o] = st->f.acc / (double)r->p->n_red;
}

static void init_sqdev(const red_op *r, int64_t o, rstate *st) { st->f.acc = 0; st->f.ref = r->aux[o]; }

static void finish_var(const red_op *r, int64_t o, rstate *st) {
  em_tensor *res = r->out;
  em_store_f64(em_data_ptr(res), res->dtype, o, st->f.acc / r->x);
}

static int cpu_var(em_tensor *res, const em_tensor *a, const rplan *p, double dof) {
  double *mean = malloc(sizeof(double) * (size_t)EM_MAX(p->n_out, 1));
  if (!mean) return em_error_oom("out of memory: var means (%lld)", (long long)p->n_out);
  red_op m = {.a = a, .p = p, .fn = sum_f, .init = init_sum, .combine = comb_sum_f, .finish = finish_mean,
              .out = mean};
  red_op v = {.a = a, .p = p, .fn = sqdev_f, .init = init_sqdev, .combine = comb_sum_f, .finish = finish_var,
              .out = res, .aux = mean, .x = dof};
  int rc = red_run(&m);
  if (!rc) rc = red_run(&v);
  free(mean);
  return rc;
}

em_tensor *em_var(em_tensor *a, int ndims, const int64_t *dims, double correction, bool keepdim) {
  EM_OP_SCOPE("var");
  EM_CHECK_NULL(a, "var: expected a tensor, got NULL");
  EM_CHECK_NULL(em_dtype_is_float(a->dtype), "var: expected a floating-point input, got %s",
                em_dtype_name(a->dtype));
  rdims r;
  if (parse_dims("var", a, ndims, dims, keepdim, &r)) return NULL;
  em_tensor *res = em_empty(r.out_ndim, r.out_shape, a->dtype, a->device);
  if (!res) return NULL;
  rplan p; plan_init(&p, a, r.mask);
  double dof = EM_MAX(0.0, (double)p.n_red - correction);
  EM_OP_COST(em_cost_nbytes(a) + em_cost_nbytes(res), 3 * em_numel(a), em_cost_simt_class(a->dtype));
  int rc;
  if (a->device.type == EM_CPU) rc = cpu_var(res, a, &p, dof);
  else if (a->device.type == EM_CUDA) {
    rc = em_var_rows_cuda("var", res, a, &p, dof);          /* one pass over rows in registers */
    if (rc > 0) rc = em_var_cuda("var", res, a, &p, dof);   /* other shapes: two passes */
  }
  else rc = em_error_device("var", a);
  if (rc) { em_tensor_release(res); return NULL; }
  em_node *n;
  res = record_reduction(res, &n, "var", var_backward, a, &r, keepdim, a, NULL);
  if (n) n->f[1] = correction;
  return res;
}

/* ---------------- max, min, argmax, argmin ---------------- */

/* Extremes over the reduced dims of r: values (may be NULL) and i64 indices
 * (may be NULL) along the reduced space in row-major order. */
static void init_ext(const red_op *r, int64_t o, rstate *st) {
  EM_UNUSED(o);
  memset(st, 0, sizeof *st);
  if (r->ints) st->x.is_max = r->kind; else st->e.is_max = r->kind;
}

static void finish_ext(const red_op *r, int64_t o, rstate *st) {
  em_tensor *vals = r->out, *idx = r->out2;
  if (vals && r->ints) em_store_i64(em_data_ptr(vals), vals->dtype, o, st->x.v);
  else if (vals) em_store_f64(em_data_ptr(vals), vals->dtype, o, st->e.v);
  if (idx) ((int64_t *)em_data_ptr(idx))[o] = r->ints ? st->x.idx : st->e.idx;
}

static int cpu_extreme(const em_tensor *a, const rdims *r, bool is_max, em_tensor *vals, em_tensor *idx) {
  rplan p; plan_init(&p, a, r->mask);
  bool ints = !em_dtype_is_float(a->dtype);
  red_op op = {.a = a, .p = &p, .ints = ints, .fn = ints ? ext_i : ext_f, .init = init_ext,
               .combine = ints ? comb_ext_i : comb_ext_f, .finish = finish_ext, .out = vals, .out2 = idx,
               .kind = is_max};
  return red_run(&op);
}

/* The device switch for max/min/argmax/argmin. */
static int run_extreme(const char *name, const em_tensor *a, const rdims *r, bool is_max, em_tensor *vals, em_tensor *idx) {
  EM_OP_COST(em_cost_nbytes(a) + em_cost_nbytes(vals) + em_cost_nbytes(idx), em_numel(a), em_cost_simt_class(a->dtype));
  if (a->device.type == EM_CPU) return cpu_extreme(a, r, is_max, vals, idx);
  if (a->device.type == EM_CUDA) { rplan p; plan_init(&p, a, r->mask); return em_extreme_cuda(name, a, &p, is_max, vals, idx); }
  return em_error_device(name, a);
}

/* Validate and describe a max/min/argmax/argmin reduction over one dim or all. */
static int extreme_dims(const char *name, const em_tensor *a, int64_t dim, bool keepdim, rdims *r) {
  if (dim == EM_ALL_DIMS) {
    if (em_numel(a) == 0)
      return em_error("%s: cannot reduce an empty tensor over all dims (give a dim whose size is not 0)", name);
    return parse_dims(name, a, 0, NULL, keepdim, r);
  }
  if (parse_dims(name, a, 1, &dim, keepdim, r)) return -1;
  int d;
  em_wrap_dim(name, dim, a->ndim, &d);
  if (a->ndim > 0 && a->shape[d] == 0)
    return em_error("%s: cannot reduce over dim %d of size 0", name, d);
  return 0;
}

/* Gradient to the positions the indices name (saved[0]); i[2] = the dim. */
static int cpu_scatter_grad(em_tensor *res, em_tensor *g, em_tensor *idx, const em_node *n) {
  int d = (int)n->i[2], nd = n->in_ndim[0];
  int64_t ks[EM_MAX_DIMS], kst[EM_MAX_DIMS], pos[EM_MAX_DIMS] = {0};
  keep_shape_of(n, ks);
  em_contiguous_strides(nd, res->shape, kst);
  em_tensor *gc = em_contiguous_as(g, res->dtype), *ic = em_contiguous_as(idx, EM_I64);
  if (!gc || !ic) { em_tensor_release(gc); em_tensor_release(ic); return -1; }
  int64_t count = em_shape_numel(nd, ks);
  const int64_t *iv = em_data_ptr(ic);
  for (int64_t o = 0; o < count; o++) {
    int64_t off = 0;
    for (int k = 0; k < nd; k++) off += (k == d ? iv[o] : pos[k]) * kst[k];
    em_store_f64(em_data_ptr(res), res->dtype, off, em_load_f64(em_data_ptr(gc), gc->dtype, o));
    for (int k = nd - 1; k >= 0; k--) { if (++pos[k] < ks[k]) break; pos[k] = 0; }
  }
  em_tensor_release(gc); em_tensor_release(ic);
  return 0;
}

static int extreme_dim_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *g = gout[0];
  em_tensor *res = em_zeros(n->in_ndim[0], n->in_shape[0], g->dtype, g->device);
  if (!res) return -1;
  int rc;
  if (g->device.type == EM_CPU) rc = cpu_scatter_grad(res, g, n->saved[0], n);
  else if (g->device.type == EM_CUDA) {
    int64_t ks[EM_MAX_DIMS];
    keep_shape_of(n, ks);
    rc = em_scatter_dim_cuda(n->op, res, g, n->saved[0], (int)n->i[2], ks);
  }
  else rc = em_error_device(n->op, g);
  if (rc) { em_tensor_release(res); return -1; }
  gin[0] = res;
  return 0;
}

/* Over all dims the gradient is shared evenly by every position equal to the
 * extreme (NaN counts as equal to a NaN result), as PyTorch does. saved: a, out. */
static int extreme_all_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *a = n->saved[0], *out = n->saved[1];
  em_scratch s = {0};
  em_tensor *eq = EM_TMP(&s, em_binary(EM_EQ, a, out, NULL));
  em_tensor *na = EM_TMP(&s, em_binary(EM_NE, a, a, NULL));
  em_tensor *no = EM_TMP(&s, em_binary(EM_NE, out, out, NULL));
  em_tensor *nn = EM_TMP(&s, em_binary(EM_LOGICAL_AND, na, no, NULL));
  em_tensor *m = EM_TMP(&s, em_binary(EM_LOGICAL_OR, eq, nn, NULL));
  em_tensor *mf = EM_TMP(&s, em_to(m, gout[0]->dtype, gout[0]->device));
  em_tensor *cnt = EM_TMP(&s, em_sum(mf, 0, NULL, false));
  em_tensor *w = EM_TMP(&s, em_binary(EM_DIV, mf, cnt, NULL));
  em_tensor *gk = EM_TMP(&s, unsqueeze_grad(n, gout[0]));
  em_tensor *r = EM_TMP(&s, em_binary(EM_MUL, w, gk, NULL));
  return em_scratch_end_into(&s, r, &gin[0]);
}

static em_tensor *extreme(const char *name, em_tensor *a, int64_t dim, bool keepdim, em_tensor **indices, bool is_max) {
  if (indices) *indices = NULL;
  EM_CHECK_NULL(a, "%s: expected a tensor, got NULL", name);
  rdims r;
  if (extreme_dims(name, a, dim, keepdim, &r)) return NULL;
  bool all = dim == EM_ALL_DIMS;
  em_tensor *vals = em_empty(r.out_ndim, r.out_shape, a->dtype, a->device);
  em_tensor *idx = all ? NULL : em_empty(r.out_ndim, r.out_shape, EM_I64, a->device);
  if (!vals || (!all && !idx)) { em_tensor_release(vals); em_tensor_release(idx); return NULL; }
  if (run_extreme(name, a, &r, is_max, vals, idx)) {
    em_tensor_release(vals); em_tensor_release(idx); return NULL;
  }
  em_node *n;
  vals = record_reduction(vals, &n, name, all ? extreme_all_backward : extreme_dim_backward, a, &r, keepdim,
                          all ? a : idx, all ? vals : NULL);
  if (!vals) { em_tensor_release(idx); return NULL; }
  if (n && !all) {
    int d = 0;
    if (a->ndim) em_wrap_dim(name, dim, a->ndim, &d);
    n->i[2] = d;
  }
  if (indices) *indices = idx; else em_tensor_release(idx);
  return vals;
}

em_tensor *em_max(em_tensor *a, int64_t dim, bool keepdim, em_tensor **indices) {
  EM_OP_SCOPE("max");
  return extreme("max", a, dim, keepdim, indices, true);
}

em_tensor *em_min(em_tensor *a, int64_t dim, bool keepdim, em_tensor **indices) {
  EM_OP_SCOPE("min");
  return extreme("min", a, dim, keepdim, indices, false);
}

static em_tensor *arg_extreme(const char *name, em_tensor *a, int64_t dim, bool keepdim, bool is_max) {
  EM_CHECK_NULL(a, "%s: expected a tensor, got NULL", name);
  rdims r;
  if (extreme_dims(name, a, dim, keepdim, &r)) return NULL;
  em_tensor *idx = em_empty(r.out_ndim, r.out_shape, EM_I64, a->device);
  if (!idx) return NULL;
  if (run_extreme(name, a, &r, is_max, NULL, idx)) { em_tensor_release(idx); return NULL; }
  return idx;
}

em_tensor *em_argmax(em_tensor *a, int64_t dim, bool keepdim) {
  EM_OP_SCOPE("argmax");
  return arg_extreme("argmax", a, dim, keepdim, true);
}

em_tensor *em_argmin(em_tensor *a, int64_t dim, bool keepdim) {
  EM_OP_SCOPE("argmin");
  return arg_extreme("argmin", a, dim, keepdim, false);
}

/* ---------------- logsumexp ---------------- */

/* max + log(sum(exp(x - max))) over the reduced space: the max in a first
 * pass; an infinite max shifts by 0, a NaN max makes the result NaN. */
static void init_max(const red_op *r, int64_t o, rstate *st) {
  EM_UNUSED(r); EM_UNUSED(o);
  st->e = (fext){-INFINITY, 0, true, false};
}

static void finish_shift(const red_op *r, int64_t o, rstate *st) {
  double m = st->e.v;
  ((double *)r->out)[o] = isnan(m) ? NAN : isinf(m) || !st->e.any ? 0 : m;
}

static void init_sumexp(const red_op *r, int64_t o, rstate *st) { st->f.acc = 0; st->f.ref = r->aux[o]; }

static void finish_lse(const red_op *r, int64_t o, rstate *st) {
  em_tensor *res = r->out;
  double shift = r->aux[o];
  em_store_f64(em_data_ptr(res), res->dtype, o, isnan(shift) ? NAN : shift + log(st->f.acc));
}

static int cpu_logsumexp(em_tensor *res, const em_tensor *a, const rplan *p) {
  double *shift = malloc(sizeof(double) * (size_t)EM_MAX(p->n_out, 1));
  if (!shift) return em_error_oom("out of memory: logsumexp maxima (%lld)", (long long)p->n_out);
  red_op m = {.a = a, .p = p, .fn = ext_f, .init = init_max, .combine = comb_ext_f, .finish = finish_shift,
              .out = shift};
  red_op l = {.a = a, .p = p, .fn = sumexp_f, .init = init_sumexp, .combine = comb_sum_f, .finish = finish_lse,
              .out = res, .aux = shift};
  int rc = red_run(&m);
  if (!rc) rc = red_run(&l);
  free(shift);
  return rc;
}

static int logsumexp_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_scratch s = {0};
  em_tensor *ok = EM_TMP(&s, unsqueeze_grad(n, n->saved[1]));
  em_tensor *d = EM_TMP(&s, em_binary(EM_SUB, n->saved[0], ok, NULL));
  em_tensor *e = EM_TMP(&s, em_unary(EM_EXP, d, NULL));
  em_tensor *gk = EM_TMP(&s, unsqueeze_grad(n, gout[0]));
  em_tensor *r = EM_TMP(&s, em_binary(EM_MUL, e, gk, NULL));
  return em_scratch_end_into(&s, r, &gin[0]);
}

em_tensor *em_logsumexp(em_tensor *a, int64_t dim, bool keepdim) {
  EM_OP_SCOPE("logsumexp");
  EM_CHECK_NULL(a, "logsumexp: expected a tensor, got NULL");
  rdims r;
  if (parse_dims("logsumexp", a, dim == EM_ALL_DIMS ? 0 : 1, &dim, keepdim, &r)) return NULL;
  em_dtype dt = em_dtype_is_float(a->dtype) ? a->dtype : EM_F32;
  em_tensor *res = em_empty(r.out_ndim, r.out_shape, dt, a->device);
  if (!res) return NULL;
  rplan p; plan_init(&p, a, r.mask);
  EM_OP_COST(em_cost_nbytes(a) + em_cost_nbytes(res), 4 * em_numel(a), em_cost_simt_class(a->dtype));
  int rc;
  if (a->device.type == EM_CPU) rc = cpu_logsumexp(res, a, &p);
  else if (a->device.type == EM_CUDA) {
    rc = em_logsumexp_rows_cuda("logsumexp", res, a, &p);
    if (rc > 0) rc = em_logsumexp_cuda("logsumexp", res, a, &p);
  }
  else rc = em_error_device("logsumexp", a);
  if (rc) { em_tensor_release(res); return NULL; }
  return record_reduction(res, NULL, "logsumexp", logsumexp_backward, a, &r, keepdim, a, res);
}

/* ---------------- softmax, log_softmax ---------------- */

static void store_row(em_tensor *t, int64_t off, int64_t st, int64_t n, const double *v) {
  void *p = t->storage->data;
  if (t->dtype == EM_F32) { float *d = (float *)p + off; for (int64_t i = 0; i < n; i++) d[i * st] = (float)v[i]; return; }
  for (int64_t i = 0; i < n; i++) em_store_f64(p, t->dtype, off + i * st, v[i]);
}

/* Maximum ignoring NaN, with four independent chains. */
static double row_max(const double *v, int64_t n) {
  double m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; k++) m[k] = v[i + k] > m[k] ? v[i + k] : m[k];
  for (; i < n; i++) m[0] = v[i] > m[0] ? v[i] : m[0];
  double a = m[0] > m[1] ? m[0] : m[1], b = m[2] > m[3] ? m[2] : m[3];
  return a > b ? a : b;
}

/* For each row along dim d: load it once into a double buffer, then
 * y = exp(x - max) / sum (one exp per element) or y = x - max - log(sum).
 * Rows are spread over the threads, each with its own buffer. */
typedef struct {
  em_tensor *res;
  const em_tensor *a;
  rplan p, q;                /* kept structure over the input and the output */
  int64_t len, sa, so;
  bool log_out;
  bool stream;               /* a large output: each row made in a buffer, streamed out (stream.h) */
  int failed;                /* a thread could not allocate its row buffer */
} softmax_job;

/* Contiguous f32 rows in and out: em_softmax_row_f32 (SIMD exp, lane sums). */
EM_SIMD_CLONES static void softmax_rows_f32(void *ctx, int64_t o0, int64_t o1) {
  softmax_job *j = ctx;
  /* no buffer (out of memory): regular stores, the same values */
  float *buf = j->stream ? aligned_alloc(64, (size_t)(j->len * 4 + 63) / 64 * 64) : NULL;
  kiter ia = kiter_at(&j->p, j->a->offset, o0), io = kiter_at(&j->q, j->res->offset, o0);
  for (int64_t o = o0; o < o1; o++) {
    float *y = (float *)j->res->storage->data + io.off;
    em_softmax_row_f32((const float *)j->a->storage->data + ia.off, buf ? buf : y, j->len, j->log_out);
    if (buf) em_stream_copy(y, buf, j->len * 4);
    kiter_next(&ia, &j->p);
    kiter_next(&io, &j->q);
  }
  free(buf);
}

static void softmax_rows(void *ctx, int64_t o0, int64_t o1) {
  softmax_job *j = ctx;
  int64_t len = j->len;
  bool f64 = j->a->dtype == EM_F64;   /* f32/bf16/f16: expf (the output is f32 or narrower), sums in double */
  double *row = malloc(sizeof(double) * (size_t)len);
  if (!row) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
  kiter ia = kiter_at(&j->p, j->a->offset, o0), io = kiter_at(&j->q, j->res->offset, o0);
  for (int64_t o = o0; o < o1; o++) {
    load_f64(row, j->a, ia.off, j->sa, len);
    double sum = 0, mx = row_max(row, len);   /* a NaN makes the sum NaN: the row becomes NaN */
    if (j->log_out) {
      if (f64) for (int64_t i = 0; i < len; i++) sum += exp(row[i] - mx);
      else for (int64_t i = 0; i < len; i++) sum += expf((float)(row[i] - mx));
      double sh = mx + log(sum);
      for (int64_t i = 0; i < len; i++) row[i] -= sh;
    } else {
      if (f64) for (int64_t i = 0; i < len; i++) { row[i] = exp(row[i] - mx); sum += row[i]; }
      else for (int64_t i = 0; i < len; i++) { row[i] = expf((float)(row[i] - mx)); sum += row[i]; }
      double inv = 1.0 / sum;
      for (int64_t i = 0; i < len; i++) row[i] *= inv;
    }
    store_row(j->res, io.off, j->so, len, row);
    kiter_next(&ia, &j->p);
    kiter_next(&io, &j->q);
  }
  free(row);
}

static int cpu_softmax(em_tensor *res, const em_tensor *a, int d, bool log_out) {
  uint32_t mask = a->ndim ? 1u << d : 0;
  softmax_job j = {.res = res, .a = a, .log_out = log_out};
  plan_init(&j.p, a, mask);
  plan_init(&j.q, res, mask);    /* the same kept positions in the same order over res */
  j.len = a->ndim ? a->shape[d] : 1;
  j.sa = a->ndim ? a->stride[d] : 0;
  j.so = res->ndim ? res->stride[d] : 0;
  if (j.len == 0 || j.p.n_out == 0) return 0;
  bool fast = a->dtype == EM_F32 && res->dtype == EM_F32 && (j.sa == 1 || j.len == 1) && (j.so == 1 || j.len == 1);
  j.stream = fast && em_stream_wanted(em_numel(res) * 4);
  em_parallel_for(j.p.n_out, em_grain(4 * j.len), fast ? softmax_rows_f32 : softmax_rows, &j);
  if (j.failed) return em_error_oom("out of memory: a softmax row of %lld elements", (long long)j.len);
  return 0;
}

/* The backward row by row on the CPU: gx = y * (g - sum(g * y)) or
 * g - exp(y) * sum(g), rows in double, spread over the threads. */
typedef struct {
  em_tensor *gx;
  const em_tensor *g, *y;
  rplan pg, py, px;
  int64_t len, sg, sy, sx;
  bool log_out;
  int failed;
} softmax_bwd_job;

static void softmax_bwd_rows(void *ctx, int64_t o0, int64_t o1) {
  softmax_bwd_job *j = ctx;
  int64_t len = j->len;
  double *gr = malloc(sizeof(double) * 2 * (size_t)len), *yr = gr + len;
  if (!gr) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
  kiter ig = kiter_at(&j->pg, j->g->offset, o0), iy = kiter_at(&j->py, j->y->offset, o0),
        ix = kiter_at(&j->px, j->gx->offset, o0);
  for (int64_t o = o0; o < o1; o++) {
    load_f64(gr, j->g, ig.off, j->sg, len);
    load_f64(yr, j->y, iy.off, j->sy, len);
    double s = 0;
    if (j->log_out) {
      for (int64_t i = 0; i < len; i++) s += gr[i];
      for (int64_t i = 0; i < len; i++) gr[i] -= exp(yr[i]) * s;
    } else {
      for (int64_t i = 0; i < len; i++) s += gr[i] * yr[i];
      for (int64_t i = 0; i < len; i++) gr[i] = yr[i] * (gr[i] - s);
    }
    store_row(j->gx, ix.off, j->sx, len, gr);
    kiter_next(&ig, &j->pg);
    kiter_next(&iy, &j->py);
    kiter_next(&ix, &j->px);
  }
  free(gr);
}

static int cpu_softmax_backward(em_tensor *gx, const em_tensor *g, const em_tensor *y, int d, bool log_out) {
  uint32_t mask = y->ndim ? 1u << d : 0;
  softmax_bwd_job j = {.gx = gx, .g = g, .y = y, .log_out = log_out};
  plan_init(&j.pg, g, mask);
  plan_init(&j.py, y, mask);
  plan_init(&j.px, gx, mask);
  j.len = y->ndim ? y->shape[d] : 1;
  j.sg = g->ndim ? g->stride[d] : 0;
  j.sy = y->ndim ? y->stride[d] : 0;
  j.sx = gx->ndim ? gx->stride[d] : 0;
  if (j.len == 0 || j.py.n_out == 0) return 0;
  em_parallel_for(j.py.n_out, em_grain(4 * j.len), softmax_bwd_rows, &j);
  if (j.failed) return em_error_oom("out of memory: a softmax row of %lld elements", (long long)j.len);
  return 0;
}

static int softmax_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *y = n->saved[0], *g = gout[0];
  int64_t dim = n->i[2];
  bool log_out = n->i[3] != 0;
  bool same_shape = g->ndim == y->ndim && em_same_shape(g, y);
  if (g->device.type == EM_CUDA || (g->device.type == EM_CPU && same_shape)) {   /* fused: two passes over (g, y) per row */
    em_tensor *gx = em_empty(y->ndim, y->shape, em_promote(g->dtype, y->dtype), y->device);
    if (!gx) return -1;
    /* read g and y, write gx; g*y, the row sum, g - s, y * (...) */
    EM_OP_COST(em_cost_bytes(3, (em_tensor *const[]){g, y, gx}), 4 * em_numel(gx), em_cost_simt_class(gx->dtype));
    int rc = g->device.type == EM_CPU ? cpu_softmax_backward(gx, g, y, (int)dim, log_out)
                                      : em_softmax_backward_cuda(n->op, gx, g, y, (int)dim, log_out);
    if (rc) { em_tensor_release(gx); return -1; }
    gin[0] = gx;
    return 0;
  }
  em_scratch s = {0};
  em_tensor *r;
  if (log_out) {   /* g - exp(y) * sum(g) */
    em_tensor *sg = EM_TMP(&s, em_sum(g, 1, &dim, true));
    em_tensor *p = EM_TMP(&s, em_unary(EM_EXP, y, NULL));
    em_tensor *t = EM_TMP(&s, em_binary(EM_MUL, p, sg, NULL));
    r = EM_TMP(&s, em_binary(EM_SUB, g, t, NULL));
  } else {         /* y * (g - sum(g * y)) */
    em_tensor *gy = EM_TMP(&s, em_binary(EM_MUL, g, y, NULL));
    em_tensor *sg = EM_TMP(&s, em_sum(gy, 1, &dim, true));
    em_tensor *d = EM_TMP(&s, em_binary(EM_SUB, g, sg, NULL));
    r = EM_TMP(&s, em_binary(EM_MUL, y, d, NULL));
  }
  return em_scratch_end_into(&s, r, &gin[0]);
}

static em_tensor *softmax_like(const char *name, em_tensor *a, int64_t dim, bool log_out) {
  EM_CHECK_NULL(a, "%s: expected a tensor, got NULL", name);
  EM_CHECK_NULL(em_dtype_is_float(a->dtype), "%s: expected a floating-point input, got %s", name,
                em_dtype_name(a->dtype));
  int d;
  if (em_wrap_dim(name, dim, a->ndim, &d)) return NULL;
  em_tensor *res = em_empty(a->ndim, a->shape, a->dtype, a->device);
  if (!res) return NULL;
  /* read a, write res; max, subtract, exp, sum, scale per element */
  EM_OP_COST(em_cost_nbytes(a) + em_cost_nbytes(res), 5 * em_numel(a), em_cost_simt_class(a->dtype));
  int rc;
  if (a->device.type == EM_CPU) rc = cpu_softmax(res, a, d, log_out);
  else rc = em_softmax_cuda(name, res, a, a->ndim ? d : 0, log_out);
  if (rc) { em_tensor_release(res); return NULL; }
  em_node *n;
  res = em_op_record(res, &n, name, softmax_backward, 1, &a, 1, &res);
  if (n) { n->i[2] = a->ndim ? d : 0; n->i[3] = log_out; }
  return res;
}

/* softmax and log_softmax are on autocast's f32 list */
em_tensor *em_softmax(em_tensor *a, int64_t dim) {
  EM_OP_SCOPE("softmax");
  em_op_args u;
  if (em_op_autocast(&u, EM_AUTOCAST_F32, 1, &a)) return NULL;
  em_tensor *r = softmax_like("softmax", u.t[0], dim, false);
  em_op_args_release(&u);
  return r;
}

em_tensor *em_log_softmax(em_tensor *a, int64_t dim) {
  EM_OP_SCOPE("log_softmax");
  em_op_args u;
  if (em_op_autocast(&u, EM_AUTOCAST_F32, 1, &a)) return NULL;
  em_tensor *r = softmax_like("log_softmax", u.t[0], dim, true);
  em_op_args_release(&u);
  return r;
}

/* ======== shared with engine/ops/math_ops.c (issue 12: prod, norm, amax/amin) ========
 * The entry points those ops need from this file's machinery (declared in
 * engine/ops/math_support.h): the dims parser, the walk with more
 * accumulators (prod, the vector norms) and the extremes without indices. */
#include "math_support.h"


static void prod_f(void *s, const void *vv, int64_t n, int64_t base) {
  const double *v = vv;
  double acc = ((fsum *)s)->acc;
  for (int64_t i = 0; i < n; i++) acc *= v[i];
  ((fsum *)s)->acc = acc;
  EM_UNUSED(base);
}

static void prod_i(void *s, const void *vv, int64_t n, int64_t base) {
  const int64_t *v = vv;
  uint64_t acc = (uint64_t)((isum *)s)->acc;
  for (int64_t i = 0; i < n; i++) acc *= (uint64_t)v[i];
  ((isum *)s)->acc = (int64_t)acc;
  EM_UNUSED(base);
}

static void asum_f(void *s, const void *vv, int64_t n, int64_t base) {
  const double *v = vv;
  double acc = 0;
  for (int64_t i = 0; i < n; i++) acc += fabs(v[i]);
  ((fpow *)s)->acc += acc;
  EM_UNUSED(base);
}

static void ssq_f(void *s, const void *vv, int64_t n, int64_t base) {
  const double *v = vv;
  double acc = 0;
  for (int64_t i = 0; i < n; i++) acc += v[i] * v[i];
  ((fpow *)s)->acc += acc;
  EM_UNUSED(base);
}

static void amax_f(void *s, const void *vv, int64_t n, int64_t base) {   /* max |x|, NaN wins */
  const double *v = vv;
  double acc = ((fpow *)s)->acc;
  for (int64_t i = 0; i < n; i++) { double x = fabs(v[i]); if (!isnan(acc) && (isnan(x) || x > acc)) acc = x; }
  ((fpow *)s)->acc = acc;
  EM_UNUSED(base);
}

static void psum_f(void *s, const void *vv, int64_t n, int64_t base) {
  const double *v = vv;
  fpow *f = s;
  double acc = 0;
  for (int64_t i = 0; i < n; i++) acc += pow(fabs(v[i]), f->p);
  f->acc += acc;
  EM_UNUSED(base);
}

static void comb_prod_f(void *a, const void *b) { ((fsum *)a)->acc *= ((const fsum *)b)->acc; }
static void comb_prod_i(void *a, const void *b) {
  ((isum *)a)->acc = (int64_t)((uint64_t)((isum *)a)->acc * (uint64_t)((const isum *)b)->acc);
}
static void comb_amax(void *a, const void *b) {   /* NaN wins */
  double *acc = &((fpow *)a)->acc, x = ((const fpow *)b)->acc;
  if (!isnan(*acc) && (isnan(x) || x > *acc)) *acc = x;
}
static void comb_pow(void *a, const void *b) { ((fpow *)a)->acc += ((const fpow *)b)->acc; }

static void init_math(const red_op *r, int64_t o, rstate *st) {
  EM_UNUSED(o);
  if (r->kind == EM_RED_PROD && r->ints) st->i.acc = 1;
  else if (r->kind == EM_RED_PROD) st->f = (fsum){1, 0};
  else st->w = (fpow){0, r->x};
}

static void finish_math(const red_op *r, int64_t o, rstate *st) {
  em_tensor *res = r->out;
  void *out = em_data_ptr(res);
  if (r->kind == EM_RED_PROD && r->ints) { em_store_i64(out, res->dtype, o, st->i.acc); return; }
  if (r->kind == EM_RED_PROD) { em_store_f64(out, res->dtype, o, st->f.acc); return; }
  double v = st->w.acc, pw = r->x;
  em_store_f64(out, res->dtype, o, r->kind == EM_RED_NORM2 ? sqrt(v) : r->kind == EM_RED_NORMP ? pow(v, 1.0 / pw) : v);
}

static int cpu_reduce_math(int kind, em_tensor *res, const em_tensor *a, const rplan *p, double pw) {
  static const chunk_fn fns[] = {[EM_RED_NORM1] = asum_f, [EM_RED_NORM2] = ssq_f,
                                 [EM_RED_NORMINF] = amax_f, [EM_RED_NORMP] = psum_f};
  static void (*const combs[])(void *, const void *) = {[EM_RED_NORM1] = comb_pow, [EM_RED_NORM2] = comb_pow,
                                                        [EM_RED_NORMINF] = comb_amax, [EM_RED_NORMP] = comb_pow};
  bool ints = kind == EM_RED_PROD && !em_dtype_is_float(a->dtype);
  red_op op = {.a = a, .p = p, .ints = ints, .init = init_math, .finish = finish_math, .out = res, .x = pw,
               .kind = kind};
  op.fn = kind == EM_RED_PROD ? (ints ? prod_i : prod_f) : fns[kind];
  op.combine = kind == EM_RED_PROD ? (ints ? comb_prod_i : comb_prod_f) : combs[kind];
  return red_run(&op);
}

int em_reduce_dims(const char *name, const em_tensor *a, int ndims, const int64_t *dims, bool keepdim,
                   uint32_t *mask, int *out_ndim, int64_t *out_shape, int64_t *n_red) {
  rdims r;
  if (parse_dims(name, a, ndims, dims, keepdim, &r)) return -1;
  *mask = r.mask; *out_ndim = r.out_ndim; *n_red = r.n_red;
  memcpy(out_shape, r.out_shape, sizeof(int64_t) * (size_t)r.out_ndim);
  return 0;
}

int em_reduce_math(const char *name, int kind, em_tensor *res, const em_tensor *a, uint32_t mask, double pw) {
  EM_OP_COST(em_cost_nbytes(a) + em_cost_nbytes(res), 2 * em_numel(a), em_cost_simt_class(a->dtype));
  rplan p; plan_init(&p, a, mask);
  if (a->device.type == EM_CPU) return cpu_reduce_math(kind, res, a, &p, pw);
  if (a->device.type == EM_CUDA) return em_reduce_math_cuda(name, kind, res, a, &p, pw);
  return em_error_device(name, a);
}

int em_reduce_extreme(const char *name, const em_tensor *a, uint32_t mask, bool is_max, em_tensor *vals) {
  rdims r;
  rdims_from_mask(a, mask, false, &r);
  return run_extreme(name, a, &r, is_max, vals, NULL);
}
/* ======== end issue 12 ======== */
