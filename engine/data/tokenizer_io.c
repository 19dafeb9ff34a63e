/* Tokenizer files: Ember's own JSON and GPT-2's vocab.json + merges.txt.
 *
 * Both spell a token's bytes as GPT-2 does (bytes_to_unicode: each byte is one
 * printable character, so "Ġthe" is " the"), which keeps the files readable
 * and lets a vocabulary move between the formats unchanged; special tokens
 * are written as themselves, as HuggingFace writes added tokens. Ember's file:
 *
 *   {"format": "ember.tokenizer", "version": 1, "type": "byte-level BPE",
 *    "pattern": "<the pre-tokenisation regex>",
 *    "special_tokens": {"<|endoftext|>": 1000},
 *    "vocab": ["\u0100", "\u0101", ...],           (index = id)
 *    "merges": [[32, 116], ...]}                   (rank order, ids)
 *
 * GPT-2's files carry no list of special tokens: a vocab.json entry that is
 * neither a byte nor made by a merge is one (GPT-2's <|endoftext|>). Readers
 * parse with engine/io's strict JSON parser and refuse what does not add up
 * (missing byte tokens, duplicate ids, a merge whose result is not in the
 * vocabulary), naming the file, the key or line, what was expected and what
 * was found. Writers go through engine/io's atomic file. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>
#include "internal.h"
#include "data/bpe.h"
#include "io/atomic_file.h"
#include "io/io_common.h"
#include "io/json_min.h"

#define MAX_FILE ((uint64_t)1 << 30)

/* ---- GPT-2's byte <-> character table ---- */

static int16_t unicode_to_byte[324];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;
static void make_table(void) {
  for (int i = 0; i < 324; i++) unicode_to_byte[i] = -1;
  for (int b = 0; b < 256; b++) unicode_to_byte[bpe_byte_to_unicode((uint8_t)b)] = (int16_t)b;
}

/* Next code point of valid UTF-8 at s[*i]. */
static uint32_t next_cp(const unsigned char *s, size_t *i) {
  uint32_t c = s[*i];
  int k = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
  c &= k == 0 ? 0x7F : k == 1 ? 0x1F : k == 2 ? 0x0F : 0x07;
  for (int j = 1; j <= k; j++) c = (c << 6) | (s[*i + j] & 0x3F);
  *i += (size_t)k + 1;
  return c;
}

/* Map a GPT-2 token string (UTF-8) to its bytes; -1 (with *bad the offending code point) when a
 * character is not one of the 256 byte characters. */
static int gpt2_to_bytes(const char *s, size_t n, char *out, size_t *outn, uint32_t *bad) {
  pthread_once(&table_once, make_table);
  size_t i = 0, k = 0;
  while (i < n) {
    uint32_t c = next_cp((const unsigned char *)s, &i);
    if (c >= 324 || unicode_to_byte[c] < 0) { *bad = c; return -1; }
    out[k++] = (char)unicode_to_byte[c];
  }
  *outn = k;
  return 0;
}

/* ---- a growing output buffer ---- */

typedef struct { char *p; size_t n, cap; bool oom; } sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t c = b->cap ? b->cap * 2 : 1 << 16;
    while (c < b->n + n + 1) c *= 2;
    char *q = realloc(b->p, c);
    if (!q) { b->oom = true; return; }
    b->p = q; b->cap = c;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_fmt(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf *b, const char *fmt, ...) {
  char tmp[256];
  va_list ap; va_start(ap, fmt);
  int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  sb_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}
/* A JSON string of UTF-8 s[0..n). */
static void sb_json(sbuf *b, const char *s, size_t n) {
  sb_put(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; sb_put(b, e, 2); }
    else if (c < 0x20 || c == 0x7f) sb_fmt(b, "\\u%04x", c);
    else sb_put(b, (const char *)&c, 1);
  }
  sb_put(b, "\"", 1);
}
/* A token as GPT-2 spells it (specials as themselves), raw UTF-8. */
static void sb_spell(sbuf *b, const em_tokenizer *t, int32_t id) {
  if (t->special[id]) { sb_put(b, t->tok[id], t->tok_len[id]); return; }
  for (uint32_t i = 0; i < t->tok_len[id]; i++) {
    uint32_t c = bpe_byte_to_unicode((uint8_t)t->tok[id][i]);
    char u[2] = {(char)c, 0};
    if (c < 0x80) sb_put(b, u, 1);
    else { u[0] = (char)(0xC0 | (c >> 6)); u[1] = (char)(0x80 | (c & 0x3F)); sb_put(b, u, 2); }   /* c < 324 */
  }
}
/* The same as a JSON string. */
static void sb_token(sbuf *b, const em_tokenizer *t, int32_t id) {
  sbuf tmp = {0};
  sb_spell(&tmp, t, id);
  if (tmp.oom) b->oom = true;
  else sb_json(b, tmp.p ? tmp.p : "", tmp.n);
  free(tmp.p);
}

