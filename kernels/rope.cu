/* RoPE: rotate adjacent pairs of the last dim, y[2j] = x[2j]·c − x[2j+1]·s,
 * y[2j+1] = x[2j]·s + x[2j+1]·c, with (c, s) = (cos, ±sin)(p · theta^(−2j/d)).
 *
 * Cost: 6 FLOPs and one sin/cos pair per pair of elements; reads x and
 * writes y once (2·numel·sizeof(T) bytes) and the positions once per row:
 * memory bound when the sin/cos is cheap, which is the point of the trick.
 *
 * Launch: one warp per ROWS_PER_WARP consecutive rows of d, lanes over the
 * d/2 pairs; the first row's offset in x and y (any strides on the leading
 * dims: q/k arrive as transposed views, and y keeps x's layout) and in pos
 * (broadcast) is decoded once, later rows step from it.
 *
 * The trick: the angle p·inv_freq must be formed in double (positions reach
 * 1e5 and f32 would lose the phase), but double sin/cos costs ~20x a float
 * one. So the angle is formed and reduced modulo 2π in double (exact to
 * ~1e-16·|angle|), and only the reduced angle in [−π, π] goes through f32
 * sincosf: within ~2 ulps of the CPU's (float)cos(double) and no table, so no
 * host read of the position range. inv_freq = theta^(−2j/d) is computed on
 * the host in double and passed by value (d ≤ 512), as the CPU computes it.
 * f64 x uses double sincos throughout. */
#include <type_traits>
#include "common.cuh"
#include "backend.h"

#define THREADS 256
#define MAX_HALF 256
#define ROWS_PER_WARP 4

typedef struct {
  int nd;                          /* leading dims */
  int64_t shape[EM_MAX_DIMS];
  int64_t xs[EM_MAX_DIMS];         /* x strides of the leading dims */
  int64_t ys[EM_MAX_DIMS];         /* y strides of the leading dims (y's last dim is contiguous) */
  int64_t ps[EM_MAX_DIMS];         /* pos strides, 0 where broadcast */
} rope_geom;

typedef struct { double v[MAX_HALF]; } freq_table;

__device__ __forceinline__ void angle_cs(double a, float &c, float &s) {
  const double two_pi = 6.283185307179586476925286766559;
  double r = a - rint(a * (1.0 / two_pi)) * two_pi;
  sincosf((float)r, &s, &c);
}
__device__ __forceinline__ void angle_cs(double a, double &c, double &s) { sincos(a, &s, &c); }

template <typename T, typename C> __device__ __forceinline__ C ld(T x) { return (C)to_f32(x); }
template <> __device__ __forceinline__ double ld<double, double>(double x) { return x; }
template <typename T, typename C> __device__ __forceinline__ T st(C x) { return from_f32<T>((float)x); }
template <> __device__ __forceinline__ double st<double, double>(double x) { return x; }

