/* Copies, conversions and fills for CUDA tensors.
 *
 * What it computes: dst = convert(src broadcast to dst's shape) for any
 * strides and any pair of the 9 dtypes, bit for bit the CPU's conversions
 * (convert.cuh); fill of any strides; host<->device and device<->device
 * transfers. 0 FLOPs; bytes per element = sizeof(src) + sizeof(dst).
 * Launch: 256 threads, grid-stride. Three paths: contiguous and 16-byte
 * aligned -> two 128-bit loads of src per thread step, converted in registers,
 * stored as wide as dst allows (the common cast, e.g. f32 -> bf16 for
 * autocast); strided -> dims coalesced on the host first (a transpose is two
 * dims), one element per thread, 32-bit index division; beyond 2^31
 * elements one generic kernel with run-time dtypes.
 *
 * Transfers: contiguous same-dtype bytes move with one cudaMemcpyAsync on the
 * current stream; anything else is staged: the host side is made contiguous
 * (in its own dtype) on the host, and every conversion, broadcast and
 * scatter runs on the device. Copies to the host wait for the stream; copies
 * from pageable host memory return once the driver has staged the bytes.
 * With em_copy_nonblocking_ and a pinned contiguous host side nothing waits:
 * the caller synchronises before reading (PyTorch's non_blocking=True). */
#include <cuda_runtime.h>
#include <stdio.h>
#include "backend.h"
#include "common.cuh"
#include "convert.cuh"
#include "launch.cuh"
#include "runtime.h"

static thread_local bool tl_nonblocking = false;

static int ck(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 0;
  cudaGetLastError();
  return em_error("copy_: %s failed: %s", what, cudaGetErrorString(e));
}

static size_t nbytes_of(const em_tensor *t) { return (size_t)em_numel(t) * em_dtype_size(t->dtype); }
static bool is_pinned_host(const em_tensor *t) {
  return t->device.type == EM_CPU && (t->storage->flags & EM_STORAGE_PINNED);
}

/* ---------------- kernels ---------------- */

__host__ __device__ constexpr bool is_float_dt(int dt) {
  return dt == EM_F32 || dt == EM_F64 || dt == EM_BF16 || dt == EM_F16;
}
__host__ __device__ constexpr int dt_size(int dt) {
  return dt == EM_F64 || dt == EM_I64 ? 8 : dt == EM_F32 || dt == EM_I32 ? 4 : dt == EM_U8 || dt == EM_BOOL ? 1 : 2;
}

/* dst[o0] = convert(src[o1]): through int64 between integer types, else double (as the CPU). */
template <int DD, int SD>
__device__ __forceinline__ void convert_one(void *dst, int64_t o0, const void *src, int64_t o1) {
  if (!is_float_dt(DD) && !is_float_dt(SD)) em_dev_store_i64<DD>(dst, o0, em_dev_load_i64<SD>(src, o1));
  else em_dev_store_f64<DD>(dst, o0, em_dev_load_f64<SD>(src, o1));
}

/* Strided, fewer than 2^31 elements. */
template <int DD, int SD>
__global__ void convert_kernel(void *dst, const void *src, em_geom g, uint32_t n) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    int64_t o0, o1;
    em_geom_offsets<uint32_t>(g, i, o0, o1);
    convert_one<DD, SD>(dst, o0, src, o1);
  }
}

/* Contiguous, src 16-byte aligned, dst aligned to its vector: V elements per
 * vector, two vectors (v and v + grid) loaded before either is converted, so
 * a thread keeps 32 bytes of reads in flight (one vector left ~32 KB an SM,
 * half of what the elementwise kernels keep). */
template <int DD, int SD>
__device__ __forceinline__ void convert_store(void *dst, int64_t v, const uint4 &in) {
  constexpr int V = 16 / dt_size(SD), DB = V * dt_size(DD);   /* elements, dst bytes per vector */
  alignas(16) unsigned char out[DB];
#pragma unroll
  for (int k = 0; k < V; k++) convert_one<DD, SD>(out, k, &in, k);
  if constexpr (DB >= 16) {
#pragma unroll
    for (int c = 0; c < DB / 16; c++) ((uint4 *)dst)[v * (DB / 16) + c] = ((const uint4 *)out)[c];
  } else if constexpr (DB == 8) {
    ((uint2 *)dst)[v] = *(const uint2 *)out;
  } else if constexpr (DB == 4) {
    ((uint32_t *)dst)[v] = *(const uint32_t *)out;
  } else {
    ((uint16_t *)dst)[v] = *(const uint16_t *)out;
  }
}

