/* FlashAttention: softmax(q kᵀ · scale [+ causal mask]) v computed tile by
 * tile, never materialising the (Tq, Tk) scores: on CUDA by the kernels
 * (kernels/flash_fwd.cu, flash_bwd.cu, flash_decode.cu), on the CPU by the
 * tiled loops of engine/ops/flash_cpu.c. Saves q, k, v, o and the rows'
 * log-sum-exp (B·H·Tq values) for backward, where the naive composition
 * saves the T×T probabilities twice (f32 softmax output, bf16 matmul input).
 *
 * Inputs: q (B, H, Tq, D), k and v (B, Hkv, Tk, D) with H a multiple of Hkv
 * (grouped-query attention: head h reads kv head h / (H / Hkv); Hkv = H is
 * plain multi-head attention), or 3-D (B, T, D) as one head (viewed as
 * (B, 1, T, D) here, so the views carry the gradients). D in {16, 32, 64,
 * 80, 96, 128, 256}, on the CPU too, so a script written on the CPU runs on
 * the GPU. Causal masks are top-left (PyTorch's is_causal) or bottom-right
 * aligned (em_causal, ember/ops.h).
 *
 * CUDA: bf16 or f16 (under ember.autocast f32 inputs are lowered to the
 * region's dtype first, as attention is on the lower-precision list), or f32
 * outside autocast: the same kernels on the TF32 tensor cores (operands
 * rounded to TF32, f32 accumulation and softmax; the decode kernel is f32
 * throughout). impl "auto" takes them for f32 only while
 * ember.backends.tf32 is on, as the f32 matmuls do; off, it keeps the exact
 * f32 naive composition (docs/flash.md, "f32 inputs on CUDA"). Any
 * strides over B, H and T: the kernels read the (B, T, H, D) layout that the
 * head split of a linear projection produces without a copy. o, dq, dk and
 * dv are allocated as (B, T, H, D) memory viewed as (B, H, T, D), so merging
 * the heads back (transpose + reshape) is free.
 *
 * CPU: any float dtype; f32 arithmetic for f32, bf16 and f16 (converted to
 * f32 once), f64 for f64 — which makes the tiled code also the path the op
 * registry's grad mode checks against finite differences, and the reference
 * its eval mode compares the kernels with.
 *
 * em_attention picks the implementation: flash where em_flash_applies (CUDA
 * with a half dtype after autocast, or f32 with TF32 allowed; the CPU from
 * EM_FLASH_CPU_MIN_TK keys), the naive composition everywhere else.
 *
 * em_flash_attention_rope (F.flash_attention's rope option, issue 16 item 5:
 * fewer passes) takes q and k un-rotated. On CUDA with bf16/f16 4-D inputs
 * (and no autocast cast) it is one node: the forward rotates q and k with
 * the rope kernel (no node of its own) and runs flash on them; the backward
 * runs flash's backward, whose wg2 kernels on the short-sequence schedule
 * rotate dq and dk back in their epilogues (em_flash_bwd_rope_cuda) — no
 * rope launch, no second read and write of dq and dk — and where other
 * kernels ran, the rope kernel rotates them after. Everywhere else it is the
 * composition em_rope_qk then em_flash_attention. All paths give the
 * composition's bits (rope_math.cuh). */
#include <math.h>
#include <stdio.h>
#include "flash_cpu.h"
#include "flash_tensors.h"
#include "op.h"
#include "cost.h"

#define OP "flash_attention"

static bool half_dtype(em_dtype dt) { return dt == EM_BF16 || dt == EM_F16; }
/* The dtypes the CUDA kernels take: bf16, f16 (mma.m16n8k16) and f32 (TF32 mma.m16n8k8). */
static bool cuda_dtype(em_dtype dt) { return half_dtype(dt) || dt == EM_F32; }

/* The head dims the op accepts: the kernels' on CUDA; on the CPU the same
 * list (a CPU-only build, whose backend stub supports nothing, included). */
