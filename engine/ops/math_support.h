/* The internal entry points engine/ops/math_ops.c (issue 12: prod, norm,
 * amax/amin, lerp, addcmul, addcdiv) borrows from the machinery of
 * engine/ops/reduce.c and engine/ops/elementwise.c, so those ops reuse the
 * reduction walk and the elementwise loop (and their CUDA launchers) instead
 * of copying them. Not public API. */
#ifndef EMBER_OPS_MATH_SUPPORT_H
#define EMBER_OPS_MATH_SUPPORT_H

#include "internal.h"

/* ---- reduce.c ---- */
/* Parse dims (NULL/0: all) like sum does: the reduced-dims mask, the output
 * shape and the number of input elements per output. */
int em_reduce_dims(const char *name, const em_tensor *a, int ndims, const int64_t *dims, bool keepdim,
                   uint32_t *mask, int *out_ndim, int64_t *out_shape, int64_t *n_red);
/* res (contiguous, allocated) = reduction `kind` (EM_RED_*, backend.h) of a
 * over the dims in mask, on a's device. pw: the order of EM_RED_NORMP. */
int em_reduce_math(const char *name, int kind, em_tensor *res, const em_tensor *a, uint32_t mask, double pw);
/* vals (contiguous, allocated, a's dtype) = max/min over the dims in mask (NaN wins). */
int em_reduce_extreme(const char *name, const em_tensor *a, uint32_t mask, bool is_max, em_tensor *vals);

/* ---- elementwise.c ---- */
/* The result of an elementwise op: a new tensor, or out validated (shape,
 * device, same-kind cast, no grad conflict) and retained. */
em_tensor *em_ew_result(const char *name, em_tensor *out, int nd, const int64_t *shape, em_dtype dt,
                        em_device dev, bool grad);
/* out = k(in...) over the broadcast shape (nd, shape), on out's device,
 * through a temporary when an input overlaps out other than exactly. */
int em_ew_run(const char *name, const em_ew_kern *k, em_tensor *out, int nin, const em_ew_operand *in,
              int nd, const int64_t *shape);

#endif
