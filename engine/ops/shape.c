/* cat and stack.
 *
 * cat allocates the result once and copies each input into its slice with
 * em_copy_ (which handles strides, dtype conversion and devices), so it works
 * on any device that implements copy_. The result dtype promotes over all
 * inputs, as torch.cat does; 1-D empty tensors (shape [0]) are skipped in the
 * shape checks, PyTorch's legacy rule that lets `cat({empty, x})` grow a buffer.
 * Backward hands each input the narrow of the gradient at its offset.
 * An autograd node holds at most EM_NODE_MAX_IN inputs, so a cat of more
 * tensors that needs grad is built as a cat of cats (only then: one extra copy).
 * stack = unsqueeze each input + cat, recorded through those two ops. */
#include "op.h"

static bool skipped(const em_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }

/* Check shapes/devices, find the reference tensor, the dim and the result. */
static int cat_check(int n, em_tensor *const *ts, int64_t dim, int *d_out, int *ref_out,
                     int64_t *shape, em_dtype *dt) {
  if (n <= 0 || !ts) return em_error("cat: expected a non-empty list of tensors");
  int ref = -1;
  for (int i = 0; i < n; i++) {
    if (!ts[i]) return em_error("cat: tensor %d is NULL", i);
    if (ts[i]->ndim == 0)
      return em_error("cat: zero-dimensional tensor (at position %d) cannot be concatenated", i);
    if (ref < 0 && !skipped(ts[i])) ref = i;
  }
  if (ref < 0) ref = 0;
  const em_tensor *r = ts[ref];
  int d;
  if (em_wrap_dim("cat", dim, r->ndim, &d)) return -1;
  memcpy(shape, r->shape, sizeof(int64_t) * (size_t)r->ndim);
  shape[d] = 0;
  *dt = r->dtype;
  for (int i = 0; i < n; i++) {
    const em_tensor *t = ts[i];
    if (em_check_same_device("cat", r, t)) return -1;
    *dt = em_promote(*dt, t->dtype);
    if (skipped(t) && !(i == ref)) continue;
    char a[160], b[160];
    if (t->ndim != r->ndim)
      return em_error("cat: expected tensors with %d dims (like tensor %d, shape %s), got %d dims for "
                      "tensor %d (shape %s)", r->ndim, ref, em_shape_str(r->ndim, r->shape, a, 160),
                      t->ndim, i, em_shape_str(t->ndim, t->shape, b, 160));
    for (int k = 0; k < r->ndim; k++)
      if (k != d && t->shape[k] != r->shape[k])
        return em_error("cat: sizes of tensors must match except in dim %d: expected size %lld in dim %d "
                        "(tensor %d, shape %s), got %lld (tensor %d, shape %s)", d, (long long)r->shape[k],
                        k, ref, em_shape_str(r->ndim, r->shape, a, 160), (long long)t->shape[k], i,
                        em_shape_str(t->ndim, t->shape, b, 160));
    shape[d] += t->shape[d];
  }
  *d_out = d; *ref_out = ref;
  return 0;
}

/* i[0] = dim, i[1 + k] = offset of input k along dim. */
static int cat_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  int d = (int)n->i[0];
  for (int k = 0; k < n->n_in; k++) {
    if (!em_node_needs_input_grad(n, k)) continue;
    if (n->in_ndim[k] == 1 && n->in_shape[k][0] == 0 && gout[0]->ndim != 1)
      gin[k] = em_zeros(1, n->in_shape[k], gout[0]->dtype, gout[0]->device);
    else
      gin[k] = em_narrow(gout[0], d, n->i[1 + k], n->in_shape[k][d]);
    if (!gin[k]) return -1;
  }
  return 0;
}

