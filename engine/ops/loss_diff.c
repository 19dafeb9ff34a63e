/* mse_loss and l1_loss, fused: for input x and target y (broadcast together)
 *   l = (x - y)^2   (mse)      l = |x - y|   (l1)
 * reduced by mean (over every element), sum or none. Backward, times the
 * upstream gradient (g_i for none, g for sum, g / n for mean):
 *   dx = 2 (x - y)   (mse)     dx = sign(x - y)   (l1, 0 at x == y as PyTorch)
 *   dy = -dx.
 * One pass forward (the loss and its reduction) and one pass backward (dx
 * and dy together), where the composition it replaces (sub, square or abs,
 * mean) made three kernels and about six passes.
 *
 * Operands: x and y are read as contiguous tensors of the loss's shape in
 * the promoted dtype (a broadcast operand is expanded first). The CPU
 * computes the difference and the loss in f32 (f64 for f64), as the
 * composition's elementwise ops did, and sums in double; CUDA
 * (kernels/loss_diff.cu) the same with a fixed-order double sum. bf16/f16
 * are widened to f32 and the result rounded once to the dtype. Gradients come
 * in the loss's shape and are summed to each input's shape.
 *
 * Autocast: a loss, on the f32 list (the composition's mean was). */
#include "op.h"
#include "parallel.h"

static const char *diff_name(int kind) { return kind == EM_LOSS_L1 ? "l1_loss" : "mse_loss"; }

#define DIFF_CPU(NAME, T)                                                                              \
  static double NAME(int kind, const T *x, const T *y, int64_t n, T *out) {                            \
    double total = 0;                                                                                  \
    for (int64_t i = 0; i < n; i++) {                                                                  \
      T d = x[i] - y[i];                                                                               \
      T l = kind == EM_LOSS_L1 ? (d < 0 ? -d : d) : d * d;                                             \
      if (out) out[i] = l;                                                                             \
      total += (double)l;                                                                              \
    }                                                                                                  \
    return total;                                                                                      \
  }
DIFF_CPU(diff_fwd_f32, float)
DIFF_CPU(diff_fwd_f64, double)

/* dx, dy (either may be NULL) of n elements; g[i * gstride] * scale is the upstream gradient. */
#define DIFF_GRAD(NAME, T)                                                                             \
  static void NAME(int kind, const T *x, const T *y, int64_t n, const double *g, int64_t gstride,      \
                   double scale, T *gx, T *gy) {                                                       \
    for (int64_t i = 0; i < n; i++) {                                                                  \
      double d = (double)x[i] - (double)y[i], gi = g[i * gstride] * scale;                            \
      double f = kind == EM_LOSS_L1 ? (d > 0 ? 1.0 : d < 0 ? -1.0 : d == 0 ? 0.0 : d) : 2 * d;        \
      if (gx) gx[i] = (T)(gi * f);                                                                     \
      if (gy) gy[i] = (T)(-(gi * f));                                                                  \
    }                                                                                                  \
  }
DIFF_GRAD(diff_grad_f32, float)
DIFF_GRAD(diff_grad_f64, double)

/* The CPU passes over the threads (engine/parallel.h). Forward: blocks of
 * EM_RED_BLOCK elements, each summed serially in double, the blocks'
 * partials added in block order: the same bits at any thread count.
 * Backward: element ranges (every output written once). */
typedef struct {
  int kind;
  bool f64;
  const void *x, *y;
  void *out;            /* forward "none": the losses; backward: dx */
  void *out2;           /* backward: dy */
  double *part;         /* forward: one partial a block */
  const double *g;      /* backward: the upstream gradient */
  int64_t n, gstride;
  double scale;
} diff_job;

#define OFF(p, T, i) ((p) ? (T *)(p) + (i) : NULL)

