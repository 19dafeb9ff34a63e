/* SMs set aside for work overlapped with the main stream (issue 16 item 4).
 *
 * AdamW overlapped with backward (bindings/ember/optim_overlap.lua) runs on a
 * side stream, but backward's cuBLASLt gemms on Hopper are persistent: one
 * large CTA per SM (the whole register file), so the side stream's blocks only
 * find an SM between two gemms. Two per-device numbers split the GPU instead:
 *
 *   reserve: while k > 0, every gemm on the device asks cuBLASLt for SMs − k
 *     (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET) with the algorithm it picks for
 *     the whole GPU, so the bits do not change;
 *   optim SMs: while k > 0, the fused AdamW kernel launches k blocks of 1024
 *     threads that loop over its chunks (one per SM when the gemms leave k
 *     SMs free), instead of one block per chunk. The element-wise update
 *     gives the same bits whatever the grid.
 *
 * em_cuda_set_sm_split sets both, validated together (nothing changes on an
 * error). The optimizer sets them from Lua around its side-stream launches
 * and kernels/ read them. The state lives here, not in kernels/, so a
 * CPU-only build validates the same way (the numbers then have no effect).
 * Atomic: kernels read them outside any lock, from whichever thread launches. */
#include <stdatomic.h>
#include "internal.h"
#include "ember/cuda.h"

#define SM_SPLIT_DEVICES 64          /* kernels/runtime.h's EM_CUDA_MAX_DEVICES */
#define SM_SPLIT_MAX 1024            /* no GPU has this many SMs: a larger k is a mistake */

static _Atomic int g_reserve[SM_SPLIT_DEVICES];
static _Atomic int g_optim[SM_SPLIT_DEVICES];

static int check(const char *op, const char *what, int device, int k) {
  if (device < 0 || device >= SM_SPLIT_DEVICES)
    return em_error("%s: expected a CUDA device index in [0, %d), got %d", op, SM_SPLIT_DEVICES, device);
  if (k < 0 || k > SM_SPLIT_MAX)
    return em_error("%s: expected %s to be an SM count in [0, %d], got %d", op, what, SM_SPLIT_MAX, k);
  return 0;
}

int em_cuda_set_sm_split(const char *op, int device, int reserve, int optim_sms) {
  if (check(op, "the SMs set aside from gemms", device, reserve) ||
      check(op, "the SMs of an optimizer launch", device, optim_sms))
    return -1;
  if (device < em_cuda_device_count()) {        /* a CUDA device here: at least one SM left to the gemms */
    int sms = em_cuda_sm_count(device);
    if (sms < 0) return -1;
    if (reserve >= sms)
      return em_error("%s: expected fewer SMs set aside from gemms than cuda:%d's %d, got %d", op, device, sms,
                      reserve);
    if (optim_sms > sms)
      return em_error("%s: expected at most cuda:%d's %d SMs for an optimizer launch, got %d", op, device, sms,
                      optim_sms);
  }
  atomic_store(&g_reserve[device], reserve);
  atomic_store(&g_optim[device], optim_sms);
  return 0;
}

int em_cuda_sm_reserve(int device) {
  return device >= 0 && device < SM_SPLIT_DEVICES ? atomic_load(&g_reserve[device]) : 0;
}

int em_cuda_optim_sms(int device) {
  return device >= 0 && device < SM_SPLIT_DEVICES ? atomic_load(&g_optim[device]) : 0;
}
