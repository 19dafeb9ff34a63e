/* Strict JSON (RFC 8259) for untrusted headers: see json_min.h for why.
 *
 * Shape: one recursive-descent parser over a bounded byte range (the text is
 * never assumed NUL-terminated). Recursion is bounded by JM_MAX_DEPTH, so the C
 * stack is safe on any input. Every parse_* function either succeeds and fills
 * its jm_value, or fails, frees what it allocated and leaves the value as
 * JM_NULL: the caller never cleans up half-built nodes. The whole text is
 * checked to be UTF-8 up front, so string decoding only handles escapes. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "io/json_min.h"

typedef struct {
  const unsigned char *start, *p, *end;
  int depth;
  size_t values, max_values;
  char *err;
  size_t errlen;
  int status;
  char what[24];               /* scratch for describe() */
} jm_parser;

/* ---- errors ---- */

static int fail_at(jm_parser *ps, const unsigned char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_at(jm_parser *ps, const unsigned char *at, const char *fmt, ...) {
  if (ps->errlen) {
    int k = snprintf(ps->err, ps->errlen, "byte %zu: ", (size_t)(at - ps->start));
    if (k >= 0 && (size_t)k < ps->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(ps->err + k, ps->errlen - (size_t)k, fmt, ap);
      va_end(ap);
    }
  }
  ps->status = JM_ERR_SYNTAX;
  return -1;
}

static int fail_oom(jm_parser *ps, size_t nbytes) {
  if (ps->errlen) snprintf(ps->err, ps->errlen, "out of memory: cannot allocate %zu bytes for JSON", nbytes);
  ps->status = JM_ERR_OOM;
  return -1;
}

/* The byte at p, for messages: "'x'", "byte 0x0a" or "end of input". */
static const char *describe(jm_parser *ps, const unsigned char *p) {
  if (p >= ps->end) return "end of input";
  if (*p >= 0x20 && *p < 0x7f) snprintf(ps->what, sizeof ps->what, "'%c'", *p);
  else snprintf(ps->what, sizeof ps->what, "byte 0x%02x", *p);
  return ps->what;
}

/* ---- UTF-8 ---- */

static int is_cont(unsigned char c) { return (c & 0xc0) == 0x80; }

/* Index of the first byte that starts an invalid UTF-8 sequence, or n. Rejects
 * overlong forms, surrogates (ED A0..BF) and code points above U+10FFFF. */
static size_t utf8_invalid_at(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    size_t need;
    unsigned char lo = 0x80, hi = 0xbf;          /* range of the second byte */
    if (c < 0x80) { i++; continue; }
    else if (c >= 0xc2 && c <= 0xdf) need = 1;
    else if (c == 0xe0) { need = 2; lo = 0xa0; }
    else if (c == 0xed) { need = 2; hi = 0x9f; }
    else if (c >= 0xe1 && c <= 0xef) need = 2;
    else if (c == 0xf0) { need = 3; lo = 0x90; }
    else if (c == 0xf4) { need = 3; hi = 0x8f; }
    else if (c >= 0xf1 && c <= 0xf3) need = 3;
    else return i;
    if (n - i <= need || s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k <= need; k++)
      if (!is_cont(s[i + k])) return i;
    i += need + 1;
  }
  return n;
}

