/* Ops. Each returns a NEW reference or NULL with the error set (message
 * starts with the op's user-facing name). Ops on tensors that require grad
 * record autograd nodes (see autograd.h) unless grad mode is off.
 *
 * `out` arguments: NULL allocates the result; a tensor writes into it (it must
 * have the result's shape; the value is converted to out's dtype when PyTorch's
 * same-kind rule allows it: no float result into an integer out, no non-bool
 * result into a bool out) and returns it retained. out == a gives the in-place twin (a:add_(b)). Writing into a
 * tensor that requires grad, or producing into `out` from inputs that require
 * grad, is an error while grad mode is on (as in PyTorch for leaves).
 *
 * Dtype rules follow PyTorch: promotion between tensor operands (em_promote);
 * a Lua number keeps the tensor's dtype unless it is fractional and the tensor
 * is integral (then f32); comparisons give bool; float-only ops (exp, sqrt,
 * division ...) on integer tensors give f32. */
#ifndef EMBER_OPS_H
#define EMBER_OPS_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------- elementwise (engine/ops/elementwise.c) ---------- */
typedef enum {
  EM_ADD, EM_SUB, EM_MUL, EM_DIV, EM_POW, EM_MAXIMUM, EM_MINIMUM,
  EM_EQ, EM_NE, EM_LT, EM_LE, EM_GT, EM_GE, EM_LOGICAL_AND, EM_LOGICAL_OR,
  EM_NBINOPS
} em_binop;

typedef enum {
  EM_NEG, EM_ABS, EM_SQRT, EM_RSQRT, EM_EXP, EM_LOG, EM_TANH, EM_SIGMOID,
  EM_SILU, EM_RELU, EM_GELU /* exact (erf), as torch default */, EM_SIN, EM_COS,
  EM_SQUARE, EM_RECIPROCAL, EM_SIGN, EM_LOGICAL_NOT, EM_FLOOR, EM_CEIL, EM_ROUND,
  EM_GELU_TANH /* issue 12: gelu(x, approximate="tanh") */,
  EM_NUNOPS
} em_unop;

const char *em_binop_name(em_binop op);   /* "add", "sub", ... */
const char *em_unop_name(em_unop op);     /* "neg", "abs", ... */

em_tensor *em_binary(em_binop op, em_tensor *a, em_tensor *b, em_tensor *out);
/* a OP s (or s OP a when scalar_first). */
em_tensor *em_binary_scalar(em_binop op, em_tensor *a, double s, bool scalar_first, em_tensor *out);
em_tensor *em_unary(em_unop op, em_tensor *a, em_tensor *out);
/* lo/hi: NAN means unbounded. */
em_tensor *em_clamp(em_tensor *a, double lo, double hi, em_tensor *out);
em_tensor *em_where(em_tensor *cond, em_tensor *a, em_tensor *b);
em_tensor *em_masked_fill(em_tensor *a, em_tensor *mask, double v, em_tensor *out);
em_tensor *em_triu(em_tensor *a, int64_t k);
em_tensor *em_tril(em_tensor *a, int64_t k);
/* silu(a) * b, fused. */
em_tensor *em_swiglu(em_tensor *a, em_tensor *b);

static inline em_tensor *em_add(em_tensor *a, em_tensor *b) { return em_binary(EM_ADD, a, b, NULL); }
static inline em_tensor *em_sub(em_tensor *a, em_tensor *b) { return em_binary(EM_SUB, a, b, NULL); }
static inline em_tensor *em_mul(em_tensor *a, em_tensor *b) { return em_binary(EM_MUL, a, b, NULL); }
static inline em_tensor *em_div(em_tensor *a, em_tensor *b) { return em_binary(EM_DIV, a, b, NULL); }
static inline em_tensor *em_mul_scalar(em_tensor *a, double s) { return em_binary_scalar(EM_MUL, a, s, false, NULL); }
static inline em_tensor *em_add_scalar(em_tensor *a, double s) { return em_binary_scalar(EM_ADD, a, s, false, NULL); }

