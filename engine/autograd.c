/* The autograd engine: recording nodes, running backward, leaf hooks.
 * Scheduling: a node runs once every edge into it has delivered its gradient
 * (dependency counts from one DFS); among ready nodes the most recently
 * created runs first, which is PyTorch's order and makes leaf hooks fire in
 * roughly reverse registration order — what bucketed DDP relies on. */
#include <stdio.h>
#include "internal.h"

static _Thread_local bool grad_mode = true;
static uint64_t node_seq = 0, bw_epoch = 0;

bool em_grad_enabled(void) { return grad_mode; }
bool em_set_grad_enabled(bool on) { bool prev = grad_mode; grad_mode = on; return prev; }

bool em_grad_needed(int n, em_tensor *const *ts) {
  if (!grad_mode) return false;
  for (int i = 0; i < n; i++) if (ts[i] && ts[i]->requires_grad) return true;
  return false;
}

/* ---------------- nodes ---------------- */

/* The node and its per-input / per-output arrays in one zeroed block: the
 * struct, then the arrays in decreasing alignment (8-byte members first). */
typedef struct {
  size_t next, in_shape, out_shape, bw_grad, in_device, out_device, in_ndim, in_dtype, out_ndim, out_dtype, total;
} node_layout;

static node_layout layout_of(int n_in, int n_out) {
  node_layout l;
  size_t at = sizeof(em_node), ni = (size_t)n_in, no = (size_t)n_out;
#define EM_PLACE(field, bytes) (l.field = at, at += (bytes))
  EM_PLACE(next, ni * sizeof(em_edge));
  EM_PLACE(in_shape, ni * sizeof(int64_t[EM_MAX_DIMS]));
  EM_PLACE(out_shape, no * sizeof(int64_t[EM_MAX_DIMS]));
  EM_PLACE(bw_grad, no * sizeof(em_tensor *));
  EM_PLACE(in_device, ni * sizeof(em_device));
  EM_PLACE(out_device, no * sizeof(em_device));
  EM_PLACE(in_ndim, ni * sizeof(int));
  EM_PLACE(in_dtype, ni * sizeof(em_dtype));
  EM_PLACE(out_ndim, no * sizeof(int));
  EM_PLACE(out_dtype, no * sizeof(em_dtype));
#undef EM_PLACE
  l.total = at;
  return l;
}

em_node *em_node_new(const char *op, em_backward_fn bw, int n_in, int n_out) {
  if (n_in < 0 || n_in > EM_NODE_MAX_IN || n_out < 1 || n_out > EM_NODE_MAX_OUT) {
    em_error("autograd: '%s' asked for a node of %d inputs and %d outputs (at most %d and %d)", op, n_in, n_out,
             EM_NODE_MAX_IN, EM_NODE_MAX_OUT);
    return NULL;
  }
  node_layout l = layout_of(n_in, n_out);
  char *block = em_header_alloc(l.total);   /* zeroed; the small bins' magazines, not calloc's locks */
  if (!block) { em_error_oom("out of memory: cannot allocate an autograd node"); return NULL; }
  em_node *n = (em_node *)block;
  n->next = (em_edge *)(block + l.next);
  n->in_shape = (int64_t(*)[EM_MAX_DIMS])(block + l.in_shape);
  n->out_shape = (int64_t(*)[EM_MAX_DIMS])(block + l.out_shape);
  n->bw_grad = (em_tensor **)(block + l.bw_grad);
  n->in_device = (em_device *)(block + l.in_device);
  n->out_device = (em_device *)(block + l.out_device);
  n->in_ndim = (int *)(block + l.in_ndim);
  n->in_dtype = (em_dtype *)(block + l.in_dtype);
  n->out_ndim = (int *)(block + l.out_ndim);
  n->out_dtype = (em_dtype *)(block + l.out_dtype);
  n->refcount = 1; n->op = op; n->backward = bw; n->n_in = n_in; n->n_out = n_out;
  n->seq = ++node_seq;
  n->module = em_ctx_module();
  return n;
}

