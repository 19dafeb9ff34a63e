/* .npy: round trips of every dtype (exact bytes), numpy.save's header byte for
 * byte, v2/v3 headers, memory-mapped loads (same values, read-only, mapping
 * kept alive by views), and corrupt or unsupported headers that must fail
 * with a message naming the problem. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "test.h"
#include "test_files.h"
#include "test_util.h"   /* patterned, same_bytes */

/* A .npy file: version major.0, the dict padded with spaces + '\n' so the
 * data starts at a multiple of align, then dlen data bytes. */
static void write_npy(const char *path, int major, const char *dict, size_t align, const void *data, size_t dlen) {
  size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
  size_t total = pre + dl + 1;
  total = (total + align - 1) / align * align;
  size_t hlen = total - pre;
  unsigned char *b = calloc(1, total + dlen);
  memcpy(b, "\x93NUMPY", 6);
  b[6] = (unsigned char)major;
  b[7] = 0;
  for (size_t i = 0; i < pre - 8; i++) b[8 + i] = (unsigned char)(hlen >> (8 * i));
  memcpy(b + pre, dict, dl);
  memset(b + pre + dl, ' ', total - pre - dl - 1);
  b[total - 1] = '\n';
  if (dlen) memcpy(b + total, data, dlen);
  write_bytes(path, b, total + dlen);
  free(b);
}

/* Both load paths must fail with needle in a load: message naming the path. */
static void expect_bad(const char *path, const char *needle, int line) {
  for (int mm = 0; mm < 2; mm++) {
    em_tensor *t = em_npy_load(path, mm);
    test_checks++;
    if (t || strncmp(em_last_error(), "load: ", 6) != 0 || !strstr(em_last_error(), path) ||
        !strstr(em_last_error(), needle)) {
      test_failures++;
      fprintf(stderr, "line %d (mmap=%d): expected an error mentioning '%s', got '%s'\n", line, mm, needle,
              t ? "(success)" : em_last_error());
    }
    em_tensor_release(t);
  }
}
#define EXPECT_BAD(path, needle) expect_bad(path, needle, __LINE__)

static void bad_dict(const char *dict, size_t dlen, const char *needle, int line) {
  unsigned char data[64] = {0};
  const char *p = tmp_path("bad.npy");
  write_npy(p, 1, dict, 64, data, dlen);
  expect_bad(p, needle, line);
}
#define BAD_DICT(dict, dlen, needle) bad_dict(dict, dlen, needle, __LINE__)

/* ------------------------------------------------------------------ */

TEST(round_trips_every_dtype_both_load_paths) {
  const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_I32, EM_I64, EM_U16, EM_U8, EM_BOOL};
  const int64_t shapes[][3] = {{2, 3}, {5}, {0}, {3, 1, 4}, {0, 3}, {1000}, {7}, {2, 2}};
  const int ndims[] = {2, 1, 0, 3, 2, 1, 1, 2};
  for (int i = 0; i < 8; i++) {
    em_tensor *t = patterned(ndims[i], shapes[i], dts[i], 99u + (uint32_t)i);
    if (dts[i] == EM_F16) {                      /* NaN payload, -0, subnormal, -inf survive */
      uint16_t *h = em_data_ptr(t);
      h[0] = 0x7e01;
    }
    const char *p = tmp_path("rt.npy");
    CHECK(em_npy_save(p, t) == 0);
    for (int mm = 0; mm < 2; mm++) {
      em_tensor *u = em_npy_load(p, mm);
      CHECK(u != NULL);
      if (u) {
        CHECK(same_bytes(u, t));
        if (em_numel(u) > 0) CHECK(em_is_contiguous(u));
        CHECK(!!(u->storage->flags & EM_STORAGE_READONLY) == mm);
      }
      em_tensor_release(u);
    }
    em_tensor_release(t);
  }
}

/* numpy.save(f, np.arange(6, dtype=np.float32).reshape(2, 3)): v1.0, header
 * length 118 (0x76), the 59-byte dict, 20 spaces of growth room for shape[0],
 * 38 spaces of padding to byte 127, '\n', then 24 bytes of data. */
