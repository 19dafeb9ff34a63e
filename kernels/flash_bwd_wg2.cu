/* FlashAttention backward for Hopper, version 2 (EMBER_FLASH_BWD=wg2): the
 * dk/dv and dq kernels of flash_bwd_wg.cu (same block, ring, producers,
 * masks, tile order and sums: docs/flash.md "Step 4") with the forward's
 * overlap of elementwise work and matmuls (flash_fwd_wg2.cu, "Step 3"):
 *
 *  1. ping-pong: named barriers 1 and 2 (one per consumer, 256 threads: its
 *     own bar.sync and the other's bar.arrive) hand the right to issue wgmmas
 *     back and forth, so one consumer's exponentials and dS run while the
 *     other's matmuls hold the tensor cores. Consumer 1 arrives once up
 *     front, so consumer 0 goes first; both take the same number of turns
 *     (a tile a consumer skips under the causal mask is an empty turn), so
 *     no bar.sync waits for a turn that never comes.
 *  2. intra-consumer overlap (PIPE): turn j issues Sᵀ(j) and dPᵀ(j), then the
 *     previous visible tile's dv += Pᵀ dO, dk += dSᵀ q, as three commit
 *     groups; wait_group 2 (Sᵀ done) runs the exponentials, wait_group 1 dSᵀ,
 *     wait_group 0 frees the previous tile's stage and A fragments, and only
 *     then are this tile's Pᵀ, dSᵀ packed. A last turn issues the last tile's
 *     dv/dk. Needs the packed Pᵀ/dSᵀ (32 registers) beside Sᵀ/dPᵀ (64) and
 *     dk/dv (D): the dq kernel at both head dims and dk/dv at D 64. The dk/dv
 *     kernel at D 128 (128 accumulators) has no room: it takes two turns a
 *     tile instead (Sᵀ/dPᵀ, then dv/dk), each consumer's elementwise work
 *     under the other's matmuls.
 *
 * Every accumulator sees the same wgmmas, with the same A fragments, in the
 * same tile order as in wg: the results are wg's bits (and so mma's).
 *
 * At short T (EMBER_FLASH_STEP9) dq runs first and computes Δ = rowsum(dO ∘ o)
 * for dk/dv; with EMBER_FLASH_DELTA9 from shared tiles (o by one more TMA
 * tile, 16 or 32 KB), under its first S and dP wgmmas (docs/flash.md "Step 9b"). */
#include <cuda.h>
#include <type_traits>
#include "backend.h"
#include "flash_common.cuh"
#include "flash_wg.cuh"
#include "flash_wgmma.cuh"
#include "flash_bwd_wg.cuh"

using namespace flash;

namespace {

/* dk/dv at D 128 cannot hold the next tile's Sᵀ/dPᵀ beside the packed Pᵀ/dSᵀ. */
template <int D> constexpr bool kDkdvPipe = D == 64;

#if defined(__CUDA_ARCH__)
/* P = 2^(S·scale·log2 e − lse·log2 e) for the dq kernel, keys past Tk and
 * (causal) past the row's diagonal zeroed: the masks only in the edge tiles'
 * copy, as dkdv_p (flash_bwd_wg.cuh). */
template <bool MASK>
__device__ __forceinline__ void dq_p(float (&sc)[STR / 2], const Params &p, int k0, int row0, int row1, float l0,
                                     float l1, int t) {
#pragma unroll
  for (int i = 0; i < STR / 2; i++) {
    const int col = k0 + 8 * (i >> 2) + 2 * t + (i & 1), row = (i & 2) ? row1 : row0;
    float pr = ex2_ftz(sc[i] * p.scale_log2 - ((i & 2) ? l1 : l0));
    if (MASK && (col >= p.Tk || (p.causal && col > row + p.off))) pr = 0.f;
    sc[i] = pr;
  }
}
#endif

/* RP (F.flash_attention's rope option, only with HF): dk leaves rotated back by −angle (store_rows_rope). */
template <typename T, int D, int STAGES, bool PIPE, bool HF, bool RP>
__global__ void __launch_bounds__(THREADS, 1)
    flash_dkdv_wg2_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                          const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                          const Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<D, STAGES>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  const uint32_t sK = base, sV = base + L::OFF_B, ring = base + L::OFF_RING;
  float *sLD = reinterpret_cast<float *>(smem_raw + (base - raw) + L::OFF_LD);   // stage s: lse at 2·STR·s, Δ STR on
  const uint32_t bar_kv = base + L::OFF_BAR, full = bar_kv + 8, empty = full + 8 * STAGES;   // + 8·stage

