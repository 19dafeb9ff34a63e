/* cross_entropy: logsumexp(logits_i) - logits_i[t_i] per row, reduced by
 * mean (over the rows whose target is not ignore_index), sum or none, with
 * PyTorch's label smoothing eps: row loss
 *   l_i = (1 - eps) (lse_i - x_i[t_i]) + eps (lse_i - mean_j x_ij)
 * (the cross-entropy against (1 - eps) onehot + eps / V).
 *
 * logits (..., V) of any float dtype are read as N = numel/V rows of V and
 * computed in f32 (f64 for f64) with the max subtracted before exp; the
 * per-row sums and the reduction accumulate in double. The row's log-sum-exp is
 * saved (N values, not N x V) so the fused backward is a single pass:
 *   dlogits_i = w_i (exp(logits_i - lse_i) - eps / V - (1 - eps) onehot(t_i)),
 * w_i = g / M (mean over M counted rows), g (sum) or g_i (none), 0 for an
 * ignored row -- never materialising the softmax or the one-hot. Targets are
 * checked before any work so an out-of-range id is an error naming it, not a
 * wild read. A mean over no counted rows is NaN, as in PyTorch.
 *
 * On CUDA both passes are fused kernels (kernels/softmax_xent.cu) and the
 * reduction (and the count M) is taken on the device: nothing is read back,
 * so the loss and its backward can be captured in a CUDA graph. Checking
 * targets there would need a host read; instead a target outside [0, V)
 * (other than ignore_index) makes its row, and so the loss, NaN.
 *
 * Autocast: cross-entropy is on the f32 list; under ember.autocast, bf16/f16
 * logits are widened to f32 first and the loss comes back in f32.
 *
 * CPU threads: rows are spread over the threads (a row of logits is read
 * from memory once: its max, exp-sum and target pass run while it sits in
 * cache); the reduction over rows stays one serial sum in row order. */
#include <stdio.h>
#include "op.h"
#include "cost.h"
#include "parallel.h"
#include "vec_math.h"

static int xent_validate(em_tensor *logits, em_tensor *targets) {
  char s1[160], s2[160];
  if (em_check_float("cross_entropy", "logits", logits)) return -1;
  if (em_check_int("cross_entropy", "targets", targets)) return -1;
  if (em_check_same_device("cross_entropy", logits, targets)) return -1;
  if (logits->ndim < 1)
    return em_error("cross_entropy: expected logits with at least 1 dim (..., V), got a 0-dim tensor");
  if (logits->shape[logits->ndim - 1] == 0)
    return em_error("cross_entropy: expected at least one class, got logits of shape %s",
                    em_shape_str(logits->ndim, logits->shape, s1, 160));
  if (targets->ndim != logits->ndim - 1 ||
      memcmp(targets->shape, logits->shape, sizeof(int64_t) * (size_t)targets->ndim) != 0)
    return em_error("cross_entropy: expected targets of shape %s (logits' shape without the class dim), got %s",
                    em_shape_str(logits->ndim - 1, logits->shape, s1, 160),
                    em_shape_str(targets->ndim, targets->shape, s2, 160));
  return 0;
}

static int check_targets(const int64_t *t, int64_t n, int64_t V, int64_t ignore) {
  for (int64_t i = 0; i < n; i++)
    if ((t[i] < 0 || t[i] >= V) && t[i] != ignore)
      return em_error("cross_entropy: target %lld (at flat index %lld) is out of range for %lld classes "
                      "(expected 0..%lld, or ignore_index %lld)", (long long)t[i], (long long)i, (long long)V,
                      (long long)(V - 1), (long long)ignore);
  return 0;
}

/* The options, as the node keeps them. */
typedef struct { int64_t ignore; double eps; int reduction; } xent_opts;

/* Row kernels, one per compute type (no per-element dtype switch): lse[i]
 * and the row losses l[i] (0 for an ignored row) in double. */
#define XENT_ROWS(NAME, T, EXP)                                                                   \
  static void NAME(const T *x, const int64_t *t, int64_t N, int64_t V, const xent_opts *o, T *lse,  \
                   double *l) {                                                                   \
    for (int64_t i = 0; i < N; i++, x += V) {                                                     \
      T mx = x[0];                                                                                \
      for (int64_t j = 1; j < V; j++) mx = x[j] > mx ? x[j] : mx;                                 \
      double s = 0, sx = 0;                                                                       \
      for (int64_t j = 0; j < V; j++) s += EXP(x[j] - mx);                                        \
      lse[i] = mx + (T)log(s);                                                                    \
      if (t[i] == o->ignore) { l[i] = 0; continue; }                                              \
      l[i] = ((double)mx - (double)x[t[i]]) + log(s);   /* not lse - x: lse is rounded to T */    \
      if (o->eps > 0) {                                                                           \
        for (int64_t j = 0; j < V; j++) sx += (double)x[j];                                       \
        l[i] = (1 - o->eps) * l[i] + o->eps * (((double)mx + log(s)) - sx / (double)V);           \
      }                                                                                           \
    }                                                                                             \
  }
