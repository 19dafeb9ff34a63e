/* The one op path: the plumbing every op in engine/ops/ shares, so an op's
 * file holds only its checks, its CPU forward, its backward formula and its
 * call into the backend (backend/backend.h). An op reads:
 *
 *   em_tensor *em_rmsnorm(em_tensor *x, em_tensor *w, double eps) {
 *     EM_OP_SCOPE("rmsnorm");                    // NVTX, profiler, memory history
 *     em_op_args a;                               // inputs as autocast's f32 list wants them
 *     if (em_op_autocast(&a, EM_AUTOCAST_F32, 2, (em_tensor *[]){x, w})) return NULL;
 *     em_tensor *y = rmsnorm_op(a.t[0], a.t[1], eps);
 *     em_op_args_release(&a);
 *     return y;
 *   }
 *   static em_tensor *rmsnorm_op(em_tensor *x, em_tensor *w, double eps) {
 *     if (rmsnorm_validate(x, w, eps)) return NULL;                 // its checks
 *     em_tensor *rstd = NULL;
 *     em_tensor *y = x->device.type == EM_CPU ? rmsnorm_cpu(x, w, eps, &rstd)   // CPU forward
 *                                             : rmsnorm_cuda(x, w, eps, &rstd); // the backend
 *     y = em_op_record(y, NULL, "rmsnorm", rmsnorm_backward,        // autograd
 *                      2, (em_tensor *[]){x, w}, 3, (em_tensor *[]){x, rstd, w});
 *     em_tensor_release(rstd);
 *     return y;
 *   }
 *
 * The CUDA branch needs no #ifdef: without CUDA its launcher is the stub in
 * backend/no_cuda.c. The common checks (em_check_float, em_check_same_device,
 * em_check_ndim, em_check_out, ...) are in internal.h. */
#ifndef EMBER_OPS_OP_H
#define EMBER_OPS_OP_H

#include "internal.h"

/* Which autocast list an op is on (ember/autocast.h): none, the f32 list
 * (norms, softmax, losses: half inputs widened to f32) or the lower-precision
 * list (matmul, linear, attention: float inputs cast to the region's dtype). */
typedef enum { EM_AUTOCAST_NONE, EM_AUTOCAST_F32, EM_AUTOCAST_LOWER } em_autocast_list;

/* An op's tensor inputs after autocast. Outside an autocast region (or for
 * EM_AUTOCAST_NONE) they are the caller's tensors, borrowed: the fast path
 * costs one load and one branch. */
typedef struct {
  em_tensor *t[EM_NODE_MAX_IN];
  int n;
  bool owned;                     /* t[] holds new references (casts) */
} em_op_args;

/* a->t[i] = ts[i] as the op's autocast list wants it (NULL stays NULL).
 * 0, or -1 with the error set (nothing left to release). */
int em_op_autocast(em_op_args *a, em_autocast_list list, int n, em_tensor *const *ts);
void em_op_args_release(em_op_args *a);

/* Record y's autograd node when grad mode is on and an input requires grad:
 * inputs in[0..n_in) (trailing NULLs are absent optional inputs), saved
 * tensors sv[0..n_sv) in order (NULLs skipped), so n->saved[k] is the k-th
 * non-NULL one. *node (may be NULL) gets the node for attributes (n->f, n->i,
 * n->ctx), or NULL when none was recorded. Returns y, or NULL with y released
 * and the error set; a NULL y passes through. */
em_tensor *em_op_record(em_tensor *y, em_node **node, const char *op, em_backward_fn backward, int n_in,
                        em_tensor *const *in, int n_sv, em_tensor *const *sv);

/* x (..., T, d) and pos as RoPE's operands (engine/ops/rope.c): float x with
 * an even last dim, integer pos on x's device broadcasting to x's leading
 * dims, theta > 0 and finite; op and xname name them in the error. 0 or -1. */
int em_rope_check(const char *op, const char *xname, em_tensor *x, em_tensor *pos, double theta);
/* a and b (checked as above) rotated by sign · angle into out[0] and out[1],
 * recording no autograd node: rope_qk's forward (+1) and backward (−1), on
 * CUDA one launch for both when they share a dtype and last dim. 0 or -1. */
int em_rope_pair(em_tensor *a, em_tensor *b, em_tensor *pos, double theta, double sign, em_tensor **out);

/* t broadcast to (ndim, shape) as a contiguous tensor of dtype dt (t itself,
 * retained, when it already is one): a fused op's operand read flat. */
em_tensor *em_op_broadcast_as(em_tensor *t, int ndim, const int64_t *shape, em_dtype dt);

/* ---- backward formulas built from ops ----
 * Temporaries of one backward formula, released together. EM_TMP evaluates
 * its expression only while nothing has failed, so a chain of statements
 * stops at the first error and keeps its message:
 *   em_scratch s = {0};
 *   em_tensor *t = EM_TMP(&s, em_binary(EM_MUL, g, y, NULL));
 *   em_scratch_give(&s, n, 0, t, gin);      // summed to input 0's shape
 *   return em_scratch_end(&s);              // releases t; 0 or -1 */
typedef struct { em_tensor *t[24]; int n; bool failed; } em_scratch;

static inline em_tensor *em_scratch_keep(em_scratch *s, em_tensor *t) {
  if (!t) { s->failed = true; return NULL; }
  if (s->n == 24) { em_tensor_release(t); s->failed = true; em_error("backward: too many temporaries"); return NULL; }
  return s->t[s->n++] = t;
}
#define EM_TMP(s, expr) ((s)->failed ? NULL : em_scratch_keep((s), (expr)))

/* Release the temporaries: 0, or -1 when a step failed (its error is set). */
static inline int em_scratch_end(em_scratch *s) {
  for (int i = 0; i < s->n; i++) em_tensor_release(s->t[i]);
  return s->failed ? -1 : 0;
}

/* The same, handing `result` (retained) to *gin first; -1 also when it is NULL. */
static inline int em_scratch_end_into(em_scratch *s, em_tensor *result, em_tensor **gin) {
  if (!s->failed && result) *gin = em_tensor_retain(result);
  em_scratch_end(s);
  return s->failed || !result ? -1 : 0;
}

/* gin[i] = g summed to input i's shape, when input i needs a gradient. */
static inline void em_scratch_give(em_scratch *s, em_node *n, int i, em_tensor *g, em_tensor **gin) {
  if (s->failed || !em_node_needs_input_grad(n, i)) return;
  if (!g) { s->failed = true; return; }
  gin[i] = em_sum_to(g, n->in_ndim[i], n->in_shape[i]);
  if (!gin[i]) s->failed = true;
}

#endif
