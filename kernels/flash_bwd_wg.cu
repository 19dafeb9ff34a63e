/* FlashAttention backward for Hopper (sm_90a, EMBER_FLASH_BWD=wg): the
 * function of flash_bwd.cu (dv = Pᵀ dO, dk = scale · dSᵀ q, dq = scale · dS k
 * with P = exp(S·scale − lse), dS = P ∘ (dP − Δ), dP = dO vᵀ) on wgmma and
 * TMA, in the style of FlashAttention-3, and still deterministic: two
 * kernels, no atomics, every sum in a fixed order. flash_bwd.cu asks
 * bwd_wg_dispatch, which runs the delta kernel (Δ = rowsum(dO ∘ o)) before
 * the kernels that read Δ (wg2 under EMBER_FLASH_STEP9 computes it in its dq
 * kernel: "Step 9"); the design, the FLOP/byte count and the model:
 * docs/flash.md, "Step 4".
 *
 * Both kernels have the forward's block (flash_fwd_wg.cu): warpgroup 0 the
 * producer (24 registers; thread 0 issues every TMA copy), warpgroups 1 and
 * 2 the consumers (240 registers), two resident tiles of 128 rows copied
 * once, and a ring of STAGES stages of two streamed 64-row tiles, each stage
 * with a full mbarrier (the copies' bytes) and an empty one (the 256
 * consumer threads). Tiles are TMA's 128-byte swizzle, 64 columns per
 * 128-byte row, D = 128 two such tiles side by side (flash_wg.cuh).
 *
 *  dk/dv  one block per 128 keys of one kv head: k and v resident, each
 *         consumer owns 64 keys. Streamed: q and dO tiles of 64 queries, of
 *         every q head of the group in turn (h = hk·group + g, g ascending),
 *         and their lse·log2 e and Δ (warps 2-3 of the producer store those,
 *         +inf and 0 past Tq, then arrives on the full barrier). Per tile:
 *         Sᵀ = k qᵀ and dPᵀ = v dOᵀ (wgmma m64n64k16, both operands
 *         K-major from shared memory, two commit groups; Pᵀ's exponentials
 *         run while dPᵀ is still on the tensor cores), Pᵀ and dSᵀ rounded to
 *         16 bits in registers — the register A fragments of dv += Pᵀ dO and
 *         dk += dSᵀ q (wgmma m64nDk16, dO and q N-major: the transpose bit).
 *  dq     one block per 128 queries of one q head: q and dO resident, each
 *         consumer owns 64 queries; streamed: k and v tiles of 64 keys. Per
 *         tile: S = q kᵀ and dP = dO vᵀ (m64n64k16), P, dS, dq += dS k
 *         (m64nDk16, k N-major).
 * Recomputing S and dP in the dq kernel is the price of no atomics, as in
 * flash_bwd.cu: 7 matmuls per tile pair instead of 5.
 *
 * Edges: TMA fills rows past Tq or Tk with zeros; keys past Tk are masked in
 * dq (zero keys still give exp(−lse)), queries past Tq get lse = +inf (so
 * P = 0) in dk/dv, and dk/dv rows past Tk are never stored. Causal masks as
 * flash_bwd.cu (key j seen by row i when j <= i + off); a consumer skips a
 * tile none of its rows/keys sees but still waits for it and releases it,
 * so the barriers' phases stay in step.
 *
 * The layout, the wgmma helpers and both producers live in flash_bwd_wg.cuh,
 * shared with flash_bwd_wg2.cu (EMBER_FLASH_BWD=wg2: the same kernels with
 * the consumers overlapped, docs/flash.md "Step 4b"). */
#include <cuda.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "flash_common.cuh"
#include "flash_wg.cuh"
#include "flash_wgmma.cuh"
#include "flash_bwd_wg.cuh"

using namespace flash;

namespace {

template <typename T, int D, int STAGES>
__global__ void __launch_bounds__(THREADS, 1)
    flash_dkdv_wg_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                         const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                         const Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<D, STAGES>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  const uint32_t sK = base, sV = base + L::OFF_B, ring = base + L::OFF_RING;
  float *sLD = reinterpret_cast<float *>(smem_raw + (base - raw) + L::OFF_LD);   // stage s: lse at 2·STR·s, Δ STR on
  const uint32_t bar_kv = base + L::OFF_BAR, full = bar_kv + 8, empty = full + 8 * STAGES;   // + 8·stage

