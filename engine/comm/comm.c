/* The collectives' interface: process-group state, argument checks that name
 * the collective, the collective-order check, counters, and the dispatch of
 * CPU tensors to MPI and CUDA tensors to NCCL (comm_internal.h). */
#define _GNU_SOURCE   /* on_exit: the exit status decides whether MPI is finalized */
#include <stdio.h>
#include <time.h>
#include "comm_internal.h"

int em_comm_rank_ = 0, em_comm_world_ = 1;
double em_comm_timeout_ = 300;
static bool initialized;
static int local_rank;
static enum { BK_AUTO, BK_MPI, BK_NCCL } backend;
static bool check_cpu, check_cuda;
static uint64_t seq;
static em_dist_stats stats;
static void at_exit(int status, void *arg);

static const char *coll_names[EM_NCOLL] = {
  "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "send", "recv"};
static const char *op_names[] = {"sum", "avg", "max", "min"};

const char *em_coll_name(em_coll_kind k) { return k < EM_NCOLL ? coll_names[k] : "?"; }
const char *em_reduce_op_name(em_reduce_op op) { return op <= EM_REDUCE_MIN ? op_names[op] : "?"; }
int em_reduce_op_from_name(const char *name, em_reduce_op *out) {
  for (int i = 0; i < 4; i++)
    if (strcmp(name, op_names[i]) == 0) { *out = (em_reduce_op)i; return 0; }
  return -1;
}

double em_comm_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *em_dist_available(void) {
  if (!em_mpi_compiled()) return "";
  return em_nccl_compiled() ? "mpi nccl" : "mpi";
}

/* ---- settings from the environment ---- */

static double env_timeout(void) {
  const char *s = getenv("EMBER_DIST_TIMEOUT");
  if (!s || !*s) return 300;
  char *end;
  double v = strtod(s, &end);
  if (*end || !(v > 0)) return -1;
  return v;
}

/* 1, 0, or -1 when unset */
static int env_flag(const char *name) {
  const char *s = getenv(name);
  if (!s || !*s) return -1;
  return !(strcmp(s, "0") == 0 || strcmp(s, "off") == 0 || strcmp(s, "false") == 0);
}

int em_dist_init(const em_dist_options *o) {
  if (initialized) return em_error("dist.init: already initialized (rank %d of %d); call destroy() first",
                                   em_comm_rank_, em_comm_world_);
  if (!em_mpi_compiled())
    return em_error("dist.init: this build of Ember has no MPI (install libopenmpi-dev, `make deps`, and rebuild)");
  const char *b = o && o->backend ? o->backend : getenv("EMBER_DIST_BACKEND");
  if (!b || !*b) b = "auto";
  if (strcmp(b, "auto") == 0) backend = BK_AUTO;
  else if (strcmp(b, "mpi") == 0) backend = BK_MPI;
  else if (strcmp(b, "nccl") == 0) backend = BK_NCCL;
  else return em_error("dist.init: expected backend \"auto\", \"mpi\" or \"nccl\", got \"%s\"", b);
  if (backend == BK_NCCL && !em_nccl_compiled())
    return em_error("dist.init: backend \"nccl\" needs a build with CUDA and NCCL (this build: %s)",
                    em_cuda_compiled() ? "CUDA without NCCL" : "no CUDA");
  if (backend == BK_NCCL && em_cuda_device_count() == 0)
    return em_error("dist.init: backend \"nccl\" needs a GPU, and this process sees none");
  double timeout = o && o->timeout_s > 0 ? o->timeout_s : env_timeout();
  if (timeout < 0)
    return em_error("dist.init: EMBER_DIST_TIMEOUT must be a positive number of seconds, got \"%s\"",
                    getenv("EMBER_DIST_TIMEOUT"));
  int check = o ? o->check : -1;
  if (check < 0) check = env_flag("EMBER_DIST_CHECK");
#ifdef EMBER_DEBUG
  const bool debug_build = true;
#else
  const bool debug_build = false;
#endif
  check_cpu = check < 0 ? true : check;
  check_cuda = check < 0 ? debug_build : check;

  int rank, world, lrank;
  if (em_mpi_init(&rank, &world, &lrank)) return -1;
  em_comm_rank_ = rank; em_comm_world_ = world; local_rank = lrank;
  em_comm_timeout_ = timeout;
  seq = 0;
  memset(&stats, 0, sizeof stats);
  /* one GPU per rank: local rank r drives device r mod count */
  int ndev = em_cuda_device_count();
  if (ndev > 0 && em_cuda_set_device(lrank % ndev)) { em_mpi_finalize(); return -1; }
  if (backend == BK_NCCL && em_nccl_init(lrank % ndev, rank, world, timeout)) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", em_last_error());
    em_mpi_finalize();
    return em_error("%s", msg);
  }
  initialized = true;
  static bool exit_hook;
  if (!exit_hook) exit_hook = on_exit(at_exit, NULL) == 0;
  return 0;
}

