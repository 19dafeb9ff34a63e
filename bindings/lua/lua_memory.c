/* The C side of ember.memory (bindings/ember/memory.lua has the friendly
 * API): memory history control, snapshots, tags and category overrides over
 * ember/memory.h, and the call-site provider the engine calls at record time.
 *
 * Call site: the innermost Lua frame with a line that is not inside the
 * ember package itself (the files of bindings/ember, whose source prefix memory.lua
 * reports), so an activation allocated deep in nn.lua is charged to the
 * script line that called the model, and a gradient to the `backward()` line.
 * The stack walked is lem_callsite_state()'s (a backward's or a capture's
 * thread, else the main thread); when that thread is inside
 * coroutine.resume or a coroutine.wrap function, the walk descends into the
 * coroutine it runs, so code in coroutines gets its own lines. Strings are
 * interned and cached per (source, line): a cached call site costs a stack
 * walk and no allocation. Only the thread that opened the module walks Lua
 * stacks; other threads record no call site. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "lua_ember.h"

/* ---------------- call site ---------------- */

static pthread_t owner;
static char internal_prefix[1024];   /* "@/path/to/ember/": frames there are the package's */
static size_t internal_len;
static lua_CFunction co_resume, co_auxwrap;

typedef struct { const char *src; int line; const char *src_copy, *site; } site_slot;
#define SITE_SLOTS 4096
static site_slot site_cache[SITE_SLOTS];

static int is_internal(const char *source) {
  return internal_len && strncmp(source, internal_prefix, internal_len) == 0;
}

/* "file:line" for a frame: the full path of a file chunk, Lua's short form otherwise. */
static int format_frame(char *buf, size_t n, const lua_Debug *ar, int with_name) {
  const char *file = ar->source[0] == '@' ? ar->source + 1 : ar->short_src;
  if (with_name && ar->name) return snprintf(buf, n, "%s:%d in %s", file, ar->currentline, ar->name);
  return snprintf(buf, n, "%s:%d", file, ar->currentline);
}

/* The interned "file:line" of a frame, cached by (source pointer, line);
 * the source text is compared too, since a collected chunk's address can
 * come back for another. */
static const char *site_of(const lua_Debug *ar) {
  size_t h = (((uintptr_t)ar->source >> 4) ^ (size_t)ar->currentline * 2654435761u) & (SITE_SLOTS - 1);
  site_slot *s = &site_cache[h];
  if (s->src == ar->source && s->line == ar->currentline && s->src_copy && !strcmp(s->src_copy, ar->source))
    return s->site;
  char buf[512];
  format_frame(buf, sizeof buf, ar, 0);
  const char *site = em_intern(buf), *copy = em_intern(ar->source);
  if (!site || !copy) return site;
  s->src = ar->source;
  s->line = ar->currentline;
  s->src_copy = copy;
  s->site = site;
  return site;
}

/* The coroutine L is running right now (L itself when it runs no coroutine):
 * a thread inside coroutine.resume has the coroutine as the C frame's first
 * argument; inside a coroutine.wrap function, as the closure's upvalue. */
static lua_State *running_thread(lua_State *L) {
  for (int hops = 0; hops < 64; hops++) {
    lua_Debug ar;
    if (!lua_getstack(L, 0, &ar) || !lua_checkstack(L, 2)) break;
    lua_getinfo(L, "f", &ar);
    lua_CFunction f = lua_tocfunction(L, -1);
    lua_State *co = NULL;
    if (f && f == co_resume) {
      if (lua_getlocal(L, &ar, 1)) { co = lua_tothread(L, -1); lua_pop(L, 1); }
    } else if (f && f == co_auxwrap) {
      if (lua_getupvalue(L, -1, 1)) { co = lua_tothread(L, -1); lua_pop(L, 1); }
    }
    lua_pop(L, 1);
    if (!co || co == L || lua_status(co) != LUA_OK) break;
    L = co;
  }
  return L;
}

