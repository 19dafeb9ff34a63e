/* Shape ops that copy: repeat, tile, flip, roll and diag — the CPU forward,
 * the backward formulas and the call into kernels/shape_ops.cu.
 *
 * Why it is shaped this way:
 *  - repeat, tile, flip and roll are one operation: a gather whose source
 *    index along each dim is a function of the output index along that dim
 *    alone (identity, n - 1 - i, or (i + off) mod n). So they share one map
 *    (em_dimmap, backend.h), one CPU loop and one CUDA kernel. Cost: each
 *    output element read once and written once (8 B per f32 element), plus
 *    nothing: the map is per dim, never a per-element index tensor.
 *  - The map is compressed before it runs: size-1 dims dropped, runs of
 *    identity dims whose input strides allow it merged, so "flip the last dim
 *    of a contiguous (B, T, D)" is a two-dim loop.
 *  - The CPU loop precomputes the last dim as a few segments (a repeat is r
 *    copies of a row, a roll two pieces, a flip one reversed run): forward
 *    unit-stride segments are memcpy, the rest a tight element loop.
 *  - diag needs no kernel: the diagonal of a matrix is a strided view (stride
 *    s0 + s1), so 2-D -> 1-D copies out of that view and 1-D -> 2-D copies
 *    into it over zeros; em_copy_ does both devices and every dtype.
 *  - Backward: flip flips back, roll rolls back, diag's two directions are
 *    each other's backward, and repeat sums the copies: the gradient viewed
 *    as (before, r, size, after) and summed over r, one repeated dim at a time
 *    (so a repeat of an 8-dim tensor never needs 16 dims). */
#include "op.h"

/* ---------------- the map ---------------- */

/* Drop size-1 dims, turn no-op MOD dims into ID, merge neighbouring ID dims. */
static void map_compress(em_dimmap *m) {
  em_dimmap c;
  memset(&c, 0, sizeof c);
  int n = 0;
  for (int d = 0; d < m->ndim; d++) {
    if (m->out_size[d] == 1) continue;
    int kind = m->kind[d];
    if (kind == EM_MAP_MOD && m->off[d] == 0 && m->out_size[d] == m->in_size[d]) kind = EM_MAP_ID;
    if (n > 0 && kind == EM_MAP_ID && c.kind[n - 1] == EM_MAP_ID &&
        c.in_stride[n - 1] == m->in_stride[d] * m->in_size[d]) {
      c.out_size[n - 1] *= m->out_size[d];
      c.in_size[n - 1] *= m->in_size[d];
      c.in_stride[n - 1] = m->in_stride[d];
      continue;
    }
    c.out_size[n] = m->out_size[d]; c.in_size[n] = m->in_size[d];
    c.in_stride[n] = m->in_stride[d]; c.off[n] = m->off[d]; c.kind[n] = kind;
    n++;
  }
  if (n == 0) { c.out_size[0] = c.in_size[0] = 1; c.kind[0] = EM_MAP_ID; n = 1; }
  c.ndim = n;
  *m = c;
}

static int64_t map_src(const em_dimmap *m, int d, int64_t i) {
  switch (m->kind[d]) {
    case EM_MAP_FLIP: return m->in_size[d] - 1 - i;
    case EM_MAP_MOD: return (i + m->off[d]) % m->in_size[d];
    default: return i;
  }
}

/* A run of the last dim: len output elements from out_at read in[src + t * dir]. */
typedef struct { int64_t out_at, src, len; int dir; } segment;

static int last_dim_segments(const em_dimmap *m, segment **out) {
  int d = m->ndim - 1;
  int64_t L = m->out_size[d], S = m->in_size[d];
  int64_t cap = m->kind[d] == EM_MAP_MOD ? L / S + 2 : 1;
  segment *s = malloc(sizeof *s * (size_t)cap);
  if (!s) return em_error_oom("out of memory: %lld segments of a gather", (long long)cap);
  int n = 0;
  if (m->kind[d] == EM_MAP_FLIP) s[n++] = (segment){0, S - 1, L, -1};
  else if (m->kind[d] == EM_MAP_ID) s[n++] = (segment){0, 0, L, 1};
  else
    for (int64_t j = 0; j < L;) {
      int64_t src = (j + m->off[d]) % S, len = EM_MIN(S - src, L - j);
      s[n++] = (segment){j, src, len, 1};
      j += len;
    }
  *out = s;
  return n;
}

#define COPY_RUN(E) { E *o = (E *)dst; const E *i = (const E *)src;                    \
                      for (int64_t t = 0; t < len; t++) o[t] = i[t * st]; } break

