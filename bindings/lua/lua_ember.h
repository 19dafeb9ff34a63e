/* The C side of the Lua module: thin wrappers that check arguments, push
 * tensors as userdata and turn engine errors into Lua errors. The engine
 * knows nothing about Lua; everything Lua-specific lives here. */
#ifndef LUA_EMBER_H
#define LUA_EMBER_H

#include <lua.h>
#include <lauxlib.h>
#include "ember/ember.h"

#define EM_TENSOR_MT "ember.Tensor"

/* Push t (takes ownership of one reference). Pushes the existing userdata when
 * t already has one, so identity (p == p2) holds for parameters and grads. */
void lem_push_tensor(lua_State *L, em_tensor *t);
/* Push a result: t or raise the engine error (prefixed "ember."). Returns 1. */
int lem_push_result(lua_State *L, em_tensor *t);
/* A full collection before a CUDA backward when the forward left enough device garbage (lua_tensor.c). */
void lem_collect_before_backward(lua_State *L, const em_tensor *root);
em_tensor *lem_check_tensor(lua_State *L, int idx, const char *fn, const char *arg);
em_tensor *lem_test_tensor(lua_State *L, int idx);      /* NULL if not a tensor */
/* Like lem_test_tensor; a closed tensor raises naming fn. */
em_tensor *lem_test_tensor_named(lua_State *L, int idx, const char *fn);
/* Raise the last engine error as a Lua error ("ember.<msg>", OOM unprefixed). */
int lem_raise(lua_State *L);
/* Raise "ember.<fn>: <formatted>". */
int lem_error(lua_State *L, const char *fn, const char *fmt, ...);
/* Read a shape from varargs numbers starting at idx, or from a table at idx.
 * Returns ndim; *next = first index after the shape. */
int lem_check_shape(lua_State *L, int idx, const char *fn, int64_t *shape, int *next);
/* Options table helpers (idx may be 0/none). */
int lem_opt_dtype(lua_State *L, int opts, const char *fn, em_dtype def, em_dtype *out);
int lem_opt_device(lua_State *L, int opts, const char *fn, em_device *out);
int lem_opt_bool(lua_State *L, int opts, const char *key, int def);
double lem_opt_number(lua_State *L, int opts, const char *fn, const char *key, double def);
em_tensor *lem_opt_tensor(lua_State *L, int opts, const char *key, const char *fn);
/* Argument checks that raise "ember.<fn>: expected argument N (arg) to be ..., got ...". */
double lem_check_number(lua_State *L, int idx, const char *fn, const char *arg);
double lem_opt_number_arg(lua_State *L, int idx, const char *fn, const char *arg, double def);
const char *lem_check_string(lua_State *L, int idx, const char *fn, const char *arg);
void lem_check_type(lua_State *L, int idx, int type, const char *fn, const char *arg);
/* Integer argument as a dim/index (0-based). */
int64_t lem_check_int(lua_State *L, int idx, const char *fn, const char *arg);
/* Read a list (Lua array) of tensors; returns count, fills a malloc'd array in *out (caller frees). */
int lem_check_tensor_list(lua_State *L, int idx, const char *fn, em_tensor ***out);
/* The .grad of each of the n tensors p (borrowed pointers, in a malloc'd array); raises,
 * freeing p, when one has none. For optimizers: no Lua handle to a gradient is made. */
int lem_grads_of(lua_State *L, const char *fn, int n, em_tensor **p, em_tensor ***out);
/* The lua_State running the current backward (hooks call back into it). */
extern _Thread_local lua_State *lem_current_L;
/* The thread whose stack holds the current call site (lua_cuda.c): lem_current_L, else
 * the main (or capturing) thread; NULL once the state is closing. */
lua_State *lem_callsite_state(void);

/* registration of each part */
void lem_open_tensor(lua_State *L, int methods, int module);
void lem_open_math(lua_State *L, int methods, int module);
void lem_open_autograd(lua_State *L, int methods, int module);
void lem_open_io(lua_State *L, int module);
void lem_open_device(lua_State *L, int module);
void lem_open_cuda(lua_State *L, int module);      /* lua_cuda.c: streams, events, memory, graphs */
void lem_open_amp(lua_State *L, int module);      /* autocast, tf32 (lua_amp.c) */
void lem_open_context(lua_State *L, int module);  /* module paths and phases (lua_context.c) */
void lem_open_profiler(lua_State *L, int module); /* profiler sessions, profiles, NVTX (lua_profiler.c) */
void lem_open_memory(lua_State *L, int module);   /* memory history and snapshots (lua_memory.c) */
void lem_open_nn_cuda(lua_State *L, int module);
void lem_open_dist(lua_State *L, int module);     /* collectives and work handles (lua_dist.c) */  /* capturable AdamW, clip_grads_ (lua_nn_cuda.c) */
/* Register funcs both as methods and module functions. */
void lem_register(lua_State *L, int methods, int module, const luaL_Reg *funcs);

#endif
