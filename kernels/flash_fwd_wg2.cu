/* FlashAttention forward for Hopper, version 2 (EMBER_FLASH_FWD=wg2): the
 * wgmma/TMA kernel of flash_fwd_wg.cu with FlashAttention-3's overlap of
 * softmax and matmuls (docs/flash.md, "Step 3"). Same function, outputs and
 * block shape (a TMA producer warpgroup and two consumer warpgroups of 64
 * query rows, 128-key tiles in a ring of 2 stages); what changes:
 *
 *  1. intra-warpgroup pipelining: a consumer issues S(j) = q k(j)ᵀ and then
 *     o += P(j-1) v(j-1) as two wgmma commit groups, waits for the first
 *     only (wait_group 1) and runs the softmax of S(j) while the second is
 *     still on the tensor cores; o is rescaled once that one completes.
 *     P(j-1) lives in 32 packed registers, S(j) in 64 floats: the "second
 *     accumulator" is P itself;
 *  2. ping-pong between the consumers: named barriers 1 and 2 hand the right
 *     to issue matmuls back and forth (bar.sync on one's own, bar.arrive on
 *     the other's), so one consumer's softmax runs under the other's wgmmas;
 *  3. separate full and empty mbarriers for k and v: S(j) starts as soon as
 *     k(j) has landed, and k's stage is released as soon as S(j) is done.
 *
 * Both consumers take the same number of turns (ntile + 1: the last one
 * issues only the final P v), padding with empty turns where a consumer
 * sees fewer tiles (the causal diagonal), so the named barriers never wait
 * for a turn that does not come. */
#include <cuda.h>
#include "backend.h"
#include "flash_common.cuh"
#include "flash_wg.cuh"
#include "flash_wgmma.cuh"

using namespace flash;

