/* Reductions: sum/mean, var, max/min (+ i64 indices), argmax/argmin,
 * logsumexp, and max/min's backward scatter — the GPU twin of
 * engine/ops/reduce.c, over the same plan (kept dims x reduced dims, each
 * coalesced). Softmax, log_softmax and their fused backward are at the end
 * of this file (one stem: reduce).
 *
 * Cost: ~1 FLOP and one load per input element (two passes for var and
 * logsumexp); outputs are n_out elements. Memory-bound: the ceiling is the
 * read bandwidth (~3 TB/s on an H100).
 *
 * Launch shapes (256 threads):
 *  - rows: the reduced elements of one output are contiguous or at least
 *    "inner" (rstride[last] == 1, or the generic case). One warp per output
 *    when n_red <= 1024 (or <= 16384 with enough outputs to fill the GPU
 *    with warps), else one block per output; Packed128 loads, four in
 *    flight per thread, when the rows are 16-byte aligned (else four scalar
 *    loads in flight).
 *  - cols: the innermost kept dim is contiguous and the reduction strides
 *    over it (sum over the batch of (B*T, D): the bias-gradient shape). A
 *    (32 x 8) block: 32 neighbouring outputs read one coalesced row segment
 *    per step, 32 rows in flight (8 threads x 4 loads); the 8 partials meet
 *    in shared memory. With float storage and 16-byte aligned rows each
 *    thread takes a Packed128 of neighbouring outputs instead
 *    (reduce_cols_vec: a warp reads 512 bytes a row, not 32 elements);
 *    max/min there run reduce_cols_ext (branch-free, see there; bf16:
 *    reduce_cols_bx2, two columns an instruction).
 *  - either splits the reduced range over gridDim.y when there are too few
 *    outputs to fill the GPU (sum over everything): partials go to a small
 *    workspace, merged in a fixed order — deterministic — by the last block
 *    of each column of the rows kernel and of the column max/min kernels
 *    (an atomic arrival count, no second launch), or by a second kernel
 *    (reduce_finish: the other column kernels, and inside a graph capture).
 * The one trick: every reduction is one accumulator type (Acc) with
 * push/merge, and max/min order candidates by (NaN first, value, then lower
 * index), which is associative — so tree order, splits and vector loads
 * cannot change which index wins a tie, and results match the CPU's
 * "first extreme wins" walk. Floats accumulate in f32 (f64 for f64),
 * integers in wrapping i64. Within a thread elements come in index order, so
 * max/min's vector paths compare a whole load's (or trip's) max.NaN/min.NaN
 * with the state and search the winner only when it beats it (push_vec):
 * ~1 instruction per element instead of better()'s ~12 (issue 12). */
#include "common.cuh"
#include "dtype_io.cuh"
#include "backend.h"
#include "runtime.h"
#include <cstdlib>
#include <type_traits>

namespace {

constexpr int kBlock = 256;
/* 16-byte loads in flight per thread in the vector kernels (rows, cols_vec):
 * 8 x 16 B x ~1000 resident threads = ~128 KiB per SM, past the ~40 KiB an
 * H100 SM needs in flight to stream at its share of HBM bandwidth. */
constexpr int kUnroll = 8;
/* Blocks a split reduction aims for: a constant, so the partition (and the
 * float sum's rounding) depends on the shape alone, not on the GPU. 512
 * blocks of 256 threads: ~4 per SM on an H100, all resident in one wave. */
constexpr int64_t kTargetBlocks = 512;
/* ... so the vector kernels are built to keep 4 blocks resident per SM
 * (<= 64 registers): without the bound, bf16's eight unpacked loads took
 * 87-140 registers and left 2 blocks per SM. */
constexpr int kMinBlocks = 4;
/* Rows in flight per thread in the column kernel: each row is V outputs'
 * worth of accumulators already (up to 8 values + indices for max/min). */
constexpr int kColsUnroll = 4;
/* ... and for max/min, which hold 96 registers (bf16) there whatever the
 * unroll (capped at 64 they spill ~0.5 KiB): 2 blocks per SM, so 8 rows in
 * flight for 64 KiB of loads per SM, and a grid of about two blocks per SM
 * (kTargetBlocksExt) so that it runs in one wave */
constexpr int kColsUnrollExt = 8;
constexpr int64_t kTargetBlocksExt = 256;

enum { R_SUM, R_SQDEV, R_SUMEXP, R_MAX, R_MIN,
       R_PROD, R_ASUM, R_SSQ, R_AMAX, R_PSUM };   /* issue 12: prod and the vector norms */

struct RedArgs {
  const void *in;
  int dtype;
  int nk, nr;
  int64_t kshape[EM_MAX_DIMS], kstride[EM_MAX_DIMS];
  int64_t rshape[EM_MAX_DIMS], rstride[EM_MAX_DIMS];
  int64_t n_out, n_red, chunk;
  int splits;
  const void *ref;          /* per-output reference in the compute type (mean, or max) */
  void *out;                /* final values (may be NULL for argmax) */
  int out_dtype;
  int64_t *out_idx;         /* final indices (max/min; may be NULL) */
  void *part;               /* partial values [n_out * splits] (splits > 1) */
  int *cnt;                 /* splits > 1: per-blockIdx.x arrival counts, zero at launch and left zero
                               (the last block merges, no second launch); NULL: reduce_finish merges */
  int64_t *part_idx;
  double scale;             /* sum: divisor; var: degrees of freedom */
};

__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }

template <typename C> __device__ __forceinline__ bool m_isnan(C x) {
  if constexpr (std::is_floating_point<C>::value) return isnan(x);
  else return false;
}

template <typename C> __device__ __forceinline__ C lowest() {
  if constexpr (std::is_floating_point<C>::value) return -INFINITY;
  else return INT64_MIN;
}
template <typename C> __device__ __forceinline__ C highest() {
  if constexpr (std::is_floating_point<C>::value) return INFINITY;
  else return INT64_MAX;
}
/* issue 12: wrapping product for integers; max that lets a NaN win */
template <typename C> __device__ __forceinline__ C rmul(C a, C b) {
  if constexpr (std::is_floating_point<C>::value) return a * b;
  else return (int64_t)((uint64_t)a * (uint64_t)b);
}
template <typename C> __device__ __forceinline__ C nan_max(C a, C b) {
  return (m_isnan(a) || a >= b) ? a : b;
}
template <typename C> __device__ __forceinline__ C radd(C a, C b) {
  if constexpr (std::is_floating_point<C>::value) return a + b;
  else return (int64_t)((uint64_t)a + (uint64_t)b);
}

template <typename T> __device__ __forceinline__ T shfl_xor(T v, int o) {
  if constexpr (std::is_same<T, int64_t>::value) return (int64_t)__shfl_xor_sync(0xffffffffu, (long long)v, o);
  else return __shfl_xor_sync(0xffffffffu, v, o);
}

/* The running state of one reduction. i: index of the extreme (-1: none yet). */
template <typename C, int OP>
struct Acc {
  static constexpr bool ext = OP == R_MAX || OP == R_MIN;
  C v;
  int64_t i;
  __device__ __forceinline__ void init() {
    v = OP == R_MAX ? lowest<C>() : OP == R_MIN ? highest<C>() : OP == R_PROD ? (C)1 : (C)0;
    i = -1;
  }
  /* Is candidate (x, ix) better than the current (v, i)? NaN first (lowest
   * index among NaNs), then the larger (smaller) value, then the lower index. */
  __device__ __forceinline__ bool better(C x, int64_t ix) const {
    if (i < 0) return true;
    bool xn = m_isnan(x), vn = m_isnan(v);
    if (xn || vn) return xn && (!vn || ix < i);
    if (x == v) return ix < i;
    return OP == R_MAX ? x > v : x < v;
  }
  /* Every kernel pushes a thread's elements in increasing index order, so for
   * max/min ix is past i and better() shrinks to: nothing yet, or no NaN held
   * and x not below v (a NaN x wins) — no tie and index compares per element. */
  __device__ __forceinline__ void push(C x, int64_t ix, C sh) {
    if constexpr (OP == R_SUM) v = radd(v, x);
    else if constexpr (OP == R_SQDEV) { C d = x - sh; v += d * d; }
    else if constexpr (OP == R_SUMEXP) v += m_exp(x - sh);
    else if constexpr (OP == R_PROD || OP == R_ASUM || OP == R_SSQ || OP == R_AMAX || OP == R_PSUM) more(x, sh);
    else if (later_better(x)) { v = x; i = ix; }
  }
  /* better(x, ix) for an ix past i (see push) */
  __device__ __forceinline__ bool later_better(C x) const {
    return i < 0 || (!m_isnan(v) && !(OP == R_MAX ? x <= v : x >= v));
  }
  __device__ __forceinline__ void merge(C ov, int64_t oi) {
    if constexpr (ext) { if (oi >= 0 && better(ov, oi)) { v = ov; i = oi; } }
    else if constexpr (OP == R_PROD) v = rmul(v, ov);
    else if constexpr (OP == R_AMAX) v = nan_max(v, ov);
    else v = radd(v, ov);
  }
  /* issue 12: prod and the norms' terms (sh: the order p of R_PSUM) */
  __device__ __forceinline__ void more(C x, C sh) {
    if constexpr (OP == R_PROD) v = rmul(v, x);
    else if constexpr (std::is_floating_point<C>::value) {
      const C ax = x < 0 ? -x : x;
      if constexpr (OP == R_ASUM) v += ax;
      else if constexpr (OP == R_SSQ) v += x * x;
      else if constexpr (OP == R_AMAX) v = nan_max(v, ax);
      else v += pow(ax, sh);
    }
  }
  __device__ __forceinline__ void warp_merge() {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      C ov = shfl_xor(v, o);
      int64_t oi = ext ? shfl_xor(i, o) : 0;
      merge(ov, oi);
    }
  }
  /* Block-wide; every thread must call it; thread 0 ends with the result. */
  __device__ __forceinline__ void block_merge() {
    __shared__ C sv[32];
    __shared__ int64_t si[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    warp_merge();
    if (lane == 0) { sv[warp] = v; si[warp] = i; }
    __syncthreads();
    if (warp == 0) {
      init();
      if (lane < nw) { v = sv[lane]; i = si[lane]; }
      warp_merge();
    }
  }
};

/* Acc::later_better on a bare (value, none-yet) pair */
template <typename C, int OP> __device__ __forceinline__ bool seq_better(C x, C v, bool none) {
  return none || (!m_isnan(v) && !(OP == R_MAX ? x <= v : x >= v));
}

/* A max/min that returns a NaN when either is (PTX max.NaN: one instruction
 * for f32); which of -0/+0 it returns does not matter (push_vec). */
