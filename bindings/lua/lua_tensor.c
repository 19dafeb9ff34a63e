/* Tensor userdata: identity cache, lifetime (__gc/__close), properties,
 * creation, inspection, views and conversions. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include "lua_ember.h"
#include "internal.h"   /* em_iter */

static const char CACHE_KEY = 'c';   /* registry key: weak table em_tensor* -> userdata */
static const char MT_KEY = 'm';      /* registry key: the tensor metatable, by address (no name lookup a push) */
static size_t gc_debt = 0;           /* bytes allocated since the last GC step we asked for */
static size_t gc_device_debt = 0;    /* fresh CUDA bytes since the last device-driven collection */
static size_t gc_device_threshold = (size_t)1 << 30;
static size_t gc_cpu_debt = 0;       /* fresh CPU storage bytes since the last full collection */
#define GC_CPU_THRESHOLD ((size_t)256 << 20)

/* ---------------- names and errors ---------------- */

/* Errors carry no "file:line:" prefix: the API promises messages that start
 * with the function name ("ember.add: ..."); tracebacks give the location. */
int lem_raise(lua_State *L) {
  const char *m = em_last_error();
  if (em_last_error_code() == EM_ERR_OOM || strncmp(m, "ember.", 6) == 0) lua_pushstring(L, m);
  else lua_pushfstring(L, "ember.%s", m);
  return lua_error(L);
}

int lem_error(lua_State *L, const char *fn, const char *fmt, ...) {
  char buf[1024];
  va_list ap; va_start(ap, fmt); vsnprintf(buf, sizeof buf, fmt, ap); va_end(ap);
  lua_pushfstring(L, "ember.%s: %s", fn, buf);
  return lua_error(L);
}

/* One API call, every op pays it: upvalue 1 is the name lem_push_function
 * gave (a string, never a number that lua_tostring would convert); a function
 * pushed without upvalues reads none, NULL. */
const char *lem_name(lua_State *L) {
  const char *s = lua_tostring(L, lua_upvalueindex(1));
  return s ? s : "core";   /* "core": pushed unnamed (a bug) */
}

void lem_push_function(lua_State *L, lua_CFunction func, const char *name, int nup) {
  lua_pushstring(L, name);
  lua_insert(L, -nup - 1);
  lua_pushcclosure(L, func, nup + 1);
}

static void set_function(lua_State *L, int methods, int module, const char *key, lua_CFunction func,
                         const char *name) {
  lem_push_function(L, func, name, 0);
  if (methods) { lua_pushvalue(L, -1); lua_setfield(L, methods, key); }
  if (module) lua_setfield(L, module, key); else lua_pop(L, 1);
}

void lem_register(lua_State *L, int methods, int module, const luaL_Reg *funcs) {
  for (const luaL_Reg *r = funcs; r->name; r++) set_function(L, methods, module, r->name, r->func, r->name);
}

void lem_register_named(lua_State *L, int methods, int module, const lem_Reg *funcs) {
  for (const lem_Reg *r = funcs; r->key; r++) set_function(L, methods, module, r->key, r->func, r->name);
}

/* ---------------- arguments ---------------- */

double lem_check_number(lua_State *L, int idx, const char *fn, const char *arg) {
  if (lua_type(L, idx) != LUA_TNUMBER)
    lem_error(L, fn, "expected argument %d (%s) to be a number, got %s", idx, arg, luaL_typename(L, idx));
  return lua_tonumber(L, idx);
}

double lem_opt_number(lua_State *L, int idx, const char *fn, const char *arg, double def) {
  return lua_isnoneornil(L, idx) ? def : lem_check_number(L, idx, fn, arg);
}

const char *lem_check_string(lua_State *L, int idx, const char *fn, const char *arg) {
  if (lua_type(L, idx) != LUA_TSTRING)
    lem_error(L, fn, "expected argument %d (%s) to be a string, got %s", idx, arg, luaL_typename(L, idx));
  return lua_tostring(L, idx);
}

const char *lem_opt_string(lua_State *L, int idx, const char *fn, const char *arg, const char *def) {
  return lua_isnoneornil(L, idx) ? def : lem_check_string(L, idx, fn, arg);
}

void lem_check_type(lua_State *L, int idx, const char *fn, const char *arg, int type) {
  if (lua_type(L, idx) != type)
    lem_error(L, fn, "expected argument %d (%s) to be a %s, got %s", idx, arg, lua_typename(L, type), luaL_typename(L, idx));
}

/* ---------------- push / check ---------------- */

/* The tensor metatable of the Lua state that opened this module, and that
 * state's registry, by address: every op checks its arguments, and
 * luaL_testudata looked the metatable up by name (a string lookup in the
 * registry) each time, ~300 instructions an argument. A metatable pointer
 * compare is valid while the registry is the one it was taken in; another
 * state takes the slow path, which refreshes the cache, and closing a state
 * clears it (a sentinel's __gc in the registry), so no address can be
 * reused by a later state's tables while cached. */
static const void *tensor_mt, *tensor_registry;
static const lua_State *tensor_thread;   /* the last thread (of that state) the check passed in */
static char SENTINEL_KEY;

static int clear_mt_cache(lua_State *L) { (void)L; tensor_mt = tensor_registry = NULL; tensor_thread = NULL; return 0; }

static em_tensor **test_box(lua_State *L, int idx) {
  void *p = lua_touserdata(L, idx);
  if (!p || !lua_getmetatable(L, idx)) return NULL;
  const void *mt = lua_topointer(L, -1);
  if (mt == tensor_mt && (L == tensor_thread || lua_topointer(L, LUA_REGISTRYINDEX) == tensor_registry)) {
    tensor_thread = L;   /* a thread belongs to one state: the registry compare once per thread switch */
    lua_pop(L, 1);
    return p;
  }
  luaL_getmetatable(L, EM_TENSOR_MT);
  bool is = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  if (!is) return NULL;
  tensor_mt = mt;
  tensor_registry = lua_topointer(L, LUA_REGISTRYINDEX);
  tensor_thread = L;
  return p;
}

#define NODE_GC_DEBT 1536

