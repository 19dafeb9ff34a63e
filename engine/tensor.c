/* Tensor headers, creation, views (with their autograd formulas), copies
 * and conversions. Views are headers over someone else's storage; the
 * storage's version counter catches in-place writes to saved tensors. */
#include <stdio.h>
#include "internal.h"
#include "ops/cost.h"
#include "parallel.h"
#include "stream.h"

/* ---------------- lifetime ---------------- */

static em_tensor *header(em_storage *s, int64_t offset, int ndim, const int64_t *shape,
                         const int64_t *stride, em_dtype dt) {
  em_tensor *t = em_header_alloc(sizeof *t);
  if (!t) { em_error_oom("out of memory: cannot allocate a tensor header"); return NULL; }
  t->refcount = 1;
  t->storage = s; em_storage_retain(s);
  t->offset = offset; t->ndim = ndim; t->dtype = dt; t->device = s->device;
  for (int i = 0; i < ndim; i++) { t->shape[i] = shape[i]; t->stride[i] = stride[i]; }
  return t;
}

em_tensor *em_tensor_retain(em_tensor *t) { if (t) t->refcount++; return t; }

void em_tensor_release(em_tensor *t) {
  if (!t || --t->refcount > 0) return;
  em_storage_release(t->storage);
  em_tensor_release(t->grad);
  em_tensor_release(t->shadow);
  if (t->grad_fn) em_node_release(t->grad_fn);
  for (em_hook *h = t->hooks, *nx; h; h = nx) {
    nx = h->next;
    if (h->ud_free) h->ud_free(h->ud);
    free(h);
  }
  em_header_free(t, sizeof *t);
}

/* ---------------- creation ---------------- */

static int check_shape(const char *op, int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > EM_MAX_DIMS)
    return em_error("%s: expected at most %d dims, got %d", op, EM_MAX_DIMS, ndim);
  int64_t n = 1, numel = 1;   /* product of max(size, 1): strides must fit even when a dim is 0 */
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return em_error("%s: negative size %lld in dim %d", op, (long long)shape[i], i);
    int64_t d = shape[i] > 1 ? shape[i] : 1;
    if (n > INT64_MAX / d) return em_error("%s: shape is too large", op);
    n *= d;
    numel = (numel == 0 || shape[i] == 0) ? 0 : numel * d;
  }
  if (numel > INT64_MAX / 16) return em_error("%s: shape is too large", op);
  return 0;
}

/* em_empty under the name of the creation op that was called (errors name it). */
static em_tensor *empty_op(const char *op, int ndim, const int64_t *shape, em_dtype dt, em_device dev) {
  if (check_shape(op, ndim, shape)) return NULL;
  if ((unsigned)dt >= EM_NDTYPES) { em_error("%s: invalid dtype %d", op, (int)dt); return NULL; }
  int64_t stride[EM_MAX_DIMS];
  em_contiguous_strides(ndim, shape, stride);
  size_t nbytes = (size_t)em_shape_numel(ndim, shape) * em_dtype_size(dt);
  em_storage *s = em_storage_new(nbytes, dev);
  if (!s) return NULL;
  em_tensor *t = header(s, 0, ndim, shape, stride, dt);
  em_storage_release(s);
  return t;
}

em_tensor *em_empty(int ndim, const int64_t *shape, em_dtype dt, em_device dev) {
  return empty_op("empty", ndim, shape, dt, dev);
}

em_tensor *em_full(int ndim, const int64_t *shape, double v, em_dtype dt, em_device dev) {
  em_tensor *t = empty_op("full", ndim, shape, dt, dev);
  if (t && em_fill_(t, v)) { em_tensor_release(t); return NULL; }
  return t;
}

/* memset(p, 0, n) over the threads, in 64 KiB segments. */
#define ZERO_SEG 65536
static void zero_segments(void *ctx, int64_t s0, int64_t s1) {
  const size_t *j = ctx;                              /* {base pointer, nbytes} */
  char *p = (char *)(uintptr_t)j[0];
  size_t lo = (size_t)s0 * ZERO_SEG, hi = EM_MIN((size_t)s1 * ZERO_SEG, j[1]);
  memset(p + lo, 0, hi - lo);
}

static void cpu_zero(void *p, size_t n) {
  size_t j[2] = {(size_t)(uintptr_t)p, n};
  em_parallel_for((int64_t)((n + ZERO_SEG - 1) / ZERO_SEG), em_grain(ZERO_SEG / 4), zero_segments, j);
}

em_tensor *em_zeros(int ndim, const int64_t *shape, em_dtype dt, em_device dev) {
  em_tensor *t = empty_op("zeros", ndim, shape, dt, dev);
  if (t && dev.type == EM_CPU) cpu_zero(t->storage->data, t->storage->nbytes);
  else if (t && em_fill_(t, 0)) { em_tensor_release(t); return NULL; }
  return t;
}

