/* Sorting and selection on CUDA: the device half of engine/ops/sort.c —
 * sort/argsort/topk/kthvalue/median (em_sort_cuda), unique, bincount,
 * searchsorted.
 *
 * Sort along a dim: three launches whatever the number of rows.
 *   1. make_keys: each element of a (any strides, any dtype) becomes an
 *      order-preserving unsigned key of its own width (f32 -> u32, bf16 ->
 *      u16, f64 -> u64, ...: the radix sort makes width/8 passes, so a bf16
 *      sort moves half the bytes of an f32 one) plus its int32 position in
 *      its row. Floats: sign-flipped bits, -0 folded into +0, every NaN the
 *      largest key; integers: sign bit flipped.
 *   2. one CUB sort over all rows: cub::DeviceRadixSort (onesweep) for a
 *      single row, cub::DeviceSegmentedSort::StableSortPairs otherwise (it
 *      picks warp, block or radix sorting per segment size). Both are stable,
 *      so ties keep input order and the indices match the CPU's.
 *      EMBER_SORT_KEYS16=u32: a single row of 16-bit keys is sorted as u32
 *      keys over bits [0, 16) (an A/B switch, docs/perf.md 2026-11-28).
 *   3. gather_window: the kept window of each sorted row (all of it for sort,
 *      [0, k) for topk, one position for kthvalue/median): i64 indices and the
 *      values, bit for bit: rebuilt from the sorted keys, gathered from a by
 *      index only where a key does not say the bits (+-0, NaN, bool).
 * Bytes: ~ (key + 4) x 2 x passes per element inside CUB, plus one read of a
 * and the outputs. Temp storage (keys, positions, segment offsets, CUB's own)
 * is one byte tensor from the engine's stream-ordered allocator.
 *
 * Two shortcuts come first. Windows that end within the first kSelMaxK
 * (1024) sorted positions (topk, kthvalue with small k; rows of at most
 * 1024) take a radix select: one block per row reads the row two or three
 * times and sorts only the few candidates, in shared memory (select_rows).
 * Other rows of at most 4096 elements (a (4096, 4096) sort, median of such
 * rows) are each sorted whole by one block with cub::BlockRadixSort in
 * shared memory (block_sort_rows): the row is read once and the window
 * written once, no key/position arrays through global memory.
 *
 * unique = sort + run ids (flags, DeviceScan) + count read by the engine +
 * scatter of each run's first value; bincount = atomics (shared-memory
 * histograms when the bins fit); searchsorted = one thread per value, a
 * binary search with PyTorch's comparisons. */
#include <climits>
#include <cstdlib>
#include <cstring>
#include <cub/cub.cuh>
#include "common.cuh"
#include "dtype_io.cuh"
#include "backend.h"

namespace {

constexpr int kBlock = 256;

/* a's rows along the sorted dim: row r starts at row_offset(r). */
struct RowGeo {
  int no;
  int64_t oshape[EM_MAX_DIMS], ostride[EM_MAX_DIMS];
  int64_t off, st, L, inner;
  bool rowmajor;              /* rows are back to back: row r at off + r * L, st 1 */
};

RowGeo row_geo(const em_tensor *a, int d, int64_t *rows) {
  RowGeo g;
  memset(&g, 0, sizeof g);
  g.off = a->offset;
  g.L = a->ndim ? a->shape[d] : 1;
  g.st = a->ndim ? a->stride[d] : 1;
  g.inner = 1;
  *rows = 1;
  for (int k = 0; k < a->ndim; k++) {
    if (k == d) continue;
    *rows *= a->shape[k];
    if (k > d) g.inner *= a->shape[k];
    g.oshape[g.no] = a->shape[k]; g.ostride[g.no] = a->stride[k]; g.no++;
  }
  g.rowmajor = em_is_contiguous(a) && (a->ndim == 0 || d == a->ndim - 1);
  if (g.rowmajor) g.st = 1;
  return g;
}

__device__ __forceinline__ int64_t row_offset(const RowGeo &g, int64_t r) {
  if (g.rowmajor) return g.off + r * g.L;
  int64_t off = g.off;
  for (int k = g.no - 1; k >= 0; k--) {
    int64_t c = r % g.oshape[k];
    r /= g.oshape[k];
    off += c * g.ostride[k];
  }
  return off;
}

/* ---- order-preserving keys: raw bits of width K in, K out ---- */
__device__ __forceinline__ uint16_t key_half(uint16_t b, uint16_t inf) {
  if ((b & 0x7FFFu) > inf) return 0xFFFFu;          /* NaN: the largest */
  if (b == 0x8000u) b = 0;                          /* -0 == +0 */
  return (b >> 15) ? (uint16_t)~b : (uint16_t)(b | 0x8000u);
}
template <typename K> __device__ K key_at(const K *x, int dt, int64_t i);
template <> __device__ __forceinline__ uint8_t key_at<uint8_t>(const uint8_t *x, int dt, int64_t i) {
  return dt == EM_BOOL ? (uint8_t)(x[i] != 0) : x[i];
}
template <> __device__ __forceinline__ uint16_t key_at<uint16_t>(const uint16_t *x, int dt, int64_t i) {
  uint16_t b = x[i];
  return dt == EM_BF16 ? key_half(b, 0x7F80u) : dt == EM_F16 ? key_half(b, 0x7C00u) : b;
}
template <> __device__ __forceinline__ uint32_t key_at<uint32_t>(const uint32_t *x, int dt, int64_t i) {
  uint32_t b = x[i];
  if (dt != EM_F32) return b ^ 0x80000000u;
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFFFFFFu;
  if (b == 0x80000000u) b = 0;
  return (b >> 31) ? ~b : b | 0x80000000u;
}
template <> __device__ __forceinline__ uint64_t key_at<uint64_t>(const uint64_t *x, int dt, int64_t i) {
  const uint64_t s = 1ull << 63;
  uint64_t b = x[i];
  if (dt != EM_F64) return b ^ s;
  if ((b & ~s) > 0x7FF0000000000000ull) return ~0ull;
  if (b == s) b = 0;
  return (b >> 63) ? ~b : b | s;
}

/* n < 2^31 (sort_impl checks), so positions and rows are 32-bit: a 64-bit
 * division is a ~70-instruction subroutine on the GPU, and make_keys and
 * gather_window paid two or three of them an element (for one 2^24 row,
 * more time than the two radix passes of a bf16 sort). ONE: a single
 * row-major row, no division at all. */
template <typename K, typename KS, bool ONE>
__global__ void __launch_bounds__(kBlock) make_keys(const K *x, int dt, RowGeo g, uint32_t n, KS *keys, int *pos) {
  const uint32_t L = (uint32_t)g.L;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    if (ONE) {
      keys[i] = key_at<K>(x, dt, g.off + i);
      pos[i] = (int)i;
    } else {
      const uint32_t r = i / L, j = i - r * L;
      keys[i] = key_at<K>(x, dt, row_offset(g, r) + (int64_t)j * g.st);
      pos[i] = (int)j;
    }
  }
}

