/* CUDA device management: device queries, the allocator hook the engine's
 * storage uses, and host<->device copies. Queries never fail loudly: a
 * machine with nvcc but no GPU (CI) reports zero devices and every CPU path
 * keeps working. The caching allocator, streams and op kernels arrive with the
 * CUDA backend issue; until then device memory goes straight to cudaMalloc. */
#include <cuda_runtime.h>
#include <stdio.h>
#include "kernels.h"
#include "internal.h"

static void *cuda_alloc(size_t nbytes, int device) {
  void *p = NULL;
  if (cudaSetDevice(device) != cudaSuccess) {
    em_error("cuda: cannot select device %d", device);
    return NULL;
  }
  cudaError_t e = cudaMalloc(&p, nbytes ? nbytes : 1);
  if (e != cudaSuccess) {
    cudaGetLastError();   /* clear the sticky-free error state */
    em_error_oom("out of memory: cannot allocate %zu bytes on cuda:%d (%s)", nbytes, device, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

static void cuda_free(void *p, int device) {
  cudaSetDevice(device);
  cudaFree(p);
}

static int check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  return em_error("cuda: %s failed: %s", what, cudaGetErrorString(e));
}

static int h2d(void *dst, const void *src, size_t n, int device) {
  cudaSetDevice(device);
  return check(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "copy to device");
}
static int d2h(void *dst, const void *src, size_t n, int device) {
  cudaSetDevice(device);
  return check(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), "copy to host");
}
static int d2d(void *dst, const void *src, size_t n, int device) {
  cudaSetDevice(device);
  return check(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice), "device copy");
}

static const em_cuda_backend backend = {cuda_alloc, cuda_free, h2d, d2h, d2d};

extern "C" int em_cuda_compiled(void) { return 1; }

extern "C" int em_cuda_device_count(void) {
  static int count = -1;
  if (count < 0) {
    if (cudaGetDeviceCount(&count) != cudaSuccess) { cudaGetLastError(); count = 0; }
    if (count > 0) em_cuda = &backend;
  }
  return count;
}

extern "C" int em_cuda_available(void) { return em_cuda_device_count() > 0; }

/* Contiguous same-dtype copies between host and device; conversions are
 * staged through the host (the GPU conversion kernels come with the backend). */
extern "C" int em_copy_cuda(em_tensor *dst, em_tensor *src) {
  if (!em_cuda_available()) return em_error("copy_: no CUDA device is available");
  size_t n = (size_t)em_numel(dst) * em_dtype_size(dst->dtype);
  bool plain = dst->dtype == src->dtype && em_is_contiguous(dst) && em_is_contiguous(src) && em_same_shape(dst, src);
  if (plain) {
    if (dst->device.type == EM_CUDA && src->device.type == EM_CPU) return h2d(em_data_ptr(dst), em_data_ptr(src), n, dst->device.index);
    if (dst->device.type == EM_CPU && src->device.type == EM_CUDA) return d2h(em_data_ptr(dst), em_data_ptr(src), n, src->device.index);
    if (dst->device.type == EM_CUDA && src->device.type == EM_CUDA) return d2d(em_data_ptr(dst), em_data_ptr(src), n, dst->device.index);
  }
  /* stage: bring src to host in dst's dtype and shape, then upload */
  if (dst->device.type == EM_CUDA && src->device.type == EM_CPU && em_is_contiguous(dst)) {
    em_tensor *h = em_empty(dst->ndim, dst->shape, dst->dtype, em_cpu());
    if (!h) return -1;
    int rc = em_copy_(h, src);
    if (rc == 0) rc = h2d(em_data_ptr(dst), em_data_ptr(h), n, dst->device.index);
    em_tensor_release(h);
    return rc;
  }
  if (dst->device.type == EM_CPU && src->device.type == EM_CUDA && em_is_contiguous(src)) {
    em_tensor *h = em_empty(src->ndim, src->shape, src->dtype, em_cpu());
    if (!h) return -1;
    int rc = d2h(em_data_ptr(h), em_data_ptr(src), (size_t)em_numel(src) * em_dtype_size(src->dtype), src->device.index);
    if (rc == 0) rc = em_copy_(dst, h);
    em_tensor_release(h);
    return rc;
  }
  return em_error_device("copy_", dst);
}

extern "C" int em_fill_cuda(em_tensor *dst, double v) {
  /* until the elementwise kernels land: fill on the host and upload */
  if (!em_is_contiguous(dst)) return em_error_device("fill_", dst);
  em_tensor *h = em_full(dst->ndim, dst->shape, v, dst->dtype, em_cpu());
  if (!h) return -1;
  int rc = h2d(em_data_ptr(dst), em_data_ptr(h), (size_t)em_numel(dst) * em_dtype_size(dst->dtype), dst->device.index);
  em_tensor_release(h);
  return rc;
}