static void copy_run(char *dst, const char *src, int64_t st, int64_t len, size_t es) {
  if (st == 1) { memcpy(dst, src, (size_t)len * es); return; }
  switch (es) {
    case 1: COPY_RUN(uint8_t);
    case 2: COPY_RUN(uint16_t);
    case 4: COPY_RUN(uint32_t);
    default: COPY_RUN(uint64_t);
  }
}

/* out (contiguous) = in gathered through m (compressed, numel > 0). */
static int cpu_dimmap(em_tensor *out, const em_tensor *in, const em_dimmap *m) {
  segment *seg = NULL;
  int nseg = last_dim_segments(m, &seg);
  if (nseg < 0) return -1;
  size_t es = em_dtype_size(in->dtype);
  const char *base = (const char *)in->storage->data + in->offset * (int64_t)es;
  char *o = em_data_ptr(out);
  int last = m->ndim - 1;
  int64_t L = m->out_size[last], st = m->in_stride[last], rows = em_numel(out) / L;
  int64_t idx[EM_MAX_DIMS] = {0};
  for (int64_t r = 0; r < rows; r++) {
    int64_t roff = 0;
    for (int d = 0; d < last; d++) roff += map_src(m, d, idx[d]) * m->in_stride[d];
    for (int k = 0; k < nseg; k++) {
      const segment *s = &seg[k];
      copy_run(o + (r * L + s->out_at) * (int64_t)es, base + (roff + s->src * st) * (int64_t)es,
               st * s->dir, s->len, es);
    }
    for (int d = last - 1; d >= 0; d--) {
      if (++idx[d] < m->out_size[d]) break;
      idx[d] = 0;
    }
  }
  free(seg);
  return 0;
}

/* A new contiguous tensor of shape out_size (m->ndim dims) gathered from a through m. */
static em_tensor *dimmap_run(const char *name, em_tensor *a, em_dimmap m) {
  em_tensor *res = em_empty(m.ndim, m.out_size, a->dtype, a->device);
  if (!res || em_numel(res) == 0) return res;
  map_compress(&m);
  int rc;
  if (a->device.type == EM_CPU) rc = cpu_dimmap(res, a, &m);
  else if (a->device.type == EM_CUDA) rc = em_dimmap_cuda(name, res, a, &m);
  else rc = em_error_device(name, a);
  if (rc) { em_tensor_release(res); return NULL; }
  return res;
}

/* The identity map over a's dims. */
static em_dimmap map_of(const em_tensor *a) {
  em_dimmap m;
  memset(&m, 0, sizeof m);
  m.ndim = a->ndim;
  for (int d = 0; d < a->ndim; d++) {
    m.out_size[d] = m.in_size[d] = a->shape[d];
    m.in_stride[d] = a->stride[d];
    m.kind[d] = EM_MAP_ID;
  }
  return m;
}

/* ---------------- repeat, tile ---------------- */

/* Sum the r copies along each repeated dim, then drop the padded leading dims.
 * i[0] = number of sizes, i[1 + d] = sizes[d]. */
static int repeat_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  int nd = (int)n->i[0];
  em_tensor *cur = em_tensor_retain(gout[0]);
  for (int d = 0; d < nd && cur; d++) {
    int64_t r = n->i[1 + d];
    if (r == 1) continue;
    int64_t S = n->in_ndim[0] - nd + d >= 0 ? n->in_shape[0][n->in_ndim[0] - nd + d] : 1;
    int64_t A = 1, B = 1, shape[EM_MAX_DIMS];
    for (int k = 0; k < nd; k++) {
      shape[k] = cur->shape[k];
      if (k < d) A *= cur->shape[k];
      if (k > d) B *= cur->shape[k];
    }
    shape[d] = S;
    em_tensor *v = em_reshape(cur, 4, (int64_t[]){A, r, S, B});
    int64_t one = 1;
    em_tensor *s = v ? em_sum(v, 1, &one, false) : NULL;
    em_tensor *next = s ? em_reshape(s, nd, shape) : NULL;
    em_tensor_release(v); em_tensor_release(s); em_tensor_release(cur);
    cur = next;
  }
  if (!cur) return -1;
  gin[0] = em_reshape(cur, n->in_ndim[0], n->in_shape[0]);
  em_tensor_release(cur);
  return gin[0] ? 0 : -1;
}

