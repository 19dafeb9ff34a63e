/* Hopper (sm_90a) pieces of the wgmma flash forward (flash_fwd_wg.cu):
 * mbarriers, the tensor-memory-access (TMA) tile copy, wgmma matrix
 * descriptors and the warpgroup fences, and the forward-kernel choice that
 * em_flash_fwd_cuda (flash_fwd.cu) asks before launching anything.
 *
 * Shared tiles are TMA's 128-byte swizzle: a tile of R rows x 64 columns of a
 * 16-bit type is R rows of 128 bytes, the 16-byte chunk c of row r stored at
 * chunk c ^ (r % 8), so 8 rows make a 1024-byte atom; a head dim of 128 is
 * two such tiles side by side (column chunk cc at cc · R · 128 bytes). wgmma
 * reads the same pattern when the descriptor says "128-byte swizzle" and
 * every tile starts 1024-byte aligned. */
#pragma once
#include <cuda.h>
#include <stdint.h>
#include "flash_common.cuh"

namespace flash {

/* ---- the forward-kernel choice (EMBER_FLASH_FWD, core.flash_fwd_kernel) ---- */

/* The result of fwd_wg_dispatch when it ran nothing: the caller goes on to
 * the decode or mma.sync kernel. */
constexpr int kFwdNotTaken = -2;
/* 0 auto, 1 mma (the mma.sync kernel, for every Tq), 2 wg (the wgmma kernel,
 * for every Tq; an error where it does not apply), 3 wg2 (the same with the
 * softmax overlapped with the matmuls, flash_fwd_wg2.cu), 4 wg3 (wg2 with
 * three consumer warpgroups at d 64; wg2 at d 128); -1 with the error set
 * for a bad EMBER_FLASH_FWD. */
int fwd_kernel_mode();
/* Runs the wgmma forward when the mode and the inputs ask for it: 0, -1 with
 * the error set, or kFwdNotTaken. */
int fwd_wg_dispatch(Params &p, em_dtype dt, int d, int device, cudaStream_t s);
/* Launches the wg2 kernel (flash_fwd_wg2.cu) for bf16/f16 and d 64 or 128 on
 * the tensor maps fwd_wg_dispatch made: 0 or -1 with the error set. */
int launch_wg2(const Params &p, em_dtype dt, int d, const CUtensorMap &tq, const CUtensorMap &tk,
               const CUtensorMap &tv, cudaStream_t s);
/* The same kernel with three consumer warpgroups (192-query blocks) at d 64,
 * bf16/f16 (EMBER_FLASH_FWD=wg3); tq's box is 192 rows. */
int launch_wg3(const Params &p, em_dtype dt, const CUtensorMap &tq, const CUtensorMap &tk, const CUtensorMap &tv,
               cudaStream_t s);

/* The (D, T, H, B) TMA map of a 16-bit q, k, v, o or dO (flash_fwd_wg.cu's
 * make_map: 64-column boxes of `rows` rows, 128-byte swizzle, zeros out of
 * bounds); false where the driver refuses it. */
bool tma_map(CUtensorMap *m, em_dtype dt, const void *ptr, int D, int T, int H, int B, int64_t st, int64_t sh,
             int64_t sb, int rows);
/* Whether the device is sm_90 (the wgmma kernels are built for sm_90a only). */
bool sm90(int device);
/* The head dim of the wgmma kernel that runs a tensor's head dim d (docs/flash.md "Step 7"): 64 and 128 as
 * they are; 80 and 96 on the D = 128 kernels (their TMA maps keep the true d, so the columns past it load as
 * zeros and add nothing to q kᵀ; o, dq, dk, dv stores are clipped to p.Dv) unless EMBER_FLASH_WG_PAD=0 (read
 * once: 1, the default, or 0); 0 where no wgmma kernel applies; -1 with the error set for a bad value. */
int wg_kernel_dim(int d);

/* ---- the backward-kernel choice (EMBER_FLASH_BWD, core.flash_bwd_kernel) ---- */

/* 0 auto (wg2's kernels where they apply, kAutoWg; else mma), 1 mma, 2 wg (flash_bwd_wg.cu; an
 * error where it does not apply), 3 wg2 (flash_bwd_wg2.cu, as wg), 4 fused and 5 fused_nd
 * (flash_bwd_fused.cu, as wg; dq through f32 atomics, in a fixed order or not); -1 with the error set for a bad
 * EMBER_FLASH_BWD. */
int bwd_kernel_mode();
/* The result of bwd_wg_dispatch when it ran nothing: the caller runs the mma.sync kernels. */
constexpr int kBwdNotTaken = kFwdNotTaken;
/* Launches the delta kernel (flash_bwd.cu, Δ = rowsum(dO ∘ o) into p.delta) on s: 0 or -1 with the error set. */
using DeltaLaunch = int (*)(const Params &p, cudaStream_t s);
/* Runs the wgmma dk/dv and dq kernels when the mode and the inputs ask for them, and the delta kernel before them
 * where they need it (all but EMBER_FLASH_STEP9's wg2). 0 (done), -1 with the error set, or kBwdNotTaken (nothing
 * launched, not even Δ). */
int bwd_wg_dispatch(Params &p, em_dtype dt, int d, int device, cudaStream_t s, DeltaLaunch delta);

/* ---- the short-sequence schedule (EMBER_FLASH_STEP9, docs/flash.md "Step 9") ---- */

/* EMBER_FLASH_STEP9, read once: 1 (the default) or 0; -1 with the error set for anything else. 1, for short
 * sequences (tile_grid_hf below), launches the wg2/wg3 forward and the wg2 backward's kernels heaviest block first
 * over the whole grid (tile_grid) instead of head by head, and computes Δ in the wg2 dq kernel (no delta kernel);
 * the same blocks compute the same tiles with the same arithmetic, so the same bits. */
int step9();
/* EMBER_FLASH_PDL, read once: 0 (the default) or 1; -1 with the error set for anything else. 1, with
 * EMBER_FLASH_STEP9=1: wg2's dk/dv kernel is launched as a programmatic dependent of the dq kernel before it
 * (cudaLaunchAttributeProgrammaticStreamSerialization), so its blocks start, load k, v and their first q/dO tiles
 * on the SMs dq's last wave leaves idle, and wait for dq's Δ (griddepcontrol.wait) only where they read it. */
int flash_pdl();
/* EMBER_FLASH_DELTA9, read once: 0 (the default) or 1; -1 with the error set for anything else. 1, where
 * EMBER_FLASH_STEP9 folds Δ into the wg2 dq kernel: the kernel's producer also brings the block's rows of o into
 * shared memory by TMA (dO is there already, for dP), and each consumer sums its rows' Δ from the two tiles while
 * its first S and dP wgmmas run, instead of from global memory before them (docs/flash.md "Step 9b"); the same
 * sums in the same order, so the same bits. */
int flash_delta9();
/* The grid of a kernel with `tiles` blocks (q or key blocks, heaviest first) for each of `heads` (batch, head)
 * pairs. Head by head: (tiles, heads), so the linear block order, which the hardware dispatches in, runs one
 * head's tiles after another; a grid of 1.1-1.5 waves then ends on the heaviest blocks of the last heads.
 * Heaviest first (hf): (heads, tiles), every head's heaviest block before any head's next one, so the last
 * wave holds the lightest blocks (docs/flash.md "Step 9"). Only for short sequences, at most kHfMaxTiles
 * blocks a head (T 2048 at 128-row blocks): longer, the head order keeps the k and v of the few heads in
 * flight in L2, where every head's at once would not fit (B 1, H 16, T 16384, D 64: 64 MB), and a grid of
 * many waves loses little to its last one. */
constexpr unsigned kHfMaxTiles = 16;
inline bool tile_grid_hf(bool hf, unsigned tiles) { return hf && tiles <= kHfMaxTiles; }
inline dim3 tile_grid(bool hf, unsigned tiles, unsigned heads) { return hf ? dim3(heads, tiles) : dim3(tiles, heads); }

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* Programmatic dependent launch (sm_90; no-ops in a grid launched without it): a primary grid's blocks allow
 * their dependent grid to launch once all of them have executed grid_dep_launch (or exited); the dependent's
 * grid_dep_wait returns once the primary has completed and its stores are visible. */
__device__ __forceinline__ void grid_dep_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void grid_dep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

/* A block's tile (0 the heaviest, of tile_count) and (batch, head) index under tile_grid(HF, ...). */
template <bool HF> __device__ __forceinline__ int tile_index() { return HF ? (int)blockIdx.y : (int)blockIdx.x; }
template <bool HF> __device__ __forceinline__ int tile_count() { return HF ? (int)gridDim.y : (int)gridDim.x; }
template <bool HF> __device__ __forceinline__ int head_index() { return HF ? (int)blockIdx.x : (int)blockIdx.y; }

/* ---- mbarriers (shared-memory barriers with a phase bit and a byte count) ---- */
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* makes the inits visible to the async proxy (TMA) before anyone uses them */
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
/* one arrival that also announces bytes the copies will complete */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* spin until the phase with this parity has completed */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

/* ---- TMA: a box of a 4-D tensor (D, T, H, B) into shared memory, completing on bar ---- */
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const void *map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

/* ---- warpgroup register budget (needs the kernel's register cap at entry) ---- */
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* ---- wgmma ---- */
/* Matrix descriptor of a 128-byte-swizzled shared tile: start address,
 * leading and stride byte offsets (all >> 4), swizzle mode 1 (128 B) in bits
 * 62-63; base offset 0 (tiles are 1024-byte aligned; a K step inside the
 * atom moves the start by 32 bytes and the hardware swizzles the result).
 * K-major (Q, K): rows 128 B apart, 8-row groups sbo = 1024 apart, lbo
 * unused (1). N-major (V as B of P V): 64 columns per 128-byte row, 8-key
 * groups sbo = 1024 apart, lbo = the distance between 64-column chunks. */
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
         (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | (uint64_t)1 << 62;
}
/* wg_desc's words apart (docs/flash.md "Step 6"): the low word (start address >> 4 in bits 0-13, lbo >> 4 in
 * 16-29) built once for a tile, then a k step's byte offset added to it as off >> 4; the high word (sbo 1024, the
 * swizzle) a constant. A shared address stays below 2^18 (228 KB), so the sum never carries out of the address
 * field: wg_desc_at(wg_desc_lo(a, lbo), off) is wg_desc(a + off, lbo, 1024), bit for bit, in one integer add
 * instead of a mask, a shift and two ORs per descriptor. */
__device__ __forceinline__ uint32_t wg_desc_lo(uint32_t addr, uint32_t lbo) {
  return ((addr & 0x3FFFF) >> 4) | ((lbo >> 4) & 0x3FFF) << 16;
}
__device__ __forceinline__ uint64_t wg_desc_at(uint32_t lo, uint32_t off) {
  return (uint64_t)(lo + (off >> 4)) | (uint64_t)((1024u >> 4) | 1u << 30) << 32;
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Pins accumulator registers at this point of the program: the compiler
 * cannot move their reads or writes across it (nor across the wgmma asm they
 * are bound to), so nothing touches them while a wgmma is in flight. */
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

/* NK·16 columns of f32 accumulators (one thread's 8·NK values of an m64
 * wgmma's rows) as the 16-bit A fragments of NK k steps of 16: accumulator
 * blocks 2kk and 2kk + 1 form step kk. P in the forwards, Pᵀ and dSᵀ/dS in
 * the backwards. */
template <typename T, int NK>
__device__ __forceinline__ void pack_a(uint32_t (&a)[NK][4], const float (&c)[8 * NK]) {
#pragma unroll
  for (int kk = 0; kk < NK; kk++) {
    a[kk][0] = Mma<T>::pack(c[8 * kk + 0], c[8 * kk + 1]);
    a[kk][1] = Mma<T>::pack(c[8 * kk + 2], c[8 * kk + 3]);
    a[kk][2] = Mma<T>::pack(c[8 * kk + 4], c[8 * kk + 5]);
    a[kk][3] = Mma<T>::pack(c[8 * kk + 6], c[8 * kk + 7]);
  }
}

/* The forward's epilogue for one thread's two rows (row0 and row1 = row0 + 8
 * of its warp's 16): the row sums l0, l1 reduced over the quad, o normalised
 * and stored as 16-bit pairs (t: the thread's index in its quad), and the
 * log-sum-exp (m: the running max in base 2, scaled) written by the quad's
 * first thread; rows past Tq and columns past p.Dv are skipped. Shared by the wg and wg2 kernels. */
template <typename T, int D>
__device__ __forceinline__ void store_o_lse(const Params &p, const float (&o)[D / 2], float l0, float l1, float m0,
                                            float m1, int b, int h, int bh, int row0, int row1, int t) {
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f;
  T *out = static_cast<T *>(p.out) + b * p.o_sb + h * p.o_sh;
#pragma unroll
  for (int i = 0; i < D / 8; i++) {
    const int col = i * 8 + 2 * t;
    if (col >= p.Dv) break;   // a head dim of 80 or 96 run as 128: the zero columns past it stay here
    if (row0 < p.Tq)
      *reinterpret_cast<uint32_t *>(out + (int64_t)row0 * p.o_st + col) =
          Mma<T>::pack(o[4 * i] * inv0, o[4 * i + 1] * inv0);
    if (row1 < p.Tq)
      *reinterpret_cast<uint32_t *>(out + (int64_t)row1 * p.o_st + col) =
          Mma<T>::pack(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
  }
  if (t == 0) {
    float *lse = p.lse + (int64_t)bh * p.Tq;
    if (row0 < p.Tq) lse[row0] = l0 > 0.f ? (m0 + log2f(l0)) * kLn2 : -INFINITY;
    if (row1 < p.Tq) lse[row1] = l1 > 0.f ? (m1 + log2f(l1)) * kLn2 : -INFINITY;
  }
}
#endif

}  // namespace flash
