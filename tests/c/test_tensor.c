/* Tensors: creation (shapes, dtypes, contiguous strides, arange/linspace/eye),
 * views (shared storage, shape/stride/offset of view/transpose/permute/narrow/
 * select/squeeze/unsqueeze/expand/flatten; view vs reshape on non-contiguous
 * input), em_is_contiguous edge cases, copy_ (broadcast, dtype conversion,
 * strided destinations), fill_, em_to round trips, em_set_, scalar access, and
 * error paths: each must fail with NULL/-1 and a message naming the op and
 * what was expected vs received. */
#include <stdint.h>
#include <stdlib.h>
#include "test_util.h"   /* ARR, SHAPE, REL, at, shape_is, CHECK_VALS */
#include "internal.h"   /* em_as_strided */

static bool stride_is(const em_tensor *t, int ndim, const int64_t *stride) {
  return t && t->ndim == ndim && memcmp(t->stride, stride, sizeof(int64_t) * (size_t)ndim) == 0;
}
#define CHECK_SHAPE(t, ...) CHECK(shape_is((t), SHAPE(__VA_ARGS__)))
#define CHECK_STRIDE(t, ...) CHECK(stride_is((t), SHAPE(__VA_ARGS__)))

/* 0, 1, ..., n-1 as f32 viewed with the given shape (fresh contiguous tensor). */
static em_tensor *iota(int ndim, const int64_t *shape, em_dtype dt) {
  em_tensor *t = em_empty(ndim, shape, dt, em_cpu());
  for (int64_t i = 0; i < em_numel(t); i++) em_store_f64(t->storage->data, dt, i, (double)i);
  return t;
}
static em_tensor *vec(int n, const double *v, em_dtype dt) {
  int64_t s[1] = {n};
  em_tensor *t = em_empty(1, s, dt, em_cpu());
  for (int i = 0; i < n; i++) em_store_f64(t->storage->data, dt, i, v[i]);
  return t;
}
#define VEC(dt, ...) vec((int)(sizeof((double[]){__VA_ARGS__}) / sizeof(double)), (double[]){__VA_ARGS__}, dt)

/* Expect NULL and a message containing all of the needles. */
static void expect_null_msg(em_tensor *r, const char *const *needles, int n, int line) {
  test_checks++;
  bool ok = r == NULL;
  for (int i = 0; ok && i < n; i++) ok = strstr(em_last_error(), needles[i]) != NULL;
  if (!ok) {
    test_failures++;
    fprintf(stderr, "%s:%d: expected NULL with a message containing", __FILE__, line);
    for (int i = 0; i < n; i++) fprintf(stderr, " '%s'", needles[i]);
    fprintf(stderr, "; got %s, message '%s'\n", r ? "a tensor" : "NULL", em_last_error());
  }
  em_tensor_release(r);
}
#define EXPECT_NULL(expr, ...) expect_null_msg((em_clear_error(), (expr)), (const char *[]){__VA_ARGS__}, \
    (int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(char *)), __LINE__)
static void expect_fail_msg(int rc, const char *const *needles, int n, int line) {
  test_checks++;
  bool ok = rc < 0;
  for (int i = 0; ok && i < n; i++) ok = strstr(em_last_error(), needles[i]) != NULL;
  if (!ok) {
    test_failures++;
    fprintf(stderr, "%s:%d: expected rc < 0 with a message containing", __FILE__, line);
    for (int i = 0; i < n; i++) fprintf(stderr, " '%s'", needles[i]);
    fprintf(stderr, "; got rc %d, message '%s'\n", rc, em_last_error());
  }
}
#define EXPECT_FAIL(expr, ...) expect_fail_msg((em_clear_error(), (expr)), (const char *[]){__VA_ARGS__}, \
    (int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(char *)), __LINE__)

/* ---------------- creation ---------------- */

TEST(creation_shapes_and_strides) {
  em_tensor *t = em_empty(SHAPE(2, 3, 4), EM_F32, em_cpu());
  CHECK(t != NULL);
  CHECK_SHAPE(t, 2, 3, 4);
  CHECK_STRIDE(t, 12, 4, 1);
  CHECK(t->offset == 0 && t->dtype == EM_F32 && t->device.type == EM_CPU);
  CHECK(t->refcount == 1 && t->storage->refcount == 1 && t->storage->nbytes == 96);
  CHECK(!t->requires_grad && t->grad == NULL && t->grad_fn == NULL);
  CHECK(em_numel(t) == 24 && em_is_contiguous(t));
  CHECK(em_data_ptr(t) == t->storage->data);
  em_tensor_release(t);

  for (int d = 0; d < EM_NDTYPES; d++) {
    em_tensor *z = em_zeros(SHAPE(5, 3), (em_dtype)d, em_cpu());
    CHECK(z && z->dtype == (em_dtype)d && z->storage->nbytes == 15 * em_dtype_size((em_dtype)d));
    CHECK_STRIDE(z, 3, 1);
    bool zero = true;
    for (size_t i = 0; z && i < z->storage->nbytes; i++) zero &= ((unsigned char *)z->storage->data)[i] == 0;
    CHECK(zero);
    em_tensor *f = em_full(SHAPE(2, 2), 3.0, (em_dtype)d, em_cpu());
    double want = d == EM_BOOL ? 1 : 3;
    CHECK_VALS(f, want, want, want, want);
    em_tensor *e = em_empty_like(f), *zl = em_zeros_like(f);
    CHECK(e && e->dtype == f->dtype && shape_is(e, SHAPE(2, 2)) && e->storage != f->storage);
    CHECK_VALS(zl, 0, 0, 0, 0);
    REL(z, f, e, zl);
  }
  /* full converts the value to the dtype (round to nearest even / truncation) */
  em_tensor *fb = em_full(SHAPE(3), 1.0 / 3.0, EM_BF16, em_cpu());
  CHECK(fb && ((uint16_t *)fb->storage->data)[2] == 0x3eab);
  em_tensor *fi = em_full(SHAPE(2), -3.7, EM_I32, em_cpu());
  CHECK_VALS(fi, -3, -3);
  em_tensor *fo = em_full(SHAPE(2), 0.25, EM_BOOL, em_cpu());
  CHECK_VALS(fo, 1, 1);
  REL(fb, fi, fo);

  /* 0-d */
  em_tensor *s = em_scalar_tensor(4.5, EM_F64, em_cpu());
  double v = 0;
  CHECK(s && s->ndim == 0 && em_numel(s) == 1 && em_is_contiguous(s));
  CHECK(em_item(s, &v) == 0 && v == 4.5);
  em_tensor_release(s);

  /* empty tensors: PyTorch strides (a 0 size counts as 1), contiguous */
  em_tensor *e = em_empty(SHAPE(2, 0, 3), EM_F32, em_cpu());
  CHECK(e && em_numel(e) == 0 && e->storage->nbytes == 0 && e->storage->data != NULL);
  CHECK_STRIDE(e, 3, 3, 1);
  CHECK(em_is_contiguous(e));
  em_tensor_release(e);
  em_tensor *e1 = em_zeros(SHAPE(0), EM_I64, em_cpu());
  CHECK(e1 && e1->ndim == 1 && e1->shape[0] == 0);
  em_tensor_release(e1);
  /* eight dims is the maximum */
  em_tensor *m8 = em_zeros(SHAPE(1, 2, 1, 2, 1, 2, 1, 2), EM_U8, em_cpu());
  CHECK(m8 && m8->ndim == 8 && m8->stride[0] == 16 && m8->stride[7] == 1);
  em_tensor_release(m8);
}

