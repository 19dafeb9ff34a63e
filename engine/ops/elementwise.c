/* Elementwise ops: binary (add ... logical_or), tensor-scalar, unary, clamp,
 * where, masked_fill, triu/tril — the CPU forward and every backward formula.
 *
 * Why it is shaped this way:
 *  - One CPU loop serves every op and dtype. The broadcast iteration space is
 *    coalesced first (size-1 dims dropped, neighbouring dims merged where every
 *    operand is contiguous across them), so most calls become one long inner
 *    loop and a 1-element op costs a few stores, not an N-d iterator.
 *  - The inner loop runs in chunks of CHUNK elements: operands are loaded into a
 *    buffer of the *compute type* — float for f32/bf16/f16, double for f64,
 *    int64 for the integer types and bool — the op runs as a tight loop with its
 *    switch hoisted out, and the result is rounded once when stored into the
 *    output's dtype (so bf16 math is f32 math rounded once, like PyTorch's
 *    opmath). When an operand already has the compute type and unit stride (the
 *    common f32 contiguous case) the buffer is skipped and the loop reads and
 *    writes the tensors directly: f32 add is one vectorised loop.
 *  - Scalars (Lua numbers) are constant operands, filled into a buffer once:
 *    no 0-d tensor is allocated for `t * 2`.
 *  - Every op is validate -> device implementation -> record autograd. The
 *    device switch is device_loop(): the CPU loop, or kernels/elementwise.cu
 *    over the same coalesced plan, op codes and compute classes (shared
 *    through backend/backend.h). Backward formulas are compositions of
 *    public ops (device-agnostic), except unary gradients, which are one fused
 *    internal kernel f(grad, x or y) each — PyTorch's sigmoid_backward shape —
 *    on either device.
 *  - The float kernels are written once as macro bodies over a type T and
 *    instantiated for float and double; <tgmath.h> picks expf/exp etc. */
#include "op.h"
#include "cost.h"
#include "parallel.h"
#include "stream.h"
#include "ew_half.h"
#include "ew_nt.h"
#include "vec_math.h"
#include <stdio.h>
#include <stdlib.h>
#include <tgmath.h>

/* ---------------- names ---------------- */

static const char *const binop_names[EM_NBINOPS] = {
  "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
  "logical_and", "logical_or",
};
static const char *const unop_names[EM_NUNOPS] = {
  "neg", "abs", "sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "silu", "relu", "gelu",
  "sin", "cos", "square", "reciprocal", "sign", "logical_not", "floor", "ceil", "round",
  "gelu_tanh",
};

const char *em_binop_name(em_binop op) {
  return (unsigned)op < EM_NBINOPS ? binop_names[op] : "binary";
}
const char *em_unop_name(em_unop op) {
  return (unsigned)op < EM_NUNOPS ? unop_names[op] : "unary";
}

/* ---------------- kernels ---------------- */

/* Codes, compute classes and the kernel/operand descriptions are shared with
 * the CUDA kernels (backend/backend.h); short local names for them: */
enum { C_F32 = EM_EW_F32, C_F64 = EM_EW_F64, C_I64 = EM_EW_I64 };   /* compute classes */
enum { K_BINARY = EM_EW_BINARY, K_UNARY = EM_EW_UNARY, K_WHERE = EM_EW_WHERE };   /* kernel arities */
/* Internal codes beyond the public enums: clamp (unary) and the fused
 * gradients of unary ops, g' = f(g, v) with v = x or y (binary). */
enum { U_CLAMP = EM_EW_CLAMP };
enum {
  G_ABS = EM_EW_G_ABS, G_SQRT = EM_EW_G_SQRT, G_RSQRT = EM_EW_G_RSQRT, G_TANH = EM_EW_G_TANH,
  G_SIGMOID = EM_EW_G_SIGMOID, G_SILU = EM_EW_G_SILU, G_RELU = EM_EW_G_RELU, G_GELU = EM_EW_G_GELU,
  G_SIN = EM_EW_G_SIN, G_COS = EM_EW_G_COS, G_SQUARE = EM_EW_G_SQUARE, G_RECIP = EM_EW_G_RECIP,
  G_CLAMP = EM_EW_G_CLAMP, G_GELU_TANH = EM_EW_G_GELU_TANH,
};

/* gelu(x, approximate="tanh") = 0.5 x (1 + tanh(k (x + c x^3))), k = sqrt(2/pi), c = 0.044715. */
#define GELU_TANH_K 0.79788456080286535588
#define GELU_TANH_C 0.044715

/* kind, code, cls, and clamp bounds lo/hi (G_CLAMP / U_CLAMP; +-inf when unbounded). */
typedef em_ew_kern kern;
/* An operand: a tensor t broadcast to the loop shape, or (t NULL) the constant c. */
typedef em_ew_operand operand;

#define CHUNK 256
typedef union { float f[CHUNK]; double d[CHUNK]; int64_t i[CHUNK]; } chunk_buf;

static int dtype_class(em_dtype t) {
  return t == EM_F64 ? C_F64 : em_dtype_is_float(t) ? C_F32 : C_I64;
}
static em_dtype class_dtype(int cls) { return cls == C_F32 ? EM_F32 : cls == C_F64 ? EM_F64 : EM_I64; }

/* Float -> integer without undefined behaviour for NaN/inf/out of range. */
static inline int64_t sat_i64(double v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (int64_t)v;
}

static int64_t ipow(int64_t b, int64_t e) {
  if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;
  uint64_t r = 1, x = (uint64_t)b;
  while (e) { if (e & 1) r *= x; x *= x; e >>= 1; }
  return (int64_t)r;
}

#define LOOP(stmt) for (int64_t i = 0; i < n; i++) { stmt; } break

/* Binary float kernel body over T: o = a OP b (codes < EM_NBINOPS), or the
 * gradient of a unary op, o = f(g = a, v = b). */
#define FLOAT_BINARY_BODY(T)                                                             \
  switch (k->code) {                                                                     \
    case EM_ADD: LOOP(o[i] = a[i] + b[i]);                                               \
    case EM_SUB: LOOP(o[i] = a[i] - b[i]);                                               \
    case EM_MUL: LOOP(o[i] = a[i] * b[i]);                                               \
    case EM_DIV: LOOP(o[i] = a[i] / b[i]);                                               \
    case EM_POW: LOOP(o[i] = pow(a[i], b[i]));                                           \
    case EM_MAXIMUM: LOOP(o[i] = (isnan(a[i]) || a[i] > b[i]) ? a[i] : b[i]);            \
    case EM_MINIMUM: LOOP(o[i] = (isnan(a[i]) || a[i] < b[i]) ? a[i] : b[i]);            \
    case EM_EQ: LOOP(o[i] = a[i] == b[i]);                                               \
    case EM_NE: LOOP(o[i] = a[i] != b[i]);                                               \
    case EM_LT: LOOP(o[i] = a[i] < b[i]);                                                \
    case EM_LE: LOOP(o[i] = a[i] <= b[i]);                                               \
    case EM_GT: LOOP(o[i] = a[i] > b[i]);                                                \
    case EM_GE: LOOP(o[i] = a[i] >= b[i]);                                               \
    case EM_LOGICAL_AND: LOOP(o[i] = a[i] != 0 && b[i] != 0);                            \
    case EM_LOGICAL_OR: LOOP(o[i] = a[i] != 0 || b[i] != 0);                             \
    case G_ABS: LOOP(o[i] = b[i] > 0 ? a[i] : b[i] < 0 ? -a[i] : 0);                     \
    case G_SQRT: LOOP(o[i] = a[i] / (2 * b[i]));                                         \
    case G_RSQRT: LOOP(o[i] = (T)-0.5 * a[i] * b[i] * b[i] * b[i]);                      \
    case G_TANH: LOOP(o[i] = a[i] * (1 - b[i] * b[i]));                                  \
    case G_SIGMOID: LOOP(o[i] = a[i] * b[i] * (1 - b[i]));                               \
    case G_SILU: LOOP(T s = 1 / (1 + exp(-b[i])); o[i] = a[i] * s * (1 + b[i] * (1 - s))); \
    case G_RELU: LOOP(o[i] = b[i] > 0 ? a[i] : 0);                                       \
    case G_GELU: LOOP(T x = b[i];                                                        \
                      T cdf = (T)0.5 * (1 + erf(x * (T)M_SQRT1_2));                      \
                      T pdf = exp((T)-0.5 * x * x) * (T)(0.5 * M_2_SQRTPI * M_SQRT1_2);  \
                      o[i] = a[i] * (cdf + x * pdf));                                    \
    case G_SIN: LOOP(o[i] = a[i] * cos(b[i]));                                           \
    case G_COS: LOOP(o[i] = -a[i] * sin(b[i]));                                          \
    case G_SQUARE: LOOP(o[i] = 2 * a[i] * b[i]);                                         \
    case G_RECIP: LOOP(o[i] = -a[i] * b[i] * b[i]);                                      \
    case G_CLAMP: LOOP(o[i] = (b[i] >= (T)k->lo && b[i] <= (T)k->hi) ? a[i] : 0);        \
    case G_GELU_TANH: LOOP(T x = b[i];                                                   \
                           T t = tanh((T)GELU_TANH_K * (x + (T)GELU_TANH_C * x * x * x)); \
                           o[i] = a[i] * ((T)0.5 * (1 + t) + (T)0.5 * x * (1 - t * t) *  \
                                          (T)GELU_TANH_K * (1 + (T)(3 * GELU_TANH_C) * x * x))); \
    default: break;                                                                      \
  }

