/* Internal interfaces between the pieces of Ember's CUDA runtime
 * (device.cu, alloc.cu, stream.cu, graph.cu, copy.cu, rng.cu). Not public:
 * the public contract is ember/cuda.h, the engine's is engine/backend/backend.h. */
#ifndef EMBER_KERNELS_RUNTIME_H
#define EMBER_KERNELS_RUNTIME_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EM_CUDA_MAX_DEVICES 64

/* ---- device.cu ---- */
/* Make sure the CUDA runtime is initialised and the engine's em_cuda hooks
 * point at it. Returns the device count (0 without a GPU). */
int em_cuda_runtime_init(void);
/* 0, or -1 with "op: cuda:N does not exist (K devices)". */
int em_cuda_check_device(const char *op, int device);

/* ---- alloc.cu: the caching allocator ---- */
void *em_cuda_caching_alloc(size_t nbytes, int device);
void em_cuda_caching_free(void *p, int device);
/* A private pool (graph capture): while one is active on this thread for a
 * device, every allocation on that device must be made on `stream` and comes
 * from the pool. */
typedef struct em_mempool em_mempool;
em_mempool *em_mempool_new(int device, void *stream);
void em_mempool_set_active(em_mempool *p);        /* NULL: none (this thread) */
/* The owner lets go: segments are returned once every block is free. */
void em_mempool_close(em_mempool *p);

/* ---- stream.cu: em_cuda_cur_stream_handle (backend.h) ---- */

/* ---- counters.cu ---- */
/* n <= EM_STREAM_COUNTERS ints, zero at the next launch on `stream` (a
 * cudaStream_t) of `device`, for kernels that leave them zero when they end
 * (block counters of last-block-done reductions); NULL when none can be had
 * (then use a fresh buffer and a memset). Made once per stream. While this
 * thread captures a graph: the graph's own buffer (em_cuda_graph_counters)
 * for its capture stream, NULL for any other. Past the EM_STREAM_COUNTERS
 * ints lies one 64-bit ticket word (at int offset EM_STREAM_TICKET, 8-byte
 * aligned) whose low 32 bits are zero between kernels and whose high 32
 * bits are a generation any kernel may advance (rmsnorm's finish_dw). */
#define EM_STREAM_COUNTERS 1024
#define EM_STREAM_TICKET EM_STREAM_COUNTERS
#define EM_STREAM_COUNTER_INTS (EM_STREAM_COUNTERS + 2)
int *em_stream_counters(int device, void *stream, int n);
/* The stream is being destroyed: free its counters (waits for its kernels). */
void em_stream_counters_drop(int device, void *stream);

/* ---- graph.cu ---- */
/* Run fn(arg) now, or after the capture when this thread is capturing (host
 * frees and destroys that would break a capture: cudaFreeHost, graph frees). */
void em_cuda_defer(void (*fn)(void *), void *arg);
void em_cuda_run_deferred(void);
/* The capture's zeroed counters (EM_STREAM_COUNTER_INTS ints, the contract of
 * em_stream_counters) when this thread captures on `stream`, else NULL. */
int *em_cuda_graph_counters(void *stream);

/* ---- rng.cu ---- */
/* cell[0] = seed, cell[1] = base, launched on `stream` (a cudaStream_t):
 * a graph's Philox cell set before a replay. */
int em_rng_cell_set_cuda(uint64_t *cell, uint64_t seed, uint64_t base, void *stream);

#ifdef __cplusplus
}

#include <cuda_runtime.h>
/* Select a device for a scope and restore the previous one after. */
struct EmDeviceGuard {
  int prev = -1;
  explicit EmDeviceGuard(int device) {
    if (cudaGetDevice(&prev) != cudaSuccess) { cudaGetLastError(); prev = -1; }
    if (prev != device) cudaSetDevice(device);
  }
  ~EmDeviceGuard() {
    int now = -1;
    if (prev >= 0 && cudaGetDevice(&now) == cudaSuccess && now != prev) cudaSetDevice(prev);
  }
};
#endif
#endif
