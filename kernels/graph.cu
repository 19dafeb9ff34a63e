/* CUDA graph capture: record everything a function launches, replay it with
 * one launch. Ember's answer to launch overhead (with fused kernels).
 *
 * em_graph_begin makes a fresh non-blocking side stream current on this
 * thread and starts cudaStreamBeginCapture on it in thread-local mode, with
 * a private memory pool active (alloc.cu): every allocation during capture
 * comes from segments the graph owns, so each replay writes the very
 * addresses the captured tensors hold, and nothing else can take that
 * memory while the graph lives. Tensors created during capture therefore
 * stay valid and are updated by every replay (static outputs); inputs must
 * be written in place (copy_) before a replay (static inputs).
 *
 * Rules while capturing (em_cuda_capturing() is true on this thread):
 * host synchronisation (item, cpu, printing, synchronize, copies to pageable
 * memory) fails loudly through em_cuda_check_not_capturing, naming the op
 * and the Lua line; an allocation made while another stream is current is
 * an error; frees that would call into the driver (graph frees, pinned
 * memory, pool releases) are deferred to the end of the capture. Replays
 * launch on the current stream. No kernels here.
 *
 * Random ops: each graph owns a 16-byte device cell {seed, base}. A random
 * kernel captured here reads its key and first counter from the cell
 * (cell[1] + its offset within the graph, em_cuda_graph_rng_reserve), never
 * a host value baked into the graph. Each replay first reserves the graph's
 * whole range from the host generator (em_rng_reserve) and writes it into
 * the cell with a one-thread kernel on the replay stream: replays draw fresh
 * numbers, the host generator stays the one state (manual_seed, checkpoints,
 * eager ops after a replay never reuse a counter), and replay k draws exactly
 * what the captured ops would have drawn run eagerly at that point.
 *
 * Block counters: the same allocation holds the graph's zeroed counters
 * (counters.cu's contract: zero at each launch, left zero by each kernel),
 * which the kernels captured on the side stream share instead of a memset
 * node each (em_cuda_graph_counters). */
#include <cuda_runtime.h>
#include <vector>
#include <utility>
#include "runtime.h"
#include "backend.h"

struct em_graph {
  int device;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  em_mempool *pool;
  em_stream *side;
  uint64_t *rng_cell;       /* device {seed, base}, then the counters; see the opening comment */
  uint64_t rng_blocks;      /* Philox blocks one replay consumes */
};

namespace {

struct Capture {
  bool active = false;
  int device = -1;
  em_stream *side = nullptr;
  em_stream *prev = nullptr;
  em_mempool *pool = nullptr;
  uint64_t *rng_cell = nullptr;
  uint64_t rng_blocks = 0;
  int *counters = nullptr;  /* in rng_cell's allocation, past the cell */
};

thread_local Capture tl_cap;
thread_local std::vector<std::pair<void (*)(void *), void *>> tl_deferred;
const char *(*callsite_fn)(void) = nullptr;

int ck(cudaError_t e, const char *op, const char *what) {
  if (e == cudaSuccess) return 0;
  cudaGetLastError();
  return em_error("%s: %s failed: %s", op, what, cudaGetErrorString(e));
}

/* Leave capture state on this thread (the CUDA capture itself is ended by the caller). */
void leave_capture() {
  em_capcost_capture_end();
  em_mempool_set_active(nullptr);
  em_stream_set_current(tl_cap.device, tl_cap.prev);
  tl_cap.active = false;
}

void destroy_graph(void *arg) {
  em_graph *g = (em_graph *)arg;
  {
    EmDeviceGuard guard(g->device);
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    cudaGetLastError();
  }
  em_mempool_close(g->pool);
  em_stream_free(g->side);
  if (g->rng_cell) {
    EmDeviceGuard guard(g->device);
    cudaFree(g->rng_cell);
    cudaGetLastError();
  }
  delete g;
}

}  // namespace

/* ---- deferral ---- */

extern "C" void em_cuda_defer(void (*fn)(void *), void *arg) {
  if (tl_cap.active) tl_deferred.emplace_back(fn, arg);
  else fn(arg);
}

extern "C" void em_cuda_run_deferred(void) {
  if (tl_cap.active) return;
  std::vector<std::pair<void (*)(void *), void *>> work;
  work.swap(tl_deferred);
  for (auto &w : work) w.first(w.second);
}

/* ---- capture ---- */

extern "C" bool em_cuda_capturing(void) { return tl_cap.active; }

extern "C" int *em_cuda_graph_counters(void *stream) {
  return tl_cap.active && stream == em_stream_handle(tl_cap.side) ? tl_cap.counters : nullptr;
}

extern "C" const uint64_t *em_cuda_graph_rng_reserve(uint64_t blocks, uint64_t *offset) {
  *offset = 0;
  if (!tl_cap.active) return NULL;
  *offset = tl_cap.rng_blocks;
  tl_cap.rng_blocks += blocks;
  return tl_cap.rng_cell;
}

extern "C" void em_set_callsite_fn(const char *(*fn)(void)) { callsite_fn = fn; }
extern "C" const char *em_callsite(void) {
  const char *s = callsite_fn ? callsite_fn() : NULL;
  return s && *s ? s : "(unknown call site)";
}

