/* Shared by the wgmma flash backwards (flash_bwd_wg.cu: EMBER_FLASH_BWD=wg;
 * flash_bwd_wg2.cu: wg2; flash_bwd_fused.cu: fused, fused_nd): the block shape, the shared-memory layout, the
 * wgmma issue helpers, the accumulator store and the TMA maps. Anonymous
 * namespace: each kernel file gets its own copy, as when they lived in
 * flash_bwd_wg.cu. */
#pragma once
#include <cuda.h>
#include "flash_common.cuh"
#include "flash_wg.cuh"
#include "flash_wgmma.cuh"
#include "rope_math.cuh"

namespace {

using namespace flash;

constexpr int THREADS = 384;   // producer + 2 consumers
constexpr int NCONS = 256;     // consumer threads: the empty mbarriers' count
constexpr int RES = 128;       // rows of a resident tile: keys (dk/dv) or queries (dq) per block
constexpr int STR = 64;        // rows of a streamed tile: queries (dk/dv) or keys (dq)
constexpr int PAIR = 256;      // a named barrier's count (wg2, fused): the consumer syncing on it and the one arriving

/* Shared memory of both kernels: resident tiles A and B (RES rows each), a
 * ring of STAGES stages of two streamed tiles (STR rows each), then per
 * stage 2·STR floats of lse·log2 e and Δ (dk/dv only), then the mbarriers:
 * resident full, full[STAGES], empty[STAGES]. Every tile 1024-byte aligned. */
template <int D, int STAGES> struct Layout {
  static constexpr int CH = D / 64;   // 64-column (128-byte) chunks of a row
  static constexpr uint32_t RES_BYTES = RES * D * 2, STR_BYTES = STR * D * 2, STAGE = 2 * STR_BYTES;
  static constexpr uint32_t OFF_B = RES_BYTES, OFF_RING = 2 * RES_BYTES;
  static constexpr uint32_t OFF_LD = OFF_RING + STAGES * STAGE, OFF_BAR = OFF_LD + STAGES * 2 * STR * 4;
  static constexpr size_t SMEM = OFF_BAR + (1 + 2 * STAGES) * 8 + 1024;   // + slack to align the base
};
/* Stages: as many as fit with room to spare (D 128: 3 · 32 KB after 64 KB resident; D 64: 4 · 16 KB). */
template <int D> constexpr int kStages = D == 128 ? 3 : 4;

#if defined(__CUDA_ARCH__)
/* Named barriers 1 and 2, the consumers' ping-pong in wg2 and fused (0 is
 * __syncthreads; wg2 uses no others, fused also 3 and 4): immediate ids, so
 * ptxas reserves only these. */
__device__ __forceinline__ void named_sync(int id) {
  if (id == 1) asm volatile("bar.sync 1, %0;\n" ::"n"(PAIR) : "memory");
  else asm volatile("bar.sync 2, %0;\n" ::"n"(PAIR) : "memory");
}
__device__ __forceinline__ void named_arrive(int id) {
  if (id == 1) asm volatile("bar.arrive 1, %0;\n" ::"n"(PAIR) : "memory");
  else asm volatile("bar.arrive 2, %0;\n" ::"n"(PAIR) : "memory");
}

/* Pᵀ = 2^(Sᵀ·scale·log2 e − lse·log2 e), causal-masked: flash_bwd_wg.cu's
 * formula (the same bits); wg2's and fused's dk/dv. The mask's compares and
 * selects are compiled only into the diagonal tiles' copy of the loop: as
 * selects on every tile they were a tenth of the issue slots of this
 * issue-bound loop (docs/flash.md "Step 4b"). */
template <bool MASK>
__device__ __forceinline__ void dkdv_p_(float (&st)[STR / 2], const float *sl, const Params &p, int e0, int t) {
#pragma unroll
  for (int i = 0; i < STR / 2; i += 2) {
    const int c = 8 * (i >> 2) + 2 * t;
    const float2 l = *reinterpret_cast<const float2 *>(sl + c);
    float p0 = ex2_ftz(st[i] * p.scale_log2 - l.x), p1 = ex2_ftz(st[i + 1] * p.scale_log2 - l.y);
    if (MASK) {
      const int e = (i & 2) ? e0 + 8 : e0;
      if (e > 8 * (i >> 2)) p0 = 0.f;
      if (e > 8 * (i >> 2) + 1) p1 = 0.f;
    }
    st[i] = p0;
    st[i + 1] = p1;
  }
}
__device__ __forceinline__ void dkdv_p(float (&st)[STR / 2], const float *sl, const Params &p, bool diag, int e0,
                                       int t) {
  if (diag) dkdv_p_<true>(st, sl, p, e0, t);
  else dkdv_p_<false>(st, sl, p, e0, t);
}
/* dSᵀ = Pᵀ ∘ (dPᵀ − Δ), into dp. */
__device__ __forceinline__ void dkdv_ds(float (&dp)[STR / 2], const float (&st)[STR / 2], const float *sd, int t) {
#pragma unroll
  for (int i = 0; i < STR / 2; i += 2) {
    const float2 dl = *reinterpret_cast<const float2 *>(sd + 8 * (i >> 2) + 2 * t);
    dp[i] = st[i] * (dp[i] - dl.x);
    dp[i + 1] = st[i + 1] * (dp[i + 1] - dl.y);
  }
}

/* The same two steps on this thread's lse and Δ pairs loaded ahead (load_pairs: the fused kernel issues the loads
 * before its wgmma waits, EMBER_FLASH_BWD_STEP6): the same operations in the same order, so the same bits. Apart
 * from the two above, not a shared template: a template for both changed the compiled code of wg2 and of fused
 * without the switch (checked with tools/sass_ctl.py --diff), which stays as measured. */
__device__ __forceinline__ void load_pairs(float2 (&l)[STR / 8], const float *sl, int t) {
#pragma unroll
  for (int m = 0; m < STR / 8; m++) l[m] = *reinterpret_cast<const float2 *>(sl + 8 * m + 2 * t);
}
template <bool MASK>
__device__ __forceinline__ void dkdv_p_pre_(float (&st)[STR / 2], const float2 (&l)[STR / 8], const Params &p,
                                            int e0) {
#pragma unroll
  for (int i = 0; i < STR / 2; i += 2) {
    float p0 = ex2_ftz(st[i] * p.scale_log2 - l[i >> 2].x), p1 = ex2_ftz(st[i + 1] * p.scale_log2 - l[i >> 2].y);
    if (MASK) {
      const int e = (i & 2) ? e0 + 8 : e0;
      if (e > 8 * (i >> 2)) p0 = 0.f;
      if (e > 8 * (i >> 2) + 1) p1 = 0.f;
    }
    st[i] = p0;
    st[i + 1] = p1;
  }
}
__device__ __forceinline__ void dkdv_p_pre(float (&st)[STR / 2], const float2 (&l)[STR / 8], const Params &p,
                                           bool diag, int e0) {
  if (diag) dkdv_p_pre_<true>(st, l, p, e0);
  else dkdv_p_pre_<false>(st, l, p, e0);
}
__device__ __forceinline__ void dkdv_ds_pre(float (&dp)[STR / 2], const float (&st)[STR / 2],
                                            const float2 (&dl)[STR / 8]) {
#pragma unroll
  for (int i = 0; i < STR / 2; i += 2) {
    dp[i] = st[i] * (dp[i] - dl[i >> 2].x);
    dp[i + 1] = st[i + 1] * (dp[i + 1] - dl[i >> 2].y);
  }
}

/* Sᵀ-like products: acc (64 x 64) = A (64 rows at a, K-major, RES-row
 * chunks) times Bᵀ (64 rows at bt, K-major, STR-row chunks) over D, one
 * commit group. */
template <typename T, int D>
__device__ __forceinline__ void issue_ss(float (&acc)[STR / 2], uint32_t a, uint32_t bt) {
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const uint32_t off = (kk & 3) * 32;   // 16 columns = 32 bytes into the chunk's 128-byte rows
    const uint64_t da = wg_desc(a + (kk >> 2) * RES * 128 + off, 16, 1024);
    const uint64_t db = wg_desc(bt + (kk >> 2) * STR * 128 + off, 16, 1024);
    Wgmma<T, STR>::ss(acc, da, db, kk > 0);
  }
  wgmma_commit();
}

