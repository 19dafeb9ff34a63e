/* FlashAttention backward for Hopper in one kernel (EMBER_FLASH_BWD=fused,
 * fused_nd): FlashAttention-3's structure. wg2's dk/dv kernel (one block per
 * 128 keys of a kv head, k and v resident, q/dO tiles of 64 queries streamed
 * by TMA, two consumer warpgroups of 64 keys each, ping-pong on named
 * barriers 1/2: docs/flash.md "Step 4", "Step 4b") also computes each q
 * tile's dq contribution dS·k and adds it into an f32 buffer dq_accum (B, H,
 * Tq rounded up to 64, D) in global memory; a small kernel then writes
 * dq = scale · dq_accum in q's dtype. S and dP are computed once: 5 matmuls
 * per tile instead of wg2's 7. The design, counts and model: docs/flash.md
 * "Step 5".
 *
 * Per tile j, each consumer takes two turns (as wg2's dk/dv at D 128):
 *   A(j)  Sᵀ = k qᵀ, dPᵀ = v dOᵀ; then (off the tensor cores) Pᵀ, dSᵀ, the
 *         16-bit A fragments, and its 64 rows of dSᵀ into shared buffer
 *         j % 3 (a 128-key × 64-query tile, the 128-byte swizzle).
 *   B(j)  dv += Pᵀ dO, dk += dSᵀ q (dSᵀ from the buffer: registers are short
 *         at D 128), and dq(j−1) = dS(j−1) · k[:, half]: both
 *         consumers' dSᵀ(j−1) (all 128 keys, read M-major: the transpose
 *         flag) times this consumer's D/2 columns of the resident k (N-major),
 *         then out to dq_accum (below). A last turn issues dq(last).
 * dq lags a tile so that both halves of dS(j−1) are written before either
 * consumer reads them: consumer X wrote its half before its turn B(j−1), and
 * the turn chain (every bar.arrive is a release to the barrier's waiter)
 * reaches the other consumer's B(j) after that. Three buffers: buffer j % 3
 * is rewritten at tile j + 3, after both consumers' B(j + 2) turns began,
 * each of which follows its own wait for dq(j) (issued in B(j + 1)); two
 * would let a consumer overwrite dS(j) while the other's dq(j) still reads it.
 * (Step 5b, the bulk path at D 128: two buffers, dSᵀ(j) stored at the start of
 * turn B(j), after the other consumer's dq(j − 2) completed; see the kernel.)
 * Every tile from qstart on is computed, also one none of a consumer's keys
 * sees under the causal mask (P = 0 there: dk, dv get exact zeros, so their
 * bits are wg2's; dq gets zeros): no empty turns, no wgmma in a branch.
 *
 * How dq(j) reaches dq_accum (EMBER_FLASH_DQ; docs/flash.md "Step 5b"):
 * bulk (default): each consumer stores its half (64 queries × D/2 f32) into
 * its own shared buffer and hands it to the producer's warp 1 (named
 * barriers dq full / dq empty), which adds it to dq_accum with one
 * cp.reduce.async.bulk .add.f32 (dq_accum then tiled as the buffers are);
 * red (Step 5): every consumer thread adds with red.global.add.v4.f32.
 *
 * dq_accum's adds are f32 atomics: in fused_nd their order (so dq's last
 * bits) depends on which block gets there first. fused orders them: a
 * counter per (batch, q head, 64-query tile, consumer half) that a block's
 * writer warp (red: consumer) waits on (ld.acquire, until it equals the
 * number of key blocks above it that add to this tile) before its adds, and
 * bumps (red.release) after they are performed; key blocks run highest
 * first (block x = n_blocks − 1 − n). A block only ever waits on blocks of the same (batch, kv head) with a higher key
 * block, i.e. a lower blockIdx.x, launched before it: they are resident or
 * done, and by induction on blockIdx they never wait on it, so it cannot
 * deadlock (as FA3's Deterministic mode; the hardware dispatches blocks in
 * blockIdx order — the one assumption). Under the causal mask a higher key
 * block starts its q tiles 128 rows later, so it reaches a tile first
 * anyway: the counters rarely make anyone wait. What did cost (Step 5d,
 * measured by a trace of the writer) was the writer's own L2 round trips
 * between a dq store and its reduce; the lazy writer (EMBER_FLASH_DET_LAZY)
 * moves them behind the consumers' next tile, and EMBER_FLASH_DET_CHAINS
 * copies of dq_accum (key block n into copy n % chains, summed in copy order
 * by the convert kernel) give the lazy bump 2·chains tiles of slack. Two
 * writers (EMBER_FLASH_DET_WRITERS=2, default; Step 5e): the producer's warps 1
 * and 3 take the even and the odd tiles, so each writer's bump (a release
 * membar) and counter read (an acquire round trip) fall in the two tile steps
 * between its own tiles, off the path from a consumer's dq store to the
 * hand-back that lets it store the next. Three writers (EMBER_FLASH_DET_WRITERS=3;
 * docs/flash.md "Step 10"): warps 1-3 take tiles jt % 3 and warp 0 stages lse/Δ
 * beside its copies; with three tile steps between its tiles a writer waits out
 * its own adds, bumps its tile at once and reads its next tile's counters —
 * the two-writer loop with a stale read (membar + two round trips) is longer
 * than two tile steps of the consumers' pace since Step 6. With them,
 * EMBER_FLASH_DET_STORE_FIRST=1: no memset of dq_accum — a tile's first adder in
 * its copy stores (it waits for no one), and the conversion reads only the
 * copies whose counters say some key block wrote them. Range-grouped chains
 * (EMBER_FLASH_DET_GROUPS=G > 1, template parameter RG; docs/flash.md "Step 10b"):
 * the key blocks cut into G ranges, each with its own chains and copies, and the
 * blocks dispatched range by range across all (batch, kv head)s, lowest range
 * (the longest blocks) first — the chains stay highest first, so the deadlock
 * argument holds within a range, and the tail is the last range's short blocks. */
#include <cuda.h>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include "backend.h"
#include "runtime.h"
#include "ember/memory.h"
#include "flash_common.cuh"
#include "flash_wg.cuh"
#include "flash_wgmma.cuh"
#include "flash_bwd_wg.cuh"

using namespace flash;