extern "C" int em_cuda_check_not_capturing(const char *op) {
  if (!tl_cap.active) return 0;
  return em_error("%s: cannot run during CUDA graph capture (it would synchronise the host), at %s; "
                  "move it out of the captured function (read results after g:replay())", op, em_callsite());
}

extern "C" int em_graph_begin(int device) {
  if (device < 0) device = em_cuda_current_device();
  if (em_cuda_check_device("graph", device)) return -1;
  if (tl_cap.active) return em_error("graph: a CUDA graph capture is already in progress on this thread");
  em_stream *side = em_stream_new(device);
  if (!side) return -1;
  EmDeviceGuard guard(device);
  /* allocated before capture (cudaMalloc is not capturable): the rng cell,
   * then the counters the kernels captured on the side stream share
   * (em_cuda_graph_counters), zeroed here once, before the capture starts
   * waiting on the current stream, so the sync waits for the memset alone */
  uint64_t *cell = nullptr;
  const size_t cell_bytes = 2 * sizeof(uint64_t), cnt_bytes = EM_STREAM_COUNTER_INTS * sizeof(int);
  int rc = ck(cudaMalloc((void **)&cell, cell_bytes + cnt_bytes), "graph", "cudaMalloc");
  if (rc == 0) {
    rc = ck(cudaMemsetAsync((char *)cell + cell_bytes, 0, cnt_bytes, (cudaStream_t)em_stream_handle(side)), "graph",
            "cudaMemsetAsync");
    if (rc == 0) rc = ck(cudaStreamSynchronize((cudaStream_t)em_stream_handle(side)), "graph", "cudaStreamSynchronize");
  }
  /* the captured work must see what was queued before it on the current stream */
  cudaEvent_t ready;
  if (rc == 0) rc = ck(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "graph", "cudaEventCreate");
  if (rc == 0) {
    rc = ck(cudaEventRecord(ready, (cudaStream_t)em_cuda_cur_stream_handle(device)), "graph", "cudaEventRecord");
    if (rc == 0) rc = ck(cudaStreamWaitEvent((cudaStream_t)em_stream_handle(side), ready, 0), "graph", "cudaStreamWaitEvent");
    cudaEventDestroy(ready);
  }
  if (rc) { em_stream_free(side); cudaFree(cell); return -1; }
  tl_cap.rng_cell = cell;
  tl_cap.counters = (int *)((char *)cell + cell_bytes);
  tl_cap.rng_blocks = 0;
  tl_cap.device = device;
  tl_cap.side = side;
  tl_cap.prev = em_stream_current(device);
  tl_cap.pool = em_mempool_new(device, em_stream_handle(side));
  if (ck(cudaStreamBeginCapture((cudaStream_t)em_stream_handle(side), cudaStreamCaptureModeThreadLocal), "graph",
         "cudaStreamBeginCapture")) {
    em_mempool_close(tl_cap.pool);
    em_stream_free(side);
    cudaFree(cell);
    tl_cap = Capture();
    return -1;
  }
  tl_cap.active = true;
  em_capcost_capture_begin();   /* the captured ops keep their declared costs for the replays' roofline */
  em_stream_set_current(device, side);
  em_mempool_set_active(tl_cap.pool);
  return 0;
}

extern "C" em_graph *em_graph_end(void) {
  if (!tl_cap.active) { em_error("graph: no CUDA graph capture is in progress on this thread"); return NULL; }
  Capture cap = tl_cap;
  EmDeviceGuard guard(cap.device);
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture((cudaStream_t)em_stream_handle(cap.side), &graph);
  leave_capture();
  tl_cap = Capture();
  em_graph *g = new em_graph{cap.device, graph, nullptr, cap.pool, cap.side, cap.rng_cell, cap.rng_blocks};
  if (e != cudaSuccess || !graph) {
    cudaGetLastError();
    em_error("graph: the capture failed: %s (an operation in the captured function synchronised the host or "
             "used another stream)", cudaGetErrorString(e));
    destroy_graph(g);
    em_cuda_run_deferred();
    return NULL;
  }
  e = cudaGraphInstantiate(&g->exec, graph, 0);
  if (e != cudaSuccess) {
    ck(e, "graph", "cudaGraphInstantiate");
    g->exec = nullptr;
    destroy_graph(g);
    em_cuda_run_deferred();
    return NULL;
  }
  em_cuda_run_deferred();
  return g;
}

extern "C" int em_graph_replay(em_graph *g) {
  if (!g) return em_error("graph.replay: expected a graph");
  if (tl_cap.active) return em_error("graph.replay: cannot replay a graph during another capture");
  EmDeviceGuard guard(g->device);
  /* an op scope: replays show in op tables and traces, and name the kernels
   * of graphs captured before CUPTI could map their nodes */
  em_op_scope_t scope;
  em_op_scope_enter(&scope, "graph_replay");
  cudaStream_t st = (cudaStream_t)em_cuda_cur_stream_handle(g->device);
  int rc = 0;
  if (g->rng_blocks) rc = em_rng_cell_set_cuda(g->rng_cell, em_rng_seed(), em_rng_reserve(g->rng_blocks), st);
  if (rc == 0) rc = ck(cudaGraphLaunch(g->exec, st), "graph.replay", "cudaGraphLaunch");
  em_op_scope_exit(&scope);
  return rc;
}

extern "C" void em_graph_free(em_graph *g) {
  if (g) em_cuda_defer(destroy_graph, g);
}