/* acc (64 x D) += A (64 x STR, register fragments) times the streamed tile
 * at b (STR rows x D, N-major: 16 rows = two 8-row groups per k step, the
 * 64-column chunks STR · 128 bytes apart). Not committed. */
template <typename T, int D>
__device__ __forceinline__ void issue_rs(float (&acc)[D / 2], const uint32_t (&a)[STR / 16][4], uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < STR / 16; kk++) Wgmma<T, D>::rs(acc, a[kk], wg_desc(b + kk * 16 * 128, STR * 128, 1024), 1);
}

/* issue_ss and issue_rs on descriptor low words (wg_desc_lo: a, bt K-major with lbo 16; b N-major with lbo
 * STR · 128) advanced per k step by adding the offset (fused's EMBER_FLASH_BWD_STEP6; docs/flash.md "Step 6"):
 * the same descriptors, the same wgmmas. */
template <typename T, int D>
__device__ __forceinline__ void issue_ss_lo(float (&acc)[STR / 2], uint32_t a, uint32_t bt) {
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const uint32_t off = (kk & 3) * 32;
    Wgmma<T, STR>::ss(acc, wg_desc_at(a, (kk >> 2) * RES * 128 + off), wg_desc_at(bt, (kk >> 2) * STR * 128 + off),
                      kk > 0);
  }
  wgmma_commit();
}
template <typename T, int D>
__device__ __forceinline__ void issue_rs_lo(float (&acc)[D / 2], const uint32_t (&a)[STR / 16][4], uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < STR / 16; kk++) Wgmma<T, D>::rs(acc, a[kk], wg_desc_at(b, kk * 16 * 128), 1);
}

