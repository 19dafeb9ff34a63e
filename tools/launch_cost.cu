/* launch_cost: what one CUDA launch costs the host, each way, and what Ember's own C path costs around it
 * (issue 16 item 7: an eager op under 5 us of host time).
 *
 * bench_dispatch.lua times a whole op from Lua (`a:fill_(1)` 4.49 us on the H200 host, of which Ember's
 * own instructions are ~1600, ~0.5 us): the rest is the launch and the runtime calls around it. This
 * program times those pieces alone, with bench_dispatch's protocol: a sample is K calls issued after a
 * device synchronisation, the clock stopped without waiting for the GPU (K below the launch queue's
 * depth, so the figure is the host's cost), the median of S samples divided by K. Rows:
 *   - runtime queries an op path makes: cudaGetDevice, cudaSetDevice to the current device,
 *     cudaGetLastError, cudaPeekAtLastError, cudaStreamIsCapturing;
 *   - an empty kernel launched each way: <<<>>>, cudaLaunchKernel, cudaLaunchKernelExC, the driver's
 *     cuLaunchKernel with a cached CUfunction (cudaGetFuncBySymbol) or CUkernel (cudaGetKernel);
 *   - on the legacy default stream (Ember's and PyTorch's default), cudaStreamPerThread, a created
 *     non-blocking stream;
 *   - by parameter bytes: 8, 128, 464 (Ember's EwArgs, every elementwise launch), 1024, 4096;
 *   - a launch with what Ember adds around it: the cudaGetLastError check, em_use_device's
 *     cudaGetDevice, EmDeviceGuard's two; a cudaMemsetAsync; a cudaEventRecord;
 *   - Ember's C path without Lua (ember_engine linked): em_fill_, in-place add, add (allocates and
 *     frees), empty + release (headers and the allocator), the caching allocator's alloc + free alone,
 *     mul recorded for autograd -- on 1-element f32
 *     tensors, in both launch modes (EMBER_CUDA_LAUNCH=runtime here, then =driver in a child run of this
 *     program: the switch is read once a process).
 * What it should show: the difference between rows, e.g. "<<<>>> + check" minus "<<<>>>" is the check.
 *   cmake --build build --target launch_cost && build/launch_cost [K] [S]       (defaults 256 400)
 * One GPU, ~10 s. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>
#include "ember/ember.h"

template <int P> struct Blob { unsigned char b[P]; };

__global__ void empty_kernel() {}
template <int P> __global__ void param_kernel(Blob<P> p) {
  if (threadIdx.x == 1000) ((volatile unsigned char *)nullptr)[0] = p.b[P - 1];   /* keeps the parameter */
}

static int K = 256, S = 400;

static double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void must(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "launch_cost: %s failed: %s\n", what, cudaGetErrorString(e));
  exit(1);
}

/* Median and minimum over S samples of K calls of f, in us a call. */
template <typename F> static void row(const char *what, F &&f) {
  for (int i = 0; i < K; i++) f();   /* warm */
  must(cudaDeviceSynchronize(), what);
  std::vector<double> t(S);
  for (int s = 0; s < S; s++) {
    must(cudaDeviceSynchronize(), what);
    double t0 = now_s();
    for (int i = 0; i < K; i++) f();
    t[s] = (now_s() - t0) / K * 1e6;
  }
  must(cudaDeviceSynchronize(), what);
  std::sort(t.begin(), t.end());
  printf("%-58s %7.3f %7.3f\n", what, t[S / 2], t[0]);
}

/* kernels/runtime.h's caching allocator (in ember_engine), for the allocator-alone row */
extern "C" void *em_cuda_caching_alloc(size_t nbytes, int device);
extern "C" void em_cuda_caching_free(void *p, int device);

typedef CUresult (*LaunchFn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);

