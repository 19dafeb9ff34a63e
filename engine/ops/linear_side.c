/* Linear backward's side stream (EMBER_LINEAR_BWD_STREAM=1; issue 16;
 * docs/perf.md, the dwstream entry).
 *
 * Why: a linear's backward is two independent gemms, grad x = dy·W and
 * grad W = dyᵀ·x. At the small model's shapes each fills a fraction of the
 * GPU (grad W of a 768 x 768 weight: 36 output tiles for 132 SMs), one after
 * the other. Forked onto a side stream, grad W runs beside grad x: the same
 * gemms, the same algorithms, the same bits, sharing the SMs.
 *
 * How (engine/ops/matmul.c, autocast_linear_backward): everything is
 * allocated on the main stream first; fork (an event recorded on the main
 * stream, waited by the side stream); grad W's gemm launched on the side
 * stream with cuBLASLt's second workspace (two gemms in flight never share
 * one); back on the main stream, grad x's gemm; join (an event recorded on
 * the side stream, waited by the main stream) before the backward returns.
 * Under ember.cuda.graph the fork and join become two parallel branches of
 * the graph; eagerly, two streams.
 *
 * Why the join comes at once and not before grad W's first reader: the
 * caching allocator's free lists are per stream with no record_stream
 * (kernels/alloc.cu), so the blocks the side gemm reads (dy, the saved x)
 * and writes must not go back to the main stream's list before the main
 * stream has waited for it: they are released right after the backward
 * returns. Joined there, each later use is ordered after the side gemm by
 * stream order alone (the overlapped optimizer orders its frees the same
 * way: the main stream waits on the side stream's event first). The post-
 * accumulate-grad hooks (DDP, the overlapped optimizer) fire after the
 * backward, so they see grad W final on the main stream too. What a later
 * join would add is grad W beside the next layer's kernels, not beside
 * grad x: the overlap this is for.
 *
 * The stream and two events are per thread and device, made on first use
 * and kept (a graph captured with them keeps no reference to them). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "linear_side.h"

#define SIDE_DEVICES 16   /* kernels/matmul.cu's devices; beyond them the unchanged path */

static _Atomic int g_on = -1;   /* -1: EMBER_LINEAR_BWD_STREAM not read yet; else 0/1 */

int em_linear_bwd_stream_enabled(const char *op, bool *on) {
  int v = atomic_load(&g_on);
  if (v < 0) {
    const char *env = getenv("EMBER_LINEAR_BWD_STREAM");
    if (!env || !*env || strcmp(env, "0") == 0) v = 0;
    else if (strcmp(env, "1") == 0) v = 1;
    else return em_error("%s: expected EMBER_LINEAR_BWD_STREAM to be 0 or 1, got '%s'", op, env);
    atomic_store(&g_on, v);
  }
  *on = v == 1;
  return 0;
}

typedef struct {
  em_stream *side;
  em_event *fork, *join;
} side_state;

static _Thread_local side_state tl_side[SIDE_DEVICES];

int em_linear_side_wanted(int device, bool *yes) {
  bool on;
  *yes = false;
  if (em_linear_bwd_stream_enabled("linear", &on)) return -1;
  *yes = on && device >= 0 && device < SIDE_DEVICES && device == em_cuda_current_device();
  return 0;
}

static side_state *get_side(int device) {
  side_state *s = &tl_side[device];
  if (!s->side) s->side = em_stream_new(device);
  if (s->side && !s->fork) s->fork = em_event_new(false);
  if (s->side && s->fork && !s->join) s->join = em_event_new(false);
  return s->side && s->fork && s->join ? s : NULL;
}

int em_linear_side_fork(int device, em_stream **main) {
  side_state *s = get_side(device);
  if (!s || em_gemm_cuda_side_workspace(device)) return -1;
  *main = em_stream_current(device);
  if (em_event_record(s->fork, *main) || em_stream_wait_event(s->side, s->fork)) return -1;
  em_stream_set_current(device, s->side);
  return 0;
}

void em_linear_side_back(int device, em_stream *main) { em_stream_set_current(device, main); }

int em_linear_side_join(int device) {
  side_state *s = &tl_side[device];
  if (em_event_record(s->join, s->side)) return -1;
  return em_stream_wait_event(em_stream_current(device), s->join);
}
