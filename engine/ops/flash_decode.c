/* Generation's decode attention (issue 11 item 4): a few queries (Tq <= 16)
 * against a key/value cache whose filled length n_keys lives on the device,
 * so one captured CUDA graph of the decode step serves every token. Query i
 * sees keys j < n − Tq + 1 + i of the first n = clamp(n_keys[b], 0, max_len)
 * keys (bottom-right causal against the filled part); a row that sees no key
 * gives 0.
 *
 * CUDA: the split-key decode kernels (kernels/flash_decode.cu), each block
 * reading the count: the grid is sized from max_len, splits past n write
 * empty partials, and only n keys of k and v are read — 2·n·D·2 bytes a kv
 * head in bf16, where the masked composition (q kᵀ over max_len keys,
 * masked_fill, softmax, · v) reads all max_len keys and values and writes and
 * reads the (Tq, max_len) scores four times. Nothing reads n_keys on the
 * host, so n_keys > max_len cannot be reported: it is clamped to max_len (a
 * negative count reads as 0).
 *
 * CPU: n_keys read on the host, then em_flash_attention (bottom-right, the
 * tiled CPU path) on each batch's first n keys: the reference the GPU specs
 * compare with, and the same API everywhere.
 *
 * Forward only: the cache is written in place between steps, so there is
 * nothing to differentiate through; inputs that require grad are refused. */
#include <math.h>
#include "flash_tensors.h"
#include "op.h"

#define OP "flash_decode"

static bool kernel_dtype(em_dtype dt) { return dt == EM_BF16 || dt == EM_F16 || dt == EM_F32; }

/* Shapes, dtypes, devices and n_keys of the op's inputs: 0, or -1 with the error set. */
static int decode_validate(em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *n_keys, double scale) {
  char s1[160], s2[160], s3[160];
  em_tensor *ts[3] = {q, k, v};
  const char *names[3] = {"q", "k_cache", "v_cache"};
  for (int i = 0; i < 3; i++) {
    if (ts[i]->ndim != 4)
      return em_error(OP ": expected %s of shape %s, got %s", names[i], i ? "(B, Hkv, max_len, D)" : "(B, H, Tq, D)",
                      em_shape_str(ts[i]->ndim, ts[i]->shape, s1, 160));
    if (em_check_same_device(OP, q, ts[i])) return -1;
    if (ts[i]->dtype != q->dtype)
      return em_error(OP ": expected q, k_cache and v_cache to have the same dtype, got %s, %s and %s",
                      em_dtype_name(q->dtype), em_dtype_name(k->dtype), em_dtype_name(v->dtype));
  }
  if (em_check_float(OP, "q", q)) return -1;
  if (q->device.type == EM_CUDA && !kernel_dtype(q->dtype))
    return em_error(OP ": expected bf16, f16 or f32 q and caches on CUDA, got %s", em_dtype_name(q->dtype));
  em_shape_str(4, q->shape, s1, 160);
  em_shape_str(4, k->shape, s2, 160);
  em_shape_str(4, v->shape, s3, 160);
  bool ok = k->shape[0] == q->shape[0] && k->shape[3] == q->shape[3] && k->shape[1] > 0 &&
            q->shape[1] % k->shape[1] == 0;
  for (int d = 0; d < 4; d++) ok = ok && v->shape[d] == k->shape[d];
  if (!ok)
    return em_error(OP ": expected q (B, H, Tq, D), k_cache and v_cache (B, Hkv, max_len, D) with H a multiple "
                       "of Hkv, got %s, %s and %s", s1, s2, s3);
  const int64_t Tq = q->shape[2], D = q->shape[3], max_len = k->shape[2];
  if (Tq < 1 || Tq > EM_FLASH_DECODE_MAX_TQ)
    return em_error(OP ": expected 1 to %d queries (Tq), got %lld (q has shape %s; longer chunks take "
                       "flash_attention)", EM_FLASH_DECODE_MAX_TQ, (long long)Tq, s1);
  if (!(D == 16 || D == 32 || D == 64 || D == 80 || D == 96 || D == 128 || D == 256))
    return em_error(OP ": no kernel for head dim %lld (supported: 16, 32, 64, 80, 96, 128, 256)", (long long)D);
  if (max_len < 1 || max_len > INT32_MAX || q->shape[0] * q->shape[1] > INT32_MAX)
    return em_error(OP ": expected caches of 1 to 2^31 - 1 positions and fewer than 2^31 heads, got %s", s2);
  if (em_check_same_device(OP, q, n_keys)) return -1;
  if (n_keys->dtype != EM_I64 || n_keys->ndim != 1 || (n_keys->shape[0] != 1 && n_keys->shape[0] != q->shape[0]))
    return em_error(OP ": expected n_keys to be an i64 tensor of shape (1) or (%lld) (the batch), got %s of "
                       "shape %s", (long long)q->shape[0], em_dtype_name(n_keys->dtype),
                    em_shape_str(n_keys->ndim, n_keys->shape, s3, 160));
  if (isnan(scale) || isinf(scale)) return em_error(OP ": expected a finite scale, got %g", scale);
  return 0;
}

