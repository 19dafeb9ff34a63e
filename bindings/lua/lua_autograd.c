/* Autograd bindings: backward, grad mode, requires_grad_, and
 * post-accumulate-grad hooks that call back into Lua. */
#include <stdlib.h>
#include "lua_ember.h"

_Thread_local lua_State *lem_current_L = NULL;

static const char *const BACKWARD_KEYS[] = {"retain_graph", NULL};

/* t:backward([gradient][, {retain_graph=}]) */
static int l_backward(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  em_tensor *g = lem_test_tensor(L, 2, fn);
  int opts = lem_opts(L, lua_istable(L, 2) ? 2 : 3, fn, BACKWARD_KEYS);
  if (!g && !lua_isnoneornil(L, 2) && !opts)
    return lem_error(L, fn, "expected gradient to be a tensor or nil, got %s", luaL_typename(L, 2));
  int retain = lem_field_bool(L, opts, fn, "retain_graph", 0);
  lem_collect_before_backward(L, t);
  lua_State *prev = lem_current_L;
  lem_current_L = L;
  int rc = em_backward(t, g, retain);
  lem_current_L = prev;
  if (rc) return lem_raise(L);
  return 0;
}

static int l_set_grad_enabled(lua_State *L) {
  lua_pushboolean(L, em_set_grad_enabled(lua_toboolean(L, 1)));
  return 1;
}
static int l_is_grad_enabled(lua_State *L) { lua_pushboolean(L, em_grad_enabled()); return 1; }

static int l_requires_grad_(lua_State *L) {
  em_tensor *t = lem_check_tensor(L, 1, lem_name(L), "self");
  if (em_set_requires_grad(t, lua_isnone(L, 2) ? 1 : lua_toboolean(L, 2))) return lem_raise(L);
  lua_settop(L, 1);
  return 1;
}

/* ---- hooks ---- */

typedef struct { lua_State *main; int ref; } lua_hook;

static int msgh(lua_State *L) {
  luaL_traceback(L, L, lua_tostring(L, 1), 1);
  return 1;
}

static int hook_call(em_tensor *param, void *ud) {
  lua_hook *h = ud;
  lua_State *L = lem_current_L ? lem_current_L : h->main;
  lua_pushcfunction(L, msgh);
  int base = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->ref);
  lem_push_tensor(L, em_tensor_retain(param));
  int rc = lua_pcall(L, 1, 0, base);
  if (rc != LUA_OK) {
    em_error("backward: a post-accumulate-grad hook raised an error: %s", lua_tostring(L, -1));
    lua_settop(L, base - 1);
    return -1;
  }
  lua_settop(L, base - 1);
  return 0;
}

static void hook_free(void *ud) {
  lua_hook *h = ud;
  luaL_unref(h->main, LUA_REGISTRYINDEX, h->ref);
  free(h);
}

static int hook_remove(lua_State *L) {
  em_tensor *t = lem_test_tensor(L, lua_upvalueindex(1), NULL);
  int id = (int)lua_tointeger(L, lua_upvalueindex(2));
  if (t) em_remove_hook(t, id);
  return 0;
}

static int l_register_hook(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  lem_check_type(L, 2, fn, "hook", LUA_TFUNCTION);
  lua_hook *h = malloc(sizeof *h);
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  h->main = lua_tothread(L, -1);
  lua_pop(L, 1);
  lua_pushvalue(L, 2);
  h->ref = luaL_ref(L, LUA_REGISTRYINDEX);
  int id = em_register_post_accumulate_grad_hook(t, hook_call, h, hook_free);
  if (id < 0) { hook_free(h); return lem_raise(L); }
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, id);
  lua_setfield(L, -2, "id");
  lua_pushvalue(L, 1);
  lua_pushinteger(L, id);
  lua_pushcclosure(L, hook_remove, 2);
  lua_setfield(L, -2, "remove");
  return 1;
}

void lem_open_autograd(lua_State *L, int methods, int module) {
  static const luaL_Reg both[] = {
    {"backward", l_backward}, {"requires_grad_", l_requires_grad_},
    {"register_post_accumulate_grad_hook", l_register_hook}, {NULL, NULL}};
  lem_register(L, methods, module, both);
  static const luaL_Reg module_only[] = {
    {"set_grad_enabled", l_set_grad_enabled}, {"is_grad_enabled", l_is_grad_enabled}, {NULL, NULL}};
  lem_register(L, 0, module, module_only);
}