static const char *mem_callsite(int depth) {
  if (!pthread_equal(pthread_self(), owner)) return NULL;
  lua_State *L = lem_callsite_state();
  if (!L) return NULL;
  L = running_thread(L);
  lua_Debug ar;
  int site_level = -1, fallback = -1;
  for (int level = 0; lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) continue;   /* C functions */
    if (!is_internal(ar.source)) { site_level = level; break; }
    if (fallback < 0) fallback = level;
  }
  if (site_level < 0) site_level = fallback;        /* all package code: its innermost line */
  if (site_level < 0 || !lua_getstack(L, site_level, &ar) || !lua_getinfo(L, "Sl", &ar)) return NULL;
  const char *site = site_of(&ar);
  if (depth <= 0 || !site) return site;
  /* the site, then up to `depth` Lua callers: "file:line\nfile:line in name..." */
  char buf[4096];
  size_t len = (size_t)snprintf(buf, sizeof buf, "%s", site);
  for (int level = site_level + 1; depth > 0 && len < sizeof buf - 1 && lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "Sln", &ar) || ar.currentline <= 0) continue;
    buf[len++] = '\n';
    int n = format_frame(buf + len, sizeof buf - len, &ar, 1);
    if (n < 0) break;
    len += (size_t)n < sizeof buf - len ? (size_t)n : sizeof buf - len - 1;
    depth--;
  }
  buf[len < sizeof buf ? len : sizeof buf - 1] = 0;
  return em_intern(buf);
}

/* core.mem_set_internal_prefix("@/path/ember/"): frames whose source starts so are skipped. */
static int l_set_internal_prefix(lua_State *L) {
  const char *p = lem_check_string(L, 1, lem_name(L), "prefix");
  size_t n = strlen(p);
  if (n >= sizeof internal_prefix) n = 0;              /* too long to be ours: skip nothing */
  memcpy(internal_prefix, p, n);
  internal_prefix[n] = 0;
  internal_len = n;
  return 0;
}

/* ---------------- recording ---------------- */

static int check_category(lua_State *L, int idx, const char *fn) {
  const char *name = lem_check_string(L, idx, fn, "category");
  int c = em_mem_category_parse(name);
  if (c < 0)
    return lem_error(L, fn, "expected a category (other, parameter, gradient, activation, autograd, "
                     "optimizer_state, workspace, communication), got \"%s\"", name);
  return c;
}

/* core.mem_record_history(on, max_entries, stack_depth, cpu) */
static int l_record_history(lua_State *L) {
  const char *fn = lem_name(L);
  em_mem_history_opts o = {EM_MEM_DEFAULT_MAX_ENTRIES, 0, true};
  int on = lua_toboolean(L, 1);
  o.max_entries = lem_opt_int(L, 2, fn, "max_entries", o.max_entries);
  o.stack_depth = (int)lem_opt_int(L, 3, fn, "stack_depth", o.stack_depth);
  if (!lua_isnoneornil(L, 4)) o.cpu = lua_toboolean(L, 4);
  if (on) owner = pthread_self();                       /* the thread that records walks its stacks */
  if (em_mem_record_history(on, &o)) return lem_raise(L);
  return 0;
}

static int l_clear_history(lua_State *L) { (void)L; em_mem_clear_history(); return 0; }

