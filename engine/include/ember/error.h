/* Errors: every engine entry point reports failure by its return value
 * (NULL or a negative status) and leaves a message in a thread-local buffer.
 * Messages start with the op name ("add: cannot broadcast ..."); the Lua
 * binding prefixes "ember." so users read "ember.add: ...". Out-of-memory
 * messages start with "out of memory" and are never prefixed. */
#ifndef EMBER_ERROR_H
#define EMBER_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  EM_OK = 0,
  EM_ERR = -1,       /* bad argument, shape, dtype, device, corrupt file ... */
  EM_ERR_OOM = -2,   /* allocation failed; message begins "out of memory" */
  EM_ERR_IO = -3,    /* file system */
} em_status;

/* Set the message (printf-style) and return EM_ERR. */
int em_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Set an out-of-memory message and return EM_ERR_OOM. */
int em_error_oom(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Same as em_error with an explicit code. */
int em_error_code(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last message and code set on this thread. */
const char *em_last_error(void);
int em_last_error_code(void);
void em_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
