/* The tiled loops of engine/ops/flash_cpu.c for one compute type. Included
 * twice by flash_cpu.c: REAL float, GEMM cblas_sgemm, EXP expf, LOG logf,
 * FN(x) x##_f32; then the same for double (_f64). No include guard on
 * purpose. Tile products go to BLAS (single-threaded at these sizes, see
 * flash_cpu.c); the softmax steps between them are plain loops. */

/* Mask and exponentiate one score tile in place: s[r][j] (scaled scores of
 * query row i0 + r against key j0 + j) becomes P = exp(s - lse[r]), 0 for a
 * key row i0 + r does not see. Rows n, keys nk, row pitch bk. */
static void FN(tile_probs)(const em_flash_cpu_args *a, REAL *S, int bk, int64_t i0, int64_t n, int64_t j0,
                           int64_t nk, const REAL *lse) {
  for (int64_t r = 0; r < n; r++) {
    REAL *s = S + r * bk;
    int64_t vis = EM_MIN(nk, key_end(a, i0 + r) - j0);
    for (int64_t j = 0; j < nk; j++) s[j] = j < vis ? EXP(s[j] - lse[r]) : 0;
  }
}

/* Forward of one query tile of one (b, h): online softmax over the key
 * tiles, O and the log-sum-exp written once at the end. */
static int FN(fwd_task)(const em_flash_cpu_args *a, int64_t task, int bq, int bk) {
  const int64_t nqt = (a->Tq + bq - 1) / bq, bh = task / nqt, i0 = (task % nqt) * bq;
  const int64_t b = bh / a->H, h = bh % a->H, hk = kv_head(a, h), D = a->D, n = EM_MIN(bq, a->Tq - i0);
  const REAL *Q = (const REAL *)a->q.p + b * a->q.sb + h * a->q.sh + i0 * a->q.st;
  const REAL *K = (const REAL *)a->k.p + b * a->k.sb + hk * a->k.sh;
  const REAL *V = (const REAL *)a->v.p + b * a->v.sb + hk * a->v.sh;
  REAL *w = malloc(sizeof(REAL) * (size_t)(bq * bk + bq * D + 2 * bq));
  if (!w) return -1;
  REAL *S = w, *acc = S + bq * bk, *m = acc + bq * D, *l = m + bq;
  for (int64_t r = 0; r < n; r++) { m[r] = -INFINITY; l[r] = 0; }
  memset(acc, 0, sizeof(REAL) * (size_t)(n * D));
  const int64_t kend = key_end(a, i0 + n - 1);   /* the tile's last row sees the most keys */
  for (int64_t j0 = 0; j0 < kend; j0 += bk) {
    const int64_t nk = EM_MIN(bk, kend - j0);
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nk, (int)D, (REAL)a->scale, Q, (int)a->q.st,
         K + j0 * a->k.st, (int)a->k.st, 0, S, bk);
    for (int64_t r = 0; r < n; r++) {
      REAL *s = S + r * bk, *o = acc + r * D, mx = m[r];
      const int64_t vis = EM_MIN(nk, key_end(a, i0 + r) - j0);
      for (int64_t j = 0; j < vis; j++) mx = s[j] > mx ? s[j] : mx;
      if (vis <= 0 || mx == -INFINITY) {   /* nothing this row sees in this tile */
        for (int64_t j = 0; j < nk; j++) s[j] = 0;
        continue;
      }
      const REAL alpha = EXP(m[r] - mx);   /* 0 on the row's first visible tile */
      REAL sum = 0;
      for (int64_t j = 0; j < vis; j++) { s[j] = EXP(s[j] - mx); sum += s[j]; }
      for (int64_t j = vis; j < nk; j++) s[j] = 0;
      if (alpha != 1)
        for (int64_t d = 0; d < D; d++) o[d] *= alpha;
      l[r] = l[r] * alpha + sum;
      m[r] = mx;
    }
    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)D, (int)nk, 1, S, bk, V + j0 * a->v.st,
         (int)a->v.st, 1, acc, (int)D);
  }
  REAL *O = (REAL *)a->o.p + b * a->o.sb + h * a->o.sh + i0 * a->o.st;
  REAL *L = (REAL *)a->lse + bh * a->Tq + i0;
  for (int64_t r = 0; r < n; r++) {
    const REAL inv = l[r] > 0 ? 1 / l[r] : 0;
    for (int64_t d = 0; d < D; d++) O[r * a->o.st + d] = acc[r * D + d] * inv;
    L[r] = l[r] > 0 ? m[r] + LOG(l[r]) : -INFINITY;
  }
  free(w);
  return 0;
}

