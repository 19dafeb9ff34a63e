/* nll_loss, fused: for log-probabilities logp (..., C) with the class dim
 * last (F.nll_loss passes (N, C, d...) as a permuted view) and integer
 * targets t (...), row r's loss is
 *   l_r = -w[t_r] logp[r, t_r]        (w = weight, or 1; 0 when t_r == ignore_index)
 * reduced by sum, none (targets' shape) or mean = sum_r l_r / sum_r w[t_r]
 * over the counted rows (PyTorch's weighted mean; NaN when nothing counts).
 * Backward: d logp is zero but at [r, t_r], where it is -w[t_r] g_r (g_r:
 * g[r], g, or g / W for a mean over weight W); d w[c] sums, over the rows
 * whose target is c, g_r (-logp[r, c]) (sum/none) or g (-logp[r, c] - L) / W
 * (a mean L).
 *
 * A gather, not a one-hot: the forward reads N targets and N picked values
 * (the composition it replaces built an (N, C) one-hot and a masked copy of
 * logp, two full passes and five launches); the backward writes d logp once.
 * logp is read in place through its strides (em_nll_args), so the permuted
 * (N, C, d...) view is never copied. Per-row math in double on both devices.
 *
 * Targets are checked on the CPU (an out-of-range id is an error naming it);
 * on CUDA a check would read the device, so such a row makes the loss NaN, as
 * in cross_entropy. Autocast: a loss, on the f32 list. */
#include <stdio.h>
#include "op.h"

#define OP "nll_loss"

static int nll_validate(em_tensor *logp, em_tensor *target, em_tensor *weight, em_reduction reduction) {
  char s1[160], s2[160];
  if (em_check_float(OP, "input", logp) || em_check_int(OP, "target", target) ||
      em_check_same_device(OP, logp, target))
    return -1;
  if (logp->ndim < 1) return em_error(OP ": expected input with at least 1 dim (..., C), got a 0-dim tensor");
  if (target->ndim != logp->ndim - 1 ||
      memcmp(target->shape, logp->shape, sizeof(int64_t) * (size_t)target->ndim) != 0)
    return em_error(OP ": expected target of shape %s (input's shape without the class dim), got %s",
                    em_shape_str(logp->ndim - 1, logp->shape, s1, 160),
                    em_shape_str(target->ndim, target->shape, s2, 160));
  if (weight) {
    int64_t C = logp->shape[logp->ndim - 1];
    if (em_check_float(OP, "weight", weight) || em_check_same_device(OP, logp, weight)) return -1;
    if (weight->ndim != 1 || weight->shape[0] != C)
      return em_error(OP ": expected weight of shape [%lld] (one per class), got %s", (long long)C,
                      em_shape_str(weight->ndim, weight->shape, s1, 160));
  }
  if (reduction < EM_REDUCTION_NONE || reduction > EM_REDUCTION_SUM)
    return em_error(OP ": expected reduction none, mean or sum, got code %d", (int)reduction);
  return 0;
}

/* The rows' geometry: logp's leading dims and strides, its class stride. */
static void nll_args(const em_tensor *logp, int64_t ignore, int reduction, em_nll_args *a) {
  memset(a, 0, sizeof *a);
  a->nd = logp->ndim - 1;
  for (int d = 0; d < a->nd; d++) { a->shape[d] = logp->shape[d]; a->stride[d] = logp->stride[d]; }
  a->cstride = logp->stride[logp->ndim - 1];
  a->C = logp->shape[logp->ndim - 1];
  a->N = em_shape_numel(a->nd, a->shape);
  a->ignore_index = ignore;
  a->reduction = reduction;
}

/* Element offset of row r (relative to logp's data pointer). */
static int64_t row_offset(const em_nll_args *a, int64_t r) {
  int64_t off = 0;
  for (int d = a->nd - 1; d >= 0; d--) {
    off += (r % a->shape[d]) * a->stride[d];
    r /= a->shape[d];
  }
  return off;
}

