/* FlashAttention-2 forward: o = softmax(q kᵀ · scale [+ causal mask]) v
 * without materialising the (Tq, Tk) scores, and the rows' log-sum-exp for
 * the backward pass.
 *
 * Cost per (batch, head): 4·Tq·Tk·D FLOPs (half of that with the causal
 * mask, whose fully masked tiles are skipped), reading q once and k, v once
 * per query block (128 rows; 64 at D = 256); writing o and lse. At the small
 * config (B 4, H 12, T 512, D 64, causal) that is 3.2 GFLOP per layer, ~10 µs
 * on an H100 at a third of its dense bf16 peak, where the naive composition
 * moves ~0.3 GB of f32 scores.
 *
 * Tiling (FwdCfg): one block of 8 warps per (128-query block, batch·head)
 * for D <= 128, 4 warps and 64 queries at D = 256; each warp owns 16 query
 * rows and keeps the running max m, the sum l and the o accumulator (and q's
 * fragments, but at D = 64 and 256) in registers. Per key tile (64 keys; 32
 * at D = 256): S = q kᵀ (mma.sync), online softmax in base 2 (the scale is
 * folded into log2 e), then o += P v with P taken straight from the S
 * registers (see flash_common.cuh). k and v tiles are double-buffered and
 * loaded with cp.async, the next tile's copies in flight while this one is
 * computed (docs/flash.md, "Step 1: pipelining"). Query blocks with the most
 * work (the causal diagonal's far end) are scheduled first.
 *
 * Grouped-query attention: head h reads kv head h / group (Params). Causal
 * masks keep key j for row i when j <= i + off: off 0 is top-left aligned,
 * Tk - Tq bottom-right. Few queries against many keys go to the split-key
 * decode kernel instead (flash_decode.cu), chosen in em_flash_fwd_cuda. */
#include "backend.h"
#include "flash_common.cuh"
#include "flash_wg.cuh"

using namespace flash;

