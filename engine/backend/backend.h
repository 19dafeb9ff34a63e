/* The engine -> CUDA boundary: the one header through which engine/ reaches
 * Ember's CUDA code (kernels/), and the only engine header kernels/ include
 * besides the public ember/ headers. The arrow runs one way, as in ggml's
 * ggml-backend-impl.h: the engine asks, the backend answers; kernels never
 * see the engine's private headers (internal.h, profile/).
 *
 *   1. What the engine lends the backend: the op scope (the op's name for
 *      errors and memory history; NVTX and profiler ranges), the tensor
 *      geometry helpers, and the profiler's hooks for CUPTI records.
 *   2. What the backend gives the engine: memory hooks (allocator, copies
 *      between host and device), the current stream, the CUPTI side of the
 *      profiler, what the kernels support (em_flash_supported_dim), and the
 *      launchers, one section per op family (engine/ops/<stem>.c ->
 *      kernels/<stem>.cu).
 *
 * A launcher takes tensors the engine op has validated, launches on the
 * current stream, returns 0 or -1 with the error set (em_error) and never
 * synchronises the host. A build with CUDA links kernels/; a build without
 * links engine/backend/no_cuda.c, where every entry point answers
 * "<op>: this build of Ember has no CUDA backend". So no op decides its
 * device with an #ifdef: an op calls its launcher for a CUDA tensor and the
 * build decides who answers. Plain C ABI, compiled by cc and nvcc alike. */
#ifndef EMBER_BACKEND_H
#define EMBER_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "ember/ember.h"

#ifdef __cplusplus
extern "C" thread_local const char *em_current_op;
extern "C" {
#else
/* The innermost op running on this thread ("rmsnorm"), NULL outside ops. */
extern _Thread_local const char *em_current_op;
#endif

/* ======================= 1. the engine, for the backend ======================= */

/* ---- the op scope ----
 * The one entry point every op passes through: EM_OP_SCOPE("name") at the
 * top of an op names it for NVTX ranges, the profiler and memory-history
 * context. While nothing measures, a scope costs two stores, one load and
 * one predictable branch on entry and on exit; the measuring work (NVTX
 * push/pop, host timestamps, launch counts, CUDA events) is out of line in
 * engine/profile/scope.c and only runs while ember.nvtx or ember.profiler
 * switched it on. The backend opens one for work it starts itself (graph
 * replay). */

/* Bits of em_measure_flags: what a scope does besides naming its op.
 * CAPTURE: some thread captures a CUDA graph; its scopes keep the cost they
 * declare for the kernels they capture (engine/profile/capture_cost.c). */
enum { EM_MEASURE_NVTX = 1, EM_MEASURE_PROFILE = 2, EM_MEASURE_CAPTURE = 4 };
/* Written by ember.nvtx.enable, the profiler's start/stop and graph capture, read relaxed. */
extern int em_measure_flags;

typedef struct em_op_scope {
  const char *prev;
  int on;                         /* em_measure_flags at entry: 0 on the fast path */
  /* filled only while measuring (engine/profile/scope.c) */
  const char *name;
  struct em_op_scope *parent;     /* the enclosing measured scope on this thread */
  int64_t t0, child_ns;           /* host ns at entry; inclusive ns of nested scopes */
  uint32_t launches0, child_launches;
  uint32_t gen;                   /* profiler session this scope belongs to */
  int32_t ev;                     /* CUDA-event backend: event pair index, -1 none */
  uint32_t seq;                   /* this scope's number in the session (kernels carry it) */
  uint8_t fclass;                 /* em_flop_class of the FLOPs declared */
  double bytes, flops;            /* cost declared in this scope (EM_OP_COST) */
  double child_bytes, child_flops;/* ... and in nested scopes */
  struct em_op_scope *cap_parent; /* capture: the enclosing scope of this thread's capture */
  uint32_t cap;                   /* capture: this op call's id (the graph nodes it creates carry it); 0 none */
} em_op_scope_t;

void em_op_scope_begin(em_op_scope_t *s, const char *name);
void em_op_scope_end(em_op_scope_t *s);

static inline void em_op_scope_enter(em_op_scope_t *s, const char *name) {
  s->prev = em_current_op;
  em_current_op = name;
  s->on = __atomic_load_n(&em_measure_flags, __ATOMIC_RELAXED);
  if (__builtin_expect(s->on != 0, 0)) em_op_scope_begin(s, name);
}

static inline void em_op_scope_exit(em_op_scope_t *s) {
  if (__builtin_expect(s->on != 0, 0)) em_op_scope_end(s);
  em_current_op = s->prev;
}

/* ---- declared cost: the roofline columns of the profiler ----
 * An op states the bytes it must move and the FLOPs it must do (the floor,
 * from its shapes: every tensor read or written once) inside its scope:
 *   EM_OP_COST(em_cost_bytes(3, (em_tensor *[]){a, b, y}), em_numel(y), EM_FLOPS_F32);
 * The arguments are evaluated only while a profiler session runs or a CUDA
 * graph is captured; the cost goes to the innermost open op scope
 * (engine/profile/profiler.c) and the kernels launched there inherit it --
 * captured kernels at every replay (engine/profile/capture_cost.c). The
 * class says which peak the FLOPs are held against: tensor-core matmuls by
 * their dtype, everything else the plain f32 (f64) pipes. */
typedef enum { EM_FLOPS_F32 = 0, EM_FLOPS_F64, EM_FLOPS_TF32, EM_FLOPS_BF16, EM_FLOPS_F16, EM_FLOP_CLASSES } em_flop_class;
void em_op_cost_add(double bytes, double flops, int fclass);
#define EM_COSTING()                                                                       \
  __builtin_expect((__atomic_load_n(&em_measure_flags, __ATOMIC_RELAXED) &                 \
                    (EM_MEASURE_PROFILE | EM_MEASURE_CAPTURE)) != 0, 0)
#define EM_OP_COST(bytes, flops, fclass)                                                   \
  do {                                                                                     \
    if (EM_COSTING()) em_op_cost_add((double)(bytes), (double)(flops), (int)(fclass));     \
  } while (0)

/* ---- tensor geometry (engine/util.c) ---- */
/* Strides of t viewed as broadcast to (ndim, shape): 0 for broadcast dims. t's shape must be compatible. */
void em_broadcast_strides(const em_tensor *t, int ndim, const int64_t *shape, int64_t *strides);
/* Row-major strides of a contiguous tensor of this shape. */
void em_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);
/* The product of the sizes (1 for ndim 0). */
int64_t em_shape_numel(int ndim, const int64_t *shape);
/* A contiguous tensor of dtype dt with t's values (t itself retained when already so). */
em_tensor *em_contiguous_as(em_tensor *t, em_dtype dt);

/* ---- profiler hooks (engine/profile/profiler.c), for the CUPTI side ---- */
/* Host CLOCK_MONOTONIC nanoseconds: the clock every profile record uses. */
int64_t em_prof_now_ns(void);

enum { EM_GPU_KERNEL = 0, EM_GPU_MEMCPY, EM_GPU_MEMSET };
enum { EM_GPU_EAGER = 0, EM_GPU_GRAPH, EM_GPU_GRAPH_CAPTURED };