template <int DD, int SD>
__global__ void convert_contig_kernel(void *dst, const void *src, int64_t n) {
  constexpr int V = 16 / dt_size(SD);
  int64_t nvec = n / V, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nvec; v += 2 * stride) {
    const bool two = v + stride < nvec;
    const uint4 in0 = ((const uint4 *)src)[v];
    const uint4 in1 = two ? ((const uint4 *)src)[v + stride] : make_uint4(0, 0, 0, 0);
    convert_store<DD, SD>(dst, v, in0);
    if (two) convert_store<DD, SD>(dst, v + stride, in1);
  }
  for (int64_t i = nvec * V + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    convert_one<DD, SD>(dst, i, src, i);   /* the tail */
}

/* Widening casts (dst wider than src: bf16/f16 -> f32, f32 -> f64, u8 -> f32, ...): one 16-byte store of
 * dst per lane, so a warp's store instruction covers 512 contiguous bytes (the kernel above stores 32 bytes
 * a thread as two 16-byte halves 32 bytes apart: each store instruction half-fills 32 sectors, and bf16 ->
 * f32 ran at 53-59 % of the H200's bandwidth where f32 -> bf16 reached 85-90 %). A vector is SB = 16 x
 * sizeof(src) / sizeof(dst) bytes of src (8 for bf16 -> f32), loaded as one 2/4/8-byte word; kWideU vectors a
 * thread, all loads issued before the first store (32 bytes of src in flight a thread for bf16 -> f32: 64 KB
 * an SM at 2048 threads). Block b takes vectors [b kWideU 256, (b + 1) kWideU 256), striped by lane
 * (coalesced loads and stores); the last partial chunk is guarded per vector, the tail past the last whole
 * vector is scalar. EMBER_CAST_WIDE=0 selects convert_contig_kernel again. */
constexpr int kWideU = 4, kWideThreads = 256;
template <int SB> struct WordOf;
template <> struct WordOf<2> { typedef uint16_t T; };
template <> struct WordOf<4> { typedef uint32_t T; };
template <> struct WordOf<8> { typedef uint2 T; };
template <int DD, int SD>
__global__ void __launch_bounds__(kWideThreads) convert_wide_kernel(void *dst, const void *src, int64_t n) {
  constexpr int V = 16 / dt_size(DD), SB = V * dt_size(SD);   /* elements a vector, src bytes a vector */
  typedef typename WordOf<SB>::T W;
  const int64_t nvec = n / V, chunk = (int64_t)kWideU * kWideThreads;
  for (int64_t c0 = (int64_t)blockIdx.x * chunk; c0 < nvec; c0 += (int64_t)gridDim.x * chunk) {
    W in[kWideU];
#pragma unroll
    for (int u = 0; u < kWideU; u++) {
      const int64_t v = c0 + u * kWideThreads + threadIdx.x;
      if (v < nvec) in[u] = ((const W *)src)[v];
    }
#pragma unroll
    for (int u = 0; u < kWideU; u++) {
      const int64_t v = c0 + u * kWideThreads + threadIdx.x;
      if (v >= nvec) break;
      uint4 out;
#pragma unroll
      for (int k = 0; k < V; k++) convert_one<DD, SD>(&out, k, &in[u], k);
      ((uint4 *)dst)[v] = out;
    }
  }
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = nvec * V + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    convert_one<DD, SD>(dst, i, src, i);   /* the tail */
}

/* Anything beyond 2^31 elements: one kernel, dtypes chosen at run time. */
template <int DD>
__device__ __forceinline__ void convert_rt_src(void *dst, int64_t o0, const void *src, int64_t o1, int sd) {
  EM_DTYPE_CASES(sd, SD, convert_one<DD, SD>(dst, o0, src, o1))
}
__global__ void convert_kernel_any(void *dst, int dd, const void *src, int sd, em_geom g, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t o0, o1;
    em_geom_offsets<int64_t>(g, i, o0, o1);
    EM_DTYPE_CASES(dd, DD, convert_rt_src<DD>(dst, o0, src, o1, sd))
  }
}