static em_tensor *repeat_impl(const char *name, em_tensor *a, int n, const int64_t *sizes) {
  EM_CHECK_NULL(a, "%s: expected a tensor, got NULL", name);
  char b[160];
  EM_CHECK_NULL(n >= a->ndim, "%s: expected at least as many sizes as the tensor has dims (%d), got %d "
                "(shape %s)", name, a->ndim, n, em_shape_str(a->ndim, a->shape, b, 160));
  EM_CHECK_NULL(n <= EM_MAX_DIMS, "%s: expected at most %d sizes, got %d", name, EM_MAX_DIMS, n);
  for (int d = 0; d < n; d++)
    EM_CHECK_NULL(sizes[d] >= 0, "%s: expected non-negative sizes, got %lld at position %d", name,
                  (long long)sizes[d], d);
  em_dimmap m;
  memset(&m, 0, sizeof m);
  m.ndim = n;
  int pad = n - a->ndim;
  for (int d = 0; d < n; d++) {
    int64_t S = d < pad ? 1 : a->shape[d - pad];
    m.in_size[d] = S;
    m.in_stride[d] = d < pad ? 0 : a->stride[d - pad];
    m.out_size[d] = S * sizes[d];
    m.kind[d] = EM_MAP_MOD;
  }
  em_tensor *res = dimmap_run(name, a, m);
  em_node *node;
  res = em_op_record(res, &node, name, repeat_backward, 1, &a, 0, NULL);
  if (node) {
    node->i[0] = n;
    for (int d = 0; d < n; d++) node->i[1 + d] = sizes[d];
  }
  return res;
}

em_tensor *em_repeat(em_tensor *a, int n, const int64_t *sizes) {
  EM_OP_SCOPE("repeat");
  return repeat_impl("repeat", a, n, sizes);
}

em_tensor *em_tile(em_tensor *a, int n, const int64_t *reps) {
  EM_OP_SCOPE("tile");
  EM_CHECK_NULL(a, "tile: expected a tensor, got NULL");
  EM_CHECK_NULL(n <= EM_MAX_DIMS, "tile: expected at most %d reps, got %d", EM_MAX_DIMS, n);
  int64_t r[EM_MAX_DIMS];
  int nr = EM_MAX(n, a->ndim), pad = nr - n;
  for (int d = 0; d < nr; d++) r[d] = d < pad ? 1 : reps[d - pad];
  return repeat_impl("tile", a, nr, r);
}

/* ---------------- flip ---------------- */

/* i[d] = 1 for each flipped dim d. */
static em_tensor *flip_mask(em_tensor *a, const int64_t *flipped);

static int flip_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  gin[0] = flip_mask(gout[0], n->i);
  return gin[0] ? 0 : -1;
}

static em_tensor *flip_mask(em_tensor *a, const int64_t *flipped) {
  em_dimmap m = map_of(a);
  for (int d = 0; d < a->ndim; d++) if (flipped[d]) m.kind[d] = EM_MAP_FLIP;
  return dimmap_run("flip", a, m);
}

em_tensor *em_flip(em_tensor *a, int n, const int64_t *dims) {
  EM_OP_SCOPE("flip");
  EM_CHECK_NULL(a, "flip: expected a tensor, got NULL");
  int64_t flipped[EM_MAX_DIMS] = {0};
  for (int j = 0; j < n; j++) {
    int d;
    if (em_wrap_dim("flip", dims[j], a->ndim, &d)) return NULL;
    if (a->ndim == 0) continue;
    EM_CHECK_NULL(!flipped[d], "flip: dim %d appears multiple times in the list of dims", d);
    flipped[d] = 1;
  }
  em_tensor *res = flip_mask(a, flipped);
  em_node *node;
  res = em_op_record(res, &node, "flip", flip_backward, 1, &a, 0, NULL);
  if (node) memcpy(node->i, flipped, sizeof flipped);
  return res;
}

/* ---------------- roll ---------------- */

/* shift[d]: the roll along dim d (any integer). */
static em_tensor *roll_dims(em_tensor *a, const int64_t *shift);

static int roll_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  int64_t back[EM_MAX_DIMS];
  for (int d = 0; d < gout[0]->ndim; d++) back[d] = -n->i[d];
  gin[0] = roll_dims(gout[0], back);
  return gin[0] ? 0 : -1;
}

static em_tensor *roll_dims(em_tensor *a, const int64_t *shift) {
  em_dimmap m = map_of(a);
  for (int d = 0; d < a->ndim; d++) {
    int64_t S = a->shape[d];
    if (S == 0) continue;
    m.kind[d] = EM_MAP_MOD;
    m.off[d] = ((-shift[d]) % S + S) % S;   /* out[i] = in[(i - shift) mod S] */
  }
  em_tensor *res = dimmap_run("roll", a, m);
  em_node *node;
  res = em_op_record(res, &node, "roll", roll_backward, 1, &a, 0, NULL);
  if (node) memcpy(node->i, shift, sizeof(int64_t) * (size_t)a->ndim);
  return res;
}

