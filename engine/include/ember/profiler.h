/* The kernel profiler and NVTX ranges (the measurement issue).
 *
 * A profiling session records, between em_profiler_start and
 * em_profiler_stop:
 *   - every op scope (EM_OP_SCOPE): host enter/exit time, the measurement
 *     context (op, module path, phase, autograd node), and the kernels it
 *     launched (CUPTI backend);
 *   - every GPU activity (kernels, memcpy, memset) with device timestamps
 *     and the context of the op that launched it (CUPTI backend), or, where
 *     CUPTI is unavailable, CUDA-event device time per op;
 *   - phase intervals (forward/backward/optimizer), user ranges and marks.
 * em_profiler_stop returns an em_profile: a frozen copy that the queries
 * below aggregate (tables) or export (Chrome trace-event JSON).
 *
 * Backends: "cupti" (kernel timestamps through the CUPTI Activity API,
 * kernels/cupti.cu), "events" (cudaEventRecord around each op on the current
 * stream), "host" (host timing only: CPU builds, no device). "auto" picks
 * the first that works and says why in the profile's label. */
#ifndef EMBER_PROFILER_H
#define EMBER_PROFILER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "profile.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { EM_PROF_HOST = 0, EM_PROF_EVENTS, EM_PROF_CUPTI } em_prof_backend;

typedef struct {
  const char *backend;   /* "auto" (NULL), "cupti", "events" or "host" */
} em_prof_opts;

typedef struct em_profile em_profile;

/* Start a session. -1 with "profiler.start: ..." when one is running, when
 * the backend is unknown, or when "cupti"/"events" was asked for and cannot
 * work (the reason is in the message). EMBER_PROFILER_BACKEND in the
 * environment overrides "auto". */
int em_profiler_start(const em_prof_opts *opts);
/* Stop the session: synchronise the current device, collect the records.
 * NULL with "profiler.stop: no profile is running ..." when none runs. */
em_profile *em_profiler_stop(void);
bool em_profiler_running(void);
/* Mark a step boundary (counts steps; an instant event in the trace). */
void em_profiler_step(void);
/* Load and subscribe CUPTI now, without a session: graphs captured from then
 * on have their kernels attributed to the capture-time op/module/phase when
 * replays are profiled. 0, or -1 with the reason CUPTI cannot be used. */
int em_profiler_init(void);
/* What "auto" would use now, and why not CUPTI ("" when it would). */
em_prof_backend em_profiler_auto_backend(const char **why);
const char *em_prof_backend_name(em_prof_backend b);
void em_profile_free(em_profile *p);

/* ---- queries ---- */

typedef enum { EM_PROF_GPU = 0, EM_PROF_OPS } em_prof_source;
typedef enum { EM_PROF_BY_NAME = 0, EM_PROF_BY_OP, EM_PROF_BY_MODULE, EM_PROF_BY_PHASE } em_prof_key;

/* FLOP classes of the declared costs (EM_OP_COST): which peak FLOPs are held
 * against. 0 f32 (CUDA cores / CPU), 1 f64, 2 tf32, 3 bf16, 4 f16 (tensor cores). */
#define EM_PROF_FLOP_CLASSES 5
const char *em_prof_flop_class_name(int c);   /* "f32", "f64", "tf32", "bf16", "f16" */

typedef struct {
  em_prof_source source;    /* GPU activity records, or host op records */
  em_prof_key key;          /* GPU: kernel name / op / module; OPS: op / module */
  int phase;                /* -1: every phase; else an em_phase */
  const char *module_glob;  /* fnmatch(3) pattern on the module path; NULL: all */
  int depth;                /* BY_MODULE: keep this many path components (0: all) */
  bool rollup;              /* BY_MODULE: numeric components become "*" ("layers.*") */
  bool kernels_only;        /* GPU: leave memcpy/memset out */
  /* roofline: the device's peaks (0: unknown, that floor is left out) */
  double peak_gbs;                                  /* memory bandwidth, GB/s (= bytes per ns) */
  double peak_tflops[EM_PROF_FLOP_CLASSES];         /* dense FLOP/s by class, in TFLOP/s */
} em_prof_query;

