/* Indexing on CUDA: one gather/scatter kernel for every em_index_plan
 * (index_select, gather, scatter, scatter_add, index_add, one_hot).
 *
 * Gather/scatter: no FLOPs (scatter_add: one add per element); each position
 * reads one index and moves one element (gather: read self + write other;
 * scatter_add: read other + atomic read-modify-write of self). One thread per
 * position, grid-stride; a position's offsets come from its coordinates
 * (divmod over at most 8 dims). The decision that matters: offsets are
 * 32-bit whenever every tensor's extent fits (it nearly always does), since
 * 64-bit divmod costs several times more instructions than 32-bit; the kind
 * of a copy (gather / scatter / value) is a uniform runtime branch, the
 * element type is moved as raw bits of its size (1, 2, 4 or 8 bytes), so a
 * handful of instantiations cover every dtype. scatter_add adds with atomics
 * (f32, f64, bf16, f16 on sm_80+; i32, i64 wrap): duplicates accumulate, in
 * an unspecified order for floats. An index outside [0, dim_size) is never
 * followed: a gather writes NaN (0 for integers), a scatter skips.
 *
 * Gathers of whole contiguous rows (index_select of a contiguous x) take
 * rows_kernel instead: one 16-byte vector per thread, one division per
 * vector (32-bit when it fits), the row's index read once per vector
 * (cached). index_add of whole rows (f32, bf16, f16) takes rows_add_kernel:
 * the same walk with 16-byte vector atomics (EMBER_IX_ROWS_ADD=0: the
 * element kernel). Gathers, scatters and scatter_adds whose index and other
 * are contiguous with a last dim of 16-byte multiples take gather_vec_kernel
 * / add_vec_kernel: 16 bytes of positions per thread (EMBER_IX_GATHER_VEC=0:
 * the element kernels). t:index's plans wrap negative indices (plan.wrap).
 *
 * Scatters along the last dim and 2-D scatter_adds along dim 0 are staged in
 * shared memory first (kernels/scatter_smem.cu, EMBER_IX_SMEM=0: not), and so
 * are gathers along the last dim (kernels/gather_smem.cu, EMBER_IX_GATHER_SMEM=0: not).
 * masked_select and nonzero (stream compactions) live in kernels/compact.cu. */
#include <cub/cub.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/iterator/transform_output_iterator.h>
#include "common.cuh"
#include "index_common.cuh"   /* scaled(), load_idx() */
#include "backend.h"

#define THREADS 256

/* Scatters along the last dim and scatter_adds along dim 0, staged in shared memory: 1 ran, 0 not taken, -1 error. */
extern "C" int em_index_smem_cuda(const char *op, const em_index_plan *p, int64_t n, em_tensor *self,
                                  const em_tensor *index, const em_tensor *other);

/* Gathers along the last dim with self's row staged in shared memory (kernels/gather_smem.cu): 1 ran, 0 not taken. */
extern "C" int em_gather_smem_cuda(const em_index_plan *p, int64_t n, const em_tensor *self, const em_tensor *index,
                                   em_tensor *other);

/* ---------------- the gather/scatter walk ---------------- */

template <typename O>
struct Geo {
  int ndim;
  O shape[EM_MAX_DIMS], self_st[EM_MAX_DIMS], index_st[EM_MAX_DIMS], other_st[EM_MAX_DIMS];
  O dim_stride;
  int64_t dim_size;
  int wrap;                            /* negative indices count from the end */
};

/* The index as followed: negatives wrapped when the plan says so (t:index). */
__device__ __forceinline__ int64_t wrapped(int64_t ix, int64_t size, int wrap) { return wrap && ix < 0 ? ix + size : ix; }

/* Offsets of position l in self (without dim's part), index and other. */
template <typename O>
__device__ __forceinline__ void offsets(const Geo<O> &g, O l, O &so, O &io, O &oo) {
  so = 0; io = 0; oo = 0;
#pragma unroll
  for (int d = EM_MAX_DIMS - 1; d >= 0; d--) {
    if (d >= g.ndim) continue;
    O c = l % g.shape[d];
    l /= g.shape[d];
    so += c * g.self_st[d]; io += c * g.index_st[d]; oo += c * g.other_st[d];
  }
}

