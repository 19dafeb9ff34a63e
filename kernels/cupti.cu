/* The CUPTI side of the profiler (its hooks: engine/backend/backend.h). No
 * kernels here: host code that nvcc compiles because it is CUDA-only.
 *
 * Two CUPTI APIs work together:
 *   - the Activity API delivers, in buffers we hand it, one record per
 *     kernel / memcpy / memset with device start/end timestamps and the
 *     correlation id of the API call that launched it;
 *   - the Callback API calls us at every launch-type runtime and driver API
 *     call (cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel(Ex),
 *     cudaGraphLaunch, cudaMemcpy*, cudaMemset*...), on the launching thread,
 *     where Ember's measurement context (op, module path, phase, autograd
 *     node) is still current: we keep it keyed by correlation id.
 * At stop the two are joined, so every kernel carries its module and phase.
 * Callbacks are selected by name (cuptiGetCallbackName), so new API
 * versions (_v2, _ptsz, Ex) are caught without a list of ids. A runtime
 * launch also raises driver callbacks; both ids are kept (a record may
 * carry either), but a launch is counted once.
 *
 * CUDA graphs: a replayed kernel carries graphNodeId. Nodes created while
 * Ember captures (em_cuda_capturing) get the context of the op that
 * launched them; instantiation clones them (GRAPHNODE_CLONED) and the clone
 * inherits it, with the capture call id that finds the cost the op declared
 * (engine/profile/capture_cost.c; each mapped node holds a reference to
 * it). That needs CUPTI subscribed during the capture: any earlier
 * profiler start or ember.profiler.init(). Otherwise replayed kernels keep
 * the replay's context (op "graph_replay") and are labelled so.
 *
 * libcupti is dlopen'ed, not linked: a machine without it still runs Ember,
 * and the profiler falls back to CUDA events with the dlopen error as the
 * reason. Timestamps: a timestamp callback makes CUPTI use our clock
 * (CLOCK_MONOTONIC, as the host records); with an older libcupti, an
 * offset measured at start is applied instead. */
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>
#include "ember/cuda.h"
#include "backend.h"