  // HF (EMBER_FLASH_STEP9): the grid is (kv heads, key blocks), key block 0 (the heaviest) of every head first
  const DkdvTiles tiles = dkdv_tiles(p, tile_index<HF>(), head_index<HF>());
  const int b = tiles.b, hk = tiles.hk, k0 = tiles.k0, qstart = tiles.qstart, nq = tiles.nq, ntile = tiles.ntile;
  const int wg = threadIdx.x >> 7;

  init_barriers<STAGES>(bar_kv, full, empty, 1 + STR);   // full: the copies' expect_tx and the STR lse/Δ threads

  if (wg == 0) {
    dkdv_producer<D, STAGES>(&tq, &tk, &tv, &tdo, p, sK, sV, ring, sLD, bar_kv, full, empty, b, hk, k0, qstart, nq,
                             ntile, 2, HF);
    return;
  }

  // ---- consumers: 64 keys each ----
  setmaxnreg_inc<240>();
  const int cw = wg - 1, tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int kw0 = k0 + cw * 64, key0 = kw0 + warp * 16 + g;   // rows key0 and key0 + 8 of dk, dv
  const uint32_t ka = sK + cw * 64 * 128, va = sV + cw * 64 * 128;   // this consumer's rows of k, v
  // ping-pong: turn i issues after bar.sync on my_bar and passes to the other
  // consumer; consumer 1's last arrival would have no taker, so it is left out
  const int my_bar = 1 + cw, other_bar = 2 - cw, turns = ntile > 0 ? (PIPE ? ntile + 1 : 2 * ntile) : 0;
  auto pass_turn = [&](int i) {
    if (cw == 0 || i < turns - 1) named_arrive(other_bar);
  };
  if (cw == 1 && turns > 0) named_arrive(1);

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.f;
  if (ntile > 0) mbar_wait(bar_kv, 0);