static int check_targets(const int64_t *t, const em_nll_args *a) {
  for (int64_t r = 0; r < a->N; r++)
    if ((t[r] < 0 || t[r] >= a->C) && t[r] != a->ignore_index)
      return em_error(OP ": expected targets in [0, %lld) or ignore_index %lld, got %lld (at flat index %lld)",
                      (long long)a->C, (long long)a->ignore_index, (long long)t[r], (long long)r);
  return 0;
}

/* CPU forward: the loss in dt; stats = {sum of row losses, counted weight}. */
static em_tensor *nll_cpu(em_tensor *logp, const int64_t *t, const double *w, const em_nll_args *a, em_dtype dt,
                          const em_tensor *target, double *stats) {
  if (check_targets(t, a)) return NULL;
  bool none = a->reduction == EM_REDUCTION_NONE;
  em_tensor *out = none ? em_empty(target->ndim, target->shape, dt, logp->device) : NULL;
  if (none && !out) return NULL;
  const void *x = em_data_ptr(logp);
  double S = 0, W = 0;
  for (int64_t r = 0; r < a->N; r++) {
    double l = 0;
    if (t[r] != a->ignore_index) {
      double wr = w ? w[t[r]] : 1.0;
      l = (0 - em_load_f64(x, logp->dtype, row_offset(a, r) + t[r] * a->cstride)) * wr;   /* +0, never -0, for w = 0 */
      W += wr;
    }
    S += l;
    if (out) em_store_f64(em_data_ptr(out), dt, r, l);
  }
  stats[0] = S;
  stats[1] = W;
  if (none) return out;
  return em_scalar_tensor(a->reduction == EM_REDUCTION_SUM ? S : S / W, dt, logp->device);
}

static em_tensor *nll_cuda(em_tensor *logp, em_tensor *t, em_tensor *w, const em_nll_args *a, em_dtype dt,
                           const em_tensor *target, em_tensor **stats) {
  bool none = a->reduction == EM_REDUCTION_NONE;
  int64_t two = 2;
  em_tensor *out = none ? em_empty(target->ndim, target->shape, dt, logp->device) : em_empty(0, NULL, dt, logp->device);
  em_tensor *st = out && !none ? em_empty(1, &two, EM_F64, logp->device) : NULL;
  if (out && (none || st) && em_nll_fwd_cuda(logp, t, w, a, out, st) == 0) {
    *stats = st;
    return out;
  }
  em_tensor_release(out);
  em_tensor_release(st);
  return NULL;
}

/* saved: logp, the i64 (CPU) or i32/i64 (CUDA) targets, [weight in the
 * compute dtype,] [stats (CUDA, mean/sum)]; i[0] ignore_index, i[1]
 * reduction, i[2] has weight; f[0], f[1] the CPU's stats. */
