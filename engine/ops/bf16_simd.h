/* em_f32_to_bf16 (engine/include/ember/half.h) in SIMD lanes, shared by the
 * hand-written f32 -> bf16 cast (engine/dtype.c) and bf16 binary ops
 * (engine/ops/ew_half.c). Each lane: u + 0x7fff plus the kept half's low bit
 * (round to nearest even); a NaN lane (an unordered compare, exactly
 * (u & 0x7fffffff) > 0x7f800000) becomes u | 0x400000, i.e. quieted as
 * (u >> 16) | 0x40 once narrowed. The result keeps the bf16 in each dword's
 * upper half; the NaN lanes are or-ed into *nan (a caller that does not read
 * it passes a local: the compiler drops the or). */
#ifndef EMBER_BF16_SIMD_H
#define EMBER_BF16_SIMD_H
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

__attribute__((target("avx512f,avx512bw"))) static inline __m512i em_x512_bf16_round(__m512 v, __mmask16 *nan) {
  __m512i u = _mm512_castps_si512(v);
  __m512i r = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
  r = _mm512_mask_add_epi32(r, _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x10000)), u, _mm512_set1_epi32(0x8000));
  __mmask16 m = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  *nan |= m;
  return _mm512_mask_or_epi32(r, m, u, _mm512_set1_epi32(0x400000));
}

/* AVX2 (no mask registers): the low bit by a shift and an and, NaN lanes by a blend. */
__attribute__((target("avx2"))) static inline __m256i em_x2_bf16_round(__m256 v, __m256 *nan) {
  __m256i u = _mm256_castps_si256(v);
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                               _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
  __m256 m = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  *nan = _mm256_or_ps(*nan, m);
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r),
                             _mm256_castsi256_ps(_mm256_or_si256(u, _mm256_set1_epi32(0x400000))), m));
}

#endif
#endif