/* A consumer's 64 x D accumulator, times scale, into rows r0 and r0 + 8 of
 * dst (row stride ld), rows at or past n skipped, columns at or past ncol too
 * (the tensors' head dim p.Dv: 80 or 96 run on the D = 128 kernels). */
template <typename T, int D>
__device__ __forceinline__ void store_rows(T *dst, int64_t ld, const float (&acc)[D / 2], int r0, int n, int ncol,
                                           int t, float scale) {
#pragma unroll
  for (int i = 0; i < D / 8; i++) {
    const int col = i * 8 + 2 * t;
    if (col >= ncol) break;
    if (r0 < n) store2(dst + (int64_t)r0 * ld + col, acc[4 * i] * scale, acc[4 * i + 1] * scale);
    if (r0 + 8 < n) store2(dst + (int64_t)(r0 + 8) * ld + col, acc[4 * i + 2] * scale, acc[4 * i + 3] * scale);
  }
}

/* Row r's position under F.flash_attention's rope option; off: the row's batch and head offset into them. */
__device__ __forceinline__ double rope_position(const Params &p, int64_t off, int r) {
  const int64_t i = off + (int64_t)r * p.rp_st;
  return p.rope == 1 ? (double)static_cast<const int64_t *>(p.rope_pos)[i]
                     : (double)static_cast<const int32_t *>(p.rope_pos)[i];
}

/* store_rows under the rope option: each pair (2j, 2j+1) of a row rounded to T as store_rows stores it, then
 * rotated back by −angle(the row's position, j) and rounded again: the bits of store_rows followed by the rope
 * kernel's backward (rope_math.cuh: the same arithmetic). pos_off: the rows' batch and head offset into the
 * positions. One sin/cos a pair, once per block (the epilogue), where the rope kernel reads and writes the
 * gradient again. */
