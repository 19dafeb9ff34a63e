/* Scatters staged in shared memory: the two em_index_plan shapes where
 * kernels/indexing.cu's one-thread-per-position walk spends its time on
 * scattered 2-4 byte writes and atomics into DRAM, rewritten as whole-row /
 * whole-slab passes (em_index_cuda tries these first).
 *
 * scatter / scatter-value along the last dim (scatter(1, i, src) of a
 * (R, L) x): one block per row of the walk. Each column's winner (the
 * largest index position j writing there: the last write in index order,
 * which is the CPU's serial result) is found with shared-memory atomicMax,
 * src's row is staged in shared memory, then the row of self is written
 * out whole and coalesced (an untouched column rewrites its own value).
 * Bytes: index + src + self read + self write, each once and coalesced,
 * against scattered 4-byte stores that fill partial sectors. Duplicates
 * become deterministic (last writer, as on the CPU) where they raced.
 *
 * scatter_add along dim 0 of a 2-D walk (scatter_add(0, i, src) into a
 * (D, C) x, gather's backward): a block owns W columns of self for all D
 * rows (D * W f32 accumulators in shared memory), reads the index and src
 * of its columns for every walk row, adds with shared-memory atomics, and
 * writes its slab once as self + the sums (self read there, coalesced). Global traffic: index + src + self read +
 * self write, no global atomics (they were random read-modify-writes of
 * 32-byte sectors, DRAM-bound once self outgrows L2). bf16/f16 accumulate
 * in f32 and round once (closer to the exact sum than an atomic rounding at
 * every add); the order of the adds stays unspecified, as before. (Long
 * columns split between two blocks at W = 8 measured slower on the H200,
 * docs/perf.md 2026-11-28, twelfth session.)
 *
 * scatter_add / index_add along the last dim (f32, bf16, f16) use the
 * row layout with f32 sums in shared memory in place of the winners.
 * Out of place (em_index_from_cuda), the kernels read x and write a fresh
 * out whole: the clone's two passes are gone.
 *
 * EMBER_IX_SMEM=0: the previous kernels (kernels/indexing.cu). */
#include "common.cuh"
#include "index_common.cuh"   /* scaled_f32(), load_idx() */
#include "backend.h"

#define SM_THREADS 512
#define SM_UNROLL 4                       /* index loads in flight per thread before its atomics */
#define ADD_UNROLL 8
#define SLAB_WB 8                         /* rows of self a thread loads before its stores (slab write-back) */
static const int kSmemMax = 200 * 1024;   /* of the 227 KB a block may opt into on sm_90 */

/* The followed index in [0, size) (negatives wrapped when the plan says so), or -1: skipped. */
__device__ __forceinline__ int sm_slot(int64_t ix, int64_t size, int wrap) {
  if (wrap && ix < 0) ix += size;
  return ix >= 0 && ix < size ? (int)ix : -1;
}

/* Byte offsets are int64 throughout: a handful of multiply-adds per 12-24 bytes moved. */
struct RowWalk {
  int nd;                                            /* dims before the last (outer dims of the walk) */
  int64_t shape[EM_MAX_DIMS], sst[EM_MAX_DIMS], ist[EM_MAX_DIMS], ost[EM_MAX_DIMS];
  int64_t m, L, ds, is, os;                          /* index row length; self's row length and stride; index's and src's last strides */
  int wrap, kind;
  double alpha;                                      /* SCATTER_ADD */
};

/* Block b's row: its offsets in self, index and src (the outer dims of the walk). */
__device__ __forceinline__ void row_offsets(const RowWalk &g, int64_t b, int64_t &so, int64_t &io, int64_t &oo) {
  so = 0; io = 0; oo = 0;
  for (int d = g.nd - 1; d >= 0; d--) {
    const int64_t c = b % g.shape[d];
    b /= g.shape[d];
    so += c * g.sst[d]; io += c * g.ist[d]; oo += c * g.ost[d];
  }
}

/* ---------------- scatter along the last dim ---------------- */

