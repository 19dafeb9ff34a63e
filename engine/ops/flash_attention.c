/* FlashAttention: softmax(q kᵀ · scale [+ causal mask]) v computed tile by
 * tile on the GPU (kernels/flash_fwd.cu, kernels/flash_bwd.cu), never
 * materialising the (Tq, Tk) scores. Saves q, k, v, o and the rows'
 * log-sum-exp (B·H·Tq floats) for backward, where the naive composition
 * saves the T×T probabilities twice (f32 softmax output, bf16 matmul input).
 *
 * q (B, H, Tq, D), k and v (B, H, Tk, D): bf16 or f16 (under ember.autocast
 * f32 inputs are lowered to the region's dtype first, as attention is on the
 * lower-precision list), D in {16, 32, 64, 80, 96, 128}. Any strides over B,
 * H and T: the kernels read the (B, T, H, D) layout that the head split of a
 * linear projection produces without a copy. o, dq, dk and dv are allocated
 * as (B, T, H, D) memory viewed as (B, H, T, D), so merging the heads back
 * (transpose + reshape) is free. Causal masking is top-left aligned, as in
 * em_attention_naive and PyTorch's is_causal.
 *
 * On the CPU the same algorithm (online softmax forward, the log-sum-exp
 * backward) runs row by row in double for any float dtype: the reference the
 * op registry's eval mode compares the kernels with, and the path its grad
 * mode checks against finite differences in f64. It is not fast (issue 11's
 * tiled CPU attention is).
 *
 * em_attention picks the implementation: flash where it applies (CUDA, a
 * half dtype after autocast, a supported D, 4-D inputs of matching B and H),
 * the naive composition everywhere else (CPU, f32 without autocast). */
#include <math.h>
#include <stdio.h>
#include "op.h"

#define OP "flash_attention"

static bool half_dtype(em_dtype dt) { return dt == EM_BF16 || dt == EM_F16; }

/* The head dims the op accepts: the kernels' on CUDA; on the CPU the same
 * list, so a script written on the CPU runs on the GPU (and a CPU-only
 * build, whose backend stub supports nothing, still has its reference). */
static bool supported_dim(em_device dev, int64_t d) {
  if (dev.type == EM_CUDA) return em_flash_supported_dim(d);
  return d == 16 || d == 32 || d == 64 || d == 80 || d == 96 || d == 128;
}

static int flash_validate(em_tensor *q, em_tensor *k, em_tensor *v, double scale) {
  char s1[160], s2[160], s3[160];
  em_tensor *ts[3] = {q, k, v};
  const char *names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++) {
    if (ts[i]->ndim != 4)
      return em_error(OP ": expected %s of shape (B, H, T, D), got %s", names[i],
                      em_shape_str(ts[i]->ndim, ts[i]->shape, s1, 160));
    if (em_check_same_device(OP, q, ts[i])) return -1;
    if (ts[i]->dtype != q->dtype)
      return em_error(OP ": expected q, k and v to have the same dtype, got %s, %s and %s",
                      em_dtype_name(q->dtype), em_dtype_name(k->dtype), em_dtype_name(v->dtype));
  }
  if (em_check_float(OP, "q", q)) return -1;
  if (q->device.type == EM_CUDA && !half_dtype(q->dtype))
    return em_error(OP ": expected bf16 or f16 q, k and v (or f32 inside ember.autocast), got %s",
                    em_dtype_name(q->dtype));
  if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || k->shape[1] != q->shape[1] ||
      v->shape[1] != q->shape[1] || k->shape[3] != q->shape[3] || v->shape[3] != q->shape[3] ||
      v->shape[2] != k->shape[2])
    return em_error(OP ": expected q (B, H, Tq, D), k and v (B, H, Tk, D), got %s, %s and %s",
                    em_shape_str(q->ndim, q->shape, s1, 160), em_shape_str(k->ndim, k->shape, s2, 160),
                    em_shape_str(v->ndim, v->shape, s3, 160));
  if (!supported_dim(q->device, q->shape[3]))
    return em_error(OP ": no kernel for head dim %lld (supported: 16, 32, 64, 80, 96, 128)",
                    (long long)q->shape[3]);
  if (k->shape[2] == 0 && q->shape[2] > 0) return em_error(OP ": expected at least one key, got Tk = 0");
  if (q->shape[2] > INT32_MAX || k->shape[2] > INT32_MAX || q->shape[0] * q->shape[1] > INT32_MAX)
    return em_error(OP ": sizes past 2^31 rows are not supported, got %s",
                    em_shape_str(q->ndim, q->shape, s1, 160));
  if (isnan(scale) || isinf(scale)) return em_error(OP ": expected a finite scale, got %g", scale);
  return 0;
}

/* The kernels read 16-byte rows: last dim contiguous, other strides multiples
 * of 8 elements, data 16-byte aligned. Anything else is copied once. */
