/* Matmul through cuBLASLt, and linear's bias gradient.
 *
 * What: C = op(A) @ op(B) (+ bias) per batch, row-major as the engine plans
 * it (engine/ops/matmul.c). 2·n·m·k FLOPs per gemm; bytes (n·k + k·m + n·m)·
 * sizeof(T) at best, so every shape Ember cares about (k >= 64) is
 * matrix-unit bound: bf16 8192³ should run near the ~800 TFLOP/s ceiling.
 *
 * The trick that matters is not a kernel but the bookkeeping around
 * cuBLASLt: a row-major product is the column-major product Cᵀ = Bᵀ Aᵀ, so
 * the operands swap places and a transposed view (kᵀ, wᵀ) is a transpose flag,
 * never a copy. Descriptors, layouts and the heuristic's algorithm are made
 * once per (shape, strides, dtypes, transposes, alignments, epilogue) and kept
 * in a hash map, so a cached gemm costs one cublasLtMatmul call on the host.
 * With ember.backends.matmul_tune on, a key's first call also times the
 * heuristic's first choice against up to 16 more of its candidates and up to
 * 24 split-K / cluster / tile configurations beyond its list
 * (kernels/matmul_tune.cu, matmul_space.cu) and the key keeps the fastest (a key first met
 * during graph capture keeps the heuristic's); with it off (the default) the
 * heuristic's first choice runs, bit for bit as before. beta (a gradient
 * accumulated into C) is part of the key.
 * One handle and one 32 MiB workspace per device, the workspace taken from the
 * caching allocator once and kept (captured graphs point at it). Matmuls on
 * two streams at once would share it: order such streams with events, as
 * for any memory used across streams.
 *
 * Numerics: bf16/f16 in, f32 accumulate (CUBLAS_COMPUTE_32F), one rounding
 * on store, as the CPU reference; f32 in f32, or TF32 when
 * em_cuda_allow_tf32(); f64 in f64. The bias is fused as
 * CUBLASLT_EPILOGUE_BIAS (added in f32 before the rounding, like the CPU's
 * beta = 1 gemm on a bias-filled C); when no epilogue algorithm exists the
 * bias is written into C first and the gemm runs with beta = 1.
 *
 * Bias gradient (linear backward): a column sum of g (rows, out), one thread
 * per column and 8 row-slices per block, the 8 partials added in a fixed
 * order: deterministic, no atomics. */
#include <cublasLt.h>
#include <mutex>
#include <unordered_map>
#include <string.h>
#include "common.cuh"
#include "backend.h"
#include "ember/memory.h"
#include "matmul_lt.h"

#define WORKSPACE_BYTES ((size_t)32 << 20)
#define MAX_DEVICES 16
#define TUNE_CANDIDATES 16          /* cuBLASLt's heuristic list asked for when tuning */
#define TUNE_EXTRA 24               /* configurations beyond that list (split-K, clusters, tiles) timed too */
#define TUNE_MARGIN 0.98f           /* another algorithm must beat the heuristic's by 2% to replace it */

static std::mutex g_lock;
static cublasLtHandle_t g_handle[MAX_DEVICES];

static em_storage *g_ws[MAX_DEVICES];

static int lt_check(cublasStatus_t s, const char *op, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return 0;
  return em_error("%s: %s failed: %s", op, what, cublasLtGetStatusString(s));
}

static int get_handle(int dev, const char *op, cublasLtHandle_t *out) {
  if (dev < 0 || dev >= MAX_DEVICES) return em_error("%s: device %d is beyond the %d supported", op, dev, MAX_DEVICES);
  if (!g_handle[dev] && lt_check(cublasLtCreate(&g_handle[dev]), op, "cublasLtCreate")) return -1;
  *out = g_handle[dev];
  return 0;
}

/* The device's workspace: taken from the caching allocator on first use, then kept for good
 * (captured graphs keep pointing at it). */
static void *get_workspace(int dev) {
  if (!g_ws[dev]) {
    em_device d = {EM_CUDA, dev};
    em_mem_category prev = em_mem_set_category_override(EM_MEM_WORKSPACE);   /* memory history */
    g_ws[dev] = em_storage_new(WORKSPACE_BYTES, d);
    em_mem_set_category_override(prev);
  }
  /* one made before memory history started gets its category on first use while recording */
  if (g_ws[dev] && em_mem_history_on()) em_mem_tag(g_ws[dev], EM_MEM_WORKSPACE);
  return g_ws[dev] ? g_ws[dev]->data : NULL;
}

