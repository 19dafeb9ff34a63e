/* The profiling session (ember/profiler.h): what op scopes, phase changes,
 * user ranges and the CUPTI side record between start and stop, and the
 * choice of backend.
 *
 * Records go into growable arrays under one mutex: an op scope appends one
 * 64-byte record at exit (tens of ns); threads other than the one that
 * started the session are recorded too, each with its own track id. A
 * scope, range or phase interval that began in another session (or before
 * this one) is told apart by the session generation and left out, so
 * start/stop can happen anywhere outside an op.
 *
 * Backends: CUPTI gives device timestamps per kernel (kernels/cupti.cu).
 * Without it, the events backend records a pair of CUDA events around each
 * op scope on the current stream and resolves them at stop: device time per
 * op, nested ops included. The host backend has host times only. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "internal.h"
#include "profiler_internal.h"

int64_t em_prof_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
  bool running;
  uint32_t gen;                        /* session generation (0: none yet) */
  em_prof_backend backend;
  char label[448], reason[256];
  int64_t t_start, lost;
  em_prof_op *ops; size_t n_ops, cap_ops;
  em_prof_gpu *gpu; size_t n_gpu, cap_gpu;
  em_prof_range *ranges; size_t n_ranges, cap_ranges;
  int64_t steps;
  int n_threads;
  uint32_t seq;                        /* op scopes numbered so far in this session */
} S;

static _Thread_local em_op_scope_t *tl_scope;   /* innermost measured scope */
static _Thread_local uint32_t tl_launches;      /* kernels launched by this thread */
static _Thread_local int tl_tid;
static _Thread_local uint32_t tl_tid_gen;
static _Thread_local int64_t tl_phase_t0;
static _Thread_local uint32_t tl_phase_gen;
#define MAX_RANGE_DEPTH 64
static _Thread_local struct { const char *name; int64_t t0; uint32_t gen; } tl_ranges[MAX_RANGE_DEPTH];
static _Thread_local int tl_n_ranges;

static bool profiling(void) {
  return (__atomic_load_n(&em_measure_flags, __ATOMIC_RELAXED) & EM_MEASURE_PROFILE) != 0;
}

static uint32_t session_gen(void) { return __atomic_load_n(&S.gen, __ATOMIC_RELAXED); }

/* Append x to a growable array (lock held). */
static int grow_push(void **arr, size_t *n, size_t *cap, size_t elem, const void *x) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 1024;
    void *p = realloc(*arr, c * elem);
    if (!p) { S.lost++; return -1; }
    *arr = p;
    *cap = c;
  }
  memcpy((char *)*arr + *n * elem, x, elem);
  (*n)++;
  return 0;
}

/* This thread's track id in the current session (lock held). */
static uint16_t thread_id(void) {
  if (tl_tid_gen != S.gen) { tl_tid = S.n_threads++; tl_tid_gen = S.gen; }
  return (uint16_t)tl_tid;
}

/* Keep a record only if the session it began in is still running. */
static void push_range(uint32_t gen, const char *name, int64_t t0, int64_t t1, int kind, em_phase ph) {
  pthread_mutex_lock(&lock);
  if (S.running && gen == S.gen) {
    em_prof_range r = {name, t0, t1, thread_id(), (uint8_t)kind, (uint8_t)ph};
    grow_push((void **)&S.ranges, &S.n_ranges, &S.cap_ranges, sizeof r, &r);
  }
  pthread_mutex_unlock(&lock);
}

/* ---------------- CUDA events backend ---------------- */

static em_event **ev_pool;              /* pairs: [2i] start, [2i+1] end; reused across sessions */
static size_t ev_cap, ev_used;

static int events_begin(void) {
  if (em_cuda_capturing()) return -1;   /* an event in a capture times nothing */
  pthread_mutex_lock(&lock);
  int idx = -1;
  if (ev_used + 2 > ev_cap) {
    size_t c = ev_cap ? ev_cap * 2 : 512;
    em_event **p = realloc(ev_pool, c * sizeof *p);
    if (p) {
      memset(p + ev_cap, 0, (c - ev_cap) * sizeof *p);
      ev_pool = p;
      ev_cap = c;
    }
  }
  if (ev_used + 2 <= ev_cap) { idx = (int)(ev_used / 2); ev_used += 2; }
  pthread_mutex_unlock(&lock);
  if (idx < 0) return -1;
  for (int k = 0; k < 2; k++)
    if (!ev_pool[2 * idx + k] && !(ev_pool[2 * idx + k] = em_event_new(true))) return -1;
  return em_event_record(ev_pool[2 * idx], NULL) ? -1 : idx;
}

