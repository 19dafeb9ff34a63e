/* RoPE on CUDA (kernels/rope.cu), the device half of engine/ops/rope.c.
 * Tensors are validated by the engine op. */
#ifndef EMBER_KERNELS_ROPE_H
#define EMBER_KERNELS_ROPE_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = x with each adjacent pair (x[2j], x[2j+1]) rotated by sign · pos · theta^(-2j/d).
 * x (..., d): last-dim stride 1, any strides on the leading dims (a transposed
 * (B, H, T, d) view of (B, T, H, d) is read in place); pos: i32 or i64, any
 * strides, broadcast to x's leading dims; y: x's shape and dtype, last dim contiguous,
 * any strides on the leading dims (the engine gives it x's layout).
 * Forward is sign = +1, backward (the transpose) sign = -1. */
int em_rope_cuda(const em_tensor *x, const em_tensor *pos, double theta, double sign, em_tensor *y);

#ifdef __cplusplus
}
#endif
#endif
