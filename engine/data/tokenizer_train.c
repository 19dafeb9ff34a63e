/* Training byte-level BPE: count pre-tokens, then merge the most frequent
 * adjacent pair again and again.
 *
 * Pre-tokenisation is the expensive pass over the corpus, so it runs on
 * worker threads: the corpus is split at special tokens (they are never
 * learnt), long pieces are cut at safe places (pretok.c) into work items, and
 * each worker counts its pre-tokens in its own hash table. The tables are
 * summed and the words sorted by bytes, so the result does not depend on the
 * thread count.
 *
 * Merging is incremental, as HuggingFace's trainer does it, so the cost is
 * proportional to the words a merge touches, not to the corpus: pair -> count,
 * pair -> the words that contain it, and a max-heap of (count, pair) with lazy
 * deletion (an entry whose count is stale is pushed back with the current
 * count when it reaches the top). Ties go as in the course's reference and
 * tiktoken's trainer: the highest count, then the lexicographically greatest
 * pair of byte strings (bytes(a), bytes(b)).
 *
 * Counts of existing pairs only fall when a pair (a, b) becomes c: the pairs
 * that grow are the new ones with c, pushed once the step is done. If a + b is
 * already a token (two merge paths to the same bytes, e.g. (ab, c) then
 * (a, bc)) the merge is recorded with that token's id and no new id is made:
 * equal bytes are one symbol, as in a reference that keeps words as tuples of
 * bytes objects; training stops when the vocabulary holds vocab_size ids. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>
#include "internal.h"
#include "data/bpe.h"
#include "io/json_min.h"
#include "io/io_common.h"

/* ---- pre-token counting ---- */

typedef struct { const char *s; size_t n; } span;

typedef struct {
  const bpe_regex *re;
  const span *items;
  size_t n_items;
  atomic_size_t *next;
  bpe_smap counts;
  int rc;
  char err[1024];
  int err_code;
} count_worker;

static int count_piece(const char *p, size_t n, void *u) {
  bpe_smap *m = u;
  int64_t *v = bpe_smap_put(m, p, n, bpe_hash(p, n), 0, NULL);
  if (!v) return em_error_oom("out of memory: tokenizer.train: pre-token table (%zu entries)", m->n);
  (*v)++;
  return 0;
}

static void *count_run(void *arg) {
  count_worker *w = arg;
  bpe_matcher *m = bpe_matcher_new(w->re);
  w->rc = m && !bpe_smap_init(&w->counts, 1 << 14) ? 0 : em_error_oom("out of memory: tokenizer.train");
  for (size_t i; !w->rc && (i = atomic_fetch_add(w->next, 1)) < w->n_items;)
    w->rc = bpe_pretok(m, w->items[i].s, w->items[i].n, count_piece, &w->counts);
  if (w->rc) { snprintf(w->err, sizeof w->err, "%s", em_last_error()); w->err_code = em_last_error_code(); }
  bpe_matcher_free(m);
  return NULL;
}

static int push_item(span **items, size_t *n, size_t *cap, const char *s, size_t len) {
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 256;
    span *p = realloc(*items, *cap * sizeof *p);
    if (!p) return em_error_oom("out of memory: tokenizer.train: work items");
    *items = p;
  }
  (*items)[(*n)++] = (span){s, len};
  return 0;
}

/* Cut a segment (no special tokens inside) into items of about target bytes at safe cuts. */
static int push_segment(span **items, size_t *n, size_t *cap, const char *s, size_t len, size_t target) {
  size_t start = 0;
  while (len - start > target) {
    size_t hi = start + target;
    size_t c = bpe_safe_cut(s, start, hi);
    if (!c) for (c = hi + 1; c < len && !bpe_safe_cut(s, c - 1, c); c++) {}   /* the next one after */
    if (c >= len) break;
    if (push_item(items, n, cap, s + start, c - start)) return -1;
    start = c;
  }
  return len > start ? push_item(items, n, cap, s + start, len - start) : 0;
}

/* ---- merging ---- */

typedef struct { int32_t *v; int32_t n, cap; } ilist;

