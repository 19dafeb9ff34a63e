/* Random fills on the device: rand, randn, randint, uniform_, normal_ and
 * trunc_normal_ reproduce the CPU's Philox stream (ember/rng.h) bit for bit
 * in f32/bf16/f16 and to an ulp or two in f64.
 *
 * What it computes: one Philox4x32-10 block (10 rounds of two 32x32->64
 * multiplies) per 4 elements (2 for randint spans > 2^32), then the
 * distribution in double with the shared code of engine/backend/rng_math.h
 * (the same source the CPU runs; products are kept unfused), rounded once
 * to the dtype by the CPU's conversions (convert.cuh). normal_ into
 * f32/bf16/f16 runs Box-Muller in f32 instead (own log and sincos from
 * + - * / sqrt: ~100 unfused f32 ops a pair, no double math, no libdevice).
 * Bytes per element: sizeof(dtype) written, nothing read (2^26 f32: 256 MiB,
 * ~80 us at 3.35 TB/s). Issue slots per element: ~14 for Philox (56 SASS
 * instructions a block), ~10 more for uniform_, ~40 more for normal_: bf16
 * fills and normal_ are bound by the issue rate, not memory (docs/perf.md,
 * "CUDA random fills at 2^26"). The one trick: counter-based, so element j
 * needs only (seed, ctr0 + j/4) and any strides are written in place in
 * logical order.
 *
 * Launch: 256 threads, grid-stride. Contiguous, 16-byte aligned float
 * tensors (every fill a training script makes) take rng_contig, one
 * instantiation per distribution: each thread turns B consecutive blocks
 * (B = 4 for bf16/f16 and f32 normal_, which the issue rate bounds: half the
 * per-thread work an element; 2 for f32 uniform_ and trunc_normal_; f64 1)
 * (em_philox_run: the first two rounds' products shared by the B blocks,
 * 2 + 17B multiplies instead of 19B; EMBER_PHILOX_RUN_OLD=1: whole blocks)
 * into 4B consecutive elements and writes them with 16-byte stores (bf16/f16
 * rounded in pairs by the hardware, NaN-checked only where the parameters
 * allow a NaN; EMBER_RNG_CONTIG_OLD=1: B = 2 and every pair checked, as
 * before; the values are the same either way), the [lo, hi) rule of
 * uniform_ one compare on the f32 value in registers; uniform on [0, 1)
 * skips the double arithmetic (exact in f32), and so does uniform_(lo, hi)
 * where lo and hi - lo are exact in f32 and the double arithmetic exact
 * (em_rng_uniform_f32_exact, rng_math.h: one FFMA, the same bits;
 * EMBER_RNG_UNIFORM_OLD=1 keeps the double path: two DADD, a DMUL and a
 * 1/16-rate F2F.F32.F64 an element). Everything else
 * (strided views, randint) takes rng_kernel: one block per thread, element
 * offsets from the view's geometry, one store per element. */
#include <math.h>
#include <stdlib.h>
#include <cuda_runtime.h>
#include "rng_math.h"
#include "common.cuh"
#include "convert.cuh"
#include "runtime.h"
#include "backend.h"

template <int DT, bool RANDINT>
__global__ void rng_kernel(void *out, em_geom g, int64_t n, uint64_t nblocks, em_rng_dist d, em_philox_state st,
                           bool wide) {
  uint64_t seed, ctr0;
  em_philox_resolve(st, &seed, &ctr0);
  const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  const int per = wide ? 2 : 4;
  for (uint64_t b = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks;
       b += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t c = ctr0 + b;
    em_philox_block pb = em_philox4x32_10((uint32_t)c, (uint32_t)(c >> 32), 0, 0, k0, k1);
    int64_t j0 = (int64_t)b * per;
    int cnt = n - j0 < per ? (int)(n - j0) : per;
    if (RANDINT) {
      for (int k = 0; k < cnt; k++) {
        uint64_t u = wide ? ((uint64_t)pb.v[2 * k] | ((uint64_t)pb.v[2 * k + 1] << 32)) : pb.v[k];
        int64_t o, unused;
        em_geom_offsets<int64_t>(g, j0 + k, o, unused);
        em_dev_store_i64<DT>(out, o, (int64_t)((uint64_t)d.lo + u % d.span));
      }
    } else {
      double v[4];
      em_rng_block_values(&d, &pb, v, DT == EM_F64);
      for (int k = 0; k < cnt; k++) {
        int64_t o, unused;
        em_geom_offsets<int64_t>(g, j0 + k, o, unused);
        em_dev_store_f64<DT>(out, o, v[k]);
        if (d.kind == EM_RNG_UNIFORM && em_rng_uniform_hits_hi(&d, em_dev_load_f64<DT>(out, o)))
          em_dev_store_f64<DT>(out, o, d.p0);             /* [lo, hi) in every dtype */
      }
    }
  }
}

