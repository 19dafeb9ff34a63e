/* A small, strict JSON parser for file headers we do not trust (the
 * safetensors header). It builds a tree so that callers can check a schema with
 * plain loops, and it rejects everything RFC 8259 rejects plus what a hostile
 * header could use against us: invalid UTF-8, lone surrogates, duplicate
 * object keys, nesting deeper than JM_MAX_DEPTH, trailing non-whitespace, and
 * more values than the caller's budget (so a 100 MB header of "[[],[],...]"
 * cannot turn into gigabytes of nodes). Not public API. */
#ifndef EMBER_JSON_MIN_H
#define EMBER_JSON_MIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JM_MAX_DEPTH 16

typedef enum { JM_NULL, JM_FALSE, JM_TRUE, JM_NUMBER, JM_STRING, JM_ARRAY, JM_OBJECT } jm_kind;

typedef struct jm_value jm_value;
typedef struct jm_member jm_member;

struct jm_value {
  jm_kind kind;
  bool is_int;                  /* JM_NUMBER written as an integer that fits int64 */
  union {
    struct { int64_t i; double d; } num;          /* d is always set; i when is_int */
    struct { char *s; size_t len; } str;           /* decoded UTF-8, NUL-terminated; may hold NULs (\u0000) */
    struct { jm_value *items; size_t n; } arr;
    struct { jm_member *members; size_t n; } obj;  /* in document order; keys unique */
  } u;
};

struct jm_member {
  char *key;                    /* decoded, NUL-terminated */
  size_t key_len;               /* may exceed strlen(key) when the key holds \u0000 */
  jm_value value;
};

/* Status of jm_parse. */
enum { JM_OK = 0, JM_ERR_SYNTAX = -1, JM_ERR_OOM = -2 };

/* Parse text[0..len) as one JSON value followed only by whitespace. On
 * success *out holds the tree (free with jm_free). On failure *out is JM_NULL,
 * err holds a message such as "byte 17: expected ':' after an object key, got
 * 'x'", and the status says whether it was the input or memory. max_values
 * bounds the number of values created (0: no bound). */
int jm_parse(const char *text, size_t len, size_t max_values, jm_value *out,
             char *err, size_t errlen);
void jm_free(jm_value *v);

/* The member of an object named key (NUL-terminated), or NULL. */
const jm_value *jm_get(const jm_value *obj, const char *key);
/* Whether s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code
 * points above U+10FFFF): writers check names before putting them in JSON. */
bool jm_utf8_valid(const char *s, size_t n);
/* "null", "boolean", "number", "string", "array", "object". */
const char *jm_kind_name(jm_kind k);

#endif
