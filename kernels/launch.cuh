/* em_launch<kernel>(dev, grid, block, smem, stream, args...): a kernel launched through the runtime's
 * cudaLaunchKernel (what <<<>>> compiles to) or, with EMBER_CUDA_LAUNCH=driver, through the driver's
 * cuLaunchKernel with the kernel's CUfunction cached per device (issue 16 item 7: an eager op's host time).
 *
 * Why a second way: a tiny op's host time on CUDA is mostly the launch (`a:fill_(1)` 4.49 us from Lua, of
 * which ~0.5 us are Ember's instructions). cudaLaunchKernel finds the kernel's function for the current
 * context from the host stub's address and checks the runtime's state on every call before it reaches
 * the driver; the driver call with a cached handle skips that. tools/launch_cost.cu times both ways (and
 * <<<>>>, parameter sizes, the checks around a launch); the default stays the runtime until it has.
 *
 * Same kernel, same grid, same stream, same parameter bytes: the results are identical either way, a
 * capture records the same node, the profiler sees the launch (CUPTI's driver-domain callback). A driver
 * launch that fails -- no context current on this thread yet, a handle of a reset context, a sticky
 * asynchronous error -- has enqueued nothing and is retried through the runtime, so the error the caller's
 * em_launch_check reports (cudaGetLastError) and its message are the runtime's, as before.
 * The switch is read once, at the first launch through here; an unknown value is an error naming the two. */
#ifndef EMBER_KERNELS_LAUNCH_CUH
#define EMBER_KERNELS_LAUNCH_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <atomic>
#include <utility>
#include "common.cuh"
#include "runtime.h"

namespace emlaunch {

typedef CUresult (*CuLaunchFn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void **, void **);

/* cuLaunchKernel when EMBER_CUDA_LAUNCH=driver, else nullptr (also when the driver has none: the runtime then).
 * *err: -1 with the error set on an unknown value (then every launch through here fails the same way). */
inline CuLaunchFn driver_fn(const char *op, int *err) {
  static int mode = -1;                 /* em_env_choice's: 0 runtime, 1 driver */
  static std::atomic<CuLaunchFn> fn{nullptr};
  *err = 0;
  if (mode < 0) {
    if (em_env_choice(&mode, op, "EMBER_CUDA_LAUNCH", "runtime", "driver") < 0) { *err = -1; return nullptr; }
    if (mode == 1) {
      void *p = nullptr;
      cudaDriverEntryPointQueryResult q;
      if (cudaGetDriverEntryPointByVersion("cuLaunchKernel", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
          q == cudaDriverEntryPointSuccess)
        fn.store((CuLaunchFn)p, std::memory_order_relaxed);
      else
        cudaGetLastError();
    }
  }
  return mode == 1 ? fn.load(std::memory_order_relaxed) : nullptr;
}

/* The kernel's function in device dev's context, found once (dev must be current: the handle belongs to the
 * current context), or nullptr (then the runtime launches it). */
inline CUfunction resolve(std::atomic<CUfunction> *cache, int dev, const void *k) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != dev) { cudaGetLastError(); return nullptr; }
  cudaFunction_t f = nullptr;
  if (cudaGetFuncBySymbol(&f, k) != cudaSuccess || !f) { cudaGetLastError(); return nullptr; }
  cache[dev].store((CUfunction)f, std::memory_order_relaxed);
  return (CUfunction)f;
}

template <typename T> struct Same { typedef T type; };

/* One function cache per kernel (K: the kernel's address), one slot per device. */
template <auto K> struct FnCache { static inline std::atomic<CUfunction> fn[EM_CUDA_MAX_DEVICES]; };

/* args are converted to the kernel's parameter types first: the driver reads each parameter's bytes. */
template <typename... P>
inline int launch(const char *op, std::atomic<CUfunction> *cache, int dev, void (*k)(P...), dim3 g, dim3 b,
                  unsigned smem, cudaStream_t s, typename Same<P>::type... args) {
  void *pp[] = {(void *)&args..., nullptr};
  int err;
  CuLaunchFn cu = driver_fn(op, &err);
  if (err) return -1;
  if (cu && dev >= 0 && dev < EM_CUDA_MAX_DEVICES) {
    CUfunction f = cache[dev].load(std::memory_order_relaxed);
    if (!f) f = resolve(cache, dev, (const void *)k);
    if (f && cu(f, g.x, g.y, g.z, b.x, b.y, b.z, smem, (CUstream)s, pp, nullptr) == CUDA_SUCCESS) return 0;
  }
  cudaLaunchKernel((const void *)k, g, b, pp, smem, s);   /* its error: the caller's em_launch_check */
  return 0;
}

}  // namespace emlaunch

/* K<<<g, b, smem, s>>>(args...) on device dev (current). 0, or -1 with the error set when EMBER_CUDA_LAUNCH
 * is unknown; a launch error is left for em_launch_check(op) as after <<<>>>. */
template <auto K, typename... A>
static inline int em_launch(const char *op, int dev, dim3 g, dim3 b, unsigned smem, cudaStream_t s, A &&...args) {
  return emlaunch::launch(op, emlaunch::FnCache<K>::fn, dev, K, g, b, smem, s, std::forward<A>(args)...);
}

#endif