#define FLOAT_UNARY_BODY(T)                                                              \
  switch (k->code) {                                                                     \
    case EM_NEG: LOOP(o[i] = -a[i]);                                                     \
    case EM_ABS: LOOP(o[i] = fabs(a[i]));                                                \
    case EM_SQRT: LOOP(o[i] = sqrt(a[i]));                                               \
    case EM_RSQRT: LOOP(o[i] = 1 / sqrt(a[i]));                                          \
    case EM_EXP: LOOP(o[i] = exp(a[i]));                                                 \
    case EM_LOG: LOOP(o[i] = log(a[i]));                                                 \
    case EM_TANH: LOOP(o[i] = tanh(a[i]));                                               \
    case EM_SIGMOID: LOOP(o[i] = 1 / (1 + exp(-a[i])));                                  \
    case EM_SILU: LOOP(o[i] = a[i] / (1 + exp(-a[i])));                                  \
    case EM_RELU: LOOP(o[i] = a[i] < 0 ? 0 : a[i]);                                      \
    case EM_GELU: LOOP(o[i] = (T)0.5 * a[i] * (1 + erf(a[i] * (T)M_SQRT1_2)));           \
    case EM_SIN: LOOP(o[i] = sin(a[i]));                                                 \
    case EM_COS: LOOP(o[i] = cos(a[i]));                                                 \
    case EM_SQUARE: LOOP(o[i] = a[i] * a[i]);                                            \
    case EM_RECIPROCAL: LOOP(o[i] = 1 / a[i]);                                           \
    case EM_SIGN: LOOP(o[i] = (T)((a[i] > 0) - (a[i] < 0)));                             \
    case EM_LOGICAL_NOT: LOOP(o[i] = a[i] == 0);                                         \
    case EM_FLOOR: LOOP(o[i] = floor(a[i]));                                             \
    case EM_CEIL: LOOP(o[i] = ceil(a[i]));                                               \
    case EM_ROUND: LOOP(o[i] = nearbyint(a[i]));   /* half to even, as torch.round */    \
    case EM_GELU_TANH: LOOP(T x = a[i];                                                  \
                            o[i] = (T)0.5 * x * (1 + tanh((T)GELU_TANH_K * (x + (T)GELU_TANH_C * x * x * x)))); \
    case U_CLAMP: LOOP(T v = a[i]; v = v < (T)k->lo ? (T)k->lo : v;                      \
                       o[i] = v > (T)k->hi ? (T)k->hi : v);                              \
    default: break;                                                                      \
  }

static void binary_f32(const kern *k, float *o, const float *a, const float *b, int64_t n) { FLOAT_BINARY_BODY(float) }
static void binary_f64(const kern *k, double *o, const double *a, const double *b, int64_t n) { FLOAT_BINARY_BODY(double) }
static void unary_f32(const kern *k, float *o, const float *a, int64_t n) { FLOAT_UNARY_BODY(float) }
static void unary_f64(const kern *k, double *o, const double *a, int64_t n) { FLOAT_UNARY_BODY(double) }

/* Integers compute in int64 with wrap-around (via uint64, no UB); the store
 * truncates to the output's width as PyTorch does. */
static void binary_i64(const kern *k, int64_t *o, const int64_t *a, const int64_t *b, int64_t n) {
  switch (k->code) {
    case EM_ADD: LOOP(o[i] = (int64_t)((uint64_t)a[i] + (uint64_t)b[i]));
    case EM_SUB: LOOP(o[i] = (int64_t)((uint64_t)a[i] - (uint64_t)b[i]));
    case EM_MUL: LOOP(o[i] = (int64_t)((uint64_t)a[i] * (uint64_t)b[i]));
    case EM_POW: LOOP(o[i] = ipow(a[i], b[i]));
    case EM_MAXIMUM: LOOP(o[i] = a[i] > b[i] ? a[i] : b[i]);
    case EM_MINIMUM: LOOP(o[i] = a[i] < b[i] ? a[i] : b[i]);
    case EM_EQ: LOOP(o[i] = a[i] == b[i]);
    case EM_NE: LOOP(o[i] = a[i] != b[i]);
    case EM_LT: LOOP(o[i] = a[i] < b[i]);
    case EM_LE: LOOP(o[i] = a[i] <= b[i]);
    case EM_GT: LOOP(o[i] = a[i] > b[i]);
    case EM_GE: LOOP(o[i] = a[i] >= b[i]);
    case EM_LOGICAL_AND: LOOP(o[i] = a[i] != 0 && b[i] != 0);
    case EM_LOGICAL_OR: LOOP(o[i] = a[i] != 0 || b[i] != 0);
    default: LOOP(o[i] = 0);   /* div and the gradient kernels never run on integers */
  }
}

static void unary_i64(const kern *k, int64_t *o, const int64_t *a, int64_t n) {
  int64_t lo = k->lo <= -9.2e18 ? INT64_MIN : sat_i64(ceil(k->lo));
  int64_t hi = k->hi >= 9.2e18 ? INT64_MAX : sat_i64(floor(k->hi));
  switch (k->code) {
    case EM_NEG: LOOP(o[i] = (int64_t)(0 - (uint64_t)a[i]));
    case EM_ABS: LOOP(o[i] = a[i] < 0 ? (int64_t)(0 - (uint64_t)a[i]) : a[i]);
    case EM_SQUARE: LOOP(o[i] = (int64_t)((uint64_t)a[i] * (uint64_t)a[i]));
    case EM_SIGN: LOOP(o[i] = (a[i] > 0) - (a[i] < 0));
    case EM_RELU: LOOP(o[i] = a[i] < 0 ? 0 : a[i]);
    case EM_LOGICAL_NOT: LOOP(o[i] = a[i] == 0);
    case U_CLAMP: LOOP(int64_t v = a[i] < lo ? lo : a[i]; o[i] = v > hi ? hi : v);
    default: LOOP(o[i] = a[i]);   /* floor, ceil, round of an integer */
  }
}

/* both loads unconditional: the select becomes a SIMD blend, not a branch per element */
#define WHERE_LOOP(T) { T *o = dst; const T *c = src[0], *a = src[1], *b = src[2]; \
                        LOOP(T av = a[i]; T bv = b[i]; o[i] = c[i] != 0 ? av : bv); }

/* ---- issue 12: ternary kernels o = f(x, y, z; value in lo): lerp, addcmul, addcdiv ---- */
#define TERNARY_BODY(T)                                                                        \
  { T *o = dst; const T *x = src[0], *y = src[1], *z = src[2]; const T v = (T)k->lo;          \
    switch (k->code) {                                                                         \
      case EM_EW_LERP: LOOP(T d = y[i] - x[i]; T w = z[i];                                     \
                            o[i] = fabs(w) < (T)0.5 ? x[i] + w * d : y[i] - d * (1 - w));      \
      case EM_EW_ADDCMUL: LOOP(o[i] = x[i] + v * y[i] * z[i]);                                \
      case EM_EW_ADDCDIV: LOOP(o[i] = x[i] + v * y[i] / z[i]);                                \
      default: break;                                                                          \
    } }

static void ternary(const kern *k, void *dst, const void *const *src, int64_t n) {
  if (k->cls == C_F32) TERNARY_BODY(float)
  else if (k->cls == C_F64) TERNARY_BODY(double)
  else {   /* integers: addcmul only (the op refuses the rest), wrapping */
    int64_t *o = dst; const int64_t *x = src[0], *y = src[1], *z = src[2];
    uint64_t v = (uint64_t)sat_i64(k->lo);
    for (int64_t i = 0; i < n; i++) o[i] = (int64_t)((uint64_t)x[i] + v * (uint64_t)y[i] * (uint64_t)z[i]);
  }
}
#undef TERNARY_BODY
/* ---- end issue 12 ---- */

static void compute(const kern *k, void *dst, const void *const *src, int64_t n) {
  if (k->kind == EM_EW_TERNARY) { ternary(k, dst, src, n); return; }   /* issue 12 */
  if (k->kind == K_WHERE) {
    switch (k->cls) {
      case C_F32: WHERE_LOOP(float)
      case C_F64: WHERE_LOOP(double)
      default: WHERE_LOOP(int64_t)
    }
    return;
  }
  bool bin = k->kind == K_BINARY;
  switch (k->cls) {
    case C_F32: if (bin) binary_f32(k, dst, src[0], src[1], n); else unary_f32(k, dst, src[0], n); break;
    case C_F64: if (bin) binary_f64(k, dst, src[0], src[1], n); else unary_f64(k, dst, src[0], n); break;
    default: if (bin) binary_i64(k, dst, src[0], src[1], n); else unary_i64(k, dst, src[0], n); break;
  }
}

/* ---------------- loads and stores (dtype <-> compute type) ---------------- */

/* Unit stride gets its own loop: the compiler vectorises it (a bool mask, f16), the strided one it cannot. */
#define LOAD_CASE(DT, ST, EXPR) case DT: { const ST *s = (const ST *)p + off;                  \
  if (st == 1) { for (int64_t i = 0; i < n; i++) { ST x = s[i]; d[i] = (EXPR); } }          \
  else { for (int64_t i = 0; i < n; i++) { ST x = s[i * st]; d[i] = (EXPR); } } break; }
#define LOAD_SWITCH(CT)                                                                   \
  switch (t->dtype) {                                                                     \
    LOAD_CASE(EM_F32, float, (CT)x) LOAD_CASE(EM_F64, double, (CT)x)                      \
    LOAD_CASE(EM_BF16, uint16_t, (CT)em_bf16_to_f32(x))                                   \
    LOAD_CASE(EM_F16, uint16_t, (CT)em_f16_to_f32(x))                                     \
    LOAD_CASE(EM_I32, int32_t, (CT)x) LOAD_CASE(EM_I64, int64_t, (CT)x)                   \
    LOAD_CASE(EM_U16, uint16_t, (CT)x) LOAD_CASE(EM_U8, uint8_t, (CT)x)                   \
    LOAD_CASE(EM_BOOL, uint8_t, (CT)(x != 0))                                             \
    default: break;                                                                       \
  }