template <int OP> __device__ __forceinline__ float ext_nan(float a, float b) {
  float r;
  if constexpr (OP == R_MAX) asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  else asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
template <int OP> __device__ __forceinline__ double ext_nan(double a, double b) {
  if (isnan(a) || isnan(b)) return isnan(a) ? a : b;
  return OP == R_MAX ? fmax(a, b) : fmin(a, b);
}

/* max/min over the V elements of one 16-byte load at indices at..at+V-1,
 * all past acc.i: the same state as V pushes, for one min/max per element.
 * The load's extreme m (NaN if any element is) decides whether anything
 * changes (rarely, on random data); only then is the winner searched: the
 * first NaN, or the first element equal to m (-0 == +0, as the CPU's ext_f),
 * whose own bits and index are kept. */
template <typename T, typename C, int OP>
__device__ __forceinline__ C vec_extreme(const uint4 &pk) {
  constexpr int V = 16 / (int)sizeof(T);
  C m = raw_elem<C, T>(pk, 0);
#pragma unroll
  for (int e = 1; e < V; e++) m = ext_nan<OP>(m, raw_elem<C, T>(pk, e));
  return m;
}
template <typename T, typename C, int OP>
__device__ __forceinline__ void push_vec(Acc<C, OP> &acc, const uint4 &pk, int64_t at) {
  constexpr int V = 16 / (int)sizeof(T);
  const C m = vec_extreme<T, C, OP>(pk);
  if (!acc.later_better(m)) return;
  const bool mn = m_isnan(m);
  bool found = false;
#pragma unroll
  for (int e = 0; e < V; e++) {
    const C x = raw_elem<C, T>(pk, e);
    if (!found && (mn ? m_isnan(x) : x == m)) { acc.v = x; acc.i = at + e; found = true; }
  }
}

/* The shift of a logsumexp row from its maximum: 0 when infinite or NaN. */
template <typename C> __device__ __forceinline__ C lse_shift(C m) { return (isinf(m) || isnan(m)) ? (C)0 : m; }

template <typename C, int OP> __device__ __forceinline__ C ref_of(const RedArgs &a, int64_t o) {
  if constexpr (OP == R_PSUM) return (C)a.scale;   /* issue 12: the norm's order p */
  if (!a.ref) return 0;
  C r = ((const C *)a.ref)[o];
  if constexpr (OP == R_SUMEXP) return lse_shift(r);
  else return r;
}

/* The final value of output o. */
template <typename C, int OP>
__device__ __forceinline__ void finalize(const RedArgs &a, int64_t o, C v, int64_t i) {
  if constexpr (OP == R_MAX || OP == R_MIN) {
    if (a.out) store_as<C>(a.out, a.out_dtype, o, v);
    if (a.out_idx) a.out_idx[o] = i < 0 ? 0 : i;
  } else if constexpr (OP == R_SUM) {
    if constexpr (std::is_floating_point<C>::value) store_as<C>(a.out, a.out_dtype, o, v / (C)a.scale);
    else store_as<C>(a.out, a.out_dtype, o, v);
  } else if constexpr (OP == R_SQDEV) {
    store_as<C>(a.out, a.out_dtype, o, v / (C)a.scale);
  } else if constexpr (OP == R_PROD || OP == R_ASUM || OP == R_AMAX) {   /* issue 12 */
    store_as<C>(a.out, a.out_dtype, o, v);
  } else if constexpr (OP == R_SSQ) {
    store_as<C>(a.out, a.out_dtype, o, sqrt(v));
  } else if constexpr (OP == R_PSUM) {
    store_as<C>(a.out, a.out_dtype, o, pow(v, (C)1 / (C)a.scale));
  } else {
    C m = ((const C *)a.ref)[o];
    store_as<C>(a.out, a.out_dtype, o, isnan(m) ? (C)NAN : lse_shift(m) + m_log(v));
  }
}

template <typename C, int OP>
__device__ __forceinline__ void emit(const RedArgs &a, int64_t o, const Acc<C, OP> &acc) {
  if (a.splits == 1) { finalize<C, OP>(a, o, acc.v, acc.i); return; }
  int64_t at = o * a.splits + blockIdx.y;
  ((C *)a.part)[at] = acc.v;
  if (Acc<C, OP>::ext) a.part_idx[at] = acc.i;
}

__device__ __forceinline__ int64_t kept_offset(const RedArgs &a, int64_t o, int nk) {
  int64_t off = 0;
  for (int d = nk - 1; d >= 0; d--) {
    int64_t s = a.kshape[d];
    off += (o % s) * a.kstride[d];
    o /= s;
  }
  return off;
}

__device__ __forceinline__ int64_t red_offset(const RedArgs &a, int64_t r) {
  if (a.nr == 1) return r * a.rstride[0];
  int64_t off = 0;
  for (int d = a.nr - 1; d >= 0; d--) {
    int64_t s = a.rshape[d];
    off += (r % s) * a.rstride[d];
    r /= s;
  }
  return off;
}

/* Merge the splits' partials of output o, then finalize: TPO threads per
 * output (a warp, or the block when there are few outputs and many splits,
 * as for a sum over everything), four partial loads in flight per thread,
 * read at L2 (__ldcg: other SMs wrote them). The merge order depends on
 * splits and TPO only: deterministic, and the same whether reduce_finish or
 * the last block of a split kernel runs it. TPO == kBlock: a 1-D block,
 * every thread calls it. */
template <typename C, int OP, int TPO>
__device__ __forceinline__ void merge_one(const RedArgs &a, int64_t o, int lane, bool live) {
  Acc<C, OP> acc;
  acc.init();
  if (live) {
    for (int s = lane; s < a.splits; s += 4 * TPO) {
      C v[4];
      int64_t ix[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const int64_t at = o * a.splits + s + u * TPO;
        if (s + u * TPO < a.splits) {
          v[u] = __ldcg((const C *)a.part + at);
          ix[u] = Acc<C, OP>::ext ? __ldcg((const long long *)a.part_idx + at) : 0;
        }
      }
#pragma unroll
      for (int u = 0; u < 4; u++)
        if (s + u * TPO < a.splits) acc.merge(v[u], ix[u]);
    }
  }
  if constexpr (TPO == 32) acc.warp_merge();
  else acc.block_merge();
  if (live && lane == 0) finalize<C, OP>(a, o, acc.v, acc.i);
}

/* Whether reduce_finish would take a block per output (and the last block
 * of a split kernel likewise). */
__host__ __device__ __forceinline__ bool finish_by_block(int64_t splits, int64_t n_out) {
  return splits > 64 && n_out < 256;
}

/* The end of a split kernel (a.cnt set): after its partials of outputs
 * [o0, o1) are written, the block counts itself in; the last of the column's
 * gridDim.y blocks merges them (merge_one, as reduce_finish would: same
 * bits) and zeroes the count for the next launch on this stream. Every
 * thread of the block calls it. tid: the linear thread index. Saves the
 * finishing launch: its launch gap and its ramp, ~2-3 µs an H100 call. */
template <typename C, int OP>
__device__ void split_done(const RedArgs &a, int64_t o0, int64_t o1, int tid) {
  __shared__ int last;
  __threadfence();                                   /* this block's partials, visible before its count */
  __syncthreads();
  if (tid == 0) last = atomicAdd(a.cnt + blockIdx.x, 1) == (int)gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (finish_by_block(a.splits, a.n_out)) {
    for (int64_t o = o0; o < o1; o++) {
      merge_one<C, OP, kBlock>(a, o, tid, true);
      __syncthreads();                               /* block_merge's shared slots, reused */
    }
  } else {
    for (int64_t o = o0 + tid / 32; o < o1; o += kBlock / 32) merge_one<C, OP, 32>(a, o, tid % 32, true);
  }
  if (tid == 0) a.cnt[blockIdx.x] = 0;
}

/* rows: TPO threads per output (32: a warp, kBlock: the block). T: the
 * storage type for Packed128 loads (aligned unit-stride rows), or void for
 * the generic strided load of any dtype. */
template <typename T, typename C, int OP, int TPO, bool KEEP = false>
__global__ void __launch_bounds__(kBlock, kMinBlocks) reduce_rows(RedArgs a) {
  constexpr int per = kBlock / TPO;
  const int64_t o = (int64_t)blockIdx.x * per + threadIdx.x / TPO;
  const int lane = threadIdx.x % TPO;
  const bool live = o < a.n_out;
  Acc<C, OP> acc;
  acc.init();
  if (live) {
    const int64_t base = kept_offset(a, o, a.nk);
    const int64_t r0 = (int64_t)blockIdx.y * a.chunk;
    const int64_t r1 = r0 + a.chunk < a.n_red ? r0 + a.chunk : a.n_red;
    const C sh = ref_of<C, OP>(a, o);
    if constexpr (!std::is_void<T>::value) {
      /* kUnroll 16-byte loads in flight per thread, issued before the first
       * use; the last trip predicates them instead of falling back to one
       * load at a time (r0 is vector-aligned: chunks are multiples of 16) */
      constexpr int V = 16 / (int)sizeof(T);
      const uint4 *q = (const uint4 *)((const T *)a.in + base + r0);
      const int64_t nv = (r1 - r0) / V;
      C mx = (C)0;        /* KEEP: the extreme so far, */
      int64_t wi = -1;    /* the index of the kept load's first element (-1: none yet) */
      uint4 wk = make_uint4(0, 0, 0, 0);   /* and the kept load */
      for (int64_t j = lane; j < nv; j += (int64_t)kUnroll * TPO) {
        uint4 pk[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++)
          if (j + u * TPO < nv) pk[u] = q[j + u * TPO];
        if constexpr (Acc<C, OP>::ext && KEEP) {
          /* max/min, branch-free (issue 12): each load's extreme, the trip's,
           * and when the trip beats the state (mx: the state's value; none
           * yet: wi < 0), the trip's first load holding it is kept (wk, its
           * element index wi); that one load is searched after the loop. A
           * thread's elements come in index order, so the first trip to reach
           * the extreme, its first load holding it and that load's first
           * element holding it are the CPU's first extreme. */
          C mm[kUnroll];
#pragma unroll
          for (int u = 0; u < kUnroll; u++)   /* a load past the end (unread) repeats load 0 */
            mm[u] = u == 0 || j + u * TPO < nv ? vec_extreme<T, C, OP>(pk[u]) : mm[0];
          C m = mm[0];
#pragma unroll
          for (int u = 1; u < kUnroll; u++)
            if (j + u * TPO < nv) m = ext_nan<OP>(m, mm[u]);
          const bool mn = m_isnan(m);
          int uh = 0;
#pragma unroll
          for (int u = kUnroll - 1; u > 0; u--)
            if (j + u * TPO < nv && (mn ? m_isnan(mm[u]) : (OP == R_MAX ? !(mm[u] < m) : !(mm[u] > m)))) uh = u;
          if (mn ? m_isnan(mm[0]) : (OP == R_MAX ? !(mm[0] < m) : !(mm[0] > m))) uh = 0;
          if (seq_better<C, OP>(m, mx, wi < 0)) {
            mx = m;
            wi = r0 + (j + uh * TPO) * V;
#pragma unroll
            for (int u = 0; u < kUnroll; u++)
              if (u == uh) wk = pk[u];
          }
        } else if constexpr (Acc<C, OP>::ext) {
          /* max/min: the extreme of the trip's live loads (pk[0] always is)
           * against the state, and only when it wins, the loads in order */
          C m = vec_extreme<T, C, OP>(pk[0]);
#pragma unroll
          for (int u = 1; u < kUnroll; u++)
            if (j + u * TPO < nv) m = ext_nan<OP>(m, vec_extreme<T, C, OP>(pk[u]));
          if (acc.later_better(m)) {
#pragma unroll
            for (int u = 0; u < kUnroll; u++)
              if (j + u * TPO < nv) push_vec<T, C, OP>(acc, pk[u], r0 + (j + u * TPO) * V);
          }
        } else {
#pragma unroll
          for (int u = 0; u < kUnroll; u++) {
            if (j + u * TPO < nv) {
              const int64_t at = r0 + (j + u * TPO) * V;
#pragma unroll
              for (int e = 0; e < V; e++) acc.push(raw_elem<C, T>(pk[u], e), at + e, sh);
            }
          }
        }
      }
      if constexpr (Acc<C, OP>::ext && KEEP)
        if (wi >= 0) push_vec<T, C, OP>(acc, wk, wi);   /* acc is empty: the kept load's winner */
      const T *p = (const T *)a.in + base;
      for (int64_t t = r0 + nv * V + lane; t < r1; t += TPO) acc.push(to_compute<C, T>(p[t]), t, sh);
    } else {
      int64_t r = r0 + lane;
      for (; r + 3 * TPO < r1; r += 4 * TPO) {   /* four loads in flight */
        C v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = load_as<C>(a.in, a.dtype, base + red_offset(a, r + u * TPO));
#pragma unroll
        for (int u = 0; u < 4; u++) acc.push(v[u], r + u * TPO, sh);
      }
      for (; r < r1; r += TPO) acc.push(load_as<C>(a.in, a.dtype, base + red_offset(a, r)), r, sh);
    }
  }
  if constexpr (TPO == 32) acc.warp_merge();
  else acc.block_merge();
  if (live && lane == 0) emit<C, OP>(a, o, acc);
  if (a.cnt) {
    const int64_t o0 = (int64_t)blockIdx.x * per;
    split_done<C, OP>(a, o0, o0 + per < a.n_out ? o0 + per : a.n_out, threadIdx.x);
  }
}

/* cols: blockDim (32, 8); output o = outer * K + k with k contiguous. */
template <typename C, int OP>
__global__ void __launch_bounds__(kBlock) reduce_cols(RedArgs a) {
  const int64_t K = a.kshape[a.nk - 1], kb = (K + 31) / 32;
  const int64_t ob = blockIdx.x / kb, k = (blockIdx.x % kb) * 32 + threadIdx.x;
  const bool live = k < K;
  const int64_t o = ob * K + k;
  Acc<C, OP> acc;
  acc.init();
  if (live) {
    const int64_t base = kept_offset(a, ob, a.nk - 1) + k;
    const int64_t r0 = (int64_t)blockIdx.y * a.chunk;
    const int64_t r1 = r0 + a.chunk < a.n_red ? r0 + a.chunk : a.n_red;
    const C sh = ref_of<C, OP>(a, o);
    int64_t r = r0 + threadIdx.y;
    for (; r + 24 < r1; r += 32) {   /* four rows in flight */
      C v[4];
#pragma unroll
      for (int u = 0; u < 4; u++) v[u] = load_as<C>(a.in, a.dtype, base + red_offset(a, r + u * 8));
#pragma unroll
      for (int u = 0; u < 4; u++) acc.push(v[u], r + u * 8, sh);
    }
    for (; r < r1; r += 8) acc.push(load_as<C>(a.in, a.dtype, base + red_offset(a, r)), r, sh);
  }
  __shared__ C sv[8][32];
  __shared__ int64_t si[8][32];
  sv[threadIdx.y][threadIdx.x] = acc.v;
  si[threadIdx.y][threadIdx.x] = acc.i;
  __syncthreads();
  if (threadIdx.y == 0 && live) {
#pragma unroll
    for (int y = 1; y < 8; y++) acc.merge(sv[y][threadIdx.x], si[y][threadIdx.x]);
    emit<C, OP>(a, o, acc);
  }
}

/* cols with 16-byte loads: blockDim (32, 8) as reduce_cols, but thread x
 * covers V = 16 / sizeof(T) neighbouring outputs, so a warp reads 512
 * contiguous bytes of a row per load (reduce_cols: 32 elements, 64 bytes in
 * bf16). The host checks K % V == 0 and that every row start is 16-byte
 * aligned. */
template <typename T, typename C, int OP>
__global__ void __launch_bounds__(kBlock) reduce_cols_vec(RedArgs a) {
  constexpr int V = 16 / (int)sizeof(T);
  constexpr bool ext = Acc<C, OP>::ext;
  const int64_t K = a.kshape[a.nk - 1], kb = (K + 32 * V - 1) / (32 * V);
  const int64_t ob = blockIdx.x / kb, k = (blockIdx.x % kb) * 32 * V + (int64_t)threadIdx.x * V;
  const bool live = k < K;
  Acc<C, OP> acc[V];
#pragma unroll
  for (int e = 0; e < V; e++) acc[e].init();
  if (live) {
    const T *p = (const T *)a.in + kept_offset(a, ob, a.nk - 1) + k;
    const int64_t r0 = (int64_t)blockIdx.y * a.chunk;
    const int64_t r1 = r0 + a.chunk < a.n_red ? r0 + a.chunk : a.n_red;
    C sh[V];
#pragma unroll
    for (int e = 0; e < V; e++) sh[e] = ref_of<C, OP>(a, ob * K + k + e);
    /* U rows in flight per thread (8 threads down a block column), the last
     * trip predicated; the row address by one multiply when one dim is reduced */
    constexpr int U = ext ? kColsUnrollExt : kColsUnroll;
    const int64_t rs = a.rstride[0];
    C ev[ext ? V : 1];     /* max/min: each output's extreme so far and its row - r0 (-1: none yet) */
    int ei[ext ? V : 1];
#pragma unroll
    for (int e = 0; e < (ext ? V : 1); e++) { ev[e] = acc[e].v; ei[e] = -1; }
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8 * U) {
      uint4 pk[U];
#pragma unroll
      for (int u = 0; u < U; u++)
        if (r + u * 8 < r1) pk[u] = *(const uint4 *)(p + (a.nr == 1 ? (r + u * 8) * rs : red_offset(a, r + u * 8)));
      if constexpr (ext) {
        /* max/min, per output: the extreme of the trip's live rows (row r
         * always is) against the state, and only when it wins, the rows in
         * order (push_vec's idea, down a column); the row kept as a 32-bit
         * offset from r0 (the host keeps chunks under 2^31) */
#pragma unroll
        for (int e = 0; e < V; e++) {
          C m = raw_elem<C, T>(pk[0], e);
#pragma unroll
          for (int u = 1; u < U; u++)
            if (r + u * 8 < r1) m = ext_nan<OP>(m, raw_elem<C, T>(pk[u], e));
          if (seq_better<C, OP>(m, ev[e], ei[e] < 0)) {
#pragma unroll
            for (int u = 0; u < U; u++) {
              if (r + u * 8 < r1) {
                const C x = raw_elem<C, T>(pk[u], e);
                if (seq_better<C, OP>(x, ev[e], ei[e] < 0)) { ev[e] = x; ei[e] = (int)(r - r0) + u * 8; }
              }
            }
          }
        }
      } else {
#pragma unroll
        for (int u = 0; u < U; u++)
          if (r + u * 8 < r1) {
#pragma unroll
            for (int e = 0; e < V; e++) acc[e].push(raw_elem<C, T>(pk[u], e), r + u * 8, sh[e]);
          }
      }
    }
    if constexpr (ext) {
#pragma unroll
      for (int e = 0; e < V; e++) { acc[e].v = ev[e]; acc[e].i = ei[e] < 0 ? -1 : r0 + ei[e]; }
    }
  }
  __shared__ C sv[8][32 * V];
  __shared__ int64_t si[ext ? 8 : 1][ext ? 32 * V : 1];
#pragma unroll
  for (int e = 0; e < V; e++) {
    sv[threadIdx.y][threadIdx.x * V + e] = acc[e].v;
    if constexpr (ext) si[threadIdx.y][threadIdx.x * V + e] = acc[e].i;
  }
  __syncthreads();
  if (threadIdx.y == 0 && live) {
#pragma unroll
    for (int e = 0; e < V; e++) {
      for (int y = 1; y < 8; y++) acc[e].merge(sv[y][threadIdx.x * V + e], ext ? si[y][threadIdx.x * V + e] : 0);
      emit<C, OP>(a, ob * K + k + e, acc[e]);
    }
  }
}

