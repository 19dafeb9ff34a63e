/* A small writer of Python pickles, protocol 2: dicts, lists, str, int,
 * float, bool, None and memo references — the opcodes that both Python's
 * unpickler and the JavaScript one in PyTorch's MemoryViz.js read. A dict is
 * EMPTY_DICT MARK k v ... SETITEMS, a list EMPTY_LIST MARK x ... APPENDS;
 * repeated objects (keys, file names, frame lists) are written once and
 * referenced through the memo. Not public API. */
#ifndef EMBER_PICKLE_H
#define EMBER_PICKLE_H

#include <stdbool.h>
#include <stdint.h>
#include "alloc/keymap.h"
#include "alloc/outbuf.h"

typedef struct {
  em_outbuf *o;
  int64_t next_memo;
  em_keymap strs;              /* string pointer -> memo id */
  bool oom;
} em_pickle;

void pk_begin(em_pickle *p, em_outbuf *o);    /* PROTO 2 */
int pk_end(em_pickle *p);                     /* STOP; 0, or -1 (out of memory) */
void pk_dict(em_pickle *p);                   /* EMPTY_DICT MARK */
void pk_dict_end(em_pickle *p);               /* SETITEMS */
void pk_list(em_pickle *p);                   /* EMPTY_LIST MARK */
void pk_list_end(em_pickle *p);               /* APPENDS */
void pk_str(em_pickle *p, const char *s);     /* NULL: None */
void pk_strn(em_pickle *p, const char *s, size_t n);
/* A string that lives as long as the writer (a literal or interned): written
 * once, then a memo reference. */
void pk_str_memo(em_pickle *p, const char *s);
void pk_int(em_pickle *p, int64_t v);
void pk_uint(em_pickle *p, uint64_t v);
void pk_float(em_pickle *p, double v);
void pk_bool(em_pickle *p, bool v);
void pk_none(em_pickle *p);
int64_t pk_memoize(em_pickle *p);             /* memo the object on top; its id */
void pk_get(em_pickle *p, int64_t id);        /* push a memoized object again */

#endif
