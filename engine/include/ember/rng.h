/* Ember's random numbers: Philox4x32-10 (Salmon et al., SC'11), counter based,
 * so the CPU and CUDA backends produce identical streams for the same seed.
 *
 * Stream layout (the contract the CUDA backend reproduces bit for bit):
 *   state   = (seed, offset); default seed at process start 0x5eed, offset 0;
 *             manual_seed(s) sets (s, 0).
 *   key     = (seed_lo32, seed_hi32)
 *   counter = (c_lo32, c_hi32, 0, 0), c = ctr0 + b for block b of one op, where
 *             ctr0 = em_rng_reserve(blocks) (the offset before the op; the op
 *             advances it by the blocks it consumes).
 *   elements are numbered j = 0..n-1 in the tensor's logical row-major order
 *             (whatever its strides). Unless said otherwise element j uses word
 *             j % 4 of block j / 4, and an op consumes ceil(n / 4) blocks.
 *   u(w)    = (w >> 8) * 2^-24, uniform in [0, 1) with 24 bits, for every dtype.
 *   Values are computed in double and rounded once to the dtype (bf16/f16: to
 *   f32 first, then to the 16-bit type, round to nearest even each time),
 *   except normal_/randn into f32/bf16/f16 (below).
 *   uniform_(lo, hi): lo + (hi - lo) * u(w_j); a value that rounds to hi in the
 *           tensor's dtype becomes lo (PyTorch's CUDA rule), so rand stays in
 *           [0, 1) for bf16/f16 too (u >= 1 - 2^-9 would round to 1 in bf16).
 *   normal_(mean, std), randn: Box-Muller on the word pairs (0,1) and (2,3) of
 *           each block: r = sqrt(-2 ln(1 - u(w0))), t = 2 pi u(w1),
 *           z0 = r cos t, z1 = r sin t (elements 4b, 4b+1; likewise words 2,3 give
 *           4b+2, 4b+3); value = mean + std * z. f64 tensors: in double (libm's
 *           log, sqrt, sin and cos; CUDA's and glibc's agree to an ulp or so).
 *           f32/bf16/f16 tensors: in f32 with rng_math.h's own logf and
 *           sincos of 2 pi u (IEEE + - * / sqrt only, unfused), value =
 *           f32(mean) + f32(std) * (r * cos) rounded per operation, then once
 *           to bf16/f16: bit-identical on both devices. (Until issue 12 the
 *           f32 values were the double formula rounded once.)
 *   randint [lo, hi): span = hi - lo; span <= 2^32: lo + (w_j mod span).
 *           Wider spans take two words: element j uses block j / 2, words
 *           2(j%2) (low half) and 2(j%2)+1 (high half) of a 64-bit u, value
 *           lo + (u mod span); the op consumes ceil(n / 2) blocks.
 *   trunc_normal_(mean, std, a, b): PyTorch's nn.init.trunc_normal_ algorithm:
 *           v0 = 2 Phi((a - mean)/std) - 1, v1 = 2 Phi((b - mean)/std) - 1
 *           (Phi(x) = (1 + erf(x / sqrt 2)) / 2), v = v0 + (v1 - v0) u(w_j),
 *           x = erfinv(v) * std * sqrt 2 + mean, clamped to [a, b]. erfinv is
 *           Giles' approximation refined by Newton steps on erf/erfc in double
 *           (rng.c). std == 0 gives mean clamped to [a, b].
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
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 10; r++) {
#if defined(__CUDA_ARCH__)
    /* the halves of the same products in 32-bit instructions (cuRAND's form): the 64-bit
     * product above made nvcc carry the whole state in 64-bit registers and operations */
    uint32_t hi0 = __umulhi(M0, c0), lo0 = M0 * c0;
    uint32_t hi1 = __umulhi(M1, c2), lo1 = M1 * c2;
#else
    uint64_t p0 = (uint64_t)M0 * c0, p1 = (uint64_t)M1 * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
#endif
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
