/* safetensors: 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
 * "__metadata__": {"k": "v"}}, then the data section (offsets are relative to
 * it). Files must load in PyTorch/HF and theirs in Ember, so the writer emits
 * exactly what HF's writer emits (compact JSON, header padded with spaces to a
 * multiple of 8, data little-endian and contiguous) except that tensors keep
 * the caller's order instead of HF's sort by dtype.
 *
 * The reader trusts nothing: the length prefix is bounded (100 MB, inside the
 * file) before anything is allocated, the header is parsed by the strict
 * json_min parser with a value budget proportional to its size, and the
 * schema is checked by hand (dtype known, shape a list of at most 8
 * non-negative integers, offsets inside the data section and of exactly
 * numel * dtype-size bytes, and — as HF's reader requires — the tensors tile
 * the data section with no overlap, hole or trailing bytes). Only then is
 * tensor memory allocated, and its total is bounded by the file's size.
 * Data is read with pread straight into each tensor's storage. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>
#include "internal.h"
#include "io/atomic_file.h"
#include "io/io_common.h"
#include "io/json_min.h"

#define ST_MAX_HEADER 100000000ull   /* HF's MAX_HEADER_SIZE */
#define ST_META_KEY "__metadata__"

static const struct { const char *name; em_dtype dt; } st_dtypes[] = {
  {"F32", EM_F32}, {"F64", EM_F64}, {"BF16", EM_BF16}, {"F16", EM_F16}, {"I32", EM_I32},
  {"I64", EM_I64}, {"U16", EM_U16}, {"U8", EM_U8}, {"BOOL", EM_BOOL},
};
#define ST_NDTYPES (sizeof st_dtypes / sizeof st_dtypes[0])

static const char *st_dtype_str(em_dtype dt) {
  for (size_t i = 0; i < ST_NDTYPES; i++)
    if (st_dtypes[i].dt == dt) return st_dtypes[i].name;
  return NULL;
}

static int st_dtype_parse(const char *s, size_t len, em_dtype *dt) {
  for (size_t i = 0; i < ST_NDTYPES; i++)
    if (strlen(st_dtypes[i].name) == len && memcmp(st_dtypes[i].name, s, len) == 0) {
      *dt = st_dtypes[i].dt;
      return 0;
    }
  return -1;
}

static int is_meta_key(const jm_member *m) {
  return m->key_len == strlen(ST_META_KEY) && memcmp(m->key, ST_META_KEY, m->key_len) == 0;
}

/* ---- reader: errors ---- */

