/* rmsnorm: y = x * rstd * w with rstd = 1 / sqrt(mean(x², -1) + eps).
 *
 * x (..., D) is read as N rows of D, in f32 (f64 for f64) whatever its
 * dtype, with the sum of squares accumulated in double; y comes back in x's
 * dtype. w (D) is optional and may have another float dtype (f32 master
 * weights under bf16 activations). rstd (N values) is saved, so the fused
 * backward needs one pass per row and no recomputed reduction:
 *   xhat = x * rstd, u = gy * w
 *   gx   = rstd * (u - xhat * mean(u * xhat))
 *   gw   = sum over rows of gy * xhat       (accumulated in double, row order)
 *
 * On CUDA (kernels/norm.cu) forward and backward are fused kernels, gw
 * reduced deterministically (per-block partials, then a fixed-order pass);
 * gradients come back directly in the inputs' dtypes.
 *
 * Autocast: rmsnorm is on the f32 list; under ember.autocast bf16/f16 x (and
 * w) are widened to f32 first and y comes back in f32.
 *
 * layer_norm (PyTorch's, over the last dim): y = (x - mean) * rstd * w + b
 * with rstd = 1 / sqrt(var + eps), var the biased variance of the row. The
 * same layout as rmsnorm: f32 compute (f64 for f64), sums in double on the
 * CPU, w and b optional and of any float dtype, mean and rstd (N values each)
 * saved for one-pass backward:
 *   xhat = (x - mean) * rstd, u = gy * w
 *   gx   = rstd * (u - mean(u) - xhat * mean(u * xhat))
 *   gw   = sum over rows of gy * xhat,  gb = sum over rows of gy
 * On the f32 autocast list like rmsnorm; kernels/norm.cu has its kernels.
 *
 * CPU threads: rows go in blocks of block_rows(D) (fixed by D, not by the
 * thread count); each block accumulates its own weight/bias-gradient
 * partials in double and the blocks' partials are added in block order, so
 * gradients are bit-identical at any thread count (and, with one block,
 * equal to the plain row-order sum). */
#include <stdio.h>
#include "op.h"
#include "cost.h"
#include "parallel.h"
#include "stream.h"
#include "vec_math.h"

/* Rows per block: about EM_RED_BLOCK elements. */
static int64_t block_rows(int64_t D) { return EM_MAX(1, EM_RED_BLOCK / EM_MAX(D, 1)); }

/* The forward of a block of rows [r0, r1): one function per op and dtype. */
typedef struct {
  const void *x, *w, *b;
  void *y, *mean, *rstd;
  int64_t N, D;
  double eps;
  bool f64;
  bool stream;               /* rmsnorm f32: a large y made a row at a time in a buffer, streamed out (stream.h) */
  void (*rows)(const void *job, int64_t r0, int64_t r1);
} fwd_job;

static void fwd_blocks(void *ctx, int64_t b0, int64_t b1) {
  const fwd_job *j = ctx;
  int64_t rb = block_rows(j->D);
  j->rows(j, b0 * rb, EM_MIN(b1 * rb, j->N));
}

/* Run j->rows over all N rows, blocks spread over the threads. */
static void fwd_run(fwd_job *j) {
  int64_t rb = block_rows(j->D);
  em_parallel_for((j->N + rb - 1) / rb, 1, fwd_blocks, j);
}

/* The backward of a block of rows into gx and the block's partials (gw: D
 * doubles, gb: D doubles after them; zeroed), then the partials summed in
 * block order into acc (2 * D doubles). */
typedef struct {
  const void *x, *w, *gy, *mean, *rstd;
  void *gx;
  int64_t N, D, nb;
  bool need_w, need_b, f64;
  double *parts;             /* nb x (2 * D), or acc itself when nb == 1 */
  double *acc;
  void (*rows)(const void *job, int64_t r0, int64_t r1, double *gw, double *gb);
} bwd_job;

static void bwd_blocks(void *ctx, int64_t b0, int64_t b1) {
  const bwd_job *j = ctx;
  int64_t rb = block_rows(j->D);
  for (int64_t b = b0; b < b1; b++) {
    double *part = j->parts ? j->parts + b * 2 * j->D : NULL;
    j->rows(j, b * rb, EM_MIN((b + 1) * rb, j->N), part && j->need_w ? part : NULL,
            part && j->need_b ? part + j->D : NULL);
  }
}

static void bwd_combine(void *ctx, int64_t c0, int64_t c1) {
  const bwd_job *j = ctx;
  for (int64_t c = c0; c < c1; c++) {
    double s = j->parts[c];
    for (int64_t b = 1; b < j->nb; b++) s += j->parts[b * 2 * j->D + c];
    j->acc[c] = s;
  }
}

/* Run j->rows over all N rows; acc (2 * D zeroed doubles, or NULL when no
 * weight/bias gradient is wanted) gets the column sums. 0, or -1 with the
 * error set when the partials cannot be allocated. */
static int bwd_run(bwd_job *j, const char *op) {
  int64_t rb = block_rows(j->D);
  j->nb = (j->N + rb - 1) / rb;
  if (!j->acc || j->nb <= 1) {             /* one block sums straight into acc */
    j->parts = j->acc;
    em_parallel_for(j->nb, 1, bwd_blocks, j);
    return 0;
  }
  j->parts = calloc((size_t)(j->nb * 2 * j->D), sizeof(double));
  if (!j->parts)
    return em_error_oom("out of memory: %s backward partials (%lld doubles)", op, (long long)(j->nb * 2 * j->D));
  em_parallel_for(j->nb, 1, bwd_blocks, j);
  em_parallel_for(2 * j->D, em_grain(j->nb), bwd_combine, j);
  free(j->parts);
  return 0;
}