/* ---------- reductions (engine/ops/reduce.c) ---------- */
/* dims: NULL/ndims=0 reduces all dims. */
em_tensor *em_sum(em_tensor *a, int ndims, const int64_t *dims, bool keepdim);
em_tensor *em_mean(em_tensor *a, int ndims, const int64_t *dims, bool keepdim);
/* Sum of integers/bools gives i64 (PyTorch); floats keep their dtype and accumulate in f32/f64. */
/* max/min over one dim: values and (optional) i64 indices. dim = EM_ALL_DIMS: over all, no indices. */
em_tensor *em_max(em_tensor *a, int64_t dim, bool keepdim, em_tensor **indices);
em_tensor *em_min(em_tensor *a, int64_t dim, bool keepdim, em_tensor **indices);
em_tensor *em_argmax(em_tensor *a, int64_t dim, bool keepdim);   /* EM_ALL_DIMS: flat index */
em_tensor *em_argmin(em_tensor *a, int64_t dim, bool keepdim);
/* correction: 1 = unbiased (torch default). */
em_tensor *em_var(em_tensor *a, int ndims, const int64_t *dims, double correction, bool keepdim);
em_tensor *em_logsumexp(em_tensor *a, int64_t dim, bool keepdim);
em_tensor *em_softmax(em_tensor *a, int64_t dim);
em_tensor *em_log_softmax(em_tensor *a, int64_t dim);

/* ---------- sorting, selection and scans (engine/ops/sort.c, engine/ops/scan.c) ---------- */
/* Stable sort along dim (NaN largest): values, and i64 indices in *indices (may be NULL). */
em_tensor *em_sort(em_tensor *a, int64_t dim, bool descending, bool stable, em_tensor **indices);
/* The i64 indices em_sort would give. */
em_tensor *em_argsort(em_tensor *a, int64_t dim, bool descending, bool stable);
/* The k largest (smallest when !largest) along dim, in sorted order; k in [0, size]. */
em_tensor *em_topk(em_tensor *a, int64_t k, int64_t dim, bool largest, bool sorted, em_tensor **indices);
/* The k-th smallest (k from 1) along dim, with its index. */
em_tensor *em_kthvalue(em_tensor *a, int64_t k, int64_t dim, bool keepdim, em_tensor **indices);
/* Lower median along dim (a NaN in a row gives NaN); dim = EM_ALL_DIMS: over all, 0-d, no indices. */
em_tensor *em_median(em_tensor *a, int64_t dim, bool keepdim, em_tensor **indices);
/* Inclusive cumulative sum / product along dim; integers and bool give i64. */
em_tensor *em_cumsum(em_tensor *a, int64_t dim);
em_tensor *em_cumprod(em_tensor *a, int64_t dim);
/* Sorted distinct values of the flattened tensor; inverse (a's shape) and counts (i64) may be NULL. Synchronises. */
em_tensor *em_unique(em_tensor *a, bool sorted, em_tensor **inverse, em_tensor **counts);
/* Counts (or summed weights) of each value of a 1-D non-negative integer tensor; weights may be NULL. Synchronises. */
em_tensor *em_bincount(em_tensor *a, em_tensor *weights, int64_t minlength);
/* i64 insertion points of values in the (last-dim) rows of seq; right: after equal elements. */
em_tensor *em_searchsorted(em_tensor *seq, em_tensor *values, bool right);
/* ---------- end sorting ---------- */

/* ---------- matmul (engine/ops/matmul.c) ---------- */
/* torch.matmul semantics: 1-D, 2-D, batched with broadcast batch dims. f32/f64
 * through BLAS; bf16/f16 accumulate in f32; integer types in i64. */
em_tensor *em_matmul(em_tensor *a, em_tensor *b);
/* x (..., in) @ w(out, in)^T + bias(out) (bias may be NULL). */
em_tensor *em_linear(em_tensor *x, em_tensor *w, em_tensor *bias);

/* ---------- neural-net ops (engine/ops/{loss,embedding,norm,rope,attention}.c) ---------- */
/* Mean cross-entropy over all targets. logits (..., V) float, targets (...) integer in [0, V). */
em_tensor *em_cross_entropy(em_tensor *logits, em_tensor *targets);
/* ids integer (any shape), w (n, d) -> (..., d). */
em_tensor *em_embedding(em_tensor *ids, em_tensor *w);
/* Per-bag sums (mean: / max(count, 1)) of embedding rows, one fused kernel;
 * CUDA only (F.embedding_bag composes embedding + sum on the CPU). ids (B, L)
 * with offsets NULL, or 1-D ids with offsets (B) i64 on w's device, already
 * validated (start at 0, non-decreasing, <= numel(ids)). -> (B, d) */
