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
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "ember/cuda.h"

static int g_tune = -1;   /* -1: EMBER_MATMUL_TUNE not read yet; else 0/1 */

int em_matmul_tune_enabled(const char *op, bool *on) {
  if (g_tune < 0) {
    const char *env = getenv("EMBER_MATMUL_TUNE");
    if (!env || !*env || strcmp(env, "0") == 0) g_tune = 0;
    else if (strcmp(env, "1") == 0) g_tune = 1;
    else return em_error("%s: expected EMBER_MATMUL_TUNE to be 0 or 1, got '%s'", op, env);
  }
  *on = g_tune == 1;
  return 0;
}

int em_matmul_set_tune(const char *op, bool on, bool *prev) {
  if (em_matmul_tune_enabled(op, prev)) return -1;
  g_tune = on ? 1 : 0;
  return 0;
}
