/* Streaming stores (engine/stream.h): em_stream_copy writes exactly the bytes
 * memcpy would, at every alignment of the destination and every length
 * (partial lines at both ends, none, or nothing but a partial line), and
 * touches nothing outside them; em_convert_stream gives em_convert's bytes
 * across its buffer's pieces; the threshold setter returns the old value;
 * em_stream_read ORs every byte it is given and none past them. */
#include <stdint.h>
#include <stdlib.h>
#include "test.h"
#include "stream.h"

TEST(copy_matches_memcpy) {
  enum { CAP = 3 * EM_STREAM_PIECE + 256 };
  unsigned char *src = aligned_alloc(64, CAP), *dst = aligned_alloc(64, CAP + 128);
  for (int i = 0; i < CAP; i++) src[i] = (unsigned char)(i * 131 + 7);
  int64_t lens[] = {0, 1, 63, 64, 65, 127, 200, 4096, CAP - 64};
  int ok = 1;
  for (int off = 0; off < 64; off += 7)
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
      memset(dst, 0xAB, CAP + 128);
      em_stream_copy(dst + off, src + 3, lens[l]);
      em_stream_fence();
      ok = ok && memcmp(dst + off, src + 3, (size_t)lens[l]) == 0;
      for (int i = 0; i < off; i++) ok = ok && dst[i] == 0xAB;                       /* nothing before */
      for (int64_t i = off + lens[l]; i < CAP + 128; i++) ok = ok && dst[i] == 0xAB;  /* nor after */
    }
  CHECK(ok);
  free(src);
  free(dst);
}

TEST(convert_matches_em_convert) {
  int64_t n = EM_STREAM_PIECE + 333;              /* several pieces and a ragged end */
  float *x = malloc(sizeof(float) * (size_t)n);
  uint16_t *a = malloc(2 * (size_t)n), *b = malloc(2 * (size_t)n + 2);
  for (int64_t i = 0; i < n; i++) x[i] = (float)(i - 500) * 0.37f;
  em_convert(a, EM_BF16, x, EM_F32, n);
  em_convert_stream(b + 1, EM_BF16, x, EM_F32, n);   /* a destination off the line */
  em_stream_fence();
  CHECK(memcmp(a, b + 1, 2 * (size_t)n) == 0);
  double *d = malloc(sizeof(double) * (size_t)n), *e = malloc(sizeof(double) * (size_t)n);
  em_convert(d, EM_F64, x, EM_F32, n);
  em_convert_stream(e, EM_F64, x, EM_F32, n);
  em_stream_fence();
  CHECK(memcmp(d, e, sizeof(double) * (size_t)n) == 0);
  free(x); free(a); free(b); free(d); free(e);
}

TEST(threshold) {
  int64_t def = em_set_stream_min(0);
  CHECK(em_stream_wanted(0) && em_stream_wanted(1));
  CHECK(em_set_stream_min(-5) == 0);
  CHECK(!em_stream_wanted((int64_t)1 << 40));
  CHECK(em_set_stream_min(1000) == -1);
  CHECK(!em_stream_wanted(999) && em_stream_wanted(1000));
  em_set_stream_min(def);
}

/* em_stream_read sees every byte: one set byte anywhere (the first, a later
 * 64 KiB segment's, the ragged tail's) shows in the OR at its place in the word. */
TEST(read_sees_every_byte) {
  int64_t n = ((int64_t)1 << 20) + 5;               /* 16 segments and 5 bytes: forks at 2+ threads */
  unsigned char *b = calloc((size_t)n, 1);
  CHECK(em_stream_read(b, n) == 0);
  CHECK(em_stream_read(b, 0) == 0);
  int64_t at[] = {0, 7, 65536 + 9, 700001, n - 5, n - 1};
  int ok = 1;
  for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
    b[at[i]] = 0x5A;
    ok = ok && em_stream_read(b, n) == (uint64_t)0x5A << (8 * (at[i] % 8));
    ok = ok && (at[i] < n - 5 || em_stream_read(b, n - 5) == 0);   /* bytes past the end are not read */
    b[at[i]] = 0;
  }
  CHECK(ok);
  free(b);
}

int main(void) {
  RUN(copy_matches_memcpy);
  RUN(convert_matches_em_convert);
  RUN(threshold);
  RUN(read_sees_every_byte);
  TEST_MAIN_END();
}
