/* FlashAttention-2 on CUDA (kernels/flash_fwd.cu, kernels/flash_bwd.cu), the
 * device half of engine/ops/flash_attention.c. Tensors are validated by the
 * engine op: q (B, H, Tq, D), k and v (B, H, Tk, D), any strides over B, H and
 * T (multiples of 8 elements, 16-byte aligned data) with the last dim
 * contiguous; bf16 or f16; D one of em_flash_supported_dim(). lse and delta are
 * contiguous f32 (B, H, Tq). */
#ifndef EMBER_KERNELS_FLASH_H
#define EMBER_KERNELS_FLASH_H

#include <stdbool.h>
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* true for the head dims the kernels are built for (16, 32, 64, 80, 96, 128). */
bool em_flash_supported_dim(int64_t d);

/* o = softmax(q kᵀ · scale [+ causal mask]) v, lse = the rows' log-sum-exp
 * (natural log, of the scaled scores). o has q's shape and dtype. */
int em_flash_fwd_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, em_tensor *o, em_tensor *lse,
                      bool causal, float scale);

/* dq, dk, dv from do, the saved o and lse; delta is (B, H, Tq) f32 scratch.
 * Deterministic: no atomics (dk/dv and dq are two kernels). */
int em_flash_bwd_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *o,
                      const em_tensor *lse, const em_tensor *dout, em_tensor *delta, em_tensor *dq, em_tensor *dk,
                      em_tensor *dv, bool causal, float scale);

#ifdef __cplusplus
}
#endif
#endif
