/* CPU allocator: 64-byte aligned (AVX-512 friendly, one cache line).
 *
 * Blocks of 1 MiB and more are cached: a freed one waits in the bin of its
 * size class and the next request of that class takes it back. Fresh memory
 * costs a page fault per 4 KiB on first touch (about 0.3 ms per MiB on bare
 * metal, up to 6 ms per MiB in VMs that return freed pages to the host), and
 * a training step allocates the same large activations, logits and
 * gradients every step: without the cache their page faults cost more than
 * the ops that fill them. Size classes are four per power of two (at most
 * 25% rounding, 12% on average); the cache keeps at most EMBER_CPU_CACHE_MB
 * (default: a quarter of the machine's memory, at most 4 GiB), giving back
 * the blocks freed longest ago when a free would pass it (a run that moves to
 * other sizes does not keep the old ones forever), and everything when the
 * system refuses memory. Sanitizer builds skip the cache so use-after-free
 * stays visible.
 *
 * Blocks of at most SMALL_MAX bytes (one-element tensors, scalars, shapes:
 * the eager loop's many tiny results) are kept too, in 64-byte classes, up
 * to SMALL_KEEP_BYTES in all (a GC batch of ~10k results' headers and
 * data fits): posix_memalign splits a bigger chunk and frees the
 * pieces, and the Lua GC frees results in batches of thousands, so glibc
 * spent much of a tiny op's time in its bins (unlink, consolidate):
 * ember.empty(1) took 5065 instructions a call, 4318 with these bins
 * (callgrind, CPU build). Everything between is malloc's. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "../internal.h"

#define BIG ((size_t)1 << 20)          /* blocks from this size on are mmap'ed and cached */
#define NCLASS (4 * 64)

#if defined(__SANITIZE_ADDRESS__)
#define CACHE_DEFAULT_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CACHE_DEFAULT_OFF 1
#endif
#endif

/* A cached block's first bytes: its place in its class's bin and in the
 * cache's age order (newest first). */
typedef struct block {
  struct block *next, *prev;        /* bin */
  struct block *newer, *older;      /* age */
  size_t size;
  int cls;
} block;

#define SMALL_MAX 1024               /* blocks up to this many bytes are kept in small bins */
#define SMALL_KEEP_BYTES ((size_t)16 << 20)  /* at most 16 MiB of free small blocks in all */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t small_lock = PTHREAD_MUTEX_INITIALIZER;
/* The small bins hold chains: a magazine's blocks linked through their first
 * word, the chain's first block holding the next chain (word 1) and the
 * chain's length (word 2); blocks are at least 64 bytes. */
static void *small_bins[SMALL_MAX / 64];   /* class c: chains of blocks of 64·(c + 1) bytes */
static size_t small_bytes;                 /* bytes in the small bins */

/* Each thread's magazines in front of the small bins: a free pushes onto its
 * thread's list of the class, an allocation pops from it, and only a list
 * that runs empty or full takes the bins' lock, to swap a whole chain of
 * blocks at once (O(1): a chain knows its length). The bins' lock and unlock
 * were ~500 of a tiny op's ~5000 instructions (three blocks allocated, three
 * freed; five each for a recorded op). A thread's magazines go back to the
 * bins when it exits; the blocks in them (at most MAG_MAX a class) are
 * beyond SMALL_KEEP_BYTES. */
#define MAG_MAX 128
typedef struct { void *head; int n; } magazine;
static _Thread_local magazine mag[SMALL_MAX / 64];
static _Thread_local bool mag_registered;
static pthread_key_t mag_key;
static pthread_once_t mag_once = PTHREAD_ONCE_INIT;

static void free_chain(void *p, size_t k) {
  for (void *next; k > 0; k--, p = next) { next = *(void **)p; free(p); }
}

/* Class c's magazine (n-byte blocks) to the bins as one chain, or back to
 * malloc when the bins would pass SMALL_KEEP_BYTES; the magazine is empty after. */
static void mag_give(int c, size_t n) {
  magazine *m = &mag[c];
  if (!m->n) return;
  size_t bytes = n * (size_t)m->n;
  pthread_mutex_lock(&small_lock);
  bool kept = small_bytes + bytes <= SMALL_KEEP_BYTES;
  if (kept) {
    ((void **)m->head)[1] = small_bins[c];
    ((size_t *)m->head)[2] = (size_t)m->n;
    small_bins[c] = m->head;
    small_bytes += bytes;
  }
  pthread_mutex_unlock(&small_lock);
  if (!kept) free_chain(m->head, (size_t)m->n);
  m->head = NULL;
  m->n = 0;
}

