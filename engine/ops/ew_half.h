/* The CPU elementwise loop's 16-bit fast paths (engine/ops/elementwise.c),
 * and the raw 32-bit select of where/masked_fill into f32, compiled for
 * SSE2, AVX2 and AVX-512 (vec_math.h's EM_SIMD_CLONES).
 *
 * Each gives the bits the generic path gives (widen to f32, compute, round
 * once with ember/half.h), without the f32 buffers in between:
 *  - select16: where/masked_fill into bf16/f16 with every value a tensor of the
 *    output's dtype or a constant. Widening then rounding is the identity on
 *    every 16-bit value except NaN, which the rounding canonicalises (bf16:
 *    quieted, h | 0x40; f16: sign | 0x7e00), so a raw 16-bit select plus that
 *    canonicalisation is the same result, with no arithmetic.
 *  - half_binary: add, sub, mul, div of bf16 (f16) operands (unit stride, or
 *    a constant already widened to float) into a bf16 (f16) output in one
 *    pass: load, op in f32, round to nearest even. The same IEEE operations as the
 *    generic loop (-ffp-contract=off), so no clone changes a result. bf16
 *    runs hand-written loops where the CPU allows (vec_math.h's
 *    em_hand_simd: AVX-512 BF16, AVX-512 BW or AVX2 intrinsics, the same bits).
 *  - store16 / load_f16: the generic loop's unit-stride conversions between
 *    float buffers and bf16/f16, SIMD (f16 branch-free). */
#ifndef EMBER_OPS_EW_HALF_H
#define EMBER_OPS_EW_HALF_H

#include <stdbool.h>
#include <stdint.h>
#include "ember/dtype.h"

/* The rounding of a widened 16-bit value back to its dtype (ember/half.h),
 * which changes only NaNs: em_f32_to_bf16 quiets (h | 0x40), em_f32_to_f16
 * maps every NaN to sign | 0x7e00. */
#define CANON_BF16(v) ((uint16_t)(((v) & 0x7fff) > 0x7f80 ? ((v) | 0x40) : (v)))
#define CANON_F16(v) ((uint16_t)(((v) & 0x7fff) > 0x7c00 ? (((v) & 0x8000) | 0x7e00) : (v)))

/* o[i*os] = canon(c[i*cs] != 0 ? a[i*as] : b[i*bs]) for i < n, strides in
 * elements (0: one value for every i), canon the dtype's NaN rule (f16: true). */
void em_ew_select16(uint16_t *o, int64_t os, const uint8_t *c, int64_t cs, const uint16_t *a, int64_t as,
                    const uint16_t *b, int64_t bs, int64_t n, bool f16);

/* o[i*os] = c[i*cs] != 0 ? a[i*as] : b[i*bs], the raw 32 bits (where and
 * masked_fill into f32 from f32 values or constants: the generic loop copies
 * floats without arithmetic, so the same bits, without widening the mask). */
void em_ew_select32(uint32_t *o, int64_t os, const uint8_t *c, int64_t cs, const uint32_t *a, int64_t as,
                    const uint32_t *b, int64_t bs, int64_t n);

/* Whether half_binary runs binary op code `code` (em_binop). */
bool em_ew_half_binary_has(int code);

/* o[i] = dt(a_i OP b_i) for i < n, dt EM_BF16 or EM_F16: a_i = a[i] widened
 * to float, or ca when a is NULL (likewise b); o unit stride. Returns whether
 * some a_i and b_i were both NaN: x86 returns the NaN of an instruction's
 * first operand, and which operand of a commutative a + b or a * b comes
 * first is the compiler's choice, different in each clone, so the caller
 * recomputes such a piece the generic loop's way (same code, same bits). */
bool em_ew_half_binary(int code, em_dtype dt, uint16_t *o, const uint16_t *a, float ca, const uint16_t *b, float cb,
                       int64_t n);

/* em_ew_half_binary for bf16 with o 64-byte aligned and written with
 * non-temporal stores (whole 32-value steps; the ragged end stored plainly).
 * -1 where there is no AVX-512 loop (the caller keeps its L1 piece), else
 * whether a NaN pair was seen: the caller fences (em_stream_fence) and
 * recomputes the n values the generic way. */
int em_ew_half_binary_nt(int code, uint16_t *o, const uint16_t *a, float ca, const uint16_t *b, float cb, int64_t n,
                         const float *aw, const float *bw);

/* A bf16 row that many rows of an add/sub/mul/div read (a (R, C) + (C)
 * broadcast), widened to f32 once instead of once a row: w[i .. i + 32) for
 * each whole 32-value block at i < n holds x[i], x[i + 2], ..., x[i + 30],
 * then x[i + 1], ..., x[i + 31] (the AVX-512 loops' even/odd split). Passed
 * to em_ew_half_binary_nt as aw (bw) beside a (b) itself, each offset by the
 * same block-aligned position: the same bits, the ragged end and any
 * recomputed step read a (b). False, writing nothing, without the AVX-512 loops. */
bool em_ew_bf16_widen(float *w, const uint16_t *x, int64_t n);

/* d[0..n) = s[0..n) rounded to dt (EM_BF16 or EM_F16): em_f32_to_bf16 /
 * em_f32_to_f16's bits (f16 branch-free, so it vectorises; tests/c/test_ew_half.c
 * sweeps every float). */
void em_ew_store16(uint16_t *d, em_dtype dt, const float *s, int64_t n);

/* d[0..n) = s[0..n) widened from f16: em_f16_to_f32's bits, branch-free
 * (its subnormal loop does not vectorise). */
void em_ew_load_f16(float *d, const uint16_t *s, int64_t n);

#endif
