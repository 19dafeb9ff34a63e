/* The one-row scans of kernels/scan.cu (outer = inner = 1: cumsum of a long
 * vector), included by it inside its anonymous namespace after the shared
 * pieces (kBlock, widen/narrow, SumOp/ProdOp), so one translation unit. Six
 * paths, picked by EMBER_SCAN_ROW (scan_row at the end):
 *  - split (default): scan_row_sums then scan_row_apply, no waits inside a kernel;
 *  - tiles: scan_row_tiles, one pass with a fixed-order look-back polling flags;
 *  - chain: scan_row_chain, that pass with a one-round-trip look-back (f32 accumulators);
 *  - ring: scan_row_ring (scan_row_ring.cuh), chain's pass in a persistent grid with the
 *    next tile's loads in flight (f32 accumulators);
 *  - l2: scan_row_l2 (scan_row_l2.cuh), split's two passes a segment of the row at a time,
 *    so the second pass reads from L2 (EMBER_SCAN_ROW=auto: l2 for long forward f32/bf16/f16 rows);
 *    l2c: the same segments in one cooperative launch, the next segment's first pass beside this one's second;
 *  - cub: cub::DeviceScan (not deterministic for floats).
 * split, tiles, chain, ring and l2 evaluate the same expression: the same bits. */
#pragma once

template <typename A>
__global__ void reverse_copy(const A *in, A *out, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[n - 1 - i] = in[i];
}

/* CUB's device scan from in to out: raw pointers when T is the accumulator
 * (CUB's vectorised loads), else widening / rounding iterators. */
template <typename T, typename A, typename Op>
cudaError_t device_scan(void *tmp, size_t &temp, const T *in, T *out, Op f, int n, cudaStream_t s) {
  if constexpr (std::is_same<T, A>::value) {
    return cub::DeviceScan::InclusiveScan(tmp, temp, in, out, f, n, s);
  } else {
    typedef thrust::transform_iterator<Widen<T, A>, const T *, A> InIt;
    typedef thrust::transform_output_iterator<Narrow<T, A>, T *> OutIt;
    return cub::DeviceScan::InclusiveScan(tmp, temp, InIt(in, Widen<T, A>()), OutIt(out, Narrow<T, A>()), f, n, s);
  }
}

/* One long row: cub's device-wide scan, decoupled look-back, accumulating in
 * A whatever T stores (reverse through scratch). */
template <typename T, typename A, typename Op>
int scan_one_row(const char *op, const em_tensor *a, const T *in, T *out, int64_t L, bool reverse, Op f,
                 cudaStream_t s) {
  if (L > INT32_MAX) return em_error("%s: CUDA scans at most 2^31 - 1 elements in one row, got %lld", op, (long long)L);
  size_t temp = 0;
  if (em_cuda_check(device_scan<T, A, Op>(nullptr, temp, in, out, f, (int)L, s), op, "cub scan (temp size)")) return -1;
  const size_t rb = reverse ? ((size_t)L * sizeof(T) + 255) & ~(size_t)255 : 0;
  int64_t total = (int64_t)(rb + temp);
  em_tensor *ws = em_empty(1, &total, EM_U8, a->device);
  if (!ws) return -1;
  char *p = (char *)em_data_ptr(ws);
  T *rev = (T *)p;
  int rc;
  if (reverse) {
    reverse_copy<T><<<em_grid(L, kBlock), kBlock, 0, s>>>(in, rev, L);
    rc = em_cuda_check(device_scan<T, A, Op>(p + rb, temp, rev, out, f, (int)L, s), op, "cub scan");
    if (!rc) reverse_copy<T><<<em_grid(L, kBlock), kBlock, 0, s>>>(out, rev, L);
    if (!rc) rc = em_cuda_check(cudaMemcpyAsync(out, rev, (size_t)L * sizeof(T), cudaMemcpyDeviceToDevice, s), op,
                                "cudaMemcpyAsync");
  } else {
    rc = em_cuda_check(device_scan<T, A, Op>(p, temp, in, out, f, (int)L, s), op, "cub scan");
  }
  if (!rc) rc = em_launch_check(op);
  em_tensor_release(ws);   /* stream-ordered: safe to reuse after the work above */
  return rc;
}