/* One GPU activity with the context of the API call that launched it. */
typedef struct {
  const char *name;                 /* interned: short demangled kernel name, "[memcpy HtoD]", ... */
  const char *op, *module, *grad_fn;
  int64_t t0, t1;
  uint64_t bytes;
  uint32_t device, stream;
  uint32_t op_seq;                  /* the launching op scope's seq in this session; 0 unknown */
  uint32_t cap_call;                /* graph replay: the capture-time op call's id (em_capcost_call); 0 none */
  uint32_t launch;                  /* CUPTI correlation id of the launch (a replay: its cudaGraphLaunch) */
  uint8_t kind, phase, graph;
} em_prof_gpu;

/* One kernel launched on this thread (counted into the open op scopes). */
void em_prof_note_launch(void);
/* The seq of this thread's innermost op scope in the running session (0: none). */
uint32_t em_prof_current_seq(void);
/* Hand over one GPU record at stop (any thread; copies *g). */
int em_prof_add_gpu(const em_prof_gpu *g);

/* ---- capture-time costs (engine/profile/capture_cost.c), for graph.cu and cupti.cu ----
 * While a thread captures, its op scopes are numbered (capture call ids) and
 * keep the cost they declare; a graph node created in a scope carries its id
 * and holds a reference to the cost, so a replayed kernel gets its op call's
 * cost as an eager launch does. Costs of calls that created no node are
 * dropped when the capture ends; the others when their last node is destroyed. */
void em_capcost_capture_begin(void);      /* this thread starts capturing */
void em_capcost_capture_end(void);        /* ... and stops (drops the costs no node holds) */
uint32_t em_capcost_call(void);           /* this thread's innermost capture call id; 0 none */
void em_capcost_ref(uint32_t call, int delta);   /* a node of `call` created (+1) or destroyed (-1) */

/* ======================= 2. the backend, for the engine ======================= */

/* ---- memory hooks (kernels/device.cu installs them when the runtime starts) ---- */
typedef struct {
  void *(*alloc)(size_t nbytes, int device);
  void (*free)(void *p, int device);
  int (*memcpy_h2d)(void *dst, const void *src, size_t n, int device);
  int (*memcpy_d2h)(void *dst, const void *src, size_t n, int device);
  int (*memcpy_d2d)(void *dst, const void *src, size_t n, int device);
} em_cuda_backend;
/* NULL until a CUDA runtime with at least one device has started (always NULL without CUDA). */
extern const em_cuda_backend *em_cuda;

/* ---- the current stream (kernels/stream.cu) ---- */
/* The cudaStream_t ops on `device` launch on, for this thread. */
void *em_cuda_cur_stream_handle(int device);

/* ---- the CUPTI side of the profiler (kernels/cupti.cu) ---- */
/* Load libcupti and subscribe (once). 0, or -1 with a reason in why. */
int em_cupti_init(char *why, size_t cap);
/* Begin recording launches and activity. 0, or -1 with a reason. */
int em_cupti_start(int64_t t_start, char *why, size_t cap);
/* Flush (the device must be synchronised) and hand records to em_prof_add_gpu.
 * Returns records dropped by CUPTI; *before counts unattributed activity
 * that ran before t_start (left out). */
int64_t em_cupti_stop(int64_t t_start, int64_t *before);

/* ---- random fills (kernels/rng.cu; the math both sides share: engine/backend/rng_math.h) ---- */
enum { EM_RNG_UNIFORM, EM_RNG_NORMAL, EM_RNG_TRUNC, EM_RNG_RANDINT };

/* A distribution, as engine/rng.c describes it to the CPU loop and the kernel alike. */
typedef struct {
  int kind;
  double p0, p1;          /* uniform: lo, hi; normal/trunc: mean, std */
  double a, b;            /* trunc: clamp bounds */
  double v0, v1;          /* trunc: the uniform interval [2 Phi(a') - 1, 2 Phi(b') - 1] */
  int64_t lo;             /* randint: lower bound */
  uint64_t span;          /* randint: hi - lo */
} em_rng_dist;

/* Where a CUDA random op's Philox stream starts (its key and first counter).
 *   eager:    cell == NULL; key = seed, first counter = offset (both by value).
 *   captured: cell points at the capturing graph's device-resident pair
 *             {seed, base}; key = cell[0], first counter = cell[1] + offset,
 *             offset being the op's position within the graph's range.
 * A kernel resolves it on the device (em_philox_resolve, rng_math.h), so a
 * CUDA graph never bakes a host counter into its kernels: em_graph_replay
 * writes {seed, em_rng_reserve(graph's blocks)} into the cell (a stream-ordered
 * one-thread kernel) before each launch, and every replay draws fresh numbers
 * -- the very numbers running the captured ops eagerly at that point would. */
typedef struct { uint64_t seed, offset; const uint64_t *cell; } em_philox_state;

/* (engine/rng.c) The state for a random op about to consume `blocks` Philox
 * blocks on a CUDA device: the graph's cell while this thread captures, else
 * the global generator's (seed, em_rng_reserve(blocks)). */
em_philox_state em_rng_cuda_state(uint64_t blocks);
/* (kernels/graph.cu) While this thread captures: reserve `blocks` of the
 * graph's Philox range, set *offset to their start within it and return the
 * graph's cell; NULL (nothing reserved) when not capturing. */
const uint64_t *em_cuda_graph_rng_reserve(uint64_t blocks, uint64_t *offset);

/* Fill t (a CUDA tensor, any strides) with the stream that starts at st:
 * element j in t's logical row-major order gets the value the CPU gives
 * element j. Launches on the current stream. */
int em_rng_fill_cuda(em_tensor *t, const em_rng_dist *d, em_philox_state st);

/* ---- copies (kernels/copy.cu) ---- */
/* Copies and fills involving CUDA tensors (kernels/copy.cu). engine/tensor.c
 * routes em_copy_/em_fill_ here for every non-CPU case; em_to, em_contiguous
 * and em_clone reach it through em_copy_. Everything is stream-ordered on the
 * current stream; only copies to pageable host memory wait for the device. */

/* dst[...] = src[...] with src broadcast to dst's shape, any strides, any of
 * the 9 dtypes (converted exactly as the CPU converts), any devices (at least
 * one CUDA). Validation (shapes, in-place rules) is em_copy_'s job. */
int em_copy_cuda(em_tensor *dst, em_tensor *src);
/* Fill a CUDA tensor of any strides with v converted to its dtype. */
int em_fill_cuda(em_tensor *dst, double v);
/* A same-device copy/convert kernel launch: dst and src on one CUDA device. */
int em_copy_device_cuda(em_tensor *dst, const em_tensor *src);

/* ---- elementwise (kernels/elementwise.cu) ---- */
/* Elementwise launchers (kernels/elementwise.cu) behind a C ABI, and the
 * descriptions engine/ops/elementwise.c shares with them: the op codes beyond
 * the public enums (clamp, the fused unary gradients), compute classes, and
 * the coalesced broadcast loop plan. Plain C. */

/* Compute classes: f32 (f32/bf16/f16 storage), f64, i64 (integers and bool). */
enum { EM_EW_F32, EM_EW_F64, EM_EW_I64 };
/* Kernel arities. */
enum { EM_EW_BINARY, EM_EW_UNARY, EM_EW_WHERE };
/* Unary code beyond em_unop: clamp to [lo, hi]. */
enum { EM_EW_CLAMP = EM_NUNOPS };
/* Binary codes beyond em_binop: fused gradients of unary ops, g' = f(g, v)
 * with v the saved input x or output y (see unary_grad in elementwise.c). */
