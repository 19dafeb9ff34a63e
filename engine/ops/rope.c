/* rope: rotary position embedding on adjacent pairs of the last dim.
 *
 * For x (..., d) with d even and a position p for each row (pos is integer,
 * broadcast to x's leading dims: (T) for x (..., T, d), or (B, 1, T) ...),
 *   angle_j = p * theta^(-2j/d)
 *   y[2j]   = x[2j] cos(angle_j) - x[2j+1] sin(angle_j)
 *   y[2j+1] = x[2j] sin(angle_j) + x[2j+1] cos(angle_j)
 * Angles, cos and sin are computed in double (positions reach 10^5 and the
 * angle must not lose digits), then used in f32 (f64 for f64 x). Rows share a
 * cos/sin table indexed by position when the positions span at most half as
 * many values as there are rows (the usual 0..T-1 over B·H·T rows), otherwise
 * each row computes its own; both give the same numbers.
 * Backward is the same rotation by -angle (the rotation's transpose).
 *
 * On CUDA (kernels/rope.cu) one kernel does either direction, reading x in
 * place through any strides of its leading dims (q and k arrive as transposed
 * head views) and computing each angle in double from the position, with no
 * table (building one needs the position range: a host read), once per
 * (row position, pair) for all heads.
 * em_rope_qk rotates q and k with one node and, on CUDA, one launch each way
 * (attention's two ropes: half the launches, and the angles shared).
 * On the CPU rows are spread over the threads (the table is built once, before). */
#include <stdio.h>
#include "op.h"
#include "cost.h"
#include "parallel.h"

/* x and pos as rope's inputs; op and xname name them in the errors (rope's x,
 * rope_qk's q and k, flash_attention's q and k under its rope option). */
int em_rope_check(const char *op, const char *xname, em_tensor *x, em_tensor *pos, double theta) {
  char s1[160], s2[160], s3[160];
  if (em_check_float(op, xname, x)) return -1;
  if (em_check_int(op, "pos", pos)) return -1;
  if (em_check_same_device(op, x, pos)) return -1;
  if (x->ndim < 1) return em_error("%s: expected %s with at least 1 dim (..., T, d), got a 0-dim tensor", op, xname);
  if (x->shape[x->ndim - 1] % 2 != 0)
    return em_error("%s: expected an even last dim, got %lld (%s has shape %s)", op,
                    (long long)x->shape[x->ndim - 1], xname, em_shape_str(x->ndim, x->shape, s1, 160));
  if (!(theta > 0) || isinf(theta)) return em_error("%s: expected theta > 0 and finite, got %g", op, theta);
  /* pos must broadcast to x's leading dims without growing them */
  int lead = x->ndim - 1, ok = pos->ndim <= lead;
  for (int i = 0; ok && i < pos->ndim; i++) {
    int64_t ps = pos->shape[pos->ndim - 1 - i], xs = x->shape[lead - 1 - i];
    ok = ps == xs || ps == 1;
  }
  if (!ok)
    return em_error("%s: positions of shape %s do not broadcast to %s's leading dims %s (%s has shape %s)", op,
                    em_shape_str(pos->ndim, pos->shape, s1, 160), xname, em_shape_str(lead, x->shape, s2, 160),
                    xname, em_shape_str(x->ndim, x->shape, s3, 160));
  return 0;
}

/* One position per row of x (N = numel / d), pos broadcast to x's leading dims. */
static int64_t *row_positions(em_tensor *pos, int lead, const int64_t *lead_shape, int64_t N) {
  int64_t *p = malloc((size_t)EM_MAX(N, 1) * sizeof *p);
  em_tensor *pc = p ? em_contiguous_as(pos, EM_I64) : NULL;
  if (!pc) {
    if (!p) em_error_oom("out of memory: rope positions (%lld)", (long long)N);
    free(p);
    return NULL;
  }
  em_iter it;
  em_iter_init(&it, lead, lead_shape, 1, (const em_tensor *[]){pc});
  const int64_t *src = em_storage_ptr(pc);
  for (int64_t i = 0; i < N; i++) { p[i] = src[it.off[0]]; em_iter_next(&it); }
  em_tensor_release(pc);
  return p;
}

/* cos/sin of p * inv_freq[j] for j < d/2 (double, then stored as the compute type). */
typedef struct {
  int64_t half, base, count;   /* table rows cover positions base .. base+count-1; count 0: no table */
  double *inv_freq;            /* (half) */
  double *cs;                  /* (count, half, 2): cos, sin */
} rope_table;

