/* Bindings for issue 12's sampling ops, dropout, the cross-entropy options
 * and gelu's tanh form: randperm, multinomial, bernoulli/bernoulli_,
 * core.dropout, core.cross_entropy_ex, core.gelu_tanh, and the fused losses
 * core.bce_with_logits, core.nll_loss, core.mse_loss and core.l1_loss. The Lua wrappers
 * (ember.randperm, F.dropout, F.cross_entropy, nn.*Loss) live in
 * bindings/ember/; these are the checked calls into the engine. */
#include <string.h>
#include "lua_ember.h"

static const char *const PERM_KEYS[] = {"dtype", "device", NULL};
static const char *const MULTI_KEYS[] = {"replacement", NULL};

/* ember.randperm(n, {dtype="i64", device="cpu"}) */
static int l_randperm(lua_State *L) {
  const char *fn = lem_name(L);
  int64_t n = lem_check_int(L, 1, fn, "n");
  int opts = lem_opts(L, 2, fn, PERM_KEYS);
  if (!opts && !lua_isnoneornil(L, 2))
    return lem_error(L, fn, "expected argument 2 (options) to be a table, got %s", luaL_typename(L, 2));
  em_dtype dt = lem_field_dtype(L, opts, fn, "dtype", EM_I64);
  em_device dev = lem_field_device(L, opts, fn, "device", em_cpu());
  return lem_push_result(L, em_randperm(n, dt, dev));
}

/* ember.multinomial(probs, num_samples, {replacement=false}) / probs:multinomial(...) */
static int l_multinomial(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *p = lem_check_tensor(L, 1, fn, "probs");
  int64_t k = lem_check_int(L, 2, fn, "num_samples");
  bool repl = false;
  if (lua_isboolean(L, 3)) repl = lua_toboolean(L, 3);   /* torch.multinomial(p, k, True) */
  else repl = lem_field_bool(L, lem_opts(L, 3, fn, MULTI_KEYS), fn, "replacement", 0);
  return lem_push_result(L, em_multinomial(p, k, repl));
}

/* ember.bernoulli(p) / p:bernoulli() */
static int l_bernoulli(lua_State *L) {
  const char *fn = lem_name(L);
  return lem_push_result(L, em_bernoulli(lem_check_tensor(L, 1, fn, "p")));
}

/* x:bernoulli_(p=0.5): p a number or a tensor broadcastable to x */
static int l_bernoulli_(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *t = lem_check_tensor(L, 1, fn, "self");
  em_tensor *p = lem_test_tensor(L, 2, fn);
  double pc = p ? 0 : lem_opt_number(L, 2, fn, "p", 0.5);
  if (em_bernoulli_(t, p, pc)) return lem_raise(L);
  lua_settop(L, 1);
  return 1;
}

/* core.dropout(x, p): training-mode dropout (F.dropout decides training) */
static int l_dropout(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "input");
  return lem_push_result(L, em_dropout(x, lem_check_number(L, 2, fn, "p")));
}

/* The reduction named by the string at idx ("mean" when absent); -1 after raising. */
static int opt_reduction(lua_State *L, int idx, const char *fn, em_reduction *red) {
  const char *r = lem_opt_string(L, idx, fn, "reduction", "mean");
  if (strcmp(r, "mean") == 0) *red = EM_REDUCTION_MEAN;
  else if (strcmp(r, "sum") == 0) *red = EM_REDUCTION_SUM;
  else if (strcmp(r, "none") == 0) *red = EM_REDUCTION_NONE;
  else return lem_error(L, fn, "expected reduction \"mean\", \"sum\" or \"none\", got \"%s\"", r);
  return 0;
}

/* core.cross_entropy_ex(logits, targets, ignore_index, label_smoothing, reduction) */
static int l_cross_entropy_ex(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "input"), *t = lem_check_tensor(L, 2, fn, "target");
  int64_t ignore = lem_opt_int(L, 3, fn, "ignore_index", -100);
  double eps = lem_opt_number(L, 4, fn, "label_smoothing", 0);
  em_reduction red = EM_REDUCTION_MEAN;   /* set by opt_reduction, which raises otherwise */
  opt_reduction(L, 5, fn, &red);
  return lem_push_result(L, em_cross_entropy_ex(x, t, ignore, eps, red));
}

/* core.bce_with_logits(input, target, weight|nil, pos_weight|nil, reduction) */
static int l_bce_with_logits(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "input"), *y = lem_check_tensor(L, 2, fn, "target");
  em_tensor *w = lem_opt_tensor(L, 3, fn, "weight"), *pw = lem_opt_tensor(L, 4, fn, "pos_weight");
  em_reduction red = EM_REDUCTION_MEAN;   /* set by opt_reduction, which raises otherwise */
  opt_reduction(L, 5, fn, &red);
  return lem_push_result(L, em_bce_with_logits(x, y, w, pw, red));
}

/* core.nll_loss(logp (..., C), target (...), weight|nil, ignore_index, reduction) */
static int l_nll_loss(lua_State *L) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "input"), *t = lem_check_tensor(L, 2, fn, "target");
  em_tensor *w = lem_opt_tensor(L, 3, fn, "weight");
  int64_t ignore = lem_opt_int(L, 4, fn, "ignore_index", -100);
  em_reduction red = EM_REDUCTION_MEAN;   /* set by opt_reduction, which raises otherwise */
  opt_reduction(L, 5, fn, &red);
  return lem_push_result(L, em_nll_loss(x, t, w, ignore, red));
}

/* core.mse_loss(input, target, reduction), core.l1_loss(...): fused (engine/ops/loss_diff.c) */
static int diff_loss(lua_State *L, em_tensor *(*f)(em_tensor *, em_tensor *, em_reduction)) {
  const char *fn = lem_name(L);
  em_tensor *x = lem_check_tensor(L, 1, fn, "input"), *y = lem_check_tensor(L, 2, fn, "target");
  em_reduction red = EM_REDUCTION_MEAN;   /* set by opt_reduction, which raises otherwise */
  opt_reduction(L, 3, fn, &red);
  return lem_push_result(L, f(x, y, red));
}
static int l_mse_loss(lua_State *L) { return diff_loss(L, em_mse_loss); }
static int l_l1_loss(lua_State *L) { return diff_loss(L, em_l1_loss); }

/* core.gelu_tanh(x): gelu(x, approximate="tanh") */
static int l_gelu_tanh(lua_State *L) {
  const char *fn = lem_name(L);
  return lem_push_result(L, em_unary(EM_GELU_TANH, lem_check_tensor(L, 1, fn, "input"), NULL));
}

void lem_open_random(lua_State *L, int methods, int module) {
  static const luaL_Reg both[] = {{"multinomial", l_multinomial}, {"bernoulli", l_bernoulli},
                                  {"bernoulli_", l_bernoulli_}, {NULL, NULL}};
  lem_register(L, methods, module, both);
  static const luaL_Reg module_only[] = {{"randperm", l_randperm}, {"dropout", l_dropout},
                                         {"cross_entropy_ex", l_cross_entropy_ex}, {"gelu_tanh", l_gelu_tanh},
                                         {"bce_with_logits", l_bce_with_logits}, {"nll_loss", l_nll_loss},
                                         {"mse_loss", l_mse_loss}, {"l1_loss", l_l1_loss},
                                         {NULL, NULL}};
  lem_register(L, 0, module, module_only);
}