namespace {

// flash_bwd_fused_kernel's flags; kTwoWriters: fused's two dq writer warps (docs/flash.md "Step 5e"; three: the
// template parameter W3, "Step 10")
// kStoreFirst (W3 only; EMBER_FLASH_DET_STORE_FIRST=1): a chain's first adder to a tile stores it instead (no memset)
constexpr int kLazy = 1, kNoFence = 2, kNoWait = 4, kNdHighest = 8, kTwoWriters = 16, kStoreFirst = 32;
// RG only (EMBER_FLASH_DET_GROUPS): the number of key-block ranges, in the flags' bits from kGroupsShift on
constexpr int kGroupsShift = 8;

/* RG (docs/flash.md "Step 10b"): linear block index L = blockIdx.y · nbk + blockIdx.x → range g (ranges of
 * gs = ceil(nbk / G) key blocks: [g·gs, min(nbk, g·gs + gs))), the block's (batch, kv head) and key block: range 0
 * of every (batch, kv head), then range 1, ...; within a range of one (batch, kv head) the highest key block first.
 * A block waits only on higher key blocks of its range and (batch, kv head): lower L, dispatched before it. The
 * same arithmetic as block_order() in tools/flash_bwd_fused_tail.py, which the protocol model replays. */
struct RangeBlock {
  int bhk, nb, g, hi;   // (batch, kv head), key block, range, the range's end (exclusive)
};
__host__ __device__ inline RangeBlock range_block(int L, int nbk, int nbh, int groups) {
  const int gs = (nbk + groups - 1) / groups, g = L / (nbh * gs), lo = g * gs, size = min(nbk, lo + gs) - lo;
  const int rem = L - nbh * lo;
  return {rem / size, lo + size - 1 - rem % size, g, lo + size};
}

/* dSᵀ buffers (see the top): 3, or 2 where the bulk dq path needs the room (D 128 with its 3 ring stages) and
 * stores dSᵀ(j) in turn B(j) instead of A(j) (docs/flash.md "Step 5b"); D 128 with a 2-stage ring has room for 3
 * (EMBER_FLASH_BWD_DQ_FIRST=2, "Step 11"). */
template <int D, bool BULK, int STAGES> constexpr int kNds = (BULK && D == 128 && STAGES > 2) ? 2 : 3;
constexpr uint32_t DS_BYTES = RES * STR * 2;        // 128 keys × 64 queries, 16-bit: 16 KB
/* bulk dq: one consumer's half of a q tile's dq, f32: 64 queries × D/2 (16 KB at D 128, 8 KB at D 64) */
template <int D> constexpr uint32_t kDqHalf = STR * (D / 2) * 4;

/* Layout's resident tiles and ring, then the NDS dSᵀ buffers (1024-aligned),
 * then (bulk) the two dq halves, then lse/Δ and the mbarriers. */
template <int D, int STAGES, bool BULK> struct FLayout {
  using L = Layout<D, STAGES>;
  static constexpr int NDS = kNds<D, BULK, STAGES>;
  static constexpr uint32_t OFF_DS = L::OFF_RING + STAGES * L::STAGE;
  static constexpr uint32_t OFF_DQ = OFF_DS + NDS * DS_BYTES;
  static constexpr uint32_t OFF_LD = OFF_DQ + (BULK ? 2 * kDqHalf<D> : 0), OFF_BAR = OFF_LD + STAGES * 2 * STR * 4;
  static constexpr size_t SMEM = OFF_BAR + (1 + 2 * STAGES) * 8 + 1024;
};

#if defined(__CUDA_ARCH__)
/* Barriers 3 and 4: one consumer's 128 threads (fused's counter wait and bump). */
__device__ __forceinline__ void consumer_sync(int cw) {
  if (cw == 0) asm volatile("bar.sync 3, 128;\n" ::: "memory");
  else asm volatile("bar.sync 4, 128;\n" ::: "memory");
}
/* Generic-proxy shared stores (dSᵀ) visible to the wgmmas (async proxy) that read them. */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void red_add4(float *p, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_inc(unsigned *p) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p) : "memory");
}
/* a tile's two counters (halves 0 and 1, adjacent: half 0 the low word) read or bumped as one 8-byte word */
__device__ __forceinline__ unsigned long long ld_acquire_pair(const unsigned *p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_inc_pair(unsigned *p) {
  asm volatile("red.release.gpu.global.add.u64 [%0], 0x100000001;\n" ::"l"(p) : "memory");
}

/* ---- bulk dq (docs/flash.md "Step 5b", "Step 5e", "Step 10") ----
 * Named barriers, per consumer cw and writer parity w (one writer: w 0 always; two writers: w = the tile's
 * parity, three: jt % 3; writer w the one that takes those tiles):
 *   3 + cw, 9 + cw    dq full (w 0, 1):  the consumer's 128 threads arrive (their half stored), writer w syncs (160);
 *   5 + cw, 11 + cw   dq empty (w 0, 1): writer w arrives (its copy has read the half), the consumer syncs (160);
 *   7 + cw            the consumer's own 128 threads (dSᵀ stored in turn B, before dk's wgmma reads it).
 * Three writers (D 128 has only 16 ids with 7-8): dq full 9 + cw + 2w (a writer waits at its own, ahead of its
 * tile: a shared one would take two writers' syncs in one phase), dq empty 5 + cw shared by the three writers —
 * only the consumer waits there, and writer jt % 3 hands tile jt back after syncing on its full, which the consumer
 * arrives at after its sync on the hand-back of tile jt − 1: one arrival and one sync a phase, in tile order.
 * (One barrier for both full and empty is not possible: a writer's hand-back arrival and its next full sync would
 * land in one phase; tools/flash_bwd_fused_protocol.py catches it.) 0 is __syncthreads, 1-2 the consumers' turns. */
constexpr int DQ_BAR = 160;
template <int ID, int N> __device__ __forceinline__ void bar_sync_n() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(N) : "memory");
}
template <int ID, int N> __device__ __forceinline__ void bar_arrive_n() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(N) : "memory");
}
/* dq full / dq empty of consumer cw, parity w: a register id (one block an SM: reserving all 16 is free),
 * so that the two-writer choice costs the consumers no branches */
__device__ __forceinline__ int dq_full_id(int cw, int w, bool three = false) { return three ? 9 + cw + 2 * w : 3 + cw + 6 * w; }
__device__ __forceinline__ int dq_empty_id(int cw, int w, bool three = false) { return three ? 5 + cw : 5 + cw + 6 * w; }
__device__ __forceinline__ void bar_sync_r(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(DQ_BAR) : "memory");
}
__device__ __forceinline__ void bar_arrive_r(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(DQ_BAR) : "memory");
}
__device__ __forceinline__ void ds_stored_sync(int cw) {
  if (cw == 0) bar_sync_n<7, 128>(); else bar_sync_n<8, 128>();
}
/* An L2 policy that keeps lines (dq_accum's tiles: every key block above and below adds to them again). */
__device__ __forceinline__ uint64_t l2_evict_last() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
/* bytes f32 at src (shared) added into dst (global) by the copy engine, one bulk group each (TMA's reduce:
 * whole lines into L2 instead of 16-byte atomics from every thread). */
__device__ __forceinline__ void bulk_reduce_add(float *dst, uint32_t src, uint32_t bytes, uint64_t pol) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.L2::cache_hint.add.f32 [%0], [%1], %2, %3;\n" ::"l"(dst),
               "r"(src), "r"(bytes), "l"(pol)
               : "memory");
}
/* the same, stored rather than added (the first adder of a tile in its copy of dq_accum, which is then not zeroed) */
__device__ __forceinline__ void bulk_store(float *dst, uint32_t src, uint32_t bytes, uint64_t pol) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;\n" ::"l"(dst), "r"(src),
               "r"(bytes), "l"(pol)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* the groups' reads of shared memory done (the buffer may be rewritten) */
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
/* the groups complete: their writes to global memory performed */
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
/* all but the newest two groups complete (fused, lazy: the writer's tile before the one just issued) */
__device__ __forceinline__ void bulk_wait_all_but2() { asm volatile("cp.async.bulk.wait_group 2;\n" ::: "memory"); }
/* orders the async proxy's global accesses (the bulk reduces) with the generic ones (fused's counters) */
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

/* A consumer's dq accumulators into its half buffer in the accumulator's own order: float4 m of thread tid
 * at 16·(128·m + tid) (a warp's 32 stores are 512 contiguous bytes: no bank conflict). The copy moves the
 * half as it is, so dq_accum holds this order too and flash_dq_convert_kernel maps it back: float4 m of
 * thread tid (warp w, lane 4g + t) holds row 16w + g columns 8m + 2t, +1, then row 16w + g + 8 the same. */
template <int D>
__device__ __forceinline__ void store_dq_half(uint32_t half, const float (&acc)[D / 4], int tid) {
#pragma unroll
  for (int m = 0; m < D / 16; m++)
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(half + 16 * (128 * m + tid)), "f"(acc[4 * m]),
                 "f"(acc[4 * m + 1]), "f"(acc[4 * m + 2]), "f"(acc[4 * m + 3])
                 : "memory");
}

/* This consumer's dSᵀ (its 64 keys × 64 queries, the packed A fragments of
 * dk += dSᵀ q) into rows r0, r0 + 8 (r0 = 64·cw + 16·warp + g) of the
 * [key][query] tile at buf, 128-byte rows, 16-byte chunk c of row r at
 * c ^ (r % 8): a[kk][0] row r0 chunk 2kk, [1] r0 + 8 the same, [2] and [3]
 * chunk 2kk + 1; word t of the chunk. The 8 rows of a warp's store hit 8
 * different chunks: no bank conflict. */
__device__ __forceinline__ void store_ds(uint32_t buf, const uint32_t (&a)[STR / 16][4], int r0, int t) {
  const uint32_t row = buf + r0 * 128, sw = r0 & 7;
#pragma unroll
  for (int kk = 0; kk < STR / 16; kk++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const uint32_t at = row + (((2 * kk + h) ^ sw) << 4) + 4 * t;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(a[kk][2 * h]) : "memory");
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at + 8 * 128), "r"(a[kk][2 * h + 1]) : "memory");
    }
  }
}

/* acc (64 queries × D/2) = dS (64 × 128 keys: the dSᵀ tile at ds, M-major)
 * times k (128 keys × D/2 columns at kb, N-major), one commit group left open. */
