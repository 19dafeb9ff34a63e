/* Contractions composed from existing ops: einsum, baddbmm, outer.
 *
 * Why it is shaped this way: each is a rearrangement around one matmul (or,
 * for outer, one broadcasting mul), so none has a kernel or a backward of its
 * own — permute/reshape/sum/matmul/mul record autograd, run on both devices,
 * and matmul's cuBLAS path carries the FLOPs (2 B M N K for a batched
 * contraction).
 *
 * einsum with two operands sorts every label into one of six roles:
 *   batch (in both and the output), contracted (in both, not the output),
 *   kept-from-A / kept-from-B (in one operand and the output), and
 *   summed-in-A / summed-in-B (in one operand only, not the output: summed
 *   away first). A is permuted to (batch, keptA, contracted) and reshaped to
 *   (Bt, M, K), B to (batch, contracted, keptB) -> (Bt, K, N); one matmul
 *   gives (Bt, M, N), reshaped to (batch, keptA, keptB) and permuted into the
 *   output's order. No contracted label (an outer product): a broadcasting
 *   mul instead of a matmul with K = 1. One operand: the sum, then a permute.
 * Not supported (a clear error): ellipsis, a label repeated within one
 * operand (diagonals), more than two operands, size-1 broadcasting between
 * operands. */
#include "op.h"

#define MAX_LABELS 52

/* One operand's labels, as indices 0..51 (A-Z then a-z: ASCII order). */
typedef struct { int n; int lab[EM_MAX_DIMS]; } labels;

static int label_index(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return 26 + c - 'a';
  return -1;
}
static char label_char(int i) { return (char)(i < 26 ? 'A' + i : 'a' + i - 26); }

/* Parse the subscripts of one operand (or the output) from s[0..len). */
static int parse_term(const char *eq, const char *s, int len, const char *what, labels *t) {
  t->n = 0;
  for (int i = 0; i < len; i++) {
    char c = s[i];
    if (c == ' ') continue;
    if (c == '.') return em_error("einsum: ellipsis ('...') is not supported, write the dims out (equation '%s')", eq);
    int li = label_index(c);
    if (li < 0) return em_error("einsum: invalid subscript '%c' in %s (expected letters a-z, A-Z; equation '%s')",
                                c, what, eq);
    for (int k = 0; k < t->n; k++)
      if (t->lab[k] == li)
        return em_error("einsum: label '%c' repeats in %s; diagonals are not supported (equation '%s')", c, what, eq);
    if (t->n == EM_MAX_DIMS) return em_error("einsum: %s has more than %d labels (equation '%s')", what, EM_MAX_DIMS, eq);
    t->lab[t->n++] = li;
  }
  return 0;
}

typedef struct {
  int nin;
  labels in[2], out;
  int64_t size[MAX_LABELS];
  bool seen[MAX_LABELS];
  int count[MAX_LABELS];          /* operands the label appears in */
} equation;