/* Same dtype: move the bit pattern (NaN payloads included). */
template <typename W, typename IDX>
__global__ void move_kernel(W *dst, const W *src, em_geom g, IDX n) {
  for (IDX i = (IDX)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (IDX)gridDim.x * blockDim.x) {
    int64_t o0, o1;
    em_geom_offsets<IDX>(g, i, o0, o1);
    dst[o0] = src[o1];
  }
}

/* Contiguous fill, dst 16-byte aligned: one 128-bit store per step, then the tail. */
template <typename W>
__global__ void fill_contig_kernel(W *dst, W v, int64_t n) {
  constexpr int V = 16 / sizeof(W);
  Packed128<W> p;
#pragma unroll
  for (int k = 0; k < V; k++) p[k] = v;
  int64_t nvec = n / V, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) store128(dst + i * V, p);
  for (int64_t i = nvec * V + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = v;
}

template <typename W, typename IDX>
__global__ void fill_kernel(W *dst, W v, em_geom g, IDX n) {
  for (IDX i = (IDX)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (IDX)gridDim.x * blockDim.x) {
    int64_t o0, o1;
    em_geom_offsets<IDX>(g, i, o0, o1);
    dst[o0] = v;
  }
}

template <typename W>
static void launch_move(void *dst, const void *src, const em_geom &g, int64_t n, cudaStream_t st) {
  unsigned grid = em_grid(n, 256);
  if (n <= INT32_MAX) move_kernel<W, uint32_t><<<grid, 256, 0, st>>>((W *)dst, (const W *)src, g, (uint32_t)n);
  else move_kernel<W, int64_t><<<grid, 256, 0, st>>>((W *)dst, (const W *)src, g, n);
}

/* fill_ with a value (zeros go to cudaMemsetAsync): through em_launch (launch.cuh), a launch alone. */
template <typename W>
static int launch_fill(int dev, void *dst, uint64_t bits, const em_geom &g, int64_t n, cudaStream_t st) {
  W v;
  memcpy(&v, &bits, sizeof v);
  if (g.ndim == 1 && g.stride[0][0] == 1 && (uintptr_t)dst % 16 == 0)
    return em_launch<fill_contig_kernel<W>>("fill_", dev, em_grid((n + 15) / 16, 256), 256, 0, st, (W *)dst, v, n);
  unsigned grid = em_grid(n, 256);
  if (n <= INT32_MAX)
    return em_launch<fill_kernel<W, uint32_t>>("fill_", dev, grid, 256, 0, st, (W *)dst, v, g, (uint32_t)n);
  return em_launch<fill_kernel<W, int64_t>>("fill_", dev, grid, 256, 0, st, (W *)dst, v, g, n);
}

/* contig: dst and src contiguous with the same shape (no broadcast). */
template <int DD, int SD>
static void launch_convert(void *dst, const void *src, const em_geom &g, int64_t n, bool contig, cudaStream_t st) {
  constexpr int V = 16 / dt_size(SD), DB = V * dt_size(DD);
  if constexpr (DB > 16) {   /* widening: 16-byte dst vectors, src aligned to its SB-byte word */
    static const bool wide = em_env_switch("EMBER_CAST_WIDE", true);
    constexpr int SB = 16 * dt_size(SD) / dt_size(DD);
    if (wide && contig && (uintptr_t)src % SB == 0 && (uintptr_t)dst % 16 == 0) {
      const int64_t chunks = (n / (16 / dt_size(DD)) + kWideU * kWideThreads - 1) / (kWideU * kWideThreads);
      const unsigned grid = (unsigned)(chunks < 1 ? 1 : chunks > 65535LL * 32 ? 65535LL * 32 : chunks);
      convert_wide_kernel<DD, SD><<<grid, kWideThreads, 0, st>>>(dst, src, n);
      return;
    }
  }
  if (contig && (uintptr_t)src % 16 == 0 && (uintptr_t)dst % (DB < 16 ? DB : 16) == 0) {
    convert_contig_kernel<DD, SD><<<em_grid((n / V + 1) / 2 > 0 ? (n / V + 1) / 2 : 1, 256), 256, 0, st>>>(dst, src, n);
    return;
  }
  if (n <= INT32_MAX) convert_kernel<DD, SD><<<em_grid(n, 256), 256, 0, st>>>(dst, src, g, (uint32_t)n);
  else convert_kernel_any<<<em_grid(n, 256), 256, 0, st>>>(dst, DD, src, SD, g, n);
}

