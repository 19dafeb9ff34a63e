/* Queries over a stopped profile: rows grouped by kernel name, op, module
 * path or phase (the tables of ember.profiler), and the summary. Keys are
 * interned strings, so grouping hashes pointers, never strings; a derived
 * module key ("layers.*" at depth 2) is built once per distinct path. */
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "profiler_internal.h"

/* ---- a pointer -> index map (open addressing, grows at 1/2 load) ---- */

typedef struct { const void **keys; size_t *vals; size_t cap, n; } ptrmap;

static size_t ptr_hash(const void *p, size_t cap) {
  return (size_t)(((uintptr_t)p >> 3) * 0x9E3779B97F4A7C15ull) & (cap - 1);
}

static int ptrmap_grow(ptrmap *m) {
  size_t cap = m->cap ? m->cap * 2 : 256;
  const void **keys = calloc(cap, sizeof *keys);
  size_t *vals = calloc(cap, sizeof *vals);
  if (!keys || !vals) { free(keys); free(vals); return -1; }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i]) continue;
    size_t j = ptr_hash(m->keys[i], cap);
    while (keys[j]) j = (j + 1) & (cap - 1);
    keys[j] = m->keys[i];
    vals[j] = m->vals[i];
  }
  free(m->keys); free(m->vals);
  m->keys = keys; m->vals = vals; m->cap = cap;
  return 0;
}

/* The slot of key (NULL keys are not allowed); *found tells whether it was there. */
static size_t *ptrmap_slot(ptrmap *m, const void *key, bool *found) {
  if ((m->n + 1) * 2 > m->cap && ptrmap_grow(m)) return NULL;
  size_t j = ptr_hash(key, m->cap);
  while (m->keys[j] && m->keys[j] != key) j = (j + 1) & (m->cap - 1);
  *found = m->keys[j] != NULL;
  if (!*found) { m->keys[j] = key; m->n++; }
  return &m->vals[j];
}

static void ptrmap_free(ptrmap *m) { free(m->keys); free(m->vals); }

/* ---- keys ---- */

typedef struct { int depth; bool rollup; ptrmap cache; } module_keyer;