/* GATHER: other = self[..]; SCATTER: self[..] = other; SCATTER_VALUE: self[..] = value (T: raw bits). */
template <typename T, typename I, typename O>
__global__ void copy_kernel(Geo<O> g, O n, int kind, T *self, const I *index, T *other, T value, T poison) {
  for (O l = blockIdx.x * (O)blockDim.x + threadIdx.x; l < n; l += (O)gridDim.x * blockDim.x) {
    O so, io, oo;
    offsets(g, l, so, io, oo);
    int64_t ix = wrapped((int64_t)index[io], g.dim_size, g.wrap);
    bool ok = ix >= 0 && ix < g.dim_size;
    so += (O)ix * g.dim_stride;
    if (kind == EM_IX_GATHER) other[oo] = ok ? self[so] : poison;
    else if (!ok) continue;
    else if (kind == EM_IX_SCATTER) self[so] = other[oo];
    else self[so] = value;
  }
}

__device__ __forceinline__ void atomic_add(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double *p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(__nv_bfloat16 *p, __nv_bfloat16 v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(__half *p, __half v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(int32_t *p, int32_t v) { atomicAdd((int *)p, (int)v); }
__device__ __forceinline__ void atomic_add(int64_t *p, int64_t v) {
  atomicAdd((unsigned long long *)p, (unsigned long long)v);   /* two's complement: wraps like the CPU */
}

template <typename T, typename I, typename O>
__global__ void add_kernel(Geo<O> g, O n, T *self, const I *index, const T *other, double alpha) {
  for (O l = blockIdx.x * (O)blockDim.x + threadIdx.x; l < n; l += (O)gridDim.x * blockDim.x) {
    O so, io, oo;
    offsets(g, l, so, io, oo);
    int64_t ix = wrapped((int64_t)index[io], g.dim_size, g.wrap);
    if (ix < 0 || ix >= g.dim_size) continue;
    atomic_add(self + so + (O)ix * g.dim_stride, scaled(other[oo], alpha));
  }
}

/* The largest element offset a strided walk reaches (strides are non-negative in Ember). */
static int64_t extent(int ndim, const int64_t *shape, const int64_t *st) {
  int64_t e = 0;
  for (int d = 0; d < ndim; d++) e += (shape[d] - 1) * (st[d] < 0 ? -st[d] : st[d]);
  return e;
}

/* 32-bit offsets: every extent below 2^31, and positions below 2^30 so that a
 * grid-stride step (at most 2^29) never overflows. */
static bool fits32(const em_index_plan *p, int64_t n) {
  const int64_t lim = INT32_MAX;
  if (n >= (int64_t)1 << 30) return false;
  int64_t self_ext = extent(p->ndim, p->shape, p->self_stride) + (p->dim_size - 1) * p->dim_stride;
  return n < lim && self_ext < lim && extent(p->ndim, p->shape, p->index_stride) < lim &&
         extent(p->ndim, p->shape, p->other_stride) < lim;
}

template <typename O>
static Geo<O> geo(const em_index_plan *p) {
  Geo<O> g;
  memset(&g, 0, sizeof g);
  g.ndim = p->ndim;
  for (int d = 0; d < p->ndim; d++) {
    g.shape[d] = (O)p->shape[d]; g.self_st[d] = (O)p->self_stride[d];
    g.index_st[d] = (O)p->index_stride[d]; g.other_st[d] = (O)p->other_stride[d];
  }
  g.dim_stride = (O)p->dim_stride;
  g.dim_size = p->dim_size;
  g.wrap = p->wrap;
  return g;
}

/* ---------------- gathers and scatters with a contiguous last dim ----------------
 * A GATHER or SCATTER whose index and other are row-major contiguous over
 * the walk and whose last dim is either dim itself or contiguous in self
 * (gather / take_along_dim / scatter of contiguous tensors): VEC = 16 /
 * sizeof(T) consecutive positions per thread, one divmod walk for all of
 * them, the indices read as 16-byte vectors and other stored (gather) or
 * loaded (scatter) as one 16-byte vector (the element kernel moves 2-8
 * bytes per index read). The accesses to self stay scalar: they go
 * wherever the indices point. Same values as copy_kernel (NaN / 0 for an
 * out-of-range gather index, a skipped scatter; duplicate scatter writes
 * race as there). EMBER_IX_GATHER_VEC=0: the element kernel. */
template <typename T, typename I, typename O>
__global__ void __launch_bounds__(THREADS) gather_vec_kernel(Geo<O> g, O nvec, int kind, T *__restrict__ self,
                                                             const I *__restrict__ index, T *__restrict__ other,
                                                             T poison) {
  constexpr int VEC = 16 / sizeof(T);
  const O last = g.self_st[g.ndim - 1];   /* 1, or 0 when the last dim is dim */
  for (O v = blockIdx.x * (O)blockDim.x + threadIdx.x; v < nvec; v += (O)gridDim.x * blockDim.x) {
    O so, io, oo;
    offsets(g, v * (O)VEC, so, io, oo);
    I ix[VEC];
    load_idx<I, VEC>(index + io, ix);
    if (kind == EM_IX_GATHER) {
      Packed128<T> r;
#pragma unroll
      for (int e = 0; e < VEC; e++) {
        const int64_t k = wrapped((int64_t)ix[e], g.dim_size, g.wrap);
        r[e] = k >= 0 && k < g.dim_size ? self[so + (O)e * last + (O)k * g.dim_stride] : poison;
      }
      store128(other + oo, r);
    } else {                              /* SCATTER: other read as one vector; the writes go where the indices say */
      const Packed128<T> x = load128(other + oo);
#pragma unroll
      for (int e = 0; e < VEC; e++) {
        const int64_t k = wrapped((int64_t)ix[e], g.dim_size, g.wrap);
        if (k >= 0 && k < g.dim_size) self[so + (O)e * last + (O)k * g.dim_stride] = x[e];
      }
    }
  }
}

/* Does p fit gather_vec_kernel / add_vec_kernel (VEC elements of es bytes)? */
static bool gather_vec_ok(const em_index_plan *p, const em_tensor *index, const em_tensor *other, int es) {
  static const bool env = em_env_switch("EMBER_IX_GATHER_VEC", true);
  const int L = p->ndim - 1, vec = 16 / es;
  if (!env || p->kind == EM_IX_SCATTER_VALUE || !other || L < 0 || p->shape[L] % vec != 0) return false;
  if (L != p->dim && p->self_stride[L] != 1) return false;
  int64_t want = 1;                      /* index and other: row-major contiguous over the walk */
  for (int k = L; k >= 0; k--) {
    if (p->shape[k] != 1 && (p->index_stride[k] != want || p->other_stride[k] != want)) return false;
    want *= p->shape[k];
  }
  return ((uintptr_t)em_data_ptr(other) & 15) == 0 && ((uintptr_t)em_data_ptr(index) & 15) == 0;
}

/* SCATTER_ADD with the same geometry (scatter_add of contiguous tensors):
 * the indices and other read as 16-byte vectors, then VEC atomic adds
 * (fire-and-forget reductions) back to back. The same adds as add_kernel,
 * in an order that was unspecified there too. */
template <typename T, typename I, typename O>
__global__ void __launch_bounds__(THREADS) add_vec_kernel(Geo<O> g, O nvec, T *__restrict__ self,
                                                          const I *__restrict__ index, const T *__restrict__ other,
                                                          double alpha) {
  constexpr int VEC = 16 / sizeof(T);
  const O last = g.self_st[g.ndim - 1];
  for (O v = blockIdx.x * (O)blockDim.x + threadIdx.x; v < nvec; v += (O)gridDim.x * blockDim.x) {
    O so, io, oo;
    offsets(g, v * (O)VEC, so, io, oo);
    I ix[VEC];
    load_idx<I, VEC>(index + io, ix);
    const Packed128<T> x = load128(other + oo);
#pragma unroll
    for (int e = 0; e < VEC; e++) {
      const int64_t k = wrapped((int64_t)ix[e], g.dim_size, g.wrap);
      if (k >= 0 && k < g.dim_size) atomic_add(self + so + (O)e * last + (O)k * g.dim_stride, scaled(x[e], alpha));
    }
  }
}

template <typename T, typename I, typename O>
static void launch_copy(const em_index_plan *p, int64_t n, em_tensor *self, const em_tensor *index, em_tensor *other,
                        cudaStream_t s) {
  uint64_t vb = 0, pb = em_nan_bits(self->dtype);
  if (p->kind == EM_IX_SCATTER_VALUE) em_store_f64(&vb, self->dtype, 0, p->value);
  T value, poison;
  memcpy(&value, &vb, sizeof(T));
  memcpy(&poison, &pb, sizeof(T));
  if (gather_vec_ok(p, index, other, (int)sizeof(T))) {
    const int64_t nvec = n / (16 / (int64_t)sizeof(T));
    gather_vec_kernel<T, I, O><<<em_grid(nvec, THREADS), THREADS, 0, s>>>(geo<O>(p), (O)nvec, p->kind,
        (T *)em_data_ptr(self), (const I *)em_data_ptr(index), (T *)em_data_ptr(other), poison);
    return;
  }
  copy_kernel<T, I, O><<<em_grid(n, THREADS), THREADS, 0, s>>>(geo<O>(p), (O)n, p->kind, (T *)em_data_ptr(self),
      (const I *)em_data_ptr(index), other ? (T *)em_data_ptr(other) : NULL, value, poison);
}

template <typename I, typename O>
static int dispatch_offsets(const char *op, const em_index_plan *p, int64_t n, em_tensor *self,
                            const em_tensor *index, em_tensor *other, cudaStream_t s) {
  if (p->kind != EM_IX_SCATTER_ADD) {
    switch (em_dtype_size(self->dtype)) {
      case 1: launch_copy<uint8_t, I, O>(p, n, self, index, other, s); return 0;
      case 2: launch_copy<uint16_t, I, O>(p, n, self, index, other, s); return 0;
      case 4: launch_copy<uint32_t, I, O>(p, n, self, index, other, s); return 0;
      default: launch_copy<uint64_t, I, O>(p, n, self, index, other, s); return 0;
    }
  }
  Geo<O> g = geo<O>(p);
  unsigned grid = em_grid(n, THREADS);
  const I *ix = (const I *)em_data_ptr(index);
  const int es = (int)em_dtype_size(self->dtype);
  const bool vec = gather_vec_ok(p, index, other, es);
  const unsigned vgrid = em_grid(n / (16 / es), THREADS);
#define ADD(T)                                                                                                 \
  do {                                                                                                         \
    if (vec) add_vec_kernel<T, I, O><<<vgrid, THREADS, 0, s>>>(g, (O)(n / (16 / es)), (T *)em_data_ptr(self), ix, \
                                                              (const T *)em_data_ptr(other), p->alpha);        \
    else add_kernel<T, I, O><<<grid, THREADS, 0, s>>>(g, (O)n, (T *)em_data_ptr(self), ix,                      \
                                                      (const T *)em_data_ptr(other), p->alpha);                \
  } while (0)
  switch (self->dtype) {
    case EM_F32: ADD(float); return 0;
    case EM_F64: ADD(double); return 0;
    case EM_BF16: ADD(__nv_bfloat16); return 0;
    case EM_F16: ADD(__half); return 0;
    case EM_I32: ADD(int32_t); return 0;
    case EM_I64: ADD(int64_t); return 0;
    default:
      return em_error("%s: CUDA adds need f32, f64, bf16, f16, i32 or i64 (atomics), got %s", op,
                      em_dtype_name(self->dtype));
  }
#undef ADD
}

/* ---------------- gathers of whole rows (index_select) ----------------
 * A GATHER whose index varies along dim only, where the dims after dim are
 * contiguous rows in self and other is contiguous (index_select of a
 * contiguous x, embedding-style lookups), moves rows: each thread copies one
 * 16-byte vector, its row's offset from one division and the row's index.
 * An out-of-range index writes the row as NaN (0 for integers), as the
 * element kernel does. */
struct RowsPlan {
  int no, wrap;                        /* dims before dim; negative indices count from the end */
  int64_t oshape[EM_MAX_DIMS], ostride[EM_MAX_DIMS];   /* their sizes and self's strides (bytes) */
  int64_t nidx, idx_stride, dim_size, dim_stride;      /* dim_stride in bytes */
  int64_t vpr, rows;                   /* 16-byte vectors per row; output rows (outer x nidx) */
};

/* O: the type of the vector/row arithmetic; 32-bit (unsigned) whenever
 * rows * vpr < 2^31, so the two divisions per vector are the cheap ones. */
/* Output vector v of the row walk (vpr vectors a row, nidx rows an outer index): its column c (in vectors)
 * and the byte offset of self's indexed row; false when the (wrapped) index is out of range. */
template <typename I, typename O>
__device__ __forceinline__ bool row_at(const I *__restrict__ index, const RowsPlan &g, O v, O vpr, O nidx, O &c,
                                       int64_t &off) {
  const O R = v / vpr;
  c = v - R * vpr;
  O o = R / nidx;
  const O i = R - o * nidx;
  const int64_t id = wrapped((int64_t)index[(int64_t)i * g.idx_stride], g.dim_size, g.wrap);
  if (id < 0 || id >= g.dim_size) return false;
  off = id * g.dim_stride;
  for (int k = g.no - 1; k >= 0; k--) {
    const O q = o / (O)g.oshape[k];
    off += (int64_t)(o - q * (O)g.oshape[k]) * g.ostride[k];
    o = q;
  }
  return true;
}

template <typename I, typename O>
__global__ void __launch_bounds__(THREADS) rows_kernel(const char *__restrict__ self, const I *__restrict__ index,
                                                       uint4 *__restrict__ other, RowsPlan g, uint4 poison) {
  const O total = (O)(g.rows * g.vpr), vpr = (O)g.vpr, nidx = (O)g.nidx;
  for (O v = blockIdx.x * (O)blockDim.x + threadIdx.x; v < total; v += (O)gridDim.x * blockDim.x) {
    O c;
    int64_t off;
    other[v] = row_at(index, g, v, vpr, nidx, c, off) ? __ldg(reinterpret_cast<const uint4 *>(self + off) + c) : poison;
  }
}

/* index_add of whole rows (SCATTER_ADD with rows_plan's geometry: other
 * read contiguously, self's rows added at the indexed row): one 16-byte
 * vector of other per thread, added with vector atomics (sm_90: float4
 * red.global.v4.f32; bf16x2 / half2 pairs), 4x-8x fewer atomic operations
 * than one per element. Each element still gets one atomic add of
 * alpha * other, so the sums are the element kernel's (in an unspecified
 * order, as before). */
template <typename T> struct Vec16;
template <> struct Vec16<float> {
  static __device__ __forceinline__ void add(float *p, uint4 v, double a, bool) {
    float4 f = make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
    f.x = scaled(f.x, a); f.y = scaled(f.y, a); f.z = scaled(f.z, a); f.w = scaled(f.w, a);
    atomicAdd(reinterpret_cast<float4 *>(p), f);
  }
};
/* bf16 / f16: 8 values a vector. sm_90 adds all 16 bytes in one red.global.add.noftz.v4.{bf16x2,f16x2}
 * (as f32's float4): a quarter of the atomic operations of four pair atomics, which set index_add's
 * bf16 pace (the same time as f32 for half the bytes). v4 = false (EMBER_IX_RED_V4=0): the pairs. */
template <typename H, typename H2> struct Vec16Pairs {
  static __device__ __forceinline__ void add(H *p, uint4 v, double a, bool v4) {
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
      H2 h = *reinterpret_cast<const H2 *>(&w[k]);
      h.x = scaled(h.x, a); h.y = scaled(h.y, a);
      if (v4) w[k] = *reinterpret_cast<const uint32_t *>(&h);
      else atomicAdd(reinterpret_cast<H2 *>(p) + k, h);
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (v4) {
      if constexpr (std::is_same<H, __nv_bfloat16>::value)
        asm volatile("red.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]),
                     "r"(w[2]), "r"(w[3]) : "memory");
      else
        asm volatile("red.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]),
                     "r"(w[2]), "r"(w[3]) : "memory");
    }
#endif
  }
};
template <> struct Vec16<__nv_bfloat16> : Vec16Pairs<__nv_bfloat16, __nv_bfloat162> {};
template <> struct Vec16<__half> : Vec16Pairs<__half, __half2> {};

template <typename T, typename I, typename O>
__global__ void __launch_bounds__(THREADS) rows_add_kernel(char *__restrict__ self, const I *__restrict__ index,
                                                           const uint4 *__restrict__ other, RowsPlan g, double alpha,
                                                           bool v4) {
  const O total = (O)(g.rows * g.vpr), vpr = (O)g.vpr, nidx = (O)g.nidx;
  for (O v = blockIdx.x * (O)blockDim.x + threadIdx.x; v < total; v += (O)gridDim.x * blockDim.x) {
    O c;
    int64_t off;
    if (!row_at(index, g, v, vpr, nidx, c, off)) continue;
    Vec16<T>::add(reinterpret_cast<T *>(self + off + (int64_t)c * 16), __ldg(other + v), alpha, v4);
  }
}

template <typename T, typename I>
static void launch_rows_add(const RowsPlan &g, em_tensor *self, const em_tensor *index, const em_tensor *other,
                            double alpha, cudaStream_t s) {
  static const bool v4 = em_env_switch("EMBER_IX_RED_V4", true);
  const int64_t total = g.rows * g.vpr;
  const unsigned grid = em_grid(total, THREADS);
  if (total < ((int64_t)1 << 30))
    rows_add_kernel<T, I, uint32_t><<<grid, THREADS, 0, s>>>((char *)em_data_ptr(self), (const I *)em_data_ptr(index),
                                                             (const uint4 *)em_data_ptr(other), g, alpha, v4);
  else
    rows_add_kernel<T, I, int64_t><<<grid, THREADS, 0, s>>>((char *)em_data_ptr(self), (const I *)em_data_ptr(index),
                                                            (const uint4 *)em_data_ptr(other), g, alpha, v4);
}

/* index_add's row path: f32, bf16, f16 (the dtypes with 16-byte vector atomics). EMBER_IX_ROWS_ADD=0: the element kernel. */
static bool rows_add_ok(const em_tensor *self) {
  static const bool env = em_env_switch("EMBER_IX_ROWS_ADD", true);
  return env && (self->dtype == EM_F32 || self->dtype == EM_BF16 || self->dtype == EM_F16);
}

/* Is p a gather of whole rows that rows_kernel can move with aligned 16-byte vectors? */
static bool rows_plan(const em_index_plan *p, const em_tensor *self, const em_tensor *other, RowsPlan *g) {
  if ((p->kind != EM_IX_GATHER && !(p->kind == EM_IX_SCATTER_ADD && rows_add_ok(self))) || !other ||
      !em_is_contiguous(other))
    return false;
  const int d = p->dim, nd = p->ndim;
  const int64_t es = (int64_t)em_dtype_size(self->dtype);
  if (nd < 1 || d >= nd || d >= EM_MAX_DIMS) return false;
  for (int k = 0; k < nd; k++) if (k != d && p->index_stride[k] != 0) return false;
  int64_t inner = 1;
  for (int k = nd - 1; k > d; k--) {   /* self's dims after dim: row-major contiguous */
    if (p->shape[k] != 1 && p->self_stride[k] != inner) return false;
    inner *= p->shape[k];
  }
  if ((inner * es) % 16 != 0 || ((uintptr_t)em_data_ptr(self) & 15) || ((uintptr_t)em_data_ptr(other) & 15) ||
      (p->dim_stride * es) % 16 != 0)
    return false;
  memset(g, 0, sizeof *g);
  g->no = d;
  int64_t outer = 1;
  for (int k = 0; k < d; k++) {
    if ((p->self_stride[k] * es) % 16 != 0) return false;
    g->oshape[k] = p->shape[k]; g->ostride[k] = p->self_stride[k] * es;
    outer *= p->shape[k];
  }
  g->nidx = p->shape[d];
  g->idx_stride = p->index_stride[d];
  g->dim_size = p->dim_size;
  g->wrap = p->wrap;
  g->dim_stride = p->dim_stride * es;
  g->vpr = inner * es / 16;
  g->rows = outer * g->nidx;
  return g->vpr > 0;
}

template <typename I>
static int launch_rows(const RowsPlan &g, em_tensor *self, const em_tensor *index, em_tensor *other, cudaStream_t s) {
  uint64_t nb = em_nan_bits(self->dtype);
  const int64_t es = (int64_t)em_dtype_size(self->dtype);
  uint32_t w[4];
  unsigned char *b = (unsigned char *)w;
  for (int k = 0; k < 16; k++) b[k] = (unsigned char)(nb >> (8 * (k % es)));   /* little-endian NaN per element */
  uint4 poison = make_uint4(w[0], w[1], w[2], w[3]);
  const int64_t total = g.rows * g.vpr;
  const unsigned grid = em_grid(total, THREADS);
  /* 32-bit: total and a grid-stride step below 2^31 (em_grid caps the grid at ~2^21 blocks) */
  if (total < ((int64_t)1 << 30))
    rows_kernel<I, uint32_t><<<grid, THREADS, 0, s>>>((const char *)em_data_ptr(self), (const I *)em_data_ptr(index),
                                                      (uint4 *)em_data_ptr(other), g, poison);
  else
    rows_kernel<I, int64_t><<<grid, THREADS, 0, s>>>((const char *)em_data_ptr(self), (const I *)em_data_ptr(index),
                                                     (uint4 *)em_data_ptr(other), g, poison);
  return 0;
}

extern "C" int em_index_cuda(const char *op, const em_index_plan *p, em_tensor *self, const em_tensor *index,
                             em_tensor *other) {
  int64_t n = em_shape_numel(p->ndim, p->shape);
  if (n == 0) return 0;
  cudaStream_t s = em_cur_stream(self->device.index);
  RowsPlan rp;
  if ((index->dtype == EM_I64 || index->dtype == EM_I32) && rows_plan(p, self, other, &rp)) {
    const bool i64 = index->dtype == EM_I64;
    if (p->kind == EM_IX_GATHER) {
      if (i64) launch_rows<int64_t>(rp, self, index, other, s);
      else launch_rows<int32_t>(rp, self, index, other, s);
    } else if (self->dtype == EM_F32) {
      if (i64) launch_rows_add<float, int64_t>(rp, self, index, other, p->alpha, s);
      else launch_rows_add<float, int32_t>(rp, self, index, other, p->alpha, s);
    } else if (self->dtype == EM_BF16) {
      if (i64) launch_rows_add<__nv_bfloat16, int64_t>(rp, self, index, other, p->alpha, s);
      else launch_rows_add<__nv_bfloat16, int32_t>(rp, self, index, other, p->alpha, s);
    } else {
      if (i64) launch_rows_add<__half, int64_t>(rp, self, index, other, p->alpha, s);
      else launch_rows_add<__half, int32_t>(rp, self, index, other, p->alpha, s);
    }
    return em_launch_check(op);
  }
  if (em_gather_smem_cuda(p, n, self, index, other)) return em_launch_check(op);   /* kernels/gather_smem.cu */
  const int sm = em_index_smem_cuda(op, p, n, self, index, other);   /* kernels/scatter_smem.cu */
  if (sm) return sm < 0 ? -1 : em_launch_check(op);
  bool small = fits32(p, n);
  int rc;
  if (index->dtype == EM_I64)
    rc = small ? dispatch_offsets<int64_t, int32_t>(op, p, n, self, index, other, s)
               : dispatch_offsets<int64_t, int64_t>(op, p, n, self, index, other, s);
  else if (index->dtype == EM_I32)
    rc = small ? dispatch_offsets<int32_t, int32_t>(op, p, n, self, index, other, s)
               : dispatch_offsets<int32_t, int64_t>(op, p, n, self, index, other, s);
  else
    return em_error("%s: CUDA indices must be i32 or i64, got %s", op, em_dtype_name(index->dtype));
  return rc ? rc : em_launch_check(op);
}
