/* Dropout on the device: y = x * m_j / (1 - p), m_j = u(w_j) < 1 - p, the
 * mask drawn from the Philox stream exactly as engine/ops/dropout.c draws it
 * on the CPU (element j: word j % 4 of block ctr0 + j / 4), so one seed gives
 * one mask on both devices. Backward is this kernel on the gradient with the
 * forward's stream: the mask is regenerated, never stored.
 *
 * Cost per element: sizeof(T) read + sizeof(T) written, 1/4 of a Philox
 * block (10 rounds of two 32x32->64 multiplies), one compare and multiply:
 * memory bound on an H100 for bf16/f32 (2^24 f32 elements move 128 MiB,
 * ~40 us at 3 TB/s).
 *
 * Launch: 256 threads, grid-stride; each thread takes B Philox blocks (4B
 * consecutive elements: B = 4 for bf16/f16, whose Philox work per byte is
 * twice f32's, so a thread's fixed index/loop work is spread over 16
 * elements; 2 for f32; 1 for f64), loaded and stored as 16-byte vectors
 * when x and y are 16-byte aligned, the loads issued before the Philox
 * rounds (EMBER_DROPOUT_OLD=1: B = 2 for bf16/f16, as before). The B blocks
 * come from em_philox_run (rng_math.h: the first rounds' products shared).
 * The mask compares integers (em_rng_keep_limit): no conversion to double per element. The one trick: the key and first counter
 * are resolved on the device (em_philox_resolve), so inside a CUDA graph
 * the kernel reads the graph's cell and each replay draws a fresh mask. */
#include <type_traits>
#include "rng_math.h"
#include "common.cuh"
#include "backend.h"

namespace {

template <typename T> using acc_t = typename std::conditional<std::is_same<T, double>::value, double, float>::type;

/* E elements in 16-byte vectors at most (sm_90 has no wider load): 16-byte alignment suffices for any E. */
template <typename T, int E> struct alignas(E * sizeof(T) < 16 ? E * sizeof(T) : 16) VecE { T v[E]; };

template <typename T, typename C> __device__ __forceinline__ C ld(T x) { return (C)to_f32(x); }
template <> __device__ __forceinline__ double ld<double, double>(double x) { return x; }
template <typename T, typename C> __device__ __forceinline__ T st(C x) { return from_f32<T>((float)x); }
template <> __device__ __forceinline__ double st<double, double>(double x) { return x; }
/* two 16-bit results in one conversion, a in the low half (the first element) */
template <typename T> __device__ __forceinline__ uint32_t pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t *>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t *>(&h);
}

/* the two 16-bit inputs of a 32-bit word as floats, the first (low half) in a: bf16 by a byte permute and
 * a mask (the ALU pipe; the shift nvcc picks is an IMAD on the pipe Philox's multiplies saturate) */
template <typename T> __device__ __forceinline__ void unpack2(uint32_t w, float &a, float &b);
template <> __device__ __forceinline__ void unpack2<__nv_bfloat16>(uint32_t w, float &a, float &b) {
  a = __uint_as_float(__byte_perm(w, 0u, 0x1044));
  b = __uint_as_float(w & 0xffff0000u);
}
template <> __device__ __forceinline__ void unpack2<__half>(uint32_t w, float &a, float &b) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&w));
  a = f.x;
  b = f.y;
}

/* Thread t handles B consecutive Philox blocks: elements [4B t, 4B (t + 1)),
 * E = 4B elements in 16-byte vectors (B = 2: two for f32, one for bf16/f16;
 * f64 B = 1, two 16-byte halves). Element j is kept when w_j <= lim, the
 * CPU's u(w_j) < q in double without converting anything (em_rng_keep_limit;
 * p = 1 keeps every word, with scale 0). bf16/f16 round two products at a
 * time (cvt.rn.{bf16x2,f16x2}.f32: the same bits as from_f32's one at a time). */