__global__ void segment_offsets(int *offs, int64_t rows, int64_t L) {
  for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r <= rows; r += (int64_t)gridDim.x * blockDim.x)
    offs[r] = (int)(r * L);
}

/* The element a key came from, when the key says it exactly: every key but
 * the one -0 and +0 share and NaN's (all ones); bool keys fold every nonzero
 * byte. *exact false: gather the element instead. */
template <typename K>
__device__ __forceinline__ K key_value(K k, int dt, bool *exact) {
  const K sign = (K)((K)1 << (8 * sizeof(K) - 1));
  const bool is_float = dt == EM_F32 || dt == EM_F64 || dt == EM_BF16 || dt == EM_F16;
  if (is_float) {
    *exact = k != sign && k != (K)~(K)0;
    return (k & sign) ? (K)(k & ~sign) : (K)~k;
  }
  *exact = dt != EM_BOOL;
  const bool flipped = dt == EM_I32 || dt == EM_I64;   /* key_at flips the sign bit of signed integers */
  return flipped ? (K)(k ^ sign) : k;
}

/* Sorted positions [s, s + cnt) of each row (s = j0, or a NaN row's first NaN
 * for median) -> idx (i64) and vals (a's bits) at (outer, cnt, inner). The
 * values come back from the sorted keys -- a sequential read -- and only
 * where a key cannot say the bits (+-0, NaN, bool) from a by index (a
 * random read of a, which for one long row costs a 32-byte sector each). */
template <typename K, typename KS>
__global__ void __launch_bounds__(kBlock) gather_window(const K *x, int dt, RowGeo g, const KS *skeys, const int *spos,
                                                        uint32_t total, uint32_t j0, uint32_t cnt, bool median_nan,
                                                        K *vals, int64_t *idx) {
  const uint32_t L = (uint32_t)g.L, inner = (uint32_t)g.inner;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const uint32_t r = total == cnt ? 0 : i / cnt, jj = i - r * cnt;   /* one row: no division */
    uint32_t s = j0;
    const KS *rk = skeys + (size_t)r * L;
    const KS top = (KS)(K)~(K)0;
    if (median_nan && rk[L - 1] == top) {   /* NaNs sort last, in input order: the first one */
      uint32_t lo = 0, hi = L - 1;
      while (lo < hi) { uint32_t mid = (lo + hi) / 2; if (rk[mid] == top) hi = mid; else lo = mid + 1; }
      s = lo;
    }
    const int64_t at = spos[(size_t)r * L + s + jj];
    const uint32_t o = inner == 1 ? i : (r / inner) * cnt * inner + jj * inner + r % inner;
    idx[o] = at;
    if (vals) {
      bool exact;
      const K v = key_value<K>((K)rk[s + jj], dt, &exact);
      vals[o] = exact ? v : x[row_offset(g, r) + at * g.st];
    }
  }
}

size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* K: the key's width (its bits are the sort's); KS: how the keys are stored
 * for CUB -- K, or uint32_t for 16-bit keys of one row when
 * EMBER_SORT_KEYS16=u32 (sorted over bits [0, 16), CUB's 32-bit onesweep
 * tuning instead of its small-key one: an A/B switch until the H100 says
 * which is faster, see docs/perf.md). */