/* The CUDA path: kernel-ready operands, o as (B, T, H, D) memory, lse scratch. */
static em_tensor *decode_cuda(em_tensor *q0, em_tensor *k0, em_tensor *v0, em_tensor *n_keys, double scale) {
  em_tensor *q = em_flash_kernel_ready(q0), *k = q ? em_flash_kernel_ready(k0) : NULL;
  em_tensor *v = k ? em_flash_kernel_ready(v0) : NULL;
  int64_t lshape[3] = {q0->shape[0], q0->shape[1], q0->shape[2]};
  em_tensor *o = v ? em_flash_bthd_empty(q0->shape[0], q0->shape[1], q0->shape[2], q0->shape[3], q0->dtype,
                                         q0->device)
                   : NULL;
  em_mem_category prev = em_mem_set_category_override(EM_MEM_WORKSPACE);
  em_tensor *lse = o ? em_empty(3, lshape, EM_F32, q0->device) : NULL;
  em_mem_set_category_override(prev);
  if (!lse || em_flash_decode_cuda(q, k, v, n_keys, o, lse, (float)scale)) {
    em_tensor_release(o);
    o = NULL;
  }
  em_tensor *tmp[4] = {q, k, v, lse};
  for (int i = 0; i < 4; i++) em_tensor_release(tmp[i]);
  return o;
}

/* Rows [Tq − rows, Tq) of batch b: flash_attention (bottom-right) on the first n keys, into o. */
static int decode_cpu_batch(em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *o, int64_t b, int64_t n,
                            double scale) {
  const int64_t Tq = q->shape[2], rows = EM_MIN(n, Tq);
  em_tensor *qb = em_narrow(q, 0, b, 1), *kb = em_narrow(k, 0, b, 1), *vb = em_narrow(v, 0, b, 1);
  em_tensor *ob = em_narrow(o, 0, b, 1);
  em_tensor *qr = qb ? em_narrow(qb, 2, Tq - rows, rows) : NULL, *orr = ob ? em_narrow(ob, 2, Tq - rows, rows) : NULL;
  em_tensor *kn = kb ? em_narrow(kb, 2, 0, n) : NULL, *vn = vb ? em_narrow(vb, 2, 0, n) : NULL;
  em_tensor *y = qr && orr && kn && vn ? em_flash_attention(qr, kn, vn, EM_CAUSAL_BOTTOM_RIGHT, scale, NULL) : NULL;
  int rc = y ? em_copy_(orr, y) : -1;
  em_tensor *tmp[9] = {qb, kb, vb, ob, qr, orr, kn, vn, y};
  for (int i = 0; i < 9; i++) em_tensor_release(tmp[i]);
  return rc;
}

/* The CPU path: the counts read here, o zero where a row sees no key. */
static em_tensor *decode_cpu(em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *n_keys, double scale) {
  em_tensor *o = em_zeros(4, q->shape, q->dtype, q->device);
  if (!o) return NULL;
  const int64_t *n = em_data_ptr(n_keys), sb = n_keys->shape[0] == 1 ? 0 : n_keys->stride[0];
  for (int64_t b = 0; b < q->shape[0]; b++) {
    const int64_t nb = EM_MIN(EM_MAX(n[b * sb], (int64_t)0), k->shape[2]);
    if (nb > 0 && decode_cpu_batch(q, k, v, o, b, nb, scale)) {
      em_tensor_release(o);
      return NULL;
    }
  }
  return o;
}

em_tensor *em_flash_decode(em_tensor *q, em_tensor *k, em_tensor *v, em_tensor *n_keys, double scale) {
  EM_OP_SCOPE(OP);
  if (decode_validate(q, k, v, n_keys, scale)) return NULL;
  if (em_grad_needed(3, (em_tensor *[]){q, k, v})) {
    em_error(OP ": forward only (no gradient: generation's cached forward does not differentiate); q, k_cache "
                "or v_cache requires grad — run it under ember.no_grad or on detached tensors");
    return NULL;
  }
  if (scale <= 0) scale = 1.0 / sqrt((double)q->shape[3]);
  return q->device.type == EM_CPU ? decode_cpu(q, k, v, n_keys, scale) : decode_cuda(q, k, v, n_keys, scale);
}
