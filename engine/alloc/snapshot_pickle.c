/* The snapshot as the pickle PyTorch's memory tools read (the dict that
 * torch.cuda.memory._snapshot() returns):
 *
 *   {'segments': [{'device', 'address', 'total_size', 'allocated_size',
 *                  'active_size', 'requested_size', 'stream', 'segment_type',
 *                  'frames', 'blocks': [{'address', 'size', 'requested_size',
 *                  'state', 'frames', 'category'}]}],
 *    'device_traces': [[{'action', 'addr', 'size', 'stream', 'time_us',
 *                        'frames', 'category', 'op', 'module', 'phase'}]],
 *    'ember': {'devices': ['cuda:0', 'cpu'], 'dropped': n, ...}}
 *
 * device_traces is indexed by device; the CPU comes after the last GPU (0
 * without GPU events). A CPU storage is its own segment: its allocation is
 * segment_alloc + alloc, its free free_requested + free_completed +
 * segment_free, so memory_viz can replay a CPU trace like a GPU one. Frees
 * are immediate (no record_stream), so every free is free_requested followed
 * at once by free_completed (memory_viz shows them as one "free"). An
 * allocation carries the category its block ended up with (a backward
 * temporary that became a .grad is "gradient"); tags are not events here.
 * Frames: the call site first, named "op [category, phase, module]", then the
 * caller frames recorded with stack_depth. Each trace ends with a 'snapshot'
 * event of category 'unknown' (some MemoryViz.js versions fail when events
 * carry categories but none is 'unknown'). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "internal.h"
#include "alloc/pickle.h"
#include "alloc/snapshot.h"

typedef struct {
  const em_snap *s;
  em_pickle pk;
  em_keymap frames;            /* event context -> memo id of its frames list */
  uint8_t *final_cat;          /* per event: the category its block ended up with */
  int cpu_slot, n_slots;
} pk_ctx;

static void kv_str(pk_ctx *c, const char *k, const char *v) { pk_str_memo(&c->pk, k); pk_str_memo(&c->pk, v); }
static void kv_uint(pk_ctx *c, const char *k, uint64_t v) { pk_str_memo(&c->pk, k); pk_uint(&c->pk, v); }

/* One frame {'filename', 'line', 'name'} from "file:line" or "file:line in name". */
static void put_frame(pk_ctx *c, const char *s, size_t len, const char *name_override) {
  size_t head = len;
  const char *name = NULL;
  size_t name_len = 0;
  for (size_t i = 0; i + 4 <= len; i++) {
    if (memcmp(s + i, " in ", 4)) continue;
    size_t j = i;
    while (j > 0 && s[j - 1] >= '0' && s[j - 1] <= '9') j--;
    if (j < i && j > 0 && s[j - 1] == ':') { head = i; name = s + i + 4; name_len = len - i - 4; break; }
  }
  size_t colon = head;
  while (colon > 0 && s[colon - 1] >= '0' && s[colon - 1] <= '9') colon--;
  int64_t line = 0;
  if (colon < head && colon > 0 && s[colon - 1] == ':') {
    for (size_t i = colon; i < head; i++) line = line * 10 + (s[i] - '0');
    colon--;
  } else {
    colon = head;                             /* no line number */
  }
  pk_dict(&c->pk);
  pk_str_memo(&c->pk, "filename");
  pk_strn(&c->pk, s, colon);
  pk_str_memo(&c->pk, "line");
  pk_int(&c->pk, line);
  pk_str_memo(&c->pk, "name");
  if (name_override) pk_str(&c->pk, name_override);
  else if (name) pk_strn(&c->pk, name, name_len);
  else pk_str_memo(&c->pk, "?");
  pk_dict_end(&c->pk);
}

/* The frames list of an event context, written once and then referenced. */
static void put_frames(pk_ctx *c, const em_mem_event *e, uint8_t category) {
  uint64_t k[4] = {(uint64_t)(uintptr_t)e->callsite, (uint64_t)(uintptr_t)e->op, (uint64_t)(uintptr_t)e->module,
                   (uint64_t)category | (uint64_t)e->phase << 8};
  bool found;
  int64_t *id = em_km_get(&c->frames, k, -1, &found);
  if (id && found) { pk_get(&c->pk, *id); return; }
  if (!id) c->pk.oom = true;
  char desc[400];
  snprintf(desc, sizeof desc, "%s [%s, %s%s%s]", e->op ? e->op : "(no op)",
           em_mem_category_name((em_mem_category)category), em_phase_name((em_phase)e->phase),
           e->module && *e->module ? ", " : "", e->module ? e->module : "");
  pk_list(&c->pk);
  const char *cs = e->callsite ? e->callsite : "?";
  for (int first = 1; *cs; first = 0) {
    const char *nl = strchr(cs, '\n');
    size_t len = nl ? (size_t)(nl - cs) : strlen(cs);
    put_frame(c, cs, len, first ? desc : NULL);
    cs += len + (nl ? 1 : 0);
  }
  pk_list_end(&c->pk);
  int64_t m = pk_memoize(&c->pk);
  if (id) *id = m;
}

