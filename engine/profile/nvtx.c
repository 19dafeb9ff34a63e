/* NVTX ranges for Nsight Systems: user ranges and marks (ember.nvtx), phase
 * ranges (forward / backward / optimizer, on every phase change) and, while
 * ember.nvtx.enable(true), one range per op scope named "op [module.path]".
 *
 * NVTX3 is header-only (the CUDA toolkit's nvtx3/nvToolsExt.h): without a
 * tool attached a range costs a call through a no-op pointer. Builds without
 * CUDA compile the same API to nothing (em_nvtx_available() is false), but
 * user ranges are still recorded by a running profiler.
 *
 * Op range names are built once per (op, module) pair and kept for the
 * process lifetime: a few hundred short strings. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "internal.h"
#include "profiler_internal.h"

#ifdef EMBER_NVTX   /* CUDA builds: NVTX3 is header-only */
#include <nvtx3/nvToolsExt.h>
#define HAVE_NVTX 1
#else
#define HAVE_NVTX 0
#endif

bool em_nvtx_available(void) { return HAVE_NVTX; }

bool em_nvtx_enable(bool on) {
  if (!HAVE_NVTX) return false;
  if (on) __atomic_fetch_or(&em_measure_flags, EM_MEASURE_NVTX, __ATOMIC_RELAXED);
  else __atomic_fetch_and(&em_measure_flags, ~EM_MEASURE_NVTX, __ATOMIC_RELAXED);
  return on;
}

bool em_nvtx_enabled(void) {
  return (__atomic_load_n(&em_measure_flags, __ATOMIC_RELAXED) & EM_MEASURE_NVTX) != 0;
}

void em_nvtx_push(const char *name) {
#if HAVE_NVTX
  nvtxRangePushA(name ? name : "");
#endif
  em_prof_range_push(name);
}

void em_nvtx_pop(void) {
#if HAVE_NVTX
  nvtxRangePop();
#endif
  em_prof_range_pop();
}

void em_nvtx_mark(const char *name) {
#if HAVE_NVTX
  nvtxMarkA(name ? name : "");
#endif
  em_prof_mark(name);
}

void em_nvtx_phase(em_phase prev, em_phase next) {
#if HAVE_NVTX
  if (prev != EM_PHASE_NONE) nvtxRangePop();
  if (next != EM_PHASE_NONE) nvtxRangePushA(em_phase_name(next));
#else
  (void)prev; (void)next;
#endif
}

#if HAVE_NVTX
typedef struct { const char *op, *module, *name; } op_name;
static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;
static op_name *names;
static size_t n_names, cap_names;   /* open addressing, power of two */

static size_t pair_hash(const char *op, const char *module, size_t cap) {
  uint64_t h = ((uintptr_t)op * 0x9E3779B97F4A7C15ull) ^ ((uintptr_t)module * 0xC2B2AE3D27D4EB4Full);
  return (size_t)(h >> 17) & (cap - 1);
}

static int grow_names(void) {
  size_t cap = cap_names ? cap_names * 2 : 256;
  op_name *t = calloc(cap, sizeof *t);
  if (!t) return -1;
  for (size_t i = 0; i < cap_names; i++) {
    if (!names[i].op) continue;
    size_t j = pair_hash(names[i].op, names[i].module, cap);
    while (t[j].op) j = (j + 1) & (cap - 1);
    t[j] = names[i];
  }
  free(names);
  names = t;
  cap_names = cap;
  return 0;
}

/* "matmul [layers.3.attn]" (op and module are interned or static: compared by address). */
static const char *op_range_name(const char *op, const char *module) {
  if (!module || !*module) return op;
  const char *out = op;
  pthread_mutex_lock(&names_lock);
  if ((n_names + 1) * 2 > cap_names && grow_names()) goto done;
  size_t j = pair_hash(op, module, cap_names);
  while (names[j].op && !(names[j].op == op && names[j].module == module)) j = (j + 1) & (cap_names - 1);
  if (names[j].op) { out = names[j].name; goto done; }
  size_t len = strlen(op) + strlen(module) + 4;
  char *s = malloc(len);
  if (!s) goto done;
  snprintf(s, len, "%s [%s]", op, module);
  names[j] = (op_name){op, module, s};
  n_names++;
  out = s;
done:
  pthread_mutex_unlock(&names_lock);
  return out;
}

void em_nvtx_op_push(const char *op) { nvtxRangePushA(op_range_name(op ? op : "op", em_ctx_module())); }
void em_nvtx_op_pop(void) { nvtxRangePop(); }
#else
void em_nvtx_op_push(const char *op) { (void)op; }
void em_nvtx_op_pop(void) {}
#endif
