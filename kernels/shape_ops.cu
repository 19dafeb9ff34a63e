/* The gather behind repeat, tile, flip and roll (engine/ops/shape_ops.c):
 * out (contiguous) [i] = in[sum_d src_d(i_d) * in_stride[d]] with src_d the
 * identity, a flip (n - 1 - i) or a wrap ((i + off) mod n) per dim.
 *
 * Cost: 0 FLOPs; one element read and one written per output element (8 B
 * per f32 element). Memory-bound: the ceiling is the copy bandwidth.
 *
 * Launch shape: 256 threads, grid-stride; each thread owns V consecutive
 * output elements of the last dim, V = 16 bytes' worth (8 bf16, 4 f32, 16
 * u8; 4 f64: 32 bytes) when the last dim's size is a multiple of it, else 4,
 * else 1: the outer dims' source offset is computed once per V elements
 * (one division per dim) and the V outputs go out as one wide store. The
 * loads are wide too when the last dim is read forward or backward with
 * stride 1 from an aligned place (kLoadVec: identity, repeat, a roll by a
 * multiple of V; kLoadFlip: one vector, reversed in registers; kLoadShift: a
 * roll by any other amount, two aligned 16-byte vectors funnel-shifted by
 * the roll's remainder, the same for every thread); otherwise one load per
 * element (kLoadScalar, the path of every layout before; EMBER_DIMMAP_SCALAR=1
 * selects it always). The engine has already dropped size-1 dims and merged
 * identity dims (map_compress), so the division chain is short. Indices are
 * 32-bit whenever the output and the input's span fit. Elements move as
 * unsigned integers of their width: no dtype conversion, any of the 9 dtypes. */
#include <stdlib.h>
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

/* How a thread reads its V source elements of the last dim (uniform over the launch). */
enum { kLoadScalar, kLoadVec, kLoadFlip, kLoadShift };

/* Bytes [rb, rb + 16) of the 32 bytes a:b (rb in 1..15, the same in every
 * thread): whole words picked by selects, the rest by funnel shifts. */
__device__ __forceinline__ uint4 bytes_from_pair(uint4 a, uint4 b, int rb) {
  const uint32_t w[9] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, 0u};
  const int ws = rb >> 2;
  const unsigned sh = (unsigned)(rb & 3) * 8u;
  uint32_t s[5];
#pragma unroll
  for (int i = 0; i < 5; i++) s[i] = ws == 0 ? w[i] : ws == 1 ? w[i + 1] : ws == 2 ? w[i + 2] : w[i + 3];
  return make_uint4(__funnelshift_r(s[0], s[1], sh), __funnelshift_r(s[1], s[2], sh),
                    __funnelshift_r(s[2], s[3], sh), __funnelshift_r(s[3], s[4], sh));
}

template <typename E, typename I, int V>
__global__ void __launch_bounds__(kThreads) dimmap_kernel(E *out, const E *in, MapArgs m, int load) {
  typedef VecE<E, V> Vec;
  const int last = m.ndim - 1;
  const I L = (I)m.out_size[last], S = (I)m.in_size[last], st = (I)m.in_stride[last], offl = (I)m.off[last];
  const I units = (I)(m.numel / V), step = (I)gridDim.x * blockDim.x;
  for (I u = (I)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += step) {
    const I i0 = u * V;
    I row = i0 / L, j = i0 - row * L, off = 0;
    for (int d = last - 1; d >= 0; d--) {
      I s = (I)m.out_size[d], q = row / s;
      off += src_of<I>(m, d, row - q * s) * (I)m.in_stride[d];
      row = q;
    }
    Vec r;
    E *v = r.v;
    if (load == kLoadVec) {                    /* V elements from src, src % V == 0 and src + V <= S */
      const I src = m.kind[last] == EM_MAP_MOD ? (j + offl) % S : j;
      r = *reinterpret_cast<const Vec *>(in + off + src);
    } else if (load == kLoadFlip) {            /* in[S - 1 - j - e] = the vector at S - j - V, backwards */
      const Vec x = *reinterpret_cast<const Vec *>(in + off + (S - j - V));
#pragma unroll
      for (int e = 0; e < V; e++) v[e] = x.v[V - 1 - e];
    } else if (load == kLoadShift) {           /* 16-byte V: src % V == offl % V != 0, S % V == 0 */
      if constexpr (V * sizeof(E) == 16) {
        const I src = (j + offl) % S, rem = offl % V, a0 = src - rem, b0 = a0 + V == S ? 0 : a0 + V;
        const uint4 a = *reinterpret_cast<const uint4 *>(in + off + a0), b = *reinterpret_cast<const uint4 *>(in + off + b0);
        *reinterpret_cast<uint4 *>(v) = bytes_from_pair(a, b, (int)rem * (int)sizeof(E));
      }
    } else if (m.kind[last] == EM_MAP_FLIP) {
#pragma unroll
      for (int e = 0; e < V; e++) v[e] = in[off + (S - 1 - (j + e)) * st];
    } else if (m.kind[last] == EM_MAP_MOD) {
      I s0 = (j + offl) % S;
#pragma unroll
      for (int e = 0; e < V; e++) {
        v[e] = in[off + s0 * st];
        if (++s0 == S) s0 = 0;
      }
    } else {
#pragma unroll
      for (int e = 0; e < V; e++) v[e] = in[off + (j + e) * st];
    }
    *reinterpret_cast<Vec *>(out + i0) = r;
  }
}