static size_t utf8_encode(uint32_t cp, char *out) {
  if (cp < 0x80) { out[0] = (char)cp; return 1; }
  if (cp < 0x800) {
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xe0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  out[0] = (char)(0xf0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
  out[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

/* ---- lexing helpers ---- */

static void skip_ws(jm_parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
    ps->p++;
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Four hex digits at p (bounded by end) into *cp. */
static int read_hex4(jm_parser *ps, const unsigned char *p, uint32_t *cp) {
  if (ps->end - p < 4) return fail_at(ps, p, "\\u escape needs 4 hex digits, got %s", describe(ps, ps->end));
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) {
    int h = hex_value(p[k]);
    if (h < 0) return fail_at(ps, p + k, "\\u escape needs 4 hex digits, got %s", describe(ps, p + k));
    v = v * 16 + (uint32_t)h;
  }
  *cp = v;
  return 0;
}

/* ---- strings ---- */

/* Decode the \uXXXX escape whose 'u' is at *q (surrogate pairs joined);
 * advance *q past it and append the UTF-8 bytes at *o. */
static int decode_u_escape(jm_parser *ps, const unsigned char **q, char **o) {
  const unsigned char *at = *q - 1;              /* the backslash */
  uint32_t cp;
  if (read_hex4(ps, *q + 1, &cp) < 0) return -1;
  *q += 5;
  if (cp >= 0xdc00 && cp <= 0xdfff)
    return fail_at(ps, at, "unpaired low surrogate \\u%04x in a string", (unsigned)cp);
  if (cp >= 0xd800 && cp <= 0xdbff) {
    uint32_t lo;
    if (ps->end - *q < 2 || (*q)[0] != '\\' || (*q)[1] != 'u')
      return fail_at(ps, at, "high surrogate \\u%04x is not followed by a \\u low surrogate", (unsigned)cp);
    if (read_hex4(ps, *q + 2, &lo) < 0) return -1;
    if (lo < 0xdc00 || lo > 0xdfff)
      return fail_at(ps, at, "high surrogate \\u%04x is followed by \\u%04x, not a low surrogate",
                     (unsigned)cp, (unsigned)lo);
    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    *q += 6;
  }
  *o += utf8_encode(cp, *o);
  return 0;
}

static int decode_escape(jm_parser *ps, const unsigned char **q, char **o) {
  const unsigned char *at = *q;                  /* the backslash */
  unsigned char c = at[1];                       /* in bounds: the scan saw a closing quote after it */
  char out;
  switch (c) {
    case '"': out = '"'; break;
    case '\\': out = '\\'; break;
    case '/': out = '/'; break;
    case 'b': out = '\b'; break;
    case 'f': out = '\f'; break;
    case 'n': out = '\n'; break;
    case 'r': out = '\r'; break;
    case 't': out = '\t'; break;
    case 'u': *q = at + 1; return decode_u_escape(ps, q, o);
    default: return fail_at(ps, at, "invalid escape '\\%c' in a string", c >= 0x20 && c < 0x7f ? c : '?');
  }
  *(*o)++ = out;
  *q = at + 2;
  return 0;
}

/* The string starting at ps->p (a '"') into a new buffer *out of *outlen
 * bytes (plus a NUL). */
static int parse_string(jm_parser *ps, char **out, size_t *outlen) {
  const unsigned char *open = ps->p, *close = open + 1;
  while (close < ps->end && *close != '"') {
    if (*close == '\\' && close + 1 < ps->end) close++;
    close++;
  }
  if (close >= ps->end) return fail_at(ps, open, "unterminated string");
  size_t cap = (size_t)(close - open);           /* decoded text is never longer than the raw text */
  char *buf = malloc(cap);
  if (!buf) return fail_oom(ps, cap);
  char *o = buf;
  const unsigned char *q = open + 1;
  while (q < close) {
    if (*q == '\\') {
      if (decode_escape(ps, &q, &o) < 0) { free(buf); return -1; }
    } else if (*q < 0x20) {
      free(buf);
      return fail_at(ps, q, "control character 0x%02x in a string must be escaped", *q);
    } else {
      *o++ = (char)*q++;
    }
  }
  *o = 0;
  *out = buf;
  *outlen = (size_t)(o - buf);
  ps->p = close + 1;
  return 0;
}

/* ---- numbers ---- */

/* Skip a run of digits; at least one required. */
static int need_digits(jm_parser *ps, const unsigned char **q, const char *where) {
  if (*q >= ps->end || !is_digit(**q))
    return fail_at(ps, *q, "expected a digit %s, got %s", where, describe(ps, *q));
  while (*q < ps->end && is_digit(**q)) (*q)++;
  return 0;
}

/* Integer value of the digits [s, e) with sign; 0 when it does not fit int64. */
static int fits_int64(const unsigned char *s, const unsigned char *e, int neg, int64_t *out) {
  uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, acc = 0;
  for (; s < e; s++) {
    uint64_t d = (uint64_t)(*s - '0');
    if (acc > (limit - d) / 10) return 0;
    acc = acc * 10 + d;
  }
  *out = neg ? (acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc) : (int64_t)acc;
  return 1;
}

static int parse_double(jm_parser *ps, const unsigned char *s, size_t n, double *out) {
  char small[64];
  char *buf = n < sizeof small ? small : malloc(n + 1);
  if (!buf) return fail_oom(ps, n + 1);
  memcpy(buf, s, n);
  buf[n] = 0;
  *out = strtod(buf, NULL);
  if (buf != small) free(buf);
  return 0;
}

static int parse_number(jm_parser *ps, jm_value *v) {
  const unsigned char *s = ps->p, *q = s;
  int neg = 0, integral = 1;
  if (*q == '-') { neg = 1; q++; }
  const unsigned char *digits = q;
  if (q < ps->end && *q == '0') {
    q++;
    if (q < ps->end && is_digit(*q)) return fail_at(ps, digits, "numbers must not have leading zeros");
  } else if (need_digits(ps, &q, "in a number") < 0) {
    return -1;
  }
  const unsigned char *digits_end = q;
  if (q < ps->end && *q == '.') {
    integral = 0;
    q++;
    if (need_digits(ps, &q, "after the decimal point") < 0) return -1;
  }
  if (q < ps->end && (*q == 'e' || *q == 'E')) {
    integral = 0;
    q++;
    if (q < ps->end && (*q == '+' || *q == '-')) q++;
    if (need_digits(ps, &q, "in the exponent") < 0) return -1;
  }
  int64_t i = 0;
  v->is_int = integral && fits_int64(digits, digits_end, neg, &i);
  if (v->is_int) {
    v->u.num.i = i;
    v->u.num.d = (double)i;
  } else if (parse_double(ps, s, (size_t)(q - s), &v->u.num.d) < 0) {
    return -1;
  }
  v->kind = JM_NUMBER;
  ps->p = q;
  return 0;
}

/* ---- containers ---- */

static int parse_value(jm_parser *ps, jm_value *v);

/* Grow *arr (of elem bytes each) so that index n fits. */
static int grow(jm_parser *ps, void **arr, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return 0;
  size_t ncap = *cap ? *cap * 2 : 4;
  if (ncap > SIZE_MAX / elem) return fail_oom(ps, SIZE_MAX);
  void *p = realloc(*arr, ncap * elem);
  if (!p) return fail_oom(ps, ncap * elem);
  *arr = p;
  *cap = ncap;
  return 0;
}

static int enter(jm_parser *ps) {
  if (++ps->depth > JM_MAX_DEPTH)
    return fail_at(ps, ps->p, "nesting deeper than %d arrays/objects", JM_MAX_DEPTH);
  ps->p++;                                       /* the '[' or '{' */
  return 0;
}

static int parse_array(jm_parser *ps, jm_value *v) {
  if (enter(ps) < 0) return -1;
  jm_value *items = NULL;
  size_t n = 0, cap = 0;
  skip_ws(ps);
  if (ps->p < ps->end && *ps->p == ']') {
    ps->p++;
  } else {
    for (;;) {
      if (grow(ps, (void **)&items, &cap, n, sizeof *items) < 0) goto fail;
      if (parse_value(ps, &items[n]) < 0) goto fail;
      n++;
      skip_ws(ps);
      if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
      if (ps->p < ps->end && *ps->p == ']') { ps->p++; break; }
      fail_at(ps, ps->p, "expected ',' or ']' in an array, got %s", describe(ps, ps->p));
      goto fail;
    }
  }
  ps->depth--;
  v->kind = JM_ARRAY;
  v->u.arr.items = items;
  v->u.arr.n = n;
  return 0;
fail:
  for (size_t i = 0; i < n; i++) jm_free(&items[i]);
  free(items);
  return -1;
}

static void free_members(jm_member *m, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(m[i].key);
    jm_free(&m[i].value);
  }
  free(m);
}

static int cmp_member_ptr(const void *a, const void *b) {
  const jm_member *x = *(const jm_member *const *)a, *y = *(const jm_member *const *)b;
  size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
  int c = memcmp(x->key, y->key, n);
  if (c) return c;
  return (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* Sorting pointers keeps this O(n log n): a header with a million keys must
 * not cost a trillion comparisons. */
static int check_unique_keys(jm_parser *ps, const unsigned char *at, jm_member *m, size_t n) {
  if (n < 2) return 0;
  jm_member **order = malloc(n * sizeof *order);
  if (!order) return fail_oom(ps, n * sizeof *order);
  for (size_t i = 0; i < n; i++) order[i] = &m[i];
  qsort(order, n, sizeof *order, cmp_member_ptr);
  int rc = 0;
  for (size_t i = 1; i < n && rc == 0; i++)
    if (cmp_member_ptr(&order[i - 1], &order[i]) == 0)
      rc = fail_at(ps, at, "duplicate key \"%.200s\" in an object", order[i]->key);
  free(order);
  return rc;
}

static int parse_member(jm_parser *ps, jm_member *m) {
  skip_ws(ps);
  if (ps->p >= ps->end || *ps->p != '"')
    return fail_at(ps, ps->p, "expected a string key in an object, got %s", describe(ps, ps->p));
  if (parse_string(ps, &m->key, &m->key_len) < 0) return -1;
  skip_ws(ps);
  if (ps->p >= ps->end || *ps->p != ':') {
    free(m->key);
    return fail_at(ps, ps->p, "expected ':' after an object key, got %s", describe(ps, ps->p));
  }
  ps->p++;
  if (parse_value(ps, &m->value) < 0) { free(m->key); return -1; }
  return 0;
}

static int parse_object(jm_parser *ps, jm_value *v) {
  const unsigned char *open = ps->p;
  if (enter(ps) < 0) return -1;
  jm_member *members = NULL;
  size_t n = 0, cap = 0;
  skip_ws(ps);
  if (ps->p < ps->end && *ps->p == '}') {
    ps->p++;
  } else {
    for (;;) {
      if (grow(ps, (void **)&members, &cap, n, sizeof *members) < 0) goto fail;
      if (parse_member(ps, &members[n]) < 0) goto fail;
      n++;
      skip_ws(ps);
      if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
      if (ps->p < ps->end && *ps->p == '}') { ps->p++; break; }
      fail_at(ps, ps->p, "expected ',' or '}' in an object, got %s", describe(ps, ps->p));
      goto fail;
    }
  }
  if (check_unique_keys(ps, open, members, n) < 0) goto fail;
  ps->depth--;
  v->kind = JM_OBJECT;
  v->u.obj.members = members;
  v->u.obj.n = n;
  return 0;
fail:
  free_members(members, n);
  return -1;
}

/* ---- values ---- */

static int parse_literal(jm_parser *ps, jm_value *v, const char *word, jm_kind kind) {
  size_t n = strlen(word);
  if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
    return fail_at(ps, ps->p, "expected a value, got %s", describe(ps, ps->p));
  ps->p += n;
  v->kind = kind;
  return 0;
}

static int parse_value(jm_parser *ps, jm_value *v) {
  memset(v, 0, sizeof *v);
  v->kind = JM_NULL;
  skip_ws(ps);
  if (ps->max_values && ++ps->values > ps->max_values)
    return fail_at(ps, ps->p, "more than %zu values, too many for input of this size", ps->max_values);
  if (ps->p >= ps->end) return fail_at(ps, ps->p, "expected a value, got end of input");
  unsigned char c = *ps->p;
  if (c == '{') return parse_object(ps, v);
  if (c == '[') return parse_array(ps, v);
  if (c == '"') {
    if (parse_string(ps, &v->u.str.s, &v->u.str.len) < 0) return -1;
    v->kind = JM_STRING;
    return 0;
  }
  if (c == '-' || is_digit(c)) return parse_number(ps, v);
  if (c == 't') return parse_literal(ps, v, "true", JM_TRUE);
  if (c == 'f') return parse_literal(ps, v, "false", JM_FALSE);
  if (c == 'n') return parse_literal(ps, v, "null", JM_NULL);
  return fail_at(ps, ps->p, "expected a value, got %s", describe(ps, ps->p));
}

/* ---- public ---- */

int jm_parse(const char *text, size_t len, size_t max_values, jm_value *out,
             char *err, size_t errlen) {
  jm_parser ps = {0};
  ps.start = ps.p = (const unsigned char *)text;
  ps.end = ps.start + len;
  ps.max_values = max_values;
  ps.err = err;
  ps.errlen = errlen;
  if (errlen) err[0] = 0;
  memset(out, 0, sizeof *out);
  out->kind = JM_NULL;
  size_t bad = utf8_invalid_at(ps.start, len);
  if (bad < len) {
    fail_at(&ps, ps.start + bad, "invalid UTF-8 (byte 0x%02x)", ps.start[bad]);
    return ps.status;
  }
  if (parse_value(&ps, out) < 0) return ps.status;
  skip_ws(&ps);
  if (ps.p < ps.end) {
    jm_free(out);
    fail_at(&ps, ps.p, "unexpected %s after the JSON value", describe(&ps, ps.p));
    return ps.status;
  }
  return JM_OK;
}

void jm_free(jm_value *v) {
  if (!v) return;
  if (v->kind == JM_STRING) {
    free(v->u.str.s);
  } else if (v->kind == JM_ARRAY) {
    for (size_t i = 0; i < v->u.arr.n; i++) jm_free(&v->u.arr.items[i]);
    free(v->u.arr.items);
  } else if (v->kind == JM_OBJECT) {
    free_members(v->u.obj.members, v->u.obj.n);
  }
  memset(v, 0, sizeof *v);
  v->kind = JM_NULL;
}

const jm_value *jm_get(const jm_value *obj, const char *key) {
  if (!obj || obj->kind != JM_OBJECT) return NULL;
  size_t n = strlen(key);
  for (size_t i = 0; i < obj->u.obj.n; i++) {
    const jm_member *m = &obj->u.obj.members[i];
    if (m->key_len == n && memcmp(m->key, key, n) == 0) return &m->value;
  }
  return NULL;
}

bool jm_utf8_valid(const char *s, size_t n) {
  return utf8_invalid_at((const unsigned char *)s, n) == n;
}

const char *jm_kind_name(jm_kind k) {
  switch (k) {
    case JM_NULL: return "null";
    case JM_FALSE: case JM_TRUE: return "boolean";
    case JM_NUMBER: return "number";
    case JM_STRING: return "string";
    case JM_ARRAY: return "array";
    case JM_OBJECT: return "object";
  }
  return "?";
}
