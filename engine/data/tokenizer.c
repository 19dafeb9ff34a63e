/* Byte-level BPE: building a tokenizer from a vocabulary and merges, encoding,
 * decoding, and streaming a file into a .npy of ids.
 *
 * Encoding a pre-token applies its merges by rank, lowest first, as GPT-2's
 * encoder.py and tiktoken do: a scan per merge for the few bytes of a word, a
 * heap for long pre-tokens (no quadratic time on a megabyte of 'a'); a cache (pre-token -> ids, cleared when full)
 * makes repeated words a hash look-up. Special tokens are found first
 * (leftmost, then longest) and never reach the pattern.
 *
 * encode_file reads rounds of threads x chunk_bytes, cuts each round at safe
 * places (pretok.c: a special token's edges, or a non-space byte followed by a
 * space, never closer to the end than the longest special token) so every
 * piece tokenises alone as it does in the whole text, encodes the pieces on
 * worker threads (each with its own matcher and cache) and appends the ids in
 * order to a .npy written in place (engine/io's streaming writer). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/stat.h>
#include "internal.h"
#include "data/bpe.h"

#define CACHE_DEFAULT 65536

/* s[0..n) printable for messages ("\xff" for other bytes), truncated. */
static const char *show(char *buf, size_t cap, const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n && k + 5 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7f && c != '\\') buf[k++] = (char)c;
    else k += (size_t)snprintf(buf + k, cap - k, "\\x%02x", c);
  }
  buf[k] = 0;
  return buf;
}

void em_tokenizer_free(em_tokenizer *t) {
  if (!t) return;
  if (t->tok) for (int32_t i = 0; i < t->n_vocab; i++) free(t->tok[i]);
  free(t->tok); free(t->tok_len); free(t->special); free(t->merges);
  bpe_pmap_free(&t->ranks);
  bpe_smap_free(&t->ids);
  free(t->special_ids); free(t->special_s); free(t->special_len);
  free(t->pattern);
  bpe_regex_free(t->re);
  bpe_cache_free(&t->cache);
  free(t);
}