  const DkdvTiles tiles = dkdv_tiles(p, blockIdx.x);
  const int b = tiles.b, hk = tiles.hk, k0 = tiles.k0, qstart = tiles.qstart, nq = tiles.nq, ntile = tiles.ntile;
  const int wg = threadIdx.x >> 7;

  init_barriers<STAGES>(bar_kv, full, empty, 1 + STR);   // full: the copies' expect_tx and the STR lse/Δ threads

  if (wg == 0) {
    dkdv_producer<D, STAGES>(&tq, &tk, &tv, &tdo, p, sK, sV, ring, sLD, bar_kv, full, empty, b, hk, k0, qstart, nq,
                             ntile);
    return;
  }

  // ---- consumers: 64 keys each ----
  setmaxnreg_inc<240>();
  const int cw = wg - 1, tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int kw0 = k0 + cw * 64, key0 = kw0 + warp * 16 + g;   // rows key0 and key0 + 8 of dk, dv
  const uint32_t ka = sK + cw * 64 * 128, va = sV + cw * 64 * 128;   // this consumer's rows of k, v

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.f;
  if (ntile > 0) mbar_wait(bar_kv, 0);

  // tiles in order of q head, then query rows: the group's sums in a fixed order (deterministic)
  for (int j = 0; j < ntile; j++) {
    const int s = j % STAGES, i0 = qstart + (j % nq) * STR;
    mbar_wait(full + 8 * s, (j / STAGES) & 1);
    if (p.causal && kw0 > i0 + STR - 1 + p.off) {   // no query of the tile sees any of these keys
      mbar_arrive(empty + 8 * s);
      continue;
    }
    const uint32_t sq = ring + s * L::STAGE, so = sq + L::STR_BYTES;
    const float *sl = sLD + s * 2 * STR, *sd = sl + STR;
    float st[STR / 2], dp[STR / 2];
    wgmma_fence();
    issue_ss<T, D>(st, ka, sq);   // Sᵀ = k qᵀ
    issue_ss<T, D>(dp, va, so);   // dPᵀ = v dOᵀ
    wgmma_wait<1>();              // Sᵀ done; dPᵀ may still run under the exponentials
    reg_fence(st);
    const bool diag = p.causal && kw0 + warp * 16 + 15 > i0 + p.off;
    // key0 > i0 + c + off with c = 8m + 2t + (i & 1): e0 > 8m + (i & 1)
    const int e0 = key0 - i0 - p.off - 2 * t;
#pragma unroll
    for (int i = 0; i < STR / 2; i += 2) {
      const int c = 8 * (i >> 2) + 2 * t;
      const float2 l = *reinterpret_cast<const float2 *>(sl + c);
      float p0 = ex2_ftz(st[i] * p.scale_log2 - l.x), p1 = ex2_ftz(st[i + 1] * p.scale_log2 - l.y);
      if (diag) {
        const int e = (i & 2) ? e0 + 8 : e0;
        if (e > 8 * (i >> 2)) p0 = 0.f;
        if (e > 8 * (i >> 2) + 1) p1 = 0.f;
      }
      st[i] = p0;   // Pᵀ
      st[i + 1] = p1;
    }
    wgmma_wait<0>();
    reg_fence(dp);
#pragma unroll
    for (int i = 0; i < STR / 2; i += 2) {   // dSᵀ
      const float2 dl = *reinterpret_cast<const float2 *>(sd + 8 * (i >> 2) + 2 * t);
      dp[i] = st[i] * (dp[i] - dl.x);
      dp[i + 1] = st[i + 1] * (dp[i + 1] - dl.y);
    }
    uint32_t pa[STR / 16][4], da[STR / 16][4];
    pack_a<T>(pa, st);
    pack_a<T>(da, dp);
    reg_fence(dv);
    reg_fence(dk);
    wgmma_fence();
    issue_rs<T, D>(dv, pa, so);   // dv += Pᵀ dO
    issue_rs<T, D>(dk, da, sq);   // dk += dSᵀ q
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dv);
    reg_fence(dk);
    mbar_arrive(empty + 8 * s);
  }

  store_dkdv<T, D>(p, b, hk, dk, dv, key0, t);
#else
  __trap();   // built without sm_90a: bwd_wg_dispatch never launches this
#endif
}

