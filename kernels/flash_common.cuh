/* Shared pieces of the FlashAttention-2 kernels (flash_fwd.cu, flash_bwd.cu):
 * the tensor-core MMA (m16n8k16, bf16/f16 in, f32 accumulate), ldmatrix
 * fragment loads, packing f32 pairs into 16-bit pairs, and the tile copies from
 * global to shared memory (cp.async, for the pipelined loops).
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16; g = lane / 4, t = lane % 4):
 *   A 16x16 row-major: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
 *   B 16x8 "col":      b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
 *   C 16x8 f32:        c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
 * so the C tiles of two adjacent 8-column blocks are, packed to 16 bits,
 * exactly the A fragment of one 16-wide k step: probabilities go from the
 * score accumulator into the next MMA without touching shared memory.
 *
 * f32 inputs (Mma<float>) run on the TF32 tensor cores, mma.m16n8k8:
 *   A 16x8:  a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)
 *   B 8x8:   b0 (k t, n g), b1 (k t+4, n g);  C as above.
 * ldmatrix (b16) moves 8 rows of 16 bytes, i.e. 8 x 4 f32: lane (g, t) gets
 * word (g, t), which is the A fragment from a row-major tile and the B
 * fragment from an [n][k] tile, as for 16-bit types with half the k. The C
 * registers (g, 2t), (g, 2t+1) are not the A layout (g, t), (g, t+4); but a
 * k step's order is free if A and B agree, so P's A fragment takes logical k
 * t from column 2t and t+4 from 2t+1 (no shuffles), and B from a [k][n]
 * tile (no ldmatrix.trans for 32-bit words) reads rows 2t and 2t+1 with
 * plain shared loads. Operands are rounded to TF32 (cvt.rna) as they enter
 * an MMA; accumulation is f32.
 *
 * Shared tiles are row-major with a row pitch of D + 16 bytes (D + 8
 * elements of 16 bits, D + 4 of f32): the pad makes the eight row addresses
 * of every ldmatrix phase fall in distinct banks (the pitch is an odd number
 * of 16-byte chunks for every D here), and the f32 [k][n] loads (rows 2t,
 * columns g: pitch ≡ 4 or 20 mod 32 words) conflict-free. */
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "common.cuh"

