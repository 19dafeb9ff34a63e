/* The autograd engine, driven directly: gradient sums over a diamond,
 * accumulation across backward calls, retain_graph, the saved-tensor version
 * check, post-accumulate-grad hooks (once per backward, after the grad is
 * final, newest node first, removal, errors), a .grad that is a view into a
 * flat buffer (accumulated in place), a 200000-node chain (backward and
 * release without recursion, on a small thread stack), grad mode, and the
 * root gradient (implicit for one element, converted to the root's dtype). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include "test_util.h"   /* ARR, SHAPE, REL, at, CHECK_VALS */

static em_tensor *vec(int n, const double *v, em_dtype dt, bool rg) {
  em_tensor *t = em_empty(SHAPE(n), dt, em_cpu());
  for (int i = 0; i < n; i++) em_store_f64(t->storage->data, dt, i, v[i]);
  if (rg) em_set_requires_grad(t, true);
  return t;
}
#define VEC(dt, ...) vec((int)(sizeof((double[]){__VA_ARGS__}) / sizeof(double)), (double[]){__VA_ARGS__}, dt, false)
#define LEAF(dt, ...) vec((int)(sizeof((double[]){__VA_ARGS__}) / sizeof(double)), (double[]){__VA_ARGS__}, dt, true)

static em_tensor *sum_all(em_tensor *t) { return em_sum(t, 0, NULL, false); }

/* ---------------- sums, accumulation, retain_graph ---------------- */

TEST(diamond_accumulates) {
  /* x -> a = 2x, b = x*x -> y = a + b -> s = sum(y): ds/dx = 2 + 2x */
  em_tensor *x = LEAF(EM_F32, 1, 2, 3);
  em_tensor *a = em_mul_scalar(x, 2), *b = em_mul(x, x), *y = em_add(a, b), *s = sum_all(y);
  CHECK(s && s->grad_fn && s->requires_grad && !x->grad_fn);
  CHECK(em_backward(s, NULL, false) == 0);
  CHECK(x->grad && x->grad->dtype == EM_F32 && x->grad->ndim == 1 && em_is_contiguous(x->grad));
  CHECK_VALS(x->grad, 4, 6, 8);
  CHECK(!x->grad->requires_grad && x->grad->grad_fn == NULL);
  CHECK(a->grad == NULL && y->grad == NULL);             /* non-leaves keep no .grad */
  /* two paths of different lengths into one leaf, via views (x used three times) */
  em_tensor *w = LEAF(EM_F64, 1, 2, 3, 4);
  em_tensor *w2 = em_view(w, SHAPE(2, 2)), *wt = em_transpose(w2, 0, 1), *p = em_mul(w2, wt);
  em_tensor *q = em_add(p, w2), *r = sum_all(q);
  CHECK(em_backward(r, NULL, false) == 0);
  /* r = sum_ij w_ij w_ji + sum w: d/dw_ij = 2 w_ji + 1 */
  CHECK_VALS(w->grad, 3, 7, 5, 9);
  REL(x, a, b, y, s, w, w2, wt, p, q, r);
}

TEST(accumulation_across_backwards) {
  em_tensor *x = LEAF(EM_F32, 1, -1);
  for (int k = 0; k < 2; k++) {                          /* a fresh graph each time */
    em_tensor *y = em_mul_scalar(x, 3), *s = sum_all(y);
    CHECK(em_backward(s, NULL, false) == 0);
    REL(y, s);
  }
  CHECK_VALS(x->grad, 6, 6);
  em_tensor *g = x->grad;
  /* the same graph twice with retain_graph: grads keep adding, in the same .grad tensor */
  em_tensor *y = em_mul(x, x), *s = sum_all(y);
  CHECK(em_backward(s, NULL, true) == 0);
  CHECK_VALS(x->grad, 8, 4);
  CHECK(em_backward(s, NULL, true) == 0);
  CHECK_VALS(x->grad, 10, 2);
  CHECK(x->grad == g);
  /* clearing .grad starts over */
  CHECK(em_set_grad(x, NULL) == 0 && x->grad == NULL);
  CHECK(em_backward(s, NULL, false) == 0);
  CHECK_VALS(x->grad, 2, -2);
  REL(x, y, s);
}