/* One aggregated row. GPU source: durations of kernels/copies. OPS source:
 * host time of op scopes (total = inclusive, self = minus nested ops). The
 * BY_OP key of GPU records is the autograd node during backward (the op
 * whose gradient the kernel computes) and the innermost op otherwise. */
typedef struct {
  const char *key;          /* interned; "" = the root module / no op */
  int64_t calls;
  int64_t total_ns, self_ns, min_ns, max_ns;
  int64_t phase_ns[EM_PHASE_COUNT];     /* GPU: total; OPS: self */
  int64_t phase_calls[EM_PHASE_COUNT];
  int64_t kernels;          /* OPS: kernels launched inside (self); -1 unknown */
  int64_t device_ns;        /* OPS: device time of the op (CUPTI: its kernels; events:
                               inclusive CUDA-event time); -1 unknown */
  /* roofline: the cost ops declared (EM_OP_COST) against the time it took.
   * The time is per op call: CUPTI, the durations of the GPU records the
   * call launched itself; events, its CUDA-event time (cost of nested ops
   * included); host, its self time. A GPU record's share of its op call's
   * cost is its share of the call's GPU time. */
  int64_t roof_ns;          /* the time of the row's calls, as above */
  int64_t cost_ns;          /* the part of roof_ns in op calls that declared a cost */
  double bytes, flops;      /* declared over cost_ns */
  double mem_floor_ns, flop_floor_ns;   /* with peaks: sum over the calls of max(bytes / peak_gbs,
                                           flops / peak_tflops[class]), split by the larger term */
} em_prof_row;

/* Aggregate; *rows is malloc'ed (caller frees), sorted by total_ns descending. */
int em_profile_group(const em_profile *p, const em_prof_query *q, em_prof_row **rows, size_t *n);

typedef struct {
  em_prof_backend backend;
  const char *label;        /* what the times are ("CUPTI activity: ...") */
  const char *reason;       /* why CUPTI is not used; "" when it is */
  int64_t wall_ns;          /* start to stop (after the device synchronised) */
  int64_t gpu_busy_ns;      /* union of GPU activity intervals; -1 without CUPTI */
  int64_t kernel_ns, copy_ns;           /* sums of durations */
  int64_t kernels, memcpys, memsets;
  int64_t phase_kernels[EM_PHASE_COUNT], phase_kernel_ns[EM_PHASE_COUNT];
  int64_t phase_count[EM_PHASE_COUNT];  /* phase intervals entered */
  int64_t phase_wall_ns[EM_PHASE_COUNT];/* host time spent in each phase */
  int64_t ops, top_ops;     /* op scopes; those not nested in another op */
  int64_t top_op_ns;        /* host time inside top-level ops */
  int64_t op_device_ns;     /* events backend: device time of top-level ops; -1 otherwise */
  int64_t steps_marked;     /* em_profiler_step calls */
  int64_t ranges, marks;    /* user ranges and marks recorded */
  int64_t graph_kernels, graph_kernels_attributed;  /* from graph replays; with capture-time context */
  int64_t dropped;          /* CUPTI records lost (buffers full) */
  int64_t before_window;    /* activity launched before start (left out) */
} em_prof_summary;

void em_profile_summary(const em_profile *p, em_prof_summary *out);
/* Write Chrome trace-event JSON (opens in Perfetto / chrome://tracing).
 * Returns the bytes written, or -1 with an error. */
int64_t em_profile_write_chrome_trace(const em_profile *p, const char *path);

/* ---- NVTX (engine/profile/nvtx.c; no-ops in builds without CUDA) ---- */

bool em_nvtx_available(void);            /* built with NVTX3 */
/* Op ranges on every EM_OP_SCOPE ("matmul [layers.3.attn]"); returns whether they are on. */
bool em_nvtx_enable(bool on);
bool em_nvtx_enabled(void);
/* User ranges and marks (also recorded by a running profiler). */
void em_nvtx_push(const char *name);
void em_nvtx_pop(void);
void em_nvtx_mark(const char *name);

#ifdef __cplusplus
}
#endif
#endif
