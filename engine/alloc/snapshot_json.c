/* Ember's JSON memory snapshot (docs/memory.md has the schema). Small
 * things first, one per line (segments, live blocks with their history, the
 * string table), then the trace: one event per line as a row of the
 * "fields" columns, op/module/callsite as indices into "strings". Rows keep a
 * million-event file near 100 bytes an event and let scripts/memviz.lua read
 * it a line at a time. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "internal.h"
#include "alloc/keymap.h"
#include "alloc/snapshot.h"

static void put_u64(em_outbuf *o, uint64_t v) {
  char tmp[24];
  int n = 0;
  do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v);
  char out[24];
  for (int i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
  em_outbuf_write(o, out, (size_t)n);
}
static void put_i64(em_outbuf *o, int64_t v) {
  if (v < 0) { em_outbuf_byte(o, '-'); put_u64(o, (uint64_t)0 - (uint64_t)v); }
  else put_u64(o, (uint64_t)v);
}

/* A JSON string (null for NULL); control characters escaped, other bytes as they are. */
static void put_str(em_outbuf *o, const char *s) {
  if (!s) { em_outbuf_str(o, "null"); return; }
  em_outbuf_byte(o, '"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') { em_outbuf_byte(o, '\\'); em_outbuf_byte(o, *p); }
    else if (*p == '\n') em_outbuf_str(o, "\\n");
    else if (*p == '\t') em_outbuf_str(o, "\\t");
    else if (*p < 0x20) em_outbuf_printf(o, "\\u%04x", *p);
    else em_outbuf_byte(o, *p);
  }
  em_outbuf_byte(o, '"');
}

/* An event as an object (the history of a live block). */
static void put_event(em_outbuf *o, const em_mem_event *e) {
  char dev[16];
  em_outbuf_str(o, "{\"time_ns\":"); put_i64(o, e->time_ns);
  em_outbuf_str(o, ",\"action\":"); put_str(o, em_mem_action_name((em_mem_action)e->action));
  em_outbuf_str(o, ",\"device\":"); put_str(o, em_snap_device(e->device, dev));
  em_outbuf_str(o, ",\"addr\":"); put_u64(o, e->addr);
  em_outbuf_str(o, ",\"size\":"); put_u64(o, e->size);
  em_outbuf_str(o, ",\"requested_size\":"); put_u64(o, e->requested);
  em_outbuf_str(o, ",\"stream\":"); put_u64(o, e->stream);
  em_outbuf_str(o, ",\"category\":"); put_str(o, em_mem_category_name((em_mem_category)e->category));
  em_outbuf_str(o, ",\"phase\":"); put_str(o, em_phase_name((em_phase)e->phase));
  em_outbuf_str(o, ",\"op\":"); put_str(o, e->op);
  em_outbuf_str(o, ",\"module\":"); put_str(o, e->module);
  em_outbuf_str(o, ",\"callsite\":"); put_str(o, e->callsite);
  em_outbuf_byte(o, '}');
}

static void put_block(em_outbuf *o, int device, uint64_t addr, uint64_t size, const em_mem_block *b, bool *first) {
  char dev[16];
  em_outbuf_str(o, *first ? "\n" : ",\n");
  *first = false;
  em_outbuf_str(o, "{\"device\":"); put_str(o, em_snap_device(device, dev));
  em_outbuf_str(o, ",\"address\":"); put_u64(o, addr);
  em_outbuf_str(o, ",\"size\":"); put_u64(o, size);
  em_outbuf_str(o, ",\"requested_size\":"); put_u64(o, b && b->alloc.requested ? b->alloc.requested : size);
  em_outbuf_str(o, ",\"category\":"); put_str(o, em_snap_category(b));
  em_outbuf_str(o, ",\"history\":[");
  if (b) put_event(o, &b->alloc);
  if (b && b->has_tag) { em_outbuf_byte(o, ','); put_event(o, &b->tag); }
  em_outbuf_str(o, "]}");
}

