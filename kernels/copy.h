/* Copies and fills involving CUDA tensors (kernels/copy.cu). engine/tensor.c
 * routes em_copy_/em_fill_ here for every non-CPU case; em_to, em_contiguous
 * and em_clone reach it through em_copy_. Everything is stream-ordered on the
 * current stream; only copies to pageable host memory wait for the device. */
#ifndef EMBER_KERNELS_COPY_H
#define EMBER_KERNELS_COPY_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[...] = src[...] with src broadcast to dst's shape, any strides, any of
 * the 9 dtypes (converted exactly as the CPU converts), any devices (at least
 * one CUDA). Validation (shapes, in-place rules) is em_copy_'s job. */
int em_copy_cuda(em_tensor *dst, em_tensor *src);
/* Fill a CUDA tensor of any strides with v converted to its dtype. */
int em_fill_cuda(em_tensor *dst, double v);
/* A same-device copy/convert kernel launch: dst and src on one CUDA device. */
int em_copy_device_cuda(em_tensor *dst, const em_tensor *src);

#ifdef __cplusplus
}
#endif
#endif
