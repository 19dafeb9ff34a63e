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

#endif