template <typename T, int D>
__device__ __forceinline__ void issue_dq(float (&acc)[D / 4], uint32_t ds, uint32_t kb) {
#pragma unroll
  for (int kk = 0; kk < RES / 16; kk++)
    WgmmaT<T, D / 2>::tt(acc, wg_desc(ds + kk * 16 * 128, RES * 128, 1024),
                          wg_desc(kb + kk * 16 * 128, RES * 128, 1024), kk > 0);
}

/* acc (64 keys × D) += dSᵀ (this consumer's 64 rows of the tile, at a, K-major
 * over 64 queries) times q (the streamed tile at b, N-major), not committed:
 * dk's A from shared memory (where dq needs it anyway), not registers, which
 * keeps D 128 within 240 registers. */
template <typename T, int D>
__device__ __forceinline__ void issue_dk(float (&acc)[D / 2], uint32_t a, uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < STR / 16; kk++)
    WgmmaT<T, D>::kn(acc, wg_desc(a + kk * 32, 16, 1024), wg_desc(b + kk * 16 * 128, STR * 128, 1024), 1);
}

/* issue_dq and issue_dk on descriptor low words (wg_desc_lo; ds, a with lbo RES · 128 and 16, kb, b with
 * RES · 128 and STR · 128), a k step's offset added (EMBER_FLASH_BWD_STEP6; docs/flash.md "Step 6"). */
template <typename T, int D>
__device__ __forceinline__ void issue_dq_lo(float (&acc)[D / 4], uint32_t ds, uint32_t kb) {
#pragma unroll
  for (int kk = 0; kk < RES / 16; kk++)
    WgmmaT<T, D / 2>::tt(acc, wg_desc_at(ds, kk * 16 * 128), wg_desc_at(kb, kk * 16 * 128), kk > 0);
}
template <typename T, int D>
__device__ __forceinline__ void issue_dk_lo(float (&acc)[D / 2], uint32_t a, uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < STR / 16; kk++) WgmmaT<T, D>::kn(acc, wg_desc_at(a, kk * 32), wg_desc_at(b, kk * 16 * 128), 1);
}

/* A consumer tile's ring stage, its phase parity, its q tile within the head, its dSᵀ buffer and the previous
 * tile's (j % STAGES, (j / STAGES) & 1, j % nq, j % NDS, (j − 1) % NDS), stepped once a tile instead of divided
 * (EMBER_FLASH_BWD_STEP6: nq is a run-time divisor). */
struct TileAt {
  int s, ph, jq, ids, idp;
  template <int STAGES, int NDS> __device__ __forceinline__ void step(int nq) {
    idp = ids;
    ids = ids + 1 == NDS ? 0 : ids + 1;
    jq = jq + 1 == nq ? 0 : jq + 1;
    if (++s == STAGES) s = 0, ph ^= 1;
  }
};

/* acc's rows r0, r0 + 8 (of 64), columns 8m + 2t, + 1, into dst (row stride
 * D) as 16-byte adds: lanes t and t ^ 1 trade a pair, the even one then
 * adding row r0's four columns 8m + 2t.., the odd one row r0 + 8's
 * 8m + 2t − 2.. (half the L2 atomic operations of 8-byte adds). */
template <int D>
__device__ __forceinline__ void add_dq(float *dst, const float (&acc)[D / 4], int r0, int t) {
  const bool odd = t & 1;
  float *row = dst + (int64_t)(r0 + (odd ? 8 : 0)) * D + 2 * (t & ~1);
#pragma unroll
  for (int m = 0; m < D / 16; m++) {
    const float *a = acc + 4 * m;   // a[0], a[1]: row r0; a[2], a[3]: row r0 + 8
    const float x0 = __shfl_xor_sync(0xffffffffu, odd ? a[0] : a[2], 1);
    const float x1 = __shfl_xor_sync(0xffffffffu, odd ? a[1] : a[3], 1);
    red_add4(row + 8 * m, odd ? x0 : a[0], odd ? x1 : a[1], odd ? a[2] : x0, odd ? a[3] : x1);
  }
}
#endif

/* W3 (fused, bulk; EMBER_FLASH_DET_WRITERS=3, docs/flash.md "Step 10"): three dq writers — a template parameter, so
 * that the other settings' kernels are the code they were. DQF (EMBER_FLASH_BWD_DQ_FIRST, W3 and S6 only;
 * docs/flash.md "Step 11"): 1, turn B issues dq(j − 1) first, committed apart, so that dq's hand-off to the writer
 * runs under dv's and dk's wgmmas; 2, also dSᵀ's proxy fence off the path from the softmax to turn B's wgmmas: D 64
 * takes dk's A from registers (as wg2), D 128 (STAGES 2: three dSᵀ buffers, dSᵀ stored in turn A) fences and syncs
 * the consumer after dq's and dv's issue, before dk's. */
template <typename T, int D, int STAGES, bool DET, bool BULK, bool S6, bool W3 = false, bool RG = false,
          int DQF = 0>