em_tensor *em_embedding_bag(em_tensor *ids, em_tensor *w, em_tensor *offsets, bool mean);
/* x / sqrt(mean(x^2, -1) + eps) * w, computed in f32 (or f64 for f64), result in x's dtype. w may be NULL. */
em_tensor *em_rmsnorm(em_tensor *x, em_tensor *w, double eps);
/* em_rmsnorm then em_to(out_dtype), the same values forward and backward (y
 * rounded once from the f32 result; the incoming bf16/f16 gradient widened
 * exactly); out_dtype EM_NDTYPES: em_rmsnorm. For f32 x (after autocast) and
 * a bf16/f16 out_dtype one node whose y is written in out_dtype directly (no
 * cast pass, forward or backward); otherwise the two ops. Error when
 * out_dtype is not a float dtype. */
em_tensor *em_rmsnorm_out(em_tensor *x, em_tensor *w, double eps, em_dtype out_dtype);
/* EMBER_NORM_OUT16 (read once at load; 0 or 1, default 1): whether models
 * (nn.TransformerLM's norms under autocast) ask for out_dtype. */
bool em_norm_out16(void);
/* The pre-norm residual add and its norm in one op: *s_out = x + r (r of x's
 * shape) and *y_out = em_rmsnorm(*s_out, w, eps), the same values as those two
 * calls; one autograd node with two outputs, one CUDA kernel when x is f32/f64,
 * r promotes to x's dtype and w is NULL or of x's dtype (else, or with
 * EMBER_FUSE_ADD_RMSNORM=0, the two ops). 0, or -1 with the error set and both NULL. */
int em_add_rmsnorm(em_tensor *x, em_tensor *r, em_tensor *w, double eps, em_tensor **s_out, em_tensor **y_out);
/* em_add_rmsnorm with y as em_rmsnorm_out's (s keeps x's dtype). */
int em_add_rmsnorm_out(em_tensor *x, em_tensor *r, em_tensor *w, double eps, em_dtype out_dtype, em_tensor **s_out,
                       em_tensor **y_out);
/* (x - mean) / sqrt(var + eps) * w + b over the last dim (PyTorch's layer_norm), in f32 (f64 for f64); w, b may be NULL. */
em_tensor *em_layer_norm(em_tensor *x, em_tensor *w, em_tensor *b, double eps);
/* Rotate adjacent pairs (x[2j], x[2j+1]) of the last dim by pos * theta^(-2j/d).
 * x (..., T, d), d even; pos integer (T) or broadcastable to x's leading dims + T. */
em_tensor *em_rope(em_tensor *x, em_tensor *pos, double theta);
/* em_rope of q and of k with one autograd node (one CUDA launch each way when
 * they share dtype and last dim): *q_out, *k_out new tensors. 0, or -1 with
 * the error set and both NULL. */
int em_rope_qk(em_tensor *q, em_tensor *k, em_tensor *pos, double theta, em_tensor **q_out, em_tensor **k_out);
/* Causal masking of attention. Query i sees keys j <= i + offset:
 * top-left aligned, offset 0 (PyTorch SDPA's is_causal; `true` converts to
 * it), or bottom-right aligned, offset Tk - Tq (the last query sees every
 * key: queries at the end of a KV cache; needs Tq <= Tk). Equal for Tq = Tk. */
typedef enum { EM_CAUSAL_NONE = 0, EM_CAUSAL_TOP_LEFT = 1, EM_CAUSAL_BOTTOM_RIGHT = 2 } em_causal;

/* softmax(q k^T * scale + causal mask) v. q (..., Tq, d), k/v (..., Tk, d),
 * batch dims broadcast; grouped-query attention when q has H heads (dim -3)
 * and k/v Hkv, H a multiple of Hkv (head h reads kv head h / (H / Hkv)).
 * scale <= 0 means 1/sqrt(d). Naive: materialises the score matrix. */
