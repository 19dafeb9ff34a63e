/* Scans on CUDA: cumsum and cumprod along a dim, and cumprod's backward — the
 * device half of engine/ops/scan.c. The engine hands over contiguous tensors
 * (f32, f64, i64, or bf16/f16 in and out of the same dtype), seen as
 * (outer, L, inner) around the scanned dim. bf16/f16 are widened to f32 as
 * they are read and rounded once as they are written (inside CUB's scan
 * through a transform iterator), so a half-precision cumsum moves 2 + 2
 * bytes per element, not the 2 + 4 + 4 + 4 + 4 + 2 of widen, scan, round.
 *
 * Cost: 1 FLOP and 2 x element size bytes per element; memory-bound.
 * Launch shapes, by where the scanned dim lies:
 *  - one row (outer = inner = 1, cumsum of a long vector; scan_row.cuh): 4096-element
 *    tiles whose prefixes are fixed-order sums of tile and chunk totals, so
 *    the same bits on every run: scan_row_sums then scan_row_apply (totals
 *    first, then each tile again with its prefix, last tile first with
 *    evict-first loads and stores so the row's tail is read from L2; read
 *    twice, write once); reverse (cumsum's backward) maps positions.
 *    EMBER_SCAN_ROW=cub: cub::DeviceScan (decoupled look-back: a float
 *    result may change with the timing).
 *  - many rows (inner = 1): cub::BlockScan over tiles of 256 x 4 elements
 *    with the running total carried between tiles; a thread's 4 elements
 *    move as one 16-byte (f32) / 8-byte (bf16) access when the rows allow it
 *    (vec). Vec rows: a block walks several rows as one stream of tiles, the
 *    next ones in flight in a cp.async ring of 16 KiB — for bf16/f16 two
 *    tiles a step through one raking scan written out from cub's
 *    (scan_rows_pair.cuh; EMBER_SCAN_ROWS=pair), for f32/f64 one
 *    tile a cub::BlockScan (scan_rows_ring.cuh; EMBER_SCAN_ROWS=ring); else
 *    (or EMBER_SCAN_ROWS=one / ahead) scan_rows, one block per row, the next
 *    tile (one) or 64 bytes a thread (ahead) loaded ahead in registers. Same
 *    values, same order, same bits on every path.
 *  - scanned dim not innermost, at least 32 columns (inner >= 32): one
 *    block per strip of 32 columns: where a strip's rows are 16-byte
 *    aligned, for bf16/f16 scan_strips_flow (scan_strips_flow.cuh; one warp
 *    walks while four copy tiles in and out; EMBER_SCAN_STRIP=flow), for
 *    f32/f64 scan_strips_async (EMBER_SCAN_STRIP=async: tiles copied in by
 *    cp.async, walked in place in shared memory, written back 16 bytes a
 *    thread, the block taking turns); else (or
 *    EMBER_SCAN_STRIP=v1) scan_strips: tiles of rows staged in
 *    shared memory by the whole block, the next tile's loads in flight while
 *    one warp walks this one, a lane per column, in row order.
 *  - fewer columns (1 < inner < 32): one thread per (outer, inner) column
 *    walking L; neighbouring threads read neighbouring addresses.
 * cumprod's backward (zeros handled: engine/ops/scan.c has the formula) is
 * the column walk with three passes per row, in strips of 32 columns staged
 * through shared memory when there are at least 32 (cumprod_grad_strips). */
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <cub/cub.cuh>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>
#include "common.cuh"
#include "dtype_io.cuh"
#include "backend.h"