static bool all_digits(const char *s, size_t n) {
  if (!n) return false;
  for (size_t i = 0; i < n; i++) if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

/* "layers.3.attn.q_proj" at depth 2 -> "layers.3"; with rollup -> "layers.*". */
static const char *module_key(module_keyer *k, const char *m) {
  if (!m) m = "";
  if (k->depth <= 0 && !k->rollup) return m;
  bool found;
  size_t *slot = ptrmap_slot(&k->cache, m, &found);
  if (slot && found) return (const char *)(uintptr_t)*slot;
  char buf[512];
  size_t out = 0;
  int comps = 0;
  for (const char *c = m; *c && (k->depth <= 0 || comps < k->depth); comps++) {
    const char *dot = strchr(c, '.');
    size_t len = dot ? (size_t)(dot - c) : strlen(c);
    const char *piece = k->rollup && all_digits(c, len) ? "*" : c;
    size_t plen = piece[0] == '*' && piece != c ? 1 : len;
    if (out + plen + 2 >= sizeof buf) break;
    if (comps) buf[out++] = '.';
    memcpy(buf + out, piece, plen);
    out += plen;
    c = dot ? dot + 1 : c + len;
  }
  buf[out] = 0;
  const char *key = em_intern(buf);
  if (!key) key = m;
  if (slot) *slot = (size_t)(uintptr_t)key;
  return key;
}

static const char *gpu_op_key(const em_prof_gpu *g) {
  if (g->phase == EM_PHASE_BACKWARD && g->grad_fn) return g->grad_fn;
  return g->op ? g->op : "";
}

static bool module_ok(const em_prof_query *q, const char *m) {
  return !q->module_glob || fnmatch(q->module_glob, m ? m : "", 0) == 0;
}

/* ---- roofline ---- */

const char *em_prof_flop_class_name(int c) {
  static const char *const names[EM_PROF_FLOP_CLASSES] = {"f32", "f64", "tf32", "bf16", "f16"};
  return c >= 0 && c < EM_PROF_FLOP_CLASSES ? names[c] : "f32";
}

/* Replayed records by op call: (capture call id, graph launch), then position. */
typedef struct { uint64_t call; size_t i; } call_rec;

static int cmp_call_rec(const void *x, const void *y) {
  const call_rec *a = x, *b = y;
  if (a->call != b->call) return a->call < b->call ? -1 : 1;
  return a->i < b->i ? -1 : a->i > b->i;
}

/* The graph-replay half of the index: the records one graph launch ran for
 * one captured op call form that call, with the cost the op declared at
 * capture (capture_cost.c), copied here so the profile outlives the graph. */
static int index_graph_calls(em_profile *p) {
  size_t n = 0;
  for (size_t i = 0; i < p->n_gpu; i++) n += p->gpu[i].cap_call != 0;
  if (!n) return 0;
  call_rec *recs = malloc(n * sizeof *recs);
  p->gpu_graph_call = calloc(p->n_gpu, sizeof *p->gpu_graph_call);
  p->graph_calls = malloc(n * sizeof *p->graph_calls);
  if (!recs || !p->gpu_graph_call || !p->graph_calls) { free(recs); return -1; }
  n = 0;
  for (size_t i = 0; i < p->n_gpu; i++)
    if (p->gpu[i].cap_call) recs[n++] = (call_rec){(uint64_t)p->gpu[i].cap_call << 32 | p->gpu[i].launch, i};
  qsort(recs, n, sizeof *recs, cmp_call_rec);
  for (size_t a = 0, b; a < n; a = b) {
    for (b = a + 1; b < n && recs[b].call == recs[a].call; b++) {}
    em_capcost c;
    if (!em_capcost_get((uint32_t)(recs[a].call >> 32), &c) || (c.bytes <= 0 && c.flops <= 0)) continue;
    em_prof_call *call = &p->graph_calls[p->n_graph_calls++];
    *call = (em_prof_call){c.bytes, c.flops, 0, c.fclass};
    for (size_t k = a; k < b; k++) {
      const em_prof_gpu *g = &p->gpu[recs[k].i];
      call->ns += g->t1 - g->t0;
      p->gpu_graph_call[recs[k].i] = (uint32_t)p->n_graph_calls;
    }
  }
  free(recs);
  return 0;
}

int em_prof_index(em_profile *p) {
  size_t n = (size_t)p->n_seq + 1;
  p->seq_op = calloc(n, sizeof *p->seq_op);
  p->seq_gpu_ns = calloc(n, sizeof *p->seq_gpu_ns);
  if (!p->seq_op || !p->seq_gpu_ns || index_graph_calls(p)) {
    free(p->seq_op); free(p->seq_gpu_ns); free(p->graph_calls); free(p->gpu_graph_call);
    p->seq_op = p->seq_gpu_ns = NULL;
    p->graph_calls = NULL;
    p->gpu_graph_call = NULL;
    p->n_graph_calls = 0;
    return em_error_oom("out of memory: profile roofline index");
  }
  for (size_t i = 0; i < p->n_ops; i++)
    if (p->ops[i].seq && p->ops[i].seq <= p->n_seq) p->seq_op[p->ops[i].seq] = (int64_t)i + 1;
  for (size_t i = 0; i < p->n_gpu; i++)
    if (p->gpu[i].op_seq && p->gpu[i].op_seq <= p->n_seq) p->seq_gpu_ns[p->gpu[i].op_seq] += p->gpu[i].t1 - p->gpu[i].t0;
  return 0;
}

/* The op call that ran GPU record i: the eager scope that launched it, or
 * the captured op call a graph launch replayed. Its declared cost and the
 * GPU time of all its records; false when none is known. */
static bool gpu_call(const em_profile *p, size_t i, em_prof_call *out) {
  const em_prof_gpu *g = &p->gpu[i];
  if (p->seq_op && g->op_seq && g->op_seq <= p->n_seq && p->seq_op[g->op_seq]) {
    const em_prof_op *o = &p->ops[p->seq_op[g->op_seq] - 1];
    *out = (em_prof_call){o->bytes, o->flops, p->seq_gpu_ns[o->seq], o->fclass};
    return true;
  }
  if (p->gpu_graph_call && p->gpu_graph_call[i]) {
    *out = p->graph_calls[p->gpu_graph_call[i] - 1];
    return true;
  }
  return false;
}

/* Add `ns` of an op call with cost (bytes, flops) of class fc, scaled by share, to r. */
static void add_cost(em_prof_row *r, const em_prof_query *q, int64_t ns, double share, double bytes, double flops,
                     int fc) {
  r->roof_ns += ns;
  if (ns <= 0 || (bytes <= 0 && flops <= 0)) return;
  r->cost_ns += ns;
  r->bytes += share * bytes;
  r->flops += share * flops;
  double peak_f = fc >= 0 && fc < EM_PROF_FLOP_CLASSES ? q->peak_tflops[fc] : 0;
  double mem = q->peak_gbs > 0 ? bytes / q->peak_gbs : 0, fl = peak_f > 0 ? flops / (peak_f * 1e3) : 0;
  if (mem >= fl) r->mem_floor_ns += share * mem;
  else r->flop_floor_ns += share * fl;
}

/* ---- grouping ---- */

typedef struct { em_prof_row *rows; size_t n, cap; ptrmap index; } table;

static const char EMPTY_KEY[] = "";   /* one pointer for every empty key ("" is the root module) */

static em_prof_row *row_for(table *t, const char *key) {
  if (!key || !*key) key = EMPTY_KEY;
  bool found;
  size_t *slot = ptrmap_slot(&t->index, key, &found);
  if (!slot) return NULL;
  if (found) return &t->rows[*slot];
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    em_prof_row *r = realloc(t->rows, cap * sizeof *r);
    if (!r) return NULL;
    t->rows = r;
    t->cap = cap;
  }
  em_prof_row *r = &t->rows[t->n];
  memset(r, 0, sizeof *r);
  r->key = key;
  r->min_ns = INT64_MAX;
  *slot = t->n++;
  return r;
}

