/* One long row, one pass, persistent: scan_row_ring (EMBER_SCAN_ROW=ring, and
 * the default for forward aligned f32/bf16/f16 rows: f32 accumulators), included by
 * kernels/scan_row.cuh after scan_row_chain's pieces (RowChain,
 * chain_publish, chain_sum, row_tile_load).
 *
 * Why chain measured 0.30 ms at 2^26 f32, not ~0.14: a block a tile, and a
 * block holds its registers through ticket (an atomic round trip), loads (a
 * DRAM latency), look-back (one or more L2 round trips) and stores, with its
 * tile's loads in flight only in the second of those: ~5 blocks an SM x
 * 16 KiB over a ~3.5 us life is ~3 TB/s of reads at best, less the time
 * spent waiting. Here a grid of as many blocks as fit at once each takes
 * tile after tile, and while it scans and looks back for tile k its next
 * tile's 16-byte copies (cp.async, coalesced, into the other half of a
 * two-tile ring in shared memory) are already in flight, and once tile k
 * is in registers (after the look-back's barrier) tile k + 2G's copies go
 * into its half: the DRAM latency hides behind the look-back, one to two
 * tiles a block always in flight (5 blocks an SM: 80-160 KiB f32).
 *
 * Tiles by a fixed schedule, not tickets: block b takes tiles b, b + G,
 * b + 2G, ... (G = gridDim.x), launched cooperatively so that all G blocks
 * are resident at once (the look-back waits on other blocks' tiles). The
 * ticket version measured 1.59 ms at 2^26 f32 (5.7x split) because it ran
 * one tile at a time: each block took two consecutive tickets at its start
 * (k, k + 1); tile k + 1's total is published only after tile k's
 * look-back, which waits on tile k - 1, the previous block's second tile:
 * a chain through every tile (two tiles a hop, ~60-100 ns a tile). Worse,
 * it is self-sustaining: a block takes its next ticket when it starts an
 * iteration, and in that chain only one block is ever running, so it
 * again takes two consecutive tickets (an event simulation reproduces the
 * chain and its linear cost in tiles). With the fixed schedule a block's
 * consecutive tiles are G apart: tile k + G's total waits on tile k's
 * look-back, which waits on tiles < k, all one round earlier: the rounds
 * overlap, ~nt / G rounds of one iteration each.
 *
 * Values: the tile partition (kRowTile elements), the thread's 16 elements
 * scanned in order, cub::BlockScan, the packed total words and the
 * fixed-order sums (chain_sum over the chunk's earlier tiles, over the
 * earlier chunks' totals) are scan_row_chain's, so the bits of chain, split
 * and tiles: no value depends on which block took which tile. No deadlock:
 * every block is resident (cooperative launch) and finishes its tiles in
 * order, so the lowest unfinished tile has every predecessor published. */
#pragma once

constexpr int kRingStages = 2;

