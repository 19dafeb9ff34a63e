/* Sorting and selection: sort, argsort, topk, kthvalue, median, unique,
 * bincount, searchsorted — the checks, the CPU forward, the backward
 * formulas and the calls into kernels/sort.cu. (cumsum and cumprod, the
 * scans, are engine/ops/scan.c.)
 *
 * Why it is shaped this way:
 *  - One core, sort_rows. Every element becomes an order-preserving unsigned
 *    key (floats: the sign-flipped bits, -0 folded into +0 and every NaN into
 *    the largest key; integers: the sign bit flipped; descending: the key
 *    complemented), so "NaN sorts as the largest", descending order and all
 *    nine dtypes are one stable merge sort of (key, index) pairs on the CPU
 *    and one CUB radix sort over all rows on CUDA. Values are gathered from
 *    the input by index afterwards, so they come back bit for bit (-0.0 and
 *    NaN payloads included).
 *  - The sort is always stable (ties keep their input order): `stable` is
 *    honoured whatever it says, and CPU and CUDA give the same indices for ties.
 *  - topk, kthvalue and median are the sort with a window of each sorted row
 *    kept ([0, k), [k - 1, k), [(n - 1) / 2, ...)): O(n log n) where a
 *    selection could be O(n), but one segmented sort on CUDA, no per-row
 *    launch. On CUDA a window within the first 1024 positions is a radix
 *    select per row instead (kernels/sort.cu decides; the same results).
 *  - The gradient of selected values goes back to the positions their
 *    indices name (distinct within a row): a scatter into zeros.
 *  - unique and bincount need their output size on the host, so they read a
 *    count (one device->host copy) and synchronise, as in PyTorch. On CUDA,
 *    unique of integers also reads their range first and sorts them shifted
 *    into the narrowest dtype that holds it (fewer radix passes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "op.h"
#include "parallel.h"

/* ---------------- keys ---------------- */

typedef struct { uint64_t key; int64_t idx; } skey;

/* Order-preserving key of a double: NaN largest, -0 == +0. */
static inline uint64_t key_f64(double v) {
  if (v != v) return UINT64_MAX;
  if (v == 0) v = 0.0;
  uint64_t b;
  memcpy(&b, &v, 8);
  return (b >> 63) ? ~b : b | (1ull << 63);
}
static inline uint64_t key_i64(int64_t v) { return (uint64_t)v ^ (1ull << 63); }

/* Keys of n elements of t from storage offset off with stride st; idx = position. */
static void make_keys(skey *k, const em_tensor *t, int64_t off, int64_t st, int64_t n, bool desc) {
  const void *p = t->storage->data;
  switch (t->dtype) {
    case EM_F32: { const float *s = (const float *)p + off; for (int64_t i = 0; i < n; i++) k[i].key = key_f64(s[i * st]); break; }
    case EM_F64: { const double *s = (const double *)p + off; for (int64_t i = 0; i < n; i++) k[i].key = key_f64(s[i * st]); break; }
    case EM_BF16: { const uint16_t *s = (const uint16_t *)p + off; for (int64_t i = 0; i < n; i++) k[i].key = key_f64(em_bf16_to_f32(s[i * st])); break; }
    case EM_F16: { const uint16_t *s = (const uint16_t *)p + off; for (int64_t i = 0; i < n; i++) k[i].key = key_f64(em_f16_to_f32(s[i * st])); break; }
    default: for (int64_t i = 0; i < n; i++) k[i].key = key_i64(em_load_i64(p, t->dtype, off + i * st)); break;
  }
  for (int64_t i = 0; i < n; i++) { k[i].idx = i; if (desc) k[i].key = ~k[i].key; }
}

/* Stable merge sort by key (insertion-sorted runs of 16, then bottom-up merges). */
static void merge_sort(skey *a, skey *tmp, int64_t n) {
  const int64_t RUN = 16;
  for (int64_t s = 0; s < n; s += RUN) {
    int64_t e = EM_MIN(s + RUN, n);
    for (int64_t i = s + 1; i < e; i++) {
      skey x = a[i];
      int64_t j = i;
      while (j > s && a[j - 1].key > x.key) { a[j] = a[j - 1]; j--; }
      a[j] = x;
    }
  }
  skey *src = a, *dst = tmp;
  for (int64_t w = RUN; w < n; w *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * w) {
      int64_t mid = EM_MIN(lo + w, n), hi = EM_MIN(lo + 2 * w, n), i = lo, j = mid, k = lo;
      while (i < mid && j < hi) dst[k++] = src[j].key < src[i].key ? src[j++] : src[i++];
      while (i < mid) dst[k++] = src[i++];
      while (j < hi) dst[k++] = src[j++];
    }
    skey *t = src; src = dst; dst = t;
  }
  if (src != a) memcpy(a, src, (size_t)n * sizeof *a);
}

/* ---------------- rows along a dim ---------------- */

/* a seen as rows along dim d: rows = product of the other sizes, walked
 * row-major; inner = product of the sizes after d (the output's row stride). */