  // a tile none of whose queries sees these keys: an empty turn (a stage
  // pending dv/dk may stay held over it: at most one such tile in a row)
  auto seen = [&](int j) { return !(p.causal && kw0 > qstart + (j % nq) * STR + STR - 1 + p.off); };
  auto empty_turn = [&](int j) {
    const int s = j % STAGES;
    mbar_wait(full + 8 * s, (j / STAGES) & 1);
    named_sync(my_bar);
    pass_turn(j);
    mbar_arrive(empty + 8 * s);
  };
  if constexpr (PIPE) {
    // turn j: Sᵀ(j), dPᵀ(j), then the pending (last seen) tile's dv/dk; turn
    // ntile: the last dv/dk. The first seen tile's turn is peeled so that no
    // wgmma sits in a branch (ptxas would serialise them all)
    uint32_t pa[STR / 16][4], da[STR / 16][4];   // the pending tile's Pᵀ and dSᵀ
    int j = 0, ps = 0;                           // ps: the pending tile's stage
    for (; j < ntile && !seen(j); j++) empty_turn(j);
    if (j < ntile) {
      {
        const int s = j % STAGES, i0 = qstart + (j % nq) * STR;
        const uint32_t sq = ring + s * L::STAGE, so = sq + L::STR_BYTES;
        const float *sl = sLD + s * 2 * STR, *sd = sl + STR;
        float st[STR / 2], dp[STR / 2];
        mbar_wait(full + 8 * s, (j / STAGES) & 1);
        named_sync(my_bar);
        wgmma_fence();
        issue_ss<T, D>(st, ka, sq);   // Sᵀ = k qᵀ
        issue_ss<T, D>(dp, va, so);   // dPᵀ = v dOᵀ
        pass_turn(j);
        wgmma_wait<1>();
        reg_fence(st);
        dkdv_p(st, sl, p, p.causal && kw0 + warp * 16 + 15 > i0 + p.off, key0 - i0 - p.off - 2 * t, t);
        wgmma_wait<0>();
        reg_fence(dp);
        dkdv_ds(dp, st, sd, t);
        pack_a<T>(pa, st);
        pack_a<T>(da, dp);
        ps = s;
      }
      for (j++; j < ntile; j++) {
        if (!seen(j)) {
          empty_turn(j);
          continue;
        }
        const int s = j % STAGES, i0 = qstart + (j % nq) * STR;
        const uint32_t sq = ring + s * L::STAGE, so = sq + L::STR_BYTES;
        const uint32_t psq = ring + ps * L::STAGE, pso = psq + L::STR_BYTES;
        const float *sl = sLD + s * 2 * STR, *sd = sl + STR;
        float st[STR / 2], dp[STR / 2];
        mbar_wait(full + 8 * s, (j / STAGES) & 1);
        named_sync(my_bar);
        reg_fence(dv);
        reg_fence(dk);
        wgmma_fence();
        issue_ss<T, D>(st, ka, sq);    // Sᵀ = k qᵀ
        issue_ss<T, D>(dp, va, so);    // dPᵀ = v dOᵀ
        issue_rs<T, D>(dv, pa, pso);   // the pending tile's dv += Pᵀ dO
        issue_rs<T, D>(dk, da, psq);   // and dk += dSᵀ q
        wgmma_commit();
        pass_turn(j);
        wgmma_wait<2>();   // Sᵀ done
        reg_fence(st);
        dkdv_p(st, sl, p, p.causal && kw0 + warp * 16 + 15 > i0 + p.off, key0 - i0 - p.off - 2 * t, t);
        wgmma_wait<1>();   // dPᵀ done
        reg_fence(dp);
        dkdv_ds(dp, st, sd, t);
        wgmma_wait<0>();   // the pending dv/dk done: its stage and A fragments are free
        reg_fence(dv);
        reg_fence(dk);
        reg_fence(st);
        reg_fence(dp);
        mbar_arrive(empty + 8 * ps);
        pack_a<T>(pa, st);
        pack_a<T>(da, dp);
        ps = s;
      }
      // turn ntile: the last seen tile's dv/dk
      const uint32_t psq = ring + ps * L::STAGE, pso = psq + L::STR_BYTES;
      named_sync(my_bar);
      reg_fence(dv);
      reg_fence(dk);
      wgmma_fence();
      issue_rs<T, D>(dv, pa, pso);
      issue_rs<T, D>(dk, da, psq);
      wgmma_commit();
      pass_turn(ntile);
      wgmma_wait<0>();
      reg_fence(dv);
      reg_fence(dk);
      mbar_arrive(empty + 8 * ps);
    } else if (turns > 0) {   // no tile seen: the last turn is empty too
      named_sync(my_bar);
      pass_turn(ntile);
    }
  } else {
    // two turns a tile: Sᵀ/dPᵀ, then dv/dk
    for (int j = 0; j < ntile; j++) {
      const int s = j % STAGES, i0 = qstart + (j % nq) * STR;
      mbar_wait(full + 8 * s, (j / STAGES) & 1);
      if (p.causal && kw0 > i0 + STR - 1 + p.off) {   // no query of the tile sees these keys: two empty turns
        named_sync(my_bar);
        pass_turn(2 * j);
        named_sync(my_bar);
        pass_turn(2 * j + 1);
        mbar_arrive(empty + 8 * s);
        continue;
      }
      const uint32_t sq = ring + s * L::STAGE, so = sq + L::STR_BYTES;
      const float *sl = sLD + s * 2 * STR, *sd = sl + STR;
      float st[STR / 2], dp[STR / 2];
      named_sync(my_bar);
      wgmma_fence();
      issue_ss<T, D>(st, ka, sq);   // Sᵀ = k qᵀ
      issue_ss<T, D>(dp, va, so);   // dPᵀ = v dOᵀ
      pass_turn(2 * j);
      wgmma_wait<1>();   // Sᵀ done; dPᵀ may still run under the exponentials
      reg_fence(st);
      const bool diag = p.causal && kw0 + warp * 16 + 15 > i0 + p.off;
      dkdv_p(st, sl, p, diag, key0 - i0 - p.off - 2 * t, t);
      wgmma_wait<0>();
      reg_fence(dp);
      dkdv_ds(dp, st, sd, t);
      uint32_t pa[STR / 16][4], da[STR / 16][4];
      pack_a<T>(pa, st);
      pack_a<T>(da, dp);
      named_sync(my_bar);
      reg_fence(dv);
      reg_fence(dk);
      wgmma_fence();
      issue_rs<T, D>(dv, pa, so);   // dv += Pᵀ dO
      issue_rs<T, D>(dk, da, sq);   // dk += dSᵀ q
      wgmma_commit();
      pass_turn(2 * j + 1);
      wgmma_wait<0>();
      reg_fence(dv);
      reg_fence(dk);
      mbar_arrive(empty + 8 * s);
    }
  }

