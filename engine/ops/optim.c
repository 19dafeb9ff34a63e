/* Optimizer steps (AdamW, SGD) and the sum of squares behind grad clipping.
 *
 * The steps update parameters and state in place over lists of tensors, as
 * PyTorch's single-tensor implementations do, operation by operation in the
 * parameter's dtype (f32 or f64) with the scalar factors (bias corrections,
 * step size) computed in double and rounded once, so a Lua loop and a ZeRO
 * shard produce the same bits as the unsharded step. They are never recorded
 * by autograd (an optimizer step is no_grad by definition), so they accept
 * parameters that require grad; read-only storage is refused. Every list
 * element is checked before anything is written, so an error leaves all
 * tensors untouched; messages name the list and index ("grads[3]").
 *
 * PyTorch AdamW, for each element:
 *   p = p * (1 - lr*wd)
 *   m = lerp(m, g, 1 - b1)               m + (1-b1)(g - m)
 *   v = v * b2 + (1 - b2) * g * g
 *   p = p + (-lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * PyTorch SGD (dampening 0, no Nesterov):
 *   d = g + wd * p;  b = first ? d : mu * b + d;  p = p - lr * (mu ? b : d) */
#include <stdio.h>
#include "internal.h"

/* ---------------- checks ---------------- */

/* ts[i] must exist and match params[i] in shape, dtype and device. */
static int check_like(const char *op, const char *list, em_tensor **ts, em_tensor *p, int i, bool writable) {
  char s1[160], s2[160], d1[32], d2[32];
  em_tensor *t = ts ? ts[i] : NULL;
  if (!t) return em_error("%s: %s[%d] is missing (NULL)", op, list, i);
  if (!em_same_shape(t, p))
    return em_error("%s: %s[%d] has shape %s, expected %s (the shape of params[%d])", op, list, i,
                    em_shape_str(t->ndim, t->shape, s1, 160), em_shape_str(p->ndim, p->shape, s2, 160), i);
  if (t->dtype != p->dtype)
    return em_error("%s: %s[%d] has dtype %s, expected %s (the dtype of params[%d])", op, list, i,
                    em_dtype_name(t->dtype), em_dtype_name(p->dtype), i);
  if (!em_device_eq(t->device, p->device))
    return em_error("%s: %s[%d] is on %s, expected %s (the device of params[%d])", op, list, i,
                    em_device_str(t->device, d1, 32), em_device_str(p->device, d2, 32), i);
  if (writable && (t->storage->flags & EM_STORAGE_READONLY))
    return em_error("%s: %s[%d] is read-only (memory-mapped); clone() it first", op, list, i);
  return 0;
}

static int check_param(const char *op, em_tensor **params, int i) {
  em_tensor *p = params[i];
  if (!p) return em_error("%s: params[%d] is missing (NULL)", op, i);
  if (p->dtype != EM_F32 && p->dtype != EM_F64)
    return em_error("%s: params[%d] has dtype %s; expected f32 or f64 (keep master weights in f32)", op, i,
                    em_dtype_name(p->dtype));
  if (p->device.type != EM_CPU) return em_error_device(op, p);
  if (p->storage->flags & EM_STORAGE_READONLY)
    return em_error("%s: params[%d] is read-only (memory-mapped); clone() it first", op, i);
  return 0;
}

static int check_count(const char *op, int n, em_tensor **params) {
  if (n < 0) return em_error("%s: expected a non-negative number of tensors, got %d", op, n);
  if (n > 0 && !params) return em_error("%s: params is NULL", op);
  return 0;
}

static bool all_contiguous(int n, em_tensor *const *ts) {
  for (int i = 0; i < n; i++) if (ts[i] && !em_is_contiguous(ts[i])) return false;
  return true;
}

/* ---------------- AdamW ---------------- */

typedef struct { double decay, w1, b2, c2, step_size, bc2_sqrt, eps; } adamw_consts;

#define ADAMW_ELEM(T, SQRT, p, g, m, v, c) do {                                  \
    T g_ = (g), m_ = (m);                                                          \
    (p) = (p) * (T)(c)->decay;                                                     \
    m_ = (T)(c)->w1 < (T)0.5 ? m_ + (T)(c)->w1 * (g_ - m_)                         \
                             : g_ - (g_ - m_) * ((T)1 - (T)(c)->w1);               \
    (m) = m_;                                                                      \
    (v) = (v) * (T)(c)->b2 + (T)(c)->c2 * g_ * g_;                                 \
    (p) = (p) + (T)(c)->step_size * m_ / (SQRT(v) / (T)(c)->bc2_sqrt + (T)(c)->eps); \
  } while (0)

