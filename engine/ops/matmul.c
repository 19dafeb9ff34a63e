/* matmul and linear: torch.matmul semantics and x @ wᵀ + bias.
 *
 * Every float product goes through row-major BLAS (OpenBLAS sgemm/dgemm).
 * A strided matrix is passed as is whenever BLAS can read it: last dim
 * contiguous (NoTrans, ld = row stride) or first dim contiguous (Trans,
 * ld = column stride), so transposed views such as kᵀ or wᵀ cost no copy;
 * anything else is made contiguous first. bf16/f16 are widened to f32,
 * multiplied with f32 accumulation and rounded once at the end (what cuBLASLt
 * does on the GPU). Integers use a plain triple loop in wrapping int64.
 *
 * Batched matmul calls one gemm per broadcast batch index, except when the
 * right operand is shared by every batch and the left operand's batch and row
 * dims collapse to one stride: then it is a single (B·n, k) @ (k, m) gemm,
 * which is the common x @ W case. Backward uses the same op: grad_a = g @ bᵀ,
 * grad_b = aᵀ @ g, summed over broadcast batch dims (em_sum_to).
 *
 * On CUDA the same plan drives cuBLASLt (kernels/matmul.cu): the operand
 * layouts BLAS reads in place are handed over as transpose flags and leading
 * dims, batch dims that collapse to one stride per operand (0 for a broadcast
 * operand) become one strided-batched gemm, the outer ones a loop, and
 * linear's bias rides along as a gemm epilogue. Integer matmul is not
 * supported on CUDA.
 *
 * Autocast: under ember.autocast matmul and linear cast their float inputs to
 * the region's dtype first (em_autocast_lower; the casts are recorded, so
 * gradients reach the f32 weights) and return that dtype.
 *
 * CPU threads: OpenBLAS runs single-threaded and the engine's pool runs
 * gemms over tiles of C (and batches), each tile one BLAS call. The tiling
 * depends on the shape only (gemm_tiles), so every element of C comes from
 * the same call at any thread count: OpenBLAS's own threading changes the
 * last bits with the thread count (its edge kernels sum in another order),
 * which the CPU, the reference, must not. One pool also means no second set
 * of spinning threads. Tiles of at least 128 x 128 cost 5-10% against one
 * call (packing the shared operand once per tile). A big product left with
 * fewer than 16 tiles (a 256 x 256 weight gradient) also cuts k into blocks
 * chosen from the shape, summed in block order (gemm_kblock). With OpenBLAS's
 * SkylakeX/Cooperlake kernels the tiles a thread takes in a row run as one
 * call per rectangle (gemm_merge): the packing is paid once, the bits are the
 * same. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <cblas.h>
#include "op.h"
#include "cost.h"
#include "parallel.h"
#include "ember/threads.h"

/* ---------------- BLAS operands ---------------- */

/* How BLAS reads one logical (rows x cols) operand stored with strides (rs, cs). */
typedef struct {
  enum CBLAS_TRANSPOSE trans;
  int ld;
} blas_op;

/* True when row-major BLAS can read the matrix without a copy. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, blas_op *op) {
  int64_t ld;
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= EM_MAX(cols, 1))) {
    op->trans = CblasNoTrans;
    ld = rows == 1 ? EM_MAX(cols, 1) : rs;
  } else if ((rs == 1 || rows == 1) && (cols == 1 || cs >= EM_MAX(rows, 1))) {
    op->trans = CblasTrans;
    ld = cols == 1 ? EM_MAX(rows, 1) : cs;
  } else {
    return false;
  }
  if (ld > INT_MAX) return false;
  op->ld = (int)ld;
  return true;
}

/* C(n x m, row stride ldc) = A(n x k) B(k x m) + beta C, in f32 or f64: one BLAS call. */
static void gemm1(em_dtype dt, int64_t n, int64_t m, int64_t k, const void *A, blas_op oa,
                  const void *B, blas_op ob, double beta, void *C, int64_t ldc) {
  if (n == 0 || m == 0) return;
  if (dt == EM_F32)
    cblas_sgemm(CblasRowMajor, oa.trans, ob.trans, (int)n, (int)m, (int)k, 1.0f, A, oa.ld, B, ob.ld,
                (float)beta, C, (int)ldc);
  else
    cblas_dgemm(CblasRowMajor, oa.trans, ob.trans, (int)n, (int)m, (int)k, 1.0, A, oa.ld, B, ob.ld,
                beta, C, (int)ldc);
}

/* Tile sizes (tn rows, tm cols) of an n x m x k product, from the shape
 * alone: halve the longer side while there are fewer than 16 tiles and the
 * side is at least `from` (256: tiles down to 128; multiples of 16);
 * products under 2M multiply-adds stay one tile. */
static void gemm_tiles(int64_t n, int64_t m, int64_t k, int64_t from, int64_t *tn, int64_t *tm) {
  *tn = n; *tm = m;
  if (n * m * k < ((int64_t)1 << 21)) return;
  while (((n + *tn - 1) / *tn) * ((m + *tm - 1) / *tm) < 16) {
    int64_t *side = *tn >= *tm ? tn : tm;
    if (*side < from) side = side == tn ? tm : tn;    /* the other side, if it can still halve */
    if (*side < from) break;
    *side = ((*side + 1) / 2 + 15) / 16 * 16;
  }
}

/* Splitting k (gemm_kblock): a product with few tiles and a long k, such
 * as a 256 x 256 weight gradient over 1024 tokens (4 tiles), would leave most
 * threads idle; its k is cut into blocks of kb (>= 256, from the shape
 * alone), each (tile, k-block) one task. Block 0 writes C (with beta), block
 * b >= 1 a private n x m partial P_b, and a second pass sums each element as
 * ((C + P_1) + P_2) + ... in block order, so the result is the same at any
 * thread count. The packing is the same as one call per tile (each task packs
 * its own A and B panels); the partials add 2 (nkb - 1) n m words of traffic
 * against n m kb multiply-adds a task.
 *
 * Since a tile packs (tn + tm) k words over its k-blocks, big tiles with
 * k-blocks pack less than small tiles: gemm_plan tries tiles of >= 256 a side
 * first and takes them when their k-blocks make 16 tasks (the LM head's
 * 1024 x 256 input gradient over k = 10000: 16 tiles of 128 packed 164 MB,
 * 4 tiles of 256 x 4 k-blocks pack 82 MB; one thread, 2-core VM, CPU time:
 * 71-73 -> 61-63 ms); else (k too short) tiles down to 128, then k-blocks. */
#define GEMM_TASKS 16      /* tasks a product is cut into when big enough: one per thread of a 16-core host */
#define GEMM_MIN_KB 256    /* shortest k-block: OpenBLAS's k panels are 256-384 deep */

/* The k-block of an n x m x k product already cut into `tiles` tiles: k
 * itself (no split) unless the product is big, has fewer than GEMM_TASKS
 * tiles and k holds two blocks of at least GEMM_MIN_KB (multiples of 16). */