/* A float dtype's storage and its rounding of a double (the CPU's: through f32 for bf16/f16). */
template <int DT> struct RngOut;
template <> struct RngOut<EM_F32> {
  typedef float S;
  static __device__ __forceinline__ S round(double v) { return (float)v; }
  static __device__ __forceinline__ double back(S s) { return s; }
};
template <> struct RngOut<EM_F64> {
  typedef double S;
  static __device__ __forceinline__ S round(double v) { return v; }
  static __device__ __forceinline__ double back(S s) { return s; }
};
template <> struct RngOut<EM_BF16> {
  typedef uint16_t S;
  static __device__ __forceinline__ S round(double v) { return em_dev_f32_to_bf16((float)v); }
  static __device__ __forceinline__ double back(S s) { return em_dev_bf16_to_f32(s); }
};
template <> struct RngOut<EM_F16> {
  typedef uint16_t S;
  static __device__ __forceinline__ S round(double v) { return em_dev_f32_to_f16((float)v); }
  static __device__ __forceinline__ double back(S s) { return em_dev_f16_to_f32(s); }
};

/* 16-bit stores from f32 values: the hardware's paired round-to-nearest-even
 * (cvt.rn.{bf16x2,f16x2}.f32: one instruction for two elements, where the
 * hand-written em_f32_to_bf16/f16 take five to fifteen each) agrees with the
 * CPU's rounding on every non-NaN value, subnormals and overflow to inf
 * included; only a NaN's pattern differs (canonical 0x7fff), so a NaN takes
 * the CPU's conversion instead. Random fills meet NaN only with a NaN or
 * infinite mean/std or an overflowing hi - lo. */
template <int DT, bool MAYBE_NAN> __device__ __forceinline__ uint32_t rng_pack2(float a, float b) {
  uint32_t r;
  if constexpr (DT == EM_BF16) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);        /* .x = a: the low half */
    r = *reinterpret_cast<uint32_t *>(&h);
  } else {
    __half2 h = __floats2half2_rn(a, b);
    r = *reinterpret_cast<uint32_t *>(&h);
  }
  if (MAYBE_NAN && __builtin_expect(isnan(a) || isnan(b), 0)) {
    if constexpr (DT == EM_BF16) r = (uint32_t)em_dev_f32_to_bf16(a) | ((uint32_t)em_dev_f32_to_bf16(b) << 16);
    else r = (uint32_t)em_dev_f32_to_f16(a) | ((uint32_t)em_dev_f32_to_f16(b) << 16);
  }
  return r;
}

/* The distribution of a contiguous fill, fixed at compile time: each kernel
 * carries only its own math (a runtime switch kept erfinv's and Box-Muller's
 * registers in the uniform fill). kUnit is uniform on [0, 1): u24 itself,
 * exact in f32, so it needs no double arithmetic and gives the same bits. */
enum { kUniform = EM_RNG_UNIFORM, kNormal = EM_RNG_NORMAL, kTrunc = EM_RNG_TRUNC, kUnit = 100, kUniformF = 101 };

/* u24(w) = (w >> 8) 2^-24 as a double without a 64-bit conversion (16 a
 * clock per SM on Hopper, against 64 for a DADD): 2^28 + m 2^-24 is the
 * double with high word 0x41b00000 and low word m, and subtracting 2^28 is
 * exact (Sterbenz), so this is em_rng_u24 bit for bit. */
__device__ __forceinline__ double rng_u24_f64(uint32_t w) {
  return __dsub_rn(__hiloint2double(0x41b00000, (int)(w >> 8)), 268435456.0);
}

/* The four values of a block rounded once to f32 (the CPU's value before its
 * bf16/f16 rounding): the f32/bf16/f16 fills. */