static int rmsnorm_validate(const char *op, em_tensor *x, em_tensor *w, double eps) {
  char s1[160], s2[160];
  if (em_check_float(op, "x", x)) return -1;
  if (x->ndim < 1) return em_error("%s: expected x with at least 1 dim (..., D), got a 0-dim tensor", op);
  if (!(eps >= 0) || isinf(eps))
    return em_error("%s: expected eps to be a finite number >= 0, got %g", op, eps);
  if (!w) return 0;
  if (em_check_float(op, "weight", w)) return -1;
  if (em_check_same_device(op, x, w)) return -1;
  if (w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1])
    return em_error("%s: expected weight of shape [%lld] (x's last dim), got %s (x has shape %s)", op,
                    (long long)x->shape[x->ndim - 1], em_shape_str(w->ndim, w->shape, s1, 160),
                    em_shape_str(x->ndim, x->shape, s2, 160));
  return 0;
}

/* y and rstd for N rows; w may be NULL. The sum of squares in SIMD lanes. */
EM_SIMD_CLONES static void rms_fwd_f32(const float *x, const float *w, int64_t N, int64_t D, float eps, float *y,
                                       float *rstd) {
  for (int64_t i = 0; i < N; i++, x += D, y += D) {
    double ss = em_dot_f32(x, x, D);
    float r = 1.0f / sqrtf((float)(ss / (double)D) + eps);
    rstd[i] = r;
    if (w) for (int64_t j = 0; j < D; j++) y[j] = x[j] * r * w[j];
    else for (int64_t j = 0; j < D; j++) y[j] = x[j] * r;
  }
}

static void rms_fwd_f64(const double *x, const double *w, int64_t N, int64_t D, double eps, double *y, double *rstd) {
  for (int64_t i = 0; i < N; i++, x += D, y += D) {
    double ss = 0;
    for (int64_t j = 0; j < D; j++) ss += x[j] * x[j];
    double r = 1.0 / sqrt(ss / (double)D + eps);
    rstd[i] = r;
    if (w) for (int64_t j = 0; j < D; j++) y[j] = x[j] * r * w[j];
    else for (int64_t j = 0; j < D; j++) y[j] = x[j] * r;
  }
}

static void rms_rows(const void *job, int64_t r0, int64_t r1) {
  const fwd_job *j = job;
  int64_t D = j->D;
  if (j->f64)
    rms_fwd_f64((const double *)j->x + r0 * D, j->w, r1 - r0, D, j->eps, (double *)j->y + r0 * D,
                (double *)j->rstd + r0);
  else if (!j->stream)
    rms_fwd_f32((const float *)j->x + r0 * D, j->w, r1 - r0, D, (float)j->eps, (float *)j->y + r0 * D,
                (float *)j->rstd + r0);
  else {
    float *buf = aligned_alloc(64, (size_t)(D * 4 + 63) / 64 * 64);
    for (int64_t r = r0; r < r1; r++) {
      float *y = (float *)j->y + r * D;
      rms_fwd_f32((const float *)j->x + r * D, j->w, 1, D, (float)j->eps, buf ? buf : y, (float *)j->rstd + r);
      if (buf) em_stream_copy(y, buf, D * 4);   /* no buffer (out of memory): regular stores, same values */
    }
    free(buf);
  }
}

/* out_dtype: y written straight in bf16/f16 by the norm (one node) when x is
 * f32 and w absent or f32 (the autocast case), where an f32 y was written,
 * then read and cast by each consumer (a linear under autocast). y's
 * gradient stays f32 (em_node_set_grad_dtype): the consumers' gradients are
 * summed in f32 and reach the backward as before (the autocast linear's gemm
 * writes f32 dx straight), so a model's values and gradients are those of the
 * f32 y it replaces, bit for bit. A bf16/f16 gy (y the root of backward) is
 * read by the kernels as is. Any other out_dtype is the norm then em_to, two
 * nodes, the same values. EMBER_NORM_OUT16 (read once at load, default 1):
 * whether models ask for out_dtype (em_norm_out16, nn/transformer.lua), and
 * whether add_rmsnorm's CUDA backward writes a bf16/f16 r's gradient itself
 * (beside the f32 one, the same values as the engine's cast of it); 0: the
 * kernels of before, for an A/B. Not F.rmsnorm's out_dtype itself. */
static bool out16_direct(const em_tensor *x, const em_tensor *w, em_dtype od) {
  return x->dtype == EM_F32 && (od == EM_BF16 || od == EM_F16) && (!w || w->dtype == EM_F32);
}

static bool norm_out16 = true;
__attribute__((constructor)) static void norm_out16_init(void) { norm_out16 = em_env_digit("EMBER_NORM_OUT16", 1, 1); }
bool em_norm_out16(void) { return norm_out16; }

static int check_out_dtype(const char *op, em_dtype od) {
  if (od == EM_NDTYPES || em_dtype_is_float(od)) return 0;
  return em_error("%s: expected out_dtype to be a float dtype (f32, f64, bf16, f16), got %s", op,
                  (int)od >= 0 && od < EM_NDTYPES ? em_dtype_name(od) : "an unknown dtype");
}

/* Contiguous copies of x and w in the compute dtype ct (w may be NULL). */
static int rms_inputs(em_tensor *x, em_tensor *w, em_dtype ct, em_tensor **xc, em_tensor **wc) {
  *xc = em_contiguous_as(x, ct);
  *wc = (*xc && w) ? em_contiguous_as(w, ct) : NULL;
  return (!*xc || (w && !*wc)) ? -1 : 0;
}

static em_tensor *rmsnorm_cpu(em_tensor *x, em_tensor *w, double eps, em_dtype yd, em_tensor **rstd_out) {
  int64_t D = x->shape[x->ndim - 1], N = D ? em_numel(x) / D : em_shape_numel(x->ndim - 1, x->shape);
  em_dtype ct = x->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *xc, *wc, *y = NULL, *rstd = NULL, *out = NULL;
  if (rms_inputs(x, w, ct, &xc, &wc)) goto done;
  if (!(y = em_empty(x->ndim, x->shape, ct, x->device)) || !(rstd = em_empty(1, &N, ct, x->device))) goto done;
  fwd_job j = {em_data_ptr(xc), wc ? em_data_ptr(wc) : NULL, NULL, em_data_ptr(y), NULL, em_data_ptr(rstd),
               N, D, eps, ct == EM_F64, ct == EM_F32 && em_stream_wanted(em_numel(y) * 4), rms_rows};
  fwd_run(&j);
  out = em_contiguous_as(y, yd);           /* yd: x's dtype, or out_dtype (x f32: one rounding) */
done:
  em_tensor_release(xc); em_tensor_release(wc); em_tensor_release(y);
  if (out) *rstd_out = rstd; else em_tensor_release(rstd);
  return out;
}

