/* The CUDA side of the engine -> CUDA boundary (backend.h) in a build
 * without CUDA: CMake links this file instead of kernels/. Queries answer
 * "none" (no devices, not capturing, not pinned, no flash head dims); every
 * launcher and every other entry point of ember/cuda.h fails with
 * "<op>: this build of Ember has no CUDA backend (rebuild with -DEMBER_CUDA=ON)",
 * <op> being the op running (EM_OP_SCOPE). The call-site hook and the TF32
 * flag work anyway (they are plain state); the profiler's CUPTI side is
 * never available, so profiles fall back to host timing. */
#include <stdio.h>
#include "internal.h"

/* "<op>: this build of Ember has no CUDA backend": op NULL names the op running now. */
static int no_cuda(const char *op) {
  if (!op) op = em_current_op ? em_current_op : "cuda";
  return em_error("%s: this build of Ember has no CUDA backend (rebuild with -DEMBER_CUDA=ON)", op);
}

int em_cuda_available(void) { return 0; }
int em_cuda_device_count(void) { return 0; }
int em_cuda_compiled(void) { return 0; }

int em_cuda_set_device(int device) { EM_UNUSED(device); return no_cuda("set_device"); }
int em_cuda_current_device(void) { return -1; }
int em_cuda_synchronize(int device) { EM_UNUSED(device); return no_cuda("synchronize"); }
const char *em_cuda_device_name(int device) { EM_UNUSED(device); no_cuda("device_name"); return NULL; }

em_stream *em_stream_new(int device) { EM_UNUSED(device); no_cuda("Stream"); return NULL; }
void em_stream_free(em_stream *s) { EM_UNUSED(s); }
em_stream *em_stream_current(int device) { EM_UNUSED(device); return NULL; }
void em_stream_set_current(int device, em_stream *s) { EM_UNUSED(device); EM_UNUSED(s); }
int em_stream_synchronize(em_stream *s) { EM_UNUSED(s); return no_cuda("Stream.synchronize"); }
int em_stream_wait_event(em_stream *s,
                         em_event *e) { EM_UNUSED(s); EM_UNUSED(e); return no_cuda("Stream.wait_event"); }
void *em_stream_handle(em_stream *s) { EM_UNUSED(s); return NULL; }
em_event *em_event_new(bool enable_timing) { EM_UNUSED(enable_timing); no_cuda("Event"); return NULL; }
void em_event_free(em_event *e) { EM_UNUSED(e); }
int em_event_record(em_event *e, em_stream *s) { EM_UNUSED(e); EM_UNUSED(s); return no_cuda("Event.record"); }
int em_event_synchronize(em_event *e) { EM_UNUSED(e); return no_cuda("Event.synchronize"); }
int em_event_query(em_event *e) { EM_UNUSED(e); return no_cuda("Event.query"); }
int em_event_elapsed_ms(em_event *start, em_event *end, float *ms) {
  EM_UNUSED(start); EM_UNUSED(end); EM_UNUSED(ms);
  return no_cuda("Event.elapsed_time");
}

int em_cuda_memory_stats_get(int device, em_cuda_memory_stats *out) {
  EM_UNUSED(device);
  memset(out, 0, sizeof *out);
  return no_cuda("memory_stats");
}
void em_cuda_reset_peak_memory_stats(int device) { EM_UNUSED(device); }
void em_cuda_empty_cache(int device) { EM_UNUSED(device); }
void em_cuda_set_oom_callback(void (*fn)(void *ud), void *ud) { EM_UNUSED(fn); EM_UNUSED(ud); }
int em_cuda_memory_segments(int device, em_cuda_segment_info **out, int64_t *n) {
  EM_UNUSED(device);
  *out = NULL;
  *n = 0;
  return 0;                                    /* no allocator, no segments */
}
void em_cuda_segments_free(em_cuda_segment_info *s, int64_t n) { EM_UNUSED(n); free(s); }

