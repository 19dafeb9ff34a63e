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
 *    composed formula, and max/min over a dim scatter with a kernel. */
#include "op.h"

#define CHUNK 256

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

/* Walk the reduced elements of the output element whose first input element is
 * at `off`, as doubles (ints: as int64 when `ints`). */
static void walk(const em_tensor *t, const rplan *p, int64_t off, bool ints, chunk_fn fn, void *state) {
  if (p->n_red == 0) return;
  union { double d[CHUNK]; int64_t i[CHUNK]; } buf;
  int last = p->nr - 1;
  int64_t len = p->rshape[last], st = p->rstride[last], rows = p->n_red / len, count = 0;
  int64_t idx[EM_MAX_DIMS] = {0};
  size_t es = em_dtype_size(t->dtype);
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t s = 0; s < len; s += CHUNK) {
      int64_t n = EM_MIN(CHUNK, len - s), o = off + s * st;
      const void *v = buf.d;
      if (st == 1 && t->dtype == (ints ? EM_I64 : EM_F64)) v = (const char *)t->storage->data + o * (int64_t)es;
      else if (ints) load_i64(buf.i, t, o, st, n);
      else load_f64(buf.d, t, o, st, n);
      fn(state, v, n, count);
      count += n;
    }
    for (int d = last - 1; d >= 0; d--) {
      off += p->rstride[d];
      if (++idx[d] < p->rshape[d]) break;
      off -= p->rstride[d] * p->rshape[d];
      idx[d] = 0;
    }
  }
}

/* ---------------- accumulators ---------------- */

typedef struct { double acc, ref; } fsum;       /* ref: shift (sum of exp) or mean (squared deviations) */
typedef struct { int64_t acc; } isum;
typedef struct { double v; int64_t idx; bool is_max, any; } fext;
typedef struct { int64_t v; int64_t idx; bool is_max, any; } iext;

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

/* First extreme wins; a NaN wins over everything and stays (PyTorch). */
static void ext_f(void *s, const void *vv, int64_t n, int64_t base) {
  const double *v = vv; fext *e = s;
  for (int64_t i = 0; i < n; i++) {
    double x = v[i];
    bool better = !e->any || (!isnan(e->v) && (isnan(x) || (e->is_max ? x > e->v : x < e->v)));
    if (better) { e->v = x; e->idx = base + i; e->any = true; }
  }
}

static void ext_i(void *s, const void *vv, int64_t n, int64_t base) {
  const int64_t *v = vv; iext *e = s;
  for (int64_t i = 0; i < n; i++) {
    if (!e->any || (e->is_max ? v[i] > e->v : v[i] < e->v)) { e->v = v[i]; e->idx = base + i; e->any = true; }
  }
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

static void column_sum(em_tensor *res, const em_tensor *a, const rplan *p, bool ints, double div) {
  int64_t K = p->kshape[p->nk - 1], outer = p->n_out / K;
  rplan ko = *p;                /* the outer kept dims only */
  ko.nk = p->nk - 1;
  kiter it = {{0}, a->offset};
  double acc[CHUNK], buf[CHUNK];
  int64_t iacc[CHUNK], ibuf[CHUNK];
  void *out = em_data_ptr(res);
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t k0 = 0; k0 < K; k0 += CHUNK) {
      int64_t n = EM_MIN(CHUNK, K - k0);
      for (int64_t j = 0; j < n; j++) { acc[j] = 0; iacc[j] = 0; }
      int64_t idx[EM_MAX_DIMS] = {0}, off = it.off + k0;
      for (int64_t r = 0; r < p->n_red; r++) {
        if (ints) { load_i64(ibuf, a, off, 1, n); for (int64_t j = 0; j < n; j++) iacc[j] = (int64_t)((uint64_t)iacc[j] + (uint64_t)ibuf[j]); }
        else { load_f64(buf, a, off, 1, n); for (int64_t j = 0; j < n; j++) acc[j] += buf[j]; }
        for (int d = p->nr - 1; d >= 0; d--) {
          off += p->rstride[d];
          if (++idx[d] < p->rshape[d]) break;
          off -= p->rstride[d] * p->rshape[d];
          idx[d] = 0;
        }
      }
      for (int64_t j = 0; j < n; j++) {
        if (ints) em_store_i64(out, res->dtype, o * K + k0 + j, iacc[j]);
        else em_store_f64(out, res->dtype, o * K + k0 + j, acc[j] / div);
      }
    }
    kiter_next(&it, &ko);
  }
}

