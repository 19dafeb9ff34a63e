/* Fused multi-tensor optimizer kernels: AdamW, SGD, the sum of squares
 * behind clip_grad_norm, and the clip itself.
 *
 * What: PyTorch's AdamW per element (p·(1−lr·wd); m lerp; v = b2·v + (1−b2)·g²;
 * p += −lr/bc1 · m / (sqrt(v)/sqrt(bc2) + eps)), ~15 FLOPs and 7 accesses
 * (read p g m v, write p m v): 28 bytes per f32 parameter, so a step is
 * memory bound: 124M parameters (GPT-2 small) ~3.5 GB, ~1.2 ms at 3 TB/s.
 *
 * Launch shape (PyTorch's multi_tensor_apply): every tensor is cut into
 * 64Ki-element chunks, one 512-thread block per chunk; the pointers, sizes and
 * first-block index of up to MT_MAX tensors travel in the kernel's arguments
 * (a __grid_constant__ struct of ~17 KB: CUDA 12.1+ allows 32 KB), and a block
 * finds its tensor by binary search over the first-block indices. A model of
 * a few hundred parameter tensors is ONE launch (plus, when capturable, one
 * tiny step-increment launch), and since everything is in the arguments a
 * captured graph replays it unchanged.
 *
 * The trick for reproducibility: the arithmetic uses the _rn intrinsics
 * (__fmul_rn, __fadd_rn, ...) so nvcc cannot contract into FMAs: the update is
 * the CPU reference's operation for operation, bit for bit, and capturable and
 * host-step variants agree too. The capturable variant reads each tensor's
 * step (and optionally lr) from device memory and forms the bias corrections
 * there in double, as the host does, so a captured step replays correctly.
 *
 * Shadow weights (ember/autocast.h): a parameter may name a bf16/f16 copy
 * that the same kernel writes from the updated f32 value (+2 bytes per
 * parameter: 30 instead of 28), so autocast's forward reads it instead of a
 * separate cast kernel re-reading the f32 weight (4 + 2 bytes per parameter).
 *
 * The sum of squares accumulates in f64 per thread, one partial per block,
 * then one block adds the partials in order: deterministic. */
#include <type_traits>
#include "common.cuh"
#include "backend.h"
#include "ember/half.h"

#define MT_MAX 320
#define MT_THREADS 512
#define CHUNK 65536

typedef struct {
  void *ptr[4][MT_MAX];        /* up to 4 lists: p, g, m, v (AdamW); p, g, buf (SGD); t (sumsq, clip) */
  int64_t numel[MT_MAX];
  void *step[MT_MAX];          /* capturable AdamW: each tensor's step counter */
  void *shadow[MT_MAX];        /* AdamW: the parameter's bf16/f16 shadow weight, or NULL */
  int8_t shadow_f16[MT_MAX];   /* its dtype: 0 bf16, 1 f16 */
  int32_t start[MT_MAX + 1];   /* first block of each tensor; start[n] = blocks in the launch */
  int n;
} mt_meta;
static_assert(sizeof(mt_meta) < 30000, "kernel arguments must stay under CUDA's 32 KB limit");

__device__ __forceinline__ int find_tensor(const mt_meta &m, int b) {
  int lo = 0, hi = m.n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (m.start[mid] <= b) lo = mid; else hi = mid - 1;
  }
  return lo;
}

/* Host side: fills metas and launches each time one is full. */
struct mt_batch {
  mt_meta meta;
  int64_t blocks = 0;
  mt_batch() { meta.n = 0; meta.start[0] = 0; }
  bool full() const { return meta.n == MT_MAX || blocks > INT32_MAX / 2; }
  void add(void *p0, void *p1, void *p2, void *p3, int64_t numel, void *step, void *shadow = NULL,
           bool shadow_f16 = false) {
    int i = meta.n++;
    meta.ptr[0][i] = p0; meta.ptr[1][i] = p1; meta.ptr[2][i] = p2; meta.ptr[3][i] = p3;
    meta.numel[i] = numel; meta.step[i] = step;
    meta.shadow[i] = shadow; meta.shadow_f16[i] = shadow_f16;
    meta.start[i] = (int32_t)blocks;
    blocks += (numel + CHUNK - 1) / CHUNK;
    meta.start[i + 1] = (int32_t)blocks;
  }
  void clear() { meta.n = 0; blocks = 0; meta.start[0] = 0; }
};

