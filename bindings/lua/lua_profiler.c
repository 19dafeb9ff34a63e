/* The C side of ember.profiler and ember.nvtx (ember/profiler.h): session
 * control, NVTX ranges, and a profile userdata whose queries return plain
 * Lua rows. Formatting (tables, JSON) is Lua: bindings/ember/profiler.lua. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lua_ember.h"

#define PROFILE_MT "ember.Profile"

typedef struct { em_profile *p; } profile_box;

/* ---------------- session ---------------- */

/* core.prof_start({backend=}): the table is ember.profiler.start's, which reads other keys. */
static int l_prof_start(lua_State *L) {
  const char *fn = lem_name(L);
  em_prof_opts o = {0};
  if (!lua_isnoneornil(L, 1)) lem_check_type(L, 1, fn, "opts", LUA_TTABLE);
  if (lem_field(L, lem_opts(L, 1, fn, NULL), fn, "backend", LUA_TSTRING)) o.backend = lua_tostring(L, -1);
  if (em_profiler_start(&o)) return lem_raise(L);
  return 0;
}

static int l_prof_stop(lua_State *L) {
  em_profile *p = em_profiler_stop();
  if (!p) return lem_raise(L);
  profile_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->p = p;
  luaL_setmetatable(L, PROFILE_MT);
  return 1;
}

static int l_prof_running(lua_State *L) { lua_pushboolean(L, em_profiler_running()); return 1; }
static int l_prof_step(lua_State *L) { em_profiler_step(); return 0; }

/* core.prof_init() -> true | false, reason */
static int l_prof_init(lua_State *L) {
  if (em_profiler_init() == 0) { lua_pushboolean(L, 1); return 1; }
  lua_pushboolean(L, 0);
  lua_pushstring(L, em_last_error());
  em_clear_error();
  return 2;
}

/* core.prof_auto_backend() -> "cupti" | "events" | "host", why ("" for cupti) */
static int l_prof_auto_backend(lua_State *L) {
  const char *why = "";
  lua_pushstring(L, em_prof_backend_name(em_profiler_auto_backend(&why)));
  lua_pushstring(L, why);
  return 2;
}

/* ---------------- NVTX ---------------- */

static int l_nvtx_available(lua_State *L) { lua_pushboolean(L, em_nvtx_available()); return 1; }
static int l_nvtx_enable(lua_State *L) { lua_pushboolean(L, em_nvtx_enable(lua_toboolean(L, 1))); return 1; }
static int l_nvtx_enabled(lua_State *L) { lua_pushboolean(L, em_nvtx_enabled()); return 1; }
static int l_nvtx_push(lua_State *L) { em_nvtx_push(lem_check_string(L, 1, lem_name(L), "name")); return 0; }
static int l_nvtx_pop(lua_State *L) { em_nvtx_pop(); return 0; }
static int l_nvtx_mark(lua_State *L) { em_nvtx_mark(lem_check_string(L, 1, lem_name(L), "name")); return 0; }

/* ---------------- profile objects ---------------- */

static em_profile *check_profile(lua_State *L, int idx, const char *fn) {
  profile_box *b = luaL_testudata(L, idx, PROFILE_MT);
  if (!b) lem_error(L, fn, "expected a profile (from ember.profiler.stop), got %s", luaL_typename(L, idx));
  if (!b->p) lem_error(L, fn, "this profile was closed");
  return b->p;
}

static int p_close(lua_State *L) {
  profile_box *b = luaL_checkudata(L, 1, PROFILE_MT);
  em_profile_free(b->p);
  b->p = NULL;
  return 0;
}

/* An option that must be one of names (nil: def); errors list `expected`. */
static int field_enum(lua_State *L, int opts, const char *fn, const char *key, int def, const char *const names[],
                      const char *expected) {
  if (!lem_field(L, opts, fn, key, LUA_TNONE)) return def;
  const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
  for (int i = 0; s && names[i]; i++)
    if (!strcmp(s, names[i])) { lua_pop(L, 1); return i; }
  if (s) return lem_error(L, fn, "expected option '%s' to be %s, got \"%s\"", key, expected, s);
  return lem_error(L, fn, "expected option '%s' to be %s, got %s", key, expected, luaL_typename(L, -1));
}

static void set_ms(lua_State *L, const char *key, int64_t ns) {
  if (ns < 0) return;                  /* unknown: the field stays nil */
  lua_pushnumber(L, (double)ns * 1e-6);
  lua_setfield(L, -2, key);
}

static void set_int(lua_State *L, const char *key, int64_t v) {
  if (v < 0) return;
  lua_pushinteger(L, v);
  lua_setfield(L, -2, key);
}