template <typename T, typename I>
__global__ void __launch_bounds__(SM_THREADS) scatter_row_kernel(RowWalk g, T *self, const T *from,
                                                                 const I *__restrict__ index,
                                                                 const T *__restrict__ other, T value) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int *win = reinterpret_cast<int *>(smem_raw);
  T *srow = reinterpret_cast<T *>(smem_raw + ((g.L * 4 + 15) / 16) * 16);
  int64_t so, io, oo;
  row_offsets(g, blockIdx.x, so, io, oo);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int m = (int)g.m, L = (int)g.L;
  for (int c = tid; c < L; c += nt) win[c] = -1;
  __syncthreads();
  const bool src = g.kind == EM_IX_SCATTER;
  for (int j0 = tid; j0 < m; j0 += nt * SM_UNROLL) {   /* indices and src loaded in a batch, then the atomics */
    int k[SM_UNROLL];                                  /* the target column, -1: none (out of range) */
    T v[SM_UNROLL];
#pragma unroll
    for (int u = 0; u < SM_UNROLL; u++) {
      const int j = j0 + u * nt;
      k[u] = j < m ? sm_slot((int64_t)index[io + j * g.is], g.L, g.wrap) : -1;
      if (src && j < m) v[u] = other[oo + j * g.os];
    }
#pragma unroll
    for (int u = 0; u < SM_UNROLL; u++) {
      const int j = j0 + u * nt;
      if (src && j < m) srow[j] = v[u];
      if (k[u] >= 0) atomicMax(win + k[u], j);
    }
  }
  __syncthreads();
#pragma unroll 4
  for (int c = tid; c < L; c += nt) {
    const int w = win[c];
    const int64_t o = so + c * g.ds;
    self[o] = w < 0 ? from[o] : g.kind == EM_IX_SCATTER ? srow[w] : value;
  }
}

/* scatter_add along the last dim (gather's backward along it): the row's sums in f32 shared-memory
 * accumulators (from -0, the identity of +), then the row written whole as self + sums. */
template <typename T, typename I>
__global__ void __launch_bounds__(SM_THREADS) add_row_kernel(RowWalk g, T *self, const T *from,
                                                             const I *__restrict__ index,
                                                             const T *__restrict__ other) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float *acc = reinterpret_cast<float *>(smem_raw);
  int64_t so, io, oo;
  row_offsets(g, blockIdx.x, so, io, oo);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int m = (int)g.m, L = (int)g.L;
  for (int c = tid; c < L; c += nt) acc[c] = -0.f;
  __syncthreads();
  for (int j0 = tid; j0 < m; j0 += nt * SM_UNROLL) {
    int k[SM_UNROLL];
    float v[SM_UNROLL];
#pragma unroll
    for (int u = 0; u < SM_UNROLL; u++) {
      const int j = j0 + u * nt;
      k[u] = -1; v[u] = 0.f;
      if (j < m) {
        k[u] = sm_slot((int64_t)index[io + j * g.is], g.L, g.wrap);
        v[u] = scaled_f32(other[oo + j * g.os], g.alpha);
      }
    }
#pragma unroll
    for (int u = 0; u < SM_UNROLL; u++)
      if (k[u] >= 0) atomicAdd(acc + k[u], v[u]);
  }
  __syncthreads();
#pragma unroll 4
  for (int c = tid; c < L; c += nt) {
    const int64_t o = so + c * g.ds;
    self[o] = from_f32<T>(to_f32(from[o]) + acc[c]);
  }
}

/* ---------------- the same two row passes, 16 bytes at a time ----------------
 * For contiguous rows (index, src and self read with stride 1 along the row,
 * rows aligned to 16 bytes; m and L multiples of VEC = 16 / sizeof(T)): the
 * indices arrive as 16-byte loads (load_idx), src as one 16-byte vector per
 * VEC positions, and the second pass reads VEC winners (or sums) as one or
 * more 16-byte shared loads, x as one 16-byte load and stores one 16-byte
 * vector, U vectors a thread loaded before the first store (in place, x and
 * self are one buffer: each thread reads then writes only its own vectors).
 * The element kernels spent ~25 instructions an element on 2-8 byte
 * accesses and 64-bit offsets: scatter (8192, 8192) along dim 1 ran at
 * 68 % (f32) and 51 % (bf16) of the bench's bytes. Same winners, same sums
 * (shared-memory atomics in an unspecified order, as there).
 * EMBER_IX_SMEM_VEC=0: the element kernels above. */
