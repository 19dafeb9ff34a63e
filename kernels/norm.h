/* RMSNorm on CUDA (kernels/norm.cu), the device half of engine/ops/norm.c.
 * Tensors are validated by the engine op. */
#ifndef EMBER_KERNELS_NORM_H
#define EMBER_KERNELS_NORM_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x contiguous (N rows of D), w (D) contiguous or NULL (any float dtype);
 * y contiguous in x's dtype; rstd (N) f32 (f64 for f64 x). */
int em_rmsnorm_fwd_cuda(const em_tensor *x, const em_tensor *w, double eps, em_tensor *y, em_tensor *rstd);

/* gy, x contiguous (N, D); gx (x's shape and dtype, contiguous) or NULL,
 * written, or added to when gx_accumulate (a residual stream's gradient sum);
 * gw (D, w's dtype) or NULL. gw is reduced deterministically: per-block
 * partial sums, then one fixed-order pass over the blocks. */
int em_rmsnorm_bwd_cuda(const em_tensor *x, const em_tensor *w, const em_tensor *rstd, const em_tensor *gy,
                        em_tensor *gx, bool gx_accumulate, em_tensor *gw);

#ifdef __cplusplus
}
#endif
#endif
