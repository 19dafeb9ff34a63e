/* The C side of ember.tokenizer (bindings/ember/tokenizer.lua): the
 * Tokenizer userdata over engine/data's byte-level BPE, its methods, and the
 * module's constructors (train, train_text, load, from_gpt2) and
 * pretokenize. Ids are 0-based numbers in 1-based Lua arrays. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "lua_ember.h"
#include "ember/tokenizer.h"

#define TOK_MT "ember.Tokenizer"

typedef struct { em_tokenizer *t; } tok_box;

static em_tokenizer *check_tok(lua_State *L, int idx, const char *fn) {
  tok_box *b = luaL_testudata(L, idx, TOK_MT);
  if (!b) lem_error(L, fn, "expected a tokenizer (call it as tok:%s(...)), got %s", strchr(fn, '.') + 1, luaL_typename(L, idx));
  if (!b->t) lem_error(L, fn, "this tokenizer was already closed");
  return b->t;
}

/* Push t, or raise the engine's error, named fn when the engine named it after another entry point. */
static int push_tok_as(lua_State *L, em_tokenizer *t, const char *fn) {
  if (!t) {
    const char *m = em_last_error(), *colon = strchr(m, ':');
    if (fn && em_last_error_code() != EM_ERR_OOM && colon && !strncmp(m, "tokenizer.", 10) &&
        strncmp(m, fn, strlen(fn)))
      return lem_error(L, fn, "%s", colon + 2);
    return lem_raise(L);
  }
  tok_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->t = t;
  luaL_setmetatable(L, TOK_MT);
  return 1;
}

static int push_tok(lua_State *L, em_tokenizer *t) {
  if (!t) return lem_raise(L);
  tok_box *b = lua_newuserdatauv(L, sizeof *b, 0);
  b->t = t;
  luaL_setmetatable(L, TOK_MT);
  return 1;
}

/* A Lua array of strings at idx (or one string) -> arrays of borrowed pointers and lengths in a
 * userdata pushed on the stack (keep it there while they are used: a raise frees nothing by hand). */
static int check_strings(lua_State *L, int idx, const char *fn, const char *what, const char ***out, size_t **lens) {
  int n = lua_type(L, idx) == LUA_TSTRING ? 1 : (lua_type(L, idx) == LUA_TTABLE ? (int)luaL_len(L, idx) : -1);
  if (n < 0) lem_error(L, fn, "expected %s to be a string or a list of strings, got %s", what, luaL_typename(L, idx));
  void *mem = lua_newuserdatauv(L, ((size_t)n + 1) * (sizeof(char *) + sizeof(size_t)), 0);
  const char **s = mem;
  size_t *l = (size_t *)(s + n + 1);
  if (lua_type(L, idx) == LUA_TSTRING) s[0] = lua_tolstring(L, idx, &l[0]);
  else
    for (int i = 0; i < n; i++) {
      int ty = lua_rawgeti(L, idx, i + 1);
      if (ty != LUA_TSTRING)
        return lem_error(L, fn, "expected %s to be a list of strings, got %s at position %d", what, lua_typename(L, ty), i + 1);
      s[i] = lua_tolstring(L, -1, &l[i]);          /* anchored by the table */
      lua_pop(L, 1);
    }
  s[n] = NULL;
  *out = s;
  if (lens) *lens = l;
  return n;
}

static const char *const TRAIN_KEYS[] = {"vocab_size", "special_tokens", "threads", "pattern", NULL};

/* Options of train / train_text into o; the special tokens array is malloc'd in o->special. */
static void train_options(lua_State *L, int idx, const char *fn, em_bpe_train_options *o) {
  int opts = lem_opts(L, idx, fn, TRAIN_KEYS);
  if (!opts) lem_error(L, fn, "expected argument %d to be an options table {vocab_size=, special_tokens=}, got %s", idx, luaL_typename(L, idx));
  memset(o, 0, sizeof *o);
  if (!lem_field(L, opts, fn, "vocab_size", LUA_TNUMBER)) lem_error(L, fn, "expected option vocab_size (a number), got nil");
  if (!lua_isinteger(L, -1)) lem_error(L, fn, "expected vocab_size to be an integer, got %s", lua_tostring(L, -1));
  lua_Integer v = lua_tointeger(L, -1);
  lua_pop(L, 1);
  o->vocab_size = v > 0x7fffffff ? 0x7fffffff : v < -1 ? -1 : (int)v;
  o->threads = (int)lem_field_number(L, opts, fn, "threads", 0);
  if (lem_field(L, opts, fn, "pattern", LUA_TSTRING)) { o->pattern = lua_tostring(L, -1); lua_pop(L, 1); }  /* anchored by opts */
  if (lem_field(L, opts, fn, "special_tokens", LUA_TTABLE)) {
    const char **s;
    o->n_special = check_strings(L, lua_gettop(L), fn, "special_tokens", &s, NULL);
    o->special = s;
    lua_remove(L, -2);                            /* the table stays anchored by opts; the arrays stay here */
  }
}

