/* Mixed precision switches for Lua: the autocast region (ember/autocast.h)
 * and the TF32 switch for f32 matmuls on CUDA (ember/cuda.h). The friendly
 * forms, ember.autocast(dtype, fn) and ember.backends.tf32(on), live in
 * bindings/ember/amp.lua; these are the raw enter/exit pairs they use. */
#include "lua_ember.h"

/* core.autocast_enter(dtype): "bf16" / "f16" (torch aliases accepted). */
static int l_autocast_enter(lua_State *L) {
  const char *fn = lem_name(L);
  const char *name = lem_check_string(L, 1, fn, "dtype");
  em_dtype dt;
  if (em_dtype_from_name(name, &dt) || (dt != EM_BF16 && dt != EM_F16))
    return lem_error(L, fn, "expected dtype \"bf16\" or \"f16\", got %s", name);
  if (em_autocast_enter(dt)) return lem_raise(L);
  return 0;
}

/* core.autocast_exit(): leave the innermost region (no-op outside one). */
static int l_autocast_exit(lua_State *L) {
  (void)L;
  em_autocast_exit();
  return 0;
}

static int l_autocast_enabled(lua_State *L) {
  lua_pushboolean(L, em_autocast_enabled());
  return 1;
}

/* core.autocast_dtype() -> "bf16"/"f16" inside a region, nil outside. */
static int l_autocast_dtype(lua_State *L) {
  if (!em_autocast_enabled()) { lua_pushnil(L); return 1; }
  lua_pushstring(L, em_dtype_name(em_autocast_dtype()));
  return 1;
}

/* core.cuda_set_allow_tf32(on) -> the previous setting. */
static int l_cuda_set_allow_tf32(lua_State *L) {
  lem_check_type(L, 1, lem_name(L), "on", LUA_TBOOLEAN);
  bool prev = em_cuda_allow_tf32();
  em_cuda_set_allow_tf32(lua_toboolean(L, 1));
  lua_pushboolean(L, prev);
  return 1;
}

static int l_cuda_allow_tf32(lua_State *L) {
  lua_pushboolean(L, em_cuda_allow_tf32());
  return 1;
}

void lem_open_amp(lua_State *L, int module) {
  static const luaL_Reg f[] = {
    {"autocast_exit", l_autocast_exit}, {"autocast_enabled", l_autocast_enabled},
    {"autocast_dtype", l_autocast_dtype}, {"cuda_allow_tf32", l_cuda_allow_tf32}, {NULL, NULL}};
  lem_register(L, 0, module, f);
  /* named as amp.lua shows them */
  static const lem_Reg named[] = {{"autocast_enter", l_autocast_enter, "autocast"},
                                  {"cuda_set_allow_tf32", l_cuda_set_allow_tf32, "backends.tf32"}, {NULL, NULL, NULL}};
  lem_register_named(L, 0, module, named);
}
