/* embedding: out[..., :] = w[ids[...], :], a row gather.
 *
 * Rows are copied with memcpy (any dtype: it is a gather, not arithmetic).
 * Every id is checked before the first copy, so a bad id is an error naming
 * it and the table size, never a read outside w.
 *
 * Backward is a scatter-add of the output gradient rows into a zero (n, d)
 * table, in index order: repeated ids (every batch has them) sum in the same
 * order on every run, so training is bit-reproducible. Threads split the
 * columns (each owns a band of every table row and walks all ids in order),
 * never the ids: no atomics, the same sums at any thread count. The sum runs
 * in f32 (f64 for f64) and is rounded to w's dtype once at the end. The
 * forward's row copies are split over the ids.
 *
 * On CUDA (kernels/embedding.cu) the gather is one kernel; the backward is
 * deterministic too (each block owns a range of table rows and adds their
 * tokens in token order, no float atomics), so GPU gradients are also
 * bit-identical from run to run. ids are not checked on the host there (that
 * would synchronise): an out-of-range id gives a NaN row forward and is
 * skipped backward. */
#include <stdio.h>
#include "op.h"
#include "cost.h"
#include "parallel.h"

/* Forward: ids [i0, i1) copy their rows. Backward: column bands [c0, c1) of
 * BAND columns (a cache line of f32) over every id. */
#define BAND 16
typedef struct { const int64_t *ix; const char *src; char *dst; size_t row; int64_t n, d; bool f64; } emb_job;

static void gather_rows(void *ctx, int64_t i0, int64_t i1) {
  const emb_job *j = ctx;
  for (int64_t i = i0; i < i1; i++) memcpy(j->dst + (size_t)i * j->row, j->src + (size_t)j->ix[i] * j->row, j->row);
}

static int embedding_validate(em_tensor *ids, em_tensor *w) {
  if (em_check_int("embedding", "ids", ids)) return -1;
  if (em_check_ndim("embedding", "weight", w, 2)) return -1;
  if (em_check_same_device("embedding", ids, w)) return -1;
  if (ids->ndim + 1 > EM_MAX_DIMS)
    return em_error("embedding: ids have %d dims; the result would exceed %d dims", ids->ndim, EM_MAX_DIMS);
  return 0;
}

static int check_ids(const int64_t *id, int64_t n, int64_t rows) {
  for (int64_t i = 0; i < n; i++)
    if (id[i] < 0 || id[i] >= rows)
      return em_error("embedding: id %lld (at flat index %lld) is out of range for a table of %lld rows "
                      "(expected 0..%lld)", (long long)id[i], (long long)i, (long long)rows, (long long)(rows - 1));
  return 0;
}