TEST(creation_errors) {
  EXPECT_NULL(em_empty(9, (int64_t[9]){1, 1, 1, 1, 1, 1, 1, 1, 1}, EM_F32, em_cpu()), "empty:",
              "at most 8 dims", "got 9");
  EXPECT_NULL(em_empty(SHAPE(2, -1), EM_F32, em_cpu()), "empty:", "negative size -1", "dim 1");
  EXPECT_NULL(em_empty(SHAPE((int64_t)1 << 40, (int64_t)1 << 40), EM_F32, em_cpu()), "empty:", "too large");
  EXPECT_NULL(em_empty(SHAPE(2), (em_dtype)42, em_cpu()), "empty:", "invalid dtype 42");
  /* the wrappers name themselves, not the helper they call */
  EXPECT_NULL(em_zeros(SHAPE(-2), EM_F32, em_cpu()), "zeros:", "negative size -2");
  EXPECT_NULL(em_full(SHAPE(3, -4), 1.0, EM_F32, em_cpu()), "full:", "negative size -4");
  EXPECT_NULL(em_eye(-1, 3, EM_F32, em_cpu()), "eye:", "-1");
  EXPECT_NULL(em_arange(0, 5, 0, EM_F32, em_cpu()), "arange:", "step must be nonzero");
  EXPECT_NULL(em_arange(0, INFINITY, 1, EM_F32, em_cpu()), "arange:", "finite");
  EXPECT_NULL(em_arange(0, NAN, 1, EM_F32, em_cpu()), "arange:", "finite");
  EXPECT_NULL(em_arange(0, 1e15, 1, EM_F32, em_cpu()), "arange:", "too many");
  EXPECT_NULL(em_linspace(0, 1, -3, EM_F32, em_cpu()), "linspace:", "non-negative", "got -3");
  /* a view over storage that is too small */
  em_storage *st = em_storage_new(16, em_cpu());
  EXPECT_NULL(em_tensor_from_storage(st, 0, SHAPE(5), ARR(1), EM_F32), "from_storage:", "past the storage",
              "16 bytes");
  EXPECT_NULL(em_tensor_from_storage(st, 1, SHAPE(2, 2), ARR(2, 1), EM_F32), "from_storage:", "past the storage");
  EXPECT_NULL(em_tensor_from_storage(st, -1, SHAPE(2), ARR(1), EM_F32), "from_storage:");
  EXPECT_NULL(em_tensor_from_storage(st, 1, SHAPE(3), ARR(-1), EM_F32), "from_storage:");  /* reaches -1 */
  em_tensor *ok = em_tensor_from_storage(st, 3, SHAPE(4), ARR(-1), EM_F32);  /* elements 3,2,1,0 */
  CHECK(ok && st->refcount == 2);
  em_tensor *ok2 = em_tensor_from_storage(st, 0, SHAPE(2, 2), ARR(2, 1), EM_F32);
  CHECK(ok2 && ok2->offset == 0);
  em_tensor *ok0 = em_tensor_from_storage(st, 100, SHAPE(0, 3), ARR(3, 1), EM_F32);  /* nothing addressed */
  CHECK(ok0 != NULL);
  REL(ok, ok2, ok0);
  em_storage_release(st);
}

TEST(arange_linspace_eye) {
  em_tensor *a = em_arange(0, 5, 1, EM_F32, em_cpu());
  CHECK_SHAPE(a, 5);
  CHECK_VALS(a, 0, 1, 2, 3, 4);
  em_tensor *b = em_arange(1, 2, 0.25, EM_F64, em_cpu());
  CHECK_VALS(b, 1, 1.25, 1.5, 1.75);
  em_tensor *c = em_arange(5, 0, -2, EM_I64, em_cpu());
  CHECK(c && c->dtype == EM_I64);
  CHECK_VALS(c, 5, 3, 1);
  em_tensor *d = em_arange(0, 0, 1, EM_F32, em_cpu());
  CHECK_SHAPE(d, 0);
  em_tensor *e = em_arange(0, 1, 0.1, EM_F64, em_cpu());     /* torch.arange(0, 1, 0.1): 10 elements */
  CHECK_SHAPE(e, 10);
  REL(a, b, c, d, e);

  em_tensor *l = em_linspace(0, 1, 5, EM_F32, em_cpu());
  CHECK_VALS(l, 0, 0.25, 0.5, 0.75, 1);
  em_tensor *l1 = em_linspace(3, 10, 1, EM_F32, em_cpu());  /* torch.linspace(3, 10, 1) = [3] */
  CHECK_VALS(l1, 3);
  em_tensor *l0 = em_linspace(3, 10, 0, EM_F32, em_cpu());
  CHECK_SHAPE(l0, 0);
  em_tensor *l2 = em_linspace(-1, 1, 2, EM_F64, em_cpu());
  CHECK_VALS(l2, -1, 1);
  /* the end is hit exactly and the halves are symmetric (PyTorch computes the second half from the end) */
  em_tensor *l3 = em_linspace(0, 0.3, 4, EM_F64, em_cpu());
  CHECK(l3 && at(l3, 3) == 0.3 && at(l3, 0) == 0);
  CHECK(l3 && at(l3, 1) == 0.3 / 3 && at(l3, 2) == 0.3 - 0.3 / 3);
  REL(l, l1, l0, l2, l3);

  em_tensor *i3 = em_eye(3, -1, EM_F32, em_cpu());
  CHECK_SHAPE(i3, 3, 3);
  CHECK_VALS(i3, 1, 0, 0, 0, 1, 0, 0, 0, 1);
  em_tensor *i23 = em_eye(2, 3, EM_I64, em_cpu());
  CHECK_VALS(i23, 1, 0, 0, 0, 1, 0);
  em_tensor *i32 = em_eye(3, 2, EM_BF16, em_cpu());
  CHECK_VALS(i32, 1, 0, 0, 1, 0, 0);
  em_tensor *i0 = em_eye(0, -1, EM_F32, em_cpu());
  CHECK_SHAPE(i0, 0, 0);
  REL(i3, i23, i32, i0);
}