TEST(second_backward_needs_retain_graph) {
  em_tensor *x = LEAF(EM_F32, 1, 2), *w = LEAF(EM_F32, 3, 4);
  em_tensor *y = em_mul(x, w), *s = sum_all(y);
  CHECK(em_backward(s, NULL, false) == 0);
  CHECK_VALS(x->grad, 3, 4);
  em_clear_error();
  CHECK_ERR_CONTAINS(em_backward(s, NULL, false) < 0, "retain_graph");
  CHECK(strstr(em_last_error(), "backward:") == em_last_error());
  CHECK(strstr(em_last_error(), "second time") != NULL);
  CHECK_VALS(x->grad, 3, 4);                             /* a failed backward leaves .grad alone */
  CHECK_VALS(w->grad, 1, 2);
  /* a new graph over the same leaves works */
  em_tensor *y2 = em_mul(x, w), *s2 = sum_all(y2);
  CHECK(em_backward(s2, NULL, false) == 0);
  CHECK_VALS(x->grad, 6, 8);
  REL(x, w, y, s, y2, s2);
}

/* ---------------- version check ---------------- */

TEST(inplace_modification_detected) {
  em_tensor *x = LEAF(EM_F32, 1, 2, 3);
  em_tensor *c = VEC(EM_F32, 4, 5, 6);
  em_tensor *y = em_mul(x, c), *s = sum_all(y);           /* mul saves c */
  CHECK(em_fill_(c, 0) == 0);
  em_clear_error();
  CHECK_ERR_CONTAINS(em_backward(s, NULL, true) < 0, "modified by an in-place operation");
  CHECK(strstr(em_last_error(), "'mul'") != NULL);        /* names the op that saved it */
  CHECK(x->grad == NULL);
  REL(y, s);
  /* through an in-place op (out == a) on a view of the saved tensor's storage */
  em_tensor *y2 = em_mul(x, c), *s2 = sum_all(y2);
  em_tensor *cv = em_narrow(c, 0, 1, 1);
  em_tensor *one = VEC(EM_F32, 1);
  em_tensor *r = em_binary(EM_ADD, cv, one, cv);
  CHECK(r == cv);
  em_clear_error();
  CHECK_ERR_CONTAINS(em_backward(s2, NULL, false) < 0, "modified by an in-place operation");
  REL(r, y2, s2, cv, one);
  /* modifying a leaf under no_grad after it was saved */
  em_tensor *y3 = em_mul(x, x), *s3 = sum_all(y3);
  bool g = em_set_grad_enabled(false);
  CHECK(em_fill_(x, 7) == 0);
  em_set_grad_enabled(g);
  em_clear_error();
  CHECK_ERR_CONTAINS(em_backward(s3, NULL, false) < 0, "modified by an in-place operation");
  /* an op that saved nothing is not affected: add does not need its inputs */
  em_tensor *y4 = em_add(x, c), *s4 = sum_all(y4);
  CHECK(em_fill_(c, 9) == 0);
  CHECK(em_backward(s4, NULL, false) == 0);
  CHECK_VALS(x->grad, 1, 1, 1);
  /* and unmodified saved tensors pass */
  em_tensor *y5 = em_mul(x, c), *s5 = sum_all(y5);
  CHECK(em_backward(s5, NULL, false) == 0);
  CHECK_VALS(x->grad, 10, 10, 10);
  REL(x, c, y3, s3, y4, s4, y5, s5);
}

/* ---------------- hooks ---------------- */

typedef struct { int calls; double seen[4]; int n; int frees; } hook_rec;

static int record_grad(em_tensor *leaf, void *ud) {
  hook_rec *r = ud;
  r->calls++;
  r->n = leaf->grad ? (int)em_numel(leaf->grad) : -1;
  for (int i = 0; i < r->n && i < 4; i++) r->seen[i] = at(leaf->grad, i);
  return 0;
}
static void rec_free(void *ud) { ((hook_rec *)ud)->frees++; }