template <typename K, typename KS = K>
int sort_impl(const char *op, const em_tensor *a, int d, bool desc, int64_t j0, int64_t cnt, bool median_nan,
              em_tensor *vals, em_tensor *idx) {
  int64_t rows;
  RowGeo g = row_geo(a, d, &rows);
  const int64_t n = rows * g.L;
  if (n == 0 || cnt == 0) return 0;
  if (n > INT32_MAX)
    return em_error("%s: CUDA sorts at most 2^31 - 1 elements, got %lld", op, (long long)n);
  const int dev = a->device.index;
  if (em_use_device(dev, op)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  const int end_bit = 8 * (int)sizeof(K);
  size_t temp = 0;
  cudaError_t e;
  if (rows == 1)
    e = desc ? cub::DeviceRadixSort::SortPairsDescending(nullptr, temp, (const KS *)nullptr, (KS *)nullptr,
                                                         (const int *)nullptr, (int *)nullptr, (int)n, 0, end_bit, s)
             : cub::DeviceRadixSort::SortPairs(nullptr, temp, (const KS *)nullptr, (KS *)nullptr, (const int *)nullptr,
                                               (int *)nullptr, (int)n, 0, end_bit, s);
  else
    e = desc ? cub::DeviceSegmentedSort::StableSortPairsDescending(nullptr, temp, (const KS *)nullptr, (KS *)nullptr,
                                                                   (const int *)nullptr, (int *)nullptr, n, rows,
                                                                   (const int *)nullptr, (const int *)nullptr, s)
             : cub::DeviceSegmentedSort::StableSortPairs(nullptr, temp, (const KS *)nullptr, (KS *)nullptr,
                                                         (const int *)nullptr, (int *)nullptr, n, rows,
                                                         (const int *)nullptr, (const int *)nullptr, s);
  if (em_cuda_check(e, op, "cub sort (temp size)")) return -1;
  const size_t kb = align256((size_t)n * sizeof(KS)), pb = align256((size_t)n * sizeof(int));
  const size_t ob = rows > 1 ? align256((size_t)(rows + 1) * sizeof(int)) : 0;
  int64_t total = (int64_t)(2 * kb + 2 * pb + ob + temp);
  em_tensor *ws = em_empty(1, &total, EM_U8, a->device);
  if (!ws) return -1;
  char *p = (char *)em_data_ptr(ws);
  KS *kin = (KS *)p, *kout = (KS *)(p + kb);
  int *pin = (int *)(p + 2 * kb), *pout = (int *)(p + 2 * kb + pb), *offs = (int *)(p + 2 * kb + 2 * pb);
  void *tmp = p + 2 * kb + 2 * pb + ob;
  if (rows == 1 && g.rowmajor)
    make_keys<K, KS, true><<<em_grid(n, kBlock), kBlock, 0, s>>>((const K *)a->storage->data, a->dtype, g, (uint32_t)n, kin, pin);
  else
    make_keys<K, KS, false><<<em_grid(n, kBlock), kBlock, 0, s>>>((const K *)a->storage->data, a->dtype, g, (uint32_t)n, kin, pin);
  if (rows == 1) {
    e = desc ? cub::DeviceRadixSort::SortPairsDescending(tmp, temp, kin, kout, pin, pout, (int)n, 0, end_bit, s)
             : cub::DeviceRadixSort::SortPairs(tmp, temp, kin, kout, pin, pout, (int)n, 0, end_bit, s);
  } else {
    segment_offsets<<<em_grid(rows + 1, kBlock), kBlock, 0, s>>>(offs, rows, g.L);
    e = desc ? cub::DeviceSegmentedSort::StableSortPairsDescending(tmp, temp, kin, kout, pin, pout, n, rows, offs,
                                                                   offs + 1, s)
             : cub::DeviceSegmentedSort::StableSortPairs(tmp, temp, kin, kout, pin, pout, n, rows, offs, offs + 1, s);
  }
  int rc = em_cuda_check(e, op, "cub sort");
  if (!rc) {
    int64_t win = rows * cnt;
    gather_window<K, KS><<<em_grid(win, kBlock), kBlock, 0, s>>>((const K *)a->storage->data, a->dtype, g, kout, pout,
                                                             (uint32_t)win, (uint32_t)j0, (uint32_t)cnt, median_nan,
                                                             vals ? (K *)em_data_ptr(vals) : nullptr,
                                                             (int64_t *)em_data_ptr(idx));
    rc = em_launch_check(op);
  }
  em_tensor_release(ws);   /* back to the stream-ordered cache: later work on this stream reuses it safely */
  return rc;
}

/* ---- selection: topk / kthvalue windows that end within the first kSelMaxK sorted positions ----
 * One block per row, the row read 2-3 times instead of sorted: a radix
 * select over the order-preserving keys (descending: complemented), 11 bits
 * a pass, narrows the rows' elements to the ones whose leading bits are
 * those of the K-th smallest key (K = j0 + cnt); as soon as those plus the
 * elements known to rank before them fit in kSelSlots, one more pass gathers
 * them into shared memory, a bitonic sort orders them by (key, position) --
 * the stable sort's order, ties to the lower index, NaN as the largest --
 * and positions [j0, j0 + cnt) are written. Rows of at most kSelSlots
 * elements skip straight to the gather. Only when more than kSelSlots
 * elements share the K-th key bit for bit (a row of zeros) does the gather
 * take the first ones in index order, with a block scan. */
constexpr int kSelSlots = 2048, kSelMaxK = 1024, kSelBits = 11;

template <typename K, int T>
struct SelShared {
  int hist[1 << kSelBits];
  K key[kSelSlots];
  int pos[kSelSlots];
  int n, bin, before, count;
  typename cub::BlockScan<int, T>::TempStorage scan;
};

/* Visit every (position, key) of the row: 16-byte loads, U in flight, when
 * the row is contiguous and aligned (vec), else strided scalar loads. */
template <typename K, int T, typename F>
__device__ __forceinline__ void for_row(const K *row, int64_t st, int L, bool vec, F f) {
  constexpr int VK = 16 / (int)sizeof(K), U = VK >= 8 ? 16 / VK : 4;   /* at most 16 keys in flight per thread */
  if (vec) {
    const int nv = L / VK;
    for (int v0 = threadIdx.x; v0 < nv; v0 += T * U) {
      Packed128<K> p[U];
#pragma unroll
      for (int u = 0; u < U; u++)
        if (v0 + u * T < nv) p[u] = load128(row + (int64_t)(v0 + u * T) * VK);
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (v0 + u * T >= nv) break;
#pragma unroll
        for (int e = 0; e < VK; e++) f((v0 + u * T) * VK + e, p[u][e]);
      }
    }
    return;
  }
  for (int j0 = threadIdx.x; j0 < L; j0 += T * U) {
    K k[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (j0 + u * T < L) k[u] = row[(int64_t)(j0 + u * T) * st];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (j0 + u * T < L) f(j0 + u * T, k[u]);
  }
}

/* (k1, p1) before (k2, p2) in the stable order */
template <typename K>
__device__ __forceinline__ bool sel_before(K k1, int p1, K k2, int p2) { return k1 < k2 || (k1 == k2 && p1 < p2); }

template <typename K, int T>
__global__ void __launch_bounds__(T) select_rows(const K *x, int dt, RowGeo g, bool desc, bool vec, int64_t j0,
                                                 int64_t cnt, K *vals, int64_t *idx) {
  __shared__ SelShared<K, T> sh;
  const int64_t r = blockIdx.x;
  const K *row = x + row_offset(g, r);
  const int L = (int)g.L, need_total = (int)(j0 + cnt);
  constexpr int KB = 8 * (int)sizeof(K);
  /* raw bits -> order-preserving key, complemented for descending */
  auto key = [&](K raw) -> K { const K k = key_at<K>(&raw, dt, 0); return desc ? (K)~k : k; };
  K prefix = 0, mask = 0;
  int shift = KB, below = 0, matching = L, need = need_total;
  while (shift > 0 && below + matching > kSelSlots) {
    const int bits = shift < kSelBits ? shift : kSelBits;
    shift -= bits;
    const int nb = 1 << bits;
    for (int b = threadIdx.x; b < nb; b += T) sh.hist[b] = 0;
    __syncthreads();
    for_row<K, T>(row, g.st, L, vec, [&](int, K raw) {
      const K k = key(raw);
      if ((k & mask) == prefix) atomicAdd(&sh.hist[(int)((k >> shift) & (K)(nb - 1))], 1);
    });
    __syncthreads();
    /* the bin holding the need-th smallest: thread t owns bins [t per, (t + 1) per) */
    const int per = nb > T ? nb / T : 1, b0 = threadIdx.x * per;
    int mine = 0;
    for (int b = b0; b < b0 + per && b < nb; b++) mine += sh.hist[b];
    int excl;
    cub::BlockScan<int, T>(sh.scan).ExclusiveSum(mine, excl);
    if (excl < need && need <= excl + mine) {
      int c = excl, b = b0;
      while (c + sh.hist[b] < need) c += sh.hist[b++];
      sh.bin = b; sh.before = c; sh.count = sh.hist[b];
    }
    __syncthreads();
    below += sh.before;
    need -= sh.before;
    matching = sh.count;
    prefix |= (K)sh.bin << shift;
    mask |= (K)(nb - 1) << shift;
    __syncthreads();   /* hist and the results are rewritten by the next pass */
  }
  /* gather: every key whose leading bits are below the prefix, and those equal to it
   * (all of them when they fit; else, every bit being known, the first `need` by position) */
  if (threadIdx.x == 0) sh.n = 0;
  __syncthreads();
  const bool all = below + matching <= kSelSlots;
  for_row<K, T>(row, g.st, L, vec, [&](int j, K raw) {
    const K k = key(raw);
    const K m = k & mask;
    if (m < prefix || (all && m == prefix)) {
      const int at = atomicAdd(&sh.n, 1);
      sh.key[at] = k; sh.pos[at] = j;
    }
  });
  __syncthreads();
  if (!all) {   /* ties at the K-th key beyond the slots: the first `need` of them in index order */
    int taken = 0;
    for (int t0 = 0; t0 < L && taken < need; t0 += T) {
      const int j = t0 + threadIdx.x;
      K k = 0;
      bool eq = false;
      if (j < L) {
        k = key(row[(int64_t)j * g.st]);
        eq = k == prefix;
      }
      int at, tot;
      cub::BlockScan<int, T>(sh.scan).ExclusiveSum(eq ? 1 : 0, at, tot);
      if (eq && taken + at < need) { sh.key[below + taken + at] = k; sh.pos[below + taken + at] = j; }
      taken += tot;
      __syncthreads();
    }
    if (threadIdx.x == 0) sh.n = below + need;
    __syncthreads();
  }
  /* bitonic sort of the n gathered (key, position) pairs, padded to a power of two */
  const int n = sh.n;
  int P = 1;
  while (P < n) P <<= 1;
  for (int i = n + threadIdx.x; i < P; i += T) { sh.key[i] = (K)~(K)0; sh.pos[i] = INT_MAX; }
  __syncthreads();
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < P / 2; t += T) {
        const int i = 2 * t - (t & (stride - 1)), jn = i + stride;   /* the pair (i, i + stride) */
        const bool up = (i & size) == 0;
        const K ki = sh.key[i], kj = sh.key[jn];
        const int pi = sh.pos[i], pj = sh.pos[jn];
        if (sel_before(kj, pj, ki, pi) == up) { sh.key[i] = kj; sh.pos[i] = pj; sh.key[jn] = ki; sh.pos[jn] = pi; }
      }
      __syncthreads();
    }
  }
  for (int jj = threadIdx.x; jj < cnt; jj += T) {
    const int at = sh.pos[j0 + jj];
    const int64_t o = (r / g.inner) * cnt * g.inner + jj * g.inner + r % g.inner;
    idx[o] = at;
    if (vals) vals[o] = row[(int64_t)at * g.st];
  }
}