namespace {

/* Tile shapes per head dim. WARPS warps of 16 query rows each (BR = 16·WARPS
 * rows per block), BC keys per k/v tile, MINB the blocks per SM asked of the
 * register allocator, QREG whether q's fragments stay in registers.
 * D <= 128: 8 warps, 128 query rows (each k/v tile is read from L2 once per
 * 128 queries instead of 64). D <= 64: two such blocks per SM, which caps a
 * thread at 128 registers; at D = 64 that holds only with q re-read from
 * shared memory at every k step (143 registers with q in registers: one block
 * per SM). D = 256: 4 warps and 32-key tiles, so two blocks fit the 227 KB of
 * shared memory of an SM; q stays in shared memory (o alone is 128 f32). */
template <typename T, int D> struct FwdCfg {
  static constexpr int WARPS = D <= 128 ? 8 : 4, BR = WARPS * 16, BC = D <= 128 ? 64 : 32, MINB = D <= 64 ? 2 : 1;
  // f32 (TF32): q's fragments would be 2x the registers (D/2 per thread): always from shared memory
  static constexpr bool QREG = D <= 128 && D != 64 && sizeof(T) == 2;
  static constexpr int THREADS = WARPS * 32, LD = D + kEpc<T>;
  // sQ, then two stages of (sK, sV)
  static constexpr size_t SMEM_ELEMS = (size_t)(BR + 4 * BC) * LD;
};

/* The pipeline: k/v tiles are double-buffered in shared memory and loaded
 * with cp.async. At the top of iteration j the thread waits for its copies
 * of tile j, a __syncthreads publishes them (and proves every warp is done
 * with iteration j − 1, whose stage tile j + 1 overwrites), and the copies of
 * tile j + 1 are issued; they land while S = q kᵀ, the softmax and o += P v
 * of tile j run. One barrier per tile. */
template <typename T, int D>
__global__ void __launch_bounds__(FwdCfg<T, D>::THREADS, FwdCfg<T, D>::MINB) flash_fwd_kernel(Params p) {
  using C = FwdCfg<T, D>;
  constexpr int LD = C::LD, BR = C::BR, BC = C::BC, NT = C::THREADS, KS = kStep<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  T *sQ = reinterpret_cast<T *>(smem), *sK0 = sQ + BR * LD;   // stage st: sK0 + st·2·BC·LD, its V BC·LD on
  const int qblk = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / p.H, h = bh % p.H, hk = h / p.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const T *q = static_cast<const T *>(p.q) + b * p.q_sb + h * p.q_sh;
  const T *k = static_cast<const T *>(p.k) + b * p.k_sb + hk * p.k_sh;
  const T *v = static_cast<const T *>(p.v) + b * p.v_sb + hk * p.v_sh;
  const int q0 = qblk * BR;
  const int kend = p.causal ? min(p.Tk, q0 + BR + p.off) : p.Tk, ntile = (kend + BC - 1) / BC;

  // groups: q, then k/v tile 0 (an empty group when there is no key)
  cp_tile<T, D, BR, NT>(sQ, q, p.q_st, q0, p.Tq);
  cp_async_commit();
  if (ntile > 0) {
    cp_tile<T, D, BC, NT>(sK0, k, p.k_st, 0, p.Tk);
    cp_tile<T, D, BC, NT>(sK0 + BC * LD, v, p.v_st, 0, p.Tk);
  }
  cp_async_commit();
  cp_async_wait<1>();   // q landed (tile 0 may still be in flight)
  __syncthreads();
  // q fragments in registers, or read from sQ at every k step (FwdCfg)
  constexpr bool kQReg = C::QREG;
  uint32_t qf[kQReg ? D / KS : 1][4];
  if constexpr (kQReg) {
#pragma unroll
    for (int kk = 0; kk < D / KS; kk++) ld_frag(qf[kk], a_addr<LD>(sQ, warp * 16, kk * KS, lane));
  }

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int row0 = q0 + warp * 16 + g, row1 = row0 + 8;
  // causal: the last key any of this warp's rows sees
  const int wlast = p.causal ? q0 + warp * 16 + 15 + p.off : INT_MAX;

  for (int j = 0; j < ntile; j++) {
    const int k0 = j * BC;
    cp_async_wait<0>();   // this thread's copies of tile j landed
    __syncthreads();      // everyone's did, and every warp is done with tile j - 1's stage
    if (j + 1 < ntile) {
      T *nK = sK0 + ((j + 1) & 1) * 2 * BC * LD;
      cp_tile<T, D, BC, NT>(nK, k, p.k_st, k0 + BC, p.Tk);
      cp_tile<T, D, BC, NT>(nK + BC * LD, v, p.v_st, k0 + BC, p.Tk);
      cp_async_commit();
    }
    if (k0 > wlast) continue;   // every key of the tile is masked for this warp's rows: nothing to add
    const T *sK = sK0 + (j & 1) * 2 * BC * LD, *sV = sK + BC * LD;

    float s[BC / 8][4];
#pragma unroll
    for (int i = 0; i < BC / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / KS; kk++) {
      uint32_t qa[4];
      if constexpr (kQReg) {
        qa[0] = qf[kk][0]; qa[1] = qf[kk][1]; qa[2] = qf[kk][2]; qa[3] = qf[kk][3];
      } else {
        ld_frag(qa, a_addr<LD>(sQ, warp * 16, kk * KS, lane));
      }
#pragma unroll
      for (int n2 = 0; n2 < BC / 16; n2++) {
        uint32_t bf[4];
        ld_frag(bf, bn_addr<LD>(sK, n2 * 16, kk * KS, lane));
        Mma<T>::run(s[2 * n2], qa, bf[0], bf[1]);
        Mma<T>::run(s[2 * n2 + 1], qa, bf[2], bf[3]);
      }
    }
    const bool edge = k0 + BC > p.Tk || (p.causal && k0 + BC - 1 > q0 + warp * 16 + p.off);
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int i = 0; i < BC / 8; i++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = s[i][e] * p.scale_log2;
        if (edge) {
          int col = k0 + i * 8 + 2 * t + (e & 1), row = e < 2 ? row0 : row1;
          if (col >= p.Tk || (p.causal && col > row + p.off)) x = -INFINITY;
        }
        s[i][e] = x;
      }
      mx0 = fmaxf(mx0, fmaxf(s[i][0], s[i][1]));
      mx1 = fmaxf(mx1, fmaxf(s[i][2], s[i][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // a row with every key so far masked keeps m = -inf: use 0 as its base so exp2 gives 0, not NaN
    const float b0 = mx0 == -INFINITY ? 0.f : mx0, b1 = mx1 == -INFINITY ? 0.f : mx1;
    const float a0 = exp2f(m0 - b0), a1 = exp2f(m1 - b1);
    m0 = mx0; m1 = mx1;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int i = 0; i < BC / 8; i++) {
      s[i][0] = exp2f(s[i][0] - b0); s[i][1] = exp2f(s[i][1] - b0);
      s[i][2] = exp2f(s[i][2] - b1); s[i][3] = exp2f(s[i][3] - b1);
      rs0 += s[i][0] + s[i][1];
      rs1 += s[i][2] + s[i][3];
    }
    l0 = l0 * a0 + rs0;
    l1 = l1 * a1 + rs1;
#pragma unroll
    for (int i = 0; i < D / 8; i++) { o[i][0] *= a0; o[i][1] *= a0; o[i][2] *= a1; o[i][3] *= a1; }
#pragma unroll
    for (int kk = 0; kk < BC / KS; kk++) {
      uint32_t pa[4];
      c_to_a<T>(s, kk, pa);
#pragma unroll
      for (int n2 = 0; n2 < D / 16; n2++) {
        uint32_t bf[4];
        ld_frag_kn<LD>(bf, sV, kk * KS, n2 * 16, lane);
        Mma<T>::run(o[2 * n2], pa, bf[0], bf[1]);
        Mma<T>::run(o[2 * n2 + 1], pa, bf[2], bf[3]);
      }
    }
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  T *out = static_cast<T *>(p.out) + b * p.o_sb + h * p.o_sh;
#pragma unroll
  for (int i = 0; i < D / 8; i++) {
    int col = i * 8 + 2 * t;
    if (row0 < p.Tq) store2(out + (int64_t)row0 * p.o_st + col, o[i][0] * inv0, o[i][1] * inv0);
    if (row1 < p.Tq) store2(out + (int64_t)row1 * p.o_st + col, o[i][2] * inv1, o[i][3] * inv1);
  }
  if (t == 0) {
    float *lse = p.lse + (int64_t)bh * p.Tq;
    if (row0 < p.Tq) lse[row0] = l0 > 0.f ? (m0 + log2f(l0)) * kLn2 : -INFINITY;
    if (row1 < p.Tq) lse[row1] = l1 > 0.f ? (m1 + log2f(l1)) * kLn2 : -INFINITY;
  }
}

template <typename T, int D>
int launch_fwd(const Params &p, cudaStream_t s) {
  using C = FwdCfg<T, D>;
  constexpr size_t smem = C::SMEM_ELEMS * sizeof(T);
  static_assert(smem <= 227 * 1024, "flash forward: shared memory over an H100 SM's 227 KB");
  auto kern = flash_fwd_kernel<T, D>;
  if (smem > 48 * 1024 && cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
    return em_launch_check("flash_attention");
  dim3 grid((unsigned)((p.Tq + C::BR - 1) / C::BR), (unsigned)(p.B * p.H));
  kern<<<grid, C::THREADS, smem, s>>>(p);
  return em_launch_check("flash_attention");
}

}  // namespace

extern "C" bool em_flash_supported_dim(int64_t d) {
  return d == 16 || d == 32 || d == 64 || d == 80 || d == 96 || d == 128 || d == 256;
}

extern "C" int em_flash_fwd_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, em_tensor *o,
                                 em_tensor *lse, int causal, float scale) {
  Params p = {};
  set_qkv(p, q, k, v, o, causal, scale);
  p.out = em_data_ptr(o); p.lse = static_cast<float *>(em_data_ptr(lse));
  if (p.B * p.H == 0 || p.Tq == 0) return 0;
  cudaStream_t s = em_cur_stream(q->device.index);
  int d = (int)q->shape[3], rc = -2;
  // the wgmma kernel on sm_90 where it applies, or as EMBER_FLASH_FWD forces (flash_fwd_wg.cu)
  if ((rc = fwd_wg_dispatch(p, q->dtype, d, q->device.index, s)) != kFwdNotTaken) return rc;
  if (p.Tq <= kDecodeMaxTq && fwd_kernel_mode() != 1) return decode_fwd(p, q->dtype, d, q->device.index, s);
  if (q->dtype == EM_BF16) {
    FLASH_DISPATCH_D(d, D, rc = launch_fwd<__nv_bfloat16, D>(p, s);)
  } else if (q->dtype == EM_F16) {
    FLASH_DISPATCH_D(d, D, rc = launch_fwd<__half, D>(p, s);)
  } else if (q->dtype == EM_F32) {
    FLASH_DISPATCH_D(d, D, rc = launch_fwd<float, D>(p, s);)
  }
  if (rc == -2) return em_error("flash_attention: no kernel for head dim %d", d);
  return rc;
}
