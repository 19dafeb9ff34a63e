/* Math ops a PyTorch user reaches for: prod, norm (torch.linalg.vector_norm),
 * amax/amin, lerp, addcmul/addcdiv (and their in-place forms), isnan and
 * isfinite — checks, forward through the shared machinery, backward formulas.
 *
 * Why it is shaped this way:
 *  - No new loops where one exists: the reductions run on reduce.c's walk and
 *    kernels/reduce.cu's reduction kernels (prod and the norms are more
 *    accumulators of the same plan; amax/amin are max/min without indices),
 *    and lerp/addcmul/addcdiv are a ternary kind of elementwise.c's loop and
 *    kernels/elementwise.cu's launcher (so broadcasting, strides, every
 *    dtype and the vectorised fast paths come with them). The entry points
 *    they borrow are listed in math_support.h.
 *  - Cost: reductions read the input once (1 FLOP per element, pow for a
 *    general p); lerp/addcmul/addcdiv read three operands and write one
 *    (16 B per f32 element); isnan/isfinite read 4 B and write 1 B (f32).
 *  - Backward formulas are compositions of public ops (device-agnostic).
 *    prod is exact with zeros: a slice with no zero gets g * prod / x, a
 *    slice with one zero gives that position the product of the others and
 *    the rest 0, a slice with more zeros gets 0 — the product of the nonzero
 *    elements is computed once, never divided by 0. amax/amin (and the inf
 *    norm) share the gradient evenly among the positions equal to the
 *    extreme, as PyTorch does; max/min over a dim give it to one index. */
#include "op.h"
#include "math_support.h"

/* ---------------- helpers ---------------- */

static int mask_dims(uint32_t mask, int ndim, int64_t *dims) {
  int nd = 0;
  for (int d = 0; d < ndim; d++) if (mask & (1u << d)) dims[nd++] = d;
  return nd;
}

/* The node's input shape with the reduced dims (i[0], a mask) set to 1. */
static void keep_shape_of(const em_node *n, int64_t *shape) {
  for (int d = 0; d < n->in_ndim[0]; d++) shape[d] = (n->i[0] & (1 << d)) ? 1 : n->in_shape[0][d];
}

/* t viewed with the reduced dims kept (size 1): broadcasts against the input. */
static em_tensor *kept(const em_node *n, em_tensor *t) {
  int64_t ks[EM_MAX_DIMS];
  keep_shape_of(n, ks);
  return em_reshape(t, n->in_ndim[0], ks);
}

/* sum over the node's reduced dims, keepdim. */
static em_tensor *sum_kept(const em_node *n, em_tensor *t) {
  int64_t dims[EM_MAX_DIMS];
  int nd = mask_dims((uint32_t)n->i[0], n->in_ndim[0], dims);
  if (nd == 0) return em_tensor_retain(t);
  return em_sum(t, nd, dims, true);
}

static em_tensor *zero_like_scalar(const em_tensor *t) { return em_scalar_tensor(0, t->dtype, t->device); }

/* 1 where a equals the (kept) extreme e, NaN meeting NaN; in dtype dt. */
static em_tensor *ties(em_scratch *s, em_tensor *a, em_tensor *e, em_dtype dt) {
  em_tensor *eq = EM_TMP(s, em_binary(EM_EQ, a, e, NULL));
  em_tensor *na = EM_TMP(s, em_binary(EM_NE, a, a, NULL));
  em_tensor *ne = EM_TMP(s, em_binary(EM_NE, e, e, NULL));
  em_tensor *nn = EM_TMP(s, em_binary(EM_LOGICAL_AND, na, ne, NULL));
  em_tensor *m = EM_TMP(s, em_binary(EM_LOGICAL_OR, eq, nn, NULL));
  return m ? EM_TMP(s, em_to(m, dt, m->device)) : NULL;
}