static em_tensor *embedding_cpu(em_tensor *ids, em_tensor *w) {
  int64_t n = em_numel(ids), d = w->shape[1], shape[EM_MAX_DIMS];
  memcpy(shape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
  shape[ids->ndim] = d;
  em_tensor *id = em_contiguous_as(ids, EM_I64);
  em_tensor *wc = id ? em_contiguous_as(w, w->dtype) : NULL;
  em_tensor *out = wc ? em_empty(ids->ndim + 1, shape, w->dtype, w->device) : NULL;
  if (out && check_ids(em_data_ptr(id), n, w->shape[0])) { em_tensor_release(out); out = NULL; }
  if (out) {
    size_t row = (size_t)d * em_dtype_size(w->dtype);
    emb_job j = {em_data_ptr(id), em_data_ptr(wc), em_data_ptr(out), row, n, d, false};
    em_parallel_for(n, em_grain(d), gather_rows, &j);
  }
  em_tensor_release(id); em_tensor_release(wc);
  return out;
}

/* Columns [c0, c1) of rows gw[ix[i]] += g[i] for every id i, in id order. */
static void scatter_add_f32(float *gw, const float *g, const int64_t *ix, int64_t n, int64_t d, int64_t c0, int64_t c1) {
  for (int64_t i = 0; i < n; i++, g += d) {
    float *row = gw + ix[i] * d;
    for (int64_t j = c0; j < c1; j++) row[j] += g[j];
  }
}

static void scatter_add_f64(double *gw, const double *g, const int64_t *ix, int64_t n, int64_t d, int64_t c0,
                            int64_t c1) {
  for (int64_t i = 0; i < n; i++, g += d) {
    double *row = gw + ix[i] * d;
    for (int64_t j = c0; j < c1; j++) row[j] += g[j];
  }
}

static void scatter_bands(void *ctx, int64_t b0, int64_t b1) {
  const emb_job *j = ctx;
  int64_t c0 = b0 * BAND, c1 = EM_MIN(b1 * BAND, j->d);
  if (j->f64) scatter_add_f64((double *)j->dst, (const double *)j->src, j->ix, j->n, j->d, c0, c1);
  else scatter_add_f32((float *)j->dst, (const float *)j->src, j->ix, j->n, j->d, c0, c1);
}

/* Contiguous ids of a dtype the kernels read (i32/i64; others widened to i64). */
static em_tensor *cuda_ids(em_tensor *ids) {
  if (ids->dtype == EM_I32 || ids->dtype == EM_I64) return em_contiguous(ids);
  return em_contiguous_as(ids, EM_I64);
}

static em_tensor *embedding_cuda(em_tensor *ids, em_tensor *w) {
  int64_t shape[EM_MAX_DIMS];
  memcpy(shape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
  shape[ids->ndim] = w->shape[1];
  em_tensor *id = cuda_ids(ids);
  em_tensor *wc = !id ? NULL : (w->stride[1] == 1 || w->shape[1] <= 1) ? em_tensor_retain(w) : em_contiguous(w);
  em_tensor *out = wc ? em_empty(ids->ndim + 1, shape, w->dtype, w->device) : NULL;
  if (out && em_embedding_fwd_cuda(id, wc, out)) { em_tensor_release(out); out = NULL; }
  em_tensor_release(id); em_tensor_release(wc);
  return out;
}

static int embedding_backward_cuda(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *id = cuda_ids(n->saved[0]);
  em_tensor *g = id ? em_contiguous(gout[0]) : NULL;
  em_tensor *gw = g ? em_empty(2, n->in_shape[0], n->in_dtype[0], gout[0]->device) : NULL;
  if (gw && em_embedding_bwd_cuda(id, g, gw)) { em_tensor_release(gw); gw = NULL; }
  em_tensor_release(id); em_tensor_release(g);
  gin[0] = gw;
  return gw ? 0 : -1;
}

/* saved: ids. input 0: w (ids are integers and never need grad). */
static int embedding_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *ids = n->saved[0];
  /* ids and g read, the whole (vocab, d) gradient written; one add per element of g */
  EM_OP_COST(em_cost_nbytes(ids) + em_cost_nbytes(gout[0]) +
                 (double)n->in_shape[0][0] * (double)n->in_shape[0][1] * (double)em_dtype_size(n->in_dtype[0]),
             em_numel(gout[0]), em_cost_simt_class(n->in_dtype[0]));
  if (gout[0]->device.type != EM_CPU) return embedding_backward_cuda(n, gout, gin);
  em_dtype ct = n->in_dtype[0] == EM_F64 ? EM_F64 : EM_F32;
  int64_t cnt = em_numel(ids), d = n->in_shape[0][1];
  em_tensor *id = em_contiguous_as(ids, EM_I64);
  em_tensor *g = id ? em_contiguous_as(gout[0], ct) : NULL;
  em_tensor *gw = g ? em_zeros(2, n->in_shape[0], ct, gout[0]->device) : NULL;
  if (gw) {
    emb_job j = {em_data_ptr(id), em_data_ptr(g), em_data_ptr(gw), 0, cnt, d, ct == EM_F64};
    em_parallel_for((d + BAND - 1) / BAND, em_grain(cnt * BAND), scatter_bands, &j);
  }
  em_tensor_release(id); em_tensor_release(g);
  gin[0] = gw;
  return gw ? 0 : -1;
}

em_tensor *em_embedding(em_tensor *ids, em_tensor *w) {
  EM_OP_SCOPE("embedding");
  if (embedding_validate(ids, w)) return NULL;
  em_tensor *out = w->device.type == EM_CPU ? embedding_cpu(ids, w) : embedding_cuda(ids, w);
  /* ids read; one row of w read per id and written to out: out's bytes twice */
  EM_OP_COST(em_cost_nbytes(ids) + 2 * em_cost_nbytes(out), 0, EM_FLOPS_F32);
  return em_op_record(out, NULL, "embedding", embedding_backward, 1, &w, 1, &ids);
}

/* ---------------- embedding_bag (CUDA) ----------------
 * Forward: one kernel, a block per bag, rows summed in id order (f32; f64
 * for f64): deterministic. Backward: each id's row of the gradient is its
 * bag's row of g (mean: / count), then embedding's deterministic backward
 * adds them into gw in token order. saved: ids, offsets (if any); i[0] mean,
 * i[1] L (ids per bag, 2-D ids). */
static int embedding_bag_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *ids = n->saved[0], *offs = n->n_saved > 1 ? n->saved[1] : NULL;
  int64_t cnt = em_numel(ids), shape[2] = {cnt, n->in_shape[0][1]};
  EM_OP_COST(em_cost_nbytes(ids) + 2.0 * (double)cnt * (double)shape[1] * (double)em_dtype_size(gout[0]->dtype) +
                 (double)n->in_shape[0][0] * (double)n->in_shape[0][1] * (double)em_dtype_size(n->in_dtype[0]),
             (double)cnt * (double)shape[1], em_cost_simt_class(n->in_dtype[0]));
  em_tensor *g = em_contiguous(gout[0]);
  em_tensor *gexp = g ? em_empty(2, shape, g->dtype, g->device) : NULL;
  if (gexp && em_embedding_bag_expand_cuda(offs, n->i[1], g, (int)n->i[0], gexp)) { em_tensor_release(gexp); gexp = NULL; }
  em_tensor *gw = gexp ? em_empty(2, n->in_shape[0], n->in_dtype[0], g->device) : NULL;
  if (gw && em_embedding_bwd_cuda(ids, gexp, gw)) { em_tensor_release(gw); gw = NULL; }
  em_tensor_release(g); em_tensor_release(gexp);
  gin[0] = gw;
  return gw ? 0 : -1;
}

