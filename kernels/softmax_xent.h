/* Fused softmax cross-entropy on CUDA (kernels/softmax_xent.cu), the device
 * half of engine/ops/loss.c. Tensors are validated by the engine op. */
#ifndef EMBER_KERNELS_SOFTMAX_XENT_H
#define EMBER_KERNELS_SOFTMAX_XENT_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* logits: contiguous (N, V) float; targets: contiguous (N) i32 or i64.
 * Writes lse (N; f32, or f64 for f64 logits) = logsumexp of each row and
 * loss (0-d, any float dtype) = mean over rows of lse - logits[row, target],
 * the mean taken on the device. A target outside [0, V) makes its row, and so
 * the loss, NaN (a host-side check would synchronise). */
int em_xent_fwd_cuda(const em_tensor *logits, const em_tensor *targets, em_tensor *lse, em_tensor *loss);

/* dlogits (N, V, logits' dtype, contiguous) = g / N * (exp(logits - lse) - onehot(target)),
 * g a one-element float tensor on the device (read there: no host sync). */
int em_xent_bwd_cuda(const em_tensor *logits, const em_tensor *targets, const em_tensor *lse, const em_tensor *g,
                     em_tensor *dlogits);

#ifdef __cplusplus
}
#endif
#endif
