/* swiglu(a, b) = silu(a) * b = a * sigmoid(a) * b, the gate of a SwiGLU FFN
 * (w2(silu(w1 x) ⊙ w3 x)).
 *
 * Fused so the FFN does not keep silu(a) alive for backward: only a and b
 * are saved, and one pass computes both gradients with s = sigmoid(a):
 *   ga = g * b * s * (1 + a * (1 - s))      (d silu / da)
 *   gb = g * a * s
 * a and b must have the same shape and dtype (no broadcasting: the two FFN
 * projections always agree). Math in f32 (f64 for f64), result in a's dtype.
 * On CUDA (kernels/swiglu.cu) forward and backward are one vectorised kernel
 * each, gradients written directly in a's dtype. On the CPU both are one
 * pass over contiguous memory, split into element ranges over the threads,
 * with the SIMD exp of vec_math.h for f32. */
#include <stdio.h>
#include "op.h"
#include "cost.h"
#include "parallel.h"
#include "stream.h"
#include "vec_math.h"

/* Element ranges [i0, i1) of the forward (g, ga, gb NULL) or the backward. */
typedef struct { const void *a, *b, *g; void *y, *ga, *gb; bool f64, stream; } swiglu_job;

static int swiglu_validate(em_tensor *a, em_tensor *b) {
  char s1[160], s2[160];
  if (em_check_float("swiglu", "a", a) || em_check_float("swiglu", "b", b)) return -1;
  if (em_check_same_device("swiglu", a, b)) return -1;
  if (a->dtype != b->dtype)
    return em_error("swiglu: expected a and b to have the same dtype, got %s and %s", em_dtype_name(a->dtype),
                    em_dtype_name(b->dtype));
  if (!em_same_shape(a, b))
    return em_error("swiglu: expected a and b to have the same shape, got %s and %s",
                    em_shape_str(a->ndim, a->shape, s1, 160), em_shape_str(b->ndim, b->shape, s2, 160));
  return 0;
}

EM_SIMD_CLONES static void swiglu_fwd_f32(const float *a, const float *b, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = a[i] / (1.0f + em_exp_f32(-a[i])) * b[i];
}

static void swiglu_fwd_f64(const double *a, const double *b, double *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = a[i] / (1.0 + exp(-a[i])) * b[i];
}

/* One loop per set of wanted gradients, so each is a straight SIMD loop. */
EM_SIMD_CLONES static void swiglu_bwd_f32(const float *a, const float *b, const float *g, float *ga, float *gb, int64_t n) {
#define SIG float s = 1.0f / (1.0f + em_exp_f32(-a[i]))
#define GA ga[i] = g[i] * b[i] * s * (1.0f + a[i] * (1.0f - s))
#define GB gb[i] = g[i] * a[i] * s
  if (ga && gb) for (int64_t i = 0; i < n; i++) { SIG; GA; GB; }
  else if (ga) for (int64_t i = 0; i < n; i++) { SIG; GA; }
  else if (gb) for (int64_t i = 0; i < n; i++) { SIG; GB; }
#undef SIG
#undef GA
#undef GB
}

static void swiglu_bwd_f64(const double *a, const double *b, const double *g, double *ga, double *gb, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double s = 1.0 / (1.0 + exp(-a[i]));
    if (ga) ga[i] = g[i] * b[i] * s * (1.0 + a[i] * (1.0 - s));
    if (gb) gb[i] = g[i] * a[i] * s;
  }
}

static void swiglu_piece(const swiglu_job *j, int64_t i0, int64_t i1);

/* f32 with large outputs: pieces of STREAM_N computed into buffers and
 * streamed out (engine/stream.h); else straight into the outputs. */
#define STREAM_N (EM_STREAM_PIECE / 4)
static void swiglu_range(void *ctx, int64_t i0, int64_t i1) {
  const swiglu_job *j = ctx;
  if (!j->stream) { swiglu_piece(j, i0, i1); return; }
  _Alignas(64) float y[STREAM_N], ga[STREAM_N], gb[STREAM_N];
  for (int64_t p = i0; p < i1; p += STREAM_N) {
    int64_t n = EM_MIN(STREAM_N, i1 - p);
    swiglu_job b = *j;                /* the same inputs at p, the outputs into the buffers at 0 */
    b.a = (const float *)j->a + p;
    b.b = (const float *)j->b + p;
    if (j->g) b.g = (const float *)j->g + p;
    b.y = j->y ? y : NULL;
    b.ga = j->ga ? ga : NULL;
    b.gb = j->gb ? gb : NULL;
    swiglu_piece(&b, 0, n);
    if (j->y) em_stream_copy((float *)j->y + p, y, n * 4);
    if (j->ga) em_stream_copy((float *)j->ga + p, ga, n * 4);
    if (j->gb) em_stream_copy((float *)j->gb + p, gb, n * 4);
  }
}

static void swiglu_piece(const swiglu_job *j, int64_t i0, int64_t i1) {
  int64_t n = i1 - i0;
#define AT(p, T) ((p) ? (T *)(p) + i0 : NULL)
  if (!j->g && j->f64) swiglu_fwd_f64(AT(j->a, const double), AT(j->b, const double), AT(j->y, double), n);
  else if (!j->g) swiglu_fwd_f32(AT(j->a, const float), AT(j->b, const float), AT(j->y, float), n);
  else if (j->f64)
    swiglu_bwd_f64(AT(j->a, const double), AT(j->b, const double), AT(j->g, const double), AT(j->ga, double),
                   AT(j->gb, double), n);
  else
    swiglu_bwd_f32(AT(j->a, const float), AT(j->b, const float), AT(j->g, const float), AT(j->ga, float),
                   AT(j->gb, float), n);
#undef AT
}

