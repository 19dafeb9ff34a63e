/* Storage and tensor lifetimes: refcounts of tensors and storages, views that
 * keep their storage alive after the base is gone, frees observed exactly once
 * through em_storage_wrap with a counting deleter, em_detach aliasing, the
 * version counter (bumped by copy_/fill_/in-place ops, shared by views), and
 * the CPU allocator (64-byte alignment, zero-size, out-of-memory reported as
 * EM_ERR_OOM with an "out of memory" message, no crash). */
#include <stdint.h>
#include <stdlib.h>
#include "test_util.h"   /* ARR, SHAPE, REL */
#include "internal.h"

/* Under AddressSanitizer, let the huge allocations below fail with NULL (as
 * malloc does) instead of aborting the process; ASAN_OPTIONS still overrides. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* A storage over a malloc'd float buffer 0..n-1 whose deleter counts its calls. */
static int frees = 0;
static void *last_freed = NULL;
static void counting_deleter(em_storage *s) {
  frees++;
  last_freed = s->data;
  CHECK(s->ctx == (void *)&frees);                       /* the context comes back to the deleter */
  free(s->data);
}
static em_storage *counted_storage(int n) {
  float *d = malloc(sizeof(float) * (size_t)n);
  for (int i = 0; i < n; i++) d[i] = (float)i;
  em_storage *s = em_storage_wrap(d, sizeof(float) * (size_t)n, em_cpu(), counting_deleter, &frees);
  return s;
}

static double get(const em_tensor *t, int64_t i) {
  int64_t idx[EM_MAX_DIMS];
  for (int d = t->ndim - 1; d >= 0; d--) { idx[d] = i % t->shape[d]; i /= t->shape[d]; }
  double v = NAN;
  em_get_f64(t, idx, &v);
  return v;
}

TEST(view_keeps_storage_alive) {
  frees = 0;
  em_storage *s = counted_storage(12);
  void *data = s->data;
  CHECK(s->refcount == 1 && s->version == 0 && s->deleter == counting_deleter && s->nbytes == 48);
  em_tensor *base = em_tensor_from_storage(s, 0, SHAPE(3, 4), ARR(4, 1), EM_F32);
  CHECK(base && s->refcount == 2);
  em_storage_release(s);                                 /* the tensor is now the only owner */
  CHECK(frees == 0 && base->storage->refcount == 1);
  em_tensor *v = em_transpose(base, 0, 1);
  em_tensor *n = em_narrow(base, 1, 1, 2);
  em_tensor *sel = em_select(n, 0, 2);                   /* a view of a view */
  CHECK(base->storage->refcount == 4);
  em_tensor_release(base);                               /* release the base first */
  CHECK(frees == 0);
  CHECK(v->storage->refcount == 3);
  CHECK(get(v, 1) == 4 && get(v, 11) == 11);             /* still reads the right data */
  CHECK(get(n, 0) == 1 && get(n, 5) == 10);
  CHECK(get(sel, 0) == 9 && get(sel, 1) == 10);
  em_tensor_release(v);
  em_tensor_release(n);
  CHECK(frees == 0 && get(sel, 1) == 10);
  em_tensor_release(sel);                                /* the last view frees, exactly once */
  CHECK(frees == 1 && last_freed == data);
}

TEST(tensor_refcounts) {
  frees = 0;
  em_storage *s = counted_storage(4);
  em_tensor *t = em_tensor_from_storage(s, 0, SHAPE(4), ARR(1), EM_F32);
  em_storage_release(s);
  CHECK(t->refcount == 1);
  CHECK(em_tensor_retain(t) == t && t->refcount == 2);
  em_tensor_retain(t);
  CHECK(t->refcount == 3 && t->storage->refcount == 1);  /* tensor refs do not touch the storage count */
  em_tensor_release(t);
  em_tensor_release(t);
  CHECK(t->refcount == 1 && frees == 0);
  em_tensor_release(NULL);                               /* NULL-safe */
  em_storage_release(NULL);
  CHECK(em_tensor_retain(NULL) == NULL);
  /* storage retain/release balance */
  em_storage_retain(t->storage);
  CHECK(t->storage->refcount == 2);
  em_storage *keep = t->storage;
  em_tensor_release(t);                                  /* header gone, storage kept by us */
  CHECK(frees == 0 && keep->refcount == 1);
  em_storage_release(keep);
  CHECK(frees == 1);
  /* a tensor's grad is released with it */
  em_tensor *p = em_zeros(SHAPE(2), EM_F32, em_cpu());
  em_storage *gs = counted_storage(2);
  em_tensor *g = em_tensor_from_storage(gs, 0, SHAPE(2), ARR(1), EM_F32);
  em_storage_release(gs);
  em_set_requires_grad(p, true);
  CHECK(em_set_grad(p, g) == 0 && g->refcount == 2);
  em_tensor_release(g);
  frees = 0;
  em_tensor_release(p);
  CHECK(frees == 1);
}

