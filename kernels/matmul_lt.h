/* What kernels/matmul.cu (plans and runs gemms) and kernels/matmul_tune.cu
 * (times candidate algorithms, keeps the table of choices) share: one
 * cublasLtMatmul call but for its algorithm and output. */
#ifndef EMBER_KERNELS_MATMUL_LT_H
#define EMBER_KERNELS_MATMUL_LT_H

#include <atomic>
#include <cublasLt.h>
#include <cuda_runtime.h>
#include "ember/cuda.h"

typedef struct {
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t desc;           /* transposes, compute type, epilogue (bias pointer set) */
  cublasLtMatrixLayout_t la, lb, lc;   /* cuBLASLt's A (our B), B (our A), C = D */
  const void *alpha, *beta;            /* host scalars of the compute's scale type */
  const void *a, *b;                   /* cuBLASLt's A and B */
  void *c;                             /* C = D, updated in place */
  size_t c_bytes;                      /* the span of C from c: what a scratch copy needs */
  void *ws;
  size_t ws_bytes;
  cudaStream_t s;
  int device;
  const char *op;
} lt_call;

/* D = alpha A B + beta C on d (which stands for the call's C and D) with algo. */
static inline cublasStatus_t lt_run(const lt_call *c, void *d, const cublasLtMatmulAlgo_t *algo) {
  return cublasLtMatmul(c->h, c->desc, c->alpha, c->a, c->la, c->b, c->lb, c->beta, d, c->lc, d, c->lc, algo,
                        c->ws, c->ws_bytes, c->s);
}

/* Time each of algos[0, n) on c's operands (a host sync). With read_c (beta
 * != 0) the candidates run on a scratch copy of C, so the call's C is left as
 * it was; otherwise they overwrite C, and the caller runs its choice after.
 * us[i] is the time per call in µs, or a negative value for an algorithm that
 * failed to launch. Returns 0; 1 when there was no memory for the scratch
 * copy (nothing timed, no error set); -1 with the error set on a CUDA failure. */
int lt_time_algos(const lt_call *c, bool read_c, const cublasLtMatmulAlgo_t *algos, int n, float *us);

/* Up to max configurations beyond have[0, nhave) (the heuristic's list, its first
 * choice first) for c's gemm: split-K (a deterministic reduction in the compute
 * type), cluster and tile variants that cublasLtMatmulAlgoCheck accepts within
 * c's workspace (kernels/matmul_space.cu). prefer_splitk > 1 (the test hook):
 * configurations of that split count first, whatever their waves. Returns how
 * many were written to out; *skipped counts the configurations the check
 * refused. Sets no error. */
int lt_extra_algos(const lt_call *c, const cublasLtMatmulAlgo_t *have, int nhave, int prefer_splitk,
                   cublasLtMatmulAlgo_t *out, int max, int *skipped);

/* The CUBLASLT_ALGO_CONFIG_* ids of an algorithm: id, tile, stages, splitk, cluster. */
void lt_algo_config(const cublasLtMatmulAlgo_t *a, int *id, int *tile, int *stages, int *splitk, int *cluster);

/* Append one tuned key to the table em_matmul_tune_get reads; returns the row's call
 * counter (stable for good), which the caller bumps at each call that runs the choice. */
std::atomic<int64_t> *lt_tune_record(const em_matmul_tune_entry *e);

#endif