enum {
  EM_EW_G_ABS = EM_NBINOPS, EM_EW_G_SQRT, EM_EW_G_RSQRT, EM_EW_G_TANH, EM_EW_G_SIGMOID,
  EM_EW_G_SILU, EM_EW_G_RELU, EM_EW_G_GELU, EM_EW_G_SIN, EM_EW_G_COS, EM_EW_G_SQUARE,
  EM_EW_G_RECIP, EM_EW_G_CLAMP,
  EM_EW_G_GELU_TANH,   /* issue 12 */
};

/* What to compute: arity, op code, compute class, clamp bounds (+-inf when unbounded). */
typedef struct {
  int kind, code, cls;
  double lo, hi;
} em_ew_kern;

/* An operand: a tensor broadcast to the loop shape, or the constant c (t NULL). */
typedef struct {
  const em_tensor *t;
  double c;
} em_ew_operand;

/* The broadcast iteration space with size-1 dims dropped and mergeable dims
 * merged; operand 0 is the output, operand j+1 input j. Strides in elements
 * (0 for broadcast dims and constants), relative to each tensor's offset. */
typedef struct {
  int ndim, n;
  int64_t shape[EM_MAX_DIMS];
  int64_t stride[4][EM_MAX_DIMS];
} em_ew_plan;

/* out = k(in...) over plan p (numel elements). out does not overlap any input
 * except as the very same view (the engine routes other overlaps through a
 * temporary). Launches on the current stream; no host synchronisation. */
int em_elementwise_cuda(const char *op, const em_ew_kern *k, em_tensor *out, int nin,
                        const em_ew_operand *in, const em_ew_plan *p, int64_t numel);

/* res (contiguous, a's shape and dtype) = a with the part of each trailing
 * matrix outside the triangle zeroed: upper keeps j - i >= k, lower j - i <= k. */
int em_triangle_cuda(const char *op, em_tensor *res, const em_tensor *a, int64_t k, bool upper);

/* ---- reductions (kernels/reduce.cu) ---- */
/* Reduction launchers (kernels/reduce.cu) behind a C ABI, and the reduction
 * plan engine/ops/reduce.c shares with them. */

/* An input's dims split into kept (outer, one output each) and reduced
 * (inner) dims, each list coalesced where memory allows (nr >= 1; a
 * reduction over nothing has rshape {1}, rstride {0}). Strides in elements
 * relative to the input's offset. Outputs are numbered row-major over the
 * kept dims; reduced positions row-major over the reduced dims (the index
 * max/min/argmax return). */
typedef struct {
  int nk, nr;
  int64_t kshape[EM_MAX_DIMS], kstride[EM_MAX_DIMS];
  int64_t rshape[EM_MAX_DIMS], rstride[EM_MAX_DIMS];
  int64_t n_out, n_red;
} em_red_plan;

/* All launchers: outputs are contiguous and freshly allocated by the engine,
 * work goes on the current stream, nothing synchronises the host. */

/* res = sum over the plan's reduced dims / div. Floats accumulate in f32
 * (f64 for f64) and res has a's dtype; integers and bool sum exactly in i64
 * (wrapping) and res is i64. */
int em_sum_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p, double div);
/* res = sum((a - mean)^2) / dof, two passes, float inputs only. */
int em_var_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p, double dof);
/* Extremes: vals (a's dtype, may be NULL) and i64 indices (may be NULL);
 * the first index wins ties and the first NaN wins over everything. */
int em_extreme_cuda(const char *op, const em_tensor *a, const em_red_plan *p, bool is_max,
                    em_tensor *vals, em_tensor *idx);
/* res = max + log(sum(exp(a - max))) (shift 0 for an infinite max, NaN for a NaN max). */
int em_logsumexp_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p);
/* One-pass var and logsumexp over float rows held in registers
 * (kernels/stat.cu): 0 done, -1 error, 1 when the plan is not such rows
 * (the caller then runs em_var_cuda / em_logsumexp_cuda). */
int em_var_rows_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p, double dof);
int em_logsumexp_rows_cuda(const char *op, em_tensor *res, const em_tensor *a, const em_red_plan *p);
/* Softmax / log-softmax of a along dim into res (contiguous, a's shape and dtype). */
int em_softmax_cuda(const char *op, em_tensor *res, em_tensor *a, int dim, bool log_out);
/* Fused backward: gx = y * (g - sum(g * y)) (softmax) or g - exp(y) * sum(g)
 * (log_softmax), sums along dim; gx contiguous with y's shape. */
int em_softmax_backward_cuda(const char *op, em_tensor *gx, em_tensor *g, em_tensor *y, int dim, bool log_out);
/* max/min over one dim, backward: res (contiguous, zeroed, the input's shape)
 * gets g[o] at the position idx[o] names along dim; g and idx have the input's
 * shape with dim set to 1 (keep_shape). */
int em_scatter_dim_cuda(const char *op, em_tensor *res, em_tensor *g, em_tensor *idx, int dim,
                        const int64_t *keep_shape);

/* ---- matmul (kernels/matmul.cu) ---- */
/* Matmul on CUDA through cuBLASLt (kernels/matmul.cu), and the bias
 * gradient of linear. engine/ops/matmul.c plans the product (1-D promotion,
 * batch broadcast, folding a shared right operand into one big gemm,
 * transposed views read in place) and hands each gemm over in row-major
 * BLAS terms, exactly as it calls cblas_?gemm on the CPU. */

/* One strided-batched row-major gemm: for each batch index i < batch,
 *   C_i (n x m) = op(A_i) (n x k) @ op(B_i) (k x m) [+ bias (m) on every row]
 * with op(X) = X when !x_trans (X stored row-major, leading dim ldx) and
 * op(X) = Xᵀ when x_trans (Xᵀ stored row-major, leading dim ldx), A_i at
 * a + i * a_bs elements (a_bs 0: shared by every batch), likewise B; C rows
 * are contiguous with row stride ldc. All operands have dtype `dtype` (f32,
 * f64, bf16, f16); bf16/f16/f32 accumulate in f32 (TF32 only when
 * em_cuda_allow_tf32()), f64 in f64. Launches on the current stream. */
typedef struct {
  const char *op;             /* names errors: "matmul", "linear" */
  em_dtype dtype;
  int device;
  int64_t n, m, k, batch;
  const void *a; bool a_trans; int64_t lda, a_bs;
  const void *b; bool b_trans; int64_t ldb, b_bs;
  void *c; int64_t ldc, c_bs;
  const void *bias;           /* NULL: none (bias is fused as a cuBLASLt epilogue) */
  bool c_f32;                 /* C in f32 while A and B are bf16/f16 (no bias): an
                                 f32 gradient straight from half operands */
  bool accumulate;            /* C += A B (beta = 1; no bias): a gradient added into its sum */
} em_gemm_args;

int em_gemm_cuda(const em_gemm_args *g);

/* grad_bias (out) = sum over rows of g (rows, out); g contiguous, both on
 * one device, g of a float dtype, grad_bias of any float dtype. Sums in f32
 * (f64 for f64) in a fixed order: bit-reproducible. */
int em_linear_bias_grad_cuda(const em_tensor *g, em_tensor *grad_bias);