XENT_ROWS(xent_rows_f64, double, exp)

/* f32 rows: the max, the exp-sum and the row's sum in SIMD lanes (vec_math.h). */
EM_SIMD_CLONES static void xent_rows_f32(const float *x, const int64_t *t, int64_t N, int64_t V, const xent_opts *o, float *lse,
                          double *l) {
  for (int64_t i = 0; i < N; i++, x += V) {
    float mx = em_max_f32(x, V);
    double s = em_sum_exp_f32(x, mx, V);
    lse[i] = mx + (float)log(s);
    if (t[i] == o->ignore) { l[i] = 0; continue; }
    l[i] = ((double)mx - (double)x[t[i]]) + log(s);   /* not lse - x: lse is rounded to f32 */
    if (o->eps > 0)
      l[i] = (1 - o->eps) * l[i] + o->eps * (((double)mx + log(s)) - em_sum_f32(x, V) / (double)V);
  }
}

/* Rows [r0, r1) of the forward or the gradient, over the threads. */
typedef struct {
  const void *x, *lse_in;
  const int64_t *t;
  const xent_opts *o;
  int64_t V;
  bool f64;
  void *lse;                 /* forward: lse out */
  double *l;                 /* forward: row losses */
  const double *w;           /* backward: the output gradient */
  int64_t wstride;
  double wdiv;
  void *gx;
} xent_job;

static void xent_fwd_rows(void *ctx, int64_t r0, int64_t r1) {
  const xent_job *j = ctx;
  if (j->f64)
    xent_rows_f64((const double *)j->x + r0 * j->V, j->t + r0, r1 - r0, j->V, j->o, (double *)j->lse + r0, j->l + r0);
  else
    xent_rows_f32((const float *)j->x + r0 * j->V, j->t + r0, r1 - r0, j->V, j->o, (float *)j->lse + r0, j->l + r0);
}

/* Forward on CPU: the loss (0-d, or targets' shape for "none"; logits' dtype),
 * the saved lse (N, compute dtype) and the count M of rows not ignored. */
static em_tensor *xent_cpu(em_tensor *logits, em_tensor *targets, const xent_opts *o, em_tensor **lse_out,
                           double *count) {
  int64_t V = logits->shape[logits->ndim - 1], N = em_numel(targets);
  em_dtype ct = logits->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *x = em_contiguous_as(logits, ct);
  em_tensor *t = x ? em_contiguous_as(targets, EM_I64) : NULL;
  em_tensor *lse = t ? em_empty(1, &N, ct, logits->device) : NULL;
  double *l = lse ? malloc(sizeof(double) * (size_t)(N > 0 ? N : 1)) : NULL;
  em_tensor *loss = NULL;
  if (lse && !l) em_error("cross_entropy: out of memory for %lld row losses", (long long)N);
  if (l && check_targets(em_data_ptr(t), N, V, o->ignore) == 0) {
    xent_job j = {.x = em_data_ptr(x), .t = em_data_ptr(t), .o = o, .V = V, .f64 = ct == EM_F64,
                  .lse = em_data_ptr(lse), .l = l};
    em_parallel_for(N, em_grain(16 * V), xent_fwd_rows, &j);
    const int64_t *ti = em_data_ptr(t);
    double total = 0, m = 0;
    for (int64_t i = 0; i < N; i++) { total += l[i]; m += ti[i] != o->ignore; }
    *count = m;
    if (o->reduction == EM_REDUCTION_NONE) {
      loss = em_empty(targets->ndim, targets->shape, logits->dtype, logits->device);
      for (int64_t i = 0; loss && i < N; i++) em_store_f64(em_data_ptr(loss), loss->dtype, i, l[i]);
    } else {
      double v = o->reduction == EM_REDUCTION_SUM ? total : m > 0 ? total / m : NAN;
      loss = em_scalar_tensor(v, logits->dtype, logits->device);
    }
  }
  free(l);
  em_tensor_release(x); em_tensor_release(t);
  if (loss) *lse_out = lse; else em_tensor_release(lse);
  return loss;
}

