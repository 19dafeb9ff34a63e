/* RMSNorm: y = x · rstd · w with rstd = 1/sqrt(mean(x², -1) + eps), per row
 * of D, and its backward
 *   xhat = x·rstd, u = gy·w, gx = rstd·(u − xhat·mean(u·xhat)), gw = Σ_rows gy·xhat.
 *
 * Cost: forward ~4 FLOPs per element, reads x (and w, cached) and writes y:
 * 2·N·D·sizeof(T) bytes, memory bound: (2048 x 1600) bf16 is 13 MB, ~4.4 us
 * at 3 TB/s, so launch latency matters as much as bandwidth. Backward reads
 * x and gy, writes gx (3·N·D·sizeof(T)) plus a small (blocks x D) f32 partial.
 *
 * Launch: forward, one warp per row (8 rows per 256-thread block), 16-byte
 * loads when rows are 16-byte aligned. Rows of up to 32·8 chunks (2048 bf16,
 * 1024 f32) are held in registers, all loads issued up front: one read of x
 * and enough bytes in flight with only ~16 warps per SM (v1 re-read the row
 * from L1 and loaded w one element at a time: 560 GB/s on (2048 x 1600)
 * bf16); longer rows loop and re-read the row from L1. rstd is
 * saved (N values), so backward needs no recomputed reduction. Backward: for
 * rows that fit in registers, one warp per row like the forward (each lane
 * keeps dw of its own columns over its rows, the warps of a block add theirs
 * in order); otherwise one block per group of rows whose threads split D.
 * Either way each block writes a partial row of dw; the row-group kernel sums
 * the partials itself (finish_dw: the last 64-132 blocks to finish each add
 * a slice of the columns over all partial rows, counted in a per-stream or
 * per-graph ticket word the kernel leaves ready: no memset, no second
 * launch), the block kernel with a second kernel; EMBER_RMSNORM_BWD_DW=cluster
 * (cluster_dw): clusters of 8 blocks add their rows through distributed
 * shared memory and the last block of each column slice adds the clusters'
 * rows, nobody waiting. Fixed order everywhere: dw is bit-reproducible.
 *
 * Numerics: f32 math (f64 for f64 x) whatever the storage dtype, one rounding
 * on store; w may have another float dtype than x (f32 weights, bf16 acts).
 * out_dtype (engine/ops/norm.c em_rmsnorm_out): for f32 rows the forward
 * stores y as bf16/f16 (TY), the backward reads a bf16/f16 gy (TG, widened
 * exactly) and, for add_rmsnorm's bf16/f16 r, stores r's gradient beside gx
 * (TR: gx's final values rounded once, what a cast after would give); each
 * defaults to the existing instantiations, whose code is unchanged. */
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <cooperative_groups.h>
#include "common.cuh"
#include "dtype_io.cuh"
#include "backend.h"
#include "runtime.h"

#define FWD_THREADS 256
#define BWD_THREADS 256

using acc::acc_t;   /* common.cuh */
using acc::ld;
using acc::st;

template <typename C> __device__ __forceinline__ C warp_allsum(C v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Block-wide sum in a fixed order; every thread gets it. shared holds 32 values. */
template <typename C> __device__ __forceinline__ C block_allsum(C v, C *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_allsum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nw ? shared[lane] : (C)0;
  return warp_allsum(v);
}

__device__ __forceinline__ float rsqrt_exact(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double rsqrt_exact(double x) { return 1.0 / sqrt(x); }

/* ---------------- forward ---------------- */

/* w[j .. j+N) as compute type: 16-byte loads when w is aligned and N weights fill whole chunks. */
template <typename C, typename TW, int N>
__device__ __forceinline__ void load_w(const TW *w, int64_t j, bool wvec, C *out) {
  if (!w) {
#pragma unroll
    for (int k = 0; k < N; k++) out[k] = (C)1;
    return;
  }
  constexpr int WV = 16 / sizeof(TW);
  if constexpr (N % WV == 0) {
    if (wvec) {
#pragma unroll
      for (int c = 0; c < N / WV; c++) {
        Packed128<TW> q = load128(w + j + c * WV);
#pragma unroll
        for (int k = 0; k < WV; k++) out[c * WV + k] = ld<C>(q[k]);
      }
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < N; k++) out[k] = ld<C>(w[j + k]);
}

/* VEC elements of T in one load (8 bytes for 4 bf16): r's chunk beside x's. */
template <typename T, int N> struct alignas(sizeof(T) * N) VecN { T v[N]; };

/* VEC results of a row chunk stored at y: one 16-byte store in x's dtype, or
 * VEC·2 bytes for a bf16/f16 y of f32 rows (out_dtype: rounded once from C). */
template <typename TX, typename TY, typename C, int VEC>
__device__ __forceinline__ void store_y(TY *y, const C (&v)[VEC]) {
  if constexpr (std::is_same<TX, TY>::value) {
    Packed128<TX> q;
#pragma unroll
    for (int k = 0; k < VEC; k++) q[k] = st<TX>(v[k]);
    store128(y, q);
  } else {
    VecN<TY, VEC> q;
#pragma unroll
    for (int k = 0; k < VEC; k++) q.v[k] = st<TY>(v[k]);
    *reinterpret_cast<VecN<TY, VEC> *>(y) = q;
  }
}

/* One warp per row with the row held in registers: NV 16-byte chunks per lane
 * (D <= 32·NV·VEC), all loads issued before the first use, one read of x.
 * TR not void (add_rmsnorm): the row is s = x + r, added as the add kernel
 * does (in C) and stored to s, then normed exactly as x would be. TY: y's
 * dtype, x's or (f32 x) bf16/f16. */
template <typename TX, typename TW, int NV, typename TR = void, typename TY = TX>
__global__ void __launch_bounds__(FWD_THREADS) rms_fwd_reg_kernel(const TX *__restrict__ x, const TW *__restrict__ w,
                                                                  int64_t N, int64_t D, acc_t<TX> eps,
                                                                  TY *__restrict__ y, acc_t<TX> *__restrict__ rstd,
                                                                  bool wvec, const TR *__restrict__ r = nullptr,
                                                                  TX *__restrict__ s = nullptr) {
  using C = acc_t<TX>;
  constexpr int VEC = 16 / sizeof(TX);
  constexpr bool ADD = !std::is_void<TR>::value;
  int lane = threadIdx.x & 31;
  int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5, nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t i = warp; i < N; i += nwarps) {
    const TX *xr = x + i * D;
    TY *yr = y + i * D;
    uint4 buf[NV];                                      /* raw words: a bf16 chunk in 4 registers, not 8 */
#pragma unroll
    for (int v = 0; v < NV; v++) {
      int64_t j = (int64_t)(lane + v * 32) * VEC;
      if (j < D) buf[v] = *reinterpret_cast<const uint4 *>(xr + j);
    }
    if constexpr (ADD) {
      using TRL = typename std::conditional<ADD, TR, char>::type;
      VecN<TRL, VEC> rb[NV];
#pragma unroll
      for (int v = 0; v < NV; v++) {
        int64_t j = (int64_t)(lane + v * 32) * VEC;
        if (j < D) rb[v] = *reinterpret_cast<const VecN<TRL, VEC> *>(r + i * D + j);
      }
#pragma unroll
      for (int v = 0; v < NV; v++) {
        int64_t j = (int64_t)(lane + v * 32) * VEC;
        if (j < D) {
          Packed128<TX> q;
#pragma unroll
          for (int k = 0; k < VEC; k++) q[k] = st<TX>(raw_elem<C, TX>(buf[v], k) + ld<C>(rb[v].v[k]));
          store128(s + i * D + j, q);
          buf[v] = *reinterpret_cast<const uint4 *>(&q);
        }
      }
    }
    C ss = 0;
#pragma unroll
    for (int v = 0; v < NV; v++) {
      int64_t j = (int64_t)(lane + v * 32) * VEC;
      if (j < D) {
#pragma unroll
        for (int k = 0; k < VEC; k++) { C e = raw_elem<C, TX>(buf[v], k); ss += e * e; }
      }
    }
    ss = warp_allsum(ss);
    C r = rsqrt_exact(ss / (C)D + eps);
    if (lane == 0) rstd[i] = r;
#pragma unroll
    for (int v = 0; v < NV; v++) {
      int64_t j = (int64_t)(lane + v * 32) * VEC;
      if (j < D) {
        C wv[VEC], o[VEC];
        load_w<C, TW, VEC>(w, j, wvec, wv);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
          C e = raw_elem<C, TX>(buf[v], k) * r;
          o[k] = w ? e * wv[k] : e;
        }
        store_y<TX>(yr + j, o);
      }
    }
  }
}

template <typename TX, typename TW, typename TY = TX>
__global__ void __launch_bounds__(FWD_THREADS) rms_fwd_kernel(const TX *x, const TW *w, int64_t N, int64_t D,
                                                              acc_t<TX> eps, TY *y, acc_t<TX> *rstd, bool vec,
                                                              bool wvec) {
  using C = acc_t<TX>;
  constexpr int VEC = 16 / sizeof(TX);
  int lane = threadIdx.x & 31;
  int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5, nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t i = warp; i < N; i += nwarps) {
    const TX *xr = x + i * D;
    TY *yr = y + i * D;
    C ss = 0;
    if (vec) {
      for (int64_t j = lane * VEC; j < D; j += 32 * VEC) {
        Packed128<TX> p = load128(xr + j);
#pragma unroll
        for (int k = 0; k < VEC; k++) { C v = ld<C>(p[k]); ss += v * v; }
      }
    } else {
      for (int64_t j = lane; j < D; j += 32) { C v = ld<C>(xr[j]); ss += v * v; }
    }
    ss = warp_allsum(ss);
    C r = rsqrt_exact(ss / (C)D + eps);
    if (lane == 0) rstd[i] = r;
    if (vec) {
      for (int64_t j = lane * VEC; j < D; j += 32 * VEC) {
        Packed128<TX> p = load128(xr + j);
        C wv[VEC], o[VEC];
        load_w<C, TW, VEC>(w, j, wvec, wv);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
          C v = ld<C>(p[k]) * r;
          o[k] = w ? v * wv[k] : v;
        }
        store_y<TX>(yr + j, o);
      }
    } else {
      for (int64_t j = lane; j < D; j += 32) {
        C v = ld<C>(xr[j]) * r;
        yr[j] = st<TY>(w ? v * ld<C>(w[j]) : v);
      }
    }
  }
}

template <typename TX, typename TW, typename TY = TX>
static void launch_fwd(const em_tensor *x, const em_tensor *w, double eps, em_tensor *y, em_tensor *rstd,
                       cudaStream_t s) {
  int64_t D = x->shape[x->ndim - 1], N = D ? em_numel(x) / D : 0;
  const TX *xp = (const TX *)em_data_ptr(x);
  TY *yp = (TY *)em_data_ptr(y);
  constexpr uintptr_t YA = 16 / sizeof(TX) * sizeof(TY);   /* bytes of y a 16-byte chunk of x makes */
  bool vec = (D * (int64_t)sizeof(TX)) % 16 == 0 && ((uintptr_t)xp & 15) == 0 && ((uintptr_t)yp % YA) == 0;
  const TW *wp = w ? (const TW *)em_data_ptr(w) : nullptr;
  bool wvec = wp && ((uintptr_t)wp & 15) == 0;
  acc_t<TX> *rp = (acc_t<TX> *)em_data_ptr(rstd);
  int64_t rows_per_block = FWD_THREADS / 32, blocks = (N + rows_per_block - 1) / rows_per_block;
  int64_t cap = (int64_t)em_sm_count(x->device.index) * 64;
  if (blocks > cap) blocks = cap;
  unsigned grid = (unsigned)(blocks < 1 ? 1 : blocks);
  int64_t chunks = vec ? (D / (16 / (int64_t)sizeof(TX)) + 31) / 32 : 0;   /* 16-byte chunks per lane */
  if (vec && chunks <= 1) rms_fwd_reg_kernel<TX, TW, 1, void, TY><<<grid, FWD_THREADS, 0, s>>>(xp, wp, N, D, (acc_t<TX>)eps, yp, rp, wvec);
  else if (vec && chunks <= 2) rms_fwd_reg_kernel<TX, TW, 2, void, TY><<<grid, FWD_THREADS, 0, s>>>(xp, wp, N, D, (acc_t<TX>)eps, yp, rp, wvec);
  else if (vec && chunks <= 4) rms_fwd_reg_kernel<TX, TW, 4, void, TY><<<grid, FWD_THREADS, 0, s>>>(xp, wp, N, D, (acc_t<TX>)eps, yp, rp, wvec);
  else if (vec && chunks <= 8) rms_fwd_reg_kernel<TX, TW, 8, void, TY><<<grid, FWD_THREADS, 0, s>>>(xp, wp, N, D, (acc_t<TX>)eps, yp, rp, wvec);
  else rms_fwd_kernel<TX, TW, TY><<<grid, FWD_THREADS, 0, s>>>(xp, wp, N, D, (acc_t<TX>)eps, yp, rp, vec, wvec);
}