static bool supported_dim(em_device dev, int64_t d) {
  if (dev.type == EM_CUDA) return em_flash_supported_dim(d);
  return d == 16 || d == 32 || d == 64 || d == 80 || d == 96 || d == 128 || d == 256;
}

/* The checks shared by the op and em_flash_applies; dt is the dtype the op
 * will compute in (q's, or the autocast region's). 0, or -1 with the error set. */
static int flash_validate(em_tensor *q, em_tensor *k, em_tensor *v, em_dtype dt, em_causal causal, double scale) {
  char s1[160], s2[160], s3[160];
  em_tensor *ts[3] = {q, k, v};
  const char *names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; i++) {
    if (ts[i]->ndim != 4 && ts[i]->ndim != 3)
      return em_error(OP ": expected %s of shape (B, H, T, D) or (B, T, D), got %s", names[i],
                      em_shape_str(ts[i]->ndim, ts[i]->shape, s1, 160));
    if (em_check_same_device(OP, q, ts[i])) return -1;
    if (ts[i]->dtype != q->dtype)
      return em_error(OP ": expected q, k and v to have the same dtype, got %s, %s and %s",
                      em_dtype_name(q->dtype), em_dtype_name(k->dtype), em_dtype_name(v->dtype));
  }
  if (em_check_float(OP, "q", q)) return -1;
  if (q->device.type == EM_CUDA && !cuda_dtype(dt))
    return em_error(OP ": expected bf16, f16 or f32 q, k and v on CUDA, got %s", em_dtype_name(dt));
  em_shape_str(q->ndim, q->shape, s1, 160);
  em_shape_str(k->ndim, k->shape, s2, 160);
  em_shape_str(v->ndim, v->shape, s3, 160);
  if (k->ndim != q->ndim || v->ndim != q->ndim)
    return em_error(OP ": expected q, k and v with the same number of dims, got %s, %s and %s", s1, s2, s3);
  const int n = q->ndim, t = n - 2;   /* dims of T and D: 2, 3 (4-D) or 1, 2 (3-D) */
  bool ok = k->shape[0] == q->shape[0] && v->shape[0] == q->shape[0] && k->shape[n - 1] == q->shape[n - 1] &&
            v->shape[n - 1] == q->shape[n - 1] && v->shape[t] == k->shape[t];
  if (n == 4) ok = ok && k->shape[1] == v->shape[1] && k->shape[1] > 0 && q->shape[1] % k->shape[1] == 0;
  if (!ok)
    return n == 4 ? em_error(OP ": expected q (B, H, Tq, D), k and v (B, Hkv, Tk, D) with H a multiple of Hkv, "
                                "got %s, %s and %s", s1, s2, s3)
                  : em_error(OP ": expected q (B, Tq, D), k and v (B, Tk, D), got %s, %s and %s", s1, s2, s3);
  const int64_t D = q->shape[n - 1], Tq = q->shape[t], Tk = k->shape[t];
  if (!supported_dim(q->device, D))
    return em_error(OP ": no kernel for head dim %lld (supported: 16, 32, 64, 80, 96, 128, 256)", (long long)D);
  if (Tk == 0 && Tq > 0) return em_error(OP ": expected at least one key, got Tk = 0 (k has shape %s)", s2);
  if (causal != EM_CAUSAL_NONE && causal != EM_CAUSAL_TOP_LEFT && causal != EM_CAUSAL_BOTTOM_RIGHT)
    return em_error(OP ": expected causal none (0), top-left (1) or bottom-right (2), got %d", (int)causal);
  if (causal == EM_CAUSAL_BOTTOM_RIGHT && Tq > Tk)
    return em_error(OP ": expected Tq <= Tk for bottom-right causal alignment (the first Tq - Tk queries would "
                       "see no key), got Tq = %lld and Tk = %lld", (long long)Tq, (long long)Tk);
  int64_t rows = q->shape[0] * (n == 4 ? q->shape[1] : 1);
  if (Tq > INT32_MAX || Tk > INT32_MAX || rows > INT32_MAX)
    return em_error(OP ": sizes past 2^31 rows are not supported, got %s", s1);
  if (isnan(scale) || isinf(scale)) return em_error(OP ": expected a finite scale, got %g", scale);
  return 0;
}

