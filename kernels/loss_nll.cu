/* nll_loss, fused (the device half of engine/ops/loss_nll.c, which has the
 * formulas): a gather forward, a one-pass backward.
 *
 * Cost: forward reads N targets and N picked log-probabilities (plus N
 * weights) -- ~16 bytes a row, a few microseconds even for (8192, 1024),
 * where the one-hot composition it replaces read and wrote N·C several
 * times; backward writes d logp once (N·C·sizeof(T), zeros but one value a
 * row) and reads the same per-row values.
 *
 * Launch: forward one thread per row, grid-stride (row offsets from logp's
 * strides, so a permuted (N, C, d...) view is read in place), each row in
 * double; "mean"/"sum" fold rows into per-block partials and a one-block
 * kernel sums them in a fixed order (loss_reduce.cuh), writing the loss and
 * {sum of losses, counted weight} for the backward: no host read, no
 * atomics. Backward: d logp as one flat pass of 16-byte vectors (each
 * vector meets at most two rows when C >= its width; one element per step
 * otherwise), every element written (zeros included: no separate memset);
 * d weight (rare: only when weight requires grad) by atomic adds per row. */
#include "common.cuh"
#include "dtype_io.cuh"
#include "loss_reduce.cuh"
#include "backend.h"

namespace {

using loss_reduce::kThreads;

/* Element offset of row r in logp. */
__device__ __forceinline__ int64_t row_off(const em_nll_args &a, int64_t r) {
  int64_t off = 0;
  for (int d = a.nd - 1; d >= 0; d--) {
    int64_t q = r / a.shape[d];
    off += (r - q * a.shape[d]) * a.stride[d];
    r = q;
  }
  return off;
}

template <typename I>
__device__ __forceinline__ int64_t target_of(const I *t, int64_t r) { return (int64_t)t[r]; }

struct Src {
  const void *logp; int ldt;
  const void *w; int wdt;        /* w NULL: weight 1 */
};

template <typename I>
__global__ void __launch_bounds__(kThreads) nll_fwd_kernel(Src s, const I *__restrict__ t, em_nll_args a, void *out,
                                                           int odt, double *part) {
  double acc[2] = {0, 0};
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < a.N; r += (int64_t)gridDim.x * blockDim.x) {
    const int64_t tr = target_of(t, r);
    double l = 0, wr = 0;
    if (tr != a.ignore_index) {
      if (tr < 0 || tr >= a.C) {
        l = NAN;                 /* a bad target poisons the loss (no host-side check on CUDA) */
      } else {
        wr = s.w ? load_as<double>(s.w, s.wdt, tr) : 1.0;
        l = (0 - load_as<double>(s.logp, s.ldt, row_off(a, r) + tr * a.cstride)) * wr;
      }
    }
    if (out) store_as<double>(out, odt, r, l);
    else { acc[0] += l; acc[1] += wr; }
  }
  if (part) loss_reduce::write_partials<2>(acc, part);
}

/* stats = {S, W}; out[0] = S / W (mean) or S (sum). */
__global__ void __launch_bounds__(kThreads) nll_finish_kernel(const double *part, int nparts, bool mean, double *stats,
                                                              void *out, int odt) {
  double tot[2];
  loss_reduce::sum_partials<2>(part, nparts, tot);
  if (threadIdx.x == 0) {
    stats[0] = tot[0];
    stats[1] = tot[1];
    store_as<double>(out, odt, 0, mean ? tot[0] / tot[1] : tot[0]);
  }
}

/* The upstream gradient of row r: g[r] ("none"), g[0] ("sum"), g[0] / W ("mean"). */
struct Up {
  const void *g; int gdt;
  bool vec;
  double g0;                     /* unused when vec */
};

__device__ __forceinline__ double up_of(const Up &u, int64_t r) {
  return u.vec ? load_as<double>(u.g, u.gdt, r) : u.g0;
}

/* At kernel start: the 0-d upstream gradient (sum/mean) read on the device,
 * divided by the counted weight W for a mean (stats non-NULL). */
__device__ __forceinline__ void up_init(Up &u, const double *stats) {
  if (!u.vec) u.g0 = load_as<double>(u.g, u.gdt, 0);
  if (stats) u.g0 /= stats[1];
}

