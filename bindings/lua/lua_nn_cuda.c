/* core functions for device-resident training steps (CUDA graphs): the
 * capturable AdamW step, gradient clipping by a factor read on the device,
 * and whether this thread is capturing. They work on the CPU too.
 *   core.adamw_capturable_(params, grads, exp_avg, exp_avg_sq, steps, lr_t|nil, lr, beta1, beta2, eps, wd)
 *   core.clip_grads_(grads, sumsq, max_norm) -> the total norm (0-d f32 tensor on sumsq's device)
 *   core.cuda_is_capturing() -> boolean */
#include <stdlib.h>
#include "lua_ember.h"

static int l_adamw_capturable_(lua_State *L) {
  const char *fn = "adamw_capturable_";
  em_tensor *lr_t = lua_isnoneornil(L, 6) ? NULL : lem_check_tensor(L, 6, fn, "lr");
  double lr = lem_check_number(L, 7, fn, "lr"), b1 = lem_check_number(L, 8, fn, "beta1");
  double b2 = lem_check_number(L, 9, fn, "beta2"), eps = lem_check_number(L, 10, fn, "eps");
  double wd = lem_check_number(L, 11, fn, "weight_decay");
  em_tensor **p = NULL, **g = NULL, **m = NULL, **v = NULL, **s = NULL;
  int n = lem_check_tensor_list(L, 1, fn, &p), n2 = lem_check_tensor_list(L, 2, fn, &g);
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
  const char *fn = "clip_grads_";
  em_tensor *sumsq = lem_check_tensor(L, 2, fn, "sumsq");
  double max_norm = lem_check_number(L, 3, fn, "max_norm");
  em_tensor **g = NULL;
  int n = lem_check_tensor_list(L, 1, fn, &g);
  em_tensor *norm = em_clip_grads_(n, g, sumsq, max_norm);
  free(g);
  return lem_push_result(L, norm);
}

static int l_cuda_is_capturing(lua_State *L) {
  lua_pushboolean(L, em_cuda_compiled() && em_cuda_capturing());
  return 1;
}

void lem_open_nn_cuda(lua_State *L, int module) {
  static const luaL_Reg f[] = {{"adamw_capturable_", l_adamw_capturable_}, {"clip_grads_", l_clip_grads_},
                               {"cuda_is_capturing", l_cuda_is_capturing}, {NULL, NULL}};
  lem_register(L, 0, module, f);
}