static void load_f32(float *d, const em_tensor *t, int64_t off, int64_t st, int64_t n) {
  const void *p = t->storage->data; LOAD_SWITCH(float)
}
static void load_f64(double *d, const em_tensor *t, int64_t off, int64_t st, int64_t n) {
  const void *p = t->storage->data; LOAD_SWITCH(double)
}
static void load_i64(int64_t *d, const em_tensor *t, int64_t off, int64_t st, int64_t n) {
  const void *p = t->storage->data;
  switch (t->dtype) {
    LOAD_CASE(EM_F32, float, sat_i64(x)) LOAD_CASE(EM_F64, double, sat_i64(x))
    LOAD_CASE(EM_BF16, uint16_t, sat_i64(em_bf16_to_f32(x)))
    LOAD_CASE(EM_F16, uint16_t, sat_i64(em_f16_to_f32(x)))
    LOAD_CASE(EM_I32, int32_t, x) LOAD_CASE(EM_I64, int64_t, x)
    LOAD_CASE(EM_U16, uint16_t, x) LOAD_CASE(EM_U8, uint8_t, x) LOAD_CASE(EM_BOOL, uint8_t, x != 0)
    default: break;
  }
}

/* Pointer to n elements of the compute type, loading into b unless the tensor
 * already holds the compute type contiguously. */
static const void *load(int cls, const em_tensor *t, int64_t off, int64_t st, int64_t n, chunk_buf *b) {
  if (st == 1 && t->dtype == class_dtype(cls))
    return (const char *)t->storage->data + off * (int64_t)em_dtype_size(t->dtype);
  if (st == 1 && cls == C_F32 && t->dtype == EM_BF16) {   /* em_convert's SIMD clones: the same bits */
    em_convert(b->f, EM_F32, (const uint16_t *)t->storage->data + off, EM_BF16, n);
    return b;
  }
  if (st == 1 && cls == C_F32 && t->dtype == EM_F16) {   /* a SIMD loop of em_f16_to_f32's bits (ew_half.h) */
    em_ew_load_f16(b->f, (const uint16_t *)t->storage->data + off, n);
    return b;
  }
  switch (cls) {
    case C_F32: load_f32(b->f, t, off, st, n); break;
    case C_F64: load_f64(b->d, t, off, st, n); break;
    default: load_i64(b->i, t, off, st, n); break;
  }
  return b;
}

static void fill_const(int cls, chunk_buf *b, double c, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (cls == C_F32) b->f[i] = (float)c;
    else if (cls == C_F64) b->d[i] = c;
    else b->i[i] = sat_i64(c);
  }
}

#define STORE_CASE(DT, DST, EXPR) case DT: { DST *d = (DST *)p + off;                        \
  if (st == 1) { for (int64_t i = 0; i < n; i++) { CT x = s[i]; d[i] = (EXPR); } }         \
  else { for (int64_t i = 0; i < n; i++) { CT x = s[i]; d[i * st] = (EXPR); } } break; }
#define STORE_SWITCH                                                                      \
  switch (t->dtype) {                                                                     \
    STORE_CASE(EM_F32, float, (float)x) STORE_CASE(EM_F64, double, (double)x)             \
    STORE_CASE(EM_BF16, uint16_t, em_f32_to_bf16((float)x))                               \
    STORE_CASE(EM_F16, uint16_t, em_f32_to_f16((float)x))                                 \
    STORE_CASE(EM_I32, int32_t, (int32_t)TO_INT(x)) STORE_CASE(EM_I64, int64_t, TO_INT(x)) \
    STORE_CASE(EM_U16, uint16_t, (uint16_t)TO_INT(x)) STORE_CASE(EM_U8, uint8_t, (uint8_t)TO_INT(x)) \
    STORE_CASE(EM_BOOL, uint8_t, x != 0)                                                  \
    default: break;                                                                       \
  }

#define CT float
#define TO_INT(x) sat_i64(x)
static void store_f32(em_tensor *t, int64_t off, int64_t st, int64_t n, const float *s) {
  void *p = t->storage->data; STORE_SWITCH
}
#undef CT
#define CT double
static void store_f64(em_tensor *t, int64_t off, int64_t st, int64_t n, const double *s) {
  void *p = t->storage->data; STORE_SWITCH
}
#undef CT
#undef TO_INT
#define CT int64_t
#define TO_INT(x) (x)
static void store_i64(em_tensor *t, int64_t off, int64_t st, int64_t n, const int64_t *s) {
  void *p = t->storage->data; STORE_SWITCH
}
#undef CT
#undef TO_INT

static void store(int cls, em_tensor *t, int64_t off, int64_t st, int64_t n, const chunk_buf *b) {
  if (st == 1 && cls == C_F32 && (t->dtype == EM_BF16 || t->dtype == EM_F16)) {   /* as in load(): SIMD */
    em_ew_store16((uint16_t *)t->storage->data + off, t->dtype, b->f, n);
    return;
  }
  switch (cls) {
    case C_F32: store_f32(t, off, st, n, b->f); break;
    case C_F64: store_f64(t, off, st, n, b->d); break;
    default: store_i64(t, off, st, n, b->i); break;
  }
}

/* ---------------- the CPU loop ---------------- */

/* The broadcast iteration space with size-1 dims dropped and mergeable dims
 * merged. Operand 0 is the output. */
typedef em_ew_plan loop_plan;

/* The common cases' plan without the general merge, which would give the
 * same single dim: one element (every dim dropped: stride 0 for all), or
 * every tensor operand of the broadcast shape itself and contiguous (strides
 * of size-1 dims free): numel elements, stride 1 for tensors, 0 for constants. */
static bool plan_flat(loop_plan *p, int nd, const int64_t *shape, int n, const em_tensor *const *ts,
                      int64_t *numel) {
  int64_t m = 1;
  for (int d = 0; d < nd; d++) m *= shape[d];
  if (m == 0) return false;
  for (int k = 0; k < n && m > 1; k++) {
    const em_tensor *t = ts[k];
    if (!t) continue;
    if (t->ndim != nd) return false;
    int64_t want = 1;
    for (int d = nd - 1; d >= 0; d--) {
      if (t->shape[d] != shape[d]) return false;
      if (shape[d] == 1) continue;
      if (t->stride[d] != want) return false;
      want *= shape[d];
    }
  }
  p->shape[0] = m;
  for (int k = 0; k < n; k++) p->stride[k][0] = ts[k] && m > 1 ? 1 : 0;
  p->ndim = 1; p->n = n;
  *numel = m;
  return true;
}

static int64_t plan_init(loop_plan *p, int nd, const int64_t *shape, int n, const em_tensor *const *ts) {
  int64_t st[4][EM_MAX_DIMS], numel = 1;
  if (plan_flat(p, nd, shape, n, ts, &numel)) return numel;
  for (int k = 0; k < n; k++) {
    if (ts[k]) em_broadcast_strides(ts[k], nd, shape, st[k]);
    else for (int d = 0; d < nd; d++) st[k][d] = 0;
  }
  int m = 0;
  for (int d = 0; d < nd; d++) {
    numel *= shape[d];
    if (shape[d] == 1) continue;
    bool merge = m > 0;
    for (int k = 0; k < n && merge; k++) merge = p->stride[k][m - 1] == st[k][d] * shape[d];
    if (merge) {
      p->shape[m - 1] *= shape[d];
      for (int k = 0; k < n; k++) p->stride[k][m - 1] = st[k][d];
    } else {
      p->shape[m] = shape[d];
      for (int k = 0; k < n; k++) p->stride[k][m] = st[k][d];
      m++;
    }
  }
  if (m == 0) {
    p->shape[0] = 1;
    for (int k = 0; k < n; k++) p->stride[k][0] = 0;
    m = 1;
  }
  p->ndim = m; p->n = n;
  return numel;
}

/* Element operations one element of k costs, for the parallel grain: libm
 * calls (exp, tanh, erf, pow, ...) are an order of magnitude dearer than add. */
static int64_t kern_cost(const kern *k) {
  if (k->cls == C_I64 || k->kind == K_WHERE || k->kind == EM_EW_TERNARY) return 1;
  if (k->kind == K_BINARY)
    return k->code == EM_POW || k->code == G_SILU || k->code == G_GELU || k->code == G_SIN || k->code == G_COS ||
           k->code == G_GELU_TANH ? 16 : 1;
  switch (k->code) {
    case EM_EXP: case EM_LOG: case EM_TANH: case EM_SIGMOID: case EM_SILU: case EM_GELU: case EM_SIN:
    case EM_COS: case EM_GELU_TANH: return 16;
    default: return 1;
  }
}

/* The CPU loop runs in tasks of up to TASK elements of one inner row (a
 * multiple of CHUNK, fixed by the shape alone), spread over the threads. A
 * task whose operands all hold the compute type contiguously is one
 * compute() call; otherwise it goes CHUNK by CHUNK through the buffers. */
#define TASK (16 * CHUNK)

typedef struct {
  const kern *k;
  em_tensor *out;
  int nin;
  const operand *in;
  const loop_plan *p;
  int64_t inner, tasks_per_row, base[4];
  bool out_direct, all_direct;
  bool stream;                 /* a large contiguous output: computed into a buffer, streamed out (stream.h) */
  int fast;                    /* FAST_*: a path of ew_half.h instead of compute() */
  bool piece;                  /* the fast path computes into an L1 piece first (streamed, or copied out) */
  bool nt;                     /* a streamed add/sub/mul/div written by ew_nt.h's fused loop (piece_mode 2) */
  union { uint16_t h; float f; } cst[3];   /* FAST_SEL16/32: input q's constant in the output's dtype */
  int roww;                    /* q + 1: input q is one bf16 row every row reads, widened once a call (nt only) */
} ew_job;

/* The longest row widened once for many (em_ew_bf16_widen): 32 KiB of f32,
 * in L1 beside the streamed lines on the hosts that matter (48 KiB). */
#define ROWW_MAX 8192
static _Thread_local _Alignas(64) float roww_buf[ROWW_MAX];

/* EMBER_CPU_ROW_WIDEN=0 (read once at load): widen a broadcast bf16 row in
 * every step again, as before, to compare on a host. The same bits. */
