/* linear_group: y_i = x @ w_iᵀ (i < n, 2 <= n <= EM_NODE_MAX_OUT) for n
 * weights of one shape (N, K) that read the same x — attention's q/k/v
 * projections, SwiGLU's w1 and w3 — as one op with one autograd node.
 *
 * Why: at the small model's shapes (M = B·T = 2048 tokens, K = N = 768) one
 * projection is 96 output tiles of 128 x 128 for 132 SMs, and its weight
 * gradient 36: every gemm pays a ramp and a tail, the weight gradients fill a
 * quarter of the GPU. With the group's weights as one (n·N, K) operand W:
 *   forward   Y (n, M, N) = x @ W_iᵀ   one strided-batched gemm (x shared, stride 0)
 *   grad x    (M, K)      = dY @ W      one gemm with k = n·N (dY the (M, n·N) join)
 *   grad W    (n·N, K)    = dYᵀ @ x    one gemm: n·36 tiles instead of n of 36
 * 2 n + n gemm launches become 3; the FLOPs (2 M N K a gemm) are unchanged.
 * The price: the n output gradients arrive from their consumers as separate
 * tensors and are joined into one (M, n·N) buffer (n copies, 2 M n N half
 * bytes), unless they already are adjacent column slices of one buffer, or
 * stacked (n, M, N) as SwiGLU's backward writes them: then grad W is one
 * strided-batched gemm and grad x n gemms adding into one sum (beta = 1),
 * no copy.
 *
 * W needs the n weights as adjacent rows of one storage in the compute dtype:
 *  - under autocast, f32 weights: their shadow weights (ember/autocast.h),
 *    which the first fused call regroups as row slices of one buffer that
 *    AdamW then writes in its step (the weights themselves are untouched:
 *    names, storages, checkpoints, Module:to, DDP and ZeRO see no change);
 *    CUDA only: on the CPU autocast takes the fallback;
 *  - otherwise weights already in x's dtype that are adjacent row slices of
 *    one storage (a user's fused layout), on any device.
 * Anything else — switch off, n or shapes that do not fit, a shadow not yet
 * written (the first steps, after a checkpoint load), bias-free Linears a
 * user replaced — runs em_linear once per weight: today's path, same bits.
 * The fused path's bits differ from it only by cuBLASLt's (or BLAS's)
 * accumulation order for the joined shapes.
 *
 * The switch: EMBER_FUSED_PROJ=0|1|2 (default 0), read on first use, a bad
 * value an error; ember.backends.fused_proj(on) sets it at any time (true: 1).
 * 2 is 1 without the join, for measuring it: gradients that arrive separate
 * (q/k/v's) take grad x as n gemms adding into one sum and grad W as one
 * gemm a weight, as unfused; only the forward and stacked gradients fuse. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "op.h"
#include "cost.h"
#include "mm2d.h"

/* ---- the switch ---- */

static _Atomic int g_fused = -1;   /* -1: EMBER_FUSED_PROJ not read yet; else 0/1/2 */

/* The mode (0, 1, 2), reading EMBER_FUSED_PROJ the first time; -1 with the error set on a bad value. */
static int fused_mode(const char *op) {
  int v = atomic_load(&g_fused);
  if (v < 0) {
    const char *env = getenv("EMBER_FUSED_PROJ");
    if (!env || !*env || strcmp(env, "0") == 0) v = 0;
    else if (strcmp(env, "1") == 0) v = 1;
    else if (strcmp(env, "2") == 0) v = 2;
    else return em_error("%s: expected EMBER_FUSED_PROJ to be 0, 1 or 2, got '%s'", op, env);
    int unread = -1;
    if (!atomic_compare_exchange_strong(&g_fused, &unread, v)) v = unread;
  }
  return v;
}

int em_fused_proj_enabled(const char *op, bool *on) {
  int v = fused_mode(op);
  if (v < 0) return -1;
  *on = v != 0;
  return 0;
}

int em_fused_proj_set(const char *op, bool on, bool *prev) {
  if (fused_mode(op) < 0) return -1;   /* a bad EMBER_FUSED_PROJ is still an error */
  *prev = atomic_exchange(&g_fused, on ? 1 : 0) != 0;
  return 0;
}

/* ---- checks ---- */

