/* FlashAttention forward for Hopper (sm_90a): wgmma tensor-core matmuls,
 * TMA tile copies and a producer/consumer split of the block, in the style
 * of FlashAttention-3. Same function and outputs as flash_fwd.cu (o and the
 * rows' log-sum-exp), for bf16/f16 and head dims 64 and 128 (80 and 96 on the
 * D 128 kernel: wg_kernel_dim, docs/flash.md "Step 7"); flash_fwd.cu's
 * em_flash_fwd_cuda asks fwd_wg_dispatch first (the choice: docs/flash.md,
 * "Step 2: wgmma forward").
 *
 * One block of 3 warpgroups per (128-query block, batch·head):
 *  - warpgroup 0, the producer, keeps 24 registers a thread; one thread
 *    copies q (128 rows) once, then the k and v tiles (128 keys each) into a
 *    ring of 2 shared-memory stages with TMA. Stage s has a "full" mbarrier
 *    (the copies' bytes complete it) and an "empty" one (the 256 consumer
 *    threads arrive when they are done reading it).
 *  - warpgroups 1 and 2, the consumers, 64 query rows each, 240 registers:
 *    per tile, S = q kᵀ (wgmma m64n128k16, both operands from shared
 *    memory), the online softmax on S's registers in base 2 (the scale folded
 *    into log2 e), P rounded to 16 bits in registers, o += P v (wgmma with P
 *    as the register A operand, v from shared memory through a transposed
 *    descriptor), then release the stage. While one consumer does its
 *    softmax the other's wgmmas keep the tensor cores busy.
 *
 * Rows and keys past the ends come in as zeros (TMA fills out-of-bounds box
 * elements); keys past Tk and above the causal diagonal are masked to -inf
 * before the max, so they add nothing. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "flash_common.cuh"
#include "flash_wg.cuh"
#include "flash_wgmma.cuh"

using namespace flash;

namespace {

constexpr int BM = 128;        // queries per block: 2 consumer warpgroups x 64
constexpr int BN = 128;        // keys per k/v tile
constexpr int THREADS = 384;   // producer + 2 consumers

template <int D> struct WgCfg {
  static constexpr int CH = D / 64;                   // 64-column (128-byte) chunks of a row
  static constexpr uint32_t Q_BYTES = BM * D * 2, KV_BYTES = BN * D * 2;
  static constexpr uint32_t OFF_K = Q_BYTES, OFF_V = OFF_K + 2 * KV_BYTES, OFF_BAR = OFF_V + 2 * KV_BYTES;
  // barriers: q full, kv full[2], kv empty[2]; 1024 of slack to align the base
  static constexpr size_t SMEM = OFF_BAR + 5 * 8 + 1024;
};

template <typename T, int D>
__global__ void __launch_bounds__(THREADS, 1)
    flash_fwd_wg_kernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                        const __grid_constant__ CUtensorMap tv, const Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WgCfg<D>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base, sK = base + C::OFF_K, sV = base + C::OFF_V;
  const uint32_t bar_q = base + C::OFF_BAR, bar_full = bar_q + 8, bar_empty = bar_q + 24;   // + 8·stage

  const int qblk = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / p.H, h = bh % p.H, hk = h / p.group;
  const int q0 = qblk * BM;
  const int kend = p.causal ? min(p.Tk, q0 + BM + p.off) : p.Tk, ntile = (kend + BN - 1) / BN;
  const int wg = threadIdx.x >> 7;

  if (threadIdx.x == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < 2; s++) {
      mbar_init(bar_full + 8 * s, 1);           // the producer's expect_tx arrival; the bytes complete it
      mbar_init(bar_empty + 8 * s, 2 * 128);    // every consumer thread
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    setmaxnreg_dec<24>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&tq); tma_prefetch_map(&tk); tma_prefetch_map(&tv);
      mbar_expect_tx(bar_q, C::Q_BYTES);
#pragma unroll
      for (int c = 0; c < C::CH; c++) tma_load_4d(sQ + c * BM * 128, &tq, bar_q, c * 64, q0, h, b);
      for (int j = 0; j < ntile; j++) {
        const int s = j & 1;
        // stage s last held tile j - 2: wait until both consumers released it
        if (j >= 2) mbar_wait(bar_empty + 8 * s, ((j >> 1) - 1) & 1);
        const uint32_t full = bar_full + 8 * s, dk = sK + s * C::KV_BYTES, dv = sV + s * C::KV_BYTES;
        mbar_expect_tx(full, 2 * C::KV_BYTES);
#pragma unroll
        for (int c = 0; c < C::CH; c++) tma_load_4d(dk + c * BN * 128, &tk, full, c * 64, j * BN, hk, b);
#pragma unroll
        for (int c = 0; c < C::CH; c++) tma_load_4d(dv + c * BN * 128, &tv, full, c * 64, j * BN, hk, b);
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<240>();
  const int cw = wg - 1, tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int rbase = q0 + cw * 64, wrow = rbase + warp * 16;   // this warpgroup's, this warp's first row
  const int row0 = wrow + g, row1 = row0 + 8;
  // causal: the last key any row of this warpgroup sees
  const int wglast = p.causal ? rbase + 63 + p.off : INT_MAX;

  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; i++) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  mbar_wait(bar_q, 0);
  // q rows of this warpgroup: 64 rows (8 KB) into each 128-row chunk
  const uint32_t qa = sQ + cw * 64 * 128;

  for (int j = 0; j < ntile; j++) {
    const int s = j & 1, k0 = j * BN;
    // wait even for a tile this warpgroup skips: its arrival on "empty" must
    // count toward this tile's phase, not an earlier one
    mbar_wait(bar_full + 8 * s, (j >> 1) & 1);
    if (k0 <= wglast) {
      const uint32_t ks = sK + s * C::KV_BYTES, vs = sV + s * C::KV_BYTES;
      float sc[BN / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t off = (kk & 3) * 32;   // 16 columns = 32 bytes into the chunk's 128-byte rows
        const uint64_t da = wg_desc(qa + (kk >> 2) * BM * 128 + off, 16, 1024);
        const uint64_t db = wg_desc(ks + (kk >> 2) * BN * 128 + off, 16, 1024);
        Wgmma<T, BN>::ss(sc, da, db, kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(sc);

      // mask, then the online softmax (as flash_fwd.cu, over 128 keys)
      const bool edge = k0 + BN > p.Tk || (p.causal && k0 + BN - 1 > wrow + p.off);
      float mx0 = m0, mx1 = m1;
#pragma unroll
      for (int i = 0; i < BN / 2; i++) {
        float x = sc[i] * p.scale_log2;
        if (edge) {
          const int col = k0 + (i >> 2) * 8 + 2 * t + (i & 1), row = (i & 2) ? row1 : row0;
          if (col >= p.Tk || (p.causal && col > row + p.off)) x = -INFINITY;
        }
        sc[i] = x;
        if (i & 2) mx1 = fmaxf(mx1, x); else mx0 = fmaxf(mx0, x);
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      // a row with every key so far masked keeps m = -inf: base 0 so exp2 gives 0, not NaN
      const float b0 = mx0 == -INFINITY ? 0.f : mx0, b1 = mx1 == -INFINITY ? 0.f : mx1;
      const float a0 = exp2f(m0 - b0), a1 = exp2f(m1 - b1);
      m0 = mx0; m1 = mx1;
      float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
      for (int i = 0; i < BN / 2; i++) {
        if (i & 2) { sc[i] = exp2f(sc[i] - b1); rs1 += sc[i]; }
        else { sc[i] = exp2f(sc[i] - b0); rs0 += sc[i]; }
      }
      l0 = l0 * a0 + rs0;
      l1 = l1 * a1 + rs1;
#pragma unroll
      for (int i = 0; i < D / 2; i++) o[i] *= (i & 2) ? a1 : a0;

      // P as the A fragments of 16-key steps: accumulator blocks 2kk, 2kk + 1
      uint32_t pa[BN / 16][4];
      pack_a<T>(pa, sc);
      reg_fence(o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; kk++) {
        // 16 keys = two 8-row groups of every 64-column chunk of v
        const uint64_t db = wg_desc(vs + kk * 16 * 128, BN * 128, 1024);
        Wgmma<T, D>::rs(o, pa[kk], db, 1);
      }
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(o);
    }
    mbar_arrive(bar_empty + 8 * s);
  }

  store_o_lse<T, D>(p, o, l0, l1, m0, m1, b, h, bh, row0, row1, t);
#else
  __trap();   // built without sm_90a: fwd_wg_dispatch never launches this
#endif
}

/* ---- host side ---- */

