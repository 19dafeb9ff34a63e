/* index_add out of place, grouped by destination row (em_index_from_cuda tries
 * it first): out[k] = x[k] + alpha * sum of src[j] over the j with index[j] = k,
 * each row of out written once, by the threads that own it.
 *
 * Why: the row-atomic path (kernels/indexing.cu, rows_add_kernel) is a clone
 * (read x, write out) and then, per src row, a 16-byte vector atomic
 * read-modify-write of a random row of out: 5 row-sized passes of traffic
 * (x, out, src, out read, out write) for the 4 that bench_ops counts, so it
 * ran at 64-65 % of 4800 GB/s (79 % by the bytes that really moved).
 * Grouped: read x, read src (random whole rows, like index_select), write
 * out = 3 passes, plus a sort of the n indices (4-byte keys; ~20-30 us at
 * n = 262144, a few % of the row traffic once src is >= 96 MiB).
 *
 *   1. keys[j] = index[j] (D for one out of range: never followed), vals[j] = j
 *   2. cub radix sort of (keys, vals): stable, so each row's j stay ascending
 *   3. range[k] = [first, last + 1) of row k's run in the sorted keys (0, 0: none)
 *   4. per 16-byte vector of out: x, then + src[j] for each j of its row, in
 *      ascending j, rounded to T after each add: the CPU's serial order and
 *      rounding, so f32 results (alpha 1, or a power of two) are the CPU's
 *      bits, and the same every run (the atomics' sums were not).
 *
 * Shapes: index_add along dim 0 of a contiguous x (no outer dims), rows of a
 * multiple of 16 bytes, f32 only (group_ok says why), i64 / i32 indices, src contiguous,
 * src >= 96 MiB (smaller: the sort's fixed cost is not paid back; the 65536-row
 * bench cases keep the atomic path). EMBER_IX_ADD_SORT=0: never (the clone +
 * row atomics, as before). */
#include <cub/cub.cuh>
#include "common.cuh"
#include "index_common.cuh"   /* scaled() */
#include "backend.h"

#define GROUP_THREADS 256
#define GROUP_UNROLL 4                        /* 16-byte vectors a thread has in flight */
static const int64_t kGroupMinBytes = (int64_t)96 << 20;   /* src bytes */

template <typename I>
__global__ void __launch_bounds__(GROUP_THREADS) group_keys_kernel(const I *__restrict__ index, int64_t is,
                                                                   uint32_t *__restrict__ keys,
                                                                   uint32_t *__restrict__ vals, uint32_t n,
                                                                   int64_t D, int wrap) {
  for (uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
    int64_t k = (int64_t)index[(int64_t)j * is];
    if (wrap && k < 0) k += D;
    keys[j] = k >= 0 && k < D ? (uint32_t)k : (uint32_t)D;
    vals[j] = j;
  }
}

/* range[k] = [start, end) of key k's run in the sorted keys; rows with no run keep the memset's (0, 0). */
__global__ void __launch_bounds__(GROUP_THREADS) group_bounds_kernel(const uint32_t *__restrict__ keys, uint32_t n,
                                                                     uint32_t D, uint2 *__restrict__ range) {
  for (uint32_t q = blockIdx.x * blockDim.x + threadIdx.x; q < n; q += gridDim.x * blockDim.x) {
    const uint32_t k = keys[q];
    if (k >= D) continue;
    if (q == 0 || keys[q - 1] != k) range[k].x = q;
    if (q == n - 1 || keys[q + 1] != k) range[k].y = q + 1;
  }
}

/* a = a + scaled(s), rounded to T per element (identity rounding for f32): one of the CPU's serial adds.
 * 16 bytes kept as four 32-bit words (one or two elements each) so that a 16-bit row's vectors stay four
 * registers: unpacked into eight 16-bit values, the bf16 kernel spilled. */
template <typename T, bool ONE>
__device__ __forceinline__ uint32_t group_add_word(uint32_t a, uint32_t s, double alpha) {
  constexpr int K = 4 / sizeof(T);
  T x[K], y[K];
  memcpy(x, &a, 4);
  memcpy(y, &s, 4);
#pragma unroll
  for (int e = 0; e < K; e++) x[e] = from_f32<T>(to_f32(x[e]) + to_f32(ONE ? y[e] : scaled<T>(y[e], alpha)));
  memcpy(&a, x, 4);
  return a;
}

template <typename T, bool ONE>
__device__ __forceinline__ void group_add(uint4 &a, const uint4 &s, double alpha) {
  a.x = group_add_word<T, ONE>(a.x, s.x, alpha);
  a.y = group_add_word<T, ONE>(a.y, s.y, alpha);
  a.z = group_add_word<T, ONE>(a.z, s.z, alpha);
  a.w = group_add_word<T, ONE>(a.w, s.w, alpha);
}

