/* The one-row scans of kernels/scan.cu (outer = inner = 1: cumsum of a long
 * vector), included by it inside its anonymous namespace after the shared
 * pieces (kBlock, widen/narrow, SumOp/ProdOp), so one translation unit. Two
 * paths, picked by EMBER_SCAN_ROW (scan_row at the end):
 *  - split (default): scan_row_sums then scan_row_apply, deterministic, no waits inside a kernel;
 *  - cub: cub::DeviceScan (decoupled look-back: not deterministic for floats), the reference for speed.
 * The single-pass and L2-segmented deterministic variants (tiles, chain, ring, l2, l2f, l2c, PDL) all
 * measured slower than split on an H200 and were deleted (docs/perf.md, thirteenth session). */
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

/* ---- one long row, deterministic, in two passes (the default) ----
 * The row is cut into tiles of kRowTile elements (kRowItems a thread), the
 * tiles into chunks of kRowChunk. A tile's elements are scanned in order
 * within each thread, then across threads by cub::BlockScan's fixed tree;
 * its prefix is a fixed expression of tile totals agg[k] and chunk totals
 * ctot[m]:
 *   prefix(k) = sum_fixed(ctot[0 .. m)) + sum_fixed(agg[mC .. k)),  m = k / C,
 *   ctot[m]   = sum_fixed(agg[mC .. mC + C - 1)) + agg[mC + C - 1],
 * sum_fixed being one warp summing v[j] into lane j % 32 in order, then an
 * xor butterfly (commutative pairs: every lane the same bits). Every value
 * is thus one fixed expression of the input, whoever evaluates it: the same
 * bits on every run (CUB's look-back adds whichever predecessors are ready).
 *  1. scan_row_sums (one block a tile): the tile's total into agg[k]. The
 *     block that completes a chunk (a counter per chunk) writes ctot[m];
 *     the block that completes the last chunk writes carry[m] =
 *     sum_fixed(ctot[0 .. m)) for every chunk.
 *  2. scan_row_apply (one block a tile, last tile first: pass 1 read the
 *     row front to back, so the L2 holds its tail): loads the tile again,
 *     prefix = carry[m] + sum_fixed(agg[mC .. k)), writes the scan. Its
 *     16-byte loads and stores carry an L2 evict_first policy: the output's
 *     lines are the L2's first victims, not the not-yet-read tail, and a
 *     tile read is not read again. The tile order changes no value (every
 *     carry is known after pass 1). EMBER_SCAN_ROW_LAST_FIRST=0: first tile
 *     first (nearly every read a DRAM miss). An evict_normal switch measured
 *     nothing on the H200 (0.2786 against 0.2784 ms) and is gone. Both
 *     passes' 16-byte accesses go through shared memory so that a warp
 *     instruction covers 512 contiguous bytes (RowChunks). The same bits
 *     either way.
 * Bytes: 3 s n (read twice, write once) less the tail pass 2 finds in L2. */
constexpr int kRowItems = 16, kRowTile = kBlock * kRowItems, kRowChunk = 64;

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

/* 16 bytes of the row: plain (.nc, pass 1) or with an L2 evict_first policy (pass 2). Only the 16-byte
 * path takes a policy: hinted scalar loads and stores (reversed or misaligned rows) cost f32's apply 13
 * registers (4 blocks an SM, not 6). */