template <typename T, typename C, typename P>
__global__ void __launch_bounds__(THREADS) rope_kernel(const T *x, const P *pos, rope_geom g, freq_table f,
                                                       int64_t rows, int64_t half, double theta, C sign, T *y) {
  // the table to shared memory: lanes read different entries, which from the
  // kernel-parameter (constant) bank would serialise 32 ways
  __shared__ double inv_s[MAX_HALF];
  for (int64_t j = threadIdx.x; j < half && j < MAX_HALF; j += blockDim.x) inv_s[j] = f.v[j];
  __syncthreads();
  int lane = threadIdx.x & 31;
  int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  int64_t row = warp * ROWS_PER_WARP;
  if (row >= rows) return;
  // decode the first row once (64-bit divisions are ~100 instructions each),
  // then step to the next rows like an odometer
  int64_t idx[EM_MAX_DIMS], xo = 0, yo = 0, po = 0, r = row;
#pragma unroll
  for (int k = EM_MAX_DIMS - 1; k >= 0; k--) {
    if (k >= g.nd) continue;
    idx[k] = r % g.shape[k];
    r /= g.shape[k];
    xo += idx[k] * g.xs[k]; yo += idx[k] * g.ys[k]; po += idx[k] * g.ps[k];
  }
  // offsets of this warp's rows first (odometer steps), so that the loads of
  // all its rows are in flight together: one row at a time left the kernel
  // waiting on memory latency (15 µs for 3 MB on an H100)
  int64_t xr_o[ROWS_PER_WARP], yr_o[ROWS_PER_WARP];
  double p[ROWS_PER_WARP];
  int nr = rows - row < ROWS_PER_WARP ? (int)(rows - row) : ROWS_PER_WARP;
#pragma unroll
  for (int q = 0; q < ROWS_PER_WARP; q++) {
    xr_o[q] = xo; yr_o[q] = yo;
    p[q] = q < nr ? (double)pos[po] : 0.0;
#pragma unroll
    for (int k = EM_MAX_DIMS - 1; k >= 0; k--) {
      if (k >= g.nd) continue;
      xo += g.xs[k]; yo += g.ys[k]; po += g.ps[k];
      if (++idx[k] < g.shape[k]) break;
      xo -= g.xs[k] * g.shape[k]; yo -= g.ys[k] * g.shape[k]; po -= g.ps[k] * g.shape[k];
      idx[k] = 0;
    }
  }
  for (int64_t j = lane; j < half; j += 32) {
    double inv = j < MAX_HALF ? inv_s[j] : pow(theta, -2.0 * (double)j / (double)(2 * half));
    C a[ROWS_PER_WARP], b[ROWS_PER_WARP];
#pragma unroll
    for (int q = 0; q < ROWS_PER_WARP; q++)
      if (q < nr) { a[q] = ld<T, C>(x[xr_o[q] + 2 * j]); b[q] = ld<T, C>(x[xr_o[q] + 2 * j + 1]); }
#pragma unroll
    for (int q = 0; q < ROWS_PER_WARP; q++) {
      if (q >= nr) continue;
      C c, sn;
      angle_cs(p[q] * inv, c, sn);
      sn = sign * sn;
      y[yr_o[q] + 2 * j] = st<T>(a[q] * c - b[q] * sn);
      y[yr_o[q] + 2 * j + 1] = st<T>(a[q] * sn + b[q] * c);
    }
  }
}

extern "C" int em_rope_cuda(const em_tensor *x, const em_tensor *pos, double theta, double sign, em_tensor *y) {
  int64_t d = x->shape[x->ndim - 1], half = d / 2, rows = em_shape_numel(x->ndim - 1, x->shape);
  if (rows == 0 || half == 0) return 0;
  rope_geom g;
  memset(&g, 0, sizeof g);
  g.nd = x->ndim - 1;
  for (int k = 0; k < g.nd; k++) { g.shape[k] = x->shape[k]; g.xs[k] = x->stride[k]; g.ys[k] = y->stride[k]; }
  em_broadcast_strides(pos, g.nd, x->shape, g.ps);
  freq_table f;
  for (int64_t j = 0; j < half && j < MAX_HALF; j++) f.v[j] = pow(theta, -2.0 * (double)j / (double)d);
  int64_t rows_per_block = (THREADS / 32) * ROWS_PER_WARP;
  int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (blocks > INT32_MAX) return em_error("rope: %lld rows exceed the launch limit", (long long)rows);
  cudaStream_t s = em_cur_stream(x->device.index);
#define ROPE(P)                                                                                              \
  EM_DISPATCH_FLOAT(x->dtype, T, {                                                                           \
    typedef typename std::conditional<std::is_same<T, double>::value, double, float>::type C;                \
    rope_kernel<T, C, P><<<(unsigned)blocks, THREADS, 0, s>>>((const T *)em_data_ptr(x),                      \
        (const P *)em_data_ptr(pos), g, f, rows, half, theta, (C)sign, (T *)em_data_ptr(y));                 \
  })
  if (pos->dtype == EM_I64) { ROPE(int64_t); }
  else if (pos->dtype == EM_I32) { ROPE(int32_t); }
  else return em_error("rope: CUDA positions must be i32 or i64, got %s", em_dtype_name(pos->dtype));
#undef ROPE
  return em_launch_check("rope");
}