typedef struct {
  int64_t L, st, rows, inner;
  int no;
  int64_t oshape[EM_MAX_DIMS], ostride[EM_MAX_DIMS], pos[EM_MAX_DIMS];
  int64_t off;                      /* storage offset of the current row */
} rowgeo;

static void rowgeo_init(rowgeo *g, const em_tensor *a, int d) {
  g->L = a->ndim ? a->shape[d] : 1;
  g->st = a->ndim ? a->stride[d] : 0;
  g->rows = 1; g->inner = 1; g->no = 0; g->off = a->offset;
  for (int k = 0; k < a->ndim; k++) {
    if (k == d) continue;
    g->rows *= a->shape[k];
    if (k > d) g->inner *= a->shape[k];
    g->oshape[g->no] = a->shape[k]; g->ostride[g->no] = a->stride[k]; g->pos[g->no] = 0; g->no++;
  }
}

static void rowgeo_next(rowgeo *g) {
  for (int k = g->no - 1; k >= 0; k--) {
    g->off += g->ostride[k];
    if (++g->pos[k] < g->oshape[k]) return;
    g->off -= g->ostride[k] * g->oshape[k];
    g->pos[k] = 0;
  }
}

/* Position g (as left by rowgeo_init) at row r. */
static void rowgeo_seek(rowgeo *g, int64_t base, int64_t r) {
  g->off = base;
  for (int k = g->no - 1; k >= 0; k--) {
    g->pos[k] = r % g->oshape[k];
    r /= g->oshape[k];
    g->off += g->pos[k] * g->ostride[k];
  }
}

static void copy_elem(void *dst, int64_t di, const void *src, int64_t si, size_t es) {
  switch (es) {
    case 8: ((uint64_t *)dst)[di] = ((const uint64_t *)src)[si]; break;
    case 4: ((uint32_t *)dst)[di] = ((const uint32_t *)src)[si]; break;
    case 2: ((uint16_t *)dst)[di] = ((const uint16_t *)src)[si]; break;
    default: ((uint8_t *)dst)[di] = ((const uint8_t *)src)[si]; break;
  }
}

/* Rows [r0, r1) over the threads, each range with its own key buffer. */
typedef struct {
  const em_tensor *a;
  rowgeo g;
  bool desc, median_nan;
  int64_t j0, cnt;
  em_tensor *vals, *idx;
  int failed;
} sort_job;

static void sort_range(void *ctx, int64_t r0, int64_t r1) {
  sort_job *j = ctx;
  rowgeo g = j->g;
  skey *buf = malloc(2 * (size_t)g.L * sizeof *buf);
  if (!buf) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
  const em_tensor *a = j->a;
  size_t es = em_dtype_size(a->dtype);
  int64_t *iv = em_data_ptr(j->idx), cnt = j->cnt;
  void *vv = j->vals ? em_data_ptr(j->vals) : NULL;
  rowgeo_seek(&g, a->offset, r0);
  for (int64_t r = r0; r < r1; r++) {
    make_keys(buf, a, g.off, g.st, g.L, j->desc);
    merge_sort(buf, buf + g.L, g.L);
    int64_t s = j->j0;
    if (j->median_nan && buf[g.L - 1].key == UINT64_MAX) {   /* NaN present: the first one (in input order) */
      s = g.L - 1;
      while (s > 0 && buf[s - 1].key == UINT64_MAX) s--;
    }
    int64_t ob = (r / g.inner) * cnt * g.inner + r % g.inner;
    for (int64_t k = 0; k < cnt; k++) {
      int64_t o = ob + k * g.inner, at = buf[s + k].idx;
      iv[o] = at;
      if (vv) copy_elem(vv, o, a->storage->data, g.off + at * g.st, es);
    }
    rowgeo_next(&g);
  }
  free(buf);
}

static int sort_rows_cpu(const em_tensor *a, int d, bool desc, int64_t j0, int64_t cnt, bool median_nan,
                         em_tensor *vals, em_tensor *idx) {
  sort_job j = {.a = a, .desc = desc, .median_nan = median_nan, .j0 = j0, .cnt = cnt, .vals = vals, .idx = idx};
  rowgeo_init(&j.g, a, d);
  if (j.g.rows == 0 || j.g.L == 0 || cnt == 0) return 0;
  em_parallel_for(j.g.rows, em_grain(8 * j.g.L), sort_range, &j);
  if (j.failed) return em_error_oom("out of memory: a sort row of %lld elements", (long long)j.g.L);
  return 0;
}

/* Sort the rows of a along d and keep sorted positions [j0, j0 + cnt) of each
 * (median_nan: the first NaN instead, where a row has one) in vals (may be
 * NULL) and idx, contiguous, a's shape with cnt at d. */