em_tensor *em_roll(em_tensor *a, int n_shifts, const int64_t *shifts, int n_dims, const int64_t *dims) {
  EM_OP_SCOPE("roll");
  EM_CHECK_NULL(a, "roll: expected a tensor, got NULL");
  if (n_dims == 0) {   /* the flattened tensor, shape restored */
    EM_CHECK_NULL(n_shifts == 1, "roll: expected one shift when no dims are given (the flattened tensor "
                  "rolls), got %d shifts", n_shifts);
    int64_t numel = em_numel(a), sh = shifts[0];
    em_tensor *flat = em_reshape(a, 1, &numel);
    em_tensor *r = flat ? roll_dims(flat, &sh) : NULL;
    em_tensor *res = r ? em_reshape(r, a->ndim, a->shape) : NULL;
    em_tensor_release(flat); em_tensor_release(r);
    return res;
  }
  EM_CHECK_NULL(n_shifts == n_dims, "roll: expected as many shifts as dims, got %d shift%s and %d dim%s",
                n_shifts, n_shifts == 1 ? "" : "s", n_dims, n_dims == 1 ? "" : "s");
  EM_CHECK_NULL(a->ndim > 0, "roll: expected a tensor with at least 1 dim when dims are given, got a 0-d tensor");
  int64_t shift[EM_MAX_DIMS] = {0};
  for (int j = 0; j < n_dims; j++) {   /* a dim given twice rolls twice, as in PyTorch */
    int d;
    if (em_wrap_dim("roll", dims[j], a->ndim, &d)) return NULL;
    shift[d] += shifts[j];
  }
  return roll_dims(a, shift);
}

/* ---------------- diag ---------------- */

/* The raw strided view of diagonal k of the 2-D tensor m (no autograd). */
static em_tensor *diag_view(const em_tensor *m, int64_t k) {
  int64_t rows = m->shape[0], cols = m->shape[1];
  int64_t len = k >= 0 ? EM_MIN(rows, cols - k) : EM_MIN(rows + k, cols);
  len = EM_MAX(len, 0);
  int64_t off = m->offset + (len == 0 ? 0 : k >= 0 ? k * m->stride[1] : -k * m->stride[0]);
  int64_t st = m->stride[0] + m->stride[1];
  return em_as_strided(m, 1, &len, &st, off);
}

/* dst = src with autograd off (the op records its own node). */
static int copy_quiet(em_tensor *dst, em_tensor *src) {
  bool g = em_set_grad_enabled(false);
  int rc = em_copy_(dst, src);
  em_set_grad_enabled(g);
  return rc;
}

static em_tensor *diag_extract(em_tensor *m, int64_t k) {
  em_tensor *v = diag_view(m, k);
  em_tensor *res = v ? em_empty(1, v->shape, m->dtype, m->device) : NULL;
  if (res && copy_quiet(res, v)) { em_tensor_release(res); res = NULL; }
  em_tensor_release(v);
  return res;
}

static em_tensor *diag_embed(em_tensor *v, int64_t rows, int64_t cols, int64_t k) {
  em_tensor *res = em_zeros(2, (int64_t[]){rows, cols}, v->dtype, v->device);
  em_tensor *d = res ? diag_view(res, k) : NULL;
  int rc = d ? copy_quiet(d, v) : -1;
  em_tensor_release(d);
  if (rc) { em_tensor_release(res); return NULL; }
  return res;
}

/* i[0] = k; the input's shape tells the direction. */
static int diag_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  int64_t k = n->i[0];
  if (n->in_ndim[0] == 1) gin[0] = diag_extract(gout[0], k);
  else gin[0] = diag_embed(gout[0], n->in_shape[0][0], n->in_shape[0][1], k);
  return gin[0] ? 0 : -1;
}

em_tensor *em_diag(em_tensor *a, int64_t k) {
  EM_OP_SCOPE("diag");
  EM_CHECK_NULL(a, "diag: expected a tensor, got NULL");
  char b[160];
  EM_CHECK_NULL(a->ndim == 1 || a->ndim == 2, "diag: expected a 1-D or 2-D tensor, got %d dims (shape %s)",
                a->ndim, em_shape_str(a->ndim, a->shape, b, 160));
  em_tensor *res;
  if (a->ndim == 1) {
    int64_t n = a->shape[0] + (k >= 0 ? k : -k);
    res = diag_embed(a, n, n, k);
  } else {
    res = diag_extract(a, k);
  }
  em_node *node;
  res = em_op_record(res, &node, "diag", diag_backward, 1, &a, 0, NULL);
  if (node) node->i[0] = k;
  return res;
}
