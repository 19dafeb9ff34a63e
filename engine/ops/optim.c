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
 *   d = g + wd * p;  b = first ? d : mu * b + d;  p = p - lr * (mu ? b : d)
 *
 * On CUDA every function here is a fused multi-tensor kernel
 * (kernels/adamw.cu): a whole parameter list is one or two launches whose
 * per-element arithmetic is the CPU's, operation for operation (no FMA
 * contraction), so a step gives the same bits on both devices. Tensors must
 * be contiguous there (in-place updates through strides are not supported).
 * em_adamw_capturable_ keeps each parameter's step count (and optionally lr)
 * in device memory, incremented by the step itself, so a CUDA graph that
 * captured a training step replays with the right bias corrections; and
 * em_clip_grads_ scales gradients by a factor it reads from the device, so
 * clip_grad_norm needs no host round trip either.
 *
 * Shadow weights (ember/autocast.h): an f32 parameter that autocast asked a
 * bf16/f16 copy of gets it written in the same pass as its update (the same
 * loop on the CPU, the same kernel on CUDA), rounded to nearest even as the
 * cast op rounds, so autocast's next forward reads it instead of casting.
 *
 * CPU threads: each tensor's elements are split into ranges over the threads
 * (every element's update is independent, so the bits do not depend on the
 * split); the sum of squares adds fixed blocks of EM_RED_BLOCK elements in
 * block order, so it does not depend on the thread count either. */
#include <stdio.h>
#include "internal.h"
#include "parallel.h"
#include "cost.h"

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

