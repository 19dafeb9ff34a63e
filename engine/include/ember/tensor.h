/* Tensors: dtype, device, up to 8 dims, sizes + strides (in elements) +
 * offset over a refcounted storage. Dims are in PyTorch order (last dim
 * innermost). Views share storage. Functions returning em_tensor* return a
 * NEW reference (caller releases with em_tensor_release) or NULL with the error
 * set; arguments are borrowed. */
#ifndef EMBER_TENSOR_H
#define EMBER_TENSOR_H

#include <stdint.h>
#include <stdbool.h>
#include "dtype.h"
#include "device.h"
#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EM_MAX_DIMS 8

/* Memory behind one or more tensors. The version counter is bumped by every
 * in-place write; autograd compares it with the value saved at record time. */
typedef struct em_storage {
  int refcount;
  void *data;
  size_t nbytes;
  em_device device;
  uint32_t version;
  int flags;                                   /* EM_STORAGE_* */
  void (*deleter)(struct em_storage *s);       /* NULL: the allocator's free */
  void *ctx;                                   /* deleter's context (mmap base, ...) */
} em_storage;

enum { EM_STORAGE_READONLY = 1, EM_STORAGE_PINNED = 2 };

struct em_node;
struct em_hook;

typedef struct em_tensor {
  int refcount;
  em_storage *storage;
  int64_t offset;                 /* in elements */
  int ndim;
  int64_t shape[EM_MAX_DIMS];
  int64_t stride[EM_MAX_DIMS];
  em_dtype dtype;
  em_device device;
  /* autograd */
  bool requires_grad;
  struct em_tensor *grad;         /* accumulated gradient (leaves) */
  struct em_node *grad_fn;        /* producer (non-leaves), strong ref */
  int output_nr;                  /* which output of grad_fn */
  struct em_hook *hooks;          /* post-accumulate-grad hooks (leaves) */
  void *binding;                  /* owned by the language binding (Lua userdata flag) */
  /* engine-private (engine/autograd.c): a leaf's scratch during one
   * em_backward. Meaningless outside it; a C user never reads or writes them. */
  int bw_deps;
  uint64_t bw_epoch;
  struct em_tensor *bw_grad;
  /* engine-private (engine/autocast.c, engine/ops/optim.c): shadow weights.
   * A parameter may carry a bf16/f16 copy that AdamW writes in the same pass
   * as its f32 update and autocast reads instead of casting. It is current
   * only while storage == shadow_storage and storage->version ==
   * shadow_version: any other write to the parameter makes autocast cast. */
  struct em_tensor *shadow;       /* owned; NULL when none */
  const em_storage *shadow_storage;
  uint32_t shadow_version;
  int shadow_want;                /* 1 + the dtype autocast asked for; 0: none asked */
  bool shadow_off;                /* em_shadow_weights_(t, false): never keep one */
} em_tensor;

/* ---- lifetime ---- */
em_tensor *em_tensor_retain(em_tensor *t);
void em_tensor_release(em_tensor *t);     /* NULL-safe */
em_storage *em_storage_new(size_t nbytes, em_device dev);   /* uninitialised; NULL + error on OOM */
em_storage *em_storage_wrap(void *data, size_t nbytes, em_device dev,
                            void (*deleter)(em_storage *), void *ctx);
void em_storage_retain(em_storage *s);
void em_storage_release(em_storage *s);

/* ---- creation (contiguous, new storage) ---- */
em_tensor *em_empty(int ndim, const int64_t *shape, em_dtype dt, em_device dev);
em_tensor *em_zeros(int ndim, const int64_t *shape, em_dtype dt, em_device dev);
em_tensor *em_full(int ndim, const int64_t *shape, double value, em_dtype dt, em_device dev);
em_tensor *em_empty_like(const em_tensor *t);
em_tensor *em_zeros_like(const em_tensor *t);
/* A tensor over existing storage (retains it). Checks the extent fits. */
em_tensor *em_tensor_from_storage(em_storage *s, int64_t offset, int ndim,
                                  const int64_t *shape, const int64_t *stride, em_dtype dt);
em_tensor *em_arange(double start, double end, double step, em_dtype dt, em_device dev);
em_tensor *em_linspace(double start, double end, int64_t steps, em_dtype dt, em_device dev);
em_tensor *em_eye(int64_t n, int64_t m, em_dtype dt, em_device dev);
em_tensor *em_scalar_tensor(double v, em_dtype dt, em_device dev); /* 0-d */

/* ---- inspection ---- */
int64_t em_numel(const em_tensor *t);
bool em_is_contiguous(const em_tensor *t);
/* Pointer to element [offset] (CPU or device address). */
void *em_data_ptr(const em_tensor *t);
/* Human-readable shape "[2, 3]" into buf. */
const char *em_shape_str(int ndim, const int64_t *shape, char *buf, int n);
bool em_same_shape(const em_tensor *a, const em_tensor *b);
/* Normalise a possibly negative dim against ndim; error names op. */
int em_wrap_dim(const char *op, int64_t dim, int ndim, int *out);

/* ---- views (share storage; recorded by autograd) ---- */
em_tensor *em_view(em_tensor *t, int ndim, const int64_t *shape);     /* one -1 allowed; needs compatible strides */
em_tensor *em_reshape(em_tensor *t, int ndim, const int64_t *shape);  /* view when possible, else copy */
em_tensor *em_transpose(em_tensor *t, int64_t d0, int64_t d1);
em_tensor *em_permute(em_tensor *t, int ndim, const int64_t *perm);
em_tensor *em_narrow(em_tensor *t, int64_t dim, int64_t start, int64_t len);
em_tensor *em_select(em_tensor *t, int64_t dim, int64_t index);
em_tensor *em_squeeze(em_tensor *t, int64_t dim);          /* dim = EM_ALL_DIMS squeezes all size-1 dims */
em_tensor *em_unsqueeze(em_tensor *t, int64_t dim);
em_tensor *em_expand(em_tensor *t, int ndim, const int64_t *shape); /* -1 keeps a size */
em_tensor *em_flatten(em_tensor *t, int64_t start, int64_t end);
/* An alias without autograd history (shares storage). */
em_tensor *em_detach(em_tensor *t);

#define EM_ALL_DIMS INT64_MIN

/* ---- copies and conversions ---- */
em_tensor *em_contiguous(em_tensor *t);     /* returns t retained when already contiguous */
em_tensor *em_clone(em_tensor *t);          /* always copies (recorded by autograd) */
/* Copy src into dst in place (broadcast src to dst, convert dtype, cross devices). */
int em_copy_(em_tensor *dst, em_tensor *src);
int em_fill_(em_tensor *dst, double v);
/* Convert dtype and/or device; returns t retained when nothing changes. Recorded by autograd. */
em_tensor *em_to(em_tensor *t, em_dtype dt, em_device dev);
/* Rebind t to src's storage and geometry (flat parameter buffers). */
int em_set_(em_tensor *t, em_tensor *src);
/* Mark an in-place write (bumps the storage version). */
static inline void em_bump_version(em_tensor *t) { t->storage->version++; }

/* ---- scalar access (synchronises with the device) ---- */
int em_item(const em_tensor *t, double *out);
int em_get_f64(const em_tensor *t, const int64_t *idx, double *out);

#ifdef __cplusplus
}
#endif
#endif
