/* Indexing bindings: index_select, gather, scatter(_), scatter_add(_),
 * index_add(_), masked_select, nonzero, take_along_dim (methods and
 * ember.NAME), one_hot (module only; F.one_hot), and t[idx] for a tensor key.
 *
 * t[idx]: the tensor metatable's __index serves methods and fields
 * (lua_tensor.c). It is wrapped here, not edited: the wrapper looks methods
 * up first exactly as before (one rawget, so method calls cost the same),
 * sends a tensor key to methods.index (bindings/ember/indexing.lua) and
 * everything else to the original __index. */
#include <math.h>
#include "lua_ember.h"

static const char *const ALPHA_KEYS[] = {"alpha", NULL};
static const char *const NONZERO_KEYS[] = {"as_tuple", NULL};

static int l_index_select(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "self");
  int64_t dim = lem_check_int(L, 2, fn, "dim");
  return lem_push_result(L, em_index_select(x, dim, lem_check_tensor(L, 3, fn, "index")));
}

/* ember._index_wrap(x, dim, index[, shape]): em_index_select_wrap of the
 * flattened index, reshaped to shape, for t:index (bindings/ember/indexing.lua).
 * Flattening and reshaping here leaves no intermediate Lua handle holding the
 * gather's storage: with `local y <close> = t:index(...)` (bench_ops closes
 * every result) the block goes back to the caching allocator at once, where a
 * handle left to the Lua GC made each call cudaMalloc a fresh output (issue 12:
 * f32 t:index 3.6x index_select's time on the H200). */
static int l_index_wrap(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "self");
  int64_t dim = lem_check_int(L, 2, fn, "dim");
  em_tensor *index = lem_check_tensor(L, 3, fn, "index");
  if (lua_isnoneornil(L, 4)) return lem_push_result(L, em_index_select_wrap(x, dim, index));
  int64_t shape[EM_MAX_DIMS], flat = -1;
  int next, n = lem_check_shape(L, 4, fn, shape, &next);
  em_tensor *ix = em_reshape(index, 1, &flat);
  em_tensor *g = ix ? em_index_select_wrap(x, dim, ix) : NULL;
  em_tensor *out = g ? em_reshape(g, n, shape) : NULL;
  em_tensor_release(g);
  em_tensor_release(ix);
  return lem_push_result(L, out);
}

/* ember._embedding_bag(ids, w, offsets | nil, mean): em_embedding_bag (CUDA), for F.embedding_bag. */
static int l_embedding_bag(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *ids = lem_check_tensor(L, 1, fn, "ids"), *w = lem_check_tensor(L, 2, fn, "weight");
  em_tensor *offsets = lua_isnoneornil(L, 3) ? NULL : lem_check_tensor(L, 3, fn, "offsets");
  return lem_push_result(L, em_embedding_bag(ids, w, offsets, lua_toboolean(L, 4)));
}

static int l_gather(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "self");
  int64_t dim = lem_check_int(L, 2, fn, "dim");
  return lem_push_result(L, em_gather(x, dim, lem_check_tensor(L, 3, fn, "index")));
}

/* x:scatter(dim, index, src | value): in place returns x itself. */
static int scatter_impl(lua_State *L, bool inplace) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "self");
  int64_t dim = lem_check_int(L, 2, fn, "dim");
  em_tensor *index = lem_check_tensor(L, 3, fn, "index");
  em_tensor *src = lem_test_tensor(L, 4, fn);
  double value = 0;
  if (!src) {
    if (lua_type(L, 4) == LUA_TBOOLEAN) value = lua_toboolean(L, 4);
    else if (lua_type(L, 4) == LUA_TNUMBER) value = lua_tonumber(L, 4);
    else return lem_error(L, fn, "expected argument 4 (src) to be a tensor or a number, got %s", luaL_typename(L, 4));
  }
  em_tensor *r = em_scatter(x, dim, index, src, value, inplace);
  if (inplace && r) { em_tensor_release(r); lua_settop(L, 1); return 1; }
  return lem_push_result(L, r);
}
static int l_scatter(lua_State *L) { return scatter_impl(L, false); }
static int l_scatter_(lua_State *L) { return scatter_impl(L, true); }

static int scatter_add_impl(lua_State *L, bool inplace) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "self");
  int64_t dim = lem_check_int(L, 2, fn, "dim");
  em_tensor *index = lem_check_tensor(L, 3, fn, "index"), *src = lem_check_tensor(L, 4, fn, "src");
  em_tensor *r = em_scatter_add(x, dim, index, src, inplace);
  if (inplace && r) { em_tensor_release(r); lua_settop(L, 1); return 1; }
  return lem_push_result(L, r);
}
static int l_scatter_add(lua_State *L) { return scatter_add_impl(L, false); }
static int l_scatter_add_(lua_State *L) { return scatter_add_impl(L, true); }

