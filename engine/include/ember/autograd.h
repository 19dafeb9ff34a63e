/* Autograd: a dynamic tape, PyTorch style. An op that produces a tensor from
 * inputs that require grad records a node: which inputs (edges to their
 * producers or to leaves), what it saved, and its backward function.
 * em_backward() walks the graph in reverse topological order, sums gradients
 * per node output, accumulates into leaf .grad (in place when .grad exists, so
 * a .grad that is a view into a flat buffer is written through), and fires the
 * leaf's post-accumulate-grad hooks the moment that leaf's gradient is final.
 *
 * Writing an op's backward:
 *   if (em_grad_needed(2, (em_tensor*[]){a, b})) {
 *     em_node *n = em_node_new("mul", mul_backward, 2, 1);
 *     em_node_set_input(n, 0, a); em_node_set_input(n, 1, b);
 *     em_node_save(n, a); em_node_save(n, b);      // saved[0], saved[1]
 *     em_node_finish(n, out);                      // out->grad_fn = n
 *   }
 * and
 *   static int mul_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
 *     if (em_node_needs_input_grad(n, 0)) gin[0] = em_mul(gout[0], n->saved[1]) ...
 *   }
 * Backward runs in no-grad mode. gin[i] must have input i's shape (use
 * em_sum_to for broadcast inputs); the engine casts it to input i's dtype. */
#ifndef EMBER_AUTOGRAD_H
#define EMBER_AUTOGRAD_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EM_NODE_MAX_IN 8
#define EM_NODE_MAX_SAVED 8
#define EM_NODE_MAX_OUT 4

typedef struct em_node em_node;
/* gout: n_out gradients (never NULL: missing ones are zeros). Fill gin[i]
 * with a new reference for each input that needs grad, or leave NULL. */
typedef int (*em_backward_fn)(em_node *n, em_tensor **gout, em_tensor **gin);

typedef struct {
  em_node *fn;        /* producer of the input (strong ref), or NULL */
  int output_nr;
  em_tensor *leaf;    /* the input itself when it is a leaf requiring grad (strong ref) */
} em_edge;

/* A node is one allocation sized to its inputs and outputs: the per-input
 * and per-output arrays below point into the same block, right after the
 * struct (a node of 2 inputs and 1 output is ~700 bytes instead of the 1.4 KB
 * fixed arrays of 8 inputs took, which also kept it out of malloc's fast
 * small-block cache). Index them below n_in / n_out only. */
struct em_node {
  int refcount;
  const char *op;                 /* static string, e.g. "mul" */
  em_backward_fn backward;
  int n_in, n_out;                /* at most EM_NODE_MAX_IN and EM_NODE_MAX_OUT */
  em_edge *next;                  /* [n_in]: next[i] empty when input i needs no grad */
  /* shapes and dtypes of inputs and outputs, for shape checks and sum_to */
  int *in_ndim;                   /* [n_in] */
  int64_t (*in_shape)[EM_MAX_DIMS];   /* [n_in] */
  em_dtype *in_dtype;             /* [n_in] */
  em_device *in_device;           /* [n_in] */
  int *out_ndim;                  /* [n_out] */
  int64_t (*out_shape)[EM_MAX_DIMS];  /* [n_out] */
  em_dtype *out_dtype;            /* [n_out]: output k's gradient dtype: its own, or em_node_set_grad_dtype's */
  em_device *out_device;          /* [n_out] */
  uint8_t grad_dtype_set;         /* bit k: output k's gradient is summed in out_dtype[k], not its dtype */
  /* saved tensors: aliases without history, with the storage version at save time */
  em_tensor *saved[EM_NODE_MAX_SAVED];
  uint32_t saved_version[EM_NODE_MAX_SAVED];
  int n_saved;
  /* op attributes */
  double f[4];
  int64_t i[EM_MAX_DIMS * 2];
  void *ctx;                      /* freed with ctx_free when the node dies */
  void (*ctx_free)(void *ctx);
  uint64_t seq;                   /* creation order: later nodes run first */
  const char *module;             /* interned nn.Module path at creation (profile.h) */
  /* engine-private (engine/autograd.c): scratch valid during one em_backward;
   * a backward function or C user never reads or writes them */
  bool freed;                     /* saved tensors released after a backward without retain_graph */
  int bw_deps;
  uint64_t bw_epoch;
  em_tensor **bw_grad;            /* [n_out] */
};

