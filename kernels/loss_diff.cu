/* mse_loss and l1_loss, fused (the device half of engine/ops/loss_diff.c,
 * which has the formulas): l = (x - y)^2 or |x - y|, reduced or not; dx and
 * dy = -dx in one pass backward.
 *
 * Cost per element: 2-3 FLOPs and one double add (the sum); bytes: forward
 * reads x and y (2 sizeof(T); f32 2^26: 512 MiB, 160 us at 3.35 TB/s) and
 * writes the loss only for "none"; backward reads x, y (and g for "none")
 * and writes dx and/or dy. Memory-bound: the whole job is keeping enough
 * loads in flight.
 *
 * Launch: 256 threads, grid-stride over 16-byte vectors (Packed128: 4 f32
 * or 8 bf16) when every operand is 16-byte aligned, else one element per
 * step; each thread issues the loads of kUnroll vectors of x and y before
 * using any (4 x 16 bytes in flight per thread); at most 8 blocks per
 * multiprocessor. A reduction folds each thread's losses into a double,
 * blocks into partials, and a one-block kernel sums the partials in a fixed
 * order (loss_reduce.cuh): deterministic, no host read. Math in f32 (f64 for
 * f64), as the composed sub / square / mean did. */
#include <type_traits>
#include "common.cuh"
#include "dtype_io.cuh"
#include "loss_reduce.cuh"
#include "backend.h"

