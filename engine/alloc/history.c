/* Memory history (ember/memory.h): the event ring, the table of live blocks
 * and category inference.
 *
 * The ring starts small and doubles up to max_entries, then overwrites its
 * oldest event (counted in `dropped`), so a long run keeps the most recent
 * window. The live table (address -> the block's allocation, latest tag and
 * category; open addressing, backward-shift deletion) lets a snapshot show a
 * live block's call site and category even after the ring dropped its
 * allocation. Addresses are unique across the CPU and every GPU (CUDA's
 * unified virtual addressing), so the address alone is the key.
 *
 * Everything that can call back into the binding (the call-site provider) or
 * take another lock runs before this file's lock is taken: the CUDA allocator
 * calls in while holding its own lock, and a snapshot reads the allocator's
 * segments before copying the history, so the two locks never nest the other
 * way round. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ember/memory.h"
#include "ember/profile.h"
#include "ember/error.h"

int em_mem_history_flag = 0;

static const char *const CATEGORY_NAMES[EM_MEM_CATEGORY_COUNT] = {
  "other", "parameter", "gradient", "activation", "autograd", "optimizer_state", "workspace", "communication"};
static const char *const ACTION_NAMES[EM_MEM_ACTION_COUNT] = {
  "alloc", "free", "segment_alloc", "segment_free", "tag"};

const char *em_mem_category_name(em_mem_category c) {
  return (unsigned)c < EM_MEM_CATEGORY_COUNT ? CATEGORY_NAMES[c] : "other";
}
int em_mem_category_parse(const char *name) {
  for (int i = 0; name && i < EM_MEM_CATEGORY_COUNT; i++)
    if (strcmp(name, CATEGORY_NAMES[i]) == 0) return i;
  return -1;
}
const char *em_mem_action_name(em_mem_action a) {
  return (unsigned)a < EM_MEM_ACTION_COUNT ? ACTION_NAMES[a] : "?";
}

/* ---- state (all under `lock`, except the thread-locals) ---- */

typedef struct {
  em_mem_event alloc, tag;
  uint8_t has_alloc, has_tag, category;
} live_entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool recording, stopped, rec_cpu = true;
static int stack_depth;
static int64_t max_entries = EM_MEM_DEFAULT_MAX_ENTRIES;
static em_mem_event *ring;
static int64_t ring_cap, ring_head, ring_count, n_dropped, n_recorded;
static uint64_t *live_keys;        /* 0: empty slot */
static live_entry *live_vals;
static int64_t live_cap, live_count, live_bytes;

/* rec_cpu and stack_depth change only in em_mem_record_history, before the
 * flag is raised; the hot path reads them without the lock. */
static _Thread_local em_mem_category tl_override = EM_MEM_AUTO;
static const char *(*callsite_fn)(int depth);

void em_mem_set_callsite_fn(const char *(*fn)(int depth)) { callsite_fn = fn; }

