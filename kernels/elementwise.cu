/* Elementwise kernels: every binary op (add ... logical_or, and the fused
 * unary-gradient codes g' = f(g, x or y)), every unary op, clamp, where /
 * masked_fill, and triu/tril — the GPU twin of engine/ops/elementwise.c's CPU
 * loop, with the same compute types (f32 for f32/bf16/f16, f64 for f64, int64
 * for integers and bool) and the same rounding on store.
 *
 * Cost: FLOPs ~1 per element (a few for gelu/silu/pow); bytes per element =
 * sum of the operand sizes (f32 add: 12 B). Memory-bound: the ceiling is the
 * copy bandwidth (~3 TB/s on an H100), so the only things that matter are
 * wide coalesced accesses and not re-reading anything.
 *
 * Launch shape: 256-thread blocks, grid-stride. Three general paths:
 *  - ew_contig: output and every tensor input share one float storage type
 *    and are unit-stride over the coalesced loop (the engine merges
 *    contiguous dims first, so any same-shape contiguous op is 1-D); inputs
 *    may also be constants (Lua numbers) or broadcast scalars (a 0-d tensor:
 *    loaded once per thread). One 16-byte vector per operand per step (two
 *    in flight for bf16/f16), int32 offsets up to 2^30 elements, one
 *    instantiation per operand count; unaligned views run the same kernel
 *    one element at a time.
 *  - ew_rows: the same, with broadcasting across rows: every tensor input is
 *    unit-stride along the last dim or constant along it (x + bias,
 *    x * norm_weight, x * per_row_scale). Packed128 per step, the row's
 *    offsets from one division per outer dim.
 *  - ew_strided: any dtypes, any broadcast, any strides; four elements per
 *    thread per step with all loads issued first, 32-bit index arithmetic
 *    whenever the offsets fit.
 * And two for bf16/f16 shapes that ran at 56-60% of an H100's bandwidth on
 * the paths above: ew_select16w (where/masked_fill, contiguous, a bool
 * condition, on the raw 16-bit words; instead of ew_mixed; ew_select16 under
 * EMBER_SELECT16=old) and ew_rows2d (a row broadcast down 2-D rows; instead
 * of ew_rows). EMBER_EW_KERNELS=generic turns them off.
 * The one trick: the op code is a runtime switch, uniform across a launch,
 * placed outside the loop over a thread's 4-16 elements — so each case's
 * independent computations overlap, and one kernel per storage type serves
 * every op instead of hundreds of template instances. */
#include "common.cuh"
#include "dtype_io.cuh"
#include "launch.cuh"
#include "backend.h"
#include <stdlib.h>
#include <string.h>
#include <type_traits>