template <bool Hint>
__device__ __forceinline__ uint4 row_ld16(const uint4 *p, uint64_t pol) {
  if constexpr (!Hint) {
    return __ldg(p);
  } else {
    uint4 v;
    asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
    return v;
  }
}
__device__ __forceinline__ void row_st16(uint4 *p, uint4 v, uint64_t pol) {
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
               :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(pol) : "memory");
}
__device__ __forceinline__ uint64_t row_policy() {
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

/* A thread's kRowItems elements are K 16-byte chunks (K = 2 for 16-bit types, 4 for f32, 8 for f64/i64),
 * its warp's 32 K chunks one contiguous run. Instruction j moves chunks 32 j + lane (512 contiguous bytes)
 * through shared memory, thread t's chunk c at slot K t + (c ^ swz(t)): conflict-free 16-byte accesses both
 * ways (a quarter-warp's 8 slots distinct mod 8). Each thread moving its own K chunks instead (one warp
 * instruction touching 16 B at a 16 K-byte stride: f32 16 lines, each sector half-used) was 24 % slower at
 * 2^26 f32 on the H200 (0.2784 against 0.2125 ms, 2026-11-28) and is gone. */
template <typename T>
struct RowChunks {
  static constexpr int K = kRowItems * (int)sizeof(T) / 16;
  static_assert(K >= 2 && K <= 8 && kRowItems * sizeof(T) % 16 == 0, "16-byte chunks, 2 to 8 a thread");
  static __device__ __forceinline__ int slot(int t, int c) { return K * t + (c ^ ((t / (8 / K)) % K)); }
};
template <typename T>
struct RowStage {   /* each warp's chunks on their way between registers and memory */
  uint4 w[kBlock / 32][32 * RowChunks<T>::K];
};

template <typename T>
union RowWord {
  uint4 w;
  Packed128<T> x;
};

/* Tile `tile`'s elements into v (not yet scanned). */
template <bool Hint, typename T, typename A, typename Op>
__device__ __forceinline__ void row_tile_load(const T *__restrict__ in, int64_t L, int64_t tile, bool fast,
                                              bool reverse, Op op, A identity, RowStage<T> &sh,
                                              uint64_t pol, A (&v)[kRowItems]) {
  constexpr int K = RowChunks<T>::K, P = Packed128<T>::size;
  const int64_t p0 = tile * kRowTile + (int64_t)threadIdx.x * kRowItems;
  if (fast) {
    RowWord<T> x[K];
    const int lane = threadIdx.x & 31;
    uint4 *st = sh.w[threadIdx.x >> 5];
    const uint4 *src = reinterpret_cast<const uint4 *>(in + (p0 - (int64_t)lane * kRowItems));
#pragma unroll
    for (int j = 0; j < K; j++) x[j].w = row_ld16<Hint>(src + 32 * j + lane, pol);
#pragma unroll
    for (int j = 0; j < K; j++) {
      const int g = 32 * j + lane;
      st[RowChunks<T>::slot(g / K, g % K)] = x[j].w;
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < K; c++) x[c].w = st[RowChunks<T>::slot(lane, c)];
#pragma unroll
    for (int c = 0; c < K; c++)
#pragma unroll
      for (int k = 0; k < P; k++) v[c * P + k] = widen<A, T>(x[c].x[k]);
  } else {
#pragma unroll
    for (int i = 0; i < kRowItems; i++) {
      const int64_t p = p0 + i;
      v[i] = p < L ? widen<A, T>(in[reverse ? L - 1 - p : p]) : identity;
    }
  }
}

/* v (thread-ordered, already rounded to T) to tile `tile`'s 16-byte path, coalesced like row_tile_load. */
template <typename T>
__device__ __forceinline__ void row_tile_store(T *__restrict__ out, int64_t tile, RowStage<T> &sh,
                                               uint64_t pol, const RowWord<T> (&x)[RowChunks<T>::K]) {
  constexpr int K = RowChunks<T>::K;
  const int64_t p0 = tile * kRowTile + (int64_t)threadIdx.x * kRowItems;
  const int lane = threadIdx.x & 31;
  uint4 *st = sh.w[threadIdx.x >> 5];
  __syncwarp();   /* every lane has read its chunks of the load */
#pragma unroll
  for (int c = 0; c < K; c++) st[RowChunks<T>::slot(lane, c)] = x[c].w;
  __syncwarp();
  uint4 *dst = reinterpret_cast<uint4 *>(out + (p0 - (int64_t)lane * kRowItems));
#pragma unroll
  for (int j = 0; j < K; j++) {
    const int g = 32 * j + lane;
    row_st16(dst + g, st[RowChunks<T>::slot(g / K, g % K)], pol);
  }
}

template <typename T, typename A, typename Op>
__global__ void __launch_bounds__(kBlock) scan_row_sums(const T *__restrict__ in, int64_t L, bool reverse, bool vec,
                                                        Op op, A identity, RowSplit<A> st) {
  typedef cub::BlockScan<A, kBlock> BlockScan;
  __shared__ typename BlockScan::TempStorage tmp;
  __shared__ RowStage<T> stage;
  __shared__ int chunk_sh, all_sh;   /* this block completed chunk m / the last chunk */
  const int t = threadIdx.x;
  const int64_t tile = blockIdx.x, m = tile / kRowChunk, first = m * kRowChunk;
  const bool fast = vec && !reverse && (tile + 1) * kRowTile <= L;
  A v[kRowItems];
  row_tile_load<false, T, A, Op>(in, L, tile, fast, reverse, op, identity, stage, 0, v);
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
                                                         bool reverse, bool vec, bool last_first, Op op,
                                                         A identity, RowSplit<A> st) {
  typedef cub::BlockScan<A, kBlock> BlockScan;
  __shared__ typename BlockScan::TempStorage tmp;
  __shared__ RowStage<T> stage;
  __shared__ A prefix_sh;
  const int t = threadIdx.x;
  /* blocks start roughly in blockIdx order: last_first gives the first ones the tiles pass 1 left in L2 */
  const int64_t tile = last_first ? st.nt - 1 - (int64_t)blockIdx.x : (int64_t)blockIdx.x;
  const int64_t m = tile / kRowChunk, first = m * kRowChunk;
  const bool fast = vec && !reverse && (tile + 1) * kRowTile <= L;
  /* only the 16-byte path takes a policy. Made under `fast` (not at once), ptxas allocates every apply
   * instantiation the registers it had with the deleted evict switch's branch here (i64 sum: 64, not 80) */
  const uint64_t pol = fast ? row_policy() : 0;
  A v[kRowItems];
  row_tile_load<true, T, A, Op>(in, L, tile, fast, reverse, op, identity, stage, pol, v);
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
    constexpr int K = RowChunks<T>::K, P = Packed128<T>::size;
    RowWord<T> x[K];
#pragma unroll
    for (int c = 0; c < K; c++)
#pragma unroll
      for (int k = 0; k < P; k++) x[c].x[k] = narrow<T, A>(op(base, v[c * P + k]));
    row_tile_store<T>(out, tile, stage, pol, x);
  } else {
    const int64_t p0 = tile * kRowTile + (int64_t)t * kRowItems;
#pragma unroll
    for (int i = 0; i < kRowItems; i++) {
      const int64_t p = p0 + i;
      if (p < L) out[reverse ? L - 1 - p : p] = narrow<T, A>(op(base, v[i]));
    }
  }
}

