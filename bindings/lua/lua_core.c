/* luaopen_ember_core: the module table `ember.core`, its `methods` table
 * (shared by every tensor through the metatable's __index) and the parts. */
#include <limits.h>
#include <stdlib.h>
#include <time.h>
#include "lua_ember.h"
#include "parallel.h"
#include "stream.h"

/* Monotonic wall clock in seconds (benchmarks). */
static int l_clock(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
  return 1;
}

static int l_cuda_is_available(lua_State *L) { lua_pushboolean(L, em_cuda_available()); return 1; }
static int l_cuda_device_count(lua_State *L) { lua_pushinteger(L, em_cuda_device_count()); return 1; }
static int l_cuda_compiled(lua_State *L) { lua_pushboolean(L, em_cuda_compiled()); return 1; }

/* ember.set_num_threads(n): the CPU ops' and OpenBLAS's thread count (ember/threads.h). */
static int l_set_num_threads(lua_State *L) {
  const char *fn = lem_name(L);
  int isint = 0;
  lua_Integer n = lua_type(L, 1) == LUA_TNUMBER ? lua_tointegerx(L, 1, &isint) : 0;
  if (!isint || n < 1)
    return lem_error(L, fn, "expected a positive integer number of threads, got %s",
                     lua_type(L, 1) == LUA_TNUMBER ? lua_tostring(L, 1) : luaL_typename(L, 1));
  if (em_set_num_threads(n > INT_MAX ? INT_MAX : (int)n)) return lem_raise(L);
  return 0;
}

static int l_get_num_threads(lua_State *L) { lua_pushinteger(L, em_get_num_threads()); return 1; }

/* ember.set_parallel_min_work(n) -> previous: the element operations below which a
 * CPU op stays on one thread (default 32768). Tests lower it so small tensors take
 * the parallel paths; results do not depend on it. */
static int l_set_parallel_min_work(lua_State *L) {
  const char *fn = lem_name(L);
  int64_t n = lem_check_int(L, 1, fn, "n");
  if (n < 1) return lem_error(L, fn, "expected a positive integer, got %lld", (long long)n);
  lua_pushinteger(L, em_set_parallel_min_work(n));
  return 1;
}

/* ember.set_stream_min(bytes) -> previous: outputs from this size on are written
 * with streaming stores (engine/stream.h; default 16 MiB, -1: never). Tests set
 * 0 so small outputs take the streaming paths; results do not depend on it. */
static int l_set_stream_min(lua_State *L) {
  const char *fn = lem_name(L);
  int64_t n = lem_check_int(L, 1, fn, "bytes");
  if (n < -1) return lem_error(L, fn, "expected a number of bytes >= 0, or -1 for never, got %lld", (long long)n);
  lua_pushinteger(L, em_set_stream_min(n));
  return 1;
}

/* ember.stream_read(t) -> integer: the OR of a contiguous CPU tensor's 8-byte
 * words, read over the threads (engine/stream.h): a read-only memory stream
 * for bandwidth measurements and ember.bench's CPU cache flush. */
static int l_stream_read(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "t");
  if (t->device.type != EM_CPU) return lem_error(L, fn, "expected a CPU tensor, got one on %s", t->device.type == EM_CUDA ? "cuda" : "another device");
  if (!em_is_contiguous(t)) return lem_error(L, fn, "expected a contiguous tensor, got a strided view");
  lua_pushinteger(L, (lua_Integer)em_stream_read(em_data_ptr(t), em_numel(t) * (int64_t)em_dtype_size(t->dtype)));
  return 1;
}

/* ember.threads_info() -> {threads=, default=, source=} (ember.runinfo, study headers). */
static int l_threads_info(lua_State *L) {
  lua_createtable(L, 0, 3);
  lua_pushinteger(L, em_get_num_threads()); lua_setfield(L, -2, "threads");
  lua_pushinteger(L, em_default_num_threads()); lua_setfield(L, -2, "default");
  lua_pushstring(L, em_num_threads_source()); lua_setfield(L, -2, "source");
  return 1;
}

/* ember.blas_info() -> {core=, config=, better=, replaced=}: OpenBLAS's kernels
 * (engine/blas_core.c); better = the OPENBLAS_CORETYPE that would load faster
 * ones (nil when fine); replaced = the core OpenBLAS chose before `ember`
 * re-executed itself with OPENBLAS_CORETYPE set (bindings/cli/ember_main.c). */
static int l_blas_info(lua_State *L) {
  lua_createtable(L, 0, 4);
  lua_pushstring(L, em_blas_corename()); lua_setfield(L, -2, "core");
  lua_pushstring(L, em_blas_config()); lua_setfield(L, -2, "config");
  const char *better = em_blas_better_core();
  if (better) { lua_pushstring(L, better); lua_setfield(L, -2, "better"); }
  const char *was = getenv("EMBER_BLAS_REEXEC");
  if (was && *was) { lua_pushstring(L, was); lua_setfield(L, -2, "replaced"); }
  return 1;
}

void lem_open_device(lua_State *L, int module) {
  static const luaL_Reg f[] = {{"cuda_is_available", l_cuda_is_available},
                               {"cuda_device_count", l_cuda_device_count},
                               {"cuda_compiled", l_cuda_compiled}, {"clock", l_clock},
                               {"set_num_threads", l_set_num_threads}, {"get_num_threads", l_get_num_threads},
                               {"threads_info", l_threads_info}, {"blas_info", l_blas_info},
                               {"set_parallel_min_work", l_set_parallel_min_work},
                               {"set_stream_min", l_set_stream_min}, {"stream_read", l_stream_read},
                               {NULL, NULL}};
  lem_register(L, 0, module, f);
}

int luaopen_ember_core(lua_State *L) {
  lua_newtable(L);
  int module = lua_gettop(L);
  lua_newtable(L);
  int methods = lua_gettop(L);
  lua_pushvalue(L, methods);
  lua_setfield(L, module, "methods");
  lem_open_tensor(L, methods, module);
  lem_open_math(L, methods, module);
  lem_open_autograd(L, methods, module);
  lem_open_io(L, module);
  lem_open_device(L, module);
  lem_open_cuda(L, module);
  lem_open_amp(L, module);
  lem_open_nn_cuda(L, module);
  lem_open_context(L, module);
  lem_open_profiler(L, module);
  lem_open_memory(L, module);
  lem_open_dist(L, module);
  lem_open_random(L, methods, module);   /* issue 12 */
  lem_open_tokenizer(L, module);
  lem_open_indexing(L, methods, module);   /* after lem_open_tensor: wraps the tensor __index */
  lem_open_sort(L, methods, module);   /* sorting, selection, scans (lua_sort.c) */
  lem_open_shape_math(L, methods, module);   /* issue 12 */
  lua_pushliteral(L, EMBER_VERSION);
  lua_setfield(L, module, "version");
#ifdef EMBER_SOURCE_DIR
  lua_pushliteral(L, EMBER_SOURCE_DIR);   /* Ember's own tree: ember.runinfo's commit lookup */
  lua_setfield(L, module, "source_dir");
#endif
  lua_settop(L, module);
  return 1;
}