static int group_validate(em_tensor *x, int n, em_tensor *const *w) {
  char s1[160], s2[160];
  if (!x) return em_error("linear_group: x is NULL");
  if (n < 1 || n > EM_NODE_MAX_OUT)
    return em_error("linear_group: expected 1 to %d weights, got %d", EM_NODE_MAX_OUT, n);
  for (int i = 0; i < n; i++) {
    if (!w[i]) return em_error("linear_group: weight %d is NULL", i + 1);
    if (w[i]->ndim != 2)
      return em_error("linear_group: expected weight %d to be 2-D (out, in), got shape %s", i + 1,
                      em_shape_str(w[i]->ndim, w[i]->shape, s1, 160));
    if (!em_same_shape(w[i], w[0]))
      return em_error("linear_group: expected every weight to have weight 1's shape %s, got %s for weight %d",
                      em_shape_str(w[0]->ndim, w[0]->shape, s1, 160),
                      em_shape_str(w[i]->ndim, w[i]->shape, s2, 160), i + 1);
  }
  return 0;   /* dtypes, devices and x's last dim: em_linear's own checks, on the fallback */
}

/* Are t[0..n) (N, K) contiguous row slices t[i] = rows [i N, (i+1) N) of one storage? */
static bool adjacent_rows(int n, em_tensor *const *t) {
  if (!t[0]) return false;
  int64_t nk = em_numel(t[0]);
  for (int i = 0; i < n; i++)
    if (!t[i] || !em_is_contiguous(t[i]) || t[i]->storage != t[0]->storage || t[i]->dtype != t[0]->dtype ||
        !em_same_shape(t[i], t[0]) || t[i]->offset != t[0]->offset + i * nk)
      return false;
  return true;
}

/* (n N, K) over adjacent rows starting at t0. */
static em_tensor *rows_view(const em_tensor *t0, int n) {
  return em_as_strided(t0, 2, (int64_t[]){n * t0->shape[0], t0->shape[1]}, (int64_t[]){t0->shape[1], 1},
                       t0->offset);
}

/* Give w[0..n)'s shadow weights one buffer, row slices in order, not current
 * until AdamW's next step writes them (shadows_prepare keeps a shadow of the
 * right dtype, shape and device). Only for f32 contiguous leaf weights that
 * may have shadows; a failed allocation leaves things as they were (fused
 * calls then keep taking the fallback: correct, only slower). */
static void group_shadows(int n, em_tensor *const *w, em_dtype ct) {
  em_tensor *raw[EM_NODE_MAX_OUT];
  for (int i = 0; i < n; i++) {
    if (w[i]->shadow_off || w[i]->dtype != EM_F32 || !em_is_contiguous(w[i]) || !w[i]->requires_grad ||
        w[i]->grad_fn || !em_device_eq(w[i]->device, w[0]->device))
      return;
    raw[i] = w[i]->shadow;
  }
  if (adjacent_rows(n, raw) && raw[0]->dtype == ct) return;   /* grouped, waiting for AdamW */
  em_tensor *buf = em_empty(2, (int64_t[]){n * w[0]->shape[0], w[0]->shape[1]}, ct, w[0]->device);
  if (!buf) { em_clear_error(); return; }
  em_tensor *v[EM_NODE_MAX_OUT] = {0};
  int i = 0;
  for (; i < n; i++)
    if (!(v[i] = em_as_strided(buf, 2, w[i]->shape, (int64_t[]){w[i]->shape[1], 1}, i * em_numel(w[i])))) break;
  em_tensor_release(buf);
  if (i < n) {
    for (int j = 0; j < i; j++) em_tensor_release(v[j]);
    em_clear_error();
    return;
  }
  for (i = 0; i < n; i++) {
    em_tensor_release(w[i]->shadow);
    w[i]->shadow = v[i];
    w[i]->shadow_storage = NULL;
    w[i]->shadow_want = 1 + (int)ct;
  }
}

/* The group's weight operand W (n N, K) in the compute dtype, or NULL when
 * the fused path does not apply (then the caller falls back; nothing is set). */