template <typename T, int D, int STAGES>
__global__ void __launch_bounds__(THREADS, 1)
    flash_dq_wg_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                       const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                       const Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<D, STAGES>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base, sO = base + L::OFF_B, ring = base + L::OFF_RING;
  const uint32_t bar_q = base + L::OFF_BAR, full = bar_q + 8, empty = full + 8 * STAGES;   // + 8·stage

  // causal blocks longest first (the last query blocks see the most keys)
  const int qblk = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / p.H, h = bh % p.H, hk = h / p.group;
  const int q0 = qblk * RES;
  const int kend = p.causal ? min(p.Tk, q0 + RES + p.off) : p.Tk, ntile = max(0, (kend + STR - 1) / STR);
  const int wg = threadIdx.x >> 7;

  init_barriers<STAGES>(bar_q, full, empty, 1);   // full: the producer's expect_tx; the bytes complete it

  if (wg == 0) {
    dq_producer<D, STAGES>(&tq, &tk, &tv, &tdo, sQ, sO, ring, bar_q, full, empty, b, h, hk, q0, ntile);
    return;
  }

  // ---- consumers: 64 queries each ----
  setmaxnreg_inc<240>();
  const int cw = wg - 1, tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int qw0 = q0 + cw * 64, wrow = qw0 + warp * 16, row0 = wrow + g, row1 = row0 + 8;
  const uint32_t qa = sQ + cw * 64 * 128, oa = sO + cw * 64 * 128;   // this consumer's rows of q, dO
  float l0, l1, d0, d1;
  dq_row_stats(p, bh, row0, row1, l0, l1, d0, d1);

  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; i++) dq[i] = 0.f;
  if (ntile > 0) mbar_wait(bar_q, 0);

  for (int j = 0; j < ntile; j++) {
    const int s = j % STAGES, k0 = j * STR;
    mbar_wait(full + 8 * s, (j / STAGES) & 1);
    if (p.causal && k0 > qw0 + 63 + p.off) {   // no row of this consumer sees any key of the tile
      mbar_arrive(empty + 8 * s);
      continue;
    }
    const uint32_t sk = ring + s * L::STAGE, sv = sk + L::STR_BYTES;
    float sc[STR / 2], dp[STR / 2];
    wgmma_fence();
    issue_ss<T, D>(sc, qa, sk);   // S = q kᵀ
    issue_ss<T, D>(dp, oa, sv);   // dP = dO vᵀ
    wgmma_wait<1>();
    reg_fence(sc);
    const bool edge = k0 + STR > p.Tk || (p.causal && k0 + STR - 1 > wrow + p.off);
#pragma unroll
    for (int i = 0; i < STR / 2; i++) {
      const int col = k0 + 8 * (i >> 2) + 2 * t + (i & 1), row = (i & 2) ? row1 : row0;
      float pr = ex2_ftz(sc[i] * p.scale_log2 - ((i & 2) ? l1 : l0));
      if (edge && (col >= p.Tk || (p.causal && col > row + p.off))) pr = 0.f;
      sc[i] = pr;   // P
    }
    wgmma_wait<0>();
    reg_fence(dp);
#pragma unroll
    for (int i = 0; i < STR / 2; i++) dp[i] = sc[i] * (dp[i] - ((i & 2) ? d1 : d0));   // dS
    uint32_t da[STR / 16][4];
    pack_a<T>(da, dp);
    reg_fence(dq);
    wgmma_fence();
    issue_rs<T, D>(dq, da, sk);   // dq += dS k
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dq);
    mbar_arrive(empty + 8 * s);
  }

  T *gq = static_cast<T *>(p.dq) + b * p.dq_sb + h * p.dq_sh;
  store_rows<T, D>(gq, p.dq_st, dq, row0, p.Tq, p.Dv, t, p.scale);
#else
  __trap();   // built without sm_90a: bwd_wg_dispatch never launches this
#endif
}

