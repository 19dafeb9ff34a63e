/* CUDA collectives over NCCL, on one comm stream per process.
 *
 * Every collective: record an event on the current (compute) stream, make the
 * comm stream wait on it, enqueue NCCL there, record a "done" event. The
 * synchronous form makes the current stream wait on "done" at once; a work
 * handle does it in wait(). Neither blocks the host, and both work inside
 * ember.cuda.graph capture (the comm stream forks from and joins the
 * capturing stream).
 *
 * A watchdog thread checks the "done" events: one still pending after the
 * timeout (a rank never arrived, or called something else) prints an error
 * naming the collective and call site and ends the process, because the main
 * thread may be blocked in a device synchronisation that would never return.
 * The communicator is created non-blocking so that its start-up is bounded
 * by the same timeout. */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include "comm_internal.h"
#include "ember/launch.h"

#ifdef EMBER_NCCL   /* CUDA builds that found NCCL (and MPI) */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>

static ncclComm_t nc;
static int nc_device = -1;
static cudaStream_t comm_stream;
static cudaEvent_t ready_ev;

bool em_nccl_compiled(void) { return true; }
bool em_nccl_ready(void) { return nc != NULL; }
int em_nccl_device(void) { return nc_device; }

/* ---- pending collectives: event pool + watchdog ---- */

typedef struct pending {
  cudaEvent_t ev;
  double start;
  int refs;                 /* the watchdog's and the work's */
  bool watched;
  char what[192];
  struct pending *next;     /* active list or free list */
} pending;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pending *active, *free_list;
static pthread_t watchdog;
static bool watchdog_running, watchdog_stop;

static void put(pending *p) {               /* under mu */
  if (--p->refs > 0) return;
  p->next = free_list;
  free_list = p;
}

static void fatal(const char *fmt, const char *what, const char *detail) {
  char msg[512];
  snprintf(msg, sizeof msg, fmt, what, detail);
  fprintf(stderr, "ember.dist: rank %d: %s\n", em_comm_rank_, msg);
  fflush(stderr);
  em_launch_report_failure("timeout", msg);
  _exit(1);
}

static void *watch(void *arg) {
  (void)arg;
  cudaSetDevice(nc_device);
  struct timespec nap = {0, 50 * 1000 * 1000};
  char timeout_s[32];
  snprintf(timeout_s, sizeof timeout_s, "%.0f s", em_comm_timeout_);
  for (;;) {
    nanosleep(&nap, NULL);
    pthread_mutex_lock(&mu);
    if (watchdog_stop) { pthread_mutex_unlock(&mu); return NULL; }
    double now = em_comm_now();
    for (pending **pp = &active; *pp;) {
      pending *p = *pp;
      cudaError_t e = cudaEventQuery(p->ev);
      if (e == cudaSuccess) { *pp = p->next; p->watched = false; put(p); continue; }
      if (e != cudaErrorNotReady) fatal("%s failed on the device: %s", p->what, cudaGetErrorString(e));
      if (now - p->start > em_comm_timeout_)
        fatal("%s timed out after %s: a rank did not reach this collective (it failed, is stuck, or runs a "
              "different collective here; EMBER_DIST_CHECK=1 compares every call across ranks); "
              "EMBER_DIST_TIMEOUT sets the limit", p->what, timeout_s);
      pp = &p->next;
    }
    ncclResult_t st = ncclSuccess;
    if (nc && ncclCommGetAsyncError(nc, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress)
      fatal("NCCL reported an asynchronous error%s: %s", "", ncclGetErrorString(st));
    pthread_mutex_unlock(&mu);
  }
}

static int cuda_fail(cudaError_t e, const char *call, const char *what) {
  return em_error("dist: %s failed: %s (%s)", call, cudaGetErrorString(e), what);
}
#define CUDA_TRY(call, what) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return cuda_fail(e_, #call, what); } while (0)

/* A non-blocking communicator answers ncclInProgress until its last call is
 * through; wait for that (bounded by the timeout). */
static int settle(ncclResult_t r, const char *call, const char *what) {
  double deadline = em_comm_now() + em_comm_timeout_;
  struct timespec nap = {0, 20000};
  while (r == ncclInProgress) {
    if (em_comm_now() > deadline)
      return em_error("dist: %s timed out after %.0f s (%s): the other ranks did not join", call,
                      em_comm_timeout_, what);
    nanosleep(&nap, NULL);
    if (ncclCommGetAsyncError(nc, &r) != ncclSuccess) break;
  }
  if (r != ncclSuccess)
    return em_error("dist: %s failed: %s (%s)%s", call, ncclGetErrorString(r), what,
                    r == ncclSystemError || r == ncclRemoteError ? "; NCCL_DEBUG=WARN says more" : "");
  return 0;
}

int em_nccl_init(int device, int rank, int world, double timeout_s) {
  (void)timeout_s;
  const char *what = "dist.init (NCCL)";
  if (nc) return 0;
  if (em_cuda_set_device(device)) return -1;
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return em_error("dist: ncclGetUniqueId failed: %s", ncclGetErrorString(r));
  }
  if (em_mpi_broadcast_bytes(&id, (int)sizeof id, 0, what)) return -1;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&nc, world, id, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    nc = NULL;
    return em_error("dist: ncclCommInitRankConfig failed: %s (%s)", ncclGetErrorString(r), what);
  }
  if (settle(r, "ncclCommInitRank", what)) { ncclCommAbort(nc); nc = NULL; return -1; }
  nc_device = device;
  CUDA_TRY(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking), what);
  CUDA_TRY(cudaEventCreateWithFlags(&ready_ev, cudaEventDisableTiming), what);
  watchdog_stop = false;
  if (pthread_create(&watchdog, NULL, watch, NULL) == 0) watchdog_running = true;
  return 0;
}

