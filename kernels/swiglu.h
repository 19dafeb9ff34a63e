/* SwiGLU on CUDA (kernels/swiglu.cu), the device half of engine/ops/swiglu.c.
 * Tensors are validated by the engine op. */
#ifndef EMBER_KERNELS_SWIGLU_H
#define EMBER_KERNELS_SWIGLU_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = silu(a) * b; a, b, y contiguous, same shape and dtype. */
int em_swiglu_fwd_cuda(const em_tensor *a, const em_tensor *b, em_tensor *y);

/* ga = g * b * s * (1 + a (1 - s)), gb = g * a * s with s = sigmoid(a);
 * all contiguous, a's shape and dtype; ga or gb may be NULL. */
int em_swiglu_bwd_cuda(const em_tensor *a, const em_tensor *b, const em_tensor *g, em_tensor *ga, em_tensor *gb);

#ifdef __cplusplus
}
#endif
#endif
