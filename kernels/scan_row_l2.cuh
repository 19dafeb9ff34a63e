/* ---- one long row, deterministic: split's two passes a segment at a time (EMBER_SCAN_ROW=l2) ----
 * Included by scan_row.cuh after split's kernels (RowSplit's partition, row_tile_load, kRowChunk).
 * split reads the whole row twice from DRAM: at 2^26 f32 the totals pass reads 256 MB, which has long
 * left the 50 MB L2 when the apply pass reads it again, so 768 MB move for 512 logical (0.277 ms).
 * Here the row is cut into segments of G whole chunks (G x 64 tiles, about a third of the L2 unless
 * EMBER_SCAN_ROW=l2:G) and each segment gets split's two passes back to back:
 *  1. scan_l2_sums (one block a tile of the segment): the tile's total agg[k] and, from the block that
 *     completes a chunk, its total ctot[m]: split's scan_row_sums up to there (the same code, the same bits).
 *     Reads the segment from DRAM, which leaves it in L2.
 *  2. scan_l2_apply (one block a tile, the segment's last tile first, as split): reads the tile again, now
 *     from L2 (streaming loads: evict first, it is not read again), prefix = carry + within, writes the
 *     scan with streaming stores (evict first: the output is not read back here, and must not push out
 *     the next segment's lines). carry = sum_fixed(ctot[0 .. m)) is summed by warp 1 of every block (all
 *     chunks before m are complete: earlier segments, or this one's pass 1), within =
 *     sum_fixed(agg[mC .. k)) by warp 0, both with the loads of a lane issued together.
 * Every value is split's expression: split's phase-1 tail computes carry[m] as the same lane partials in
 * the same order and the same butterfly, and split's apply adds prefix = op(carry[m], within) and
 * base = op(prefix, tp) as here. So the same bits as split and tiles, on every run. DRAM: one read and
 * one write of the row (plus the output's write-back), 2 launches a segment. */
#pragma once

/* sum_fixed (scan_row.cuh) with each lane's loads issued together, B at a time: the same adds in the
 * same order (lane l adds v[l], v[l + 32], ... from identity, then the xor butterfly). */
