/* Write-to-temporary-then-rename (see atomic_file.h for why).
 *
 * The temporary lives next to the target (same directory, hence the same file
 * system) so rename(2) is atomic. We fsync the file before the rename, or a
 * crash right after it could expose a name pointing at unwritten blocks, and
 * fsync the directory after it so the new name itself is durable. Failures
 * after open always unlink the temporary: a failed save leaves no litter. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "internal.h"
#include "io/atomic_file.h"

static void close_quietly(em_atomic_file *f) {
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
}

static void free_names(em_atomic_file *f) {
  free(f->path);
  free(f->tmp);
  f->path = f->tmp = NULL;
}

int em_atomic_open(em_atomic_file *f, const char *path, const char *op) {
  f->fd = -1;
  f->op = op;
  f->path = strdup(path);
  size_t n = strlen(path) + 32;
  f->tmp = malloc(n);
  if (!f->path || !f->tmp) {
    free_names(f);
    return em_error_oom("out of memory: cannot allocate a file name");
  }
  snprintf(f->tmp, n, "%s.tmp.%ld", path, (long)getpid());
  f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (f->fd < 0) {
    int e = errno;
    em_error_code(EM_ERR_IO, "%s: cannot create '%s' (temporary for '%s'): %s", op, f->tmp, path, strerror(e));
    free_names(f);
    return EM_ERR_IO;
  }
  return 0;
}

void em_atomic_abort(em_atomic_file *f) {
  if (!f->tmp) return;
  close_quietly(f);
  unlink(f->tmp);
  free_names(f);
}

/* Set an I/O error naming the target, remove the temporary, return EM_ERR_IO. */
static int fail_io(em_atomic_file *f, const char *what, int e) {
  em_error_code(EM_ERR_IO, "%s: cannot %s '%s': %s", f->op, what, f->path, strerror(e));
  em_atomic_abort(f);
  return EM_ERR_IO;
}

int em_atomic_write(em_atomic_file *f, const void *buf, size_t n) {
  if (f->fd < 0) return em_error_code(EM_ERR_IO, "%s: write to a closed file", f->op ? f->op : "save");
  const char *p = buf;
  while (n > 0) {
    size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
    ssize_t k = write(f->fd, p, chunk);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return fail_io(f, "write", errno);
    if (k == 0) return fail_io(f, "write", EIO);
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

static void fsync_parent_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!dir) return;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);                                   /* best effort: some file systems refuse */
    close(fd);
  }
  free(dir);
}

int em_atomic_commit(em_atomic_file *f) {
  if (f->fd < 0) return em_error_code(EM_ERR_IO, "%s: commit of a closed file", f->op ? f->op : "save");
  if (fsync(f->fd) != 0 && errno != EINVAL && errno != EROFS) return fail_io(f, "flush", errno);
  int fd = f->fd;
  f->fd = -1;
  if (close(fd) != 0) return fail_io(f, "close", errno);
  if (rename(f->tmp, f->path) != 0) return fail_io(f, "rename the temporary file onto", errno);
  fsync_parent_dir(f->path);
  free_names(f);
  return 0;
}