__global__ void __launch_bounds__(THREADS, 1)
    flash_bwd_fused_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                           const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                           const Params p, float *dqa, unsigned *sem, int tqp, int chains, int64_t nacc,
                           int flags) {
  // flags: kLazy (EMBER_FLASH_DET_LAZY); diagnostics (EMBER_FLASH_FUSED_DEBUG, timing only: fused's bits are
  // not guaranteed with kNoFence / kNoWait): kNoFence, no proxy fence before a reduce; kNoWait, no counter wait;
  // kNdHighest, fused_nd in fused's block order
  const bool lazy = flags & kLazy, nofence = flags & kNoFence, nowait = flags & kNoWait;
  // dq writers: two (warps 1 and 3), tiles by parity; three (warps 1-3; warp 0 stages lse/Δ), tiles by jt % 3
  constexpr bool three = W3;
  static_assert(!W3 || (DET && BULK), "three dq writers are fused's bulk path");
  static_assert(!RG || W3, "range-grouped chains run with three dq writers");
  static_assert(!DQF || (W3 && S6), "dq first is the three-writer, STEP6 loop's");
  static_assert(DQF != 2 || D == 64 || STAGES == 2, "DQF 2 at D 128: the 2-stage ring's three dSᵀ buffers");
  const bool two = BULK && !three && (flags & kTwoWriters);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<D, STAGES>;
  using F = FLayout<D, STAGES, BULK>;
  constexpr int NDS = F::NDS;
  constexpr bool DS_IN_B = NDS == 2;   // two buffers: dSᵀ(j) stored in turn B(j) (see "Step 5b")
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  const uint32_t sK = base, sV = base + L::OFF_B, ring = base + L::OFF_RING, sDS = base + F::OFF_DS;
  const uint32_t sDQ = base + F::OFF_DQ;   // bulk: consumer cw's dq half at sDQ + cw · kDqHalf
  float *sLD = reinterpret_cast<float *>(smem_raw + (base - raw) + F::OFF_LD);   // stage s: lse at 2·STR·s, Δ STR on
  const uint32_t bar_kv = base + F::OFF_BAR, full = bar_kv + 8, empty = full + 8 * STAGES;   // + 8·stage

  // fused: the highest key block first (the counters' order); fused_nd: the longest first
  // RG: range by range across the (batch, kv head)s, the lowest range first (range_block)
  const RangeBlock rb = RG ? range_block((int)(blockIdx.y * gridDim.x + blockIdx.x), (int)gridDim.x, (int)gridDim.y,
                                         flags >> kGroupsShift)
                           : RangeBlock{};
  const int nb = RG ? rb.nb
                    : DET || (flags & kNdHighest) ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
  // fused: key block nb adds into copy nb % chains of dq_accum, with that copy's counters (chains of key blocks
  // nb, nb + chains, ...: a block's predecessor started 2·chains tiles ahead of it on any q tile); RG: range g's
  // chains in copies g·chains + nb % chains, a chain's blocks all in the range
  if constexpr (DET) {
    const int c = (RG ? rb.g * chains : 0) + nb % chains;
    dqa += c * nacc;
    sem += (int64_t)c * (p.B * p.H * (tqp / STR) * 2);
  }
  const DkdvTiles tiles = RG ? dkdv_tiles(p, nb, rb.bhk) : dkdv_tiles(p, nb);
  const int b = tiles.b, hk = tiles.hk, k0 = tiles.k0, qstart = tiles.qstart, nq = tiles.nq, ntile = tiles.ntile;
  // S6 (EMBER_FLASH_BWD_STEP6): the warpgroup through a shuffle from lane 0, which the compiler knows is the
  // same in every lane: what derives from it (the consumer's tiles, its descriptors) is in uniform registers
  const int wg = S6 ? __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0) : threadIdx.x >> 7;

  // tile jt's q head (b·H + h) and 64-query tile; fused's counter of its consumer half; the key blocks above
  // this one that add to it (n with 128·n < 64·mt + 64 + off under the causal mask, i.e. qstart(n) at or
  // before the tile; all of them without one): the counter's value when this block's turn comes
  auto bh_of = [&](int jt) { return b * p.H + hk * p.group + jt / nq; };
  auto mt_of = [&](int jt) { return qstart / STR + jt % nq; };
  auto counter = [&](int jt, int half) { return sem + ((int64_t)bh_of(jt) * (tqp / STR) + mt_of(jt)) * 2 + half; };
  auto ahead = [&](int jt) {
    const int mt = mt_of(jt);
    if constexpr (RG) {   // the chain ends with its range (a branch of its own: the other instances' code unchanged)
      const int nlast = p.causal ? min(rb.hi - 1, (mt * STR + STR - 1 + p.off) / RES) : rb.hi - 1;
      return (unsigned)((nlast - nb) / chains);
    }
    const int nlast = p.causal ? min((int)gridDim.x - 1, (mt * STR + STR - 1 + p.off) / RES) : (int)gridDim.x - 1;
    return (unsigned)((nlast - nb) / chains);   // the key blocks n in (nb, nlast] with n ≡ nb (mod chains)
  };

  // full: the copies' expect_tx and the lse/Δ threads (two writers: warp 2 alone, three: warp 0, two rows a lane)
  init_barriers<STAGES>(bar_kv, full, empty, three || two ? 1 + 32 : 1 + STR);

  if (wg == 0) {
    dkdv_producer<D, STAGES>(&tq, &tk, &tv, &tdo, p, sK, sV, ring, sLD, bar_kv, full, empty, b, hk, k0, qstart, nq,
                             ntile, three ? 0 : two ? 1 : 2);
    if constexpr (BULK) {
      // warp 1 (idle in the producer): the dq writer. Per tile, each half once its consumer stored it (dq full),
      // fused: once the tile's counters say the key blocks above have added theirs; one bulk reduce each, then
      // the halves handed back (dq empty) when the copies have read them; fused: the counters bumped once the
      // adds are performed. Lazy (EMBER_FLASH_DET_LAZY, default; Step 5d): none of the writer's L2 round trips
      // on the consumers' path — after handing tile jt's halves back, it bumps tile jt − 1 (whose adds, issued a
      // tile ago, are done by then: wait_group 2 leaves tile jt's two groups in flight) and reads tile jt + 1's
      // two counters as one word, while the consumers compute; at the tile it only checks that word. Not lazy
      // (Step 5): each half's counter read when due, the tile's adds waited out and bumped every tile.
      // Two writers (kTwoWriters, fused's default; docs/flash.md "Step 5e"): warps 1 and 3 (warp 2 alone then
      // stages lse/Δ) take the even and the odd tiles, each with its own bulk groups and dq full/empty barriers,
      // so each has two tile steps for its bump and counter read (the release's membar, the acquire's round
      // trip) instead of one: they leave the consumers' path. A writer's lazy bump is then of its own previous
      // tile, two tiles back.
      // Three writers (W3; docs/flash.md "Step 10"): warps 1-3 take tiles jt % 3 = 0, 1, 2 (warp 0 stages
      // lse/Δ beside its copies); with three tile steps between its tiles a writer can wait out its own adds after
      // the hand-back and bump its tile at once (no lag), then read its next tile's counters.
      const int pw = threadIdx.x >> 5;
      if ((three ? pw >= 1 : pw == 1 || (two && pw == 3)) && ntile > 0) {
        const bool lead = (threadIdx.x & 31) == 0;
        const int w = three ? pw - 1 : pw == 3 ? 1 : 0, step = three ? 3 : two ? 2 : 1;   // tiles w, w + step, ...
        auto want = [&](int jt) { return (unsigned long long)ahead(jt) * 0x100000001ull; };
        auto bump = [&](int jt) {   // tile jt's adds performed (the caller waited on their groups)
          fence_proxy_async_global();
          if (lazy) {
            red_release_inc_pair(counter(jt, 0));
          } else {
            red_release_inc(counter(jt, 0));
            red_release_inc(counter(jt, 1));
          }
        };
        unsigned long long seen = 0;   // lazy: tile jt's two counters as last read
        if (DET && lazy && lead && !nowait && w < ntile) seen = ld_acquire_pair(counter(w, 0));
        // the consumers' first store (tile 0) syncs on the empty barriers of parity "tile −1": 1 with two writers
        if (w == step - 1) {
          bar_arrive_r(dq_empty_id(0, w, three));
          bar_arrive_r(dq_empty_id(1, w, three));
        }
        for (int jt = w; jt < ntile; jt += step) {
          // before the full sync (while waiting for the consumers), not between it and the reduce: the tile's
          // address and (fused) its counters' wanted value, a division by nq and one by chains
          float *dst = dqa + ((int64_t)bh_of(jt) * (tqp / STR) + mt_of(jt)) * STR * D;   // the tile: 2 halves
          const unsigned long long wj = DET ? want(jt) : 0;
#pragma unroll
          for (int h = 0; h < 2; h++) {
            __syncwarp();   // bar.sync is .aligned: the warp converged after lane 0's branch
            bar_sync_r(dq_full_id(h, w, three));
            if (lead) {
              if constexpr (DET) {
                if (!nowait && lazy && h == 0)
                  while (seen != wj) seen = ld_acquire_pair(counter(jt, 0));
                if (!nowait && !lazy)
                  while (ld_acquire(counter(jt, h)) != (unsigned)wj) {
                  }
                if (!nofence && (h == 0 || !lazy)) fence_proxy_async_global();   // the adds after those acquired
              }
              // the policy made at each use (one instruction): 2 registers fewer to spill on 24
              if (three && (flags & kStoreFirst) && wj == 0)   // no key block above in this copy: the first adder
                bulk_store(dst + h * (kDqHalf<D> / 4), sDQ + h * kDqHalf<D>, kDqHalf<D>, l2_evict_last());
              else
                bulk_reduce_add(dst + h * (kDqHalf<D> / 4), sDQ + h * kDqHalf<D>, kDqHalf<D>, l2_evict_last());
              bulk_commit();
            }
          }
          if (lead) bulk_wait_read();
          __syncwarp();
          if (jt + 1 < ntile) {   // the consumers sync on these only before a next tile's store
            bar_arrive_r(dq_empty_id(0, w, three));
            bar_arrive_r(dq_empty_id(1, w, three));
          }
          if constexpr (DET) {
            if (lead && !lazy) {
              bulk_wait_all();
              bump(jt);
            }
            if (lead && lazy) {
              if (three) {
                bulk_wait_all();   // this tile's adds (the halves are handed back already): bumped with no lag
                bump(jt);
              } else if (jt >= step) {
                bulk_wait_all_but2();   // this writer's groups: all but tile jt's two, i.e. tile jt − step's
                bump(jt - step);
              }
              if (jt + step < ntile && !nowait) {
                seen = ld_acquire_pair(counter(jt + step, 0));
                // two writers: the block above bumps a tile (two of its tiles late) about when this read goes out
                // (it reaches a q tile 2·chains tiles earlier); a stale value gets a second look, waited for only
                // at the tile, so that the check there rarely costs a round trip
                if ((three || two) && seen != want(jt + step)) seen = ld_acquire_pair(counter(jt + step, 0));
              }
            }
          }
        }
        if (lead) bulk_wait_all();
        if constexpr (DET) {
          if (lead && lazy && !three && w < ntile) bump(w + (ntile - 1 - w) / step * step);   // this writer's last tile
        }
      }
    }
    return;
  }

  // ---- consumers: 64 keys each for dk/dv, D/2 columns each for dq ----
  setmaxnreg_inc<240>();
  const int cw = wg - 1, tid = threadIdx.x & 127, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int warp = S6 ? __shfl_sync(0xffffffffu, tid >> 5, 0) : tid >> 5;   // S6: uniform (the mask's branch)
  const int kw0 = k0 + cw * 64, key0 = kw0 + warp * 16 + g;   // rows key0 and key0 + 8 of dk, dv
  const uint32_t ka = sK + cw * 64 * 128, va = sV + cw * 64 * 128;   // this consumer's rows of k, v
  // this consumer's D/2 columns of k (dq's B): a 64-column chunk at D 128, half a chunk (64 bytes in) at D 64
  const uint32_t kb = sK + (cw * (D / 2) / 64) * RES * 128 + (cw * (D / 2) % 64) * 2;
  const int my_bar = 1 + cw, other_bar = 2 - cw, turns = ntile > 0 ? 2 * ntile + 1 : 0;
  auto pass_turn = [&](int i) {   // consumer 1's last arrival would have no taker
    if (cw == 0 || i < turns - 1) named_arrive(other_bar);
  };
  if (cw == 1 && turns > 0) named_arrive(1);
  // S6: the descriptors' low words of the resident tiles and of the ring's and dSᵀ buffers' first (a tile's: plus
  // its stage's or buffer's offset >> 4)
  const uint32_t ka_lo = wg_desc_lo(ka, 16), va_lo = wg_desc_lo(va, 16), kb_lo = wg_desc_lo(kb, RES * 128);
  const uint32_t ring_k = wg_desc_lo(ring, 16), ring_n = wg_desc_lo(ring, STR * 128);
  const uint32_t ds_k = wg_desc_lo(sDS + cw * 64 * 128, 16), ds_t = wg_desc_lo(sDS, RES * 128);

  float dk[D / 2], dv[D / 2], dq[D / 4];
