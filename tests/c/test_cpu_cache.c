/* The CPU allocator's cache of big blocks (engine/alloc/cpu.c) under a small
 * EMBER_CPU_CACHE_MB: a free that would pass the cap gives back the blocks
 * freed longest ago, a block of the same class comes back from the cache,
 * and a block bigger than the cap is never kept. (Its own executable: the
 * cap is read at the first big allocation.) Sanitizer builds keep no cache. */
#include <stdint.h>
#include <stdlib.h>
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

int main(void) {
  setenv("EMBER_CPU_CACHE_MB", "8", 1);        /* before the first big allocation */
  RUN(evicts_the_oldest_past_the_cap);
  TEST_MAIN_END();
}
