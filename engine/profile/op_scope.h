/* The one entry point every op passes through: EM_OP_SCOPE("name") at the
 * top of an op names it for NVTX ranges, the profiler and memory-history
 * context. While nothing measures, a scope costs two stores, one load and
 * one predictable branch on entry and on exit; the measuring work (NVTX
 * push/pop, host timestamps, launch counts, CUDA events) is out of line in
 * engine/profile/scope.c and only runs while ember.nvtx or ember.profiler
 * switched it on. */
#ifndef EMBER_OP_SCOPE_H
#define EMBER_OP_SCOPE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" thread_local const char *em_current_op;
extern "C" {
#else
extern _Thread_local const char *em_current_op;
#endif

/* Bits of em_measure_flags: what a scope does besides naming its op. */
enum { EM_MEASURE_NVTX = 1, EM_MEASURE_PROFILE = 2 };
/* Written by ember.nvtx.enable and the profiler's start/stop, read relaxed. */
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

#ifdef __cplusplus
}
#endif

#define EM_OP_SCOPE(name)                                                \
  em_op_scope_t em__scope __attribute__((cleanup(em_op_scope_exit)));    \
  em_op_scope_enter(&em__scope, (name))

#endif