/* x:index_add(dim, index, src[, alpha | {alpha = a}]) */
static int index_add_impl(lua_State *L, bool inplace) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "self");
  int64_t dim = lem_check_int(L, 2, fn, "dim");
  em_tensor *index = lem_check_tensor(L, 3, fn, "index"), *src = lem_check_tensor(L, 4, fn, "src");
  double alpha = lua_istable(L, 5) ? lem_field_number(L, lem_opts(L, 5, fn, ALPHA_KEYS), fn, "alpha", 1)
                                   : lem_opt_number(L, 5, fn, "alpha", 1);
  em_tensor *r = em_index_add(x, dim, index, src, alpha, inplace);
  if (inplace && r) { em_tensor_release(r); lua_settop(L, 1); return 1; }
  return lem_push_result(L, r);
}
static int l_index_add(lua_State *L) { return index_add_impl(L, false); }
static int l_index_add_(lua_State *L) { return index_add_impl(L, true); }

static int l_masked_select(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "self");
  return lem_push_result(L, em_masked_select(x, lem_check_tensor(L, 2, fn, "mask")));
}

/* x:nonzero() -> (N, ndim) i64; x:nonzero({as_tuple = true}) -> a list of ndim (N) tensors. */
static int l_nonzero(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "self");
  int as_tuple = lem_field_bool(L, lem_opts(L, 2, fn, NONZERO_KEYS), fn, "as_tuple", 0);
  em_tensor *nz = em_nonzero(x);
  if (!as_tuple || !nz) return lem_push_result(L, nz);
  lua_createtable(L, x->ndim, 0);
  for (int d = 0; d < x->ndim; d++) {
    em_tensor *col = em_select(nz, 1, d);
    if (!col) { em_tensor_release(nz); return lem_raise(L); }
    lem_push_tensor(L, col);
    lua_rawseti(L, -2, d + 1);
  }
  em_tensor_release(nz);
  return 1;
}

/* x:take_along_dim(indices[, dim]): no dim flattens both. */
static int l_take_along_dim(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "self"), *ix = lem_check_tensor(L, 2, fn, "indices");
  int64_t dim = lua_isnoneornil(L, 3) ? EM_ALL_DIMS : lem_check_int(L, 3, fn, "dim");
  return lem_push_result(L, em_take_along_dim(x, ix, dim));
}

/* one_hot(ids[, num_classes = -1]) */
static int l_one_hot(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *ids = lem_check_tensor(L, 1, fn, "input");
  return lem_push_result(L, em_one_hot(ids, lem_opt_int(L, 2, fn, "num_classes", -1)));
}

/* __index: upvalue 2 the methods, 3 the original __index. */
static int t_index_or_tensor_key(lua_State *L) {
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(2)) != LUA_TNIL) return 1;   /* methods first, as before */
  lua_pop(L, 1);
  if (lua_type(L, 2) == LUA_TUSERDATA && lem_test_tensor(L, 2, "index")) {
    lua_getfield(L, lua_upvalueindex(2), "index");                  /* methods.index(t, {key}) */
    lua_pushvalue(L, 1);
    lua_createtable(L, 1, 0);
    lua_pushvalue(L, 2);
    lua_rawseti(L, -2, 1);
    lua_call(L, 2, 1);
    return 1;
  }
  lua_pushvalue(L, lua_upvalueindex(3));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

void lem_open_indexing(lua_State *L, int methods, int module) {
  static const luaL_Reg both[] = {
    {"index_select", l_index_select}, {"gather", l_gather}, {"scatter", l_scatter}, {"scatter_", l_scatter_},
    {"scatter_add", l_scatter_add}, {"scatter_add_", l_scatter_add_}, {"index_add", l_index_add},
    {"index_add_", l_index_add_}, {"masked_select", l_masked_select}, {"nonzero", l_nonzero},
    {"take_along_dim", l_take_along_dim}, {NULL, NULL}};
  lem_register(L, methods, module, both);
  static const luaL_Reg module_only[] = {{"one_hot", l_one_hot}, {"_index_wrap", l_index_wrap},
                                               {"_embedding_bag", l_embedding_bag}, {NULL, NULL}};
  lem_register(L, 0, module, module_only);
  luaL_getmetatable(L, EM_TENSOR_MT);
  int mt = lua_gettop(L);
  lua_pushvalue(L, methods);
  lua_getfield(L, mt, "__index");
  lem_push_function(L, t_index_or_tensor_key, "Tensor", 2);
  lua_setfield(L, mt, "__index");
  lua_pop(L, 1);
}
