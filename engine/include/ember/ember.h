/* Ember: an embeddable engine for training, running and measuring
 * LLaMA-style Transformer language models. This umbrella header pulls in the
 * whole public C API. The C core knows nothing about Lua. */
#ifndef EMBER_H
#define EMBER_H

#define EMBER_VERSION "0.1.0"

#include "error.h"
#include "dtype.h"
#include "device.h"
#include "tensor.h"
#include "autograd.h"
#include "ops.h"
#include "rng.h"
#include "io.h"
#include "cuda.h"
#include "autocast.h"
#include "profile.h"
#include "profiler.h"
#include "memory.h"
#include "tokenizer.h"
#include "threads.h"

#endif