template <typename T, int D>
__device__ __forceinline__ void store_rows_rope(T *dst, int64_t ld, const float (&acc)[D / 2], int r0, int n,
                                                int ncol, int t, float scale, const Params &p, int64_t pos_off) {
  const double pos0 = r0 < n ? rope_position(p, pos_off, r0) : 0.0;
  const double pos1 = r0 + 8 < n ? rope_position(p, pos_off, r0 + 8) : 0.0;
#pragma unroll
  for (int i = 0; i < D / 8; i++) {
    const int col = i * 8 + 2 * t;
    if (col >= ncol) break;
    // pair 4i + t: constant indices into the parameter (a lane-dependent one would copy p to local memory)
    const double inv = t == 0 ? p.rope_inv[4 * i] : t == 1 ? p.rope_inv[4 * i + 1]
                     : t == 2 ? p.rope_inv[4 * i + 2] : p.rope_inv[4 * i + 3];
#pragma unroll
    for (int u = 0; u < 2; u++) {
      const int r = r0 + 8 * u;
      if (r >= n) continue;
      const float a = to_f32(from_f32<T>(acc[4 * i + 2 * u] * scale));
      const float w = to_f32(from_f32<T>(acc[4 * i + 2 * u + 1] * scale));
      float c, sn, y0, y1;
      rope::angle_cs(u ? pos1 : pos0, inv, c, sn);
      rope::rotate(a, w, c, -sn, y0, y1);
      store2(dst + (int64_t)r * ld + col, y0, y1);
    }
  }
}

/* The dk/dv kernels' epilogue: this consumer's dk (times the softmax scale)
 * and dv rows key0, key0 + 8 of kv head hk, batch b; RP (the rope option):
 * dk rotated back (store_rows_rope). */
template <typename T, int D, bool RP = false>
__device__ __forceinline__ void store_dkdv(const Params &p, int b, int hk, const float (&dk)[D / 2],
                                           const float (&dv)[D / 2], int key0, int t) {
  T *gk = static_cast<T *>(p.dk) + b * p.dk_sb + hk * p.dk_sh;
  T *gv = static_cast<T *>(p.dv) + b * p.dv_sb + hk * p.dv_sh;
  if constexpr (RP)
    store_rows_rope<T, D>(gk, p.dk_st, dk, key0, p.Tk, p.Dv, t, p.scale, p, b * p.rp_sb + hk * p.rp_sh);
  else
    store_rows<T, D>(gk, p.dk_st, dk, key0, p.Tk, p.Dv, t, p.scale);
  store_rows<T, D>(gv, p.dv_st, dv, key0, p.Tk, p.Dv, t, 1.f);
}

/* A dk/dv block's tiles: key block nb of kv head hk, batch b (bhk: blockIdx.y unless given);
 * the q tiles of STR rows from qstart (causal: the first row that sees key
 * k0 is k0 - off, on a tile boundary), nq of them per q head, ntile over the
 * kv head's group. */
struct DkdvTiles {
  int b, hk, k0, qstart, nq, ntile;
};
__device__ __forceinline__ DkdvTiles dkdv_tiles(const Params &p, int nb, int bhk) {
  DkdvTiles d;
  d.b = bhk / p.Hkv;
  d.hk = bhk % p.Hkv;
  d.k0 = nb * RES;
  d.qstart = p.causal ? (max(0, d.k0 - p.off) / STR) * STR : 0;
  d.nq = max(0, (p.Tq - d.qstart + STR - 1) / STR);
  d.ntile = p.group * d.nq;
  return d;
}
__device__ __forceinline__ DkdvTiles dkdv_tiles(const Params &p, int nb) { return dkdv_tiles(p, nb, blockIdx.y); }

/* A dq consumer's two rows' lse·log2 e; rows past Tq get +inf, so P = 0
 * there (their q and dO rows are TMA's zeros). */
__device__ __forceinline__ void dq_row_lse(const Params &p, int bh, int row0, int row1, float &l0, float &l1) {
  const float *lse = p.lse + (int64_t)bh * p.Tq;
  l0 = row0 < p.Tq ? __fmul_rn(lse[row0], kLog2e) : INFINITY;
  l1 = row1 < p.Tq ? __fmul_rn(lse[row1], kLog2e) : INFINITY;
}

/* ... and their Δ, read (0 past Tq). */
__device__ __forceinline__ void dq_row_stats(const Params &p, int bh, int row0, int row1, float &l0, float &l1,
                                             float &d0, float &d1) {
  const float *delta = p.delta + (int64_t)bh * p.Tq;
  dq_row_lse(p, bh, row0, row1, l0, l1);
  d0 = row0 < p.Tq ? delta[row0] : 0.f;
  d1 = row1 < p.Tq ? delta[row1] : 0.f;
}