/* gx (may be NULL) and gw accumulation (may be NULL) for N rows. */
static void rms_bwd_f32(const float *x, const float *w, const float *gy, const float *rstd, int64_t N, int64_t D,
                        float *gx, double *gw) {
  for (int64_t i = 0; i < N; i++, x += D, gy += D) {
    float r = rstd[i];
    double dot = 0;                       /* sum_j u_j * xhat_j */
    for (int64_t j = 0; j < D; j++) dot += (double)(gy[j] * (w ? w[j] : 1.0f)) * (x[j] * r);
    float c = (float)(dot / (double)D);
    if (gx) {
      for (int64_t j = 0; j < D; j++) gx[j] = r * (gy[j] * (w ? w[j] : 1.0f) - x[j] * r * c);
      gx += D;
    }
    if (gw) for (int64_t j = 0; j < D; j++) gw[j] += (double)gy[j] * (x[j] * r);
  }
}

static void rms_bwd_f64(const double *x, const double *w, const double *gy, const double *rstd, int64_t N,
                        int64_t D, double *gx, double *gw) {
  for (int64_t i = 0; i < N; i++, x += D, gy += D) {
    double r = rstd[i], dot = 0;
    for (int64_t j = 0; j < D; j++) dot += gy[j] * (w ? w[j] : 1.0) * (x[j] * r);
    double c = dot / (double)D;
    if (gx) {
      for (int64_t j = 0; j < D; j++) gx[j] = r * (gy[j] * (w ? w[j] : 1.0) - x[j] * r * c);
      gx += D;
    }
    if (gw) for (int64_t j = 0; j < D; j++) gw[j] += gy[j] * (x[j] * r);
  }
}

static void rms_bwd_rows(const void *job, int64_t r0, int64_t r1, double *gw, double *gb) {
  const bwd_job *j = job;
  int64_t D = j->D;
  EM_UNUSED(gb);
  if (j->f64)
    rms_bwd_f64((const double *)j->x + r0 * D, j->w, (const double *)j->gy + r0 * D, (const double *)j->rstd + r0,
                r1 - r0, D, j->gx ? (double *)j->gx + r0 * D : NULL, gw);
  else
    rms_bwd_f32((const float *)j->x + r0 * D, j->w, (const float *)j->gy + r0 * D, (const float *)j->rstd + r0,
                r1 - r0, D, j->gx ? (float *)j->gx + r0 * D : NULL, gw);
}

/* Round the double accumulator into a new (D) tensor of dtype ct. */
static em_tensor *gw_tensor(const double *acc, int64_t D, em_dtype ct, em_device dev) {
  em_tensor *t = em_empty(1, &D, ct, dev);
  if (t) em_convert(em_data_ptr(t), ct, acc, EM_F64, D);
  return t;
}

static em_tensor *rmsnorm_cuda(em_tensor *x, em_tensor *w, double eps, em_dtype yd, em_tensor **rstd_out) {
  int64_t D = x->shape[x->ndim - 1], N = D ? em_numel(x) / D : em_shape_numel(x->ndim - 1, x->shape);
  em_dtype ct = x->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *xc = em_contiguous(x), *wc = NULL, *y = NULL, *rstd = NULL;
  if (!xc || (w && !(wc = em_contiguous(w)))) goto fail;
  if (!(y = em_empty(x->ndim, x->shape, yd, x->device)) || !(rstd = em_empty(1, &N, ct, x->device))) goto fail;
  if (em_rmsnorm_fwd_cuda(xc, wc, eps, y, rstd)) goto fail;
  em_tensor_release(xc); em_tensor_release(wc);
  *rstd_out = rstd;
  return y;
fail:
  em_tensor_release(xc); em_tensor_release(wc); em_tensor_release(y); em_tensor_release(rstd);
  return NULL;
}

/* gx (when need_x: a new tensor, or sink added into and returned) and gw
 * (when need_w) of rmsnorm at x on CUDA; gr (or NULL): gx's values in gr's
 * 16-bit dtype, written by the same kernel. 0, or -1 with the error set. */
static int rms_grads_cuda(em_tensor *x, em_tensor *rstd, em_tensor *w, em_tensor *gy, bool need_x, bool need_w,
                          em_tensor *sink, em_tensor *gr, em_tensor **gx_out, em_tensor **gw_out) {
  em_tensor *xc = em_contiguous(x), *wc = NULL, *g = NULL, *gx = NULL, *gw = NULL;
  int rc = -1;
  /* a bf16/f16 gy of an out_dtype norm (f32 x and w): the kernel reads it as
   * it is, widened exactly, so no conversion pass */
  bool half_gy = out16_direct(x, w, gy->dtype);
  if (!xc || (w && !(wc = em_contiguous(w))) || !(g = half_gy ? em_contiguous(gy) : em_contiguous_as(gy, x->dtype)))
    goto done;
  if (sink) {
    gx = em_tensor_retain(sink);
    EM_OP_COST(em_cost_nbytes(x), (double)em_numel(x), em_cost_simt_class(rstd->dtype));  /* the sum so far read and added */
  }
  else if (need_x && !(gx = em_empty(x->ndim, x->shape, x->dtype, x->device))) goto done;
  if (need_w && !(gw = em_empty(1, &w->shape[0], w->dtype, w->device))) goto done;
  if (em_rmsnorm_bwd_cuda(xc, wc, rstd, g, gx, sink != NULL, gw, gr)) goto done;
  *gx_out = gx; gx = NULL;
  if (need_w) { *gw_out = gw; gw = NULL; }
  rc = 0;
done:
  em_tensor_release(xc); em_tensor_release(wc); em_tensor_release(g); em_tensor_release(gx); em_tensor_release(gw);
  return rc;
}