static int nll_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *logp = n->saved[0], *t = n->saved[1];
  int k = 2;
  em_tensor *w = n->i[2] ? n->saved[k++] : NULL;
  em_tensor *stats = k < n->n_saved ? n->saved[k] : NULL;
  em_nll_args a;
  nll_args(logp, n->i[0], (int)n->i[1], &a);
  bool cpu = logp->device.type == EM_CPU, mean = a.reduction == EM_REDUCTION_MEAN;
  bool want_x = em_node_needs_input_grad(n, 0), want_w = w && em_node_needs_input_grad(n, 1);

  em_scratch s = {0};
  em_tensor *gx = !want_x ? NULL                       /* CUDA writes every element, zeros included */
                : EM_TMP(&s, cpu ? em_zeros(logp->ndim, logp->shape, EM_F64, logp->device)
                                 : em_empty(logp->ndim, logp->shape, logp->dtype, logp->device));
  em_tensor *gw = want_w ? EM_TMP(&s, em_zeros(1, &a.C, w->dtype, logp->device)) : NULL;   /* f64 on the CPU */
  if (!s.failed && !cpu) {
    em_tensor *g = EM_TMP(&s, em_contiguous(gout[0]));
    if (g && em_nll_bwd_cuda(logp, t, w, &a, g, stats, gx, gw)) s.failed = true;
  } else if (!s.failed) {
    em_tensor *g = EM_TMP(&s, em_contiguous_as(gout[0], EM_F64));
    if (g) {
      const int64_t *ti = em_data_ptr(t);
      const double *gv = em_data_ptr(g), *wv = w ? em_data_ptr(w) : NULL;
      double *gxv = gx ? em_data_ptr(gx) : NULL, *gwv = gw ? em_data_ptr(gw) : NULL;
      double W = n->f[1], L = n->f[0] / W;
      for (int64_t r = 0; r < a.N; r++) {
        if (ti[r] == a.ignore_index) continue;
        double gr = a.reduction == EM_REDUCTION_NONE ? gv[r] : mean ? gv[0] / W : gv[0];
        if (gxv) gxv[r * a.C + ti[r]] = -(wv ? wv[ti[r]] : 1.0) * gr;
        if (gwv) {
          double x = em_load_f64(em_data_ptr(logp), logp->dtype, row_offset(&a, r) + ti[r] * a.cstride);
          gwv[ti[r]] += mean ? gr * (-x - L) : gr * -x;
        }
      }
    }
  }
  if (gx) em_scratch_give(&s, n, 0, gx, gin);
  if (gw) em_scratch_give(&s, n, 1, gw, gin);
  return em_scratch_end(&s);
}

static em_tensor *nll_op(em_tensor *logp, em_tensor *target, em_tensor *weight, int64_t ignore,
                         em_reduction reduction) {
  if (nll_validate(logp, target, weight, reduction)) return NULL;
  em_dtype dt = weight ? em_promote(logp->dtype, weight->dtype) : logp->dtype;
  em_dtype ct = dt == EM_F64 ? EM_F64 : EM_F32;
  bool cpu = logp->device.type == EM_CPU;
  em_nll_args a;
  nll_args(logp, ignore, (int)reduction, &a);
  em_tensor *t = cpu || (target->dtype != EM_I32 && target->dtype != EM_I64) ? em_contiguous_as(target, EM_I64)
                                                                             : em_contiguous(target);
  em_tensor *w = t && weight ? em_contiguous_as(weight, cpu ? EM_F64 : ct) : NULL;
  em_tensor *loss = NULL, *stats = NULL;
  double st[2] = {0, 0};
  if (t && (w || !weight))
    loss = cpu ? nll_cpu(logp, em_data_ptr(t), w ? em_data_ptr(w) : NULL, &a, dt, target, st)
               : nll_cuda(logp, t, w, &a, dt, target, &stats);
  em_node *node = NULL;
  loss = em_op_record(loss, &node, OP, nll_backward, 2, (em_tensor *[]){logp, weight}, 4,
                      (em_tensor *[]){logp, t, w, stats});
  if (node) {
    node->i[0] = ignore;
    node->i[1] = (int64_t)reduction;
    node->i[2] = weight != NULL;
    node->f[0] = st[0];
    node->f[1] = st[1];
  }
  em_tensor_release(t);
  em_tensor_release(w);
  em_tensor_release(stats);
  return loss;
}

em_tensor *em_nll_loss(em_tensor *logp, em_tensor *target, em_tensor *weight, int64_t ignore_index,
                       em_reduction reduction) {
  EM_OP_SCOPE(OP);
  if (!logp || !target) {
    em_error(OP ": expected input and target tensors, got %s", logp ? "no target" : "no input");
    return NULL;
  }
  em_op_args a;
  if (em_op_autocast(&a, EM_AUTOCAST_F32, 2, (em_tensor *[]){logp, weight})) return NULL;
  em_tensor *loss = nll_op(a.t[0], target, a.t[1], ignore_index, reduction);
  em_op_args_release(&a);
  return loss;
}