/* ---------------- plan cache ---------------- */

typedef struct {
  int32_t device, dtype, tf32, a_trans, b_trans, epilogue, c_f32, beta1;
  int32_t align_a, align_b, align_c, align_bias;
  int64_t n, m, k, batch, lda, ldb, ldc, a_bs, b_bs, c_bs;
} plan_key;

struct key_hash {
  size_t operator()(const plan_key &k) const {
    const unsigned char *p = (const unsigned char *)&k;
    uint64_t h = 1469598103934665603ull;                 /* FNV-1a */
    for (size_t i = 0; i < sizeof k; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return (size_t)h;
  }
};
struct key_eq {
  bool operator()(const plan_key &a, const plan_key &b) const { return memcmp(&a, &b, sizeof a) == 0; }
};

typedef struct {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;   /* cuBLASLt's A (our B), B (our A), C = D */
  cublasLtMatmulAlgo_t algo;           /* the heuristic's first choice */
  cublasLtMatmulAlgo_t tuned_algo;     /* the fastest measured (when tuned) */
  bool ok;                             /* the heuristic found an algorithm */
  bool tuned;                          /* tuned_algo is set (matmul_tune on, measured once) */
  std::atomic<int64_t> *calls;         /* the table row's count of calls that ran tuned_algo */
} plan;

static std::unordered_map<plan_key, plan, key_hash, key_eq> g_plans;

static int32_t ptr_align(const void *p) {
  uintptr_t u = (uintptr_t)p;
  int32_t a = 256;
  while (a > 1 && (u % (uintptr_t)a) != 0) a >>= 1;
  return a;
}

static cudaDataType_t cuda_type(em_dtype t) {
  switch (t) {
    case EM_F64: return CUDA_R_64F;
    case EM_BF16: return CUDA_R_16BF;
    case EM_F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

static void plan_destroy(plan *p) {
  if (p->la) cublasLtMatrixLayoutDestroy(p->la);
  if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
  if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
  if (p->desc) cublasLtMatmulDescDestroy(p->desc);
  memset(p, 0, sizeof *p);
}

static int layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                  int64_t batch, int64_t bstride, const char *op) {
  if (lt_check(cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld), op, "cublasLtMatrixLayoutCreate"))
    return -1;
  if (batch > 1) {
    int32_t bc = (int32_t)batch;
    if (lt_check(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc), op,
                 "set batch count") ||
        lt_check(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &bstride,
                                                  sizeof bstride), op, "set batch stride"))
      return -1;
  }
  return 0;
}

/* The heuristic's preferences for key k: our workspace, and the operands' alignments. */
static int make_pref(const plan_key *k, const char *op, cublasLtMatmulPreference_t *pref) {
  uint64_t ws = WORKSPACE_BYTES;
  uint32_t al_a = (uint32_t)k->align_b, al_b = (uint32_t)k->align_a, al_c = (uint32_t)k->align_c;
  *pref = NULL;
  if (lt_check(cublasLtMatmulPreferenceCreate(pref), op, "cublasLtMatmulPreferenceCreate") ||
      lt_check(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), op,
               "set workspace") ||
      lt_check(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a),
               op, "set alignment") ||
      lt_check(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b),
               op, "set alignment") ||
      lt_check(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c),
               op, "set alignment") ||
      lt_check(cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c),
               op, "set alignment")) {
    if (*pref) cublasLtMatmulPreferenceDestroy(*pref);
    *pref = NULL;
    return -1;
  }
  return 0;
}