void em_node_set_input(em_node *n, int i, em_tensor *t) {
  if (!n || !t || i < 0 || i >= n->n_in) return;
  n->in_ndim[i] = t->ndim;
  memcpy(n->in_shape[i], t->shape, sizeof(int64_t) * (size_t)t->ndim);
  n->in_dtype[i] = t->dtype;
  if (t->grad_fn && (t->grad_fn->grad_dtype_set >> t->output_nr & 1))   /* its gradient's dtype */
    n->in_dtype[i] = t->grad_fn->out_dtype[t->output_nr];
  n->in_device[i] = t->device;
  if (!t->requires_grad) return;
  if (t->grad_fn) {
    n->next[i].fn = t->grad_fn; t->grad_fn->refcount++;
    n->next[i].output_nr = t->output_nr;
  } else {
    n->next[i].leaf = em_tensor_retain(t);
  }
}

int em_node_save(em_node *n, em_tensor *t) {
  if (!n) return -1;
  int k = n->n_saved++;
  n->saved[k] = em_alias(t);
  n->saved_version[k] = t->storage->version;
  return k;
}

void em_node_set_output(em_node *n, int k, em_tensor *out) {
  if (!n || !out || k < 0 || k >= n->n_out) return;
  n->out_ndim[k] = out->ndim;
  memcpy(n->out_shape[k], out->shape, sizeof(int64_t) * (size_t)out->ndim);
  n->out_dtype[k] = out->dtype;
  n->out_device[k] = out->device;
  if (out->grad_fn) em_node_release(out->grad_fn);
  out->grad_fn = n; n->refcount++;
  out->output_nr = k;
  out->requires_grad = true;
}

void em_node_set_grad_dtype(em_node *n, int k, em_dtype dt) {
  if (!n || k < 0 || k >= n->n_out) return;
  n->out_dtype[k] = dt;
  n->grad_dtype_set |= (uint8_t)(1u << k);
}

void em_node_finish(em_node *n, em_tensor *out) {
  em_node_set_output(n, 0, out);
  em_node_release(n);
}

bool em_node_needs_input_grad(const em_node *n, int i) {
  return n->next[i].fn != NULL || n->next[i].leaf != NULL;
}

static void free_saved(em_node *n) {
  for (int k = 0; k < n->n_saved; k++) { em_tensor_release(n->saved[k]); n->saved[k] = NULL; }
}

/* Iterative: a long chain of nodes must not recurse once per node. */
void em_node_release(em_node *n) {
  em_node *stack[256]; int sp = 0;
  em_node **heap = NULL; int hsp = 0, hcap = 0;
  if (!n || --n->refcount > 0) return;
  stack[sp++] = n;
  while (sp > 0 || hsp > 0) {
    em_node *x = hsp > 0 ? heap[--hsp] : stack[--sp];
    for (int i = 0; i < x->n_in; i++) {
      em_tensor_release(x->next[i].leaf);
      em_node *c = x->next[i].fn;
      if (c && --c->refcount == 0) {
        if (sp < 256) stack[sp++] = c;
        else {
          if (hsp == hcap) { hcap = hcap ? hcap * 2 : 256; heap = realloc(heap, sizeof *heap * (size_t)hcap); }
          heap[hsp++] = c;
        }
      }
    }
    free_saved(x);
    for (int k = 0; k < x->n_out; k++) em_tensor_release(x->bw_grad[k]);
    if (x->ctx_free) x->ctx_free(x->ctx);
    em_header_free(x, layout_of(x->n_in, x->n_out).total);
  }
  free(heap);
}

/* ---------------- helpers ---------------- */

em_tensor *em_sum_to(em_tensor *g, int ndim, const int64_t *shape) {
  if (g->ndim == ndim && memcmp(g->shape, shape, sizeof(int64_t) * (size_t)ndim) == 0)
    return em_tensor_retain(g);
  int64_t dims[EM_MAX_DIMS]; int nd = 0, lead = g->ndim - ndim;
  if (lead < 0) { em_error("sum_to: cannot reduce %d dims to %d", g->ndim, ndim); return NULL; }
  for (int i = 0; i < g->ndim; i++)
    if (i < lead || (shape[i - lead] == 1 && g->shape[i] != 1)) dims[nd++] = i;
  em_tensor *s = nd ? em_sum(g, nd, dims, true) : em_tensor_retain(g);
  if (!s) return NULL;
  em_tensor *r = em_reshape(s, ndim, shape);
  em_tensor_release(s);
  return r;
}

