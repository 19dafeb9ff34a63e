/* Collectives between the ranks of one job: all_reduce, broadcast, all_gather,
 * reduce_scatter, barrier, send/recv. CPU tensors go through MPI (Open MPI),
 * CUDA tensors through NCCL on a dedicated comm stream per device. The ranks
 * are the processes of one MPI world (`ember launch` runs mpirun; mpirun/srun
 * work directly); MPI also hands NCCL its unique id.
 *
 * Every collective has a synchronous form (work == NULL) and an async one
 * (work != NULL receives a handle). For CUDA tensors neither blocks the host:
 * the synchronous form and em_work_wait make the current stream wait on the
 * comm stream (a CUDA event). For CPU tensors the synchronous form returns
 * when the data is there, and the async one when em_work_wait does.
 *
 * `site` is the caller's call site ("train.lua:42", may be NULL): errors name
 * it, and the collective-order check compares it across ranks. */
#ifndef EMBER_COMM_H
#define EMBER_COMM_H

#include <stdbool.h>
#include <stdint.h>
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { EM_REDUCE_SUM = 0, EM_REDUCE_AVG, EM_REDUCE_MAX, EM_REDUCE_MIN } em_reduce_op;
int em_reduce_op_from_name(const char *name, em_reduce_op *out);   /* 0, or -1 unknown */
const char *em_reduce_op_name(em_reduce_op op);

typedef struct {
  const char *backend;   /* "auto" (CPU over MPI, CUDA over NCCL), "mpi", "nccl"; NULL: EMBER_DIST_BACKEND or auto */
  double timeout_s;      /* <= 0: EMBER_DIST_TIMEOUT, else 300 */
  int check;             /* collective-order check: 1 on, 0 off, -1 default (EMBER_DIST_CHECK, else on
                            for CPU tensors, and for CUDA tensors only in debug builds) */
} em_dist_options;

/* What this build can do: "mpi", "mpi nccl", or "" (no MPI: no collectives). */
const char *em_dist_available(void);
int em_dist_init(const em_dist_options *opts);
bool em_dist_is_initialized(void);
int em_dist_rank(void);
int em_dist_world_size(void);
int em_dist_local_rank(void);
const char *em_dist_backend(void);
double em_dist_timeout(void);
/* Check settings as they apply: cpu/cuda tensors. */
void em_dist_check_enabled(bool *cpu, bool *cuda);
/* Finish pending work, free the communicators, finalize MPI. Idempotent. */
int em_dist_destroy(void);

typedef struct em_work em_work;

int em_all_reduce(em_tensor *t, em_reduce_op op, em_work **work, const char *site);
int em_broadcast(em_tensor *t, int src, em_work **work, const char *site);
/* out: contiguous, world_size * numel(t) elements of t's dtype and device; rank r's t lands at r*numel(t). */
int em_all_gather(em_tensor *out, em_tensor *t, em_work **work, const char *site);
/* t: world_size * numel(out) elements; rank r receives the reduction of every rank's chunk r. */
int em_reduce_scatter(em_tensor *out, em_tensor *t, em_reduce_op op, em_work **work, const char *site);
/* Every rank reaches this point (with its queued GPU work finished). */
int em_barrier(const char *site);
int em_send(em_tensor *t, int dst, const char *site);
int em_recv(em_tensor *t, int src, const char *site);

/* Wait for the work: CPU, until done; CUDA, the current stream waits on it. */
int em_work_wait(em_work *w);
/* 1 done, 0 pending, <0 error. */
int em_work_is_completed(em_work *w);
/* Frees the handle; unwaited work is waited for first (so its tensors are safe to free). */
void em_work_free(em_work *w);

/* Counters since init or the last reset: calls and payload bytes per collective. */
typedef enum {
  EM_COLL_ALL_REDUCE = 0, EM_COLL_BROADCAST, EM_COLL_ALL_GATHER, EM_COLL_REDUCE_SCATTER,
  EM_COLL_BARRIER, EM_COLL_SEND, EM_COLL_RECV, EM_NCOLL
} em_coll_kind;
const char *em_coll_name(em_coll_kind k);
typedef struct { int64_t calls[EM_NCOLL]; int64_t bytes[EM_NCOLL]; } em_dist_stats;
void em_dist_stats_get(em_dist_stats *out);
void em_dist_stats_reset(void);

#ifdef __cplusplus
}
#endif
#endif