static int parse_equation(const char *eq, int n, em_tensor *const *ops, equation *e) {
  memset(e, 0, sizeof *e);
  const char *arrow = strstr(eq, "->");
  int lhs_len = arrow ? (int)(arrow - eq) : (int)strlen(eq);
  const char *comma = memchr(eq, ',', (size_t)lhs_len);
  int nin = comma ? 2 : 1;
  if (comma && memchr(comma + 1, ',', (size_t)(lhs_len - (comma + 1 - eq))))
    return em_error("einsum: expected 1 or 2 operands, got an equation with more ('%s')", eq);
  if (nin != n)
    return em_error("einsum: the equation '%s' names %d operand%s, got %d tensor%s", eq, nin, nin == 1 ? "" : "s",
                    n, n == 1 ? "" : "s");
  e->nin = nin;
  int l0 = comma ? (int)(comma - eq) : lhs_len;
  if (parse_term(eq, eq, l0, "operand 0", &e->in[0])) return -1;
  if (comma && parse_term(eq, comma + 1, lhs_len - l0 - 1, "operand 1", &e->in[1])) return -1;
  for (int j = 0; j < nin; j++) {
    const em_tensor *t = ops[j];
    if (t->ndim != e->in[j].n) {
      char b[160];
      return em_error("einsum: operand %d has %d dims (shape %s) but the equation '%s' gives it %d labels", j,
                      t->ndim, em_shape_str(t->ndim, t->shape, b, 160), eq, e->in[j].n);
    }
    for (int k = 0; k < t->ndim; k++) {
      int li = e->in[j].lab[k];
      if (e->seen[li] && e->size[li] != t->shape[k])
        return em_error("einsum: label '%c' has size %lld in one place and %lld in operand %d (equation '%s')",
                        label_char(li), (long long)e->size[li], (long long)t->shape[k], j, eq);
      e->seen[li] = true;
      e->size[li] = t->shape[k];
      e->count[li]++;
    }
  }
  if (arrow) {
    if (parse_term(eq, arrow + 2, (int)strlen(arrow + 2), "the output", &e->out)) return -1;
    for (int k = 0; k < e->out.n; k++)
      if (!e->seen[e->out.lab[k]])
        return em_error("einsum: output label '%c' does not appear in any operand (equation '%s')",
                        label_char(e->out.lab[k]), eq);
  } else {   /* implicit output: the labels seen exactly once, in alphabetical order */
    for (int li = 0; li < MAX_LABELS; li++) {
      if (e->count[li] != 1) continue;
      if (e->out.n == EM_MAX_DIMS) return em_error("einsum: the output has more than %d labels ('%s')", EM_MAX_DIMS, eq);
      e->out.lab[e->out.n++] = li;
    }
  }
  return 0;
}

static bool has(const labels *t, int li) {
  for (int k = 0; k < t->n; k++) if (t->lab[k] == li) return true;
  return false;
}
static int pos(const labels *t, int li) {
  for (int k = 0; k < t->n; k++) if (t->lab[k] == li) return k;
  return -1;
}

/* Sum t over the labels of l not in keep (and not in other, when given);
 * *l becomes the remaining labels. Returns a new reference. */
static em_tensor *sum_away(em_tensor *t, labels *l, const labels *keep, const labels *other) {
  int64_t dims[EM_MAX_DIMS];
  int nd = 0;
  labels rest = {0};
  for (int k = 0; k < l->n; k++) {
    int li = l->lab[k];
    if (has(keep, li) || (other && has(other, li))) rest.lab[rest.n++] = li;
    else dims[nd++] = k;
  }
  *l = rest;
  if (nd == 0) return em_tensor_retain(t);
  return em_sum(t, nd, dims, false);
}

/* t (labels l) permuted into the label order of `order`; all of l must be in order. */
static em_tensor *permute_to(em_tensor *t, const labels *l, const labels *order) {
  int64_t perm[EM_MAX_DIMS];
  bool same = true;
  for (int k = 0; k < order->n; k++) { perm[k] = pos(l, order->lab[k]); same = same && perm[k] == k; }
  if (same) return em_tensor_retain(t);
  return em_permute(t, order->n, perm);
}

static int64_t prod_of(const equation *e, const labels *l, int from, int to) {
  int64_t p = 1;
  for (int k = from; k < to; k++) p *= e->size[l->lab[k]];
  return p;
}

static em_tensor *einsum1(const equation *e, em_tensor *a) {
  labels l = e->in[0];
  em_tensor *s = sum_away(a, &l, &e->out, NULL);
  em_tensor *r = s ? permute_to(s, &l, &e->out) : NULL;
  em_tensor_release(s);
  return r;
}