void lem_push_tensor(lua_State *L, em_tensor *t) {
  if (t->binding) {                       /* maybe a live userdata already */
    lua_rawgetp(L, LUA_REGISTRYINDEX, &CACHE_KEY);
    if (lua_rawgetp(L, -1, t) == LUA_TUSERDATA) {
      lua_remove(L, -2);
      em_tensor_release(t);               /* the userdata already owns a reference */
      return;
    }
    lua_pop(L, 2);
  }
  em_tensor **box = lua_newuserdatauv(L, sizeof *box, 0);
  *box = t;
  t->binding = (void *)1;
  lua_rawgetp(L, LUA_REGISTRYINDEX, &MT_KEY);
  lua_setmetatable(L, -2);
  lua_rawgetp(L, LUA_REGISTRYINDEX, &CACHE_KEY);   /* cache[t] = the userdata, left on top */
  lua_pushvalue(L, -2);
  lua_rawsetp(L, -2, t);
  lua_pop(L, 1);
  /* The GC sees only the 8-byte box: count what it cannot see (header, fresh
   * CPU storage, the autograd node the result keeps alive) as GC debt. A
   * node counts NODE_GC_DEBT, what nodes weighed before they were sized to
   * their inputs (~700 B now, ~1.3 KB with their saved headers): charging
   * their real size paced the collector slower, and the eager step paid in
   * page faults (a bench_host.lua run: 5180 against 4030) and a CPU forward
   * ~20 % slower. */
  gc_debt += sizeof(em_tensor);
  if (t->storage->refcount == 1 && t->device.type == EM_CPU) gc_debt += t->storage->nbytes + sizeof(em_storage);
  if (t->grad_fn && t->grad_fn->refcount == 1) gc_debt += NODE_GC_DEBT;
  if (gc_debt > (4u << 20)) { lua_gc(L, LUA_GCSTEP, (int)(gc_debt >> 10)); gc_debt = 0; }
  /* CPU storage needs full collections too: the steps above are young
   * collections, and activations that survive a few of them sit in the old
   * generation until a major one. A CPU training step then kept ~50 MB more
   * every step (RSS 330 MB -> 1.8 GB over 30 steps of the 4-layer model) and
   * every new activation was fresh memory to fault in instead of a block the
   * CPU allocator had cached. One full collection per GC_CPU_THRESHOLD of
   * fresh CPU storage: a few per step, 0.5-3 ms each. */
  if (t->storage->refcount == 1 && t->device.type == EM_CPU) {
    gc_cpu_debt += t->storage->nbytes;
    if (gc_cpu_debt > GC_CPU_THRESHOLD) {
      lua_gc(L, LUA_GCCOLLECT);
      gc_cpu_debt = 0;
    }
  }
  /* Device memory on a coarser scale: once the fresh CUDA bytes since the
   * last collection exceed max(1 GiB, a quarter of what the allocator has
   * reserved), run a full collection so dead activations go back to the
   * caching allocator within a step instead of lingering until an OOM retry.
   * Full, not a young step: activations outlive several young collections
   * during a forward and would sit in the old generation. A few per step even
   * at 2.7B; freeing into the cache is host bookkeeping (no device sync). */
  if (t->storage->refcount == 1 && t->device.type == EM_CUDA) {
    gc_device_debt += t->storage->nbytes;
    if (gc_device_debt > gc_device_threshold) {
      lua_gc(L, LUA_GCCOLLECT);
      gc_device_debt = 0;
      em_cuda_memory_stats st;
      if (em_cuda_memory_stats_get(t->device.index, &st) == 0) {
        size_t quarter = (size_t)(st.reserved / 4);
        gc_device_threshold = quarter > ((size_t)1 << 30) ? quarter : ((size_t)1 << 30);
      }
    }
  }
}

/* Called as a backward starts: the forward's intermediates that Lua still
 * references are mostly garbage by now, and while a handle lives, the
 * activation it points to survives autograd releasing it mid-backward — so
 * the gradients would pile up on top of every activation (at 2.7B, the
 * backward peak was 9 GiB higher than PyTorch's for exactly this). One full
 * collection costs 0.5-3 ms; run it when the fresh device memory since the
 * last collection reaches max(256 MiB, reserved/16), i.e. when what it can
 * return matters next to what the process holds.
 *
 * During a graph capture, always (EMBER_CAPTURE_GC=0: never, as before
 * 2026-11-28). The capture runs once, but what it holds at its peak is what
 * the graph's private pool keeps for good, and ember.cuda.graph stops the
 * automatic collector around it: without this collection the 2.7B capture
 * peaked 8.2 GiB above the eager step — the forward's activations all lived
 * through backward beside the new gradients. Finalizers are safe here: a
 * tensor's free is host bookkeeping (a pool block goes back to the pool's
 * list, reused by later captured allocations in stream order, as eager
 * reuses the global one; a global block is not handed out during capture),
 * and streams, events and graphs defer their destruction to the capture's
 * end (graph.cu). */
void lem_collect_before_backward(lua_State *L, const em_tensor *root) {
  static int capture_gc = -1;
  if (root->device.type != EM_CUDA) return;
  if (em_cuda_capturing()) {
    if (capture_gc < 0) capture_gc = em_env_digit("EMBER_CAPTURE_GC", 1, 1);
    if (!capture_gc) return;
  } else {
    size_t min = (size_t)256 << 20;
    em_cuda_memory_stats st;
    if (em_cuda_memory_stats_get(root->device.index, &st) == 0 && (size_t)(st.reserved / 16) > min)
      min = (size_t)(st.reserved / 16);
    if (gc_device_debt < min) return;
  }
  lua_gc(L, LUA_GCCOLLECT);
  gc_device_debt = 0;
}

int lem_push_result(lua_State *L, em_tensor *t) {
  if (!t) return lem_raise(L);
  lem_push_tensor(L, t);
  return 1;
}

int lem_push_result_at(lua_State *L, em_tensor *t, int idx, const em_tensor *arg) {
  if (!t || t != arg) return lem_push_result(L, t);
  em_tensor_release(t);   /* the userdata at idx owns a reference already */
  lua_pushvalue(L, idx);
  return 1;
}

em_tensor *lem_test_tensor(lua_State *L, int idx, const char *fn) {
  em_tensor **box = test_box(L, idx);
  if (box && !*box) {
    if (fn) lem_error(L, fn, "argument %d is a tensor that was already closed (by <close>)", idx);
    lua_pushliteral(L, "ember.Tensor: this tensor was already closed (by <close>) and cannot be used");
    lua_error(L);
  }
  return box ? *box : NULL;
}

em_tensor *lem_check_tensor(lua_State *L, int idx, const char *fn, const char *arg) {
  em_tensor **box = test_box(L, idx);
  if (!box) lem_error(L, fn, "expected argument %d (%s) to be a tensor, got %s", idx, arg, luaL_typename(L, idx));
  if (!*box) lem_error(L, fn, "argument %d (%s) is a tensor that was already closed", idx, arg);
  return *box;
}

em_tensor *lem_opt_tensor(lua_State *L, int idx, const char *fn, const char *arg) {
  return lua_isnoneornil(L, idx) ? NULL : lem_check_tensor(L, idx, fn, arg);
}

int64_t lem_check_int(lua_State *L, int idx, const char *fn, const char *arg) {
  int isnum;
  lua_Integer v = lua_tointegerx(L, idx, &isnum);
  if (!isnum) {
    if (lua_type(L, idx) == LUA_TNUMBER)
      lem_error(L, fn, "expected argument %d (%s) to be an integer, got %s", idx, arg, lua_tostring(L, idx));
    lem_error(L, fn, "expected argument %d (%s) to be an integer, got %s", idx, arg, luaL_typename(L, idx));
  }
  return (int64_t)v;
}

