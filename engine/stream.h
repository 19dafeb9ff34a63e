/* Streaming (non-temporal) stores for the CPU ops' large contiguous outputs.
 *
 * A regular store to a line that is not in cache first reads the line (a
 * read-for-ownership), so an op writing a fresh 64 MiB output moves 128 MiB
 * for it: an add moves 4 units for the 3 it needs, a cast or a clone 3 for 2.
 * glibc's memcpy avoids the read above a size threshold (and Intel's rep movsb
 * does in effect), which is why a plain copy outran every op. Here an op
 * computes a piece of its output into a small L1-resident buffer
 * (EM_STREAM_PIECE bytes) and em_stream_copy writes it out with non-temporal
 * stores, whole 64-byte lines at a time.
 *
 * Only outputs of at least em_stream_min bytes are streamed (em_stream_wanted):
 * streamed lines leave the caches, and a small output the next op reads back
 * at once is better left in them. The values written are the same; only how
 * the bytes reach memory changes, so results stay bit-identical.
 *
 * Ordering: non-temporal stores are weakly ordered; em_parallel_for issues an
 * sfence at the end of every range (engine/parallel.c), before the range is
 * reported done, so callers see a streamed output complete. A body that
 * streams outside em_parallel_for must call em_stream_fence itself. */
#ifndef EMBER_STREAM_H
#define EMBER_STREAM_H

#include <stdbool.h>
#include <stdint.h>
#include "ember/dtype.h"

/* Outputs from this size on are streamed: bigger than the last-level cache
 * share of a few cores, so such an output would leave the caches before the
 * next op reads it back anyway. EMBER_CPU_STREAM_MB overrides it at start
 * ("off": never stream). */
#define EM_STREAM_MIN_DEFAULT ((int64_t)16 << 20)
extern int64_t em_stream_min;

/* Set the threshold in bytes (0: stream every output, -1: never); returns the previous value. */
int64_t em_set_stream_min(int64_t bytes);

/* Whether an output of `bytes` is written with streaming stores. */
static inline bool em_stream_wanted(int64_t bytes) { return em_stream_min >= 0 && bytes >= em_stream_min; }

/* Bytes an op computes into its buffer before streaming them out (a multiple of 64). */
#define EM_STREAM_PIECE 4096

/* dst[0..bytes) = src[0..bytes): the whole 64-byte lines of dst with
 * non-temporal stores, the partial lines at either end with regular ones. */
void em_stream_copy(void *dst, const void *src, int64_t bytes);

/* em_convert (ember/dtype.h) with the destination streamed: converted a piece
 * at a time into a buffer (a same-dtype copy goes straight out). */
void em_convert_stream(void *dst, em_dtype dt, const void *src, em_dtype st, int64_t n);

/* The bitwise OR of the 8-byte words of p[0..bytes) (a ragged end padded
 * with zero bytes), read over the threads: memory read at full bandwidth with
 * no arithmetic to wait on and nothing written. The read half of a STREAM
 * measurement (scripts/bench_ops.lua) and the CPU cache flush of ember.bench,
 * which must leave no dirty lines behind for the timed op to write back. */
uint64_t em_stream_read(const void *p, int64_t bytes);

/* Order this thread's streamed stores before its later stores. */
void em_stream_fence(void);

#endif
