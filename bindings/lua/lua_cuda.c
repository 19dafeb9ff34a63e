/* The C side of ember.cuda: devices, memory statistics, streams, events and
 * graph capture, as thin wrappers over ember/cuda.h. The friendly forms
 * (ember.cuda.stream(s, fn), ember.cuda.graph(fn), memory_allocated, the
 * "no CUDA device" errors) live in bindings/ember/cuda.lua.
 *
 * Also installed here: the OOM callback (a full Lua GC, so unreachable
 * tensors give their device memory back before the allocator retries) and the
 * call-site function ("file:line" of the innermost Lua frame) that capture
 * errors and memory history print. */
#include <stdio.h>
#include <string.h>
#include "lua_ember.h"

#define STREAM_MT "ember.cuda.Stream"
#define EVENT_MT "ember.cuda.Event"
#define GRAPH_MT "ember.cuda.Graph"

static char STREAMS_KEY;                 /* weak table: em_stream* -> its userdata */

typedef struct { em_stream *s; int owned; } stream_box;
typedef struct { em_event *e; } event_box;
typedef struct { em_graph *g; } graph_box;

/* ---------------- call site and OOM ---------------- */

static lua_State *callsite_L;            /* the thread that runs Lua code (main, or the capturing one) */

static const char *lua_callsite(void) {
  static _Thread_local char buf[256];
  lua_State *L = lem_current_L ? lem_current_L : callsite_L;
  if (!L) return NULL;
  lua_Debug ar;
  for (int level = 0; lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "Sl", &ar)) break;
    if (ar.currentline > 0) {
      snprintf(buf, sizeof buf, "%s:%d", ar.short_src, ar.currentline);
      return buf;
    }
  }
  return NULL;
}

/* The thread whose stack names the current call site: the one running a
 * backward or a capture, else the main thread (memory history uses it too). */
lua_State *lem_callsite_state(void) { return lem_current_L ? lem_current_L : callsite_L; }

static void oom_collect(void *ud) {
  lua_gc((lua_State *)ud, LUA_GCCOLLECT);   /* finalizers release unreachable tensors */
}

/* ---------------- helpers ---------------- */

static int opt_device(lua_State *L, int idx, const char *fn) {
  if (lua_isnoneornil(L, idx)) return -1;
  if (lua_type(L, idx) == LUA_TSTRING) {
    em_device d;
    if (em_device_parse(lua_tostring(L, idx), &d) || d.type != EM_CUDA)
      lem_error(L, fn, "expected a CUDA device (\"cuda\", \"cuda:N\" or N), got \"%s\"", lua_tostring(L, idx));
    return d.index;
  }
  return (int)lem_check_int(L, idx, fn, "device");
}

/* ---------------- devices ---------------- */

static int l_set_device(lua_State *L) {
  const char *fn = lem_name(L);
  if (em_cuda_set_device(opt_device(L, 1, fn))) return lem_raise(L);
  return 0;
}
static int l_current_device(lua_State *L) {
  const char *fn = lem_name(L);
  int d = em_cuda_current_device();
  if (d < 0) return lem_error(L, fn, "no CUDA device is available");
  lua_pushinteger(L, d);
  return 1;
}
static int l_device_name(lua_State *L) {
  const char *fn = lem_name(L);
  const char *n = em_cuda_device_name(opt_device(L, 1, fn));
  if (!n) return lem_raise(L);
  lua_pushstring(L, n);
  return 1;
}
static int l_synchronize(lua_State *L) {
  const char *fn = lem_name(L);
  if (em_cuda_synchronize(opt_device(L, 1, fn))) return lem_raise(L);
  return 0;
}

/* ---------------- memory ---------------- */

static int l_memory_stats(lua_State *L) {
  const char *fn = lem_name(L);
  em_cuda_memory_stats s;
  if (em_cuda_memory_stats_get(opt_device(L, 1, fn), &s)) return lem_raise(L);
  lua_createtable(L, 0, 9);
  struct { const char *k; int64_t v; } f[] = {
    {"allocated_bytes", s.allocated}, {"reserved_bytes", s.reserved},
    {"peak_allocated_bytes", s.peak_allocated}, {"peak_reserved_bytes", s.peak_reserved},
    {"num_allocs", s.alloc_count}, {"num_frees", s.free_count}, {"num_cuda_mallocs", s.cuda_malloc_count},
    {"num_cuda_frees", s.cuda_free_count}, {"num_ooms", s.oom_count}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    lua_pushinteger(L, f[i].v);
    lua_setfield(L, -2, f[i].k);
  }
  return 1;
}
static int l_reset_peak(lua_State *L) {
  const char *fn = lem_name(L);
  em_cuda_reset_peak_memory_stats(opt_device(L, 1, fn));
  return 0;
}
static int l_empty_cache(lua_State *L) {
  const char *fn = lem_name(L);
  em_cuda_empty_cache(opt_device(L, 1, fn));
  return 0;
}

