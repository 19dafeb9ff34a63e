/* Buffered atomic file output (see outbuf.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "alloc/outbuf.h"

#define OUTBUF_CAP (1u << 20)

int em_outbuf_open(em_outbuf *o, const char *path, const char *op) {
  memset(o, 0, sizeof *o);
  o->buf = malloc(OUTBUF_CAP);
  if (!o->buf) return em_error_oom("out of memory: cannot allocate a %u-byte output buffer", OUTBUF_CAP);
  o->cap = OUTBUF_CAP;
  int rc = em_atomic_open(&o->f, path, op);
  if (rc) { free(o->buf); o->buf = NULL; }
  return rc;
}

static void flush(em_outbuf *o) {
  if (o->err || !o->len) return;
  o->err = em_atomic_write(&o->f, o->buf, o->len);
  o->len = 0;
}

void em_outbuf_write(em_outbuf *o, const void *p, size_t n) {
  if (o->err) return;
  if (o->len + n > o->cap) flush(o);
  if (n > o->cap) { if (!o->err) o->err = em_atomic_write(&o->f, p, n); return; }
  memcpy(o->buf + o->len, p, n);
  o->len += n;
}

void em_outbuf_printf(em_outbuf *o, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  em_outbuf_write(o, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

int em_outbuf_commit(em_outbuf *o) {
  flush(o);
  int rc = o->err ? o->err : em_atomic_commit(&o->f);   /* a failed write already removed the temporary */
  free(o->buf);
  o->buf = NULL;
  return rc;
}

void em_outbuf_abort(em_outbuf *o) {
  em_atomic_abort(&o->f);
  free(o->buf);
  o->buf = NULL;
}