/* The split column max/min kernels' own merge (a.cnt set, with WIDE; issue
 * 12: it saves reduce_finish's launch, ~2-3 us of the bf16 max over dim 0
 * of 8192^2's 43). Thread tid holds column o's partial acc (col: a live
 * column) and writes it split-major, part[split * n_out + o], coalesced
 * across the block's columns (the row as 32 bits); the last of the
 * column's gridDim.y blocks to count in (split_done's fence and count)
 * merges every split's partial, in split order, a thread per column with
 * 16 L2 reads in flight, and finalizes. max/min's order (NaN first, value,
 * lower index) is total over distinct indices, so the bits are
 * reduce_finish's whatever the order. Every thread of the block calls it. */
template <typename C, int OP>
__device__ __forceinline__ void cols_ext_last(const RedArgs &a, bool col, int64_t o, Acc<C, OP> acc, int tid) {
  __shared__ int last;
  if (col) {
    ((C *)a.part)[(int64_t)blockIdx.y * a.n_out + o] = acc.v;
    ((int *)a.part_idx)[(int64_t)blockIdx.y * a.n_out + o] = (int)acc.i;   /* n_red < 2^30 here (host) */
  }
  __threadfence();                                   /* the partials, visible before the count */
  __syncthreads();
  if (tid == 0) last = atomicAdd(a.cnt + blockIdx.x, 1) == (int)gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (col) {
    acc.init();
    constexpr int B = sizeof(C) == 4 ? 16 : 8;   /* bf16 8192^2's 16 splits: one L2 round trip, no spills */
    for (int s = 0; s < a.splits; s += B) {
      C v[B];
      int ix[B];
#pragma unroll
      for (int u = 0; u < B; u++) {
        const int64_t at = (int64_t)(s + u) * a.n_out + o;
        if (s + u < a.splits) {
          v[u] = __ldcg((const C *)a.part + at);
          ix[u] = __ldcg((const int *)a.part_idx + at);
        }
      }
#pragma unroll
      for (int u = 0; u < B; u++)
        if (s + u < a.splits) acc.merge(v[u], ix[u]);
    }
    finalize<C, OP>(a, o, acc.v, acc.i);
  }
  if (tid == 0) a.cnt[blockIdx.x] = 0;
}

/* The end of the column max/min kernels: each thread's V extremes M (m's
 * bits) and rows R (offsets from r0, -1: none). The 8 threads down each
 * block column meet in shared memory (y order: deterministic); WIDE (the
 * default, with CLAMP): a thread per column merges and emits, else y == 0
 * emits its V columns one at a time (few registers). A zero or NaN winner's
 * own bits are read again (m may carry the other zero's sign or another NaN). */