template <typename T, typename A, typename Op>
int scan_row_split(const char *op, const em_tensor *a, const T *in, T *out, int64_t L, bool reverse, Op f, A identity,
                   cudaStream_t s) {
  /* the A/B switch (read once): pass 2's tile order; the same bits */
  static const bool last_first = em_env_switch("EMBER_SCAN_ROW_LAST_FIRST", true);
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
      scan_row_apply<T, A, Op><<<(unsigned)nt, kBlock, 0, s>>>(in, out, L, reverse, vec, last_first, f, identity, st);
      rc = em_launch_check(op);
    }
  }
  em_tensor_release(ws);   /* stream-ordered */
  return rc;
}

/* The one-row scan, by EMBER_SCAN_ROW (read once): "split" (unset: scan_row_sums + scan_row_apply, the same
 * bits on every run) or "cub" (cub::DeviceScan, not deterministic for floats); anything else is an error. */
template <typename T, typename A, typename Op>
int scan_row(const char *op, const em_tensor *a, const T *in, T *out, int64_t L, bool reverse, Op f, A identity,
             cudaStream_t s) {
  static int mode = -1;
  if (em_env_choice(&mode, op, "EMBER_SCAN_ROW", "split", "cub") < 0) return -1;
  if (mode == 1) return scan_one_row<T, A, Op>(op, a, in, out, L, reverse, f, s);
  return scan_row_split<T, A, Op>(op, a, in, out, L, reverse, f, identity, s);
}
