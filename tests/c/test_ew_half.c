/* The CPU elementwise loop's branch-free f16 conversions (engine/ops/ew_half.c)
 * give ember/half.h's scalar bits: f16 -> f32 for all 2^16 patterns, f32 ->
 * f16 (and bf16) for all 2^32 floats, in pieces of an odd length so the SIMD
 * loops' remainders run too. */
#include <stdint.h>
#include <stdlib.h>
#include "test.h"
#include "ember/half.h"
#include "ops/ew_half.h"

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

int main(void) {
  RUN(f16_to_f32_every_pattern);
  RUN(f32_to_16_every_float);
  TEST_MAIN_END();
}
