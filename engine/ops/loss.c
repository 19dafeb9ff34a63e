/* cross_entropy: mean over all targets of logsumexp(logits_i) - logits_i[t_i].
 *
 * logits (..., V) of any float dtype are read as N = numel/V rows of V and
 * computed in f32 (f64 for f64) with the max subtracted before exp; the
 * per-row sums and the mean accumulate in double. The row's log-sum-exp is
 * saved (N values, not N x V) so the fused backward is a single pass:
 *   dlogits = g / N * (exp(logits - lse) - onehot(t)),
 * never materialising the softmax or the one-hot. Targets are checked before
 * any work so an out-of-range id is an error naming it, not a wild read.
 *
 * On CUDA both passes are single fused kernels (kernels/softmax_xent.cu) and
 * the mean is taken on the device: nothing is read back, so the loss and its
 * backward can be captured in a CUDA graph. Checking targets there would need
 * a host read; instead a target outside [0, V) makes the loss NaN.
 *
 * Autocast: cross-entropy is on the f32 list; under ember.autocast, bf16/f16
 * logits are widened to f32 first and the loss comes back in f32. */
#include <stdio.h>
#include "op.h"

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

static int check_targets(const int64_t *t, int64_t n, int64_t V) {
  for (int64_t i = 0; i < n; i++)
    if (t[i] < 0 || t[i] >= V)
      return em_error("cross_entropy: target %lld (at flat index %lld) is out of range for %lld classes "
                      "(expected 0..%lld)", (long long)t[i], (long long)i, (long long)V, (long long)(V - 1));
  return 0;
}

