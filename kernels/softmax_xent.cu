/* Fused softmax cross-entropy: row losses l_i = logsumexp(x_i) - x_i[t_i]
 * (with label smoothing eps: (1 - eps) l_i + eps (lse_i - mean_j x_ij); 0 for
 * a row whose target is ignore_index), reduced by mean over the counted rows,
 * sum or none, and dlogits = w_i · (softmax(x_i) - eps/V - (1 - eps) onehot(t_i)),
 * for logits x (N, V).
 *
 * Cost: forward reads x once (N·V·sizeof(T) bytes; ~4 FLOPs and one exp per
 * element), writes N lse values and the 0-d loss; backward reads x once and
 * writes dx once (2·N·V·sizeof(T) bytes). Both are memory bound: at ~3 TB/s,
 * (2048 x 50257) bf16 is ~70 us forward and ~140 us backward.
 *
 * Launch: one block of 256 threads per row; a second, single-block kernel
 * takes the mean over rows in double in a fixed order (deterministic, and the
 * host never reads anything). Rows are walked with 16-byte loads (Packed128)
 * between a scalar head and tail, so odd V (50257) stays vectorised.
 *
 * The trick: the forward is ONE pass. Each thread keeps a running max m and
 * a sum s of exp(x - m); a 16-byte chunk first raises m to the chunk's max
 * (rescaling s once), then adds its exps; threads merge (m, s) pairs through
 * warp shuffles and shared memory. Loads are batched 4 deep per thread
 * (__restrict__ lets backward's stores not wait on them: v1, one load at a
 * time, ran backward at ~1.35 TB/s). Only the per-row log-sum-exp is saved
 * (N values, as the CPU does), so backward recomputes softmax from x in the
 * same single read, never storing probabilities. Math in f32 (f64 for f64
 * logits), bf16/f16 widened on load and rounded once on store. */
#include <type_traits>
#include "common.cuh"
#include "dtype_io.cuh"
#include "backend.h"

#define THREADS 256
#define UNROLL 4      /* 16-byte loads in flight per thread before the first use */

using acc::acc_t;   /* common.cuh */
using acc::ld;
using acc::st;

__device__ __forceinline__ float ex(float x) { return expf(x); }
__device__ __forceinline__ double ex(double x) { return exp(x); }
__device__ __forceinline__ float lg(float x) { return logf(x); }
__device__ __forceinline__ double lg(double x) { return log(x); }

/* Merge (m2, s2) into (m, s): s is a sum of exp(x - m). m = -inf means empty. */
template <typename C>
__device__ __forceinline__ void merge(C &m, C &s, C m2, C s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) { m = m2; s = s2; return; }
  if (m2 > m) { s = s * ex(m - m2) + s2; m = m2; }
  else s += s2 * ex(m2 - m);
}

/* Elements before the first 16-byte boundary of p (at most n). */
template <typename T>
__device__ __forceinline__ int64_t head_len(const T *p, int64_t n) {
  int64_t h = (int64_t)(((16 - ((uintptr_t)p & 15)) & 15) / sizeof(T));
  return h < n ? h : n;
}

template <typename I>
__device__ __forceinline__ int64_t target_of(const I *t, int64_t row) { return (int64_t)t[row]; }

/* FAST (bf16/f16 logits unless EMBER_XENT_EXP_OLD=1): the per-element exp is
 * em_exp_fast (common.cuh; FMUL + MUFU.EX2.FTZ) instead of expf (~10
 * instructions), and a chunk's max is taken two lanes an instruction on the
 * raw words (em_max_x2: exact, the same max). A bf16 element (2 bytes) leaves
 * ~20 lane-instructions at 70 % of an H200's 4.8 TB/s; the smoothed forward
 * spent ~15 (unpack, max, row sum, sub, expf, add) and ran (8192,50304) at
 * 58 %; now ~6.5. The exp's error (~2 ulp for the terms near the max that make
 * the sum; a term under 2^-126 flushes to 0 beside the max's 1) is far below
 * the 1e-2 the bf16 loss is held to; the same operations in the same order,
 * so deterministic. f32/f64 keep expf/exp (bits unchanged; f32 ran at 90 %);
 * the chunk rescale and the backward keep ex(). */