TEST(detach_aliases) {
  em_tensor *x = em_zeros(SHAPE(2, 3), EM_F32, em_cpu());
  em_set_requires_grad(x, true);
  em_tensor *y = em_mul_scalar(x, 2);
  CHECK(y && y->grad_fn != NULL && y->requires_grad);
  em_tensor *d = em_detach(y);
  CHECK(d && d != y && d->storage == y->storage && d->offset == y->offset);
  CHECK(d && d->ndim == 2 && d->shape[1] == 3 && d->stride[0] == 3);
  CHECK(d && !d->requires_grad && d->grad_fn == NULL && d->grad == NULL && d->refcount == 1);
  CHECK(y->storage->refcount == 2);
  /* writes through the detached alias are seen by the original (and bump the shared version) */
  uint32_t v = y->storage->version;
  CHECK(em_fill_(d, 5) == 0);
  CHECK(get(y, 4) == 5 && y->storage->version == v + 1);
  /* a detached view of a transposed tensor keeps its geometry */
  em_tensor *t = em_transpose(y, 0, 1), *dt = em_detach(t);
  CHECK(dt && dt->stride[0] == 1 && dt->stride[1] == 3 && dt->storage == y->storage);
  REL(x, y, d, t, dt);
}

TEST(version_counter) {
  em_tensor *a = em_zeros(SHAPE(2, 3), EM_F32, em_cpu());
  em_tensor *b = em_full(SHAPE(2, 3), 1, EM_F32, em_cpu());
  uint32_t v0 = a->storage->version;
  CHECK(em_copy_(a, b) == 0);
  CHECK(a->storage->version == v0 + 1);
  CHECK(em_fill_(a, 2) == 0);
  CHECK(a->storage->version == v0 + 2);
  uint32_t vb = b->storage->version;
  em_tensor *r = em_binary(EM_ADD, a, b, a);             /* a.add_(b) */
  CHECK(r == a && a->storage->version == v0 + 3);
  CHECK(b->storage->version == vb);                      /* the read-only operand is untouched */
  CHECK(get(a, 5) == 3);
  em_tensor_release(r);
  em_tensor *s = em_binary_scalar(EM_MUL, a, 2, false, a);   /* a.mul_(2) */
  CHECK(s == a && a->storage->version == v0 + 4);
  em_tensor_release(s);
  em_tensor *out_of_place = em_add(a, b);
  CHECK(out_of_place && a->storage->version == v0 + 4 && out_of_place->storage->version == 0);
  /* views share the counter: a write through any of them is a write to all */
  em_tensor *view = em_narrow(a, 1, 1, 1), *t = em_transpose(a, 0, 1);
  CHECK(view->storage == a->storage);
  CHECK(em_fill_(view, -1) == 0);
  CHECK(a->storage->version == v0 + 5 && t->storage->version == v0 + 5);
  em_tensor *r2 = em_binary(EM_SUB, t, t, t);
  CHECK(r2 == t && view->storage->version == v0 + 6);
  em_tensor_release(r2);
  CHECK(get(a, 0) == 0 && get(a, 1) == 0);
  /* em_bump_version is the hook for other writers */
  em_bump_version(view);
  CHECK(a->storage->version == v0 + 7);
  /* failed writes do not bump */
  em_tensor *wrong = em_zeros(SHAPE(4), EM_F32, em_cpu());
  CHECK(em_copy_(a, wrong) == -1);
  CHECK(a->storage->version == v0 + 7);
  REL(a, b, out_of_place, view, t, wrong);
}