static bool row_widen = true;
__attribute__((constructor)) static void row_widen_init(void) { row_widen = em_env_digit("EMBER_CPU_ROW_WIDEN", 1, 1); }

enum { FAST_NONE, FAST_SEL16, FAST_BIN16, FAST_SEL32 };

/* How a streamed output whose inputs all hold the compute type in place is
 * written, EMBER_CPU_PIECE_OUT (read once at load) to compare them on a host:
 * 0, CHUNK values a compute() call through the CHUNK buffer (before
 * c2ebb13); 1, a whole stream piece a compute() call; 2 (the default), as 1,
 * and add/sub/mul/div of f32 (of bf16, with AVX-512), where and masked_fill
 * (with AVX-512) computed and streamed line by line with no piece between
 * (ew_nt.h, ew_half.h). The same bits. */
static int piece_mode = 2;
__attribute__((constructor)) static void piece_mode_init(void) { piece_mode = em_env_digit("EMBER_CPU_PIECE_OUT", 2, 2); }

/* Elements [c, c + len) of the inner row at offsets off computed as the
 * generic loop does (CHUNK at a time from the same boundaries: c is a multiple
 * of CHUNK), rounded into the unit-stride 16-bit o. */
static void generic16(const ew_job *j, const int64_t *off, int64_t c, int64_t len, uint16_t *o) {
  const loop_plan *p = j->p;
  const kern *k = j->k;
  int last = p->ndim - 1;
  chunk_buf buf[4];
  for (int q = 0; q < j->nin; q++)
    if (!j->in[q].t) fill_const(k->cls, &buf[q + 1], j->in[q].c, CHUNK);
  for (int64_t c0 = 0; c0 < len; c0 += CHUNK) {
    int64_t n = EM_MIN(CHUNK, len - c0);
    const void *src[3];
    for (int q = 0; q < j->nin; q++) {
      int64_t st = p->stride[q + 1][last];
      src[q] = j->in[q].t ? load(k->cls, j->in[q].t, off[q + 1] + (c + c0) * st, st, n, &buf[q + 1]) : &buf[q + 1];
    }
    compute(k, &buf[0], src, n);
    em_ew_store16(o + c0, j->out->dtype, buf[0].f, n);
  }
}

/* Elements [c, c + len) of the inner row at offsets off (operand 0: the
 * output, at `out`) through the fast path: straight into the output, or into
 * an L1 piece streamed (or, for an output that is also an input, copied) out:
 * generic16 must still read the inputs a fused piece was computed from. */
static void fast16(const ew_job *j, const int64_t *off, int64_t c, int64_t len, void *out, const float *rw) {
  const loop_plan *p = j->p;
  int last = p->ndim - 1;
  _Alignas(64) uint16_t piece[EM_STREAM_PIECE / 2];
  uint16_t *o = j->piece ? piece : out;
  int64_t os = j->piece ? 1 : p->stride[0][last];
  const void *v[3];             /* input q's first element (the condition's is a bool) */
  int64_t vs[3];
  for (int q = 0; q < j->nin; q++) {
    const em_tensor *t = j->in[q].t;
    vs[q] = t ? p->stride[q + 1][last] : 0;
    v[q] = t ? (const char *)t->storage->data + (off[q + 1] + c * vs[q]) * (int64_t)em_dtype_size(t->dtype)
             : j->fast == FAST_SEL32 ? (const void *)&j->cst[q].f : (const void *)&j->cst[q].h;
  }
  bool sel = j->fast == FAST_SEL32 || j->fast == FAST_SEL16;
  if (sel && j->stream && piece_mode == 2 && vs[0] == 1 &&   /* selected and streamed in one loop (ew_nt.h) */
      em_ew_select_nt(out, j->fast == FAST_SEL32 ? 4 : 2, v[0], v[1], vs[1], v[2], vs[2], len, j->out->dtype == EM_F16))
    return;
  if (j->fast == FAST_SEL32) {   /* the piece holds len f32 values: EM_STREAM_PIECE bytes */
    em_ew_select32((uint32_t *)o, os, v[0], vs[0], v[1], vs[1], v[2], vs[2], len);
    if (j->stream) em_stream_copy(out, piece, len * 4);
    return;
  }
  if (j->fast == FAST_BIN16 && j->nt && !((uintptr_t)out & 63)) {   /* fused and streamed (ew_half.h) */
    float cv[2];
    for (int q = 0; q < 2; q++)
      cv[q] = !j->in[q].t ? (float)j->in[q].c : em_bf16_to_f32(*(const uint16_t *)v[q]);
    const float *w = rw ? rw + c : NULL;   /* c: a multiple of 32 from the row's start (TASK, the piece) */
    int pair = em_ew_half_binary_nt(j->k->code, out, vs[0] ? v[0] : NULL, cv[0], vs[1] ? v[1] : NULL, cv[1], len,
                                    j->roww == 1 ? w : NULL, j->roww == 2 ? w : NULL);
    if (pair == 0) return;
    if (pair > 0) {   /* a NaN pair: the generic loop's payload, stored over what was streamed */
      em_stream_fence();
      generic16(j, off, c, len, out);
      return;
    }                 /* -1: no AVX-512 loop, the piece below */
  }
  if (j->fast == FAST_SEL16) {
    em_ew_select16(o, os, v[0], vs[0], v[1], vs[1], v[2], vs[2], len, j->out->dtype == EM_F16);
  } else {   /* FAST_BIN16: a per-row tensor value (stride 0) or a number is a float constant */
    float cv[2];
    for (int q = 0; q < 2; q++) {
      uint16_t h = j->in[q].t ? *(const uint16_t *)v[q] : 0;
      cv[q] = !j->in[q].t ? (float)j->in[q].c : j->out->dtype == EM_F16 ? em_f16_to_f32(h) : em_bf16_to_f32(h);
    }
    if (em_ew_half_binary(j->k->code, j->out->dtype, o, vs[0] ? v[0] : NULL, cv[0], vs[1] ? v[1] : NULL, cv[1], len))
      generic16(j, off, c, len, o);   /* NaN with NaN: the generic loop's payload (ew_half.h) */
  }
  if (j->stream) em_stream_copy(out, piece, len * 2);
  else if (j->piece) memcpy(out, piece, (size_t)len * 2);
}

/* EMBER_CPU_NT_SPAN=0|1 (read once at load; 1 the default): a bf16
 * add/sub/mul/div streamed by the fused AVX-512 loop (ew_half.h) computes a
 * whole task (TASK values of a row, 8 KiB out) a call instead of one stream
 * piece (2 KiB values): it writes the output directly, so the piece's size
 * bought nothing, and a call's set-up (operand pointers, dispatch, the loop's
 * constants) came 4x as often. 0: a piece a call, as before. The same bits. */
static bool nt_span = true;
__attribute__((constructor)) static void nt_span_init(void) { nt_span = em_env_digit("EMBER_CPU_NT_SPAN", 1, 1); }

/* fast16 over [c, c + len), len up to TASK: in one call where the fused
 * streamed loop takes it whole (aligned output, AVX-512), else a stream
 * piece a call (fast16's piece holds EM_STREAM_PIECE bytes). */
static void fast16_span(const ew_job *j, const int64_t *off, int64_t c, int64_t len, char *out, size_t out_es,
                        const float *rw) {
  int64_t cap = EM_STREAM_PIECE / (int64_t)out_es;
  if (len <= cap || (j->fast == FAST_BIN16 && j->nt && !((uintptr_t)out & 63) && em_hand_simd() >= EM_HAND_AVX512)) {
    fast16(j, off, c, len, out, rw);
    return;
  }
  for (int64_t x = 0; x < len; x += cap) fast16(j, off, c + x, EM_MIN(cap, len - x), out + x * (int64_t)out_es, rw);
}

static void ew_tasks(void *ctx, int64_t t0, int64_t t1) {
  const ew_job *j = ctx;
  const loop_plan *p = j->p;
  const kern *k = j->k;
  int nin = j->nin, last = p->ndim - 1;
  chunk_buf buf[4];
  for (int q = 0; q < nin; q++)
    if (!j->in[q].t) fill_const(k->cls, &buf[q + 1], j->in[q].c, EM_MIN(CHUNK, j->inner));
  /* position of task t0: row o (outer index), element s of the row */
  int64_t o = t0 / j->tasks_per_row, s = (t0 % j->tasks_per_row) * TASK;
  int64_t idx[EM_MAX_DIMS] = {0}, off[4];
  for (int q = 0; q <= nin; q++) off[q] = j->base[q];
  for (int64_t d = last - 1, r = o; d >= 0; d--) {
    idx[d] = r % p->shape[d];
    r /= p->shape[d];
    for (int q = 0; q <= nin; q++) off[q] += idx[d] * p->stride[q][d];
  }
  size_t out_es = em_dtype_size(j->out->dtype);
  const float *rw = NULL;   /* the broadcast row widened, for all of this call's rows */
  if (j->roww) {
    const em_tensor *r = j->in[j->roww - 1].t;
    const uint16_t *x = (const uint16_t *)r->storage->data + j->base[j->roww];
    if (em_ew_bf16_widen(roww_buf, x, j->inner)) rw = roww_buf;
  }
  for (int64_t t = t0; t < t1; t++) {
    int64_t end = EM_MIN(s + TASK, j->inner);
    /* a streamed output whose inputs are all read in place: a whole stream piece
     * a compute() call (CHUNK's per-call costs, a quarter of the time of an f32
     * row-broadcast add at 16 threads, paid 4x less often); piece_mode 0: CHUNK */
    bool piece_out = j->stream && j->all_direct && piece_mode > 0;
    int64_t step = j->fast ? (j->piece && !(nt_span && j->nt && j->fast == FAST_BIN16) ? EM_STREAM_PIECE / (int64_t)out_es
                                                                                      : end - s)
                 : piece_out ? EM_STREAM_PIECE / (int64_t)out_es : j->all_direct && !j->stream ? end - s : CHUNK;
    for (int64_t c = s; c < end; c += step) {
      int64_t len = EM_MIN(step, end - c);
      if (j->fast) {
        fast16_span(j, off, c, len, (char *)j->out->storage->data + (off[0] + c * p->stride[0][last]) * (int64_t)out_es,
                    out_es, rw);
        continue;
      }
      const void *src[3];
      for (int q = 0; q < nin; q++) {
        int64_t st = p->stride[q + 1][last];
        src[q] = j->in[q].t ? load(k->cls, j->in[q].t, off[q + 1] + c * st, st, len, &buf[q + 1]) : &buf[q + 1];
      }
      int64_t o0 = off[0] + c * p->stride[0][last];
      void *out = (char *)j->out->storage->data + o0 * (int64_t)out_es;
      if (j->nt && !((uintptr_t)out & 63)) {   /* loaded, computed and streamed line by line (ew_nt.h) */
        if (!em_ew_f32_binary_nt(k->code, out, src[0], src[1], len)) continue;
        em_stream_fence();                      /* a NaN: the generic loop's payload, through the piece */
      }
      if (piece_out) {
        _Alignas(64) char piece[EM_STREAM_PIECE];
        compute(k, piece, src, len);
        em_stream_copy(out, piece, len * (int64_t)out_es);
        continue;
      }
      compute(k, j->out_direct && !j->stream ? out : (void *)&buf[0], src, len);
      if (j->stream && j->out_direct) em_stream_copy(out, &buf[0], len * (int64_t)out_es);
      else if (j->stream) {   /* a bf16/f16 output: rounded into an L1 buffer, then streamed */
        _Alignas(64) uint16_t h[CHUNK];
        em_ew_store16(h, j->out->dtype, buf[0].f, len);
        em_stream_copy(out, h, len * 2);
      } else if (!j->out_direct) store(k->cls, j->out, o0, p->stride[0][last], len, &buf[0]);
    }
    s = end;
    if (s < j->inner) continue;
    s = 0;                                   /* next row */
    for (int d = last - 1; d >= 0; d--) {
      for (int q = 0; q <= nin; q++) off[q] += p->stride[q][d];
      if (++idx[d] < p->shape[d]) break;
      for (int q = 0; q <= nin; q++) off[q] -= p->stride[q][d] * p->shape[d];
      idx[d] = 0;
    }
  }
}

