/* The gather behind repeat, tile, flip and roll (engine/ops/shape_ops.c):
 * out (contiguous) [i] = in[sum_d src_d(i_d) * in_stride[d]] with src_d the
 * identity, a flip (n - 1 - i) or a wrap ((i + off) mod n) per dim.
 *
 * Cost: 0 FLOPs; one element read and one written per output element (8 B
 * per f32 element). Memory-bound: the ceiling is the copy bandwidth.
 *
 * Launch shape: 256 threads, grid-stride; each thread owns 4 consecutive
 * output elements of the last dim (when its size is a multiple of 4): the
 * outer dims' source offset is computed once per 4 elements (one division
 * per dim), the last dim's source per element is an add (and a compare for
 * the wrap), and the 4 outputs go out as one 4-element store. The engine has
 * already dropped size-1 dims and merged identity dims (map_compress), so
 * the division chain is short. Indices are 32-bit whenever the output and
 * the input's span fit. Elements move as unsigned integers of their width:
 * no dtype conversion, any of the 9 dtypes. */
#include "common.cuh"
#include "dtype_io.cuh"   /* em_use_device */
#include "backend.h"

namespace {

constexpr int kThreads = 256;

struct MapArgs {
  int ndim;
  int64_t numel;
  int64_t out_size[EM_MAX_DIMS], in_size[EM_MAX_DIMS], in_stride[EM_MAX_DIMS], off[EM_MAX_DIMS];
  int kind[EM_MAX_DIMS];
};

template <typename I>
__device__ __forceinline__ I src_of(const MapArgs &m, int d, I i) {
  if (m.kind[d] == EM_MAP_FLIP) return (I)m.in_size[d] - 1 - i;
  if (m.kind[d] == EM_MAP_MOD) return (i + (I)m.off[d]) % (I)m.in_size[d];
  return i;
}

/* V elements of E stored as one access (16 B for 4-byte elements). */
template <typename E, int V> struct alignas(V * sizeof(E)) VecE { E v[V]; };

template <typename E, typename I, int V>
__global__ void __launch_bounds__(kThreads) dimmap_kernel(E *out, const E *in, MapArgs m) {
  const int last = m.ndim - 1;
  const I L = (I)m.out_size[last], S = (I)m.in_size[last], st = (I)m.in_stride[last];
  const I units = (I)(m.numel / V), step = (I)gridDim.x * blockDim.x;
  for (I u = (I)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += step) {
    const I i0 = u * V;
    I row = i0 / L, j = i0 - row * L, off = 0;
    for (int d = last - 1; d >= 0; d--) {
      I s = (I)m.out_size[d], q = row / s;
      off += src_of<I>(m, d, row - q * s) * (I)m.in_stride[d];
      row = q;
    }
    VecE<E, V> r;
    E *v = r.v;
    if (m.kind[last] == EM_MAP_FLIP) {
#pragma unroll
      for (int e = 0; e < V; e++) v[e] = in[off + (S - 1 - (j + e)) * st];
    } else if (m.kind[last] == EM_MAP_MOD) {
      I s0 = (j + (I)m.off[last]) % S;
#pragma unroll
      for (int e = 0; e < V; e++) {
        v[e] = in[off + s0 * st];
        if (++s0 == S) s0 = 0;
      }
    } else {
#pragma unroll
      for (int e = 0; e < V; e++) v[e] = in[off + (j + e) * st];
    }
    *reinterpret_cast<VecE<E, V> *>(out + i0) = r;
  }
}

template <typename E>
void launch(void *out, const void *in, const MapArgs &m, bool idx32, cudaStream_t s) {
  const int64_t L = m.out_size[m.ndim - 1];
  const bool four = L % 4 == 0 && ((uintptr_t)out % (4 * sizeof(E))) == 0;
  const unsigned grid = em_grid(four ? m.numel / 4 : m.numel, kThreads);
  E *o = (E *)out;
  const E *i = (const E *)in;
  if (four && idx32) dimmap_kernel<E, int32_t, 4><<<grid, kThreads, 0, s>>>(o, i, m);
  else if (four) dimmap_kernel<E, int64_t, 4><<<grid, kThreads, 0, s>>>(o, i, m);
  else if (idx32) dimmap_kernel<E, int32_t, 1><<<grid, kThreads, 0, s>>>(o, i, m);
  else dimmap_kernel<E, int64_t, 1><<<grid, kThreads, 0, s>>>(o, i, m);
}

}  // namespace

extern "C" int em_dimmap_cuda(const char *op, em_tensor *out, const em_tensor *in, const em_dimmap *mp) {
  const int64_t n = em_numel(out);
  if (n == 0) return 0;
  if (!em_is_contiguous(out) || out->dtype != in->dtype || mp->ndim < 1 || mp->ndim > EM_MAX_DIMS)
    return em_error("%s: internal error: gather into a mismatched output", op);
  if (!em_device_eq(out->device, in->device)) return em_error("%s: internal error: operands on two devices", op);
  const int dev = out->device.index;
  if (em_use_device(dev, op)) return -1;
  MapArgs m;
  memset(&m, 0, sizeof m);
  m.ndim = mp->ndim;
  m.numel = n;
  int64_t span = 0;
  for (int d = 0; d < mp->ndim; d++) {
    m.out_size[d] = mp->out_size[d]; m.in_size[d] = mp->in_size[d];
    m.in_stride[d] = mp->in_stride[d]; m.off[d] = mp->off[d]; m.kind[d] = mp->kind[d];
    span += (mp->in_size[d] - 1) * (mp->in_stride[d] < 0 ? -mp->in_stride[d] : mp->in_stride[d]);
  }
  /* the wrap adds off (< in_size) before its modulo: leave headroom for it */
  const bool idx32 = n <= (int64_t)INT32_MAX / 2 && span <= (int64_t)INT32_MAX / 2;
  cudaStream_t s = em_cur_stream(dev);
  void *o = em_data_ptr(out);
  const void *i = em_data_ptr(in);
  switch (em_dtype_size(in->dtype)) {
    case 1: launch<uint8_t>(o, i, m, idx32, s); break;
    case 2: launch<uint16_t>(o, i, m, idx32, s); break;
    case 4: launch<uint32_t>(o, i, m, idx32, s); break;
    default: launch<uint64_t>(o, i, m, idx32, s); break;
  }
  return em_launch_check(op);
}