namespace {

constexpr int kBlock = 256;
constexpr int kItems = 4;

struct SumOp {
  template <typename T> __device__ __forceinline__ T operator()(const T &a, const T &b) const { return a + b; }
};
struct ProdOp {
  template <typename T> __device__ __forceinline__ T operator()(const T &a, const T &b) const { return a * b; }
};

/* Storage T <-> accumulator A: 16-bit floats widen to f32 on load and round once on store. */
template <typename A, typename T> __device__ __forceinline__ A widen(T x) { return (A)x; }
template <> __device__ __forceinline__ float widen<float, __nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float widen<float, __half>(__half x) { return __half2float(x); }
template <typename T, typename A> __device__ __forceinline__ T narrow(A x) { return (T)x; }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16, float>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half narrow<__half, float>(float x) { return __float2half_rn(x); }

/* 16-bit floats read as f32 by CUB's device scan, and written back rounded once. */
template <typename T, typename A>
struct Widen {
  __host__ __device__ __forceinline__ A operator()(const T &x) const { return widen<A, T>(x); }
};
template <typename T, typename A>
struct Narrow {
  __host__ __device__ __forceinline__ T operator()(const A &x) const { return narrow<T, A>(x); }
};

/* A thread's kItems neighbours in one load/store (16 bytes for f32, 8 for bf16). */
template <typename T>
struct alignas(sizeof(T) * kItems) Items {
  T v[kItems];
};

/* Tiles a scan_rows block keeps loading ahead: 64 bytes a thread. */
template <typename T>
__host__ __device__ constexpr int rows_ahead() { return sizeof(Items<T>) >= 64 ? 1 : 64 / (int)sizeof(Items<T>); }

/* vec: not reversed, rows a whole number of Items long and in/out aligned to
 * them, so a thread's kItems elements move as one Items; the same values in
 * the same order as the scalar loads, so the same bits. The vector loads of
 * D tiles (rows_ahead, for rows over two tiles; else 1) are issued first, then the tiles are scanned in
 * order, each slot refilled with the tile D further on as it is consumed:
 * D tiles in flight a block, where one row's block used to keep one tile
 * (256 x 8 bytes for bf16) in flight and wait out a DRAM latency per tile
 * (bf16 (8192, 8192) at 66 %). */
template <typename T, typename A, typename Op, int D>
__global__ void __launch_bounds__(kBlock) scan_rows(const T *in, T *out, int64_t L, bool reverse, bool vec, Op op,
                                                    A identity) {
  typedef cub::BlockScan<A, kBlock> BlockScan;
  __shared__ typename BlockScan::TempStorage tmp;
  constexpr int64_t kTile = kBlock * kItems;
  const T *row = in + (int64_t)blockIdx.x * L;
  T *orow = out + (int64_t)blockIdx.x * L;
  A carry = identity;
  Items<T> xs[D];   /* slot d: the tile d (mod D) tiles ahead, refilled as it is consumed */
#pragma unroll
  for (int d = 0; d < D; d++) {
    const int64_t j0 = d * kTile + threadIdx.x * kItems;
    if (vec && j0 + kItems <= L) xs[d] = *reinterpret_cast<const Items<T> *>(row + j0);
  }
  for (int64_t base0 = 0; base0 < L; base0 += D * kTile) {
#pragma unroll
    for (int d = 0; d < D; d++) {
      const int64_t base = base0 + d * kTile;
      if (base >= L) break;   /* block-uniform */
      A v[kItems];
      const int64_t j0 = base + threadIdx.x * kItems;
      const bool whole = vec && j0 + kItems <= L;
      if (whole) {
#pragma unroll
        for (int i = 0; i < kItems; i++) v[i] = widen<A, T>(xs[d].v[i]);
        const int64_t jn = j0 + D * kTile;   /* D tiles on: keeps D tiles' loads in flight */
        if (jn + kItems <= L) xs[d] = *reinterpret_cast<const Items<T> *>(row + jn);
      } else {
#pragma unroll
        for (int i = 0; i < kItems; i++) {
          int64_t j = j0 + i;
          v[i] = j < L ? widen<A, T>(row[reverse ? L - 1 - j : j]) : identity;
        }
      }
      A total;
      BlockScan(tmp).InclusiveScan(v, v, op, total);
      if (whole) {
        Items<T> x;
#pragma unroll
        for (int i = 0; i < kItems; i++) x.v[i] = narrow<T, A>(op(carry, v[i]));
        *reinterpret_cast<Items<T> *>(orow + j0) = x;
      } else {
#pragma unroll
        for (int i = 0; i < kItems; i++) {
          int64_t j = j0 + i;
          if (j < L) orow[reverse ? L - 1 - j : j] = narrow<T, A>(op(carry, v[i]));
        }
      }
      carry = op(carry, total);
      __syncthreads();   /* tmp is reused by the next tile */
    }
  }
}

template <typename T, typename A, typename Op>
__global__ void scan_cols(const T *in, T *out, int64_t outer, int64_t L, int64_t inner, bool reverse, Op op,
                          A identity) {
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < outer * inner;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t base = (t / inner) * L * inner + t % inner;
    A acc = identity;
    for (int64_t jj = 0; jj < L; jj++) {
      int64_t o = base + (reverse ? L - 1 - jj : jj) * inner;
      acc = op(acc, widen<A, T>(in[o]));
      out[o] = narrow<T, A>(acc);
    }
  }
}