extern "C" int em_rmsnorm_fwd_cuda(const em_tensor *x, const em_tensor *w, double eps, em_tensor *y,
                                   em_tensor *rstd) {
  int64_t D = x->shape[x->ndim - 1];
  if (em_numel(x) == 0) {
    /* D == 0: rstd = 1/sqrt(0/0 + eps) = NaN per row, as the CPU computes; nothing else to write */
    if (em_numel(rstd) == 0 || D != 0) return 0;
    return em_error("rmsnorm: rows of length 0 are not supported on CUDA");
  }
  cudaStream_t s = em_cur_stream(x->device.index);
  em_dtype wt = w ? w->dtype : x->dtype;
  if (y->dtype != x->dtype) {                 /* out_dtype: f32 rows (f32 or no weight), a bf16/f16 y */
    if (x->dtype != EM_F32 || wt != EM_F32 || (y->dtype != EM_BF16 && y->dtype != EM_F16))
      return em_error("rmsnorm: a %s y needs f32 x and weight on CUDA, got x %s, weight %s", em_dtype_name(y->dtype),
                      em_dtype_name(x->dtype), em_dtype_name(wt));
    if (y->dtype == EM_BF16) launch_fwd<float, float, __nv_bfloat16>(x, w, eps, y, rstd, s);
    else launch_fwd<float, float, __half>(x, w, eps, y, rstd, s);
    return em_launch_check("rmsnorm");
  }
  EM_DISPATCH_FLOAT(x->dtype, TX, { EM_DISPATCH_FLOAT(wt, TW, launch_fwd<TX, TW>(x, w, eps, y, rstd, s)); });
  return em_launch_check("rmsnorm");
}

/* ---------------- add_rmsnorm forward ----------------
 * s = x + r and y = rmsnorm(s, w) in one pass for f32 rows that fit the
 * register kernel: x (4 B) and r (2 B under autocast) read, s (4 B) and y
 * (4 B) written, 14 B an element where the add kernel and the norm moved 22
 * (x, r read, s written; s read, y written), and one launch instead of two.
 * Other shapes (and f64) take s = x + r here, then the plain forward on s. */

template <typename TX, typename TR>
__global__ void add_rows_kernel(const TX *__restrict__ x, const TR *__restrict__ r, int64_t n, TX *__restrict__ s) {
  using C = acc_t<TX>;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    s[i] = st<TX>(ld<C>(x[i]) + ld<C>(r[i]));
}

template <typename TX, typename TR, typename TY = TX>
static void launch_add_fwd(const em_tensor *x, const em_tensor *r, const em_tensor *w, double eps, em_tensor *s,
                           em_tensor *y, em_tensor *rstd, cudaStream_t st_) {
  int64_t D = x->shape[x->ndim - 1], N = em_numel(x) / D;
  const TX *xp = (const TX *)em_data_ptr(x);
  const TR *rp = (const TR *)em_data_ptr(r);
  TX *sp = (TX *)em_data_ptr(s);
  TY *yp = (TY *)em_data_ptr(y);
  constexpr int VEC = 16 / sizeof(TX);
  bool vec = std::is_same<TX, float>::value && D % VEC == 0 && ((uintptr_t)xp & 15) == 0 &&
             ((uintptr_t)yp % (VEC * sizeof(TY))) == 0 && ((uintptr_t)sp & 15) == 0 &&
             ((uintptr_t)rp % (VEC * sizeof(TR))) == 0;
  int64_t chunks = vec ? (D / VEC + 31) / 32 : 0;
  if (!vec || chunks > 8) {                /* two passes: the add, then rmsnorm's own forward on s */
    int64_t n = em_numel(x), blocks = (n + 255) / 256, cap = (int64_t)em_sm_count(x->device.index) * 16;
    add_rows_kernel<TX, TR><<<(unsigned)(blocks < cap ? blocks : cap), 256, 0, st_>>>(xp, rp, n, sp);
    launch_fwd<TX, TX, TY>(s, w, eps, y, rstd, st_);
    return;
  }
  if constexpr (std::is_same<TX, float>::value) {
    const float *wp = w ? (const float *)em_data_ptr(w) : nullptr;
    bool wvec = wp && ((uintptr_t)wp & 15) == 0;
    float *rs = (float *)em_data_ptr(rstd);
    int64_t blocks = (N + FWD_THREADS / 32 - 1) / (FWD_THREADS / 32), cap = (int64_t)em_sm_count(x->device.index) * 64;
    unsigned grid = (unsigned)(blocks > cap ? cap : (blocks < 1 ? 1 : blocks));
    float e = (float)eps;
#define ADD_RMS(NV) rms_fwd_reg_kernel<float, float, NV, TR, TY><<<grid, FWD_THREADS, 0, st_>>>(xp, wp, N, D, e, yp, rs, wvec, rp, sp)
    if (chunks <= 1) ADD_RMS(1);
    else if (chunks <= 2) ADD_RMS(2);
    else if (chunks <= 4) ADD_RMS(4);
    else ADD_RMS(8);
#undef ADD_RMS
  }
}

extern "C" int em_add_rmsnorm_fwd_cuda(const em_tensor *x, const em_tensor *r, const em_tensor *w, double eps,
                                       em_tensor *s, em_tensor *y, em_tensor *rstd) {
  if (em_numel(x) == 0 || x->shape[x->ndim - 1] == 0) return em_error("add_rmsnorm: expected non-empty rows on CUDA");
  cudaStream_t st_ = em_cur_stream(x->device.index);
  if (y->dtype != x->dtype) {                 /* out_dtype: f32 x, a bf16/f16 y */
    if (x->dtype != EM_F32 || (y->dtype != EM_BF16 && y->dtype != EM_F16))
      return em_error("add_rmsnorm: a %s y needs f32 x on CUDA, got %s", em_dtype_name(y->dtype),
                      em_dtype_name(x->dtype));
    bool bf = y->dtype == EM_BF16;
    switch (r->dtype) {
      case EM_F32:
        if (bf) launch_add_fwd<float, float, __nv_bfloat16>(x, r, w, eps, s, y, rstd, st_);
        else launch_add_fwd<float, float, __half>(x, r, w, eps, s, y, rstd, st_);
        break;
      case EM_BF16:
        if (bf) launch_add_fwd<float, __nv_bfloat16, __nv_bfloat16>(x, r, w, eps, s, y, rstd, st_);
        else launch_add_fwd<float, __nv_bfloat16, __half>(x, r, w, eps, s, y, rstd, st_);
        break;
      case EM_F16:
        if (bf) launch_add_fwd<float, __half, __nv_bfloat16>(x, r, w, eps, s, y, rstd, st_);
        else launch_add_fwd<float, __half, __half>(x, r, w, eps, s, y, rstd, st_);
        break;
      default: return em_error("add_rmsnorm: r of dtype %s does not promote to f32", em_dtype_name(r->dtype));
    }
    return em_launch_check("add_rmsnorm");
  }
  if (x->dtype == EM_F32) {
    switch (r->dtype) {
      case EM_F32: launch_add_fwd<float, float>(x, r, w, eps, s, y, rstd, st_); break;
      case EM_BF16: launch_add_fwd<float, __nv_bfloat16>(x, r, w, eps, s, y, rstd, st_); break;
      case EM_F16: launch_add_fwd<float, __half>(x, r, w, eps, s, y, rstd, st_); break;
      default: return em_error("add_rmsnorm: r of dtype %s does not promote to f32", em_dtype_name(r->dtype));
    }
  } else if (x->dtype == EM_F64) {
    EM_DISPATCH_FLOAT(r->dtype, TR, launch_add_fwd<double, TR>(x, r, w, eps, s, y, rstd, st_));
  } else {
    return em_error("add_rmsnorm: expected x f32 or f64 on the fused path, got %s", em_dtype_name(x->dtype));
  }
  return em_launch_check("add_rmsnorm");
}

/* ---------------- backward ---------------- */

/* dynamic shared memory: D accumulators of dw (when w needs a grad). TG:
 * gy's dtype, x's or (f32 x) bf16/f16, widened exactly on load. */
template <typename TX, typename TW, typename TG = TX, typename TR = void>
__global__ void __launch_bounds__(BWD_THREADS) rms_bwd_kernel(const TX *x, const TW *w, const acc_t<TX> *rstd,
                                                              const TG *gy, int64_t N, int64_t D, TX *gx,
                                                              acc_t<TX> *dw_part, bool gx_acc, void *grad_r = nullptr) {
  using C = acc_t<TX>;
  extern __shared__ __align__(16) unsigned char smem[];
  C *dw = (C *)smem;
  __shared__ C red[32];
  if (dw_part)
    for (int64_t j = threadIdx.x; j < D; j += BWD_THREADS) dw[j] = 0;
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const TX *xr = x + i * D;
    const TG *gr = gy + i * D;
    C r = rstd[i], dot = 0;
    for (int64_t j = threadIdx.x; j < D; j += BWD_THREADS) {
      C u = ld<C>(gr[j]) * (w ? ld<C>(w[j]) : (C)1);
      dot += u * (ld<C>(xr[j]) * r);
    }
    C c = block_allsum(dot, red) / (C)D;
    for (int64_t j = threadIdx.x; j < D; j += BWD_THREADS) {
      C g = ld<C>(gr[j]), xh = ld<C>(xr[j]) * r;
      if (gx) {
        C d = r * (g * (w ? ld<C>(w[j]) : (C)1) - xh * c);
        const TX o = st<TX>(gx_acc ? ld<C>(gx[i * D + j]) + d : d);
        gx[i * D + j] = o;
        if constexpr (!std::is_void<TR>::value) static_cast<TR *>(grad_r)[i * D + j] = st<TR>(ld<C>(o));
      }
      if (dw_part) dw[j] += g * xh;
    }
  }
  if (dw_part)
    for (int64_t j = threadIdx.x; j < D; j += BWD_THREADS) dw_part[blockIdx.x * D + j] = dw[j];
}

