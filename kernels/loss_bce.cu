/* binary_cross_entropy_with_logits, fused (the device half of
 * engine/ops/loss_bce.c, which has the formulas):
 *   l = w [(1 - y) x + (1 + (pw - 1) y) softplus(-x)],  reduced or not;
 *   dx, dy, dw, dpw in one pass backward.
 *
 * Cost per element: one exp and one log1p (plus a divide backward), ~10
 * FLOPs; bytes: forward reads x and y (2 sizeof(T); f32 2^24: 128 MiB, ~40 us
 * at 3.35 TB/s) and writes the loss only for "none"; backward reads x, y and
 * writes dx (3 sizeof(T)), more for the rarer dy/dw/dpw. Memory-bound.
 *
 * Launch: 256 threads, grid-stride over 16-byte vectors (Packed128: 4 f32
 * or 8 bf16 per thread per step) when every full-size operand is 16-byte
 * aligned, else one element per step; at most 8 blocks per multiprocessor,
 * fewer where the kernel's registers keep fewer resident (bce_grid); the
 * forward without weight and pos_weight has its own instantiation (PLAIN:
 * 32 registers, 8 blocks resident, against 47-57 with the weight modes).
 * weight / pos_weight are read in place by mode (backend.h em_bce_args): a
 * scalar is loaded once per thread, a row (C) by index i % C (one division
 * per vector, then a wrap-around counter). A reduction folds each thread's
 * losses into a double, blocks into partials, and a one-block kernel sums
 * the partials in a fixed order (loss_reduce.cuh): deterministic, no host
 * read. Math in f32 (f64 for f64); exp(-|x|) keeps every term finite. */
#include <stdlib.h>
#include <type_traits>
#include "common.cuh"
#include "dtype_io.cuh"
#include "loss_reduce.cuh"
#include "backend.h"