template <int VEC>
__device__ __forceinline__ void lds_vec(const int *p, int (&w)[VEC]) {   /* p 4 * VEC-byte aligned */
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int c = 0; c < VEC / 4; c++) {
      const int4 q = reinterpret_cast<const int4 *>(p)[c];
      w[4 * c] = q.x; w[4 * c + 1] = q.y; w[4 * c + 2] = q.z; w[4 * c + 3] = q.w;
    }
  } else {
    const int2 q = *reinterpret_cast<const int2 *>(p);
    w[0] = q.x; w[1] = q.y;
  }
}

/* Vectors in flight a thread: first pass (index + src: up to 32 bytes of indices), second pass (x: 4, or 2
 * for 8-16 elements a vector), so that three 512-thread blocks fit an SM's registers (40 a thread). */
template <int VEC, int IS> struct RowUnroll {
  static constexpr int in = VEC * IS >= 32 ? 1 : 32 / (VEC * IS), out = VEC >= 8 ? 2 : 4;
};

template <typename T, typename I>
__global__ void __launch_bounds__(SM_THREADS, 3) scatter_row_vec_kernel(RowWalk g, T *self, const T *from,
                                                                     const I *__restrict__ index,
                                                                     const T *__restrict__ other, T value) {
  constexpr int VEC = 16 / sizeof(T), VEC_UNROLL = RowUnroll<VEC, sizeof(I)>::in, VEC_UNROLL_OUT = RowUnroll<VEC, sizeof(I)>::out;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int *win = reinterpret_cast<int *>(smem_raw);
  T *srow = reinterpret_cast<T *>(smem_raw + ((g.L * 4 + 15) / 16) * 16);
  int64_t so, io, oo;
  row_offsets(g, blockIdx.x, so, io, oo);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int mv = (int)(g.m / VEC), lv = (int)(g.L / VEC), L = (int)g.L;
  for (int c = tid; c < L; c += nt) win[c] = -1;
  __syncthreads();
  const bool src = g.kind == EM_IX_SCATTER;
  const I *ip = index + io;
  for (int v0 = tid; v0 < mv; v0 += nt * VEC_UNROLL) {
    I ix[VEC_UNROLL][VEC];
    Packed128<T> x[VEC_UNROLL];
#pragma unroll
    for (int u = 0; u < VEC_UNROLL; u++) {
      const int v = v0 + u * nt;
      if (v < mv) {
        load_idx<I, VEC>(ip + (int64_t)v * VEC, ix[u]);
        if (src) x[u] = load128(other + oo + (int64_t)v * VEC);
      }
    }
#pragma unroll
    for (int u = 0; u < VEC_UNROLL; u++) {
      const int v = v0 + u * nt;
      if (v >= mv) continue;
      if (src) store128(srow + v * VEC, x[u]);
#pragma unroll
      for (int e = 0; e < VEC; e++) {
        const int k = sm_slot((int64_t)ix[u][e], g.L, g.wrap);
        if (k >= 0) atomicMax(win + k, v * VEC + e);
      }
    }
  }
  __syncthreads();
  for (int v0 = tid; v0 < lv; v0 += nt * VEC_UNROLL_OUT) {
    Packed128<T> f[VEC_UNROLL_OUT];
#pragma unroll
    for (int u = 0; u < VEC_UNROLL_OUT; u++)
      if (v0 + u * nt < lv) f[u] = load128(from + so + (int64_t)(v0 + u * nt) * VEC);
#pragma unroll
    for (int u = 0; u < VEC_UNROLL_OUT; u++) {
      const int v = v0 + u * nt;
      if (v >= lv) continue;
      int w[VEC];
      lds_vec<VEC>(win + v * VEC, w);
      Packed128<T> r;
#pragma unroll
      for (int e = 0; e < VEC; e++) r[e] = w[e] < 0 ? f[u][e] : src ? srow[w[e]] : value;
      store128(self + so + (int64_t)v * VEC, r);
    }
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(SM_THREADS, 3) add_row_vec_kernel(RowWalk g, T *self, const T *from,
                                                                 const I *__restrict__ index,
                                                                 const T *__restrict__ other) {
  constexpr int VEC = 16 / sizeof(T), VEC_UNROLL = RowUnroll<VEC, sizeof(I)>::in, VEC_UNROLL_OUT = RowUnroll<VEC, sizeof(I)>::out;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float *acc = reinterpret_cast<float *>(smem_raw);
  int64_t so, io, oo;
  row_offsets(g, blockIdx.x, so, io, oo);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int mv = (int)(g.m / VEC), lv = (int)(g.L / VEC), L = (int)g.L;
  for (int c = tid; c < L; c += nt) acc[c] = -0.f;
  __syncthreads();
  const I *ip = index + io;
  for (int v0 = tid; v0 < mv; v0 += nt * VEC_UNROLL) {
    I ix[VEC_UNROLL][VEC];
    Packed128<T> x[VEC_UNROLL];
#pragma unroll
    for (int u = 0; u < VEC_UNROLL; u++) {
      const int v = v0 + u * nt;
      if (v < mv) {
        load_idx<I, VEC>(ip + (int64_t)v * VEC, ix[u]);
        x[u] = load128(other + oo + (int64_t)v * VEC);
      }
    }
#pragma unroll
    for (int u = 0; u < VEC_UNROLL; u++) {
      if (v0 + u * nt >= mv) continue;
#pragma unroll
      for (int e = 0; e < VEC; e++) {
        const int k = sm_slot((int64_t)ix[u][e], g.L, g.wrap);
        if (k >= 0) atomicAdd(acc + k, scaled_f32(x[u][e], g.alpha));
      }
    }
  }
  __syncthreads();
  for (int v0 = tid; v0 < lv; v0 += nt * VEC_UNROLL_OUT) {
    Packed128<T> f[VEC_UNROLL_OUT];
#pragma unroll
    for (int u = 0; u < VEC_UNROLL_OUT; u++)
      if (v0 + u * nt < lv) f[u] = load128(from + so + (int64_t)(v0 + u * nt) * VEC);
#pragma unroll
    for (int u = 0; u < VEC_UNROLL_OUT; u++) {
      const int v = v0 + u * nt;
      if (v >= lv) continue;
      Packed128<T> r;
#pragma unroll
      for (int e = 0; e < VEC; e++) r[e] = from_f32<T>(to_f32(f[u][e]) + acc[v * VEC + e]);
      store128(self + so + (int64_t)v * VEC, r);
    }
  }
}

/* ---------------- scatter_add along dim 0: column slabs ---------------- */

struct SlabWalk {
  int64_t rows, cols, D;                             /* walk rows and columns; self's rows (dim_size) */
  int64_t ss, ds, is0, is1, os0, os1;                /* self's column and row strides; index's, src's strides */
  int lw, wrap;                                      /* log2 of the slab width W */
  int wb;                                            /* write-back SLAB_WB rows a thread at a time (EMBER_IX_SLAB_WB) */
  double alpha;
};

template <typename T, typename I>
__global__ void __launch_bounds__(1024) add_slab_kernel(SlabWalk g, T *self, const T *from,
                                                              const I *__restrict__ index,
                                                              const T *__restrict__ other) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float *acc = reinterpret_cast<float *>(smem_raw);  /* [D][W] */
  const int W = 1 << g.lw, tid = threadIdx.x, step = blockDim.x >> g.lw;
  const int w = tid & (W - 1);
  const int64_t c = (int64_t)blockIdx.x * W + w;
  const bool cok = c < g.cols;
  const int D = (int)g.D;
  /* the adds first, self joins at the end; -0 is the identity of + (an element nothing adds to keeps its -0.0) */
  for (int q = tid; q < (D << g.lw); q += blockDim.x) acc[q] = -0.f;
  __syncthreads();
  if (cok) {
    for (int64_t r0 = tid >> g.lw; r0 < g.rows; r0 += (int64_t)step * ADD_UNROLL) {
      int k[ADD_UNROLL];                               /* the target row, -1: none */
      float v[ADD_UNROLL];
#pragma unroll
      for (int u = 0; u < ADD_UNROLL; u++) {
        const int64_t r = r0 + (int64_t)u * step;
        k[u] = -1; v[u] = 0.f;
        if (r < g.rows) {
          k[u] = sm_slot((int64_t)index[r * g.is0 + c * g.is1], g.D, g.wrap);
          v[u] = scaled_f32(other[r * g.os0 + c * g.os1], g.alpha);
        }
      }
#pragma unroll
      for (int u = 0; u < ADD_UNROLL; u++)
        if (k[u] >= 0) atomicAdd(acc + (k[u] << g.lw) + w, v[u]);
    }
  }
  __syncthreads();
  /* self + sums, SLAB_WB rows a thread loaded before the first store: with `#pragma unroll 4` over
   * self[o] = from[o] + .. the compiler kept one load in flight (self and from may alias), ~4 KB an SM,
   * and this pass (8192 rows of W columns a block, one block an SM) ran ~32 dependent rounds. In place
   * each (r, c) is read and written by its one thread. EMBER_IX_SLAB_WB=0: one row at a time, as before. */
  if (!cok) return;
  if (!g.wb) {
    for (int r = tid >> g.lw; r < D; r += step) {
      const int64_t o = r * g.ds + c * g.ss;
      self[o] = from_f32<T>(to_f32(from[o]) + acc[(r << g.lw) + w]);
    }
    return;
  }
  for (int r0 = tid >> g.lw; r0 < D; r0 += step * SLAB_WB) {
    T f[SLAB_WB];
#pragma unroll
    for (int u = 0; u < SLAB_WB; u++) {
      const int r = r0 + u * step;
      if (r < D) f[u] = from[r * g.ds + c * g.ss];
    }
#pragma unroll
    for (int u = 0; u < SLAB_WB; u++) {
      const int r = r0 + u * step;
      if (r < D) self[r * g.ds + c * g.ss] = from_f32<T>(to_f32(f[u]) + acc[(r << g.lw) + w]);
    }
  }
}

/* ---------------- host side ---------------- */

/* index_add out of place, grouped by destination row (kernels/index_add_group.cu): 1 done, 0 not taken, -1 error. */
extern "C" int em_index_add_group_cuda(const char *op, const em_index_plan *p, em_tensor *self,
                                       const em_tensor *from, const em_tensor *index, const em_tensor *other);

template <typename K>
static int sm_launch_prep(K kernel, int smem, const char *op) {
  if (smem <= 48 * 1024) return 0;
  return em_cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), op,
                       "cudaFuncSetAttribute");
}