static void mag_flush(void) {
  for (int c = 0; c < SMALL_MAX / 64; c++) mag_give(c, (size_t)(c + 1) * 64);
}

/* A later destructor's frees register again, and the key's destructor runs again. */
static void mag_exit(void *unused) { (void)unused; mag_flush(); mag_registered = false; }
static void mag_key_create(void) { pthread_key_create(&mag_key, mag_exit); }

/* A thread's first use: a key whose destructor flushes its magazines. */
static void mag_register(void) {
  pthread_once(&mag_once, mag_key_create);
  pthread_setspecific(mag_key, (void *)1);
  mag_registered = true;
}

/* An empty magazine of class c takes a chain from the bins (if any). */
static void mag_refill(int c, size_t n) {
  if (!mag_registered) mag_register();
  magazine *m = &mag[c];
  pthread_mutex_lock(&small_lock);
  void *p = small_bins[c];
  if (p) {
    small_bins[c] = ((void **)p)[1];
    m->head = p;
    m->n = (int)((size_t *)p)[2];
    small_bytes -= n * (size_t)m->n;
  }
  pthread_mutex_unlock(&small_lock);
}
static block *bins[NCLASS];
static block *newest, *oldest;
static size_t cached, cache_max = (size_t)-1;   /* -1: not read yet */

/* The class of a big request and the bytes it rounds to. */
static int size_class(size_t n, size_t *rounded) {
  int k = 63 - __builtin_clzll((unsigned long long)n);      /* 2^k <= n < 2^(k+1) */
  size_t step = (size_t)1 << (k - 2);
  size_t r = (n + step - 1) & ~(step - 1);
  int q = (int)(r >> (k - 2)) - 4;                          /* 0..4; 4 is 2^(k+1) */
  *rounded = r;
  return q == 4 ? 4 * (k + 1) : 4 * k + q;
}

static size_t read_cache_max(void) {
#ifdef CACHE_DEFAULT_OFF
  return 0;
#else
  const char *e = getenv("EMBER_CPU_CACHE_MB");
  if (e && *e) {
    char *end;
    long long mb = strtoll(e, &end, 10);
    if (*end == 0 && mb >= 0) return (size_t)mb << 20;
  }
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  size_t quarter = pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz / 4 : (size_t)1 << 30;
  return quarter < ((size_t)4 << 30) ? quarter : ((size_t)4 << 30);
#endif
}

/* Take b out of its bin and the age list (caller holds the lock). */
static void unlink_block(block *b) {
  if (b->prev) b->prev->next = b->next; else bins[b->cls] = b->next;
  if (b->next) b->next->prev = b->prev;
  if (b->newer) b->newer->older = b->older; else newest = b->older;
  if (b->older) b->older->newer = b->newer; else oldest = b->newer;
  cached -= b->size;
}

/* Unlink the oldest blocks until `room` more bytes fit under the cap; they
 * come back as a list (through ->next) for munmap outside the lock. */
static block *evict_for(size_t room) {
  block *out = NULL;
  while (oldest && cached + room > cache_max) {
    block *b = oldest;
    unlink_block(b);
    b->next = out;
    out = b;
  }
  return out;
}

static void unmap_list(block *b) {
  for (block *next; b; b = next) {
    next = b->next;
    munmap(b, b->size);
  }
}