/* ---------------- views ---------------- */

TEST(view_and_reshape) {
  em_tensor *x = iota(SHAPE(2, 3, 4), EM_F32);
  em_tensor *v = em_view(x, SHAPE(4, -1));
  CHECK_SHAPE(v, 4, 6);
  CHECK_STRIDE(v, 6, 1);
  CHECK(v && v->storage == x->storage && v->offset == 0 && x->storage->refcount == 2);
  CHECK(v && at(v, 13) == 13);
  em_tensor *v2 = em_view(x, SHAPE(-1));
  CHECK_SHAPE(v2, 24);
  em_tensor *v3 = em_view(x, SHAPE(2, 1, 12, 1));
  CHECK_STRIDE(v3, 12, 12, 1, 1);
  /* writes through a view are visible in the base */
  bool g = em_set_grad_enabled(false);
  em_tensor *one = em_select(v, 0, 1);
  CHECK(em_fill_(one, -1) == 0);
  em_set_grad_enabled(g);
  CHECK(at(x, 5) == 5 && at(x, 6) == -1 && at(x, 11) == -1 && at(x, 12) == 12);
  REL(v, v2, v3, one);

  EXPECT_NULL(em_view(x, SHAPE(-1, -1)), "view:", "only one dimension can be -1");
  EXPECT_NULL(em_view(x, SHAPE(5, 5)), "view:", "shape [5, 5] is invalid for input of size 24", "[2, 3, 4]");
  EXPECT_NULL(em_view(x, SHAPE(5, -1)), "view:", "shape [5, -1] is invalid for input of size 24");
  EXPECT_NULL(em_view(x, SHAPE(0, -1)), "view:", "invalid for input of size 24");
  EXPECT_NULL(em_view(x, SHAPE(-2, 12)), "view:", "invalid size -2");
  EXPECT_NULL(em_reshape(x, SHAPE(7)), "reshape:", "[7] is invalid for input of size 24");

  /* view of a transposed tensor: impossible without a copy, and the message shows both shapes */
  em_tensor *y = iota(SHAPE(2, 3), EM_F32);
  em_tensor *yt = em_transpose(y, 0, 1);
  CHECK_SHAPE(yt, 3, 2);
  CHECK_STRIDE(yt, 1, 3);
  EXPECT_NULL(em_view(yt, SHAPE(6)), "view:", "shape [3, 2]", "strides [1, 3]", "as [6]", "reshape");
  EXPECT_NULL(em_view(yt, SHAPE(2, 3)), "view:", "shape [3, 2]", "as [2, 3]");
  /* views that only add or split compatible dims are fine */
  em_tensor *ok = em_view(yt, SHAPE(3, 1, 2));
  CHECK_SHAPE(ok, 3, 1, 2);
  CHECK(ok && ok->stride[0] == 1 && ok->stride[2] == 3 && ok->storage == y->storage);
  /* reshape copies instead */
  em_tensor *r = em_reshape(yt, SHAPE(6));
  CHECK(r && r->storage != y->storage && em_is_contiguous(r));
  CHECK_VALS(r, 0, 3, 1, 4, 2, 5);
  /* and shares storage when a view is possible */
  em_tensor *r2 = em_reshape(y, SHAPE(3, -1));
  CHECK(r2 && r2->storage == y->storage);
  CHECK_SHAPE(r2, 3, 2);
  /* narrow: splitting the strided outer dim is a view, merging across the gap is not */
  em_tensor *z = iota(SHAPE(4, 6), EM_F32);
  em_tensor *zn = em_narrow(z, 1, 0, 3);
  em_tensor *zv = em_view(zn, SHAPE(2, 2, 3));
  CHECK_STRIDE(zv, 12, 6, 1);
  EXPECT_NULL(em_view(zn, SHAPE(12)), "view:", "shape [4, 3]", "strides [6, 1]", "as [12]");
  em_tensor *zr = em_reshape(zn, SHAPE(12));
  CHECK_VALS(zr, 0, 1, 2, 6, 7, 8, 12, 13, 14, 18, 19, 20);
  em_tensor *zr2 = em_reshape(zn, SHAPE(2, -1, 3));      /* non-contiguous but viewable: reshape is a view */
  CHECK(zr2 && zr2->storage == z->storage);
  CHECK_STRIDE(zr2, 12, 6, 1);
  /* -1 inferred over a larger tensor */
  em_tensor *big = iota(SHAPE(240), EM_F32), *bv = em_view(big, SHAPE(-1, 8)), *bv2 = em_view(big, SHAPE(2, -1, 4, 5));
  CHECK_SHAPE(bv, 30, 8);
  CHECK_SHAPE(bv2, 2, 6, 4, 5);
  CHECK_STRIDE(bv2, 120, 20, 5, 1);
  REL(zr2, big, bv, bv2);
  /* empty and 0-d */
  em_tensor *e = em_zeros(SHAPE(0, 4), EM_F32, em_cpu());
  em_tensor *ev = em_view(e, SHAPE(4, 0, 2));
  CHECK_SHAPE(ev, 4, 0, 2);
  EXPECT_NULL(em_view(e, SHAPE(-1, 0)), "view:", "invalid for input of size 0");
  em_tensor *s = em_scalar_tensor(7, EM_F32, em_cpu());
  em_tensor *s1 = em_view(s, SHAPE(1, 1));
  CHECK_SHAPE(s1, 1, 1);
  em_tensor *s0 = em_view(s1, 0, NULL);
  CHECK(s0 && s0->ndim == 0 && at(s0, 0) == 7);
  REL(x, y, yt, ok, r, r2, z, zn, zv, zr, e, ev, s, s1, s0);
}

