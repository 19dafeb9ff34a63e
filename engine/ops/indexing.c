/* Indexing: index_select, gather, scatter (src or value), scatter_add,
 * index_add, masked_select, nonzero, take_along_dim, one_hot.
 *
 * One walk does every gather and scatter (backend.h's em_index_plan): over
 * positions p, `self` is addressed at p with p[dim] replaced by index[p] and
 * `other` at p. gather and scatter walk the index's shape; index_select and
 * index_add walk the full shape with the 1-D index broadcast (stride 0) over
 * every dim but dim; one_hot is a scatter of the value 1. So the CPU loop
 * (one em_iter over three tensors, any strides) and the CUDA kernel are
 * written once. index_select has a row-memcpy fast path for contiguous x.
 *
 * Bounds: on the CPU the index is read as contiguous i64 and every value is
 * checked before the first write, so a bad index is an error naming it, the
 * dim and its size, and an in-place scatter leaves its target untouched. On
 * CUDA nothing is read on the host (that would synchronise): the kernel never
 * follows an out-of-range index (a gather writes NaN there, a scatter skips).
 *
 * Autograd (PyTorch's formulas): index_select -> index_add of the gradient,
 * gather -> scatter_add, scatter -> (g with the written positions zeroed,
 * gather of g for src), scatter_add/index_add -> (g, gather/index_select of g
 * for src), masked_select -> the gradient scattered back under the mask and
 * summed over broadcast dims. Accumulating backwards (index_select, gather)
 * add in f32 for bf16/f16 inputs and round once (the engine casts gin).
 * take_along_dim is expand + gather, so autograd comes from those. In-place
 * forms are not recorded (ops.h: no writes into tensors that require grad).
 *
 * masked_select and nonzero need their output size on the host: on CUDA one
 * read of the mask marks a bit per element and counts per tile
 * (kernels/compact.cu), whose last block stores the count into pinned mapped
 * host memory the host spins on (EMBER_COMPACT_MAPPED=0: one 8-byte
 * device-to-host read that synchronises, as in PyTorch). Their backward marks again and reads nothing on the host.
 * EMBER_COMPACT=scan selects the previous path (i64 flags and a CUB scan). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "compact_cpu.h"
#include "op.h"
#include "parallel.h"

/* ---------------- checks ---------------- */

static int check_index_dtype(const char *op, const char *arg, const em_tensor *t) {
  if (t->dtype == EM_I64 || t->dtype == EM_I32) return 0;
  return em_error("%s: expected %s of dtype i32 or i64, got %s", op, arg, em_dtype_name(t->dtype));
}

static int check_same_dtype(const char *op, const char *arg, const em_tensor *x, const em_tensor *t) {
  if (x->dtype == t->dtype) return 0;
  return em_error("%s: expected %s of x's dtype %s, got %s", op, arg, em_dtype_name(x->dtype),
                  em_dtype_name(t->dtype));
}

static int check_not_0d(const char *op, const em_tensor *x) {
  if (x->ndim > 0) return 0;
  return em_error("%s: expected x with at least 1 dim, got a 0-dim tensor", op);
}

/* The index as the walk reads it: on the CPU contiguous i64 with every value
 * checked against [0, size); on CUDA the index itself (i32/i64, any strides). */
static em_tensor *prep_index(const char *op, em_tensor *index, int dim, int64_t size) {
  if (index->device.type != EM_CPU) return em_tensor_retain(index);
  em_tensor *ix = em_contiguous_as(index, EM_I64);
  if (!ix) return NULL;
  const int64_t *v = em_data_ptr(ix);
  for (int64_t i = 0, n = em_numel(ix); i < n; i++)
    if (v[i] < 0 || v[i] >= size) {
      em_error("%s: index %lld (at flat position %lld of the index) is out of range for dim %d of size %lld "
               "(expected 0..%lld)", op, (long long)v[i], (long long)i, dim, (long long)size, (long long)(size - 1));
      em_tensor_release(ix);
      return NULL;
    }
  return ix;
}

/* ---------------- the walk ---------------- */

/* Positions = index's shape (gather, scatter): index and other use their own strides. */
static void plan_each(em_index_plan *p, int kind, int dim, const em_tensor *self, const em_tensor *index,
                      const em_tensor *other) {
  memset(p, 0, sizeof *p);
  p->kind = kind; p->ndim = index->ndim; p->dim = dim;
  for (int d = 0; d < index->ndim; d++) {
    p->shape[d] = index->shape[d];
    p->self_stride[d] = d == dim ? 0 : self->stride[d];
    p->index_stride[d] = index->stride[d];
    p->other_stride[d] = other ? other->stride[d] : 0;
  }
  p->dim_stride = self->stride[dim];
  p->dim_size = self->shape[dim];
  p->alpha = 1;
}

/* Positions = other's shape, index 1-D (or 0-d) along dim (index_select, index_add). */
static void plan_along(em_index_plan *p, int kind, int dim, const em_tensor *self, const em_tensor *index,
                       const em_tensor *other) {
  memset(p, 0, sizeof *p);
  p->kind = kind; p->ndim = other->ndim; p->dim = dim;
  for (int d = 0; d < other->ndim; d++) {
    p->shape[d] = other->shape[d];
    p->self_stride[d] = d == dim ? 0 : self->stride[d];
    p->index_stride[d] = d == dim && index->ndim ? index->stride[0] : 0;
    p->other_stride[d] = other->stride[d];
  }
  p->dim_stride = self->stride[dim];
  p->dim_size = self->shape[dim];
  p->alpha = 1;
}

/* The CPU walk: one em_iter over self (dim's stride 0), the i64 index and other. */
#define IX_LOOP(BODY)                                                           \
  for (int64_t i_ = 0; i_ < it.numel; i_++, em_iter_next(&it)) {               \
    int64_t so = it.off[0] + ix[it.off[1]] * ds, oo = it.off[2];               \
    (void)oo;                                                                  \
    BODY;                                                                      \
  }