TEST(golden_numpy_file_byte_exact) {
  static const char dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  unsigned char golden[128 + 24];
  memcpy(golden, "\x93NUMPY\x01\x00\x76\x00", 10);
  memcpy(golden + 10, dict, 59);
  memset(golden + 69, ' ', 127 - 69);
  golden[127] = '\n';
  const float vals[6] = {0, 1, 2, 3, 4, 5};
  memcpy(golden + 128, vals, 24);

  const int64_t shape[] = {2, 3};
  em_tensor *t = em_empty(2, shape, EM_F32, em_cpu());
  memcpy(em_data_ptr(t), vals, 24);
  const char *p = tmp_path("golden.npy");
  CHECK(em_npy_save(p, t) == 0);
  size_t len = 0;
  unsigned char *raw = read_bytes(p, &len);
  CHECK(raw && len == sizeof golden && memcmp(raw, golden, len) == 0);
  free(raw);
  em_tensor_release(t);

  write_bytes(p, golden, sizeof golden);
  em_tensor *u = em_npy_load(p, false);
  double v;
  const int64_t idx[2] = {1, 2};
  CHECK(u && u->dtype == EM_F32 && u->ndim == 2 && u->shape[0] == 2 && u->shape[1] == 3);
  CHECK(u && em_get_f64(u, idx, &v) == 0 && v == 5.0);
  em_tensor_release(u);
}

/* The longest shape Ember can hold: numpy's growth room (21 - digits of
 * shape[0] spaces) and alignment still give a 128-byte header, length field
 * 118, the dict then spaces to byte 127 and '\n'. (For any shape whose strides
 * fit in 64 bits the growth room never pushes the header past 128 bytes.) */
TEST(golden_numpy_header_of_an_8_dim_shape) {
  static const char dict[] =
      "{'descr': '<u2', 'fortran_order': False, 'shape': (7, 0, 100000000, 100000000, 10, 1, 1, 1), }";
  unsigned char golden[128];
  memcpy(golden, "\x93NUMPY\x01\x00\x76\x00", 10);
  memcpy(golden + 10, dict, sizeof dict - 1);
  memset(golden + 10 + sizeof dict - 1, ' ', 127 - 10 - (sizeof dict - 1));
  golden[127] = '\n';
  const int64_t shape[] = {7, 0, 100000000, 100000000, 10, 1, 1, 1};
  em_tensor *t = em_empty(8, shape, EM_U16, em_cpu());
  const char *p = tmp_path("eight.npy");
  CHECK(t && em_npy_save(p, t) == 0);
  size_t len = 0;
  unsigned char *raw = read_bytes(p, &len);
  CHECK(raw && len == sizeof golden && memcmp(raw, golden, len) == 0);
  free(raw);
  em_tensor *u = em_npy_load(p, true);
  CHECK(u && u->ndim == 8 && u->shape[3] == 100000000 && em_numel(u) == 0);
  em_tensor_release(u);
  em_tensor_release(t);
}