template <typename A, typename Op>
__device__ __forceinline__ A sum_fixed_batched(const A *v, int64_t n, Op op, A identity) {
  constexpr int B = 8;
  const int lane = threadIdx.x & 31;
  A acc = identity;
  for (int64_t b = 0; b < n; b += 32 * B) {
    A x[B];
#pragma unroll
    for (int i = 0; i < B; i++) {
      const int64_t j = b + lane + 32 * i;
      x[i] = j < n ? __ldcg(v + j) : identity;
    }
#pragma unroll
    for (int i = 0; i < B; i++)
      if (b + lane + 32 * i < n) acc = op(acc, x[i]);   /* never op(acc, identity): -0 + 0 is +0 */
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc = op(acc, __shfl_xor_sync(0xffffffffu, acc, off));
  return acc;
}

/* 16 bytes with the streaming hint (ld/st .cs: evict first in L1 and L2) */
template <typename T>
union L2Word {
  uint4 w;
  Packed128<T> x;
};
template <typename T>
__device__ __forceinline__ Packed128<T> load128_cs(const T *p) {
  L2Word<T> u;
  u.w = __ldcs(reinterpret_cast<const uint4 *>(p));
  return u.x;
}
template <typename T>
__device__ __forceinline__ void store128_cs(T *p, Packed128<T> x) {
  L2Word<T> u;
  u.x = x;
  __stcs(reinterpret_cast<uint4 *>(p), u.w);
}

/* Programmatic dependent launch (EMBER_SCAN_ROW_PDL=1): each kernel first waits for the one before it in the
 * stream to finish (its writes visible), then lets the next one be scheduled, so the next kernel's launch and
 * block placement overlap this one's tail instead of following it. Every kernel waits before it reads or
 * writes anything, so the order is the plain stream order. Without the launch attribute both are no-ops. */
__device__ __forceinline__ void l2_pdl_enter() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* chunk_done (zeroed before the first segment), agg, ctot: split's; nt tiles in the row */
template <typename A>
struct RowL2 {
  unsigned *chunk_done;
  A *agg, *ctot;
  int64_t nt;
};

template <typename A>
using L2Scan = cub::BlockScan<A, kBlock>;

/* Pass 1 for one tile: agg[tile], and ctot[m] from the block that completes chunk m. Block-uniform. */
template <typename T, typename A, typename Op>
__device__ __forceinline__ void l2_sums_tile(const T *__restrict__ in, int64_t L, int64_t tile, bool reverse,
                                             bool vec, Op op, A identity, const RowL2<A> &st,
                                             typename L2Scan<A>::TempStorage &tmp) {
  __shared__ int chunk_sh;   /* this block completed chunk m */
  const int t = threadIdx.x;
  const int64_t m = tile / kRowChunk, first = m * kRowChunk;
  const bool fast = vec && !reverse && (tile + 1) * kRowTile <= L;
  A v[kRowItems];
  row_tile_load<T, A, Op>(in, L, tile, fast, reverse, op, identity, v);
#pragma unroll
  for (int i = 1; i < kRowItems; i++) v[i] = op(v[i - 1], v[i]);
  A tp, total;
  L2Scan<A>(tmp).ExclusiveScan(v[kRowItems - 1], tp, identity, op, total);
  const int64_t size = st.nt - first < kRowChunk ? st.nt - first : kRowChunk;   /* tiles in chunk m */
  if (t == 0) {
    st.agg[tile] = total;
    __threadfence();   /* agg visible before the count that announces it */
    chunk_sh = atomicAdd(st.chunk_done + m, 1u) == (unsigned)(size - 1);
  }
  __syncthreads();
  /* a partial chunk is the row's last: no later tile needs its total */
  if (!chunk_sh || size != kRowChunk) return;
  if (t < 32) {
    __threadfence();   /* the chunk's aggs, counted before, are visible */
    const A within = sum_fixed(st.agg + first, kRowChunk - 1, op, identity);
    if (t == 0) st.ctot[m] = op(within, __ldcg(st.agg + first + kRowChunk - 1));
  }
}

/* Pass 2 for one tile (its chunk's earlier tiles and every earlier chunk done by pass 1): the scan. */
template <typename T, typename A, typename Op>
__device__ __forceinline__ void l2_apply_tile(const T *__restrict__ in, T *__restrict__ out, int64_t L, int64_t tile,
                                              bool reverse, bool vec, Op op, A identity, const RowL2<A> &st,
                                              typename L2Scan<A>::TempStorage &tmp) {
  __shared__ A within_sh, carry_sh;
  const int t = threadIdx.x;
  const int64_t m = tile / kRowChunk, first = m * kRowChunk;
  const int64_t p0 = tile * kRowTile + (int64_t)t * kRowItems;
  const bool fast = vec && !reverse && (tile + 1) * kRowTile <= L;
  A v[kRowItems];
  if (fast) {   /* the L2 copy pass 1 left, read for the last time */
    constexpr int P = Packed128<T>::size;
#pragma unroll
    for (int i = 0; i < kRowItems; i += P) {
      const Packed128<T> x = load128_cs(in + p0 + i);
#pragma unroll
      for (int k = 0; k < P; k++) v[i + k] = widen<A, T>(x[k]);
    }
  } else {
    row_tile_load<T, A, Op>(in, L, tile, false, reverse, op, identity, v);
  }
  if (t < 32) {   /* L2 hits, overlapping the tile's loads */
    const A within = sum_fixed_batched(st.agg + first, tile - first, op, identity);
    if (t == 0) within_sh = within;
  } else if (t < 64) {
    const A carry = sum_fixed_batched(st.ctot, m, op, identity);
    if (t == 32) carry_sh = carry;
  }
#pragma unroll
  for (int i = 1; i < kRowItems; i++) v[i] = op(v[i - 1], v[i]);
  A tp, total;
  L2Scan<A>(tmp).ExclusiveScan(v[kRowItems - 1], tp, identity, op, total);
  __syncthreads();   /* within_sh, carry_sh */
  const A base = op(op(carry_sh, within_sh), tp);
  if (fast) {
    constexpr int P = Packed128<T>::size;
#pragma unroll
    for (int i = 0; i < kRowItems; i += P) {
      Packed128<T> x;
#pragma unroll
      for (int k = 0; k < P; k++) x[k] = narrow<T, A>(op(base, v[i + k]));
      store128_cs(out + p0 + i, x);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kRowItems; i++) {
      const int64_t p = p0 + i;
      if (p < L) out[reverse ? L - 1 - p : p] = narrow<T, A>(op(base, v[i]));
    }
  }
}

/* pass 1 over tiles [tile0, tile0 + grid) */
template <typename T, typename A, typename Op>
__global__ void __launch_bounds__(kBlock) scan_l2_sums(const T *__restrict__ in, int64_t L, int64_t tile0,
                                                       bool reverse, bool vec, Op op, A identity, RowL2<A> st) {
  __shared__ typename L2Scan<A>::TempStorage tmp;
  l2_pdl_enter();
  l2_sums_tile<T, A, Op>(in, L, tile0 + blockIdx.x, reverse, vec, op, identity, st, tmp);
}

/* pass 2 over tiles [tile1 - grid, tile1), the last first (the newest in L2 first) */
template <typename T, typename A, typename Op>
__global__ void __launch_bounds__(kBlock) scan_l2_apply(const T *__restrict__ in, T *__restrict__ out, int64_t L,
                                                        int64_t tile1, bool reverse, bool vec, Op op, A identity,
                                                        RowL2<A> st) {
  __shared__ typename L2Scan<A>::TempStorage tmp;
  l2_pdl_enter();
  l2_apply_tile<T, A, Op>(in, out, L, tile1 - 1 - (int64_t)blockIdx.x, reverse, vec, op, identity, st, tmp);
}

/* EMBER_SCAN_ROW=l2f: one launch a segment boundary, not two a segment: the apply pass of tiles [a0, a1)
 * (segment k - 1, from L2) and pass 1 of tiles [s0, s1) (segment k, from DRAM) side by side, blocks
 * alternating between the two jobs, so segment k's DRAM reads overlap segment k - 1's L2 reads and DRAM
 * writes. Segment k - 1's apply reads only totals of segments up to k - 1 (earlier launches); segment k's
 * pass 1 writes only segment k's. Three segments live in L2 at once (k - 1's input and output, k's
 * input): about a quarter of the L2 a segment. nseg + 1 launches. */
template <typename T, typename A, typename Op>
__global__ void __launch_bounds__(kBlock) scan_l2_step(const T *__restrict__ in, T *__restrict__ out, int64_t L,
                                                       int64_t a0, int64_t a1, int64_t s0, int64_t s1, bool reverse,
                                                       bool vec, Op op, A identity, RowL2<A> st) {
  __shared__ typename L2Scan<A>::TempStorage tmp;
  l2_pdl_enter();
  const int64_t na = a1 - a0, ns = s1 - s0, both = na < ns ? na : ns, b = blockIdx.x;
  const bool apply = b < 2 * both ? (b & 1) == 0 : na > ns;   /* block-uniform */
  const int64_t i = b < 2 * both ? b >> 1 : both + (b - 2 * both);
  if (apply) l2_apply_tile<T, A, Op>(in, out, L, a1 - 1 - i, reverse, vec, op, identity, st, tmp);
  else l2_sums_tile<T, A, Op>(in, L, s0 + i, reverse, vec, op, identity, st, tmp);
}

/* EMBER_SCAN_ROW=l2c: l2's segments in ONE cooperative launch (all blocks resident), so l2's ~8 us a launch
 * (gap, ramp, tail) x 2 a segment goes, and no grid barrier drains the GPU between segments either. Block b:
 *   pass 1 of segment 0; then for each segment s: pass 1 of segment s + 1, wait until every tile of segment
 *   s has passed pass 1 (segment s's count in global memory), apply of segment s.
 * A count a segment, not one for the row: a fast block counts segment s + 1's tiles while a slow one is still
 * in pass 1 of s, so a row-wide count can reach s's end too early (tools/scan_l2c_protocol.py). Earlier
 * segments are complete: the block passed their waits.
 * Pass 1 of a segment gives block b tiles G - 1 - b, G - 1 - b + G, ... (apply gives b, b + G, ...: when the
 * segment has fewer tiles than the grid has blocks, different blocks take the two jobs). The wait for segment
 * s is on pass 1 of s only, which every block did before its apply of s - 1, so it seldom waits at all: a
 * one-segment lag, the next segment's DRAM reads in flight beside this one's L2 reads and DRAM writes (l2f's
 * pairing, without its launches). Pass 1 of s + 1 writes only its own agg/ctot, which apply of s never reads.
 * A block's pass-1 tiles would keep only its own tile's loads in flight (5-6 blocks an SM, each also waiting
 * on fences and atomics between tiles), so before applying segment s it prefetches its pass-1 tiles of
 * segment s + 2 into L2 (prefetch.global.L2: no registers, nothing waits on it; EMBER_SCAN_ROW_PREFETCH=0
 * turns it off), and pass 1 of s + 2 then reads L2: the DRAM reads run ahead of the blocks by about two
 * segments. L2 then holds segment s (being applied), s + 1 and s + 2 (read ahead), a fast block's s + 3;
 * the applies' loads and stores are evict-first: segments of a sixth of the L2.
 * The tile code is l2's (l2_sums_tile, l2_apply_tile): split's bits on every run. No deadlock: every block is
 * resident, and pass 1 of s never waits on anything but pass 1 of s - 1 (the wait before apply of s - 1). */

/* After a block's pass-1 tiles of a segment (n of them): add them to the segment's count, after their
 * agg/ctot (written by thread 0, l2_sums_tile) are visible to every block (release). */
__device__ __forceinline__ void l2c_count(unsigned *done, unsigned n) {
  if (threadIdx.x == 0 && n > 0) {
    __threadfence();
    atomicAdd(done, n);
  }
}

/* Before applying a segment of `tiles` tiles: thread 0 spins until its count has them all, then the block
 * reads their agg/ctot (with __ldcg: L2, never a stale L1) after the fence (acquire). */
__device__ __forceinline__ void l2c_wait(const unsigned *done, unsigned tiles) {
  if (threadIdx.x == 0) {
    while (*(const volatile unsigned *)done < tiles) {}
    __threadfence();
  }
  __syncthreads();
}

/* Block b's pass-1 tiles of the segment from tile s0 (none past the row) into L2: each 128-byte line of a
 * tile read on 16-byte boundaries (the vector path's tiles; the others are left to their loads) */
template <typename T>
__device__ __forceinline__ void l2c_prefetch(const T *in, int64_t L, int64_t seg, int64_t s0, bool reverse,
                                             bool vec) {
  constexpr int kLines = kRowTile * (int)sizeof(T) / 128;
  if (!vec || reverse) return;
  const int64_t s1 = L / kRowTile < s0 + seg ? L / kRowTile : s0 + seg;   /* full tiles only */
  for (int64_t tile = s0 + (gridDim.x - 1 - blockIdx.x); tile < s1; tile += gridDim.x)
    for (int j = threadIdx.x; j < kLines; j += kBlock)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(in + tile * kRowTile + j * (128 / (int)sizeof(T))));
}