namespace {

/* Record layouts of the CUPTI we compile against (the fields read here exist in every version since CUDA 12). */
#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 KernelRecord;
#else
typedef CUpti_ActivityKernel9 KernelRecord;
#endif
typedef CUpti_ActivityMemcpy6 MemcpyRecord;
typedef CUpti_ActivityMemset4 MemsetRecord;

/* ---- the library, loaded by hand ---- */
struct Api {
  void *lib;
  CUptiResult (*GetVersion)(uint32_t *);
  CUptiResult (*GetResultString)(CUptiResult, const char **);
  CUptiResult (*Subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
  CUptiResult (*EnableCallback)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
  CUptiResult (*GetCallbackName)(CUpti_CallbackDomain, uint32_t, const char **);
  CUptiResult (*ActivityEnable)(CUpti_ActivityKind);
  CUptiResult (*ActivityDisable)(CUpti_ActivityKind);
  CUptiResult (*ActivityRegisterCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
  CUptiResult (*ActivityFlushAll)(uint32_t);
  CUptiResult (*ActivityGetNextRecord)(uint8_t *, size_t, CUpti_Activity **);
  CUptiResult (*ActivityGetNumDroppedRecords)(CUcontext, uint32_t, size_t *);
  CUptiResult (*GetTimestamp)(uint64_t *);
  CUptiResult (*GetGraphNodeId)(CUgraphNode, uint64_t *);
  CUptiResult (*ActivityRegisterTimestampCallback)(CUpti_TimestampCallbackFunc);   /* optional */
} api;

struct Ctx {
  const char *op, *module, *grad_fn;
  uint8_t phase;
  uint32_t seq;                         /* the op scope's seq in the session that launched it */
  uint32_t cap;                         /* a graph node's capture call id (its cost: capture_cost.c) */
};

struct Raw {
  uint64_t start, end, bytes, graph_node;
  const char *name;                     /* CUPTI's (mangled) kernel name */
  uint32_t corr, corr2, device, stream; /* corr2: a memcpy's runtime correlation id */
  uint8_t kind, copy_kind;
};

enum : uint8_t { CB_NONE = 0, CB_KERNEL, CB_GRAPH, CB_COPY };

std::mutex init_mu, launch_mu, raw_mu, node_mu;
int init_state;                          /* 0 not tried, 1 ready, -1 unavailable */
char init_why[256];
CUpti_SubscriberHandle subscriber;
uint8_t rt_kind[CUPTI_RUNTIME_TRACE_CBID_SIZE], drv_kind[CUPTI_DRIVER_TRACE_CBID_SIZE];
std::atomic<bool> recording{false};
bool own_clock;                          /* CUPTI timestamps are CLOCK_MONOTONIC already */
int64_t ts_offset;                       /* else: cupti_ts - host_ns, measured at start */
/* One launch-type API call: its correlation id, the id of the runtime call it
 * runs under (itself when none: one id per launch whichever record carries
 * which), and the context. */
struct Launch {
  uint32_t corr, launch;
  Ctx ctx;
};
std::vector<Launch> launches;
std::vector<Raw> raws;
size_t dropped;
std::unordered_map<uint64_t, Ctx> node_ctx;   /* graph node id -> capture-time context (kept across sessions) */
std::unordered_map<const char *, const char *> short_names;
thread_local int tl_in_runtime;          /* inside a runtime launch/copy call on this thread */
thread_local uint32_t tl_runtime_corr;   /* ... whose correlation id is this */

const char *result_str(CUptiResult r) {
  const char *s = nullptr;
  if (api.GetResultString && api.GetResultString(r, &s) == CUPTI_SUCCESS && s) return s;
  return "unknown CUPTI error";
}

Ctx current_ctx() {
  return Ctx{em_ctx_op(), em_ctx_module(), em_ctx_grad_fn(), (uint8_t)em_ctx_phase(), em_prof_current_seq(),
             em_capcost_call()};
}

uint64_t CUPTIAPI monotonic_ns() { return (uint64_t)em_prof_now_ns(); }

/* ---- callbacks ---- */

void on_graph_node(CUpti_CallbackId id, const CUpti_ResourceData *rd) {
  const CUpti_GraphData *gd = (const CUpti_GraphData *)rd->resourceDescriptor;
  if (!gd) return;
  uint64_t node = 0, orig = 0;
  if (api.GetGraphNodeId(gd->node, &node) != CUPTI_SUCCESS) return;
  std::lock_guard<std::mutex> g(node_mu);
  /* each mapped node holds a reference to its capture call's cost */
  if (id == CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED) {
    if (!em_cuda_capturing() || node_ctx.count(node)) return;
    Ctx c = current_ctx();              /* a launch inside Ember's capture */
    node_ctx[node] = c;
    em_capcost_ref(c.cap, +1);
  } else if (id == CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED) {
    if (api.GetGraphNodeId(gd->originalNode, &orig) != CUPTI_SUCCESS || node_ctx.count(node)) return;
    auto it = node_ctx.find(orig);
    if (it == node_ctx.end()) return;
    node_ctx[node] = it->second;
    em_capcost_ref(it->second.cap, +1);
  } else if (id == CUPTI_CBID_RESOURCE_GRAPHNODE_DESTROY_STARTING) {
    auto it = node_ctx.find(node);
    if (it == node_ctx.end()) return;
    em_capcost_ref(it->second.cap, -1);
    node_ctx.erase(it);
  }
}

void CUPTIAPI on_callback(void *, CUpti_CallbackDomain dom, CUpti_CallbackId id, const void *data) {
  if (dom == CUPTI_CB_DOMAIN_RESOURCE) {
    on_graph_node(id, (const CUpti_ResourceData *)data);
    return;
  }
  const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
  bool runtime = dom == CUPTI_CB_DOMAIN_RUNTIME_API;
  uint8_t kind = runtime ? (id < CUPTI_RUNTIME_TRACE_CBID_SIZE ? rt_kind[id] : CB_NONE)
                         : (dom == CUPTI_CB_DOMAIN_DRIVER_API && id < CUPTI_DRIVER_TRACE_CBID_SIZE ? drv_kind[id]
                                                                                                  : CB_NONE);
  if (kind == CB_NONE) return;
  if (cb->callbackSite == CUPTI_API_EXIT) {
    if (runtime && tl_in_runtime > 0) tl_in_runtime--;
    return;
  }
  bool nested = !runtime && tl_in_runtime > 0;   /* the driver call under a runtime call */
  if (runtime && tl_in_runtime++ == 0) tl_runtime_corr = cb->correlationId;
  if (!recording.load(std::memory_order_relaxed)) return;
  {
    std::lock_guard<std::mutex> g(launch_mu);
    launches.push_back(Launch{cb->correlationId, nested ? tl_runtime_corr : cb->correlationId, current_ctx()});
  }
  if (kind == CB_KERNEL && !nested) em_prof_note_launch();
}

void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
  *size = 8u << 20;
  *buf = (uint8_t *)aligned_alloc(8, *size);
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t, size_t valid) {
  std::vector<Raw> got;
  CUpti_Activity *rec = nullptr;
  while (buf && api.ActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    Raw r{};
    switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const KernelRecord *k = (const KernelRecord *)rec;
      r = Raw{k->start, k->end, 0, k->graphNodeId, k->name, k->correlationId, 0, k->deviceId, k->streamId,
              EM_GPU_KERNEL, 0};
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const MemcpyRecord *m = (const MemcpyRecord *)rec;
      r = Raw{m->start, m->end, m->bytes, m->graphNodeId, nullptr, m->correlationId, m->runtimeCorrelationId,
              m->deviceId, m->streamId, EM_GPU_MEMCPY, m->copyKind};
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const MemsetRecord *m = (const MemsetRecord *)rec;
      r = Raw{m->start, m->end, m->bytes, m->graphNodeId, nullptr, m->correlationId, 0, m->deviceId, m->streamId,
              EM_GPU_MEMSET, 0};
      break;
    }
    default: continue;
    }
    got.push_back(r);
  }
  size_t lost = 0;
  if (api.ActivityGetNumDroppedRecords) api.ActivityGetNumDroppedRecords(ctx, stream, &lost);
  {
    std::lock_guard<std::mutex> g(raw_mu);
    raws.insert(raws.end(), got.begin(), got.end());
    dropped += lost;
  }
  free(buf);
}