static int64_t gemm_kblock(int64_t n, int64_t m, int64_t k, int64_t tiles) {
  if (n * m * k < ((int64_t)1 << 21) || tiles >= GEMM_TASKS) return k;
  int64_t want = (GEMM_TASKS + tiles - 1) / tiles, nkb = EM_MIN(want, k / GEMM_MIN_KB);
  if (nkb < 2) return k;
  return ((k + nkb - 1) / nkb + 15) / 16 * 16;
}

/* A batch of gemms C_b = A_b B_b + beta C_b (same n, m, k, operand layouts
 * and strides in bytes), each cut into the same tiles and k-blocks; tasks =
 * (batch, tile, k-block). */
typedef struct {
  em_dtype dt;
  int64_t n, m, k, tn, tm, tiles_m, tiles, ldc;
  int64_t kb, nkb;              /* k-block and their count (1: no split) */
  int64_t bt;                   /* batches x tiles: the tasks of one k-block */
  bool merge;                   /* adjacent tiles of a range run as one BLAS call (gemm_merge) */
  const char *A, *B;
  char *C;
  char *P;                      /* nkb - 1 partials of n x m (row stride m), when nkb > 1 */
  blas_op oa, ob;
  double beta;
  const int64_t *offa, *offb;   /* per batch, bytes (NULL: one batch) */
  int64_t c_batch;              /* bytes between batches of C */
  size_t es;
} gemm_job;

/* Rows [i0, i1) x columns [c0, c1) of batch bi's C (k-block 0) or of
 * partial P_kbi: one BLAS call over k-block kbi. */
static void gemm_rect(const gemm_job *j, int64_t bi, int64_t kbi, int64_t i0, int64_t i1, int64_t c0, int64_t c1) {
  int64_t i = i0, c = c0, rows = i1 - i0, cols = c1 - c0;
  int64_t l = kbi * j->kb, depth = EM_MIN(j->kb, j->k - l);
  /* element (i, l) of A: NoTrans A + i*ld + l, Trans A + l*ld + i; (l, c) of B: NoTrans B + l*ld + c, Trans B + c*ld + l */
  const char *a = j->A + (j->offa ? j->offa[bi] : 0) +
                  (j->oa.trans == CblasNoTrans ? i * j->oa.ld + l : l * j->oa.ld + i) * (int64_t)j->es;
  const char *b = j->B + (j->offb ? j->offb[bi] : 0) +
                  (j->ob.trans == CblasNoTrans ? l * j->ob.ld + c : c * j->ob.ld + l) * (int64_t)j->es;
  if (kbi == 0) {
    char *cc = j->C + bi * j->c_batch + (i * j->ldc + c) * (int64_t)j->es;
    gemm1(j->dt, rows, cols, depth, a, j->oa, b, j->ob, j->beta, cc, j->ldc);
  } else {                      /* the split path has one batch */
    char *pc = j->P + ((kbi - 1) * j->n * j->m + i * j->m + c) * (int64_t)j->es;
    gemm1(j->dt, rows, cols, depth, a, j->oa, b, j->ob, 0.0, pc, j->m);
  }
}

/* Tiles [u0, u1) (row-major over the tile grid) of one batch and k-block
 * as few rectangles as possible: the rest of a first tile row, whole tile
 * rows, the start of a last one. */
static void gemm_span(const gemm_job *j, int64_t bi, int64_t kbi, int64_t u0, int64_t u1) {
  while (u0 < u1) {
    int64_t tr = u0 / j->tiles_m, tc = u0 % j->tiles_m, tr1, tc1;
    if (tc != 0 || u1 - u0 < j->tiles_m) { tr1 = tr + 1; tc1 = EM_MIN(j->tiles_m, tc + (u1 - u0)); }
    else { tr1 = tr + (u1 - u0) / j->tiles_m; tc1 = j->tiles_m; }
    gemm_rect(j, bi, kbi, tr * j->tn, EM_MIN(tr1 * j->tn, j->n), tc * j->tm, EM_MIN(tc1 * j->tm, j->m));
    u0 += (tr1 - tr) * (tc1 - tc);
  }
}

/* Merging, task t is tile t % tiles of batch (t % bt) / tiles, k-block
 * t / bt (bt = batches x tiles): a range's adjacent tasks are adjacent tiles
 * of one k-block, which gemm_span runs as rectangles (gemm_merge). Else, as
 * before, one call a task, k-block t % nkb of (batch, tile) t / nkb. */
static void gemm_tasks(void *ctx, int64_t t0, int64_t t1) {
  const gemm_job *j = ctx;
  for (int64_t t = t0; t < t1;) {
    if (!j->merge) {
      int64_t kbi = t % j->nkb, bt = t / j->nkb;
      gemm_span(j, bt / j->tiles, kbi, bt % j->tiles, bt % j->tiles + 1);
      t++;
      continue;
    }
    int64_t kbi = t / j->bt, bi = t % j->bt / j->tiles, tile = t % j->tiles;
    int64_t end = EM_MIN(t1, t + j->tiles - tile);   /* the rest of this batch's tiles */
    gemm_span(j, bi, kbi, tile, tile + (end - t));
    t = end;
  }
}

/* Rows [r0, r1) of C += P_1 + P_2 + ..., each element summed in block order. */
static void gemm_combine(void *ctx, int64_t r0, int64_t r1) {
  const gemm_job *j = ctx;
  int64_t plane = j->n * j->m;
  for (int64_t r = r0; r < r1; r++) {
    if (j->dt == EM_F32) {
      float *c = (float *)j->C + r * j->ldc;
      const float *p = (const float *)j->P + r * j->m;
      for (int64_t b = 0; b < j->nkb - 1; b++)
        for (int64_t x = 0; x < j->m; x++) c[x] += p[b * plane + x];
    } else {
      double *c = (double *)j->C + r * j->ldc;
      const double *p = (const double *)j->P + r * j->m;
      for (int64_t b = 0; b < j->nkb - 1; b++)
        for (int64_t x = 0; x < j->m; x++) c[x] += p[b * plane + x];
    }
  }
}

/* Tiles (tn, tm) of `from` (see gemm_tiles) and k-blocks (kb, nkb) for j. */
static void plan_with(gemm_job *j, int64_t from, bool split) {
  gemm_tiles(j->n, j->m, j->k, from, &j->tn, &j->tm);
  j->tiles_m = (j->m + j->tm - 1) / j->tm;
  j->tiles = (j->n + j->tn - 1) / j->tn * j->tiles_m;
  j->kb = split ? gemm_kblock(j->n, j->m, j->k, j->tiles) : j->k;
  j->nkb = j->kb < j->k ? (j->k + j->kb - 1) / j->kb : 1;
}