namespace {

using loss_reduce::kThreads;

using loss_reduce::acc_t;
using loss_reduce::ld;
using loss_reduce::st;
using loss_reduce::load_vals;
using loss_reduce::store_vals;

__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double m_log1p(double x) { return log1p(x); }

template <typename T>
struct BceArgs {
  const T *x, *y, *w, *pw;
  int64_t n, C;
  int wm, pwm;
};

/* weight / pos_weight at elements i0 .. i0 + V - 1 by mode; sc: the scalar (or 1). */
template <typename T, int V, typename C>
__device__ __forceinline__ void load_factor(const T *p, int mode, int64_t i0, int64_t C_, C sc, C (&v)[V]) {
  if (mode == EM_BCE_FULL) { load_vals<T, V, C>(p, i0, v); return; }
  if (mode == EM_BCE_ROW) {
    int64_t c = i0 % C_;
#pragma unroll
    for (int e = 0; e < V; e++) {
      v[e] = ld<C>(p[c]);
      if (++c == C_) c = 0;
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < V; e++) v[e] = sc;
}

template <typename T, typename C>
__device__ __forceinline__ C scalar_of(const T *p, int mode) {
  return mode == EM_BCE_SCALAR ? ld<C>(p[0]) : (C)1;
}

/* softplus(-|x|) = log1p(exp(-|x|)), the loss's transcendental part */
template <typename C> __device__ __forceinline__ C bce_lp(C x) { return m_log1p(m_exp(-fabs(x))); }

/* The loss of one element (w = 1, pw = 1 when absent), lp = bce_lp(x). */
template <typename C>
__device__ __forceinline__ C bce_loss_lp(C x, C y, C w, C pw, bool has_pw, C lp) {
  C l = has_pw ? (1 - y) * x + (1 + (pw - 1) * y) * (fmax(-x, (C)0) + lp) : fmax(x, (C)0) - x * y + lp;
  return l * w;
}
template <typename C>
__device__ __forceinline__ C bce_loss(C x, C y, C w, C pw, bool has_pw) {
  return bce_loss_lp<C>(x, y, w, pw, has_pw, bce_lp<C>(x));
}

/* PLAIN: no weight and no pos_weight (the common call), compiled without their loads and modes: fewer
 * registers for the 16-byte-vector kernels (more blocks resident); the loss is the same expression
 * (l * 1 is l exactly). */
template <typename T, int V, bool PLAIN>
__global__ void __launch_bounds__(kThreads) bce_fwd_kernel(BceArgs<T> a, T *__restrict__ out, double *part) {
  using C = acc_t<T>;
  if constexpr (PLAIN) { a.wm = EM_BCE_NONE; a.pwm = EM_BCE_NONE; }
  const C wsc = scalar_of<T, C>(a.w, a.wm), pwsc = scalar_of<T, C>(a.pw, a.pwm);
  const bool has_pw = a.pwm != EM_BCE_NONE;
  const int64_t nv = a.n / V, step = (int64_t)gridDim.x * blockDim.x;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  double acc[1] = {0};
  for (int64_t v = tid; v < nv; v += step) {
    const int64_t i0 = v * V;
    C x[V], y[V], w[V], pw[V], l[V];
    load_vals<T, V, C>(a.x, i0, x);
    load_vals<T, V, C>(a.y, i0, y);
    load_factor<T, V, C>(a.w, a.wm, i0, a.C, wsc, w);
    load_factor<T, V, C>(a.pw, a.pwm, i0, a.C, pwsc, pw);
#pragma unroll
    for (int e = 0; e < V; e++) l[e] = bce_loss<C>(x[e], y[e], w[e], pw[e], has_pw);
    if (out) {
      store_vals<T, V, C>(out, i0, l);
    } else {
#pragma unroll
      for (int e = 0; e < V; e++) acc[0] += (double)l[e];
    }
  }
  const int64_t i = nv * V + tid;   /* the last n % V elements, one per thread */
  if (V > 1 && i < a.n) {
    C x[1], y[1], w[1], pw[1];
    load_vals<T, 1, C>(a.x, i, x);
    load_vals<T, 1, C>(a.y, i, y);
    load_factor<T, 1, C>(a.w, a.wm, i, a.C, wsc, w);
    load_factor<T, 1, C>(a.pw, a.pwm, i, a.C, pwsc, pw);
    C l = bce_loss<C>(x[0], y[0], w[0], pw[0], has_pw);
    if (out) out[i] = st<T, C>(l);
    else acc[0] += (double)l;
  }
  if (part) loss_reduce::write_partials<1>(acc, part);
}

/* issue 12: bf16 BCE was issue-bound, not memory-bound: expf + log1pf are
 * ~36 of the ~45 lane-instructions an element (a 4-byte element leaves ~39
 * at 70 % of 4800 GB/s), 50 % of the bandwidth at 2^26. But bf16 x has
 * 2^15 magnitudes, so lp = bce_lp(x) is a function of 15 bits: each block
 * first evaluates it (the same device code, so the same bits) for every
 * bf16 |x| in [2^-12, 2^6) -- 18 binades of 128, 2304 floats, 9 KiB of
 * shared memory, ~9 evaluations a thread, while the first trip's loads are
 * in flight -- and the loop reads it back by the bits of x (~4
 * instructions and a shared load); |x| outside the range (zeros, tiny,
 * huge, inf, NaN) computes as before. The loss expression,
 * the grid (the PLAIN kernel's, passed in), each thread's elements and
 * their order into the double sum are the PLAIN kernel's: the same values
 * and bits. EMBER_BCE_LPTAB=0 runs bce_fwd_kernel<PLAIN>. */
constexpr int kLpN = kBf16TabN;

/* lp of the bf16 in word's low (hi = 0) or high half, whose value is x: from the table, or computed */
__device__ __forceinline__ float lp_of(const float *tab, uint32_t word, int hi, float x) {
  const uint32_t i = em_bf16_tab_index(hi ? word >> 16 : word);
  return i < (uint32_t)kLpN ? tab[i] : bce_lp<float>(x);
}

__global__ void __launch_bounds__(kThreads, 8) bce_fwd_tab(BceArgs<__nv_bfloat16> a, __nv_bfloat16 *__restrict__ out,
                                                           double *part) {
  using T = __nv_bfloat16;
  using C = float;
  constexpr int V = 8;
  __shared__ float tab[kLpN];
  const int64_t nv = a.n / V, step = (int64_t)gridDim.x * blockDim.x;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  /* the first trip's loads go out before the table is built (~3 us for a full grid), hiding their latency */
  uint4 wx = make_uint4(0, 0, 0, 0), wy = wx;
  if (tid < nv) { wx = *(const uint4 *)(a.x + tid * V); wy = *(const uint4 *)(a.y + tid * V); }
#pragma unroll 1
  for (int i = threadIdx.x; i < kLpN; i += kThreads)
    tab[i] = bce_lp<C>(__uint_as_float(em_bf16_tab_bits(i) << 16));
  __syncthreads();
  double acc[1] = {0};
  for (int64_t v = tid; v < nv; v += step) {
    const int64_t i0 = v * V;
    if (v != tid) { wx = *(const uint4 *)(a.x + i0); wy = *(const uint4 *)(a.y + i0); }
    C l[V];
#pragma unroll
    for (int e = 0; e < V; e++) {
      const C x = raw_elem<C, T>(wx, e), y = raw_elem<C, T>(wy, e);
      l[e] = bce_loss_lp<C>(x, y, (C)1, (C)1, false, lp_of(tab, word_at(wx, e >> 1), e & 1, x));
    }
    if (out) {
      store_vals<T, V, C>(out, i0, l);
    } else {
#pragma unroll
      for (int e = 0; e < V; e++) acc[0] += (double)l[e];
    }
  }
  const int64_t i = nv * V + tid;   /* the last n % V elements, one per thread */
  if (i < a.n) {
    const C x = ld<C>(a.x[i]), y = ld<C>(a.y[i]);
    C l = bce_loss_lp<C>(x, y, (C)1, (C)1, false, bce_lp<C>(x));
    if (out) out[i] = st<T, C>(l);
    else acc[0] += (double)l;
  }
  if (part) loss_reduce::write_partials<1>(acc, part);
}

/* Every gradient asked for (NULL: not wanted); upstream g[i] (gvec) or g[0], times scale. */
/* PLAIN: no weight or pos_weight and only dx wanted (the common call): the other gradients and the
 * softplus they need are compiled out; dx is the same expression (g * 1 is g exactly). */
template <typename T, int V, bool PLAIN>
__global__ void __launch_bounds__(kThreads) bce_bwd_kernel(BceArgs<T> a, const T *__restrict__ g, bool gvec, double scale,
                                                           T *__restrict__ gx, T *__restrict__ gy,
                                                           T *__restrict__ gw, T *__restrict__ gpw) {
  using C = acc_t<T>;
  if constexpr (PLAIN) { a.wm = EM_BCE_NONE; a.pwm = EM_BCE_NONE; gy = gw = gpw = nullptr; }
  const C wsc = scalar_of<T, C>(a.w, a.wm), pwsc = scalar_of<T, C>(a.pw, a.pwm);
  const bool has_pw = a.pwm != EM_BCE_NONE;
  const C g0 = gvec ? (C)0 : (C)((double)ld<C>(g[0]) * scale), sc = (C)scale;
  const int64_t nv = a.n / V, step = (int64_t)gridDim.x * blockDim.x;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  /* one vector (W = V) or one element (W = 1) at i0 */
  auto one = [&](int64_t i0, auto width) {
    constexpr int W = decltype(width)::value;
    C x[W], y[W], w[W], pw[W], gg[W], ox[W], oy[W], ow[W], opw[W];
    load_vals<T, W, C>(a.x, i0, x);
    load_vals<T, W, C>(a.y, i0, y);
    load_factor<T, W, C>(a.w, a.wm, i0, a.C, wsc, w);
    load_factor<T, W, C>(a.pw, a.pwm, i0, a.C, pwsc, pw);
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
      const C xe = x[e], ye = y[e], ex = m_exp(-fabs(xe)), inv = 1 / (1 + ex);
      const C sig = xe >= 0 ? inv : ex * inv, sig_neg = xe >= 0 ? ex * inv : inv;
      const C sp = fmax(-xe, (C)0) + m_log1p(ex), lw = 1 + (pw[e] - 1) * ye, gw_ = gg[e] * w[e];
      ox[e] = gw_ * (has_pw ? (1 - ye) - lw * sig_neg : sig - ye);
      oy[e] = gw_ * ((pw[e] - 1) * sp - xe);
      opw[e] = gw_ * ye * sp;
      ow[e] = gg[e] * ((1 - ye) * xe + lw * sp);
    }
    if (gx) store_vals<T, W, C>(gx, i0, ox);
    if (gy) store_vals<T, W, C>(gy, i0, oy);
    if (gw) store_vals<T, W, C>(gw, i0, ow);
    if (gpw) store_vals<T, W, C>(gpw, i0, opw);
  };
  for (int64_t v = tid; v < nv; v += step) one(v * V, std::integral_constant<int, V>());
  const int64_t i = nv * V + tid;
  if (V > 1 && i < a.n) one(i, std::integral_constant<int, 1>());
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <typename T>
BceArgs<T> args_of(const em_tensor *x, const em_tensor *y, const em_tensor *w, const em_tensor *pw,
                   const em_bce_args *a) {
  BceArgs<T> b;
  b.x = (const T *)em_data_ptr(x);
  b.y = (const T *)em_data_ptr(y);
  b.w = w ? (const T *)em_data_ptr(w) : nullptr;
  b.pw = pw ? (const T *)em_data_ptr(pw) : nullptr;
  b.n = a->n; b.C = a->C > 0 ? a->C : 1;
  b.wm = w ? a->w_mode : EM_BCE_NONE;
  b.pwm = pw ? a->pw_mode : EM_BCE_NONE;
  return b;
}

/* 16-byte vectors when every full-size pointer (and extra, may be NULL) is aligned. */
template <typename T>
bool can_vec(const BceArgs<T> &b, const void *const *extra, int n_extra) {
  bool ok = aligned16(b.x) && aligned16(b.y);
  if (b.wm == EM_BCE_FULL) ok = ok && aligned16(b.w);
  if (b.pwm == EM_BCE_FULL) ok = ok && aligned16(b.pw);
  for (int k = 0; k < n_extra; k++) ok = ok && (!extra[k] || aligned16(extra[k]));
  return ok;
}

/* Blocks of a grid-stride pass of kernel k: loss_reduce::grid_for's 8 a multiprocessor, or as many as k's
 * registers keep resident when that is fewer (the 16-byte-vector kernels take 47-61 registers: 4-5 blocks of
 * 256), so that every block runs in the first wave -- with equal shares, a second wave 60 % full (f32: 5
 * resident of 8) stretched the pass by up to a quarter. Deterministic (the kernel and the device fix it); the
 * partials of a reduction are then fewer, summed in the same fixed order. *per caches the occupancy (one
 * per call site and dtype). */
/* EMBER_BCE_OLD=1: the launches as before (8 blocks a multiprocessor, no PLAIN kernels), for A/B timing. */
bool bce_old() {
  static const bool on = em_env_switch("EMBER_BCE_OLD", false);
  return on;
}

/* EMBER_BCE_LPTAB=0: bf16's PLAIN forward computes lp per element (bce_fwd_kernel) instead of bce_fwd_tab. */
bool bce_lptab() {
  static const bool on = em_env_switch("EMBER_BCE_LPTAB", true);
  return on;
}

template <typename K>
unsigned bce_grid(K kernel, int *per, int64_t units, int dev) {
  const unsigned g = loss_reduce::grid_for(units, dev);
  if (bce_old()) return g;
  if (*per == 0) {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kThreads, 0) != cudaSuccess || b < 1) {
      cudaGetLastError();   /* clear it: the launch's own check must not see it */
      b = 8;
    }
    *per = b;
  }
  if (*per >= 8) return g;
  const int64_t cap = (int64_t)em_sm_count(dev) * *per;
  return (int64_t)g < cap ? g : (unsigned)cap;
}