/* ---------------- same device ---------------- */

extern "C" int em_copy_device_cuda(em_tensor *dst, const em_tensor *src) {
  int64_t n = em_numel(dst);
  if (n == 0) return 0;
  EmDeviceGuard guard(dst->device.index);
  cudaStream_t st = (cudaStream_t)em_cuda_cur_stream_handle(dst->device.index);
  if (dst->dtype == src->dtype && em_is_contiguous(dst) && em_is_contiguous(src) && em_same_shape(dst, src))
    return ck(cudaMemcpyAsync(em_data_ptr(dst), em_data_ptr(src), nbytes_of(dst), cudaMemcpyDeviceToDevice, st),
              "device copy");
  int64_t sstride[EM_MAX_DIMS];
  em_broadcast_strides(src, dst->ndim, dst->shape, sstride);
  em_geom g = em_geom_make(dst->ndim, dst->shape, dst->stride, sstride);
  void *d = em_data_ptr(dst);
  const void *s = em_data_ptr(src);
  if (dst->dtype == src->dtype) {
    switch (em_dtype_size(dst->dtype)) {
      case 1: launch_move<uint8_t>(d, s, g, n, st); break;
      case 2: launch_move<uint16_t>(d, s, g, n, st); break;
      case 4: launch_move<uint32_t>(d, s, g, n, st); break;
      default: launch_move<uint64_t>(d, s, g, n, st); break;
    }
  } else {
    bool contig = em_is_contiguous(dst) && em_is_contiguous(src) && em_same_shape(dst, src);
    EM_DTYPE_CASES(dst->dtype, DD, EM_DTYPE_CASES(src->dtype, SD, launch_convert<DD, SD>(d, s, g, n, contig, st)))
  }
  return em_launch_check("copy_");
}

/* A contiguous device tensor of dst's shape and dtype holding src (retained
 * when src already is one). On src's device. */
static em_tensor *device_contiguous_like(const em_tensor *dst, em_tensor *src) {
  if (src->dtype == dst->dtype && em_is_contiguous(src) && em_same_shape(src, dst)) return em_tensor_retain(src);
  em_tensor *t = em_empty(dst->ndim, dst->shape, dst->dtype, src->device);
  if (t && em_copy_device_cuda(t, src)) { em_tensor_release(t); return NULL; }
  return t;
}

/* ---------------- host -> device ---------------- */

static int copy_h2d(em_tensor *dst, em_tensor *src, bool nb) {
  int dev = dst->device.index;
  EmDeviceGuard guard(dev);
  cudaStream_t st = (cudaStream_t)em_cuda_cur_stream_handle(dev);
  em_tensor *h = NULL;
  if (!em_is_contiguous(src)) {          /* gather on the host, in src's dtype and shape */
    nb = false;                          /* the pageable staging buffer dies at return */
    h = em_empty(src->ndim, src->shape, src->dtype, em_cpu());
    if (!h) return -1;
    bool g = em_set_grad_enabled(false);
    int rc = em_copy_(h, src);
    em_set_grad_enabled(g);
    if (rc) { em_tensor_release(h); return -1; }
  } else {
    h = em_tensor_retain(src);
  }
  bool async = nb && is_pinned_host(h);
  int rc = 0;
  if (!async && em_cuda_check_not_capturing("copy_ (host to device)")) rc = -1;
  em_tensor *d = NULL;
  if (rc == 0) {
    bool direct = em_is_contiguous(dst) && dst->dtype == h->dtype && em_same_shape(dst, h);
    d = direct ? em_tensor_retain(dst) : em_empty(h->ndim, h->shape, h->dtype, dst->device);
    if (!d) rc = -1;
  }
  if (rc == 0) rc = ck(cudaMemcpyAsync(em_data_ptr(d), em_data_ptr(h), nbytes_of(h), cudaMemcpyHostToDevice, st),
                       "copy to device");
  /* pinned memory without non_blocking: the caller may reuse it at once */
  if (rc == 0 && !async && is_pinned_host(h)) rc = ck(cudaStreamSynchronize(st), "copy to device (synchronize)");
  if (rc == 0 && d != dst) rc = em_copy_device_cuda(dst, d);
  em_tensor_release(d);
  em_tensor_release(h);
  return rc;
}