em_tokenizer *bpe_build(const char *what, int32_t n, char **toks, uint32_t *lens, const bool *special,
                        int n_merges, const int32_t (*merges)[2], const char *pattern) {
  char b1[96], b2[96];
  em_tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    for (int32_t i = 0; i < n; i++) free(toks[i]);
    free(toks); free(lens);
    em_error_oom("out of memory: %s: tokenizer", what);
    return NULL;
  }
  t->n_vocab = n; t->tok = toks; t->tok_len = lens;
  t->cache.max = CACHE_DEFAULT;
  t->special = calloc((size_t)n + 1, sizeof *t->special);
  t->merges = malloc(((size_t)n_merges + 1) * sizeof *t->merges);
  t->pattern = strdup(pattern ? pattern : EM_GPT2_PATTERN);
  if (!t->special || !t->merges || !t->pattern || bpe_smap_init(&t->ids, (size_t)n) ||
      bpe_pmap_init(&t->ranks, (size_t)n_merges)) {
    em_error_oom("out of memory: %s: tokenizer", what);
    goto fail;
  }
  for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
  for (int32_t i = 0; i < n; i++) {
    t->special[i] = special && special[i];
    if (lens[i] == 0) { em_error("%s: token %d is empty", what, i); goto fail; }
    bool added;
    int64_t *v = bpe_smap_put(&t->ids, toks[i], lens[i], bpe_hash(toks[i], lens[i]), i, &added);
    if (!v) { em_error_oom("out of memory: %s: vocabulary", what); goto fail; }
    if (!added) {
      em_error("%s: tokens %lld and %d are the same bytes '%s' (each token must be unique)", what,
               (long long)*v, i, show(b1, sizeof b1, toks[i], lens[i]));
      goto fail;
    }
    if (t->special[i]) t->n_special++;
    else if (lens[i] == 1) t->byte_id[(unsigned char)toks[i][0]] = i;
  }
  for (int b = 0; b < 256; b++)
    if (t->byte_id[b] < 0) {
      em_error("%s: no token for the byte 0x%02x (a byte-level BPE vocabulary has all 256 single bytes)", what, b);
      goto fail;
    }
  t->special_ids = malloc(((size_t)t->n_special + 1) * sizeof *t->special_ids);
  t->special_s = malloc(((size_t)t->n_special + 1) * sizeof *t->special_s);
  t->special_len = malloc(((size_t)t->n_special + 1) * sizeof *t->special_len);
  if (!t->special_ids || !t->special_s || !t->special_len) { em_error_oom("out of memory: %s", what); goto fail; }
  for (int32_t i = 0, k = 0; i < n; i++)
    if (t->special[i]) {
      t->special_ids[k] = i; t->special_s[k] = toks[i]; t->special_len[k] = lens[i];
      if (lens[i] > t->max_special_len) t->max_special_len = lens[i];
      k++;
    }
  char *cat = NULL;
  size_t catcap = 0;
  for (int r = 0; r < n_merges; r++) {
    int32_t a = merges[r][0], b = merges[r][1];
    if (a < 0 || a >= n || b < 0 || b >= n) {
      em_error("%s: merge %d: ids (%d, %d) outside the vocabulary [0, %d)", what, r, a, b, n);
      free(cat); goto fail;
    }
    if (t->special[a] || t->special[b]) {
      em_error("%s: merge %d: merges special token %d", what, r, t->special[a] ? a : b);
      free(cat); goto fail;
    }
    size_t la = lens[a], lb = lens[b];
    if (la + lb > catcap) {
      catcap = (la + lb) * 2;
      char *c = realloc(cat, catcap);
      if (!c) { free(cat); em_error_oom("out of memory: %s", what); goto fail; }
      cat = c;
    }
    memcpy(cat, toks[a], la); memcpy(cat + la, toks[b], lb);
    int64_t *res = bpe_smap_get(&t->ids, cat, la + lb, bpe_hash(cat, la + lb));
    if (!res || t->special[*res]) {
      em_error("%s: merge %d ('%s' + '%s'): the merged token '%s' is not in the vocabulary", what, r,
               show(b1, sizeof b1, toks[a], la), show(b2, sizeof b2, toks[b], lb),
               show((char[200]){0}, 200, cat, la + lb));
      free(cat); goto fail;
    }
    bool added;
    int32_t *slot = bpe_pmap_put(&t->ranks, bpe_pair(a, b), r, &added);
    if (!slot) { free(cat); em_error_oom("out of memory: %s", what); goto fail; }
    if (!added) {
      em_error("%s: merge %d ('%s' + '%s') repeats merge %d", what, r, show(b1, sizeof b1, toks[a], la),
               show(b2, sizeof b2, toks[b], lb), *slot);
      free(cat); goto fail;
    }
    t->merges[r][0] = a; t->merges[r][1] = b; t->merges[r][2] = (int32_t)*res;
  }
  free(cat);
  t->n_merges = n_merges;
  if (!(t->re = bpe_regex_new(t->pattern, what))) goto fail;
  return t;
fail:
  em_tokenizer_free(t);
  return NULL;
}

/* ---- accessors ---- */

int em_tokenizer_vocab_size(const em_tokenizer *t) { return t->n_vocab; }
int em_tokenizer_n_merges(const em_tokenizer *t) { return t->n_merges; }
int em_tokenizer_n_special(const em_tokenizer *t) { return t->n_special; }
const char *em_tokenizer_pattern(const em_tokenizer *t) { return t->pattern; }

int em_tokenizer_merge(const em_tokenizer *t, int r, int32_t *a, int32_t *b, int32_t *out) {
  if (r < 0 || r >= t->n_merges) return em_error("tokenizer.merge: rank %d outside [0, %d)", r, t->n_merges);
  *a = t->merges[r][0]; *b = t->merges[r][1]; *out = t->merges[r][2];
  return 0;
}

int32_t em_tokenizer_special(const em_tokenizer *t, int i) {
  return i >= 0 && i < t->n_special ? t->special_ids[i] : -1;
}

const char *em_tokenizer_token(const em_tokenizer *t, int32_t id, size_t *len) {
  if (id < 0 || id >= t->n_vocab) {
    em_error("tokenizer.token_of: expected an id in [0, %d), got %d", t->n_vocab, id);
    return NULL;
  }
  *len = t->tok_len[id];
  return t->tok[id];
}

