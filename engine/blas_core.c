/* Which kernels OpenBLAS runs, and a better choice when it guessed wrong.
 *
 * A DYNAMIC_ARCH OpenBLAS (Debian's, Ubuntu's) picks its kernels from the
 * CPU's model number when it loads. Versions before 0.3.25 fall back to
 * Prescott (SSE3) kernels for an Intel model they do not know — which is
 * what a virtual machine's generic "Intel(R) Xeon(R) Processor" often is —,
 * and sgemm then runs 3-4x slower than the AVX-512 kernels the CPU can run
 * (measured: Ember's fp32 train step on a 16-core Xeon VM). The choice can
 * only be changed before the library loads, through OPENBLAS_CORETYPE: the
 * `ember` executable re-executes itself with it set (ember_main.c); a Lua
 * interpreter that loads the module gets the advice in ember.blas_info(). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "ember/threads.h"

char *openblas_get_corename(void);   /* OpenBLAS's cblas.h; declared here to keep BLAS out of this file */
char *openblas_get_config(void);

const char *em_blas_corename(void) {
  const char *c = openblas_get_corename();
  return c ? c : "unknown";
}

const char *em_blas_config(void) {
  const char *c = openblas_get_config();
  return c ? c : "";
}

/* Cores older than AVX2: a CPU with AVX2 and FMA that got one of these was misdetected. */
static int pre_avx2_core(const char *name) {
  static const char *old[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge",
                              "Katmai", "Coppermine", "Northwood", "Banias", "Opteron", "Barcelona",
                              "Bobcat", "Bulldozer", "Piledriver", "Steamroller", "Unknown", "unknown", NULL};
  for (int i = 0; old[i]; i++)
    if (strcasecmp(name, old[i]) == 0) return 1;
  return 0;
}

/* EMBER_BLAS_ASSUME_CORE (tests): decide as if OpenBLAS had chosen that core. */
const char *em_blas_better_core(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const char *assume = getenv("EMBER_BLAS_ASSUME_CORE");
  if (!pre_avx2_core(assume && *assume && !getenv("OPENBLAS_CORETYPE") ? assume : em_blas_corename())) return NULL;
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return NULL;
  if (__builtin_cpu_is("intel") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  return "Haswell";
#else
  return NULL;
#endif
}
