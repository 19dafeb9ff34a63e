/* Math bindings: elementwise (with in-place twins, out= and operators),
 * reductions, matmul, the functional NN ops, random fills, optimizer kernels. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "lua_ember.h"

static const char *const OUT_KEYS[] = {"out", NULL};
static const char *const KEEPDIM_KEYS[] = {"keepdim", NULL};
static const char *const VAR_KEYS[] = {"correction", "keepdim", NULL};

static double scalar_arg(lua_State *L, int idx, const char *fn) {
  if (lua_type(L, idx) == LUA_TNUMBER) return lua_tonumber(L, idx);
  if (lua_type(L, idx) == LUA_TBOOLEAN) return lua_toboolean(L, idx);
  lem_error(L, fn, "expected argument %d to be a tensor or a number, got %s", idx, luaL_typename(L, idx));
  return 0;
}

/* a OP b where either side may be a number; out from opts or in-place. */
static int binop(lua_State *L, em_binop op, int inplace) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_test_tensor(L, 1, fn), *b = lem_test_tensor(L, 2, fn), *out = NULL;
  int opts = lem_opts(L, 3, fn, OUT_KEYS);
  if (opts) out = lem_field_tensor(L, opts, fn, "out");
  if (inplace) {
    if (!a) return lem_error(L, fn, "expected argument 1 (self) to be a tensor, got %s", luaL_typename(L, 1));
    out = a;
  }
  em_tensor *r;
  if (a && b) r = em_binary(op, a, b, out);
  else if (a) r = em_binary_scalar(op, a, scalar_arg(L, 2, fn), false, out);
  else if (b) r = em_binary_scalar(op, b, scalar_arg(L, 1, fn), true, out);
  else return lem_error(L, fn, "expected a tensor operand, got %s and %s", luaL_typename(L, 1), luaL_typename(L, 2));
  return inplace ? lem_push_result_at(L, r, 1, a) : lem_push_result(L, r);
}

#define BIN(name, OP) \
  static int lf_##name(lua_State *L) { return binop(L, OP, 0); } \
  static int lf_##name##_(lua_State *L) { return binop(L, OP, 1); }
BIN(add, EM_ADD) BIN(sub, EM_SUB) BIN(mul, EM_MUL) BIN(div, EM_DIV) BIN(pow, EM_POW)
BIN(maximum, EM_MAXIMUM) BIN(minimum, EM_MINIMUM) BIN(eq, EM_EQ) BIN(ne, EM_NE) BIN(lt, EM_LT)
BIN(le, EM_LE) BIN(gt, EM_GT) BIN(ge, EM_GE) BIN(logical_and, EM_LOGICAL_AND) BIN(logical_or, EM_LOGICAL_OR)

static int unop(lua_State *L, em_unop op, int inplace) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self"), *out = inplace ? a : NULL;
  int opts = lem_opts(L, 2, fn, OUT_KEYS);
  if (opts && !inplace) out = lem_field_tensor(L, opts, fn, "out");
  return lem_push_result_at(L, em_unary(op, a, out), 1, inplace ? a : NULL);
}
#define UN(name, OP) \
  static int lf_##name(lua_State *L) { return unop(L, OP, 0); } \
  static int lf_##name##_(lua_State *L) { return unop(L, OP, 1); }
UN(neg, EM_NEG) UN(abs, EM_ABS) UN(sqrt, EM_SQRT) UN(rsqrt, EM_RSQRT) UN(exp, EM_EXP) UN(log, EM_LOG)
UN(tanh, EM_TANH) UN(sigmoid, EM_SIGMOID) UN(silu, EM_SILU) UN(relu, EM_RELU) UN(gelu, EM_GELU)
UN(sin, EM_SIN) UN(cos, EM_COS) UN(square, EM_SQUARE) UN(reciprocal, EM_RECIPROCAL) UN(sign, EM_SIGN)
UN(logical_not, EM_LOGICAL_NOT) UN(floor, EM_FLOOR) UN(ceil, EM_CEIL) UN(round, EM_ROUND)

static int mm_unm(lua_State *L) { return lem_push_result(L, em_unary(EM_NEG, lem_check_tensor(L, 1, lem_name(L), "self"), NULL)); }

