/* Mixed precision: ember.autocast("bf16", fn). While autocast is on,
 * matmul/linear/attention cast their floating inputs to the autocast dtype
 * (bf16 or f16) and compute with f32 accumulation; norms, softmax, log_softmax,
 * cross-entropy and reductions compute in f32 and return f32. Master weights
 * and optimizer state stay f32. A weight (leaf) cast is cached for the whole
 * autocast region so one weight is converted once per region, not per use. */
#ifndef EMBER_AUTOCAST_H
#define EMBER_AUTOCAST_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Enter/leave a region. dtype: EM_BF16 or EM_F16. Regions nest; leaving the
 * outermost region clears the cast cache. */
int em_autocast_enter(em_dtype dtype);
void em_autocast_exit(void);
bool em_autocast_enabled(void);
em_dtype em_autocast_dtype(void);
/* For ops on the lower-precision list: returns t cast to the autocast dtype
 * (recorded by autograd when t requires grad), or t retained when autocast
 * is off, t is not floating point, or already that dtype. Casts of leaves
 * that require grad (parameters) are cached for the region while grad mode
 * is on; other tensors (and parameters under no_grad) share a cache of the
 * 4 most recent casts, so consecutive consumers of one activation cast it
 * once and no activation outlives the next few casts. */
em_tensor *em_autocast_lower(em_tensor *t);
/* For ops on the f32 list: t cast to f32 when autocast is on and t is bf16/f16. */
em_tensor *em_autocast_upper(em_tensor *t);
/* t in the region's dtype as a plain value, without autograd history, for
 * ops that record one node over the original input and write its gradient in
 * the input's dtype themselves (linear on CUDA). Cached like
 * em_autocast_lower's casts: q, k and v projections of one normed
 * activation cast it once. */
em_tensor *em_autocast_value(em_tensor *t);

/* Shadow weights. A parameter (an f32 contiguous leaf that requires grad)
 * that autocast casts in grad mode is marked as wanting a copy in the
 * region's dtype; the next AdamW step (em_adamw_, em_adamw_capturable_)
 * writes that copy in the same pass as the f32 update, rounded as the cast
 * rounds it (nearest even: the same bits), and autocast then uses it instead
 * of casting, for as long as the parameter's storage version is the one the
 * step left (any other in-place write, set_ or a new storage: cast again).
 * em_shadow_weights_(t, false) drops t's copy and keeps autocast from asking
 * again (ember.optim.AdamW{shadow_weights = false}); true lets it ask. */
int em_shadow_weights_(em_tensor *t, bool on);
/* t's shadow copy when it is current (not retained), else NULL. */
em_tensor *em_shadow_weight(const em_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
