/* Stream compactions on CUDA: masked_select (and its backward) and nonzero,
 * the device half of their branch in engine/ops/indexing.c.
 *
 * Cost: no FLOPs; the floor is one read of the mask (or x for nonzero), one
 * read of x (masked_select) and one write of the survivors. Three launches,
 * tiles of kTile = 4096 elements (one block of 256 threads each):
 *  1. mark: read the mask once with 16-byte loads, write one bit per element
 *     (u32 words, word w = elements [32 w, 32 w + 32)) and each tile's count.
 *     A 1/8-byte-per-element bitmap instead of the mask again in step 3: for
 *     a bool mask the second read costs 1/8 of the first.
 *  2. scan: one block turns the tile counts into exclusive offsets in tile
 *     order (integers: deterministic), and writes the total, which the engine
 *     reads on the host (the output's size; PyTorch's nonzero does the same).
 *  3. select / coords / expand: each tile reads its 128 words into shared
 *     memory, ranks its survivors (word prefix + popcount), stages them in
 *     shared memory in element order, and writes them out as one contiguous,
 *     coalesced run at its offset. x is read with 16-byte loads, striped over
 *     the block (coalesced); only the staging is per element.
 * Bytes for masked_select of n elements of size s, half selected: mask n +
 * bits n/4 (written, read) + x s n + out s n/2; nonzero: x + bits + 8 ndim
 * per survivor. Misaligned pointers and the last partial tile take a scalar
 * path with the same layout (ballot per 32 elements).
 *
 * Eleventh session (EMBER_*=0 selects what was there before): step 1 and 2 are one launch, mark_lb_kernel
 * (a decoupled look-back over blocks finds each tile's offset; EMBER_COMPACT_LOOKBACK); step 3's runs are
 * stored as 16-byte vectors, 2 tiles a block for 2-byte x (EMBER_COMPACT_VOUT). EMBER_COMPACT_ONEPASS=1 (off
 * by default) runs masked_select as select1_kernel alone, into an output of the worst-case size.
 *
 * (The twelfth session's counting mark with a one-block tile scan launched after the host's read, opt-in as
 * EMBER_COMPACT_LATESCAN=1, measured slower than the look-back mark on the H200 and was deleted once the ticket
 * mark below replaced both; docs/perf.md, thirteenth session.)
 *
 * Thirteenth session (the default; EMBER_COMPACT_TICKET=0 selects the look-back mark above): steps 1 and 2 are mark_tk_kernel, a
 * warp a tile over a persistent grid, no block waiting on another; its last block (by ticket) stores the count into
 * a slot of pinned host memory mapped into the device, which the host spins on (EMBER_COMPACT_MAPPED=0: the count
 * copied to the host as before), then scans the tile counts into offsets while the host allocates the output.
 * (A persistent select for 2-byte x, loading the next tiles while it wrote one, measured slower than select_kernel
 * on the H200 — 79.3 against 57.7 us at (8192, 8192) bf16 — and was deleted; docs/perf.md, thirteenth session.)
 *
 * EMBER_COMPACT=scan (read by the engine) selects the previous path, kept
 * below: i64 flags + a CUB scan for masked_select, a CUB reduction +
 * cub::DeviceSelect for nonzero. */
#include <atomic>
#include <chrono>
#include <mutex>
#include <cub/cub.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>
#include "common.cuh"
#include "dtype_io.cuh"
#include "backend.h"
#include "runtime.h"

#define THREADS 256