static void put_segments(em_outbuf *o, const em_snap *s) {
  char dev[16];
  em_outbuf_str(o, "\"segments\":[");
  for (int64_t i = 0; i < s->n_segs; i++) {
    const em_cuda_segment_info *g = &s->segs[i];
    uint64_t allocated = 0, requested = 0;
    for (int64_t j = 0; j < g->n_blocks; j++) {
      if (!g->blocks[j].allocated) continue;
      const em_mem_block *b = em_snap_block(s, g->blocks[j].addr);
      allocated += g->blocks[j].size;
      requested += b && b->alloc.requested ? b->alloc.requested : g->blocks[j].size;
    }
    em_outbuf_str(o, i ? ",\n{\"device\":" : "\n{\"device\":"); put_str(o, em_snap_device(g->device, dev));
    em_outbuf_str(o, ",\"address\":"); put_u64(o, g->addr);
    em_outbuf_str(o, ",\"total_size\":"); put_u64(o, g->size);
    em_outbuf_str(o, ",\"allocated_size\":"); put_u64(o, allocated);
    em_outbuf_str(o, ",\"requested_size\":"); put_u64(o, requested);
    em_outbuf_str(o, ",\"stream\":"); put_u64(o, g->stream);
    em_outbuf_str(o, ",\"segment_type\":"); put_str(o, g->small ? "small" : "large");
    em_outbuf_str(o, ",\"graph_pool\":"); em_outbuf_str(o, g->graph_pool ? "true" : "false");
    em_outbuf_str(o, ",\"blocks\":[");
    for (int64_t j = 0; j < g->n_blocks; j++) {
      const em_cuda_block_info *k = &g->blocks[j];
      const em_mem_block *b = k->allocated ? em_snap_block(s, k->addr) : NULL;
      em_outbuf_str(o, j ? ",{\"address\":" : "{\"address\":"); put_u64(o, k->addr);
      em_outbuf_str(o, ",\"size\":"); put_u64(o, k->size);
      em_outbuf_str(o, ",\"requested_size\":");
      put_u64(o, !k->allocated ? 0 : b && b->alloc.requested ? b->alloc.requested : k->size);
      em_outbuf_str(o, ",\"state\":"); put_str(o, k->allocated ? "active_allocated" : "inactive");
      if (k->allocated) { em_outbuf_str(o, ",\"category\":"); put_str(o, em_snap_category(b)); }
      em_outbuf_byte(o, '}');
    }
    em_outbuf_str(o, "]}");
  }
  em_outbuf_str(o, "],\n");
}

/* Live blocks: the allocator's active blocks, then the CPU blocks history knows. */
static void put_blocks(em_outbuf *o, const em_snap *s) {
  bool first = true;
  em_outbuf_str(o, "\"blocks\":[");
  for (int64_t i = 0; i < s->n_segs; i++)
    for (int64_t j = 0; j < s->segs[i].n_blocks; j++) {
      const em_cuda_block_info *k = &s->segs[i].blocks[j];
      if (k->allocated) put_block(o, s->segs[i].device, k->addr, k->size, em_snap_block(s, k->addr), &first);
    }
  for (int64_t i = 0; i < s->h.n_blocks; i++) {
    const em_mem_block *b = &s->h.blocks[i];
    if (b->alloc.device < 0) put_block(o, -1, b->alloc.addr, b->alloc.size, b, &first);
  }
  em_outbuf_str(o, "],\n");
}

/* The index of s in the string table (0 is ""/none), adding it when new. */
static int64_t string_index(em_keymap *m, const char **table, int64_t *n, const char *s) {
  if (!s || !*s) return 0;
  uint64_t k[4] = {(uint64_t)(uintptr_t)s, 0, 0, 0};
  bool found;
  int64_t *v = em_km_get(m, k, *n, &found);
  if (!v) return -1;
  if (!found) table[(*n)++] = s;
  return *v;
}