static em_tensor *group_operand(em_tensor *x, int n, em_tensor *const *w, bool autocast) {
  em_dtype ct = autocast ? em_autocast_dtype() : x->dtype;
  if (!em_dtype_is_float(x->dtype) || x->ndim < 1 || x->shape[x->ndim - 1] != w[0]->shape[1]) return NULL;
  /* autocast fuses on CUDA only: on the CPU the half operands are widened
   * per gemm either way and the joins cost more than they save (measured
   * 20-25 % slower on a 2-core VM), so the shadows are never regrouped there */
  if (autocast && (x->device.type != EM_CUDA || (x->dtype != EM_F32 && x->dtype != ct))) return NULL;
  for (int i = 0; i < n; i++)
    if (!em_device_eq(w[i]->device, x->device)) return NULL;
  if (w[0]->dtype == ct) return adjacent_rows(n, w) ? rows_view(w[0], n) : NULL;
  if (!autocast || w[0]->dtype != EM_F32) return NULL;
  em_tensor *s[EM_NODE_MAX_OUT];
  for (int i = 0; i < n; i++) {
    s[i] = w[i]->dtype == EM_F32 ? em_shadow_weight(w[i]) : NULL;
    if (s[i] && (s[i]->dtype != ct || !em_same_shape(s[i], w[i]))) s[i] = NULL;
  }
  bool ok = true;
  for (int i = 0; i < n; i++) ok = ok && s[i];
  if (ok && adjacent_rows(n, s)) return rows_view(s[0], n);
  if (em_grad_enabled()) group_shadows(n, w, ct);   /* training: the next AdamW step writes them grouped */
  return NULL;
}

/* ---- backward ---- */

/* Are the n output gradients adjacent column slices of one (rows, n N) buffer of dtype dt? */
static bool column_grads(em_tensor **gout, int n, int64_t rows, int64_t N, em_dtype dt) {
  em_tensor *g0 = gout[0];
  bool view = true;
  for (int i = 0; i < n && view; i++) {
    em_tensor *g = gout[i];
    int64_t rs = n * N;
    view = g->dtype == dt && g->storage == g0->storage && g->offset == g0->offset + i * N &&
           g->stride[g->ndim - 1] == 1 && em_shape_numel(g->ndim - 1, g->shape) == rows;
    /* the leading dims must read as rows of stride n N */
    for (int d = g->ndim - 2; d >= 0 && view; d--) {
      if (d < g->ndim - 2) rs *= g->shape[d + 1];
      view = g->shape[d] == 1 || g->stride[d] == rs;
    }
  }
  return view;
}

/* The n output gradients (each (..., N)) as one (rows, n N) matrix of dtype
 * dt: a view when they already are adjacent column slices of one buffer,
 * else a join (one copy each, from any layout and dtype). */
static em_tensor *joined_grads(em_tensor **gout, int n, int64_t rows, int64_t N, em_dtype dt) {
  em_tensor *g0 = gout[0];
  if (column_grads(gout, n, rows, N, dt)) return em_as_strided(g0, 2, (int64_t[]){rows, n * N}, (int64_t[]){n * N, 1}, g0->offset);
  em_tensor *out = em_empty(2, (int64_t[]){rows, n * N}, dt, g0->device);
  for (int i = 0; i < n && out; i++) {
    /* gradient i's slot: its own shape over columns [i N, (i+1) N) of out; one copy whatever its layout */
    em_tensor *g = gout[i];
    int64_t stride[EM_MAX_DIMS], span = n * N;
    stride[g->ndim - 1] = 1;
    for (int d = g->ndim - 2; d >= 0; d--) { stride[d] = span; span *= g->shape[d]; }
    em_tensor *slot = em_as_strided(out, g->ndim, g->shape, stride, i * N);
    int rc = slot ? em_copy_(slot, g) : -1;
    em_tensor_release(slot);
    if (rc) { em_tensor_release(out); out = NULL; }
  }
  return out;
}

/* a @ b as input i's gradient: on CUDA with half operands one cuBLASLt call
 * straight into in_dtype[i] (added into `into` when given), else em_matmul
 * (the engine casts the result to the input's dtype). */
static em_tensor *grad_mm(em_node *nd, int i, em_tensor *a, em_tensor *b, em_tensor *into) {
  bool half = a->dtype == EM_BF16 || a->dtype == EM_F16;
  if (a->device.type == EM_CUDA && half) return em_mm2d_cuda_as(a, b, nd->in_dtype[i], into);
  return em_matmul(a, b);
}

/* Which weights (inputs 1..n) want a gradient (*any), the sums already
 * held for them that a gemm may add into (sink[i]; asked once each: asking
 * hands a leaf's .grad over, so a sink found must be used), whether there
 * is one (*sinks) and whether the gradients share one dtype (*same_dt). */
