/* binary_cross_entropy_with_logits, fused: for logits x, targets y, an
 * optional weight w and pos_weight pw (each broadcast to the loss's shape)
 *   l = w [(1 - y) x + (1 + (pw - 1) y) softplus(-x)],
 *   softplus(-x) = max(-x, 0) + log1p(exp(-|x|))       (no overflow for any x)
 * which for pw = 1 is PyTorch's max(x, 0) - x y + log1p(exp(-|x|)); then
 * reduced by mean (over every element), sum or none. Backward, times the
 * upstream gradient (g_i for none, g for sum, g / n for mean):
 *   dx  = w [(1 - y) - (1 + (pw - 1) y) sigmoid(-x)]   (= w (sigmoid(x) - y) for pw = 1)
 *   dy  = w [(pw - 1) softplus(-x) - x]
 *   dpw = w y softplus(-x)
 *   dw  = the unweighted loss,
 * with sigmoid taken from exp(-|x|), so it is exact at x = 0 and never
 * overflows. One pass forward (the loss and its reduction) and one pass
 * backward (every gradient asked for), where the composition it replaces
 * (stack, logsumexp, five elementwise ops) made about ten.
 *
 * Operands: x and y are read as contiguous tensors of the loss's shape (a
 * broadcast x or y is expanded first: rare); w and pw as the loss's shape,
 * a row along the last dim (pos_weight's usual (C) shape) or a scalar, so
 * their usual shapes are read in place (em_bce_args). Everything is in one
 * dtype, the promotion of the four; the CPU computes in double, CUDA
 * (kernels/loss_bce.cu) in f32 (f64 for f64) with the sum in double. Gradients
 * come in the loss's shape and are summed to each input's shape.
 *
 * Autocast: a loss, on the f32 list. */
#include "op.h"

#define OP "binary_cross_entropy_with_logits"

/* softplus(-x), without overflow */
static inline double bce_sp(double x) { return (x < 0 ? -x : 0) + log1p(exp(-fabs(x))); }

/* factor i of a w / pw operand in mode m (row: i % C) */
#define FACTOR(p, m, i, C) ((m) == EM_BCE_FULL ? (double)(p)[i] : (m) == EM_BCE_ROW ? (double)(p)[(i) % (C)] \
                            : (m) == EM_BCE_SCALAR ? (double)(p)[0] : 1.0)

#define BCE_CPU(NAME, T)                                                                              \
  static double NAME(const T *x, const T *y, const T *w, const T *pw, const em_bce_args *a, T *out) { \
    double total = 0;                                                                                 \
    for (int64_t i = 0; i < a->n; i++) {                                                              \
      double xi = x[i], yi = y[i], l;                                                                 \
      if (a->pw_mode == EM_BCE_NONE) l = (xi > 0 ? xi : 0) - xi * yi + log1p(exp(-fabs(xi)));         \
      else l = (1 - yi) * xi + (1 + (FACTOR(pw, a->pw_mode, i, a->C) - 1) * yi) * bce_sp(xi);          \
      if (a->w_mode != EM_BCE_NONE) l *= FACTOR(w, a->w_mode, i, a->C);                               \
      if (out) out[i] = (T)l;                                                                         \
      total += l;                                                                                     \
    }                                                                                                 \
    return total;                                                                                     \
  }
BCE_CPU(bce_fwd_f32, float)
BCE_CPU(bce_fwd_f64, double)

/* Gradients (any may be NULL) of the loss's n elements; g[i * gstride] * scale is the upstream gradient. */
#define BCE_GRAD(NAME, T)                                                                                  \
  static void NAME(const T *x, const T *y, const T *w, const T *pw, const em_bce_args *a, const double *g,   \
                   int64_t gstride, double scale, T *gx, T *gy, T *gw, T *gpw) {                           \
    for (int64_t i = 0; i < a->n; i++) {                                                                   \
      double xi = x[i], yi = y[i], gi = g[i * gstride] * scale;                                            \
      double pwi = FACTOR(pw, a->pw_mode, i, a->C), wi = FACTOR(w, a->w_mode, i, a->C);                    \
      double e = exp(-fabs(xi)), lw = 1 + (pwi - 1) * yi, sp = (xi < 0 ? -xi : 0) + log1p(e);              \
      double sig = xi >= 0 ? 1 / (1 + e) : e / (1 + e), sig_neg = xi >= 0 ? e / (1 + e) : 1 / (1 + e);    \
      if (gx) gx[i] = (T)(gi * wi * (a->pw_mode == EM_BCE_NONE ? sig - yi : (1 - yi) - lw * sig_neg));     \
      if (gy) gy[i] = (T)(gi * wi * ((pwi - 1) * sp - xi));                                                \
      if (gpw) gpw[i] = (T)(gi * wi * yi * sp);                                                            \
      if (gw) gw[i] = (T)(gi * ((1 - yi) * xi + lw * sp));                                                 \
    }                                                                                                      \
  }
BCE_GRAD(bce_grad_f32, float)
BCE_GRAD(bce_grad_f64, double)

