/* RoPE: rotate adjacent pairs of the last dim, y[2j] = x[2j]·c − x[2j+1]·s,
 * y[2j+1] = x[2j]·s + x[2j+1]·c, with (c, s) = (cos, ±sin)(p · theta^(−2j/d)).
 *
 * Cost: 6 FLOPs a pair; reads x and writes y once (2·numel·sizeof(T) bytes)
 * and the positions once per row. The model's q or k, (4, 12, 512, 64) bf16,
 * is 3.1 MB each way: 1.9 µs at 3.35 TB/s. One sin/cos pair per pair of
 * elements (a double angle, its reduction and a float sincos: ~40
 * instruction slots) costs about as much time as the bytes, so it is
 * computed once per (row position, pair) and reused across heads.
 *
 * Launch (v3): x's leading dims split into the "head" dim (the largest dim
 * over which pos is broadcast: H for (B, H, T, d) with pos (T)) and the
 * others (B, T: the outer rows). A thread takes one 16-byte chunk of the pair
 * layout (8 bf16 = 4 pairs) of one outer row, computes the chunk's sin/cos
 * once, and rotates that chunk in HPT heads (h = g, g + G, ...: a warp's
 * lanes at one step cover neighbouring heads, contiguous in the (B, T, H, d)
 * memory of a transposed head view), all HPT loads issued before the first
 * use. Threads are ordered chunk, head group, outer row (128 a block). Offsets in 32-bit
 * arithmetic when every offset fits (the usual case), else 64-bit. Rows that
 * are not 16-byte aligned (odd pair counts, offsets) take one pair a thread.
 * Up to two tensors (q and k) in one launch: blocks [0, b0) do the first.
 * (v2 was one warp per four rows, a sin/cos per element pair per head and
 * scalar 2-element loads: 8.7 µs a call on the H100, 22% of bandwidth.)
 *
 * The per-pair arithmetic (angle, reduction, rotation) is rope_math.cuh's,
 * shared with the flash backward's rotating epilogues (the same bits).
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
#include "rope_math.cuh"

#define THREADS 128          /* the model's q or k: 384 blocks, ~3 an SM (256: 192 blocks, 1 or 2 an SM) */
#define MAX_HALF 256
#define HPT 4                      /* heads a thread rotates with one sin/cos of its chunk */

typedef struct {
  const void *x;
  void *y;
  int nd;                          /* outer (non-head) leading dims */
  int64_t shape[EM_MAX_DIMS];
  int64_t xs[EM_MAX_DIMS], ys[EM_MAX_DIMS], ps[EM_MAX_DIMS];
  int64_t H, xh, yh;               /* the head dim: extent and strides (1, 0, 0 when none) */
  int64_t G;                       /* head groups: ceil(H / HPT) */
  int64_t threads;                 /* outer rows · G · chunks */
  int64_t blocks;
} rope_side;

typedef struct {
  rope_side s[2];
  int64_t chunks;                  /* chunks of V elements a row */
  int64_t half;
} rope_geom;

typedef struct { double v[MAX_HALF]; } freq_table;

template <typename T, typename C> __device__ __forceinline__ C ld(T x) { return (C)to_f32(x); }
template <> __device__ __forceinline__ double ld<double, double>(double x) { return x; }
template <typename T, typename C> __device__ __forceinline__ T st(C x) { return from_f32<T>((float)x); }
template <> __device__ __forceinline__ double st<double, double>(double x) { return x; }

/* V elements: one 16-byte access when PK (the pointer is then 16-byte aligned), else V scalar ones. */
template <typename T, int V> struct chunk { T v[V]; };
template <typename T, int V, bool PK> __device__ __forceinline__ chunk<T, V> load_chunk(const T *p) {
  chunk<T, V> c;
  if constexpr (PK) {
    static_assert(V * sizeof(T) == 16, "a packed chunk is 16 bytes");
    Packed128<T> q = load128(p);
#pragma unroll
    for (int k = 0; k < V; k++) c.v[k] = q[k];
  } else {
#pragma unroll
    for (int k = 0; k < V; k++) c.v[k] = p[k];
  }
  return c;
}
template <typename T, int V, bool PK> __device__ __forceinline__ void store_chunk(T *p, const chunk<T, V> &c) {
  if constexpr (PK) {
    Packed128<T> q;
#pragma unroll
    for (int k = 0; k < V; k++) q[k] = c.v[k];
    store128(p, q);
  } else {
#pragma unroll
    for (int k = 0; k < V; k++) p[k] = c.v[k];
  }
}