static void weight_sinks(em_node *nd, bool ask, em_tensor **sink, bool *any, bool *sinks, bool *same_dt) {
  *any = *sinks = false;
  *same_dt = true;
  for (int i = 1; i < nd->n_in; i++) {
    sink[i] = NULL;
    if (!em_node_needs_input_grad(nd, i)) continue;
    *any = true;
    if (ask && (sink[i] = em_node_grad_sink(nd, i))) *sinks = true;
    if (nd->in_dtype[i] != nd->in_dtype[1]) *same_dt = false;
  }
}

/* Are the n output gradients stacked: contiguous (rows, N) blocks of dtype
 * dt, block i at gout[0] + i rows N (an (n, rows, N) buffer, as SwiGLU's
 * backward writes its two)? */
static bool stacked_grads(em_tensor **gout, int n, int64_t rows, int64_t N, em_dtype dt) {
  for (int i = 0; i < n; i++)
    if (gout[i]->dtype != dt || !em_is_contiguous(gout[i]) || gout[i]->storage != gout[0]->storage ||
        gout[i]->offset != gout[0]->offset + i * rows * N)
      return false;
  return true;
}

/* dW (n N, K) in dtype out_dt = for each i, dY_iᵀ @ x: one strided-batched
 * cuBLASLt call over the stacked gradients (x shared, batch stride 0). */
static em_tensor *stacked_weight_grad(em_tensor **gout, int n, em_tensor *x2, int64_t N, em_dtype out_dt) {
  int64_t rows = x2->shape[0], K = x2->shape[1];
  em_tensor *xc = em_contiguous(x2);
  em_tensor *dW = xc ? em_empty(2, (int64_t[]){n * N, K}, out_dt, x2->device) : NULL;
  if (dW) {
    em_tensor *g0 = gout[0];
    size_t es = em_dtype_size(g0->dtype);
    em_gemm_args g = {.op = "linear", .dtype = g0->dtype, .device = g0->device.index, .n = N, .m = K, .k = rows,
                      .batch = n, .a = (const char *)em_storage_ptr(g0) + g0->offset * (int64_t)es,
                      .a_trans = true, .lda = N, .a_bs = rows * N, .b = em_data_ptr(xc), .ldb = K, .b_bs = 0,
                      .c = em_data_ptr(dW), .ldc = K, .c_bs = N * K, .c_f32 = out_dt != g0->dtype};
    if (em_gemm_cuda(&g)) { em_tensor_release(dW); dW = NULL; }
    /* n gemms of N x K x rows: the gradients and x read, dW written */
    else EM_OP_COST((double)n * (double)rows * (double)N * (double)es + (double)em_cost_nbytes(xc) +
                    (double)em_cost_nbytes(dW), 2.0 * (double)n * (double)N * (double)K * (double)rows,
                    em_cost_gemm_class(g0->dtype, g0->device));
  }
  em_tensor_release(xc);
  return dW;
}

/* The backward without a join (CUDA, half): grad x as n gemms adding into
 * one sum (beta = 1, as the unfused q/k/v share theirs); grad W as one
 * batched gemm over stacked gradients, else (not stacked, or a weight with a
 * .grad to add into) one gemm a weight. */
