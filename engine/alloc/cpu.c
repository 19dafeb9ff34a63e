/* CPU allocator: 64-byte aligned (AVX-512 friendly, one cache line). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include "../internal.h"

void *em_cpu_alloc(size_t nbytes) {
  void *p = NULL;
  /* No object can exceed PTRDIFF_MAX (glibc refuses such sizes too); checking
   * first also keeps the round-up below from wrapping to a tiny size. */
  if (nbytes > (size_t)PTRDIFF_MAX - 63) return NULL;
  size_t n = (nbytes + 63) & ~(size_t)63;
  if (n == 0) n = 64;
  if (posix_memalign(&p, 64, n) != 0) return NULL;
  return p;
}

void em_cpu_free(void *p) { free(p); }