TEST(hook_sees_final_grad_once) {
  /* w feeds two ops, through paths of different lengths: the hook must see the total */
  em_tensor *w = LEAF(EM_F32, 1, 1);
  em_tensor *a = VEC(EM_F32, 2, 3), *b = VEC(EM_F32, 10, 20);
  hook_rec rec = {0};
  int id = em_register_post_accumulate_grad_hook(w, record_grad, &rec, rec_free);
  CHECK(id > 0);
  em_tensor *p = em_mul(w, a), *p2 = em_mul_scalar(p, 1), *p3 = em_add_scalar(p2, 5);
  em_tensor *q = em_mul(w, b), *y = em_add(p3, q), *s = sum_all(y);
  CHECK(em_backward(s, NULL, false) == 0);
  CHECK(rec.calls == 1);
  CHECK(rec.n == 2 && rec.seen[0] == 12 && rec.seen[1] == 23);
  /* second backward: fires once more and sees the accumulated grad */
  em_tensor *pp = em_mul(w, a), *s3 = sum_all(pp);
  CHECK(em_backward(s3, NULL, false) == 0);
  CHECK(rec.calls == 2 && rec.seen[0] == 14 && rec.seen[1] == 26);
  /* a hook id that does not exist */
  CHECK(em_remove_hook(w, id + 1000) == 1);
  CHECK(em_remove_hook(w, id) == 0);
  CHECK(rec.frees == 1);                                 /* ud_free runs on removal */
  CHECK(em_remove_hook(w, id) == 1);
  em_tensor *pp2 = em_mul(w, a), *s4 = sum_all(pp2);
  CHECK(em_backward(s4, NULL, false) == 0);
  CHECK(rec.calls == 2);                                 /* removed: no longer fires */
  CHECK_VALS(w->grad, 16, 29);
  /* ud_free also runs when the leaf dies, exactly once */
  hook_rec rec2 = {0};
  em_tensor *v = LEAF(EM_F32, 1);
  CHECK(em_register_post_accumulate_grad_hook(v, record_grad, &rec2, rec_free) > 0);
  em_tensor_release(v);
  CHECK(rec2.frees == 1 && rec2.calls == 0);
  REL(w, a, b, p, p2, p3, q, y, s, pp, s3, pp2, s4);
}

static int order[16], norder = 0;
static int record_order(em_tensor *leaf, void *ud) {
  (void)leaf;
  if (norder < 16) order[norder++] = (int)(intptr_t)ud;
  return 0;
}

TEST(hook_order_newest_node_first) {
  /* h = ((x * w1) * w2) * w3: the node using w3 is newest and runs first */
  em_tensor *x = VEC(EM_F32, 1, 2);
  em_tensor *w[3];
  for (int i = 0; i < 3; i++) {
    w[i] = LEAF(EM_F32, 1, 1);
    CHECK(em_register_post_accumulate_grad_hook(w[i], record_order, (void *)(intptr_t)(i + 1), NULL) > 0);
  }
  em_tensor *h1 = em_mul(x, w[0]), *h2 = em_mul(h1, w[1]), *h3 = em_mul(h2, w[2]), *s = sum_all(h3);
  norder = 0;
  CHECK(em_backward(s, NULL, false) == 0);
  CHECK(norder == 3 && order[0] == 3 && order[1] == 2 && order[2] == 1);
  /* built in the other order (w3 used first), the order flips */
  em_tensor *g1 = em_mul(x, w[2]), *g2 = em_mul(g1, w[1]), *g3 = em_mul(g2, w[0]), *s2 = sum_all(g3);
  norder = 0;
  CHECK(em_backward(s2, NULL, false) == 0);
  CHECK(norder == 3 && order[0] == 1 && order[1] == 2 && order[2] == 3);
  /* parallel branches: among ready nodes the newest runs first (PyTorch's order):
   * u = (x*w1 + x*w2) + x*w3 -> add2, add1, mul3, mul2, mul1 */
  em_tensor *m1 = em_mul(x, w[0]), *m2 = em_mul(x, w[1]), *m3 = em_mul(x, w[2]);
  em_tensor *t1 = em_add(m1, m2), *u = em_add(t1, m3), *su = sum_all(u);
  norder = 0;
  CHECK(em_backward(su, NULL, false) == 0);
  CHECK(norder == 3 && order[0] == 3 && order[1] == 2 && order[2] == 1);
  REL(m1, m2, m3, t1, u, su);
  /* several hooks on one leaf fire in registration order */
  em_tensor *v = LEAF(EM_F32, 1);
  CHECK(em_register_post_accumulate_grad_hook(v, record_order, (void *)(intptr_t)7, NULL) > 0);
  CHECK(em_register_post_accumulate_grad_hook(v, record_order, (void *)(intptr_t)8, NULL) > 0);
  em_tensor *vs = sum_all(v);
  norder = 0;
  CHECK(em_backward(vs, NULL, false) == 0);
  CHECK(norder == 2 && order[0] == 7 && order[1] == 8);
  REL(x, w[0], w[1], w[2], h1, h2, h3, s, g1, g2, g3, s2, v, vs);
}