/* ember.tokenizer.train({paths}, {vocab_size=, special_tokens=, threads=, pattern=}) */
static int l_train(lua_State *L) {
  const char *fn = lem_name(L);
  const char **paths;
  if (lua_type(L, 1) != LUA_TTABLE && lua_type(L, 1) != LUA_TSTRING)
    return lem_error(L, fn, "expected argument 1 to be a list of file paths, got %s", luaL_typename(L, 1));
  int n = check_strings(L, 1, fn, "argument 1 (files)", &paths, NULL);
  em_bpe_train_options o;
  train_options(L, 2, fn, &o);
  em_tokenizer *t = em_tokenizer_train_files(n, paths, &o);
  return push_tok(L, t);
}

/* ember.tokenizer.train_text(text or {texts}, opts): each text is one document */
static int l_train_text(lua_State *L) {
  const char *fn = lem_name(L);
  const char **docs;
  size_t *lens;
  int n = check_strings(L, 1, fn, "argument 1 (text)", &docs, &lens);
  em_bpe_train_options o;
  train_options(L, 2, fn, &o);
  em_tokenizer *t = em_tokenizer_train(n, docs, lens, &o);
  return push_tok_as(L, t, fn);
}

static int l_load(lua_State *L) {
  return push_tok(L, em_tokenizer_load(lem_check_string(L, 1, lem_name(L), "path")));
}

static int l_from_gpt2(lua_State *L) {
  const char *fn = lem_name(L);
  const char *v = lem_check_string(L, 1, fn, "vocab_path"), *m = lem_check_string(L, 2, fn, "merges_path");
  return push_tok(L, em_tokenizer_load_gpt2(v, m));
}

static void push_piece(const char *p, size_t n, bool special, void *u) {
  lua_State *L = u;
  lua_pushlstring(L, p, n);
  lua_rawseti(L, -2, (lua_Integer)luaL_len(L, -2) + 1);
  (void)special;
}

static const char *const PRETOK_KEYS[] = {"special_tokens", "pattern", NULL};

/* ember.tokenizer.pretokenize(text, {special_tokens=, pattern=}) -> {pieces} */
static int l_pretokenize(lua_State *L) {
  const char *fn = lem_name(L);
  size_t len;
  lem_check_string(L, 1, fn, "text");
  const char *text = lua_tolstring(L, 1, &len);
  int opts = lem_opts(L, 2, fn, PRETOK_KEYS);
  const char *pattern = NULL, **special = NULL;
  int ns = 0;
  if (lem_field(L, opts, fn, "pattern", LUA_TSTRING)) { pattern = lua_tostring(L, -1); lua_pop(L, 1); }
  if (lem_field(L, opts, fn, "special_tokens", LUA_TTABLE)) {
    ns = check_strings(L, lua_gettop(L), fn, "special_tokens", &special, NULL);
    lua_remove(L, -2);
  }
  lua_newtable(L);
  int rc = em_tokenizer_pretokenize(pattern, ns, special, text, len, push_piece, L);
  if (rc) return lem_raise(L);
  return 1;
}

/* ---- methods ---- */

static const char *const ENCODE_KEYS[] = {"cache", NULL};

static int m_encode(lua_State *L) {
  const char *fn = lem_name(L);
  em_tokenizer *t = check_tok(L, 1, fn);
  size_t len;
  lem_check_string(L, 2, fn, "text");
  const char *text = lua_tolstring(L, 2, &len);
  int opts = lem_opts(L, 3, fn, ENCODE_KEYS);
  bool cache = lem_field_bool(L, opts, fn, "cache", 1);
  size_t bound = cache ? 0 : em_tokenizer_set_cache(t, 0);
  int32_t *ids;
  int64_t n = em_tokenizer_encode(t, text, len, &ids);
  if (!cache) em_tokenizer_set_cache(t, bound);
  if (n < 0) return lem_raise(L);
  lua_createtable(L, (int)(n < 0x7fffffff ? n : 0), 0);
  for (int64_t i = 0; i < n; i++) { lua_pushinteger(L, ids[i]); lua_rawseti(L, -2, i + 1); }
  free(ids);
  return 1;
}

