/* Matmul tuning's extra candidates: cuBLASLt configurations its heuristic
 * list does not offer, for gemms whose output tiles fill less than a wave of
 * the SMs (the small model's 2048 x 768 outputs: 36-128 tiles for 132 SMs;
 * docs/perf.md, seventeenth session, gemmsplit).
 *
 * Two sources, every configuration checked by cublasLtMatmulAlgoCheck on the
 * call's own descriptors (workspace within ours, minimum alignments within the
 * call's pointers') and never one already listed:
 *  - split-K 2, 3, 4 and a few cluster shapes on the heuristic's first SEEDS
 *    algorithms (what the heuristic picked, cut into K slices);
 *  - each algorithm id cublasLtMatmulAlgoGetIds lists for the call's types, at
 *    each tile it accepts and split-K 1..4, kept only when its last wave is at
 *    least WAVE_FILL full (the check's wavesCount), fewest waves first
 *    (the GPU spec's prefer_splitk: any fill, that split count first).
 * Split-K reduces through the workspace in the compute type (f32): a separate
 * reduction in a fixed order, deterministic, one rounding to the output as
 * without split-K. The output-type scheme is taken only for an f32 output
 * (the same precision); the in-place scheme never. A configuration that
 * fails its check is skipped and counted, nothing else happens. */
#include <algorithm>
#include <string.h>
#include <vector>
#include "common.cuh"
#include "matmul_lt.h"

#define SEEDS 2               /* heuristic algorithms given split-K / cluster variants */
#define MAX_SPLITK 4
#define MAX_IDS 128           /* algorithm ids asked of cublasLtMatmulAlgoGetIds */
#define CHECK_BUDGET 4000     /* cublasLtMatmulAlgoCheck calls a key may spend (~µs each, once per key) */
#define WAVE_FILL 0.8f        /* an enumerated configuration's last wave at least this full */

/* Cluster shapes tried on the seeds: the Hopper ones a 2-D tile grid uses. */
static const uint16_t CLUSTERS[] = {CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                    CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1};

typedef struct {
  cublasComputeType_t ct;
  cudaDataType_t st, ta, tb, tc;
} lt_types;

typedef struct {
  const lt_call *c;
  int checks, skipped;
} checker;

static bool get_types(const lt_call *c, lt_types *t) {
  size_t w;
  int32_t ct = 0, st = 0;
  uint32_t ta = 0, tb = 0, tc = 0;
  if (cublasLtMatmulDescGetAttribute(c->desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &ct, sizeof ct, &w) ||
      cublasLtMatmulDescGetAttribute(c->desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &st, sizeof st, &w) ||
      cublasLtMatrixLayoutGetAttribute(c->la, CUBLASLT_MATRIX_LAYOUT_TYPE, &ta, sizeof ta, &w) ||
      cublasLtMatrixLayoutGetAttribute(c->lb, CUBLASLT_MATRIX_LAYOUT_TYPE, &tb, sizeof tb, &w) ||
      cublasLtMatrixLayoutGetAttribute(c->lc, CUBLASLT_MATRIX_LAYOUT_TYPE, &tc, sizeof tc, &w))
    return false;
  t->ct = (cublasComputeType_t)ct; t->st = (cudaDataType_t)st;
  t->ta = (cudaDataType_t)ta; t->tb = (cudaDataType_t)tb; t->tc = (cudaDataType_t)tc;
  return true;
}

/* The deterministic reduction scheme algo accepts for this output, or NONE (no split-K). */
static uint32_t reduction_scheme(const cublasLtMatmulAlgo_t *algo, const lt_types *t) {
  int32_t sk = 0;
  uint32_t mask = 0;
  size_t w;
  if (cublasLtMatmulAlgoCapGetAttribute(algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &sk, sizeof sk, &w) || !sk ||
      cublasLtMatmulAlgoCapGetAttribute(algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &mask, sizeof mask, &w))
    return CUBLASLT_REDUCTION_SCHEME_NONE;
  if (mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) return CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  if ((mask & CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE) && (t->tc == CUDA_R_32F || t->tc == CUDA_R_64F))
    return CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  return CUBLASLT_REDUCTION_SCHEME_NONE;
}