#pragma unroll
  for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.f;
  if (ntile > 0) mbar_wait(bar_kv, 0);

  // red path, fused: the counter's wait (before the turn that issues the tile's dq, where registers are free)
  auto dq_wait = [&](int jt) {
    if constexpr (DET && !BULK) {
      if (tid == 0) {
        const unsigned *cnt = counter(jt, cw);
        while (ld_acquire(cnt) != ahead(jt)) {
        }
      }
      consumer_sync(cw);
    }
  };
  // tile jt's dq (in dq) out: bulk, into this consumer's half buffer for the writer; red, added into dq_accum
  // (rows of q head bh_of(jt), this consumer's columns) by every thread
  [[maybe_unused]] int wout = 0;
  auto dq_out = [&](int jt) {
    if constexpr (BULK) {
      // the copy has read the buffer's last tile (jt − 1); three writers: their shared empty barrier
      bar_sync_r(dq_empty_id(cw, (jt - 1) & two, three));
      store_dq_half<D>(sDQ + cw * kDqHalf<D>, dq, tid);
      fence_proxy_async();   // the generic stores before the copy engine's reads
      if constexpr (three) {
        bar_arrive_r(dq_full_id(cw, wout, true));   // writer jt % 3's (the calls come in tile order)
        wout = wout == 2 ? 0 : wout + 1;
      } else {
        bar_arrive_r(dq_full_id(cw, jt & two));
      }
    } else {
      add_dq<D>(dqa + ((int64_t)bh_of(jt) * tqp + mt_of(jt) * STR) * D + cw * (D / 2), dq, warp * 16 + g, t);
      if constexpr (DET) {
        // the consumer's adds, then one release by thread 0: the barrier puts every thread's adds before it, and
        // a release is cumulative (CUTLASS's GenericBarrier::arrive_inc; a fence per thread costs 88 bytes of
        // spills)
        consumer_sync(cw);
        if (tid == 0) red_release_inc(counter(jt, cw));
      }
    }
  };

  // DQF (EMBER_FLASH_BWD_DQ_FIRST=1; docs/flash.md "Step 11"): turn B(j) from its named sync on. dq(j − 1) is issued
  // first and committed apart from dv and dk, so that dq's hand-off to the writer (dq empty's sync, the half's stores,
  // the proxy fence, dq full's arrival) runs under dv's and dk's wgmmas instead of after all three. The same wgmmas on
  // the same operands: the same bits; the same buffers' uses (dq(j − 1) reads buffer (j − 1) % NDS, dk buffer j % NDS)
  // and the turn passed at the same point. (D 128's dSᵀ store stays ahead of every wgmma: issuing dv before it, to
  // hide it, pins Pᵀ's registers across it and ptxas spills in the loop — 10 reloads a tile.)
  [[maybe_unused]] auto turn_b_dq_first = [&](auto pend_tag, int j, const TileAt &at, int s, const auto &pa,
                                              const auto &da) {
    constexpr bool PEND = decltype(pend_tag)::value;
    const uint32_t q_n = ring_n + s * (L::STAGE >> 4);
    if constexpr (DS_IN_B) {   // as without DQF (see the turn below)
      store_ds(sDS + at.ids * DS_BYTES, da, cw * 64 + warp * 16 + g, t);
      fence_proxy_async();
      ds_stored_sync(cw);
    }
    reg_fence(dv);
    reg_fence(dk);
    if constexpr (PEND) {
#pragma unroll
      for (int i = 0; i < D / 4; i++) dq[i] = 0.f;   // (scale_d 0 ignores them; defined here, not live before)
    }
    wgmma_fence();
    if constexpr (PEND) {
      issue_dq_lo<T, D>(dq, ds_t + at.idp * (DS_BYTES >> 4), kb_lo);   // dq(j − 1) = dS k
      wgmma_commit();
    }
    issue_rs_lo<T, D>(dv, pa, q_n + (L::STR_BYTES >> 4));   // dv += Pᵀ dO
    // DQF 2: dSᵀ(j)'s stores (turn A) made visible to the wgmmas that read them — dk's at D 128 (after the consumer's
    // four warps' fences: all 64 rows), this consumer's dq(j) in its turn B(j + 1), the other's in its B(j + 1) or,
    // for the last tile, its last turn, which follows this turn's pass — here, behind this turn's first wgmmas
    // instead of on the path to them
    if constexpr (DQF == 2 && D == 128) {
      fence_proxy_async();
      ds_stored_sync(cw);
      wgmma_fence();
    }
    if constexpr (DQF == 2 && D == 64) issue_rs_lo<T, D>(dk, da, q_n);   // dk += dSᵀ q, dSᵀ from registers (wg2's)
    else issue_dk_lo<T, D>(dk, ds_k + at.ids * (DS_BYTES >> 4), q_n);   // dk += dSᵀ q
    wgmma_commit();
    if constexpr (DQF == 2 && D == 64) fence_proxy_async();
    pass_turn(2 * j + 1);
    if constexpr (PEND) {
      wgmma_wait<1>();   // dq's group done (groups complete in order); dv, dk may still run
      reg_fence(dq);
      dq_out(j - 1);
    }
    wgmma_wait<0>();
    reg_fence(dv);
    reg_fence(dk);
    mbar_arrive(empty + 8 * s);   // q(j), dO(j) no longer needed
  };

  // tile j: turn A(j) (Sᵀ, dPᵀ; Pᵀ, dSᵀ; dSᵀ to buffer j % NDS unless DS_IN_B), turn B(j) (DS_IN_B: dSᵀ to
  // the buffer; dv, dk; PEND: dq(j − 1)). The first tile is peeled (PEND false): no wgmma sits in a branch
  auto tile = [&](auto pend_tag, int j, const TileAt &at) {
    constexpr bool PEND = decltype(pend_tag)::value;
    const int s = S6 ? at.s : j % STAGES, i0 = qstart + (S6 ? at.jq : j % nq) * STR;
    [[maybe_unused]] const uint32_t sq = ring + s * L::STAGE, so = sq + L::STR_BYTES;
    [[maybe_unused]] const uint32_t q_k = ring_k + s * (L::STAGE >> 4), q_n = ring_n + s * (L::STAGE >> 4);   // S6's sq
    const float *sl = sLD + s * 2 * STR, *sd = sl + STR;
    const uint32_t ds = sDS + (S6 ? at.ids : j % NDS) * DS_BYTES;
    uint32_t pa[STR / 16][4], da[STR / 16][4];
    {
      float st[STR / 2], dp[STR / 2];
      mbar_wait(full + 8 * s, S6 ? at.ph : (j / STAGES) & 1);
      named_sync(my_bar);
      wgmma_fence();
      if constexpr (S6) {
        issue_ss_lo<T, D>(st, ka_lo, q_k);
        issue_ss_lo<T, D>(dp, va_lo, q_k + (L::STR_BYTES >> 4));
      } else {
        issue_ss<T, D>(st, ka, sq);   // Sᵀ = k qᵀ
        issue_ss<T, D>(dp, va, so);   // dPᵀ = v dOᵀ
      }
      // S6 at D 64: this thread's lse pairs loaded before the wait for Sᵀ, its Δ pairs before the one for dPᵀ
      // (their latency under the wgmmas' tails, not ahead of the exponentials and the products; the lse pairs
      // loaded once, not in both copies of the mask's branch). Not at D 128: there the 32 registers spill (ptxas
      // -v: a reload in the loop of fused).
      constexpr bool PRE = S6 && D == 64;
      [[maybe_unused]] float2 lse2[STR / 8], dl2[STR / 8];
      if constexpr (PRE) load_pairs(lse2, sl, t);
      pass_turn(2 * j);
      wgmma_wait<1>();   // Sᵀ done; dPᵀ may still run under the exponentials
      reg_fence(st);
      if constexpr (PRE) {
        dkdv_p_pre(st, lse2, p, p.causal && kw0 + warp * 16 + 15 > i0 + p.off, key0 - i0 - p.off - 2 * t);
        load_pairs(dl2, sd, t);
      } else {
        dkdv_p(st, sl, p, p.causal && kw0 + warp * 16 + 15 > i0 + p.off, key0 - i0 - p.off - 2 * t, t);
      }
      wgmma_wait<0>();
      reg_fence(dp);
      if constexpr (PRE) dkdv_ds_pre(dp, st, dl2);
      else dkdv_ds(dp, st, sd, t);
      pack_a<T>(pa, st);
      pack_a<T>(da, dp);
      if constexpr (!DS_IN_B) store_ds(ds, da, cw * 64 + warp * 16 + g, t);
    }
    if constexpr (!DS_IN_B && DQF != 2) fence_proxy_async();   // (DQF 2: in turn B, after the issue)
    if constexpr (PEND) dq_wait(j - 1);
    named_sync(my_bar);
    if constexpr (DQF) {
      turn_b_dq_first(pend_tag, j, at, s, pa, da);
      return;
    }
    if constexpr (DS_IN_B) {
      // the buffer's last readers, both consumers' dq(j − 2), completed before the other consumer passed this
      // turn on; stored before the wgmmas, so that da is dead before dq's accumulators are live
      store_ds(ds, da, cw * 64 + warp * 16 + g, t);
      fence_proxy_async();
      ds_stored_sync(cw);   // all four warps' rows before the wgmma reads them
    }
    reg_fence(dv);
    reg_fence(dk);
    if constexpr (PEND) {
#pragma unroll
      for (int i = 0; i < D / 4; i++) dq[i] = 0.f;   // (scale_d 0 ignores them; defined here, not live before)
    }
    wgmma_fence();
    if constexpr (S6) {
      issue_rs_lo<T, D>(dv, pa, q_n + (L::STR_BYTES >> 4));
      issue_dk_lo<T, D>(dk, ds_k + at.ids * (DS_BYTES >> 4), q_n);
      if constexpr (PEND) issue_dq_lo<T, D>(dq, ds_t + at.idp * (DS_BYTES >> 4), kb_lo);
    } else {
      issue_rs<T, D>(dv, pa, so);   // dv += Pᵀ dO
      issue_dk<T, D>(dk, ds + cw * 64 * 128, sq);   // dk += dSᵀ q
      if constexpr (PEND) issue_dq<T, D>(dq, sDS + ((j - 1) % NDS) * DS_BYTES, kb);   // dq(j − 1) = dS k
    }
    wgmma_commit();
    pass_turn(2 * j + 1);
    wgmma_wait<0>();
    reg_fence(dv);
    reg_fence(dk);
    mbar_arrive(empty + 8 * s);   // q(j), dO(j) no longer needed
    if constexpr (PEND) {
      reg_fence(dq);
      dq_out(j - 1);
    }
  };
  if (ntile > 0) {
    TileAt at{0, 0, 0, 0, 0};   // S6: tile j's indices (unused without)
    tile(std::false_type{}, 0, at);
    for (int j = 1; j < ntile; j++) {
      if constexpr (S6) at.step<STAGES, NDS>(nq);
      tile(std::true_type{}, j, at);
    }
    // turn 2·ntile: the last tile's dq
    dq_wait(ntile - 1);
    named_sync(my_bar);
#pragma unroll
    for (int i = 0; i < D / 4; i++) dq[i] = 0.f;
    wgmma_fence();
    if constexpr (S6) issue_dq_lo<T, D>(dq, ds_t + at.ids * (DS_BYTES >> 4), kb_lo);
    else issue_dq<T, D>(dq, sDS + ((ntile - 1) % NDS) * DS_BYTES, kb);
    wgmma_commit();
    pass_turn(2 * ntile);
    wgmma_wait<0>();
    reg_fence(dq);
    dq_out(ntile - 1);
  }

  store_dkdv<T, D>(p, b, hk, dk, dv, key0, t);
