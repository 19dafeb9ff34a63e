/* CPU threads: the parallel-for every CPU op uses (engine/parallel.h) and
 * the thread count behind it (ember/threads.h).
 *
 * A small pool of our own rather than OpenMP: OpenBLAS (the pthread build
 * Debian and the offline deps ship) keeps its own threads, and libgomp's
 * workers spin for milliseconds after each parallel region by default (the
 * wait policy is read once from the environment at load and cannot be set
 * from code). Spinning OpenMP workers and OpenBLAS's threads then fight for
 * the same cores: on the 2-core VM an add after a matmul took 13 ms instead
 * of 0.8 and the matmul 11-13 ms instead of 4-6. Here a worker spins at most
 * SPIN_NS for its next range (back-to-back ops reuse it warm), then sleeps on
 * its condition variable, so a GEMM finds the cores free.
 *
 * One worker per extra thread, each with its own slot: the caller writes a
 * range into the slot and bumps `seq` (release); the worker runs it and
 * publishes `done` (release); the caller runs range 0 itself and waits for
 * the others. A call made while a parallel-for is running (a nested one, or
 * one from another thread) runs on its caller alone. Workers are started on
 * first need and kept; a forked child starts its own.
 *
 * The count is read once at load (EMBER_NUM_THREADS, OMP_NUM_THREADS, else
 * the cores this process may use). OpenBLAS is kept at one thread: matmuls
 * run their tiles on this pool (engine/ops/matmul.c), so there is one budget
 * and one set of threads, and the tiling (not OpenBLAS's threading) decides
 * what each thread sums (CMakeLists.txt accepts OpenBLAS only, so
 * openblas_set_num_threads is always there). */
#define _GNU_SOURCE   /* sched_getaffinity, CPU_COUNT */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "ember/error.h"
#include "ember/threads.h"
#include "parallel.h"
#include "stream.h"
#include "internal.h"   /* em_env_pick */

#define MAX_THREADS 1024
#define SPIN_NS 50000          /* a worker's wait for its next range before it sleeps */

void openblas_set_num_threads(int n);   /* OpenBLAS's cblas.h; declared here to keep BLAS out of this file */

int64_t em_par_min_work = EM_PAR_MIN_WORK;
static int n_threads = 1;
static int n_default = 1;
static const char *source = "cores";

/* ---------------- the pool ---------------- */

typedef struct {
  _Alignas(64) atomic_uint seq;   /* bumped by the caller for each range handed out */
  atomic_uint done;               /* the seq of the last range finished */
  atomic_int sleeping;
  em_range_fn fn;
  void *ctx;
  int64_t b, e;
  pthread_mutex_t m;
  pthread_cond_t c;
} worker;

static worker *workers[MAX_THREADS];
static int n_workers;            /* started */
static atomic_int busy;          /* a parallel-for is dispatching */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The next seq after `seen`: spin up to SPIN_NS, then sleep until it comes. */
static unsigned next_range(worker *w, unsigned seen) {
  unsigned s;
  int64_t deadline = 0;
  for (int i = 0;; i++) {
    if ((s = atomic_load_explicit(&w->seq, memory_order_acquire)) != seen) return s;
    cpu_relax();
    if ((i & 255) != 255) continue;
    if (!deadline) deadline = now_ns() + SPIN_NS;
    else if (now_ns() > deadline) break;
  }
  pthread_mutex_lock(&w->m);
  atomic_store(&w->sleeping, 1);
  while ((s = atomic_load(&w->seq)) == seen) pthread_cond_wait(&w->c, &w->m);
  atomic_store(&w->sleeping, 0);
  pthread_mutex_unlock(&w->m);
  return s;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  for (unsigned seen = 0;;) {
    seen = next_range(w, seen);
    w->fn(w->ctx, w->b, w->e);
    em_stream_fence();                       /* the range's streamed stores land before it is reported done */
    atomic_store_explicit(&w->done, seen, memory_order_release);
  }
  return NULL;
}

/* Start workers until there are `want`; returns how many there are. Workers
 * block every signal: handlers run on the caller's thread, as before threads. */
static int ensure_workers(int want) {
  if (n_workers >= want) return n_workers;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  while (n_workers < want) {
    worker *w = aligned_alloc(64, sizeof *w);
    if (!w) break;
    memset(w, 0, sizeof *w);
    atomic_init(&w->seq, 0);
    atomic_init(&w->done, 0);
    atomic_init(&w->sleeping, 0);
    pthread_mutex_init(&w->m, NULL);
    pthread_cond_init(&w->c, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, worker_main, w) != 0) {
      pthread_mutex_destroy(&w->m);
      pthread_cond_destroy(&w->c);
      free(w);
      break;
    }
    pthread_detach(th);
    workers[n_workers++] = w;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return n_workers;
}