/* Merging tiles (EMBER_CPU_GEMM_MERGE=0|1, read once at load; 0, the
 * default: one call a tile, tasks in the order and chunks they had before;
 * 1: opt-in, because on the H200 host's 16-vCPU Xeon the 2-thread train step
 * measured 298.6 / 331.3 ms with it against 262.8 / 310.7 without, in two
 * interleaved pairs, 2026-11-28, where the VM had suggested 4-6 % less CPU). A thread's range of adjacent tiles (of one batch and k-block)
 * runs as one BLAS call per rectangle instead of one per tile: OpenBLAS
 * packs each operand panel once for the rectangle instead of once per tile
 * (a 1024 x 256 x 256 product in 16 tiles of 128 packs 4x what one call
 * does; at 2 threads the step's sgemm copy routines took ~17% of its
 * kernel's time). The tiles, k-blocks and their sums are unchanged; what
 * must hold is that OpenBLAS computes an element of C the same way whatever
 * call holds it, so long as the call's edges fall on the tiles' (multiples
 * of 16) and k is the same. That is true of the SkylakeX and Cooperlake
 * sgemm kernels of 0.3.21 (tested on every shape of the step and odd ones,
 * in tests/lua/threads_spec.lua at 1, 2 and 3 threads) and false of
 * Haswell's (its edge kernels sum in another order), so merging is on for
 * f32 on those two cores only; elsewhere each tile is one call, as before. */
static bool gemm_merge = false;
__attribute__((constructor)) static void gemm_merge_init(void) {
  const char *core = em_blas_corename();
  const bool on = em_env_digit("EMBER_CPU_GEMM_MERGE", 1, 0);
  gemm_merge = on && (strcasecmp(core, "SkylakeX") == 0 || strcasecmp(core, "Cooperlake") == 0);
}

/* j's tiles and k-blocks, from the shape alone (see above); batched
 * products keep one k (their tasks are batches x tiles). */
static void gemm_plan(gemm_job *j, int64_t nbatch) {
  if (nbatch == 1) {
    plan_with(j, 512, true);                 /* tiles of >= 256 a side, and k-blocks */
    if (j->tiles * j->nkb >= GEMM_TASKS || j->n * j->m * j->k < ((int64_t)1 << 21)) return;
  }
  plan_with(j, 256, nbatch == 1);
}

static int gemm_run(gemm_job *j, int64_t nbatch) {
  if (j->n == 0 || j->m == 0 || nbatch == 0) return 0;
  gemm_plan(j, nbatch);
  j->es = em_dtype_size(j->dt);
  j->P = NULL;
  /* no room for the k-blocks' partials (a few MiB): an error, not another
   * summation order (adding the blocks into C through BLAS would round
   * differently, so the result would depend on free memory) */
  if (j->nkb > 1 && !(j->P = malloc((size_t)((j->nkb - 1) * j->n * j->m) * j->es)))
    return em_error_oom("out of memory: matmul k-block partials (%lld x %lld x %lld blocks)", (long long)j->n,
                        (long long)j->m, (long long)(j->nkb - 1));
  int64_t macs = j->tn * j->tm * EM_MAX(j->kb, 1);           /* per task; ~32 multiply-adds per element op */
  j->bt = nbatch * j->tiles;
  j->merge = j->dt == EM_F32 && gemm_merge;
  /* merging: two chunks a thread to steal instead of four (a 16-task
   * product at 2 threads: 4 tiles a call instead of 2; at 16, one each) */
  em_parallel_for_chunks(j->bt * j->nkb, em_grain(macs / 32 + 1), j->merge ? 2 : 4, gemm_tasks, j);
  if (j->nkb == 1) return 0;
  em_parallel_for(j->n, em_grain(j->m * (j->nkb - 1)), gemm_combine, j);
  free(j->P);
  return 0;
}

/* C(n x m, row stride ldc) = A(n x k) B(k x m) + beta C, in f32 or f64, over the threads. */
static int gemm(em_dtype dt, int64_t n, int64_t m, int64_t k, const void *A, blas_op oa,
                const void *B, blas_op ob, double beta, void *C, int64_t ldc) {
  gemm_job j = {.dt = dt, .n = n, .m = m, .k = k, .ldc = ldc, .A = A, .B = B, .C = C, .oa = oa, .ob = ob,
                .beta = beta};
  return gemm_run(&j, 1);
}

static int check_blas_size(const char *op, int64_t n, int64_t m, int64_t k) {
  if (n > INT_MAX || m > INT_MAX || k > INT_MAX)
    return em_error("%s: matrix dims %lld x %lld x %lld exceed the BLAS limit of %d", op,
                    (long long)n, (long long)k, (long long)m, INT_MAX);
  return 0;
}

/* Do dims [0, nd) of (shape, stride) collapse into one dim? Sets its stride. */
static bool dims_collapse(int nd, const int64_t *shape, const int64_t *stride, int64_t *out_stride) {
  int64_t s = 0, span = 0;      /* stride and extent (in elements) of the merged inner dims */
  bool any = false;
  for (int d = nd - 1; d >= 0; d--) {
    if (shape[d] == 1) continue;
    if (!any) { s = stride[d]; span = stride[d] * shape[d]; any = true; continue; }
    if (stride[d] != span) return false;
    span = stride[d] * shape[d];
  }
  *out_stride = any ? s : 1;
  return true;
}

/* ---------------- matmul plan ---------------- */

/* Shapes as torch.matmul sees them: a is (batch..., n, k) and b is
 * (batch..., k, m) after 1-D promotion; the output drops promoted dims. */
typedef struct {
  bool a1, b1;                   /* a / b was 1-D */
  int nb;                        /* broadcast batch dims */
  int64_t batch[EM_MAX_DIMS];
  int64_t n, k, m;
  int out_ndim;
  int64_t out_shape[EM_MAX_DIMS];
  /* strides (elements) for the current a and b */
  int64_t sa[EM_MAX_DIMS], sb[EM_MAX_DIMS];   /* batch strides, 0 where broadcast */
  int64_t san, sak, sbk, sbm;
} mm_plan;

static int matmul_shapes(const em_tensor *a, const em_tensor *b, mm_plan *p) {
  char x[160], y[160];
  p->a1 = a->ndim == 1; p->b1 = b->ndim == 1;
  p->n = p->a1 ? 1 : a->shape[a->ndim - 2];
  p->k = a->shape[a->ndim - 1];
  int64_t kb = p->b1 ? b->shape[0] : b->shape[b->ndim - 2];
  p->m = p->b1 ? 1 : b->shape[b->ndim - 1];
  if (p->k != kb)
    return em_error("matmul: shapes %s and %s cannot be multiplied (%lld != %lld)",
                    em_shape_str(a->ndim, a->shape, x, 160), em_shape_str(b->ndim, b->shape, y, 160),
                    (long long)p->k, (long long)kb);
  int na = EM_MAX(a->ndim - 2, 0), nbb = EM_MAX(b->ndim - 2, 0);
  p->nb = EM_MAX(na, nbb);
  for (int i = 0; i < p->nb; i++) {
    int64_t sa = i < p->nb - na ? 1 : a->shape[i - (p->nb - na)];
    int64_t sb = i < p->nb - nbb ? 1 : b->shape[i - (p->nb - nbb)];
    if (sa != sb && sa != 1 && sb != 1)
      return em_error("matmul: the batch dims of shapes %s and %s cannot be broadcast (%lld vs %lld)",
                      em_shape_str(a->ndim, a->shape, x, 160), em_shape_str(b->ndim, b->shape, y, 160),
                      (long long)sa, (long long)sb);
    p->batch[i] = sa == 1 ? sb : sa;
  }
  p->out_ndim = 0;
  for (int i = 0; i < p->nb; i++) p->out_shape[p->out_ndim++] = p->batch[i];
  if (!p->a1) p->out_shape[p->out_ndim++] = p->n;
  if (!p->b1) p->out_shape[p->out_ndim++] = p->m;
  return 0;
}

