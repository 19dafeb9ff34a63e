/* Stream compaction on the CPU for masked_select and nonzero (contiguous
 * inputs): the elements are cut into blocks of kBlock, a shape-only split;
 * pass 1 counts each block's kept elements in parallel, a serial prefix over
 * the block counts gives each block its output offset, and pass 2 writes each
 * block's kept elements (or their coordinates) at that offset in parallel.
 * Each block writes only its own output range, so the result is the same at
 * any thread count (parallel.h's contract).
 *
 * "Kept" is an element with any bit set, a float's sign bit aside (-0.0 is
 * zero, NaN is not): the same rule as the CUDA mark (kernels/compact.cu). */
#include <stdlib.h>
#include <string.h>
#include "compact_cpu.h"
#include "op.h"
#include "parallel.h"

enum { kBlock = 1 << 16 };

typedef struct {
  const void *keep;   /* the elements tested, kes bytes each */
  size_t kes;
  uint64_t bits;      /* the bits that make an element kept */
  int64_t n, nb;
  int64_t *offs;      /* nb + 1: block b writes from offs[b] */
  const void *x;      /* masked_select: the values, es bytes each */
  size_t es;
  void *out;
  int nd;             /* nonzero: the coordinates of (nd, shape) */
  const int64_t *shape;
} job;

/* The bits that make an element of kes bytes kept: all of them, a float's but its sign. */
static uint64_t keep_bits(size_t kes, bool is_float) {
  const uint64_t all = kes == 8 ? ~0ull : (1ull << (8 * kes)) - 1;
  return is_float ? all >> 1 : all;
}

#define KEPT(T, p, i, m) ((((const T *)(p))[i] & (T)(m)) != 0)

static int64_t count_range(const job *j, int64_t i0, int64_t i1) {
  int64_t c = 0;
  switch (j->kes) {   /* one loop per width: each vectorises */
    case 1: for (int64_t i = i0; i < i1; i++) c += KEPT(uint8_t, j->keep, i, j->bits); break;
    case 2: for (int64_t i = i0; i < i1; i++) c += KEPT(uint16_t, j->keep, i, j->bits); break;
    case 4: for (int64_t i = i0; i < i1; i++) c += KEPT(uint32_t, j->keep, i, j->bits); break;
    default: for (int64_t i = i0; i < i1; i++) c += KEPT(uint64_t, j->keep, i, j->bits); break;
  }
  return c;
}

static void count_blocks(void *ctx, int64_t b0, int64_t b1) {
  job *j = ctx;
  for (int64_t b = b0; b < b1; b++) {
    int64_t i0 = b * kBlock, i1 = EM_MIN(j->n, i0 + kBlock);
    j->offs[b + 1] = count_range(j, i0, i1);
  }
}

/* Branch-free (half-kept masks defeat a branch predictor): every element is
 * stored at the next free slot, which moves on only past a kept one; the
 * loop ends once the block's count is stored, so no store lands past the
 * block's own range. Masks are bool (one byte). */
#define SELECT(T)                                                                           \
  do {                                                                                      \
    const T *s = (const T *)j->x;                                                           \
    T *d = (T *)j->out + j->offs[b];                                                        \
    for (int64_t i = i0, k = 0; k < c; i++) { d[k] = s[i]; k += m[i] != 0; }                \
  } while (0)

static void select_blocks(void *ctx, int64_t b0, int64_t b1) {
  job *j = ctx;
  const uint8_t *m = j->keep;
  for (int64_t b = b0; b < b1; b++) {
    const int64_t i0 = b * kBlock, c = j->offs[b + 1] - j->offs[b];
    switch (j->es) {
      case 1: SELECT(uint8_t); break;
      case 2: SELECT(uint16_t); break;
      case 4: SELECT(uint32_t); break;
      default: SELECT(uint64_t); break;
    }
  }
}

/* The same for coordinates, a row (the last dim) at a time: every element's nd coordinates stored at its slot,
 * the slot counted past a kept one; the leading coordinates change only at a row's end. */
#define COORDS(T)                                                                           \
  do {                                                                                      \
    const int64_t last = j->shape[nd - 1];                                                  \
    for (int64_t i = i0, k = 0; k < c;) {                                                   \
      int64_t t = idx[nd - 1];                                                              \
      for (; t < last && k < c; t++, i++) {                                                 \
        int64_t *q = o + k * nd;                                                            \
        for (int d = 0; d < nd - 1; d++) q[d] = idx[d];                                     \
        q[nd - 1] = t;                                                                      \
        k += KEPT(T, j->keep, i, j->bits);                                                  \
      }                                                                                     \
      idx[nd - 1] = t;                                                                      \
      for (int d = nd - 1; d >= 0 && idx[d] == j->shape[d]; d--) {                          \
        idx[d] = 0;                                                                         \
        if (d > 0) idx[d - 1]++;                                                            \
      }                                                                                     \
    }                                                                                       \
  } while (0)

static void coords_blocks(void *ctx, int64_t b0, int64_t b1) {
  job *j = ctx;
  const int nd = j->nd;
  for (int64_t b = b0; b < b1; b++) {
    const int64_t i0 = b * kBlock, c = j->offs[b + 1] - j->offs[b];
    if (c == 0) continue;
    int64_t idx[EM_MAX_DIMS], r = i0;
    for (int d = nd - 1; d >= 0; d--) { idx[d] = r % j->shape[d]; r /= j->shape[d]; }   /* i0's coordinates */
    int64_t *o = (int64_t *)j->out + j->offs[b] * nd;
    switch (j->kes) {
      case 1: COORDS(uint8_t); break;
      case 2: COORDS(uint16_t); break;
      case 4: COORDS(uint32_t); break;
      default: COORDS(uint64_t); break;
    }
  }
}

int64_t em_cpu_compact_count(const void *keep, size_t kes, bool is_float, int64_t n, int64_t **offs_out) {
  *offs_out = NULL;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  int64_t *offs = malloc((size_t)(nb + 1) * sizeof *offs);
  if (!offs) return -1;
  job j = {.keep = keep, .kes = kes, .bits = keep_bits(kes, is_float), .n = n, .nb = nb, .offs = offs};
  offs[0] = 0;
  em_parallel_for_mem(nb, 1, count_blocks, &j);
  for (int64_t b = 0; b < nb; b++) offs[b + 1] += offs[b];
  *offs_out = offs;
  return offs[nb];
}

void em_cpu_compact_select(const uint8_t *mask, int64_t n, const int64_t *offs, const void *x, size_t es,
                           void *out) {
  job j = {.keep = mask, .kes = 1, .n = n, .nb = (n + kBlock - 1) / kBlock, .offs = (int64_t *)offs, .x = x,
           .es = es, .out = out};
  em_parallel_for_mem(j.nb, 1, select_blocks, &j);
}

void em_cpu_compact_coords(const void *keep, size_t kes, bool is_float, int64_t n, const int64_t *offs, int nd,
                           const int64_t *shape, int64_t *out) {
  job j = {.keep = keep, .kes = kes, .bits = keep_bits(kes, is_float), .n = n, .nb = (n + kBlock - 1) / kBlock,
           .offs = (int64_t *)offs, .out = out, .nd = nd, .shape = shape};
  if (nd > 0) em_parallel_for_mem(j.nb, 1, coords_blocks, &j);
}