/* Thread 0 initialises the block's barriers: the one-shot one for the
 * resident tiles (k, v or q, dO), and each ring stage's full one (full_count
 * arrivals: the copies' expect_tx, plus the dk/dv producer's lse/Δ threads)
 * and empty one (every consumer thread); then the block syncs. */
template <int STAGES>
__device__ __forceinline__ void init_barriers(uint32_t once, uint32_t full, uint32_t empty, uint32_t full_count) {
  if (threadIdx.x == 0) {
    mbar_init(once, 1);
    for (int s = 0; s < STAGES; s++) {
      mbar_init(full + 8 * s, full_count);
      mbar_init(empty + 8 * s, NCONS);
    }
    mbar_init_fence();
  }
  __syncthreads();
}

/* The dk/dv kernels' producer warpgroup (after setmaxnreg): k, v once, then
 * q(j), dO(j) (thread 0) and lse·log2 e, Δ (warps 2-3; ld_warps 1: warp 2
 * alone, two rows a lane, so that fused's second dq writer gets warp 3;
 * ld_warps 0: warp 0 itself, two rows a lane beside lane 0's copies, so that
 * fused's third dq writer gets warp 2) into stage j % STAGES of the ring,
 * each stage once both consumers released its last tile. The full barriers
 * count 1 + 32·ld_warps arrivals (ld_warps 0: 1 + 32). */