namespace {

constexpr int kThreads = 256, kTile = 4096, kWords = kTile / 32, kPer = kTile / kThreads;

/* The workspace: ntiles x kWords u32 words, then ntiles + 1 i64 offsets, then (256-aligned) one u64 look-back
 * status a block of mark_lb_kernel (at most ntiles blocks). */
int64_t ntiles_of(int64_t n) { return (n + kTile - 1) / kTile; }
size_t words_bytes(int64_t n) { return ((size_t)ntiles_of(n) * kWords * 4 + 255) & ~(size_t)255; }
size_t offs_bytes(int64_t n) { return ((size_t)(ntiles_of(n) + 1) * sizeof(int64_t) + 255) & ~(size_t)255; }

/* The start the mark and select entry points share: the device made current, its stream in *s, n's tile
 * count in *nt. Returns 1 when n is 0 (count set to 0 on the stream: nothing else to do), -1 on an error (set),
 * 0 to go on. */
int compact_begin(const char *op, int dev, int64_t n, em_tensor *count, cudaStream_t *s, int64_t *nt) {
  if (em_use_device(dev, op)) return -1;
  *s = em_cur_stream(dev);
  if (n == 0) return em_cuda_check(cudaMemsetAsync(em_data_ptr(count), 0, sizeof(int64_t), *s), op, "cudaMemsetAsync") ? -1 : 1;
  *nt = ntiles_of(n);
  if (*nt > INT32_MAX) return em_error("%s: CUDA compaction takes at most 2^31 - 1 tiles, got %lld", op, (long long)*nt);
  return 0;
}

/* Raw element bits U nonzero; floats ignore the sign bit (-0.0 is zero, NaN is not). */
template <typename U> __device__ __forceinline__ bool raw_nonzero(U v, U keep) { return (v & keep) != 0; }

template <typename U>
__global__ void __launch_bounds__(kThreads) mark_kernel(const U *__restrict__ x, int64_t n, U keep, bool vec,
                                                        uint32_t *__restrict__ words, int64_t *__restrict__ tcount) {
  constexpr int V = 16 / sizeof(U), G = 32 / V, S = kTile / V / kThreads;   /* elems/vector, lanes/word, vectors/thread */
  typedef cub::BlockReduce<int, kThreads> Reduce;
  __shared__ typename Reduce::TempStorage red;
  const int t = threadIdx.x, lane = t & 31;
  const int64_t base = (int64_t)blockIdx.x * kTile;
  uint32_t *w = words + (int64_t)blockIdx.x * kWords;
  int c = 0;
  if (vec && base + kTile <= n) {
#pragma unroll
    for (int j = 0; j < S; j++) {
      const int q = j * kThreads + t;   /* vector q of the tile: elements [q V, q V + V) */
      const Packed128<U> v = load128(x + base + (int64_t)q * V);
      uint32_t bits = 0;
#pragma unroll
      for (int k = 0; k < V; k++) bits |= raw_nonzero(v[k], keep) ? 1u << k : 0u;
      c += __popc(bits);
      bits <<= (lane % G) * V;
#pragma unroll
      for (int off = 1; off < G; off <<= 1) bits |= __shfl_xor_sync(0xffffffffu, bits, off);
      if (lane % G == 0) w[q * V / 32] = bits;
    }
  } else {   /* last partial tile or misaligned x: one element per lane, a ballot per 32 */
#pragma unroll 4
    for (int j = 0; j < kPer; j++) {
      const int e = j * kThreads + t;
      const bool b = base + e < n && raw_nonzero(x[base + e], keep);
      const uint32_t bits = __ballot_sync(0xffffffffu, b);
      c += b;
      if (lane == 0) w[e / 32] = bits;
    }
  }
  const int total = Reduce(red).Sum(c);
  if (t == 0) tcount[blockIdx.x] = total;
}

/* tile counts -> exclusive offsets in tile order; off[ntiles] = *count = the total. */
constexpr int kScanThreads = 512;
__global__ void __launch_bounds__(kScanThreads) scan_tiles(int64_t *off, int64_t ntiles, int64_t *count) {
  typedef cub::BlockScan<int64_t, kScanThreads> Scan;
  __shared__ typename Scan::TempStorage tmp;
  const int64_t per = (ntiles + kScanThreads - 1) / kScanThreads;
  const int64_t b = threadIdx.x * per, e = b + per < ntiles ? b + per : ntiles;
  int64_t sum = 0;
  for (int64_t i = b; i < e; i++) sum += off[i];
  int64_t run, total;
  Scan(tmp).ExclusiveSum(sum, run, total);
  for (int64_t i = b; i < e; i++) { const int64_t c = off[i]; off[i] = run; run += c; }
  if (threadIdx.x == 0) { off[ntiles] = total; *count = total; }
}

/* mark with the tile scan folded in (EMBER_COMPACT_LOOKBACK=1, the default): what mark_kernel + scan_tiles
 * compute (the same words, off[t] = the exclusive count before tile t, off[ntiles] = *count = the total) in
 * one launch. A block takes BT tiles (BT x 4096 x sizeof(U) = 16 KB of x for 1- and 2-byte U: mark_kernel's
 * one 16-byte load a thread of a bool mask left 4 KB a block in flight), all its loads issued first, then
 * finds the count before it by a decoupled look-back over the blocks before it: each block publishes its
 * count (AGG) at once and its inclusive prefix (INC) when it has it, in one u64 status word (flag in the top
 * 2 bits); warp 0 reads the 32 statuses before it, waits until none is empty, sums back to the nearest INC,
 * and moves 32 further back while there is none. Counts are integers: any order of adds gives the same
 * offsets (deterministic, unlike a float scan). Blocks only wait on lower block indices, which the hardware
 * starts first (as CUB's single-pass scan assumes); the statuses are zeroed by a memset before the launch. */
constexpr unsigned long long kAgg = 1ull << 62, kInc = 2ull << 62, kValue = (1ull << 62) - 1;
__device__ __forceinline__ unsigned long long ld_status(const unsigned long long *p) {
  return *(const volatile unsigned long long *)p;
}
__device__ __forceinline__ long long warp_sum64(long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
/* Warp 0 of block blockIdx.x, whose count is agg: publish it, find the count of the blocks before (returned on
 * every lane), publish the inclusive prefix. */
__device__ __forceinline__ long long look_back(unsigned long long *status, long long agg) {
  const int lane = threadIdx.x & 31;
  long long excl = 0;
  if (blockIdx.x == 0) {
    if (lane == 0) *(volatile unsigned long long *)&status[0] = kInc | (unsigned long long)agg;
    return 0;
  }
  if (lane == 0) *(volatile unsigned long long *)&status[blockIdx.x] = kAgg | (unsigned long long)agg;
  for (int64_t pos = (int64_t)blockIdx.x - 1;; pos -= 32) {
    const int64_t i = pos - lane;
    unsigned long long st = i >= 0 ? ld_status(status + i) : kInc;   /* before block 0: an INC of 0 */
    while (__any_sync(0xffffffffu, st == 0))
      if (st == 0) st = ld_status(status + i);
    const unsigned incs = __ballot_sync(0xffffffffu, (st >> 62) == 2);
    long long val = (long long)(st & kValue);
    if (incs) {
      if (lane > __ffs(incs) - 1) val = 0;   /* up to and including the nearest INC */
      excl += warp_sum64(val);
      break;
    }
    excl += warp_sum64(val);
  }
  if (lane == 0) *(volatile unsigned long long *)&status[blockIdx.x] = kInc | (unsigned long long)(excl + agg);
  return excl;
}

/* The front half both BT-tile marks share: block blockIdx.x's tiles [tile0, tile0 + BT) marked into words, all
 * its loads issued first; wsum[w][b] = warp w's count of tile b (after a __syncthreads). */
template <typename U, int BT>
__device__ __forceinline__ void mark_block(const U *__restrict__ x, int64_t n, U keep, bool vec,
                                           uint32_t *__restrict__ words, int64_t ntiles, int (&wsum)[kThreads / 32][BT]) {
  constexpr int V = 16 / sizeof(U), G = 32 / V, S = kTile / V / kThreads;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t tile0 = (int64_t)blockIdx.x * BT;
  int c[BT];
  if (vec && (tile0 + BT) * kTile <= n) {
    Packed128<U> v[BT][S];
#pragma unroll
    for (int b = 0; b < BT; b++)
#pragma unroll
      for (int j = 0; j < S; j++) v[b][j] = load128(x + (tile0 + b) * kTile + (int64_t)(j * kThreads + t) * V);
#pragma unroll
    for (int b = 0; b < BT; b++) {
      uint32_t *w = words + (tile0 + b) * kWords;
      c[b] = 0;
#pragma unroll
      for (int j = 0; j < S; j++) {
        const int q = j * kThreads + t;
        uint32_t bits = 0;
#pragma unroll
        for (int k = 0; k < V; k++) bits |= raw_nonzero(v[b][j][k], keep) ? 1u << k : 0u;
        c[b] += __popc(bits);
        bits <<= (lane % G) * V;
#pragma unroll
        for (int o = 1; o < G; o <<= 1) bits |= __shfl_xor_sync(0xffffffffu, bits, o);
        if (lane % G == 0) w[q * V / 32] = bits;
      }
    }
  } else {   /* a partial tile in the block or misaligned x: one element per lane, a ballot per 32 */
#pragma unroll
    for (int b = 0; b < BT; b++) {
      c[b] = 0;
      const int64_t tile = tile0 + b, base = tile * kTile;
      if (tile >= ntiles) continue;   /* block-uniform */
      uint32_t *w = words + tile * kWords;
#pragma unroll 4
      for (int j = 0; j < kPer; j++) {
        const int e = j * kThreads + t;
        const bool bit = base + e < n && raw_nonzero(x[base + e], keep);
        const uint32_t bits = __ballot_sync(0xffffffffu, bit);
        c[b] += bit;
        if (lane == 0) w[e / 32] = bits;
      }
    }
  }
#pragma unroll
  for (int b = 0; b < BT; b++) {
    const int r = __reduce_add_sync(0xffffffffu, c[b]);
    if (lane == 0) wsum[warp][b] = r;
  }
  __syncthreads();
}

template <typename U, int BT>
__global__ void __launch_bounds__(kThreads, 8) mark_lb_kernel(const U *__restrict__ x, int64_t n, U keep, bool vec,
                                                           uint32_t *__restrict__ words, int64_t *__restrict__ off,
                                                           unsigned long long *status, int64_t ntiles,
                                                           int64_t *__restrict__ count) {
  __shared__ int wsum[kThreads / 32][BT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t tile0 = (int64_t)blockIdx.x * BT;
  mark_block<U, BT>(x, n, keep, vec, words, ntiles, wsum);
  if (warp) return;
  int tc = 0;   /* lane b < BT: tile tile0 + b's count */
  if (lane < BT)
#pragma unroll
    for (int w = 0; w < kThreads / 32; w++) tc += wsum[w][lane];
  int inc = tc;   /* inclusive prefix over the block's tiles */
#pragma unroll
  for (int o = 1; o < BT; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  const long long agg = __shfl_sync(0xffffffffu, inc, BT - 1);
  const long long excl = look_back(status, agg);
  if (lane < BT && tile0 + lane < ntiles) off[tile0 + lane] = excl + inc - tc;
  if (lane == 0 && blockIdx.x == gridDim.x - 1) { off[ntiles] = excl + agg; *count = excl + agg; }
}

/* The thirteenth session's mark (EMBER_COMPACT_TICKET=1, the default): the same words and
 * offsets as mark_lb_kernel, in one launch, with no block waiting on another while the mask streams in.
 * - A warp takes whole tiles (tile = its warp index + k x the grid's warps): 8 16-byte loads a lane in flight (4 KB
 *   a warp, 128 KB an SM at 32 warps), the tile's count by one warp reduction: no __syncthreads a tile, no block
 *   exits and relaunches every 16 KB (the twelfth session's counting mark, 4096 blocks of 16 KB, measured 32 us
 *   for 64 MB, 2.1 TB/s: its blocks alternated between waiting for loads and computing, with ~4 instructions a byte of bool mask).
 * - A bool mask's 16 bytes become 16 bits in ~23 instructions (nz4: a byte's nonzero into its bit 7, four bits
 *   gathered by one multiply) instead of ~60.
 * - Counts: off[tile] = the tile's count; each block adds its total to acc[0] (one 64-bit atomic: integers, any
 *   order), then takes a ticket (acc[1]). The last block writes the total (into *count, off[ntiles] and, when
 *   host is not NULL, pinned mapped host memory the engine spins on) and then turns the counts into exclusive
 *   offsets in place (scan_counts): the host allocates the output while it runs. acc is zero at the launch (a
 *   memset of the workspace's, or a mapped slot's kept pair, which the last block zeroes again).
 * The grid is persistent (4 blocks an SM, the rounds balanced over the warps). */
__device__ __forceinline__ uint32_t nz4(uint32_t x) {   /* bit k = byte k of x is nonzero */
  const uint32_t m = (((x & 0x7f7f7f7fu) + 0x7f7f7f7fu) | x) & 0x80808080u;   /* bits 7, 15, 23, 31 */
  return (m * 0x00204081u) >> 28;   /* the four bits land on 28..31, no two partial products overlap */
}
/* bit k = element k of the 16 bytes q is nonzero (under keep); bytes stay in their words (a byte array made the
 * compiler unpack and repack them) */
template <typename U> __device__ __forceinline__ uint32_t nz_bits(const uint4 &q, U keep) {
  if constexpr (sizeof(U) == 1) {
    return nz4(q.x) | nz4(q.y) << 4 | nz4(q.z) << 8 | nz4(q.w) << 12;
  } else {
    constexpr int V = 16 / sizeof(U);
    Packed128<U> v;
    memcpy(&v, &q, 16);
    uint32_t bits = 0;
#pragma unroll
    for (int k = 0; k < V; k++) bits |= raw_nonzero(v[k], keep) ? 1u << k : 0u;
    return bits;
  }
}

/* off[0, ntiles): counts -> exclusive offsets, by one block of kThreads (the last of mark_tk_kernel): rounds of
 * 16 x kThreads counts, count j t of a round at r0 + j kThreads + t (coalesced loads, all 16 issued at once);
 * 16 independent warp scans (int: a round holds at most 4096 x 4096 survivors), the 128 warp sums scanned by
 * warp 0, then the stores. Integer sums: the offsets of any other scan. 16384 tiles: 4 rounds, ~1 us each. */
constexpr int kScanJ = 16;
__device__ void scan_counts(int64_t *off, int64_t ntiles) {
  __shared__ long long part[kScanJ * (kThreads / 32) + 1];   /* (j, warp) sums, then their exclusive prefix */
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  constexpr int kW = kThreads / 32, kPart = kScanJ * kW;
  long long carry = 0;
  for (int64_t r0 = 0; r0 < ntiles; r0 += kScanJ * kThreads) {
    int inc[kScanJ];
#pragma unroll
    for (int j = 0; j < kScanJ; j++) {
      const int64_t i = r0 + j * kThreads + t;
      inc[j] = i < ntiles ? (int)__ldcg(off + i) : 0;   /* L2: other blocks wrote them */
    }
#pragma unroll
    for (int j = 0; j < kScanJ; j++) {
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, inc[j], o);
        if (lane >= o) inc[j] += y;
      }
      if (lane == 31) part[j * kW + warp] = inc[j];
      const int y = __shfl_up_sync(0xffffffffu, inc[j], 1);   /* inclusive -> exclusive: the counts need no register */
      inc[j] = lane ? y : 0;
    }
    __syncthreads();
    if (warp == 0) {   /* kPart = 128 sums in (j, warp) order: 4 consecutive a lane */
      constexpr int P = kPart / 32;
      long long a[P], s = 0;
#pragma unroll
      for (int k = 0; k < P; k++) { a[k] = part[lane * P + k]; s += a[k]; }
      long long e = s;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const long long y = __shfl_up_sync(0xffffffffu, e, o);
        if (lane >= o) e += y;
      }
      e -= s;   /* exclusive */
#pragma unroll
      for (int k = 0; k < P; k++) { part[lane * P + k] = carry + e; e += a[k]; }
      if (lane == 31) part[kPart] = carry + e;   /* the next round's carry */
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kScanJ; j++) {
      const int64_t i = r0 + j * kThreads + t;
      if (i < ntiles) off[i] = part[j * kW + warp] + inc[j];
    }
    carry = part[kPart];
    __syncthreads();   /* part is rewritten by the next round */
  }
}

constexpr int kTkBlocks = 4;   /* blocks an SM: 64 registers a thread */
template <typename U>
__global__ void __launch_bounds__(kThreads, kTkBlocks)
    mark_tk_kernel(const U *__restrict__ x, int64_t n, U keep, bool vec, uint32_t *__restrict__ words,
                   int64_t *__restrict__ off, int64_t ntiles, unsigned long long *acc, int64_t *__restrict__ count,
                   long long *host) {
  constexpr int V = 16 / sizeof(U), G = 32 / V, L = 8;   /* elems/vector, lanes/word, loads a lane a step */
  constexpr int STEP = 32 * V * L, NS = kTile / STEP;    /* a warp step: 4 KB of x; sizeof(U) steps a tile */
  __shared__ unsigned long long btot[kThreads / 32];
  __shared__ bool last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t W = (int64_t)gridDim.x * (kThreads / 32);
  unsigned long long mine = 0;
  for (int64_t tile = (int64_t)blockIdx.x * (kThreads / 32) + warp; tile < ntiles; tile += W) {
    const int64_t base = tile * kTile;
    uint32_t *w = words + tile * kWords;
    int c = 0;
    if (vec && base + kTile <= n) {
#pragma unroll 1
      for (int s = 0; s < NS; s++) {
        uint4 v[L];
#pragma unroll
        for (int j = 0; j < L; j++) v[j] = *reinterpret_cast<const uint4 *>(x + base + s * STEP + (j * 32 + lane) * V);
#pragma unroll
        for (int j = 0; j < L; j++) {
          uint32_t bits = nz_bits(v[j], keep);
          c += __popc(bits);
          bits <<= (lane % G) * V;
#pragma unroll
          for (int o = 1; o < G; o <<= 1) bits |= __shfl_xor_sync(0xffffffffu, bits, o);
          if (lane % G == 0) w[(s * STEP + (j * 32 + lane) * V) / 32] = bits;
        }
      }
    } else {   /* the last partial tile or misaligned x: one element a lane, a ballot per 32 */
#pragma unroll 4
      for (int e = lane; e < kTile; e += 32) {
        const bool b = base + e < n && raw_nonzero(x[base + e], keep);
        const uint32_t bits = __ballot_sync(0xffffffffu, b);
        c += b;
        if (lane == 0) w[e / 32] = bits;
      }
    }
    c = __reduce_add_sync(0xffffffffu, c);
    if (lane == 0) off[tile] = c;
    mine += (unsigned)c;
  }
  if (lane == 0) btot[warp] = mine;
  __threadfence();   /* this warp's off[] stores are seen before the ticket */
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long b = 0;
#pragma unroll
    for (int i = 0; i < kThreads / 32; i++) b += btot[i];
    if (b) atomicAdd(&acc[0], b);
    __threadfence();   /* the total's add before the ticket's */
    last = atomicAdd(&acc[1], 1ull) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) {
    const long long total = (long long)atomicExch(&acc[0], 0ull);
    atomicExch(&acc[1], 0ull);   /* a kept acc (a mapped slot's) is zero again for the slot's next mark */
    if (host) {   /* first: the host allocates the output while the scan below runs */
      __threadfence_system();    /* the zeros before the count: the host frees the slot when it sees the count */
      *(volatile long long *)host = total;
      __threadfence_system();
    }
    *count = total;
    off[ntiles] = total;
  }
  scan_counts(off, ntiles);
}