/* Batch strides of t (whose last `mat` dims are the matrix) broadcast to the plan's batch. */
static void batch_strides(const mm_plan *p, const em_tensor *t, int mat, int64_t *s) {
  int nt = EM_MAX(t->ndim - mat, 0), lead = p->nb - nt;
  for (int i = 0; i < p->nb; i++) {
    if (i < lead) { s[i] = 0; continue; }
    int j = i - lead;
    s[i] = t->shape[j] == 1 ? 0 : t->stride[j];
  }
}

static void matmul_strides(mm_plan *p, const em_tensor *a, const em_tensor *b) {
  batch_strides(p, a, p->a1 ? 1 : 2, p->sa);
  batch_strides(p, b, p->b1 ? 1 : 2, p->sb);
  p->sak = a->stride[a->ndim - 1];
  p->san = p->a1 ? p->k : a->stride[a->ndim - 2];
  p->sbk = p->b1 ? b->stride[0] : b->stride[b->ndim - 2];
  p->sbm = p->b1 ? 1 : b->stride[b->ndim - 1];
}

static int matmul_validate(em_tensor *a, em_tensor *b, mm_plan *p) {
  if (a->ndim == 0 || b->ndim == 0)
    return em_error("matmul: both arguments need at least 1 dim, got %d-dim and %d-dim tensors",
                    a->ndim, b->ndim);
  if (em_check_same_device("matmul", a, b)) return -1;
  if (a->dtype != b->dtype)
    return em_error("matmul: expected both tensors to have the same dtype, got %s and %s",
                    em_dtype_name(a->dtype), em_dtype_name(b->dtype));
  if (a->dtype == EM_BOOL) return em_error("matmul: bool tensors are not supported");
  if (matmul_shapes(a, b, p)) return -1;
  return check_blas_size("matmul", p->n, p->m, p->k);
}

/* ---------------- matmul CPU ---------------- */

/* Offsets of batch index `bi` into a and b. */
static void batch_offsets(const mm_plan *p, int64_t bi, int64_t *oa, int64_t *ob) {
  *oa = 0; *ob = 0;
  for (int d = p->nb - 1; d >= 0; d--) {
    int64_t i = bi % p->batch[d];
    bi /= p->batch[d];
    *oa += i * p->sa[d]; *ob += i * p->sb[d];
  }
}

/* Single gemm over all batches: b is shared and a's batch+row dims collapse. */
static bool try_fold(const mm_plan *p, int64_t *rows, blas_op *oa) {
  if (p->nb == 0 || p->a1) return false;
  for (int d = 0; d < p->nb; d++) if (p->sb[d] != 0) return false;
  int64_t shape[EM_MAX_DIMS + 1], stride[EM_MAX_DIMS + 1], rs;
  for (int d = 0; d < p->nb; d++) { shape[d] = p->batch[d]; stride[d] = p->sa[d]; }
  shape[p->nb] = p->n; stride[p->nb] = p->san;
  /* a batch dim that a broadcasts (stride 0) cannot merge */
  for (int d = 0; d < p->nb; d++) if (shape[d] > 1 && stride[d] == 0) return false;
  if (!dims_collapse(p->nb + 1, shape, stride, &rs)) return false;
  *rows = em_shape_numel(p->nb + 1, shape);
  return *rows <= INT_MAX && blas_layout(*rows, p->k, rs, p->sak, oa);
}

/* Replace *t by a contiguous copy (BLAS could not read its strides). */
static int make_contiguous(em_tensor **t, em_tensor *orig, em_dtype dt) {
  em_tensor_release(*t);
  *t = em_contiguous_as(orig, dt);
  return *t ? 0 : -1;
}

/* Bring a and b (already of dtype dt) into layouts a gemm library accepts:
 * transposed or row-strided views pass as they are, anything else is made
 * contiguous. Sets the plan's strides and the two operand ops; *ac and *bc
 * are new references (release them even on failure). lib names the library
 * in the internal-error message. Shared by the BLAS and cuBLASLt paths. */
static int prepare_operands(mm_plan *p, em_tensor *a, em_tensor *b, em_dtype dt, em_tensor **ac,
                            em_tensor **bc, blas_op *oa, blas_op *ob, const char *lib) {
  *ac = em_tensor_retain(a);
  *bc = em_tensor_retain(b);
  matmul_strides(p, *ac, *bc);
  if (!blas_layout(p->n, p->k, p->san, p->sak, oa)) {
    if (make_contiguous(ac, a, dt)) return -1;
    matmul_strides(p, *ac, *bc);
  }
  if (!blas_layout(p->k, p->m, p->sbk, p->sbm, ob)) {
    if (make_contiguous(bc, b, dt)) return -1;
    matmul_strides(p, *ac, *bc);
  }
  /* contiguous operands always pass; the check guards the library call regardless */
  if (!blas_layout(p->n, p->k, p->san, p->sak, oa) || !blas_layout(p->k, p->m, p->sbk, p->sbm, ob))
    return em_error("matmul: internal error: operand strides unusable by %s", lib);
  return 0;
}

/* f32/f64 matmul of a and b (already of dtype dt) into a new contiguous tensor. */
static em_tensor *matmul_blas(em_tensor *a, em_tensor *b, mm_plan *p, em_dtype dt) {
  em_tensor *ac = NULL, *bc = NULL, *out = NULL;
  blas_op oa, ob, of;
  if (prepare_operands(p, a, b, dt, &ac, &bc, &oa, &ob, "BLAS")) goto done;
  if (!(out = em_empty(p->out_ndim, p->out_shape, dt, a->device))) goto done;
  size_t es = em_dtype_size(dt);
  char *A = em_storage_ptr(ac), *B = em_storage_ptr(bc), *C = em_data_ptr(out);
  int64_t nbatch = em_shape_numel(p->nb, p->batch), rows;
  if (p->k == 0) { memset(C, 0, (size_t)em_numel(out) * es); goto done; }
  if (try_fold(p, &rows, &of)) {
    if (gemm(dt, rows, p->m, p->k, A + ac->offset * (int64_t)es, of, B + bc->offset * (int64_t)es, ob, 0, C, p->m)) {
      em_tensor_release(out);
      out = NULL;
    }
    goto done;
  }
  /* every batch's gemm at once: the pool takes (batch, tile) tasks */
  int64_t *offs = malloc(sizeof(int64_t) * 2 * (size_t)nbatch);
  if (!offs) {
    em_error_oom("out of memory: matmul batch offsets (%lld)", (long long)nbatch);
    em_tensor_release(out);
    out = NULL;
    goto done;
  }
  for (int64_t bi = 0; bi < nbatch; bi++) {
    batch_offsets(p, bi, &offs[bi], &offs[nbatch + bi]);
    offs[bi] = (ac->offset + offs[bi]) * (int64_t)es;
    offs[nbatch + bi] = (bc->offset + offs[nbatch + bi]) * (int64_t)es;
  }
  gemm_job j = {.dt = dt, .n = p->n, .m = p->m, .k = p->k, .ldc = p->m, .A = A, .B = B, .C = C, .oa = oa, .ob = ob,
                .offa = offs, .offb = offs + nbatch, .c_batch = p->n * p->m * (int64_t)es};
  if (gemm_run(&j, nbatch)) {
    em_tensor_release(out);
    out = NULL;
  }
  free(offs);
done:
  em_tensor_release(ac); em_tensor_release(bc);
  return out;
}