/* ---------------- device -> host ---------------- */

static int copy_d2h(em_tensor *dst, em_tensor *src, bool nb) {
  int dev = src->device.index;
  bool async = nb && is_pinned_host(dst) && em_is_contiguous(dst);
  if (!async && em_cuda_check_not_capturing("copy_ (device to host)")) return -1;
  EmDeviceGuard guard(dev);
  cudaStream_t st = (cudaStream_t)em_cuda_cur_stream_handle(dev);
  em_tensor *d = device_contiguous_like(dst, src);   /* converted and broadcast on the device */
  if (!d) return -1;
  int rc;
  if (em_is_contiguous(dst)) {
    rc = ck(cudaMemcpyAsync(em_data_ptr(dst), em_data_ptr(d), nbytes_of(dst), cudaMemcpyDeviceToHost, st),
            "copy to host");
    if (rc == 0 && !async) rc = ck(cudaStreamSynchronize(st), "copy to host (synchronize)");
  } else {
    em_tensor *h = em_empty(dst->ndim, dst->shape, dst->dtype, em_cpu());
    rc = h ? 0 : -1;
    if (rc == 0) rc = ck(cudaMemcpyAsync(em_data_ptr(h), em_data_ptr(d), nbytes_of(h), cudaMemcpyDeviceToHost, st),
                         "copy to host");
    if (rc == 0) rc = ck(cudaStreamSynchronize(st), "copy to host (synchronize)");
    if (rc == 0) {
      bool g = em_set_grad_enabled(false);
      rc = em_copy_(dst, h);            /* scatter into dst's strides on the host */
      em_set_grad_enabled(g);
    }
    em_tensor_release(h);
  }
  em_tensor_release(d);
  return rc;
}

/* ---------------- device -> other device ---------------- */