/* A tile's words and their exclusive popcount prefix, in shared memory; returns the tile's survivors. */
struct TileRanks {
  uint32_t w[kWords];
  int pre[kWords];
};
__device__ __forceinline__ int load_ranks(TileRanks &r, const uint32_t *words, const int64_t *off) {
  typedef cub::BlockScan<int, kThreads> Scan;
  __shared__ typename Scan::TempStorage tmp;
  const int t = threadIdx.x;
  const uint32_t wd = t < kWords ? words[(int64_t)blockIdx.x * kWords + t] : 0u;
  int p;
  Scan(tmp).ExclusiveSum(__popc(wd), p);
  if (t < kWords) { r.w[t] = wd; r.pre[t] = p; }
  __syncthreads();
  return (int)(off[blockIdx.x + 1] - off[blockIdx.x]);
}
/* rank among the tile's survivors of tile element e (set or not) */
__device__ __forceinline__ int rank_of(const TileRanks &r, int e) {
  return r.pre[e >> 5] + __popc(r.w[e >> 5] & ((1u << (e & 31)) - 1u));
}

/* With vout (EMBER_COMPACT_VOUT=1, the default) the survivors are staged h elements in, h = how far the run's
 * start lies past a 16-byte boundary of out, and written as 16-byte vectors of the stage (a warp stores 512
 * contiguous bytes; the scalar loop stored 64 bytes a warp instruction for bf16), the run's partial first and
 * last vectors element by element. */
template <typename U>
__device__ __forceinline__ void store_run(const U *stage_buf, int h, int cnt, U *o, bool vout) {
  constexpr int V = 16 / sizeof(U);
  const int t = threadIdx.x;
  if (!vout) {
    for (int k = t; k < cnt; k += kThreads) o[k] = stage_buf[k];
    return;
  }
  U *oa = o - h;   /* 16-byte aligned; stage_buf[i] goes to oa[i], for i in [h, h + cnt) */
  const int end = h + cnt, nv = (end + V - 1) / V;
  for (int q = t; q < nv; q += kThreads) {
    const int i0 = q * V;
    if (i0 >= h && i0 + V <= end) {
      store128(oa + i0, *reinterpret_cast<const Packed128<U> *>(stage_buf + i0));
    } else {
      for (int i = i0 > h ? i0 : h; i < i0 + V && i < end; i++) oa[i] = stage_buf[i];
    }
  }
}