static void adamw_f32(em_tensor *p, em_tensor *g, em_tensor *m, em_tensor *v, const adamw_consts *c) {
  if (all_contiguous(4, (em_tensor *[]){p, g, m, v})) {
    float *P = em_data_ptr(p), *M = em_data_ptr(m), *V = em_data_ptr(v);
    const float *G = em_data_ptr(g);
    for (int64_t i = 0, n = em_numel(p); i < n; i++) ADAMW_ELEM(float, sqrtf, P[i], G[i], M[i], V[i], c);
    return;
  }
  em_iter it;
  em_iter_init(&it, p->ndim, p->shape, 4, (const em_tensor *[]){p, g, m, v});
  float *P = em_storage_ptr(p), *M = em_storage_ptr(m), *V = em_storage_ptr(v);
  const float *G = em_storage_ptr(g);
  for (int64_t i = 0; i < it.numel; i++, em_iter_next(&it))
    ADAMW_ELEM(float, sqrtf, P[it.off[0]], G[it.off[1]], M[it.off[2]], V[it.off[3]], c);
}

static void adamw_f64(em_tensor *p, em_tensor *g, em_tensor *m, em_tensor *v, const adamw_consts *c) {
  if (all_contiguous(4, (em_tensor *[]){p, g, m, v})) {
    double *P = em_data_ptr(p), *M = em_data_ptr(m), *V = em_data_ptr(v);
    const double *G = em_data_ptr(g);
    for (int64_t i = 0, n = em_numel(p); i < n; i++) ADAMW_ELEM(double, sqrt, P[i], G[i], M[i], V[i], c);
    return;
  }
  em_iter it;
  em_iter_init(&it, p->ndim, p->shape, 4, (const em_tensor *[]){p, g, m, v});
  double *P = em_storage_ptr(p), *M = em_storage_ptr(m), *V = em_storage_ptr(v);
  const double *G = em_storage_ptr(g);
  for (int64_t i = 0; i < it.numel; i++, em_iter_next(&it))
    ADAMW_ELEM(double, sqrt, P[it.off[0]], G[it.off[1]], M[it.off[2]], V[it.off[3]], c);
}

static int adamw_check_hparams(double lr, double b1, double b2, double eps, double wd, int64_t step) {
  if (!(lr >= 0)) return em_error("adamw_: expected lr >= 0, got %g", lr);
  if (!(b1 >= 0 && b1 < 1)) return em_error("adamw_: expected 0 <= beta1 < 1, got %g", b1);
  if (!(b2 >= 0 && b2 < 1)) return em_error("adamw_: expected 0 <= beta2 < 1, got %g", b2);
  if (!(eps >= 0)) return em_error("adamw_: expected eps >= 0, got %g", eps);
  if (!(wd >= 0)) return em_error("adamw_: expected weight_decay >= 0, got %g", wd);
  if (step < 1) return em_error("adamw_: expected step >= 1 (the step count after this update), got %lld",
                                (long long)step);
  return 0;
}

int em_adamw_(int n, em_tensor **params, em_tensor **grads, em_tensor **exp_avg, em_tensor **exp_avg_sq,
              double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  EM_OP_SCOPE("adamw_");
  if (check_count("adamw_", n, params) || adamw_check_hparams(lr, beta1, beta2, eps, weight_decay, step))
    return -1;
  for (int i = 0; i < n; i++)
    if (check_param("adamw_", params, i) || check_like("adamw_", "grads", grads, params[i], i, false) ||
        check_like("adamw_", "exp_avg", exp_avg, params[i], i, true) ||
        check_like("adamw_", "exp_avg_sq", exp_avg_sq, params[i], i, true))
      return -1;
  double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
  adamw_consts c = {1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2, -(lr / bc1), sqrt(bc2), eps};
  for (int i = 0; i < n; i++) {
    em_tensor *p = params[i];
    if (p->dtype == EM_F32) adamw_f32(p, grads[i], exp_avg[i], exp_avg_sq[i], &c);
    else adamw_f64(p, grads[i], exp_avg[i], exp_avg_sq[i], &c);
    em_bump_version(p); em_bump_version(exp_avg[i]); em_bump_version(exp_avg_sq[i]);
  }
  return 0;
}

/* ---------------- SGD ---------------- */

typedef struct { double lr, mu, wd; bool first; } sgd_consts;

/* d = g + wd p; with momentum b = first ? d : mu b + d and d = b; p = p - lr d. */
#define SGD_ELEM(T, p, g, b, c) do {                                     \
    T d_ = (g);                                                            \
    if ((c)->wd != 0) d_ = d_ + (T)(c)->wd * (p);                          \
    if ((c)->mu != 0) { (b) = (c)->first ? d_ : (b) * (T)(c)->mu + d_; d_ = (b); } \
    (p) = (p) + (T)(-(c)->lr) * d_;                                        \
  } while (0)

static void sgd_f32(em_tensor *p, em_tensor *g, em_tensor *b, const sgd_consts *c) {
  float dummy = 0;
  if (all_contiguous(3, (em_tensor *[]){p, g, b})) {
    float *P = em_data_ptr(p), *B = b ? em_data_ptr(b) : NULL;
    const float *G = em_data_ptr(g);
    for (int64_t i = 0, n = em_numel(p); i < n; i++) SGD_ELEM(float, P[i], G[i], *(B ? &B[i] : &dummy), c);
    return;
  }
  em_iter it;
  em_iter_init(&it, p->ndim, p->shape, b ? 3 : 2, (const em_tensor *[]){p, g, b});
  float *P = em_storage_ptr(p), *B = b ? em_storage_ptr(b) : NULL;
  const float *G = em_storage_ptr(g);
  for (int64_t i = 0; i < it.numel; i++, em_iter_next(&it))
    SGD_ELEM(float, P[it.off[0]], G[it.off[1]], *(B ? &B[it.off[2]] : &dummy), c);
}