static int clamp_impl(lua_State *L, int inplace) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  double lo = lem_opt_number(L, 2, fn, "min", NAN), hi = lem_opt_number(L, 3, fn, "max", NAN);
  if (!isnan(lo) && !isnan(hi) && lo > hi) return lem_error(L, fn, "expected min <= max, got min=%g max=%g", lo, hi);
  return lem_push_result_at(L, em_clamp(a, lo, hi, inplace ? a : NULL), 1, inplace ? a : NULL);
}
static int lf_clamp(lua_State *L) { return clamp_impl(L, 0); }
static int lf_clamp_(lua_State *L) { return clamp_impl(L, 1); }

/* where(cond, a, b): a/b may be numbers (become 0-d tensors of the other's dtype). */
static em_tensor *tensor_or_scalar(lua_State *L, int idx, const char *fn, em_tensor *like) {
  em_tensor *t = lem_test_tensor(L, idx, fn);
  if (t) return em_tensor_retain(t);
  double v = scalar_arg(L, idx, fn);
  em_dtype dt = like ? like->dtype : (v == floor(v) ? EM_I64 : EM_F32);
  if (like && !em_dtype_is_float(dt) && v != floor(v)) dt = EM_F32;
  return em_scalar_tensor(v, dt, like ? like->device : em_cpu());
}
static int l_where(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *c = lem_check_tensor(L, 1, fn, "condition");
  em_tensor *ta = lem_test_tensor(L, 2, fn), *tb = lem_test_tensor(L, 3, fn);
  em_tensor *a = tensor_or_scalar(L, 2, fn, tb);
  em_tensor *b = tensor_or_scalar(L, 3, fn, ta ? ta : a);
  em_tensor *r = (a && b) ? em_where(c, a, b) : NULL;
  em_tensor_release(a); em_tensor_release(b);
  return lem_push_result(L, r);
}

static int masked_fill_impl(lua_State *L, int inplace) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self"), *m = lem_check_tensor(L, 2, fn, "mask");
  em_tensor *self = inplace ? a : NULL;
  return lem_push_result_at(L, em_masked_fill(a, m, scalar_arg(L, 3, fn), self), 1, self);
}
static int lf_masked_fill(lua_State *L) { return masked_fill_impl(L, 0); }
static int lf_masked_fill_(lua_State *L) { return masked_fill_impl(L, 1); }
static int l_triu(lua_State *L) {
  const char *fn = lem_name(L);
  return lem_push_result(L, em_triu(lem_check_tensor(L, 1, fn, "self"), lem_opt_int(L, 2, fn, "diagonal", 0)));
}
static int l_tril(lua_State *L) {
  const char *fn = lem_name(L);
  return lem_push_result(L, em_tril(lem_check_tensor(L, 1, fn, "self"), lem_opt_int(L, 2, fn, "diagonal", 0)));
}

/* ---------------- reductions ---------------- */

/* dims from arg idx: nil/none/options table -> all dims; an integer; a list of integers. */
static int read_dims(lua_State *L, int idx, const char *fn, int64_t *dims) {
  int tp = lua_type(L, idx);
  if (tp == LUA_TNONE || tp == LUA_TNIL) return 0;
  if (tp == LUA_TNUMBER) { dims[0] = lem_check_int(L, idx, fn, "dim"); return 1; }
  if (tp != LUA_TTABLE)
    return lem_error(L, fn, "expected dim to be an integer or a table of integers, got %s", luaL_typename(L, idx));
  int n = (int)luaL_len(L, idx);     /* 0: an options table */
  if (n > EM_MAX_DIMS) lem_error(L, fn, "too many dims (%d)", n);
  for (int i = 0; i < n; i++) {
    lua_geti(L, idx, i + 1);
    int ok; dims[i] = lua_tointegerx(L, -1, &ok);
    if (!ok) lem_error(L, fn, "expected dims to be integers, got %s", luaL_typename(L, -1));
    lua_pop(L, 1);
  }
  return n;
}

/* The options table is the last table argument that is not a dims list. */
static int reduce_opts(lua_State *L, int from, const char *fn, const char *const *keys) {
  for (int i = lua_gettop(L); i >= from; i--)
    if (lua_istable(L, i) && luaL_len(L, i) == 0) return lem_opts(L, i, fn, keys);
  return 0;
}