TEST(cpu_allocator_alignment) {
  size_t sizes[] = {0, 1, 2, 3, 7, 8, 15, 17, 31, 33, 63, 64, 65, 100, 127, 128, 129, 255, 1000, 4095, 4097,
                    65537, (1u << 20) + 3};
  void *ps[sizeof sizes / sizeof sizes[0]];
  int misaligned = 0, nulls = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    ps[i] = em_cpu_alloc(sizes[i]);
    if (!ps[i]) { nulls++; continue; }
    if ((uintptr_t)ps[i] % 64) misaligned++;
    memset(ps[i], 0xab, sizes[i]);                       /* the whole size is writable (valgrind checks) */
  }
  CHECK(nulls == 0);
  CHECK(misaligned == 0);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) em_cpu_free(ps[i], sizes[i]);
  /* many small odd sizes, interleaved */
  void *many[200];
  misaligned = 0;
  for (int i = 0; i < 200; i++) {
    many[i] = em_cpu_alloc((size_t)(i * 7 + 1));
    if (!many[i] || (uintptr_t)many[i] % 64) misaligned++;
  }
  CHECK(misaligned == 0);
  for (int i = 0; i < 200; i++) em_cpu_free(many[i], (size_t)(i * 7 + 1));
  em_cpu_free(NULL, 0);
  /* tensors: every dtype's data is aligned, and storages of odd sizes too */
  misaligned = 0;
  for (int d = 0; d < EM_NDTYPES; d++)
    for (int64_t n = 0; n < 70; n += 3) {
      em_tensor *t = em_empty(SHAPE(n), (em_dtype)d, em_cpu());
      if (!t || (uintptr_t)t->storage->data % 64) misaligned++;
      em_tensor_release(t);
    }
  CHECK(misaligned == 0);
}

TEST(storage_new_zero_size) {
  em_storage *s = em_storage_new(0, em_cpu());
  CHECK(s != NULL);
  CHECK(s && s->data != NULL && (uintptr_t)s->data % 64 == 0);
  CHECK(s && s->nbytes == 0 && s->refcount == 1 && s->version == 0 && s->flags == 0 && s->deleter == NULL);
  CHECK(s && s->device.type == EM_CPU);
  em_storage_release(s);
  em_storage *s2 = em_storage_new(13, em_cpu());
  CHECK(s2 && s2->nbytes == 13);
  if (s2) memset(s2->data, 1, 13);
  em_storage_release(s2);
  em_device cuda = {EM_CUDA, 0};
  if (!em_cuda_compiled()) {
    em_clear_error();
    CHECK_ERR_CONTAINS(em_storage_new(16, cuda) == NULL, "no CUDA backend");
  }
}

TEST(out_of_memory) {
  size_t huge[] = {(size_t)1 << 62, ((size_t)1 << 62) + 1, SIZE_MAX / 2, SIZE_MAX - 62, SIZE_MAX - 1, SIZE_MAX};
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
    em_clear_error();
    em_storage *s = em_storage_new(huge[i], em_cpu());
    test_checks++;
    if (s || em_last_error_code() != EM_ERR_OOM || strncmp(em_last_error(), "out of memory", 13) != 0) {
      test_failures++;
      fprintf(stderr, "%s:%d: storage_new(%zu): expected NULL + EM_ERR_OOM 'out of memory...', got %p, code %d, '%s'\n",
              __FILE__, __LINE__, huge[i], (void *)s, em_last_error_code(), em_last_error());
      if (s) em_storage_release(s);
    }
  }
  em_clear_error();
  CHECK(em_storage_new((size_t)1 << 62, em_cpu()) == NULL);
  CHECK(strstr(em_last_error(), "4611686018427387904 bytes") != NULL);   /* says how much */
  CHECK(em_cpu_alloc((size_t)1 << 62) == NULL);
  CHECK(em_cpu_alloc(SIZE_MAX) == NULL);
  CHECK(em_cpu_alloc(SIZE_MAX - 10) == NULL);
  /* a tensor too big for memory (but whose size fits the index type) */
  em_clear_error();
  em_tensor *t = em_empty(SHAPE((int64_t)1 << 58), EM_F64, em_cpu());
  CHECK(t == NULL && em_last_error_code() == EM_ERR_OOM);
  CHECK(strncmp(em_last_error(), "out of memory", 13) == 0);
  em_tensor_release(t);
  em_clear_error();
  em_tensor *z = em_zeros(SHAPE((int64_t)1 << 29, (int64_t)1 << 29), EM_F32, em_cpu());
  CHECK(z == NULL && em_last_error_code() == EM_ERR_OOM);
  em_tensor_release(z);
  /* everything still works afterwards */
  em_tensor *ok = em_full(SHAPE(3), 1, EM_F32, em_cpu());
  CHECK(ok && get(ok, 2) == 1);
  em_tensor_release(ok);
}

