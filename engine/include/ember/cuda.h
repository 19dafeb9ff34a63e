/* The CUDA runtime side of Ember: devices, streams, events, the caching
 * allocator's statistics, pinned host memory and graph capture. Callable from
 * C in every build: without EMBER_CUDA the functions report "no CUDA". */
#ifndef EMBER_CUDA_H
#define EMBER_CUDA_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- devices ---- */
int em_cuda_set_device(int device);          /* 0 or -1 with error */
int em_cuda_current_device(void);
int em_cuda_synchronize(int device);         /* device < 0: current */
const char *em_cuda_device_name(int device); /* "NVIDIA H100 80GB HBM3" */

/* ---- streams and events (opaque handles around cudaStream_t / cudaEvent_t) ---- */
typedef struct em_stream em_stream;
typedef struct em_event em_event;
em_stream *em_stream_new(int device);        /* a non-blocking stream */
void em_stream_free(em_stream *s);
em_stream *em_stream_current(int device);    /* the stream ops launch on (thread-local; default stream if unset) */
void em_stream_set_current(int device, em_stream *s);   /* NULL restores the default */
int em_stream_synchronize(em_stream *s);
int em_stream_wait_event(em_stream *s, em_event *e);
void *em_stream_handle(em_stream *s);        /* the cudaStream_t */
em_event *em_event_new(bool enable_timing);
void em_event_free(em_event *e);
int em_event_record(em_event *e, em_stream *s);   /* s NULL: current stream */
int em_event_synchronize(em_event *e);
int em_event_query(em_event *e);             /* 1 done, 0 pending, <0 error */
int em_event_elapsed_ms(em_event *start, em_event *end, float *ms);

/* ---- caching allocator statistics (per device, bytes) ---- */
typedef struct {
  int64_t allocated, reserved, peak_allocated, peak_reserved;
  int64_t alloc_count, free_count, cuda_malloc_count, cuda_free_count, oom_count;
} em_cuda_memory_stats;
int em_cuda_memory_stats_get(int device, em_cuda_memory_stats *out);
void em_cuda_reset_peak_memory_stats(int device);
void em_cuda_empty_cache(int device);
/* Called once on OOM before the retry (the Lua binding runs a full GC here). */
void em_cuda_set_oom_callback(void (*fn)(void *ud), void *ud);
/* The caching allocator's segments (memory snapshots): each with its blocks
 * in address order, covering it exactly. device < 0: every device. Sorted by
 * (device, address); free with em_cuda_segments_free. 0, or -1 out of memory. */
typedef struct { uint64_t addr, size; bool allocated; } em_cuda_block_info;
typedef struct {
  int device;
  uint64_t addr, size, stream;                 /* stream: the cudaStream_t as an integer */
  bool small;                                  /* the small pool (2 MiB segments) */
  bool graph_pool;                             /* owned by a CUDA graph's private pool */
  int64_t n_blocks;
  em_cuda_block_info *blocks;
} em_cuda_segment_info;
int em_cuda_memory_segments(int device, em_cuda_segment_info **out, int64_t *n);
void em_cuda_segments_free(em_cuda_segment_info *s, int64_t n);

/* ---- pinned host memory ---- */
em_tensor *em_pin_memory(em_tensor *t);      /* a page-locked CPU copy */
bool em_is_pinned(const em_tensor *t);
/* Copy with non_blocking semantics: async on the current stream when the host
 * side is pinned (then the caller must synchronize before reading). */
int em_copy_nonblocking_(em_tensor *dst, em_tensor *src);

/* ---- graph capture ---- */
typedef struct em_graph em_graph;
/* Capture everything launched on the current stream between begin and end
 * into a replayable graph. Allocations in between come from a private pool
 * owned by the graph (kept alive until em_graph_free). */
int em_graph_begin(int device);
em_graph *em_graph_end(void);                /* NULL + error if capture failed */
int em_graph_replay(em_graph *g);
void em_graph_free(em_graph *g);
/* True while a capture is in progress on this thread. Host syncs (item, cpu,
 * printing, synchronize) must fail loudly then: see em_cuda_check_not_capturing. */