/* The ew_half.h path that computes this 16-bit output (C_F32 into bf16/f16)
 * or f32 output, or FAST_NONE: where/masked_fill with a bool condition and
 * every value a tensor of the output's dtype or a constant (any strides:
 * FAST_SEL16, FAST_SEL32 for f32); add/sub/mul/div into a unit-stride 16-bit
 * output from tensors of its dtype, each unit-stride or one value per row
 * along the inner dim, or numbers. */
static int fast_path(const kern *k, const em_tensor *out, int nin, const operand *in, const loop_plan *p) {
  int last = p->ndim - 1;
  if (k->kind == K_WHERE && nin == 3 && in[0].t && in[0].t->dtype == EM_BOOL) {
    for (int q = 1; q < 3; q++)
      if (in[q].t && in[q].t->dtype != out->dtype) return FAST_NONE;
    return out->dtype == EM_F32 ? FAST_SEL32 : FAST_SEL16;
  }
  if (out->dtype == EM_F32) return FAST_NONE;
  if (k->kind == K_BINARY && nin == 2 && em_ew_half_binary_has(k->code) && p->stride[0][last] == 1) {
    for (int q = 0; q < 2; q++)
      if (in[q].t && (in[q].t->dtype != out->dtype || (p->stride[q + 1][last] != 0 && p->stride[q + 1][last] != 1)))
        return FAST_NONE;
    return FAST_BIN16;
  }
  return FAST_NONE;
}

static void cpu_loop(const kern *k, em_tensor *out, int nin, const operand *in, int nd, const int64_t *shape) {
  const em_tensor *ts[4] = {out, NULL, NULL, NULL};
  for (int j = 0; j < nin; j++) ts[j + 1] = in[j].t;
  loop_plan p;
  int64_t numel = plan_init(&p, nd, shape, nin + 1, ts);
  if (numel == 0) return;
  int last = p.ndim - 1;
  ew_job j = {k, out, nin, in, &p, p.shape[last], 0, {0}, false, true, false, FAST_NONE, false, false, {{0}}, 0};
  j.tasks_per_row = (j.inner + TASK - 1) / TASK;
  for (int q = 0; q <= nin; q++) j.base[q] = ts[q] ? ts[q]->offset : 0;
  j.out_direct = out->dtype == class_dtype(k->cls) && p.stride[0][last] == 1;
  j.all_direct = j.out_direct;
  bool half = k->cls == C_F32 && (out->dtype == EM_BF16 || out->dtype == EM_F16);
  j.fast = half || (k->cls == C_F32 && out->dtype == EM_F32) ? fast_path(k, out, nin, in, &p) : FAST_NONE;
  if (j.fast == FAST_SEL16)
    for (int q = 1; q < 3; q++)
      if (!in[q].t) j.cst[q].h = out->dtype == EM_BF16 ? em_f32_to_bf16((float)in[q].c) : em_f32_to_f16((float)in[q].c);
  if (j.fast == FAST_SEL32)
    for (int q = 1; q < 3; q++) j.cst[q].f = (float)in[q].c;   /* fill_const's value */
  j.stream = (j.out_direct || half) && p.stride[0][last] == 1 &&
             em_stream_wanted(numel * (int64_t)em_dtype_size(out->dtype));
  for (int q = 0; q < nin; q++)
    j.all_direct = j.all_direct && in[q].t && p.stride[q + 1][last] == 1 && in[q].t->dtype == class_dtype(k->cls);
  j.piece = j.stream;
  bool alias = false;
  for (int q = 0; q < nin; q++) alias = alias || (in[q].t && in[q].t->storage == out->storage);
  if (j.fast == FAST_BIN16) j.piece = j.piece || alias;   /* a += b: see fast16 */
  /* the fused streamed loops (piece_mode 2) recompute a piece with a NaN the
   * generic way, from inputs that must still be there: not for a += b */
  bool nt_op = k->kind == K_BINARY && nin == 2 && em_ew_half_binary_has(k->code) && piece_mode == 2 && !alias;
  j.nt = nt_op && j.stream && ((j.fast == FAST_BIN16 && out->dtype == EM_BF16) ||
                               (j.fast == FAST_NONE && j.all_direct && out->dtype == EM_F32 && em_ew_f32_nt_has(k->code)));
  /* an operand that is one bf16 row read by every row (stride 0 in every outer
   * dim): widened to f32 once a call of ew_tasks, not once a row */
  for (int q = 0; q < 2 && j.nt && j.fast == FAST_BIN16 && row_widen && j.inner <= ROWW_MAX && numel > j.inner; q++) {
    bool row = in[q].t && p.stride[q + 1][last] == 1;
    for (int d = 0; d < last && row; d++) row = p.stride[q + 1][d] == 0 || p.shape[d] == 1;
    if (row && !j.roww) j.roww = q + 1;
  }
  int64_t tasks = numel / j.inner * j.tasks_per_row;
  em_parallel_for_mem(tasks, em_grain(EM_MIN(TASK, j.inner) * kern_cost(k)), ew_tasks, &j);
}

static bool same_view(const em_tensor *a, const em_tensor *b) {
  if (a->storage != b->storage || a->offset != b->offset || a->ndim != b->ndim || a->dtype != b->dtype) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->stride[d] != b->stride[d])) return false;
  return true;
}

/* An input that shares memory with out without being exactly out (a shifted
 * or transposed view) would be overwritten before it is read: go through a temporary. */
static bool needs_temp(const em_tensor *out, int nin, const operand *in) {
  for (int j = 0; j < nin; j++)
    if (in[j].t && in[j].t->storage == out->storage && !same_view(in[j].t, out)) return true;
  return false;
}

/* The device switch: the CPU loop, or the CUDA launcher over the same plan. */
static int device_loop(const char *name, const kern *k, em_tensor *out, int nin, const operand *in,
                       int nd, const int64_t *shape) {
  if (out->device.type == EM_CPU) { cpu_loop(k, out, nin, in, nd, shape); return 0; }
  if (out->device.type == EM_CUDA) {
    const em_tensor *ts[4] = {out, NULL, NULL, NULL};
    for (int j = 0; j < nin; j++) ts[j + 1] = in[j].t;
    loop_plan p;
    int64_t numel = plan_init(&p, nd, shape, nin + 1, ts);
    return em_elementwise_cuda(name, k, out, nin, in, &p, numel);
  }
  return em_error_device(name, out);
}

static int run_kernel(const char *name, const kern *k, em_tensor *out, int nin, const operand *in,
                      int nd, const int64_t *shape) {
  if (EM_COSTING()) {   /* every elementwise op: its operands read once, the result written once, 1 FLOP each */
    double bytes = em_cost_nbytes(out);
    for (int i = 0; i < nin; i++) bytes += em_cost_nbytes(in[i].t);
    em_op_cost_add(bytes, (double)em_shape_numel(nd, shape), em_cost_simt_class(out->dtype));
  }
  if (!needs_temp(out, nin, in)) return device_loop(name, k, out, nin, in, nd, shape);
  em_tensor *tmp = em_empty(out->ndim, out->shape, out->dtype, out->device);
  if (!tmp) return -1;
  int rc = device_loop(name, k, tmp, nin, in, nd, shape);
  bool g = em_set_grad_enabled(false);
  if (rc == 0) rc = em_copy_(out, tmp);
  em_set_grad_enabled(g);
  em_tensor_release(tmp);
  return rc;
}

/* ---------------- shared validation ---------------- */

static int category(em_dtype t) { return t == EM_BOOL ? 0 : em_dtype_is_float(t) ? 2 : 1; }

/* The result tensor: a new one, or `out` validated (shape, device, in-place
 * rules, and PyTorch's same-kind cast: a float result cannot go into an integer
 * out, nor a non-bool result into a bool out) and retained. Writing into out is
 * not recorded by autograd. */