em_tensor *em_pin_memory(em_tensor *t) { EM_UNUSED(t); no_cuda("pin_memory"); return NULL; }
bool em_is_pinned(const em_tensor *t) { EM_UNUSED(t); return false; }
/* CPU <-> CPU copies have nothing to overlap: a plain copy. */
int em_copy_nonblocking_(em_tensor *dst, em_tensor *src) { return em_copy_(dst, src); }

int em_graph_begin(int device) { EM_UNUSED(device); return no_cuda("graph"); }
em_graph *em_graph_end(void) { no_cuda("graph"); return NULL; }
int em_graph_replay(em_graph *g) { EM_UNUSED(g); return no_cuda("graph.replay"); }
void em_graph_free(em_graph *g) { EM_UNUSED(g); }
bool em_cuda_capturing(void) { return false; }
int em_cuda_check_not_capturing(const char *op) { EM_UNUSED(op); return 0; }

static const char *(*callsite_fn)(void);
void em_set_callsite_fn(const char *(*fn)(void)) { callsite_fn = fn; }
const char *em_callsite(void) {
  const char *s = callsite_fn ? callsite_fn() : NULL;
  return s && *s ? s : "(unknown call site)";
}

static bool allow_tf32;
void em_cuda_set_allow_tf32(bool on) { allow_tf32 = on; }
bool em_cuda_allow_tf32(void) { return allow_tf32; }

/* No gemm is ever tuned without CUDA: the table stays empty (the switch itself is engine/matmul_tune.c). */
int64_t em_matmul_tune_count(void) { return 0; }
int em_matmul_tune_get(int64_t i, em_matmul_tune_entry *out) {
  EM_UNUSED(out);
  return em_error("matmul_tune_table: entry %lld is out of range [0, 0)", (long long)i);
}


/* ---- the boundary's backend half ---- */
void *em_cuda_cur_stream_handle(int device) { EM_UNUSED(device); return NULL; }

int em_cupti_init(char *why, size_t cap) {
  snprintf(why, cap, "this build has no CUDA backend");
  return -1;
}
int em_cupti_start(int64_t t_start, char *why, size_t cap) {
  EM_UNUSED(t_start);
  return em_cupti_init(why, cap);
}
int64_t em_cupti_stop(int64_t t_start, int64_t *before) {
  EM_UNUSED(t_start);
  *before = 0;
  return 0;
}

/* The launchers, in backend.h's order. */
int em_rng_fill_cuda(em_tensor *t, const em_rng_dist *d, em_philox_state st) { return no_cuda(NULL); }
const uint64_t *em_cuda_graph_rng_reserve(uint64_t blocks, uint64_t *offset) { *offset = 0; return NULL; }
int em_copy_cuda(em_tensor *dst, em_tensor *src) { return no_cuda("copy_"); }
int em_fill_cuda(em_tensor *dst, double v) { return no_cuda("fill_"); }
int em_copy_device_cuda(em_tensor *dst, const em_tensor *src) { return no_cuda("copy_"); }
int em_elementwise_cuda(const char *op, const em_ew_kern *k, em_tensor *out, int nin,
                        const em_ew_operand *in, const em_ew_plan *p, int64_t numel) { return no_cuda(op); }
int em_triangle_cuda(const char *op, em_tensor *res, const em_tensor *a, int64_t k,
                     bool upper) { return no_cuda(op); }
int em_sum_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p,
                double div) { return no_cuda(op); }
int em_var_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p,
                double dof) { return no_cuda(op); }
int em_extreme_cuda(const char *op, const em_tensor *a, const em_red_plan *p, bool is_max, em_tensor *vals,
                    em_tensor *idx) { return no_cuda(op); }
int em_logsumexp_cuda(const char *op, em_tensor *res, const em_tensor *a,
                      const em_red_plan *p) { return no_cuda(op); }
int em_var_rows_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p,
                     double dof) { return no_cuda(op); }
int em_logsumexp_rows_cuda(const char *op, em_tensor *res, const em_tensor *a,
                           const em_red_plan *p) { return no_cuda(op); }
int em_softmax_cuda(const char *op, em_tensor *res, em_tensor *a, int dim,
                    bool log_out) { return no_cuda(op); }
