/* The C side of the Lua module: thin wrappers that check arguments, push
 * tensors as userdata and turn engine errors into Lua errors. The engine
 * knows nothing about Lua; everything Lua-specific lives here. */
#ifndef LUA_EMBER_H
#define LUA_EMBER_H

#include <lua.h>
#include <lauxlib.h>
#include "ember/ember.h"

#define EM_TENSOR_MT "ember.Tensor"

/* ---- Names: every error reads "ember.<name>: <what was expected>, got <what came>" ----
 * A C function learns its public name from the table that registers it: each
 * is pushed as a closure whose first upvalue is that name, and lem_name(L)
 * reads it back. A luaL_Reg entry's name is its key; a core function that Lua
 * shows under another name is registered with that name
 * ({"cuda_synchronize", l_synchronize, "cuda.synchronize"}: what users call).
 * A binding then reads like lauxlib, one line per argument:
 *   static int l_softmax(lua_State *L) {            // {"softmax", l_softmax} in a luaL_Reg
 *     const char *fn = lem_name(L);                 // "softmax"
 *     em_tensor *a = lem_check_tensor(L, 1, fn, "self");
 *     return lem_push_result(L, em_softmax(a, lem_opt_int(L, 2, fn, "dim", -1)));
 *   } */
typedef struct { const char *key; lua_CFunction func; const char *name; } lem_Reg;
/* Set each of funcs (up to a NULL key) in methods and/or module (0: skip that table), named by its key. */
void lem_register(lua_State *L, int methods, int module, const luaL_Reg *funcs);
/* The same for entries that carry their public name. */
void lem_register_named(lua_State *L, int methods, int module, const lem_Reg *funcs);
/* Push func as a closure named name, taking the nup values on the stack as upvalues 2..nup+1. */
void lem_push_function(lua_State *L, lua_CFunction func, const char *name, int nup);
/* The registered name of the running C function. */
const char *lem_name(lua_State *L);
/* Raise "ember.<fn>: <formatted>". */
int lem_error(lua_State *L, const char *fn, const char *fmt, ...);
/* Raise the last engine error as a Lua error ("ember.<msg>", OOM unprefixed). */
int lem_raise(lua_State *L);

/* ---- Arguments, as lauxlib checks them: (L, index, function name, argument name[, default]) ----
 * A wrong argument raises "ember.<fn>: expected argument N (arg) to be ..., got ...";
 * opt forms return the default for none or nil. */
em_tensor *lem_check_tensor(lua_State *L, int idx, const char *fn, const char *arg);
em_tensor *lem_opt_tensor(lua_State *L, int idx, const char *fn, const char *arg);   /* default NULL */
/* The tensor at idx, or NULL if it is not one; a closed tensor raises naming fn
 * (fn NULL: "ember.Tensor: this tensor was already closed ..."). */
em_tensor *lem_test_tensor(lua_State *L, int idx, const char *fn);
double lem_check_number(lua_State *L, int idx, const char *fn, const char *arg);
double lem_opt_number(lua_State *L, int idx, const char *fn, const char *arg, double def);
/* An integer: a dim, an index, a size (0-based where it is a position). */
int64_t lem_check_int(lua_State *L, int idx, const char *fn, const char *arg);
int64_t lem_opt_int(lua_State *L, int idx, const char *fn, const char *arg, int64_t def);
const char *lem_check_string(lua_State *L, int idx, const char *fn, const char *arg);
const char *lem_opt_string(lua_State *L, int idx, const char *fn, const char *arg, const char *def);
void lem_check_type(lua_State *L, int idx, const char *fn, const char *arg, int type);
/* A shape from varargs numbers starting at idx, or from a table at idx.
 * Returns ndim; *next = first index after the shape. */
int lem_check_shape(lua_State *L, int idx, const char *fn, int64_t *shape, int *next);
/* A list (Lua array) of tensors; returns count, fills a malloc'd array in *out (caller frees). */
int lem_check_tensor_list(lua_State *L, int idx, const char *fn, em_tensor ***out);
/* The .grad of each of the n tensors p (borrowed pointers, in a malloc'd array); raises,
 * freeing p, when one has none. For optimizers: no Lua handle to a gradient is made. */
int lem_grads_of(lua_State *L, const char *fn, int n, em_tensor **p, em_tensor ***out);

/* ---- Options tables: (L, options index, function name, key[, default]) ----
 * lem_opts finds the table: idx when the argument there is a table, else 0
 * (0 reads as "no options" everywhere below). With keys (a NULL-terminated
 * list), any other key raises "ember.<fn>: unknown option 'k' (expected a, b)",
 * as ember.dist and ember.memory do; NULL keys accept any (a Lua wrapper that
 * owns the table checks it). */
int lem_opts(lua_State *L, int idx, const char *fn, const char *const *keys);
/* The one reader: push opts[key] and return 1, or push nothing and return 0
 * when it is nil (or opts is 0). type (LUA_T*, LUA_TNONE: any) is checked:
 * "ember.<fn>: expected option 'key' to be a <type>, got <type>". */
int lem_field(lua_State *L, int opts, const char *fn, const char *key, int type);
int lem_field_bool(lua_State *L, int opts, const char *fn, const char *key, int def);   /* Lua truth */
double lem_field_number(lua_State *L, int opts, const char *fn, const char *key, double def);
em_tensor *lem_field_tensor(lua_State *L, int opts, const char *fn, const char *key);   /* default NULL */
em_dtype lem_field_dtype(lua_State *L, int opts, const char *fn, const char *key, em_dtype def);
/* A device name; a CUDA one must exist in this build and on this machine. */
em_device lem_field_device(lua_State *L, int opts, const char *fn, const char *key, em_device def);

/* ---- Tensors as userdata ---- */
/* Push t (takes ownership of one reference). Pushes the existing userdata when
 * t already has one, so identity (p == p2) holds for parameters and grads. */
void lem_push_tensor(lua_State *L, em_tensor *t);
/* Push a result: t or raise the engine error (prefixed "ember."). Returns 1. */
int lem_push_result(lua_State *L, em_tensor *t);
/* The same, but when t is arg, the tensor of the argument at idx (an in-place
 * op's self), push that argument again: the identity cache's two lookups
 * give the same userdata (~350 instructions of a:add_(b)). */
int lem_push_result_at(lua_State *L, em_tensor *t, int idx, const em_tensor *arg);
/* A full collection before a CUDA backward when the forward left enough device garbage (lua_tensor.c). */
void lem_collect_before_backward(lua_State *L, const em_tensor *root);
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
void lem_open_nn_cuda(lua_State *L, int module);  /* capturable AdamW, clip_grads_ (lua_nn_cuda.c) */
void lem_open_dist(lua_State *L, int module);     /* collectives and work handles (lua_dist.c) */
void lem_open_random(lua_State *L, int methods, int module); /* issue 12: sampling, dropout, loss options (lua_random.c) */
void lem_open_tokenizer(lua_State *L, int module); /* byte-level BPE tokenizer userdata (lua_tokenizer.c) */
void lem_open_indexing(lua_State *L, int methods, int module); /* gather/scatter, masked_select, t[idx] (lua_indexing.c) */
void lem_open_sort(lua_State *L, int methods, int module); /* sorting, selection, scans (lua_sort.c) */
void lem_open_shape_math(lua_State *L, int methods, int module);   /* issue 12: shape & math ops (lua_shape_math.c) */

#endif