#define IX_COPY(T)                                                             \
  do {                                                                         \
    T *S = (T *)sb, *O = (T *)ob, v_;                                          \
    memcpy(&v_, &vbits, sizeof v_);                                            \
    if (p->kind == EM_IX_GATHER) IX_LOOP(O[oo] = S[so])                        \
    else if (p->kind == EM_IX_SCATTER) IX_LOOP(S[so] = O[oo])                  \
    else IX_LOOP(S[so] = v_)                                                   \
  } while (0)

/* A gather writes each position of `other` once: ranges of positions go over
 * the threads (scatters stay serial: repeated indices write in index order). */
typedef struct { em_iter it; const char *sb; char *ob; const int64_t *ix; int64_t ds; size_t es; } gather_job;

static void gather_range(void *ctx, int64_t i0, int64_t i1) {
  const gather_job *j = ctx;
  em_iter it = j->it;
  em_iter_seek(&it, i0);
  int64_t ds = j->ds;
  const int64_t *ix = j->ix;
#define GATHER(T) { const T *S = (const T *)j->sb; T *O = (T *)j->ob; \
                    for (int64_t i = i0; i < i1; i++, em_iter_next(&it)) { O[it.off[2]] = S[it.off[0] + ix[it.off[1]] * ds]; } } break;
  switch (j->es) {
    case 1: GATHER(uint8_t)
    case 2: GATHER(uint16_t)
    case 4: GATHER(uint32_t)
    default: GATHER(uint64_t)
  }
#undef GATHER
}

static void ix_cpu(const em_index_plan *p, em_tensor *self, const em_tensor *index, em_tensor *other) {
  em_iter it;
  it.ndim = p->ndim; it.n = 3; it.numel = em_shape_numel(p->ndim, p->shape);
  for (int d = 0; d < p->ndim; d++) {
    it.shape[d] = p->shape[d]; it.idx[d] = 0;
    it.stride[0][d] = p->self_stride[d]; it.stride[1][d] = p->index_stride[d]; it.stride[2][d] = p->other_stride[d];
  }
  it.off[0] = self->offset; it.off[1] = index->offset; it.off[2] = other ? other->offset : 0;
  for (int k = 0; k < 3; k++) it.base[k] = it.off[k];
  char *sb = em_storage_ptr(self), *ob = other ? em_storage_ptr(other) : NULL;
  const int64_t *ix = em_storage_ptr(index);
  int64_t ds = p->dim_stride;
  if (p->kind == EM_IX_GATHER) {
    gather_job j = {it, sb, ob, ix, ds, em_dtype_size(self->dtype)};
    em_parallel_for(it.numel, em_grain(4), gather_range, &j);
    return;
  }
  uint64_t vbits = 0;
  if (p->kind == EM_IX_SCATTER_VALUE) em_store_f64(&vbits, self->dtype, 0, p->value);
  if (p->kind != EM_IX_SCATTER_ADD) {
    switch (em_dtype_size(self->dtype)) {
      case 1: IX_COPY(uint8_t); break;
      case 2: IX_COPY(uint16_t); break;
      case 4: IX_COPY(uint32_t); break;
      default: IX_COPY(uint64_t); break;
    }
    return;
  }
  double a = p->alpha;
  switch (self->dtype) {
    case EM_F32: { float *S = (float *)sb; const float *O = (const float *)ob;
                   IX_LOOP(S[so] = (float)((double)S[so] + a * (double)O[oo])) break; }
    case EM_F64: { double *S = (double *)sb; const double *O = (const double *)ob;
                   IX_LOOP(S[so] += a * O[oo]) break; }
    case EM_I64: { int64_t *S = (int64_t *)sb; const int64_t *O = (const int64_t *)ob; int64_t ai = (int64_t)a;
                   IX_LOOP(S[so] = (int64_t)((uint64_t)S[so] + (uint64_t)(ai * O[oo]))) break; }
    default: {
      em_dtype dt = self->dtype;
      if (em_dtype_is_float(dt))
        IX_LOOP(em_store_f64(sb, dt, so, em_load_f64(sb, dt, so) + a * em_load_f64(ob, dt, oo)))
      else
        IX_LOOP(em_store_i64(sb, dt, so, em_load_i64(sb, dt, so) + (int64_t)a * em_load_i64(ob, dt, oo)))
      break;
    }
  }
}

/* Run a plan on the tensors' device. index comes from prep_index. */
static int ix_run(const char *op, const em_index_plan *p, em_tensor *self, const em_tensor *index,
                  em_tensor *other) {
  if (em_shape_numel(p->ndim, p->shape) == 0) return 0;
  if (self->device.type == EM_CPU) { ix_cpu(p, self, index, other); return 0; }
  return em_index_cuda(op, p, self, index, other);
}

/* A copy of x nothing records (the out-of-place forms write into it, then record once). */
static em_tensor *fresh_copy(em_tensor *x) {
  bool g = em_set_grad_enabled(false);
  em_tensor *c = em_clone(x);
  em_set_grad_enabled(g);
  return c;
}

/* The dtype a scatter-add gradient accumulates in: f32 for bf16/f16. */
static em_dtype acc_dtype(em_dtype dt) { return dt == EM_BF16 || dt == EM_F16 ? EM_F32 : dt; }

/* ---------------- index_select ---------------- */

static int index_select_validate(em_tensor *x, int64_t dim, em_tensor *index, int *d) {
  char s[160];
  if (check_index_dtype("index_select", "index", index)) return -1;
  if (em_check_same_device("index_select", x, index)) return -1;
  if (check_not_0d("index_select", x)) return -1;
  if (index->ndim > 1)
    return em_error("index_select: expected a 1-D index, got shape %s", em_shape_str(index->ndim, index->shape, s, 160));
  return em_wrap_dim("index_select", dim, x->ndim, d);
}

/* Contiguous x and out on the CPU: whole rows of the dims after dim, one
 * memcpy each; the (outer, i) rows go over the threads. */
typedef struct { const char *src; char *dst; const int64_t *ix; int64_t n, rows; size_t row; } isel_job;