static int sort_rows(const char *op, const em_tensor *a, int d, bool desc, int64_t j0, int64_t cnt, bool median_nan,
                     em_tensor *vals, em_tensor *idx) {
  if (a->device.type == EM_CPU) return sort_rows_cpu(a, d, desc, j0, cnt, median_nan, vals, idx);
  if (a->device.type == EM_CUDA) return em_sort_cuda(op, a, d, desc, j0, cnt, median_nan, vals, idx);
  return em_error_device(op, a);
}

/* ---------------- backward: scatter into zeros ---------------- */

/* res (zeros, contiguous, the input's shape) gets g at the positions idx names along d;
 * ks: g's (and idx's) shape with the dim kept. */
static int cpu_scatter(em_tensor *res, em_tensor *g, em_tensor *idx, int d, const int64_t *ks) {
  int nd = res->ndim;
  em_tensor *gc = em_contiguous_as(g, res->dtype), *ic = gc ? em_contiguous_as(idx, EM_I64) : NULL;
  if (!gc || !ic) { em_tensor_release(gc); return -1; }
  int64_t count = em_shape_numel(nd, ks), pos[EM_MAX_DIMS] = {0};
  const int64_t *iv = em_data_ptr(ic);
  size_t es = em_dtype_size(res->dtype);
  for (int64_t o = 0; o < count; o++) {
    int64_t off = 0;
    for (int k = 0; k < nd; k++) off += (k == d ? iv[o] : pos[k]) * res->stride[k];
    copy_elem(em_data_ptr(res), off, em_data_ptr(gc), o, es);
    for (int k = nd - 1; k >= 0; k--) { if (++pos[k] < ks[k]) break; pos[k] = 0; }
  }
  em_tensor_release(gc);
  em_tensor_release(ic);
  return 0;
}

/* Node: i[0] = dim, i[1] = 1 when the dim was dropped (keepdim false); saved[0] = indices. */
static int select_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *g = gout[0], *idx = n->saved[0];
  int d = (int)n->i[0], nd = n->in_ndim[0];
  if (nd == 0) { gin[0] = em_tensor_retain(g); return 0; }
  int64_t ks[EM_MAX_DIMS];
  for (int k = 0, j = 0; k < nd; k++) ks[k] = (k == d && n->i[1]) ? 1 : idx->shape[j++];
  em_tensor *res = em_zeros(nd, n->in_shape[0], g->dtype, g->device);
  if (!res) return -1;
  int rc;
  if (g->device.type == EM_CPU) rc = cpu_scatter(res, g, idx, d, ks);
  else if (g->device.type == EM_CUDA) rc = em_scatter_dim_cuda(n->op, res, g, idx, d, ks);
  else rc = em_error_device(n->op, g);
  if (rc) { em_tensor_release(res); return -1; }
  gin[0] = res;
  return 0;
}

/* ---------------- sort, argsort, topk, kthvalue, median over a dim ---------------- */

/* The sorted window [j0, j0 + cnt) along d: values (want_vals) and indices,
 * a's shape with cnt at d, or d dropped (drop, cnt 1). Records the values'
 * gradient. *indices gets the indices (or they are released). */
static em_tensor *select_window(const char *op, em_tensor *a, int d, bool desc, int64_t j0, int64_t cnt,
                                bool median_nan, bool drop, bool want_vals, em_tensor **indices) {
  int64_t shape[EM_MAX_DIMS];
  int nd = 0;
  for (int k = 0; k < a->ndim; k++) {
    if (k == d && drop) continue;
    shape[nd++] = k == d ? cnt : a->shape[k];
  }
  em_tensor *vals = want_vals ? em_empty(nd, shape, a->dtype, a->device) : NULL;
  em_tensor *idx = (!want_vals || vals) ? em_empty(nd, shape, EM_I64, a->device) : NULL;
  if (!idx || sort_rows(op, a, d, desc, j0, cnt, median_nan, vals, idx)) {
    em_tensor_release(vals); em_tensor_release(idx);
    return NULL;
  }
  if (!want_vals) return idx;
  em_node *n;
  vals = em_op_record(vals, &n, op, select_backward, 1, &a, 1, &idx);
  if (n) { n->i[0] = d; n->i[1] = drop; }
  if (vals && indices) *indices = idx; else em_tensor_release(idx);
  return vals;
}

static int check_input(const char *op, const em_tensor *a, int64_t dim, int *d) {
  if (!a) return em_error("%s: expected a tensor, got NULL", op);
  return em_wrap_dim(op, dim, a->ndim, d);
}

em_tensor *em_sort(em_tensor *a, int64_t dim, bool descending, bool stable, em_tensor **indices) {
  EM_OP_SCOPE("sort");
  EM_UNUSED(stable);   /* always stable */
  if (indices) *indices = NULL;
  int d;
  if (check_input("sort", a, dim, &d)) return NULL;
  int64_t L = a->ndim ? a->shape[d] : 1;
  return select_window("sort", a, d, descending, 0, L, false, false, true, indices);
}