/* cuTensorMapEncodeTiled from the driver through the runtime (no -lcuda). */
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

/* The (D, T, H, B) tensor map of q, k or v (strides in elements, the last
 * dim contiguous), boxes of 64 columns x rows, 128-byte swizzle, zeros out of
 * bounds. A dim of size 1 gets a stride of the packed layout (TMA wants
 * multiples of 16 bytes; the index is always 0 there). false when the driver
 * refuses (the caller falls back to the mma.sync kernel). */
bool make_map(CUtensorMap *m, em_dtype dt, const void *ptr, int D, int T, int H, int B, int64_t st, int64_t sh,
              int64_t sb, int rows) {
  auto fn = encode_fn();
  if (!fn) return false;
  cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)T, (cuuint64_t)H, (cuuint64_t)B};
  int64_t e[3] = {T == 1 ? D : st, 0, 0};
  e[1] = H == 1 ? e[0] * T : sh;
  e[2] = B == 1 ? e[1] * H : sb;
  cuuint64_t strides[3];
  for (int i = 0; i < 3; i++) {
    if (e[i] <= 0 || (e[i] * 2) % 16 != 0 || e[i] * 2 >= (1LL << 40)) return false;
    strides[i] = (cuuint64_t)(e[i] * 2);
  }
  cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1}, estr[4] = {1, 1, 1, 1};
  CUresult r = fn(m, dt == EM_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                  const_cast<void *>(ptr), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

template <typename T, int D>
int launch_wg(const Params &p, const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv, cudaStream_t s) {
  constexpr size_t smem = WgCfg<D>::SMEM;
  static_assert(smem <= 227 * 1024, "flash wg forward: shared memory over an H100 SM's 227 KB");
  auto kern = flash_fwd_wg_kernel<T, D>;
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
    return em_launch_check("flash_attention (wgmma forward)");
  dim3 grid((unsigned)((p.Tq + BM - 1) / BM), (unsigned)(p.B * p.H));
  kern<<<grid, THREADS, smem, s>>>(tq, tk, tv, p);
  return em_launch_check("flash_attention (wgmma forward)");
}

/* sm_90 (the kernel is built for sm_90a only), cached per device. */
bool is_sm90(int device) {
  static int cache[64];   // 0 unknown, 1 yes, 2 no
  if (device < 0 || device >= 64) return false;
  if (!cache[device]) {
    int major = 0, minor = 0;
    bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
              cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess;
    if (!ok) cudaGetLastError();
    cache[device] = ok && major == 9 && minor == 0 ? 1 : 2;
  }
  return cache[device] == 1;
}

int g_mode = -1;   // the forward-kernel choice; -1: not read from EMBER_FLASH_FWD yet

int mode_of(const char *s) {
  if (!s || !*s || strcmp(s, "auto") == 0) return 0;
  if (strcmp(s, "mma") == 0) return 1;
  if (strcmp(s, "wg") == 0) return 2;
  if (strcmp(s, "wg2") == 0) return 3;
  if (strcmp(s, "wg3") == 0) return 4;
  return -1;
}

}  // namespace