/* blocks an SM: 2-byte 6 at 40 registers with 2 tiles a block (16 KB of x in flight; 8 KB at 8 blocks with 1);
 * 4-byte 6 at 40 (46 unbounded: 5); 8-byte by its 35 KB stage; 1-byte 6 (32 registers spilled) */
template <typename U, int BT = 1> constexpr int select_blocks() {
  return sizeof(U) == 8 ? 4 : sizeof(U) == 2 && BT == 1 ? 8 : 6;
}
/* tiles a block of select_kernel (EMBER_COMPACT_VOUT=1): 2 for 2-byte x, whose tile is 8 KB (1-byte x spilled) */
template <typename U> constexpr int select_tiles() { return sizeof(U) == 2 ? 2 : 1; }
/* masked_select: out[off + rank] = x[e] for each marked e, staged in order then written as one run.
 * BT tiles a block: every tile's x loads first (EMBER_COMPACT_EARLY=0: each tile's after its ranks), and every
 * tile's words (thread t: word t % 128 of tile t / 128); then per tile a block scan of the words' popcounts,
 * the staging and the run's stores. */
template <typename U, int BT>
__global__ void __launch_bounds__(kThreads, (select_blocks<U, BT>()))
    select_kernel(const uint32_t *__restrict__ words, const int64_t *__restrict__ off, const U *__restrict__ x,
                  int64_t n, int64_t ntiles, bool vec, bool early, bool vout, U *__restrict__ out) {
  static_assert(BT * kWords <= kThreads, "a word a thread");
  constexpr int V = 16 / sizeof(U), S = kTile / V / kThreads;
  typedef cub::BlockScan<int, kThreads> Scan;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ TileRanks r;
  __shared__ __align__(16) U stage_buf[kTile + V];
  const int t = threadIdx.x;
  const int64_t tile0 = (int64_t)blockIdx.x * BT;
  /* x's loads first: they do not need the ranks, so their DRAM latency overlaps the words' load and the scan */
  Packed128<U> xv[BT][S];
  if (early)
#pragma unroll
    for (int b = 0; b < BT; b++) {
      const int64_t base = (tile0 + b) * kTile;
      if (vec && base + kTile <= n)
#pragma unroll
        for (int j = 0; j < S; j++) xv[b][j] = load128(x + base + (j * kThreads + t) * V);
    }
  const int64_t wt = tile0 + t / kWords;
  const uint32_t wd = t < BT * kWords && wt < ntiles ? words[wt * kWords + t % kWords] : 0u;
#pragma unroll
  for (int b = 0; b < BT; b++) {
    const int64_t tile = tile0 + b, base = tile * kTile;
    if (tile >= ntiles) break;   /* block-uniform */
    if (b) __syncthreads();      /* the last tile's stores have read the stage and the ranks */
    int p;
    Scan(tmp).ExclusiveSum(t / kWords == b ? __popc(wd) : 0, p);
    if (t / kWords == b) { r.w[t % kWords] = wd; r.pre[t % kWords] = p; }
    __syncthreads();
    const int cnt = (int)(off[tile + 1] - off[tile]);
    U *o = out + off[tile];
    const int h = vout ? (int)(((uintptr_t)o / sizeof(U)) % V) : 0;
    U *stage = stage_buf + h;
    if (vec && base + kTile <= n) {
#pragma unroll
      for (int j = 0; j < S; j++) {
        const int e0 = (j * kThreads + t) * V;   /* V elements, all in word e0 / 32 */
        const Packed128<U> v = early ? xv[b][j] : load128(x + base + e0);
        const uint32_t bits = r.w[e0 >> 5] >> (e0 & 31);
        int k = rank_of(r, e0);
#pragma unroll
        for (int i = 0; i < V; i++)
          if (bits >> i & 1u) stage[k++] = v[i];
      }
    } else {
      for (int e = t; e < kTile && base + e < n; e += kThreads)
        if (r.w[e >> 5] >> (e & 31) & 1u) stage[rank_of(r, e)] = x[base + e];
    }
    __syncthreads();
    store_run(stage_buf, h, cnt, o, vout);
  }
}

/* masked_select in one pass (EMBER_COMPACT_ONEPASS=1; the engine's out holds n elements, the worst case, so
 * nothing waits for the count before this launch): a tile of 4096 elements a block reads its 4 KB of the bool
 * mask (16 bytes a thread) and its x (16-byte vectors, issued first), ranks the survivors in shared memory,
 * finds the survivors before it by look_back over the tiles, and writes its run at that offset as
 * select_kernel's vout path does. Bytes: mask n + x s n + out s n/2 (half selected), the floor; the bits and
 * offsets of the two-pass path and its host round trip between the passes are gone. */
template <typename U>
__global__ void __launch_bounds__(kThreads, select_blocks<U>())
    select1_kernel(const uint8_t *__restrict__ mask, const U *__restrict__ x, int64_t n, bool vec,
                   unsigned long long *status, int64_t *__restrict__ count, U *__restrict__ out) {
  constexpr int V = 16 / sizeof(U), S = kTile / V / kThreads;
  typedef cub::BlockScan<int, kThreads> Scan;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ TileRanks r;
  __shared__ __align__(16) U stage_buf[kTile + V];
  __shared__ long long s_excl;
  const int t = threadIdx.x;
  const int64_t base = (int64_t)blockIdx.x * kTile;
  const bool full = vec && base + kTile <= n;
  Packed128<U> xv[S];
  uint32_t half = 0;   /* the mask bits of elements [16 t, 16 t + 16) */
  if (full) {
    const Packed128<uint8_t> mv = load128(mask + base + 16 * t);
#pragma unroll
    for (int j = 0; j < S; j++) xv[j] = load128(x + base + (j * kThreads + t) * V);
#pragma unroll
    for (int k = 0; k < 16; k++) half |= mv[k] ? 1u << k : 0u;
  } else {
    for (int k = 0; k < 16; k++) {
      const int64_t e = base + 16 * t + k;
      if (e < n && mask[e]) half |= 1u << k;
    }
  }
  const uint32_t hi = __shfl_down_sync(0xffffffffu, half, 1);
  if (!(t & 1)) r.w[t >> 1] = half | hi << 16;
  __syncthreads();
  int p, agg;
  Scan(tmp).ExclusiveSum(t < kWords ? __popc(r.w[t]) : 0, p, agg);
  if (t < kWords) r.pre[t] = p;
  if (t < 32) {
    const long long excl = look_back(status, agg);
    if (t == 0) {
      s_excl = excl;
      if (blockIdx.x == gridDim.x - 1) *count = excl + agg;
    }
  }
  __syncthreads();
  U *o = out + s_excl;
  const int h = (int)(((uintptr_t)o / sizeof(U)) % V);
  U *stage = stage_buf + h;
  if (full) {
#pragma unroll
    for (int j = 0; j < S; j++) {
      const int e0 = (j * kThreads + t) * V;
      const uint32_t bits = r.w[e0 >> 5] >> (e0 & 31);
      int k = rank_of(r, e0);
#pragma unroll
      for (int i = 0; i < V; i++)
        if (bits >> i & 1u) stage[k++] = xv[j][i];
    }
  } else {
    for (int e = t; e < kTile && base + e < n; e += kThreads)
      if (r.w[e >> 5] >> (e & 31) & 1u) stage[rank_of(r, e)] = x[base + e];
  }
  __syncthreads();
  store_run(stage_buf, h, agg, o, true);
}

/* masked_select's backward: gx[e] = marked ? g[off + rank] : 0, 16-byte stores where aligned. */
template <typename U>
__global__ void __launch_bounds__(kThreads) expand_tiles(const uint32_t *__restrict__ words, const int64_t *__restrict__ off,
                                                         const U *__restrict__ g, int64_t n, bool vec, U *__restrict__ gx) {
  constexpr int V = 16 / sizeof(U), S = kTile / V / kThreads;
  __shared__ TileRanks r;
  load_ranks(r, words, off);
  const int t = threadIdx.x;
  const int64_t base = (int64_t)blockIdx.x * kTile;
  const U *src = g + off[blockIdx.x];
  if (vec && base + kTile <= n) {
#pragma unroll
    for (int j = 0; j < S; j++) {
      const int e0 = (j * kThreads + t) * V;
      const uint32_t bits = r.w[e0 >> 5] >> (e0 & 31);
      int k = rank_of(r, e0);
      Packed128<U> v;
#pragma unroll
      for (int i = 0; i < V; i++) v[i] = bits >> i & 1u ? src[k++] : U(0);
      store128(gx + base + e0, v);
    }
  } else {
    for (int e = t; e < kTile && base + e < n; e += kThreads)
      gx[base + e] = r.w[e >> 5] >> (e & 31) & 1u ? src[rank_of(r, e)] : U(0);
  }
}