  store_dkdv<T, D, RP>(p, b, hk, dk, dv, key0, t);
#else
  __trap();   // built without sm_90a: bwd_wg_dispatch never launches this
#endif
}

/* EMBER_FLASH_DELTA9's dq kernel: the o tile (RES rows, as q and dO) after the ring's barriers, 1024-aligned for
 * TMA's 128-byte swizzle; its own barrier first. D 64: 116 KB in all (99 before), D 128: 196 KB (163). */
template <int D, int STAGES> struct DqOutLayout {
  using L = Layout<D, STAGES>;
  static constexpr uint32_t OFF_BAR_O = L::OFF_BAR + (1 + 2 * STAGES) * 8;
  static constexpr uint32_t OFF_OUT = (OFF_BAR_O + 8 + 1023u) & ~1023u;
  static constexpr size_t SMEM = OFF_OUT + L::RES_BYTES + 1024;   // + slack to align the base
};
/* The dq kernel's template argument D9 (EMBER_FLASH_DELTA9) picks its last parameter: o's tensor map, or nothing. */
struct NoMap {};
template <bool D9> using OutMap = std::conditional_t<D9, CUtensorMap, NoMap>;

#if defined(__CUDA_ARCH__)
/* Δ of the two rows from global memory (delta_row: the delta kernel's sum), 0 past Tq. */
template <typename T, int D>
__device__ __forceinline__ void dq_delta_global(const Params &p, int b, int h, int row0, int row1, float &d0,
                                                float &d1) {
  const T *o = static_cast<const T *>(p.o) + b * p.o_sb + h * p.o_sh;
  const T *g = static_cast<const T *>(p.dout) + b * p.do_sb + h * p.do_sh;
  d0 = row0 < p.Tq ? delta_row<T, D>(o + row0 * p.o_st, g + row0 * p.do_st, p.Dv) : 0.f;
  d1 = row1 < p.Tq ? delta_row<T, D>(o + row1 * p.o_st, g + row1 * p.do_st, p.Dv) : 0.f;
}
/* Lane t 0 of each quad stores its two rows' Δ for the dk/dv kernel, which runs after this one. Every row of
 * every head is one block's, so each Δ is written once. */
__device__ __forceinline__ void dq_store_delta(const Params &p, int bh, int row0, int row1, int t, float d0,
                                               float d1) {
  float *delta = p.delta + (int64_t)bh * p.Tq;
  if (t == 0 && row0 < p.Tq) delta[row0] = d0;
  if (t == 0 && row1 < p.Tq) delta[row1] = d1;
}

/* EMBER_FLASH_STEP9: dq_row_stats (flash_bwd_wg.cuh) with each row's Δ computed here, by the delta kernel's sum
 * (delta_row: the same bits), instead of read, and stored for dk/dv. */
template <typename T, int D>
__device__ __forceinline__ void dq_row_stats_delta(const Params &p, int b, int h, int bh, int row0, int row1, int t,
                                                   float &l0, float &l1, float &d0, float &d1) {
  dq_row_lse(p, bh, row0, row1, l0, l1);
  dq_delta_global<T, D>(p, b, h, row0, row1, d0, d1);
  dq_store_delta(p, bh, row0, row1, t, d0, d1);
}