namespace {

constexpr int kThreads = 256;
constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kGeluPdf = 0.5 * 1.12837916709551257390 * 0.70710678118654752440;   /* 0.5 * 2/sqrt(pi) * 1/sqrt(2) */
constexpr double kGeluTanhK = 0.79788456080286535588, kGeluTanhC = 0.044715;         /* sqrt(2/pi), gelu "tanh" */

/* Operand modes. */
enum { IN_PTR = 0, IN_CONST = 1, IN_SCALAR = 2 };

/* What the unit-stride float kernels (ew_contig, ew_fixed) read: 128 bytes of kernel parameters where the
 * whole EwArgs is 464. A tiny op's host time is mostly its launch, and the launch copies the parameters:
 * the geometry the 1-D paths never read stays out of theirs (tools/launch_cost.cu times 8 to 4096 bytes). */
struct EwFlat {
  int kind, code, nin, ndim;
  double lo, hi;                  /* clamp bounds for float classes */
  int64_t numel;
  void *ptr[4];                   /* element 0 of each tensor (offset applied) */
  int dtype[4];
  int mode[3];
  double cval[3];
};

struct EwArgs : EwFlat {
  int64_t ilo, ihi;               /* clamp bounds for the integer class */
  int64_t shape[EM_MAX_DIMS];
  int64_t stride[4][EM_MAX_DIMS]; /* [0] output, [j+1] input j */
};
static_assert(sizeof(EwFlat) == 128 && sizeof(EwArgs) == 464, "the parameter sizes the comment above states");

/* ---------------- math, overloaded for float and double ---------------- */

#define EM_MATH1(name, f32, f64)                                            \
  __device__ __forceinline__ float name(float x) { return f32(x); }        \
  __device__ __forceinline__ double name(double x) { return f64(x); }
EM_MATH1(m_exp, expf, exp)
EM_MATH1(m_log, logf, log)
EM_MATH1(m_sqrt, sqrtf, sqrt)
EM_MATH1(m_tanh, tanhf, tanh)
EM_MATH1(m_erf, erff, erf)
EM_MATH1(m_sin, sinf, sin)
EM_MATH1(m_cos, cosf, cos)
EM_MATH1(m_fabs, fabsf, fabs)
EM_MATH1(m_floor, floorf, floor)
EM_MATH1(m_ceil, ceilf, ceil)
EM_MATH1(m_rint, rintf, rint)    /* half to even, as torch.round and the CPU's nearbyint */
#undef EM_MATH1
__device__ __forceinline__ float m_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double m_pow(double a, double b) { return pow(a, b); }

/* ---------------- the ops (mirror FLOAT_*_BODY and *_i64 in elementwise.c) ----------------
 * Each function applies one op to V elements. The switch sits outside the
 * element loop, so the V independent computations of a case are scheduled
 * together (their latencies overlap) instead of being V trips through an
 * indirect branch. */

#define EW_FOR(...) { _Pragma("unroll") for (int e = 0; e < V; e++) { __VA_ARGS__ } }
#define BCASE(CODE, EXPR) case CODE: EW_FOR(const T a = x[e]; const T b = y[e]; o[e] = (EXPR);) return;
#define UCASE(CODE, EXPR) case CODE: EW_FOR(const T a = x[e]; o[e] = (EXPR);) return;

template <typename T, int V>
__device__ __forceinline__ void float_binary(int code, T (&o)[V], const T (&x)[V], const T (&y)[V], T lo, T hi) {
  switch (code) {
    BCASE(EM_ADD, a + b)
    BCASE(EM_SUB, a - b)
    BCASE(EM_MUL, a * b)
    BCASE(EM_DIV, a / b)
    BCASE(EM_POW, m_pow(a, b))
    BCASE(EM_MAXIMUM, (isnan(a) || a > b) ? a : b)
    BCASE(EM_MINIMUM, (isnan(a) || a < b) ? a : b)
    BCASE(EM_EQ, (T)(a == b))
    BCASE(EM_NE, (T)(a != b))
    BCASE(EM_LT, (T)(a < b))
    BCASE(EM_LE, (T)(a <= b))
    BCASE(EM_GT, (T)(a > b))
    BCASE(EM_GE, (T)(a >= b))
    BCASE(EM_LOGICAL_AND, (T)(a != 0 && b != 0))
    BCASE(EM_LOGICAL_OR, (T)(a != 0 || b != 0))
    BCASE(EM_EW_G_ABS, b > 0 ? a : b < 0 ? -a : (T)0)
    BCASE(EM_EW_G_SQRT, a / (2 * b))
    BCASE(EM_EW_G_RSQRT, (T)-0.5 * a * b * b * b)
    BCASE(EM_EW_G_TANH, a * (1 - b * b))
    BCASE(EM_EW_G_SIGMOID, a * b * (1 - b))
    case EM_EW_G_SILU:
      EW_FOR(const T a = x[e]; const T b = y[e]; const T s = 1 / (1 + m_exp(-b)); o[e] = a * s * (1 + b * (1 - s));)
      return;
    BCASE(EM_EW_G_RELU, b > 0 ? a : (T)0)
    case EM_EW_G_GELU:
      EW_FOR(const T a = x[e]; const T b = y[e];
             const T cdf = (T)0.5 * (1 + m_erf(b * (T)kSqrt1_2));
             const T pdf = m_exp((T)-0.5 * b * b) * (T)kGeluPdf;
             o[e] = a * (cdf + b * pdf);)
      return;
    BCASE(EM_EW_G_SIN, a * m_cos(b))
    BCASE(EM_EW_G_COS, -a * m_sin(b))
    BCASE(EM_EW_G_SQUARE, 2 * a * b)
    BCASE(EM_EW_G_RECIP, -a * b * b)
    BCASE(EM_EW_G_CLAMP, (b >= lo && b <= hi) ? a : (T)0)
    case EM_EW_G_GELU_TANH:
      EW_FOR(const T a = x[e]; const T b = y[e];
             const T t = m_tanh((T)kGeluTanhK * (b + (T)kGeluTanhC * b * b * b));
             o[e] = a * ((T)0.5 * (1 + t) + (T)0.5 * b * (1 - t * t) * (T)kGeluTanhK * (1 + (T)(3 * kGeluTanhC) * b * b));)
      return;
    default: EW_FOR(o[e] = 0;) return;
  }
}

template <typename T, int V>
__device__ __forceinline__ void float_unary(int code, T (&o)[V], const T (&x)[V], T lo, T hi) {
  switch (code) {
    UCASE(EM_NEG, -a)
    UCASE(EM_ABS, m_fabs(a))
    UCASE(EM_SQRT, m_sqrt(a))
    UCASE(EM_RSQRT, 1 / m_sqrt(a))
    UCASE(EM_EXP, m_exp(a))
    UCASE(EM_LOG, m_log(a))
    UCASE(EM_TANH, m_tanh(a))
    UCASE(EM_SIGMOID, 1 / (1 + m_exp(-a)))
    UCASE(EM_SILU, a / (1 + m_exp(-a)))
    UCASE(EM_RELU, a < 0 ? (T)0 : a)
    UCASE(EM_GELU, (T)0.5 * a * (1 + m_erf(a * (T)kSqrt1_2)))
    UCASE(EM_SIN, m_sin(a))
    UCASE(EM_COS, m_cos(a))
    UCASE(EM_SQUARE, a * a)
    UCASE(EM_RECIPROCAL, 1 / a)
    UCASE(EM_SIGN, (T)((a > 0) - (a < 0)))
    UCASE(EM_LOGICAL_NOT, (T)(a == 0))
    UCASE(EM_FLOOR, m_floor(a))
    UCASE(EM_CEIL, m_ceil(a))
    UCASE(EM_ROUND, m_rint(a))
    UCASE(EM_GELU_TANH, (T)0.5 * a * (1 + m_tanh((T)kGeluTanhK * (a + (T)kGeluTanhC * a * a * a))))
    case EM_EW_CLAMP: EW_FOR(const T v = x[e] < lo ? lo : x[e]; o[e] = v > hi ? hi : v;) return;
    default: EW_FOR(o[e] = 0;) return;
  }
}
#undef BCASE
#undef UCASE

/* Integer power by squaring with wrap-around; negative exponents as the CPU. */
__device__ __forceinline__ int64_t ipow(int64_t b, int64_t e) {
  if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;
  uint64_t r = 1, x = (uint64_t)b;
  while (e) { if (e & 1) r *= x; x *= x; e >>= 1; }
  return (int64_t)r;
}

__device__ __forceinline__ int64_t int_binary(int code, int64_t a, int64_t b) {
  switch (code) {
    case EM_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
    case EM_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
    case EM_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
    case EM_POW: return ipow(a, b);
    case EM_MAXIMUM: return a > b ? a : b;
    case EM_MINIMUM: return a < b ? a : b;
    case EM_EQ: return a == b;
    case EM_NE: return a != b;
    case EM_LT: return a < b;
    case EM_LE: return a <= b;
    case EM_GT: return a > b;
    case EM_GE: return a >= b;
    case EM_LOGICAL_AND: return a != 0 && b != 0;
    case EM_LOGICAL_OR: return a != 0 || b != 0;
    default: return 0;   /* div and the gradient codes never run on integers */
  }
}

__device__ __forceinline__ int64_t int_unary(int code, int64_t a, int64_t lo, int64_t hi) {
  switch (code) {
    case EM_NEG: return (int64_t)(0 - (uint64_t)a);
    case EM_ABS: return a < 0 ? (int64_t)(0 - (uint64_t)a) : a;
    case EM_SQUARE: return (int64_t)((uint64_t)a * (uint64_t)a);
    case EM_SIGN: return (a > 0) - (a < 0);
    case EM_RELU: return a < 0 ? 0 : a;
    case EM_LOGICAL_NOT: return a == 0;
    case EM_EW_CLAMP: { int64_t v = a < lo ? lo : a; return v > hi ? hi : v; }
    default: return a;   /* floor, ceil, round of an integer */
  }
}

/* ---- issue 12: ternary ops o = f(x, y, z; value v): lerp, addcmul, addcdiv ---- */
template <typename C, int V>
__device__ __forceinline__ void ternary(int code, C (&o)[V], const C (&x)[V], const C (&y)[V], const C (&z)[V], C v) {
  if constexpr (std::is_same<C, int64_t>::value) {   /* addcmul only, wrapping */
    EW_FOR(o[e] = (int64_t)((uint64_t)x[e] + (uint64_t)v * (uint64_t)y[e] * (uint64_t)z[e]);)
  } else {
    switch (code) {
      case EM_EW_LERP:   /* PyTorch's two-sided formula: exact at w = 0 and w = 1 */
        EW_FOR(const C d = y[e] - x[e]; const C w = z[e];
               o[e] = (w < (C)0.5 && w > (C)-0.5) ? x[e] + w * d : y[e] - d * (1 - w);)
        return;
      case EM_EW_ADDCMUL: EW_FOR(o[e] = x[e] + v * y[e] * z[e];) return;
      case EM_EW_ADDCDIV: EW_FOR(o[e] = x[e] + v * y[e] / z[e];) return;
      default: EW_FOR(o[e] = 0;) return;
    }
  }
}
/* ---- end issue 12 ---- */

/* The op of a launch, with its bounds already in the compute type. */
template <typename C>
struct Kern {
  int kind, code;
  C lo, hi;
  template <typename A>   /* EwArgs, or EwFlat for a float C */
  __device__ explicit Kern(const A &a) : kind(a.kind), code(a.code) {
    if constexpr (std::is_same<C, int64_t>::value) { lo = a.ilo; hi = a.ihi; }
    else { lo = (C)a.lo; hi = (C)a.hi; }
  }
  /* o = op(x, y, z) elementwise over V values. */
  template <int V>
  __device__ __forceinline__ void apply(C (&o)[V], const C (&x)[V], const C (&y)[V], const C (&z)[V]) const {
    if (kind == EM_EW_WHERE) { EW_FOR(o[e] = x[e] != (C)0 ? y[e] : z[e];) return; }
    if (kind == EM_EW_TERNARY) { ternary<C, V>(code, o, x, y, z, lo); return; }   /* issue 12 */
    if constexpr (std::is_same<C, int64_t>::value) {
      if (kind == EM_EW_BINARY) EW_FOR(o[e] = int_binary(code, x[e], y[e]);)
      else EW_FOR(o[e] = int_unary(code, x[e], lo, hi);)
    } else {
      if (kind == EM_EW_BINARY) float_binary<C, V>(code, o, x, y, lo, hi);
      else float_unary<C, V>(code, o, x, lo, hi);
    }
  }
};

/* A constant operand in the compute type (the CPU's fill_const). */
template <typename C> __device__ __forceinline__ C const_as(double c) {
  if constexpr (std::is_same<C, int64_t>::value) return em_sat_i64(c);
  else return (C)c;
}

/* ---------------- fast path: one float storage type, unit stride ----------------
 * NIN: the operand slots (1 unary, 2 binary, 3 where/ternary), so a binary op
 * carries no third operand's registers. I: int32 offsets whenever the tensor
 * has at most 2^30 elements. U: 16-byte vectors per operand a thread keeps in
 * flight: two for bf16/f16 (the vector is only 8 elements there, and 48
 * registers left 5 blocks an SM: 40 KB in flight instead of f32's 64 KB).
 * Loads are raw 32-bit words (bf16 -> f32 is a shift), not a Packed128 of
 * 16-bit registers. */

template <typename T, typename C, bool VEC, int NIN, typename I>
__global__ void __launch_bounds__(kThreads) ew_contig(EwFlat a) {
  constexpr int V = VEC ? 16 / (int)sizeof(T) : 1;
  constexpr int U = VEC && sizeof(T) == 2 ? 2 : 1;
  constexpr int W = U * V;
  const Kern<C> k(a);
  C cst[3];
#pragma unroll
  for (int j = 0; j < 3; j++)
    cst[j] = a.mode[j] == IN_CONST ? const_as<C>(a.cval[j])
           : a.mode[j] == IN_SCALAR ? load_as<C>(a.ptr[j + 1], a.dtype[j + 1], 0) : (C)0;
  T *out = (T *)a.ptr[0];
  const I n = (I)a.numel, nv = n / V;
  const I tid = (I)blockIdx.x * blockDim.x + threadIdx.x, step = (I)gridDim.x * blockDim.x;
  for (I v0 = tid; v0 < nv; v0 += U * step) {
    C x[NIN][W], o[W];
#pragma unroll
    for (int j = 0; j < NIN; j++) {
      if (a.mode[j] == IN_PTR) {
        const T *src = (const T *)a.ptr[j + 1];
#pragma unroll
        for (int u = 0; u < U; u++) {
          const I v = v0 + u * step;
          if constexpr (VEC) {
            uint4 w = make_uint4(0, 0, 0, 0);
            if (u == 0 || v < nv) w = reinterpret_cast<const uint4 *>(src)[v];
#pragma unroll
            for (int e = 0; e < V; e++) x[j][u * V + e] = raw_elem<C, T>(w, e);
          } else {
            x[j][u] = to_compute<C, T>(src[v]);
          }
        }
      } else {
#pragma unroll
        for (int e = 0; e < W; e++) x[j][e] = cst[j];
      }
    }
    k.apply(o, x[0], x[NIN > 1 ? 1 : 0], x[NIN > 2 ? 2 : 0]);   /* slots >= NIN are never read */
#pragma unroll
    for (int u = 0; u < U; u++) {
      const I v = v0 + u * step;
      if (u > 0 && v >= nv) break;
      if constexpr (VEC) {
        Packed128<T> p;
#pragma unroll
        for (int e = 0; e < V; e++) p[e] = from_compute<T, C>(o[u * V + e]);
        store128(out + (size_t)v * V, p);
      } else {
        out[v] = from_compute<T, C>(o[u]);
      }
    }
  }
  /* the last n % V elements, one per thread */
  const I i = nv * V + tid;
  if (VEC && i < n) {
    C x[3][1], o[1];
#pragma unroll
    for (int j = 0; j < 3; j++)
      x[j][0] = (j < a.nin && a.mode[j] == IN_PTR) ? to_compute<C, T>(((const T *)a.ptr[j + 1])[i]) : cst[j];
    k.apply(o, x[0], x[1], x[2]);
    out[i] = from_compute<T, C>(o[0]);
  }
}

/* ---------------- bf16/f16 (and f32), unit stride, the op compiled in (issue 12) ----------------
 * ew_contig serves every op with runtime switches; per thread (16 bf16
 * elements) it pays the Kern and constant set-up (five f64 -> f32
 * conversions), operand-mode tests and the switch's dispatch, and carries
 * registers for every case: 48 (unary) / 64 (binary) / 80 (ternary). gelu in
 * bf16 ran at 51 % of the H200's bandwidth (torch 10 % faster): at 4 B an
 * element, 70 % of 4800 GB/s leaves ~28 lane-instructions an element, and
 * gelu's erff alone is ~22 (9 FSEL of coefficients, 7 FFMA, an ex2), the
 * rest of the op ~5; bf16 add / maximum / lerp trailed torch by ~8-10 %.
 * Also the fused gradients of gelu, gelu tanh, silu, sigmoid and tanh
 * (binary codes: g' = f(g, x or y)), the backward of the unary ones.
 * Here NIN and CODE are template arguments: float_unary / float_binary /
 * ternary fold to the one case (the same expression, so the same bits); an
 * operand is a tensor or a number (a uniform branch). Same shape as
 * ew_contig's bf16 path: two 16-byte vectors per operand a thread in flight
 * (v and v + grid), int32 offsets (n <= 2^30), 16-byte aligned tensors.
 * v: addcmul / addcdiv's value (Kern's lo). f32 takes it for the unary
 * transcendental ops and their gradients only (ew_contig's f32 path moves
 * 4 elements a thread, so its set-up weighs 4x per element: gelu f32 77 %,
 * torch 8 % faster; f32 add / lerp are at 85-91 % there and stay).
 * EMBER_EW_FIXED_OLD=1 runs all of these on ew_contig again. */
template <typename T, int NIN, int CODE>
__global__ void __launch_bounds__(kThreads) ew_fixed(EwFlat a) {
  constexpr int V = 16 / (int)sizeof(T), U = 2, W = U * V;
  const uint4 *src[NIN];
  float cst[NIN];
#pragma unroll
  for (int j = 0; j < NIN; j++) {
    src[j] = a.mode[j] == IN_PTR ? (const uint4 *)a.ptr[j + 1] : nullptr;
    cst[j] = (float)a.cval[j];
  }
  const float v = (float)a.lo;
  T *out = (T *)a.ptr[0];
  const int n = (int)a.numel, nv = n / V;
  const int tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
  for (int v0 = tid; v0 < nv; v0 += U * step) {
    uint4 w[NIN][U];
#pragma unroll
    for (int j = 0; j < NIN; j++)
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int vi = v0 + u * step;
        w[j][u] = (src[j] && (u == 0 || vi < nv)) ? src[j][vi] : make_uint4(0, 0, 0, 0);
      }
    float x[NIN][W], o[W];
#pragma unroll
    for (int j = 0; j < NIN; j++)
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int e = 0; e < V; e++) x[j][u * V + e] = src[j] ? raw_elem<float, T>(w[j][u], e) : cst[j];
    if constexpr (NIN == 1) float_unary<float, W>(CODE, o, x[0], 0.f, 0.f);
    else if constexpr (NIN == 2) float_binary<float, W>(CODE, o, x[0], x[1], 0.f, 0.f);
    else ternary<float, W>(CODE, o, x[0], x[1], x[2], v);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int vi = v0 + u * step;
      if (u > 0 && vi >= nv) break;
      Packed128<T> p;
#pragma unroll
      for (int e = 0; e < V; e++) p[e] = from_compute<T, float>(o[u * V + e]);
      store128(out + (size_t)vi * V, p);
    }
  }
  const int i = nv * V + tid;   /* the last n % V elements, one per thread */
  if (i < n) {
    float x[NIN][1], o[1];
#pragma unroll
    for (int j = 0; j < NIN; j++) x[j][0] = src[j] ? to_compute<float, T>(((const T *)a.ptr[j + 1])[i]) : cst[j];
    if constexpr (NIN == 1) float_unary<float, 1>(CODE, o, x[0], 0.f, 0.f);
    else if constexpr (NIN == 2) float_binary<float, 1>(CODE, o, x[0], x[1], 0.f, 0.f);
    else ternary<float, 1>(CODE, o, x[0], x[1], x[2], v);
    out[i] = from_compute<T, float>(o[0]);
  }
}