/* Block b's pass 1 of the segment from tile s0 (nothing past the row), then its count */
template <typename T, typename A, typename Op>
__device__ __forceinline__ void l2c_pass1(const T *__restrict__ in, int64_t L, int64_t seg, int64_t s0, bool reverse,
                                          bool vec, Op op, A identity, const RowL2<A> &st, unsigned *done,
                                          typename L2Scan<A>::TempStorage &tmp) {
  const int64_t s1 = st.nt - s0 < seg ? st.nt : s0 + seg;
  unsigned n = 0;
  for (int64_t tile = s0 + (gridDim.x - 1 - blockIdx.x); tile < s1; tile += gridDim.x, n++) {
    l2_sums_tile<T, A, Op>(in, L, tile, reverse, vec, op, identity, st, tmp);
    __syncthreads();   /* tmp and chunk_sh are the next tile's; thread 0's writes precede the count */
  }
  l2c_count(done + s0 / seg, n);
}

template <typename T, typename A, typename Op>
__global__ void __launch_bounds__(kBlock) scan_l2_coop(const T *__restrict__ in, T *__restrict__ out, int64_t L,
                                                       int64_t seg, bool reverse, bool vec, Op op, A identity,
                                                       RowL2<A> st, unsigned *done, bool prefetch) {
  __shared__ typename L2Scan<A>::TempStorage tmp;
  if (prefetch) l2c_prefetch<T>(in, L, seg, seg, reverse, vec);   /* segment 1, while segment 0 is read */
  l2c_pass1<T, A, Op>(in, L, seg, 0, reverse, vec, op, identity, st, done, tmp);
  for (int64_t t0 = 0; t0 < st.nt; t0 += seg) {   /* grid-uniform */
    const int64_t t1 = st.nt - t0 < seg ? st.nt : t0 + seg;
    l2c_pass1<T, A, Op>(in, L, seg, t1, reverse, vec, op, identity, st, done, tmp);
    l2c_wait(done + t0 / seg, (unsigned)(t1 - t0));   /* segment s has passed pass 1 (and so have those before) */
    if (prefetch && t1 < st.nt) l2c_prefetch<T>(in, L, seg, t1 + seg, reverse, vec);   /* segment s + 2 */
    for (int64_t i = blockIdx.x; i < t1 - t0; i += gridDim.x) {
      l2_apply_tile<T, A, Op>(in, out, L, t1 - 1 - i, reverse, vec, op, identity, st, tmp);
      __syncthreads();   /* tmp, within_sh and carry_sh are the next tile's */
    }
  }
}