/* ---- grad mode ---- */
bool em_grad_enabled(void);
bool em_set_grad_enabled(bool on);      /* returns previous */
/* True when grad mode is on and any of the tensors requires grad. */
bool em_grad_needed(int n, em_tensor *const *ts);

/* ---- recording ---- */
/* NULL with the error set when out of memory or n_in/n_out exceed the limits. */
em_node *em_node_new(const char *op, em_backward_fn bw, int n_in, int n_out);
void em_node_set_input(em_node *n, int i, em_tensor *input);
int em_node_save(em_node *n, em_tensor *t);   /* returns slot index */
/* Attach output k (call once per output, k = 0..n_out-1); releases the
 * creator's reference to n after the last output when using em_node_finish. */
void em_node_set_output(em_node *n, int k, em_tensor *out);
void em_node_finish(em_node *n, em_tensor *out);  /* single output: set_output(0) + release */
/* Output k's gradient in dtype dt instead of the output's own (after
 * set_output): consumers record dt as that input's dtype, so their
 * gradients are brought to dt and summed in it, and this node's backward gets
 * gout[k] in dt (or in the output's dtype when it is the root of backward).
 * For a bf16/f16 output made from f32 (em_rmsnorm_out): its gradients summed
 * in f32, as they were when the output was f32 and each consumer cast it.
 * A backward must therefore not assume in_dtype[i] is input i's own dtype. */
void em_node_set_grad_dtype(em_node *n, int k, em_dtype dt);
void em_node_release(em_node *n);
bool em_node_needs_input_grad(const em_node *n, int i);
/* During backward: the gradient already summed for input i when the caller
 * may add into it in place (held by nobody else, contiguous, the input's
 * shape/dtype/device), else NULL. A backward that adds its gradient into the
 * sink returns it as gin[i] (retained); the engine then adds nothing. Lets
 * kernels fuse the sum of a residual or q/k/v branch point (a gemm with
 * beta = 1, an accumulating norm backward) instead of a separate add. For a
 * leaf whose only gradient in this backward this is, the sink is its existing
 * .grad (a DDP bucket view, earlier micro-batches), added into in place. */
em_tensor *em_node_grad_sink(em_node *n, int i);

/* ---- running backward ---- */
/* root: the tensor to differentiate; grad: its gradient (NULL: root must have
 * one element, gradient 1). retain_graph keeps saved tensors for another pass. */
int em_backward(em_tensor *root, em_tensor *grad, bool retain_graph);

/* ---- leaf hooks ---- */
typedef int (*em_hook_fn)(em_tensor *param, void *ud);   /* return 0, or <0 with error set */
typedef struct em_hook {
  int id;
  em_hook_fn fn;
  void *ud;
  void (*ud_free)(void *ud);
  struct em_hook *next;
} em_hook;
/* Returns a hook id (> 0) or <0. */
int em_register_post_accumulate_grad_hook(em_tensor *leaf, em_hook_fn fn, void *ud,
                                          void (*ud_free)(void *));
int em_remove_hook(em_tensor *leaf, int id);   /* 0 removed, 1 not found */

/* ---- helpers for backward formulas ---- */
/* Sum g over broadcast dims so it has the given shape. New reference. */
em_tensor *em_sum_to(em_tensor *g, int ndim, const int64_t *shape);
/* Set t.grad (t must be a leaf or detached); g must match shape/dtype/device, may be a view. */
int em_set_grad(em_tensor *t, em_tensor *g);
int em_set_requires_grad(em_tensor *t, bool on);   /* errors on non-leaf or non-float */

#ifdef __cplusplus
}
#endif
#endif