/* dx = w_i (exp(x - lse) - eps / V), minus w_i (1 - eps) at the target; w_i = 0 for an ignored row. */
#define XENT_GRAD(ATTR, NAME, T, EXP)                                                                 \
  ATTR static void NAME(const T *x, const int64_t *t, const T *lse, int64_t N, int64_t V, const xent_opts *o,   \
                   const double *w, int64_t wstride, double wdiv, T *gx) {                           \
    for (int64_t i = 0; i < N; i++, x += V, gx += V) {                                                \
      T scale = t[i] == o->ignore ? (T)0 : (T)(w[i * wstride] / wdiv), sm = scale * (T)(o->eps / (double)V); \
      for (int64_t j = 0; j < V; j++) gx[j] = scale * EXP(x[j] - lse[i]);                              \
      if (o->eps > 0) for (int64_t j = 0; j < V; j++) gx[j] -= sm;                                     \
      if (t[i] != o->ignore) gx[t[i]] -= scale * (T)(1 - o->eps);                                      \
    }                                                                                                 \
  }
XENT_GRAD(EM_SIMD_CLONES, xent_grad_f32, float, em_exp_f32)
XENT_GRAD(, xent_grad_f64, double, exp)

static void xent_grad_rows(void *ctx, int64_t r0, int64_t r1) {
  const xent_job *j = ctx;
  int64_t V = j->V;
  if (j->f64)
    xent_grad_f64((const double *)j->x + r0 * V, j->t + r0, (const double *)j->lse_in + r0, r1 - r0, V, j->o,
                  j->w + r0 * j->wstride, j->wstride, j->wdiv, (double *)j->gx + r0 * V);
  else
    xent_grad_f32((const float *)j->x + r0 * V, j->t + r0, (const float *)j->lse_in + r0, r1 - r0, V, j->o,
                  j->w + r0 * j->wstride, j->wstride, j->wdiv, (float *)j->gx + r0 * V);
}

/* Contiguous targets of a dtype the kernels read (i32/i64; others widened to i64). */
static em_tensor *cuda_targets(em_tensor *targets) {
  if (targets->dtype == EM_I32 || targets->dtype == EM_I64) return em_contiguous(targets);
  return em_contiguous_as(targets, EM_I64);
}

static em_xent_opts cuda_opts(const xent_opts *o) {
  em_xent_opts c = {o->ignore, o->eps, o->reduction};
  return c;
}

/* Forward on CUDA; *count_out: the device count of counted rows (mean only). */
static em_tensor *xent_cuda(em_tensor *logits, em_tensor *targets, const xent_opts *o, em_tensor **lse_out,
                            em_tensor **count_out) {
  int64_t N = em_numel(targets);
  em_dtype ct = logits->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_xent_opts co = cuda_opts(o);
  em_tensor *x = em_contiguous(logits);
  em_tensor *t = x ? cuda_targets(targets) : NULL;
  em_tensor *lse = t ? em_empty(1, &N, ct, logits->device) : NULL;
  em_tensor *count = lse && o->reduction == EM_REDUCTION_MEAN ? em_empty(0, NULL, EM_F32, logits->device) : NULL;
  em_tensor *loss = NULL;
  if (lse && (count || o->reduction != EM_REDUCTION_MEAN))
    loss = o->reduction == EM_REDUCTION_NONE ? em_empty(1, &N, logits->dtype, logits->device)
                                             : em_empty(0, NULL, logits->dtype, logits->device);
  if (loss && em_xent_fwd_cuda(x, t, &co, lse, loss, count)) { em_tensor_release(loss); loss = NULL; }
  if (loss && o->reduction == EM_REDUCTION_NONE) {   /* (N) -> targets' shape: a view of the fresh buffer */
    em_tensor *v = em_view(loss, targets->ndim, targets->shape);
    em_tensor_release(loss);
    loss = v;
  }
  em_tensor_release(x); em_tensor_release(t);
  if (loss) { *lse_out = lse; *count_out = count; }
  else { em_tensor_release(lse); em_tensor_release(count); }
  return loss;
}

static void node_opts(const em_node *n, xent_opts *o) {
  o->ignore = n->i[0];
  o->reduction = (int)n->i[1];
  o->eps = n->f[0];
}

/* saved: logits, targets, lse[, count]. */
static int xent_backward_cuda(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *logits = n->saved[0], *targets = n->saved[1], *lse = n->saved[2];
  em_tensor *count = n->n_saved > 3 ? n->saved[3] : NULL;
  xent_opts o;
  node_opts(n, &o);
  em_xent_opts co = cuda_opts(&o);
  em_tensor *x = em_contiguous(logits);
  em_tensor *t = x ? cuda_targets(targets) : NULL;
  em_tensor *g = t ? em_contiguous(gout[0]) : NULL;
  em_tensor *gx = g ? em_empty(logits->ndim, logits->shape, logits->dtype, logits->device) : NULL;
  if (gx && em_xent_bwd_cuda(x, t, &co, lse, g, count, gx)) { em_tensor_release(gx); gx = NULL; }
  em_tensor_release(x); em_tensor_release(t); em_tensor_release(g);
  gin[0] = gx;
  return gx ? 0 : -1;
}