static int failing_hook(em_tensor *leaf, void *ud) {
  (void)leaf; (void)ud;
  return em_error("my_hook: refusing on purpose");
}

TEST(hook_errors) {
  em_tensor *x = LEAF(EM_F32, 1, 2);
  em_tensor *y = em_mul_scalar(x, 2);
  em_clear_error();
  CHECK_ERR_CONTAINS(em_register_post_accumulate_grad_hook(y, record_order, NULL, NULL) < 0,
                     "register_post_accumulate_grad_hook: expected a leaf tensor that requires grad");
  em_tensor *c = VEC(EM_F32, 1);
  em_clear_error();
  CHECK_ERR_CONTAINS(em_register_post_accumulate_grad_hook(c, record_order, NULL, NULL) < 0, "requires grad");
  CHECK(em_register_post_accumulate_grad_hook(x, failing_hook, NULL, NULL) > 0);
  em_tensor *s = sum_all(y);
  em_clear_error();
  CHECK_ERR_CONTAINS(em_backward(s, NULL, false) < 0, "my_hook: refusing on purpose");
  REL(x, y, c, s);
}

/* ---------------- .grad as a view into a flat buffer ---------------- */

TEST(grad_view_into_buffer) {
  em_tensor *buf = em_full(SHAPE(10), 1, EM_F32, em_cpu());
  em_tensor *gv = em_narrow(buf, 0, 2, 3);
  em_tensor *x = LEAF(EM_F32, 1, 2, 3);
  CHECK(em_set_grad(x, gv) == 0 && x->grad == gv);
  em_tensor *y = em_mul(x, x), *s = sum_all(y);
  CHECK(em_backward(s, NULL, false) == 0);
  CHECK(x->grad == gv);                                  /* not replaced */
  CHECK_VALS(buf, 1, 1, 3, 5, 7, 1, 1, 1, 1, 1);         /* 1 + 2x in place, neighbours untouched */
  /* a strided (every other element) grad view of a 2-D leaf */
  em_tensor *flat = em_zeros(SHAPE(12), EM_F64, em_cpu());
  em_tensor *m = em_view(flat, SHAPE(3, 4)), *cols = em_narrow(m, 1, 0, 2);   /* 3x2, strides (4, 1) */
  em_tensor *w = em_zeros(SHAPE(3, 2), EM_F64, em_cpu());
  em_set_requires_grad(w, true);
  CHECK(em_set_grad(w, cols) == 0);
  em_tensor *ws = sum_all(w);
  CHECK(em_backward(ws, NULL, false) == 0);
  CHECK_VALS(flat, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0);
  /* mismatched grads are refused with what was expected */
  em_tensor *bad = em_zeros(SHAPE(4), EM_F32, em_cpu()), *bad2 = em_zeros(SHAPE(3), EM_F64, em_cpu());
  em_clear_error();
  CHECK_ERR_CONTAINS(em_set_grad(x, bad) < 0, "grad: expected a gradient of shape [3], got [4]");
  em_clear_error();
  CHECK_ERR_CONTAINS(em_set_grad(x, bad2) < 0, "grad: expected a gradient of dtype f32, got f64");
  CHECK(x->grad == gv);
  REL(buf, gv, x, y, s, flat, m, cols, w, ws, bad, bad2);
}