em_tensor *em_empty_like(const em_tensor *t) { return em_empty(t->ndim, t->shape, t->dtype, t->device); }
em_tensor *em_zeros_like(const em_tensor *t) { return em_zeros(t->ndim, t->shape, t->dtype, t->device); }
em_tensor *em_scalar_tensor(double v, em_dtype dt, em_device dev) { return em_full(0, NULL, v, dt, dev); }

em_tensor *em_tensor_from_storage(em_storage *s, int64_t offset, int ndim, const int64_t *shape,
                                  const int64_t *stride, em_dtype dt) {
  if (check_shape("from_storage", ndim, shape)) return NULL;
  int64_t hi = offset, lo = offset;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] == 0) { hi = lo = offset; break; }
    if (stride[i] > 0) hi += stride[i] * (shape[i] - 1); else lo += stride[i] * (shape[i] - 1);
  }
  if (lo < 0 || (em_shape_numel(ndim, shape) > 0 && (size_t)(hi + 1) * em_dtype_size(dt) > s->nbytes)) {
    em_error("from_storage: view extends past the storage (%zu bytes)", s->nbytes);
    return NULL;
  }
  return header(s, offset, ndim, shape, stride, dt);
}

/* Fill a CPU tensor from a generator of doubles (creation helpers). */
static em_tensor *make_seq(const char *op, int64_t n, double start, double step, em_dtype dt,
                           em_device dev) {
  int64_t shape[1] = {n};
  em_tensor *t = em_empty(1, shape, dt, em_cpu());
  if (!t) return NULL;
  for (int64_t i = 0; i < n; i++) em_store_f64(t->storage->data, dt, i, start + step * (double)i);
  if (dev.type != EM_CPU) {
    em_tensor *g = em_to(t, dt, dev);
    em_tensor_release(t);
    return g;
  }
  EM_UNUSED(op);
  return t;
}

em_tensor *em_arange(double start, double end, double step, em_dtype dt, em_device dev) {
  if (step == 0) { em_error("arange: step must be nonzero"); return NULL; }
  if (!isfinite(start) || !isfinite(end) || !isfinite(step)) {
    em_error("arange: start, end and step must be finite"); return NULL;
  }
  if ((end - start) * step < 0) {
    em_error("arange: the step %g points away from end %g (start %g): upper bound and step sign are "
             "inconsistent", step, end, start);
    return NULL;
  }
  double n = ceil((end - start) / step);
  if (n < 0) n = 0;
  if (n > 1e12) { em_error("arange: %g elements is too many", n); return NULL; }
  return make_seq("arange", (int64_t)n, start, step, dt, dev);
}

em_tensor *em_linspace(double start, double end, int64_t steps, em_dtype dt, em_device dev) {
  if (steps < 0) { em_error("linspace: steps must be non-negative, got %lld", (long long)steps); return NULL; }
  double step = steps > 1 ? (end - start) / (double)(steps - 1) : 0;
  em_tensor *t = make_seq("linspace", steps, start, step, dt, em_cpu());
  /* PyTorch computes the second half from the end for symmetry (steps == 1 gives start) */
  if (t && steps > 1) for (int64_t i = steps / 2; i < steps; i++)
    em_store_f64(t->storage->data, dt, i, end - step * (double)(steps - 1 - i));
  if (t && dev.type != EM_CPU) { em_tensor *g = em_to(t, dt, dev); em_tensor_release(t); return g; }
  return t;
}

em_tensor *em_eye(int64_t n, int64_t m, em_dtype dt, em_device dev) {
  if (n < 0) { em_error("eye: n must be non-negative, got %lld", (long long)n); return NULL; }
  if (m < 0) m = n;
  int64_t shape[2] = {n, m};
  em_tensor *t = empty_op("eye", 2, shape, dt, em_cpu());
  if (!t) return NULL;
  memset(t->storage->data, 0, t->storage->nbytes);
  for (int64_t i = 0; i < n && i < m; i++) em_store_f64(t->storage->data, dt, i * m + i, 1);
  if (dev.type != EM_CPU) { em_tensor *g = em_to(t, dt, dev); em_tensor_release(t); return g; }
  return t;
}

/* ---------------- inspection ---------------- */

int64_t em_numel(const em_tensor *t) { return em_shape_numel(t->ndim, t->shape); }

bool em_is_contiguous(const em_tensor *t) {
  if (em_numel(t) == 0) return true;    /* as PyTorch: nothing to lay out */
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != s) return false;
    s *= t->shape[i];
  }
  return true;
}

void *em_data_ptr(const em_tensor *t) {
  return (char *)t->storage->data + t->offset * (int64_t)em_dtype_size(t->dtype);
}