/* ---- set-up ---- */

template <typename F> bool sym(F &f, const char *name) {
  f = (F)dlsym(api.lib, name);
  return f != nullptr;
}

int load(char *why, size_t cap) {
  const char *env = getenv("EMBER_CUPTI_PATH");
  char major[32];
  snprintf(major, sizeof major, "libcupti.so.%d", CUDART_VERSION / 1000);
  const char *candidates[] = {env && *env ? env : major, env && *env ? nullptr : "libcupti.so",
#ifdef EMBER_CUPTI_LIB
                              env && *env ? nullptr : EMBER_CUPTI_LIB,
#endif
                              nullptr};
  std::string errors;
  for (const char *c : candidates) {
    if (!c) continue;
    api.lib = dlopen(c, RTLD_NOW | RTLD_LOCAL);
    if (api.lib) break;
    const char *e = dlerror();
    if (!errors.empty()) errors += "; ";
    errors += e ? e : c;
  }
  if (!api.lib) {
    snprintf(why, cap, "cannot load libcupti (%s)", errors.c_str());
    return -1;
  }
  bool ok = sym(api.GetVersion, "cuptiGetVersion") && sym(api.GetResultString, "cuptiGetResultString") &&
            sym(api.Subscribe, "cuptiSubscribe") && sym(api.EnableCallback, "cuptiEnableCallback") &&
            sym(api.GetCallbackName, "cuptiGetCallbackName") && sym(api.ActivityEnable, "cuptiActivityEnable") &&
            sym(api.ActivityDisable, "cuptiActivityDisable") &&
            sym(api.ActivityRegisterCallbacks, "cuptiActivityRegisterCallbacks") &&
            sym(api.ActivityFlushAll, "cuptiActivityFlushAll") &&
            sym(api.ActivityGetNextRecord, "cuptiActivityGetNextRecord") &&
            sym(api.ActivityGetNumDroppedRecords, "cuptiActivityGetNumDroppedRecords") &&
            sym(api.GetTimestamp, "cuptiGetTimestamp") && sym(api.GetGraphNodeId, "cuptiGetGraphNodeId");
  sym(api.ActivityRegisterTimestampCallback, "cuptiActivityRegisterTimestampCallback");
  if (!ok) {
    snprintf(why, cap, "libcupti lacks %s", dlerror());
    return -1;
  }
  uint32_t v = 0;
  if (api.GetVersion(&v) != CUPTI_SUCCESS || v < CUPTI_API_VERSION) {
    snprintf(why, cap, "libcupti's API version %u is older than the headers Ember was built with (%u)", v,
             (unsigned)CUPTI_API_VERSION);
    return -1;
  }
  return 0;
}