template <int D, int STAGES>
__device__ __forceinline__ void dkdv_producer(const CUtensorMap *tq, const CUtensorMap *tk, const CUtensorMap *tv,
                                              const CUtensorMap *tdo, const Params &p, uint32_t sK, uint32_t sV,
                                              uint32_t ring, float *sLD, uint32_t bar_kv, uint32_t full,
                                              uint32_t empty, int b, int hk, int k0, int qstart, int nq, int ntile,
                                              int ld_warps = 2, bool dep_wait = false) {
  using L = Layout<D, STAGES>;
  // ---- producer: k, v once; then q(j), dO(j) (thread 0) and lse, Δ (warps 2-3) into stage j % STAGES ----
  setmaxnreg_dec<24>();
  // row r of tile j's lse·log2 e (rounded on its own, no fused multiply-add, as flash_bwd.cu; +inf past Tq makes
  // P = 0) and Δ into stage s
  auto stage_row = [&](int s, int j, int r) {
    const int hg = j / nq, i = qstart + (j - hg * nq) * STR + r;
    const int64_t at = (int64_t)(b * p.H + hk * p.group + hg) * p.Tq + i;
    sLD[s * 2 * STR + r] = i < p.Tq ? __fmul_rn(p.lse[at], kLog2e) : INFINITY;
    sLD[s * 2 * STR + STR + r] = i < p.Tq ? p.delta[at] : 0.f;
  };
  if (ld_warps == 0) {
    // warp 0 alone: lane 0's copies of each stage, then every lane's two rows and its arrival (the lse/Δ loads'
    // latency after the stage's copies are on their way, not before)
    if (threadIdx.x >= 32 || ntile == 0) return;
    const int lane = threadIdx.x;
    if (lane == 0) {
      tma_prefetch_map(tq); tma_prefetch_map(tk); tma_prefetch_map(tv); tma_prefetch_map(tdo);
      mbar_expect_tx(bar_kv, 2 * L::RES_BYTES);
#pragma unroll
      for (int c = 0; c < L::CH; c++) tma_load_4d(sK + c * RES * 128, tk, bar_kv, c * 64, k0, hk, b);
#pragma unroll
      for (int c = 0; c < L::CH; c++) tma_load_4d(sV + c * RES * 128, tv, bar_kv, c * 64, k0, hk, b);
    }
    for (int j = 0; j < ntile; j++) {
      const int s = j % STAGES;
      if (j >= STAGES) mbar_wait(empty + 8 * s, (j / STAGES - 1) & 1);
      if (lane == 0) {
        const int hg = j / nq, i0 = qstart + (j - hg * nq) * STR, h = hk * p.group + hg;
        const uint32_t st = ring + s * L::STAGE, bar = full + 8 * s;
        mbar_expect_tx(bar, L::STAGE);
#pragma unroll
        for (int c = 0; c < L::CH; c++) tma_load_4d(st + c * STR * 128, tq, bar, c * 64, i0, h, b);
#pragma unroll
        for (int c = 0; c < L::CH; c++) tma_load_4d(st + L::STR_BYTES + c * STR * 128, tdo, bar, c * 64, i0, h, b);
      }
      stage_row(s, j, lane);
      stage_row(s, j, lane + 32);
      mbar_arrive(full + 8 * s);   // release: the stores above are visible to whoever waits on the phase
    }
    return;
  }
  if (threadIdx.x == 0 && ntile > 0) {
    tma_prefetch_map(tq); tma_prefetch_map(tk); tma_prefetch_map(tv); tma_prefetch_map(tdo);
    mbar_expect_tx(bar_kv, 2 * L::RES_BYTES);
#pragma unroll
    for (int c = 0; c < L::CH; c++) tma_load_4d(sK + c * RES * 128, tk, bar_kv, c * 64, k0, hk, b);
#pragma unroll
    for (int c = 0; c < L::CH; c++) tma_load_4d(sV + c * RES * 128, tv, bar_kv, c * 64, k0, hk, b);
    for (int j = 0; j < ntile; j++) {
      const int s = j % STAGES, hg = j / nq, i0 = qstart + (j - hg * nq) * STR, h = hk * p.group + hg;
      // stage s last held tile j - STAGES: wait until both consumers released it
      if (j >= STAGES) mbar_wait(empty + 8 * s, (j / STAGES - 1) & 1);
      const uint32_t st = ring + s * L::STAGE, bar = full + 8 * s;
      mbar_expect_tx(bar, L::STAGE);
#pragma unroll
      for (int c = 0; c < L::CH; c++) tma_load_4d(st + c * STR * 128, tq, bar, c * 64, i0, h, b);
#pragma unroll
      for (int c = 0; c < L::CH; c++) tma_load_4d(st + L::STR_BYTES + c * STR * 128, tdo, bar, c * 64, i0, h, b);
    }
  } else if (threadIdx.x >= 64 && threadIdx.x < 64 + 32 * ld_warps) {
    // warps 2 and 3: row r of every tile's lse·log2 e and Δ (one row a thread keeps this within 24 registers);
    // ld_warps 1: warp 2 rows r and r + 32. (stage_row's code written out: through it ptxas schedules wg2's and
    // fused's producers differently; written out, their kernels stay byte-identical to before "Step 10".)
    // dep_wait (wg2 under EMBER_FLASH_STEP9): Δ is the dq kernel's, which
    // may still run (EMBER_FLASH_PDL): wait for it here, in every block (ntile 0 too), so that this grid's
    // completion implies dq's
    if (dep_wait) grid_dep_wait();
    const int r = threadIdx.x - 64;
    for (int j = 0; j < ntile; j++) {
      const int s = j % STAGES, hg = j / nq, i = qstart + (j - hg * nq) * STR + r;
      if (j >= STAGES) mbar_wait(empty + 8 * s, (j / STAGES - 1) & 1);
      const int64_t at = (int64_t)(b * p.H + hk * p.group + hg) * p.Tq + i;
      // lse·log2 e rounded on its own (no fused multiply-add), as flash_bwd.cu; +inf past Tq makes P = 0
      sLD[s * 2 * STR + r] = i < p.Tq ? __fmul_rn(p.lse[at], kLog2e) : INFINITY;
      sLD[s * 2 * STR + STR + r] = i < p.Tq ? p.delta[at] : 0.f;
      if (ld_warps == 1) {
        sLD[s * 2 * STR + r + 32] = i + 32 < p.Tq ? __fmul_rn(p.lse[at + 32], kLog2e) : INFINITY;
        sLD[s * 2 * STR + STR + r + 32] = i + 32 < p.Tq ? p.delta[at + 32] : 0.f;
      }
      mbar_arrive(full + 8 * s);   // release: the stores above are visible to whoever waits on the phase
    }
  }
}

/* The dq kernels' producer warpgroup: q, dO once, then k(j), v(j) into stage
 * j % STAGES. OUT (wg2's EMBER_FLASH_DELTA9): also the block's rows of o into
 * sOut, on their own barrier bar_o, issued after stage 0's k, v so that the
 * first S and dP wait for no more bytes than before. */
