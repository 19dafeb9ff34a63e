/* The CUDA caching allocator (one per device), after PyTorch's.
 *
 * Why: cudaMalloc/cudaFree synchronise the device and cost 10-1000 us; a
 * training step allocates and frees hundreds of activations. So device
 * memory is taken from the driver in segments and kept: a freed block goes
 * back to a free list and the next request of a fitting size reuses it.
 *
 * - Sizes round up to 512 B. Requests <= 1 MiB come from the small pool,
 *   packed into 2 MiB segments; larger ones from the large pool: 1-10 MiB
 *   requests carve a 20 MiB segment, bigger ones get a segment of their size
 *   rounded to 2 MiB. A free block that is bigger than asked is split (small
 *   pool: when >= 512 B remain; large: when > 1 MiB remains); on free, a
 *   block merges with free neighbours of its segment.
 * - Free lists are per stream: a block freed after use on stream A is only
 *   reused by allocations made while A is current, so stream order alone
 *   makes reuse safe. Using a block on another stream than the one current
 *   at its allocation is the caller's business: make that stream wait (an
 *   event) before the block is freed, or synchronise. (No record_stream yet.)
 * - On cudaMalloc failure: release every fully free cached segment, ask the
 *   binding to collect garbage (em_cuda_set_oom_callback: a full Lua GC frees
 *   unreachable tensors), release again, retry once; then fail with an error
 *   that begins "out of memory" and names the sizes. Nothing is left broken.
 * - Graph capture (graph.cu): while a private pool is active on this thread,
 *   allocations come from segments owned by that pool (so replays find the
 *   same addresses and no one else can take them); an allocation on another
 *   stream than the capturing one is an error. Segments of the pool are
 *   cudaMalloc'ed in relaxed capture mode (as PyTorch does: a captured
 *   cudaMalloc gives the graph new addresses and is not replayed) and go back
 *   to the driver only when the graph is freed and every block is free.
 * - Every block allocation and free and every segment taken from or given
 *   back to the driver passes through record_event(): the single place
 *   memory history (engine/alloc/history.c) hooks in. Off, it costs one
 *   relaxed load of a flag. em_cuda_memory_segments() lists the segments and
 *   their blocks for snapshots. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>
#include "runtime.h"
#include "backend.h"
#include "ember/memory.h"

namespace {

constexpr size_t kRound = 512;                  /* every size is a multiple of this */
constexpr size_t kSmallSize = 1 << 20;          /* largest request of the small pool */
constexpr size_t kSmallSegment = 2 << 20;       /* small pool segments */
constexpr size_t kMidSegment = 20 << 20;        /* for 1..10 MiB requests */
constexpr size_t kMidLimit = 10 << 20;
constexpr size_t kLargeRound = 2 << 20;

struct FreeList;

struct Block {
  void *ptr;
  size_t size;
  cudaStream_t stream;
  bool allocated;
  Block *prev, *next;          /* neighbours within the segment */
  FreeList *list;              /* the free list it returns to */
};

struct BlockLess {
  bool operator()(const Block *a, const Block *b) const {
    if (a->stream != b->stream) return (uintptr_t)a->stream < (uintptr_t)b->stream;
    if (a->size != b->size) return a->size < b->size;
    return (uintptr_t)a->ptr < (uintptr_t)b->ptr;
  }
};

struct FreeList {
  bool small;
  em_mempool *owner;           /* NULL: the device's own pools */
  std::set<Block *, BlockLess> blocks;
};

/* A set of pools: the device's own, or a graph's private one. */
struct Pools {
  FreeList small, large;
  explicit Pools(em_mempool *owner) : small{true, owner, {}}, large{false, owner, {}} {}
  FreeList &for_size(size_t size) { return size <= kSmallSize ? small : large; }
};

struct DeviceAlloc {
  std::mutex m;
  Pools global{nullptr};
  std::unordered_map<void *, Block *> live;
  std::set<em_mempool *> pools;        /* graphs' private pools (for segment listings) */
  em_cuda_memory_stats st{};
};

std::atomic<DeviceAlloc *> devices[EM_CUDA_MAX_DEVICES];
std::mutex devices_m;

/* Made once, never destroyed (frees may come at exit): every alloc and free after the first reads it
 * without devices_m (an acquire load instead of a lock and an unlock per call). */
DeviceAlloc *dev_alloc(int device) {
  DeviceAlloc *d = devices[device].load(std::memory_order_acquire);
  if (d) return d;
  std::lock_guard<std::mutex> g(devices_m);
  d = devices[device].load(std::memory_order_relaxed);
  if (!d) devices[device].store(d = new DeviceAlloc(), std::memory_order_release);
  return d;
}

void (*oom_fn)(void *) = nullptr;
void *oom_ud = nullptr;
thread_local em_mempool *tl_pool = nullptr;

