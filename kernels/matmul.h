/* Matmul on CUDA through cuBLASLt (kernels/matmul.cu), and the bias
 * gradient of linear. engine/ops/matmul.c plans the product (1-D promotion,
 * batch broadcast, folding a shared right operand into one big gemm,
 * transposed views read in place) and hands each gemm over in row-major
 * BLAS terms, exactly as it calls cblas_?gemm on the CPU. */
#ifndef EMBER_KERNELS_MATMUL_H
#define EMBER_KERNELS_MATMUL_H

#include <stdbool.h>
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One strided-batched row-major gemm: for each batch index i < batch,
 *   C_i (n x m) = op(A_i) (n x k) @ op(B_i) (k x m) [+ bias (m) on every row]
 * with op(X) = X when !x_trans (X stored row-major, leading dim ldx) and
 * op(X) = Xᵀ when x_trans (Xᵀ stored row-major, leading dim ldx), A_i at
 * a + i * a_bs elements (a_bs 0: shared by every batch), likewise B; C rows
 * are contiguous with row stride ldc. All operands have dtype `dtype` (f32,
 * f64, bf16, f16); bf16/f16/f32 accumulate in f32 (TF32 only when
 * em_cuda_allow_tf32()), f64 in f64. Launches on the current stream. */
typedef struct {
  const char *op;             /* names errors: "matmul", "linear" */
  em_dtype dtype;
  int device;
  int64_t n, m, k, batch;
  const void *a; bool a_trans; int64_t lda, a_bs;
  const void *b; bool b_trans; int64_t ldb, b_bs;
  void *c; int64_t ldc, c_bs;
  const void *bias;           /* NULL: none (bias is fused as a cuBLASLt epilogue) */
  bool c_f32;                 /* C in f32 while A and B are bf16/f16 (no bias): an
                                 f32 gradient straight from half operands */
  bool accumulate;            /* C += A B (beta = 1; no bias): a gradient added into its sum */
} em_gemm_args;

int em_gemm_cuda(const em_gemm_args *g);

/* grad_bias (out) = sum over rows of g (rows, out); g contiguous, both on
 * one device, g of a float dtype, grad_bias of any float dtype. Sums in f32
 * (f64 for f64) in a fixed order: bit-reproducible. */
int em_linear_bias_grad_cuda(const em_tensor *g, em_tensor *grad_bias);

#ifdef __cplusplus
}
#endif
#endif
