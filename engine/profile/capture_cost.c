/* Capture-time costs: the roofline columns of CUDA-graph replays.
 *
 * An eager kernel gets its cost from the op scope that launched it (the
 * scope's seq in the profiling session, EM_OP_COST). A replayed kernel was
 * launched by no scope of the session: its op ran once, during the capture.
 * So while a thread captures, its op scopes are numbered too (capture call
 * ids, one process-wide counter) and keep the cost they declare (self cost,
 * as eager: nested scopes keep their own). CUPTI's graph-node callback
 * (kernels/cupti.cu) stamps each node created in a scope with its id and
 * takes a reference; instantiation's clones take one each; destroying a node
 * drops it. At profiler stop, a replayed kernel's id finds the cost here
 * (aggregate.c), and one replay of one op call (id, graph launch) shares it
 * among its kernels by duration, exactly as an eager call does.
 *
 * Why references and not a table per graph: the id is all a node carries,
 * and the nodes' lifetimes (captured graph, executable graph) are CUDA's; a
 * cost lives as long as some node that needs it. Costs of scopes that
 * created no node (outer ops, CPU work during a capture) are dropped when
 * the capture ends.
 *
 * Everything here is host code: tests/c/test_capture_cost.c drives it with a
 * fake capture and fake replays, no GPU needed. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "profiler_internal.h"

typedef struct {
  uint32_t id;        /* capture call id; 0: empty slot */
  uint32_t capture;   /* the capture it was declared in (dropped at its end when no node holds it) */
  int32_t refs;       /* graph nodes carrying the id */
  uint8_t fclass;
  double bytes, flops;
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry *tab;              /* open addressing, linear probing; cap a power of two */
static size_t cap, used;
static uint32_t last_id, last_capture;
static int capturing_threads;

static _Thread_local uint32_t tl_capture;          /* this thread's capture (0: not capturing) */
static _Thread_local em_op_scope_t *tl_scope;      /* its innermost open scope */

/* ---- the table (lock held) ---- */

static size_t home(uint32_t id) { return (size_t)(id * 2654435761u) & (cap - 1); }

static entry *find(uint32_t id) {
  if (!cap) return NULL;
  for (size_t j = home(id); tab[j].id; j = (j + 1) & (cap - 1))
    if (tab[j].id == id) return &tab[j];
  return NULL;
}

static int rehash(size_t new_cap, uint32_t drop_capture) {
  entry *old = tab;
  size_t old_cap = cap;
  entry *t = calloc(new_cap, sizeof *t);
  if (!t) return -1;
  tab = t;
  cap = new_cap;
  used = 0;
  for (size_t i = 0; i < old_cap; i++) {
    const entry *e = &old[i];
    if (!e->id || (drop_capture && e->capture == drop_capture && e->refs <= 0)) continue;
    size_t j = home(e->id);
    while (tab[j].id) j = (j + 1) & (cap - 1);
    tab[j] = *e;
    used++;
  }
  free(old);
  return 0;
}

/* The entry of id, inserted (zero cost, no refs) when absent; NULL out of memory. */
static entry *insert(uint32_t id) {
  entry *e = find(id);
  if (e) return e;
  if ((used + 1) * 2 > cap && rehash(cap ? cap * 2 : 256, 0)) return NULL;
  size_t j = home(id);
  while (tab[j].id) j = (j + 1) & (cap - 1);
  memset(&tab[j], 0, sizeof tab[j]);
  tab[j].id = id;
  tab[j].capture = tl_capture;
  used++;
  return &tab[j];
}

/* Remove e, shifting back the entries its slot displaced (no tombstones). */
static void erase(entry *e) {
  size_t i = (size_t)(e - tab), j = i;
  for (;;) {
    j = (j + 1) & (cap - 1);
    if (!tab[j].id) break;
    size_t k = home(tab[j].id);
    /* tab[j] may move into the hole at i unless its home lies cyclically in (i, j] */
    bool stays = i <= j ? (k > i && k <= j) : (k > i || k <= j);
    if (!stays) { tab[i] = tab[j]; i = j; }
  }
  tab[i].id = 0;
  used--;
}

/* ---- captures and scopes ---- */

void em_capcost_capture_begin(void) {
  pthread_mutex_lock(&lock);
  if (!tl_capture) {
    tl_capture = ++last_capture ? last_capture : ++last_capture;
    if (capturing_threads++ == 0) __atomic_fetch_or(&em_measure_flags, EM_MEASURE_CAPTURE, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&lock);
  tl_scope = NULL;
}

void em_capcost_capture_end(void) {
  pthread_mutex_lock(&lock);
  if (tl_capture) {
    /* out of memory while rebuilding: the unreferenced costs stay (harmless: no node carries their ids) */
    if (cap) rehash(cap, tl_capture);
    if (--capturing_threads == 0) __atomic_fetch_and(&em_measure_flags, ~EM_MEASURE_CAPTURE, __ATOMIC_RELAXED);
    tl_capture = 0;
  }
  pthread_mutex_unlock(&lock);
  tl_scope = NULL;
}

void em_capcost_scope_begin(em_op_scope_t *s) {
  s->cap = 0;
  if (!tl_capture) return;                     /* another thread captures, not this one */
  uint32_t id = __atomic_add_fetch(&last_id, 1, __ATOMIC_RELAXED);
  if (!id) id = __atomic_add_fetch(&last_id, 1, __ATOMIC_RELAXED);   /* 0 means none */
  s->cap = id;
  s->cap_parent = tl_scope;
  tl_scope = s;
  s->fclass = 0;
  s->bytes = s->flops = 0;
}

void em_capcost_scope_end(em_op_scope_t *s) {
  if (!s->cap) return;
  tl_scope = s->cap_parent;
  if (!tl_capture || (s->bytes <= 0 && s->flops <= 0)) return;
  pthread_mutex_lock(&lock);
  entry *e = insert(s->cap);
  if (e) {
    e->bytes = s->bytes;
    e->flops = s->flops;
    e->fclass = s->fclass;
  }
  pthread_mutex_unlock(&lock);
}

em_op_scope_t *em_capcost_scope(void) { return tl_capture ? tl_scope : NULL; }

uint32_t em_capcost_call(void) { return tl_capture && tl_scope ? tl_scope->cap : 0; }

void em_capcost_ref(uint32_t call, int delta) {
  if (!call || !delta) return;
  pthread_mutex_lock(&lock);
  entry *e = delta > 0 ? insert(call) : find(call);
  if (e) {
    e->refs += delta;
    if (e->refs <= 0 && delta < 0) erase(e);
  }
  pthread_mutex_unlock(&lock);
}

bool em_capcost_get(uint32_t call, em_capcost *out) {
  memset(out, 0, sizeof *out);
  if (!call) return false;
  pthread_mutex_lock(&lock);
  const entry *e = find(call);
  if (e) {
    out->bytes = e->bytes;
    out->flops = e->flops;
    out->fclass = e->fclass;
  }
  pthread_mutex_unlock(&lock);
  return e != NULL;
}