/* algo with split-K sk (1: none) through scheme; false when cuBLASLt refuses the attribute. */
static bool set_splitk(cublasLtMatmulAlgo_t *algo, int32_t sk, uint32_t scheme) {
  uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
  return cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof sk) == 0 &&
         cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, sk > 1 ? &scheme : &none,
                                              sizeof scheme) == 0;
}

/* The largest power of two (<= 256) that p is a multiple of. */
static uint32_t align_of(const void *p) {
  uint32_t a = 256;
  while (a > 1 && (uintptr_t)p % a) a >>= 1;
  return a;
}

/* Whether algo's minimum alignments hold for the call's pointers (cublasLtMatmulAlgoCheck
 * does not see them; the heuristic is told them through the preference). */
static bool aligned(const lt_call *c, const cublasLtMatmulAlgo_t *algo) {
  static const cublasLtMatmulAlgoCapAttributes_t caps[] = {
      CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES, CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES};
  const void *ptrs[] = {c->a, c->b, c->c, c->c};
  for (int i = 0; i < 4; i++) {
    uint32_t need = 0;
    size_t w;
    if (cublasLtMatmulAlgoCapGetAttribute(algo, caps[i], &need, sizeof need, &w) == 0 && need > align_of(ptrs[i]))
      return false;
  }
  return true;
}

/* Whether algo runs on the call's descriptors and pointers within our workspace; its waves in *waves. */
static bool check(checker *k, const cublasLtMatmulAlgo_t *algo, float *waves) {
  cublasLtMatmulHeuristicResult_t r;
  memset(&r, 0, sizeof r);
  k->checks++;
  const lt_call *c = k->c;
  if (cublasLtMatmulAlgoCheck(c->h, c->desc, c->la, c->lb, c->lc, c->lc, algo, &r) != CUBLAS_STATUS_SUCCESS ||
      r.workspaceSize > c->ws_bytes || !aligned(c, algo)) {
    k->skipped++;
    return false;
  }
  *waves = r.wavesCount;
  return true;
}

static bool listed(const cublasLtMatmulAlgo_t *a, const cublasLtMatmulAlgo_t *list, int n) {
  for (int i = 0; i < n; i++)
    if (memcmp(a, &list[i], sizeof *a) == 0) return true;
  return false;
}

typedef struct {
  cublasLtMatmulAlgo_t algo;
  float waves;
  int splitk;
} config;

/* The fill of the last wave: 1 when the tiles fill every wave, 0.5 when half of the last. */
static float wave_fill(float waves) {
  if (!(waves > 0.f)) return 0.f;
  float whole = ceilf(waves - 1e-4f);
  return waves / (whole < 1.f ? 1.f : whole);
}

/* Every (tile, split-K) of algorithm id whose last wave is at least min_fill full, onto pool. A tile
 * gets its stage count from the first that checks without split-K (the algorithm's own choice, then
 * each it lists); its split-K variants keep that stage count. */