int64_t lem_opt_int(lua_State *L, int idx, const char *fn, const char *arg, int64_t def) {
  return lua_isnoneornil(L, idx) ? def : lem_check_int(L, idx, fn, arg);
}

int lem_check_shape(lua_State *L, int idx, const char *fn, int64_t *shape, int *next) {
  int n = 0;
  if (lua_istable(L, idx)) {
    n = (int)luaL_len(L, idx);
    if (n > EM_MAX_DIMS) lem_error(L, fn, "expected at most %d dims, got %d", EM_MAX_DIMS, n);
    for (int i = 0; i < n; i++) {
      lua_geti(L, idx, i + 1);
      int isnum; lua_Integer v = lua_tointegerx(L, -1, &isnum);
      if (!isnum) lem_error(L, fn, "expected the shape to hold integers, got %s at position %d",
                            luaL_typename(L, -1), i + 1);
      shape[i] = v; lua_pop(L, 1);
    }
    *next = idx + 1;
    return n;
  }
  while (lua_type(L, idx + n) == LUA_TNUMBER) {
    if (n >= EM_MAX_DIMS) lem_error(L, fn, "expected at most %d dims", EM_MAX_DIMS);
    shape[n] = lem_check_int(L, idx + n, fn, "size");
    n++;
  }
  *next = idx + n;
  return n;
}

/* Creation functions: sizes must be >= 0 (views accept -1 and check themselves). */
static void check_sizes(lua_State *L, const char *fn, int ndim, const int64_t *shape) {
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0) lem_error(L, fn, "negative size %lld in dim %d (expected sizes >= 0)", (long long)shape[i], i);
}

int lem_check_tensor_list(lua_State *L, int idx, const char *fn, em_tensor ***out) {
  if (!lua_istable(L, idx))
    lem_error(L, fn, "expected argument %d to be a table (a list of tensors), got %s", idx, luaL_typename(L, idx));
  int n = (int)luaL_len(L, idx);
  em_tensor **ts = malloc(sizeof *ts * (size_t)(n > 0 ? n : 1));
  for (int i = 0; i < n; i++) {
    lua_geti(L, idx, i + 1);
    ts[i] = lem_test_tensor(L, -1, NULL);
    lua_pop(L, 1);   /* the table keeps it alive */
    if (!ts[i]) { free(ts); lem_error(L, fn, "expected a list of tensors, element %d is not a tensor", i + 1); }
  }
  *out = ts;
  return n;
}

/* ---------------- options ---------------- */

int lem_opts(lua_State *L, int idx, const char *fn, const char *const *keys) {
  if (idx == 0 || !lua_istable(L, idx)) return 0;
  if (!keys) return idx;
  for (lua_pushnil(L); lua_next(L, idx); lua_pop(L, 1)) {
    int known = 0;
    if (lua_type(L, -2) == LUA_TSTRING)
      for (const char *const *k = keys; *k && !known; k++) known = strcmp(lua_tostring(L, -2), *k) == 0;
    if (known) continue;
    char expected[256] = "";
    for (const char *const *k = keys; *k; k++)
      snprintf(expected + strlen(expected), sizeof expected - strlen(expected), "%s%s", k == keys ? "" : ", ", *k);
    lem_error(L, fn, "unknown option '%s' (expected %s)", luaL_tolstring(L, -2, NULL), expected);
  }
  return idx;
}

int lem_field(lua_State *L, int opts, const char *fn, const char *key, int type) {
  if (opts == 0 || !lua_istable(L, opts)) return 0;
  if (lua_getfield(L, opts, key) == LUA_TNIL) { lua_pop(L, 1); return 0; }
  if (type != LUA_TNONE && lua_type(L, -1) != type)
    lem_error(L, fn, "expected option '%s' to be a %s, got %s", key, lua_typename(L, type), luaL_typename(L, -1));
  return 1;
}

int lem_field_bool(lua_State *L, int opts, const char *fn, const char *key, int def) {
  if (!lem_field(L, opts, fn, key, LUA_TNONE)) return def;
  int v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

double lem_field_number(lua_State *L, int opts, const char *fn, const char *key, double def) {
  if (!lem_field(L, opts, fn, key, LUA_TNUMBER)) return def;
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

em_tensor *lem_field_tensor(lua_State *L, int opts, const char *fn, const char *key) {
  if (!lem_field(L, opts, fn, key, LUA_TNONE)) return NULL;
  em_tensor *t = lem_test_tensor(L, -1, NULL);
  if (!t) lem_error(L, fn, "expected option '%s' to be a tensor, got %s", key, luaL_typename(L, -1));
  lua_pop(L, 1);    /* the options table keeps it alive */
  return t;
}

em_dtype lem_field_dtype(lua_State *L, int opts, const char *fn, const char *key, em_dtype def) {
  if (!lem_field(L, opts, fn, key, LUA_TNONE)) return def;
  const char *s = lua_tostring(L, -1);
  em_dtype dt;
  if (!s || em_dtype_from_name(s, &dt))
    lem_error(L, fn, "expected %s to be one of f32, f64, bf16, f16, i32, i64, u16, u8, bool; got %s", key,
              s ? s : luaL_typename(L, -1));
  lua_pop(L, 1);
  return dt;
}

em_device lem_field_device(lua_State *L, int opts, const char *fn, const char *key, em_device def) {
  if (!lem_field(L, opts, fn, key, LUA_TNONE)) return def;
  const char *s = lua_tostring(L, -1);
  em_device d;
  if (!s || em_device_parse(s, &d))
    lem_error(L, fn, "expected %s \"cpu\", \"cuda\" or \"cuda:N\", got %s", key, s ? s : luaL_typename(L, -1));
  if (d.type == EM_CUDA) {
    if (!em_cuda_compiled()) lem_error(L, fn, "%s %s requested, but this build of Ember has no CUDA backend "
                                       "(rebuild with -DEMBER_CUDA=ON)", key, s);
    int count = em_cuda_device_count();
    if (count == 0) lem_error(L, fn, "%s %s requested, but no CUDA device is available", key, s);
    if (d.index >= count)
      lem_error(L, fn, "%s %s requested, but only %d CUDA device(s) are available (cuda:0..cuda:%d)", key, s,
                count, count - 1);
  }
  lua_pop(L, 1);
  return d;
}

/* ---------------- lifetime ---------------- */

static int t_gc(lua_State *L) {
  em_tensor **box = test_box(L, 1);   /* the cached metatable compare: luaL_checkudata looks it up by name */
  if (!box) box = luaL_checkudata(L, 1, EM_TENSOR_MT);
  if (*box) {
    (*box)->binding = NULL;
    em_tensor_release(*box);
    *box = NULL;
  }
  return 0;
}

/* `local t <close> = ...` releases the tensor now; later use is an error. */
static int t_close(lua_State *L) {
  em_tensor **box = luaL_checkudata(L, 1, EM_TENSOR_MT);
  if (*box) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, &CACHE_KEY);
    lua_pushnil(L);
    lua_rawsetp(L, -2, *box);
    lua_pop(L, 1);
    /* Storage freed here is not garbage waiting for a collection: take it
     * off the debts that trigger the full collections above, or a loop that
     * closes every large result (bench_ops) still ran one every other call,
     * inside the timed op (0.2+ ms). */
    em_tensor *t = *box;
    if (t->refcount == 1 && t->storage && t->storage->refcount == 1) {
      size_t *debt = t->device.type == EM_CUDA ? &gc_device_debt : &gc_cpu_debt, nb = t->storage->nbytes;
      *debt -= *debt < nb ? *debt : nb;
    }
    t->binding = NULL;
    em_tensor_release(t);
    *box = NULL;
  }
  return 0;
}

