/* FlashAttention-2 backward, deterministic: with P = exp(S·scale − lse),
 * dP = dO vᵀ, Δ = rowsum(dO ∘ o) and dS = P ∘ (dP − Δ):
 *   dv = Pᵀ dO,  dk = scale · dSᵀ q,  dq = scale · dS k.
 *
 * Three kernels, no atomics (so gradients are bit-reproducible run to run):
 *   delta    Δ per query row (reads o and dO once).
 *   dkdv     one block per 64-key block; each warp owns 16 keys and walks the
 *            query tiles (from the diagonal on, when causal), recomputing Sᵀ
 *            = k qᵀ so Pᵀ and dSᵀ come out already in the A-operand layout
 *            for dv += Pᵀ dO and dk += dSᵀ q (registers only).
 *   dq       one block per 64-query block; each warp owns 16 queries and
 *            walks the key tiles, recomputing S and dP = dO vᵀ.
 * The price of determinism is recomputing S and dP in the dq kernel: 7 MMAs
 * per tile pair instead of FA2's 5 (with atomics on dq). Cost per (batch,
 * head): 14·Tq·Tk·D FLOPs (half with the causal mask).
 *
 * Grouped-query attention: a dkdv block belongs to one kv head and walks the
 * query tiles of each q head of its group in turn (h = hk·group + g, g
 * ascending), so dk and dv are the group's sums in a fixed order. Causal
 * masks keep key j for row i when j <= i + off (flash_fwd.cu). At D = 256 the
 * dk/dv and dq accumulators are split over two blocks by columns (grid z):
 * each recomputes S and dP over all of D, which costs 1.5x the MMAs but
 * keeps 128 accumulators per thread instead of 256.
 *
 * On sm_90 (bf16/f16, D 64 and 128; 80 and 96 as 128, flash_wg.cuh's wg_kernel_dim) EMBER_FLASH_BWD=auto (the default) or wg2
 * runs the overlapped wgmma/TMA dk/dv and dq kernels of flash_bwd_wg2.cu (wg:
 * flash_bwd_wg.cu's, without the overlap) after the delta kernel instead, and
 * from Tq = Tk = 4096 the one-kernel deterministic backward of
 * flash_bwd_fused.cu (kAutoFusedMinT in flash_bwd_wg.cu). */
#include "backend.h"
#include "flash_common.cuh"
#include "rope_math.cuh"
#include "flash_wg.cuh"

using namespace flash;