int em_set_grad(em_tensor *t, em_tensor *g) {
  if (g) {
    char a[160], b[160], d1[32], d2[32];
    if (!em_same_shape(t, g))
      return em_error("grad: expected a gradient of shape %s, got %s", em_shape_str(t->ndim, t->shape, a, 160),
                      em_shape_str(g->ndim, g->shape, b, 160));
    if (t->dtype != g->dtype)
      return em_error("grad: expected a gradient of dtype %s, got %s", em_dtype_name(t->dtype), em_dtype_name(g->dtype));
    if (!em_device_eq(t->device, g->device))
      return em_error("grad: expected a gradient on %s, got %s", em_device_str(t->device, d1, 32),
                      em_device_str(g->device, d2, 32));
  }
  em_tensor_retain(g);
  em_tensor_release(t->grad);
  t->grad = g;
  if (g && em_mem_history_on()) em_mem_tag(g->storage, EM_MEM_GRADIENT);   /* e.g. a view into a DDP bucket */
  return 0;
}

int em_set_requires_grad(em_tensor *t, bool on) {
  if (t->grad_fn)
    return em_error("requires_grad: can only be changed on leaf tensors (use detach() for a non-leaf)");
  if (on && !em_dtype_is_float(t->dtype))
    return em_error("requires_grad: only floating-point tensors can require grad, got %s", em_dtype_name(t->dtype));
  t->requires_grad = on;
  return 0;
}

/* ---------------- hooks ---------------- */

int em_register_post_accumulate_grad_hook(em_tensor *leaf, em_hook_fn fn, void *ud, void (*ud_free)(void *)) {
  static int next_id = 0;
  if (leaf->grad_fn || !leaf->requires_grad)
    return em_error("register_post_accumulate_grad_hook: expected a leaf tensor that requires grad");
  em_hook *h = calloc(1, sizeof *h);
  if (!h) return em_error_oom("out of memory: cannot allocate a hook");
  h->id = ++next_id; h->fn = fn; h->ud = ud; h->ud_free = ud_free;
  em_hook **p = &leaf->hooks;          /* append: hooks fire in registration order */
  while (*p) p = &(*p)->next;
  *p = h;
  return h->id;
}

int em_remove_hook(em_tensor *leaf, int id) {
  for (em_hook **p = &leaf->hooks; *p; p = &(*p)->next) {
    if ((*p)->id == id) {
      em_hook *h = *p; *p = h->next;
      if (h->ud_free) h->ud_free(h->ud);
      free(h);
      return 0;
    }
  }
  return 1;
}

/* ---------------- backward ---------------- */

typedef struct {
  em_node **nodes; int n_nodes, cap_nodes;       /* every node reached (for cleanup) */
  em_tensor **leaves; int n_leaves, cap_leaves;  /* every leaf reached */
  em_node **ready; int n_ready, cap_ready;       /* max-heap on seq */
  uint64_t epoch;
} bw_state;

static int push(void ***arr, int *n, int *cap, void *x) {
  if (*n == *cap) {
    int c = *cap ? *cap * 2 : 64;
    void **a = realloc(*arr, sizeof(void *) * (size_t)c);
    if (!a) return em_error_oom("out of memory: backward bookkeeping");
    *arr = a; *cap = c;
  }
  (*arr)[(*n)++] = x;
  return 0;
}

static int heap_push(bw_state *s, em_node *x) {
  if (push((void ***)&s->ready, &s->n_ready, &s->cap_ready, x)) return -1;
  int i = s->n_ready - 1;
  while (i > 0) {
    int p = (i - 1) / 2;
    if (s->ready[p]->seq >= s->ready[i]->seq) break;
    em_node *t = s->ready[p]; s->ready[p] = s->ready[i]; s->ready[i] = t; i = p;
  }
  return 0;
}

static em_node *heap_pop(bw_state *s) {
  em_node *top = s->ready[0];
  s->ready[0] = s->ready[--s->n_ready];
  int i = 0;
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < s->n_ready && s->ready[l]->seq > s->ready[m]->seq) m = l;
    if (r < s->n_ready && s->ready[r]->seq > s->ready[m]->seq) m = r;
    if (m == i) break;
    em_node *t = s->ready[m]; s->ready[m] = s->ready[i]; s->ready[i] = t; i = m;
  }
  return top;
}