/* ---------------- creation ---------------- */

/* Walk nested tables to find the shape of ember.tensor's data. */
static void data_shape(lua_State *L, int idx, const char *fn, int depth, int *ndim, int64_t *shape, int *has_bool) {
  if (lua_type(L, idx) == LUA_TBOOLEAN) { *has_bool = 1; *ndim = depth; return; }
  if (lua_type(L, idx) != LUA_TTABLE) { *ndim = depth; return; }
  if (depth >= EM_MAX_DIMS) lem_error(L, fn, "data is nested more than %d deep", EM_MAX_DIMS);
  int64_t n = (int64_t)luaL_len(L, idx);
  shape[depth] = n;
  if (n == 0) { *ndim = depth + 1; return; }
  lua_geti(L, idx, 1);
  data_shape(L, lua_gettop(L), fn, depth + 1, ndim, shape, has_bool);
  lua_pop(L, 1);
}

static void fill_data(lua_State *L, int idx, const char *fn, int depth, int ndim, const int64_t *shape, em_tensor *t,
                      int64_t *pos) {
  if (depth == ndim) {
    int tp = lua_type(L, idx);
    if (tp == LUA_TNUMBER) {
      if (lua_isinteger(L, idx) && !em_dtype_is_float(t->dtype))
        em_store_i64(t->storage->data, t->dtype, (*pos)++, (int64_t)lua_tointeger(L, idx));
      else em_store_f64(t->storage->data, t->dtype, (*pos)++, lua_tonumber(L, idx));
    } else if (tp == LUA_TBOOLEAN) {
      em_store_f64(t->storage->data, t->dtype, (*pos)++, lua_toboolean(L, idx));
    } else {
      lem_error(L, fn, "expected numbers or booleans in the data, got %s", luaL_typename(L, idx));
    }
    return;
  }
  if (lua_type(L, idx) != LUA_TTABLE || (int64_t)luaL_len(L, idx) != shape[depth])
    lem_error(L, fn, "ragged nested data: expected a list of length %lld at depth %d",
              (long long)shape[depth], depth + 1);
  for (int64_t i = 1; i <= shape[depth]; i++) {
    lua_geti(L, idx, i);
    fill_data(L, lua_gettop(L), fn, depth + 1, ndim, shape, t, pos);
    lua_pop(L, 1);
  }
}

/* The options of creation functions; *_like take no device (they keep the input's). */
static const char *const NEW_KEYS[] = {"device", "dtype", "requires_grad", NULL};
static const char *const LIKE_KEYS[] = {"dtype", "requires_grad", NULL};

/* Wrap a new tensor with device/requires_grad options applied. */
static int finish_new(lua_State *L, em_tensor *t, int opts, const char *fn) {
  if (!t) return lem_raise(L);
  em_device dev = lem_field_device(L, opts, fn, "device", em_cpu());
  if (dev.type != t->device.type || dev.index != t->device.index) {
    em_tensor *d = em_to(t, t->dtype, dev);
    em_tensor_release(t);
    if (!d) return lem_raise(L);
    t = d;
  }
  if (lem_field_bool(L, opts, fn, "requires_grad", 0) && em_set_requires_grad(t, true)) {
    em_tensor_release(t);
    return lem_raise(L);
  }
  lem_push_tensor(L, t);
  return 1;
}

static int l_tensor(lua_State *L) {
  const char *fn = lem_name(L);
  int opts = lem_opts(L, 2, fn, NEW_KEYS);
  int64_t shape[EM_MAX_DIMS]; int ndim = 0, has_bool = 0;
  em_tensor *src = lem_test_tensor(L, 1, NULL);
  if (src) {   /* ember.tensor(t): a copy without history */
    em_dtype dt = lem_field_dtype(L, opts, fn, "dtype", src->dtype);
    em_tensor *d = em_detach(src);
    em_tensor *c = em_to(d, dt, src->device);
    if (c == d) { em_tensor_release(c); c = em_clone(d); }
    em_tensor_release(d);
    return finish_new(L, c, opts, fn);
  }
  int tp = lua_type(L, 1);
  if (tp != LUA_TTABLE && tp != LUA_TNUMBER && tp != LUA_TBOOLEAN)
    return lem_error(L, fn, "expected data to be a number, boolean or nested table, got %s", luaL_typename(L, 1));
  data_shape(L, 1, fn, 0, &ndim, shape, &has_bool);
  em_dtype dt = lem_field_dtype(L, opts, fn, "dtype", has_bool ? EM_BOOL : EM_F32);
  em_tensor *t = em_empty(ndim, shape, dt, em_cpu());
  if (!t) return lem_raise(L);
  int64_t pos = 0;
  lem_push_tensor(L, t);   /* anchor it so an error in fill_data does not leak */
  fill_data(L, 1, fn, 0, ndim, shape, t, &pos);
  em_tensor_retain(t);
  lua_pop(L, 1);
  return finish_new(L, t, opts, fn);
}

typedef enum { K_EMPTY, K_ZEROS, K_ONES, K_RAND, K_RANDN } new_kind;

static int new_filled(lua_State *L, new_kind kind) {
  const char *fn = lem_name(L);
  int64_t shape[EM_MAX_DIMS]; int next;
  int ndim = lem_check_shape(L, 1, fn, shape, &next);
  check_sizes(L, fn, ndim, shape);
  int opts = lem_opts(L, next, fn, NEW_KEYS);
  if (!opts && !lua_isnone(L, next)) lem_error(L, fn, "expected sizes then an options table, got %s at argument %d",
                                               luaL_typename(L, next), next);
  em_dtype dt = lem_field_dtype(L, opts, fn, "dtype", EM_F32);
  em_device dev = lem_field_device(L, opts, fn, "device", em_cpu());
  em_tensor *t = NULL;
  switch (kind) {
    case K_EMPTY: t = em_empty(ndim, shape, dt, dev); break;
    case K_ZEROS: t = em_zeros(ndim, shape, dt, dev); break;
    case K_ONES: t = em_full(ndim, shape, 1, dt, dev); break;
    case K_RAND: t = em_rand(ndim, shape, dt, dev); break;
    case K_RANDN: t = em_randn(ndim, shape, dt, dev); break;
  }
  return finish_new(L, t, opts, fn);
}
static int l_empty(lua_State *L) { return new_filled(L, K_EMPTY); }
static int l_zeros(lua_State *L) { return new_filled(L, K_ZEROS); }
static int l_ones(lua_State *L) { return new_filled(L, K_ONES); }
static int l_rand(lua_State *L) { return new_filled(L, K_RAND); }
static int l_randn(lua_State *L) { return new_filled(L, K_RANDN); }