namespace {

constexpr int kWarps = 4, kThreads = kWarps * 32, kBk = 64, kBq1 = 64;

template <typename T, int D>
__global__ void __launch_bounds__(256) flash_delta_kernel(Params p) {
  int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, n = (int64_t)p.B * p.H * p.Tq;
  if (r >= n) return;
  int i = (int)(r % p.Tq);
  int64_t bh = r / p.Tq;
  int b = (int)(bh / p.H), h = (int)(bh % p.H);
  const T *o = static_cast<const T *>(p.o) + b * p.o_sb + h * p.o_sh + i * p.o_st;
  const T *d = static_cast<const T *>(p.dout) + b * p.do_sb + h * p.do_sh + i * p.do_st;
  p.delta[r] = delta_row<T, D>(o, d, D);
}

/* The k/v (dkdv) or q/dO (dq) tiles a block streams through are
 * double-buffered and loaded with cp.async, as in the forward: at the top of
 * iteration j a thread waits for its copies of tile j, __syncthreads
 * publishes them and proves every warp is done with tile j − 1's stage, and
 * the copies of tile j + 1 are issued into that stage; they land while tile j
 * is computed. One barrier per tile. */

/* dk, dv for 64 keys of one kv head, columns [blockIdx.z·NC, +NC) of D; query
 * tiles of BQ rows, of every q head of the kv head's group in turn (one
 * stream of group · nq tiles, so the pipeline runs on across heads). */
template <typename T, int D, int BQ, int NC>
__global__ void __launch_bounds__(kThreads, D <= 80 ? 3 : 2) flash_dkdv_kernel(Params p) {
  constexpr int LD = D + kEpc<T>, KS = kStep<T>, STAGE = 2 * BQ * LD;   // one stage: sQ then sO, BQ rows each
  extern __shared__ __align__(16) unsigned char smem[];
  T *sK = reinterpret_cast<T *>(smem), *sV = sK + kBk * LD, *sQO = sV + kBk * LD;
  float *sLD = reinterpret_cast<float *>(sQO + 2 * STAGE);   // stage st: lse at sLD + 2·BQ·st, delta BQ on
  const int bhk = blockIdx.y, b = bhk / p.Hkv, hk = bhk % p.Hkv, k0 = blockIdx.x * kBk, c0 = blockIdx.z * NC;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const T *k = static_cast<const T *>(p.k) + b * p.k_sb + hk * p.k_sh;
  const T *v = static_cast<const T *>(p.v) + b * p.v_sb + hk * p.v_sh;
  // the first query row that sees key k0 is k0 - off (causal), on a tile boundary
  const int qstart = p.causal ? (max(0, k0 - p.off) / BQ) * BQ : 0;
  const int nq = max(0, (p.Tq - qstart + BQ - 1) / BQ), ntile = p.group * nq;

  // copies of tile j (q head hk·group + j / nq, query rows from i0) into stage j & 1, committed
  auto issue = [&](int j) {
    const int hg = j / nq, i0 = qstart + (j - hg * nq) * BQ, h = hk * p.group + hg;
    T *sQ = sQO + (j & 1) * STAGE;
    cp_tile<T, D, BQ, kThreads>(sQ, static_cast<const T *>(p.q) + b * p.q_sb + h * p.q_sh, p.q_st, i0, p.Tq);
    cp_tile<T, D, BQ, kThreads>(sQ + BQ * LD, static_cast<const T *>(p.dout) + b * p.do_sb + h * p.do_sh, p.do_st,
                                i0, p.Tq);
    if (threadIdx.x < BQ) {   // rows past Tq get 0: masked below
      const int r = threadIdx.x;
      const bool in = i0 + r < p.Tq;
      const int64_t at = (int64_t)(b * p.H + h) * p.Tq + (in ? i0 + r : 0);
      float *sL = sLD + (j & 1) * 2 * BQ;
      cp_async4(sL + r, p.lse + at, in ? 4 : 0);
      cp_async4(sL + BQ + r, p.delta + at, in ? 4 : 0);
    }
    cp_async_commit();
  };
  if (ntile > 0) {   // k, v ride in tile 0's group
    cp_tile<T, D, kBk, kThreads>(sK, k, p.k_st, k0, p.Tk);
    cp_tile<T, D, kBk, kThreads>(sV, v, p.v_st, k0, p.Tk);
    issue(0);
  }

  float dk[NC / 8][4], dv[NC / 8][4];
#pragma unroll
  for (int i = 0; i < NC / 8; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.f;
  const int key0 = k0 + warp * 16 + g, key1 = key0 + 8;

  // tiles in order of q head, then query rows: the group's sums in a fixed order (deterministic)
  for (int j = 0; j < ntile; j++) {
    const int i0 = qstart + (j % nq) * BQ;
    cp_async_wait<0>();   // this thread's copies of tile j landed
    __syncthreads();      // everyone's did, and every warp is done with tile j - 1's stage
    if (j + 1 < ntile) issue(j + 1);
    const T *sQ = sQO + (j & 1) * STAGE, *sO = sQ + BQ * LD;
    const float *sL = sLD + (j & 1) * 2 * BQ, *sD = sL + BQ;

    float st[BQ / 8][4], dp[BQ / 8][4];
#pragma unroll
    for (int i = 0; i < BQ / 8; i++)
#pragma unroll
      for (int e = 0; e < 4; e++) st[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / KS; kk++) {       // Sᵀ = k qᵀ and dPᵀ = v dOᵀ
      uint32_t ak[4], av[4];
      ld_frag(ak, a_addr<LD>(sK, warp * 16, kk * KS, lane));
      ld_frag(av, a_addr<LD>(sV, warp * 16, kk * KS, lane));
#pragma unroll
      for (int n2 = 0; n2 < BQ / 16; n2++) {
        uint32_t bq[4], bo[4];
        ld_frag(bq, bn_addr<LD>(sQ, n2 * 16, kk * KS, lane));
        ld_frag(bo, bn_addr<LD>(sO, n2 * 16, kk * KS, lane));
        Mma<T>::run(st[2 * n2], ak, bq[0], bq[1]);
        Mma<T>::run(st[2 * n2 + 1], ak, bq[2], bq[3]);
        Mma<T>::run(dp[2 * n2], av, bo[0], bo[1]);
        Mma<T>::run(dp[2 * n2 + 1], av, bo[2], bo[3]);
      }
    }
    const bool diag = p.causal && i0 + p.off < k0 + kBk, pad = i0 + BQ > p.Tq;
#pragma unroll
    for (int i = 0; i < BQ / 8; i++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int c = i * 8 + 2 * t + (e & 1);
        // lse·log2(e) rounded on its own (no fused multiply-add), as the dq kernel computes it
        float pr = ex2_ftz(st[i][e] * p.scale_log2 - __fmul_rn(sL[c], kLog2e));
        if ((diag || pad) && ((diag && (e < 2 ? key0 : key1) > i0 + c + p.off) || i0 + c >= p.Tq)) pr = 0.f;
        st[i][e] = pr;                               // Pᵀ
        dp[i][e] = pr * (dp[i][e] - sD[c]);          // dSᵀ
      }
#pragma unroll
    for (int kk = 0; kk < BQ / KS; kk++) {      // dv += Pᵀ dO, dk += dSᵀ q
      uint32_t pa[4], da[4];
      c_to_a<T>(st, kk, pa);
      c_to_a<T>(dp, kk, da);
#pragma unroll
      for (int n2 = 0; n2 < NC / 16; n2++) {
        uint32_t bo[4], bq[4];
        ld_frag_kn<LD>(bo, sO, kk * KS, c0 + n2 * 16, lane);
        ld_frag_kn<LD>(bq, sQ, kk * KS, c0 + n2 * 16, lane);
        Mma<T>::run(dv[2 * n2], pa, bo[0], bo[1]);
        Mma<T>::run(dv[2 * n2 + 1], pa, bo[2], bo[3]);
        Mma<T>::run(dk[2 * n2], da, bq[0], bq[1]);
        Mma<T>::run(dk[2 * n2 + 1], da, bq[2], bq[3]);
      }
    }
  }

  T *gk = static_cast<T *>(p.dk) + b * p.dk_sb + hk * p.dk_sh;
  T *gv = static_cast<T *>(p.dv) + b * p.dv_sb + hk * p.dv_sh;
#pragma unroll
  for (int i = 0; i < NC / 8; i++) {
    int col = c0 + i * 8 + 2 * t;
    if (key0 < p.Tk) {
      store2(gk + (int64_t)key0 * p.dk_st + col, dk[i][0] * p.scale, dk[i][1] * p.scale);
      store2(gv + (int64_t)key0 * p.dv_st + col, dv[i][0], dv[i][1]);
    }
    if (key1 < p.Tk) {
      store2(gk + (int64_t)key1 * p.dk_st + col, dk[i][2] * p.scale, dk[i][3] * p.scale);
      store2(gv + (int64_t)key1 * p.dv_st + col, dv[i][2], dv[i][3]);
    }
  }
}

/* dq for 64 queries, columns [blockIdx.z·NC, +NC) of D; key tiles of BK rows. */
template <typename T, int D, int BK, int NC>
__global__ void __launch_bounds__(kThreads) flash_dq_kernel(Params p) {
  constexpr int LD = D + kEpc<T>, KS = kStep<T>, BQ = 64, STAGE = 2 * BK * LD;   // one stage: sK then sV, BK rows each
  extern __shared__ __align__(16) unsigned char smem[];
  T *sQ = reinterpret_cast<T *>(smem), *sO = sQ + BQ * LD, *sKV = sO + BQ * LD;
  const int qblk = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / p.H, h = bh % p.H, q0 = qblk * BQ;
  const int hk = h / p.group, c0 = blockIdx.z * NC;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const T *q = static_cast<const T *>(p.q) + b * p.q_sb + h * p.q_sh;
  const T *k = static_cast<const T *>(p.k) + b * p.k_sb + hk * p.k_sh;
  const T *v = static_cast<const T *>(p.v) + b * p.v_sb + hk * p.v_sh;
  const T *dout = static_cast<const T *>(p.dout) + b * p.do_sb + h * p.do_sh;
  const int row0 = q0 + warp * 16 + g, row1 = row0 + 8;
  const float *lse = p.lse + (int64_t)bh * p.Tq, *delta = p.delta + (int64_t)bh * p.Tq;
  const float l0 = row0 < p.Tq ? lse[row0] * kLog2e : INFINITY, l1 = row1 < p.Tq ? lse[row1] * kLog2e : INFINITY;
  const float d0 = row0 < p.Tq ? delta[row0] : 0.f, d1 = row1 < p.Tq ? delta[row1] : 0.f;
  const int kend = p.causal ? min(p.Tk, q0 + BQ + p.off) : p.Tk, ntile = (kend + BK - 1) / BK;

  if (ntile > 0) {   // q, dO and key tile 0: one group
    cp_tile<T, D, BQ, kThreads>(sQ, q, p.q_st, q0, p.Tq);
    cp_tile<T, D, BQ, kThreads>(sO, dout, p.do_st, q0, p.Tq);
    cp_tile<T, D, BK, kThreads>(sKV, k, p.k_st, 0, p.Tk);
    cp_tile<T, D, BK, kThreads>(sKV + BK * LD, v, p.v_st, 0, p.Tk);
    cp_async_commit();
  }
  float dq[NC / 8][4];
#pragma unroll
  for (int i = 0; i < NC / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;

  for (int j = 0; j < ntile; j++) {
    const int k0 = j * BK;
    cp_async_wait<0>();   // this thread's copies of tile j landed
    __syncthreads();      // everyone's did, and every warp is done with tile j - 1's stage
    if (j + 1 < ntile) {
      T *nK = sKV + ((j + 1) & 1) * STAGE;
      cp_tile<T, D, BK, kThreads>(nK, k, p.k_st, k0 + BK, p.Tk);
      cp_tile<T, D, BK, kThreads>(nK + BK * LD, v, p.v_st, k0 + BK, p.Tk);
      cp_async_commit();
    }
    const T *sK = sKV + (j & 1) * STAGE, *sV = sK + BK * LD;
    float s[BK / 8][4], dp[BK / 8][4];
#pragma unroll
    for (int i = 0; i < BK / 8; i++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / KS; kk++) {       // S = q kᵀ and dP = dO vᵀ
      uint32_t aq[4], ao[4];
      ld_frag(aq, a_addr<LD>(sQ, warp * 16, kk * KS, lane));
      ld_frag(ao, a_addr<LD>(sO, warp * 16, kk * KS, lane));
#pragma unroll
      for (int n2 = 0; n2 < BK / 16; n2++) {
        uint32_t bk[4], bv[4];
        ld_frag(bk, bn_addr<LD>(sK, n2 * 16, kk * KS, lane));
        ld_frag(bv, bn_addr<LD>(sV, n2 * 16, kk * KS, lane));
        Mma<T>::run(s[2 * n2], aq, bk[0], bk[1]);
        Mma<T>::run(s[2 * n2 + 1], aq, bk[2], bk[3]);
        Mma<T>::run(dp[2 * n2], ao, bv[0], bv[1]);
        Mma<T>::run(dp[2 * n2 + 1], ao, bv[2], bv[3]);
      }
    }
    const bool edge = k0 + BK > p.Tk || (p.causal && k0 + BK - 1 > q0 + warp * 16 + p.off);
#pragma unroll
    for (int i = 0; i < BK / 8; i++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int col = k0 + i * 8 + 2 * t + (e & 1), row = e < 2 ? row0 : row1;
        float pr = ex2_ftz(s[i][e] * p.scale_log2 - (e < 2 ? l0 : l1));
        if (edge && (col >= p.Tk || (p.causal && col > row + p.off))) pr = 0.f;
        dp[i][e] = pr * (dp[i][e] - (e < 2 ? d0 : d1));   // dS
      }
#pragma unroll
    for (int kk = 0; kk < BK / KS; kk++) {      // dq += dS k
      uint32_t da[4];
      c_to_a<T>(dp, kk, da);
#pragma unroll
      for (int n2 = 0; n2 < NC / 16; n2++) {
        uint32_t bk[4];
        ld_frag_kn<LD>(bk, sK, kk * KS, c0 + n2 * 16, lane);
        Mma<T>::run(dq[2 * n2], da, bk[0], bk[1]);
        Mma<T>::run(dq[2 * n2 + 1], da, bk[2], bk[3]);
      }
    }
  }

  T *gq = static_cast<T *>(p.dq) + b * p.dq_sb + h * p.dq_sh;
#pragma unroll
  for (int i = 0; i < NC / 8; i++) {
    int col = c0 + i * 8 + 2 * t;
    if (row0 < p.Tq) store2(gq + (int64_t)row0 * p.dq_st + col, dq[i][0] * p.scale, dq[i][1] * p.scale);
    if (row1 < p.Tq) store2(gq + (int64_t)row1 * p.dq_st + col, dq[i][2] * p.scale, dq[i][3] * p.scale);
  }
}

template <typename K>
int set_smem(K kern, size_t smem) {
  if (smem > 48 * 1024 &&
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
    return -1;
  return 0;
}

template <typename T, int D>
int launch_delta(const Params &p, cudaStream_t s) {
  const int64_t rows = (int64_t)p.B * p.H * p.Tq;
  flash_delta_kernel<T, D><<<(unsigned)((rows + 255) / 256), 256, 0, s>>>(p);
  return em_launch_check("flash_attention backward (delta)");
}

template <typename T, int D>
int launch_bwd(Params &p, em_dtype dt, int device, cudaStream_t s) {
  // NC: the columns of dk/dv (dq) one block accumulates; at D = 256 two
  // blocks split them, each recomputing S and dP, as 2·128 f32 accumulators
  // per thread would not fit in registers. BQ (BK2): the streamed query (key)
  // tile; two stages of it, so D = 256 takes 16 rows to keep two blocks per
  // SM within the 227 KB of shared memory. Chosen by a row's bytes, so f32
  // (twice the bytes) takes the next smaller tile: 64 rows up to D = 32, 32
  // at D = 64, 16 from D = 80 (2-3 blocks per SM as for bf16).
  constexpr int RB = D * (int)sizeof(T);
  constexpr int BQ = RB <= 128 ? kBq1 : RB <= 256 ? 32 : 16, BK2 = BQ, LD = D + kEpc<T>, NC = D <= 128 ? D : 128;
  // the wgmma dk/dv and dq kernels (flash_bwd_wg.cu) where EMBER_FLASH_BWD asks for them, with the delta kernel
  // before them where they need it
  const int rc = bwd_wg_dispatch(p, dt, D, device, s, launch_delta<T, D>);
  if (rc != kBwdNotTaken) return rc;
  p.rope = 0;   // these kernels do not rotate: the caller of em_flash_bwd_rope_cuda does
  if (launch_delta<T, D>(p, s)) return -1;

  // k, v; two stages of (q, dO) tiles and of their lse, delta
  constexpr size_t smem1 = (size_t)(2 * kBk + 4 * BQ) * LD * sizeof(T) + 4 * BQ * sizeof(float);
  static_assert(smem1 <= 227 * 1024, "flash backward (dk, dv): shared memory over an H100 SM's 227 KB");
  auto k1 = flash_dkdv_kernel<T, D, BQ, NC>;
  if (set_smem(k1, smem1)) return em_launch_check("flash_attention backward (dk, dv)");
  k1<<<dim3((unsigned)((p.Tk + kBk - 1) / kBk), (unsigned)(p.B * p.Hkv), D / NC), kThreads, smem1, s>>>(p);
  if (em_launch_check("flash_attention backward (dk, dv)")) return -1;

  // q, dO; two stages of (k, v) tiles
  constexpr size_t smem2 = (size_t)(2 * 64 + 4 * BK2) * LD * sizeof(T);
  static_assert(smem2 <= 227 * 1024, "flash backward (dq): shared memory over an H100 SM's 227 KB");
  auto k2 = flash_dq_kernel<T, D, BK2, NC>;
  if (set_smem(k2, smem2)) return em_launch_check("flash_attention backward (dq)");
  k2<<<dim3((unsigned)((p.Tq + 63) / 64), (unsigned)(p.B * p.H), D / NC), kThreads, smem2, s>>>(p);
  return em_launch_check("flash_attention backward (dq)");
}

}  // namespace

/* em_flash_bwd_cuda's body on p, which may carry the rope option (cleared where the kernels that ran do not rotate). */
static int flash_bwd_run(Params &p, const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *o,
                         const em_tensor *lse, const em_tensor *dout, em_tensor *delta, em_tensor *dq, em_tensor *dk,
                         em_tensor *dv, int causal, float scale) {
  set_qkv(p, q, k, v, o, causal, scale);
  p.o = em_data_ptr(o); p.dout = em_data_ptr(dout);
  p.dq = em_data_ptr(dq); p.dk = em_data_ptr(dk); p.dv = em_data_ptr(dv);
  p.lse = static_cast<float *>(em_data_ptr(lse));
  p.delta = static_cast<float *>(em_data_ptr(delta));
  p.do_sb = dout->stride[0]; p.do_sh = dout->stride[1]; p.do_st = dout->stride[2];
  p.dq_sb = dq->stride[0]; p.dq_sh = dq->stride[1]; p.dq_st = dq->stride[2];
  p.dk_sb = dk->stride[0]; p.dk_sh = dk->stride[1]; p.dk_st = dk->stride[2];
  p.dv_sb = dv->stride[0]; p.dv_sh = dv->stride[1]; p.dv_st = dv->stride[2];
  if (p.B * p.H == 0 || p.Tq == 0) return 0;
  cudaStream_t s = em_cur_stream(q->device.index);
  int d = (int)q->shape[3], rc = -2;
  if (q->dtype == EM_BF16) {
    FLASH_DISPATCH_D(d, D, rc = launch_bwd<__nv_bfloat16, D>(p, q->dtype, q->device.index, s);)
  } else if (q->dtype == EM_F16) {
    FLASH_DISPATCH_D(d, D, rc = launch_bwd<__half, D>(p, q->dtype, q->device.index, s);)
  } else if (q->dtype == EM_F32) {
    FLASH_DISPATCH_D(d, D, rc = launch_bwd<float, D>(p, q->dtype, q->device.index, s);)
  }
  if (rc == -2) return em_error("flash_attention backward: no kernel for head dim %d", d);
  return rc;
}

extern "C" int em_flash_bwd_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *o,
                                 const em_tensor *lse, const em_tensor *dout, em_tensor *delta, em_tensor *dq,
                                 em_tensor *dk, em_tensor *dv, int causal, float scale) {
  Params p = {};
  return flash_bwd_run(p, q, k, v, o, lse, dout, delta, dq, dk, dv, causal, scale);
}

extern "C" int em_flash_bwd_rope_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *o,
                                      const em_tensor *lse, const em_tensor *dout, em_tensor *delta, em_tensor *dq,
                                      em_tensor *dk, em_tensor *dv, int causal, float scale, const em_tensor *pos,
                                      double theta) {
  const int64_t d = q->shape[3];
  if (pos->dtype != EM_I64 && pos->dtype != EM_I32)
    return em_error("flash_attention backward: rope positions must be i32 or i64, got %s", em_dtype_name(pos->dtype));
  Params p = {};
  if (d / 2 <= kRopeMaxHalf) {   // wider heads: no epilogue rotates them, the caller does
    int64_t ps[3];
    em_broadcast_strides(pos, 3, q->shape, ps);
    p.rope = pos->dtype == EM_I64 ? 1 : 2;
    p.rope_pos = em_data_ptr(pos);
    p.rp_sb = ps[0]; p.rp_sh = ps[1]; p.rp_st = ps[2];
    for (int64_t j = 0; j < d / 2; j++) p.rope_inv[j] = rope::inv_freq(theta, j, d);
  }
  const int rc = flash_bwd_run(p, q, k, v, o, lse, dout, delta, dq, dk, dv, causal, scale);
  return rc ? rc : p.rope != 0;
}