/* One block per row: lse[row] = m + log(s); rowsum[row] = sum of the row
 * (label smoothing only; NULL otherwise, the sum then costs nothing). */
template <typename T, bool FAST>
__global__ void __launch_bounds__(THREADS) xent_fwd_kernel(const T *__restrict__ x, int64_t V, acc_t<T> *__restrict__ lse,
                                                           acc_t<T> *__restrict__ rowsum) {
  using C = acc_t<T>;
  constexpr int VEC = 16 / sizeof(T);
  const T *row = x + (int64_t)blockIdx.x * V;
  C m = -INFINITY, s = 0, sx = 0;
  const bool want_sum = rowsum != nullptr;
  int64_t h = head_len(row, V), nv = (V - h) / VEC;
  for (int64_t j = threadIdx.x; j < h; j += THREADS) {
    merge(m, s, ld<C>(row[j]), (C)1);
    if (want_sum) sx += ld<C>(row[j]);
  }
  const T *mid = row + h;
  for (int64_t v0 = threadIdx.x; v0 < nv; v0 += THREADS * UNROLL) {
    Packed128<T> p[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
      if (v0 + u * THREADS < nv) p[u] = load128(mid + (v0 + u * THREADS) * VEC);
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      if (v0 + u * THREADS >= nv) break;
      if constexpr (FAST) {   /* 2-byte T: the chunk as raw words, its max two lanes an instruction */
        const uint4 w = *reinterpret_cast<const uint4 *>(&p[u]);
        const uint4 mw = make_uint4(em_max_x2<T>(em_max_x2<T>(w.x, w.y), em_max_x2<T>(w.z, w.w)), 0u, 0u, 0u);
        const float cm = fmaxf(raw_elem<float, T>(mw, 0), raw_elem<float, T>(mw, 1));   /* exact: the same max */
        if (want_sum) {
#pragma unroll
          for (int k = 0; k < VEC; k++) sx += raw_elem<float, T>(w, k);
        }
        if (cm == -INFINITY) continue;
        if (cm > m) { s = m == -INFINITY ? 0.f : s * ex(m - cm); m = cm; }
#pragma unroll
        for (int k = 0; k < VEC; k++) s += em_exp_fast(raw_elem<float, T>(w, k) - m);
        continue;
      }
      C cm = ld<C>(p[u][0]);
#pragma unroll
      for (int k = 1; k < VEC; k++) cm = fmax(cm, ld<C>(p[u][k]));
      if (want_sum) {
#pragma unroll
        for (int k = 0; k < VEC; k++) sx += ld<C>(p[u][k]);
      }
      if (cm == -INFINITY) continue;
      if (cm > m) { s = m == -INFINITY ? (C)0 : s * ex(m - cm); m = cm; }
#pragma unroll
      for (int k = 0; k < VEC; k++) s += ex(ld<C>(p[u][k]) - m);
    }
  }
  for (int64_t j = h + nv * VEC + threadIdx.x; j < V; j += THREADS) {
    merge(m, s, ld<C>(row[j]), (C)1);
    if (want_sum) sx += ld<C>(row[j]);
  }
  /* warp, then block */
  for (int o = 16; o > 0; o >>= 1) {
    C m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, m2, s2);
  }
  if (want_sum)
    for (int o = 16; o > 0; o >>= 1) sx += __shfl_xor_sync(0xffffffffu, sx, o);
  __shared__ C sm[THREADS / 32], ss[THREADS / 32], ssx[THREADS / 32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { sm[warp] = m; ss[warp] = s; ssx[warp] = sx; }
  __syncthreads();
  if (warp == 0) {
    m = lane < THREADS / 32 ? sm[lane] : (C)-INFINITY;
    s = lane < THREADS / 32 ? ss[lane] : (C)0;
    sx = lane < THREADS / 32 ? ssx[lane] : (C)0;
    for (int o = 16; o > 0; o >>= 1) {
      C m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      merge(m, s, m2, s2);
      if (want_sum) sx += __shfl_xor_sync(0xffffffffu, sx, o);
    }
    if (lane == 0) {
      lse[blockIdx.x] = m + lg(s);
      if (want_sum) rowsum[blockIdx.x] = sx;
    }
  }
}

/* A target that names a logit (neither ignored nor out of range). */
__device__ __forceinline__ bool target_ok(int64_t ti, int64_t V, const em_xent_opts &o) {
  return ti != o.ignore_index && ti >= 0 && ti < V;
}

