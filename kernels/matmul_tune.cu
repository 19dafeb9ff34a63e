/* Matmul tuning: time cuBLASLt's candidate algorithms for one gemm and keep
 * the table of choices (kernels/matmul.cu asks, once per key, when
 * ember.backends.matmul_tune is on; docs/perf.md, "Matmul algorithm tuning").
 *
 * Cost: each candidate runs once untimed (lazy module loading stays out of
 * the numbers), then ROUNDS x REPS times timed, so a key costs about
 * 7 · candidates gemms plus ROUNDS · SPIN_NS of waiting, once per process.
 *
 * The trick that matters: a round starts with a one-thread kernel that spins
 * for SPIN_NS on the GPU clock while the host enqueues the whole round
 * behind it (candidate after candidate, an event between each). The GPU then
 * runs the gemms back to back, and the event gaps measure the kernels, not
 * the host's launch latency, which for the small model's 8 µs gemms would be
 * most of the time. Each candidate's time is its best round's mean. */
#include <deque>
#include <mutex>
#include <vector>
#include "common.cuh"
#include "matmul_lt.h"

#define ROUNDS 2
#define REPS 3
#define SPIN_NS 1000000ull          /* 1 ms: more than the host needs to enqueue 17 x 3 gemms */
#define SPIN_NS_PER_RUN 8000ull     /* and 8 µs more per enqueued gemm beyond those (the extra candidates) */
#define MAX_ALGOS 48

static std::mutex g_table_lock;
static std::vector<em_matmul_tune_entry> g_table;
static std::deque<std::atomic<int64_t>> g_calls;   /* per row; a deque never moves its elements */

static __global__ void spin_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}

int lt_time_algos(const lt_call *c, bool read_c, const cublasLtMatmulAlgo_t *algos, int n, float *us) {
  if (n > MAX_ALGOS) n = MAX_ALGOS;
  cudaEvent_t ev[ROUNDS][MAX_ALGOS + 1] = {};
  bool ok[MAX_ALGOS];
  em_storage *scratch = NULL;
  void *d = c->c;
  int rc = -1;
  uint64_t spin = SPIN_NS + (n > 17 ? (uint64_t)(n - 17) * REPS * SPIN_NS_PER_RUN : 0);
  if (read_c) {                        /* beta != 0: run on a copy of C, keep the call's C intact */
    em_device dev = {EM_CUDA, c->device};
    scratch = em_storage_new(c->c_bytes, dev);
    if (!scratch) { em_clear_error(); return 1; }
    d = scratch->data;
    if (em_cuda_check(cudaMemcpyAsync(d, c->c, c->c_bytes, cudaMemcpyDeviceToDevice, c->s), c->op,
                      "cudaMemcpyAsync (tuning scratch)"))
      goto done;
  }
  for (int i = 0; i < n; i++) {        /* warm-up; an algorithm that cannot run is out */
    ok[i] = lt_run(c, d, &algos[i]) == CUBLAS_STATUS_SUCCESS;
    us[i] = -1.f;
  }
  for (int r = 0; r < ROUNDS; r++)
    for (int i = 0; i <= n; i++)
      if (em_cuda_check(cudaEventCreate(&ev[r][i]), c->op, "cudaEventCreate")) goto done;
  for (int r = 0; r < ROUNDS; r++) {
    spin_kernel<<<1, 1, 0, c->s>>>(spin);
    if (em_launch_check(c->op)) goto done;
    for (int i = 0; i < n; i++) {
      if (em_cuda_check(cudaEventRecord(ev[r][i], c->s), c->op, "cudaEventRecord")) goto done;
      for (int j = 0; j < REPS && ok[i]; j++) ok[i] = lt_run(c, d, &algos[i]) == CUBLAS_STATUS_SUCCESS;
    }
    if (em_cuda_check(cudaEventRecord(ev[r][n], c->s), c->op, "cudaEventRecord")) goto done;
  }
  if (em_cuda_check(cudaEventSynchronize(ev[ROUNDS - 1][n]), c->op, "cudaEventSynchronize (matmul tuning)"))
    goto done;
  for (int i = 0; i < n; i++) {
    if (!ok[i]) continue;
    for (int r = 0; r < ROUNDS; r++) {
      float ms = 0.f;
      if (em_cuda_check(cudaEventElapsedTime(&ms, ev[r][i], ev[r][i + 1]), c->op, "cudaEventElapsedTime"))
        goto done;
      float t = ms * 1000.f / REPS;
      if (us[i] < 0.f || t < us[i]) us[i] = t;
    }
  }
  rc = 0;
done:
  for (int r = 0; r < ROUNDS; r++)
    for (int i = 0; i <= n; i++)
      if (ev[r][i]) cudaEventDestroy(ev[r][i]);
  if (scratch) {
    if (rc) cudaStreamSynchronize(c->s);   /* the copy or a gemm may still use it */
    em_storage_release(scratch);           /* after the sync above: nothing reads it any more */
  }
  return rc;
}

void lt_algo_config(const cublasLtMatmulAlgo_t *a, int *id, int *tile, int *stages, int *splitk, int *cluster) {
  int32_t i32 = 0, sk = 0;
  uint32_t t = 0, st = 0;
  uint16_t cl = 0;
  size_t w;
  cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_ID, &i32, sizeof i32, &w);
  cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &t, sizeof t, &w);
  cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &st, sizeof st, &w);
  cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk, &w);
  cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl, sizeof cl, &w);
  *id = i32; *tile = (int)t; *stages = (int)st; *splitk = sk; *cluster = cl;
}

std::atomic<int64_t> *lt_tune_record(const em_matmul_tune_entry *e) {
  std::lock_guard<std::mutex> guard(g_table_lock);
  g_table.push_back(*e);
  g_calls.emplace_back(0);
  return &g_calls.back();
}

extern "C" int64_t em_matmul_tune_count(void) {
  std::lock_guard<std::mutex> guard(g_table_lock);
  return (int64_t)g_table.size();
}

extern "C" int em_matmul_tune_get(int64_t i, em_matmul_tune_entry *out) {
  std::lock_guard<std::mutex> guard(g_table_lock);
  if (i < 0 || i >= (int64_t)g_table.size())
    return em_error("matmul_tune_table: entry %lld is out of range [0, %lld)", (long long)i,
                    (long long)g_table.size());
  *out = g_table[(size_t)i];
  out->calls = g_calls[(size_t)i].load(std::memory_order_relaxed);
  return 0;
}
