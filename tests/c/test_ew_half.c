/* The CPU elementwise loop's branch-free f16 conversions (engine/ops/ew_half.c)
 * give ember/half.h's scalar bits: f16 -> f32 for all 2^16 patterns, f32 ->
 * f16 (and bf16) for all 2^32 floats, in pieces of an odd length so the SIMD
 * loops' remainders run too. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include "test.h"
#include "ember/half.h"
#include "ember/ops.h"
#include "ops/ew_half.h"
#include "stream.h"

TEST(f16_to_f32_every_pattern) {
  static uint16_t h[65536];
  static float f[65536];
  for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
  em_ew_load_f16(f, h, 65536);
  int bad = 0;
  for (int i = 0; i < 65536; i++)
    if (em_f32_bits(f[i]) != em_f32_bits(em_f16_to_f32(h[i])) && bad++ < 5)
      fprintf(stderr, "f16 0x%04x -> 0x%08x, expected 0x%08x\n", i, em_f32_bits(f[i]), em_f32_bits(em_f16_to_f32(h[i])));
  CHECK(bad == 0);
}

TEST(f32_to_16_every_float) {
  enum { P = 4093 };
  static float f[P];
  static uint16_t h[P], b[P];
  int bad = 0;
  for (uint64_t base = 0; base < ((uint64_t)1 << 32); base += P) {
    int n = (int)(((uint64_t)1 << 32) - base < P ? ((uint64_t)1 << 32) - base : P);
    for (int i = 0; i < n; i++) f[i] = em_bits_f32((uint32_t)(base + (uint64_t)i));
    em_ew_store16(h, EM_F16, f, n);
    em_ew_store16(b, EM_BF16, f, n);
    for (int i = 0; i < n; i++) {
      if (h[i] != em_f32_to_f16(f[i]) && bad++ < 5)
        fprintf(stderr, "f32 0x%08x -> f16 0x%04x, expected 0x%04x\n", em_f32_bits(f[i]), h[i], em_f32_to_f16(f[i]));
      if (b[i] != em_f32_to_bf16(f[i]) && bad++ < 5)
        fprintf(stderr, "f32 0x%08x -> bf16 0x%04x, expected 0x%04x\n", em_f32_bits(f[i]), b[i], em_f32_to_bf16(f[i]));
    }
  }
  CHECK(bad == 0);
}

/* bf16 add/sub/mul/div (em_ew_half_binary, the AVX-512 loop where the CPU
 * has it): every bf16 pattern as a against a set of b patterns (signed zeros,
 * infinities, NaNs with payloads, subnormals, random), tensor with tensor and
 * with a constant either side (constants also off the bf16 grid), in pieces
 * of odd lengths so the masked or scalar tails run. Each value must be
 * em_f32_to_bf16(x OP y), except where x and y are both NaN (the caller
 * recomputes such a piece), and the pair flag must be set exactly when such
 * a pair is in the piece. */
static float bin_ref(int code, float x, float y) {
  switch (code) {
    case EM_ADD: return x + y;
    case EM_SUB: return x - y;
    case EM_MUL: return x * y;
    default: return x / y;
  }
}

static int bin_piece(int code, const uint16_t *a, float ca, const uint16_t *b, float cb, int64_t n, uint16_t *o) {
  bool pair = em_ew_half_binary(code, EM_BF16, o, a, ca, b, cb, n), want_pair = false;
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float x = a ? em_bf16_to_f32(a[i]) : ca, y = b ? em_bf16_to_f32(b[i]) : cb;
    if (x != x && y != y) { want_pair = true; continue; }
    uint16_t want = em_f32_to_bf16(bin_ref(code, x, y));
    if (o[i] != want && bad++ < 3)
      fprintf(stderr, "op %d: 0x%08x, 0x%08x -> 0x%04x, expected 0x%04x\n", code, em_f32_bits(x), em_f32_bits(y), o[i], want);
  }
  if (pair != want_pair) {
    fprintf(stderr, "op %d: pair flag %d over %lld values, expected %d\n", code, pair, (long long)n, want_pair);
    bad++;
  }
  return bad;
}

TEST(bf16_binary_every_a) {
  enum { N = 65536, NB = 96 };
  static uint16_t a[N], b[N], o[N];
  uint16_t bs[NB] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0xff81, 0x7fa5, 0x0001, 0x8001, 0x007f,
                     0x0080, 0x3f80, 0xbf80, 0x7f7f, 0xff7f, 0x3f81, 0x4000, 0x3400};
  uint32_t rng = 12345;
  for (int k = 20; k < NB; k++) { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; bs[k] = (uint16_t)rng; }
  const float cs[] = {0.1f, -3.0e38f, 1e-40f, 1.0f, -0.0f, INFINITY, NAN};
  for (int i = 0; i < N; i++) a[i] = (uint16_t)i;
  int bad = 0;
  for (int code = EM_ADD; code <= EM_DIV; code++) {
    for (int k = 0; k < NB; k++) {
      for (int i = 0; i < N; i++) b[i] = bs[(k + i) % NB];   /* b varies along the row too */
      for (int64_t at = 0, len = 1; at < N; at += len, len = len * 3 % 2053 + 1) {
        int64_t m = N - at < len ? N - at : len;
        bad += bin_piece(code, a + at, 0, b + at, 0, m, o + at);
        bad += bin_piece(code, a + at, 0, NULL, em_bf16_to_f32(bs[k]), m, o + at);
        bad += bin_piece(code, NULL, em_bf16_to_f32(bs[k]), a + at, 0, m, o + at);
      }
    }
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
      bad += bin_piece(code, a, 0, NULL, cs[k], N, o);
      bad += bin_piece(code, NULL, cs[k], a + 1, 0, N - 1, o);
    }
  }
  CHECK(bad == 0);
}