int32_t em_tokenizer_id(const em_tokenizer *t, const char *s, size_t len) {
  int64_t *v = bpe_smap_get(&t->ids, s, len, bpe_hash(s, len));
  return v ? (int32_t)*v : -1;
}

bool em_tokenizer_is_special(const em_tokenizer *t, int32_t id) {
  return id >= 0 && id < t->n_vocab && t->special[id];
}

/* ---- encoding ---- */

void bpe_cache_free(bpe_cache *c) {
  bpe_smap_free(&c->map);
  free(c->ids);
  c->ids = NULL; c->ids_len = c->ids_cap = 0;
}

size_t em_tokenizer_set_cache(em_tokenizer *t, size_t max_entries) {
  size_t old = t->cache.max;
  bpe_cache_free(&t->cache);
  t->cache.max = max_entries;
  return old;
}

/* A long pre-token (a run of one character, a base64 blob): the lowest rank
 * found through a min-heap of (rank, position) over a linked list of symbols,
 * entries checked when popped; O(n log n) where the scan below is O(n^2). The
 * same merges in the same order: lowest rank, then leftmost. */
typedef struct { int32_t rank, pos, left, right; } wheap_ent;

static bool wh_less(const wheap_ent *a, const wheap_ent *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void wh_push(wheap_ent *h, size_t *n, wheap_ent e) {
  size_t i = (*n)++;
  while (i > 0 && wh_less(&e, &h[(i - 1) / 2])) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
  h[i] = e;
}

static wheap_ent wh_pop(wheap_ent *h, size_t *n) {
  wheap_ent top = h[0], last = h[--*n];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, b = i;
    const wheap_ent *best = &last;
    if (l < *n && wh_less(&h[l], best)) { b = l; best = &h[l]; }
    if (r < *n && wh_less(&h[r], best)) b = r;
    if (b == i) break;
    h[i] = h[b];
    i = b;
  }
  if (*n) h[i] = last;
  return top;
}

static int encode_long_word(const em_tokenizer *t, const char *p, size_t n, bpe_ids *out) {
  int32_t *id = malloc(n * sizeof *id), *nx = malloc(n * sizeof *nx), *pv = malloc(n * sizeof *pv);
  wheap_ent *h = malloc(2 * n * sizeof *h);       /* n - 1 initial pairs + at most 2 per merge (n - 1 merges) */
  int rc = 0;
  if (!id || !nx || !pv || !h) { rc = em_error_oom("out of memory: tokenizer.encode: a pre-token of %zu bytes", n); goto out; }
  size_t nh = 0;
  for (size_t i = 0; i < n; i++) {
    id[i] = t->byte_id[(unsigned char)p[i]];
    nx[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    pv[i] = (int32_t)i - 1;
  }
  for (size_t i = 0; i + 1 < n; i++) {
    int32_t r = bpe_pmap_get(&t->ranks, bpe_pair(id[i], id[i + 1]));
    if (r >= 0) wh_push(h, &nh, (wheap_ent){r, (int32_t)i, id[i], id[i + 1]});
  }
  while (nh) {
    wheap_ent e = wh_pop(h, &nh);
    int32_t q = nx[e.pos];
    if (id[e.pos] != e.left || q < 0 || id[q] != e.right) continue;   /* stale: a neighbour merged */
    id[e.pos] = t->merges[e.rank][2];
    id[q] = -1;                                   /* gone */
    nx[e.pos] = nx[q];
    if (nx[q] >= 0) pv[nx[q]] = e.pos;
    int32_t a = pv[e.pos], b = nx[e.pos], r;
    if (a >= 0 && (r = bpe_pmap_get(&t->ranks, bpe_pair(id[a], id[e.pos]))) >= 0)
      wh_push(h, &nh, (wheap_ent){r, a, id[a], id[e.pos]});
    if (b >= 0 && (r = bpe_pmap_get(&t->ranks, bpe_pair(id[e.pos], id[b]))) >= 0)
      wh_push(h, &nh, (wheap_ent){r, e.pos, id[e.pos], id[b]});
  }
  for (int32_t i = 0; i >= 0 && !rc; i = nx[i]) rc = bpe_ids_push(out, id[i]);
out:
  free(id); free(nx); free(pv); free(h);
  return rc;
}

/* Merge the bytes of one pre-token by rank and append the ids. */
static int encode_word(const em_tokenizer *t, const char *p, size_t n, bpe_ids *out) {
  if (n > 64) return encode_long_word(t, p, n, out);
  int32_t stack[64], *sym = n <= 64 ? stack : malloc(n * sizeof *sym);
  if (!sym) return em_error_oom("out of memory: tokenizer.encode: a pre-token of %zu bytes", n);
  for (size_t i = 0; i < n; i++) sym[i] = t->byte_id[(unsigned char)p[i]];
  size_t m = n;
  while (m > 1) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < m; i++) {
      int32_t r = bpe_pmap_get(&t->ranks, bpe_pair(sym[i], sym[i + 1]));
      if (r >= 0 && r < best) { best = r; at = i; }
    }
    if (best == INT32_MAX) break;
    sym[at] = t->merges[best][2];
    memmove(sym + at + 1, sym + at + 2, (m - at - 2) * sizeof *sym);
    m--;
  }
  int rc = 0;
  for (size_t i = 0; i < m && !rc; i++) rc = bpe_ids_push(out, sym[i]);
  if (sym != stack) free(sym);
  return rc;
}