template <typename K>
int select_impl(const char *op, const em_tensor *a, int d, bool desc, int64_t j0, int64_t cnt, em_tensor *vals,
                em_tensor *idx) {
  int64_t rows;
  RowGeo g = row_geo(a, d, &rows);
  if (rows == 0 || cnt == 0) return 0;
  const int dev = a->device.index;
  if (em_use_device(dev, op)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  const K *x = (const K *)a->storage->data;
  const bool vec = g.rowmajor && (g.L * (int64_t)sizeof(K)) % 16 == 0 && ((uintptr_t)(x + g.off) & 15) == 0;
  K *v = vals ? (K *)em_data_ptr(vals) : nullptr;
  int64_t *ix = (int64_t *)em_data_ptr(idx);
  if (g.L >= 16384) select_rows<K, 1024><<<(unsigned)rows, 1024, 0, s>>>(x, a->dtype, g, desc, vec, j0, cnt, v, ix);
  else select_rows<K, 256><<<(unsigned)rows, 256, 0, s>>>(x, a->dtype, g, desc, vec, j0, cnt, v, ix);
  return em_launch_check(op);
}

/* ---- rows of at most 4096: one block sorts a whole row in shared memory ----
 * cub::BlockRadixSort on the row's keys (its own width) with 16-bit
 * positions as the payload: stable (an LSD radix sort of keys given in index
 * order), so ties keep input order; padding keys (all ones, positions past
 * the row) sort after every real key. Nothing goes through global memory but
 * the row read once and the window written once -- where the segmented sort
 * moved keys and positions through several global passes. median_nan: a row
 * whose largest key is NaN's (all ones) answers its first NaN, found by
 * counting the keys below it. */
constexpr int kBlockSortMax = 4096;

template <typename K, int T, int IPT>
__global__ void __launch_bounds__(T, 1024 / T) block_sort_rows(const K *x, int dt, RowGeo g, bool desc, int64_t j0, int64_t cnt,
                                                     bool median_nan, K *vals, int64_t *idx) {
  typedef cub::BlockRadixSort<K, T, IPT, uint16_t> Sort;
  __shared__ typename Sort::TempStorage tmp;
  __shared__ int below_top;
  const int64_t r = blockIdx.x;
  const K *row = x + row_offset(g, r);
  const int L = (int)g.L;
  const K top = (K)~(K)0;
  K keys[IPT];
  uint16_t pos[IPT];
  int mine = 0;
#pragma unroll
  for (int i = 0; i < IPT; i++) {   /* blocked: thread t holds positions t IPT .. t IPT + IPT - 1 */
    const int j = threadIdx.x * IPT + i;
    K k = top;
    if (j < L) {
      k = key_at<K>(row, dt, (int64_t)j * g.st);
      if (desc) k = (K)~k;
      mine += k != top;
    }
    keys[i] = k;
    pos[i] = (uint16_t)j;
  }
  if (median_nan) {
    if (threadIdx.x == 0) below_top = 0;
    __syncthreads();
    atomicAdd(&below_top, mine);
  }
  Sort(tmp).SortBlockedToStriped(keys, pos);   /* ends with a barrier: below_top is final */
  const int64_t s = median_nan && below_top < L ? below_top : j0;   /* a NaN row: its first NaN */
#pragma unroll
  for (int i = 0; i < IPT; i++) {   /* striped: item i of thread t is rank i T + t */
    const int64_t rank = (int64_t)i * T + threadIdx.x, jj = rank - s;
    if (jj < 0 || jj >= cnt) continue;
    const int64_t o = (r / g.inner) * cnt * g.inner + jj * g.inner + r % g.inner;
    idx[o] = pos[i];
    if (vals) vals[o] = row[(int64_t)pos[i] * g.st];
  }
}

template <typename K>
int block_sort_impl(const char *op, const em_tensor *a, int d, bool desc, int64_t j0, int64_t cnt, bool median_nan,
                    em_tensor *vals, em_tensor *idx) {
  int64_t rows;
  RowGeo g = row_geo(a, d, &rows);
  if (rows == 0 || cnt == 0) return 0;
  const int dev = a->device.index;
  if (em_use_device(dev, op)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  const K *x = (const K *)a->storage->data;
  K *v = vals ? (K *)em_data_ptr(vals) : nullptr;
  int64_t *ix = (int64_t *)em_data_ptr(idx);
  const unsigned grid = (unsigned)rows;
  if (g.L <= 1024) block_sort_rows<K, 128, 8><<<grid, 128, 0, s>>>(x, a->dtype, g, desc, j0, cnt, median_nan, v, ix);
  else if (g.L <= 2048) block_sort_rows<K, 256, 8><<<grid, 256, 0, s>>>(x, a->dtype, g, desc, j0, cnt, median_nan, v, ix);
  else block_sort_rows<K, 512, 8><<<grid, 512, 0, s>>>(x, a->dtype, g, desc, j0, cnt, median_nan, v, ix);
  return em_launch_check(op);
}

/* ---- unique ---- */

template <typename C>
__global__ void run_flags(const void *v, int dt, int64_t n, int64_t *flags) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    flags[i] = (i == 0 || !(load_as<C>(v, dt, i) == load_as<C>(v, dt, i - 1))) ? 1 : 0;   /* NaN != NaN */
}

/* inclusive run counts -> 0-based run ids; count = the last one + 1 */
__global__ void ids_from_counts(int64_t *ids, int64_t n, int64_t *count) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (i == n - 1) *count = ids[i];
    ids[i] -= 1;
  }
}