static void set_int(lua_State *L, const char *k, int64_t v) { lua_pushinteger(L, v); lua_setfield(L, -2, k); }
static void set_bool(lua_State *L, const char *k, int v) { lua_pushboolean(L, v); lua_setfield(L, -2, k); }
static void set_str(lua_State *L, const char *k, const char *v) {
  if (!v) return;                                       /* absent: nil */
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

static void push_history_stats(lua_State *L, const em_mem_history_stats *s) {
  lua_createtable(L, 0, 11);
  set_bool(L, "recording", s->recording);
  set_bool(L, "stopped", s->stopped);
  set_int(L, "max_entries", s->max_entries);
  set_int(L, "stack_depth", s->stack_depth);
  set_bool(L, "cpu", s->cpu);
  set_int(L, "entries", s->entries);
  set_int(L, "capacity", s->capacity);
  set_int(L, "dropped", s->dropped);
  set_int(L, "recorded", s->recorded);
  set_int(L, "live_blocks", s->live_blocks);
  set_int(L, "live_bytes", s->live_bytes);
}

static int l_history_stats(lua_State *L) {
  em_mem_history_stats s;
  em_mem_history_stats_get(&s);
  push_history_stats(L, &s);
  return 1;
}

/* core.mem_tag(t, category): t's storage changes category (no-op unless recording). */
static int l_tag(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "tensor");
  em_mem_tag(t->storage, (em_mem_category)check_category(L, 2, fn));
  return 0;
}

/* core.mem_tag_grad(t, category): tag t.grad's storage without making a Lua handle to it. */
static int l_tag_grad(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "tensor");
  int c = check_category(L, 2, fn);
  if (t->grad) em_mem_tag(t->grad->storage, (em_mem_category)c);
  return 0;
}

/* core.mem_tag_shadow(t, category): tag t's bf16/f16 shadow copy (AdamW's
 * shadow weights, ember/autocast.h), when it has a current one. */
static int l_tag_shadow(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "tensor");
  int c = check_category(L, 2, fn);
  em_tensor *s = em_shadow_weight(t);
  if (s) em_mem_tag(s->storage, (em_mem_category)c);
  return 0;
}

/* core.mem_set_category_override(name | nil) -> the previous one (nil: inferred) */
static int l_set_override(lua_State *L) {
  em_mem_category c = lua_isnoneornil(L, 1) ? EM_MEM_AUTO
                                            : (em_mem_category)check_category(L, 1, lem_name(L));
  em_mem_category prev = em_mem_set_category_override(c);
  if (prev == EM_MEM_AUTO) lua_pushnil(L);
  else lua_pushstring(L, em_mem_category_name(prev));
  return 1;
}

/* ---------------- snapshots ---------------- */

/* core.mem_snapshot_save(path, "json" | "pickle") */
static int l_snapshot_save(lua_State *L) {
  const char *fn = lem_name(L);
  const char *path = lem_check_string(L, 1, fn, "path");
  const char *fmt = lem_check_string(L, 2, fn, "format");
  em_mem_format f = strcmp(fmt, "pickle") == 0 ? EM_MEM_FORMAT_PICKLE : EM_MEM_FORMAT_JSON;
  if (em_mem_snapshot_save(path, f)) return lem_raise(L);
  return 0;
}

static const char *device_name(int device, char buf[16]) {
  if (device < 0) snprintf(buf, 16, "cpu");
  else snprintf(buf, 16, "cuda:%d", device);
  return buf;
}

static void push_event(lua_State *L, const em_mem_event *e) {
  char dev[16];
  lua_createtable(L, 0, 12);
  set_int(L, "time_ns", e->time_ns);
  set_str(L, "action", em_mem_action_name((em_mem_action)e->action));
  set_str(L, "device", device_name(e->device, dev));
  set_int(L, "addr", (int64_t)e->addr);
  set_int(L, "size", (int64_t)e->size);
  set_int(L, "requested_size", (int64_t)e->requested);
  set_int(L, "stream", (int64_t)e->stream);
  set_str(L, "category", em_mem_category_name((em_mem_category)e->category));
  set_str(L, "phase", em_phase_name((em_phase)e->phase));
  set_str(L, "op", e->op);
  set_str(L, "module", e->module ? e->module : "");
  set_str(L, "callsite", e->callsite);
}