static em_tensor *einsum2(const char *eq, equation *e, em_tensor *a, em_tensor *b) {
  if (a->dtype != b->dtype) {
    em_error("einsum: expected operands of one dtype, got %s and %s (equation '%s')", em_dtype_name(a->dtype),
             em_dtype_name(b->dtype), eq);
    return NULL;
  }
  labels la = e->in[0], lb = e->in[1];
  /* roles: batch, keptA, contracted, keptB */
  labels batch = {0}, ka = {0}, con = {0}, kb = {0};
  em_tensor *a1 = sum_away(a, &la, &e->out, &e->in[1]);
  em_tensor *b1 = a1 ? sum_away(b, &lb, &e->out, &e->in[0]) : NULL;
  em_tensor *ap = NULL, *bp = NULL, *am = NULL, *bm = NULL, *c = NULL, *cs = NULL, *res = NULL;
  if (!b1) goto done;
  for (int k = 0; k < la.n; k++) {
    int li = la.lab[k];
    bool out = has(&e->out, li), inb = has(&lb, li);
    if (inb && out) batch.lab[batch.n++] = li;
    else if (inb) con.lab[con.n++] = li;
    else ka.lab[ka.n++] = li;
  }
  for (int k = 0; k < lb.n; k++) if (!has(&la, lb.lab[k])) kb.lab[kb.n++] = lb.lab[k];
  /* (batch, keptA, contracted) and (batch, contracted, keptB) */
  labels oa = batch, ob = batch, oc = batch;
  for (int k = 0; k < ka.n; k++) oa.lab[oa.n++] = ka.lab[k];
  for (int k = 0; k < con.n; k++) { oa.lab[oa.n++] = con.lab[k]; ob.lab[ob.n++] = con.lab[k]; }
  for (int k = 0; k < kb.n; k++) ob.lab[ob.n++] = kb.lab[k];
  for (int k = 0; k < ka.n; k++) oc.lab[oc.n++] = ka.lab[k];
  for (int k = 0; k < kb.n; k++) oc.lab[oc.n++] = kb.lab[k];
  if (oc.n > EM_MAX_DIMS) { em_error("einsum: more than %d output dims ('%s')", EM_MAX_DIMS, eq); goto done; }
  ap = permute_to(a1, &la, &oa);
  bp = ap ? permute_to(b1, &lb, &ob) : NULL;
  if (!bp) goto done;
  int64_t B = prod_of(e, &batch, 0, batch.n), M = prod_of(e, &ka, 0, ka.n);
  int64_t K = prod_of(e, &con, 0, con.n), N = prod_of(e, &kb, 0, kb.n);
  if (con.n == 0) {   /* an outer product over the batch: broadcasting mul */
    am = em_reshape(ap, 3, (int64_t[]){B, M, 1});
    bm = am ? em_reshape(bp, 3, (int64_t[]){B, 1, N}) : NULL;
    c = bm ? em_mul(am, bm) : NULL;
  } else if (batch.n == 0) {
    am = em_reshape(ap, 2, (int64_t[]){M, K});
    bm = am ? em_reshape(bp, 2, (int64_t[]){K, N}) : NULL;
    c = bm ? em_matmul(am, bm) : NULL;
  } else {
    am = em_reshape(ap, 3, (int64_t[]){B, M, K});
    bm = am ? em_reshape(bp, 3, (int64_t[]){B, K, N}) : NULL;
    c = bm ? em_matmul(am, bm) : NULL;
  }
  if (!c) goto done;
  int64_t shape[EM_MAX_DIMS];
  for (int k = 0; k < oc.n; k++) shape[k] = e->size[oc.lab[k]];
  cs = em_reshape(c, oc.n, shape);
  res = cs ? permute_to(cs, &oc, &e->out) : NULL;
done:
  em_tensor_release(a1); em_tensor_release(b1); em_tensor_release(ap); em_tensor_release(bp);
  em_tensor_release(am); em_tensor_release(bm); em_tensor_release(c); em_tensor_release(cs);
  return res;
}

