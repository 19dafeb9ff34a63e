/* Devices: the CPU and CUDA GPUs. */
#ifndef EMBER_DEVICE_H
#define EMBER_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { EM_CPU = 0, EM_CUDA = 1 } em_device_type;
typedef struct { em_device_type type; int index; } em_device;

static inline em_device em_cpu(void) { em_device d = {EM_CPU, 0}; return d; }
static inline int em_device_eq(em_device a, em_device b) {
  return a.type == b.type && (a.type == EM_CPU || a.index == b.index);
}
/* Parse "cpu", "cuda", "cuda:1". Returns 0 or -1 (with error set). */
int em_device_parse(const char *s, em_device *out);
/* Format into buf: "cpu" / "cuda:0". */
const char *em_device_str(em_device d, char *buf, int n);

/* CUDA runtime queries; safe to call in builds without CUDA (return 0). */
int em_cuda_available(void);
int em_cuda_device_count(void);
int em_cuda_compiled(void);    /* 1 when built with EMBER_CUDA */

#ifdef __cplusplus
}
#endif
#endif