/* The column scan of a strip of kStripCols neighbouring columns (one block):
 * the block's warps load tiles of R rows x kStripCols (kStripTileBytes) into
 * shared memory, each load one row segment (coalesced), and warp 0 walks the
 * tile's rows in order, one lane per column, writing each result row as it
 * goes. The next tile's loads are issued before the walk of this one, so a
 * tile's worth of reads (32 KiB per block) is in flight while warp 0 works:
 * the scan_cols walk above has one load in flight per column, which for
 * 4096 columns (16 blocks) is ~3 % of the bandwidth. Each column is still
 * combined row 0, 1, 2, ... (or L - 1, L - 2, ... reversed) in A, one
 * rounding per output: the same operations in the same order as scan_cols,
 * so the same bits. */
constexpr int kStripCols = 32, kStripThreads = 256, kStripWarps = kStripThreads / 32;
constexpr int kStripTileBytes = 32 * 1024;

constexpr int kStripSmem = 2 * kStripTileBytes;   /* double-buffered */

template <typename T, typename A, typename Op>
__global__ void __launch_bounds__(kStripThreads) scan_strips(const T *__restrict__ in, T *__restrict__ out, int64_t L,
                                                             int64_t inner, int64_t strips, bool reverse, Op op,
                                                             A identity) {
  /* R rows a tile; E of them loaded by each thread */
  constexpr int R = kStripTileBytes / (kStripCols * (int)sizeof(T)), E = R / kStripWarps;
  extern __shared__ __align__(16) unsigned char strip_raw[];
  T(*buf)[R][kStripCols] = reinterpret_cast<T(*)[R][kStripCols]>(strip_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t o = blockIdx.x / strips, col = (blockIdx.x % strips) * kStripCols + lane;
  const bool active = col < inner;
  const int64_t base = o * L * inner + col, step = reverse ? -inner : inner;
  const int64_t first = reverse ? (L - 1) * inner : 0;   /* offset of walk row 0 from base */
  const int64_t ntiles = (L + R - 1) / R;
  T reg[E];
#pragma unroll
  for (int e = 0; e < E; e++) reg[e] = T();   /* rows past L and idle lanes: never walked */
  auto load = [&](int64_t t) {
#pragma unroll
    for (int e = 0; e < E; e++) {
      const int64_t j = t * R + warp + e * kStripWarps;
      if (active && j < L) reg[e] = in[base + first + j * step];
    }
  };
  auto stash = [&](int b) {
#pragma unroll
    for (int e = 0; e < E; e++) buf[b][warp + e * kStripWarps][lane] = reg[e];
  };
  load(0);
  stash(0);
  __syncthreads();
  A acc = identity;
  for (int64_t t = 0; t < ntiles; t++) {
    if (t + 1 < ntiles) load(t + 1);   /* in flight during the walk below */
    if (warp == 0 && active) {
      const int rows = (int)(L - t * R < R ? L - t * R : R);
      T *p = out + base + first + t * R * step;
      const T *row = &buf[t & 1][0][lane];
#pragma unroll 8
      for (int r = 0; r < rows; r++) {
        acc = op(acc, widen<A, T>(row[r * kStripCols]));
        *p = narrow<T, A>(acc);
        p += step;
      }
    }
    if (t + 1 < ntiles) stash((t + 1) & 1);   /* the other buffer: its walk ended before the last barrier */
    __syncthreads();
  }
}

/* scan_strips with the tile moved by cp.async and the walk kept in shared
 * memory (the default where rows of a strip are 16-byte aligned; EMBER_SCAN_STRIP=v1
 * keeps scan_strips above). scan_strips' walk pays a global store and 64-bit
 * pointer steps per row in its one walking warp, and keeps one 32 KiB tile
 * in flight; with 128 strips (4096 columns) that is one walker per SM and
 * ~60 us for a (4096, 4096) dim-0 scan, f32 and bf16 alike. Here:
 *  - kAsyncStages tiles of kAsyncTileBytes are copied global -> shared by
 *    cp.async, 16 bytes per thread per copy, up to three tiles ahead, no
 *    registers held;
 *  - warp 0 walks the tile in place (shared load, op, shared store per row:
 *    the chain of dependent ops is the only serial part);
 *  - all warps write the tile back with 16-byte stores.
 * Per column the same ops in the same order (row 0, 1, ... or reversed) in
 * A, one rounding per output: the bits of scan_strips and scan_cols. */
constexpr int kAsyncStages = 4, kAsyncTileBytes = 16 * 1024, kWalkBatch = 8;
constexpr int kAsyncSmem = kAsyncStages * kAsyncTileBytes;

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

template <typename T, typename A, typename Op>
__global__ void __launch_bounds__(kStripThreads) scan_strips_async(const T *__restrict__ in, T *__restrict__ out,
                                                                   int64_t L, int64_t inner, int64_t strips,
                                                                   bool reverse, Op op, A identity) {
  constexpr int R = kAsyncTileBytes / (kStripCols * (int)sizeof(T));   /* rows a tile */
  constexpr int CPR = kStripCols * (int)sizeof(T) / 16;                /* 16-byte chunks a row */
  constexpr int CPT = R * CPR / kStripThreads;                          /* chunks a thread, per tile */
  constexpr int V = 16 / (int)sizeof(T);                                /* elements a chunk */
  extern __shared__ __align__(16) unsigned char strip_raw[];
  T(*buf)[R][kStripCols] = reinterpret_cast<T(*)[R][kStripCols]>(strip_raw);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t o = blockIdx.x / strips, col0 = (blockIdx.x % strips) * kStripCols;
  const int64_t base = o * L * inner + col0;   /* element (row 0, col0) of this strip */
  const int64_t ntiles = (L + R - 1) / R;
  /* global row of walk row k */
  auto grow = [&](int64_t k) { return reverse ? L - 1 - k : k; };
  auto fetch = [&](int64_t t) {   /* tile t into its stage; rows past L and columns past inner are not copied */
    if (t < ntiles) {
#pragma unroll
      for (int i = 0; i < CPT; i++) {
        const int q = i * kStripThreads + threadIdx.x, r = q / CPR, cc = q % CPR;
        const int64_t k = t * R + r;
        if (k < L && col0 + cc * V < inner) cp_async16(&buf[t % kAsyncStages][r][cc * V], in + base + grow(k) * inner + cc * V);
      }
    }
    cp_async_commit();   /* a group per tile, empty past the end: the wait count stays uniform */
  };
#pragma unroll
  for (int t = 0; t < kAsyncStages - 1; t++) fetch(t);
  A acc = identity;
  const bool walker = warp == 0 && col0 + lane < inner;
  for (int64_t t = 0; t < ntiles; t++) {
    cp_async_wait<kAsyncStages - 2>();   /* this thread's copies of tile t have landed */
    __syncthreads();                      /* everyone's; and tile t - 1's write-back has read its stage */
    fetch(t + kAsyncStages - 1);          /* into tile t - 1's stage */
    T(*tile)[kStripCols] = buf[t % kAsyncStages];
    const int rows = (int)(L - t * R < R ? L - t * R : R);
    if (walker) {   /* 8 rows' loads issued before their chain: only the adds wait on each other */
      int r = 0;
      for (; r + kWalkBatch <= rows; r += kWalkBatch) {
        T x[kWalkBatch];
#pragma unroll
        for (int i = 0; i < kWalkBatch; i++) x[i] = tile[r + i][lane];
#pragma unroll
        for (int i = 0; i < kWalkBatch; i++) {
          acc = op(acc, widen<A, T>(x[i]));
          tile[r + i][lane] = narrow<T, A>(acc);
        }
      }
      for (; r < rows; r++) {
        acc = op(acc, widen<A, T>(tile[r][lane]));
        tile[r][lane] = narrow<T, A>(acc);
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < CPT; i++) {   /* write back, 16 bytes a thread, coalesced */
      const int q = i * kStripThreads + threadIdx.x, r = q / CPR, cc = q % CPR;
      if (r < rows && col0 + cc * V < inner)
        *reinterpret_cast<uint4 *>(out + base + grow(t * R + r) * inner + cc * V) =
            *reinterpret_cast<const uint4 *>(&tile[r][cc * V]);
    }
  }
  cp_async_wait<0>();   /* no copy outlives the block */
}

/* EMBER_SCAN_STRIP (read once): unset = flow for 16-bit elements, async for the others; "flow"
 * (scan_strips_flow, for every dtype), "async" (scan_strips_async) or "v1" (scan_strips). 0 unset, 1 async, 2 v1,
 * 3 flow; -1 on error. flow and async need 16-byte aligned strip rows, else scan_strips. */
static int strip_mode(const char *op) {
  static int mode = -1;
  if (mode < 0) {
    const char *env = getenv("EMBER_SCAN_STRIP");
    if (!env || !*env) mode = 0;
    else if (strcmp(env, "async") == 0) mode = 1;
    else if (strcmp(env, "v1") == 0) mode = 2;
    else if (strcmp(env, "flow") == 0) mode = 3;
    else return em_error("%s: expected EMBER_SCAN_STRIP to be flow, async or v1, got '%s'", op, env);
  }
  return mode;
}

#include "scan_strips_flow.cuh"   /* column strips: the walker apart from the copies */
#include "scan_row.cuh"        /* one long row: split (two passes), CUB */
#include "scan_rows_ring.cuh"   /* many rows: the tile stream with a cp.async ring */
#include "scan_rows_pair.cuh"   /* many rows: that stream P tiles a step, one raking scan for the P */

/* EMBER_SCAN_ROWS (read once): unset = pair for 16-bit elements, ring for the others; "pair" (scan_rows_pair, 2
 * tiles a step, for every dtype), "ring" (scan_rows_ring for vec rows), "ahead" (scan_rows with rows_ahead() tiles
 * in registers, gpuscan2's) or "one" (scan_rows, the next tile only). 0 (unset), 1 ring, 2 ahead, 3 one, 4 pair;
 * -1 on error. */
static int rows_mode(const char *op) {
  static int mode = -1;
  if (mode < 0) {
    const char *env = getenv("EMBER_SCAN_ROWS");
    if (!env || !*env) mode = 0;
    else if (strcmp(env, "ring") == 0) mode = 1;
    else if (strcmp(env, "ahead") == 0) mode = 2;
    else if (strcmp(env, "one") == 0) mode = 3;
    else if (strcmp(env, "pair") == 0) mode = 4;
    else return em_error("%s: expected EMBER_SCAN_ROWS to be pair, ring, ahead or one, got '%s'", op, env);
  }
  return mode;
}

template <typename T, typename A, typename Op>
int scan_impl(const char *op, const em_tensor *a, int64_t outer, int64_t L, int64_t inner, bool reverse, Op f,
              A identity, em_tensor *res, cudaStream_t s) {
  const T *in = (const T *)em_data_ptr(a);
  T *out = (T *)em_data_ptr(res);
  if (outer == 1 && inner == 1) {
    return scan_row<T, A, Op>(op, a, in, out, L, reverse, f, identity, s);
  }
  if (inner == 1) {
    if (outer > INT32_MAX) return em_error("%s: CUDA scans at most 2^31 - 1 rows, got %lld", op, (long long)outer);
    const bool vec = !reverse && L % kItems == 0 && (((uintptr_t)in | (uintptr_t)out) % sizeof(Items<T>)) == 0;
    const int rm = rows_mode(op);
    if (rm < 0) return -1;
    /* pair keeps 32-bit offsets in a row: longer rows (2^31 elements and more) take ring */
    const bool pair = vec && L <= kPairMaxL && (rm == 4 || (rm == 0 && sizeof(T) == 2));
    if (pair) return scan_rows_pair_run<T, A, Op, 2>(op, in, out, outer, L, f, identity, a->device.index, s);
    if (vec && (rm <= 1 || rm == 4))
      return scan_rows_ring_run<T, A, Op>(op, in, out, outer, L, f, identity, a->device.index, s);
    /* rows of one or two tiles gain nothing from loading ahead, and D = 1 keeps the registers (8 blocks an SM) */
    constexpr int D = rows_ahead<T>();
    auto k = vec && rm == 2 && L > 2 * kBlock * kItems ? scan_rows<T, A, Op, D> : scan_rows<T, A, Op, 1>;
    k<<<(unsigned)outer, kBlock, 0, s>>>(in, out, L, reverse, vec, f, identity);
  } else if (inner >= kStripCols) {
    const int64_t strips = (inner + kStripCols - 1) / kStripCols;
    if (outer * strips > INT32_MAX)
      return em_error("%s: CUDA scans at most 2^31 - 1 column strips, got %lld", op, (long long)(outer * strips));
    const int sm = strip_mode(op);
    if (sm < 0) return -1;
    /* cp.async moves 16-byte chunks: every row of a strip must start 16-byte aligned */
    const bool aligned = (inner * (int64_t)sizeof(T)) % 16 == 0 && (((uintptr_t)in | (uintptr_t)out) & 15) == 0;
    const bool flow = aligned && (sm == 3 || (sm == 0 && sizeof(T) == 2)), async = aligned && !flow && sm != 2;
    auto k = flow ? scan_strips_flow<T, A, Op> : async ? scan_strips_async<T, A, Op> : scan_strips<T, A, Op>;
    const int smem = flow ? kFlowSmem : async ? kAsyncSmem : kStripSmem;
    const int threads = flow ? kFlowThreads : kStripThreads;
    if (em_cuda_check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), op,
                      "cudaFuncSetAttribute"))
      return -1;
    k<<<(unsigned)(outer * strips), threads, smem, s>>>(in, out, L, inner, strips, reverse, f, identity);
  } else {   /* fewer columns than a strip: one thread per column */
    scan_cols<T, A, Op><<<em_grid(outer * inner, kBlock), kBlock, 0, s>>>(in, out, outer, L, inner, reverse, f,
                                                                          identity);
  }
  return em_launch_check(op);
}