bool em_dist_is_initialized(void) { return initialized; }
int em_dist_rank(void) { return initialized ? em_comm_rank_ : 0; }
int em_dist_world_size(void) { return initialized ? em_comm_world_ : 1; }
int em_dist_local_rank(void) { return initialized ? local_rank : 0; }
double em_dist_timeout(void) { return em_comm_timeout_; }
const char *em_dist_backend(void) {
  if (!initialized) return "none";
  return backend == BK_AUTO ? "auto" : backend == BK_MPI ? "mpi" : "nccl";
}
void em_dist_check_enabled(bool *cpu, bool *cuda) { *cpu = check_cpu; *cuda = check_cuda; }

/* MPI_Finalize waits for every rank (a fence), so it runs only after a
 * bounded barrier: a rank that cannot finish together with the others errors
 * after the timeout instead of hanging in finalize. */
int em_dist_destroy(void) {
  if (!initialized) return 0;
  if (em_mpi_barrier("dist.destroy (every rank must call it)")) return -1;
  initialized = false;
  int rc = em_nccl_finalize();
  if (em_mpi_finalize()) rc = -1;
  return rc;
}

/* A script that ends without destroy(): finish cleanly when it succeeded. On
 * a failure exit, leave MPI alone: finalizing would wait for ranks that are
 * themselves waiting for this one, and mpirun stops them once we are gone. */
static void at_exit(int status, void *arg) {
  (void)arg;
  if (initialized && status == 0 && em_dist_destroy())
    fprintf(stderr, "ember.dist: rank %d at exit: %s\n", em_comm_rank_, em_last_error());
}

void em_dist_stats_get(em_dist_stats *out) { *out = stats; }
void em_dist_stats_reset(void) { memset(&stats, 0, sizeof stats); }

/* ---- work handles ---- */

void em_work_setup(em_work *w, const em_work_ops *ops, const char *what, em_tensor *a, em_tensor *b) {
  w->ops = ops;
  w->keep[0] = a ? em_tensor_retain(a) : NULL;
  w->keep[1] = b ? em_tensor_retain(b) : NULL;
  w->waited = false;
  snprintf(w->what, sizeof w->what, "%s", what);
}

int em_work_wait(em_work *w) {
  if (!w) return em_error("dist.Work.wait: no work");
  if (w->waited) return 0;
  int rc = w->ops->wait(w);
  w->waited = true;
  return rc;
}

int em_work_is_completed(em_work *w) {
  if (!w) return em_error("dist.Work.is_completed: no work");
  return w->waited ? 1 : w->ops->test(w);
}

void em_work_free(em_work *w) {
  if (!w) return;
  if (!w->waited) {
    /* a dropped handle: finish first, so the tensors it kept can be freed safely */
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", em_last_error());
    if (w->ops->wait(w)) fprintf(stderr, "ember.dist: %s\n", em_last_error());
    em_error("%s", keep);
  }
  em_tensor_release(w->keep[0]);
  em_tensor_release(w->keep[1]);
  w->ops->release(w);
}

/* ---- checks ---- */

static int need_init(const char *fn) {
  if (!initialized) return em_error("dist.%s: call ember.dist.init() first", fn);
  return 0;
}

static int check_tensor(const char *fn, const char *arg, const em_tensor *t, const char *what) {
  char db[32];
  if (!em_is_contiguous(t))
    return em_error("dist.%s: expected %s to be contiguous, got a strided view (call :contiguous()) (%s)",
                    fn, arg, what);
  if (t->device.type == EM_CPU) {
    if (backend == BK_NCCL)
      return em_error("dist.%s: backend \"nccl\" reduces CUDA tensors, got a cpu %s (init with backend=\"auto\" "
                      "or \"mpi\" for CPU tensors) (%s)", fn, arg, what);
  } else {
    if (backend == BK_MPI)
      return em_error("dist.%s: backend \"mpi\" reduces CPU tensors, got %s on %s (init with backend=\"auto\" "
                      "or \"nccl\" for CUDA tensors) (%s)", fn, arg, em_device_str(t->device, db, sizeof db), what);
    if (!em_nccl_compiled())
      return em_error("dist.%s: %s is on %s, but this build has no NCCL (%s)", fn, arg,
                      em_device_str(t->device, db, sizeof db), what);
  }
  return 0;
}