template <typename T, int D>
int launch(const Params &p, const Maps &m, cudaStream_t s) {
  constexpr int ST = kStages<D>;
  constexpr size_t smem = Layout<D, ST>::SMEM;
  static_assert(smem <= 227 * 1024, "flash wg backward: shared memory over an H100 SM's 227 KB");
  if (p.Tk > 0) {
    auto k1 = flash_dkdv_wg_kernel<T, D, ST>;
    if (raise_smem(k1, smem)) return em_launch_check("flash_attention backward (wgmma dk, dv)");
    k1<<<dim3((unsigned)((p.Tk + RES - 1) / RES), (unsigned)(p.B * p.Hkv)), THREADS, smem, s>>>(m.q64, m.k128,
                                                                                              m.v128, m.do64, p);
    if (em_launch_check("flash_attention backward (wgmma dk, dv)")) return -1;
  }
  auto k2 = flash_dq_wg_kernel<T, D, ST>;
  if (raise_smem(k2, smem)) return em_launch_check("flash_attention backward (wgmma dq)");
  k2<<<dim3((unsigned)((p.Tq + RES - 1) / RES), (unsigned)(p.B * p.H)), THREADS, smem, s>>>(m.q128, m.k64, m.v64,
                                                                                            m.do128, p);
  return em_launch_check("flash_attention backward (wgmma dq)");
}

/* auto's choice: the wgmma kernels on sm_90 at D 64/128 (80/96 as 128) in bf16/f16, the
 * overlapped version (wg2). Their spec passed on an H100 (wg 2026-11-27, wg2
 * 2026-11-28) with the mma.sync backward's bits (docs/flash.md "Step 4",
 * "Step 4b"), so the switch changes speed, not results: wg2 is 8-15 % faster. */
constexpr bool kAutoWg = true;

/* From these lengths (Tq and Tk both) auto runs the one-kernel backward of
 * flash_bwd_fused.cu with dq's adds in a fixed order (fused: deterministic, dq
 * within one rounding of wg2's, dk/dv wg2's bits). H200, bf16, causal,
 * 2026-11-28 (docs/flash.md "Step 5e"): fused beats wg2 at T 4096 and 16384
 * (d64 0.428/3.855 vs 0.472/4.348 ms, d128 0.671/5.703 vs 0.676/6.152) and
 * loses at T 512-2048 (d128 T2048 0.728 vs 0.694), where its serial dq writer
 * has fewer tiles to overlap. */
constexpr int kAutoFusedMinT = 4096;

int g_bwd_mode = -1;   // -1: not read from EMBER_FLASH_BWD yet

int bwd_mode_of(const char *s) {
  if (!s || !*s || strcmp(s, "auto") == 0) return 0;
  if (strcmp(s, "mma") == 0) return 1;
  if (strcmp(s, "wg") == 0) return 2;
  if (strcmp(s, "wg2") == 0) return 3;   // flash_bwd_wg2.cu
  if (strcmp(s, "fused") == 0) return 4;      // flash_bwd_fused.cu, dq's adds in a fixed order
  if (strcmp(s, "fused_nd") == 0) return 5;   // the same, dq's adds in arrival order
  return -1;
}

}  // namespace

