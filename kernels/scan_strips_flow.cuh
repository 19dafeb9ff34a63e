/* Column scans (the scanned dim not innermost) in strips of 32 columns, the
 * walk apart from the copies: scan_strips_flow, included by kernels/scan.cu
 * inside its anonymous namespace (after kStripCols, widen/narrow and the
 * cp.async helpers).
 *
 * Why: scan_strips_async's block takes turns — all warps wait for a tile,
 * warp 0 walks it (the serial part: each column's chain of ops, row after
 * row), all warps wait, all write it back and start the next copy — so a
 * strip costs (walk + write-back + two barriers) a tile. Its one walking
 * warp a strip is all the parallelism there is (8192 columns: 256 walkers),
 * and the two sizes measured fit ~16 cycles a row walked plus ~870 a 16 KiB
 * tile around it: (8192, 8192) bf16 0.088 ms, (4096, 4096) 0.040, the same
 * ~95-103 rows a microsecond a walker at both sizes (walk-bound, not
 * bandwidth-bound). Here the walker never waits for a write-back: warp 0
 * only walks, tile after tile of a ring of kFlowStages, and 4 mover warps
 * copy tiles in (cp.async), write walked tiles back (16 bytes a thread) and
 * refill the stage, the two sides handing stages over by named barriers
 * (FULL s: movers arrive once their copies of the tile in stage s landed,
 * the walker syncs; WALKED s: the walker arrives, movers sync). The walker
 * loads 16 rows from shared memory before their chain (8 in
 * scan_strips_async), one latency a 16 rows.
 *
 * Values: each column combined row 0, 1, ... (or L - 1, L - 2, ... reversed)
 * in A, one rounding an output: scan_strips_async's and scan_strips'
 * operations in the same order, the same bits (tests/gpu/scan_spec.lua
 * compares them with a row-by-row walk). Only where every row of a strip
 * is 16-byte aligned (scan_strips_async's condition). */
#pragma once

constexpr int kFlowMovers = 128;                    /* 4 warps */
constexpr int kFlowThreads = 32 + kFlowMovers;      /* warp 0 walks */
constexpr int kFlowStages = 6, kFlowTileBytes = 8 * 1024, kFlowBatch = 16;
constexpr int kFlowSmem = kFlowStages * kFlowTileBytes;

__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

template <typename T, typename A, typename Op>
__global__ void __launch_bounds__(kFlowThreads) scan_strips_flow(const T *__restrict__ in, T *__restrict__ out,
                                                                 int64_t L, int64_t inner, int64_t strips,
                                                                 bool reverse, Op op, A identity) {
  constexpr int R = kFlowTileBytes / (kStripCols * (int)sizeof(T));   /* rows a tile: 128 bf16, 64 f32, 32 f64 */
  constexpr int CPR = kStripCols * (int)sizeof(T) / 16;                /* 16-byte chunks a row */
  constexpr int CPT = R * CPR / kFlowMovers;                            /* chunks a mover thread, per tile: 4 */
  constexpr int V = 16 / (int)sizeof(T);                                /* elements a chunk */
  constexpr int NS = kFlowStages;
  static_assert(CPT * kFlowMovers == R * CPR, "a tile splits evenly over the movers");
  static_assert(1 + 2 * NS <= 16, "named barriers 1 .. 2 NS");
  extern __shared__ __align__(16) unsigned char strip_raw[];
  T(*buf)[R][kStripCols] = reinterpret_cast<T(*)[R][kStripCols]>(strip_raw);
  const int64_t o = blockIdx.x / strips, col0 = (blockIdx.x % strips) * kStripCols;
  const int64_t base = o * L * inner + col0;   /* element (row 0, col0) of this strip */
  const int64_t ntiles = (L + R - 1) / R;
  auto grow = [&](int64_t k) { return reverse ? L - 1 - k : k; };   /* global row of walk row k */
  if (threadIdx.x < 32) {   /* the walker: a lane a column */
    const int lane = threadIdx.x;
    const bool active = col0 + lane < inner;
    A acc = identity;
    for (int64_t t = 0; t < ntiles; t++) {
      const int s = (int)(t % NS);
      named_sync(1 + s, kFlowThreads);   /* tile t has landed in stage s */
      if (active) {
        T(*tile)[kStripCols] = buf[s];
        const int rows = (int)(L - t * R < R ? L - t * R : R);
        int r = 0;
        for (; r + kFlowBatch <= rows; r += kFlowBatch) {   /* 16 rows' loads before their chain of ops */
          T x[kFlowBatch];
#pragma unroll
          for (int i = 0; i < kFlowBatch; i++) x[i] = tile[r + i][lane];
#pragma unroll
          for (int i = 0; i < kFlowBatch; i++) {
            acc = op(acc, widen<A, T>(x[i]));
            tile[r + i][lane] = narrow<T, A>(acc);
          }
        }
        for (; r < rows; r++) {
          acc = op(acc, widen<A, T>(tile[r][lane]));
          tile[r][lane] = narrow<T, A>(acc);
        }
      }
      __syncwarp();   /* the idle lanes of a partial strip rejoin before the warp arrives */
      named_arrive(1 + NS + s, kFlowThreads);   /* stage s walked: the movers may write it back */
    }
    return;
  }
  const int m = threadIdx.x - 32;   /* the movers */
  auto fetch = [&](int64_t t) {     /* tile t into its stage; rows past L and columns past inner are not copied */
    if (t < ntiles) {
#pragma unroll
      for (int i = 0; i < CPT; i++) {
        const int q = i * kFlowMovers + m, r = q / CPR, cc = q % CPR;
        const int64_t k = t * R + r;
        if (k < L && col0 + cc * V < inner)
          cp_async16(&buf[t % NS][r][cc * V], in + base + grow(k) * inner + cc * V);
      }
    }
    cp_async_commit();   /* a group a tile, empty past the end: the wait counts stay uniform */
  };
#pragma unroll
  for (int t = 0; t < NS; t++) fetch(t);
  cp_async_wait<NS - 1>();   /* tile 0 (this thread's part) */
  named_arrive(1, kFlowThreads);
  for (int64_t t = 0; t < ntiles; t++) {
    const int s = (int)(t % NS);
    if (t + 1 < ntiles) {   /* hand tile t + 1 over first, so the walker goes on while tile t is written back */
      cp_async_wait<NS - 2>();   /* groups issued: NS + t; tiles 0 .. t + 1 landed */
      named_arrive(1 + (int)((t + 1) % NS), kFlowThreads);
    }
    named_sync(1 + NS + s, kFlowThreads);   /* tile t walked */
    const int rows = (int)(L - t * R < R ? L - t * R : R);
#pragma unroll
    for (int i = 0; i < CPT; i++) {   /* write back, 16 bytes a thread, coalesced */
      const int q = i * kFlowMovers + m, r = q / CPR, cc = q % CPR;
      if (r < rows && col0 + cc * V < inner)
        *reinterpret_cast<uint4 *>(out + base + grow(t * R + r) * inner + cc * V) =
            *reinterpret_cast<const uint4 *>(&buf[s][r][cc * V]);
    }
    fetch(t + NS);   /* into stage s: this thread's reads of it above are done (their values are stored) */
  }
  cp_async_wait<0>();   /* no copy outlives the block */
}