static int write_file(const char *path, sbuf *b, const char *fn) {
  if (b->oom) { free(b->p); return em_error_oom("out of memory: %s: '%s'", fn, path); }
  em_atomic_file f = {.fd = -1};
  int rc = em_atomic_open(&f, path, fn);
  if (rc == 0) rc = em_atomic_write(&f, b->p, b->n);
  if (rc == 0) rc = em_atomic_commit(&f);
  else em_atomic_abort(&f);
  free(b->p);
  return rc;
}

int em_tokenizer_save(const em_tokenizer *t, const char *path) {
  sbuf b = {0};
  sb_str(&b, "{\n  \"format\": \"ember.tokenizer\",\n  \"version\": 1,\n  \"type\": \"byte-level BPE\",\n  \"pattern\": ");
  sb_json(&b, t->pattern, strlen(t->pattern));
  sb_str(&b, ",\n  \"special_tokens\": {");
  for (int i = 0; i < t->n_special; i++) {
    int32_t id = t->special_ids[i];
    sb_str(&b, i ? ", " : "");
    sb_json(&b, t->tok[id], t->tok_len[id]);
    sb_fmt(&b, ": %d", id);
  }
  sb_str(&b, "},\n  \"vocab\": [");
  for (int32_t i = 0; i < t->n_vocab; i++) {
    sb_str(&b, i ? ",\n    " : "\n    ");
    sb_token(&b, t, i);
  }
  sb_str(&b, "\n  ],\n  \"merges\": [");
  for (int r = 0; r < t->n_merges; r++) sb_fmt(&b, "%s[%d, %d]", r ? ",\n    " : "\n    ", t->merges[r][0], t->merges[r][1]);
  sb_str(&b, "\n  ]\n}\n");
  return write_file(path, &b, "tokenizer.save");
}

int em_tokenizer_save_gpt2(const em_tokenizer *t, const char *vocab_path, const char *merges_path) {
  sbuf b = {0};
  sb_str(&b, "{");
  for (int32_t i = 0; i < t->n_vocab; i++) {
    sb_str(&b, i ? ", " : "");
    sb_token(&b, t, i);
    sb_fmt(&b, ": %d", i);
  }
  sb_str(&b, "}");
  int rc = write_file(vocab_path, &b, "tokenizer.save_gpt2");
  if (rc) return rc;
  sbuf m = {0};
  sb_str(&m, "#version: 0.2\n");
  for (int r = 0; r < t->n_merges; r++) {
    sb_spell(&m, t, t->merges[r][0]);
    sb_put(&m, " ", 1);
    sb_spell(&m, t, t->merges[r][1]);
    sb_put(&m, "\n", 1);
  }
  return write_file(merges_path, &m, "tokenizer.save_gpt2");
}

/* ---- reading ---- */

static char *read_all(const char *path, size_t *n, const char *fn) {
  uint64_t size;
  int fd = em_io_open_read(path, &size);
  if (fd < 0) {
    char why[1024];
    snprintf(why, sizeof why, "%s", em_last_error());
    em_error_code(EM_ERR_IO, "%s: %s", fn, strncmp(why, "load: ", 6) ? why : why + 6);
    return NULL;
  }
  if (size > MAX_FILE) {
    close(fd);
    em_error("%s: '%s' is %llu bytes; a tokenizer file over 1 GB is refused", fn, path, (unsigned long long)size);
    return NULL;
  }
  char *buf = malloc(size + 1);
  if (!buf) { close(fd); em_error_oom("out of memory: %s: '%s'", fn, path); return NULL; }
  if (em_io_pread_all(fd, buf, size, 0, path)) { close(fd); free(buf); return NULL; }
  close(fd);
  buf[size] = 0;
  *n = size;
  return buf;
}

static int parse_json(const char *path, const char *fn, jm_value *root) {
  size_t n;
  char *text = read_all(path, &n, fn);
  if (!text) return -1;
  char err[256];
  int rc = jm_parse(text, n, 0, root, err, sizeof err);
  free(text);
  if (rc == JM_ERR_OOM) return em_error_oom("out of memory: %s: '%s'", fn, path);
  if (rc) return em_error("%s: '%s' is not valid JSON: %s", fn, path, err);
  return 0;
}

