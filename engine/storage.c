/* Refcounted storage. CPU memory comes from the CPU allocator; CUDA memory
 * from the CUDA backend's caching allocator (em_cuda, NULL without CUDA).
 * CPU allocations and frees are reported to memory history here (the
 * caching allocator reports its own); wrapped memory is not an allocation. */
#include <stdio.h>
#include "internal.h"

const em_cuda_backend *em_cuda = NULL;

em_storage *em_storage_new(size_t nbytes, em_device dev) {
  em_storage *s = em_header_alloc(sizeof *s);
  if (!s) { em_error_oom("out of memory: cannot allocate a storage header"); return NULL; }
  s->refcount = 1;
  s->nbytes = nbytes;
  s->device = dev;
  if (dev.type == EM_CPU) {
    s->data = em_cpu_alloc(nbytes);
    if (!s->data) {
      em_header_free(s, sizeof *s);
      em_error_oom("out of memory: cannot allocate %zu bytes on the CPU", nbytes);
      return NULL;
    }
    if (em_mem_history_on()) em_mem_record(EM_MEM_ALLOC, -1, s->data, em_cpu_alloc_size(nbytes), nbytes, NULL);
  } else {
    if (!em_cuda) {
      em_header_free(s, sizeof *s);
      em_error("cuda: this build of Ember has no CUDA backend (rebuild with -DEMBER_CUDA=ON)");
      return NULL;
    }
    s->data = em_cuda->alloc(nbytes, dev.index);
    if (!s->data) { em_header_free(s, sizeof *s); return NULL; }   /* the backend set an out-of-memory error */
  }
  return s;
}

em_storage *em_storage_wrap(void *data, size_t nbytes, em_device dev,
                            void (*deleter)(em_storage *), void *ctx) {
  em_storage *s = em_header_alloc(sizeof *s);
  if (!s) { em_error_oom("out of memory: cannot allocate a storage header"); return NULL; }
  s->refcount = 1; s->data = data; s->nbytes = nbytes; s->device = dev;
  s->deleter = deleter; s->ctx = ctx;
  return s;
}

void em_storage_retain(em_storage *s) { if (s) s->refcount++; }

void em_storage_release(em_storage *s) {
  if (!s || --s->refcount > 0) return;
  if (s->deleter) s->deleter(s);
  else if (s->device.type == EM_CPU) {
    if (em_mem_history_on()) em_mem_record(EM_MEM_FREE, -1, s->data, em_cpu_alloc_size(s->nbytes), 0, NULL);
    em_cpu_free(s->data, s->nbytes);
  }
  else if (em_cuda) em_cuda->free(s->data, s->device.index);
  em_header_free(s, sizeof *s);
}

int em_device_parse(const char *str, em_device *out) {
  if (strcmp(str, "cpu") == 0) { *out = em_cpu(); return 0; }
  if (strncmp(str, "cuda", 4) == 0) {
    out->type = EM_CUDA; out->index = 0;
    if (str[4] == 0) return 0;
    if (str[4] == ':' && str[5] >= '0' && str[5] <= '9') {
      char *end; long v = strtol(str + 5, &end, 10);
      if (*end == 0 && v < 1024) { out->index = (int)v; return 0; }
    }
  }
  return em_error("expected a device \"cpu\", \"cuda\" or \"cuda:N\", got \"%s\"", str);
}

const char *em_device_str(em_device d, char *buf, int n) {
  if (d.type == EM_CPU) snprintf(buf, (size_t)n, "cpu");
  else snprintf(buf, (size_t)n, "cuda:%d", d.index);
  return buf;
}

int em_error_device(const char *op, const em_tensor *t) {
  char b[32];
  return em_error("%s: not implemented for device %s yet", op, em_device_str(t->device, b, sizeof b));
}
