/* Many rows scanned along the last dim (inner = 1), the vector path with P
 * tiles a step: scan_rows_pair, included by kernels/scan.cu inside its
 * anonymous namespace (after scan_rows_ring.cuh: it uses cp_async_items).
 *
 * Why: scan_rows_ring runs one cub::BlockScan a 1024-element tile: three
 * barriers, the raking warp's ~80 instructions and ~60 cursor, copy and
 * address instructions a thread — ~32 lane-instructions an element, over
 * bf16's budget at 70 % (~28): bf16 (8192, 8192) took 0.0905 ms (62 %)
 * where f32, twice the bytes on the same instructions, took 0.142 (79 %).
 * Here a step scans P consecutive tiles of the same row at once (P = 2:
 * EMBER_SCAN_ROWS=pair, the bf16/f16 default; P = 4 measured slower on an
 * H200 and lost its switch, EMBER_SCAN_ROWS=quad, in the thirteenth session): one
 * raking scan over P-wide partials (two barriers, not three: the storage is
 * only reused after the next step's first barrier), the cursors and the
 * loop once a step: ~half the instructions an element at P = 2.
 *
 * Values: rake_scan is cub::BlockScan<A, 256>'s default (BLOCK_SCAN_RAKING)
 * InclusiveScan of 4 items a thread, written out, for each of the P tiles
 * independently: the thread's items reduced in order, the partials placed
 * at t + t / 8, 32 raking lanes reducing 8 in order, the Kogge-Stone warp
 * scan (offsets 1 .. 16, op(lower lane, own)), the exclusive prefix from the
 * lane below, the exclusive downsweep (lane 0 not seeded), the thread's items
 * scanned from its prefix (thread 0 not seeded), the aggregate from lane 31
 * (CCCL's block_scan_raking.cuh, thread_scan.cuh and thread_reduce.cuh:
 * sequential for an operator it does not know; the PTX of scan_rows_ring
 * shows the same sequence). Then carry, tile after tile, as scan_rows:
 * the same operations in the same order, so the bits of EMBER_SCAN_ROWS=ring /
 * one / ahead (tests/gpu/scan_spec.lua compares them in children). Only for
 * vec rows (not reversed, L a multiple of 4, in/out aligned to Items<T>). */
#pragma once


/* P values of A moved as one shared-memory access. */
/* The longest row scan_rows_pair takes: its offsets in a row, 4 steps past the row's end included, stay in int. */
constexpr int64_t kPairMaxL = INT32_MAX - 16 * kBlock * kItems;

template <typename A, int P>
struct alignas(sizeof(A) * P) Lanes {
  A v[P];
};

/* cub's raking layout for 256 threads: 32 raking lanes of 8 partials, one pad a segment. */
template <typename A, int P>
struct RakeStorage {
  Lanes<A, P> grid[kBlock + kBlock / 8];
  Lanes<A, P> agg;
};

template <typename A>
__device__ __forceinline__ A shfl_up(A x, int d) {
  return __shfl_up_sync(0xffffffffu, x, d);
}

/* v[p][]: thread t's kItems elements of tile p, in; their inclusive scans over the block, out; total[p] the
 * tile's total. cub::BlockScan<A, kBlock>::InclusiveScan(v[p], v[p], op, total[p])'s arithmetic, per p. */