/* The kernels read 16-byte rows: last dim contiguous, other strides multiples
 * of 8 elements, data 16-byte aligned. Anything else is copied once. */
em_tensor *em_flash_kernel_ready(em_tensor *t) {
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
em_tensor *em_flash_bthd_empty(int64_t b, int64_t h, int64_t t, int64_t d, em_dtype dt, em_device dev) {
  int64_t shape[4] = {b, t, h, d};
  em_tensor *m = em_empty(4, shape, dt, dev);
  em_tensor *v = m ? em_transpose(m, 1, 2) : NULL;
  em_tensor_release(m);
  return v;
}

/* t (B, H, T, D) as dtype dt in fresh (B, T, H, D) memory; t retained when already dt. */
static em_tensor *bthd_as(em_tensor *t, em_dtype dt) {
  if (!t || t->dtype == dt) return t ? em_tensor_retain(t) : NULL;
  em_tensor *r = em_flash_bthd_empty(t->shape[0], t->shape[1], t->shape[2], t->shape[3], dt, t->device);
  if (r && em_copy_(r, t)) { em_tensor_release(r); r = NULL; }
  return r;
}

/* saved: q, k, v, o, lse (and pos under the rope option); the op's causal mode, scale, input dtype and rope
 * theta ride in n->ctx. */
typedef struct { em_causal causal; double scale; em_dtype dtype; bool rope; double theta; } flash_ctx;

/* The rope option's node: its inputs are the un-rotated q and k (the forward ran on rotated ones), pos saved. */
typedef struct { em_tensor *q, *k, *pos; double theta; } flash_rope_in;

/* ---- the CPU path (engine/ops/flash_cpu.c) ---- */

/* An operand as the CPU loops read it: the compute dtype, last dim
 * contiguous, rows at least D apart (BLAS's leading dimension). */
static em_tensor *cpu_ready(em_tensor *t, em_dtype cdt) {
  bool ok = t->dtype == cdt && t->stride[3] == 1 && (t->stride[2] >= t->shape[3] || t->shape[2] <= 1);
  return ok ? em_tensor_retain(t) : em_contiguous_as(t, cdt);
}

static em_flash_mat mat_of(em_tensor *t) {
  return (em_flash_mat){em_data_ptr(t), t->stride[0], t->stride[1], t->shape[2] <= 1 ? t->shape[3] : t->stride[2]};
}

static em_flash_cpu_args cpu_args(em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *o, em_tensor *lse,
                                  em_causal causal, double scale) {
  return (em_flash_cpu_args){.q = mat_of(q), .k = mat_of(k), .v = mat_of(v), .o = mat_of(o),
                             .lse = em_data_ptr(lse), .B = q->shape[0], .H = q->shape[1], .Hkv = k->shape[1],
                             .Tq = q->shape[2], .Tk = k->shape[2], .D = q->shape[3], .causal = causal,
                             .scale = scale, .f64 = q->dtype == EM_F64};
}

/* The CPU forward: q, k, v in the compute dtype (f64 for f64, else f32), o
 * and lse in it too, saved; *y is o as q0's dtype. 0 or -1 with the error set. */
static int flash_cpu(em_tensor *q0, em_tensor *k0, em_tensor *v0, em_causal causal, double scale, em_tensor **sv,
                     em_tensor **y) {
  em_dtype cdt = q0->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *q = sv[0] = cpu_ready(q0, cdt), *k = sv[1] = q ? cpu_ready(k0, cdt) : NULL;
  em_tensor *v = sv[2] = k ? cpu_ready(v0, cdt) : NULL;
  int64_t lshape[3] = {q0->shape[0], q0->shape[1], q0->shape[2]};
  em_tensor *o = sv[3] = v ? em_flash_bthd_empty(q0->shape[0], q0->shape[1], q0->shape[2], q0->shape[3], cdt,
                                                 q0->device)
                           : NULL;
  em_tensor *lse = sv[4] = o ? em_empty(3, lshape, cdt, q0->device) : NULL;
  if (!lse) return -1;
  em_flash_cpu_args a = cpu_args(q, k, v, o, lse, causal, scale);
  if (em_flash_cpu_fwd(&a)) return -1;
  *y = bthd_as(o, q0->dtype);
  return *y ? 0 : -1;
}

static int flash_backward_cpu(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *o = n->saved[3], *lse = n->saved[4];
  const flash_ctx *c = n->ctx;
  em_dtype cdt = q->dtype;
  em_tensor *g = cpu_ready(gout[0], cdt);
  em_tensor *d[3] = {NULL};
  d[0] = g ? em_flash_bthd_empty(q->shape[0], q->shape[1], q->shape[2], q->shape[3], cdt, q->device) : NULL;
  d[1] = d[0] ? em_flash_bthd_empty(k->shape[0], k->shape[1], k->shape[2], k->shape[3], cdt, k->device) : NULL;
  d[2] = d[1] ? em_flash_bthd_empty(v->shape[0], v->shape[1], v->shape[2], v->shape[3], cdt, v->device) : NULL;
  int rc = -1;
  if (d[2]) {
    em_flash_cpu_args a = cpu_args(q, k, v, o, lse, c->causal, c->scale);
    a.dout = mat_of(g); a.dq = mat_of(d[0]); a.dk = mat_of(d[1]); a.dv = mat_of(d[2]);
    rc = em_flash_cpu_bwd(&a);
  }
  em_tensor_release(g);
  for (int i = 0; i < 3; i++) {
    gin[i] = rc == 0 ? bthd_as(d[i], c->dtype) : NULL;
    if (!gin[i]) rc = -1;
    em_tensor_release(d[i]);
  }
  if (rc)
    for (int i = 0; i < 3; i++) { em_tensor_release(gin[i]); gin[i] = NULL; }
  return rc;
}

/* ---- declared cost (the profiler's roofline) ---- */

/* (query, key) pairs a head computes: all of them, or those the causal mask keeps. */
static double flash_pairs(int64_t tq, int64_t tk, em_causal causal) {
  if (causal == EM_CAUSAL_NONE) return (double)tq * (double)tk;
  int64_t shift = causal == EM_CAUSAL_BOTTOM_RIGHT ? tk - tq : 0;   /* row i sees keys j <= i + shift */
  double n = 0;
  for (int64_t i = 0; i < tq; i++) n += (double)EM_MAX(0, EM_MIN(tk, i + shift + 1));
  return n;
}

/* Forward: S = QKᵀ and O = PV, 2 D FLOPs a pair each; q, k, v read, o and lse written.
 * Backward (recomputes S): dV = PᵀdO, dP = dO Vᵀ, dQ = dS K, dK = dSᵀQ and S, 5 matmuls, 2.5x the
 * forward; q, k, v, o, dO, lse read, dq, dk, dv written (dO the size of q: twice the forward's q, k, v, o). */
static void flash_cost(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, bool backward) {
  if (!EM_COSTING()) return;
  int nd = q->ndim;
  int64_t tq = q->shape[nd - 2], tk = k->shape[nd - 2], d = q->shape[nd - 1];
  double heads = (double)em_shape_numel(nd - 2, q->shape);
  double io = em_cost_bytes(3, (em_tensor *const[]){q, k, v}) + em_cost_nbytes(q);   /* + o (q's size) */
  double lse = heads * (double)tq * 4;
  double mm = (backward ? 10.0 : 4.0) * heads * flash_pairs(tq, tk, causal) * (double)d;
  em_op_cost_add(backward ? 2 * io + lse : io + lse, mm, em_cost_gemm_class(q->dtype, q->device));
}

/* ---- the CUDA path (kernels/flash_*.cu) ---- */

/* Under the rope option, dq and dk (gradients of the rotated q and k) rotated back in place of gin[0], gin[1]. */
static int rope_back(em_node *n, em_tensor **gin) {
  em_tensor *g[2];
  if (em_rope_pair(gin[0], gin[1], n->saved[5], ((const flash_ctx *)n->ctx)->theta, -1.0, g)) return -1;
  for (int i = 0; i < 2; i++) { em_tensor_release(gin[i]); gin[i] = g[i]; }
  return 0;
}

static int flash_backward_any(em_node *n, em_tensor **gout, em_tensor **gin);

static int flash_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  const flash_ctx *c = n->ctx;
  int rc = flash_backward_any(n, gout, gin);   /* 1: dq and dk already rotated back (the rope option's kernels) */
  if (rc == 0 && c->rope) rc = rope_back(n, gin);
  if (rc < 0) {
    for (int i = 0; i < 3; i++) { em_tensor_release(gin[i]); gin[i] = NULL; }
    return -1;
  }
  return 0;
}

