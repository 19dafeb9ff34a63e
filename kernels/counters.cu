/* Zeroed block counters without a memset a call.
 *
 * A kernel that finishes a reduction in its last blocks (rmsnorm's weight
 * gradient: kernels/norm.cu, finish_dw) counts finished blocks in device
 * ints that must be zero at launch. A fresh buffer needs a cudaMemsetAsync
 * before every launch: one more node on the stream, ~1-2 µs of a 5-10 µs
 * kernel at the models' shapes. Instead each (device, stream) gets one
 * buffer, made and zeroed once on that stream, and every kernel that uses it
 * leaves it zero when it ends. Launches on one stream run in order, so no two
 * kernels use a buffer at once. While this thread captures a graph the
 * stream's buffer is not handed out (a replay may run beside eager work on
 * the stream it was captured on): the kernels captured on the capture stream
 * share the graph's own buffer instead (graph.cu, zeroed once before the
 * capture: no memset node a launch, ~1-2 µs of graph time each), which is
 * safe for the same reason, as a graph's capture stream is one chain of
 * kernels and replays of one executable graph never overlap (CUDA orders
 * each launch behind the previous ones). Work captured on any other stream
 * gets NULL (the caller's memset, one node of the graph). Users: rmsnorm's
 * weight gradient
 * and the split rows reductions (kernels/reduce.cu). The buffers are
 * cudaMalloc'ed outside the caching allocator (tiny, never counted as a
 * tensor) and freed when their stream is destroyed (em_stream_counters_drop,
 * from stream.cu: cudaFree waits for the stream's pending kernels). */
#include <cuda_runtime.h>
#include <mutex>
#include <vector>
#include "runtime.h"
#include "ember/cuda.h"

namespace {

struct Slot {
  int device;
  void *stream;
  int *counters;
};

std::mutex mu;
std::vector<Slot> slots;
constexpr size_t kMaxSlots = 256;

}  // namespace

extern "C" int *em_stream_counters(int device, void *stream, int n) {
  if (n < 1 || n > EM_STREAM_COUNTERS) return nullptr;
  if (em_cuda_capturing()) return em_cuda_graph_counters(stream);
  std::lock_guard<std::mutex> lock(mu);
  for (const Slot &s : slots)
    if (s.device == device && s.stream == stream) return s.counters;
  if (slots.size() >= kMaxSlots) return nullptr;
  EmDeviceGuard g(device);
  /* relaxed mode: cudaMalloc is allowed while this thread captures (as alloc.cu's segments) */
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  int *p = nullptr;
  cudaError_t e = cudaMalloc(&p, EM_STREAM_COUNTER_INTS * sizeof(int));
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  if (cudaMemsetAsync(p, 0, EM_STREAM_COUNTER_INTS * sizeof(int), (cudaStream_t)stream) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(p);
    return nullptr;
  }
  slots.push_back(Slot{device, stream, p});
  return p;
}

extern "C" void em_stream_counters_drop(int device, void *stream) {
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < slots.size(); i++)
    if (slots[i].device == device && slots[i].stream == stream) {
      EmDeviceGuard g(device);
      cudaFree(slots[i].counters);
      cudaGetLastError();
      slots[i] = slots.back();
      slots.pop_back();
      return;
    }
}
