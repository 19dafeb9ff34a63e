/* Between the pieces of the profiler (not public API):
 *   scope.c     the out-of-line half of EM_OP_SCOPE
 *   profiler.c  the session: records, backends, start/stop
 *   aggregate.c queries over a stopped profile (tables)
 *   trace.c     Chrome trace-event JSON
 *   nvtx.c      NVTX ranges
 *   capture_cost.c  the costs captured op calls declared, for graph replays
 *   kernels/cupti.cu (CUDA builds) or backend/no_cuda.c: the CUPTI side,
 *               through the hooks in backend/backend.h
 * Times are host CLOCK_MONOTONIC nanoseconds; CUPTI timestamps are brought
 * onto that clock by kernels/cupti.cu. */
#ifndef EMBER_PROFILER_INTERNAL_H
#define EMBER_PROFILER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "ember/profiler.h"
#include "backend/backend.h"   /* the op scope; em_prof_gpu and the CUPTI hooks */

#ifdef __cplusplus
extern "C" {
#endif

/* One op scope (host side). */
typedef struct {
  const char *op, *module, *grad_fn;
  int64_t t0, t1, self_ns;
  uint32_t kernels, kernels_incl;   /* launches inside: self / inclusive (CUPTI) */
  float dev_ms;                     /* events backend: inclusive device ms; -1 unknown */
  int32_t ev;                       /* events backend: event pair index; -1 none */
  uint32_t seq;                     /* the scope's number in the session (em_prof_gpu.op_seq) */
  uint16_t tid;
  uint8_t phase, depth, fclass;
  double bytes, flops;              /* declared cost: self (EM_OP_COST in this scope) */
  double bytes_incl, flops_incl;    /* ... nested scopes included */
} em_prof_op;

/* One replayed op call: the cost its op declared at capture and the GPU
 * time of the records it ran in one graph launch. */
typedef struct {
  double bytes, flops;
  int64_t ns;
  uint8_t fclass;
} em_prof_call;

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
  uint32_t n_seq;                   /* op scopes numbered in the session (seq 1..n_seq) */
  int64_t *seq_op;                  /* seq -> index in ops + 1 (0: not recorded); built by aggregate.c */
  int64_t *seq_gpu_ns;              /* seq -> sum of the durations of the GPU records it launched */
  /* graph replays (built by aggregate.c): one call per (capture call id, graph launch) with a cost */
  em_prof_call *graph_calls; size_t n_graph_calls;
  uint32_t *gpu_graph_call;         /* per GPU record: index in graph_calls + 1; 0 none (NULL: no replays) */
};

/* ---- aggregate.c, for profiler.c ---- */
/* Build the seq indexes (at stop; -1 out of memory, the roofline columns then stay empty). */
int em_prof_index(em_profile *p);

/* ---- profiler.c, for scope.c / nvtx.c / context.c ---- */
void em_prof_scope_begin(em_op_scope_t *s);
void em_prof_scope_end(em_op_scope_t *s);
void em_prof_phase_change(em_phase prev, em_phase next);
void em_prof_range_push(const char *name);
void em_prof_range_pop(void);
void em_prof_mark(const char *name);

/* ---- capture_cost.c, for scope.c / profiler.c / aggregate.c (the backend's half: backend.h) ---- */
void em_capcost_scope_begin(em_op_scope_t *s);
void em_capcost_scope_end(em_op_scope_t *s);
/* The innermost scope of this thread's capture (NULL: not capturing): where EM_OP_COST goes outside a session. */
em_op_scope_t *em_capcost_scope(void);
typedef struct { double bytes, flops; uint8_t fclass; } em_capcost;
/* The cost capture call `call` declared; false (zeros) when none is kept. */
bool em_capcost_get(uint32_t call, em_capcost *out);

/* ---- nvtx.c, for scope.c / context.c ---- */
void em_nvtx_op_push(const char *op);
void em_nvtx_op_pop(void);
void em_nvtx_phase(em_phase prev, em_phase next);

#ifdef __cplusplus
}
#endif
#endif