template <typename E>
__global__ void unique_scatter(const E *sorted, const int64_t *order, const int64_t *ids, int64_t n, E *vals,
                               int64_t *inverse, int64_t *starts) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t id = ids[i];
    if (i == 0 || ids[i - 1] != id) { vals[id] = sorted[i]; if (starts) starts[id] = i; }
    if (inverse) inverse[order[i]] = id;
  }
}

__global__ void run_lengths(const int64_t *starts, int64_t U, int64_t n, int64_t *counts) {
  for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < U; u += (int64_t)gridDim.x * blockDim.x)
    counts[u] = (u + 1 < U ? starts[u + 1] : n) - starts[u];
}

/* ---- bincount ---- */

constexpr int kSharedBins = 12288;   /* u32 counters: 48 KiB of shared memory */

__global__ void __launch_bounds__(kBlock) bincount_shared(const void *x, int dt, int64_t n, int nb,
                                                          unsigned long long *out) {
  __shared__ unsigned int h[kSharedBins];
  for (int b = threadIdx.x; b < nb; b += blockDim.x) h[b] = 0;
  __syncthreads();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    atomicAdd(&h[load_as<int64_t>(x, dt, i)], 1u);
  __syncthreads();
  for (int b = threadIdx.x; b < nb; b += blockDim.x)
    if (h[b]) atomicAdd(&out[b], (unsigned long long)h[b]);
}