/* Do the rows fit the 16-byte kernels? Unit strides along the row (index, src, self), m and L multiples of
 * VEC, every row start (outer strides) a multiple of VEC elements, pointers 16-byte aligned; 2-8 byte
 * elements (u8's 16 indices a vector would spill registers). */
static bool rows_vec_ok(const em_index_plan *p, int es, const em_tensor *self, const em_tensor *from,
                        const em_tensor *index, const em_tensor *other, size_t is) {
  static const bool env = em_env_switch("EMBER_IX_SMEM_VEC", true);
  const int last = p->ndim - 1, vec = 16 / es;
  const bool src = other && p->kind != EM_IX_SCATTER_VALUE;
  if (!env || es < 2 || p->dim_stride != 1 || p->index_stride[last] != 1 || (src && p->other_stride[last] != 1)) return false;
  if (p->shape[last] % vec != 0 || p->dim_size % vec != 0) return false;
  for (int d = 0; d < last; d++)
    if (p->self_stride[d] % vec || p->index_stride[d] % vec || (src && p->other_stride[d] % vec)) return false;
  const uintptr_t a = (uintptr_t)em_data_ptr(self) | (uintptr_t)em_data_ptr(from) | (uintptr_t)em_data_ptr(index) |
                      (src ? (uintptr_t)em_data_ptr(other) : 0);
  return (a & 15) == 0 && is * (size_t)vec >= 8;
}