int em_nccl_finalize(void) {
  if (!nc) return 0;
  if (watchdog_running) {
    pthread_mutex_lock(&mu);
    watchdog_stop = true;
    pthread_mutex_unlock(&mu);
    pthread_join(watchdog, NULL);
    watchdog_running = false;
  }
  cudaStreamSynchronize(comm_stream);
  pthread_mutex_lock(&mu);
  while (active) { pending *p = active; active = p->next; p->watched = false; put(p); }
  while (free_list) { pending *p = free_list; free_list = p->next; cudaEventDestroy(p->ev); free(p); }
  pthread_mutex_unlock(&mu);
  ncclCommFinalize(nc);
  ncclResult_t st = ncclInProgress;
  while (ncclCommGetAsyncError(nc, &st) == ncclSuccess && st == ncclInProgress) {}
  ncclCommDestroy(nc);
  nc = NULL;
  cudaStreamDestroy(comm_stream);
  cudaEventDestroy(ready_ev);
  nc_device = -1;
  return 0;
}

int em_nccl_sync_device(void) {
  if (em_cuda_check_not_capturing("dist.barrier")) return -1;
  CUDA_TRY(cudaStreamSynchronize(comm_stream), "barrier");
  return em_cuda_synchronize(nc_device);
}

/* ---- enqueueing ---- */

static ncclDataType_t nccl_type(em_dtype t) {
  switch (t) {
    case EM_F32: return ncclFloat32;
    case EM_F64: return ncclFloat64;
    case EM_BF16: return ncclBfloat16;
    case EM_F16: return ncclFloat16;
    case EM_I32: return ncclInt32;
    case EM_I64: return ncclInt64;
    default: return ncclUint8;
  }
}

static ncclRedOp_t nccl_op(em_reduce_op op) {
  return op == EM_REDUCE_SUM ? ncclSum : op == EM_REDUCE_AVG ? ncclAvg : op == EM_REDUCE_MAX ? ncclMax : ncclMin;
}

static cudaStream_t cur_stream(void) { return (cudaStream_t)em_cuda_cur_stream_handle(nc_device); }

/* Lazily create the communicator (backend "auto": at the first CUDA collective, on every rank). */
static int ensure(const em_tensor *t, const char *what) {
  if (!nc && em_nccl_init(t->device.index, em_comm_rank_, em_comm_world_, em_comm_timeout_)) return -1;
  if (t->device.index != nc_device)
    return em_error("dist: the tensor is on cuda:%d, but this rank's communicator drives cuda:%d "
                    "(one GPU per rank: local rank r uses device r) (%s)", t->device.index, nc_device, what);
  return 0;
}

/* Fork the comm stream from the current stream. */
static int begin(const char *what) {
  CUDA_TRY(cudaEventRecord(ready_ev, cur_stream()), what);
  CUDA_TRY(cudaStreamWaitEvent(comm_stream, ready_ev, 0), what);
  return 0;
}