size_t round_size(size_t n) { return n < kRound ? kRound : (n + kRound - 1) / kRound * kRound; }
size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallSegment;
  if (size < kMidLimit) return kMidSegment;
  return (size + kLargeRound - 1) / kLargeRound * kLargeRound;
}
double mib(int64_t b) { return (double)b / (1024.0 * 1024.0); }

/* The one place every allocator event passes (memory history hooks in here). */
void record_event(em_mem_action kind, int device, void *ptr, size_t size, size_t requested, cudaStream_t stream) {
  if (em_mem_history_on()) em_mem_record(kind, device, ptr, size, requested, stream);
}

void bump_peaks(em_cuda_memory_stats &s) {
  if (s.allocated > s.peak_allocated) s.peak_allocated = s.allocated;
  if (s.reserved > s.peak_reserved) s.peak_reserved = s.reserved;
}

}  // namespace

struct em_mempool {
  int device;
  cudaStream_t stream;
  Pools pools{this};
  int64_t live_blocks = 0;
  bool closed = false;
};

namespace {

/* cudaMalloc; during this thread's capture in relaxed mode (see the top). */
cudaError_t driver_malloc(void **p, size_t size) {
  if (!tl_pool) return cudaMalloc(p, size);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaError_t e = cudaMalloc(p, size);
  cudaThreadExchangeStreamCaptureMode(&mode);
  return e;
}

/* A fitting free block of `stream` in `list`, removed from the list. */
Block *take_free(FreeList &list, cudaStream_t stream, size_t size) {
  Block key{nullptr, size, stream, false, nullptr, nullptr, nullptr};
  auto it = list.blocks.lower_bound(&key);
  if (it == list.blocks.end() || (*it)->stream != stream) return nullptr;
  Block *b = *it;
  list.blocks.erase(it);
  return b;
}

/* Split b to `size` when the rest is worth keeping; the rest goes free. */
void maybe_split(Block *b, size_t size) {
  size_t rest = b->size - size;
  if (b->list->small ? rest < kRound : rest <= kSmallSize) return;
  Block *r = new Block{(char *)b->ptr + size, rest, b->stream, false, b, b->next, b->list};
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  r->list->blocks.insert(r);
}

/* Return b to its free list, merged with free neighbours. */
void put_free(Block *b) {
  b->allocated = false;
  for (Block *n : {b->prev, b->next}) {
    if (!n || n->allocated) continue;
    b->list->blocks.erase(n);
    if (n == b->prev) {
      b->ptr = n->ptr;
      b->prev = n->prev;
      if (n->prev) n->prev->next = b;
    } else {
      b->next = n->next;
      if (n->next) n->next->prev = b;
    }
    b->size += n->size;
    delete n;
  }
  b->list->blocks.insert(b);
}

/* cudaFree every whole free segment of a free list. Caller holds the lock
 * and is not capturing. */
void release_segments(DeviceAlloc &d, int device, FreeList &list) {
  for (auto it = list.blocks.begin(); it != list.blocks.end();) {
    Block *b = *it;
    if (b->prev || b->next) { ++it; continue; }
    it = list.blocks.erase(it);
    cudaFree(b->ptr);
    cudaGetLastError();
    d.st.reserved -= (int64_t)b->size;
    d.st.cuda_free_count++;
    record_event(EM_MEM_SEGMENT_FREE, device, b->ptr, b->size, 0, b->stream);
    delete b;
  }
}

void release_cached(DeviceAlloc &d, int device) {
  if (tl_pool) return;                       /* no cudaFree inside a capture */
  EmDeviceGuard g(device);
  release_segments(d, device, d.global.small);
  release_segments(d, device, d.global.large);
}

/* Give a closed, fully free private pool back to the driver. Lock held. */
void release_pool(DeviceAlloc &d, em_mempool *p) {
  EmDeviceGuard g(p->device);
  d.pools.erase(p);
  release_segments(d, p->device, p->pools.small);
  release_segments(d, p->device, p->pools.large);
  delete p;
}
void release_pool_deferred(void *arg) {
  em_mempool *p = (em_mempool *)arg;
  DeviceAlloc &d = *dev_alloc(p->device);
  std::lock_guard<std::mutex> g(d.m);
  release_pool(d, p);
}

/* Find or make a block of `size` in `pools` for `stream`. Lock held. */
Block *find_or_grow(DeviceAlloc &d, int device, Pools &pools, cudaStream_t stream, size_t size, cudaError_t *err) {
  FreeList &list = pools.for_size(size);
  Block *b = take_free(list, stream, size);
  if (b) return b;
  size_t seg = segment_size(size);
  void *p = nullptr;
  EmDeviceGuard g(device);
  *err = driver_malloc(&p, seg);
  if (*err != cudaSuccess) { cudaGetLastError(); return nullptr; }
  d.st.reserved += (int64_t)seg;
  d.st.cuda_malloc_count++;
  bump_peaks(d.st);
  record_event(EM_MEM_SEGMENT_ALLOC, device, p, seg, 0, stream);
  return new Block{p, seg, stream, false, nullptr, nullptr, &list};
}

}  // namespace