/* Build descriptors and ask the heuristic once. Returns -1 only on API failure; p->ok says whether an algorithm exists. */
static int plan_build(cublasLtHandle_t h, const plan_key *k, const em_gemm_args *g, plan *p) {
  memset(p, 0, sizeof *p);
  const char *op = g->op;
  cudaDataType_t t = cuda_type(g->dtype);
  bool f64 = g->dtype == EM_F64;
  cublasComputeType_t ct = f64 ? CUBLAS_COMPUTE_64F : k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cudaDataType_t st = f64 ? CUDA_R_64F : CUDA_R_32F;
  cublasOperation_t ta = g->b_trans ? CUBLAS_OP_T : CUBLAS_OP_N;     /* Lt's A is our B */
  cublasOperation_t tb = g->a_trans ? CUBLAS_OP_T : CUBLAS_OP_N;     /* Lt's B is our A */
  cublasLtEpilogue_t epi = k->epilogue ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t res;
  int count = 0, rc = -1;
  if (lt_check(cublasLtMatmulDescCreate(&p->desc, ct, st), op, "cublasLtMatmulDescCreate") ||
      lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), op, "set transa") ||
      lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), op, "set transb") ||
      lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), op, "set epilogue"))
    goto done;
  if (k->epilogue &&
      lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias),
               op, "set bias pointer"))
    goto done;
  /* column-major Cᵀ (m x n) = Bᵀ (m x k) Aᵀ (k x n) */
  if (layout(&p->la, t, g->b_trans ? g->k : g->m, g->b_trans ? g->m : g->k, g->ldb, g->batch, g->b_bs, op) ||
      layout(&p->lb, t, g->a_trans ? g->n : g->k, g->a_trans ? g->k : g->n, g->lda, g->batch, g->a_bs, op) ||
      layout(&p->lc, k->c_f32 ? CUDA_R_32F : t, g->m, g->n, g->ldc, g->batch, g->c_bs, op))
    goto done;
  if (make_pref(k, op, &pref)) goto done;
  {
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &count);
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED) { lt_check(s, op, "cublasLtMatmulAlgoGetHeuristic"); goto done; }
    p->ok = s == CUBLAS_STATUS_SUCCESS && count > 0;
    if (p->ok) p->algo = res.algo;
  }
  rc = 0;
done:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (rc) plan_destroy(p);
  return rc;
}

/* The cache key of g run with the bias epilogue on or off, and beta 1 (C += A B) or 0. */
static void make_key(const em_gemm_args *g, bool epilogue, bool beta1, plan_key *k) {
  memset(k, 0, sizeof *k);                        /* padding takes part in hash and compare */
  k->device = g->device; k->dtype = g->dtype;
  k->tf32 = g->dtype == EM_F32 && em_cuda_allow_tf32();
  k->a_trans = g->a_trans; k->b_trans = g->b_trans; k->epilogue = epilogue; k->c_f32 = g->c_f32; k->beta1 = beta1;
  k->align_a = ptr_align(g->a); k->align_b = ptr_align(g->b); k->align_c = ptr_align(g->c);
  k->align_bias = epilogue ? ptr_align(g->bias) : 0;
  k->n = g->n; k->m = g->m; k->k = g->k; k->batch = g->batch;
  k->lda = g->lda; k->ldb = g->ldb; k->ldc = g->ldc;
  if (g->batch > 1) { k->a_bs = g->a_bs; k->b_bs = g->b_bs; k->c_bs = g->c_bs; }
}

/* The cached plan for g (epilogue on or off, beta 1 or 0); NULL with the error set on API failure. */
static plan *get_plan(cublasLtHandle_t h, const em_gemm_args *g, bool epilogue, bool beta1) {
  plan_key k;
  make_key(g, epilogue, beta1, &k);
  auto it = g_plans.find(k);
  if (it != g_plans.end()) return &it->second;
  plan p;
  if (plan_build(h, &k, g, &p)) return NULL;
  return &g_plans.emplace(k, p).first->second;
}

/* ---------------- small kernels ---------------- */

/* C (batch, n rows of m, row stride ldc) = bias broadcast over rows, or 0. */
template <typename T>
__global__ void fill_rows_kernel(T *c, int64_t n, int64_t m, int64_t ldc, int64_t c_bs, int64_t total,
                                 const T *bias) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t j = i % m, r = (i / m) % n, b = i / (m * n);
    c[b * c_bs + r * ldc + j] = bias ? bias[j] : from_f32<T>(0.f);
  }
}

static int fill_rows(const em_gemm_args *g, cudaStream_t s, const void *bias) {
  int64_t total = g->batch * g->n * g->m;
  if (total == 0) return 0;
  EM_DISPATCH_FLOAT(g->c_f32 ? EM_F32 : g->dtype, T,
    fill_rows_kernel<T><<<em_grid(total, 256), 256, 0, s>>>((T *)g->c, g->n, g->m, g->ldc, g->c_bs, total,
                                                            (const T *)bias));
  return em_launch_check(g->op);
}

