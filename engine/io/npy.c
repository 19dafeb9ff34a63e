/* .npy (NumPy's array file): "\x93NUMPY", version byte pair, a 2-byte (v1)
 * or 4-byte (v2, v3) little-endian header length, a Python dict literal
 * {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with
 * spaces and a newline, then the raw C-order data.
 *
 * Why it is shaped this way: the header is a Python literal, not JSON, so it
 * gets its own tiny lexer that accepts exactly the three keys NumPy writes and
 * nothing executable. The reader is strict (known little-endian dtypes only, C
 * order, the data exactly as long as the shape says) and checks sizes against
 * the file before allocating. The mmap path exists for large uint16 token
 * arrays: the tensor's storage *is* the read-only mapping, flagged
 * EM_STORAGE_READONLY so in-place ops refuse it, and munmapped by the storage
 * deleter when the last view goes. The writer reproduces numpy.save's v1.0
 * header byte for byte (growth padding after the dict, 64-byte alignment),
 * atomically. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include "internal.h"
#include "io/atomic_file.h"
#include "io/io_common.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAX_HEADER (1u << 20)     /* NumPy's own headers are a few hundred bytes */
#define NPY_ALIGN 64                  /* numpy.lib.format.ARRAY_ALIGN */
#define NPY_GROWTH_DIGITS 21          /* numpy.lib.format.GROWTH_AXIS_MAX_DIGITS */
#define NPY_SUPPORTED "<f4 <f8 <f2 <i4 <i8 <u2 |u1 |b1"

/* The first entry for a dtype is what the writer uses. */
static const struct { const char *descr; em_dtype dt; } npy_dtypes[] = {
  {"<f4", EM_F32}, {"<f8", EM_F64}, {"<f2", EM_F16}, {"<i4", EM_I32}, {"<i8", EM_I64},
  {"<u2", EM_U16}, {"|u1", EM_U8}, {"|b1", EM_BOOL}, {"<u1", EM_U8}, {"<b1", EM_BOOL},
};
#define NPY_NDTYPES (sizeof npy_dtypes / sizeof npy_dtypes[0])

typedef unsigned long long ull;

typedef struct {
  em_dtype dt;
  bool fortran;
  int ndim;
  int64_t shape[EM_MAX_DIMS];
  uint64_t data_off, nbytes;
} npy_header;

static int npy_fail(const char *kind, const char *path, const char *fmt, va_list ap) {
  char detail[1024];
  vsnprintf(detail, sizeof detail, fmt, ap);
  return em_error("load: %s .npy file '%s': %s", kind, path, detail);
}