/* Integer matmul: triple loop, wrapping int64 accumulation, result in a's dtype. */
static em_tensor *matmul_int(em_tensor *a, em_tensor *b, mm_plan *p) {
  em_tensor *out = em_empty(p->out_ndim, p->out_shape, a->dtype, a->device);
  if (!out) return NULL;
  matmul_strides(p, a, b);
  const void *A = em_storage_ptr(a), *B = em_storage_ptr(b);
  void *C = em_data_ptr(out);
  int64_t nbatch = em_shape_numel(p->nb, p->batch), o = 0;
  for (int64_t bi = 0; bi < nbatch; bi++) {
    int64_t offa, offb;
    batch_offsets(p, bi, &offa, &offb);
    offa += a->offset; offb += b->offset;
    for (int64_t i = 0; i < p->n; i++)
      for (int64_t j = 0; j < p->m; j++, o++) {
        uint64_t acc = 0;
        for (int64_t l = 0; l < p->k; l++)
          acc += (uint64_t)em_load_i64(A, a->dtype, offa + i * p->san + l * p->sak) *
                 (uint64_t)em_load_i64(B, b->dtype, offb + l * p->sbk + j * p->sbm);
        em_store_i64(C, out->dtype, o, (int64_t)acc);
      }
  }
  return out;
}

/* bf16/f16: widen to f32, multiply, round once. */
static em_tensor *matmul_half(em_tensor *a, em_tensor *b, mm_plan *p) {
  em_tensor *a32 = em_contiguous_as(a, EM_F32);
  em_tensor *b32 = a32 ? em_contiguous_as(b, EM_F32) : NULL;
  em_tensor *o32 = b32 ? matmul_blas(a32, b32, p, EM_F32) : NULL;
  em_tensor *out = o32 ? em_contiguous_as(o32, a->dtype) : NULL;
  em_tensor_release(a32); em_tensor_release(b32); em_tensor_release(o32);
  return out;
}

static em_tensor *matmul_cpu(em_tensor *a, em_tensor *b, mm_plan *p) {
  switch (a->dtype) {
    case EM_F32: case EM_F64: return matmul_blas(a, b, p, a->dtype);
    case EM_BF16: case EM_F16: return matmul_half(a, b, p);
    default: return matmul_int(a, b, p);
  }
}

/* ---------------- matmul CUDA ---------------- */

static void set_operand(blas_op o, bool *trans, int64_t *ld) {
  *trans = o.trans == CblasTrans;
  *ld = o.ld;
}

static em_tensor *matmul_cuda(em_tensor *a, em_tensor *b, mm_plan *p) {
  if (!em_dtype_is_float(a->dtype)) {
    em_error("matmul: integer matmul is not supported on CUDA (got %s tensors)", em_dtype_name(a->dtype));
    return NULL;
  }
  em_tensor *ac = NULL, *bc = NULL, *out = NULL;
  em_dtype dt = a->dtype;
  blas_op oa, ob, of;
  if (prepare_operands(p, a, b, dt, &ac, &bc, &oa, &ob, "cuBLASLt")) goto done;
  if (!(out = em_empty(p->out_ndim, p->out_shape, dt, a->device))) goto done;
  size_t es = em_dtype_size(dt);
  const char *A = em_storage_ptr(ac), *B = em_storage_ptr(bc);
  char *C = em_data_ptr(out);
  em_gemm_args g = {.op = "matmul", .dtype = dt, .device = a->device.index, .n = p->n, .m = p->m, .k = p->k,
                    .batch = 1, .ldc = p->m, .c_bs = p->n * p->m};
  set_operand(oa, &g.a_trans, &g.lda);
  set_operand(ob, &g.b_trans, &g.ldb);
  int64_t rows;
  if (try_fold(p, &rows, &of)) {                 /* shared b: one (B·n, k) @ (k, m) gemm */
    g.n = rows;
    set_operand(of, &g.a_trans, &g.lda);
    g.a = A + ac->offset * (int64_t)es; g.b = B + bc->offset * (int64_t)es; g.c = C;
    if (em_gemm_cuda(&g)) { em_tensor_release(out); out = NULL; }
    goto done;
  }
  /* the innermost batch dims that collapse to one stride in a, b and out form one batched gemm */
  int64_t sc[EM_MAX_DIMS], span = p->n * p->m;
  for (int d = p->nb - 1; d >= 0; d--) { sc[d] = span; span *= p->batch[d]; }
  int d0 = p->nb;
  while (d0 > 0) {
    int64_t s1, s2, s3;
    int n = p->nb - (d0 - 1);
    if (!dims_collapse(n, p->batch + d0 - 1, p->sa + d0 - 1, &s1) ||
        !dims_collapse(n, p->batch + d0 - 1, p->sb + d0 - 1, &s2) ||
        !dims_collapse(n, p->batch + d0 - 1, sc + d0 - 1, &s3))
      break;
    d0--;
  }
  g.batch = em_shape_numel(p->nb - d0, p->batch + d0);
  if (d0 < p->nb) {
    dims_collapse(p->nb - d0, p->batch + d0, p->sa + d0, &g.a_bs);
    dims_collapse(p->nb - d0, p->batch + d0, p->sb + d0, &g.b_bs);
    dims_collapse(p->nb - d0, p->batch + d0, sc + d0, &g.c_bs);
  }
  int64_t outer = em_shape_numel(d0, p->batch);
  for (int64_t o = 0; o < outer; o++) {
    int64_t offa = 0, offb = 0, offc = 0, r = o;
    for (int d = d0 - 1; d >= 0; d--) {
      int64_t i = r % p->batch[d];
      r /= p->batch[d];
      offa += i * p->sa[d]; offb += i * p->sb[d]; offc += i * sc[d];
    }
    g.a = A + (ac->offset + offa) * (int64_t)es;
    g.b = B + (bc->offset + offb) * (int64_t)es;
    g.c = C + offc * (int64_t)es;
    if (em_gemm_cuda(&g)) { em_tensor_release(out); out = NULL; goto done; }
  }
done:
  em_tensor_release(ac); em_tensor_release(bc);
  return out;
}

/* ---------------- matmul backward ---------------- */

/* t as a matrix (batch..., rows, cols): 1-D a becomes (1, k), 1-D b becomes (k, 1). */
static em_tensor *as_matrix(em_tensor *t, bool row) {
  if (t->ndim != 1) return em_tensor_retain(t);
  return em_unsqueeze(t, row ? 0 : 1);
}

/* g with the dims that 1-D promotion removed put back: (batch..., n, m). */
static em_tensor *grad_as_matrix(em_tensor *g, bool a1, bool b1) {
  if (a1 && b1) return em_reshape(g, 2, (int64_t[]){1, 1});
  if (a1) return em_unsqueeze(g, g->ndim - 1);
  if (b1) return em_unsqueeze(g, g->ndim);
  return em_tensor_retain(g);
}