em_tensor *em_attention_naive(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale);
/* FlashAttention (engine/ops/flash_attention.c): the same function without
 * the score matrix. q (B, H, Tq, D) or (B, Tq, D) (one head), k/v (B, Hkv,
 * Tk, D) or (B, Tk, D), H a multiple of Hkv, D in {16, 32, 64, 80, 96, 128,
 * 256}. CUDA: bf16 or f16 (f32 is lowered under autocast), or f32 outside
 * autocast on the TF32 tensor cores, kernels/flash_*.cu (Tq <=
 * EM_FLASH_DECODE_MAX_TQ: the split-key decode kernel, f32 arithmetic);
 * CPU: any float dtype, tiled (engine/ops/flash_cpu.c). lse_out, when not
 * NULL, receives the rows' log-sum-exp (B, H, Tq) or (B, Tq), f32 (f64 for
 * f64 inputs). */
em_tensor *em_flash_attention(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale,
                              em_tensor **lse_out);
/* em_flash_attention on q and k rotated by RoPE (em_rope's pos and theta;
 * one pos broadcasting to q's and k's leading dims), gradients w.r.t. the
 * un-rotated q and k (engine/ops/flash_rope.c): the same values as
 * em_rope_qk then em_flash_attention, which it composes wherever no fused
 * kernel applies. */
em_tensor *em_flash_attention_rope(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale,
                                   em_tensor *pos, double theta, em_tensor **lse_out);
/* Generation's decode attention (engine/ops/flash_decode.c): q (B, H, Tq, D),
 * Tq <= EM_FLASH_DECODE_MAX_TQ, against caches k, v (B, Hkv, max_len, D) of
 * which the first n = n_keys[b] are filled (n_keys i64 (1) or (B), on q's
 * device, never read on the host for CUDA: clamped to [0, max_len] there);
 * query i sees keys < n − Tq + 1 + i, a row seeing none gives 0. CUDA: the
 * split-key decode kernels reading only n keys, capturable in a CUDA graph
 * with n changing between replays; bf16, f16 or f32 (f32 arithmetic). CPU:
 * any float dtype, em_flash_attention on the first n keys. Forward only
 * (an error when q, k or v requires grad). scale <= 0 means 1/sqrt(D). */
em_tensor *em_flash_decode(em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *n_keys, double scale);
/* true when em_attention takes the flash path for these inputs (under the
 * current autocast state): em_flash_attention accepts them, f32 on CUDA only
 * with TF32 allowed (em_cuda_allow_tf32), and, on the CPU,
 * Tk >= EM_FLASH_CPU_MIN_TK (shorter rows run faster through BLAS's one big
 * matmul than through tiles). */
bool em_flash_applies(em_tensor *q, em_tensor *k, em_tensor *v);
#define EM_FLASH_CPU_MIN_TK 256
#define EM_FLASH_DECODE_MAX_TQ 16
/* The CPU path's tile sizes (query rows bq, key rows bk) for head dim d.
 * em_flash_cpu_set_tiles forces them for every d — a test hook (several tiles
 * at small T), process-wide and not thread-safe; 0, 0 restores the defaults. */
void em_flash_cpu_tiles(int64_t d, int *bq, int *bk);
void em_flash_cpu_set_tiles(int bq, int bk);
/* The CUDA forward kernel for more than 16 queries: 0 auto (on sm_90 where
 * they apply the wg2 kernel at D 128 and wg3 at D 64, else the mma.sync one), 1 mma, 2 wg (forced, for
 * every Tq; an error where it does not apply), 3 wg2 (wg with the softmax
 * overlapped with the matmuls, forced likewise), 4 wg3 (wg2 with three
 * consumer warpgroups at D 64). The default comes from
 * EMBER_FLASH_FWD=auto|mma|wg|wg2|wg3 (docs/flash.md). mode >= 0 sets it (process-
 * wide, not thread-safe: a test and benchmark hook); returns the previous
 * setting, or -1 with the error set for a bad EMBER_FLASH_FWD. */