typedef struct {
  em_work base;
  pending *p;
} nccl_work;

static int nw_wait(em_work *base) {
  nccl_work *w = (nccl_work *)base;
  CUDA_TRY(cudaStreamWaitEvent(cur_stream(), w->p->ev, 0), base->what);
  return 0;
}

static int nw_test(em_work *base) {
  nccl_work *w = (nccl_work *)base;
  if (em_cuda_capturing()) return em_error("dist.Work.is_completed: cannot query during CUDA graph capture (%s)",
                                           base->what);
  cudaError_t e = cudaEventQuery(w->p->ev);
  if (e == cudaSuccess) return 1;
  if (e == cudaErrorNotReady) return 0;
  return cuda_fail(e, "cudaEventQuery", base->what);
}

static void nw_release(em_work *base) {
  nccl_work *w = (nccl_work *)base;
  pthread_mutex_lock(&mu);
  put(w->p);
  pthread_mutex_unlock(&mu);
  free(w);
}

static const em_work_ops nccl_work_ops = {nw_wait, nw_test, nw_release};

/* Join: record "done" on the comm stream, then wait now or hand out a work. */
static int end(ncclResult_t r, const char *call, em_tensor *result, em_tensor *also, em_work **work,
               const char *what) {
  if (settle(r, call, what)) return -1;
  pthread_mutex_lock(&mu);
  pending *p = free_list;
  if (p) free_list = p->next;
  pthread_mutex_unlock(&mu);
  if (!p) {
    p = calloc(1, sizeof *p);
    if (!p) return em_error_oom("dist: out of memory (%s)", what);
    cudaError_t e = cudaEventCreateWithFlags(&p->ev, cudaEventDisableTiming);
    if (e != cudaSuccess) { free(p); return cuda_fail(e, "cudaEventCreate", what); }
  }
  cudaError_t e = cudaEventRecord(p->ev, comm_stream);
  if (e != cudaSuccess) { pthread_mutex_lock(&mu); p->refs = 1; put(p); pthread_mutex_unlock(&mu);
                          return cuda_fail(e, "cudaEventRecord", what); }
  if (result) em_bump_version(result);
  snprintf(p->what, sizeof p->what, "%s", what);
  p->start = em_comm_now();
  bool watch_it = !em_cuda_capturing() && watchdog_running;   /* captured events cannot be queried */
  pthread_mutex_lock(&mu);
  p->refs = (work ? 1 : 0) + (watch_it ? 1 : 0);
  if (watch_it) { p->watched = true; p->next = active; active = p; }
  else if (p->refs == 0) { p->next = free_list; free_list = p; }   /* re-recorded only by this thread, later */
  pthread_mutex_unlock(&mu);
  if (!work) {
    CUDA_TRY(cudaStreamWaitEvent(cur_stream(), p->ev, 0), what);
    return 0;
  }
  nccl_work *w = calloc(1, sizeof *w);
  if (!w) {
    cudaStreamWaitEvent(cur_stream(), p->ev, 0);
    pthread_mutex_lock(&mu); put(p); pthread_mutex_unlock(&mu);
    return em_error_oom("dist: out of memory (%s)", what);
  }
  em_work_setup(&w->base, &nccl_work_ops, what, result, also);
  w->p = p;
  *work = &w->base;
  return 0;
}

int em_nccl_all_reduce(em_tensor *t, em_reduce_op op, em_work **work, const char *what) {
  if (ensure(t, what) || begin(what)) return -1;
  void *d = em_data_ptr(t);
  ncclResult_t r = ncclAllReduce(d, d, (size_t)em_numel(t), nccl_type(t->dtype), nccl_op(op), nc, comm_stream);
  return end(r, "ncclAllReduce", t, NULL, work, what);
}

int em_nccl_broadcast(em_tensor *t, int src, em_work **work, const char *what) {
  if (ensure(t, what) || begin(what)) return -1;
  void *d = em_data_ptr(t);
  size_t bytes = (size_t)em_numel(t) * em_dtype_size(t->dtype);
  ncclResult_t r = ncclBroadcast(d, d, bytes, ncclUint8, src, nc, comm_stream);
  return end(r, "ncclBroadcast", t, NULL, work, what);
}