int em_softmax_backward_cuda(const char *op, em_tensor *gx, em_tensor *g, em_tensor *y, int dim,
                             bool log_out) { return no_cuda(op); }
int em_scatter_dim_cuda(const char *op, em_tensor *res, em_tensor *g, em_tensor *idx, int dim,
                        const int64_t *keep_shape) { return no_cuda(op); }
int em_gemm_cuda(const em_gemm_args *g) { return no_cuda(NULL); }
int em_linear_bias_grad_cuda(const em_tensor *g, em_tensor *grad_bias) { return no_cuda(NULL); }
int em_rmsnorm_fwd_cuda(const em_tensor *x, const em_tensor *w, double eps, em_tensor *y,
                        em_tensor *rstd) { return no_cuda(NULL); }
int em_rmsnorm_bwd_cuda(const em_tensor *x, const em_tensor *w, const em_tensor *rstd, const em_tensor *gy,
                        em_tensor *gx, bool gx_accumulate, em_tensor *gw, em_tensor *gr) { return no_cuda(NULL); }
int em_add_rmsnorm_fwd_cuda(const em_tensor *x, const em_tensor *r, const em_tensor *w, double eps, em_tensor *s,
                            em_tensor *y, em_tensor *rstd) { return no_cuda(NULL); }
int em_layer_norm_fwd_cuda(const em_tensor *x, const em_tensor *w, const em_tensor *b, double eps, em_tensor *y,
                           em_tensor *mean, em_tensor *rstd) { return no_cuda(NULL); }
int em_layer_norm_bwd_cuda(const em_tensor *x, const em_tensor *w, const em_tensor *mean, const em_tensor *rstd,
                           const em_tensor *gy, em_tensor *gx, em_tensor *gw, em_tensor *gb) { return no_cuda(NULL); }
int em_rope_cuda(const em_tensor *x, const em_tensor *pos, double theta, double sign,
                 em_tensor *y) { return no_cuda(NULL); }
int em_rope2_cuda(int n, const em_tensor *const *x, const em_tensor *pos, double theta, double sign,
                  em_tensor *const *y) { return no_cuda(NULL); }
int em_swiglu_fwd_cuda(const em_tensor *a, const em_tensor *b, em_tensor *y) { return no_cuda(NULL); }
int em_swiglu_bwd_cuda(const em_tensor *a, const em_tensor *b, const em_tensor *g, em_tensor *ga,
                       em_tensor *gb) { return no_cuda(NULL); }
int em_embedding_fwd_cuda(const em_tensor *ids, const em_tensor *w, em_tensor *out) { return no_cuda(NULL); }
int em_embedding_bwd_cuda(const em_tensor *ids, const em_tensor *g, em_tensor *gw) { return no_cuda(NULL); }
int em_embedding_bag_cuda(const em_tensor *ids, const em_tensor *offsets, const em_tensor *w, int mean,
                          em_tensor *out) { return no_cuda(NULL); }
int em_embedding_bag_expand_cuda(const em_tensor *offsets, int64_t L, const em_tensor *g, int mean,
                                 em_tensor *gexp) { return no_cuda(NULL); }
int em_xent_fwd_cuda(const em_tensor *logits, const em_tensor *targets, const em_xent_opts *o, em_tensor *lse,
                     em_tensor *loss, em_tensor *count) { return no_cuda(NULL); }
int em_xent_bwd_cuda(const em_tensor *logits, const em_tensor *targets, const em_xent_opts *o, const em_tensor *lse,
                     const em_tensor *g, const em_tensor *count, em_tensor *dlogits) { return no_cuda(NULL); }
int em_bce_fwd_cuda(const em_tensor *x, const em_tensor *y, const em_tensor *w, const em_tensor *pw,
                    const em_bce_args *a, em_tensor *out) { return no_cuda(NULL); }
int em_bce_bwd_cuda(const em_tensor *x, const em_tensor *y, const em_tensor *w, const em_tensor *pw,
                    const em_bce_args *a, const em_tensor *g, double scale, em_tensor *gx, em_tensor *gy,
                    em_tensor *gw, em_tensor *gpw) { return no_cuda(NULL); }