static void isel_rows(void *ctx, int64_t k0, int64_t k1) {
  const isel_job *j = ctx;
  for (int64_t k = k0; k < k1; k++) {
    int64_t o = k / j->n, i = k % j->n;
    memcpy(j->dst + (size_t)k * j->row, j->src + ((size_t)(o * j->rows + j->ix[i])) * j->row, j->row);
  }
}

static void index_select_rows(const em_tensor *x, int d, const int64_t *ix, int64_t n, em_tensor *out) {
  int64_t outer = em_shape_numel(d, x->shape), inner = em_shape_numel(x->ndim - d - 1, x->shape + d + 1);
  isel_job j = {em_data_ptr(x), em_data_ptr(out), ix, n, x->shape[d], (size_t)inner * em_dtype_size(x->dtype)};
  em_parallel_for(outer * n, em_grain(inner), isel_rows, &j);
}

/* gx = zeros(x) with g's slices added at index along dim (in f32 for bf16/f16).
 * i[1]: the forward's wrap (t:index on CUDA saves the raw index, negatives included). */
static int index_select_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  int d = (int)n->i[0];
  em_dtype ct = acc_dtype(n->in_dtype[0]);
  em_tensor *g = em_to(gout[0], ct, gout[0]->device);
  em_tensor *gx = g ? em_zeros(n->in_ndim[0], n->in_shape[0], ct, g->device) : NULL;
  em_index_plan p;
  if (gx) { plan_along(&p, EM_IX_SCATTER_ADD, d, gx, n->saved[0], g); p.wrap = (int)n->i[1]; }
  if (gx && ix_run("index_select backward", &p, gx, n->saved[0], g)) { em_tensor_release(gx); gx = NULL; }
  em_tensor_release(g);
  gin[0] = gx;
  return gx ? 0 : -1;
}

/* t:index's index on the CPU: contiguous i64 with negatives wrapped (a fresh
 * copy when any is negative: the caller's tensor is never written), every
 * value checked against [-size, size). */
static em_tensor *prep_index_wrap(const char *op, em_tensor *index, int dim, int64_t size) {
  em_tensor *ix = em_contiguous_as(index, EM_I64);
  if (!ix) return NULL;
  const int64_t *v = em_data_ptr(ix), n = em_numel(ix);
  bool neg = false;
  for (int64_t i = 0; i < n; i++) {
    if (v[i] < -size || v[i] >= size) {
      em_error("%s: index %lld (at flat position %lld of the index) is out of range for dim %d of size %lld "
               "(expected %lld..%lld)", op, (long long)v[i], (long long)i, dim, (long long)size, (long long)-size,
               (long long)(size - 1));
      em_tensor_release(ix);
      return NULL;
    }
    neg |= v[i] < 0;
  }
  if (!neg) return ix;
  em_tensor *w = em_empty(ix->ndim, ix->shape, EM_I64, ix->device);
  if (w) {
    int64_t *o = em_data_ptr(w);
    for (int64_t i = 0; i < n; i++) o[i] = v[i] < 0 ? v[i] + size : v[i];
  }
  em_tensor_release(ix);
  return w;
}

/* index_select; wrap: t:index's rule (negatives count from the end). */
static em_tensor *index_select_impl(const char *op, em_tensor *x, int64_t dim, em_tensor *index, bool wrap) {
  int d;
  if (index_select_validate(x, dim, index, &d)) return NULL;
  bool on_cpu = index->device.type == EM_CPU;
  em_tensor *ix = wrap && on_cpu ? prep_index_wrap(op, index, d, x->shape[d]) : prep_index(op, index, d, x->shape[d]);
  if (!ix) return NULL;
  int64_t shape[EM_MAX_DIMS], n = em_numel(index);
  memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  shape[d] = n;
  em_tensor *out = em_empty(x->ndim, shape, x->dtype, x->device);
  if (out && x->device.type == EM_CPU && em_is_contiguous(x)) {
    index_select_rows(x, d, em_data_ptr(ix), n, out);
  } else if (out) {
    em_index_plan p;
    plan_along(&p, EM_IX_GATHER, d, x, ix, out);
    p.wrap = wrap && !on_cpu;            /* the CPU's ix is already wrapped */
    if (ix_run(op, &p, x, ix, out)) { em_tensor_release(out); out = NULL; }
  }
  em_node *node;
  out = em_op_record(out, &node, op, index_select_backward, 1, &x, 1, &ix);
  if (node) { node->i[0] = d; node->i[1] = wrap && !on_cpu; }
  em_tensor_release(ix);
  return out;
}

em_tensor *em_index_select(em_tensor *x, int64_t dim, em_tensor *index) {
  EM_OP_SCOPE("index_select");
  return index_select_impl("index_select", x, dim, index, false);
}

em_tensor *em_index_select_wrap(em_tensor *x, int64_t dim, em_tensor *index) {
  EM_OP_SCOPE("index");
  return index_select_impl("index", x, dim, index, true);
}

/* ---------------- gather ---------------- */

/* index (and src) have x's ndim; index fits in src everywhere and in x but along dim. */
static int shapes_validate(const char *op, em_tensor *x, int64_t dim, em_tensor *index, em_tensor *src, int *d) {
  char s1[160], s2[160];
  if (check_index_dtype(op, "index", index)) return -1;
  if (em_check_same_device(op, x, index)) return -1;
  if (src && em_check_same_device(op, x, src)) return -1;
  if (src && check_same_dtype(op, "src", x, src)) return -1;
  if (check_not_0d(op, x)) return -1;
  if (em_wrap_dim(op, dim, x->ndim, d)) return -1;
  if (index->ndim != x->ndim)
    return em_error("%s: expected index with x's %d dims, got index of shape %s", op, x->ndim,
                    em_shape_str(index->ndim, index->shape, s1, 160));
  for (int k = 0; k < x->ndim; k++)
    if (k != *d && index->shape[k] > x->shape[k])
      return em_error("%s: expected index.size(%d) <= x.size(%d) for every dim but %d, got index of shape %s "
                      "and x of shape %s", op, k, k, *d, em_shape_str(index->ndim, index->shape, s1, 160),
                      em_shape_str(x->ndim, x->shape, s2, 160));
  if (!src) return 0;
  if (src->ndim != x->ndim)
    return em_error("%s: expected src with x's %d dims, got src of shape %s", op, x->ndim,
                    em_shape_str(src->ndim, src->shape, s1, 160));
  for (int k = 0; k < x->ndim; k++)
    if (index->shape[k] > src->shape[k])
      return em_error("%s: expected index.size(%d) <= src.size(%d) for every dim, got index of shape %s and src of "
                      "shape %s", op, k, k, em_shape_str(index->ndim, index->shape, s1, 160),
                      em_shape_str(src->ndim, src->shape, s2, 160));
  return 0;
}

