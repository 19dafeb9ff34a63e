/* Linear backward's side stream (engine/ops/linear_side.c): fork the
 * current (main) stream of a device into a side stream, and join it back. */
#ifndef EMBER_OPS_LINEAR_SIDE_H
#define EMBER_OPS_LINEAR_SIDE_H

#include <stdbool.h>
#include "ember/cuda.h"

/* Whether a linear's backward on cuda:`device` forks: the switch is on and
 * device is the current device (events belong to it). -1 + error on a bad
 * EMBER_LINEAR_BWD_STREAM. */
int em_linear_side_wanted(int device, bool *yes);

/* Fork: the side stream waits for everything queued so far on the current
 * (main) stream, then becomes current; *main receives the main stream. What
 * the side stream's work uses must be allocated before the fork: nothing may
 * be allocated while it is current (a capture forbids it, and the block
 * would go to the side stream's free list). Makes the second cuBLASLt
 * workspace first. On error nothing is switched and nothing forked. */
int em_linear_side_fork(int device, em_stream **main);

/* Make main current again (no wait): what follows runs beside the side work. */
void em_linear_side_back(int device, em_stream *main);

/* Join: the current (main) stream waits for the side stream's work. Call it
 * after every successful fork, also when the side work failed: a capture
 * cannot end with a forked stream left unjoined. */
int em_linear_side_join(int device);

#endif
