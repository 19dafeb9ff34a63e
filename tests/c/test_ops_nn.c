/* Neural-net ops against naive f64 references: matmul, linear, cross_entropy,
 * embedding, rmsnorm, rope, attention, swiglu, adamw_, sgd_, sum_of_squares.
 * Every differentiable op also gets a finite-difference gradient check in
 * f64: the analytic gradient of sum(op(...) * w) (em_backward with gradient w,
 * which is the same thing) against central differences with h = 1e-6, within
 * 1e-6 relative + 1e-8 absolute (f64 rounding in a difference quotient over h
 * is ~1e-16 * |f| / h ~ 1e-10 for the small |f| used here). */
#include <stdlib.h>
#include "test.h"
#include "internal.h"

/* ---------------- helpers ---------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) {   /* uniform in [-1, 1) */
  rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
  return (double)((rng_state * 2685821657736338717ull) >> 11) * 0x1.0p-52 - 1.0;
}

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static em_tensor *randt(em_dtype dt, int ndim, const int64_t *shape) {
  em_tensor *t = em_empty(ndim, shape, dt, em_cpu());
  for (int64_t i = 0, n = em_numel(t); i < n; i++) em_store_f64(em_data_ptr(t), dt, i, urand());
  return t;
}

static em_tensor *vals(em_dtype dt, int ndim, const int64_t *shape, const double *v) {
  em_tensor *t = em_empty(ndim, shape, dt, em_cpu());
  for (int64_t i = 0, n = em_numel(t); i < n; i++) em_store_f64(em_data_ptr(t), dt, i, v[i]);
  return t;
}

static em_tensor *ints(em_dtype dt, int ndim, const int64_t *shape, const int64_t *v) {
  em_tensor *t = em_empty(ndim, shape, dt, em_cpu());
  for (int64_t i = 0, n = em_numel(t); i < n; i++) em_store_i64(em_data_ptr(t), dt, i, v[i]);
  return t;
}

static em_tensor *leaf(em_tensor *t) { em_set_requires_grad(t, true); return t; }

/* Element i (row-major logical order) of any tensor, as double. */
static double at(const em_tensor *t, int64_t i) {
  int64_t off = t->offset;
  for (int d = t->ndim - 1; d >= 0; d--) { off += (i % t->shape[d]) * t->stride[d]; i /= t->shape[d]; }
  return em_load_f64(t->storage->data, t->dtype, off);
}

/* Max |t - ref| over all elements (shape must match). */
static double max_diff(const em_tensor *t, const double *ref) {
  double m = 0;
  for (int64_t i = 0, n = em_numel(t); i < n; i++) {
    double d = fabs(at(t, i) - ref[i]);
    if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
  }
  return m;
}

static bool shape_is(const em_tensor *t, int ndim, const int64_t *shape) {
  return t && t->ndim == ndim && (ndim == 0 || memcmp(t->shape, shape, sizeof(int64_t) * (size_t)ndim) == 0);
}

static void release_all(int n, em_tensor **ts) { for (int i = 0; i < n; i++) em_tensor_release(ts[i]); }

/* ---------------- finite-difference gradient check ---------------- */

typedef em_tensor *(*op_fn)(em_tensor **in, const void *ctx);

static double weighted_sum(em_tensor *out, const em_tensor *w) {
  double s = 0;
  for (int64_t i = 0, n = em_numel(out); i < n; i++) s += at(out, i) * at(w, i);
  return s;
}

/* in[i] are contiguous f64 tensors; those with requires_grad are checked. */
static void gradcheck(const char *name, op_fn f, const void *ctx, int nin, em_tensor **in) {
  em_tensor *out = f(in, ctx);
  test_checks++;
  if (!out) { test_failures++; fprintf(stderr, "gradcheck %s: forward failed: %s\n", name, em_last_error()); return; }
  em_tensor *w = randt(EM_F64, out->ndim, out->shape);
  for (int i = 0; i < nin; i++) if (in[i]->requires_grad) em_set_grad(in[i], NULL);
  if (em_backward(out, w, false)) {
    test_failures++; fprintf(stderr, "gradcheck %s: backward failed: %s\n", name, em_last_error());
    em_tensor_release(out); em_tensor_release(w); return;
  }
  em_tensor_release(out);
  bool prev = em_set_grad_enabled(false);
  const double h = 1e-6;
  for (int i = 0; i < nin; i++) {
    if (!in[i]->requires_grad) continue;
    test_checks++;
    if (!in[i]->grad) { test_failures++; fprintf(stderr, "gradcheck %s: input %d got no grad\n", name, i); continue; }
    double *x = em_data_ptr(in[i]);
    int bad = 0;
    for (int64_t e = 0, n = em_numel(in[i]); e < n && bad < 3; e++) {
      double x0 = x[e];
      x[e] = x0 + h; em_tensor *op = f(in, ctx);
      x[e] = x0 - h; em_tensor *om = f(in, ctx);
      x[e] = x0;
      double num = (weighted_sum(op, w) - weighted_sum(om, w)) / (2 * h), ana = at(in[i]->grad, e);
      em_tensor_release(op); em_tensor_release(om);
      if (!(fabs(ana - num) <= 1e-6 * fabs(num) + 1e-8)) {
        if (!bad++) test_failures++;
        fprintf(stderr, "gradcheck %s: input %d element %lld: analytic %.12g, numeric %.12g\n", name, i,
                (long long)e, ana, num);
      }
    }
  }
  em_set_grad_enabled(prev);
  em_tensor_release(w);
}

/* ---------------- matmul ---------------- */

/* Reference for a (.., n, k) @ b (.., k, m) with numpy broadcasting on batch dims (up to 3). */
static void ref_matmul(const em_tensor *a, const em_tensor *b, const em_tensor *out, double *ref) {
  int a1 = a->ndim == 1, b1 = b->ndim == 1;
  int64_t n = a1 ? 1 : a->shape[a->ndim - 2], k = a->shape[a->ndim - 1], m = b1 ? 1 : b->shape[b->ndim - 1];
  int nba = a1 ? 0 : a->ndim - 2, nbb = b1 ? 0 : b->ndim - 2, nb = nba > nbb ? nba : nbb;
  int64_t bsh[8], total = 1;
  for (int d = 0; d < nb; d++) {
    int64_t sa = d < nb - nba ? 1 : a->shape[d - (nb - nba)], sb = d < nb - nbb ? 1 : b->shape[d - (nb - nbb)];
    bsh[d] = sa > sb ? sa : sb; total *= bsh[d];
  }
  EM_UNUSED(out);
  for (int64_t bi = 0; bi < total; bi++) {
    int64_t ia = 0, ib = 0, r = bi, mula = 1, mulb = 1;  /* flat matrix index into a's / b's batch */
    for (int d = nb - 1; d >= 0; d--) {
      int64_t idx = r % bsh[d]; r /= bsh[d];
      if (d >= nb - nba) { int64_t s = a->shape[d - (nb - nba)]; ia += (s == 1 ? 0 : idx) * mula; mula *= s; }
      if (d >= nb - nbb) { int64_t s = b->shape[d - (nb - nbb)]; ib += (s == 1 ? 0 : idx) * mulb; mulb *= s; }
    }
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < m; j++) {
        double s = 0;
        for (int64_t l = 0; l < k; l++) s += at(a, ia * n * k + i * k + l) * at(b, ib * k * m + l * m + j);
        ref[(bi * n + i) * m + j] = s;
      }
  }
}

static void check_matmul(em_tensor *a, em_tensor *b, int ndim, const int64_t *shape, double tol) {
  em_tensor *c = em_matmul(a, b);
  CHECK(shape_is(c, ndim, shape));
  if (c) {
    double *ref = malloc(sizeof(double) * (size_t)(em_numel(c) + 1));
    ref_matmul(a, b, c, ref);
    CHECK_NEAR(max_diff(c, ref), 0, tol);
    CHECK(c->dtype == a->dtype);
    free(ref);
  }
  em_tensor_release(c);
}