/* 0, 1 (the rope option's dq and dk left rotated back by the kernels), or -1 with gin[] NULL. */
static int flash_backward_any(em_node *n, em_tensor **gout, em_tensor **gin) {
  flash_cost(n->saved[0], n->saved[1], n->saved[2], ((const flash_ctx *)n->ctx)->causal, true);
  if (n->saved[0]->device.type == EM_CPU) return flash_backward_cpu(n, gout, gin);
  em_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *o = n->saved[3], *lse = n->saved[4];
  const flash_ctx *c = n->ctx;
  em_tensor *g = em_to(gout[0], q->dtype, q->device);
  em_tensor *dout = g ? em_flash_kernel_ready(g) : NULL;
  em_tensor_release(g);
  int64_t B = q->shape[0], H = q->shape[1], Hkv = k->shape[1], Tq = q->shape[2], Tk = k->shape[2], D = q->shape[3];
  int64_t dshape[3] = {B, H, Tq};
  /* delta (rowsum(dO * o)) is scratch of the three kernels: workspace in memory history */
  em_mem_category prev_cat = em_mem_set_category_override(EM_MEM_WORKSPACE);
  em_tensor *delta = dout ? em_empty(3, dshape, EM_F32, q->device) : NULL;
  em_mem_set_category_override(prev_cat);
  em_tensor *dq = delta ? em_flash_bthd_empty(B, H, Tq, D, q->dtype, q->device) : NULL;
  em_tensor *dk = dq ? em_flash_bthd_empty(B, Hkv, Tk, D, q->dtype, q->device) : NULL;
  em_tensor *dv = dk ? em_flash_bthd_empty(B, Hkv, Tk, D, q->dtype, q->device) : NULL;
  /* no queries: nothing reaches k or v, and the kernels write nothing (dk and dv are uninitialised until filled) */
  int rc = !dv ? -1
           : Tq == 0 ? (em_fill_(dk, 0.0) || em_fill_(dv, 0.0) ? -1 : 0)
           : c->rope ? em_flash_bwd_rope_cuda(q, k, v, o, lse, dout, delta, dq, dk, dv, c->causal, (float)c->scale,
                                              n->saved[5], c->theta)
                     : em_flash_bwd_cuda(q, k, v, o, lse, dout, delta, dq, dk, dv, c->causal, (float)c->scale);
  em_tensor_release(dout); em_tensor_release(delta);
  if (rc < 0) { em_tensor_release(dq); em_tensor_release(dk); em_tensor_release(dv); return -1; }
  gin[0] = dq; gin[1] = dk; gin[2] = dv;
  return rc;
}