/* Launch-type API calls, by name: what the callbacks record. */
uint8_t classify(const char *name, bool runtime) {
  if (!name) return CB_NONE;
  if (strstr(name, "LaunchKernel") || strstr(name, "LaunchCooperativeKernel")) return CB_KERNEL;
  if (strstr(name, "GraphLaunch")) return CB_GRAPH;
  const char *copy = runtime ? "cudaMemcpy" : "cuMemcpy", *set = runtime ? "cudaMemset" : "cuMemset";
  if (!strncmp(name, copy, strlen(copy)) || !strncmp(name, set, strlen(set))) return CB_COPY;
  return CB_NONE;
}

int init_locked(char *why, size_t cap) {
  if (load(why, cap)) return -1;
  CUptiResult r = api.Subscribe(&subscriber, (CUpti_CallbackFunc)on_callback, nullptr);
  if (r != CUPTI_SUCCESS) {
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
      snprintf(why, cap, "another CUPTI client is attached (Nsight Systems or Compute?): %s", result_str(r));
    else
      snprintf(why, cap, "cuptiSubscribe failed: %s", result_str(r));
    return -1;
  }
  for (uint32_t id = 1; id < CUPTI_RUNTIME_TRACE_CBID_SIZE; id++) {
    const char *n = nullptr;
    if (api.GetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, id, &n) == CUPTI_SUCCESS) rt_kind[id] = classify(n, true);
  }
  for (uint32_t id = 1; id < CUPTI_DRIVER_TRACE_CBID_SIZE; id++) {
    const char *n = nullptr;
    if (api.GetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, id, &n) == CUPTI_SUCCESS) drv_kind[id] = classify(n, false);
  }
  const CUpti_CallbackId graph_cbs[] = {CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED, CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED,
                                        CUPTI_CBID_RESOURCE_GRAPHNODE_DESTROY_STARTING};
  for (CUpti_CallbackId id : graph_cbs) api.EnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, id);
  r = api.ActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (r != CUPTI_SUCCESS) {
    snprintf(why, cap, "cuptiActivityRegisterCallbacks failed: %s", result_str(r));
    return -1;
  }
  own_clock = api.ActivityRegisterTimestampCallback &&
              api.ActivityRegisterTimestampCallback(monotonic_ns) == CUPTI_SUCCESS;
  return 0;
}

/* Turn the launch callbacks on or off (the graph-node ones stay on). */
int enable_launch_callbacks(uint32_t on) {
  for (uint32_t id = 1; id < CUPTI_RUNTIME_TRACE_CBID_SIZE; id++)
    if (rt_kind[id] && api.EnableCallback(on, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, id) != CUPTI_SUCCESS)
      return -1;
  for (uint32_t id = 1; id < CUPTI_DRIVER_TRACE_CBID_SIZE; id++)
    if (drv_kind[id] && api.EnableCallback(on, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id) != CUPTI_SUCCESS)
      return -1;
  return 0;
}

const CUpti_ActivityKind KINDS[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                    CUPTI_ACTIVITY_KIND_MEMSET};

/* "void flash_fwd<64>(Params)" -> "flash_fwd<64>": the table name; CUPTI's
 * name is shared by all records of a kernel, so this runs once per kernel. */
const char *short_name(const char *mangled) {
  if (!mangled) return em_intern("(unnamed kernel)");
  auto it = short_names.find(mangled);
  if (it != short_names.end()) return it->second;
  int status = 0;
  char *d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : mangled;
  free(d);
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') depth++;
      else if (s[i] == '(' && --depth == 0) { if (i > 0) s.resize(i); break; }
    }
  }
  if (s.compare(0, 5, "void ") == 0) s.erase(0, 5);
  const char *out = em_intern(s.c_str());
  if (!out) out = mangled;
  short_names[mangled] = out;
  return out;
}

const char *copy_name(uint8_t kind, uint8_t copy_kind) {
  if (kind == EM_GPU_MEMSET) return "[memset]";
  switch (copy_kind) {
  case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[memcpy HtoD]";
  case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[memcpy DtoH]";
  case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[memcpy DtoD]";
  case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "[memcpy HtoH]";
  case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "[memcpy PtoP]";
  default: return "[memcpy]";
  }
}

}  // namespace