TEST(transpose_permute) {
  em_tensor *x = iota(SHAPE(2, 3, 4), EM_F32);
  em_tensor *t = em_transpose(x, 0, -1);
  CHECK_SHAPE(t, 4, 3, 2);
  CHECK_STRIDE(t, 1, 4, 12);
  CHECK(t && t->storage == x->storage && t->offset == 0 && !em_is_contiguous(t));
  CHECK(t && at(t, 1) == 12 && at(t, 2) == 4);          /* t[0][0][1] = x[1][0][0], t[0][1][0] = x[0][1][0] */
  em_tensor *tt = em_transpose(t, 2, 0);
  CHECK_STRIDE(tt, 12, 4, 1);
  CHECK(tt && em_is_contiguous(tt));
  em_tensor *same = em_transpose(x, 1, 1);
  CHECK_STRIDE(same, 12, 4, 1);
  EXPECT_NULL(em_transpose(x, 0, 3), "transpose:", "dim 3 out of range", "3 dims", "-3..2");
  EXPECT_NULL(em_transpose(x, -4, 0), "transpose:", "dim -4 out of range");
  em_tensor *s = em_scalar_tensor(1, EM_F32, em_cpu());
  em_tensor *st = em_transpose(s, 0, -1);
  CHECK(st && st->ndim == 0);
  EXPECT_NULL(em_transpose(s, 0, 1), "transpose:", "out of range");

  em_tensor *p = em_permute(x, SHAPE(2, 0, 1));
  CHECK_SHAPE(p, 4, 2, 3);
  CHECK_STRIDE(p, 1, 12, 4);
  CHECK(p && p->storage == x->storage);
  CHECK(p && at(p, 1) == 4 && at(p, 3) == 12 && at(p, 6) == 1);
  em_tensor *pn = em_permute(x, SHAPE(-1, -3, -2));
  CHECK_STRIDE(pn, 1, 12, 4);
  EXPECT_NULL(em_permute(x, SHAPE(0, 1)), "permute:", "expected 3 dims", "got 2");
  EXPECT_NULL(em_permute(x, SHAPE(0, 1, 1)), "permute:", "dim 1 repeats");
  EXPECT_NULL(em_permute(x, SHAPE(0, -3, 2)), "permute:", "dim 0 repeats");
  EXPECT_NULL(em_permute(x, SHAPE(0, 1, 3)), "permute:", "dim 3 out of range");
  REL(x, t, tt, same, s, st, p, pn);
}

TEST(narrow_select) {
  em_tensor *x = iota(SHAPE(4, 6), EM_F32);
  em_tensor *n = em_narrow(x, 1, 2, 3);
  CHECK_SHAPE(n, 4, 3);
  CHECK_STRIDE(n, 6, 1);
  CHECK(n && n->offset == 2 && n->storage == x->storage && !em_is_contiguous(n));
  CHECK_VALS(n, 2, 3, 4, 8, 9, 10, 14, 15, 16, 20, 21, 22);
  em_tensor *nn = em_narrow(n, 0, -2, 2);              /* negative start counts from the end */
  CHECK(nn && nn->offset == 14);
  CHECK_VALS(nn, 14, 15, 16, 20, 21, 22);
  em_tensor *n0 = em_narrow(x, 0, 4, 0);              /* empty at the end: allowed */
  CHECK_SHAPE(n0, 0, 6);
  em_tensor *rows = em_narrow(x, 0, 1, 2);
  CHECK(rows && rows->offset == 6 && em_is_contiguous(rows));
  EXPECT_NULL(em_narrow(x, 1, 5, 3), "narrow:", "start 5 + length 3", "dim 1 of size 6");
  EXPECT_NULL(em_narrow(x, 1, 0, -1), "narrow:", "length -1");
  EXPECT_NULL(em_narrow(x, 1, -7, 1), "narrow:", "out of range");
  EXPECT_NULL(em_narrow(x, 2, 0, 1), "narrow:", "dim 2 out of range");
  EXPECT_NULL(em_narrow(x, 1, 2, INT64_MAX), "narrow:", "out of range for dim 1 of size 6");  /* start + len overflows */
  EXPECT_NULL(em_narrow(x, 1, INT64_MAX, 2), "narrow:", "out of range");
  EXPECT_NULL(em_narrow(x, 1, INT64_MIN, 1), "narrow:", "out of range");

  em_tensor *s = em_select(x, 0, 2);
  CHECK_SHAPE(s, 6);
  CHECK_STRIDE(s, 1);
  CHECK(s && s->offset == 12 && s->storage == x->storage);
  em_tensor *c = em_select(x, 1, -1);
  CHECK_SHAPE(c, 4);
  CHECK_STRIDE(c, 6);
  CHECK(c && c->offset == 5);
  CHECK_VALS(c, 5, 11, 17, 23);
  em_tensor *cc = em_select(c, 0, 3);
  CHECK(cc && cc->ndim == 0 && cc->offset == 23 && at(cc, 0) == 23);
  EXPECT_NULL(em_select(x, 0, 4), "select:", "index 4 is out of range for dim 0 of size 4");
  EXPECT_NULL(em_select(x, 1, -7), "select:", "index -7", "size 6");
  EXPECT_NULL(em_select(cc, 0, 0), "select:", "0-dim");
  EXPECT_NULL(em_narrow(cc, 0, 0, 1), "narrow:", "0-dim");
  REL(x, n, nn, n0, rows, s, c, cc);
}