namespace {

constexpr int BN = 128;        // keys per k/v tile
constexpr int PAIR = 256;      // a named barrier's count: the consumer waiting on it and the one arriving

/* NC consumer warpgroups of 64 query rows: 2 (BM 128, 384 threads) or, at
 * D = 64 only, 3 (EMBER_FLASH_FWD=wg3: BM 192, 512 threads; the consumers
 * get 160 registers each, enough for D = 64's accumulators but not D = 128's). */
template <int D, int NC> struct Wg2Cfg {
  static constexpr int BM = 64 * NC, THREADS = 128 * (NC + 1), NCONS = 128 * NC;
  static constexpr int CONS_REGS = NC == 2 ? 240 : 160, PROD_REGS = 24;
  static constexpr int CH = D / 64;                   // 64-column (128-byte) chunks of a row
  static constexpr uint32_t Q_BYTES = BM * D * 2, KV_BYTES = BN * D * 2;
  static constexpr uint32_t OFF_K = Q_BYTES, OFF_V = OFF_K + 2 * KV_BYTES, OFF_BAR = OFF_V + 2 * KV_BYTES;
  // barriers: q full, k full[2], v full[2], k empty[2], v empty[2]; 1024 of slack to align the base
  static constexpr size_t SMEM = OFF_BAR + 9 * 8 + 1024;
};

/* One consumer's row state: the running max m (base 2, scaled) and sum l of
 * its two rows (g and g + 8 of its warp's 16), and the o accumulators. */
template <int D> struct Rows {
  float o[D / 2];
  float m0, m1, l0, l1;
};

/* The online softmax of one tile's scores in place (sc: raw q·k, then
 * 2^(scale·s − m)), masking keys past Tk and above the causal diagonal;
 * returns the factors by which o and l must shrink (the old max over the
 * new) in a0, a1, and adds the tile's row sums to l after scaling it. */
template <int D, bool S8>
__device__ __forceinline__ void softmax_tile(float (&sc)[BN / 2], Rows<D> &r, const Params &p, int k0, int wrow,
                                             int row0, int row1, int t, float &a0, float &a1) {
  const bool edge = k0 + BN > p.Tk || (p.causal && k0 + BN - 1 > wrow + p.off);
  float mx0 = -INFINITY, mx1 = -INFINITY;
  if (edge) {
    if constexpr (S8) {
      // S8: key col is masked iff col > the row's last visible key, min(Tk − 1, row + off) under the causal mask:
      // with col = k0 + 2t + (i >> 2)·8 + (i & 1), one compare of a constant with the row's limit per score
      const int last0 = p.causal ? min(p.Tk - 1, row0 + p.off) : p.Tk - 1;
      const int last1 = p.causal ? min(p.Tk - 1, row1 + p.off) : p.Tk - 1;
      const int lim0 = last0 - k0 - 2 * t, lim1 = last1 - k0 - 2 * t;
#pragma unroll
      for (int i = 0; i < BN / 2; i++)
        if ((i >> 2) * 8 + (i & 1) > ((i & 2) ? lim1 : lim0)) sc[i] = -INFINITY;
    } else {
#pragma unroll
      for (int i = 0; i < BN / 2; i++) {
        const int col = k0 + (i >> 2) * 8 + 2 * t + (i & 1), row = (i & 2) ? row1 : row0;
        if (col >= p.Tk || (p.causal && col > row + p.off)) sc[i] = -INFINITY;
      }
    }
  }
  if constexpr (S8) {
    // S8: four partial maxima a row (chains of 8 instead of 32 dependent FMNMX: the row max is latency on the
    // consumer's path to its next turn); a max is exact in any order, so the same value
    float pm[8];
#pragma unroll
    for (int u = 0; u < 8; u++) pm[u] = -INFINITY;
#pragma unroll
    for (int i = 0; i < BN / 2; i++) pm[((i & 2) << 1) | ((i >> 2) & 3)] = fmaxf(pm[((i & 2) << 1) | ((i >> 2) & 3)], sc[i]);
    mx0 = fmaxf(fmaxf(pm[0], pm[1]), fmaxf(pm[2], pm[3]));
    mx1 = fmaxf(fmaxf(pm[4], pm[5]), fmaxf(pm[6], pm[7]));
  } else {
#pragma unroll
    for (int i = 0; i < BN / 2; i++) {
      if (i & 2) mx1 = fmaxf(mx1, sc[i]); else mx0 = fmaxf(mx0, sc[i]);
    }
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  // the scale is positive, so the max of the raw scores scaled is the max of the scaled ones
  const float n0 = fmaxf(r.m0, mx0 * p.scale_log2), n1 = fmaxf(r.m1, mx1 * p.scale_log2);
  // a row with every key so far masked keeps m = -inf: base 0 so 2^x gives 0, not NaN
  const float b0 = n0 == -INFINITY ? 0.f : n0, b1 = n1 == -INFINITY ? 0.f : n1;
  a0 = ex2_ftz(r.m0 - b0);
  a1 = ex2_ftz(r.m1 - b1);
  r.m0 = n0;
  r.m1 = n1;
  // four partial sums per row: shorter add chains
  float rs[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < BN / 2; i++) {
    sc[i] = ex2_ftz(fmaf(sc[i], p.scale_log2, (i & 2) ? -b1 : -b0));
    rs[(i & 2) | ((i >> 2) & 1)] += sc[i];
  }
  r.l0 = r.l0 * a0 + ((rs[0] + rs[1]));
  r.l1 = r.l1 * a1 + ((rs[2] + rs[3]));
}

/* Named barriers 1..3, one per consumer (0 is __syncthreads), each counting
 * the 256 threads of its consumer (bar.sync) and of the one before it in the
 * ring (bar.arrive); immediate ids, so ptxas reserves only these (a register
 * id reserves all 16). */
__device__ __forceinline__ void named_sync(int id) {
  if (id == 1) asm volatile("bar.sync 1, %0;\n" ::"n"(PAIR) : "memory");
  else if (id == 2) asm volatile("bar.sync 2, %0;\n" ::"n"(PAIR) : "memory");
  else asm volatile("bar.sync 3, %0;\n" ::"n"(PAIR) : "memory");
}
__device__ __forceinline__ void named_arrive(int id) {
  if (id == 1) asm volatile("bar.arrive 1, %0;\n" ::"n"(PAIR) : "memory");
  else if (id == 2) asm volatile("bar.arrive 2, %0;\n" ::"n"(PAIR) : "memory");
  else asm volatile("bar.arrive 3, %0;\n" ::"n"(PAIR) : "memory");
}

template <typename T, int D, int NC, bool S8, bool HF>
__global__ void __launch_bounds__(Wg2Cfg<D, NC>::THREADS, 1)
    flash_fwd_wg2_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                         const __grid_constant__ CUtensorMap tv, const Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Wg2Cfg<D, NC>;
  constexpr int BM = C::BM, NCONS = C::NCONS;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base, sK = base + C::OFF_K, sV = base + C::OFF_V;
  // + 8·stage for the ring's barriers
  const uint32_t bar_q = base + C::OFF_BAR, kfull = bar_q + 8, vfull = bar_q + 24, kempty = bar_q + 40,
                 vempty = bar_q + 56;

  // HF (EMBER_FLASH_STEP9): the grid is (heads, q blocks), heaviest first over all heads (tile_grid)
  const int qblk = tile_count<HF>() - 1 - tile_index<HF>(), bh = head_index<HF>(), b = bh / p.H, h = bh % p.H,
            hk = h / p.group;
  const int q0 = qblk * BM;
  const int kend = p.causal ? min(p.Tk, q0 + BM + p.off) : p.Tk, ntile = max(0, (kend + BN - 1) / BN);
  // S8 (EMBER_FLASH_FWD_STEP8): the warpgroup through a shuffle from lane 0, which the compiler knows is the same
  // in every lane, so what derives from it (this consumer's q rows, its descriptors) stays in uniform registers
  // instead of being moved there (R2UR) before every wgmma
  const int wg = S8 ? __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0) : threadIdx.x >> 7;