/* EMBER_FLASH_DELTA9: Δ of row r (of the block's RES) from the shared tiles of o (so) and dO (sg), TMA's
 * 128-byte swizzle (flash_wg.cuh: the 16-byte chunk u of a 64-column block's row r at u ^ r % 8): delta_row's
 * chunks in delta_row's order, so the same bits. FULL (n == D, the usual case): no test a chunk, so the loads
 * are one straight run ptxas may issue together; delta_row's `c < n` puts each chunk's loads in a basic block of
 * its own, one memory round trip after another (16 a thread from L2 in the S9 kernel: its cost in Step 9's
 * measurement). */
template <typename T, int D, bool FULL>
__device__ __forceinline__ float delta_row_smem(const unsigned char *so, const unsigned char *sg, int r, int n) {
  constexpr int E = Packed128<T>::size;
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < D; c += E)
    if (FULL || c < n) {
      const int at = (c / 64) * RES * 128 + r * 128 + ((((c % 64) / E) ^ (r & 7)) << 4);
      acc = delta_chunk<T>(acc, load128(reinterpret_cast<const T *>(so + at)),
                           load128(reinterpret_cast<const T *>(sg + at)));
    }
  return acc;
}
#endif

/* D9 (EMBER_FLASH_DELTA9, only with S9): the producer also brings the block's rows of o (to) into shared memory,
 * and each consumer sums its rows' Δ from there and from dO's resident tile under its first S and dP wgmmas
 * (docs/flash.md "Step 9b"), instead of from global memory before them. RP (the rope option, only with S9): dq leaves
 * rotated back by −angle (store_rows_rope). */