/* Row kernels, one per compute type (no per-element dtype switch). */
static double xent_rows_f32(const float *x, const int64_t *t, int64_t N, int64_t V, float *lse) {
  double total = 0;
  for (int64_t i = 0; i < N; i++, x += V) {
    float mx = x[0];
    for (int64_t j = 1; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    double s = 0;
    for (int64_t j = 0; j < V; j++) s += expf(x[j] - mx);
    lse[i] = mx + (float)log(s);
    total += ((double)mx - (double)x[t[i]]) + log(s);   /* not lse - x: lse is rounded to f32 */
  }
  return total;
}

static double xent_rows_f64(const double *x, const int64_t *t, int64_t N, int64_t V, double *lse) {
  double total = 0;
  for (int64_t i = 0; i < N; i++, x += V) {
    double mx = x[0];
    for (int64_t j = 1; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    double s = 0;
    for (int64_t j = 0; j < V; j++) s += exp(x[j] - mx);
    lse[i] = mx + log(s);
    total += (mx - x[t[i]]) + log(s);
  }
  return total;
}

/* Forward on CPU: the 0-d loss (logits' dtype) and the saved lse (N, compute dtype). */
static em_tensor *xent_cpu(em_tensor *logits, em_tensor *targets, em_tensor **lse_out) {
  int64_t V = logits->shape[logits->ndim - 1], N = em_numel(targets);
  em_dtype ct = logits->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *x = em_contiguous_as(logits, ct);
  em_tensor *t = x ? em_contiguous_as(targets, EM_I64) : NULL;
  em_tensor *lse = t ? em_empty(1, &N, ct, logits->device) : NULL;
  em_tensor *loss = NULL;
  if (lse && check_targets(em_data_ptr(t), N, V) == 0) {
    double total = ct == EM_F32 ? xent_rows_f32(em_data_ptr(x), em_data_ptr(t), N, V, em_data_ptr(lse))
                                : xent_rows_f64(em_data_ptr(x), em_data_ptr(t), N, V, em_data_ptr(lse));
    loss = em_scalar_tensor(N > 0 ? total / (double)N : NAN, logits->dtype, logits->device);
  }
  em_tensor_release(x); em_tensor_release(t);
  if (loss) *lse_out = lse; else em_tensor_release(lse);
  return loss;
}

static void xent_grad_f32(const float *x, const int64_t *t, const float *lse, int64_t N, int64_t V,
                          float scale, float *gx) {
  for (int64_t i = 0; i < N; i++, x += V, gx += V) {
    for (int64_t j = 0; j < V; j++) gx[j] = scale * expf(x[j] - lse[i]);
    gx[t[i]] -= scale;
  }
}

static void xent_grad_f64(const double *x, const int64_t *t, const double *lse, int64_t N, int64_t V,
                          double scale, double *gx) {
  for (int64_t i = 0; i < N; i++, x += V, gx += V) {
    for (int64_t j = 0; j < V; j++) gx[j] = scale * exp(x[j] - lse[i]);
    gx[t[i]] -= scale;
  }
}

/* Contiguous targets of a dtype the kernels read (i32/i64; others widened to i64). */
static em_tensor *cuda_targets(em_tensor *targets) {
  if (targets->dtype == EM_I32 || targets->dtype == EM_I64) return em_contiguous(targets);
  return em_contiguous_as(targets, EM_I64);
}

static em_tensor *xent_cuda(em_tensor *logits, em_tensor *targets, em_tensor **lse_out) {
  int64_t N = em_numel(targets);
  em_dtype ct = logits->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *x = em_contiguous(logits);
  em_tensor *t = x ? cuda_targets(targets) : NULL;
  em_tensor *lse = t ? em_empty(1, &N, ct, logits->device) : NULL;
  em_tensor *loss = lse ? em_empty(0, NULL, logits->dtype, logits->device) : NULL;
  if (loss && em_xent_fwd_cuda(x, t, lse, loss)) { em_tensor_release(loss); loss = NULL; }
  em_tensor_release(x); em_tensor_release(t);
  if (loss) *lse_out = lse; else em_tensor_release(lse);
  return loss;
}

static int xent_backward_cuda(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *logits = n->saved[0], *targets = n->saved[1], *lse = n->saved[2];
  em_tensor *x = em_contiguous(logits);
  em_tensor *t = x ? cuda_targets(targets) : NULL;
  em_tensor *gx = t ? em_empty(logits->ndim, logits->shape, logits->dtype, logits->device) : NULL;
  if (gx && em_xent_bwd_cuda(x, t, lse, gout[0], gx)) { em_tensor_release(gx); gx = NULL; }
  em_tensor_release(x); em_tensor_release(t);
  gin[0] = gx;
  return gx ? 0 : -1;
}

/* saved: logits, targets, lse. The gradient is produced in the compute dtype;
 * the engine rounds it to the logits' dtype. */
static int xent_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *logits = n->saved[0], *targets = n->saved[1], *lse = n->saved[2];
  if (logits->device.type != EM_CPU) return xent_backward_cuda(n, gout, gin);
  int64_t V = logits->shape[logits->ndim - 1], N = em_numel(targets);
  em_dtype ct = lse->dtype;
  double g;
  if (em_item(gout[0], &g)) return -1;
  em_tensor *x = em_contiguous_as(logits, ct);
  em_tensor *t = x ? em_contiguous_as(targets, EM_I64) : NULL;
  em_tensor *gx = t ? em_empty(logits->ndim, logits->shape, ct, logits->device) : NULL;
  if (gx) {
    double scale = N > 0 ? g / (double)N : 0;
    if (ct == EM_F32)
      xent_grad_f32(em_data_ptr(x), em_data_ptr(t), em_data_ptr(lse), N, V, (float)scale, em_data_ptr(gx));
    else
      xent_grad_f64(em_data_ptr(x), em_data_ptr(t), em_data_ptr(lse), N, V, scale, em_data_ptr(gx));
  }
  em_tensor_release(x); em_tensor_release(t);
  gin[0] = gx;
  return gx ? 0 : -1;
}

static em_tensor *xent_op(em_tensor *logits, em_tensor *targets) {
  if (xent_validate(logits, targets)) return NULL;
  em_tensor *lse = NULL;
  em_tensor *loss = logits->device.type == EM_CPU ? xent_cpu(logits, targets, &lse)
                                                  : xent_cuda(logits, targets, &lse);
  loss = em_op_record(loss, NULL, "cross_entropy", xent_backward, 1, &logits, 3,
                      (em_tensor *[]){logits, targets, lse});
  em_tensor_release(lse);
  return loss;
}

em_tensor *em_cross_entropy(em_tensor *logits, em_tensor *targets) {
  EM_OP_SCOPE("cross_entropy");
  em_op_args a;
  if (em_op_autocast(&a, EM_AUTOCAST_F32, 1, &logits)) return NULL;
  em_tensor *loss = xent_op(a.t[0], targets);
  em_op_args_release(&a);
  return loss;
}