/* ---------------- gelu (erf) on bf16 by table (issue 12) ----------------
 * ew_fixed's bf16 gelu ran at 64 % of the bandwidth at (8192,8192): ~31
 * lane-instructions an element (erff ~22, the rest ~9) against the ~28 that
 * 70 % of 4800 GB/s leaves at 4 B an element, so issue and memory both ran
 * near their limits. A bf16 gelu has 65536 inputs: each block first
 * evaluates it -- the same float_unary code, rounded by the same
 * from_compute, so the same bits -- for every bf16 x with |x| in [2^-12,
 * 2^6) (18 binades of 128, both signs: 4608 results, 9 KiB of shared
 * memory, 4.5 evaluations a thread), then looks each element up by its bits
 * (~8 instructions and a shared load); other x (zeros, tiny, large, inf,
 * NaN) compute as before. Blocks of 1024 threads, two a multiprocessor
 * (a full SM at <= 32 registers), stride over the tensor with two 16-byte
 * vectors a thread in flight, so the table is built twice per SM (~1.3 us;
 * 256-thread blocks built it 8 times, ~5 us). gelu tanh likewise. EMBER_GELU_TAB=0 runs
 * ew_fixed. */
constexpr int kGeluN = kBf16TabN, kGeluThreads = 1024;

template <int CODE>
__device__ __forceinline__ uint32_t gelu_calc(uint32_t b) {   /* b: a bf16's bits -> gelu's bits */
  float o[1];
  const float x[1] = {__uint_as_float(b << 16)};
  float_unary<float, 1>(CODE, o, x, 0.f, 0.f);
  return __bfloat16_as_ushort(from_compute<__nv_bfloat16, float>(o[0]));
}
template <int CODE>
__device__ __forceinline__ uint32_t gelu_look(const unsigned short *tab, uint32_t b) {
  const uint32_t i = em_bf16_tab_index(b);
  return i < (uint32_t)kGeluN ? (uint32_t)tab[i + (b >> 15) * kGeluN] : gelu_calc<CODE>(b);
}
template <int CODE>
__device__ __forceinline__ uint32_t gelu_word(const unsigned short *tab, uint32_t w) {
  return gelu_look<CODE>(tab, w & 0xffffu) | gelu_look<CODE>(tab, w >> 16) << 16;
}

/* CODE: EM_GELU or EM_GELU_TANH (its tanh ~14 instructions and the cubic ~5: 2^24 ran at 63 %) */
template <int CODE>
__global__ void __launch_bounds__(kGeluThreads, 2) gelu_tab(const uint4 *in, uint4 *out, int n) {
  __shared__ unsigned short tab[2 * kGeluN];
  const int nv = n / 8, tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
  /* the first trip's loads go out before the table is built: the build (~4 us for a full grid) hides their latency */
  uint4 w0 = make_uint4(0, 0, 0, 0), w1 = w0;
  if (tid < nv) w0 = in[tid];
  if (tid + step < nv) w1 = in[tid + step];
#pragma unroll 1
  for (int i = threadIdx.x; i < 2 * kGeluN; i += kGeluThreads)
    tab[i] = (unsigned short)gelu_calc<CODE>(em_bf16_tab_bits(i % kGeluN) | (i >= kGeluN ? 0x8000u : 0u));
  __syncthreads();
  for (int v = tid; v < nv; v += 2 * step) {
    const bool two = v + step < nv;
    if (v != tid) {
      w0 = in[v];
      if (two) w1 = in[v + step];
    }
    out[v] = make_uint4(gelu_word<CODE>(tab, w0.x), gelu_word<CODE>(tab, w0.y), gelu_word<CODE>(tab, w0.z),
                        gelu_word<CODE>(tab, w0.w));
    if (two)
      out[v + step] = make_uint4(gelu_word<CODE>(tab, w1.x), gelu_word<CODE>(tab, w1.y), gelu_word<CODE>(tab, w1.z),
                                 gelu_word<CODE>(tab, w1.w));
  }
  const int i = nv * 8 + tid;   /* the last n % 8 elements, one per thread */
  if (i < n) {
    const unsigned short *pi = (const unsigned short *)in;
    ((unsigned short *)out)[i] = (unsigned short)gelu_look<CODE>(tab, pi[i]);
  }
}

/* ---------------- mixed float storage types, unit stride ----------------
 * f32 residual stream + bf16 branch output under autocast (x + attn(x)),
 * and its kin: every operand unit-stride, storage f32/bf16/f16 in any mix
 * (inputs may also be bool/u8: where's condition, masked_fill's mask),
 * compute f32. Eight elements per thread per step, each operand loaded as
 * one or two 16-byte vectors (8 bytes for bool/u8) by its own dtype (a
 * launch-uniform branch). */

template <typename I>
__device__ __forceinline__ void load8(const void *base, int dt, I v, float x[8]) {
  if (dt == EM_BOOL || dt == EM_U8) {   /* where's condition, masked_fill's mask: 8 bytes */
    const uint2 q = ((const uint2 *)base)[v];
#pragma unroll
    for (int e = 0; e < 8; e++) {
      const unsigned b = ((e < 4 ? q.x : q.y) >> (8 * (e & 3))) & 0xFFu;
      x[e] = dt == EM_BOOL ? (b != 0 ? 1.f : 0.f) : (float)b;
    }
  } else if (dt == EM_F32) {
    const float4 *p = (const float4 *)base + 2 * v;
    float4 a = p[0], b = p[1];
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
  } else if (dt == EM_BF16) {   /* raw words: bf16 -> f32 is a shift */
    const uint4 w = ((const uint4 *)base)[v];
#pragma unroll
    for (int e = 0; e < 8; e++) x[e] = raw_elem<float, __nv_bfloat16>(w, e);
  } else {
    const uint4 w = ((const uint4 *)base)[v];
#pragma unroll
    for (int e = 0; e < 8; e++) x[e] = raw_elem<float, __half>(w, e);
  }
}

template <typename I>
__device__ __forceinline__ void store8(void *base, int dt, I v, const float x[8]) {
  if (dt == EM_F32) {
    float4 *p = (float4 *)base + 2 * v;
    p[0] = make_float4(x[0], x[1], x[2], x[3]);
    p[1] = make_float4(x[4], x[5], x[6], x[7]);
  } else if (dt == EM_BF16) {
    Packed128<__nv_bfloat16> p;
#pragma unroll
    for (int e = 0; e < 8; e++) p[e] = from_compute<__nv_bfloat16, float>(x[e]);
    store128((__nv_bfloat16 *)base + 8 * (size_t)v, p);
  } else {
    Packed128<__half> p;
#pragma unroll
    for (int e = 0; e < 8; e++) p[e] = from_compute<__half, float>(x[e]);
    store128((__half *)base + 8 * (size_t)v, p);
  }
}