template <typename T, typename C, int OP, int V, bool WIDE = false>
__device__ __forceinline__ void cols_ext_emit(const RedArgs &a, const T *p, int64_t r0, int64_t rs, bool live,
                                              int64_t ob, int64_t K, int64_t k, C (&M)[V], const int (&R)[V]) {
  /* WIDE keeps the rows - r0 (R) in shared, 32-bit, and pads each thread's
   * V slots to SW = V + 1 (odd, in 4-byte words; f64's 3 x 8 bytes is
   * conflict-free per half-warp too): thread x's slot e sits in bank
   * (x SW + e) % 32, a different bank for each of the warp's 32 x, where x V
   * + e put 8 threads on a bank for bf16 (4 for f32) -- with i64 rows 16 --
   * so the 16 stores took ~190 shared wavefronts a warp, ~6000 cycles for an
   * SM's 32 warps ending together in the one-wave grid (issue 12: ~3 us of
   * the bf16 8192^2 tail). Now 16, and the reads by column <= 2-way. */
  using SI = typename std::conditional<WIDE, int, int64_t>::type;
  constexpr int SW = WIDE ? V + 1 : V;
  __shared__ C sv[8][32 * SW];
  __shared__ SI si[8][32 * SW];
#pragma unroll
  for (int e = 0; e < V; e++) {
    if (live && R[e] >= 0 && (m_isnan(M[e]) || M[e] == (C)0)) {   /* the winner's own bits */
      M[e] = to_compute<C, T>(p[(r0 + R[e]) * rs + e]);
    }
    sv[threadIdx.y][threadIdx.x * SW + e] = M[e];
    if constexpr (WIDE) si[threadIdx.y][threadIdx.x * SW + e] = R[e];
    else si[threadIdx.y][threadIdx.x * SW + e] = R[e] < 0 ? -1 : r0 + R[e];
  }
  __syncthreads();
  if constexpr (WIDE) {
    /* the block's 32 V columns spread over its 256 threads (32 V <= 256):
     * one column's 7 merges a thread, in the same y order, instead of V
     * columns' 56 on the y == 0 warp while 7 warps wait (~1 µs a block) */
    const int c = threadIdx.y * 32 + threadIdx.x;
    const int64_t kc = k - (int64_t)threadIdx.x * V + c;   /* the block's first column + c */
    const bool col = c < 32 * V && kc < K;
    const int sc = (c / V) * SW + c % V;                     /* column c's slot: thread c / V's slot c % V */
    Acc<C, OP> acc;
    acc.init();
    if (col) {
      acc.v = sv[0][sc];
      acc.i = si[0][sc] < 0 ? -1 : r0 + si[0][sc];
#pragma unroll
      for (int y = 1; y < 8; y++) acc.merge(sv[y][sc], si[y][sc] < 0 ? -1 : r0 + si[y][sc]);
    }
    if (a.cnt) cols_ext_last<C, OP>(a, col, ob * K + kc, acc, c);
    else if (col) emit<C, OP>(a, ob * K + kc, acc);
  } else if (threadIdx.y == 0 && live) {
    for (int e = 0; e < V; e++) {
      Acc<C, OP> acc;
      acc.v = sv[0][threadIdx.x * V + e];
      acc.i = si[0][threadIdx.x * V + e];
      for (int y = 1; y < 8; y++) acc.merge(sv[y][threadIdx.x * V + e], si[y][threadIdx.x * V + e]);
      emit<C, OP>(a, ob * K + k + e, acc);
    }
  }
}

/* A column trip's U rows in flight: row r + 8u, or row r again past the
 * chunk (row r is always live; a repeat changes neither m nor the first row
 * equal to it). CLAMP picks the row's address, not the value: the old
 * "else pk[0]" (CLAMP false, EMBER_REDUCE_COLS_CLAMP=0) made ptxas copy
 * pk[0]'s registers ahead of the second load, and that copy waits for the
 * first load to land -- each trip paid two memory latencies, the first with
 * one row in flight (issue 12: bf16 max over dim 0 of 8192^2 at 60 %). The
 * repeated row of a short last trip is an L1/L2 hit. */
template <int U, bool CLAMP, typename T>
__device__ __forceinline__ void cols_trip_load(uint4 (&pk)[U], const T *p, int64_t r, int64_t r1, int64_t rs) {
#pragma unroll
  for (int u = 0; u < U; u++) {
    if constexpr (CLAMP) {
      const int64_t ru = u == 0 || r + u * 8 < r1 ? r + u * 8 : r;
      pk[u] = *(const uint4 *)(p + ru * rs);
    } else {
      pk[u] = u == 0 || r + u * 8 < r1 ? *(const uint4 *)(p + (r + u * 8) * rs) : pk[0];
    }
  }
}

/* max/min down columns, branch-free (issue 12: reduce_cols_vec's max/min
 * searched a trip's rows whenever one lane's extreme moved, which with 32
 * columns a warp is nearly every trip, and held 80-92 registers: 2 blocks
 * per SM). Per output and trip of U rows: the trip's extreme m (max.NaN:
 * U-1 instructions), the first row equal to it by a reverse select (2 per
 * element; a NaN m, rare, searches the first NaN instead), then one
 * later_better against the state (M, R). Rows come in index order within a
 * thread, so the first trip to reach the extreme and its first row equal to
 * it are the CPU's first extreme. M keeps m, whose bits are the winner's
 * except for a zero's sign or a NaN's payload: those winners are read again
 * once at the end (one element). ~3 instructions per f32 element, ~4 for
 * bf16/f16 (the conversion); <= 64 registers: 4 blocks per SM. */
template <typename T, typename C, int OP, bool CLAMP>
__global__ void __launch_bounds__(kBlock, kMinBlocks) reduce_cols_ext(RedArgs a) {
  constexpr int V = 16 / (int)sizeof(T);
  constexpr int U = V == 8 ? 4 : kColsUnrollExt;   /* 16-bit: 8 rows spill at 64 registers */
  const int64_t K = a.kshape[a.nk - 1], kb = (K + 32 * V - 1) / (32 * V);
  const int64_t ob = blockIdx.x / kb, k = (blockIdx.x % kb) * 32 * V + (int64_t)threadIdx.x * V;
  const bool live = k < K;
  const T *p = (const T *)a.in + (live ? kept_offset(a, ob, a.nk - 1) + k : 0);
  const int64_t r0 = (int64_t)blockIdx.y * a.chunk;
  const int64_t r1 = r0 + a.chunk < a.n_red ? r0 + a.chunk : a.n_red;
  const int64_t rs = a.rstride[0];
  C M[V];      /* each output's extreme so far (m's bits) */
  int R[V];    /* ... and its row - r0 (-1: none yet; the host keeps chunks under 2^31) */
#pragma unroll
  for (int e = 0; e < V; e++) { M[e] = OP == R_MAX ? lowest<C>() : highest<C>(); R[e] = -1; }
  for (int64_t r = r0 + threadIdx.y; live && r < r1; r += 8 * U) {
    /* U rows in flight; a row past the chunk repeats row r (always live),
     * which changes neither m nor the first row equal to it */
    uint4 pk[U];
    cols_trip_load<U, CLAMP>(pk, p, r, r1, rs);
    const int rr = (int)(r - r0);
#pragma unroll
    for (int e = 0; e < V; e++) {
      C m = raw_elem<C, T>(pk[0], e);
#pragma unroll
      for (int u = 1; u < U; u++) m = ext_nan<OP>(m, raw_elem<C, T>(pk[u], e));
      /* the first row holding m: a reverse select keeps the lowest hit */
      int uh = 0;
      if (!m_isnan(m)) {
        /* no NaN in the trip: x <= m (>= for min) everywhere, so "not
         * below m" is "equal to m" (-0 == +0, as the CPU's compare) */
#pragma unroll
        for (int u = U - 1; u >= 0; u--) {
          const C x = raw_elem<C, T>(pk[u], e);
          if (OP == R_MAX ? !(x < m) : !(x > m)) uh = u;
        }
      } else {
#pragma unroll
        for (int u = U - 1; u >= 0; u--)
          if (m_isnan(raw_elem<C, T>(pk[u], e))) uh = u;
      }
      if (seq_better<C, OP>(m, M[e], R[e] < 0)) { M[e] = m; R[e] = rr + uh * 8; }
    }
  }
  cols_ext_emit<T, C, OP, V, CLAMP>(a, p, r0, rs, live, ob, K, k, M, R);
}

/* bf16 pairs (two neighbouring columns in one 32-bit word): max.NaN /
 * min.NaN, compares into 0xffff-per-half masks and selects (LOP3), each on
 * two columns at once. A max/min's result is one of its inputs (or a NaN),
 * so working on the bf16 bits changes nothing but the instruction count. */