static void enumerate_id(checker *k, const lt_types *t, int id, float min_fill, std::vector<config> *pool) {
  const lt_call *c = k->c;
  cublasLtMatmulAlgo_t base;
  if (cublasLtMatmulAlgoInit(c->h, t->ct, t->st, t->ta, t->tb, t->tc, t->tc, id, &base)) return;
  uint32_t tiles[CUBLASLT_MATMUL_TILE_END], stages[CUBLASLT_MATMUL_STAGES_END];
  size_t w = 0;
  int nt = 0, ns = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof tiles, &w) == 0)
    nt = (int)(w / sizeof tiles[0]);
  if (nt == 0) tiles[nt++] = CUBLASLT_MATMUL_TILE_UNDEFINED;
  if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_STAGES_IDS, stages, sizeof stages, &w) == 0)
    ns = (int)(w / sizeof stages[0]);
  uint32_t scheme = reduction_scheme(&base, t);
  int max_sk = scheme == CUBLASLT_REDUCTION_SCHEME_NONE ? 1 : MAX_SPLITK;
  for (int ti = 0; ti < nt; ti++) {
    cublasLtMatmulAlgo_t a = base;
    if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tiles[ti], sizeof tiles[ti]))
      continue;
    float waves = 0.f;
    bool ok = false;
    for (int si = -1; si < ns && !ok; si++) {
      if (k->checks >= CHECK_BUDGET) return;
      uint32_t st = si < 0 ? (uint32_t)CUBLASLT_MATMUL_STAGES_UNDEFINED : stages[si];
      if (si >= 0 && st == CUBLASLT_MATMUL_STAGES_UNDEFINED) continue;
      if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &st, sizeof st)) continue;
      ok = check(k, &a, &waves);
    }
    if (!ok) continue;
    if (wave_fill(waves) >= min_fill) pool->push_back({a, waves, 1});
    for (int32_t sk = 2; sk <= max_sk && k->checks < CHECK_BUDGET; sk++) {
      cublasLtMatmulAlgo_t b = a;
      if (set_splitk(&b, sk, scheme) && check(k, &b, &waves) && wave_fill(waves) >= min_fill)
        pool->push_back({b, waves, (int)sk});
    }
  }
}

int lt_extra_algos(const lt_call *c, const cublasLtMatmulAlgo_t *have, int nhave, int prefer_splitk,
                   cublasLtMatmulAlgo_t *out, int max, int *skipped) {
  checker k = {c, 0, 0};
  lt_types t;
  int n = 0;
  *skipped = 0;
  if (max <= 0 || !get_types(c, &t)) return 0;
  auto add = [&](const cublasLtMatmulAlgo_t *a) {
    if (n < max && !listed(a, have, nhave) && !listed(a, out, n)) out[n++] = *a;
  };
  /* split-K and cluster variants of the heuristic's first choices */
  for (int i = 0; i < nhave && i < SEEDS; i++) {
    uint32_t scheme = reduction_scheme(&have[i], &t);
    float waves;
    for (int32_t sk = 2; scheme != CUBLASLT_REDUCTION_SCHEME_NONE && sk <= MAX_SPLITK; sk++) {
      cublasLtMatmulAlgo_t a = have[i];
      if (set_splitk(&a, sk, scheme) && check(&k, &a, &waves)) add(&a);
    }
    for (size_t j = 0; j < sizeof CLUSTERS / sizeof CLUSTERS[0]; j++) {
      cublasLtMatmulAlgo_t a = have[i];
      if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &CLUSTERS[j],
                                               sizeof CLUSTERS[j]) == 0 &&
          !listed(&a, have, nhave) && check(&k, &a, &waves))
        add(&a);
    }
  }
  /* every algorithm id at every tile and split-K whose waves fill the SMs: fewest waves, then fullest, first */
  int ids[MAX_IDS], nids = 0;
  if (cublasLtMatmulAlgoGetIds(c->h, t.ct, t.st, t.ta, t.tb, t.tc, t.tc, MAX_IDS, ids, &nids) != CUBLAS_STATUS_SUCCESS)
    nids = 0;
  std::vector<config> pool;
  float min_fill = prefer_splitk > 1 ? 0.f : WAVE_FILL;
  for (int i = 0; i < nids && k.checks < CHECK_BUDGET; i++) enumerate_id(&k, &t, ids[i], min_fill, &pool);
  std::stable_sort(pool.begin(), pool.end(), [prefer_splitk](const config &x, const config &y) {
    if ((x.splitk == prefer_splitk) != (y.splitk == prefer_splitk)) return x.splitk == prefer_splitk;
    float wx = ceilf(x.waves - 1e-4f), wy = ceilf(y.waves - 1e-4f);
    if (wx != wy) return wx < wy;
    if (x.waves != y.waves) return x.waves > y.waves;
    return x.splitk < y.splitk;
  });
  for (const config &p : pool) add(&p.algo);
  *skipped = k.skipped;
  return n;
}