#define CACHE_MAX_WORD 256      /* longer pre-tokens are not cached */

static int encode_cached(const em_tokenizer *t, bpe_cache *c, const char *p, size_t n, bpe_ids *out) {
  if (!c || !c->max || n > CACHE_MAX_WORD) return encode_word(t, p, n, out);
  uint64_t h = bpe_hash(p, n);
  if (c->map.cap) {
    int64_t *v = bpe_smap_get(&c->map, p, n, h);
    if (v) {
      size_t off = (size_t)(*v >> 16), cnt = (size_t)(*v & 0xffff);
      for (size_t i = 0; i < cnt; i++)
        if (bpe_ids_push(out, c->ids[off + i])) return -1;
      return 0;
    }
  } else if (bpe_smap_init(&c->map, 1024)) {
    return encode_word(t, p, n, out);            /* no cache is still an answer */
  }
  size_t start = out->n;
  if (encode_word(t, p, n, out)) return -1;
  size_t cnt = out->n - start;
  if (c->map.n >= c->max) { bpe_smap_clear(&c->map); c->ids_len = 0; }
  if (c->ids_len + cnt > c->ids_cap) {
    size_t cap = c->ids_cap ? c->ids_cap * 2 : 4096;
    while (cap < c->ids_len + cnt) cap *= 2;
    int32_t *v = realloc(c->ids, cap * sizeof *v);
    if (!v) return 0;
    c->ids = v; c->ids_cap = cap;
  }
  memcpy(c->ids + c->ids_len, out->v + start, cnt * sizeof *out->v);
  if (bpe_smap_put(&c->map, p, n, h, (int64_t)((c->ids_len << 16) | cnt), NULL)) c->ids_len += cnt;
  return 0;
}

typedef struct { const em_tokenizer *t; bpe_cache *c; bpe_ids *out; } enc_ctx;

static int enc_piece(const char *p, size_t n, void *u) {
  enc_ctx *e = u;
  return encode_cached(e->t, e->c, p, n, e->out);
}

int bpe_encode_text(const em_tokenizer *t, bpe_matcher *m, bpe_cache *c, const char *text, size_t n, bpe_ids *out) {
  enc_ctx e = {t, c, out};
  if (!t->n_special) return bpe_pretok(m, text, n, enc_piece, &e);
  bpe_special_scan sc;
  if (bpe_special_scan_init(&sc, t->n_special, t->special_s, t->special_len)) return -1;
  size_t pos = 0;
  int rc = 0;
  while (!rc) {
    int which;
    size_t s = bpe_special_next(&sc, text, n, pos, &which);
    if (s > pos) rc = bpe_pretok(m, text + pos, s - pos, enc_piece, &e);
    if (rc || s >= n) break;
    rc = bpe_ids_push(out, t->special_ids[which]);
    pos = s + t->special_len[which];
  }
  bpe_special_scan_free(&sc);
  return rc;
}