int em_flash_fwd_choice(int mode);
/* The CUDA backward kernels: 0 auto (wg where it applies, else mma), 1 mma,
 * 2 wg (the wgmma dk/dv and dq kernels, sm_90, bf16/f16, D 64/128; forced:
 * an error where they do not apply), 3 wg2 (wg with ping-pong and overlap,
 * opt-in, as wg otherwise). The default comes from
 * EMBER_FLASH_BWD=auto|mma|wg|wg2 (docs/flash.md, "Step 4" and "Step 4b"). mode >= 0 sets it
 * (process-wide, a test and benchmark hook); returns the previous setting,
 * or -1 with the error set for a bad EMBER_FLASH_BWD. */
int em_flash_bwd_choice(int mode);
/* Flash where it applies, the naive composition otherwise. */
em_tensor *em_attention(em_tensor *q, em_tensor *k, em_tensor *v, em_causal causal, double scale);

/* ---------- shape ops (engine/ops/shape.c) ---------- */
em_tensor *em_cat(int n, em_tensor *const *ts, int64_t dim);
em_tensor *em_stack(int n, em_tensor *const *ts, int64_t dim);

/* ---------- random (engine/rng.c; see rng.h for the algorithm) ---------- */
em_tensor *em_rand(int ndim, const int64_t *shape, em_dtype dt, em_device dev);
em_tensor *em_randn(int ndim, const int64_t *shape, em_dtype dt, em_device dev);
em_tensor *em_randint(int64_t lo, int64_t hi, int ndim, const int64_t *shape, em_dtype dt, em_device dev);
int em_uniform_(em_tensor *t, double lo, double hi);
int em_normal_(em_tensor *t, double mean, double std);
/* Normal(mean, std) truncated to [a, b] (resampling-free inverse-CDF method). */
int em_trunc_normal_(em_tensor *t, double mean, double std, double a, double b);

/* ---------- optimizers (engine/ops/optim.c) ---------- */
/* PyTorch AdamW, in place over n tensors: p -= lr*wd*p; m = b1 m + (1-b1) g;
 * v = b2 v + (1-b2) g^2; p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps). */
int em_adamw_(int n, em_tensor **params, em_tensor **grads, em_tensor **exp_avg,
              em_tensor **exp_avg_sq, double lr, double beta1, double beta2,
              double eps, double weight_decay, int64_t step);
/* SGD with optional momentum and weight decay (PyTorch formula). bufs may be NULL when momentum == 0. */
int em_sgd_(int n, em_tensor **params, em_tensor **grads, em_tensor **bufs,
            double lr, double momentum, double weight_decay, bool first_step);
/* Sum of squares of all tensors as an f32 0-d tensor on their device. */
em_tensor *em_sum_of_squares(int n, em_tensor **ts);
/* Capturable AdamW: em_adamw_ with each parameter's step count in steps[i] (a
 * 0-d f32 or i64 tensor on the parameter's device, the steps taken so far),
 * incremented by this call before use, and lr read from lr_t (0-d f32/f64 on
 * that device) when lr_t is not NULL (else lr). On CUDA nothing is read on
 * the host, so a captured training step replays with the right bias
 * corrections. The steps must be distinct tensors. */
int em_adamw_capturable_(int n, em_tensor **params, em_tensor **grads, em_tensor **exp_avg,
                         em_tensor **exp_avg_sq, em_tensor **steps, em_tensor *lr_t, double lr,
                         double beta1, double beta2, double eps, double weight_decay);
/* clip_grad_norm's second half: with total = sqrt(sumsq) (sumsq the 0-d f32
 * from em_sum_of_squares, read on its device), when total > max_norm scale
 * every grad in place by max_norm / (total + 1e-6). Returns total as a 0-d f32
 * tensor on sumsq's device. On CUDA: one multi-tensor launch, no host read. */
em_tensor *em_clip_grads_(int n, em_tensor **grads, em_tensor *sumsq, double max_norm);

/* ---------- issue 12: random ops, dropout, losses (engine/ops/{random,dropout,loss}.c) ---------- */
/* A loss's reduction, as PyTorch's reduction="none" | "mean" | "sum". */
typedef enum { EM_REDUCTION_NONE, EM_REDUCTION_MEAN, EM_REDUCTION_SUM } em_reduction;
/* cross_entropy with PyTorch's options: rows whose target is ignore_index
 * count for nothing (mean divides by the others); label_smoothing in [0, 1];
 * "none" returns the row losses in targets' shape. */
