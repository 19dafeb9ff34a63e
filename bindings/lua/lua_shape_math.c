/* Bindings of the shape and math ops of issue 12: repeat (also `rep`: repeat
 * is a Lua keyword, so t:repeat(...) does not parse), tile, flip, roll, diag,
 * outer, einsum, baddbmm, prod, norm, amax, amin, lerp, addcmul(_),
 * addcdiv(_), isnan, isfinite. Every one is a tensor method and an
 * ember.NAME function, except einsum (ember.einsum only). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "lua_ember.h"

static const char *const KEEPDIM_KEYS[] = {"keepdim", NULL};
static const char *const ADDC_KEYS[] = {"value", "out", NULL};
static const char *const BADDBMM_KEYS[] = {"beta", "alpha", NULL};

/* Integers from idx: a table of them, or the integer arguments from idx on
 * (none: 0). *next = the first argument after them. */
static int int_list(lua_State *L, int idx, const char *fn, const char *what, int64_t *out, int *next) {
  int n = 0;
  if (lua_istable(L, idx) && luaL_len(L, idx) > 0) {
    n = (int)luaL_len(L, idx);
    if (n > EM_MAX_DIMS) lem_error(L, fn, "expected at most %d %s, got %d", EM_MAX_DIMS, what, n);
    for (int i = 0; i < n; i++) {
      lua_geti(L, idx, i + 1);
      int ok; out[i] = lua_tointegerx(L, -1, &ok);
      if (!ok) lem_error(L, fn, "expected %s to be integers, got %s at position %d", what, luaL_typename(L, -1), i + 1);
      lua_pop(L, 1);
    }
    *next = idx + 1;
    return n;
  }
  while (lua_type(L, idx + n) == LUA_TNUMBER) {
    if (n >= EM_MAX_DIMS) lem_error(L, fn, "expected at most %d %s", EM_MAX_DIMS, what);
    out[n] = lem_check_int(L, idx + n, fn, what);
    n++;
  }
  *next = idx + n;
  return n;
}

/* The options table at idx when the argument there is one with no array part. */
static int opts_at(lua_State *L, int idx, const char *fn, const char *const *keys) {
  if (lua_istable(L, idx) && luaL_len(L, idx) == 0) return lem_opts(L, idx, fn, keys);
  return 0;
}

/* ---------------- shape ops ---------------- */

static int l_repeat(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int64_t sizes[EM_MAX_DIMS]; int next;
  int n = int_list(L, 2, fn, "sizes", sizes, &next);
  return lem_push_result(L, em_repeat(a, n, sizes));
}

static int l_tile(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int64_t reps[EM_MAX_DIMS]; int next;
  int n = int_list(L, 2, fn, "reps", reps, &next);
  return lem_push_result(L, em_tile(a, n, reps));
}

static int l_flip(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int64_t dims[EM_MAX_DIMS]; int next;
  int n = int_list(L, 2, fn, "dims", dims, &next);
  if (n == 0) return lem_error(L, fn, "expected dims to flip (an integer or a table of integers), got %s",
                               luaL_typename(L, 2));
  return lem_push_result(L, em_flip(a, n, dims));
}

/* roll(x, shifts[, dims]): shifts and dims each an integer or a table. */
static int l_roll(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int64_t shifts[EM_MAX_DIMS], dims[EM_MAX_DIMS]; int next;
  if (lua_type(L, 2) != LUA_TNUMBER && !lua_istable(L, 2))
    return lem_error(L, fn, "expected shifts (an integer or a table of integers), got %s", luaL_typename(L, 2));
  int ns = lua_istable(L, 2) ? int_list(L, 2, fn, "shifts", shifts, &next) : 1;
  if (!lua_istable(L, 2)) shifts[0] = lem_check_int(L, 2, fn, "shifts");
  int nd = 0;
  if (lua_istable(L, 3)) nd = int_list(L, 3, fn, "dims", dims, &next);
  else if (!lua_isnoneornil(L, 3)) { dims[0] = lem_check_int(L, 3, fn, "dims"); nd = 1; }
  return lem_push_result(L, em_roll(a, ns, shifts, nd, dims));
}