/* Blocks an SM for scan_l2_coop<T, A, Op> on the current device (0 on error), read once. */
template <typename T, typename A, typename Op>
int l2_coop_blocks_per_sm() {
  static int per = -1;
  if (per < 0) {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, scan_l2_coop<T, A, Op>, kBlock, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      b = 0;
    }
    per = b;
  }
  return per;
}

/* The device's L2 in bytes (50 MiB if the query fails) */
static int64_t device_l2_bytes(int dev) {
  int l2 = 0;
  if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess || l2 <= 0) {
    (void)cudaGetLastError();
    l2 = 50 << 20;
  }
  return l2;
}

/* Chunks a segment: `chunks` when given (EMBER_SCAN_ROW=l2:G / l2f:G), else about a third of the device's L2
 * for l2 (a segment's input and output sit there during its apply pass), a quarter for l2f (and the next
 * segment's input); at least one. */
template <typename T>
int64_t l2_seg_chunks(int dev, int64_t chunks, bool fused) {
  if (chunks > 0) return chunks;
  const int64_t per = (int64_t)kRowChunk * kRowTile * (int64_t)sizeof(T);
  const int64_t g = device_l2_bytes(dev) / (fused ? 4 : 3) / per;
  return g > 0 ? g : 1;
}

/* k<<<grid, kBlock, 0, s>>>(args...), with the programmatic-stream-serialization attribute when pdl */
template <typename... P, typename... Q>
cudaError_t l2_launch(void (*k)(P...), int64_t grid, cudaStream_t s, bool pdl, Q &&...args) {
  if (!pdl) {
    k<<<(unsigned)grid, kBlock, 0, s>>>(static_cast<Q &&>(args)...);
    return cudaSuccess;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)grid);
  cfg.blockDim = dim3(kBlock);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, k, static_cast<Q &&>(args)...);
}