bool em_same_shape(const em_tensor *a, const em_tensor *b) {
  return a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

/* ---------------- raw aliases ---------------- */

em_tensor *em_as_strided(const em_tensor *t, int ndim, const int64_t *shape, const int64_t *stride,
                         int64_t offset) {
  return header(t->storage, offset, ndim, shape, stride, t->dtype);
}

em_tensor *em_alias(const em_tensor *t) {
  return header(t->storage, t->offset, t->ndim, t->shape, t->stride, t->dtype);
}

em_tensor *em_detach(em_tensor *t) { return em_alias(t); }

/* ---------------- view autograd ---------------- */
/* One backward per view kind; the node's ints hold the kind's parameters. */
enum { V_RESHAPE, V_TRANSPOSE, V_PERMUTE, V_NARROW, V_SELECT, V_EXPAND, V_IDENTITY };

static em_tensor *reshape_to_input(em_node *n, em_tensor *g) {
  em_tensor *c = em_contiguous(g);
  if (!c) return NULL;
  em_tensor *r = em_view(c, n->in_ndim[0], n->in_shape[0]);
  em_tensor_release(c);
  return r;
}

/* Scatter g into zeros of the input's shape at the view's position. */
static em_tensor *scatter_into_zeros(em_node *n, em_tensor *g, int kind) {
  em_tensor *z = em_zeros(n->in_ndim[0], n->in_shape[0], g->dtype, g->device);
  if (!z) return NULL;
  em_tensor *win = kind == V_NARROW ? em_narrow(z, n->i[0], n->i[1], n->i[2])
                                    : em_select(z, n->i[0], n->i[1]);
  if (!win || em_copy_(win, g)) { em_tensor_release(win); em_tensor_release(z); return NULL; }
  em_tensor_release(win);
  return z;
}

static int view_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *g = gout[0];
  int kind = (int)n->i[EM_MAX_DIMS * 2 - 1];
  switch (kind) {
    case V_RESHAPE: gin[0] = reshape_to_input(n, g); break;
    case V_TRANSPOSE: gin[0] = em_transpose(g, n->i[0], n->i[1]); break;
    case V_PERMUTE: {
      int64_t inv[EM_MAX_DIMS];
      for (int d = 0; d < n->in_ndim[0]; d++) inv[n->i[d]] = d;
      gin[0] = em_permute(g, n->in_ndim[0], inv);
      break;
    }
    case V_NARROW: case V_SELECT: gin[0] = scatter_into_zeros(n, g, kind); break;
    case V_EXPAND: gin[0] = em_sum_to(g, n->in_ndim[0], n->in_shape[0]); break;
    default: gin[0] = em_tensor_retain(g); break;
  }
  return gin[0] ? 0 : -1;
}

/* Record a view node if needed; params go into n->i. Returns out (owned). */
static em_tensor *record_view(const char *op, em_tensor *in, em_tensor *out, int kind,
                              int np, const int64_t *params) {
  if (!out) return NULL;
  if (!em_grad_needed(1, &in)) return out;
  em_node *n = em_node_new(op, view_backward, 1, 1);
  em_node_set_input(n, 0, in);
  for (int k = 0; k < np; k++) n->i[k] = params[k];
  n->i[EM_MAX_DIMS * 2 - 1] = kind;
  em_node_finish(n, out);
  return out;
}

/* ---------------- views ---------------- */

/* Compute strides for viewing t as (ndim, shape) without copying, or fail.
 * Walks groups of dims of t that are contiguous with each other (as PyTorch's
 * computeStride). Returns 0 when possible. */
static int view_strides(const em_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
  int64_t numel = em_numel(t);
  if (numel == 0 || t->ndim == 0) { em_contiguous_strides(ndim, shape, stride); return 0; }
  int view_d = ndim - 1;
  int64_t chunk_base_stride = t->stride[t->ndim - 1], tensor_numel = 1, view_numel = 1;
  for (int td = t->ndim - 1; td >= 0; td--) {
    tensor_numel *= t->shape[td];
    if (td == 0 || (t->shape[td - 1] != 1 && t->stride[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        stride[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return -1;
      if (td > 0) { chunk_base_stride = t->stride[td - 1]; tensor_numel = 1; view_numel = 1; }
    }
  }
  return view_d == -1 ? 0 : -1;
}

/* Resolve a single -1 and check the element count. */
static int infer_shape(const char *op, const em_tensor *t, int ndim, const int64_t *in, int64_t *out) {
  if (ndim > EM_MAX_DIMS) return em_error("%s: expected at most %d dims, got %d", op, EM_MAX_DIMS, ndim);
  int infer = -1; int64_t known = 1;
  for (int i = 0; i < ndim; i++) {
    out[i] = in[i];
    if (in[i] == -1) {
      if (infer >= 0) return em_error("%s: only one dimension can be -1", op);
      infer = i;
    } else if (in[i] < 0) return em_error("%s: invalid size %lld in dim %d", op, (long long)in[i], i);
    else known *= in[i];
  }
  int64_t numel = em_numel(t);
  char a[160], b[160];
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      return em_error("%s: shape %s is invalid for input of size %lld", op,
                      em_shape_str(ndim, in, a, 160), (long long)numel);
    out[infer] = numel / known;
  } else if (known != numel) {
    return em_error("%s: shape %s is invalid for input of size %lld (input shape %s)", op,
                    em_shape_str(ndim, in, a, 160), (long long)numel, em_shape_str(t->ndim, t->shape, b, 160));
  }
  return check_shape(op, ndim, out);   /* huge sizes next to a 0 would overflow strides */
}

em_tensor *em_view(em_tensor *t, int ndim, const int64_t *shape_in) {
  int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS];
  if (infer_shape("view", t, ndim, shape_in, shape)) return NULL;
  if (view_strides(t, ndim, shape, stride)) {
    char a[160], b[160], c[160];
    em_error("view: cannot view a tensor of shape %s and strides %s as %s without copying "
             "(use reshape, or contiguous() first)", em_shape_str(t->ndim, t->shape, a, 160),
             em_shape_str(t->ndim, t->stride, b, 160), em_shape_str(ndim, shape, c, 160));
    return NULL;
  }
  em_tensor *out = em_as_strided(t, ndim, shape, stride, t->offset);
  return record_view("view", t, out, V_RESHAPE, 0, NULL);
}

em_tensor *em_reshape(em_tensor *t, int ndim, const int64_t *shape_in) {
  int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS];
  if (infer_shape("reshape", t, ndim, shape_in, shape)) return NULL;
  if (view_strides(t, ndim, shape, stride) == 0) {
    em_tensor *out = em_as_strided(t, ndim, shape, stride, t->offset);
    return record_view("reshape", t, out, V_RESHAPE, 0, NULL);
  }
  em_tensor *c = em_contiguous(t);
  if (!c) return NULL;
  em_tensor *out = em_view(c, ndim, shape);
  em_tensor_release(c);
  return out;
}