/* Sum t over broadcast dims down to input i's shape. Consumes t. */
static em_tensor *reduce_to_input(em_node *n, int i, em_tensor *t, int ndim_mat, const int64_t *mat_shape) {
  if (!t) return NULL;
  em_tensor *s = em_sum_to(t, ndim_mat, mat_shape);
  em_tensor_release(t);
  if (!s) return NULL;
  em_tensor *r = em_reshape(s, n->in_ndim[i], n->in_shape[i]);
  em_tensor_release(s);
  return r;
}

/* grad_b = aᵀ g. When b is a plain matrix and a is batched, fold the batch
 * into the contraction: (B·n, k)ᵀ @ (B·n, m), one gemm, no (B, k, m) temporary. */
static em_tensor *grad_b_of(em_node *n, em_tensor *A, em_tensor *G) {
  em_tensor *r = NULL;
  int64_t k = A->shape[A->ndim - 1], m = G->shape[G->ndim - 1];
  if (n->in_ndim[1] <= 2 && A->ndim > 2) {
    int64_t rows = em_shape_numel(A->ndim - 1, A->shape);   /* b is a matrix: G has A's batch */
    em_tensor *a2 = em_reshape(A, 2, (int64_t[]){rows, k});
    em_tensor *g2 = a2 ? em_reshape(G, 2, (int64_t[]){rows, m}) : NULL;
    em_tensor *at = g2 ? em_transpose(a2, 0, 1) : NULL;
    r = at ? em_matmul(at, g2) : NULL;
    em_tensor_release(a2); em_tensor_release(g2); em_tensor_release(at);
  } else {
    em_tensor *at = em_transpose(A, -1, -2);
    r = at ? em_matmul(at, G) : NULL;
    em_tensor_release(at);
  }
  if (n->in_ndim[1] > 2) return reduce_to_input(n, 1, r, n->in_ndim[1], n->in_shape[1]);
  return reduce_to_input(n, 1, r, 2, (int64_t[]){k, m});
}

static int matmul_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  bool a1 = n->in_ndim[0] == 1, b1 = n->in_ndim[1] == 1;
  em_tensor *A = as_matrix(n->saved[0], true), *B = as_matrix(n->saved[1], false);
  em_tensor *G = A && B ? grad_as_matrix(gout[0], a1, b1) : NULL;
  int rc = G ? 0 : -1;
  if (rc == 0 && em_node_needs_input_grad(n, 0)) {
    em_tensor *bt = em_transpose(B, -1, -2);
    em_tensor *ga = bt ? em_matmul(G, bt) : NULL;
    em_tensor_release(bt);
    gin[0] = reduce_to_input(n, 0, ga, A->ndim, A->shape);
    if (!gin[0]) rc = -1;
  }
  if (rc == 0 && em_node_needs_input_grad(n, 1)) {
    gin[1] = grad_b_of(n, A, G);
    if (!gin[1]) rc = -1;
  }
  em_tensor_release(A); em_tensor_release(B); em_tensor_release(G);
  return rc;
}

static em_tensor *matmul_op(em_tensor *a, em_tensor *b) {
  mm_plan p;
  if (matmul_validate(a, b, &p)) return NULL;
  em_tensor *out = a->device.type == EM_CPU ? matmul_cpu(a, b, &p) : matmul_cuda(a, b, &p);
  /* 2 n m k per batch; a, b (broadcast batches once) and the result moved once */
  EM_OP_COST(em_cost_bytes(3, (em_tensor *const[]){a, b, out}),
             2.0 * (double)em_shape_numel(p.nb, p.batch) * (double)p.n * (double)p.m * (double)p.k,
             em_cost_gemm_class(a->dtype, a->device));
  return em_op_record(out, NULL, "matmul", matmul_backward, 2, (em_tensor *[]){a, b}, 2, (em_tensor *[]){a, b});
}

em_tensor *em_matmul(em_tensor *a, em_tensor *b) {
  EM_OP_SCOPE("matmul");
  em_op_args l;
  if (em_op_autocast(&l, EM_AUTOCAST_LOWER, 2, (em_tensor *[]){a, b})) return NULL;
  em_tensor *out = matmul_op(l.t[0], l.t[1]);
  em_op_args_release(&l);
  return out;
}

/* ---------------- linear ---------------- */

static int linear_validate(em_tensor *x, em_tensor *w, em_tensor *bias) {
  char s1[160], s2[160];
  if (x->ndim < 1) return em_error("linear: expected x to have at least 1 dim, got a 0-dim tensor");
  if (em_check_ndim("linear", "weight", w, 2)) return -1;
  if (em_check_float("linear", "x", x)) return -1;
  if (em_check_same_device("linear", x, w)) return -1;
  if (w->dtype != x->dtype)
    return em_error("linear: expected weight to have x's dtype %s, got %s", em_dtype_name(x->dtype),
                    em_dtype_name(w->dtype));
  if (x->shape[x->ndim - 1] != w->shape[1])
    return em_error("linear: x of shape %s and weight of shape %s are incompatible "
                    "(x's last dim %lld != in_features %lld)", em_shape_str(x->ndim, x->shape, s1, 160),
                    em_shape_str(w->ndim, w->shape, s2, 160), (long long)x->shape[x->ndim - 1],
                    (long long)w->shape[1]);
  int64_t rows = em_shape_numel(x->ndim - 1, x->shape);   /* M of the (M, in) gemm */
  if (!bias) return check_blas_size("linear", rows, w->shape[0], w->shape[1]);
  if (em_check_same_device("linear", x, bias)) return -1;
  if (bias->dtype != x->dtype)
    return em_error("linear: expected bias to have x's dtype %s, got %s", em_dtype_name(x->dtype),
                    em_dtype_name(bias->dtype));
  if (bias->ndim != 1 || bias->shape[0] != w->shape[0])
    return em_error("linear: expected bias of shape [%lld] (out_features), got %s", (long long)w->shape[0],
                    em_shape_str(bias->ndim, bias->shape, s1, 160));
  return check_blas_size("linear", rows, w->shape[0], w->shape[1]);
}