/* The weight gradient's sum over the blocks' partial rows, inside the
 * backward kernel (no second launch) and spread over nred blocks: each block,
 * its partial row written, takes a ticket; the last nred to do so wait until
 * every block has one, then each adds a slice of the columns (16-byte chunks
 * [q·C/nred, (q+1)·C/nred) of C) over all nb partial rows: thread t takes
 * chunk t % w of a window of w chunks and rows p, p + R, p + 2R, ... (p = t /
 * w, R = 256 / w phases), in row order with UNR loads in flight, and the R
 * phase sums of a chunk are added by a fixed binary tree in shared memory.
 * Every order depends on (nb, D, nred) alone, whatever order the blocks
 * finish in: gw is bit-reproducible. Waiting cannot deadlock: at most nred -
 * 1 blocks wait, nred is at most half the blocks the GPU holds at once (and
 * at most the SMs), and every block still to finish has a slot to run in
 * once the rest have left.
 * The ticket is one 64-bit word (counters.cu's EM_STREAM_TICKET: low half
 * zero at launch, high half a generation), as cooperative groups' grid
 * barrier: a block's ticket is the low half of its atomicAdd's old value;
 * the last block (ticket nb - 1) adds 2^32 - nb in the same word, which
 * clears the low half for the next launch and advances the generation, and
 * goes straight on (it has seen every ticket); the other reducers poll until
 * the generation differs from the one their own ticket returned. So the
 * word is left ready by the one add, with no second counter of finished
 * reducers and no reset at the end (v3 polled a ticket count, and the last
 * reducer to finish counted itself in a second word and then cleared both:
 * two more dependent L2 trips on the critical path).
 * Why: the tail runs after the last row tile with most SMs idle, so its
 * cost is its chain of dependent L2 trips (~0.7 µs each). v2 (the last block
 * of each group of 16 added the group's rows, then the last group alone
 * added the group sums over all D columns) was ~28 trips at D 1600: ncu on
 * an H100 (fd5f411) saw the SMs idle for 31k of 114k cycles of the (8192,
 * 1600) f32 backward (72 µs) and 38k of 95k of bf16 (60 µs). Here: one
 * fence, a ticket, a poll, and ceil(rows a thread / UNR) trips of loads,
 * which the host makes one where the SMs allow (bwd_reducers: (2048, 768)
 * f32 512 rows x 192 chunks on 96 blocks, 2 chunks a block, 128 phases, 4
 * rows a thread, 4 in flight). */
constexpr int DW_RED_MAX = 64;
/* partial rows in flight a thread in finish_dw: as many as the main loop's
 * registers leave room for at each configuration's blocks-an-SM step */
__host__ __device__ constexpr int dw_unr(int nv, bool hold) { return nv >= 4 || (hold && nv == 2) ? 8 : nv == 3 ? 4 : 2; }
/* 16 bytes another block wrote, read at L2 (not a stale L1 line) */
template <typename C> __device__ __forceinline__ Packed128<C> ldcg128(const C *p) {
  const float4 f = __ldcg(reinterpret_cast<const float4 *>(p));
  Packed128<C> r;
  memcpy(&r, &f, 16);
  return r;
}
__device__ __forceinline__ unsigned long long ld_acquire_u64(const unsigned long long *p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}
/* gw[c·PS .. ) for the 16-byte chunks [c0, c1) of C: the sum of nb partial
 * rows of `part`, every thread of the block taking part (finish_dw's layout:
 * chunk t % w of a window of w, rows p, p + R, ... in row order with UNR in
 * flight, the R phase sums added by a fixed binary tree). The order depends
 * on (nb, D, c0, c1) alone. */
template <typename C, typename TW, int UNR>
__device__ void sum_rows_slice(const C *part, int nb, int64_t D, int64_t c0, int64_t c1, TW *gw) {
  __shared__ Packed128<C> red[BWD_THREADS];
  constexpr int PS = 16 / sizeof(C);
  const int t = threadIdx.x;
  for (int64_t cw = c0; cw < c1; cw += BWD_THREADS) {
    const int w = c1 - cw < BWD_THREADS ? (int)(c1 - cw) : BWD_THREADS, R = BWD_THREADS / w;
    const int ph = t / w;
    const int64_t c = cw + t % w;
    Packed128<C> s;
#pragma unroll
    for (int k = 0; k < PS; k++) s[k] = 0;
    if (ph < R) {
      const C *p = part + (int64_t)ph * D + c * PS;
      const int64_t step = (int64_t)R * D;
      for (int r = ph; r < nb; r += UNR * R) {        /* UNR rows in flight, added in row order */
        Packed128<C> v[UNR];
#pragma unroll
        for (int u = 0; u < UNR; u++)
          if (r + u * R < nb) v[u] = ldcg128(p + u * step);
#pragma unroll
        for (int u = 0; u < UNR; u++)
          if (r + u * R < nb)
#pragma unroll
            for (int k = 0; k < PS; k++) s[k] += v[u][k];
        p += UNR * step;
      }
    }
    red[t] = s;
    __syncthreads();
    for (int h = 1; h < R; h <<= 1) {                 /* phases p and p + h, p a multiple of 2h: a fixed tree */
      if (ph < R && ph % (2 * h) == 0 && ph + h < R)
#pragma unroll
        for (int k = 0; k < PS; k++) red[t][k] += red[t + h * w][k];
      __syncthreads();
    }
    if (ph == 0)
#pragma unroll
      for (int k = 0; k < PS; k++) gw[c * PS + k] = st<TW>(red[t][k]);
    __syncthreads();
  }
}

template <typename C, typename TW, int UNR>
__device__ void finish_dw(const C *part, int64_t D, unsigned long long *word, int nred, TW *gw) {
  __shared__ int ticket_s;
  constexpr int PS = 16 / sizeof(C);
  const int nb = (int)gridDim.x, t = threadIdx.x;
  __syncthreads();                                    /* every thread's partial-row stores, then one fence */
  if (t == 0) {
    __threadfence();                                  /* cumulative over the barrier: the block's row, visible before its ticket */
    const unsigned long long old = atomicAdd(word, 1ull);
    const int tk = (int)(unsigned)old;
    if (tk == nb - 1) atomicAdd(word, (1ull << 32) - (unsigned long long)nb);   /* low half 0, generation + 1 */
    else if (tk >= nb - nred)
      while ((ld_acquire_u64(word) >> 32) == (old >> 32)) __nanosleep(100);
    ticket_s = tk;
  }
  __syncthreads();
  const int q = ticket_s - (nb - nred);               /* the last nred blocks reduce */
  if (q < 0) return;
  __threadfence();
  const int64_t chunks = D / PS;
  sum_rows_slice<C, TW, UNR>(part, nb, D, chunks * q / nred, chunks * (q + 1) / nred, gw);
}

/* EMBER_RMSNORM_BWD_DW=cluster: the weight gradient's tail without a wait.
 * The grid is launched in clusters of DW_CLUSTER blocks. Each block leaves its
 * partial row (its groups' rows added, as finish_dw's caller does) in its own
 * shared memory; after one cluster barrier, block rank k adds slice k of the
 * columns over the cluster's blocks in rank order, reading their rows through
 * distributed shared memory, and stores that slice of the cluster's partial
 * row (gridDim / DW_CLUSTER rows in all, 8x fewer than finish_dw's). Then it
 * takes a ticket on counter k (one of DW_CLUSTER ints from the stream's
 * zeroed counters): the block that takes the last adds slice k over every
 * cluster's row (sum_rows_slice), writes gw's slice and puts the counter back
 * to zero. The cluster barrier's second half (a block's shared memory must
 * outlive its cluster's reads) is waited for only before the block exits.
 * Nobody polls: no co-residency is needed, and the chain after the last row
 * tile is a cluster barrier, one DSMEM trip, a fence, a ticket (64 arrivals
 * a word at (2048, 768), not 512 on one word) and one trip of L2 loads,
 * where finish_dw has a fence, a ticket, a poll, a second fence, a trip over
 * 8x the partial rows and a 7-level tree. Orders depend on (grid, D) alone:
 * gw is bit-reproducible (other bits than the ticket path's: the clusters'
 * sums come first); x's gradient is the same kernel body's, the same bits. */
constexpr int DW_CLUSTER = 8;
/* Rows in flight a thread in cluster_dw (UNR partial rows at L2; cluster rows over DSMEM: 8, or 4 when
 * UNR is 2): 8 where the main loop's registers leave room, 2 for the 1-2 chunk kernels. ptxas -v (sm_90a):
 * every f32/bf16/f16 configuration of 3-4 chunks, and the HOLD ones of 2, stays at its blocks-an-SM step
 * (the models' rows: <f32, f32, 64, 3, f32, bf16> 64, <.., 128, 4, ..> 79-80, <.., 256, 3, ..> 64); the
 * 32-thread 1-2 chunk kernels (rows of <= 256 f32 / 512 bf16 columns) go from 40-48 to 44-60 registers,
 * one block an SM fewer, with the switch on. 8 makes one trip of loads at (2048, 768) f32: 64 cluster
 * rows, 24-chunk slices, 10 phases, 7 rows a thread. */
__host__ __device__ constexpr int dw_cluster_unr(int nv, bool hold) { return nv >= 3 || hold ? 8 : 2; }
template <typename C, typename TW, int UNR>
__device__ void cluster_dw(const C *row, int64_t D, C *part, int *ctr, TW *gw) {
  constexpr int DSM = UNR >= DW_CLUSTER ? DW_CLUSTER : 4;   /* cluster rows read at once */
  namespace cg = cooperative_groups;
  __shared__ int last_s;
  constexpr int PS = 16 / sizeof(C);
  cg::cluster_group cl = cg::this_cluster();
  const int rank = (int)cl.block_rank(), nclu = (int)(gridDim.x / DW_CLUSTER), cid = (int)(blockIdx.x / DW_CLUSTER);
  const int64_t chunks = D / PS, c0 = chunks * rank / DW_CLUSTER, c1 = chunks * (rank + 1) / DW_CLUSTER;
  cl.sync();                                          /* every block's row in its shared memory */
  for (int64_t c = c0 + threadIdx.x; c < c1; c += BWD_THREADS) {
    Packed128<C> s;
#pragma unroll
    for (int h = 0; h < DW_CLUSTER; h += DSM) {
      Packed128<C> v[DSM];
#pragma unroll
      for (int k = 0; k < DSM; k++) v[k] = cl.map_shared_rank(reinterpret_cast<const Packed128<C> *>(row), h + k)[c];
#pragma unroll
      for (int k = 0; k < DSM; k++)                   /* rank order */
#pragma unroll
        for (int q = 0; q < PS; q++) s[q] = h + k ? s[q] + v[k][q] : v[k][q];
    }
    *reinterpret_cast<Packed128<C> *>(part + (int64_t)cid * D + c * PS) = s;
  }
  cl.barrier_arrive();                                /* this block's remote reads done; waited for before it exits */
  __syncthreads();                                    /* every thread's slice stores, then one fence */
  if (threadIdx.x == 0) {
    __threadfence();                                  /* cumulative over the barrier: the slice, visible before the ticket */
    const bool last = atomicAdd(ctr + rank, 1) == nclu - 1;
    if (last) atomicExch(ctr + rank, 0);              /* every rank-k block has arrived: zero for the next launch */
    last_s = last;
  }
  __syncthreads();
  if (last_s) {
    __threadfence();
    sum_rows_slice<C, TW, UNR>(part, nclu, D, c0, c1, gw);
  }
  cl.barrier_wait();                                  /* no block's shared memory goes while its cluster still reads it */
}

/* Row groups: TPR threads (a multiple of 32) share a row, RPB = 256 / TPR
 * rows per block per step, each thread holding NV 16-byte chunks of x, gy
 * (and of the gx it adds into) in registers, all loads issued before the
 * first use. TPR grows with D so that NV stays <= 4 at every width up to
 * 256·4 chunks (4096 f32, 8192 bf16), and NV is the fewest that cover the
 * row. (v2 was one warp per row with up to 8 chunks and
 * fell to the block-per-row kernel above 1024 f32 columns: 47 us for the xl
 * model's (2048 x 1600) f32 on an H100, ~4x the bandwidth floor.) Every
 * block steps through row tiles in the same number of iterations, so the
 * row dot of a group spanning several warps is added in shared memory behind
 * one block barrier (double-buffered: no second barrier). Each group keeps
 * dw of its rows in its own row of shared memory (each thread its own
 * columns, 16-byte accesses: no barrier; registers would cost 16-32 more a
 * thread and a block an SM); at the end the groups' rows are added in group
 * order per column, in parallel over columns, the block writes its
 * partial row, and finish_dw sums the partial rows: deterministic, no
 * atomics on values (a counter per group of blocks). */
