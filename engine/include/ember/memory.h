/* Memory history: every storage allocation and free (CPU storages and the
 * CUDA caching allocator's blocks and segments) recorded as it happens, with
 * the measurement context of ember/profile.h (op, module path, phase), a
 * category and the script's call site, then written as snapshots (JSON, or the
 * pickle PyTorch's memory_viz reads). docs/memory.md is the user's guide.
 *
 * Why this shape: it must be cheap enough to leave on for a whole training
 * step of a 2.7B model (tens of thousands of events), so an event is a
 * fixed-size struct appended to a preallocated ring (oldest dropped and
 * counted when max_entries is reached), every string is an interned pointer,
 * and the call site is captured at record time by a provider the Lua binding
 * installs (the engine knows nothing about Lua). While recording is off, each
 * hook in the allocators is one relaxed load of a flag. */
#ifndef EMBER_MEMORY_H
#define EMBER_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  EM_MEM_AUTO = -1,            /* no override: infer from the phase */
  EM_MEM_OTHER = 0,            /* outside any phase (inputs, buffers, user tensors) */
  EM_MEM_PARAMETER,            /* tagged by nn when a parameter is registered or moved */
  EM_MEM_GRADIENT,             /* a leaf's .grad (tagged by autograd when it becomes one) */
  EM_MEM_ACTIVATION,           /* allocated in the forward phase */
  EM_MEM_AUTOGRAD,             /* allocated in backward and not a leaf's .grad */
  EM_MEM_OPTIMIZER_STATE,      /* allocated in the optimizer phase */
  EM_MEM_WORKSPACE,            /* cuBLASLt workspace, attention scratch */
  EM_MEM_COMMUNICATION,        /* collective buffers (override) */
  EM_MEM_CATEGORY_COUNT
} em_mem_category;

typedef enum {
  EM_MEM_ALLOC = 0,            /* a block handed out (CPU storage or caching-allocator block) */
  EM_MEM_FREE,                 /* a block given back */
  EM_MEM_SEGMENT_ALLOC,        /* the caching allocator took a segment from the driver (cudaMalloc) */
  EM_MEM_SEGMENT_FREE,         /* ... and gave one back (cudaFree) */
  EM_MEM_TAG,                  /* a live block changed category (e.g. became a .grad) */
  EM_MEM_ACTION_COUNT
} em_mem_action;

/* One recorded event: 72 bytes. Strings are interned (or literals): stable
 * for the process lifetime, comparable by address. */
typedef struct {
  int64_t time_ns;             /* CLOCK_MONOTONIC */
  uint64_t addr;
  uint64_t size;               /* bytes the allocator set aside (rounded) */
  uint64_t requested;          /* bytes asked for (alloc), else 0 */
  uint64_t stream;             /* the cudaStream_t as an integer; 0: default stream or CPU */
  const char *op;              /* innermost op, NULL outside ops */
  const char *module;          /* module path, "" at the root */
  const char *callsite;        /* "file.lua:42", then caller frames after '\n'; NULL unknown */
  int32_t device;              /* -1 CPU, else the CUDA device */
  uint8_t action;              /* em_mem_action */
  uint8_t category;            /* em_mem_category (for TAG: the new one) */
  uint8_t phase;               /* em_phase */
  uint8_t pad;
} em_mem_event;

/* "other", "parameter", ... ; "alloc", "free", "segment_alloc", "segment_free", "tag" */
const char *em_mem_category_name(em_mem_category c);
int em_mem_category_parse(const char *name);     /* -1 when unknown */
const char *em_mem_action_name(em_mem_action a);

/* ---- recording ---- */
typedef struct {
  int64_t max_entries;         /* ring size limit (events); oldest dropped beyond it */
  int stack_depth;             /* caller frames kept after the call site (0..32) */
  bool cpu;                    /* record CPU storages too */
} em_mem_history_opts;
#define EM_MEM_DEFAULT_MAX_ENTRIES 1000000

/* on: start recording (a fresh history unless already recording; then only
 * the options change). off: stop; the events and live blocks recorded so far
 * stay for snapshots until em_mem_clear_history or the next start. opts NULL:
 * defaults (1M entries, no stack, CPU on). 0, or -1 with an error. */
int em_mem_record_history(bool on, const em_mem_history_opts *opts);
/* Drop the recorded events (and, when not recording, the live-block table). */
void em_mem_clear_history(void);

extern int em_mem_history_flag;  /* nonzero while recording; read through em_mem_history_on */
static inline bool em_mem_history_on(void) {
  return __atomic_load_n(&em_mem_history_flag, __ATOMIC_RELAXED) != 0;
}

/* Record an event (allocators call this behind em_mem_history_on()). device
 * -1 is the CPU; stream is the cudaStream_t (NULL on the CPU). */
void em_mem_record(em_mem_action a, int device, const void *addr, size_t size, size_t requested, const void *stream);
/* A live storage changed category (a .grad, a parameter): recorded as a TAG
 * event and remembered for snapshots. Blocks allocated before recording
 * started are remembered from their first tag. No-op while not recording. */
void em_mem_tag(const em_storage *s, em_mem_category c);
/* Category for allocations on this thread until restored (EM_MEM_AUTO:
 * infer). Returns the previous override. */
em_mem_category em_mem_set_category_override(em_mem_category c);
/* The binding's call-site provider: returns an interned "file:line" string
 * (plus `depth` caller frames, '\n'-separated) or NULL. Called at record time
 * on the recording thread, outside the history lock. */
void em_mem_set_callsite_fn(const char *(*fn)(int depth));

/* ---- reading ---- */
typedef struct {
  bool recording;
  bool stopped;                /* recorded, then stopped: the history is frozen */
  int stack_depth;
  bool cpu;
  int64_t max_entries;
  int64_t entries;             /* events held now */
  int64_t capacity;            /* events the ring has room for without growing */
  int64_t dropped;             /* oldest events overwritten since the start */
  int64_t recorded;            /* events recorded since the start */
  int64_t live_blocks, live_bytes;   /* blocks known to be alive (allocated or tagged while recording) */
} em_mem_history_stats;
void em_mem_history_stats_get(em_mem_history_stats *out);

/* A block alive at copy time, as the history knows it. */
typedef struct {
  em_mem_event alloc;          /* its allocation; for a block allocated before recording, its first tag */
  em_mem_event tag;            /* the latest tag (when has_tag) */
  bool has_alloc, has_tag;
  uint8_t category;            /* current category */
} em_mem_block;

/* A consistent copy of the history, oldest event first, blocks by address. */
typedef struct {
  em_mem_event *events;
  int64_t n_events;
  em_mem_block *blocks;
  int64_t n_blocks;
  em_mem_history_stats stats;
  int64_t time_ns;             /* when the copy was taken */
} em_mem_history;
int em_mem_history_copy(em_mem_history *out);   /* 0, or -1 (out of memory) */
void em_mem_history_free(em_mem_history *h);

/* ---- snapshots (engine/alloc/snapshot_*.c) ---- */
typedef enum { EM_MEM_FORMAT_JSON, EM_MEM_FORMAT_PICKLE } em_mem_format;
/* Write the caching allocator's segments, the live blocks and the whole
 * trace to path (atomically). JSON: Ember's format (docs/memory.md); PICKLE:
 * the dict of torch.cuda.memory._snapshot() that memory_viz reads. */
int em_mem_snapshot_save(const char *path, em_mem_format fmt);

#ifdef __cplusplus
}
#endif
#endif
