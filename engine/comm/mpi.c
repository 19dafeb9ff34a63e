/* CPU collectives over MPI (Open MPI), and the job's bootstrap: rank, world
 * size, local rank, the NCCL id broadcast and the order check's exchange.
 *
 * Every call is non-blocking underneath (MPI_I*) and waited for by polling
 * with a deadline, so a rank that never arrives turns into an error naming the
 * collective after EMBER_DIST_TIMEOUT seconds instead of a hang. Errors are
 * returned (MPI_ERRORS_RETURN on our own duplicate of MPI_COMM_WORLD), never
 * an abort. bf16/f16 reduce through user-defined ops that add in f32. */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include "comm_internal.h"
#include "ember/launch.h"

#ifdef EMBER_MPI
#include <dlfcn.h>
#include <mpi.h>

static MPI_Comm comm = MPI_COMM_NULL;
static bool we_initialized, broken;
static MPI_Op half_ops[2][3];          /* [bf16, f16][sum, max, min] */

bool em_mpi_compiled(void) { return true; }

static int mpi_fail(int rc, const char *call, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return em_error("dist: %s failed: %s (%s)", call, msg, what);
}
#define MPI_TRY(call, what) do { int rc_ = (call); if (rc_ != MPI_SUCCESS) return mpi_fail(rc_, #call, what); } while (0)

/* ---- 16-bit floats: reduce in f32, round once ---- */
#define HALF_OP(name, load, store, expr)                                                     \
  static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {                      \
    (void)dt;                                                                                \
    const uint16_t *a = in; uint16_t *b = inout;                                             \
    for (int i = 0; i < *len; i++) { float x = load(a[i]), y = load(b[i]); b[i] = store(expr); } \
  }
HALF_OP(bf16_sum, em_bf16_to_f32, em_f32_to_bf16, x + y)
HALF_OP(bf16_max, em_bf16_to_f32, em_f32_to_bf16, x > y || x != x ? x : y)
HALF_OP(bf16_min, em_bf16_to_f32, em_f32_to_bf16, x < y || x != x ? x : y)
HALF_OP(f16_sum, em_f16_to_f32, em_f32_to_f16, x + y)
HALF_OP(f16_max, em_f16_to_f32, em_f32_to_f16, x > y || x != x ? x : y)
HALF_OP(f16_min, em_f16_to_f32, em_f32_to_f16, x < y || x != x ? x : y)

static MPI_Datatype mpi_type(em_dtype t) {
  switch (t) {
    case EM_F32: return MPI_FLOAT;
    case EM_F64: return MPI_DOUBLE;
    case EM_I32: return MPI_INT32_T;
    case EM_I64: return MPI_INT64_T;
    case EM_BF16: case EM_F16: case EM_U16: return MPI_UINT16_T;
    default: return MPI_UINT8_T;          /* u8, bool */
  }
}

static MPI_Op mpi_op(em_dtype t, em_reduce_op op) {
  int k = op == EM_REDUCE_MAX ? 1 : op == EM_REDUCE_MIN ? 2 : 0;   /* avg: sum, then scale */
  if (t == EM_BF16 || t == EM_F16) return half_ops[t == EM_F16][k];
  if (t == EM_BOOL) return k == 2 ? MPI_MIN : MPI_MAX;              /* sum/max: or; min: and */
  return k == 0 ? MPI_SUM : k == 1 ? MPI_MAX : MPI_MIN;
}

/* Open MPI's plugins need libmpi's symbols global; core.so loaded by a stock
 * lua5.4 brings libmpi in RTLD_LOCAL, so make it global before MPI_Init. */
static void mpi_symbols_global(void) {
  Dl_info info;
  if (dladdr((void *)MPI_Init, &info) && info.dli_fname) dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
}

int em_mpi_init(int *rank, int *world, int *local_rank) {
  int inited = 0, finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return em_error("dist.init: MPI was finalized in this process (destroy() then init() is not "
                                 "possible: MPI starts once per process)");
  MPI_Initialized(&inited);
  if (!inited) {
    mpi_symbols_global();
    int provided;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      return em_error("dist.init: MPI_Init failed (is this process started by mpirun, srun or `ember launch`?)");
    we_initialized = true;
  }
  MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "init");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, rank);
  MPI_Comm_size(comm, world);
  MPI_Comm node;
  MPI_TRY(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node), "init");
  MPI_Comm_rank(node, local_rank);
  MPI_Comm_free(&node);
  if (half_ops[0][0] == 0 || half_ops[0][0] == MPI_OP_NULL) {
    MPI_User_function *fns[2][3] = {{bf16_sum, bf16_max, bf16_min}, {f16_sum, f16_max, f16_min}};
    for (int i = 0; i < 2; i++)
      for (int k = 0; k < 3; k++) MPI_Op_create(fns[i][k], 1, &half_ops[i][k]);
  }
  broken = false;
  return 0;
}