TEST(matmul_2d_matches_triple_loop) {
  em_tensor *a = randt(EM_F64, SHAPE(3, 4)), *b = randt(EM_F64, SHAPE(4, 5));
  check_matmul(a, b, SHAPE(3, 5), 1e-13);
  em_tensor *af = randt(EM_F32, SHAPE(7, 9)), *bf = randt(EM_F32, SHAPE(9, 2));
  check_matmul(af, bf, SHAPE(7, 2), 1e-5);
  release_all(4, (em_tensor *[]){a, b, af, bf});
}

TEST(matmul_broadcasts_batch_dims) {
  em_tensor *a = randt(EM_F64, SHAPE(2, 1, 3, 4)), *b = randt(EM_F64, SHAPE(5, 4, 2));
  check_matmul(a, b, SHAPE(2, 5, 3, 2), 1e-13);
  em_tensor *c = randt(EM_F64, SHAPE(2, 3, 4)), *d = randt(EM_F64, SHAPE(4, 6));   /* shared b: one folded gemm */
  check_matmul(c, d, SHAPE(2, 3, 6), 1e-13);
  em_tensor *e = randt(EM_F64, SHAPE(3, 4)), *f = randt(EM_F64, SHAPE(2, 4, 5));   /* shared a */
  check_matmul(e, f, SHAPE(2, 3, 5), 1e-13);
  release_all(6, (em_tensor *[]){a, b, c, d, e, f});
}

TEST(matmul_handles_transposed_and_strided_inputs) {
  em_tensor *base_a = randt(EM_F64, SHAPE(4, 3)), *base_b = randt(EM_F64, SHAPE(4, 10));
  em_tensor *a = em_transpose(base_a, 0, 1);                 /* (3, 4), column-major: BLAS Trans */
  em_tensor *b = em_narrow(base_b, 1, 2, 5);                 /* (4, 5), row stride 10 */
  check_matmul(a, b, SHAPE(3, 5), 1e-13);
  em_tensor *base_c = randt(EM_F64, SHAPE(3, 4, 2));
  em_tensor *c = em_select(base_c, 2, 1);                    /* (3, 4) strides (8, 2): copied */
  check_matmul(c, b, SHAPE(3, 5), 1e-13);
  em_tensor *base_d = randt(EM_F64, SHAPE(3, 2, 4));
  em_tensor *d = em_permute(base_d, 3, (int64_t[]){1, 0, 2}); /* (2, 3, 4): batch dims do not collapse */
  em_tensor *e = randt(EM_F64, SHAPE(4, 2));
  check_matmul(d, e, SHAPE(2, 3, 2), 1e-13);
  em_tensor *bt = em_transpose(b, 0, 1);                     /* (5, 4) with strides (1, 10) */
  check_matmul(bt, base_a, SHAPE(5, 3), 1e-13);
  release_all(10, (em_tensor *[]){base_a, base_b, a, b, base_c, c, base_d, d, e, bt});
}

TEST(matmul_1d_cases_follow_torch) {
  em_tensor *u = randt(EM_F64, SHAPE(4)), *v = randt(EM_F64, SHAPE(4));
  em_tensor *A = randt(EM_F64, SHAPE(3, 4)), *B = randt(EM_F64, SHAPE(4, 5)), *Bb = randt(EM_F64, SHAPE(2, 4, 5));
  em_tensor *Ab = randt(EM_F64, SHAPE(2, 3, 4));
  check_matmul(u, v, 0, NULL, 1e-13);                        /* dot -> 0-d */
  check_matmul(A, u, SHAPE(3), 1e-13);
  check_matmul(u, B, SHAPE(5), 1e-13);
  check_matmul(u, Bb, SHAPE(2, 5), 1e-13);
  check_matmul(Ab, u, SHAPE(2, 3), 1e-13);
  release_all(6, (em_tensor *[]){u, v, A, B, Bb, Ab});
}

TEST(matmul_low_precision_and_integers) {
  em_tensor *a = randt(EM_F32, SHAPE(2, 5, 8)), *b = randt(EM_F32, SHAPE(8, 3));
  em_tensor *ah = em_to(a, EM_BF16, em_cpu()), *bh = em_to(b, EM_BF16, em_cpu());
  em_tensor *c = em_matmul(ah, bh);
  CHECK(c && c->dtype == EM_BF16);
  if (c) {
    double ref[30];
    ref_matmul(ah, bh, c, ref);                              /* exact products of the bf16 inputs */
    CHECK_NEAR(max_diff(c, ref), 0, 2e-2);                   /* one bf16 rounding of |c| < 8 */
  }
  em_tensor *a16 = em_to(a, EM_F16, em_cpu()), *b16 = em_to(b, EM_F16, em_cpu());
  check_matmul(a16, b16, SHAPE(2, 5, 3), 5e-3);
  em_tensor *ia = ints(EM_I64, SHAPE(2, 3), (int64_t[]){1, -2, 3, 4, 5, -6});
  em_tensor *ib = ints(EM_I64, SHAPE(3, 2), (int64_t[]){7, 8, 9, 10, -11, 12});
  em_tensor *ic = em_matmul(ia, ib);
  CHECK(ic && ic->dtype == EM_I64);
  if (ic) {
    double ref[4] = {1 * 7 - 2 * 9 - 3 * 11, 8 - 20 + 36, 28 + 45 + 66, 32 + 50 - 72};
    CHECK_NEAR(max_diff(ic, ref), 0, 0);
  }
  em_tensor *ja = em_to(ia, EM_I32, em_cpu()), *jb = em_to(ib, EM_I32, em_cpu());
  check_matmul(ja, jb, SHAPE(2, 2), 0);
  release_all(11, (em_tensor *[]){a, b, ah, bh, c, a16, b16, ia, ib, ic, ja});
  em_tensor_release(jb);
}

TEST(matmul_empty_dims_give_empty_or_zero_results) {
  em_tensor *a = randt(EM_F32, SHAPE(0, 3)), *b = randt(EM_F32, SHAPE(3, 4));
  em_tensor *c = em_matmul(a, b);
  CHECK(shape_is(c, SHAPE(0, 4)));
  em_tensor *d = randt(EM_F32, SHAPE(2, 0)), *e = randt(EM_F32, SHAPE(0, 4));
  em_tensor *f = em_matmul(d, e);                            /* k = 0: zeros */
  CHECK(shape_is(f, SHAPE(2, 4)));
  if (f) { double z[8] = {0}; CHECK_NEAR(max_diff(f, z), 0, 0); }
  release_all(6, (em_tensor *[]){a, b, c, d, e, f});
}

TEST(matmul_errors_name_shapes_and_dtypes) {
  em_tensor *a = randt(EM_F32, SHAPE(2, 3)), *b = randt(EM_F32, SHAPE(4, 5)), *s = em_scalar_tensor(1, EM_F32, em_cpu());
  em_tensor *d = randt(EM_F64, SHAPE(3, 5)), *x = randt(EM_F32, SHAPE(2, 2, 3)), *y = randt(EM_F32, SHAPE(3, 3, 4));
  em_tensor *bo = em_zeros(SHAPE(3, 3), EM_BOOL, em_cpu()), *bo2 = em_zeros(SHAPE(3, 3), EM_BOOL, em_cpu());
  CHECK_ERR_CONTAINS(em_matmul(a, b) == NULL, "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)");
  CHECK_ERR_CONTAINS(em_matmul(a, s) == NULL, "at least 1 dim");
  CHECK_ERR_CONTAINS(em_matmul(a, d) == NULL, "same dtype, got f32 and f64");
  CHECK_ERR_CONTAINS(em_matmul(x, y) == NULL, "batch dims of shapes [2, 2, 3] and [3, 3, 4] cannot be broadcast");
  CHECK_ERR_CONTAINS(em_matmul(bo, bo2) == NULL, "bool");
  release_all(9, (em_tensor *[]){a, b, s, d, x, y, bo, bo2, NULL});
}