static void angle_cs(const rope_table *t, int64_t p, int64_t j, double *c, double *s) {
  double a = (double)p * t->inv_freq[j];
  *c = cos(a); *s = sin(a);
}

static int table_init(rope_table *t, const int64_t *pos, int64_t N, int64_t d, double theta) {
  memset(t, 0, sizeof *t);
  t->half = d / 2;
  t->inv_freq = malloc((size_t)EM_MAX(t->half, 1) * sizeof(double));
  if (!t->inv_freq) return em_error_oom("out of memory: rope frequencies");
  for (int64_t j = 0; j < t->half; j++) t->inv_freq[j] = pow(theta, -2.0 * (double)j / (double)d);
  if (N == 0) return 0;
  int64_t lo = pos[0], hi = pos[0];
  for (int64_t i = 1; i < N; i++) { lo = EM_MIN(lo, pos[i]); hi = EM_MAX(hi, pos[i]); }
  /* a table pays off only when rows share positions (B·H rows per position) */
  if ((uint64_t)hi - (uint64_t)lo >= (uint64_t)N / 2) return 0;
  t->base = lo; t->count = hi - lo + 1;
  t->cs = malloc((size_t)(t->count * EM_MAX(t->half, 1) * 2) * sizeof(double));
  if (!t->cs) { t->count = 0; return 0; }                       /* fall back to per row */
  for (int64_t r = 0; r < t->count; r++)
    for (int64_t j = 0; j < t->half; j++)
      angle_cs(t, lo + r, j, &t->cs[(r * t->half + j) * 2], &t->cs[(r * t->half + j) * 2 + 1]);
  return 0;
}

static void table_free(rope_table *t) { free(t->inv_freq); free(t->cs); }

/* cos/sin of row position p into cs (half x 2). */
static const double *row_cs(const rope_table *t, int64_t p, double *scratch) {
  if (t->count) return t->cs + (p - t->base) * t->half * 2;
  for (int64_t j = 0; j < t->half; j++) angle_cs(t, p, j, &scratch[2 * j], &scratch[2 * j + 1]);
  return scratch;
}

/* y = rotate(x, sign * angle), N rows of d = 2 * half. */
static void rope_f32(const float *x, float *y, const int64_t *pos, int64_t N, const rope_table *t,
                     float sign, double *scratch) {
  for (int64_t i = 0; i < N; i++, x += 2 * t->half, y += 2 * t->half) {
    const double *cs = row_cs(t, pos[i], scratch);
    for (int64_t j = 0; j < t->half; j++) {
      float c = (float)cs[2 * j], s = sign * (float)cs[2 * j + 1], a = x[2 * j], b = x[2 * j + 1];
      y[2 * j] = a * c - b * s;
      y[2 * j + 1] = a * s + b * c;
    }
  }
}

static void rope_f64(const double *x, double *y, const int64_t *pos, int64_t N, const rope_table *t,
                     double sign, double *scratch) {
  for (int64_t i = 0; i < N; i++, x += 2 * t->half, y += 2 * t->half) {
    const double *cs = row_cs(t, pos[i], scratch);
    for (int64_t j = 0; j < t->half; j++) {
      double c = cs[2 * j], s = sign * cs[2 * j + 1], a = x[2 * j], b = x[2 * j + 1];
      y[2 * j] = a * c - b * s;
      y[2 * j + 1] = a * s + b * c;
    }
  }
}

/* Rows [r0, r1) over the threads; each range has its own scratch when there is no table. */
typedef struct {
  const void *x;
  void *y;
  const int64_t *pos;
  const rope_table *t;
  double sign;
  bool f64;
  int failed;
} rope_job;

static void rope_rows(void *ctx, int64_t r0, int64_t r1) {
  rope_job *j = ctx;
  int64_t d = 2 * j->t->half;
  double *scratch = j->t->count ? NULL : malloc((size_t)EM_MAX(d, 1) * sizeof *scratch);
  if (!j->t->count && !scratch) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
  if (j->f64)
    rope_f64((const double *)j->x + r0 * d, (double *)j->y + r0 * d, j->pos + r0, r1 - r0, j->t, j->sign, scratch);
  else
    rope_f32((const float *)j->x + r0 * d, (float *)j->y + r0 * d, j->pos + r0, r1 - r0, j->t, (float)j->sign,
             scratch);
  free(scratch);
}