/* ---- one long row, deterministic: tiles with a fixed-order look-back ----
 * Tile k (kRowTile elements, one block, ticket order) loads its elements
 * once (16-byte loads), scans them in registers (16 per thread in order,
 * then cub::BlockScan's fixed tree) and publishes its total agg[k]. Its
 * prefix is then computed, never taken from whoever happens to be done:
 *   prefix(k) = sum_fixed(ctot[0 .. m)) + sum_fixed(agg[mC .. k)),  m = k / C,
 * where ctot[m'] (chunk m' of C tiles) is published by the chunk's last
 * tile as sum_fixed(agg[m'C .. m'C + C - 1)) + agg[m'C + C - 1], and
 * sum_fixed is one warp summing v[j] into lane j % 32 in order, then an xor
 * butterfly (commutative pairs: every lane the same bits). Each value is
 * thus one fixed expression of the input, whatever the timing: the same
 * bits every run (CUB's look-back adds whichever predecessors are ready).
 * A tile waits only on tiles with earlier tickets (already running), so it
 * cannot deadlock. Bytes: one read and one write, like CUB's scan. */
constexpr int kRowItems = 16, kRowTile = kBlock * kRowItems, kRowChunk = 64;

template <typename A>
struct RowState {
  unsigned *ticket;
  int *agg_flag, *ctot_flag;   /* zeroed before the launch */
  A *agg, *ctot;
};

template <typename A>
__device__ __forceinline__ void publish(A *val, int *flag, A v) {
  *(volatile A *)val = v;
  __threadfence();
  *(volatile int *)flag = 1;
}

/* sum_fixed over v[0 .. n) by one warp, once every flag is up; every lane returns the result */
template <typename A, typename Op>
__device__ __forceinline__ A fixed_sum(const A *v, const int *flag, int64_t n, Op op, A identity) {
  const int lane = threadIdx.x & 31;
  for (int64_t j = lane; j < n; j += 32)
    while (*(volatile const int *)(flag + j) == 0) {}
  __threadfence();   /* the values were written before their flags */
  A acc = identity;
  for (int64_t j = lane; j < n; j += 32) acc = op(acc, __ldcg(v + j));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc = op(acc, __shfl_xor_sync(0xffffffffu, acc, off));
  return acc;
}