static void ember_rows(const char *mode) {
  setenv("EMBER_CUDA_LAUNCH", mode, 1);   /* read at the first launch of the process: one mode per run */
  em_device dev = {EM_CUDA, 0};
  int64_t one = 1;
  if (!em_cuda_available()) { fprintf(stderr, "launch_cost: Ember sees no CUDA device\n"); exit(1); }
  em_tensor *a = em_full(1, &one, 1.0, EM_F32, dev), *b = em_full(1, &one, 1.0, EM_F32, dev);
  em_tensor *w = em_full(1, &one, 1.0, EM_F32, dev);
  if (!a || !b || !w) { fprintf(stderr, "launch_cost: %s\n", em_last_error()); exit(1); }
  w->requires_grad = true;
  char name[96];
  auto check = [](int rc) { if (rc) { fprintf(stderr, "launch_cost: %s\n", em_last_error()); exit(1); } };
  auto keep = [](em_tensor *t) { if (!t) { fprintf(stderr, "launch_cost: %s\n", em_last_error()); exit(1); }
                                 em_tensor_release(t); };
  snprintf(name, sizeof name, "ember C: em_fill_ (a launch alone)          [%s]", mode);
  row(name, [&] { check(em_fill_(a, 1.0)); });
  snprintf(name, sizeof name, "ember C: add in place (a:add_(b))           [%s]", mode);
  row(name, [&] { keep(em_binary(EM_ADD, a, b, a)); });   /* out == a: a's reference, retained */
  snprintf(name, sizeof name, "ember C: add, result released (a + b)       [%s]", mode);
  row(name, [&] { keep(em_add(a, b)); });
  snprintf(name, sizeof name, "ember C: mul recorded, released (a * w)     [%s]", mode);
  row(name, [&] { keep(em_mul(a, w)); });
  snprintf(name, sizeof name, "ember C: empty(1) + release (allocator)     [%s]", mode);
  row(name, [&] { keep(em_empty(1, &one, EM_F32, dev)); });
  snprintf(name, sizeof name, "ember C: caching allocator alloc + free 4 B  [%s]", mode);
  row(name, [&] { em_cuda_caching_free(em_cuda_caching_alloc(4, 0), 0); });
  em_tensor_release(a);
  em_tensor_release(b);
  em_tensor_release(w);
}