em_tensor *em_flatten(em_tensor *t, int64_t start, int64_t end) {
  int s, e;
  if (em_wrap_dim("flatten", start, t->ndim, &s) || em_wrap_dim("flatten", end, t->ndim, &e)) return NULL;
  if (t->ndim == 0) { int64_t one = 1; return em_reshape(t, 1, &one); }
  if (s > e) { em_error("flatten: start_dim %d must not come after end_dim %d", s, e); return NULL; }
  int64_t shape[EM_MAX_DIMS]; int n = 0;
  for (int i = 0; i < s; i++) shape[n++] = t->shape[i];
  int64_t m = 1;
  for (int i = s; i <= e; i++) m *= t->shape[i];
  shape[n++] = m;
  for (int i = e + 1; i < t->ndim; i++) shape[n++] = t->shape[i];
  return em_reshape(t, n, shape);
}

em_tensor *em_transpose(em_tensor *t, int64_t d0, int64_t d1) {
  int a, b;
  if (t->ndim == 0 && (d0 == 0 || d0 == -1) && (d1 == 0 || d1 == -1))
    return record_view("transpose", t, em_alias(t), V_IDENTITY, 0, NULL);
  if (em_wrap_dim("transpose", d0, t->ndim, &a) || em_wrap_dim("transpose", d1, t->ndim, &b)) return NULL;
  int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape); memcpy(stride, t->stride, sizeof stride);
  shape[a] = t->shape[b]; shape[b] = t->shape[a]; stride[a] = t->stride[b]; stride[b] = t->stride[a];
  int64_t p[2] = {a, b};
  return record_view("transpose", t, em_as_strided(t, t->ndim, shape, stride, t->offset), V_TRANSPOSE, 2, p);
}

em_tensor *em_permute(em_tensor *t, int ndim, const int64_t *perm) {
  if (ndim != t->ndim) {
    em_error("permute: expected %d dims in the permutation, got %d", t->ndim, ndim); return NULL;
  }
  int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS], p[EM_MAX_DIMS];
  int seen[EM_MAX_DIMS] = {0};
  for (int i = 0; i < ndim; i++) {
    int d;
    if (em_wrap_dim("permute", perm[i], ndim, &d)) return NULL;
    if (seen[d]++) { em_error("permute: dim %d repeats in the permutation", d); return NULL; }
    p[i] = d; shape[i] = t->shape[d]; stride[i] = t->stride[d];
  }
  return record_view("permute", t, em_as_strided(t, ndim, shape, stride, t->offset), V_PERMUTE, ndim, p);
}

em_tensor *em_narrow(em_tensor *t, int64_t dim, int64_t start, int64_t len) {
  int d;
  if (t->ndim == 0) { em_error("narrow: cannot narrow a 0-dim tensor"); return NULL; }
  if (em_wrap_dim("narrow", dim, t->ndim, &d)) return NULL;
  if (start < 0) start += t->shape[d];
  if (start < 0 || len < 0 || start > t->shape[d] || len > t->shape[d] - start) {   /* no start + len overflow */
    em_error("narrow: start %lld + length %lld is out of range for dim %d of size %lld",
             (long long)start, (long long)len, d, (long long)t->shape[d]);
    return NULL;
  }
  int64_t shape[EM_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  shape[d] = len;
  int64_t p[3] = {d, start, len};
  return record_view("narrow", t, em_as_strided(t, t->ndim, shape, t->stride, t->offset + start * t->stride[d]),
                     V_NARROW, 3, p);
}

em_tensor *em_select(em_tensor *t, int64_t dim, int64_t index) {
  int d;
  if (t->ndim == 0) { em_error("select: cannot select from a 0-dim tensor"); return NULL; }
  if (em_wrap_dim("select", dim, t->ndim, &d)) return NULL;
  int64_t i = index < 0 ? index + t->shape[d] : index;
  if (i < 0 || i >= t->shape[d]) {
    em_error("select: index %lld is out of range for dim %d of size %lld", (long long)index, d,
             (long long)t->shape[d]);
    return NULL;
  }
  int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS]; int n = 0;
  for (int k = 0; k < t->ndim; k++) if (k != d) { shape[n] = t->shape[k]; stride[n++] = t->stride[k]; }
  int64_t p[2] = {d, i};
  return record_view("select", t, em_as_strided(t, n, shape, stride, t->offset + i * t->stride[d]), V_SELECT, 2, p);
}