template <typename T, int D, int STAGES, bool S9, bool D9, bool RP>
__global__ void __launch_bounds__(THREADS, 1)
    flash_dq_wg2_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                        const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                        const Params p, const __grid_constant__ OutMap<D9> to) {
  static_assert(S9 || !D9, "flash_dq_wg2_kernel: D9 (Δ from shared memory) only with S9 (Δ in this kernel)");
  static_assert(S9 || !RP, "flash_dq_wg2_kernel: RP (the rope option) only with S9");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<D, STAGES>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base, sO = base + L::OFF_B, ring = base + L::OFF_RING;
  const uint32_t bar_q = base + L::OFF_BAR, full = bar_q + 8, empty = full + 8 * STAGES;   // + 8·stage

  // S9 (EMBER_FLASH_STEP9): the grid is (heads, q blocks), the last (heaviest) q block of every head first; and
  // the rows' Δ computed here (dq_row_stats_delta), with no delta kernel before
  const int qblk = tile_count<S9>() - 1 - tile_index<S9>(), bh = head_index<S9>(), b = bh / p.H, h = bh % p.H,
            hk = h / p.group;
  const int q0 = qblk * RES;
  const int kend = p.causal ? min(p.Tk, q0 + RES + p.off) : p.Tk, ntile = max(0, (kend + STR - 1) / STR);
  const int wg = threadIdx.x >> 7;
  if constexpr (S9) grid_dep_launch();   // the dk/dv kernel after this one may start (EMBER_FLASH_PDL)

  // D9: o's tile and its barrier (thread 0 inits it before init_barriers' fence and sync)
  const uint32_t bar_o = base + DqOutLayout<D, STAGES>::OFF_BAR_O, sOut = base + DqOutLayout<D, STAGES>::OFF_OUT;
  if constexpr (D9)
    if (threadIdx.x == 0) mbar_init(bar_o, 1);
  init_barriers<STAGES>(bar_q, full, empty, 1);   // full: the producer's expect_tx; the bytes complete it

  if (wg == 0) {
    if constexpr (D9)
      dq_producer<D, STAGES, true>(&tq, &tk, &tv, &tdo, sQ, sO, ring, bar_q, full, empty, b, h, hk, q0, ntile, &to,
                                   sOut, bar_o);
    else dq_producer<D, STAGES>(&tq, &tk, &tv, &tdo, sQ, sO, ring, bar_q, full, empty, b, h, hk, q0, ntile);
    return;
  }

  // ---- consumers: 64 queries each ----
  setmaxnreg_inc<240>();
  const int cw = wg - 1, tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int qw0 = q0 + cw * 64, wrow = qw0 + warp * 16, row0 = wrow + g, row1 = row0 + 8;
  const uint32_t qa = sQ + cw * 64 * 128, oa = sO + cw * 64 * 128;   // this consumer's rows of q, dO
  float l0, l1, d0 = 0.f, d1 = 0.f;
  if constexpr (D9) {   // Δ below, from the shared tiles (none without a tile: from global memory)
    dq_row_lse(p, bh, row0, row1, l0, l1);
    if (ntile == 0) {
      dq_delta_global<T, D>(p, b, h, row0, row1, d0, d1);
      dq_store_delta(p, bh, row0, row1, t, d0, d1);
    }
  } else if constexpr (S9) dq_row_stats_delta<T, D>(p, b, h, bh, row0, row1, t, l0, l1, d0, d1);
  else dq_row_stats(p, bh, row0, row1, l0, l1, d0, d1);
  // D9 (ntile > 0): this consumer's rows' Δ once o's tile is in (dO's came with q), stored for dk/dv
  // (warp-uniform: a quad's lanes t 0 and 2 sum row0, 1 and 3 row1, and the quad shares them: one chain a thread;
  // rows past Tq read TMA's zeros and get 0)
  auto delta_smem = [&]() {
    const unsigned char *so = smem_raw + (sOut - smem_u32(smem_raw)), *sg = smem_raw + (sO - smem_u32(smem_raw));
    const int r = ((t & 1) ? row1 : row0) - q0;
    mbar_wait(bar_o, 0);
    const float a = p.Dv == D ? delta_row_smem<T, D, true>(so, sg, r, D) : delta_row_smem<T, D, false>(so, sg, r, p.Dv);
    const float a0 = __shfl_sync(0xffffffffu, a, lane & ~3), a1 = __shfl_sync(0xffffffffu, a, (lane & ~3) | 1);
    d0 = row0 < p.Tq ? a0 : 0.f;
    d1 = row1 < p.Tq ? a1 : 0.f;
    dq_store_delta(p, bh, row0, row1, t, d0, d1);
  };
  const int my_bar = 1 + cw, other_bar = 2 - cw, turns = ntile > 0 ? ntile + 1 : 0;
  auto pass_turn = [&](int i) {
    if (cw == 0 || i < turns - 1) named_arrive(other_bar);
  };
  if (cw == 1 && turns > 0) named_arrive(1);

  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; i++) dq[i] = 0.f;
  if (ntile > 0) mbar_wait(bar_q, 0);

  // a tile none of whose keys any of this consumer's rows sees (a suffix, at
  // most one tile): an empty turn
  auto seen = [&](int j) { return !(p.causal && j * STR > qw0 + 63 + p.off); };
  uint32_t da[STR / 16][4];   // the pending tile's dS
  int j = 0, ps = 0;          // ps: the pending tile's stage
  // S(j), dP(j) on the tile of stage s, then (PEND) the pending tile's dq += dS k
  auto turn = [&](auto pend_tag, int j) {
    constexpr bool PEND = decltype(pend_tag)::value;
    const int s = j % STAGES, k0 = j * STR;
    const uint32_t sk = ring + s * L::STAGE, sv = sk + L::STR_BYTES, psk = ring + ps * L::STAGE;
    float sc[STR / 2], dp[STR / 2];
    mbar_wait(full + 8 * s, (j / STAGES) & 1);
    named_sync(my_bar);
    reg_fence(dq);
    wgmma_fence();
    issue_ss<T, D>(sc, qa, sk);   // S = q kᵀ
    issue_ss<T, D>(dp, oa, sv);   // dP = dO vᵀ
    if constexpr (PEND) issue_rs<T, D>(dq, da, psk);   // the pending tile's dq += dS k
    wgmma_commit();   // empty on the first tile: the waits below stay the same
    pass_turn(j);
    if constexpr (D9 && !PEND) delta_smem();   // the first tile: Δ under S and dP, before dS needs it
    wgmma_wait<2>();   // S done
    reg_fence(sc);
    const bool edge = k0 + STR > p.Tk || (p.causal && k0 + STR - 1 > wrow + p.off);
    if (edge) dq_p<true>(sc, p, k0, row0, row1, l0, l1, t);   // P
    else dq_p<false>(sc, p, k0, row0, row1, l0, l1, t);
    wgmma_wait<1>();   // dP done
    reg_fence(dp);
#pragma unroll
    for (int i = 0; i < STR / 2; i++) dp[i] = sc[i] * (dp[i] - ((i & 2) ? d1 : d0));   // dS
    wgmma_wait<0>();   // the pending dq done: its stage and A fragments are free
    reg_fence(dq);
    reg_fence(dp);
    if constexpr (PEND) mbar_arrive(empty + 8 * ps);
    pack_a<T>(da, dp);
    ps = s;
  };
  auto empty_turn = [&](int j) {
    const int s = j % STAGES;
    mbar_wait(full + 8 * s, (j / STAGES) & 1);
    named_sync(my_bar);
    pass_turn(j);
    mbar_arrive(empty + 8 * s);
  };
  if (ntile > 0 && seen(0)) {
    turn(std::false_type{}, 0);   // the first tile: nothing pending (peeled: no wgmma in a branch)
    for (j = 1; j < ntile && seen(j); j++) turn(std::true_type{}, j);
    for (; j < ntile; j++) empty_turn(j);
    // turn ntile: the last seen tile's dq
    named_sync(my_bar);
    reg_fence(dq);
    wgmma_fence();
    issue_rs<T, D>(dq, da, ring + ps * L::STAGE);
    wgmma_commit();
    pass_turn(ntile);
    wgmma_wait<0>();
    reg_fence(dq);
    mbar_arrive(empty + 8 * ps);
  } else {
    if constexpr (D9)
      if (ntile > 0) delta_smem();   // no tile seen, yet dk/dv reads these rows' Δ
    for (; j < ntile; j++) empty_turn(j);
    if (turns > 0) {
      named_sync(my_bar);
      pass_turn(ntile);
    }
  }

  T *gq = static_cast<T *>(p.dq) + b * p.dq_sb + h * p.dq_sh;
  if constexpr (RP)
    store_rows_rope<T, D>(gq, p.dq_st, dq, row0, p.Tq, p.Dv, t, p.scale, p, b * p.rp_sb + h * p.rp_sh);
  else
    store_rows<T, D>(gq, p.dq_st, dq, row0, p.Tq, p.Dv, t, p.scale);