/* Every params[i] on params[0]'s device; on CUDA every tensor of the lists contiguous. */
static int check_devices(const char *op, int n, em_tensor **params, em_tensor **const *lists, const char *const *names,
                         int nlists) {
  char a[32], b[32];
  for (int i = 1; i < n; i++)
    if (!em_device_eq(params[i]->device, params[0]->device))
      return em_error("%s: params[%d] is on %s, expected %s (the device of params[0]); call once per device", op, i,
                      em_device_str(params[i]->device, a, 32), em_device_str(params[0]->device, b, 32));
  if (n == 0 || params[0]->device.type == EM_CPU) return 0;
  for (int i = 0; i < n; i++) {
    if (!em_is_contiguous(params[i])) return em_error("%s: params[%d] is not contiguous (required on CUDA)", op, i);
    for (int l = 0; l < nlists; l++)
      if (lists[l] && lists[l][i] && !em_is_contiguous(lists[l][i]))
        return em_error("%s: %s[%d] is not contiguous (required on CUDA)", op, names[l], i);
  }
  return 0;
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

/* Elements [i0, i1) of one parameter's update: contiguous loops, or an
 * iterator seeked to i0 for strided views. */
typedef struct {
  em_tensor *p, *g, *m, *v;         /* v NULL for SGD; m is SGD's momentum buffer (may be NULL) */
  const void *c;
  bool contig;
  em_iter it;
  uint16_t *s;                      /* AdamW: p's shadow weight (p contiguous), or NULL */
  em_dtype sdt;                     /* its dtype: EM_BF16 or EM_F16 */
} step_job;

/* The shadow copy of element i, rounded as the cast op rounds (dtype.c). */
static inline void shadow_store(const step_job *j, int64_t i, float p) {
  j->s[i] = j->sdt == EM_BF16 ? em_f32_to_bf16(p) : em_f32_to_f16(p);
}

static void adamw_f32(void *ctx, int64_t i0, int64_t i1) {
  const step_job *j = ctx;
  const adamw_consts *c = j->c;
  if (j->contig) {
    float *P = em_data_ptr(j->p), *M = em_data_ptr(j->m), *V = em_data_ptr(j->v);
    const float *G = em_data_ptr(j->g);
    if (j->s) {
      for (int64_t i = i0; i < i1; i++) { ADAMW_ELEM(float, sqrtf, P[i], G[i], M[i], V[i], c); shadow_store(j, i, P[i]); }
      return;
    }
    for (int64_t i = i0; i < i1; i++) ADAMW_ELEM(float, sqrtf, P[i], G[i], M[i], V[i], c);
    return;
  }
  em_iter it = j->it;
  em_iter_seek(&it, i0);
  float *P = em_storage_ptr(j->p), *M = em_storage_ptr(j->m), *V = em_storage_ptr(j->v);
  const float *G = em_storage_ptr(j->g);
  for (int64_t i = i0; i < i1; i++, em_iter_next(&it)) {
    ADAMW_ELEM(float, sqrtf, P[it.off[0]], G[it.off[1]], M[it.off[2]], V[it.off[3]], c);
    if (j->s) shadow_store(j, i, P[it.off[0]]);     /* p is contiguous: element i is shadow i */
  }
}

static void adamw_f64(void *ctx, int64_t i0, int64_t i1) {
  const step_job *j = ctx;
  const adamw_consts *c = j->c;
  if (j->contig) {
    double *P = em_data_ptr(j->p), *M = em_data_ptr(j->m), *V = em_data_ptr(j->v);
    const double *G = em_data_ptr(j->g);
    for (int64_t i = i0; i < i1; i++) ADAMW_ELEM(double, sqrt, P[i], G[i], M[i], V[i], c);
    return;
  }
  em_iter it = j->it;
  em_iter_seek(&it, i0);
  double *P = em_storage_ptr(j->p), *M = em_storage_ptr(j->m), *V = em_storage_ptr(j->v);
  const double *G = em_storage_ptr(j->g);
  for (int64_t i = i0; i < i1; i++, em_iter_next(&it))
    ADAMW_ELEM(double, sqrt, P[it.off[0]], G[it.off[1]], M[it.off[2]], V[it.off[3]], c);
}

/* Run one parameter's update (fn: adamw_f32/f64, sgd_f32/f64) over the threads;
 * shadow: the parameter's shadow weight to write beside it (AdamW), or NULL. */
static void step_run(em_range_fn fn, int n, em_tensor *const *ts, const void *c, int64_t cost, em_tensor *shadow) {
  step_job j = {ts[0], ts[1], ts[2], n > 3 ? ts[3] : NULL, c, all_contiguous(n, ts), {0},
                shadow ? em_data_ptr(shadow) : NULL, shadow ? shadow->dtype : EM_BF16};
  if (!j.contig) em_iter_init(&j.it, j.p->ndim, j.p->shape, n, (const em_tensor *const *)ts);
  em_parallel_for(em_numel(j.p), em_grain(cost), fn, &j);
}

/* ---- shadow weights (ember/autocast.h) ---- */

/* The shadow weight each params[i] gets written beside its update: where
 * autocast asked for one, p is f32, contiguous and not opted out; allocated
 * (or reallocated to the asked dtype/shape) before anything is written, so an
 * allocation failure leaves every tensor untouched. *out: NULL or an array of
 * n (not retained; owned by the parameters). */
static int shadows_prepare(int n, em_tensor **params, em_tensor ***out) {
  *out = NULL;
  em_tensor **sh = NULL;
  for (int i = 0; i < n; i++) {
    em_tensor *p = params[i];
    if (!p->shadow_want || p->shadow_off || p->dtype != EM_F32 || !em_is_contiguous(p)) continue;
    em_dtype dt = (em_dtype)(p->shadow_want - 1);
    if (p->shadow && (p->shadow->dtype != dt || !em_same_shape(p->shadow, p) ||
                      !em_device_eq(p->shadow->device, p->device))) {
      em_tensor_release(p->shadow);
      p->shadow = NULL;
    }
    if (!p->shadow && !(p->shadow = em_empty(p->ndim, p->shape, dt, p->device))) { free(sh); return -1; }
    p->shadow_storage = NULL;                  /* not current until this step has written it */
    if (!sh && !(sh = calloc((size_t)n, sizeof *sh))) return em_error_oom("out of memory: adamw_ shadows (%d)", n);
    sh[i] = p->shadow;
  }
  *out = sh;
  return 0;
}

/* After the step (every parameter's version bumped): the shadows are the
 * casts of the new values, current at the parameters' new versions; their
 * own version moves too, so a graph that saved the old copy sees the write. */
static void shadows_written(int n, em_tensor **params, em_tensor **sh) {
  if (!sh) return;
  for (int i = 0; i < n; i++)
    if (sh[i]) {
      em_bump_version(sh[i]);
      params[i]->shadow_storage = params[i]->storage;
      params[i]->shadow_version = params[i]->storage->version;
    }
  free(sh);
}

/* The declared cost of a pass over n tensors (the multi-tensor ops below):
 * `passes` times each tensor's bytes plus its shadow copy's (sh: NULL or one
 * per tensor), `flops` FLOPs an element of class cls. */
static void tensors_cost(int n, em_tensor *const *ts, em_tensor *const *sh, double passes, double flops, int cls) {
  if (!EM_COSTING()) return;
  double bytes = 0, elems = 0;
  for (int i = 0; i < n; i++) {
    bytes += passes * em_cost_nbytes(ts[i]) + (sh && sh[i] ? em_cost_nbytes(sh[i]) : 0);
    elems += (double)em_numel(ts[i]);
  }
  em_op_cost_add(bytes, flops * elems, cls);
}

/* AdamW's floor: p, g, m, v read; p, m, v written (and the shadow copy);
 * ~12 FLOPs an element (two moment updates, the bias-corrected sqrt, the
 * decoupled decay and the step). */
static void adamw_cost(int n, em_tensor **params, em_tensor **sh) {
  tensors_cost(n, params, sh, 7, 12, n > 0 ? em_cost_simt_class(params[0]->dtype) : EM_FLOPS_F32);
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
  if (check_devices("adamw_", n, params, (em_tensor **const[]){grads, exp_avg, exp_avg_sq},
                    (const char *const[]){"grads", "exp_avg", "exp_avg_sq"}, 3))
    return -1;
  em_tensor **sh;
  if (shadows_prepare(n, params, &sh)) return -1;
  adamw_cost(n, params, sh);
  if (n > 0 && params[0]->device.type == EM_CUDA) {
    if (em_adamw_cuda(n, params, grads, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step, NULL, NULL,
                      sh)) {
      free(sh);
      return -1;
    }
    for (int i = 0; i < n; i++) { em_bump_version(params[i]); em_bump_version(exp_avg[i]); em_bump_version(exp_avg_sq[i]); }
    shadows_written(n, params, sh);
    return 0;
  }
  double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
  adamw_consts c = {1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2, -(lr / bc1), sqrt(bc2), eps};
  for (int i = 0; i < n; i++) {
    em_tensor *p = params[i];
    step_run(p->dtype == EM_F32 ? adamw_f32 : adamw_f64, 4, (em_tensor *[]){p, grads[i], exp_avg[i], exp_avg_sq[i]},
             &c, 8, sh ? sh[i] : NULL);
    em_bump_version(p); em_bump_version(exp_avg[i]); em_bump_version(exp_avg_sq[i]);
  }
  shadows_written(n, params, sh);
  return 0;
}

/* A 0-d tensor of one of two dtypes on dev; names the argument in the error. */
static int check_scalar_tensor(const char *op, const char *name, const em_tensor *t, em_dtype d1, em_dtype d2,
                               em_device dev) {
  char a[32], b[32];
  if (t->ndim != 0)
    return em_error("%s: %s must be a 0-d tensor, got %d dims", op, name, t->ndim);
  if (t->dtype != d1 && t->dtype != d2)
    return em_error("%s: %s must be %s or %s, got %s", op, name, em_dtype_name(d1), em_dtype_name(d2),
                    em_dtype_name(t->dtype));
  if (!em_device_eq(t->device, dev))
    return em_error("%s: %s is on %s, expected %s (the parameters' device)", op, name, em_device_str(t->device, a, 32),
                    em_device_str(dev, b, 32));
  return 0;
}

int em_adamw_capturable_(int n, em_tensor **params, em_tensor **grads, em_tensor **exp_avg, em_tensor **exp_avg_sq,
                         em_tensor **steps, em_tensor *lr_t, double lr, double beta1, double beta2, double eps,
                         double weight_decay) {
  EM_OP_SCOPE("adamw_capturable_");
  const char *op = "adamw_capturable_";
  char name[32];
  if (check_count(op, n, params) || adamw_check_hparams(lr, beta1, beta2, eps, weight_decay, 1)) return -1;
  if (n > 0 && !steps) return em_error("%s: steps is NULL", op);
  for (int i = 0; i < n; i++) {
    if (check_param(op, params, i) || check_like(op, "grads", grads, params[i], i, false) ||
        check_like(op, "exp_avg", exp_avg, params[i], i, true) ||
        check_like(op, "exp_avg_sq", exp_avg_sq, params[i], i, true))
      return -1;
    if (!steps[i]) return em_error("%s: steps[%d] is missing (NULL)", op, i);
    snprintf(name, sizeof name, "steps[%d]", i);
    if (check_scalar_tensor(op, name, steps[i], EM_F32, EM_I64, params[i]->device)) return -1;
    if (steps[i]->dtype != steps[0]->dtype)
      return em_error("%s: steps[%d] is %s but steps[0] is %s (one dtype per call)", op, i,
                      em_dtype_name(steps[i]->dtype), em_dtype_name(steps[0]->dtype));
    for (int j = 0; j < i; j++)
      if (em_data_ptr(steps[j]) == em_data_ptr(steps[i]))
        return em_error("%s: steps[%d] and steps[%d] are the same tensor (each is incremented once per call)", op, j, i);
  }
  if (check_devices(op, n, params, (em_tensor **const[]){grads, exp_avg, exp_avg_sq},
                    (const char *const[]){"grads", "exp_avg", "exp_avg_sq"}, 3))
    return -1;
  if (n == 0) return 0;
  if (lr_t && check_scalar_tensor(op, "lr", lr_t, EM_F32, EM_F64, params[0]->device)) return -1;
  if (params[0]->device.type == EM_CUDA) {
    em_tensor **sh;
    if (shadows_prepare(n, params, &sh)) return -1;
    adamw_cost(n, params, sh);
    if (em_adamw_cuda(n, params, grads, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, 0, steps, lr_t,
                      sh)) {
      free(sh);
      return -1;
    }
    for (int i = 0; i < n; i++) {
      em_bump_version(params[i]); em_bump_version(exp_avg[i]); em_bump_version(exp_avg_sq[i]);
      em_bump_version(steps[i]);
    }
    shadows_written(n, params, sh);
    return 0;
  }
  /* CPU: the same contract through the host path, one tensor at a time */
  if (lr_t && em_item(lr_t, &lr)) return -1;
  for (int i = 0; i < n; i++) {
    double s;
    if (em_item(steps[i], &s)) return -1;
    s += 1;
    if (em_adamw_(1, &params[i], &grads[i], &exp_avg[i], &exp_avg_sq[i], lr, beta1, beta2, eps, weight_decay,
                  (int64_t)s))
      return -1;
    em_store_f64(em_storage_ptr(steps[i]), steps[i]->dtype, steps[i]->offset, s);
    em_bump_version(steps[i]);
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

static void sgd_f32(void *ctx, int64_t i0, int64_t i1) {
  const step_job *j = ctx;
  const sgd_consts *c = j->c;
  float dummy = 0;
  if (j->contig) {
    float *P = em_data_ptr(j->p), *B = j->m ? em_data_ptr(j->m) : NULL;
    const float *G = em_data_ptr(j->g);
    for (int64_t i = i0; i < i1; i++) SGD_ELEM(float, P[i], G[i], *(B ? &B[i] : &dummy), c);
    return;
  }
  em_iter it = j->it;
  em_iter_seek(&it, i0);
  float *P = em_storage_ptr(j->p), *B = j->m ? em_storage_ptr(j->m) : NULL;
  const float *G = em_storage_ptr(j->g);
  for (int64_t i = i0; i < i1; i++, em_iter_next(&it))
    SGD_ELEM(float, P[it.off[0]], G[it.off[1]], *(B ? &B[it.off[2]] : &dummy), c);
}

static void sgd_f64(void *ctx, int64_t i0, int64_t i1) {
  const step_job *j = ctx;
  const sgd_consts *c = j->c;
  double dummy = 0;
  if (j->contig) {
    double *P = em_data_ptr(j->p), *B = j->m ? em_data_ptr(j->m) : NULL;
    const double *G = em_data_ptr(j->g);
    for (int64_t i = i0; i < i1; i++) SGD_ELEM(double, P[i], G[i], *(B ? &B[i] : &dummy), c);
    return;
  }
  em_iter it = j->it;
  em_iter_seek(&it, i0);
  double *P = em_storage_ptr(j->p), *B = j->m ? em_storage_ptr(j->m) : NULL;
  const double *G = em_storage_ptr(j->g);
  for (int64_t i = i0; i < i1; i++, em_iter_next(&it))
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
  if (check_devices("sgd_", n, params, (em_tensor **const[]){grads, momentum != 0 ? bufs : NULL},
                    (const char *const[]){"grads", "bufs"}, 2))
    return -1;
  /* p, g (and the buffer) read, p (and the buffer) written; ~4 FLOPs */
  tensors_cost(n, params, NULL, momentum != 0 ? 5 : 3, 4, EM_FLOPS_F32);
  if (n > 0 && params[0]->device.type == EM_CUDA) {
    if (em_sgd_cuda(n, params, grads, momentum != 0 ? bufs : NULL, lr, momentum, weight_decay, first_step)) return -1;
    for (int i = 0; i < n; i++) {
      em_bump_version(params[i]);
      if (momentum != 0) em_bump_version(bufs[i]);
    }
    return 0;
  }
  sgd_consts c = {lr, momentum, weight_decay, first_step};
  for (int i = 0; i < n; i++) {
    em_tensor *b = momentum != 0 ? bufs[i] : NULL;
    step_run(params[i]->dtype == EM_F32 ? sgd_f32 : sgd_f64, b ? 3 : 2, (em_tensor *[]){params[i], grads[i], b}, &c,
             2, NULL);
    em_bump_version(params[i]);
    if (b) em_bump_version(b);
  }
  return 0;
}

/* ---------------- sum of squares ---------------- */

/* Sum of squares of elements [i0, i1) of t, in double, in order. */
static double sumsq_range(const em_tensor *t, const em_iter *start, int64_t i0, int64_t i1) {
  double s = 0;
  if (t->dtype == EM_F32 && em_is_contiguous(t)) {
    const float *x = em_data_ptr(t);
    for (int64_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
    return s;
  }
  em_iter it = *start;
  em_iter_seek(&it, i0);
  const void *base = em_storage_ptr(t);
  if (t->dtype == EM_F64) {
    for (int64_t i = i0; i < i1; i++, em_iter_next(&it)) { double x = ((const double *)base)[it.off[0]]; s += x * x; }
    return s;
  }
  for (int64_t i = i0; i < i1; i++, em_iter_next(&it)) {
    double x = em_load_f64(base, t->dtype, it.off[0]);
    s += x * x;
  }
  return s;
}

typedef struct { const em_tensor *t; em_iter it; double *parts; int64_t n; } sumsq_job;

static void sumsq_blocks(void *ctx, int64_t b0, int64_t b1) {
  const sumsq_job *j = ctx;
  for (int64_t b = b0; b < b1; b++)
    j->parts[b] = sumsq_range(j->t, &j->it, b * EM_RED_BLOCK, EM_MIN((b + 1) * EM_RED_BLOCK, j->n));
}

/* Blocks of EM_RED_BLOCK elements summed in parallel, then in block order. */
static int sumsq_one(em_tensor *t, double *out) {
  sumsq_job j = {t, {0}, NULL, em_numel(t)};
  em_iter_init(&j.it, t->ndim, t->shape, 1, (const em_tensor *[]){t});
  int64_t nb = em_red_blocks(j.n);
  if (nb == 1) { *out = sumsq_range(t, &j.it, 0, j.n); return 0; }
  if (!(j.parts = malloc(sizeof(double) * (size_t)nb)))
    return em_error_oom("out of memory: sum_of_squares partials (%lld)", (long long)nb);
  em_parallel_for(nb, 1, sumsq_blocks, &j);
  double s = 0;
  for (int64_t b = 0; b < nb; b++) s += j.parts[b];
  free(j.parts);
  *out = s;
  return 0;
}

/* Contiguous float views of ts (widened to f64 when not float), then one multi-tensor reduction. */
static em_tensor *sum_of_squares_cuda(int n, em_tensor **ts, em_device dev) {
  em_tensor **cs = calloc((size_t)EM_MAX(n, 1), sizeof *cs), *out = NULL;
  if (!cs) { em_error_oom("out of memory: sum_of_squares (%d tensors)", n); return NULL; }
  int ok = 1;
  for (int i = 0; i < n && ok; i++) {
    cs[i] = em_dtype_is_float(ts[i]->dtype) ? em_contiguous(ts[i]) : em_contiguous_as(ts[i], EM_F64);
    ok = cs[i] != NULL;
  }
  if (ok && (out = em_empty(0, NULL, EM_F32, dev)) && em_sum_of_squares_cuda(n, cs, out)) {
    em_tensor_release(out);
    out = NULL;
  }
  for (int i = 0; i < n; i++) em_tensor_release(cs[i]);
  free(cs);
  return out;
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
  }
  tensors_cost(n, ts, NULL, 1, 2, EM_FLOPS_F32);   /* every tensor read once; a square and an add an element */
  if (dev.type == EM_CUDA) return sum_of_squares_cuda(n, ts, dev);
  double total = 0;
  for (int i = 0; i < n; i++) {
    double s = 0;
    if (sumsq_one(ts[i], &s)) return NULL;
    total += s;
  }
  return em_scalar_tensor(total, EM_F32, dev);
}

/* ---------------- gradient clipping ---------------- */

em_tensor *em_clip_grads_(int n, em_tensor **grads, em_tensor *sumsq, double max_norm) {
  EM_OP_SCOPE("clip_grads_");
  const char *op = "clip_grads_";
  char a[32], b[32];
  if (n < 0 || (n > 0 && !grads)) { em_error("%s: expected a list of tensors, got %d", op, n); return NULL; }
  if (!sumsq) { em_error("%s: sumsq is NULL", op); return NULL; }
  if (!(max_norm >= 0)) { em_error("%s: expected max_norm >= 0, got %g", op, max_norm); return NULL; }
  if (check_scalar_tensor(op, "sumsq", sumsq, EM_F32, EM_F32, sumsq->device)) return NULL;
  for (int i = 0; i < n; i++) {
    if (!grads[i]) { em_error("%s: grads[%d] is missing (NULL)", op, i); return NULL; }
    if (!em_device_eq(grads[i]->device, sumsq->device)) {
      em_error("%s: grads[%d] is on %s, expected %s (the device of sumsq)", op, i,
               em_device_str(grads[i]->device, a, 32), em_device_str(sumsq->device, b, 32));
      return NULL;
    }
    if (!em_dtype_is_float(grads[i]->dtype)) {
      em_error("%s: grads[%d] has dtype %s; expected a float dtype", op, i, em_dtype_name(grads[i]->dtype));
      return NULL;
    }
    if (sumsq->device.type == EM_CUDA && !em_is_contiguous(grads[i])) {
      em_error("%s: grads[%d] is not contiguous (required on CUDA)", op, i);
      return NULL;
    }
  }
  if (sumsq->device.type == EM_CUDA) {
    /* every gradient read and written (scaled) on the device; the CPU path's scaling is ops */
    tensors_cost(n, grads, NULL, 2, 1, EM_FLOPS_F32);
    em_tensor *norm = em_empty(0, NULL, EM_F32, sumsq->device);
    if (norm && em_clip_grads_cuda(n, grads, sumsq, max_norm, norm)) { em_tensor_release(norm); return NULL; }
    for (int i = 0; norm && i < n; i++) em_bump_version(grads[i]);
    return norm;
  }
  double ss;
  if (em_item(sumsq, &ss)) return NULL;
  double total = sqrt(ss);
  if (total > max_norm) {
    bool g = em_set_grad_enabled(false);
    for (int i = 0; i < n; i++) {
      em_tensor *r = em_binary_scalar(EM_MUL, grads[i], max_norm / (total + 1e-6), false, grads[i]);
      if (!r) { em_set_grad_enabled(g); return NULL; }
      em_tensor_release(r);
    }
    em_set_grad_enabled(g);
  }
  return em_scalar_tensor(total, EM_F32, sumsq->device);
}
