/* The autocast linear's 2-D gemm on CUDA (engine/ops/matmul.c), shared with
 * the grouped projections (linear_group.c): one cuBLASLt call, no autograd. */
#ifndef EMBER_OPS_MM2D_H
#define EMBER_OPS_MM2D_H

#include "internal.h"

/* c (n x m) = a (n x k) @ b (k x m) for 2-D half views on CUDA, c in out_dt:
 * a's dtype, or f32 written by cuBLASLt straight from the f32 accumulators.
 * With `into` (contiguous n x m of out_dt), c = into += a @ b instead. */
em_tensor *em_mm2d_cuda_as(em_tensor *a, em_tensor *b, em_dtype out_dt, em_tensor *into);

#endif
