/* The C side of ember.dist: thin wrappers over ember/comm.h and the work
 * handle userdata. Option tables, defaults and call sites are handled by
 * bindings/ember/dist.lua, which calls these positional functions. */
#include <string.h>
#include "lua_ember.h"
#include "ember/comm.h"

#define WORK_MT "ember.dist.Work"

typedef struct { em_work *w; } work_box;

static em_reduce_op check_op(lua_State *L, int idx, const char *fn) {
  const char *name = lem_opt_string(L, idx, fn, "op", "sum");
  em_reduce_op op;
  if (em_reduce_op_from_name(name, &op))
    lem_error(L, fn, "expected op \"sum\", \"avg\", \"max\" or \"min\", got \"%s\"", name);
  return op;
}

/* The Lua call site dist.lua passes last (for error messages and the failure summary). */
static const char *opt_site(lua_State *L, int idx, const char *fn) { return lem_opt_string(L, idx, fn, "site", NULL); }

/* Push the work handle (async) or nothing (sync); raise on failure. */
static int finish(lua_State *L, int rc, em_work *w, bool async) {
  if (rc) return lem_raise(L);
  if (!async) return 0;
  work_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->w = w;
  luaL_setmetatable(L, WORK_MT);
  return 1;
}

static int l_available(lua_State *L) { lua_pushstring(L, em_dist_available()); return 1; }

static int l_init(lua_State *L) {
  const char *fn = lem_name(L);
  em_dist_options o = {lem_opt_string(L, 1, fn, "backend", NULL), lem_opt_number(L, 2, fn, "timeout", 0),
                       lua_isnoneornil(L, 3) ? -1 : lua_toboolean(L, 3)};
  if (em_dist_init(&o)) return lem_raise(L);
  return 0;
}

static int l_rank(lua_State *L) { lua_pushinteger(L, em_dist_rank()); return 1; }
static int l_world_size(lua_State *L) { lua_pushinteger(L, em_dist_world_size()); return 1; }
static int l_local_rank(lua_State *L) { lua_pushinteger(L, em_dist_local_rank()); return 1; }
static int l_is_initialized(lua_State *L) { lua_pushboolean(L, em_dist_is_initialized()); return 1; }
static int l_backend(lua_State *L) { lua_pushstring(L, em_dist_backend()); return 1; }
static int l_timeout(lua_State *L) { lua_pushnumber(L, em_dist_timeout()); return 1; }
static int l_check(lua_State *L) {
  bool cpu, cuda;
  em_dist_check_enabled(&cpu, &cuda);
  lua_pushboolean(L, cpu);
  lua_pushboolean(L, cuda);
  return 2;
}
static int l_destroy(lua_State *L) { if (em_dist_destroy()) return lem_raise(L); return 0; }

static int l_all_reduce(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "t");
  em_reduce_op op = check_op(L, 2, fn);
  bool async = lua_toboolean(L, 3);
  em_work *w = NULL;
  int rc = em_all_reduce(t, op, async ? &w : NULL, opt_site(L, 4, fn));
  return finish(L, rc, w, async);
}

static int l_broadcast(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "t");
  int src = (int)lem_opt_int(L, 2, fn, "src", 0);
  bool async = lua_toboolean(L, 3);
  em_work *w = NULL;
  int rc = em_broadcast(t, src, async ? &w : NULL, opt_site(L, 4, fn));
  return finish(L, rc, w, async);
}

static int l_all_gather(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *out = lem_check_tensor(L, 1, fn, "out");
  em_tensor *t = lem_check_tensor(L, 2, fn, "t");
  bool async = lua_toboolean(L, 3);
  em_work *w = NULL;
  int rc = em_all_gather(out, t, async ? &w : NULL, opt_site(L, 4, fn));
  return finish(L, rc, w, async);
}

static int l_reduce_scatter(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *out = lem_check_tensor(L, 1, fn, "out");
  em_tensor *t = lem_check_tensor(L, 2, fn, "t");
  em_reduce_op op = check_op(L, 3, fn);
  bool async = lua_toboolean(L, 4);
  em_work *w = NULL;
  int rc = em_reduce_scatter(out, t, op, async ? &w : NULL, opt_site(L, 5, fn));
  return finish(L, rc, w, async);
}

static int l_barrier(lua_State *L) { if (em_barrier(opt_site(L, 1, lem_name(L)))) return lem_raise(L); return 0; }

