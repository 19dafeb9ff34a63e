/* The tiled CPU FlashAttention (engine/ops/flash_cpu.c), the CPU half of
 * engine/ops/flash_attention.c: the op validates, converts and allocates;
 * these loops only compute. */
#ifndef EMBER_OPS_FLASH_CPU_H
#define EMBER_OPS_FLASH_CPU_H

#include <stdbool.h>
#include <stdint.h>

/* A (B, H, T, D) operand: its first element and its strides (elements) over
 * B, H and T; the last dim is contiguous. */
typedef struct {
  void *p;
  int64_t sb, sh, st;
} em_flash_mat;

/* Everything one call needs. All operands are f32, or all f64 (f64 = true).
 * q, o, dout, dq: (B, H, Tq, D); k, v, dk, dv: (B, Hkv, Tk, D), H % Hkv == 0,
 * head h reads kv head h / (H / Hkv). lse: (B, H, Tq) contiguous. causal is
 * an em_causal (ember/ops.h); bottom-right alignment needs Tq <= Tk. */
typedef struct {
  em_flash_mat q, k, v, o, dout, dq, dk, dv;
  void *lse;
  int64_t B, H, Hkv, Tq, Tk, D;
  int causal;
  double scale;
  bool f64;
} em_flash_cpu_args;

/* o and lse from q, k, v. 0, or -1 with the error set (out of memory). */
int em_flash_cpu_fwd(const em_flash_cpu_args *a);
/* dq, dk, dv (overwritten) from q, k, v, o, lse and dout. 0 or -1. */
int em_flash_cpu_bwd(const em_flash_cpu_args *a);

#endif