/* y (M, out) = x (M, in) @ wᵀ (+ bias), all of dtype dt (f32/f64), y contiguous. */
static int linear_blas(em_tensor *x, em_tensor *w, em_tensor *bias, em_tensor *y, em_dtype dt) {
  int64_t in = w->shape[1], out = w->shape[0], M = em_shape_numel(x->ndim - 1, x->shape), rs;
  em_tensor *xc = em_tensor_retain(x), *wc = em_tensor_retain(w), *bc = NULL;
  blas_op ox, ow;
  int rc = -1;
  if (M > INT_MAX) { em_error("linear: %lld rows exceed the BLAS limit of %d", (long long)M, INT_MAX); goto done; }
  if (!dims_collapse(x->ndim - 1, x->shape, x->stride, &rs) ||
      !blas_layout(M, in, rs, x->stride[x->ndim - 1], &ox)) {
    if (make_contiguous(&xc, x, dt)) goto done;
    if (!blas_layout(M, in, in, 1, &ox)) { em_error("linear: internal error: x unusable by BLAS"); goto done; }
  }
  /* wᵀ is (in, out) with strides (w.stride[1], w.stride[0]): a plain (out, in) w reads as Trans */
  if (!blas_layout(in, out, w->stride[1], w->stride[0], &ow)) {
    if (make_contiguous(&wc, w, dt)) goto done;
    if (!blas_layout(in, out, 1, in, &ow)) { em_error("linear: internal error: weight unusable by BLAS"); goto done; }
  }
  size_t es = em_dtype_size(dt);
  char *Y = em_data_ptr(y);
  if (bias) {
    if (!(bc = em_contiguous_as(bias, dt))) goto done;
    for (int64_t r = 0; r < M; r++) memcpy(Y + r * out * (int64_t)es, em_data_ptr(bc), (size_t)out * es);
  }
  if (in == 0 && !bias) memset(Y, 0, (size_t)(M * out) * es);
  else if (in > 0 && gemm(dt, M, out, in, em_data_ptr(xc), ox, em_data_ptr(wc), ow, bias ? 1.0 : 0.0, Y, out))
    goto done;
  rc = 0;
done:
  em_tensor_release(xc); em_tensor_release(wc); em_tensor_release(bc);
  return rc;
}

static em_tensor *linear_cpu(em_tensor *x, em_tensor *w, em_tensor *bias) {
  int64_t shape[EM_MAX_DIMS];
  memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  shape[x->ndim - 1] = w->shape[0];
  bool half = x->dtype == EM_BF16 || x->dtype == EM_F16;
  em_dtype ct = half ? EM_F32 : x->dtype;
  em_tensor *y = em_empty(x->ndim, shape, ct, x->device);
  if (!y) return NULL;
  em_tensor *xc = half ? em_contiguous_as(x, ct) : em_tensor_retain(x);
  em_tensor *wc = xc && half ? em_contiguous_as(w, ct) : em_tensor_retain(w);
  em_tensor *bc = !bias ? NULL : half ? em_contiguous_as(bias, ct) : em_tensor_retain(bias);
  int rc = (!xc || !wc || (bias && !bc)) ? -1 : linear_blas(xc, wc, bc, y, ct);
  em_tensor_release(xc); em_tensor_release(wc); em_tensor_release(bc);
  if (rc) { em_tensor_release(y); return NULL; }
  if (!half) return y;
  em_tensor *r = em_contiguous_as(y, x->dtype);
  em_tensor_release(y);
  return r;
}

/* y (..., out) = x @ wᵀ (+ bias) with cuBLASLt, bias fused as the epilogue. */
static em_tensor *linear_cuda(em_tensor *x, em_tensor *w, em_tensor *bias) {
  int64_t in = w->shape[1], out = w->shape[0], M = em_shape_numel(x->ndim - 1, x->shape), rs, shape[EM_MAX_DIMS];
  memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
  shape[x->ndim - 1] = out;
  em_tensor *xc = em_tensor_retain(x), *wc = em_tensor_retain(w), *bc = NULL, *y = NULL;
  blas_op ox, ow;
  if (!dims_collapse(x->ndim - 1, x->shape, x->stride, &rs) || !blas_layout(M, in, rs, x->stride[x->ndim - 1], &ox)) {
    if (make_contiguous(&xc, x, x->dtype)) goto done;
    if (!blas_layout(M, in, in, 1, &ox)) { em_error("linear: internal error: x unusable by cuBLASLt"); goto done; }
  }
  if (!blas_layout(in, out, w->stride[1], w->stride[0], &ow)) {
    if (make_contiguous(&wc, w, w->dtype)) goto done;
    if (!blas_layout(in, out, 1, in, &ow)) { em_error("linear: internal error: weight unusable by cuBLASLt"); goto done; }
  }
  if (bias && !(bc = em_contiguous(bias))) goto done;
  if (!(y = em_empty(x->ndim, shape, x->dtype, x->device))) goto done;
  em_gemm_args g = {.op = "linear", .dtype = x->dtype, .device = x->device.index, .n = M, .m = out, .k = in,
                    .batch = 1, .a = em_data_ptr(xc), .b = em_data_ptr(wc), .c = em_data_ptr(y), .ldc = out,
                    .bias = bc ? em_data_ptr(bc) : NULL};
  set_operand(ox, &g.a_trans, &g.lda);
  set_operand(ow, &g.b_trans, &g.ldb);
  if (em_gemm_cuda(&g)) { em_tensor_release(y); y = NULL; }
done:
  em_tensor_release(xc); em_tensor_release(wc); em_tensor_release(bc);
  return y;
}

/* grad_bias = sum of g2 over rows, in the bias dtype, with one deterministic kernel. */
static em_tensor *linear_bias_grad_cuda(em_tensor *g2, em_dtype dt) {
  em_tensor *gc = em_contiguous(g2);
  em_tensor *gb = gc ? em_empty(1, &g2->shape[1], dt, g2->device) : NULL;
  if (gb && em_linear_bias_grad_cuda(gc, gb)) { em_tensor_release(gb); gb = NULL; }
  if (gb) EM_OP_COST(em_cost_nbytes(gc) + em_cost_nbytes(gb), em_numel(gc), em_cost_simt_class(gc->dtype));
  em_tensor_release(gc);
  return gb;
}

/* g (..., out) -> grad_x = g @ w, grad_w = g2ᵀ @ x2 over all leading dims, grad_bias = sum g2. */
static int linear_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *x = n->saved[0], *w = n->saved[1];
  int64_t in = w->shape[1], out = w->shape[0];
  em_tensor *g2 = em_reshape(gout[0], 2, (int64_t[]){em_shape_numel(x->ndim - 1, x->shape), out});
  if (!g2) return -1;
  int rc = 0;
  if (em_node_needs_input_grad(n, 0)) {
    em_tensor *gx = em_matmul(g2, w);
    gin[0] = gx ? em_reshape(gx, x->ndim, x->shape) : NULL;
    em_tensor_release(gx);
    if (!gin[0]) rc = -1;
  }
  if (rc == 0 && em_node_needs_input_grad(n, 1)) {
    em_tensor *x2 = em_reshape(x, 2, (int64_t[]){g2->shape[0], in});
    em_tensor *gt = x2 ? em_transpose(g2, 0, 1) : NULL;
    gin[1] = gt ? em_matmul(gt, x2) : NULL;
    em_tensor_release(x2); em_tensor_release(gt);
    if (!gin[1]) rc = -1;
  }
  if (rc == 0 && n->n_in > 2 && em_node_needs_input_grad(n, 2)) {
    if (g2->device.type == EM_CUDA) gin[2] = linear_bias_grad_cuda(g2, n->in_dtype[2]);
    else
    gin[2] = em_sum(g2, 1, (int64_t[]){0}, false);
    if (!gin[2]) rc = -1;
  }
  em_tensor_release(g2);
  return rc;
}