static int l_sum(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int64_t dims[EM_MAX_DIMS]; int nd = read_dims(L, 2, fn, dims);
  int kd = lem_field_bool(L, reduce_opts(L, 2, fn, KEEPDIM_KEYS), fn, "keepdim", 0);
  return lem_push_result(L, em_sum(a, nd, dims, kd));
}
static int l_mean(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int64_t dims[EM_MAX_DIMS]; int nd = read_dims(L, 2, fn, dims);
  int kd = lem_field_bool(L, reduce_opts(L, 2, fn, KEEPDIM_KEYS), fn, "keepdim", 0);
  return lem_push_result(L, em_mean(a, nd, dims, kd));
}
static int l_var(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int64_t dims[EM_MAX_DIMS]; int nd = read_dims(L, 2, fn, dims);
  int o = reduce_opts(L, 2, fn, VAR_KEYS);
  return lem_push_result(L, em_var(a, nd, dims, lem_field_number(L, o, fn, "correction", 1),
                                   lem_field_bool(L, o, fn, "keepdim", 0)));
}
static int l_std(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int64_t dims[EM_MAX_DIMS]; int nd = read_dims(L, 2, fn, dims);
  int o = reduce_opts(L, 2, fn, VAR_KEYS);
  em_tensor *v = em_var(a, nd, dims, lem_field_number(L, o, fn, "correction", 1), lem_field_bool(L, o, fn, "keepdim", 0));
  if (!v) return lem_raise(L);
  em_tensor *s = em_unary(EM_SQRT, v, NULL);
  em_tensor_release(v);
  return lem_push_result(L, s);
}

static int minmax(lua_State *L, int is_max) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  em_tensor *b = lem_test_tensor(L, 2, fn);
  if (b) return lem_push_result(L, em_binary(is_max ? EM_MAXIMUM : EM_MINIMUM, a, b, NULL));
  if (lua_isnoneornil(L, 2) || lem_opts(L, 2, fn, KEEPDIM_KEYS)) {
    return lem_push_result(L, is_max ? em_max(a, EM_ALL_DIMS, false, NULL) : em_min(a, EM_ALL_DIMS, false, NULL));
  }
  int64_t d = lem_check_int(L, 2, fn, "dim");
  int kd = lem_field_bool(L, lem_opts(L, 3, fn, KEEPDIM_KEYS), fn, "keepdim", 0);
  em_tensor *idx = NULL;
  em_tensor *v = is_max ? em_max(a, d, kd, &idx) : em_min(a, d, kd, &idx);
  if (!v) return lem_raise(L);
  lem_push_tensor(L, v);
  lem_push_tensor(L, idx);
  return 2;
}
static int l_max(lua_State *L) { return minmax(L, 1); }
static int l_min(lua_State *L) { return minmax(L, 0); }

static int argminmax(lua_State *L, int is_max) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int64_t d = lua_istable(L, 2) ? EM_ALL_DIMS : lem_opt_int(L, 2, fn, "dim", EM_ALL_DIMS);
  int kd = lem_field_bool(L, reduce_opts(L, 2, fn, KEEPDIM_KEYS), fn, "keepdim", 0);
  return lem_push_result(L, is_max ? em_argmax(a, d, kd) : em_argmin(a, d, kd));
}
static int l_argmax(lua_State *L) { return argminmax(L, 1); }
static int l_argmin(lua_State *L) { return argminmax(L, 0); }

static int l_logsumexp(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  int64_t d = lem_check_int(L, 2, fn, "dim");
  return lem_push_result(L, em_logsumexp(a, d, lem_field_bool(L, lem_opts(L, 3, fn, KEEPDIM_KEYS), fn, "keepdim", 0)));
}
static int l_softmax(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  return lem_push_result(L, em_softmax(a, lem_opt_int(L, 2, fn, "dim", -1)));
}
static int l_log_softmax(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *a = lem_check_tensor(L, 1, fn, "self");
  return lem_push_result(L, em_log_softmax(a, lem_opt_int(L, 2, fn, "dim", -1)));
}