namespace flash {

bool tma_map(CUtensorMap *m, em_dtype dt, const void *ptr, int D, int T, int H, int B, int64_t st, int64_t sh,
             int64_t sb, int rows) {
  return make_map(m, dt, ptr, D, T, H, B, st, sh, sb, rows);
}
bool sm90(int device) { return is_sm90(device); }

int wg_kernel_dim(int d) {
  static int old = -1;   // EMBER_FLASH_WG_PAD: 0 (the setting "1") runs 80 and 96 as 128, 1 ("0") does not
  const int m = em_env_choice(&old, "flash_attention", "EMBER_FLASH_WG_PAD", "1", "0");   // a bad value: at any d
  if (m < 0) return -1;
  if (d == 64 || d == 128) return d;
  return (d == 80 || d == 96) && m == 0 ? 128 : 0;
}

int fwd_kernel_mode() {
  if (g_mode < 0) {
    const char *env = getenv("EMBER_FLASH_FWD");
    int m = mode_of(env);
    if (m < 0)
      return em_error("flash_attention: expected EMBER_FLASH_FWD to be auto, mma, wg, wg2 or wg3, got '%s'", env);
    g_mode = m;
  }
  return g_mode;
}

int fwd_wg_dispatch(Params &p, em_dtype dt, int d, int device, cudaStream_t s) {
  const int mode = fwd_kernel_mode();
  if (mode < 0) return -1;
  // auto = wg2 where it applies (sm_90, bf16/f16, d 64/128 (80/96 as 128), more queries than
  // the decode kernel takes), with three consumers (wg3) at d 64: they beat
  // the mma.sync kernel 1.5-2.9x and SDPA's forward at T >= 4096 on an H100
  // and passed the GPU suite (docs/flash.md, Steps 3 and 3b); mma elsewhere
  if (mode == 1) return kFwdNotTaken;
  if (mode == 0 && p.Tq <= kDecodeMaxTq) return kFwdNotTaken;
  const bool forced = mode != 0;
  const int kd = wg_kernel_dim(d);   // the kernel's head dim: 80 and 96 run as 128
  if (kd < 0) return -1;
  const int kernel = mode == 0 ? (kd == 64 ? 4 : 3) : mode;
  const char *name = kernel == 4 ? "wg3" : kernel == 3 ? "wg2" : "wg";
  if (dt != EM_BF16 && dt != EM_F16) {
    if (forced) return em_error("flash_attention: the wgmma forward (EMBER_FLASH_FWD=%s) expects bf16 or f16, got %s",
                                name, em_dtype_name(dt));
    return kFwdNotTaken;
  }
  if (kd == 0) {
    if (forced) return em_error("flash_attention: the wgmma forward (EMBER_FLASH_FWD=%s) expects head dim 64 or 128 "
                                "(80 and 96 run as 128 unless EMBER_FLASH_WG_PAD=0), got %d", name, d);
    return kFwdNotTaken;
  }
  if (!is_sm90(device)) {
    if (forced) return em_error("flash_attention: the wgmma forward (EMBER_FLASH_FWD=%s) needs an sm_90 GPU (H100/H200)",
                                name);
    return kFwdNotTaken;
  }
  CUtensorMap tq, tk, tv;
  // wg3 at d 64: 192-query blocks (three consumers), so a 192-row q box. The maps are the tensors' true d
  const bool three = kernel == 4 && kd == 64;
  bool ok = make_map(&tq, dt, p.q, d, p.Tq, p.H, p.B, p.q_st, p.q_sh, p.q_sb, three ? 192 : BM) &&
            make_map(&tk, dt, p.k, d, p.Tk, p.Hkv, p.B, p.k_st, p.k_sh, p.k_sb, BN) &&
            make_map(&tv, dt, p.v, d, p.Tk, p.Hkv, p.B, p.v_st, p.v_sh, p.v_sb, BN);
  if (!ok) {
    if (forced) return em_error("flash_attention: the wgmma forward (EMBER_FLASH_FWD=%s) could not describe q, k or v "
                                "to TMA (strides must be positive multiples of 16 bytes)", name);
    return kFwdNotTaken;
  }
  // the wg2 kernel (flash_fwd_wg2.cu) has the same tiles: 128 query rows, 128-key boxes
  if (three) return launch_wg3(p, dt, tq, tk, tv, s);
  if (kernel >= 3) return launch_wg2(p, dt, kd, tq, tk, tv, s);
  if (dt == EM_BF16) return kd == 64 ? launch_wg<__nv_bfloat16, 64>(p, tq, tk, tv, s)
                                     : launch_wg<__nv_bfloat16, 128>(p, tq, tk, tv, s);
  return kd == 64 ? launch_wg<__half, 64>(p, tq, tk, tv, s) : launch_wg<__half, 128>(p, tq, tk, tv, s);
}

}  // namespace flash

/* EMBER_FLASH_FWD's setting (0 auto, 1 mma, 2 wg, 3 wg2, 4 wg3); mode >= 0 sets it first. */
extern "C" int em_flash_fwd_kernel(int mode) {
  int prev = fwd_kernel_mode();
  if (prev < 0) return -1;
  if (mode >= 0) g_mode = mode;
  return prev;
}