template <typename T, typename A = T>
int scan_typed(const char *op, const em_tensor *a, int64_t outer, int64_t L, int64_t inner, bool prod, bool reverse,
               em_tensor *res, cudaStream_t s) {
  if (prod) return scan_impl<T, A, ProdOp>(op, a, outer, L, inner, reverse, ProdOp(), (A)1, res, s);
  return scan_impl<T, A, SumOp>(op, a, outer, L, inner, reverse, SumOp(), (A)0, res, s);
}

/* cumprod's gradient along each column (stride inner); see engine/ops/scan.c. */
template <typename A>
__global__ void cumprod_grad(const A *x, const A *g, A *gx, int64_t outer, int64_t L, int64_t inner) {
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < outer * inner;
       t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t b = (t / inner) * L * inner + t % inner, s = inner;
    int64_t z = 0;
    while (z < L && x[b + z * s] != (A)0) z++;
    A p = 1;
    for (int64_t j = 0; j < z; j++) { p *= x[b + j * s]; gx[b + j * s] = g[b + j * s] * p; }
    A acc = 0;
    for (int64_t j = z - 1; j >= 0; j--) { acc += gx[b + j * s]; gx[b + j * s] = acc / x[b + j * s]; }
    if (z == L) continue;
    A q = p, sum = 0;
    for (int64_t j = z; j < L; j++) {
      if (j > z) { q *= x[b + j * s]; gx[b + j * s] = 0; }
      sum += g[b + j * s] * q;
    }
    gx[b + z * s] = sum;
  }
}