/* scatter / scatter-value / scatter_add (f32, bf16, f16) along the last dim: 1 launched, 0 not this shape, -1 error. */
template <typename I>
static int try_scatter_rows(const char *op, const em_index_plan *p, int64_t n, em_tensor *self, const em_tensor *from,
                            const em_tensor *index, const em_tensor *other, cudaStream_t s) {
  const int nd = p->ndim, last = nd - 1;
  const bool add = p->kind == EM_IX_SCATTER_ADD;
  if (p->kind == EM_IX_GATHER || nd < 1 || p->dim != last) return 0;   /* scatters only: a gather reads */
  if (add && self->dtype != EM_F32 && self->dtype != EM_BF16 && self->dtype != EM_F16) return 0;
  if ((p->kind == EM_IX_SCATTER || add) && !other) return 0;
  const int64_t m = p->shape[last], L = p->dim_size, es = (int64_t)em_dtype_size(self->dtype), rows = n / m;
  const int64_t smem = ((L * 4 + 15) / 16) * 16 + (p->kind == EM_IX_SCATTER ? m * es : 0);   /* winners or sums */
  /* a row of self is read and written whole: worth it when the index row covers a fair part of it */
  if (smem > kSmemMax || m * 4 < L || m >= ((int64_t)1 << 30) || p->dim_stride == 0 || rows > INT32_MAX) return 0;
  if (rows < em_sm_count(self->device.index) && n > 65536) return 0;
  RowWalk g;
  memset(&g, 0, sizeof g);
  g.nd = last;
  for (int d = 0; d < last; d++) {
    if (p->shape[d] > 1 && p->self_stride[d] == 0) return 0;   /* two rows of the walk on one row of self */
    if (from != self && p->shape[d] != self->shape[d]) return 0;   /* out of place: every row of self written */
    g.shape[d] = p->shape[d]; g.sst[d] = p->self_stride[d];
    g.ist[d] = p->index_stride[d]; g.ost[d] = other ? p->other_stride[d] : 0;
  }
  g.m = m; g.L = L; g.ds = p->dim_stride; g.is = p->index_stride[last]; g.os = other ? p->other_stride[last] : 0;
  g.wrap = p->wrap; g.kind = p->kind; g.alpha = p->alpha;
  const bool vec = rows_vec_ok(p, (int)es, self, from, index, other, sizeof(I));
  if (add) {
#define ROWADD(T)                                                                                            \
  do {                                                                                                       \
    auto k = vec ? add_row_vec_kernel<T, I> : add_row_kernel<T, I>;                                          \
    if (sm_launch_prep(k, (int)smem, op)) return -1;                                                         \
    k<<<(unsigned)rows, SM_THREADS, (size_t)smem, s>>>(g, (T *)em_data_ptr(self), (const T *)em_data_ptr(from), \
                                                       (const I *)em_data_ptr(index), (const T *)em_data_ptr(other)); \
  } while (0)
    if (self->dtype == EM_F32) ROWADD(float);
    else if (self->dtype == EM_BF16) ROWADD(__nv_bfloat16);
    else ROWADD(__half);
#undef ROWADD
    return 1;
  }
  uint64_t vb = 0;
  if (p->kind == EM_IX_SCATTER_VALUE) em_store_f64(&vb, self->dtype, 0, p->value);
  int rc = 0;
  em_by_width((size_t)es, [&](auto z) {
    using T = decltype(z);
    T value;
    memcpy(&value, &vb, sizeof(T));
    auto k = scatter_row_kernel<T, I>;
    if constexpr (sizeof(T) >= 2) if (vec) k = scatter_row_vec_kernel<T, I>;   /* u8: 16 indices a vector spill */
    if (sm_launch_prep(k, (int)smem, op)) { rc = -1; return; }
    k<<<(unsigned)rows, SM_THREADS, (size_t)smem, s>>>(g, (T *)em_data_ptr(self), (const T *)em_data_ptr(from),
                                                       (const I *)em_data_ptr(index),
                                                       other ? (const T *)em_data_ptr(other) : NULL, value);
  });
  return rc ? -1 : 1;
}

