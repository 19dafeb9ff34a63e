/* The measurement context for Lua (ember/profile.h): module paths and phases
 * that the profiler, NVTX ranges and memory history attribute work to.
 * Module paths travel as light userdata of interned strings, so the per-call
 * cost while tracking is on is two pointer stores and no hashing. */
#include "lua_ember.h"

/* core.ctx_intern(path) -> light userdata naming the interned path */
static int l_ctx_intern(lua_State *L) {
  const char *fn = lem_name(L);
  const char *s = lem_check_string(L, 1, fn, "path");
  const char *p = em_intern(s);
  if (!p) return lem_error(L, fn, "out of memory interning a module path");
  lua_pushlightuserdata(L, (void *)p);
  return 1;
}

/* core.ctx_set_module(handle) -> previous handle (from ctx_intern) */
static int l_ctx_set_module(lua_State *L) {
  if (!lua_islightuserdata(L, 1))
    return lem_error(L, lem_name(L), "expected argument 1 (handle) to be a module path from ctx_intern, got %s",
                     luaL_typename(L, 1));
  const char *prev = em_ctx_set_module((const char *)lua_touserdata(L, 1));
  lua_pushlightuserdata(L, (void *)prev);
  return 1;
}

/* core.ctx_module() -> the current module path as a string ("" at the root) */
static int l_ctx_module(lua_State *L) {
  lua_pushstring(L, em_ctx_module());
  return 1;
}

/* core.ctx_set_phase(name) -> previous phase name */
static int l_ctx_set_phase(lua_State *L) {
  const char *fn = lem_name(L);
  const char *name = lem_check_string(L, 1, fn, "phase");
  int p = em_phase_parse(name);
  if (p < 0)
    return lem_error(L, fn,
                     "expected \"forward\", \"backward\", \"optimizer\" or \"none\", got \"%s\"", name);
  lua_pushstring(L, em_phase_name(em_ctx_set_phase((em_phase)p)));
  return 1;
}

static int l_ctx_phase(lua_State *L) {
  lua_pushstring(L, em_phase_name(em_ctx_phase()));
  return 1;
}

/* core.ctx_op() -> the op being run (nil outside ops; from Lua that is always) */
static int l_ctx_op(lua_State *L) {
  const char *op = em_ctx_op();
  if (op) lua_pushstring(L, op); else lua_pushnil(L);
  return 1;
}

void lem_open_context(lua_State *L, int module) {
  static const luaL_Reg f[] = {
    {"ctx_intern", l_ctx_intern}, {"ctx_set_module", l_ctx_set_module}, {"ctx_module", l_ctx_module},
    {"ctx_set_phase", l_ctx_set_phase}, {"ctx_phase", l_ctx_phase}, {"ctx_op", l_ctx_op},
    {NULL, NULL}};
  lem_register(L, 0, module, f);
}