int em_nccl_all_gather(em_tensor *out, em_tensor *t, em_work **work, const char *what) {
  if (ensure(t, what) || ensure(out, what)) return -1;
  size_t bytes = (size_t)em_numel(t) * em_dtype_size(t->dtype);
  char *dst = em_data_ptr(out), *src = em_data_ptr(t);
  if (src != dst + bytes * (size_t)em_comm_rank_ && src < dst + bytes * (size_t)em_comm_world_ && dst < src + bytes)
    return em_error("dist.all_gather: t overlaps out other than at this rank's slot (%s)", what);
  if (begin(what)) return -1;
  ncclResult_t r = ncclAllGather(src, dst, bytes, ncclUint8, nc, comm_stream);
  return end(r, "ncclAllGather", out, t, work, what);
}

int em_nccl_reduce_scatter(em_tensor *out, em_tensor *t, em_reduce_op op, em_work **work, const char *what) {
  if (ensure(t, what) || ensure(out, what)) return -1;
  size_t n = (size_t)em_numel(out), bytes = n * em_dtype_size(out->dtype);
  char *dst = em_data_ptr(out), *src = em_data_ptr(t);
  em_tensor *send = em_tensor_retain(t);
  bool in_place = dst == src + bytes * (size_t)em_comm_rank_;
  if (!in_place && dst < src + bytes * (size_t)em_comm_world_ && src < dst + bytes) {
    em_tensor_release(send);
    if (!(send = em_clone(t))) return -1;            /* staged on the current stream, before the fork */
  }
  if (begin(what)) { em_tensor_release(send); return -1; }
  ncclResult_t r = ncclReduceScatter(em_data_ptr(send), dst, n, nccl_type(t->dtype), nccl_op(op), nc, comm_stream);
  int rc = end(r, "ncclReduceScatter", out, send, work, what);
  em_tensor_release(send);
  return rc;
}

int em_nccl_send(em_tensor *t, int dst, const char *what) {
  if (ensure(t, what) || begin(what)) return -1;
  size_t bytes = (size_t)em_numel(t) * em_dtype_size(t->dtype);
  ncclResult_t r = ncclSend(em_data_ptr(t), bytes, ncclUint8, dst, nc, comm_stream);
  return end(r, "ncclSend", NULL, NULL, NULL, what);
}

int em_nccl_recv(em_tensor *t, int src, const char *what) {
  if (ensure(t, what) || begin(what)) return -1;
  size_t bytes = (size_t)em_numel(t) * em_dtype_size(t->dtype);
  ncclResult_t r = ncclRecv(em_data_ptr(t), bytes, ncclUint8, src, nc, comm_stream);
  return end(r, "ncclRecv", t, NULL, NULL, what);
}

#else  /* no NCCL in this build */

bool em_nccl_compiled(void) { return false; }
bool em_nccl_ready(void) { return false; }
int em_nccl_device(void) { return -1; }
static int no_nccl(void) {
  return em_error("dist: this build of Ember has no NCCL (CUDA tensors need a CUDA build with NCCL found)");
}
int em_nccl_init(int device, int rank, int world, double timeout_s) {
  (void)device; (void)rank; (void)world; (void)timeout_s; return no_nccl(); }
int em_nccl_finalize(void) { return 0; }
int em_nccl_sync_device(void) { return 0; }
int em_nccl_all_reduce(em_tensor *t, em_reduce_op op, em_work **work, const char *what) {
  (void)t; (void)op; (void)work; (void)what; return no_nccl(); }
int em_nccl_broadcast(em_tensor *t, int src, em_work **work, const char *what) {
  (void)t; (void)src; (void)work; (void)what; return no_nccl(); }
int em_nccl_all_gather(em_tensor *out, em_tensor *t, em_work **work, const char *what) {
  (void)out; (void)t; (void)work; (void)what; return no_nccl(); }
int em_nccl_reduce_scatter(em_tensor *out, em_tensor *t, em_reduce_op op, em_work **work, const char *what) {
  (void)out; (void)t; (void)op; (void)work; (void)what; return no_nccl(); }
int em_nccl_send(em_tensor *t, int dst, const char *what) { (void)t; (void)dst; (void)what; return no_nccl(); }
int em_nccl_recv(em_tensor *t, int src, const char *what) { (void)t; (void)src; (void)what; return no_nccl(); }

#endif