/* DFS from root counting edges into each node and leaf. */
static int discover(bw_state *s, em_node *root) {
  em_node **stack = NULL; int sp = 0, cap = 0;
  root->bw_epoch = s->epoch; root->bw_deps = 0;
  if (push((void ***)&s->nodes, &s->n_nodes, &s->cap_nodes, root)) return -1;
  if (push((void ***)&stack, &sp, &cap, root)) return -1;
  while (sp > 0) {
    em_node *x = stack[--sp];
    for (int i = 0; i < x->n_in; i++) {
      em_node *c = x->next[i].fn;
      em_tensor *l = x->next[i].leaf;
      if (c) {
        if (c->bw_epoch != s->epoch) {
          c->bw_epoch = s->epoch; c->bw_deps = 0;
          for (int k = 0; k < c->n_out; k++) { em_tensor_release(c->bw_grad[k]); c->bw_grad[k] = NULL; }
          if (push((void ***)&s->nodes, &s->n_nodes, &s->cap_nodes, c) ||
              push((void ***)&stack, &sp, &cap, c)) { free(stack); return -1; }
        }
        c->bw_deps++;
      } else if (l) {
        if (l->bw_epoch != s->epoch) {
          l->bw_epoch = s->epoch; l->bw_deps = 0; l->bw_grad = NULL;
          if (push((void ***)&s->leaves, &s->n_leaves, &s->cap_leaves, l)) { free(stack); return -1; }
        }
        l->bw_deps++;
      }
    }
  }
  free(stack);
  return 0;
}

/* The buffer input i's gradient is being summed in, when a backward may add
 * into it directly (gemm beta = 1, an accumulating kernel) instead of handing
 * back a new tensor to add: the sum so far when this node holds it alone, or a
 * leaf's own .grad when this is the leaf's only gradient in this backward
 * (a DDP bucket view, or the sum of earlier micro-batches: no separate add
 * kernel and no second buffer). The backward then returns the sink itself
 * as gin[i]. NULL: produce a new tensor. */
em_tensor *em_node_grad_sink(em_node *n, int i) {
  if (i < 0 || i >= n->n_in) return NULL;
  em_edge *e = &n->next[i];
  if (!e->fn && !e->leaf) return NULL;
  em_tensor *a = e->fn ? e->fn->bw_grad[e->output_nr] : e->leaf->bw_grad;
  if (!a && e->leaf && e->leaf->grad && e->leaf->bw_deps == 1) {
    em_tensor *gr = e->leaf->grad;
    if (!em_is_contiguous(gr) || gr->dtype != n->in_dtype[i] || !em_device_eq(gr->device, n->in_device[i]) ||
        gr->ndim != n->in_ndim[i] || memcmp(gr->shape, n->in_shape[i], sizeof(int64_t) * (size_t)gr->ndim) != 0)
      return NULL;
    e->leaf->bw_grad = em_tensor_retain(gr);      /* finish_leaf sees it is .grad: nothing left to add */
    return gr;
  }
  if (!a || a->refcount != 1 || a->storage->refcount != 1 || !em_is_contiguous(a) ||
      a->dtype != n->in_dtype[i] || !em_device_eq(a->device, n->in_device[i]) || a->ndim != n->in_ndim[i] ||
      memcmp(a->shape, n->in_shape[i], sizeof(int64_t) * (size_t)a->ndim) != 0)
    return NULL;
  return a;
}

static int accumulate(em_tensor **acc, em_tensor *g) {
  if (!*acc) { *acc = em_tensor_retain(g); return 0; }
  em_tensor *sum = em_add(*acc, g);
  if (!sum) return -1;
  em_tensor_release(*acc);
  *acc = sum;
  return 0;
}

static int call_hooks(em_tensor *leaf) {
  for (em_hook *h = leaf->hooks; h; h = h->next)
    if (h->fn(leaf, h->ud) < 0) return -1;
  return 0;
}