template <typename T>
int bce_fwd(const em_tensor *x, const em_tensor *y, const em_tensor *w, const em_tensor *pw, const em_bce_args *a,
            em_tensor *out) {
  constexpr int V = 16 / (int)sizeof(T);
  const int dev = x->device.index;
  cudaStream_t s = em_cur_stream(dev);
  BceArgs<T> b = args_of<T>(x, y, w, pw, a);
  const bool none = a->reduction == EM_REDUCTION_NONE;
  T *o = none ? (T *)em_data_ptr(out) : nullptr;
  const void *extra[1] = {o};
  const bool vec = can_vec<T>(b, extra, 1);
  static int per[3];
  const bool plain = vec && !bce_old() && b.wm == EM_BCE_NONE && b.pwm == EM_BCE_NONE;
  const unsigned grid = plain ? bce_grid(bce_fwd_kernel<T, V, true>, &per[2], (a->n + V - 1) / V, dev)
                        : vec ? bce_grid(bce_fwd_kernel<T, V, false>, &per[1], (a->n + V - 1) / V, dev)
                              : bce_grid(bce_fwd_kernel<T, 1, false>, &per[0], a->n, dev);
  em_tensor *part = nullptr;
  if (!none) {
    int64_t np = grid;
    if (!(part = em_empty(1, &np, EM_F64, x->device))) return -1;
  }
  double *pp = part ? (double *)em_data_ptr(part) : nullptr;
  if (a->n > 0) {
    bool tab = false;
    if constexpr (std::is_same<T, __nv_bfloat16>::value) tab = plain && bce_lptab();
    if (tab) {   /* the PLAIN kernel's grid: the same partials */
      if constexpr (std::is_same<T, __nv_bfloat16>::value) bce_fwd_tab<<<grid, kThreads, 0, s>>>(b, o, pp);
    }
    else if (plain) bce_fwd_kernel<T, V, true><<<grid, kThreads, 0, s>>>(b, o, pp);
    else if (vec) bce_fwd_kernel<T, V, false><<<grid, kThreads, 0, s>>>(b, o, pp);
    else bce_fwd_kernel<T, 1, false><<<grid, kThreads, 0, s>>>(b, o, pp);
  }
  int rc = em_launch_check("binary_cross_entropy_with_logits");
  if (rc == 0 && !none) {
    double scale = a->reduction == EM_REDUCTION_MEAN ? 1.0 / (double)a->n : 1.0;   /* n = 0: 0 * inf = NaN */
    loss_reduce::finish_scaled<T><<<1, kThreads, 0, s>>>(pp, a->n > 0 ? (int)grid : 0, scale, (T *)em_data_ptr(out));
    rc = em_launch_check("binary_cross_entropy_with_logits");
  }
  em_tensor_release(part);
  return rc;
}