static int l_send(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "t");
  int dst = (int)lem_check_number(L, 2, fn, "dst");
  if (em_send(t, dst, opt_site(L, 3, fn))) return lem_raise(L);
  return 0;
}

static int l_recv(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "t");
  int src = (int)lem_check_number(L, 2, fn, "src");
  if (em_recv(t, src, opt_site(L, 3, fn))) return lem_raise(L);
  return 0;
}

static int l_stats(lua_State *L) {
  em_dist_stats s;
  em_dist_stats_get(&s);
  lua_createtable(L, 0, EM_NCOLL);
  for (int k = 0; k < EM_NCOLL; k++) {
    lua_createtable(L, 0, 2);
    lua_pushinteger(L, s.calls[k]); lua_setfield(L, -2, "calls");
    lua_pushinteger(L, s.bytes[k]); lua_setfield(L, -2, "bytes");
    lua_setfield(L, -2, em_coll_name((em_coll_kind)k));
  }
  return 1;
}
static int l_stats_reset(lua_State *L) { (void)L; em_dist_stats_reset(); return 0; }

/* ---- work handles ---- */

static work_box *check_work(lua_State *L, int idx, const char *fn) {
  work_box *b = luaL_testudata(L, idx, WORK_MT);
  if (!b) lem_error(L, fn, "expected a dist work handle, got %s", luaL_typename(L, idx));
  return b;
}

static int w_wait(lua_State *L) {
  const char *fn = lem_name(L);
  work_box *b = check_work(L, 1, fn);
  if (b->w && em_work_wait(b->w)) return lem_raise(L);
  lua_settop(L, 1);
  return 1;
}

static int w_is_completed(lua_State *L) {
  const char *fn = lem_name(L);
  work_box *b = check_work(L, 1, fn);
  if (!b->w) { lua_pushboolean(L, 1); return 1; }
  int r = em_work_is_completed(b->w);
  if (r < 0) return lem_raise(L);
  lua_pushboolean(L, r);
  return 1;
}

static int w_gc(lua_State *L) {
  work_box *b = luaL_checkudata(L, 1, WORK_MT);
  if (b->w) em_work_free(b->w);    /* waits first when the script did not */
  b->w = NULL;
  return 0;
}

static int w_tostring(lua_State *L) {
  work_box *b = luaL_checkudata(L, 1, WORK_MT);
  lua_pushstring(L, b->w ? "ember.dist.Work(pending or done; call :wait())" : "ember.dist.Work(released)");
  return 1;
}

void lem_open_dist(lua_State *L, int module) {
  luaL_newmetatable(L, WORK_MT);
  static const lem_Reg m[] = {{"wait", w_wait, "dist.Work.wait"},
                               {"is_completed", w_is_completed, "dist.Work.is_completed"}, {NULL, NULL, NULL}};
  lua_newtable(L);
  lem_register_named(L, 0, lua_gettop(L), m);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, w_gc); lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, w_gc); lua_setfield(L, -2, "__close");
  lua_pushcfunction(L, w_tostring); lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  /* named as ember.dist (bindings/ember/dist.lua) shows them */
  static const lem_Reg f[] = {
    {"dist_available", l_available, "dist.available"}, {"dist_init", l_init, "dist.init"},
    {"dist_rank", l_rank, "dist.rank"}, {"dist_world_size", l_world_size, "dist.world_size"},
    {"dist_local_rank", l_local_rank, "dist.local_rank"},
    {"dist_is_initialized", l_is_initialized, "dist.is_initialized"}, {"dist_backend", l_backend, "dist.backend"},
    {"dist_timeout", l_timeout, "dist.timeout"}, {"dist_check", l_check, "dist.check"},
    {"dist_destroy", l_destroy, "dist.destroy"}, {"dist_all_reduce", l_all_reduce, "dist.all_reduce"},
    {"dist_broadcast", l_broadcast, "dist.broadcast"}, {"dist_all_gather", l_all_gather, "dist.all_gather"},
    {"dist_reduce_scatter", l_reduce_scatter, "dist.reduce_scatter"}, {"dist_barrier", l_barrier, "dist.barrier"},
    {"dist_send", l_send, "dist.send"}, {"dist_recv", l_recv, "dist.recv"}, {"dist_stats", l_stats, "dist.stats"},
    {"dist_stats_reset", l_stats_reset, "dist.stats_reset"}, {NULL, NULL, NULL}};
  lem_register_named(L, 0, module, f);
}
