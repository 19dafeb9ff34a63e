/* File bindings: safetensors (ember.save / ember.load) and .npy. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "lua_ember.h"

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static const char *const SAVE_KEYS[] = {"metadata", NULL};
static const char *const LOAD_NPY_KEYS[] = {"mmap", NULL};

/* ember.save(path, {name = tensor, ...}, {metadata = {k = v}}) */
static int l_save(lua_State *L) {
  const char *fn = lem_name(L);
  const char *path = lem_check_string(L, 1, fn, "path");
  int opts = lem_opts(L, 3, fn, SAVE_KEYS);
  if (!lua_istable(L, 2))
    return lem_error(L, fn, "expected argument 2 to be a table {name = tensor}, got %s", luaL_typename(L, 2));
  int n = 0;
  for (lua_pushnil(L); lua_next(L, 2); lua_pop(L, 1)) n++;
  const char **names = calloc((size_t)n + 1, sizeof *names);
  em_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
  int k = 0;
  for (lua_pushnil(L); lua_next(L, 2); lua_pop(L, 1)) {
    if (lua_type(L, -2) != LUA_TSTRING || !lem_test_tensor(L, -1, NULL)) {
      free(names); free(ts);
      return lem_error(L, fn, "expected string keys and tensor values, got %s = %s",
                       luaL_typename(L, -2), luaL_typename(L, -1));
    }
    names[k++] = lua_tostring(L, -2);   /* anchored by the table */
  }
  qsort(names, (size_t)n, sizeof *names, cmp_str);   /* deterministic file layout */
  for (int i = 0; i < n; i++) { lua_getfield(L, 2, names[i]); ts[i] = lem_test_tensor(L, -1, NULL); lua_pop(L, 1); }
  /* metadata: string keys and values (other values are tostring'd) */
  int nm = 0; char **mk = NULL, **mv = NULL;
  if (lem_field(L, opts, fn, "metadata", LUA_TNONE)) {
    if (lua_istable(L, -1)) {
      int mt = lua_gettop(L), cnt = 0;
      for (lua_pushnil(L); lua_next(L, mt); lua_pop(L, 1)) cnt++;
      mk = calloc((size_t)cnt + 1, sizeof *mk); mv = calloc((size_t)cnt + 1, sizeof *mv);
      for (lua_pushnil(L); lua_next(L, mt); lua_pop(L, 1)) {
        lua_pushvalue(L, -2);
        mk[nm] = strdup(luaL_tolstring(L, -1, NULL));
        mv[nm] = strdup(luaL_tolstring(L, -3, NULL));
        lua_pop(L, 3);
        nm++;
      }
    }
    lua_pop(L, 1);
  }
  /* metadata in key order too: the same content gives the same bytes */
  for (int i = 1; i < nm; i++)
    for (int j = i; j > 0 && strcmp(mk[j - 1], mk[j]) > 0; j--) {
      char *k = mk[j]; mk[j] = mk[j - 1]; mk[j - 1] = k;
      char *v = mv[j]; mv[j] = mv[j - 1]; mv[j - 1] = v;
    }
  int rc = em_st_save(path, n, names, ts, nm, (const char *const *)mk, (const char *const *)mv);
  for (int i = 0; i < nm; i++) { free(mk[i]); free(mv[i]); }
  free(names); free(ts); free(mk); free(mv);
  if (rc) return lem_raise(L);
  return 0;
}

/* ember.load(path) -> {name = tensor}, metadata */
static int l_load(lua_State *L) {
  const char *path = lem_check_string(L, 1, lem_name(L), "path");
  char **names = NULL, **mk = NULL, **mv = NULL; em_tensor **ts = NULL; int nm = 0;
  int n = em_st_load(path, &names, &ts, &nm, &mk, &mv);
  if (n < 0) return lem_raise(L);
  lua_createtable(L, 0, n);
  for (int i = 0; i < n; i++) {
    lem_push_tensor(L, ts[i]);
    lua_setfield(L, -2, names[i]);
    free(names[i]);
  }
  lua_createtable(L, 0, nm);
  for (int i = 0; i < nm; i++) {
    lua_pushstring(L, mv[i]);
    lua_setfield(L, -2, mk[i]);
    free(mk[i]); free(mv[i]);
  }
  free(names); free(ts); free(mk); free(mv);
  return 2;
}

/* Shared file helpers name errors "load:"/"save:"; name them after the npy call. */
static int raise_renamed(lua_State *L, const char *from, const char *to) {
  char buf[2048];
  snprintf(buf, sizeof buf, "%s", em_last_error());
  size_t n = strlen(from);
  if (strncmp(buf, from, n) == 0 && buf[n] == ':') em_error_code(em_last_error_code(), "%s%s", to, buf + n);
  return lem_raise(L);
}

static int l_load_npy(lua_State *L) {
  const char *fn = lem_name(L);
  const char *path = lem_check_string(L, 1, fn, "path");
  int mm = lem_field_bool(L, lem_opts(L, 2, fn, LOAD_NPY_KEYS), fn, "mmap", 0);
  em_tensor *t = em_npy_load(path, mm);
  if (!t) return raise_renamed(L, "load", fn);
  return lem_push_result(L, t);
}

static int l_save_npy(lua_State *L) {
  const char *fn = lem_name(L);
  const char *path = lem_check_string(L, 1, fn, "path");
  em_tensor *t = lem_check_tensor(L, 2, fn, "tensor");
  if (em_npy_save(path, t)) return raise_renamed(L, "save", fn);
  return 0;
}

void lem_open_io(lua_State *L, int module) {
  static const luaL_Reg f[] = {{"save", l_save}, {"load", l_load}, {"load_npy", l_load_npy},
                               {"save_npy", l_save_npy}, {NULL, NULL}};
  lem_register(L, 0, module, f);
}
