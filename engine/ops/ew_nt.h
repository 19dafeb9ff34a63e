/* f32 add/sub/mul/div written straight to memory with non-temporal stores
 * (the CPU elementwise loop's streamed outputs, engine/ops/elementwise.c).
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

#endif
