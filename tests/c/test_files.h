/* Scratch files for the file-format tests: one private temporary directory
 * per test program, paths inside it, whole-file reads and writes, and the
 * final clean-up (which reports leftover "*.tmp.*" files from atomic writes). */
#ifndef EMBER_TEST_FILES_H
#define EMBER_TEST_FILES_H
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[64];

/* mkdtemp /tmp/<prefix>XXXXXX into tmpdir; 0 or -1. */
static inline int tmpdir_create(const char *prefix) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/%sXXXXXX", prefix);
  if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return -1; }
  return 0;
}

static inline const char *tmp_path(const char *name) {
  static char buf[4][256];
  static int k = 0;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
  return buf[k];
}

static inline void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) { perror(path); exit(2); }
  if (n) fwrite(data, 1, n, f);
  fclose(f);
}

static inline unsigned char *read_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  *n = fread(b, 1, (size_t)len, f);
  fclose(f);
  return b;
}

static inline int count_dir_entries(void) {
  DIR *d = opendir(tmpdir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

/* Remove every file in tmpdir; returns how many were atomic-write leftovers. */
static inline int clear_dir(void) {
  DIR *d = opendir(tmpdir);
  struct dirent *e;
  char p[512];
  int leftovers = 0;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      leftovers += strstr(e->d_name, ".tmp.") != NULL;
      snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
      unlink(p);
    }
  closedir(d);
  return leftovers;
}
#endif
