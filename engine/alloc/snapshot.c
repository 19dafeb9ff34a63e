/* em_mem_snapshot_save: take the segments and the history, then hand them
 * to the JSON or pickle writer (snapshot_json.c, snapshot_pickle.c). */
#include <stdio.h>
#include <string.h>
#include "internal.h"
#include "alloc/snapshot.h"

int em_snap_take(em_snap *s) {
  memset(s, 0, sizeof *s);
  if (em_cuda_memory_segments(-1, &s->segs, &s->n_segs)) return -1;
  if (em_mem_history_copy(&s->h)) {
    em_cuda_segments_free(s->segs, s->n_segs);
    s->segs = NULL;
    return -1;
  }
  return 0;
}

void em_snap_free(em_snap *s) {
  em_cuda_segments_free(s->segs, s->n_segs);
  em_mem_history_free(&s->h);
  memset(s, 0, sizeof *s);
}

const em_mem_block *em_snap_block(const em_snap *s, uint64_t addr) {
  int64_t lo = 0, hi = s->h.n_blocks - 1;
  while (lo <= hi) {
    int64_t mid = lo + (hi - lo) / 2;
    uint64_t a = s->h.blocks[mid].alloc.addr;
    if (a == addr) return &s->h.blocks[mid];
    if (a < addr) lo = mid + 1; else hi = mid - 1;
  }
  return NULL;
}

const char *em_snap_device(int device, char buf[16]) {
  if (device < 0) snprintf(buf, 16, "cpu");
  else snprintf(buf, 16, "cuda:%d", device);
  return buf;
}

const char *em_snap_category(const em_mem_block *b) {
  return b ? em_mem_category_name((em_mem_category)b->category) : "unknown";
}

int em_mem_snapshot_save(const char *path, em_mem_format fmt) {
  em_snap s;
  if (em_snap_take(&s)) return -1;
  em_outbuf o;
  int rc = em_outbuf_open(&o, path, "memory.snapshot");
  if (rc == 0) {
    rc = fmt == EM_MEM_FORMAT_PICKLE ? em_snap_write_pickle(&s, &o) : em_snap_write_json(&s, &o);
    if (rc) em_outbuf_abort(&o);
    else rc = em_outbuf_commit(&o);
  }
  em_snap_free(&s);
  return rc;
}