/* The leaf's gradient is final: write it into .grad and fire its hooks. */
static int finish_leaf(em_tensor *leaf) {
  em_tensor *g = leaf->bw_grad;
  leaf->bw_grad = NULL;
  int rc = 0;
  bool fresh = !leaf->grad;
  if (!leaf->grad) {
    /* own a fresh contiguous buffer: g may alias another tensor or be an expanded view */
    if (g->refcount == 1 && g->storage->refcount == 1 && em_is_contiguous(g) && g->dtype == leaf->dtype) {
      leaf->grad = g; g = NULL;
    } else {
      em_tensor *c = em_empty_like(leaf);
      if (!c || em_copy_(c, g)) { em_tensor_release(c); rc = -1; }
      else leaf->grad = c;
    }
  } else if (g == leaf->grad) {
    em_bump_version(leaf->grad);           /* the backward accumulated into .grad itself (a sink) */
  } else {
    em_tensor *r = em_binary(EM_ADD, leaf->grad, g, leaf->grad);  /* in place: .grad may be a bucket view */
    if (!r) rc = -1;
    em_tensor_release(r);
  }
  em_tensor_release(g);
  /* a fresh .grad was allocated as a backward temporary: memory history retags it */
  if (rc == 0 && fresh && em_mem_history_on()) em_mem_tag(leaf->grad->storage, EM_MEM_GRADIENT);
  if (rc == 0) rc = call_hooks(leaf);
  return rc;
}

static int check_saved(em_node *n) {
  if (n->freed)
    return em_error("backward: trying to backward through the graph a second time (the saved tensors of "
                    "'%s' were freed after the first backward); pass retain_graph=true to the first call", n->op);
  for (int k = 0; k < n->n_saved; k++)
    if (n->saved[k] && n->saved[k]->storage->version != n->saved_version[k])
      return em_error("backward: a tensor saved by '%s' for backward was modified by an in-place "
                      "operation (version %u, expected %u); clone() it before modifying",
                      n->op, n->saved[k]->storage->version, n->saved_version[k]);
  return 0;
}

/* Bring gin to input i's shape/dtype/device, or fail naming the op. */
static em_tensor *conform(em_node *n, int i, em_tensor *g) {
  if (g->ndim != n->in_ndim[i] || memcmp(g->shape, n->in_shape[i], sizeof(int64_t) * (size_t)g->ndim)) {
    char a[160], b[160];
    em_error("backward: '%s' produced a gradient of shape %s for input %d of shape %s", n->op,
             em_shape_str(g->ndim, g->shape, a, 160), i, em_shape_str(n->in_ndim[i], n->in_shape[i], b, 160));
    return NULL;
  }
  return em_to(g, n->in_dtype[i], n->in_device[i]);
}

/* One more gradient has reached e's producer: schedule it, or finish the leaf. */
static int edge_delivered(bw_state *s, em_edge *e) {
  if (e->fn) return --e->fn->bw_deps == 0 ? heap_push(s, e->fn) : 0;
  return --e->leaf->bw_deps == 0 ? finish_leaf(e->leaf) : 0;
}

static int run_node(bw_state *s, em_node *n, bool retain) {
  if (check_saved(n)) return -1;
  em_tensor *gout[EM_NODE_MAX_OUT] = {0}, *gin[EM_NODE_MAX_IN] = {0};
  int rc = 0;
  for (int k = 0; k < n->n_out; k++) {
    gout[k] = n->bw_grad[k] ? n->bw_grad[k]
                            : em_zeros(n->out_ndim[k], n->out_shape[k], n->out_dtype[k], n->out_device[k]);
    n->bw_grad[k] = NULL;
    if (!gout[k]) rc = -1;
  }
  /* kernels and allocations of this node belong to the module whose forward made it */
  const char *prev_module = em_ctx_set_module(n->module);
  const char *prev_fn = em_ctx_set_grad_fn(n->op);
  if (rc == 0) {
    /* the backward formula is an op too: its own kernels and declared cost
     * (EM_OP_COST) land in a scope named after the node (phase backward) */
    EM_OP_SCOPE(n->op);
    rc = n->backward(n, gout, gin) < 0 ? -1 : 0;
  }
  em_ctx_set_grad_fn(prev_fn);
  em_ctx_set_module(prev_module);
  for (int k = 0; k < n->n_out; k++) em_tensor_release(gout[k]);
  for (int i = 0; i < n->n_in && rc == 0; i++) {
    em_edge *e = &n->next[i];
    if (!e->fn && !e->leaf) continue;
    if (!gin[i]) { rc = em_error("backward: '%s' returned no gradient for input %d", n->op, i); break; }
    em_tensor **acc = e->fn ? &e->fn->bw_grad[e->output_nr] : &e->leaf->bw_grad;
    if (gin[i] == *acc) {                /* the backward added into the sink itself */
      em_tensor_release(gin[i]);
      gin[i] = NULL;
      rc = edge_delivered(s, e);
      continue;
    }
    /* A second gradient for an f32/f64 input that already has one, arriving
     * in bf16/f16 (from a linear under autocast): add it as is — em_add
     * promotes to the sum's dtype in one kernel, with the same values as
     * converting first. */
    em_tensor *gi = gin[i], *g;
    em_dtype want = n->in_dtype[i];
    if (*acc && (*acc)->dtype == want && (want == EM_F32 || want == EM_F64) &&
        (gi->dtype == EM_BF16 || gi->dtype == EM_F16) && em_same_shape(gi, *acc) &&
        em_device_eq(gi->device, (*acc)->device))
      g = em_tensor_retain(gi);
    else
      g = conform(n, i, gi);
    /* drop our references before the leaf may take the buffer as its .grad
     * (finish_leaf steals only a gradient nobody else holds) */
    em_tensor_release(gin[i]);
    gin[i] = NULL;
    if (!g) { rc = -1; break; }
    rc = accumulate(acc, g);
    em_tensor_release(g);
    if (rc) break;
    rc = edge_delivered(s, e);
  }
  for (int i = 0; i < n->n_in; i++) em_tensor_release(gin[i]);
  if (!retain) { free_saved(n); n->freed = true; }
  return rc;
}