static int rmsnorm_backward_cuda(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *x = n->saved[0], *rstd = n->saved[1], *w = n->n_saved > 2 ? n->saved[2] : NULL;
  bool need_x = em_node_needs_input_grad(n, 0), need_w = w && em_node_needs_input_grad(n, 1);
  /* the residual stream's gradient is summed here: add into the sum so far
   * (the grad of the block's output) instead of a separate add kernel */
  em_tensor *sink = need_x && x->dtype == n->in_dtype[0] ? em_node_grad_sink(n, 0) : NULL;
  return rms_grads_cuda(x, rstd, w, gout[0], need_x, need_w, sink, NULL, &gin[0], &gin[1]);
}

/* gx (when need_x) and gw (when need_w) of rmsnorm at x on the CPU, in the
 * compute dtype (rstd's). 0, or -1 with the error set. */
static int rms_grads_cpu(em_tensor *x, em_tensor *rstd, em_tensor *w, em_tensor *gy, bool need_x, bool need_w,
                         em_tensor **gx_out, em_tensor **gw_out) {
  em_dtype ct = rstd->dtype;
  int64_t D = x->shape[x->ndim - 1], N = em_numel(rstd);
  em_tensor *xc, *wc, *g = NULL, *gx = NULL;
  double *acc = NULL;
  int rc = -1;
  if (rms_inputs(x, w, ct, &xc, &wc) || !(g = em_contiguous_as(gy, ct))) goto done;
  if (need_x && !(gx = em_empty(x->ndim, x->shape, ct, x->device))) goto done;
  if (need_w && !(acc = calloc((size_t)EM_MAX(2 * D, 1), sizeof *acc))) {
    em_error_oom("out of memory: rmsnorm backward (%lld doubles)", (long long)D);
    goto done;
  }
  bwd_job j = {em_data_ptr(xc), wc ? em_data_ptr(wc) : NULL, em_data_ptr(g), NULL, em_data_ptr(rstd),
               gx ? em_data_ptr(gx) : NULL, N, D, 0, need_w, false, ct == EM_F64, NULL, acc, rms_bwd_rows};
  if (bwd_run(&j, "rmsnorm")) goto done;
  if (need_w && !(*gw_out = gw_tensor(acc, D, ct, x->device))) goto done;
  *gx_out = gx; gx = NULL;
  rc = 0;
done:
  em_tensor_release(xc); em_tensor_release(wc); em_tensor_release(g); em_tensor_release(gx);
  free(acc);
  return rc;
}

/* saved: x, rstd, [w]; inputs: x, [w]. Gradients come out in the compute dtype. */
static int rmsnorm_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *x = n->saved[0], *rstd = n->saved[1], *w = n->n_saved > 2 ? n->saved[2] : NULL;
  /* x, gy, rstd, w read; gx written; gw: a row-sum per column (read w, write gw) */
  EM_OP_COST(2 * em_cost_nbytes(x) + em_cost_nbytes(gout[0]) + em_cost_nbytes(rstd) + 2 * em_cost_nbytes(w),
             6 * em_numel(x), em_cost_simt_class(rstd->dtype));
  if (x->device.type != EM_CPU) return rmsnorm_backward_cuda(n, gout, gin);
  bool need_x = em_node_needs_input_grad(n, 0), need_w = w && em_node_needs_input_grad(n, 1);
  return rms_grads_cpu(x, rstd, w, gout[0], need_x, need_w, &gin[0], &gin[1]);
}

static em_tensor *rmsnorm_op(em_tensor *x, em_tensor *w, double eps, em_dtype od) {
  if (rmsnorm_validate("rmsnorm", x, w, eps)) return NULL;
  if (od != EM_NDTYPES && od != x->dtype && !out16_direct(x, w, od)) {   /* the norm, then the cast */
    em_tensor *t = rmsnorm_op(x, w, eps, EM_NDTYPES), *y = t ? em_to(t, od, t->device) : NULL;
    em_tensor_release(t);
    return y;
  }
  em_dtype yd = od == EM_NDTYPES ? x->dtype : od;
  em_tensor *rstd = NULL;
  em_tensor *y = x->device.type == EM_CPU ? rmsnorm_cpu(x, w, eps, yd, &rstd) : rmsnorm_cuda(x, w, eps, yd, &rstd);
  /* x, w read; y, rstd written; x², the row sum, two scales per element */
  EM_OP_COST(em_cost_bytes(4, (em_tensor *const[]){x, w, y, rstd}), 4 * em_numel(x), em_cost_simt_class(x->dtype));
  em_node *n;
  y = em_op_record(y, &n, "rmsnorm", rmsnorm_backward, 2, (em_tensor *[]){x, w}, 3, (em_tensor *[]){x, rstd, w});
  if (n && yd != x->dtype) em_node_set_grad_dtype(n, 0, x->dtype);   /* y's gradients summed in f32 */
  em_tensor_release(rstd);
  return y;
}

em_tensor *em_rmsnorm_out(em_tensor *x, em_tensor *w, double eps, em_dtype out_dtype) {
  EM_OP_SCOPE("rmsnorm");
  if (check_out_dtype("rmsnorm", out_dtype)) return NULL;
  em_op_args a;
  if (em_op_autocast(&a, EM_AUTOCAST_F32, 2, (em_tensor *[]){x, w})) return NULL;
  em_tensor *y = rmsnorm_op(a.t[0], a.t[1], eps, out_dtype);
  em_op_args_release(&a);
  return y;
}

em_tensor *em_rmsnorm(em_tensor *x, em_tensor *w, double eps) { return em_rmsnorm_out(x, w, eps, EM_NDTYPES); }