/* A forked child has none of the parent's workers. */
static void after_fork_child(void) {
  n_workers = 0;
  atomic_store(&busy, 0);
}

static void hand_out(worker *w, em_range_fn fn, void *ctx, int64_t b, int64_t e) {
  w->fn = fn; w->ctx = ctx; w->b = b; w->e = e;
  atomic_fetch_add_explicit(&w->seq, 1, memory_order_seq_cst);
  if (atomic_load(&w->sleeping)) {           /* seq_cst on both sides: a sleeper is either seen here or sees seq */
    pthread_mutex_lock(&w->m);
    pthread_cond_signal(&w->c);
    pthread_mutex_unlock(&w->m);
  }
}

static void wait_done(worker *w) {
  unsigned s = atomic_load_explicit(&w->seq, memory_order_relaxed);
  for (int i = 0; atomic_load_explicit(&w->done, memory_order_acquire) != s; i++) {
    cpu_relax();
    if (i > 4096) sched_yield();             /* a preempted worker: let it run */
  }
}

/* ---------------- the parallel-for ---------------- */

/* Range t of T over [0, n): the first n % T ranges get one item more. */
static void range_of(int64_t n, int64_t t, int64_t T, int64_t *b, int64_t *e) {
  int64_t q = n / T, r = n % T;
  *b = t * q + (t < r ? t : r);
  *e = *b + q + (t < r);
}

/* Work stealing (the default; EMBER_CPU_SCHED=static turns it off): [0, n)
 * is cut into CHUNKS_PER_THREAD chunks a thread, a split that depends on n
 * and the thread count only. Thread t first takes its own chunks in order
 * (the same memory the static split gives it, so caches stay warm between
 * ops), then takes what is left of the others'. A preempted vCPU or a slow
 * core then delays an op by one chunk, not by its whole share. Which thread
 * runs a chunk never changes a result: parallel.h's contract already makes
 * every range split give the same bits. */
#define CHUNKS_PER_THREAD 4
/* em_parallel_for_mem's chunks a thread (EMBER_CPU_STEAL_MEM, read at load):
 * a memory-bound op's thread streams ~5 GB/s when 16 share the memory, so a
 * quarter of its share is ~0.2 ms of a 1 ms op (64 MiB), the time a straggler
 * (a core shared with another process on a loaded host) holds the others
 * back by; a sixteenth is ~0.05 ms. A thread's own chunks are adjacent, so
 * its stream runs on across them unless one is stolen. */
static int mem_chunks = 16;
typedef struct {
  _Alignas(64) atomic_llong next;   /* the owner's next chunk; others take from here too */
  int64_t end;                      /* one past the owner's last chunk */
} chunk_queue;

static struct {
  em_range_fn fn;
  void *ctx;
  int64_t n, chunks;
  int nt;
} steal;
static chunk_queue queues[MAX_THREADS];
static int use_steal = 1;

static void steal_run(void *unused, int64_t t, int64_t unused_e) {
  (void)unused; (void)unused_e;
  for (int k = 0; k < steal.nt; k++) {
    chunk_queue *q = &queues[(t + k) % steal.nt];
    for (;;) {
      int64_t c = atomic_fetch_add_explicit(&q->next, 1, memory_order_relaxed);
      if (c >= q->end) break;
      int64_t b, e;
      range_of(steal.n, c, steal.chunks, &b, &e);
      steal.fn(steal.ctx, b, e);
    }
  }
}

static void parallel_for(int64_t n, int64_t grain, int per_thread, em_range_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t most = n / grain;                  /* ranges of at least `grain` items */
  int nt = most < n_threads ? (int)most : n_threads;
  if (nt <= 1 || atomic_exchange_explicit(&busy, 1, memory_order_acquire)) {
    fn(ctx, 0, n);
    em_stream_fence();
    return;
  }
  int have = ensure_workers(nt - 1);
  if (have < nt - 1) nt = have + 1;
  int64_t b, e;
  if (use_steal && most >= 2 * (int64_t)nt) {
    int64_t chunks = most < (int64_t)nt * per_thread ? most : (int64_t)nt * per_thread;
    steal.fn = fn; steal.ctx = ctx; steal.n = n; steal.chunks = chunks; steal.nt = nt;
    for (int t = 0; t < nt; t++) {           /* thread t owns chunks [t·chunks/nt, (t+1)·chunks/nt) */
      range_of(chunks, t, nt, &b, &e);
      atomic_store_explicit(&queues[t].next, b, memory_order_relaxed);
      queues[t].end = e;
    }
    /* hand_out's seq_cst increment publishes the queues and `steal` to each worker */
    for (int t = 1; t < nt; t++) hand_out(workers[t - 1], steal_run, NULL, t, t + 1);
    steal_run(NULL, 0, 1);
  } else {
    for (int t = 1; t < nt; t++) {
      range_of(n, t, nt, &b, &e);
      hand_out(workers[t - 1], fn, ctx, b, e);
    }
    range_of(n, 0, nt, &b, &e);
    fn(ctx, b, e);
  }
  em_stream_fence();
  for (int t = 1; t < nt; t++) wait_done(workers[t - 1]);
  atomic_store_explicit(&busy, 0, memory_order_release);
}