em_tensor *em_cross_entropy_ex(em_tensor *logits, em_tensor *targets, int64_t ignore_index, double label_smoothing,
                               em_reduction reduction);
/* binary_cross_entropy_with_logits, fused (engine/ops/loss_bce.c):
 * w [(1 - y) x + (1 + (pw - 1) y) softplus(-x)] reduced; target, weight and
 * pos_weight (weight, pos_weight may be NULL) broadcast with input. */
em_tensor *em_bce_with_logits(em_tensor *input, em_tensor *target, em_tensor *weight, em_tensor *pos_weight,
                              em_reduction reduction);
/* mse_loss and l1_loss, fused (engine/ops/loss_diff.c): (input - target)^2
 * and |input - target| of float tensors broadcast together, reduced; one
 * pass forward, one backward. */
em_tensor *em_mse_loss(em_tensor *input, em_tensor *target, em_reduction reduction);
em_tensor *em_l1_loss(em_tensor *input, em_tensor *target, em_reduction reduction);
/* nll_loss, fused (engine/ops/loss_nll.c): -w[t] logp[..., t] per target
 * for log-probabilities logp (..., C) (class dim last) and integer targets
 * (...); targets equal to ignore_index count for nothing; weight (C) or
 * NULL; mean divides by the summed weights of the counted targets. */
em_tensor *em_nll_loss(em_tensor *logp, em_tensor *target, em_tensor *weight, int64_t ignore_index,
                       em_reduction reduction);
/* Training-mode dropout: x * m / (1 - p), m_j ~ Bernoulli(1 - p) from the
 * global Philox stream; p in [0, 1]. Differentiable (the mask is regenerated). */
em_tensor *em_dropout(em_tensor *x, double p);
/* A tensor of p's shape and dtype: 1 with probability p_j, else 0. */
em_tensor *em_bernoulli(em_tensor *p);
/* t (any dtype, in place) = Bernoulli draws with probability p (a float
 * tensor broadcastable to t) or, when p is NULL, the number pc. */
int em_bernoulli_(em_tensor *t, em_tensor *p, double pc);
/* A random permutation of 0..n-1 of dtype dt on dev. */
em_tensor *em_randperm(int64_t n, em_dtype dt, em_device dev);
/* num_samples category indices (i64) per row of probs (C) or (N, C), with
 * or without replacement; probs need not sum to 1. */
em_tensor *em_multinomial(em_tensor *probs, int64_t num_samples, bool replacement);
/* ---------- end issue 12 ---------- */
/* ---------- indexing (engine/ops/indexing.c) — ops-indexing block begin ---------- */
/* PyTorch semantics; dims 0-based, negative dims count from the end; index
 * tensors i32 or i64 (on the CPU out-of-range values are an error before
 * anything is written; on CUDA see backend.h's em_index_cuda). */
/* x's slices along dim picked by the 1-D index: shape of x with dim's size = numel(index). */
em_tensor *em_index_select(em_tensor *x, int64_t dim, em_tensor *index);
/* index_select with t[idx]'s rule (t:index): an index in [-size, 0) counts
 * from the end; out of [-size, size) is an error on the CPU, a NaN slice on
 * CUDA (as index_select's). One kernel on CUDA (no normalising launches). */
em_tensor *em_index_select_wrap(em_tensor *x, int64_t dim, em_tensor *index);
/* out[p] = x[p with p[dim] = index[p]]; index has x's ndim, out has index's shape. */
em_tensor *em_gather(em_tensor *x, int64_t dim, em_tensor *index);
/* x with x[p with p[dim] = index[p]] = src[p] (src NULL: value) for every p of index.
 * inplace: writes x itself and returns it retained (scatter_), not recorded by autograd. */