/* U groups of 8 elements a thread in flight (2 when the output is 16-bit:
 * where/masked_fill in bf16 move 5-7 bytes an element, and one group left
 * ~30-50 KB in flight an SM); I: int32 offsets up to 2^30 elements. */
template <typename I, int U>
__global__ void __launch_bounds__(kThreads) ew_mixed(EwArgs a) {
  const Kern<float> k(a);
  float cst[3];
#pragma unroll
  for (int j = 0; j < 3; j++) cst[j] = a.mode[j] == IN_CONST ? const_as<float>(a.cval[j]) : 0.f;
  const I n = (I)a.numel, nv = n / 8;
  const I tid = (I)blockIdx.x * blockDim.x + threadIdx.x, step = (I)gridDim.x * blockDim.x;
  for (I v0 = tid; v0 < nv; v0 += U * step) {
    float x[3][8 * U], o[8 * U];
#pragma unroll
    for (int j = 0; j < 3; j++) {
      if (j < a.nin && a.mode[j] == IN_PTR) {
#pragma unroll
        for (int u = 0; u < U; u++) {
          const I v = v0 + u * step;
          if (u == 0 || v < nv) load8<I>(a.ptr[j + 1], a.dtype[j + 1], v, x[j] + 8 * u);
          else {
#pragma unroll
            for (int e = 0; e < 8; e++) x[j][8 * u + e] = 0.f;
          }
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8 * U; e++) x[j][e] = cst[j];
      }
    }
    k.apply(o, x[0], x[1], x[2]);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const I v = v0 + u * step;
      if (u > 0 && v >= nv) break;
      store8<I>(a.ptr[0], a.dtype[0], v, o + 8 * u);
    }
  }
  const I i = nv * 8 + tid;   /* the last n % 8 elements */
  if (i < n) {
    float x[3][1], o[1];
#pragma unroll
    for (int j = 0; j < 3; j++)
      x[j][0] = (j < a.nin && a.mode[j] == IN_PTR) ? load_as<float>(a.ptr[j + 1], a.dtype[j + 1], i) : cst[j];
    k.apply(o, x[0], x[1], x[2]);
    store_as<float>(a.ptr[0], a.dtype[0], i, o[0]);
  }
}

bool half_or_f32(int dt) { return dt == EM_F32 || dt == EM_BF16 || dt == EM_F16; }

/* ---------------- broadcast along rows: unit-stride last dim ----------------
 * Every tensor operand is unit-stride along the last coalesced dim, or
 * constant along it (stride 0: a per-row value, such as a (B*T, 1) scale);
 * rows (the outer dims) broadcast freely: x + bias, x * norm_weight. One
 * 16-byte vector per operand per step (two in flight for bf16/f16, as
 * ew_contig), read as raw words; the row's offsets cost one division per
 * outer dim per vector. NIN as ew_contig (the int64 variant takes 3). */

/* Vector u's row offsets (off, per tensor) and its first column c. */
template <typename I, int V>
__device__ __forceinline__ void row_offsets(const EwArgs &a, I u, I nv, I off[4], I &c) {
  I row = u / nv, rem = row;
  c = (u - row * nv) * V;
  off[0] = off[1] = off[2] = off[3] = 0;
  for (int d = a.ndim - 2; d >= 0; d--) {
    I s = (I)a.shape[d], q = rem / s, cc = rem - q * s;
    rem = q;
#pragma unroll
    for (int o = 0; o < 4; o++) off[o] += cc * (I)a.stride[o][d];
  }
}

template <typename T, typename C, int NIN, typename I>
__global__ void __launch_bounds__(kThreads) ew_rows(EwArgs a) {
  constexpr int V = 16 / (int)sizeof(T);
  constexpr int U = sizeof(T) == 2 ? 2 : 1;
  constexpr int W = U * V;
  const Kern<C> k(a);
  const int last = a.ndim - 1;
  C cst[3];
#pragma unroll
  for (int j = 0; j < 3; j++) cst[j] = a.mode[j] == IN_CONST ? const_as<C>(a.cval[j]) : (C)0;
  const I nv = (I)(a.shape[last] / V), total = (I)(a.numel / V), step = (I)gridDim.x * blockDim.x;
  for (I u0 = (I)blockIdx.x * blockDim.x + threadIdx.x; u0 < total; u0 += U * step) {
    I off[U][4], c[U];
    bool ok[U];
#pragma unroll
    for (int uu = 0; uu < U; uu++) {
      ok[uu] = uu == 0 || u0 + uu * step < total;
      row_offsets<I, V>(a, ok[uu] ? u0 + uu * step : u0, nv, off[uu], c[uu]);
    }
    C x[NIN][W], o[W];
#pragma unroll
    for (int j = 0; j < NIN; j++) {
      if (a.mode[j] == IN_PTR) {
        const bool unit = a.stride[j + 1][last] == 1;
#pragma unroll
        for (int uu = 0; uu < U; uu++) {
          if (unit) {
            const uint4 w = *reinterpret_cast<const uint4 *>((const T *)a.ptr[j + 1] + off[uu][j + 1] + c[uu]);
#pragma unroll
            for (int e = 0; e < V; e++) x[j][uu * V + e] = raw_elem<C, T>(w, e);
          } else {   /* a per-row value */
            C v = load_as<C>(a.ptr[j + 1], a.dtype[j + 1], off[uu][j + 1]);
#pragma unroll
            for (int e = 0; e < V; e++) x[j][uu * V + e] = v;
          }
        }
      } else {
#pragma unroll
        for (int e = 0; e < W; e++) x[j][e] = cst[j];
      }
    }
    k.apply(o, x[0], x[NIN > 1 ? 1 : 0], x[NIN > 2 ? 2 : 0]);
#pragma unroll
    for (int uu = 0; uu < U; uu++) {
      if (!ok[uu]) break;
      Packed128<T> p;
#pragma unroll
      for (int e = 0; e < V; e++) p[e] = from_compute<T, C>(o[uu * V + e]);
      store128((T *)a.ptr[0] + off[uu][0] + c[uu], p);
    }
  }
}

/* ---------------- where / masked_fill in bf16/f16: 16 elements a thread step ----------------
 * The mixed kernel above serves these with a runtime dtype switch per
 * operand, and each operand's conversion sits in its branch right after its
 * load, so a thread waits on one operand's loads before issuing the next
 * (80 registers, 3 blocks an SM; 56-58% of 3350 GB/s on an H100 for where
 * and masked_fill in bf16, against 80-83% in f32). Here the operand kinds are
 * template arguments (AT/BT: a tensor, else a constant) and every load of a
 * step is issued before the first use: the condition as one 16-byte vector
 * (16 bools), each value operand as two, U = 2 steps in flight (v and
 * v + grid). The select runs on the f32 values and rounds back as the mixed
 * kernel does (cond != 0 ? a : b, then round-to-nearest): same bits, NaN
 * payloads included. int32 offsets: n <= 2^30. */
template <typename T, bool AT, bool BT>
__global__ void __launch_bounds__(kThreads) ew_select16(EwArgs a) {
  constexpr int U = 2;
  const uint4 *cond = (const uint4 *)a.ptr[1];
  const uint4 *pa = (const uint4 *)a.ptr[2], *pb = (const uint4 *)a.ptr[3];
  const float ca = (float)a.cval[1], cb = (float)a.cval[2];
  T *out = (T *)a.ptr[0];
  const int n = (int)a.numel, nv = n / 16;
  const int tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
  for (int v0 = tid; v0 < nv; v0 += U * step) {
    uint4 m[U], wa[U][2], wb[U][2];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int v = v0 + u * step;
      if (u == 0 || v < nv) {
        m[u] = cond[v];
        if (AT) { wa[u][0] = pa[2 * v]; wa[u][1] = pa[2 * v + 1]; }
        if (BT) { wb[u][0] = pb[2 * v]; wb[u][1] = pb[2 * v + 1]; }
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int v = v0 + u * step;
      if (u > 0 && v >= nv) break;
#pragma unroll
      for (int h = 0; h < 2; h++) {
        Packed128<T> p;
#pragma unroll
        for (int e = 0; e < 8; e++) {
          const int i = 8 * h + e;   /* byte i of the condition vector */
          const bool c = ((word_at(m[u], i >> 2) >> (8 * (i & 3))) & 0xFFu) != 0;
          const float x = AT ? raw_elem<float, T>(wa[u][h], e) : ca;
          const float y = BT ? raw_elem<float, T>(wb[u][h], e) : cb;
          p[e] = from_compute<T, float>(c ? x : y);
        }
        store128(out + 16 * v + 8 * h, p);
      }
    }
  }
  const int i = nv * 16 + tid;   /* the last n % 16 elements, one per thread */
  if (i < n) {
    const bool c = ((const uint8_t *)a.ptr[1])[i] != 0;
    const float x = AT ? to_compute<float, T>(((const T *)a.ptr[2])[i]) : ca;
    const float y = BT ? to_compute<float, T>(((const T *)a.ptr[3])[i]) : cb;
    out[i] = from_compute<T, float>(c ? x : y);
  }
}

/* where / masked_fill in bf16/f16, coalesced and on the raw bits (issue 12:
 * ew_select16 ran where (8192,8192) bf16 at 84 % to PyTorch's 92 %). A lane
 * takes 8 elements a step -- the condition's 8 bools as one 8-byte load, each
 * value operand as one 16-byte load, one 16-byte store -- so every load and
 * store instruction of a warp covers one contiguous 256/512-byte run
 * (ew_select16's lane takes 16: its two 16-byte loads of an operand, and its
 * two stores, each cover half of every 32-byte sector of a 1 KiB run), U = 4
 * steps in flight (160 bytes a lane, as ew_select16). RAW: the select on the
 * 16-bit words -- a byte's "nonzero" into its bit 7 (mask, add, or), a PRMT
 * that replicates that bit over the two halves of a word, one LOP3 -- ~3
 * instructions an element against ~4 for the f32 select and rounding. The
 * f32 path's rounding changes no value but a NaN (bf16/f16 -> f32 -> bf16/f16
 * is exact otherwise, subnormals included: no .ftz), so a step whose selected
 * word holds a NaN half is redone the f32 way (select16_f32: the very code of
 * ew_select16): same bits, NaN payloads included. A constant operand is its
 * f32 value rounded once (from_f32, the f32 path's rounding of it). int32
 * offsets: n <= 2^30. */