/* ---------------- matmul and NN ops ---------------- */

static int l_matmul(lua_State *L) {
  const char *fn = lem_name(L);
  return lem_push_result(L, em_matmul(lem_check_tensor(L, 1, fn, "self"), lem_check_tensor(L, 2, fn, "other")));
}
static int l_linear(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "input"), *w = lem_check_tensor(L, 2, fn, "weight");
  em_tensor *b = lem_opt_tensor(L, 3, fn, "bias");
  return lem_push_result(L, em_linear(x, w, b));
}
static int l_embedding(lua_State *L) {
  const char *fn = lem_name(L);
  return lem_push_result(L, em_embedding(lem_check_tensor(L, 1, fn, "input"), lem_check_tensor(L, 2, fn, "weight")));
}
static int l_cross_entropy(lua_State *L) {
  const char *fn = lem_name(L);
  return lem_push_result(L, em_cross_entropy(lem_check_tensor(L, 1, fn, "input"),
                                             lem_check_tensor(L, 2, fn, "target")));
}
static int l_rmsnorm(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "input");
  em_tensor *w = lem_opt_tensor(L, 2, fn, "weight");
  double eps = lem_opt_number(L, 3, fn, "eps", 1e-5);
  em_dtype od = lua_isnoneornil(L, 4) ? EM_NDTYPES : lem_field_dtype(L, 4, fn, "out_dtype", EM_NDTYPES);
  return lem_push_result(L, em_rmsnorm_out(x, w, eps, od));
}
static int l_norm_out16(lua_State *L) {
  lua_pushboolean(L, em_norm_out16());
  return 1;
}
static int l_add_rmsnorm(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "x"), *r = lem_check_tensor(L, 2, fn, "r");
  em_tensor *w = lem_opt_tensor(L, 3, fn, "weight"), *s, *y;
  double eps = lem_opt_number(L, 4, fn, "eps", 1e-5);
  em_dtype od = lua_isnoneornil(L, 5) ? EM_NDTYPES : lem_field_dtype(L, 5, fn, "out_dtype", EM_NDTYPES);
  if (em_add_rmsnorm_out(x, r, w, eps, od, &s, &y)) return lem_push_result(L, NULL);
  lem_push_result(L, s);
  return 1 + lem_push_result(L, y);
}
static int l_layer_norm(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "input");
  em_tensor *w = lem_opt_tensor(L, 2, fn, "weight"), *b = lem_opt_tensor(L, 3, fn, "bias");
  return lem_push_result(L, em_layer_norm(x, w, b, lem_opt_number(L, 4, fn, "eps", 1e-5)));
}
static int l_rope(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "input"), *p = lem_check_tensor(L, 2, fn, "positions");
  return lem_push_result(L, em_rope(x, p, lem_opt_number(L, 3, fn, "theta", 10000.0)));
}
static int l_rope_qk(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *q = lem_check_tensor(L, 1, fn, "q"), *k = lem_check_tensor(L, 2, fn, "k");
  em_tensor *p = lem_check_tensor(L, 3, fn, "positions"), *qo, *ko;
  if (em_rope_qk(q, k, p, lem_opt_number(L, 4, fn, "theta", 10000.0), &qo, &ko)) return lem_push_result(L, NULL);
  lem_push_result(L, qo);
  return 1 + lem_push_result(L, ko);
}
static int l_swiglu(lua_State *L) {
  const char *fn = lem_name(L);
  return lem_push_result(L, em_swiglu(lem_check_tensor(L, 1, fn, "a"), lem_check_tensor(L, 2, fn, "b")));
}
/* A causal argument: nil/false (none), true or "top_left" (PyTorch's
 * is_causal), "bottom_right" (aligned to the end of the keys). */