/* A fresh tensor with x's memory layout when x is a dense permutation (q and
 * k are (B, T, H, D) memory seen as (B, H, T, D)): the gradient then flows
 * back through the head split's transpose and view without a copy.
 * Otherwise contiguous. */
static em_tensor *empty_like_layout(em_tensor *x) {
  int n = x->ndim, perm[EM_MAX_DIMS];
  for (int i = 0; i < n; i++) perm[i] = i;
  for (int i = 1; i < n; i++)                  /* insertion sort by stride, descending (stable) */
    for (int j = i; j > 0 && x->stride[perm[j]] > x->stride[perm[j - 1]]; j--) {
      int t = perm[j]; perm[j] = perm[j - 1]; perm[j - 1] = t;
    }
  int64_t expect = 1, shape[EM_MAX_DIMS], inv[EM_MAX_DIMS];
  bool dense = true;
  for (int i = n - 1; i >= 0; i--) {
    if (x->shape[perm[i]] != 1 && x->stride[perm[i]] != expect) dense = false;
    expect *= x->shape[perm[i]];
  }
  bool identity = true;
  for (int i = 0; i < n; i++) identity = identity && perm[i] == i;
  if (!dense || identity) return em_empty(n, x->shape, x->dtype, x->device);
  for (int i = 0; i < n; i++) { shape[i] = x->shape[perm[i]]; inv[perm[i]] = i; }
  em_tensor *m = em_empty(n, shape, x->dtype, x->device);
  em_tensor *v = m ? em_permute(m, n, inv) : NULL;
  em_tensor_release(m);
  return v;
}

/* x with its last dim contiguous (the kernel's one layout requirement). */
static em_tensor *last_dim_contiguous(em_tensor *x) {
  int64_t d = x->shape[x->ndim - 1];
  return (x->stride[x->ndim - 1] == 1 || d <= 1) ? em_tensor_retain(x) : em_contiguous(x);
}

/* y[i] = rotate(x[i], sign * angle) for i < n (1, or 2 sharing dtype and last
 * dim: q and k in one launch), each y in its x's layout. 0 or -1. */
static int rope_cuda_n(int n, em_tensor *const *x, em_tensor *pos, double theta, double sign, em_tensor **y) {
  em_tensor *xc[2] = {0}, *pc = NULL;
  int rc = -1;
  for (int i = 0; i < n; i++) y[i] = NULL;
  for (int i = 0; i < n; i++)
    if (!(xc[i] = last_dim_contiguous(x[i]))) goto done;
  pc = (pos->dtype == EM_I32 || pos->dtype == EM_I64) ? em_tensor_retain(pos) : em_contiguous_as(pos, EM_I64);
  if (!pc) goto done;
  for (int i = 0; i < n; i++)
    if (!(y[i] = empty_like_layout(xc[i]))) goto done;
  rc = em_rope2_cuda(n, (const em_tensor *const *)xc, pc, theta, sign, y);
done:
  for (int i = 0; i < n; i++) {
    em_tensor_release(xc[i]);
    if (rc) { em_tensor_release(y[i]); y[i] = NULL; }
  }
  em_tensor_release(pc);
  return rc;
}

static em_tensor *rope_apply_cuda(em_tensor *x, em_tensor *pos, double theta, double sign, em_dtype out_dt) {
  em_tensor *y;
  if (rope_cuda_n(1, &x, pos, theta, sign, &y)) return NULL;
  if (out_dt == x->dtype) return y;
  em_tensor *r = em_contiguous_as(y, out_dt);
  em_tensor_release(y);
  return r;
}

/* Rotate x by sign * angle; result in out_dt. Shared by forward (+1) and backward (-1). */
static em_tensor *rope_apply(em_tensor *x, em_tensor *pos, double theta, double sign, em_dtype out_dt) {
  /* x and the positions read, the result written (out_dt); a rotation is 3 FLOPs an element */
  EM_OP_COST(em_cost_nbytes(x) * (1 + (double)em_dtype_size(out_dt) / (double)em_dtype_size(x->dtype)) +
                 em_cost_nbytes(pos),
             3 * em_numel(x), em_cost_simt_class(x->dtype));
  if (x->device.type == EM_CUDA) return rope_apply_cuda(x, pos, theta, sign, out_dt);
  int64_t d = x->shape[x->ndim - 1];
  int64_t N = em_shape_numel(x->ndim - 1, x->shape);
  em_dtype ct = x->dtype == EM_F64 ? EM_F64 : EM_F32;
  rope_table t = {0};
  em_tensor *xc = NULL, *y = NULL, *out = NULL;
  int64_t *p = row_positions(pos, x->ndim - 1, x->shape, N);
  if (!p || table_init(&t, p, N, d, theta)) goto done;
  if (!(xc = em_contiguous_as(x, ct)) || !(y = em_empty(x->ndim, x->shape, ct, x->device))) goto done;
  rope_job j = {em_data_ptr(xc), em_data_ptr(y), p, &t, sign, ct == EM_F64, 0};
  em_parallel_for(N, em_grain(t.count ? d : 16 * d), rope_rows, &j);
  if (j.failed) { em_error_oom("out of memory: rope"); goto done; }
  out = em_contiguous_as(y, out_dt);
done:
  free(p); table_free(&t);
  em_tensor_release(xc); em_tensor_release(y);
  return out;
}