template <typename T> __device__ __forceinline__ uint32_t bits16(T x);
template <> __device__ __forceinline__ uint32_t bits16<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
template <> __device__ __forceinline__ uint32_t bits16<__half>(__half x) { return __half_as_ushort(x); }

__device__ __forceinline__ uint32_t prmt_sx(uint32_t x, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(0u), "r"(sel));
  return r;
}

/* 8 elements the f32 way: cond bytes m, values wa / wb (or the constants) */
template <typename T, bool AT, bool BT>
__device__ __forceinline__ void select16_f32(T *out, uint2 m, const uint4 &wa, const uint4 &wb, float ca, float cb) {
  Packed128<T> p;
#pragma unroll
  for (int e = 0; e < 8; e++) {
    const bool c = (((e < 4 ? m.x : m.y) >> (8 * (e & 3))) & 0xFFu) != 0;
    const float x = AT ? raw_elem<float, T>(wa, e) : ca;
    const float y = BT ? raw_elem<float, T>(wb, e) : cb;
    p[e] = from_compute<T, float>(c ? x : y);
  }
  store128(out, p);
}

template <typename T, bool AT, bool BT, bool RAW>
__global__ void __launch_bounds__(kThreads) ew_select16w(EwArgs a) {
  constexpr int U = 4;
  /* |h| + NA reaches bit 15 of a half exactly when h is a NaN */
  constexpr uint32_t NA = (std::is_same<T, __half>::value ? 0x7fffu - 0x7c00u : 0x7fffu - 0x7f80u) * 0x00010001u;
  const uint2 *cond = (const uint2 *)a.ptr[1];
  const uint4 *pa = (const uint4 *)a.ptr[2], *pb = (const uint4 *)a.ptr[3];
  const float ca = (float)a.cval[1], cb = (float)a.cval[2];
  const uint32_t ha = AT ? 0u : bits16<T>(from_f32<T>(ca)) * 0x00010001u;
  const uint32_t hb = BT ? 0u : bits16<T>(from_f32<T>(cb)) * 0x00010001u;
  T *out = (T *)a.ptr[0];
  const int n = (int)a.numel, nv = n / 8;
  const int tid = blockIdx.x * blockDim.x + threadIdx.x, step = gridDim.x * blockDim.x;
  for (int v0 = tid; v0 < nv; v0 += U * step) {
    uint2 m[U];
    uint4 wa[U], wb[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int v = v0 + u * step;
      if (u == 0 || v < nv) {
        m[u] = cond[v];
        if (AT) wa[u] = pa[v];
        if (BT) wb[u] = pb[v];
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int v = v0 + u * step;
      if (u > 0 && v >= nv) break;
      if constexpr (RAW) {
        const uint32_t nz0 = ((m[u].x & 0x7f7f7f7fu) + 0x7f7f7f7fu) | m[u].x;   /* bit 7 of a byte: nonzero */
        const uint32_t nz1 = ((m[u].y & 0x7f7f7f7fu) + 0x7f7f7f7fu) | m[u].y;
        uint32_t o[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const uint32_t msk = prmt_sx(j < 2 ? nz0 : nz1, (j & 1) ? 0xbbaau : 0x9988u);
          const uint32_t x = AT ? word_at(wa[u], j) : ha, y = BT ? word_at(wb[u], j) : hb;
          o[j] = (x & msk) | (y & ~msk);
        }
        const uint32_t nn = ((o[0] & 0x7fff7fffu) + NA) | ((o[1] & 0x7fff7fffu) + NA) |
                             ((o[2] & 0x7fff7fffu) + NA) | ((o[3] & 0x7fff7fffu) + NA);
        if (!(nn & 0x80008000u)) {
          *(uint4 *)(out + 8 * v) = make_uint4(o[0], o[1], o[2], o[3]);
          continue;
        }
      }
      select16_f32<T, AT, BT>(out + 8 * v, m[u], AT ? wa[u] : make_uint4(0, 0, 0, 0), BT ? wb[u] : make_uint4(0, 0, 0, 0), ca, cb);
    }
  }
  const int i = nv * 8 + tid;   /* the last n % 8 elements, one per thread */
  if (i < n) {
    const bool c = ((const uint8_t *)a.ptr[1])[i] != 0;
    const float x = AT ? to_compute<float, T>(((const T *)a.ptr[2])[i]) : ca;
    const float y = BT ? to_compute<float, T>(((const T *)a.ptr[3])[i]) : cb;
    out[i] = from_compute<T, float>(c ? x : y);
  }
}

/* ---------------- broadcast along rows, 2-D, no index division in the loop ----------------
 * x + bias in bf16/f16 over a (rows, cols) plan: every tensor operand
 * unit-stride along cols with any 16-byte-multiple row stride (0: a row
 * broadcast down the rows), constants allowed. ew_rows above finds each
 * vector's row by a division per vector and branches per operand on its
 * kind (a per-row value or a row) between loads (60% in bf16 on an H100,
 * f32 80%). Here thread g owns column vector g % cv for good (one division a
 * thread) and walks rows g / cv, + rstep, ...: the host makes the grid's
 * thread count a multiple of cv, so rstep = threads / cv rows. U = 2 rows in
 * flight, every load of a step issued before the first use. int32 offsets
 * (the host's idx32 check). */
/* ROWV (issue 12): some operand is a per-row value (stride 0 along cols, any
 * dtype: outer's column vector, x * per_row_scale), read as one scalar a row
 * (the warp's threads share it) by load_as, the value ew_rows reads; outer
 * in bf16 ran at 40 % of an H100's bandwidth on ew_rows (two divisions and a
 * runtime-dtype load a vector for 2 bytes an element moved). */
template <typename T, int NIN, bool ROWV>
__global__ void __launch_bounds__(kThreads) ew_rows2d(EwArgs a, int cv, int rstep) {
  constexpr int V = 16 / (int)sizeof(T), U = 2, W = U * V;
  const Kern<float> k(a);
  const int rows = (int)a.shape[0];
  const int g = blockIdx.x * kThreads + threadIdx.x;
  const int c = (g % cv) * V;
  float cst[3];
  const T *src[3];
  bool per[3];
  int rs[4];
#pragma unroll
  for (int j = 0; j < 3; j++) {
    cst[j] = a.mode[j] == IN_CONST ? (float)a.cval[j] : 0.f;
    per[j] = ROWV && a.mode[j] == IN_PTR && a.stride[j + 1][1] == 0;
    src[j] = (const T *)a.ptr[j + 1] + (per[j] ? 0 : c);
  }
#pragma unroll
  for (int q = 0; q < 4; q++) rs[q] = (int)a.stride[q][0];
  T *out = (T *)a.ptr[0] + c;
  for (int r0 = g / cv; r0 < rows; r0 += U * rstep) {
    uint4 w[NIN][U];
    float rv[NIN][U];
#pragma unroll
    for (int j = 0; j < NIN; j++)
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int r = r0 + u * rstep;
        w[j][u] = make_uint4(0, 0, 0, 0);
        rv[j][u] = 0.f;
        if (a.mode[j] == IN_PTR && (u == 0 || r < rows)) {
          if (per[j]) rv[j][u] = load_as<float>(a.ptr[j + 1], a.dtype[j + 1], (int64_t)r * rs[j + 1]);
          else w[j][u] = *(const uint4 *)(src[j] + r * rs[j + 1]);
        }
      }
    float x[NIN][W], o[W];
#pragma unroll
    for (int j = 0; j < NIN; j++) {
      const bool ptr = a.mode[j] == IN_PTR;
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int e = 0; e < V; e++)
          x[j][u * V + e] = !ptr ? cst[j] : per[j] ? rv[j][u] : raw_elem<float, T>(w[j][u], e);
    }
    k.apply(o, x[0], x[NIN > 1 ? 1 : 0], x[NIN > 2 ? 2 : 0]);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int r = r0 + u * rstep;
      if (u > 0 && r >= rows) break;
      Packed128<T> p;
#pragma unroll
      for (int e = 0; e < V; e++) p[e] = from_compute<T, float>(o[u * V + e]);
      store128(out + r * rs[0], p);
    }
  }
}

/* ---------------- outer-like: a per-row value op a row, 2-D ----------------
 * outer(a, b) = a[:, None] * b[None, :] and its kin (x * per_row_scale with a
 * row broadcast down the rows): 2 inputs, one a per-row value (stride 0
 * along cols, any dtype), the other one row (stride 0 down rows, unit along
 * cols, the output's dtype). The output is all the traffic (8192 x 8192:
 * 256 MiB of f32 written, 64 KiB read), so this is a pure write: thread g of
 * block (x, y) owns column vector x * kThreads + g, reads its 16 bytes of the
 * row once, then writes rb rows (y * rb ...), the block's rb per-row values
 * loaded once into shared memory (one thread each). ew_rows2d ran one or two rows a thread,
 * each after a dependent load of the row vector: 60 % (f32) / 40 % (bf16) of
 * an H200 where a pure write (diag) reaches 85 / 78 %. Same k.apply on the
 * same floats as ew_rows2d: the same bits. EMBER_EW_OUTER2D=0: ew_rows2d. */
