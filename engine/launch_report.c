/* launch_report.c — a rank's failure record for `ember launch` (see
 * ember/launch.h for the file format and the contract).
 *
 * Why every byte is formatted by hand: the same writer runs inside fatal
 * signal handlers, where snprintf, malloc and getenv are not allowed. So the
 * writer only uses open/write/close/rename/clock_gettime/getpid on buffers
 * filled beforehand: by em_launch_report_prepare for the _async variant, on
 * the caller's stack for the ordinary one. "Only the first record" is one
 * atomic exchange, which is lock-free and so safe in a handler too. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h> /* rename */
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "ember/launch.h"

#define DIR_CAP 4096

/* Where and as whom a record is written. */
struct target {
  char dir[DIR_CAP]; /* EMBER_LAUNCH_DIR */
  char rank[24];     /* decimal digits, or "" when no launcher variable says */
  char host[72];     /* no spaces */
};

static struct target prepared;
static atomic_int prepared_ok;
static atomic_int record_written;

/* ---- formatting without libc's formatted output ---- */

struct buf {
  char *p;
  size_t len, cap; /* cap includes the terminating NUL */
};

static void put(struct buf *b, const char *s) {
  while (*s != '\0' && b->len + 1 < b->cap) b->p[b->len++] = *s++;
  b->p[b->len] = '\0';
}

static void put_u(struct buf *b, unsigned long long v) {
  char digits[24];
  int n = 0;
  do { digits[n++] = (char)('0' + v % 10); v /= 10; } while (v != 0);
  char one[2] = {0, 0};
  while (n > 0) { one[0] = digits[--n]; put(b, one); }
}

/* A word for the header line: letters, digits, '-', '_', '.'; others become '_'. */
static void put_word(struct buf *b, const char *s, size_t max) {
  char one[2] = {0, 0};
  for (size_t i = 0; s[i] != '\0' && i < max; i++) {
    char c = s[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '-' || c == '_' || c == '.';
    one[0] = ok ? c : '_';
    put(b, one);
  }
}

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* ---- the writer (async-signal-safe) ---- */

/* "<dir>/<prefix>rank<R><suffix>", or pid<P> in place of rank<R> when the
 * rank is unknown. Returns 0 when it fits. */
static int record_path(char *out, size_t cap, const struct target *t, const char *prefix,
                       const char *suffix) {
  struct buf b = {out, 0, cap};
  put(&b, t->dir);
  put(&b, "/");
  put(&b, prefix);
  if (t->rank[0] != '\0') { put(&b, "rank"); put(&b, t->rank); }
  else { put(&b, "pid"); put_u(&b, (unsigned long long)getpid()); }
  put(&b, suffix);
  return b.len + 1 < cap ? 0 : -1;
}

static int write_record(const struct target *t, const char *kind, const char *message) {
  char tmp[DIR_CAP + 64], final[DIR_CAP + 64], head[256];
  if (record_path(final, sizeof final, t, "", ".fail") != 0) return -1;
  /* the pid in the temp name keeps two processes claiming one rank apart */
  if (record_path(tmp, sizeof tmp, t, ".", ".tmp") != 0) return -1;
  struct buf tb = {tmp, strlen(tmp), sizeof tmp};
  put(&tb, ".");
  put_u(&tb, (unsigned long long)getpid());

  struct timespec ts = {0, 0};
  clock_gettime(CLOCK_REALTIME, &ts);
  struct buf h = {head, 0, sizeof head};
  put_u(&h, (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
  put(&h, " ");
  put(&h, t->rank[0] != '\0' ? t->rank : "-1");
  put(&h, " ");
  put(&h, t->host[0] != '\0' ? t->host : "unknown");
  put(&h, " ");
  put_u(&h, (unsigned long long)getpid());
  put(&h, " ");
  put_word(&h, kind != NULL && kind[0] != '\0' ? kind : "error", 32);
  put(&h, "\n");

  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  int rc = write_all(fd, head, h.len);
  if (rc == 0 && message != NULL) rc = write_all(fd, message, strlen(message));
  if (close(fd) != 0) rc = -1;
  if (rc == 0 && rename(tmp, final) == 0) return 1;
  int saved = errno;
  unlink(tmp);
  errno = saved;
  return -1;
}

/* ---- filling a target (not async-signal-safe: getenv, uname) ---- */

static int all_digits(const char *s) {
  if (s == NULL || s[0] == '\0') return 0;
  for (; *s != '\0'; s++)
    if (*s < '0' || *s > '9') return 0;
  return 1;
}

/* EMBER_RANK first (the ember executable derives it), then what the
 * process managers set themselves, for engines embedded elsewhere. */
static const char *find_rank(void) {
  static const char *const names[] = {"EMBER_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                      "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *v = getenv(names[i]);
    if (all_digits(v) && strlen(v) < sizeof prepared.rank) return v;
  }
  return "";
}

/* Returns 1 when EMBER_LAUNCH_DIR is set (and fits), else 0. */
static int fill_target(struct target *t) {
  const char *dir = getenv("EMBER_LAUNCH_DIR");
  if (dir == NULL || dir[0] == '\0' || strlen(dir) >= sizeof t->dir) return 0;
  memcpy(t->dir, dir, strlen(dir) + 1);
  const char *rank = find_rank();
  memcpy(t->rank, rank, strlen(rank) + 1);
  struct utsname u;
  struct buf h = {t->host, 0, sizeof t->host};
  t->host[0] = '\0';
  if (uname(&u) == 0) put_word(&h, u.nodename, sizeof t->host - 1);
  return 1;
}

/* ---- public ---- */

int em_launch_report_failure(const char *kind, const char *message) {
  struct target t;
  if (!fill_target(&t)) return 0;
  if (atomic_exchange(&record_written, 1) != 0) return 0;
  return write_record(&t, kind, message);
}

int em_launch_report_prepare(void) {
  if (atomic_load(&prepared_ok)) return 1;
  if (!fill_target(&prepared)) return 0;
  atomic_store(&prepared_ok, 1);
  return 1;
}

int em_launch_report_failure_async(const char *kind, const char *message) {
  if (!atomic_load(&prepared_ok)) return 0;
  if (atomic_exchange(&record_written, 1) != 0) return 0;
  return write_record(&prepared, kind, message);
}
