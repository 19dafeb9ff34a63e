/* Between the pieces of the profiler (not public API):
 *   scope.c     the out-of-line half of EM_OP_SCOPE
 *   profiler.c  the session: records, backends, start/stop
 *   aggregate.c queries over a stopped profile (tables)
 *   trace.c     Chrome trace-event JSON
 *   nvtx.c      NVTX ranges
 *   kernels/cupti.cu (CUDA builds) or cupti_stub.c: the CUPTI side
 * Times are host CLOCK_MONOTONIC nanoseconds; CUPTI timestamps are brought
 * onto that clock by kernels/cupti.cu. */
#ifndef EMBER_PROFILER_INTERNAL_H
#define EMBER_PROFILER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "ember/profiler.h"
#include "op_scope.h"

#ifdef __cplusplus
extern "C" {
#endif

int64_t em_prof_now_ns(void);

/* One op scope (host side). */
typedef struct {
  const char *op, *module, *grad_fn;
  int64_t t0, t1, self_ns;
  uint32_t kernels, kernels_incl;   /* launches inside: self / inclusive (CUPTI) */
  float dev_ms;                     /* events backend: inclusive device ms; -1 unknown */
  int32_t ev;                       /* events backend: event pair index; -1 none */
  uint16_t tid;
  uint8_t phase, depth;
} em_prof_op;

enum { EM_GPU_KERNEL = 0, EM_GPU_MEMCPY, EM_GPU_MEMSET };
enum { EM_GPU_EAGER = 0, EM_GPU_GRAPH, EM_GPU_GRAPH_CAPTURED };

/* One GPU activity with the context of the API call that launched it. */
typedef struct {
  const char *name;                 /* interned: short demangled kernel name, "[memcpy HtoD]", ... */
  const char *op, *module, *grad_fn;
  int64_t t0, t1;
  uint64_t bytes;
  uint32_t device, stream;
  uint8_t kind, phase, graph;
} em_prof_gpu;

enum { EM_RANGE_PHASE = 0, EM_RANGE_USER, EM_RANGE_MARK, EM_RANGE_STEP };

typedef struct {
  const char *name;                 /* interned */
  int64_t t0, t1;                   /* marks: t1 == t0 */
  uint16_t tid;
  uint8_t kind, phase;
} em_prof_range;

struct em_profile {
  em_prof_backend backend;
  char label[512], reason[256];
  int64_t t_start, t_stop;
  em_prof_op *ops; size_t n_ops;
  em_prof_gpu *gpu; size_t n_gpu;
  em_prof_range *ranges; size_t n_ranges;
  int64_t steps, dropped, before_window;
  int n_threads;
};

/* ---- profiler.c, for scope.c / nvtx.c / context.c ---- */
void em_prof_scope_begin(em_op_scope_t *s);
void em_prof_scope_end(em_op_scope_t *s);
void em_prof_phase_change(em_phase prev, em_phase next);
void em_prof_range_push(const char *name);
void em_prof_range_pop(void);
void em_prof_mark(const char *name);
/* The CUPTI side: one kernel launched on this thread (counted into op scopes). */
void em_prof_note_launch(void);
/* The CUPTI side hands over GPU records at stop (any thread; copies *g). */
int em_prof_add_gpu(const em_prof_gpu *g);

/* ---- nvtx.c, for scope.c / context.c ---- */
void em_nvtx_op_push(const char *op);
void em_nvtx_op_pop(void);
void em_nvtx_phase(em_phase prev, em_phase next);

/* ---- the CUPTI side (kernels/cupti.cu; cupti_stub.c without CUDA) ---- */
/* Load libcupti and subscribe (once). 0, or -1 with a reason in why. */
int em_cupti_init(char *why, size_t cap);
/* Begin recording launches and activity. 0, or -1 with a reason. */
int em_cupti_start(int64_t t_start, char *why, size_t cap);
/* Flush (the device must be synchronised) and hand records to em_prof_add_gpu.
 * Returns records dropped by CUPTI; *before counts unattributed activity
 * that ran before t_start (left out). */
int64_t em_cupti_stop(int64_t t_start, int64_t *before);

#ifdef __cplusplus
}
#endif
#endif