static const char *const DECODE_KEYS[] = {"errors", NULL};

static int m_decode(lua_State *L) {
  const char *fn = lem_name(L);
  em_tokenizer *t = check_tok(L, 1, fn);
  lem_check_type(L, 2, fn, "ids", LUA_TTABLE);
  int opts = lem_opts(L, 3, fn, DECODE_KEYS);
  const char *errors = "raw";
  if (lem_field(L, opts, fn, "errors", LUA_TSTRING)) { errors = lua_tostring(L, -1); lua_pop(L, 1); }
  bool replace = !strcmp(errors, "replace"), strict = !strcmp(errors, "strict");
  if (!replace && !strict && strcmp(errors, "raw"))
    return lem_error(L, fn, "expected errors = \"raw\", \"replace\" or \"strict\", got \"%s\"", errors);
  size_t n = (size_t)luaL_len(L, 2);
  int32_t *ids = malloc((n + 1) * sizeof *ids);
  if (!ids) return luaL_error(L, "out of memory: %s", fn);
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, 2, (lua_Integer)i + 1);
    int isint;
    lua_Integer v = lua_tointegerx(L, -1, &isint);
    if (!isint) {
      free(ids);
      return lem_error(L, fn, "expected ids to be integers, got %s at position %zu", luaL_typename(L, -1), i + 1);
    }
    ids[i] = v < -1 ? -1 : v > 0x7fffffff ? 0x7fffffff : (int32_t)v;
    lua_pop(L, 1);
  }
  char *s;
  int64_t len = em_tokenizer_decode(t, ids, n, &s);
  free(ids);
  if (len < 0) return lem_raise(L);
  if (replace || strict) {
    size_t rl;
    char *r = em_utf8_replace(s, (size_t)len, &rl);
    if (!r) { free(s); return luaL_error(L, "out of memory: %s", fn); }
    if (strict && (rl != (size_t)len || memcmp(r, s, rl))) {
      size_t at = 0;
      while (at < rl && r[at] == s[at]) at++;
      free(r); free(s);
      return lem_error(L, fn, "the ids decode to invalid UTF-8 (first bad byte at offset %zu); "
                       "use {errors=\"replace\"} or {errors=\"raw\"}", at);
    }
    free(s);
    s = r; len = (int64_t)rl;
  }
  lua_pushlstring(L, s, (size_t)len);
  free(s);
  return 1;
}

static int m_vocab_size(lua_State *L) {
  lua_pushinteger(L, em_tokenizer_vocab_size(check_tok(L, 1, lem_name(L))));
  return 1;
}

static int m_save(lua_State *L) {
  const char *fn = lem_name(L);
  em_tokenizer *t = check_tok(L, 1, fn);
  if (em_tokenizer_save(t, lem_check_string(L, 2, fn, "path"))) return lem_raise(L);
  return 0;
}

static int m_save_gpt2(lua_State *L) {
  const char *fn = lem_name(L);
  em_tokenizer *t = check_tok(L, 1, fn);
  if (em_tokenizer_save_gpt2(t, lem_check_string(L, 2, fn, "vocab_path"), lem_check_string(L, 3, fn, "merges_path")))
    return lem_raise(L);
  return 0;
}

static int m_id_of(lua_State *L) {
  const char *fn = lem_name(L);
  em_tokenizer *t = check_tok(L, 1, fn);
  size_t n;
  lem_check_string(L, 2, fn, "token");
  const char *s = lua_tolstring(L, 2, &n);
  int32_t id = em_tokenizer_id(t, s, n);
  if (id < 0) lua_pushnil(L); else lua_pushinteger(L, id);
  return 1;
}

static int m_token_of(lua_State *L) {
  const char *fn = lem_name(L);
  em_tokenizer *t = check_tok(L, 1, fn);
  lua_Integer id = lem_check_int(L, 2, fn, "id");
  if (id < 0 || id >= em_tokenizer_vocab_size(t))
    return lem_error(L, fn, "expected an id in [0, %d), got %lld", em_tokenizer_vocab_size(t), (long long)id);
  size_t n;
  const char *s = em_tokenizer_token(t, (int32_t)id, &n);
  lua_pushlstring(L, s, n);
  return 1;
}

