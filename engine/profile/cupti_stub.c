/* The CUPTI side of the profiler in builds without CUDA (kernels/cupti.cu
 * is the real one): never available, so profiles fall back to host timing. */
#ifndef EMBER_CUDA
#include <stdio.h>
#include "profiler_internal.h"

int em_cupti_init(char *why, size_t cap) {
  snprintf(why, cap, "this build has no CUDA backend");
  return -1;
}

int em_cupti_start(int64_t t_start, char *why, size_t cap) {
  (void)t_start;
  return em_cupti_init(why, cap);
}

int64_t em_cupti_stop(int64_t t_start, int64_t *before) {
  (void)t_start;
  *before = 0;
  return 0;
}
#endif