namespace flash {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/* 2^x on the MUFU alone, results below 2^-126 flushed to zero; -inf gives 0
 * (what masked keys need). exp2f adds a compare and two multiplies around the
 * same MUFU.EX2 to keep subnormal results: three more instructions per element
 * in the backward's issue-bound loops (docs/flash.md "Step 4b"), for
 * probabilities that contribute nothing measurable. Every backward kernel (mma,
 * wg, wg2) uses it, so they keep giving one another's bits. Declared for the
 * host pass too: nvcc checks the bodies of __device__ functions there
 * (flash_fwd_wg2.cu's softmax did not compile without it); only the device
 * pass's body ever runs. */
__device__ __forceinline__ float ex2_ftz(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

constexpr int kRopeMaxHalf = 64;   // pairs of the largest head dim whose epilogue rotates (128)

struct Params {          // strides in elements; the last dim is contiguous
  const void *q, *k, *v, *o, *dout;
  void *out, *dq, *dk, *dv;
  float *lse, *delta;
  int64_t q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, o_sb, o_sh, o_st;
  int64_t do_sb, do_sh, do_st, dq_sb, dq_sh, dq_st, dk_sb, dk_sh, dk_st, dv_sb, dv_sh, dv_st;
  int B, H, Tq, Tk;
  int Hkv, group;            // kv heads; q heads per kv head (head h reads kv head h / group)
  int off;                   // causal: row i sees keys j <= i + off (0 top-left, Tk - Tq bottom-right)
  int Dv;                    // the tensors' head dim; the wgmma kernels run 80 and 96 as 128 and clip their stores to it
  float scale, scale_log2;   // scale and scale·log2(e)
  bool causal;
  // the decode path (flash_decode.cu): key splits, keys per split, f32 partials
  int nsplit, chunk;
  float *opart, *mpart, *lpart;
  // F.flash_attention's rope option (em_flash_bwd_rope_cuda): the wg2 backward's dq and dk epilogues rotate their
  // rows back by −angle. rope 1: i64 positions, 2: i32, 0: off (every other kernel); positions broadcast over
  // (B, H, T) (k's rows index the kv head) with these strides; theta^(−2j/d) for pair j, from the host.
  const void *rope_pos;
  int64_t rp_sb, rp_sh, rp_st;
  int rope;
  double rope_inv[kRopeMaxHalf];
};

/* Δ of one row, rowsum(dO ∘ o): the products summed in column order from 0, one fused multiply-add a column, over
 * the columns below n (a multiple of 16 bytes' worth) of at most NMAX. The delta kernel (flash_bwd.cu) and, under
 * EMBER_FLASH_STEP9, the wg2 dq kernel (flash_bwd_wg2.cu) both sum this way: the same Δ to the bit; with
 * EMBER_FLASH_DELTA9 the dq kernel sums the same 16-byte chunks (delta_chunk) read from its shared-memory tiles. */
template <typename T>
__device__ __forceinline__ float delta_chunk(float acc, const Packed128<T> &a, const Packed128<T> &e) {
#pragma unroll
  for (int j = 0; j < Packed128<T>::size; j++) acc = __fmaf_rn(to_f32(a[j]), to_f32(e[j]), acc);
  return acc;
}
template <typename T, int NMAX>
__device__ __forceinline__ float delta_row(const T *o, const T *d, int n) {
  constexpr int E = Packed128<T>::size;
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < NMAX; c += E)
    if (c < n) acc = delta_chunk<T>(acc, load128(o + c), load128(d + c));
  return acc;
}

/* Up to this many queries the forward takes the split-key decode kernel. */
constexpr int kDecodeMaxTq = EM_FLASH_DECODE_MAX_TQ;   // ember/ops.h

/* The decode forward (flash_decode.cu) for validated p (o, lse set): 0 or -1 with the error set. */
int decode_fwd(Params &p, em_dtype dt, int d, int device, cudaStream_t s);

template <typename T> struct Mma;
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
  }
};
template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
  }
};
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
/* f32 storage, TF32 tensor cores (m16n8k8; run takes operands already rounded by prep / c_to_a). */
template <> struct Mma<float> {
  static __device__ __forceinline__ void run(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

/* The k of one MMA: 16 for 16-bit inputs, 8 for TF32. */
template <typename T> constexpr int kStep = sizeof(T) == 4 ? 8 : 16;
/* Elements per 16-byte chunk (a cp.async copy, an ldmatrix row); tiles' row pitch is D + kEpc<T>. */
template <typename T> constexpr int kEpc = 16 / (int)sizeof(T);

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *p) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

/* Address helpers for a row-major shared tile with pitch LD (elements).
 * A operand (16x16 at row r0, col c0), also B from an [n][k] tile (two 8-wide
 * n blocks at n0, k step at k0): registers {b0,b1} of n block 0 then of 1. */
template <int LD, typename T>
__device__ __forceinline__ const T *a_addr(const T *s, int r0, int c0, int lane) {
  return s + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + c0 + (lane >> 4) * kEpc<T>;
}
template <int LD, typename T>
__device__ __forceinline__ const T *bn_addr(const T *s, int n0, int k0, int lane) {   // tile stored [n][k]
  return s + (n0 + (lane & 7) + (lane >> 4) * 8) * LD + k0 + ((lane >> 3) & 1) * kEpc<T>;
}
/* B from a [k][n] tile through ldmatrix.trans: k step at k0, two n blocks at n0. */
template <int LD, typename T>
__device__ __forceinline__ const T *bk_addr(const T *s, int k0, int n0, int lane) {
  return s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + (lane >> 4) * 8;
}
/* A = Mᵀ from a tile stored [k][m] (rows k) through ldmatrix.trans: A's rows
 * at m0, its k step at k0. */
template <int LD, typename T>
__device__ __forceinline__ const T *at_addr(const T *s, int m0, int k0, int lane) {
  return s + (k0 + (lane & 7) + (lane >> 4) * 8) * LD + m0 + ((lane >> 3) & 1) * 8;
}

/* The C accumulators of k step kk (16 rows x kStep columns) as its A
 * fragment: 16-bit types pack n blocks 2kk and 2kk+1; TF32 takes n block kk
 * with k permuted (column 2t as k t, 2t+1 as t+4; see the layouts above). */
template <typename T>
__device__ __forceinline__ void c_to_a(const float (*c)[4], int kk, uint32_t a[4]) {
  if constexpr (sizeof(T) == 4) {
    a[0] = to_tf32(c[kk][0]); a[1] = to_tf32(c[kk][2]);
    a[2] = to_tf32(c[kk][1]); a[3] = to_tf32(c[kk][3]);
  } else {
    a[0] = Mma<T>::pack(c[2 * kk][0], c[2 * kk][1]);
    a[1] = Mma<T>::pack(c[2 * kk][2], c[2 * kk][3]);
    a[2] = Mma<T>::pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = Mma<T>::pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

/* An A fragment from a row-major tile, or the B fragments of two n blocks
 * from an [n][k] tile (p from a_addr / bn_addr): ldmatrix, rounded to TF32
 * for f32. */
template <typename T>
__device__ __forceinline__ void ld_frag(uint32_t r[4], const T *p) {
  ldsm_x4(r, p);
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < 4; i++) r[i] = to_tf32(__uint_as_float(r[i]));
  }
}

/* The B fragments {b0, b1} of n blocks n0 and n0 + 8, k step at k0, from a
 * tile stored [k][n] (pitch LD): ldmatrix.trans for 16-bit types; for f32
 * rows k0 + 2t and k0 + 2t + 1 (the permuted k of c_to_a) by plain loads. */
template <int LD, typename T>
__device__ __forceinline__ void ld_frag_kn(uint32_t r[4], const T *s, int k0, int n0, int lane) {
  if constexpr (sizeof(T) == 4) {
    const T *p = s + (k0 + 2 * (lane & 3)) * LD + n0 + (lane >> 2);
    r[0] = to_tf32(p[0]); r[1] = to_tf32(p[LD]);
    r[2] = to_tf32(p[8]); r[3] = to_tf32(p[LD + 8]);
  } else {
    ldsm_x4_t(r, bk_addr<LD>(s, k0, n0, lane));
  }
}

/* Two adjacent outputs (columns 2t, 2t + 1 of a C fragment) stored as T. */
template <typename T>
__device__ __forceinline__ void store2(T *p, float lo, float hi) {
  if constexpr (sizeof(T) == 4)
    *reinterpret_cast<float2 *>(p) = make_float2(lo, hi);
  else
    *reinterpret_cast<uint32_t *>(p) = Mma<T>::pack(lo, hi);
}

/* q, k, v (and o when given) geometry, sizes and scale into p: the part of
 * the launch parameters the forward and backward share. */
inline void set_qkv(Params &p, const em_tensor *q, const em_tensor *k, const em_tensor *v, const em_tensor *o,
                    int causal, float scale) {
  p.q = em_data_ptr(q); p.k = em_data_ptr(k); p.v = em_data_ptr(v);
  p.q_sb = q->stride[0]; p.q_sh = q->stride[1]; p.q_st = q->stride[2];
  p.k_sb = k->stride[0]; p.k_sh = k->stride[1]; p.k_st = k->stride[2];
  p.v_sb = v->stride[0]; p.v_sh = v->stride[1]; p.v_st = v->stride[2];
  p.o_sb = o->stride[0]; p.o_sh = o->stride[1]; p.o_st = o->stride[2];
  p.B = (int)q->shape[0]; p.H = (int)q->shape[1]; p.Tq = (int)q->shape[2]; p.Tk = (int)k->shape[2];
  p.Hkv = (int)k->shape[1]; p.group = p.H / p.Hkv; p.Dv = (int)q->shape[3];
  p.causal = causal != 0; p.off = causal == 2 ? p.Tk - p.Tq : 0;   // 2: EM_CAUSAL_BOTTOM_RIGHT
  p.scale = scale; p.scale_log2 = scale * kLog2e;
}

/* cp.async: global -> shared copies that bypass the registers and run in the
 * background (sm_80+). Each thread's copies are grouped by commit; wait<N>
 * blocks until at most N of this thread's groups are still in flight, and a
 * __syncthreads after it makes every thread's landed copies visible to all.
 * bytes 0 copies nothing and fills the destination with zeros (the rows past
 * the end of a matrix). "memory": no shared-memory access moves across them. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int bytes) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, int bytes) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(a), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/* Rows [r0, r0 + ROWS) of an (n, D) matrix with row stride st into a shared
 * tile of pitch D + kEpc (16 bytes of pad), through cp.async (16 bytes a
 * copy, all NT threads of the block taking part); rows at or past n are
 * zero-filled (their source address is g, never read). Issues the copies
 * only: the caller commits, waits and synchronises. */
template <typename T, int D, int ROWS, int NT>
__device__ __forceinline__ void cp_tile(T *s, const T *g, int64_t st, int r0, int n) {
  constexpr int E = kEpc<T>, CH = D / E, LD = D + E, N = ROWS * CH;
  if constexpr (NT % CH == 0) {
    // each thread keeps one column and steps RS rows at a time: one 64-bit
    // base per call, the rest immediates (cheap in registers)
    constexpr int RS = NT / CH;
    const int rt = threadIdx.x / CH, col = (threadIdx.x % CH) * E;
    const T *src = g + (int64_t)(r0 + rt) * st + col;
    T *dst = s + rt * LD + col;
#pragma unroll
    for (int i = 0; i < (ROWS + RS - 1) / RS; i++) {
      if (ROWS % RS == 0 || rt + i * RS < ROWS) {
        const bool in = r0 + rt + i * RS < n;
        cp_async16(dst + i * RS * LD, in ? src + (int64_t)i * RS * st : g, in ? 16 : 0);
      }
    }
  } else {
    // D = 80, 96: rows and columns per copy recomputed (not unrolled: 64-bit
    // offsets kept for every copy would cost ~30 registers)
#pragma unroll 1
    for (int i = 0; i < (N + NT - 1) / NT; i++) {
      const int c = threadIdx.x + i * NT;
      if (N % NT == 0 || c < N) {
        const int r = c / CH, col = (c % CH) * E;
        const bool in = r0 + r < n;
        cp_async16(s + r * LD + col, in ? g + (int64_t)(r0 + r) * st + col : g, in ? 16 : 0);
      }
    }
  }
}

}  // namespace flash

/* The head dims the kernels are instantiated for. */
#define FLASH_DISPATCH_D(d, D, ...)                       \
  switch (d) {                                            \
    case 16: { constexpr int D = 16; __VA_ARGS__ } break; \
    case 32: { constexpr int D = 32; __VA_ARGS__ } break; \
    case 64: { constexpr int D = 64; __VA_ARGS__ } break; \
    case 80: { constexpr int D = 80; __VA_ARGS__ } break; \
    case 96: { constexpr int D = 96; __VA_ARGS__ } break; \
    case 128: { constexpr int D = 128; __VA_ARGS__ } break; \
    case 256: { constexpr int D = 256; __VA_ARGS__ } break; \
    default: break;                                       \
  }