static int m_is_special(lua_State *L) {
  const char *fn = lem_name(L);
  lua_pushboolean(L, em_tokenizer_is_special(check_tok(L, 1, fn), (int32_t)lem_check_int(L, 2, fn, "id")));
  return 1;
}

/* tok:special_tokens() -> {token = id} */
static int m_special_tokens(lua_State *L) {
  em_tokenizer *t = check_tok(L, 1, lem_name(L));
  int n = em_tokenizer_n_special(t);
  lua_createtable(L, 0, n);
  for (int i = 0; i < n; i++) {
    size_t len;
    int32_t id = em_tokenizer_special(t, i);
    const char *s = em_tokenizer_token(t, id, &len);
    lua_pushlstring(L, s, len);
    lua_pushinteger(L, id);
    lua_rawset(L, -3);
  }
  return 1;
}

/* tok:merges() -> {{bytes_a, bytes_b}, ...} in rank order */
static int m_merges(lua_State *L) {
  em_tokenizer *t = check_tok(L, 1, lem_name(L));
  int n = em_tokenizer_n_merges(t);
  lua_createtable(L, n, 0);
  for (int r = 0; r < n; r++) {
    int32_t a, b, c;
    size_t la, lb;
    em_tokenizer_merge(t, r, &a, &b, &c);
    const char *sa = em_tokenizer_token(t, a, &la), *sb = em_tokenizer_token(t, b, &lb);
    lua_createtable(L, 2, 0);
    lua_pushlstring(L, sa, la); lua_rawseti(L, -2, 1);
    lua_pushlstring(L, sb, lb); lua_rawseti(L, -2, 2);
    lua_rawseti(L, -2, r + 1);
  }
  return 1;
}

static int m_pattern(lua_State *L) {
  lua_pushstring(L, em_tokenizer_pattern(check_tok(L, 1, lem_name(L))));
  return 1;
}

static int m_set_cache(lua_State *L) {
  const char *fn = lem_name(L);
  em_tokenizer *t = check_tok(L, 1, fn);
  lua_Integer n = lem_check_int(L, 2, fn, "max_entries");
  if (n < 0) return lem_error(L, fn, "expected max_entries >= 0, got %lld", (long long)n);
  em_tokenizer_set_cache(t, (size_t)n);
  return 0;
}

/* encode_file's progress: a line on stderr, or a Lua function (bytes_done, bytes_total, tokens) */
typedef struct { lua_State *L; int fn_idx; double t0; bool err; } progress_ctx;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int progress_cb(void *u, uint64_t done, uint64_t total, int64_t tokens) {
  progress_ctx *p = u;
  if (!p->fn_idx) {
    double dt = now() - p->t0;
    fprintf(stderr, "\rencode_file: %.1f / %.1f MB (%.0f%%), %lld tokens, %.1f MB/s   ", done / 1e6, total / 1e6,
            total ? 100.0 * (double)done / (double)total : 100.0, (long long)tokens, dt > 0 ? done / 1e6 / dt : 0.0);
    fflush(stderr);
    return 0;
  }
  lua_pushvalue(p->L, p->fn_idx);
  lua_pushinteger(p->L, (lua_Integer)done);
  lua_pushinteger(p->L, (lua_Integer)total);
  lua_pushinteger(p->L, (lua_Integer)tokens);
  if (lua_pcall(p->L, 3, 0, 0)) { p->err = true; return 1; }   /* the message stays on the stack */
  return 0;
}

static const char *const FILE_KEYS[] = {"progress", "chunk_bytes", "threads", NULL};