TEST(squeeze_unsqueeze_expand_flatten) {
  em_tensor *x = iota(SHAPE(1, 3, 1, 2), EM_F32);
  em_tensor *a = em_squeeze(x, EM_ALL_DIMS);
  CHECK_SHAPE(a, 3, 2);
  CHECK_STRIDE(a, 2, 1);
  CHECK(a && a->storage == x->storage);
  em_tensor *b = em_squeeze(x, 2);
  CHECK_SHAPE(b, 1, 3, 2);
  em_tensor *c = em_squeeze(x, 1);                     /* size 3: no-op, as PyTorch */
  CHECK_SHAPE(c, 1, 3, 1, 2);
  em_tensor *d = em_squeeze(x, -4);
  CHECK_SHAPE(d, 3, 1, 2);
  EXPECT_NULL(em_squeeze(x, 4), "squeeze:", "dim 4 out of range");
  em_tensor *s0 = em_scalar_tensor(1, EM_F32, em_cpu());
  em_tensor *s0a = em_squeeze(s0, 0), *s0b = em_squeeze(s0, -1), *s0c = em_squeeze(s0, EM_ALL_DIMS);
  CHECK(s0a && s0b && s0c && s0a->ndim == 0 && s0c->ndim == 0);
  EXPECT_NULL(em_squeeze(s0, 1), "squeeze:", "dim 1 out of range", "0 dims");
  REL(s0, s0a, s0b, s0c);

  em_tensor *y = iota(SHAPE(2, 3), EM_F32);
  em_tensor *u0 = em_unsqueeze(y, 0), *u1 = em_unsqueeze(y, 1), *u2 = em_unsqueeze(y, -1);
  CHECK_SHAPE(u0, 1, 2, 3);
  CHECK_STRIDE(u0, 6, 3, 1);
  CHECK_SHAPE(u1, 2, 1, 3);
  CHECK_STRIDE(u1, 3, 3, 1);
  CHECK_SHAPE(u2, 2, 3, 1);
  CHECK_STRIDE(u2, 3, 1, 1);
  CHECK(u1 && u1->storage == y->storage && em_is_contiguous(u1));
  EXPECT_NULL(em_unsqueeze(y, 3), "unsqueeze:", "dim 3 out of range");
  em_tensor *m8 = em_zeros(SHAPE(1, 1, 1, 1, 1, 1, 1, 1), EM_F32, em_cpu());
  EXPECT_NULL(em_unsqueeze(m8, 0), "unsqueeze:", "8 dims");
  em_tensor *s = em_scalar_tensor(2, EM_F32, em_cpu());
  em_tensor *su = em_unsqueeze(s, 0);
  CHECK_SHAPE(su, 1);
  CHECK_STRIDE(su, 1);

  /* expand: stride 0 on broadcast dims, storage shared */
  em_tensor *col = iota(SHAPE(3, 1), EM_F32);
  em_tensor *e = em_expand(col, SHAPE(2, 3, 4));
  CHECK_SHAPE(e, 2, 3, 4);
  CHECK_STRIDE(e, 0, 1, 0);
  CHECK(e && e->storage == col->storage && !em_is_contiguous(e));
  CHECK(e && at(e, 0) == 0 && at(e, 5) == 1 && at(e, 23) == 2);
  em_tensor *e2 = em_expand(col, SHAPE(-1, 5));
  CHECK_SHAPE(e2, 3, 5);
  CHECK_STRIDE(e2, 1, 0);
  em_tensor *e0 = em_expand(col, SHAPE(3, 0));         /* 1 -> 0 is allowed */
  CHECK_SHAPE(e0, 3, 0);
  EXPECT_NULL(em_expand(col, SHAPE(2, 5)), "expand:", "size 3 of dim 0 cannot be expanded to 2", "[3, 1]", "[2, 5]");
  EXPECT_NULL(em_expand(col, SHAPE(3)), "expand:", "cannot expand shape [3, 1] to 1 dims");
  EXPECT_NULL(em_expand(col, SHAPE(-1, 3, 1)), "expand:", "-1", "leading dim 0");
  EXPECT_NULL(em_expand(col, SHAPE(3, -2)), "expand:", "-2");
  EXPECT_NULL(em_expand(col, SHAPE(-3, 3, 1)), "expand:", "-3");

  em_tensor *z = iota(SHAPE(2, 3, 4), EM_F32);
  em_tensor *f1 = em_flatten(z, 1, 2);
  CHECK_SHAPE(f1, 2, 12);
  CHECK(f1 && f1->storage == z->storage);
  em_tensor *f2 = em_flatten(z, 0, -1);
  CHECK_SHAPE(f2, 24);
  em_tensor *f3 = em_flatten(z, 1, 1);
  CHECK_SHAPE(f3, 2, 3, 4);
  em_tensor *zt = em_transpose(z, 0, 2);
  em_tensor *f4 = em_flatten(zt, 0, 1);                /* not viewable: copies */
  CHECK_SHAPE(f4, 12, 2);
  CHECK(f4 && f4->storage != z->storage && at(f4, 1) == 12 && at(f4, 2) == 4);
  em_tensor *f5 = em_flatten(s, 0, -1);
  CHECK_SHAPE(f5, 1);
  EXPECT_NULL(em_flatten(z, 2, 1), "flatten:", "start_dim 2", "end_dim 1");
  EXPECT_NULL(em_flatten(z, 0, 3), "flatten:", "dim 3 out of range");
  REL(x, a, b, c, d, y, u0, u1, u2, m8, s, su, col, e, e2, e0, z, f1, f2, f3, zt, f4, f5);
}

TEST(is_contiguous_cases) {
  em_tensor *x = iota(SHAPE(3, 4), EM_F32);
  CHECK(em_is_contiguous(x));
  em_tensor *t = em_transpose(x, 0, 1);
  CHECK(!em_is_contiguous(t));
  /* size-1 dims may carry any stride */
  em_tensor *a = em_as_strided(x, SHAPE(3, 1), ARR(1, 99), 0);
  CHECK(em_is_contiguous(a));
  em_tensor *b = em_as_strided(x, SHAPE(1, 1), ARR(7, 5), 2);
  CHECK(em_is_contiguous(b));
  em_tensor *c = em_as_strided(x, SHAPE(1, 4, 1), ARR(-3, 1, 0), 0);
  CHECK(em_is_contiguous(c));
  em_tensor *c2 = em_as_strided(x, SHAPE(2, 1, 3), ARR(3, 42, 1), 0);
  CHECK(em_is_contiguous(c2));
  em_tensor *c3 = em_as_strided(x, SHAPE(2, 1, 3), ARR(4, 42, 1), 0);  /* gap between rows */
  CHECK(!em_is_contiguous(c3));
  /* empty tensors are contiguous whatever the strides */
  em_tensor *e = em_as_strided(x, SHAPE(0, 3), ARR(5, 7), 0);
  CHECK(em_is_contiguous(e));
  em_tensor *e2 = em_as_strided(x, SHAPE(3, 0), ARR(1, 3), 0);
  CHECK(em_is_contiguous(e2));
  /* stride 0 on a real dim is not */
  em_tensor *z = em_as_strided(x, SHAPE(2, 3), ARR(0, 1), 0);
  CHECK(!em_is_contiguous(z));
  em_tensor *sel = em_select(x, 0, 1), *col = em_select(x, 1, 1);
  CHECK(em_is_contiguous(sel) && !em_is_contiguous(col));
  em_tensor *s = em_select(sel, 0, 2);
  CHECK(em_is_contiguous(s));
  em_tensor *w = em_as_strided(x, SHAPE(3), ARR(2), 0);
  CHECK(!em_is_contiguous(w));
  REL(x, t, a, b, c, c2, c3, e, e2, z, sel, col, s, w);
}

/* ---------------- copies and conversions ---------------- */