static void *big_alloc(size_t n) {
  size_t r;
  int c = size_class(n, &r);
  pthread_mutex_lock(&lock);
  if (cache_max == (size_t)-1) cache_max = read_cache_max();
  block *b = bins[c];
  if (b) unlink_block(b);
  pthread_mutex_unlock(&lock);
  if (b) return b;
  void *p = mmap(NULL, r, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {                    /* the cache may be what is in the way */
    em_cpu_empty_cache();
    p = mmap(NULL, r, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  return p == MAP_FAILED ? NULL : p;
}

static void big_free(void *p, size_t n) {
  size_t r;
  int c = size_class(n, &r);
  if (r > cache_max) { munmap(p, r); return; }
  pthread_mutex_lock(&lock);
  block *gone = evict_for(r);
  block *b = p;
  *b = (block){bins[c], NULL, NULL, newest, r, c};
  if (bins[c]) bins[c]->prev = b;
  bins[c] = b;
  if (newest) newest->newer = b; else oldest = b;
  newest = b;
  cached += r;
  pthread_mutex_unlock(&lock);
  unmap_list(gone);
}

static bool use_big(size_t nbytes) {
#ifdef CACHE_DEFAULT_OFF
  return false;
#else
  return nbytes >= BIG;
#endif
}

static bool use_small(size_t n) {
#ifdef CACHE_DEFAULT_OFF
  (void)n;
  return false;
#else
  return n <= SMALL_MAX;
#endif
}

static __attribute__((noinline)) void *cpu_alloc_slow(size_t nbytes) {
  void *p = NULL;
  /* No object can exceed PTRDIFF_MAX (glibc refuses such sizes too); checking
   * first also keeps the round-up below from wrapping to a tiny size. */
  if (nbytes > (size_t)PTRDIFF_MAX - 63) return NULL;
  if (use_big(nbytes)) return big_alloc(nbytes);
  size_t n = (nbytes + 63) & ~(size_t)63;
  if (n == 0) n = 64;
  if (use_small(n)) {
    int c = (int)(n / 64) - 1;
    if (!mag[c].n) mag_refill(c, n);
    if (mag[c].n) {
      p = mag[c].head;
      mag[c].head = *(void **)p;
      mag[c].n--;
      return p;
    }
  }
  if (posix_memalign(&p, 64, n) != 0) return NULL;
  return p;
}

/* The common case first, in a frame of its own: a small block from this
 * thread's magazine (the slow path's big-block code made every call save
 * six registers). */
void *em_cpu_alloc(size_t nbytes) {
  if (nbytes - 1 < SMALL_MAX && use_small(nbytes)) {
    magazine *m = &mag[(nbytes - 1) / 64];
    if (m->n) {
      void *p = m->head;
      m->head = *(void **)p;
      m->n--;
      return p;
    }
  }
  return cpu_alloc_slow(nbytes);
}

/* Tensor and storage headers from the same small bins (zeroed, as calloc):
 * they come and go with every result, in the GC's batches. */
void *em_header_alloc(size_t nbytes) {
  void *p = em_cpu_alloc(nbytes);
  if (p) memset(p, 0, nbytes);
  return p;
}

void em_header_free(void *p, size_t nbytes) { em_cpu_free(p, nbytes); }

size_t em_cpu_alloc_size(size_t nbytes) {
  size_t r;
  if (use_big(nbytes) && nbytes <= (size_t)PTRDIFF_MAX - 63) { size_class(nbytes, &r); return r; }
  return nbytes ? (nbytes + 63) & ~(size_t)63 : 64;
}

void em_cpu_free(void *p, size_t nbytes) {
  if (p && use_big(nbytes)) { big_free(p, nbytes); return; }
  size_t n = nbytes ? (nbytes + 63) & ~(size_t)63 : 64;
  if (p && use_small(n)) {
    int c = (int)(n / 64) - 1;
    if (mag[c].n == MAG_MAX) mag_give(c, n);
    if (!mag_registered) mag_register();
    *(void **)p = mag[c].head;
    mag[c].head = p;
    mag[c].n++;
    return;
  }
  free(p);
}

size_t em_cpu_cached_bytes(void) {
  pthread_mutex_lock(&lock);
  size_t n = cached;
  pthread_mutex_unlock(&lock);
  return n;
}

void em_cpu_empty_cache(void) {
  pthread_mutex_lock(&lock);
  block *all = NULL;
  while (oldest) {
    block *b = oldest;
    unlink_block(b);
    b->next = all;
    all = b;
  }
  pthread_mutex_unlock(&lock);
  unmap_list(all);
  mag_flush();   /* this thread's magazines; another thread's (at most MAG_MAX blocks a class) stay */
  pthread_mutex_lock(&small_lock);
  for (int c = 0; c < SMALL_MAX / 64; c++) {
    for (void *p = small_bins[c], *next; p; p = next) {
      next = ((void **)p)[1];
      free_chain(p, ((size_t *)p)[2]);
    }
    small_bins[c] = NULL;
  }
  small_bytes = 0;
  pthread_mutex_unlock(&small_lock);
}