static int check_pair(const char *fn, const em_tensor *out, const em_tensor *t, const char *what) {
  char a[32], b[32];
  if (out->dtype != t->dtype)
    return em_error("dist.%s: expected out to have t's dtype %s, got %s (%s)", fn, em_dtype_name(t->dtype),
                    em_dtype_name(out->dtype), what);
  if (!em_device_eq(out->device, t->device))
    return em_error("dist.%s: expected out on t's device %s, got %s (%s)", fn,
                    em_device_str(t->device, a, sizeof a), em_device_str(out->device, b, sizeof b), what);
  return 0;
}

static int check_reduce_dtype(const char *fn, const em_tensor *t, em_reduce_op op, const char *what) {
  if (op == EM_REDUCE_AVG && !em_dtype_is_float(t->dtype))
    return em_error("dist.%s: op \"avg\" needs a floating-point tensor, got %s (%s)", fn,
                    em_dtype_name(t->dtype), what);
  if (t->device.type != EM_CPU && t->dtype == EM_U16)
    return em_error("dist.%s: NCCL cannot reduce u16 tensors (use i32) (%s)", fn, what);
  if (t->dtype == EM_BOOL && op == EM_REDUCE_SUM && t->device.type != EM_CPU)
    return em_error("dist.%s: op \"sum\" on bool tensors is CPU-only; use \"max\" (logical or) (%s)", fn, what);
  return 0;
}

static int check_peer(const char *fn, const char *arg, int peer, const char *what) {
  if (peer < 0 || peer >= em_comm_world_)
    return em_error("dist.%s: expected %s in [0, %d), got %d (%s)", fn, arg, em_comm_world_, peer, what);
  return 0;
}

/* The order check: every rank's descriptor of this collective must match rank 0's. */
static int order_check(em_coll_kind kind, const em_tensor *t, int op, int peer, const char *site,
                       const char *what) {
  bool on = !t || t->device.type == EM_CPU ? check_cpu : check_cuda;
  if (!on) return 0;
  em_coll_desc d;
  memset(&d, 0, sizeof d);
  d.seq = seq;
  d.kind = kind;
  d.dtype = t ? (int)t->dtype : -1;
  d.op = op;
  d.peer = peer;
  d.numel = t ? em_numel(t) : 0;
  snprintf(d.site, sizeof d.site, "%s", site ? site : "?");
  return em_mpi_check(&d, what);
}

static void describe(char *buf, size_t n, em_coll_kind kind, const char *site) {
  snprintf(buf, n, "%s #%llu at %s, rank %d of %d", coll_names[kind], (unsigned long long)seq,
           site && *site ? site : "?", em_comm_rank_, em_comm_world_);
}

static void count(em_coll_kind kind, const em_tensor *t) {
  stats.calls[kind]++;
  if (t) stats.bytes[kind] += em_numel(t) * (int64_t)em_dtype_size(t->dtype);
  seq++;
}

#define PROLOGUE(kind, fn)                     \
  char what[192];                              \
  if (work) *work = NULL;                      \
  if (need_init(fn)) return -1;                \
  describe(what, sizeof what, kind, site)

int em_all_reduce(em_tensor *t, em_reduce_op op, em_work **work, const char *site) {
  PROLOGUE(EM_COLL_ALL_REDUCE, "all_reduce");
  if (check_tensor("all_reduce", "t", t, what) || check_reduce_dtype("all_reduce", t, op, what)) return -1;
  if (order_check(EM_COLL_ALL_REDUCE, t, op, -1, site, what)) return -1;
  count(EM_COLL_ALL_REDUCE, t);
  if (em_numel(t) == 0) return 0;
  return t->device.type == EM_CPU ? em_mpi_all_reduce(t, op, work, what) : em_nccl_all_reduce(t, op, work, what);
}

