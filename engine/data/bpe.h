/* What the tokenizer's files share (engine/data/tokenizer*.c, pretok.c): the
 * tokenizer struct, two open-addressing hash tables (byte string -> int64 and
 * id pair -> int32), and the pre-tokeniser. Not public API. */
#ifndef EMBER_BPE_H
#define EMBER_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "ember/tokenizer.h"

/* ---- byte string -> int64 (keys copied into an arena) ---- */
typedef struct {
  uint64_t *hash;        /* 0: empty slot */
  int64_t *val;
  uint64_t *koff;        /* key offset in arena */
  uint32_t *klen;
  size_t cap, n;         /* cap a power of two */
  char *arena;
  size_t arena_len, arena_cap;
} bpe_smap;

uint64_t bpe_hash(const char *s, size_t n);
int bpe_smap_init(bpe_smap *m, size_t cap);
void bpe_smap_free(bpe_smap *m);
void bpe_smap_clear(bpe_smap *m);
/* The value slot of key (inserted with *val = def when absent), or NULL on OOM. */
int64_t *bpe_smap_put(bpe_smap *m, const char *s, size_t n, uint64_t h, int64_t def, bool *added);
/* The value slot of key, or NULL. */
int64_t *bpe_smap_get(const bpe_smap *m, const char *s, size_t n, uint64_t h);
static inline const char *bpe_smap_key(const bpe_smap *m, size_t slot) { return m->arena + m->koff[slot]; }

/* ---- (a, b) id pair -> int32 ---- */
typedef struct {
  uint64_t *key;         /* UINT64_MAX: empty */
  int32_t *val;
  size_t cap, n;
} bpe_pmap;

static inline uint64_t bpe_pair(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
int bpe_pmap_init(bpe_pmap *m, size_t cap);
void bpe_pmap_free(bpe_pmap *m);
/* The value slot of key (inserted with def when absent), or NULL on OOM. */
int32_t *bpe_pmap_put(bpe_pmap *m, uint64_t key, int32_t def, bool *added);
/* The value of key, or -1. */
int32_t bpe_pmap_get(const bpe_pmap *m, uint64_t key);

/* ---- the pre-token -> ids cache of an encoder ---- */
typedef struct {
  bpe_smap map;          /* pre-token -> offset into ids (count in the high 16 bits) */
  int32_t *ids;
  size_t ids_len, ids_cap, max;
} bpe_cache;

/* ---- the tokenizer ---- */
struct em_tokenizer {
  int32_t n_vocab;
  char **tok;            /* id -> bytes (owned, NUL-terminated) */
  uint32_t *tok_len;
  bool *special;         /* id -> is special */
  int32_t byte_id[256];  /* byte -> id of the one-byte token */
  int n_merges;
  int32_t (*merges)[3];  /* rank -> (a, b, result) */
  bpe_pmap ranks;        /* pair -> rank */
  bpe_smap ids;          /* bytes -> id */
  int n_special;
  int32_t *special_ids;  /* in the order given */
  const char **special_s; /* their bytes (borrowed from tok) and lengths, for bpe_special_scan */
  size_t *special_len;
  size_t max_special_len;
  char *pattern;
  struct bpe_regex *re;  /* compiled pattern (shared by encoders, read-only) */
  bpe_cache cache;       /* em_tokenizer_encode's */
};

/* Build a tokenizer from id -> bytes (n tokens; special[i] marks specials),
 * merges by rank as (a, b) ids, and the pattern. Checks: every byte has a
 * one-byte token, no two ids share bytes, each merge's ids exist and are not
 * special, its result (bytes a + b) is a token, no pair merges twice. Errors
 * are "<what>: <problem>" with what naming the file or function. Takes
 * ownership of toks (each string and the array). */
em_tokenizer *bpe_build(const char *what, int32_t n, char **toks, uint32_t *lens, const bool *special,
                        int n_merges, const int32_t (*merges)[2], const char *pattern);

/* ---- pre-tokenisation (pretok.c) ---- */
typedef struct bpe_regex bpe_regex;
/* Compile pattern (UTF, UCP, invalid UTF-8 allowed; JIT when available). fn names errors. */
bpe_regex *bpe_regex_new(const char *pattern, const char *fn);
void bpe_regex_free(bpe_regex *re);
typedef struct bpe_matcher bpe_matcher;  /* per-thread match state */
bpe_matcher *bpe_matcher_new(const bpe_regex *re);
void bpe_matcher_free(bpe_matcher *m);
/* Cut s[0..n) (no special tokens inside) into pre-tokens; bytes the pattern
 * does not match (invalid UTF-8) become pieces of their own. fn returns 0 to go
 * on; its non-zero return is returned. A match failure is -1 with the error set. */
int bpe_pretok(bpe_matcher *m, const char *s, size_t n, int (*fn)(const char *p, size_t len, void *u), void *u);
/* The largest cut p in (lo, hi] where s[p-1] is a printable non-space ASCII
 * byte and s[p] an ASCII space: pre-tokens never straddle it. 0 when none. */
size_t bpe_safe_cut(const char *s, size_t lo, size_t hi);

/* Special tokens: the next occurrence at or after pos (leftmost, then longest).
 * Returns its start (n when none) and the special's index in *which. */
typedef struct {
  int n;
  const char *const *s;
  const size_t *len;
  size_t *next;          /* per special: next occurrence start (n: none), lazily updated */
} bpe_special_scan;
int bpe_special_scan_init(bpe_special_scan *sc, int n, const char *const *s, const size_t *len);
void bpe_special_scan_free(bpe_special_scan *sc);
size_t bpe_special_next(bpe_special_scan *sc, const char *text, size_t n, size_t pos, int *which);

/* Encode a piece of text with no special tokens, appending ids to *ids. */
typedef struct {
  int32_t *v;
  size_t n, cap;
} bpe_ids;
int bpe_ids_push(bpe_ids *a, int32_t id);
/* Encode text (specials included) with matcher m and cache c (max 0: no cache). */
int bpe_encode_text(const em_tokenizer *t, bpe_matcher *m, bpe_cache *c, const char *text, size_t n, bpe_ids *out);
void bpe_cache_free(bpe_cache *c);

/* GPT-2's bytes_to_unicode: the code point standing for byte b. */
uint32_t bpe_byte_to_unicode(uint8_t b);
/* Number of online cores (at least 1). */
int bpe_ncores(void);

#endif