/* Blocks of 1 MiB and more come back from the allocator's cache after a free
 * (no fresh page faults); sanitizer builds keep no cache. */
TEST(cpu_allocator_reuses_big_blocks) {
  em_cpu_empty_cache();
  size_t n = ((size_t)3 << 20) + 5;           /* class 3.5 MiB */
  unsigned char *a = em_cpu_alloc(n);
  CHECK(a && (uintptr_t)a % 64 == 0);
  if (!a) return;
  memset(a, 1, n);
  CHECK(em_cpu_alloc_size(n) == ((size_t)7 << 19));
  em_cpu_free(a, n);
#if defined(__SANITIZE_ADDRESS__)
  CHECK(em_cpu_cached_bytes() == 0);
#else
  CHECK(em_cpu_cached_bytes() == em_cpu_alloc_size(n));
  unsigned char *b = em_cpu_alloc(n + 1000);  /* the same class: the same block */
  CHECK(b == a);
  CHECK(em_cpu_cached_bytes() == 0);
  unsigned char *c = em_cpu_alloc(n * 2);     /* another class: fresh memory */
  CHECK(c && c != a && (uintptr_t)c % 64 == 0);
  if (c) memset(c, 2, n * 2);
  em_cpu_free(b, n + 1000);
  em_cpu_free(c, n * 2);
  CHECK(em_cpu_cached_bytes() == em_cpu_alloc_size(n) + em_cpu_alloc_size(n * 2));
  em_cpu_empty_cache();
  CHECK(em_cpu_cached_bytes() == 0);
#endif
}

TEST(wrap_and_from_storage) {
  frees = 0;
  em_storage *s = counted_storage(8);
  em_tensor *a = em_tensor_from_storage(s, 2, SHAPE(2, 3), ARR(3, 1), EM_F32);
  em_tensor *b = em_tensor_from_storage(s, 7, SHAPE(4), ARR(-2), EM_F32);   /* 7, 5, 3, 1 */
  CHECK(a && b && s->refcount == 3);
  CHECK(a && get(a, 0) == 2 && get(a, 5) == 7 && em_data_ptr(a) == (float *)s->data + 2);
  CHECK(b && get(b, 0) == 7 && get(b, 3) == 1);
  em_storage_release(s);
  em_tensor_release(a);
  CHECK(frees == 0);
  em_tensor_release(b);
  CHECK(frees == 1);
  /* a wrapped storage without a deleter is freed with the CPU allocator */
  void *p = em_cpu_alloc(32);
  em_storage *w = em_storage_wrap(p, 32, em_cpu(), NULL, NULL);
  CHECK(w && w->data == p && w->refcount == 1 && w->nbytes == 32);
  em_storage_release(w);                                 /* valgrind: no leak, no bad free */
}

int main(void) {
  RUN(view_keeps_storage_alive);
  RUN(cpu_allocator_reuses_big_blocks);
  RUN(tensor_refcounts);
  RUN(detach_aliases);
  RUN(version_counter);
  RUN(cpu_allocator_alignment);
  RUN(storage_new_zero_size);
  RUN(out_of_memory);
  RUN(wrap_and_from_storage);
  TEST_MAIN_END();
}