static em_causal check_causal(lua_State *L, int idx, const char *fn) {
  int t = lua_type(L, idx);
  if (t == LUA_TNONE || t == LUA_TNIL) return EM_CAUSAL_NONE;
  if (t == LUA_TBOOLEAN) return lua_toboolean(L, idx) ? EM_CAUSAL_TOP_LEFT : EM_CAUSAL_NONE;
  if (t == LUA_TSTRING) {
    const char *s = lua_tostring(L, idx);
    if (strcmp(s, "top_left") == 0) return EM_CAUSAL_TOP_LEFT;
    if (strcmp(s, "bottom_right") == 0) return EM_CAUSAL_BOTTOM_RIGHT;
    lem_error(L, fn, "expected causal true, false, 'top_left' or 'bottom_right', got '%s'", s);
  }
  lem_error(L, fn, "expected causal true, false, 'top_left' or 'bottom_right', got %s", luaL_typename(L, idx));
  return EM_CAUSAL_NONE;
}

static int l_attention_naive(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *q = lem_check_tensor(L, 1, fn, "q"), *k = lem_check_tensor(L, 2, fn, "k");
  em_tensor *v = lem_check_tensor(L, 3, fn, "v");
  return lem_push_result(L, em_attention_naive(q, k, v, check_causal(L, 4, fn), lem_opt_number(L, 5, fn, "scale", 0)));
}

static int l_attention(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *q = lem_check_tensor(L, 1, fn, "q"), *k = lem_check_tensor(L, 2, fn, "k");
  em_tensor *v = lem_check_tensor(L, 3, fn, "v");
  return lem_push_result(L, em_attention(q, k, v, check_causal(L, 4, fn), lem_opt_number(L, 5, fn, "scale", 0)));
}
/* core.flash_attention(q, k, v, causal[, scale]) -> o, lse */
static int l_flash_attention(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *q = lem_check_tensor(L, 1, fn, "q"), *k = lem_check_tensor(L, 2, fn, "k");
  em_tensor *v = lem_check_tensor(L, 3, fn, "v"), *lse = NULL;
  em_tensor *o = em_flash_attention(q, k, v, check_causal(L, 4, fn),
                                    lem_opt_number(L, 5, fn, "scale", 0), &lse);
  if (!o) return lem_push_result(L, NULL);
  lem_push_result(L, o);
  lem_push_result(L, lse);
  return 2;
}
/* core.flash_attention_rope(q, k, v, causal, scale, pos, theta) -> o, lse */
static int l_flash_attention_rope(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *q = lem_check_tensor(L, 1, fn, "q"), *k = lem_check_tensor(L, 2, fn, "k");
  em_tensor *v = lem_check_tensor(L, 3, fn, "v"), *p = lem_check_tensor(L, 6, fn, "rope.pos"), *lse = NULL;
  em_tensor *o = em_flash_attention_rope(q, k, v, check_causal(L, 4, fn), lem_opt_number(L, 5, fn, "scale", 0), p,
                                         lem_opt_number(L, 7, fn, "rope.theta", 10000.0), &lse);
  if (!o) return lem_push_result(L, NULL);
  lem_push_result(L, o);
  lem_push_result(L, lse);
  return 2;
}
/* core.flash_decode(q, k_cache, v_cache, n_keys[, scale]) -> o */
static int l_flash_decode(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *q = lem_check_tensor(L, 1, fn, "q"), *k = lem_check_tensor(L, 2, fn, "k_cache");
  em_tensor *v = lem_check_tensor(L, 3, fn, "v_cache"), *n = lem_check_tensor(L, 4, fn, "n_keys");
  return lem_push_result(L, em_flash_decode(q, k, v, n, lem_opt_number(L, 5, fn, "scale", 0)));
}
/* core.flash_applies(q, k, v) -> boolean: em_attention (impl "auto") takes the
 * flash path for these inputs (under the current autocast state) */
static int l_flash_applies(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *q = lem_check_tensor(L, 1, fn, "q"), *k = lem_check_tensor(L, 2, fn, "k");
  lua_pushboolean(L, em_flash_applies(q, k, lem_check_tensor(L, 3, fn, "v")));
  return 1;
}
/* core.flash_limits() -> {decode_max_tq, cpu_min_tk}: the thresholds of the
 * implementation choice (ember/ops.h), for ember.flash_support's matrix */
static int l_flash_limits(lua_State *L) {
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, EM_FLASH_DECODE_MAX_TQ);
  lua_setfield(L, -2, "decode_max_tq");
  lua_pushinteger(L, EM_FLASH_CPU_MIN_TK);
  lua_setfield(L, -2, "cpu_min_tk");
  return 1;
}
/* core.flash_cpu_tiles([bq, bk]) -> bq, bk: the CPU tile sizes for head dim
 * 64; with arguments, force them for every head dim first (tests: several
 * tiles at small T; 0, 0 restores the defaults). */
