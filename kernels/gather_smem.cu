/* Gathers along the last dim with self's row staged in shared memory
 * (gather / take_along_dim (R, L) along dim 1; issue 12).
 *
 * Bytes: index (8 B an i64) + self's row (read once) + other (written once),
 * 16 B an f32 element, 0 FLOPs. gather_vec_kernel (indexing.cu) read self
 * with one 4-byte load per position at a random column of the row: each one
 * fetches a 32-byte sector from L2 and an SM's L1 holds only part of a
 * 32 KB row, so about 5x the row's bytes crossed from L2 per row and
 * (8192, 8192) f32 ran at 61 % of an H200 (bf16, 8 positions a sector, at
 * 77 %). Here one block per walk row: the row of self is loaded whole and
 * coalesced (16-byte vectors when aligned) into shared memory, then each
 * thread reads VEC = 16 / sizeof(T) indices (16-byte loads) and writes VEC
 * outputs as one 16-byte store; the random reads are shared-memory loads
 * (~3.5 wavefronts a warp on random banks: ~30 us of the SMs' shared-memory
 * time at (8192, 8192), under the DRAM time). Same values as the other
 * kernels (elements move as raw bits; an index outside [0, L) after the
 * wrap writes NaN, 0 for integers).
 *
 * Taken when: GATHER along the last dim, self's last stride 1, index and
 * other row-major contiguous over the walk, the index row a multiple of VEC
 * and at least L / 4 (the row's read pays off), the row at most 48 KB (no
 * shared-memory opt-in; 7 blocks an SM at 32 KB), enough rows to fill the
 * SMs. EMBER_IX_GATHER_SMEM=0: not taken (gather_vec_kernel). */
#include "common.cuh"
#include "index_common.cuh"   /* load_idx() */
#include "backend.h"

#define GS_THREADS 256
static const int64_t kRowBytes = 48 * 1024;

struct GatherWalk {
  int nd, wrap;                                  /* outer dims (before the last); negatives count from the end */
  int64_t shape[EM_MAX_DIMS], sst[EM_MAX_DIMS];  /* their sizes, self's strides */
  int64_t m, L;                                  /* index row length (a multiple of VEC); self's row length */
};

template <typename T, typename I>
__global__ void __launch_bounds__(GS_THREADS) gather_row_kernel(GatherWalk g, const T *__restrict__ self,
                                                                const I *__restrict__ index, T *__restrict__ other,
                                                                T poison) {
  constexpr int VEC = 16 / sizeof(T), U = VEC >= 8 ? 1 : 8 / VEC;   /* 8 indices a thread in flight */
  constexpr int SU = 4;                                              /* staging: 4 vectors a thread in flight */
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *srow = reinterpret_cast<T *>(smem_raw);
  int64_t so = 0, b = blockIdx.x;
  for (int d = g.nd - 1; d >= 0; d--) {
    so += (b % g.shape[d]) * g.sst[d];
    b /= g.shape[d];
  }
  const int L = (int)g.L, tid = threadIdx.x;
  const T *row = self + so;
  if (((uintptr_t)row & 15) == 0 && ((int64_t)L * (int64_t)sizeof(T)) % 16 == 0) {
    const uint4 *r4 = reinterpret_cast<const uint4 *>(row);
    uint4 *s4 = reinterpret_cast<uint4 *>(srow);
    const int n4 = (int)((int64_t)L * (int64_t)sizeof(T) / 16);
    for (int c0 = tid; c0 < n4; c0 += GS_THREADS * SU) {
      uint4 t[SU];
#pragma unroll
      for (int u = 0; u < SU; u++)
        if (c0 + u * GS_THREADS < n4) t[u] = __ldg(r4 + c0 + u * GS_THREADS);
#pragma unroll
      for (int u = 0; u < SU; u++)
        if (c0 + u * GS_THREADS < n4) s4[c0 + u * GS_THREADS] = t[u];
    }
  } else {
    for (int c = tid; c < L; c += GS_THREADS) srow[c] = row[c];
  }
  __syncthreads();
  const int64_t io = (int64_t)blockIdx.x * g.m;   /* index and other: row-major contiguous, m a row */
  const I *ip = index + io;
  T *op = other + io;
  const int nv = (int)(g.m / VEC);
  for (int v0 = tid; v0 < nv; v0 += GS_THREADS * U) {
    I ix[U][VEC];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (v0 + u * GS_THREADS < nv) load_idx<I, VEC>(ip + (int64_t)(v0 + u * GS_THREADS) * VEC, ix[u]);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int v = v0 + u * GS_THREADS;
      if (v >= nv) continue;
      Packed128<T> r;
#pragma unroll
      for (int e = 0; e < VEC; e++) {
        const I k = g.wrap && ix[u][e] < 0 ? ix[u][e] + (I)L : ix[u][e];
        const bool ok = k >= 0 && k < (I)L;
        const T x = srow[ok ? (int)k : 0];   /* branch-free: the VEC shared loads issue back to back */
        r[e] = ok ? x : poison;
      }
      store128(op + (int64_t)v * VEC, r);
    }
  }
}

