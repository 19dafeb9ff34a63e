/* One-pass row statistics: var (mean, then the centred sum of squares) and
 * logsumexp (max, then the sum of exp(x - max)) over the last dim of float
 * rows whose length fits in registers (issue 12).
 *
 * Why a file of its own: reduce.cu computes both in two reduction passes
 * (a sum or max kernel, then a second kernel that re-reads the input), so
 * the input crosses HBM twice: var (4096,4096) f32 ran at 1068 GB/s of
 * one-read traffic (32 % of an H100's 3350). Here the row is loaded once
 * into registers as raw 16-byte words, and both statistics come from the
 * registers: the same two-pass formulas (no sum-of-squares cancellation,
 * the same logsumexp shift), one read of the input.
 *
 * Cost: reads n_out·L·sizeof(T) bytes, writes n_out outputs; ~3 FLOPs per
 * element for var, one expf for logsumexp (MUFU: 16/clk/SM, ~1.7 T exp/s on
 * an H100, past the ~0.8 T elements/s that 3.35 TB/s of f32 brings). The
 * ceiling is the read bandwidth: (8192,8192) f32 (256 MiB) in ~80 µs.
 *
 * Launch shapes (256 threads; P = L / (16 / sizeof(T)) 16-byte packs a row):
 *  - a warp per row (8 rows a block) when P <= 32·8: N = 1, 2, 4 or 8 packs
 *    a lane, pack n·32 + lane — the same element order per lane and the same
 *    xor tree as reduce.cu's warp-per-output rows kernel, so those results
 *    are bit-identical to the two-pass path's;
 *  - a block per row when P <= 256·8 (8192 f32, 16384 bf16/f16): N = 2, 4
 *    or 8 packs a thread, pack n·256 + thread; the partials meet in
 *    block_sum's fixed tree. Rows the two-pass path gave to a warp (<= 16384
 *    with >= 2048 rows) add in another (fixed) order here: deterministic,
 *    and an f32 sum either way, within the specs' tolerance.
 * Anything else (f64, a reduction not over unit-stride rows, rows not
 * 16-byte aligned, longer rows) returns 1 and the engine takes reduce.cu's
 * two-pass path. EMBER_STAT_KERNELS=twopass selects that path always (to
 * time both in one process).
 *
 * logsumexp of bf16/f16 rows exponentiates with em_exp_fast (common.cuh:
 * FMUL by log2 e, then MUFU.EX2.FTZ: 2 instructions) instead of expf (~10:
 * range reduction, two FMAs, a scale): a 2-byte element leaves ~20
 * lane-instructions an element at 70 % of an H200's 4.8 TB/s, and expf's row
 * spent ~16 (unpack, max, unpack, sub, expf, add), which held (8192,8192)
 * bf16 at 56 %; now ~5.5 (the max two lanes at a time in the storage type,
 * em_max_x2: exact, so the same max). The error is ~2 ulp near 0 (the terms
 * that make the sum; a term exp(-d) carries ~1.2·d ulp of itself, and one
 * under 2^-126 flushes to 0 beside the max's 1), far under the bf16/f16
 * output's rounding (2^-9 / 2^-12): the same order, deterministic, results
 * equal to expf's but at a rounding boundary. f32 rows keep expf (their bits
 * unchanged; 88 % already). EMBER_LSE_EXP_OLD=1 (read once) puts the expf
 * kernel back for bf16/f16 too. */
#include <cstring>
#include "common.cuh"
#include "dtype_io.cuh"
#include "backend.h"
#include "runtime.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxPacks = 8;   /* 16-byte packs a thread holds: 32 registers of row */
enum { S_VAR, S_LSE };

struct RowArgs {
  const void *in;
  int nk;
  int64_t kshape[EM_MAX_DIMS], kstride[EM_MAX_DIMS];
  int64_t rows, L;
  void *out;
  int out_dtype;
  float dof;   /* var: the divisor n - correction (in f32, as reduce.cu divides) */
};

/* Row o's element offset. o < rows <= INT32_MAX (stat_rows_cuda checks), so the index splits in 32 bits, and
 * the outermost kept dim needs no division (o is already below its extent): a contiguous 2-D input costs one
 * multiply, not a 64-bit division routine per thread (~2 instructions an element of a bf16 8192-row). */