static int slot_of(const pk_ctx *c, int device) { return device < 0 ? c->cpu_slot : device; }

/* {'action': ..., 'addr': ..., ...} for one pickle trace entry. */
static void put_entry(pk_ctx *c, const char *action, const em_mem_event *e, uint8_t category, bool with_category) {
  pk_dict(&c->pk);
  kv_str(c, "action", action);
  kv_uint(c, "addr", e->addr);
  kv_uint(c, "size", e->size);
  kv_uint(c, "stream", e->stream);
  pk_str_memo(&c->pk, "time_us");
  pk_int(&c->pk, e->time_ns / 1000);
  pk_str_memo(&c->pk, "frames");
  put_frames(c, e, category);
  if (with_category) kv_str(c, "category", em_mem_category_name((em_mem_category)category));
  pk_str_memo(&c->pk, "op");
  pk_str_memo(&c->pk, e->op);
  kv_str(c, "module", e->module ? e->module : "");
  kv_str(c, "phase", em_phase_name((em_phase)e->phase));
  pk_dict_end(&c->pk);
}

static void put_trace(pk_ctx *c, int slot) {
  const em_mem_history *h = &c->s->h;
  bool any = false;
  pk_list(&c->pk);
  for (int64_t i = 0; i < h->n_events; i++) {
    const em_mem_event *e = &h->events[i];
    if (slot_of(c, e->device) != slot) continue;
    any = true;
    uint8_t cat = c->final_cat[i];
    bool cpu = e->device < 0;
    switch (e->action) {
      case EM_MEM_ALLOC:
        if (cpu) put_entry(c, "segment_alloc", e, cat, false);
        put_entry(c, "alloc", e, cat, true);
        break;
      case EM_MEM_FREE:
        put_entry(c, "free_requested", e, cat, true);
        put_entry(c, "free_completed", e, cat, true);
        if (cpu) put_entry(c, "segment_free", e, cat, false);
        break;
      case EM_MEM_SEGMENT_ALLOC: put_entry(c, "segment_alloc", e, cat, false); break;
      case EM_MEM_SEGMENT_FREE: put_entry(c, "segment_free", e, cat, false); break;
      default: break;                          /* tags: folded into the allocations' categories */
    }
  }
  if (any) {
    pk_dict(&c->pk);
    kv_str(c, "action", "snapshot");
    kv_uint(c, "addr", 0);
    kv_uint(c, "size", 0);
    kv_uint(c, "stream", 0);
    pk_str_memo(&c->pk, "time_us");
    pk_int(&c->pk, h->time_ns / 1000);
    pk_str_memo(&c->pk, "frames");
    pk_list(&c->pk);
    pk_list_end(&c->pk);
    kv_str(c, "category", "unknown");
    pk_dict_end(&c->pk);
  }
  pk_list_end(&c->pk);
}

/* An active block's dict; b is the history's record of it (or NULL). */
static void put_active_block(pk_ctx *c, uint64_t addr, uint64_t size, const em_mem_block *b) {
  pk_dict(&c->pk);
  kv_uint(c, "address", addr);
  kv_uint(c, "size", size);
  kv_uint(c, "requested_size", b && b->alloc.requested ? b->alloc.requested : size);
  kv_str(c, "state", "active_allocated");
  pk_str_memo(&c->pk, "frames");
  if (b) put_frames(c, &b->alloc, b->category);
  else { pk_list(&c->pk); pk_list_end(&c->pk); }
  kv_str(c, "category", em_snap_category(b));
  pk_dict_end(&c->pk);
}

static void segment_head(pk_ctx *c, int slot, uint64_t addr, uint64_t total, uint64_t allocated, uint64_t requested,
                         uint64_t stream, const char *type) {
  pk_dict(&c->pk);
  pk_str_memo(&c->pk, "device");
  pk_int(&c->pk, slot);
  kv_uint(c, "address", addr);
  kv_uint(c, "total_size", total);
  kv_uint(c, "allocated_size", allocated);
  kv_uint(c, "active_size", allocated);
  kv_uint(c, "requested_size", requested);
  kv_uint(c, "stream", stream);
  kv_str(c, "segment_type", type);
  pk_str_memo(&c->pk, "is_expandable");
  pk_bool(&c->pk, false);
  pk_str_memo(&c->pk, "frames");
  pk_list(&c->pk);
  pk_list_end(&c->pk);
  pk_str_memo(&c->pk, "blocks");
  pk_list(&c->pk);
}

