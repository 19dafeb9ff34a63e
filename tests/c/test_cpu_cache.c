/* The CPU allocator's cache of big blocks (engine/alloc/cpu.c) under a small
 * EMBER_CPU_CACHE_MB: a free that would pass the cap gives back the blocks
 * freed longest ago, a block of the same class comes back from the cache,
 * and a block bigger than the cap is never kept. (Its own executable: the
 * cap is read at the first big allocation.) Sanitizer builds keep no cache.
 * Small blocks pass through per-thread magazines that go back to the bins
 * when their thread exits. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"
#include "internal.h"

#define MiB ((size_t)1 << 20)

TEST(evicts_the_oldest_past_the_cap) {
  void *a = em_cpu_alloc(2 * MiB), *b = em_cpu_alloc(3 * MiB), *c = em_cpu_alloc(4 * MiB);
  CHECK(a && b && c);
  if (!a || !b || !c) return;
  memset(a, 1, 2 * MiB); memset(b, 2, 3 * MiB); memset(c, 3, 4 * MiB);
  em_cpu_free(a, 2 * MiB);
  em_cpu_free(b, 3 * MiB);
#if defined(__SANITIZE_ADDRESS__)
  em_cpu_free(c, 4 * MiB);
  CHECK(em_cpu_cached_bytes() == 0);
#else
  CHECK(em_cpu_cached_bytes() == 5 * MiB);
  em_cpu_free(c, 4 * MiB);                      /* 9 MiB > 8: a, the oldest, goes */
  CHECK(em_cpu_cached_bytes() == 7 * MiB);
  void *b2 = em_cpu_alloc(3 * MiB);             /* b's class: b itself */
  CHECK(b2 == b);
  CHECK(em_cpu_cached_bytes() == 4 * MiB);
  void *a2 = em_cpu_alloc(2 * MiB);             /* a's class: fresh memory, c stays */
  CHECK(a2 != NULL);
  CHECK(em_cpu_cached_bytes() == 4 * MiB);
  void *big = em_cpu_alloc(16 * MiB);           /* past the cap: never cached */
  CHECK(big != NULL);
  if (big) { memset(big, 4, 16 * MiB); em_cpu_free(big, 16 * MiB); }
  CHECK(em_cpu_cached_bytes() == 4 * MiB);
  em_cpu_free(a2, 2 * MiB);
  em_cpu_free(b2, 3 * MiB);                     /* 9 MiB again: c (older than both) goes */
  CHECK(em_cpu_cached_bytes() == 5 * MiB);
  em_cpu_empty_cache();
  CHECK(em_cpu_cached_bytes() == 0);
#endif
}

/* Small blocks (<= 1 KiB) come back from their 64-byte class, newest first,
 * 64-byte aligned; headers come back zeroed; other classes do not mix. */
TEST(small_blocks_are_reused_by_class) {
  void *a = em_cpu_alloc(100), *b = em_cpu_alloc(100), *c = em_cpu_alloc(1000);
  CHECK(a && b && c);
  if (!a || !b || !c) return;
  CHECK(((uintptr_t)a & 63) == 0 && ((uintptr_t)c & 63) == 0);
  em_cpu_free(a, 100);
  em_cpu_free(b, 100);
  em_cpu_free(c, 1000);
#if !defined(__SANITIZE_ADDRESS__)
  CHECK(em_cpu_alloc(128) == b);                /* 100 and 128 share the 128-byte class: b, the newest */
  CHECK(em_cpu_alloc(65) == a);
  void *d = em_cpu_alloc(64);                   /* the 64-byte class is empty: not a or c */
  CHECK(d != a && d != c);
  em_cpu_free(d, 64);
  void *c2 = em_cpu_alloc(1000);                /* c out, dirtied and back */
  CHECK(c2 == c);
  memset(c2, 0xAB, 1000);
  em_cpu_free(c2, 1000);
  unsigned char *h = em_header_alloc(1000);     /* c again, zeroed as calloc would */
  CHECK((void *)h == c);
  int nonzero = 0;
  for (int i = 0; i < 1000; i++) nonzero += h[i] != 0;
  CHECK(nonzero == 0);
  em_header_free(h, 1000);
  em_cpu_free(a, 128);
  em_cpu_free(b, 128);
  em_cpu_empty_cache();                         /* gives the small bins back too */
  void *e = em_cpu_alloc(128);
  CHECK(e != NULL);
  em_cpu_free(e, 128);
#endif
}

/* 200 blocks of the 960-byte class (no other test uses it), freed in order:
 * the first 128 fill the thread's magazine and go to the bins as one chain,
 * the last 72 stay in the magazine until the thread exits. */
#define EXIT_BLOCKS 200
static void *exit_blocks[EXIT_BLOCKS];
static void *alloc_and_free_then_exit(void *unused) {
  (void)unused;
  for (int i = 0; i < EXIT_BLOCKS; i++) exit_blocks[i] = em_cpu_alloc(900);
  for (int i = 0; i < EXIT_BLOCKS; i++) em_cpu_free(exit_blocks[i], 900);
  return NULL;
}

TEST(a_threads_small_blocks_go_back_when_it_exits) {
  pthread_t th;
  CHECK(pthread_create(&th, NULL, alloc_and_free_then_exit, NULL) == 0);
  pthread_join(th, NULL);
  for (int i = 0; i < EXIT_BLOCKS; i++) CHECK(exit_blocks[i] != NULL);
#if !defined(__SANITIZE_ADDRESS__)
  /* this thread's magazine of the class is empty: it takes the bins' newest
   * chain, the 72 the exiting thread gave back, newest block first */
  void *p = em_cpu_alloc(960);
  CHECK(p == exit_blocks[EXIT_BLOCKS - 1]);
  em_cpu_free(p, 960);
#endif
}

int main(void) {
  setenv("EMBER_CPU_CACHE_MB", "8", 1);        /* before the first big allocation */
  RUN(evicts_the_oldest_past_the_cap);
  RUN(small_blocks_are_reused_by_class);
  RUN(a_threads_small_blocks_go_back_when_it_exits);
  TEST_MAIN_END();
}