/* scatter_add along dim 0 of a 2-D walk, f32 / bf16 / f16: 1 launched, 0 not this shape, -1 error. */
template <typename I>
static int try_add_slabs(const char *op, const em_index_plan *p, int64_t n, em_tensor *self, const em_tensor *from,
                         const em_tensor *index, const em_tensor *other, cudaStream_t s) {
  if (p->kind != EM_IX_SCATTER_ADD || p->ndim != 2 || p->dim != 0 || !other) return 0;
  if (from != self && p->shape[1] != self->shape[1]) return 0;   /* out of place: every column of self written */
  if (self->dtype != EM_F32 && self->dtype != EM_BF16 && self->dtype != EM_F16) return 0;
  const int64_t D = p->dim_size, rows = p->shape[0], cols = p->shape[1];
  if (D * 4 * 4 > kSmemMax || rows * 4 < D) return 0;   /* self's slab read and written whole: enough adds into it */
  if (p->dim_stride == 0 || (cols > 1 && p->self_stride[1] == 0)) return 0;   /* positions of self must be distinct */
  const int sms = em_sm_count(self->device.index);
  int lw = 5;                                          /* W = 32 columns; narrower while the slab is large or blocks few */
  while (lw > 2 && (D * (4 << lw) > 96 * 1024 || (cols + (1 << lw) - 1) >> lw < 2 * sms)) lw--;
  const int64_t blocks = (cols + (1 << lw) - 1) >> lw;
  if (blocks < sms && n > 65536) return 0;             /* a few long column walks: the atomic kernel spreads better */
  SlabWalk g;
  g.rows = rows; g.cols = cols; g.D = D;
  g.ss = p->self_stride[1]; g.ds = p->dim_stride;
  g.is0 = p->index_stride[0]; g.is1 = p->index_stride[1]; g.os0 = p->other_stride[0]; g.os1 = p->other_stride[1];
  static const bool wb = em_env_switch("EMBER_IX_SLAB_WB", true);
  g.lw = lw; g.wrap = p->wrap; g.alpha = p->alpha; g.wb = wb;
  const int smem = (int)(D * (4 << lw));
  const int threads = smem > 96 * 1024 ? 1024 : 512;  /* one block an SM: all its threads on the one slab */
  int rc = 0;
#define SLAB(T)                                                                                            \
  do {                                                                                                     \
    auto k = add_slab_kernel<T, I>;                                                                        \
    if (sm_launch_prep(k, smem, op)) { rc = -1; break; }                                                   \
    k<<<(unsigned)blocks, threads, (size_t)smem, s>>>(g, (T *)em_data_ptr(self), (const T *)em_data_ptr(from), \
                                                         (const I *)em_data_ptr(index),                    \
                                                         (const T *)em_data_ptr(other));                   \
  } while (0)
  if (self->dtype == EM_F32) SLAB(float);
  else if (self->dtype == EM_BF16) SLAB(__nv_bfloat16);
  else SLAB(__half);
#undef SLAB
  return rc ? -1 : 1;
}

