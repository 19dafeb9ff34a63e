/* Mixed precision switches for Lua: the autocast region (ember/autocast.h),
 * the TF32 switch for f32 matmuls on CUDA and the matmul tuning switch and
 * table (ember/cuda.h). The friendly forms, ember.autocast(dtype, fn),
 * ember.backends.tf32(on) and ember.backends.matmul_tune(on), live in
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

/* core.matmul_set_tune(on) -> the previous setting (raises on a bad EMBER_MATMUL_TUNE). */
static int l_matmul_set_tune(lua_State *L) {
  const char *fn = lem_name(L);
  lem_check_type(L, 1, fn, "on", LUA_TBOOLEAN);
  bool prev;
  if (em_matmul_set_tune(fn, lua_toboolean(L, 1), &prev)) return lem_raise(L);
  lua_pushboolean(L, prev);
  return 1;
}

/* core.matmul_tune() -> the current setting (EMBER_MATMUL_TUNE until set). */
static int l_matmul_tune(lua_State *L) {
  bool on;
  if (em_matmul_tune_enabled(lem_name(L), &on)) return lem_raise(L);
  lua_pushboolean(L, on);
  return 1;
}

/* core.matmul_tune_force_splitk(k) -> previous k: the GPU spec's hook (ember/cuda.h) that makes
 * keys tuned from then on take a split-K k candidate; 0 chooses by time again. */
static int l_matmul_tune_force_splitk(lua_State *L) {
  const char *fn = lem_name(L);
  int64_t k = lem_check_int(L, 1, fn, "k");
  int prev;
  if (em_matmul_set_tune_force_splitk(fn, k, &prev)) return lem_raise(L);
  lua_pushinteger(L, prev);
  return 1;
}

static void set_int(lua_State *L, const char *k, int64_t v) { lua_pushinteger(L, (lua_Integer)v); lua_setfield(L, -2, k); }
static void set_bool(lua_State *L, const char *k, bool v) { lua_pushboolean(L, v); lua_setfield(L, -2, k); }
static void set_num(lua_State *L, const char *k, double v) {
  if (v < 0) return;                   /* not timed: the field stays nil */
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

/* core.matmul_tune_table() -> {{n=, m=, k=, batch=, dtype=, ..., algo=, time_us=, heuristic_time_us=}, ...}:
 * every tuned key in tuning order (ember/cuda.h's em_matmul_tune_entry, field for field). */
static int l_matmul_tune_table(lua_State *L) {
  int64_t n = em_matmul_tune_count();
  lua_createtable(L, (int)n, 0);
  for (int64_t i = 0; i < n; i++) {
    em_matmul_tune_entry e;
    if (em_matmul_tune_get(i, &e)) return lem_raise(L);
    lua_createtable(L, 0, 32);
    set_int(L, "device", e.device);
    lua_pushstring(L, em_dtype_name(e.dtype));
    lua_setfield(L, -2, "dtype");
    set_bool(L, "tf32", e.tf32); set_bool(L, "a_trans", e.a_trans); set_bool(L, "b_trans", e.b_trans);
    set_bool(L, "bias", e.bias); set_bool(L, "c_f32", e.c_f32);
    lua_pushnumber(L, e.beta);
    lua_setfield(L, -2, "beta");
    set_int(L, "n", e.n); set_int(L, "m", e.m); set_int(L, "k", e.k); set_int(L, "batch", e.batch);
    set_int(L, "lda", e.lda); set_int(L, "ldb", e.ldb); set_int(L, "ldc", e.ldc);
    set_bool(L, "in_capture", e.in_capture);
    set_int(L, "candidates", e.candidates); set_int(L, "extra", e.extra); set_int(L, "skipped", e.skipped);
    set_int(L, "chosen", e.chosen); set_bool(L, "forced", e.forced);
    set_int(L, "algo", e.algo); set_int(L, "tile", e.tile); set_int(L, "stages", e.stages);
    set_int(L, "splitk", e.splitk); set_int(L, "cluster", e.cluster);
    set_int(L, "heuristic_algo", e.h_algo); set_int(L, "heuristic_tile", e.h_tile);
    set_int(L, "heuristic_stages", e.h_stages); set_int(L, "heuristic_splitk", e.h_splitk);
    set_int(L, "heuristic_cluster", e.h_cluster);
    set_int(L, "calls", e.calls);
    set_num(L, "time_us", e.time_us); set_num(L, "heuristic_time_us", e.heuristic_time_us);
    lua_rawseti(L, -2, (lua_Integer)(i + 1));
  }
  return 1;
}

void lem_open_amp(lua_State *L, int module) {
  static const luaL_Reg f[] = {
    {"autocast_exit", l_autocast_exit}, {"autocast_enabled", l_autocast_enabled},
    {"autocast_dtype", l_autocast_dtype}, {"cuda_allow_tf32", l_cuda_allow_tf32},
    {"matmul_tune_table", l_matmul_tune_table}, {"matmul_tune_force_splitk", l_matmul_tune_force_splitk},
    {NULL, NULL}};
  lem_register(L, 0, module, f);
  /* named as amp.lua shows them */
  static const lem_Reg named[] = {{"autocast_enter", l_autocast_enter, "autocast"},
                                  {"cuda_set_allow_tf32", l_cuda_set_allow_tf32, "backends.tf32"},
                                  {"matmul_set_tune", l_matmul_set_tune, "backends.matmul_tune"},
                                  {"matmul_tune", l_matmul_tune, "backends.matmul_tune"}, {NULL, NULL, NULL}};
  lem_register_named(L, 0, module, named);
}