template <typename TX, typename TW, int TPR, int NV, bool HOLD_ = (sizeof(TX) == 2 && NV <= 2), typename TG = TX,
          typename TR = void, bool CLU = false>
__global__ void __launch_bounds__(BWD_THREADS) rms_bwd_rg_kernel(const TX *__restrict__ x, const TW *__restrict__ w,
                                                                 const acc_t<TX> *__restrict__ rstd,
                                                                 const TG *__restrict__ gy, int64_t N, int64_t D,
                                                                 TX *__restrict__ gx, acc_t<TX> *__restrict__ dw_part,
                                                                 bool wvec, bool gx_acc, unsigned long long *ticket,
                                                                 int nred, TW *gw, void *grad_r = nullptr,
                                                                 int *dw_ctr = nullptr) {
  using C = acc_t<TX>;
  constexpr int VEC = 16 / sizeof(TX), RPB = BWD_THREADS / TPR, WPR = TPR / 32;
  constexpr bool HOLD = HOLD_;
  /* gy's chunk of VEC elements: 16 bytes in x's dtype, or 8 (bf16/f16 gy of f32 x), element k widened exactly */
  constexpr bool GSAME = std::is_same<TG, TX>::value;
  static_assert(GSAME || (std::is_same<TX, float>::value && sizeof(TG) == 2), "gy: x's dtype, or 16-bit for f32 x");
  using GB = typename std::conditional<GSAME, uint4, uint2>::type;
  auto gel = [](const GB &g, int k) -> C {
    if constexpr (GSAME) return raw_elem<C, TX>(g, k);
    else return raw_elem<C, TG>(make_uint4(g.x, g.y, 0u, 0u), k);
  };
  extern __shared__ __align__(16) unsigned char smem[];
  C *dw = (C *)smem;                                    /* RPB x D: each group's column sums */
  __shared__ C red[2][RPB][WPR];
  const int t = threadIdx.x % TPR, grp = threadIdx.x / TPR, lane = threadIdx.x & 31, wig = t >> 5;
  /* this thread's dw columns of its group's row in shared memory, 16 bytes at a time */
  constexpr int NP = VEC * sizeof(C) / 16, PS = 16 / sizeof(C);
  auto dwp = [&](int64_t j) { return reinterpret_cast<Packed128<C> *>(dw + grp * D + j); };
  if (dw_part)
#pragma unroll
    for (int v = 0; v < NV; v++) {
      int64_t j = (int64_t)(t + v * TPR) * VEC;
      if (j < D)
#pragma unroll
        for (int p = 0; p < NP; p++)
#pragma unroll
          for (int q = 0; q < PS; q++) dwp(j)[p][q] = 0;
    }
  int par = 0;
  for (int64_t base = blockIdx.x * (int64_t)RPB; base < N; base += (int64_t)gridDim.x * RPB, par ^= 1) {
    const int64_t i = base + grp;
    const bool row = i < N;
    const TX *xr = x + i * D;
    const TG *gr = gy + i * D;
    uint4 bx[NV], bp[NV];                               /* raw words: a bf16 chunk in 4 registers, not 8 */
    GB bg[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) {
      int64_t j = (int64_t)(t + v * TPR) * VEC;
      if (row && j < D) {
        bx[v] = *reinterpret_cast<const uint4 *>(xr + j);
        bg[v] = *reinterpret_cast<const GB *>(gr + j);
        if (gx_acc) bp[v] = *reinterpret_cast<const uint4 *>(gx + i * D + j);
      }
    }
    const C r = row ? rstd[i] : (C)0;
    /* HOLD: u = gy·w and x as f32, kept from the dot pass for the gx pass
     * (2 registers an element, so 16-bit rows of at most 2 chunks a thread):
     * w is read and each element unpacked once a row, not twice. Otherwise
     * recomputed from the raw words. Same expressions either way: same bits. */
    C uh[HOLD ? NV : 1][VEC], xf[HOLD ? NV : 1][VEC];
    C dot = 0;
#pragma unroll
    for (int v = 0; v < NV; v++) {
      int64_t j = (int64_t)(t + v * TPR) * VEC;
      if (row && j < D) {
        C wv[VEC];
        load_w<C, TW, VEC>(w, j, wvec, wv);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
          const C u = gel(bg[v], k) * wv[k], xe = raw_elem<C, TX>(bx[v], k);
          dot += u * xe;
          if constexpr (HOLD) { uh[v][k] = u; xf[v][k] = xe; }
        }
      }
    }
    dot = warp_allsum(dot);
    if constexpr (WPR > 1) {                            /* the group's warps, added in warp order */
      if (lane == 0) red[par][grp][wig] = dot;
      __syncthreads();
      dot = 0;
#pragma unroll
      for (int k = 0; k < WPR; k++) dot += red[par][grp][k];
    }
    if (!row) continue;
    /* gx = r·(gy·w − x̂·c) with x̂ = x·r and c = mean(gy·w·x̂) = r·dot / D,
     * as gx = r·(gy·w) − (r²·c)·x: one multiply and one FMA an element on
     * top of gy·w (the bf16 loop is bound by instruction issue, ncu) */
    const C c = r * dot / (C)D, b = r * r * c;
#pragma unroll
    for (int v = 0; v < NV; v++) {
      int64_t j = (int64_t)(t + v * TPR) * VEC;
      if (j < D) {
        /* gy·w and x of element k: held, or recomputed from the raw words (w reloaded) */
        C wv[VEC];
        if constexpr (!HOLD) load_w<C, TW, VEC>(w, j, wvec, wv);
        auto u = [&](int k) { if constexpr (HOLD) return uh[v][k]; else return gel(bg[v], k) * wv[k]; };
        auto xe = [&](int k) { if constexpr (HOLD) return xf[v][k]; else return raw_elem<C, TX>(bx[v], k); };
        if (gx) {
          Packed128<TX> q;
#pragma unroll
          for (int k = 0; k < VEC; k++) {
            C d = r * u(k) - b * xe(k);
            q[k] = st<TX>(gx_acc ? raw_elem<C, TX>(bp[v], k) + d : d);
          }
          store128(gx + i * D + j, q);
          if constexpr (!std::is_void<TR>::value) {       /* r's gradient: the same values in r's dtype */
            using TRL = typename std::conditional<std::is_void<TR>::value, char, TR>::type;
            VecN<TRL, VEC> o;
#pragma unroll
            for (int k = 0; k < VEC; k++) o.v[k] = st<TRL>(ld<C>(q[k]));
            *reinterpret_cast<VecN<TRL, VEC> *>(static_cast<TRL *>(grad_r) + i * D + j) = o;
          }
        }
        if (dw_part)
#pragma unroll
          for (int p = 0; p < NP; p++) {
            Packed128<C> a = dwp(j)[p];
#pragma unroll
            for (int q = 0; q < PS; q++) a[q] += gel(bg[v], p * PS + q) * (xe(p * PS + q) * r);
            dwp(j)[p] = a;
          }
      }
    }
  }
  if (!dw_part) return;
  __syncthreads();
  for (int64_t j = threadIdx.x; j < D; j += BWD_THREADS) {
    C s = dw[j];
#pragma unroll
    for (int g = 1; g < RPB; g++) s += dw[g * D + j];
    if constexpr (CLU) dw[j] = s;                     /* the block's row in group 0's, read by its cluster */
    else dw_part[blockIdx.x * D + j] = s;
  }
  if constexpr (CLU) cluster_dw<C, TW, dw_cluster_unr(NV, HOLD)>(dw, D, dw_part, dw_ctr, gw);
  else finish_dw<C, TW, dw_unr(NV, HOLD)>(dw_part, D, ticket, nred, gw);
}

/* gw[j] = sum over blocks of part[b][j]. A block takes 16 columns; its 32
 * thread rows stride over the partial rows and a fixed-order tree in shared
 * memory finishes, so the result is deterministic. Half-warps read 64
 * contiguous bytes (whole sectors) and there are twice the blocks of
 * 32-column tiles: 48 at d = 768, 100 at 1600. (One thread per column
 * walking all ~264 partial rows serially left 3 blocks on the whole GPU at
 * d = 768: 34 µs, more than the rmsnorm backward itself.) */
constexpr int DW_COLS = 16, DW_ROWS = 32;
template <typename C, typename TW>
__global__ void __launch_bounds__(DW_COLS * DW_ROWS) dw_reduce_kernel(const C *part, int64_t blocks, int64_t D, TW *gw) {
  __shared__ C acc[DW_ROWS][DW_COLS + 1];
  const int tx = threadIdx.x % DW_COLS, ty = threadIdx.x / DW_COLS;
  const int64_t j = blockIdx.x * (int64_t)DW_COLS + tx;
  C s = 0;
  if (j < D)
#pragma unroll 4
    for (int64_t b = ty; b < blocks; b += DW_ROWS) s += part[b * D + j];
  acc[ty][tx] = s;
  __syncthreads();
#pragma unroll
  for (int half = DW_ROWS / 2; half > 0; half /= 2) {
    if (ty < half) acc[ty][tx] += acc[ty + half][tx];
    __syncthreads();
  }
  if (ty == 0 && j < D) gw[j] = st<TW>(acc[0][tx]);
}