/* dq of one query tile of one (b, h): recompute S and dP per key tile,
 * dS = P (dP - delta), dq = scale dS k. */
static int FN(dq_task)(const em_flash_cpu_args *a, int64_t task, int bq, int bk, const REAL *delta) {
  const int64_t nqt = (a->Tq + bq - 1) / bq, bh = task / nqt, i0 = (task % nqt) * bq;
  const int64_t b = bh / a->H, h = bh % a->H, hk = kv_head(a, h), D = a->D, n = EM_MIN(bq, a->Tq - i0);
  const REAL *Q = (const REAL *)a->q.p + b * a->q.sb + h * a->q.sh + i0 * a->q.st;
  const REAL *dO = (const REAL *)a->dout.p + b * a->dout.sb + h * a->dout.sh + i0 * a->dout.st;
  const REAL *K = (const REAL *)a->k.p + b * a->k.sb + hk * a->k.sh;
  const REAL *V = (const REAL *)a->v.p + b * a->v.sb + hk * a->v.sh;
  const REAL *L = (const REAL *)a->lse + bh * a->Tq + i0, *Dl = delta + bh * a->Tq + i0;
  REAL *w = malloc(sizeof(REAL) * (size_t)(2 * bq * bk + bq * D));
  if (!w) return -1;
  REAL *S = w, *dP = S + bq * bk, *acc = dP + bq * bk;
  memset(acc, 0, sizeof(REAL) * (size_t)(n * D));
  const int64_t kend = key_end(a, i0 + n - 1);
  for (int64_t j0 = 0; j0 < kend; j0 += bk) {
    const int64_t nk = EM_MIN(bk, kend - j0);
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nk, (int)D, (REAL)a->scale, Q, (int)a->q.st,
         K + j0 * a->k.st, (int)a->k.st, 0, S, bk);
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nk, (int)D, 1, dO, (int)a->dout.st,
         V + j0 * a->v.st, (int)a->v.st, 0, dP, bk);
    FN(tile_probs)(a, S, bk, i0, n, j0, nk, L);
    for (int64_t r = 0; r < n; r++)
      for (int64_t j = 0; j < nk; j++) dP[r * bk + j] = S[r * bk + j] * (dP[r * bk + j] - Dl[r]);
    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)D, (int)nk, 1, dP, bk, K + j0 * a->k.st,
         (int)a->k.st, 1, acc, (int)D);
  }
  REAL *dQ = (REAL *)a->dq.p + b * a->dq.sb + h * a->dq.sh + i0 * a->dq.st;
  for (int64_t r = 0; r < n; r++)
    for (int64_t d = 0; d < D; d++) dQ[r * a->dq.st + d] = (REAL)a->scale * acc[r * D + d];
  free(w);
  return 0;
}

/* dk, dv of one key tile of one (b, kv head): every query tile of every q
 * head of the group that sees a key of the tile, in a fixed order (heads,
 * then query tiles), so the sums are the same on any number of threads. */