static int l_full(lua_State *L) {
  const char *fn = lem_name(L);
  int64_t shape[EM_MAX_DIMS]; int next;
  int ndim = lem_check_shape(L, 1, fn, shape, &next);
  check_sizes(L, fn, ndim, shape);
  if (lua_type(L, next) != LUA_TNUMBER && lua_type(L, next) != LUA_TBOOLEAN)
    return lem_error(L, fn, "expected a fill value (number) after the shape, got %s", luaL_typename(L, next));
  double v = lua_isboolean(L, next) ? lua_toboolean(L, next) : lua_tonumber(L, next);
  int opts = lem_opts(L, next + 1, fn, NEW_KEYS);
  em_dtype dt = lem_field_dtype(L, opts, fn, "dtype", lua_isboolean(L, next) ? EM_BOOL : EM_F32);
  em_device dev = lem_field_device(L, opts, fn, "device", em_cpu());
  return finish_new(L, em_full(ndim, shape, v, dt, dev), opts, fn);
}

static int like(lua_State *L, new_kind kind) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "input");
  int opts = lem_opts(L, 2, fn, LIKE_KEYS);
  em_dtype dt = lem_field_dtype(L, opts, fn, "dtype", t->dtype);
  em_tensor *r = NULL;
  switch (kind) {
    case K_ZEROS: r = em_zeros(t->ndim, t->shape, dt, t->device); break;
    case K_ONES: r = em_full(t->ndim, t->shape, 1, dt, t->device); break;
    case K_RAND: r = em_rand(t->ndim, t->shape, dt, t->device); break;
    case K_RANDN: r = em_randn(t->ndim, t->shape, dt, t->device); break;
    default: r = em_empty(t->ndim, t->shape, dt, t->device); break;
  }
  if (!r) return lem_raise(L);
  if (lem_field_bool(L, opts, fn, "requires_grad", 0) && em_set_requires_grad(r, true)) {
    em_tensor_release(r);
    return lem_raise(L);
  }
  return lem_push_result(L, r);
}
static int l_zeros_like(lua_State *L) { return like(L, K_ZEROS); }
static int l_ones_like(lua_State *L) { return like(L, K_ONES); }
static int l_empty_like(lua_State *L) { return like(L, K_EMPTY); }
static int l_rand_like(lua_State *L) { return like(L, K_RAND); }
static int l_randn_like(lua_State *L) { return like(L, K_RANDN); }

static int l_arange(lua_State *L) {
  const char *fn = lem_name(L);
  int nargs = 0;
  while (nargs < 3 && lua_type(L, nargs + 1) == LUA_TNUMBER) nargs++;
  if (nargs == 0)
    return lem_error(L, fn, "expected arange(end), arange(start, end) or arange(start, end, step), got %s",
                     luaL_typename(L, 1));
  int opts = lem_opts(L, nargs + 1, fn, NEW_KEYS);
  double start = 0, end, step = 1;
  int all_int = 1;
  for (int i = 1; i <= nargs; i++) all_int &= lua_isinteger(L, i);
  if (nargs == 1) end = lua_tonumber(L, 1);
  else { start = lua_tonumber(L, 1); end = lua_tonumber(L, 2); if (nargs == 3) step = lua_tonumber(L, 3); }
  em_dtype dt = lem_field_dtype(L, opts, fn, "dtype", all_int ? EM_I64 : EM_F32);
  em_device dev = lem_field_device(L, opts, fn, "device", em_cpu());
  return finish_new(L, em_arange(start, end, step, dt, dev), opts, fn);
}

static int l_linspace(lua_State *L) {
  const char *fn = lem_name(L);
  double a = lem_check_number(L, 1, fn, "start"), b = lem_check_number(L, 2, fn, "end");
  int64_t n = lem_check_int(L, 3, fn, "steps");
  int opts = lem_opts(L, 4, fn, NEW_KEYS);
  em_dtype dt = lem_field_dtype(L, opts, fn, "dtype", EM_F32);
  em_device dev = lem_field_device(L, opts, fn, "device", em_cpu());
  return finish_new(L, em_linspace(a, b, n, dt, dev), opts, fn);
}

static int l_eye(lua_State *L) {
  const char *fn = lem_name(L);
  int64_t n = lem_check_int(L, 1, fn, "n");
  int64_t m = lua_type(L, 2) == LUA_TNUMBER ? lem_check_int(L, 2, fn, "m") : n;
  int opts = lem_opts(L, lua_istable(L, 2) ? 2 : 3, fn, NEW_KEYS);
  if (n < 0 || m < 0) return lem_error(L, fn, "expected non-negative sizes, got %lld x %lld", (long long)n, (long long)m);
  em_dtype dt = lem_field_dtype(L, opts, fn, "dtype", EM_F32);
  em_device dev = lem_field_device(L, opts, fn, "device", em_cpu());
  return finish_new(L, em_eye(n, m, dt, dev), opts, fn);
}

static int l_randint(lua_State *L) {
  const char *fn = lem_name(L);
  int64_t lo = lem_check_int(L, 1, fn, "low"), hi = lem_check_int(L, 2, fn, "high");
  int64_t shape[EM_MAX_DIMS]; int next;
  int ndim = lem_check_shape(L, 3, fn, shape, &next);
  check_sizes(L, fn, ndim, shape);
  int opts = lem_opts(L, next, fn, NEW_KEYS);
  if (hi <= lo) return lem_error(L, fn, "expected low < high, got low=%lld high=%lld", (long long)lo, (long long)hi);
  em_dtype dt = lem_field_dtype(L, opts, fn, "dtype", EM_I64);
  em_device dev = lem_field_device(L, opts, fn, "device", em_cpu());
  return finish_new(L, em_randint(lo, hi, ndim, shape, dt, dev), opts, fn);
}

/* ---------------- properties ---------------- */

/* t.shape is a plain 1-based Lua table with a small metatable, like
 * torch.Size: it prints as ember.Size({2, 3}) and compares with ==. */
#define EM_SIZE_MT "ember.Size"