template <typename W>
__global__ void bincount_global(const void *x, int dt, const W *w, int64_t n, W *out) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    atomicAdd(&out[load_as<int64_t>(x, dt, i)], w ? w[i] : (W)1);
}

/* bincount in one read (em_bincount_range_cuda): each block counts the values
 * that fall in [0, kSharedBins) in shared memory and keeps the min and max of
 * all of them; the engine reads the range to size the output (as it did with
 * a min and a max pass before) and copies the counts out when every value was
 * counted. 16-byte loads, two a thread in flight; counts are integers, so the
 * order of the adds does not matter. */
static_assert(kSharedBins == EM_BINCOUNT_BINS, "the engine sizes bincount's scratch by EM_BINCOUNT_BINS");

__global__ void bincount_range_init(unsigned long long *bins, long long *range) {
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < kSharedBins; b += gridDim.x * blockDim.x) bins[b] = 0;
  if (blockIdx.x == 0 && threadIdx.x == 0) { range[0] = LLONG_MAX; range[1] = LLONG_MIN; }
}

__device__ __forceinline__ void bincount_one(long long x, unsigned int *h, long long &lo, long long &hi) {
  lo = x < lo ? x : lo;
  hi = x > hi ? x : hi;
  if ((unsigned long long)x < (unsigned long long)kSharedBins) atomicAdd(&h[x], 1u);
}

template <typename T>
__device__ __forceinline__ void bincount_take(const uint4 &v, unsigned int *h, long long &lo, long long &hi) {
  const T *e = reinterpret_cast<const T *>(&v);
#pragma unroll
  for (int k = 0; k < (int)(16 / sizeof(T)); k++) bincount_one((long long)e[k], h, lo, hi);
}

template <typename T>
__global__ void __launch_bounds__(kBlock) bincount_range(const T *x, int64_t n, unsigned long long *bins,
                                                         long long *range) {
  __shared__ unsigned int h[kSharedBins];
  for (int b = threadIdx.x; b < kSharedBins; b += blockDim.x) h[b] = 0;
  __syncthreads();
  constexpr int V = 16 / sizeof(T);
  const uint4 *xv = reinterpret_cast<const uint4 *>(x);
  const int64_t nv = n / V, stride = (int64_t)gridDim.x * blockDim.x;
  long long lo = LLONG_MAX, hi = LLONG_MIN;
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + stride < nv; i += 2 * stride) {   /* two loads in flight before the first atomic */
    const uint4 a = __ldg(xv + i), b = __ldg(xv + i + stride);
    bincount_take<T>(a, h, lo, hi);
    bincount_take<T>(b, h, lo, hi);
  }
  if (i < nv) bincount_take<T>(__ldg(xv + i), h, lo, hi);
  if (blockIdx.x == 0)   /* the tail past the last whole vector */
    for (int64_t j = nv * V + threadIdx.x; j < n; j += blockDim.x) bincount_one((long long)x[j], h, lo, hi);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const long long l2 = __shfl_xor_sync(0xffffffffu, lo, o), h2 = __shfl_xor_sync(0xffffffffu, hi, o);
    lo = l2 < lo ? l2 : lo;
    hi = h2 > hi ? h2 : hi;
  }
  if ((threadIdx.x & 31) == 0) { atomicMin(&range[0], lo); atomicMax(&range[1], hi); }
  __syncthreads();
  for (int b = threadIdx.x; b < kSharedBins; b += blockDim.x)
    if (h[b]) atomicAdd(&bins[b], (unsigned long long)h[b]);
}

template <typename T>
void bincount_range_launch(const em_tensor *x, int64_t n, unsigned long long *bins, long long *range, int dev,
                           cudaStream_t s) {
  const int64_t nv = n / (16 / (int64_t)sizeof(T)), threads = (nv + 1) / 2;
  const int64_t blocks = (threads + kBlock - 1) / kBlock, cap = (int64_t)em_sm_count(dev) * 4;
  const unsigned grid = (unsigned)(blocks < 1 ? 1 : blocks < cap ? blocks : cap);
  bincount_range<T><<<grid, kBlock, 0, s>>>((const T *)em_data_ptr(x), n, bins,
                                                                                range);
}

/* ---- searchsorted ---- */

template <typename C>
__global__ void searchsorted_k(const void *seq, int sdt, const void *v, int vdt, int64_t nv, int64_t L, int64_t M,
                               bool one_row, bool right, int64_t *out) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t base = one_row ? 0 : (i / M) * L;
    const C x = load_as<C>(v, vdt, i);
    int64_t lo = 0, hi = L;
    while (lo < hi) {   /* PyTorch's bisection: a NaN value lands at the end */
      int64_t mid = lo + (hi - lo) / 2;
      C m = load_as<C>(seq, sdt, base + mid);
      if (right ? !(m > x) : !(m >= x)) lo = mid + 1; else hi = mid;
    }
    out[i] = lo;
  }
}

}  // namespace