typedef struct {
  /* words */
  size_t nw;
  int64_t *wcount;
  int32_t **wsym;
  int32_t *wlen;
  int32_t *wstamp;
  /* vocabulary */
  char **tok;
  uint32_t *tok_len;
  int32_t ntok, tok_cap;
  bpe_smap tok_ids;
  /* pairs */
  bpe_pmap pidx;
  int32_t *pa, *pb;
  int64_t *pc;
  ilist *pw;
  int32_t *ptouch;
  int32_t np, pcap;
  /* heap of (count, pair) */
  struct hent { int64_t count; int32_t pair; } *heap;
  size_t nh, hcap;
  int32_t *touched;
  int32_t ntouched, touched_cap;
  int32_t stamp;
} trainer;

static int cmp_tok(const trainer *T, int32_t x, int32_t y) {
  if (x == y) return 0;
  uint32_t lx = T->tok_len[x], ly = T->tok_len[y];
  int c = memcmp(T->tok[x], T->tok[y], lx < ly ? lx : ly);
  return c ? c : (lx > ly) - (lx < ly);
}

/* Whether heap entry e ranks above f: count, then (bytes(a), bytes(b)). */
static bool above(const trainer *T, const struct hent *e, const struct hent *f) {
  if (e->count != f->count) return e->count > f->count;
  int c = cmp_tok(T, T->pa[e->pair], T->pa[f->pair]);
  if (!c) c = cmp_tok(T, T->pb[e->pair], T->pb[f->pair]);
  return c > 0;
}

static int heap_push(trainer *T, int64_t count, int32_t pair) {
  if (T->nh == T->hcap) {
    size_t c = T->hcap ? T->hcap * 2 : 1024;
    void *p = realloc(T->heap, c * sizeof *T->heap);
    if (!p) return em_error_oom("out of memory: tokenizer.train: heap");
    T->heap = p; T->hcap = c;
  }
  size_t i = T->nh++;
  struct hent e = {count, pair};
  while (i > 0) {
    size_t up = (i - 1) / 2;
    if (!above(T, &e, &T->heap[up])) break;
    T->heap[i] = T->heap[up];
    i = up;
  }
  T->heap[i] = e;
  return 0;
}

static struct hent heap_pop(trainer *T) {
  struct hent top = T->heap[0], last = T->heap[--T->nh];
  size_t i = 0, n = T->nh;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, b = i;
    const struct hent *best = &last;
    if (l < n && above(T, &T->heap[l], best)) { b = l; best = &T->heap[l]; }
    if (r < n && above(T, &T->heap[r], best)) { b = r; best = &T->heap[r]; }
    if (b == i) break;
    T->heap[i] = T->heap[b];
    i = b;
  }
  if (n) T->heap[i] = last;
  return top;
}

static int ilist_push(ilist *l, int32_t v) {
  if (l->n == l->cap) {
    int32_t c = l->cap ? l->cap * 2 : 4;
    int32_t *p = realloc(l->v, (size_t)c * sizeof *p);
    if (!p) return em_error_oom("out of memory: tokenizer.train: pair lists");
    l->v = p; l->cap = c;
  }
  l->v[l->n++] = v;
  return 0;
}

/* Add delta to pair (x, y)'s count (creating it); word w holds it when c is in it. */
static int pair_add(trainer *T, int32_t x, int32_t y, int64_t delta, int32_t w, int32_t c) {
  bool added;
  int32_t *slot = bpe_pmap_put(&T->pidx, bpe_pair(x, y), T->np, &added);
  if (!slot) return em_error_oom("out of memory: tokenizer.train: pairs");
  if (added) {
    if (T->np == T->pcap) {
      int32_t cap = T->pcap ? T->pcap * 2 : 4096;
      int32_t *pa = realloc(T->pa, (size_t)cap * sizeof *pa); if (pa) T->pa = pa;
      int32_t *pb = realloc(T->pb, (size_t)cap * sizeof *pb); if (pb) T->pb = pb;
      int64_t *pc = realloc(T->pc, (size_t)cap * sizeof *pc); if (pc) T->pc = pc;
      ilist *pw = realloc(T->pw, (size_t)cap * sizeof *pw); if (pw) T->pw = pw;
      int32_t *pt = realloc(T->ptouch, (size_t)cap * sizeof *pt); if (pt) T->ptouch = pt;
      if (!pa || !pb || !pc || !pw || !pt) return em_error_oom("out of memory: tokenizer.train: pairs");
      T->pcap = cap;
    }
    int32_t p = T->np++;
    T->pa[p] = x; T->pb[p] = y; T->pc[p] = 0; T->pw[p] = (ilist){0}; T->ptouch[p] = -1;
  }
  int32_t p = *slot;
  T->pc[p] += delta;
  if (c >= 0 && delta > 0 && (x == c || y == c)) {
    ilist *l = &T->pw[p];
    if ((l->n == 0 || l->v[l->n - 1] != w) && ilist_push(l, w)) return -1;
    if (T->ptouch[p] != T->stamp) {
      T->ptouch[p] = T->stamp;
      if (T->ntouched == T->touched_cap) {
        T->touched_cap = T->touched_cap ? T->touched_cap * 2 : 1024;
        int32_t *q = realloc(T->touched, (size_t)T->touched_cap * sizeof *q);
        if (!q) return em_error_oom("out of memory: tokenizer.train");
        T->touched = q;
      }
      T->touched[T->ntouched++] = p;
    }
  }
  return 0;
}