/* Row r's column and value in d logp: -w[t] g_r at t, or column -1 (an
 * ignored or bad row: all zeros). */
template <typename I>
__device__ __forceinline__ int64_t row_grad(const Src &s, const I *t, const em_nll_args &a, const Up &u, int64_t r,
                                            double &val) {
  const int64_t tr = target_of(t, r);
  if (tr == a.ignore_index || tr < 0 || tr >= a.C) return -1;
  val = -(s.w ? load_as<double>(s.w, s.wdt, tr) : 1.0) * up_of(u, r);
  return tr;
}

template <typename T, typename I, int V>
__global__ void __launch_bounds__(kThreads) nll_gx_kernel(Src s, const I *__restrict__ t, em_nll_args a, Up u,
                                                          const double *__restrict__ stats, T *__restrict__ gx) {
  up_init(u, stats);
  const int64_t total = a.N * a.C, nv = total / V, C = a.C;
  for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e0 = v * V, r0 = e0 / C, c0 = e0 - r0 * C;
    double va = 0, vb = 0;
    const int64_t ca = row_grad(s, t, a, u, r0, va);
    const int64_t cb = c0 + V > C ? row_grad(s, t, a, u, r0 + 1, vb) : -1;   /* spills into the next row */
    Packed128<T> q;
#pragma unroll
    for (int k = 0; k < V; k++) {
      const int64_t c = c0 + k;
      const double x = c < C ? (c == ca ? va : 0.0) : (c - C == cb ? vb : 0.0);
      q[k] = from_compute<T, double>(x);
    }
    store128(gx + e0, q);
  }
  for (int64_t e = nv * V + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {   /* the tail, or everything when V == 1 */
    const int64_t r = e / C;
    double val = 0;
    const int64_t c = row_grad(s, t, a, u, r, val);
    gx[e] = from_compute<T, double>(e - r * C == c ? val : 0.0);
  }
}

/* d weight: per counted row, gw[t] += g_r (-logp[r, t]) (sum/none) or
 * g_r (-logp[r, t] - L) (mean, g_r = g / W, L = S / W). W: gw's dtype (f32/f64). */
template <typename I, typename W>
__global__ void __launch_bounds__(kThreads) nll_gw_kernel(Src s, const I *__restrict__ t, em_nll_args a, Up u,
                                                          const double *__restrict__ stats, W *gw) {
  double L = 0;
  up_init(u, stats);
  if (stats) L = stats[0] / stats[1];
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < a.N; r += (int64_t)gridDim.x * blockDim.x) {
    const int64_t tr = target_of(t, r);
    if (tr == a.ignore_index || tr < 0 || tr >= a.C) continue;
    const double x = load_as<double>(s.logp, s.ldt, row_off(a, r) + tr * a.cstride);
    atomicAdd(gw + tr, (W)(up_of(u, r) * (stats ? -x - L : -x)));
  }
}

template <typename I>
int nll_fwd(const em_tensor *logp, const em_tensor *target, const em_tensor *weight, const em_nll_args *a,
            em_tensor *out, em_tensor *stats) {
  const int dev = logp->device.index;
  cudaStream_t st = em_cur_stream(dev);
  Src s = {em_data_ptr(logp), logp->dtype, weight ? em_data_ptr(weight) : nullptr, weight ? weight->dtype : 0};
  const I *t = (const I *)em_data_ptr(target);
  const bool none = a->reduction == EM_REDUCTION_NONE;
  const unsigned grid = loss_reduce::grid_for(a->N, dev);
  em_tensor *part = nullptr;
  if (!none) {
    int64_t np = 2 * (int64_t)grid;
    if (!(part = em_empty(1, &np, EM_F64, logp->device))) return -1;
  }
  double *pp = part ? (double *)em_data_ptr(part) : nullptr;
  if (a->N > 0) nll_fwd_kernel<I><<<grid, kThreads, 0, st>>>(s, t, *a, none ? em_data_ptr(out) : nullptr, out->dtype, pp);
  int rc = em_launch_check("nll_loss");
  if (rc == 0 && !none) {
    nll_finish_kernel<<<1, kThreads, 0, st>>>(pp, a->N > 0 ? (int)grid : 0, a->reduction == EM_REDUCTION_MEAN,
                                              (double *)em_data_ptr(stats), em_data_ptr(out), out->dtype);
    rc = em_launch_check("nll_loss");
  }
  em_tensor_release(part);
  return rc;
}