extern "C" int em_cupti_init(char *why, size_t cap) {
  std::lock_guard<std::mutex> g(init_mu);
  if (init_state == 0) {
    init_state = init_locked(init_why, sizeof init_why) == 0 ? 1 : -1;
  }
  if (init_state < 0) { snprintf(why, cap, "%s", init_why); return -1; }
  return 0;
}

extern "C" int em_cupti_start(int64_t t_start, char *why, size_t cap) {
  (void)t_start;
  if (em_cupti_init(why, cap)) return -1;
  {
    std::lock_guard<std::mutex> g(launch_mu);
    launches.clear();
  }
  {
    std::lock_guard<std::mutex> g(raw_mu);
    raws.clear();
    dropped = 0;
  }
  if (enable_launch_callbacks(1)) {
    enable_launch_callbacks(0);
    snprintf(why, cap, "cuptiEnableCallback failed");
    return -1;
  }
  for (size_t i = 0; i < sizeof KINDS / sizeof KINDS[0]; i++) {
    CUptiResult r = api.ActivityEnable(KINDS[i]);
    if (r != CUPTI_SUCCESS) {
      for (size_t j = 0; j < i; j++) api.ActivityDisable(KINDS[j]);
      enable_launch_callbacks(0);
      snprintf(why, cap, "cuptiActivityEnable failed: %s", result_str(r));
      return -1;
    }
  }
  uint64_t ts = 0;
  ts_offset = !own_clock && api.GetTimestamp(&ts) == CUPTI_SUCCESS ? (int64_t)ts - em_prof_now_ns() : 0;
  recording.store(true);
  return 0;
}

extern "C" int64_t em_cupti_stop(int64_t t_start, int64_t *before) {
  *before = 0;
  recording.store(false);
  enable_launch_callbacks(0);
  for (CUpti_ActivityKind k : KINDS) api.ActivityDisable(k);
  api.ActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);

  std::vector<Launch> ls;
  std::vector<Raw> rs;
  size_t lost;
  {
    std::lock_guard<std::mutex> g(launch_mu);
    ls.swap(launches);
  }
  {
    std::lock_guard<std::mutex> g(raw_mu);
    rs.swap(raws);
    lost = dropped;
  }
  std::unordered_map<uint32_t, const Launch *> by_corr(ls.size() * 2 + 1);
  for (const Launch &l : ls) by_corr.emplace(l.corr, &l);
  std::lock_guard<std::mutex> g(node_mu);
  for (const Raw &r : rs) {
    Ctx c{nullptr, "", nullptr, EM_PHASE_NONE, 0, 0};
    uint8_t graph = EM_GPU_EAGER;
    bool have = false;
    auto call = by_corr.find(r.corr);
    if (call == by_corr.end() && r.corr2) call = by_corr.find(r.corr2);
    if (r.graph_node) {
      graph = EM_GPU_GRAPH;
      auto it = node_ctx.find(r.graph_node);
      if (it != node_ctx.end()) {
        c = it->second;
        c.seq = 0;                      /* the capture's op scope, not one of this session: */
                                        /* its cost comes through c.cap (aggregate.c) */
        have = true;
        graph = EM_GPU_GRAPH_CAPTURED;
      }
    }
    if (!have && call != by_corr.end()) { c = call->second->ctx; have = true; }
    int64_t t0 = (int64_t)r.start - ts_offset, t1 = (int64_t)r.end - ts_offset;
    if (!have) {
      if (t0 < t_start) { (*before)++; continue; }   /* queued before the window */
      c.op = "(unattributed launch)";
    }
    em_prof_gpu out = {};
    out.name = r.kind == EM_GPU_KERNEL ? short_name(r.name) : copy_name(r.kind, r.copy_kind);
    out.op = c.op;
    out.module = c.module ? c.module : "";
    out.grad_fn = c.grad_fn;
    out.t0 = t0;
    out.t1 = t1 > t0 ? t1 : t0;
    out.bytes = r.bytes;
    out.device = r.device;
    out.stream = r.stream;
    out.kind = r.kind;
    out.phase = c.phase;
    out.graph = graph;
    out.op_seq = c.seq;
    out.cap_call = graph == EM_GPU_GRAPH_CAPTURED ? c.cap : 0;
    out.launch = call != by_corr.end() ? call->second->launch : r.corr;   /* replays: one id per cudaGraphLaunch */
    em_prof_add_gpu(&out);
  }
  return (int64_t)lost;
}