static em_tensor *make_result(const char *name, em_tensor *out, int nd, const int64_t *shape, em_dtype dt,
                              em_device dev, bool grad) {
  if (!out) return em_empty(nd, shape, dt, dev);
  if (em_check_out(name, out, nd, shape, dev)) return NULL;
  if (category(dt) > category(out->dtype)) {
    em_error("%s: result type %s can't be cast to the desired output type %s", name, em_dtype_name(dt),
             em_dtype_name(out->dtype));
    return NULL;
  }
  if (grad) {
    em_error("%s: out= cannot be used when an input requires grad (autograd does not record writes "
             "into out); drop out= or use ember.no_grad", name);
    return NULL;
  }
  em_bump_version(out);
  return em_tensor_retain(out);
}

static bool integral(double s) { return isfinite(s) && floor(s) == s; }

/* dtype of (tensor of dtype t) OP (a Lua number s): t, unless s is fractional
 * and t integral (f32), or t is bool (i64 for an integral number). */
static em_dtype scalar_promote(em_dtype t, double s) {
  if (em_dtype_is_float(t)) return t;
  if (!integral(s)) return EM_F32;
  return t == EM_BOOL ? EM_I64 : t;
}

static bool is_comparison(int op) { return op >= EM_EQ && op <= EM_GE; }
static bool is_logical(int op) { return op == EM_LOGICAL_AND || op == EM_LOGICAL_OR; }

/* PyTorch's result type for two tensors: a 0-d tensor next to a dimensioned
 * one only decides the dtype when it is of a higher category (bool < int <
 * float): f32 tensor + f64 0-d gives f32, i32 tensor + f64 0-d gives f64. */
static em_dtype result_type(const em_tensor *a, const em_tensor *b) {
  bool za = a->ndim == 0, zb = b->ndim == 0;
  if (za == zb) return em_promote(a->dtype, b->dtype);
  const em_tensor *z = za ? a : b, *d = za ? b : a;
  return category(z->dtype) > category(d->dtype) ? z->dtype : d->dtype;
}

/* Result and compute dtypes of binary op `op` whose operands promote to p. */
static int binary_dtypes(const char *name, int op, em_dtype p, bool has_bool, em_dtype *res, em_dtype *comp) {
  *res = *comp = p;
  if (op == EM_SUB && has_bool)
    return em_error("%s: subtraction with a bool tensor is not supported (use logical_xor or ne)", name);
  if (op == EM_DIV && !em_dtype_is_float(p)) *res = *comp = EM_F32;   /* true division */
  if (is_comparison(op) || is_logical(op)) *res = EM_BOOL;
  return 0;
}

static bool binop_differentiable(int op) { return op <= EM_MINIMUM; }

/* ---------------- backward helpers ---------------- */

/* Forward declarations for kernels used by backward formulas. */
static em_tensor *raw_binary(const char *name, int code, em_tensor *a, em_tensor *b, double lo, double hi);
static em_tensor *where_raw(const char *name, em_tensor *cond, operand a, operand b, em_dtype dt,
                            em_tensor *out, bool grad);

/* Gradient weight of maximum/minimum for the first operand: 1 where it won,
 * 1/2 on ties (PyTorch splits evenly), 0 where it lost. f32 (exact values). */
static em_tensor *minmax_weight(em_scratch *s, bool is_max, em_tensor *a, em_tensor *b, double sb) {
  em_tensor *w, *e;
  if (b) {
    w = EM_TMP(s, em_binary(is_max ? EM_GT : EM_LT, a, b, NULL));
    e = EM_TMP(s, em_binary(EM_EQ, a, b, NULL));
  } else {
    w = EM_TMP(s, em_binary_scalar(is_max ? EM_GT : EM_LT, a, sb, false, NULL));
    e = EM_TMP(s, em_binary_scalar(EM_EQ, a, sb, false, NULL));
  }
  em_tensor *h = EM_TMP(s, em_binary_scalar(EM_MUL, e, 0.5, false, NULL));
  return EM_TMP(s, em_binary(EM_ADD, h, w, NULL));
}

/* d/da a^b = b a^(b-1) (0 where b == 0); d/db a^b = a^b ln a (0 where a == 0, b >= 0). */
static void pow_grads(em_scratch *s, em_node *n, em_tensor *g, em_tensor **ga, em_tensor **gb) {
  em_tensor *a = n->saved[0], *b = n->saved[1], *out = n->saved[2];
  if (em_node_needs_input_grad(n, 0)) {
    em_tensor *bm1 = EM_TMP(s, em_binary_scalar(EM_SUB, b, 1, false, NULL));
    em_tensor *p = EM_TMP(s, em_binary(EM_POW, a, bm1, NULL));
    em_tensor *t = EM_TMP(s, em_binary(EM_MUL, p, b, NULL));
    em_tensor *z = EM_TMP(s, em_binary_scalar(EM_EQ, b, 0, false, NULL));
    em_tensor *m = EM_TMP(s, em_masked_fill(t, z, 0, NULL));
    *ga = EM_TMP(s, em_binary(EM_MUL, g, m, NULL));
  }
  if (em_node_needs_input_grad(n, 1)) {
    em_tensor *la = EM_TMP(s, em_unary(EM_LOG, a, NULL));
    em_tensor *t = EM_TMP(s, em_binary(EM_MUL, out, la, NULL));
    em_tensor *a0 = EM_TMP(s, em_binary_scalar(EM_EQ, a, 0, false, NULL));
    em_tensor *bp = EM_TMP(s, em_binary_scalar(EM_GE, b, 0, false, NULL));
    em_tensor *z = EM_TMP(s, em_binary(EM_LOGICAL_AND, a0, bp, NULL));
    em_tensor *m = EM_TMP(s, em_masked_fill(t, z, 0, NULL));
    *gb = EM_TMP(s, em_binary(EM_MUL, g, m, NULL));
  }
}

/* Saved tensors by op: mul (a, b); div (b, out); pow (a, b, out); maximum/minimum (a, b). */
static int binary_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *g = gout[0], **sv = n->saved, *ga = NULL, *gb = NULL;
  bool nb = em_node_needs_input_grad(n, 1);
  em_scratch s = {0};
  switch ((int)n->i[0]) {
    case EM_ADD: ga = gb = g; break;
    case EM_SUB:
      ga = g;
      if (nb) gb = EM_TMP(&s, em_unary(EM_NEG, g, NULL));
      break;
    case EM_MUL:
      ga = EM_TMP(&s, em_binary(EM_MUL, g, sv[1], NULL));
      if (nb) gb = EM_TMP(&s, em_binary(EM_MUL, g, sv[0], NULL));
      break;
    case EM_DIV: {   /* d/db a/b = -(g/b) * (a/b) */
      ga = EM_TMP(&s, em_binary(EM_DIV, g, sv[0], NULL));
      em_tensor *t = nb ? EM_TMP(&s, em_binary(EM_MUL, ga, sv[1], NULL)) : NULL;
      if (nb) gb = EM_TMP(&s, em_unary(EM_NEG, t, NULL));
      break;
    }
    case EM_POW: pow_grads(&s, n, g, &ga, &gb); break;
    case EM_MAXIMUM: case EM_MINIMUM: {
      em_tensor *wa = minmax_weight(&s, n->i[0] == EM_MAXIMUM, sv[0], sv[1], 0);
      ga = EM_TMP(&s, em_binary(EM_MUL, g, wa, NULL));
      em_tensor *wb = nb ? EM_TMP(&s, em_binary_scalar(EM_SUB, wa, 1, true, NULL)) : NULL;
      if (nb) gb = EM_TMP(&s, em_binary(EM_MUL, g, wb, NULL));
      break;
    }
    default: em_error("backward: unknown binary op %d", (int)n->i[0]); s.failed = true; break;
  }
  em_scratch_give(&s, n, 0, ga, gin);
  em_scratch_give(&s, n, 1, gb, gin);
  return em_scratch_end(&s);
}

static em_tensor *record_binary(int op, em_tensor *a, em_tensor *b, em_tensor *out) {
  em_tensor *sv[3] = {NULL, NULL, NULL};
  switch (op) {
    case EM_MUL: case EM_MAXIMUM: case EM_MINIMUM: sv[0] = a; sv[1] = b; break;
    case EM_DIV: sv[0] = b; sv[1] = out; break;
    case EM_POW: sv[0] = a; sv[1] = b; sv[2] = out; break;
    default: break;
  }
  em_node *n;
  out = em_op_record(out, &n, binop_names[op], binary_backward, 2, (em_tensor *[]){a, b}, 3, sv);
  if (n) n->i[0] = op;
  return out;
}