void em_parallel_for(int64_t n, int64_t grain, em_range_fn fn, void *ctx) {
  parallel_for(n, grain, CHUNKS_PER_THREAD, fn, ctx);
}

void em_parallel_for_mem(int64_t n, int64_t grain, em_range_fn fn, void *ctx) {
  parallel_for(n, grain, mem_chunks, fn, ctx);
}

void em_parallel_for_chunks(int64_t n, int64_t grain, int per_thread, em_range_fn fn, void *ctx) {
  parallel_for(n, grain, per_thread < 1 ? 1 : per_thread > 64 ? 64 : per_thread, fn, ctx);
}

int64_t em_set_parallel_min_work(int64_t n) {
  int64_t old = em_par_min_work;
  em_par_min_work = n < 1 ? 1 : n;
  return old;
}

/* ---------------- the thread count ---------------- */

/* A positive integer (<= MAX_THREADS), else 0. */
static int parse_count(const char *s) {
  if (!s || !*s) return 0;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  while (*end == ' ') end++;
  if (errno || *end || v < 1 || v > MAX_THREADS) return 0;
  return (int)v;
}

/* cgroup v2 CPU quota ("max 100000" or "200000 100000"), rounded up; 0 when none. */
static int cgroup_quota(void) {
  FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
  if (!f) return 0;
  char q[32];
  long period = 0;
  int n = fscanf(f, "%31s %ld", q, &period);
  fclose(f);
  if (n != 2 || period <= 0 || q[0] == 'm') return 0;
  long quota = strtol(q, NULL, 10);
  return quota > 0 ? (int)((quota + period - 1) / period) : 0;
}

static int compute_default(void) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int cores = online > 0 ? (int)online : 1;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) cores = CPU_COUNT(&set);
  int quota = cgroup_quota();
  if (quota > 0 && quota < cores) cores = quota;
  /* ranks of one host on an unbound machine (`ember launch` passes --bind-to
   * none) share its cores; a bound rank's mask is already its share */
  if (online > 0 && cores == online) {
    int local = parse_count(getenv("OMPI_COMM_WORLD_LOCAL_SIZE"));
    if (!local) local = parse_count(getenv("MPI_LOCALNRANKS"));
    if (local > 1) cores = cores / local > 0 ? cores / local : 1;
  }
  return cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : cores;
}

static void apply(int n) {
  n_threads = n;
  openblas_set_num_threads(1);
}

/* At load: the default, then the environment's override (a bad
 * EMBER_NUM_THREADS is reported on stderr and ignored: a library must not
 * fail to load). */
__attribute__((constructor)) static void threads_init(void) {
  pthread_atfork(NULL, NULL, after_fork_child);
  if (em_env_pick("EMBER_CPU_SCHED", (const char *const[]){"steal", "static"}, 2) == 1) use_steal = 0;
  const char *mc = getenv("EMBER_CPU_STEAL_MEM");
  if (mc && *mc) {
    int c = parse_count(mc);
    if (c && c <= 64) mem_chunks = c;
    else fprintf(stderr, "ember: EMBER_CPU_STEAL_MEM must be an integer from 1 to 64, got '%s'; using %d\n", mc,
                 mem_chunks);
  }
  n_default = compute_default();
  int n = n_default;
  const char *vars[2] = {"EMBER_NUM_THREADS", "OMP_NUM_THREADS"};
  for (int i = 0; i < 2; i++) {
    const char *v = getenv(vars[i]);
    if (!v || !*v) continue;
    int c = parse_count(v);
    if (c) { n = c; source = vars[i]; break; }
    if (i == 1) continue;   /* OMP_NUM_THREADS may be a list ("4,2"): not ours to judge */
    fprintf(stderr, "ember: EMBER_NUM_THREADS must be an integer from 1 to %d, got '%s'; using %d threads\n",
            MAX_THREADS, v, n_default);
    break;                  /* not overridden by OMP_NUM_THREADS */
  }
  apply(n);
}

int em_set_num_threads(int n) {
  if (n < 1 || n > MAX_THREADS)
    return em_error("set_num_threads: expected an integer from 1 to %d, got %d", MAX_THREADS, n);
  source = "set_num_threads";
  apply(n);
  return 0;
}

int em_get_num_threads(void) { return n_threads; }
int em_default_num_threads(void) { return n_default; }
const char *em_num_threads_source(void) { return source; }