int em_mpi_finalize(void) {
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  comm = MPI_COMM_NULL;
  if (we_initialized && !broken) {
    for (int i = 0; i < 2; i++)
      for (int k = 0; k < 3; k++) MPI_Op_free(&half_ops[i][k]);
    MPI_Finalize();
  }
  return 0;
}

/* Poll a request until done or the deadline: a late rank becomes an error. */
static int wait_req(MPI_Request *r, const char *what) {
  double start = em_comm_now(), deadline = start + em_comm_timeout_;
  struct timespec nap = {0, 20000};
  for (long spin = 0;; spin++) {
    int done = 0;
    int rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) { broken = true; return mpi_fail(rc, "MPI_Test", what); }
    if (done) return 0;
    if (spin > 2000) {                 /* past the fast path: stop burning the core */
      nanosleep(&nap, NULL);
      if ((spin & 63) == 0 && em_comm_now() > deadline) {
        broken = true;
        em_error("dist: timed out after %.0f s waiting for the other ranks in %s: a rank did not reach "
                 "this collective (it failed, is stuck, or runs a different collective here); "
                 "EMBER_DIST_TIMEOUT sets the limit", em_comm_timeout_, what);
        em_launch_report_failure("timeout", em_last_error());
        return -1;
      }
    }
  }
}

static int ready(const char *what) {
  if (comm == MPI_COMM_NULL) return em_error("dist: not initialized (%s)", what);
  if (broken) return em_error("dist: the communicator is unusable after an earlier timeout or error (%s)", what);
  return 0;
}

static int check_count(int64_t n, const char *what) {
  if (n > INT32_MAX) return em_error("dist: %lld elements exceed MPI's count limit of %d (%s)",
                                     (long long)n, INT32_MAX, what);
  return 0;
}

int em_mpi_check(const em_coll_desc *mine, const char *what) {
  if (ready(what)) return -1;
  int world = em_comm_world_;
  em_coll_desc *all = malloc(sizeof *all * (size_t)world);
  if (!all) return em_error_oom("dist: out of memory for the order check (%s)", what);
  MPI_Request r;
  int rc = MPI_Iallgather(mine, sizeof *mine, MPI_BYTE, all, sizeof *mine, MPI_BYTE, comm, &r);
  if (rc != MPI_SUCCESS) { free(all); return mpi_fail(rc, "MPI_Iallgather", what); }
  if (wait_req(&r, what)) { free(all); return -1; }
  for (int i = 1; i < world; i++) {
    const em_coll_desc *a = &all[0], *b = &all[i];
    if (a->kind == b->kind && a->dtype == b->dtype && a->op == b->op && a->peer == b->peer &&
        a->numel == b->numel && a->seq == b->seq)
      continue;
    char da[256], dbuf[256];
    const em_coll_desc *d[2] = {a, b};
    char *out[2] = {da, dbuf};
    for (int k = 0; k < 2; k++)
      snprintf(out[k], 256, "%s(%s, %lld elements%s%s%s) as collective #%llu at %s",
               em_coll_name((em_coll_kind)d[k]->kind), d[k]->dtype >= 0 ? em_dtype_name((em_dtype)d[k]->dtype) : "-",
               (long long)d[k]->numel, d[k]->op >= 0 ? ", op " : "",
               d[k]->op >= 0 ? em_reduce_op_name((em_reduce_op)d[k]->op) : "", d[k]->peer >= 0 ? ", root/peer set" : "",
               (unsigned long long)d[k]->seq, d[k]->site);
    em_error("dist: collective mismatch: rank %d called %s, but rank 0 called %s (order check; "
             "EMBER_DIST_CHECK=0 turns it off)", i, dbuf, da);
    free(all);
    return -1;
  }
  free(all);
  return 0;
}