/* cumprod's gradient for strips of 32 columns (inner >= 32), the column
 * walks of cumprod_grad staged as scan_strips stages them: two arrays per
 * tile (R rows, kStripTileBytes / 2 each), double-buffered, the next tile's loads
 * in flight while warp 0 walks. Pass 1 walks x and g down the rows: below
 * the first zero z, p *= x_j, gx_j = g_j p; from z on, q and the sum for
 * gx_z, zeros after it. Pass 2 walks gx and x up from the block's largest z:
 * acc += gx_j, gx_j = acc / x_j for j < z. Per column the operations and
 * their order are cumprod_grad's: the same bits. */
template <typename A>
struct GradStrip {
  /* half scan_strips' tile per array: the same 32 KiB in flight and 64 KiB of shared memory */
  static constexpr int R = kStripTileBytes / 2 / (kStripCols * (int)sizeof(A)), E = R / kStripWarps;
  A (*buf)[2][R][kStripCols];   /* [buffer][array][row][col] */
  int64_t base, inner;
  int lane, warp;
  bool active;

  /* f(j, a_j, b_j) in warp 0 for rows j of [0, n) in order (up: n - 1 .. 0). Ends with a barrier. */
  template <typename F>
  __device__ __forceinline__ void walk(const A *a, const A *b, int64_t n, bool up, F f) {
    const int64_t ntiles = (n + R - 1) / R;
    A ra[E], rb[E];
#pragma unroll
    for (int e = 0; e < E; e++) { ra[e] = 0; rb[e] = 0; }
    auto load = [&](int64_t t) {
#pragma unroll
      for (int e = 0; e < E; e++) {
        const int64_t k = t * R + warp + e * kStripWarps, j = up ? n - 1 - k : k;
        if (active && k < n) { ra[e] = a[base + j * inner]; rb[e] = b[base + j * inner]; }
      }
    };
    auto stash = [&](int q) {
#pragma unroll
      for (int e = 0; e < E; e++) {
        buf[q][0][warp + e * kStripWarps][lane] = ra[e];
        buf[q][1][warp + e * kStripWarps][lane] = rb[e];
      }
    };
    if (ntiles > 0) { load(0); stash(0); }
    __syncthreads();
    for (int64_t t = 0; t < ntiles; t++) {
      if (t + 1 < ntiles) load(t + 1);
      if (warp == 0 && active) {
        const int rows = (int)(n - t * R < R ? n - t * R : R);
        for (int r = 0; r < rows; r++) {
          const int64_t k = t * R + r;
          f(up ? n - 1 - k : k, buf[t & 1][0][r][lane], buf[t & 1][1][r][lane]);
        }
      }
      if (t + 1 < ntiles) stash((t + 1) & 1);
      __syncthreads();
    }
  }
};

