/* Random sampling on the device: bernoulli, randperm, multinomial -- the
 * device half of engine/ops/random.c, drawing exactly the CPU's numbers from
 * the Philox stream (counter-based: element e needs only (seed, ctr0 + e/4)
 * or, for 64-bit draws, (seed, ctr0 + e/2)).
 *
 *   bernoulli    a thread per 8 or 16 elements (2 or 4 Philox blocks of
 *                10 rounds: 16 to 64 bytes of out; 16 for a constant p into
 *                bf16/f16/u16, bound by issue), sizeof(out) + sizeof(p)
 *                bytes per element, 16-byte stores (the B blocks from
 *                em_philox_run: the first rounds' products shared).
 *   randperm     one thread per block makes two (key, index) pairs, then
 *                cub::DeviceRadixSort sorts them by key (stable, so equal
 *                keys keep index order, as the CPU's (key, index) sort).
 *                ~2 x 16 bytes per element per radix pass.
 *   multinomial  the exponential race: one block of 256 threads per row
 *                (without replacement) or per (row, sample) (with), each
 *                thread computing keys p_j / E_j for its strided categories
 *                and a block argmax (largest key, then lowest index). Without
 *                replacement, keys are written once to scratch and the
 *                block takes k argmaxes, knocking each winner out: O(k C)
 *                per row, fine for the usual small k.
 * Nothing reads the device from the host; every launch goes on the current
 * stream, and the stream start is resolved on the device (em_philox_resolve)
 * so all three can be captured in a CUDA graph. */
#include <stdlib.h>
#include <type_traits>
#include <cub/device/device_radix_sort.cuh>
#include "rng_math.h"
#include "common.cuh"
#include "convert.cuh"
#include "dtype_io.cuh"
#include "backend.h"

namespace {

/* ---- bernoulli ----
 * Only bits move: out's elements are 0 or the bit pattern `one` of 1 in its
 * dtype (S: an unsigned type of its width). Thread t takes B Philox blocks,
 * elements [4B t, 4B (t + 1)), B = 4 for 1-byte outputs and 2 otherwise, so
 * out is written in 16-byte vectors or more (u8 and u16 too) when aligned. p
 * is read in its own dtype P (as 16-byte vectors where aligned), and the test
 * u(w_j) < p_j is made without any conversion to double: for f32/bf16/f16 p in
 * f32, where u = m 2^-24 and p_j are both exact (so the f32 compare is the
 * CPU's f64 one), for f64 p in double from u built by the bits of the double
 * 2^28 + u; a constant p (P = void) compares each word with em_rng_keep_limit
 * (p <= 0 or NaN: every word passes, and `one` is 0). */

template <typename S, int E> struct alignas(E * sizeof(S)) VecS { S v[E]; };

/* p_j compared with u(w): the CPU's em_rng_below(w, p_j) for each probability dtype. */
__device__ __forceinline__ bool below(uint32_t w, float p) { return (float)(w >> 8) * 0x1p-24f < p; }
__device__ __forceinline__ bool below(uint32_t w, double p) {
  return __dsub_rn(__hiloint2double(0x41b00000, (int)(w >> 8)), 268435456.0) < p;   /* u24 exactly, no cvt */
}
template <typename P> struct ProbIO { typedef P raw; static __device__ __forceinline__ P get(P x) { return x; } };
template <> struct ProbIO<__nv_bfloat16> {
  typedef uint16_t raw;
  static __device__ __forceinline__ float get(uint16_t x) { return __uint_as_float((uint32_t)x << 16); }
};
template <> struct ProbIO<__half> {
  typedef uint16_t raw;
  static __device__ __forceinline__ float get(uint16_t x) { return __half2float(__ushort_as_half(x)); }
};

template <typename S, typename P, int B>
__global__ void __launch_bounds__(256) bernoulli_kernel(S *out, S one, const void *pv, uint32_t lim, int64_t n,
                                                        em_philox_state s, bool vec, bool shared) {
  constexpr int E = 4 * B;
  constexpr bool CONST_P = std::is_void<P>::value;
  typedef typename std::conditional<CONST_P, ProbIO<float>, ProbIO<P>>::type IO;
  typedef typename IO::raw R;
  const R *p = (const R *)pv;
  uint64_t seed, ctr0;
  em_philox_resolve(s, &seed, &ctr0);
  const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  const int64_t nunits = (n + E - 1) / E;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < nunits; t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j0 = t * E;
    const bool full = vec && j0 + E <= n;
    R pr[E];
    if constexpr (!CONST_P) {       /* loads issued before the Philox rounds */
      if (full) {
        const VecS<R, E> pin = *reinterpret_cast<const VecS<R, E> *>(p + j0);
#pragma unroll
        for (int e = 0; e < E; e++) pr[e] = pin.v[e];
      } else {
#pragma unroll
        for (int e = 0; e < E; e++) pr[e] = p[j0 + e < n ? j0 + e : n - 1];
      }
    }
    VecS<S, E> v;
    em_philox_block pb[B];
    em_philox_run(ctr0 + (uint64_t)(t * B), B, shared, k0, k1, pb);   /* blocks B t .. B t + B - 1 */
#pragma unroll
    for (int k = 0; k < B; k++) {
#pragma unroll
      for (int w = 0; w < 4; w++) {
        bool hit;
        if constexpr (CONST_P) hit = pb[k].v[w] <= lim;
        else hit = below(pb[k].v[w], IO::get(pr[4 * k + w]));
        v.v[4 * k + w] = hit ? one : (S)0;
      }
    }
    if (full) *reinterpret_cast<VecS<S, E> *>(out + j0) = v;
    else {
#pragma unroll
      for (int e = 0; e < E; e++)
        if (j0 + e < n) out[j0 + e] = v.v[e];
    }
  }
}