/* Make `waiter` (on its device) wait for the work queued so far on `s`. */
static int stream_wait(cudaStream_t waiter, cudaStream_t s, int s_dev) {
  EmDeviceGuard guard(s_dev);
  cudaEvent_t e;
  if (ck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event create")) return -1;
  int rc = ck(cudaEventRecord(e, s), "event record");
  if (rc == 0) rc = ck(cudaStreamWaitEvent(waiter, e, 0), "stream wait");
  cudaEventDestroy(e);
  return rc;
}

static int copy_peer(em_tensor *dst, em_tensor *src) {
  int da = dst->device.index, db = src->device.index;
  cudaStream_t sa = (cudaStream_t)em_cuda_cur_stream_handle(da), sb = (cudaStream_t)em_cuda_cur_stream_handle(db);
  em_tensor *s = NULL, *d = NULL;
  {
    EmDeviceGuard guard(db);
    s = device_contiguous_like(dst, src);
  }
  if (!s) return -1;
  int rc = 0;
  {
    EmDeviceGuard guard(da);
    d = em_is_contiguous(dst) ? em_tensor_retain(dst) : em_empty(dst->ndim, dst->shape, dst->dtype, dst->device);
    if (!d) rc = -1;
    if (rc == 0) rc = stream_wait(sa, sb, db);               /* s is ready */
    if (rc == 0) rc = ck(cudaMemcpyPeerAsync(em_data_ptr(d), da, em_data_ptr(s), db, nbytes_of(dst), sa),
                         "peer copy");
    if (rc == 0) rc = stream_wait(sb, sa, da);               /* s is not reused before the copy ran */
    if (rc == 0 && d != dst) rc = em_copy_device_cuda(dst, d);
  }
  em_tensor_release(d);
  em_tensor_release(s);
  return rc;
}

/* ---------------- entry points ---------------- */

extern "C" int em_copy_cuda(em_tensor *dst, em_tensor *src) {
  bool nb = tl_nonblocking;
  tl_nonblocking = false;
  if (em_cuda_runtime_init() <= 0) return em_error("copy_: no CUDA device is available");
  if (em_numel(dst) == 0) return 0;
  bool dc = dst->device.type == EM_CUDA, sc = src->device.type == EM_CUDA;
  if (dc && em_cuda_check_device("copy_", dst->device.index)) return -1;
  if (sc && em_cuda_check_device("copy_", src->device.index)) return -1;
  if (dc && sc && dst->device.index == src->device.index) return em_copy_device_cuda(dst, src);
  if (dc && !sc) return copy_h2d(dst, src, nb);
  if (!dc && sc) return copy_d2h(dst, src, nb);
  if (dc && sc) return copy_peer(dst, src);
  return em_error("copy_: expected a CUDA tensor");
}

extern "C" int em_copy_nonblocking_(em_tensor *dst, em_tensor *src) {
  tl_nonblocking = true;
  int rc = em_copy_(dst, src);
  tl_nonblocking = false;      /* em_copy_ may have failed before reaching em_copy_cuda */
  return rc;
}

extern "C" int em_fill_cuda(em_tensor *dst, double v) {
  if (em_cuda_runtime_init() <= 0) return em_error("fill_: no CUDA device is available");
  if (em_cuda_check_device("fill_", dst->device.index)) return -1;
  int64_t n = em_numel(dst);
  if (n == 0) return 0;
  uint64_t bits = 0;
  em_store_f64(&bits, dst->dtype, 0, v);      /* the CPU's conversion of v, once */
  size_t es = em_dtype_size(dst->dtype);
  EmDeviceGuard guard(dst->device.index);
  cudaStream_t st = (cudaStream_t)em_cuda_cur_stream_handle(dst->device.index);
  if (bits == 0 && em_is_contiguous(dst))
    return ck(cudaMemsetAsync(em_data_ptr(dst), 0, (size_t)n * es, st), "fill (memset)");
  em_geom g = em_geom_make(dst->ndim, dst->shape, dst->stride, NULL);
  void *d = em_data_ptr(dst);
  const int dev = dst->device.index;
  int rc;
  switch (es) {
    case 1: rc = launch_fill<uint8_t>(dev, d, bits, g, n, st); break;
    case 2: rc = launch_fill<uint16_t>(dev, d, bits, g, n, st); break;
    case 4: rc = launch_fill<uint32_t>(dev, d, bits, g, n, st); break;
    default: rc = launch_fill<uint64_t>(dev, d, bits, g, n, st); break;
  }
  return rc ? -1 : em_launch_check("fill_");
}

/* ---------------- pinned host memory ---------------- */

static void free_host_now(void *p) { cudaFreeHost(p); }
static void pinned_deleter(em_storage *s) { em_cuda_defer(free_host_now, s->data); }

extern "C" em_tensor *em_pin_memory(em_tensor *t) {
  if (t->device.type != EM_CPU) {
    char b[32];
    em_error("pin_memory: expected a CPU tensor, got one on %s", em_device_str(t->device, b, sizeof b));
    return NULL;
  }
  if (em_cuda_runtime_init() <= 0) { em_error("pin_memory: no CUDA device is available"); return NULL; }
  if (em_is_pinned(t)) return em_tensor_retain(t);
  size_t n = nbytes_of(t);
  void *p = NULL;
  cudaError_t e = cudaHostAlloc(&p, n ? n : 1, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    em_error_oom("out of memory: cannot allocate %zu bytes of pinned host memory (%s)", n, cudaGetErrorString(e));
    return NULL;
  }
  em_storage *s = em_storage_wrap(p, n, em_cpu(), pinned_deleter, NULL);
  if (!s) { cudaFreeHost(p); return NULL; }
  s->flags |= EM_STORAGE_PINNED;
  int64_t stride[EM_MAX_DIMS];
  em_contiguous_strides(t->ndim, t->shape, stride);
  em_tensor *out = em_tensor_from_storage(s, 0, t->ndim, t->shape, stride, t->dtype);
  em_storage_release(s);
  if (!out) return NULL;
  bool g = em_set_grad_enabled(false);
  int rc = em_copy_(out, t);
  em_set_grad_enabled(g);
  if (rc) { em_tensor_release(out); return NULL; }
  return out;
}

extern "C" bool em_is_pinned(const em_tensor *t) { return t && is_pinned_host(t); }
