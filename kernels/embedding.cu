/* Embedding: out[i, :] = w[ids[i], :] (a row gather), and its backward
 * gw[r, :] = sum of g[i, :] over the tokens i with ids[i] == r.
 *
 * Forward: no FLOPs; reads n rows of w and writes n rows (2·n·d·sizeof(T)
 * bytes). One warp per output row, 16-byte loads and stores (Packed128) when
 * the rows are 16-byte aligned, element copies otherwise. It is a raw copy,
 * so every dtype works.
 *
 * Backward, deterministic without sorting and without float atomics: block b
 * of B (B = 2 per SM) OWNS the vocabulary rows [lo_b, hi_b) and scans all n
 * ids in token order, 256 at a time; the ids it owns are compacted (in order)
 * into shared memory, and row r's tokens are added by warp (r - lo) % 8 of
 * that block only, in token order. Every gradient row is therefore summed by
 * one warp in the order the tokens appear: bit-identical across runs, however
 * many times an id repeats. The accumulator (gw itself, or an f32 scratch for
 * a bf16/f16 table, rounded into gw by each block at the end) is zeroed first
 * by cudaMemsetAsync (v1 zeroed it inside the kernel with 4-byte stores from
 * 2 blocks per SM: the dense 154 MB zeroing of a 50257 x 768 f32 table made
 * the backward ~0.45 ms).
 * Cost: B·n id reads (from L2: 264 x 8192 x 8 B = 17 MB at n = 8192 tokens),
 * one read of each g row, one read-modify-write of each touched gw row per
 * token, and the zeroing of the whole (rows, d) table (a dense gradient, as
 * PyTorch's). One heavily repeated id serialises on its warp: n repeats cost
 * n sequential row additions (~0.5 us each), fine for text.
 * That was v1 (scatter_kernel below, EMBER_EMBEDDING_BWD_OLD=1): 74 us for the
 * small model's 2048 tokens (H200), each token's row added as 24 dependent
 * 4-byte read-modify-writes a lane, plus the memset. v2 (scatter_rows_kernel)
 * keeps the ownership and the order, hence the bits, and writes each row
 * once from registers: see its comment. */
#include <type_traits>
#include "common.cuh"
#include "backend.h"

#define THREADS 256
#define WARPS (THREADS / 32)

/* ---------------- forward ---------------- */

template <typename E, typename I>
__global__ void gather_kernel(const I *ids, int64_t n, const E *w, int64_t rows, int64_t row_stride, int64_t d,
                              E *out, E poison, bool vec) {
  int lane = threadIdx.x & 31;
  int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5, nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
  constexpr int VEC = 16 / sizeof(E);
  for (int64_t i = warp; i < n; i += nwarps) {
    int64_t id = (int64_t)ids[i];
    E *dst = out + i * d;
    if (id < 0 || id >= rows) {
      for (int64_t j = lane; j < d; j += 32) dst[j] = poison;
      continue;
    }
    const E *src = w + id * row_stride;
    if (vec) {
      for (int64_t j = lane * VEC; j < d; j += 32 * VEC) store128(dst + j, load128(src + j));
    } else {
      for (int64_t j = lane; j < d; j += 32) dst[j] = src[j];
    }
  }
}

template <typename E, typename I>
static void launch_gather(const em_tensor *ids, const em_tensor *w, em_tensor *out, uint64_t poison_bits,
                          cudaStream_t s) {
  int64_t n = em_numel(ids), d = w->shape[1], rs = w->stride[0];
  const E *wp = (const E *)em_data_ptr(w);
  E *op = (E *)em_data_ptr(out);
  E poison;
  memcpy(&poison, &poison_bits, sizeof(E));
  bool vec = (d * (int64_t)sizeof(E)) % 16 == 0 && (rs * (int64_t)sizeof(E)) % 16 == 0 &&
             ((uintptr_t)wp & 15) == 0 && ((uintptr_t)op & 15) == 0;
  int64_t blocks = (n + WARPS - 1) / WARPS, cap = (int64_t)em_sm_count(w->device.index) * 16;
  gather_kernel<E, I><<<(unsigned)(blocks < cap ? (blocks < 1 ? 1 : blocks) : cap), THREADS, 0, s>>>(
      (const I *)em_data_ptr(ids), n, wp, w->shape[0], rs, d, op, poison, vec);
}