struct Dims { int ndim; int64_t s[EM_MAX_DIMS]; uint32_t s32[EM_MAX_DIMS]; };

/* nonzero: row off + rank of out = the coordinates of marked flat index e.
 * O: the index type of the divisions (u32 when every flat index fits). */
template <typename O>
__global__ void __launch_bounds__(kThreads) coords_tiles(const uint32_t *__restrict__ words, const int64_t *__restrict__ off,
                                                         Dims d, bool pair, int64_t *__restrict__ out) {
  __shared__ TileRanks r;
  __shared__ int stage[kTile];
  const int cnt = load_ranks(r, words, off);
  const int t = threadIdx.x;
  {   /* thread t ranks the 16 elements [16 t, 16 t + 16) from half a word */
    const int wi = t >> 1, h = (t & 1) * 16;
    uint32_t bits = (r.w[wi] >> h) & 0xffffu;
    int k = r.pre[wi] + (h ? __popc(r.w[wi] & 0xffffu) : 0);
    while (bits) {
      const int b = __ffs(bits) - 1;
      stage[k++] = t * 16 + b;
      bits &= bits - 1u;
    }
  }
  __syncthreads();
  const int64_t base = (int64_t)blockIdx.x * kTile, row0 = off[blockIdx.x];
  if (pair) {   /* 2-D: a row is 16 bytes, one store (a warp writes 512 contiguous bytes) */
    const O s = sizeof(O) == 4 ? (O)d.s32[1] : (O)d.s[1];
    longlong2 *o2 = reinterpret_cast<longlong2 *>(out) + row0;
    if (s >= (O)kTile) {   /* one division a tile: base + e lies in row q0 or q0 + 1 (e < 4096 <= s) */
      const O q0 = (O)base / s, r0 = (O)base - q0 * s;
      for (int k = t; k < cnt; k += kThreads) {
        const O r = r0 + (O)stage[k], c = r >= s;
        o2[k] = make_longlong2((long long)(q0 + c), (long long)(r - c * s));
      }
      return;
    }
    for (int k = t; k < cnt; k += kThreads) {
      const O l = (O)(base + stage[k]), q = l / s;
      o2[k] = make_longlong2((long long)q, (long long)(l - q * s));
    }
    return;
  }
  for (int k = t; k < cnt; k += kThreads) {
    O l = (O)(base + stage[k]);
    int64_t *row = out + (row0 + k) * d.ndim;
#pragma unroll
    for (int i = EM_MAX_DIMS - 1; i > 0; i--) {   /* constant indices: d stays in the parameter bank */
      if (i >= d.ndim) continue;
      const O s = sizeof(O) == 4 ? (O)d.s32[i] : (O)d.s[i];
      const O q = l / s;
      row[i] = (int64_t)(l - q * s);
      l = q;
    }
    row[0] = (int64_t)l;
  }
}

/* unique: mark the first element of each run of equal neighbours in sorted
 * v (floats compared as doubles: -0 equals +0, NaN equals nothing, as
 * sort.cu's run_flags). One element per lane, a ballot per 32; the
 * predecessor's load mostly hits the cache. */
template <typename C>
__global__ void __launch_bounds__(kThreads) mark_heads(const void *v, int dt, int64_t n, uint32_t *__restrict__ words,
                                                       int64_t *__restrict__ tcount) {
  typedef cub::BlockReduce<int, kThreads> Reduce;
  __shared__ typename Reduce::TempStorage red;
  const int t = threadIdx.x, lane = t & 31;
  const int64_t base = (int64_t)blockIdx.x * kTile;
  uint32_t *w = words + (int64_t)blockIdx.x * kWords;
  int c = 0;
#pragma unroll 4
  for (int j = 0; j < kPer; j++) {
    const int e = j * kThreads + t;
    const int64_t i = base + e;
    const bool b = i < n && (i == 0 || !(load_as<C>(v, dt, i) == load_as<C>(v, dt, i - 1)));
    const uint32_t bits = __ballot_sync(0xffffffffu, b);
    c += b;
    if (lane == 0) w[e / 32] = bits;
  }
  const int total = Reduce(red).Sum(c);
  if (t == 0) tcount[blockIdx.x] = total;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

}  // namespace

extern "C" int64_t em_compact_ws_bytes(int64_t n) {   /* the status area: at least mark_tk_kernel's 2 words */
  const int64_t nt = ntiles_of(n);
  return (int64_t)(words_bytes(n) + offs_bytes(n) + (size_t)(nt > 2 ? nt : 2) * sizeof(unsigned long long));
}

static uint32_t *ws_words(const em_tensor *ws) { return (uint32_t *)em_data_ptr(ws); }
static int64_t *ws_off(const em_tensor *ws, int64_t n) { return (int64_t *)((char *)em_data_ptr(ws) + words_bytes(n)); }
static unsigned long long *ws_status(const em_tensor *ws, int64_t n) {
  return (unsigned long long *)((char *)em_data_ptr(ws) + words_bytes(n) + offs_bytes(n));
}

/* The look-back mark: BT tiles a block (16 KB of x for 1- and 2-byte elements), statuses zeroed first. */
template <typename U, int BT>
static int launch_mark_lb(const char *op, const U *x, int64_t n, U keep, bool vec, uint32_t *w, int64_t *off,
                          unsigned long long *status, int64_t *count, cudaStream_t s) {
  const int64_t nt = ntiles_of(n), nb = (nt + BT - 1) / BT;
  if (em_cuda_check(cudaMemsetAsync(status, 0, (size_t)nb * sizeof(unsigned long long), s), op, "cudaMemsetAsync"))
    return -1;
  mark_lb_kernel<U, BT><<<(unsigned)nb, kThreads, 0, s>>>(x, n, keep, vec, w, off, status, nt, count);
  return em_launch_check(op);
}

static bool ticket_on() {   /* EMBER_COMPACT_TICKET=0: the eleventh session's look-back mark */
  static const bool on = em_env_switch("EMBER_COMPACT_TICKET", true);
  return on;
}
/* mark_tk_kernel: a persistent grid of kTkBlocks blocks an SM at most, the rounds of tiles balanced over the warps
 * (16384 tiles on 132 SMs: 4096 warps of 4 tiles each); acc (total, ticket) zeroed first unless it is a mapped
 * slot's kept pair (zero); host: NULL or the device address of a mapped slot. */
template <typename U>
static int launch_mark_tk(const char *op, int dev, const U *x, int64_t n, U keep, bool vec, uint32_t *w, int64_t *off,
                          unsigned long long *acc, bool zero, int64_t *count, long long *host, cudaStream_t s) {
  const int64_t nt = ntiles_of(n), wpb = kThreads / 32, wmax = (int64_t)em_sm_count(dev) * kTkBlocks * wpb;
  const int64_t rounds = (nt + wmax - 1) / wmax, warps = (nt + rounds - 1) / rounds, nb = (warps + wpb - 1) / wpb;
  if (zero && em_cuda_check(cudaMemsetAsync(acc, 0, 2 * sizeof(unsigned long long), s), op, "cudaMemsetAsync"))
    return -1;
  mark_tk_kernel<U><<<(unsigned)nb, kThreads, 0, s>>>(x, n, keep, vec, w, off, nt, acc, count, host);
  return em_launch_check(op);
}

/* The count's read-back without a copy (EMBER_COMPACT_MAPPED=1, the default, with the ticket mark): the mark's last
 * block stores the total into a slot of pinned host memory mapped into every device's address space, and the host
 * spins on it: visible ~1-2 us after the store, where a cudaMemcpy of 8 bytes + a stream synchronize cost ~10-15 us
 * of host latency (the copy queued behind the mark, then the wake-up). 64 slots of a 64-byte line each, kept for
 * the process; a call holds one from before its launch until it has read the count, so compactions in flight on
 * other streams or threads never share one (none free: the device copy as before). The spin is bounded
 * (kSpinUs: a stream with a backlog), then the stream is synchronized, which also reports a failed kernel.
 * Each slot also has a kept (total, ticket) pair on each device, zeroed once and again by every mark's last block
 * before it stores the count: no memset launch before the mark. */