static void events_resolve(em_prof_op *ops, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float ms;
    if (ops[i].ev < 0) continue;
    if (em_event_elapsed_ms(ev_pool[2 * ops[i].ev], ev_pool[2 * ops[i].ev + 1], &ms) == 0) ops[i].dev_ms = ms;
  }
  em_clear_error();
  ev_used = 0;
}

/* ---------------- op scopes (called by scope.c) ---------------- */

void em_prof_scope_begin(em_op_scope_t *s) {
  s->gen = session_gen();
  s->parent = tl_scope;
  tl_scope = s;
  s->child_ns = 0;
  s->child_launches = 0;
  s->launches0 = tl_launches;
  s->seq = __atomic_add_fetch(&S.seq, 1, __ATOMIC_RELAXED);
  s->fclass = 0;
  s->bytes = s->flops = s->child_bytes = s->child_flops = 0;
  s->ev = S.backend == EM_PROF_EVENTS ? events_begin() : -1;
  s->t0 = em_prof_now_ns();
}

void em_prof_scope_end(em_op_scope_t *s) {
  int64_t t1 = em_prof_now_ns();
  if (s->ev >= 0 && em_event_record(ev_pool[2 * s->ev + 1], NULL)) s->ev = -1;
  tl_scope = s->parent;
  int64_t incl = t1 - s->t0;
  uint32_t launches = tl_launches - s->launches0;
  int depth = 0;
  for (em_op_scope_t *p = s->parent; p; p = p->parent) depth++;
  if (s->parent) {
    s->parent->child_ns += incl;
    s->parent->child_launches += launches;
    s->parent->child_bytes += s->bytes + s->child_bytes;
    s->parent->child_flops += s->flops + s->child_flops;
  }
  em_prof_op r = {
    .op = s->name, .module = em_ctx_module(), .grad_fn = em_ctx_grad_fn(),
    .t0 = s->t0, .t1 = t1, .self_ns = incl - s->child_ns,
    .kernels = launches - s->child_launches, .kernels_incl = launches,
    .dev_ms = -1, .ev = s->ev, .seq = s->seq, .phase = (uint8_t)em_ctx_phase(),
    .depth = (uint8_t)(depth > 255 ? 255 : depth), .fclass = s->fclass,
    .bytes = s->bytes, .flops = s->flops, .bytes_incl = s->bytes + s->child_bytes,
    .flops_incl = s->flops + s->child_flops,
  };
  pthread_mutex_lock(&lock);
  if (S.running && s->gen == S.gen) {
    r.tid = thread_id();
    grow_push((void **)&S.ops, &S.n_ops, &S.cap_ops, sizeof r, &r);
  }
  pthread_mutex_unlock(&lock);
}

void em_prof_note_launch(void) { tl_launches++; }

uint32_t em_prof_current_seq(void) {
  em_op_scope_t *s = tl_scope;
  return s && s->gen == session_gen() ? s->seq : 0;
}

/* EM_OP_COST: into the innermost scope of this session, else of this
 * thread's graph capture (none: dropped). Both are one scope when a capture
 * runs inside a session. */
void em_op_cost_add(double bytes, double flops, int fclass) {
  em_op_scope_t *s = tl_scope;
  if (!s || s->gen != session_gen()) s = em_capcost_scope();
  if (!s) return;
  s->bytes += bytes > 0 ? bytes : 0;
  s->flops += flops > 0 ? flops : 0;
  if (flops > 0 && fclass >= 0 && fclass < EM_FLOP_CLASSES) s->fclass = (uint8_t)fclass;
}

/* ---------------- phases, ranges, marks ---------------- */

void em_prof_phase_change(em_phase prev, em_phase next) {
  if (!profiling()) return;
  int64_t now = em_prof_now_ns();
  uint32_t gen = session_gen();
  if (prev != EM_PHASE_NONE)
    push_range(gen, em_phase_name(prev), tl_phase_gen == gen ? tl_phase_t0 : S.t_start, now, EM_RANGE_PHASE, prev);
  (void)next;
  tl_phase_t0 = now;
  tl_phase_gen = gen;
}

void em_prof_range_push(const char *name) {
  if (!profiling()) return;
  if (tl_n_ranges >= MAX_RANGE_DEPTH) { tl_n_ranges++; return; }   /* too deep: counted, not kept */
  tl_ranges[tl_n_ranges].name = em_intern(name ? name : "");
  tl_ranges[tl_n_ranges].gen = session_gen();
  tl_ranges[tl_n_ranges].t0 = em_prof_now_ns();
  tl_n_ranges++;
}