static int smem_run(const char *op, const em_index_plan *p, int64_t n, em_tensor *self, const em_tensor *from,
                    const em_tensor *index, const em_tensor *other) {
  static const bool env = em_env_switch("EMBER_IX_SMEM", true);
  if (!env || n <= 0 || (index->dtype != EM_I64 && index->dtype != EM_I32)) return 0;
  cudaStream_t s = em_cur_stream(self->device.index);
  if (index->dtype == EM_I64) {
    const int r = try_scatter_rows<int64_t>(op, p, n, self, from, index, other, s);
    return r ? r : try_add_slabs<int64_t>(op, p, n, self, from, index, other, s);
  }
  const int r = try_scatter_rows<int32_t>(op, p, n, self, from, index, other, s);
  return r ? r : try_add_slabs<int32_t>(op, p, n, self, from, index, other, s);
}

/* In place (self read and written): 1 launched (the caller checks the launch), 0 not a shape these kernels
 * take, -1 error set. */
extern "C" int em_index_smem_cuda(const char *op, const em_index_plan *p, int64_t n, em_tensor *self,
                                  const em_tensor *index, const em_tensor *other) {
  return smem_run(op, p, n, self, self, index, other);
}

/* backend.h: self = from with p applied, in one pass (from contiguous, of self's shape and dtype; self fresh). */
extern "C" int em_index_from_cuda(const char *op, const em_index_plan *p, em_tensor *self, const em_tensor *from,
                                  const em_tensor *index, const em_tensor *other) {
  const int64_t n = em_shape_numel(p->ndim, p->shape);
  if (!em_is_contiguous(from) || !em_is_contiguous(self) || from->dtype != self->dtype || from->ndim != self->ndim ||
      em_data_ptr(from) == em_data_ptr(self))
    return 0;
  for (int d = 0; d < self->ndim; d++) if (from->shape[d] != self->shape[d]) return 0;
  const int gr = em_index_add_group_cuda(op, p, self, from, index, other);   /* kernels/index_add_group.cu */
  if (gr) return gr;
  const int r = smem_run(op, p, n, self, from, index, other);
  return r <= 0 ? r : em_launch_check(op) ? -1 : 1;
}