#else
  __trap();   // built without sm_90a: bwd_wg_dispatch never launches this
#endif
}

/* pdl (EMBER_FLASH_PDL, HF only): launched as a programmatic dependent of the kernel before it on s (the S9 dq
 * kernel, which computes Δ and allows the launch at its start; the kernel waits for it before reading Δ). */
template <typename T, int D, bool HF, bool RP = false>
int launch_dkdv2(const Params &p, const Maps &m, cudaStream_t s, bool pdl = false) {
  static_assert(HF || !RP, "launch_dkdv2: the rope epilogue only on the short-sequence schedule");
  constexpr int ST = kStages<D>;
  constexpr size_t smem = Layout<D, ST>::SMEM;
  auto k1 = flash_dkdv_wg2_kernel<T, D, ST, kDkdvPipe<D>, HF, RP>;
  if (raise_smem(k1, smem)) return em_launch_check("flash_attention backward (wgmma wg2 dk, dv)");
  const dim3 grid = tile_grid(HF, (unsigned)((p.Tk + RES - 1) / RES), (unsigned)(p.B * p.Hkv));
  if (HF && pdl) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, k1, m.q64, m.k128, m.v128, m.do64, p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();   // reported here, not by the next launch's check
      return em_error("flash_attention backward (wgmma wg2 dk, dv; EMBER_FLASH_PDL=1): cudaLaunchKernelEx failed: %s",
                      cudaGetErrorString(e));
    }
  } else {
    k1<<<grid, THREADS, smem, s>>>(m.q64, m.k128, m.v128, m.do64, p);
  }
  return em_launch_check("flash_attention backward (wgmma wg2 dk, dv)");
}

/* d9 (EMBER_FLASH_DELTA9, with S9): the kernel that sums Δ from shared tiles, on o's 128-row tensor map; where
 * TMA refuses o's strides, the S9 kernel (Δ from global memory: the same bits). */