int64_t em_tokenizer_encode(em_tokenizer *t, const char *text, size_t len, int32_t **ids) {
  *ids = NULL;
  bpe_matcher *m = bpe_matcher_new(t->re);
  if (!m) return -1;
  bpe_ids out = {0};
  int rc = bpe_encode_text(t, m, &t->cache, text, len, &out);
  bpe_matcher_free(m);
  if (rc) { free(out.v); return rc < 0 ? rc : EM_ERR; }
  *ids = out.v;
  return (int64_t)out.n;
}

/* ---- pre-tokens alone (for tests and for looking) ---- */

typedef struct { void (*fn)(const char *, size_t, bool, void *); void *u; } pre_ctx;
static int pre_piece(const char *p, size_t n, void *u) {
  pre_ctx *c = u;
  c->fn(p, n, false, c->u);
  return 0;
}

int em_tokenizer_pretokenize(const char *pattern, int n_special, const char *const *special,
                             const char *text, size_t len,
                             void (*fn)(const char *piece, size_t n, bool is_special, void *u), void *u) {
  bpe_regex *re = bpe_regex_new(pattern ? pattern : EM_GPT2_PATTERN, "tokenizer.pretokenize");
  if (!re) return EM_ERR;
  bpe_matcher *m = bpe_matcher_new(re);
  size_t *lens = calloc((size_t)n_special + 1, sizeof *lens);
  int rc = m && lens ? 0 : em_error_oom("out of memory: tokenizer.pretokenize");
  for (int i = 0; i < n_special && !rc; i++) {
    lens[i] = strlen(special[i]);
    if (!lens[i]) rc = em_error("tokenizer.pretokenize: special token %d is empty", i + 1);
  }
  bpe_special_scan sc = {0};
  if (!rc) rc = bpe_special_scan_init(&sc, n_special, special, lens);
  pre_ctx c = {fn, u};
  size_t pos = 0;
  while (!rc) {
    int which;
    size_t s = bpe_special_next(&sc, text, len, pos, &which);
    if (s > pos) rc = bpe_pretok(m, text + pos, s - pos, pre_piece, &c);
    if (rc || s >= len) break;
    fn(text + s, lens[which], true, u);
    pos = s + lens[which];
  }
  bpe_special_scan_free(&sc);
  free(lens);
  bpe_matcher_free(m);
  bpe_regex_free(re);
  return rc;
}

/* ---- decoding ---- */

int64_t em_tokenizer_decode(const em_tokenizer *t, const int32_t *ids, size_t n, char **out) {
  *out = NULL;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->n_vocab)
      return em_error("tokenizer.decode: expected ids in [0, %d), got %d at position %zu", t->n_vocab, ids[i], i + 1);
    total += t->tok_len[ids[i]];
  }
  char *s = malloc(total + 1);
  if (!s) return em_error_oom("out of memory: tokenizer.decode: %zu bytes", total);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) { memcpy(s + k, t->tok[ids[i]], t->tok_len[ids[i]]); k += t->tok_len[ids[i]]; }
  s[k] = 0;
  *out = s;
  return (int64_t)k;
}

char *em_utf8_replace(const char *str, size_t len, size_t *out_len) {
  const unsigned char *s = (const unsigned char *)str;
  char *o = malloc(len * 3 + 1);                 /* one byte becomes at most U+FFFD's 3 */
  if (!o) return NULL;
  size_t k = 0, i = 0;
  while (i < len) {
    unsigned char c = s[i];
    if (c < 0x80) { o[k++] = (char)c; i++; continue; }
    int need; unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c >= 0xE1 && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else need = -1;
    size_t j = 1;
    if (need > 0) {
      for (; j <= (size_t)need && i + j < len; j++) {   /* the maximal subpart: stop at the first bad byte */
        unsigned char d = s[i + j];
        if (d < lo || d > hi) break;
        lo = 0x80; hi = 0xBF;
      }
      if (j == (size_t)need + 1) { memcpy(o + k, s + i, j); k += j; i += j; continue; }
    }
    memcpy(o + k, "\xEF\xBF\xBD", 3); k += 3;
    i += j;
  }
  o[k] = 0;
  if (out_len) *out_len = k;
  return o;
}