int em_snap_write_json(const em_snap *s, em_outbuf *o) {
  const em_mem_history_stats *st = &s->h.stats;
  em_outbuf_str(o, "{\"format\":\"ember.memory_snapshot\",\"version\":1,\n\"time_ns\":");
  put_i64(o, s->h.time_ns);
  em_outbuf_printf(o, ",\n\"history\":{\"recording\":%s,\"stopped\":%s,\"max_entries\":%" PRId64
                   ",\"stack_depth\":%d,\"cpu\":%s,\"entries\":%" PRId64 ",\"dropped\":%" PRId64
                   ",\"recorded\":%" PRId64 "},\n", st->recording ? "true" : "false", st->stopped ? "true" : "false",
                   st->max_entries, st->stack_depth, st->cpu ? "true" : "false", st->entries, st->dropped, st->recorded);
  em_outbuf_str(o, "\"categories\":[");
  for (int c = 0; c < EM_MEM_CATEGORY_COUNT; c++) {
    if (c) em_outbuf_byte(o, ',');
    put_str(o, em_mem_category_name((em_mem_category)c));
  }
  em_outbuf_str(o, "],\n");
  put_segments(o, s);
  put_blocks(o, s);

  /* at most three strings an event, plus "" */
  const char **table = malloc((size_t)(3 * s->h.n_events + 1) * sizeof *table);
  int64_t *idx = malloc((size_t)(3 * s->h.n_events + 1) * sizeof *idx);
  em_keymap m = {0};
  int64_t n = 1;
  int rc = 0;
  if (!table || !idx) rc = -1;
  if (table) table[0] = "";
  for (int64_t i = 0; rc == 0 && i < s->h.n_events; i++) {
    const em_mem_event *e = &s->h.events[i];
    idx[3 * i] = string_index(&m, table, &n, e->op);
    idx[3 * i + 1] = string_index(&m, table, &n, e->module);
    idx[3 * i + 2] = string_index(&m, table, &n, e->callsite);
    if (idx[3 * i] < 0 || idx[3 * i + 1] < 0 || idx[3 * i + 2] < 0) rc = -1;
  }
  em_km_free(&m);
  if (rc) {
    free(table); free(idx);
    return em_error_oom("out of memory: cannot index the strings of %" PRId64 " events", s->h.n_events);
  }
  em_outbuf_str(o, "\"strings\":[");
  for (int64_t i = 0; i < n; i++) {
    em_outbuf_str(o, i ? ",\n" : "\n");
    put_str(o, table[i]);
  }
  em_outbuf_str(o, "],\n\"fields\":[\"time_ns\",\"action\",\"device\",\"addr\",\"size\",\"requested_size\","
                "\"stream\",\"category\",\"phase\",\"op\",\"module\",\"callsite\"],\n\"trace\":[\n");
  char dev[16];
  for (int64_t i = 0; i < s->h.n_events; i++) {
    const em_mem_event *e = &s->h.events[i];
    em_outbuf_byte(o, '[');
    put_i64(o, e->time_ns);
    em_outbuf_str(o, ",\""); em_outbuf_str(o, em_mem_action_name((em_mem_action)e->action));
    em_outbuf_str(o, "\",\""); em_outbuf_str(o, em_snap_device(e->device, dev));
    em_outbuf_str(o, "\","); put_u64(o, e->addr);
    em_outbuf_byte(o, ','); put_u64(o, e->size);
    em_outbuf_byte(o, ','); put_u64(o, e->requested);
    em_outbuf_byte(o, ','); put_u64(o, e->stream);
    em_outbuf_str(o, ",\""); em_outbuf_str(o, em_mem_category_name((em_mem_category)e->category));
    em_outbuf_str(o, "\",\""); em_outbuf_str(o, em_phase_name((em_phase)e->phase));
    em_outbuf_str(o, "\","); put_i64(o, idx[3 * i]);
    em_outbuf_byte(o, ','); put_i64(o, idx[3 * i + 1]);
    em_outbuf_byte(o, ','); put_i64(o, idx[3 * i + 2]);
    em_outbuf_str(o, i + 1 < s->h.n_events ? "],\n" : "]\n");
  }
  em_outbuf_str(o, "]}\n");
  free(table);
  free(idx);
  return 0;
}
