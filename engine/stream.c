/* Streaming stores (engine/stream.h): AVX-512 where the CPU has it (one
 * instruction per line), else SSE2's 16-byte non-temporal store, which every
 * x86-64 has; elsewhere a plain memcpy. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel.h"
#include "stream.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_NT 1
int64_t em_stream_min = EM_STREAM_MIN_DEFAULT;
#else
int64_t em_stream_min = -1;   /* no streaming stores here: buffering would only add a copy */
#endif

int64_t em_set_stream_min(int64_t bytes) {
  int64_t old = em_stream_min;
  em_stream_min = bytes < 0 ? -1 : bytes;
  return old;
}

#ifdef HAVE_NT
__attribute__((target("avx512f"))) static void lines_avx512(char *d, const char *s, int64_t n) {
  for (int64_t i = 0; i < n; i += 64) _mm512_stream_si512((__m512i *)(d + i), _mm512_loadu_si512(s + i));
}

static void lines_sse2(char *d, const char *s, int64_t n) {
  for (int64_t i = 0; i < n; i += 64)
    for (int k = 0; k < 64; k += 16)
      _mm_stream_si128((__m128i *)(d + i + k), _mm_loadu_si128((const __m128i *)(s + i + k)));
}

static void (*stream_lines)(char *, const char *, int64_t) = lines_sse2;

__attribute__((constructor)) static void stream_init(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) stream_lines = lines_avx512;
  const char *e = getenv("EMBER_CPU_STREAM_MB");
  if (!e || !*e) return;
  if (strcmp(e, "off") == 0) { em_stream_min = -1; return; }
  char *end;
  long long mb = strtoll(e, &end, 10);
  if (*end == 0 && mb >= 0 && mb < ((long long)1 << 40)) em_stream_min = (int64_t)mb << 20;
  else fprintf(stderr, "ember: EMBER_CPU_STREAM_MB must be a number of MiB >= 0 or 'off', got '%s'; using %lld\n", e,
               (long long)(EM_STREAM_MIN_DEFAULT >> 20));
}
#endif

void em_stream_copy(void *dst, const void *src, int64_t bytes) {
#ifdef HAVE_NT
  char *d = dst;
  const char *s = src;
  int64_t head = (int64_t)((64 - ((uintptr_t)d & 63)) & 63);
  if (head > bytes) head = bytes;
  int64_t body = (bytes - head) & ~(int64_t)63;
  memcpy(d, s, (size_t)head);
  if (body) stream_lines(d + head, s + head, body);
  memcpy(d + head + body, s + head + body, (size_t)(bytes - head - body));
#else
  memcpy(dst, src, (size_t)bytes);
#endif
}

void em_convert_stream(void *dst, em_dtype dt, const void *src, em_dtype st, int64_t n) {
  int64_t des = (int64_t)em_dtype_size(dt), ses = (int64_t)em_dtype_size(st);
  if (dt == st) { em_stream_copy(dst, src, n * des); return; }
  _Alignas(64) char buf[EM_STREAM_PIECE];
  int64_t piece = EM_STREAM_PIECE / des;
  for (int64_t i = 0; i < n; i += piece) {
    int64_t k = n - i < piece ? n - i : piece;
    em_convert(buf, dt, (const char *)src + i * ses, st, k);
    em_stream_copy((char *)dst + i * des, buf, k * des);
  }
}

void em_stream_fence(void) {
#ifdef HAVE_NT
  _mm_sfence();
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

/* ---------------- the read stream ---------------- */

#define READ_SEG 65536   /* bytes a task */

/* OR of n words; eight independent lanes so the loads never wait on each other. */
static uint64_t or_words(const char *p, int64_t n) {
  uint64_t a[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) {
      uint64_t w;
      memcpy(&w, p + 8 * (i + k), 8);
      a[k] |= w;
    }
  for (; i < n; i++) {
    uint64_t w;
    memcpy(&w, p + 8 * i, 8);
    a[0] |= w;
  }
  return (a[0] | a[1]) | (a[2] | a[3]) | (a[4] | a[5]) | (a[6] | a[7]);
}

typedef struct { const char *p; int64_t bytes; _Atomic uint64_t acc; } read_job;

static void read_segments(void *ctx, int64_t s0, int64_t s1) {
  read_job *j = ctx;
  int64_t lo = s0 * READ_SEG, hi = s1 * READ_SEG < j->bytes ? s1 * READ_SEG : j->bytes;
  int64_t words = (hi - lo) / 8;
  uint64_t acc = or_words(j->p + lo, words), tail = 0;
  memcpy(&tail, j->p + lo + 8 * words, (size_t)(hi - lo - 8 * words));   /* only the last segment is ragged */
  atomic_fetch_or_explicit(&j->acc, acc | tail, memory_order_relaxed);   /* OR: any order gives the same bits */
}

uint64_t em_stream_read(const void *p, int64_t bytes) {
  if (bytes <= 0) return 0;
  read_job j = {.p = p, .bytes = bytes};
  atomic_init(&j.acc, 0);
  em_parallel_for((bytes + READ_SEG - 1) / READ_SEG, em_grain(READ_SEG / 8), read_segments, &j);
  return atomic_load(&j.acc);
}
