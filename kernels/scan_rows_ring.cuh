/* Many rows scanned along the last dim (inner = 1), the vector path:
 * scan_rows_ring, included by kernels/scan.cu inside its anonymous namespace
 * (after kBlock, kItems, Items, widen/narrow and the cp.async helpers).
 *
 * Why: scan_rows gives a block one row. With 8 tiles a row and 8 tiles'
 * loads ahead in registers (gpuscan2: 73 registers at bf16, 3 blocks an SM)
 * a block loaded its whole row, waited out the DRAM latency with nothing
 * else in flight, then scanned 8 tiles with no load in flight: memory idle
 * half the time ((8192, 8192) bf16 0.104 ms, 54 %, against 0.085 before).
 * Here a block walks several rows (b, b + G, ...) as one stream of 1024-
 * element tiles and keeps the next S - 1 tiles of that stream in flight in
 * a shared-memory ring (cp.async, 16 KiB a block: 8 tiles bf16, 4 f32, 2
 * f64), refilled as each tile is consumed, across row ends; the registers
 * stay those of a one-tile scan (6+ blocks an SM), so ~100 KiB a SM in
 * flight all the time.
 *
 * Values: each thread copies and reads back only its own Items slot (no
 * barrier needed for the ring), then exactly scan_rows' per-tile code (the
 * thread's 4 elements, cub::BlockScan::InclusiveScan, carry + v, the carry
 * reset at each row start): the same values in the same order, the same bits
 * as scan_rows (EMBER_SCAN_ROWS=ahead / one). Only for vec rows (not
 * reversed, L a multiple of 4, in/out aligned to Items<T>). */
#pragma once

constexpr int kRingBytes = 16 * 1024;

template <typename T>
__host__ __device__ constexpr int ring_stages() {
  return kRingBytes / (kBlock * (int)sizeof(Items<T>)) < 2 ? 2 : kRingBytes / (kBlock * (int)sizeof(Items<T>));
}

/* One Items<T> (8, 16 or 32 bytes) from global to shared memory, asynchronously. */
template <typename T>
__device__ __forceinline__ void cp_async_items(Items<T> *smem, const T *gmem) {
  constexpr int B = (int)sizeof(Items<T>);
  if constexpr (B == 8) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem) : "memory");
  } else {
#pragma unroll
    for (int i = 0; i < B / 16; i++)
      cp_async16(reinterpret_cast<char *>(smem) + 16 * i, reinterpret_cast<const char *>(gmem) + 16 * i);
  }
}

template <typename T, typename A, typename Op>
__global__ void __launch_bounds__(kBlock) scan_rows_ring(const T *__restrict__ in, T *__restrict__ out, int64_t outer,
                                                         int64_t L, Op op, A identity) {
  typedef cub::BlockScan<A, kBlock> BlockScan;
  constexpr int S = ring_stages<T>();
  constexpr int64_t kTile = kBlock * kItems;
  __shared__ typename BlockScan::TempStorage tmp;
  __shared__ Items<T> ring[S][kBlock];   /* ring[s][t]: thread t's slot of stage s, only thread t touches it */
  const int t = threadIdx.x;
  const int64_t G = gridDim.x;
  /* The stream: rows blockIdx.x, + G, ... below outer, each as tiles at 0, kTile, ... below L. Two cursors walk
   * it (no 64-bit divisions): the copy cursor (crow, cj) S - 1 tiles ahead of the scan cursor (row, j0): the
   * row's first element and this thread's element in the row; past the end when the row reaches outer * L. */
  const int64_t end = outer * L, rstep = G * L;
  int64_t crow = (int64_t)blockIdx.x * L, cj = (int64_t)t * kItems;   /* copy cursor */
  int cs = 0;   /* the copy cursor's stage */
  auto copy_next = [&]() {
    if (crow < end && cj < L) cp_async_items<T>(&ring[cs][t], in + crow + cj);   /* L % kItems == 0: whole or none */
    cp_async_commit();   /* one group a tile, empty past the end: the wait count stays uniform */
    cs = cs + 1 == S ? 0 : cs + 1;
    cj += kTile;
    if (cj - t * kItems >= L) { cj = (int64_t)t * kItems; crow += rstep; }
  };
#pragma unroll
  for (int q = 0; q < S - 1; q++) copy_next();
  A carry = identity;
  int ss = 0;   /* the scan cursor's stage */
  for (int64_t row = (int64_t)blockIdx.x * L, j0 = (int64_t)t * kItems; row < end;) {
    copy_next();               /* into the previous tile's stage: this thread read its slot there last iteration */
    cp_async_wait<S - 1>();    /* this thread's copy of this tile has landed */
    const bool whole = j0 < L;
    A v[kItems];
    if (whole) {
      const Items<T> x = ring[ss][t];
#pragma unroll
      for (int i = 0; i < kItems; i++) v[i] = widen<A, T>(x.v[i]);
    } else {
#pragma unroll
      for (int i = 0; i < kItems; i++) v[i] = identity;
    }
    A total;
    BlockScan(tmp).InclusiveScan(v, v, op, total);
    if (whole) {
      Items<T> x;
#pragma unroll
      for (int i = 0; i < kItems; i++) x.v[i] = narrow<T, A>(op(carry, v[i]));
      *reinterpret_cast<Items<T> *>(out + row + j0) = x;
    }
    carry = op(carry, total);
    ss = ss + 1 == S ? 0 : ss + 1;
    j0 += kTile;
    if (j0 - t * kItems >= L) {   /* the row's last tile: the next row starts from the identity */
      j0 = (int64_t)t * kItems;
      row += rstep;
      carry = identity;
    }
    __syncthreads();   /* tmp is reused by the next tile */
  }
  cp_async_wait<0>();   /* no copy outlives the block */
}

/* Blocks an SM for scan_rows_ring<T, A, Op> on the current device (0 on error), read once. */
template <typename T, typename A, typename Op>
int ring_blocks_per_sm() {
  static int per = -1;
  if (per < 0) {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, scan_rows_ring<T, A, Op>, kBlock, 0) != cudaSuccess) b = 0;
    per = b;
  }
  return per;
}

/* The grid: as many blocks as fit at once, each the same number of rows (ceil(outer / slots)). */
template <typename T, typename A, typename Op>
int scan_rows_ring_run(const char *op, const T *in, T *out, int64_t outer, int64_t L, Op f, A identity, int dev,
                       cudaStream_t s) {
  const int per = ring_blocks_per_sm<T, A, Op>();
  if (per < 1) return em_error("%s: cudaOccupancyMaxActiveBlocksPerMultiprocessor failed for scan_rows_ring", op);
  const int64_t slots = (int64_t)em_sm_count(dev) * per, each = (outer + slots - 1) / slots;
  const int64_t grid = (outer + each - 1) / each;
  scan_rows_ring<T, A, Op><<<(unsigned)grid, kBlock, 0, s>>>(in, out, outer, L, f, identity);
  return em_launch_check(op);
}
