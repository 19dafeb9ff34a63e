/* Flash-decoding: the attention forward for few queries (Tq <= 16) against
 * a long key/value cache, where the FlashAttention-2 kernel (flash_fwd.cu)
 * would run B·H blocks of 64 query rows, most of them padding, and leave the
 * GPU idle. Here the keys are split across blocks and the partial results
 * combined:
 *
 *   decode   grid (B·Hkv, splits, row chunks). A block takes one kv head, up
 *            to 16 query rows of its group (q heads h = hk·group + g times
 *            query positions i: grouped-query attention reads each k, v tile
 *            once for the whole group) and one contiguous range of keys. Per
 *            tile of BC keys (64; 32 at D = 256): k and v to shared memory as
 *            f32, scores in base 2 (scale·log2 e folded into q), an online
 *            softmax per row (one warp per row), o += P v. It writes its
 *            unnormalised o, running max m and sum l as f32 partials — or,
 *            with one split, the final o and log-sum-exp.
 *   combine  one warp per query row: M = max m_s, L = Σ l_s 2^(m_s − M),
 *            o = Σ o_s 2^(m_s − M) / L, lse = (M + log2 L)·ln 2, splits in
 *            ascending order: deterministic, no atomics.
 *
 * Cost: 4·Tq·Tk·D FLOPs per (b, h), on the CUDA cores in f32 (few rows leave
 * nothing for tensor-core tiles to amortise); bytes: k and v read once per
 * (b, kv head, row chunk) — 2·Tk·D·2 bytes per kv head in bf16 — plus the
 * partials (splits·rows·(D + 2) f32, written and read once). With one query
 * row the kernel is memory-bound: 2 FLOPs per byte of bf16 k/v read.
 * Splits: enough blocks for two waves on the device, each split at least 256
 * keys, at most 64 splits.
 *
 * Causal masks as in flash_fwd.cu: row i keeps key j <= i + off (0 top-left,
 * Tk − Tq bottom-right: the decode case). A split whose keys a row cannot see
 * leaves that row m = −inf, l = 0, which the combine weighs as 0.
 *
 * Generation's decode step (em_flash_decode_cuda, F.flash_decode) reads the
 * key count from a device tensor instead: the grid is sized for the cache's
 * max_len (fixed, so one captured CUDA graph serves every step), each block
 * reads the count and clips its key range to it, and splits past it write
 * empty partials — the same rule as a split the causal mask hides. Keys read:
 * the count's, not max_len's. */
#include <algorithm>
#include "backend.h"
#include "flash_common.cuh"

using namespace flash;

