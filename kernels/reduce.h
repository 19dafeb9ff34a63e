/* Reduction launchers (kernels/reduce.cu) behind a C ABI, and the reduction
 * plan engine/ops/reduce.c shares with them. Plain C: included by the engine
 * in every build; the launchers exist only with EMBER_CUDA. */
#ifndef EMBER_KERNELS_REDUCE_H
#define EMBER_KERNELS_REDUCE_H

#include <stdbool.h>
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An input's dims split into kept (outer, one output each) and reduced
 * (inner) dims, each list coalesced where memory allows (nr >= 1; a
 * reduction over nothing has rshape {1}, rstride {0}). Strides in elements
 * relative to the input's offset. Outputs are numbered row-major over the
 * kept dims; reduced positions row-major over the reduced dims (the index
 * max/min/argmax return). */
typedef struct {
  int nk, nr;
  int64_t kshape[EM_MAX_DIMS], kstride[EM_MAX_DIMS];
  int64_t rshape[EM_MAX_DIMS], rstride[EM_MAX_DIMS];
  int64_t n_out, n_red;
} em_red_plan;

/* All launchers: outputs are contiguous and freshly allocated by the engine,
 * work goes on the current stream, nothing synchronises the host. */

/* res = sum over the plan's reduced dims / div. Floats accumulate in f32
 * (f64 for f64) and res has a's dtype; integers and bool sum exactly in i64
 * (wrapping) and res is i64. */
int em_sum_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p, double div);
/* res = sum((a - mean)^2) / dof, two passes, float inputs only. */
int em_var_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p, double dof);
/* Extremes: vals (a's dtype, may be NULL) and i64 indices (may be NULL);
 * the first index wins ties and the first NaN wins over everything. */
int em_extreme_cuda(const char *op, const em_tensor *a, const em_red_plan *p, bool is_max,
                    em_tensor *vals, em_tensor *idx);
/* res = max + log(sum(exp(a - max))) (shift 0 for an infinite max, NaN for a NaN max). */
int em_logsumexp_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p);
/* Softmax / log-softmax of a along dim into res (contiguous, a's shape and dtype). */
int em_softmax_cuda(const char *op, em_tensor *res, em_tensor *a, int dim, bool log_out);
/* Fused backward: gx = y * (g - sum(g * y)) (softmax) or g - exp(y) * sum(g)
 * (log_softmax), sums along dim; gx contiguous with y's shape. */
int em_softmax_backward_cuda(const char *op, em_tensor *gx, em_tensor *g, em_tensor *y, int dim, bool log_out);
/* max/min over one dim, backward: res (contiguous, zeroed, the input's shape)
 * gets g[o] at the position idx[o] names along dim; g and idx have the input's
 * shape with dim set to 1 (keep_shape). */
int em_scatter_dim_cuda(const char *op, em_tensor *res, em_tensor *g, em_tensor *idx, int dim,
                        const int64_t *keep_shape);

#ifdef __cplusplus
}
#endif
#endif