TEST(reads_v2_v3_and_hand_written_headers) {
  const uint16_t toks[5] = {1, 65535, 3, 4, 50000};
  const char *p = tmp_path("v.npy");
  /* Double quotes, no trailing comma, keys in another order, Python 2 'L'. */
  const char *dicts[] = {
    "{'descr': '<u2', 'fortran_order': False, 'shape': (5,), }",
    "{\"shape\": (5L,), \"fortran_order\": False, \"descr\": \"<u2\"}",
    "{'descr':'<u2','fortran_order':False,'shape':(5,)}",
  };
  for (int major = 1; major <= 3; major++)
    for (int d = 0; d < 3; d++) {
      write_npy(p, major, dicts[d], major == 1 ? 16 : 64, toks, sizeof toks);
      for (int mm = 0; mm < 2; mm++) {
        em_tensor *t = em_npy_load(p, mm);
        CHECK(t && t->dtype == EM_U16 && t->ndim == 1 && t->shape[0] == 5);
        CHECK(t && memcmp(em_data_ptr(t), toks, sizeof toks) == 0);
        em_tensor_release(t);
      }
    }
  /* A 0-d array and '<u1' (accepted for '|u1'); a 1-D array in Fortran order is C order too. */
  const double x = -1.25;
  write_npy(p, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", 64, &x, 8);
  em_tensor *s = em_npy_load(p, false);
  CHECK(s && s->ndim == 0 && ((double *)em_data_ptr(s))[0] == -1.25);
  em_tensor_release(s);
  write_npy(p, 1, "{'descr': '<u1', 'fortran_order': True, 'shape': (3,), }", 64, "abc", 3);
  s = em_npy_load(p, false);
  CHECK(s && s->dtype == EM_U8 && s->shape[0] == 3 && ((uint8_t *)em_data_ptr(s))[2] == 'c');
  em_tensor_release(s);
}

TEST(mmap_load_is_read_only_and_outlives_its_tensor) {
  const int64_t n = 100000;
  em_tensor *t = em_empty(1, &n, EM_U16, em_cpu());
  uint16_t *x = em_data_ptr(t);
  for (int64_t i = 0; i < n; i++) x[i] = (uint16_t)(i * 7919);
  const char *p = tmp_path("tokens.npy");
  CHECK(em_npy_save(p, t) == 0);
  em_tensor *m = em_npy_load(p, true);
  CHECK(m != NULL);
  if (m) {
    CHECK(same_bytes(m, t));
    CHECK(m->storage->flags & EM_STORAGE_READONLY);
    CHECK(m->storage->deleter != NULL);
    CHECK(((uintptr_t)em_data_ptr(m) & 63) == 0);  /* numpy's 64-byte alignment, page-based mapping */
    CHECK_ERR_CONTAINS(em_fill_(m, 0) < 0, "read-only");
    CHECK(em_data_ptr(m) != NULL && ((uint16_t *)em_data_ptr(m))[1] == 7919);
    em_tensor *v = em_narrow(m, 0, 50000, 10);   /* a view keeps the mapping alive */
    em_tensor_release(m);
    CHECK(v && ((uint16_t *)em_data_ptr(v))[0] == (uint16_t)(50000 * 7919));
    em_tensor *c = v ? em_clone(v) : NULL;        /* a copy is writable */
    CHECK(c && em_fill_(c, 3) == 0);
    em_tensor_release(c);
    em_tensor_release(v);
  }
  em_tensor_release(t);
}

TEST(mmap_refuses_misaligned_data_but_copy_load_reads_it) {
  const double vals[2] = {1.5, -2.5};
  const char *p = tmp_path("odd.npy");
  /* Pad the header so the data starts at byte 20: fine for a copy, not for an f64 mapping. */
  write_npy(p, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 4, vals, 16);
  size_t len = 0;
  unsigned char *raw = read_bytes(p, &len);
  CHECK(raw && (len - 16) % 8 != 0);
  free(raw);
  em_tensor *t = em_npy_load(p, false);
  CHECK(t && ((double *)em_data_ptr(t))[1] == -2.5);
  em_tensor_release(t);
  CHECK_ERR_CONTAINS(em_npy_load(p, true) == NULL, "not aligned to the 8-byte f64 (load it without mmap)");
}

TEST(saves_views_and_refuses_bf16) {
  const int64_t shape[] = {3, 4};
  em_tensor *base = patterned(2, shape, EM_I32, 5);
  em_tensor *tr = em_transpose(base, 0, 1);
  const char *p = tmp_path("view.npy");
  CHECK(em_npy_save(p, tr) == 0);
  em_tensor *u = em_npy_load(p, false);
  CHECK(u && u->shape[0] == 4 && u->shape[1] == 3);
  if (u) {
    const int32_t *a = em_data_ptr(base), *b = em_data_ptr(u);
    int bad = 0;
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 3; j++) bad += b[i * 3 + j] != a[j * 4 + i];
    CHECK(bad == 0);
  }
  em_tensor_release(u);
  em_tensor *h = em_zeros(2, shape, EM_BF16, em_cpu());
  CHECK_ERR_CONTAINS(em_npy_save(p, h) < 0, "save: dtype bf16 has no .npy equivalent");
  em_tensor_release(h);
  em_tensor_release(tr);
  em_tensor_release(base);
}

TEST(corrupt_preamble) {
  const char *p = tmp_path("pre.npy");
  write_bytes(p, "\x93NUMPY\x01", 7);
  EXPECT_BAD(p, "too short for a .npy header");
  write_bytes(p, "PK\x03\x04 this is a zip, not npy....", 32);
  EXPECT_BAD(p, "bad magic");
  unsigned char v4[16] = {0x93, 'N', 'U', 'M', 'P', 'Y', 4, 0, 4, 0, '{', '}'};
  write_bytes(p, v4, sizeof v4);
  EXPECT_BAD(p, "format version 4.0 is not supported (expected 1.0, 2.0 or 3.0)");
  unsigned char v11[16] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 1, 4, 0, '{', '}'};
  write_bytes(p, v11, sizeof v11);
  EXPECT_BAD(p, "format version 1.1");
  unsigned char longh[16] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0xff, 0x00, '{', '}'};
  write_bytes(p, longh, sizeof longh);
  EXPECT_BAD(p, "header length 255 runs past the end of the file");
  unsigned char hugeh[16] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0xff, 0xff, 0xff, 0xff};
  write_bytes(p, hugeh, sizeof hugeh);
  EXPECT_BAD(p, "exceeds the 1048576-byte limit");
  EXPECT_BAD(tmp_path("missing.npy"), "cannot open");
  CHECK(strstr(em_last_error(), "No such file or directory") != NULL);
}