/* A launch of `grid` 256-thread blocks in clusters of DW_CLUSTER; at: its one attribute's storage. */
static cudaLaunchConfig_t cluster_config(cudaLaunchAttribute *at, unsigned grid, size_t smem, cudaStream_t s) {
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = DW_CLUSTER;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(BWD_THREADS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  return cfg;
}

/* One row-group configuration: its grid fills the GPU once (resident blocks
 * per SM from the occupancy calculator, cached per configuration and shared
 * memory size), which also bounds the partial rows of dw. */
template <typename TX, typename TW, int TPR, int NV, bool HOLD = (sizeof(TX) == 2 && NV <= 2), typename TG = TX,
          typename TR = void>
struct rg_launch {
  static constexpr int unr = dw_unr(NV, HOLD);        /* finish_dw's rows in flight a thread */
  /* per_sm_out: the blocks an SM holds (finish_dw's reducers are sized by it) */
  static int64_t grid(int dev, int64_t N, size_t smem, int *per_sm_out) {
    static int per_sm = 0;
    static size_t for_smem = (size_t)-1;
    if (for_smem != smem) {
      int n = 0;
      /* the occupancy of the x-dtype gy kernel whatever TG: a bf16/f16 gy gets the grid (so the dw
       * partial rows and their sum order) of the same rows with gy widened first, bit for bit */
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, rms_bwd_rg_kernel<TX, TW, TPR, NV, HOLD>, BWD_THREADS, smem) !=
              cudaSuccess || n < 1) {
        cudaGetLastError();
        n = 1;
      }
      per_sm = n;
      for_smem = smem;
    }
    *per_sm_out = per_sm;
    return spread((N + RPB - 1) / RPB, (int64_t)em_sm_count(dev) * per_sm);
  }
  /* EMBER_RMSNORM_BWD_DW=cluster: whole clusters of DW_CLUSTER blocks, as many as the GPU holds at once
   * (cudaOccupancyMaxActiveClusters; the x-dtype gy kernel's, as above), the tiles spread over them */
  static int64_t grid_cluster(int dev, int64_t N, size_t smem) {
    static int clusters = 0;
    static size_t for_smem = (size_t)-1;
    if (for_smem != smem) {
      auto k = rms_bwd_rg_kernel<TX, TW, TPR, NV, HOLD, TX, void, true>;
      cudaLaunchAttribute at[1];
      const cudaLaunchConfig_t cfg = cluster_config(at, DW_CLUSTER, smem, nullptr);
      int n = 0, per_sm = 0;
      if (cudaOccupancyMaxActiveClusters(&n, k, &cfg) != cudaSuccess || n < 1) {
        cudaGetLastError();                            /* no cluster count: the blocks an SM holds, as whole clusters */
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, BWD_THREADS, smem) != cudaSuccess) {
          cudaGetLastError();
          per_sm = 1;
        }
        n = std::max(em_sm_count(dev) * per_sm / DW_CLUSTER, 1);
      }
      clusters = n;
      for_smem = smem;
    }
    const int64_t b = spread((N + RPB - 1) / RPB, (int64_t)clusters * DW_CLUSTER);
    return (b + DW_CLUSTER - 1) / DW_CLUSTER * DW_CLUSTER;   /* at most the cap, itself whole clusters */
  }
  static void run(unsigned grid, size_t smem, cudaStream_t s, const TX *x, const TW *w, const acc_t<TX> *r,
                  const TG *g, int64_t N, int64_t D, TX *gx, acc_t<TX> *part, bool wvec, bool gx_acc,
                  unsigned long long *ticket, int nred, TW *gw, void *gr) {
    rms_bwd_rg_kernel<TX, TW, TPR, NV, HOLD, TG, TR><<<grid, BWD_THREADS, smem, s>>>(x, w, r, g, N, D, gx, part, wvec,
                                                                                    gx_acc, ticket, nred, gw, gr);
  }
  /* the cluster launch (grid a multiple of DW_CLUSTER); 0, or -1 with the error set */
  static int run_cluster(unsigned grid, size_t smem, cudaStream_t s, const TX *x, const TW *w, const acc_t<TX> *r,
                         const TG *g, int64_t N, int64_t D, TX *gx, acc_t<TX> *part, bool wvec, bool gx_acc, TW *gw,
                         void *gr, int *ctr) {
    cudaLaunchAttribute at[1];
    const cudaLaunchConfig_t cfg = cluster_config(at, grid, smem, s);
    const cudaError_t e = cudaLaunchKernelEx(&cfg, rms_bwd_rg_kernel<TX, TW, TPR, NV, HOLD, TG, TR, true>, x, w, r, g, N,
                                             D, gx, part, wvec, gx_acc, (unsigned long long *)nullptr, 0, gw, gr, ctr);
    if (e == cudaSuccess) return 0;
    (void)cudaGetLastError();                          /* reported here, not by the next launch's check */
    return em_error("rmsnorm backward (EMBER_RMSNORM_BWD_DW=cluster): cudaLaunchKernelEx failed: %s",
                    cudaGetErrorString(e));
  }

 private:
  static constexpr int RPB = BWD_THREADS / TPR;
  /* as many tiles per block as one resident wave (cap blocks) needs, spread evenly:
   * 512 tiles on 396 slots run as 256 blocks of 2, not 116 of 2 and 280 of 1 */
  static int64_t spread(int64_t tiles, int64_t cap) {
    const int64_t iters = (tiles + cap - 1) / cap;
    return (tiles + iters - 1) / iters;
  }
};

/* EMBER_RMSNORM_BWD_CHUNKS: the most 16-byte chunks a thread holds for
 * 16-bit rows: "2" (default: u and x held, see HOLD; 78-80 registers, 3
 * blocks an SM), "2r" (2 chunks, recomputed as at 4: 48 registers, 5 blocks
 * an SM) or "4" (the raw words only, recomputed; 80 registers, 3 blocks).
 * Returns 2, 1 for "2r", 4, or -1 (error); read once. A knob to measure the
 * three on a GPU (scripts/rms_bwd_sweep.lua), not a tuning API. */
static int bwd_chunks_16bit() {
  static int most = 0;
  if (!most) {
    const char *env = getenv("EMBER_RMSNORM_BWD_CHUNKS");
    if (!env || !*env || !strcmp(env, "2")) most = 2;
    else if (!strcmp(env, "2r")) most = 1;
    else if (!strcmp(env, "4")) most = 4;
    else return em_error("rmsnorm backward: expected EMBER_RMSNORM_BWD_CHUNKS to be 2, 2r or 4, got '%s'", env);
  }
  return most;
}

/* EMBER_RMSNORM_BWD_DW: the weight gradient's tail of the row-group kernels:
 * "ticket" (default: finish_dw, the last blocks wait and reduce) or
 * "cluster" (cluster_dw: clusters of DW_CLUSTER blocks add their rows through
 * distributed shared memory, the last block of each column slice adds the
 * clusters' rows; no waiting). x's gradient has the same bits either way; gw
 * other bits, each repeatable. Returns 0 ticket, 1 cluster, -1 (error); read once. */
static int bwd_dw_cluster() {
  static int mode = -1;
  if (mode < 0) {
    const char *env = getenv("EMBER_RMSNORM_BWD_DW");
    if (!env || !*env || !strcmp(env, "ticket")) mode = 0;
    else if (!strcmp(env, "cluster")) mode = 1;
    else return em_error("rmsnorm backward: expected EMBER_RMSNORM_BWD_DW to be ticket or cluster, got '%s'", env);
  }
  return mode;
}

/* finish_dw's reducers for nb partial rows of `chunks` 16-byte chunks, unr
 * rows in flight a thread. Default ("trip"): the fewest that give every
 * thread at most unr rows (floor(256 / chunks a reducer) phases x unr >= nb:
 * one trip of loads), at least v3's count below and at most the SMs, half
 * the blocks the GPU holds at once, nb and the chunks: (2048, 768) f32 96
 * (was 64: 2 trips), (8192, 1600) 80, (16384, 4096) 132 (2 trips, was 4).
 * EMBER_RMSNORM_BWD_REDUCERS=64: v3's min(64, half the SMs, nb, chunks),
 * to A/B the two on a GPU. Read once; -1 (error) on another value. */
static int bwd_reducers(int64_t nb, int64_t chunks, int unr, int sms, int per_sm) {
  static int v3 = -1;
  if (v3 < 0) {
    const char *env = getenv("EMBER_RMSNORM_BWD_REDUCERS");
    if (!env || !*env || !strcmp(env, "trip")) v3 = 0;
    else if (!strcmp(env, "64")) v3 = 1;
    else return em_error("rmsnorm backward: expected EMBER_RMSNORM_BWD_REDUCERS to be trip or 64, got '%s'", env);
  }
  const int64_t base = std::min<int64_t>({nb, (int64_t)DW_RED_MAX, chunks, std::max(sms / 2, 1)});
  if (v3) return (int)base;
  const int64_t most = std::min<int64_t>({nb, chunks, (int64_t)sms, std::max<int64_t>((int64_t)sms * per_sm / 2, 1)});
  int64_t n = base;
  while (n < most && BWD_THREADS / ((chunks + n - 1) / n) * (int64_t)unr < nb) n++;
  return (int)n;
}

/* The configurations of launch_bwd (HOLD by its default). */
template <typename TX, typename TW, int TPR, int NV, typename TG, typename TR>
using rg_cfg = rg_launch<TX, TW, TPR, NV, (sizeof(TX) == 2 && NV <= 2), TG, TR>;

