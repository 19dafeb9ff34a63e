/* The out-of-line half of EM_OP_SCOPE (backend/backend.h): runs only while NVTX op
 * ranges, a profiler session or a graph capture are on. NVTX is pushed before the host clock
 * is read and popped after it, so the profiler's host times leave the NVTX
 * cost out. */
#include "profiler_internal.h"

int em_measure_flags = 0;

void em_op_scope_begin(em_op_scope_t *s, const char *name) {
  s->name = name;
  if (s->on & EM_MEASURE_NVTX) em_nvtx_op_push(name);
  if (s->on & EM_MEASURE_PROFILE) em_prof_scope_begin(s);
  if (s->on & EM_MEASURE_CAPTURE) em_capcost_scope_begin(s);
}

void em_op_scope_end(em_op_scope_t *s) {
  if (s->on & EM_MEASURE_CAPTURE) em_capcost_scope_end(s);
  if (s->on & EM_MEASURE_PROFILE) em_prof_scope_end(s);
  if (s->on & EM_MEASURE_NVTX) em_nvtx_op_pop();
}