static const void *ptr_or_null(const em_tensor *t) { return t ? em_data_ptr(t) : NULL; }


/* How factor t (NULL, weight or pos_weight) is read against the loss's shape, and the tensor to read. */
static em_tensor *factor_as(em_tensor *t, int ndim, const int64_t *shape, em_dtype dt, int *mode) {
  *mode = EM_BCE_NONE;
  if (!t) return NULL;
  int64_t C = ndim > 0 ? shape[ndim - 1] : 1;
  bool row = t->ndim >= 1 && t->shape[t->ndim - 1] == C;
  for (int d = 0; row && d < t->ndim - 1; d++) row = t->shape[d] == 1;
  if (em_numel(t) == 1) *mode = EM_BCE_SCALAR;
  else if (row) *mode = EM_BCE_ROW;
  else { *mode = EM_BCE_FULL; return em_op_broadcast_as(t, ndim, shape, dt); }
  return em_contiguous_as(t, dt);
}

static int bce_validate(em_tensor *const *in, int *ndim, int64_t *shape, em_dtype *dt) {
  static const char *const names[4] = {"input", "target", "weight", "pos_weight"};
  *ndim = in[0]->ndim;
  memcpy(shape, in[0]->shape, sizeof(int64_t) * (size_t)in[0]->ndim);
  *dt = in[0]->dtype;
  for (int k = 0; k < 4; k++) {
    if (!in[k]) continue;
    if (em_check_float(OP, names[k], in[k]) || em_check_same_device(OP, in[0], in[k])) return -1;
    if (k > 0 && em_broadcast_shape(OP, *ndim, shape, in[k]->ndim, in[k]->shape, ndim, shape)) return -1;
    *dt = em_promote(*dt, in[k]->dtype);
  }
  return 0;
}

/* The operands as the kernels read them (new references; w, pw NULL when absent). */
typedef struct { em_tensor *t[4]; em_bce_args a; } bce_ops;

static void bce_ops_release(bce_ops *o) {
  for (int k = 0; k < 4; k++) em_tensor_release(o->t[k]);
}

static int bce_prepare(em_tensor *const *in, int ndim, const int64_t *shape, em_dtype dt, int reduction,
                       bce_ops *o) {
  memset(o, 0, sizeof *o);
  o->a.n = em_shape_numel(ndim, shape);
  o->a.C = ndim > 0 ? shape[ndim - 1] : 1;
  o->a.reduction = reduction;
  o->t[0] = em_op_broadcast_as(in[0], ndim, shape, dt);
  o->t[1] = o->t[0] ? em_op_broadcast_as(in[1], ndim, shape, dt) : NULL;
  if (!o->t[1]) { bce_ops_release(o); return -1; }
  if ((in[2] && !(o->t[2] = factor_as(in[2], ndim, shape, dt, &o->a.w_mode))) ||
      (in[3] && !(o->t[3] = factor_as(in[3], ndim, shape, dt, &o->a.pw_mode)))) {
    bce_ops_release(o);
    return -1;
  }
  return 0;
}

/* CPU forward: the loss (shape or 0-d) in dt. */
static em_tensor *bce_cpu(const bce_ops *o, int ndim, const int64_t *shape, em_dtype dt) {
  em_dtype ct = dt == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *c[4] = {NULL, NULL, NULL, NULL}, *out = NULL, *res = NULL;
  bool ok = true;
  for (int k = 0; k < 4 && ok; k++) ok = !o->t[k] || (c[k] = em_contiguous_as(o->t[k], ct));
  bool none = o->a.reduction == EM_REDUCTION_NONE;
  if (ok && none) ok = (out = em_empty(ndim, shape, ct, o->t[0]->device)) != NULL;
  if (ok) {
    double total = ct == EM_F32
      ? bce_fwd_f32(em_data_ptr(c[0]), em_data_ptr(c[1]), ptr_or_null(c[2]), ptr_or_null(c[3]), &o->a,
                    out ? em_data_ptr(out) : NULL)
      : bce_fwd_f64(em_data_ptr(c[0]), em_data_ptr(c[1]), ptr_or_null(c[2]), ptr_or_null(c[3]), &o->a,
                    out ? em_data_ptr(out) : NULL);
    if (none) res = em_contiguous_as(out, dt);
    else res = em_scalar_tensor(o->a.reduction == EM_REDUCTION_SUM ? total : total / (double)o->a.n, dt,
                                o->t[0]->device);
  }
  for (int k = 0; k < 4; k++) em_tensor_release(c[k]);
  em_tensor_release(out);
  return res;
}

static em_tensor *bce_cuda(const bce_ops *o, int ndim, const int64_t *shape, em_dtype dt) {
  bool none = o->a.reduction == EM_REDUCTION_NONE;
  em_tensor *out = none ? em_empty(ndim, shape, dt, o->t[0]->device) : em_empty(0, NULL, dt, o->t[0]->device);
  if (out && em_bce_fwd_cuda(o->t[0], o->t[1], o->t[2], o->t[3], &o->a, out)) {
    em_tensor_release(out);
    out = NULL;
  }
  return out;
}

