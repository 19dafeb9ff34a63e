/* The tokenizer's containers: two open-addressing hash tables with linear
 * probing (byte string -> int64 with keys in one arena; id pair -> int32), kept
 * at most half full. Why not one generic table: the trainer's hot loop updates
 * pair counts millions of times, and a pair key is one uint64 compare. Also
 * GPT-2's byte <-> code point table and the core count. */
#include <unistd.h>
#include "internal.h"
#include "data/bpe.h"

uint64_t bpe_hash(const char *s, size_t n) {
  /* 8 bytes at a time, multiply-xorshift mixing; never 0 (0 marks an empty slot) */
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, s + i, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  uint64_t w = 0;
  for (size_t k = 0; i + k < n; k++) w |= (uint64_t)(uint8_t)s[i + k] << (8 * k);
  h = (h ^ w) * 0x94d049bb133111ebull;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return h ? h : 1;
}

int bpe_smap_init(bpe_smap *m, size_t cap) {
  memset(m, 0, sizeof *m);
  size_t c = 16;
  while (c < cap * 2) c *= 2;
  m->cap = c;
  m->hash = calloc(c, sizeof *m->hash);
  m->val = malloc(c * sizeof *m->val);
  m->koff = malloc(c * sizeof *m->koff);
  m->klen = malloc(c * sizeof *m->klen);
  if (!m->hash || !m->val || !m->koff || !m->klen) { bpe_smap_free(m); return -1; }
  return 0;
}

void bpe_smap_free(bpe_smap *m) {
  free(m->hash); free(m->val); free(m->koff); free(m->klen); free(m->arena);
  memset(m, 0, sizeof *m);
}

void bpe_smap_clear(bpe_smap *m) {
  if (m->hash) memset(m->hash, 0, m->cap * sizeof *m->hash);
  m->n = 0;
  m->arena_len = 0;
}

static int smap_grow(bpe_smap *m) {
  bpe_smap g = *m;
  size_t c = m->cap * 2;
  g.cap = c;
  g.hash = calloc(c, sizeof *g.hash);
  g.val = malloc(c * sizeof *g.val);
  g.koff = malloc(c * sizeof *g.koff);
  g.klen = malloc(c * sizeof *g.klen);
  if (!g.hash || !g.val || !g.koff || !g.klen) {
    free(g.hash); free(g.val); free(g.koff); free(g.klen);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->hash[i]) continue;
    size_t j = m->hash[i] & (c - 1);
    while (g.hash[j]) j = (j + 1) & (c - 1);
    g.hash[j] = m->hash[i]; g.val[j] = m->val[i]; g.koff[j] = m->koff[i]; g.klen[j] = m->klen[i];
  }
  free(m->hash); free(m->val); free(m->koff); free(m->klen);
  *m = g;
  return 0;
}

int64_t *bpe_smap_get(const bpe_smap *m, const char *s, size_t n, uint64_t h) {
  if (!m->cap) return NULL;
  for (size_t j = h & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
    if (!m->hash[j]) return NULL;
    if (m->hash[j] == h && m->klen[j] == n && memcmp(m->arena + m->koff[j], s, n) == 0) return &m->val[j];
  }
}

int64_t *bpe_smap_put(bpe_smap *m, const char *s, size_t n, uint64_t h, int64_t def, bool *added) {
  if (added) *added = false;
  if ((m->n + 1) * 2 > m->cap && smap_grow(m)) return NULL;
  size_t j = h & (m->cap - 1);
  for (;; j = (j + 1) & (m->cap - 1)) {
    if (!m->hash[j]) break;
    if (m->hash[j] == h && m->klen[j] == n && memcmp(m->arena + m->koff[j], s, n) == 0) return &m->val[j];
  }
  if (n > UINT32_MAX) return NULL;
  if (m->arena_len + n + 1 > m->arena_cap) {
    size_t c = m->arena_cap ? m->arena_cap : 4096;
    while (c < m->arena_len + n + 1) c *= 2;
    char *a = realloc(m->arena, c);
    if (!a) return NULL;
    m->arena = a;
    m->arena_cap = c;
  }
  memcpy(m->arena + m->arena_len, s, n);
  m->arena[m->arena_len + n] = 0;
  m->hash[j] = h; m->val[j] = def; m->koff[j] = m->arena_len; m->klen[j] = (uint32_t)n;
  m->arena_len += n + 1;
  m->n++;
  if (added) *added = true;
  return &m->val[j];
}

static inline size_t pmap_slot(uint64_t k, size_t cap) {
  k ^= k >> 33; k *= 0xff51afd7ed558ccdull; k ^= k >> 33;
  return k & (cap - 1);
}

int bpe_pmap_init(bpe_pmap *m, size_t cap) {
  size_t c = 16;
  while (c < cap * 2) c *= 2;
  m->cap = c; m->n = 0;
  m->key = malloc(c * sizeof *m->key);
  m->val = malloc(c * sizeof *m->val);
  if (!m->key || !m->val) { bpe_pmap_free(m); return -1; }
  memset(m->key, 0xff, c * sizeof *m->key);
  return 0;
}

void bpe_pmap_free(bpe_pmap *m) {
  free(m->key); free(m->val);
  memset(m, 0, sizeof *m);
}

int32_t bpe_pmap_get(const bpe_pmap *m, uint64_t key) {
  if (!m->cap) return -1;
  for (size_t j = pmap_slot(key, m->cap);; j = (j + 1) & (m->cap - 1)) {
    if (m->key[j] == key) return m->val[j];
    if (m->key[j] == UINT64_MAX) return -1;
  }
}

int32_t *bpe_pmap_put(bpe_pmap *m, uint64_t key, int32_t def, bool *added) {
  if (added) *added = false;
  if ((m->n + 1) * 2 > m->cap) {
    bpe_pmap g;
    if (bpe_pmap_init(&g, m->cap)) return NULL;   /* twice the slots */
    for (size_t i = 0; i < m->cap; i++) {
      if (m->key[i] == UINT64_MAX) continue;
      size_t j = pmap_slot(m->key[i], g.cap);
      while (g.key[j] != UINT64_MAX) j = (j + 1) & (g.cap - 1);
      g.key[j] = m->key[i]; g.val[j] = m->val[i];
    }
    g.n = m->n;
    bpe_pmap_free(m);
    *m = g;
  }
  size_t j = pmap_slot(key, m->cap);
  for (; m->key[j] != UINT64_MAX; j = (j + 1) & (m->cap - 1))
    if (m->key[j] == key) return &m->val[j];
  m->key[j] = key; m->val[j] = def; m->n++;
  if (added) *added = true;
  return &m->val[j];
}

int bpe_ids_push(bpe_ids *a, int32_t id) {
  if (a->n == a->cap) {
    size_t c = a->cap ? a->cap * 2 : 256;
    int32_t *v = realloc(a->v, c * sizeof *v);
    if (!v) return em_error_oom("out of memory: tokenizer: %zu ids", c);
    a->v = v; a->cap = c;
  }
  a->v[a->n++] = id;
  return 0;
}

/* GPT-2 (encoder.py): printable Latin-1 bytes stand for themselves; the other
 * 68 bytes, in order, take the code points 256, 257, ... */
uint32_t bpe_byte_to_unicode(uint8_t b) {
  if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE)) return b;
  uint32_t n = 0;
  for (int c = 0; c < b; c++)
    if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) n++;
  return 256 + n;
}

int bpe_ncores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}