/* Arithmetic that the compiler may not fuse (matches the CPU bit for bit). */
__device__ __forceinline__ float add_(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub_(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float mul_(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float div_(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float sqrt_(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double add_(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double sub_(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double mul_(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double div_(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ double sqrt_(double a) { return __dsqrt_rn(a); }


/* ---------------- AdamW ---------------- */

typedef struct {
  double lr, beta1, beta2, eps, wd;                      /* hyper-parameters */
  double decay, w1, c2, step_size, bc2_sqrt;             /* host-formed constants (not capturable) */
  const void *lr_ptr;                                    /* capturable: lr on the device, or NULL */
  int lr_f64, step_i64, capturable;
} adam_args;

template <typename T> struct adam_c { T decay, w1, b2, c2, step_size, bc2_sqrt, eps; };

template <typename T>
__device__ __forceinline__ void adamw_elem(T &p, T g, T &m, T &v, const adam_c<T> &c) {
  T m_ = m;
  p = mul_(p, c.decay);
  m_ = c.w1 < (T)0.5 ? add_(m_, mul_(c.w1, sub_(g, m_))) : sub_(g, mul_(sub_(g, m_), sub_((T)1, c.w1)));
  m = m_;
  v = add_(mul_(v, c.b2), mul_(mul_(c.c2, g), g));
  p = add_(p, div_(mul_(c.step_size, m_), add_(div_(sqrt_(v), c.bc2_sqrt), c.eps)));
}

/* The shadow weight's element: the updated f32 rounded to nearest even, with
 * the cast op's own conversion (convert.cuh: the CPU's bits). */
template <bool F16> __device__ __forceinline__ uint16_t shadow_bits(float p) {
  return F16 ? em_f32_to_f16(p) : em_f32_to_bf16(p);
}
template <bool F16> __device__ __forceinline__ uint16_t shadow_bits(double p) { return 0; }   /* f64: never */

/* One block's chunk of one tensor: 16-byte loads when every pointer allows
 * (the shadow's 8-byte stores of 4 halves too), then the tail. SHADOW: also
 * write the shadow weight, in the same pass (2 more bytes per parameter). */
template <typename T, bool SHADOW, bool F16>
__device__ __forceinline__ void adamw_chunk(T *p, const T *g, T *m, T *v, uint16_t *s, int64_t n, const adam_c<T> &c) {
  constexpr int VEC = 16 / sizeof(T);
  int64_t nv = 0;
  uintptr_t al = (uintptr_t)p | (uintptr_t)g | (uintptr_t)m | (uintptr_t)v;
  if ((al & 15) == 0 && (!SHADOW || ((uintptr_t)s & (VEC * 2 - 1)) == 0)) nv = n / VEC;
  for (int64_t i = threadIdx.x; i < nv; i += MT_THREADS) {
    Packed128<T> P = load128(p + i * VEC), G = load128(g + i * VEC), M = load128(m + i * VEC), V = load128(v + i * VEC);
#pragma unroll
    for (int k = 0; k < VEC; k++) adamw_elem(P[k], G[k], M[k], V[k], c);
    store128(p + i * VEC, P); store128(m + i * VEC, M); store128(v + i * VEC, V);
    if constexpr (SHADOW && VEC == 4) {
      uint2 q;
      q.x = (uint32_t)shadow_bits<F16>(P[0]) | ((uint32_t)shadow_bits<F16>(P[1]) << 16);
      q.y = (uint32_t)shadow_bits<F16>(P[2]) | ((uint32_t)shadow_bits<F16>(P[3]) << 16);
      *reinterpret_cast<uint2 *>(s + i * VEC) = q;
    }
  }
  for (int64_t i = nv * VEC + threadIdx.x; i < n; i += MT_THREADS) {
    T P = p[i], M = m[i], V = v[i];
    adamw_elem(P, g[i], M, V, c);
    p[i] = P; m[i] = M; v[i] = V;
    if (SHADOW) s[i] = shadow_bits<F16>(P);
  }
}

__global__ void step_inc_kernel(const __grid_constant__ mt_meta meta, int step_i64) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= meta.n) return;
  if (step_i64) *(int64_t *)meta.step[i] += 1;
  else *(float *)meta.step[i] += 1.0f;
}

template <typename T>
__global__ void __launch_bounds__(MT_THREADS) adamw_kernel(const __grid_constant__ mt_meta meta, const adam_args a) {
  int t = find_tensor(meta, blockIdx.x);
  int64_t lo = (int64_t)(blockIdx.x - meta.start[t]) * CHUNK, n = meta.numel[t] - lo;
  if (n > CHUNK) n = CHUNK;
  T *p = (T *)meta.ptr[0][t] + lo, *g = (T *)meta.ptr[1][t] + lo, *m = (T *)meta.ptr[2][t] + lo,
    *v = (T *)meta.ptr[3][t] + lo;
  double decay = a.decay, step_size = a.step_size, bc2_sqrt = a.bc2_sqrt;
  if (a.capturable) {            /* the host's formulas, from the device's step and lr */
    double step = a.step_i64 ? (double)*(const int64_t *)meta.step[t] : (double)*(const float *)meta.step[t];
    double lr = !a.lr_ptr ? a.lr : a.lr_f64 ? *(const double *)a.lr_ptr : (double)*(const float *)a.lr_ptr;
    double bc1 = 1 - pow(a.beta1, step), bc2 = 1 - pow(a.beta2, step);
    decay = 1 - lr * a.wd; step_size = -(lr / bc1); bc2_sqrt = sqrt(bc2);
  }
  adam_c<T> c = {(T)decay, (T)a.w1, (T)a.beta2, (T)a.c2, (T)step_size, (T)bc2_sqrt, (T)a.eps};
  if (std::is_same<T, float>::value && meta.shadow[t]) {
    if (meta.shadow_f16[t]) adamw_chunk<T, true, true>(p, g, m, v, (uint16_t *)meta.shadow[t] + lo, n, c);
    else adamw_chunk<T, true, false>(p, g, m, v, (uint16_t *)meta.shadow[t] + lo, n, c);
  } else {
    adamw_chunk<T, false, false>(p, g, m, v, nullptr, n, c);
  }
}

template <typename T>
static int adamw_launch(mt_batch &b, const adam_args &a, bool inc, cudaStream_t s) {
  if (b.meta.n == 0) return 0;
  if (inc) step_inc_kernel<<<(b.meta.n + 255) / 256, 256, 0, s>>>(b.meta, a.step_i64);
  if (b.blocks > 0) adamw_kernel<T><<<(unsigned)b.blocks, MT_THREADS, 0, s>>>(b.meta, a);
  b.clear();
  return em_launch_check("adamw_");
}

extern "C" int em_adamw_cuda(int n, em_tensor **p, em_tensor **g, em_tensor **m, em_tensor **v, double lr,
                             double beta1, double beta2, double eps, double weight_decay, int64_t step,
                             em_tensor **steps, const em_tensor *lr_t, em_tensor **shadows) {
  if (n == 0) return 0;
  adam_args a;
  memset(&a, 0, sizeof a);
  a.lr = lr; a.beta1 = beta1; a.beta2 = beta2; a.eps = eps; a.wd = weight_decay;
  a.w1 = 1 - beta1; a.c2 = 1 - beta2;
  if (steps) {
    a.capturable = 1;
    a.step_i64 = steps[0]->dtype == EM_I64;
    a.lr_ptr = lr_t ? em_data_ptr(lr_t) : NULL;
    a.lr_f64 = lr_t && lr_t->dtype == EM_F64;
  } else {                       /* exactly engine/ops/optim.c's constants */
    double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
    a.decay = 1 - lr * weight_decay; a.step_size = -(lr / bc1); a.bc2_sqrt = sqrt(bc2);
  }
  cudaStream_t s = em_cur_stream(p[0]->device.index);
  static thread_local mt_batch b;   /* 17 KB: kept off the stack */
  int rc = 0;
  const em_dtype dts[2] = {EM_F32, EM_F64};
  for (int d = 0; d < 2 && rc == 0; d++) {
    b.clear();
    for (int i = 0; i < n && rc == 0; i++) {
      if (p[i]->dtype != dts[d]) continue;
      em_tensor *sh = shadows && dts[d] == EM_F32 ? shadows[i] : NULL;
      b.add(em_data_ptr(p[i]), em_data_ptr(g[i]), em_data_ptr(m[i]), em_data_ptr(v[i]), em_numel(p[i]),
            steps ? em_data_ptr(steps[i]) : NULL, sh ? em_data_ptr(sh) : NULL, sh && sh->dtype == EM_F16);
      if (b.full()) rc = d == 0 ? adamw_launch<float>(b, a, steps != NULL, s) : adamw_launch<double>(b, a, steps != NULL, s);
    }
    if (rc == 0) rc = d == 0 ? adamw_launch<float>(b, a, steps != NULL, s) : adamw_launch<double>(b, a, steps != NULL, s);
  }
  return rc;
}

/* ---------------- SGD ---------------- */

typedef struct { double lr, mu, wd; int first; } sgd_args;

template <typename T>
__device__ __forceinline__ void sgd_elem(T &p, T g, T *b, const sgd_args &a) {
  T d = g;
  if (a.wd != 0) d = add_(d, mul_((T)a.wd, p));
  if (a.mu != 0) { *b = a.first ? d : add_(mul_(*b, (T)a.mu), d); d = *b; }
  p = add_(p, mul_((T)(-a.lr), d));
}

template <typename T>
__global__ void __launch_bounds__(MT_THREADS) sgd_kernel(const __grid_constant__ mt_meta meta, const sgd_args a) {
  int t = find_tensor(meta, blockIdx.x);
  int64_t lo = (int64_t)(blockIdx.x - meta.start[t]) * CHUNK, n = meta.numel[t] - lo;
  if (n > CHUNK) n = CHUNK;
  T *p = (T *)meta.ptr[0][t] + lo, *g = (T *)meta.ptr[1][t] + lo;
  T *b = meta.ptr[2][t] ? (T *)meta.ptr[2][t] + lo : NULL;
  T dummy = 0;
  for (int64_t i = threadIdx.x; i < n; i += MT_THREADS) {
    T P = p[i];
    sgd_elem(P, g[i], b ? &b[i] : &dummy, a);
    p[i] = P;
  }
}

extern "C" int em_sgd_cuda(int n, em_tensor **p, em_tensor **g, em_tensor **bufs, double lr, double momentum,
                           double weight_decay, bool first_step) {
  if (n == 0) return 0;
  sgd_args a = {lr, momentum, weight_decay, first_step ? 1 : 0};
  cudaStream_t s = em_cur_stream(p[0]->device.index);
  static thread_local mt_batch b;
  int rc = 0;
  const em_dtype dts[2] = {EM_F32, EM_F64};
  for (int d = 0; d < 2 && rc == 0; d++) {
    b.clear();
    for (int i = 0; i <= n && rc == 0; i++) {
      bool last = i == n;
      if (!last && p[i]->dtype == dts[d])
        b.add(em_data_ptr(p[i]), em_data_ptr(g[i]), momentum != 0 ? em_data_ptr(bufs[i]) : NULL, NULL,
              em_numel(p[i]), NULL);
      if ((last || b.full()) && b.blocks > 0) {
        if (d == 0) sgd_kernel<float><<<(unsigned)b.blocks, MT_THREADS, 0, s>>>(b.meta, a);
        else sgd_kernel<double><<<(unsigned)b.blocks, MT_THREADS, 0, s>>>(b.meta, a);
        rc = em_launch_check("sgd_");
        b.clear();
      } else if (b.full()) b.clear();
    }
  }
  return rc;
}

/* ---------------- sum of squares, clipping ---------------- */

template <typename T> __device__ __forceinline__ double to_f64_(T x) { return (double)to_f32(x); }
template <> __device__ __forceinline__ double to_f64_<double>(double x) { return x; }

__device__ __forceinline__ double block_sum_f64(double v, double *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nw ? shared[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(MT_THREADS) sumsq_kernel(const __grid_constant__ mt_meta meta, double *partial) {
  __shared__ double red[32];
  int t = find_tensor(meta, blockIdx.x);
  int64_t lo = (int64_t)(blockIdx.x - meta.start[t]) * CHUNK, n = meta.numel[t] - lo;
  if (n > CHUNK) n = CHUNK;
  const T *x = (const T *)meta.ptr[0][t] + lo;
  double acc = 0;
  constexpr int VEC = 16 / sizeof(T);
  int64_t nv = ((uintptr_t)x & 15) == 0 ? n / VEC : 0;
  for (int64_t i = threadIdx.x; i < nv; i += MT_THREADS) {
    Packed128<T> X = load128(x + i * VEC);
#pragma unroll
    for (int k = 0; k < VEC; k++) { double e = to_f64_(X[k]); acc += e * e; }
  }
  for (int64_t i = nv * VEC + threadIdx.x; i < n; i += MT_THREADS) { double e = to_f64_(x[i]); acc += e * e; }
  acc = block_sum_f64(acc, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(1024) sumsq_final_kernel(const double *partial, int64_t n, float *out) {
  __shared__ double red[32];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  acc = block_sum_f64(acc, red);
  if (threadIdx.x == 0) out[0] = (float)acc;
}

/* Partials: one f64 per block of every launch, in launch order. */
extern "C" int em_sum_of_squares_cuda(int n, em_tensor **ts, em_tensor *out) {
  int dev = out->device.index;
  cudaStream_t s = em_cur_stream(dev);
  int64_t total_blocks = 0;
  for (int i = 0; i < n; i++) total_blocks += (em_numel(ts[i]) + CHUNK - 1) / CHUNK;
  em_tensor *part = NULL;
  if (total_blocks > 0) {
    if (!(part = em_empty(1, &total_blocks, EM_F64, out->device))) return -1;
  }
  double *pp = part ? (double *)em_data_ptr(part) : NULL;
  static thread_local mt_batch b;
  int64_t done = 0;
  int rc = 0;
  const em_dtype dts[4] = {EM_F32, EM_BF16, EM_F16, EM_F64};
  for (int d = 0; d < 4 && rc == 0; d++) {
    b.clear();
    for (int i = 0; i <= n && rc == 0; i++) {
      bool last = i == n;
      if (!last && ts[i]->dtype == dts[d]) b.add(em_data_ptr(ts[i]), NULL, NULL, NULL, em_numel(ts[i]), NULL);
      if ((last || b.full()) && b.blocks > 0) {
        unsigned nb = (unsigned)b.blocks;
        switch (dts[d]) {
          case EM_F32: sumsq_kernel<float><<<nb, MT_THREADS, 0, s>>>(b.meta, pp + done); break;
          case EM_BF16: sumsq_kernel<__nv_bfloat16><<<nb, MT_THREADS, 0, s>>>(b.meta, pp + done); break;
          case EM_F16: sumsq_kernel<__half><<<nb, MT_THREADS, 0, s>>>(b.meta, pp + done); break;
          default: sumsq_kernel<double><<<nb, MT_THREADS, 0, s>>>(b.meta, pp + done); break;
        }
        done += b.blocks;
        rc = em_launch_check("sum_of_squares");
        b.clear();
      } else if (b.full()) b.clear();
    }
  }
  if (rc == 0) {
    sumsq_final_kernel<<<1, 1024, 0, s>>>(pp, done, (float *)em_data_ptr(out));
    rc = em_launch_check("sum_of_squares");
  }
  em_tensor_release(part);
  return rc;
}

template <typename T>
__global__ void __launch_bounds__(MT_THREADS) clip_kernel(const __grid_constant__ mt_meta meta, const float *sumsq,
                                                          double max_norm) {
  double total = sqrt((double)sumsq[0]);
  if (!(total > max_norm)) return;                 /* as the CPU: clip only above max_norm (NaN: no clip) */
  int t = find_tensor(meta, blockIdx.x);
  int64_t lo = (int64_t)(blockIdx.x - meta.start[t]) * CHUNK, n = meta.numel[t] - lo;
  if (n > CHUNK) n = CHUNK;
  T *x = (T *)meta.ptr[0][t] + lo;
  using C = typename std::conditional<std::is_same<T, double>::value, double, float>::type;
  C coef = (C)(max_norm / (total + 1e-6));
  for (int64_t i = threadIdx.x; i < n; i += MT_THREADS) {
    if constexpr (std::is_same<T, double>::value) x[i] = x[i] * coef;
    else x[i] = from_f32<T>(to_f32(x[i]) * coef);
  }
}

__global__ void norm_kernel(const float *sumsq, float *norm) { norm[0] = (float)sqrt((double)sumsq[0]); }

extern "C" int em_clip_grads_cuda(int n, em_tensor **grads, const em_tensor *sumsq, double max_norm,
                                  em_tensor *norm_out) {
  cudaStream_t s = em_cur_stream(sumsq->device.index);
  const float *ss = (const float *)em_data_ptr(sumsq);
  norm_kernel<<<1, 1, 0, s>>>(ss, (float *)em_data_ptr(norm_out));
  int rc = em_launch_check("clip_grad_norm");
  static thread_local mt_batch b;
  const em_dtype dts[4] = {EM_F32, EM_BF16, EM_F16, EM_F64};
  for (int d = 0; d < 4 && rc == 0; d++) {
    b.clear();
    for (int i = 0; i <= n && rc == 0; i++) {
      bool last = i == n;
      if (!last && grads[i]->dtype == dts[d]) b.add(em_data_ptr(grads[i]), NULL, NULL, NULL, em_numel(grads[i]), NULL);
      if ((last || b.full()) && b.blocks > 0) {
        unsigned nb = (unsigned)b.blocks;
        switch (dts[d]) {
          case EM_F32: clip_kernel<float><<<nb, MT_THREADS, 0, s>>>(b.meta, ss, max_norm); break;
          case EM_BF16: clip_kernel<__nv_bfloat16><<<nb, MT_THREADS, 0, s>>>(b.meta, ss, max_norm); break;
          case EM_F16: clip_kernel<__half><<<nb, MT_THREADS, 0, s>>>(b.meta, ss, max_norm); break;
          default: clip_kernel<double><<<nb, MT_THREADS, 0, s>>>(b.meta, ss, max_norm); break;
        }
        rc = em_launch_check("clip_grad_norm");
        b.clear();
      } else if (b.full()) b.clear();
    }
  }
  return rc;
}