em_tensor *em_einsum(const char *eq, int n, em_tensor *const *ops) {
  EM_OP_SCOPE("einsum");
  EM_CHECK_NULL(eq, "einsum: expected an equation string, got NULL");
  EM_CHECK_NULL(n == 1 || n == 2, "einsum: expected 1 or 2 operands, got %d", n);
  for (int j = 0; j < n; j++) EM_CHECK_NULL(ops[j], "einsum: operand %d is NULL", j);
  if (n == 2 && em_check_same_device("einsum", ops[0], ops[1])) return NULL;
  equation e;
  if (parse_equation(eq, n, ops, &e)) return NULL;
  return n == 1 ? einsum1(&e, ops[0]) : einsum2(eq, &e, ops[0], ops[1]);
}

/* ---------------- baddbmm ---------------- */

em_tensor *em_baddbmm(em_tensor *input, em_tensor *b1, em_tensor *b2, double beta, double alpha) {
  EM_OP_SCOPE("baddbmm");
  EM_CHECK_NULL(input && b1 && b2, "baddbmm: expected three tensors (input, batch1, batch2), got NULL");
  char s1[160], s2[160];
  EM_CHECK_NULL(b1->ndim == 3 && b2->ndim == 3, "baddbmm: expected 3-D batch1 and batch2, got shapes %s and %s",
                em_shape_str(b1->ndim, b1->shape, s1, 160), em_shape_str(b2->ndim, b2->shape, s2, 160));
  EM_CHECK_NULL(b1->shape[0] == b2->shape[0] && b1->shape[2] == b2->shape[1],
                "baddbmm: batch1 %s and batch2 %s cannot be multiplied (expected (B, n, k) and (B, k, m))",
                em_shape_str(3, b1->shape, s1, 160), em_shape_str(3, b2->shape, s2, 160));
  EM_CHECK_NULL(b1->dtype == b2->dtype && input->dtype == b1->dtype,
                "baddbmm: expected one dtype, got %s (input), %s (batch1) and %s (batch2)",
                em_dtype_name(input->dtype), em_dtype_name(b1->dtype), em_dtype_name(b2->dtype));
  int64_t want[3] = {b1->shape[0], b1->shape[1], b2->shape[2]}, got[EM_MAX_DIMS];
  int nd;
  if (em_broadcast_shape("baddbmm", input->ndim, input->shape, 3, want, &nd, got)) return NULL;
  EM_CHECK_NULL(nd == 3 && got[0] == want[0] && got[1] == want[1] && got[2] == want[2],
                "baddbmm: input of shape %s does not broadcast to the product's shape %s",
                em_shape_str(input->ndim, input->shape, s1, 160), em_shape_str(3, want, s2, 160));
  if (em_check_same_device("baddbmm", input, b1)) return NULL;
  em_tensor *p = em_matmul(b1, b2);
  em_tensor *ap = p && alpha != 1 ? em_mul_scalar(p, alpha) : (p ? em_tensor_retain(p) : NULL);
  em_tensor *res = NULL;
  if (ap && beta == 0) {   /* PyTorch: input is ignored (its NaNs do not propagate) */
    res = em_tensor_retain(ap);
  } else if (ap) {
    em_tensor *bi = beta != 1 ? em_mul_scalar(input, beta) : em_tensor_retain(input);
    res = bi ? em_add(bi, ap) : NULL;
    em_tensor_release(bi);
  }
  em_tensor_release(p); em_tensor_release(ap);
  return res;
}

/* ---------------- outer ---------------- */

em_tensor *em_outer(em_tensor *a, em_tensor *b) {
  EM_OP_SCOPE("outer");
  EM_CHECK_NULL(a && b, "outer: expected two tensors, got NULL");
  char s1[160], s2[160];
  EM_CHECK_NULL(a->ndim == 1 && b->ndim == 1, "outer: expected 1-D tensors, got shapes %s and %s",
                em_shape_str(a->ndim, a->shape, s1, 160), em_shape_str(b->ndim, b->shape, s2, 160));
  em_tensor *ac = em_unsqueeze(a, 1), *br = ac ? em_unsqueeze(b, 0) : NULL;
  em_tensor *res = br ? em_mul(ac, br) : NULL;
  em_tensor_release(ac); em_tensor_release(br);
  return res;
}
