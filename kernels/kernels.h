/* The C ABI between the engine and Ember's CUDA code. Everything here is
 * callable from C; the .cu files implement it. */
#ifndef EMBER_KERNELS_H
#define EMBER_KERNELS_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copies involving a CUDA tensor (engine/tensor.c calls this for non-CPU copies). */
int em_copy_cuda(em_tensor *dst, em_tensor *src);
int em_fill_cuda(em_tensor *dst, double v);

#ifdef __cplusplus
}
#endif
#endif