template <int KIND>
__device__ __forceinline__ void rng_block_f32(const em_rng_dist &d, const em_philox_block &pb, float *z, float span_s,
                                              float lo_f) {
  if constexpr (KIND == kUnit) {
#pragma unroll
    for (int e = 0; e < 4; e++) z[e] = (float)(pb.v[e] >> 8) * 0x1p-24f;   /* exact: 24 bits */
  } else if constexpr (KIND == kUniformF) {
    /* lo + span u with lo, span exact in f32 and the double arithmetic exact (em_rng_uniform_f32_exact): one
     * rounding of the exact value either way, so this FFMA is the CPU's double result rounded to f32 */
#pragma unroll
    for (int e = 0; e < 4; e++) z[e] = __fmaf_rn(span_s, (float)(pb.v[e] >> 8), lo_f);
  } else if constexpr (KIND == kNormal) {
    em_rng_block_normal_f32(&d, &pb, z);
  } else if constexpr (KIND == kUniform) {
    const double span = d.p1 - d.p0;                                     /* as em_rng_block_uniform */
#pragma unroll
    for (int e = 0; e < 4; e++) z[e] = (float)EM_RNG_ADD(d.p0, EM_RNG_MUL(span, rng_u24_f64(pb.v[e])));
  } else {
    double x[4];
    em_rng_block_trunc(&d, &pb, x);
#pragma unroll
    for (int e = 0; e < 4; e++) z[e] = (float)x[e];
  }
}

/* Contiguous, 16-byte aligned out: thread t writes elements [4B t, 4B (t + 1)) from blocks B t .. B t + B - 1,
 * B Philox chains in flight per thread. f32/bf16/f16 outputs: uniform_'s [lo, hi) rule (rng.c: a value that
 * rounds to hi in the dtype is stored as lo) is one compare on the f32 value z before its rounding, z >= bound
 * (em_rng_hi_bound, rng_math.h: every z is <= hi, and rounding is monotone), z then replaced by lo_f, lo in f32, whose
 * rounding is the CPU's lo in the dtype; bound is NaN where the rule cannot fire. */
template <int DT, int B, int KIND, bool NANS>
__global__ void __launch_bounds__(256) rng_contig(void *out, int64_t n, uint64_t nblocks, em_rng_dist d,
                                                 em_philox_state st, float bound, float lo_f, float span_s,
                                                 bool shared) {
  typedef typename RngOut<DT>::S S;
  constexpr int E = 4 * B, CHUNKS = E * (int)sizeof(S) / 16;
  static_assert(E * sizeof(S) % 16 == 0, "whole 16-byte chunks per thread");
  /* whether a stored value can equal hi: uniform_ (kUnit: 1 in bf16/f16, never in f32, where u < 1 is exact) */
  constexpr bool HI_RULE = KIND == kUniform || KIND == kUniformF || (KIND == kUnit && DT != EM_F32);
  uint64_t seed, ctr0;
  em_philox_resolve(st, &seed, &ctr0);
  const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  S *o = (S *)out;
  const uint64_t nthr = (nblocks + B - 1) / B;
  for (uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; t < nthr; t += (uint64_t)gridDim.x * blockDim.x) {
    union { S s[E]; uint32_t w[E * sizeof(S) / 4]; uint4 q[CHUNKS]; } v;
    em_philox_block pb[B];
    em_philox_run(ctr0 + t * B, B, shared, k0, k1, pb);   /* blocks B t .. B t + B - 1 */
    if constexpr (DT == EM_F64) {
#pragma unroll
      for (int k = 0; k < B; k++) {
        double x[4];
        if constexpr (KIND == kUnit) {
#pragma unroll
          for (int e = 0; e < 4; e++) x[e] = (double)((float)(pb[k].v[e] >> 8) * 0x1p-24f);
        } else if constexpr (KIND == kUniform) em_rng_block_uniform(&d, &pb[k], x);
        else if constexpr (KIND == kNormal) em_rng_block_normal(&d, &pb[k], x);
        else em_rng_block_trunc(&d, &pb[k], x);
#pragma unroll
        for (int e = 0; e < 4; e++)
          v.s[4 * k + e] = (KIND == kUniform && em_rng_uniform_hits_hi(&d, x[e])) ? d.p0 : x[e];
      }
    } else {
#pragma unroll
      for (int k = 0; k < B; k++) {
        float z[4];
        rng_block_f32<KIND>(d, pb[k], z, span_s, lo_f);
        if constexpr (DT == EM_F32) {
#pragma unroll
          for (int e = 0; e < 4; e++) v.s[4 * k + e] = HI_RULE && z[e] >= bound ? lo_f : z[e];
        } else {
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const float a = HI_RULE && z[e] >= bound ? lo_f : z[e], b = HI_RULE && z[e + 1] >= bound ? lo_f : z[e + 1];
            v.w[2 * k + e / 2] = rng_pack2<DT, NANS>(a, b);
          }
        }
      }
    }
    const int64_t j0 = (int64_t)(t * E);
    if (j0 + E <= n) {
#pragma unroll
      for (int c = 0; c < CHUNKS; c++) reinterpret_cast<uint4 *>(o + j0)[c] = v.q[c];
    } else {
#pragma unroll
      for (int e = 0; e < E; e++)          /* unrolled: v stays in registers (a run-time index put it in local memory) */
        if (j0 + e < n) o[j0 + e] = v.s[e];
    }
  }
}