/* Node attributes of the reductions: i[0] = reduced-dims mask, f[0] = p (norm). */
static em_tensor *record_reduction(em_tensor *res, const char *name, em_backward_fn bw, em_tensor *a,
                                   uint32_t mask, double p) {
  em_node *n;
  res = em_op_record(res, &n, name, bw, 1, &a, 2, (em_tensor *[]){a, res});
  if (n) { n->i[0] = mask; n->f[0] = p; }
  return res;
}

/* ---------------- prod ---------------- */

/* The product over the node's dims of a, kept shape, no autograd. */
static em_tensor *prod_kept(const em_node *n, em_tensor *a) {
  int64_t ks[EM_MAX_DIMS];
  keep_shape_of(n, ks);
  em_tensor *r = em_empty(n->in_ndim[0], ks, a->dtype, a->device);
  if (r && em_reduce_math("prod", EM_RED_PROD, r, a, (uint32_t)n->i[0], 0)) { em_tensor_release(r); return NULL; }
  return r;
}

static int prod_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *a = n->saved[0];
  em_scratch s = {0};
  em_tensor *gk = EM_TMP(&s, kept(n, gout[0]));
  em_tensor *z = EM_TMP(&s, em_binary_scalar(EM_EQ, a, 0, false, NULL));
  em_tensor *zf = z ? EM_TMP(&s, em_to(z, a->dtype, a->device)) : NULL;
  em_tensor *cnt = zf ? EM_TMP(&s, sum_kept(n, zf)) : NULL;
  em_tensor *a1 = EM_TMP(&s, em_masked_fill(a, z, 1, NULL));               /* zeros -> 1 */
  em_tensor *p1 = a1 ? EM_TMP(&s, prod_kept(n, a1)) : NULL;                /* product of the nonzeros */
  em_tensor *gp = EM_TMP(&s, em_binary(EM_MUL, gk, p1, NULL));
  em_tensor *none = EM_TMP(&s, em_binary(EM_DIV, gp, a1, NULL));           /* no zero: g * prod / x */
  em_tensor *c1 = EM_TMP(&s, em_binary_scalar(EM_EQ, cnt, 1, false, NULL));
  em_tensor *at = EM_TMP(&s, em_binary(EM_LOGICAL_AND, c1, z, NULL));      /* the one zero of its slice */
  em_tensor *zero = gp ? EM_TMP(&s, zero_like_scalar(gp)) : NULL;
  em_tensor *one = EM_TMP(&s, em_where(at, gp, zero));
  em_tensor *c0 = EM_TMP(&s, em_binary_scalar(EM_EQ, cnt, 0, false, NULL));
  em_tensor *r = EM_TMP(&s, em_where(c0, none, one));
  em_scratch_give(&s, n, 0, r, gin);
  return em_scratch_end(&s);
}

em_tensor *em_prod(em_tensor *a_in, int64_t dim, bool keepdim) {
  EM_OP_SCOPE("prod");
  EM_CHECK_NULL(a_in, "prod: expected a tensor, got NULL");
  em_op_args u;
  if (em_op_autocast(&u, EM_AUTOCAST_F32, 1, &a_in)) return NULL;
  em_tensor *a = u.t[0], *res = NULL;
  uint32_t mask; int ond; int64_t oshape[EM_MAX_DIMS], n_red;
  bool all = dim == EM_ALL_DIMS;
  if (em_reduce_dims("prod", a, all ? 0 : 1, &dim, keepdim, &mask, &ond, oshape, &n_red) == 0) {
    res = em_empty(ond, oshape, em_dtype_is_float(a->dtype) ? a->dtype : EM_I64, a->device);
    if (res && em_reduce_math("prod", EM_RED_PROD, res, a, mask, 0)) { em_tensor_release(res); res = NULL; }
    if (em_dtype_is_float(a->dtype)) res = record_reduction(res, "prod", prod_backward, a, mask, 0);
  }
  em_op_args_release(&u);
  return res;
}

/* ---------------- norm ---------------- */