static int l_flash_cpu_tiles(lua_State *L) {
  const char *fn = lem_name(L);
  if (!lua_isnoneornil(L, 1)) {
    int64_t bq = lem_opt_int(L, 1, fn, "bq", 0), bk = lem_opt_int(L, 2, fn, "bk", 0);
    if (bq < 0 || bk < 0 || bq > 4096 || bk > 4096 || (bq == 0) != (bk == 0))
      return lem_error(L, fn, "expected tile sizes in [1, 4096] (or 0, 0 for the defaults), got %lld and %lld",
                       (long long)bq, (long long)bk);
    em_flash_cpu_set_tiles((int)bq, (int)bk);
  }
  int bq, bk;
  em_flash_cpu_tiles(64, &bq, &bk);
  lua_pushinteger(L, bq);
  lua_pushinteger(L, bk);
  return 2;
}

/* core.flash_fwd_kernel([name]) -> previous name: the CUDA forward kernel
 * for more than 16 queries, "auto", "mma", "wg", "wg2" or "wg3" (docs/flash.md; the
 * default is EMBER_FLASH_FWD's). Lets a spec run every kernel on one input. */
static int l_flash_fwd_kernel(lua_State *L) {
  static const char *names[] = {"auto", "mma", "wg", "wg2", "wg3"};
  const char *fn = lem_name(L);
  int mode = -1;
  if (!lua_isnoneornil(L, 1)) {
    const char *s = luaL_checkstring(L, 1);
    for (int i = 0; i < 5; i++)
      if (strcmp(s, names[i]) == 0) mode = i;
    if (mode < 0) return lem_error(L, fn, "expected \"auto\", \"mma\", \"wg\", \"wg2\" or \"wg3\", got \"%s\"", s);
  }
  int prev = em_flash_fwd_choice(mode);
  if (prev < 0) return lem_raise(L);
  lua_pushstring(L, names[prev]);
  return 1;
}

/* core.flash_bwd_kernel([name]) -> previous name: the CUDA backward
 * kernels, "auto", "mma", "wg", "wg2", "fused" or "fused_nd" (docs/flash.md,
 * "Step 4", "Step 4b" and "Step 5"; the default is EMBER_FLASH_BWD's). Lets a
 * spec run several backwards on one input. */
static int l_flash_bwd_kernel(lua_State *L) {
  static const char *names[] = {"auto", "mma", "wg", "wg2", "fused", "fused_nd"};
  const char *fn = lem_name(L);
  int mode = -1;
  if (!lua_isnoneornil(L, 1)) {
    const char *s = luaL_checkstring(L, 1);
    for (int i = 0; i < 6; i++)
      if (strcmp(s, names[i]) == 0) mode = i;
    if (mode < 0)
      return lem_error(L, fn, "expected \"auto\", \"mma\", \"wg\", \"wg2\", \"fused\" or \"fused_nd\", got \"%s\"", s);
  }
  int prev = em_flash_bwd_choice(mode);
  if (prev < 0) return lem_raise(L);
  lua_pushstring(L, names[prev]);
  return 1;
}

static int l_cat_stack(lua_State *L, int stack) {
  const char *fn = lem_name(L);
  em_tensor **ts;
  int n = lem_check_tensor_list(L, 1, fn, &ts);
  int64_t d = lem_opt_int(L, 2, fn, "dim", 0);
  em_tensor *r = stack ? em_stack(n, ts, d) : em_cat(n, ts, d);
  free(ts);
  return lem_push_result(L, r);
}
static int l_cat(lua_State *L) { return l_cat_stack(L, 0); }
static int l_stack(lua_State *L) { return l_cat_stack(L, 1); }

/* ---------------- random ---------------- */