static em_tensor *f_matmul(em_tensor **in, const void *ctx) { EM_UNUSED(ctx); return em_matmul(in[0], in[1]); }
static em_tensor *f_matmul_ta(em_tensor **in, const void *ctx) {
  EM_UNUSED(ctx);
  em_tensor *t = em_transpose(in[0], -1, -2), *r = em_matmul(t, in[1]);
  em_tensor_release(t);
  return r;
}

TEST(matmul_gradients_match_finite_differences) {
  struct { int na; int64_t sa[4]; int nb; int64_t sb[4]; } cases[] = {
    {2, {3, 4}, 2, {4, 5}},            /* plain */
    {3, {2, 3, 4}, 2, {4, 5}},         /* shared b: folded grad_b */
    {2, {3, 4}, 3, {2, 4, 5}},         /* shared a: grad_a summed over the batch */
    {4, {2, 1, 3, 4}, 3, {2, 4, 2}},   /* both broadcast */
    {1, {4}, 1, {4}}, {2, {3, 4}, 1, {4}}, {1, {4}, 2, {4, 5}}, {1, {4}, 3, {2, 4, 5}}, {3, {2, 3, 4}, 1, {4}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    em_tensor *in[2] = {leaf(randt(EM_F64, cases[c].na, cases[c].sa)), leaf(randt(EM_F64, cases[c].nb, cases[c].sb))};
    char name[32]; snprintf(name, sizeof name, "matmul case %zu", c);
    gradcheck(name, f_matmul, NULL, 2, in);
    release_all(2, in);
  }
  em_tensor *in[2] = {leaf(randt(EM_F64, SHAPE(2, 4, 3))), leaf(randt(EM_F64, SHAPE(4, 5)))};
  gradcheck("matmul transposed a", f_matmul_ta, NULL, 2, in);
  release_all(2, in);
}

/* ---------------- linear ---------------- */

static void ref_linear(const em_tensor *x, const em_tensor *w, const em_tensor *bias, double *ref) {
  int64_t in = w->shape[1], out = w->shape[0], M = em_numel(x) / in;
  for (int64_t r = 0; r < M; r++)
    for (int64_t o = 0; o < out; o++) {
      double s = bias ? at(bias, o) : 0;
      for (int64_t i = 0; i < in; i++) s += at(x, r * in + i) * at(w, o * in + i);
      ref[r * out + o] = s;
    }
}

TEST(linear_matches_reference) {
  em_tensor *x = randt(EM_F64, SHAPE(2, 3, 4)), *w = randt(EM_F64, SHAPE(5, 4)), *b = randt(EM_F64, SHAPE(5));
  double ref[30];
  em_tensor *y = em_linear(x, w, b);
  CHECK(shape_is(y, SHAPE(2, 3, 5)));
  ref_linear(x, w, b, ref);
  if (y) CHECK_NEAR(max_diff(y, ref), 0, 1e-13);
  em_tensor *y0 = em_linear(x, w, NULL);
  ref_linear(x, w, NULL, ref);
  if (y0) CHECK_NEAR(max_diff(y0, ref), 0, 1e-13);
  /* transposed weight view and non-contiguous x */
  em_tensor *wt_base = randt(EM_F64, SHAPE(4, 5)), *wt = em_transpose(wt_base, 0, 1);
  em_tensor *xb = randt(EM_F64, SHAPE(3, 2, 4)), *xt = em_transpose(xb, 0, 1);
  em_tensor *y1 = em_linear(xt, wt, b);
  ref_linear(xt, wt, b, ref);
  CHECK(shape_is(y1, SHAPE(2, 3, 5)));
  if (y1) CHECK_NEAR(max_diff(y1, ref), 0, 1e-13);
  /* 1-D x and f32 / bf16 */
  em_tensor *v = randt(EM_F32, SHAPE(4)), *wf = em_to(w, EM_F32, em_cpu());
  em_tensor *y2 = em_linear(v, wf, NULL);
  CHECK(shape_is(y2, SHAPE(5)));
  ref_linear(v, wf, NULL, ref);
  if (y2) CHECK_NEAR(max_diff(y2, ref), 0, 1e-5);
  em_tensor *vh = em_to(v, EM_BF16, em_cpu()), *wh = em_to(w, EM_BF16, em_cpu());
  em_tensor *y3 = em_linear(vh, wh, NULL);
  CHECK(y3 && y3->dtype == EM_BF16);
  ref_linear(vh, wh, NULL, ref);
  if (y3) CHECK_NEAR(max_diff(y3, ref), 0, 1e-2);
  release_all(16, (em_tensor *[]){x, w, b, y, y0, wt_base, wt, xb, xt, y1, v, wf, y2, vh, wh, y3});
}

TEST(linear_errors) {
  em_tensor *x = randt(EM_F32, SHAPE(2, 3)), *w = randt(EM_F32, SHAPE(4, 5)), *w2 = randt(EM_F32, SHAPE(4, 3));
  em_tensor *b = randt(EM_F32, SHAPE(5)), *wd = randt(EM_F64, SHAPE(4, 3));
  CHECK_ERR_CONTAINS(em_linear(x, w, NULL) == NULL, "linear: x of shape [2, 3] and weight of shape [4, 5]");
  CHECK_ERR_CONTAINS(em_linear(x, w2, b) == NULL, "expected bias of shape [4]");
  CHECK_ERR_CONTAINS(em_linear(x, wd, NULL) == NULL, "expected weight to have x's dtype f32, got f64");
  CHECK_ERR_CONTAINS(em_linear(x, b, NULL) == NULL, "expected weight to have 2 dims");
  release_all(5, (em_tensor *[]){x, w, w2, b, wd});
}

static em_tensor *f_linear(em_tensor **in, const void *ctx) { EM_UNUSED(ctx); return em_linear(in[0], in[1], in[2]); }
static em_tensor *f_linear_nobias(em_tensor **in, const void *ctx) { EM_UNUSED(ctx); return em_linear(in[0], in[1], NULL); }

TEST(linear_gradients_match_finite_differences) {
  em_tensor *in[3] = {leaf(randt(EM_F64, SHAPE(2, 3, 4))), leaf(randt(EM_F64, SHAPE(5, 4))), leaf(randt(EM_F64, SHAPE(5)))};
  gradcheck("linear", f_linear, NULL, 3, in);
  em_tensor *in1[2] = {leaf(randt(EM_F64, SHAPE(4))), leaf(randt(EM_F64, SHAPE(3, 4)))};
  gradcheck("linear 1-D, no bias", f_linear_nobias, NULL, 2, in1);
  release_all(3, in); release_all(2, in1);
}

/* ---------------- cross_entropy ---------------- */

TEST(cross_entropy_matches_direct_formula) {
  em_tensor *x = randt(EM_F64, SHAPE(2, 3, 5));
  int64_t tv[6] = {0, 4, 2, 1, 3, 4};
  em_tensor *t = ints(EM_I64, SHAPE(2, 3), tv);
  double ref = 0;
  for (int r = 0; r < 6; r++) {
    double s = 0;
    for (int j = 0; j < 5; j++) s += exp(at(x, r * 5 + j));
    ref += log(s) - at(x, r * 5 + tv[r]);
  }
  ref /= 6;
  em_tensor *l = em_cross_entropy(x, t);
  CHECK(l && l->ndim == 0 && l->dtype == EM_F64);
  if (l) CHECK_NEAR(at(l, 0), ref, 1e-14);
  em_tensor *xf = em_to(x, EM_F32, em_cpu()), *t32 = em_to(t, EM_I32, em_cpu());
  em_tensor *lf = em_cross_entropy(xf, t32);
  CHECK(lf && lf->dtype == EM_F32);
  if (lf) CHECK_NEAR(at(lf, 0), ref, 1e-6);
  release_all(6, (em_tensor *[]){x, t, l, xf, t32, lf});
}

TEST(cross_entropy_is_stable_for_large_logits) {
  em_tensor *x = vals(EM_F32, SHAPE(1, 3), (double[]){1000, 1001, 1002});
  em_tensor *t = ints(EM_I64, SHAPE(1), (int64_t[]){0});
  em_tensor *l = em_cross_entropy(x, t);
  double ref = log(exp(-2.0) + exp(-1.0) + 1.0) + 2.0;
  if (l) CHECK_NEAR(at(l, 0), ref, 1e-5);
  CHECK(l != NULL);
  release_all(3, (em_tensor *[]){x, t, l});
}

TEST(cross_entropy_errors) {
  em_tensor *x = randt(EM_F32, SHAPE(2, 5));
  em_tensor *bad = ints(EM_I64, SHAPE(2), (int64_t[]){1, 7}), *neg = ints(EM_I64, SHAPE(2), (int64_t[]){-1, 0});
  em_tensor *shp = ints(EM_I64, SHAPE(3), (int64_t[]){0, 0, 0}), *ft = randt(EM_F32, SHAPE(2));
  CHECK_ERR_CONTAINS(em_cross_entropy(x, bad) == NULL, "target 7 (at flat index 1) is out of range for 5 classes");
  CHECK_ERR_CONTAINS(em_cross_entropy(x, neg) == NULL, "target -1");
  CHECK_ERR_CONTAINS(em_cross_entropy(x, shp) == NULL, "expected targets of shape [2]");
  CHECK_ERR_CONTAINS(em_cross_entropy(x, ft) == NULL, "expected targets to be an integer tensor");
  CHECK_ERR_CONTAINS(em_cross_entropy(ft, shp) == NULL, "expected targets of shape []");
  release_all(5, (em_tensor *[]){x, bad, neg, shp, ft});
}

static em_tensor *f_xent(em_tensor **in, const void *ctx) { EM_UNUSED(ctx); return em_cross_entropy(in[0], in[1]); }

TEST(cross_entropy_gradient_matches_finite_differences) {
  em_tensor *in[2] = {leaf(randt(EM_F64, SHAPE(2, 3, 6))), ints(EM_I64, SHAPE(2, 3), (int64_t[]){5, 0, 3, 3, 1, 2})};
  gradcheck("cross_entropy", f_xent, NULL, 2, in);
  release_all(2, in);
}

/* ---------------- embedding ---------------- */

TEST(embedding_gathers_rows) {
  em_tensor *w = randt(EM_F32, SHAPE(6, 3));
  int64_t iv[6] = {5, 0, 2, 2, 1, 5};
  em_tensor *ids = ints(EM_U8, SHAPE(2, 3), iv);
  em_tensor *e = em_embedding(ids, w);
  CHECK(shape_is(e, SHAPE(2, 3, 3)));
  if (e) {
    double ref[18];
    for (int i = 0; i < 6; i++) for (int j = 0; j < 3; j++) ref[i * 3 + j] = at(w, iv[i] * 3 + j);
    CHECK_NEAR(max_diff(e, ref), 0, 0);
  }
  em_tensor *s = ints(EM_I32, 0, NULL, (int64_t[]){4});
  em_tensor *e0 = em_embedding(s, w);                        /* 0-d id -> (d) */
  CHECK(shape_is(e0, SHAPE(3)));
  em_tensor *empty = ints(EM_I64, SHAPE(0), NULL);
  em_tensor *ee = em_embedding(empty, w);
  CHECK(shape_is(ee, SHAPE(0, 3)));
  release_all(7, (em_tensor *[]){w, ids, e, s, e0, empty, ee});
}

TEST(embedding_backward_scatter_adds_repeated_ids) {
  em_tensor *w = leaf(randt(EM_F64, SHAPE(4, 2)));
  em_tensor *ids = ints(EM_I64, SHAPE(5), (int64_t[]){1, 3, 1, 1, 0});
  em_tensor *e = em_embedding(ids, w);
  em_tensor *g = vals(EM_F64, SHAPE(5, 2), (double[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  CHECK(e && em_backward(e, g, false) == 0);
  double ref[8] = {9, 10, 1 + 5 + 7, 2 + 6 + 8, 0, 0, 3, 4};
  if (w->grad) CHECK_NEAR(max_diff(w->grad, ref), 0, 0);
  CHECK(w->grad != NULL);
  release_all(4, (em_tensor *[]){w, ids, e, g});
}

TEST(embedding_errors) {
  em_tensor *w = randt(EM_F32, SHAPE(10, 3)), *big = ints(EM_I64, SHAPE(3), (int64_t[]){1, 12, 0});
  em_tensor *neg = ints(EM_I32, SHAPE(1), (int64_t[]){-3}), *fl = randt(EM_F32, SHAPE(2)), *w1 = randt(EM_F32, SHAPE(10));
  CHECK_ERR_CONTAINS(em_embedding(big, w) == NULL, "embedding: id 12 (at flat index 1) is out of range for a table of 10 rows");
  CHECK_ERR_CONTAINS(em_embedding(neg, w) == NULL, "id -3");
  CHECK_ERR_CONTAINS(em_embedding(fl, w) == NULL, "expected ids to be an integer tensor");
  CHECK_ERR_CONTAINS(em_embedding(big, w1) == NULL, "expected weight to have 2 dims");
  release_all(5, (em_tensor *[]){w, big, neg, fl, w1});
}

static em_tensor *f_embedding(em_tensor **in, const void *ctx) { EM_UNUSED(ctx); return em_embedding(in[0], in[1]); }

TEST(embedding_gradient_matches_finite_differences) {
  em_tensor *in[2] = {ints(EM_I64, SHAPE(2, 3), (int64_t[]){0, 2, 2, 4, 0, 0}), leaf(randt(EM_F64, SHAPE(5, 3)))};
  gradcheck("embedding", f_embedding, NULL, 2, in);
  release_all(2, in);
}

/* ---------------- rmsnorm ---------------- */

static void ref_rmsnorm(const em_tensor *x, const em_tensor *w, double eps, double *ref) {
  int64_t D = x->shape[x->ndim - 1], N = em_numel(x) / D;
  for (int64_t r = 0; r < N; r++) {
    double ss = 0;
    for (int64_t j = 0; j < D; j++) ss += at(x, r * D + j) * at(x, r * D + j);
    double rs = 1 / sqrt(ss / (double)D + eps);
    for (int64_t j = 0; j < D; j++) ref[r * D + j] = at(x, r * D + j) * rs * (w ? at(w, j) : 1);
  }
}

TEST(rmsnorm_matches_formula) {
  em_tensor *x = randt(EM_F64, SHAPE(2, 3, 8)), *w = randt(EM_F64, SHAPE(8));
  double ref[48];
  em_tensor *y = em_rmsnorm(x, w, 1e-5);
  ref_rmsnorm(x, w, 1e-5, ref);
  CHECK(shape_is(y, SHAPE(2, 3, 8)));
  if (y) CHECK_NEAR(max_diff(y, ref), 0, 1e-14);
  em_tensor *y0 = em_rmsnorm(x, NULL, 0.1);
  ref_rmsnorm(x, NULL, 0.1, ref);
  if (y0) CHECK_NEAR(max_diff(y0, ref), 0, 1e-14);
  em_tensor *xh = em_to(x, EM_BF16, em_cpu()), *wf = em_to(w, EM_F32, em_cpu());
  em_tensor *yh = em_rmsnorm(xh, wf, 1e-5);                  /* bf16 activations, f32 weight */
  CHECK(yh && yh->dtype == EM_BF16);
  ref_rmsnorm(xh, wf, 1e-5, ref);
  if (yh) CHECK_NEAR(max_diff(yh, ref), 0, 3e-2);
  release_all(7, (em_tensor *[]){x, w, y, y0, xh, wf, yh});
}

TEST(rmsnorm_errors) {
  em_tensor *x = randt(EM_F32, SHAPE(2, 4)), *w = randt(EM_F32, SHAPE(3)), *xi = ints(EM_I64, SHAPE(2), (int64_t[]){1, 2});
  CHECK_ERR_CONTAINS(em_rmsnorm(x, w, 1e-5) == NULL, "rmsnorm: expected weight of shape [4] (x's last dim), got [3]");
  CHECK_ERR_CONTAINS(em_rmsnorm(xi, NULL, 1e-5) == NULL, "rmsnorm: expected x to be a floating-point tensor");
  CHECK_ERR_CONTAINS(em_rmsnorm(x, NULL, -1) == NULL, "eps");
  release_all(3, (em_tensor *[]){x, w, xi});
}

static em_tensor *f_rmsnorm(em_tensor **in, const void *ctx) { EM_UNUSED(ctx); return em_rmsnorm(in[0], in[1], 1e-3); }
static em_tensor *f_rmsnorm_now(em_tensor **in, const void *ctx) { EM_UNUSED(ctx); return em_rmsnorm(in[0], NULL, 1e-3); }

TEST(rmsnorm_gradients_match_finite_differences) {
  em_tensor *in[2] = {leaf(randt(EM_F64, SHAPE(3, 6))), leaf(randt(EM_F64, SHAPE(6)))};
  gradcheck("rmsnorm", f_rmsnorm, NULL, 2, in);
  em_tensor *in1[1] = {leaf(randt(EM_F64, SHAPE(2, 2, 5)))};
  gradcheck("rmsnorm without weight", f_rmsnorm_now, NULL, 1, in1);
  release_all(2, in); release_all(1, in1);
}

/* ---------------- rope ---------------- */

/* x (R, T, d) with positions pos[r * pstride_r + t]. */
static void ref_rope(const em_tensor *x, const int64_t *pos, int64_t pstride_r, double theta, double *ref) {
  int64_t d = x->shape[x->ndim - 1], T = x->ndim > 1 ? x->shape[x->ndim - 2] : 1, R = em_numel(x) / (T * d);
  for (int64_t r = 0; r < R; r++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t j = 0; j < d / 2; j++) {
        double ang = (double)pos[r * pstride_r + t] * pow(theta, -2.0 * (double)j / (double)d);
        int64_t o = (r * T + t) * d + 2 * j;
        double a = at(x, o), b = at(x, o + 1);
        ref[o] = a * cos(ang) - b * sin(ang);
        ref[o + 1] = a * sin(ang) + b * cos(ang);
      }
}

TEST(rope_matches_formula) {
  em_tensor *x = randt(EM_F64, SHAPE(2, 3, 4, 8));
  em_tensor *pos = ints(EM_I64, SHAPE(4), (int64_t[]){0, 1, 2, 3});
  double ref[192];
  em_tensor *y = em_rope(x, pos, 10000);
  ref_rope(x, (int64_t[]){0, 1, 2, 3}, 0, 10000, ref);
  CHECK(shape_is(y, SHAPE(2, 3, 4, 8)));
  if (y) CHECK_NEAR(max_diff(y, ref), 0, 1e-14);
  em_tensor *xf = em_to(x, EM_F32, em_cpu()), *yf = em_rope(xf, pos, 10000);
  CHECK(yf && yf->dtype == EM_F32);
  if (yf) CHECK_NEAR(max_diff(yf, ref), 0, 1e-6);
  /* per-batch positions (2, 1, 4), sparse and large: the per-row path */
  int64_t pv[8] = {0, 5, 100000, 7, 3, 2, 1, 90000};
  em_tensor *pb = ints(EM_I32, SHAPE(2, 1, 4), pv);
  em_tensor *yb = em_rope(x, pb, 500);
  int64_t pfull[24];
  for (int b = 0; b < 2; b++) for (int h = 0; h < 3; h++) for (int t = 0; t < 4; t++) pfull[(b * 3 + h) * 4 + t] = pv[b * 4 + t];
  ref_rope(x, pfull, 4, 500, ref);
  if (yb) CHECK_NEAR(max_diff(yb, ref), 0, 1e-10);
  CHECK(yb != NULL);
  release_all(7, (em_tensor *[]){x, pos, y, xf, yf, pb, yb});
}

TEST(rope_position_zero_is_identity) {
  em_tensor *x = randt(EM_F32, SHAPE(3, 6)), *pos = ints(EM_I64, SHAPE(3), (int64_t[]){0, 0, 0});
  em_tensor *y = em_rope(x, pos, 10000);
  double ref[18];
  for (int i = 0; i < 18; i++) ref[i] = at(x, i);
  if (y) CHECK_NEAR(max_diff(y, ref), 0, 0);
  CHECK(y != NULL);
  release_all(3, (em_tensor *[]){x, pos, y});
}

TEST(rope_errors) {
  em_tensor *x = randt(EM_F32, SHAPE(2, 4, 5)), *pos = ints(EM_I64, SHAPE(4), (int64_t[]){0, 1, 2, 3});
  em_tensor *x6 = randt(EM_F32, SHAPE(2, 4, 6)), *p3 = ints(EM_I64, SHAPE(3), (int64_t[]){0, 1, 2});
  em_tensor *pf = randt(EM_F32, SHAPE(4));
  CHECK_ERR_CONTAINS(em_rope(x, pos, 10000) == NULL, "rope: expected an even last dim, got 5");
  CHECK_ERR_CONTAINS(em_rope(x6, p3, 10000) == NULL, "rope: positions of shape [3] do not broadcast to x's leading dims [2, 4]");
  CHECK_ERR_CONTAINS(em_rope(x6, pf, 10000) == NULL, "expected pos to be an integer tensor");
  CHECK_ERR_CONTAINS(em_rope(x6, pos, 0) == NULL, "theta");
  release_all(5, (em_tensor *[]){x, pos, x6, p3, pf});
}

static em_tensor *f_rope(em_tensor **in, const void *ctx) { EM_UNUSED(ctx); return em_rope(in[0], in[1], 100); }

TEST(rope_gradient_matches_finite_differences) {
  em_tensor *in[2] = {leaf(randt(EM_F64, SHAPE(2, 3, 6))), ints(EM_I64, SHAPE(3), (int64_t[]){0, 4, 9})};
  gradcheck("rope", f_rope, NULL, 2, in);
  release_all(2, in);
}

/* rope_qk: the same values as two em_rope calls, both gradients through one node. */
TEST(rope_qk_matches_two_ropes) {
  em_tensor *q = leaf(randt(EM_F64, SHAPE(2, 3, 4, 6))), *k = leaf(randt(EM_F64, SHAPE(2, 1, 4, 6)));
  em_tensor *pos = ints(EM_I64, SHAPE(4), (int64_t[]){0, 3, 7, 100000});
  em_tensor *qo = NULL, *ko = NULL;
  CHECK(em_rope_qk(q, k, pos, 500, &qo, &ko) == 0);
  bool prev = em_set_grad_enabled(false);
  em_tensor *qr = em_rope(q, pos, 500), *kr = em_rope(k, pos, 500);
  em_set_grad_enabled(prev);
  CHECK(qo && ko && qr && kr && shape_is(qo, SHAPE(2, 3, 4, 6)) && shape_is(ko, SHAPE(2, 1, 4, 6)));
  if (qo && ko && qr && kr) {
    double mq = 0, mk = 0;
    for (int64_t i = 0; i < em_numel(qo); i++) mq = fmax(mq, fabs(at(qo, i) - at(qr, i)));
    for (int64_t i = 0; i < em_numel(ko); i++) mk = fmax(mk, fabs(at(ko, i) - at(kr, i)));
    CHECK_NEAR(mq, 0, 0);
    CHECK_NEAR(mk, 0, 0);
  }
  /* k's output unused: q still gets its gradient (k's is the rotation of zeros) */
  em_tensor *g = randt(EM_F64, SHAPE(2, 3, 4, 6));
  CHECK(qo && em_backward(qo, g, false) == 0);
  CHECK(q->grad != NULL && k->grad != NULL);
  if (k->grad) {
    double mk = 0;
    for (int64_t i = 0; i < em_numel(k->grad); i++) mk = fmax(mk, fabs(at(k->grad, i)));
    CHECK_NEAR(mk, 0, 0);
  }
  release_all(8, (em_tensor *[]){q, k, pos, qo, ko, qr, kr, g});
}

TEST(rope_qk_errors) {
  em_tensor *q = randt(EM_F32, SHAPE(2, 4, 6)), *k5 = randt(EM_F32, SHAPE(2, 4, 5));
  em_tensor *pos = ints(EM_I64, SHAPE(4), (int64_t[]){0, 1, 2, 3}), *qo = q, *ko = q;
  CHECK_ERR_CONTAINS(em_rope_qk(q, k5, pos, 10000, &qo, &ko) != 0,
                     "rope_qk: expected an even last dim, got 5 (k has shape [2, 4, 5])");
  CHECK(qo == NULL && ko == NULL);
  release_all(3, (em_tensor *[]){q, k5, pos});
}

/* q and k weighed differently (3 q' + k'), so a swapped gradient fails. */
static em_tensor *f_rope_qk(em_tensor **in, const void *ctx) {
  EM_UNUSED(ctx);
  em_tensor *a, *b;
  if (em_rope_qk(in[0], in[1], in[2], 100, &a, &b)) return NULL;
  em_tensor *a3 = em_mul_scalar(a, 3.0), *s = a3 ? em_add(a3, b) : NULL;
  release_all(3, (em_tensor *[]){a, b, a3});
  return s;
}

TEST(rope_qk_gradient_matches_finite_differences) {
  em_tensor *in[3] = {leaf(randt(EM_F64, SHAPE(2, 3, 6))), leaf(randt(EM_F64, SHAPE(2, 3, 6))),
                      ints(EM_I64, SHAPE(3), (int64_t[]){0, 4, 9})};
  gradcheck("rope_qk", f_rope_qk, NULL, 3, in);
  release_all(3, in);
}

/* ---------------- attention ---------------- */

/* q (B, Tq, d), k/v (Bk, Tk, d|dv) with Bk in {1, B}; top-left causal. */
static void ref_attention(const em_tensor *q, const em_tensor *k, const em_tensor *v, bool causal, double scale,
                          double *ref) {
  int64_t B = q->shape[0], Tq = q->shape[1], d = q->shape[2], Tk = k->shape[1], dv = v->shape[2];
  for (int64_t b = 0; b < B; b++) {
    int64_t bk = k->shape[0] == 1 ? 0 : b;
    for (int64_t i = 0; i < Tq; i++) {
      double s[64], mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < Tk; j++) {
        double dot = 0;
        for (int64_t c = 0; c < d; c++) dot += at(q, (b * Tq + i) * d + c) * at(k, (bk * Tk + j) * d + c);
        s[j] = (causal && j > i) ? -INFINITY : dot * scale;
        if (s[j] > mx) mx = s[j];
      }
      for (int64_t j = 0; j < Tk; j++) { s[j] = exp(s[j] - mx); sum += s[j]; }
      for (int64_t c = 0; c < dv; c++) {
        double o = 0;
        for (int64_t j = 0; j < Tk; j++) o += s[j] / sum * at(v, (bk * Tk + j) * dv + c);
        ref[(b * Tq + i) * dv + c] = o;
      }
    }
  }
}

static void check_attention(int64_t B, int64_t Bk, int64_t Tq, int64_t Tk, bool causal, double scale) {
  em_tensor *q = randt(EM_F64, SHAPE(B, Tq, 4)), *k = randt(EM_F64, SHAPE(Bk, Tk, 4)), *v = randt(EM_F64, SHAPE(Bk, Tk, 3));
  em_tensor *o = em_attention_naive(q, k, v, causal, scale);
  CHECK(shape_is(o, SHAPE(B, Tq, 3)));
  if (o) {
    double ref[256];
    ref_attention(q, k, v, causal, scale > 0 ? scale : 0.5, ref);
    CHECK_NEAR(max_diff(o, ref), 0, 1e-13);
  }
  release_all(4, (em_tensor *[]){q, k, v, o});
}

TEST(attention_matches_explicit_loop) {
  check_attention(2, 2, 5, 5, false, 0);       /* scale 0 -> 1/sqrt(4) */
  check_attention(2, 2, 5, 5, true, 0);
  check_attention(2, 1, 3, 6, true, 0.3);      /* Tq < Tk, top-left aligned; k/v broadcast over batch */
  check_attention(1, 1, 6, 3, true, 0.7);      /* Tq > Tk: no row fully masked */
}

TEST(attention_errors) {
  em_tensor *q = randt(EM_F32, SHAPE(2, 3, 4)), *k = randt(EM_F32, SHAPE(2, 5, 6)), *v = randt(EM_F32, SHAPE(2, 5, 4));
  em_tensor *k4 = randt(EM_F32, SHAPE(2, 5, 4)), *v1 = randt(EM_F32, SHAPE(4)), *kd = randt(EM_F64, SHAPE(2, 5, 4));
  em_tensor *k3 = randt(EM_F32, SHAPE(3, 5, 4));
  CHECK_ERR_CONTAINS(em_attention_naive(q, k, v, true, 0) == NULL, "scaled_dot_product_attention: expected q (..., Tq, d)");
  CHECK_ERR_CONTAINS(em_attention_naive(q, k4, v1, true, 0) == NULL, "expected v with at least 2 dims");
  CHECK_ERR_CONTAINS(em_attention_naive(q, kd, v, true, 0) == NULL, "same dtype");
  CHECK_ERR_CONTAINS(em_attention_naive(q, k3, v, true, 0) == NULL, "cannot broadcast");
  release_all(7, (em_tensor *[]){q, k, v, k4, v1, kd, k3});
}

static em_tensor *f_attn(em_tensor **in, const void *ctx) {
  return em_attention_naive(in[0], in[1], in[2], *(const bool *)ctx, 0);
}

TEST(attention_gradients_match_finite_differences) {
  bool yes = true, no = false;
  em_tensor *in[3] = {leaf(randt(EM_F64, SHAPE(2, 3, 4))), leaf(randt(EM_F64, SHAPE(2, 3, 4))), leaf(randt(EM_F64, SHAPE(2, 3, 2)))};
  gradcheck("attention causal", f_attn, &yes, 3, in);
  gradcheck("attention full", f_attn, &no, 3, in);
  em_tensor *in2[3] = {leaf(randt(EM_F64, SHAPE(2, 2, 4))), leaf(randt(EM_F64, SHAPE(1, 5, 4))), leaf(randt(EM_F64, SHAPE(1, 5, 3)))};
  gradcheck("attention causal Tq != Tk, broadcast k/v", f_attn, &yes, 3, in2);
  release_all(3, in); release_all(3, in2);
}

/* ---------------- swiglu ---------------- */

TEST(swiglu_matches_formula) {
  em_tensor *a = vals(EM_F64, SHAPE(5), (double[]){-800, -2, 0, 0.5, 30}), *b = randt(EM_F64, SHAPE(5));
  em_tensor *y = em_swiglu(a, b);
  double ref[5];
  for (int i = 0; i < 5; i++) ref[i] = at(a, i) / (1 + exp(-at(a, i))) * at(b, i);
  CHECK(shape_is(y, SHAPE(5)));
  if (y) CHECK_NEAR(max_diff(y, ref), 0, 1e-14);
  em_tensor *af = em_to(a, EM_F32, em_cpu()), *bf = em_to(b, EM_F32, em_cpu()), *yf = em_swiglu(af, bf);
  if (yf) CHECK_NEAR(max_diff(yf, ref), 0, 1e-5);
  CHECK(yf && yf->dtype == EM_F32);
  em_tensor *c = randt(EM_F64, SHAPE(4));
  CHECK_ERR_CONTAINS(em_swiglu(a, c) == NULL, "swiglu: expected a and b to have the same shape, got [5] and [4]");
  CHECK_ERR_CONTAINS(em_swiglu(a, bf) == NULL, "same dtype");
  release_all(7, (em_tensor *[]){a, b, y, af, bf, yf, c});
}

static em_tensor *f_swiglu(em_tensor **in, const void *ctx) { EM_UNUSED(ctx); return em_swiglu(in[0], in[1]); }

TEST(swiglu_gradients_match_finite_differences) {
  em_tensor *in[2] = {leaf(randt(EM_F64, SHAPE(3, 4))), leaf(randt(EM_F64, SHAPE(3, 4)))};
  for (int i = 0; i < 12; i++) ((double *)em_data_ptr(in[0]))[i] *= 4;   /* cover the sigmoid's tails */
  gradcheck("swiglu", f_swiglu, NULL, 2, in);
  release_all(2, in);
}

/* ---------------- optimizers ---------------- */

TEST(adamw_matches_scalar_reimplementation_over_three_steps) {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  em_dtype dts[2] = {EM_F64, EM_F32};
  for (int di = 0; di < 2; di++) {
    em_tensor *p = leaf(randt(dts[di], SHAPE(2, 3))), *m = em_zeros(SHAPE(2, 3), dts[di], em_cpu());
    em_tensor *v = em_zeros(SHAPE(2, 3), dts[di], em_cpu());
    double rp[6], rm[6] = {0}, rv[6] = {0};
    for (int i = 0; i < 6; i++) rp[i] = at(p, i);
    uint32_t ver = p->storage->version;
    for (int step = 1; step <= 3; step++) {
      em_tensor *g = randt(dts[di], SHAPE(2, 3));
      CHECK(em_adamw_(1, &p, &g, &m, &v, lr, b1, b2, eps, wd, step) == 0);
      for (int i = 0; i < 6; i++) {
        double gi = at(g, i);
        rp[i] *= 1 - lr * wd;
        rm[i] = b1 * rm[i] + (1 - b1) * gi;
        rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
        double mh = rm[i] / (1 - pow(b1, step)), vh = rv[i] / (1 - pow(b2, step));
        rp[i] -= lr * mh / (sqrt(vh) + eps);
      }
      em_tensor_release(g);
    }
    double tol = dts[di] == EM_F64 ? 1e-14 : 1e-6;
    CHECK_NEAR(max_diff(p, rp), 0, tol);
    CHECK_NEAR(max_diff(m, rm), 0, tol);
    CHECK_NEAR(max_diff(v, rv), 0, tol);
    CHECK(p->storage->version == ver + 3);
    release_all(3, (em_tensor *[]){p, m, v});
  }
}

TEST(adamw_updates_strided_views) {
  em_tensor *pb = randt(EM_F64, SHAPE(3, 4)), *p = em_transpose(pb, 0, 1);   /* (4, 3) non-contiguous */
  em_tensor *g = randt(EM_F64, SHAPE(4, 3)), *m = em_zeros(SHAPE(4, 3), EM_F64, em_cpu());
  em_tensor *v = em_zeros(SHAPE(4, 3), EM_F64, em_cpu());
  double rp[12];
  for (int i = 0; i < 12; i++) {
    double gi = at(g, i), mh = 0.1 * gi / 0.1, vh = 0.001 * gi * gi / 0.001;
    rp[i] = at(p, i) - 1e-3 * mh / (sqrt(vh) + 1e-8);
  }
  CHECK(em_adamw_(1, &p, &g, &m, &v, 1e-3, 0.9, 0.999, 1e-8, 0, 1) == 0);
  CHECK_NEAR(max_diff(p, rp), 0, 1e-14);
  release_all(5, (em_tensor *[]){pb, p, g, m, v});
}

TEST(adamw_errors_name_the_index) {
  em_tensor *p0 = randt(EM_F32, SHAPE(2)), *p1 = randt(EM_F32, SHAPE(3));
  em_tensor *g0 = randt(EM_F32, SHAPE(2)), *g1 = randt(EM_F32, SHAPE(4)), *g1d = randt(EM_F64, SHAPE(3));
  em_tensor *m[2] = {em_zeros(SHAPE(2), EM_F32, em_cpu()), em_zeros(SHAPE(3), EM_F32, em_cpu())};
  em_tensor *v[2] = {em_zeros(SHAPE(2), EM_F32, em_cpu()), em_zeros(SHAPE(3), EM_F32, em_cpu())};
  em_tensor *ph = randt(EM_BF16, SHAPE(2));
  double before = at(p0, 0);
  CHECK_ERR_CONTAINS(em_adamw_(2, (em_tensor *[]){p0, p1}, (em_tensor *[]){g0, g1}, m, v, 1e-3, 0.9, 0.999, 1e-8, 0, 1) != 0,
                     "adamw_: grads[1] has shape [4], expected [3] (the shape of params[1])");
  CHECK(at(p0, 0) == before);                                 /* nothing written on error */
  CHECK_ERR_CONTAINS(em_adamw_(2, (em_tensor *[]){p0, p1}, (em_tensor *[]){g0, g1d}, m, v, 1e-3, 0.9, 0.999, 1e-8, 0, 1) != 0,
                     "grads[1] has dtype f64, expected f32");
  CHECK_ERR_CONTAINS(em_adamw_(1, &ph, &g0, m, v, 1e-3, 0.9, 0.999, 1e-8, 0, 1) != 0, "params[0] has dtype bf16");
  CHECK_ERR_CONTAINS(em_adamw_(1, &p0, &g0, m, v, 1e-3, 0.9, 0.999, 1e-8, 0, 0) != 0, "step >= 1");
  CHECK_ERR_CONTAINS(em_adamw_(1, &p0, (em_tensor *[]){NULL}, m, v, 1e-3, 0.9, 0.999, 1e-8, 0, 1) != 0,
                     "grads[0] is missing");
  CHECK_ERR_CONTAINS(em_adamw_(1, &p0, &g0, m, v, 1e-3, 1.5, 0.999, 1e-8, 0, 1) != 0, "beta1");
  release_all(10, (em_tensor *[]){p0, p1, g0, g1, g1d, m[0], m[1], v[0], v[1], ph});
}

TEST(sgd_with_momentum_and_weight_decay) {
  const double lr = 0.1, mu = 0.9, wd = 0.01;
  em_tensor *p = leaf(randt(EM_F64, SHAPE(4))), *b = em_zeros(SHAPE(4), EM_F64, em_cpu());
  double rp[4], rb[4];
  for (int i = 0; i < 4; i++) rp[i] = at(p, i);
  for (int step = 0; step < 3; step++) {
    em_tensor *g = randt(EM_F64, SHAPE(4));
    CHECK(em_sgd_(1, &p, &g, &b, lr, mu, wd, step == 0) == 0);
    for (int i = 0; i < 4; i++) {
      double d = at(g, i) + wd * rp[i];
      rb[i] = step == 0 ? d : mu * rb[i] + d;
      rp[i] -= lr * rb[i];
    }
    em_tensor_release(g);
  }
  CHECK_NEAR(max_diff(p, rp), 0, 1e-15);
  CHECK_NEAR(max_diff(b, rb), 0, 1e-15);
  /* plain SGD, no buffers */
  em_tensor *q = randt(EM_F32, SHAPE(3)), *g = randt(EM_F32, SHAPE(3));
  double rq[3];
  for (int i = 0; i < 3; i++) rq[i] = at(q, i) - 0.5 * at(g, i);
  CHECK(em_sgd_(1, &q, &g, NULL, 0.5, 0, 0, true) == 0);
  CHECK_NEAR(max_diff(q, rq), 0, 1e-7);
  CHECK_ERR_CONTAINS(em_sgd_(1, &q, &g, NULL, 0.5, 0.9, 0, true) != 0, "needs momentum buffers");
  release_all(4, (em_tensor *[]){p, b, q, g});
}

TEST(sum_of_squares_accumulates_over_tensors) {
  em_tensor *a = vals(EM_F32, SHAPE(2, 2), (double[]){1, 2, 3, 4});
  em_tensor *bb = vals(EM_F64, SHAPE(2, 3), (double[]){1, 0, 2, 0, 3, 0}), *b = em_narrow(bb, 1, 0, 1);  /* {1, 0}: strided */
  em_tensor *c = vals(EM_BF16, SHAPE(1), (double[]){0.5});
  em_tensor *s = em_sum_of_squares(3, (em_tensor *[]){a, b, c});
  CHECK(s && s->ndim == 0 && s->dtype == EM_F32);
  if (s) CHECK_NEAR(at(s, 0), 30 + 1 + 0.25, 0);
  em_tensor *z = em_sum_of_squares(0, NULL);
  if (z) CHECK_NEAR(at(z, 0), 0, 0);
  CHECK(z != NULL);
  CHECK_ERR_CONTAINS(em_sum_of_squares(2, (em_tensor *[]){a, NULL}) == NULL, "tensors[1] is missing");
  release_all(6, (em_tensor *[]){a, bb, b, c, s, z});
}

/* ---------------- degenerate inputs: no crash, PyTorch's answers ---------------- */

TEST(degenerate_shapes_do_not_crash) {
  em_tensor *x = randt(EM_F32, SHAPE(2, 0)), *w = randt(EM_F32, SHAPE(3, 0)), *b = vals(EM_F32, SHAPE(3), (double[]){1, 2, 3});
  em_tensor *y = em_linear(x, w, b);                         /* in_features 0: the bias */
  CHECK(shape_is(y, SHAPE(2, 3)));
  if (y) CHECK_NEAR(max_diff(y, (double[]){1, 2, 3, 1, 2, 3}), 0, 0);
  em_tensor *lg = leaf(randt(EM_F32, SHAPE(0, 4))), *tg = ints(EM_I64, SHAPE(0), NULL);
  em_tensor *l = em_cross_entropy(lg, tg);                   /* mean over no targets: NaN, as torch */
  CHECK(l && isnan(at(l, 0)));
  CHECK(l && em_backward(l, NULL, false) == 0 && lg->grad && em_numel(lg->grad) == 0);
  em_tensor *xn = randt(EM_F32, SHAPE(0, 8)), *n0 = em_rmsnorm(xn, NULL, 1e-5);
  CHECK(shape_is(n0, SHAPE(0, 8)));
  em_tensor *v1 = randt(EM_F64, SHAPE(4)), *p0 = ints(EM_I64, 0, NULL, (int64_t[]){3});
  em_tensor *r1 = em_rope(v1, p0, 10000);                    /* one row, scalar position */
  double ref[4];
  ref_rope(v1, (int64_t[]){3}, 0, 10000, ref);
  CHECK(shape_is(r1, SHAPE(4)));
  if (r1) CHECK_NEAR(max_diff(r1, ref), 0, 1e-14);
  em_tensor *bad = ints(EM_I64, SHAPE(1), (int64_t[]){5});   /* error path with a grad-requiring input */
  em_tensor *lg2 = leaf(randt(EM_F32, SHAPE(1, 4)));
  CHECK_ERR_CONTAINS(em_cross_entropy(lg2, bad) == NULL, "target 5");
  release_all(14, (em_tensor *[]){x, w, b, y, lg, tg, l, xn, n0, v1, p0, r1, bad, lg2});
}

/* ---------------- low precision backward ---------------- */

/* loss = cross_entropy(linear(swiglu(rmsnorm(x, wn), x), w), t), returned with its grads. */
static em_tensor *small_net(em_tensor *x, em_tensor *wn, em_tensor *w, em_tensor *t) {
  em_tensor *n = em_rmsnorm(x, wn, 1e-5), *s = n ? em_swiglu(n, x) : NULL, *y = s ? em_linear(s, w, NULL) : NULL;
  em_tensor *l = y ? em_cross_entropy(y, t) : NULL;
  release_all(3, (em_tensor *[]){n, s, y});
  return l;
}

TEST(bf16_gradients_follow_f32_gradients) {
  em_tensor *x = randt(EM_F32, SHAPE(4, 8)), *wn = randt(EM_F32, SHAPE(8)), *w = randt(EM_F32, SHAPE(5, 8));
  em_tensor *t = ints(EM_I64, SHAPE(4), (int64_t[]){0, 4, 2, 1});
  em_tensor *f[3] = {leaf(em_clone(x)), leaf(em_clone(wn)), leaf(em_clone(w))};
  em_tensor *h[3] = {leaf(em_to(x, EM_BF16, em_cpu())), leaf(em_clone(wn)), leaf(em_to(w, EM_BF16, em_cpu()))};
  em_tensor *lf = small_net(f[0], f[1], f[2], t), *lh = small_net(h[0], h[1], h[2], t);
  CHECK(lf && lh && lh->dtype == EM_BF16);
  CHECK(lf && em_backward(lf, NULL, false) == 0);
  CHECK(lh && em_backward(lh, NULL, false) == 0);
  for (int i = 0; i < 3; i++) {
    CHECK(h[i]->grad && h[i]->grad->dtype == h[i]->dtype);
    if (!h[i]->grad || !f[i]->grad) continue;
    double ref[40];
    for (int64_t e = 0; e < em_numel(f[i]); e++) ref[e] = at(f[i]->grad, e);
    CHECK_NEAR(max_diff(h[i]->grad, ref), 0, 3e-2);           /* bf16 inputs: ~3 significant digits */
  }
  release_all(6, (em_tensor *[]){x, wn, w, t, lf, lh});
  release_all(3, f); release_all(3, h);
}

int main(void) {
  RUN(matmul_2d_matches_triple_loop);
  RUN(matmul_broadcasts_batch_dims);
  RUN(matmul_handles_transposed_and_strided_inputs);
  RUN(matmul_1d_cases_follow_torch);
  RUN(matmul_low_precision_and_integers);
  RUN(matmul_empty_dims_give_empty_or_zero_results);
  RUN(matmul_errors_name_shapes_and_dtypes);
  RUN(matmul_gradients_match_finite_differences);
  RUN(linear_matches_reference);
  RUN(linear_errors);
  RUN(linear_gradients_match_finite_differences);
  RUN(cross_entropy_matches_direct_formula);
  RUN(cross_entropy_is_stable_for_large_logits);
  RUN(cross_entropy_errors);
  RUN(cross_entropy_gradient_matches_finite_differences);
  RUN(embedding_gathers_rows);
  RUN(embedding_backward_scatter_adds_repeated_ids);
  RUN(embedding_errors);
  RUN(embedding_gradient_matches_finite_differences);
  RUN(rmsnorm_matches_formula);
  RUN(rmsnorm_errors);
  RUN(rmsnorm_gradients_match_finite_differences);
  RUN(rope_matches_formula);
  RUN(rope_position_zero_is_identity);
  RUN(rope_errors);
  RUN(rope_gradient_matches_finite_differences);
  RUN(rope_qk_matches_two_ropes);
  RUN(rope_qk_errors);
  RUN(rope_qk_gradient_matches_finite_differences);
  RUN(attention_matches_explicit_loop);
  RUN(attention_errors);
  RUN(attention_gradients_match_finite_differences);
  RUN(swiglu_matches_formula);
  RUN(swiglu_gradients_match_finite_differences);
  RUN(adamw_matches_scalar_reimplementation_over_three_steps);
  RUN(adamw_updates_strided_views);
  RUN(adamw_errors_name_the_index);
  RUN(sgd_with_momentum_and_weight_decay);
  RUN(sum_of_squares_accumulates_over_tensors);
  RUN(degenerate_shapes_do_not_crash);
  RUN(bf16_gradients_follow_f32_gradients);
  TEST_MAIN_END();
}
