/* The one entry point every op passes through: EM_OP_SCOPE("name") at the
 * top of an op names it for NVTX ranges, profiler counters and memory-history
 * context (wired up by the CUDA/measurement work); today it records the
 * current op name only, at the cost of two stores. */
#ifndef EMBER_OP_SCOPE_H
#define EMBER_OP_SCOPE_H

#ifdef __cplusplus
extern "C" thread_local const char *em_current_op;
#else
extern _Thread_local const char *em_current_op;
#endif

typedef struct { const char *prev; } em_op_scope_t;
static inline em_op_scope_t em_op_scope_enter(const char *name) {
  em_op_scope_t s = {em_current_op};
  em_current_op = name;
  return s;
}
static inline void em_op_scope_exit(em_op_scope_t *s) { em_current_op = s->prev; }

#define EM_OP_SCOPE(name) \
  em_op_scope_t em__scope __attribute__((cleanup(em_op_scope_exit))) = em_op_scope_enter(name)

#endif