/* ---------------- add_rmsnorm: s = x + r, y = rmsnorm(s, w) ----------------
 * The pre-norm residual add and the norm that reads it straight back, in
 * one pass: on CUDA one kernel reads x and r and writes s and y (the add
 * kernel's write and the norm's read of s are gone). Values are exactly
 * em_add then em_rmsnorm: s is the same add, y the same arithmetic on s
 * (the CPU calls those functions; kernels/norm.cu shares rmsnorm's row
 * code). The fused path takes x f32/f64 with r promoting to x's dtype, the
 * same shape, and w absent or of x's dtype (nothing for autocast to cast);
 * anything else, or EMBER_FUSE_ADD_RMSNORM=0, is em_add then em_rmsnorm
 * (two nodes, the kernels of before).
 * Backward: gs (s's own gradient, the rest of the residual stream) plus
 * rmsnorm's gx is the gradient of x and of r; on CUDA rmsnorm's backward
 * adds into gs in place (the gradient sink of the unfused pair). */

/* EMBER_FUSE_ADD_RMSNORM=0 (read once at load): the two ops, as before, for
 * an A/B on a GPU host. The same values. */
static bool fuse_add_rmsnorm = true;
__attribute__((constructor)) static void fuse_add_rmsnorm_init(void) {
  fuse_add_rmsnorm = em_env_digit("EMBER_FUSE_ADD_RMSNORM", 1, 1);
}

static bool add_rmsnorm_fusable(em_tensor *x, em_tensor *r, em_tensor *w) {
  if (!fuse_add_rmsnorm || (x->dtype != EM_F32 && x->dtype != EM_F64)) return false;
  if (em_promote(x->dtype, r->dtype) != x->dtype || (w && w->dtype != x->dtype)) return false;
  if (!em_device_eq(x->device, r->device) || (w && !em_device_eq(x->device, w->device))) return false;
  return x->ndim >= 1 && em_same_shape(x, r) && x->shape[x->ndim - 1] > 0 && em_numel(x) > 0;
}

/* saved: s, rstd, [w]; inputs: x, r, [w]; outputs: s (gout[0]), y (gout[1]). */
static int add_rmsnorm_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *s = n->saved[0], *rstd = n->saved[1], *w = n->n_saved > 2 ? n->saved[2] : NULL;
  bool need_s = em_node_needs_input_grad(n, 0) || em_node_needs_input_grad(n, 1);
  bool need_w = w && em_node_needs_input_grad(n, 2);
  /* rmsnorm's backward at s (gs read and added: rms_grads_cuda declares it, em_add on the CPU) */
  EM_OP_COST(2 * em_cost_nbytes(s) + em_cost_nbytes(gout[1]) + em_cost_nbytes(rstd) + 2 * em_cost_nbytes(w),
             6 * em_numel(s), em_cost_simt_class(rstd->dtype));
  em_tensor *gs = gout[0], *gx = NULL, *gw = NULL, *sink = NULL, *gr = NULL;
  int rc = -1;
  if (s->device.type == EM_CPU) {
    if (rms_grads_cpu(s, rstd, w, gout[1], need_s, need_w, &gx, &gw)) goto done;
    if (need_s) {                           /* the sum the engine formed for the unfused pair */
      em_tensor *t = em_add(gs, gx);
      em_tensor_release(gx);
      if (!(gx = t)) goto done;
    }
  } else {
    if (need_s) {                           /* gs is ours alone (moved out of the node): add into it */
      bool own = gs->refcount == 1 && gs->storage->refcount == 1 && em_is_contiguous(gs) && gs->dtype == s->dtype;
      sink = own ? em_tensor_retain(gs) : em_contiguous_as(gs, s->dtype);
      if (sink && sink == gs && !own) { em_tensor_release(sink); sink = em_clone(gs); }
      if (!sink) goto done;
    }
    /* a bf16/f16 r (the autocast branch): its gradient written by the kernel
     * beside gx, the values the engine's cast of gx would give, one pass fewer */
    if (norm_out16 && em_node_needs_input_grad(n, 1) && s->dtype == EM_F32 && gout[1]->dtype == EM_F32 &&
        (!w || w->dtype == EM_F32) && (n->in_dtype[1] == EM_BF16 || n->in_dtype[1] == EM_F16) &&
        em_device_eq(n->in_device[1], s->device) &&
        !(gr = em_empty(n->in_ndim[1], n->in_shape[1], n->in_dtype[1], s->device)))
      goto done;
    if (rms_grads_cuda(s, rstd, w, gout[1], need_s, need_w, sink, gr, &gx, &gw)) goto done;
    if (gr) EM_OP_COST(em_cost_nbytes(gr), 0, em_cost_simt_class(rstd->dtype));   /* r's gradient written */
  }
  if (em_node_needs_input_grad(n, 0)) gin[0] = em_tensor_retain(gx);
  if (em_node_needs_input_grad(n, 1)) gin[1] = em_tensor_retain(gr ? gr : gx);   /* else the engine casts gx */
  if (need_w) { gin[2] = gw; gw = NULL; }
  rc = 0;
done:
  em_tensor_release(sink); em_tensor_release(gx); em_tensor_release(gw); em_tensor_release(gr);
  return rc;
}