/* Tokens under construction: id -> bytes, specials. */
typedef struct {
  int32_t n;
  char **tok;
  uint32_t *len;
  bool *special;
} vocab_b;

static void vocab_free(vocab_b *v) {
  if (v->tok) for (int32_t i = 0; i < v->n; i++) free(v->tok[i]);
  free(v->tok); free(v->len); free(v->special);
}

static int vocab_alloc(vocab_b *v, int32_t n) {
  v->n = n;
  v->tok = calloc((size_t)n + 1, sizeof *v->tok);
  v->len = calloc((size_t)n + 1, sizeof *v->len);
  v->special = calloc((size_t)n + 1, sizeof *v->special);
  return v->tok && v->len && v->special ? 0 : em_error_oom("out of memory: tokenizer: vocabulary of %d", n);
}

/* Set token id from its file spelling s (special: as is; else through the byte table). */
static int vocab_set(vocab_b *v, int32_t id, const char *s, size_t n, bool special, const char *fn,
                     const char *path, const char *where) {
  char *b = malloc(n + 1);
  if (!b) return em_error_oom("out of memory: %s", fn);
  size_t k = n;
  if (special) memcpy(b, s, n);
  else {
    uint32_t bad;
    if (gpt2_to_bytes(s, n, b, &k, &bad)) {
      free(b);
      return em_error("%s: '%s': %s: character U+%04X is not one of GPT-2's 256 byte characters "
                      "(and the token is not a special token)", fn, path, where, bad);
    }
  }
  b[k] = 0;
  v->tok[id] = b; v->len[id] = (uint32_t)k; v->special[id] = special;
  return 0;
}

static em_tokenizer *finish(const char *what, vocab_b *v, int nm, int32_t (*mg)[2], const char *pattern) {
  em_tokenizer *t = bpe_build(what, v->n, v->tok, v->len, v->special, nm, (const int32_t (*)[2])mg, pattern);
  v->tok = NULL; v->len = NULL;                   /* bpe_build owns them now */
  v->n = 0;
  return t;
}