/* Scalar ops: f[0] = s, i[0] = op, i[1] = scalar_first; saved[0] = a, saved[1] = out when used. */
static int scalar_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *g = gout[0], *a = n->saved[0], *out = n->saved[1], *ga = NULL;
  double sc = n->f[0];
  bool first = n->i[1] != 0;
  em_scratch s = {0};
  switch ((int)n->i[0]) {
    case EM_ADD: ga = g; break;
    case EM_SUB: ga = first ? EM_TMP(&s, em_unary(EM_NEG, g, NULL)) : g; break;
    case EM_MUL: ga = EM_TMP(&s, em_binary_scalar(EM_MUL, g, sc, false, NULL)); break;
    case EM_DIV:
      if (!first) { ga = EM_TMP(&s, em_binary_scalar(EM_DIV, g, sc, false, NULL)); break; }
      {   /* d/da s/a = -(s/a)/a */
        em_tensor *t = EM_TMP(&s, em_binary(EM_MUL, g, out, NULL));
        em_tensor *u = EM_TMP(&s, em_binary(EM_DIV, t, a, NULL));
        ga = EM_TMP(&s, em_unary(EM_NEG, u, NULL));
      }
      break;
    case EM_POW:
      if (!first && sc == 0) { ga = EM_TMP(&s, em_zeros(g->ndim, g->shape, g->dtype, g->device)); break; }
      if (!first) {   /* s a^(s-1) */
        em_tensor *p = EM_TMP(&s, em_binary_scalar(EM_POW, a, sc - 1, false, NULL));
        em_tensor *t = EM_TMP(&s, em_binary_scalar(EM_MUL, p, sc, false, NULL));
        ga = EM_TMP(&s, em_binary(EM_MUL, g, t, NULL));
      } else {        /* s^a ln s, 0 where s == 0 and a >= 0 */
        em_tensor *t = EM_TMP(&s, em_binary_scalar(EM_MUL, out, log(sc), false, NULL));
        if (sc == 0) {
          em_tensor *m = EM_TMP(&s, em_binary_scalar(EM_GE, a, 0, false, NULL));
          t = EM_TMP(&s, em_masked_fill(t, m, 0, NULL));
        }
        ga = EM_TMP(&s, em_binary(EM_MUL, g, t, NULL));
      }
      break;
    case EM_MAXIMUM: case EM_MINIMUM: {
      em_tensor *w = minmax_weight(&s, n->i[0] == EM_MAXIMUM, a, NULL, sc);
      ga = EM_TMP(&s, em_binary(EM_MUL, g, w, NULL));
      break;
    }
    default: em_error("backward: unknown scalar op %d", (int)n->i[0]); s.failed = true; break;
  }
  em_scratch_give(&s, n, 0, ga, gin);
  return em_scratch_end(&s);
}

static em_tensor *record_scalar(int op, em_tensor *a, double sc, bool first, em_tensor *out) {
  bool save_a = op == EM_POW || op == EM_MAXIMUM || op == EM_MINIMUM || (op == EM_DIV && first);
  bool save_out = first && (op == EM_POW || op == EM_DIV);
  em_node *n;
  out = em_op_record(out, &n, binop_names[op], scalar_backward, 1, &a, 2,
                     (em_tensor *[]){save_a || save_out ? a : NULL, save_out ? out : NULL});
  if (n) { n->f[0] = sc; n->i[0] = op; n->i[1] = first; }
  return out;
}

/* ---------------- binary ops ---------------- */

em_tensor *em_binary(em_binop op, em_tensor *a, em_tensor *b, em_tensor *out) {
  EM_OP_SCOPE(em_binop_name(op));
  const char *name = em_binop_name(op);
  EM_CHECK_NULL((unsigned)op < EM_NBINOPS, "binary: invalid op %d", (int)op);
  EM_CHECK_NULL(a && b, "%s: expected two tensors, got NULL", name);
  if (em_check_same_device(name, a, b)) return NULL;
  em_dtype rt, ct;
  if (binary_dtypes(name, op, result_type(a, b), a->dtype == EM_BOOL || b->dtype == EM_BOOL, &rt, &ct))
    return NULL;
  int nd; int64_t shape[EM_MAX_DIMS];
  if (em_broadcast_shape(name, a->ndim, a->shape, b->ndim, b->shape, &nd, shape)) return NULL;
  bool grad = binop_differentiable(op) && em_grad_needed(2, (em_tensor *[]){a, b});
  em_tensor *res = make_result(name, out, nd, shape, rt, a->device, grad);
  if (!res) return NULL;
  kern k = {K_BINARY, op, dtype_class(ct), 0, 0};
  operand in[2] = {{a, 0}, {b, 0}};
  if (run_kernel(name, &k, res, 2, in, nd, shape)) { em_tensor_release(res); return NULL; }
  return grad ? record_binary(op, a, b, res) : res;
}

em_tensor *em_binary_scalar(em_binop op, em_tensor *a, double sc, bool scalar_first, em_tensor *out) {
  EM_OP_SCOPE(em_binop_name(op));
  const char *name = em_binop_name(op);
  EM_CHECK_NULL((unsigned)op < EM_NBINOPS, "binary: invalid op %d", (int)op);
  EM_CHECK_NULL(a, "%s: expected a tensor, got NULL", name);
  em_dtype rt, ct;
  if (binary_dtypes(name, op, scalar_promote(a->dtype, sc), a->dtype == EM_BOOL, &rt, &ct)) return NULL;
  if (op == EM_POW && !scalar_first && !em_dtype_is_float(ct) && sc < 0) {
    em_error("%s: integers to negative integer powers are not allowed (got exponent %g on a %s tensor)",
             name, sc, em_dtype_name(a->dtype));
    return NULL;
  }
  if ((is_comparison(op)) && (ct == EM_BF16 || ct == EM_F16))   /* compare with the number as stored in ct */
    sc = ct == EM_BF16 ? em_bf16_to_f32(em_f32_to_bf16((float)sc)) : em_f16_to_f32(em_f32_to_f16((float)sc));
  bool grad = binop_differentiable(op) && em_grad_needed(1, &a);
  em_tensor *res = make_result(name, out, a->ndim, a->shape, rt, a->device, grad);
  if (!res) return NULL;
  kern k = {K_BINARY, op, dtype_class(ct), 0, 0};
  operand t = {a, 0}, c = {NULL, sc};
  operand in[2] = {scalar_first ? c : t, scalar_first ? t : c};
  if (run_kernel(name, &k, res, 2, in, a->ndim, a->shape)) { em_tensor_release(res); return NULL; }
  return grad ? record_scalar(op, a, sc, scalar_first, res) : res;
}

/* ---------------- unary ops ---------------- */

static bool float_only(int op) {
  switch (op) {
    case EM_SQRT: case EM_RSQRT: case EM_EXP: case EM_LOG: case EM_TANH: case EM_SIGMOID:
    case EM_SILU: case EM_GELU: case EM_SIN: case EM_COS: case EM_RECIPROCAL: case EM_GELU_TANH: return true;
    default: return false;
  }
}

static int unary_dtypes(const char *name, int op, em_dtype t, em_dtype *res, em_dtype *comp) {
  *res = *comp = t;
  if (float_only(op) && !em_dtype_is_float(t)) *res = *comp = EM_F32;
  else if (op == EM_NEG && t == EM_BOOL)
    return em_error("%s: negation of a bool tensor is not supported (use logical_not)", name);
  else if (op == EM_SQUARE && t == EM_BOOL) *res = *comp = EM_I64;
  else if (op == EM_LOGICAL_NOT) *res = EM_BOOL;
  return 0;
}

/* Gradient kernel of each differentiable unary op and what it reads: the input x or the output y. */
enum { SAVE_NONE, SAVE_X, SAVE_Y };
static const struct { bool diff; int code, save; } unary_grad[EM_NUNOPS] = {
  [EM_NEG] = {true, EM_NEG, SAVE_NONE}, [EM_ABS] = {true, G_ABS, SAVE_X},
  [EM_SQRT] = {true, G_SQRT, SAVE_Y}, [EM_RSQRT] = {true, G_RSQRT, SAVE_Y},
  [EM_EXP] = {true, EM_MUL, SAVE_Y}, [EM_LOG] = {true, EM_DIV, SAVE_X},
  [EM_TANH] = {true, G_TANH, SAVE_Y}, [EM_SIGMOID] = {true, G_SIGMOID, SAVE_Y},
  [EM_SILU] = {true, G_SILU, SAVE_X}, [EM_RELU] = {true, G_RELU, SAVE_Y},
  [EM_GELU] = {true, G_GELU, SAVE_X}, [EM_SIN] = {true, G_SIN, SAVE_X},
  [EM_COS] = {true, G_COS, SAVE_X}, [EM_SQUARE] = {true, G_SQUARE, SAVE_X},
  [EM_RECIPROCAL] = {true, G_RECIP, SAVE_Y}, [EM_GELU_TANH] = {true, G_GELU_TANH, SAVE_X},
};

static int unary_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  int op = (int)n->i[0];
  if (op == EM_NEG) gin[0] = em_unary(EM_NEG, gout[0], NULL);
  else gin[0] = raw_binary(n->op, unary_grad[op].code, gout[0], n->saved[0], 0, 0);
  return gin[0] ? 0 : -1;
}

static em_tensor *record_unary(int op, em_tensor *a, em_tensor *out) {
  em_tensor *sv = unary_grad[op].save == SAVE_X ? a : unary_grad[op].save == SAVE_Y ? out : NULL;
  em_node *n;
  out = em_op_record(out, &n, unop_names[op], unary_backward, 1, &a, 1, &sv);
  if (n) n->i[0] = op;
  return out;
}

em_tensor *em_unary(em_unop op, em_tensor *a, em_tensor *out) {
  EM_OP_SCOPE(em_unop_name(op));
  const char *name = em_unop_name(op);
  EM_CHECK_NULL((unsigned)op < EM_NUNOPS, "unary: invalid op %d", (int)op);
  EM_CHECK_NULL(a, "%s: expected a tensor, got NULL", name);
  /* exp, log and rsqrt are on autocast's f32 list (as in PyTorch) */
  if (!out && (op == EM_EXP || op == EM_LOG || op == EM_RSQRT) && em_autocast_enabled() &&
      (a->dtype == EM_BF16 || a->dtype == EM_F16)) {
    em_tensor *u = em_autocast_upper(a), *r = u ? em_unary(op, u, NULL) : NULL;
    em_tensor_release(u);
    return r;
  }
  em_dtype rt, ct;
  if (unary_dtypes(name, op, a->dtype, &rt, &ct)) return NULL;
  bool grad = unary_grad[op].diff && em_grad_needed(1, &a);
  em_tensor *res = make_result(name, out, a->ndim, a->shape, rt, a->device, grad);
  if (!res) return NULL;
  kern k = {K_UNARY, op, dtype_class(ct), 0, 0};
  operand in[1] = {{a, 0}};
  if (run_kernel(name, &k, res, 1, in, a->ndim, a->shape)) { em_tensor_release(res); return NULL; }
  return grad ? record_unary(op, a, res) : res;
}