static em_tensor *kernel_ready(em_tensor *t) {
  bool ok = t->stride[3] == 1 && ((uintptr_t)em_data_ptr(t) & 15) == 0;
  for (int d = 0; d < 3 && ok; d++) ok = t->stride[d] % 8 == 0 || t->shape[d] == 1;
  if (ok) return em_tensor_retain(t);
  em_tensor *c = em_contiguous(t);
  if (c && ((uintptr_t)em_data_ptr(c) & 15) != 0) {   /* a contiguous view at an odd offset */
    em_tensor *e = em_empty(c->ndim, c->shape, c->dtype, c->device);
    if (e && em_copy_(e, c)) { em_tensor_release(e); e = NULL; }
    em_tensor_release(c);
    c = e;
  }
  return c;
}

/* (B, H, T, D) view of fresh (B, T, H, D) memory. */
static em_tensor *bthd_empty(int64_t b, int64_t h, int64_t t, int64_t d, em_dtype dt, em_device dev) {
  int64_t shape[4] = {b, t, h, d};
  em_tensor *m = em_empty(4, shape, dt, dev);
  em_tensor *v = m ? em_transpose(m, 1, 2) : NULL;
  em_tensor_release(m);
  return v;
}

/* saved: q, k, v, o, lse; the op's causal flag, scale and input dtype ride in n->ctx. */
typedef struct { bool causal; double scale; em_dtype dtype; } flash_ctx;

/* ---- the CPU path: f64 contiguous (B, H, T, D) q, k, v, o, dout; lse (B, H, Tq) ---- */

/* The last key row i attends to: all of them, or j <= i (top-left aligned). */
static int64_t last_key(bool causal, int64_t i, int64_t Tk) { return causal ? EM_MIN(i, Tk - 1) : Tk - 1; }

static double dot(const double *a, const double *b, int64_t n) {
  double s = 0;
  for (int64_t d = 0; d < n; d++) s += a[d] * b[d];
  return s;
}

static void flash_fwd_cpu(const double *q, const double *k, const double *v, double *o, double *lse, int64_t BH,
                          int64_t Tq, int64_t Tk, int64_t D, bool causal, double scale) {
  for (int64_t bh = 0; bh < BH; bh++) {
    const double *K = k + bh * Tk * D, *V = v + bh * Tk * D;
    for (int64_t i = 0; i < Tq; i++) {
      const double *qi = q + (bh * Tq + i) * D;
      double *oi = o + (bh * Tq + i) * D, m = -INFINITY, l = 0;
      for (int64_t d = 0; d < D; d++) oi[d] = 0;
      for (int64_t j = 0; j <= last_key(causal, i, Tk); j++) {   /* online softmax */
        double s = scale * dot(qi, K + j * D, D);
        if (s > m) {
          double r = exp(m - s);
          for (int64_t d = 0; d < D; d++) oi[d] *= r;
          l *= r;
          m = s;
        }
        double p = exp(s - m);
        l += p;
        for (int64_t d = 0; d < D; d++) oi[d] += p * V[j * D + d];
      }
      for (int64_t d = 0; d < D; d++) oi[d] /= l;
      lse[bh * Tq + i] = m + log(l);
    }
  }
}

/* P = exp(s - lse); dV = Pᵀ dO; dS = P (dO Vᵀ - rowsum(dO o)); dQ = scale dS K; dK = scale dSᵀ Q. */
static void flash_bwd_cpu(const double *q, const double *k, const double *v, const double *o, const double *lse,
                          const double *dout, double *dq, double *dk, double *dv, int64_t BH, int64_t Tq, int64_t Tk,
                          int64_t D, bool causal, double scale) {
  for (int64_t bh = 0; bh < BH; bh++) {
    const double *K = k + bh * Tk * D, *V = v + bh * Tk * D;
    double *dK = dk + bh * Tk * D, *dV = dv + bh * Tk * D;
    for (int64_t i = 0; i < Tq; i++) {
      int64_t r = bh * Tq + i;
      const double *qi = q + r * D, *gi = dout + r * D;
      double delta = dot(gi, o + r * D, D), *dqi = dq + r * D;
      for (int64_t j = 0; j <= last_key(causal, i, Tk); j++) {
        double p = exp(scale * dot(qi, K + j * D, D) - lse[r]);
        double ds = p * (dot(gi, V + j * D, D) - delta) * scale;
        for (int64_t d = 0; d < D; d++) {
          dV[j * D + d] += p * gi[d];
          dqi[d] += ds * K[j * D + d];
          dK[j * D + d] += ds * qi[d];
        }
      }
    }
  }
}

static em_tensor *zeros_f64(int n, const int64_t *shape) {
  em_tensor *t = em_empty(n, shape, EM_F64, (em_device){EM_CPU, 0});
  if (t) memset(em_data_ptr(t), 0, (size_t)em_numel(t) * sizeof(double));
  return t;
}