static em_prof_row *row_find(table *t, const char *key) {
  if (!key || !*key) key = EMPTY_KEY;
  if (!t->index.cap) return NULL;
  size_t j = ptr_hash(key, t->index.cap);
  while (t->index.keys[j] && t->index.keys[j] != key) j = (j + 1) & (t->index.cap - 1);
  return t->index.keys[j] ? &t->rows[t->index.vals[j]] : NULL;
}

static void add_time(em_prof_row *r, int64_t ns, int64_t self, int phase) {
  r->calls++;
  r->total_ns += ns;
  r->self_ns += self;
  if (ns < r->min_ns) r->min_ns = ns;
  if (ns > r->max_ns) r->max_ns = ns;
  if (phase >= 0 && phase < EM_PHASE_COUNT) { r->phase_ns[phase] += self; r->phase_calls[phase]++; }
}

static const char *gpu_key(const em_prof_query *q, module_keyer *mk, const em_prof_gpu *g, bool innermost_op) {
  switch (q->key) {
  case EM_PROF_BY_OP: return innermost_op ? (g->op ? g->op : "") : gpu_op_key(g);
  case EM_PROF_BY_MODULE: return module_key(mk, g->module);
  case EM_PROF_BY_PHASE: return em_phase_name(g->phase);
  default: return g->name;
  }
}