/* p:group{source="gpu"|"ops", by="name"|"op"|"module"|"phase", phase=, module=glob,
 *         depth=, rollup=, kernels_only=} -> {{key=, calls=, total_ms=, self_ms=,
 *         avg_us=, min_us=, max_us=, forward_ms=, ..., kernels=, device_ms=}, ...} */
static int p_group(lua_State *L) {
  const char *fn = lem_name(L);
  em_profile *p = check_profile(L, 1, fn);
  static const char *const sources[] = {"gpu", "ops", NULL};
  static const char *const keys[] = {"name", "op", "module", "phase", NULL};
  static const char *const phases[] = {"none", "forward", "backward", "optimizer", NULL};
  em_prof_query q = {.phase = -1};
  if (!lua_isnoneornil(L, 2)) lem_check_type(L, 2, fn, "opts", LUA_TTABLE);
  int opts = lem_opts(L, 2, fn, NULL);   /* ember.profile's methods pass the user's table on */
  q.source = (em_prof_source)field_enum(L, opts, fn, "source", 0, sources, "\"gpu\" or \"ops\"");
  q.key = (em_prof_key)field_enum(L, opts, fn, "by", 0, keys, "\"name\", \"op\", \"module\" or \"phase\"");
  q.phase = field_enum(L, opts, fn, "phase", -1, phases, "\"forward\", \"backward\", \"optimizer\" or \"none\"");
  if (lem_field(L, opts, fn, "module", LUA_TNONE)) {
    if (lua_type(L, -1) != LUA_TSTRING)
      return lem_error(L, fn, "expected option 'module' to be a pattern string, got %s", luaL_typename(L, -1));
    q.module_glob = lua_tostring(L, -1);   /* the table keeps it alive */
    lua_pop(L, 1);
  }
  q.depth = (int)lem_field_number(L, opts, fn, "depth", 0);
  q.rollup = lem_field_bool(L, opts, fn, "rollup", 0);
  q.kernels_only = lem_field_bool(L, opts, fn, "kernels_only", 0);
  /* peaks = {gbs = , tflops = {f32 = , tf32 = , bf16 = , ...}}: the roofline floors */
  if (lem_field(L, opts, fn, "peaks", LUA_TTABLE)) {
    int pk = lua_gettop(L);
    q.peak_gbs = lem_field_number(L, pk, fn, "gbs", 0);
    if (lem_field(L, pk, fn, "tflops", LUA_TTABLE)) {
      int tf = lua_gettop(L);
      for (int c = 0; c < EM_PROF_FLOP_CLASSES; c++)
        q.peak_tflops[c] = lem_field_number(L, tf, fn, em_prof_flop_class_name(c), 0);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  em_prof_row *rows = NULL;
  size_t n = 0;
  if (em_profile_group(p, &q, &rows, &n)) return lem_raise(L);
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    const em_prof_row *r = &rows[i];
    lua_createtable(L, 0, 20);
    lua_pushstring(L, r->key);
    lua_setfield(L, -2, "key");
    set_int(L, "calls", r->calls);
    set_ms(L, "total_ms", r->total_ns);
    set_ms(L, "self_ms", r->self_ns);
    lua_pushnumber(L, r->calls ? (double)r->total_ns / (double)r->calls * 1e-3 : 0);
    lua_setfield(L, -2, "avg_us");
    lua_pushnumber(L, (double)r->min_ns * 1e-3);
    lua_setfield(L, -2, "min_us");
    lua_pushnumber(L, (double)r->max_ns * 1e-3);
    lua_setfield(L, -2, "max_us");
    for (int ph = 0; ph < EM_PHASE_COUNT; ph++) {
      char key[32];
      snprintf(key, sizeof key, "%s_ms", em_phase_name((em_phase)ph));
      set_ms(L, key, r->phase_ns[ph]);
      snprintf(key, sizeof key, "%s_calls", em_phase_name((em_phase)ph));
      set_int(L, key, r->phase_calls[ph]);
    }
    set_int(L, "kernels", r->kernels);
    set_ms(L, "device_ms", r->device_ns);
    /* roofline: time the rates divide by, the part with a declared cost, what was declared */
    set_ms(L, "roof_ms", r->roof_ns);
    set_ms(L, "cost_ms", r->cost_ns);
    lua_pushnumber(L, r->bytes);
    lua_setfield(L, -2, "bytes");
    lua_pushnumber(L, r->flops);
    lua_setfield(L, -2, "flops");
    if (r->mem_floor_ns + r->flop_floor_ns > 0) {
      lua_pushnumber(L, (r->mem_floor_ns + r->flop_floor_ns) * 1e-6);
      lua_setfield(L, -2, "floor_ms");
      lua_pushstring(L, r->mem_floor_ns >= r->flop_floor_ns ? "memory" : "compute");
      lua_setfield(L, -2, "bound");
    }
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  free(rows);
  return 1;
}

/* p:summary() -> table of counts and times (ms) */
static int p_summary(lua_State *L) {
  em_profile *p = check_profile(L, 1, lem_name(L));
  em_prof_summary s;
  em_profile_summary(p, &s);
  lua_createtable(L, 0, 32);
  lua_pushstring(L, em_prof_backend_name(s.backend)); lua_setfield(L, -2, "backend");
  lua_pushstring(L, s.label); lua_setfield(L, -2, "label");
  lua_pushstring(L, s.reason); lua_setfield(L, -2, "reason");
  set_ms(L, "wall_ms", s.wall_ns);
  set_ms(L, "gpu_busy_ms", s.gpu_busy_ns);
  set_ms(L, "kernel_ms", s.kernel_ns);
  set_ms(L, "copy_ms", s.copy_ns);
  set_int(L, "kernels", s.kernels);
  set_int(L, "memcpys", s.memcpys);
  set_int(L, "memsets", s.memsets);
  set_int(L, "ops", s.ops);
  set_int(L, "top_ops", s.top_ops);
  set_ms(L, "top_op_ms", s.top_op_ns);
  set_ms(L, "op_device_ms", s.op_device_ns);
  set_int(L, "steps_marked", s.steps_marked);
  set_int(L, "ranges", s.ranges);
  set_int(L, "marks", s.marks);
  set_int(L, "graph_kernels", s.graph_kernels);
  set_int(L, "graph_kernels_attributed", s.graph_kernels_attributed);
  set_int(L, "dropped", s.dropped);
  set_int(L, "before_window", s.before_window);
  lua_createtable(L, 0, EM_PHASE_COUNT);
  for (int ph = 0; ph < EM_PHASE_COUNT; ph++) {
    lua_createtable(L, 0, 4);
    set_int(L, "kernels", s.phase_kernels[ph]);
    set_ms(L, "kernel_ms", s.phase_kernel_ns[ph]);
    set_int(L, "count", s.phase_count[ph]);
    set_ms(L, "wall_ms", s.phase_wall_ns[ph]);
    lua_setfield(L, -2, em_phase_name((em_phase)ph));
  }
  lua_setfield(L, -2, "phases");
  return 1;
}

/* p:write_chrome_trace(path) -> bytes written */
static int p_write_trace(lua_State *L) {
  const char *fn = lem_name(L);
  em_profile *p = check_profile(L, 1, fn);
  const char *path = lem_check_string(L, 2, fn, "path");
  int64_t n = em_profile_write_chrome_trace(p, path);
  if (n < 0) return lem_raise(L);
  lua_pushinteger(L, n);
  return 1;
}

void lem_open_profiler(lua_State *L, int module) {
  /* named as ember.profile's methods (bindings/ember/profiler.lua) show them */
  static const lem_Reg methods[] = {{"group", p_group, "profile"}, {"summary", p_summary, "profile.summary"},
                                    {"write_chrome_trace", p_write_trace, "profile.export_chrome_trace"},
                                    {"close", p_close, "profile.close"}, {NULL, NULL, NULL}};
  luaL_newmetatable(L, PROFILE_MT);
  lua_newtable(L);
  lem_register_named(L, 0, lua_gettop(L), methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, p_close);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, p_close);
  lua_setfield(L, -2, "__close");
  lua_pushliteral(L, PROFILE_MT);
  lua_setfield(L, -2, "__name");
  lua_pop(L, 1);
  static const luaL_Reg f[] = {
    {"prof_running", l_prof_running}, {"prof_step", l_prof_step}, {"prof_init", l_prof_init},
    {"prof_auto_backend", l_prof_auto_backend}, {"nvtx_available", l_nvtx_available},
    {"nvtx_enable", l_nvtx_enable}, {"nvtx_enabled", l_nvtx_enabled}, {"nvtx_pop", l_nvtx_pop}, {NULL, NULL}};
  lem_register(L, 0, module, f);
  /* named as ember.profiler and ember.nvtx show them */
  static const lem_Reg named[] = {
    {"prof_start", l_prof_start, "profiler.start"}, {"prof_stop", l_prof_stop, "profiler.stop"},
    {"nvtx_push", l_nvtx_push, "nvtx.push"}, {"nvtx_mark", l_nvtx_mark, "nvtx.mark"}, {NULL, NULL, NULL}};
  lem_register_named(L, 0, module, named);
}
