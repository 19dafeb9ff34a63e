/* Thread-local error message + code (see ember/error.h). */
#include <stdarg.h>
#include <stdio.h>
#include "ember/error.h"

static _Thread_local char em_msg[2048];
static _Thread_local int em_code;

static int set_v(int code, const char *fmt, va_list ap) {
  vsnprintf(em_msg, sizeof em_msg, fmt, ap);
  em_code = code;
  return code;
}

int em_error(const char *fmt, ...) {
  va_list ap; va_start(ap, fmt); int r = set_v(EM_ERR, fmt, ap); va_end(ap); return r;
}
int em_error_oom(const char *fmt, ...) {
  va_list ap; va_start(ap, fmt); int r = set_v(EM_ERR_OOM, fmt, ap); va_end(ap); return r;
}
int em_error_code(int code, const char *fmt, ...) {
  va_list ap; va_start(ap, fmt); int r = set_v(code, fmt, ap); va_end(ap); return r;
}
const char *em_last_error(void) { return em_msg; }
int em_last_error_code(void) { return em_code; }
void em_clear_error(void) { em_msg[0] = 0; em_code = 0; }