template <typename T>
int bce_bwd(const em_tensor *x, const em_tensor *y, const em_tensor *w, const em_tensor *pw, const em_bce_args *a,
            const em_tensor *g, double scale, em_tensor *gx, em_tensor *gy, em_tensor *gw, em_tensor *gpw) {
  constexpr int V = 16 / (int)sizeof(T);
  if (a->n == 0) return 0;
  const int dev = x->device.index;
  cudaStream_t s = em_cur_stream(dev);
  BceArgs<T> b = args_of<T>(x, y, w, pw, a);
  const bool gvec = a->reduction == EM_REDUCTION_NONE;
  T *o[4];
  const em_tensor *outs[4] = {gx, gy, gw, gpw};
  for (int k = 0; k < 4; k++) o[k] = outs[k] ? (T *)em_data_ptr(outs[k]) : nullptr;
  const void *extra[5] = {o[0], o[1], o[2], o[3], gvec ? em_data_ptr(g) : nullptr};
  const bool vec = can_vec<T>(b, extra, 5);
  const T *gp = (const T *)em_data_ptr(g);
  static int per[3];
  const bool plain = vec && !bce_old() && b.wm == EM_BCE_NONE && b.pwm == EM_BCE_NONE && !o[1] && !o[2] && !o[3];
  const unsigned grid = plain ? bce_grid(bce_bwd_kernel<T, V, true>, &per[2], (a->n + V - 1) / V, dev)
                        : vec ? bce_grid(bce_bwd_kernel<T, V, false>, &per[1], (a->n + V - 1) / V, dev)
                              : bce_grid(bce_bwd_kernel<T, 1, false>, &per[0], a->n, dev);
  if (plain) bce_bwd_kernel<T, V, true><<<grid, kThreads, 0, s>>>(b, gp, gvec, scale, o[0], o[1], o[2], o[3]);
  else if (vec) bce_bwd_kernel<T, V, false><<<grid, kThreads, 0, s>>>(b, gp, gvec, scale, o[0], o[1], o[2], o[3]);
  else bce_bwd_kernel<T, 1, false><<<grid, kThreads, 0, s>>>(b, gp, gvec, scale, o[0], o[1], o[2], o[3]);
  return em_launch_check("binary_cross_entropy_with_logits backward");
}

