/* Random fills on the device: rand, randn, randint, uniform_, normal_ and
 * trunc_normal_ reproduce the CPU's Philox stream (ember/rng.h) bit for bit
 * in f32/bf16/f16 and to an ulp or two in f64.
 *
 * What it computes: one thread per Philox4x32-10 block (10 rounds of two
 * 32x32->64 multiplies), i.e. per 4 elements (2 for randint spans > 2^32),
 * then the distribution in double with the shared code of engine/backend/rng_math.h
 * (the same source the CPU runs; products are kept unfused), rounded once
 * to the dtype by the CPU's conversions (convert.cuh). Bytes per element:
 * sizeof(dtype) written, nothing read. Launch: 256 threads, grid-stride over
 * blocks. The one trick: counter-based, so element j needs only (seed,
 * ctr0 + j/4) and any strides are written in place in logical order. */
#include <cuda_runtime.h>
#include "rng_math.h"
#include "common.cuh"
#include "convert.cuh"
#include "runtime.h"
#include "backend.h"

template <int DT, bool RANDINT>
__global__ void rng_kernel(void *out, em_geom g, int64_t n, uint64_t nblocks, em_rng_dist d, em_philox_state st,
                           bool wide) {
  uint64_t seed, ctr0;
  em_philox_resolve(st, &seed, &ctr0);
  const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  const int per = wide ? 2 : 4;
  for (uint64_t b = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks;
       b += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t c = ctr0 + b;
    em_philox_block pb = em_philox4x32_10((uint32_t)c, (uint32_t)(c >> 32), 0, 0, k0, k1);
    int64_t j0 = (int64_t)b * per;
    int cnt = n - j0 < per ? (int)(n - j0) : per;
    if (RANDINT) {
      for (int k = 0; k < cnt; k++) {
        uint64_t u = wide ? ((uint64_t)pb.v[2 * k] | ((uint64_t)pb.v[2 * k + 1] << 32)) : pb.v[k];
        int64_t o, unused;
        em_geom_offsets<int64_t>(g, j0 + k, o, unused);
        em_dev_store_i64<DT>(out, o, (int64_t)((uint64_t)d.lo + u % d.span));
      }
    } else {
      double v[4];
      em_rng_block_values(&d, &pb, v);
      for (int k = 0; k < cnt; k++) {
        int64_t o, unused;
        em_geom_offsets<int64_t>(g, j0 + k, o, unused);
        em_dev_store_f64<DT>(out, o, v[k]);
        if (d.kind == EM_RNG_UNIFORM && em_rng_uniform_hits_hi(&d, em_dev_load_f64<DT>(out, o)))
          em_dev_store_f64<DT>(out, o, d.p0);             /* [lo, hi) in every dtype */
      }
    }
  }
}

extern "C" int em_rng_fill_cuda(em_tensor *t, const em_rng_dist *d, em_philox_state ps) {
  const char *op = em_current_op ? em_current_op : "random";
  if (em_cuda_check_device(op, t->device.index)) return -1;
  int64_t n = em_numel(t);
  if (n == 0) return 0;
  bool randint = d->kind == EM_RNG_RANDINT, wide = randint && d->span > 0x100000000ull;
  uint64_t nblocks = (uint64_t)((n + (wide ? 2 : 4) - 1) / (wide ? 2 : 4));
  EmDeviceGuard guard(t->device.index);
  cudaStream_t st = (cudaStream_t)em_cuda_cur_stream_handle(t->device.index);
  em_geom g = em_geom_make(t->ndim, t->shape, t->stride, NULL);
  void *out = em_data_ptr(t);
  unsigned grid = em_grid((int64_t)nblocks, 256);
  if (randint) {
    EM_DTYPE_CASES(t->dtype, DT, rng_kernel<DT, true><<<grid, 256, 0, st>>>(out, g, n, nblocks, *d, ps, wide))
  } else {
    switch (t->dtype) {
      case EM_F32: rng_kernel<EM_F32, false><<<grid, 256, 0, st>>>(out, g, n, nblocks, *d, ps, false); break;
      case EM_F64: rng_kernel<EM_F64, false><<<grid, 256, 0, st>>>(out, g, n, nblocks, *d, ps, false); break;
      case EM_BF16: rng_kernel<EM_BF16, false><<<grid, 256, 0, st>>>(out, g, n, nblocks, *d, ps, false); break;
      case EM_F16: rng_kernel<EM_F16, false><<<grid, 256, 0, st>>>(out, g, n, nblocks, *d, ps, false); break;
      default: return em_error("%s: expected a floating-point tensor, got %s", op, em_dtype_name(t->dtype));
    }
  }
  return em_launch_check(op);
}

/* The graph's Philox cell {seed, base}, written on the replay stream right
 * before the graph launches (graph.cu): one thread, two stores. */
__global__ void rng_cell_set_kernel(uint64_t *cell, uint64_t seed, uint64_t base) {
  cell[0] = seed;
  cell[1] = base;
}

extern "C" int em_rng_cell_set_cuda(uint64_t *cell, uint64_t seed, uint64_t base, void *stream) {
  rng_cell_set_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(cell, seed, base);
  return em_launch_check("graph.replay");
}