template <typename T, int D, bool S9, bool RP = false>
int launch_dq2(const Params &p, const Maps &m, cudaStream_t s, bool d9 = false) {
  static_assert(S9 || !RP, "launch_dq2: the rope epilogue only on the short-sequence schedule");
  constexpr int ST = kStages<D>;
  const dim3 grid = tile_grid(S9, (unsigned)((p.Tq + RES - 1) / RES), (unsigned)(p.B * p.H));
  if constexpr (S9) {
    CUtensorMap to;
    constexpr em_dtype dt = std::is_same<T, __nv_bfloat16>::value ? EM_BF16 : EM_F16;
    if (d9 && tma_map(&to, dt, p.o, p.Dv, p.Tq, p.H, p.B, p.o_st, p.o_sh, p.o_sb, RES)) {
      constexpr size_t smem = DqOutLayout<D, ST>::SMEM;
      static_assert(smem <= 227 * 1024, "flash wg2 dq (EMBER_FLASH_DELTA9): shared memory over an H100 SM's 227 KB");
      auto k2 = flash_dq_wg2_kernel<T, D, ST, true, true, RP>;
      if (raise_smem(k2, smem)) return em_launch_check("flash_attention backward (wgmma wg2 dq)");
      k2<<<grid, THREADS, smem, s>>>(m.q128, m.k64, m.v64, m.do128, p, to);
      return em_launch_check("flash_attention backward (wgmma wg2 dq)");
    }
  }
  constexpr size_t smem = Layout<D, ST>::SMEM;
  auto k2 = flash_dq_wg2_kernel<T, D, ST, S9, false, RP>;
  if (raise_smem(k2, smem)) return em_launch_check("flash_attention backward (wgmma wg2 dq)");
  k2<<<grid, THREADS, smem, s>>>(m.q128, m.k64, m.v64, m.do128, p, NoMap{});
  return em_launch_check("flash_attention backward (wgmma wg2 dq)");
}

/* As before: the delta kernel, then dk/dv, then dq. EMBER_FLASH_STEP9 (s9), where both grids are short
 * (tile_grid_hf): no delta kernel; dq first, computing and storing Δ (from shared tiles with
 * EMBER_FLASH_DELTA9, d9), then dk/dv, which reads it; both heaviest block first over the whole grid. */
template <typename T, int D>
int launch_bwd2(const Params &p, const Maps &m, bool s9, bool pdl, bool d9, DeltaLaunch delta, cudaStream_t s) {
  static_assert(Layout<D, kStages<D>>::SMEM <= 227 * 1024, "flash wg2 backward: shared memory over an H100 SM's 227 KB");
  if (bwd2_short(p, s9)) {
    if (p.rope) {   // the rope option: dq and dk rotated back in the epilogues (bwd_wg_dispatch kept it only here)
      if (launch_dq2<T, D, true, true>(p, m, s, d9)) return -1;
      return p.Tk > 0 ? launch_dkdv2<T, D, true, true>(p, m, s, pdl) : 0;
    }
    if (launch_dq2<T, D, true>(p, m, s, d9)) return -1;
    return p.Tk > 0 ? launch_dkdv2<T, D, true>(p, m, s, pdl) : 0;
  }
  if (delta(p, s)) return -1;
  if (p.Tk > 0 && launch_dkdv2<T, D, false>(p, m, s)) return -1;
  return launch_dq2<T, D, false>(p, m, s);
}

}  // namespace

namespace flash {

int bwd_wg2_launch(const Params &p, const Maps &m, em_dtype dt, int d, DeltaLaunch delta, cudaStream_t s) {
  const int s9 = step9(), pdl = flash_pdl(), d9 = flash_delta9();
  if (s9 < 0 || pdl < 0 || d9 < 0) return -1;
  const bool on = s9 == 1, dep = pdl == 1, sm = d9 == 1;
  if (dt == EM_BF16)
    return d == 64 ? launch_bwd2<__nv_bfloat16, 64>(p, m, on, dep, sm, delta, s)
                   : launch_bwd2<__nv_bfloat16, 128>(p, m, on, dep, sm, delta, s);
  return d == 64 ? launch_bwd2<__half, 64>(p, m, on, dep, sm, delta, s)
                 : launch_bwd2<__half, 128>(p, m, on, dep, sm, delta, s);
}

}  // namespace flash