/* ---- norms (kernels/norm.cu) ---- */
/* RMSNorm and LayerNorm on CUDA (kernels/norm.cu), the device half of
 * engine/ops/norm.c. Tensors are validated by the engine op. */

/* x contiguous (N rows of D), w (D) contiguous or NULL (any float dtype);
 * y contiguous in x's dtype, or bf16/f16 for f32 x with w NULL or f32 (the
 * out_dtype norm); rstd (N) f32 (f64 for f64 x). */
int em_rmsnorm_fwd_cuda(const em_tensor *x, const em_tensor *w, double eps, em_tensor *y, em_tensor *rstd);

/* add_rmsnorm: x contiguous f32/f64 (N rows of D); r contiguous, x's shape,
 * any float dtype that promotes to x's; w (D) contiguous of x's dtype or NULL;
 * s = x + r and y = rmsnorm(s, w) contiguous in x's dtype (y also bf16/f16
 * for f32 x), rstd (N) too. The same values as the add kernel then
 * em_rmsnorm_fwd_cuda. */
int em_add_rmsnorm_fwd_cuda(const em_tensor *x, const em_tensor *r, const em_tensor *w, double eps, em_tensor *s,
                            em_tensor *y, em_tensor *rstd);

/* gy, x contiguous (N, D), gy in x's dtype or bf16/f16 for f32 x with w NULL
 * or f32 (read widened exactly); gx (x's shape and dtype, contiguous) or NULL,
 * written, or added to when gx_accumulate (a residual stream's gradient sum);
 * gw (D, w's dtype) or NULL. gw is reduced deterministically: per-block
 * partial sums, then one fixed-order pass over the blocks. gr (x's shape,
 * bf16/f16, contiguous) or NULL: add_rmsnorm's r gradient, gx's final values
 * rounded once to gr's dtype, written in the same pass (f32 x, w and gy, gx
 * not NULL). */
int em_rmsnorm_bwd_cuda(const em_tensor *x, const em_tensor *w, const em_tensor *rstd, const em_tensor *gy,
                        em_tensor *gx, bool gx_accumulate, em_tensor *gw, em_tensor *gr);

/* layer_norm: x contiguous (N rows of D); w, b (D) contiguous or NULL (any
 * float dtype); y contiguous in x's dtype; mean, rstd (N) f32 (f64 for f64 x). */
int em_layer_norm_fwd_cuda(const em_tensor *x, const em_tensor *w, const em_tensor *b, double eps, em_tensor *y,
                           em_tensor *mean, em_tensor *rstd);
/* gy, x contiguous (N, D); gx (x's shape and dtype), gw (D, w's dtype), gb
 * (D, b's dtype), each NULL when not wanted. gw and gb are reduced
 * deterministically like rmsnorm's gw. */
int em_layer_norm_bwd_cuda(const em_tensor *x, const em_tensor *w, const em_tensor *mean, const em_tensor *rstd,
                           const em_tensor *gy, em_tensor *gx, em_tensor *gw, em_tensor *gb);

/* ---- rope (kernels/rope.cu) ---- */
/* RoPE on CUDA (kernels/rope.cu), the device half of engine/ops/rope.c.
 * Tensors are validated by the engine op. */

/* y = x with each adjacent pair (x[2j], x[2j+1]) rotated by sign · pos · theta^(-2j/d).
 * x (..., d): last-dim stride 1, any strides on the leading dims (a transposed
 * (B, H, T, d) view of (B, T, H, d) is read in place); pos: i32 or i64, any
 * strides, broadcast to x's leading dims; y: x's shape and dtype, last dim contiguous,
 * any strides on the leading dims (the engine gives it x's layout).
 * Forward is sign = +1, backward (the transpose) sign = -1. */
int em_rope_cuda(const em_tensor *x, const em_tensor *pos, double theta, double sign, em_tensor *y);
/* The same for n = 1 or 2 tensors in one launch (q and k): x[i] -> y[i], one
 * dtype and last dim for all, pos broadcast to each x's leading dims. */
int em_rope2_cuda(int n, const em_tensor *const *x, const em_tensor *pos, double theta, double sign,
                  em_tensor *const *y);

/* ---- swiglu (kernels/swiglu.cu) ---- */
/* SwiGLU on CUDA (kernels/swiglu.cu), the device half of engine/ops/swiglu.c.
 * Tensors are validated by the engine op. */

/* y = silu(a) * b; a, b, y contiguous, same shape and dtype. */
int em_swiglu_fwd_cuda(const em_tensor *a, const em_tensor *b, em_tensor *y);

/* ga = g * b * s * (1 + a (1 - s)), gb = g * a * s with s = sigmoid(a);
 * all contiguous, a's shape and dtype; ga or gb may be NULL. */
int em_swiglu_bwd_cuda(const em_tensor *a, const em_tensor *b, const em_tensor *g, em_tensor *ga, em_tensor *gb);

/* ---- embedding (kernels/embedding.cu) ---- */
/* Embedding on CUDA (kernels/embedding.cu), the device half of
 * engine/ops/embedding.c. Tensors are validated by the engine op. */

/* out (n, d) = w[ids[i], :] for n contiguous ids (i32 or i64); w (rows, d)
 * with unit column stride (any row stride); out contiguous, w's dtype. An id
 * outside [0, rows) gives a row of NaN (no host-side check: it would sync). */
int em_embedding_fwd_cuda(const em_tensor *ids, const em_tensor *w, em_tensor *out);

/* gw (rows, d) = sum over i with ids[i] == r of g[i, :], deterministically
 * (bit-identical on every run: no float atomics). g contiguous (n, d) of any
 * float dtype; gw contiguous, any float dtype; ids contiguous i32 or i64;
 * ids outside [0, rows) are skipped. */
int em_embedding_bwd_cuda(const em_tensor *ids, const em_tensor *g, em_tensor *gw);

/* embedding_bag: out (B, d) contiguous = per-bag sums (mean: / max(count, 1))
 * of w's rows, summed in f32 (f64 for f64) in id order: deterministic. Bags:
 * offsets NULL -> ids (B, L) contiguous, row b a bag; else ids 1-D contiguous
 * and offsets (B) contiguous i64 on the device, bag b = [offsets[b],
 * offsets[b+1]) (the last to n), validated by the caller. w float, unit
 * column stride. An id outside [0, rows) makes its bag's row NaN. */
int em_embedding_bag_cuda(const em_tensor *ids, const em_tensor *offsets, const em_tensor *w, int mean,
                          em_tensor *out);
/* Its backward's expansion: gexp (n, d) contiguous, row k = g[bag of k] (mean: / count); g (B, d)
 * contiguous; bags as above (offsets NULL: L ids per bag). */
int em_embedding_bag_expand_cuda(const em_tensor *offsets, int64_t L, const em_tensor *g, int mean,
                                 em_tensor *gexp);

/* ---- cross-entropy (kernels/softmax_xent.cu) ---- */
/* Fused softmax cross-entropy on CUDA (kernels/softmax_xent.cu), the device
 * half of engine/ops/loss.c. Tensors are validated by the engine op. */

/* The options the kernels need (engine/ops/loss.c): targets equal to
 * ignore_index count for nothing; label smoothing eps; reduction an
 * em_reduction (ops.h). */
typedef struct { int64_t ignore_index; double label_smoothing; int reduction; } em_xent_opts;