int em_mpi_broadcast_bytes(void *buf, int n, int root, const char *what) {
  if (ready(what)) return -1;
  MPI_Request r;
  MPI_TRY(MPI_Ibcast(buf, n, MPI_BYTE, root, comm, &r), what);
  return wait_req(&r, what);
}

int em_mpi_barrier(const char *what) {
  if (ready(what)) return -1;
  MPI_Request r;
  MPI_TRY(MPI_Ibarrier(comm, &r), what);
  return wait_req(&r, what);
}

/* ---- work ---- */

typedef struct {
  em_work base;
  MPI_Request req;
  bool avg;                 /* divide by the world size when done */
  em_tensor *copy_from;     /* reduce_scatter staging: copy into keep[0] when done */
} mpi_work;

static void scale(em_tensor *t, double s) {
  void *p = em_data_ptr(t);
  int64_t n = em_numel(t);
  if (t->dtype == EM_F32) { float *f = p; for (int64_t i = 0; i < n; i++) f[i] = (float)(f[i] * s); }
  else if (t->dtype == EM_F64) { double *f = p; for (int64_t i = 0; i < n; i++) f[i] *= s; }
  else for (int64_t i = 0; i < n; i++) em_store_f64(p, t->dtype, i, em_load_f64(p, t->dtype, i) * s);
}

static int finish(mpi_work *w) {
  if (w->avg) scale(w->base.keep[0], 1.0 / em_comm_world_);
  em_bump_version(w->base.keep[0]);
  return 0;
}

static int mw_wait(em_work *base) {
  mpi_work *w = (mpi_work *)base;
  if (wait_req(&w->req, base->what)) return -1;
  return finish(w);
}

static int mw_test(em_work *base) {
  mpi_work *w = (mpi_work *)base;
  int done = 0;
  int rc = MPI_Test(&w->req, &done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) { broken = true; return mpi_fail(rc, "MPI_Test", base->what); }
  if (done) { base->waited = true; return finish(w) ? -1 : 1; }
  return 0;
}

static void mw_release(em_work *base) {
  mpi_work *w = (mpi_work *)base;
  em_tensor_release(w->copy_from);
  free(w);
}

static const em_work_ops mpi_work_ops = {mw_wait, mw_test, mw_release};

/* Wait now (work == NULL) or hand the request out. */
static int complete(MPI_Request req, em_tensor *result, em_tensor *also, bool avg, em_work **work,
                    const char *what) {
  mpi_work *w = calloc(1, sizeof *w);
  if (!w) { MPI_Wait(&req, MPI_STATUS_IGNORE); return em_error_oom("dist: out of memory (%s)", what); }
  em_work_setup(&w->base, &mpi_work_ops, what, result, also);
  w->req = req;
  w->avg = avg;
  if (work) { *work = &w->base; return 0; }
  int rc = em_work_wait(&w->base);
  em_work_free(&w->base);
  return rc;
}

int em_mpi_all_reduce(em_tensor *t, em_reduce_op op, em_work **work, const char *what) {
  if (ready(what) || check_count(em_numel(t), what)) return -1;
  MPI_Request r;
  MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, em_data_ptr(t), (int)em_numel(t), mpi_type(t->dtype),
                         mpi_op(t->dtype, op), comm, &r), what);
  return complete(r, t, NULL, op == EM_REDUCE_AVG, work, what);
}

int em_mpi_broadcast(em_tensor *t, int src, em_work **work, const char *what) {
  if (ready(what) || check_count(em_numel(t) * (int64_t)em_dtype_size(t->dtype), what)) return -1;
  MPI_Request r;
  MPI_TRY(MPI_Ibcast(em_data_ptr(t), (int)(em_numel(t) * (int64_t)em_dtype_size(t->dtype)), MPI_BYTE, src,
                     comm, &r), what);
  return complete(r, t, NULL, false, work, what);
}

int em_mpi_all_gather(em_tensor *out, em_tensor *t, em_work **work, const char *what) {
  int64_t bytes = em_numel(t) * (int64_t)em_dtype_size(t->dtype);
  if (ready(what) || check_count(bytes * em_comm_world_, what)) return -1;
  char *dst = em_data_ptr(out);
  const char *src = em_data_ptr(t);
  /* t already in its slot of out: MPI_IN_PLACE; any other overlap is refused */
  const void *send = src == dst + bytes * em_comm_rank_ ? MPI_IN_PLACE : src;
  if (send != MPI_IN_PLACE && src < dst + bytes * em_comm_world_ && dst < src + bytes)
    return em_error("dist.all_gather: t overlaps out other than at this rank's slot (%s)", what);
  MPI_Request r;
  MPI_TRY(MPI_Iallgather(send, (int)bytes, MPI_BYTE, dst, (int)bytes, MPI_BYTE, comm, &r), what);
  return complete(r, out, t, false, work, what);
}