static int stacked_backward(em_node *nd, em_tensor **gout, em_tensor **gin, em_tensor *lx, em_tensor *W,
                            bool stacked) {
  int n = nd->n_out;
  int64_t K = W->shape[1], N = W->shape[0] / n, rows = em_shape_numel(lx->ndim - 1, lx->shape);
  int rc = 0;
  em_tensor *g2[EM_NODE_MAX_OUT] = {0};
  for (int i = 0; i < n && rc == 0; i++)
    if (!(g2[i] = em_reshape(gout[i], 2, (int64_t[]){rows, N}))) rc = -1;
  if (rc == 0 && em_node_needs_input_grad(nd, 0)) {
    em_tensor *sink = em_node_grad_sink(nd, 0);
    em_tensor *sum = sink ? em_reshape(sink, 2, (int64_t[]){rows, K}) : NULL;
    if (sink && !sum) rc = -1;
    for (int i = 0; i < n && rc == 0; i++) {
      em_tensor *wi = em_narrow(W, 0, i * N, N);
      em_tensor *gx = wi ? em_mm2d_cuda_as(g2[i], wi, nd->in_dtype[0], sum) : NULL;
      em_tensor_release(wi);
      if (!gx) rc = -1;
      else { em_tensor_release(sum); sum = gx; }
    }
    if (rc == 0) gin[0] = sink ? em_tensor_retain(sink) : em_reshape(sum, lx->ndim, lx->shape);
    em_tensor_release(sum);
    if (rc == 0 && !gin[0]) rc = -1;
  }
  em_tensor *wsink[EM_NODE_MAX_OUT + 1] = {0};
  bool any_w = false, sinks = false, same_dt = true;
  if (rc == 0) weight_sinks(nd, true, wsink, &any_w, &sinks, &same_dt);
  em_tensor *x2 = rc == 0 && any_w ? em_reshape(lx, 2, (int64_t[]){rows, K}) : NULL;
  if (any_w && !x2) rc = -1;
  if (rc == 0 && any_w && stacked && !sinks && same_dt) {
    em_tensor *dW = stacked_weight_grad(gout, n, x2, N, nd->in_dtype[1]);
    for (int i = 1; i <= n && dW; i++)
      if (em_node_needs_input_grad(nd, i) && !(gin[i] = em_narrow(dW, 0, (i - 1) * N, N))) rc = -1;
    if (!dW) rc = -1;
    em_tensor_release(dW);
  } else if (rc == 0 && any_w) {
    for (int i = 1; i <= n && rc == 0; i++) {
      if (!em_node_needs_input_grad(nd, i)) continue;
      em_tensor *gt = em_transpose(g2[i - 1], 0, 1);
      gin[i] = gt ? em_mm2d_cuda_as(gt, x2, nd->in_dtype[i], wsink[i]) : NULL;
      em_tensor_release(gt);
      if (!gin[i]) rc = -1;
    }
  }
  em_tensor_release(x2);
  for (int i = 0; i < n; i++) em_tensor_release(g2[i]);
  return rc;
}

/* saved: lx (x in the compute dtype), W (n N, K); inputs x, w_1..w_n. */
static int group_backward(em_node *nd, em_tensor **gout, em_tensor **gin) {
  em_tensor *lx = nd->saved[0], *W = nd->saved[1];
  int n = nd->n_out;
  int64_t K = W->shape[1], N = W->shape[0] / n, rows = em_shape_numel(lx->ndim - 1, lx->shape);
  if (W->device.type == EM_CUDA && (W->dtype == EM_BF16 || W->dtype == EM_F16)) {
    if (stacked_grads(gout, n, rows, N, W->dtype)) return stacked_backward(nd, gout, gin, lx, W, true);
    if (nd->i[0] == 2 && !column_grads(gout, n, rows, N, W->dtype))     /* EMBER_FUSED_PROJ=2: no join */
      return stacked_backward(nd, gout, gin, lx, W, false);
  }
  em_tensor *dY = joined_grads(gout, n, rows, N, W->dtype);
  if (!dY) return -1;
  int rc = 0;
  bool cuda_half = dY->device.type == EM_CUDA && (dY->dtype == EM_BF16 || dY->dtype == EM_F16);
  if (em_node_needs_input_grad(nd, 0)) {
    /* the x that q, k and v (w1 and w3) share: one gemm over k = n N; a
     * gradient already summed for x (the residual's) is added into by it */
    em_tensor *sink = cuda_half ? em_node_grad_sink(nd, 0) : NULL;
    em_tensor *into = sink ? em_reshape(sink, 2, (int64_t[]){rows, K}) : NULL;
    em_tensor *gx = !sink || into ? grad_mm(nd, 0, dY, W, into) : NULL;
    if (gx) gin[0] = sink ? em_tensor_retain(sink) : em_reshape(gx, lx->ndim, lx->shape);
    em_tensor_release(into); em_tensor_release(gx);
    if (!gin[0]) rc = -1;
  }
  em_tensor *wsink[EM_NODE_MAX_OUT + 1] = {0};
  bool any_w = false, sinks = false, same_dt = true;
  if (rc == 0) weight_sinks(nd, cuda_half, wsink, &any_w, &sinks, &same_dt);
  em_tensor *x2 = rc == 0 && any_w ? em_reshape(lx, 2, (int64_t[]){rows, K}) : NULL;
  em_tensor *dYt = x2 ? em_transpose(dY, 0, 1) : NULL;
  if (any_w && !dYt) rc = -1;
  if (rc == 0 && any_w && !sinks && same_dt) {
    /* one gemm for the group's weight gradient; each weight's is a row slice */
    em_tensor *dW = grad_mm(nd, 1, dYt, x2, NULL);
    for (int i = 1; i <= n && dW; i++)
      if (em_node_needs_input_grad(nd, i) && !(gin[i] = em_narrow(dW, 0, (i - 1) * N, N))) rc = -1;
    if (!dW) rc = -1;
    em_tensor_release(dW);
  } else if (rc == 0 && any_w) {
    /* a weight whose .grad exists (a DDP bucket view, accumulated
     * micro-batches) gets its gradient added in by its own gemm */
    for (int i = 1; i <= n && rc == 0; i++) {
      if (!em_node_needs_input_grad(nd, i)) continue;
      em_tensor *rowsT = em_narrow(dYt, 0, (i - 1) * N, N);
      gin[i] = rowsT ? grad_mm(nd, i, rowsT, x2, wsink[i]) : NULL;
      em_tensor_release(rowsT);
      if (!gin[i]) rc = -1;
    }
  }
  em_tensor_release(x2); em_tensor_release(dYt); em_tensor_release(dY);
  return rc;
}