TEST(corrupt_or_unsupported_headers) {
  BAD_DICT("{'descr': '|i1', 'fortran_order': False, 'shape': (4,), }", 4, "dtype '|i1' (int8) is not supported");
  BAD_DICT("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", 4, "'>f4' is big-endian");
  BAD_DICT("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", 8, "dtype '<c8' is not supported (expected one of <f4");
  BAD_DICT("{'descr': '<U3', 'fortran_order': False, 'shape': (1,), }", 12, "dtype '<U3' is not supported");
  BAD_DICT("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", 4, "structured dtypes");
  BAD_DICT("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24, "fortran_order is True");
  BAD_DICT("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20,
           "the data holds 20 bytes but shape [2, 3] f32 needs 24 (truncated file?)");
  BAD_DICT("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 12, "4 trailing bytes after the data");
  BAD_DICT("{'descr': '<f4', 'fortran_order': False, 'shape': (5), }", 20, "shape (5) is not a tuple");
  BAD_DICT("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", 0, "non-negative integers");
  BAD_DICT("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,), }", 0, "expected ',' or ')'");
  BAD_DICT("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4, "more than 8 dims");
  BAD_DICT("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,), }", 0,
           "needs more than 18446744073709551615");
  BAD_DICT("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 8), }", 0,
           "shape [4611686018427387904, 8] is too large to index");
  BAD_DICT("{'descr': '<u2', 'fortran_order': False, 'shape': (0, 10000000000, 10000000000), }", 0,
           "too large to index");
  BAD_DICT("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0, "does not fit in 64 bits");
  BAD_DICT("{'descr': '<f4', 'fortran_order': False, }", 0, "the header has no 'shape'");
  BAD_DICT("{'descr': '<f4', 'shape': (), }", 4, "the header has no 'fortran_order'");
  BAD_DICT("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, "duplicate key 'descr'");
  BAD_DICT("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}", 4, "unexpected key 'extra'");
  BAD_DICT("{'descr': '<f4', 'fortran_order': 0, 'shape': (), }", 4, "expected True or False");
  BAD_DICT("{'descr': '<f4', 'fortran_order': False, 'shape': () } junk", 4, "unexpected 'j' after the header dict");
  BAD_DICT("['descr', '<f4']", 4, "expected '{' to open the header dict");
  BAD_DICT("{'descr': '<f4', 'fortran_order': False, 'shape': ()", 4, "expected ',' or '}'");
  BAD_DICT("{'descr': '<f4", 4, "unterminated descr string");
  BAD_DICT("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (), }", 4, "inside a descr string");
}

/* Every truncation of a valid file fails cleanly on both load paths. */
TEST(truncated_files_never_crash) {
  const int64_t shape[] = {3, 5};
  em_tensor *t = patterned(2, shape, EM_F64, 11);
  const char *p = tmp_path("full.npy"), *q = tmp_path("cut.npy");
  CHECK(em_npy_save(p, t) == 0);
  size_t len = 0;
  unsigned char *raw = read_bytes(p, &len);
  int wrong = 0;
  for (size_t cut = 0; cut < len; cut++) {
    write_bytes(q, raw, cut);
    for (int mm = 0; mm < 2; mm++) {
      em_tensor *u = em_npy_load(q, mm);
      if (u || strncmp(em_last_error(), "load: ", 6) != 0) wrong++;
      em_tensor_release(u);
    }
  }
  CHECK(wrong == 0);
  free(raw);
  em_tensor_release(t);
}

int main(void) {
  if (tmpdir_create("ember_npy_")) return 2;
  RUN(round_trips_every_dtype_both_load_paths);
  RUN(golden_numpy_file_byte_exact);
  RUN(golden_numpy_header_of_an_8_dim_shape);
  RUN(reads_v2_v3_and_hand_written_headers);
  RUN(mmap_load_is_read_only_and_outlives_its_tensor);
  RUN(mmap_refuses_misaligned_data_but_copy_load_reads_it);
  RUN(saves_views_and_refuses_bf16);
  RUN(corrupt_preamble);
  RUN(corrupt_or_unsupported_headers);
  RUN(truncated_files_never_crash);
  int leftovers = clear_dir();
  rmdir(tmpdir);
  CHECK(leftovers == 0);
  TEST_MAIN_END();
}