/* Replace each (a, b) in word w by c, updating the neighbouring pairs' counts. */
static int merge_word(trainer *T, int32_t w, int32_t a, int32_t b, int32_t c) {
  int32_t *s = T->wsym[w], n = T->wlen[w], j = 0;
  int64_t f = T->wcount[w];
  for (int32_t i = 0; i < n;) {
    if (i + 1 < n && s[i] == a && s[i + 1] == b) {
      if (j > 0 && (pair_add(T, s[j - 1], a, -f, w, c) || pair_add(T, s[j - 1], c, f, w, c))) return -1;
      if (i + 2 < n && (pair_add(T, b, s[i + 2], -f, w, c) || pair_add(T, c, s[i + 2], f, w, c))) return -1;
      s[j++] = c;
      i += 2;
    } else {
      s[j++] = s[i++];
    }
  }
  T->wlen[w] = j;
  return 0;
}

static int add_token(trainer *T, const char *s, size_t n, int32_t *id) {
  bool added;
  int64_t *v = bpe_smap_put(&T->tok_ids, s, n, bpe_hash(s, n), T->ntok, &added);
  if (!v) return em_error_oom("out of memory: tokenizer.train: vocabulary");
  *id = (int32_t)*v;
  if (!added) return 0;
  if (T->ntok == T->tok_cap) {
    int32_t cap = T->tok_cap * 2;
    char **t = realloc(T->tok, (size_t)cap * sizeof *t); if (t) T->tok = t;
    uint32_t *l = realloc(T->tok_len, (size_t)cap * sizeof *l); if (l) T->tok_len = l;
    if (!t || !l) return em_error_oom("out of memory: tokenizer.train: vocabulary");
    T->tok_cap = cap;
  }
  char *copy = malloc(n + 1);
  if (!copy) return em_error_oom("out of memory: tokenizer.train: vocabulary");
  memcpy(copy, s, n); copy[n] = 0;
  T->tok[T->ntok] = copy; T->tok_len[T->ntok] = (uint32_t)n;
  T->ntok++;
  return 0;
}

static void trainer_free(trainer *T) {
  if (T->wsym) free(T->wsym[0]);
  free(T->wsym); free(T->wcount); free(T->wlen); free(T->wstamp);
  if (T->tok) for (int32_t i = 0; i < T->ntok; i++) free(T->tok[i]);
  free(T->tok); free(T->tok_len);
  bpe_smap_free(&T->tok_ids);
  bpe_pmap_free(&T->pidx);
  if (T->pw) for (int32_t i = 0; i < T->np; i++) free(T->pw[i].v);
  free(T->pa); free(T->pb); free(T->pc); free(T->pw); free(T->ptouch);
  free(T->heap); free(T->touched);
}

static const bpe_smap *sort_map;
static int cmp_slot(const void *x, const void *y) {
  size_t i = *(const size_t *)x, j = *(const size_t *)y;
  uint32_t li = sort_map->klen[i], lj = sort_map->klen[j];
  int c = memcmp(bpe_smap_key(sort_map, i), bpe_smap_key(sort_map, j), li < lj ? li : lj);
  return c ? c : (li > lj) - (li < lj);
}