static const em_mem_block *find_block(const em_mem_history *h, uint64_t addr) {
  int64_t lo = 0, hi = h->n_blocks - 1;
  while (lo <= hi) {
    int64_t mid = lo + (hi - lo) / 2;
    uint64_t a = h->blocks[mid].alloc.addr;
    if (a == addr) return &h->blocks[mid];
    if (a < addr) lo = mid + 1; else hi = mid - 1;
  }
  return NULL;
}

static void push_block(lua_State *L, int device, uint64_t addr, uint64_t size, const em_mem_block *b) {
  char dev[16];
  lua_createtable(L, 0, 6);
  set_str(L, "device", device_name(device, dev));
  set_int(L, "address", (int64_t)addr);
  set_int(L, "size", (int64_t)size);
  set_int(L, "requested_size", (int64_t)(b && b->alloc.requested ? b->alloc.requested : size));
  set_str(L, "category", b ? em_mem_category_name((em_mem_category)b->category) : "unknown");
  lua_createtable(L, 2, 0);
  if (b) { push_event(L, &b->alloc); lua_rawseti(L, -2, 1); }
  if (b && b->has_tag) { push_event(L, &b->tag); lua_rawseti(L, -2, 2); }
  lua_setfield(L, -2, "history");
}

static void push_segments(lua_State *L, const em_cuda_segment_info *segs, int64_t n, const em_mem_history *h) {
  char dev[16];
  lua_createtable(L, (int)n, 0);
  for (int64_t i = 0; i < n; i++) {
    const em_cuda_segment_info *g = &segs[i];
    uint64_t allocated = 0, requested = 0;
    lua_createtable(L, 0, 9);
    set_str(L, "device", device_name(g->device, dev));
    set_int(L, "address", (int64_t)g->addr);
    set_int(L, "total_size", (int64_t)g->size);
    set_int(L, "stream", (int64_t)g->stream);
    set_str(L, "segment_type", g->small ? "small" : "large");
    set_bool(L, "graph_pool", g->graph_pool);
    lua_createtable(L, (int)g->n_blocks, 0);
    for (int64_t j = 0; j < g->n_blocks; j++) {
      const em_cuda_block_info *k = &g->blocks[j];
      const em_mem_block *b = k->allocated ? find_block(h, k->addr) : NULL;
      uint64_t req = !k->allocated ? 0 : b && b->alloc.requested ? b->alloc.requested : k->size;
      if (k->allocated) { allocated += k->size; requested += req; }
      lua_createtable(L, 0, 5);
      set_int(L, "address", (int64_t)k->addr);
      set_int(L, "size", (int64_t)k->size);
      set_int(L, "requested_size", (int64_t)req);
      set_str(L, "state", k->allocated ? "active_allocated" : "inactive");
      if (k->allocated) set_str(L, "category", b ? em_mem_category_name((em_mem_category)b->category) : "unknown");
      lua_rawseti(L, -2, j + 1);
    }
    lua_setfield(L, -2, "blocks");
    set_int(L, "allocated_size", (int64_t)allocated);
    set_int(L, "requested_size", (int64_t)requested);
    lua_rawseti(L, -2, i + 1);
  }
}

/* core.mem_snapshot() -> the JSON snapshot's content as Lua tables, with trace
 * entries as tables of named fields. The copies are taken before any Lua
 * allocation, so a collection running finalizers meanwhile records into the
 * live history, not into what is being read. */
typedef struct { em_cuda_segment_info *segs; int64_t n_segs; em_mem_history h; } snap_box;

static int snap_gc(lua_State *L) {
  snap_box *b = lua_touserdata(L, 1);
  em_cuda_segments_free(b->segs, b->n_segs);
  em_mem_history_free(&b->h);
  b->segs = NULL;
  b->n_segs = 0;
  return 0;
}