template <typename A, int P, typename Op>
__device__ __forceinline__ void rake_scan(RakeStorage<A, P> &s, A (&v)[P][kItems], A (&total)[P], Op op) {
  static_assert(kBlock == 256 && kItems == 4, "the raking layout below is cub's for 256 threads");
  const int t = threadIdx.x;
  Lanes<A, P> part;
#pragma unroll
  for (int p = 0; p < P; p++) {
    A r = v[p][0];
#pragma unroll
    for (int i = 1; i < kItems; i++) r = op(r, v[p][i]);
    part.v[p] = r;
  }
  s.grid[t + (t >> 3)] = part;
  __syncthreads();
  if (t < 32) {
    Lanes<A, P> inc = s.grid[9 * t];
#pragma unroll
    for (int k = 1; k < 8; k++) {
      const Lanes<A, P> x = s.grid[9 * t + k];
#pragma unroll
      for (int p = 0; p < P; p++) inc.v[p] = op(inc.v[p], x.v[p]);
    }
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
#pragma unroll
      for (int p = 0; p < P; p++) {
        const A lo = shfl_up(inc.v[p], off);
        if (t >= off) inc.v[p] = op(lo, inc.v[p]);
      }
    }
    Lanes<A, P> seg[8];   /* read again, as cub does (its raking scan does not memoize): fewer registers held */
#pragma unroll
    for (int k = 0; k < 8; k++) seg[k] = s.grid[9 * t + k];
#pragma unroll
    for (int p = 0; p < P; p++) {
      const A exc = shfl_up(inc.v[p], 1);   /* lane 0's is unused: thread 0 is not seeded */
      A run = seg[0].v[p];
      if (t != 0) run = op(exc, run);
      seg[0].v[p] = exc;
#pragma unroll
      for (int k = 1; k < 8; k++) {
        const A next = op(run, seg[k].v[p]);
        seg[k].v[p] = run;
        run = next;
      }
    }
#pragma unroll
    for (int k = 0; k < 8; k++) s.grid[9 * t + k] = seg[k];
    if (t == 31) s.agg = inc;
  }
  __syncthreads();
  /* No barrier after the reads below: the next step writes grid and agg only past its own first barrier (the
   * raking lanes), or this thread's own slot (its partial, after reading it here). */
  const Lanes<A, P> pre = s.grid[t + (t >> 3)], tot = s.agg;
#pragma unroll
  for (int p = 0; p < P; p++) {
    A r = v[p][0];
    if (t != 0) r = op(pre.v[p], r);
    v[p][0] = r;
#pragma unroll
    for (int i = 1; i < kItems; i++) {
      r = op(r, v[p][i]);
      v[p][i] = r;
    }
    total[p] = tot.v[p];
  }
}

/* The ring: 16 KiB of steps for 16-bit elements, 32 KiB otherwise (P = 2: bf16 4 steps of 4 KiB, f32 4 of 8 KiB,
 * f64 2 of 16 KiB). */
template <typename T, int P>
__host__ __device__ constexpr int pair_stages() {
  constexpr int step = P * kBlock * (int)sizeof(Items<T>), bytes = sizeof(T) <= 2 ? 16384 : 32768;
  return bytes / step < 2 ? 2 : bytes / step;
}

/* 16-bit elements, P = 2: 48 registers, 5 blocks an SM, no spills; P = 4: 64, 4 blocks; wider elements (opt-in)
 * spill under those bounds. */
template <typename T, int P>
__host__ __device__ constexpr int pair_min_blocks() {
  return sizeof(T) > 2 ? 1 : P <= 2 ? 5 : 4;
}