/* ---------------- a very long chain ---------------- */

#define CHAIN 200000
typedef struct { int ok_backward, ok_release; double grad; } chain_res;

static void *chain_thread(void *arg) {
  chain_res *r = arg;
  em_tensor *x = LEAF(EM_F32, 0.5);
  em_tensor *y = em_tensor_retain(x);
  for (int i = 0; i < CHAIN && y; i++) {
    em_tensor *n = em_add_scalar(y, 1);
    em_tensor_release(y);
    y = n;
  }
  double v = 0;
  r->ok_backward = y && em_item(y, &v) == 0 && v == 0.5 + CHAIN && em_backward(y, NULL, false) == 0;
  r->grad = x->grad ? at(x->grad, 0) : NAN;
  em_tensor_release(y);
  /* a second chain released without running backward: the release must be iterative */
  em_tensor *z = em_tensor_retain(x);
  for (int i = 0; i < CHAIN && z; i++) {
    em_tensor *n = em_mul_scalar(z, 1);
    em_tensor_release(z);
    z = n;
  }
  r->ok_release = z != NULL && z->grad_fn != NULL;
  em_tensor_release(z);
  em_tensor_release(x);
  return NULL;
}

TEST(long_chain_no_recursion) {
  /* a small stack (256 KiB) turns any per-node recursion into a crash */
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_t th;
  chain_res r = {0};
  CHECK(pthread_create(&th, &attr, chain_thread, &r) == 0);
  pthread_join(th, NULL);
  pthread_attr_destroy(&attr);
  CHECK(r.ok_backward);
  CHECK(r.grad == 1);
  CHECK(r.ok_release);
}

/* ---------------- grad mode, root gradients ---------------- */

TEST(grad_mode) {
  em_tensor *x = LEAF(EM_F32, 1), *c = VEC(EM_F32, 2);
  CHECK(em_grad_enabled());
  CHECK(em_grad_needed(2, (em_tensor *[]){c, x}));
  CHECK(!em_grad_needed(1, &c));
  CHECK(em_grad_needed(2, (em_tensor *[]){NULL, x}));
  CHECK(!em_grad_needed(0, NULL));
  CHECK(em_set_grad_enabled(false) == true);
  CHECK(!em_grad_enabled() && !em_grad_needed(1, &x));
  em_tensor *y = em_mul(x, c);
  CHECK(y && !y->requires_grad && y->grad_fn == NULL);   /* nothing recorded */
  CHECK(em_set_grad_enabled(true) == false);
  em_tensor *z = em_mul(x, c);
  CHECK(z && z->requires_grad && z->grad_fn != NULL);
  /* requires_grad rules */
  em_tensor *i = VEC(EM_I64, 1);
  em_clear_error();
  CHECK_ERR_CONTAINS(em_set_requires_grad(i, true) < 0, "requires_grad: only floating-point tensors can require grad, got i64");
  em_clear_error();
  CHECK_ERR_CONTAINS(em_set_requires_grad(z, false) < 0, "requires_grad: can only be changed on leaf tensors");
  CHECK(em_set_requires_grad(i, false) == 0);
  REL(x, c, y, z, i);
}