/* ---- streaming a file ---- */

typedef struct {
  const em_tokenizer *t;
  bpe_matcher *m;
  bpe_cache cache;
  const char *text;
  size_t n;
  bpe_ids out;
  int rc;
  char err[1024];
  int err_code;
} enc_worker;

static void *enc_run(void *p) {
  enc_worker *w = p;
  w->out.n = 0;
  w->rc = bpe_encode_text(w->t, w->m, &w->cache, w->text, w->n, &w->out);
  if (w->rc) { snprintf(w->err, sizeof w->err, "%s", em_last_error()); w->err_code = em_last_error_code(); }
  return NULL;
}

/* Cut positions of buf[0..end) into k pieces near equal size: cuts[0] = 0,
 * cuts[k] = end, each inner cut safe (or equal to the previous one). Special
 * tokens' spans (spans, ns of them) are never cut inside. */
static bool inside_special(const size_t (*spans)[2], size_t ns, size_t p) {
  for (size_t i = 0; i < ns; i++)
    if (spans[i][0] < p && p < spans[i][1]) return true;
  return false;
}

static size_t find_cut(const char *buf, size_t lo, size_t hi, const size_t (*spans)[2], size_t ns) {
  /* a special token's edge is always a cut; otherwise a safe cut outside every special */
  size_t best = 0;
  for (size_t i = 0; i < ns; i++) {
    if (spans[i][1] > lo && spans[i][1] <= hi && spans[i][1] > best) best = spans[i][1];
    if (spans[i][0] > lo && spans[i][0] <= hi && spans[i][0] > best) best = spans[i][0];
  }
  size_t p = hi;
  while (p > lo && p > best) {
    p = bpe_safe_cut(buf, lo, p);
    if (!p || p <= best) break;
    if (!inside_special(spans, ns, p)) return p;
    p--;
  }
  return best;
}

