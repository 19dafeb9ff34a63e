/* Naive scaled dot-product attention: softmax(q kᵀ · scale + causal mask) v.
 *
 * q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv); batch dims broadcast.
 * It is composed from ops (matmul, transpose, mul by a scalar, masked_fill,
 * softmax) so autograd, dtype handling and every future device come for free;
 * it materialises the (..., Tq, Tk) score matrix and is the reference the
 * fused flash kernels are tested against, not the fast path.
 *
 * Causal masking (em_causal, ember/ops.h): query i sees keys j <= i + offset,
 * offset 0 top-left aligned, exactly like PyTorch's
 * scaled_dot_product_attention(is_causal=True), or Tk - Tq bottom-right
 * aligned (the queries are the last Tq positions of a KV cache of Tk: the
 * last query sees every key; PyTorch's causal_lower_right). The two agree
 * for Tq = Tk. Top-left with Tq > Tk still lets every row see key 0;
 * bottom-right needs Tq <= Tk (else a row would see no key) and says so.
 * scale <= 0 means 1/sqrt(d).
 *
 * Grouped-query attention: q (..., H, Tq, d) with k, v (..., Hkv, Tk, d),
 * Hkv > 1 dividing H, runs as q (..., Hkv, H/Hkv, Tq, d) against k, v
 * (..., Hkv, 1, Tk, d) through broadcasting (head h reads kv head
 * h / (H/Hkv)); Hkv = 1 is plain broadcasting.
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

/* gqa: q's heads (dim -3) are a multiple of k's and v's, so dim -3 is left out of the broadcast check. */
static int attention_validate(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale, bool gqa) {
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
  int skip = gqa ? 3 : 2;
  if (em_broadcast_shape(OP, q->ndim - skip, q->shape, k->ndim - skip, k->shape, &nb, b) ||
      em_broadcast_shape(OP, nb, b, v->ndim - skip, v->shape, &nb2, b2))
    return -1;
  if (isnan(scale) || isinf(scale)) return em_error(OP ": expected a finite scale, got %g", scale);
  int64_t tq = q->shape[q->ndim - 2], tk = k->shape[k->ndim - 2];
  if (causal != EM_CAUSAL_NONE && causal != EM_CAUSAL_TOP_LEFT && causal != EM_CAUSAL_BOTTOM_RIGHT)
    return em_error(OP ": expected causal none (0), top-left (1) or bottom-right (2), got %d", (int)causal);
  if (causal == EM_CAUSAL_BOTTOM_RIGHT && tq > tk)
    return em_error(OP ": expected Tq <= Tk for bottom-right causal alignment (the first Tq - Tk queries would "
                       "see no key), got Tq = %lld and Tk = %lld", (long long)tq, (long long)tk);
  return 0;
}

/* (Tq, Tk) bool, true where key j is in query i's future (j > i + off). */
static em_tensor *causal_mask(int64_t tq, int64_t tk, int64_t off, em_device dev) {
  int64_t shape[2] = {tq, tk};
  if (dev.type != EM_CPU) {               /* on the device: no upload, capturable */
    em_tensor *ones = em_full(2, shape, 1, EM_BOOL, dev);
    em_tensor *m = ones ? em_triu(ones, 1 + off) : NULL;
    em_tensor_release(ones);
    return m;
  }
  em_tensor *m = em_empty(2, shape, EM_BOOL, em_cpu());
  if (!m) return NULL;
  uint8_t *p = em_data_ptr(m);
  for (int64_t i = 0; i < tq; i++)
    for (int64_t j = 0; j < tk; j++) p[i * tk + j] = j > i + off;
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

static em_tensor *attention_core(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale);

/* Dim -3 of a tensor with at least 3 dims (the heads), else 0. */
static int64_t heads(const em_tensor *t) { return t->ndim >= 3 ? t->shape[t->ndim - 3] : 0; }

/* t (..., H, T, d) as (..., g, H/g, T, d) (g kv heads, groups of H/g), or
 * (..., H, 1, T, d) when split is false. */
static em_tensor *split_heads(em_tensor *t, int64_t g, bool split) {
  int64_t shape[EM_MAX_DIMS];
  int n = t->ndim;
  if (n + 1 > EM_MAX_DIMS) { em_error(OP ": grouped-query attention needs one more dim than %d", n); return NULL; }
  memcpy(shape, t->shape, sizeof(int64_t) * (size_t)n);
  shape[n - 3] = split ? g : t->shape[n - 3];
  shape[n - 2] = split ? t->shape[n - 3] / g : 1;
  shape[n - 1] = t->shape[n - 2];
  shape[n] = t->shape[n - 1];
  return em_reshape(t, n + 1, shape);
}

/* Grouped-query attention as broadcasting (see the top of the file). */
static em_tensor *attention_gqa(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale) {
  int64_t hk = heads(k);
  em_tensor *q5 = split_heads(q, hk, true), *k5 = q5 ? split_heads(k, hk, false) : NULL;
  em_tensor *v5 = k5 ? split_heads(v, hk, false) : NULL;
  em_tensor *o5 = v5 ? attention_core(q5, k5, v5, causal, scale) : NULL, *o = NULL;
  if (o5) {
    int64_t shape[EM_MAX_DIMS];
    int n = o5->ndim;
    memcpy(shape, o5->shape, sizeof(int64_t) * (size_t)n);
    shape[n - 4] = heads(q);
    shape[n - 3] = o5->shape[n - 2];
    shape[n - 2] = o5->shape[n - 1];
    o = em_reshape(o5, n - 1, shape);
  }
  em_tensor *tmp[4] = {q5, k5, v5, o5};
  for (int i = 0; i < 4; i++) em_tensor_release(tmp[i]);
  return o;
}

static em_tensor *attention_op(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale) {
  int64_t hq = heads(q), hk = heads(k);
  bool gqa = hq > 0 && hk > 1 && hk == heads(v) && hq != hk && hq % hk == 0;
  if (attention_validate(q, k, v, causal, scale, gqa)) return NULL;
  return gqa ? attention_gqa(q, k, v, causal, scale) : attention_core(q, k, v, causal, scale);
}

/* Validated inputs: the composition. */
static em_tensor *attention_core(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale) {
  int64_t d = q->shape[q->ndim - 1], tq = q->shape[q->ndim - 2], tk = k->shape[k->ndim - 2];
  if (scale <= 0) scale = 1.0 / sqrt((double)EM_MAX(d, 1));
  em_tensor *kt = em_transpose(k, -1, -2);
  em_tensor *s = kt ? em_matmul(q, kt) : NULL;
  em_tensor_release(kt);
  if (s) s = step(s, em_binary_scalar(EM_MUL, s, scale, false, NULL));
  if (s && causal) {
    em_tensor *mask = causal_mask(tq, tk, causal == EM_CAUSAL_BOTTOM_RIGHT ? tk - tq : 0, q->device);
    s = mask ? step(s, em_masked_fill(s, mask, -INFINITY, NULL)) : step(s, NULL);
    em_tensor_release(mask);
  }
  if (s) s = step(s, em_softmax(s, -1));
  return s ? step(s, em_matmul(s, v)) : NULL;
}

em_tensor *em_attention_naive(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale) {
  EM_OP_SCOPE(OP);
  em_op_args l;
  if (em_op_autocast(&l, EM_AUTOCAST_LOWER, 3, (em_tensor *[]){q, k, v})) return NULL;
  em_tensor *out = attention_op(l.t[0], l.t[1], l.t[2], causal, scale);
  em_op_args_release(&l);
  return out;
}