em_tensor *em_argsort(em_tensor *a, int64_t dim, bool descending, bool stable) {
  EM_OP_SCOPE("argsort");
  EM_UNUSED(stable);
  int d;
  if (check_input("argsort", a, dim, &d)) return NULL;
  int64_t L = a->ndim ? a->shape[d] : 1;
  return select_window("argsort", a, d, descending, 0, L, false, false, false, NULL);
}

em_tensor *em_topk(em_tensor *a, int64_t k, int64_t dim, bool largest, bool sorted, em_tensor **indices) {
  EM_OP_SCOPE("topk");
  EM_UNUSED(sorted);   /* always sorted */
  if (indices) *indices = NULL;
  int d;
  if (check_input("topk", a, dim, &d)) return NULL;
  int64_t L = a->ndim ? a->shape[d] : 1;
  EM_CHECK_NULL(k >= 0 && k <= L, "topk: expected k in [0, %lld] for dim %d of size %lld, got %lld", (long long)L, d,
                (long long)L, (long long)k);
  return select_window("topk", a, d, largest, 0, k, false, false, true, indices);
}

em_tensor *em_kthvalue(em_tensor *a, int64_t k, int64_t dim, bool keepdim, em_tensor **indices) {
  EM_OP_SCOPE("kthvalue");
  if (indices) *indices = NULL;
  int d;
  if (check_input("kthvalue", a, dim, &d)) return NULL;
  int64_t L = a->ndim ? a->shape[d] : 1;
  EM_CHECK_NULL(k >= 1 && k <= L, "kthvalue: expected k in [1, %lld] for dim %d of size %lld, got %lld", (long long)L,
                d, (long long)L, (long long)k);
  return select_window("kthvalue", a, d, false, k - 1, 1, false, a->ndim && !keepdim, true, indices);
}

/* ---------------- median over all elements ---------------- */

/* The gradient is shared evenly by every element equal to the median (NaN
 * equal to a NaN median), as PyTorch's median() does. saved: a, out. */
static int median_all_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *a = n->saved[0], *out = n->saved[1];
  em_tensor *t[10] = {0};
  int k = 0;
  bool ok = (t[k++] = em_binary(EM_EQ, a, out, NULL)) && (t[k++] = em_binary(EM_NE, a, a, NULL)) &&
            (t[k++] = em_binary(EM_NE, out, out, NULL)) && (t[k++] = em_binary(EM_LOGICAL_AND, t[1], t[2], NULL)) &&
            (t[k++] = em_binary(EM_LOGICAL_OR, t[0], t[3], NULL)) &&
            (t[k++] = em_to(t[4], gout[0]->dtype, gout[0]->device)) && (t[k++] = em_sum(t[5], 0, NULL, false)) &&
            (t[k++] = em_binary(EM_DIV, t[5], t[6], NULL)) && (t[k++] = em_binary(EM_MUL, t[7], gout[0], NULL));
  if (ok) gin[0] = em_tensor_retain(t[8]);
  for (int i = 0; i < 10; i++) em_tensor_release(t[i]);
  return ok ? 0 : -1;
}

static em_tensor *median_all(em_tensor *a) {
  int64_t n = em_numel(a), one = 1;
  EM_CHECK_NULL(n > 0, "median: expected a non-empty tensor, got one of %d dims with 0 elements", a->ndim);
  em_tensor *c = em_contiguous_as(a, a->dtype);
  em_tensor *flat = c ? em_as_strided(c, 1, &n, &one, c->offset) : NULL;
  em_tensor *vals = flat ? em_empty(0, NULL, a->dtype, a->device) : NULL;
  em_tensor *idx = vals ? em_empty(0, NULL, EM_I64, a->device) : NULL;
  int rc = idx ? sort_rows("median", flat, 0, false, (n - 1) / 2, 1, em_dtype_is_float(a->dtype), vals, idx) : -1;
  em_tensor_release(c); em_tensor_release(flat); em_tensor_release(idx);
  if (rc) { em_tensor_release(vals); return NULL; }
  return em_op_record(vals, NULL, "median", median_all_backward, 1, &a, 2, (em_tensor *[]){a, vals});
}

em_tensor *em_median(em_tensor *a, int64_t dim, bool keepdim, em_tensor **indices) {
  EM_OP_SCOPE("median");
  if (indices) *indices = NULL;
  EM_CHECK_NULL(a, "median: expected a tensor, got NULL");
  if (dim == EM_ALL_DIMS) return median_all(a);
  int d;
  if (em_wrap_dim("median", dim, a->ndim, &d)) return NULL;
  int64_t L = a->ndim ? a->shape[d] : 1;
  EM_CHECK_NULL(L > 0, "median: expected dim %d to have a nonzero size, got 0", d);
  return select_window("median", a, d, false, (L - 1) / 2, 1, em_dtype_is_float(a->dtype), a->ndim && !keepdim, true,
                       indices);
}

/* ---------------- unique ---------------- */