/* saved: pos; f[0] = theta. */
static int rope_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  gin[0] = rope_apply(gout[0], n->saved[0], n->f[0], -1.0, gout[0]->dtype);
  return gin[0] ? 0 : -1;
}

em_tensor *em_rope(em_tensor *x, em_tensor *pos, double theta) {
  EM_OP_SCOPE("rope");
  if (em_rope_check("rope", "x", x, pos, theta)) return NULL;
  em_node *n;
  em_tensor *y = rope_apply(x, pos, theta, 1.0, x->dtype);
  y = em_op_record(y, &n, "rope", rope_backward, 1, &x, 1, &pos);
  if (n) n->f[0] = theta;
  return y;
}

/* ---- rope_qk: q and k rotated together (one CUDA launch each way) ---- */

static bool one_launch(em_tensor *a, em_tensor *b) {
  return a->device.type == EM_CUDA && a->dtype == b->dtype && a->shape[a->ndim - 1] == b->shape[b->ndim - 1];
}

/* (a, b) rotated by sign * angle into out[0], out[1] (no autograd node). 0 or -1. */
int em_rope_pair(em_tensor *a, em_tensor *b, em_tensor *pos, double theta, double sign, em_tensor **out) {
  if (one_launch(a, b)) {
    /* both read and written, the positions read once; 3 FLOPs an element
     * (the other path declares each rope_apply's) */
    EM_OP_COST(2 * (em_cost_nbytes(a) + em_cost_nbytes(b)) + em_cost_nbytes(pos), 3 * (em_numel(a) + em_numel(b)),
               em_cost_simt_class(a->dtype));
    return rope_cuda_n(2, (em_tensor *[]){a, b}, pos, theta, sign, out);
  }
  out[0] = rope_apply(a, pos, theta, sign, a->dtype);
  out[1] = out[0] ? rope_apply(b, pos, theta, sign, b->dtype) : NULL;
  if (out[1]) return 0;
  em_tensor_release(out[0]);
  out[0] = NULL;
  return -1;
}

/* saved: pos; f[0] = theta. The inverse rotation of both gradients. */
static int rope_qk_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *g[2];
  if (em_rope_pair(gout[0], gout[1], n->saved[0], n->f[0], -1.0, g)) return -1;
  for (int i = 0; i < 2; i++) {
    if (em_node_needs_input_grad(n, i)) gin[i] = g[i];
    else em_tensor_release(g[i]);
  }
  return 0;
}

int em_rope_qk(em_tensor *q, em_tensor *k, em_tensor *pos, double theta, em_tensor **q_out, em_tensor **k_out) {
  EM_OP_SCOPE("rope_qk");
  *q_out = *k_out = NULL;
  if (em_rope_check("rope_qk", "q", q, pos, theta) || em_rope_check("rope_qk", "k", k, pos, theta)) return -1;
  if (em_check_same_device("rope_qk", q, k)) return -1;
  em_tensor *y[2];
  if (em_rope_pair(q, k, pos, theta, 1.0, y)) return -1;
  em_tensor *in[2] = {q, k};
  if (em_grad_needed(2, in)) {
    em_node *n = em_node_new("rope_qk", rope_qk_backward, 2, 2);
    if (!n) { em_tensor_release(y[0]); em_tensor_release(y[1]); return -1; }
    em_node_set_input(n, 0, q);
    em_node_set_input(n, 1, k);
    em_node_save(n, pos);
    n->f[0] = theta;
    em_node_set_output(n, 0, y[0]);
    em_node_set_output(n, 1, y[1]);
    em_node_release(n);
  }
  *q_out = y[0]; *k_out = y[1];
  return 0;
}
