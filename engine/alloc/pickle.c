/* The pickle writer (see pickle.h). Opcode values from CPython's pickle.py. */
#include <string.h>
#include "alloc/pickle.h"

enum {
  OP_PROTO = 0x80, OP_STOP = '.', OP_MARK = '(', OP_EMPTY_DICT = '}', OP_SETITEMS = 'u',
  OP_EMPTY_LIST = ']', OP_APPENDS = 'e', OP_BINUNICODE = 'X', OP_BININT = 'J', OP_BININT1 = 'K',
  OP_BININT2 = 'M', OP_LONG1 = 0x8a, OP_BINFLOAT = 'G', OP_NEWTRUE = 0x88, OP_NEWFALSE = 0x89,
  OP_NONE = 'N', OP_BINPUT = 'q', OP_LONG_BINPUT = 'r', OP_BINGET = 'h', OP_LONG_BINGET = 'j'
};

static void u32le(em_outbuf *o, uint32_t v) {
  uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  em_outbuf_write(o, b, 4);
}

void pk_begin(em_pickle *p, em_outbuf *o) {
  memset(p, 0, sizeof *p);
  p->o = o;
  em_outbuf_byte(o, OP_PROTO);
  em_outbuf_byte(o, 2);
}

int pk_end(em_pickle *p) {
  em_outbuf_byte(p->o, OP_STOP);
  em_km_free(&p->strs);
  return p->oom ? -1 : 0;
}

void pk_dict(em_pickle *p) { em_outbuf_byte(p->o, OP_EMPTY_DICT); em_outbuf_byte(p->o, OP_MARK); }
void pk_dict_end(em_pickle *p) { em_outbuf_byte(p->o, OP_SETITEMS); }
void pk_list(em_pickle *p) { em_outbuf_byte(p->o, OP_EMPTY_LIST); em_outbuf_byte(p->o, OP_MARK); }
void pk_list_end(em_pickle *p) { em_outbuf_byte(p->o, OP_APPENDS); }

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when it is not one. */
static size_t utf8_len(const unsigned char *s, size_t left) {
  if (s[0] < 0x80) return 1;
  size_t n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : 0;
  if (!n || n > left) return 0;
  for (size_t i = 1; i < n; i++) if ((s[i] & 0xc0) != 0x80) return 0;
  return n;
}

/* Python decodes BINUNICODE as strict UTF-8: other bytes (a file name in
 * Latin-1) become '?'. */
void pk_strn(em_pickle *p, const char *s, size_t n) {
  em_outbuf_byte(p->o, OP_BINUNICODE);
  u32le(p->o, (uint32_t)n);
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    size_t k = utf8_len(u + i, n - i);
    if (k) { em_outbuf_write(p->o, u + i, k); i += k; }
    else { em_outbuf_byte(p->o, '?'); i++; }
  }
}

void pk_str(em_pickle *p, const char *s) {
  if (!s) pk_none(p);
  else pk_strn(p, s, strlen(s));
}

void pk_str_memo(em_pickle *p, const char *s) {
  if (!s) { pk_none(p); return; }
  uint64_t k[4] = {(uint64_t)(uintptr_t)s, 0, 0, 0};
  bool found;
  int64_t *id = em_km_get(&p->strs, k, -1, &found);
  if (!id) { p->oom = true; pk_str(p, s); return; }
  if (found) { pk_get(p, *id); return; }
  pk_str(p, s);
  *id = pk_memoize(p);
}

void pk_int(em_pickle *p, int64_t v) {
  em_outbuf *o = p->o;
  if (v >= 0 && v < 256) { em_outbuf_byte(o, OP_BININT1); em_outbuf_byte(o, (uint8_t)v); return; }
  if (v >= 0 && v < 65536) {
    em_outbuf_byte(o, OP_BININT2); em_outbuf_byte(o, (uint8_t)v); em_outbuf_byte(o, (uint8_t)(v >> 8));
    return;
  }
  if (v >= INT32_MIN && v <= INT32_MAX) { em_outbuf_byte(o, OP_BININT); u32le(o, (uint32_t)(int32_t)v); return; }
  /* LONG1: little-endian two's complement in as few bytes as keep the sign */
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)v >> (8 * i));
  int n = 8;
  while (n > 1 && ((b[n - 1] == 0 && b[n - 2] < 0x80) || (b[n - 1] == 0xff && b[n - 2] >= 0x80))) n--;
  em_outbuf_byte(o, OP_LONG1);
  em_outbuf_byte(o, (uint8_t)n);
  em_outbuf_write(o, b, (size_t)n);
}

void pk_uint(em_pickle *p, uint64_t v) {
  if (v <= (uint64_t)INT64_MAX) { pk_int(p, (int64_t)v); return; }
  uint8_t b[9];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  b[8] = 0;                                  /* a positive number needs the ninth byte */
  em_outbuf_byte(p->o, OP_LONG1);
  em_outbuf_byte(p->o, 9);
  em_outbuf_write(p->o, b, 9);
}

void pk_float(em_pickle *p, double v) {
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(bits >> (56 - 8 * i));   /* big-endian */
  em_outbuf_byte(p->o, OP_BINFLOAT);
  em_outbuf_write(p->o, b, 8);
}

void pk_bool(em_pickle *p, bool v) { em_outbuf_byte(p->o, v ? OP_NEWTRUE : OP_NEWFALSE); }
void pk_none(em_pickle *p) { em_outbuf_byte(p->o, OP_NONE); }

int64_t pk_memoize(em_pickle *p) {
  int64_t id = p->next_memo++;
  if (id < 256) { em_outbuf_byte(p->o, OP_BINPUT); em_outbuf_byte(p->o, (uint8_t)id); }
  else { em_outbuf_byte(p->o, OP_LONG_BINPUT); u32le(p->o, (uint32_t)id); }
  return id;
}

void pk_get(em_pickle *p, int64_t id) {
  if (id < 256) { em_outbuf_byte(p->o, OP_BINGET); em_outbuf_byte(p->o, (uint8_t)id); }
  else { em_outbuf_byte(p->o, OP_LONG_BINGET); u32le(p->o, (uint32_t)id); }
}