#else
  __trap();   // built without sm_90a: bwd_wg_dispatch never launches this
#endif
}

/* dq = scale · dq_accum in q's dtype, one thread per float4 of dq_accum (rows past Tq are padding). One name
 * for both layouts (the spec finds it by name):
 *   red:  dq_accum row-major (B, H, Tq rounded up to 64, D); a thread 4 columns of a row;
 *   bulk: per (b·H + h, 64-query tile), consumer half cw (D/2 columns) as store_dq_half wrote it — float4 m of
 *         thread tid at 128·m + tid — holding rows 16w + g and 16w + g + 8 (w = tid / 32, g = tid % 32 / 4),
 *         columns cw·D/2 + 8m + 2t, +1 (t = tid % 4); read in order (coalesced). */
template <typename T, int D, bool BULK, bool TOUCHED = false>
__global__ void __launch_bounds__(256) flash_dq_convert_kernel(const Params p, const float *dqa, int tqp, int copies,
                                                                int64_t nacc, const unsigned *cnt = nullptr) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  // fused's copies of dq_accum (one a chain of key blocks; RG: groups · chains of them) summed in copy order:
  // the same bits on every run
  auto load = [&](int64_t at) {
    float4 v = *reinterpret_cast<const float4 *>(dqa + at);
    for (int c = 1; c < copies; c++) {
      const float4 w = *reinterpret_cast<const float4 *>(dqa + c * nacc + at);
      v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
    }
    return v;
  };
  // TOUCHED (bulk, EMBER_FLASH_DET_STORE_FIRST=1): dq_accum not zeroed; copy c of a tile half holds a sum only if
  // some key block added to it, which its counter (cnt: the number of key blocks that did) says. The touched copies
  // in copy order, the first taken as it is (as 0 + x is x), so the sum is the memset path's but for a zero's sign
  auto load_touched = [&](int64_t at, int64_t ci) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    bool any = false;
    for (int c = 0; c < copies; c++) {
      if (cnt[c * nacc / (STR * D / 2) + ci] == 0) continue;   // nacc / (STR · D/2): the halves (counters) a copy
      const float4 w = *reinterpret_cast<const float4 *>(dqa + c * nacc + at);
      if (!any) v = w, any = true;
      else v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
    }
    return v;
  };
  if constexpr (!BULK) {
    if (idx >= (int64_t)p.B * p.H * p.Tq * (D / 4)) return;
    const int c = (int)(idx % (D / 4)) * 4;
    const int64_t r = idx / (D / 4), bh = r / p.Tq;
    const int i = (int)(r % p.Tq), b = (int)(bh / p.H), h = (int)(bh % p.H);
    if (c >= p.Dv) return;   // dq_accum is D wide; a head dim of 80 or 96 (run as 128) stores its first Dv
    const float4 v = load((bh * tqp + i) * D + c);
    T *dst = static_cast<T *>(p.dq) + b * p.dq_sb + h * p.dq_sh + i * p.dq_st + c;
    store2(dst, v.x * p.scale, v.y * p.scale);
    store2(dst + 2, v.z * p.scale, v.w * p.scale);
  } else {
    if (idx >= (int64_t)p.B * p.H * tqp * (D / 4)) return;
    const int tid = (int)(idx % 128), m = (int)(idx / 128 % (D / 16));
    const int64_t half = idx / (128 * (D / 16)), tile = half >> 1, bh = tile / (tqp / STR);
    const int cw = (int)(half & 1), mt = (int)(tile % (tqp / STR));
    const int i = mt * STR + 16 * (tid >> 5) + ((tid & 31) >> 2), c = cw * (D / 2) + 8 * m + 2 * (tid & 3);
    if (i >= p.Tq || c >= p.Dv) return;
    float4 v;
    if constexpr (TOUCHED) v = load_touched(4 * idx, half);   // half: the tile half's index, its counter's too
    else v = load(4 * idx);
    const int b = (int)(bh / p.H), h = (int)(bh % p.H);
    T *dst = static_cast<T *>(p.dq) + b * p.dq_sb + h * p.dq_sh + i * p.dq_st + c;
    store2(dst, v.x * p.scale, v.y * p.scale);
    if (i + 8 < p.Tq) store2(dst + 8 * p.dq_st, v.z * p.scale, v.w * p.scale);
  }
}

