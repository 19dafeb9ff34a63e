// sort_stages.cu — where a one-row 2^24 sort's time goes on the GPU: the
// three stages of kernels/sort.cu's sort_impl timed apart (CUDA events,
// median of 20 after 3 warm-ups), old and new key/gather kernels, and the
// CUB radix sort with the key widths and value types in question (the
// engine: 16-bit keys + int32 positions; PyTorch: 16-bit keys + int64
// indices; 16-bit keys widened to 32 bits and sorted over bits [0, 16)).
// Standalone (no Ember headers), so it answers on any CUDA host:
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a bench/kernels/sort_stages.cu -o /tmp/sort_stages
//   /tmp/sort_stages            # prints one table; bytes and GB/s per stage
// Inputs: randn-like bf16 / f32 values (Box-Muller on a hash), as the perf
// case "sort (2^24) one row" draws them; every result is checked sorted.
#include <cub/cub.cuh>
#include <cuda_bf16.h>
#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static const uint32_t N = 1u << 24;

__device__ uint32_t hash32(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16; return x;
}
__global__ void fill_randn(float *f, __nv_bfloat16 *b, uint32_t n) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float u1 = ((hash32(2 * i) >> 8) + 1) * 0x1p-24f, u2 = (hash32(2 * i + 1) >> 8) * 0x1p-24f;
    float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    f[i] = z; b[i] = __float2bfloat16_rn(z);
  }
}

// the engine's order-preserving keys (NaN largest, -0 == +0)
__device__ __forceinline__ uint16_t key16(uint16_t b) {
  if ((b & 0x7FFFu) > 0x7F80u) return 0xFFFFu;
  if (b == 0x8000u) b = 0;
  return (b >> 15) ? (uint16_t)~b : (uint16_t)(b | 0x8000u);
}
__device__ __forceinline__ uint32_t key32(uint32_t b) {
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFFFFFFFu;
  if (b == 0x80000000u) b = 0;
  return (b >> 31) ? ~b : b | 0x80000000u;
}
template <typename K> __device__ __forceinline__ K keyof(K b);
template <> __device__ __forceinline__ uint16_t keyof<uint16_t>(uint16_t b) { return key16(b); }
template <> __device__ __forceinline__ uint32_t keyof<uint32_t>(uint32_t b) { return key32(b); }

// before: 64-bit index math (i / L, row offsets) per element
template <typename K, typename KO>
__global__ void keys_old(const K *x, int64_t L, int64_t n, KO *keys, int *pos) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / L, j = i - r * L;
    keys[i] = keyof<K>(x[r * L + j]);
    pos[i] = (int)j;
  }
}
// after: one row, 32-bit, no division
template <typename K, typename KO>
__global__ void keys_new(const K *x, uint32_t n, KO *keys, int *pos) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    keys[i] = keyof<K>(x[i]);
    pos[i] = (int)i;
  }
}
template <typename K> __device__ __forceinline__ K value_of(K k) {
  const K sign = (K)((K)1 << (8 * sizeof(K) - 1));
  return (k & sign) ? (K)(k & ~sign) : (K)~k;
}
template <typename K, typename KO>
__global__ void gather_old(const K *x, const KO *sk, const int *sp, int64_t total, int64_t cnt, int64_t inner,
                           K *vals, int64_t *idx) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / cnt, jj = i - r * cnt;
    int64_t at = sp[r * cnt + jj];
    int64_t o = (r / inner) * cnt * inner + jj * inner + r % inner;
    idx[o] = at;
    const K k = (K)sk[r * cnt + jj];
    vals[o] = (k == (K)~(K)0 || k == (K)((K)1 << (8 * sizeof(K) - 1))) ? x[at] : value_of<K>(k);
  }
}
template <typename K, typename KO>
__global__ void gather_new(const K *x, const KO *sk, const int *sp, uint32_t total, K *vals, int64_t *idx) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int at = sp[i];
    idx[i] = at;
    const K k = (K)sk[i];
    vals[i] = (k == (K)~(K)0 || k == (K)((K)1 << (8 * sizeof(K) - 1))) ? x[at] : value_of<K>(k);
  }
}