/* gx = zeros(x) with g scatter-added at index (in f32 for bf16/f16). */
static int gather_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  int d = (int)n->i[0];
  em_dtype ct = acc_dtype(n->in_dtype[0]);
  em_tensor *g = em_to(gout[0], ct, gout[0]->device);
  em_tensor *gx = g ? em_zeros(n->in_ndim[0], n->in_shape[0], ct, g->device) : NULL;
  em_index_plan p;
  if (gx) plan_each(&p, EM_IX_SCATTER_ADD, d, gx, n->saved[0], g);
  if (gx && ix_run("gather backward", &p, gx, n->saved[0], g)) { em_tensor_release(gx); gx = NULL; }
  em_tensor_release(g);
  gin[0] = gx;
  return gx ? 0 : -1;
}

em_tensor *em_gather(em_tensor *x, int64_t dim, em_tensor *index) {
  EM_OP_SCOPE("gather");
  int d;
  if (shapes_validate("gather", x, dim, index, NULL, &d)) return NULL;
  em_tensor *ix = prep_index("gather", index, d, x->shape[d]);
  em_tensor *out = ix ? em_empty(index->ndim, index->shape, x->dtype, x->device) : NULL;
  em_index_plan p;
  if (out) plan_each(&p, EM_IX_GATHER, d, x, ix, out);
  if (out && ix_run("gather", &p, x, ix, out)) { em_tensor_release(out); out = NULL; }
  em_node *node;
  out = em_op_record(out, &node, "gather", gather_backward, 1, &x, 1, &ix);
  if (node) node->i[0] = d;
  em_tensor_release(ix);
  return out;
}

/* ---------------- scatter, scatter_add, index_add ---------------- */

/* saved: ix. i[0] dim, i[1] the plan kind, i[2] 1 when the index is 1-D along dim (index_add); f[0] alpha. */
static int scatter_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  int d = (int)n->i[0], kind = (int)n->i[1];
  bool along = n->i[2] != 0;
  em_tensor *g = gout[0], *ix = n->saved[0], *gx = NULL, *gs = NULL;
  em_index_plan p;
  if (em_node_needs_input_grad(n, 0) && kind == EM_IX_SCATTER_ADD) gx = em_tensor_retain(g);
  else if (em_node_needs_input_grad(n, 0)) {   /* the written positions got nothing from x */
    gx = fresh_copy(g);
    if (gx) plan_each(&p, EM_IX_SCATTER_VALUE, d, gx, ix, NULL);
    if (gx && ix_run("scatter backward", &p, gx, ix, NULL)) goto fail;
  }
  if (n->n_in > 1 && em_node_needs_input_grad(n, 1)) {
    gs = em_zeros(n->in_ndim[1], n->in_shape[1], g->dtype, g->device);
    if (!gs) goto fail;
    if (along) plan_along(&p, EM_IX_GATHER, d, g, ix, gs);
    else plan_each(&p, EM_IX_GATHER, d, g, ix, gs);
    if (ix_run("scatter backward", &p, g, ix, gs)) goto fail;
    if (n->f[0] != 1) {
      em_tensor *scaled = em_mul_scalar(gs, n->f[0]);
      em_tensor_release(gs);
      if (!(gs = scaled)) goto fail;
    }
  }
  if (em_node_needs_input_grad(n, 0) && !gx) goto fail;
  gin[0] = gx;
  if (n->n_in > 1) gin[1] = gs;
  return 0;
fail:
  em_tensor_release(gx); em_tensor_release(gs);
  return -1;
}

/* The common tail: the target (x itself in place, else a copy), the walk, the record. */
static em_tensor *scatter_common(const char *op, int kind, em_tensor *x, int d, em_tensor *ix, em_tensor *src,
                                 double value, double alpha, bool along, bool inplace) {
  if (inplace) {
    if (em_check_inplace(op, x)) return NULL;
    if (src && em_grad_enabled() && src->requires_grad)
      return em_error("%s: src requires grad; an in-place scatter is not recorded by autograd "
                      "(use the out-of-place form, detach() or ember.no_grad)", op), NULL;
  }
  em_index_plan p;
  em_tensor *out = NULL;
  if (!inplace && x->device.type == EM_CUDA && em_is_contiguous(x)) {
    /* CUDA: one kernel may read x and write all of a fresh out (em_index_from_cuda), instead of a copy + the walk */
    out = em_empty(x->ndim, x->shape, x->dtype, x->device);
    if (!out) return NULL;
    if (along) plan_along(&p, kind, d, out, ix, src);
    else plan_each(&p, kind, d, out, ix, src);
    p.value = value;
    p.alpha = alpha;
    int r = em_index_from_cuda(op, &p, out, x, ix, src);
    if (r < 0) { em_tensor_release(out); return NULL; }
    if (r == 0) { em_tensor_release(out); out = NULL; }
  }
  if (!out) {
    out = inplace ? em_tensor_retain(x) : fresh_copy(x);
    if (!out) return NULL;
    if (along) plan_along(&p, kind, d, out, ix, src);
    else plan_each(&p, kind, d, out, ix, src);
    p.value = value;
    p.alpha = alpha;
    if (inplace) em_bump_version(out);
    if (ix_run(op, &p, out, ix, src)) { em_tensor_release(out); return NULL; }
  }
  if (inplace) return out;
  em_node *node;
  out = em_op_record(out, &node, op, scatter_backward, 2, (em_tensor *[]){x, src}, 1, &ix);
  if (node) { node->i[0] = d; node->i[1] = kind; node->i[2] = along; node->f[0] = alpha; }
  return out;
}