em_tensor *em_scatter(em_tensor *x, int64_t dim, em_tensor *index, em_tensor *src, double value, bool inplace);
/* The same with += (duplicates accumulate). */
em_tensor *em_scatter_add(em_tensor *x, int64_t dim, em_tensor *index, em_tensor *src, bool inplace);
/* x with x.select(dim, index[i]) += alpha * src.select(dim, i) for each i (index 1-D). */
em_tensor *em_index_add(em_tensor *x, int64_t dim, em_tensor *index, em_tensor *src, double alpha, bool inplace);
/* The elements of x where the bool mask (broadcast with x) is true, as a 1-D tensor. */
em_tensor *em_masked_select(em_tensor *x, em_tensor *mask);
/* (count, ndim) i64 coordinates of x's nonzero elements in row-major order. */
em_tensor *em_nonzero(em_tensor *x);
/* gather after broadcasting x and indices over every dim but dim; EM_ALL_DIMS: both flattened. */
em_tensor *em_take_along_dim(em_tensor *x, em_tensor *indices, int64_t dim);
/* ids (...) integer -> (..., num_classes) i64 with a 1 at each id; num_classes -1: max(ids) + 1. */
em_tensor *em_one_hot(em_tensor *ids, int64_t num_classes);
/* ---------- ops-indexing block end ---------- */
/* ---------- shape & math ops (engine/ops/shape_ops.c, math_ops.c, einsum.c; issue 12) ---------- */
/* torch.Tensor.repeat: sizes (n >= a->ndim) copies along each dim (a's shape padded with leading 1s). */
em_tensor *em_repeat(em_tensor *a, int n, const int64_t *sizes);
/* torch.tile: em_repeat with reps padded with leading 1s to a's ndim. */
em_tensor *em_tile(em_tensor *a, int n, const int64_t *reps);
/* Reverse the order along each of dims (a copy). */
em_tensor *em_flip(em_tensor *a, int n, const int64_t *dims);
/* Roll by shifts[i] along dims[i]; n_dims == 0: roll the flattened tensor by shifts[0] (n_shifts 1). */
em_tensor *em_roll(em_tensor *a, int n_shifts, const int64_t *shifts, int n_dims, const int64_t *dims);
/* torch.diag: 1-D -> square matrix with a on diagonal k; 2-D -> its diagonal k (a copy). */
em_tensor *em_diag(em_tensor *a, int64_t k);
/* a (n) outer b (m) -> (n, m). */
em_tensor *em_outer(em_tensor *a, em_tensor *b);
/* torch.einsum for one or two operands (no ellipsis, no repeated label within an operand). */
em_tensor *em_einsum(const char *equation, int n, em_tensor *const *operands);
/* beta * input + alpha * (b1 @ b2); b1 (B, n, k), b2 (B, k, m), input broadcastable to (B, n, m). */
em_tensor *em_baddbmm(em_tensor *input, em_tensor *b1, em_tensor *b2, double beta, double alpha);
/* Product over dim (EM_ALL_DIMS: all). Integers and bool give i64. */
em_tensor *em_prod(em_tensor *a, int64_t dim, bool keepdim);
/* torch.linalg.vector_norm: p = 1, 2, INFINITY or any p > 0; float inputs. dims NULL/0: all. */
em_tensor *em_norm(em_tensor *a, double p, int ndims, const int64_t *dims, bool keepdim);
/* Max/min values over dims (NULL/0: all); gradients shared evenly among ties. */
em_tensor *em_amax(em_tensor *a, int ndims, const int64_t *dims, bool keepdim);
em_tensor *em_amin(em_tensor *a, int ndims, const int64_t *dims, bool keepdim);
/* a + w (b - a); w a tensor (broadcast) or, with w NULL, the number ws. */
em_tensor *em_lerp(em_tensor *a, em_tensor *b, em_tensor *w, double ws);
/* x + value * t1 * t2 and x + value * t1 / t2; out as for em_binary (out == x: in place). */
em_tensor *em_addcmul(em_tensor *x, em_tensor *t1, em_tensor *t2, double value, em_tensor *out);
em_tensor *em_addcdiv(em_tensor *x, em_tensor *t1, em_tensor *t2, double value, em_tensor *out);
/* bool tensors: NaN elements; finite elements (not NaN, not +-inf). */
em_tensor *em_isnan(em_tensor *a);
em_tensor *em_isfinite(em_tensor *a);
/* ---------- end shape & math ops ---------- */

#ifdef __cplusplus
}
#endif
#endif