int em_mpi_reduce_scatter(em_tensor *out, em_tensor *t, em_reduce_op op, em_work **work, const char *what) {
  if (ready(what) || check_count(em_numel(t), what)) return -1;
  int64_t bytes = em_numel(out) * (int64_t)em_dtype_size(out->dtype);
  const char *src = em_data_ptr(t), *dst = em_data_ptr(out);
  em_tensor *send = em_tensor_retain(t);
  if (dst < src + bytes * em_comm_world_ && src < dst + bytes) {   /* out inside t: stage t */
    em_tensor_release(send);
    send = em_clone(t);
    if (!send) return -1;
  }
  MPI_Request r;
  int rc = MPI_Ireduce_scatter_block(em_data_ptr(send), em_data_ptr(out), (int)em_numel(out),
                                     mpi_type(t->dtype), mpi_op(t->dtype, op), comm, &r);
  if (rc != MPI_SUCCESS) { em_tensor_release(send); return mpi_fail(rc, "MPI_Ireduce_scatter_block", what); }
  rc = complete(r, out, send, op == EM_REDUCE_AVG, work, what);
  em_tensor_release(send);
  return rc;
}

int em_mpi_send(em_tensor *t, int dst, const char *what) {
  int64_t bytes = em_numel(t) * (int64_t)em_dtype_size(t->dtype);
  if (ready(what) || check_count(bytes, what)) return -1;
  MPI_Request r;
  MPI_TRY(MPI_Isend(em_data_ptr(t), (int)bytes, MPI_BYTE, dst, 7, comm, &r), what);
  return wait_req(&r, what);
}

int em_mpi_recv(em_tensor *t, int src, const char *what) {
  int64_t bytes = em_numel(t) * (int64_t)em_dtype_size(t->dtype);
  if (ready(what) || check_count(bytes, what)) return -1;
  MPI_Request r;
  MPI_Status st;
  MPI_TRY(MPI_Irecv(em_data_ptr(t), (int)bytes, MPI_BYTE, src, 7, comm, &r), what);
  if (wait_req(&r, what)) return -1;
  (void)st;
  em_bump_version(t);
  return 0;
}

#else  /* no MPI in this build */

bool em_mpi_compiled(void) { return false; }
static int no_mpi(void) { return em_error("dist: this build of Ember has no MPI (install libopenmpi-dev and rebuild)"); }
int em_mpi_init(int *rank, int *world, int *local_rank) { (void)rank; (void)world; (void)local_rank; return no_mpi(); }
int em_mpi_finalize(void) { return 0; }
int em_mpi_check(const em_coll_desc *mine, const char *what) { (void)mine; (void)what; return no_mpi(); }
int em_mpi_broadcast_bytes(void *buf, int n, int root, const char *what) {
  (void)buf; (void)n; (void)root; (void)what; return no_mpi(); }
int em_mpi_barrier(const char *what) { (void)what; return no_mpi(); }
int em_mpi_all_reduce(em_tensor *t, em_reduce_op op, em_work **work, const char *what) {
  (void)t; (void)op; (void)work; (void)what; return no_mpi(); }
int em_mpi_broadcast(em_tensor *t, int src, em_work **work, const char *what) {
  (void)t; (void)src; (void)work; (void)what; return no_mpi(); }
int em_mpi_all_gather(em_tensor *out, em_tensor *t, em_work **work, const char *what) {
  (void)out; (void)t; (void)work; (void)what; return no_mpi(); }
int em_mpi_reduce_scatter(em_tensor *out, em_tensor *t, em_reduce_op op, em_work **work, const char *what) {
  (void)out; (void)t; (void)op; (void)work; (void)what; return no_mpi(); }
int em_mpi_send(em_tensor *t, int dst, const char *what) { (void)t; (void)dst; (void)what; return no_mpi(); }
int em_mpi_recv(em_tensor *t, int src, const char *what) { (void)t; (void)src; (void)what; return no_mpi(); }

#endif