/* Vector v of out (row v / vpr, column c): x's vector, then its row's src vectors in sorted (ascending j)
 * order. GROUP_UNROLL vectors a thread: their range and x loads together, then their first src vector
 * together (a row has one src row on average), any further ones in turn. O: 32-bit when total < 2^31.
 * ONE: alpha == 1, no scaling (scaled() is the identity there). 4 blocks an SM (64 registers; 2 for 64-bit O). */
template <typename T, typename O, bool ONE>
__global__ void __launch_bounds__(GROUP_THREADS, sizeof(O) == 4 ? 4 : 2) group_rows_kernel(const uint4 *__restrict__ from,
                                                                      uint4 *__restrict__ out,
                                                                      const uint4 *__restrict__ src,
                                                                   const uint2 *__restrict__ range,
                                                                   const uint32_t *__restrict__ order, O total,
                                                                   O vpr, double alpha) {
  const O stride = (O)gridDim.x * blockDim.x;
  for (O v0 = blockIdx.x * (O)blockDim.x + threadIdx.x; v0 < total; v0 += stride * GROUP_UNROLL) {
    uint2 r[GROUP_UNROLL];
    O c[GROUP_UNROLL];
    uint4 a[GROUP_UNROLL], s[GROUP_UNROLL];
#pragma unroll
    for (int u = 0; u < GROUP_UNROLL; u++) {
      const O v = v0 + (O)u * stride;
      r[u] = make_uint2(0, 0);
      c[u] = 0;
      if (v < total) {
        const O row = v / vpr;
        c[u] = v - row * vpr;
        r[u] = __ldg(range + row);
        a[u] = from[v];
      }
    }
#pragma unroll
    for (int u = 0; u < GROUP_UNROLL; u++)
      if (r[u].x < r[u].y) s[u] = __ldg(src + (int64_t)__ldg(order + r[u].x) * (int64_t)vpr + (int64_t)c[u]);
#pragma unroll
    for (int u = 0; u < GROUP_UNROLL; u++) {
      const O v = v0 + (O)u * stride;
      if (v >= total) continue;
      if (r[u].x < r[u].y) {
        group_add<T, ONE>(a[u], s[u], alpha);
        for (uint32_t q = r[u].x + 1; q < r[u].y; q++)
          group_add<T, ONE>(a[u], __ldg(src + (int64_t)__ldg(order + q) * (int64_t)vpr + (int64_t)c[u]), alpha);
      }
      out[v] = a[u];
    }
  }
}

static size_t group_align(size_t b) { return (b + 255) & ~(size_t)255; }

/* Does p fit: index_add (index varying along dim 0 only) of contiguous 16-byte rows, big enough? */
static bool group_ok(const em_index_plan *p, const em_tensor *self, const em_tensor *from, const em_tensor *index,
                     const em_tensor *other, int64_t *inner) {
  static const bool env = em_env_switch("EMBER_IX_ADD_SORT", true);
  if (!env || p->kind != EM_IX_SCATTER_ADD || !other || p->dim != 0 || p->ndim < 1) return false;
  /* f32 only: measured on the H200, bf16 gained nothing (0.1756 vs 0.1738 ms at 262144 rows) and f16 with
   * alpha 0.5 missed the CPU's bits by an ulp (1.5e-5) in the GPU spec; both keep the copy + atomics. */
  if (self->dtype != EM_F32) return false;
  if (index->dtype != EM_I64 && index->dtype != EM_I32) return false;
  if (!em_is_contiguous(other) || !em_is_contiguous(self) || !em_is_contiguous(from)) return false;
  const int64_t es = (int64_t)em_dtype_size(self->dtype), n = p->shape[0], D = p->dim_size;
  int64_t in = 1;
  for (int k = p->ndim - 1; k > 0; k--) {   /* self's and src's dims after 0: the same row-major rows */
    if (p->index_stride[k] != 0) return false;
    if (p->shape[k] != 1 && (p->self_stride[k] != in || p->other_stride[k] != in)) return false;
    in *= p->shape[k];
  }
  if (p->dim_stride != in || (n > 1 && p->other_stride[0] != in)) return false;
  if (self->ndim != p->ndim || self->shape[0] != D) return false;
  for (int k = 1; k < p->ndim; k++) if (self->shape[k] != p->shape[k]) return false;
  const uintptr_t a = (uintptr_t)em_data_ptr(self) | (uintptr_t)em_data_ptr(from) | (uintptr_t)em_data_ptr(other);
  if ((in * es) % 16 != 0 || (a & 15) || in == 0) return false;
  if (n * in * es < kGroupMinBytes || n >= INT32_MAX || D >= INT32_MAX) return false;
  *inner = in;
  return true;
}