static bool gpu_selected(const em_prof_query *q, const em_prof_gpu *g) {
  if (q->kernels_only && g->kind != EM_GPU_KERNEL) return false;
  if (q->phase >= 0 && g->phase != q->phase) return false;
  return module_ok(q, g->module);
}

static int cmp_total_desc(const void *a, const void *b) {
  const em_prof_row *x = a, *y = b;
  return x->total_ns < y->total_ns ? 1 : x->total_ns > y->total_ns ? -1 : strcmp(x->key, y->key);
}

int em_profile_group(const em_profile *p, const em_prof_query *q, em_prof_row **rows, size_t *n) {
  table t = {0};
  module_keyer mk = {q->depth, q->rollup, {0}};
  int rc = 0;
  if (q->source == EM_PROF_GPU) {
    for (size_t i = 0; i < p->n_gpu && rc == 0; i++) {
      const em_prof_gpu *g = &p->gpu[i];
      if (!gpu_selected(q, g)) continue;
      em_prof_row *r = row_for(&t, gpu_key(q, &mk, g, false));
      if (!r) { rc = -1; break; }
      int64_t d = g->t1 - g->t0;
      add_time(r, d, d, g->phase);
      r->kernels += g->kind == EM_GPU_KERNEL;
      r->device_ns += d;
      em_prof_call c;
      if (gpu_call(p, i, &c) && c.ns > 0) add_cost(r, q, d, (double)d / (double)c.ns, c.bytes, c.flops, c.fclass);
      else add_cost(r, q, d, 0, 0, 0, 0);
    }
  } else {
    for (size_t i = 0; i < p->n_ops && rc == 0; i++) {
      const em_prof_op *o = &p->ops[i];
      if (q->phase >= 0 && o->phase != q->phase) continue;
      if (!module_ok(q, o->module)) continue;
      const char *key = q->key == EM_PROF_BY_MODULE ? module_key(&mk, o->module)
                      : q->key == EM_PROF_BY_PHASE ? em_phase_name(o->phase) : o->op;
      em_prof_row *r = row_for(&t, key ? key : "");
      if (!r) { rc = -1; break; }
      add_time(r, o->t1 - o->t0, o->self_ns, o->phase);
      r->kernels += o->kernels;
      if (o->dev_ms >= 0) r->device_ns += (int64_t)(o->dev_ms * 1e6);
      if (p->backend == EM_PROF_HOST) add_cost(r, q, o->self_ns, 1, o->bytes, o->flops, o->fclass);
      else if (p->backend == EM_PROF_EVENTS)
        add_cost(r, q, o->dev_ms >= 0 ? (int64_t)(o->dev_ms * 1e6) : 0, 1, o->bytes_incl, o->flops_incl, o->fclass);
      else if (p->seq_gpu_ns && o->seq <= p->n_seq)
        add_cost(r, q, p->seq_gpu_ns[o->seq], 1, o->bytes, o->flops, o->fclass);
    }
    /* device time of each op row: CUPTI kernels by their innermost op / module / phase */
    for (size_t i = 0; i < t.n; i++) {
      if (p->backend == EM_PROF_HOST) t.rows[i].device_ns = -1;
      if (p->backend != EM_PROF_CUPTI) t.rows[i].kernels = -1;
      if (p->backend == EM_PROF_CUPTI) t.rows[i].device_ns = 0;
    }
    if (p->backend == EM_PROF_CUPTI) {
      for (size_t i = 0; i < p->n_gpu; i++) {
        const em_prof_gpu *g = &p->gpu[i];
        if (!gpu_selected(q, g)) continue;
        em_prof_row *r = row_find(&t, gpu_key(q, &mk, g, true));
        if (r) r->device_ns += g->t1 - g->t0;
      }
    }
  }
  ptrmap_free(&t.index);
  ptrmap_free(&mk.cache);
  if (rc) { free(t.rows); return em_error_oom("out of memory: profile tables"); }
  for (size_t i = 0; i < t.n; i++) if (t.rows[i].min_ns == INT64_MAX) t.rows[i].min_ns = 0;
  if (t.n) qsort(t.rows, t.n, sizeof *t.rows, cmp_total_desc);
  *rows = t.rows;
  *n = t.n;
  return 0;
}