template <typename T, int PJ>
__global__ void __launch_bounds__(kThreads, 4) ew_outer2d(EwArgs a, int cv, int rb) {
  constexpr int V = 16 / (int)sizeof(T), RJ = 1 - PJ;
  __shared__ float sv[kThreads];       /* the block's rb <= kThreads per-row values */
  const int rows = (int)a.shape[0], r0 = blockIdx.y * rb;
  const int n = rows - r0 < rb ? rows - r0 : rb;
  if ((int)threadIdx.x < n)
    sv[threadIdx.x] = load_as<float>(a.ptr[PJ + 1], a.dtype[PJ + 1], (int64_t)(r0 + threadIdx.x) * a.stride[PJ + 1][0]);
  __syncthreads();
  const int cvi = blockIdx.x * kThreads + threadIdx.x;
  if (cvi >= cv) return;
  const Kern<float> k(a);
  const uint4 w = *(const uint4 *)((const T *)a.ptr[RJ + 1] + cvi * V);
  float xr[V];
#pragma unroll
  for (int e = 0; e < V; e++) xr[e] = raw_elem<float, T>(w, e);
  const int ors = (int)a.stride[0][0];
  T *out = (T *)a.ptr[0] + cvi * V + r0 * ors;
#pragma unroll 1
  for (int u = 0; u < n; u++) {        /* not unrolled: one copy of apply's op switch (stores need no waiting) */
    float xs[V], o[V];
#pragma unroll
    for (int e = 0; e < V; e++) xs[e] = sv[u];
    if (PJ == 0) k.apply(o, xs, xr, xs);   /* z as ew_rows2d passes it (x[0]; unread by a binary op) */
    else k.apply(o, xr, xs, xr);
    Packed128<T> p;
#pragma unroll
    for (int e = 0; e < V; e++) p[e] = from_compute<T, float>(o[e]);
    store128(out + u * ors, p);
  }
}

/* ---------------- general path: any dtypes, broadcast, strides ----------------
 * Four elements per thread per step (indices i, i + step, ... so each of the
 * four is coalesced across the warp): all loads are issued before the first
 * result is needed, which keeps enough bytes in flight for the scalar,
 * runtime-dtype loads. */

constexpr int kUnroll = 4;

template <typename C, typename I>
__global__ void __launch_bounds__(kThreads) ew_strided(EwArgs a) {
  const Kern<C> k(a);
  C cst[3];
#pragma unroll
  for (int j = 0; j < 3; j++) cst[j] = a.mode[j] == IN_CONST ? const_as<C>(a.cval[j]) : (C)0;
  const I n = (I)a.numel, step = (I)gridDim.x * blockDim.x;
  for (I base = (I)blockIdx.x * blockDim.x + threadIdx.x; base < n; base += step * kUnroll) {
    I off[kUnroll][4];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      I i = base + u * step;
      I rem = i < n ? i : 0;
#pragma unroll
      for (int o = 0; o < 4; o++) off[u][o] = 0;
      for (int d = a.ndim - 1; d >= 0; d--) {
        I s = (I)a.shape[d], q = rem / s, c = rem - q * s;
        rem = q;
#pragma unroll
        for (int o = 0; o < 4; o++) off[u][o] += c * (I)a.stride[o][d];
      }
    }
    C x[3][kUnroll], o[kUnroll];
#pragma unroll
    for (int j = 0; j < 3; j++)
#pragma unroll
      for (int u = 0; u < kUnroll; u++)
        x[j][u] = (j < a.nin && a.mode[j] == IN_PTR) ? load_as<C>(a.ptr[j + 1], a.dtype[j + 1], off[u][j + 1]) : cst[j];
    k.apply(o, x[0], x[1], x[2]);
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
      if (base + u * step < n) store_as<C>(a.ptr[0], a.dtype[0], off[u][0], o[u]);
  }
}

/* ---------------- triu / tril ---------------- */

struct TriArgs {
  int ndim;
  int64_t shape[EM_MAX_DIMS], in_stride[EM_MAX_DIMS];
  int64_t numel, k;
  bool upper;
};

/* E: an unsigned type of the element's width (only bits move). */
template <typename E>
__global__ void __launch_bounds__(kThreads) triangle_kernel(E *out, const E *in, TriArgs t) {
  const int64_t cols = t.shape[t.ndim - 1], rows = t.shape[t.ndim - 2];
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < t.numel; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t c = i % cols, rest = i / cols, r = rest % rows;
    rest /= rows;
    int64_t off = c * t.in_stride[t.ndim - 1] + r * t.in_stride[t.ndim - 2];
    for (int d = t.ndim - 3; d >= 0; d--) {
      off += (rest % t.shape[d]) * t.in_stride[d];
      rest /= t.shape[d];
    }
    bool keep = t.upper ? (c - r >= t.k) : (c - r <= t.k);
    out[i] = keep ? in[off] : (E)0;
  }
}

int class_of(em_dtype t) { return t == EM_F64 ? EM_EW_F64 : em_dtype_is_float(t) ? EM_EW_F32 : EM_EW_I64; }

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

unsigned grid_for(int64_t units) { return em_grid(units, kThreads); }

/* The tiny ops' path (a + b, a:add_(b), a * w of one element): launched through em_launch (launch.cuh). */
template <typename T>
int launch_contig(const char *op, int dev, const EwArgs &a, bool vec, cudaStream_t s) {
  typedef typename std::conditional<std::is_same<T, double>::value, double, float>::type C;
  constexpr int V = 16 / (int)sizeof(T), U = sizeof(T) == 2 ? 2 : 1;
  const bool i32 = a.numel <= ((int64_t)1 << 30);   /* v + U * step stays below 2^31 */
  if (vec) {
    const unsigned g = grid_for((a.numel / V + U - 1) / U > 0 ? (a.numel / V + U - 1) / U : 1);
    if (!i32) return em_launch<ew_contig<T, C, true, 3, int64_t>>(op, dev, g, kThreads, 0, s, a);
    if (a.nin == 1) return em_launch<ew_contig<T, C, true, 1, int32_t>>(op, dev, g, kThreads, 0, s, a);
    if (a.nin == 2) return em_launch<ew_contig<T, C, true, 2, int32_t>>(op, dev, g, kThreads, 0, s, a);
    return em_launch<ew_contig<T, C, true, 3, int32_t>>(op, dev, g, kThreads, 0, s, a);
  }
  if (i32) return em_launch<ew_contig<T, C, false, 3, int32_t>>(op, dev, grid_for(a.numel), kThreads, 0, s, a);
  return em_launch<ew_contig<T, C, false, 3, int64_t>>(op, dev, grid_for(a.numel), kThreads, 0, s, a);
}

/* EMBER_GELU_TAB=0: bf16 gelu and gelu tanh on ew_fixed (erff / tanhf per element) instead of gelu_tab; read once. */
bool gelu_tab_on() {
  static const bool on = em_env_switch("EMBER_GELU_TAB", true);
  return on;
}

/* ew_fixed's launch, or false when the op is not one of its (kind, code)s.
 * The caller has checked: bf16/f16/f32, every tensor operand of that dtype,
 * unit-stride and 16-byte aligned, the others numbers, n <= 2^30. f32: the
 * transcendental unary ops and their gradients only. */
template <typename T>
bool launch_fixed(const char *op, const EwArgs &a, cudaStream_t s, int dev, int &rc) {
  constexpr bool f32 = std::is_same<T, float>::value;
  const int64_t units = (a.numel / (16 / (int)sizeof(T)) + 1) / 2;
  const unsigned g = grid_for(units > 0 ? units : 1);
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    if (a.kind == EM_EW_UNARY && a.nin == 1 && (a.code == EM_GELU || a.code == EM_GELU_TANH) && a.mode[0] == IN_PTR &&
        gelu_tab_on()) {
      /* at most 2 blocks of 1024 a multiprocessor (gelu_tab's bound): one wave, each block building its table once */
      const int64_t cap = (int64_t)em_sm_count(dev) * 2, want = (units + kGeluThreads - 1) / kGeluThreads;
      const unsigned gg = (unsigned)(want < 1 ? 1 : want < cap ? want : cap);
      const uint4 *in = (const uint4 *)a.ptr[1];
      uint4 *out = (uint4 *)a.ptr[0];
      if (a.code == EM_GELU) rc = em_launch<gelu_tab<EM_GELU>>(op, dev, gg, kGeluThreads, 0, s, in, out, (int)a.numel);
      else rc = em_launch<gelu_tab<EM_GELU_TANH>>(op, dev, gg, kGeluThreads, 0, s, in, out, (int)a.numel);
      return true;
    }
  }
#define EM_FX(NIN, CODE) case CODE: rc = em_launch<ew_fixed<T, NIN, CODE>>(op, dev, g, kThreads, 0, s, a); return true
  if (a.kind == EM_EW_BINARY && a.nin == 2) {   /* the backward of the transcendental unary ops: g' = f(g, x or y) */
    switch (a.code) {
      EM_FX(2, EM_EW_G_GELU); EM_FX(2, EM_EW_G_GELU_TANH); EM_FX(2, EM_EW_G_SILU); EM_FX(2, EM_EW_G_SIGMOID);
      EM_FX(2, EM_EW_G_TANH);
      default: break;
    }
  }
  if (a.kind == EM_EW_UNARY && a.nin == 1) {
    switch (a.code) {
      EM_FX(1, EM_GELU); EM_FX(1, EM_GELU_TANH); EM_FX(1, EM_SILU); EM_FX(1, EM_SIGMOID); EM_FX(1, EM_TANH);
      default: return false;
    }
  }
  if constexpr (!f32) {
    if (a.kind == EM_EW_BINARY && a.nin == 2) {
      switch (a.code) {
        EM_FX(2, EM_ADD); EM_FX(2, EM_SUB); EM_FX(2, EM_MUL); EM_FX(2, EM_DIV); EM_FX(2, EM_MAXIMUM); EM_FX(2, EM_MINIMUM);
        default: return false;
      }
    }
    if (a.kind == EM_EW_TERNARY && a.nin == 3) {
      switch (a.code) {
        EM_FX(3, EM_EW_LERP); EM_FX(3, EM_EW_ADDCMUL); EM_FX(3, EM_EW_ADDCDIV);
        default: return false;
      }
    }
  }
#undef EM_FX
  return false;
}

/* EMBER_EW_FIXED_OLD=1: ew_fixed's ops on ew_contig, as before (A/B timing in one session). */
bool fixed_old() {
  static const bool on = em_env_switch("EMBER_EW_FIXED_OLD", false);
  return on;
}

