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
 * again), so the result comes back in the autocast dtype.
 *
 * On the CPU (f32/f64 scores, outside autocast) the scale, the causal mask
 * and the softmax are one fused row op, scaled_softmax: one pass over the
 * (Tq, Tk) scores instead of three, and no mask tensor. It rounds exactly as
 * the composition does (scale in the scores' dtype, max and exp as
 * em_softmax, sums in double), so both paths give the same bits; its
 * backward is one pass too: gs = scale * y * (g - sum(g * y)) per row. */
#include <stdio.h>
#include "op.h"
#include "cost.h"
#include "parallel.h"
#include "vec_math.h"

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

/* ---------------- the CPU's fused scale + causal mask + softmax ---------------- */

/* Rows of contiguous scores (..., Tq, Tk); row r is query r % Tq, which sees
 * keys j <= r % Tq + off when causal (off 0: top-left aligned, Tk - Tq:
 * bottom-right), every key otherwise. */
typedef struct {
  const void *s, *y, *g;
  void *out;
  int64_t tq, tk;
  double scale;
  bool causal, f64;
  int64_t off;
} ssm_job;

static int64_t visible(const ssm_job *j, int64_t r) {
  return j->causal ? EM_MIN(j->tk, r % j->tq + 1 + j->off) : j->tk;
}

/* The masked keys are -inf before the softmax (exp gives +0, and 0 * (1 / sum)
 * keeps a NaN row NaN everywhere), as masked_fill + softmax compute them. */
EM_SIMD_CLONES static void ssm_fwd_rows(void *ctx, int64_t r0, int64_t r1) {
  const ssm_job *j = ctx;
  int64_t tk = j->tk;
  for (int64_t r = r0; r < r1; r++) {
    int64_t n = visible(j, r);
    double mx = -INFINITY, sum = 0;
    if (j->f64) {
      const double *x = (const double *)j->s + r * tk;
      double *y = (double *)j->out + r * tk;
      for (int64_t k = 0; k < n; k++) { y[k] = x[k] * j->scale; mx = y[k] > mx ? y[k] : mx; }
      for (int64_t k = 0; k < n; k++) { y[k] = exp(y[k] - mx); sum += y[k]; }
      double inv = 1.0 / sum;
      for (int64_t k = 0; k < n; k++) y[k] *= inv;
      for (int64_t k = n; k < tk; k++) y[k] = 0.0 * inv;
    } else {                 /* em_softmax's f32 row kernel: a masked key adds +0 to its lane */
      const float *x = (const float *)j->s + r * tk;
      float *y = (float *)j->out + r * tk, sc = (float)j->scale;
      for (int64_t k = 0; k < n; k++) y[k] = x[k] * sc;
      em_softmax_row_f32(y, y, n, 0);
      float fill = n > 0 && isnan(y[0]) ? NAN : 0.0f;
      for (int64_t k = n; k < tk; k++) y[k] = fill;
    }
  }
}

EM_SIMD_CLONES static void ssm_bwd_rows(void *ctx, int64_t r0, int64_t r1) {
  const ssm_job *j = ctx;
  int64_t tk = j->tk;
  for (int64_t r = r0; r < r1; r++) {
    int64_t n = visible(j, r);
    double dot = 0;
    if (j->f64) {
      const double *y = (const double *)j->y + r * tk, *g = (const double *)j->g + r * tk;
      double *gs = (double *)j->out + r * tk;
      for (int64_t k = 0; k < n; k++) dot += g[k] * y[k];
      for (int64_t k = 0; k < n; k++) gs[k] = j->scale * y[k] * (g[k] - dot);
      for (int64_t k = n; k < tk; k++) gs[k] = 0;
    } else {
      const float *y = (const float *)j->y + r * tk, *g = (const float *)j->g + r * tk;
      float *gs = (float *)j->out + r * tk;
      for (int64_t k = 0; k < n; k++) dot += (double)g[k] * y[k];
      for (int64_t k = 0; k < n; k++) gs[k] = (float)(j->scale * y[k] * ((double)g[k] - dot));
      for (int64_t k = n; k < tk; k++) gs[k] = 0;
    }
  }
}

static int64_t ssm_rows(const em_tensor *t) { return t->shape[t->ndim - 1] ? em_numel(t) / t->shape[t->ndim - 1] : 0; }

/* saved: y; f[0] = scale, i[0] = causal, i[1] = the causal key offset. */
static int ssm_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *y = n->saved[0];
  /* y and g read, the gradient written; g*y, the row sum, g - s, y * (...), the scale */
  EM_OP_COST(2 * em_cost_nbytes(y) + em_cost_nbytes(gout[0]), 5 * em_numel(y), em_cost_simt_class(y->dtype));
  em_tensor *g = em_contiguous_as(gout[0], y->dtype);
  em_tensor *gs = g ? em_empty(y->ndim, y->shape, y->dtype, y->device) : NULL;
  if (gs) {
    ssm_job j = {NULL, em_data_ptr(y), em_data_ptr(g), em_data_ptr(gs), y->shape[y->ndim - 2], y->shape[y->ndim - 1],
                 n->f[0], n->i[0] != 0, y->dtype == EM_F64, n->i[1]};
    em_parallel_for(ssm_rows(y), em_grain(4 * j.tk), ssm_bwd_rows, &j);
  }
  em_tensor_release(g);
  gin[0] = gs;
  return gs ? 0 : -1;
}

/* softmax(scale * s [+ causal mask]) over the last dim of CPU f32/f64 scores. */
static em_tensor *scaled_softmax(em_tensor *s, double scale, bool causal, int64_t off) {
  EM_OP_SCOPE("scaled_softmax");
  /* s read, y written (its dtype); scale, max, subtract, exp, sum, divide */
  EM_OP_COST(2 * em_cost_nbytes(s), 6 * em_numel(s), em_cost_simt_class(s->dtype));
  em_tensor *sc = em_contiguous(s);
  em_tensor *y = sc ? em_empty(s->ndim, s->shape, s->dtype, s->device) : NULL;
  if (y) {
    ssm_job j = {em_data_ptr(sc), NULL, NULL, em_data_ptr(y), s->shape[s->ndim - 2], s->shape[s->ndim - 1], scale,
                 causal, s->dtype == EM_F64, off};
    em_parallel_for(ssm_rows(s), em_grain(16 * j.tk), ssm_fwd_rows, &j);
  }
  em_tensor_release(sc);
  em_node *n;
  y = em_op_record(y, &n, "scaled_softmax", ssm_backward, 1, &s, 1, &y);
  if (n) { n->f[0] = scale; n->i[0] = causal; n->i[1] = off; }
  return y;
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
  bool fused = s && s->device.type == EM_CPU && (s->dtype == EM_F32 || s->dtype == EM_F64) && !em_autocast_enabled();
  if (fused) {
    s = step(s, scaled_softmax(s, scale, causal != EM_CAUSAL_NONE, causal == EM_CAUSAL_BOTTOM_RIGHT ? tk - tq : 0));
    return s ? step(s, em_matmul(s, v)) : NULL;
  }
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
