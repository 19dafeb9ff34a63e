/* The C ABI between the engine (C) and Ember's CUDA code (.cu). Each op
 * family declares its launchers in kernels/<family>.h, one stem per op
 * (engine/ops/norm.c -> kernels/norm.cu + kernels/norm.h). Launchers take
 * tensors already validated by the engine op, launch on the current stream,
 * return 0 or -1 with the error set, and never synchronise the host. */
#ifndef EMBER_KERNELS_H
#define EMBER_KERNELS_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copies involving a CUDA tensor (engine/tensor.c calls these for non-CPU copies). */
int em_copy_cuda(em_tensor *dst, em_tensor *src);
int em_fill_cuda(em_tensor *dst, double v);

#ifdef __cplusplus
}
#endif
#endif
