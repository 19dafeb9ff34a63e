/* Optimizer steps and gradient-norm helpers on CUDA (kernels/adamw.cu), the
 * device half of engine/ops/optim.c. All are multi-tensor: one launch covers
 * up to a few hundred tensors (their pointers and sizes ride in the kernel's
 * arguments, PyTorch's multi_tensor_apply), so a whole model's step is one or
 * two launches and replays from a CUDA graph unchanged. Lists are validated
 * by the engine (same device, shapes, dtypes; contiguous tensors). */
#ifndef EMBER_KERNELS_OPTIM_H
#define EMBER_KERNELS_OPTIM_H

#include <stdbool.h>
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PyTorch AdamW in place, bit for bit the CPU's per-element arithmetic.
 * steps == NULL: the step count is `step` (host) and lr is `lr`.
 * steps != NULL (capturable): steps[i] is a 0-d f32/i64 device tensor holding
 * the steps taken so far; it is incremented on the device first and the new
 * value used; lr_t (0-d f32/f64 on the device) overrides lr when not NULL. */
int em_adamw_cuda(int n, em_tensor **p, em_tensor **g, em_tensor **m, em_tensor **v, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t step, em_tensor **steps,
                  const em_tensor *lr_t);

/* PyTorch SGD (momentum, weight decay; no dampening/Nesterov). bufs NULL when momentum == 0. */
int em_sgd_cuda(int n, em_tensor **p, em_tensor **g, em_tensor **bufs, double lr, double momentum,
                double weight_decay, bool first_step);

/* out (0-d f32 on the device) = sum of squares of every element of every tensor,
 * accumulated in f64 with a fixed order (deterministic). */
int em_sum_of_squares_cuda(int n, em_tensor **ts, em_tensor *out);

/* With total = sqrt(sumsq[0]) read on the device: when total > max_norm,
 * every grad *= max_norm / (total + 1e-6); norm_out (0-d f32) = total. */
int em_clip_grads_cuda(int n, em_tensor **grads, const em_tensor *sumsq, double max_norm, em_tensor *norm_out);

#ifdef __cplusplus
}
#endif
#endif