static void diff_fwd_blocks(void *ctx, int64_t b0, int64_t b1) {
  const diff_job *j = ctx;
  for (int64_t b = b0; b < b1; b++) {
    int64_t lo = b * EM_RED_BLOCK, m = EM_MIN(j->n - lo, (int64_t)EM_RED_BLOCK);
    j->part[b] = j->f64 ? diff_fwd_f64(j->kind, (const double *)j->x + lo, (const double *)j->y + lo, m,
                                       OFF(j->out, double, lo))
                        : diff_fwd_f32(j->kind, (const float *)j->x + lo, (const float *)j->y + lo, m,
                                       OFF(j->out, float, lo));
  }
}

static void diff_grad_range(void *ctx, int64_t b, int64_t e) {
  const diff_job *j = ctx;
  if (j->f64)
    diff_grad_f64(j->kind, (const double *)j->x + b, (const double *)j->y + b, e - b, j->g + b * j->gstride,
                  j->gstride, j->scale, OFF(j->out, double, b), OFF(j->out2, double, b));
  else
    diff_grad_f32(j->kind, (const float *)j->x + b, (const float *)j->y + b, e - b, j->g + b * j->gstride,
                  j->gstride, j->scale, OFF(j->out, float, b), OFF(j->out2, float, b));
}


/* CPU forward: the loss (shape or 0-d) in dt. */
static em_tensor *diff_cpu(int kind, em_reduction red, em_tensor *const *xy, int ndim, const int64_t *shape,
                           em_dtype dt) {
  em_dtype ct = dt == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *x = em_contiguous_as(xy[0], ct), *y = x ? em_contiguous_as(xy[1], ct) : NULL, *out = NULL, *res = NULL;
  bool none = red == EM_REDUCTION_NONE;
  int64_t n = em_shape_numel(ndim, shape);
  int64_t nb = em_red_blocks(n);
  double *part = y ? malloc(sizeof(double) * (size_t)(nb > 0 ? nb : 1)) : NULL;
  if (y && !part) em_error("%s: out of memory (%lld partial sums)", diff_name(kind), (long long)nb);
  if (part && (!none || (out = em_empty(ndim, shape, ct, xy[0]->device)))) {
    diff_job j = {.kind = kind, .f64 = ct == EM_F64, .x = em_data_ptr(x), .y = em_data_ptr(y),
                  .out = out ? em_data_ptr(out) : NULL, .part = part, .n = n};
    em_parallel_for(n > 0 ? nb : 0, 1, diff_fwd_blocks, &j);
    double total = 0;
    for (int64_t b = 0; b < (n > 0 ? nb : 0); b++) total += part[b];
    if (none) res = em_contiguous_as(out, dt);
    else res = em_scalar_tensor(red == EM_REDUCTION_SUM ? total : total / (double)n, dt, xy[0]->device);
  }
  free(part);
  em_tensor_release(x);
  em_tensor_release(y);
  em_tensor_release(out);
  return res;
}

static em_tensor *diff_cuda(int kind, em_reduction red, em_tensor *const *xy, int ndim, const int64_t *shape,
                            em_dtype dt) {
  bool none = red == EM_REDUCTION_NONE;
  em_tensor *out = none ? em_empty(ndim, shape, dt, xy[0]->device) : em_empty(0, NULL, dt, xy[0]->device);
  if (out && em_loss_diff_fwd_cuda(kind, (int)red, xy[0], xy[1], out)) {
    em_tensor_release(out);
    out = NULL;
  }
  return out;
}

