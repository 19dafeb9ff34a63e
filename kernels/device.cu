/* CUDA devices: runtime start-up, device queries and selection, the hooks the
 * engine's storage uses (em_cuda in backend.h: the caching allocator and
 * plain synchronous copies for scalar reads), the TF32 switch and the
 * call-site function the binding installs.
 *
 * Queries never fail loudly: a machine with nvcc but no GPU (CI) reports zero
 * devices and every CPU path keeps working. No kernels here. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <atomic>
#include <mutex>
#include "backend.h"
#include "runtime.h"

static int ck(cudaError_t e, const char *op, const char *what) {
  if (e == cudaSuccess) return 0;
  cudaGetLastError();
  return em_error("%s: %s failed: %s", op, what, cudaGetErrorString(e));
}

/* ---- engine hooks: plain copies ordered on the current stream, then waited for ---- */

static int h2d(void *dst, const void *src, size_t n, int device) {
  if (em_cuda_check_not_capturing("copy to device")) return -1;
  EmDeviceGuard g(device);
  cudaStream_t st = (cudaStream_t)em_cuda_cur_stream_handle(device);
  if (ck(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, st), "cuda", "copy to device")) return -1;
  return ck(cudaStreamSynchronize(st), "cuda", "copy to device (synchronize)");
}
static int d2h(void *dst, const void *src, size_t n, int device) {
  if (em_cuda_check_not_capturing("copy to host")) return -1;
  EmDeviceGuard g(device);
  cudaStream_t st = (cudaStream_t)em_cuda_cur_stream_handle(device);
  if (ck(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, st), "cuda", "copy to host")) return -1;
  return ck(cudaStreamSynchronize(st), "cuda", "copy to host (synchronize)");
}
static int d2d(void *dst, const void *src, size_t n, int device) {
  EmDeviceGuard g(device);
  return ck(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, (cudaStream_t)em_cuda_cur_stream_handle(device)),
            "cuda", "device copy");
}

static const em_cuda_backend backend = {em_cuda_caching_alloc, em_cuda_caching_free, h2d, d2h, d2d};

/* ---- start-up ---- */

static std::once_flag init_once;
static std::atomic<int> n_devices{-1};   /* -1 until the runtime was asked */

/* Called on every op's path (alloc, launch checks): after the first call, one acquire load instead of
 * std::call_once (which sets two thread-locals and enters pthread_once each time). */
extern "C" int em_cuda_runtime_init(void) {
  int n = n_devices.load(std::memory_order_acquire);
  if (n >= 0) return n;
  std::call_once(init_once, [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) { cudaGetLastError(); count = 0; }
    if (count > EM_CUDA_MAX_DEVICES) count = EM_CUDA_MAX_DEVICES;
    if (count > 0) em_cuda = &backend;
    n_devices.store(count, std::memory_order_release);
  });
  return n_devices.load(std::memory_order_acquire);
}

extern "C" int em_cuda_compiled(void) { return 1; }
extern "C" int em_cuda_device_count(void) { return em_cuda_runtime_init(); }
extern "C" int em_cuda_available(void) { return em_cuda_runtime_init() > 0; }

extern "C" int em_cuda_check_device(const char *op, int device) {
  int n = em_cuda_runtime_init();
  if (n == 0) return em_error("%s: no CUDA device is available", op);
  if (device < 0 || device >= n)
    return em_error("%s: cuda:%d does not exist (%d CUDA device%s: cuda:0..cuda:%d)", op, device, n,
                    n == 1 ? "" : "s", n - 1);
  return 0;
}

/* ---- devices ---- */

extern "C" int em_cuda_set_device(int device) {
  if (em_cuda_check_device("set_device", device)) return -1;
  return ck(cudaSetDevice(device), "set_device", "cudaSetDevice");
}

extern "C" int em_cuda_current_device(void) {
  if (em_cuda_runtime_init() == 0) return -1;
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) { cudaGetLastError(); return -1; }
  return d;
}

extern "C" int em_cuda_synchronize(int device) {
  if (device < 0) device = em_cuda_current_device();
  if (em_cuda_check_device("synchronize", device)) return -1;
  if (em_cuda_check_not_capturing("synchronize")) return -1;
  EmDeviceGuard g(device);
  return ck(cudaDeviceSynchronize(), "synchronize", "cudaDeviceSynchronize");
}

extern "C" const char *em_cuda_device_name(int device) {
  static char names[EM_CUDA_MAX_DEVICES][256];
  static std::once_flag once[EM_CUDA_MAX_DEVICES];
  if (device < 0) device = em_cuda_current_device();
  if (em_cuda_check_device("device_name", device)) return NULL;
  std::call_once(once[device], [device] {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) == cudaSuccess) snprintf(names[device], sizeof names[device], "%s", p.name);
    else { cudaGetLastError(); snprintf(names[device], sizeof names[device], "cuda:%d", device); }
  });
  return names[device];
}

/* ---- matmul precision ---- */

static bool allow_tf32 = false;
extern "C" void em_cuda_set_allow_tf32(bool on) { allow_tf32 = on; }
extern "C" bool em_cuda_allow_tf32(void) { return allow_tf32; }