/* TR not void: gr (r's gradient of add_rmsnorm, bf16/f16) written beside gx with gx's values, rounded once */
template <typename TX, typename TW, typename TG = TX, typename TR = void>
static int launch_bwd(const em_tensor *x, const em_tensor *w, const em_tensor *rstd, const em_tensor *gy,
                      em_tensor *gx, bool gx_acc, em_tensor *gw, em_tensor *gr, cudaStream_t s) {
  using C = acc_t<TX>;
  int64_t D = x->shape[x->ndim - 1], N = D ? em_numel(x) / D : 0;
  const TX *xp = (const TX *)em_data_ptr(x);
  const TG *gp = (const TG *)em_data_ptr(gy);
  TX *gxp = gx ? (TX *)em_data_ptr(gx) : nullptr;
  const TW *wp = w ? (const TW *)em_data_ptr(w) : nullptr;
  constexpr uintptr_t GA = 16 / sizeof(TX) * sizeof(TG);   /* bytes of gy beside a 16-byte chunk of x */
  void *grp = gr ? em_data_ptr(gr) : nullptr;
  constexpr uintptr_t RA = std::is_void<TR>::value ? 1 : 16 / sizeof(TX) * sizeof(std::conditional_t<std::is_void<TR>::value, char, TR>);
  bool vec = (D * (int64_t)sizeof(TX)) % 16 == 0 && ((uintptr_t)xp & 15) == 0 && ((uintptr_t)gp % GA) == 0 &&
             ((uintptr_t)gxp & 15) == 0 && ((uintptr_t)grp % RA) == 0;
  bool wvec = wp && ((uintptr_t)wp & 15) == 0;
  int64_t chunks = vec ? D / (16 / (int64_t)sizeof(TX)) : 0;    /* 16-byte chunks per row */
  /* threads per row: the fewest that keep <= 4 chunks a thread, and then as
   * few chunks a thread as cover the row (no idle chunk slots: (2048, 768)
   * f32 is 192 chunks, 64 threads x 3, where x 4 left a quarter of the
   * registers unused and 3 blocks an SM). The chunks sit in registers as raw
   * words (bf16 too: 4 registers a chunk, where Packed128<bf16> took 8 and
   * bf16 was held to 2 chunks a thread): 3 chunks 60-64 registers, 4 blocks
   * an SM; 4 chunks 72-74, 3 blocks. Rows past 1024 chunks: the block kernel. */
  int tpr = 0, nv = 0;
  bool hold = true;                                   /* 16-bit rows at <= 2 chunks: the HOLD kernels */
  if (vec) {
    /* 16-bit rows at most 2 chunks a thread (twice the threads a row of
     * 4, where a row fits 256 threads so), with u = gy·w and x held from
     * the dot pass (HOLD): ~15 PTX instructions an element where 4 chunks
     * recomputing them took ~22, at the same 3 blocks an SM (78-80
     * registers). EMBER_RMSNORM_BWD_CHUNKS=2r|4: the recomputing kernels. */
    const int knob = sizeof(TX) == 2 ? bwd_chunks_16bit() : 4;
    if (knob < 0) return -1;
    const int most = knob <= 2 && chunks <= 512 ? 2 : 4;
    hold = knob != 1;
    for (int t = 32; t <= 256 && !tpr; t *= 2)
      if (chunks <= (int64_t)t * most) tpr = t;
    if (tpr) nv = (int)((chunks + tpr - 1) / tpr);  /* 1..4 at 32 threads, 3 or 4 from 64 (2 with most = 2) */
  }
  int dev = x->device.index;
  size_t smem = gw ? (size_t)D * sizeof(C) * (tpr ? BWD_THREADS / tpr : 1) : 0;
  /* calls f with rg_launch<TX, TW, tpr, nv> for the chosen configuration; false for the block kernel */
  auto with_config = [&](auto f) -> bool {
    if constexpr (sizeof(TX) == 2) {
      if (!hold && nv <= 2) {                         /* EMBER_RMSNORM_BWD_CHUNKS=2r */
        if (tpr == 32 && nv == 1) f(rg_launch<TX, TW, 32, 1, false, TG, TR>());
        else if (tpr == 32) f(rg_launch<TX, TW, 32, 2, false, TG, TR>());
        else if (tpr == 64) f(rg_launch<TX, TW, 64, 2, false, TG, TR>());
        else if (tpr == 128) f(rg_launch<TX, TW, 128, 2, false, TG, TR>());
        else if (tpr == 256) f(rg_launch<TX, TW, 256, 2, false, TG, TR>());
        else return false;
        return true;
      }
    }
    if (tpr == 32 && nv == 1) f(rg_cfg<TX, TW, 32, 1, TG, TR>());
    else if (tpr == 32 && nv == 2) f(rg_cfg<TX, TW, 32, 2, TG, TR>());
    else if (tpr == 32 && nv == 3) f(rg_cfg<TX, TW, 32, 3, TG, TR>());
    else if (tpr == 32) f(rg_cfg<TX, TW, 32, 4, TG, TR>());
    else if (sizeof(TX) == 2 && nv == 2 && tpr >= 64) {
      if constexpr (sizeof(TX) == 2) {
        if (tpr == 64) f(rg_cfg<TX, TW, 64, 2, TG, TR>());
        else if (tpr == 128) f(rg_cfg<TX, TW, 128, 2, TG, TR>());
        else f(rg_cfg<TX, TW, 256, 2, TG, TR>());
      }
    }
    else if (tpr == 64 && nv == 3) f(rg_cfg<TX, TW, 64, 3, TG, TR>());
    else if (tpr == 64) f(rg_cfg<TX, TW, 64, 4, TG, TR>());
    else if (tpr == 128 && nv == 3) f(rg_cfg<TX, TW, 128, 3, TG, TR>());
    else if (tpr == 128) f(rg_cfg<TX, TW, 128, 4, TG, TR>());
    else if (tpr == 256 && nv == 3) f(rg_cfg<TX, TW, 256, 3, TG, TR>());
    else if (tpr == 256) f(rg_cfg<TX, TW, 256, 4, TG, TR>());
    else return false;
    return true;
  };
  const int clu = gw ? bwd_dw_cluster() : 0;         /* the cluster tail (row-group kernels with gw) */
  if (clu < 0) return -1;
  int64_t blocks = 0;
  int per_sm = 1, unr = 2;
  bool rg = with_config([&](auto L) {
    blocks = clu ? decltype(L)::grid_cluster(dev, N, smem) : decltype(L)::grid(dev, N, smem, &per_sm);
    unr = decltype(L)::unr;
  });
  if (!rg) {
    int64_t cap = (int64_t)em_sm_count(dev) * 2;      /* block kernel: one block per row, 2 per SM */
    blocks = N < cap ? N : cap;
  }
  if (blocks < 1) return 0;
  /* gw: the blocks' partial rows; finish_dw's ticket word from this
   * stream's (or the capture's) zeroed counters (no memset), or a fresh one
   * zeroed when that is not to be had */
  int nred = 0;
  em_tensor *part = NULL, *cnt = NULL;
  unsigned long long *ticket = nullptr;
  int *ctr = nullptr;                                 /* the cluster tail's DW_CLUSTER counters */
  if (gw) {
    /* partial rows: a block's each, or (cluster tail) a cluster's each */
    int64_t shape[2] = {rg && clu ? blocks / DW_CLUSTER : blocks, D}, nc = rg && clu ? DW_CLUSTER : 2;
    if (!(part = em_empty(2, shape, std::is_same<C, double>::value ? EM_F64 : EM_F32, x->device))) return -1;
    if (rg) {
      const int64_t cchunks = D / (16 / (int64_t)sizeof(C));   /* finish_dw's 16-byte chunks of a row */
      if (!clu && (nred = bwd_reducers(blocks, cchunks, unr, em_sm_count(dev), per_sm)) < 0) {
        em_tensor_release(part);
        return -1;
      }
      if (int *cp = em_stream_counters(dev, (void *)s, (int)nc)) {
        ticket = (unsigned long long *)(cp + EM_STREAM_TICKET);
        ctr = cp;
      } else {
        if (!(cnt = em_empty(1, &nc, EM_I32, x->device)) ||
            em_cuda_check(cudaMemsetAsync(em_data_ptr(cnt), 0, (size_t)nc * sizeof(int), s), "rmsnorm backward",
                          "cudaMemsetAsync")) {
          em_tensor_release(part); em_tensor_release(cnt);
          return -1;
        }
        ticket = (unsigned long long *)em_data_ptr(cnt);
        ctr = (int *)em_data_ptr(cnt);
      }
    }
    if (!rg && smem > 48 * 1024 &&
        em_cuda_check(cudaFuncSetAttribute(rms_bwd_kernel<TX, TW, TG, TR>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem), "rmsnorm backward", "raising the shared-memory limit")) {
      em_tensor_release(part);
      return -1;
    }
  }
  C *pp = part ? (C *)em_data_ptr(part) : nullptr;
  TW *gwp = gw ? (TW *)em_data_ptr(gw) : nullptr;
  const C *rp = (const C *)em_data_ptr(rstd);
  unsigned grid = (unsigned)blocks;
  int rc = 0;
  if (!with_config([&](auto L) {
        if (clu) rc = decltype(L)::run_cluster(grid, smem, s, xp, wp, rp, gp, N, D, gxp, pp, wvec, gx_acc, gwp, grp, ctr);
        else decltype(L)::run(grid, smem, s, xp, wp, rp, gp, N, D, gxp, pp, wvec, gx_acc, ticket, nred, gwp, grp);
      }))
    rms_bwd_kernel<TX, TW, TG, TR><<<grid, BWD_THREADS, smem, s>>>(xp, wp, rp, gp, N, D, gxp, pp, gx_acc, grp);
  if (rc == 0) rc = em_launch_check("rmsnorm backward");
  if (rc == 0 && gw && !rg) {                         /* the block kernel's partials: a second pass */
    dw_reduce_kernel<C, TW><<<(unsigned)((D + DW_COLS - 1) / DW_COLS), DW_COLS * DW_ROWS, 0, s>>>(
        (const C *)em_data_ptr(part), blocks, D, gwp);
    rc = em_launch_check("rmsnorm backward");
  }
  em_tensor_release(part); em_tensor_release(cnt);
  return rc;
}

extern "C" int em_rmsnorm_bwd_cuda(const em_tensor *x, const em_tensor *w, const em_tensor *rstd,
                                   const em_tensor *gy, em_tensor *gx, bool gx_accumulate, em_tensor *gw,
                                   em_tensor *gr) {
  int64_t D = x->shape[x->ndim - 1];
  if (D == 0 || em_numel(x) == 0) {
    if (gw && em_numel(gw) > 0)                 /* no rows: gw = 0 */
      return em_cuda_check(cudaMemsetAsync(em_data_ptr(gw), 0, (size_t)em_numel(gw) * em_dtype_size(gw->dtype),
                                           em_cur_stream(gw->device.index)), "rmsnorm backward", "cudaMemsetAsync");
    return 0;
  }
  cudaStream_t s = em_cur_stream(x->device.index);
  em_dtype wt = w ? w->dtype : x->dtype;
  int rc = 0;
  if (gr) {                                   /* add_rmsnorm's r gradient in bf16/f16 beside gx: f32 rows and gy */
    if (x->dtype != EM_F32 || wt != EM_F32 || gy->dtype != EM_F32 || !gx || (gr->dtype != EM_BF16 && gr->dtype != EM_F16))
      return em_error("rmsnorm backward: a %s r gradient needs f32 x, weight and gy and gx on CUDA, got x %s, "
                      "weight %s, gy %s", em_dtype_name(gr->dtype), em_dtype_name(x->dtype), em_dtype_name(wt),
                      em_dtype_name(gy->dtype));
    if (gr->dtype == EM_BF16) return launch_bwd<float, float, float, __nv_bfloat16>(x, w, rstd, gy, gx, gx_accumulate, gw, gr, s);
    return launch_bwd<float, float, float, __half>(x, w, rstd, gy, gx, gx_accumulate, gw, gr, s);
  }
  if (gy->dtype != x->dtype) {                /* out_dtype's gradient: f32 rows (f32 or no weight), bf16/f16 gy */
    if (x->dtype != EM_F32 || wt != EM_F32 || (gy->dtype != EM_BF16 && gy->dtype != EM_F16))
      return em_error("rmsnorm backward: a %s gradient needs f32 x and weight on CUDA, got x %s, weight %s",
                      em_dtype_name(gy->dtype), em_dtype_name(x->dtype), em_dtype_name(wt));
    if (gy->dtype == EM_BF16) return launch_bwd<float, float, __nv_bfloat16>(x, w, rstd, gy, gx, gx_accumulate, gw, NULL, s);
    return launch_bwd<float, float, __half>(x, w, rstd, gy, gx, gx_accumulate, gw, NULL, s);
  }
  EM_DISPATCH_FLOAT(x->dtype, TX, { EM_DISPATCH_FLOAT(wt, TW, rc = launch_bwd<TX, TW>(x, w, rstd, gy, gx, gx_accumulate, gw, NULL, s)); });
  return rc;
}

/* ---------------- layer_norm ----------------
 * y = (x - mean) · rstd · w + b per row, rstd = 1/sqrt(var + eps) (biased
 * variance), and its backward
 *   xhat = (x - mean)·rstd, u = gy·w,
 *   gx = rstd·(u − mean(u) − xhat·mean(u·xhat)), gw = Σ_rows gy·xhat, gb = Σ_rows gy.
 * Cost like rmsnorm's (one more pass over the row in registers, memory
 * bound): forward 2·N·D·sizeof(T) bytes, backward 3·N·D·sizeof(T).
 * Launch: rows of f32/bf16/f16 that are 16-byte aligned and fit go to the
 * register kernels below (ln_fwd_reg_kernel, ln_bwd_reg_kernel: one read of
 * each input). The rest (f64, odd D, wider rows) take the loop kernels here:
 * forward one warp per row (8 rows per 256-thread block), two passes over the
 * row (mean, then the centred sum of squares: no cancellation); backward one
 * block per group of rows whose threads split D, dw and db kept in shared
 * memory per block and summed over blocks in a fixed order by
 * dw_reduce_kernel: bit-reproducible. Plain (unvectorised) loads. */

template <typename TX, typename TW>
__global__ void __launch_bounds__(FWD_THREADS) ln_fwd_kernel(const TX *x, const TW *w, const TW *b, int64_t N,
                                                             int64_t D, acc_t<TX> eps, TX *y, acc_t<TX> *mean,
                                                             acc_t<TX> *rstd) {
  using C = acc_t<TX>;
  int lane = threadIdx.x & 31;
  int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5, nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  for (int64_t i = warp; i < N; i += nwarps) {
    const TX *xr = x + i * D;
    TX *yr = y + i * D;
    C s = 0;
    for (int64_t j = lane; j < D; j += 32) s += ld<C>(xr[j]);
    C m = warp_allsum(s) / (C)D, ss = 0;
    for (int64_t j = lane; j < D; j += 32) { C d = ld<C>(xr[j]) - m; ss += d * d; }
    C r = rsqrt_exact(warp_allsum(ss) / (C)D + eps);
    if (lane == 0) { mean[i] = m; rstd[i] = r; }
    for (int64_t j = lane; j < D; j += 32) {
      C v = (ld<C>(xr[j]) - m) * r;
      if (w) v *= ld<C>(w[j]);
      if (b) v += ld<C>(b[j]);
      yr[j] = st<TX>(v);
    }
  }
}

/* issue 12: the forward with the row in registers (ln_fwd_reg_kernel), one
 * read of x and one write of y — 2·N·D·sizeof(T) bytes, the minimum, where
 * ln_fwd_kernel read x three times with scalar loads (the last two mostly
 * from L1: 41 % of 3350 GB/s at (8192,1600) f32). TPR threads per row (a
 * warp, or 4 or 8 warps whose partials meet in shared memory in warp order),
 * NV 16-byte packs a thread, pack v·TPR + t; mean, then the centred sum of
 * squares from the registers (the same two-pass formulas, no cancellation),
 * then y. The sums' order is fixed by (D, dtype): deterministic. */
template <int TPR> __device__ __forceinline__ float group_sum(float v, float *red) {
  v = warp_allsum(v);
  if constexpr (TPR == 32) return v;
  else {
    constexpr int W = TPR / 32;
    const int warp = threadIdx.x >> 5, g0 = warp / W * W;
    __syncthreads();                                   /* red is reused by the next call */
    if ((threadIdx.x & 31) == 0) red[warp] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < W; k++) s += red[g0 + k];
    return s;
  }
}