  if (threadIdx.x == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < 2; s++) {
      mbar_init(kfull + 8 * s, 1);   // the producer's expect_tx arrival; the bytes complete it
      mbar_init(vfull + 8 * s, 1);
      mbar_init(kempty + 8 * s, NCONS);   // every consumer thread
      mbar_init(vempty + 8 * s, NCONS);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer: q once, then k(j) and v(j) into stage j % 2, each when its own stage is free ----
    setmaxnreg_dec<C::PROD_REGS>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&tq); tma_prefetch_map(&tk); tma_prefetch_map(&tv);
      mbar_expect_tx(bar_q, C::Q_BYTES);
#pragma unroll
      for (int c = 0; c < C::CH; c++) tma_load_4d(sQ + c * BM * 128, &tq, bar_q, c * 64, q0, h, b);
      for (int j = 0; j < ntile; j++) {
        const int s = j & 1;
        const uint32_t par = ((j >> 1) - 1) & 1;   // the phase of tile j - 2, the stage's last tenant
        if (j >= 2) mbar_wait(kempty + 8 * s, par);
        mbar_expect_tx(kfull + 8 * s, C::KV_BYTES);
#pragma unroll
        for (int c = 0; c < C::CH; c++)
          tma_load_4d(sK + s * C::KV_BYTES + c * BN * 128, &tk, kfull + 8 * s, c * 64, j * BN, hk, b);
        if (j >= 2) mbar_wait(vempty + 8 * s, par);
        mbar_expect_tx(vfull + 8 * s, C::KV_BYTES);
#pragma unroll
        for (int c = 0; c < C::CH; c++)
          tma_load_4d(sV + s * C::KV_BYTES + c * BN * 128, &tv, vfull + 8 * s, c * 64, j * BN, hk, b);
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<C::CONS_REGS>();
  const int cw = wg - 1, tid = threadIdx.x & 127, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int warp = S8 ? __shfl_sync(0xffffffffu, tid >> 5, 0) : tid >> 5;   // S8: uniform (the edge mask's branch)
  const int rbase = q0 + cw * 64, wrow = rbase + warp * 16;   // this warpgroup's, this warp's first row
  const int row0 = wrow + g, row1 = row0 + 8;
  // tiles this warpgroup sees: a prefix of the block's (on the causal diagonal
  // a consumer may skip the last one; never more: its rows see at most
  // 64 (NC - 1) <= 128 keys fewer than the last consumer's)
  int nv = ntile;
  if (p.causal) {
    const int wglast = rbase + 63 + p.off;   // the last key any of its rows sees
    nv = wglast < 0 ? 0 : min(ntile, wglast / BN + 1);
  }
  // ping-pong (a ring of NC): consumer cw issues its matmuls after bar.sync
  // on 1 + cw, then lets the next one go
  const int my_bar = 1 + cw, next_bar = 1 + (cw + 1) % NC, turns = ntile > 0 ? ntile + 1 : 0;
  // consumer 0 goes first; the last consumer's last arrival would have no taker, so it is left out
  auto pass_turn = [&](int i) {
    if (cw < NC - 1 || i < turns - 1) named_arrive(next_bar);
  };
  if (cw == NC - 1 && turns > 0) named_arrive(1);

  Rows<D> r;
#pragma unroll
  for (int i = 0; i < D / 2; i++) r.o[i] = 0.f;
  r.m0 = r.m1 = -INFINITY;
  r.l0 = r.l1 = 0.f;
  float sc[BN / 2];
  uint32_t pa[BN / 16][4];
  float a0, a1;

  mbar_wait(bar_q, 0);
  // q rows of this warpgroup: 64 rows (8 KB) into each 128-row chunk
  const uint32_t qa = sQ + cw * 64 * 128;
  // S8: the descriptors' low words (wg_desc_lo) of q and of stage 0's k and v, built once; a wgmma's descriptor is
  // then one add of its stage's and k step's offset >> 4 (wg_desc_at: the same 64 bits as wg_desc)
  const uint32_t q_lo = wg_desc_lo(qa, 16), k_lo = wg_desc_lo(sK, 16), v_lo = wg_desc_lo(sV, BN * 128);

  // S(j) = q k(j)ᵀ: D/16 wgmma m64n128k16, one commit group
  auto issue_s = [&](int j) {
    const uint32_t ks = sK + (j & 1) * C::KV_BYTES, ks_lo = k_lo + (j & 1) * (C::KV_BYTES >> 4);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      const uint32_t off = (kk & 3) * 32;   // 16 columns = 32 bytes into the chunk's 128-byte rows
      if constexpr (S8) {
        Wgmma<T, BN>::ss(sc, wg_desc_at(q_lo, (kk >> 2) * BM * 128 + off), wg_desc_at(ks_lo, (kk >> 2) * BN * 128 + off),
                         kk > 0);
      } else {
        const uint64_t da = wg_desc(qa + (kk >> 2) * BM * 128 + off, 16, 1024);
        const uint64_t db = wg_desc(ks + (kk >> 2) * BN * 128 + off, 16, 1024);
        Wgmma<T, BN>::ss(sc, da, db, kk > 0);
      }
    }
    wgmma_commit();
  };
  // o += P(j) v(j): 8 wgmma m64nDk16 with P from registers, one commit group
  auto issue_pv = [&](int j) {
    const uint32_t vs = sV + (j & 1) * C::KV_BYTES, vs_lo = v_lo + (j & 1) * (C::KV_BYTES >> 4);
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
      // 16 keys = two 8-row groups of every 64-column chunk of v
      if constexpr (S8) {
        Wgmma<T, D>::rs(r.o, pa[kk], wg_desc_at(vs_lo, kk * 16 * 128), 1);
      } else {
        const uint64_t db = wg_desc(vs + kk * 16 * 128, BN * 128, 1024);
        Wgmma<T, D>::rs(r.o, pa[kk], db, 1);
      }
    }
    wgmma_commit();
  };

  if (nv > 0) {
    // turn 0: S(0) alone
    mbar_wait(kfull, 0);
    named_sync(my_bar);
    wgmma_fence();
    issue_s(0);
    pass_turn(0);
    wgmma_wait<0>();
    reg_fence(sc);
    mbar_arrive(kempty);
    softmax_tile<D, S8>(sc, r, p, 0, wrow, row0, row1, t, a0, a1);   // o is 0: nothing to rescale
    pack_a<T>(pa, sc);
  }
  for (int j = 1; j < nv; j++) {
    // turn j: S(j), then P(j-1) v(j-1); the softmax of S(j) under the second
    const int s = j & 1, sp = s ^ 1;
    mbar_wait(kfull + 8 * s, (j >> 1) & 1);
    mbar_wait(vfull + 8 * sp, ((j - 1) >> 1) & 1);
    named_sync(my_bar);
    reg_fence(r.o);
    wgmma_fence();
    issue_s(j);
    issue_pv(j - 1);
    pass_turn(j);
    wgmma_wait<1>();   // S(j) done; P(j-1) v(j-1) may still run
    reg_fence(sc);
    mbar_arrive(kempty + 8 * s);
    softmax_tile<D, S8>(sc, r, p, j * BN, wrow, row0, row1, t, a0, a1);
    wgmma_wait<0>();
    reg_fence(r.o);
    reg_fence(sc);   // P(j) is packed after the wait: P(j-1)'s registers were the in-flight wgmma's operands
    mbar_arrive(vempty + 8 * sp);
    // S8: o rescaled only where a row of the warp's 16 got a new max; a factor of exactly 1 would leave o's bits
    // as they are, so skipping it changes none (late in a long row most tiles raise no row's max)
    if (!S8 || !__all_sync(0xffffffffu, a0 == 1.f && a1 == 1.f)) {
#pragma unroll
      for (int i = 0; i < D / 2; i++) r.o[i] *= (i & 2) ? a1 : a0;
    }
    pack_a<T>(pa, sc);
  }
  if (nv > 0) {
    // turn nv: the last P v
    const int sp = (nv - 1) & 1;
    mbar_wait(vfull + 8 * sp, ((nv - 1) >> 1) & 1);
    named_sync(my_bar);
    reg_fence(r.o);
    wgmma_fence();
    issue_pv(nv - 1);
    pass_turn(nv);
    wgmma_wait<0>();
    reg_fence(r.o);
    mbar_arrive(vempty + 8 * sp);
  }
  // empty turns, so both consumers take as many
  for (int i = nv > 0 ? nv + 1 : 0; i < turns; i++) {
    named_sync(my_bar);
    pass_turn(i);
  }
  // tiles past this warpgroup's rows: wait for them (no copy may land after
  // the block ends) and release them (the empty phases stay in step)
  for (int j = nv; j < ntile; j++) {
    const int s = j & 1;
    mbar_wait(kfull + 8 * s, (j >> 1) & 1);
    mbar_arrive(kempty + 8 * s);
    mbar_wait(vfull + 8 * s, (j >> 1) & 1);
    mbar_arrive(vempty + 8 * s);
  }

  store_o_lse<T, D>(p, r.o, r.l0, r.l1, r.m0, r.m1, b, h, bh, row0, row1, t);
