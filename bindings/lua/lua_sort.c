/* Sorting and selection bindings (engine/ops/sort.c, engine/ops/scan.c):
 * sort, argsort, topk, kthvalue, median, cumsum, cumprod, unique, bincount
 * (methods and ember.NAME) and searchsorted (ember.searchsorted only, as
 * torch.searchsorted). Dims are 0-based; options go in a trailing table,
 * which may stand where an optional dim would: x:sort({descending=true}). */
#include <string.h>
#include "lua_ember.h"

static const char *const SORT_KEYS[] = {"descending", "stable", NULL};
static const char *const TOPK_KEYS[] = {"largest", "sorted", NULL};
static const char *const KEEPDIM_KEYS[] = {"keepdim", NULL};
static const char *const UNIQUE_KEYS[] = {"sorted", "return_inverse", "return_counts", NULL};
static const char *const BINCOUNT_KEYS[] = {"weights", "minlength", NULL};
static const char *const SEARCH_KEYS[] = {"right", "side", NULL};

/* An optional dim at idx (default def) followed by an options table; a
 * table at idx itself is the options. Sets *opts to the options' index (0: none). */
static int64_t dim_then_opts(lua_State *L, int idx, const char *fn, int64_t def, const char *const *keys, int *opts) {
  if (lua_istable(L, idx)) { *opts = lem_opts(L, idx, fn, keys); return def; }
  int64_t d = lem_opt_int(L, idx, fn, "dim", def);
  *opts = lem_opts(L, idx + 1, fn, keys);
  return d;
}

/* Push values and indices (or raise the engine error). */
static int push_pair(lua_State *L, em_tensor *v, em_tensor *idx) {
  if (!v) return lem_raise(L);
  lem_push_tensor(L, v);
  lem_push_tensor(L, idx);
  return 2;
}

static int l_sort(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self"), *idx = NULL;
  int o;
  int64_t d = dim_then_opts(L, 2, fn, -1, SORT_KEYS, &o);
  em_tensor *v = em_sort(a, d, lem_field_bool(L, o, fn, "descending", 0), lem_field_bool(L, o, fn, "stable", 0), &idx);
  return push_pair(L, v, idx);
}

static int l_argsort(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int o;
  int64_t d = dim_then_opts(L, 2, fn, -1, SORT_KEYS, &o);
  return lem_push_result(L, em_argsort(a, d, lem_field_bool(L, o, fn, "descending", 0),
                                       lem_field_bool(L, o, fn, "stable", 0)));
}

static int l_topk(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self"), *idx = NULL;
  int64_t k = lem_check_int(L, 2, fn, "k");
  int o;
  int64_t d = dim_then_opts(L, 3, fn, -1, TOPK_KEYS, &o);
  em_tensor *v = em_topk(a, k, d, lem_field_bool(L, o, fn, "largest", 1), lem_field_bool(L, o, fn, "sorted", 1), &idx);
  return push_pair(L, v, idx);
}

static int l_kthvalue(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self"), *idx = NULL;
  int64_t k = lem_check_int(L, 2, fn, "k");
  int o;
  int64_t d = dim_then_opts(L, 3, fn, -1, KEEPDIM_KEYS, &o);
  em_tensor *v = em_kthvalue(a, k, d, lem_field_bool(L, o, fn, "keepdim", 0), &idx);
  return push_pair(L, v, idx);
}

/* median(x) -> 0-d value; median(x, dim[, {keepdim}]) -> values, indices */
static int l_median(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self"), *idx = NULL;
  if (lua_isnoneornil(L, 2)) return lem_push_result(L, em_median(a, EM_ALL_DIMS, false, NULL));
  int64_t d = lem_check_int(L, 2, fn, "dim");
  int o = lem_opts(L, 3, fn, KEEPDIM_KEYS);
  em_tensor *v = em_median(a, d, lem_field_bool(L, o, fn, "keepdim", 0), &idx);
  return push_pair(L, v, idx);
}