em_tensor *em_scatter(em_tensor *x, int64_t dim, em_tensor *index, em_tensor *src, double value, bool inplace) {
  const char *op = inplace ? "scatter_" : "scatter";
  EM_OP_SCOPE(op);
  int d;
  if (shapes_validate(op, x, dim, index, src, &d)) return NULL;
  em_tensor *ix = prep_index(op, index, d, x->shape[d]);
  if (!ix) return NULL;
  em_tensor *out = scatter_common(op, src ? EM_IX_SCATTER : EM_IX_SCATTER_VALUE, x, d, ix, src, value, 1, false,
                                  inplace);
  em_tensor_release(ix);
  return out;
}

static int check_addable(const char *op, const em_tensor *x) {
  if (x->dtype != EM_BOOL) return 0;
  return em_error("%s: expected a numeric x (adds need one), got bool", op);
}

em_tensor *em_scatter_add(em_tensor *x, int64_t dim, em_tensor *index, em_tensor *src, bool inplace) {
  const char *op = inplace ? "scatter_add_" : "scatter_add";
  EM_OP_SCOPE(op);
  int d;
  if (!src) return em_error("%s: expected a src tensor, got none", op), NULL;
  if (shapes_validate(op, x, dim, index, src, &d) || check_addable(op, x)) return NULL;
  em_tensor *ix = prep_index(op, index, d, x->shape[d]);
  if (!ix) return NULL;
  em_tensor *out = scatter_common(op, EM_IX_SCATTER_ADD, x, d, ix, src, 0, 1, false, inplace);
  em_tensor_release(ix);
  return out;
}

static int index_add_validate(const char *op, em_tensor *x, int64_t dim, em_tensor *index, em_tensor *src,
                              double alpha, int *d) {
  char s1[160], s2[160];
  if (check_index_dtype(op, "index", index)) return -1;
  if (em_check_same_device(op, x, index) || em_check_same_device(op, x, src)) return -1;
  if (check_same_dtype(op, "src", x, src) || check_addable(op, x) || check_not_0d(op, x)) return -1;
  if (em_wrap_dim(op, dim, x->ndim, d)) return -1;
  if (index->ndim > 1)
    return em_error("%s: expected a 1-D index, got shape %s", op, em_shape_str(index->ndim, index->shape, s1, 160));
  bool ok = src->ndim == x->ndim && src->shape[*d] == em_numel(index);
  for (int k = 0; ok && k < x->ndim; k++) ok = k == *d || src->shape[k] == x->shape[k];
  if (!ok)
    return em_error("%s: expected src of x's shape %s with dim %d of size numel(index) = %lld, got src of shape %s",
                    op, em_shape_str(x->ndim, x->shape, s1, 160), *d, (long long)em_numel(index),
                    em_shape_str(src->ndim, src->shape, s2, 160));
  if (!em_dtype_is_float(x->dtype) && alpha != floor(alpha))
    return em_error("%s: expected an integer alpha for x of dtype %s, got %g", op, em_dtype_name(x->dtype), alpha);
  return 0;
}

em_tensor *em_index_add(em_tensor *x, int64_t dim, em_tensor *index, em_tensor *src, double alpha, bool inplace) {
  const char *op = inplace ? "index_add_" : "index_add";
  EM_OP_SCOPE(op);
  int d;
  if (!src) return em_error("%s: expected a src tensor, got none", op), NULL;
  if (index_add_validate(op, x, dim, index, src, alpha, &d)) return NULL;
  em_tensor *ix = prep_index(op, index, d, x->shape[d]);
  if (!ix) return NULL;
  em_tensor *out = scatter_common(op, EM_IX_SCATTER_ADD, x, d, ix, src, 0, alpha, true, inplace);
  em_tensor_release(ix);
  return out;
}

/* ---------------- masked_select, nonzero ---------------- */

/* t seen with broadcast strides over (ndim, shape): a raw alias, nothing recorded. */
static em_tensor *broadcast_alias(const em_tensor *t, int ndim, const int64_t *shape) {
  int64_t st[EM_MAX_DIMS];
  em_broadcast_strides(t, ndim, shape, st);
  return em_as_strided(t, ndim, shape, st, t->offset);
}

/* CUDA: pos = the inclusive count of nonzeros of t broadcast to shape (contiguous copy first). */
static em_tensor *scan_cuda(const char *op, em_tensor *t, int ndim, const int64_t *shape) {
  em_tensor *b = broadcast_alias(t, ndim, shape);
  em_tensor *c = b ? em_contiguous_as(b, b->dtype) : NULL;
  int64_t n = em_shape_numel(ndim, shape);
  em_tensor *pos = c ? em_empty(1, &n, EM_I64, t->device) : NULL;
  if (pos && n > 0 && em_nonzero_scan_cuda(op, c, pos)) { em_tensor_release(pos); pos = NULL; }
  em_tensor_release(b); em_tensor_release(c);
  return pos;
}

/* The count a scan ends with: one device-to-host read (synchronises). */
static int scan_count(em_tensor *pos, int64_t *count) {
  int64_t n = em_numel(pos);
  *count = 0;
  if (n == 0) return 0;
  int64_t none[1] = {0};
  em_tensor *last = em_as_strided(pos, 0, none, none, pos->offset + n - 1);
  double v = 0;
  int rc = last ? em_item(last, &v) : -1;
  em_tensor_release(last);
  *count = (int64_t)v;
  return rc;
}

/* EMBER_COMPACT=scan: the previous CUDA path (i64 flags + a scan; count + select) instead of the tiles (read
 * once; `tiles` or unset: the tiles; anything else: the tiles and a line on stderr naming both). */