/* Equal neighbours in sorted order (NaN equals nothing). */
static bool same_value(const em_tensor *s, int64_t i, int64_t j) {
  const void *p = em_data_ptr(s);
  if (em_dtype_is_float(s->dtype)) return em_load_f64(p, s->dtype, i) == em_load_f64(p, s->dtype, j);
  return em_load_i64(p, s->dtype, i) == em_load_i64(p, s->dtype, j);
}

static void unique_ids_cpu(const em_tensor *sorted, em_tensor *ids, int64_t *count) {
  int64_t n = em_numel(sorted), *iv = em_data_ptr(ids), u = -1;
  for (int64_t i = 0; i < n; i++) {
    if (i == 0 || !same_value(sorted, i, i - 1)) u++;
    iv[i] = u;
  }
  *count = u + 1;
}

static void unique_finish_cpu(const em_tensor *sorted, const em_tensor *order, const em_tensor *ids,
                              em_tensor *vals, em_tensor *inverse, em_tensor *counts) {
  int64_t n = em_numel(sorted);
  const int64_t *iv = em_data_ptr(ids), *ov = em_data_ptr(order);
  int64_t *cv = counts ? em_data_ptr(counts) : NULL, *inv = inverse ? em_data_ptr(inverse) : NULL;
  size_t es = em_dtype_size(sorted->dtype);
  if (cv) memset(cv, 0, (size_t)em_numel(counts) * sizeof *cv);
  for (int64_t i = 0; i < n; i++) {
    if (i == 0 || iv[i] != iv[i - 1]) copy_elem(em_data_ptr(vals), iv[i], em_data_ptr(sorted), i, es);
    if (cv) cv[iv[i]]++;
    if (inv) inv[ov[i]] = iv[i];
  }
}

static int int_range(em_tensor *a, int64_t *lo, int64_t *hi);

/* CUDA, integers: the values minus their minimum in the narrowest dtype that
 * holds them (u8, u16 or i32), so the radix sort makes 1, 2 or 4 passes
 * instead of 8 for ids in [0, 100000). NULL (nothing to narrow) or a new
 * tensor; *lo gets the minimum. unique reads a count anyway: one more read. */
static int narrow_keys(em_tensor *flat, em_tensor **keys, int64_t *lo) {
  int64_t hi;
  *keys = NULL;
  if (int_range(flat, lo, &hi)) return -1;
  const double lim = 9007199254740992.0;   /* the shift goes through a double scalar: exact below 2^53 */
  if ((double)*lo <= -lim || (double)hi >= lim) return 0;
  uint64_t span = (uint64_t)(hi - *lo);
  em_dtype kt = span < 256 ? EM_U8 : span < 65536 ? EM_U16 : span <= INT32_MAX ? EM_I32 : flat->dtype;
  if (em_dtype_size(kt) >= em_dtype_size(flat->dtype)) return 0;
  em_tensor *d = em_binary_scalar(EM_SUB, flat, (double)*lo, false, NULL);
  *keys = d ? em_to(d, kt, flat->device) : NULL;
  em_tensor_release(d);
  return *keys ? 0 : -1;
}

/* CUDA, neither inverse nor counts: the first element of each run of sorted
 * s, compacted (kernels/compact.cu: one read marks run heads, the count is
 * read, one more read selects) instead of i64 run ids for every element.
 * EMBER_UNIQUE=ids keeps the run-id path for every unique. */
static em_tensor *unique_heads_cuda(em_tensor *s) {
  int64_t n = em_numel(s), nb = em_compact_ws_bytes(n);
  em_tensor *ws = em_empty(1, &nb, EM_U8, s->device);
  em_tensor *cnt = ws ? em_empty(0, NULL, EM_I64, s->device) : NULL, *out = NULL;
  double u = 0;
  if (cnt && em_compact_mark_heads_cuda("unique", s, ws, cnt) == 0 && em_item(cnt, &u) == 0) {
    int64_t U = (int64_t)u;
    out = em_empty(1, &U, s->dtype, s->device);
    if (out && U > 0 && em_compact_select_cuda("unique", ws, s, out)) { em_tensor_release(out); out = NULL; }
  }
  em_tensor_release(ws); em_tensor_release(cnt);
  return out;
}

/* EMBER_UNIQUE=ids keeps the run-id path (read once; `heads` or unset: the run heads marked and compacted). */
static bool unique_ids_path(void) {
  static int ids = -1;
  if (ids < 0) ids = em_env_pick("EMBER_UNIQUE", (const char *const[]){"heads", "ids"}, 2);
  return ids == 1;
}