static int corrupt(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int corrupt(const char *path, const char *fmt, ...) {
  char detail[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  return em_error("load: corrupt safetensors file '%s': %s", path, detail);
}

typedef unsigned long long ull;

/* "-3", "a non-integer ... (2.5)" or "a string": how a bad shape/offset entry reads in a message. */
static const char *describe_value(const jm_value *v, char *buf, size_t n) {
  if (v->kind == JM_NUMBER && v->is_int) snprintf(buf, n, "%lld", (long long)v->u.num.i);
  else if (v->kind == JM_NUMBER) snprintf(buf, n, "a non-integer or out-of-range number (%g)", v->u.num.d);
  else snprintf(buf, n, "a%s %s", v->kind == JM_ARRAY || v->kind == JM_OBJECT ? "n" : "",
                jm_kind_name(v->kind));
  return buf;
}

static int as_count(const jm_value *v, uint64_t *out) {
  if (v->kind != JM_NUMBER || !v->is_int || v->u.num.i < 0) return -1;
  *out = (uint64_t)v->u.num.i;
  return 0;
}

/* ---- reader: one tensor entry ---- */

typedef struct {
  const char *path;
  const char *name;
  uint64_t data_len;
} st_ctx;

static int check_fields(const st_ctx *c, const jm_value *obj) {
  for (size_t i = 0; i < obj->u.obj.n; i++) {
    const char *k = obj->u.obj.members[i].key;
    if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
      return corrupt(c->path, "tensor '%s' has an unexpected field '%.64s' (expected dtype, shape, data_offsets)",
                     c->name, k);
  }
  return 0;
}

static int parse_dtype(const st_ctx *c, const jm_value *v, em_st_entry *e) {
  if (!v) return corrupt(c->path, "tensor '%s' has no \"dtype\"", c->name);
  if (v->kind != JM_STRING)
    return corrupt(c->path, "tensor '%s': \"dtype\" must be a string, got a %s", c->name, jm_kind_name(v->kind));
  if (st_dtype_parse(v->u.str.s, v->u.str.len, &e->dtype) < 0)
    return corrupt(c->path, "tensor '%s' has unsupported dtype '%.32s' (expected one of F32 F64 BF16 F16 "
                   "I32 I64 U16 U8 BOOL)", c->name, v->u.str.s);
  return 0;
}

static int parse_shape(const st_ctx *c, const jm_value *v, em_st_entry *e) {
  char what[64];
  if (!v) return corrupt(c->path, "tensor '%s' has no \"shape\"", c->name);
  if (v->kind != JM_ARRAY)
    return corrupt(c->path, "tensor '%s': \"shape\" must be an array, got %s", c->name,
                   describe_value(v, what, sizeof what));
  if (v->u.arr.n > EM_MAX_DIMS)
    return corrupt(c->path, "tensor '%s' has a shape of %zu dims, more than the %d Ember supports", c->name,
                   v->u.arr.n, EM_MAX_DIMS);
  for (size_t i = 0; i < v->u.arr.n; i++) {
    uint64_t d;
    if (as_count(&v->u.arr.items[i], &d) < 0)
      return corrupt(c->path, "tensor '%s': shape entry %zu is %s, expected a non-negative integer", c->name, i,
                     describe_value(&v->u.arr.items[i], what, sizeof what));
    e->shape[i] = (int64_t)d;
  }
  e->ndim = (int)v->u.arr.n;
  if (!em_io_shape_fits(e->ndim, e->shape)) {
    char shape[200];
    return corrupt(c->path, "tensor '%s' has shape %s, too large to index (the element count overflows 64 bits)",
                   c->name, em_shape_str(e->ndim, e->shape, shape, sizeof shape));
  }
  return 0;
}

static int parse_offsets(const st_ctx *c, const jm_value *v, em_st_entry *e) {
  char what[64];
  uint64_t o[2];
  if (!v) return corrupt(c->path, "tensor '%s' has no \"data_offsets\"", c->name);
  if (v->kind != JM_ARRAY || v->u.arr.n != 2) {
    if (v->kind == JM_ARRAY) snprintf(what, sizeof what, "an array of %zu values", v->u.arr.n);
    else describe_value(v, what, sizeof what);
    return corrupt(c->path, "tensor '%s': \"data_offsets\" must be [begin, end], got %s", c->name, what);
  }
  for (int i = 0; i < 2; i++)
    if (as_count(&v->u.arr.items[i], &o[i]) < 0)
      return corrupt(c->path, "tensor '%s': data_offsets entry %d is %s, expected a non-negative integer", c->name,
                     i, describe_value(&v->u.arr.items[i], what, sizeof what));
  if (o[0] > o[1])
    return corrupt(c->path, "tensor '%s' data_offsets [%llu, %llu] end before they begin", c->name, (ull)o[0],
                   (ull)o[1]);
  if (o[1] > c->data_len)
    return corrupt(c->path, "tensor '%s' data_offsets [%llu, %llu] run past the end of the data section "
                   "(%llu bytes)", c->name, (ull)o[0], (ull)o[1], (ull)c->data_len);
  e->begin = o[0];
  e->end = o[1];
  return 0;
}

/* end - begin must be numel * dtype size; the product is checked for
 * overflow, so a shape of [2^62, 2^62] cannot wrap around to a small size. */
static int check_size(const st_ctx *c, const em_st_entry *e) {
  uint64_t need = em_dtype_size(e->dtype), have = e->end - e->begin;
  int overflow = 0;
  for (int i = 0; i < e->ndim; i++)
    if (e->shape[i] == 0) need = 0;
  for (int i = 0; i < e->ndim && need; i++) {
    uint64_t d = (uint64_t)e->shape[i];
    if (need > UINT64_MAX / d) { overflow = 1; break; }
    need *= d;
  }
  if (!overflow && need == have) return 0;
  char shape[200], needs[48];
  em_shape_str(e->ndim, e->shape, shape, sizeof shape);
  if (overflow) snprintf(needs, sizeof needs, "more than 2^64");
  else snprintf(needs, sizeof needs, "%llu", (ull)need);
  return corrupt(c->path, "tensor '%s' data_offsets [%llu, %llu] hold %llu bytes but shape %s %s needs %s",
                 c->name, (ull)e->begin, (ull)e->end, (ull)have, shape, em_dtype_name(e->dtype), needs);
}

static int parse_entry(const char *path, uint64_t data_len, jm_member *m, em_st_entry *e) {
  if (strlen(m->key) != m->key_len) return corrupt(path, "a tensor name contains a NUL byte");
  st_ctx c = {path, m->key, data_len};
  const jm_value *v = &m->value;
  if (v->kind != JM_OBJECT)
    return corrupt(path, "tensor '%s': expected an object with dtype, shape and data_offsets, got a%s %s",
                   m->key, v->kind == JM_ARRAY ? "n" : "", jm_kind_name(v->kind));
  if (check_fields(&c, v) < 0 || parse_dtype(&c, jm_get(v, "dtype"), e) < 0 ||
      parse_shape(&c, jm_get(v, "shape"), e) < 0 || parse_offsets(&c, jm_get(v, "data_offsets"), e) < 0 ||
      check_size(&c, e) < 0)
    return EM_ERR;
  e->name = m->key;                              /* take ownership from the JSON tree */
  m->key = NULL;
  return 0;
}

/* ---- reader: metadata, whole header, layout ---- */

static int parse_metadata(const char *path, jm_value *v, em_st_header *h) {
  if (v->kind != JM_OBJECT)
    return corrupt(path, "\"__metadata__\" must be an object of strings, got a %s", jm_kind_name(v->kind));
  size_t n = v->u.obj.n;
  h->meta_keys = calloc(n ? n : 1, sizeof *h->meta_keys);
  h->meta_values = calloc(n ? n : 1, sizeof *h->meta_values);
  if (!h->meta_keys || !h->meta_values) return em_error_oom("out of memory: cannot hold the metadata of '%s'", path);
  for (size_t i = 0; i < n; i++) {
    jm_member *m = &v->u.obj.members[i];
    if (strlen(m->key) != m->key_len) return corrupt(path, "a \"__metadata__\" key contains a NUL byte");
    if (m->value.kind != JM_STRING)
      return corrupt(path, "\"__metadata__\" value of key '%s' must be a string, got a %s", m->key,
                     jm_kind_name(m->value.kind));
    if (strlen(m->value.u.str.s) != m->value.u.str.len)
      return corrupt(path, "\"__metadata__\" value of key '%s' contains a NUL byte", m->key);
    h->meta_keys[i] = m->key;
    h->meta_values[i] = m->value.u.str.s;
    m->key = NULL;
    m->value.u.str.s = NULL;
    m->value.kind = JM_NULL;
    h->n_meta++;
  }
  return 0;
}

static int header_from_json(jm_value *root, const char *path, uint64_t data_len, em_st_header *h) {
  if (root->kind != JM_OBJECT) return corrupt(path, "the header must be a JSON object");
  size_t n = 0;
  for (size_t i = 0; i < root->u.obj.n; i++) n += !is_meta_key(&root->u.obj.members[i]);
  if (n > INT_MAX) return corrupt(path, "the header lists %zu tensors, more than Ember can hold", n);
  h->entries = calloc(n ? n : 1, sizeof *h->entries);
  if (!h->entries) return em_error_oom("out of memory: cannot hold the %zu tensor entries of '%s'", n, path);
  for (size_t i = 0; i < root->u.obj.n; i++) {
    jm_member *m = &root->u.obj.members[i];
    if (is_meta_key(m)) {
      if (parse_metadata(path, &m->value, h) < 0) return EM_ERR;
    } else {
      if (parse_entry(path, data_len, m, &h->entries[h->n]) < 0) return EM_ERR;
      h->n++;
    }
  }
  return 0;
}

static int cmp_entry(const void *a, const void *b) {
  const em_st_entry *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

/* Sorted by offset, the tensors must tile [0, data_len) exactly. */
static int check_layout(em_st_header *h, const char *path, uint64_t data_len) {
  qsort(h->entries, (size_t)h->n, sizeof *h->entries, cmp_entry);
  uint64_t covered = 0;
  const em_st_entry *last = NULL;                /* the entry that ends at `covered` */
  for (int i = 0; i < h->n; i++) {
    const em_st_entry *e = &h->entries[i];
    if (e->begin < covered)
      return corrupt(path, "tensors '%s' data_offsets [%llu, %llu] and '%s' [%llu, %llu] overlap", last->name,
                     (ull)last->begin, (ull)last->end, e->name, (ull)e->begin, (ull)e->end);
    if (e->begin > covered)
      return corrupt(path, "bytes [%llu, %llu) of the data section belong to no tensor (a hole before '%s')",
                     (ull)covered, (ull)e->begin, e->name);
    if (e->end > covered) { covered = e->end; last = e; }
  }
  if (covered != data_len)
    return corrupt(path, "the data section is %llu bytes but the tensors cover only the first %llu "
                   "(trailing bytes after the last tensor)", (ull)data_len, (ull)covered);
  return 0;
}

/* The length prefix: at least 8 bytes in the file, header bounded and inside it. */
static int check_prefix(const uint8_t *prefix, uint64_t file_len, const char *path, uint64_t *n) {
  if (file_len < 8)
    return corrupt(path, "the file is %llu bytes, too short for the 8-byte header length", (ull)file_len);
  uint64_t h = em_io_le64(prefix);
  if (h > ST_MAX_HEADER)
    return corrupt(path, "header length %llu exceeds the 100 MB (%llu bytes) limit", (ull)h, ST_MAX_HEADER);
  if (h > file_len - 8)
    return corrupt(path, "header length %llu runs past the end of the file (%llu bytes follow the length prefix)",
                   (ull)h, (ull)(file_len - 8));
  *n = h;
  return 0;
}

/* Parse the n-byte JSON header text followed by data_len bytes of data. */
static int parse_header_text(const char *text, uint64_t n, uint64_t data_len, const char *path, em_st_header *h) {
  memset(h, 0, sizeof *h);
  if (n == 0) return corrupt(path, "the header is empty (expected a JSON object)");
  if (text[0] != '{')
    return corrupt(path, "the header must be a JSON object starting with '{', got byte 0x%02x",
                   (unsigned char)text[0]);
  jm_value root;
  char err[320];
  /* A valid header spends at least 4 bytes of text per JSON value. */
  int rc = jm_parse(text, (size_t)n, (size_t)(n / 4 + 64), &root, err, sizeof err);
  if (rc == JM_ERR_OOM) return em_error_oom("out of memory: cannot parse the %llu-byte header of '%s'", (ull)n, path);
  if (rc != JM_OK) return corrupt(path, "the header is not valid JSON: %s", err);
  rc = header_from_json(&root, path, data_len, h);
  jm_free(&root);
  if (rc == 0) rc = check_layout(h, path, data_len);
  if (rc != 0) {
    em_st_header_free(h);
    return rc;
  }
  h->header_len = n;
  return 0;
}

int em_st_parse(const uint8_t *buf, uint64_t len, const char *path, em_st_header *out) {
  memset(out, 0, sizeof *out);
  uint64_t n = 0;
  if (check_prefix(buf, len, path, &n) < 0) return EM_ERR;
  return parse_header_text((const char *)buf + 8, n, len - 8 - n, path, out);
}

void em_st_header_free(em_st_header *h) {
  if (!h) return;
  for (int i = 0; i < h->n; i++) free(h->entries[i].name);
  free(h->entries);
  for (int i = 0; i < h->n_meta; i++) {
    free(h->meta_keys[i]);
    free(h->meta_values[i]);
  }
  free(h->meta_keys);
  free(h->meta_values);
  memset(h, 0, sizeof *h);
}

/* ---- loading ---- */

static int read_header(int fd, uint64_t size, const char *path, em_st_header *h) {
  memset(h, 0, sizeof *h);
  uint8_t prefix[8] = {0};
  if (size >= 8 && em_io_pread_all(fd, prefix, 8, 0, path) < 0) return EM_ERR_IO;
  uint64_t n = 0;
  if (check_prefix(prefix, size, path, &n) < 0) return EM_ERR;
  char *text = malloc(n ? (size_t)n : 1);        /* n <= 100 MB and those bytes exist in the file */
  if (!text) return em_error_oom("out of memory: cannot read the %llu-byte header of '%s'", (ull)n, path);
  int rc = em_io_pread_all(fd, text, (size_t)n, 8, path);
  if (rc == 0) rc = parse_header_text(text, n, size - 8 - n, path, h);
  free(text);
  return rc;
}

static void free_loaded(int n, char **names, em_tensor **ts) {
  for (int i = 0; i < n; i++) {
    if (names) free(names[i]);
    if (ts) em_tensor_release(ts[i]);
  }
  free(names);
  free(ts);
}

/* Allocate each tensor and pread its bytes into it; names move out of h. */
static int read_tensors(int fd, const char *path, em_st_header *h, char ***names_out, em_tensor ***ts_out) {
  int n = h->n;
  char **names = calloc(n ? (size_t)n : 1, sizeof *names);
  em_tensor **ts = calloc(n ? (size_t)n : 1, sizeof *ts);
  if (!names || !ts) {
    free_loaded(0, names, ts);
    return em_error_oom("out of memory: cannot list the %d tensors of '%s'", n, path);
  }
  uint64_t base = 8 + h->header_len;
  for (int i = 0; i < n; i++) {
    em_st_entry *e = &h->entries[i];
    ts[i] = em_empty(e->ndim, e->shape, e->dtype, em_cpu());
    size_t nbytes = (size_t)(e->end - e->begin);
    if (!ts[i] || (nbytes && em_io_pread_all(fd, em_data_ptr(ts[i]), nbytes, base + e->begin, path) < 0)) {
      int code = em_last_error_code();
      free_loaded(n, names, ts);
      return code < 0 ? code : EM_ERR;
    }
    names[i] = e->name;
    e->name = NULL;
  }
  *names_out = names;
  *ts_out = ts;
  return n;
}

int em_st_load(const char *path, char ***names, em_tensor ***tensors,
               int *n_meta, char ***meta_keys, char ***meta_values) {
  *names = NULL;
  *tensors = NULL;
  if (n_meta) *n_meta = 0;
  if (meta_keys) *meta_keys = NULL;
  if (meta_values) *meta_values = NULL;
  if (!path) return em_error("load: expected a file path, got NULL");
  uint64_t size;
  int fd = em_io_open_read(path, &size);
  if (fd < 0) return EM_ERR_IO;
  em_st_header h;
  int rc = read_header(fd, size, path, &h);
  if (rc == 0) rc = read_tensors(fd, path, &h, names, tensors);
  close(fd);
  if (rc >= 0 && n_meta && meta_keys && meta_values) {
    *n_meta = h.n_meta;
    *meta_keys = h.meta_keys;
    *meta_values = h.meta_values;
    h.n_meta = 0;
    h.meta_keys = h.meta_values = NULL;
  }
  em_st_header_free(&h);
  return rc;
}

/* ---- saving: checks ---- */

static int cmp_str_ptr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Error naming the first duplicate among names[0..n) (sorted copy: O(n log n)). */
static int check_unique(const char *what, const char *const *names, int n) {
  if (n < 2) return 0;
  const char **sorted = malloc((size_t)n * sizeof *sorted);
  if (!sorted) return em_error_oom("out of memory: cannot check %d %ss for duplicates", n, what);
  memcpy(sorted, names, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_str_ptr);
  int rc = 0;
  for (int i = 1; i < n && rc == 0; i++)
    if (strcmp(sorted[i - 1], sorted[i]) == 0) rc = em_error("save: duplicate %s '%s'", what, sorted[i]);
  free(sorted);
  return rc;
}

static int check_name(const char *what, int i, const char *s) {
  if (!s) return em_error("save: %s %d is NULL", what, i);
  if (!jm_utf8_valid(s, strlen(s))) return em_error("save: %s '%s' is not valid UTF-8", what, s);
  return 0;
}

static int check_save_args(const char *path, int n, const char *const *names, em_tensor *const *tensors,
                           int n_meta, const char *const *keys, const char *const *values) {
  if (!path) return em_error("save: expected a file path, got NULL");
  if (n < 0 || n_meta < 0) return em_error("save: expected non-negative counts, got %d tensors and %d metadata entries", n, n_meta);
  if (n > 0 && (!names || !tensors)) return em_error("save: expected %d names and tensors, got NULL arrays", n);
  if (n_meta > 0 && (!keys || !values)) return em_error("save: expected %d metadata keys and values, got NULL arrays", n_meta);
  for (int i = 0; i < n; i++) {
    if (check_name("tensor name", i, names[i]) < 0) return EM_ERR;
    if (strcmp(names[i], ST_META_KEY) == 0)
      return em_error("save: '" ST_META_KEY "' is reserved for metadata and cannot name a tensor");
    if (!tensors[i]) return em_error("save: tensor '%s' is NULL", names[i]);
    if (!st_dtype_str(tensors[i]->dtype))
      return em_error("save: tensor '%s' has dtype %s, which safetensors cannot store", names[i],
                      em_dtype_name(tensors[i]->dtype));
  }
  for (int i = 0; i < n_meta; i++) {
    if (check_name("metadata key", i, keys[i]) < 0) return EM_ERR;
    if (!values[i]) return em_error("save: metadata value of key '%s' is NULL", keys[i]);
    if (!jm_utf8_valid(values[i], strlen(values[i])))
      return em_error("save: metadata value of key '%s' is not valid UTF-8", keys[i]);
  }
  if (check_unique("tensor name", names, n) < 0) return EM_ERR;
  return check_unique("metadata key", keys, n_meta);
}

/* ---- saving: header text ---- */

typedef struct {
  char *data;
  size_t len, cap;
  int oom;
} st_buf;

static void buf_put(st_buf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) { b->oom = 1; return; }
    b->data = p;
    b->cap = cap;
  }
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = 0;
}

static void buf_puts(st_buf *b, const char *s) { buf_put(b, s, strlen(s)); }

static void buf_u64(st_buf *b, uint64_t v) {
  char tmp[24];
  buf_put(b, tmp, (size_t)snprintf(tmp, sizeof tmp, "%llu", (ull)v));
}

/* A JSON string escaped as serde_json (HF's writer) escapes it. */
static void buf_json_string(st_buf *b, const char *s) {
  static const char hex[] = "0123456789abcdef";
  buf_put(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char esc[7] = {'\\', 0, 0, 0, 0, 0, 0};
    size_t n = 2;
    switch (*p) {
      case '"': esc[1] = '"'; break;
      case '\\': esc[1] = '\\'; break;
      case '\b': esc[1] = 'b'; break;
      case '\f': esc[1] = 'f'; break;
      case '\n': esc[1] = 'n'; break;
      case '\r': esc[1] = 'r'; break;
      case '\t': esc[1] = 't'; break;
      default:
        if (*p >= 0x20) { buf_put(b, (const char *)p, 1); continue; }
        memcpy(esc + 1, "u00", 3);
        esc[4] = hex[*p >> 4];
        esc[5] = hex[*p & 15];
        n = 6;
    }
    buf_put(b, esc, n);
  }
  buf_put(b, "\"", 1);
}

static void buf_tensor_info(st_buf *b, const em_tensor *t, uint64_t begin, uint64_t end) {
  buf_puts(b, "{\"dtype\":\"");
  buf_puts(b, st_dtype_str(t->dtype));
  buf_puts(b, "\",\"shape\":[");
  for (int d = 0; d < t->ndim; d++) {
    if (d) buf_put(b, ",", 1);
    buf_u64(b, (uint64_t)t->shape[d]);
  }
  buf_puts(b, "],\"data_offsets\":[");
  buf_u64(b, begin);
  buf_put(b, ",", 1);
  buf_u64(b, end);
  buf_puts(b, "]}");
}

static int build_header(st_buf *b, int n, const char *const *names, em_tensor *const *tensors,
                        int n_meta, const char *const *keys, const char *const *values) {
  buf_put(b, "{", 1);
  if (n_meta > 0) {
    buf_puts(b, "\"" ST_META_KEY "\":{");
    for (int i = 0; i < n_meta; i++) {
      if (i) buf_put(b, ",", 1);
      buf_json_string(b, keys[i]);
      buf_put(b, ":", 1);
      buf_json_string(b, values[i]);
    }
    buf_puts(b, n ? "}," : "}");
  }
  uint64_t offset = 0;
  for (int i = 0; i < n; i++) {
    uint64_t nbytes = (uint64_t)em_numel(tensors[i]) * em_dtype_size(tensors[i]->dtype);
    if (i) buf_put(b, ",", 1);
    buf_json_string(b, names[i]);
    buf_put(b, ":", 1);
    buf_tensor_info(b, tensors[i], offset, offset + nbytes);
    offset += nbytes;
  }
  buf_put(b, "}", 1);
  while (!b->oom && b->len % 8) buf_put(b, " ", 1);   /* data section starts 8-byte aligned */
  if (b->oom) return em_error_oom("out of memory: cannot build the safetensors header");
  if (b->len > ST_MAX_HEADER)
    return em_error("save: the header would be %zu bytes, over the 100 MB limit readers accept", b->len);
  return 0;
}

/* ---- saving ---- */

static int write_tensor(em_atomic_file *f, const char *name, em_tensor *t) {
  em_tensor *c = em_io_host_contiguous(t);
  if (!c) {
    char why[1024];
    snprintf(why, sizeof why, "%s", em_last_error());
    int code = em_last_error_code();
    em_error_code(code < 0 ? code : EM_ERR, "save: cannot copy tensor '%s' to the host: %s", name, why);
    return code < 0 ? code : EM_ERR;
  }
  size_t nbytes = (size_t)em_numel(c) * em_dtype_size(c->dtype);
  int rc = nbytes ? em_atomic_write(f, em_data_ptr(c), nbytes) : 0;
  em_tensor_release(c);
  return rc;
}

int em_st_save(const char *path, int n, const char *const *names, em_tensor *const *tensors,
               int n_meta, const char *const *meta_keys, const char *const *meta_values) {
  int rc = check_save_args(path, n, names, tensors, n_meta, meta_keys, meta_values);
  if (rc < 0) return rc;
  st_buf hdr = {0};
  rc = build_header(&hdr, n, names, tensors, n_meta, meta_keys, meta_values);
  em_atomic_file f = {.fd = -1};
  if (rc == 0) rc = em_atomic_open(&f, path, "save");
  if (rc == 0) {
    uint8_t prefix[8];
    em_io_put_le64(prefix, hdr.len);
    rc = em_atomic_write(&f, prefix, 8);
  }
  if (rc == 0) rc = em_atomic_write(&f, hdr.data, hdr.len);
  for (int i = 0; i < n && rc == 0; i++) rc = write_tensor(&f, names[i], tensors[i]);
  if (rc == 0) rc = em_atomic_commit(&f);
  else em_atomic_abort(&f);
  free(hdr.data);
  return rc;
}