template <typename I>
static int gather_dispatch(const em_tensor *ids, const em_tensor *w, em_tensor *out, cudaStream_t s) {
  uint64_t pb = em_nan_bits(w->dtype);
  switch (em_dtype_size(w->dtype)) {
    case 1: launch_gather<uint8_t, I>(ids, w, out, pb, s); break;
    case 2: launch_gather<uint16_t, I>(ids, w, out, pb, s); break;
    case 4: launch_gather<uint32_t, I>(ids, w, out, pb, s); break;
    case 8: launch_gather<uint64_t, I>(ids, w, out, pb, s); break;
    default: return em_error("embedding: unsupported dtype %s", em_dtype_name(w->dtype));
  }
  return em_launch_check("embedding");
}

extern "C" int em_embedding_fwd_cuda(const em_tensor *ids, const em_tensor *w, em_tensor *out) {
  if (em_numel(ids) == 0 || w->shape[1] == 0) return 0;
  cudaStream_t s = em_cur_stream(w->device.index);
  if (ids->dtype == EM_I64) return gather_dispatch<int64_t>(ids, w, out, s);
  if (ids->dtype == EM_I32) return gather_dispatch<int32_t>(ids, w, out, s);
  return em_error("embedding: CUDA ids must be i32 or i64, got %s", em_dtype_name(ids->dtype));
}

/* ---------------- backward ---------------- */

using acc::acc_t;   /* common.cuh */
using acc::ld;
using acc::st;

/* acc: the (rows, d) accumulator (gw itself when its dtype is the accumulator's, else scratch). */
template <typename G, typename W, typename I>
__global__ void __launch_bounds__(THREADS) scatter_kernel(const I *ids, int64_t n, const G *g, int64_t rows, int64_t d,
                                                          int64_t per_block, acc_t<W> *acc, W *gw) {
  using C = acc_t<W>;
  __shared__ int64_t list[THREADS];
  __shared__ int warp_count[WARPS];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t lo = blockIdx.x * per_block, hi = lo + per_block < rows ? lo + per_block : rows;
  if (lo >= hi) return;
  for (int64_t base = 0; base < n; base += THREADS) {
    int64_t i = base + threadIdx.x;
    int64_t id = i < n ? (int64_t)ids[i] : -1;
    bool mine = id >= lo && id < hi;
    unsigned ball = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) warp_count[warp] = __popc(ball);
    __syncthreads();
    int before = 0, total = 0;
    for (int k = 0; k < WARPS; k++) { before += k < warp ? warp_count[k] : 0; total += warp_count[k]; }
    if (mine) list[before + __popc(ball & ((1u << lane) - 1u))] = i;
    __syncthreads();
    for (int k = 0; k < total; k++) {
      int64_t tok = list[k], r = (int64_t)ids[tok];
      if ((int)((r - lo) % WARPS) != warp) continue;
      const G *src = g + tok * d;
      C *dst = acc + r * d;
      for (int64_t j = lane; j < d; j += 32) dst[j] += ld<C>(src[j]);
    }
    __syncthreads();
  }
  if (!std::is_same<W, C>::value)
    for (int64_t e = lo * d + threadIdx.x; e < hi * d; e += THREADS) gw[e] = st<W>(acc[e]);
}

/* v2 (resid16): the same sums without the memset and without a warp's
 * 24 dependent read-modify-writes per token. A block still owns rows [lo, hi)
 * and the tokens of each row are still added by one warp in token order from
 * 0 (so the bits are v1's), but: the block reads SCHUNK ids at once (8 a
 * thread, one block-wide scan to list its tokens in order), and each warp
 * then WRITES every row it owns once, a row's columns in registers (U chunks
 * of V a lane, all of a token's loads in flight together), zeros for rows no
 * token touched. Past SCHUNK ids the rows are written on the first pass and
 * read-modified-written where touched on the later ones (acc: gw, or an f32
 * scratch for a 16-bit table, rounded into gw at the end).
 * Bytes: the table written once (rows·d·sizeof(W)), each g row read once,
 * the ids read once a block from L2. Small model (10000 x 768 f32, 2048
 * tokens): 30.7 MB written + 6.3 MB read, ~10 us at 3.5 TB/s. */
#define SCHUNK 2048
#define SPER (SCHUNK / THREADS)

template <typename T, int N> struct alignas(sizeof(T) * N) VecT { T v[N]; };