/* The gradient is produced in the compute dtype; the engine rounds it to the
 * logits' dtype. n->f[1] = the count M (CPU). */
static int xent_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *logits = n->saved[0], *targets = n->saved[1], *lse = n->saved[2];
  /* logits, targets, lse read, the logits' gradient written; exp(x - lse) - onehot, scaled: 4 FLOPs */
  EM_OP_COST(2 * em_cost_nbytes(logits) + em_cost_nbytes(targets) + em_cost_nbytes(lse) + em_cost_nbytes(gout[0]),
             4 * em_numel(logits), em_cost_simt_class(lse->dtype));
  if (logits->device.type != EM_CPU) return xent_backward_cuda(n, gout, gin);
  xent_opts o;
  node_opts(n, &o);
  int64_t V = logits->shape[logits->ndim - 1], N = em_numel(targets);
  em_dtype ct = lse->dtype;
  em_tensor *g = em_contiguous_as(gout[0], EM_F64);
  em_tensor *x = g ? em_contiguous_as(logits, ct) : NULL;
  em_tensor *t = x ? em_contiguous_as(targets, EM_I64) : NULL;
  em_tensor *gx = t ? em_empty(logits->ndim, logits->shape, ct, logits->device) : NULL;
  if (gx) {
    int64_t ws = o.reduction == EM_REDUCTION_NONE ? 1 : 0;
    double div = o.reduction == EM_REDUCTION_MEAN ? n->f[1] : 1;
    xent_job j = {.x = em_data_ptr(x), .lse_in = em_data_ptr(lse), .t = em_data_ptr(t), .o = &o, .V = V,
                  .f64 = ct == EM_F64, .w = em_data_ptr(g), .wstride = ws, .wdiv = div, .gx = em_data_ptr(gx)};
    em_parallel_for(N, em_grain(16 * V), xent_grad_rows, &j);
  }
  em_tensor_release(g); em_tensor_release(x); em_tensor_release(t);
  gin[0] = gx;
  return gx ? 0 : -1;
}

static em_tensor *xent_op(em_tensor *logits, em_tensor *targets, const xent_opts *o) {
  if (xent_validate(logits, targets)) return NULL;
  if (!(o->eps >= 0 && o->eps <= 1)) {
    em_error("cross_entropy: expected label_smoothing in [0, 1], got %g", o->eps);
    return NULL;
  }
  if (o->reduction < EM_REDUCTION_NONE || o->reduction > EM_REDUCTION_SUM) {
    em_error("cross_entropy: expected reduction none, mean or sum, got code %d", o->reduction);
    return NULL;
  }
  em_tensor *lse = NULL, *count = NULL;
  double m = 0;
  em_tensor *loss = logits->device.type == EM_CPU ? xent_cpu(logits, targets, o, &lse, &m)
                                                  : xent_cuda(logits, targets, o, &lse, &count);
  /* logits and targets read once, lse and the loss written; max, exp(x - m), sum: 4 FLOPs an element */
  EM_OP_COST(em_cost_bytes(4, (em_tensor *const[]){logits, targets, lse, loss}), 4 * em_numel(logits),
             em_cost_simt_class(logits->dtype));
  em_node *node = NULL;
  loss = em_op_record(loss, &node, "cross_entropy", xent_backward, 1, &logits, 4,
                      (em_tensor *[]){logits, targets, lse, count});
  if (node) {
    node->i[0] = o->ignore;
    node->i[1] = o->reduction;
    node->f[0] = o->eps;
    node->f[1] = m;
  }
  em_tensor_release(lse); em_tensor_release(count);
  return loss;
}

em_tensor *em_cross_entropy_ex(em_tensor *logits, em_tensor *targets, int64_t ignore_index, double label_smoothing,
                               em_reduction reduction) {
  EM_OP_SCOPE("cross_entropy");
  em_op_args a;
  if (em_op_autocast(&a, EM_AUTOCAST_F32, 1, &logits)) return NULL;
  xent_opts o = {ignore_index, label_smoothing, (int)reduction};
  em_tensor *loss = xent_op(a.t[0], targets, &o);
  em_op_args_release(&a);
  return loss;
}

em_tensor *em_cross_entropy(em_tensor *logits, em_tensor *targets) {
  return em_cross_entropy_ex(logits, targets, -100, 0.0, EM_REDUCTION_MEAN);
}