static int l_manual_seed(lua_State *L) {
  const char *fn = lem_name(L);
  em_manual_seed((uint64_t)lem_check_int(L, 1, fn, "seed"));
  return 0;
}
static int l_get_rng_state(lua_State *L) {
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, (lua_Integer)em_rng_seed()); lua_setfield(L, -2, "seed");
  lua_pushinteger(L, (lua_Integer)em_rng_offset()); lua_setfield(L, -2, "offset");
  return 1;
}
static int l_set_rng_state(lua_State *L) {
  const char *fn = lem_name(L);
  lem_check_type(L, 1, fn, "state", LUA_TTABLE);
  lua_getfield(L, 1, "seed"); lua_getfield(L, 1, "offset");
  if (!lua_isinteger(L, -2) || !lua_isinteger(L, -1))
    return lem_error(L, fn, "expected a table {seed = integer, offset = integer} (from get_rng_state)");
  em_rng_set_state((uint64_t)lua_tointeger(L, -2), (uint64_t)lua_tointeger(L, -1));
  return 0;
}
static int fill_random(lua_State *L, int kind) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  int rc;
  double a = lem_opt_number(L, 2, fn, kind == 0 ? "from" : "mean", 0);
  double b = lem_opt_number(L, 3, fn, kind == 0 ? "to" : "std", 1);
  if (kind == 0) rc = em_uniform_(t, a, b);
  else if (kind == 1) rc = em_normal_(t, a, b);
  else rc = em_trunc_normal_(t, a, b, lem_opt_number(L, 4, fn, "a", -2), lem_opt_number(L, 5, fn, "b", 2));
  if (rc) return lem_raise(L);
  lua_settop(L, 1);
  return 1;
}
static int l_uniform_(lua_State *L) { return fill_random(L, 0); }
static int l_normal_(lua_State *L) { return fill_random(L, 1); }
static int l_trunc_normal_(lua_State *L) { return fill_random(L, 2); }

/* ---------------- optimizer kernels ---------------- */

static int l_adamw_(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor **p, **g, **m, **v;
  int n = lem_check_tensor_list(L, 1, fn, &p);
  int n2 = lua_isnil(L, 2) ? lem_grads_of(L, fn, n, p, &g) : lem_check_tensor_list(L, 2, fn, &g);
  int n3 = lem_check_tensor_list(L, 3, fn, &m);
  int n4 = lem_check_tensor_list(L, 4, fn, &v);
  int rc = -1;
  if (n != n2 || n != n3 || n != n4) em_error("%s: expected lists of equal length, got %d, %d, %d, %d", fn, n, n2, n3, n4);
  else rc = em_adamw_(n, p, g, m, v, lem_check_number(L, 5, fn, "lr"), lem_check_number(L, 6, fn, "beta1"),
                      lem_check_number(L, 7, fn, "beta2"), lem_check_number(L, 8, fn, "eps"),
                      lem_check_number(L, 9, fn, "weight_decay"), lem_check_int(L, 10, fn, "step"));
  free(p); free(g); free(m); free(v);
  if (rc) return lem_raise(L);
  return 0;
}
/* core.shadow_weights_(p, on): allow (true) or drop and forbid (false) p's shadow weight. */
static int l_shadow_weights_(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "tensor");
  luaL_checktype(L, 2, LUA_TBOOLEAN);
  if (em_shadow_weights_(t, lua_toboolean(L, 2))) return lem_raise(L);
  return 0;
}
/* core.shadow_weight(p): a copy of p's current shadow weight (what AdamW
 * wrote and autocast reads; a copy, so that nothing can write the original),
 * or nil when p has none or it is stale. */