static int l_diag(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  return lem_push_result(L, em_diag(a, lem_opt_int(L, 2, fn, "diagonal", 0)));
}

static int l_outer(lua_State *L) {
  const char *fn = lem_name(L);
  return lem_push_result(L, em_outer(lem_check_tensor(L, 1, fn, "self"), lem_check_tensor(L, 2, fn, "vec2")));
}

/* einsum(equation, a[, b]) or einsum(equation, {a, b}). */
static int l_einsum(lua_State *L) {
  const char *fn = lem_name(L);
  const char *eq = lem_check_string(L, 1, fn, "equation");
  if (lua_istable(L, 2) && !lem_test_tensor(L, 2, fn)) {
    em_tensor **ts;
    int n = lem_check_tensor_list(L, 2, fn, &ts);
    em_tensor *r = em_einsum(eq, n, ts);
    free(ts);
    return lem_push_result(L, r);
  }
  em_tensor *ops[2];
  int n = lua_gettop(L) - 1;
  if (n < 1 || n > 2) return lem_error(L, fn, "expected 1 or 2 operands after the equation, got %d", n < 0 ? 0 : n);
  for (int j = 0; j < n; j++) ops[j] = lem_check_tensor(L, 2 + j, fn, j == 0 ? "operand 0" : "operand 1");
  return lem_push_result(L, em_einsum(eq, n, ops));
}

static int l_baddbmm(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "self"), *b1 = lem_check_tensor(L, 2, fn, "batch1");
  em_tensor *b2 = lem_check_tensor(L, 3, fn, "batch2");
  int o = lem_opts(L, 4, fn, BADDBMM_KEYS);
  return lem_push_result(L, em_baddbmm(x, b1, b2, lem_field_number(L, o, fn, "beta", 1),
                                       lem_field_number(L, o, fn, "alpha", 1)));
}

/* ---------------- reductions ---------------- */

/* prod(x[, dim][, {keepdim}]) */
static int l_prod(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int64_t dim = lua_type(L, 2) == LUA_TNUMBER ? lem_check_int(L, 2, fn, "dim") : EM_ALL_DIMS;
  int o = opts_at(L, lua_type(L, 2) == LUA_TNUMBER ? 3 : 2, fn, KEEPDIM_KEYS);
  return lem_push_result(L, em_prod(a, dim, lem_field_bool(L, o, fn, "keepdim", 0)));
}

/* amax/amin(x[, dims][, {keepdim}]) with dims an integer or a table. */
static int amax_impl(lua_State *L, bool is_max) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int64_t dims[EM_MAX_DIMS]; int next;
  int nd = int_list(L, 2, fn, "dims", dims, &next);
  int o = opts_at(L, next, fn, KEEPDIM_KEYS);
  int kd = lem_field_bool(L, o, fn, "keepdim", 0);
  return lem_push_result(L, is_max ? em_amax(a, nd, dims, kd) : em_amin(a, nd, dims, kd));
}
static int l_amax(lua_State *L) { return amax_impl(L, true); }
static int l_amin(lua_State *L) { return amax_impl(L, false); }

/* norm(x[, p][, dims][, {keepdim}]): p a number (math.huge: inf), "inf" or
 * "fro" (2: the vector norm of the flattened dims); default 2. */
