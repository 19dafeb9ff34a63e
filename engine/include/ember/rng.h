/* Ember's random numbers: Philox4x32-10 (Salmon et al., SC'11), counter based,
 * so the CPU and CUDA backends produce identical streams for the same seed.
 *
 * Stream layout (the contract the CUDA backend reproduces bit for bit):
 *   key     = (seed_lo32, seed_hi32)
 *   counter = (c_lo32, c_hi32, 0, 0), c = generator offset + i for the i-th
 *             block of four 32-bit outputs of one op; an op that draws n
 *             values consumes ceil(n / 4) blocks and advances the offset by
 *             that many (element j uses output word j % 4 of block j / 4).
 *   uniform float in [0,1): (u32 >> 8) * 2^-24 ; double: uses (u32>>8) too.
 *   normal: Box-Muller on the pair (block words 0,1) -> elements 4b, 4b+1 and
 *           (2,3) -> 4b+2, 4b+3: r = sqrt(-2 ln(1-u0)), z0 = r cos(2 pi u1),
 *           z1 = r sin(2 pi u1), computed in f32 arithmetic... see rng.c.
 *   randint [lo, hi): lo + (u32 % (hi - lo)) (span < 2^32), for wider spans two words.
 *   truncated normal: inverse CDF, x = mean + std * sqrt(2) * erfinv(2u - 1) with
 *           u uniform in [Phi(a'), Phi(b')] (a' = (a-mean)/std), as PyTorch's trunc_normal_.
 * EM_HOSTDEV functions are shared verbatim with the CUDA kernels. */
#ifndef EMBER_RNG_H
#define EMBER_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define EM_HOSTDEV __host__ __device__
#else
#define EM_HOSTDEV
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct { uint32_t v[4]; } em_philox_block;

static inline EM_HOSTDEV em_philox_block em_philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2,
                                                         uint32_t c3, uint32_t k0, uint32_t k1) {
  const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)M0 * c0, p1 = (uint64_t)M1 * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += W0; k1 += W1;
  }
  em_philox_block b = {{c0, c1, c2, c3}};
  return b;
}

/* The global generator (one per process; CUDA shares its seed/offset). */
void em_manual_seed(uint64_t seed);
uint64_t em_rng_seed(void);
uint64_t em_rng_offset(void);
void em_rng_set_state(uint64_t seed, uint64_t offset);
/* Reserve `blocks` Philox blocks; returns the first counter value. */
uint64_t em_rng_reserve(uint64_t blocks);

#ifdef __cplusplus
}
#endif
#endif