/* s and y fused (add_rmsnorm_fusable holds), with the node recorded. */
static int add_rmsnorm_fused(em_tensor *x, em_tensor *r, em_tensor *w, double eps, em_dtype yd, em_tensor **s_out,
                             em_tensor **y_out) {
  int64_t D = x->shape[x->ndim - 1], N = em_numel(x) / D;
  em_tensor *xc = NULL, *rc = NULL, *wc = NULL, *s = NULL, *y = NULL, *rstd = NULL;
  if (x->device.type == EM_CPU) {
    bool prev = em_set_grad_enabled(false);
    s = em_add(x, r);
    em_set_grad_enabled(prev);
    if (!s || !(y = rmsnorm_cpu(s, w, eps, yd, &rstd))) goto fail;
  } else {
    if (!(xc = em_contiguous(x)) || !(rc = em_contiguous(r)) || (w && !(wc = em_contiguous(w)))) goto fail;
    if (!(s = em_empty(x->ndim, x->shape, x->dtype, x->device)) ||
        !(y = em_empty(x->ndim, x->shape, yd, x->device)) || !(rstd = em_empty(1, &N, x->dtype, x->device)))
      goto fail;
    if (em_add_rmsnorm_fwd_cuda(xc, rc, wc, eps, s, y, rstd)) goto fail;
  }
  /* x, r, w read; s, y, rstd written; the add, x², the row sum, two scales per element */
  EM_OP_COST(em_cost_bytes(6, (em_tensor *const[]){x, r, w, s, y, rstd}), 5 * em_numel(x),
             em_cost_simt_class(x->dtype));
  em_tensor *in[3] = {x, r, w};
  if (em_grad_needed(3, in)) {
    em_node *n = em_node_new("add_rmsnorm", add_rmsnorm_backward, w ? 3 : 2, 2);
    if (!n) goto fail;
    for (int i = 0; i < (w ? 3 : 2); i++) em_node_set_input(n, i, in[i]);
    em_node_save(n, s); em_node_save(n, rstd);
    if (w) em_node_save(n, w);
    em_node_set_output(n, 0, s);
    em_node_set_output(n, 1, y);
    if (yd != x->dtype) em_node_set_grad_dtype(n, 1, x->dtype);   /* y's gradients summed in f32 */
    em_node_release(n);
  }
  em_tensor_release(xc); em_tensor_release(rc); em_tensor_release(wc); em_tensor_release(rstd);
  *s_out = s; *y_out = y;
  return 0;
fail:
  em_tensor_release(xc); em_tensor_release(rc); em_tensor_release(wc);
  em_tensor_release(s); em_tensor_release(y); em_tensor_release(rstd);
  return -1;
}

int em_add_rmsnorm_out(em_tensor *x, em_tensor *r, em_tensor *w, double eps, em_dtype out_dtype, em_tensor **s_out,
                       em_tensor **y_out) {
  char s1[160], s2[160];
  *s_out = *y_out = NULL;
  if (check_out_dtype("add_rmsnorm", out_dtype) || em_check_float("add_rmsnorm", "x", x) ||
      em_check_float("add_rmsnorm", "r", r) || em_check_same_device("add_rmsnorm", x, r))
    return -1;
  if (!em_same_shape(x, r))
    return em_error("add_rmsnorm: expected r of x's shape %s, got %s", em_shape_str(x->ndim, x->shape, s1, 160),
                    em_shape_str(r->ndim, r->shape, s2, 160));
  if (!add_rmsnorm_fusable(x, r, w)) {      /* the unfused pair: the same values, two nodes */
    em_tensor *s = em_add(x, r), *y = s ? em_rmsnorm_out(s, w, eps, out_dtype) : NULL;
    if (!y) { em_tensor_release(s); return -1; }
    *s_out = s; *y_out = y;
    return 0;
  }
  EM_OP_SCOPE("add_rmsnorm");
  if (rmsnorm_validate("add_rmsnorm", x, w, eps)) return -1;
  bool direct = out_dtype == EM_NDTYPES || out_dtype == x->dtype || out16_direct(x, w, out_dtype);
  if (add_rmsnorm_fused(x, r, w, eps, direct && out_dtype != EM_NDTYPES ? out_dtype : x->dtype, s_out, y_out)) return -1;
  if (!direct) {                            /* f64 x (or another out_dtype): the fused pair, then the cast */
    em_tensor *y = em_to(*y_out, out_dtype, (*y_out)->device);
    em_tensor_release(*y_out);
    *y_out = y;
    if (!y) { em_tensor_release(*s_out); *s_out = NULL; return -1; }
  }
  return 0;
}

int em_add_rmsnorm(em_tensor *x, em_tensor *r, em_tensor *w, double eps, em_tensor **s_out, em_tensor **y_out) {
  return em_add_rmsnorm_out(x, r, w, eps, EM_NDTYPES, s_out, y_out);
}

/* ---------------- layer_norm ---------------- */

static int layer_norm_validate(em_tensor *x, em_tensor *w, em_tensor *b, double eps) {
  char s1[160], s2[160];
  if (em_check_float("layer_norm", "x", x)) return -1;
  if (x->ndim < 1) return em_error("layer_norm: expected x with at least 1 dim (..., D), got a 0-dim tensor");
  if (!(eps >= 0) || isinf(eps))
    return em_error("layer_norm: expected eps to be a finite number >= 0, got %g", eps);
  em_tensor *ps[2] = {w, b};
  const char *names[2] = {"weight", "bias"};
  for (int i = 0; i < 2; i++) {
    if (!ps[i]) continue;
    if (em_check_float("layer_norm", names[i], ps[i]) || em_check_same_device("layer_norm", x, ps[i])) return -1;
    if (ps[i]->ndim != 1 || ps[i]->shape[0] != x->shape[x->ndim - 1])
      return em_error("layer_norm: expected %s of shape [%lld] (x's last dim), got %s (x has shape %s)", names[i],
                      (long long)x->shape[x->ndim - 1], em_shape_str(ps[i]->ndim, ps[i]->shape, s1, 160),
                      em_shape_str(x->ndim, x->shape, s2, 160));
  }
  return 0;
}

/* y, mean and rstd for N rows; w and b may be NULL. Sums in double. */
static void ln_fwd_f32(const float *x, const float *w, const float *b, int64_t N, int64_t D, float eps, float *y,
                       float *mean, float *rstd) {
  for (int64_t i = 0; i < N; i++, x += D, y += D) {
    double s = 0, ss = 0;
    for (int64_t j = 0; j < D; j++) s += x[j];
    double m = s / (double)D;
    for (int64_t j = 0; j < D; j++) ss += (x[j] - m) * (x[j] - m);
    float mu = (float)m, r = 1.0f / sqrtf((float)(ss / (double)D) + eps);
    mean[i] = mu; rstd[i] = r;
    for (int64_t j = 0; j < D; j++) {
      float v = (x[j] - mu) * r;
      y[j] = (w ? v * w[j] : v) + (b ? b[j] : 0.0f);
    }
  }
}