/* Row loss in double from its loaded parts (xt = x[i, ti], read only when target_ok): 0 for an ignored row,
 * NaN for a bad target. */
__device__ __forceinline__ double row_loss_of(int64_t ti, double lse_i, double xt, bool smooth, double rowsum_i,
                                              int64_t V, const em_xent_opts &o) {
  if (ti == o.ignore_index) return 0.0;
  if (ti < 0 || ti >= V) return NAN;
  double l = lse_i - xt;
  if (smooth) l = (1.0 - o.label_smoothing) * l + o.label_smoothing * (lse_i - rowsum_i / (double)V);
  return l;
}

/* Row i's loss in double: 0 for an ignored row, NaN for a bad target. */
template <typename T, typename I>
__device__ __forceinline__ double row_loss(const T *x, const I *t, const acc_t<T> *lse, const acc_t<T> *rowsum,
                                           int64_t i, int64_t V, em_xent_opts o) {
  int64_t ti = target_of(t, i);
  double xt = target_ok(ti, V, o) ? (double)ld<acc_t<T>>(x[i * V + ti]) : 0.0;
  return row_loss_of(ti, (double)lse[i], xt, rowsum != nullptr, rowsum ? (double)rowsum[i] : 0.0, V, o);
}

/* reduction "none": loss[i] = l_i, one thread per row. */
template <typename T, typename I, typename L>
__global__ void xent_rows_kernel(const T *x, const I *t, const acc_t<T> *lse, const acc_t<T> *rowsum, int64_t N,
                                 int64_t V, em_xent_opts o, L *loss) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (int64_t)gridDim.x * blockDim.x)
    loss[i] = st<L>((acc_t<L>)row_loss(x, t, lse, rowsum, i, V, o));
}

/* "sum" / "mean": one block, in double, fixed order (deterministic); count = rows not ignored. */
template <typename T, typename I, typename L>
__global__ void __launch_bounds__(1024) xent_reduce_kernel(const T *x, const I *t, const acc_t<T> *lse,
                                                           const acc_t<T> *rowsum, int64_t N, int64_t V,
                                                           em_xent_opts o, L *loss, float *count) {
  __shared__ double part[1024 / 32], cpart[1024 / 32];
  double acc = 0, cnt = 0;
  /* A thread's rows i = tid + k·blockDim in kRows batches: the batch's targets (and lse, rowsum) load
   * together, then its x[i, t_i], then the adds in the same order as one row at a time (same bits). One
   * row at a time was two dependent DRAM round trips a row: ~16 of them (~10 us) for 8192 rows; 4 a batch
   * fits the 64 registers of 1024 threads without spilling. */
  constexpr int kRows = 4;
  const int64_t step = blockDim.x;
  for (int64_t i0 = threadIdx.x; i0 < N; i0 += step * kRows) {
    int64_t ti[kRows];
    acc_t<T> li[kRows], ri[kRows], xt[kRows];
#pragma unroll
    for (int k = 0; k < kRows; k++) {
      const int64_t i = i0 + k * step;
      ti[k] = i < N ? target_of(t, i) : (int64_t)o.ignore_index;
      li[k] = i < N ? lse[i] : (acc_t<T>)0;
      ri[k] = i < N && rowsum ? rowsum[i] : (acc_t<T>)0;
    }
#pragma unroll
    for (int k = 0; k < kRows; k++) {
      const int64_t i = i0 + k * step;
      xt[k] = i < N && target_ok(ti[k], V, o) ? ld<acc_t<T>>(x[i * V + ti[k]]) : (acc_t<T>)0;
    }
#pragma unroll
    for (int k = 0; k < kRows; k++) {
      if (i0 + k * step >= N) break;
      acc += row_loss_of(ti[k], (double)li[k], (double)xt[k], rowsum != nullptr, (double)ri[k], V, o);
      cnt += ti[k] != o.ignore_index;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    acc += __shfl_xor_sync(0xffffffffu, acc, off);
    cnt += __shfl_xor_sync(0xffffffffu, cnt, off);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { part[warp] = acc; cpart[warp] = cnt; }
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0, c = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) { s += part[w]; c += cpart[w]; }
    bool mean = o.reduction == EM_REDUCTION_MEAN;
    loss[0] = st<L>((acc_t<L>)(mean ? (c > 0 ? s / c : (double)NAN) : s));
    if (count) count[0] = (float)c;
  }
}

