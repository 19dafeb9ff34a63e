/* Naive scaled dot-product attention: softmax(q kᵀ · scale + causal mask) v.
 *
 * q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv); batch dims broadcast.
 * It is composed from ops (matmul, transpose, mul by a scalar, masked_fill,
 * softmax) so autograd, dtype handling and every future device come for free;
 * it materialises the (..., Tq, Tk) score matrix and is the reference the
 * fused flash kernels are tested against, not the fast path.
 *
 * Causal masking is top-left aligned, exactly like PyTorch's
 * scaled_dot_product_attention(is_causal=True): query i sees keys j <= i.
 * With Tq == Tk that is the usual mask. With Tq < Tk (queries for the last
 * positions of a KV cache) top-left alignment is NOT what a cache wants (the
 * last query should see every key): to decode one token pass causal = false;
 * a multi-token chunk needs a bottom-right mask this op does not offer. With
 * Tq > Tk every row still sees key 0, so no row is fully masked.
 * scale <= 0 means 1/sqrt(d).
 *
 * On CUDA the same composition runs on the device ops (cuBLASLt matmuls that
 * read kᵀ as a transpose flag, the softmax kernel); the causal mask is built
 * on the device (triu of ones), so nothing crosses the bus and a captured
 * graph can contain it. Autocast: attention is on the lower-precision list;
 * under ember.autocast q, k and v are cast to the region's dtype first (and
 * softmax, on the f32 list, widens the scores; the second matmul lowers them
 * again), so the result comes back in the autocast dtype. */
#include <stdio.h>
#include "op.h"

#define OP "scaled_dot_product_attention"

static int attention_validate(em_tensor *q, em_tensor *k, em_tensor *v, double scale) {
  char s1[160], s2[160], s3[160];
  em_tensor *ts[3] = {q, k, v};
  const char *names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++) {
    if (em_check_float(OP, names[i], ts[i])) return -1;
    if (ts[i]->ndim < 2)
      return em_error(OP ": expected %s with at least 2 dims (..., T, d), got shape %s", names[i],
                      em_shape_str(ts[i]->ndim, ts[i]->shape, s1, 160));
    if (em_check_same_device(OP, q, ts[i])) return -1;
    if (ts[i]->dtype != q->dtype)
      return em_error(OP ": expected q, k and v to have the same dtype, got %s, %s and %s",
                      em_dtype_name(q->dtype), em_dtype_name(k->dtype), em_dtype_name(v->dtype));
  }
  if (q->shape[q->ndim - 1] != k->shape[k->ndim - 1] || k->shape[k->ndim - 2] != v->shape[v->ndim - 2])
    return em_error(OP ": expected q (..., Tq, d), k (..., Tk, d) and v (..., Tk, dv), got %s, %s and %s",
                    em_shape_str(q->ndim, q->shape, s1, 160), em_shape_str(k->ndim, k->shape, s2, 160),
                    em_shape_str(v->ndim, v->shape, s3, 160));
  int nb, nb2;
  int64_t b[EM_MAX_DIMS], b2[EM_MAX_DIMS];
  if (em_broadcast_shape(OP, q->ndim - 2, q->shape, k->ndim - 2, k->shape, &nb, b) ||
      em_broadcast_shape(OP, nb, b, v->ndim - 2, v->shape, &nb2, b2))
    return -1;
  if (isnan(scale) || isinf(scale)) return em_error(OP ": expected a finite scale, got %g", scale);
  return 0;
}

/* (Tq, Tk) bool, true where key j is in query i's future (j > i): top-left aligned. */
static em_tensor *causal_mask(int64_t tq, int64_t tk, em_device dev) {
  int64_t shape[2] = {tq, tk};
  if (dev.type != EM_CPU) {               /* on the device: no upload, capturable */
    em_tensor *ones = em_full(2, shape, 1, EM_BOOL, dev);
    em_tensor *m = ones ? em_triu(ones, 1) : NULL;
    em_tensor_release(ones);
    return m;
  }
  em_tensor *m = em_empty(2, shape, EM_BOOL, em_cpu());
  if (!m) return NULL;
  uint8_t *p = em_data_ptr(m);
  for (int64_t i = 0; i < tq; i++)
    for (int64_t j = 0; j < tk; j++) p[i * tk + j] = j > i;
  if (dev.type == EM_CPU) return m;
  em_tensor *r = em_to(m, EM_BOOL, dev);
  em_tensor_release(m);
  return r;
}

/* Chain op results: release the previous intermediate, keep the next (NULL propagates). */
static em_tensor *step(em_tensor *prev, em_tensor *next) {
  em_tensor_release(prev);
  return next;
}

static em_tensor *attention_op(em_tensor *q, em_tensor *k, em_tensor *v, bool causal, double scale) {
  if (attention_validate(q, k, v, scale)) return NULL;
  int64_t d = q->shape[q->ndim - 1], tq = q->shape[q->ndim - 2], tk = k->shape[k->ndim - 2];
  if (scale <= 0) scale = 1.0 / sqrt((double)EM_MAX(d, 1));
  em_tensor *kt = em_transpose(k, -1, -2);
  em_tensor *s = kt ? em_matmul(q, kt) : NULL;
  em_tensor_release(kt);
  if (s) s = step(s, em_binary_scalar(EM_MUL, s, scale, false, NULL));
  if (s && causal) {
    em_tensor *mask = causal_mask(tq, tk, q->device);
    s = mask ? step(s, em_masked_fill(s, mask, -INFINITY, NULL)) : step(s, NULL);
    em_tensor_release(mask);
  }
  if (s) s = step(s, em_softmax(s, -1));
  return s ? step(s, em_matmul(s, v)) : NULL;
}

em_tensor *em_attention_naive(em_tensor *q, em_tensor *k, em_tensor *v, bool causal, double scale) {
  EM_OP_SCOPE(OP);
  em_op_args l;
  if (em_op_autocast(&l, EM_AUTOCAST_LOWER, 3, (em_tensor *[]){q, k, v})) return NULL;
  em_tensor *out = attention_op(l.t[0], l.t[1], l.t[2], causal, scale);
  em_op_args_release(&l);
  return out;
}