template <typename C>
int launch_strided(const EwArgs &a, bool idx32, cudaStream_t s) {
  unsigned g = grid_for((a.numel + kUnroll - 1) / kUnroll);
  if (idx32) ew_strided<C, int32_t><<<g, kThreads, 0, s>>>(a);
  else ew_strided<C, int64_t><<<g, kThreads, 0, s>>>(a);
  return 0;
}

template <typename T>
int launch_rows(const EwArgs &a, bool idx32, cudaStream_t s) {
  typedef typename std::conditional<std::is_same<T, double>::value, double, float>::type C;
  constexpr int U = sizeof(T) == 2 ? 2 : 1;
  const int64_t units = a.numel / (16 / (int)sizeof(T));
  const unsigned g = grid_for((units + U - 1) / U);
  if (!idx32) ew_rows<T, C, 3, int64_t><<<g, kThreads, 0, s>>>(a);
  else if (a.nin == 1) ew_rows<T, C, 1, int32_t><<<g, kThreads, 0, s>>>(a);
  else if (a.nin == 2) ew_rows<T, C, 2, int32_t><<<g, kThreads, 0, s>>>(a);
  else ew_rows<T, C, 3, int32_t><<<g, kThreads, 0, s>>>(a);
  return 0;
}

/* Can the rows kernel run this plan? Output unit-stride along the last dim,
 * every tensor input unit-stride of the output's dtype or constant along it,
 * whole 16-byte vectors per row, every vector aligned. */
bool rows_eligible(const EwArgs &a, const em_ew_plan *p) {
  const int last = p->ndim - 1;
  const int es = (int)em_dtype_size((em_dtype)a.dtype[0]), V = 16 / es;
  if (p->ndim < 2 || p->stride[0][last] != 1 || p->shape[last] % V != 0) return false;
  for (int q = 0; q <= a.nin; q++) {
    if (q > 0 && a.mode[q - 1] != IN_PTR) continue;
    int64_t st = p->stride[q][last];
    if (st == 0 && q > 0) continue;                     /* a per-row value: any dtype, any alignment */
    if (st != 1 || a.dtype[q] != a.dtype[0] || !aligned16(a.ptr[q])) return false;
    for (int d = 0; d < last; d++) if ((p->stride[q][d] * es) % 16 != 0) return false;
  }
  return true;
}

/* EMBER_EW_KERNELS (read once): "fast" (default) or "generic", which turns
 * off ew_select16 and ew_rows2d so one process can time both sides of them
 * (bench_ops.lua); 0, 1 or -1 with the error set. */
int ew_generic_only(const char *op) {
  static int mode = -1;
  if (mode < 0) {
    const char *env = getenv("EMBER_EW_KERNELS");
    if (!env || !*env || strcmp(env, "fast") == 0) mode = 0;
    else if (strcmp(env, "generic") == 0) mode = 1;
    else return em_error("%s: expected EMBER_EW_KERNELS to be fast or generic, got '%s'", op, env);
  }
  return mode;
}

bool half16(int dt) { return dt == EM_BF16 || dt == EM_F16; }

/* ew_select16's plan: where/masked_fill into bf16/f16, 1-D, every operand
 * unit-stride and 16-byte aligned, a bool condition first, each value a
 * tensor of the output's dtype or a constant. */
bool select16_eligible(const EwArgs &a, const em_ew_kern *k, const em_ew_plan *p) {
  if (k->kind != EM_EW_WHERE || a.nin != 3 || !half16(a.dtype[0]) || p->ndim != 1 || a.numel > ((int64_t)1 << 30))
    return false;
  const bool one = a.numel == 1;
  if (!aligned16(a.ptr[0]) || !(one || p->stride[0][0] == 1)) return false;
  if (a.mode[0] != IN_PTR || a.dtype[1] != EM_BOOL) return false;
  for (int j = 0; j < 3; j++) {
    if (a.mode[j] != IN_PTR) continue;
    if (j > 0 && a.dtype[j + 1] != a.dtype[0]) return false;
    if (!aligned16(a.ptr[j + 1]) || !(one || p->stride[j + 1][0] == 1)) return false;
  }
  return true;
}

/* EMBER_SELECT16 (read once): "raw" (default: ew_select16w on the 16-bit
 * words), "f32" (ew_select16w selecting on f32 values), "old" (ew_select16). */
int select16_mode() {
  static int mode = -1;
  if (mode < 0) {
    const char *env = getenv("EMBER_SELECT16");
    mode = env && strcmp(env, "old") == 0 ? 0 : env && strcmp(env, "f32") == 0 ? 1 : 2;
  }
  return mode;
}

int launch_select16(const EwArgs &a, cudaStream_t s) {
  const bool at = a.mode[1] == IN_PTR, bt = a.mode[2] == IN_PTR;
  const int mode = select16_mode();
  if (mode > 0) {
    const int64_t units = (a.numel / 8 + 3) / 4;   /* U = 4 vectors of 8 a thread */
    const unsigned g = grid_for(units > 0 ? units : 1);
#define EM_SELW(T, R)                                                          \
  do {                                                                         \
    if (at && bt) ew_select16w<T, true, true, R><<<g, kThreads, 0, s>>>(a);    \
    else if (at) ew_select16w<T, true, false, R><<<g, kThreads, 0, s>>>(a);    \
    else if (bt) ew_select16w<T, false, true, R><<<g, kThreads, 0, s>>>(a);    \
    else ew_select16w<T, false, false, R><<<g, kThreads, 0, s>>>(a);           \
  } while (0)
    if (a.dtype[0] == EM_BF16) {
      if (mode == 2) EM_SELW(__nv_bfloat16, true);
      else EM_SELW(__nv_bfloat16, false);
    } else {
      if (mode == 2) EM_SELW(__half, true);
      else EM_SELW(__half, false);
    }
#undef EM_SELW
    return 0;
  }
  const int64_t units = (a.numel / 16 + 1) / 2;   /* U = 2 vectors a thread */
  const unsigned g = grid_for(units > 0 ? units : 1);
#define EM_SEL(T)                                                         \
  do {                                                                    \
    if (at && bt) ew_select16<T, true, true><<<g, kThreads, 0, s>>>(a);   \
    else if (at) ew_select16<T, true, false><<<g, kThreads, 0, s>>>(a);   \
    else if (bt) ew_select16<T, false, true><<<g, kThreads, 0, s>>>(a);   \
    else ew_select16<T, false, false><<<g, kThreads, 0, s>>>(a);          \
  } while (0)
  if (a.dtype[0] == EM_BF16) EM_SEL(__nv_bfloat16);
  else EM_SEL(__half);
#undef EM_SEL
  return 0;
}

/* ew_outer2d's launch (issue 12), or false when the plan is not its: 2 tensor
 * inputs, one a per-row value and the other a row broadcast down the rows;
 * at least 128 column vectors (half a block) and rows / rb within the grid's
 * y limit. rb = 16 rows a thread where that still leaves >= 2048 blocks
 * (about two waves of 8 blocks on 132 SMs), else 4. */
bool launch_outer2d(const EwArgs &a, const em_ew_plan *p, int64_t rows, int64_t cv, cudaStream_t s) {
  static const bool on = em_env_switch("EMBER_EW_OUTER2D", true);
  if (!on || a.mode[0] != IN_PTR || a.mode[1] != IN_PTR || cv < 128) return false;
  int pj;
  if (p->stride[1][1] == 0 && p->stride[2][1] == 1 && p->stride[2][0] == 0) pj = 0;
  else if (p->stride[2][1] == 0 && p->stride[1][1] == 1 && p->stride[1][0] == 0) pj = 1;
  else return false;
  const unsigned gx = (unsigned)((cv + kThreads - 1) / kThreads);
  const int rb = gx * ((rows + 15) / 16) >= 2048 ? 16 : 4;
  const int64_t gy = (rows + rb - 1) / rb;
  if (gy > 65535) return false;
  const dim3 g(gx, (unsigned)gy);
#define EM_O2(T)                                                            \
  do {                                                                      \
    if (pj) ew_outer2d<T, 1><<<g, kThreads, 0, s>>>(a, (int)cv, rb);        \
    else ew_outer2d<T, 0><<<g, kThreads, 0, s>>>(a, (int)cv, rb);           \
  } while (0)
  if (a.dtype[0] == EM_BF16) EM_O2(__nv_bfloat16);
  else if (a.dtype[0] == EM_F16) EM_O2(__half);
  else EM_O2(float);
#undef EM_O2
  return true;
}

/* ew_rows2d's launch, or false when the plan is not its (2-D, bf16/f16, every
 * tensor unit-stride along cols or a per-row value; f32 with a per-row value) or its grid would idle
 * more than half its threads. rows_eligible already holds. */