int em_loss_diff_fwd_cuda(int kind, int reduction, const em_tensor *x, const em_tensor *y, em_tensor *out) {
  return no_cuda(NULL);
}
int em_loss_diff_bwd_cuda(int kind, int reduction, const em_tensor *x, const em_tensor *y, const em_tensor *g,
                          double scale, em_tensor *gx, em_tensor *gy) { return no_cuda(NULL); }
int em_nll_fwd_cuda(const em_tensor *logp, const em_tensor *target, const em_tensor *weight,
                    const em_nll_args *a, em_tensor *out, em_tensor *stats) { return no_cuda(NULL); }
int em_nll_bwd_cuda(const em_tensor *logp, const em_tensor *target, const em_tensor *weight,
                    const em_nll_args *a, const em_tensor *g, const em_tensor *stats, em_tensor *gx,
                    em_tensor *gw) { return no_cuda(NULL); }
bool em_flash_supported_dim(int64_t d) { return false; }
int em_flash_fwd_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, em_tensor *o,
                      em_tensor *lse, int causal, float scale) { return no_cuda(NULL); }
int em_flash_decode_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *n_keys,
                         em_tensor *o, em_tensor *lse, float scale) { return no_cuda(NULL); }
int em_flash_fwd_kernel(int mode) {   /* no kernels to choose from: the setting is only kept */
  static int cur;
  int prev = cur;
  if (mode >= 0) cur = mode;
  return prev;
}
int em_flash_bwd_kernel(int mode) {   /* as em_flash_fwd_kernel: only kept */
  static int cur;
  int prev = cur;
  if (mode >= 0) cur = mode;
  return prev;
}
int em_flash_bwd_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *o,
                      const em_tensor *lse, const em_tensor *dout, em_tensor *delta, em_tensor *dq,
                      em_tensor *dk, em_tensor *dv, int causal, float scale) { return no_cuda(NULL); }
int em_flash_bwd_rope_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *o,
                           const em_tensor *lse, const em_tensor *dout, em_tensor *delta, em_tensor *dq,
                           em_tensor *dk, em_tensor *dv, int causal, float scale, const em_tensor *pos,
                           double theta) { return no_cuda(NULL); }
int em_adamw_cuda(int n, em_tensor **p, em_tensor **g, em_tensor **m, em_tensor **v, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t step, em_tensor **steps,
                  const em_tensor *lr_t, em_tensor **shadows) { return no_cuda(NULL); }
int em_sgd_cuda(int n, em_tensor **p, em_tensor **g, em_tensor **bufs, double lr, double momentum,
                double weight_decay, bool first_step) { return no_cuda(NULL); }
int em_sum_of_squares_cuda(int n, em_tensor **ts, em_tensor *out) { return no_cuda(NULL); }
int em_clip_grads_cuda(int n, em_tensor **grads, const em_tensor *sumsq, double max_norm,
                       em_tensor *norm_out) { return no_cuda(NULL); }

/* ---- issue 12: random ops and dropout ---- */
int em_dropout_cuda(const em_tensor *x, em_tensor *y, double p, em_philox_state st) { return no_cuda(NULL); }
int em_bernoulli_cuda(em_tensor *out, const em_tensor *p, double pc, em_philox_state st) { return no_cuda(NULL); }
int em_randperm_cuda(em_tensor *out, em_philox_state st) { return no_cuda(NULL); }
int em_multinomial_cuda(const em_tensor *probs, em_tensor *out, bool replacement,
                        em_philox_state st) { return no_cuda(NULL); }
/* ==== indexing — ops-indexing block begin ==== */
int em_index_cuda(const char *op, const em_index_plan *p, em_tensor *self, const em_tensor *index,
                  em_tensor *other) { return no_cuda(op); }
int em_index_from_cuda(const char *op, const em_index_plan *p, em_tensor *self, const em_tensor *from,
                       const em_tensor *index, const em_tensor *other) { return no_cuda(op); }