em_tensor *em_squeeze(em_tensor *t, int64_t dim) {
  int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS]; int n = 0, d = -1;
  if (dim != EM_ALL_DIMS && em_wrap_dim("squeeze", dim, t->ndim, &d)) return NULL;  /* 0-d: dim -1 or 0 */
  for (int k = 0; k < t->ndim; k++) {
    bool drop = t->shape[k] == 1 && (dim == EM_ALL_DIMS || k == d);
    if (!drop) { shape[n] = t->shape[k]; stride[n++] = t->stride[k]; }
  }
  return record_view("squeeze", t, em_as_strided(t, n, shape, stride, t->offset), V_RESHAPE, 0, NULL);
}

em_tensor *em_unsqueeze(em_tensor *t, int64_t dim) {
  int d;
  if (t->ndim >= EM_MAX_DIMS) { em_error("unsqueeze: tensor already has %d dims (the maximum)", EM_MAX_DIMS); return NULL; }
  if (em_wrap_dim("unsqueeze", dim, t->ndim + 1, &d)) return NULL;
  int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS]; int n = 0;
  for (int k = 0; k <= t->ndim; k++) {
    if (k == d) {
      shape[n] = 1;
      stride[n++] = k < t->ndim ? t->stride[k] * t->shape[k] : 1;
    }
    if (k < t->ndim) { shape[n] = t->shape[k]; stride[n++] = t->stride[k]; }
  }
  return record_view("unsqueeze", t, em_as_strided(t, n, shape, stride, t->offset), V_RESHAPE, 0, NULL);
}

em_tensor *em_expand(em_tensor *t, int ndim, const int64_t *want) {
  if (ndim < t->ndim || ndim > EM_MAX_DIMS) {
    char a[160];
    em_error("expand: cannot expand shape %s to %d dims", em_shape_str(t->ndim, t->shape, a, 160), ndim);
    return NULL;
  }
  int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS];
  int lead = ndim - t->ndim;
  for (int i = 0; i < ndim; i++) {
    int64_t have = i < lead ? 1 : t->shape[i - lead];
    int64_t s = i < lead ? 0 : t->stride[i - lead];
    int64_t w = want[i];
    if (w == -1) {
      if (i < lead) { em_error("expand: -1 is not allowed for a new leading dim %d", i); return NULL; }
      w = have;
    } else if (w < 0) {
      em_error("expand: invalid size %lld for dim %d (sizes must be non-negative, or -1 to keep one)",
               (long long)w, i);
      return NULL;
    }
    if (have != w) {
      if (have != 1) {
        char a[160], b[160];
        em_error("expand: the size %lld of dim %d cannot be expanded to %lld (shape %s to %s)",
                 (long long)have, i, (long long)w, em_shape_str(t->ndim, t->shape, a, 160),
                 em_shape_str(ndim, want, b, 160));
        return NULL;
      }
      s = 0;
    }
    shape[i] = w; stride[i] = s;
  }
  return record_view("expand", t, em_as_strided(t, ndim, shape, stride, t->offset), V_EXPAND, 0, NULL);
}

/* ---------------- copies ---------------- */

/* Copy between CPU tensors of any strides/dtypes; src broadcast to dst.
 * The walk is coalesced (a contiguous copy is one row) and cut into tasks of
 * up to COPY_SEG elements of a row, spread over the threads. */
#define COPY_SEG 16384

/* n elements from src (offset so, stride ss) to dst (do, sd), any dtypes;
 * a contiguous run with streaming stores when `stream` (engine/stream.h). */
static void copy_row(void *dp, em_dtype dt, int64_t doff, int64_t sd, const void *sp, em_dtype st, int64_t soff,
                     int64_t ss, int64_t n, bool stream) {
  size_t des = em_dtype_size(dt), ses = em_dtype_size(st);
  if (sd == 1 && ss == 1) {            /* same dtype: memcpy; else a conversion loop the compiler vectorises */
    (stream ? em_convert_stream : em_convert)((char *)dp + doff * (int64_t)des, dt,
                                              (const char *)sp + soff * (int64_t)ses, st, n);
    return;
  }
  if (dt == st) {
#define STRIDED(T) { T *d = (T *)dp + doff; const T *s = (const T *)sp + soff; \
                     for (int64_t i = 0; i < n; i++) { d[i * sd] = s[i * ss]; } } break;
    switch (des) {
      case 1: STRIDED(uint8_t)
      case 2: STRIDED(uint16_t)
      case 4: STRIDED(uint32_t)
      default: STRIDED(uint64_t)
    }
#undef STRIDED
    return;
  }
  if (!em_dtype_is_float(dt) && !em_dtype_is_float(st)) {
    for (int64_t i = 0; i < n; i++) em_store_i64(dp, dt, doff + i * sd, em_load_i64(sp, st, soff + i * ss));
  } else {
    for (int64_t i = 0; i < n; i++) em_store_f64(dp, dt, doff + i * sd, em_load_f64(sp, st, soff + i * ss));
  }
}

