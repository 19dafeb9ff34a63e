/* Buffered output for the snapshot writers: bytes gather in 1 MiB and go to
 * an atomic file (io/atomic_file.h), so a crash never leaves half a
 * snapshot. The first failure sticks (later writes are no-ops) and is
 * reported by em_outbuf_commit. Not public API. */
#ifndef EMBER_OUTBUF_H
#define EMBER_OUTBUF_H

#include <stddef.h>
#include <stdint.h>
#include "io/atomic_file.h"

typedef struct {
  em_atomic_file f;
  char *buf;
  size_t len, cap;
  int err;                     /* first failure's status, 0 while fine */
} em_outbuf;

int em_outbuf_open(em_outbuf *o, const char *path, const char *op);
void em_outbuf_write(em_outbuf *o, const void *p, size_t n);
void em_outbuf_printf(em_outbuf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void em_outbuf_str(em_outbuf *o, const char *s) { em_outbuf_write(o, s, __builtin_strlen(s)); }
static inline void em_outbuf_byte(em_outbuf *o, uint8_t b) {
  if (o->len < o->cap) o->buf[o->len++] = (char)b;
  else em_outbuf_write(o, &b, 1);
}
/* Flush and rename into place; on an earlier failure remove the temporary
 * and return that failure. Frees the buffer either way. */
int em_outbuf_commit(em_outbuf *o);
void em_outbuf_abort(em_outbuf *o);

#endif