/* Words from the pre-token table, sorted by bytes (the same for any thread count). */
static int load_words(trainer *T, const bpe_smap *m) {
  size_t *slots = malloc((m->n + 1) * sizeof *slots), k = 0, total = 0;
  if (!slots) return em_error_oom("out of memory: tokenizer.train: %zu words", m->n);
  for (size_t i = 0; i < m->cap; i++)
    if (m->hash[i]) { slots[k++] = i; total += m->klen[i]; }
  static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;   /* qsort has no context argument */
  pthread_mutex_lock(&sort_lock);
  sort_map = m;
  qsort(slots, k, sizeof *slots, cmp_slot);
  pthread_mutex_unlock(&sort_lock);
  T->nw = k;
  T->wcount = malloc((k + 1) * sizeof *T->wcount);
  T->wsym = malloc((k + 1) * sizeof *T->wsym);
  T->wlen = malloc((k + 1) * sizeof *T->wlen);
  T->wstamp = malloc((k + 1) * sizeof *T->wstamp);
  int32_t *sym = malloc((total + 1) * sizeof *sym);
  if (!T->wcount || !T->wsym || !T->wlen || !T->wstamp || !sym) {
    free(sym); free(slots);
    return em_error_oom("out of memory: tokenizer.train: %zu words", k);
  }
  T->wsym[0] = sym;                               /* freed through wsym[0] */
  for (size_t w = 0; w < k; w++) {
    size_t i = slots[w];
    const unsigned char *key = (const unsigned char *)bpe_smap_key(m, i);
    if (m->klen[i] > INT32_MAX) { free(slots); return em_error("tokenizer.train: a pre-token over 2 GB"); }
    T->wcount[w] = m->val[i];
    T->wsym[w] = sym;
    T->wlen[w] = (int32_t)m->klen[i];
    T->wstamp[w] = -1;
    for (uint32_t j = 0; j < m->klen[i]; j++) *sym++ = key[j];   /* byte b has id b */
  }
  free(slots);
  return 0;
}

static int learn(trainer *T, int32_t target, int32_t (**merges)[2], int *n_merges) {
  int32_t (*mg)[2] = NULL;
  int nm = 0, mcap = 0;
  /* initial pairs */
  for (size_t w = 0; w < T->nw; w++)
    for (int32_t i = 0; i + 1 < T->wlen[w]; i++) {
      int32_t x = T->wsym[w][i], y = T->wsym[w][i + 1];
      if (pair_add(T, x, y, T->wcount[w], (int32_t)w, -1)) return -1;
      ilist *l = &T->pw[bpe_pmap_get(&T->pidx, bpe_pair(x, y))];
      if ((l->n == 0 || l->v[l->n - 1] != (int32_t)w) && ilist_push(l, (int32_t)w)) return -1;
    }
  for (int32_t p = 0; p < T->np; p++)
    if (T->pc[p] > 0 && heap_push(T, T->pc[p], p)) return -1;
  char *cat = NULL;
  size_t catcap = 0;
  while (T->ntok < target && T->nh) {
    struct hent e = heap_pop(T);
    int32_t p = e.pair;
    if (e.count != T->pc[p]) {
      if (T->pc[p] > 0 && heap_push(T, T->pc[p], p)) goto oom;
      continue;
    }
    int32_t a = T->pa[p], b = T->pb[p], c;
    size_t la = T->tok_len[a], lb = T->tok_len[b];
    if (la + lb > catcap) {
      catcap = 2 * (la + lb);
      char *q = realloc(cat, catcap);
      if (!q) goto oom;
      cat = q;
    }
    memcpy(cat, T->tok[a], la); memcpy(cat + la, T->tok[b], lb);
    if (add_token(T, cat, la + lb, &c)) goto fail;
    if (nm == mcap) {
      mcap = mcap ? mcap * 2 : 1024;
      void *q = realloc(mg, (size_t)mcap * sizeof *mg);
      if (!q) goto oom;
      mg = q;
    }
    mg[nm][0] = a; mg[nm][1] = b; nm++;
    T->stamp++;
    T->ntouched = 0;
    ilist words = T->pw[p];
    T->pw[p] = (ilist){0};
    for (int32_t k = 0; k < words.n; k++) {
      int32_t w = words.v[k];
      if (T->wstamp[w] == T->stamp) continue;
      T->wstamp[w] = T->stamp;
      if (merge_word(T, w, a, b, c)) { free(words.v); goto fail; }
    }
    free(words.v);
    T->pc[p] = 0;
    for (int32_t k = 0; k < T->ntouched; k++) {
      int32_t q = T->touched[k];
      if (T->pc[q] > 0 && heap_push(T, T->pc[q], q)) goto fail;
    }
  }
  free(cat);
  *merges = mg;
  *n_merges = nm;
  return 0;
oom:
  em_error_oom("out of memory: tokenizer.train: merges");
fail:
  free(cat); free(mg);
  return -1;
}