TEST(copy_broadcast_and_convert) {
  em_tensor *dst = em_zeros(SHAPE(2, 3), EM_F32, em_cpu());
  em_tensor *row = VEC(EM_F64, 1, 2, 3);
  uint32_t v0 = dst->storage->version;
  CHECK(em_copy_(dst, row) == 0);
  CHECK(dst->storage->version == v0 + 1);
  CHECK_VALS(dst, 1, 2, 3, 1, 2, 3);
  em_tensor *colsrc = VEC(EM_I64, 10, 20), *colv = em_view(colsrc, SHAPE(2, 1));
  CHECK(em_copy_(dst, colv) == 0);
  CHECK_VALS(dst, 10, 10, 10, 20, 20, 20);
  em_tensor *sc = em_scalar_tensor(-0.5, EM_BF16, em_cpu());
  CHECK(em_copy_(dst, sc) == 0);
  CHECK_VALS(dst, -0.5, -0.5, -0.5, -0.5, -0.5, -0.5);
  em_tensor *two = VEC(EM_F32, 1, 2);
  EXPECT_FAIL(em_copy_(dst, two), "copy_:", "cannot broadcast", "[2, 3]", "[2]");
  em_tensor *big = em_zeros(SHAPE(4, 2, 3), EM_F32, em_cpu());
  EXPECT_FAIL(em_copy_(dst, big), "copy_:", "source of shape [4, 2, 3] cannot be broadcast to destination shape [2, 3]");
  em_tensor *small = em_zeros(SHAPE(3), EM_F32, em_cpu());
  EXPECT_FAIL(em_copy_(small, dst), "copy_:", "[2, 3]", "destination shape [3]");

  /* dtype conversions */
  em_tensor *f = VEC(EM_F32, 1.5, -2.5, 3.7, -0.2);
  em_tensor *i = em_zeros(SHAPE(4), EM_I32, em_cpu());
  CHECK(em_copy_(i, f) == 0);
  CHECK_VALS(i, 1, -2, 3, 0);                          /* truncation toward zero */
  em_tensor *bo = em_zeros(SHAPE(4), EM_BOOL, em_cpu());
  CHECK(em_copy_(bo, f) == 0);
  CHECK_VALS(bo, 1, 1, 1, 1);
  em_tensor *bb = em_zeros(SHAPE(4), EM_BF16, em_cpu());
  em_tensor *third = VEC(EM_F64, 1.0 / 3, 1, 257, 259);
  CHECK(em_copy_(bb, third) == 0);
  CHECK(((uint16_t *)bb->storage->data)[0] == 0x3eab);
  CHECK_VALS(bb, 0.333984375, 1, 256, 260);            /* 8 significant bits: 257, 259 are ties -> even */
  em_tensor *hf = em_zeros(SHAPE(4), EM_F16, em_cpu());
  CHECK(em_copy_(hf, bb) == 0);                        /* bf16 -> f16 */
  CHECK_VALS(hf, 0.333984375, 1, 256, 260);
  /* integers copy exactly, without a trip through double */
  em_tensor *big64 = em_zeros(SHAPE(2), EM_I64, em_cpu());
  ((int64_t *)big64->storage->data)[0] = ((int64_t)1 << 53) + 1;
  ((int64_t *)big64->storage->data)[1] = -3;
  em_tensor *u8 = em_zeros(SHAPE(2), EM_U8, em_cpu());
  CHECK(em_copy_(u8, big64) == 0);
  CHECK(((uint8_t *)u8->storage->data)[0] == 1 && ((uint8_t *)u8->storage->data)[1] == 253);
  em_tensor *c64 = em_zeros(SHAPE(2), EM_I64, em_cpu());
  em_tensor *big12 = em_view(big64, SHAPE(1, 2));
  em_tensor *bigt = em_transpose(big12, 0, 1);         /* strided source */
  em_tensor *c64v = em_view(c64, SHAPE(2, 1));
  CHECK(em_copy_(c64v, bigt) == 0);
  CHECK(((int64_t *)c64->storage->data)[0] == ((int64_t)1 << 53) + 1);

  /* between integer dtypes through the strided path: exact too */
  em_tensor *d32 = em_full(SHAPE(4), 7, EM_I32, em_cpu());
  em_tensor *every2 = em_as_strided(d32, SHAPE(2), ARR(2), 0);
  CHECK(em_copy_(every2, big64) == 0);
  CHECK_VALS(d32, 1, 7, -3, 7);
  REL(d32, every2);

  /* into a strided (transposed) destination */
  em_tensor *base = em_zeros(SHAPE(2, 3), EM_F32, em_cpu());
  em_tensor *bt = em_transpose(base, 0, 1);
  em_tensor *src = iota(SHAPE(3, 2), EM_F64);
  CHECK(em_copy_(bt, src) == 0);
  CHECK_VALS(base, 0, 2, 4, 1, 3, 5);
  /* into a column (narrow), broadcasting a scalar-like source */
  em_tensor *colw = em_narrow(base, 1, 1, 1);
  em_tensor *nine = em_scalar_tensor(9, EM_I32, em_cpu());
  CHECK(em_copy_(colw, nine) == 0);
  CHECK_VALS(base, 0, 9, 4, 1, 9, 5);
  /* empty copies are fine */
  em_tensor *e1 = em_zeros(SHAPE(0, 3), EM_F32, em_cpu()), *e2 = em_zeros(SHAPE(3), EM_F64, em_cpu());
  CHECK(em_copy_(e1, e2) == 0);
  REL(dst, two, big12, row, colsrc, colv, sc, big, small, f, i, bo, bb, third, hf, big64, u8, c64, bigt, c64v,
      base, bt, src, colw, nine, e1, e2);
}

static void keep_data(em_storage *s) { (void)s; }

TEST(copy_fill_refusals) {
  em_tensor *p = em_zeros(SHAPE(3), EM_F32, em_cpu());
  em_set_requires_grad(p, true);
  em_tensor *src = em_zeros(SHAPE(3), EM_F32, em_cpu());
  EXPECT_FAIL(em_copy_(p, src), "copy_:", "requires grad");
  EXPECT_FAIL(em_fill_(p, 1), "fill_:", "requires grad");
  /* a source that requires grad is refused while grad mode is on */
  EXPECT_FAIL(em_copy_(src, p), "copy_:", "source requires grad");
  bool g = em_set_grad_enabled(false);
  CHECK(em_copy_(p, src) == 0 && em_fill_(p, 2) == 0 && em_copy_(src, p) == 0);
  em_set_grad_enabled(g);
  CHECK_VALS(src, 2, 2, 2);
  /* read-only storage (as a memory-mapped file's) */
  float data[3] = {1, 2, 3};
  em_storage *ro = em_storage_wrap(data, sizeof data, em_cpu(), keep_data, NULL);
  ro->flags |= EM_STORAGE_READONLY;
  em_tensor *r = em_tensor_from_storage(ro, 0, SHAPE(3), ARR(1), EM_F32);
  em_storage_release(ro);
  uint32_t v = r->storage->version;
  EXPECT_FAIL(em_copy_(r, src), "copy_:", "read-only");
  EXPECT_FAIL(em_fill_(r, 0), "fill_:", "read-only");
  CHECK(data[0] == 1 && data[2] == 3 && r->storage->version == v);
  /* reading is fine */
  em_tensor *rc = em_clone(r);
  CHECK_VALS(rc, 1, 2, 3);
  REL(p, src, r, rc);
}