typedef struct { em_iter it; em_tensor *dst; const em_tensor *src; int64_t segs; bool stream; } copy_job;

static void copy_tasks(void *ctx, int64_t t0, int64_t t1) {
  const copy_job *j = ctx;
  em_iter it = j->it;
  int last = it.ndim - 1;
  int64_t len = it.shape[last], sd = it.stride[0][last], ss = it.stride[1][last];
  int64_t s = (t0 % j->segs) * COPY_SEG;
  em_iter_seek(&it, t0 / j->segs * len);
  for (int64_t t = t0; t < t1; t++) {
    int64_t n = EM_MIN(COPY_SEG, len - s);
    copy_row(j->dst->storage->data, j->dst->dtype, it.off[0] + s * sd, sd, j->src->storage->data, j->src->dtype,
             it.off[1] + s * ss, ss, n, j->stream);
    s += COPY_SEG;
    if (s >= len) { s = 0; em_iter_next_row(&it); }
  }
}

/* A transpose (dst walks its last dim contiguously, src its second-to-last):
 * TILE x TILE tiles read as contiguous runs of src into a buffer and written
 * as contiguous runs of dst, so neither side walks a column (with power-of-
 * two strides those lines all fall in one cache set). Tasks are (outer
 * position, band of TILE rows); same dtype only. */
#define TILE 32
typedef struct { em_iter it; char *d; const char *s; size_t es; int64_t rows, cols, bands; } tile_job;

static void tile_tasks(void *ctx, int64_t t0, int64_t t1) {
  const tile_job *j = ctx;
  em_iter it = j->it;
  int nd = it.ndim;
  int64_t dr = it.stride[0][nd - 2], sc = it.stride[1][nd - 1];   /* dst row stride, src column stride */
  uint64_t buf[TILE * TILE];
  for (int64_t t = t0; t < t1; t++) {
    int64_t o = t / j->bands, r0 = t % j->bands * TILE, r1 = EM_MIN(r0 + TILE, j->rows);
    em_iter_seek(&it, o * j->rows * j->cols + r0 * j->cols);
    int64_t doff = it.off[0], soff = it.off[1];                    /* element (r0, 0) */
    for (int64_t c0 = 0; c0 < j->cols; c0 += TILE) {
      int64_t c1 = EM_MIN(c0 + TILE, j->cols);
#define TILE_COPY(T) { T *d = (T *)j->d + doff, *b = (T *)buf; const T *s = (const T *)j->s + soff; \
      for (int64_t c = c0; c < c1; c++) for (int64_t r = 0; r < r1 - r0; r++) { b[(c - c0) * TILE + r] = s[r + c * sc]; } \
      for (int64_t r = 0; r < r1 - r0; r++) for (int64_t c = c0; c < c1; c++) { d[r * dr + c] = b[(c - c0) * TILE + r]; } } break;
      switch (j->es) {
        case 1: TILE_COPY(uint8_t)
        case 2: TILE_COPY(uint16_t)
        case 4: TILE_COPY(uint32_t)
        default: TILE_COPY(uint64_t)
      }
#undef TILE_COPY
    }
  }
}

/* True (and the job set up) when the coalesced walk is a transpose of its last two dims. */
static bool tile_copy(em_tensor *dst, const em_tensor *src, const em_iter *it) {
  int nd = it->ndim;
  if (nd < 2 || dst->dtype != src->dtype || dst->storage == src->storage) return false;
  if (it->stride[0][nd - 1] != 1 || it->stride[1][nd - 2] != 1 || it->shape[nd - 1] < TILE || it->shape[nd - 2] < TILE)
    return false;
  tile_job j = {*it, dst->storage->data, src->storage->data, em_dtype_size(dst->dtype), it->shape[nd - 2],
                it->shape[nd - 1], 0};
  j.bands = (j.rows + TILE - 1) / TILE;
  int64_t outer = em_numel(dst) / (j.rows * j.cols);
  em_parallel_for(outer * j.bands, em_grain(TILE * j.cols), tile_tasks, &j);
  return true;
}

