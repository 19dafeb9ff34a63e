/* Helpers for the costs ops declare to the profiler (EM_OP_COST in
 * backend/backend.h): bytes a call must move and FLOPs it must do, counted
 * from shapes as a floor: every tensor read or written once, broadcast
 * (stride-0) dims once. Only evaluated while a profiler session runs, so
 * they may walk shapes freely. */
#ifndef EMBER_OPS_COST_H
#define EMBER_OPS_COST_H

#include "internal.h"

/* Bytes of t's distinct elements: a broadcast (stride-0) dim counts once. */
static inline double em_cost_nbytes(const em_tensor *t) {
  if (!t) return 0;
  double n = 1;
  for (int d = 0; d < t->ndim; d++)
    if (t->stride[d] != 0) n *= (double)t->shape[d];
  return n * (double)em_dtype_size(t->dtype);
}

/* Sum of em_cost_nbytes over ts[0..n) (NULLs skipped). */
static inline double em_cost_bytes(int n, em_tensor *const *ts) {
  double b = 0;
  for (int i = 0; i < n; i++) b += em_cost_nbytes(ts[i]);
  return b;
}

/* The peak a matmul of dtype dt is held against: tensor cores for half
 * dtypes and for f32 on CUDA with TF32 allowed, the plain pipes otherwise. */
static inline int em_cost_gemm_class(em_dtype dt, em_device dev) {
  switch (dt) {
  case EM_BF16: return EM_FLOPS_BF16;
  case EM_F16: return EM_FLOPS_F16;
  case EM_F64: return EM_FLOPS_F64;
  default: return dev.type == EM_CUDA && em_cuda_allow_tf32() ? EM_FLOPS_TF32 : EM_FLOPS_F32;
  }
}

/* The class of non-matmul arithmetic: f64 for f64 tensors, else f32 (half
 * dtypes compute in f32). */
static inline int em_cost_simt_class(em_dtype dt) { return dt == EM_F64 ? EM_FLOPS_F64 : EM_FLOPS_F32; }

/* An op that reads and writes each of ts once and does flops_per_elem
 * FLOPs per element of `out`. */
#define EM_COST_ELEMWISE(out, flops_per_elem, n, ...)                                                     \
  EM_OP_COST(em_cost_bytes((n), (em_tensor *const[]){__VA_ARGS__}),                                       \
             (double)(flops_per_elem) * (double)em_numel(out), em_cost_simt_class((out)->dtype))

#endif