em_tensor *em_unique(em_tensor *a, bool sorted, em_tensor **inverse, em_tensor **counts) {
  EM_OP_SCOPE("unique");
  EM_UNUSED(sorted);   /* always sorted, as PyTorch on CUDA */
  if (inverse) *inverse = NULL;
  if (counts) *counts = NULL;
  EM_CHECK_NULL(a, "unique: expected a tensor, got NULL");
  int64_t n = em_numel(a), one = 1, U = 0;
  bool cpu = a->device.type == EM_CPU;
  em_tensor *c = em_contiguous_as(a, a->dtype);
  em_tensor *flat = c ? em_as_strided(c, 1, &n, &one, c->offset) : NULL;
  em_tensor *sv = flat ? em_empty(1, &n, a->dtype, a->device) : NULL;
  em_tensor *order = sv ? em_empty(1, &n, EM_I64, a->device) : NULL;
  em_tensor *ids = order ? em_empty(1, &n, EM_I64, a->device) : NULL;
  em_tensor *cnt = NULL, *vals = NULL, *inv = NULL, *cts = NULL;
  int rc = -1;
  const bool heads = !cpu && !inverse && !counts && !unique_ids_path();
  if (!ids) goto done;
  if (!cpu && n > 0 && em_dtype_is_int(a->dtype) && em_dtype_size(a->dtype) > 1) {
    em_tensor *keys, *skeys = NULL, *wide = NULL, *back = NULL;
    int64_t lo;
    if (narrow_keys(flat, &keys, &lo)) goto done;
    if (keys) {   /* sort the narrow keys, then sv = their values + lo (in i64) in a's dtype */
      skeys = em_empty(1, &n, keys->dtype, a->device);
      if (skeys && !sort_rows("unique", keys, 0, false, 0, n, false, skeys, order)) {
        if (heads) {   /* the unique narrow keys, then + lo in a's dtype: U values widened, not n */
          em_tensor *hk = unique_heads_cuda(skeys);
          wide = hk ? em_to(hk, EM_I64, a->device) : NULL;
          back = wide ? em_binary_scalar(EM_ADD, wide, (double)lo, false, NULL) : NULL;
          vals = back ? em_to(back, a->dtype, a->device) : NULL;
          em_tensor_release(hk);
          rc = vals ? 0 : -1;
        } else if ((wide = em_to(skeys, EM_I64, a->device)) &&
                   (back = em_binary_scalar(EM_ADD, wide, (double)lo, false, NULL))) {
          rc = em_copy_(sv, back);   /* converts to a's dtype */
        }
      }
      em_tensor_release(keys); em_tensor_release(skeys); em_tensor_release(wide); em_tensor_release(back);
      if (rc || heads) goto done;
      rc = -1;
    } else if (sort_rows("unique", flat, 0, false, 0, n, false, sv, order)) {
      goto done;
    }
  } else if (sort_rows("unique", flat, 0, false, 0, n, false, sv, order)) {
    goto done;
  }
  if (heads) {
    vals = unique_heads_cuda(sv);
    rc = vals ? 0 : -1;
    goto done;
  }
  if (cpu) unique_ids_cpu(sv, ids, &U);
  else {
    double u;
    if (!(cnt = em_empty(0, NULL, EM_I64, a->device)) || em_unique_ids_cuda("unique", sv, ids, cnt)) goto done;
    if (em_item(cnt, &u)) goto done;   /* the one device->host copy: unique synchronises */
    U = (int64_t)u;
  }
  if (!(vals = em_empty(1, &U, a->dtype, a->device))) goto done;
  if (inverse && !(inv = em_empty(a->ndim, a->shape, EM_I64, a->device))) goto done;
  if (counts && !(cts = em_empty(1, &U, EM_I64, a->device))) goto done;
  if (cpu) unique_finish_cpu(sv, order, ids, vals, inv, cts);
  else if (em_unique_finish_cuda("unique", sv, order, ids, vals, inv, cts)) goto done;
  rc = 0;
done:
  em_tensor_release(c); em_tensor_release(flat); em_tensor_release(sv); em_tensor_release(order);
  em_tensor_release(ids); em_tensor_release(cnt);
  if (rc) { em_tensor_release(vals); em_tensor_release(inv); em_tensor_release(cts); return NULL; }
  if (inverse) *inverse = inv;
  if (counts) *counts = cts;
  return vals;
}

/* ---------------- bincount ---------------- */

/* min and max of a non-empty integer tensor, read on the host in one copy. */
static int int_range(em_tensor *a, int64_t *lo, int64_t *hi) {
  if (a->device.type == EM_CPU) {
    *lo = INT64_MAX; *hi = INT64_MIN;
    for (int64_t i = 0, n = em_numel(a); i < n; i++) {
      int64_t v = em_load_i64(a->storage->data, a->dtype, a->offset + i * a->stride[0]);
      *lo = EM_MIN(*lo, v); *hi = EM_MAX(*hi, v);
    }
    return 0;
  }
  em_tensor *mn = em_min(a, EM_ALL_DIMS, false, NULL), *mx = mn ? em_max(a, EM_ALL_DIMS, false, NULL) : NULL;
  em_tensor *both = mx ? em_stack(2, (em_tensor *[]){mn, mx}, 0) : NULL;
  em_tensor *h = both ? em_to(both, EM_I64, (em_device){EM_CPU, 0}) : NULL;   /* bincount synchronises */
  if (h) { *lo = ((int64_t *)em_data_ptr(h))[0]; *hi = ((int64_t *)em_data_ptr(h))[1]; }
  em_tensor_release(mn); em_tensor_release(mx); em_tensor_release(both);
  int rc = h ? 0 : -1;
  em_tensor_release(h);
  return rc;
}