bool same_dtype(em_dtype dt, const em_tensor *const *ts, int n) {
  for (int k = 0; k < n; k++)
    if (ts[k] && ts[k]->dtype != dt) return false;
  return true;
}

}  // namespace

extern "C" int em_bce_fwd_cuda(const em_tensor *x, const em_tensor *y, const em_tensor *w, const em_tensor *pw,
                               const em_bce_args *a, em_tensor *out) {
  const em_tensor *ts[5] = {x, y, w, pw, out};
  if (!same_dtype(x->dtype, ts, 5))
    return em_error("binary_cross_entropy_with_logits: internal error: operands of mixed dtypes");
  if (em_use_device(x->device.index, "binary_cross_entropy_with_logits")) return -1;
  switch (x->dtype) {
    case EM_F32: return bce_fwd<float>(x, y, w, pw, a, out);
    case EM_F64: return bce_fwd<double>(x, y, w, pw, a, out);
    case EM_BF16: return bce_fwd<__nv_bfloat16>(x, y, w, pw, a, out);
    case EM_F16: return bce_fwd<__half>(x, y, w, pw, a, out);
    default: return em_error("binary_cross_entropy_with_logits: unsupported dtype %s", em_dtype_name(x->dtype));
  }
}

extern "C" int em_bce_bwd_cuda(const em_tensor *x, const em_tensor *y, const em_tensor *w, const em_tensor *pw,
                               const em_bce_args *a, const em_tensor *g, double scale, em_tensor *gx, em_tensor *gy,
                               em_tensor *gw, em_tensor *gpw) {
  const em_tensor *ts[9] = {x, y, w, pw, g, gx, gy, gw, gpw};
  if (!same_dtype(x->dtype, ts, 9))
    return em_error("binary_cross_entropy_with_logits backward: internal error: operands of mixed dtypes");
  if (em_use_device(x->device.index, "binary_cross_entropy_with_logits backward")) return -1;
  switch (x->dtype) {
    case EM_F32: return bce_bwd<float>(x, y, w, pw, a, g, scale, gx, gy, gw, gpw);
    case EM_F64: return bce_bwd<double>(x, y, w, pw, a, g, scale, gx, gy, gw, gpw);
    case EM_BF16: return bce_bwd<__nv_bfloat16>(x, y, w, pw, a, g, scale, gx, gy, gw, gpw);
    case EM_F16: return bce_bwd<__half>(x, y, w, pw, a, g, scale, gx, gy, gw, gpw);
    default: return em_error("binary_cross_entropy_with_logits: unsupported dtype %s", em_dtype_name(x->dtype));
  }
}
