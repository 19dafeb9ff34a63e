/* Scans: cumsum and cumprod along a dim — the checks, the CPU forward, the
 * backward formulas and the calls into kernels/scan.cu.
 *
 * Dtypes as PyTorch: floats keep their dtype, integers and bool give i64;
 * both are on autocast's f32 list (bf16/f16 inputs widened to f32 inside an
 * autocast region).
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
#include "parallel.h"

/* A tensor of a's shape seen as (outer, L, inner) around dim d (contiguous layout). */
static void split_dims(const em_tensor *a, int d, int64_t *outer, int64_t *L, int64_t *inner) {
  *outer = 1; *inner = 1; *L = a->ndim ? a->shape[d] : 1;
  for (int k = 0; k < a->ndim; k++) {
    if (k < d) *outer *= a->shape[k];
    if (k > d) *inner *= a->shape[k];
  }
}

/* ---------------- CPU ---------------- */

/* Element offsets of the positions of dims [lo, hi) of a, row-major (n of them). */
static void dim_offsets(const em_tensor *a, int lo, int hi, int64_t *off) {
  int64_t n = 1;
  off[0] = 0;
  for (int k = hi - 1; k >= lo; k--) {   /* innermost dim first: each dim repeats the block so far */
    int64_t size = a->shape[k], st = a->stride[k];
    for (int64_t i = size - 1; i >= 0; i--)
      for (int64_t b = 0; b < n; b++) off[i * n + b] = off[b] + i * st;
    n *= size;
  }
}

/* res (contiguous, f32/f64/bf16/f16 or i64) = the scan of a (any strides, any
 * dtype) along d. Walks (outer, L, inner) with one accumulator per inner
 * column, so a scan over a leading dim streams whole rows instead of striding
 * down columns. Tasks (outer slice, band of BAND columns) go over the threads:
 * every column is still one serial scan. */
#define BAND 256

typedef struct {
  const em_tensor *a;
  em_tensor *res;
  const int64_t *ooff, *coff;
  int64_t L, inner, st, bands;
  bool prod, reverse;
} scan_job;

static void scan_tasks(void *ctx, int64_t t0, int64_t t1) {
  const scan_job *jb = ctx;
  const em_tensor *a = jb->a;
  double acc[BAND];
  uint64_t *iacc = (uint64_t *)acc;   /* same width: integers accumulate in wrapping u64 */
  bool ints = jb->res->dtype == EM_I64, prod = jb->prod;
  const void *src = a->storage->data;
  void *dst = em_data_ptr(jb->res);
  int64_t L = jb->L, inner = jb->inner, st = jb->st;
  for (int64_t t = t0; t < t1; t++) {
    int64_t o = t / jb->bands, c0 = (t % jb->bands) * BAND, n = EM_MIN(BAND, inner - c0);
    const int64_t *coff = jb->coff + c0;
    for (int64_t c = 0; c < n; c++) { if (ints) iacc[c] = prod ? 1 : 0; else acc[c] = prod ? 1 : 0; }
    for (int64_t jj = 0; jj < L; jj++) {
      int64_t j = jb->reverse ? L - 1 - jj : jj, base = a->offset + jb->ooff[o] + j * st, ob = (o * L + j) * inner + c0;
      if (ints) {
        for (int64_t c = 0; c < n; c++) {
          uint64_t v = (uint64_t)em_load_i64(src, a->dtype, base + coff[c]);
          iacc[c] = prod ? iacc[c] * v : iacc[c] + v;
          ((int64_t *)dst)[ob + c] = (int64_t)iacc[c];
        }
      } else if (a->dtype == EM_F32 && jb->res->dtype == EM_F32) {
        const float *x = (const float *)src + base;
        float *y = (float *)dst + ob;
        if (prod) for (int64_t c = 0; c < n; c++) { acc[c] *= x[coff[c]]; y[c] = (float)acc[c]; }
        else for (int64_t c = 0; c < n; c++) { acc[c] += x[coff[c]]; y[c] = (float)acc[c]; }
      } else if (a->dtype == EM_F64 && jb->res->dtype == EM_F64) {
        const double *x = (const double *)src + base;
        double *y = (double *)dst + ob;
        if (prod) for (int64_t c = 0; c < n; c++) { acc[c] *= x[coff[c]]; y[c] = acc[c]; }
        else for (int64_t c = 0; c < n; c++) { acc[c] += x[coff[c]]; y[c] = acc[c]; }
      } else {
        for (int64_t c = 0; c < n; c++) {
          double v = em_load_f64(src, a->dtype, base + coff[c]);
          acc[c] = prod ? acc[c] * v : acc[c] + v;
          em_store_f64(dst, jb->res->dtype, ob + c, acc[c]);
        }
      }
    }
  }
}

