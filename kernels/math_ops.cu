/* isnan and isfinite (engine/ops/math_ops.c): out (bool) = the class test of
 * each element of a contiguous float tensor. (lerp, addcmul and addcdiv are
 * a ternary kind of kernels/elementwise.cu; prod and the norms are
 * accumulators of kernels/reduce.cu.)
 *
 * Cost: 0 FLOPs; read es + write 1 byte per element (5 B for f32). Memory-
 * bound: the ceiling is the copy bandwidth.
 *
 * Launch shape: 256 threads, grid-stride; a thread reads G 16-byte
 * Packed128s of input (4 f32, 8 bf16/f16, 2 f64 each; G = 4, 2, 4) and
 * writes their 16 (f64 8) bools as one store, so loads and stores are both
 * wide and G loads are in flight a thread. The leftover vectors, the scalar tail and
 * unaligned tensors take the one-element path. The test is done on the bits
 * (exponent all ones), identical for every float type, without converting;
 * bf16/f16 test two elements a 32-bit word (classify4: ~2.3 instructions an
 * element in the loop's SASS, against ~11.5 element by element). */
#include <stdlib.h>
#include "common.cuh"
#include "dtype_io.cuh"
#include "backend.h"

namespace {

constexpr int kThreads = 256;

/* Exponent bits all set: inf or NaN; mantissa nonzero on top: NaN. */
template <typename T> struct Bits;
template <> struct Bits<float> { typedef uint32_t U; static constexpr U exp = 0x7f800000u, man = 0x007fffffu; };
template <> struct Bits<double> {
  typedef uint64_t U;
  static constexpr U exp = 0x7ff0000000000000ull, man = 0x000fffffffffffffull;
};
template <> struct Bits<__nv_bfloat16> { typedef uint16_t U; static constexpr U exp = 0x7f80, man = 0x007f; };
template <> struct Bits<__half> { typedef uint16_t U; static constexpr U exp = 0x7c00, man = 0x03ff; };

template <typename T>
__device__ __forceinline__ uint8_t classify(typename Bits<T>::U u, bool nan) {
  const bool special = (u & Bits<T>::exp) == Bits<T>::exp;
  return nan ? (uint8_t)(special && (u & Bits<T>::man) != 0) : (uint8_t)!special;
}

template <int V> struct alignas(V) Bools { uint8_t v[V]; };

/* classify on two words of 16-bit floats (4 elements, each word's low half
 * first) into their 4 bools as one word: |h| = h & 0x7fff plus A reaches bit
 * 15 exactly when |h| > exp (NaN: A = 0x7fff - exp) or |h| >= exp (inf or
 * NaN: A = 0x8000 - exp), and |h| + A <= 0x83ff never carries into the next
 * half. The PRMT gathers each half's high byte (bit 7: the flag); flip is
 * 0 for isnan, ~0 for isfinite. ~7 instructions for 4 elements, against ~6
 * an element for classify's unpack, masks, compares and byte packing
 * (issue 12: isnan bf16 ran at 80 %, isfinite at 85 %, on the same bytes). */
template <typename T>
__device__ __forceinline__ uint32_t classify4(uint32_t w0, uint32_t w1, uint32_t add2, uint32_t flip) {
  const uint32_t t0 = (w0 & 0x7fff7fffu) + add2, t1 = (w1 & 0x7fff7fffu) + add2;
  return ((__byte_perm(t0, t1, 0x7531) ^ flip) & 0x80808080u) >> 7;
}

/* VEC: a thread takes G = 16 / V 16-byte vectors of input at a time (4 f32, 2 bf16/f16; 4 f64: 8 bytes of
 * bools), all G loads issued before any test, and writes their G V bools as one store (16 bytes, f64 8);
 * the vectors left over (fewer than G a thread) and the last n % V elements follow one at a time. */
template <typename T, bool VEC, int G, bool SW = false>
__global__ void __launch_bounds__(kThreads) float_class(uint8_t *out, const T *in, int64_t n, bool nan) {
  typedef typename Bits<T>::U U;
  constexpr int V = VEC ? 16 / (int)sizeof(T) : 1;
  static_assert(!SW || (VEC && sizeof(T) == 2 && G * V == 16), "SW: 16-bit vectors, 16 bools a store");
  const uint32_t add2 = SW ? (nan ? 0x7fffu - (uint32_t)Bits<T>::exp : 0x8000u - (uint32_t)Bits<T>::exp) * 0x00010001u : 0u;
  const uint32_t flip = nan ? 0u : ~0u;
  const U *u = reinterpret_cast<const U *>(in);
  const int64_t units = n / V, step = (int64_t)gridDim.x * blockDim.x;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t groups = units / G;
  for (int64_t k = tid; k < groups; k += step) {
    if constexpr (SW) {   /* the whole step on words: 4 bools a classify4 */
      uint4 w[G];
#pragma unroll
      for (int q = 0; q < G; q++) w[q] = *reinterpret_cast<const uint4 *>(u + (k * G + q) * V);
      uint4 o;
      o.x = classify4<T>(w[0].x, w[0].y, add2, flip);
      o.y = classify4<T>(w[0].z, w[0].w, add2, flip);
      o.z = classify4<T>(w[1].x, w[1].y, add2, flip);
      o.w = classify4<T>(w[1].z, w[1].w, add2, flip);
      *reinterpret_cast<uint4 *>(out + k * G * V) = o;
    } else {
      Bools<G * V> b;
      if constexpr (VEC) {
        Packed128<U> p[G];
#pragma unroll
        for (int q = 0; q < G; q++) p[q] = load128(u + (k * G + q) * V);
#pragma unroll
        for (int q = 0; q < G; q++)
#pragma unroll
          for (int e = 0; e < V; e++) b.v[q * V + e] = classify<T>(p[q][e], nan);
      } else {
        b.v[0] = classify<T>(u[k], nan);
      }
      *reinterpret_cast<Bools<G * V> *>(out + k * G * V) = b;
    }
  }
  if constexpr (VEC && G > 1) {
    const int64_t k = groups * G + tid;   /* the last units % G vectors */
    if (k < units) {
      Packed128<U> p = load128(u + k * V);
      Bools<V> b;
#pragma unroll
      for (int e = 0; e < V; e++) b.v[e] = classify<T>(p[e], nan);
      *reinterpret_cast<Bools<V> *>(out + k * V) = b;
    }
  }
  const int64_t i = units * V + tid;   /* the last n % V elements */
  if (VEC && i < n) out[i] = classify<T>(u[i], nan);
}

/* bf16/f16 with each warp instruction on one contiguous run (opt-in,
 * EMBER_FLOAT_CLASS_LANES=1): a lane takes one 16-byte vector a step and
 * stores its 8 bools as one 8-byte store, 2 steps in flight (v and v + grid),
 * as ew_contig's bf16 add (90 % on the H200); float_class<.., SW> instead
 * gives a lane 2 neighbouring vectors, so each of its load instructions
 * covers half of every sector of a 1 KiB run. Same classify4, same bools. */
template <typename T>
__global__ void __launch_bounds__(kThreads) float_class_lanes(uint8_t *out, const T *in, int64_t n, bool nan) {
  constexpr int U = 2;
  const uint32_t add2 = (nan ? 0x7fffu - (uint32_t)Bits<T>::exp : 0x8000u - (uint32_t)Bits<T>::exp) * 0x00010001u;
  const uint32_t flip = nan ? 0u : ~0u;
  const uint4 *src = reinterpret_cast<const uint4 *>(in);
  uint2 *dst = reinterpret_cast<uint2 *>(out);
  const int64_t nv = n / 8, step = (int64_t)gridDim.x * blockDim.x;
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (int64_t v0 = tid; v0 < nv; v0 += U * step) {
    uint4 w[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (u == 0 || v0 + u * step < nv) w[u] = src[v0 + u * step];
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (u > 0 && v0 + u * step >= nv) break;
      dst[v0 + u * step] = make_uint2(classify4<T>(w[u].x, w[u].y, add2, flip), classify4<T>(w[u].z, w[u].w, add2, flip));
    }
  }
  const int64_t i = nv * 8 + tid;   /* the last n % 8 elements */
  if (i < n) out[i] = classify<T>(reinterpret_cast<const typename Bits<T>::U *>(in)[i], nan);
}

bool lanes16() {
  static const bool on = em_env_switch("EMBER_FLOAT_CLASS_LANES", false);
  return on;
}

/* EMBER_FLOAT_CLASS_OLD=1: one vector a thread (G = 1), as before. */
bool one_vector() {
  static const bool on = em_env_switch("EMBER_FLOAT_CLASS_OLD", false);
  return on;
}

/* EMBER_FLOAT_CLASS_WORDS=0: bf16/f16 classify element by element (classify)
 * instead of two elements a word (classify4); read once. */
bool words16() {
  static const bool on = em_env_switch("EMBER_FLOAT_CLASS_WORDS", true);
  return on;
}

template <typename T>
void launch(uint8_t *out, const void *in, int64_t n, bool nan, cudaStream_t s) {
  constexpr int V = 16 / (int)sizeof(T), G = 16 / V < 4 ? 16 / V : 4;
  const bool vec = ((uintptr_t)in & 15) == 0 && ((uintptr_t)out % V) == 0;
  const T *x = (const T *)in;
  const unsigned gg = em_grid(n / (G * V) > 0 ? n / (G * V) : 1, kThreads);
  if (vec && !one_vector() && (uintptr_t)out % (G * V) == 0) {
    if constexpr (sizeof(T) == 2) {
      const int64_t nl = (n / 8 + 1) / 2;   /* float_class_lanes: 2 vectors a thread */
      if (lanes16() && words16())
        float_class_lanes<T><<<em_grid(nl > 0 ? nl : 1, kThreads), kThreads, 0, s>>>(out, x, n, nan);
      else if (words16()) float_class<T, true, G, true><<<gg, kThreads, 0, s>>>(out, x, n, nan);
      else float_class<T, true, G><<<gg, kThreads, 0, s>>>(out, x, n, nan);
    } else {
      float_class<T, true, G><<<gg, kThreads, 0, s>>>(out, x, n, nan);
    }
  }
  else if (vec) float_class<T, true, 1><<<em_grid(n / V > 0 ? n / V : 1, kThreads), kThreads, 0, s>>>(out, x, n, nan);
  else float_class<T, false, 1><<<em_grid(n, kThreads), kThreads, 0, s>>>(out, x, n, nan);
}

}  // namespace

extern "C" int em_float_class_cuda(const char *op, em_tensor *out, const em_tensor *x, bool nan) {
  const int64_t n = em_numel(out);
  if (n == 0) return 0;
  if (!em_is_contiguous(out) || !em_is_contiguous(x) || out->dtype != EM_BOOL || em_numel(x) != n)
    return em_error("%s: internal error: class test of mismatched tensors", op);
  const int dev = out->device.index;
  if (em_use_device(dev, op)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  uint8_t *o = (uint8_t *)em_data_ptr(out);
  const void *i = em_data_ptr(x);
  switch (x->dtype) {
    case EM_F32: launch<float>(o, i, n, nan, s); break;
    case EM_F64: launch<double>(o, i, n, nan, s); break;
    case EM_BF16: launch<__nv_bfloat16>(o, i, n, nan, s); break;
    case EM_F16: launch<__half>(o, i, n, nan, s); break;
    default: return em_error("%s: internal error: a class test of a %s tensor", op, em_dtype_name(x->dtype));
  }
  return em_launch_check(op);
}