template <int D, int STAGES, bool OUT = false>
__device__ __forceinline__ void dq_producer(const CUtensorMap *tq, const CUtensorMap *tk, const CUtensorMap *tv,
                                            const CUtensorMap *tdo, uint32_t sQ, uint32_t sO, uint32_t ring,
                                            uint32_t bar_q, uint32_t full, uint32_t empty, int b, int h, int hk,
                                            int q0, int ntile, const CUtensorMap *to = nullptr, uint32_t sOut = 0,
                                            uint32_t bar_o = 0) {
  using L = Layout<D, STAGES>;
  // ---- producer: q, dO once; then k(j), v(j) into stage j % STAGES ----
  setmaxnreg_dec<24>();
  if (threadIdx.x == 0 && ntile > 0) {
    tma_prefetch_map(tq); tma_prefetch_map(tk); tma_prefetch_map(tv); tma_prefetch_map(tdo);
    if constexpr (OUT) tma_prefetch_map(to);
    mbar_expect_tx(bar_q, 2 * L::RES_BYTES);
#pragma unroll
    for (int c = 0; c < L::CH; c++) tma_load_4d(sQ + c * RES * 128, tq, bar_q, c * 64, q0, h, b);
#pragma unroll
    for (int c = 0; c < L::CH; c++) tma_load_4d(sO + c * RES * 128, tdo, bar_q, c * 64, q0, h, b);
    for (int j = 0; j < ntile; j++) {
      const int s = j % STAGES;
      if (j >= STAGES) mbar_wait(empty + 8 * s, (j / STAGES - 1) & 1);
      const uint32_t st = ring + s * L::STAGE, bar = full + 8 * s;
      mbar_expect_tx(bar, L::STAGE);
#pragma unroll
      for (int c = 0; c < L::CH; c++) tma_load_4d(st + c * STR * 128, tk, bar, c * 64, j * STR, hk, b);
#pragma unroll
      for (int c = 0; c < L::CH; c++) tma_load_4d(st + L::STR_BYTES + c * STR * 128, tv, bar, c * 64, j * STR, hk, b);
      if constexpr (OUT) {
        if (j == 0) {
          mbar_expect_tx(bar_o, L::RES_BYTES);
#pragma unroll
          for (int c = 0; c < L::CH; c++) tma_load_4d(sOut + c * RES * 128, to, bar_o, c * 64, q0, h, b);
        }
      }
    }
  }
}

#endif

template <typename K>
int raise_smem(K kern, size_t smem) {
  return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess ? 0 : -1;
}

}  // namespace

namespace flash {

/* Maps: dk/dv streams 64-row q and dO boxes over 128-row k and v; dq the other way round. */
struct Maps {
  CUtensorMap q64, do64, k128, v128, q128, do128, k64, v64;
};

/* EMBER_FLASH_BWD=wg2 (flash_bwd_wg2.cu): the dk/dv and dq kernels with
 * ping-pong and intra-consumer overlap, on maps bwd_wg_dispatch made; dt
 * bf16 or f16, d 64 or 128 (checked by the caller); the delta kernel first
 * unless EMBER_FLASH_STEP9 folds Δ into the dq kernel. 0 or -1 with the error set. */
int bwd_wg2_launch(const Params &p, const Maps &m, em_dtype dt, int d, DeltaLaunch delta, cudaStream_t s);
/* Whether bwd_wg2_launch takes the short-sequence schedule (EMBER_FLASH_STEP9 on, s9, and both grids short:
 * tile_grid_hf), the one whose kernels can rotate dq and dk back under the rope option. */
inline bool bwd2_short(const Params &p, bool s9) {
  return tile_grid_hf(s9, (unsigned)((p.Tq + RES - 1) / RES)) && tile_grid_hf(s9, (unsigned)((p.Tk + RES - 1) / RES));
}
/* EMBER_FLASH_BWD=fused (det) or fused_nd (flash_bwd_fused.cu): one kernel for
 * dk, dv and dq (dq through an f32 buffer it allocates on s), then dq's
 * conversion; same arguments and checks as bwd_wg2_launch. */
int bwd_fused_launch(const Params &p, const Maps &m, em_dtype dt, int d, bool det, int device, cudaStream_t s);

}  // namespace flash