/* logits: contiguous (N, V) float; targets: contiguous (N) i32 or i64.
 * Writes lse (N; f32, or f64 for f64 logits) = logsumexp of each row and the
 * row losses l_i = (1 - eps)(lse_i - x_i[t_i]) + eps (lse_i - mean_j x_ij)
 * (0 for an ignored row) reduced into loss (any float dtype): "none" (loss
 * has N elements), "sum" or "mean" (0-d; mean over the M rows not ignored,
 * NaN when M = 0, and count, a 0-d f32, receives M for the backward). All on
 * the device. A target outside [0, V) other than ignore_index makes its row,
 * and so the loss, NaN (a host-side check would synchronise). */
int em_xent_fwd_cuda(const em_tensor *logits, const em_tensor *targets, const em_xent_opts *o, em_tensor *lse,
                     em_tensor *loss, em_tensor *count);

/* dlogits (N, V, logits' dtype, contiguous) = w_i (exp(logits - lse) - eps / V - (1 - eps) onehot(t_i)),
 * w_i = g[i] ("none": g has N elements), g[0] ("sum") or g[0] / count[0]
 * ("mean"), 0 for an ignored row; g and count are read on the device. */
int em_xent_bwd_cuda(const em_tensor *logits, const em_tensor *targets, const em_xent_opts *o, const em_tensor *lse,
                     const em_tensor *g, const em_tensor *count, em_tensor *dlogits);

/* ---- fused losses: BCE with logits (kernels/loss_bce.cu), NLL (kernels/loss_nll.cu) ---- */
/* The device halves of engine/ops/loss_bce.c and engine/ops/loss_nll.c;
 * tensors validated and laid out by the engine op. */

/* How binary_cross_entropy_with_logits reads weight / pos_weight at flat
 * element i of the loss: absent (1), [i], [i % C] (a row along the last dim)
 * or [0]. */
enum { EM_BCE_NONE, EM_BCE_FULL, EM_BCE_ROW, EM_BCE_SCALAR };
typedef struct {
  int64_t n, C;              /* the loss's elements; its last dim (1 for 0-d) */
  int w_mode, pw_mode;       /* EM_BCE_* */
  int reduction;             /* em_reduction */
} em_bce_args;

/* x, y (n elements) and w, pw (NULL, or laid out as their modes say) are
 * contiguous, of one float dtype, the loss's. out: n elements ("none") or
 * 0-d (the sum, or the mean: NaN for n = 0), reduced on the device in a
 * fixed order (deterministic) in double. Math in f32 (f64 for f64). */
int em_bce_fwd_cuda(const em_tensor *x, const em_tensor *y, const em_tensor *w, const em_tensor *pw,
                    const em_bce_args *a, em_tensor *out);
/* Gradients of the n loss elements (each NULL when not wanted; contiguous,
 * n elements, the loss's dtype): upstream gradient g[i] ("none") or g[0]
 * times scale (1, or 1/n for a mean), read on the device. */
int em_bce_bwd_cuda(const em_tensor *x, const em_tensor *y, const em_tensor *w, const em_tensor *pw,
                    const em_bce_args *a, const em_tensor *g, double scale, em_tensor *gx, em_tensor *gy,
                    em_tensor *gw, em_tensor *gpw);

/* mse_loss / l1_loss (kernels/loss_diff.cu, the device half of
 * engine/ops/loss_diff.c): x, y contiguous, n elements each, of one float
 * dtype, the loss's. out: n elements ("none": (x - y)^2 or |x - y|) or 0-d
 * (the sum, or the mean: NaN for n = 0), summed on the device in a fixed
 * order (deterministic) in double. Math in f32 (f64 for f64). */
enum { EM_LOSS_MSE, EM_LOSS_L1 };
int em_loss_diff_fwd_cuda(int kind, int reduction, const em_tensor *x, const em_tensor *y, em_tensor *out);
/* dx = f(x - y) g_i scale and dy = -dx in one pass (either NULL when not
 * wanted; contiguous, n elements, the loss's dtype), f = 2 d or sign(d);
 * upstream g[i] ("none") or g[0], read on the device. */
int em_loss_diff_bwd_cuda(int kind, int reduction, const em_tensor *x, const em_tensor *y, const em_tensor *g,
                          double scale, em_tensor *gx, em_tensor *gy);

/* nll_loss over N rows of log-probabilities with the class dim last: row r
 * (row-major over shape[0..nd)) starts at sum_d r_d * stride[d] elements
 * from logp's data pointer, class c at c * cstride more (any strides, so a
 * permuted (N, C, d...) view is read in place). */
typedef struct {
  int nd;
  int64_t shape[EM_MAX_DIMS], stride[EM_MAX_DIMS];
  int64_t cstride, C, N;
  int64_t ignore_index;
  int reduction;             /* em_reduction */
} em_nll_args;

/* Row r's loss -w[t_r] logp[r, t_r] (weight: NULL or contiguous (C), f32
 * or f64; target: contiguous (N) i32 or i64; 0 for an ignored row; NaN for
 * a target outside [0, C) that is not ignore_index -- checking would read
 * the device). out: N elements ("none") or 0-d, any float dtype; stats
 * (2, f64, "mean"/"sum" only, else NULL) = {sum of the row losses, sum of
 * the counted rows' weights}; the mean is their quotient. Per-row math in
 * double; the sums in a fixed order. */
int em_nll_fwd_cuda(const em_tensor *logp, const em_tensor *target, const em_tensor *weight,
                    const em_nll_args *a, em_tensor *out, em_tensor *stats);
/* gx ((N, C) contiguous, zeros but -w[t_r] gr at [r, t_r]; any float dtype)
 * and gw (NULL, or (C) zeroed f32/f64: += per counted row gr (-logp[r, t_r])
 * for sum/none, gr (-logp[r, t_r] - L) for a mean L, atomically), with gr =
 * g[r] ("none"), g[0] ("sum") or g[0] / stats[1] ("mean"). */
int em_nll_bwd_cuda(const em_tensor *logp, const em_tensor *target, const em_tensor *weight,
                    const em_nll_args *a, const em_tensor *g, const em_tensor *stats, em_tensor *gx,
                    em_tensor *gw);

/* ---- flash attention (kernels/flash_fwd.cu, flash_bwd.cu, flash_decode.cu) ---- */
/* FlashAttention-2 on CUDA, the device half of engine/ops/flash_attention.c.
 * Tensors are validated by the engine op: q (B, H, Tq, D), k and v (B, Hkv,
 * Tk, D) with H a multiple of Hkv (grouped-query attention), any strides over
 * B, H and T (multiples of 8 elements, 16-byte aligned data) with the last dim
 * contiguous; bf16 or f16; D one of em_flash_supported_dim(). lse and delta
 * are contiguous f32 (B, H, Tq). causal is an em_causal (0 none, 1 top-left,
 * 2 bottom-right; bottom-right has Tq <= Tk). */

/* true for the head dims the kernels are built for (16, 32, 64, 80, 96, 128, 256). */
bool em_flash_supported_dim(int64_t d);

/* o = softmax(q kᵀ · scale [+ causal mask]) v, lse = the rows' log-sum-exp
 * (natural log, of the scaled scores). o has q's shape and dtype. Up to 16
 * queries take the split-key decode kernels (flash_decode.cu), more the
 * FlashAttention-2 kernel (flash_fwd.cu); both write the same o and lse. */