void em_prof_range_pop(void) {
  if (tl_n_ranges == 0) return;
  tl_n_ranges--;
  if (tl_n_ranges >= MAX_RANGE_DEPTH || !profiling()) return;
  const char *name = tl_ranges[tl_n_ranges].name;
  if (name) push_range(tl_ranges[tl_n_ranges].gen, name, tl_ranges[tl_n_ranges].t0, em_prof_now_ns(),
                       EM_RANGE_USER, em_ctx_phase());
}

void em_prof_mark(const char *name) {
  if (!profiling()) return;
  const char *n = em_intern(name ? name : "");
  int64_t now = em_prof_now_ns();
  if (n) push_range(session_gen(), n, now, now, EM_RANGE_MARK, em_ctx_phase());
}

void em_profiler_step(void) {
  if (!profiling()) return;
  int64_t now = em_prof_now_ns();
  pthread_mutex_lock(&lock);
  if (S.running) S.steps++;
  pthread_mutex_unlock(&lock);
  push_range(session_gen(), "step", now, now, EM_RANGE_STEP, em_ctx_phase());
}

int em_prof_add_gpu(const em_prof_gpu *g) {
  pthread_mutex_lock(&lock);
  int rc = grow_push((void **)&S.gpu, &S.n_gpu, &S.cap_gpu, sizeof *g, g);
  pthread_mutex_unlock(&lock);
  return rc;
}

/* ---------------- start / stop ---------------- */

const char *em_prof_backend_name(em_prof_backend b) {
  return b == EM_PROF_CUPTI ? "cupti" : b == EM_PROF_EVENTS ? "events" : "host";
}

static bool known_backend(const char *b) {
  return !strcmp(b, "auto") || !strcmp(b, "cupti") || !strcmp(b, "events") || !strcmp(b, "host");
}

int em_profiler_init(void) {
  char why[256];
  if (!em_cuda_compiled()) return em_error("profiler.init: CUPTI needs the CUDA backend (this build has none)");
  if (!em_cuda_available()) return em_error("profiler.init: no CUDA device is available");
  if (em_cupti_init(why, sizeof why)) return em_error("profiler.init: CUPTI cannot be used: %s", why);
  return 0;
}

em_prof_backend em_profiler_auto_backend(const char **why) {
  static char buf[256];
  if (!em_cuda_compiled()) { *why = "this build has no CUDA backend"; return EM_PROF_HOST; }
  if (!em_cuda_available()) { *why = "no CUDA device is available"; return EM_PROF_HOST; }
  if (em_cupti_init(buf, sizeof buf)) { *why = buf; return EM_PROF_EVENTS; }
  *why = "";
  return EM_PROF_CUPTI;
}

/* Pick the backend for `req`; fills S.backend and S.reason. */
static int choose_backend(const char *req, int64_t t0) {
  bool any = !strcmp(req, "auto");
  S.reason[0] = 0;
  if (!strcmp(req, "host")) {
    S.backend = EM_PROF_HOST;
    snprintf(S.reason, sizeof S.reason, "backend \"host\" was asked for");
    return 0;
  }
  const char *none = !em_cuda_compiled() ? "this build has no CUDA backend"
                   : !em_cuda_available() ? "no CUDA device is available" : NULL;
  if (none) {
    if (!any) return em_error("profiler.start: backend \"%s\" needs a GPU: %s", req, none);
    S.backend = EM_PROF_HOST;
    snprintf(S.reason, sizeof S.reason, "%s", none);
    return 0;
  }
  if (!strcmp(req, "events")) {
    S.backend = EM_PROF_EVENTS;
    snprintf(S.reason, sizeof S.reason, "backend \"events\" was asked for");
    return 0;
  }
  char why[256];
  if (em_cupti_start(t0, why, sizeof why) == 0) {
    S.backend = EM_PROF_CUPTI;
    return 0;
  }
  if (!any) return em_error("profiler.start: CUPTI cannot be used: %s", why);
  S.backend = EM_PROF_EVENTS;
  snprintf(S.reason, sizeof S.reason, "%s", why);
  return 0;
}