template <typename G, typename W, typename I, int V, int U>
__global__ void __launch_bounds__(THREADS, 2) scatter_rows_kernel(const I *__restrict__ ids, int64_t n,
                                                               const G *__restrict__ g, int64_t rows, int64_t d,
                                                               int64_t per_block, acc_t<W> *__restrict__ acc,
                                                               W *__restrict__ gw) {
  using C = acc_t<W>;
  __shared__ int tok[SCHUNK], row[SCHUNK];
  __shared__ int wsum[WARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t lo = blockIdx.x * per_block, hi = lo + per_block < rows ? lo + per_block : rows;
  if (lo >= hi) return;
  for (int64_t c0 = 0; c0 == 0 || c0 < n; c0 += SCHUNK) {
    /* this block's tokens among ids [c0, c0 + SCHUNK), in token order */
    int64_t my[SPER];
    int cnt = 0;
#pragma unroll
    for (int k = 0; k < SPER; k++) {
      const int64_t i = c0 + (int64_t)threadIdx.x * SPER + k;
      my[k] = i < n ? (int64_t)ids[i] : -1;
      cnt += my[k] >= lo && my[k] < hi;
    }
    int incl = cnt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int t = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += t;
    }
    if (lane == 31) wsum[warp] = incl;
    __syncthreads();
    int pos = incl - cnt, total = 0;
    for (int k = 0; k < WARPS; k++) { pos += k < warp ? wsum[k] : 0; total += wsum[k]; }
#pragma unroll
    for (int k = 0; k < SPER; k++)
      if (my[k] >= lo && my[k] < hi) { tok[pos] = threadIdx.x * SPER + k; row[pos] = (int)(my[k] - lo); pos++; }
    __syncthreads();
    for (int64_t r = lo + warp; r < hi; r += WARPS) {
      const int rl = (int)(r - lo);
      bool touched = false;
      for (int k = 0; k < total && !touched; k++) touched = row[k] == rl;
      if (c0 > 0 && !touched) continue;               /* later passes: only rows this pass adds to */
      for (int64_t j0 = 0; j0 < d; j0 += 32 * V * U) {
        C a[U][V];
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int64_t j = j0 + ((int64_t)u * 32 + lane) * V;
#pragma unroll
          for (int e = 0; e < V; e++) a[u][e] = (C)0;
          if (c0 > 0 && j < d) {
            if constexpr (V > 1) {
              const VecT<C, V> q = *reinterpret_cast<const VecT<C, V> *>(acc + r * d + j);
#pragma unroll
              for (int e = 0; e < V; e++) a[u][e] = q.v[e];
            } else {
              a[u][0] = acc[r * d + j];
            }
          }
        }
        for (int k = 0; touched && k < total; k++) {
          if (row[k] != rl) continue;
          const G *src = g + (c0 + tok[k]) * d;
          VecT<G, V> q[U];
#pragma unroll
          for (int u = 0; u < U; u++) {
            const int64_t j = j0 + ((int64_t)u * 32 + lane) * V;
            if (j < d) q[u] = *reinterpret_cast<const VecT<G, V> *>(src + j);
          }
#pragma unroll
          for (int u = 0; u < U; u++) {
            const int64_t j = j0 + ((int64_t)u * 32 + lane) * V;
            if (j < d) {
#pragma unroll
              for (int e = 0; e < V; e++) a[u][e] += ld<C>(q[u].v[e]);
            }
          }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
          const int64_t j = j0 + ((int64_t)u * 32 + lane) * V;
          if (j >= d) continue;
          if (acc) {
            VecT<C, V> q;
#pragma unroll
            for (int e = 0; e < V; e++) q.v[e] = a[u][e];
            *reinterpret_cast<VecT<C, V> *>(acc + r * d + j) = q;
          } else {
            VecT<W, V> q;
#pragma unroll
            for (int e = 0; e < V; e++) q.v[e] = st<W>(a[u][e]);
            *reinterpret_cast<VecT<W, V> *>(gw + r * d + j) = q;
          }
        }
      }
    }
    __syncthreads();                                  /* the list is rewritten by the next pass */
  }
  if (acc && !std::is_same<W, C>::value)
    for (int64_t e = lo * d + threadIdx.x; e < hi * d; e += THREADS) gw[e] = st<W>(acc[e]);
}