#else
  __trap();   // built without sm_90a: fwd_wg_dispatch never launches this
#endif
}

template <typename T, int D, int NC, bool S8, bool HF>
int launch(const Params &p, const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv, cudaStream_t s) {
  using C = Wg2Cfg<D, NC>;
  constexpr size_t smem = C::SMEM;
  static_assert(smem <= 227 * 1024, "flash wg2 forward: shared memory over an H100 SM's 227 KB");
  static_assert(128 * C::PROD_REGS + C::NCONS * C::CONS_REGS <= 65536, "flash wg2 forward: over the register file");
  auto kern = flash_fwd_wg2_kernel<T, D, NC, S8, HF>;
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
    return em_launch_check("flash_attention (wgmma forward, wg2)");
  const dim3 grid = tile_grid(HF, (unsigned)((p.Tq + C::BM - 1) / C::BM), (unsigned)(p.B * p.H));
  kern<<<grid, C::THREADS, smem, s>>>(tq, tk, tv, p);
  return em_launch_check("flash_attention (wgmma forward, wg2)");
}

/* EMBER_FLASH_FWD_STEP8, read once (at the first wg2/wg3 forward): 1 (the default since the sixteenth session's
 * H200 run: 4-11 % faster at d 64/128, T 4096/16384), the consumer loop with descriptors advanced by an add from
 * low words built once, warp-uniform consumer and warp indices, o's rescale skipped where no row of the warp got a
 * new max, the edge mask one compare a score and the row max in eight short chains (docs/flash.md "Step 8"); 0,
 * the loop as before. The same wgmmas on the same operands and the same products and sums: the same bits. 1, 0,
 * or -1 with the error set. */