template <typename A>
__global__ void __launch_bounds__(kStripThreads) cumprod_grad_strips(const A *x, const A *g, A *gx, int64_t L,
                                                                     int64_t inner, int64_t strips) {
  extern __shared__ __align__(16) unsigned char strip_raw[];
  __shared__ int64_t zmax_sh;
  GradStrip<A> s;
  s.buf = reinterpret_cast<A(*)[2][GradStrip<A>::R][kStripCols]>(strip_raw);
  s.lane = threadIdx.x & 31;
  s.warp = threadIdx.x >> 5;
  s.inner = inner;
  const int64_t o = blockIdx.x / strips, col = (blockIdx.x % strips) * kStripCols + s.lane;
  s.active = col < inner;
  s.base = o * L * inner + col;
  int64_t z = L;
  A p = 1, q = 0, sum = 0;
  s.walk(x, g, L, false, [&](int64_t j, A xj, A gj) {
    if (z == L && xj == (A)0) { z = j; q = p; sum += gj * q; return; }
    if (z == L) { p *= xj; gx[s.base + j * inner] = gj * p; return; }
    q *= xj;
    gx[s.base + j * inner] = 0;
    sum += gj * q;
  });
  if (s.warp == 0) {
    if (s.active && z < L) gx[s.base + z * inner] = sum;
    int64_t zm = s.active ? z : 0;
    for (int off = 16; off > 0; off >>= 1) {
      const int64_t other = __shfl_xor_sync(0xffffffffu, zm, off);
      zm = other > zm ? other : zm;
    }
    if (s.lane == 0) zmax_sh = zm;
  }
  __syncthreads();   /* zmax, and pass 1's gx rows visible to the warps that stage them */
  A acc = 0;
  s.walk(gx, x, zmax_sh, true, [&](int64_t j, A gj, A xj) {
    if (j < z) { acc += gj; gx[s.base + j * inner] = acc / xj; }
  });
}

}  // namespace

