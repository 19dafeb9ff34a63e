/* Chrome trace-event JSON of a profile (opens in ui.perfetto.dev and
 * chrome://tracing). Layout:
 *   pid 1 "host":  tid T       ops of thread T (nested by time)
 *                  tid 100+T   phases (forward / backward / optimizer)
 *                  tid 200+T   user ranges and marks (ember.nvtx.range, steps)
 *   pid 100+D "GPU D": tid S   kernels, copies and memsets of stream S
 * Times are microseconds from the start of the profile with three decimals
 * (ns resolution). Compactness: short arg keys (m module, p phase, g
 * autograd node, k kernels launched, b bytes), empty fields left out, one
 * event per line. An op event is ~100 bytes, a kernel ~150-200 (its name
 * dominates): a million events stay well under 200 MB. The file is written
 * to PATH.tmp.<pid> and renamed, so a reader never sees half a trace. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "internal.h"
#include "io/atomic_file.h"
#include "profiler_internal.h"

typedef struct {
  em_atomic_file f;
  char buf[1 << 16];
  size_t n;
  int64_t total;
  int err;
} writer;

static void flush(writer *w) {
  if (!w->err && w->n && em_atomic_write(&w->f, w->buf, w->n)) w->err = 1;
  w->total += (int64_t)w->n;
  w->n = 0;
}

static void put(writer *w, const char *s, size_t len) {
  while (len) {
    if (w->n == sizeof w->buf) flush(w);
    size_t k = EM_MIN(len, sizeof w->buf - w->n);
    memcpy(w->buf + w->n, s, k);
    w->n += k; s += k; len -= k;
  }
}

static void puts_(writer *w, const char *s) { put(w, s, strlen(s)); }

static void printf_(writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void printf_(writer *w, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (k > 0) put(w, tmp, (size_t)EM_MIN(k, (int)sizeof tmp - 1));
}

static void json_str(writer *w, const char *s) {
  put(w, "\"", 1);
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; put(w, e, 2); }
    else if (c < 0x20) printf_(w, "\\u%04x", c);
    else put(w, (const char *)&c, 1);
  }
  put(w, "\"", 1);
}

/* ns -> "123.456" microseconds (signed). */
static void us(writer *w, int64_t ns) {
  const char *sign = ns < 0 ? "-" : "";
  uint64_t a = ns < 0 ? (uint64_t)-ns : (uint64_t)ns;
  printf_(w, "%s%" PRIu64 ".%03u", sign, a / 1000, (unsigned)(a % 1000));
}

static void head(writer *w, const char *ph, int pid, int tid, int64_t ts, const char *name) {
  printf_(w, "{\"ph\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":", ph, pid, tid);
  us(w, ts);
  puts_(w, ",\"name\":");
  json_str(w, name);
}

static void arg(writer *w, bool *first, const char *key, const char *val) {
  if (!val || !*val) return;
  printf_(w, "%s\"%s\":", *first ? ",\"args\":{" : ",", key);
  json_str(w, val);
  *first = false;
}

static void arg_int(writer *w, bool *first, const char *key, int64_t v) {
  printf_(w, "%s\"%s\":%" PRId64, *first ? ",\"args\":{" : ",", key, v);
  *first = false;
}

static void end_event(writer *w, bool first) { puts_(w, first ? "},\n" : "}},\n"); }

static void meta(writer *w, int pid, int tid, const char *what, const char *name, int sort) {
  printf_(w, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"args\":{\"name\":", pid, tid, what);
  json_str(w, name);
  puts_(w, "}},\n");
  if (sort >= 0)
    printf_(w, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}},\n",
            pid, tid, sort);
}

static const char *phase_arg(int ph) { return ph == EM_PHASE_NONE ? NULL : em_phase_name((em_phase)ph); }

