/* What a memory snapshot is made of, shared by the JSON and pickle writers:
 * the caching allocator's segments (taken first, under the allocator's
 * locks only) and a copy of the history (then, under the history's lock).
 * Not public API. */
#ifndef EMBER_SNAPSHOT_H
#define EMBER_SNAPSHOT_H

#include "ember/cuda.h"
#include "ember/memory.h"
#include "alloc/outbuf.h"

typedef struct {
  em_cuda_segment_info *segs;
  int64_t n_segs;
  em_mem_history h;
} em_snap;

int em_snap_take(em_snap *s);
void em_snap_free(em_snap *s);
/* The history's record of the live block at addr, or NULL (allocated before recording). */
const em_mem_block *em_snap_block(const em_snap *s, uint64_t addr);
/* "cpu" or "cuda:N" into buf. */
const char *em_snap_device(int device, char buf[16]);
/* The category a block shows: the history's, or "unknown" when it has none. */
const char *em_snap_category(const em_mem_block *b);

int em_snap_write_json(const em_snap *s, em_outbuf *o);
int em_snap_write_pickle(const em_snap *s, em_outbuf *o);

#endif