template <typename S, typename P, int B>
static void bernoulli_launch_b(void *o, S one, const void *p, uint32_t lim, int64_t n, em_philox_state s, cudaStream_t st) {
  constexpr size_t PS = std::is_void<P>::value ? 1 : sizeof(typename std::conditional<std::is_void<P>::value, char, P>::type);
  const bool vec = (uintptr_t)o % (4 * B * sizeof(S)) == 0 && (uintptr_t)p % (4 * B * PS) == 0;
  bernoulli_kernel<S, P, B><<<em_grid((n + 4 * B - 1) / (4 * B), 256), 256, 0, st>>>((S *)o, one, p, lim, n, s, vec,
                                                                                       em_philox_run_shared());
}

/* EMBER_BERNOULLI_OLD=1: two Philox blocks a thread for a constant p into 16-bit outputs, as before. */
static bool bernoulli_old() {
  static const bool on = em_env_switch("EMBER_BERNOULLI_OLD", false);
  return on;
}

/* B Philox blocks a thread: 16 bytes of u8 (4), 32 of f32 and wider (2); u16 outputs 16 bytes (2) from
 * probabilities, 32 (4) for a constant p, where only the Philox rounds and the index work are left, so a
 * thread's fixed work spread over 16 elements instead of 8 is what the issue rate gains. The same
 * element-to-counter map either way: element j is word j % 4 of block ctr0 + j / 4. */
template <typename S, typename P>
static void bernoulli_launch(void *o, S one, const void *p, uint32_t lim, int64_t n, em_philox_state s, cudaStream_t st) {
  if constexpr (std::is_void<P>::value && sizeof(S) == 2) {
    if (!bernoulli_old()) { bernoulli_launch_b<S, P, 4>(o, one, p, lim, n, s, st); return; }
  }
  bernoulli_launch_b<S, P, sizeof(S) >= 2 ? 2 : 4>(o, one, p, lim, n, s, st);
}

template <typename S>
static void bernoulli_dispatch(void *o, uint64_t one, const void *p, int pdt, uint32_t lim, int64_t n,
                               em_philox_state s, cudaStream_t st) {
  if (!p) bernoulli_launch<S, void>(o, (S)one, p, lim, n, s, st);
  else if (pdt == EM_F32) bernoulli_launch<S, float>(o, (S)one, p, lim, n, s, st);
  else if (pdt == EM_F64) bernoulli_launch<S, double>(o, (S)one, p, lim, n, s, st);
  else if (pdt == EM_BF16) bernoulli_launch<S, __nv_bfloat16>(o, (S)one, p, lim, n, s, st);
  else bernoulli_launch<S, __half>(o, (S)one, p, lim, n, s, st);
}

/* ---- randperm ---- */

__global__ void randperm_keys_kernel(uint64_t *keys, int64_t *idx, int64_t n, em_philox_state s) {
  uint64_t seed, ctr0;
  em_philox_resolve(s, &seed, &ctr0);
  for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < (n + 1) / 2; b += (int64_t)gridDim.x * blockDim.x) {
    uint64_t c = ctr0 + (uint64_t)b;
    em_philox_block pb = em_philox4x32_10((uint32_t)c, (uint32_t)(c >> 32), 0, 0, (uint32_t)seed, (uint32_t)(seed >> 32));
    for (int h = 0; h < 2 && b * 2 + h < n; h++) {
      keys[b * 2 + h] = em_rng_u64(&pb, h);
      idx[b * 2 + h] = b * 2 + h;
    }
  }
}

/* ---- multinomial ---- */

constexpr int kThreads = 256;

