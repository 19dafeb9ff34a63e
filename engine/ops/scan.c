/* Scans: cumsum and cumprod along a dim — the checks, the CPU forward, the
 * backward formulas and the calls into kernels/scan.cu.
 *
 * Dtypes as PyTorch: floats keep their dtype, integers and bool give i64.
 * The CPU accumulates floats in double and integers in wrapping i64; CUDA
 * accumulates in f32 (f64 for f64, i64 for integers) and rounds each output
 * once.
 *
 * Backward:
 *  - cumsum: the reversed cumsum of the gradient (a scan from the end of each
 *    row: no flip, no subtraction of prefix sums).
 *  - cumprod: not the textbook reversed-cumsum(g * y) / x, which divides by
 *    zero. With z the first zero of a row (L if none):
 *      i <  z: gx[i] = sum_{j=i}^{z-1} g[j] y[j] / x[i]   (x[i] != 0 there)
 *      i == z: gx[z] = sum_{j>=z} g[j] prod_{k<=j, k!=z} x[k]
 *      i >  z: gx[i] = 0   (every product through i also holds x[z] = 0)
 *    three passes over a row, O(L), exact for any number of zeros. */
#include "op.h"

/* A tensor of a's shape seen as (outer, L, inner) around dim d (contiguous layout). */
static void split_dims(const em_tensor *a, int d, int64_t *outer, int64_t *L, int64_t *inner) {
  *outer = 1; *inner = 1; *L = a->ndim ? a->shape[d] : 1;
  for (int k = 0; k < a->ndim; k++) {
    if (k < d) *outer *= a->shape[k];
    if (k > d) *inner *= a->shape[k];
  }
}

/* ---------------- CPU ---------------- */

/* res (contiguous, f32/f64/bf16/f16 or i64) = the scan of a (any strides, any dtype) along d. */
static void scan_cpu(const em_tensor *a, int d, bool prod, bool reverse, em_tensor *res) {
  int64_t outer, L, inner;
  split_dims(a, d, &outer, &L, &inner);
  int64_t st = a->ndim ? a->stride[d] : 0;
  int no = 0;
  int64_t oshape[EM_MAX_DIMS], ostride[EM_MAX_DIMS], pos[EM_MAX_DIMS] = {0}, off = a->offset;
  for (int k = 0; k < a->ndim; k++)
    if (k != d) { oshape[no] = a->shape[k]; ostride[no++] = a->stride[k]; }
  bool ints = res->dtype == EM_I64;
  const void *src = a->storage->data;
  void *dst = em_data_ptr(res);
  for (int64_t r = 0, rows = outer * inner; r < rows; r++) {
    int64_t ob = (r / inner) * L * inner + r % inner;
    double acc = prod ? 1 : 0;
    uint64_t iacc = prod ? 1 : 0;
    for (int64_t jj = 0; jj < L; jj++) {
      int64_t j = reverse ? L - 1 - jj : jj, si = off + j * st, o = ob + j * inner;
      if (ints) {
        uint64_t v = (uint64_t)em_load_i64(src, a->dtype, si);
        iacc = prod ? iacc * v : iacc + v;
        ((int64_t *)dst)[o] = (int64_t)iacc;
        continue;
      }
      double v = a->dtype == EM_F32 ? ((const float *)src)[si]
               : a->dtype == EM_F64 ? ((const double *)src)[si] : em_load_f64(src, a->dtype, si);
      acc = prod ? acc * v : acc + v;
      if (res->dtype == EM_F32) ((float *)dst)[o] = (float)acc;
      else if (res->dtype == EM_F64) ((double *)dst)[o] = acc;
      else em_store_f64(dst, res->dtype, o, acc);
    }
    for (int k = no - 1; k >= 0; k--) {   /* next row */
      off += ostride[k];
      if (++pos[k] < oshape[k]) break;
      off -= ostride[k] * oshape[k];
      pos[k] = 0;
    }
  }
}

/* cumprod's gradient for one row (stride s), in double. */
static void cumprod_grad_row(const double *x, const double *g, double *gx, int64_t L, int64_t s) {
  int64_t z = 0;
  while (z < L && x[z * s] != 0) z++;
  double p = 1;
  for (int64_t j = 0; j < z; j++) { p *= x[j * s]; gx[j * s] = g[j * s] * p; }
  double acc = 0;
  for (int64_t j = z - 1; j >= 0; j--) { acc += gx[j * s]; gx[j * s] = acc / x[j * s]; }
  if (z == L) return;
  double q = p, sum = 0;
  for (int64_t j = z; j < L; j++) {
    if (j > z) q *= x[j * s];
    sum += g[j * s] * q;
    if (j > z) gx[j * s] = 0;
  }
  gx[z * s] = sum;
}