em_tensor *em_embedding_bag(em_tensor *ids, em_tensor *w, em_tensor *offsets, bool mean) {
  EM_OP_SCOPE("embedding_bag");
  char s[160];
  if (em_check_int("embedding_bag", "ids", ids)) return NULL;
  if (em_check_ndim("embedding_bag", "weight", w, 2)) return NULL;
  if (em_check_same_device("embedding_bag", ids, w)) return NULL;
  if (w->device.type == EM_CPU)
    return em_error("embedding_bag: the fused op runs on CUDA only (F.embedding_bag composes it on the CPU)"), NULL;
  if (!em_dtype_is_float(w->dtype))
    return em_error("embedding_bag: expected a float weight, got %s", em_dtype_name(w->dtype)), NULL;
  if (offsets ? ids->ndim != 1 : ids->ndim != 2)
    return em_error("embedding_bag: expected %s ids, got shape %s", offsets ? "1-D (with offsets)" : "2-D (B, L)",
                    em_shape_str(ids->ndim, ids->shape, s, 160)), NULL;
  if (offsets && em_check_same_device("embedding_bag", ids, offsets)) return NULL;
  if (offsets && (offsets->ndim != 1 || offsets->dtype != EM_I64))
    return em_error("embedding_bag: expected 1-D i64 offsets, got %s of shape %s", em_dtype_name(offsets->dtype),
                    em_shape_str(offsets->ndim, offsets->shape, s, 160)), NULL;
  int64_t shape[2] = {offsets ? offsets->shape[0] : ids->shape[0], w->shape[1]};
  em_tensor *id = cuda_ids(ids);
  em_tensor *off = id && offsets ? em_contiguous(offsets) : NULL;
  em_tensor *wc = !id || (offsets && !off) ? NULL
                  : (w->stride[1] == 1 || w->shape[1] <= 1) ? em_tensor_retain(w) : em_contiguous(w);
  em_tensor *out = wc ? em_empty(2, shape, w->dtype, w->device) : NULL;
  if (out && em_embedding_bag_cuda(id, off, wc, mean, out)) { em_tensor_release(out); out = NULL; }
  /* ids read; one row of w read per id; out written once */
  EM_OP_COST(em_cost_nbytes(ids) + (double)em_numel(ids) * (double)shape[1] * (double)em_dtype_size(w->dtype) +
                 (out ? em_cost_nbytes(out) : 0),
             (double)em_numel(ids) * (double)shape[1], em_cost_simt_class(w->dtype));
  em_node *node;
  out = em_op_record(out, &node, "embedding_bag", embedding_bag_backward, 1, &w, 2, (em_tensor *[]){id, off});
  if (node) { node->i[0] = mean; node->i[1] = offsets ? 0 : ids->shape[1]; }
  em_tensor_release(id); em_tensor_release(off); em_tensor_release(wc);
  return out;
}