static int size_tostring(lua_State *L) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, "ember.Size({");
  lua_Integer n = luaL_len(L, 1);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_geti(L, 1, i);
    if (i > 1) luaL_addstring(&b, ", ");
    luaL_addvalue(&b);
  }
  luaL_addstring(&b, "})");
  luaL_pushresult(&b);
  return 1;
}

static int size_eq(lua_State *L) {
  lua_Integer n = luaL_len(L, 1);
  if (luaL_len(L, 2) != n) { lua_pushboolean(L, 0); return 1; }
  for (lua_Integer i = 1; i <= n; i++) {
    lua_geti(L, 1, i); lua_geti(L, 2, i);
    int same = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    if (!same) { lua_pushboolean(L, 0); return 1; }
  }
  lua_pushboolean(L, 1);
  return 1;
}

static void push_shape(lua_State *L, int ndim, const int64_t *s) {
  lua_createtable(L, ndim, 0);
  for (int i = 0; i < ndim; i++) { lua_pushinteger(L, s[i]); lua_rawseti(L, -2, i + 1); }
  luaL_setmetatable(L, EM_SIZE_MT);
}

static void push_ints(lua_State *L, int n, const int64_t *v) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) { lua_pushinteger(L, v[i]); lua_rawseti(L, -2, i + 1); }
}

static int t_index(lua_State *L) {
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(2)) != LUA_TNIL) return 1;   /* methods first */
  lua_pop(L, 1);
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  if (lua_type(L, 2) != LUA_TSTRING) {
    if (lua_type(L, 2) == LUA_TNUMBER)
      return lem_error(L, fn, "indexing with t[i] is not supported; use t:select(0, i) (0-based) or t:narrow");
    return lem_error(L, fn, "invalid key of type %s", luaL_typename(L, 2));
  }
  const char *k = lua_tostring(L, 2);
  char buf[32];
  if (!strcmp(k, "shape")) { push_shape(L, t->ndim, t->shape); return 1; }
  if (!strcmp(k, "dtype")) { lua_pushstring(L, em_dtype_name(t->dtype)); return 1; }
  if (!strcmp(k, "device")) { lua_pushstring(L, em_device_str(t->device, buf, sizeof buf)); return 1; }
  if (!strcmp(k, "requires_grad")) { lua_pushboolean(L, t->requires_grad); return 1; }
  if (!strcmp(k, "is_leaf")) { lua_pushboolean(L, t->grad_fn == NULL); return 1; }
  if (!strcmp(k, "grad")) {
    if (!t->grad) { lua_pushnil(L); return 1; }
    lem_push_tensor(L, em_tensor_retain(t->grad));
    return 1;
  }
  if (!strcmp(k, "grad_fn")) {
    if (t->grad_fn) lua_pushstring(L, t->grad_fn->op); else lua_pushnil(L);
    return 1;
  }
  if (!strcmp(k, "ndim")) { lua_pushinteger(L, t->ndim); return 1; }
  if (!strcmp(k, "is_cuda")) { lua_pushboolean(L, t->device.type == EM_CUDA); return 1; }
  return lem_error(L, fn, "no field or method '%s'", k);
}

static int t_newindex(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  const char *k = lem_check_string(L, 2, fn, "key");
  if (!strcmp(k, "requires_grad")) {
    if (em_set_requires_grad(t, lua_toboolean(L, 3))) return lem_raise(L);
    return 0;
  }
  if (!strcmp(k, "grad")) {
    em_tensor *g = lem_opt_tensor(L, 3, "Tensor.grad", "value");   /* the field set names this error */
    if (em_set_grad(t, g)) return lem_raise(L);
    return 0;
  }
  return lem_error(L, fn, "cannot set field '%s' (settable: requires_grad, grad)", k);
}

/* ---------------- inspection ---------------- */

static int t_size(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  if (lua_isnoneornil(L, 2)) { push_shape(L, t->ndim, t->shape); return 1; }
  int d;
  if (em_wrap_dim(fn, lem_check_int(L, 2, fn, "dim"), t->ndim, &d)) return lem_raise(L);
  lua_pushinteger(L, t->ndim ? t->shape[d] : 1);
  return 1;
}
static int t_stride(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  if (lua_isnoneornil(L, 2)) { push_ints(L, t->ndim, t->stride); return 1; }
  int d;
  if (em_wrap_dim(fn, lem_check_int(L, 2, fn, "dim"), t->ndim, &d)) return lem_raise(L);
  lua_pushinteger(L, t->ndim ? t->stride[d] : 1);
  return 1;
}
static int t_dim(lua_State *L) { lua_pushinteger(L, lem_check_tensor(L, 1, lem_name(L), "self")->ndim); return 1; }
static int t_numel(lua_State *L) { lua_pushinteger(L, em_numel(lem_check_tensor(L, 1, lem_name(L), "self"))); return 1; }
static int t_len(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  if (t->ndim == 0) return lem_error(L, fn, "a 0-dim tensor has no length");
  lua_pushinteger(L, t->shape[0]);
  return 1;
}
static int t_is_contiguous(lua_State *L) { lua_pushboolean(L, em_is_contiguous(lem_check_tensor(L, 1, lem_name(L), "self"))); return 1; }
static int t_data_ptr(lua_State *L) {
  const char *fn = lem_name(L);
  lua_pushinteger(L, (lua_Integer)(intptr_t)em_data_ptr(lem_check_tensor(L, 1, fn, "self")));
  return 1;
}
static int t_element_size(lua_State *L) {
  const char *fn = lem_name(L);
  lua_pushinteger(L, (lua_Integer)em_dtype_size(lem_check_tensor(L, 1, fn, "self")->dtype));
  return 1;
}
static int t_storage_offset(lua_State *L) { lua_pushinteger(L, lem_check_tensor(L, 1, lem_name(L), "self")->offset); return 1; }
static int t_version(lua_State *L) { lua_pushinteger(L, lem_check_tensor(L, 1, lem_name(L), "self")->storage->version); return 1; }

static void push_elem(lua_State *L, const em_tensor *host, int64_t off) {
  const void *p = host->storage->data;
  if (host->dtype == EM_BOOL) lua_pushboolean(L, ((const uint8_t *)p)[off] != 0);
  else if (em_dtype_is_float(host->dtype)) lua_pushnumber(L, em_load_f64(p, host->dtype, off));
  else lua_pushinteger(L, em_load_i64(p, host->dtype, off));
}

/* A CPU copy of t without history (t itself when already on the CPU). */
static em_tensor *host_copy(lua_State *L, em_tensor *t, const char *fn) {
  if (t->device.type == EM_CPU) return em_tensor_retain(t);
  if (em_cuda_check_not_capturing(fn)) lem_raise(L);   /* reading it waits for the device */
  em_tensor *d = em_detach(t);
  em_tensor *h = em_to(d, t->dtype, em_cpu());
  em_tensor_release(d);
  if (!h) lem_raise(L);
  return h;
}

