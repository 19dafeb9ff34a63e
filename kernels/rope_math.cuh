/* RoPE's per-pair arithmetic, shared by the rope kernel (kernels/rope.cu)
 * and the flash backward's rotating epilogues (flash_bwd_wg.cuh, under
 * F.flash_attention's rope option): one definition, so a value rotated in
 * either place has the same bits (the op's tests demand equality with
 * rope_qk followed by flash, not a tolerance).
 *
 * Every operation is an explicit round-to-nearest intrinsic, never a plain
 * `a * b - c * d`: the compiler may contract a plain expression into an FMA
 * one way in one kernel and another way (or not at all) in another, and
 * then the two would differ in the last bit.
 *
 * The angle p · inv_freq is formed and reduced modulo 2π in double
 * (positions reach 1e5: f32 would lose the phase) and only the reduced
 * angle goes through f32 sincosf (rope.cu's opening comment says why). */
#pragma once
#include <math.h>

namespace rope {

/* theta^(−2j/d), on the host in double: the table both kernels are given (as the CPU computes it). */
__host__ __device__ inline double inv_freq(double theta, int64_t j, int64_t d) { return pow(theta, -2.0 * (double)j / (double)d); }

/* cos and sin of the angle p · inv (p a position), f32 after a double reduction to [−π, π]. */
__device__ __forceinline__ void angle_cs(double p, double inv, float &c, float &s) {
  const double two_pi = 6.283185307179586476925286766559;
  const double a = __dmul_rn(p, inv);
  const double r = __fma_rn(-rint(__dmul_rn(a, 1.0 / two_pi)), two_pi, a);
  sincosf((float)r, &s, &c);
}
/* f64 x: double sincos of the unreduced angle throughout. */
__device__ __forceinline__ void angle_cs(double p, double inv, double &c, double &s) { sincos(p * inv, &s, &c); }

/* (u, w) rotated by the angle whose cos and sin are (c, s): (u c − w s, u s + w c). */
__device__ __forceinline__ void rotate(float u, float w, float c, float s, float &y0, float &y1) {
  y0 = __fmaf_rn(u, c, -__fmul_rn(w, s));
  y1 = __fmaf_rn(u, s, __fmul_rn(w, c));
}
__device__ __forceinline__ void rotate(double u, double w, double c, double s, double &y0, double &y1) {
  y0 = __fma_rn(u, c, -__dmul_rn(w, s));
  y1 = __fma_rn(u, s, __dmul_rn(w, c));
}

}  // namespace rope
