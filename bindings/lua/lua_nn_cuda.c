/* core functions for device-resident training steps (CUDA graphs): the
 * capturable AdamW step, gradient clipping by a factor read on the device,
 * and whether this thread is capturing. They work on the CPU too.
 *   core.adamw_capturable_(params, grads|nil, exp_avg, exp_avg_sq, steps, lr_t|nil, lr, beta1, beta2, eps, wd)
 *   core.clip_grads_(grads, sumsq, max_norm) -> the total norm (0-d f32 tensor on sumsq's device)
 *   core.clip_param_grads_(params, max_norm[, sumsq]) -> the same, for the gradients of params (those without
 *     one skipped); sumsq given: scale by the norm it holds instead of the params' own (clip = "previous")
 *   core.grad_sumsq_into_(params, slots, index): slots[index[i]] = the sum of squares of params[i].grad
 *   core.has_grad(t) -> boolean
 *   core.zero_grad_(params, set_to_none) -> bytes of device gradients dropped but still referenced
 *   core.placements(params) -> an integer per tensor naming its (device, dtype): equal for equal pairs,
 *     below core.PLACEMENT_CPU_END for CPU tensors (the optimizers' buckets, without a string per tensor)
 *   core.cuda_is_capturing() -> boolean
 * grads = nil means "each param's .grad", read here in C: reading p.grad from
 * Lua makes a userdata that keeps the gradient's memory alive until the next
 * collection even after zero_grad drops it — 12.6 GiB at 2.7B parameters,
 * held through the next forward. The optimizers and clipping therefore never
 * touch gradients from Lua. */
#include <stdlib.h>
#include "lua_ember.h"

/* The .grad of each of params (all must have one); fails naming the first without. */
int lem_grads_of(lua_State *L, const char *fn, int n, em_tensor **p, em_tensor ***out) {
  em_tensor **g = malloc(sizeof *g * (size_t)(n > 0 ? n : 1));
  if (!g) { free(p); return lem_error(L, fn, "out of host memory"); }
  for (int i = 0; i < n; i++) {
    if (!p[i]->grad) {
      free(g); free(p);
      return lem_error(L, fn, "parameter %d has no gradient", i + 1);
    }
    g[i] = p[i]->grad;
  }
  *out = g;
  return n;
}

static int l_adamw_capturable_(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *lr_t = lem_opt_tensor(L, 6, fn, "lr");
  double lr = lem_check_number(L, 7, fn, "lr"), b1 = lem_check_number(L, 8, fn, "beta1");
  double b2 = lem_check_number(L, 9, fn, "beta2"), eps = lem_check_number(L, 10, fn, "eps");
  double wd = lem_check_number(L, 11, fn, "weight_decay");
  em_tensor **p = NULL, **g = NULL, **m = NULL, **v = NULL, **s = NULL;
  int n = lem_check_tensor_list(L, 1, fn, &p), n2 = lua_isnil(L, 2) ? lem_grads_of(L, fn, n, p, &g)
                                                                  : lem_check_tensor_list(L, 2, fn, &g);
  int n3 = lem_check_tensor_list(L, 3, fn, &m), n4 = lem_check_tensor_list(L, 4, fn, &v);
  int n5 = lem_check_tensor_list(L, 5, fn, &s), rc = -1;
  if (n != n2 || n != n3 || n != n4 || n != n5)
    em_error("%s: expected lists of equal length, got %d, %d, %d, %d, %d", fn, n, n2, n3, n4, n5);
  else
    rc = em_adamw_capturable_(n, p, g, m, v, s, lr_t, lr, b1, b2, eps, wd);
  free(p); free(g); free(m); free(v); free(s);
  if (rc) return lem_raise(L);
  return 0;
}

static int l_clip_grads_(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *sumsq = lem_check_tensor(L, 2, fn, "sumsq");
  double max_norm = lem_check_number(L, 3, fn, "max_norm");
  em_tensor **g = NULL;
  int n = lem_check_tensor_list(L, 1, fn, &g);
  em_tensor *norm = em_clip_grads_(n, g, sumsq, max_norm);
  free(g);
  return lem_push_result(L, norm);
}

static int l_clip_param_grads_(lua_State *L) {
  const char *fn = lem_name(L);
  double max_norm = lem_check_number(L, 2, fn, "max_norm");
  em_tensor *given = lem_opt_tensor(L, 3, fn, "sumsq");
  em_tensor **p = NULL;
  int n = lem_check_tensor_list(L, 1, fn, &p), k = 0;
  for (int i = 0; i < n; i++)
    if (p[i]->grad) p[k++] = p[i]->grad;       /* in place: p now lists gradients */
  em_tensor *sumsq = given ? em_tensor_retain(given) : k ? em_sum_of_squares(k, p) : NULL;
  em_tensor *norm = sumsq && k ? em_clip_grads_(k, p, sumsq, max_norm) : NULL;
  free(p);
  em_tensor_release(sumsq);
  if (k == 0) { lua_pushnil(L); return 1; }
  return lem_push_result(L, norm);
}