/* gin[i] = the f64 gradient as the input's dtype. */
static int cast_grads(em_tensor **g64, em_dtype dt, em_tensor **gin) {
  int rc = 0;
  for (int i = 0; i < 3; i++) {
    gin[i] = rc ? NULL : em_contiguous_as(g64[i], dt);
    if (!gin[i]) rc = -1;
    em_tensor_release(g64[i]);
  }
  if (rc)
    for (int i = 0; i < 3; i++) { em_tensor_release(gin[i]); gin[i] = NULL; }
  return rc;
}

static int flash_backward_cpu(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *o = n->saved[3], *lse = n->saved[4];
  const flash_ctx *c = n->ctx;
  em_tensor *g = em_contiguous_as(gout[0], EM_F64);
  if (!g) return -1;
  em_tensor *d[3] = {zeros_f64(4, q->shape), zeros_f64(4, k->shape), zeros_f64(4, v->shape)};
  int rc = d[0] && d[1] && d[2] ? 0 : -1;
  if (rc == 0)
    flash_bwd_cpu(em_data_ptr(q), em_data_ptr(k), em_data_ptr(v), em_data_ptr(o), em_data_ptr(lse),
                  em_data_ptr(g), em_data_ptr(d[0]), em_data_ptr(d[1]), em_data_ptr(d[2]),
                  q->shape[0] * q->shape[1], q->shape[2], k->shape[2], q->shape[3], c->causal, c->scale);
  em_tensor_release(g);
  if (rc) { for (int i = 0; i < 3; i++) em_tensor_release(d[i]); return -1; }
  return cast_grads(d, c->dtype, gin);
}

static int flash_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  if (n->saved[0]->device.type == EM_CPU) return flash_backward_cpu(n, gout, gin);
  em_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *o = n->saved[3], *lse = n->saved[4];
  const flash_ctx *c = n->ctx;
  em_tensor *g = em_to(gout[0], q->dtype, q->device);
  em_tensor *dout = g ? kernel_ready(g) : NULL;
  em_tensor_release(g);
  int64_t B = q->shape[0], H = q->shape[1], Tq = q->shape[2], Tk = k->shape[2], D = q->shape[3];
  int64_t dshape[3] = {B, H, Tq};
  /* delta (rowsum(dO * o)) is scratch of the three kernels: workspace in memory history */
  em_mem_category prev_cat = em_mem_set_category_override(EM_MEM_WORKSPACE);
  em_tensor *delta = dout ? em_empty(3, dshape, EM_F32, q->device) : NULL;
  em_mem_set_category_override(prev_cat);
  em_tensor *dq = delta ? bthd_empty(B, H, Tq, D, q->dtype, q->device) : NULL;
  em_tensor *dk = dq ? bthd_empty(B, H, Tk, D, q->dtype, q->device) : NULL;
  em_tensor *dv = dk ? bthd_empty(B, H, Tk, D, q->dtype, q->device) : NULL;
  int rc = dv ? em_flash_bwd_cuda(q, k, v, o, lse, dout, delta, dq, dk, dv, c->causal, (float)c->scale) : -1;
  em_tensor_release(dout); em_tensor_release(delta);
  if (rc) { em_tensor_release(dq); em_tensor_release(dk); em_tensor_release(dv); return -1; }
  gin[0] = dq; gin[1] = dk; gin[2] = dv;
  return 0;
}

/* The CPU forward: f64 copies of q, k, v (saved for backward), o and lse in
 * f64; *y is o as q0's dtype. 0 or -1 with the error set. */
static int flash_cpu(em_tensor *q0, em_tensor *k0, em_tensor *v0, bool causal, double scale, em_tensor **sv,
                     em_tensor **y) {
  em_tensor *q = sv[0] = em_contiguous_as(q0, EM_F64), *k = sv[1] = q ? em_contiguous_as(k0, EM_F64) : NULL;
  em_tensor *v = sv[2] = k ? em_contiguous_as(v0, EM_F64) : NULL;
  int64_t lshape[3] = {q0->shape[0], q0->shape[1], q0->shape[2]};
  em_tensor *o = sv[3] = v ? em_empty(4, q0->shape, EM_F64, q0->device) : NULL;
  em_tensor *lse = sv[4] = o ? em_empty(3, lshape, EM_F64, q0->device) : NULL;
  if (!lse) return -1;
  flash_fwd_cpu(em_data_ptr(q), em_data_ptr(k), em_data_ptr(v), em_data_ptr(o), em_data_ptr(lse),
                q->shape[0] * q->shape[1], q->shape[2], k->shape[2], q->shape[3], causal, scale);
  *y = em_contiguous_as(o, q0->dtype);
  return *y ? 0 : -1;
}