static void put_segments(pk_ctx *c) {
  const em_snap *s = c->s;
  pk_list(&c->pk);
  for (int64_t i = 0; i < s->n_segs; i++) {
    const em_cuda_segment_info *g = &s->segs[i];
    uint64_t allocated = 0, requested = 0;
    for (int64_t j = 0; j < g->n_blocks; j++) {
      if (!g->blocks[j].allocated) continue;
      const em_mem_block *b = em_snap_block(s, g->blocks[j].addr);
      allocated += g->blocks[j].size;
      requested += b && b->alloc.requested ? b->alloc.requested : g->blocks[j].size;
    }
    segment_head(c, g->device, g->addr, g->size, allocated, requested, g->stream, g->small ? "small" : "large");
    for (int64_t j = 0; j < g->n_blocks; j++) {
      const em_cuda_block_info *k = &g->blocks[j];
      if (k->allocated) { put_active_block(c, k->addr, k->size, em_snap_block(s, k->addr)); continue; }
      pk_dict(&c->pk);
      kv_uint(c, "address", k->addr);
      kv_uint(c, "size", k->size);
      kv_uint(c, "requested_size", 0);
      kv_str(c, "state", "inactive");
      pk_str_memo(&c->pk, "frames");
      pk_list(&c->pk);
      pk_list_end(&c->pk);
      pk_dict_end(&c->pk);
    }
    pk_list_end(&c->pk);                       /* blocks */
    pk_dict_end(&c->pk);
  }
  for (int64_t i = 0; i < s->h.n_blocks; i++) {  /* a CPU storage is a segment of one block */
    const em_mem_block *b = &s->h.blocks[i];
    if (b->alloc.device >= 0) continue;
    uint64_t req = b->alloc.requested ? b->alloc.requested : b->alloc.size;
    segment_head(c, c->cpu_slot, b->alloc.addr, b->alloc.size, b->alloc.size, req, 0, "large");
    put_active_block(c, b->alloc.addr, b->alloc.size, b);
    pk_list_end(&c->pk);
    pk_dict_end(&c->pk);
  }
  pk_list_end(&c->pk);
}

/* Which category each allocation ended with: later tags of its block, until its free. */
static int resolve_categories(pk_ctx *c) {
  const em_mem_history *h = &c->s->h;
  c->final_cat = malloc((size_t)(h->n_events ? h->n_events : 1));
  if (!c->final_cat) return -1;
  em_keymap open = {0};
  int rc = 0;
  for (int64_t i = 0; i < h->n_events && rc == 0; i++) {
    const em_mem_event *e = &h->events[i];
    c->final_cat[i] = e->category;
    if (e->action != EM_MEM_ALLOC && e->action != EM_MEM_FREE && e->action != EM_MEM_TAG) continue;
    uint64_t k[4] = {e->addr, 0, 0, 0};
    bool found;
    int64_t *v = em_km_get(&open, k, -1, &found);
    if (!v) { rc = -1; break; }
    if (e->action == EM_MEM_ALLOC) *v = i;
    else if (e->action == EM_MEM_FREE) *v = -1;
    else if (*v >= 0) c->final_cat[*v] = e->category;
  }
  em_km_free(&open);
  return rc;
}

int em_snap_write_pickle(const em_snap *s, em_outbuf *o) {
  pk_ctx c;
  memset(&c, 0, sizeof c);
  c.s = s;
  int max_dev = -1;
  bool cpu = false;
  for (int64_t i = 0; i < s->n_segs; i++) if (s->segs[i].device > max_dev) max_dev = s->segs[i].device;
  for (int64_t i = 0; i < s->h.n_events; i++) {
    if (s->h.events[i].device > max_dev) max_dev = s->h.events[i].device;
    if (s->h.events[i].device < 0) cpu = true;
  }
  for (int64_t i = 0; i < s->h.n_blocks; i++) if (s->h.blocks[i].alloc.device < 0) cpu = true;
  c.cpu_slot = max_dev + 1;
  c.n_slots = cpu ? c.cpu_slot + 1 : max_dev + 1;
  if (resolve_categories(&c)) {
    free(c.final_cat);
    return em_error_oom("out of memory: cannot write the memory snapshot");
  }
  pk_begin(&c.pk, o);
  pk_dict(&c.pk);
  pk_str_memo(&c.pk, "segments");
  put_segments(&c);
  pk_str_memo(&c.pk, "device_traces");
  pk_list(&c.pk);
  for (int slot = 0; slot < c.n_slots; slot++) put_trace(&c, slot);
  pk_list_end(&c.pk);
  pk_str_memo(&c.pk, "ember");
  pk_dict(&c.pk);
  kv_str(&c, "format", "ember.memory_snapshot");
  pk_str_memo(&c.pk, "version");
  pk_int(&c.pk, 1);
  pk_str_memo(&c.pk, "devices");
  pk_list(&c.pk);
  char dev[16];
  for (int slot = 0; slot < c.n_slots; slot++) pk_str(&c.pk, em_snap_device(cpu && slot == c.cpu_slot ? -1 : slot, dev));
  pk_list_end(&c.pk);
  kv_uint(&c, "dropped", (uint64_t)s->h.stats.dropped);
  kv_uint(&c, "recorded", (uint64_t)s->h.stats.recorded);
  pk_dict_end(&c.pk);
  pk_dict_end(&c.pk);
  int rc = pk_end(&c.pk);
  em_km_free(&c.frames);
  free(c.final_cat);
  if (rc) return em_error_oom("out of memory: cannot write the memory snapshot");
  return 0;
}
