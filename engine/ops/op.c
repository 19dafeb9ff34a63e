/* The one op path's helpers (op.h): autocast of an op's inputs, the
 * autograd record, and a broadcast operand made flat. Behaviour is exactly the hand-written sequences they
 * replace: em_autocast_upper / em_autocast_lower per input, then
 * em_node_new + set_input + save + finish. */
#include "op.h"

int em_op_autocast(em_op_args *a, em_autocast_list list, int n, em_tensor *const *ts) {
  a->n = n;
  a->owned = list != EM_AUTOCAST_NONE && em_autocast_enabled();
  for (int i = 0; i < n; i++) a->t[i] = NULL;
  for (int i = 0; i < n; i++) {
    if (!a->owned || !ts[i]) { a->t[i] = ts[i]; continue; }
    a->t[i] = list == EM_AUTOCAST_F32 ? em_autocast_upper(ts[i]) : em_autocast_lower(ts[i]);
    if (!a->t[i]) { em_op_args_release(a); return -1; }
  }
  return 0;
}

void em_op_args_release(em_op_args *a) {
  if (a->owned)
    for (int i = 0; i < a->n; i++) em_tensor_release(a->t[i]);
  a->n = 0;
  a->owned = false;
}

em_tensor *em_op_record(em_tensor *y, em_node **node, const char *op, em_backward_fn backward, int n_in,
                        em_tensor *const *in, int n_sv, em_tensor *const *sv) {
  if (node) *node = NULL;
  if (!y || !em_grad_needed(n_in, in)) return y;
  while (n_in > 0 && !in[n_in - 1]) n_in--;
  em_node *n = em_node_new(op, backward, n_in, 1);
  if (!n) { em_tensor_release(y); return NULL; }
  for (int i = 0; i < n_in; i++)
    if (in[i]) em_node_set_input(n, i, in[i]);
  for (int i = 0; i < n_sv; i++)
    if (sv[i]) em_node_save(n, sv[i]);
  if (node) *node = n;
  em_node_finish(n, y);
  return y;
}

em_tensor *em_op_broadcast_as(em_tensor *t, int ndim, const int64_t *shape, em_dtype dt) {
  if (t->ndim == ndim && memcmp(t->shape, shape, sizeof(int64_t) * (size_t)ndim) == 0)
    return em_contiguous_as(t, dt);
  int64_t st[EM_MAX_DIMS];
  em_broadcast_strides(t, ndim, shape, st);
  em_tensor *v = em_as_strided(t, ndim, shape, st, t->offset);
  em_tensor *r = v ? em_contiguous_as(v, dt) : NULL;
  em_tensor_release(v);
  return r;
}
