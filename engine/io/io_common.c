/* Shared helpers of the file formats (see io_common.h). Reads use pread in a
 * loop rather than stdio so a loader can fill tensor storage directly, with
 * no intermediate buffer and no SIGBUS risk from a file truncated under an
 * mmap while we copy. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "internal.h"
#include "io/io_common.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "engine/io assumes a little-endian host (safetensors and .npy data are written as in memory)"
#endif

int em_io_open_read(const char *path, uint64_t *size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    em_error_code(EM_ERR_IO, "load: cannot open '%s': %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    em_error_code(EM_ERR_IO, "load: cannot open '%s': %s", path, strerror(errno));
    close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    em_error_code(EM_ERR_IO, "load: cannot open '%s': %s", path,
                  S_ISDIR(st.st_mode) ? "Is a directory" : "not a regular file");
    close(fd);
    return -1;
  }
  *size = (uint64_t)st.st_size;
  return fd;
}

int em_io_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path) {
  char *p = buf;
  while (n > 0) {
    size_t chunk = n < ((size_t)1 << 30) ? n : ((size_t)1 << 30);
    ssize_t k = pread(fd, p, chunk, (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return em_error_code(EM_ERR_IO, "load: cannot read '%s': %s", path, strerror(errno));
    if (k == 0)
      return em_error_code(EM_ERR_IO, "load: cannot read '%s': the file ended at byte %llu while reading "
                           "(was it truncated while loading?)", path, (unsigned long long)off);
    p += k;
    off += (uint64_t)k;
    n -= (size_t)k;
  }
  return 0;
}

em_tensor *em_io_host_contiguous(em_tensor *t) {
  bool was = em_set_grad_enabled(false);
  em_tensor *host = em_to(t, t->dtype, em_cpu());
  em_tensor *c = host ? em_contiguous(host) : NULL;
  em_tensor_release(host);
  em_set_grad_enabled(was);
  return c;
}
