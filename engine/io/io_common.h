/* Small helpers shared by the file-format readers and writers in engine/io:
 * opening a file for reading with the messages every loader uses, reading
 * exactly n bytes at an offset, and getting a host, contiguous copy of a
 * tensor to write. Not public API. */
#ifndef EMBER_IO_COMMON_H
#define EMBER_IO_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "ember/tensor.h"

/* Open path read-only; it must be a regular file. Returns the fd (and its
 * size in *size), or -1 with "load: cannot open 'path': <strerror>" set. */
int em_io_open_read(const char *path, uint64_t *size);
/* Read exactly n bytes at offset off. 0, or an EM_ERR_IO status with
 * "load: cannot read 'path': ..." set (a short read says the file shrank). */
int em_io_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path);
/* A contiguous CPU tensor with t's values and dtype (t itself, retained, when
 * it already is one); copied without autograd recording. NULL + error. */
em_tensor *em_io_host_contiguous(em_tensor *t);

/* Whether the product of max(dim, 1) fits int64: the strides of a tensor of
 * this shape are representable even when a zero dim makes it empty. */
static inline bool em_io_shape_fits(int ndim, const int64_t *shape) {
  int64_t p = 1;
  for (int i = 0; i < ndim; i++) {
    int64_t d = shape[i] > 1 ? shape[i] : 1;
    if (p > INT64_MAX / d) return false;
    p *= d;
  }
  return true;
}

static inline uint64_t em_io_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static inline void em_io_put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

#endif