extern "C" void *em_cuda_caching_alloc(size_t nbytes, int device) {
  if (em_cuda_check_device("alloc", device)) return nullptr;
  em_mempool *pool = tl_pool && tl_pool->device == device ? tl_pool : nullptr;
  cudaStream_t stream = (cudaStream_t)em_cuda_cur_stream_handle(device);
  const char *op = em_current_op ? em_current_op : "alloc";
  if (pool && stream != pool->stream) {
    em_error("%s: cannot allocate on cuda:%d from a stream other than the capturing one during CUDA graph "
             "capture (the memory would not come from the graph's private pool); called at %s",
             op, device, em_callsite());
    return nullptr;
  }
  if (nbytes > ((size_t)1 << 50)) nbytes = (size_t)1 << 50;   /* keeps rounding from wrapping; fails below */
  size_t size = round_size(nbytes);
  DeviceAlloc &d = *dev_alloc(device);
  Pools &pools = pool ? pool->pools : d.global;
  cudaError_t err = cudaSuccess;
  std::unique_lock<std::mutex> lock(d.m);
  Block *b = find_or_grow(d, device, pools, stream, size, &err);
  if (!b && !pool) {
    release_cached(d, device);
    b = find_or_grow(d, device, pools, stream, size, &err);
    if (!b && oom_fn) {
      lock.unlock();                 /* the callback frees tensors: that takes the lock */
      oom_fn(oom_ud);
      lock.lock();
      release_cached(d, device);
      b = find_or_grow(d, device, pools, stream, size, &err);
    }
  }
  if (!b) {
    d.st.oom_count++;
    int64_t alloc = d.st.allocated, resv = d.st.reserved;
    lock.unlock();
    size_t fr = 0, tot = 0;
    { EmDeviceGuard g(device); if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) cudaGetLastError(); }
    em_error_oom("out of memory: tried to allocate %.2f MiB on cuda:%d (allocated %.2f MiB, reserved %.2f MiB, "
                 "free %.2f MiB of %.2f MiB)%s%s%s%s", mib((int64_t)nbytes), device, mib(alloc), mib(resv),
                 mib((int64_t)fr), mib((int64_t)tot), pool ? " during CUDA graph capture" : "",
                 err == cudaErrorMemoryAllocation ? "" : " (", err == cudaErrorMemoryAllocation ? "" : cudaGetErrorString(err),
                 err == cudaErrorMemoryAllocation ? "" : ")");
    return nullptr;
  }
  maybe_split(b, size);
  b->allocated = true;
  d.live[b->ptr] = b;
  if (pool) pool->live_blocks++;
  d.st.allocated += (int64_t)b->size;
  d.st.alloc_count++;
  bump_peaks(d.st);
  record_event(EM_MEM_ALLOC, device, b->ptr, b->size, nbytes, stream);
  return b->ptr;
}

extern "C" void em_cuda_caching_free(void *p, int device) {
  if (!p || device < 0 || device >= EM_CUDA_MAX_DEVICES) return;
  DeviceAlloc &d = *dev_alloc(device);
  std::lock_guard<std::mutex> lock(d.m);
  auto it = d.live.find(p);
  if (it == d.live.end()) {
    fprintf(stderr, "ember: cuda:%d free of a pointer the allocator does not know (%p); ignored\n", device, p);
    return;
  }
  Block *b = it->second;
  d.live.erase(it);
  d.st.allocated -= (int64_t)b->size;
  d.st.free_count++;
  record_event(EM_MEM_FREE, device, b->ptr, b->size, 0, b->stream);
  em_mempool *pool = b->list->owner;         /* a graph's private pool, or NULL */
  put_free(b);
  if (pool && --pool->live_blocks == 0 && pool->closed) {
    if (tl_pool) em_cuda_defer(release_pool_deferred, pool);
    else release_pool(d, pool);
  }
}

/* ---- private pools (graph.cu) ---- */

extern "C" em_mempool *em_mempool_new(int device, void *stream) {
  em_mempool *p = new em_mempool();
  p->device = device;
  p->stream = (cudaStream_t)stream;
  DeviceAlloc &d = *dev_alloc(device);
  std::lock_guard<std::mutex> g(d.m);
  d.pools.insert(p);
  return p;
}

extern "C" void em_mempool_set_active(em_mempool *p) { tl_pool = p; }

