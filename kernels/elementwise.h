/* Elementwise launchers (kernels/elementwise.cu) behind a C ABI, and the
 * descriptions engine/ops/elementwise.c shares with them: the op codes beyond
 * the public enums (clamp, the fused unary gradients), compute classes, and
 * the coalesced broadcast loop plan. Plain C: included by the engine in every
 * build; the launchers exist only with EMBER_CUDA. */
#ifndef EMBER_KERNELS_ELEMENTWISE_H
#define EMBER_KERNELS_ELEMENTWISE_H

#include <stdbool.h>
#include "ember/tensor.h"
#include "ember/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Compute classes: f32 (f32/bf16/f16 storage), f64, i64 (integers and bool). */
enum { EM_EW_F32, EM_EW_F64, EM_EW_I64 };
/* Kernel arities. */
enum { EM_EW_BINARY, EM_EW_UNARY, EM_EW_WHERE };
/* Unary code beyond em_unop: clamp to [lo, hi]. */
enum { EM_EW_CLAMP = EM_NUNOPS };
/* Binary codes beyond em_binop: fused gradients of unary ops, g' = f(g, v)
 * with v the saved input x or output y (see unary_grad in elementwise.c). */
enum {
  EM_EW_G_ABS = EM_NBINOPS, EM_EW_G_SQRT, EM_EW_G_RSQRT, EM_EW_G_TANH, EM_EW_G_SIGMOID,
  EM_EW_G_SILU, EM_EW_G_RELU, EM_EW_G_GELU, EM_EW_G_SIN, EM_EW_G_COS, EM_EW_G_SQUARE,
  EM_EW_G_RECIP, EM_EW_G_CLAMP,
};

/* What to compute: arity, op code, compute class, clamp bounds (+-inf when unbounded). */
typedef struct {
  int kind, code, cls;
  double lo, hi;
} em_ew_kern;

/* An operand: a tensor broadcast to the loop shape, or the constant c (t NULL). */
typedef struct {
  const em_tensor *t;
  double c;
} em_ew_operand;

/* The broadcast iteration space with size-1 dims dropped and mergeable dims
 * merged; operand 0 is the output, operand j+1 input j. Strides in elements
 * (0 for broadcast dims and constants), relative to each tensor's offset. */
typedef struct {
  int ndim, n;
  int64_t shape[EM_MAX_DIMS];
  int64_t stride[4][EM_MAX_DIMS];
} em_ew_plan;

/* out = k(in...) over plan p (numel elements). out does not overlap any input
 * except as the very same view (the engine routes other overlaps through a
 * temporary). Launches on the current stream; no host synchronisation. */
int em_elementwise_cuda(const char *op, const em_ew_kern *k, em_tensor *out, int nin,
                        const em_ew_operand *in, const em_ew_plan *p, int64_t numel);

/* res (contiguous, a's shape and dtype) = a with the part of each trailing
 * matrix outside the triangle zeroed: upper keeps j - i >= k, lower j - i <= k. */
int em_triangle_cuda(const char *op, em_tensor *res, const em_tensor *a, int64_t k, bool upper);

#ifdef __cplusplus
}
#endif
#endif