/* ---- the entry points ---- */

static int check_options(const em_bpe_train_options *o, size_t **slen) {
  if (!o) return em_error("tokenizer.train: expected options, got NULL");
  if (o->n_special < 0) return em_error("tokenizer.train: expected n_special >= 0, got %d", o->n_special);
  int need = 256 + o->n_special;
  if (o->vocab_size < need)
    return em_error("tokenizer.train: expected vocab_size >= 256 + #special_tokens (%d), got %d", need, o->vocab_size);
  *slen = calloc((size_t)o->n_special + 1, sizeof **slen);
  if (!*slen) return em_error_oom("out of memory: tokenizer.train");
  for (int i = 0; i < o->n_special; i++) {
    const char *s = o->special[i];
    size_t n = s ? strlen(s) : 0;
    (*slen)[i] = n;
    if (!n) return em_error("tokenizer.train: expected special token %d to be a non-empty string", i + 1);
    if (!jm_utf8_valid(s, n)) return em_error("tokenizer.train: special token %d is not valid UTF-8", i + 1);
    if (n == 1) return em_error("tokenizer.train: special token %d ('%s') is a single byte, which the byte tokens already are", i + 1, s);
    for (int j = 0; j < i; j++)
      if (!strcmp(s, o->special[j])) return em_error("tokenizer.train: special token '%s' is given twice (%d and %d)", s, j + 1, i + 1);
  }
  return 0;
}