/* f[0] = p; saved a, the norm. */
static int norm_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *a = n->saved[0];
  double p = n->f[0];
  em_scratch s = {0};
  em_tensor *gk = EM_TMP(&s, kept(n, gout[0]));
  em_tensor *nk = EM_TMP(&s, kept(n, n->saved[1]));
  em_tensor *sg = EM_TMP(&s, em_unary(EM_SIGN, a, NULL));
  em_tensor *r = NULL;
  if (p == 1) {
    r = EM_TMP(&s, em_binary(EM_MUL, sg, gk, NULL));
  } else if (isinf(p)) {   /* shared evenly among the entries of largest |x| */
    em_tensor *ab = EM_TMP(&s, em_unary(EM_ABS, a, NULL));
    em_tensor *m = ab ? ties(&s, ab, nk, gk->dtype) : NULL;
    em_tensor *cnt = m ? EM_TMP(&s, sum_kept(n, m)) : NULL;
    em_tensor *w = EM_TMP(&s, em_binary(EM_DIV, m, cnt, NULL));
    em_tensor *t = EM_TMP(&s, em_binary(EM_MUL, w, sg, NULL));
    r = EM_TMP(&s, em_binary(EM_MUL, t, gk, NULL));
  } else {   /* sign(x) |x|^(p-1) g / norm^(p-1); 0 where the norm is 0 */
    em_tensor *t;
    if (p == 2) {
      t = EM_TMP(&s, em_binary(EM_MUL, a, gk, NULL));
    } else {
      em_tensor *ab = EM_TMP(&s, em_unary(EM_ABS, a, NULL));
      em_tensor *pw = EM_TMP(&s, em_binary_scalar(EM_POW, ab, p - 1, false, NULL));
      em_tensor *sp = EM_TMP(&s, em_binary(EM_MUL, sg, pw, NULL));
      t = EM_TMP(&s, em_binary(EM_MUL, sp, gk, NULL));
    }
    em_tensor *np = p == 2 ? nk : EM_TMP(&s, em_binary_scalar(EM_POW, nk, p - 1, false, NULL));
    em_tensor *q = EM_TMP(&s, em_binary(EM_DIV, t, np, NULL));
    em_tensor *z = EM_TMP(&s, em_binary_scalar(EM_EQ, nk, 0, false, NULL));
    em_tensor *zero = q ? EM_TMP(&s, zero_like_scalar(q)) : NULL;
    r = EM_TMP(&s, em_where(z, zero, q));
  }
  em_scratch_give(&s, n, 0, r, gin);
  return em_scratch_end(&s);
}

em_tensor *em_norm(em_tensor *a_in, double p, int ndims, const int64_t *dims, bool keepdim) {
  EM_OP_SCOPE("norm");
  EM_CHECK_NULL(a_in, "norm: expected a tensor, got NULL");
  EM_CHECK_NULL(em_dtype_is_float(a_in->dtype), "norm: expected a floating-point input, got %s",
                em_dtype_name(a_in->dtype));
  EM_CHECK_NULL(p > 0 && !isnan(p), "norm: expected p = 1, 2, inf or another positive number, got %g", p);
  em_op_args u;
  if (em_op_autocast(&u, EM_AUTOCAST_F32, 1, &a_in)) return NULL;
  em_tensor *a = u.t[0], *res = NULL;
  uint32_t mask; int ond; int64_t oshape[EM_MAX_DIMS], n_red;
  if (em_reduce_dims("norm", a, ndims, dims, keepdim, &mask, &ond, oshape, &n_red) == 0) {
    int kind = p == 1 ? EM_RED_NORM1 : p == 2 ? EM_RED_NORM2 : isinf(p) ? EM_RED_NORMINF : EM_RED_NORMP;
    res = em_empty(ond, oshape, a->dtype, a->device);
    if (res && em_reduce_math("norm", kind, res, a, mask, p)) { em_tensor_release(res); res = NULL; }
    res = record_reduction(res, "norm", norm_backward, a, mask, p);
  }
  em_op_args_release(&u);
  return res;
}

/* ---------------- amax, amin ---------------- */

