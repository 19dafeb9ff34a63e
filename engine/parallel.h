/* The one parallel-for of the CPU ops (engine/parallel.c: a small pool of
 * worker threads that sleep when idle).
 *
 *   typedef struct { const float *x; float *y; int64_t n; } job;
 *   static void body(void *ctx, int64_t begin, int64_t end) { ... items [begin, end) ... }
 *   em_parallel_for(rows, em_grain(D), body, &(job){x, y, D});
 *
 * [0, n) is cut into contiguous ranges of at least `grain` items, up to four
 * a thread (work stealing: parallel.c), or one a thread with
 * EMBER_CPU_SCHED=static; fewer than 2 * grain items run on the calling
 * thread with no fork at all, so the small tensors of the specs cost
 * what they did before threads. No op starts threads of its own.
 *
 * The contract that keeps every result bit-identical at any thread count:
 * a range only writes outputs no other range writes, and each output is
 * computed the same way whichever range holds it. A sum across ranges is
 * never accumulated in range order (the ranges move with the thread count);
 * reductions cut their input into EM_RED_BLOCK-sized blocks instead, a split
 * that depends on the shape only, reduce each block serially and combine
 * the blocks' partials in block order (em_red_blocks).
 *
 * A body may write its output with streaming stores (engine/stream.h): every
 * range ends with an sfence, so the caller sees the output complete.
 *
 * Bodies run on worker threads: they must not call em_error (its message is
 * thread-local) nor ops (a nested em_parallel_for runs serially, but ops
 * allocate and record); they read and write memory, nothing else. */
#ifndef EMBER_PARALLEL_H
#define EMBER_PARALLEL_H

#include <stdint.h>

typedef void (*em_range_fn)(void *ctx, int64_t begin, int64_t end);

/* fn(ctx, b, e) over contiguous ranges covering [0, n), in parallel when
 * n >= 2 * grain and more than one thread is allowed. */
void em_parallel_for(int64_t n, int64_t grain, em_range_fn fn, void *ctx);

/* em_parallel_for for a memory-bound body (elementwise ops, reductions):
 * the same contract, with up to 16 chunks a thread to steal instead of four
 * (EMBER_CPU_STEAL_MEM sets the count, 1 to 64: 4 is em_parallel_for's), so
 * a thread slowed by another process costs the op less on a loaded host. */
void em_parallel_for_mem(int64_t n, int64_t grain, em_range_fn fn, void *ctx);

/* em_parallel_for with `per_thread` chunks a thread to steal (1 to 64)
 * instead of four: bigger ranges for a body that does better with more
 * items at once (matmul merges adjacent tiles into one BLAS call). */
void em_parallel_for_chunks(int64_t n, int64_t grain, int per_thread, em_range_fn fn, void *ctx);

/* Work below which forking costs more than it saves: about 32K simple
 * element operations (tens of microseconds on one core). The specs lower it
 * (em_set_parallel_min_work) so their small tensors take the parallel paths. */
#define EM_PAR_MIN_WORK 32768
extern int64_t em_par_min_work;
/* Set the minimum work per range (>= 1); returns the previous value. */
int64_t em_set_parallel_min_work(int64_t n);

/* Items per range when each item costs `cost` element operations (>= 1). */
static inline int64_t em_grain(int64_t cost) {
  if (cost < 1) cost = 1;
  return cost >= em_par_min_work ? 1 : em_par_min_work / cost;
}

/* Reductions over long rows: each output's n reduced elements are cut into
 * blocks of EM_RED_BLOCK elements (a multiple of every chunk size the
 * reductions use), independent of the thread count. */
#define EM_RED_BLOCK 32768
static inline int64_t em_red_blocks(int64_t n) {
  return n <= EM_RED_BLOCK ? 1 : (n + EM_RED_BLOCK - 1) / EM_RED_BLOCK;
}

#endif