static em_tensor *swiglu_cpu(em_tensor *a, em_tensor *b) {
  em_dtype ct = a->dtype == EM_F64 ? EM_F64 : EM_F32;
  em_tensor *ac = em_contiguous_as(a, ct);
  em_tensor *bc = ac ? em_contiguous_as(b, ct) : NULL;
  em_tensor *y = bc ? em_empty(a->ndim, a->shape, ct, a->device) : NULL, *out = NULL;
  if (y) {
    swiglu_job j = {em_data_ptr(ac), em_data_ptr(bc), NULL, em_data_ptr(y), NULL, NULL, ct == EM_F64,
                    ct == EM_F32 && em_stream_wanted(em_numel(a) * 4)};
    em_parallel_for(em_numel(a), em_grain(16), swiglu_range, &j);
    out = em_contiguous_as(y, a->dtype);
  }
  em_tensor_release(ac); em_tensor_release(bc); em_tensor_release(y);
  return out;
}

static em_tensor *swiglu_cuda(em_tensor *a, em_tensor *b) {
  em_tensor *ac = em_contiguous(a), *bc = ac ? em_contiguous(b) : NULL;
  em_tensor *y = bc ? em_empty(a->ndim, a->shape, a->dtype, a->device) : NULL;
  if (y && em_swiglu_fwd_cuda(ac, bc, y)) { em_tensor_release(y); y = NULL; }
  em_tensor_release(ac); em_tensor_release(bc);
  return y;
}

static int swiglu_backward_cuda(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *a = n->saved[0], *b = n->saved[1];
  bool need_a = em_node_needs_input_grad(n, 0), need_b = em_node_needs_input_grad(n, 1);
  em_tensor *ac = em_contiguous(a), *bc = ac ? em_contiguous(b) : NULL;
  em_tensor *g = bc ? em_contiguous_as(gout[0], a->dtype) : NULL;
  em_tensor *ga = g && need_a ? em_empty(a->ndim, a->shape, a->dtype, a->device) : NULL;
  em_tensor *gb = g && need_b ? em_empty(a->ndim, a->shape, a->dtype, a->device) : NULL;
  int rc = (!g || (need_a && !ga) || (need_b && !gb)) ? -1 : em_swiglu_bwd_cuda(ac, bc, g, ga, gb);
  em_tensor_release(ac); em_tensor_release(bc); em_tensor_release(g);
  if (rc) { em_tensor_release(ga); em_tensor_release(gb); return -1; }
  gin[0] = ga; gin[1] = gb;
  return 0;
}

/* saved: a, b. Gradients in the compute dtype; the engine rounds them. */
static int swiglu_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *a = n->saved[0], *b = n->saved[1];
  /* a, b, g read; ga, gb written (a's size each); sigmoid and the product rule ~10 FLOPs */
  EM_OP_COST(4 * em_cost_nbytes(a) + em_cost_nbytes(gout[0]), 10 * em_numel(a), em_cost_simt_class(a->dtype));
  if (a->device.type == EM_CUDA) return swiglu_backward_cuda(n, gout, gin);
  em_dtype ct = a->dtype == EM_F64 ? EM_F64 : EM_F32;
  bool need_a = em_node_needs_input_grad(n, 0), need_b = em_node_needs_input_grad(n, 1);
  int64_t cnt = em_numel(a);
  em_tensor *ac = em_contiguous_as(a, ct);
  em_tensor *bc = ac ? em_contiguous_as(b, ct) : NULL;
  em_tensor *g = bc ? em_contiguous_as(gout[0], ct) : NULL;
  em_tensor *ga = g && need_a ? em_empty(a->ndim, a->shape, ct, a->device) : NULL;
  em_tensor *gb = g && need_b ? em_empty(a->ndim, a->shape, ct, a->device) : NULL;
  int rc = (!g || (need_a && !ga) || (need_b && !gb)) ? -1 : 0;
  if (rc == 0) {
    swiglu_job j = {em_data_ptr(ac), em_data_ptr(bc), em_data_ptr(g), NULL, ga ? em_data_ptr(ga) : NULL,
                    gb ? em_data_ptr(gb) : NULL, ct == EM_F64, ct == EM_F32 && em_stream_wanted(cnt * 4)};
    em_parallel_for(cnt, em_grain(16), swiglu_range, &j);
  }
  em_tensor_release(ac); em_tensor_release(bc); em_tensor_release(g);
  if (rc) { em_tensor_release(ga); em_tensor_release(gb); return -1; }
  gin[0] = ga; gin[1] = gb;
  return 0;
}

em_tensor *em_swiglu(em_tensor *a, em_tensor *b) {
  EM_OP_SCOPE("swiglu");
  if (swiglu_validate(a, b)) return NULL;
  em_tensor *y = a->device.type == EM_CPU ? swiglu_cpu(a, b) : swiglu_cuda(a, b);
  /* silu(a) * b: a, b read, y written; exp, add, divide, two products */
  EM_OP_COST(em_cost_bytes(3, (em_tensor *const[]){a, b, y}), 5 * em_numel(a), em_cost_simt_class(a->dtype));
  return em_op_record(y, NULL, "swiglu", swiglu_backward, 2, (em_tensor *[]){a, b}, 2, (em_tensor *[]){a, b});
}