/* CUDA, no weights: the counts of the small values and the range in one read
 * of x (kernels/sort.cu bincount_range), then the range read on the host as
 * before. Returns 0 with *out set (the counts, every value in the counted
 * bins) or NULL (*lo, *hi set: the general path counts again), 1 where the
 * kernel does not apply (nothing set), -1 on error. EMBER_BINCOUNT=two keeps
 * the min and max passes and a counting pass for every bincount. */
static int bincount_one_read_cuda(em_tensor *x, int64_t minlength, int64_t *lo, int64_t *hi, em_tensor **out) {
  static int two = -1;   /* read once; `one` or unset: the one-read kernel */
  if (two < 0) two = em_env_pick("EMBER_BINCOUNT", (const char *const[]){"one", "two"}, 2);
  if (two) return 1;
  int64_t ns = EM_BINCOUNT_BINS + 2;
  em_tensor *scr = em_empty(1, &ns, EM_I64, x->device);
  if (!scr) return -1;
  int rc = em_bincount_range_cuda("bincount", x, scr);
  em_tensor *r = rc ? NULL : em_narrow(scr, 0, EM_BINCOUNT_BINS, 2);
  em_tensor *h = r ? em_to(r, EM_I64, (em_device){EM_CPU, 0}) : NULL;   /* bincount synchronises */
  if (!rc && !h) rc = -1;
  if (h) {
    *lo = ((int64_t *)em_data_ptr(h))[0]; *hi = ((int64_t *)em_data_ptr(h))[1];
    *out = NULL;
    if (*lo >= 0 && *hi < EM_BINCOUNT_BINS) {
      int64_t nb = EM_MAX(*hi + 1, minlength), k = EM_MIN(nb, EM_BINCOUNT_BINS);
      em_tensor *o = em_zeros(1, &nb, EM_I64, x->device);
      em_tensor *dst = o ? em_narrow(o, 0, 0, k) : NULL, *src = dst ? em_narrow(scr, 0, 0, k) : NULL;
      if (!src || em_copy_(dst, src)) { em_tensor_release(o); o = NULL; rc = -1; }
      em_tensor_release(dst); em_tensor_release(src);
      *out = o;
    }
  }
  em_tensor_release(h); em_tensor_release(r); em_tensor_release(scr);
  return rc;
}

em_tensor *em_bincount(em_tensor *a, em_tensor *weights, int64_t minlength) {
  EM_OP_SCOPE("bincount");
  char s1[160], s2[160];
  EM_CHECK_NULL(a, "bincount: expected a tensor, got NULL");
  EM_CHECK_NULL(a->ndim == 1 && em_dtype_is_int(a->dtype),
                "bincount: expected a 1-D integer tensor (i64, i32, u16, u8), got a %d-D %s tensor", a->ndim,
                em_dtype_name(a->dtype));
  EM_CHECK_NULL(minlength >= 0, "bincount: expected minlength >= 0, got %lld", (long long)minlength);
  if (weights) {
    EM_CHECK_NULL(weights->ndim == 1 && weights->shape[0] == a->shape[0],
                  "bincount: expected weights of shape %s (the input's), got %s",
                  em_shape_str(a->ndim, a->shape, s1, 160), em_shape_str(weights->ndim, weights->shape, s2, 160));
    EM_CHECK_NULL(weights->dtype != EM_BOOL, "bincount: expected numeric weights, got bool");
    if (em_check_same_device("bincount", a, weights)) return NULL;
  }
  int64_t lo = 0, hi = -1;
  bool ranged = false;
  if (a->device.type == EM_CUDA && !weights && em_numel(a) > 0) {
    em_tensor *x = em_contiguous_as(a, a->dtype), *counted = NULL;
    int rc = x ? bincount_one_read_cuda(x, minlength, &lo, &hi, &counted) : -1;
    em_tensor_release(x);
    if (rc < 0) return NULL;
    if (rc == 0) {
      ranged = true;
      EM_CHECK_NULL(lo >= 0, "bincount: expected non-negative values, got %lld", (long long)lo);
      if (counted) return counted;
    }
  }
  if (!ranged && em_numel(a) > 0 && int_range(a, &lo, &hi)) return NULL;
  EM_CHECK_NULL(lo >= 0, "bincount: expected non-negative values, got %lld", (long long)lo);
  int64_t nb = EM_MAX(hi + 1, minlength);
  em_dtype dt = !weights ? EM_I64 : weights->dtype == EM_F32 ? EM_F32 : EM_F64;
  em_tensor *out = em_zeros(1, &nb, dt, a->device);
  if (!out || em_numel(a) == 0) return out;
  em_tensor *w = weights ? em_contiguous_as(weights, dt) : NULL;
  int rc = -1;
  if (weights && !w) goto done;
  if (a->device.type == EM_CUDA) {
    em_tensor *x = em_contiguous_as(a, a->dtype);
    rc = x ? em_bincount_cuda("bincount", x, w, out) : -1;
    em_tensor_release(x);
  } else if (a->device.type == EM_CPU) {
    void *o = em_data_ptr(out);
    for (int64_t i = 0, n = em_numel(a); i < n; i++) {
      int64_t b = em_load_i64(a->storage->data, a->dtype, a->offset + i * a->stride[0]);
      if (dt == EM_I64) ((int64_t *)o)[b]++;
      else if (dt == EM_F32) ((float *)o)[b] += ((const float *)em_data_ptr(w))[i];
      else ((double *)o)[b] += ((const double *)em_data_ptr(w))[i];
    }
    rc = 0;
  } else rc = em_error_device("bincount", a);
done:
  em_tensor_release(w);
  if (rc) { em_tensor_release(out); return NULL; }
  return out;
}