static int amax_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_scratch s = {0};
  em_tensor *gk = EM_TMP(&s, kept(n, gout[0]));
  em_tensor *ek = EM_TMP(&s, kept(n, n->saved[1]));
  em_tensor *m = ek ? ties(&s, n->saved[0], ek, gk->dtype) : NULL;
  em_tensor *cnt = m ? EM_TMP(&s, sum_kept(n, m)) : NULL;
  em_tensor *w = EM_TMP(&s, em_binary(EM_DIV, m, cnt, NULL));
  em_tensor *r = EM_TMP(&s, em_binary(EM_MUL, w, gk, NULL));
  em_scratch_give(&s, n, 0, r, gin);
  return em_scratch_end(&s);
}

static em_tensor *amax_like(const char *name, em_tensor *a, int ndims, const int64_t *dims, bool keepdim,
                            bool is_max) {
  EM_CHECK_NULL(a, "%s: expected a tensor, got NULL", name);
  uint32_t mask; int ond; int64_t oshape[EM_MAX_DIMS], n_red;
  if (em_reduce_dims(name, a, ndims, dims, keepdim, &mask, &ond, oshape, &n_red)) return NULL;
  if (n_red == 0) {
    for (int d = 0; d < a->ndim; d++)
      EM_CHECK_NULL(!(mask & (1u << d)) || a->shape[d] != 0, "%s: cannot reduce over dim %d of size 0", name, d);
  }
  em_tensor *res = em_empty(ond, oshape, a->dtype, a->device);
  if (res && em_numel(res) > 0 && em_reduce_extreme(name, a, mask, is_max, res)) {
    em_tensor_release(res);
    return NULL;
  }
  return record_reduction(res, name, amax_backward, a, mask, 0);
}

em_tensor *em_amax(em_tensor *a, int ndims, const int64_t *dims, bool keepdim) {
  EM_OP_SCOPE("amax");
  return amax_like("amax", a, ndims, dims, keepdim, true);
}

em_tensor *em_amin(em_tensor *a, int ndims, const int64_t *dims, bool keepdim) {
  EM_OP_SCOPE("amin");
  return amax_like("amin", a, ndims, dims, keepdim, false);
}

/* ---------------- lerp, addcmul, addcdiv ---------------- */

static int class_of(em_dtype t) { return t == EM_F64 ? EM_EW_F64 : em_dtype_is_float(t) ? EM_EW_F32 : EM_EW_I64; }

/* out = code(x, y, z or the number zc; value) over the broadcast shape, in dtype dt;
 * the node gets inputs (x, y, z), saved (x, y, z) and f[0] = value, f[1] = zc. */
static em_tensor *ternary(const char *name, int code, em_tensor *x, em_tensor *y, em_tensor *z, double zc,
                          double value, em_dtype dt, em_tensor *out, em_backward_fn bw) {
  if (em_check_same_device(name, x, y) || (z && em_check_same_device(name, x, z))) return NULL;
  int nd; int64_t shape[EM_MAX_DIMS], tmp[EM_MAX_DIMS];
  if (em_broadcast_shape(name, x->ndim, x->shape, y->ndim, y->shape, &nd, shape)) return NULL;
  if (z) {
    memcpy(tmp, shape, sizeof tmp);
    if (em_broadcast_shape(name, nd, tmp, z->ndim, z->shape, &nd, shape)) return NULL;
  }
  em_tensor *in3[3] = {x, y, z};
  bool grad = em_grad_needed(3, in3);
  em_tensor *res = em_ew_result(name, out, nd, shape, dt, x->device, grad);
  if (!res) return NULL;
  em_ew_kern k = {EM_EW_TERNARY, code, class_of(dt), value, 0};
  em_ew_operand ops[3] = {{x, 0}, {y, 0}, {z, zc}};
  if (em_ew_run(name, &k, res, 3, ops, nd, shape)) { em_tensor_release(res); return NULL; }
  em_node *n;
  res = em_op_record(res, &n, name, bw, 3, in3, 3, in3);
  if (n) { n->f[0] = value; n->f[1] = zc; }
  return res;
}