/* v1, kept for an A/B (EMBER_EMBEDDING_BWD_OLD=1): the memset, then scatter_kernel. */
static int embedding_bwd_v1(const em_tensor *ids, const em_tensor *g, em_tensor *gw, cudaStream_t s) {
  int64_t n = em_numel(ids), rows = gw->shape[0], d = gw->shape[1];
  int dev = gw->device.index;
  int64_t blocks = (int64_t)em_sm_count(dev) * 2;
  if (blocks > rows) blocks = rows;
  int64_t per_block = (rows + blocks - 1) / blocks;
  blocks = (rows + per_block - 1) / per_block;
  em_tensor *scratch = NULL;
  bool direct = gw->dtype == EM_F32 || gw->dtype == EM_F64;
  if (!direct) {
    int64_t shape[2] = {rows, d};
    if (!(scratch = em_empty(2, shape, EM_F32, gw->device))) return -1;
  }
  void *acc = direct ? em_data_ptr(gw) : em_data_ptr(scratch);
  size_t acc_bytes = (size_t)(rows * d) * (gw->dtype == EM_F64 ? sizeof(double) : sizeof(float));
  int rc = em_cuda_check(cudaMemsetAsync(acc, 0, acc_bytes, s), "embedding backward", "cudaMemsetAsync");
  if (rc) { em_tensor_release(scratch); return -1; }
#define SCATTER(I)                                                                                         \
  EM_DISPATCH_FLOAT(g->dtype, G, {                                                                         \
    EM_DISPATCH_FLOAT(gw->dtype, W,                                                                        \
      scatter_kernel<G, W, I><<<(unsigned)blocks, THREADS, 0, s>>>((const I *)em_data_ptr(ids), n,          \
        (const G *)em_data_ptr(g), rows, d, per_block, (acc_t<W> *)acc, (W *)em_data_ptr(gw)));            \
  })
  if (ids->dtype == EM_I64) { SCATTER(int64_t); }
  else if (ids->dtype == EM_I32) { SCATTER(int32_t); }
  else rc = em_error("embedding backward: CUDA ids must be i32 or i64, got %s", em_dtype_name(ids->dtype));
#undef SCATTER
  if (rc == 0) rc = em_launch_check("embedding backward");
  em_tensor_release(scratch);   /* stream-ordered: the caching allocator reuses it only after the kernel */
  return rc;
}

template <typename G, typename W, typename I>
static void launch_rows(const em_tensor *ids, const em_tensor *g, em_tensor *gw, acc_t<W> *acc, int64_t blocks,
                        int64_t per_block, bool vect, cudaStream_t s) {
  int64_t n = em_numel(ids), rows = gw->shape[0], d = gw->shape[1];
  const I *ip = (const I *)em_data_ptr(ids);
  const G *gp = (const G *)em_data_ptr(g);
  W *wp = (W *)em_data_ptr(gw);
  constexpr int U = sizeof(acc_t<W>) == 8 ? 4 : 8;   /* a lane's columns in registers: 32 f32 (d <= 1024 in one go) */
  if (vect) scatter_rows_kernel<G, W, I, 4, U><<<(unsigned)blocks, THREADS, 0, s>>>(ip, n, gp, rows, d, per_block, acc, wp);
  else scatter_rows_kernel<G, W, I, 1, U><<<(unsigned)blocks, THREADS, 0, s>>>(ip, n, gp, rows, d, per_block, acc, wp);
}

static bool aligned(const void *p, size_t a) { return ((uintptr_t)p % a) == 0; }