static int l_shadow_weight(lua_State *L) {
  em_tensor *s = em_shadow_weight(lem_check_tensor(L, 1, lem_name(L), "tensor"));
  if (!s) { lua_pushnil(L); return 1; }
  bool g = em_set_grad_enabled(false);
  em_tensor *c = em_clone(s);
  em_set_grad_enabled(g);
  return lem_push_result(L, c);
}
static int l_sgd_(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor **p, **g, **b = NULL;
  int n = lem_check_tensor_list(L, 1, fn, &p);
  int n2 = lua_isnil(L, 2) ? lem_grads_of(L, fn, n, p, &g) : lem_check_tensor_list(L, 2, fn, &g), n3 = n;
  if (!lua_isnoneornil(L, 3)) n3 = lem_check_tensor_list(L, 3, fn, &b);
  int rc = -1;
  if (n != n2 || n != n3) em_error("%s: expected lists of equal length, got %d, %d, %d", fn, n, n2, n3);
  else rc = em_sgd_(n, p, g, b, lem_check_number(L, 4, fn, "lr"), lem_opt_number(L, 5, fn, "momentum", 0),
                    lem_opt_number(L, 6, fn, "weight_decay", 0), lua_toboolean(L, 7));
  free(p); free(g); free(b);
  if (rc) return lem_raise(L);
  return 0;
}
static int l_sum_of_squares(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor **ts;
  int n = lem_check_tensor_list(L, 1, fn, &ts);
  em_tensor *r = em_sum_of_squares(n, ts);
  free(ts);
  return lem_push_result(L, r);
}

void lem_open_math(lua_State *L, int methods, int module) {
  static const luaL_Reg both[] = {
#define B(n) {#n, lf_##n}, {#n "_", lf_##n##_}
    B(add), B(sub), B(mul), B(div), B(pow), B(maximum), B(minimum), B(eq), B(ne), B(lt), B(le), B(gt), B(ge),
    B(logical_and), B(logical_or), B(neg), B(abs), B(sqrt), B(rsqrt), B(exp), B(log), B(tanh), B(sigmoid),
    B(silu), B(relu), B(gelu), B(sin), B(cos), B(square), B(reciprocal), B(sign), B(logical_not), B(floor),
    B(ceil), B(round), B(clamp), B(masked_fill),
#undef B
    {"where", l_where}, {"triu", l_triu}, {"tril", l_tril},
    {"sum", l_sum}, {"mean", l_mean}, {"var", l_var}, {"std", l_std}, {"max", l_max}, {"min", l_min},
    {"argmax", l_argmax}, {"argmin", l_argmin}, {"logsumexp", l_logsumexp}, {"softmax", l_softmax},
    {"log_softmax", l_log_softmax}, {"matmul", l_matmul},
    {"uniform_", l_uniform_}, {"normal_", l_normal_}, {"trunc_normal_", l_trunc_normal_}, {NULL, NULL}};
  lem_register(L, methods, module, both);
  static const luaL_Reg module_only[] = {
    {"linear", l_linear}, {"embedding", l_embedding}, {"cross_entropy", l_cross_entropy},
    {"rmsnorm", l_rmsnorm}, {"add_rmsnorm", l_add_rmsnorm}, {"norm_out16", l_norm_out16}, {"layer_norm", l_layer_norm}, {"rope", l_rope}, {"rope_qk", l_rope_qk}, {"swiglu", l_swiglu}, {"attention_naive", l_attention_naive},
    {"attention", l_attention}, {"flash_attention", l_flash_attention},
    {"flash_attention_rope", l_flash_attention_rope}, {"flash_decode", l_flash_decode},
    {"flash_applies", l_flash_applies},
    {"flash_cpu_tiles", l_flash_cpu_tiles}, {"flash_limits", l_flash_limits},
    {"flash_fwd_kernel", l_flash_fwd_kernel},
    {"flash_bwd_kernel", l_flash_bwd_kernel},
    {"cat", l_cat}, {"stack", l_stack}, {"manual_seed", l_manual_seed}, {"get_rng_state", l_get_rng_state},
    {"set_rng_state", l_set_rng_state}, {"adamw_", l_adamw_}, {"sgd_", l_sgd_},
    {"shadow_weights_", l_shadow_weights_}, {"shadow_weight", l_shadow_weight},
    {"sum_of_squares", l_sum_of_squares}, {NULL, NULL}};
  lem_register(L, 0, module, module_only);
  /* operators */
  luaL_getmetatable(L, EM_TENSOR_MT);
  static const lem_Reg ops[] = {{"__add", lf_add, "add"}, {"__sub", lf_sub, "sub"}, {"__mul", lf_mul, "mul"},
                                 {"__div", lf_div, "div"}, {"__pow", lf_pow, "pow"}, {"__unm", mm_unm, "neg"},
                                 {NULL, NULL, NULL}};
  lem_register_named(L, 0, lua_gettop(L), ops);
  lua_pop(L, 1);
}