static int compact_scan_path(void) {
  static int scan = -1;
  if (scan < 0) {
    scan = em_env_pick("EMBER_COMPACT", (const char *const[]){"tiles", "scan"}, 2);
  }
  return scan;
}

/* CUDA, tiles: mark the nonzeros of t broadcast to shape in a new workspace (*ws: the bits and each tile's offset);
 * read their count unless count is NULL (through a mapped host slot the mark stores into, else one device-to-host
 * copy: em_item). */
static int compact_mark(const char *op, em_tensor *t, int ndim, const int64_t *shape, em_tensor **ws, int64_t *count) {
  em_tensor *b = broadcast_alias(t, ndim, shape);
  em_tensor *c = b ? em_contiguous_as(b, b->dtype) : NULL;
  int64_t n = em_shape_numel(ndim, shape), nb = em_compact_ws_bytes(n);
  em_tensor *cnt = c ? em_empty(0, NULL, EM_I64, t->device) : NULL;
  *ws = cnt ? em_empty(1, &nb, EM_U8, t->device) : NULL;
  int64_t got = -1;
  double v = 0;
  int rc = *ws && em_compact_mark_cuda(op, c, *ws, cnt, count ? &got : NULL) == 0 &&
           (!count || got >= 0 || em_item(cnt, &v) == 0) ? 0 : -1;
  if (count) *count = got >= 0 ? got : (int64_t)v;
  em_tensor_release(b); em_tensor_release(c); em_tensor_release(cnt);
  if (rc) { em_tensor_release(*ws); *ws = NULL; }
  return rc;
}

static int masked_select_validate(em_tensor *x, em_tensor *mask, int *nd, int64_t *shape) {
  if (mask->dtype != EM_BOOL)
    return em_error("masked_select: expected mask of dtype bool, got %s", em_dtype_name(mask->dtype));
  if (em_check_same_device("masked_select", x, mask)) return -1;
  return em_broadcast_shape("masked_select", x->ndim, x->shape, mask->ndim, mask->shape, nd, shape);
}

/* gx = the gradient's elements put back where the mask selected them, summed over x's broadcast dims. saved: mask. */
static int masked_select_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *mask = n->saved[0], *g = gout[0];
  int nd; int64_t shape[EM_MAX_DIMS];
  if (em_broadcast_shape("masked_select backward", n->in_ndim[0], n->in_shape[0], mask->ndim, mask->shape, &nd, shape))
    return -1;
  em_tensor *gb = em_empty(nd, shape, g->dtype, g->device);
  if (!gb) return -1;
  if (g->device.type == EM_CPU) {
    em_tensor *gc = em_contiguous_as(g, g->dtype);
    if (!gc) { em_tensor_release(gb); return -1; }
    em_iter it;
    em_iter_init(&it, nd, shape, 1, (const em_tensor *[]){mask});
    const uint8_t *m = em_storage_ptr(mask);
    const char *src = em_data_ptr(gc);
    char *dst = em_data_ptr(gb);
    size_t es = em_dtype_size(g->dtype);
    for (int64_t i = 0, k = 0; i < it.numel; i++, em_iter_next(&it)) {
      if (m[it.off[0]]) memcpy(dst + (size_t)i * es, src + (size_t)(k++) * es, es);
      else memset(dst + (size_t)i * es, 0, es);
    }
    em_tensor_release(gc);
  } else if (!compact_scan_path()) {
    em_tensor *ws = NULL;
    int rc = compact_mark("masked_select backward", mask, nd, shape, &ws, NULL);
    em_tensor *gc = rc ? NULL : em_contiguous_as(g, g->dtype);
    rc = gc ? em_compact_expand_cuda("masked_select backward", ws, gc, gb) : -1;
    em_tensor_release(ws); em_tensor_release(gc);
    if (rc) { em_tensor_release(gb); return -1; }
  } else {
    em_tensor *pos = scan_cuda("masked_select backward", mask, nd, shape);
    em_tensor *gc = pos ? em_contiguous_as(g, g->dtype) : NULL;
    int rc = gc ? em_masked_scatter_cuda("masked_select backward", gc, pos, gb) : -1;
    em_tensor_release(pos); em_tensor_release(gc);
    if (rc) { em_tensor_release(gb); return -1; }
  }
  gin[0] = em_sum_to(gb, n->in_ndim[0], n->in_shape[0]);
  em_tensor_release(gb);
  return gin[0] ? 0 : -1;
}

/* Contiguous copies of x and mask over the broadcast shape (aliases when they already are), then
 * compact_cpu.c's two parallel passes. */
static em_tensor *masked_select_cpu(em_tensor *x, em_tensor *mask, int nd, const int64_t *shape) {
  em_tensor *xb = broadcast_alias(x, nd, shape), *mb = xb ? broadcast_alias(mask, nd, shape) : NULL;
  em_tensor *xc = mb ? em_contiguous_as(xb, x->dtype) : NULL, *mc = xc ? em_contiguous_as(mb, EM_BOOL) : NULL;
  em_tensor *out = NULL;
  int64_t *offs = NULL, n = em_shape_numel(nd, shape);
  int64_t count = mc ? em_cpu_compact_count(em_data_ptr(mc), 1, false, n, &offs) : -1;
  if (mc && count < 0) em_error("masked_select: out of host memory for %lld block offsets", (long long)n);
  if (count >= 0 && (out = em_empty(1, &count, x->dtype, x->device)) && count > 0)
    em_cpu_compact_select(em_data_ptr(mc), n, offs, em_data_ptr(xc), em_dtype_size(x->dtype), em_data_ptr(out));
  free(offs);
  em_tensor_release(xb); em_tensor_release(mb); em_tensor_release(xc); em_tensor_release(mc);
  return out;
}

/* EMBER_COMPACT_ONEPASS=1: masked_select in one launch into an output of the worst-case size (numel of the
 * broadcast shape); the result is its first count elements (a view: the storage keeps the whole block). Off
 * by default: it trades memory (up to numel x element size per result) for the host round trip between the
 * passes. */