static int t_item(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  if (em_numel(t) != 1) {
    char b[160];
    return lem_error(L, fn, "expected a tensor with one element, got shape %s", em_shape_str(t->ndim, t->shape, b, 160));
  }
  em_tensor *h = host_copy(L, t, fn);
  push_elem(L, h, h->offset);
  em_tensor_release(h);
  return 1;
}

static void tolist_rec(lua_State *L, const em_tensor *h, int d, int64_t off) {
  if (d == h->ndim) { push_elem(L, h, off); return; }
  lua_createtable(L, (int)h->shape[d], 0);
  for (int64_t i = 0; i < h->shape[d]; i++) {
    tolist_rec(L, h, d + 1, off + i * h->stride[d]);
    lua_rawseti(L, -2, i + 1);
  }
}

static int t_tolist(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *h = host_copy(L, lem_check_tensor(L, 1, fn, "self"), fn);
  tolist_rec(L, h, 0, h->offset);
  em_tensor_release(h);
  return 1;
}

/* Flat list of values (row-major), for printing. */
static int t_flat_values(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *h = host_copy(L, lem_check_tensor(L, 1, fn, "self"), fn);
  int64_t n = em_numel(h);
  lua_createtable(L, (int)n, 0);
  em_iter it;
  em_iter_init(&it, h->ndim, h->shape, 1, (const em_tensor *[]){h});
  for (int64_t i = 0; i < n; i++) {
    push_elem(L, h, it.off[0]);
    lua_rawseti(L, -2, i + 1);
    em_iter_next(&it);
  }
  em_tensor_release(h);
  return 1;
}

/* ---------------- views ---------------- */

static int t_view_like(lua_State *L, int reshape) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  int64_t shape[EM_MAX_DIMS]; int next;
  int nd = lem_check_shape(L, 2, fn, shape, &next);
  if (!lua_isnone(L, next)) return lem_error(L, fn, "expected integer sizes or one table of sizes, got %s at argument %d", luaL_typename(L, next), next);
  return lem_push_result(L, reshape ? em_reshape(t, nd, shape) : em_view(t, nd, shape));
}
static int t_view(lua_State *L) { return t_view_like(L, 0); }
static int t_reshape(lua_State *L) { return t_view_like(L, 1); }

static int t_expand(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  int64_t shape[EM_MAX_DIMS]; int next;
  int nd = lem_check_shape(L, 2, fn, shape, &next);
  return lem_push_result(L, em_expand(t, nd, shape));
}

static int t_permute(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  int64_t p[EM_MAX_DIMS]; int next;
  int nd = lem_check_shape(L, 2, fn, p, &next);
  return lem_push_result(L, em_permute(t, nd, p));
}

static int t_transpose(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  int64_t a = lem_check_int(L, 2, fn, "dim0"), b = lem_check_int(L, 3, fn, "dim1");
  return lem_push_result(L, em_transpose(t, a, b));
}
static int t_T(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  if (t->ndim > 2) return lem_error(L, fn, "expected a tensor with at most 2 dims, got %d (use transpose)", t->ndim);
  if (t->ndim < 2) return lem_push_result(L, em_alias(t));
  return lem_push_result(L, em_transpose(t, 0, 1));
}

static int t_narrow(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  return lem_push_result(L, em_narrow(t, lem_check_int(L, 2, fn, "dim"), lem_check_int(L, 3, fn, "start"),
                                      lem_check_int(L, 4, fn, "length")));
}
static int t_select(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  return lem_push_result(L, em_select(t, lem_check_int(L, 2, fn, "dim"), lem_check_int(L, 3, fn, "index")));
}
static int t_squeeze(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  int64_t d = lem_opt_int(L, 2, fn, "dim", EM_ALL_DIMS);
  return lem_push_result(L, em_squeeze(t, d));
}
static int t_unsqueeze(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  return lem_push_result(L, em_unsqueeze(t, lem_check_int(L, 2, fn, "dim")));
}
static int t_flatten(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  int64_t s = lem_opt_int(L, 2, fn, "start_dim", 0);
  int64_t e = lem_opt_int(L, 3, fn, "end_dim", -1);
  return lem_push_result(L, em_flatten(t, s, e));
}
static int t_contiguous(lua_State *L) { return lem_push_result(L, em_contiguous(lem_check_tensor(L, 1, lem_name(L), "self"))); }
static int t_clone(lua_State *L) { return lem_push_result(L, em_clone(lem_check_tensor(L, 1, lem_name(L), "self"))); }
static int t_detach(lua_State *L) { return lem_push_result(L, em_detach(lem_check_tensor(L, 1, lem_name(L), "self"))); }

/* t:copy_(src[, {non_blocking = true}]): with non_blocking and a pinned host
 * side, a host<->device copy does not wait for the device (as t:to's option):
 * a data loader fills a static device batch without a host sync per step. */
static const char *const COPY_KEYS[] = {"non_blocking", NULL};

static int t_copy_(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  em_tensor *s = lem_check_tensor(L, 2, fn, "src");
  int nb = lem_field_bool(L, lem_opts(L, 3, fn, COPY_KEYS), fn, "non_blocking", 0);
  if (nb && !(em_grad_enabled() && (s->requires_grad || t->requires_grad))) {
    if (em_copy_nonblocking_(t, s)) return lem_raise(L);
  } else if (em_copy_(t, s)) return lem_raise(L);
  lua_settop(L, 1);
  return 1;
}
static int t_fill_(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  double v = lua_isboolean(L, 2) ? lua_toboolean(L, 2) : lem_check_number(L, 2, fn, "value");
  if (em_fill_(t, v)) return lem_raise(L);
  lua_settop(L, 1);
  return 1;
}
static int t_zero_(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  if (em_fill_(t, 0)) return lem_raise(L);
  lua_settop(L, 1);
  return 1;
}
static int t_set_(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  if (em_set_(t, lem_check_tensor(L, 2, fn, "source"))) return lem_raise(L);
  lua_settop(L, 1);
  return 1;
}

/* t:to("cuda") / t:to("bf16") / t:to({device=, dtype=}) / t:to(other_tensor);
 * {non_blocking=true}: with a pinned host side the copy does not wait for the
 * device (synchronize before reading the result), as in PyTorch. */
static const char *const TO_KEYS[] = {"device", "dtype", "non_blocking", NULL};