static int FN(dkdv_task)(const em_flash_cpu_args *a, int64_t task, int bq, int bk, const REAL *delta) {
  const int64_t nkt = (a->Tk + bk - 1) / bk, bhk = task / nkt, j0 = (task % nkt) * bk;
  const int64_t b = bhk / a->Hkv, hk = bhk % a->Hkv, G = a->H / a->Hkv, D = a->D, nk = EM_MIN(bk, a->Tk - j0);
  const REAL *K = (const REAL *)a->k.p + b * a->k.sb + hk * a->k.sh + j0 * a->k.st;
  const REAL *V = (const REAL *)a->v.p + b * a->v.sb + hk * a->v.sh + j0 * a->v.st;
  REAL *w = malloc(sizeof(REAL) * (size_t)(2 * bq * bk + 2 * bk * D));
  if (!w) return -1;
  REAL *S = w, *dS = S + bq * bk, *dk = dS + bq * bk, *dv = dk + bk * D;
  memset(dk, 0, sizeof(REAL) * (size_t)(2 * bk * D));
  /* the first query row that sees key j0 (causal), on a tile boundary */
  int64_t first = a->causal ? EM_MAX(0, j0 - key_offset(a)) : 0;
  first = first / bq * bq;
  for (int64_t g = 0; g < G; g++) {
    const int64_t h = hk * G + g, bh = b * a->H + h;
    const REAL *Q = (const REAL *)a->q.p + b * a->q.sb + h * a->q.sh;
    const REAL *dO = (const REAL *)a->dout.p + b * a->dout.sb + h * a->dout.sh;
    const REAL *L = (const REAL *)a->lse + bh * a->Tq, *Dl = delta + bh * a->Tq;
    for (int64_t i0 = first; i0 < a->Tq; i0 += bq) {
      const int64_t n = EM_MIN(bq, a->Tq - i0);
      GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nk, (int)D, (REAL)a->scale, Q + i0 * a->q.st,
           (int)a->q.st, K, (int)a->k.st, 0, S, bk);
      GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nk, (int)D, 1, dO + i0 * a->dout.st,
           (int)a->dout.st, V, (int)a->v.st, 0, dS, bk);
      FN(tile_probs)(a, S, bk, i0, n, j0, nk, L + i0);
      for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < nk; j++) dS[r * bk + j] = S[r * bk + j] * (dS[r * bk + j] - Dl[i0 + r]);
      /* dv += Pᵀ dO, dk += dSᵀ q */
      GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, (int)D, (int)n, 1, S, bk, dO + i0 * a->dout.st,
           (int)a->dout.st, 1, dv, (int)D);
      GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, (int)D, (int)n, 1, dS, bk, Q + i0 * a->q.st,
           (int)a->q.st, 1, dk, (int)D);
    }
  }
  REAL *dK = (REAL *)a->dk.p + b * a->dk.sb + hk * a->dk.sh + j0 * a->dk.st;
  REAL *dV = (REAL *)a->dv.p + b * a->dv.sb + hk * a->dv.sh + j0 * a->dv.st;
  for (int64_t j = 0; j < nk; j++)
    for (int64_t d = 0; d < D; d++) {
      dK[j * a->dk.st + d] = (REAL)a->scale * dk[j * D + d];
      dV[j * a->dv.st + d] = dv[j * D + d];
    }
  free(w);
  return 0;
}

static int FN(fwd)(const em_flash_cpu_args *a) {
  int bq, bk;
  em_flash_cpu_tiles(a->D, &bq, &bk);
  const int64_t ntask = a->B * a->H * ((a->Tq + bq - 1) / bq);
  atomic_int failed = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic)
#endif
  for (int64_t t = 0; t < ntask; t++)
    if (!atomic_load_explicit(&failed, memory_order_relaxed) && FN(fwd_task)(a, t, bq, bk))
      atomic_store(&failed, 1);
  return failed ? em_error_oom("out of memory: flash_attention (CPU tile buffers)") : 0;
}

static int FN(bwd)(const em_flash_cpu_args *a) {
  int bq, bk;
  em_flash_cpu_tiles(a->D, &bq, &bk);
  const int64_t rows = a->B * a->H * a->Tq, D = a->D;
  REAL *delta = malloc(sizeof(REAL) * (size_t)EM_MAX(rows, 1));
  if (!delta) return em_error_oom("out of memory: flash_attention backward (delta, %lld rows)", (long long)rows);
  /* delta = rowsum(dO ∘ o) */
#ifdef _OPENMP
#pragma omp parallel for
#endif
  for (int64_t r = 0; r < rows; r++) {
    const int64_t i = r % a->Tq, bh = r / a->Tq, b = bh / a->H, h = bh % a->H;
    const REAL *o = (const REAL *)a->o.p + b * a->o.sb + h * a->o.sh + i * a->o.st;
    const REAL *g = (const REAL *)a->dout.p + b * a->dout.sb + h * a->dout.sh + i * a->dout.st;
    REAL s = 0;
    for (int64_t d = 0; d < D; d++) s += o[d] * g[d];
    delta[r] = s;
  }
  /* one loop over both kinds of task: dq per query tile, dk/dv per key tile */
  const int64_t nq = a->B * a->H * ((a->Tq + bq - 1) / bq), nkv = a->B * a->Hkv * ((a->Tk + bk - 1) / bk);
  atomic_int failed = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic)
#endif
  for (int64_t t = 0; t < nq + nkv; t++) {
    if (atomic_load_explicit(&failed, memory_order_relaxed)) continue;
    int rc = t < nkv ? FN(dkdv_task)(a, t, bq, bk, delta) : FN(dq_task)(a, t - nkv, bq, bk, delta);
    if (rc) atomic_store(&failed, 1);
  }
  free(delta);
  return failed ? em_error_oom("out of memory: flash_attention backward (CPU tile buffers)") : 0;
}