bool launch_rows2d(const EwArgs &a, const em_ew_plan *p, bool idx32, cudaStream_t s) {
  const bool f32 = a.dtype[0] == EM_F32;
  if (p->ndim != 2 || !idx32 || !(half16(a.dtype[0]) || f32)) return false;
  bool rowv = false;   /* a per-row value (rows_eligible allows stride 0 along cols) */
  for (int j = 0; j < a.nin; j++)
    if (a.mode[j] == IN_PTR && p->stride[j + 1][1] != 1) {
      if (p->stride[j + 1][1] != 0) return false;
      rowv = true;
    }
  if (f32 && !rowv) return false;   /* f32: per-row values only (outer: 59 % on ew_rows; x + bias is at 80 % there) */
  const int64_t rows = p->shape[0], cv = p->shape[1] / (f32 ? 4 : 8);   /* elements a 16-byte vector */
  if (rows < 1 || cv < 1) return false;
  if (rowv && a.nin == 2 && launch_outer2d(a, p, rows, cv, s)) return true;
  /* threads: a multiple of lcm(cv, kThreads) covering cv x ceil(rows / 2) */
  int64_t gcd = cv, b = kThreads;
  while (b) { const int64_t t = gcd % b; gcd = b; b = t; }
  const int64_t lcm = cv / gcd * kThreads, want = cv * ((rows + 1) / 2);
  int64_t threads = (want + lcm - 1) / lcm * lcm;
  if (threads > 2 * want) return false;
  const int64_t cap = 65535LL * 32 * kThreads / lcm * lcm;   /* em_grid's block cap, whole lcms */
  if (threads > cap) threads = cap;
  if (threads < lcm) return false;
  const unsigned g = (unsigned)(threads / kThreads);
  const int rstep = (int)(threads / cv);
#define EM_R2(T)                                                                             \
  do {                                                                                       \
    if (rowv && a.nin == 2) ew_rows2d<T, 2, true><<<g, kThreads, 0, s>>>(a, (int)cv, rstep); \
    else if (rowv) ew_rows2d<T, 3, true><<<g, kThreads, 0, s>>>(a, (int)cv, rstep);          \
    else if (a.nin == 1) ew_rows2d<T, 1, false><<<g, kThreads, 0, s>>>(a, (int)cv, rstep);   \
    else if (a.nin == 2) ew_rows2d<T, 2, false><<<g, kThreads, 0, s>>>(a, (int)cv, rstep);   \
    else ew_rows2d<T, 3, false><<<g, kThreads, 0, s>>>(a, (int)cv, rstep);                   \
  } while (0)
  if (a.dtype[0] == EM_BF16) EM_R2(__nv_bfloat16);
  else if (a.dtype[0] == EM_F16) EM_R2(__half);
  else if (rowv && a.nin == 2) ew_rows2d<float, 2, true><<<g, kThreads, 0, s>>>(a, (int)cv, rstep);
  else ew_rows2d<float, 3, true><<<g, kThreads, 0, s>>>(a, (int)cv, rstep);
#undef EM_R2
  return true;
}

}  // namespace

extern "C" int em_elementwise_cuda(const char *op, const em_ew_kern *k, em_tensor *out, int nin,
                                   const em_ew_operand *in, const em_ew_plan *p, int64_t numel) {
  if (numel <= 0) return 0;
  if (nin < 1 || nin > 3 || p->ndim < 1 || p->ndim > EM_MAX_DIMS)
    return em_error("%s: internal error: elementwise launch with %d inputs over %d dims", op, nin, p->ndim);
  int dev = out->device.index;
  if (em_use_device(dev, op)) return -1;
  EwArgs a;
  memset(&a, 0, sizeof a);
  a.kind = k->kind; a.code = k->code; a.nin = nin; a.ndim = p->ndim;
  a.lo = k->lo; a.hi = k->hi;
  a.ilo = k->lo <= -9.2e18 ? INT64_MIN : em_sat_i64(ceil(k->lo));
  a.ihi = k->hi >= 9.2e18 ? INT64_MAX : em_sat_i64(floor(k->hi));
  a.numel = numel;
  for (int d = 0; d < p->ndim; d++) {
    a.shape[d] = p->shape[d];
    for (int q = 0; q <= nin; q++) a.stride[q][d] = p->stride[q][d];
  }
  a.ptr[0] = em_data_ptr(out); a.dtype[0] = out->dtype;
  for (int j = 0; j < 3; j++) {
    a.mode[j] = IN_CONST;
    if (j >= nin) continue;
    if (in[j].t) {
      if (!em_device_eq(in[j].t->device, out->device))
        return em_error("%s: internal error: operand on another device", op);
      a.mode[j] = IN_PTR; a.ptr[j + 1] = em_data_ptr(in[j].t); a.dtype[j + 1] = in[j].t->dtype;
    } else {
      a.cval[j] = in[j].c;
    }
  }
  cudaStream_t s = em_cur_stream(dev);

  /* fast path: one float storage type, unit stride (a stride-0 input is a broadcast scalar) */
  em_dtype T = out->dtype;
  bool fast = em_dtype_is_float(T) && class_of(T) == k->cls && p->ndim == 1;
  bool one = p->shape[0] == 1;
  if (fast && !one && p->stride[0][0] != 1) fast = false;
  bool vec = aligned16(a.ptr[0]);
  for (int j = 0; fast && j < nin; j++) {
    if (a.mode[j] != IN_PTR) continue;
    int64_t st = p->stride[j + 1][0];
    if (st == 0 && !one) a.mode[j] = IN_SCALAR;
    else if ((st == 1 || one) && a.dtype[j + 1] == (int)T) vec = vec && aligned16(a.ptr[j + 1]);
    else fast = false;
  }
  if (fast && vec && (half16(T) || T == EM_F32) && numel <= ((int64_t)1 << 30) && !fixed_old()) {
    bool fixed = true;   /* no broadcast scalar (IN_SCALAR) operands */
    for (int j = 0; j < nin; j++) fixed = fixed && a.mode[j] != IN_SCALAR;
    int rc = 0;
    if (fixed && (T == EM_BF16 ? launch_fixed<__nv_bfloat16>(op, a, s, dev, rc)
                  : T == EM_F16 ? launch_fixed<__half>(op, a, s, dev, rc) : launch_fixed<float>(op, a, s, dev, rc)))
      return rc ? -1 : em_launch_check(op);
  }
  if (fast) {
    int rc;
    switch (T) {
      case EM_F32: rc = launch_contig<float>(op, dev, a, vec, s); break;
      case EM_BF16: rc = launch_contig<__nv_bfloat16>(op, dev, a, vec, s); break;
      case EM_F16: rc = launch_contig<__half>(op, dev, a, vec, s); break;
      default: rc = launch_contig<double>(op, dev, a, vec, s); break;
    }
    return rc ? -1 : em_launch_check(op);
  }
  for (int j = 0; j < 3; j++) if (a.mode[j] == IN_SCALAR) a.mode[j] = IN_PTR;   /* (fast == false) */

  const int generic = ew_generic_only(op);
  if (generic < 0) return -1;

  /* where / masked_fill in bf16/f16, contiguous: all loads of a step in flight */
  if (!generic && select16_eligible(a, k, p)) {
    launch_select16(a, s);
    return em_launch_check(op);
  }

  /* mixed f32/bf16/f16 storage, every operand unit-stride and 16-byte aligned */
  bool mixed = k->cls == EM_EW_F32 && p->ndim == 1 && half_or_f32(a.dtype[0]) && p->stride[0][0] == 1 &&
               aligned16(a.ptr[0]);
  for (int j = 0; mixed && j < nin; j++)
    if (a.mode[j] == IN_PTR)
      mixed = (half_or_f32(a.dtype[j + 1]) || a.dtype[j + 1] == EM_BOOL || a.dtype[j + 1] == EM_U8) &&
              p->stride[j + 1][0] == 1 && aligned16(a.ptr[j + 1]);
  if (mixed) {
    const bool i32 = numel <= ((int64_t)1 << 30), half = a.dtype[0] != EM_F32;
    const int64_t units = numel / 8 > 0 ? numel / 8 : 1;
    if (!i32) ew_mixed<int64_t, 1><<<grid_for(units), kThreads, 0, s>>>(a);
    else if (half) ew_mixed<int32_t, 2><<<grid_for((units + 1) / 2), kThreads, 0, s>>>(a);
    else ew_mixed<int32_t, 1><<<grid_for(units), kThreads, 0, s>>>(a);
    return em_launch_check(op);
  }

  /* 32-bit index arithmetic when every offset fits */
  bool idx32 = numel <= (int64_t)INT32_MAX / 2;
  for (int q = 0; q <= nin && idx32; q++) {
    int64_t span = 0;
    for (int d = 0; d < p->ndim; d++) span += (p->shape[d] - 1) * (p->stride[q][d] < 0 ? -p->stride[q][d] : p->stride[q][d]);
    idx32 = span <= (int64_t)INT32_MAX / 2;
  }

  /* rows path: one float storage type, broadcast only across rows */
  if (em_dtype_is_float(T) && class_of(T) == k->cls && rows_eligible(a, p)) {
    if (!generic && launch_rows2d(a, p, idx32, s)) return em_launch_check(op);
    switch (T) {
      case EM_F32: launch_rows<float>(a, idx32, s); break;
      case EM_BF16: launch_rows<__nv_bfloat16>(a, idx32, s); break;
      case EM_F16: launch_rows<__half>(a, idx32, s); break;
      default: launch_rows<double>(a, idx32, s); break;
    }
    return em_launch_check(op);
  }

  /* general path */
  switch (k->cls) {
    case EM_EW_F32: launch_strided<float>(a, idx32, s); break;
    case EM_EW_F64: launch_strided<double>(a, idx32, s); break;
    default: launch_strided<int64_t>(a, idx32, s); break;
  }
  return em_launch_check(op);
}

extern "C" int em_triangle_cuda(const char *op, em_tensor *res, const em_tensor *a, int64_t k, bool upper) {
  int64_t n = em_numel(res);
  if (n == 0) return 0;
  if (a->ndim < 2 || res->ndim != a->ndim || !em_is_contiguous(res) || res->dtype != a->dtype)
    return em_error("%s: internal error: triangle of mismatched tensors", op);
  if (em_use_device(res->device.index, op)) return -1;
  TriArgs t;
  memset(&t, 0, sizeof t);
  t.ndim = a->ndim; t.numel = n; t.k = k; t.upper = upper;
  for (int d = 0; d < a->ndim; d++) { t.shape[d] = a->shape[d]; t.in_stride[d] = a->stride[d]; }
  cudaStream_t s = em_cur_stream(res->device.index);
  void *o = em_data_ptr(res);
  const void *i = em_data_ptr(a);
  switch (em_dtype_size(a->dtype)) {
    case 1: triangle_kernel<uint8_t><<<grid_for(n), kThreads, 0, s>>>((uint8_t *)o, (const uint8_t *)i, t); break;
    case 2: triangle_kernel<uint16_t><<<grid_for(n), kThreads, 0, s>>>((uint16_t *)o, (const uint16_t *)i, t); break;
    case 4: triangle_kernel<uint32_t><<<grid_for(n), kThreads, 0, s>>>((uint32_t *)o, (const uint32_t *)i, t); break;
    default: triangle_kernel<uint64_t><<<grid_for(n), kThreads, 0, s>>>((uint64_t *)o, (const uint64_t *)i, t); break;
  }
  return em_launch_check(op);
}