/* Each gradient's sum of squares in its own reduction, written to its slot
 * (a 1-d f32 tensor; 1-based Lua indices), so the slots' total does not
 * depend on which parameters shared a call or in what order they came:
 * AdamW's clip = "previous" adds them up once per step. Parameters without a
 * gradient leave their slot alone. */
static int l_grad_sumsq_into_(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *slots = lem_check_tensor(L, 2, fn, "slots");
  lem_check_type(L, 3, fn, "index", LUA_TTABLE);
  if (slots->ndim != 1 || slots->dtype != EM_F32)
    return lem_error(L, fn, "expected slots to be a 1-d f32 tensor, got %d dims of %s", slots->ndim,
                     em_dtype_name(slots->dtype));
  em_tensor **p = NULL;
  int n = lem_check_tensor_list(L, 1, fn, &p), rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    lua_rawgeti(L, 3, i + 1);
    lua_Integer k = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : 0;
    lua_pop(L, 1);
    if (k < 1 || k > slots->shape[0]) {
      free(p);
      return lem_error(L, fn, "index[%d] must be an integer in [1, %lld], got %lld", i + 1,
                       (long long)slots->shape[0], (long long)k);
    }
    if (!p[i]->grad) continue;
    em_tensor *s = em_sum_of_squares(1, &p[i]->grad), *slot = s ? em_select(slots, 0, k - 1) : NULL;
    rc = slot ? em_copy_(slot, s) : -1;
    em_tensor_release(slot);
    em_tensor_release(s);
  }
  free(p);
  if (rc) return lem_raise(L);
  return 0;
}

static int l_has_grad(lua_State *L) {
  lua_pushboolean(L, lem_check_tensor(L, 1, lem_name(L), "self")->grad != NULL);
  return 1;
}

/* Drop (set_to_none) or zero each param's gradient. Returns the bytes of
 * device gradients that were dropped while something else (a Lua handle, a
 * view) still referenced them: memory that comes back only at the next
 * collection, which the caller can then ask for. */
static int l_zero_grad_(lua_State *L) {
  const char *fn = lem_name(L);
  bool to_none = lua_toboolean(L, 2);
  em_tensor **p = NULL;
  int n = lem_check_tensor_list(L, 1, fn, &p);
  lua_Integer stranded = 0;
  for (int i = 0; i < n; i++) {
    em_tensor *g = p[i]->grad;
    if (!g) continue;
    if (!to_none) {
      if (em_fill_(g, 0)) { free(p); return lem_raise(L); }
      continue;
    }
    if (g->device.type != EM_CPU && (g->refcount > 1 || g->storage->refcount > 1))
      stranded += (lua_Integer)g->storage->nbytes;
    if (em_set_grad(p[i], NULL)) { free(p); return lem_raise(L); }
  }
  free(p);
  lua_pushinteger(L, stranded);
  return 1;
}

/* dtype + EM_NDTYPES * (0 for the CPU, 1 + the index of a CUDA device) */
static int l_placements(lua_State *L) {
  em_tensor **p = NULL;
  int n = lem_check_tensor_list(L, 1, lem_name(L), &p);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_Integer where = p[i]->device.type == EM_CPU ? 0 : 1 + (lua_Integer)p[i]->device.index;
    lua_pushinteger(L, (lua_Integer)p[i]->dtype + EM_NDTYPES * where);
    lua_rawseti(L, -2, i + 1);
  }
  free(p);
  return 1;
}

static int l_cuda_is_capturing(lua_State *L) {
  lua_pushboolean(L, em_cuda_compiled() && em_cuda_capturing());
  return 1;
}

void lem_open_nn_cuda(lua_State *L, int module) {
  static const luaL_Reg f[] = {{"adamw_capturable_", l_adamw_capturable_}, {"clip_grads_", l_clip_grads_},
                               {"clip_param_grads_", l_clip_param_grads_}, {"grad_sumsq_into_", l_grad_sumsq_into_},
                               {"has_grad", l_has_grad},
                               {"zero_grad_", l_zero_grad_}, {"cuda_is_capturing", l_cuda_is_capturing},
                               {"placements", l_placements}, {NULL, NULL}};
  lem_register(L, 0, module, f);
  lua_pushinteger(L, EM_NDTYPES);
  lua_setfield(L, module, "PLACEMENT_CPU_END");
}