static int read_more(int fd, char *buf, size_t want, size_t *got, const char *path) {
  *got = 0;
  while (*got < want) {
    ssize_t r = read(fd, buf + *got, want - *got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return em_error_code(EM_ERR_IO, "tokenizer.encode_file: cannot read '%s': %s", path, strerror(errno));
    if (r == 0) break;
    *got += (size_t)r;
  }
  return 0;
}

int64_t em_tokenizer_encode_file(em_tokenizer *t, const char *in_path, const char *out_path,
                                 const em_bpe_file_options *o) {
  em_bpe_file_options def = {0};
  if (!o) o = &def;
  size_t chunk = o->chunk_bytes ? o->chunk_bytes : (4u << 20);
  int nt = o->threads > 0 ? o->threads : bpe_ncores();
  if (nt > 64) nt = 64;
  int fd = open(in_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return em_error_code(EM_ERR_IO, "tokenizer.encode_file: cannot open '%s': %s", in_path, strerror(errno));
  struct stat st;
  uint64_t total = fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
  em_dtype dt = t->n_vocab <= 65536 ? EM_U16 : EM_I32;
  em_npy_writer *npy = em_npy_writer_open(out_path, dt);
  if (!npy) { close(fd); return -1; }
  enc_worker *w = calloc((size_t)nt, sizeof *w);
  pthread_t *th = calloc((size_t)nt, sizeof *th);
  size_t cap = chunk * (size_t)nt + t->max_special_len + 1, len = 0;
  char *buf = malloc(cap);
  size_t (*spans)[2] = NULL, nspans = 0, spans_cap = 0;
  void *conv = NULL;
  size_t conv_cap = 0;
  int64_t count = 0;
  uint64_t done = 0;
  int rc = w && th && buf ? 0 : em_error_oom("out of memory: tokenizer.encode_file: buffers");
  for (int i = 0; i < nt && !rc; i++) {
    w[i].t = t;
    w[i].cache.max = t->cache.max;
    if (!(w[i].m = bpe_matcher_new(t->re))) rc = -1;
  }
  bpe_special_scan sc = {0};
  bool eof = false;
  while (!rc && !eof) {
    size_t want = chunk * (size_t)nt;
    if (len + want + 1 > cap) {
      size_t c = len + want + 1;
      char *b = realloc(buf, c);
      if (!b) { rc = em_error_oom("out of memory: tokenizer.encode_file: %zu bytes", c); break; }
      buf = b; cap = c;
    }
    size_t got;
    if ((rc = read_more(fd, buf + len, want, &got, in_path))) break;
    eof = got < want;
    len += got;
    /* where the special tokens are in this buffer (it starts at a cut) */
    nspans = 0;
    if (t->n_special) {
      if ((rc = bpe_special_scan_init(&sc, t->n_special, t->special_s, t->special_len))) break;
      for (size_t pos = 0;;) {
        int which;
        size_t s = bpe_special_next(&sc, buf, len, pos, &which);
        if (s >= len) break;
        if (nspans == spans_cap) {
          spans_cap = spans_cap ? spans_cap * 2 : 64;
          void *p = realloc(spans, spans_cap * sizeof *spans);
          if (!p) { rc = em_error_oom("out of memory: tokenizer.encode_file"); break; }
          spans = p;
        }
        spans[nspans][0] = s; spans[nspans][1] = s + t->special_len[which];
        nspans++;
        pos = s + t->special_len[which];
      }
      bpe_special_scan_free(&sc);
      if (rc) break;
    }
    /* the end of this round: all of it at EOF, else the last cut that leaves room for a special token */
    size_t end = len;
    if (!eof) {
      size_t hi = len > t->max_special_len ? len - t->max_special_len : 0;
      end = hi ? find_cut(buf, 0, hi, spans, nspans) : 0;
      if (!end) continue;                            /* no cut yet: read more */
    }
    /* pieces for the workers */
    size_t cuts[65];
    int np = 0;
    cuts[0] = 0;
    for (int i = 1; i < nt; i++) {
      size_t target = end / (size_t)nt * (size_t)i;
      size_t c = target > cuts[np] ? find_cut(buf, cuts[np], target, spans, nspans) : 0;
      if (c > cuts[np]) cuts[++np] = c;
    }
    cuts[++np] = end;
    for (int i = 0; i < np; i++) { w[i].text = buf + cuts[i]; w[i].n = cuts[i + 1] - cuts[i]; }
    if (np == 1) enc_run(&w[0]);
    else {
      int started = 0;
      for (; started < np; started++)
        if (pthread_create(&th[started], NULL, enc_run, &w[started])) break;
      for (int i = started; i < np; i++) enc_run(&w[i]);   /* no thread: run it here */
      for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    }
    for (int i = 0; i < np && !rc; i++) {
      if (w[i].rc) { rc = em_error_code(w[i].err_code ? w[i].err_code : EM_ERR, "%s", w[i].err); break; }
      size_t n = w[i].out.n, esz = dt == EM_U16 ? 2 : 4;
      if (n * esz > conv_cap) {
        void *p = realloc(conv, n * esz);
        if (!p) { rc = em_error_oom("out of memory: tokenizer.encode_file"); break; }
        conv = p; conv_cap = n * esz;
      }
      if (dt == EM_U16) for (size_t k = 0; k < n; k++) ((uint16_t *)conv)[k] = (uint16_t)w[i].out.v[k];
      else memcpy(conv, w[i].out.v, n * 4);
      if ((rc = em_npy_writer_append(npy, conv, (int64_t)n))) break;
      count += (int64_t)n;
    }
    if (rc) break;
    memmove(buf, buf + end, len - end);
    len -= end;
    done += end;
    if (o->progress && o->progress(o->progress_u, done, total, count))
      rc = em_error("tokenizer.encode_file: stopped by the progress callback");
  }
  for (int i = 0; w && i < nt; i++) { bpe_matcher_free(w[i].m); bpe_cache_free(&w[i].cache); free(w[i].out.v); }
  free(w); free(th); free(buf); free(spans); free(conv);
  close(fd);
  if (rc) { em_npy_writer_abort(npy); return rc < 0 ? rc : EM_ERR; }
  if (em_npy_writer_close(npy)) return -1;
  return count;
}