template <typename TX, typename TW, int NV, int TPR>
__global__ void __launch_bounds__(FWD_THREADS) ln_fwd_reg_kernel(const TX *__restrict__ x, const TW *__restrict__ w,
                                                                 const TW *__restrict__ b, int64_t N, int64_t D,
                                                                 float eps, TX *__restrict__ y,
                                                                 float *__restrict__ mean, float *__restrict__ rstd,
                                                                 bool wvec) {
  constexpr int VEC = 16 / sizeof(TX);
  __shared__ float red[FWD_THREADS / 32];
  const int t = threadIdx.x % TPR;
  const int64_t i = (int64_t)blockIdx.x * (FWD_THREADS / TPR) + threadIdx.x / TPR;
  const bool live = i < N;
  const TX *xr = x + (live ? i : 0) * D;
  uint4 buf[NV];
#pragma unroll
  for (int v = 0; v < NV; v++) {
    const int64_t j = (int64_t)(t + v * TPR) * VEC;
    if (live && j < D) buf[v] = *reinterpret_cast<const uint4 *>(xr + j);
  }
  float s = 0.f;
#pragma unroll
  for (int v = 0; v < NV; v++) {
    const int64_t j = (int64_t)(t + v * TPR) * VEC;
    if (live && j < D)
#pragma unroll
      for (int k = 0; k < VEC; k++) s += raw_elem<float, TX>(buf[v], k);
  }
  const float m = group_sum<TPR>(s, red) / (float)D;
  float ss = 0.f;
#pragma unroll
  for (int v = 0; v < NV; v++) {
    const int64_t j = (int64_t)(t + v * TPR) * VEC;
    if (live && j < D)
#pragma unroll
      for (int k = 0; k < VEC; k++) { const float d = raw_elem<float, TX>(buf[v], k) - m; ss += d * d; }
  }
  const float r = rsqrt_exact(group_sum<TPR>(ss, red) / (float)D + eps);
  if (!live) return;
  if (t == 0) { mean[i] = m; rstd[i] = r; }
  TX *yr = y + i * D;
#pragma unroll
  for (int v = 0; v < NV; v++) {
    const int64_t j = (int64_t)(t + v * TPR) * VEC;
    if (j < D) {
      float wv[VEC], bv[VEC];
      load_w<float, TW, VEC>(w, j, wvec, wv);
      if (b) load_w<float, TW, VEC>(b, j, wvec, bv);
      Packed128<TX> q;
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        float e = (raw_elem<float, TX>(buf[v], k) - m) * r;
        if (w) e *= wv[k];
        if (b) e += bv[k];
        q[k] = st<TX>(e);
      }
      store128(yr + j, q);
    }
  }
}

/* Whether the layer_norm switch `name` says "loop" (the loop kernels always, to time both in one
 * process); anything else, or unset, is "reg" (the default). */
static int ln_env_loop(const char *name) {
  const char *env = getenv(name);
  return env && strcmp(env, "loop") == 0 ? 1 : 0;
}

/* EMBER_LAYER_NORM_FWD (read once): "reg" or "loop" (ln_fwd_kernel); 0 reg, 1 loop. */
static int ln_fwd_loop_only() {
  static const int mode = ln_env_loop("EMBER_LAYER_NORM_FWD");
  return mode;
}

/* true when launched: x f32/bf16/f16, rows 16-byte aligned, D <= 2048 packs */
template <typename TX, typename TW>
static bool ln_launch_fwd_reg(const em_tensor *x, const em_tensor *w, const em_tensor *b, double eps, em_tensor *y,
                              em_tensor *mean, em_tensor *rstd, cudaStream_t s) {
  if constexpr (std::is_same<TX, double>::value) return false;
  else {
    constexpr int VEC = 16 / sizeof(TX);
    const int64_t D = x->shape[x->ndim - 1], N = em_numel(x) / D, P = (D + VEC - 1) / VEC;
    const TX *xp = (const TX *)em_data_ptr(x);
    TX *yp = (TX *)em_data_ptr(y);
    if (D % VEC != 0 || ((uintptr_t)xp & 15) != 0 || ((uintptr_t)yp & 15) != 0 || ln_fwd_loop_only()) return false;
    const TW *wp = w ? (const TW *)em_data_ptr(w) : nullptr, *bp = b ? (const TW *)em_data_ptr(b) : nullptr;
    const bool wvec = (!wp || ((uintptr_t)wp & 15) == 0) && (!bp || ((uintptr_t)bp & 15) == 0);
    float *mp = (float *)em_data_ptr(mean), *rp = (float *)em_data_ptr(rstd);
#define EM_LN_REG(NV, TPR)                                                                                      \
  if (P <= (int64_t)(NV) * (TPR)) {                                                                           \
    const int64_t per = FWD_THREADS / (TPR), blocks = (N + per - 1) / per;                                    \
    if (blocks > INT32_MAX) return false;                                                                     \
    ln_fwd_reg_kernel<TX, TW, NV, TPR><<<(unsigned)blocks, FWD_THREADS, 0, s>>>(xp, wp, bp, N, D, (float)eps, \
                                                                                yp, mp, rp, wvec);            \
    return true;                                                                                              \
  }
    EM_LN_REG(1, 32) EM_LN_REG(2, 32) EM_LN_REG(4, 32) EM_LN_REG(8, 32)
    EM_LN_REG(4, 128) EM_LN_REG(4, 256) EM_LN_REG(8, 256)
#undef EM_LN_REG
    return false;
  }
}

extern "C" int em_layer_norm_fwd_cuda(const em_tensor *x, const em_tensor *w, const em_tensor *b, double eps,
                                      em_tensor *y, em_tensor *mean, em_tensor *rstd) {
  int64_t D = x->shape[x->ndim - 1], N = D ? em_numel(x) / D : 0;
  if (em_numel(x) == 0) {
    if (em_numel(rstd) == 0 || D != 0) return 0;
    return em_error("layer_norm: rows of length 0 are not supported on CUDA");
  }
  if (w && b && w->dtype != b->dtype) return em_error("layer_norm: weight and bias of different dtypes on CUDA");
  cudaStream_t s = em_cur_stream(x->device.index);
  em_dtype wt = w ? w->dtype : b ? b->dtype : x->dtype;
  int64_t blocks = (N + FWD_THREADS / 32 - 1) / (FWD_THREADS / 32), cap = (int64_t)em_sm_count(x->device.index) * 64;
  unsigned grid = (unsigned)(blocks > cap ? cap : blocks);
  bool done = false;
  EM_DISPATCH_FLOAT(x->dtype, TX, { EM_DISPATCH_FLOAT(wt, TW, done = ln_launch_fwd_reg<TX, TW>(x, w, b, eps, y, mean, rstd, s)); });
  if (done) return em_launch_check("layer_norm");
  EM_DISPATCH_FLOAT(x->dtype, TX, {
    EM_DISPATCH_FLOAT(wt, TW, {
      using C = acc_t<TX>;
      ln_fwd_kernel<TX, TW><<<grid, FWD_THREADS, 0, s>>>(
          (const TX *)em_data_ptr(x), w ? (const TW *)em_data_ptr(w) : nullptr,
          b ? (const TW *)em_data_ptr(b) : nullptr, N, D, (C)eps, (TX *)em_data_ptr(y), (C *)em_data_ptr(mean),
          (C *)em_data_ptr(rstd));
    });
  });
  return em_launch_check("layer_norm");
}

/* dynamic shared memory: 2·D accumulators (dw, then db) when either is wanted */
template <typename TX, typename TW>
__global__ void __launch_bounds__(BWD_THREADS) ln_bwd_kernel(const TX *x, const TW *w, const acc_t<TX> *mean,
                                                             const acc_t<TX> *rstd, const TX *gy, int64_t N, int64_t D,
                                                             TX *gx, acc_t<TX> *dw_part, acc_t<TX> *db_part) {
  using C = acc_t<TX>;
  extern __shared__ __align__(16) unsigned char smem[];
  C *dw = (C *)smem, *db = dw + D;
  __shared__ C red[32];
  bool part = dw_part || db_part;
  if (part)
    for (int64_t j = threadIdx.x; j < 2 * D; j += BWD_THREADS) dw[j] = 0;
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const TX *xr = x + i * D, *gr = gy + i * D;
    C m = mean[i], r = rstd[i], su = 0, sux = 0;
    for (int64_t j = threadIdx.x; j < D; j += BWD_THREADS) {
      C u = ld<C>(gr[j]) * (w ? ld<C>(w[j]) : (C)1);
      su += u;
      sux += u * ((ld<C>(xr[j]) - m) * r);
    }
    C cu = block_allsum(su, red) / (C)D;
    C cx = block_allsum(sux, red) / (C)D;
    for (int64_t j = threadIdx.x; j < D; j += BWD_THREADS) {
      C g = ld<C>(gr[j]), xh = (ld<C>(xr[j]) - m) * r;
      if (gx) gx[i * D + j] = st<TX>(r * (g * (w ? ld<C>(w[j]) : (C)1) - cu - xh * cx));
      if (part) { dw[j] += g * xh; db[j] += g; }
    }
  }
  if (!part) return;
  __syncthreads();
  for (int64_t j = threadIdx.x; j < D; j += BWD_THREADS) {
    if (dw_part) dw_part[blockIdx.x * D + j] = dw[j];
    if (db_part) db_part[blockIdx.x * D + j] = db[j];
  }
}

/* issue 12: the backward with the rows in registers (ln_bwd_reg_kernel):
 * x and gy read once with 16-byte loads, gx written once — 3·N·D·sizeof(T)
 * bytes — where ln_bwd_kernel read both twice with scalar loads and kept a
 * single row per block in flight. RPB = 256 / TPR rows at a time per block
 * (a group of TPR threads a row, NV 16-byte packs a thread, pack v·TPR + t);
 * each thread keeps dw and db of its own columns in registers over the
 * block's rows (the same columns every row), the groups' sums meet in
 * shared memory in group order, one partial row per block, and
 * dw_reduce_kernel adds the partial rows in a fixed order. The grid is the
 * blocks one wave holds (occupancy calculator): partial rows and every sum's
 * order depend on the shape and the GPU model only — bit-reproducible. */
template <typename TX, typename TW, int NV, int TPR>
__global__ void __launch_bounds__(BWD_THREADS) ln_bwd_reg_kernel(const TX *__restrict__ x, const TW *__restrict__ w,
                                                                 const float *__restrict__ mean,
                                                                 const float *__restrict__ rstd,
                                                                 const TX *__restrict__ gy, int64_t N, int64_t D,
                                                                 TX *__restrict__ gx, float *__restrict__ dw_part,
                                                                 float *__restrict__ db_part, bool wvec) {
  constexpr int VEC = 16 / sizeof(TX), RPB = BWD_THREADS / TPR;
  extern __shared__ __align__(16) unsigned char smem[];   /* 2·RPB·D floats when dw or db is wanted */
  __shared__ float red[BWD_THREADS / 32];
  const int t = threadIdx.x % TPR, grp = threadIdx.x / TPR;
  float dw[NV][VEC], db[NV][VEC];
#pragma unroll
  for (int v = 0; v < NV; v++)
#pragma unroll
    for (int k = 0; k < VEC; k++) { dw[v][k] = 0.f; db[v][k] = 0.f; }
  const int64_t tiles = (N + RPB - 1) / RPB;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {   /* uniform over the block */
    const int64_t i = tile * RPB + grp;
    const bool live = i < N;
    uint4 bx[NV], bg[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) {
      const int64_t j = (int64_t)(t + v * TPR) * VEC;
      if (live && j < D) {
        bx[v] = *reinterpret_cast<const uint4 *>(x + i * D + j);
        bg[v] = *reinterpret_cast<const uint4 *>(gy + i * D + j);
      }
    }
    const float m = live ? mean[i] : 0.f, r = live ? rstd[i] : 0.f;
    float su = 0.f, sux = 0.f;
#pragma unroll
    for (int v = 0; v < NV; v++) {
      const int64_t j = (int64_t)(t + v * TPR) * VEC;
      if (live && j < D) {
        float wv[VEC];
        load_w<float, TW, VEC>(w, j, wvec, wv);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
          const float u = raw_elem<float, TX>(bg[v], k) * wv[k], xh = (raw_elem<float, TX>(bx[v], k) - m) * r;
          su += u;
          sux += u * xh;
        }
      }
    }
    const float cu = group_sum<TPR>(su, red) / (float)D;
    const float cx = group_sum<TPR>(sux, red) / (float)D;
    if (!live) continue;
#pragma unroll
    for (int v = 0; v < NV; v++) {
      const int64_t j = (int64_t)(t + v * TPR) * VEC;
      if (j < D) {
        float wv[VEC];
        load_w<float, TW, VEC>(w, j, wvec, wv);
        Packed128<TX> q;
#pragma unroll
        for (int k = 0; k < VEC; k++) {
          const float g = raw_elem<float, TX>(bg[v], k), xh = (raw_elem<float, TX>(bx[v], k) - m) * r;
          q[k] = st<TX>(r * (g * wv[k] - cu - xh * cx));
          dw[v][k] += g * xh;
          db[v][k] += g;
        }
        if (gx) store128(gx + i * D + j, q);
      }
    }
  }
  if (!dw_part && !db_part) return;
  float *sdw = (float *)smem, *sdb = sdw + RPB * D;