namespace {

constexpr int kThreads = 128, kRows = 16, kMaxSplits = 64;

template <int D>
struct DecodeCfg {
  static constexpr int BC = D <= 128 ? 64 : 32;        // keys per tile
  static constexpr int KP = D + 4;                     // f32 row pitch of sQ, sK: 16-byte rows, no bank conflicts
  static constexpr int RGS = kThreads / BC;            // scores: row groups (thread = key j, rows rg + RGS·u)
  static constexpr int RPS = kRows / RGS;              //   rows per thread
  static constexpr int DP = D < kThreads ? D : kThreads;   // o: threads per row set (thread = column d)
  static constexpr int CPT = D / DP;                   //   columns per thread
  static constexpr int RGO = kThreads / DP;            //   row groups (1 for D = 80, 96: threads past D idle)
  static constexpr int RPO = kRows / RGO;              //   rows per thread
  static constexpr size_t smem = sizeof(float) * (size_t)(kRows * KP + BC * KP + BC * D + kRows * BC + 3 * kRows);
};

/* The key count read on the device (em_flash_decode_cuda: generation's decode step, whose count changes between
 * replays of one captured graph): n[b·sb] keys of batch b (sb 0: one count for all), clamped to [0, Tk], the
 * causal offset bottom-right against it. n NULL: the launch's Tk and off (em_flash_fwd_cuda). */
struct KeyCount {
  const int64_t *n;
  int64_t sb;
};

/* Row r of a block (r0 + r over the group's (g, i) pairs): its q head and query position. */
struct RowOf {
  int h, i;
  __device__ RowOf(const Params &p, int hk, int rr) : h(hk * p.group + rr / p.Tq), i(rr % p.Tq) {}
};

/* COUNTED: the key count from kc (else the launch's; a template argument so the forward's kernels compile as
 * they did without it: the same registers). */
template <typename T, int D, bool COUNTED>
__global__ void __launch_bounds__(kThreads) flash_decode_kernel(Params p, KeyCount kc) {
  using C = DecodeCfg<D>;
  extern __shared__ __align__(16) float sm[];
  float *sQ = sm, *sK = sQ + kRows * C::KP, *sV = sK + C::BC * C::KP, *sS = sV + C::BC * D;
  float *sM = sS + kRows * C::BC, *sL = sM + kRows, *sA = sL + kRows;
  const int bhk = blockIdx.x, b = bhk / p.Hkv, hk = bhk % p.Hkv, split = blockIdx.y;
  const int r0 = blockIdx.z * kRows, R = min(kRows, p.group * p.Tq - r0);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // COUNTED: splits past the count see no key, their partials stay empty (m = −inf, l = 0); the causal offset
  // is bottom-right against the count
  const int Tk = COUNTED ? (int)min(max(kc.n[b * kc.sb], (int64_t)0), (int64_t)p.Tk) : p.Tk;
  auto off = [&]() { return COUNTED ? Tk - p.Tq : p.off; };   // read where used: the same code as before
  const int lo = split * p.chunk, hi = min(Tk, lo + p.chunk);
  // the keys any row of the block sees end at kend (causal: the largest i decides)
  int kend = hi;
  if (p.causal) {
    int imax = 0;
    for (int r = 0; r < R; r++) imax = max(imax, (r0 + r) % p.Tq);
    kend = min(hi, imax + off() + 1);
  }
  const T *k = static_cast<const T *>(p.k) + b * p.k_sb + hk * p.k_sh;
  const T *v = static_cast<const T *>(p.v) + b * p.v_sb + hk * p.v_sh;

  for (int e = tid; e < kRows * D; e += kThreads) {
    const int r = e / D, d = e % D;
    float x = 0.f;
    if (r < R) {
      RowOf w(p, hk, r0 + r);
      x = to_f32(static_cast<const T *>(p.q)[b * p.q_sb + w.h * p.q_sh + (int64_t)w.i * p.q_st + d]) * p.scale_log2;
    }
    sQ[r * C::KP + d] = x;
  }
  if (tid < kRows) { sM[tid] = -INFINITY; sL[tid] = 0.f; sA[tid] = 0.f; }
  // the key end of each row this thread scores (fixed for the block)
  int kend_s[C::RPS];
#pragma unroll
  for (int u = 0; u < C::RPS; u++) {
    const int r = tid / C::BC + C::RGS * u;
    kend_s[u] = r < R ? (p.causal ? min(hi, (r0 + r) % p.Tq + off() + 1) : hi) : lo;
  }
  float o[C::RPO][C::CPT];
#pragma unroll
  for (int u = 0; u < C::RPO; u++)
#pragma unroll
    for (int c = 0; c < C::CPT; c++) o[u][c] = 0.f;

  constexpr int VEC = 16 / sizeof(T);
  for (int j0 = lo; j0 < kend; j0 += C::BC) {
    __syncthreads();   // the previous tile's readers are done (and sQ, sM are written)
    for (int e = tid; e < C::BC * (D / VEC); e += kThreads) {
      const int j = e / (D / VEC), c = (e % (D / VEC)) * VEC, key = j0 + j;
      Packed128<T> kx, vx;
      if (key < kend) {
        kx = load128(k + (int64_t)key * p.k_st + c);
        vx = load128(v + (int64_t)key * p.v_st + c);
      }
#pragma unroll
      for (int x = 0; x < VEC; x++) {
        sK[j * C::KP + c + x] = key < kend ? to_f32(kx[x]) : 0.f;
        sV[j * D + c + x] = key < kend ? to_f32(vx[x]) : 0.f;
      }
    }
    __syncthreads();

    {   // scores: thread = key j, rows rg, rg + RGS, ...; k row read once for all of them
      const int j = tid % C::BC, rg = tid / C::BC;
      float acc[C::RPS];
#pragma unroll
      for (int u = 0; u < C::RPS; u++) acc[u] = 0.f;
#pragma unroll 4
      for (int d = 0; d < D; d += 4) {
        const float4 k4 = *reinterpret_cast<const float4 *>(sK + j * C::KP + d);
#pragma unroll
        for (int u = 0; u < C::RPS; u++) {
          const float4 q4 = *reinterpret_cast<const float4 *>(sQ + (rg + C::RGS * u) * C::KP + d);
          acc[u] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
        }
      }
#pragma unroll
      for (int u = 0; u < C::RPS; u++) {
        const int r = rg + C::RGS * u;
        sS[r * C::BC + j] = j0 + j < kend_s[u] ? acc[u] : -INFINITY;
      }
    }
    __syncthreads();

    for (int r = warp; r < kRows; r += kThreads / 32) {   // online softmax, one warp per row
      if (r >= R) { if (lane == 0) sA[r] = 0.f; continue; }
      float x[C::BC / 32], mx = -INFINITY;
#pragma unroll
      for (int a = 0; a < C::BC / 32; a++) { x[a] = sS[r * C::BC + lane + 32 * a]; mx = fmaxf(mx, x[a]); }
#pragma unroll
      for (int sh = 16; sh > 0; sh >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
      const float m_old = sM[r], m_new = fmaxf(m_old, mx);
      float alpha = 1.f, sum = 0.f;
      if (m_new != -INFINITY) {   // else nothing visible yet: p = 0, the state stays
        alpha = exp2f(m_old - m_new);
#pragma unroll
        for (int a = 0; a < C::BC / 32; a++) { x[a] = exp2f(x[a] - m_new); sum += x[a]; }
      } else {
#pragma unroll
        for (int a = 0; a < C::BC / 32; a++) x[a] = 0.f;
      }
#pragma unroll
      for (int a = 0; a < C::BC / 32; a++) sS[r * C::BC + lane + 32 * a] = x[a];
#pragma unroll
      for (int sh = 16; sh > 0; sh >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, sh);
      if (lane == 0) { sL[r] = sL[r] * alpha + sum; sM[r] = m_new; sA[r] = alpha; }
    }
    __syncthreads();

    if (tid < C::DP * C::RGO) {   // o += P v: thread = column d, rows rg, rg + RGO, ...
      const int rg = tid / C::DP;
#pragma unroll
      for (int u = 0; u < C::RPO; u++) {
        const float a = sA[rg + C::RGO * u];
#pragma unroll
        for (int c = 0; c < C::CPT; c++) o[u][c] *= a;
      }
      for (int j = 0; j < C::BC; j += 4) {
#pragma unroll
        for (int c = 0; c < C::CPT; c++) {
          const int d = tid % C::DP + C::DP * c;
          const float v0 = sV[j * D + d], v1 = sV[(j + 1) * D + d], v2 = sV[(j + 2) * D + d], v3 = sV[(j + 3) * D + d];
#pragma unroll
          for (int u = 0; u < C::RPO; u++) {
            const float4 p4 = *reinterpret_cast<const float4 *>(sS + (rg + C::RGO * u) * C::BC + j);
            o[u][c] += p4.x * v0 + p4.y * v1 + p4.z * v2 + p4.w * v3;
          }
        }
      }
    }
  }
  __syncthreads();

  const int64_t rows = (int64_t)p.B * p.H * p.Tq;
  if (tid < C::DP * C::RGO) {
    const int rg = tid / C::DP;
#pragma unroll
    for (int u = 0; u < C::RPO; u++) {
      const int r = rg + C::RGO * u;
      if (r >= R) continue;
      RowOf w(p, hk, r0 + r);
      const int64_t row = ((int64_t)b * p.H + w.h) * p.Tq + w.i;
      const float inv = sL[r] > 0.f ? 1.f / sL[r] : 0.f;
#pragma unroll
      for (int c = 0; c < C::CPT; c++) {
        const int d = tid % C::DP + C::DP * c;
        if (p.nsplit == 1)
          static_cast<T *>(p.out)[b * p.o_sb + w.h * p.o_sh + (int64_t)w.i * p.o_st + d] = from_f32<T>(o[u][c] * inv);
        else
          p.opart[((int64_t)split * rows + row) * D + d] = o[u][c];
      }
    }
  }
  if (tid < R) {
    RowOf w(p, hk, r0 + tid);
    const int64_t row = ((int64_t)b * p.H + w.h) * p.Tq + w.i;
    if (p.nsplit == 1) {
      p.lse[row] = sL[tid] > 0.f ? (sM[tid] + log2f(sL[tid])) * kLn2 : -INFINITY;
    } else {
      p.mpart[split * rows + row] = sM[tid];
      p.lpart[split * rows + row] = sL[tid];
    }
  }
}

/* One warp per query row: the splits' partials into o and lse. */
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_decode_combine_kernel(Params p) {
  const int64_t rows = (int64_t)p.B * p.H * p.Tq, row = (int64_t)blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float mx = -INFINITY;
  for (int s = lane; s < p.nsplit; s += 32) mx = fmaxf(mx, p.mpart[s * rows + row]);
#pragma unroll
  for (int sh = 16; sh > 0; sh >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
  float l = 0.f;
  if (mx != -INFINITY)
    for (int s = lane; s < p.nsplit; s += 32) l += p.lpart[s * rows + row] * exp2f(p.mpart[s * rows + row] - mx);
#pragma unroll
  for (int sh = 16; sh > 0; sh >>= 1) l += __shfl_xor_sync(0xffffffffu, l, sh);
  const float inv = l > 0.f ? 1.f / l : 0.f;
  const int i = (int)(row % p.Tq), bh = (int)(row / p.Tq), b = bh / p.H, h = bh % p.H;
  T *out = static_cast<T *>(p.out) + b * p.o_sb + h * p.o_sh + (int64_t)i * p.o_st;
  for (int d = lane; d < D; d += 32) {
    float acc = 0.f;
    if (mx != -INFINITY)
      for (int s = 0; s < p.nsplit; s++)
        acc += p.opart[((int64_t)s * rows + row) * D + d] * exp2f(p.mpart[s * rows + row] - mx);
    out[d] = from_f32<T>(acc * inv);
  }
  if (lane == 0) p.lse[row] = l > 0.f ? (mx + log2f(l)) * kLn2 : -INFINITY;
}

template <typename T, int D>
int launch_decode(Params &p, KeyCount kc, int device, cudaStream_t s) {
  using C = DecodeCfg<D>;
  const int chunks = (p.group * p.Tq + kRows - 1) / kRows;
  const int64_t base = (int64_t)p.B * p.Hkv * chunks, target = 2LL * em_sm_count(device);
  int64_t nsplit = 1;
  if (base < target) {
    nsplit = std::min((target + base - 1) / base, (int64_t)(p.Tk + 255) / 256);
    nsplit = std::max((int64_t)1, std::min(nsplit, (int64_t)kMaxSplits));
  }
  int64_t chunk = (p.Tk + nsplit - 1) / nsplit;
  chunk = (chunk + C::BC - 1) / C::BC * C::BC;
  nsplit = (p.Tk + chunk - 1) / chunk;
  p.nsplit = (int)nsplit; p.chunk = (int)chunk;

  em_tensor *part = NULL;
  const int64_t rows = (int64_t)p.B * p.H * p.Tq;
  if (nsplit > 1) {   // stream-ordered workspace: released after the launches, reused safely by later work
    int64_t n = nsplit * rows * (D + 2);
    part = em_empty(1, &n, EM_F32, em_device{EM_CUDA, device});
    if (!part) return -1;
    p.opart = static_cast<float *>(em_data_ptr(part));
    p.mpart = p.opart + nsplit * rows * D;
    p.lpart = p.mpart + nsplit * rows;
  }
  auto kern = kc.n ? flash_decode_kernel<T, D, true> : flash_decode_kernel<T, D, false>;
  if (C::smem > 48 * 1024 &&
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::smem) != cudaSuccess) {
    em_tensor_release(part);
    return em_launch_check("flash_attention (decode)");
  }
  kern<<<dim3((unsigned)(p.B * p.Hkv), (unsigned)nsplit, (unsigned)chunks), kThreads, C::smem, s>>>(p, kc);
  int rc = em_launch_check("flash_attention (decode)");
  if (rc == 0 && nsplit > 1) {
    flash_decode_combine_kernel<T, D><<<(unsigned)((rows + 3) / 4), kThreads, 0, s>>>(p);
    rc = em_launch_check("flash_attention (decode combine)");
  }
  em_tensor_release(part);
  return rc;
}

/* The launches for dtype dt and head dim d; -2 where no kernel is built for them. */
int decode_dispatch(Params &p, KeyCount kc, em_dtype dt, int d, int device, cudaStream_t s) {
  int rc = -2;
  if (dt == EM_BF16) {
    FLASH_DISPATCH_D(d, D, rc = launch_decode<__nv_bfloat16, D>(p, kc, device, s);)
  } else if (dt == EM_F16) {
    FLASH_DISPATCH_D(d, D, rc = launch_decode<__half, D>(p, kc, device, s);)
  } else if (dt == EM_F32) {   // f32 arithmetic throughout: exact f32, no TF32 rounding
    FLASH_DISPATCH_D(d, D, rc = launch_decode<float, D>(p, kc, device, s);)
  }
  if (rc == -2) return em_error("flash_attention: no decode kernel for head dim %d and %s", d, em_dtype_name(dt));
  return rc;
}

}  // namespace

int flash::decode_fwd(Params &p, em_dtype dt, int d, int device, cudaStream_t s) {
  return decode_dispatch(p, KeyCount{nullptr, 0}, dt, d, device, s);
}

extern "C" int em_flash_decode_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v,
                                    const em_tensor *n_keys, em_tensor *o, em_tensor *lse, float scale) {
  Params p = {};
  set_qkv(p, q, k, v, o, 2, scale);   // bottom-right; Tk and off replaced per block by the device's count
  p.out = em_data_ptr(o); p.lse = static_cast<float *>(em_data_ptr(lse));
  if (p.B * p.H == 0 || p.Tq == 0) return 0;
  const KeyCount kc{static_cast<const int64_t *>(em_data_ptr(n_keys)), n_keys->shape[0] == 1 ? 0 : n_keys->stride[0]};
  return decode_dispatch(p, kc, q->dtype, (int)q->shape[3], q->device.index, em_cur_stream(q->device.index));
}