em_tokenizer *em_tokenizer_load(const char *path) {
  const char *fn = "tokenizer.load";
  jm_value root;
  if (parse_json(path, fn, &root)) return NULL;
  em_tokenizer *t = NULL;
  vocab_b v = {0};
  int32_t (*mg)[2] = NULL;
  char what[1200];
  snprintf(what, sizeof what, "%s: '%s'", fn, path);
  const jm_value *fmt = jm_get(&root, "format"), *ver = jm_get(&root, "version"), *pat = jm_get(&root, "pattern"),
                 *sp = jm_get(&root, "special_tokens"), *voc = jm_get(&root, "vocab"), *mer = jm_get(&root, "merges");
  if (root.kind != JM_OBJECT) { em_error("%s: expected a JSON object, got %s", what, jm_kind_name(root.kind)); goto out; }
  if (!fmt || fmt->kind != JM_STRING || strcmp(fmt->u.str.s, "ember.tokenizer")) {
    em_error("%s: key 'format': expected \"ember.tokenizer\", got %s%s%s", what,
             fmt ? (fmt->kind == JM_STRING ? "\"" : jm_kind_name(fmt->kind)) : "nothing",
             fmt && fmt->kind == JM_STRING ? fmt->u.str.s : "", fmt && fmt->kind == JM_STRING ? "\"" : "");
    goto out;
  }
  if (!ver || !ver->is_int || ver->u.num.i != 1) {
    em_error("%s: key 'version': expected 1, got %s", what, ver ? (ver->is_int ? "another number" : jm_kind_name(ver->kind)) : "nothing");
    goto out;
  }
  if (!pat || pat->kind != JM_STRING) { em_error("%s: key 'pattern': expected a string, got %s", what, pat ? jm_kind_name(pat->kind) : "nothing"); goto out; }
  if (!voc || voc->kind != JM_ARRAY) { em_error("%s: key 'vocab': expected an array of strings, got %s", what, voc ? jm_kind_name(voc->kind) : "nothing"); goto out; }
  if (!sp || sp->kind != JM_OBJECT) { em_error("%s: key 'special_tokens': expected an object {token: id}, got %s", what, sp ? jm_kind_name(sp->kind) : "nothing"); goto out; }
  if (!mer || mer->kind != JM_ARRAY) { em_error("%s: key 'merges': expected an array of [id, id], got %s", what, mer ? jm_kind_name(mer->kind) : "nothing"); goto out; }
  if (voc->u.arr.n > INT32_MAX / 2) { em_error("%s: key 'vocab': too many tokens", what); goto out; }
  int32_t n = (int32_t)voc->u.arr.n;
  if (vocab_alloc(&v, n)) goto out;
  for (size_t i = 0; i < sp->u.obj.n; i++) {
    const jm_member *m = &sp->u.obj.members[i];
    if (!m->value.is_int || m->value.u.num.i < 0 || m->value.u.num.i >= n) {
      em_error("%s: key 'special_tokens' entry '%s': expected an id in [0, %d), got %s", what, m->key, n,
               m->value.is_int ? "one outside" : jm_kind_name(m->value.kind));
      goto out;
    }
    v.special[m->value.u.num.i] = true;
  }
  char where[64];
  for (int32_t i = 0; i < n; i++) {
    const jm_value *s = &voc->u.arr.items[i];
    if (s->kind != JM_STRING) { em_error("%s: key 'vocab' item %d: expected a string, got %s", what, i, jm_kind_name(s->kind)); goto out; }
    snprintf(where, sizeof where, "key 'vocab' item %d", i);
    if (vocab_set(&v, i, s->u.str.s, s->u.str.len, v.special[i], fn, path, where)) goto out;
  }
  for (size_t i = 0; i < sp->u.obj.n; i++) {
    const jm_member *m = &sp->u.obj.members[i];
    int32_t id = (int32_t)m->value.u.num.i;
    if (m->key_len != v.len[id] || memcmp(m->key, v.tok[id], v.len[id])) {
      em_error("%s: key 'special_tokens' entry '%s': vocab item %d is '%s', not this token", what, m->key, id, v.tok[id]);
      goto out;
    }
  }
  size_t nm = mer->u.arr.n;
  mg = malloc((nm + 1) * sizeof *mg);
  if (!mg) { em_error_oom("out of memory: %s", fn); goto out; }
  for (size_t r = 0; r < nm; r++) {
    const jm_value *p = &mer->u.arr.items[r];
    if (p->kind != JM_ARRAY || p->u.arr.n != 2 || !p->u.arr.items[0].is_int || !p->u.arr.items[1].is_int) {
      em_error("%s: key 'merges' item %zu: expected [id, id], got %s", what, r,
               p->kind == JM_ARRAY ? "an array of other contents" : jm_kind_name(p->kind));
      goto out;
    }
    int64_t a = p->u.arr.items[0].u.num.i, b = p->u.arr.items[1].u.num.i;
    if (a < 0 || a >= n || b < 0 || b >= n) {
      em_error("%s: key 'merges' item %zu: ids [%lld, %lld] outside [0, %d)", what, r, (long long)a, (long long)b, n);
      goto out;
    }
    mg[r][0] = (int32_t)a; mg[r][1] = (int32_t)b;
  }
  t = finish(what, &v, (int)nm, mg, pat->u.str.s);
out:
  vocab_free(&v);
  free(mg);
  jm_free(&root);
  return t;
}

