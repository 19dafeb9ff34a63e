/* ember/cuda.h (and the copy launchers of kernels/copy.h) in builds without
 * CUDA: queries answer "none" (no devices, not capturing, not pinned),
 * everything else fails with "<op>: this build of Ember has no CUDA backend".
 * The call-site hook and the TF32 flag work anyway (they are plain state). */
#ifndef EMBER_CUDA
#include "internal.h"
#include "../kernels/copy.h"

static int no_cuda(const char *op) {
  return em_error("%s: this build of Ember has no CUDA backend (rebuild with -DEMBER_CUDA=ON)", op);
}

int em_cuda_available(void) { return 0; }
int em_cuda_device_count(void) { return 0; }
int em_cuda_compiled(void) { return 0; }

int em_cuda_set_device(int device) { EM_UNUSED(device); return no_cuda("set_device"); }
int em_cuda_current_device(void) { return -1; }
int em_cuda_synchronize(int device) { EM_UNUSED(device); return no_cuda("synchronize"); }
const char *em_cuda_device_name(int device) { EM_UNUSED(device); no_cuda("device_name"); return NULL; }

em_stream *em_stream_new(int device) { EM_UNUSED(device); no_cuda("Stream"); return NULL; }
void em_stream_free(em_stream *s) { EM_UNUSED(s); }
em_stream *em_stream_current(int device) { EM_UNUSED(device); return NULL; }
void em_stream_set_current(int device, em_stream *s) { EM_UNUSED(device); EM_UNUSED(s); }
int em_stream_synchronize(em_stream *s) { EM_UNUSED(s); return no_cuda("Stream.synchronize"); }
int em_stream_wait_event(em_stream *s, em_event *e) { EM_UNUSED(s); EM_UNUSED(e); return no_cuda("Stream.wait_event"); }
void *em_stream_handle(em_stream *s) { EM_UNUSED(s); return NULL; }
em_event *em_event_new(bool enable_timing) { EM_UNUSED(enable_timing); no_cuda("Event"); return NULL; }
void em_event_free(em_event *e) { EM_UNUSED(e); }
int em_event_record(em_event *e, em_stream *s) { EM_UNUSED(e); EM_UNUSED(s); return no_cuda("Event.record"); }
int em_event_synchronize(em_event *e) { EM_UNUSED(e); return no_cuda("Event.synchronize"); }
int em_event_query(em_event *e) { EM_UNUSED(e); return no_cuda("Event.query"); }
int em_event_elapsed_ms(em_event *start, em_event *end, float *ms) {
  EM_UNUSED(start); EM_UNUSED(end); EM_UNUSED(ms);
  return no_cuda("Event.elapsed_time");
}

int em_cuda_memory_stats_get(int device, em_cuda_memory_stats *out) {
  EM_UNUSED(device);
  memset(out, 0, sizeof *out);
  return no_cuda("memory_stats");
}
void em_cuda_reset_peak_memory_stats(int device) { EM_UNUSED(device); }
void em_cuda_empty_cache(int device) { EM_UNUSED(device); }
void em_cuda_set_oom_callback(void (*fn)(void *ud), void *ud) { EM_UNUSED(fn); EM_UNUSED(ud); }
int em_cuda_memory_segments(int device, em_cuda_segment_info **out, int64_t *n) {
  EM_UNUSED(device);
  *out = NULL;
  *n = 0;
  return 0;                                    /* no allocator, no segments */
}
void em_cuda_segments_free(em_cuda_segment_info *s, int64_t n) { EM_UNUSED(n); free(s); }

em_tensor *em_pin_memory(em_tensor *t) { EM_UNUSED(t); no_cuda("pin_memory"); return NULL; }
bool em_is_pinned(const em_tensor *t) { EM_UNUSED(t); return false; }
/* CPU <-> CPU copies have nothing to overlap: a plain copy. */
int em_copy_nonblocking_(em_tensor *dst, em_tensor *src) { return em_copy_(dst, src); }

int em_graph_begin(int device) { EM_UNUSED(device); return no_cuda("graph"); }
em_graph *em_graph_end(void) { no_cuda("graph"); return NULL; }
int em_graph_replay(em_graph *g) { EM_UNUSED(g); return no_cuda("graph.replay"); }
void em_graph_free(em_graph *g) { EM_UNUSED(g); }
bool em_cuda_capturing(void) { return false; }
int em_cuda_check_not_capturing(const char *op) { EM_UNUSED(op); return 0; }

static const char *(*callsite_fn)(void);
void em_set_callsite_fn(const char *(*fn)(void)) { callsite_fn = fn; }
const char *em_callsite(void) {
  const char *s = callsite_fn ? callsite_fn() : NULL;
  return s && *s ? s : "(unknown call site)";
}

static bool allow_tf32;
void em_cuda_set_allow_tf32(bool on) { allow_tf32 = on; }
bool em_cuda_allow_tf32(void) { return allow_tf32; }

int em_copy_cuda(em_tensor *dst, em_tensor *src) { EM_UNUSED(dst); EM_UNUSED(src); return no_cuda("copy_"); }
int em_fill_cuda(em_tensor *dst, double v) { EM_UNUSED(dst); EM_UNUSED(v); return no_cuda("fill_"); }
int em_copy_device_cuda(em_tensor *dst, const em_tensor *src) {
  EM_UNUSED(dst); EM_UNUSED(src);
  return no_cuda("copy_");
}
#endif
