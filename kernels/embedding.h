/* Embedding on CUDA (kernels/embedding.cu), the device half of
 * engine/ops/embedding.c. Tensors are validated by the engine op. */
#ifndef EMBER_KERNELS_EMBEDDING_H
#define EMBER_KERNELS_EMBEDDING_H

#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (n, d) = w[ids[i], :] for n contiguous ids (i32 or i64); w (rows, d)
 * with unit column stride (any row stride); out contiguous, w's dtype. An id
 * outside [0, rows) gives a row of NaN (no host-side check: it would sync). */
int em_embedding_fwd_cuda(const em_tensor *ids, const em_tensor *w, em_tensor *out);

/* gw (rows, d) = sum over i with ids[i] == r of g[i, :], deterministically
 * (bit-identical on every run: no float atomics). g contiguous (n, d) of any
 * float dtype; gw contiguous, any float dtype; ids contiguous i32 or i64;
 * ids outside [0, rows) are skipped. */
int em_embedding_bwd_cuda(const em_tensor *ids, const em_tensor *g, em_tensor *gw);

#ifdef __cplusplus
}
#endif
#endif