/* EMBER_SCAN_ROW=l2c: scan_l2_coop, a grid of as many blocks as fit at once (at most the row's tiles); a
 * segment (G chunks, or a sixth of the L2, at least a chunk) may have fewer tiles than the grid has blocks:
 * its apply takes the low blocks and the next segment's pass 1 the high ones. */
template <typename T, typename A, typename Op>
int scan_row_l2_coop(const char *op, const em_tensor *a, const T *in, T *out, int64_t L, bool reverse, Op f,
                     A identity, int64_t seg_chunks, cudaStream_t s) {
  static const bool prefetch = em_env_switch("EMBER_SCAN_ROW_PREFETCH", true);
  const int64_t nt = (L + kRowTile - 1) / kRowTile, nc = (nt + kRowChunk - 1) / kRowChunk;
  const int64_t sixth = device_l2_bytes(a->device.index) / 6 / ((int64_t)kRowChunk * kRowTile * (int64_t)sizeof(T));
  const int64_t seg = (seg_chunks > 0 ? seg_chunks : sixth > 0 ? sixth : 1) * kRowChunk;   /* tiles a segment */
  const int per = l2_coop_blocks_per_sm<T, A, Op>();
  if (per < 1) return em_error("%s: cudaOccupancyMaxActiveBlocksPerMultiprocessor failed for scan_l2_coop", op);
  const int64_t slots = (int64_t)em_sm_count(a->device.index) * per, grid = nt < slots ? nt : slots;
  /* each segment's count of tiles past pass 1, then chunk_done, then agg and ctot */
  const int64_t nseg = (nt + seg - 1) / seg;
  const size_t segs = ((size_t)nseg * sizeof(unsigned) + 255) & ~(size_t)255;
  const size_t counts = segs + (((size_t)nc * sizeof(unsigned) + 255) & ~(size_t)255);
  int64_t total = (int64_t)(counts + (size_t)(nt + nc) * sizeof(A));
  em_tensor *ws = em_empty(1, &total, EM_U8, a->device);
  if (!ws) return -1;
  char *p = (char *)em_data_ptr(ws);
  unsigned *done = (unsigned *)p;
  RowL2<A> st;
  st.chunk_done = (unsigned *)(p + segs);
  st.agg = (A *)(p + counts);
  st.ctot = st.agg + nt;
  st.nt = nt;
  int rc = em_cuda_check(cudaMemsetAsync(p, 0, counts, s), op, "cudaMemsetAsync");
  if (!rc) {
    const bool vec = (((uintptr_t)in | (uintptr_t)out) & 15) == 0;
    /* cooperative: all `grid` blocks resident at once, or an error (never a hang) */
    void *args[] = {(void *)&in, (void *)&out,      (void *)&L,  (void *)&seg,  (void *)&reverse, (void *)&vec,
                    (void *)&f,  (void *)&identity, (void *)&st, (void *)&done, (void *)&prefetch};
    rc = em_cuda_check(cudaLaunchCooperativeKernel((const void *)scan_l2_coop<T, A, Op>, dim3((unsigned)grid),
                                                   dim3(kBlock), args, 0, s),
                       op, "cudaLaunchCooperativeKernel (scan_l2_coop)");
    if (!rc) rc = em_launch_check(op);
  }
  em_tensor_release(ws);   /* stream-ordered */
  return rc;
}