/* saved: the prepared x, y; i[0] = kind, i[1] = reduction. */
static int diff_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *x = n->saved[0], *y = n->saved[1];
  int kind = (int)n->i[0];
  em_reduction red = (em_reduction)n->i[1];
  em_dtype dt = x->dtype;
  int64_t cnt = em_numel(x);
  bool cpu = x->device.type == EM_CPU, none = red == EM_REDUCTION_NONE;
  em_dtype ct = cpu ? (dt == EM_F64 ? EM_F64 : EM_F32) : dt;
  double scale = red == EM_REDUCTION_MEAN ? 1.0 / (double)cnt : 1.0;

  em_scratch s = {0};
  em_tensor *g = EM_TMP(&s, em_contiguous_as(gout[0], cpu ? EM_F64 : dt));
  em_tensor *gr[2] = {NULL, NULL};
  for (int i = 0; i < 2; i++)
    if (em_node_needs_input_grad(n, i)) gr[i] = EM_TMP(&s, em_empty(x->ndim, x->shape, ct, x->device));
  if (!s.failed && cpu) {
    em_tensor *cx = EM_TMP(&s, em_contiguous_as(x, ct)), *cy = EM_TMP(&s, em_contiguous_as(y, ct));
    if (!s.failed) {
      diff_job j = {.kind = kind, .f64 = ct == EM_F64, .x = em_data_ptr(cx), .y = em_data_ptr(cy),
                    .out = gr[0] ? em_data_ptr(gr[0]) : NULL, .out2 = gr[1] ? em_data_ptr(gr[1]) : NULL,
                    .g = em_data_ptr(g), .n = cnt, .gstride = none ? 1 : 0, .scale = scale};
      em_parallel_for(cnt, em_grain(4), diff_grad_range, &j);
    }
  } else if (!s.failed && em_loss_diff_bwd_cuda(kind, (int)red, x, y, g, scale, gr[0], gr[1])) {
    s.failed = true;
  }
  for (int i = 0; i < 2; i++) if (gr[i]) em_scratch_give(&s, n, i, gr[i], gin);
  return em_scratch_end(&s);
}

static em_tensor *diff_op(int kind, em_tensor *const *in, em_reduction red) {
  const char *op = diff_name(kind);
  if (red < EM_REDUCTION_NONE || red > EM_REDUCTION_SUM) {
    em_error("%s: expected reduction none, mean or sum, got code %d", op, (int)red);
    return NULL;
  }
  static const char *const names[2] = {"input", "target"};
  for (int k = 0; k < 2; k++)
    if (em_check_float(op, names[k], in[k])) return NULL;
  if (em_check_same_device(op, in[0], in[1])) return NULL;
  int ndim;
  int64_t shape[EM_MAX_DIMS];
  if (em_broadcast_shape(op, in[0]->ndim, in[0]->shape, in[1]->ndim, in[1]->shape, &ndim, shape)) return NULL;
  em_dtype dt = em_promote(in[0]->dtype, in[1]->dtype);
  em_tensor *xy[2] = {em_op_broadcast_as(in[0], ndim, shape, dt), NULL};
  if (xy[0]) xy[1] = em_op_broadcast_as(in[1], ndim, shape, dt);
  em_tensor *loss = NULL;
  if (xy[1]) {
    loss = xy[0]->device.type == EM_CPU ? diff_cpu(kind, red, xy, ndim, shape, dt)
                                        : diff_cuda(kind, red, xy, ndim, shape, dt);
    em_node *node = NULL;
    loss = em_op_record(loss, &node, op, diff_backward, 2, in, 2, xy);
    if (node) {
      node->i[0] = kind;
      node->i[1] = (int64_t)red;
    }
  }
  em_tensor_release(xy[0]);
  em_tensor_release(xy[1]);
  return loss;
}

static em_tensor *diff_loss(int kind, em_tensor *input, em_tensor *target, em_reduction red) {
  if (!input || !target) {
    em_error("%s: expected input and target tensors, got %s", diff_name(kind), input ? "no target" : "no input");
    return NULL;
  }
  em_op_args a;
  if (em_op_autocast(&a, EM_AUTOCAST_F32, 2, (em_tensor *[]){input, target})) return NULL;
  em_tensor *loss = diff_op(kind, a.t, red);
  em_op_args_release(&a);
  return loss;
}

em_tensor *em_mse_loss(em_tensor *input, em_tensor *target, em_reduction reduction) {
  EM_OP_SCOPE("mse_loss");
  return diff_loss(EM_LOSS_MSE, input, target, reduction);
}

em_tensor *em_l1_loss(em_tensor *input, em_tensor *target, em_reduction reduction) {
  EM_OP_SCOPE("l1_loss");
  return diff_loss(EM_LOSS_L1, input, target, reduction);
}