/* ---------------- streams ---------------- */

/* Push the userdata of s: the existing one when s already has one (identity,
 * and one owner), else a new box that owns s only when `owned`. */
static void push_stream(lua_State *L, em_stream *s, int owned) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &STREAMS_KEY);
  /* a new stream always gets a new box (a freed stream's address may be reused) */
  if (!owned && lua_rawgetp(L, -1, s) == LUA_TUSERDATA) { lua_remove(L, -2); return; }
  if (!owned) lua_pop(L, 1);
  stream_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->s = s; b->owned = owned;
  luaL_setmetatable(L, STREAM_MT);
  lua_pushvalue(L, -1);
  lua_rawsetp(L, -3, s);
  lua_remove(L, -2);
}

static em_stream *check_stream(lua_State *L, int idx, const char *fn) {
  stream_box *b = luaL_testudata(L, idx, STREAM_MT);
  if (!b || !b->s) lem_error(L, fn, "expected argument %d to be an ember.cuda.Stream, got %s", idx, luaL_typename(L, idx));
  return b->s;
}

static int l_stream_new(lua_State *L) {
  const char *fn = lem_name(L);
  em_stream *s = em_stream_new(opt_device(L, 1, fn));
  if (!s) return lem_raise(L);
  push_stream(L, s, 1);
  return 1;
}
static int l_current_stream(lua_State *L) {
  const char *fn = lem_name(L);
  int d = opt_device(L, 1, fn);
  if (d < 0 && em_cuda_current_device() < 0) return lem_error(L, fn, "no CUDA device is available");
  push_stream(L, em_stream_current(d), 0);
  return 1;
}
/* core.cuda_set_stream(s): make s current on its device (the default stream's handle restores the default). */
static int l_set_stream(lua_State *L) {
  const char *fn = lem_name(L);
  em_stream_set_current(-1, check_stream(L, 1, fn));
  return 0;
}
static int s_gc(lua_State *L) {
  stream_box *b = luaL_checkudata(L, 1, STREAM_MT);
  if (b->s && b->owned) em_stream_free(b->s);
  b->s = NULL;
  return 0;
}
static int s_synchronize(lua_State *L) {
  const char *fn = lem_name(L);
  if (em_stream_synchronize(check_stream(L, 1, fn))) return lem_raise(L);
  return 0;
}
static event_box *check_event_box(lua_State *L, int idx, const char *fn) {
  event_box *b = luaL_testudata(L, idx, EVENT_MT);
  if (!b || !b->e) lem_error(L, fn, "expected argument %d to be an ember.cuda.Event, got %s", idx, luaL_typename(L, idx));
  return b;
}
static int s_wait_event(lua_State *L) {
  const char *fn = lem_name(L);
  em_stream *s = check_stream(L, 1, fn);
  if (em_stream_wait_event(s, check_event_box(L, 2, fn)->e)) return lem_raise(L);
  return 0;
}
/* s:wait_stream(other): s waits for the work queued so far on other (no host sync). */
static int s_wait_stream(lua_State *L) {
  const char *fn = lem_name(L);
  em_stream *s = check_stream(L, 1, fn), *o = check_stream(L, 2, fn);
  em_event *e = em_event_new(false);
  if (!e) return lem_raise(L);
  int rc = em_event_record(e, o);
  if (rc == 0) rc = em_stream_wait_event(s, e);
  em_event_free(e);
  if (rc) return lem_raise(L);
  return 0;
}
static int s_eq(lua_State *L) {
  stream_box *a = luaL_testudata(L, 1, STREAM_MT), *b = luaL_testudata(L, 2, STREAM_MT);
  lua_pushboolean(L, a && b && a->s && b->s && em_stream_handle(a->s) == em_stream_handle(b->s));
  return 1;
}
static int s_tostring(lua_State *L) {
  stream_box *b = luaL_checkudata(L, 1, STREAM_MT);
  if (!b->s) lua_pushliteral(L, "ember.cuda.Stream(freed)");
  else if (!em_stream_handle(b->s)) lua_pushliteral(L, "ember.cuda.Stream(default)");
  else lua_pushfstring(L, "ember.cuda.Stream(%p)", em_stream_handle(b->s));
  return 1;
}