template <typename I>
int nll_bwd(const em_tensor *logp, const em_tensor *target, const em_tensor *weight, const em_nll_args *a,
            const em_tensor *g, const em_tensor *stats, em_tensor *gx, em_tensor *gw) {
  const int dev = logp->device.index;
  cudaStream_t st = em_cur_stream(dev);
  Src s = {em_data_ptr(logp), logp->dtype, weight ? em_data_ptr(weight) : nullptr, weight ? weight->dtype : 0};
  const I *t = (const I *)em_data_ptr(target);
  const bool mean = a->reduction == EM_REDUCTION_MEAN;
  Up u = {em_data_ptr(g), g->dtype, a->reduction == EM_REDUCTION_NONE, 0.0};   /* g0: up_init, on the device */
  const double *sp = mean ? (const double *)em_data_ptr(stats) : nullptr;
  if (gx && a->N * a->C > 0) {
    const int64_t total = a->N * a->C;
    EM_DISPATCH_FLOAT(gx->dtype, T, {
      constexpr int V = 16 / (int)sizeof(T);
      const bool vec = a->C >= V && ((uintptr_t)em_data_ptr(gx) & 15) == 0;
      const unsigned grid = loss_reduce::grid_for(vec ? total / V : total, dev);
      if (vec) nll_gx_kernel<T, I, V><<<grid, kThreads, 0, st>>>(s, t, *a, u, sp, (T *)em_data_ptr(gx));
      else nll_gx_kernel<T, I, 1><<<grid, kThreads, 0, st>>>(s, t, *a, u, sp, (T *)em_data_ptr(gx));
    });
    if (em_launch_check("nll_loss backward")) return -1;
  }
  if (gw && a->N > 0) {
    const unsigned grid = loss_reduce::grid_for(a->N, dev);
    if (gw->dtype == EM_F64) nll_gw_kernel<I, double><<<grid, kThreads, 0, st>>>(s, t, *a, u, sp, (double *)em_data_ptr(gw));
    else if (gw->dtype == EM_F32) nll_gw_kernel<I, float><<<grid, kThreads, 0, st>>>(s, t, *a, u, sp, (float *)em_data_ptr(gw));
    else return em_error("nll_loss backward: internal error: weight gradient of dtype %s", em_dtype_name(gw->dtype));
    if (em_launch_check("nll_loss backward")) return -1;
  }
  return 0;
}

}  // namespace

extern "C" int em_nll_fwd_cuda(const em_tensor *logp, const em_tensor *target, const em_tensor *weight,
                               const em_nll_args *a, em_tensor *out, em_tensor *stats) {
  if (em_use_device(logp->device.index, "nll_loss")) return -1;
  if (target->dtype == EM_I64) return nll_fwd<int64_t>(logp, target, weight, a, out, stats);
  if (target->dtype == EM_I32) return nll_fwd<int32_t>(logp, target, weight, a, out, stats);
  return em_error("nll_loss: CUDA targets must be i32 or i64, got %s", em_dtype_name(target->dtype));
}

extern "C" int em_nll_bwd_cuda(const em_tensor *logp, const em_tensor *target, const em_tensor *weight,
                               const em_nll_args *a, const em_tensor *g, const em_tensor *stats, em_tensor *gx,
                               em_tensor *gw) {
  if (em_use_device(logp->device.index, "nll_loss backward")) return -1;
  if (target->dtype == EM_I64) return nll_bwd<int64_t>(logp, target, weight, a, g, stats, gx, gw);
  if (target->dtype == EM_I32) return nll_bwd<int32_t>(logp, target, weight, a, g, stats, gx, gw);
  return em_error("nll_loss backward: CUDA targets must be i32 or i64, got %s", em_dtype_name(target->dtype));
}