namespace {

using loss_reduce::kThreads;
constexpr int kUnroll = 2;

using loss_reduce::acc_t;
using loss_reduce::ld;
using loss_reduce::st;
using loss_reduce::load_vals;
using loss_reduce::store_vals;

template <int KIND, typename C>
__device__ __forceinline__ C diff_loss(C x, C y) {
  const C d = x - y;
  return KIND == EM_LOSS_L1 ? fabs(d) : d * d;
}

/* d(loss)/dx: 2 d, or sign(d) (0 at d == 0, NaN stays NaN). */
template <int KIND, typename C>
__device__ __forceinline__ C diff_grad(C x, C y) {
  const C d = x - y;
  if (KIND == EM_LOSS_L1) return d > 0 ? (C)1 : d < 0 ? (C)-1 : d == 0 ? (C)0 : d;
  return 2 * d;
}

template <typename T, int V, int KIND>
__global__ void __launch_bounds__(kThreads) diff_fwd_kernel(const T *__restrict__ x, const T *__restrict__ y, int64_t n,
                                                            T *__restrict__ out, double *part) {
  using C = acc_t<T>;
  const int64_t nv = n / V, step = (int64_t)gridDim.x * blockDim.x;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  double acc[1] = {0};
  for (int64_t v0 = tid; v0 < nv; v0 += step * kUnroll) {
    C a[kUnroll][V], b[kUnroll][V];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {   /* every load issued before any use */
      const int64_t v = v0 + u * step;
      if (v < nv) {
        load_vals<T, V, C>(x, v * V, a[u]);
        load_vals<T, V, C>(y, v * V, b[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      const int64_t v = v0 + u * step;
      if (v >= nv) break;
      C l[V];
#pragma unroll
      for (int e = 0; e < V; e++) l[e] = diff_loss<KIND, C>(a[u][e], b[u][e]);
      if (out) {
        store_vals<T, V, C>(out, v * V, l);
      } else {
#pragma unroll
        for (int e = 0; e < V; e++) acc[0] += (double)l[e];
      }
    }
  }
  const int64_t i = nv * V + tid;   /* the last n % V elements, one per thread */
  if (V > 1 && i < n) {
    C l = diff_loss<KIND, C>(ld<C>(x[i]), ld<C>(y[i]));
    if (out) out[i] = st<T, C>(l);
    else acc[0] += (double)l;
  }
  if (part) loss_reduce::write_partials<1>(acc, part);
}

/* dx and/or dy (NULL: not wanted); upstream g[i] (gvec) or g[0], times scale. */
template <typename T, int V, int KIND>
__global__ void __launch_bounds__(kThreads) diff_bwd_kernel(const T *__restrict__ x, const T *__restrict__ y, int64_t n,
                                                            const T *__restrict__ g, bool gvec, double scale,
                                                            T *__restrict__ gx, T *__restrict__ gy) {
  using C = acc_t<T>;
  const C g0 = gvec ? (C)0 : (C)((double)ld<C>(g[0]) * scale), sc = (C)scale;
  const int64_t nv = n / V, step = (int64_t)gridDim.x * blockDim.x;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  auto one = [&](int64_t i0, auto width) {
    constexpr int W = decltype(width)::value;
    C a[W], b[W], gg[W], ox[W], oy[W];
    load_vals<T, W, C>(x, i0, a);
    load_vals<T, W, C>(y, i0, b);
    if (gvec) {
      load_vals<T, W, C>(g, i0, gg);
#pragma unroll
      for (int e = 0; e < W; e++) gg[e] *= sc;
    } else {
#pragma unroll
      for (int e = 0; e < W; e++) gg[e] = g0;
    }
#pragma unroll
    for (int e = 0; e < W; e++) {
      ox[e] = gg[e] * diff_grad<KIND, C>(a[e], b[e]);
      oy[e] = -ox[e];
    }
    if (gx) store_vals<T, W, C>(gx, i0, ox);
    if (gy) store_vals<T, W, C>(gy, i0, oy);
  };
  for (int64_t v = tid; v < nv; v += step) one(v * V, std::integral_constant<int, V>());
  const int64_t i = nv * V + tid;
  if (V > 1 && i < n) one(i, std::integral_constant<int, 1>());
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <typename T, int KIND>
int diff_fwd(int reduction, const em_tensor *xt, const em_tensor *yt, em_tensor *out, const char *op) {
  constexpr int V = 16 / (int)sizeof(T);
  const int dev = xt->device.index;
  cudaStream_t s = em_cur_stream(dev);
  const T *x = (const T *)em_data_ptr(xt), *y = (const T *)em_data_ptr(yt);
  const int64_t n = em_numel(xt);
  const bool none = reduction == EM_REDUCTION_NONE;
  T *o = none ? (T *)em_data_ptr(out) : nullptr;
  const bool vec = aligned16(x) && aligned16(y) && (!o || aligned16(o));
  const unsigned grid = loss_reduce::grid_for(vec ? (n + V - 1) / V : n, dev);
  em_tensor *part = nullptr;
  if (!none) {
    int64_t np = grid;
    if (!(part = em_empty(1, &np, EM_F64, xt->device))) return -1;
  }
  double *pp = part ? (double *)em_data_ptr(part) : nullptr;
  if (n > 0) {
    if (vec) diff_fwd_kernel<T, V, KIND><<<grid, kThreads, 0, s>>>(x, y, n, o, pp);
    else diff_fwd_kernel<T, 1, KIND><<<grid, kThreads, 0, s>>>(x, y, n, o, pp);
  }
  int rc = em_launch_check(op);
  if (rc == 0 && !none) {
    double scale = reduction == EM_REDUCTION_MEAN ? 1.0 / (double)n : 1.0;   /* n = 0: 0 * inf = NaN */
    loss_reduce::finish_scaled<T><<<1, kThreads, 0, s>>>(pp, n > 0 ? (int)grid : 0, scale, (T *)em_data_ptr(out));
    rc = em_launch_check(op);
  }
  em_tensor_release(part);
  return rc;
}

template <typename T, int KIND>
int diff_bwd(int reduction, const em_tensor *xt, const em_tensor *yt, const em_tensor *g, double scale, em_tensor *gxt,
             em_tensor *gyt, const char *op) {
  constexpr int V = 16 / (int)sizeof(T);
  const int64_t n = em_numel(xt);
  if (n == 0) return 0;
  const int dev = xt->device.index;
  cudaStream_t s = em_cur_stream(dev);
  const T *x = (const T *)em_data_ptr(xt), *y = (const T *)em_data_ptr(yt), *gp = (const T *)em_data_ptr(g);
  T *gx = gxt ? (T *)em_data_ptr(gxt) : nullptr, *gy = gyt ? (T *)em_data_ptr(gyt) : nullptr;
  const bool gvec = reduction == EM_REDUCTION_NONE;
  const bool vec = aligned16(x) && aligned16(y) && (!gx || aligned16(gx)) && (!gy || aligned16(gy)) &&
                   (!gvec || aligned16(gp));
  const unsigned grid = loss_reduce::grid_for(vec ? (n + V - 1) / V : n, dev);
  if (vec) diff_bwd_kernel<T, V, KIND><<<grid, kThreads, 0, s>>>(x, y, n, gp, gvec, scale, gx, gy);
  else diff_bwd_kernel<T, 1, KIND><<<grid, kThreads, 0, s>>>(x, y, n, gp, gvec, scale, gx, gy);
  return em_launch_check(op);
}

template <typename T>
int fwd_kind(int kind, int reduction, const em_tensor *x, const em_tensor *y, em_tensor *out, const char *op) {
  return kind == EM_LOSS_L1 ? diff_fwd<T, EM_LOSS_L1>(reduction, x, y, out, op)
                            : diff_fwd<T, EM_LOSS_MSE>(reduction, x, y, out, op);
}

template <typename T>
int bwd_kind(int kind, int reduction, const em_tensor *x, const em_tensor *y, const em_tensor *g, double scale,
             em_tensor *gx, em_tensor *gy, const char *op) {
  return kind == EM_LOSS_L1 ? diff_bwd<T, EM_LOSS_L1>(reduction, x, y, g, scale, gx, gy, op)
                            : diff_bwd<T, EM_LOSS_MSE>(reduction, x, y, g, scale, gx, gy, op);
}

bool same_dtype(em_dtype dt, const em_tensor *const *ts, int n) {
  for (int k = 0; k < n; k++)
    if (ts[k] && ts[k]->dtype != dt) return false;
  return true;
}

}  // namespace

extern "C" int em_loss_diff_fwd_cuda(int kind, int reduction, const em_tensor *x, const em_tensor *y, em_tensor *out) {
  const char *op = kind == EM_LOSS_L1 ? "l1_loss" : "mse_loss";
  const em_tensor *ts[3] = {x, y, out};
  if (!same_dtype(x->dtype, ts, 3)) return em_error("%s: internal error: operands of mixed dtypes", op);
  if (em_use_device(x->device.index, op)) return -1;
  switch (x->dtype) {
    case EM_F32: return fwd_kind<float>(kind, reduction, x, y, out, op);
    case EM_F64: return fwd_kind<double>(kind, reduction, x, y, out, op);
    case EM_BF16: return fwd_kind<__nv_bfloat16>(kind, reduction, x, y, out, op);
    case EM_F16: return fwd_kind<__half>(kind, reduction, x, y, out, op);
    default: return em_error("%s: unsupported dtype %s", op, em_dtype_name(x->dtype));
  }
}

extern "C" int em_loss_diff_bwd_cuda(int kind, int reduction, const em_tensor *x, const em_tensor *y,
                                     const em_tensor *g, double scale, em_tensor *gx, em_tensor *gy) {
  const char *op = kind == EM_LOSS_L1 ? "l1_loss backward" : "mse_loss backward";
  const em_tensor *ts[5] = {x, y, g, gx, gy};
  if (!same_dtype(x->dtype, ts, 5)) return em_error("%s: internal error: operands of mixed dtypes", op);
  if (em_use_device(x->device.index, op)) return -1;
  switch (x->dtype) {
    case EM_F32: return bwd_kind<float>(kind, reduction, x, y, g, scale, gx, gy, op);
    case EM_F64: return bwd_kind<double>(kind, reduction, x, y, g, scale, gx, gy, op);
    case EM_BF16: return bwd_kind<__nv_bfloat16>(kind, reduction, x, y, g, scale, gx, gy, op);
    case EM_F16: return bwd_kind<__half>(kind, reduction, x, y, g, scale, gx, gy, op);
    default: return em_error("%s: unsupported dtype %s", op, em_dtype_name(x->dtype));
  }
}
