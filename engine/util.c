/* Shared checks, broadcasting and the N-d iterator (see internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

int em_env_digit(const char *name, int maxv, int dflt) {
  const char *e = getenv(name);
  if (!e || !*e) return dflt;
  if (e[0] >= '0' && e[0] <= '0' + maxv && !e[1]) return e[0] - '0';
  fprintf(stderr, "ember: %s must be ", name);
  for (int i = 0; i < maxv; i++) fprintf(stderr, i + 1 < maxv ? "%d, " : "%d", i);
  fprintf(stderr, " or %d, got '%s'; using %d\n", maxv, e, dflt);
  return dflt;
}

int em_env_pick(const char *name, const char *const *choices, int n) {
  const char *e = getenv(name);
  if (!e || !*e) return 0;
  for (int i = 0; i < n; i++)
    if (strcmp(e, choices[i]) == 0) return i;
  fprintf(stderr, "ember: %s must be ", name);
  for (int i = 0; i < n; i++) fprintf(stderr, i == 0 ? "'%s'" : i + 1 < n ? ", '%s'" : " or '%s'", choices[i]);
  fprintf(stderr, ", got '%s'; using %s\n", e, choices[0]);
  return 0;
}

int64_t em_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

void em_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) { stride[i] = s; s *= shape[i] > 1 ? shape[i] : 1; }
}

const char *em_shape_str(int ndim, const int64_t *shape, char *buf, int n) {
  int k = snprintf(buf, (size_t)n, "[");
  for (int i = 0; i < ndim && k < n; i++)
    k += snprintf(buf + k, (size_t)(n - k), i ? ", %lld" : "%lld", (long long)shape[i]);
  if (k < n) snprintf(buf + k, (size_t)(n - k), "]");
  return buf;
}

int em_broadcast_shape(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb,
                       int *nout, int64_t *sout) {
  int n = EM_MAX(na, nb);
  for (int i = 0; i < n; i++) {
    int64_t a = i < n - na ? 1 : sa[i - (n - na)];
    int64_t b = i < n - nb ? 1 : sb[i - (n - nb)];
    if (a != b && a != 1 && b != 1) {
      char x[160], y[160];
      return em_error("%s: cannot broadcast shapes %s and %s", op, em_shape_str(na, sa, x, 160),
                      em_shape_str(nb, sb, y, 160));
    }
    sout[i] = a == 1 ? b : a;
  }
  *nout = n;
  return 0;
}

void em_broadcast_strides(const em_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
  int lead = ndim - t->ndim;
  for (int i = 0; i < ndim; i++) {
    if (i < lead) { strides[i] = 0; continue; }
    int j = i - lead;
    strides[i] = (t->shape[j] == 1 && shape[i] != 1) ? 0 : t->stride[j];
  }
}

void em_iter_init(em_iter *it, int ndim, const int64_t *shape, int n, const em_tensor *const *ts) {
  it->ndim = ndim; it->n = n;
  it->numel = em_shape_numel(ndim, shape);
  for (int d = 0; d < ndim; d++) { it->shape[d] = shape[d]; it->idx[d] = 0; }
  for (int k = 0; k < n; k++) {
    em_broadcast_strides(ts[k], ndim, shape, it->stride[k]);
    it->off[k] = it->base[k] = ts[k]->offset;
  }
}

void em_iter_coalesce(em_iter *it) {
  int m = 0;
  for (int d = 0; d < it->ndim; d++) {
    if (it->shape[d] == 1) continue;
    bool merge = m > 0;
    for (int k = 0; k < it->n && merge; k++) merge = it->stride[k][m - 1] == it->stride[k][d] * it->shape[d];
    if (merge) {
      it->shape[m - 1] *= it->shape[d];
      for (int k = 0; k < it->n; k++) it->stride[k][m - 1] = it->stride[k][d];
      continue;
    }
    it->shape[m] = it->shape[d];
    for (int k = 0; k < it->n; k++) it->stride[k][m] = it->stride[k][d];
    m++;
  }
  if (m == 0) {                       /* a single element */
    it->shape[0] = 1;
    for (int k = 0; k < it->n; k++) it->stride[k][0] = 0;
    m = 1;
  }
  it->ndim = m;
  em_iter_seek(it, 0);
}

void em_iter_seek(em_iter *it, int64_t i) {
  for (int k = 0; k < it->n; k++) it->off[k] = it->base[k];
  for (int d = it->ndim - 1; d >= 0; d--) {
    int64_t s = it->shape[d] > 0 ? it->shape[d] : 1;
    it->idx[d] = i % s;
    i /= s;
    for (int k = 0; k < it->n; k++) it->off[k] += it->idx[d] * it->stride[k][d];
  }
}

static const char *dev_name(em_device d, char *b) { return em_device_str(d, b, 32); }

int em_check_same_device(const char *op, const em_tensor *a, const em_tensor *b) {
  if (em_device_eq(a->device, b->device)) return 0;
  char x[32], y[32];
  return em_error("%s: expected all tensors on the same device, got %s and %s", op,
                  dev_name(a->device, x), dev_name(b->device, y));
}

int em_check_float(const char *op, const char *arg, const em_tensor *t) {
  if (em_dtype_is_float(t->dtype)) return 0;
  return em_error("%s: expected %s to be a floating-point tensor (f32, f64, bf16, f16), got %s",
                  op, arg, em_dtype_name(t->dtype));
}

int em_check_int(const char *op, const char *arg, const em_tensor *t) {
  if (em_dtype_is_int(t->dtype)) return 0;
  return em_error("%s: expected %s to be an integer tensor (i64, i32, u16, u8), got %s", op, arg,
                  em_dtype_name(t->dtype));
}

int em_check_ndim(const char *op, const char *arg, const em_tensor *t, int ndim) {
  if (t->ndim == ndim) return 0;
  char b[160];
  return em_error("%s: expected %s to have %d dims, got %d dims (shape %s)", op, arg, ndim, t->ndim,
                  em_shape_str(t->ndim, t->shape, b, 160));
}

int em_check_inplace(const char *op, const em_tensor *t) {
  if (em_grad_enabled() && t->requires_grad)
    return em_error("%s: cannot write in place into a tensor that requires grad "
                    "(use ember.no_grad, or detach() first)", op);
  if (t->storage->flags & EM_STORAGE_READONLY)
    return em_error("%s: cannot write into a read-only tensor (memory-mapped file); clone() it first", op);
  return 0;
}

int em_check_out(const char *op, const em_tensor *out, int ndim, const int64_t *shape, em_device dev) {
  char x[160], y[160], d1[32], d2[32];
  if (out->ndim != ndim || memcmp(out->shape, shape, sizeof(int64_t) * (size_t)ndim) != 0)
    return em_error("%s: out has shape %s, expected %s", op, em_shape_str(out->ndim, out->shape, x, 160),
                    em_shape_str(ndim, shape, y, 160));
  if (!em_device_eq(out->device, dev))
    return em_error("%s: out is on %s, expected %s", op, dev_name(out->device, d1), dev_name(dev, d2));
  return em_check_inplace(op, out);
}

int em_wrap_dim(const char *op, int64_t dim, int ndim, int *out) {
  int n = ndim > 0 ? ndim : 1;
  if (dim < -n || dim >= n)
    return em_error("%s: dim %lld out of range for a tensor with %d dims (expected %d..%d)", op,
                    (long long)dim, ndim, -n, n - 1);
  *out = (int)(dim < 0 ? dim + n : dim);
  return 0;
}