template <typename T, typename A, typename Op>
__global__ void __launch_bounds__(kBlock) scan_row_tiles(const T *__restrict__ in, T *__restrict__ out, int64_t L,
                                                         bool reverse, bool vec, Op op, A identity, RowState<A> st) {
  typedef cub::BlockScan<A, kBlock> BlockScan;
  __shared__ typename BlockScan::TempStorage tmp;
  __shared__ unsigned tile_sh;
  __shared__ A prefix_sh;
  const int t = threadIdx.x;
  if (t == 0) tile_sh = atomicAdd(st.ticket, 1u);
  __syncthreads();
  const int64_t tile = tile_sh, p0 = tile * kRowTile + (int64_t)t * kRowItems;
  const bool fast = vec && !reverse && (tile + 1) * kRowTile <= L;
  A v[kRowItems];
  if (fast) {
    constexpr int P = Packed128<T>::size;
#pragma unroll
    for (int i = 0; i < kRowItems; i += P) {
      const Packed128<T> x = load128(in + p0 + i);
#pragma unroll
      for (int k = 0; k < P; k++) v[i + k] = widen<A, T>(x[k]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kRowItems; i++) {
      const int64_t p = p0 + i;
      v[i] = p < L ? widen<A, T>(in[reverse ? L - 1 - p : p]) : identity;
    }
  }
#pragma unroll
  for (int i = 1; i < kRowItems; i++) v[i] = op(v[i - 1], v[i]);
  A tp, total;
  BlockScan(tmp).ExclusiveScan(v[kRowItems - 1], tp, identity, op, total);
  if (t < 32) {   /* warp 0: publish, then the fixed-order prefix */
    if (t == 0) publish(st.agg + tile, st.agg_flag + tile, total);
    const int64_t m = tile / kRowChunk, first = m * kRowChunk;
    const A within = fixed_sum(st.agg + first, st.agg_flag + first, tile - first, op, identity);
    /* a chunk's total depends on its own tiles only: published before waiting on earlier chunks, no chain */
    if (t == 0 && tile - first == kRowChunk - 1) publish(st.ctot + m, st.ctot_flag + m, op(within, total));
    const A carry = fixed_sum(st.ctot, st.ctot_flag, m, op, identity);
    if (t == 0) prefix_sh = op(carry, within);
  }
  __syncthreads();
  const A base = op(prefix_sh, tp);
  if (fast) {
    constexpr int P = Packed128<T>::size;
#pragma unroll
    for (int i = 0; i < kRowItems; i += P) {
      Packed128<T> x;
#pragma unroll
      for (int k = 0; k < P; k++) x[k] = narrow<T, A>(op(base, v[i + k]));
      store128(out + p0 + i, x);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kRowItems; i++) {
      const int64_t p = p0 + i;
      if (p < L) out[reverse ? L - 1 - p : p] = narrow<T, A>(op(base, v[i]));
    }
  }
}

/* ---- one long row, deterministic, in three phases (the default) ----
 * scan_row_tiles waits, per tile, on flags of earlier tiles: a ticket, the
 * tile's loads, then up to m / 32 + 2 dependent polls of L2 (m = chunks
 * before it) and as many fenced value loads, all while the block holds its
 * 16 KiB in registers — ~20-25 ns a tile on the H200 whatever the dtype
 * (2^26 f32 0.386 ms, 29 %). Here nothing waits inside a kernel:
 *  1. scan_row_sums (one block a tile): the tile's total, by the same
 *     thread-serial scan and cub::BlockScan as scan_row_tiles, into agg[k].
 *     The block that completes a chunk (a counter per chunk) writes its
 *     total ctot[m] (the full chunks'); the block that completes the last
 *     chunk writes carry[m] = sum_fixed(ctot[0 .. m)) for every chunk.
 *  2. scan_row_apply (one block a tile, last tile first, so the tiles that
 *     phase 1 read last are still in L2): loads the tile again, prefix =
 *     carry[m] + sum_fixed(agg[mC .. k)), writes the scan.
 * Every value is scan_row_tiles' expression (same partition, same
 * sum_fixed, same BlockScan), evaluated by whichever block, so the same
 * bits as scan_row_tiles and on every run. Bytes: 3 s n (read twice, write
 * once) instead of 2 s n, but streaming at full occupancy. */
template <typename A>
struct RowSplit {
  unsigned *chunk_done, *chunks_done;   /* zeroed before phase 1 */
  A *agg, *ctot, *carry;
  int64_t nt, nchunks;
};

/* sum_fixed over v[0 .. n) (values already visible, read from L2) by one warp; every lane returns it */
template <typename A, typename Op>
__device__ __forceinline__ A sum_fixed(const A *v, int64_t n, Op op, A identity) {
  const int lane = threadIdx.x & 31;
  A acc = identity;
  for (int64_t j = lane; j < n; j += 32) acc = op(acc, __ldcg(v + j));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc = op(acc, __shfl_xor_sync(0xffffffffu, acc, off));
  return acc;
}

/* Tile `tile`'s elements into v, scanned in order within the thread (scan_row_tiles' first step). */
template <typename T, typename A, typename Op>
__device__ __forceinline__ void row_tile_load(const T *__restrict__ in, int64_t L, int64_t tile, bool fast,
                                              bool reverse, Op op, A identity, A (&v)[kRowItems]) {
  const int64_t p0 = tile * kRowTile + (int64_t)threadIdx.x * kRowItems;
  if (fast) {
    constexpr int P = Packed128<T>::size;
#pragma unroll
    for (int i = 0; i < kRowItems; i += P) {
      const Packed128<T> x = load128(in + p0 + i);
#pragma unroll
      for (int k = 0; k < P; k++) v[i + k] = widen<A, T>(x[k]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kRowItems; i++) {
      const int64_t p = p0 + i;
      v[i] = p < L ? widen<A, T>(in[reverse ? L - 1 - p : p]) : identity;
    }
  }
}

template <typename T, typename A, typename Op>
__global__ void __launch_bounds__(kBlock) scan_row_sums(const T *__restrict__ in, int64_t L, bool reverse, bool vec,
                                                        Op op, A identity, RowSplit<A> st) {
  typedef cub::BlockScan<A, kBlock> BlockScan;
  __shared__ typename BlockScan::TempStorage tmp;
  __shared__ int chunk_sh, all_sh;   /* this block completed chunk m / the last chunk */
  const int t = threadIdx.x;
  const int64_t tile = blockIdx.x, m = tile / kRowChunk, first = m * kRowChunk;
  const bool fast = vec && !reverse && (tile + 1) * kRowTile <= L;
  A v[kRowItems];
  row_tile_load<T, A, Op>(in, L, tile, fast, reverse, op, identity, v);
#pragma unroll
  for (int i = 1; i < kRowItems; i++) v[i] = op(v[i - 1], v[i]);
  A tp, total;
  BlockScan(tmp).ExclusiveScan(v[kRowItems - 1], tp, identity, op, total);
  const int64_t size = st.nt - first < kRowChunk ? st.nt - first : kRowChunk;   /* tiles in chunk m */
  if (t == 0) {
    st.agg[tile] = total;
    __threadfence();   /* agg visible before the count that announces it */
    chunk_sh = atomicAdd(st.chunk_done + m, 1u) == (unsigned)(size - 1);
  }
  __syncthreads();
  if (!chunk_sh) return;
  /* this block completed chunk m (block-uniform from here) */
  if (t < 32) {
    __threadfence();   /* the chunk's aggs, counted before, are visible */
    if (size == kRowChunk) {
      const A within = sum_fixed(st.agg + first, kRowChunk - 1, op, identity);
      if (t == 0) st.ctot[m] = op(within, __ldcg(st.agg + first + kRowChunk - 1));
    }
    if (t == 0) {
      __threadfence();
      all_sh = atomicAdd(st.chunks_done, 1u) == (unsigned)(st.nchunks - 1);
    }
  }
  __syncthreads();
  if (!all_sh) return;
  /* every chunk is done: carry[m] = sum_fixed(ctot[0 .. m)), each warp a run of chunks. Lane l's
   * partial adds ctot[j], j = l (mod 32), in order, as sum_fixed does; the butterfly is sum_fixed's. */
  __threadfence();
  const int lane = t & 31, warp = t >> 5;
  const int64_t per = (st.nchunks + kBlock / 32 - 1) / (kBlock / 32);
  const int64_t m0 = warp * per, m1 = m0 + per < st.nchunks ? m0 + per : st.nchunks;
  A p = identity;
  if (m0 < m1)
    for (int64_t j = lane; j < m0; j += 32) p = op(p, __ldcg(st.ctot + j));
  /* ctot[mm] is added by lane mm % 32: each lane loads its value for the next 32 chunks at once (w), so the
   * butterfly of one chunk waits on no L2 load (it did, ~32 chained round trips a warp at 256 chunks, ~10 us
   * of phase 1's tail with the GPU otherwise idle). Same adds, same order. */
  A w = identity;
  for (int64_t mm = m0; mm < m1; mm++) {
    if (mm == m0 || (mm & 31) == 0) {   /* warp-uniform: lane l's value in [mm, next multiple of 32) */
      const int64_t j = (mm & ~(int64_t)31) + lane;
      if (j >= mm && j + 1 < m1) w = __ldcg(st.ctot + j);
    }
    A c = p;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) c = op(c, __shfl_xor_sync(0xffffffffu, c, off));
    if (lane == 0) st.carry[mm] = c;
    if ((mm & 31) == lane && mm + 1 < m1) p = op(p, w);
  }
}

template <typename T, typename A, typename Op>
__global__ void __launch_bounds__(kBlock) scan_row_apply(const T *__restrict__ in, T *__restrict__ out, int64_t L,
                                                         bool reverse, bool vec, Op op, A identity, RowSplit<A> st) {
  typedef cub::BlockScan<A, kBlock> BlockScan;
  __shared__ typename BlockScan::TempStorage tmp;
  __shared__ A prefix_sh;
  const int t = threadIdx.x;
  const int64_t tile = st.nt - 1 - (int64_t)blockIdx.x, m = tile / kRowChunk, first = m * kRowChunk;
  const int64_t p0 = tile * kRowTile + (int64_t)t * kRowItems;
  const bool fast = vec && !reverse && (tile + 1) * kRowTile <= L;
  A v[kRowItems];
  row_tile_load<T, A, Op>(in, L, tile, fast, reverse, op, identity, v);
  if (t < 32) {   /* L2 hits, overlapping the tile's loads */
    const A within = sum_fixed(st.agg + first, tile - first, op, identity);
    if (t == 0) prefix_sh = op(__ldcg(st.carry + m), within);
  }
#pragma unroll
  for (int i = 1; i < kRowItems; i++) v[i] = op(v[i - 1], v[i]);
  A tp, total;
  BlockScan(tmp).ExclusiveScan(v[kRowItems - 1], tp, identity, op, total);
  __syncthreads();   /* prefix_sh */
  const A base = op(prefix_sh, tp);
  if (fast) {
    constexpr int P = Packed128<T>::size;
#pragma unroll
    for (int i = 0; i < kRowItems; i += P) {
      Packed128<T> x;
#pragma unroll
      for (int k = 0; k < P; k++) x[k] = narrow<T, A>(op(base, v[i + k]));
      store128(out + p0 + i, x);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kRowItems; i++) {
      const int64_t p = p0 + i;
      if (p < L) out[reverse ? L - 1 - p : p] = narrow<T, A>(op(base, v[i]));
    }
  }
}

/* ---- one long row, deterministic, one pass with a short look-back (EMBER_SCAN_ROW=chain; f32 accumulators) ----
 * scan_row_tiles' expression and tickets, with its waits cut to about one L2
 * round trip: each published total is one 8-byte word (flag in the high
 * half, the f32 bits in the low: a single access, so no fence between value
 * and flag), and a warp issues all its loads at once (up to 8 words a lane)
 * before polling those not yet set, where fixed_sum waited word after word.
 * Warp 0 sums the chunk's earlier tile totals (and publishes the chunk
 * total), warp 1 the earlier chunk totals, side by side. Same sums in the
 * same order: the bits of scan_row_tiles and split. */
struct RowChain {
  unsigned *ticket;
  unsigned long long *agg, *ctot;   /* zeroed before the launch */
};

__device__ __forceinline__ void chain_publish(unsigned long long *w, float v) {
  *(volatile unsigned long long *)w = (1ull << 32) | __float_as_uint(v);
}

/* sum_fixed over the words w[0 .. n), waiting for each to be set; every lane returns the result */
template <typename Op>
__device__ __forceinline__ float chain_sum(const unsigned long long *w, int64_t n, Op op, float identity) {
  constexpr int B = 8;   /* words a lane a batch */
  const int lane = threadIdx.x & 31;
  float acc = identity;
  for (int64_t b = 0; b < n; b += 32 * B) {
    unsigned long long x[B];
#pragma unroll
    for (int i = 0; i < B; i++) {
      const int64_t j = b + lane + 32 * i;
      x[i] = j < n ? *(volatile const unsigned long long *)(w + j) : 0ull;
    }
#pragma unroll
    for (int i = 0; i < B; i++) {
      const int64_t j = b + lane + 32 * i;
      if (j < n) {
        while ((x[i] >> 32) == 0) x[i] = *(volatile const unsigned long long *)(w + j);
        acc = op(acc, __uint_as_float((unsigned)x[i]));
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc = op(acc, __shfl_xor_sync(0xffffffffu, acc, off));
  return acc;
}

template <typename T, typename Op>
__global__ void __launch_bounds__(kBlock) scan_row_chain(const T *__restrict__ in, T *__restrict__ out, int64_t L,
                                                         bool reverse, bool vec, Op op, float identity, RowChain st) {
  typedef cub::BlockScan<float, kBlock> BlockScan;
  __shared__ typename BlockScan::TempStorage tmp;
  __shared__ unsigned tile_sh;
  __shared__ float within_sh, carry_sh;
  const int t = threadIdx.x;
  if (t == 0) tile_sh = atomicAdd(st.ticket, 1u);
  __syncthreads();
  const int64_t tile = tile_sh, m = tile / kRowChunk, first = m * kRowChunk;
  const int64_t p0 = tile * kRowTile + (int64_t)t * kRowItems;
  const bool fast = vec && !reverse && (tile + 1) * kRowTile <= L;
  float v[kRowItems];
  row_tile_load<T, float, Op>(in, L, tile, fast, reverse, op, identity, v);
#pragma unroll
  for (int i = 1; i < kRowItems; i++) v[i] = op(v[i - 1], v[i]);
  float tp, total;
  BlockScan(tmp).ExclusiveScan(v[kRowItems - 1], tp, identity, op, total);
  if (t < 32) {
    if (t == 0) chain_publish(st.agg + tile, total);
    const float within = chain_sum(st.agg + first, tile - first, op, identity);
    /* a chunk's total depends on its own tiles only: no chain across chunks */
    if (t == 0 && tile - first == kRowChunk - 1) chain_publish(st.ctot + m, op(within, total));
    if (t == 0) within_sh = within;
  } else if (t < 64) {
    const float carry = chain_sum(st.ctot, m, op, identity);
    if (t == 32) carry_sh = carry;
  }
  __syncthreads();
  const float base = op(op(carry_sh, within_sh), tp);
  if (fast) {
    constexpr int P = Packed128<T>::size;
#pragma unroll
    for (int i = 0; i < kRowItems; i += P) {
      Packed128<T> x;
#pragma unroll
      for (int k = 0; k < P; k++) x[k] = narrow<T, float>(op(base, v[i + k]));
      store128(out + p0 + i, x);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kRowItems; i++) {
      const int64_t p = p0 + i;
      if (p < L) out[reverse ? L - 1 - p : p] = narrow<T, float>(op(base, v[i]));
    }
  }
}

#include "scan_row_ring.cuh"   /* EMBER_SCAN_ROW=ring: chain's pass, persistent, the next tile in flight */

#include "scan_row_l2.cuh"     /* EMBER_SCAN_ROW=l2: split's two passes a segment (about a third of the L2) at a time */

/* EMBER_SCAN_ROW (read once): "split" (default: scan_row_sums + scan_row_apply), "tiles" (scan_row_tiles, the
 * single pass; the same bits), "cub" (cub::DeviceScan, not deterministic for floats), "chain" (scan_row_chain
 * for f32 accumulators, split for the others; the same bits), "ring" (scan_row_ring, likewise), "l2" or
 * "l2:G" (scan_row_l2 for every row, segments of G chunks, or sized from the L2; the same bits), "l2f" or
 * "l2f:G" (scan_row_l2 with one launch a segment: scan_l2_step; the same bits), "l2c" or "l2c:G" (scan_l2_coop:
 * l2's passes in one cooperative launch, waiting on a count, not a launch; segments of G chunks or a sixth of
 * the L2; split inside graph capture; the same bits)
 * or "auto" (l2 where it should win, split elsewhere: l2_wins). 0 .. 8; -1 on error. *seg_chunks: l2's G
 * (0: from the L2). */
static int row_scan_mode(const char *op, int64_t *seg_chunks) {
  static int mode = -1;
  static int64_t chunks = 0;
  if (mode < 0) {
    const char *env = getenv("EMBER_SCAN_ROW");
    if (!env || !*env || strcmp(env, "split") == 0) mode = 0;
    else if (strcmp(env, "tiles") == 0) mode = 1;
    else if (strcmp(env, "cub") == 0) mode = 2;
    else if (strcmp(env, "chain") == 0) mode = 3;
    else if (strcmp(env, "ring") == 0) mode = 4;
    else if (strcmp(env, "l2") == 0) mode = 5;
    else if (strcmp(env, "l2f") == 0) mode = 7;
    else if (strcmp(env, "auto") == 0) mode = 6;
    else if (strcmp(env, "l2c") == 0) mode = 8;
    else if (strncmp(env, "l2:", 3) == 0 || strncmp(env, "l2f:", 4) == 0 || strncmp(env, "l2c:", 4) == 0) {
      const char *num = env + (env[2] == ':' ? 3 : 4);
      char *end = nullptr;
      const long long g = strtoll(num, &end, 10);
      if (end == num || *end || g < 1 || g > (1 << 20))
        return em_error("%s: expected EMBER_SCAN_ROW=l2:G, l2f:G or l2c:G with G chunks a segment in 1 .. 1048576, "
                        "got '%s'", op, env);
      chunks = g;
      mode = env[2] == 'f' ? 7 : env[2] == 'c' ? 8 : 5;
    } else {
      return em_error("%s: expected EMBER_SCAN_ROW to be auto, split, tiles, cub, chain, ring, l2, l2:G, l2f, l2f:G, "
                      "l2c or l2c:G, got '%s'", op, env);
    }
  }
  *seg_chunks = chunks;
  return mode;
}

template <typename T, typename Op>
int scan_row_chain_run(const char *op, const em_tensor *a, const T *in, T *out, int64_t L, bool reverse, Op f,
                       float identity, cudaStream_t s) {
  const int64_t nt = (L + kRowTile - 1) / kRowTile, nc = (nt + kRowChunk - 1) / kRowChunk;
  if (nt > INT32_MAX) return em_error("%s: CUDA scans at most 2^31 - 1 tiles in one row, got %lld", op, (long long)nt);
  const size_t bytes = 256 + (size_t)(nt + nc) * sizeof(unsigned long long);
  int64_t total = (int64_t)bytes;
  em_tensor *ws = em_empty(1, &total, EM_U8, a->device);
  if (!ws) return -1;
  char *p = (char *)em_data_ptr(ws);
  RowChain st;
  st.ticket = (unsigned *)p;
  st.agg = (unsigned long long *)(p + 256);
  st.ctot = st.agg + nt;
  int rc = em_cuda_check(cudaMemsetAsync(p, 0, bytes, s), op, "cudaMemsetAsync");
  if (!rc) {
    const bool vec = (((uintptr_t)in | (uintptr_t)out) & 15) == 0;
    scan_row_chain<T, Op><<<(unsigned)nt, kBlock, 0, s>>>(in, out, L, reverse, vec, f, identity, st);
    rc = em_launch_check(op);
  }
  em_tensor_release(ws);   /* stream-ordered */
  return rc;
}

template <typename T, typename A, typename Op>
int scan_row_split(const char *op, const em_tensor *a, const T *in, T *out, int64_t L, bool reverse, Op f, A identity,
                   cudaStream_t s) {
  const int64_t nt = (L + kRowTile - 1) / kRowTile, nc = (nt + kRowChunk - 1) / kRowChunk;
  if (nt > INT32_MAX) return em_error("%s: CUDA scans at most 2^31 - 1 tiles in one row, got %lld", op, (long long)nt);
  const size_t counts = ((size_t)(nc + 1) * sizeof(unsigned) + 255) & ~(size_t)255;
  int64_t total = (int64_t)(counts + (size_t)(nt + 2 * nc) * sizeof(A));
  em_tensor *ws = em_empty(1, &total, EM_U8, a->device);
  if (!ws) return -1;
  char *p = (char *)em_data_ptr(ws);
  RowSplit<A> st;
  st.chunk_done = (unsigned *)p;
  st.chunks_done = st.chunk_done + nc;
  st.agg = (A *)(p + counts);
  st.ctot = st.agg + nt;
  st.carry = st.ctot + nc;
  st.nt = nt;
  st.nchunks = nc;
  int rc = em_cuda_check(cudaMemsetAsync(p, 0, counts, s), op, "cudaMemsetAsync");
  if (!rc) {
    const bool vec = (((uintptr_t)in | (uintptr_t)out) & 15) == 0;
    scan_row_sums<T, A, Op><<<(unsigned)nt, kBlock, 0, s>>>(in, L, reverse, vec, f, identity, st);
    rc = em_launch_check(op);
    if (!rc) {
      scan_row_apply<T, A, Op><<<(unsigned)nt, kBlock, 0, s>>>(in, out, L, reverse, vec, f, identity, st);
      rc = em_launch_check(op);
    }
  }
  em_tensor_release(ws);   /* stream-ordered */
  return rc;
}

template <typename T, typename A, typename Op>
int scan_row_det(const char *op, const em_tensor *a, const T *in, T *out, int64_t L, bool reverse, Op f, A identity,
                 cudaStream_t s) {
  const int64_t nt = (L + kRowTile - 1) / kRowTile, nc = nt / kRowChunk + 1;
  if (nt > INT32_MAX) return em_error("%s: CUDA scans at most 2^31 - 1 tiles in one row, got %lld", op, (long long)nt);
  const size_t flags = (256 + (size_t)(nt + nc) * sizeof(int) + 255) & ~(size_t)255;
  int64_t total = (int64_t)(flags + (size_t)(nt + nc) * sizeof(A));
  em_tensor *ws = em_empty(1, &total, EM_U8, a->device);
  if (!ws) return -1;
  char *p = (char *)em_data_ptr(ws);
  RowState<A> st;
  st.ticket = (unsigned *)p;
  st.agg_flag = (int *)(p + 256);
  st.ctot_flag = st.agg_flag + nt;
  st.agg = (A *)(p + flags);
  st.ctot = st.agg + nt;
  int rc = em_cuda_check(cudaMemsetAsync(p, 0, flags, s), op, "cudaMemsetAsync");
  if (!rc) {
    const bool vec = (((uintptr_t)in | (uintptr_t)out) & 15) == 0;
    scan_row_tiles<T, A, Op><<<(unsigned)nt, kBlock, 0, s>>>(in, out, L, reverse, vec, f, identity, st);
    rc = em_launch_check(op);
  }
  em_tensor_release(ws);   /* stream-ordered */
  return rc;
}

/* ring's and l2c's cooperative launches are kept out of graph capture (ember.cuda.graph): split there, the same bits */
static bool stream_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus c = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(s, &c) == cudaSuccess && c != cudaStreamCaptureStatusNone;
}

constexpr bool kAutoFused = false;   /* auto's l2: two launches a segment (l2), or one (true: l2f) */
/* EMBER_SCAN_ROW_PDL's default: l2's kernels with programmatic dependent launch (not inside graph capture) */
constexpr bool kAutoPdl = false;

/* auto: l2 for forward rows of f32 accumulators (f32, bf16, f16) on 16-byte boundaries larger than the L2
 * (split's second pass misses there; a shorter row is mostly still in L2 when split's apply pass, last
 * tile first, reads it again, and l2 would only add launches); split elsewhere. */
template <typename T, typename A>
bool l2_wins(const em_tensor *a, const T *in, const T *out, int64_t L, bool reverse) {
  if (!std::is_same<A, float>::value || reverse || (((uintptr_t)in | (uintptr_t)out) & 15) != 0) return false;
  return L * (int64_t)sizeof(T) > device_l2_bytes(a->device.index);
}

/* The one-row scan, by EMBER_SCAN_ROW (chain, ring: f32 accumulators only, split for the others). */
template <typename T, typename A, typename Op>
int scan_row(const char *op, const em_tensor *a, const T *in, T *out, int64_t L, bool reverse, Op f, A identity,
             cudaStream_t s) {
  int64_t seg_chunks = 0;
  const int mode = row_scan_mode(op, &seg_chunks);
  if (mode < 0) return -1;
  if (mode == 2) return scan_one_row<T, A, Op>(op, a, in, out, L, reverse, f, s);
  if (mode == 1) return scan_row_det<T, A, Op>(op, a, in, out, L, reverse, f, identity, s);
  if constexpr (std::is_same<A, float>::value)
    if (mode == 3) return scan_row_chain_run<T, Op>(op, a, in, out, L, reverse, f, identity, s);
  if constexpr (std::is_same<A, float>::value)
    if (mode == 4 && !stream_capturing(s))
      return scan_row_ring_run<T, Op>(op, a, in, out, L, reverse, f, identity, s);
  if (mode == 8 && !stream_capturing(s)) {
    const int64_t nt = (L + kRowTile - 1) / kRowTile;
    if (nt > INT32_MAX)
      return em_error("%s: CUDA scans at most 2^31 - 1 tiles in one row, got %lld", op, (long long)nt);
    return scan_row_l2_coop<T, A, Op>(op, a, in, out, L, reverse, f, identity, seg_chunks, s);
  }
  if (mode == 5 || mode == 7 || (mode == 6 && l2_wins<T, A>(a, in, out, L, reverse))) {
    const int64_t nt = (L + kRowTile - 1) / kRowTile;
    if (nt > INT32_MAX) return em_error("%s: CUDA scans at most 2^31 - 1 tiles in one row, got %lld", op, (long long)nt);
    static const bool pdl_env = em_env_switch("EMBER_SCAN_ROW_PDL", kAutoPdl);
    const bool fused = mode == 7 || (mode == 6 && kAutoFused), pdl = pdl_env && !stream_capturing(s);
    return scan_row_l2<T, A, Op>(op, a, in, out, L, reverse, f, identity,
                                 l2_seg_chunks<T>(a->device.index, seg_chunks, fused), fused, pdl, s);
  }
  return scan_row_split<T, A, Op>(op, a, in, out, L, reverse, f, identity, s);
}