/* fused's dq order (docs/flash.md "Step 5d"), read once: EMBER_FLASH_DET_CHAINS, the copies of dq_accum, key
 * block n adding into copy n % chains after the blocks n + chains, n + 2·chains, ... above it (1-8; default 2;
 * 1: one chain through every key block, Step 5's order); EMBER_FLASH_DET_LAZY=0: the writer bumps a tile's
 * counters as soon as its adds are performed (Step 5), default 1: a tile later. Both change only how long
 * blocks wait and (chains) the order of dq's adds; every setting gives the same bits on every run. */
int g_det_chains = 0, g_det_lazy = -1;
/* a read-once integer switch from 1 to 8 kept in *slot (0: not read yet; unset: dflt): the value, or -1 with the
 * error set */
int env_1_to_8(int *slot, const char *name, int dflt) {
  if (*slot == 0) {
    const char *env = getenv(name);
    if (!env || !*env) *slot = dflt;
    else {
      char *end;
      const long v = strtol(env, &end, 10);
      if (*end || v < 1 || v > 8)
        return em_error("flash_attention: expected %s to be an integer from 1 to 8, got '%s'", name, env);
      *slot = (int)v;
    }
  }
  return *slot;
}
int det_chains() { return env_1_to_8(&g_det_chains, "EMBER_FLASH_DET_CHAINS", 2); }
int det_lazy() {
  if (g_det_lazy < 0) g_det_lazy = em_env_switch("EMBER_FLASH_DET_LAZY", true) ? 1 : 0;
  return g_det_lazy;
}
/* EMBER_FLASH_DET_WRITERS, read once: fused's dq writer warps on the bulk path — 3 (default, measured on the H200:
 * docs/flash.md "Step 10": warps 1-3 take tiles jt % 3, warp 0 stages lse/Δ beside its copies, each writer bumps its
 * tile without lag), 2 ("Step 5e": even and odd tiles, warp 2 alone staging lse/Δ) or 1 (Step 5d's single writer).
 * All give the same bits: the order of dq's adds is the counters'. The count, or -1 with the error set. */
int g_det_writers = 0;
int det_writers() {
  if (g_det_writers == 0) {
    const char *env = getenv("EMBER_FLASH_DET_WRITERS");
    if (!env || !*env || strcmp(env, "3") == 0) g_det_writers = 3;
    else if (strcmp(env, "1") == 0) g_det_writers = 1;
    else if (strcmp(env, "2") == 0) g_det_writers = 2;
    else return em_error("flash_attention: expected EMBER_FLASH_DET_WRITERS to be 3, 2 or 1, got '%s'", env);
  }
  return g_det_writers;
}

/* EMBER_FLASH_DET_STORE_FIRST, read once (docs/flash.md "Step 10"): 1 — with three dq writers, each tile's first adder
 * in its copy of dq_accum stores its half instead of adding it, so dq_accum is not zeroed (only the counters are) and
 * the convert kernel reads only the copies a tile's counters say were written; 0 — the memset. The same values (an
 * exact zero's sign aside: the store keeps a −0 that 0 + −0 makes +0). Unset: 1 with three writers (the default,
 * measured on the H200), 0 with one or two; set to 1 with one or two writers: an error. 1, 0, or -1 with the error
 * set (writers: det_writers()'s count). */
int g_store_first = -1;
int det_store_first(int writers) {
  if (g_store_first < 0) {   // unset: the writers' default; set: em_env_choice reads and checks it
    const char *env = getenv("EMBER_FLASH_DET_STORE_FIRST");
    if (!env || !*env) g_store_first = writers == 3 ? 1 : 0;
  }
  return em_env_choice(&g_store_first, "flash_attention", "EMBER_FLASH_DET_STORE_FIRST", "0", "1");
}

/* EMBER_FLASH_DET_GROUPS, read once (docs/flash.md "Step 10b"): 1 — the key blocks of a (batch, kv head) in one
 * range, highest first, head after head; 2-8 — range-grouped chains: the key blocks cut into that many ranges, each
 * with its own EMBER_FLASH_DET_CHAINS chains (groups · chains copies of dq_accum), dispatched range by range (the
 * longest blocks first) across all heads. Deterministic either way; each count adds dq in its own fixed order (other
 * last bits). Three dq writers only: unset, 2 with three writers (measured on the H200: d64 T16384 backward 3.585 →
 * 3.528 ms, 2 × 8 chains within the 16 copies) and 1 with one or two. The count, or -1 with the error set. */
int g_det_groups = 0;
int det_groups(int writers) { return env_1_to_8(&g_det_groups, "EMBER_FLASH_DET_GROUPS", writers == 3 ? 2 : 1); }

/* EMBER_FLASH_BWD_DQ_FIRST, read once (docs/flash.md "Step 11"): 1 — fused's turn B issues dq(j − 1) first, in a
 * commit group of its own, and hands it to the writer while dv's and dk's wgmmas run; 2 — also dSᵀ's proxy fence
 * after turn B's first wgmmas (D 64: dk's A from registers, wg2's way; D 128: a 2-stage ring, three dSᵀ buffers,
 * dSᵀ stored in turn A, the fence and the consumer's barrier before dk's issue); 0 — as before. The same products
 * in the same order: the same bits. Set: with three dq writers and EMBER_FLASH_BWD_STEP6=1 only (otherwise an error
 * naming the switches); unset: 2 at D 64 where those hold (measured on the H200: d64 T16384 backward 3.534 → 3.25 ms),
 * else 0 (D 128: no faster). fused_nd does not read it. 0, 1, 2, or -1 with the error set. */
int g_dq_first = -1;   // -1 unread, 3 unset
int bwd_dq_first(bool two_by_default) {
  if (g_dq_first < 0) {
    const char *env = getenv("EMBER_FLASH_BWD_DQ_FIRST");
    if (!env || !*env) g_dq_first = 3;
    else if (strcmp(env, "0") == 0) g_dq_first = 0;
    else if (strcmp(env, "1") == 0) g_dq_first = 1;
    else if (strcmp(env, "2") == 0) g_dq_first = 2;
    else return em_error("flash_attention: expected EMBER_FLASH_BWD_DQ_FIRST to be 0, 1 or 2, got '%s'", env);
  }
  return g_dq_first == 3 ? (two_by_default ? 2 : 0) : g_dq_first;
}