static void cpu_copy(em_tensor *dst, const em_tensor *src) {
  int64_t n = em_numel(dst);
  if (n == 0) return;
  if (dst->storage == src->storage && dst->dtype == src->dtype && em_is_contiguous(dst) && em_is_contiguous(src) &&
      em_same_shape(dst, src)) {
    /* memmove: dst and src may be overlapping views of one storage */
    memmove(em_data_ptr(dst), em_data_ptr(src), (size_t)n * em_dtype_size(dst->dtype));
    return;
  }
  copy_job j = {.dst = dst, .src = src};
  em_iter_init(&j.it, dst->ndim, dst->shape, 2, (const em_tensor *[]){dst, src});
  em_iter_coalesce(&j.it);
  if (tile_copy(dst, src, &j.it)) return;
  int64_t len = j.it.shape[j.it.ndim - 1];
  j.stream = dst->storage != src->storage && em_stream_wanted(n * (int64_t)em_dtype_size(dst->dtype));
  j.segs = (len + COPY_SEG - 1) / COPY_SEG;
  int64_t tasks = n / len * j.segs;
  if (dst->storage == src->storage) copy_tasks(&j, 0, tasks);   /* overlapping views: one thread, in order */
  else em_parallel_for(tasks, em_grain(EM_MIN(len, COPY_SEG)), copy_tasks, &j);
}

/* Copies involving a CUDA tensor (any strides, dtypes, devices) are
 * kernels/copy.cu's: em_copy_cuda / em_fill_cuda (backend/no_cuda.c without CUDA). */

int em_copy_(em_tensor *dst, em_tensor *src) {
  EM_OP_SCOPE("copy_");
  if (em_check_inplace("copy_", dst)) return -1;
  if (em_grad_enabled() && src->requires_grad)
    return em_error("copy_: the source requires grad; copying it in place is not recorded by "
                    "autograd (use detach(), clone() or ember.no_grad)");
  int nd; int64_t shape[EM_MAX_DIMS];
  if (em_broadcast_shape("copy_", dst->ndim, dst->shape, src->ndim, src->shape, &nd, shape)) return -1;
  if (nd != dst->ndim || memcmp(shape, dst->shape, sizeof(int64_t) * (size_t)nd) != 0) {
    char a[160], b[160];
    return em_error("copy_: source of shape %s cannot be broadcast to destination shape %s",
                    em_shape_str(src->ndim, src->shape, a, 160), em_shape_str(dst->ndim, dst->shape, b, 160));
  }
  em_bump_version(dst);
  /* src read once, dst written once; a copy between host and device moves the same bytes over the link,
   * not memory: left without a cost (its time shows as uncovered) */
  if (dst->device.type == src->device.type)
    EM_OP_COST(em_cost_nbytes(src) + em_cost_nbytes(dst), 0, EM_FLOPS_F32);
  if (dst->device.type == EM_CPU && src->device.type == EM_CPU) { cpu_copy(dst, src); return 0; }
  return em_copy_cuda(dst, src);
}

typedef struct { em_iter it; char *p; uint64_t bits; size_t es; int64_t segs; } fill_job;

/* n elements of es bytes from element o of p, stride st, all set to the bit
 * pattern. (Streaming stores from a pattern piece were tried for large
 * outputs: 5.2 ms against 3.0 for 64 MiB on the 2-core VM's EPYC, so not.) */
static void fill_run(const fill_job *j, int64_t o, int64_t st, int64_t n) {
#define FILL(T) { T v; memcpy(&v, &j->bits, sizeof v); T *d = (T *)j->p + o; \
                  for (int64_t i = 0; i < n; i++) { d[i * st] = v; } } break;
  switch (j->es) {
    case 1: FILL(uint8_t)
    case 2: FILL(uint16_t)
    case 4: FILL(uint32_t)
    default: FILL(uint64_t)
  }
#undef FILL
}

/* Each task: up to COPY_SEG elements of one row of the coalesced walk (a
 * contiguous tensor is one row: its segments spread over the threads). */
static void fill_tasks(void *ctx, int64_t t0, int64_t t1) {
  const fill_job *j = ctx;
  em_iter it = j->it;
  int last = it.ndim - 1;
  int64_t len = it.shape[last], st = it.stride[0][last], s = (t0 % j->segs) * COPY_SEG;
  em_iter_seek(&it, t0 / j->segs * len);
  for (int64_t t = t0; t < t1; t++) {
    fill_run(j, it.off[0] + s * st, st, EM_MIN(COPY_SEG, len - s));
    s += COPY_SEG;
    if (s >= len) { s = 0; em_iter_next_row(&it); }
  }
}

int em_fill_(em_tensor *t, double v) {
  EM_OP_SCOPE("fill_");
  if (em_check_inplace("fill_", t)) return -1;
  em_bump_version(t);
  EM_OP_COST(em_cost_nbytes(t), 0, EM_FLOPS_F32);
  if (t->device.type != EM_CPU) return em_fill_cuda(t, v);
  if (em_numel(t) == 0) return 0;
  fill_job j = {.p = t->storage->data, .es = em_dtype_size(t->dtype)};
  em_store_f64(&j.bits, t->dtype, 0, v);          /* convert once, then store the bit pattern */
  em_iter_init(&j.it, t->ndim, t->shape, 1, (const em_tensor *[]){t});
  em_iter_coalesce(&j.it);
  int64_t len = j.it.shape[j.it.ndim - 1];
  j.segs = (len + COPY_SEG - 1) / COPY_SEG;
  em_parallel_for(em_numel(t) / len * j.segs, em_grain(EM_MIN(len, COPY_SEG)), fill_tasks, &j);
  return 0;
}

