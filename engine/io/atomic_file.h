/* Atomic file replacement for writers (safetensors, .npy, checkpoints): bytes
 * go to PATH.tmp.<pid>; commit fsyncs, closes and renames it over PATH; abort
 * (or any failed write) removes the temporary. A crash therefore leaves either
 * the old file or the new one under PATH, never a torn one. Not public API. */
#ifndef EMBER_ATOMIC_FILE_H
#define EMBER_ATOMIC_FILE_H

#include <stddef.h>

typedef struct {
  int fd;                 /* -1 when not open */
  char *path;             /* the final name */
  char *tmp;              /* PATH.tmp.<pid> */
  const char *op;         /* error prefix: "save" */
} em_atomic_file;

/* Create PATH.tmp.<pid> for writing. 0, or a negative status with the error
 * set ("save: cannot create 'x.tmp.12' (for 'x'): Permission denied"). */
int em_atomic_open(em_atomic_file *f, const char *path, const char *op);
/* Write all n bytes (retries short writes and EINTR). On failure the
 * temporary is removed and f is closed; later calls are no-ops that fail. */
int em_atomic_write(em_atomic_file *f, const void *buf, size_t n);
/* fsync, close, rename over PATH (then fsync the directory, best effort).
 * On failure the temporary is removed. Either way f is closed afterwards. */
int em_atomic_commit(em_atomic_file *f);
/* Close and remove the temporary; safe after a failed call and when closed. */
void em_atomic_abort(em_atomic_file *f);

#endif