template <int DT, int B, int KIND>
static void rng_contig_go(unsigned grid, void *out, int64_t n, uint64_t nblocks, const em_rng_dist *d,
                          em_philox_state ps, cudaStream_t st, float bound, float lo_f, bool nans, float span_s = 0) {
  constexpr bool PACKED = DT == EM_BF16 || DT == EM_F16;   /* NANS matters only to rng_pack2 */
  const bool shared = em_philox_run_shared();
  if (PACKED && nans)
    rng_contig<DT, B, KIND, PACKED><<<grid, 256, 0, st>>>(out, n, nblocks, *d, ps, bound, lo_f, span_s, shared);
  else rng_contig<DT, B, KIND, false><<<grid, 256, 0, st>>>(out, n, nblocks, *d, ps, bound, lo_f, span_s, shared);
}

/* EMBER_RNG_UNIFORM_OLD=1: uniform_ always in double (as before), even where one FFMA gives the same bits. */
static bool rng_uniform_old() {
  static const bool on = em_env_switch("EMBER_RNG_UNIFORM_OLD", false);
  return on;
}

/* Whether an f32 value of the fill can be NaN (then 16-bit stores take the CPU's NaN pattern, rng_pack2):
 * uniform_ only with a NaN or infinite lo or hi - lo (lo + (hi - lo) u is otherwise finite in double, and
 * its f32 rounding at worst infinite), normal_ only with a NaN or infinite f32 mean or std (the Box-Muller
 * z is finite, so mean + std (r cos) is finite or infinite, never inf - inf), [0, 1) never; trunc_normal_
 * keeps the check. f32/f64 outputs store NaN as it comes and ignore this. */
static bool rng_may_nan(const em_rng_dist *d, bool unit) {
  if (unit) return false;
  if (d->kind == EM_RNG_UNIFORM) return !(isfinite(d->p0) && isfinite(d->p1 - d->p0));
  if (d->kind == EM_RNG_NORMAL) return !(isfinite((float)d->p0) && isfinite((float)d->p1));
  return true;
}

/* EMBER_RNG_CONTIG_OLD=1: the launch before 4-block threads and NaN-free packing (B = 2, every 16-bit
 * pair checked for NaN), for A/B timing; the values are the same either way. */
static bool rng_contig_old() {
  static const bool on = em_env_switch("EMBER_RNG_CONTIG_OLD", false);
  return on;
}

template <int DT, int B>
static void rng_contig_launch(void *out, int64_t n, uint64_t nblocks, const em_rng_dist *d, em_philox_state ps,
                              cudaStream_t st) {
  const unsigned grid = em_grid((int64_t)((nblocks + B - 1) / B), 256);
  const bool unit = d->kind == EM_RNG_UNIFORM && d->p0 == 0.0 && d->p1 == 1.0;
  const float bound = em_rng_hi_bound(d, DT), lo_f = (float)d->p0;
  /* the old kernels checked every 16-bit pair but [0, 1)'s for NaN */
  const bool nans = rng_contig_old() ? !unit : rng_may_nan(d, unit);
  float span_s = 0;
  bool ffma = false;   /* uniform_ in one FFMA (f32/bf16/f16 outputs) */
  if constexpr (DT != EM_F64)
    ffma = !unit && d->kind == EM_RNG_UNIFORM && !rng_uniform_old() && em_rng_uniform_f32_exact(d, &span_s);
  if (unit) rng_contig_go<DT, B, kUnit>(grid, out, n, nblocks, d, ps, st, bound, lo_f, false);
  else if (ffma) {
    if constexpr (DT != EM_F64) rng_contig_go<DT, B, kUniformF>(grid, out, n, nblocks, d, ps, st, bound, lo_f, nans, span_s);
  } else if (d->kind == EM_RNG_UNIFORM) rng_contig_go<DT, B, kUniform>(grid, out, n, nblocks, d, ps, st, bound, lo_f, nans);
  else if (d->kind == EM_RNG_NORMAL) rng_contig_go<DT, B, kNormal>(grid, out, n, nblocks, d, ps, st, bound, lo_f, nans);
  else if constexpr (B <= 2) rng_contig_go<DT, B, kTrunc>(grid, out, n, nblocks, d, ps, st, bound, lo_f, true);
}