template <typename T, typename A, typename Op, int P>
__global__ void __launch_bounds__(kBlock, pair_min_blocks<T, P>())
    scan_rows_pair(const T *__restrict__ in, T *__restrict__ out, int64_t outer, int64_t L, Op op, A identity) {
  constexpr int S = pair_stages<T, P>();
  constexpr int64_t kTile = kBlock * kItems, kStep = P * kTile;
  __shared__ RakeStorage<A, P> tmp;
  __shared__ Items<T> ring[S][P][kBlock];   /* ring[s][p][t]: thread t's slot of tile p of stage s; only t touches it */
  const int t = threadIdx.x, Li = (int)L;   /* L <= kPairMaxL: scan_rows_pair_run */
  const int64_t rstep = (int64_t)gridDim.x * L;
  /* The stream: rows blockIdx.x, + G, ... below outer (nrows of them), each as steps of P tiles at 0, kStep, ...
   * below L (a row's last step may hold tiles past L: nothing copied, identity scanned, nothing stored). Two
   * cursors as in scan_rows_ring, each a row pointer, this thread's offset in the row and the rows left: the copy
   * cursor S - 1 steps ahead of the scan cursor. 32-bit offsets and counts keep the registers at 5 blocks an SM. */
  const int nrows = (int)((outer - blockIdx.x + gridDim.x - 1) / gridDim.x);
  const T *crow = in + (int64_t)blockIdx.x * L;
  int cj = t * kItems, crows = nrows, cs = 0;
  auto copy_next = [&]() {
    if (crows > 0) {
#pragma unroll
      for (int p = 0; p < P; p++)
        if (cj + p * (int)kTile < Li) cp_async_items<T>(&ring[cs][p][t], crow + cj + p * (int)kTile);
    }
    cp_async_commit();   /* one group a step, empty past the end: the wait count stays uniform */
    cs = cs + 1 == S ? 0 : cs + 1;
    cj += (int)kStep;
    if (cj - t * kItems >= Li) { cj = t * kItems; crow += rstep; crows--; }
  };
#pragma unroll
  for (int q = 0; q < S - 1; q++) copy_next();
  A carry = identity;
  int ss = 0;
  T *orow = out + (int64_t)blockIdx.x * L;
  for (int j0 = t * kItems, rows = nrows; rows > 0;) {
    copy_next();              /* into the previous step's stage: this thread read its slots there last iteration */
    cp_async_wait<S - 1>();   /* this thread's copies of this step have landed */
    A v[P][kItems];
#pragma unroll
    for (int p = 0; p < P; p++) {
      if (j0 + p * (int)kTile < Li) {
        const Items<T> x = ring[ss][p][t];
#pragma unroll
        for (int i = 0; i < kItems; i++) v[p][i] = widen<A, T>(x.v[i]);
      } else {
#pragma unroll
        for (int i = 0; i < kItems; i++) v[p][i] = identity;
      }
    }
    A total[P];
    rake_scan<A, P, Op>(tmp, v, total, op);
#pragma unroll
    for (int p = 0; p < P; p++) {
      if (j0 + p * (int)kTile < Li) {
        Items<T> x;
#pragma unroll
        for (int i = 0; i < kItems; i++) x.v[i] = narrow<T, A>(op(carry, v[p][i]));
        *reinterpret_cast<Items<T> *>(orow + j0 + p * (int)kTile) = x;
      }
      carry = op(carry, total[p]);   /* past the row's end: reset below before any use */
    }
    ss = ss + 1 == S ? 0 : ss + 1;
    j0 += (int)kStep;
    if (j0 - t * kItems >= Li) {   /* the row's last step: the next row starts from the identity */
      j0 = t * kItems;
      orow += rstep;
      rows--;
      carry = identity;
    }
  }
  cp_async_wait<0>();   /* no copy outlives the block */
}

template <typename T, typename A, typename Op, int P>
int pair_blocks_per_sm() {
  static int per = -1;
  if (per < 0) {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, scan_rows_pair<T, A, Op, P>, kBlock, 0) != cudaSuccess) b = 0;
    per = b;
  }
  return per;
}

/* The grid: as many blocks as fit at once, each the same number of rows (ceil(outer / slots)). */
template <typename T, typename A, typename Op, int P>
int scan_rows_pair_run(const char *op, const T *in, T *out, int64_t outer, int64_t L, Op f, A identity, int dev,
                       cudaStream_t s) {
  const int per = pair_blocks_per_sm<T, A, Op, P>();
  if (L > kPairMaxL)
    return em_error("%s: internal error: scan_rows_pair takes rows of at most %lld elements, got %lld", op,
                    (long long)kPairMaxL, (long long)L);
  if (per < 1) return em_error("%s: cudaOccupancyMaxActiveBlocksPerMultiprocessor failed for scan_rows_pair", op);
  const int64_t slots = (int64_t)em_sm_count(dev) * per, each = (outer + slots - 1) / slots;
  const int64_t grid = (outer + each - 1) / each;
  scan_rows_pair<T, A, Op, P><<<(unsigned)grid, kBlock, 0, s>>>(in, out, outer, L, f, identity);
  return em_launch_check(op);
}