static int scan_cpu(const em_tensor *a, int d, bool prod, bool reverse, em_tensor *res) {
  int64_t outer, L, inner;
  split_dims(a, d, &outer, &L, &inner);
  int64_t st = a->ndim ? a->stride[d] : 0;
  int64_t *ooff = malloc(sizeof(int64_t) * (size_t)outer), *coff = malloc(sizeof(int64_t) * (size_t)inner);
  if (!ooff || !coff) {
    free(ooff); free(coff);
    return em_error_oom("out of memory: scan offsets for %lld rows", (long long)(outer + inner));
  }
  dim_offsets(a, 0, a->ndim ? d : 0, ooff);
  dim_offsets(a, a->ndim ? d + 1 : 0, a->ndim, coff);
  scan_job j = {a, res, ooff, coff, L, inner, st, (inner + BAND - 1) / BAND, prod, reverse};
  em_parallel_for(outer * j.bands, em_grain(L * EM_MIN(inner, BAND)), scan_tasks, &j);
  free(ooff); free(coff);
  return 0;
}

/* cumprod's gradient for one (L, inner) slice, every column at once (f64). */
static int cumprod_grad_slice(const double *x, const double *g, double *gx, int64_t L, int64_t inner) {
  int64_t *z = malloc(sizeof(int64_t) * (size_t)inner);
  double *p = malloc(sizeof(double) * (size_t)inner), *acc = malloc(sizeof(double) * (size_t)inner);
  if (!z || !p || !acc) { free(z); free(p); free(acc); return em_error_oom("out of memory: cumprod backward"); }
  for (int64_t c = 0; c < inner; c++) { z[c] = L; p[c] = 1; acc[c] = 0; }
  for (int64_t j = 0; j < L; j++)           /* the first zero of each column */
    for (int64_t c = 0; c < inner; c++) if (z[c] == L && x[j * inner + c] == 0) z[c] = j;
  for (int64_t j = 0; j < L; j++)           /* before it: g * y, then the reversed sum / x */
    for (int64_t c = 0; c < inner; c++) {
      int64_t o = j * inner + c;
      if (j < z[c]) { p[c] *= x[o]; gx[o] = g[o] * p[c]; } else gx[o] = 0;
    }
  for (int64_t j = L - 1; j >= 0; j--)
    for (int64_t c = 0; c < inner; c++) {
      int64_t o = j * inner + c;
      if (j < z[c]) { acc[c] += gx[o]; gx[o] = acc[c] / x[o]; }
    }
  for (int64_t c = 0; c < inner; c++) acc[c] = 0;   /* at it: sum of g[j] * prod_{k<=j, k!=z} x[k] */
  for (int64_t j = 0; j < L; j++)
    for (int64_t c = 0; c < inner; c++) {
      if (j < z[c]) continue;
      int64_t o = j * inner + c;
      if (j > z[c]) p[c] *= x[o];
      acc[c] += g[o] * p[c];
    }
  for (int64_t c = 0; c < inner; c++) if (z[c] < L) gx[z[c] * inner + c] = acc[c];
  free(z); free(p); free(acc);
  return 0;
}

/* ---------------- the device switch ---------------- */

/* A new tensor of a's shape and dtype rt (f32/f64/bf16/f16 or i64): the scan along d. */
static em_tensor *run_scan(const char *op, em_tensor *a, int d, bool prod, bool reverse, em_dtype rt) {
  em_tensor *res = em_empty(a->ndim, a->shape, rt, a->device);
  if (!res || em_numel(a) == 0) return res;
  if (a->device.type == EM_CPU) {
    if (scan_cpu(a, d, prod, reverse, res)) { em_tensor_release(res); return NULL; }
    return res;
  }
  if (a->device.type != EM_CUDA) { em_error_device(op, a); em_tensor_release(res); return NULL; }
  int64_t outer, L, inner;
  split_dims(a, d, &outer, &L, &inner);
  em_dtype acc = rt == EM_I64 ? EM_I64 : rt == EM_F64 ? EM_F64 : EM_F32;
  if ((rt == EM_BF16 || rt == EM_F16) && a->dtype == rt) acc = rt;   /* the kernels widen to f32 themselves */
  em_tensor *ac = em_contiguous_as(a, acc);
  em_tensor *tmp = ac && acc != rt ? em_empty(a->ndim, a->shape, acc, a->device) : NULL;
  em_tensor *out = acc != rt ? tmp : res;
  int rc = ac && out ? em_scan_cuda(op, ac, outer, L, inner, prod, reverse, out) : -1;
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
    rc = 0;
    for (int64_t o = 0; o < outer && !rc; o++)
      rc = cumprod_grad_slice(xv + o * L * inner, gv + o * L * inner, ov + o * L * inner, L, inner);
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

/* cumsum and cumprod are on autocast's f32 list, as in PyTorch */
em_tensor *em_cumsum(em_tensor *a, int64_t dim) {
  EM_OP_SCOPE("cumsum");
  em_op_args u;
  if (em_op_autocast(&u, EM_AUTOCAST_F32, 1, &a)) return NULL;
  em_tensor *r = scan_op("cumsum", u.t[0], dim, false);
  em_op_args_release(&u);
  return r;
}

em_tensor *em_cumprod(em_tensor *a, int64_t dim) {
  EM_OP_SCOPE("cumprod");
  em_op_args u;
  if (em_op_autocast(&u, EM_AUTOCAST_F32, 1, &a)) return NULL;
  em_tensor *r = scan_op("cumprod", u.t[0], dim, true);
  em_op_args_release(&u);
  return r;
}
