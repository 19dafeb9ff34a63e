/* Tensor helpers the C tests share, written once so every test builds and
 * compares tensors the same way (header only: each tests/c/test_*.c is its
 * own executable, nothing to link): shape literals, releasing a list of
 * tensors, an element by logical index, exact value checks, and for the
 * file-format tests tensors of patterned bytes and a byte-exact comparison.
 * The helpers are static inline, so a test that uses only some of them
 * compiles without unused-function warnings. */
#ifndef EMBER_TEST_UTIL_H
#define EMBER_TEST_UTIL_H
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include "test.h"

#define ARR(...) (int64_t[]){__VA_ARGS__}
#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static inline void rel(em_tensor **ts, int n) { for (int i = 0; i < n; i++) em_tensor_release(ts[i]); }
#define REL(...) rel((em_tensor *[]){__VA_ARGS__}, (int)(sizeof((em_tensor *[]){__VA_ARGS__}) / sizeof(em_tensor *)))

/* Element i (logical row-major order) of any tensor, as a double; NaN when it cannot be read. */
static inline double at(const em_tensor *t, int64_t i) {
  int64_t idx[EM_MAX_DIMS];
  for (int d = t->ndim - 1; d >= 0; d--) { idx[d] = i % t->shape[d]; i /= t->shape[d]; }
  double v = NAN;
  if (em_get_f64(t, idx, &v)) return NAN;
  return v;
}

static inline bool shape_is(const em_tensor *t, int ndim, const int64_t *shape) {
  return t && t->ndim == ndim && memcmp(t->shape, shape, sizeof(int64_t) * (size_t)ndim) == 0;
}

/* t holds exactly these values (logical order); a failure names the first wrong element. */
#define CHECK_VALS(t, ...) do {                                                         \
    const double _e[] = {__VA_ARGS__};                                                  \
    int _n = (int)(sizeof _e / sizeof _e[0]);                                           \
    const em_tensor *_t = (t);                                                          \
    test_checks++;                                                                      \
    if (!_t || em_numel(_t) != _n) { test_failures++;                                   \
      fprintf(stderr, "%s:%d: %s: expected %d elements, got %lld\n", __FILE__, __LINE__, #t, _n, \
              _t ? (long long)em_numel(_t) : -1LL); break; }                            \
    for (int _i = 0; _i < _n; _i++) {                                                   \
      double _v = at(_t, _i);                                                           \
      if (_v != _e[_i]) { test_failures++;                                              \
        fprintf(stderr, "%s:%d: %s[%d] = %.17g, expected %.17g\n", __FILE__, __LINE__, #t, _i, _v, _e[_i]); break; } \
    }                                                                                   \
  } while (0)

/* A CPU tensor of dtype dt filled with bytes from a fixed pseudo-random
 * stream (bools get 0/1), so every bit pattern — NaN payloads, subnormals,
 * -0 in bf16/f16 — must survive a trip through a file. */
static inline em_tensor *patterned(int ndim, const int64_t *shape, em_dtype dt, uint32_t seed) {
  em_tensor *t = em_empty(ndim, shape, dt, em_cpu());
  unsigned char *p = em_data_ptr(t);
  size_t n = (size_t)em_numel(t) * em_dtype_size(dt);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = dt == EM_BOOL ? (unsigned char)((seed >> 24) & 1) : (unsigned char)(seed >> 24);
  }
  return t;
}

/* Same dtype, shape and data bytes. */
static inline int same_bytes(const em_tensor *a, const em_tensor *b) {
  if (a->dtype != b->dtype || a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++) if (a->shape[i] != b->shape[i]) return 0;
  size_t n = (size_t)em_numel(a) * em_dtype_size(a->dtype);
  return n == 0 || memcmp(em_data_ptr(a), em_data_ptr(b), n) == 0;
}
#endif