template <typename T, typename Op>
__global__ void __launch_bounds__(kBlock) scan_row_ring(const T *__restrict__ in, T *__restrict__ out, int64_t L,
                                                        bool reverse, bool vec, Op op, float identity, RowChain st) {
  typedef cub::BlockScan<float, kBlock> BlockScan;
  constexpr int CH = kRowTile * (int)sizeof(T) / 16 / kBlock;   /* 16-byte copies a thread a tile: 4 f32, 2 bf16 */
  constexpr int E = 16 / (int)sizeof(T);                         /* elements a 16-byte chunk */
  __shared__ typename BlockScan::TempStorage tmp;
  __shared__ __align__(16) T ring[kRingStages][kRowTile];
  __shared__ float within_sh, carry_sh;
  const int t = threadIdx.x;
  const int64_t nt = (L + kRowTile - 1) / kRowTile;
  auto fast_tile = [&](int64_t tile) { return vec && !reverse && (tile + 1) * kRowTile <= L; };
  /* tile's copies into stage s, chunk t + 256 i a thread (each warp 512 contiguous bytes an instruction) */
  auto copy_tile = [&](int64_t tile, int s) {
    if (tile < nt && fast_tile(tile)) {
#pragma unroll
      for (int i = 0; i < CH; i++) {
        const int c = t + kBlock * i;
        cp_async16(&ring[s][c * E], in + tile * kRowTile + (int64_t)c * E);
      }
    }
    cp_async_commit();   /* a group a tile, empty when nothing is copied: the wait count stays uniform */
  };
  const int64_t G = gridDim.x;
  int64_t cur = blockIdx.x;
  copy_tile(cur, 0);
  copy_tile(cur + G, 1);
  int s = 0;
  while (cur < nt) {   /* block-uniform */
    cp_async_wait<1>();   /* this thread's copies of cur have landed (cur + G's may be in flight) */
    __syncthreads();      /* and everyone's */
    const int64_t m = cur / kRowChunk, first = m * kRowChunk;
    float v[kRowItems];
    if (fast_tile(cur)) {
      const T *mine = &ring[s][t * kRowItems];
#pragma unroll
      for (int i = 0; i < kRowItems; i += E) {
        const Packed128<T> x = *reinterpret_cast<const Packed128<T> *>(mine + i);
#pragma unroll
        for (int k = 0; k < E; k++) v[i + k] = widen<float, T>(x[k]);
      }
    } else {
      row_tile_load<T, float, Op>(in, L, cur, false, reverse, op, identity, v);
    }
#pragma unroll
    for (int i = 1; i < kRowItems; i++) v[i] = op(v[i - 1], v[i]);
    float tp, total;
    BlockScan(tmp).ExclusiveScan(v[kRowItems - 1], tp, identity, op, total);
    if (t < 32) {
      if (t == 0) chain_publish(st.agg + cur, total);
      const float within = chain_sum(st.agg + first, cur - first, op, identity);
      /* a chunk's total depends on its own tiles only: no chain across chunks */
      if (t == 0 && cur - first == kRowChunk - 1) chain_publish(st.ctot + m, op(within, total));
      if (t == 0) within_sh = within;
    } else if (t < 64) {
      const float carry = chain_sum(st.ctot, m, op, identity);
      if (t == 32) carry_sh = carry;
    }
    __syncthreads();   /* within_sh, carry_sh; and everyone has read stage s into v */
    copy_tile(cur + 2 * G, s);   /* two tiles ahead: in flight across this tile's stores and all of the next */
    const float base = op(op(carry_sh, within_sh), tp);
    const int64_t p0 = cur * kRowTile + (int64_t)t * kRowItems;
    if (fast_tile(cur)) {
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
    /* no barrier: the next within_sh/carry_sh writes and the next BlockScan come after the next iteration's
     * first barrier, which everyone reaches after reading these */
    cur += G;
    s ^= 1;
  }
  cp_async_wait<0>();   /* no copy outlives the block */
}

/* Blocks an SM for scan_row_ring<T, Op> on the current device (0 on error), read once. */
template <typename T, typename Op>
int row_ring_blocks_per_sm() {
  static int per = -1;
  if (per < 0) {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, scan_row_ring<T, Op>, kBlock, 0) != cudaSuccess) b = 0;
    per = b;
  }
  return per;
}

template <typename T, typename Op>
int scan_row_ring_run(const char *op, const em_tensor *a, const T *in, T *out, int64_t L, bool reverse, Op f,
                      float identity, cudaStream_t s) {
  const int64_t nt = (L + kRowTile - 1) / kRowTile, nc = (nt + kRowChunk - 1) / kRowChunk;
  if (nt > INT32_MAX) return em_error("%s: CUDA scans at most 2^31 - 1 tiles in one row, got %lld", op, (long long)nt);
  const int per = row_ring_blocks_per_sm<T, Op>();
  if (per < 1) return em_error("%s: cudaOccupancyMaxActiveBlocksPerMultiprocessor failed for scan_row_ring", op);
  const int64_t slots = (int64_t)em_sm_count(a->device.index) * per, grid = nt < slots ? nt : slots;
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
    /* cooperative: all `grid` blocks resident at once, or an error (never a hang) */
    void *args[] = {(void *)&in, (void *)&out, (void *)&L, (void *)&reverse, (void *)&vec, (void *)&f,
                    (void *)&identity, (void *)&st};
    rc = em_cuda_check(cudaLaunchCooperativeKernel((const void *)scan_row_ring<T, Op>, dim3((unsigned)grid),
                                                   dim3(kBlock), args, 0, s),
                       op, "cudaLaunchCooperativeKernel (scan_row_ring)");
    if (!rc) rc = em_launch_check(op);
  }
  em_tensor_release(ws);   /* stream-ordered */
  return rc;
}