/* ---------------- searchsorted ---------------- */

static int searchsorted_validate(const em_tensor *seq, const em_tensor *v) {
  char s1[160], s2[160];
  EM_CHECK_INT(seq && v, "searchsorted: expected two tensors, got NULL");
  EM_CHECK_INT(seq->dtype != EM_BOOL && v->dtype != EM_BOOL,
               "searchsorted: expected numeric tensors, got sorted_sequence %s and values %s",
               em_dtype_name(seq->dtype), em_dtype_name(v->dtype));
  if (em_check_same_device("searchsorted", seq, v)) return -1;
  EM_CHECK_INT(seq->ndim >= 1, "searchsorted: expected sorted_sequence with at least 1 dim, got a 0-dim tensor");
  if (seq->ndim == 1) return 0;
  bool ok = v->ndim == seq->ndim;
  for (int k = 0; ok && k < seq->ndim - 1; k++) ok = v->shape[k] == seq->shape[k];
  EM_CHECK_INT(ok,
               "searchsorted: expected sorted_sequence to be 1-D or to share all but the last dim with values, "
               "got sorted_sequence %s and values %s",
               em_shape_str(seq->ndim, seq->shape, s1, 160), em_shape_str(v->ndim, v->shape, s2, 160));
  return 0;
}

/* PyTorch's bisection: lower bound moves right while !(s >= v), upper while !(s > v),
 * so a NaN value lands at the end and NaNs sorted last are never passed. */
static int64_t bisect_f(const em_tensor *s, int64_t off, int64_t st, int64_t L, double v, bool right) {
  int64_t lo = 0, hi = L;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    double m = em_load_f64(s->storage->data, s->dtype, off + mid * st);
    if (right ? !(m > v) : !(m >= v)) lo = mid + 1; else hi = mid;
  }
  return lo;
}
static int64_t bisect_i(const em_tensor *s, int64_t off, int64_t st, int64_t L, int64_t v, bool right) {
  int64_t lo = 0, hi = L;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2, m = em_load_i64(s->storage->data, s->dtype, off + mid * st);
    if (right ? m <= v : m < v) lo = mid + 1; else hi = mid;
  }
  return lo;
}

em_tensor *em_searchsorted(em_tensor *seq, em_tensor *values, bool right) {
  EM_OP_SCOPE("searchsorted");
  if (searchsorted_validate(seq, values)) return NULL;
  em_tensor *out = em_empty(values->ndim, values->shape, EM_I64, values->device);
  if (!out || em_numel(values) == 0) return out;
  int64_t L = seq->shape[seq->ndim - 1];
  if (values->device.type == EM_CUDA) {
    em_tensor *s = em_contiguous_as(seq, seq->dtype), *v = s ? em_contiguous_as(values, values->dtype) : NULL;
    int rc = v ? em_searchsorted_cuda("searchsorted", s, v, right, out) : -1;
    em_tensor_release(s); em_tensor_release(v);
    if (rc) { em_tensor_release(out); return NULL; }
    return out;
  }
  if (values->device.type != EM_CPU) { em_error_device("searchsorted", values); em_tensor_release(out); return NULL; }
  bool ints = !em_dtype_is_float(seq->dtype) && !em_dtype_is_float(values->dtype);
  int64_t *ov = em_data_ptr(out);
  em_iter it;
  em_iter_init(&it, values->ndim, values->shape, 1, (const em_tensor *[]){values});
  int64_t sst = seq->stride[seq->ndim - 1];
  for (int64_t i = 0; i < it.numel; i++) {
    int64_t off = seq->offset;
    if (seq->ndim > 1)   /* the row of seq matching this value's leading indices */
      for (int k = 0; k < seq->ndim - 1; k++) off += it.idx[k] * seq->stride[k];
    ov[i] = ints ? bisect_i(seq, off, sst, L, em_load_i64(values->storage->data, values->dtype, it.off[0]), right)
                 : bisect_f(seq, off, sst, L, em_load_f64(values->storage->data, values->dtype, it.off[0]), right);
    em_iter_next(&it);
  }
  return out;
}