static int l_cumsum(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  return lem_push_result(L, em_cumsum(a, lem_check_int(L, 2, fn, "dim")));
}

static int l_cumprod(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  return lem_push_result(L, em_cumprod(a, lem_check_int(L, 2, fn, "dim")));
}

/* unique(x[, {sorted, return_inverse, return_counts}]) -> values[, inverse][, counts] */
static int l_unique(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self"), *inv = NULL, *cnt = NULL;
  int o = lem_opts(L, 2, fn, UNIQUE_KEYS);
  if (!lua_isnoneornil(L, 2) && !o) lem_check_type(L, 2, fn, "options", LUA_TTABLE);
  int want_inv = lem_field_bool(L, o, fn, "return_inverse", 0), want_cnt = lem_field_bool(L, o, fn, "return_counts", 0);
  em_tensor *v = em_unique(a, lem_field_bool(L, o, fn, "sorted", 1), want_inv ? &inv : NULL, want_cnt ? &cnt : NULL);
  if (!v) return lem_raise(L);
  lem_push_tensor(L, v);
  if (want_inv) lem_push_tensor(L, inv);
  if (want_cnt) lem_push_tensor(L, cnt);
  return 1 + want_inv + want_cnt;
}

/* bincount(x[, weights][, minlength]) or bincount(x, {weights=, minlength=}) */
static int l_bincount(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self"), *w = NULL;
  int64_t minlength = 0;
  int o = lem_opts(L, 2, fn, BINCOUNT_KEYS);
  if (o) {
    w = lem_field_tensor(L, o, fn, "weights");
    minlength = (int64_t)lem_field_number(L, o, fn, "minlength", 0);
  } else {
    w = lem_opt_tensor(L, 2, fn, "weights");
    minlength = lem_opt_int(L, 3, fn, "minlength", 0);
  }
  return lem_push_result(L, em_bincount(a, w, minlength));
}

/* searchsorted(sorted_sequence, values[, {right=false, side="left"}]); values may be a number. */
static int l_searchsorted(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *seq = lem_check_tensor(L, 1, fn, "sorted_sequence");
  em_tensor *v = lem_test_tensor(L, 2, fn), *own = NULL;
  if (!v) {
    double x = lem_check_number(L, 2, fn, "values");
    if (!(own = v = em_scalar_tensor(x, seq->dtype, seq->device))) return lem_raise(L);
  }
  int o = lem_opts(L, 3, fn, SEARCH_KEYS);
  int right = lem_field_bool(L, o, fn, "right", 0);
  if (lem_field(L, o, fn, "side", LUA_TSTRING)) {
    const char *side = lua_tostring(L, -1);
    int is_right = strcmp(side, "right") == 0;
    if (!is_right && strcmp(side, "left") != 0) {
      em_tensor_release(own);
      return lem_error(L, fn, "expected option 'side' to be \"left\" or \"right\", got \"%s\"", side);
    }
    if (lem_field(L, o, fn, "right", LUA_TNONE) && lua_toboolean(L, -1) != is_right) {
      em_tensor_release(own);
      return lem_error(L, fn, "expected option 'side' to agree with 'right', got side=\"%s\" and right=%s", side,
                       right ? "true" : "false");
    }
    right = is_right;
  }
  em_tensor *r = em_searchsorted(seq, v, right);
  em_tensor_release(own);
  return lem_push_result(L, r);
}

void lem_open_sort(lua_State *L, int methods, int module) {
  static const luaL_Reg both[] = {
    {"sort", l_sort}, {"argsort", l_argsort}, {"topk", l_topk}, {"kthvalue", l_kthvalue}, {"median", l_median},
    {"cumsum", l_cumsum}, {"cumprod", l_cumprod}, {"unique", l_unique}, {"bincount", l_bincount}, {NULL, NULL}};
  lem_register(L, methods, module, both);
  static const luaL_Reg module_only[] = {{"searchsorted", l_searchsorted}, {NULL, NULL}};
  lem_register(L, 0, module, module_only);
}