TEST(fill) {
  em_tensor *x = iota(SHAPE(3, 4), EM_F32);
  em_tensor *c = em_narrow(x, 1, 1, 2);
  uint32_t v = x->storage->version;
  CHECK(em_fill_(c, -1) == 0);
  CHECK(x->storage->version == v + 1);
  CHECK_VALS(x, 0, -1, -1, 3, 4, -1, -1, 7, 8, -1, -1, 11);
  CHECK(em_fill_(x, 0.1) == 0);
  CHECK(((float *)x->storage->data)[11] == 0.1f);
  const double val = 1.0 / 3;
  for (int d = 0; d < EM_NDTYPES; d++) {
    em_tensor *t = em_zeros(SHAPE(2, 3), (em_dtype)d, em_cpu());
    em_tensor *tt = em_transpose(t, 0, 1);
    bool unsig = d == EM_U8 || d == EM_U16 || d == EM_BOOL;
    CHECK(em_fill_(tt, unsig ? 2.75 : -2.75) == 0);      /* through a strided view */
    double want = d == EM_BOOL ? 1 : em_dtype_is_float((em_dtype)d) ? -2.75 : unsig ? 2 : -2;
    CHECK_VALS(t, want, want, want, want, want, want);
    CHECK(em_fill_(t, val) == 0);
    double expect_v;
    uint64_t bits = 0;
    em_store_f64(&bits, (em_dtype)d, 0, val);
    expect_v = em_load_f64(&bits, (em_dtype)d, 0);
    CHECK_VALS(t, expect_v, expect_v, expect_v, expect_v, expect_v, expect_v);
    REL(t, tt);
  }
  em_tensor *e = em_zeros(SHAPE(0), EM_F32, em_cpu());
  CHECK(em_fill_(e, 5) == 0);
  REL(x, c, e);
}

TEST(to_round_trips) {
  em_tensor *f = VEC(EM_F32, 1.5, -2.25, 3e38, 1e-40, -0.0);
  em_tensor *same = em_to(f, EM_F32, em_cpu());
  CHECK(same == f && f->refcount == 2);                /* nothing to do: the same tensor, retained */
  em_tensor_release(same);
  em_tensor *d = em_to(f, EM_F64, em_cpu());
  CHECK(d && d->dtype == EM_F64 && d->storage != f->storage && em_is_contiguous(d));
  em_tensor *back = em_to(d, EM_F32, em_cpu());
  CHECK(back && memcmp(back->storage->data, f->storage->data, 5 * sizeof(float)) == 0);
  em_tensor *b = em_to(f, EM_BF16, em_cpu());
  CHECK_VALS(b, 1.5, -2.25, (double)em_bf16_to_f32(em_f32_to_bf16(3e38f)), (double)em_bf16_to_f32(em_f32_to_bf16(1e-40f)), -0.0);
  em_tensor *bf = em_to(b, EM_F32, em_cpu()), *bb = em_to(bf, EM_BF16, em_cpu());
  CHECK(bb && memcmp(bb->storage->data, b->storage->data, 5 * 2) == 0);   /* bf16 -> f32 -> bf16 exact */
  em_tensor *h = em_to(f, EM_F16, em_cpu());
  CHECK(h && isinf(at(h, 2)) && at(h, 3) == 0 && at(h, 0) == 1.5);     /* 3e38 overflows f16 */
  em_tensor *i = em_to(f, EM_I64, em_cpu());
  CHECK(i && ((int64_t *)i->storage->data)[0] == 1 && ((int64_t *)i->storage->data)[1] == -2);
  /* i64 -> f64 -> i64 exact up to 2^53 */
  em_tensor *big = em_zeros(SHAPE(2), EM_I64, em_cpu());
  ((int64_t *)big->storage->data)[0] = ((int64_t)1 << 53) - 1;
  ((int64_t *)big->storage->data)[1] = -(((int64_t)1 << 52) + 3);
  em_tensor *bd = em_to(big, EM_F64, em_cpu()), *bi = em_to(bd, EM_I64, em_cpu());
  CHECK(bi && memcmp(bi->storage->data, big->storage->data, 16) == 0);
  /* a non-contiguous source gives a contiguous result in logical order */
  em_tensor *x = iota(SHAPE(2, 3), EM_F32), *xt = em_transpose(x, 0, 1);
  em_tensor *xd = em_to(xt, EM_F64, em_cpu());
  CHECK(xd && em_is_contiguous(xd));
  CHECK_SHAPE(xd, 3, 2);
  CHECK_VALS(xd, 0, 3, 1, 4, 2, 5);
  em_tensor *xs = em_to(xt, EM_F32, em_cpu());
  CHECK(xs == xt);                                     /* same dtype and device: no copy even if strided */
  em_device cuda = {EM_CUDA, 0};
  if (!em_cuda_compiled()) EXPECT_NULL(em_to(f, EM_F32, cuda), "to:", "no CUDA backend");
  else if (!em_cuda_available()) EXPECT_NULL(em_to(f, EM_F32, cuda), "to:", "no CUDA device");
  REL(f, d, back, b, bf, bb, h, i, big, bd, bi, x, xt, xd, xs);
}

static int freed_count = 0;
static void count_free(em_storage *s) { freed_count++; free(s->data); }