static int l_norm(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  double p = 2;
  int t2 = lua_type(L, 2), at = 3;
  if (t2 == LUA_TSTRING) {
    const char *s = lua_tostring(L, 2);
    if (strcmp(s, "inf") != 0 && strcmp(s, "fro") != 0)
      return lem_error(L, fn, "expected p to be a number, 'inf' or 'fro', got '%s'", s);
    p = s[0] == 'i' ? INFINITY : 2;
  } else if (t2 == LUA_TNUMBER) {
    p = lua_tonumber(L, 2);
  } else if (t2 == LUA_TTABLE) {
    at = 2;   /* norm(x, {keepdim = ...}) */
  } else if (t2 != LUA_TNONE && t2 != LUA_TNIL) {
    return lem_error(L, fn, "expected argument 2 (p) to be a number or 'inf', got %s", luaL_typename(L, 2));
  }
  int64_t dims[EM_MAX_DIMS];
  int nd = 0, next = at + 1;
  if (at == 3 && (lua_type(L, 3) == LUA_TNUMBER || (lua_istable(L, 3) && luaL_len(L, 3) > 0)))
    nd = int_list(L, 3, fn, "dims", dims, &next);
  else if (at == 3 && lua_istable(L, 3)) next = 3;
  else if (at == 2) next = 2;
  int o = opts_at(L, next, fn, KEEPDIM_KEYS);
  return lem_push_result(L, em_norm(a, p, nd, dims, lem_field_bool(L, o, fn, "keepdim", 0)));
}

/* ---------------- elementwise ---------------- */

static int l_lerp(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self"), *b = lem_check_tensor(L, 2, fn, "end");
  em_tensor *w = lem_test_tensor(L, 3, fn);
  if (!w && lua_type(L, 3) != LUA_TNUMBER)
    return lem_error(L, fn, "expected argument 3 (weight) to be a tensor or a number, got %s", luaL_typename(L, 3));
  return lem_push_result(L, em_lerp(a, b, w, w ? 0 : lua_tonumber(L, 3)));
}

static int addc_impl(lua_State *L, bool div, bool inplace) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "self"), *t1 = lem_check_tensor(L, 2, fn, "tensor1");
  em_tensor *t2 = lem_check_tensor(L, 3, fn, "tensor2");
  int o = lem_opts(L, 4, fn, ADDC_KEYS);
  double v = lem_field_number(L, o, fn, "value", 1);
  em_tensor *out = inplace ? x : lem_field_tensor(L, o, fn, "out");
  if (inplace && o && lem_field_tensor(L, o, fn, "out"))
    return lem_error(L, fn, "the in-place form takes no out= (it writes into self)");
  return lem_push_result(L, div ? em_addcdiv(x, t1, t2, v, out) : em_addcmul(x, t1, t2, v, out));
}
static int l_addcmul(lua_State *L) { return addc_impl(L, false, false); }
static int l_addcmul_(lua_State *L) { return addc_impl(L, false, true); }
static int l_addcdiv(lua_State *L) { return addc_impl(L, true, false); }
static int l_addcdiv_(lua_State *L) { return addc_impl(L, true, true); }

static int l_isnan(lua_State *L) { return lem_push_result(L, em_isnan(lem_check_tensor(L, 1, lem_name(L), "self"))); }
static int l_isfinite(lua_State *L) {
  return lem_push_result(L, em_isfinite(lem_check_tensor(L, 1, lem_name(L), "self")));
}

void lem_open_shape_math(lua_State *L, int methods, int module) {
  static const luaL_Reg both[] = {
    {"repeat", l_repeat}, {"rep", l_repeat}, {"tile", l_tile}, {"flip", l_flip}, {"roll", l_roll},
    {"diag", l_diag}, {"outer", l_outer}, {"baddbmm", l_baddbmm}, {"prod", l_prod}, {"norm", l_norm},
    {"amax", l_amax}, {"amin", l_amin}, {"lerp", l_lerp}, {"addcmul", l_addcmul}, {"addcmul_", l_addcmul_},
    {"addcdiv", l_addcdiv}, {"addcdiv_", l_addcdiv_}, {"isnan", l_isnan}, {"isfinite", l_isfinite},
    {NULL, NULL}};
  lem_register(L, methods, module, both);
  static const luaL_Reg module_only[] = {{"einsum", l_einsum}, {NULL, NULL}};
  lem_register(L, 0, module, module_only);
}