namespace {
constexpr int kSlots = 64, kSlotLongs = 8;
constexpr long long kSpinUs = 500;
struct MappedSlots {
  long long *h = nullptr, *d = nullptr;
  std::atomic<unsigned long long> busy{0};
  std::mutex mu;   /* the per-device pairs' first allocation */
  unsigned long long *acc[EM_CUDA_MAX_DEVICES] = {};
};
MappedSlots g_slots;
std::once_flag g_slots_once;

/* device dev's kSlots (total, ticket) pairs, zeroed (allocated at the first call on dev, zeroed on s and waited for
 * under the lock, so no other thread's mark sees them before; NULL if that failed) */
unsigned long long *slot_accs(int dev, cudaStream_t s) {
  if (dev < 0 || dev >= EM_CUDA_MAX_DEVICES) return nullptr;
  std::lock_guard<std::mutex> lock(g_slots.mu);
  if (!g_slots.acc[dev]) {
    void *p = nullptr;
    const size_t bytes = kSlots * 2 * sizeof(unsigned long long);
    if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemsetAsync(p, 0, bytes, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess) {
      cudaGetLastError();
      if (p) cudaFree(p);
      return nullptr;
    }
    g_slots.acc[dev] = (unsigned long long *)p;
  }
  return g_slots.acc[dev];
}

/* slot i (host and device addresses), or -1 when none is free or pinned mapped memory is not available */
int slot_acquire() {
  std::call_once(g_slots_once, [] {
    void *p = nullptr, *d = nullptr;
    if (cudaHostAlloc(&p, kSlots * kSlotLongs * sizeof(long long), cudaHostAllocMapped | cudaHostAllocPortable) !=
            cudaSuccess ||
        cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess) {
      cudaGetLastError();   /* no mapped memory here: every call takes the copy */
      if (p) cudaFreeHost(p);
      return;
    }
    g_slots.h = (long long *)p;
    g_slots.d = (long long *)d;
  });
  if (!g_slots.h) return -1;
  unsigned long long b = g_slots.busy.load();
  while (~b) {
    const int i = __builtin_ctzll(~b);
    if (g_slots.busy.compare_exchange_weak(b, b | 1ull << i)) return i;
  }
  return -1;
}
void slot_release(int i) { g_slots.busy.fetch_and(~(1ull << i)); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* *out = the count the mark stores in slot p (set to -1 before the launch) */
int slot_wait(const char *op, volatile long long *p, cudaStream_t s, int64_t *out) {
  const auto t0 = std::chrono::steady_clock::now();
  for (unsigned i = 1;; i++) {
    const long long v = *p;
    if (v >= 0) { *out = v; return 0; }
    if (i % 64 == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(kSpinUs)) break;
    cpu_relax();
  }
  if (em_cuda_check(cudaStreamSynchronize(s), op, "cudaStreamSynchronize")) return -1;
  const long long v = *p;
  if (v < 0) return em_error("%s: internal error: the mark finished without storing its count", op);
  *out = v;
  return 0;
}
}  // namespace

/* The bits of an element that make it nonzero: all of them; a float's but its sign (-0.0 is zero, NaN is not).
 * all is cast back to U before the shift: ~ promotes a narrow U to int, and -1 >> 1 keeps the sign bit. */
template <typename U> static U nonzero_bits(bool fl) {
  const U all = (U)~(U)0;
  return fl ? (U)(all >> 1) : all;
}

/* f(U{}) (an int: 0 or -1 with the error set) with U the unsigned integer of x's element size; an element size
 * without a compaction is an error naming x's dtype. */
template <typename F> static int by_elem(const char *op, const em_tensor *x, F &&f) {
  const size_t es = em_dtype_size(x->dtype);
  if (es != 1 && es != 2 && es != 4 && es != 8)
    return em_error("%s: internal error: no compaction for %s", op, em_dtype_name(x->dtype));
  int rc = 0;
  em_by_width(es, [&](auto u) { rc = f(u); });
  return rc;
}

/* The ticket mark of x (any element size) with its count read into *host_count through a mapped slot when one is
 * free and the thread is not capturing (else *host_count stays -1: the caller reads count). */
static int mark_ticket(const char *op, int dev, const em_tensor *x, int64_t n, em_tensor *ws, em_tensor *count,
                       cudaStream_t s, int64_t *host_count) {
  static const bool mapped = em_env_switch("EMBER_COMPACT_MAPPED", true);
  int slot = host_count && mapped && !em_cuda_capturing() ? slot_acquire() : -1;
  unsigned long long *kept = slot >= 0 ? slot_accs(dev, s) : nullptr;
  if (slot >= 0 && !kept) { slot_release(slot); slot = -1; }
  long long *hp = slot >= 0 ? g_slots.h + slot * kSlotLongs : nullptr;
  long long *dp = slot >= 0 ? g_slots.d + slot * kSlotLongs : nullptr;
  if (hp) *(volatile long long *)hp = -1;
  const bool fl = em_dtype_is_float(x->dtype) != 0, vec = aligned16(em_data_ptr(x));
  uint32_t *w = ws_words(ws);
  int64_t *off = ws_off(ws, n), *cnt = (int64_t *)em_data_ptr(count);
  unsigned long long *acc = kept ? kept + 2 * slot : ws_status(ws, n);
  const bool z = !kept;
  const void *xp = em_data_ptr(x);
  int rc = by_elem(op, x, [&](auto u) {
    using U = decltype(u);
    return launch_mark_tk<U>(op, dev, (const U *)xp, n, nonzero_bits<U>(fl), vec, w, off, acc, z, cnt, dp, s);
  });
  if (rc == 0 && hp) rc = slot_wait(op, hp, s, host_count);
  if (slot >= 0) slot_release(slot);
  return rc;
}

extern "C" int em_compact_mark_cuda(const char *op, const em_tensor *x, em_tensor *ws, em_tensor *count,
                                    int64_t *host_count) {
  const int64_t n = em_numel(x);
  cudaStream_t s;
  int64_t nt;
  if (host_count) *host_count = -1;
  if (const int b = compact_begin(op, x->device.index, n, count, &s, &nt)) {
    if (b > 0 && host_count) *host_count = 0;
    return b < 0 ? -1 : 0;
  }
  if (ticket_on()) return mark_ticket(op, x->device.index, x, n, ws, count, s, host_count);
  const bool fl = em_dtype_is_float(x->dtype) != 0, vec = aligned16(em_data_ptr(x));
  uint32_t *w = ws_words(ws);
  int64_t *off = ws_off(ws, n);
  const void *xp = em_data_ptr(x);
  const unsigned grid = (unsigned)nt;
  static const bool lookback = em_env_switch("EMBER_COMPACT_LOOKBACK", true);   /* 0: mark_kernel + scan_tiles */
  if (lookback) {
    unsigned long long *st = ws_status(ws, n);
    int64_t *cnt = (int64_t *)em_data_ptr(count);
    return by_elem(op, x, [&](auto u) {
      using U = decltype(u);
      constexpr int BT = sizeof(U) == 1 ? 4 : sizeof(U) == 2 ? 2 : 1;   /* tiles a block: 16 KB of x or 4 tiles */
      return launch_mark_lb<U, BT>(op, (const U *)xp, n, nonzero_bits<U>(fl), vec, w, off, st, cnt, s);
    });
  }
  if (by_elem(op, x, [&](auto u) {
        using U = decltype(u);
        mark_kernel<U><<<grid, kThreads, 0, s>>>((const U *)xp, n, nonzero_bits<U>(fl), vec, w, off);
        return 0;
      }) ||
      em_launch_check(op))
    return -1;
  scan_tiles<<<1, kScanThreads, 0, s>>>(off, nt, (int64_t *)em_data_ptr(count));
  return em_launch_check(op);
}

extern "C" int em_compact_mark_heads_cuda(const char *op, const em_tensor *sorted, em_tensor *ws, em_tensor *count) {
  const int64_t n = em_numel(sorted);
  cudaStream_t s;
  int64_t nt;
  if (const int b = compact_begin(op, sorted->device.index, n, count, &s, &nt)) return b < 0 ? -1 : 0;
  uint32_t *w = ws_words(ws);
  int64_t *off = ws_off(ws, n);
  if (em_dtype_is_float(sorted->dtype))
    mark_heads<double><<<(unsigned)nt, kThreads, 0, s>>>(em_data_ptr(sorted), sorted->dtype, n, w, off);
  else
    mark_heads<int64_t><<<(unsigned)nt, kThreads, 0, s>>>(em_data_ptr(sorted), sorted->dtype, n, w, off);
  if (em_launch_check(op)) return -1;
  scan_tiles<<<1, kScanThreads, 0, s>>>(off, nt, (int64_t *)em_data_ptr(count));
  return em_launch_check(op);
}

extern "C" int em_compact_select_cuda(const char *op, const em_tensor *ws, const em_tensor *x, em_tensor *out) {
  const int64_t n = em_numel(x);
  if (n == 0 || em_numel(out) == 0) return 0;
  cudaStream_t s = em_cur_stream(x->device.index);
  static const bool early = em_env_switch("EMBER_COMPACT_EARLY", true);
  static const bool vout = em_env_switch("EMBER_COMPACT_VOUT", true);   /* 0: one element a lane per store */
  const bool vec = aligned16(em_data_ptr(x));
  const unsigned grid = (unsigned)ntiles_of(n);
  const uint32_t *w = ws_words(ws);
  const int64_t *off = ws_off(ws, n);
  const void *xp = em_data_ptr(x);
  void *o = em_data_ptr(out);
  const int64_t nt = ntiles_of(n);
  em_by_width(em_dtype_size(x->dtype), [&](auto z) {
    using T = decltype(z);
    constexpr int BT = select_tiles<T>();
    if (vout && BT > 1)   /* EMBER_COMPACT_VOUT=0: one tile a block, as before */
      select_kernel<T, BT><<<(unsigned)((nt + BT - 1) / BT), kThreads, 0, s>>>(w, off, (const T *)xp, n, nt, vec, early,
                                                                                vout, (T *)o);
    else
      select_kernel<T, 1><<<grid, kThreads, 0, s>>>(w, off, (const T *)xp, n, nt, vec, early, vout, (T *)o);
  });
  return em_launch_check(op);
}

extern "C" int64_t em_compact_select1_ws_bytes(int64_t n) {
  return (int64_t)((size_t)ntiles_of(n) * sizeof(unsigned long long));
}

extern "C" int em_compact_select1_cuda(const char *op, const em_tensor *mask, const em_tensor *x, em_tensor *ws,
                                       em_tensor *count, em_tensor *out) {
  const int64_t n = em_numel(x);
  cudaStream_t s;
  int64_t nt;
  if (const int b = compact_begin(op, x->device.index, n, count, &s, &nt)) return b < 0 ? -1 : 0;
  unsigned long long *st = (unsigned long long *)em_data_ptr(ws);
  if (em_cuda_check(cudaMemsetAsync(st, 0, (size_t)nt * sizeof(unsigned long long), s), op, "cudaMemsetAsync"))
    return -1;
  const bool vec = aligned16(em_data_ptr(x)) && aligned16(em_data_ptr(mask));
  const uint8_t *mp = (const uint8_t *)em_data_ptr(mask);
  const void *xp = em_data_ptr(x);
  void *o = em_data_ptr(out);
  int64_t *cnt = (int64_t *)em_data_ptr(count);
  em_by_width(em_dtype_size(x->dtype), [&](auto z) {
    using T = decltype(z);
    select1_kernel<T><<<(unsigned)nt, kThreads, 0, s>>>(mp, (const T *)xp, n, vec, st, cnt, (T *)o);
  });
  return em_launch_check(op);
}

extern "C" int em_compact_expand_cuda(const char *op, const em_tensor *ws, const em_tensor *g, em_tensor *gx) {
  const int64_t n = em_numel(gx);
  if (n == 0) return 0;
  cudaStream_t s = em_cur_stream(gx->device.index);
  const bool vec = aligned16(em_data_ptr(gx));
  const unsigned grid = (unsigned)ntiles_of(n);
  const uint32_t *w = ws_words(ws);
  const int64_t *off = ws_off(ws, n);
  const void *gp = em_data_ptr(g);
  void *o = em_data_ptr(gx);
  em_by_width(em_dtype_size(gx->dtype), [&](auto z) {
    using T = decltype(z);
    expand_tiles<T><<<grid, kThreads, 0, s>>>(w, off, (const T *)gp, n, vec, (T *)o);
  });
  return em_launch_check(op);
}

extern "C" int em_compact_coords_cuda(const char *op, const em_tensor *ws, int64_t n, int ndim, const int64_t *shape,
                                      em_tensor *out) {
  if (n == 0 || ndim == 0 || em_numel(out) == 0) return 0;
  cudaStream_t s = em_cur_stream(out->device.index);
  Dims d;
  d.ndim = ndim;
  for (int i = 0; i < ndim; i++) { d.s[i] = shape[i]; d.s32[i] = (uint32_t)shape[i]; }
  const unsigned grid = (unsigned)ntiles_of(n);
  const uint32_t *w = ws_words(ws);
  const int64_t *off = ws_off(ws, n);
  int64_t *o = (int64_t *)em_data_ptr(out);
  static const bool pairs = em_env_switch("EMBER_COMPACT_PAIRS", true);   /* 0: 2-D rows as two 8-byte stores */
  const bool pair = pairs && ndim == 2 && aligned16(o);
  if (n <= (int64_t)UINT32_MAX) coords_tiles<uint32_t><<<grid, kThreads, 0, s>>>(w, off, d, pair, o);
  else coords_tiles<uint64_t><<<grid, kThreads, 0, s>>>(w, off, d, pair, o);
  return em_launch_check(op);
}

/* ================= the previous path (EMBER_COMPACT=scan) ================= */

/* ---------------- masked_select, nonzero ---------------- */

template <typename T> __device__ __forceinline__ bool nonzero_of(T v) { return v != T(0); }
template <> __device__ __forceinline__ bool nonzero_of<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v) != 0.f; }
template <> __device__ __forceinline__ bool nonzero_of<__half>(__half v) { return __half2float(v) != 0.f; }

