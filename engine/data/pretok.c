/* Pre-tokenisation: the regular expression that cuts text into the pieces BPE
 * merges within (GPT-2's `'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+|
 * ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`), and the special-token scanner that runs
 * before it.
 *
 * PCRE2 in UTF + UCP mode gives \p{L}, \p{N} and \s their Unicode meaning, as
 * Python's `regex` module does for GPT-2; PCRE2_MATCH_INVALID_UTF lets raw bytes
 * through, and any bytes no match covers (only invalid UTF-8 can be left over:
 * the pattern's alternatives cover every character) become pieces of their
 * own, so encode -> decode gives back every byte. The JIT is used when the
 * library has one (a few times faster than the interpreter).
 *
 * Safe cuts (for parallel training and streaming encode): every alternative
 * but the two whitespace ones stops before a space, and a whitespace match
 * never holds a non-space, so where a non-space byte is followed by a space
 * every tokenisation has a boundary, and the text after it tokenises alone as
 * it does in context (no look-behind). The end of a whitespace run is *not*
 * safe: `\s+(?!\S)` leaves the run's last space to the next word in context
 * but takes it at the end of a chunk. Only ASCII bytes are used to decide, so a
 * multi-byte character is never cut. */
#define _GNU_SOURCE   /* memmem */
#include "internal.h"
#include "data/bpe.h"

#ifdef EMBER_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

struct bpe_regex { pcre2_code *code; };
struct bpe_matcher { const bpe_regex *re; pcre2_match_data *md; };

bpe_regex *bpe_regex_new(const char *pattern, const char *fn) {
  int err; PCRE2_SIZE off;
  pcre2_code *code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    em_error("%s: cannot compile the pre-tokenisation pattern at offset %zu: %s (pattern: %s)",
             fn, (size_t)off, (const char *)msg, pattern);
    return NULL;
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);    /* best effort: the interpreter works without it */
  bpe_regex *re = malloc(sizeof *re);
  if (!re) { pcre2_code_free(code); em_error_oom("out of memory: %s: pattern", fn); return NULL; }
  re->code = code;
  return re;
}

void bpe_regex_free(bpe_regex *re) {
  if (!re) return;
  pcre2_code_free(re->code);
  free(re);
}

bpe_matcher *bpe_matcher_new(const bpe_regex *re) {
  bpe_matcher *m = malloc(sizeof *m);
  if (!m) { em_error_oom("out of memory: tokenizer: match data"); return NULL; }
  m->re = re;
  m->md = pcre2_match_data_create_from_pattern(re->code, NULL);
  if (!m->md) { free(m); em_error_oom("out of memory: tokenizer: match data"); return NULL; }
  return m;
}

void bpe_matcher_free(bpe_matcher *m) {
  if (!m) return;
  pcre2_match_data_free(m->md);
  free(m);
}

int bpe_pretok(bpe_matcher *m, const char *s, size_t n, int (*fn)(const char *p, size_t len, void *u), void *u) {
  size_t pos = 0;
  while (pos < n) {
    int rc = pcre2_match(m->re->code, (PCRE2_SPTR)s, n, pos, 0, m->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return em_error("tokenizer: pre-tokenisation failed at byte %zu: %s", pos, (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
    size_t a = ov[0], b = ov[1];
    if (a > pos) { int r = fn(s + pos, a - pos, u); if (r) return r; }     /* unmatched bytes */
    if (b == a) {                                   /* an empty match (a custom pattern): step one byte */
      if (a >= n) break;
      int r = fn(s + a, 1, u); if (r) return r;
      pos = a + 1;
      continue;
    }
    int r = fn(s + a, b - a, u); if (r) return r;
    pos = b;
  }
  if (pos < n) return fn(s + pos, n - pos, u);
  return 0;
}

#else  /* no PCRE2 in this build */

struct bpe_regex { int unused; };
struct bpe_matcher { int unused; };
bpe_regex *bpe_regex_new(const char *pattern, const char *fn) {
  em_error("%s: this build has no PCRE2 for pre-tokenisation (install libpcre2-dev, `make deps`, and rebuild)", fn);
  return NULL;
}
void bpe_regex_free(bpe_regex *re) { (void)re; }
bpe_matcher *bpe_matcher_new(const bpe_regex *re) { (void)re; em_error("tokenizer: no PCRE2"); return NULL; }
void bpe_matcher_free(bpe_matcher *m) { (void)m; }
int bpe_pretok(bpe_matcher *m, const char *s, size_t n, int (*fn)(const char *p, size_t len, void *u), void *u) {
  return em_error("tokenizer: no PCRE2");
}
#endif

static inline bool ascii_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

size_t bpe_safe_cut(const char *s, size_t lo, size_t hi) {
  for (size_t p = hi; p > lo; p--) {
    unsigned char prev = (unsigned char)s[p - 1], c = (unsigned char)s[p];
    if (ascii_space(c) && prev > ' ' && prev < 0x7f) return p;
  }
  return 0;
}

/* ---- special tokens ---- */

int bpe_special_scan_init(bpe_special_scan *sc, int n, const char *const *s, const size_t *len) {
  sc->n = n; sc->s = s; sc->len = len;
  sc->next = NULL;
  if (n && !(sc->next = malloc((size_t)n * sizeof *sc->next)))
    return em_error_oom("out of memory: tokenizer: special tokens");
  for (int i = 0; i < n; i++) sc->next[i] = SIZE_MAX;   /* not searched yet */
  return 0;
}

void bpe_special_scan_free(bpe_special_scan *sc) { free(sc->next); sc->next = NULL; }

size_t bpe_special_next(bpe_special_scan *sc, const char *text, size_t n, size_t pos, int *which) {
  size_t best = n, blen = 0;
  *which = -1;
  for (int i = 0; i < sc->n; i++) {
    if (sc->next[i] == SIZE_MAX || (sc->next[i] < pos)) {   /* (re)search from pos */
      const char *f = pos < n ? memmem(text + pos, n - pos, sc->s[i], sc->len[i]) : NULL;
      sc->next[i] = f ? (size_t)(f - text) : n;
    }
    size_t at = sc->next[i];
    if (at < best || (at == best && at < n && sc->len[i] > blen)) { best = at; blen = sc->len[i]; *which = i; }
  }
  return best;
}