static void ln_fwd_f64(const double *x, const double *w, const double *b, int64_t N, int64_t D, double eps,
                       double *y, double *mean, double *rstd) {
  for (int64_t i = 0; i < N; i++, x += D, y += D) {
    double s = 0, ss = 0;
    for (int64_t j = 0; j < D; j++) s += x[j];
    double m = s / (double)D;
    for (int64_t j = 0; j < D; j++) ss += (x[j] - m) * (x[j] - m);
    double r = 1.0 / sqrt(ss / (double)D + eps);
    mean[i] = m; rstd[i] = r;
    for (int64_t j = 0; j < D; j++) {
      double v = (x[j] - m) * r;
      y[j] = (w ? v * w[j] : v) + (b ? b[j] : 0.0);
    }
  }
}

static void ln_rows(const void *job, int64_t r0, int64_t r1) {
  const fwd_job *j = job;
  int64_t D = j->D;
  if (j->f64)
    ln_fwd_f64((const double *)j->x + r0 * D, j->w, j->b, r1 - r0, D, j->eps, (double *)j->y + r0 * D,
               (double *)j->mean + r0, (double *)j->rstd + r0);
  else
    ln_fwd_f32((const float *)j->x + r0 * D, j->w, j->b, r1 - r0, D, (float)j->eps, (float *)j->y + r0 * D,
               (float *)j->mean + r0, (float *)j->rstd + r0);
}

static em_tensor *layer_norm_cpu(em_tensor *x, em_tensor *w, em_tensor *b, double eps, em_tensor **mean_out,
                                 em_tensor **rstd_out) {
  int64_t D = x->shape[x->ndim - 1], N = D ? em_numel(x) / D : em_shape_numel(x->ndim - 1, x->shape);
  em_dtype ct = x->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *xc, *wc, *bc = NULL, *y = NULL, *mean = NULL, *rstd = NULL, *out = NULL;
  if (rms_inputs(x, w, ct, &xc, &wc) || (b && !(bc = em_contiguous_as(b, ct)))) goto done;
  if (!(y = em_empty(x->ndim, x->shape, ct, x->device)) || !(mean = em_empty(1, &N, ct, x->device)) ||
      !(rstd = em_empty(1, &N, ct, x->device)))
    goto done;
  fwd_job j = {em_data_ptr(xc), wc ? em_data_ptr(wc) : NULL, bc ? em_data_ptr(bc) : NULL, em_data_ptr(y),
               em_data_ptr(mean), em_data_ptr(rstd), N, D, eps, ct == EM_F64, false, ln_rows};
  fwd_run(&j);
  out = em_contiguous_as(y, x->dtype);
done:
  em_tensor_release(xc); em_tensor_release(wc); em_tensor_release(bc); em_tensor_release(y);
  if (out) { *mean_out = mean; *rstd_out = rstd; }
  else { em_tensor_release(mean); em_tensor_release(rstd); }
  return out;
}

/* One row's gradients in double: gx (may be NULL), gw/gb accumulators (may be NULL). */
#define LN_BWD_ROW(T)                                                                            \
  static void ln_bwd_##T(const T *x, const T *w, const T *gy, const T *mean, const T *rstd,     \
                         int64_t N, int64_t D, T *gx, double *gw, double *gb) {                 \
    for (int64_t i = 0; i < N; i++, x += D, gy += D) {                                          \
      double m = mean[i], r = rstd[i], su = 0, sux = 0;                                         \
      for (int64_t j = 0; j < D; j++) {                                                         \
        double u = (double)gy[j] * (w ? (double)w[j] : 1.0);                                    \
        su += u;                                                                                \
        sux += u * ((x[j] - m) * r);                                                            \
      }                                                                                         \
      double cu = su / (double)D, cx = sux / (double)D;                                         \
      for (int64_t j = 0; j < D; j++) {                                                         \
        double xh = (x[j] - m) * r;                                                             \
        if (gx) gx[j] = (T)(r * ((double)gy[j] * (w ? (double)w[j] : 1.0) - cu - xh * cx));     \
        if (gw) gw[j] += (double)gy[j] * xh;                                                    \
        if (gb) gb[j] += (double)gy[j];                                                         \
      }                                                                                         \
      if (gx) gx += D;                                                                          \
    }                                                                                           \
  }
LN_BWD_ROW(float)
LN_BWD_ROW(double)

static void ln_bwd_rows(const void *job, int64_t r0, int64_t r1, double *gw, double *gb) {
  const bwd_job *j = job;
  int64_t D = j->D;
  if (j->f64)
    ln_bwd_double((const double *)j->x + r0 * D, j->w, (const double *)j->gy + r0 * D,
                  (const double *)j->mean + r0, (const double *)j->rstd + r0, r1 - r0, D,
                  j->gx ? (double *)j->gx + r0 * D : NULL, gw, gb);
  else
    ln_bwd_float((const float *)j->x + r0 * D, j->w, (const float *)j->gy + r0 * D, (const float *)j->mean + r0,
                 (const float *)j->rstd + r0, r1 - r0, D, j->gx ? (float *)j->gx + r0 * D : NULL, gw, gb);
}

static int layer_norm_backward_cuda(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *x = n->saved[0], *mean = n->saved[1], *rstd = n->saved[2];
  em_tensor *w = (int)n->i[0] >= 0 ? n->saved[n->i[0]] : NULL;
  int wi = 1, bi = w ? 2 : 1;                           /* input slots of w and b */
  bool need_x = em_node_needs_input_grad(n, 0), need_w = w && em_node_needs_input_grad(n, wi);
  bool has_b = n->i[1] != 0, need_b = has_b && em_node_needs_input_grad(n, bi);
  em_tensor *xc = em_contiguous(x), *wc = NULL, *g = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
  int rc = -1;
  if (!xc || (w && !(wc = em_contiguous(w))) || !(g = em_contiguous_as(gout[0], x->dtype))) goto done;
  if (need_x && !(gx = em_empty(x->ndim, x->shape, x->dtype, x->device))) goto done;
  if (need_w && !(gw = em_empty(1, &w->shape[0], w->dtype, w->device))) goto done;
  if (need_b && !(gb = em_empty(1, &n->in_shape[bi][0], n->in_dtype[bi], x->device))) goto done;
  if (em_layer_norm_bwd_cuda(xc, wc, mean, rstd, g, gx, gw, gb)) goto done;
  gin[0] = gx; gx = NULL;
  if (need_w) { gin[wi] = gw; gw = NULL; }
  if (need_b) { gin[bi] = gb; gb = NULL; }
  rc = 0;
done:
  em_tensor_release(xc); em_tensor_release(wc); em_tensor_release(g);
  em_tensor_release(gx); em_tensor_release(gw); em_tensor_release(gb);
  return rc;
}