int em_flash_fwd_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, em_tensor *o, em_tensor *lse,
                      int causal, float scale);

/* The decode kernels with the key count on the device (em_flash_decode,
 * ops.h): q (B, H, Tq <= 16, D), k and v caches (B, Hkv, max_len, D),
 * n_keys i64 (1) or (B); query i sees keys < n − Tq + 1 + i of the first
 * n = clamp(n_keys[b], 0, max_len). Rows that see no key get o = 0 and
 * lse = −inf. No host read of n_keys: capturable with the count changing
 * between replays. */
int em_flash_decode_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *n_keys,
                         em_tensor *o, em_tensor *lse, float scale);

/* Which forward kernel em_flash_fwd_cuda runs for Tq > 16 (and what it
 * forces): 0 auto (the wg2 kernel, flash_fwd_wg2.cu, on sm_90 at D 128 and
 * its wg3 form at D 64; the mma.sync kernel otherwise; the decode kernel up to 16 queries),
 * 1 mma (the mma.sync kernel for every Tq), 2 wg (the wgmma kernel,
 * flash_fwd_wg.cu, for every Tq; an error where it does not apply), 3 wg2
 * (the same with the softmax overlapped with the matmuls, flash_fwd_wg2.cu),
 * 4 wg3 (wg2 with three consumer warpgroups, 192-query blocks, at D 64). The
 * default comes from EMBER_FLASH_FWD=auto|mma|wg|wg2|wg3. mode >= 0 sets it; returns the previous
 * setting, or -1 with the error set (a bad EMBER_FLASH_FWD). */
int em_flash_fwd_kernel(int mode);
/* Which backward kernels em_flash_bwd_cuda runs (em_flash_bwd_choice, ops.h):
 * 0 auto (wg2 on sm_90 at D 64/128 in bf16/f16, else mma), 1 mma, 2 wg
 * (flash_bwd_wg.cu), 3 wg2 (flash_bwd_wg2.cu), 4 fused and 5 fused_nd
 * (flash_bwd_fused.cu, opt-in: one kernel, dq through f32 atomics, in a
 * fixed order or not); from EMBER_FLASH_BWD=auto|mma|wg|wg2|fused|fused_nd.
 * mode >= 0 sets it; returns the previous setting, or -1 with the error set. */
int em_flash_bwd_kernel(int mode);

/* dq (q's shape), dk and dv (k's shape: summed over each kv head's group)
 * from do, the saved o and lse; delta is (B, H, Tq) f32 scratch.
 * Deterministic, except EMBER_FLASH_BWD=fused_nd (dq's f32 atomics in arrival order). */
int em_flash_bwd_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *o,
                      const em_tensor *lse, const em_tensor *dout, em_tensor *delta, em_tensor *dq, em_tensor *dk,
                      em_tensor *dv, int causal, float scale);
/* em_flash_bwd_cuda for F.flash_attention's rope option: q and k are the
 * rotated ones the forward ran on, and dq, dk leave rotated back by
 * −pos·theta^(−2j/d) (the rope kernel's backward, the same bits) where the
 * kernels that run can do it in their epilogues (the wg2 kernels on the
 * short-sequence schedule, EMBER_FLASH_STEP9). pos: i32/i64 positions
 * broadcasting to q's (B, H, T) and k's (B, Hkv, T). Returns 1 when dq and
 * dk were rotated, 0 when not (the caller rotates them), -1 with the error set. */
int em_flash_bwd_rope_cuda(const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *o,
                           const em_tensor *lse, const em_tensor *dout, em_tensor *delta, em_tensor *dq,
                           em_tensor *dk, em_tensor *dv, int causal, float scale, const em_tensor *pos, double theta);

/* ---- optimizers (kernels/adamw.cu) ---- */
/* Optimizer steps and gradient-norm helpers on CUDA (kernels/adamw.cu), the
 * device half of engine/ops/optim.c. All are multi-tensor: one launch covers
 * up to a few hundred tensors (their pointers and sizes ride in the kernel's
 * arguments, PyTorch's multi_tensor_apply), so a whole model's step is one or
 * two launches and replays from a CUDA graph unchanged. Lists are validated
 * by the engine (same device, shapes, dtypes; contiguous tensors). */

/* PyTorch AdamW in place, bit for bit the CPU's per-element arithmetic.
 * steps == NULL: the step count is `step` (host) and lr is `lr`.
 * steps != NULL (capturable): steps[i] is a 0-d f32/i64 device tensor holding
 * the steps taken so far; it is incremented on the device first and the new
 * value used; lr_t (0-d f32/f64 on the device) overrides lr when not NULL.
 * shadows: NULL, or n entries each NULL or a contiguous bf16/f16 tensor of
 * p[i]'s shape that receives the updated p[i] rounded (the cast's bits). */
int em_adamw_cuda(int n, em_tensor **p, em_tensor **g, em_tensor **m, em_tensor **v, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t step, em_tensor **steps,
                  const em_tensor *lr_t, em_tensor **shadows);

/* PyTorch SGD (momentum, weight decay; no dampening/Nesterov). bufs NULL when momentum == 0. */
int em_sgd_cuda(int n, em_tensor **p, em_tensor **g, em_tensor **bufs, double lr, double momentum,
                double weight_decay, bool first_step);

/* out (0-d f32 on the device) = sum of squares of every element of every tensor,
 * accumulated in f64 with a fixed order (deterministic). */
int em_sum_of_squares_cuda(int n, em_tensor **ts, em_tensor *out);

/* With total = sqrt(sumsq[0]) read on the device: when total > max_norm,
 * every grad *= max_norm / (total + 1e-6); norm_out (0-d f32) = total. */
int em_clip_grads_cuda(int n, em_tensor **grads, const em_tensor *sumsq, double max_norm, em_tensor *norm_out);

/* ======== issue 12: random ops and dropout (engine/ops/{random,dropout}.c) ======== */

/* ---- dropout (kernels/dropout.cu) ----
 * y = x * m_j / (1 - p) with m_j = u(w_j) < 1 - p on the stream st (word j % 4
 * of block j / 4, as rng.h); x, y contiguous, one shape and float dtype
 * (f32/bf16/f16 multiply in f32). Backward is the same call on the gradient
 * with the forward's st. */
int em_dropout_cuda(const em_tensor *x, em_tensor *y, double p, em_philox_state st);

/* ---- random sampling (kernels/random.cu) ---- */
/* out (contiguous, any dtype) = 1 where u(w_j) < p_j else 0; p a contiguous
 * float tensor (any float dtype, compared in double) of out's numel, or NULL
 * for the constant pc. */
int em_bernoulli_cuda(em_tensor *out, const em_tensor *p, double pc, em_philox_state st);
/* out (contiguous (n), i64) = 0..n-1 sorted by (64-bit key, index), element
 * i's key em_rng_u64 of block i / 2 (one radix sort). */
int em_randperm_cuda(em_tensor *out, em_philox_state st);
/* out (N, k) i64 contiguous: per row of probs (N, C) contiguous float, the
 * argmax of race keys p_j / E (engine/ops/random.c); with replacement a new
 * race per sample (element (r k + s) C + j), without the k largest keys of
 * one race (element r C + j), ties to the lower index. */