static int compact_onepass(void) {
  static int on = -1;
  if (on < 0) on = em_env_digit("EMBER_COMPACT_ONEPASS", 1, 0);
  return on;
}

static em_tensor *masked_select_onepass(em_tensor *x, em_tensor *mask, int nd, const int64_t *shape) {
  const char *op = "masked_select";
  int64_t n = em_shape_numel(nd, shape), nb = em_compact_select1_ws_bytes(n);
  em_tensor *mb = broadcast_alias(mask, nd, shape), *xb = broadcast_alias(x, nd, shape);
  em_tensor *mc = mb ? em_contiguous_as(mb, EM_BOOL) : NULL, *xc = xb ? em_contiguous_as(xb, x->dtype) : NULL;
  em_tensor *full = mc && xc ? em_empty(1, &n, x->dtype, x->device) : NULL;
  em_tensor *ws = full ? em_empty(1, &nb, EM_U8, x->device) : NULL;
  em_tensor *cnt = ws ? em_empty(0, NULL, EM_I64, x->device) : NULL;
  double v = 0;
  int rc = cnt && em_compact_select1_cuda(op, mc, xc, ws, cnt, full) == 0 && em_item(cnt, &v) == 0 ? 0 : -1;
  int64_t count = (int64_t)v, one = 1;
  em_tensor *out = rc ? NULL : count == n ? em_tensor_retain(full) : em_as_strided(full, 1, &count, &one, full->offset);
  em_tensor_release(mb); em_tensor_release(xb); em_tensor_release(mc); em_tensor_release(xc);
  em_tensor_release(full); em_tensor_release(ws); em_tensor_release(cnt);
  return out;
}

static em_tensor *masked_select_cuda(em_tensor *x, em_tensor *mask, int nd, const int64_t *shape) {
  if (!compact_scan_path() && compact_onepass()) return masked_select_onepass(x, mask, nd, shape);
  if (!compact_scan_path()) {
    em_tensor *ws = NULL;
    int64_t count;
    if (compact_mark("masked_select", mask, nd, shape, &ws, &count)) return NULL;
    em_tensor *xb = broadcast_alias(x, nd, shape);
    em_tensor *xc = xb ? em_contiguous_as(xb, x->dtype) : NULL;
    em_tensor *out = xc ? em_empty(1, &count, x->dtype, x->device) : NULL;
    if (out && count > 0 && em_compact_select_cuda("masked_select", ws, xc, out)) { em_tensor_release(out); out = NULL; }
    em_tensor_release(ws); em_tensor_release(xb); em_tensor_release(xc);
    return out;
  }
  em_tensor *pos = scan_cuda("masked_select", mask, nd, shape);
  em_tensor *xb = pos ? broadcast_alias(x, nd, shape) : NULL;
  em_tensor *xc = xb ? em_contiguous_as(xb, x->dtype) : NULL;
  int64_t count;
  em_tensor *out = xc && !scan_count(pos, &count) ? em_empty(1, &count, x->dtype, x->device) : NULL;
  if (out && count > 0 && em_masked_select_cuda("masked_select", xc, pos, out)) { em_tensor_release(out); out = NULL; }
  em_tensor_release(pos); em_tensor_release(xb); em_tensor_release(xc);
  return out;
}

em_tensor *em_masked_select(em_tensor *x, em_tensor *mask) {
  EM_OP_SCOPE("masked_select");
  int nd; int64_t shape[EM_MAX_DIMS];
  if (masked_select_validate(x, mask, &nd, shape)) return NULL;
  em_tensor *out = x->device.type == EM_CPU ? masked_select_cpu(x, mask, nd, shape)
                                             : masked_select_cuda(x, mask, nd, shape);
  return em_op_record(out, NULL, "masked_select", masked_select_backward, 1, &x, 1, &mask);
}

/* compact_cpu.c's two parallel passes over a contiguous x (every dtype is 1, 2, 4 or 8 bytes). */
static em_tensor *nonzero_cpu(em_tensor *x) {
  em_tensor *c = em_contiguous_as(x, x->dtype), *out = NULL;
  int64_t *offs = NULL, n = em_numel(x);
  const size_t es = em_dtype_size(x->dtype);
  const bool fl = em_dtype_is_float(x->dtype) != 0;
  int64_t count = c ? em_cpu_compact_count(em_data_ptr(c), es, fl, n, &offs) : -1;
  if (c && count < 0) em_error("nonzero: out of host memory for %lld block offsets", (long long)n);
  int64_t shape[2] = {count, x->ndim};
  if (count >= 0 && (out = em_empty(2, shape, EM_I64, x->device)) && count > 0)
    em_cpu_compact_coords(em_data_ptr(c), es, fl, n, offs, x->ndim, x->shape, em_data_ptr(out));
  free(offs);
  em_tensor_release(c);
  return out;
}

/* CUDA: count (one reduction), read the count (synchronises), select (one more read of x). */
static em_tensor *nonzero_cuda(em_tensor *x) {
  if (!compact_scan_path()) {   /* mark (one read of x, the count read back), then the coordinates from the bits */
    em_tensor *ws = NULL;
    int64_t shape[2] = {0, x->ndim};
    if (compact_mark("nonzero", x, x->ndim, x->shape, &ws, &shape[0])) return NULL;
    em_tensor *out = em_empty(2, shape, EM_I64, x->device);
    if (out && em_compact_coords_cuda("nonzero", ws, em_numel(x), x->ndim, x->shape, out)) {
      em_tensor_release(out);
      out = NULL;
    }
    em_tensor_release(ws);
    return out;
  }
  em_tensor *c = em_contiguous_as(x, x->dtype);
  em_tensor *cnt = c ? em_empty(0, NULL, EM_I64, x->device) : NULL;
  int64_t shape[2] = {0, x->ndim};
  double v = 0;
  em_tensor *out = NULL;
  if (cnt && em_count_nonzero_cuda("nonzero", c, cnt) == 0 && em_item(cnt, &v) == 0) {
    shape[0] = (int64_t)v;
    out = em_empty(2, shape, EM_I64, x->device);
  }
  if (out && shape[0] > 0 && x->ndim > 0 && em_nonzero_select_cuda("nonzero", c, x->ndim, x->shape, out)) {
    em_tensor_release(out);
    out = NULL;
  }
  em_tensor_release(c);
  em_tensor_release(cnt);
  return out;
}