/* tok:encode_file(in_path, out_npy, {progress=, chunk_bytes=, threads=}) -> token count */
static int m_encode_file(lua_State *L) {
  const char *fn = lem_name(L);
  em_tokenizer *t = check_tok(L, 1, fn);
  const char *in = lem_check_string(L, 2, fn, "in_path"), *out = lem_check_string(L, 3, fn, "out_path");
  int opts = lem_opts(L, 4, fn, FILE_KEYS);
  em_bpe_file_options o = {0};
  double chunk = lem_field_number(L, opts, fn, "chunk_bytes", 0);
  if (chunk < 0 || chunk > 1e12) return lem_error(L, fn, "expected chunk_bytes >= 1, got %g", chunk);
  o.chunk_bytes = (size_t)chunk;
  o.threads = (int)lem_field_number(L, opts, fn, "threads", 0);
  progress_ctx p = {L, 0, now(), false};
  if (lem_field(L, opts, fn, "progress", LUA_TNONE)) {
    if (lua_isfunction(L, -1)) p.fn_idx = lua_gettop(L);
    else if (lua_toboolean(L, -1)) lua_pop(L, 1);
    else { lua_pop(L, 1); p.fn_idx = -1; }
    if (p.fn_idx != -1) { o.progress = progress_cb; o.progress_u = &p; }
    if (p.fn_idx == -1) p.fn_idx = 0;
  }
  int64_t n = em_tokenizer_encode_file(t, in, out, &o);
  if (o.progress && !p.fn_idx) fprintf(stderr, "\n");
  if (p.err) return lua_error(L);                 /* the progress function's own error */
  if (n < 0) return lem_raise(L);
  lua_pushinteger(L, n);
  return 1;
}

static int m_gc(lua_State *L) {
  tok_box *b = luaL_checkudata(L, 1, TOK_MT);
  em_tokenizer_free(b->t);
  b->t = NULL;
  return 0;
}

static int m_tostring(lua_State *L) {
  tok_box *b = luaL_checkudata(L, 1, TOK_MT);
  if (!b->t) lua_pushliteral(L, "ember.Tokenizer(closed)");
  else lua_pushfstring(L, "ember.Tokenizer(byte-level BPE, vocab_size=%d, merges=%d, special_tokens=%d)",
                       em_tokenizer_vocab_size(b->t), em_tokenizer_n_merges(b->t), em_tokenizer_n_special(b->t));
  return 1;
}

static int l_available(lua_State *L) {
  em_bpe_train_options o = {.vocab_size = 256};
  const char *doc = "";
  size_t len = 0;
  em_tokenizer *t = em_tokenizer_train(1, &doc, &len, &o);
  lua_pushboolean(L, t != NULL);
  if (t) { em_tokenizer_free(t); return 1; }
  lua_pushstring(L, em_last_error());
  return 2;
}

void lem_open_tokenizer(lua_State *L, int module) {
  luaL_newmetatable(L, TOK_MT);
  static const lem_Reg m[] = {
    {"encode", m_encode, "tokenizer.encode"}, {"decode", m_decode, "tokenizer.decode"},
    {"vocab_size", m_vocab_size, "tokenizer.vocab_size"}, {"save", m_save, "tokenizer.save"},
    {"save_gpt2", m_save_gpt2, "tokenizer.save_gpt2"}, {"id_of", m_id_of, "tokenizer.id_of"},
    {"token_of", m_token_of, "tokenizer.token_of"}, {"is_special", m_is_special, "tokenizer.is_special"},
    {"special_tokens", m_special_tokens, "tokenizer.special_tokens"}, {"merges", m_merges, "tokenizer.merges"},
    {"pattern", m_pattern, "tokenizer.pattern"}, {"set_cache", m_set_cache, "tokenizer.set_cache"},
    {"encode_file", m_encode_file, "tokenizer.encode_file"}, {NULL, NULL, NULL}};
  lua_newtable(L);
  lem_register_named(L, 0, lua_gettop(L), m);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, m_gc); lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, m_gc); lua_setfield(L, -2, "__close");
  lua_pushcfunction(L, m_tostring); lua_setfield(L, -2, "__tostring");
  lua_pushliteral(L, "ember.Tokenizer"); lua_setfield(L, -2, "__name");
  lua_pop(L, 1);
  static const lem_Reg f[] = {
    {"tokenizer_train", l_train, "tokenizer.train"}, {"tokenizer_train_text", l_train_text, "tokenizer.train_text"},
    {"tokenizer_load", l_load, "tokenizer.load"}, {"tokenizer_from_gpt2", l_from_gpt2, "tokenizer.from_gpt2"},
    {"tokenizer_pretokenize", l_pretokenize, "tokenizer.pretokenize"},
    {"tokenizer_available", l_available, "tokenizer.available"}, {NULL, NULL, NULL}};
  lem_register_named(L, 0, module, f);
  lua_pushliteral(L, EM_GPT2_PATTERN);
  lua_setfield(L, module, "tokenizer_gpt2_pattern");
}
