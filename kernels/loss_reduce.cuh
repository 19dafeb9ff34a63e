/* Device-wide sums for the fused losses (loss_bce.cu, loss_nll.cu,
 * loss_diff.cu), and their operands' loads and stores: each
 * block of a grid-stride kernel folds its threads' K running double sums
 * into part[blockIdx.x * K + k]; one block of a second kernel then sums the
 * parts in a fixed order. Deterministic (no atomics; the grid depends only
 * on the size and the device) and nothing is read by the host, so a loss
 * and its reduction replay from a CUDA graph. */
#ifndef EMBER_KERNELS_LOSS_REDUCE_CUH
#define EMBER_KERNELS_LOSS_REDUCE_CUH

#include <type_traits>
#include "common.cuh"
#include "dtype_io.cuh"

namespace loss_reduce {

constexpr int kThreads = 256;

/* Blocks for a grid-stride pass over `units` work items: enough to fill the
 * device (8 blocks of 256 per multiprocessor), no more. */
static inline unsigned grid_for(int64_t units, int device) {
  int64_t want = (units + kThreads - 1) / kThreads, cap = (int64_t)em_sm_count(device) * 8;
  return (unsigned)(want < 1 ? 1 : want < cap ? want : cap);
}

/* Block-wide sums of K doubles; thread 0 gets the totals. blockDim.x == kThreads. */
template <int K>
__device__ __forceinline__ void block_sums(double (&v)[K]) {
  __shared__ double sh[K][kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int k = 0; k < K; k++) {
    for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
    if (lane == 0) sh[k][warp] = v[k];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < K; k++) {
      double s = 0;
      for (int w = 0; w < kThreads / 32; w++) s += sh[k][w];
      v[k] = s;
    }
  }
}

/* End of a grid-stride pass: this block's sums into part[blockIdx.x * K + k]. */
template <int K>
__device__ __forceinline__ void write_partials(double (&v)[K], double *part) {
  block_sums<K>(v);
  if (threadIdx.x == 0)
#pragma unroll
    for (int k = 0; k < K; k++) part[(int64_t)blockIdx.x * K + k] = v[k];
}

/* In the finishing kernel (one block of kThreads): the totals of nparts
 * partials, in thread 0. */
template <int K>
__device__ __forceinline__ void sum_partials(const double *part, int nparts, double (&tot)[K]) {
#pragma unroll
  for (int k = 0; k < K; k++) tot[k] = 0;
  for (int p = threadIdx.x; p < nparts; p += kThreads)
#pragma unroll
    for (int k = 0; k < K; k++) tot[k] += part[(int64_t)p * K + k];
  block_sums<K>(tot);
}

/* The accumulation type (f32, f64 for f64) and one value in and out of it:
 * 16-bit types through f32, rounded once. */
using acc::acc_t;   /* common.cuh */
using acc::ld;
using acc::st;

/* W consecutive values of a full-size operand from element i0 (one 16-byte load when W > 1). */
template <typename T, int W, typename C>
__device__ __forceinline__ void load_vals(const T *p, int64_t i0, C (&v)[W]) {
  if constexpr (W > 1) {
    Packed128<T> q = load128(p + i0);
#pragma unroll
    for (int e = 0; e < W; e++) v[e] = ld<C>(q[e]);
  } else {
    v[0] = ld<C>(p[i0]);
  }
}

/* W values into a full-size output from element i0, rounded once to T. */
template <typename T, int W, typename C>
__device__ __forceinline__ void store_vals(T *p, int64_t i0, const C (&v)[W]) {
  if constexpr (W > 1) {
    Packed128<T> q;
#pragma unroll
    for (int e = 0; e < W; e++) q[e] = st<T, C>(v[e]);
    store128(p + i0, q);
  } else {
    p[i0] = st<T, C>(v[0]);
  }
}

namespace {   /* one copy per including file: no host stub shared between them */
/* The finishing kernel of a one-sum loss (one block of kThreads): out[0] = (sum of the partials) * scale,
 * rounded once to L. */
template <typename L>
__global__ void __launch_bounds__(kThreads) finish_scaled(const double *part, int nparts, double scale, L *out) {
  double tot[1];
  sum_partials<1>(part, nparts, tot);
  if (threadIdx.x == 0) out[0] = st<L, acc_t<L>>((acc_t<L>)(tot[0] * scale));
}
}  // namespace

}  // namespace loss_reduce

#endif