em_tensor *em_nonzero(em_tensor *x) {
  EM_OP_SCOPE("nonzero");
  return x->device.type == EM_CPU ? nonzero_cpu(x) : nonzero_cuda(x);
}

/* ---------------- take_along_dim, one_hot ---------------- */

static em_tensor *take_flat(em_tensor *x, em_tensor *indices) {
  int64_t flat = -1;
  em_tensor *xf = em_reshape(x, 1, &flat), *if_ = xf ? em_reshape(indices, 1, &flat) : NULL;
  em_tensor *out = if_ ? em_gather(xf, 0, if_) : NULL;
  em_tensor_release(xf); em_tensor_release(if_);
  return out;
}

em_tensor *em_take_along_dim(em_tensor *x, em_tensor *indices, int64_t dim) {
  EM_OP_SCOPE("take_along_dim");
  char s1[160], s2[160];
  if (check_index_dtype("take_along_dim", "indices", indices)) return NULL;
  if (em_check_same_device("take_along_dim", x, indices)) return NULL;
  if (dim == EM_ALL_DIMS) return take_flat(x, indices);
  int d;
  if (check_not_0d("take_along_dim", x) || em_wrap_dim("take_along_dim", dim, x->ndim, &d)) return NULL;
  if (indices->ndim != x->ndim)
    return em_error("take_along_dim: expected indices with x's %d dims, got indices of shape %s", x->ndim,
                    em_shape_str(indices->ndim, indices->shape, s1, 160)), NULL;
  int64_t xs[EM_MAX_DIMS], is[EM_MAX_DIMS];
  for (int k = 0; k < x->ndim; k++) {
    int64_t a = x->shape[k], b = indices->shape[k];
    if (k != d && a != b && a != 1 && b != 1)
      return em_error("take_along_dim: x of shape %s and indices of shape %s do not broadcast in dim %d "
                      "(every dim but %d must)", em_shape_str(x->ndim, x->shape, s1, 160),
                      em_shape_str(indices->ndim, indices->shape, s2, 160), k, d), NULL;
    xs[k] = k == d ? a : (a == 1 ? b : a);
    is[k] = k == d ? b : xs[k];
  }
  em_tensor *xe = em_expand(x, x->ndim, xs), *ie = xe ? em_expand(indices, x->ndim, is) : NULL;
  em_tensor *out = ie ? em_gather(xe, d, ie) : NULL;
  em_tensor_release(xe); em_tensor_release(ie);
  return out;
}

/* The classes' range on the CPU: an error naming the first value outside [0, c). */
static int one_hot_check(const em_tensor *ic, int64_t c) {
  const int64_t *v = em_data_ptr(ic);
  for (int64_t i = 0, n = em_numel(ic); i < n; i++)
    if (v[i] < 0 || v[i] >= c)
      return em_error("one_hot: class value %lld (at flat position %lld) is out of range for num_classes %lld "
                      "(expected 0..%lld)", (long long)v[i], (long long)i, (long long)c, (long long)(c - 1));
  return 0;
}

/* num_classes -1: max(ids) + 1 (a host read of the maximum: synchronises on CUDA). */
static int one_hot_classes(em_tensor *ids, int64_t *c) {
  if (*c >= 0) return 0;
  if (*c != -1) return em_error("one_hot: expected num_classes >= 0 or -1 (inferred), got %lld", (long long)*c);
  if (em_numel(ids) == 0) return em_error("one_hot: cannot infer num_classes from an empty tensor; pass it");
  em_tensor *m = em_max(ids, EM_ALL_DIMS, false, NULL);
  double v = 0;
  int rc = m ? em_item(m, &v) : -1;
  em_tensor_release(m);
  *c = (int64_t)v + 1;
  return rc;
}

em_tensor *em_one_hot(em_tensor *ids, int64_t num_classes) {
  EM_OP_SCOPE("one_hot");
  if (check_index_dtype("one_hot", "ids", ids)) return NULL;
  if (ids->ndim + 1 > EM_MAX_DIMS)
    return em_error("one_hot: ids have %d dims; the result would exceed %d dims", ids->ndim, EM_MAX_DIMS), NULL;
  if (one_hot_classes(ids, &num_classes)) return NULL;
  em_tensor *ic = ids->device.type == EM_CPU ? em_contiguous_as(ids, EM_I64) : em_tensor_retain(ids);
  if (!ic) return NULL;
  if (ids->device.type == EM_CPU && one_hot_check(ic, num_classes)) { em_tensor_release(ic); return NULL; }
  int nd = ids->ndim;
  int64_t shape[EM_MAX_DIMS];
  memcpy(shape, ids->shape, sizeof(int64_t) * (size_t)nd);
  shape[nd] = num_classes;
  em_tensor *out = em_zeros(nd + 1, shape, EM_I64, ids->device);
  if (out && num_classes > 0) {
    /* a scatter of 1 along the last dim, walking ids' shape with a trailing 1 */
    em_index_plan p;
    memset(&p, 0, sizeof p);
    p.kind = EM_IX_SCATTER_VALUE; p.ndim = nd + 1; p.dim = nd; p.value = 1; p.alpha = 1;
    for (int k = 0; k < nd; k++) {
      p.shape[k] = ic->shape[k]; p.self_stride[k] = out->stride[k]; p.index_stride[k] = ic->stride[k];
    }
    p.shape[nd] = 1;
    p.dim_stride = 1; p.dim_size = num_classes;
    if (ix_run("one_hot", &p, out, ic, NULL)) { em_tensor_release(out); out = NULL; }
  }
  em_tensor_release(ic);
  return out;
}