template <typename I>
static void launch(const GatherWalk &g, unsigned rows, size_t smem, const em_tensor *self, const em_tensor *index,
                   em_tensor *other, cudaStream_t s) {
  const uint64_t pb = em_nan_bits(self->dtype);
  em_by_width(em_dtype_size(self->dtype), [&](auto z) {
    using T = decltype(z);
    T poison;
    memcpy(&poison, &pb, sizeof(T));
    gather_row_kernel<T, I><<<rows, GS_THREADS, smem, s>>>(g, (const T *)em_data_ptr(self), (const I *)em_data_ptr(index),
                                                          (T *)em_data_ptr(other), poison);
  });
}

/* 1 launched (the caller checks the launch), 0 not this shape (nothing launched). */
extern "C" int em_gather_smem_cuda(const em_index_plan *p, int64_t n, const em_tensor *self, const em_tensor *index,
                                   em_tensor *other) {
  static const bool env = em_env_switch("EMBER_IX_GATHER_SMEM", true);
  if (!env || p->kind != EM_IX_GATHER || !other || n <= 0 || p->ndim < 1 || p->dim != p->ndim - 1) return 0;
  if (index->dtype != EM_I64 && index->dtype != EM_I32) return 0;
  const int last = p->ndim - 1;
  const int64_t es = (int64_t)em_dtype_size(self->dtype), vec = 16 / es;
  const int64_t m = p->shape[last], L = p->dim_size, rows = n / m;
  if (p->dim_stride != 1 || L < 1 || L * es > kRowBytes || m % vec != 0 || m * 4 < L || rows > INT32_MAX) return 0;
  if (rows < em_sm_count(self->device.index) && n > 65536) return 0;
  int64_t want = 1;                       /* index and other: row-major contiguous over the walk */
  for (int k = last; k >= 0; k--) {
    if (p->shape[k] != 1 && (p->index_stride[k] != want || p->other_stride[k] != want)) return 0;
    want *= p->shape[k];
  }
  if (((uintptr_t)em_data_ptr(index) & 15) || ((uintptr_t)em_data_ptr(other) & 15)) return 0;
  GatherWalk g;
  memset(&g, 0, sizeof g);
  g.nd = last;
  g.wrap = p->wrap;
  for (int d = 0; d < last; d++) { g.shape[d] = p->shape[d]; g.sst[d] = p->self_stride[d]; }
  g.m = m;
  g.L = L;
  const size_t smem = (size_t)((L * es + 15) / 16 * 16);
  cudaStream_t s = em_cur_stream(self->device.index);
  if (index->dtype == EM_I64) launch<int64_t>(g, (unsigned)rows, smem, self, index, other, s);
  else launch<int32_t>(g, (unsigned)rows, smem, self, index, other, s);
  return 1;
}