int em_backward(em_tensor *root, em_tensor *grad, bool retain) {
  if (!root->requires_grad)
    return em_error("backward: the tensor does not require grad and has no grad_fn "
                    "(did you compute it under no_grad, or from tensors without requires_grad?)");
  em_tensor *g0;
  if (grad) {
    if (!em_same_shape(grad, root)) {
      char a[160], b[160];
      return em_error("backward: expected a gradient of shape %s, got %s",
                      em_shape_str(root->ndim, root->shape, a, 160), em_shape_str(grad->ndim, grad->shape, b, 160));
    }
    g0 = em_to(grad, root->dtype, root->device);   /* as PyTorch: the gradient takes the root's dtype */
    if (!g0) return -1;
  } else {
    if (em_numel(root) != 1) {
      char a[160];
      return em_error("backward: a gradient can be created implicitly only for tensors with one element, "
                      "got shape %s; pass a gradient", em_shape_str(root->ndim, root->shape, a, 160));
    }
    g0 = em_full(root->ndim, root->shape, 1.0, root->dtype, root->device);
    if (!g0) return -1;
  }
  bool prev = em_set_grad_enabled(false);
  em_phase prev_phase = em_ctx_set_phase(EM_PHASE_BACKWARD);
  int rc = 0;
  if (!root->grad_fn) {            /* a leaf: its gradient is g0 itself */
    em_tensor *g = em_to(g0, root->dtype, root->device);
    root->bw_grad = g;
    rc = g ? finish_leaf(root) : -1;
    em_tensor_release(g0);
    em_set_grad_enabled(prev);
    em_ctx_set_phase(prev_phase);
    return rc;
  }
  bw_state s = {0};
  s.epoch = ++bw_epoch;
  if (discover(&s, root->grad_fn)) rc = -1;
  if (rc == 0) {
    root->grad_fn->bw_grad[root->output_nr] = em_tensor_retain(g0);
    rc = heap_push(&s, root->grad_fn);
  }
  while (rc == 0 && s.n_ready > 0) rc = run_node(&s, heap_pop(&s), retain);
  /* cleanup scratch (also after an error midway) */
  for (int i = 0; i < s.n_nodes; i++)
    for (int k = 0; k < s.nodes[i]->n_out; k++) {
      em_tensor_release(s.nodes[i]->bw_grad[k]);
      s.nodes[i]->bw_grad[k] = NULL;
    }
  for (int i = 0; i < s.n_leaves; i++) { em_tensor_release(s.leaves[i]->bw_grad); s.leaves[i]->bw_grad = NULL; }
  free(s.nodes); free(s.leaves); free(s.ready);
  em_tensor_release(g0);
  em_set_grad_enabled(prev);
  em_ctx_set_phase(prev_phase);
  return rc;
}
