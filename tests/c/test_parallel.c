/* The CPU parallel-for (engine/parallel.h) and the thread count
 * (ember/threads.h): every item of [0, n) is visited exactly once in
 * contiguous ranges at any thread count, a stalled thread's share is taken
 * by the others (work stealing), work below two grains stays on the
 * calling thread in one range, the count refuses bad values, and OpenBLAS
 * stays at one thread (matmul tiles run on the pool). */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include "test.h"
#include "parallel.h"

int openblas_get_num_threads(void);   /* OpenBLAS (the only BLAS Ember builds with) */

typedef struct {
  int *hits;        /* per item */
  int ranges;       /* ranges seen (atomic) */
  int bad;          /* a range out of [0, n) or empty (atomic) */
  int64_t n;
} cover_job;

static void cover(void *ctx, int64_t b, int64_t e) {
  cover_job *j = ctx;
  if (b < 0 || e > j->n || b >= e) __atomic_store_n(&j->bad, 1, __ATOMIC_RELAXED);
  for (int64_t i = b; i < e && i >= 0 && i < j->n; i++) j->hits[i]++;
  __atomic_add_fetch(&j->ranges, 1, __ATOMIC_RELAXED);
}

/* Visit [0, n) with grain g on t threads (em_parallel_for_mem when mem); returns the number of ranges. */
static int visit_with(int64_t n, int64_t g, int t, int mem) {
  CHECK(em_set_num_threads(t) == 0);
  cover_job j = {calloc((size_t)(n > 0 ? n : 1), sizeof(int)), 0, 0, n};
  if (mem) em_parallel_for_mem(n, g, cover, &j);
  else em_parallel_for(n, g, cover, &j);
  int once = 1;
  for (int64_t i = 0; i < n; i++) once = once && j.hits[i] == 1;
  CHECK(once);
  CHECK(!j.bad);
  free(j.hits);
  return j.ranges;
}
static int visit(int64_t n, int64_t g, int t) { return visit_with(n, g, t, 0); }

TEST(covers_every_item_once) {
  int64_t ns[] = {0, 1, 2, 7, 100, 4097, 100000};
  int ts[] = {1, 2, 3, 7};
  for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
    for (size_t b = 0; b < sizeof ts / sizeof ts[0]; b++) {
      int r = visit(ns[a], 1, ts[b]);
      CHECK(r <= 4 * ts[b]);              /* up to four chunks a thread (parallel.c) */
      CHECK(ns[a] == 0 ? r == 0 : r >= 1);
    }
}

/* The memory-bound variant: the same cover, up to 16 chunks a thread (the
 * default of EMBER_CPU_STEAL_MEM, unset in the tests), never below the grain. */
TEST(mem_variant_covers_every_item_once) {
  int64_t ns[] = {0, 1, 2, 7, 100, 4097, 100000};
  int ts[] = {1, 2, 3, 7};
  for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
    for (size_t b = 0; b < sizeof ts / sizeof ts[0]; b++) {
      int r = visit_with(ns[a], 1, ts[b], 1);
      CHECK(r <= 16 * ts[b]);
      CHECK(ns[a] == 0 ? r == 0 : r >= 1);
      if (ns[a] >= 16 * ts[b] && ts[b] > 1) CHECK(r == 16 * ts[b]);   /* finer than em_parallel_for's four */
      CHECK(visit_with(ns[a], 1000, ts[b], 1) <= (ns[a] >= 2000 ? ns[a] / 1000 : 1));
    }
}

typedef struct {
  int64_t n;
  int64_t done;       /* items finished (atomic) */
  int64_t first_e;    /* end of the range that starts at 0 */
  int waited_ok;      /* that range saw every other item finish while it stalled */
} stall_job;

/* The range holding item 0 (the caller's first) stalls until every other item
 * is done: the other threads must finish the caller's remaining chunks too. */
static void stall(void *ctx, int64_t b, int64_t e) {
  stall_job *j = ctx;
  if (b == 0) {
    j->first_e = e;
    for (int i = 0; i < 5000 && __atomic_load_n(&j->done, __ATOMIC_ACQUIRE) < j->n - e; i++) usleep(1000);
    j->waited_ok = __atomic_load_n(&j->done, __ATOMIC_ACQUIRE) == j->n - e;
  }
  __atomic_add_fetch(&j->done, e - b, __ATOMIC_ACQ_REL);
}

TEST(stalled_share_is_stolen) {
  CHECK(em_set_num_threads(3) == 0);
  stall_job j = {1200, 0, 0, 0};
  em_parallel_for(j.n, 1, stall, &j);
  CHECK(j.first_e < j.n / 3);            /* the caller's share was cut into chunks */
  CHECK(j.waited_ok);                    /* and the others ran the rest of it */
  CHECK(j.done == j.n);
  CHECK(em_set_num_threads(1) == 0);
}

TEST(small_work_stays_on_one_range) {
  CHECK(visit(99, 50, 4) == 1);          /* below two grains: no fork */
  CHECK(visit(100, 50, 4) <= 2);         /* two grains: at most two ranges */
  CHECK(visit(1000, 1000, 8) == 1);
  CHECK(em_grain(1) == EM_PAR_MIN_WORK);
  CHECK(em_set_parallel_min_work(10) == EM_PAR_MIN_WORK);
  CHECK(em_grain(1) == 10 && em_grain(3) == 3 && em_grain(20) == 1);
  CHECK(em_set_parallel_min_work(EM_PAR_MIN_WORK) == 10);
  CHECK(em_grain(EM_PAR_MIN_WORK * 4) == 1);
  CHECK(em_red_blocks(EM_RED_BLOCK) == 1 && em_red_blocks(EM_RED_BLOCK + 1) == 2);
}

TEST(thread_count) {
  CHECK(em_default_num_threads() >= 1);
  CHECK(em_set_num_threads(3) == 0);
  CHECK(em_get_num_threads() == 3);
  CHECK(strcmp(em_num_threads_source(), "set_num_threads") == 0);
  CHECK(openblas_get_num_threads() == 1);  /* matmuls run their tiles on the pool */
  CHECK_ERR_CONTAINS(em_set_num_threads(0) != 0, "expected an integer from 1");
  CHECK_ERR_CONTAINS(em_set_num_threads(-4) != 0, "got -4");
  CHECK(em_get_num_threads() == 3);      /* a refused value changes nothing */
  CHECK(em_set_num_threads(1) == 0);
}

int main(void) {
  RUN(covers_every_item_once);
  RUN(mem_variant_covers_every_item_once);
  RUN(stalled_share_is_stolen);
  RUN(small_work_stays_on_one_range);
  RUN(thread_count);
  TEST_MAIN_END();
}