__device__ __forceinline__ int64_t row_offset(const RowArgs &a, int64_t row) {
  uint32_t o = (uint32_t)row;
  int64_t off = 0;
  for (int d = a.nk - 1; d >= 1; d--) {
    const uint32_t s = (uint32_t)a.kshape[d];
    off += (int64_t)(o % s) * a.kstride[d];
    o /= s;
  }
  return a.nk > 0 ? off + (int64_t)o * a.kstride[0] : off;
}

template <int TPR> __device__ __forceinline__ float row_sum(float v, float *red) {
  return TPR == 32 ? warp_sum(v) : block_sum(v, red);
}
template <int TPR> __device__ __forceinline__ float row_max(float v, float *red) {
  return TPR == 32 ? warp_max(v) : block_max(v, red);
}

/* exp(x) for the logsumexp sum: em_exp_fast when FAST (bf16/f16 rows; see the top). */
template <bool FAST> __device__ __forceinline__ float row_exp(float x) { return FAST ? em_exp_fast(x) : expf(x); }

/* TPR threads per row (32 or kThreads), N packs a thread. Every thread of a
 * block calls the block reductions (live is uniform when TPR == kThreads). */
template <typename T, int OP, int N, int TPR, bool FAST>
__global__ void __launch_bounds__(kThreads) stat_rows(RowArgs a) {
  constexpr int V = 16 / (int)sizeof(T);
  constexpr int per = kThreads / TPR;
  __shared__ float red[32];
  const int64_t row = (int64_t)blockIdx.x * per + threadIdx.x / TPR;
  const int lane = threadIdx.x % TPR;
  const bool live = row < a.rows;
  const int64_t packs = a.L / V;
  const uint4 *p = (const uint4 *)((const T *)a.in + (live ? row_offset(a, row) : 0));
  uint4 buf[N];
#pragma unroll
  for (int n = 0; n < N; n++) {   /* every load issued before the first use */
    const int64_t j = (int64_t)n * TPR + lane;
    if (live && j < packs) buf[n] = p[j];
  }
  /* first statistic: the sum (var) or the max (logsumexp) */
  float s = OP == S_VAR ? 0.f : -INFINITY;
  if constexpr (FAST) {   /* the max in the storage type, two lanes an instruction: exact, the same value */
    uint32_t m2 = em_neg_inf_x2<T>();
#pragma unroll
    for (int n = 0; n < N; n++) {
      const int64_t j = (int64_t)n * TPR + lane;
      if (live && j < packs) {
        m2 = em_max_x2<T>(m2, buf[n].x); m2 = em_max_x2<T>(m2, buf[n].y);
        m2 = em_max_x2<T>(m2, buf[n].z); m2 = em_max_x2<T>(m2, buf[n].w);
      }
    }
    const uint4 mw = make_uint4(m2, 0u, 0u, 0u);
    s = fmaxf(raw_elem<float, T>(mw, 0), raw_elem<float, T>(mw, 1));
  } else {
#pragma unroll
    for (int n = 0; n < N; n++) {
      const int64_t j = (int64_t)n * TPR + lane;
      if (live && j < packs) {
#pragma unroll
        for (int e = 0; e < V; e++) {
          const float x = raw_elem<float, T>(buf[n], e);
          s = OP == S_VAR ? s + x : fmaxf(s, x);
        }
      }
    }
  }
  /* fmaxf skips NaN; a NaN still reaches the result through exp(NaN) in the sum */
  s = OP == S_VAR ? row_sum<TPR>(s, red) : row_max<TPR>(s, red);
  const float ref = OP == S_VAR ? s / (float)a.L : (isinf(s) ? 0.f : s);
  float t = 0.f;
#pragma unroll
  for (int n = 0; n < N; n++) {
    const int64_t j = (int64_t)n * TPR + lane;
    if (live && j < packs) {
#pragma unroll
      for (int e = 0; e < V; e++) {
        const float x = raw_elem<float, T>(buf[n], e);
        if constexpr (OP == S_VAR) { const float d = x - ref; t += d * d; }
        else t += row_exp<FAST>(x - ref);
      }
    }
  }
  t = row_sum<TPR>(t, red);
  if (live && lane == 0) store_as<float>(a.out, a.out_dtype, row, OP == S_VAR ? t / a.dof : ref + logf(t));
}