/* saved: the prepared x, y[, w][, pw]; i[0..3] = reduction, w mode, pw mode, dt. */
static int bce_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  bce_ops o;
  memset(&o, 0, sizeof o);
  int k = 0;
  o.t[0] = n->saved[k++];
  o.t[1] = n->saved[k++];
  o.a.reduction = (int)n->i[0];
  o.a.w_mode = (int)n->i[1];
  o.a.pw_mode = (int)n->i[2];
  if (o.a.w_mode != EM_BCE_NONE) o.t[2] = n->saved[k++];
  if (o.a.pw_mode != EM_BCE_NONE) o.t[3] = n->saved[k++];
  em_dtype dt = o.t[0]->dtype;
  int ndim = o.t[0]->ndim;
  const int64_t *shape = o.t[0]->shape;
  o.a.n = em_numel(o.t[0]);
  o.a.C = ndim > 0 ? shape[ndim - 1] : 1;
  bool cpu = o.t[0]->device.type == EM_CPU, none = o.a.reduction == EM_REDUCTION_NONE;
  em_dtype ct = cpu ? (dt == EM_F64 ? EM_F64 : EM_F32) : dt;
  double scale = o.a.reduction == EM_REDUCTION_MEAN ? 1.0 / (double)o.a.n : 1.0;

  em_scratch s = {0};
  em_tensor *g = EM_TMP(&s, em_contiguous_as(gout[0], cpu ? EM_F64 : dt));
  em_tensor *gr[4] = {NULL, NULL, NULL, NULL};
  for (int i = 0; i < 4; i++)
    if (o.t[i] && em_node_needs_input_grad(n, i)) gr[i] = EM_TMP(&s, em_empty(ndim, shape, ct, o.t[0]->device));
  if (!s.failed && cpu) {
    em_tensor *c[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++) if (o.t[i]) c[i] = EM_TMP(&s, em_contiguous_as(o.t[i], ct));
    if (!s.failed) {
#define BCE_GRAD_CALL(F, T)                                                                                    \
      F((const T *)em_data_ptr(c[0]), (const T *)em_data_ptr(c[1]), (const T *)ptr_or_null(c[2]),            \
        (const T *)ptr_or_null(c[3]), &o.a, em_data_ptr(g), none ? 1 : 0, scale,                               \
        gr[0] ? (T *)em_data_ptr(gr[0]) : NULL, gr[1] ? (T *)em_data_ptr(gr[1]) : NULL,                         \
        gr[2] ? (T *)em_data_ptr(gr[2]) : NULL, gr[3] ? (T *)em_data_ptr(gr[3]) : NULL)
      if (ct == EM_F32) BCE_GRAD_CALL(bce_grad_f32, float);
      else BCE_GRAD_CALL(bce_grad_f64, double);
#undef BCE_GRAD_CALL
    }
  } else if (!s.failed && em_bce_bwd_cuda(o.t[0], o.t[1], o.t[2], o.t[3], &o.a, g, scale, gr[0], gr[1], gr[2], gr[3])) {
    s.failed = true;
  }
  for (int i = 0; i < 4; i++) if (gr[i]) em_scratch_give(&s, n, i, gr[i], gin);
  return em_scratch_end(&s);
}

static em_tensor *bce_op(em_tensor *const *in, em_reduction reduction) {
  if (reduction < EM_REDUCTION_NONE || reduction > EM_REDUCTION_SUM) {
    em_error(OP ": expected reduction none, mean or sum, got code %d", (int)reduction);
    return NULL;
  }
  int ndim;
  int64_t shape[EM_MAX_DIMS];
  em_dtype dt;
  if (bce_validate(in, &ndim, shape, &dt)) return NULL;
  bce_ops o;
  if (bce_prepare(in, ndim, shape, dt, (int)reduction, &o)) return NULL;
  em_tensor *loss = o.t[0]->device.type == EM_CPU ? bce_cpu(&o, ndim, shape, dt) : bce_cuda(&o, ndim, shape, dt);
  em_node *node = NULL;
  loss = em_op_record(loss, &node, OP, bce_backward, 4, in, 4, o.t);
  if (node) {
    node->i[0] = (int64_t)reduction;
    node->i[1] = o.a.w_mode;
    node->i[2] = o.a.pw_mode;
  }
  bce_ops_release(&o);
  return loss;
}

em_tensor *em_bce_with_logits(em_tensor *input, em_tensor *target, em_tensor *weight, em_tensor *pos_weight,
                              em_reduction reduction) {
  EM_OP_SCOPE(OP);
  if (!input || !target) {
    em_error(OP ": expected input and target tensors, got %s", input ? "no target" : "no input");
    return NULL;
  }
  em_op_args a;
  if (em_op_autocast(&a, EM_AUTOCAST_F32, 4, (em_tensor *[]){input, target, weight, pos_weight})) return NULL;
  em_tensor *loss = bce_op(a.t, reduction);
  em_op_args_release(&a);
  return loss;
}