template <typename T, int B>
__global__ void __launch_bounds__(256) dropout_kernel(const T *__restrict__ x, T *__restrict__ y, int64_t n, uint32_t lim,
                                                      acc_t<T> scale, em_philox_state s, bool vec, bool shared) {
  using C = acc_t<T>;
  constexpr int E = 4 * B;
  uint64_t seed, ctr0;
  em_philox_resolve(s, &seed, &ctr0);
  const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  const int64_t nunits = (n + E - 1) / E;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < nunits; t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j0 = t * E;
    const bool full = vec && j0 + E <= n;
    VecE<T, E> in;
    if (full) in = *reinterpret_cast<const VecE<T, E> *>(x + j0);   /* issued before the Philox rounds: in flight meanwhile */
    C keep[E];
    em_philox_block pb[B];
    em_philox_run(ctr0 + (uint64_t)(t * B), B, shared, k0, k1, pb);   /* blocks B t .. B t + B - 1 */
#pragma unroll
    for (int k = 0; k < B; k++) {
#pragma unroll
      for (int w = 0; w < 4; w++) keep[4 * k + w] = pb[k].v[w] <= lim ? scale : (C)0;
    }
    if (full) {
      if constexpr (sizeof(T) == 2) {
        union { VecE<T, E> v; uint32_t w[E / 2]; } out, iw;
        iw.v = in;
#pragma unroll
        for (int k = 0; k < E; k += 2) {
          float a, b;
          unpack2<T>(iw.w[k / 2], a, b);
          out.w[k / 2] = pack2<T>(a * keep[k], b * keep[k + 1]);
        }
        *reinterpret_cast<VecE<T, E> *>(y + j0) = out.v;
      } else {
        VecE<T, E> out;
#pragma unroll
        for (int k = 0; k < E; k++) out.v[k] = st<T, C>(ld<T, C>(in.v[k]) * keep[k]);
        *reinterpret_cast<VecE<T, E> *>(y + j0) = out;
      }
    } else {
#pragma unroll
      for (int k = 0; k < E; k++)          /* unrolled: keep[] stays in registers */
        if (j0 + k < n) y[j0 + k] = st<T, C>(ld<T, C>(x[j0 + k]) * keep[k]);
    }
  }
}

/* B Philox blocks a thread (4B elements), loaded and stored as 16-byte vectors where x and y are 16-byte
 * aligned (a vector of fewer bytes: aligned to its size). */
template <typename T, int B>
void dropout_launch(const T *xp, T *yp, int64_t n, uint32_t lim, acc_t<T> scale, em_philox_state s, cudaStream_t st) {
  constexpr uintptr_t A = 4 * B * sizeof(T) < 16 ? 4 * B * sizeof(T) : 16;
  const bool vec = (uintptr_t)xp % A == 0 && (uintptr_t)yp % A == 0;
  dropout_kernel<T, B><<<em_grid((n + 4 * B - 1) / (4 * B), 256), 256, 0, st>>>(xp, yp, n, lim, scale, s, vec,
                                                                               em_philox_run_shared());
}

/* EMBER_DROPOUT_OLD=1: two Philox blocks a thread (8 elements) for bf16/f16, as before; the same masks. */
bool dropout_old() {
  static const bool on = em_env_switch("EMBER_DROPOUT_OLD", false);
  return on;
}

}  // namespace

extern "C" int em_dropout_cuda(const em_tensor *x, em_tensor *y, double p, em_philox_state s) {
  int64_t n = em_numel(x);
  if (n == 0) return 0;
  cudaStream_t stream = em_cur_stream(x->device.index);
  double q = 1.0 - p, scale = p < 1 ? 1.0 / (1.0 - p) : 0.0;
  const uint32_t thr = em_rng_keep_threshold(q), lim = em_rng_keep_limit(thr);
  if (thr == 0) scale = 0;   /* p = 1: every word passes the limit; a kept element must then be a dropped one */
  const bool old = dropout_old();
  EM_DISPATCH_FLOAT(x->dtype, T, {
    const T *xp = (const T *)em_data_ptr(x);
    T *yp = (T *)em_data_ptr(y);
    if constexpr (sizeof(T) == 2) {
      if (!old) dropout_launch<T, 4>(xp, yp, n, lim, (acc_t<T>)scale, s, stream);
      else dropout_launch<T, 2>(xp, yp, n, lim, (acc_t<T>)scale, s, stream);
    } else {
      dropout_launch<T, sizeof(T) == 8 ? 1 : 2>(xp, yp, n, lim, (acc_t<T>)scale, s, stream);
    }
  });
  return em_launch_check("dropout");
}