/* ---------------- gemm ---------------- */

typedef struct { float f32[2]; double f64[2]; } scalars;   /* alpha, beta: live across the call */

/* The cuBLASLt call of plan p for g (bias pointer set on the descriptor), all but its algorithm. */
static int make_call(cublasLtHandle_t h, plan *p, const em_gemm_args *g, bool epilogue, double beta, void *ws,
                     cudaStream_t s, scalars *sc, lt_call *c) {
  if (epilogue &&
      lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias),
               g->op, "set bias pointer"))
    return -1;
  bool f64 = g->dtype == EM_F64;
  size_t es = g->c_f32 ? 4 : em_dtype_size(g->dtype);
  int64_t span = (g->batch - 1) * g->c_bs + (g->n - 1) * g->ldc + g->m;   /* elements from c to C's last */
  sc->f32[0] = 1.f; sc->f32[1] = (float)beta;
  sc->f64[0] = 1.0; sc->f64[1] = beta;
  c->h = h; c->desc = p->desc; c->la = p->la; c->lb = p->lb; c->lc = p->lc;
  c->alpha = f64 ? (const void *)&sc->f64[0] : (const void *)&sc->f32[0];
  c->beta = f64 ? (const void *)&sc->f64[1] : (const void *)&sc->f32[1];
  c->a = g->b; c->b = g->a; c->c = g->c;                /* column-major Cᵀ = Bᵀ Aᵀ: the operands swap */
  c->c_bytes = (size_t)span * es;
  c->ws = ws; c->ws_bytes = WORKSPACE_BYTES; c->s = s; c->device = g->device; c->op = g->op;
  return 0;
}

/* A graph being captured on s (or on this thread) must not see the tuner's host sync. */
static bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) { cudaGetLastError(); return true; }
  return st != cudaStreamCaptureStatusNone || em_cuda_capturing();
}

static void fill_entry(const em_gemm_args *g, const plan_key *k, double beta, em_matmul_tune_entry *e) {
  memset(e, 0, sizeof *e);
  e->device = g->device; e->dtype = g->dtype; e->tf32 = k->tf32; e->a_trans = g->a_trans; e->b_trans = g->b_trans;
  e->bias = k->epilogue; e->c_f32 = g->c_f32; e->beta = beta;
  e->n = g->n; e->m = g->m; e->k = g->k; e->batch = g->batch; e->lda = g->lda; e->ldb = g->ldb; e->ldc = g->ldc;
}

/* The candidate of split-K k that ran (us >= 0) first in algos[0, n), or -1. */
static int first_of_splitk(const cublasLtMatmulAlgo_t *algos, const float *us, int n, int k) {
  for (int i = 0; i < n; i++) {
    int id, tile, stages, splitk, cluster;
    lt_algo_config(&algos[i], &id, &tile, &stages, &splitk, &cluster);
    if (splitk == k && us[i] >= 0.f) return i;
  }
  return -1;
}

/* Once per plan: time the heuristic's first choice, up to TUNE_CANDIDATES more from
 * its list and up to TUNE_EXTRA configurations beyond it (lt_extra_algos: split-K,
 * cluster and tile variants for under-a-wave shapes), keep the fastest in
 * p->tuned_algo, record it. A key first met during graph
 * capture (no host sync allowed) keeps the heuristic's choice for good, so the graph and
 * later eager calls of the key run one algorithm: the same bits. */