/* ---- summary ---- */

typedef struct { int64_t a, b; } span;

static int cmp_span(const void *x, const void *y) {
  const span *s = x, *t = y;
  return s->a < t->a ? -1 : s->a > t->a;
}

/* Time during which at least one GPU activity ran, inside the window. */
static int64_t busy_ns(const em_profile *p) {
  if (!p->n_gpu) return 0;
  span *s = malloc(p->n_gpu * sizeof *s);
  if (!s) return -1;
  size_t n = 0;
  for (size_t i = 0; i < p->n_gpu; i++) {
    int64_t a = EM_MAX(p->gpu[i].t0, p->t_start), b = EM_MIN(p->gpu[i].t1, p->t_stop);
    if (b > a) s[n++] = (span){a, b};
  }
  qsort(s, n, sizeof *s, cmp_span);
  int64_t total = 0, cur_a = 0, cur_b = INT64_MIN;
  for (size_t i = 0; i < n; i++) {
    if (s[i].a > cur_b) {
      if (cur_b > cur_a) total += cur_b - cur_a;
      cur_a = s[i].a;
      cur_b = s[i].b;
    } else if (s[i].b > cur_b) {
      cur_b = s[i].b;
    }
  }
  if (n && cur_b > cur_a) total += cur_b - cur_a;
  free(s);
  return total;
}

void em_profile_summary(const em_profile *p, em_prof_summary *o) {
  memset(o, 0, sizeof *o);
  o->backend = p->backend;
  o->label = p->label;
  o->reason = p->reason;
  o->wall_ns = p->t_stop - p->t_start;
  o->gpu_busy_ns = p->backend == EM_PROF_CUPTI ? busy_ns(p) : -1;
  for (size_t i = 0; i < p->n_gpu; i++) {
    const em_prof_gpu *g = &p->gpu[i];
    int64_t d = g->t1 - g->t0;
    if (g->kind == EM_GPU_KERNEL) {
      o->kernels++;
      o->kernel_ns += d;
      if (g->phase < EM_PHASE_COUNT) { o->phase_kernels[g->phase]++; o->phase_kernel_ns[g->phase] += d; }
      if (g->graph != EM_GPU_EAGER) o->graph_kernels++;
      if (g->graph == EM_GPU_GRAPH_CAPTURED) o->graph_kernels_attributed++;
    } else {
      o->copy_ns += d;
      if (g->kind == EM_GPU_MEMCPY) o->memcpys++; else o->memsets++;
    }
  }
  o->op_device_ns = p->backend == EM_PROF_EVENTS ? 0 : -1;
  for (size_t i = 0; i < p->n_ops; i++) {
    const em_prof_op *op = &p->ops[i];
    o->ops++;
    if (op->depth) continue;
    o->top_ops++;
    o->top_op_ns += op->t1 - op->t0;
    if (p->backend == EM_PROF_EVENTS && op->dev_ms >= 0) o->op_device_ns += (int64_t)(op->dev_ms * 1e6);
  }
  for (size_t i = 0; i < p->n_ranges; i++) {
    const em_prof_range *r = &p->ranges[i];
    if (r->kind == EM_RANGE_PHASE && r->phase < EM_PHASE_COUNT) {
      o->phase_count[r->phase]++;
      o->phase_wall_ns[r->phase] += r->t1 - r->t0;
    } else if (r->kind == EM_RANGE_USER) {
      o->ranges++;
    } else if (r->kind == EM_RANGE_MARK) {
      o->marks++;
    }
  }
  o->steps_marked = p->steps;
  o->dropped = p->dropped;
  o->before_window = p->before_window;
}