static em_tensor *linear_op(em_tensor *x, em_tensor *w, em_tensor *bias) {
  if (linear_validate(x, w, bias)) return NULL;
  em_tensor *y = x->device.type == EM_CPU ? linear_cpu(x, w, bias) : linear_cuda(x, w, bias);
  /* the (M, in) @ (in, out) gemm, + M out for the bias */
  EM_OP_COST(em_cost_bytes(4, (em_tensor *const[]){x, w, bias, y}),
             (double)em_shape_numel(x->ndim - 1, x->shape) * (double)w->shape[0] *
                 (2.0 * (double)w->shape[1] + (bias ? 1 : 0)),
             em_cost_gemm_class(x->dtype, x->device));
  return em_op_record(y, NULL, "linear", linear_backward, 3, (em_tensor *[]){x, w, bias}, 2, (em_tensor *[]){x, w});
}

/* c (n x m) = a (n x k) @ b (k x m) for 2-D half views on CUDA, c in out_dt:
 * a's dtype, or f32 written by cuBLASLt straight from the f32 accumulators.
 * With `into` (contiguous n x m of out_dt), c = into += a @ b instead. */
static em_tensor *mm2d_cuda_as(em_tensor *a, em_tensor *b, em_dtype out_dt, em_tensor *into) {
  int64_t n = a->shape[0], k = a->shape[1], m = b->shape[1];
  em_tensor *ac = em_tensor_retain(a), *bc = em_tensor_retain(b), *c = NULL;
  blas_op oa = {CblasNoTrans, 0}, ob = oa;   /* set by blas_layout (-O3 cannot tell) */
  if (!blas_layout(n, k, a->stride[0], a->stride[1], &oa)) {
    if (make_contiguous(&ac, a, a->dtype)) goto done;
    blas_layout(n, k, k, 1, &oa);
  }
  if (!blas_layout(k, m, b->stride[0], b->stride[1], &ob)) {
    if (make_contiguous(&bc, b, b->dtype)) goto done;
    blas_layout(k, m, m, 1, &ob);
  }
  if (!(c = into ? em_tensor_retain(into) : em_empty(2, (int64_t[]){n, m}, out_dt, a->device))) goto done;
  em_gemm_args g = {.op = "linear", .dtype = a->dtype, .device = a->device.index, .n = n, .m = m, .k = k,
                    .batch = 1, .a = em_data_ptr(ac), .b = em_data_ptr(bc), .c = em_data_ptr(c), .ldc = m,
                    .c_f32 = out_dt != a->dtype, .accumulate = into != NULL};
  set_operand(oa, &g.a_trans, &g.lda);
  set_operand(ob, &g.b_trans, &g.ldb);
  if (em_gemm_cuda(&g)) { em_tensor_release(c); c = NULL; }
  /* the gemm of the autocast linear's backward: a, b read, c written (and read when accumulating) */
  EM_OP_COST(em_cost_bytes(3, (em_tensor *const[]){a, b, c}) + (into ? em_cost_nbytes(into) : 0),
             2.0 * (double)n * (double)m * (double)k, em_cost_gemm_class(a->dtype, a->device));
done:
  em_tensor_release(ac); em_tensor_release(bc);
  return c;
}

/* The autocast linear's backward: saved are the half copies of x and w; the
 * gradients come out in x's and w's own dtypes (f32 for f32 weights and
 * normed activations) in one gemm each, with no bf16 rounding and no
 * conversion kernels. */
static int autocast_linear_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *lx = n->saved[0], *lw = n->saved[1];
  int64_t in = lw->shape[1], out = lw->shape[0], rows = em_shape_numel(lx->ndim - 1, lx->shape);
  em_tensor *g = gout[0]->dtype == lw->dtype ? em_tensor_retain(gout[0]) : em_to(gout[0], lw->dtype, lw->device);
  em_tensor *g2 = g ? em_reshape(g, 2, (int64_t[]){rows, out}) : NULL;
  em_tensor_release(g);
  if (!g2) return -1;
  int rc = 0;
  if (em_node_needs_input_grad(n, 0)) {
    /* q, k and v (w1 and w3) share their input: the second and third add
     * their gradient into the first's with beta = 1 instead of a separate add */
    em_tensor *sink = em_node_grad_sink(n, 0);
    em_tensor *into = sink ? em_reshape(sink, 2, (int64_t[]){rows, in}) : NULL;
    em_tensor *gx = !sink || into ? mm2d_cuda_as(g2, lw, n->in_dtype[0], into) : NULL;
    if (gx) gin[0] = sink ? em_tensor_retain(sink) : em_reshape(gx, lx->ndim, lx->shape);
    em_tensor_release(into); em_tensor_release(gx);
    if (!gin[0]) rc = -1;
  }
  if (rc == 0 && em_node_needs_input_grad(n, 1)) {
    /* a weight whose .grad already exists (a DDP bucket view, accumulated
     * micro-batches) gets its gradient added in by the gemm (beta = 1) */
    em_tensor *x2 = em_reshape(lx, 2, (int64_t[]){rows, in});
    em_tensor *gt = x2 ? em_transpose(g2, 0, 1) : NULL;
    gin[1] = gt ? mm2d_cuda_as(gt, x2, n->in_dtype[1], em_node_grad_sink(n, 1)) : NULL;
    em_tensor_release(x2); em_tensor_release(gt);
    if (!gin[1]) rc = -1;
  }
  em_tensor_release(g2);
  return rc;
}

/* Does the fused autocast linear apply? CUDA, no bias, gradients wanted, and
 * x and w each f32 or already in the region's dtype (f64 and mixed halves
 * take the general path). */
static bool autocast_linear_applies(em_tensor *x, em_tensor *w, em_tensor *bias) {
  em_dtype ct = em_autocast_dtype();
  return !bias && x->device.type == EM_CUDA && em_device_eq(x->device, w->device) &&
         (x->dtype == EM_F32 || x->dtype == ct) && (w->dtype == EM_F32 || w->dtype == ct) &&
         x->ndim >= 1 && w->ndim == 2 && em_grad_needed(2, (em_tensor *[]){x, w});
}

static em_tensor *autocast_linear_cuda(em_tensor *x, em_tensor *w) {
  bool grad = em_set_grad_enabled(false);
  em_tensor *lx = em_autocast_value(x), *lw = lx ? em_autocast_value(w) : NULL;
  em_tensor *y = lw ? linear_op(lx, lw, NULL) : NULL;
  em_set_grad_enabled(grad);
  /* one node over the original x and w, saving their casts */
  y = em_op_record(y, NULL, "linear", autocast_linear_backward, 2, (em_tensor *[]){x, w}, 2, (em_tensor *[]){lx, lw});
  em_tensor_release(lx); em_tensor_release(lw);
  return y;
}

em_tensor *em_linear(em_tensor *x, em_tensor *w, em_tensor *bias) {
  EM_OP_SCOPE("linear");
  if (em_autocast_enabled() && autocast_linear_applies(x, w, bias)) return autocast_linear_cuda(x, w);
  em_op_args l;
  if (em_op_autocast(&l, EM_AUTOCAST_LOWER, 3, (em_tensor *[]){x, w, bias})) return NULL;
  em_tensor *y = linear_op(l.t[0], l.t[1], l.t[2]);
  em_op_args_release(&l);
  return y;
}