static int l_snapshot(lua_State *L) {
  snap_box *box = lua_newuserdatauv(L, sizeof *box, 0);   /* frees the copies even if a push raises */
  memset(box, 0, sizeof *box);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, snap_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  if (em_cuda_memory_segments(-1, &box->segs, &box->n_segs) || em_mem_history_copy(&box->h)) return lem_raise(L);
  const em_mem_history *h = &box->h;
  lua_createtable(L, 0, 9);
  set_str(L, "format", "ember.memory_snapshot");
  set_int(L, "version", 1);
  set_int(L, "time_ns", h->time_ns);
  push_history_stats(L, &h->stats);
  lua_setfield(L, -2, "history");
  lua_createtable(L, EM_MEM_CATEGORY_COUNT, 0);
  for (int c = 0; c < EM_MEM_CATEGORY_COUNT; c++) {
    lua_pushstring(L, em_mem_category_name((em_mem_category)c));
    lua_rawseti(L, -2, c + 1);
  }
  lua_setfield(L, -2, "categories");
  push_segments(L, box->segs, box->n_segs, h);
  lua_setfield(L, -2, "segments");
  lua_newtable(L);
  int nb = 0;
  for (int64_t i = 0; i < box->n_segs; i++)
    for (int64_t j = 0; j < box->segs[i].n_blocks; j++) {
      const em_cuda_block_info *k = &box->segs[i].blocks[j];
      if (!k->allocated) continue;
      push_block(L, box->segs[i].device, k->addr, k->size, find_block(h, k->addr));
      lua_rawseti(L, -2, ++nb);
    }
  for (int64_t i = 0; i < h->n_blocks; i++) {
    if (h->blocks[i].alloc.device >= 0) continue;
    push_block(L, -1, h->blocks[i].alloc.addr, h->blocks[i].alloc.size, &h->blocks[i]);
    lua_rawseti(L, -2, ++nb);
  }
  lua_setfield(L, -2, "blocks");
  lua_createtable(L, h->n_events < INT32_MAX ? (int)h->n_events : 0, 0);
  for (int64_t i = 0; i < h->n_events; i++) {
    push_event(L, &h->events[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "trace");
  return 1;
}

/* ---------------- registration ---------------- */

/* The C functions behind coroutine.resume and coroutine.wrap's closures. */
static void find_coroutine_functions(lua_State *L) {
  co_resume = co_auxwrap = NULL;
  if (lua_getglobal(L, "coroutine") != LUA_TTABLE) { lua_pop(L, 1); return; }
  if (lua_getfield(L, -1, "resume") == LUA_TFUNCTION) co_resume = lua_tocfunction(L, -1);
  lua_pop(L, 1);
  if (lua_getfield(L, -1, "wrap") == LUA_TFUNCTION) {
    luaL_loadstring(L, "return");
    if (lua_pcall(L, 1, 1, 0) == LUA_OK) co_auxwrap = lua_tocfunction(L, -1);
  }
  lua_pop(L, 2);
}

void lem_open_memory(lua_State *L, int module) {
  /* named as ember.memory (bindings/ember/memory.lua) shows them */
  static const lem_Reg f[] = {
    {"mem_record_history", l_record_history, "memory.record_history"},
    {"mem_clear_history", l_clear_history, "memory.clear_history"},
    {"mem_history_stats", l_history_stats, "memory.stats"},
    {"mem_tag", l_tag, "memory.tag"}, {"mem_tag_grad", l_tag_grad, "memory.tag"},
    {"mem_tag_shadow", l_tag_shadow, "memory.tag"},
    {"mem_set_category_override", l_set_override, "memory.category"},
    {"mem_snapshot_save", l_snapshot_save, "memory.snapshot"}, {"mem_snapshot", l_snapshot, "memory.snapshot"},
    {"mem_set_internal_prefix", l_set_internal_prefix, "memory.set_internal_prefix"}, {NULL, NULL, NULL}};
  lem_register_named(L, 0, module, f);
  owner = pthread_self();
  find_coroutine_functions(L);
  em_mem_set_callsite_fn(mem_callsite);
}