/* lerp: ga = g (1 - w), gb = g w, gw = g (b - a). */
static int lerp_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *g = gout[0], *a = n->saved[0], *b = n->saved[1], *w = n->n_saved > 2 ? n->saved[2] : NULL;
  double ws = n->f[1];
  em_scratch s = {0};
  em_tensor *ga = NULL, *gb = NULL, *gw = NULL;
  if (em_node_needs_input_grad(n, 0)) {
    em_tensor *omw = w ? EM_TMP(&s, em_binary_scalar(EM_SUB, w, 1, true, NULL)) : NULL;
    ga = w ? EM_TMP(&s, em_binary(EM_MUL, g, omw, NULL)) : EM_TMP(&s, em_binary_scalar(EM_MUL, g, 1 - ws, false, NULL));
  }
  if (em_node_needs_input_grad(n, 1))
    gb = w ? EM_TMP(&s, em_binary(EM_MUL, g, w, NULL)) : EM_TMP(&s, em_binary_scalar(EM_MUL, g, ws, false, NULL));
  if (w && em_node_needs_input_grad(n, 2)) {
    em_tensor *d = EM_TMP(&s, em_binary(EM_SUB, b, a, NULL));
    gw = EM_TMP(&s, em_binary(EM_MUL, g, d, NULL));
  }
  em_scratch_give(&s, n, 0, ga, gin);
  em_scratch_give(&s, n, 1, gb, gin);
  if (w) em_scratch_give(&s, n, 2, gw, gin);
  return em_scratch_end(&s);
}

em_tensor *em_lerp(em_tensor *a, em_tensor *b, em_tensor *w, double ws) {
  EM_OP_SCOPE("lerp");
  EM_CHECK_NULL(a && b, "lerp: expected tensors for input and end, got NULL");
  EM_CHECK_NULL(!w || em_dtype_is_float(w->dtype), "lerp: expected a floating-point weight, got %s",
                em_dtype_name(w->dtype));
  em_dtype dt = em_promote(a->dtype, b->dtype);
  EM_CHECK_NULL(em_dtype_is_float(dt), "lerp: expected floating-point tensors, got %s (input) and %s (end)",
                em_dtype_name(a->dtype), em_dtype_name(b->dtype));
  if (w) dt = em_promote(dt, w->dtype);
  return ternary("lerp", EM_EW_LERP, a, b, w, ws, 0, dt, NULL, lerp_backward);
}

/* addcmul: gx = g, gt1 = v g t2, gt2 = v g t1. addcdiv: gt1 = v g / t2, gt2 = -v g t1 / t2^2. */
static int addc_backward(em_node *n, em_tensor **gout, em_tensor **gin, bool div) {
  em_tensor *g = gout[0], *t1 = n->saved[1], *t2 = n->saved[2];
  double v = n->f[0];
  em_scratch s = {0};
  em_tensor *gv = EM_TMP(&s, em_binary_scalar(EM_MUL, g, v, false, NULL));
  em_tensor *g1 = NULL, *g2 = NULL;
  if (em_node_needs_input_grad(n, 1)) g1 = EM_TMP(&s, em_binary(div ? EM_DIV : EM_MUL, gv, t2, NULL));
  if (em_node_needs_input_grad(n, 2)) {
    if (!div) g2 = EM_TMP(&s, em_binary(EM_MUL, gv, t1, NULL));
    else {
      em_tensor *q = EM_TMP(&s, em_binary(EM_DIV, t1, t2, NULL));
      em_tensor *r = EM_TMP(&s, em_binary(EM_DIV, q, t2, NULL));
      em_tensor *m = EM_TMP(&s, em_binary(EM_MUL, gv, r, NULL));
      g2 = EM_TMP(&s, em_unary(EM_NEG, m, NULL));
    }
  }
  em_scratch_give(&s, n, 0, g, gin);
  em_scratch_give(&s, n, 1, g1, gin);
  em_scratch_give(&s, n, 2, g2, gin);
  return em_scratch_end(&s);
}
static int addcmul_backward(em_node *n, em_tensor **gout, em_tensor **gin) { return addc_backward(n, gout, gin, false); }
static int addcdiv_backward(em_node *n, em_tensor **gout, em_tensor **gin) { return addc_backward(n, gout, gin, true); }