int g_step8_old = -1;
int fwd_step8() {
  const int old = em_env_choice(&g_step8_old, "flash_attention", "EMBER_FLASH_FWD_STEP8", "1", "0");
  return old < 0 ? -1 : 1 - old;
}

template <typename T, int D, int NC>
int launch_s8(const Params &p, const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv, cudaStream_t s) {
  const int s8 = fwd_step8(), s9 = step9();
  if (s8 < 0 || s9 < 0) return -1;
  // EMBER_FLASH_STEP9's order only on the default loop (S8): the STEP8=0 kernels stay as measured
  if (s8 && tile_grid_hf(s9 == 1, (unsigned)((p.Tq + Wg2Cfg<D, NC>::BM - 1) / Wg2Cfg<D, NC>::BM)))
    return launch<T, D, NC, true, true>(p, tq, tk, tv, s);
  return s8 ? launch<T, D, NC, true, false>(p, tq, tk, tv, s) : launch<T, D, NC, false, false>(p, tq, tk, tv, s);
}

}  // namespace

namespace flash {

int launch_wg2(const Params &p, em_dtype dt, int d, const CUtensorMap &tq, const CUtensorMap &tk,
               const CUtensorMap &tv, cudaStream_t s) {
  if (dt == EM_BF16) return d == 64 ? launch_s8<__nv_bfloat16, 64, 2>(p, tq, tk, tv, s)
                                    : launch_s8<__nv_bfloat16, 128, 2>(p, tq, tk, tv, s);
  return d == 64 ? launch_s8<__half, 64, 2>(p, tq, tk, tv, s) : launch_s8<__half, 128, 2>(p, tq, tk, tv, s);
}

int launch_wg3(const Params &p, em_dtype dt, const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv,
               cudaStream_t s) {
  return dt == EM_BF16 ? launch_s8<__nv_bfloat16, 64, 3>(p, tq, tk, tv, s) : launch_s8<__half, 64, 3>(p, tq, tk, tv, s);
}

}  // namespace flash