namespace flash {

/* EMBER_FLASH_STEP9 (flash_wg.cuh): one static for the forward and the backward; 1 the default (measured on the
 * H200, docs/flash.md "Step 9"), 0 the schedule before it. */
static int g_step9_old = -1;
int step9() {
  const int old = em_env_choice(&g_step9_old, "flash_attention", "EMBER_FLASH_STEP9", "1", "0");
  return old < 0 ? -1 : 1 - old;
}
static int g_pdl = -1;
int flash_pdl() { return em_env_choice(&g_pdl, "flash_attention", "EMBER_FLASH_PDL", "0", "1"); }
/* EMBER_FLASH_DELTA9: 1 the default (measured on the H200, docs/flash.md "Step 9b": the small step's dq kernel 20.9 →
 * 16.9 µs, the step 5.58 → 5.53 ms, the same bits), 0 Δ read from global memory as in Step 9. */
static int g_delta9_old = -1;
int flash_delta9() {
  const int old = em_env_choice(&g_delta9_old, "flash_attention", "EMBER_FLASH_DELTA9", "1", "0");
  return old < 0 ? -1 : 1 - old;
}

int bwd_kernel_mode() {
  if (g_bwd_mode < 0) {
    const char *env = getenv("EMBER_FLASH_BWD");
    int m = bwd_mode_of(env);
    if (m < 0)
      return em_error("flash_attention: expected EMBER_FLASH_BWD to be auto, mma, wg, wg2, fused or fused_nd, got '%s'",
                      env);
    g_bwd_mode = m;
  }
  return g_bwd_mode;
}

int bwd_wg_dispatch(Params &p, em_dtype dt, int d, int device, cudaStream_t s, DeltaLaunch delta) {
  int mode = bwd_kernel_mode();
  if (mode < 0) return -1;
  if (mode == 1 || (mode == 0 && !kAutoWg)) return kBwdNotTaken;
  const bool forced = mode >= 2;
  static const char *const names[] = {"auto", "mma", "wg", "wg2", "fused", "fused_nd"};
  const char *name = mode >= 2 ? names[mode] : "wg";   // the setting the errors name
  if (dt != EM_BF16 && dt != EM_F16) {
    if (forced) return em_error("flash_attention backward: the wgmma kernels (EMBER_FLASH_BWD=%s) expect bf16 or f16, "
                                "got %s", name, em_dtype_name(dt));
    return kBwdNotTaken;
  }
  const int kd = wg_kernel_dim(d);   // the kernels' head dim: 80 and 96 run as 128 (maps of the true d)
  if (kd < 0) return -1;
  if (kd == 0) {
    if (forced) return em_error("flash_attention backward: the wgmma kernels (EMBER_FLASH_BWD=%s) expect head dim 64 "
                                "or 128 (80 and 96 run as 128 unless EMBER_FLASH_WG_PAD=0), got %d", name, d);
    return kBwdNotTaken;
  }
  if (!sm90(device)) {
    if (forced) return em_error("flash_attention backward: the wgmma kernels (EMBER_FLASH_BWD=%s) need an sm_90 GPU "
                                "(H100/H200)", name);
    return kBwdNotTaken;
  }
  Maps m;
  bool ok = tma_map(&m.q64, dt, p.q, d, p.Tq, p.H, p.B, p.q_st, p.q_sh, p.q_sb, STR) &&
            tma_map(&m.q128, dt, p.q, d, p.Tq, p.H, p.B, p.q_st, p.q_sh, p.q_sb, RES) &&
            tma_map(&m.do64, dt, p.dout, d, p.Tq, p.H, p.B, p.do_st, p.do_sh, p.do_sb, STR) &&
            tma_map(&m.do128, dt, p.dout, d, p.Tq, p.H, p.B, p.do_st, p.do_sh, p.do_sb, RES) &&
            tma_map(&m.k64, dt, p.k, d, p.Tk, p.Hkv, p.B, p.k_st, p.k_sh, p.k_sb, STR) &&
            tma_map(&m.k128, dt, p.k, d, p.Tk, p.Hkv, p.B, p.k_st, p.k_sh, p.k_sb, RES) &&
            tma_map(&m.v64, dt, p.v, d, p.Tk, p.Hkv, p.B, p.v_st, p.v_sh, p.v_sb, STR) &&
            tma_map(&m.v128, dt, p.v, d, p.Tk, p.Hkv, p.B, p.v_st, p.v_sh, p.v_sb, RES);
  if (!ok) {
    if (forced) return em_error("flash_attention backward: the wgmma kernels (EMBER_FLASH_BWD=%s) could not describe "
                                "q, k, v or dO to TMA (strides must be positive multiples of 16 bytes)", name);
    return kBwdNotTaken;
  }
  if (mode == 0 && p.Tq >= kAutoFusedMinT && p.Tk >= kAutoFusedMinT) mode = 4;
  if (mode == 3 || mode == 0) {
    // the rope option's rotating epilogues are on the short-sequence schedule's kernels only; elsewhere p.rope is
    // cleared and the caller (em_flash_bwd_rope_cuda) rotates dq and dk with the rope kernel
    if (p.rope && !(step9() == 1 && bwd2_short(p, true))) p.rope = 0;
    return bwd_wg2_launch(p, m, dt, kd, delta, s);   // Δ there (EMBER_FLASH_STEP9)
  }
  p.rope = 0;
  if (delta(p, s)) return -1;
  if (mode == 4 || mode == 5) return bwd_fused_launch(p, m, dt, kd, mode == 4, device, s);
  if (dt == EM_BF16) return kd == 64 ? launch<__nv_bfloat16, 64>(p, m, s) : launch<__nv_bfloat16, 128>(p, m, s);
  return kd == 64 ? launch<__half, 64>(p, m, s) : launch<__half, 128>(p, m, s);
}

}  // namespace flash

/* EMBER_FLASH_BWD's setting (0 auto, 1 mma, 2 wg, 3 wg2, 4 fused, 5 fused_nd); mode >= 0 sets it first. */
extern "C" int em_flash_bwd_kernel(int mode) {
  int prev = bwd_kernel_mode();
  if (prev < 0) return -1;
  if (mode >= 0) g_bwd_mode = mode;
  return prev;
}