template <typename T>
__global__ void flags_kernel(const T *x, int64_t n, int64_t *pos) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    pos[i] = nonzero_of(x[i]) ? 1 : 0;
}

extern "C" int em_nonzero_scan_cuda(const char *op, const em_tensor *x, em_tensor *pos) {
  int64_t n = em_numel(x);
  if (n == 0) return 0;
  int dev = x->device.index;
  cudaStream_t s = em_cur_stream(dev);
  int64_t *pp = (int64_t *)em_data_ptr(pos);
  unsigned grid = em_grid(n, THREADS);
#define FLAGS(T) flags_kernel<T><<<grid, THREADS, 0, s>>>((const T *)em_data_ptr(x), n, pp)
  switch (x->dtype) {
    case EM_F32: FLAGS(float); break;
    case EM_F64: FLAGS(double); break;
    case EM_BF16: FLAGS(__nv_bfloat16); break;
    case EM_F16: FLAGS(__half); break;
    case EM_I32: FLAGS(int32_t); break;
    case EM_I64: FLAGS(int64_t); break;
    case EM_U16: FLAGS(uint16_t); break;
    default: FLAGS(uint8_t); break;    /* u8, bool */
  }
#undef FLAGS
  if (em_launch_check(op)) return -1;
  size_t bytes = 0;
  if (em_cuda_check(cub::DeviceScan::InclusiveSum(NULL, bytes, pp, n, s), op, "cub::DeviceScan (size)")) return -1;
  int64_t nb = (int64_t)(bytes ? bytes : 1);
  em_tensor *tmp = em_empty(1, &nb, EM_U8, x->device);
  if (!tmp) return -1;
  int rc = em_cuda_check(cub::DeviceScan::InclusiveSum(em_data_ptr(tmp), bytes, pp, n, s), op, "cub::DeviceScan");
  em_tensor_release(tmp);   /* stream-ordered: reused only after the scan */
  return rc ? rc : em_launch_check(op);
}

__device__ __forceinline__ bool selected(const int64_t *pos, int64_t i) { return pos[i] > (i ? pos[i - 1] : 0); }

template <typename T>
__global__ void compact_kernel(const T *x, const int64_t *pos, int64_t n, T *out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    if (selected(pos, i)) out[pos[i] - 1] = x[i];
}

template <typename T>
__global__ void expand_kernel(const T *g, const int64_t *pos, int64_t n, T *gx) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    gx[i] = selected(pos, i) ? g[pos[i] - 1] : T(0);
}

extern "C" int em_masked_select_cuda(const char *op, const em_tensor *x, const em_tensor *pos, em_tensor *out) {
  int64_t n = em_numel(pos);
  if (n == 0) return 0;
  cudaStream_t s = em_cur_stream(x->device.index);
  unsigned grid = em_grid(n, THREADS);
  const void *xp = em_data_ptr(x);
  const int64_t *pp = (const int64_t *)em_data_ptr(pos);
  void *op_ = em_data_ptr(out);
  em_by_width(em_dtype_size(x->dtype), [&](auto z) {
    using T = decltype(z);
    compact_kernel<T><<<grid, THREADS, 0, s>>>((const T *)xp, pp, n, (T *)op_);
  });
  return em_launch_check(op);
}