/* The wide-load mode for V elements per thread, or kLoadScalar: the last dim
 * read with stride 1, every source offset a multiple of V (outer strides and
 * the pointer aligned to the vector), and the V elements inside the row. */
template <typename E, int V>
int load_mode(const void *in, const MapArgs &m) {
  const int last = m.ndim - 1;
  if constexpr (V == 1) return kLoadScalar;
  if (m.in_stride[last] != 1 || (uintptr_t)in % (V * sizeof(E)) != 0) return kLoadScalar;
  for (int d = 0; d < last; d++)
    if (m.in_stride[d] % V != 0) return kLoadScalar;
  const int64_t S = m.in_size[last];
  switch (m.kind[last]) {
    case EM_MAP_ID: return kLoadVec;                                 /* src = j, j % V == 0, j + V <= L <= S */
    case EM_MAP_FLIP: return S % V == 0 ? kLoadFlip : kLoadScalar;
    default:
      if (S % V != 0) return kLoadScalar;
      if (m.off[last] % V == 0) return kLoadVec;
      return V * sizeof(E) == 16 ? kLoadShift : kLoadScalar;
  }
}

/* ---------------- whole rows (issue 12) ----------------
 * When the last dim is read as is (identity, or a wrap by a multiple of its
 * size: repeat / tile along outer dims, flip / roll of outer dims), each
 * output row is a copy of one input row. dimmap_kernel found every 16-byte
 * vector's source by 2-3 divisions and a modulo and moved one vector a
 * thread, its store waiting on its load: repeat (512, 8192) by (16, 1) and
 * tile to (8192, 8192) ran at 54-57 % of an H200 (pure write: 78-85 %).
 * Here block (x, y) takes rows y, y + gridDim.y, ...: the row's source
 * offset once per row (the same for the whole block), then U vectors a
 * thread, all loaded before the first store. Bytes move as uint4: any dtype.
 *
 * Repeats of the outermost dim (repeat (512, 8192) by (16, 1): output rows
 * b + k * 512 all copy input row b): a block loads its vectors of source row
 * b once and stores them to `per` of those copies (reps / per blocks share a
 * row, adjacent in launch order, so the row is read from DRAM once and from
 * L2 after). One row a block reached 59 % there (tile, whose one source row
 * stays in L1, 90 %): the 16 MB input came back from DRAM about once per
 * copy, the 268 MB of output writes evicting it from L2 between copies.
 * EMBER_DIMMAP_REPS=0: one copy a block (per = reps = 1, the kernel before).
 * EMBER_DIMMAP_ROWS=0 (or EMBER_DIMMAP_SCALAR=1): dimmap_kernel. */
template <typename I, int U>
__global__ void __launch_bounds__(kThreads) dimmap_rows_kernel(uint4 *out, const char *in, MapArgs m, I base, I lv,
                                                               int es, int gx, int reps, int per) {
  const int last = m.ndim - 1;
  const int cb = (int)(blockIdx.x % (unsigned)gx), k0 = (int)(blockIdx.x / (unsigned)gx) * per;
  const int k1 = k0 + per < reps ? k0 + per : reps;
  const I c0 = (I)cb * (kThreads * U) + threadIdx.x;
  for (I row = blockIdx.y; row < base; row += gridDim.y) {
    I r = row, off = 0;
    for (int d = last - 1; d >= 0; d--) {
      const I sz = (I)m.out_size[d], q = r / sz;
      off += src_of<I>(m, d, r - q * sz) * (I)m.in_stride[d];
      r = q;
    }
    const uint4 *src = reinterpret_cast<const uint4 *>(in + (int64_t)off * es);
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const I c = c0 + u * kThreads;
      if (c < lv) v[u] = src[c];
    }
    for (int k = k0; k < k1; k++) {
      uint4 *dst = out + ((int64_t)row + (int64_t)k * base) * lv;
#pragma unroll
      for (int u = 0; u < U; u++) {
        const I c = c0 + u * kThreads;
        if (c < lv) dst[c] = v[u];
      }
    }
  }
}

/* The rows launch, or false when the plan is not its: the last dim read
 * forward from its start (stride 1; identity, or a wrap by a multiple of a
 * size equal to the output's), 16-byte rows and row offsets, aligned
 * pointers, at least 128 vectors a row (narrower rows would idle most of a
 * block: dimmap_kernel keeps them). */