bool em_cuda_capturing(void);
/* Returns 0, or -1 with "OP: cannot run during CUDA graph capture (it would
 * synchronise the host)..." — every host-sync point calls it. */
int em_cuda_check_not_capturing(const char *op);
/* The binding sets a function giving the current Lua call site ("train.lua:42"),
 * used in capture errors and memory history. */
void em_set_callsite_fn(const char *(*fn)(void));
const char *em_callsite(void);

/* ---- matmul precision ---- */
void em_cuda_set_allow_tf32(bool on);        /* ember.backends.tf32(true) */
bool em_cuda_allow_tf32(void);

/* ---- matmul algorithm tuning (engine/matmul_tune.c, kernels/matmul_tune.cu) ----
 * With tuning on, the first gemm of each new key (shape, transposes, dtypes,
 * leading dims, alignments, epilogue, beta) times up to 16 of cuBLASLt's
 * candidate algorithms and up to 24 configurations beyond its list (split-K,
 * cluster and tile variants, kernels/matmul_space.cu) on the current stream (a host sync, once per key) and
 * later calls of that key use the fastest. A key first met while a CUDA graph
 * is being captured is not timed: it keeps the heuristic's choice, in the
 * graph and after. Off by default (a timed choice may change the last bits
 * between processes); EMBER_MATMUL_TUNE=0|1 sets the start value. */
int em_matmul_tune_enabled(const char *op, bool *on);          /* -1 + error on a bad EMBER_MATMUL_TUNE */
int em_matmul_set_tune(const char *op, bool on, bool *prev);   /* ember.backends.matmul_tune(on) */
/* A test hook (ember.core.matmul_tune_force_splitk, tests/gpu/matmul_tune_spec.lua):
 * with k in 2..4, a key tuned from now on takes its first candidate of split-K k
 * that ran, whatever the times (the row's `forced`); 0 (the default) chooses by time. */
int em_matmul_set_tune_force_splitk(const char *op, int64_t k, int *prev);   /* -1 + error unless k is 0, 2, 3 or 4 */
int em_matmul_tune_force_splitk(void);

/* One tuned key: its gemm in row-major terms (C (n x m) = op(A) (n x k) op(B) (k x m),
 * batch of them), the winner's and the heuristic's cuBLASLt configuration
 * (CUBLASLT_ALGO_CONFIG_* ids, as cublasLt.h numbers them) and their times. */
typedef struct {
  int device;
  em_dtype dtype;
  bool tf32, a_trans, b_trans, bias, c_f32;
  double beta;                   /* 0, or 1 for an accumulating gemm (or a bias written into C first) */
  int64_t n, m, k, batch, lda, ldb, ldc;
  bool in_capture;               /* first met during graph capture: the heuristic's kept, untimed */
  int candidates;                /* algorithms timed (the heuristic's first and the extra ones included); 0: none */
  int extra;                     /* of those, configurations beyond cuBLASLt's list (split-K, cluster, tile variants) */
  int skipped;                   /* extra configurations refused by cublasLtMatmulAlgoCheck or at launch (untimed) */
  int chosen;                    /* 0: the heuristic's first won; 1-16: its rank in cuBLASLt's list; 17 + j: extra j */
  bool forced;                   /* chosen by em_matmul_set_tune_force_splitk, not by time */
  int algo, tile, stages, splitk, cluster;            /* the winner */
  int h_algo, h_tile, h_stages, h_splitk, h_cluster;  /* the heuristic's first */
  double time_us, heuristic_time_us;                  /* per call, the best round's mean; < 0: not timed */
  int64_t calls;                 /* calls of the key that ran the choice since (graph replays not counted) */
} em_matmul_tune_entry;

int64_t em_matmul_tune_count(void);                            /* tuned keys so far (all devices) */
int em_matmul_tune_get(int64_t i, em_matmul_tune_entry *out);  /* 0 <= i < count, in tuning order */

#ifdef __cplusplus
}
#endif
#endif