struct Timer {
  cudaEvent_t a, b;
  Timer() { CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); }
  template <typename F> float median_ms(F f) {
    std::vector<float> t;
    for (int i = 0; i < 23; i++) {
      CK(cudaEventRecord(a)); f(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
      float ms; CK(cudaEventElapsedTime(&ms, a, b)); if (i >= 3) t.push_back(ms);
    }
    CK(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
};

static void row(const char *what, float ms, double bytes) {
  printf("| %-58s | %8.4f | %7.0f |\n", what, ms, bytes / (ms * 1e-3) / 1e9);
}

template <typename KI, typename V>
static float cub_pairs(const KI *kin, KI *kout, const V *vin, V *vout, int end_bit, void *&tmp, size_t &tb) {
  size_t need = 0;
  CK(cub::DeviceRadixSort::SortPairs(nullptr, need, kin, kout, vin, vout, (int)N, 0, end_bit));
  if (need > tb) { if (tmp) CK(cudaFree(tmp)); CK(cudaMalloc(&tmp, need)); tb = need; }
  Timer t;
  return t.median_ms([&] { CK(cub::DeviceRadixSort::SortPairs(tmp, tb, kin, kout, vin, vout, (int)N, 0, end_bit)); });
}

template <typename KO>
static bool sorted_ok(const KO *d, const int *p) {
  std::vector<KO> h(N); std::vector<int> hp(N);
  CK(cudaMemcpy(h.data(), d, N * sizeof(KO), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hp.data(), p, N * sizeof(int), cudaMemcpyDeviceToHost));
  for (uint32_t i = 1; i < N; i++)
    if (h[i - 1] > h[i] || (h[i - 1] == h[i] && hp[i - 1] >= hp[i])) return false;   // stable
  return true;
}

int main() {
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, n = 2^24, CUB %d.%d.%d\n", prop.name, CUB_MAJOR_VERSION, CUB_MINOR_VERSION, CUB_SUBMINOR_VERSION);
  float *xf; __nv_bfloat16 *xb;
  CK(cudaMalloc(&xf, N * 4)); CK(cudaMalloc(&xb, N * 2));
  fill_randn<<<4096, 256>>>(xf, xb, N);
  uint16_t *k16a, *k16b; uint32_t *k32a, *k32b; int *pa, *pb; int64_t *qa, *qb, *idx; uint16_t *v16; uint32_t *v32;
  CK(cudaMalloc(&k16a, N * 2)); CK(cudaMalloc(&k16b, N * 2)); CK(cudaMalloc(&k32a, N * 4)); CK(cudaMalloc(&k32b, N * 4));
  CK(cudaMalloc(&pa, N * 4)); CK(cudaMalloc(&pb, N * 4)); CK(cudaMalloc(&qa, N * 8)); CK(cudaMalloc(&qb, N * 8));
  CK(cudaMalloc(&idx, N * 8)); CK(cudaMalloc(&v16, N * 2)); CK(cudaMalloc(&v32, N * 4));
  void *tmp = nullptr; size_t tb = 0;
  Timer t;
  const unsigned g = (N + 255) / 256;
  const uint16_t *xb16 = (const uint16_t *)xb; const uint32_t *xf32 = (const uint32_t *)xf;
  printf("| stage | ms | GB/s |\n|---|---|---|\n");
  // bf16: the engine's stages
  row("bf16 keys, 64-bit index math (before)", t.median_ms([&] { keys_old<uint16_t, uint16_t><<<g, 256>>>(xb16, N, N, k16a, pa); }), N * 8.0);
  row("bf16 keys, one row, 32-bit (after)", t.median_ms([&] { keys_new<uint16_t, uint16_t><<<g, 256>>>(xb16, N, k16a, pa); }), N * 8.0);
  row("cub SortPairs u16 keys + i32 positions (engine)", cub_pairs(k16a, k16b, pa, pb, 16, tmp, tb), N * 2.0 * 2 * 6);
  printf("| (sorted and stable: %s) | | |\n", sorted_ok(k16b, pb) ? "yes" : "NO");
  row("gather, 64-bit index math (before)", t.median_ms([&] { gather_old<uint16_t, uint16_t><<<g, 256>>>(xb16, k16b, pb, N, N, 1, v16, idx); }), N * 16.0);
  row("gather, one row, 32-bit (after)", t.median_ms([&] { gather_new<uint16_t, uint16_t><<<g, 256>>>(xb16, k16b, pb, N, v16, idx); }), N * 16.0);
  // bf16 alternatives
  keys_new<uint16_t, uint32_t><<<g, 256>>>(xb16, N, k32a, pa);
  row("cub SortPairs u32 keys (bf16 widened), bits [0,16) + i32", cub_pairs(k32a, k32b, pa, pb, 16, tmp, tb), N * 2.0 * 2 * 8);
  printf("| (sorted and stable: %s) | | |\n", sorted_ok(k32b, pb) ? "yes" : "NO");
  {
    std::vector<int64_t> iota(N); for (uint32_t i = 0; i < N; i++) iota[i] = i;
    CK(cudaMemcpy(qa, iota.data(), N * 8, cudaMemcpyHostToDevice));
  }
  row("cub SortPairs u16 keys + i64 indices (PyTorch's shape)", cub_pairs(k16a, k16b, qa, qb, 16, tmp, tb), N * 2.0 * 2 * 10);
  // f32 for comparison
  row("f32 keys, 64-bit index math (before)", t.median_ms([&] { keys_old<uint32_t, uint32_t><<<g, 256>>>(xf32, N, N, k32a, pa); }), N * 12.0);
  row("f32 keys, one row, 32-bit (after)", t.median_ms([&] { keys_new<uint32_t, uint32_t><<<g, 256>>>(xf32, N, k32a, pa); }), N * 12.0);
  row("cub SortPairs u32 keys + i32 positions (f32 sort)", cub_pairs(k32a, k32b, pa, pb, 32, tmp, tb), N * 4.0 * 2 * 8);
  printf("| (sorted and stable: %s) | | |\n", sorted_ok(k32b, pb) ? "yes" : "NO");
  row("f32 gather, 64-bit (before)", t.median_ms([&] { gather_old<uint32_t, uint32_t><<<g, 256>>>(xf32, k32b, pb, N, N, 1, v32, idx); }), N * 20.0);
  row("f32 gather, one row, 32-bit (after)", t.median_ms([&] { gather_new<uint32_t, uint32_t><<<g, 256>>>(xf32, k32b, pb, N, v32, idx); }), N * 20.0);
  CK(cudaDeviceSynchronize());
  printf("bytes: keys = read x + write key + i32 position; sort = passes x (read + write) of key + value;\n"
         "gather = read key + position, write value + i64 index. GB/s over those counts.\n");
  return 0;
}
