/* dropout: y = x * m / (1 - p), m_j = 1 with probability 1 - p (PyTorch's
 * F.dropout in training mode; eval mode never reaches the engine).
 *
 * The mask is never stored. It is a pure function of the Philox state the op
 * reserved (rng.h: element j in x's row-major order uses word j % 4 of block
 * ctr0 + j / 4 and is kept when u(w_j) < 1 - p), so backward regenerates it
 * from the saved state: gx = g * m / (1 - p) is the forward applied to g.
 * That costs ten Philox rounds per four elements again instead of a byte per
 * element held from forward to backward. Same seed, same mask on CPU and CUDA.
 *
 * Graph capture: on CUDA the state comes from em_rng_cuda_state, so inside a
 * CUDA graph the kernels read their counter from the graph's device cell and
 * every replay draws a new mask; the node saves that state (cell pointer and
 * offset), so a captured backward regenerates the replay's own mask.
 *
 * Values: f32/bf16/f16 multiply in f32 (f64 for f64) and round once, as the
 * kernel does; a dropped NaN stays NaN (x * 0), as in PyTorch. */
#include "op.h"
#include "parallel.h"
#include "backend/rng_math.h"

static int dropout_validate(em_tensor *x, double p) {
  if (!x) return em_error("dropout: expected a tensor, got NULL");
  if (em_check_float("dropout", "input", x)) return -1;
  if (!(p >= 0 && p <= 1)) return em_error("dropout: expected p in [0, 1], got %g", p);
  return 0;
}

static double keep_scale(double p) { return p < 1 ? 1.0 / (1.0 - p) : 0.0; }

/* y (contiguous, ct) = x (contiguous, ct) * m * scale over n elements.
 * Element j's mask bit comes from Philox counter ctr0 + j / 4 whoever
 * computes it, so groups of 4 elements go over the threads. */
typedef struct { const void *x; void *y; em_dtype ct; int64_t n; double p; uint64_t seed, ctr0; } dropout_job;

static void apply_groups(void *ctx, int64_t g0, int64_t g1) {
  const dropout_job *jb = ctx;
  const void *xp = jb->x;
  void *yp = jb->y;
  em_dtype ct = jb->ct;
  int64_t n = jb->n;
  uint64_t seed = jb->seed, ctr0 = jb->ctr0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  double q = 1.0 - jb->p, scale = keep_scale(jb->p);
  float sf = (float)scale;
  for (int64_t j0 = g0 * 4; j0 < EM_MIN(g1 * 4, n); j0 += 4) {
    uint64_t c = ctr0 + (uint64_t)(j0 / 4);
    em_philox_block b = em_philox4x32_10((uint32_t)c, (uint32_t)(c >> 32), 0, 0, k0, k1);
    int cnt = (int)EM_MIN((int64_t)4, n - j0);
    for (int k = 0; k < cnt; k++) {
      int keep = em_rng_below(b.v[k], q);
      if (ct == EM_F64) ((double *)yp)[j0 + k] = ((const double *)xp)[j0 + k] * (keep ? scale : 0.0);
      else ((float *)yp)[j0 + k] = ((const float *)xp)[j0 + k] * (keep ? sf : 0.0f);
    }
  }
}

/* out = x * m * scale for the stream st (CPU: st.cell is NULL), in x's dtype, contiguous. */
static em_tensor *dropout_apply(em_tensor *x, double p, em_philox_state st) {
  int64_t n = em_numel(x);
  if (x->device.type != EM_CPU) {
    em_tensor *xc = em_contiguous(x);
    em_tensor *y = xc ? em_empty(x->ndim, x->shape, x->dtype, x->device) : NULL;
    if (y && em_dropout_cuda(xc, y, p, st)) { em_tensor_release(y); y = NULL; }
    em_tensor_release(xc);
    return y;
  }
  em_dtype ct = x->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *xc = em_contiguous_as(x, ct);
  em_tensor *yc = xc ? em_empty(x->ndim, x->shape, ct, x->device) : NULL;
  em_tensor *y = NULL;
  if (yc) {
    dropout_job j = {em_data_ptr(xc), em_data_ptr(yc), ct, n, p, st.seed, st.offset};
    em_parallel_for((n + 3) / 4, em_grain(16), apply_groups, &j);
    y = em_contiguous_as(yc, x->dtype);   /* yc itself for f32/f64: one rounding for bf16/f16 */
  }
  em_tensor_release(xc); em_tensor_release(yc);
  return y;
}

/* n->f[0] = p; n->i[0..2] = the Philox state (seed, offset, cell). */
static int dropout_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_philox_state st = {(uint64_t)n->i[0], (uint64_t)n->i[1], (const uint64_t *)(uintptr_t)n->i[2]};
  gin[0] = dropout_apply(gout[0], n->f[0], st);
  return gin[0] ? 0 : -1;
}

em_tensor *em_dropout(em_tensor *x, double p) {
  EM_OP_SCOPE("dropout");
  if (dropout_validate(x, p)) return NULL;
  uint64_t blocks = (uint64_t)((em_numel(x) + 3) / 4);
  em_philox_state st = {0, 0, NULL};
  if (x->device.type == EM_CPU) { st.seed = em_rng_seed(); st.offset = em_rng_reserve(blocks); }
  else st = em_rng_cuda_state(blocks);
  em_tensor *y = dropout_apply(x, p, st);
  em_node *node = NULL;
  y = em_op_record(y, &node, "dropout", dropout_backward, 1, &x, 0, NULL);
  if (node) {
    node->f[0] = p;
    node->i[0] = (int64_t)st.seed;
    node->i[1] = (int64_t)st.offset;
    node->i[2] = (int64_t)(uintptr_t)st.cell;
  }
  return y;
}