template <int OP> __device__ __forceinline__ uint32_t bx2_ext(uint32_t a, uint32_t b) {
  uint32_t r;
  if constexpr (OP == R_MAX) asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  else asm("min.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t bx2_eq(uint32_t a, uint32_t b) {   /* -0 == +0; a NaN equals nothing */
  uint32_t r;
  asm("set.eq.u32.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t bx2_nan(uint32_t a) {
  uint32_t r;
  asm("set.nan.u32.bf16x2 %0, %1, %1;" : "=r"(r) : "r"(a));
  return r;
}
/* !(m <= s) for max (!(m >= s) for min): m beats s, or either is a NaN */
template <int OP> __device__ __forceinline__ uint32_t bx2_beats(uint32_t m, uint32_t s) {
  uint32_t r;
  if constexpr (OP == R_MAX) asm("set.gtu.u32.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(m), "r"(s));
  else asm("set.ltu.u32.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(m), "r"(s));
  return r;
}
__device__ __forceinline__ uint32_t bx2_sel(uint32_t mask, uint32_t a, uint32_t b) { return (a & mask) | (b & ~mask); }

/* reduce_cols_ext for bf16, two columns an instruction (issue 12: the f32
 * compute of reduce_cols_ext held 4 rows of 8 bf16 in flight at 64
 * registers -- 64 B a thread, half the f32 kernel's 128 B -- and ran at
 * 50 % of the bandwidth). Here the state is bf16 pairs: M (the extremes'
 * bits) and R (their rows - r0, two 16-bit halves; 0xffff: none yet; the
 * host keeps chunks under 65535), 8 registers for 8 columns, so 8 rows (128
 * B) are in flight at 64 registers. Per pair and trip of U rows: U-1
 * max.NaN, the first row equal to m by a reverse select (a compare and a
 * LOP3 per row; a trip holding a NaN, rare, searches the first NaN
 * instead), and one "later better" against the state: !(m <= M) unless M
 * is a NaN (seq_better). Row r is always live, so a thread that has trips
 * has a row unless every m it saw was the infinity it started from (every
 * element -inf for max): then R stays none, and the merge's -1 / index 0
 * rule gives the CPU's answer (the whole column is that infinity, row 0
 * first). ~1.6 instructions an element; same values, indices and bits as
 * reduce_cols_ext (EMBER_REDUCE_COLS_BF16X2=0 runs that one). */
template <int OP, bool CLAMP, int U = kColsUnrollExt>
__global__ void __launch_bounds__(kBlock, kMinBlocks) reduce_cols_bx2(RedArgs a) {
  using T = __nv_bfloat16;
  constexpr int V = 8, P = V / 2;
  const int64_t K = a.kshape[a.nk - 1], kb = (K + 32 * V - 1) / (32 * V);
  const int64_t ob = blockIdx.x / kb, k = (blockIdx.x % kb) * 32 * V + (int64_t)threadIdx.x * V;
  const bool live = k < K;
  const T *p = (const T *)a.in + (live ? kept_offset(a, ob, a.nk - 1) + k : 0);
  const int64_t r0 = (int64_t)blockIdx.y * a.chunk;
  const int64_t r1 = r0 + a.chunk < a.n_red ? r0 + a.chunk : a.n_red;
  const int64_t rs = a.rstride[0];
  uint32_t M[P], R[P];
#pragma unroll
  for (int j = 0; j < P; j++) { M[j] = OP == R_MAX ? 0xff80ff80u : 0x7f807f80u; R[j] = 0xffffffffu; }
  for (int64_t r = r0 + threadIdx.y; live && r < r1; r += 8 * U) {
    uint4 pk[U];   /* a row past the chunk repeats row r, as reduce_cols_ext */
    cols_trip_load<U, CLAMP>(pk, p, r, r1, rs);
    const uint32_t rr = (uint32_t)(r - r0) * 0x00010001u;
    uint32_t m[P], anyn = 0;
#pragma unroll
    for (int j = 0; j < P; j++) {
      m[j] = word_at(pk[0], j);
#pragma unroll
      for (int u = 1; u < U; u++) m[j] = bx2_ext<OP>(m[j], word_at(pk[u], j));
      anyn |= bx2_nan(m[j]);
    }
#pragma unroll
    for (int j = 0; j < P; j++) {
      /* uh: each half's first row (0..U-1) holding m, lowest last */
      uint32_t uh = 0;
      if (!anyn) {
#pragma unroll
        for (int u = U - 1; u >= 0; u--) uh = bx2_sel(bx2_eq(word_at(pk[u], j), m[j]), (uint32_t)u * 0x00010001u, uh);
      } else {
        /* a NaN half: x == m holds nowhere there, and x is a NaN only there */
#pragma unroll
        for (int u = U - 1; u >= 0; u--) {
          const uint32_t x = word_at(pk[u], j);
          uh = bx2_sel(bx2_eq(x, m[j]) | bx2_nan(x), (uint32_t)u * 0x00010001u, uh);
        }
      }
      const uint32_t b = bx2_beats<OP>(m[j], M[j]) & ~bx2_nan(M[j]);
      M[j] = bx2_sel(b, m[j], M[j]);
      R[j] = bx2_sel(b, rr + (uh << 3), R[j]);
    }
  }
  float Mf[V];
  int Ri[V];
#pragma unroll
  for (int e = 0; e < V; e++) {
    const uint32_t h = (e & 1) ? R[e >> 1] >> 16 : R[e >> 1] & 0xffffu;
    Ri[e] = h == 0xffffu ? -1 : (int)h;
    Mf[e] = __uint_as_float((e & 1) ? (M[e >> 1] & 0xffff0000u) : (M[e >> 1] << 16));
  }
  cols_ext_emit<T, float, OP, V, CLAMP>(a, p, r0, rs, live, ob, K, k, Mf, Ri);
}

template <typename C, int OP, int TPO>
__global__ void __launch_bounds__(kBlock) reduce_finish(RedArgs a) {
  constexpr int per = kBlock / TPO;
  const int64_t o = (int64_t)blockIdx.x * per + threadIdx.x / TPO;
  merge_one<C, OP, TPO>(a, o, threadIdx.x % TPO, o < a.n_out);
}

/* The arrival counts of split kernels launched on stream s of device dev:
 * the stream's zeroed counters (counters.cu; left zero by every kernel that
 * uses them, split_done), NULL while capturing or when none can be had (the
 * caller then launches reduce_finish). */
constexpr int kMaxCounts = EM_STREAM_COUNTERS;
int *split_counts(int dev, cudaStream_t s) { return em_stream_counters(dev, (void *)s, kMaxCounts); }

template <typename C> em_dtype dtype_of() {
  return std::is_same<C, double>::value ? EM_F64 : std::is_same<C, float>::value ? EM_F32 : EM_I64;
}

/* EMBER_REDUCE_EXT_VEC=0: max/min leave the vector kernels (a load's extreme,
 * then the search) for the scalar ones, one element at a time as before
 * issue 12's rework; read once. */
bool ext_vec_on() {
  static const bool on = em_env_switch("EMBER_REDUCE_EXT_VEC", true);
  return on;
}

/* EMBER_REDUCE_COLS_EXT=0: max/min down columns take reduce_cols_vec's
 * search-when-it-moves loop (2 blocks per SM, a 256-block grid) instead of
 * reduce_cols_ext; read once. */
bool cols_ext_on() {
  static const bool on = em_env_switch("EMBER_REDUCE_COLS_EXT", true);
  return on;
}

/* EMBER_REDUCE_COLS_BF16X2=0: bf16 max/min down columns run reduce_cols_ext
 * (f32 compares, 4 rows in flight) instead of reduce_cols_bx2; read once. */
bool cols_bx2_on() {
  static const bool on = em_env_switch("EMBER_REDUCE_COLS_BF16X2", true);
  return on;
}

/* EMBER_REDUCE_COLS_CLAMP=0: the column max/min kernels as before gpured6:
 * a short last trip's rows copied from the first row's registers (each trip
 * then waits out two load latencies, see cols_trip_load) instead of
 * re-reading row r, and the y == 0 warp merging the block's columns alone
 * (cols_ext_emit's WIDE); read once. */
bool cols_clamp_on() {
  static const bool on = em_env_switch("EMBER_REDUCE_COLS_CLAMP", true);
  return on;
}

/* EMBER_REDUCE_COLS_LAST=0: split column max/min (with the clamp) leave
 * their partials to reduce_finish, a second launch, instead of merging them
 * in the column's last block (cols_ext_last); read once. */
bool cols_last_on() {
  static const bool on = em_env_switch("EMBER_REDUCE_COLS_LAST", true);
  return on;
}

/* EMBER_REDUCE_COLS_BX2_ROWS4=1 (opt-in, a measurement): reduce_cols_bx2
 * with 4 rows in flight a thread (64 B, 64 KiB an SM) instead of 8 (128 B,
 * 128 KiB: 4x the ~32 KiB Little's law asks for at ~1 us); read once. */
bool cols_bx2_rows4() {
  static const bool on = em_env_switch("EMBER_REDUCE_COLS_BX2_ROWS4", false);
  return on;
}

/* EMBER_REDUCE_ROWS_KEEP=0: max/min along rows search a trip's loads
 * whenever its extreme beats the state (push_vec) instead of keeping the
 * trip's winning load and searching it once (reduce_rows' KEEP); read once. */
bool rows_keep_on() {
  static const bool on = em_env_switch("EMBER_REDUCE_ROWS_KEEP", true);
  return on;
}

/* One reduction pass: out (contiguous, may be NULL) and idx (may be NULL). */
template <typename C, int OP>
int reduce_pass(const char *name, const em_tensor *a, const em_red_plan *p, const void *ref,
                em_tensor *out, em_tensor *idx, double scale) {
  if (p->n_out == 0) return 0;
  const int dev = a->device.index;
  if (em_use_device(dev, name)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  RedArgs r;
  memset(&r, 0, sizeof r);
  r.in = em_data_ptr(a); r.dtype = a->dtype;
  r.nk = p->nk; r.nr = p->nr;
  for (int d = 0; d < EM_MAX_DIMS; d++) {
    r.kshape[d] = p->kshape[d]; r.kstride[d] = p->kstride[d];
    r.rshape[d] = p->rshape[d]; r.rstride[d] = p->rstride[d];
  }
  r.n_out = p->n_out; r.n_red = p->n_red;
  r.ref = ref;
  r.out = out ? em_data_ptr(out) : NULL; r.out_dtype = out ? out->dtype : EM_F32;
  r.out_idx = idx ? (int64_t *)em_data_ptr(idx) : NULL;
  r.scale = scale;
  const size_t es = em_dtype_size(a->dtype);

  bool cols = p->nk > 0 && p->kstride[p->nk - 1] == 1 && p->rstride[p->nr - 1] != 1 && p->n_red > 1;
  /* cols with 16-byte loads: a float storage the compute type reads, K a
   * multiple of the vector, every row start 16-byte aligned */
  const int cv = (int)(16 / es);
  bool cvec = cols && (std::is_same<C, double>::value ? a->dtype == EM_F64
                                                      : std::is_same<C, float>::value &&
                                                        (a->dtype == EM_F32 || a->dtype == EM_BF16 || a->dtype == EM_F16)) &&
              p->kshape[p->nk - 1] % cv == 0 && ((uintptr_t)r.in & 15) == 0;
  for (int d = 0; cvec && d < p->nr; d++) cvec = (p->rstride[d] * (int64_t)es) % 16 == 0;
  for (int d = 0; cvec && d < p->nk - 1; d++) cvec = (p->kstride[d] * (int64_t)es) % 16 == 0;
  /* max/min there keep a row as a 32-bit offset into the chunk */
  if (Acc<C, OP>::ext && (p->n_red > INT32_MAX / 2 || !ext_vec_on())) cvec = false;
  /* the split count changes no max/min (their order is total: value, then
   * index), so their column kernel may aim for its own one-wave grid */
  const bool cext = Acc<C, OP>::ext && cvec && p->nr == 1 && cols_ext_on();
  const int64_t target = Acc<C, OP>::ext && cvec && !cext ? kTargetBlocksExt : kTargetBlocks;
  /* rows with vector loads: unit-stride rows whose starts are all 16-byte aligned */
  bool vec = !cols && p->nr == 1 && p->rstride[0] == 1 && ((uintptr_t)r.in & 15) == 0 &&
             em_dtype_is_float(a->dtype) && (!Acc<C, OP>::ext || ext_vec_on());
  for (int d = 0; vec && d < p->nk; d++) vec = (p->kstride[d] * (int64_t)es) % 16 == 0;
  /* a warp per output for short rows, and for rows up to 16384 when there are
   * enough of them to fill the GPU with warps (2048: ~2 blocks of 8 warps per
   * SM; a constant, so the plan depends on the shape alone) */
  int tpo = p->n_red <= 1024 || (p->n_red <= 16384 && p->n_out >= 2048) ? 32 : kBlock;
  int64_t blocks;
  if (cols) {
    int64_t K = p->kshape[p->nk - 1], w = cvec ? 32 * cv : 32;
    blocks = (p->n_out / K) * ((K + w - 1) / w);
  } else {
    blocks = (p->n_out + (kBlock / tpo) - 1) / (kBlock / tpo);
  }
  /* splits: enough blocks to fill the GPU, each split still a real amount of work */
  int64_t min_split = cols ? 64 : 4096, splits = 1;
  if (blocks < target && p->n_red >= 2 * min_split) {
    splits = (target + blocks - 1) / blocks;
    int64_t most = p->n_red / min_split;
    if (splits > most) splits = most;
    if (splits > 1024) splits = 1024;
    if (splits < 1) splits = 1;
  }
  /* each split 16-element (vector) aligned; on the rows vector path a whole
   * number of the block's trips (kUnroll loads per thread), so no split ends
   * on a partly predicated trip */
  const int64_t gran = vec && splits > 1 ? (int64_t)kUnroll * tpo * (int64_t)(16 / es) : 16;
  int64_t chunk = (p->n_red + splits - 1) / splits;
  chunk = (chunk + gran - 1) / gran * gran;
  if (chunk < 1) chunk = 1;
  splits = p->n_red > 0 ? (p->n_red + chunk - 1) / chunk : 1;
  r.splits = (int)splits; r.chunk = chunk;

  em_tensor *part = NULL, *part_idx = NULL;
  if (splits > 1) {
    int64_t n = p->n_out * splits;
    part = em_empty(1, &n, dtype_of<C>(), a->device);
    if (!part) return -1;
    if (Acc<C, OP>::ext) {
      part_idx = em_empty(1, &n, EM_I64, a->device);
      if (!part_idx) { em_tensor_release(part); return -1; }
      r.part_idx = (int64_t *)em_data_ptr(part_idx);
    }
    r.part = em_data_ptr(part);
  }

  if (blocks > INT32_MAX) {
    em_tensor_release(part); em_tensor_release(part_idx);
    return em_error("%s: %lld outputs are more than one launch handles", name, (long long)p->n_out);
  }
  /* rows kernels: the last block of each blockIdx.x merges the partials (no
   * second launch) where counts exist, and so does the column max/min's
   * (cols_ext_last). The other column kernels keep reduce_finish: the same
   * tail there cost bf16/f16 sums 16 bytes of spills (ptxas -v) */
  const bool clamp = cext && cols_clamp_on();
  if (splits > 1 && blocks <= kMaxCounts && (!cols || (clamp && cols_last_on()))) r.cnt = split_counts(dev, s);
  dim3 grid((unsigned)blocks, (unsigned)splits);
  if (cext) {
    if constexpr (Acc<C, OP>::ext) {   /* cext implies it: no sum/var instances of the max/min kernel */
#define EM_CEXT(T)                                                                              \
  do {                                                                                          \
    if (clamp) reduce_cols_ext<T, C, OP, true><<<grid, dim3(32, 8), 0, s>>>(r);                 \
    else reduce_cols_ext<T, C, OP, false><<<grid, dim3(32, 8), 0, s>>>(r);                      \
  } while (0)
      if constexpr (std::is_same<C, double>::value) EM_CEXT(double);
      else if constexpr (std::is_same<C, float>::value) {
        /* bf16 in pairs: rows kept as 16-bit offsets into the chunk */
        if (a->dtype == EM_BF16 && chunk < 0xffff && cols_bx2_on()) {
          if (clamp && cols_bx2_rows4()) reduce_cols_bx2<OP, true, 4><<<grid, dim3(32, 8), 0, s>>>(r);
          else if (clamp) reduce_cols_bx2<OP, true><<<grid, dim3(32, 8), 0, s>>>(r);
          else reduce_cols_bx2<OP, false><<<grid, dim3(32, 8), 0, s>>>(r);
        } else switch (a->dtype) {
          case EM_F32: EM_CEXT(float); break;
          case EM_BF16: EM_CEXT(__nv_bfloat16); break;
          default: EM_CEXT(__half); break;
        }
      }
#undef EM_CEXT
    }
  } else if (cols && cvec) {
    if constexpr (std::is_same<C, double>::value) reduce_cols_vec<double, C, OP><<<grid, dim3(32, 8), 0, s>>>(r);
    else if constexpr (std::is_same<C, float>::value) {
      switch (a->dtype) {
        case EM_F32: reduce_cols_vec<float, C, OP><<<grid, dim3(32, 8), 0, s>>>(r); break;
        case EM_BF16: reduce_cols_vec<__nv_bfloat16, C, OP><<<grid, dim3(32, 8), 0, s>>>(r); break;
        default: reduce_cols_vec<__half, C, OP><<<grid, dim3(32, 8), 0, s>>>(r); break;
      }
    }
  } else if (cols) {
    reduce_cols<C, OP><<<grid, dim3(32, 8), 0, s>>>(r);
  } else if (vec) {
    /* max/min with vector loads: KEEP (EMBER_REDUCE_ROWS_KEEP), not for f64
     * (eight double extremes spill ~170 bytes at 64 registers) */
#define EM_ROWS(T)                                                                     \
  do {                                                                                 \
    constexpr bool kk = Acc<C, OP>::ext && !std::is_void<T>::value && sizeof(C) == 4; \
    const bool keep = kk && rows_keep_on();                                            \
    if (keep && tpo == 32) reduce_rows<T, C, OP, 32, kk><<<grid, kBlock, 0, s>>>(r);   \
    else if (keep) reduce_rows<T, C, OP, kBlock, kk><<<grid, kBlock, 0, s>>>(r);      \
    else if (tpo == 32) reduce_rows<T, C, OP, 32><<<grid, kBlock, 0, s>>>(r);         \
    else reduce_rows<T, C, OP, kBlock><<<grid, kBlock, 0, s>>>(r);                    \
  } while (0)
    if constexpr (std::is_same<C, double>::value) EM_ROWS(double);
    else if constexpr (std::is_same<C, float>::value) {
      switch (a->dtype) {
        case EM_F32: EM_ROWS(float); break;
        case EM_BF16: EM_ROWS(__nv_bfloat16); break;
        case EM_F16: EM_ROWS(__half); break;
        default: EM_ROWS(void); break;
      }
    } else EM_ROWS(void);
  } else {
    EM_ROWS(void);
#undef EM_ROWS
  }
  int rc = em_launch_check(name);
  if (rc == 0 && splits > 1 && !r.cnt) {
    if (splits > 64 && p->n_out < 256)   /* few outputs, many partials: a block each */
      reduce_finish<C, OP, kBlock><<<(unsigned)p->n_out, kBlock, 0, s>>>(r);
    else
      reduce_finish<C, OP, 32><<<(unsigned)((p->n_out + 7) / 8), kBlock, 0, s>>>(r);
    rc = em_launch_check(name);
  }
  /* the workspace goes back to the stream-ordered cache: later work on this stream reuses it safely */
  em_tensor_release(part);
  em_tensor_release(part_idx);
  return rc;
}

/* Compute type: f64 -> double, other floats -> float, integers -> int64 (sum, max/min). */
bool is_f64(const em_tensor *a) { return a->dtype == EM_F64; }

}  // namespace

extern "C" int em_sum_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p, double div) {
  if (is_f64(a)) return reduce_pass<double, R_SUM>(op, a, p, NULL, res, NULL, div);
  if (em_dtype_is_float(a->dtype)) return reduce_pass<float, R_SUM>(op, a, p, NULL, res, NULL, div);
  return reduce_pass<int64_t, R_SUM>(op, a, p, NULL, res, NULL, 1.0);
}

extern "C" int em_var_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p, double dof) {
  if (!em_dtype_is_float(a->dtype)) return em_error("%s: expected a floating-point input", op);
  em_tensor *mean = em_empty(1, &p->n_out, is_f64(a) ? EM_F64 : EM_F32, a->device);
  if (!mean) return -1;
  int rc;
  if (is_f64(a)) {
    rc = reduce_pass<double, R_SUM>(op, a, p, NULL, mean, NULL, (double)p->n_red);
    if (rc == 0) rc = reduce_pass<double, R_SQDEV>(op, a, p, em_data_ptr(mean), res, NULL, dof);
  } else {
    rc = reduce_pass<float, R_SUM>(op, a, p, NULL, mean, NULL, (double)p->n_red);
    if (rc == 0) rc = reduce_pass<float, R_SQDEV>(op, a, p, em_data_ptr(mean), res, NULL, dof);
  }
  em_tensor_release(mean);
  return rc;
}

extern "C" int em_extreme_cuda(const char *op, const em_tensor *a, const em_red_plan *p, bool is_max,
                               em_tensor *vals, em_tensor *idx) {
  if (is_f64(a))
    return is_max ? reduce_pass<double, R_MAX>(op, a, p, NULL, vals, idx, 1) : reduce_pass<double, R_MIN>(op, a, p, NULL, vals, idx, 1);
  if (em_dtype_is_float(a->dtype))
    return is_max ? reduce_pass<float, R_MAX>(op, a, p, NULL, vals, idx, 1) : reduce_pass<float, R_MIN>(op, a, p, NULL, vals, idx, 1);
  return is_max ? reduce_pass<int64_t, R_MAX>(op, a, p, NULL, vals, idx, 1) : reduce_pass<int64_t, R_MIN>(op, a, p, NULL, vals, idx, 1);
}

extern "C" int em_logsumexp_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p) {
  em_tensor *mx = em_empty(1, &p->n_out, is_f64(a) ? EM_F64 : EM_F32, a->device);
  if (!mx) return -1;
  int rc;
  if (is_f64(a)) {
    rc = reduce_pass<double, R_MAX>(op, a, p, NULL, mx, NULL, 1);
    if (rc == 0) rc = reduce_pass<double, R_SUMEXP>(op, a, p, em_data_ptr(mx), res, NULL, 1);
  } else {
    rc = em_dtype_is_float(a->dtype) ? reduce_pass<float, R_MAX>(op, a, p, NULL, mx, NULL, 1)
                                     : reduce_pass<int64_t, R_MAX>(op, a, p, NULL, mx, NULL, 1);
    if (rc == 0) rc = reduce_pass<float, R_SUMEXP>(op, a, p, em_data_ptr(mx), res, NULL, 1);
  }
  em_tensor_release(mx);
  return rc;
}

/* ======================= softmax, log_softmax ======================= *
 * Rows of length L along dim d of a contiguous (outer, L, inner) tensor.
 *  - inner == 1, rows 16-byte aligned, L <= capacity: the row lives in
 *    registers (softmax_reg): one read, max, exp + sum, one write — the
 *    minimum traffic (8 B per f32 element). A warp per row up to 32*8 packs,
 *    a block per row up to 256*16 packs (16384 f32 / 32768 bf16 elements).
 *  - otherwise a block or warp per row (softmax_loop): one pass with an
 *    online (max, sum) per thread, merged across threads, then a pass that
 *    writes: three accesses per element (the second read usually hits L2).
 *  - inner > 1 (softmax over a non-last dim): a thread per (outer, inner)
 *    column (softmax_cols), neighbouring threads on neighbouring columns so
 *    every step is one coalesced row segment.
 * The backward has the same three shapes: g and y held in registers
 * (softmax_bwd_reg: 12 B per f32 element, the minimum), two passes over
 * the row (softmax_bwd_rows), or a thread per column (softmax_bwd_cols).
 * f32 math throughout (f64 for f64) and one rounding on store, as the CPU. */

namespace {

/* An online (max, sum of exp(x - max)) pair. -inf elements contribute
 * nothing; a NaN poisons the sum (the whole row becomes NaN, as the CPU). */
template <typename C> struct MaxSum {
  C m, s;
  __device__ __forceinline__ void init() { m = -INFINITY; s = 0; }
  __device__ __forceinline__ void push(C x) {
    if (x > m) { s = s * m_exp(m - x) + 1; m = x; }
    else if (x != -INFINITY) s += m_exp(x - m);
  }
  __device__ __forceinline__ void merge(C om, C os) {
    C nm = om > m ? om : m;
    if (nm == -INFINITY) { s = s + os; return; }
    s = (m == -INFINITY ? (C)0 * s : s * m_exp(m - nm)) + (om == -INFINITY ? (C)0 * os : os * m_exp(om - nm));
    m = nm;
  }
  __device__ __forceinline__ void warp_merge() {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      C om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
      merge(om, os);
    }
  }
  __device__ __forceinline__ void block_merge() {   /* all threads end with the result */
    __shared__ C sm[32], ss[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    warp_merge();
    __syncthreads();
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    init();
    if (lane < nw) { m = sm[lane]; s = ss[lane]; }
    warp_merge();
  }
  /* The CPU subtracts an infinite max too: exp(inf - inf) is NaN, so is the row. */
  __device__ __forceinline__ void finish() { if (m == INFINITY) s = NAN; }
};

template <typename C> __device__ __forceinline__ C softmax_out(C x, C m, C inv_or_shift, bool log_out) {
  return log_out ? x - inv_or_shift : m_exp(x - m) * inv_or_shift;
}

template <typename T, int N, int TPO>
__global__ void __launch_bounds__(kBlock) softmax_reg(const T *in, T *out, int64_t rows, int64_t L, bool log_out) {
  constexpr int V = 16 / (int)sizeof(T);
  constexpr int per = kBlock / TPO;
  __shared__ float red[32];
  const int64_t row = (int64_t)blockIdx.x * per + threadIdx.x / TPO;
  const int lane = threadIdx.x % TPO;
  const bool live = row < rows;
  const T *p = in + (live ? row : 0) * L;
  float x[N][V];
  float mx = -INFINITY;
#pragma unroll
  for (int n = 0; n < N; n++) {
    int64_t c = ((int64_t)n * TPO + lane) * V;
    if (live && c < L) {
      Packed128<T> pk = load128(p + c);
#pragma unroll
      for (int e = 0; e < V; e++) { x[n][e] = to_f32(pk[e]); mx = fmaxf(mx, x[n][e]); }
    }
  }
  mx = TPO == 32 ? warp_max(mx) : block_max(mx, red);
  float sum = 0.f;
#pragma unroll
  for (int n = 0; n < N; n++) {
    int64_t c = ((int64_t)n * TPO + lane) * V;
    if (live && c < L) {
#pragma unroll
      for (int e = 0; e < V; e++) { float ex = expf(x[n][e] - mx); sum += ex; if (!log_out) x[n][e] = ex; }
    }
  }
  sum = TPO == 32 ? warp_sum(sum) : block_sum(sum, red);
  const float k = log_out ? mx + logf(sum) : 1.f / sum;
  T *q = out + (live ? row : 0) * L;
#pragma unroll
  for (int n = 0; n < N; n++) {
    int64_t c = ((int64_t)n * TPO + lane) * V;
    if (live && c < L) {
      Packed128<T> pk;
#pragma unroll
      for (int e = 0; e < V; e++) pk[e] = from_f32<T>(log_out ? x[n][e] - k : x[n][e] * k);
      store128(q + c, pk);
    }
  }
}

template <typename C, int TPO>
__global__ void __launch_bounds__(kBlock) softmax_loop(const void *in, void *out, int dtype, int64_t rows, int64_t L, bool log_out) {
  constexpr int per = kBlock / TPO;
  const int64_t row = (int64_t)blockIdx.x * per + threadIdx.x / TPO;
  const int lane = threadIdx.x % TPO;
  const bool live = row < rows;
  const int64_t base = (live ? row : 0) * L;
  MaxSum<C> ms;
  ms.init();
  if (live) for (int64_t i = lane; i < L; i += TPO) ms.push(load_as<C>(in, dtype, base + i));
  if (TPO == 32) ms.warp_merge(); else ms.block_merge();
  ms.finish();
  if (!live) return;
  const C k = log_out ? ms.m + m_log(ms.s) : (C)1 / ms.s;
  for (int64_t i = lane; i < L; i += TPO) {
    C x = load_as<C>(in, dtype, base + i);
    store_as<C>(out, dtype, base + i, softmax_out(x, ms.m, k, log_out));
  }
}

template <typename C>
__global__ void __launch_bounds__(kBlock) softmax_cols(const void *in, void *out, int dtype, int64_t outer, int64_t L, int64_t inner, bool log_out) {
  const int64_t col = (int64_t)blockIdx.x * kBlock + threadIdx.x;
  if (col >= outer * inner) return;
  const int64_t base = (col / inner) * L * inner + col % inner;
  MaxSum<C> ms;
  ms.init();
  for (int64_t l = 0; l < L; l++) ms.push(load_as<C>(in, dtype, base + l * inner));
  ms.finish();
  const C k = log_out ? ms.m + m_log(ms.s) : (C)1 / ms.s;
  for (int64_t l = 0; l < L; l++) {
    C x = load_as<C>(in, dtype, base + l * inner);
    store_as<C>(out, dtype, base + l * inner, softmax_out(x, ms.m, k, log_out));
  }
}

/* ---- backward: gx = y * (g - sum(g y)) or g - exp(y) * sum(g) ---- */

template <typename C> __device__ __forceinline__ C bwd_term(C g, C y, bool log_out) { return log_out ? g : g * y; }
template <typename C> __device__ __forceinline__ C bwd_out(C g, C y, C dot, bool log_out) {
  return log_out ? g - m_exp(y) * dot : y * (g - dot);
}

struct BwdArgs {
  const void *g, *y;
  void *gx;
  int gdt, ydt, xdt;
  int64_t rows, L, inner;
  bool log_out;
};

/* Rows that fit in registers, g, y and gx of one float type, 16-byte aligned:
 * g and y are read once, gx written once (12 B per f32 element). */
template <typename T, int N, int TPO>
__global__ void __launch_bounds__(kBlock) softmax_bwd_reg(const T *gp, const T *yp, T *xp, int64_t rows, int64_t L, bool log_out) {
  constexpr int V = 16 / (int)sizeof(T);
  constexpr int per = kBlock / TPO;
  __shared__ float red[32];
  const int64_t row = (int64_t)blockIdx.x * per + threadIdx.x / TPO;
  const int lane = threadIdx.x % TPO;
  const bool live = row < rows;
  const int64_t base = (live ? row : 0) * L;
  float g[N][V], y[N][V];
  float dot = 0.f;
#pragma unroll
  for (int n = 0; n < N; n++) {
    int64_t c = ((int64_t)n * TPO + lane) * V;
    if (live && c < L) {
      Packed128<T> pg = load128(gp + base + c), py = load128(yp + base + c);
#pragma unroll
      for (int e = 0; e < V; e++) {
        g[n][e] = to_f32(pg[e]); y[n][e] = to_f32(py[e]);
        dot += log_out ? g[n][e] : g[n][e] * y[n][e];
      }
    }
  }
  dot = TPO == 32 ? warp_sum(dot) : block_sum(dot, red);
#pragma unroll
  for (int n = 0; n < N; n++) {
    int64_t c = ((int64_t)n * TPO + lane) * V;
    if (live && c < L) {
      Packed128<T> px;
#pragma unroll
      for (int e = 0; e < V; e++)
        px[e] = from_f32<T>(log_out ? g[n][e] - expf(y[n][e]) * dot : y[n][e] * (g[n][e] - dot));
      store128(xp + base + c, px);
    }
  }
}

template <typename T>
bool launch_softmax_bwd_reg(const BwdArgs &a, cudaStream_t s) {
  constexpr int V = 16 / (int)sizeof(T);
  const int64_t packs = a.L / V, rows = a.rows;
  const T *g = (const T *)a.g, *y = (const T *)a.y;
  T *x = (T *)a.gx;
#define EM_BW_WARP(N) if (packs <= 32 * N) { softmax_bwd_reg<T, N, 32><<<(unsigned)((rows + 7) / 8), kBlock, 0, s>>>(g, y, x, rows, a.L, a.log_out); return true; }
#define EM_BW_BLOCK(N) if (packs <= kBlock * N) { softmax_bwd_reg<T, N, kBlock><<<(unsigned)rows, kBlock, 0, s>>>(g, y, x, rows, a.L, a.log_out); return true; }
  EM_BW_WARP(1) EM_BW_WARP(2) EM_BW_WARP(4) EM_BW_WARP(8)
  EM_BW_BLOCK(4) EM_BW_BLOCK(8)
  if constexpr (V == 4) { EM_BW_BLOCK(16) }   /* 2 x 16 x 8 floats would not fit in registers */
#undef EM_BW_WARP
#undef EM_BW_BLOCK
  return false;
}

template <typename C, int TPO>
__global__ void __launch_bounds__(kBlock) softmax_bwd_rows(BwdArgs a) {
  constexpr int per = kBlock / TPO;
  __shared__ C red[32];
  const int64_t row = (int64_t)blockIdx.x * per + threadIdx.x / TPO;
  const int lane = threadIdx.x % TPO;
  const bool live = row < a.rows;
  const int64_t base = (live ? row : 0) * a.L;
  C dot = 0;
  if (live) {
    int64_t i = lane;
    for (; i + 3 * TPO < a.L; i += 4 * TPO) {   /* eight loads in flight */
      C g[4], y[4];
#pragma unroll
      for (int u = 0; u < 4; u++) { g[u] = load_as<C>(a.g, a.gdt, base + i + u * TPO); y[u] = load_as<C>(a.y, a.ydt, base + i + u * TPO); }
#pragma unroll
      for (int u = 0; u < 4; u++) dot += bwd_term(g[u], y[u], a.log_out);
    }
    for (; i < a.L; i += TPO)
      dot += bwd_term(load_as<C>(a.g, a.gdt, base + i), load_as<C>(a.y, a.ydt, base + i), a.log_out);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  if (TPO != 32) {
    int w = threadIdx.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[w] = dot;
    __syncthreads();
    dot = 0;
    for (int k = 0; k < kBlock / 32; k++) dot += red[k];
  }
  if (!live) return;
  for (int64_t i = lane; i < a.L; i += TPO) {
    C g = load_as<C>(a.g, a.gdt, base + i), y = load_as<C>(a.y, a.ydt, base + i);
    store_as<C>(a.gx, a.xdt, base + i, bwd_out(g, y, dot, a.log_out));
  }
}

template <typename C>
__global__ void __launch_bounds__(kBlock) softmax_bwd_cols(BwdArgs a) {
  const int64_t col = (int64_t)blockIdx.x * kBlock + threadIdx.x;
  if (col >= a.rows * a.inner) return;
  const int64_t base = (col / a.inner) * a.L * a.inner + col % a.inner;
  C dot = 0;
  for (int64_t l = 0; l < a.L; l++)
    dot += bwd_term(load_as<C>(a.g, a.gdt, base + l * a.inner), load_as<C>(a.y, a.ydt, base + l * a.inner), a.log_out);
  for (int64_t l = 0; l < a.L; l++) {
    int64_t at = base + l * a.inner;
    store_as<C>(a.gx, a.xdt, at, bwd_out(load_as<C>(a.g, a.gdt, at), load_as<C>(a.y, a.ydt, at), dot, a.log_out));
  }
}

/* ---- max/min backward: scatter g to the saved indices ---- */

struct ScatterArgs {
  int ndim, dim;
  int64_t kshape[EM_MAX_DIMS], ostride[EM_MAX_DIMS];
  int64_t count;
};

template <typename E>
__global__ void __launch_bounds__(kBlock) scatter_dim(E *res, const E *g, const int64_t *idx, ScatterArgs s) {
  for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < s.count; o += (int64_t)gridDim.x * blockDim.x) {
    int64_t rem = o, off = 0;
    for (int d = s.ndim - 1; d >= 0; d--) {
      int64_t c = rem % s.kshape[d];
      rem /= s.kshape[d];
      off += (d == s.dim ? idx[o] : c) * s.ostride[d];
    }
    res[off] = g[o];
  }
}

/* The contiguous (outer, L, inner) split of a shape around dim d. */
void split_dims(const em_tensor *t, int d, int64_t *outer, int64_t *L, int64_t *inner) {
  *outer = 1; *inner = 1; *L = t->ndim ? t->shape[d] : 1;
  for (int k = 0; k < t->ndim; k++) {
    if (k < d) *outer *= t->shape[k];
    if (k > d) *inner *= t->shape[k];
  }
}

template <typename T>
bool launch_softmax_reg(const T *in, T *out, int64_t rows, int64_t L, bool log_out, cudaStream_t s) {
  constexpr int V = 16 / (int)sizeof(T);
  int64_t packs = L / V;
#define EM_SM_WARP(N) if (packs <= 32 * N) { softmax_reg<T, N, 32><<<(unsigned)((rows + 7) / 8), kBlock, 0, s>>>(in, out, rows, L, log_out); return true; }
#define EM_SM_BLOCK(N) if (packs <= kBlock * N) { softmax_reg<T, N, kBlock><<<(unsigned)rows, kBlock, 0, s>>>(in, out, rows, L, log_out); return true; }
  EM_SM_WARP(1) EM_SM_WARP(2) EM_SM_WARP(4) EM_SM_WARP(8)
  EM_SM_BLOCK(4) EM_SM_BLOCK(8) EM_SM_BLOCK(16)
#undef EM_SM_WARP
#undef EM_SM_BLOCK
  return false;
}

}  // namespace

extern "C" int em_softmax_cuda(const char *op, em_tensor *res, em_tensor *a_in, int dim, bool log_out) {
  int64_t n = em_numel(a_in);
  if (n == 0) return 0;
  if (!em_is_contiguous(res) || res->dtype != a_in->dtype)
    return em_error("%s: internal error: softmax output must be contiguous of the input's dtype", op);
  const int dev = res->device.index;
  if (em_use_device(dev, op)) return -1;
  int64_t outer, L, inner;
  split_dims(a_in, dim, &outer, &L, &inner);
  if (outer * inner > (int64_t)INT32_MAX)
    return em_error("%s: %lld rows are more than one launch handles", op, (long long)(outer * inner));
  em_tensor *a = em_contiguous_as(a_in, a_in->dtype);
  if (!a) return -1;
  cudaStream_t s = em_cur_stream(dev);
  const void *ip = em_data_ptr(a);
  void *outp = em_data_ptr(res);
  bool done = false;
  if (inner == 1) {
    size_t es = em_dtype_size(a->dtype);
    bool aligned = ((uintptr_t)ip & 15) == 0 && ((uintptr_t)outp & 15) == 0 && (L * (int64_t)es) % 16 == 0;
    if (aligned) {
      switch (a->dtype) {
        case EM_F32: done = launch_softmax_reg<float>((const float *)ip, (float *)outp, outer, L, log_out, s); break;
        case EM_BF16: done = launch_softmax_reg<__nv_bfloat16>((const __nv_bfloat16 *)ip, (__nv_bfloat16 *)outp, outer, L, log_out, s); break;
        case EM_F16: done = launch_softmax_reg<__half>((const __half *)ip, (__half *)outp, outer, L, log_out, s); break;
        default: break;
      }
    }
    if (!done) {
      bool f64 = a->dtype == EM_F64, warp = L <= 1024;
      unsigned grid = (unsigned)(warp ? (outer + 7) / 8 : outer);
      if (f64 && warp) softmax_loop<double, 32><<<grid, kBlock, 0, s>>>(ip, outp, a->dtype, outer, L, log_out);
      else if (f64) softmax_loop<double, kBlock><<<grid, kBlock, 0, s>>>(ip, outp, a->dtype, outer, L, log_out);
      else if (warp) softmax_loop<float, 32><<<grid, kBlock, 0, s>>>(ip, outp, a->dtype, outer, L, log_out);
      else softmax_loop<float, kBlock><<<grid, kBlock, 0, s>>>(ip, outp, a->dtype, outer, L, log_out);
    }
  } else {
    unsigned grid = (unsigned)((outer * inner + kBlock - 1) / kBlock);
    if (a->dtype == EM_F64) softmax_cols<double><<<grid, kBlock, 0, s>>>(ip, outp, a->dtype, outer, L, inner, log_out);
    else softmax_cols<float><<<grid, kBlock, 0, s>>>(ip, outp, a->dtype, outer, L, inner, log_out);
  }
  em_tensor_release(a);
  return em_launch_check(op);
}

extern "C" int em_softmax_backward_cuda(const char *op, em_tensor *gx, em_tensor *g_in, em_tensor *y_in, int dim, bool log_out) {
  if (em_numel(gx) == 0) return 0;
  if (!em_is_contiguous(gx)) return em_error("%s: internal error: gradient output must be contiguous", op);
  const int dev = gx->device.index;
  if (em_use_device(dev, op)) return -1;
  em_tensor *g = em_contiguous_as(g_in, g_in->dtype);
  em_tensor *y = g ? em_contiguous_as(y_in, y_in->dtype) : NULL;
  if (!g || !y) { em_tensor_release(g); return -1; }
  cudaStream_t s = em_cur_stream(dev);
  BwdArgs a;
  a.g = em_data_ptr(g); a.y = em_data_ptr(y); a.gx = em_data_ptr(gx);
  a.gdt = g->dtype; a.ydt = y->dtype; a.xdt = gx->dtype;
  split_dims(y, dim, &a.rows, &a.L, &a.inner);
  a.log_out = log_out;
  if (a.rows * a.inner > (int64_t)INT32_MAX) {
    em_tensor_release(g); em_tensor_release(y);
    return em_error("%s: %lld rows are more than one launch handles", op, (long long)(a.rows * a.inner));
  }
  bool f64 = gx->dtype == EM_F64;
  bool done = false;
  if (a.inner == 1 && g->dtype == gx->dtype && y->dtype == gx->dtype) {
    const int64_t es = (int64_t)em_dtype_size(gx->dtype);
    bool aligned = ((uintptr_t)a.g & 15) == 0 && ((uintptr_t)a.y & 15) == 0 && ((uintptr_t)a.gx & 15) == 0 &&
                   (a.L * es) % 16 == 0;
    if (aligned) {
      switch (gx->dtype) {
        case EM_F32: done = launch_softmax_bwd_reg<float>(a, s); break;
        case EM_BF16: done = launch_softmax_bwd_reg<__nv_bfloat16>(a, s); break;
        case EM_F16: done = launch_softmax_bwd_reg<__half>(a, s); break;
        default: break;
      }
    }
  }
  if (!done && a.inner == 1) {
    bool warp = a.L <= 1024;
    unsigned grid = (unsigned)(warp ? (a.rows + 7) / 8 : a.rows);
    if (f64 && warp) softmax_bwd_rows<double, 32><<<grid, kBlock, 0, s>>>(a);
    else if (f64) softmax_bwd_rows<double, kBlock><<<grid, kBlock, 0, s>>>(a);
    else if (warp) softmax_bwd_rows<float, 32><<<grid, kBlock, 0, s>>>(a);
    else softmax_bwd_rows<float, kBlock><<<grid, kBlock, 0, s>>>(a);
  } else if (!done) {
    unsigned grid = (unsigned)((a.rows * a.inner + kBlock - 1) / kBlock);
    if (f64) softmax_bwd_cols<double><<<grid, kBlock, 0, s>>>(a);
    else softmax_bwd_cols<float><<<grid, kBlock, 0, s>>>(a);
  }
  em_tensor_release(g);
  em_tensor_release(y);
  return em_launch_check(op);
}

extern "C" int em_scatter_dim_cuda(const char *op, em_tensor *res, em_tensor *g_in, em_tensor *idx_in, int dim,
                                   const int64_t *keep_shape) {
  ScatterArgs sa;
  memset(&sa, 0, sizeof sa);
  sa.ndim = res->ndim; sa.dim = dim;
  sa.count = em_shape_numel(res->ndim, keep_shape);
  if (sa.count == 0) return 0;
  if (!em_is_contiguous(res) || em_numel(g_in) != sa.count || em_numel(idx_in) != sa.count)
    return em_error("%s: internal error: scatter of mismatched tensors", op);
  const int dev = res->device.index;
  if (em_use_device(dev, op)) return -1;
  for (int d = 0; d < res->ndim; d++) { sa.kshape[d] = keep_shape[d]; sa.ostride[d] = res->stride[d]; }
  em_tensor *g = em_contiguous_as(g_in, res->dtype);
  em_tensor *idx = g ? em_contiguous_as(idx_in, EM_I64) : NULL;
  if (!g || !idx) { em_tensor_release(g); return -1; }
  cudaStream_t s = em_cur_stream(dev);
  unsigned grid = em_grid(sa.count, kBlock);
  const int64_t *ip = (const int64_t *)em_data_ptr(idx);
  switch (em_dtype_size(res->dtype)) {
    case 2: scatter_dim<uint16_t><<<grid, kBlock, 0, s>>>((uint16_t *)em_data_ptr(res), (const uint16_t *)em_data_ptr(g), ip, sa); break;
    case 4: scatter_dim<uint32_t><<<grid, kBlock, 0, s>>>((uint32_t *)em_data_ptr(res), (const uint32_t *)em_data_ptr(g), ip, sa); break;
    case 8: scatter_dim<uint64_t><<<grid, kBlock, 0, s>>>((uint64_t *)em_data_ptr(res), (const uint64_t *)em_data_ptr(g), ip, sa); break;
    default: scatter_dim<uint8_t><<<grid, kBlock, 0, s>>>((uint8_t *)em_data_ptr(res), (const uint8_t *)em_data_ptr(g), ip, sa); break;
  }
  em_tensor_release(g);
  em_tensor_release(idx);
  return em_launch_check(op);
}

/* ======== issue 12: prod and vector norms over the same plan and kernels ======== */
extern "C" int em_reduce_math_cuda(const char *op, int kind, em_tensor *res, const em_tensor *a, const em_red_plan *p,
                                   double pw) {
  const bool f64 = is_f64(a);
  if (kind == EM_RED_PROD) {
    if (f64) return reduce_pass<double, R_PROD>(op, a, p, NULL, res, NULL, 1);
    if (em_dtype_is_float(a->dtype)) return reduce_pass<float, R_PROD>(op, a, p, NULL, res, NULL, 1);
    return reduce_pass<int64_t, R_PROD>(op, a, p, NULL, res, NULL, 1);
  }
  if (!em_dtype_is_float(a->dtype)) return em_error("%s: expected a floating-point input", op);
  switch (kind) {
    case EM_RED_NORM1: return f64 ? reduce_pass<double, R_ASUM>(op, a, p, NULL, res, NULL, 1)
                                  : reduce_pass<float, R_ASUM>(op, a, p, NULL, res, NULL, 1);
    case EM_RED_NORM2: return f64 ? reduce_pass<double, R_SSQ>(op, a, p, NULL, res, NULL, 1)
                                  : reduce_pass<float, R_SSQ>(op, a, p, NULL, res, NULL, 1);
    case EM_RED_NORMINF: return f64 ? reduce_pass<double, R_AMAX>(op, a, p, NULL, res, NULL, 1)
                                    : reduce_pass<float, R_AMAX>(op, a, p, NULL, res, NULL, 1);
    case EM_RED_NORMP: return f64 ? reduce_pass<double, R_PSUM>(op, a, p, NULL, res, NULL, pw)
                                  : reduce_pass<float, R_PSUM>(op, a, p, NULL, res, NULL, pw);
    default: return em_error("%s: internal error: unknown reduction %d", op, kind);
  }
}
/* ======== end issue 12 ======== */