extern "C" int em_embedding_bwd_cuda(const em_tensor *ids, const em_tensor *g, em_tensor *gw) {
  int64_t n = em_numel(ids), rows = gw->shape[0], d = gw->shape[1];
  if (rows == 0 || d == 0) return 0;
  int dev = gw->device.index;
  cudaStream_t s = em_cur_stream(dev);
  static const bool old = em_env_switch("EMBER_EMBEDDING_BWD_OLD", false);
  if (old || g->dtype != gw->dtype) return embedding_bwd_v1(ids, g, gw, s);   /* g has the table's dtype (autograd) */
  if (ids->dtype != EM_I64 && ids->dtype != EM_I32)
    return em_error("embedding backward: CUDA ids must be i32 or i64, got %s", em_dtype_name(ids->dtype));
  int64_t blocks = (int64_t)em_sm_count(dev) * 2;   /* one wave: 2 blocks of <= 128 registers a thread a SM */
  if (blocks > rows) blocks = rows;
  int64_t per_block = (rows + blocks - 1) / blocks;
  blocks = (rows + per_block - 1) / per_block;
  /* an accumulator across passes: gw itself when it is f32/f64, else f32 scratch (one pass needs none) */
  bool direct = gw->dtype == EM_F32 || gw->dtype == EM_F64;
  em_tensor *scratch = NULL;
  if (n > SCHUNK && !direct) {
    int64_t shape[2] = {rows, d};
    if (!(scratch = em_empty(2, shape, EM_F32, gw->device))) return -1;
  }
  void *acc = n <= SCHUNK ? NULL : direct ? em_data_ptr(gw) : em_data_ptr(scratch);
  size_t csz = gw->dtype == EM_F64 ? 8 : 4;
  bool vect = d % 4 == 0 && aligned(em_data_ptr(g), 4 * em_dtype_size(g->dtype)) &&
              aligned(em_data_ptr(gw), 4 * em_dtype_size(gw->dtype)) && (!acc || aligned(acc, 4 * csz));
  int rc = 0;
#define ROWS(I) \
  EM_DISPATCH_FLOAT(gw->dtype, W, launch_rows<W, W, I>(ids, g, gw, (acc_t<W> *)acc, blocks, per_block, vect, s))
  if (ids->dtype == EM_I64) { ROWS(int64_t); }
  else { ROWS(int32_t); }
#undef ROWS
  rc = em_launch_check("embedding backward");
  em_tensor_release(scratch);   /* stream-ordered: the caching allocator reuses it only after the kernel */
  return rc;
}

/* ---------------- embedding_bag: per-bag sums / means of rows ----------------
 * out[b, :] = sum over the ids k of bag b of w[ids[k], :] (mean: / max(count, 1)).
 * Bytes: each id's row read once (n·d·sizeof(T)), ids (8 B each), out written
 * once (B·d·sizeof(T)); one add per row element (no FLOP bound). One block
 * per bag; each thread owns a 16-byte chunk of the row (VEC elements) and
 * adds the bag's rows into f32 (f64 for f64) registers in id order, 4 rows'
 * loads in flight before their adds: a fixed order, so the sums are
 * bit-identical from run to run (no atomics). An out-of-range id makes the
 * bag's row NaN (embedding's poison row, summed). */
template <typename E, typename I, bool VECT>
__global__ void __launch_bounds__(THREADS) bag_fwd_kernel(const I *__restrict__ ids, const int64_t *__restrict__ offs,
                                                          int64_t L, int64_t n, int64_t B, const E *__restrict__ w,
                                                          int64_t rows, int64_t rs, int64_t d, E *__restrict__ out,
                                                          int mean) {
  using C = acc_t<E>;
  constexpr int VEC = VECT ? 16 / sizeof(E) : 1;
  const int64_t b = blockIdx.x;
  const int64_t lo = offs ? offs[b] : b * L, hi = offs ? (b + 1 < B ? offs[b + 1] : n) : lo + L;
  const C cnt = mean ? (C)(hi - lo > 1 ? hi - lo : 1) : (C)1;   /* mean: the sum / count, as sum(1) / L */
  for (int64_t j = (int64_t)threadIdx.x * VEC; j < d; j += (int64_t)blockDim.x * VEC) {
    C acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++) acc[e] = 0;
    bool bad = false;
    for (int64_t k0 = lo; k0 < hi; k0 += 4) {
      Packed128<E> v[4];
      E s[4];
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const int64_t k = k0 + u;
        if (k >= hi) break;
        const int64_t id = (int64_t)ids[k];
        if (id < 0 || id >= rows) { bad = true; continue; }
        if (VECT) v[u] = load128(w + id * rs + j);
        else s[u] = w[id * rs + j];
      }
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const int64_t k = k0 + u;
        if (k >= hi) break;
        const int64_t id = (int64_t)ids[k];
        if (id < 0 || id >= rows) continue;
        if (VECT) {
#pragma unroll
          for (int e = 0; e < VEC; e++) acc[e] += ld<C>(v[u][e]);
        } else {
          acc[0] += ld<C>(s[u]);
        }
      }
    }
    if (VECT) {
      Packed128<E> r;
#pragma unroll
      for (int e = 0; e < VEC; e++) r[e] = bad ? from_f32<E>(__int_as_float(0x7fc00000)) : st<E>(acc[e] / cnt);
      store128(out + b * d + j, r);
    } else {
      out[b * d + j] = bad ? from_f32<E>(__int_as_float(0x7fc00000)) : st<E>(acc[0] / cnt);
    }
  }
}