int em_profiler_start(const em_prof_opts *opts) {
  const char *req = opts && opts->backend ? opts->backend : "auto";
  if (!known_backend(req))
    return em_error("profiler.start: unknown backend \"%s\" (expected \"auto\", \"cupti\", \"events\" or \"host\")", req);
  const char *env = getenv("EMBER_PROFILER_BACKEND");
  if (!strcmp(req, "auto") && env && *env) {
    if (!known_backend(env))
      return em_error("profiler.start: EMBER_PROFILER_BACKEND=\"%s\" is not \"auto\", \"cupti\", \"events\" or \"host\"", env);
    req = env;
  }
  if (em_profiler_running())
    return em_error("profiler.start: a profile is already running (call ember.profiler.stop() first)");
  if (em_cuda_capturing())
    return em_error("profiler.start: cannot start during CUDA graph capture (start before ember.cuda.graph)");
  /* work queued before the window must not count in it */
  if (em_cuda_available() && em_cuda_synchronize(-1)) return -1;
  if (choose_backend(req, em_prof_now_ns())) return -1;
  switch (S.backend) {
  case EM_PROF_CUPTI: snprintf(S.label, sizeof S.label, "CUPTI activity: device timestamps per kernel"); break;
  case EM_PROF_EVENTS:
    snprintf(S.label, sizeof S.label, "CUDA-event timing per op; CUPTI unavailable: %s", S.reason);
    break;
  default: snprintf(S.label, sizeof S.label, "host timing per op only (%s)", S.reason); break;
  }
  pthread_mutex_lock(&lock);
  S.gen++;
  S.n_ops = S.n_gpu = S.n_ranges = 0;
  S.steps = S.lost = 0;
  S.n_threads = 0;
  S.seq = 0;
  S.t_start = em_prof_now_ns();
  S.running = true;
  pthread_mutex_unlock(&lock);
  tl_phase_t0 = S.t_start;             /* the phase now running starts with the window */
  tl_phase_gen = S.gen;
  __atomic_fetch_or(&em_measure_flags, EM_MEASURE_PROFILE, __ATOMIC_RELAXED);
  return 0;
}

bool em_profiler_running(void) {
  pthread_mutex_lock(&lock);
  bool r = S.running;
  pthread_mutex_unlock(&lock);
  return r;
}

em_profile *em_profiler_stop(void) {
  if (!em_profiler_running()) {
    em_error("profiler.stop: no profile is running (call ember.profiler.start() first)");
    return NULL;
  }
  if (em_cuda_capturing()) {
    em_error("profiler.stop: cannot stop during CUDA graph capture (stop after ember.cuda.graph returns)");
    return NULL;
  }
  em_profile *p = calloc(1, sizeof *p);
  if (!p) { em_error_oom("out of memory: profiler.stop"); return NULL; }
  bool sync_failed = S.backend != EM_PROF_HOST && em_cuda_synchronize(-1) != 0;
  int64_t t_stop = em_prof_now_ns();
  em_phase ph = em_ctx_phase();
  if (ph != EM_PHASE_NONE && tl_phase_gen == S.gen)
    push_range(S.gen, em_phase_name(ph), tl_phase_t0, t_stop, EM_RANGE_PHASE, ph);
  __atomic_fetch_and(&em_measure_flags, ~EM_MEASURE_PROFILE, __ATOMIC_RELAXED);
  pthread_mutex_lock(&lock);
  S.running = false;
  pthread_mutex_unlock(&lock);
  if (S.backend == EM_PROF_CUPTI) p->dropped = em_cupti_stop(S.t_start, &p->before_window);
  if (S.backend == EM_PROF_EVENTS) events_resolve(S.ops, S.n_ops);

  pthread_mutex_lock(&lock);
  p->backend = S.backend;
  snprintf(p->label, sizeof p->label, "%s%s", S.label, sync_failed ? " (device synchronise failed at stop)" : "");
  snprintf(p->reason, sizeof p->reason, "%s", S.reason);
  p->t_start = S.t_start;
  p->t_stop = t_stop;
  p->ops = S.ops; p->n_ops = S.n_ops;
  p->gpu = S.gpu; p->n_gpu = S.n_gpu;
  p->ranges = S.ranges; p->n_ranges = S.n_ranges;
  p->steps = S.steps;
  p->dropped += S.lost;
  p->n_threads = S.n_threads;
  p->n_seq = __atomic_load_n(&S.seq, __ATOMIC_RELAXED);
  S.ops = NULL; S.gpu = NULL; S.ranges = NULL;
  S.n_ops = S.cap_ops = S.n_gpu = S.cap_gpu = S.n_ranges = S.cap_ranges = 0;
  pthread_mutex_unlock(&lock);
  if (sync_failed) em_clear_error();
  if (em_prof_index(p)) em_clear_error();   /* without the index: no roofline columns, tables still work */
  return p;
}

void em_profile_free(em_profile *p) {
  if (!p) return;
  free(p->ops);
  free(p->gpu);
  free(p->ranges);
  free(p->seq_op);
  free(p->seq_gpu_ns);
  free(p->graph_calls);
  free(p->gpu_graph_call);
  free(p);
}
