/* What comm.c (the interface: checks, order check, dispatch) shares with its
 * two transports, mpi.c (CPU tensors, bootstrap) and nccl.c (CUDA tensors). */
#ifndef EMBER_COMM_INTERNAL_H
#define EMBER_COMM_INTERNAL_H

#include "internal.h"
#include "ember/comm.h"

/* A pending collective. Each transport embeds this first in its own struct. */
typedef struct em_work_ops {
  int (*wait)(em_work *w);
  int (*test)(em_work *w);            /* 1 done, 0 pending, <0 error */
  void (*release)(em_work *w);        /* free the transport's part (after wait) */
} em_work_ops;

struct em_work {
  const em_work_ops *ops;
  em_tensor *keep[2];                 /* alive until the work is waited for */
  bool waited;
  char what[192];                     /* "all_reduce at train.lua:12" for errors */
};

/* One collective as every rank must call it (the order check compares these). */
typedef struct {
  uint64_t seq;                       /* this rank's collective count */
  int32_t kind, dtype, op, peer;      /* em_coll_kind, em_dtype, em_reduce_op, root/src/dst (-1) */
  int64_t numel;
  char site[112];
} em_coll_desc;

/* ---- comm.c ---- */
double em_comm_now(void);             /* monotonic seconds */
/* Fill w->what and keep the tensors. */
void em_work_setup(em_work *w, const em_work_ops *ops, const char *what, em_tensor *a, em_tensor *b);

/* ---- mpi.c ---- */
int em_mpi_init(int *rank, int *world, int *local_rank);
int em_mpi_finalize(void);
bool em_mpi_compiled(void);
/* The order check: exchange descriptors, error naming the first rank that differs. */
int em_mpi_check(const em_coll_desc *mine, const char *what);
int em_mpi_broadcast_bytes(void *buf, int n, int root, const char *what);
int em_mpi_barrier(const char *what);
int em_mpi_all_reduce(em_tensor *t, em_reduce_op op, em_work **work, const char *what);
int em_mpi_broadcast(em_tensor *t, int src, em_work **work, const char *what);
int em_mpi_all_gather(em_tensor *out, em_tensor *t, em_work **work, const char *what);
int em_mpi_reduce_scatter(em_tensor *out, em_tensor *t, em_reduce_op op, em_work **work, const char *what);
int em_mpi_send(em_tensor *t, int dst, const char *what);
int em_mpi_recv(em_tensor *t, int src, const char *what);

/* ---- nccl.c ---- */
bool em_nccl_compiled(void);
/* Create the communicator for this rank's device (collective over all ranks). */
int em_nccl_init(int device, int rank, int world, double timeout_s);
bool em_nccl_ready(void);
int em_nccl_device(void);
int em_nccl_finalize(void);
int em_nccl_sync_device(void);
int em_nccl_all_reduce(em_tensor *t, em_reduce_op op, em_work **work, const char *what);
int em_nccl_broadcast(em_tensor *t, int src, em_work **work, const char *what);
int em_nccl_all_gather(em_tensor *out, em_tensor *t, em_work **work, const char *what);
int em_nccl_reduce_scatter(em_tensor *out, em_tensor *t, em_reduce_op op, em_work **work, const char *what);
int em_nccl_send(em_tensor *t, int dst, const char *what);
int em_nccl_recv(em_tensor *t, int src, const char *what);

/* Shared state (comm.c). */
extern int em_comm_rank_, em_comm_world_;
extern double em_comm_timeout_;

#endif