/* EMBER_SORT_KEYS16 (read once): how one-row sorts of 16-bit keys store
 * them for CUB: "u16" (default) or "u32". 0, 1, or -1 with the error set. */
static int keys16_wide(const char *op) {
  static int mode = -1;
  if (mode < 0) {
    const char *env = getenv("EMBER_SORT_KEYS16");
    if (!env || !*env || strcmp(env, "u16") == 0) mode = 0;
    else if (strcmp(env, "u32") == 0) mode = 1;
    else return em_error("%s: expected EMBER_SORT_KEYS16 to be u16 or u32, got '%s'", op, env);
  }
  return mode;
}

extern "C" int em_sort_cuda(const char *op, const em_tensor *a, int dim, bool descending, int64_t j0, int64_t cnt,
                            bool median_nan, em_tensor *vals, em_tensor *idx) {
  const int64_t L = a->ndim ? a->shape[dim] : 1;
  if (!median_nan && j0 + cnt <= kSelMaxK && L <= INT32_MAX && em_numel(a) / (L > 0 ? L : 1) <= INT32_MAX) {
    switch (em_dtype_size(a->dtype)) {   /* a window within the first kSelMaxK: select, do not sort */
      case 1: return select_impl<uint8_t>(op, a, dim, descending, j0, cnt, vals, idx);
      case 2: return select_impl<uint16_t>(op, a, dim, descending, j0, cnt, vals, idx);
      case 4: return select_impl<uint32_t>(op, a, dim, descending, j0, cnt, vals, idx);
      default: return select_impl<uint64_t>(op, a, dim, descending, j0, cnt, vals, idx);
    }
  }
  if (L <= kBlockSortMax && em_numel(a) / (L > 0 ? L : 1) <= INT32_MAX) {
    switch (em_dtype_size(a->dtype)) {   /* short rows: each sorted by one block in shared memory */
      case 1: return block_sort_impl<uint8_t>(op, a, dim, descending, j0, cnt, median_nan, vals, idx);
      case 2: return block_sort_impl<uint16_t>(op, a, dim, descending, j0, cnt, median_nan, vals, idx);
      case 4: return block_sort_impl<uint32_t>(op, a, dim, descending, j0, cnt, median_nan, vals, idx);
      default: return block_sort_impl<uint64_t>(op, a, dim, descending, j0, cnt, median_nan, vals, idx);
    }
  }
  switch (em_dtype_size(a->dtype)) {
    case 1: return sort_impl<uint8_t>(op, a, dim, descending, j0, cnt, median_nan, vals, idx);
    case 2: {
      const int wide = em_numel(a) == L ? keys16_wide(op) : 0;   /* one row only */
      if (wide < 0) return -1;
      if (wide) return sort_impl<uint16_t, uint32_t>(op, a, dim, descending, j0, cnt, median_nan, vals, idx);
      return sort_impl<uint16_t>(op, a, dim, descending, j0, cnt, median_nan, vals, idx);
    }
    case 4: return sort_impl<uint32_t>(op, a, dim, descending, j0, cnt, median_nan, vals, idx);
    default: return sort_impl<uint64_t>(op, a, dim, descending, j0, cnt, median_nan, vals, idx);
  }
}