/* The CUDA forward: kernel-ready q, k, v, o and lse (f32) saved; *y is o. */
static int flash_cuda(em_tensor *q0, em_tensor *k0, em_tensor *v0, bool causal, double scale, em_tensor **sv,
                      em_tensor **y) {
  em_tensor *q = sv[0] = kernel_ready(q0), *k = sv[1] = q ? kernel_ready(k0) : NULL;
  em_tensor *v = sv[2] = k ? kernel_ready(v0) : NULL;
  int64_t B = q0->shape[0], H = q0->shape[1], Tq = q0->shape[2], D = q0->shape[3];
  int64_t lshape[3] = {B, H, Tq};
  em_tensor *o = sv[3] = v ? bthd_empty(B, H, Tq, D, q0->dtype, q0->device) : NULL;
  em_tensor *lse = sv[4] = o ? em_empty(3, lshape, EM_F32, q0->device) : NULL;
  if (!lse || em_flash_fwd_cuda(q, k, v, o, lse, causal, (float)scale)) return -1;
  *y = em_tensor_retain(o);
  return 0;
}

static em_tensor *flash_op(em_tensor *q0, em_tensor *k0, em_tensor *v0, bool causal, double scale,
                           em_tensor **lse_out) {
  em_tensor *sv[5] = {NULL}, *y = NULL;   /* saved: q, k, v, o, lse */
  int rc = q0->device.type == EM_CPU ? flash_cpu(q0, k0, v0, causal, scale, sv, &y)
                                     : flash_cuda(q0, k0, v0, causal, scale, sv, &y);
  flash_ctx *c = NULL;
  if (rc == 0 && em_grad_needed(3, (em_tensor *[]){q0, k0, v0}) && !(c = calloc(1, sizeof *c))) {
    em_error_oom("out of memory: " OP " (a node's attributes)");
    rc = -1;
  }
  if (rc == 0) {
    em_node *n;
    y = em_op_record(y, &n, OP, flash_backward, 3, (em_tensor *[]){q0, k0, v0}, 5, sv);
    if (n) { *c = (flash_ctx){causal, scale, q0->dtype}; n->ctx = c; n->ctx_free = free; c = NULL; }
    if (!y) rc = -1;
  }
  free(c);
  /* the log-sum-exp for callers: f32 as the kernels keep it (f64 for f64 inputs) */
  em_tensor *lse = NULL;
  if (rc == 0 && lse_out && !(lse = em_contiguous_as(sv[4], q0->dtype == EM_F64 ? EM_F64 : EM_F32))) rc = -1;
  for (int i = 0; i < 5; i++) em_tensor_release(sv[i]);
  if (rc) { em_tensor_release(y); em_tensor_release(lse); return NULL; }
  if (lse_out) *lse_out = lse;
  return y;
}

em_tensor *em_flash_attention(em_tensor *q, em_tensor *k, em_tensor *v, bool causal, double scale,
                              em_tensor **lse_out) {
  EM_OP_SCOPE(OP);
  if (lse_out) *lse_out = NULL;
  em_op_args l;
  if (em_op_autocast(&l, EM_AUTOCAST_LOWER, 3, (em_tensor *[]){q, k, v})) return NULL;
  em_tensor *out = NULL;
  if (flash_validate(l.t[0], l.t[1], l.t[2], scale) == 0) {
    if (scale <= 0) scale = 1.0 / sqrt((double)l.t[0]->shape[3]);
    out = flash_op(l.t[0], l.t[1], l.t[2], causal, scale, lse_out);
  }
  em_op_args_release(&l);
  return out;
}

bool em_flash_applies(em_tensor *q, em_tensor *k, em_tensor *v) {
  em_dtype dt = em_autocast_enabled() && em_dtype_is_float(q->dtype) ? em_autocast_dtype() : q->dtype;
  if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || q->device.type != EM_CUDA || !half_dtype(dt)) return false;
  if (k->dtype != q->dtype || v->dtype != q->dtype) return false;
  if (k->device.type != EM_CUDA || v->device.type != EM_CUDA || k->device.index != q->device.index ||
      v->device.index != q->device.index)
    return false;
  for (int d = 0; d < 2; d++)
    if (k->shape[d] != q->shape[d] || v->shape[d] != q->shape[d]) return false;
  return k->shape[3] == q->shape[3] && v->shape[3] == q->shape[3] && v->shape[2] == k->shape[2] &&
         k->shape[2] > 0 && em_flash_supported_dim(q->shape[3]);
}

em_tensor *em_attention(em_tensor *q, em_tensor *k, em_tensor *v, bool causal, double scale) {
  if (em_flash_applies(q, k, v)) return em_flash_attention(q, k, v, causal, scale, NULL);
  return em_attention_naive(q, k, v, causal, scale);
}