em_mem_category em_mem_set_category_override(em_mem_category c) {
  em_mem_category prev = tl_override;
  tl_override = c;
  return prev;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The category of a fresh allocation: the override, else by phase. */
static em_mem_category infer_category(em_phase ph) {
  if (tl_override != EM_MEM_AUTO) return tl_override;
  switch (ph) {
    case EM_PHASE_FORWARD: return EM_MEM_ACTIVATION;
    case EM_PHASE_BACKWARD: return EM_MEM_AUTOGRAD;
    case EM_PHASE_OPTIMIZER: return EM_MEM_OPTIMIZER_STATE;
    default: return EM_MEM_OTHER;
  }
}

/* ---- the ring ---- */

/* Keep the newest min(count, cap) events in a fresh buffer of `cap` slots. */
static int ring_resize(int64_t cap) {
  em_mem_event *fresh = malloc((size_t)cap * sizeof *fresh);
  if (!fresh) return -1;
  int64_t keep = ring_count < cap ? ring_count : cap, skip = ring_count - keep;
  for (int64_t i = 0; i < keep; i++) fresh[i] = ring[(ring_head + skip + i) % ring_cap];
  free(ring);
  ring = fresh;
  ring_cap = cap;
  ring_head = 0;
  ring_count = keep;
  n_dropped += skip;
  return 0;
}

static void ring_push(const em_mem_event *ev) {
  n_recorded++;
  if (ring_count == ring_cap && ring_cap < max_entries) {
    int64_t cap = ring_cap ? ring_cap * 2 : 4096;
    if (cap > max_entries) cap = max_entries;
    ring_resize(cap);                      /* on failure: overwrite below */
  }
  if (ring_cap == 0) { n_dropped++; return; }
  if (ring_count < ring_cap) {
    ring[(ring_head + ring_count) % ring_cap] = *ev;
    ring_count++;
    return;
  }
  ring[ring_head] = *ev;                   /* full: the oldest goes */
  ring_head = (ring_head + 1) % ring_cap;
  n_dropped++;
}

/* ---- the live table ---- */

static uint64_t mix(uint64_t k) {
  k ^= k >> 33; k *= 0xff51afd7ed558ccdull; k ^= k >> 33;
  return k;
}

static int64_t live_find(uint64_t key) {
  if (!live_cap) return -1;
  for (int64_t i = (int64_t)(mix(key) & (uint64_t)(live_cap - 1));; i = (i + 1) & (live_cap - 1)) {
    if (live_keys[i] == key) return i;
    if (!live_keys[i]) return -1;
  }
}

static int live_grow(void) {
  int64_t cap = live_cap ? live_cap * 2 : 1024;
  uint64_t *keys = calloc((size_t)cap, sizeof *keys);
  live_entry *vals = malloc((size_t)cap * sizeof *vals);
  if (!keys || !vals) { free(keys); free(vals); return -1; }
  for (int64_t i = 0; i < live_cap; i++) {
    if (!live_keys[i]) continue;
    int64_t j = (int64_t)(mix(live_keys[i]) & (uint64_t)(cap - 1));
    while (keys[j]) j = (j + 1) & (cap - 1);
    keys[j] = live_keys[i];
    vals[j] = live_vals[i];
  }
  free(live_keys); free(live_vals);
  live_keys = keys; live_vals = vals; live_cap = cap;
  return 0;
}

/* The entry for key; inserted zeroed (*fresh) when absent; NULL when out of memory. */
static live_entry *live_put(uint64_t key, bool *fresh) {
  int64_t i = live_find(key);
  *fresh = i < 0;
  if (i >= 0) return &live_vals[i];
  if ((live_count + 1) * 2 > live_cap && live_grow()) return NULL;
  i = (int64_t)(mix(key) & (uint64_t)(live_cap - 1));
  while (live_keys[i]) i = (i + 1) & (live_cap - 1);
  live_keys[i] = key;
  memset(&live_vals[i], 0, sizeof live_vals[i]);
  live_count++;
  return &live_vals[i];
}

static void live_remove(int64_t i) {
  live_bytes -= (int64_t)live_vals[i].alloc.size;
  live_keys[i] = 0;
  live_count--;
  /* backward-shift: move later members of the probe run into the hole */
  for (int64_t j = (i + 1) & (live_cap - 1); live_keys[j]; j = (j + 1) & (live_cap - 1)) {
    int64_t home = (int64_t)(mix(live_keys[j]) & (uint64_t)(live_cap - 1));
    /* j stays unless its home lies cyclically outside (i, j] */
    bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    live_keys[i] = live_keys[j];
    live_vals[i] = live_vals[j];
    live_keys[j] = 0;
    i = j;
  }
}

static void live_clear(void) {
  free(live_keys); free(live_vals);
  live_keys = NULL; live_vals = NULL;
  live_cap = live_count = live_bytes = 0;
}

/* ---- recording ---- */

static void fill_context(em_mem_event *ev) {
  const char *op = em_ctx_op();
  ev->op = op ? op : em_ctx_grad_fn();
  ev->module = em_ctx_module();
  ev->phase = (uint8_t)em_ctx_phase();
  ev->time_ns = now_ns();
}

void em_mem_record(em_mem_action a, int device, const void *addr, size_t size, size_t requested, const void *stream) {
  if (!em_mem_history_on() || !addr) return;
  if (device < 0 && !rec_cpu) return;
  em_mem_event ev;
  memset(&ev, 0, sizeof ev);
  ev.action = (uint8_t)a;
  ev.device = device;
  ev.addr = (uint64_t)(uintptr_t)addr;
  ev.size = size;
  ev.requested = a == EM_MEM_ALLOC ? requested : 0;
  ev.stream = (uint64_t)(uintptr_t)stream;
  fill_context(&ev);
  ev.category = (uint8_t)infer_category((em_phase)ev.phase);
  ev.callsite = callsite_fn ? callsite_fn(stack_depth) : NULL;
  pthread_mutex_lock(&lock);
  if (!recording) { pthread_mutex_unlock(&lock); return; }
  if (a == EM_MEM_ALLOC) {
    bool fresh;
    live_entry *e = live_put(ev.addr, &fresh);
    if (e) {
      if (!fresh) live_bytes -= (int64_t)e->alloc.size;   /* a stale entry (its free was not seen) */
      memset(e, 0, sizeof *e);
      e->alloc = ev;
      e->has_alloc = 1;
      e->category = ev.category;
      live_bytes += (int64_t)ev.size;
    }
  } else if (a == EM_MEM_FREE) {
    int64_t i = live_find(ev.addr);
    ev.category = i >= 0 ? live_vals[i].category : EM_MEM_OTHER;   /* what the block was */
    if (i >= 0) live_remove(i);
  }
  ring_push(&ev);
  pthread_mutex_unlock(&lock);
}

void em_mem_tag(const em_storage *s, em_mem_category c) {
  if (!em_mem_history_on() || !s || !s->data || (unsigned)c >= EM_MEM_CATEGORY_COUNT) return;
  int device = s->device.type == EM_CPU ? -1 : s->device.index;
  if (device < 0 && !rec_cpu) return;
  if (s->deleter) return;                  /* wrapped memory (mmap, pinned): no allocator's block */
  em_mem_event ev;
  memset(&ev, 0, sizeof ev);
  ev.action = EM_MEM_TAG;
  ev.device = device;
  ev.addr = (uint64_t)(uintptr_t)s->data;
  ev.category = (uint8_t)c;
  fill_context(&ev);
  uint64_t key = ev.addr;
  pthread_mutex_lock(&lock);
  bool rec = recording;
  int64_t i = rec ? live_find(key) : -1;
  bool same = i >= 0 && live_vals[i].category == c;
  pthread_mutex_unlock(&lock);
  if (!rec || same) return;                /* nothing changes: no event */
  ev.callsite = callsite_fn ? callsite_fn(stack_depth) : NULL;
  pthread_mutex_lock(&lock);
  if (!recording) { pthread_mutex_unlock(&lock); return; }
  bool fresh;
  live_entry *e = live_put(key, &fresh);
  if (e) {
    if (fresh) {                           /* allocated before recording: known from its first tag */
      size_t round = device < 0 ? 64 : 512;   /* the allocators' granularity */
      e->alloc = ev;
      e->alloc.size = s->nbytes ? (s->nbytes + round - 1) / round * round : round;
      live_bytes += (int64_t)e->alloc.size;
    } else {
      e->tag = ev;
      e->tag.size = e->alloc.size;
      e->has_tag = 1;
    }
    e->category = (uint8_t)c;
    ev.size = e->alloc.size;
  }
  ring_push(&ev);
  pthread_mutex_unlock(&lock);
}

static void clear_locked(bool keep_live) {
  free(ring);
  ring = NULL;
  ring_cap = ring_head = ring_count = n_dropped = n_recorded = 0;
  if (!keep_live) live_clear();
}

int em_mem_record_history(bool on, const em_mem_history_opts *opts) {
  em_mem_history_opts o = {EM_MEM_DEFAULT_MAX_ENTRIES, 0, true};
  if (opts) o = *opts;
  if (on && o.max_entries < 1)
    return em_error("record_history: expected max_entries >= 1, got %lld", (long long)o.max_entries);
  if (on && (o.stack_depth < 0 || o.stack_depth > 32))
    return em_error("record_history: expected stack_depth in [0, 32], got %d", o.stack_depth);
  pthread_mutex_lock(&lock);
  if (!on) {
    if (recording) stopped = true;         /* the history stays, frozen, for snapshots */
    recording = false;
    __atomic_store_n(&em_mem_history_flag, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&lock);
    return 0;
  }
  if (!recording) clear_locked(false);    /* a resumed trace would miss the frees in between */
  max_entries = o.max_entries;
  stack_depth = o.stack_depth;
  rec_cpu = o.cpu;
  if (ring_cap > max_entries) ring_resize(max_entries);   /* a smaller limit drops the oldest now */
  recording = true;
  stopped = false;
  __atomic_store_n(&em_mem_history_flag, 1, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&lock);
  return 0;
}

void em_mem_clear_history(void) {
  pthread_mutex_lock(&lock);
  clear_locked(recording);                 /* while recording the live table stays true */
  stopped = false;
  pthread_mutex_unlock(&lock);
}

static void stats_locked(em_mem_history_stats *o) {
  memset(o, 0, sizeof *o);
  o->recording = recording;
  o->stopped = stopped;
  o->stack_depth = stack_depth;
  o->cpu = rec_cpu;
  o->max_entries = max_entries;
  o->entries = ring_count;
  o->capacity = ring_cap;
  o->dropped = n_dropped;
  o->recorded = n_recorded;
  o->live_blocks = live_count;
  o->live_bytes = live_bytes;
}

void em_mem_history_stats_get(em_mem_history_stats *out) {
  pthread_mutex_lock(&lock);
  stats_locked(out);
  pthread_mutex_unlock(&lock);
}

static int block_cmp(const void *a, const void *b) {
  uint64_t x = ((const em_mem_block *)a)->alloc.addr, y = ((const em_mem_block *)b)->alloc.addr;
  return x < y ? -1 : x > y;
}

int em_mem_history_copy(em_mem_history *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&lock);
  out->time_ns = now_ns();
  stats_locked(&out->stats);
  out->events = malloc((size_t)(ring_count ? ring_count : 1) * sizeof *out->events);
  out->blocks = malloc((size_t)(live_count ? live_count : 1) * sizeof *out->blocks);
  if (!out->events || !out->blocks) {
    pthread_mutex_unlock(&lock);
    em_mem_history_free(out);
    return em_error_oom("out of memory: cannot copy the memory history (%lld events)", (long long)ring_count);
  }
  for (int64_t i = 0; i < ring_count; i++) out->events[i] = ring[(ring_head + i) % ring_cap];
  out->n_events = ring_count;
  for (int64_t i = 0; i < live_cap; i++) {
    if (!live_keys[i]) continue;
    em_mem_block *b = &out->blocks[out->n_blocks++];
    b->alloc = live_vals[i].alloc;
    b->tag = live_vals[i].tag;
    b->has_alloc = live_vals[i].has_alloc;
    b->has_tag = live_vals[i].has_tag;
    b->category = live_vals[i].category;
  }
  pthread_mutex_unlock(&lock);
  qsort(out->blocks, (size_t)out->n_blocks, sizeof *out->blocks, block_cmp);
  return 0;
}

void em_mem_history_free(em_mem_history *h) {
  free(h->events);
  free(h->blocks);
  memset(h, 0, sizeof *h);
}