/* Internal binary kernel (gradients): broadcast + promote, no autograd. */
static em_tensor *raw_binary(const char *name, int code, em_tensor *a, em_tensor *b, double lo, double hi) {
  int nd; int64_t shape[EM_MAX_DIMS];
  if (em_check_same_device(name, a, b) ||
      em_broadcast_shape(name, a->ndim, a->shape, b->ndim, b->shape, &nd, shape)) return NULL;
  em_dtype dt = em_promote(a->dtype, b->dtype);
  em_tensor *res = em_empty(nd, shape, dt, a->device);
  if (!res) return NULL;
  kern k = {K_BINARY, code, dtype_class(dt), lo, hi};
  operand in[2] = {{a, 0}, {b, 0}};
  if (run_kernel(name, &k, res, 2, in, nd, shape)) { em_tensor_release(res); return NULL; }
  return res;
}

/* ---------------- clamp ---------------- */

static int clamp_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  gin[0] = raw_binary("clamp", G_CLAMP, gout[0], n->saved[0], n->f[0], n->f[1]);
  return gin[0] ? 0 : -1;
}

em_tensor *em_clamp(em_tensor *a, double lo, double hi, em_tensor *out) {
  EM_OP_SCOPE("clamp");
  EM_CHECK_NULL(a, "clamp: expected a tensor, got NULL");
  EM_CHECK_NULL(!isnan(lo) || !isnan(hi), "clamp: at least one of min and max must be given");
  em_dtype dt = a->dtype;
  if (!em_dtype_is_float(dt) && ((!isnan(lo) && !integral(lo)) || (!isnan(hi) && !integral(hi)))) dt = EM_F32;
  double l = isnan(lo) ? -INFINITY : lo, h = isnan(hi) ? INFINITY : hi;
  bool grad = em_grad_needed(1, &a);
  em_tensor *res = make_result("clamp", out, a->ndim, a->shape, dt, a->device, grad);
  if (!res) return NULL;
  kern k = {K_UNARY, U_CLAMP, dtype_class(dt), l, h};
  operand in[1] = {{a, 0}};
  if (run_kernel("clamp", &k, res, 1, in, a->ndim, a->shape)) { em_tensor_release(res); return NULL; }
  em_node *n;
  res = em_op_record(res, &n, "clamp", clamp_backward, 1, &a, 1, &a);
  if (n) { n->f[0] = l; n->f[1] = h; }
  return res;
}

/* ---------------- where, masked_fill ---------------- */

static int where_shape(const char *name, const em_tensor *cond, const operand *a, const operand *b,
                       int *nd, int64_t *shape) {
  *nd = cond->ndim;
  memcpy(shape, cond->shape, sizeof(int64_t) * (size_t)cond->ndim);
  const operand *ops[2] = {a, b};
  for (int j = 0; j < 2; j++) {
    const em_tensor *t = ops[j]->t;
    if (!t) continue;
    int64_t s[EM_MAX_DIMS];
    if (em_broadcast_shape(name, *nd, shape, t->ndim, t->shape, nd, s)) return -1;
    memcpy(shape, s, sizeof(int64_t) * (size_t)*nd);
  }
  return 0;
}

/* out[i] = cond[i] ? a[i] : b[i] over the broadcast shape, in dtype dt. */
static em_tensor *where_raw(const char *name, em_tensor *cond, operand a, operand b, em_dtype dt,
                            em_tensor *out, bool grad) {
  if (cond->dtype != EM_BOOL) {
    em_error("%s: expected the mask/condition to be a bool tensor, got %s", name, em_dtype_name(cond->dtype));
    return NULL;
  }
  if ((a.t && em_check_same_device(name, cond, a.t)) || (b.t && em_check_same_device(name, cond, b.t)))
    return NULL;
  int nd; int64_t shape[EM_MAX_DIMS];
  if (where_shape(name, cond, &a, &b, &nd, shape)) return NULL;
  em_tensor *res = make_result(name, out, nd, shape, dt, cond->device, grad);
  if (!res) return NULL;
  kern k = {K_WHERE, 0, dtype_class(dt), 0, 0};
  operand in[3] = {{cond, 0}, a, b};
  if (run_kernel(name, &k, res, 3, in, nd, shape)) { em_tensor_release(res); return NULL; }
  return res;
}

/* where: saved[0] = cond; inputs a, b. */
static int where_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *g = gout[0], *cond = n->saved[0];
  operand zero = {NULL, 0}, tg = {g, 0};
  em_scratch s = {0};
  em_tensor *ga = em_node_needs_input_grad(n, 0) ? EM_TMP(&s, where_raw("where", cond, tg, zero, g->dtype, NULL, false)) : NULL;
  em_tensor *gb = em_node_needs_input_grad(n, 1) ? EM_TMP(&s, where_raw("where", cond, zero, tg, g->dtype, NULL, false)) : NULL;
  em_scratch_give(&s, n, 0, ga, gin);
  em_scratch_give(&s, n, 1, gb, gin);
  return em_scratch_end(&s);
}

em_tensor *em_where(em_tensor *cond, em_tensor *a, em_tensor *b) {
  EM_OP_SCOPE("where");
  EM_CHECK_NULL(cond && a && b, "where: expected three tensors (cond, a, b), got NULL");
  if (em_check_same_device("where", a, b)) return NULL;
  bool grad = em_grad_needed(2, (em_tensor *[]){a, b});
  operand oa = {a, 0}, ob = {b, 0};
  em_tensor *res = where_raw("where", cond, oa, ob, result_type(a, b), NULL, false);
  if (!res || !grad) return res;
  return em_op_record(res, NULL, "where", where_backward, 2, (em_tensor *[]){a, b}, 1, &cond);
}

static int masked_fill_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  em_tensor *g = gout[0];
  operand zero = {NULL, 0}, tg = {g, 0};
  em_scratch s = {0};
  em_tensor *ga = EM_TMP(&s, where_raw("masked_fill", n->saved[0], zero, tg, g->dtype, NULL, false));
  em_scratch_give(&s, n, 0, ga, gin);
  return em_scratch_end(&s);
}

em_tensor *em_masked_fill(em_tensor *a, em_tensor *mask, double v, em_tensor *out) {
  EM_OP_SCOPE("masked_fill");
  EM_CHECK_NULL(a && mask, "masked_fill: expected a tensor and a mask, got NULL");
  bool grad = em_grad_needed(1, &a);
  operand ov = {NULL, v}, oa = {a, 0};
  em_tensor *res = where_raw("masked_fill", mask, ov, oa, a->dtype, out, grad);
  if (!res || !grad) return res;
  return em_op_record(res, NULL, "masked_fill", masked_fill_backward, 1, &a, 1, &mask);
}

/* ---------------- triu, tril ---------------- */

/* Copy a, then zero the part of each trailing matrix outside the triangle:
 * triu keeps j - i >= k, tril keeps j - i <= k. */
static int cpu_triangle(em_tensor *res, em_tensor *a, int64_t k, bool upper) {
  bool g = em_set_grad_enabled(false);
  int rc = em_copy_(res, a);
  em_set_grad_enabled(g);
  if (rc) return -1;
  int64_t rows = res->shape[res->ndim - 2], cols = res->shape[res->ndim - 1];
  int64_t mats = (rows > 0 && cols > 0) ? em_numel(res) / (rows * cols) : 0;
  size_t es = em_dtype_size(res->dtype);
  char *base = em_data_ptr(res);
  for (int64_t m = 0; m < mats; m++) {
    for (int64_t i = 0; i < rows; i++) {
      int64_t lo = upper ? 0 : EM_MAX(0, EM_MIN(cols, i + k + 1));
      int64_t hi = upper ? EM_MAX(0, EM_MIN(cols, i + k)) : cols;
      if (hi > lo) memset(base + ((m * rows + i) * cols + lo) * (int64_t)es, 0, (size_t)(hi - lo) * es);
    }
  }
  return 0;
}

static em_tensor *triangle(const char *name, em_tensor *a, int64_t k, bool upper);

static int triangle_backward(em_node *n, em_tensor **gout, em_tensor **gin) {
  gin[0] = triangle(n->op, gout[0], n->i[0], n->i[1] != 0);
  return gin[0] ? 0 : -1;
}

static em_tensor *triangle(const char *name, em_tensor *a, int64_t k, bool upper) {
  EM_CHECK_NULL(a, "%s: expected a tensor, got NULL", name);
  if (a->ndim < 2) {
    char b[160];
    em_error("%s: expected a tensor with at least 2 dims, got %d dims (shape %s)", name, a->ndim,
             em_shape_str(a->ndim, a->shape, b, 160));
    return NULL;
  }
  em_tensor *res = em_empty(a->ndim, a->shape, a->dtype, a->device);
  if (!res) return NULL;
  int rc;
  if (a->device.type == EM_CPU) rc = cpu_triangle(res, a, k, upper);
  else rc = em_triangle_cuda(name, res, a, k, upper);
  if (rc) { em_tensor_release(res); return NULL; }
  em_node *n;
  res = em_op_record(res, &n, name, triangle_backward, 1, &a, 0, NULL);
  if (n) { n->i[0] = k; n->i[1] = upper; }
  return res;
}

em_tensor *em_triu(em_tensor *a, int64_t k) { EM_OP_SCOPE("triu"); return triangle("triu", a, k, true); }
em_tensor *em_tril(em_tensor *a, int64_t k) { EM_OP_SCOPE("tril"); return triangle("tril", a, k, false); }

/* ======== shared with engine/ops/math_ops.c (issue 12; declared in math_support.h) ======== */
#include "math_support.h"

em_tensor *em_ew_result(const char *name, em_tensor *out, int nd, const int64_t *shape, em_dtype dt,
                        em_device dev, bool grad) {
  return make_result(name, out, nd, shape, dt, dev, grad);
}

int em_ew_run(const char *name, const em_ew_kern *k, em_tensor *out, int nin, const em_ew_operand *in,
              int nd, const int64_t *shape) {
  return run_kernel(name, k, out, nin, in, nd, shape);
}
/* ======== end issue 12 ======== */