/* The CUDA forward: kernel-ready q, k, v, o and lse (f32) saved; *y is o. */
static int flash_cuda(em_tensor *q0, em_tensor *k0, em_tensor *v0, em_causal causal, double scale, em_tensor **sv,
                      em_tensor **y) {
  em_tensor *q = sv[0] = em_flash_kernel_ready(q0), *k = sv[1] = q ? em_flash_kernel_ready(k0) : NULL;
  em_tensor *v = sv[2] = k ? em_flash_kernel_ready(v0) : NULL;
  int64_t B = q0->shape[0], H = q0->shape[1], Tq = q0->shape[2], D = q0->shape[3];
  int64_t lshape[3] = {B, H, Tq};
  em_tensor *o = sv[3] = v ? em_flash_bthd_empty(B, H, Tq, D, q0->dtype, q0->device) : NULL;
  em_tensor *lse = sv[4] = o ? em_empty(3, lshape, EM_F32, q0->device) : NULL;
  if (!lse || em_flash_fwd_cuda(q, k, v, o, lse, causal, (float)scale)) return -1;
  *y = em_tensor_retain(o);
  return 0;
}

/* 4-D validated inputs: the forward on their device and the autograd node (under the rope option r, q0 and k0
 * are r's q and k rotated, and the node's inputs r's). */