/* Sum (divided by div: 1 for sum, n for mean) over the reduced dims of r. */
static void cpu_sum(em_tensor *res, const em_tensor *a, const rdims *r, bool ints, double div) {
  rplan p; plan_init(&p, a, r->mask);
  if (column_mode(&p)) { column_sum(res, a, &p, ints, div); return; }
  kiter it = {{0}, a->offset};
  void *out = em_data_ptr(res);
  for (int64_t o = 0; o < p.n_out; o++) {
    if (ints) { isum s = {0}; walk(a, &p, it.off, true, sum_i, &s); em_store_i64(out, res->dtype, o, s.acc); }
    else { fsum s = {0, 0}; walk(a, &p, it.off, false, sum_f, &s); em_store_f64(out, res->dtype, o, s.acc / div); }
    kiter_next(&it, &p);
  }
}

/* The device switch for sum and mean. */
static int run_sum(const char *name, em_tensor *res, const em_tensor *a, const rdims *r, bool ints, double div) {
  if (a->device.type == EM_CPU) { cpu_sum(res, a, r, ints, div); return 0; }
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
static int cpu_var(em_tensor *res, const em_tensor *a, const rplan *p, double dof) {
  kiter it = {{0}, a->offset};
  for (int64_t o = 0; o < p->n_out; o++) {
    fsum s = {0, 0};
    walk(a, p, it.off, false, sum_f, &s);
    fsum q = {0, s.acc / (double)p->n_red};
    walk(a, p, it.off, false, sqdev_f, &q);
    em_store_f64(em_data_ptr(res), res->dtype, o, q.acc / dof);
    kiter_next(&it, p);
  }
  return 0;
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
  int rc;
  if (a->device.type == EM_CPU) rc = cpu_var(res, a, &p, dof);
  else if (a->device.type == EM_CUDA) rc = em_var_cuda("var", res, a, &p, dof);
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
static void cpu_extreme(const em_tensor *a, const rdims *r, bool is_max, em_tensor *vals, em_tensor *idx) {
  rplan p; plan_init(&p, a, r->mask);
  kiter it = {{0}, a->offset};
  bool ints = !em_dtype_is_float(a->dtype);
  for (int64_t o = 0; o < p.n_out; o++) {
    int64_t at;
    if (ints) {
      iext e = {0, 0, is_max, false};
      walk(a, &p, it.off, true, ext_i, &e);
      if (vals) em_store_i64(em_data_ptr(vals), vals->dtype, o, e.v);
      at = e.idx;
    } else {
      fext e = {0, 0, is_max, false};
      walk(a, &p, it.off, false, ext_f, &e);
      if (vals) em_store_f64(em_data_ptr(vals), vals->dtype, o, e.v);
      at = e.idx;
    }
    if (idx) ((int64_t *)em_data_ptr(idx))[o] = at;
    kiter_next(&it, &p);
  }
}

/* The device switch for max/min/argmax/argmin. */
static int run_extreme(const char *name, const em_tensor *a, const rdims *r, bool is_max, em_tensor *vals, em_tensor *idx) {
  if (a->device.type == EM_CPU) { cpu_extreme(a, r, is_max, vals, idx); return 0; }
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

/* max + log(sum(exp(x - max))) over the reduced space at off; an infinite max shifts by 0. */
static double row_logsumexp(const em_tensor *a, const rplan *p, int64_t off) {
  fext e = {-INFINITY, 0, true, false};
  walk(a, p, off, false, ext_f, &e);
  double shift = isinf(e.v) || !e.any ? 0 : e.v;
  if (isnan(e.v)) return NAN;
  fsum s = {0, shift};
  walk(a, p, off, false, sumexp_f, &s);
  return shift + log(s.acc);
}

static int cpu_logsumexp(em_tensor *res, const em_tensor *a, const rplan *p) {
  kiter it = {{0}, a->offset};
  for (int64_t o = 0; o < p->n_out; o++) {
    em_store_f64(em_data_ptr(res), res->dtype, o, row_logsumexp(a, p, it.off));
    kiter_next(&it, p);
  }
  return 0;
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
  int rc;
  if (a->device.type == EM_CPU) rc = cpu_logsumexp(res, a, &p);
  else if (a->device.type == EM_CUDA) rc = em_logsumexp_cuda("logsumexp", res, a, &p);
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
 * y = exp(x - max) / sum (one exp per element) or y = x - max - log(sum). */
static int cpu_softmax(em_tensor *res, const em_tensor *a, int d, bool log_out) {
  uint32_t mask = a->ndim ? 1u << d : 0;
  rplan p; plan_init(&p, a, mask);
  rplan q; plan_init(&q, res, mask);    /* same kept structure over the output */
  kiter ia = {{0}, a->offset}, io = {{0}, res->offset};
  int64_t len = a->ndim ? a->shape[d] : 1, sa = a->ndim ? a->stride[d] : 0, so = res->ndim ? res->stride[d] : 0;
  if (len == 0 || p.n_out == 0) return 0;
  bool f64 = a->dtype == EM_F64;   /* f32/bf16/f16: expf (the output is f32 or narrower), sums in double */
  double *row = malloc(sizeof(double) * (size_t)len);
  if (!row) return em_error_oom("out of memory: a softmax row of %lld elements", (long long)len);
  for (int64_t o = 0; o < p.n_out; o++) {
    load_f64(row, a, ia.off, sa, len);
    double sum = 0, mx = row_max(row, len);   /* a NaN makes the sum NaN: the row becomes NaN */
    if (log_out) {
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
    store_row(res, io.off, so, len, row);
    kiter_next(&ia, &p);
    kiter_next(&io, &q);
  }
  free(row);
  return 0;
}

static int softmax_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *y = n->saved[0], *g = gout[0];
  int64_t dim = n->i[2];
  bool log_out = n->i[3] != 0;
  if (g->device.type == EM_CUDA) {   /* one fused kernel: two passes over (g, y) per row */
    em_tensor *gx = em_empty(y->ndim, y->shape, em_promote(g->dtype, y->dtype), y->device);
    if (!gx) return -1;
    if (em_softmax_backward_cuda(n->op, gx, g, y, (int)dim, log_out)) { em_tensor_release(gx); return -1; }
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

typedef struct { double acc, p; } fpow;   /* p: the norm's order */

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

static void cpu_reduce_math(int kind, em_tensor *res, const em_tensor *a, const rplan *p, double pw) {
  kiter it = {{0}, a->offset};
  bool ints = kind == EM_RED_PROD && !em_dtype_is_float(a->dtype);
  void *out = em_data_ptr(res);
  for (int64_t o = 0; o < p->n_out; o++) {
    if (ints) {
      isum s = {1};
      walk(a, p, it.off, true, prod_i, &s);
      em_store_i64(out, res->dtype, o, s.acc);
    } else if (kind == EM_RED_PROD) {
      fsum s = {1, 0};
      walk(a, p, it.off, false, prod_f, &s);
      em_store_f64(out, res->dtype, o, s.acc);
    } else {
      static const chunk_fn fns[] = {[EM_RED_NORM1] = asum_f, [EM_RED_NORM2] = ssq_f,
                                     [EM_RED_NORMINF] = amax_f, [EM_RED_NORMP] = psum_f};
      fpow s = {0, pw};
      walk(a, p, it.off, false, fns[kind], &s);
      double v = kind == EM_RED_NORM2 ? sqrt(s.acc) : kind == EM_RED_NORMP ? pow(s.acc, 1.0 / pw) : s.acc;
      em_store_f64(out, res->dtype, o, v);
    }
    kiter_next(&it, p);
  }
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
  rplan p; plan_init(&p, a, mask);
  if (a->device.type == EM_CPU) { cpu_reduce_math(kind, res, a, &p, pw); return 0; }
  if (a->device.type == EM_CUDA) return em_reduce_math_cuda(name, kind, res, a, &p, pw);
  return em_error_device(name, a);
}

int em_reduce_extreme(const char *name, const em_tensor *a, uint32_t mask, bool is_max, em_tensor *vals) {
  rdims r;
  rdims_from_mask(a, mask, false, &r);
  return run_extreme(name, a, &r, is_max, vals, NULL);
}
/* ======== end issue 12 ======== */
