/* The measurement context: what the engine is doing right now, read by the
 * profiler, NVTX ranges and memory history so that every kernel and every
 * allocation can be attributed without stack unwinding.
 *
 *   op      the innermost op (EM_OP_SCOPE in engine/backend/backend.h)
 *   module  the nn.Module path being run ("layers.3.attn"; "" = the root),
 *           set by the Lua binding around Module calls while tracking is on;
 *           autograd nodes remember it, so backward kernels carry the module
 *           whose forward created them
 *   phase   forward / backward / optimizer (backward is set by em_backward)
 *
 * All strings are interned (em_intern): pointers stay valid for the process
 * lifetime and can be compared by address. Everything is thread-local. */
#ifndef EMBER_PROFILE_H
#define EMBER_PROFILE_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  EM_PHASE_NONE = 0,   /* outside any marked phase */
  EM_PHASE_FORWARD,
  EM_PHASE_BACKWARD,
  EM_PHASE_OPTIMIZER,
  EM_PHASE_COUNT
} em_phase;

/* "none", "forward", "backward", "optimizer" */
const char *em_phase_name(em_phase p);
/* Parse a phase name; -1 when unknown. */
int em_phase_parse(const char *name);

/* A stable copy of s (same pointer for equal strings); NULL on out of memory. */
const char *em_intern(const char *s);

const char *em_ctx_op(void);            /* NULL outside ops */
const char *em_ctx_module(void);        /* interned; "" outside modules */
em_phase em_ctx_phase(void);
/* The autograd node being run during a backward ("linear", "rope"...), else NULL. */
const char *em_ctx_grad_fn(void);

/* Setters return the previous value, for restoring. `module` must be interned. */
const char *em_ctx_set_module(const char *module);
em_phase em_ctx_set_phase(em_phase p);
const char *em_ctx_set_grad_fn(const char *op);

#ifdef __cplusplus
}
#endif
#endif