template <typename T, typename C, typename P, typename I, int V, bool PK>
__global__ void __launch_bounds__(THREADS) rope_kernel(const P *__restrict__ pos, rope_geom g, freq_table f,
                                                       double theta, C sign) {
  // the table to shared memory: lanes read different entries, which from the
  // kernel-parameter (constant) bank would serialise
  __shared__ double inv_s[MAX_HALF];
  for (int64_t j = threadIdx.x; j < g.half && j < MAX_HALF; j += blockDim.x) inv_s[j] = f.v[j];
  __syncthreads();
  const int side = blockIdx.x < g.s[0].blocks ? 0 : 1;
  const rope_side &s = g.s[side];
  const I tid = (I)(blockIdx.x - (side ? g.s[0].blocks : 0)) * (I)THREADS + (I)threadIdx.x;
  if (tid >= (I)s.threads) return;
  const T *__restrict__ x = (const T *)s.x;
  T *__restrict__ y = (T *)s.y;
  I r = tid / (I)g.chunks;
  const I c = tid - r * (I)g.chunks;
  const I G = (I)s.G;
  I orow = r / G;
  const I hg = r - orow * G;
  I xo = c * V, yo = c * V, po = 0;
#pragma unroll
  for (int k = EM_MAX_DIMS - 1; k >= 0; k--) {
    if (k >= s.nd) continue;
    I q = orow / (I)s.shape[k], i = orow - q * (I)s.shape[k];
    orow = q;
    xo += i * (I)s.xs[k]; yo += i * (I)s.ys[k]; po += i * (I)s.ps[k];
  }
  // the loads of all this thread's heads first, so they are in flight together
  chunk<T, V> a[HPT];
#pragma unroll
  for (int k = 0; k < HPT; k++) {
    I h = hg + (I)k * G;
    if (h < (I)s.H) a[k] = load_chunk<T, V, PK>(x + xo + h * (I)s.xh);
  }
  const double p = (double)pos[po];
  C cs[V / 2], sn[V / 2];
#pragma unroll
  for (int e = 0; e < V / 2; e++) {
    int64_t j = (int64_t)c * (V / 2) + e;
    double inv = j < MAX_HALF ? inv_s[j] : rope::inv_freq(theta, j, 2 * g.half);
    rope::angle_cs(p, inv, cs[e], sn[e]);
    sn[e] = sign * sn[e];
  }
#pragma unroll
  for (int k = 0; k < HPT; k++) {
    I h = hg + (I)k * G;
    if (h >= (I)s.H) continue;
    chunk<T, V> b;
#pragma unroll
    for (int e = 0; e < V / 2; e++) {
      C u = ld<T, C>(a[k].v[2 * e]), w = ld<T, C>(a[k].v[2 * e + 1]);
      C y0, y1;
      rope::rotate(u, w, cs[e], sn[e], y0, y1);
      b.v[2 * e] = st<T>(y0);
      b.v[2 * e + 1] = st<T>(y1);
    }
    store_chunk<T, V, PK>(y + yo + h * (I)s.yh, b);
  }
}

/* Largest |offset| + 1 (elements) any index of t reaches through its strides. */
static int64_t span_of(int nd, const int64_t *shape, const int64_t *st) {
  int64_t m = 1;
  for (int k = 0; k < nd; k++) m += (shape[k] - 1) * (st[k] < 0 ? -st[k] : st[k]);
  return m;
}

/* x's leading dims split into the head dim (the largest over which pos is
 * broadcast, the innermost on ties) and the outer ones. */
static void side_init(rope_side *s, const em_tensor *x, const em_tensor *pos, em_tensor *y) {
  int lead = x->ndim - 1;
  int64_t ps[EM_MAX_DIMS];
  em_broadcast_strides(pos, lead, x->shape, ps);
  int hd = -1;
  for (int k = 0; k < lead; k++)
    if (ps[k] == 0 && x->shape[k] > 1 && (hd < 0 || x->shape[k] >= x->shape[hd])) hd = k;
  memset(s, 0, sizeof *s);
  s->x = em_data_ptr(x); s->y = em_data_ptr(y);
  s->H = 1;
  int64_t rows = 1;
  for (int k = 0; k < lead; k++) {
    if (k == hd) { s->H = x->shape[k]; s->xh = x->stride[k]; s->yh = y->stride[k]; continue; }
    s->shape[s->nd] = x->shape[k]; s->xs[s->nd] = x->stride[k]; s->ys[s->nd] = y->stride[k]; s->ps[s->nd] = ps[k];
    s->nd++;
    rows *= x->shape[k];
  }
  s->G = (s->H + HPT - 1) / HPT;
  s->threads = rows * s->G;        /* times the chunks, once V is known */
}