static int corrupt(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int corrupt(const char *path, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = npy_fail("corrupt", path, fmt, ap);
  va_end(ap);
  return rc;
}

static int unsupported(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int unsupported(const char *path, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = npy_fail("unsupported", path, fmt, ap);
  va_end(ap);
  return rc;
}

/* ---- header dict lexer ---- */

typedef struct {
  const char *p, *end;
  const char *path;
  char what[24];
} npy_lex;

static const char *lx_describe(npy_lex *lx) {
  if (lx->p >= lx->end) return "the end of the header";
  unsigned char c = (unsigned char)*lx->p;
  if (c >= 0x20 && c < 0x7f) snprintf(lx->what, sizeof lx->what, "'%c'", c);
  else snprintf(lx->what, sizeof lx->what, "byte 0x%02x", c);
  return lx->what;
}

static void lx_ws(npy_lex *lx) {
  while (lx->p < lx->end && (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\n' || *lx->p == '\r')) lx->p++;
}

static int lx_peek(npy_lex *lx, char c) {
  lx_ws(lx);
  return lx->p < lx->end && *lx->p == c;
}

static int lx_expect(npy_lex *lx, char c, const char *where) {
  if (!lx_peek(lx, c))
    return corrupt(lx->path, "expected '%c' %s in the header, got %s", c, where, lx_describe(lx));
  lx->p++;
  return 0;
}

/* A quoted Python string without escapes, into out (cap bytes). */
static int lx_string(npy_lex *lx, char *out, size_t cap, const char *what) {
  lx_ws(lx);
  if (lx->p >= lx->end || (*lx->p != '\'' && *lx->p != '"'))
    return corrupt(lx->path, "expected a quoted %s in the header, got %s", what, lx_describe(lx));
  char q = *lx->p++;
  const char *s = lx->p;
  while (lx->p < lx->end && *lx->p != q && *lx->p != '\n') {
    if (*lx->p == '\\' || (unsigned char)*lx->p < 0x20)
      return corrupt(lx->path, "unexpected %s inside a %s string", lx_describe(lx), what);
    lx->p++;
  }
  if (lx->p >= lx->end || *lx->p != q) return corrupt(lx->path, "unterminated %s string in the header", what);
  size_t n = (size_t)(lx->p - s);
  if (n >= cap) return corrupt(lx->path, "%s string of %zu characters, longer than %zu", what, n, cap - 1);
  memcpy(out, s, n);
  out[n] = 0;
  lx->p++;
  return 0;
}

static int lx_bool(npy_lex *lx, bool *out) {
  lx_ws(lx);
  size_t left = (size_t)(lx->end - lx->p);
  if (left >= 4 && memcmp(lx->p, "True", 4) == 0) { *out = true; lx->p += 4; return 0; }
  if (left >= 5 && memcmp(lx->p, "False", 5) == 0) { *out = false; lx->p += 5; return 0; }
  return corrupt(lx->path, "expected True or False for 'fortran_order', got %s", lx_describe(lx));
}

/* A non-negative decimal integer (Python 2 files may add an 'L'). */
static int lx_dim(npy_lex *lx, int64_t *out) {
  lx_ws(lx);
  if (lx->p >= lx->end || *lx->p < '0' || *lx->p > '9')
    return corrupt(lx->path, "shape entries must be non-negative integers, got %s", lx_describe(lx));
  int64_t v = 0;
  while (lx->p < lx->end && *lx->p >= '0' && *lx->p <= '9') {
    int d = *lx->p++ - '0';
    if (v > (INT64_MAX - d) / 10) return corrupt(lx->path, "a shape entry does not fit in 64 bits");
    v = v * 10 + d;
  }
  if (lx->p < lx->end && *lx->p == 'L') lx->p++;
  *out = v;
  return 0;
}

/* "()", "(5,)", "(2, 3)" or "(2, 3,)". "(5)" is an int in Python, not a tuple. */
static int lx_shape(npy_lex *lx, npy_header *h) {
  if (lx_expect(lx, '(', "to open the shape tuple") < 0) return -1;
  h->ndim = 0;
  if (lx_peek(lx, ')')) { lx->p++; return 0; }
  for (;;) {
    if (h->ndim == EM_MAX_DIMS)
      return unsupported(lx->path, "the shape has more than %d dims, the most Ember supports", EM_MAX_DIMS);
    if (lx_dim(lx, &h->shape[h->ndim]) < 0) return -1;
    h->ndim++;
    if (lx_peek(lx, ',')) {
      lx->p++;
      if (lx_peek(lx, ')')) { lx->p++; return 0; }
      continue;
    }
    if (lx_peek(lx, ')')) {
      if (h->ndim == 1) return corrupt(lx->path, "shape (%lld) is not a tuple (expected (%lld,))",
                                       (long long)h->shape[0], (long long)h->shape[0]);
      lx->p++;
      return 0;
    }
    return corrupt(lx->path, "expected ',' or ')' in the shape tuple, got %s", lx_describe(lx));
  }
}

static int descr_to_dtype(const char *path, const char *descr, em_dtype *dt) {
  for (size_t i = 0; i < NPY_NDTYPES; i++)
    if (strcmp(npy_dtypes[i].descr, descr) == 0) { *dt = npy_dtypes[i].dt; return 0; }
  if (descr[0] == '>' && strcmp(descr + 1, "u1") && strcmp(descr + 1, "b1"))
    return unsupported(path, "dtype '%s' is big-endian; only little-endian dtypes are supported "
                       "(expected one of " NPY_SUPPORTED ")", descr);
  if (strcmp(descr + (descr[0] != 0), "i1") == 0)
    return unsupported(path, "dtype '%s' (int8) is not supported (expected one of " NPY_SUPPORTED ")", descr);
  return unsupported(path, "dtype '%s' is not supported (expected one of " NPY_SUPPORTED ")", descr);
}

/* One "'key': value" pair; seen[] catches duplicates. */
static int lx_item(npy_lex *lx, npy_header *h, int seen[3]) {
  char key[32], descr[40];
  if (lx_string(lx, key, sizeof key, "key") < 0 || lx_expect(lx, ':', "after a key") < 0) return -1;
  int which = strcmp(key, "descr") == 0 ? 0 : strcmp(key, "fortran_order") == 0 ? 1 : strcmp(key, "shape") == 0 ? 2 : -1;
  if (which < 0)
    return corrupt(lx->path, "unexpected key '%s' in the header (expected descr, fortran_order, shape)", key);
  if (seen[which]++) return corrupt(lx->path, "duplicate key '%s' in the header", key);
  if (which == 1) return lx_bool(lx, &h->fortran);
  if (which == 2) return lx_shape(lx, h);
  if (lx_peek(lx, '['))
    return unsupported(lx->path, "structured dtypes are not supported (expected one of " NPY_SUPPORTED ")");
  if (lx_string(lx, descr, sizeof descr, "descr") < 0) return -1;
  return descr_to_dtype(lx->path, descr, &h->dt);
}

static int parse_dict(const char *text, size_t n, const char *path, npy_header *h) {
  npy_lex lx = {text, text + n, path, {0}};
  int seen[3] = {0, 0, 0};
  if (lx_expect(&lx, '{', "to open the header dict") < 0) return -1;
  while (!lx_peek(&lx, '}')) {
    if (lx_item(&lx, h, seen) < 0) return -1;
    if (lx_peek(&lx, ',')) { lx.p++; continue; }
    if (!lx_peek(&lx, '}'))
      return corrupt(path, "expected ',' or '}' in the header dict, got %s", lx_describe(&lx));
  }
  lx.p++;
  lx_ws(&lx);
  if (lx.p < lx.end) return corrupt(path, "unexpected %s after the header dict", lx_describe(&lx));
  static const char *names[3] = {"descr", "fortran_order", "shape"};
  for (int i = 0; i < 3; i++)
    if (!seen[i]) return corrupt(path, "the header has no '%s'", names[i]);
  if (!em_io_shape_fits(h->ndim, h->shape)) {
    char shape[200];
    return unsupported(path, "shape %s is too large to index (the element count overflows 64 bits)",
                       em_shape_str(h->ndim, h->shape, shape, sizeof shape));
  }
  if (h->fortran && h->ndim > 1)
    return unsupported(path, "fortran_order is True; only C-order arrays are supported "
                       "(save np.ascontiguousarray(a) instead)");
  return 0;
}

/* ---- reading ---- */

/* Magic, version and header length; *hoff is where the dict starts. */
static int parse_preamble(const uint8_t *b, uint64_t size, const char *path, uint64_t *hlen, uint64_t *hoff) {
  if (size < 10) return corrupt(path, "the file is %llu bytes, too short for a .npy header", (ull)size);
  if (memcmp(b, NPY_MAGIC, 6) != 0)
    return corrupt(path, "bad magic: expected \\x93NUMPY, got \\x%02x%c%c%c%c%c", b[0],
                   b[1] >= 0x20 && b[1] < 0x7f ? b[1] : '?', b[2] >= 0x20 && b[2] < 0x7f ? b[2] : '?',
                   b[3] >= 0x20 && b[3] < 0x7f ? b[3] : '?', b[4] >= 0x20 && b[4] < 0x7f ? b[4] : '?',
                   b[5] >= 0x20 && b[5] < 0x7f ? b[5] : '?');
  if (b[6] < 1 || b[6] > 3 || b[7] != 0)
    return unsupported(path, "format version %d.%d is not supported (expected 1.0, 2.0 or 3.0)", b[6], b[7]);
  if (b[6] == 1) {
    *hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8;
    *hoff = 10;
  } else {
    if (size < 12) return corrupt(path, "the file is %llu bytes, too short for a version %d.0 header", (ull)size, b[6]);
    *hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8 | (uint64_t)b[10] << 16 | (uint64_t)b[11] << 24;
    *hoff = 12;
  }
  if (*hlen > NPY_MAX_HEADER)
    return corrupt(path, "header length %llu exceeds the %u-byte limit", (ull)*hlen, NPY_MAX_HEADER);
  if (*hoff + *hlen > size)
    return corrupt(path, "header length %llu runs past the end of the file (%llu bytes)", (ull)*hlen, (ull)size);
  return 0;
}

/* The data must be exactly numel * itemsize bytes, to the end of the file. */
static int check_data_size(const char *path, uint64_t size, npy_header *h) {
  uint64_t need = em_dtype_size(h->dt), avail = size - h->data_off;
  int overflow = 0;
  for (int i = 0; i < h->ndim; i++)
    if (h->shape[i] == 0) need = 0;
  for (int i = 0; i < h->ndim && need; i++) {
    if (need > UINT64_MAX / (uint64_t)h->shape[i]) { overflow = 1; break; }
    need *= (uint64_t)h->shape[i];
  }
  if (!overflow && need == avail) {
    h->nbytes = need;
    return 0;
  }
  char shape[200];
  em_shape_str(h->ndim, h->shape, shape, sizeof shape);
  if (overflow || need > avail)
    return corrupt(path, "the data holds %llu bytes but shape %s %s needs %s%llu (truncated file?)", (ull)avail,
                   shape, em_dtype_name(h->dt), overflow ? "more than " : "", overflow ? (ull)UINT64_MAX : (ull)need);
  return corrupt(path, "%llu trailing bytes after the data of shape %s %s (expected the file to end at byte %llu)",
                 (ull)(avail - need), shape, em_dtype_name(h->dt), (ull)(h->data_off + need));
}

static int read_npy_header(int fd, uint64_t size, const char *path, npy_header *h) {
  memset(h, 0, sizeof *h);
  uint8_t pre[12] = {0};
  uint64_t hlen = 0, hoff = 0;
  if (em_io_pread_all(fd, pre, (size_t)(size < 12 ? size : 12), 0, path) < 0) return EM_ERR_IO;
  if (parse_preamble(pre, size, path, &hlen, &hoff) < 0) return EM_ERR;
  char *text = malloc(hlen ? (size_t)hlen : 1);
  if (!text) return em_error_oom("out of memory: cannot read the header of '%s'", path);
  int rc = em_io_pread_all(fd, text, (size_t)hlen, hoff, path);
  if (rc == 0) rc = parse_dict(text, (size_t)hlen, path, h);
  free(text);
  if (rc < 0) return rc;
  h->data_off = hoff + hlen;
  return check_data_size(path, size, h);
}

static em_tensor *read_copy(int fd, const char *path, const npy_header *h) {
  em_tensor *t = em_empty(h->ndim, h->shape, h->dt, em_cpu());
  if (t && h->nbytes && em_io_pread_all(fd, em_data_ptr(t), (size_t)h->nbytes, h->data_off, path) < 0) {
    em_tensor_release(t);
    return NULL;
  }
  return t;
}

typedef struct { void *base; size_t len; } npy_mapping;

static void npy_unmap(em_storage *s) {
  npy_mapping *m = s->ctx;
  munmap(m->base, m->len);
  free(m);
}

static em_tensor *read_mapped(int fd, uint64_t size, const char *path, const npy_header *h) {
  size_t elem = em_dtype_size(h->dt);
  if (h->data_off % elem) {
    em_error("load: cannot memory-map '%s': its data starts at byte %llu, not aligned to the %zu-byte %s "
             "(load it without mmap)", path, (ull)h->data_off, elem, em_dtype_name(h->dt));
    return NULL;
  }
  void *base = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    em_error_code(EM_ERR_IO, "load: cannot memory-map '%s': %s", path, strerror(errno));
    return NULL;
  }
  npy_mapping *m = malloc(sizeof *m);
  em_storage *s = m ? em_storage_wrap((char *)base + h->data_off, (size_t)h->nbytes, em_cpu(), npy_unmap, m) : NULL;
  if (!s) {
    munmap(base, (size_t)size);
    free(m);
    if (!m) em_error_oom("out of memory: cannot allocate a mapping record");
    return NULL;
  }
  m->base = base;
  m->len = (size_t)size;
  s->flags |= EM_STORAGE_READONLY;
  int64_t stride[EM_MAX_DIMS];
  em_contiguous_strides(h->ndim, h->shape, stride);
  em_tensor *t = em_tensor_from_storage(s, 0, h->ndim, h->shape, stride, h->dt);
  em_storage_release(s);                         /* t holds it now; on failure this unmaps */
  return t;
}

em_tensor *em_npy_load(const char *path, bool mmap) {
  if (!path) { em_error("load: expected a file path, got NULL"); return NULL; }
  uint64_t size;
  int fd = em_io_open_read(path, &size);
  if (fd < 0) return NULL;
  npy_header h;
  em_tensor *t = NULL;
  if (read_npy_header(fd, size, path, &h) == 0)
    t = mmap ? read_mapped(fd, size, path, &h) : read_copy(fd, path, &h);
  close(fd);                                     /* a mapping outlives its descriptor */
  return t;
}

/* ---- writing ---- */

static const char *dtype_to_descr(em_dtype dt) {
  for (size_t i = 0; i < NPY_NDTYPES; i++)
    if (npy_dtypes[i].dt == dt) return npy_dtypes[i].descr;
  return NULL;
}

/* numpy.save's v1.0 header for an array of this shape into out (>= 512 bytes); returns its length. */
static size_t build_header(int ndim, const int64_t *shape, const char *descr, char *out) {
  char dict[400];
  int k = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (int i = 0; i < ndim; i++) k += snprintf(dict + k, sizeof dict - (size_t)k, i ? ", %lld" : "%lld", (long long)shape[i]);
  k += snprintf(dict + k, sizeof dict - (size_t)k, "%s), }", ndim == 1 ? "," : "");
  if (ndim > 0) {                                /* room to grow shape[0] in place, as numpy leaves */
    int digits = snprintf(NULL, 0, "%lld", (long long)shape[0]);
    for (int i = digits; i < NPY_GROWTH_DIGITS; i++) dict[k++] = ' ';
  }
  size_t hlen = (size_t)k + 1;                   /* + the final newline */
  size_t pad = NPY_ALIGN - (10 + hlen) % NPY_ALIGN;
  size_t total = hlen + pad;
  memcpy(out, NPY_MAGIC "\x01\x00", 8);
  out[8] = (char)(total & 0xff);
  out[9] = (char)(total >> 8);
  memcpy(out + 10, dict, (size_t)k);
  memset(out + 10 + k, ' ', pad);
  out[10 + total - 1] = '\n';
  return 10 + total;
}

int em_npy_save(const char *path, em_tensor *t) {
  if (!path || !t) return em_error("save: expected a file path and a tensor, got NULL");
  const char *descr = dtype_to_descr(t->dtype);
  if (!descr)
    return em_error("save: dtype %s has no .npy equivalent (NumPy has no bfloat16); convert to f32 first",
                    em_dtype_name(t->dtype));
  char header[512];
  size_t hn = build_header(t->ndim, t->shape, descr, header);
  em_tensor *c = em_io_host_contiguous(t);
  if (!c) {
    char why[1024];
    snprintf(why, sizeof why, "%s", em_last_error());
    int code = em_last_error_code();
    return em_error_code(code < 0 ? code : EM_ERR, "save: cannot copy the tensor to the host: %s", why);
  }
  em_atomic_file f = {.fd = -1};
  size_t nbytes = (size_t)em_numel(c) * em_dtype_size(c->dtype);
  int rc = em_atomic_open(&f, path, "save");
  if (rc == 0) rc = em_atomic_write(&f, header, hn);
  if (rc == 0 && nbytes) rc = em_atomic_write(&f, em_data_ptr(c), nbytes);
  if (rc == 0) rc = em_atomic_commit(&f);
  else em_atomic_abort(&f);
  em_tensor_release(c);
  return rc;
}

/* ---- writing as it grows ---- */

struct em_npy_writer {
  em_atomic_file f;
  em_dtype dtype;
  int64_t n;
  size_t header_len;
  const char *descr;
};

em_npy_writer *em_npy_writer_open(const char *path, em_dtype dtype) {
  const char *descr = dtype_to_descr(dtype);
  if (!descr) { em_error("save: dtype %s has no .npy equivalent", em_dtype_name(dtype)); return NULL; }
  em_npy_writer *w = calloc(1, sizeof *w);
  if (!w) { em_error_oom("out of memory: save: npy writer"); return NULL; }
  w->f.fd = -1; w->dtype = dtype; w->descr = descr;
  char header[512];
  int64_t zero = 0;
  w->header_len = build_header(1, &zero, descr, header);   /* the same length for any count (growth padding) */
  if (em_atomic_open(&w->f, path, "save") || em_atomic_write(&w->f, header, w->header_len)) {
    em_atomic_abort(&w->f);
    free(w);
    return NULL;
  }
  return w;
}

int em_npy_writer_append(em_npy_writer *w, const void *data, int64_t n) {
  if (n <= 0) return 0;
  int rc = em_atomic_write(&w->f, data, (size_t)n * em_dtype_size(w->dtype));
  if (rc == 0) w->n += n;
  return rc;
}

int em_npy_writer_close(em_npy_writer *w) {
  char header[512];
  size_t hn = build_header(1, &w->n, w->descr, header);
  int rc = 0;
  if (hn != w->header_len) rc = em_error("save: npy writer: header length changed (%zu vs %zu)", hn, w->header_len);
  else if (w->f.fd < 0) rc = em_error_code(EM_ERR_IO, "save: npy writer: the file was already abandoned");
  else if (pwrite(w->f.fd, header, hn, 0) != (ssize_t)hn)
    rc = em_error_code(EM_ERR_IO, "save: cannot write the header of '%s': %s", w->f.path, strerror(errno));
  if (rc == 0) rc = em_atomic_commit(&w->f);
  else em_atomic_abort(&w->f);
  free(w);
  return rc;
}

void em_npy_writer_abort(em_npy_writer *w) {
  if (!w) return;
  em_atomic_abort(&w->f);
  free(w);
}