template <typename T, typename O, bool ONE>
static void group_rows_launch(const em_tensor *from, em_tensor *self, const em_tensor *other, const uint2 *range,
                              const uint32_t *order, int64_t total, int64_t vpr, double alpha, cudaStream_t s) {
  group_rows_kernel<T, O, ONE><<<em_grid((total + GROUP_UNROLL - 1) / GROUP_UNROLL, GROUP_THREADS), GROUP_THREADS, 0, s>>>(
      (const uint4 *)em_data_ptr(from), (uint4 *)em_data_ptr(self), (const uint4 *)em_data_ptr(other), range, order, (O)total, (O)vpr, alpha);
}

template <typename T>
static void group_rows(const em_tensor *from, em_tensor *self, const em_tensor *other, const uint2 *range,
                       const uint32_t *order, int64_t total, int64_t vpr, double alpha, cudaStream_t s) {
  if (total < ((int64_t)1 << 31)) {
    if (alpha == 1) group_rows_launch<T, uint32_t, true>(from, self, other, range, order, total, vpr, alpha, s);
    else group_rows_launch<T, uint32_t, false>(from, self, other, range, order, total, vpr, alpha, s);
  } else {
    group_rows_launch<T, uint64_t, false>(from, self, other, range, order, total, vpr, alpha, s);
  }
}

/* self = from with the index_add plan p applied: 1 done (launches checked), 0 not this shape, -1 error set. */
extern "C" int em_index_add_group_cuda(const char *op, const em_index_plan *p, em_tensor *self,
                                       const em_tensor *from, const em_tensor *index, const em_tensor *other) {
  int64_t inner = 0;
  if (!group_ok(p, self, from, index, other, &inner)) return 0;
  const int64_t n = p->shape[0], D = p->dim_size, es = (int64_t)em_dtype_size(self->dtype);
  const int64_t vpr = inner * es / 16, total = D * vpr;
  cudaStream_t s = em_cur_stream(self->device.index);
  int end_bit = 1;                                     /* keys <= D: the bits of D */
  while (end_bit < 32 && ((uint64_t)D >> end_bit) != 0) end_bit++;
  size_t tmp_bytes = 0;
  uint32_t *null32 = nullptr;
  if (em_cuda_check(cub::DeviceRadixSort::SortPairs(nullptr, tmp_bytes, null32, null32, null32, null32, (int)n, 0,
                                                    end_bit, s),
                    op, "cub::DeviceRadixSort (size query)"))
    return -1;
  const size_t kb = group_align((size_t)n * 4), rb = group_align((size_t)D * 8);
  int64_t bytes = (int64_t)(4 * kb + rb + group_align(tmp_bytes > 0 ? tmp_bytes : 1));
  em_tensor *ws = em_empty(1, &bytes, EM_U8, self->device);
  if (!ws) return -1;
  char *b = (char *)em_data_ptr(ws);
  uint32_t *keys_in = (uint32_t *)b, *vals_in = (uint32_t *)(b + kb), *keys = (uint32_t *)(b + 2 * kb),
           *order = (uint32_t *)(b + 3 * kb);
  uint2 *range = (uint2 *)(b + 4 * kb);
  void *tmp = b + 4 * kb + rb;
  const unsigned g = em_grid(n, GROUP_THREADS);
  int rc = 0;
  if (n > 0) {
    if (index->dtype == EM_I64)
      group_keys_kernel<int64_t><<<g, GROUP_THREADS, 0, s>>>((const int64_t *)em_data_ptr(index), p->index_stride[0],
                                                             keys_in, vals_in, (uint32_t)n, D, p->wrap);
    else
      group_keys_kernel<int32_t><<<g, GROUP_THREADS, 0, s>>>((const int32_t *)em_data_ptr(index), p->index_stride[0],
                                                             keys_in, vals_in, (uint32_t)n, D, p->wrap);
    rc = em_launch_check(op);
    if (!rc) rc = em_cuda_check(cub::DeviceRadixSort::SortPairs(tmp, tmp_bytes, keys_in, keys, vals_in, order, (int)n, 0,
                                                                end_bit, s),
                                op, "cub::DeviceRadixSort");
  }
  if (!rc) rc = em_cuda_check(cudaMemsetAsync(range, 0, (size_t)D * 8, s), op, "cudaMemsetAsync");
  if (!rc && n > 0) {
    group_bounds_kernel<<<g, GROUP_THREADS, 0, s>>>(keys, (uint32_t)n, (uint32_t)D, range);
    rc = em_launch_check(op);
  }
  if (!rc && total > 0) {
    if (self->dtype == EM_F32) group_rows<float>(from, self, other, range, order, total, vpr, p->alpha, s);
    else if (self->dtype == EM_BF16) group_rows<__nv_bfloat16>(from, self, other, range, order, total, vpr, p->alpha, s);
    else group_rows<__half>(from, self, other, range, order, total, vpr, p->alpha, s);
    rc = em_launch_check(op);
  }
  /* released now, reused by later work on this stream only: the caching allocator is stream-ordered */
  em_tensor_release(ws);
  return rc ? -1 : 1;
}