/* Rotate x[i] into y[i] for i < n (n = 1 or 2: q and k in one launch), pos broadcast to each. */
extern "C" int em_rope2_cuda(int n, const em_tensor *const *x, const em_tensor *pos, double theta, double sign,
                             em_tensor *const *y) {
  if (n < 1 || n > 2) return em_error("rope: 1 or 2 tensors a launch, got %d", n);
  int64_t d = x[0]->shape[x[0]->ndim - 1], half = d / 2;
  if (half == 0) return 0;
  em_dtype dt = x[0]->dtype;
  for (int i = 1; i < n; i++)
    if (x[i]->dtype != dt || x[i]->shape[x[i]->ndim - 1] != d)
      return em_error("rope: tensors of one launch need one dtype and last dim, got %s (%lld) and %s (%lld)",
                      em_dtype_name(dt), (long long)d, em_dtype_name(x[i]->dtype),
                      (long long)x[i]->shape[x[i]->ndim - 1]);
  if (pos->dtype != EM_I64 && pos->dtype != EM_I32)
    return em_error("rope: CUDA positions must be i32 or i64, got %s", em_dtype_name(pos->dtype));
  rope_geom g;
  memset(&g, 0, sizeof g);
  g.half = half;
  /* 16-byte chunks when every row start of x and y is 16-byte aligned */
  int64_t vec = 16 / (int64_t)em_dtype_size(dt);
  bool pk = d % vec == 0, small = true;
  for (int i = 0; i < n; i++) {
    side_init(&g.s[i], x[i], pos, y[i]);
    const em_tensor *t[2] = {x[i], y[i]};
    for (int u = 0; u < 2; u++) {
      pk = pk && ((uintptr_t)em_data_ptr(t[u]) & 15) == 0;
      for (int k = 0; k < t[u]->ndim - 1; k++) pk = pk && t[u]->stride[k] % vec == 0;
      small = small && span_of(t[u]->ndim, t[u]->shape, t[u]->stride) < INT32_MAX;
    }
    small = small && span_of(pos->ndim, pos->shape, pos->stride) < INT32_MAX;
  }
  int V = pk ? (int)vec : 2;
  g.chunks = d / V;
  int64_t blocks = 0;
  for (int i = 0; i < n; i++) {
    if (g.s[i].threads == 0) continue;              /* an empty tensor: no blocks */
    g.s[i].threads *= g.chunks;
    g.s[i].blocks = (g.s[i].threads + THREADS - 1) / THREADS;
    small = small && g.s[i].threads + THREADS < INT32_MAX;
    blocks += g.s[i].blocks;
  }
  if (blocks == 0) return 0;
  if (blocks > INT32_MAX) return em_error("rope: %lld blocks exceed the launch limit", (long long)blocks);
  freq_table f;
  for (int64_t j = 0; j < half && j < MAX_HALF; j++) f.v[j] = rope::inv_freq(theta, j, d);
  cudaStream_t s = em_cur_stream(x[0]->device.index);
#define ROPE_GO(P, I, VV, PKK) \
  rope_kernel<T, C, P, I, VV, PKK><<<(unsigned)blocks, THREADS, 0, s>>>((const P *)em_data_ptr(pos), g, f, theta, \
                                                                        (C)sign)
#define ROPE_I(P, VV, PKK) \
  do { if (small) ROPE_GO(P, int32_t, VV, PKK); else ROPE_GO(P, int64_t, VV, PKK); } while (0)
#define ROPE_P(VV, PKK) \
  do { if (pos->dtype == EM_I64) ROPE_I(int64_t, VV, PKK); else ROPE_I(int32_t, VV, PKK); } while (0)
  EM_DISPATCH_FLOAT(dt, T, {
    typedef typename std::conditional<std::is_same<T, double>::value, double, float>::type C;
    constexpr int VP = 16 / sizeof(T);
    if (pk) ROPE_P(VP, true);
    else ROPE_P(2, false);
  });
#undef ROPE_P
#undef ROPE_I
#undef ROPE_GO
  return em_launch_check("rope");
}

extern "C" int em_rope_cuda(const em_tensor *x, const em_tensor *pos, double theta, double sign, em_tensor *y) {
  return em_rope2_cuda(1, &x, pos, theta, sign, &y);
}