/* ---------------- events ---------------- */

static const char *const EVENT_KEYS[] = {"enable_timing", NULL};

static int l_event_new(lua_State *L) {
  const char *fn = lem_name(L);
  int timing = lem_field_bool(L, lem_opts(L, 1, fn, EVENT_KEYS), fn, "enable_timing", 0);
  em_event *e = em_event_new(timing);
  if (!e) return lem_raise(L);
  event_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->e = e;
  luaL_setmetatable(L, EVENT_MT);
  return 1;
}
static int e_gc(lua_State *L) {
  event_box *b = luaL_checkudata(L, 1, EVENT_MT);
  if (b->e) em_event_free(b->e);
  b->e = NULL;
  return 0;
}
static int e_record(lua_State *L) {
  const char *fn = lem_name(L);
  event_box *b = check_event_box(L, 1, fn);
  em_stream *s = lua_isnoneornil(L, 2) ? NULL : check_stream(L, 2, fn);
  if (em_event_record(b->e, s)) return lem_raise(L);
  lua_settop(L, 1);
  return 1;
}
static int e_synchronize(lua_State *L) {
  const char *fn = lem_name(L);
  if (em_event_synchronize(check_event_box(L, 1, fn)->e)) return lem_raise(L);
  return 0;
}
static int e_query(lua_State *L) {
  const char *fn = lem_name(L);
  int r = em_event_query(check_event_box(L, 1, fn)->e);
  if (r < 0) return lem_raise(L);
  lua_pushboolean(L, r);
  return 1;
}
static int e_elapsed_time(lua_State *L) {
  const char *fn = lem_name(L);
  float ms = 0;
  em_event *a = check_event_box(L, 1, fn)->e, *b = check_event_box(L, 2, fn)->e;
  if (em_event_elapsed_ms(a, b, &ms)) return lem_raise(L);
  lua_pushnumber(L, ms);
  return 1;
}

/* ---------------- graphs ---------------- */

static lua_State *capture_prev_L;

static int l_graph_begin(lua_State *L) {
  const char *fn = lem_name(L);
  capture_prev_L = callsite_L;
  callsite_L = L;                        /* the captured function runs on this Lua thread */
  if (em_graph_begin(opt_device(L, 1, fn))) { callsite_L = capture_prev_L; return lem_raise(L); }
  return 0;
}

/* core.cuda_graph_end(keep): the graph object; `keep` (the captured function)
 * stays reachable from it, so the static inputs it closes over stay alive. */