/* One block per row: dx = scale * exp(x - lse) - scale * eps / V, minus
 * scale (1 - eps) at the target (the CPU's order of operations); scale =
 * g[r * gstride] (/ count[0] for a mean), 0 for an ignored row. */
template <typename T, typename I, typename G>
__global__ void __launch_bounds__(THREADS) xent_bwd_kernel(const T *__restrict__ x, const I *__restrict__ t,
                                                           const acc_t<T> *__restrict__ lse, const G *__restrict__ g,
                                                           int64_t gstride, const float *__restrict__ count,
                                                           em_xent_opts o, int64_t V, T *__restrict__ dx, bool vec_ok) {
  using C = acc_t<T>;
  constexpr int VEC = 16 / sizeof(T);
  int64_t r = blockIdx.x;
  const T *row = x + r * V;
  T *out = dx + r * V;
  int64_t ti = target_of(t, r);
  double w = (double)ld<acc_t<G>>(g[r * gstride]) / (count ? (double)count[0] : 1.0);
  C l = lse[r], scale = ti == o.ignore_index ? (C)0 : (C)w;
  C sm = scale * (C)(o.label_smoothing / (double)V), st_ = scale * (C)(1.0 - o.label_smoothing);
  const bool smooth = o.label_smoothing > 0;
  int64_t h = vec_ok ? head_len(row, V) : V, nv = vec_ok ? (V - h) / VEC : 0;
  for (int64_t j = threadIdx.x; j < h; j += THREADS) {
    C v = scale * ex(ld<C>(row[j]) - l);
    if (smooth) v -= sm;
    out[j] = st<T>(j == ti ? v - st_ : v);
  }
  int64_t tl = ti - h;                      /* the target's index within the vector body */
  for (int64_t v0 = threadIdx.x; v0 < nv; v0 += THREADS * UNROLL) {
    Packed128<T> p[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
      if (v0 + u * THREADS < nv) p[u] = load128(row + h + (v0 + u * THREADS) * VEC);
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
      int64_t v = v0 + u * THREADS;
      if (v >= nv) break;
      Packed128<T> q;
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        C e = scale * ex(ld<C>(p[u][k]) - l);
        if (smooth) e -= sm;
        q[k] = st<T>(v * VEC + k == tl ? e - st_ : e);
      }
      store128(out + h + v * VEC, q);
    }
  }
  for (int64_t j = h + nv * VEC + threadIdx.x; j < V; j += THREADS) {
    C v = scale * ex(ld<C>(row[j]) - l);
    if (smooth) v -= sm;
    out[j] = st<T>(j == ti ? v - st_ : v);
  }
}

#define DISPATCH_TARGET(dt, I, ...)                                     \
  switch (dt) {                                                         \
    case EM_I64: { typedef int64_t I; __VA_ARGS__; break; }             \
    case EM_I32: { typedef int32_t I; __VA_ARGS__; break; }             \
    default: return em_error("cross_entropy: CUDA targets must be i32 or i64, got %s", em_dtype_name(dt)); \
  }

/* The reduction of the row losses into loss (and count), after lse (and rowsum) exist. */
static int xent_finish(const em_tensor *logits, const em_tensor *targets, const em_xent_opts *o, const em_tensor *lse,
                       const em_tensor *rowsum, em_tensor *loss, em_tensor *count, cudaStream_t s) {
  int64_t V = logits->shape[logits->ndim - 1], N = em_numel(targets);
  if (o->reduction == EM_REDUCTION_NONE && N == 0) return 0;
  float *cnt = count ? (float *)em_data_ptr(count) : nullptr;
  EM_DISPATCH_FLOAT(logits->dtype, T, {
    const acc_t<T> *rs = rowsum ? (const acc_t<T> *)em_data_ptr(rowsum) : nullptr;
    DISPATCH_TARGET(targets->dtype, I, {
      EM_DISPATCH_FLOAT(loss->dtype, L, {
        const T *xp = (const T *)em_data_ptr(logits);
        const I *tp = (const I *)em_data_ptr(targets);
        const acc_t<T> *lp = (const acc_t<T> *)em_data_ptr(lse);
        if (o->reduction == EM_REDUCTION_NONE)
          xent_rows_kernel<T, I, L><<<em_grid(N, 256), 256, 0, s>>>(xp, tp, lp, rs, N, V, *o, (L *)em_data_ptr(loss));
        else
          xent_reduce_kernel<T, I, L><<<1, 1024, 0, s>>>(xp, tp, lp, rs, N, V, *o, (L *)em_data_ptr(loss), cnt);
      });
    });
  });
  return em_launch_check("cross_entropy");
}