static int identity_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  EM_UNUSED(n);
  gin[0] = em_tensor_retain(gout[0]);   /* the engine casts dtype/device to the input's */
  return 0;
}

static em_tensor *copy_as(const char *op, em_tensor *t, em_dtype dt, em_device dev) {
  em_tensor *out = em_empty(t->ndim, t->shape, dt, dev);
  if (!out) return NULL;
  bool g = em_set_grad_enabled(false);
  int rc = em_copy_(out, t);
  em_set_grad_enabled(g);
  if (rc) { em_tensor_release(out); return NULL; }
  if (em_grad_needed(1, &t)) {
    em_node *n = em_node_new(op, identity_backward, 1, 1);
    em_node_set_input(n, 0, t);
    em_node_finish(n, out);
  }
  return out;
}

em_tensor *em_contiguous(em_tensor *t) {
  if (em_is_contiguous(t)) return em_tensor_retain(t);
  return copy_as("contiguous", t, t->dtype, t->device);
}

em_tensor *em_clone(em_tensor *t) { return copy_as("clone", t, t->dtype, t->device); }

em_tensor *em_to(em_tensor *t, em_dtype dt, em_device dev) {
  if (t->dtype == dt && em_device_eq(t->device, dev)) return em_tensor_retain(t);
  if (dev.type == EM_CUDA && !em_cuda_available()) {
    em_error(em_cuda_compiled() ? "to: no CUDA device is available" :
             "to: this build of Ember has no CUDA backend (rebuild with -DEMBER_CUDA=ON)");
    return NULL;
  }
  return copy_as("to", t, dt, dev);
}

em_tensor *em_contiguous_as(em_tensor *t, em_dtype dt) {
  if (t->dtype == dt && em_is_contiguous(t)) return em_tensor_retain(t);
  bool g = em_set_grad_enabled(false);
  em_tensor *out = copy_as("contiguous", t, dt, t->device);
  em_set_grad_enabled(g);
  return out;
}

/* Rebind a leaf to src's storage, geometry, dtype and device (PyTorch's
 * `p.data = q`): optimizers and hooks holding t keep working. A .grad that no
 * longer matches is dropped. */
int em_set_(em_tensor *t, em_tensor *src) {
  if (t->grad_fn) return em_error("set_: only leaf tensors can be rebound");
  if (t->requires_grad && !em_dtype_is_float(src->dtype))
    return em_error("set_: a tensor that requires grad cannot take dtype %s", em_dtype_name(src->dtype));
  em_storage_retain(src->storage);
  em_storage_release(t->storage);
  t->storage = src->storage;
  t->offset = src->offset; t->ndim = src->ndim;
  memcpy(t->shape, src->shape, sizeof t->shape);
  memcpy(t->stride, src->stride, sizeof t->stride);
  t->dtype = src->dtype; t->device = src->device;
  if (t->grad && (t->grad->dtype != t->dtype || !em_device_eq(t->grad->device, t->device) || !em_same_shape(t->grad, t))) {
    em_tensor_release(t->grad);
    t->grad = NULL;
  }
  /* no version bump: the version lives on the storage, which is src's now and
   * unchanged; graphs that saved t's old storage still hold that storage.
   * The shadow weight belonged to the old storage: dropped. */
  em_tensor_release(t->shadow);
  t->shadow = NULL;
  t->shadow_storage = NULL;
  return 0;
}

/* ---------------- scalars ---------------- */

int em_get_f64(const em_tensor *t, const int64_t *idx, double *out) {
  int64_t off = t->offset;
  for (int i = 0; i < t->ndim; i++) {
    if (idx[i] < 0 || idx[i] >= t->shape[i])
      return em_error("get_f64: index %lld is out of range for dim %d of size %lld", (long long)idx[i], i,
                      (long long)t->shape[i]);
    off += idx[i] * t->stride[i];
  }
  if (t->device.type == EM_CPU) { *out = em_load_f64(t->storage->data, t->dtype, off); return 0; }
  if (em_cuda_check_not_capturing("get_f64")) return -1;   /* a device->host read waits for the device */
  uint64_t bits = 0;
  size_t es = em_dtype_size(t->dtype);
  if (em_cuda->memcpy_d2h(&bits, (char *)t->storage->data + off * (int64_t)es, es, t->device.index)) return -1;
  *out = em_load_f64(&bits, t->dtype, 0);
  return 0;
}

int em_item(const em_tensor *t, double *out) {
  if (em_numel(t) != 1) {
    char a[160];
    return em_error("item: expected a tensor with one element, got shape %s (%lld elements)",
                    em_shape_str(t->ndim, t->shape, a, 160), (long long)em_numel(t));
  }
  if (t->device.type != EM_CPU && em_cuda_check_not_capturing("item")) return -1;
  int64_t idx[EM_MAX_DIMS] = {0};
  return em_get_f64(t, idx, out);
}