static em_tensor *addc(const char *name, bool div, em_tensor *x, em_tensor *t1, em_tensor *t2, double value,
                       em_tensor *out) {
  EM_CHECK_NULL(x && t1 && t2, "%s: expected three tensors (input, tensor1, tensor2), got NULL", name);
  em_dtype dt = em_promote(em_promote(x->dtype, t1->dtype), t2->dtype);
  EM_CHECK_NULL(dt != EM_BOOL, "%s: bool tensors are not supported", name);
  if (div && !em_dtype_is_float(t1->dtype) && !em_dtype_is_float(t2->dtype)) {
    em_error("%s: integer division is not supported (tensor1 is %s, tensor2 is %s); use floating-point tensors",
             name, em_dtype_name(t1->dtype), em_dtype_name(t2->dtype));
    return NULL;
  }
  if (!em_dtype_is_float(dt) && floor(value) != value) {
    em_error("%s: expected an integer value for %s tensors, got %g", name, em_dtype_name(dt), value);
    return NULL;
  }
  return ternary(name, div ? EM_EW_ADDCDIV : EM_EW_ADDCMUL, x, t1, t2, 0, value, dt, out,
                 div ? addcdiv_backward : addcmul_backward);
}

em_tensor *em_addcmul(em_tensor *x, em_tensor *t1, em_tensor *t2, double value, em_tensor *out) {
  EM_OP_SCOPE("addcmul");
  return addc("addcmul", false, x, t1, t2, value, out);
}

em_tensor *em_addcdiv(em_tensor *x, em_tensor *t1, em_tensor *t2, double value, em_tensor *out) {
  EM_OP_SCOPE("addcdiv");
  return addc("addcdiv", true, x, t1, t2, value, out);
}

/* ---------------- isnan, isfinite ---------------- */

static void cpu_float_class(em_tensor *res, const em_tensor *a, bool nan) {
  uint8_t *o = em_data_ptr(res);
  int64_t n = em_numel(a);
  if (a->dtype == EM_F32 && em_is_contiguous(a)) {   /* the common case: one tight loop */
    const float *x = em_data_ptr(a);
    if (nan) for (int64_t i = 0; i < n; i++) o[i] = isnan(x[i]);
    else for (int64_t i = 0; i < n; i++) o[i] = isfinite(x[i]);
    return;
  }
  em_iter it;
  em_iter_init(&it, a->ndim, a->shape, 1, (const em_tensor *[]){a});
  const void *base = a->storage->data;
  for (int64_t i = 0; i < it.numel; i++) {
    double v = em_load_f64(base, a->dtype, it.off[0]);
    o[i] = nan ? isnan(v) : isfinite(v);
    em_iter_next(&it);
  }
}

static em_tensor *float_class(const char *name, em_tensor *a, bool nan) {
  EM_CHECK_NULL(a, "%s: expected a tensor, got NULL", name);
  if (!em_dtype_is_float(a->dtype)) return em_full(a->ndim, a->shape, nan ? 0 : 1, EM_BOOL, a->device);
  em_tensor *res = em_empty(a->ndim, a->shape, EM_BOOL, a->device);
  if (!res || em_numel(res) == 0) return res;
  int rc;
  if (a->device.type == EM_CPU) { cpu_float_class(res, a, nan); rc = 0; }
  else if (a->device.type == EM_CUDA) {
    em_tensor *c = em_contiguous_as(a, a->dtype);
    rc = c ? em_float_class_cuda(name, res, c, nan) : -1;
    em_tensor_release(c);
  } else rc = em_error_device(name, a);
  if (rc) { em_tensor_release(res); return NULL; }
  return res;
}

em_tensor *em_isnan(em_tensor *a) { EM_OP_SCOPE("isnan"); return float_class("isnan", a, true); }
em_tensor *em_isfinite(em_tensor *a) { EM_OP_SCOPE("isfinite"); return float_class("isfinite", a, false); }