/* A probability as a double: exact for every float dtype (f64 not through f32). */
template <typename T> __device__ __forceinline__ double prob(T x) { return (double)to_f32(x); }
template <> __device__ __forceinline__ double prob<double>(double x) { return x; }

__device__ __forceinline__ double race_key(double p, uint64_t e, uint64_t seed, uint64_t ctr0) {
  uint64_t c = ctr0 + e / 2;
  em_philox_block pb = em_philox4x32_10((uint32_t)c, (uint32_t)(c >> 32), 0, 0, (uint32_t)seed, (uint32_t)(seed >> 32));
  return em_rng_race_key(p, em_rng_u64(&pb, (int)(e % 2)));
}

/* (key, j) beats (k2, j2): larger key, then lower index. */
__device__ __forceinline__ bool beats(double k, int64_t j, double k2, int64_t j2) {
  return k > k2 || (k == k2 && j < j2);
}

/* The block's best (key, j); every thread gets it. */
__device__ void block_argmax(double &k, int64_t &j) {
  __shared__ double sk[kThreads / 32];
  __shared__ int64_t sj[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    double k2 = __shfl_xor_sync(0xffffffffu, k, o);
    int64_t j2 = __shfl_xor_sync(0xffffffffu, j, o);
    if (beats(k2, j2, k, j)) { k = k2; j = j2; }
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) { sk[warp] = k; sj[warp] = j; }
  __syncthreads();
  k = lane < kThreads / 32 ? sk[lane] : -1.0;
  j = lane < kThreads / 32 ? sj[lane] : INT64_MAX;
  for (int o = 16; o > 0; o >>= 1) {
    double k2 = __shfl_xor_sync(0xffffffffu, k, o);
    int64_t j2 = __shfl_xor_sync(0xffffffffu, j, o);
    if (beats(k2, j2, k, j)) { k = k2; j = j2; }
  }
}

/* With replacement: block (r, s) races row r once. */
template <typename T>
__global__ void __launch_bounds__(kThreads) multinomial_repl_kernel(const T *probs, int64_t C, int64_t k, int64_t *out,
                                                                    em_philox_state s) {
  uint64_t seed, ctr0;
  em_philox_resolve(s, &seed, &ctr0);
  int64_t r = blockIdx.y, smp = blockIdx.x;
  const T *p = probs + r * C;
  uint64_t e0 = (uint64_t)((r * k + smp) * C);
  double best = -1.0;
  int64_t bj = INT64_MAX;
  for (int64_t j = threadIdx.x; j < C; j += kThreads) {
    double key = race_key(prob(p[j]), e0 + (uint64_t)j, seed, ctr0);
    if (beats(key, j, best, bj)) { best = key; bj = j; }
  }
  block_argmax(best, bj);
  if (threadIdx.x == 0) out[r * k + smp] = bj;
}

/* Without replacement: one race per row, keys to scratch, then k argmaxes. */
template <typename T>
__global__ void __launch_bounds__(kThreads) multinomial_norepl_kernel(const T *probs, int64_t C, int64_t k, double *keys,
                                                                      int64_t *out, em_philox_state s) {
  uint64_t seed, ctr0;
  em_philox_resolve(s, &seed, &ctr0);
  int64_t r = blockIdx.x;
  const T *p = probs + r * C;
  double *kr = keys + r * C;
  for (int64_t j = threadIdx.x; j < C; j += kThreads)
    kr[j] = race_key(prob(p[j]), (uint64_t)(r * C + j), seed, ctr0);
  __syncthreads();
  for (int64_t smp = 0; smp < k; smp++) {
    double best = -1.0;
    int64_t bj = INT64_MAX;
    for (int64_t j = threadIdx.x; j < C; j += kThreads)
      if (beats(kr[j], j, best, bj)) { best = kr[j]; bj = j; }
    block_argmax(best, bj);
    if (threadIdx.x == 0) { out[r * k + smp] = bj; kr[bj] = -2.0; }   /* below every real key */
    __syncthreads();
  }
}

}  // namespace