static int l_graph_end(lua_State *L) {
  callsite_L = capture_prev_L;
  em_graph *g = em_graph_end();
  if (!g) return lem_raise(L);
  graph_box *b = lua_newuserdatauv(L, sizeof *b, 1);
  b->g = g;
  luaL_setmetatable(L, GRAPH_MT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  return 1;
}

/* core.cuda_graph_abort(): end a failed capture and discard it (keeps the caller's error). */
static int l_graph_abort(lua_State *L) {
  callsite_L = capture_prev_L;
  if (!em_cuda_capturing()) return 0;
  em_graph *g = em_graph_end();
  if (g) em_graph_free(g);
  return 0;
}

static graph_box *check_graph(lua_State *L, int idx, const char *fn) {
  graph_box *b = luaL_testudata(L, idx, GRAPH_MT);
  if (!b) lem_error(L, fn, "expected an ember.cuda.Graph, got %s", luaL_typename(L, idx));
  if (!b->g) lem_error(L, fn, "this graph was closed");
  return b;
}
static int g_replay(lua_State *L) {
  if (em_graph_replay(check_graph(L, 1, lem_name(L))->g)) return lem_raise(L);
  return 0;
}
static int g_close(lua_State *L) {
  graph_box *b = luaL_checkudata(L, 1, GRAPH_MT);
  if (b->g) em_graph_free(b->g);
  b->g = NULL;
  return 0;
}

/* ---------------- registration ---------------- */

static char UNHOOK_KEY;
/* The module may be opened again in one state (busted insulates each spec
 * file, so ember.core is reloaded): each opening replaces the registry's
 * sentinel, and only the sentinel of the latest opening may unhook when it is
 * collected. */
static unsigned hook_generation = 0;
static int unhook(lua_State *L) {
  lua_State *main = NULL;
  unsigned *gen = lua_touserdata(L, 1);
  if (!gen || *gen != hook_generation) return 0;   /* an older opening's sentinel */
  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  main = lua_tothread(L, -1);
  lua_pop(L, 1);
  if (callsite_L == main) {
    callsite_L = NULL;
    em_set_callsite_fn(NULL);
    em_cuda_set_oom_callback(NULL, NULL);
  }
  return 0;
}

static void new_class(lua_State *L, const char *mt, const lem_Reg *methods, lua_CFunction gc) {
  luaL_newmetatable(L, mt);
  lua_newtable(L);
  lem_register_named(L, 0, lua_gettop(L), methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, gc);
  lua_setfield(L, -2, "__gc");
  lua_pushstring(L, mt);
  lua_setfield(L, -2, "__name");
}

void lem_open_cuda(lua_State *L, int module) {
  static const lem_Reg stream_m[] = {{"synchronize", s_synchronize, "Stream.synchronize"},
                                     {"wait_event", s_wait_event, "Stream.wait_event"},
                                     {"wait_stream", s_wait_stream, "Stream.wait_stream"}, {NULL, NULL, NULL}};
  new_class(L, STREAM_MT, stream_m, s_gc);
  lua_pushcfunction(L, s_eq); lua_setfield(L, -2, "__eq");
  lua_pushcfunction(L, s_tostring); lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  static const lem_Reg event_m[] = {{"record", e_record, "Event.record"},
                                    {"synchronize", e_synchronize, "Event.synchronize"},
                                    {"query", e_query, "Event.query"},
                                    {"elapsed_time", e_elapsed_time, "Event.elapsed_time"}, {NULL, NULL, NULL}};
  new_class(L, EVENT_MT, event_m, e_gc);
  lua_pop(L, 1);
  static const lem_Reg graph_m[] = {{"replay", g_replay, "Graph.replay"}, {"close", g_close, "Graph.close"},
                                    {NULL, NULL, NULL}};
  new_class(L, GRAPH_MT, graph_m, g_close);
  lua_pushcfunction(L, g_close); lua_setfield(L, -2, "__close");
  lua_pop(L, 1);

  lua_newtable(L);                       /* weak-valued: em_stream* -> userdata */
  lua_newtable(L);
  lua_pushliteral(L, "v");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &STREAMS_KEY);

  /* named as ember.cuda (bindings/ember/cuda.lua) shows them */
  static const lem_Reg f[] = {
    {"cuda_set_device", l_set_device, "cuda.set_device"},
    {"cuda_current_device", l_current_device, "cuda.current_device"},
    {"cuda_device_name", l_device_name, "cuda.device_name"},
    {"cuda_synchronize", l_synchronize, "cuda.synchronize"},
    {"cuda_memory_stats", l_memory_stats, "cuda.memory_stats"},
    {"cuda_reset_peak_memory_stats", l_reset_peak, "cuda.reset_peak_memory_stats"},
    {"cuda_empty_cache", l_empty_cache, "cuda.empty_cache"},
    {"cuda_Stream", l_stream_new, "cuda.Stream"},
    {"cuda_current_stream", l_current_stream, "cuda.current_stream"},
    {"cuda_set_stream", l_set_stream, "cuda.set_stream"},
    {"cuda_Event", l_event_new, "cuda.Event"},
    {"cuda_graph_begin", l_graph_begin, "cuda.graph"},
    {"cuda_graph_end", l_graph_end, "cuda.graph"},
    {"cuda_graph_abort", l_graph_abort, "cuda.graph"}, {NULL, NULL, NULL}};
  lem_register_named(L, 0, module, f);

  lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
  lua_State *main = lua_tothread(L, -1);
  lua_pop(L, 1);
  callsite_L = main;
  em_set_callsite_fn(lua_callsite);
  em_cuda_set_oom_callback(oom_collect, main);
  /* unhook when this Lua state closes */
  unsigned *gen = lua_newuserdatauv(L, sizeof *gen, 0);
  *gen = ++hook_generation;
  lua_newtable(L);
  lua_pushcfunction(L, unhook);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &UNHOOK_KEY);
}