em_tokenizer *em_tokenizer_train(int n, const char *const *docs, const size_t *lens, const em_bpe_train_options *o) {
  size_t *slen = NULL;
  if (check_options(o, &slen)) { free(slen); return NULL; }
  const char *pattern = o->pattern ? o->pattern : EM_GPT2_PATTERN;
  bpe_regex *re = bpe_regex_new(pattern, "tokenizer.train");
  if (!re) { free(slen); return NULL; }
  int nt = o->threads > 0 ? o->threads : bpe_ncores();
  if (nt > 256) nt = 256;
  /* work items: documents split at special tokens, long segments cut safely */
  size_t total = 0;
  for (int d = 0; d < n; d++) total += lens[d];
  size_t target = total / ((size_t)nt * 8) + 1;
  if (target < (64u << 10)) target = 64u << 10;
  span *items = NULL;
  size_t ni = 0, icap = 0;
  int rc = 0;
  bpe_special_scan sc;
  rc = bpe_special_scan_init(&sc, o->n_special, o->special, slen);
  for (int d = 0; d < n && !rc; d++) {
    for (int i = 0; i < o->n_special; i++) sc.next[i] = SIZE_MAX;
    size_t pos = 0;
    while (!rc) {
      int which;
      size_t s = bpe_special_next(&sc, docs[d], lens[d], pos, &which);
      if (s > pos) rc = push_segment(&items, &ni, &icap, docs[d] + pos, s - pos, target);
      if (s >= lens[d]) break;
      pos = s + slen[which];
    }
  }
  bpe_special_scan_free(&sc);
  /* count pre-tokens on nt workers */
  count_worker *w = calloc((size_t)nt, sizeof *w);
  pthread_t *th = calloc((size_t)nt, sizeof *th);
  atomic_size_t next = 0;
  if (!rc && (!w || !th)) rc = em_error_oom("out of memory: tokenizer.train");
  if (!rc) {
    if (nt > (int)ni) nt = ni ? (int)ni : 1;
    for (int i = 0; i < nt; i++) { w[i].re = re; w[i].items = items; w[i].n_items = ni; w[i].next = &next; }
    int started = 0;
    if (nt > 1)
      for (; started < nt; started++)
        if (pthread_create(&th[started], NULL, count_run, &w[started])) break;
    if (started < nt) count_run(&w[started]);     /* at least one runs here */
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < nt && !rc; i++)
      if (w[i].rc) rc = em_error_code(w[i].err_code ? w[i].err_code : EM_ERR, "%s", w[i].err);
    /* sum the tables into the first (in thread order; sums do not depend on it) */
    for (int i = 1; i < nt && !rc; i++) {
      bpe_smap *m = &w[i].counts;
      for (size_t j = 0; j < m->cap && !rc; j++) {
        if (!m->hash[j]) continue;
        int64_t *v = bpe_smap_put(&w[0].counts, bpe_smap_key(m, j), m->klen[j], m->hash[j], 0, NULL);
        if (!v) rc = em_error_oom("out of memory: tokenizer.train: pre-token table");
        else *v += m->val[j];
      }
      bpe_smap_free(m);
    }
  }
  free(items);
  free(th);
  trainer T = {0};
  int32_t (*merges)[2] = NULL;
  int n_merges = 0;
  if (!rc) {
    T.tok_cap = o->vocab_size + 16;
    T.tok = malloc((size_t)T.tok_cap * sizeof *T.tok);
    T.tok_len = malloc((size_t)T.tok_cap * sizeof *T.tok_len);
    if (!T.tok || !T.tok_len || bpe_smap_init(&T.tok_ids, (size_t)T.tok_cap) || bpe_pmap_init(&T.pidx, 1 << 16))
      rc = em_error_oom("out of memory: tokenizer.train");
    for (int b = 0; b < 256 && !rc; b++) {
      char c = (char)b;
      int32_t id;
      rc = add_token(&T, &c, 1, &id);
    }
  }
  if (!rc) rc = load_words(&T, &w[0].counts);
  if (w) bpe_smap_free(&w[0].counts);
  free(w);
  if (!rc) rc = learn(&T, o->vocab_size - o->n_special, &merges, &n_merges);
  em_tokenizer *t = NULL;
  if (!rc) {
    /* the vocabulary: bytes, merged tokens, then the special tokens */
    int32_t nv = T.ntok + o->n_special;
    char **toks = malloc((size_t)nv * sizeof *toks);
    uint32_t *tl = malloc((size_t)nv * sizeof *tl);
    bool *sp = calloc((size_t)nv, sizeof *sp);
    if (!toks || !tl || !sp) {
      free(toks); free(tl); free(sp);
      em_error_oom("out of memory: tokenizer.train");
    } else {
      memcpy(toks, T.tok, (size_t)T.ntok * sizeof *toks);
      memcpy(tl, T.tok_len, (size_t)T.ntok * sizeof *tl);
      int32_t k = T.ntok;
      T.ntok = 0;                                   /* the strings now belong to toks */
      bool ok = true;
      for (int i = 0; i < o->n_special; i++) {
        toks[k + i] = strdup(o->special[i]);
        tl[k + i] = (uint32_t)slen[i];
        sp[k + i] = true;
        if (!toks[k + i]) ok = false;
      }
      if (ok) t = bpe_build("tokenizer.train", nv, toks, tl, sp, n_merges, (const int32_t (*)[2])merges, pattern);
      else {
        for (int32_t i = 0; i < nv; i++) free(toks[i]);
        free(toks); free(tl);
        em_error_oom("out of memory: tokenizer.train");
      }
      free(sp);
    }
  }
  free(merges);
  trainer_free(&T);
  bpe_regex_free(re);
  free(slen);
  return t;
}

em_tokenizer *em_tokenizer_train_files(int n, const char *const *paths, const em_bpe_train_options *o) {
  char **docs = calloc((size_t)n + 1, sizeof *docs);
  size_t *lens = calloc((size_t)n + 1, sizeof *lens);
  em_tokenizer *t = NULL;
  int rc = docs && lens ? 0 : em_error_oom("out of memory: tokenizer.train");
  for (int i = 0; i < n && !rc; i++) {
    uint64_t size;
    int fd = em_io_open_read(paths[i], &size);
    if (fd < 0) {
      char why[1024];
      snprintf(why, sizeof why, "%s", em_last_error());
      rc = em_error_code(EM_ERR_IO, "tokenizer.train: %s", strncmp(why, "load: ", 6) ? why : why + 6);
      break;
    }
    docs[i] = malloc(size + 1);
    if (!docs[i]) rc = em_error_oom("out of memory: tokenizer.train: '%s' (%llu bytes)", paths[i], (unsigned long long)size);
    else rc = em_io_pread_all(fd, docs[i], size, 0, paths[i]);
    lens[i] = size;
    close(fd);
  }
  if (!rc) t = em_tokenizer_train(n, (const char *const *)docs, lens, o);
  for (int i = 0; docs && i < n; i++) free(docs[i]);
  free(docs); free(lens);
  return t;
}