static void write_events(writer *w, const em_profile *p) {
  char name[64];
  meta(w, 1, 0, "process_name", "host", -1);
  for (int t = 0; t < EM_MAX(p->n_threads, 1); t++) {
    snprintf(name, sizeof name, "ranges (thread %d)", t);
    meta(w, 1, 200 + t, "thread_name", name, 3 * t);
    snprintf(name, sizeof name, "phases (thread %d)", t);
    meta(w, 1, 100 + t, "thread_name", name, 3 * t + 1);
    snprintf(name, sizeof name, "ops (thread %d)", t);
    meta(w, 1, t, "thread_name", name, 3 * t + 2);
  }
  for (size_t i = 0; i < p->n_ranges; i++) {
    const em_prof_range *r = &p->ranges[i];
    int tid = (r->kind == EM_RANGE_PHASE ? 100 : 200) + r->tid;
    bool first = true;
    if (r->kind == EM_RANGE_MARK || r->kind == EM_RANGE_STEP) {
      head(w, "i", 1, tid, r->t0 - p->t_start, r->name);
      puts_(w, ",\"s\":\"t\"");
    } else {
      head(w, "X", 1, tid, r->t0 - p->t_start, r->name);
      puts_(w, ",\"dur\":");
      us(w, r->t1 - r->t0);
      if (r->kind == EM_RANGE_USER) arg(w, &first, "p", phase_arg(r->phase));
    }
    end_event(w, first);
  }
  for (size_t i = 0; i < p->n_ops; i++) {
    const em_prof_op *o = &p->ops[i];
    bool first = true;
    head(w, "X", 1, o->tid, o->t0 - p->t_start, o->op);
    puts_(w, ",\"dur\":");
    us(w, o->t1 - o->t0);
    arg(w, &first, "m", o->module);
    arg(w, &first, "p", phase_arg(o->phase));
    arg(w, &first, "g", o->grad_fn);
    if (p->backend == EM_PROF_CUPTI && o->kernels) arg_int(w, &first, "k", o->kernels);
    if (o->dev_ms >= 0) {
      printf_(w, "%s\"dev_us\":", first ? ",\"args\":{" : ",");
      us(w, (int64_t)(o->dev_ms * 1e6));
      first = false;
    }
    end_event(w, first);
  }
  /* one process per device, one track per stream */
  uint32_t seen[64];
  int n_seen = 0;
  for (size_t i = 0; i < p->n_gpu; i++) {
    const em_prof_gpu *g = &p->gpu[i];
    bool known = false;
    for (int k = 0; k < n_seen && !known; k++) known = seen[k] == (g->device << 20 | (g->stream & 0xFFFFF));
    if (!known && n_seen < 64) {
      seen[n_seen++] = g->device << 20 | (g->stream & 0xFFFFF);
      snprintf(name, sizeof name, "GPU %u", g->device);
      meta(w, 100 + (int)g->device, 0, "process_name", name, -1);
      snprintf(name, sizeof name, "stream %u", g->stream);
      meta(w, 100 + (int)g->device, (int)g->stream, "thread_name", name, -1);
    }
    bool first = true;
    head(w, "X", 100 + (int)g->device, (int)g->stream, g->t0 - p->t_start, g->name);
    puts_(w, ",\"dur\":");
    us(w, g->t1 - g->t0);
    puts_(w, g->kind == EM_GPU_KERNEL ? ",\"cat\":\"kernel\"" : g->kind == EM_GPU_MEMCPY ? ",\"cat\":\"memcpy\""
                                                                                         : ",\"cat\":\"memset\"");
    arg(w, &first, "op", g->op);
    arg(w, &first, "m", g->module);
    arg(w, &first, "p", phase_arg(g->phase));
    arg(w, &first, "g", g->grad_fn);
    if (g->kind != EM_GPU_KERNEL) arg_int(w, &first, "b", (int64_t)g->bytes);
    if (g->graph) arg(w, &first, "graph", g->graph == EM_GPU_GRAPH_CAPTURED ? "replay" : "replay (no capture context)");
    end_event(w, first);
  }
}

int64_t em_profile_write_chrome_trace(const em_profile *p, const char *path) {
  writer *w = calloc(1, sizeof *w);    /* a 64 KiB buffer: not on the stack */
  if (!w) return em_error_oom("out of memory: export_chrome_trace");
  if (em_atomic_open(&w->f, path, "export_chrome_trace")) { free(w); return -1; }
  puts_(w, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"tool\":\"ember\",\"backend\":");
  json_str(w, em_prof_backend_name(p->backend));
  puts_(w, ",\"label\":");
  json_str(w, p->label);
  puts_(w, "},\n\"traceEvents\":[\n");
  write_events(w, p);
  /* a last metadata event, so the list needs no trailing-comma surgery */
  puts_(w, "{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":0}}\n]}\n");
  flush(w);
  /* a failed write removed the temporary and set the error */
  int64_t total = w->err ? -1 : em_atomic_commit(&w->f) ? -1 : w->total;
  free(w);
  return total;
}