static int tune_plan(plan *p, const em_gemm_args *g, bool epilogue, bool beta1, const lt_call *c) {
  if (p->tuned) return 0;
  plan_key k;
  em_matmul_tune_entry e;
  if (capturing(c->s)) {
    make_key(g, epilogue, beta1, &k);
    p->tuned_algo = p->algo;
    p->tuned = true;
    fill_entry(g, &k, beta1 ? 1.0 : 0.0, &e);
    e.in_capture = true;
    lt_algo_config(&p->algo, &e.algo, &e.tile, &e.stages, &e.splitk, &e.cluster);
    lt_algo_config(&p->algo, &e.h_algo, &e.h_tile, &e.h_stages, &e.h_splitk, &e.h_cluster);
    e.time_us = e.heuristic_time_us = -1.0;
    p->calls = lt_tune_record(&e);
    return 0;
  }
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulHeuristicResult_t res[TUNE_CANDIDATES];
  cublasLtMatmulAlgo_t algos[TUNE_CANDIDATES + 1 + TUNE_EXTRA];
  float us[TUNE_CANDIDATES + 1 + TUNE_EXTRA];
  int count = 0, n = 1, rank[TUNE_CANDIDATES + 1 + TUNE_EXTRA] = {0}, skipped = 0;
  make_key(g, epilogue, beta1, &k);
  if (make_pref(&k, g->op, &pref)) return -1;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->h, p->desc, p->la, p->lb, p->lc, p->lc, pref, TUNE_CANDIDATES,
                                                    res, &count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED)
    return lt_check(s, g->op, "cublasLtMatmulAlgoGetHeuristic (tuning)");
  algos[0] = p->algo;                               /* the heuristic's own first, then the rest of its list */
  for (int i = 0; s == CUBLAS_STATUS_SUCCESS && i < count; i++)
    if (res[i].state == CUBLAS_STATUS_SUCCESS && memcmp(&res[i].algo, &p->algo, sizeof p->algo) != 0) {
      rank[n] = i + 1;
      algos[n++] = res[i].algo;
    }
  int force = em_matmul_tune_force_splitk(), forced = -1;
  int listed = n, extra = lt_extra_algos(c, algos, listed, force, algos + listed, TUNE_EXTRA, &skipped);
  for (int j = 0; j < extra; j++) rank[n++] = TUNE_CANDIDATES + 1 + j;
  int t = lt_time_algos(c, beta1, algos, n, us);
  if (t < 0) return -1;
  int best = 0;
  for (int i = 1; t == 0 && i < n; i++)
    if (us[i] >= 0.f && (us[best] < 0.f || us[i] < us[best] * (best == 0 ? TUNE_MARGIN : 1.f))) best = i;
  if (t == 0 && force > 1 && (forced = first_of_splitk(algos, us, n, force)) >= 0) best = forced;
  p->tuned_algo = algos[best];
  p->tuned = true;
  fill_entry(g, &k, beta1 ? 1.0 : 0.0, &e);
  e.candidates = t == 0 ? n : 0;                    /* 0: no memory for the scratch copy, heuristic kept */
  e.extra = t == 0 ? extra : 0;
  for (int i = listed; t == 0 && i < n; i++) skipped += us[i] < 0.f;   /* checked, but refused at launch */
  e.skipped = skipped;
  e.forced = forced >= 0;
  e.chosen = rank[best];
  lt_algo_config(&algos[best], &e.algo, &e.tile, &e.stages, &e.splitk, &e.cluster);
  lt_algo_config(&algos[0], &e.h_algo, &e.h_tile, &e.h_stages, &e.h_splitk, &e.h_cluster);
  e.time_us = t == 0 ? us[best] : -1.0;
  e.heuristic_time_us = t == 0 ? us[0] : -1.0;
  p->calls = lt_tune_record(&e);
  return 0;
}

/* Run g through plan p: the tuned algorithm when tuning is on (tuning first if this key is new), else the heuristic's. */
static int run_plan(cublasLtHandle_t h, plan *p, const em_gemm_args *g, bool epilogue, double beta, void *ws,
                    cudaStream_t s, bool tune) {
  scalars sc;
  lt_call c;
  if (make_call(h, p, g, epilogue, beta, ws, s, &sc, &c)) return -1;
  if (tune && tune_plan(p, g, epilogue, beta != 0.0, &c)) return -1;
  if (tune && p->calls) p->calls->fetch_add(1, std::memory_order_relaxed);
  return lt_check(lt_run(&c, g->c, tune && p->tuned ? &p->tuned_algo : &p->algo), g->op, "cublasLtMatmul");
}