/* One NaN-with-NaN pair at each position of a 100-value piece (the flag must
 * see it, in the vector body or the tail), and one NaN beside a number (no
 * pair: the flag must stay clear, the NaN result exact). */
TEST(bf16_binary_lone_pair) {
  enum { N = 100 };
  uint16_t a[N], b[N], o[N];
  int bad = 0;
  for (int code = EM_ADD; code <= EM_DIV; code++)
    for (int p = 0; p < N; p++) {
      for (int i = 0; i < N; i++) { a[i] = (uint16_t)(0x3f80 + i); b[i] = (uint16_t)(0x4000 + i); }
      a[p] = 0x7fc1;
      bad += bin_piece(code, a, 0, b, 0, N, o);   /* NaN beside a number */
      b[p] = 0xff85;
      bad += bin_piece(code, a, 0, b, 0, N, o);   /* the pair */
      bad += bin_piece(code, a, 0, NULL, NAN, N, o);
    }
  CHECK(bad == 0);
}

/* The streamed loop with a widened row (em_ew_bf16_widen, a (R, C) + (C)
 * broadcast): every bf16 pattern as a against a row holding signed zeros,
 * infinities, NaNs, subnormals and random values, the row as b and as a, at
 * odd lengths (the ragged end) and each block offset into the widened row:
 * the bits and the pair flag of the plain loop, and of the widening-free
 * streamed one. Without the AVX-512 loops there is nothing to widen. */
TEST(bf16_binary_widened_row) {
  enum { N = 65536, C = 4096 };
  static _Alignas(64) uint16_t a[N], o[N], ref[N], ref2[N];
  static _Alignas(64) uint16_t row[C];
  static _Alignas(64) float w[C];
  uint16_t sp[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x0001, 0x8001, 0x007f, 0x0080, 0x3f80, 0x0081, 0x8080};
  uint32_t rng = 777;
  for (int i = 0; i < C; i++) {
    rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5;
    row[i] = i % 7 == 3 ? sp[(rng >> 8) % (sizeof sp / sizeof sp[0])] : (uint16_t)rng;
  }
  row[1000] = 0x7fc0; row[2001] = 0xffc3; row[3001] = 0x7f81;   /* few NaNs: most pieces hold no NaN pair */
  for (int i = 0; i < N; i++) a[i] = (uint16_t)(i * 40503u);   /* every pattern, scattered */
  if (!em_ew_bf16_widen(w, row, C)) return;
  int bad = 0, pieces = 0, pairs = 0;
  for (int code = EM_ADD; code <= EM_DIV; code++)
    for (int64_t at = 0, len = 4096; at + len <= N; at += len, len = len == 4096 ? 4093 - (at % 3) * 32 : 4096) {
      int64_t r0 = (at / 32) % (C / 32) * 32;   /* the row position this piece starts at, block-aligned */
      int64_t m = len < C - r0 ? len : C - r0;
      for (int side = 0; side < 2; side++) {
        const uint16_t *x = side ? row + r0 : a + at, *y = side ? a + at : row + r0;
        const float *xw = side ? w + r0 : NULL, *yw = side ? NULL : w + r0;
        bool pr = em_ew_half_binary(code, EM_BF16, ref, x, 0, y, 0, m);
        int p1 = em_ew_half_binary_nt(code, o, x, 0, y, 0, m, xw, yw);
        int p0 = em_ew_half_binary_nt(code, ref2, x, 0, y, 0, m, NULL, NULL);
        if (p1 != p0 || (p1 != 0) != pr) {
          if (bad++ < 3) fprintf(stderr, "op %d side %d at %lld: pair %d, %d unwidened, %d plain\n", code, side, (long long)at, p1, p0, pr);
          continue;
        }
        if (p1) { pairs++; continue; }   /* a NaN pair: the caller recomputes the piece */
        pieces++;
        for (int64_t i = 0; i < m; i++)
          if ((o[i] != ref[i] || o[i] != ref2[i]) && bad++ < 3)
            fprintf(stderr, "op %d side %d: 0x%04x, 0x%04x -> 0x%04x, expected 0x%04x\n", code, side, x[i], y[i], o[i], ref[i]);
      }
    }
  em_stream_fence();
  CHECK(bad == 0);
  CHECK(pieces > 10 * pairs);   /* the comparison ran on most pieces */
}

int main(void) {
  RUN(f16_to_f32_every_pattern);
  RUN(f32_to_16_every_float);
  RUN(bf16_binary_every_a);
  RUN(bf16_binary_lone_pair);
  RUN(bf16_binary_widened_row);
  TEST_MAIN_END();
}
