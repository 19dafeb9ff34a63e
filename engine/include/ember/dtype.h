/* Element types and scalar conversions. bf16 and f16 conversions round to
 * nearest even (as PyTorch and the CUDA intrinsics do), so the CPU reference
 * and the GPU agree bit for bit. */
#ifndef EMBER_DTYPE_H
#define EMBER_DTYPE_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include "half.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  EM_F32 = 0, EM_F64, EM_BF16, EM_F16, EM_I32, EM_I64, EM_U16, EM_U8, EM_BOOL,
  EM_NDTYPES
} em_dtype;

size_t em_dtype_size(em_dtype t);
const char *em_dtype_name(em_dtype t);          /* "f32", "bf16", ... */
int em_dtype_from_name(const char *name, em_dtype *out); /* 0 ok, -1 unknown; accepts torch aliases (float32, float, bfloat16, int64, long ...) */
int em_dtype_is_float(em_dtype t);              /* f32 f64 bf16 f16 */
int em_dtype_is_int(em_dtype t);                /* i32 i64 u16 u8 (not bool) */
/* PyTorch-style promotion of two operand types. */
em_dtype em_promote(em_dtype a, em_dtype b);

/* Scalar conversions (bf16/f16 round to nearest even): ember/half.h. */

/* Read/write one element of any dtype as double / int64 (slow path). */
double em_load_f64(const void *base, em_dtype t, int64_t i);
void em_store_f64(void *base, em_dtype t, int64_t i, double v);
int64_t em_load_i64(const void *base, em_dtype t, int64_t i);
void em_store_i64(void *base, em_dtype t, int64_t i, int64_t v);

/* Convert n contiguous elements between dtypes (CPU). */
void em_convert(void *dst, em_dtype dt, const void *src, em_dtype st, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