/* The threads per bag block: enough for one chunk each (a warp at least). */
static int bag_threads(int64_t chunks) {
  int64_t t = (chunks + 31) / 32 * 32;
  return (int)(t < 32 ? 32 : (t > THREADS ? THREADS : t));
}

extern "C" int em_embedding_bag_cuda(const em_tensor *ids, const em_tensor *offsets, const em_tensor *w, int mean,
                                     em_tensor *out) {
  const int64_t B = out->shape[0], d = w->shape[1], rows = w->shape[0], rs = w->stride[0], n = em_numel(ids);
  if (B == 0 || d == 0) return 0;
  cudaStream_t s = em_cur_stream(w->device.index);
  const int64_t L = offsets ? 0 : (ids->ndim == 2 ? ids->shape[1] : 0);
  const int64_t *op = offsets ? (const int64_t *)em_data_ptr(offsets) : NULL;
  const int64_t es = (int64_t)em_dtype_size(w->dtype);
  const bool vec = (d * es) % 16 == 0 && (rs * es) % 16 == 0 && ((uintptr_t)em_data_ptr(w) & 15) == 0 &&
                   ((uintptr_t)em_data_ptr(out) & 15) == 0;
  const int threads = bag_threads(vec ? d * es / 16 : d);
#define BAG(I)                                                                                                   \
  EM_DISPATCH_FLOAT(w->dtype, E, {                                                                             \
    if (vec) bag_fwd_kernel<E, I, true><<<(unsigned)B, threads, 0, s>>>((const I *)em_data_ptr(ids), op, L, n, B, \
        (const E *)em_data_ptr(w), rows, rs, d, (E *)em_data_ptr(out), mean);                                   \
    else bag_fwd_kernel<E, I, false><<<(unsigned)B, threads, 0, s>>>((const I *)em_data_ptr(ids), op, L, n, B,    \
        (const E *)em_data_ptr(w), rows, rs, d, (E *)em_data_ptr(out), mean);                                   \
  })
  if (ids->dtype == EM_I64) { BAG(int64_t); }
  else if (ids->dtype == EM_I32) { BAG(int32_t); }
  else return em_error("embedding_bag: CUDA ids must be i32 or i64, got %s", em_dtype_name(ids->dtype));
#undef BAG
  return em_launch_check("embedding_bag");
}

/* Backward's first half: gexp[k, :] = g[b, :] (· 1/count for mean) for each id k of bag b, so
 * em_embedding_bwd_cuda (deterministic, token order) adds them into gw. Block per bag. */
template <typename E>
__global__ void bag_expand_kernel(const int64_t *__restrict__ offs, int64_t L, int64_t n, int64_t B,
                                  const E *__restrict__ g, int64_t d, E *__restrict__ gexp, int mean) {
  using C = acc_t<E>;
  const int64_t b = blockIdx.x;
  const int64_t lo = offs ? offs[b] : b * L, hi = offs ? (b + 1 < B ? offs[b + 1] : n) : lo + L;
  const C cnt = (C)(hi - lo > 1 ? hi - lo : 1);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const E v = mean ? st<E>(ld<C>(g[b * d + j]) / cnt) : g[b * d + j];
    for (int64_t k = lo; k < hi; k++) gexp[k * d + j] = v;
  }
}

extern "C" int em_embedding_bag_expand_cuda(const em_tensor *offsets, int64_t L, const em_tensor *g, int mean,
                                            em_tensor *gexp) {
  const int64_t B = g->shape[0], d = g->shape[1], n = gexp->shape[0];
  if (B == 0 || d == 0 || n == 0) return 0;
  cudaStream_t s = em_cur_stream(g->device.index);
  const int64_t *op = offsets ? (const int64_t *)em_data_ptr(offsets) : NULL;
  const int threads = bag_threads(d);
  EM_DISPATCH_FLOAT(g->dtype, E,
    bag_expand_kernel<E><<<(unsigned)B, threads, 0, s>>>(op, L, n, B, (const E *)em_data_ptr(g), d,
                                                          (E *)em_data_ptr(gexp), mean));
  return em_launch_check("embedding_bag backward");
}
