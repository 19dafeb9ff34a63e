/* The measurement context (see ember/profile.h) and the string intern table
 * behind it. The table only grows: module paths and op names are a few
 * hundred short strings per process. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "ember/profile.h"
#include "profiler_internal.h"

_Thread_local const char *em_current_op = NULL;
static _Thread_local const char *cur_module = "";
static _Thread_local em_phase cur_phase = EM_PHASE_NONE;
static _Thread_local const char *cur_grad_fn = NULL;

static const char *const PHASE_NAMES[EM_PHASE_COUNT] = {"none", "forward", "backward", "optimizer"};

const char *em_phase_name(em_phase p) {
  return (unsigned)p < EM_PHASE_COUNT ? PHASE_NAMES[p] : "none";
}

int em_phase_parse(const char *name) {
  for (int i = 0; i < EM_PHASE_COUNT; i++)
    if (name && strcmp(name, PHASE_NAMES[i]) == 0) return i;
  return -1;
}

const char *em_ctx_op(void) { return em_current_op; }
const char *em_ctx_module(void) { return cur_module; }
em_phase em_ctx_phase(void) { return cur_phase; }
const char *em_ctx_grad_fn(void) { return cur_grad_fn; }

const char *em_ctx_set_module(const char *m) {
  const char *prev = cur_module;
  cur_module = m ? m : "";
  return prev;
}

/* A phase change also closes/opens the phase's NVTX range and, while a
 * profile runs, its phase interval. */
em_phase em_ctx_set_phase(em_phase p) {
  em_phase prev = cur_phase;
  if (p == prev) return prev;
  cur_phase = p;
  em_nvtx_phase(prev, p);
  em_prof_phase_change(prev, p);
  return prev;
}

const char *em_ctx_set_grad_fn(const char *op) {
  const char *prev = cur_grad_fn;
  cur_grad_fn = op;
  return prev;
}

/* ---- interning: open addressing, FNV-1a, grows at 1/2 load ---- */

static pthread_mutex_t intern_lock = PTHREAD_MUTEX_INITIALIZER;
static char **slots;
static size_t n_slots, n_used;

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int grow(void) {
  size_t n = n_slots ? n_slots * 2 : 256;
  char **fresh = calloc(n, sizeof *fresh);
  if (!fresh) return -1;
  for (size_t i = 0; i < n_slots; i++) {
    if (!slots[i]) continue;
    size_t j = fnv1a(slots[i]) & (n - 1);
    while (fresh[j]) j = (j + 1) & (n - 1);
    fresh[j] = slots[i];
  }
  free(slots);
  slots = fresh;
  n_slots = n;
  return 0;
}

const char *em_intern(const char *s) {
  if (!s) return NULL;
  if (!*s) return "";
  pthread_mutex_lock(&intern_lock);
  const char *out = NULL;
  if ((n_used + 1) * 2 > n_slots && grow()) goto done;
  size_t j = fnv1a(s) & (n_slots - 1);
  while (slots[j]) {
    if (strcmp(slots[j], s) == 0) { out = slots[j]; goto done; }
    j = (j + 1) & (n_slots - 1);
  }
  size_t len = strlen(s) + 1;
  char *copy = malloc(len);
  if (!copy) goto done;
  memcpy(copy, s, len);
  slots[j] = copy;
  n_used++;
  out = copy;
done:
  pthread_mutex_unlock(&intern_lock);
  return out;
}