template <typename T, int D, bool DET, bool BULK, bool S6>
int launch_fused(const Params &p, const Maps &m, int device, cudaStream_t s) {
  constexpr int ST = kStages<D>;
  // EMBER_FLASH_BWD_DQ_FIRST=2 at D 128: a 2-stage ring (room for a third dSᵀ buffer)
  constexpr int ST2 = D == 128 ? 2 : ST;
  constexpr size_t smem1 = FLayout<D, ST, BULK>::SMEM, smem2 = FLayout<D, ST2, BULK>::SMEM;
  static_assert(smem1 <= 227 * 1024 && smem2 <= 227 * 1024,
                "flash fused backward: shared memory over an H100 SM's 227 KB");
  const char *what = DET ? "flash_attention backward (wgmma fused)" : "flash_attention backward (wgmma fused_nd)";
  const int tqp = (p.Tq + STR - 1) / STR * STR;
  const int chains = DET ? det_chains() : 1, lazy = DET ? det_lazy() : 0, writers = DET && BULK ? det_writers() : 1;
  if (writers < 0) return -1;
  const int store_first = DET && BULK ? det_store_first(writers) : 0;
  if (chains < 0 || lazy < 0 || store_first < 0) return -1;
  if (store_first && writers != 3)
    return em_error("flash_attention: EMBER_FLASH_DET_STORE_FIRST=1 needs EMBER_FLASH_DET_WRITERS=3, got %d", writers);
  const int groups = DET && BULK ? det_groups(writers) : 1;
  if (groups < 0) return -1;
  if (groups > 1 && writers != 3)
    return em_error("flash_attention: EMBER_FLASH_DET_GROUPS=%d needs EMBER_FLASH_DET_WRITERS=3, got %d", groups,
                    writers);
  const int dq_first = DET ? bwd_dq_first(D == 64 && writers == 3 && S6 && BULK) : 0;
  if (dq_first < 0) return -1;
  if (dq_first && (writers != 3 || !S6 || !BULK))
    return em_error("flash_attention: EMBER_FLASH_BWD_DQ_FIRST=%d needs EMBER_FLASH_DET_WRITERS=3, "
                    "EMBER_FLASH_BWD_STEP6=1 and EMBER_FLASH_DQ=bulk, got %d, %d and %s", dq_first, writers,
                    S6 ? 1 : 0, BULK ? "bulk" : "red");
  const int copies = groups * chains;   // of dq_accum (and its counters); range g's chains at g·chains + n % chains
  if (copies > 16)   // each copy is B·H·Tq·D·4 bytes of workspace
    return em_error("flash_attention: expected EMBER_FLASH_DET_GROUPS × EMBER_FLASH_DET_CHAINS (copies of dq_accum) to "
                    "be at most 16, got %d × %d", groups, chains);
  static const int dbg = [] {
    const char *e = getenv("EMBER_FLASH_FUSED_DEBUG");
    return e ? (int)strtol(e, nullptr, 0) & (kNoFence | kNoWait | kNdHighest) : 0;
  }();
  const size_t nacc = (size_t)p.B * p.H * tqp * D, ncnt = DET ? (size_t)p.B * p.H * (tqp / STR) * 2 : 0;
  const size_t bytes = (nacc + ncnt) * 4 * copies;
  // scratch from the caching allocator on this stream: freed below, reused only by later work on it
  const em_mem_category prev = em_mem_set_category_override(EM_MEM_WORKSPACE);   // memory history, as delta
  void *buf = em_cuda_caching_alloc(bytes, device);
  em_mem_set_category_override(prev);
  if (!buf) return -1;
  float *dqa = static_cast<float *>(buf);
  unsigned *cnt = DET ? reinterpret_cast<unsigned *>(dqa + nacc * copies) : nullptr;
  // store first: only the counters zeroed (dq_accum's tiles are stored by their first adder or never read)
  int rc = (store_first ? cudaMemsetAsync(cnt, 0, ncnt * 4 * copies, s) : cudaMemsetAsync(buf, 0, bytes, s)) == cudaSuccess
               ? 0
               : em_launch_check(what);
  if (rc == 0 && p.Tk > 0) {
    // the instances three writers and dq first can launch (DQF 2 at D 128 with the 2-stage ring)
    constexpr bool W3 = DET && BULK;
    constexpr int DQ1 = W3 && S6 ? 1 : 0, DQ2 = W3 && S6 ? 2 : 0, S2 = W3 && S6 ? ST2 : ST;
    auto k1 = writers == 3 ? groups > 1 ? dq_first == 2 ? flash_bwd_fused_kernel<T, D, S2, DET, BULK, S6, W3, W3, DQ2>
                                          : dq_first    ? flash_bwd_fused_kernel<T, D, ST, DET, BULK, S6, W3, W3, DQ1>
                                                        : flash_bwd_fused_kernel<T, D, ST, DET, BULK, S6, W3, W3>
                                        : dq_first == 2 ? flash_bwd_fused_kernel<T, D, S2, DET, BULK, S6, W3, false, DQ2>
                                          : dq_first    ? flash_bwd_fused_kernel<T, D, ST, DET, BULK, S6, W3, false, DQ1>
                                                        : flash_bwd_fused_kernel<T, D, ST, DET, BULK, S6, W3>
                           : flash_bwd_fused_kernel<T, D, ST, DET, BULK, S6>;
    const size_t smem = writers == 3 && dq_first == 2 ? FLayout<D, S2, BULK>::SMEM : smem1;
    if (raise_smem(k1, smem)) rc = em_launch_check(what);
    if (rc == 0) {
      k1<<<dim3((unsigned)((p.Tk + RES - 1) / RES), (unsigned)(p.B * p.Hkv)), THREADS, smem, s>>>(
          m.q64, m.k128, m.v128, m.do64, p, dqa, cnt, tqp, chains, (int64_t)nacc,
          (lazy ? kLazy : 0) | (writers == 2 ? kTwoWriters : 0) | (store_first ? kStoreFirst : 0) | dbg |
              (groups > 1 ? groups << kGroupsShift : 0));
      rc = em_launch_check(what);
    }
  }
  if (rc == 0) {
    const int64_t n = (int64_t)p.B * p.H * (BULK ? tqp : p.Tq) * (D / 4);
    if (store_first)
      flash_dq_convert_kernel<T, D, BULK, BULK><<<(unsigned)((n + 255) / 256), 256, 0, s>>>(p, dqa, tqp, copies,
                                                                                         (int64_t)nacc, cnt);
    else
      flash_dq_convert_kernel<T, D, BULK><<<(unsigned)((n + 255) / 256), 256, 0, s>>>(p, dqa, tqp, copies,
                                                                                    (int64_t)nacc);
    rc = em_launch_check("flash_attention backward (fused dq convert)");
  }
  em_cuda_caching_free(buf, device);
  return rc;
}

template <typename T, int D, bool S6>
int launch_fused_s6(const Params &p, const Maps &m, bool det, bool bulk, int device, cudaStream_t s) {
  if (bulk)
    return det ? launch_fused<T, D, true, true, S6>(p, m, device, s) : launch_fused<T, D, false, true, S6>(p, m, device, s);
  return det ? launch_fused<T, D, true, false, S6>(p, m, device, s) : launch_fused<T, D, false, false, S6>(p, m, device, s);
}
template <typename T, int D>
int launch_fused_mode(const Params &p, const Maps &m, bool det, bool bulk, bool s6, int device, cudaStream_t s) {
  return s6 ? launch_fused_s6<T, D, true>(p, m, det, bulk, device, s) : launch_fused_s6<T, D, false>(p, m, det, bulk, device, s);
}

/* EMBER_FLASH_DQ, read once: how the fused kernel's dq leaves the block — "bulk" (default: through shared
 * memory, one bulk reduce per tile half) or "red" (Step 5's per-thread red.global.add.v4), for A/B runs.
 * 1 bulk, 0 red, -1 with the error set. */
int g_dq_mode = -1;
int dq_mode() {
  if (g_dq_mode < 0) {
    const char *env = getenv("EMBER_FLASH_DQ");
    if (!env || !*env || strcmp(env, "bulk") == 0) g_dq_mode = 1;
    else if (strcmp(env, "red") == 0) g_dq_mode = 0;
    else return em_error("flash_attention: expected EMBER_FLASH_DQ to be bulk or red, got '%s'", env);
  }
  return g_dq_mode;
}

/* EMBER_FLASH_BWD_STEP6, read once: the fused kernel's consumer loop with descriptors advanced by an add, a
 * warp-uniform consumer index and its tile indices stepped instead of divided (1; docs/flash.md "Step 6") or
 * as before (0). The default since the fifteenth session's H200 run: 2-4 % faster at every measured size but
 * fused d64 T16384 (unchanged). The same wgmmas on the same operands: the same bits. 1, 0, or -1 with the
 * error set. */
int g_step6_old = -1;
int bwd_step6() {
  const int old = em_env_choice(&g_step6_old, "flash_attention", "EMBER_FLASH_BWD_STEP6", "1", "0");
  return old < 0 ? -1 : 1 - old;
}

}  // namespace

namespace flash {

int bwd_fused_launch(const Params &p, const Maps &m, em_dtype dt, int d, bool det, int device, cudaStream_t s) {
  const int bulk = dq_mode(), s6 = bwd_step6();
  if (bulk < 0 || s6 < 0) return -1;
  if (dt == EM_BF16)
    return d == 64 ? launch_fused_mode<__nv_bfloat16, 64>(p, m, det, bulk, s6, device, s)
                   : launch_fused_mode<__nv_bfloat16, 128>(p, m, det, bulk, s6, device, s);
  return d == 64 ? launch_fused_mode<__half, 64>(p, m, det, bulk, s6, device, s)
                 : launch_fused_mode<__half, 128>(p, m, det, bulk, s6, device, s);
}

}  // namespace flash
