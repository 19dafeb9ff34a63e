/* Operands as the CUDA flash kernels take them, shared by the flash ops
 * (engine/ops/flash_attention.c, flash_decode.c). */
#ifndef EMBER_OPS_FLASH_TENSORS_H
#define EMBER_OPS_FLASH_TENSORS_H

#include "ember/tensor.h"

/* t itself (retained) when the kernels can read it — last dim contiguous,
 * other strides multiples of 8 elements, data 16-byte aligned — else a
 * contiguous, aligned copy. NULL with the error set. */
em_tensor *em_flash_kernel_ready(em_tensor *t);
/* A (B, H, T, D) view of fresh (B, T, H, D) memory: merging the heads back
 * (transpose + reshape) is free. NULL with the error set. */
em_tensor *em_flash_bthd_empty(int64_t b, int64_t h, int64_t t, int64_t d, em_dtype dt, em_device dev);

#endif