/* Blocks a thread: 4 for 16-bit outputs and f32 normal_, which the issue rate bounds (half the per-thread
 * index and tail work an element), 2 for f32 uniform_ (bound by memory, more threads in flight at 31
 * registers than at ~40) and trunc_normal_ (double erfinv: 4 chains spill), 1 for f64. */
template <int DT>
static void rng_contig_pick(void *out, int64_t n, uint64_t nblocks, const em_rng_dist *d, em_philox_state ps,
                            cudaStream_t st) {
  const bool four = !rng_contig_old() && d->kind != EM_RNG_TRUNC && (DT != EM_F32 || d->kind == EM_RNG_NORMAL);
  if (four) rng_contig_launch<DT, 4>(out, n, nblocks, d, ps, st);
  else rng_contig_launch<DT, 2>(out, n, nblocks, d, ps, st);
}

extern "C" int em_rng_fill_cuda(em_tensor *t, const em_rng_dist *d, em_philox_state ps) {
  const char *op = em_current_op ? em_current_op : "random";
  if (em_cuda_check_device(op, t->device.index)) return -1;
  int64_t n = em_numel(t);
  if (n == 0) return 0;
  bool randint = d->kind == EM_RNG_RANDINT, wide = randint && d->span > 0x100000000ull;
  uint64_t nblocks = (uint64_t)((n + (wide ? 2 : 4) - 1) / (wide ? 2 : 4));
  EmDeviceGuard guard(t->device.index);
  cudaStream_t st = (cudaStream_t)em_cuda_cur_stream_handle(t->device.index);
  em_geom g = em_geom_make(t->ndim, t->shape, t->stride, NULL);
  void *out = em_data_ptr(t);
  unsigned grid = em_grid((int64_t)nblocks, 256);
  const bool contig = g.ndim == 1 && (g.stride[0][0] == 1 || n == 1) && ((uintptr_t)out & 15) == 0;
  if (!randint && contig && em_dtype_is_float(t->dtype)) {
    switch (t->dtype) {
      case EM_F32: rng_contig_pick<EM_F32>(out, n, nblocks, d, ps, st); break;
      case EM_F64: rng_contig_launch<EM_F64, 1>(out, n, nblocks, d, ps, st); break;
      case EM_BF16: rng_contig_pick<EM_BF16>(out, n, nblocks, d, ps, st); break;
      default: rng_contig_pick<EM_F16>(out, n, nblocks, d, ps, st); break;
    }
    return em_launch_check(op);
  }
  if (randint) {
    EM_DTYPE_CASES(t->dtype, DT, rng_kernel<DT, true><<<grid, 256, 0, st>>>(out, g, n, nblocks, *d, ps, wide))
  } else {
    switch (t->dtype) {
      case EM_F32: rng_kernel<EM_F32, false><<<grid, 256, 0, st>>>(out, g, n, nblocks, *d, ps, false); break;
      case EM_F64: rng_kernel<EM_F64, false><<<grid, 256, 0, st>>>(out, g, n, nblocks, *d, ps, false); break;
      case EM_BF16: rng_kernel<EM_BF16, false><<<grid, 256, 0, st>>>(out, g, n, nblocks, *d, ps, false); break;
      case EM_F16: rng_kernel<EM_F16, false><<<grid, 256, 0, st>>>(out, g, n, nblocks, *d, ps, false); break;
      default: return em_error("%s: expected a floating-point tensor, got %s", op, em_dtype_name(t->dtype));
    }
  }
  return em_launch_check(op);
}

/* The graph's Philox cell {seed, base}, written on the replay stream right
 * before the graph launches (graph.cu): one thread, two stores. */
__global__ void rng_cell_set_kernel(uint64_t *cell, uint64_t seed, uint64_t base) {
  cell[0] = seed;
  cell[1] = base;
}

extern "C" int em_rng_cell_set_cuda(uint64_t *cell, uint64_t seed, uint64_t base, void *stream) {
  rng_cell_set_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(cell, seed, base);
  return em_launch_check("graph.replay");
}