static void sgd_f64(em_tensor *p, em_tensor *g, em_tensor *b, const sgd_consts *c) {
  double dummy = 0;
  if (all_contiguous(3, (em_tensor *[]){p, g, b})) {
    double *P = em_data_ptr(p), *B = b ? em_data_ptr(b) : NULL;
    const double *G = em_data_ptr(g);
    for (int64_t i = 0, n = em_numel(p); i < n; i++) SGD_ELEM(double, P[i], G[i], *(B ? &B[i] : &dummy), c);
    return;
  }
  em_iter it;
  em_iter_init(&it, p->ndim, p->shape, b ? 3 : 2, (const em_tensor *[]){p, g, b});
  double *P = em_storage_ptr(p), *B = b ? em_storage_ptr(b) : NULL;
  const double *G = em_storage_ptr(g);
  for (int64_t i = 0; i < it.numel; i++, em_iter_next(&it))
    SGD_ELEM(double, P[it.off[0]], G[it.off[1]], *(B ? &B[it.off[2]] : &dummy), c);
}

int em_sgd_(int n, em_tensor **params, em_tensor **grads, em_tensor **bufs, double lr, double momentum,
            double weight_decay, bool first_step) {
  EM_OP_SCOPE("sgd_");
  if (check_count("sgd_", n, params)) return -1;
  if (!(lr >= 0)) return em_error("sgd_: expected lr >= 0, got %g", lr);
  if (!(momentum >= 0)) return em_error("sgd_: expected momentum >= 0, got %g", momentum);
  if (!(weight_decay >= 0)) return em_error("sgd_: expected weight_decay >= 0, got %g", weight_decay);
  if (momentum != 0 && n > 0 && !bufs)
    return em_error("sgd_: momentum %g needs momentum buffers, got bufs = NULL", momentum);
  for (int i = 0; i < n; i++)
    if (check_param("sgd_", params, i) || check_like("sgd_", "grads", grads, params[i], i, false) ||
        (momentum != 0 && check_like("sgd_", "bufs", bufs, params[i], i, true)))
      return -1;
  sgd_consts c = {lr, momentum, weight_decay, first_step};
  for (int i = 0; i < n; i++) {
    em_tensor *b = momentum != 0 ? bufs[i] : NULL;
    if (params[i]->dtype == EM_F32) sgd_f32(params[i], grads[i], b, &c);
    else sgd_f64(params[i], grads[i], b, &c);
    em_bump_version(params[i]);
    if (b) em_bump_version(b);
  }
  return 0;
}

/* ---------------- sum of squares ---------------- */

static double sumsq_one(em_tensor *t) {
  double s = 0;
  if (t->dtype == EM_F32 && em_is_contiguous(t)) {
    const float *x = em_data_ptr(t);
    for (int64_t i = 0, n = em_numel(t); i < n; i++) s += (double)x[i] * x[i];
    return s;
  }
  em_iter it;
  em_iter_init(&it, t->ndim, t->shape, 1, (const em_tensor *[]){t});
  const void *base = em_storage_ptr(t);
  if (t->dtype == EM_F64) {
    for (int64_t i = 0; i < it.numel; i++, em_iter_next(&it)) { double x = ((const double *)base)[it.off[0]]; s += x * x; }
    return s;
  }
  for (int64_t i = 0; i < it.numel; i++, em_iter_next(&it)) {
    double x = em_load_f64(base, t->dtype, it.off[0]);
    s += x * x;
  }
  return s;
}

em_tensor *em_sum_of_squares(int n, em_tensor **ts) {
  EM_OP_SCOPE("sum_of_squares");
  if (n < 0 || (n > 0 && !ts)) {
    em_error("sum_of_squares: expected a list of tensors, got %d tensors%s", n, ts ? "" : " (NULL list)");
    return NULL;
  }
  em_device dev = em_cpu();
  for (int i = 0; i < n; i++) {
    if (!ts[i]) { em_error("sum_of_squares: tensors[%d] is missing (NULL)", i); return NULL; }
    if (i > 0 && !em_device_eq(ts[i]->device, dev)) {
      char a[32], b[32];
      em_error("sum_of_squares: tensors[%d] is on %s, expected %s (the device of tensors[0])", i,
               em_device_str(ts[i]->device, a, 32), em_device_str(dev, b, 32));
      return NULL;
    }
    dev = ts[i]->device;
    if (dev.type != EM_CPU) { em_error_device("sum_of_squares", ts[i]); return NULL; }
  }
  double total = 0;
  for (int i = 0; i < n; i++) total += sumsq_one(ts[i]);
  return em_scalar_tensor(total, EM_F32, dev);
}