/* ---- forward ---- */

/* The fused forward over W: y_i (..., N) contiguous slices of one (n, rows, N) result. */
static int group_fused(em_tensor *x, int n, em_tensor *const *w, em_tensor *W, bool autocast, int mode,
                       em_tensor **ys) {
  int64_t K = W->shape[1], N = W->shape[0] / n, rows = em_shape_numel(x->ndim - 1, x->shape);
  bool grad = em_set_grad_enabled(false);
  em_tensor *lx = autocast ? em_autocast_value(x) : em_tensor_retain(x);
  em_tensor *x3 = lx ? em_reshape(lx, 3, (int64_t[]){1, rows, K}) : NULL;
  /* W_iᵀ as (n, K, N): element (i, k, j) = W[i N + j, k] */
  em_tensor *Wt = x3 ? em_as_strided(W, 3, (int64_t[]){n, K, N}, (int64_t[]){N * K, 1, K}, W->offset) : NULL;
  em_tensor *Y = Wt ? em_matmul(x3, Wt) : NULL;      /* (n, rows, N): one strided-batched gemm */
  em_set_grad_enabled(grad);
  em_tensor_release(x3); em_tensor_release(Wt);
  int rc = Y ? 0 : -1;
  int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS];
  memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  shape[x->ndim - 1] = N;
  int64_t span = 1;
  for (int d = x->ndim - 1; d >= 0; d--) { stride[d] = span; span *= shape[d]; }
  for (int i = 0; i < n && rc == 0; i++)
    if (!(ys[i] = em_as_strided(Y, x->ndim, shape, stride, Y->offset + i * rows * N))) rc = -1;
  if (rc == 0 && (em_grad_needed(1, &x) || em_grad_needed(n, w))) {
    em_node *nd = em_node_new("linear_group", group_backward, 1 + n, n);
    if (!nd) rc = -1;
    else {
      em_node_set_input(nd, 0, x);
      for (int i = 0; i < n; i++) em_node_set_input(nd, 1 + i, w[i]);
      em_node_save(nd, lx);
      em_node_save(nd, W);
      nd->i[0] = mode;                         /* 2: no join in backward */
      for (int i = 0; i < n; i++) em_node_set_output(nd, i, ys[i]);
      em_node_release(nd);
    }
  }
  em_tensor_release(Y); em_tensor_release(lx);
  if (rc) for (int i = 0; i < n; i++) { em_tensor_release(ys[i]); ys[i] = NULL; }
  return rc;
}

int em_linear_group(em_tensor *x, int n, em_tensor *const *w, em_tensor **ys) {
  EM_OP_SCOPE("linear_group");
  for (int i = 0; i < n && i < EM_NODE_MAX_OUT; i++) ys[i] = NULL;
  if (group_validate(x, n, w)) return -1;
  int mode = fused_mode("linear_group");
  if (mode < 0) return -1;
  em_tensor *W = mode && n >= 2 ? group_operand(x, n, w, em_autocast_enabled()) : NULL;
  if (W) {
    int rc = group_fused(x, n, w, W, em_autocast_enabled(), mode, ys);
    em_tensor_release(W);
    return rc;
  }
  for (int i = 0; i < n; i++)                  /* today's path: one linear a weight */
    if (!(ys[i] = em_linear(x, w[i], NULL))) {
      for (int j = 0; j < i; j++) { em_tensor_release(ys[j]); ys[j] = NULL; }
      return -1;
    }
  return 0;
}