int main(int argc, char **argv) {
  if (argc > 1) K = atoi(argv[1]);
  if (argc > 2) S = atoi(argv[2]);
  const bool ember_only = argc > 3 && strcmp(argv[3], "ember-driver") == 0;   /* the child run */
  if (K < 1 || S < 1) { fprintf(stderr, "usage: launch_cost [K calls a sample] [S samples]\n"); return 2; }
  must(cudaSetDevice(0), "cudaSetDevice");
  must(cudaFree(0), "context creation");
  if (ember_only) { ember_rows("driver"); return 0; }
  cudaDeviceProp p;
  must(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  printf("launch_cost: %s, driver %d, runtime %d, %d calls a sample, %d samples\n", p.name, drv, rt, K, S);
  printf("%-58s %7s %7s\n", "us a call (host)", "median", "min");

  LaunchFn cu_launch = nullptr;
  cudaDriverEntryPointQueryResult q;
  must(cudaGetDriverEntryPointByVersion("cuLaunchKernel", (void **)&cu_launch, 12000, cudaEnableDefault, &q),
       "cudaGetDriverEntryPointByVersion(cuLaunchKernel)");
  if (!cu_launch || q != cudaDriverEntryPointSuccess) { fprintf(stderr, "launch_cost: no cuLaunchKernel\n"); return 1; }
  cudaFunction_t fn;
  must(cudaGetFuncBySymbol(&fn, (const void *)empty_kernel), "cudaGetFuncBySymbol");
  cudaKernel_t kern;
  must(cudaGetKernel(&kern, (const void *)empty_kernel), "cudaGetKernel");
  cudaStream_t nb, legacy = 0;
  must(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t ev;
  must(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  void *dbuf;
  must(cudaMalloc(&dbuf, 4096), "cudaMalloc");

  /* runtime queries */
  int d = 0;
  cudaStreamCaptureStatus cs;
  row("cudaGetDevice", [&] { cudaGetDevice(&d); });
  row("cudaSetDevice (already current)", [&] { cudaSetDevice(0); });
  row("cudaGetLastError", [&] { cudaGetLastError(); });
  row("cudaPeekAtLastError", [&] { cudaPeekAtLastError(); });
  row("cudaStreamIsCapturing (legacy stream)", [&] { cudaStreamIsCapturing(legacy, &cs); });

  /* an empty kernel, each way, legacy default stream */
  row("empty kernel <<<1, 128>>>", [&] { empty_kernel<<<1, 128, 0, legacy>>>(); });
  row("empty kernel cudaLaunchKernel", [&] {
    cudaLaunchKernel((const void *)empty_kernel, dim3(1), dim3(128), nullptr, 0, legacy);
  });
  row("empty kernel cudaLaunchKernelExC", [&] {
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(1); c.blockDim = dim3(128); c.stream = legacy;
    cudaLaunchKernelExC(&c, (const void *)empty_kernel, nullptr);
  });
  row("empty kernel cuLaunchKernel (cached CUfunction)", [&] {
    cu_launch((CUfunction)fn, 1, 1, 1, 128, 1, 1, 0, (CUstream)legacy, nullptr, nullptr);
  });
  row("empty kernel cuLaunchKernel (CUkernel)", [&] {
    cu_launch((CUfunction)kern, 1, 1, 1, 128, 1, 1, 0, (CUstream)legacy, nullptr, nullptr);
  });

  /* streams */
  row("empty kernel <<<>>> on cudaStreamPerThread", [&] { empty_kernel<<<1, 128, 0, cudaStreamPerThread>>>(); });
  row("empty kernel <<<>>> on a non-blocking stream", [&] { empty_kernel<<<1, 128, 0, nb>>>(); });
  row("empty kernel cuLaunchKernel on a non-blocking stream", [&] {
    cu_launch((CUfunction)fn, 1, 1, 1, 128, 1, 1, 0, (CUstream)nb, nullptr, nullptr);
  });

  /* parameter bytes */
  Blob<8> p8 = {}; Blob<128> p128 = {}; Blob<464> p464 = {}; Blob<1024> p1k = {}; Blob<4096> p4k = {};
  row("<<<>>> with 8 parameter bytes", [&] { param_kernel<8><<<1, 128, 0, legacy>>>(p8); });
  row("<<<>>> with 128 parameter bytes", [&] { param_kernel<128><<<1, 128, 0, legacy>>>(p128); });
  row("<<<>>> with 464 parameter bytes (EwArgs)", [&] { param_kernel<464><<<1, 128, 0, legacy>>>(p464); });
  row("<<<>>> with 1024 parameter bytes", [&] { param_kernel<1024><<<1, 128, 0, legacy>>>(p1k); });
  row("<<<>>> with 4096 parameter bytes", [&] { param_kernel<4096><<<1, 128, 0, legacy>>>(p4k); });
  cudaFunction_t f464;
  must(cudaGetFuncBySymbol(&f464, (const void *)param_kernel<464>), "cudaGetFuncBySymbol");
  row("cuLaunchKernel with 464 parameter bytes", [&] {
    void *pp[] = {&p464};
    cu_launch((CUfunction)f464, 1, 1, 1, 128, 1, 1, 0, (CUstream)legacy, pp, nullptr);
  });

  /* what an Ember launch adds around it */
  row("<<<>>> + cudaGetLastError (em_launch_check)", [&] {
    empty_kernel<<<1, 128, 0, legacy>>>();
    cudaGetLastError();
  });
  row("cudaGetDevice + <<<>>> + cudaGetLastError (elementwise)", [&] {
    cudaGetDevice(&d);
    empty_kernel<<<1, 128, 0, legacy>>>();
    cudaGetLastError();
  });
  row("2 cudaGetDevice + <<<>>> + cudaGetLastError (fill_)", [&] {
    cudaGetDevice(&d);
    empty_kernel<<<1, 128, 0, legacy>>>();
    cudaGetLastError();
    cudaGetDevice(&d);
  });
  row("cudaMemsetAsync 4 bytes", [&] { cudaMemsetAsync(dbuf, 0, 4, legacy); });
  row("cudaEventRecord (no timing)", [&] { cudaEventRecord(ev, legacy); });

  /* Ember's C path (one mode a process: the switch is read once), the driver's in a child run */
  ember_rows("runtime");
  fflush(stdout);
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' %d %d ember-driver", argv[0], K, S);
  if (system(cmd) != 0) fprintf(stderr, "launch_cost: the driver-mode run failed: %s\n", cmd);

  cudaFree(dbuf);
  cudaEventDestroy(ev);
  cudaStreamDestroy(nb);
  return 0;
}