int em_multinomial_cuda(const em_tensor *probs, em_tensor *out, bool replacement, em_philox_state st);
/* ======== end issue 12 ======== */
/* ==== indexing (kernels/indexing.cu) — ops-indexing block begin ==== */
/* Gathers and scatters along one dim, masked_select and nonzero on CUDA
 * (kernels/indexing.cu), the device half of engine/ops/indexing.c. Tensors
 * are validated by the engine op. */

/* What an em_index_plan does at each position p it walks. */
enum { EM_IX_GATHER, EM_IX_SCATTER, EM_IX_SCATTER_VALUE, EM_IX_SCATTER_ADD };

/* One walk over the positions p of `shape` (ndim dims, 0 <= ndim <= 8). With
 *   s = self  at sum_d p[d] * self_stride[d] + index[p] * dim_stride
 *   o = other at sum_d p[d] * other_stride[d]
 *   i = index at sum_d p[d] * index_stride[d]       (0 strides broadcast)
 * GATHER: o = s; SCATTER: s = o; SCATTER_VALUE: s = value (converted to
 * self's dtype); SCATTER_ADD: s += alpha * o. index_select is a GATHER whose
 * index strides are 0 but along dim, index_add a SCATTER_ADD likewise, gather
 * and scatter walk the index's own shape. Strides are in elements from each
 * tensor's data pointer (offset included). wrap: an index in [-dim_size, 0)
 * counts from the end (t:index's rule; index_select's own plans leave it 0,
 * so a negative index there stays out of range). */
typedef struct {
  int kind, ndim, dim, wrap;
  int64_t shape[EM_MAX_DIMS];
  int64_t self_stride[EM_MAX_DIMS];    /* self's strides, 0 at dim */
  int64_t index_stride[EM_MAX_DIMS];
  int64_t other_stride[EM_MAX_DIMS];
  int64_t dim_stride, dim_size;        /* self's stride and size along dim */
  double value, alpha;
} em_index_plan;

/* Run plan p. self and other (NULL for SCATTER_VALUE) share one dtype;
 * index is i32 or i64. No host check of the indices (it would synchronise):
 * an index outside [0, dim_size) is never followed — a GATHER writes NaN
 * there (0 for integer dtypes), a scatter skips the element. Duplicate
 * indices: SCATTER's writes race (one wins, unspecified which; along the last dim
 * of rows that fit in shared memory the last in index order wins, as on the CPU:
 * kernels/scatter_smem.cu); SCATTER_ADD
 * adds with atomics (f32, f64, bf16, f16, i32, i64), so float sums may differ
 * in the last bits from run to run. */
int em_index_cuda(const char *op, const em_index_plan *p, em_tensor *self, const em_tensor *index,
                  em_tensor *other);

/* The out-of-place form, where one kernel can do the copy too: self (fresh, contiguous) = from (contiguous, of
 * self's shape and dtype) with plan p applied, `from` read where em_index_cuda would first need a copy of it
 * (a scatter along the last dim, a 2-D scatter_add along dim 0, whose walk covers every row / column of self:
 * kernels/scatter_smem.cu). Returns 1 when done, 0 when p is not such a shape (nothing launched: the caller
 * copies and runs em_index_cuda), -1 on error. */
int em_index_from_cuda(const char *op, const em_index_plan *p, em_tensor *self, const em_tensor *from,
                       const em_tensor *index, const em_tensor *other);

/* pos (n, i64, contiguous) = inclusive prefix count of the nonzero elements
 * of x (contiguous, n elements, any dtype; NaN counts, -0.0 does not), one
 * CUB device scan; pos[n-1] is the count. Element i is selected when
 * pos[i] > pos[i-1] (pos[-1] = 0), and lands at pos[i] - 1. */
int em_nonzero_scan_cuda(const char *op, const em_tensor *x, em_tensor *pos);
/* out[pos[i] - 1] = x[i] for each selected i (x contiguous, n = pos's length; out contiguous). */
int em_masked_select_cuda(const char *op, const em_tensor *x, const em_tensor *pos, em_tensor *out);
/* masked_select's backward: gx[i] = selected ? g[pos[i] - 1] : 0 (gx contiguous, n elements, g's dtype). */
int em_masked_scatter_cuda(const char *op, const em_tensor *g, const em_tensor *pos, em_tensor *gx);
/* nonzero: row pos[i] - 1 of out (count, ndim; i64 contiguous) = the coordinates of
 * selected flat index i in shape (row-major). */
int em_nonzero_cuda(const char *op, const em_tensor *pos, int ndim, const int64_t *shape, em_tensor *out);
/* nonzero in two reads of x instead of a scan: count (0-d i64) = the number
 * of nonzero elements of x (contiguous, any dtype; NaN counts, -0.0 does
 * not), one CUB reduction; then, with that count read by the engine, out
 * (count, ndim; i64 contiguous) = their coordinates in shape, row-major order
 * (cub::DeviceSelect over the flat indices, then one expansion for ndim > 1). */
int em_count_nonzero_cuda(const char *op, const em_tensor *x, em_tensor *count);
int em_nonzero_select_cuda(const char *op, const em_tensor *x, int ndim, const int64_t *shape, em_tensor *out);
/* ==== ops-indexing block end ==== */
/* ---- stream compaction (kernels/compact.cu; also the em_nonzero_scan /
 * em_masked_* / em_nonzero / em_count_nonzero / em_nonzero_select path
 * above, kept for EMBER_COMPACT=scan) ---- */
/* Bytes of the workspace (u8) a compaction of n elements needs. */
int64_t em_compact_ws_bytes(int64_t n);
/* Step 1: mark the nonzero elements of x (contiguous, n elements, any dtype;
 * NaN counts, -0.0 does not) in ws (em_compact_ws_bytes(n) bytes): one bit
 * per element and each 4096-element tile's offset; count (0-d i64) = the
 * number marked, on the device. host_count: NULL, or where the number is put
 * when it could be read without a copy (a mapped host slot the mark stores
 * into, EMBER_COMPACT_MAPPED; the call waits for it); -1 there means the
 * engine reads count itself. */
int em_compact_mark_cuda(const char *op, const em_tensor *x, em_tensor *ws, em_tensor *count, int64_t *host_count);
/* Step 1 for unique: mark the first element of each run of equal neighbours
 * in sorted (contiguous; floats compared as doubles, NaN equal to nothing). */
int em_compact_mark_heads_cuda(const char *op, const em_tensor *sorted, em_tensor *ws, em_tensor *count);
/* Step 2, with a marked ws of numel(x) elements: out (count, contiguous,
 * x's dtype) = the marked elements of x (contiguous) in order. */
int em_compact_select_cuda(const char *op, const em_tensor *ws, const em_tensor *x, em_tensor *out);
/* masked_select in one pass (EMBER_COMPACT_ONEPASS=1): out (contiguous, at
 * least numel(x) elements, x's dtype) starts with the elements of x
 * (contiguous) where mask (bool, contiguous, x's numel) is set, in order;
 * count (0-d i64) = how many, on the device. ws: em_compact_select1_ws_bytes(n). */
int64_t em_compact_select1_ws_bytes(int64_t n);
int em_compact_select1_cuda(const char *op, const em_tensor *mask, const em_tensor *x, em_tensor *ws,
                            em_tensor *count, em_tensor *out);
/* masked_select's backward: gx[i] (contiguous, n = numel(gx)) = the next
 * element of g (contiguous, count) where i is marked, else 0. */
