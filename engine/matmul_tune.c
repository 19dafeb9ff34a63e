/* The matmul tuning switch: whether kernels/matmul.cu times cuBLASLt's
 * candidate algorithms the first time it meets a gemm shape and keeps the
 * fastest (docs/perf.md, "Matmul algorithm tuning"), or takes the
 * heuristic's first choice as always.
 *
 * Off by default: a tuned choice comes from timings, so two processes may
 * pick different algorithms for one shape and round differently in the last
 * bits; with tuning off every run gives the heuristic's bits, which the
 * bitwise specs (graphs vs eager, DDP vs one process) and reproducible
 * training runs rely on. EMBER_MATMUL_TUNE=0|1 gives the starting value,
 * read on first use (a bad value is an error there, as EMBER_FLASH_FWD's);
 * ember.backends.matmul_tune(on) changes it at any time. The switch lives
 * in the engine, not in kernels/, so a CPU-only build parses it the same way. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "ember/cuda.h"

/* -1: EMBER_MATMUL_TUNE not read yet; else 0/1. Atomic: em_gemm_cuda reads it
 * outside its lock, from whichever thread runs a matmul, while Lua may set it. */
static _Atomic int g_tune = -1;

int em_matmul_tune_enabled(const char *op, bool *on) {
  int v = atomic_load(&g_tune);
  if (v < 0) {
    const char *env = getenv("EMBER_MATMUL_TUNE");
    if (!env || !*env || strcmp(env, "0") == 0) v = 0;
    else if (strcmp(env, "1") == 0) v = 1;
    else return em_error("%s: expected EMBER_MATMUL_TUNE to be 0 or 1, got '%s'", op, env);
    int unread = -1;
    if (!atomic_compare_exchange_strong(&g_tune, &unread, v)) v = unread;   /* set meanwhile: keep that */
  }
  *on = v == 1;
  return 0;
}

int em_matmul_set_tune(const char *op, bool on, bool *prev) {
  bool unused;
  if (em_matmul_tune_enabled(op, &unused)) return -1;   /* a bad EMBER_MATMUL_TUNE is still an error here */
  *prev = atomic_exchange(&g_tune, on ? 1 : 0) == 1;
  return 0;
}

/* The test hook's split count: 0 (choose by time) or 2..4. Atomic as g_tune. */
static _Atomic int g_force_splitk = 0;

int em_matmul_set_tune_force_splitk(const char *op, int64_t k, int *prev) {
  if (k != 0 && (k < 2 || k > 4))
    return em_error("%s: expected a split count of 0 (choose by time), 2, 3 or 4, got %lld", op, (long long)k);
  *prev = atomic_exchange(&g_force_splitk, (int)k);
  return 0;
}

int em_matmul_tune_force_splitk(void) { return atomic_load(&g_force_splitk); }