static int t_to(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  em_dtype dt = t->dtype; em_device dev = t->device;
  int non_blocking = 0;
  for (int i = 2; i <= lua_gettop(L); i++) {
    em_tensor *o = lem_test_tensor(L, i, fn);
    if (o) { dt = o->dtype; dev = o->device; continue; }
    if (lua_type(L, i) == LUA_TSTRING) {
      const char *s = lua_tostring(L, i);
      if (em_dtype_from_name(s, &dt) == 0) continue;
      if (em_device_parse(s, &dev) == 0) continue;
      return lem_error(L, fn, "expected a dtype (f32, bf16, ...) or a device (cpu, cuda, cuda:N), got \"%s\"", s);
    }
    int opts = lem_opts(L, i, fn, TO_KEYS);
    if (opts) {
      non_blocking |= lem_field_bool(L, opts, fn, "non_blocking", 0);
      dt = lem_field_dtype(L, opts, fn, "dtype", dt);
      dev = lem_field_device(L, opts, fn, "device", dev);
      continue;
    }
    if (lua_isnil(L, i)) continue;
    return lem_error(L, fn, "expected a dtype, a device, a tensor or an options table, got %s", luaL_typename(L, i));
  }
  bool changes = dt != t->dtype || !em_device_eq(dev, t->device);
  if (non_blocking && changes && em_cuda_available() && !(em_grad_enabled() && t->requires_grad)) {
    em_tensor *out = em_empty(t->ndim, t->shape, dt, dev);
    if (!out) return lem_raise(L);
    if (em_copy_nonblocking_(out, t)) { em_tensor_release(out); return lem_raise(L); }
    lem_push_tensor(L, out);
    return 1;
  }
  return lem_push_result(L, em_to(t, dt, dev));
}

/* t:pin_memory(): a page-locked CPU copy (fast, asynchronous transfers); t:is_pinned(). */
static int t_pin_memory(lua_State *L) {
  const char *fn = lem_name(L);
  return lem_push_result(L, em_pin_memory(lem_check_tensor(L, 1, fn, "self")));
}
static int t_is_pinned(lua_State *L) {
  const char *fn = lem_name(L);
  lua_pushboolean(L, em_is_pinned(lem_check_tensor(L, 1, fn, "self")));
  return 1;
}

static int to_dtype(lua_State *L, em_dtype dt) {
  em_tensor *t = lem_check_tensor(L, 1, lem_name(L), "self");
  return lem_push_result(L, em_to(t, dt, t->device));
}
static int t_float(lua_State *L) { return to_dtype(L, EM_F32); }
static int t_double(lua_State *L) { return to_dtype(L, EM_F64); }
static int t_half(lua_State *L) { return to_dtype(L, EM_F16); }
static int t_bfloat16(lua_State *L) { return to_dtype(L, EM_BF16); }
static int t_long(lua_State *L) { return to_dtype(L, EM_I64); }
static int t_int(lua_State *L) { return to_dtype(L, EM_I32); }
static int t_bool(lua_State *L) { return to_dtype(L, EM_BOOL); }
static int t_cpu(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  return lem_push_result(L, em_to(t, t->dtype, em_cpu()));
}
static int t_cuda(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  em_device d = {EM_CUDA, (int)lem_opt_int(L, 2, fn, "device", 0)};
  return lem_push_result(L, em_to(t, t->dtype, d));
}

static int l_is_tensor(lua_State *L) { lua_pushboolean(L, lem_test_tensor(L, 1, NULL) != NULL); return 1; }

void lem_open_tensor(lua_State *L, int methods, int module) {
  /* weak-valued identity cache */
  lua_newtable(L);
  lua_newtable(L);
  lua_pushstring(L, "v");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &CACHE_KEY);

  luaL_newmetatable(L, EM_SIZE_MT);
  lua_pushcfunction(L, size_tostring); lua_setfield(L, -2, "__tostring");
  lua_pushcfunction(L, size_eq); lua_setfield(L, -2, "__eq");
  lua_pop(L, 1);

  lua_newuserdatauv(L, 1, 0);                       /* closing the state clears test_box's cache */
  lua_newtable(L);
  lua_pushcfunction(L, clear_mt_cache); lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &SENTINEL_KEY);

  luaL_newmetatable(L, EM_TENSOR_MT);
  int mt = lua_gettop(L);
  lua_pushvalue(L, mt);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &MT_KEY);
  lua_pushvalue(L, methods);
  lem_push_function(L, t_index, "Tensor", 1);     /* upvalue 2: the methods, looked up first */
  lua_setfield(L, mt, "__index");
  lem_push_function(L, t_newindex, "Tensor", 0); lua_setfield(L, mt, "__newindex");
  lua_pushcfunction(L, t_gc); lua_setfield(L, mt, "__gc");
  lua_pushcfunction(L, t_close); lua_setfield(L, mt, "__close");
  lem_push_function(L, t_len, "len", 0); lua_setfield(L, mt, "__len");
  lua_pushliteral(L, "ember.Tensor"); lua_setfield(L, mt, "__name");
  lua_setfield(L, module, "Tensor_mt");

  static const luaL_Reg module_only[] = {
    {"tensor", l_tensor}, {"empty", l_empty}, {"zeros", l_zeros}, {"ones", l_ones}, {"full", l_full},
    {"rand", l_rand}, {"randn", l_randn}, {"randint", l_randint}, {"arange", l_arange},
    {"linspace", l_linspace}, {"eye", l_eye}, {"is_tensor", l_is_tensor},
    {"zeros_like", l_zeros_like}, {"ones_like", l_ones_like}, {"empty_like", l_empty_like},
    {"rand_like", l_rand_like}, {"randn_like", l_randn_like}, {NULL, NULL}};
  lem_register(L, 0, module, module_only);
  static const luaL_Reg both[] = {
    {"size", t_size}, {"stride", t_stride}, {"dim", t_dim}, {"numel", t_numel}, {"nelement", t_numel},
    {"is_contiguous", t_is_contiguous}, {"data_ptr", t_data_ptr}, {"element_size", t_element_size},
    {"storage_offset", t_storage_offset}, {"_version", t_version}, {"item", t_item}, {"tolist", t_tolist},
    {"view", t_view}, {"reshape", t_reshape}, {"expand", t_expand}, {"permute", t_permute},
    {"transpose", t_transpose}, {"t", t_T}, {"narrow", t_narrow}, {"select", t_select}, {"squeeze", t_squeeze},
    {"unsqueeze", t_unsqueeze}, {"flatten", t_flatten}, {"contiguous", t_contiguous}, {"clone", t_clone},
    {"detach", t_detach}, {"copy_", t_copy_}, {"fill_", t_fill_}, {"zero_", t_zero_}, {"set_", t_set_},
    {"to", t_to}, {"float", t_float}, {"double", t_double}, {"half", t_half}, {"bfloat16", t_bfloat16},
    {"long", t_long}, {"int", t_int}, {"bool", t_bool}, {"cpu", t_cpu}, {"cuda", t_cuda},
    {"pin_memory", t_pin_memory}, {"is_pinned", t_is_pinned}, {NULL, NULL}};
  lem_register(L, methods, module, both);
  static const lem_Reg named[] = {{"_flat_values", t_flat_values, "print"}, {NULL, NULL, NULL}};   /* printing's */
  lem_register_named(L, methods, module, named);
}