static em_tensor *cat_impl(int n, em_tensor *const *ts, int64_t dim) {
  int d = 0, ref = 0; int64_t shape[EM_MAX_DIMS]; em_dtype dt = EM_F32;
  if (cat_check(n, ts, dim, &d, &ref, shape, &dt)) return NULL;
  bool grad = em_grad_needed(n, ts);
  if (grad && n > EM_NODE_MAX_IN) {   /* a cat of cats, EM_NODE_MAX_IN inputs per node */
    em_tensor *parts[EM_NODE_MAX_IN] = {0};
    int np = 0, per = (n + EM_NODE_MAX_IN - 1) / EM_NODE_MAX_IN;
    em_tensor *res = NULL;
    for (int i = 0; i < n; i += per) {
      parts[np] = cat_impl(EM_MIN(per, n - i), ts + i, d);
      if (!parts[np++]) goto done;
    }
    res = cat_impl(np, parts, d);
  done:
    for (int i = 0; i < np; i++) em_tensor_release(parts[i]);
    return res;
  }
  const em_tensor *r = ts[ref];
  em_tensor *res = em_empty(r->ndim, shape, dt, r->device);
  if (!res) return NULL;
  int64_t offs[EM_NODE_MAX_IN] = {0}, off = 0;
  bool g = em_set_grad_enabled(false);
  for (int i = 0; i < n; i++) {
    const em_tensor *t = ts[i];
    if (i < EM_NODE_MAX_IN) offs[i] = off;
    if (skipped(t) && r->ndim != 1) continue;
    int64_t sh[EM_MAX_DIMS];
    memcpy(sh, res->shape, sizeof sh);
    sh[d] = t->shape[d];
    em_tensor *slot = em_as_strided(res, res->ndim, sh, res->stride, res->offset + off * res->stride[d]);
    int rc = slot ? em_copy_(slot, ts[i]) : -1;
    em_tensor_release(slot);
    if (rc) { em_set_grad_enabled(g); em_tensor_release(res); return NULL; }
    off += t->shape[d];
  }
  em_set_grad_enabled(g);
  if (!grad) return res;
  em_node *node;
  res = em_op_record(res, &node, "cat", cat_backward, n, ts, 0, NULL);
  if (node) {
    node->i[0] = d;
    for (int i = 0; i < n; i++) node->i[1 + i] = offs[i];
  }
  return res;
}

em_tensor *em_cat(int n, em_tensor *const *ts, int64_t dim) {
  EM_OP_SCOPE("cat");
  return cat_impl(n, ts, dim);
}

em_tensor *em_stack(int n, em_tensor *const *ts, int64_t dim) {
  EM_OP_SCOPE("stack");
  EM_CHECK_NULL(n > 0 && ts, "stack: expected a non-empty list of tensors");
  for (int i = 0; i < n; i++) {
    EM_CHECK_NULL(ts[i], "stack: tensor %d is NULL", i);
    if (!em_same_shape(ts[i], ts[0])) {
      char a[160], b[160];
      em_error("stack: expected all tensors to have the same shape, got %s at index 0 and %s at index %d",
               em_shape_str(ts[0]->ndim, ts[0]->shape, a, 160), em_shape_str(ts[i]->ndim, ts[i]->shape, b, 160), i);
      return NULL;
    }
  }
  int d;
  if (ts[0]->ndim >= EM_MAX_DIMS) { em_error("stack: inputs already have %d dims (the maximum)", EM_MAX_DIMS); return NULL; }
  if (em_wrap_dim("stack", dim, ts[0]->ndim + 1, &d)) return NULL;
  em_tensor **us = calloc((size_t)n, sizeof *us);
  if (!us) { em_error_oom("out of memory: stack of %d tensors", n); return NULL; }
  em_tensor *res = NULL;
  int i = 0;
  for (; i < n; i++) if (!(us[i] = em_unsqueeze(ts[i], d))) break;
  if (i == n) res = cat_impl(n, us, d);
  for (int k = 0; k < i; k++) em_tensor_release(us[k]);
  free(us);
  return res;
}