int em_compact_expand_cuda(const char *op, const em_tensor *ws, const em_tensor *g, em_tensor *gx);
/* nonzero: out (count, ndim; i64 contiguous) = the coordinates in shape
 * (row-major, n elements) of the marked flat indices, in order. */
int em_compact_coords_cuda(const char *op, const em_tensor *ws, int64_t n, int ndim, const int64_t *shape,
                           em_tensor *out);
/* ---- sorting, selection and scans (kernels/sort.cu, kernels/scan.cu) ---- */
/* The device half of engine/ops/sort.c and engine/ops/scan.c. Tensors are
 * validated by the engine op. */

/* Sort every row of a along dim (any strides, any dtype; the rows are the
 * positions of the other dims) in one stable CUB radix sort over all rows,
 * NaN as the largest, -0 equal to +0; write sorted positions [j0, j0 + cnt)
 * of each row into vals (a's dtype; may be NULL) and idx (i64), contiguous
 * with a's shape but cnt at dim (a dropped dim of size 1 has the same
 * layout). median_nan (float a, ascending): a row whose largest element is
 * NaN gives its first NaN instead of position j0. Temp storage comes from the
 * engine's allocator. At most 2^31 - 1 elements. */
int em_sort_cuda(const char *op, const em_tensor *a, int dim, bool descending, int64_t j0, int64_t cnt,
                 bool median_nan, em_tensor *vals, em_tensor *idx);
/* unique, step 1: sorted (n, contiguous) -> ids (n, i64) = the run of equal
 * neighbours each element belongs to (NaN equals nothing), count (0-d i64) =
 * the number of runs, on the device. */
int em_unique_ids_cuda(const char *op, const em_tensor *sorted, em_tensor *ids, em_tensor *count);
/* unique, step 2 (count read by the engine): vals (count) = each run's first
 * value; inverse (n, may be NULL): inverse[order[i]] = ids[i]; counts
 * (count, i64, may be NULL) = the runs' lengths. */
int em_unique_finish_cuda(const char *op, const em_tensor *sorted, const em_tensor *order, const em_tensor *ids,
                          em_tensor *vals, em_tensor *inverse, em_tensor *counts);
/* out (zeroed; i64, f32 or f64) gets 1 (or weights[i], out's dtype,
 * contiguous; may be NULL) added at x[i] (contiguous integers, checked by the
 * engine to lie in [0, numel(out))). Atomic adds: float sums in any order. */
int em_bincount_cuda(const char *op, const em_tensor *x, const em_tensor *weights, em_tensor *out);
/* bincount without weights in one read of x: scratch (EM_BINCOUNT_BINS + 2
 * i64, contiguous) gets the counts of the values in [0, EM_BINCOUNT_BINS)
 * (as u64 bits) followed by min and max of all of x (contiguous integers,
 * 16-byte aligned). Returns 1, launching nothing, where it does not apply
 * (misaligned x, more than 2^31 - 1 vectors). */
#define EM_BINCOUNT_BINS 12288
int em_bincount_range_cuda(const char *op, const em_tensor *x, em_tensor *scratch);
/* out (i64, values' shape, contiguous) = insertion points of values
 * (contiguous) in the rows of seq (contiguous; 1-D: one row for every value;
 * else one row per leading index of values). right: after equal elements.
 * Compared in f64 (i64 when both are integers), PyTorch's bisection. */
int em_searchsorted_cuda(const char *op, const em_tensor *seq, const em_tensor *values, bool right, em_tensor *out);
/* res = inclusive scan (sum, or product when prod) of a along the middle dim
 * of (outer, L, inner); a and res contiguous, one dtype: f32, f64, i64, or
 * bf16/f16 (accumulated in f32, rounded once on store). reverse: from the
 * end of each row. One device-wide scan for a single row. */
int em_scan_cuda(const char *op, const em_tensor *a, int64_t outer, int64_t L, int64_t inner, bool prod,
                 bool reverse, em_tensor *res);
/* cumprod's backward with zeros handled (engine/ops/scan.c has the formula):
 * x, g, gx contiguous (outer, L, inner), one dtype, f32 or f64. */
int em_cumprod_backward_cuda(const char *op, const em_tensor *x, const em_tensor *g, int64_t outer, int64_t L,
                             int64_t inner, em_tensor *gx);
/* ---- end sorting ---- */
/* ---- shape & math ops (kernels/shape_ops.cu, kernels/math_ops.cu, kernels/reduce.cu; issue 12) ---- */
/* Gather by a per-dim index map, the one kernel behind repeat, tile, flip and
 * roll: out (contiguous, ndim dims of out_size) gets
 *   out[i] = in[sum_d src_d(i_d) * in_stride[d]],
 *   src_d(i) = i (EM_MAP_ID), in_size[d] - 1 - i (EM_MAP_FLIP),
 *              (i + off[d]) mod in_size[d] (EM_MAP_MOD: roll, repeat).
 * in_stride in elements relative to in's offset; in and out share a dtype. */
enum { EM_MAP_ID, EM_MAP_FLIP, EM_MAP_MOD };
typedef struct {
  int ndim;
  int64_t out_size[EM_MAX_DIMS], in_size[EM_MAX_DIMS], in_stride[EM_MAX_DIMS], off[EM_MAX_DIMS];
  int kind[EM_MAX_DIMS];
} em_dimmap;
int em_dimmap_cuda(const char *op, em_tensor *out, const em_tensor *in, const em_dimmap *m);

/* out (bool, contiguous) = isnan(x) (nan true) or isfinite(x) (nan false);
 * x contiguous, any dtype (integers: never NaN, always finite). */
int em_float_class_cuda(const char *op, em_tensor *out, const em_tensor *x, bool nan);

/* Ternary elementwise kernels through em_elementwise_cuda (kind EM_EW_TERNARY,
 * three operands x, y, z, the scalar value in lo):
 *   lerp     x + z (y - x)   (PyTorch's two-sided formula: y - (y - x)(1 - z) for z >= 0.5)
 *   addcmul  x + lo * y * z
 *   addcdiv  x + lo * y / z
 * The kind's number leaves room for other families' kinds. */
enum { EM_EW_TERNARY = 12 };
enum { EM_EW_LERP, EM_EW_ADDCMUL, EM_EW_ADDCDIV };

/* More reductions over em_red_plan (kernels/reduce.cu): res (contiguous) =
 *   prod             product (floats in f32, f64 for f64; integers in wrapping i64)
 *   norm1            sum |x|
 *   norm2            sqrt(sum x^2)
 *   norminf          max |x| (NaN wins)
 *   normp            (sum |x|^p)^(1/p), p = pw
 * Norms take float inputs only. */
enum { EM_RED_PROD, EM_RED_NORM1, EM_RED_NORM2, EM_RED_NORMINF, EM_RED_NORMP };
int em_reduce_math_cuda(const char *op, int kind, em_tensor *res, const em_tensor *a, const em_red_plan *p, double pw);
/* ---- end shape & math ops ---- */

#ifdef __cplusplus
}
#endif

/* Name the op for NVTX, the profiler and memory history until the scope ends. */
#define EM_OP_SCOPE(name)                                                \
  em_op_scope_t em__scope __attribute__((cleanup(em_op_scope_exit)));    \
  em_op_scope_enter(&em__scope, (name))

#endif
