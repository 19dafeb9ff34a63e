/* Helpers shared by the engine's .c files (not public API). */
#ifndef EMBER_INTERNAL_H
#define EMBER_INTERNAL_H

#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "ember/ember.h"
#include "backend/backend.h"   /* the op scope, tensor geometry helpers, the CUDA boundary */

#ifdef __cplusplus
extern "C" {
#endif

#define EM_UNUSED(x) (void)(x)
#define EM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define EM_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Return NULL / -1 from the current function when cond fails, with a message. */
#define EM_CHECK_NULL(cond, ...) do { if (!(cond)) { em_error(__VA_ARGS__); return NULL; } } while (0)
#define EM_CHECK_INT(cond, ...) do { if (!(cond)) { return em_error(__VA_ARGS__); } } while (0)

/* Shape/device/dtype checks that write a full message ("op: expected ..., got ..."). */
int em_check_same_device(const char *op, const em_tensor *a, const em_tensor *b);
int em_check_float(const char *op, const char *arg, const em_tensor *t);
int em_check_int(const char *op, const char *arg, const em_tensor *t);   /* integer (not bool, not float) */
int em_check_ndim(const char *op, const char *arg, const em_tensor *t, int ndim);
/* Compute the broadcast shape of two shapes; error names op and both shapes. */
int em_broadcast_shape(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb,
                       int *nout, int64_t *sout);
/* Validate an output tensor for an op: shape must match exactly, device too, no grad conflict. */
int em_check_out(const char *op, const em_tensor *out, int ndim, const int64_t *shape, em_device dev);

/* N-d iterator over up to 4 tensors broadcast to one shape. Use:
 *   em_iter it; em_iter_init(&it, ndim, shape, 2, (const em_tensor*[]){a, b});
 *   for (int64_t i = 0; i < it.numel; i++) { ... it.off[0] ... it.off[1] ...; em_iter_next(&it); }
 * off[k] is an element index into tensor k's storage (offset included). */
typedef struct {
  int ndim, n;
  int64_t numel;
  int64_t shape[EM_MAX_DIMS];
  int64_t idx[EM_MAX_DIMS];
  int64_t stride[4][EM_MAX_DIMS];
  int64_t off[4];
  int64_t base[4];                 /* off[] at element 0 */
} em_iter;
void em_iter_init(em_iter *it, int ndim, const int64_t *shape, int n, const em_tensor *const *ts);
/* After init: drop size-1 dims and merge neighbouring dims every tensor walks
 * contiguously, so the last dim is as long as memory allows (a contiguous
 * tensor becomes one row). The walk's order and offsets do not change. */
void em_iter_coalesce(em_iter *it);
/* Position it at flat element i (the parallel ranges start mid-walk). */
void em_iter_seek(em_iter *it, int64_t i);
/* Step to the start of the next row of the last dim (row-wise walks). */
static inline void em_iter_next_row(em_iter *it) {
  for (int d = it->ndim - 2; d >= 0; d--) {
    for (int k = 0; k < it->n; k++) it->off[k] += it->stride[k][d];
    if (++it->idx[d] < it->shape[d]) return;
    for (int k = 0; k < it->n; k++) it->off[k] -= it->stride[k][d] * it->shape[d];
    it->idx[d] = 0;
  }
}
static inline void em_iter_next(em_iter *it) {
  for (int d = it->ndim - 1; d >= 0; d--) {
    for (int k = 0; k < it->n; k++) it->off[k] += it->stride[k][d];
    if (++it->idx[d] < it->shape[d]) return;
    for (int k = 0; k < it->n; k++) it->off[k] -= it->stride[k][d] * it->shape[d];
    it->idx[d] = 0;
  }
}

/* Base pointer of t's storage (element 0 of the storage, not of t). */
static inline void *em_storage_ptr(const em_tensor *t) { return t->storage->data; }

/* Raw alias: a new header over t's storage, nothing recorded by autograd, no
 * checks. The view ops (engine/tensor.c) build on it and record the view. */
em_tensor *em_alias(const em_tensor *t);
/* em_alias with new geometry; no checks beyond ndim (the caller keeps the
 * view inside the storage). */
em_tensor *em_as_strided(const em_tensor *t, int ndim, const int64_t *shape,
                         const int64_t *stride, int64_t offset);

/* Error when writing in place into t is not allowed under autograd. */
int em_check_inplace(const char *op, const em_tensor *t);

/* CPU allocator (engine/alloc/cpu.c): 64-byte aligned; blocks of 1 MiB and
 * more are kept for reuse after free (page faults cost more than the ops). */
void *em_cpu_alloc(size_t nbytes);
void em_cpu_free(void *p, size_t nbytes);   /* nbytes: what p was allocated with */
/* The bytes em_cpu_alloc sets aside for a request (64-byte granules, at least
 * one; a big block's size class). */
size_t em_cpu_alloc_size(size_t nbytes);
/* Bytes of freed big blocks kept for reuse; give them all back to the system. */
size_t em_cpu_cached_bytes(void);
void em_cpu_empty_cache(void);
/* Zeroed memory for tensor/storage headers (engine/alloc/cpu.c's small bins); free with the same size. */
void *em_header_alloc(size_t nbytes);
void em_header_free(void *p, size_t nbytes);

/* Op not implemented for this device yet. */
int em_error_device(const char *op, const em_tensor *t);

/* A switch read once (at load, by the engine's A/B knobs): env var `name` unset or empty gives dflt, one digit
 * 0 .. maxv alone that digit, anything else dflt and a line on stderr ("ember: NAME must be 0 or 1, got 'x';
 * using 1"). */
int em_env_digit(const char *name, int maxv, int dflt);
/* The index of environment variable name's value among the n names of choices; unset or empty: 0 (the first
 * choice is the default); anything else: a line on stderr naming the choices, and 0. For the library's own
 * switches, read at load or once (a library must not fail to load). */
int em_env_pick(const char *name, const char *const *choices, int n);

#ifdef __cplusplus
}
#endif
#endif