#pragma unroll
  for (int v = 0; v < NV; v++) {
    const int64_t j = (int64_t)(t + v * TPR) * VEC;
    if (j < D)
#pragma unroll
      for (int k = 0; k < VEC; k++) { sdw[grp * D + j + k] = dw[v][k]; sdb[grp * D + j + k] = db[v][k]; }
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < D; j += BWD_THREADS) {
    float a = 0.f, c = 0.f;
#pragma unroll
    for (int g = 0; g < RPB; g++) { a += sdw[g * D + j]; c += sdb[g * D + j]; }
    if (dw_part) dw_part[blockIdx.x * D + j] = a;
    if (db_part) db_part[blockIdx.x * D + j] = c;
  }
}

/* EMBER_LAYER_NORM_BWD (read once): "reg" (default) or "loop" (ln_bwd_kernel always); 0 reg, 1 loop. */
static int ln_bwd_loop_only() {
  static const int mode = ln_env_loop("EMBER_LAYER_NORM_BWD");
  return mode;
}

/* The register backward's launch: 1 launched, 0 not this shape, -1 error. */
template <typename TX, typename TW, int NV, int TPR>
static int ln_bwd_reg_run(const em_tensor *x, const em_tensor *w, const em_tensor *mean, const em_tensor *rstd,
                          const em_tensor *gy, em_tensor *gx, em_tensor *gw, em_tensor *gb, cudaStream_t s) {
  constexpr int RPB = BWD_THREADS / TPR;
  const int64_t D = x->shape[x->ndim - 1], N = em_numel(x) / D, tiles = (N + RPB - 1) / RPB;
  const int dev = x->device.index;
  const size_t smem = (gw || gb) ? 2 * (size_t)RPB * (size_t)D * sizeof(float) : 0;
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ln_bwd_reg_kernel<TX, TW, NV, TPR>, BWD_THREADS, smem) !=
          cudaSuccess || per_sm < 1) {
    cudaGetLastError();
    per_sm = 1;
  }
  const int64_t cap = (int64_t)em_sm_count(dev) * per_sm, blocks = tiles < cap ? tiles : cap;
  if (blocks < 1) return 1;
  int64_t pshape[2] = {blocks, D};
  em_tensor *pw = gw ? em_empty(2, pshape, EM_F32, x->device) : NULL, *pb = gb ? em_empty(2, pshape, EM_F32, x->device) : NULL;
  int rc = -1;
  if ((gw && !pw) || (gb && !pb)) goto done;
  {
    const TW *wp = w ? (const TW *)em_data_ptr(w) : nullptr;
    ln_bwd_reg_kernel<TX, TW, NV, TPR><<<(unsigned)blocks, BWD_THREADS, smem, s>>>(
        (const TX *)em_data_ptr(x), wp, (const float *)em_data_ptr(mean), (const float *)em_data_ptr(rstd),
        (const TX *)em_data_ptr(gy), N, D, gx ? (TX *)em_data_ptr(gx) : nullptr, pw ? (float *)em_data_ptr(pw) : nullptr,
        pb ? (float *)em_data_ptr(pb) : nullptr, !wp || ((uintptr_t)wp & 15) == 0);
  }
  rc = em_launch_check("layer_norm backward");
  {
    em_tensor *parts[2] = {pw, pb}, *outs[2] = {gw, gb};
    for (int k = 0; k < 2 && rc == 0; k++) {
      if (!outs[k]) continue;
      EM_DISPATCH_FLOAT(outs[k]->dtype, TG, {
        dw_reduce_kernel<float, TG><<<(unsigned)((D + DW_COLS - 1) / DW_COLS), DW_COLS * DW_ROWS, 0, s>>>(
            (const float *)em_data_ptr(parts[k]), blocks, D, (TG *)em_data_ptr(outs[k]));
      });
      rc = em_launch_check("layer_norm backward");
    }
  }
  if (rc == 0) rc = 1;
done:
  em_tensor_release(pw); em_tensor_release(pb);
  return rc;
}

/* Rows of f32/bf16/f16, 16-byte aligned: the fewest threads a row that hold
 * it in 2 packs a thread (dw, db, x and gy of 2 packs in registers), or 4
 * packs of f32 over 256 threads (D <= 4096); else 0 (the loop kernel). */
template <typename TX, typename TW>
static int ln_launch_bwd_reg(const em_tensor *x, const em_tensor *w, const em_tensor *mean, const em_tensor *rstd,
                             const em_tensor *gy, em_tensor *gx, em_tensor *gw, em_tensor *gb, cudaStream_t s) {
  if constexpr (std::is_same<TX, double>::value) return 0;
  else {
    constexpr int VEC = 16 / sizeof(TX);
    const int64_t D = x->shape[x->ndim - 1], P = D / VEC;
    const uintptr_t al = (uintptr_t)em_data_ptr(x) | (uintptr_t)em_data_ptr(gy) | (gx ? (uintptr_t)em_data_ptr(gx) : 0);
    if (D % VEC != 0 || (al & 15) != 0 || ln_bwd_loop_only()) return 0;
    if (P <= 64) return ln_bwd_reg_run<TX, TW, 2, 32>(x, w, mean, rstd, gy, gx, gw, gb, s);
    if (P <= 128) return ln_bwd_reg_run<TX, TW, 2, 64>(x, w, mean, rstd, gy, gx, gw, gb, s);
    if (P <= 256) return ln_bwd_reg_run<TX, TW, 2, 128>(x, w, mean, rstd, gy, gx, gw, gb, s);
    if (P <= 512) return ln_bwd_reg_run<TX, TW, 2, 256>(x, w, mean, rstd, gy, gx, gw, gb, s);
    if constexpr (VEC == 4)
      if (P <= 1024) return ln_bwd_reg_run<TX, TW, 4, 256>(x, w, mean, rstd, gy, gx, gw, gb, s);
    return 0;
  }
}

template <typename TX, typename TW>
static int ln_launch_bwd(const em_tensor *x, const em_tensor *w, const em_tensor *mean, const em_tensor *rstd,
                         const em_tensor *gy, em_tensor *gx, em_tensor *gw, em_tensor *gb, cudaStream_t s) {
  using C = acc_t<TX>;
  int64_t D = x->shape[x->ndim - 1], N = em_numel(x) / D;
  int64_t cap = (int64_t)em_sm_count(x->device.index) * 2, blocks = N > cap ? cap : N;
  if (blocks < 1) return 0;
  em_dtype pt = std::is_same<C, double>::value ? EM_F64 : EM_F32;
  int64_t pshape[2] = {blocks, D};
  em_tensor *pw = gw ? em_empty(2, pshape, pt, x->device) : NULL, *pb = gb ? em_empty(2, pshape, pt, x->device) : NULL;
  int rc = -1;
  size_t smem = (gw || gb) ? 2 * (size_t)D * sizeof(C) : 0;
  if ((gw && !pw) || (gb && !pb)) goto done;
  if (smem > 48 * 1024 &&
      em_cuda_check(cudaFuncSetAttribute(ln_bwd_kernel<TX, TW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                    "layer_norm backward", "raising the shared-memory limit"))
    goto done;
  ln_bwd_kernel<TX, TW><<<(unsigned)blocks, BWD_THREADS, smem, s>>>(
      (const TX *)em_data_ptr(x), w ? (const TW *)em_data_ptr(w) : nullptr, (const C *)em_data_ptr(mean),
      (const C *)em_data_ptr(rstd), (const TX *)em_data_ptr(gy), N, D, gx ? (TX *)em_data_ptr(gx) : nullptr,
      pw ? (C *)em_data_ptr(pw) : nullptr, pb ? (C *)em_data_ptr(pb) : nullptr);
  rc = em_launch_check("layer_norm backward");
  if (rc == 0 && gw) {
    EM_DISPATCH_FLOAT(gw->dtype, TG, {
      dw_reduce_kernel<C, TG><<<(unsigned)((D + DW_COLS - 1) / DW_COLS), DW_COLS * DW_ROWS, 0, s>>>(
          (const C *)em_data_ptr(pw), blocks, D, (TG *)em_data_ptr(gw));
    });
    rc = em_launch_check("layer_norm backward");
  }
  if (rc == 0 && gb) {
    EM_DISPATCH_FLOAT(gb->dtype, TG, {
      dw_reduce_kernel<C, TG><<<(unsigned)((D + DW_COLS - 1) / DW_COLS), DW_COLS * DW_ROWS, 0, s>>>(
          (const C *)em_data_ptr(pb), blocks, D, (TG *)em_data_ptr(gb));
    });
    rc = em_launch_check("layer_norm backward");
  }
done:
  em_tensor_release(pw); em_tensor_release(pb);
  return rc;
}

extern "C" int em_layer_norm_bwd_cuda(const em_tensor *x, const em_tensor *w, const em_tensor *mean,
                                      const em_tensor *rstd, const em_tensor *gy, em_tensor *gx, em_tensor *gw,
                                      em_tensor *gb) {
  int64_t D = x->shape[x->ndim - 1];
  if (D == 0 || em_numel(x) == 0) {             /* no rows: gw = gb = 0 */
    em_tensor *z[2] = {gw, gb};
    for (int k = 0; k < 2; k++)
      if (z[k] && em_numel(z[k]) > 0 &&
          em_cuda_check(cudaMemsetAsync(em_data_ptr(z[k]), 0, (size_t)em_numel(z[k]) * em_dtype_size(z[k]->dtype),
                                        em_cur_stream(z[k]->device.index)), "layer_norm backward", "cudaMemsetAsync"))
        return -1;
    return 0;
  }
  cudaStream_t s = em_cur_stream(x->device.index);
  em_dtype wt = w ? w->dtype : x->dtype;
  int rc = 0;
  EM_DISPATCH_FLOAT(x->dtype, TX, { EM_DISPATCH_FLOAT(wt, TW, rc = ln_launch_bwd_reg<TX, TW>(x, w, mean, rstd, gy, gx, gw, gb, s)); });
  if (rc) return rc < 0 ? -1 : 0;
  EM_DISPATCH_FLOAT(x->dtype, TX, { EM_DISPATCH_FLOAT(wt, TW, rc = ln_launch_bwd<TX, TW>(x, w, mean, rstd, gy, gx, gw, gb, s)); });
  return rc;
}