/* saved: x, mean, rstd, [w]; i[0] = w's saved slot (-1 none), i[1] = has a bias.
 * inputs: x, [w], [b] (b is input 1 when there is no w). */
static int layer_norm_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *x = n->saved[0], *mean = n->saved[1], *rstd = n->saved[2];
  /* x, gy, mean, rstd, w read; gx written; gw and gb row-sums per column */
  EM_OP_COST(2 * em_cost_nbytes(x) + em_cost_nbytes(gout[0]) + em_cost_nbytes(mean) + em_cost_nbytes(rstd) +
                 3 * (double)x->shape[x->ndim - 1] * (double)em_dtype_size(x->dtype),
             8 * em_numel(x), em_cost_simt_class(rstd->dtype));
  if (x->device.type != EM_CPU) return layer_norm_backward_cuda(n, gout, gin);
  em_tensor *w = (int)n->i[0] >= 0 ? n->saved[n->i[0]] : NULL;
  int wi = 1, bi = w ? 2 : 1;
  em_dtype ct = rstd->dtype;
  int64_t D = x->shape[x->ndim - 1], N = em_numel(rstd);
  bool need_x = em_node_needs_input_grad(n, 0), need_w = w && em_node_needs_input_grad(n, wi);
  bool need_b = n->i[1] != 0 && em_node_needs_input_grad(n, bi);
  em_tensor *xc, *wc, *g = NULL, *gx = NULL;
  double *acc = NULL;
  int rc = -1;
  if (rms_inputs(x, w, ct, &xc, &wc) || !(g = em_contiguous_as(gout[0], ct))) goto done;
  if (need_x && !(gx = em_empty(x->ndim, x->shape, ct, x->device))) goto done;
  if ((need_w || need_b) && !(acc = calloc((size_t)EM_MAX(2 * D, 1), sizeof *acc))) {
    em_error_oom("out of memory: layer_norm backward (%lld doubles)", (long long)(2 * D));
    goto done;
  }
  bwd_job j = {em_data_ptr(xc), wc ? em_data_ptr(wc) : NULL, em_data_ptr(g), em_data_ptr(mean), em_data_ptr(rstd),
               gx ? em_data_ptr(gx) : NULL, N, D, 0, need_w, need_b, ct == EM_F64, NULL, acc, ln_bwd_rows};
  if (bwd_run(&j, "layer_norm")) goto done;
  if (need_w && !(gin[wi] = gw_tensor(acc, D, ct, x->device))) goto done;
  if (need_b && !(gin[bi] = gw_tensor(acc + D, D, ct, x->device))) goto done;
  gin[0] = gx; gx = NULL;
  rc = 0;
done:
  em_tensor_release(xc); em_tensor_release(wc); em_tensor_release(g); em_tensor_release(gx);
  free(acc);
  return rc;
}

static em_tensor *layer_norm_cuda(em_tensor *x, em_tensor *w, em_tensor *b, double eps, em_tensor **mean_out,
                                  em_tensor **rstd_out) {
  int64_t D = x->shape[x->ndim - 1], N = D ? em_numel(x) / D : em_shape_numel(x->ndim - 1, x->shape);
  em_dtype ct = x->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *xc = em_contiguous(x), *wc = NULL, *bc = NULL, *y = NULL, *mean = NULL, *rstd = NULL;
  if (!xc || (w && !(wc = em_contiguous(w))) || (b && !(bc = em_contiguous(b)))) goto fail;
  if (!(y = em_empty(x->ndim, x->shape, x->dtype, x->device)) || !(mean = em_empty(1, &N, ct, x->device)) ||
      !(rstd = em_empty(1, &N, ct, x->device)))
    goto fail;
  if (em_layer_norm_fwd_cuda(xc, wc, bc, eps, y, mean, rstd)) goto fail;
  em_tensor_release(xc); em_tensor_release(wc); em_tensor_release(bc);
  *mean_out = mean; *rstd_out = rstd;
  return y;
fail:
  em_tensor_release(xc); em_tensor_release(wc); em_tensor_release(bc);
  em_tensor_release(y); em_tensor_release(mean); em_tensor_release(rstd);
  return NULL;
}

static em_tensor *layer_norm_op(em_tensor *x, em_tensor *w, em_tensor *b, double eps) {
  if (layer_norm_validate(x, w, b, eps)) return NULL;
  em_tensor *mean = NULL, *rstd = NULL;
  em_tensor *y = x->device.type == EM_CPU ? layer_norm_cpu(x, w, b, eps, &mean, &rstd)
                                          : layer_norm_cuda(x, w, b, eps, &mean, &rstd);
  EM_OP_COST(em_cost_bytes(6, (em_tensor *const[]){x, w, b, y, mean, rstd}), 7 * em_numel(x),
             em_cost_simt_class(x->dtype));
  em_node *n;
  /* inputs packed (x, w, b without gaps) so a missing w leaves no hole */
  em_tensor *in[3] = {x, w ? w : b, w ? b : NULL};
  y = em_op_record(y, &n, "layer_norm", layer_norm_backward, 3, in, 4, (em_tensor *[]){x, mean, rstd, w});
  if (n) { n->i[0] = w ? 3 : -1; n->i[1] = b != NULL; }
  em_tensor_release(mean); em_tensor_release(rstd);
  return y;
}

em_tensor *em_layer_norm(em_tensor *x, em_tensor *w, em_tensor *b, double eps) {
  EM_OP_SCOPE("layer_norm");
  em_op_args a;
  if (em_op_autocast(&a, EM_AUTOCAST_F32, 3, (em_tensor *[]){x, w, b})) return NULL;
  em_tensor *y = layer_norm_op(a.t[0], a.t[1], a.t[2], eps);
  em_op_args_release(&a);
  return y;
}