extern "C" int em_bernoulli_cuda(em_tensor *out, const em_tensor *p, double pc, em_philox_state s) {
  int64_t n = em_numel(out);
  if (n == 0) return 0;
  if (p && (!em_dtype_is_float(p->dtype) || em_numel(p) != n))
    return em_error("bernoulli: internal error: probabilities of dtype %s and %lld elements for %lld draws",
                    em_dtype_name(p->dtype), (long long)em_numel(p), (long long)n);
  cudaStream_t stream = em_cur_stream(out->device.index);
  const void *pp = p ? em_data_ptr(p) : nullptr;
  const int pdt = p ? p->dtype : EM_F64;
  uint64_t one = 0;                       /* 1 in out's dtype, as the CPU converts it */
  em_store_f64(&one, out->dtype, 0, 1.0);
  const size_t es = em_dtype_size(out->dtype);
  const uint32_t thr = em_rng_keep_threshold(pc), lim = em_rng_keep_limit(thr);
  if (!pp && thr == 0) one = 0;   /* p <= 0: every word passes the limit, and every draw must be 0 */
  void *o = em_data_ptr(out);
  switch (es) {
    case 1: bernoulli_dispatch<uint8_t>(o, one, pp, pdt, lim, n, s, stream); break;
    case 2: bernoulli_dispatch<uint16_t>(o, one, pp, pdt, lim, n, s, stream); break;
    case 4: bernoulli_dispatch<uint32_t>(o, one, pp, pdt, lim, n, s, stream); break;
    default: bernoulli_dispatch<uint64_t>(o, one, pp, pdt, lim, n, s, stream); break;
  }
  return em_launch_check("bernoulli");
}

extern "C" int em_randperm_cuda(em_tensor *out, em_philox_state s) {
  int64_t n = em_numel(out);
  if (n == 0) return 0;
  if (n > INT32_MAX) return em_error("randperm: n = %lld exceeds the CUDA sort's limit (2^31 - 1)", (long long)n);
  cudaStream_t stream = em_cur_stream(out->device.index);
  int64_t two_n = 2 * n;
  /* scratch: keys in/out (u64) and indices in (i64), then the sort's temporary storage */
  em_tensor *scratch = em_empty(1, &two_n, EM_I64, out->device), *idx_in = NULL, *tmp = NULL;
  idx_in = scratch ? em_empty(1, &n, EM_I64, out->device) : NULL;
  int rc = idx_in ? 0 : -1;
  size_t tmp_bytes = 0;
  uint64_t *keys = scratch ? (uint64_t *)em_data_ptr(scratch) : nullptr;
  if (rc == 0)
    rc = em_cuda_check(cub::DeviceRadixSort::SortPairs(nullptr, tmp_bytes, keys, keys + n,
                                                       (const int64_t *)em_data_ptr(idx_in),
                                                       (int64_t *)em_data_ptr(out), (int)n, 0, 64, stream),
                       "randperm", "cub::DeviceRadixSort (size query)");
  int64_t tb = (int64_t)tmp_bytes > 0 ? (int64_t)tmp_bytes : 1;
  if (rc == 0 && !(tmp = em_empty(1, &tb, EM_U8, out->device))) rc = -1;
  if (rc == 0) {
    randperm_keys_kernel<<<em_grid((n + 1) / 2, 256), 256, 0, stream>>>(keys, (int64_t *)em_data_ptr(idx_in), n, s);
    rc = em_launch_check("randperm");
  }
  if (rc == 0)
    rc = em_cuda_check(cub::DeviceRadixSort::SortPairs(em_data_ptr(tmp), tmp_bytes, keys, keys + n,
                                                       (const int64_t *)em_data_ptr(idx_in),
                                                       (int64_t *)em_data_ptr(out), (int)n, 0, 64, stream),
                       "randperm", "cub::DeviceRadixSort");
  /* released now, reused by later work on this stream only: the caching allocator is stream-ordered */
  em_tensor_release(tmp); em_tensor_release(idx_in); em_tensor_release(scratch);
  return rc;
}

extern "C" int em_multinomial_cuda(const em_tensor *probs, em_tensor *out, bool replacement, em_philox_state s) {
  int64_t C = probs->shape[probs->ndim - 1], N = probs->ndim == 2 ? probs->shape[0] : 1;
  int64_t k = out->shape[out->ndim - 1];
  if (N == 0) return 0;
  if (N > 65535 || (replacement && k > INT32_MAX))
    return em_error("multinomial: %lld rows x %lld samples exceed the CUDA grid", (long long)N, (long long)k);
  cudaStream_t stream = em_cur_stream(probs->device.index);
  if (replacement) {
    dim3 grid((unsigned)k, (unsigned)N);
    EM_DISPATCH_FLOAT(probs->dtype, T,
      multinomial_repl_kernel<T><<<grid, kThreads, 0, stream>>>((const T *)em_data_ptr(probs), C, k,
                                                                (int64_t *)em_data_ptr(out), s));
    return em_launch_check("multinomial");
  }
  int64_t nk = N * C;
  em_tensor *keys = em_empty(1, &nk, EM_F64, probs->device);
  if (!keys) return -1;
  EM_DISPATCH_FLOAT(probs->dtype, T,
    multinomial_norepl_kernel<T><<<(unsigned)N, kThreads, 0, stream>>>((const T *)em_data_ptr(probs), C, k,
                                                                       (double *)em_data_ptr(keys),
                                                                       (int64_t *)em_data_ptr(out), s));
  em_tensor_release(keys);
  return em_launch_check("multinomial");
}
