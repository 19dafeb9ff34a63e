/* Streams and events: thin handles around cudaStream_t / cudaEvent_t.
 *
 * Every op launches on em_stream_current(device), a thread-local choice per
 * device; unset, it is the device's default (legacy) stream, as in PyTorch.
 * Streams made here are non-blocking (no implicit ordering with the default
 * stream): order them with events (wait_event). Events time with
 * cudaEventElapsedTime (ms, ~0.5 us resolution). No kernels here. */
#include <cuda_runtime.h>
#include "runtime.h"
#include "backend.h"

struct em_stream {
  cudaStream_t s;
  int device;
  bool owned;
};

struct em_event {
  cudaEvent_t e;
  int device;
  bool timing;
  bool recorded;
};

/* The default (legacy) stream of each device, as a handle that is never freed. */
static struct DefaultStreams {
  em_stream s[EM_CUDA_MAX_DEVICES];
  DefaultStreams() { for (int i = 0; i < EM_CUDA_MAX_DEVICES; i++) s[i] = em_stream{0, i, false}; }
} default_streams;
static thread_local em_stream *tl_current[EM_CUDA_MAX_DEVICES];

static int ck(cudaError_t e, const char *op, const char *what) {
  if (e == cudaSuccess) return 0;
  cudaGetLastError();
  return em_error("%s: %s failed: %s", op, what, cudaGetErrorString(e));
}

static int pick_device(const char *op, int device) {
  if (device < 0) device = em_cuda_current_device();
  if (em_cuda_check_device(op, device)) return -1;
  return device;
}

/* ---- streams ---- */

extern "C" em_stream *em_stream_new(int device) {
  device = pick_device("Stream", device);
  if (device < 0) return NULL;
  EmDeviceGuard g(device);
  cudaStream_t s;
  if (ck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "Stream", "cudaStreamCreate")) return NULL;
  em_stream *st = new em_stream{s, device, true};
  return st;
}

static void destroy_stream(void *arg) {
  em_stream *s = (em_stream *)arg;
  EmDeviceGuard g(s->device);
  em_stream_counters_drop(s->device, s->s);
  cudaStreamDestroy(s->s);   /* pending work still completes */
  cudaGetLastError();
  delete s;
}

extern "C" void em_stream_free(em_stream *s) {
  if (!s || !s->owned) return;
  if (tl_current[s->device] == s) tl_current[s->device] = NULL;
  em_cuda_defer(destroy_stream, s);
}

extern "C" em_stream *em_stream_current(int device) {
  if (device < 0) device = em_cuda_current_device();
  if (device < 0 || device >= EM_CUDA_MAX_DEVICES) device = 0;
  return tl_current[device] ? tl_current[device] : &default_streams.s[device];
}

extern "C" void em_stream_set_current(int device, em_stream *s) {
  if (s) device = s->device;             /* a stream belongs to one device */
  else if (device < 0) device = em_cuda_current_device();
  if (device < 0 || device >= EM_CUDA_MAX_DEVICES) return;
  tl_current[device] = (s && s->owned) ? s : NULL;
}

extern "C" void *em_stream_handle(em_stream *s) { return s ? (void *)s->s : NULL; }

extern "C" void *em_cuda_cur_stream_handle(int device) { return em_stream_handle(em_stream_current(device)); }

extern "C" int em_stream_synchronize(em_stream *s) {
  if (!s) return em_error("Stream.synchronize: expected a stream");
  if (em_cuda_check_not_capturing("Stream.synchronize")) return -1;
  EmDeviceGuard g(s->device);
  return ck(cudaStreamSynchronize(s->s), "Stream.synchronize", "cudaStreamSynchronize");
}

extern "C" int em_stream_wait_event(em_stream *s, em_event *e) {
  if (!s || !e) return em_error("Stream.wait_event: expected a stream and an event");
  EmDeviceGuard g(s->device);
  return ck(cudaStreamWaitEvent(s->s, e->e, 0), "Stream.wait_event", "cudaStreamWaitEvent");
}

/* ---- events ---- */

extern "C" em_event *em_event_new(bool enable_timing) {
  int device = pick_device("Event", -1);
  if (device < 0) return NULL;
  EmDeviceGuard g(device);
  cudaEvent_t e;
  if (ck(cudaEventCreateWithFlags(&e, enable_timing ? cudaEventDefault : cudaEventDisableTiming), "Event",
         "cudaEventCreate"))
    return NULL;
  return new em_event{e, device, enable_timing, false};
}

static void destroy_event(void *arg) {
  em_event *e = (em_event *)arg;
  EmDeviceGuard g(e->device);
  cudaEventDestroy(e->e);
  cudaGetLastError();
  delete e;
}

extern "C" void em_event_free(em_event *e) {
  if (e) em_cuda_defer(destroy_event, e);
}

extern "C" int em_event_record(em_event *e, em_stream *s) {
  if (!e) return em_error("Event.record: expected an event");
  if (!s) s = em_stream_current(e->device);
  if (s->device != e->device)
    return em_error("Event.record: the event belongs to cuda:%d but the stream to cuda:%d", e->device, s->device);
  EmDeviceGuard g(e->device);
  if (ck(cudaEventRecord(e->e, s->s), "Event.record", "cudaEventRecord")) return -1;
  e->recorded = true;
  return 0;
}

extern "C" int em_event_synchronize(em_event *e) {
  if (!e) return em_error("Event.synchronize: expected an event");
  if (em_cuda_check_not_capturing("Event.synchronize")) return -1;
  return ck(cudaEventSynchronize(e->e), "Event.synchronize", "cudaEventSynchronize");
}

extern "C" int em_event_query(em_event *e) {
  if (!e) return em_error("Event.query: expected an event");
  cudaError_t r = cudaEventQuery(e->e);
  if (r == cudaSuccess) return 1;
  if (r == cudaErrorNotReady) { cudaGetLastError(); return 0; }
  return ck(r, "Event.query", "cudaEventQuery");
}

extern "C" int em_event_elapsed_ms(em_event *start, em_event *end, float *ms) {
  if (!start || !end) return em_error("Event.elapsed_time: expected two events");
  if (!start->timing || !end->timing)
    return em_error("Event.elapsed_time: both events must be created with enable_timing=true");
  if (!start->recorded || !end->recorded)
    return em_error("Event.elapsed_time: both events must be recorded first (e:record())");
  cudaError_t r = cudaEventElapsedTime(ms, start->e, end->e);
  if (r == cudaErrorNotReady) {
    cudaGetLastError();
    return em_error("Event.elapsed_time: the events have not completed yet (call e:synchronize() first)");
  }
  return ck(r, "Event.elapsed_time", "cudaEventElapsedTime");
}