template <typename T, typename A, typename Op>
int scan_row_l2(const char *op, const em_tensor *a, const T *in, T *out, int64_t L, bool reverse, Op f, A identity,
                int64_t seg_chunks, bool fused, bool pdl, cudaStream_t s) {
  const int64_t nt = (L + kRowTile - 1) / kRowTile, nc = (nt + kRowChunk - 1) / kRowChunk;
  const int64_t seg = seg_chunks * kRowChunk;   /* tiles a segment */
  const size_t counts = ((size_t)nc * sizeof(unsigned) + 255) & ~(size_t)255;
  int64_t total = (int64_t)(counts + (size_t)(nt + nc) * sizeof(A));
  em_tensor *ws = em_empty(1, &total, EM_U8, a->device);
  if (!ws) return -1;
  char *p = (char *)em_data_ptr(ws);
  RowL2<A> st;
  st.chunk_done = (unsigned *)p;
  st.agg = (A *)(p + counts);
  st.ctot = st.agg + nt;
  st.nt = nt;
  int rc = em_cuda_check(cudaMemsetAsync(p, 0, counts, s), op, "cudaMemsetAsync");
  const bool vec = (((uintptr_t)in | (uintptr_t)out) & 15) == 0;
  /* the first kernel follows the memset as usual; with pdl, each later one overlaps its predecessor's tail */
  if (fused) {   /* launch k: apply segment k - 1, pass 1 of segment k */
    for (int64_t a0 = -seg; !rc && a0 < nt; a0 += seg) {
      const int64_t s0 = a0 + seg < nt ? a0 + seg : nt, s1 = nt - s0 < seg ? nt : s0 + seg;
      const int64_t lo = a0 < 0 ? 0 : a0, hi = a0 < 0 ? 0 : s0;   /* segment k - 1: none at k = 0 */
      rc = em_cuda_check(l2_launch(scan_l2_step<T, A, Op>, hi - lo + s1 - s0, s, pdl && a0 >= 0, in, out, L, lo, hi,
                                   s0, s1, reverse, vec, f, identity, st), op, "cudaLaunchKernelEx");
      if (!rc) rc = em_launch_check(op);
    }
  } else {
    for (int64_t t0 = 0; !rc && t0 < nt; t0 += seg) {
      const int64_t t1 = nt - t0 < seg ? nt : t0 + seg;
      rc = em_cuda_check(l2_launch(scan_l2_sums<T, A, Op>, t1 - t0, s, pdl && t0 > 0, in, L, t0, reverse, vec, f,
                                   identity, st), op, "cudaLaunchKernelEx");
      if (!rc) rc = em_cuda_check(l2_launch(scan_l2_apply<T, A, Op>, t1 - t0, s, pdl, in, out, L, t1, reverse, vec, f,
                                            identity, st), op, "cudaLaunchKernelEx");
      if (!rc) rc = em_launch_check(op);
    }
  }
  em_tensor_release(ws);   /* stream-ordered */
  return rc;
}
