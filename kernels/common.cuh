/* Helpers shared by Ember's CUDA kernels: launch checks, the current stream,
 * packed 128-bit loads/stores (vectorisation visible in the code, as in
 * llm.c), warp/block reductions and dtype conversions that round to nearest
 * even exactly like the CPU reference (engine/dtype.c). */
#ifndef EMBER_KERNELS_COMMON_CUH
#define EMBER_KERNELS_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "ember/cuda.h"

/* The stream every op launches on. */
static inline cudaStream_t em_cur_stream(int device) {
  return (cudaStream_t)em_stream_handle(em_stream_current(device));
}

/* After a launch: turn a launch error into an engine error naming the op.
 * With EMBER_CUDA_DEBUG, also synchronise to surface asynchronous faults. */
static inline int em_launch_check(const char *op) {
  cudaError_t e = cudaGetLastError();
#ifdef EMBER_CUDA_DEBUG
  if (e == cudaSuccess && !em_cuda_capturing()) e = cudaDeviceSynchronize();
#endif
  if (e != cudaSuccess) return em_error("%s: CUDA kernel failed: %s", op, cudaGetErrorString(e));
  return 0;
}

static inline int em_cuda_check(cudaError_t e, const char *op, const char *what) {
  if (e == cudaSuccess) return 0;
  return em_error("%s: %s failed: %s", op, what, cudaGetErrorString(e));
}

/* An A/B switch between a kernel and the one it replaced (EMBER_*_OLD=1, EMBER_*_VEC=0 ...): unset or empty
 * gives dflt, a value starting with '0' false, anything else true. Call sites read it once (a static). */
static inline bool em_env_switch(const char *name, bool dflt) {
  const char *e = getenv(name);
  if (!e || !*e) return dflt;
  return e[0] != '0';
}

/* A two-way switch between a kernel (`now`) and the one it replaced (`old`), read once into *mode (a static,
 * -1 unread): 0 when `name` is unset, empty or `now`, 1 when `old`; any other value is an error naming both.
 * Returns the mode, or -1 with the error set. */
static inline int em_env_choice(int *mode, const char *op, const char *name, const char *now, const char *old) {
  if (*mode < 0) {
    const char *env = getenv(name);
    if (!env || !*env || strcmp(env, now) == 0) *mode = 0;
    else if (strcmp(env, old) == 0) *mode = 1;
    else return em_error("%s: expected %s to be %s or %s, got '%s'", op, name, now, old, env);
  }
  return *mode;
}

/* f(T{}) with T the unsigned integer of es bytes (1, 2, 4, else 8): one instantiation per width for the kernels
 * that move a dtype's bits as they are (compaction, gathers). */
template <typename F> static inline void em_by_width(size_t es, F &&f) {
  switch (es) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    default: f((unsigned long long)0); break;
  }
}

static inline unsigned em_grid(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b > 65535LL * 32 ? 65535LL * 32 : (b < 1 ? 1 : b));
}

/* The bits of a quiet NaN in dtype dt (0 for integer dtypes): what a gather
 * writes for an out-of-range index, so a bad id cannot pass silently. */
static inline uint64_t em_nan_bits(em_dtype dt) {
  switch (dt) {
    case EM_F32: return 0x7fc00000u;
    case EM_F64: return 0x7ff8000000000000ull;
    case EM_BF16: return 0x7fc0u;
    case EM_F16: return 0x7e00u;
    default: return 0;
  }
}

/* Multiprocessors of a device (cached). */
static inline int em_sm_count(int device) {
  static int cache[64];
  if (device < 0 || device >= 64) return 132;
  if (!cache[device]) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) {
      cudaGetLastError();
      n = 132;
    }
    cache[device] = n;
  }
  return cache[device];
}

/* 16 bytes of T, loaded/stored in one instruction (the pointer must be 16-byte aligned). */
template <typename T>
struct alignas(16) Packed128 {
  static constexpr int size = 16 / sizeof(T);
  T v[size];
  __device__ T &operator[](int i) { return v[i]; }
  __device__ const T &operator[](int i) const { return v[i]; }
};
template <typename T>
__device__ __forceinline__ Packed128<T> load128(const T *p) { return *reinterpret_cast<const Packed128<T> *>(p); }
template <typename T>
__device__ __forceinline__ void store128(T *p, Packed128<T> x) { *reinterpret_cast<Packed128<T> *>(p) = x; }