TEST(set_rebinds) {
  float *buf = malloc(16 * sizeof(float));
  for (int k = 0; k < 16; k++) buf[k] = (float)k;
  em_storage *flat_st = em_storage_wrap(buf, 16 * sizeof(float), em_cpu(), count_free, NULL);
  em_tensor *flat = em_tensor_from_storage(flat_st, 0, SHAPE(16), ARR(1), EM_F32);
  em_storage_release(flat_st);

  float *own = malloc(4 * sizeof(float));
  em_storage *own_st = em_storage_wrap(own, 4 * sizeof(float), em_cpu(), count_free, NULL);
  em_tensor *p = em_tensor_from_storage(own_st, 0, SHAPE(2, 2), ARR(2, 1), EM_F32);
  em_storage_release(own_st);
  em_set_requires_grad(p, true);
  em_tensor *g = em_zeros(SHAPE(2, 2), EM_F32, em_cpu());
  CHECK(em_set_grad(p, g) == 0);

  /* rebind p to flat[2:6] as 2x2: the old storage dies (its only owner was p), the grad stays */
  em_tensor *win4 = em_narrow(flat, 0, 2, 4);
  em_tensor *win = em_view(win4, SHAPE(2, 2));
  freed_count = 0;
  CHECK(em_set_(p, win) == 0);
  CHECK(freed_count == 1);
  CHECK(p->storage == flat->storage && p->offset == 2 && p->dtype == EM_F32);
  CHECK_SHAPE(p, 2, 2);
  CHECK_STRIDE(p, 2, 1);
  CHECK(p->grad == g);                                 /* same shape/dtype/device: kept */
  CHECK_VALS(p, 2, 3, 4, 5);
  bool gm = em_set_grad_enabled(false);
  CHECK(em_fill_(p, -1) == 0);                         /* writes land in the flat buffer */
  em_set_grad_enabled(gm);
  CHECK(buf[1] == 1 && buf[2] == -1 && buf[5] == -1 && buf[6] == 6);
  /* a different shape drops the grad */
  em_tensor *win3 = em_narrow(flat, 0, 10, 3);
  CHECK(em_set_(p, win3) == 0);
  CHECK(p->grad == NULL && p->requires_grad);
  CHECK_SHAPE(p, 3);
  CHECK(p->offset == 10);
  /* a different dtype drops it too */
  em_tensor *g3 = em_zeros(SHAPE(3), EM_F32, em_cpu());
  CHECK(em_set_grad(p, g3) == 0);
  em_tensor *d = VEC(EM_F64, 7, 8, 9);
  CHECK(em_set_(p, d) == 0);
  CHECK(p->dtype == EM_F64 && p->grad == NULL && p->storage == d->storage);
  CHECK_VALS(p, 7, 8, 9);
  /* refusals */
  em_tensor *ints = VEC(EM_I64, 1, 2, 3);
  EXPECT_FAIL(em_set_(p, ints), "set_:", "requires grad", "i64");
  CHECK(p->dtype == EM_F64 && p->storage == d->storage);    /* unchanged after the refusal */
  em_tensor *y = em_mul_scalar(p, 2);                  /* a non-leaf */
  EXPECT_FAIL(em_set_(y, d), "set_:", "leaf");
  /* a plain tensor can take any dtype */
  em_tensor *q = em_zeros(SHAPE(1), EM_F32, em_cpu());
  CHECK(em_set_(q, ints) == 0 && q->dtype == EM_I64 && em_numel(q) == 3);
  /* p let go of flat's storage when rebound to d: it dies with its last view */
  freed_count = 0;
  REL(win, win3, g, g3, d, ints, y, q);
  CHECK(freed_count == 0);
  em_tensor_release(win4);
  CHECK(freed_count == 0);
  em_tensor_release(flat);
  CHECK(freed_count == 1);
  em_tensor_release(p);
  CHECK(freed_count == 1);
}

TEST(scalar_access) {
  em_tensor *x = iota(SHAPE(2, 3), EM_F64);
  double v = -1;
  CHECK(em_get_f64(x, (int64_t[]){1, 2}, &v) == 0 && v == 5);
  EXPECT_FAIL(em_get_f64(x, (int64_t[]){2, 0}, &v), "get_f64:", "index 2 is out of range for dim 0 of size 2");
  EXPECT_FAIL(em_get_f64(x, (int64_t[]){0, -1}, &v), "get_f64:", "index -1", "dim 1 of size 3");
  EXPECT_FAIL(em_item(x, &v), "item:", "one element", "shape [2, 3]", "6 elements");
  em_tensor *e = em_zeros(SHAPE(0), EM_F32, em_cpu());
  EXPECT_FAIL(em_item(e, &v), "item:", "shape [0]", "0 elements");
  em_tensor *o = em_full(SHAPE(1, 1, 1), -2.5, EM_BF16, em_cpu());
  CHECK(em_item(o, &v) == 0 && v == -2.5);
  em_tensor *b = em_full(SHAPE(1), 7, EM_BOOL, em_cpu());
  CHECK(em_item(b, &v) == 0 && v == 1);
  em_tensor *t = em_transpose(x, 0, 1);
  CHECK(em_get_f64(t, (int64_t[]){2, 1}, &v) == 0 && v == 5);
  em_tensor *s = em_select(t, 0, 1);
  em_tensor *s1 = em_narrow(s, 0, 1, 1);
  CHECK(em_item(s1, &v) == 0 && v == 4);
  REL(x, e, o, b, t, s, s1);
}

TEST(shape_str_and_wrap_dim) {
  char buf[64];
  CHECK(strcmp(em_shape_str(SHAPE(2, 3), buf, sizeof buf), "[2, 3]") == 0);
  CHECK(strcmp(em_shape_str(0, NULL, buf, sizeof buf), "[]") == 0);
  char tiny[4];
  em_shape_str(SHAPE(12345, 6), tiny, sizeof tiny);
  CHECK(strlen(tiny) < sizeof tiny);
  int d = -1;
  CHECK(em_wrap_dim("op", -1, 3, &d) == 0 && d == 2);
  CHECK(em_wrap_dim("op", 0, 0, &d) == 0 && d == 0);
  EXPECT_FAIL(em_wrap_dim("myop", 3, 3, &d), "myop:", "dim 3 out of range", "3 dims", "-3..2");
}

/* copy_ between overlapping views of one storage copies as if through a
 * temporary (memmove), and arange refuses a step pointing away from end. */
TEST(overlapping_copy_and_arange_step_sign) {
  int64_t n = 8;
  em_tensor *a = em_arange(0, 8, 1, EM_F32, em_cpu());
  CHECK(a && em_numel(a) == n);
  em_tensor *lo = em_narrow(a, 0, 0, 6), *hi = em_narrow(a, 0, 2, 6);
  CHECK(lo && hi && em_copy_(hi, lo) == 0);   /* a[2:8] = a[0:6] */
  const float want[8] = {0, 1, 0, 1, 2, 3, 4, 5};
  float *p = em_data_ptr(a);
  for (int i = 0; i < 8; i++) CHECK_NEAR(p[i], want[i], 0);
  em_tensor_release(lo); em_tensor_release(hi); em_tensor_release(a);
  CHECK_ERR_CONTAINS(em_arange(0, 5, -1, EM_F32, em_cpu()) == NULL, "step sign");
  CHECK_ERR_CONTAINS(em_arange(5, 0, 1, EM_I64, em_cpu()) == NULL, "step sign");
  em_tensor *e = em_arange(3, 3, -1, EM_F32, em_cpu());   /* empty range: fine either way */
  CHECK(e && em_numel(e) == 0);
  em_tensor_release(e);
  em_tensor *d = em_arange(5, 0, -2, EM_F32, em_cpu());   /* 5, 3, 1 */
  CHECK(d && em_numel(d) == 3 && ((float *)em_data_ptr(d))[2] == 1.0f);
  em_tensor_release(d);
}

int main(void) {
  RUN(creation_shapes_and_strides);
  RUN(creation_errors);
  RUN(arange_linspace_eye);
  RUN(view_and_reshape);
  RUN(transpose_permute);
  RUN(narrow_select);
  RUN(squeeze_unsqueeze_expand_flatten);
  RUN(is_contiguous_cases);
  RUN(copy_broadcast_and_convert);
  RUN(copy_fill_refusals);
  RUN(fill);
  RUN(to_round_trips);
  RUN(set_rebinds);
  RUN(scalar_access);
  RUN(shape_str_and_wrap_dim);
  RUN(overlapping_copy_and_arange_step_sign);
  TEST_MAIN_END();
}
