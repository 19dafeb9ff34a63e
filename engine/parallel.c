/* CPU threads: the parallel-for every CPU op uses (engine/parallel.h) and
 * the thread count behind it (ember/threads.h).
 *
 * OpenMP (GCC's libgomp) runs the ranges: its pool is started once and kept,
 * so a parallel op costs a wake-up, not a thread creation. A build without
 * OpenMP compiles the same file into a serial loop. The count is read once
 * at load (EMBER_NUM_THREADS, OMP_NUM_THREADS, else the cores this process
 * may use) and handed to OpenBLAS too, so matmuls and the other ops share one
 * budget instead of each taking every core (CMakeLists.txt accepts OpenBLAS
 * only, so its openblas_set_num_threads is always there). */
#define _GNU_SOURCE   /* sched_getaffinity, CPU_COUNT */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "ember/error.h"
#include "ember/threads.h"
#include "parallel.h"

#define MAX_THREADS 1024

void openblas_set_num_threads(int n);   /* OpenBLAS's cblas.h; declared here to keep BLAS out of this file */

int64_t em_par_min_work = EM_PAR_MIN_WORK;
static int n_threads = 1;
static int n_default = 1;
static const char *source = "cores";

/* ---------------- the parallel-for ---------------- */

void em_parallel_for(int64_t n, int64_t grain, em_range_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t most = n / grain;                  /* ranges of at least `grain` items */
  int nt = most < n_threads ? (int)most : n_threads;
#ifdef _OPENMP
  if (nt > 1 && !omp_in_parallel()) {
#pragma omp parallel num_threads(nt)
    {
      int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
      int64_t q = n / T, r = n % T;          /* the first r ranges get one item more */
      int64_t b = t * q + (t < r ? t : r), e = b + q + (t < r);
      if (b < e) fn(ctx, b, e);
    }
    return;
  }
#endif
  fn(ctx, 0, n);
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
  openblas_set_num_threads(n);
}

/* At load: the default, then the environment's override (a bad
 * EMBER_NUM_THREADS is reported on stderr and ignored: a library must not
 * fail to load). */
__attribute__((constructor)) static void threads_init(void) {
  n_default = compute_default();
  int n = n_default;
  const char *vars[2] = {"EMBER_NUM_THREADS", "OMP_NUM_THREADS"};
  for (int i = 0; i < 2; i++) {
    const char *v = getenv(vars[i]);
    if (!v || !*v) continue;
    int c = parse_count(v);
    if (c) { n = c; source = vars[i]; break; }
    if (i == 1) continue;   /* OMP_NUM_THREADS may be a list ("4,2"): libgomp's to judge */
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

int em_threads_compiled(void) {
#ifdef _OPENMP
  return 1;
#else
  return 0;
#endif
}