/* Conversions to/from f32 for every storage type. */
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(double x) { return (float)x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_f32<double>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

/* The accumulation type of T (f32; f64 for f64) and one value into and out of it, 16-bit types through
 * f32 and rounded once; a namespace, as rope.cu and dropout.cu keep an ld/st of their own (<T, C> order). */
namespace acc {
template <typename T> using acc_t = typename std::conditional<std::is_same<T, double>::value, double, float>::type;
template <typename C, typename T> __device__ __forceinline__ C ld(T x) { return (C)to_f32(x); }
template <> __device__ __forceinline__ double ld<double, double>(double x) { return x; }
template <typename T, typename C> __device__ __forceinline__ T st(C x) { return from_f32<T>((float)x); }
template <> __device__ __forceinline__ double st<double, double>(double x) { return x; }
}  // namespace acc

/* e^x as 2^(x·log2 e) through MUFU.EX2 with ftz: 2 instructions where expf takes ~10 (and __expf's non-ftz
 * ex2 ~5). Error ~2 ulp for |x| < 1, growing ~1.2·|x| ulp; results under 2^-126 flush to 0, ±inf and NaN as
 * expf. For sums of exp(x - max) of 2-byte rows (>= 1, so a flushed term is invisible): stat.cu, softmax_xent.cu. */
__device__ __forceinline__ float em_exp_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
}

/* The max of two bf16 (T = __nv_bfloat16) or f16 lanes of a word at once (max.bf16x2 / max.f16x2: as fmaxf, a
 * NaN lane yields the other operand): half an instruction an element for a row max instead of an unpack and a
 * max, and exact (the max of stored values is a stored value). em_neg_inf_x2: both lanes -inf. */
template <typename T> __device__ __forceinline__ uint32_t em_max_x2(uint32_t a, uint32_t b) {
  static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value, "bf16 or f16 lanes");
  uint32_t d;
  if constexpr (std::is_same<T, __nv_bfloat16>::value) asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  else asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
template <typename T> __device__ __forceinline__ constexpr uint32_t em_neg_inf_x2() {
  return std::is_same<T, __nv_bfloat16>::value ? 0xff80ff80u : 0xfc00fc00u;
}

/* Per-block tables of a bf16 function's results (gelu_tab in elementwise.cu, bce_fwd_tab in loss_bce.cu):
 * they cover the bf16 magnitudes |x| in [2^-12, 2^6), 18 binades of 128 = kBf16TabN entries; every other x
 * (zeros, tiny, huge, inf, NaN) is computed. em_bf16_tab_index: a bf16's bits (the sign ignored) -> its
 * entry, >= kBf16TabN outside the range (unsigned wrap); em_bf16_tab_bits: entry i -> the positive bf16's bits. */
constexpr int kBf16TabE0 = 127 - 12, kBf16TabN = 18 * 128;
__device__ __forceinline__ uint32_t em_bf16_tab_index(uint32_t b) { return (b & 0x7fffu) - (uint32_t)(kBf16TabE0 << 7); }
__device__ __forceinline__ uint32_t em_bf16_tab_bits(int i) { return (uint32_t)(i + (kBf16TabE0 << 7)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/* Block-wide sum; every thread gets the result. shared must hold 32 floats. */
__device__ __forceinline__ float block_sum(float v, float *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nw ? shared[lane] : 0.f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nw ? shared[lane] : -INFINITY;
  return warp_max(v);
}

/* Dispatch a templated launcher over the floating dtypes. */
#define EM_DISPATCH_FLOAT(dtype, T, ...)                                   \
  switch (dtype) {                                                        \
    case EM_F32: { typedef float T; __VA_ARGS__; break; }                 \
    case EM_F64: { typedef double T; __VA_ARGS__; break; }                \
    case EM_BF16: { typedef __nv_bfloat16 T; __VA_ARGS__; break; }        \
    case EM_F16: { typedef __half T; __VA_ARGS__; break; }                \
    default: return em_error("unsupported dtype %s", em_dtype_name(dtype)); \
  }

#endif