em_tokenizer *em_tokenizer_load_gpt2(const char *vocab_path, const char *merges_path) {
  const char *fn = "tokenizer.from_gpt2";
  jm_value root;
  if (parse_json(vocab_path, fn, &root)) return NULL;
  em_tokenizer *t = NULL;
  vocab_b v = {0};
  int32_t (*mg)[2] = NULL;
  bool *made = NULL;
  const jm_member **by_id = NULL;
  char *text = NULL;
  bpe_smap strs = {0};                            /* token spelling -> id */
  char what[1200];
  snprintf(what, sizeof what, "%s: '%s'", fn, vocab_path);
  if (root.kind != JM_OBJECT) { em_error("%s: expected a JSON object {token: id}, got %s", what, jm_kind_name(root.kind)); goto out; }
  if (root.u.obj.n > INT32_MAX / 2) { em_error("%s: too many tokens", what); goto out; }
  int32_t n = (int32_t)root.u.obj.n;
  by_id = calloc((size_t)n + 1, sizeof *by_id);
  made = calloc((size_t)n + 1, sizeof *made);
  if (!by_id || !made || bpe_smap_init(&strs, (size_t)n) || vocab_alloc(&v, n)) { em_error_oom("out of memory: %s", fn); goto out; }
  for (int32_t i = 0; i < n; i++) {
    const jm_member *m = &root.u.obj.members[i];
    if (!m->value.is_int) { em_error("%s: key '%s': expected an integer id, got %s", what, m->key, jm_kind_name(m->value.kind)); goto out; }
    int64_t id = m->value.u.num.i;
    if (id < 0 || id >= n) {
      em_error("%s: key '%s': id %lld outside [0, %d) (the ids must be 0..N-1, each once)", what, m->key, (long long)id, n);
      goto out;
    }
    if (by_id[id]) { em_error("%s: keys '%s' and '%s' both have id %lld", what, by_id[id]->key, m->key, (long long)id); goto out; }
    by_id[id] = m;
    if (!bpe_smap_put(&strs, m->key, m->key_len, bpe_hash(m->key, m->key_len), id, NULL)) { em_error_oom("out of memory: %s", fn); goto out; }
  }
  /* merges.txt: "#version" first line (optional), then "A B" per line in rank order */
  size_t tn;
  if (!(text = read_all(merges_path, &tn, fn))) goto out;
  snprintf(what, sizeof what, "%s: '%s'", fn, merges_path);
  if (!jm_utf8_valid(text, tn)) { em_error("%s: not valid UTF-8", what); goto out; }
  size_t cap = 1024, nm = 0;
  mg = malloc(cap * sizeof *mg);
  if (!mg) { em_error_oom("out of memory: %s", fn); goto out; }
  size_t line = 0;
  char *cat = NULL;
  size_t catcap = 0;
  for (char *p = text, *end = text + tn; p < end;) {
    char *nl = memchr(p, '\n', (size_t)(end - p));
    char *e = nl ? nl : end;
    line++;
    char *q = p;
    p = nl ? nl + 1 : end;
    if (e > q && e[-1] == '\r') e--;
    if (e == q) continue;                        /* blank (the last line) */
    if (line == 1 && e - q >= 8 && !memcmp(q, "#version", 8)) continue;
    char *sp1 = memchr(q, ' ', (size_t)(e - q));
    if (!sp1 || sp1 == q || sp1 + 1 == e || memchr(sp1 + 1, ' ', (size_t)(e - sp1 - 1))) {
      em_error("%s: line %zu: expected two tokens separated by one space, got '%.*s'", what, line,
               (int)(e - q > 80 ? 80 : e - q), q);
      free(cat); goto out;
    }
    size_t la = (size_t)(sp1 - q), lb = (size_t)(e - sp1 - 1);
    int64_t *a = bpe_smap_get(&strs, q, la, bpe_hash(q, la));
    int64_t *b = bpe_smap_get(&strs, sp1 + 1, lb, bpe_hash(sp1 + 1, lb));
    if (!a || !b) {
      em_error("%s: line %zu: token '%.*s' is not in '%s'", what, line, (int)(a ? lb : la), a ? sp1 + 1 : q, vocab_path);
      free(cat); goto out;
    }
    if (la + lb > catcap) {
      catcap = 2 * (la + lb);
      char *c = realloc(cat, catcap);
      if (!c) { free(cat); em_error_oom("out of memory: %s", fn); goto out; }
      cat = c;
    }
    memcpy(cat, q, la); memcpy(cat + la, sp1 + 1, lb);
    int64_t *res = bpe_smap_get(&strs, cat, la + lb, bpe_hash(cat, la + lb));
    if (!res) {
      em_error("%s: line %zu: the merged token '%.*s' is not in '%s'", what, line, (int)(la + lb), cat, vocab_path);
      free(cat); goto out;
    }
    made[*res] = true;
    if (nm == cap) {
      cap *= 2;
      void *g = realloc(mg, cap * sizeof *mg);
      if (!g) { free(cat); em_error_oom("out of memory: %s", fn); goto out; }
      mg = g;
    }
    mg[nm][0] = (int32_t)*a; mg[nm][1] = (int32_t)*b; nm++;
  }
  free(cat);
  /* tokens: a byte character, a merge's result, or else a special token */
  pthread_once(&table_once, make_table);
  snprintf(what, sizeof what, "%s: '%s'", fn, vocab_path);
  for (int32_t i = 0; i < n; i++) {
    const jm_member *m = by_id[i];
    size_t j = 0;
    uint32_t c = m->key_len ? next_cp((const unsigned char *)m->key, &j) : 0;
    bool byte = m->key_len && j == m->key_len && c < 324 && unicode_to_byte[c] >= 0;
    char where[200];
    snprintf(where, sizeof where, "key '%.100s'", m->key);
    if (vocab_set(&v, i, m->key, m->key_len, !byte && !made[i], fn, vocab_path, where)) goto out;
  }
  if (nm > INT32_MAX) { em_error("%s: too many merges", what); goto out; }
  t = finish(what, &v, (int)nm, mg, EM_GPT2_PATTERN);
out:
  vocab_free(&v);
  free(mg); free(made); free(by_id); free(text);
  bpe_smap_free(&strs);
  jm_free(&root);
  return t;
}