extern "C" int em_xent_fwd_cuda(const em_tensor *logits, const em_tensor *targets, const em_xent_opts *o,
                                em_tensor *lse, em_tensor *loss, em_tensor *count) {
  int64_t V = logits->shape[logits->ndim - 1], N = em_numel(targets);
  cudaStream_t s = em_cur_stream(logits->device.index);
  em_tensor *rowsum = NULL;   /* label smoothing: each row's sum, beside lse */
  if (o->label_smoothing > 0 && N > 0 && !(rowsum = em_empty(1, &N, lse->dtype, lse->device))) return -1;
  int rc = 0;
  if (N > 0) {
    if (N > INT32_MAX) { em_tensor_release(rowsum); return em_error("cross_entropy: %lld rows exceed the CUDA grid", (long long)N); }
    static const bool old_exp = em_env_switch("EMBER_XENT_EXP_OLD", false);
    switch (logits->dtype) {   /* not EM_DISPATCH_FLOAT: its default returns, and rowsum must be released */
#define FWD(T, F) xent_fwd_kernel<T, F><<<(unsigned)N, THREADS, 0, s>>>((const T *)em_data_ptr(logits), V, \
                    (acc_t<T> *)em_data_ptr(lse), rowsum ? (acc_t<T> *)em_data_ptr(rowsum) : nullptr)
      case EM_F32: FWD(float, false); break;
      case EM_F64: FWD(double, false); break;
      case EM_BF16: if (old_exp) FWD(__nv_bfloat16, false); else FWD(__nv_bfloat16, true); break;
      case EM_F16: if (old_exp) FWD(__half, false); else FWD(__half, true); break;
#undef FWD
      default: rc = em_error("cross_entropy: unsupported dtype %s", em_dtype_name(logits->dtype));
    }
    if (rc == 0) rc = em_launch_check("cross_entropy");
  }
  if (rc == 0) rc = xent_finish(logits, targets, o, lse, rowsum, loss, count, s);
  em_tensor_release(rowsum);
  return rc;
}

extern "C" int em_xent_bwd_cuda(const em_tensor *logits, const em_tensor *targets, const em_xent_opts *o,
                                const em_tensor *lse, const em_tensor *g, const em_tensor *count, em_tensor *dlogits) {
  int64_t V = logits->shape[logits->ndim - 1], N = em_numel(targets);
  if (N == 0 || V == 0) return 0;
  if (N > INT32_MAX) return em_error("cross_entropy: %lld rows exceed the CUDA grid", (long long)N);
  cudaStream_t s = em_cur_stream(logits->device.index);
  int64_t gstride = o->reduction == EM_REDUCTION_NONE ? 1 : 0;
  const float *cnt = o->reduction == EM_REDUCTION_MEAN && count ? (const float *)em_data_ptr(count) : nullptr;
  /* 16-byte chunks line up in x and dx only when their bases agree modulo 16 */
  bool vec_ok = (((uintptr_t)em_data_ptr(logits) - (uintptr_t)em_data_ptr(dlogits)) & 15) == 0;
  EM_DISPATCH_FLOAT(logits->dtype, T, {
    DISPATCH_TARGET(targets->dtype, I, {
      EM_DISPATCH_FLOAT(g->dtype, G,
        xent_bwd_kernel<T, I, G><<<(unsigned)N, THREADS, 0, s>>>((const T *)em_data_ptr(logits),
                                                                 (const I *)em_data_ptr(targets),
                                                                 (const acc_t<T> *)em_data_ptr(lse),
                                                                 (const G *)em_data_ptr(g), gstride, cnt, *o, V,
                                                                 (T *)em_data_ptr(dlogits), vec_ok));
    });
  });
  return em_launch_check("cross_entropy backward");
}