bool launch_rows(void *out, const void *in, const MapArgs &m, int es, bool idx32, cudaStream_t s) {
  static const bool on = em_env_switch("EMBER_DIMMAP_ROWS", true);
  static const bool reps_on = em_env_switch("EMBER_DIMMAP_REPS", true);
  const int last = m.ndim - 1;
  const int64_t L = m.out_size[last], S = m.in_size[last];
  if (!on || m.in_stride[last] != 1 || (L * es) % 16 != 0 || (uintptr_t)out % 16 || (uintptr_t)in % 16) return false;
  if (!(m.kind[last] == EM_MAP_ID || (m.kind[last] == EM_MAP_MOD && S == L && m.off[last] % S == 0))) return false;
  for (int d = 0; d < last; d++)
    if ((m.in_stride[d] * es) % 16 != 0) return false;
  const int64_t lv = L * es / 16, rows = m.numel / L;
  if (lv < 128) return false;
  const int u = lv >= 4 * kThreads ? 4 : lv >= 2 * kThreads ? 2 : 1;
  const int64_t gx = (lv + (int64_t)kThreads * u - 1) / ((int64_t)kThreads * u);
  /* copies of the outermost dim: out rows b + k * base (k < reps) all read source row b */
  int64_t reps = 1;
  if (reps_on && last > 0 && m.kind[0] == EM_MAP_MOD && m.out_size[0] > m.in_size[0] &&
      m.out_size[0] % m.in_size[0] == 0 && m.off[0] % m.in_size[0] == 0)
    reps = m.out_size[0] / m.in_size[0];
  const int64_t base = rows / reps;
  /* up to 8 copies a block; fewer while that leaves under ~2000 blocks (two waves of 8 an SM) */
  int64_t per = reps < 8 ? reps : 8;
  while (per > 1 && gx * base * ((reps + per - 1) / per) < 2048) per = (per + 1) / 2;
  const int64_t gxx = gx * ((reps + per - 1) / per);
  if (gxx > INT32_MAX || reps > INT32_MAX) return false;
  const dim3 g((unsigned)gxx, (unsigned)(base < 65535 ? base : 65535));
  uint4 *o = (uint4 *)out;
  const char *i = (const char *)in;
  const int gxi = (int)gx, ri = (int)reps, pi = (int)per;
#define EM_ROWS(I)                                                                                          \
  do {                                                                                                      \
    if (u == 4) dimmap_rows_kernel<I, 4><<<g, kThreads, 0, s>>>(o, i, m, (I)base, (I)lv, es, gxi, ri, pi);      \
    else if (u == 2) dimmap_rows_kernel<I, 2><<<g, kThreads, 0, s>>>(o, i, m, (I)base, (I)lv, es, gxi, ri, pi); \
    else dimmap_rows_kernel<I, 1><<<g, kThreads, 0, s>>>(o, i, m, (I)base, (I)lv, es, gxi, ri, pi);             \
  } while (0)
  if (idx32) EM_ROWS(int32_t);
  else EM_ROWS(int64_t);
#undef EM_ROWS
  return true;
}

/* EMBER_DIMMAP_SCALAR=1: the kernel as it was before wide loads (4-element stores, a load per element). */
bool scalar_only() {
  static const bool on = em_env_switch("EMBER_DIMMAP_SCALAR", false);
  return on;
}

template <typename E, typename I, int V>
void launch_v(E *o, const E *i, const MapArgs &m, cudaStream_t s) {
  const int load = scalar_only() ? (int)kLoadScalar : load_mode<E, V>(i, m);
  dimmap_kernel<E, I, V><<<em_grid(m.numel / V, kThreads), kThreads, 0, s>>>(o, i, m, load);
}

template <typename E>
void launch(void *out, const void *in, const MapArgs &m, bool idx32, cudaStream_t s) {
  constexpr int VW = sizeof(E) >= 8 ? 4 : 16 / (int)sizeof(E);   /* 16 bytes (32 for 8-byte elements) */
  const int64_t L = m.out_size[m.ndim - 1];
  const bool wide = !scalar_only() && L % VW == 0 && (uintptr_t)out % (VW * sizeof(E)) == 0;
  const bool four = !wide && L % 4 == 0 && (uintptr_t)out % (4 * sizeof(E)) == 0;
  E *o = (E *)out;
  const E *i = (const E *)in;
  if (wide && idx32) launch_v<E, int32_t, VW>(o, i, m, s);
  else if (wide) launch_v<E, int64_t, VW>(o, i, m, s);
  else if (four && idx32) launch_v<E, int32_t, 4>(o, i, m, s);
  else if (four) launch_v<E, int64_t, 4>(o, i, m, s);
  else if (idx32) launch_v<E, int32_t, 1>(o, i, m, s);
  else launch_v<E, int64_t, 1>(o, i, m, s);
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
  if (!scalar_only() && launch_rows(o, i, m, (int)em_dtype_size(in->dtype), idx32, s)) return em_launch_check(op);
  switch (em_dtype_size(in->dtype)) {
    case 1: launch<uint8_t>(o, i, m, idx32, s); break;
    case 2: launch<uint16_t>(o, i, m, idx32, s); break;
    case 4: launch<uint32_t>(o, i, m, idx32, s); break;
    default: launch<uint64_t>(o, i, m, idx32, s); break;
  }
  return em_launch_check(op);
}