extern "C" int em_unique_ids_cuda(const char *op, const em_tensor *sorted, em_tensor *ids, em_tensor *count) {
  const int64_t n = em_numel(sorted);
  const int dev = sorted->device.index;
  if (em_use_device(dev, op)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  if (n == 0) return em_cuda_check(cudaMemsetAsync(em_data_ptr(count), 0, sizeof(int64_t), s), op, "cudaMemsetAsync");
  if (n > INT32_MAX) return em_error("%s: CUDA unique takes at most 2^31 - 1 elements, got %lld", op, (long long)n);
  size_t temp = 0;
  int64_t *idv = (int64_t *)em_data_ptr(ids);
  if (em_cuda_check(cub::DeviceScan::InclusiveSum(nullptr, temp, (const int64_t *)nullptr, (int64_t *)nullptr, (int)n, s),
                    op, "cub scan (temp size)"))
    return -1;
  int64_t total = (int64_t)(align256((size_t)n * sizeof(int64_t)) + temp);
  em_tensor *ws = em_empty(1, &total, EM_U8, sorted->device);
  if (!ws) return -1;
  int64_t *flags = (int64_t *)em_data_ptr(ws);
  void *tmp = (char *)em_data_ptr(ws) + align256((size_t)n * sizeof(int64_t));
  if (em_dtype_is_float(sorted->dtype))
    run_flags<double><<<em_grid(n, kBlock), kBlock, 0, s>>>(em_data_ptr(sorted), sorted->dtype, n, flags);
  else
    run_flags<int64_t><<<em_grid(n, kBlock), kBlock, 0, s>>>(em_data_ptr(sorted), sorted->dtype, n, flags);
  int rc = em_cuda_check(cub::DeviceScan::InclusiveSum(tmp, temp, flags, idv, (int)n, s), op, "cub scan");
  if (!rc) {
    ids_from_counts<<<em_grid(n, kBlock), kBlock, 0, s>>>(idv, n, (int64_t *)em_data_ptr(count));
    rc = em_launch_check(op);
  }
  em_tensor_release(ws);
  return rc;
}

extern "C" int em_unique_finish_cuda(const char *op, const em_tensor *sorted, const em_tensor *order,
                                     const em_tensor *ids, em_tensor *vals, em_tensor *inverse, em_tensor *counts) {
  const int64_t n = em_numel(sorted), U = em_numel(vals);
  if (n == 0) return 0;
  const int dev = sorted->device.index;
  if (em_use_device(dev, op)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  em_tensor *starts = counts ? em_empty(1, &U, EM_I64, sorted->device) : NULL;
  if (counts && !starts) return -1;
  int64_t *st = starts ? (int64_t *)em_data_ptr(starts) : nullptr;
  int64_t *inv = inverse ? (int64_t *)em_data_ptr(inverse) : nullptr;
  const int64_t *ov = (const int64_t *)em_data_ptr(order), *iv = (const int64_t *)em_data_ptr(ids);
  unsigned grid = em_grid(n, kBlock);
  switch (em_dtype_size(sorted->dtype)) {
    case 1: unique_scatter<uint8_t><<<grid, kBlock, 0, s>>>((const uint8_t *)em_data_ptr(sorted), ov, iv, n, (uint8_t *)em_data_ptr(vals), inv, st); break;
    case 2: unique_scatter<uint16_t><<<grid, kBlock, 0, s>>>((const uint16_t *)em_data_ptr(sorted), ov, iv, n, (uint16_t *)em_data_ptr(vals), inv, st); break;
    case 4: unique_scatter<uint32_t><<<grid, kBlock, 0, s>>>((const uint32_t *)em_data_ptr(sorted), ov, iv, n, (uint32_t *)em_data_ptr(vals), inv, st); break;
    default: unique_scatter<uint64_t><<<grid, kBlock, 0, s>>>((const uint64_t *)em_data_ptr(sorted), ov, iv, n, (uint64_t *)em_data_ptr(vals), inv, st); break;
  }
  if (counts && U > 0) run_lengths<<<em_grid(U, kBlock), kBlock, 0, s>>>(st, U, n, (int64_t *)em_data_ptr(counts));
  int rc = em_launch_check(op);
  em_tensor_release(starts);
  return rc;
}

extern "C" int em_bincount_cuda(const char *op, const em_tensor *x, const em_tensor *weights, em_tensor *out) {
  const int64_t n = em_numel(x), nb = em_numel(out);
  if (n == 0) return 0;
  const int dev = x->device.index;
  if (em_use_device(dev, op)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  const void *xv = em_data_ptr(x);
  if (!weights) {
    unsigned long long *o = (unsigned long long *)em_data_ptr(out);
    if (nb <= kSharedBins) {
      int64_t blocks = (n + kBlock - 1) / kBlock, cap = (int64_t)em_sm_count(dev) * 4;
      unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
      bincount_shared<<<grid, kBlock, 0, s>>>(xv, x->dtype, n, (int)nb, o);
    } else {
      bincount_global<unsigned long long><<<em_grid(n, kBlock), kBlock, 0, s>>>(xv, x->dtype, nullptr, n, o);
    }
  } else if (out->dtype == EM_F32) {
    bincount_global<float><<<em_grid(n, kBlock), kBlock, 0, s>>>(xv, x->dtype, (const float *)em_data_ptr(weights), n,
                                                                 (float *)em_data_ptr(out));
  } else {
    bincount_global<double><<<em_grid(n, kBlock), kBlock, 0, s>>>(xv, x->dtype, (const double *)em_data_ptr(weights),
                                                                  n, (double *)em_data_ptr(out));
  }
  return em_launch_check(op);
}

extern "C" int em_bincount_range_cuda(const char *op, const em_tensor *x, em_tensor *scratch) {
  const int64_t n = em_numel(x);
  if (((uintptr_t)em_data_ptr(x) & 15) || n / (16 / (int64_t)em_dtype_size(x->dtype)) > INT_MAX) return 1;
  const int dev = x->device.index;
  if (em_use_device(dev, op)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  unsigned long long *bins = (unsigned long long *)em_data_ptr(scratch);
  long long *range = (long long *)(bins + kSharedBins);
  bincount_range_init<<<(kSharedBins + kBlock - 1) / kBlock, kBlock, 0, s>>>(bins, range);
  switch (x->dtype) {
    case EM_I64: bincount_range_launch<int64_t>(x, n, bins, range, dev, s); break;
    case EM_I32: bincount_range_launch<int32_t>(x, n, bins, range, dev, s); break;
    case EM_U16: bincount_range_launch<uint16_t>(x, n, bins, range, dev, s); break;
    case EM_U8: bincount_range_launch<uint8_t>(x, n, bins, range, dev, s); break;
    default: return 1;
  }
  return em_launch_check(op);
}

extern "C" int em_searchsorted_cuda(const char *op, const em_tensor *seq, const em_tensor *values, bool right,
                                    em_tensor *out) {
  const int64_t nv = em_numel(values), L = seq->shape[seq->ndim - 1];
  if (nv == 0) return 0;
  const int dev = values->device.index;
  if (em_use_device(dev, op)) return -1;
  cudaStream_t s = em_cur_stream(dev);
  const bool one_row = seq->ndim == 1;
  const int64_t M = values->ndim ? values->shape[values->ndim - 1] : 1;
  unsigned grid = em_grid(nv, kBlock);
  if (em_dtype_is_float(seq->dtype) || em_dtype_is_float(values->dtype))
    searchsorted_k<double><<<grid, kBlock, 0, s>>>(em_data_ptr(seq), seq->dtype, em_data_ptr(values), values->dtype,
                                                   nv, L, M, one_row, right, (int64_t *)em_data_ptr(out));
  else
    searchsorted_k<int64_t><<<grid, kBlock, 0, s>>>(em_data_ptr(seq), seq->dtype, em_data_ptr(values), values->dtype,
                                                    nv, L, M, one_row, right, (int64_t *)em_data_ptr(out));
  return em_launch_check(op);
}