/* ---------------- the device switch ---------------- */

/* A new tensor of a's shape and dtype rt (f32/f64/bf16/f16 or i64): the scan along d. */
static em_tensor *run_scan(const char *op, em_tensor *a, int d, bool prod, bool reverse, em_dtype rt) {
  em_tensor *res = em_empty(a->ndim, a->shape, rt, a->device);
  if (!res || em_numel(a) == 0) return res;
  if (a->device.type == EM_CPU) { scan_cpu(a, d, prod, reverse, res); return res; }
  if (a->device.type != EM_CUDA) { em_error_device(op, a); em_tensor_release(res); return NULL; }
  int64_t outer, L, inner;
  split_dims(a, d, &outer, &L, &inner);
  em_dtype acc = rt == EM_I64 ? EM_I64 : rt == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *ac = em_contiguous_as(a, acc);
  em_tensor *tmp = ac && acc != rt ? em_empty(a->ndim, a->shape, acc, a->device) : NULL;
  em_tensor *out = acc != rt ? tmp : res;
  int rc = out ? em_scan_cuda(op, ac, outer, L, inner, prod, reverse, out) : -1;
  if (!rc && tmp) rc = em_copy_(res, tmp);   /* round once to the result dtype */
  em_tensor_release(ac);
  em_tensor_release(tmp);
  if (rc) { em_tensor_release(res); return NULL; }
  return res;
}

/* ---------------- backward ---------------- */

/* i[0] = the dim. */
static int cumsum_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *g = gout[0];
  int d = (int)n->i[0];
  gin[0] = run_scan("cumsum", g, d, false, true, em_dtype_is_float(g->dtype) ? g->dtype : EM_F32);
  return gin[0] ? 0 : -1;
}

/* i[0] = the dim; saved[0] = x. */
static int cumprod_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *x = n->saved[0], *g = gout[0];
  int d = (int)n->i[0];
  int64_t outer, L, inner;
  split_dims(x, d, &outer, &L, &inner);
  bool cpu = x->device.type == EM_CPU;
  em_dtype ct = cpu || x->dtype == EM_F64 || g->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *xc = em_contiguous_as(x, ct), *gc = xc ? em_contiguous_as(g, ct) : NULL;
  em_tensor *gx = gc ? em_empty(x->ndim, x->shape, ct, x->device) : NULL;
  int rc = -1;
  if (gx && em_numel(x) == 0) rc = 0;
  else if (gx && cpu) {
    const double *xv = em_data_ptr(xc), *gv = em_data_ptr(gc);
    double *ov = em_data_ptr(gx);
    for (int64_t o = 0; o < outer; o++)
      for (int64_t i = 0; i < inner; i++) {
        int64_t b = o * L * inner + i;
        cumprod_grad_row(xv + b, gv + b, ov + b, L, inner);
      }
    rc = 0;
  } else if (gx && x->device.type == EM_CUDA) rc = em_cumprod_backward_cuda("cumprod", xc, gc, outer, L, inner, gx);
  else if (gx) rc = em_error_device("cumprod", x);
  em_tensor_release(xc);
  em_tensor_release(gc);
  if (rc) { em_tensor_release(gx); return -1; }
  gin[0] = gx;
  return 0;
}

/* ---------------- the ops ---------------- */

static em_tensor *scan_op(const char *op, em_tensor *a, int64_t dim, bool prod) {
  EM_CHECK_NULL(a, "%s: expected a tensor, got NULL", op);
  int d;
  if (em_wrap_dim(op, dim, a->ndim, &d)) return NULL;
  em_dtype rt = em_dtype_is_float(a->dtype) ? a->dtype : EM_I64;
  em_tensor *res = run_scan(op, a, d, prod, false, rt);
  em_node *n;
  res = em_op_record(res, &n, op, prod ? cumprod_backward : cumsum_backward, 1, &a, prod ? 1 : 0, &a);
  if (n) n->i[0] = d;
  return res;
}

em_tensor *em_cumsum(em_tensor *a, int64_t dim) {
  EM_OP_SCOPE("cumsum");
  return scan_op("cumsum", a, dim, false);
}

em_tensor *em_cumprod(em_tensor *a, int64_t dim) {
  EM_OP_SCOPE("cumprod");
  return scan_op("cumprod", a, dim, true);
}