extern "C" int em_masked_scatter_cuda(const char *op, const em_tensor *g, const em_tensor *pos, em_tensor *gx) {
  int64_t n = em_numel(pos);
  if (n == 0) return 0;
  cudaStream_t s = em_cur_stream(gx->device.index);
  unsigned grid = em_grid(n, THREADS);
  const void *gp = em_data_ptr(g);
  const int64_t *pp = (const int64_t *)em_data_ptr(pos);
  void *xp = em_data_ptr(gx);
  em_by_width(em_dtype_size(gx->dtype), [&](auto z) {
    using T = decltype(z);
    expand_kernel<T><<<grid, THREADS, 0, s>>>((const T *)gp, pp, n, (T *)xp);
  });
  return em_launch_check(op);
}

struct Shape { int ndim; int64_t s[EM_MAX_DIMS]; };

__global__ void coords_kernel(const int64_t *pos, int64_t n, Shape sh, int64_t *out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (!selected(pos, i)) continue;
    int64_t *row = out + (pos[i] - 1) * sh.ndim, l = i;
    for (int d = sh.ndim - 1; d >= 0; d--) { row[d] = l % sh.s[d]; l /= sh.s[d]; }
  }
}

extern "C" int em_nonzero_cuda(const char *op, const em_tensor *pos, int ndim, const int64_t *shape, em_tensor *out) {
  int64_t n = em_numel(pos);
  if (n == 0 || ndim == 0) return 0;
  Shape sh;
  sh.ndim = ndim;
  for (int d = 0; d < ndim; d++) sh.s[d] = shape[d];
  cudaStream_t s = em_cur_stream(out->device.index);
  coords_kernel<<<em_grid(n, THREADS), THREADS, 0, s>>>((const int64_t *)em_data_ptr(pos), n, sh,
                                                          (int64_t *)em_data_ptr(out));
  return em_launch_check(op);
}

/* ---- nonzero in two reads: count, then select ----
 * The predicate reads x by its runtime dtype (a launch-uniform switch), so
 * one CUB instantiation serves all nine dtypes. For 2-4 dims the selection
 * writes the coordinates directly (an output iterator turning each flat
 * index into an N-int64 row); other ranks go through flat indices and one
 * expansion. */

__device__ __forceinline__ bool nonzero_at(const void *x, int dt, int64_t i) {
  switch (dt) {
    case EM_F32: return nonzero_of(((const float *)x)[i]);
    case EM_F64: return nonzero_of(((const double *)x)[i]);
    case EM_BF16: return nonzero_of(((const __nv_bfloat16 *)x)[i]);
    case EM_F16: return nonzero_of(((const __half *)x)[i]);
    case EM_I32: return ((const int32_t *)x)[i] != 0;
    case EM_I64: return ((const int64_t *)x)[i] != 0;
    case EM_U16: return ((const uint16_t *)x)[i] != 0;
    default: return ((const uint8_t *)x)[i] != 0;   /* u8, bool */
  }
}

struct IsNonzero {
  const void *x;
  int dt;
  __device__ __forceinline__ bool operator()(int64_t i) const { return nonzero_at(x, dt, i); }
};
struct NonzeroFlag {
  const void *x;
  int dt;
  __device__ __forceinline__ int64_t operator()(int64_t i) const { return nonzero_at(x, dt, i) ? 1 : 0; }
};

/* One row of N coordinates, and the functor that makes it from a flat index. */
template <int N> struct Coords { int64_t c[N]; };
template <int N>
struct ToCoords {
  int64_t s[N];
  __host__ __device__ __forceinline__ Coords<N> operator()(int64_t l) const {
    Coords<N> r;
#pragma unroll
    for (int d = N - 1; d >= 0; d--) { r.c[d] = l % s[d]; l /= s[d]; }
    return r;
  }
};

static int count_nonzero(const char *op, const em_tensor *x, em_tensor *count, cudaStream_t s) {
  const int64_t n = em_numel(x);
  thrust::transform_iterator<NonzeroFlag, thrust::counting_iterator<int64_t>, int64_t> in(
      thrust::counting_iterator<int64_t>(0), NonzeroFlag{em_data_ptr(x), x->dtype});
  int64_t *out = (int64_t *)em_data_ptr(count);
  size_t bytes = 0;
  if (em_cuda_check(cub::DeviceReduce::Sum(nullptr, bytes, in, out, n, s), op, "cub::DeviceReduce (size)")) return -1;
  int64_t nb = (int64_t)(bytes ? bytes : 1);
  em_tensor *tmp = em_empty(1, &nb, EM_U8, x->device);
  if (!tmp) return -1;
  int rc = em_cuda_check(cub::DeviceReduce::Sum(em_data_ptr(tmp), bytes, in, out, n, s), op, "cub::DeviceReduce");
  em_tensor_release(tmp);   /* stream-ordered */
  return rc ? rc : em_launch_check(op);
}

/* The selected flat indices, in order, through the output iterator out. */
template <typename Out>
static int select_nonzero(const char *op, const em_tensor *x, Out out, cudaStream_t s) {
  const int64_t n = em_numel(x);
  thrust::counting_iterator<int64_t> in(0);
  IsNonzero pred{em_data_ptr(x), x->dtype};
  int64_t one = 1;
  em_tensor *num = em_empty(1, &one, EM_I64, x->device);   /* the count again, on the device: not read */
  if (!num) return -1;
  size_t bytes = 0;
  int rc = em_cuda_check(cub::DeviceSelect::If(nullptr, bytes, in, out, (int64_t *)em_data_ptr(num), n, pred, s), op,
                         "cub::DeviceSelect (size)");
  int64_t nb = (int64_t)(bytes ? bytes : 1);
  em_tensor *tmp = rc ? NULL : em_empty(1, &nb, EM_U8, x->device);
  if (!rc && !tmp) rc = -1;
  if (!rc)
    rc = em_cuda_check(cub::DeviceSelect::If(em_data_ptr(tmp), bytes, in, out, (int64_t *)em_data_ptr(num), n, pred, s),
                       op, "cub::DeviceSelect");
  em_tensor_release(tmp);
  em_tensor_release(num);
  return rc ? rc : em_launch_check(op);
}

template <int N>
static int select_coords(const char *op, const em_tensor *x, const int64_t *shape, em_tensor *out, cudaStream_t s) {
  ToCoords<N> f;
  for (int d = 0; d < N; d++) f.s[d] = shape[d];
  return select_nonzero(op, x, thrust::make_transform_output_iterator((Coords<N> *)em_data_ptr(out), f), s);
}

/* row k of out = the coordinates of flat index flat[k] */
__global__ void flat_coords_kernel(const int64_t *flat, int64_t count, Shape sh, int64_t *out) {
  for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < count; k += (int64_t)gridDim.x * blockDim.x) {
    int64_t l = flat[k], *row = out + k * sh.ndim;
    for (int d = sh.ndim - 1; d >= 0; d--) { row[d] = l % sh.s[d]; l /= sh.s[d]; }
  }
}

extern "C" int em_count_nonzero_cuda(const char *op, const em_tensor *x, em_tensor *count) {
  cudaStream_t s = em_cur_stream(x->device.index);
  if (em_numel(x) == 0)
    return em_cuda_check(cudaMemsetAsync(em_data_ptr(count), 0, sizeof(int64_t), s), op, "cudaMemsetAsync");
  return count_nonzero(op, x, count, s);
}

extern "C" int em_nonzero_select_cuda(const char *op, const em_tensor *x, int ndim, const int64_t *shape,
                                      em_tensor *out) {
  const int64_t count = out->ndim ? out->shape[0] : 0;
  if (count == 0 || ndim == 0) return 0;
  cudaStream_t s = em_cur_stream(x->device.index);
  switch (ndim) {
    case 1: return select_nonzero(op, x, (int64_t *)em_data_ptr(out), s);
    case 2: return select_coords<2>(op, x, shape, out, s);
    case 3: return select_coords<3>(op, x, shape, out, s);
    case 4: return select_coords<4>(op, x, shape, out, s);
    default: break;
  }
  em_tensor *flat = em_empty(1, &count, EM_I64, x->device);
  if (!flat) return -1;
  int64_t *fp = (int64_t *)em_data_ptr(flat);
  int rc = select_nonzero(op, x, fp, s);
  if (!rc) {
    Shape sh;
    sh.ndim = ndim;
    for (int d = 0; d < ndim; d++) sh.s[d] = shape[d];
    flat_coords_kernel<<<em_grid(count, THREADS), THREADS, 0, s>>>(fp, count, sh, (int64_t *)em_data_ptr(out));
    rc = em_launch_check(op);
  }
  em_tensor_release(flat);
  return rc;
}