int em_broadcast(em_tensor *t, int src, em_work **work, const char *site) {
  PROLOGUE(EM_COLL_BROADCAST, "broadcast");
  if (check_tensor("broadcast", "t", t, what) || check_peer("broadcast", "src", src, what)) return -1;
  if (order_check(EM_COLL_BROADCAST, t, -1, src, site, what)) return -1;
  count(EM_COLL_BROADCAST, t);
  if (em_numel(t) == 0) return 0;
  return t->device.type == EM_CPU ? em_mpi_broadcast(t, src, work, what) : em_nccl_broadcast(t, src, work, what);
}

int em_all_gather(em_tensor *out, em_tensor *t, em_work **work, const char *site) {
  PROLOGUE(EM_COLL_ALL_GATHER, "all_gather");
  if (check_tensor("all_gather", "t", t, what) || check_tensor("all_gather", "out", out, what) ||
      check_pair("all_gather", out, t, what)) return -1;
  if (em_numel(out) != em_numel(t) * em_comm_world_)
    return em_error("dist.all_gather: expected out to have world_size (%d) x %lld = %lld elements, got %lld (%s)",
                    em_comm_world_, (long long)em_numel(t), (long long)(em_numel(t) * em_comm_world_),
                    (long long)em_numel(out), what);
  if (order_check(EM_COLL_ALL_GATHER, t, -1, -1, site, what)) return -1;
  count(EM_COLL_ALL_GATHER, t);
  if (em_numel(t) == 0) return 0;
  return t->device.type == EM_CPU ? em_mpi_all_gather(out, t, work, what) : em_nccl_all_gather(out, t, work, what);
}

int em_reduce_scatter(em_tensor *out, em_tensor *t, em_reduce_op op, em_work **work, const char *site) {
  PROLOGUE(EM_COLL_REDUCE_SCATTER, "reduce_scatter");
  if (check_tensor("reduce_scatter", "t", t, what) || check_tensor("reduce_scatter", "out", out, what) ||
      check_pair("reduce_scatter", out, t, what) || check_reduce_dtype("reduce_scatter", t, op, what)) return -1;
  if (em_numel(t) != em_numel(out) * em_comm_world_)
    return em_error("dist.reduce_scatter: expected t to have world_size (%d) x %lld = %lld elements, got %lld (%s)",
                    em_comm_world_, (long long)em_numel(out), (long long)(em_numel(out) * em_comm_world_),
                    (long long)em_numel(t), what);
  if (order_check(EM_COLL_REDUCE_SCATTER, out, op, -1, site, what)) return -1;
  count(EM_COLL_REDUCE_SCATTER, t);
  if (em_numel(out) == 0) return 0;
  return t->device.type == EM_CPU ? em_mpi_reduce_scatter(out, t, op, work, what)
                                  : em_nccl_reduce_scatter(out, t, op, work, what);
}

int em_barrier(const char *site) {
  em_work **work = NULL;
  PROLOGUE(EM_COLL_BARRIER, "barrier");
  if (order_check(EM_COLL_BARRIER, NULL, -1, -1, site, what)) return -1;
  count(EM_COLL_BARRIER, NULL);
  if (em_nccl_ready() && em_nccl_sync_device()) return -1;
  return em_mpi_barrier(what);
}

/* send/recv pair up two ranks: no order check (the others are not involved). */
int em_send(em_tensor *t, int dst, const char *site) {
  em_work **work = NULL;
  PROLOGUE(EM_COLL_SEND, "send");
  if (check_tensor("send", "t", t, what) || check_peer("send", "dst", dst, what)) return -1;
  if (dst == em_comm_rank_) return em_error("dist.send: cannot send to this rank itself (%s)", what);
  count(EM_COLL_SEND, t);
  return t->device.type == EM_CPU ? em_mpi_send(t, dst, what) : em_nccl_send(t, dst, what);
}

int em_recv(em_tensor *t, int src, const char *site) {
  em_work **work = NULL;
  PROLOGUE(EM_COLL_RECV, "recv");
  if (check_tensor("recv", "t", t, what) || check_peer("recv", "src", src, what)) return -1;
  if (src == em_comm_rank_) return em_error("dist.recv: cannot receive from this rank itself (%s)", what);
  count(EM_COLL_RECV, t);
  return t->device.type == EM_CPU ? em_mpi_recv(t, src, what) : em_nccl_recv(t, src, what);
}