extern "C" int em_gemm_cuda(const em_gemm_args *g) {
  if (g->dtype != EM_F32 && g->dtype != EM_F64 && g->dtype != EM_BF16 && g->dtype != EM_F16)
    return em_error("%s: integer matmul is not supported on CUDA (got %s)", g->op, em_dtype_name(g->dtype));
  if (g->c_f32 && (g->bias || (g->dtype != EM_BF16 && g->dtype != EM_F16)))
    return em_error("%s: internal error: an f32 result needs bf16/f16 operands and no bias (got %s%s)", g->op,
                    em_dtype_name(g->dtype), g->bias ? " with a bias" : "");
  if (g->accumulate && g->bias)
    return em_error("%s: internal error: an accumulating gemm takes no bias", g->op);
  if (g->n == 0 || g->m == 0 || g->batch == 0) return 0;
  cudaStream_t s = em_cur_stream(g->device);
  if (g->k == 0) return g->accumulate ? 0 : fill_rows(g, s, g->bias);
  if (g->batch > INT32_MAX) return em_error("%s: %lld batches exceed cuBLASLt's limit", g->op, (long long)g->batch);
  bool tune;
  if (em_matmul_tune_enabled(g->op, &tune)) return -1;
  std::lock_guard<std::mutex> guard(g_lock);
  cublasLtHandle_t h;
  if (get_handle(g->device, g->op, &h)) return -1;
  void *ws = get_workspace(g->device);
  if (!ws) return -1;
  bool epi = g->bias != NULL;
  plan *p = get_plan(h, g, epi, g->accumulate);
  if (!p) return -1;
  if (p->ok) return run_plan(h, p, g, epi, g->accumulate ? 1.0 : 0.0, ws, s, tune);
  if (epi) {                                       /* no fused-bias algorithm: bias into C, then C += A B */
    plan *q = get_plan(h, g, false, true);
    if (!q) return -1;
    if (q->ok) return fill_rows(g, s, g->bias) ? -1 : run_plan(h, q, g, false, 1.0, ws, s, tune);
  }
  return em_error("%s: cuBLASLt has no algorithm for a %s gemm of (%lld x %lld) @ (%lld x %lld), batch %lld "
                  "(transposes %d/%d, leading dims %lld/%lld/%lld)", g->op, em_dtype_name(g->dtype),
                  (long long)g->n, (long long)g->k, (long long)g->k, (long long)g->m, (long long)g->batch,
                  (int)g->a_trans, (int)g->b_trans, (long long)g->lda, (long long)g->ldb, (long long)g->ldc);
}

/* ---------------- linear: bias gradient ---------------- */

#define COLS 32
#define SLICES 8

template <typename T, typename U>
__global__ void colsum_kernel(const T *g, U *out, int64_t rows, int64_t cols) {
  __shared__ float part[SLICES][COLS + 1];
  int64_t j = blockIdx.x * (int64_t)COLS + threadIdx.x;
  float acc = 0.f;
  if (j < cols)
    for (int64_t r = threadIdx.y; r < rows; r += SLICES) acc += to_f32(g[r * cols + j]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float s = 0.f;
    for (int i = 0; i < SLICES; i++) s += part[i][threadIdx.x];
    out[j] = from_f32<U>(s);
  }
}

/* f64 keeps f64 all the way (to_f32 would round it). */
__global__ void colsum_f64_kernel(const double *g, double *out, int64_t rows, int64_t cols) {
  __shared__ double part[SLICES][COLS + 1];
  int64_t j = blockIdx.x * (int64_t)COLS + threadIdx.x;
  double acc = 0;
  if (j < cols)
    for (int64_t r = threadIdx.y; r < rows; r += SLICES) acc += g[r * cols + j];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    double s = 0;
    for (int i = 0; i < SLICES; i++) s += part[i][threadIdx.x];
    out[j] = s;
  }
}

extern "C" int em_linear_bias_grad_cuda(const em_tensor *g, em_tensor *grad_bias) {
  int64_t cols = grad_bias->shape[0], rows = cols ? em_numel(g) / cols : 0;
  cudaStream_t s = em_cur_stream(g->device.index);
  dim3 block(COLS, SLICES), grid((unsigned)((cols + COLS - 1) / COLS));
  if (cols == 0) return 0;
  if (g->dtype == EM_F64 && grad_bias->dtype == EM_F64) {
    colsum_f64_kernel<<<grid, block, 0, s>>>((const double *)em_data_ptr(g), (double *)em_data_ptr(grad_bias), rows,
                                             cols);
    return em_launch_check("linear backward");
  }
  EM_DISPATCH_FLOAT(g->dtype, T, {
    EM_DISPATCH_FLOAT(grad_bias->dtype, U,
      colsum_kernel<T, U><<<grid, block, 0, s>>>((const T *)em_data_ptr(g), (U *)em_data_ptr(grad_bias), rows,
                                                     cols));
  });
  return em_launch_check("linear backward");
}