static em_tensor *flash_op(em_tensor *q0, em_tensor *k0, em_tensor *v0, em_causal causal, double scale,
                           em_tensor **lse_out, const flash_rope_in *r) {
  em_tensor *sv[6] = {NULL}, *y = NULL;   /* saved: q, k, v, o, lse (, pos) */
  em_tensor *in[3] = {r ? r->q : q0, r ? r->k : k0, v0};
  flash_cost(q0, k0, v0, causal, false);
  int rc = q0->device.type == EM_CPU ? flash_cpu(q0, k0, v0, causal, scale, sv, &y)
                                     : flash_cuda(q0, k0, v0, causal, scale, sv, &y);
  flash_ctx *c = NULL;
  if (rc == 0 && em_grad_needed(3, in) && !(c = calloc(1, sizeof *c))) {
    em_error_oom("out of memory: " OP " (a node's attributes)");
    rc = -1;
  }
  if (rc == 0) {
    em_node *n;
    sv[5] = r ? r->pos : NULL;
    y = em_op_record(y, &n, OP, flash_backward, 3, in, 6, sv);
    sv[5] = NULL;   /* borrowed */
    if (n) {
      *c = (flash_ctx){causal, scale, q0->dtype, r != NULL, r ? r->theta : 0};
      n->ctx = c; n->ctx_free = free; c = NULL;
    }
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

/* (B, T, D) inputs as one head: (B, 1, T, D) views in, the head dim squeezed out of o and lse. */
static em_tensor *flash_op_3d(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale,
                              em_tensor **lse_out) {
  em_tensor *q4 = em_unsqueeze(q, 1), *k4 = q4 ? em_unsqueeze(k, 1) : NULL, *v4 = k4 ? em_unsqueeze(v, 1) : NULL;
  em_tensor *lse4 = NULL, *o4 = v4 ? flash_op(q4, k4, v4, causal, scale, lse_out ? &lse4 : NULL, NULL) : NULL;
  em_tensor *o = o4 ? em_squeeze(o4, 1) : NULL, *lse = NULL;
  if (o && lse_out && !(lse = em_squeeze(lse4, 1))) { em_tensor_release(o); o = NULL; }
  em_tensor *tmp[5] = {q4, k4, v4, o4, lse4};
  for (int i = 0; i < 5; i++) em_tensor_release(tmp[i]);
  if (o && lse_out) *lse_out = lse;
  return o;
}

em_tensor *em_flash_attention(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale,
                              em_tensor **lse_out) {
  EM_OP_SCOPE(OP);
  if (lse_out) *lse_out = NULL;
  em_op_args l;
  if (em_op_autocast(&l, EM_AUTOCAST_LOWER, 3, (em_tensor *[]){q, k, v})) return NULL;
  em_tensor *out = NULL;
  if (flash_validate(l.t[0], l.t[1], l.t[2], l.t[0]->dtype, causal, scale) == 0) {
    if (scale <= 0) scale = 1.0 / sqrt((double)l.t[0]->shape[l.t[0]->ndim - 1]);
    out = l.t[0]->ndim == 3 ? flash_op_3d(l.t[0], l.t[1], l.t[2], causal, scale, lse_out)
                            : flash_op(l.t[0], l.t[1], l.t[2], causal, scale, lse_out, NULL);
  }
  em_op_args_release(&l);
  return out;
}

/* The rope option's one-node path: CUDA, 4-D q, k, v of one half dtype that autocast leaves as they are (a cast
 * would come after the rotation in the composition), integer positions of the kernels' dtypes, and inputs flash
 * takes (else the composition reports the error). */
static bool rope_one_node(em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *pos, em_causal causal) {
  if (q->device.type != EM_CUDA || q->ndim != 4 || !half_dtype(q->dtype)) return false;
  if (k->dtype != q->dtype || v->dtype != q->dtype || k->ndim != 4 || v->ndim != 4) return false;
  if (em_autocast_enabled() && em_autocast_dtype() != q->dtype) return false;
  if (pos->dtype != EM_I32 && pos->dtype != EM_I64) return false;
  return flash_validate(q, k, v, q->dtype, causal, 1.0) == 0;
}

em_tensor *em_flash_attention_rope(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale,
                                   em_tensor *pos, double theta, em_tensor **lse_out) {
  if (lse_out) *lse_out = NULL;
  if (em_rope_check(OP, "q", q, pos, theta) || em_rope_check(OP, "k", k, pos, theta)) return NULL;
  em_tensor *qr = NULL, *kr = NULL, *o = NULL;
  if (!rope_one_node(q, k, v, pos, causal)) {   /* the composition: two nodes */
    if (em_rope_qk(q, k, pos, theta, &qr, &kr)) return NULL;
    o = em_flash_attention(qr, kr, v, causal, scale, lse_out);
  } else {
    bool was = em_set_grad_enabled(false);     /* the rotation is this op's node's, not rope_qk's */
    int rc = em_rope_qk(q, k, pos, theta, &qr, &kr);
    em_set_grad_enabled(was);
    if (rc) return NULL;
    EM_OP_SCOPE(OP);
    if (isnan(scale) || isinf(scale)) {
      em_error(OP ": expected a finite scale, got %g", scale);
    } else {
      if (scale <= 0) scale = 1.0 / sqrt((double)q->shape[3]);
      o = flash_op(qr, kr, v, causal, scale, lse_out, &(flash_rope_in){q, k, pos, theta});
    }
  }
  em_tensor_release(qr);
  em_tensor_release(kr);
  return o;
}

int em_flash_fwd_choice(int mode) { return em_flash_fwd_kernel(mode); }
int em_flash_bwd_choice(int mode) { return em_flash_bwd_kernel(mode); }

bool em_flash_applies(em_tensor *q, em_tensor *k, em_tensor *v) {
  em_dtype dt = em_autocast_enabled() && em_dtype_is_float(q->dtype) ? em_autocast_dtype() : q->dtype;
  if ((q->ndim != 3 && q->ndim != 4) || k->ndim != q->ndim || v->ndim != q->ndim) return false;
  /* f32 runs on the TF32 tensor cores: auto takes it only where f32 matmuls may use TF32 too */
  if (q->device.type == EM_CUDA && !(half_dtype(dt) || (dt == EM_F32 && em_cuda_allow_tf32()))) return false;
  if (q->device.type == EM_CPU && k->shape[q->ndim - 2] < EM_FLASH_CPU_MIN_TK) return false;
  return flash_validate(q, k, v, dt, EM_CAUSAL_NONE, 1.0) == 0;
}

em_tensor *em_attention(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale) {
  if (em_flash_applies(q, k, v)) return em_flash_attention(q, k, v, causal, scale, NULL);
  return em_attention_naive(q, k, v, causal, scale);
}