int em_nonzero_scan_cuda(const char *op, const em_tensor *x, em_tensor *pos) { return no_cuda(op); }
int em_masked_select_cuda(const char *op, const em_tensor *x, const em_tensor *pos,
                          em_tensor *out) { return no_cuda(op); }
int em_masked_scatter_cuda(const char *op, const em_tensor *g, const em_tensor *pos,
                           em_tensor *gx) { return no_cuda(op); }
int em_nonzero_cuda(const char *op, const em_tensor *pos, int ndim, const int64_t *shape,
                    em_tensor *out) { return no_cuda(op); }
int em_count_nonzero_cuda(const char *op, const em_tensor *x, em_tensor *count) { return no_cuda(op); }
int em_nonzero_select_cuda(const char *op, const em_tensor *x, int ndim, const int64_t *shape,
                           em_tensor *out) { return no_cuda(op); }
/* ==== ops-indexing block end ==== */
/* ---- stream compaction ---- */
int64_t em_compact_ws_bytes(int64_t n) { return 1; }
int em_compact_mark_cuda(const char *op, const em_tensor *x, em_tensor *ws, em_tensor *count, int64_t *host_count) {
  return no_cuda(op);
}
int em_compact_mark_heads_cuda(const char *op, const em_tensor *sorted, em_tensor *ws,
                               em_tensor *count) { return no_cuda(op); }
int em_compact_select_cuda(const char *op, const em_tensor *ws, const em_tensor *x,
                           em_tensor *out) { return no_cuda(op); }
int64_t em_compact_select1_ws_bytes(int64_t n) { return 1; }
int em_compact_select1_cuda(const char *op, const em_tensor *mask, const em_tensor *x, em_tensor *ws,
                            em_tensor *count, em_tensor *out) { return no_cuda(op); }
int em_compact_expand_cuda(const char *op, const em_tensor *ws, const em_tensor *g,
                           em_tensor *gx) { return no_cuda(op); }
int em_compact_coords_cuda(const char *op, const em_tensor *ws, int64_t n, int ndim, const int64_t *shape,
                           em_tensor *out) { return no_cuda(op); }
/* ---- sorting, selection and scans ---- */
int em_sort_cuda(const char *op, const em_tensor *a, int dim, bool descending, int64_t j0, int64_t cnt,
                 bool median_nan, em_tensor *vals, em_tensor *idx) { return no_cuda(op); }
int em_unique_ids_cuda(const char *op, const em_tensor *sorted, em_tensor *ids, em_tensor *count) { return no_cuda(op); }
int em_unique_finish_cuda(const char *op, const em_tensor *sorted, const em_tensor *order, const em_tensor *ids,
                          em_tensor *vals, em_tensor *inverse, em_tensor *counts) { return no_cuda(op); }
int em_bincount_cuda(const char *op, const em_tensor *x, const em_tensor *weights, em_tensor *out) { return no_cuda(op); }
int em_bincount_range_cuda(const char *op, const em_tensor *x, em_tensor *scratch) { return no_cuda(op); }
int em_searchsorted_cuda(const char *op, const em_tensor *seq, const em_tensor *values, bool right,
                         em_tensor *out) { return no_cuda(op); }
int em_scan_cuda(const char *op, const em_tensor *a, int64_t outer, int64_t L, int64_t inner, bool prod,
                 bool reverse, em_tensor *res) { return no_cuda(op); }
int em_cumprod_backward_cuda(const char *op, const em_tensor *x, const em_tensor *g, int64_t outer, int64_t L,
                             int64_t inner, em_tensor *gx) { return no_cuda(op); }
/* ---- end sorting ---- */
/* ---- shape & math ops (issue 12) ---- */
int em_dimmap_cuda(const char *op, em_tensor *out, const em_tensor *in, const em_dimmap *m) { return no_cuda(op); }
int em_float_class_cuda(const char *op, em_tensor *out, const em_tensor *x, bool nan) { return no_cuda(op); }
int em_reduce_math_cuda(const char *op, int kind, em_tensor *res, const em_tensor *a, const em_red_plan *p,
                        double pw) { return no_cuda(op); }
/* ---- end shape & math ops ---- */
