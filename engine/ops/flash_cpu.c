/* Tiled FlashAttention on the CPU: softmax(q kᵀ · scale [+ causal mask]) v
 * and its gradients without the (Tq, Tk) score matrix. Memory beyond the
 * inputs and outputs is linear in T: the log-sum-exp and, in backward,
 * delta = rowsum(dO ∘ o) (B·H·Tq each), plus a few tiles per thread.
 *
 * Forward, per (batch, head, tile of bq query rows): for each tile of bk
 * keys, S = scale · Q Kᵀ (BLAS), the online softmax (running max m, sum l,
 * the accumulator rescaled by exp(m_old - m_new)), acc += P V (BLAS); then
 * O = acc / l and lse = m + log l. Cost 4·Tq·Tk·D FLOPs (about half with a
 * causal mask: key tiles past a query tile's last visible key are skipped).
 *
 * Backward, FlashAttention-2's formulas with P = exp(S - lse),
 * dS = P ∘ (dO vᵀ - delta): dv = Pᵀ dO, dk = scale dSᵀ q, dq = scale dS k,
 * split like the CUDA kernels into two kinds of task so that every output
 * element has one owner and no sum depends on the thread count:
 *   dq    per (b, h, query tile), walking the key tiles;
 *   dk/dv per (b, kv head, key tile), walking the query tiles of every q
 *         head of its group (grouped-query attention sums there).
 * That recomputes S and dP in both (7 tile products per tile pair instead
 * of 5): the price of determinism without atomics, as on the GPU.
 *
 * Compute type: f32 for f32 operands, f64 for f64 (the op converts bf16 and
 * f16 to f32 first), accumulators included. Threads: `#pragma omp parallel
 * for` over the tasks when the build has OpenMP; one thread computes each
 * task start to end, in a fixed order, so results are bit-identical for any
 * thread count.
 *
 * Tile products are single-threaded BLAS calls: OpenBLAS runs a GEMM of
 * m·n·k <= 65536·4 on the calling thread, and the default tiles keep
 * bq·bk·D at or under that (threading happens one level up, over tasks). */
#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "flash_cpu.h"
#include "ember/ops.h"

static int tile_q_override, tile_k_override;

void em_flash_cpu_set_tiles(int bq, int bk) {
  tile_q_override = bq > 0 ? bq : 0;
  tile_k_override = bk > 0 ? bk : 0;
}

void em_flash_cpu_tiles(int64_t d, int *bq, int *bk) {
  if (tile_q_override && tile_k_override) { *bq = tile_q_override; *bk = tile_k_override; return; }
  /* bq·bk·d <= 262144: OpenBLAS's single-thread bound (see the top) */
  if (d <= 64) { *bq = 64; *bk = 64; }
  else if (d <= 128) { *bq = 32; *bk = 64; }
  else { *bq = 32; *bk = 32; }
}

/* Keys j < key_end(i) are the ones query row i sees. Causal masks are
 * j <= i + offset: offset 0 top-left aligned, Tk - Tq bottom-right. */
static inline int64_t key_offset(const em_flash_cpu_args *a) {
  return a->causal == EM_CAUSAL_BOTTOM_RIGHT ? a->Tk - a->Tq : 0;
}
static inline int64_t key_end(const em_flash_cpu_args *a, int64_t i) {
  return a->causal ? EM_MIN(a->Tk, i + key_offset(a) + 1) : a->Tk;
}
/* The kv head q head h reads (grouped-query attention). */
static inline int64_t kv_head(const em_flash_cpu_args *a, int64_t h) { return h / (a->H / a->Hkv); }

#define REAL float
#define GEMM cblas_sgemm
#define EXP expf
#define LOG logf
#define FN(x) x##_f32
#include "flash_cpu_body.h"
#undef REAL
#undef GEMM
#undef EXP
#undef LOG
#undef FN

#define REAL double
#define GEMM cblas_dgemm
#define EXP exp
#define LOG log
#define FN(x) x##_f64
#include "flash_cpu_body.h"
#undef REAL
#undef GEMM
#undef EXP
#undef LOG
#undef FN

int em_flash_cpu_fwd(const em_flash_cpu_args *a) { return a->f64 ? fwd_f64(a) : fwd_f32(a); }
int em_flash_cpu_bwd(const em_flash_cpu_args *a) { return a->f64 ? bwd_f64(a) : bwd_f32(a); }