TEST(backward_root_errors_and_conversion) {
  em_tensor *x = LEAF(EM_F32, 1, 2, 3);
  em_tensor *y = em_mul_scalar(x, 2);
  em_clear_error();
  CHECK_ERR_CONTAINS(em_backward(y, NULL, true) < 0, "backward: a gradient can be created implicitly only for tensors with one element");
  CHECK(strstr(em_last_error(), "[3]") != NULL);
  em_tensor *g2 = VEC(EM_F32, 1, 2);
  em_clear_error();
  CHECK_ERR_CONTAINS(em_backward(y, g2, true) < 0, "backward: expected a gradient of shape [3], got [2]");
  em_tensor *c = VEC(EM_F32, 1);
  em_clear_error();
  CHECK_ERR_CONTAINS(em_backward(c, NULL, false) < 0, "backward: the tensor does not require grad");
  CHECK(x->grad == NULL);
  /* an f64 root gradient for an f32 root is converted (to the root's dtype, then the leaf's) */
  em_tensor *g = VEC(EM_F64, 1, 0.5, 0.25);
  CHECK(em_backward(y, g, false) == 0);
  CHECK(x->grad && x->grad->dtype == EM_F32);
  CHECK_VALS(x->grad, 2, 1, 0.5);
  /* the conversion happens at the root, before any backward formula runs: with
   * g = 1 + 2^-24 + 2^-30, f32(f32(g) * 3) = 3 + 2^-21 but f32(g * 3) = 3 + 2^-22 */
  em_tensor *x1 = LEAF(EM_F32, 1), *y1 = em_mul_scalar(x1, 3);
  em_tensor *g1 = VEC(EM_F64, 1 + ldexp(1, -24) + ldexp(1, -30));
  CHECK(em_backward(y1, g1, false) == 0);
  CHECK_VALS(x1->grad, 3 + ldexp(1, -21));
  REL(x1, y1, g1);
  /* a bf16 root gradient, for a bf16 leaf through an f32 computation */
  em_tensor *hb = LEAF(EM_BF16, 1, 2);
  em_tensor *hf = em_to(hb, EM_F32, em_cpu()), *hs = em_mul_scalar(hf, 3);
  em_tensor *gh = VEC(EM_F64, 1, 1.0 / 3);
  CHECK(em_backward(hs, gh, false) == 0);
  CHECK(hb->grad && hb->grad->dtype == EM_BF16);
  CHECK_VALS(hb->grad, 3, (double)em_bf16_to_f32(em_f32_to_bf16((float)(3 * (float)(1.0 / 3)))));
  /* backward on a leaf itself: its .grad is a copy of the given gradient, not an alias */
  em_tensor *l = LEAF(EM_F32, 5, 6), *gl = VEC(EM_F32, 1, 2);
  CHECK(em_backward(l, gl, false) == 0);
  CHECK(l->grad && l->grad != gl && l->grad->storage != gl->storage);
  CHECK_VALS(l->grad, 1, 2);
  CHECK(em_fill_(gl, 0) == 0);
  CHECK_VALS(l->grad, 1, 2);
  /* a one-element root of any shape gets an implicit gradient of 1 */
  em_tensor *o = LEAF(EM_F64, 4), *ov = em_view(o, SHAPE(1, 1)), *o2 = em_mul(ov, ov);
  CHECK(em_backward(o2, NULL, false) == 0);
  CHECK_VALS(o->grad, 8);
  REL(x, y, g2, c, g, hb, hf, hs, gh, l, gl, o, ov, o2);
}

TEST(root_grad_not_aliased) {
  /* y = x + 0 passes the root gradient straight through: the leaf must not keep the caller's tensor */
  em_tensor *x = LEAF(EM_F32, 1, 2);
  em_tensor *y = em_add_scalar(x, 0);
  em_tensor *g = VEC(EM_F32, 3, 4);
  CHECK(em_backward(y, g, false) == 0);
  CHECK(x->grad && x->grad != g && x->grad->storage != g->storage);
  CHECK(em_fill_(g, 0) == 0);
  CHECK_VALS(x->grad, 3, 4);
  /* and an expanded gradient (stride 0) becomes a real buffer */
  em_tensor *w = LEAF(EM_F32, 1, 2, 3);
  em_tensor *s = sum_all(w);
  CHECK(em_backward(s, NULL, false) == 0);
  CHECK(w->grad && em_is_contiguous(w->grad) && w->grad->stride[0] == 1);
  CHECK_VALS(w->grad, 1, 1, 1);
  REL(x, y, g, w, s);
}

int main(void) {
  RUN(diamond_accumulates);
  RUN(accumulation_across_backwards);
  RUN(second_backward_needs_retain_graph);
  RUN(inplace_modification_detected);
  RUN(hook_sees_final_grad_once);
  RUN(hook_order_newest_node_first);
  RUN(hook_errors);
  RUN(grad_view_into_buffer);
  RUN(long_chain_no_recursion);
  RUN(grad_mode);
  RUN(backward_root_errors_and_conversion);
  RUN(root_grad_not_aliased);
  TEST_MAIN_END();
}