template <typename T, int OP, bool FAST>
bool launch_rows(const RowArgs &a, cudaStream_t s) {
  constexpr int V = 16 / (int)sizeof(T);
  const int64_t P = a.L / V;
  const unsigned warp_grid = (unsigned)((a.rows + 7) / 8), block_grid = (unsigned)a.rows;
#define EM_ST_WARP(N) if (P <= 32 * N) { stat_rows<T, OP, N, 32, FAST><<<warp_grid, kThreads, 0, s>>>(a); return true; }
#define EM_ST_BLOCK(N) if (P <= kThreads * N) { stat_rows<T, OP, N, kThreads, FAST><<<block_grid, kThreads, 0, s>>>(a); return true; }
  EM_ST_WARP(1) EM_ST_WARP(2) EM_ST_WARP(4) EM_ST_WARP(8)
  EM_ST_BLOCK(2) EM_ST_BLOCK(4) EM_ST_BLOCK(8)
#undef EM_ST_WARP
#undef EM_ST_BLOCK
  return false;
}

/* EMBER_STAT_KERNELS (read once): "onepass" (default) or "twopass"; 0, 1 or -1 with the error set. */
int twopass_only(const char *op) {
  static int mode = -1;
  return em_env_choice(&mode, op, "EMBER_STAT_KERNELS", "onepass", "twopass");
}

/* 0 done, -1 error, 1 not a shape these kernels take. */
int stat_rows_cuda(const char *op, int kind, em_tensor *res, const em_tensor *a, const em_red_plan *p, double dof) {
  const int mode = twopass_only(op);
  if (mode) return mode;   /* 1: two-pass, or -1: a bad variable */
  const em_dtype dt = a->dtype;
  if (dt != EM_F32 && dt != EM_BF16 && dt != EM_F16) return 1;
  if (p->n_out == 0 || p->nr != 1 || p->rstride[0] != 1 || p->n_red < 1) return 1;
  const int64_t es = (int64_t)em_dtype_size(dt), L = p->n_red;
  const void *in = em_data_ptr(a);
  if (((uintptr_t)in & 15) != 0 || (L * es) % 16 != 0 || L / (16 / es) > (int64_t)kThreads * kMaxPacks) return 1;
  for (int d = 0; d < p->nk; d++)
    if ((p->kstride[d] * es) % 16 != 0) return 1;
  if (p->n_out > (int64_t)INT32_MAX || !em_is_contiguous(res)) return 1;
  RowArgs r;
  memset(&r, 0, sizeof r);
  r.in = in; r.nk = p->nk;
  for (int d = 0; d < EM_MAX_DIMS; d++) { r.kshape[d] = p->kshape[d]; r.kstride[d] = p->kstride[d]; }
  r.rows = p->n_out; r.L = L;
  r.out = em_data_ptr(res); r.out_dtype = res->dtype;
  r.dof = (float)dof;
  const int dev = a->device.index;
  if (em_use_device(dev, op)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  bool done = false;
  static const bool old_exp = em_env_switch("EMBER_LSE_EXP_OLD", false);
  switch (dt) {
    case EM_F32: done = kind == S_VAR ? launch_rows<float, S_VAR, false>(r, s) : launch_rows<float, S_LSE, false>(r, s); break;
    case EM_BF16:
      done = kind == S_VAR ? launch_rows<__nv_bfloat16, S_VAR, false>(r, s)
             : old_exp     ? launch_rows<__nv_bfloat16, S_LSE, false>(r, s)
                           : launch_rows<__nv_bfloat16, S_LSE, true>(r, s);
      break;
    default:
      done = kind == S_VAR ? launch_rows<__half, S_VAR, false>(r, s)
             : old_exp     ? launch_rows<__half, S_LSE, false>(r, s)
                           : launch_rows<__half, S_LSE, true>(r, s);
      break;
  }
  if (!done) return 1;
  return em_launch_check(op);
}

}  // namespace

extern "C" int em_var_rows_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p, double dof) {
  return stat_rows_cuda(op, S_VAR, res, a, p, dof);
}

extern "C" int em_logsumexp_rows_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p) {
  return stat_rows_cuda(op, S_LSE, res, a, p, 0);
}