extern "C" int em_scan_cuda(const char *op, const em_tensor *a, int64_t outer, int64_t L, int64_t inner, bool prod,
                            bool reverse, em_tensor *res) {
  if (outer * L * inner == 0) return 0;
  if (!em_is_contiguous(a) || !em_is_contiguous(res) || a->dtype != res->dtype)
    return em_error("%s: internal error: scan operands must be contiguous of one dtype", op);
  const int dev = a->device.index;
  if (em_use_device(dev, op)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  switch (a->dtype) {
    case EM_F32: return scan_typed<float>(op, a, outer, L, inner, prod, reverse, res, s);
    case EM_F64: return scan_typed<double>(op, a, outer, L, inner, prod, reverse, res, s);
    case EM_I64: return scan_typed<long long>(op, a, outer, L, inner, prod, reverse, res, s);
    case EM_BF16: return scan_typed<__nv_bfloat16, float>(op, a, outer, L, inner, prod, reverse, res, s);
    case EM_F16: return scan_typed<__half, float>(op, a, outer, L, inner, prod, reverse, res, s);
    default: return em_error("%s: internal error: no scan for %s", op, em_dtype_name(a->dtype));
  }
}

extern "C" int em_cumprod_backward_cuda(const char *op, const em_tensor *x, const em_tensor *g, int64_t outer, int64_t L,
                                        int64_t inner, em_tensor *gx) {
  if (outer * L * inner == 0) return 0;
  const int dev = x->device.index;
  if (em_use_device(dev, op)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  if (inner >= kStripCols) {
    const int64_t strips = (inner + kStripCols - 1) / kStripCols;
    if (outer * strips > INT32_MAX)
      return em_error("%s: CUDA scans at most 2^31 - 1 column strips, got %lld", op, (long long)(outer * strips));
    const unsigned grid = (unsigned)(outer * strips);
    const int smem = kStripSmem;   /* two arrays of half tiles, double-buffered */
    if (x->dtype == EM_F64) {
      if (em_cuda_check(cudaFuncSetAttribute(cumprod_grad_strips<double>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             smem), op, "cudaFuncSetAttribute"))
        return -1;
      cumprod_grad_strips<double><<<grid, kStripThreads, smem, s>>>(
          (const double *)em_data_ptr(x), (const double *)em_data_ptr(g), (double *)em_data_ptr(gx), L, inner, strips);
    } else {
      if (em_cuda_check(cudaFuncSetAttribute(cumprod_grad_strips<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             smem), op, "cudaFuncSetAttribute"))
        return -1;
      cumprod_grad_strips<float><<<grid, kStripThreads, smem, s>>>(
          (const float *)em_data_ptr(x), (const float *)em_data_ptr(g), (float *)em_data_ptr(gx), L, inner, strips);
    }
    return em_launch_check(op);
  }
  unsigned grid = em_grid(outer * inner, kBlock);
  if (x->dtype == EM_F64)
    cumprod_grad<double><<<grid, kBlock, 0, s>>>((const double *)em_data_ptr(x), (const double *)em_data_ptr(g),
                                                 (double *)em_data_ptr(gx), outer, L, inner);
  else
    cumprod_grad<float><<<grid, kBlock, 0, s>>>((const float *)em_data_ptr(x), (const float *)em_data_ptr(g),
                                                (float *)em_data_ptr(gx), outer, L, inner);
  return em_launch_check(op);
}