extern "C" void em_mempool_close(em_mempool *p) {
  if (!p) return;
  DeviceAlloc &d = *dev_alloc(p->device);
  std::unique_lock<std::mutex> lock(d.m);
  p->closed = true;
  if (p->live_blocks > 0) return;             /* the last free releases it */
  if (tl_pool) { lock.unlock(); em_cuda_defer(release_pool_deferred, p); return; }
  release_pool(d, p);
}

/* ---- statistics and cache control (ember/cuda.h) ---- */

static int stats_device(const char *op, int device) {
  if (device < 0) device = em_cuda_current_device();
  if (em_cuda_check_device(op, device)) return -1;
  return device;
}

extern "C" int em_cuda_memory_stats_get(int device, em_cuda_memory_stats *out) {
  device = stats_device("memory_stats", device);
  if (device < 0) return -1;
  DeviceAlloc &d = *dev_alloc(device);
  std::lock_guard<std::mutex> g(d.m);
  *out = d.st;
  return 0;
}

extern "C" void em_cuda_reset_peak_memory_stats(int device) {
  device = stats_device("reset_peak_memory_stats", device);
  if (device < 0) return;
  DeviceAlloc &d = *dev_alloc(device);
  std::lock_guard<std::mutex> g(d.m);
  d.st.peak_allocated = d.st.allocated;
  d.st.peak_reserved = d.st.reserved;
}

extern "C" void em_cuda_empty_cache(int device) {
  device = stats_device("empty_cache", device);
  if (device < 0) return;
  DeviceAlloc &d = *dev_alloc(device);
  std::lock_guard<std::mutex> g(d.m);
  release_cached(d, device);                 /* a no-op while this thread captures */
}

/* ---- segment listing (memory snapshots) ---- */

static void add_free_blocks(const FreeList &l, std::vector<Block *> &out) {
  for (Block *b : l.blocks) out.push_back(b);
}

/* One segment from its first block: the blocks in address order. Lock held. */
static int describe_segment(int device, Block *head, em_cuda_segment_info *s) {
  int64_t n = 0;
  for (Block *b = head; b; b = b->next) n++;
  *s = em_cuda_segment_info{};
  s->blocks = (em_cuda_block_info *)malloc((size_t)n * sizeof *s->blocks);
  if (!s->blocks) return -1;
  s->device = device;
  s->addr = (uint64_t)(uintptr_t)head->ptr;
  s->stream = (uint64_t)(uintptr_t)head->stream;
  s->small = head->list->small;
  s->graph_pool = head->list->owner != nullptr;
  for (Block *b = head; b; b = b->next) {
    s->blocks[s->n_blocks++] = em_cuda_block_info{(uint64_t)(uintptr_t)b->ptr, b->size, b->allocated};
    s->size += b->size;
  }
  return 0;
}

extern "C" int em_cuda_memory_segments(int device, em_cuda_segment_info **out, int64_t *n) {
  *out = nullptr;
  *n = 0;
  std::vector<em_cuda_segment_info> segs;
  bool oom = false;
  for (int dev = 0; dev < EM_CUDA_MAX_DEVICES && !oom; dev++) {
    if (device >= 0 && dev != device) continue;
    DeviceAlloc *d;
    d = devices[dev].load(std::memory_order_acquire);
    if (!d) continue;                           /* never allocated on */
    std::lock_guard<std::mutex> g(d->m);
    std::vector<Block *> all;
    for (auto &kv : d->live) all.push_back(kv.second);
    add_free_blocks(d->global.small, all);
    add_free_blocks(d->global.large, all);
    for (em_mempool *p : d->pools) { add_free_blocks(p->pools.small, all); add_free_blocks(p->pools.large, all); }
    for (Block *b : all) {
      if (b->prev) continue;                    /* not the first block of its segment */
      em_cuda_segment_info s;
      if (describe_segment(dev, b, &s)) { oom = true; break; }
      segs.push_back(s);
    }
  }
  if (!oom && !segs.empty()) {
    *out = (em_cuda_segment_info *)malloc(segs.size() * sizeof **out);
    oom = !*out;
  }
  if (oom) {
    for (auto &s : segs) free(s.blocks);
    return em_error_oom("out of memory: cannot list the allocator's segments");
  }
  std::sort(segs.begin(), segs.end(), [](const em_cuda_segment_info &a, const em_cuda_segment_info &b) {
    return a.device != b.device ? a.device < b.device : a.addr < b.addr;
  });
  for (size_t i = 0; i < segs.size(); i++) (*out)[i] = segs[i];
  *n = (int64_t)segs.size();
  return 0;
}

extern "C" void em_cuda_segments_free(em_cuda_segment_info *s, int64_t n) {
  for (int64_t i = 0; s && i < n; i++) free(s[i].blocks);
  free(s);
}

extern "C" void em_cuda_set_oom_callback(void (*fn)(void *ud), void *ud) {
  oom_fn = fn;
  oom_ud = ud;
}
