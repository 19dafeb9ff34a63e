/* f32 add/sub/mul/div, and where/masked_fill (f32, bf16, f16), written
 * straight to memory with non-temporal stores (the CPU elementwise loop's
 * streamed outputs, engine/ops/elementwise.c).
 *
 * A streamed output was computed into an L1 piece, then copied out by
 * em_stream_copy (engine/stream.h): every value stored, loaded and stored
 * again, and the loads of a piece's inputs and the stores of its output
 * taking turns instead of overlapping. Here one loop loads, computes and
 * streams each 64-byte line, as the copy that bench_ops measures its peak
 * with does. The same IEEE operation per value as the generic loop; the one
 * result the two could differ in is a NaN from two NaN inputs (x86 keeps the
 * first operand's payload, and which operand comes first in a commutative
 * a + b is the compiler's choice), so a piece with a NaN result is reported
 * and the caller computes it again the generic way. */
#ifndef EMBER_OPS_EW_NT_H
#define EMBER_OPS_EW_NT_H

#include <stdbool.h>
#include <stdint.h>

/* Whether em_ew_f32_binary_nt runs op code `code` (em_binop) on this CPU
 * (AVX2 or AVX-512, as em_hand_simd allows). */
bool em_ew_f32_nt_has(int code);

/* o[i] = a[i] OP b[i] for i < n, o 64-byte aligned (whole lines streamed,
 * the ragged end stored plainly). Returns whether some o[i] is NaN: the
 * caller then fences (em_stream_fence) and recomputes those n values. */
bool em_ew_f32_binary_nt(int code, float *o, const float *a, const float *b, int64_t n);

/* where / masked_fill into a unit-stride output o (64-byte aligned) of
 * 4-byte (es 4) or 2-byte values, with the condition c unit stride and a, b
 * each unit stride or one value (stride 0): o[i] = c[i] != 0 ? a : b, the raw
 * bits (2-byte: bf16's or, f16, f16's NaN rule applied as ew_half.h's select
 * does), streamed. False, writing nothing, where there is no AVX-512 BW loop
 * or the strides or alignment do not fit: the caller's L1 piece then. */
bool em_ew_select_nt(void *o, int es, const uint8_t *c, const void *a, int64_t as, const void *b, int64_t bs,
                     int64_t n, bool f16);

#endif
