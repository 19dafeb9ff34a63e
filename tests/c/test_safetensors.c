/* safetensors: round trips of every dtype (exact bytes), views, metadata,
 * byte-exact agreement with files written by HF's safetensors, and a long list
 * of corrupt files that must each fail with a message naming the problem
 * (and never crash: run under valgrind / ASan). */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "test.h"
#include "test_files.h"
#include "test_util.h"   /* patterned, same_bytes */
#include "io/json_min.h"

/* A file with prefix = declared header length, then header text, then data. */
static void write_st(const char *path, uint64_t declared, const char *header, size_t hlen,
                     const void *data, size_t dlen) {
  size_t n = 8 + hlen + dlen;
  unsigned char *b = malloc(n);
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(declared >> (8 * i));
  memcpy(b + 8, header, hlen);
  if (dlen) memcpy(b + 8 + hlen, data, dlen);
  write_bytes(path, b, n);
  free(b);
}

/* The usual case: declared length = strlen(header), data of dlen bytes (pattern). */
static void write_st_simple(const char *path, const char *header, size_t dlen) {
  unsigned char data[256];
  for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)i;
  write_st(path, strlen(header), header, strlen(header), data, dlen);
}

static void free_loaded(int n, char **names, em_tensor **ts, int nm, char **mk, char **mv) {
  for (int i = 0; i < n; i++) { free(names[i]); em_tensor_release(ts[i]); }
  for (int i = 0; i < nm; i++) { free(mk[i]); free(mv[i]); }
  free(names); free(ts); free(mk); free(mv);
}

/* Load must fail, and the message must be the corrupt-file one naming path and needle. */
static void expect_corrupt(const char *path, const char *needle, int line) {
  char **names = NULL, **mk = NULL, **mv = NULL;
  em_tensor **ts = NULL;
  int nm = 0;
  int n = em_st_load(path, &names, &ts, &nm, &mk, &mv);
  char prefix[320];
  snprintf(prefix, sizeof prefix, "load: corrupt safetensors file '%s': ", path);
  test_checks++;
  if (n >= 0 || strncmp(em_last_error(), prefix, strlen(prefix)) != 0 || !strstr(em_last_error(), needle)) {
    test_failures++;
    fprintf(stderr, "line %d: expected a corrupt-file error mentioning '%s', got rc %d: '%s'\n", line, needle, n,
            em_last_error());
  }
  CHECK(names == NULL && ts == NULL && nm == 0);
  if (n >= 0) free_loaded(n, names, ts, nm, mk, mv);
}
#define EXPECT_CORRUPT(path, needle) expect_corrupt(path, needle, __LINE__)

/* A header JSON plus enough data bytes, written and expected to fail. */
static void corrupt_case(const char *header, size_t dlen, const char *needle, int line) {
  const char *p = tmp_path("corrupt.safetensors");
  write_st_simple(p, header, dlen);
  expect_corrupt(p, needle, line);
}
#define CORRUPT(header, dlen, needle) corrupt_case(header, dlen, needle, __LINE__)

/* ------------------------------------------------------------------ */

/* The header parser on its own: what it accepts and what it decodes. */
TEST(json_min_parses_strictly) {
  static const char doc[] =
      " {\"s\": \"a\\u00e9\\ud83d\\ude00\\n\\/\", \"n\": [-0, 15, 1.5e3, -9223372036854775808,"
      " 9223372036854775807, 9223372036854775808], \"e\": {}, \"f\": [], \"b\": [true, false, null]}\r\n\t ";
  jm_value v;
  char err[200];
  CHECK(jm_parse(doc, strlen(doc), 0, &v, err, sizeof err) == JM_OK);
  const jm_value *str = jm_get(&v, "s"), *n = jm_get(&v, "n"), *b = jm_get(&v, "b");
  CHECK(str && str->kind == JM_STRING && str->u.str.len == 9 &&
        memcmp(str->u.str.s, "a\xc3\xa9\xf0\x9f\x98\x80\n/", 9) == 0);
  CHECK(n && n->kind == JM_ARRAY && n->u.arr.n == 6);
  if (n && n->u.arr.n == 6) {
    const jm_value *x = n->u.arr.items;
    CHECK(x[0].is_int && x[0].u.num.i == 0);
    CHECK(x[1].is_int && x[1].u.num.i == 15);
    CHECK(!x[2].is_int && x[2].u.num.d == 1500.0);
    CHECK(x[3].is_int && x[3].u.num.i == INT64_MIN);
    CHECK(x[4].is_int && x[4].u.num.i == INT64_MAX);
    CHECK(!x[5].is_int && x[5].u.num.d == 9223372036854775808.0);   /* too big: a double */
  }
  CHECK(b && b->u.arr.n == 3 && b->u.arr.items[0].kind == JM_TRUE && b->u.arr.items[2].kind == JM_NULL);
  CHECK(jm_get(&v, "e")->kind == JM_OBJECT && jm_get(&v, "f")->kind == JM_ARRAY && !jm_get(&v, "zz"));
  jm_free(&v);

  /* 16 nested arrays parse, 17 do not. */
  char deep[64];
  memset(deep, '[', 16); memset(deep + 16, ']', 16);
  CHECK(jm_parse(deep, 32, 0, &v, err, sizeof err) == JM_OK);
  jm_free(&v);
  memset(deep, '[', 17); memset(deep + 17, ']', 17);
  CHECK(jm_parse(deep, 34, 0, &v, err, sizeof err) == JM_ERR_SYNTAX && strstr(err, "nesting deeper than 16"));
  CHECK(v.kind == JM_NULL);

  const char *bad[][2] = {
    {"", "expected a value, got end of input"}, {"{} {}", "unexpected '{' after the JSON value"},
    {"[1,]", "expected a value, got ']'"}, {"{\"a\" 1}", "expected ':'"}, {"[1 2]", "expected ',' or ']'"},
    {"-", "expected a digit"}, {"1.", "after the decimal point"}, {"1e", "in the exponent"},
    {"\"abc", "unterminated string"}, {"\"\\u12g4\"", "4 hex digits"}, {"\"\\udc00\"", "unpaired low surrogate"},
    {"\"\\ud800\\u0041\"", "not a low surrogate"}, {"nul", "expected a value"}, {"\xef\xbb\xbf{}", "expected a value"},
    {"\"\xed\xa0\x80\"", "invalid UTF-8"}, {"\"\xc0\xaf\"", "invalid UTF-8"}, {"{\"k\":1,\"k\":2}", "duplicate key \"k\""},
    {"NaN", "expected a value"}, {"+1", "expected a value"}
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = jm_parse(bad[i][0], strlen(bad[i][0]), 0, &v, err, sizeof err);
    test_checks++;
    if (rc != JM_ERR_SYNTAX || !strstr(err, bad[i][1]) || v.kind != JM_NULL) {
      test_failures++;
      fprintf(stderr, "json case %zu: expected '%s', got rc %d '%s'\n", i, bad[i][1], rc, err);
    }
  }
  CHECK(jm_parse("[1]\0", 4, 0, &v, err, sizeof err) == JM_ERR_SYNTAX && strstr(err, "byte 3: unexpected byte 0x00"));
  /* The value budget. */
  CHECK(jm_parse("[1,2,3]", 7, 3, &v, err, sizeof err) == JM_ERR_SYNTAX && strstr(err, "more than 3 values"));
  CHECK(jm_parse("[1,2,3]", 7, 4, &v, err, sizeof err) == JM_OK);
  jm_free(&v);
}

TEST(round_trips_every_dtype_bit_exact) {
  const em_dtype dts[] = {EM_F32, EM_F64, EM_BF16, EM_F16, EM_I32, EM_I64, EM_U16, EM_U8, EM_BOOL};
  const int64_t shapes[][4] = {{2, 3}, {5}, {0}, {1, 2, 1, 3}, {4, 0}, {7}, {3, 3}, {2, 2, 2}, {9}};
  const int ndims[] = {2, 1, 0, 4, 2, 1, 2, 3, 1};
  enum { N = 9 };
  em_tensor *ts[N];
  char namebuf[N][16];
  const char *names[N];
  for (int i = 0; i < N; i++) {
    ts[i] = patterned(ndims[i], shapes[i], dts[i], 1234u + (uint32_t)i);
    snprintf(namebuf[i], sizeof namebuf[i], "t%d.%s", i, em_dtype_name(dts[i]));
    names[i] = namebuf[i];
  }
  /* A few bf16/f16 patterns by hand: NaN with payload, -0, subnormal, inf. */
  uint16_t *h = em_data_ptr(ts[2]);
  h[0] = 0x7fc1; h[1] = 0x8000; h[2] = 0x0001; h[3] = 0xff80;
  uint16_t *f = em_data_ptr(ts[3]);
  f[0] = 0x7e01; f[1] = 0x8000; f[2] = 0x0001; f[3] = 0xfc00;
  const char *p = tmp_path("all.safetensors");
  CHECK(em_st_save(p, N, names, ts, 0, NULL, NULL) == 0);

  char **ln = NULL, **mk = NULL, **mv = NULL;
  em_tensor **lt = NULL;
  int nm = -1;
  int n = em_st_load(p, &ln, &lt, &nm, &mk, &mv);
  CHECK(n == N);
  CHECK(nm == 0);
  for (int i = 0; i < n && n == N; i++) {
    CHECK(strcmp(ln[i], names[i]) == 0);          /* file (offset) order = save order */
    CHECK(lt[i]->device.type == EM_CPU);
    if (em_numel(lt[i]) > 0) CHECK(em_is_contiguous(lt[i]));   /* core: [4, 0] reads as non-contiguous */
    CHECK(same_bytes(lt[i], ts[i]));
  }
  if (n > 0) free_loaded(n, ln, lt, nm, mk, mv);
  for (int i = 0; i < N; i++) em_tensor_release(ts[i]);
}

TEST(saves_non_contiguous_views) {
  const int64_t shape[] = {3, 4};
  em_tensor *base = em_empty(2, shape, EM_F32, em_cpu());
  float *b = em_data_ptr(base);
  for (int i = 0; i < 12; i++) b[i] = (float)i * 1.5f - 4.0f;
  em_tensor *tr = em_transpose(base, 0, 1);       /* [4, 3], strides (1, 4) */
  em_tensor *nar = em_narrow(base, 1, 1, 2);      /* [3, 2], offset 1 */
  CHECK(tr && !em_is_contiguous(tr));
  CHECK(nar && !em_is_contiguous(nar));
  const char *names[] = {"transposed", "narrowed"};
  em_tensor *ts[] = {tr, nar};
  const char *p = tmp_path("views.safetensors");
  CHECK(em_st_save(p, 2, names, ts, 0, NULL, NULL) == 0);
  char **ln; em_tensor **lt;
  int n = em_st_load(p, &ln, &lt, NULL, NULL, NULL);
  CHECK(n == 2);
  if (n == 2) {
    CHECK(lt[0]->ndim == 2 && lt[0]->shape[0] == 4 && lt[0]->shape[1] == 3);
    CHECK(lt[1]->ndim == 2 && lt[1]->shape[0] == 3 && lt[1]->shape[1] == 2);
    const float *x = em_data_ptr(lt[0]), *y = em_data_ptr(lt[1]);
    int bad = 0;
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 3; j++) bad += x[i * 3 + j] != b[j * 4 + i];
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 2; j++) bad += y[i * 2 + j] != b[i * 4 + 1 + j];
    CHECK(bad == 0);
    free_loaded(n, ln, lt, 0, NULL, NULL);
  }
  em_tensor_release(tr);
  em_tensor_release(nar);
  em_tensor_release(base);
}

TEST(metadata_round_trips_with_escapes) {
  const char *keys[] = {"format", "quote\"back\\slash", "ctl\n\t\x01", "utf8 \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"};
  const char *vals[] = {"pt", "a \"b\" \\c/", "line1\nline2\r\b\f", ""};
  const int64_t one = 1;
  em_tensor *t = em_full(1, &one, 3.0, EM_F32, em_cpu());
  const char *names[] = {"x \"quoted\" \\ name\x1f"};
  const char *p = tmp_path("meta.safetensors");
  CHECK(em_st_save(p, 1, names, &t, 4, keys, vals) == 0);
  char **ln = NULL, **mk = NULL, **mv = NULL;
  em_tensor **lt = NULL;
  int nm = 0;
  int n = em_st_load(p, &ln, &lt, &nm, &mk, &mv);
  CHECK(n == 1 && nm == 4);
  if (n == 1 && nm == 4) {
    CHECK(strcmp(ln[0], names[0]) == 0);
    CHECK(((float *)em_data_ptr(lt[0]))[0] == 3.0f);
    for (int i = 0; i < 4; i++) {
      CHECK(strcmp(mk[i], keys[i]) == 0);
      CHECK(strcmp(mv[i], vals[i]) == 0);
    }
  }
  if (n >= 0) free_loaded(n, ln, lt, nm, mk, mv);
  /* The control byte is written as serde_json writes it: \u001f, lowercase. */
  size_t len;
  unsigned char *raw = read_bytes(p, &len);
  CHECK(raw && memmem(raw, len, "name\\u001f\"", 11) != NULL);
  CHECK(raw && memmem(raw, len, "\"ctl\\n\\t\\u0001\"", 15) != NULL);
  free(raw);
  em_tensor_release(t);
}

/* Bytes HF's Rust writer produces for {"attn0": f32 [1,1,2,3] = 0..5} (its
 * own test_serialization_forced_alignement): compact JSON, 7 spaces of
 * padding to make the 65-byte header 72, then the data 8-byte aligned. */
TEST(golden_hf_file_loads_and_saves_byte_exact) {
  static const char header[] = "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       ";
  CHECK(sizeof header - 1 == 72);
  const float vals[6] = {0, 1, 2, 3, 4, 5};
  unsigned char golden[8 + 72 + 24];
  memset(golden, 0, 8);
  golden[0] = 72;
  memcpy(golden + 8, header, 72);
  memcpy(golden + 80, vals, 24);
  const char *gp = tmp_path("golden.safetensors");
  write_bytes(gp, golden, sizeof golden);

  char **ln = NULL; em_tensor **lt = NULL;
  int n = em_st_load(gp, &ln, &lt, NULL, NULL, NULL);
  CHECK(n == 1);
  if (n == 1) {
    CHECK(strcmp(ln[0], "attn0") == 0);
    CHECK(lt[0]->dtype == EM_F32 && lt[0]->ndim == 4);
    CHECK(lt[0]->shape[0] == 1 && lt[0]->shape[1] == 1 && lt[0]->shape[2] == 2 && lt[0]->shape[3] == 3);
    double v;
    const int64_t idx[4] = {0, 0, 1, 2};
    CHECK(em_get_f64(lt[0], idx, &v) == 0 && v == 5.0);
    CHECK(memcmp(em_data_ptr(lt[0]), vals, 24) == 0);
    /* Saving what we loaded writes the same bytes HF wrote. */
    const char *sp = tmp_path("resaved.safetensors");
    const char *names[] = {"attn0"};
    CHECK(em_st_save(sp, 1, names, lt, 0, NULL, NULL) == 0);
    size_t len = 0;
    unsigned char *raw = read_bytes(sp, &len);
    CHECK(raw && len == sizeof golden && memcmp(raw, golden, len) == 0);
    free(raw);
    free_loaded(n, ln, lt, 0, NULL, NULL);
  }

  /* em_st_parse on the bytes in memory. */
  em_st_header h;
  CHECK(em_st_parse(golden, sizeof golden, "mem", &h) == 0);
  CHECK(h.n == 1 && h.header_len == 72 && h.entries[0].begin == 0 && h.entries[0].end == 24);
  CHECK(h.n == 1 && strcmp(h.entries[0].name, "attn0") == 0 && h.entries[0].dtype == EM_F32);
  em_st_header_free(&h);
}

/* HF's test_empty: no tensors, metadata {"framework": "pt"} -> a 40-byte header. */
TEST(golden_hf_empty_file_with_metadata) {
  static const char header[] = "{\"__metadata__\":{\"framework\":\"pt\"}}     ";
  CHECK(sizeof header - 1 == 40);
  unsigned char golden[48] = {40};
  memcpy(golden + 8, header, 40);
  const char *p = tmp_path("empty.safetensors");
  const char *k[] = {"framework"}, *v[] = {"pt"};
  CHECK(em_st_save(p, 0, NULL, NULL, 1, k, v) == 0);
  size_t len = 0;
  unsigned char *raw = read_bytes(p, &len);
  CHECK(raw && len == sizeof golden && memcmp(raw, golden, len) == 0);
  free(raw);
  char **ln = NULL, **mk = NULL, **mv = NULL; em_tensor **lt = NULL; int nm = 0;
  int n = em_st_load(p, &ln, &lt, &nm, &mk, &mv);
  CHECK(n == 0 && nm == 1 && mk && strcmp(mk[0], "framework") == 0 && strcmp(mv[0], "pt") == 0);
  if (n >= 0) free_loaded(n, ln, lt, nm, mk, mv);

  /* And with no metadata at all: "{}" + 6 spaces. */
  unsigned char golden2[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
  CHECK(em_st_save(p, 0, NULL, NULL, 0, NULL, NULL) == 0);
  raw = read_bytes(p, &len);
  CHECK(raw && len == 16 && memcmp(raw, golden2, 16) == 0);
  free(raw);
}

/* A file as torch's save_file writes a state dict: metadata first, tensors
 * sorted by dtype (I64 before BF16), keys in offset order. Load must read the
 * values; and since HF readers sort by offset, key order must not matter. */
TEST(golden_torch_style_file_with_two_dtypes) {
  static const char header[] =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"step\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
      "\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[16,24]}}";
  size_t hl = strlen(header), padded = (hl + 7) / 8 * 8;
  char hbuf[256];
  memcpy(hbuf, header, hl);
  memset(hbuf + hl, ' ', padded - hl);
  unsigned char data[24];
  const int64_t steps[2] = {-7, 1LL << 40};
  const uint16_t w[4] = {0x3f80, 0xc000, 0x4049, 0x0000};   /* bf16: 1, -2, 3.140625, 0 */
  memcpy(data, steps, 16);
  memcpy(data + 16, w, 8);
  const char *p = tmp_path("torch.safetensors");
  write_st(p, padded, hbuf, padded, data, sizeof data);
  char **ln = NULL, **mk = NULL, **mv = NULL; em_tensor **lt = NULL; int nm = 0;
  int n = em_st_load(p, &ln, &lt, &nm, &mk, &mv);
  CHECK(n == 2 && nm == 1);
  if (n == 2) {
    CHECK(strcmp(ln[0], "step") == 0 && lt[0]->dtype == EM_I64);
    CHECK(strcmp(ln[1], "w") == 0 && lt[1]->dtype == EM_BF16);
    double v;
    int64_t i0 = 0, i1 = 1, ij[2] = {1, 0};
    CHECK(em_get_f64(lt[0], &i0, &v) == 0 && v == -7.0);
    CHECK(em_get_f64(lt[0], &i1, &v) == 0 && v == 1099511627776.0);
    CHECK(em_get_f64(lt[1], ij, &v) == 0 && v == 3.140625);
    /* Saving in the same order reproduces the file byte for byte. */
    const char *names[] = {"step", "w"};
    const char *k[] = {"format"}, *vv[] = {"pt"};
    const char *sp = tmp_path("torch2.safetensors");
    CHECK(em_st_save(sp, 2, names, lt, 1, k, vv) == 0);
    size_t a_len = 0, b_len = 0;
    unsigned char *a = read_bytes(p, &a_len), *b = read_bytes(sp, &b_len);
    CHECK(a && b && a_len == b_len && memcmp(a, b, a_len) == 0);
    free(a);
    free(b);
  }
  if (n >= 0) free_loaded(n, ln, lt, nm, mk, mv);

  /* Keys listed in a different order than the data: loaded in offset order. */
  static const char h2[] = "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]},"
                           "\"a\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4]}}";
  write_st_simple(p, h2, 6);
  n = em_st_load(p, &ln, &lt, NULL, NULL, NULL);
  CHECK(n == 2 && strcmp(ln[0], "a") == 0 && strcmp(ln[1], "b") == 0);
  if (n == 2) CHECK(((uint8_t *)em_data_ptr(lt[1]))[1] == 5 && ((uint16_t *)em_data_ptr(lt[0]))[0] == 0x0100);
  if (n >= 0) free_loaded(n, ln, lt, 0, NULL, NULL);
}

TEST(scalar_and_empty_tensors) {
  static const char h[] = "{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
                          "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[8,8]}}";
  const double s = 2.5;
  const char *p = tmp_path("scalar.safetensors");
  write_st(p, strlen(h), h, strlen(h), &s, 8);
  char **ln = NULL; em_tensor **lt = NULL;
  int n = em_st_load(p, &ln, &lt, NULL, NULL, NULL);
  CHECK(n == 2);
  if (n == 2) {
    CHECK(strcmp(ln[0], "s") == 0 && lt[0]->ndim == 0 && ((double *)em_data_ptr(lt[0]))[0] == 2.5);
    CHECK(strcmp(ln[1], "e") == 0 && lt[1]->ndim == 2 && lt[1]->shape[0] == 0 && lt[1]->shape[1] == 5);
  }
  if (n >= 0) free_loaded(n, ln, lt, 0, NULL, NULL);
}

TEST(corrupt_length_prefix) {
  const char *p = tmp_path("short.safetensors");
  write_bytes(p, "", 0);
  EXPECT_CORRUPT(p, "too short for the 8-byte header length");
  write_bytes(p, "\x10\0\0\0\0", 5);                                   /* truncated length prefix */
  EXPECT_CORRUPT(p, "the file is 5 bytes, too short");
  unsigned char big[16] = {0x00, 0xc2, 0xeb, 0x0b, 0, 0, 0, 0, '{', '}'}; /* 200,000,000 */
  write_bytes(p, big, sizeof big);
  EXPECT_CORRUPT(p, "header length 200000000 exceeds the 100 MB");
  unsigned char huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
  write_bytes(p, huge, sizeof huge);
  EXPECT_CORRUPT(p, "exceeds the 100 MB");
  write_st(p, 1000, "{}", 2, NULL, 0);                                  /* header longer than the file */
  EXPECT_CORRUPT(p, "header length 1000 runs past the end of the file (2 bytes follow");
  write_st(p, 0, "", 0, NULL, 0);
  EXPECT_CORRUPT(p, "the header is empty");
}

TEST(corrupt_json) {
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],", 4, "not valid JSON");
  CORRUPT("{'w':{}}", 0, "not valid JSON: byte 1: expected a string key");
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],}}", 4, "expected a string key");
  CORRUPT("[1, 2]", 0, "must be a JSON object starting with '{'");
  CORRUPT(" {}", 0, "starting with '{'");
  CORRUPT("{\"a\":01}", 0, "leading zeros");
  CORRUPT("{\"a\":\"tab\there\"}", 0, "control character 0x09");
  CORRUPT("{\"a\":\"\\x\"}", 0, "invalid escape");
  CORRUPT("{\"\\ud800\":1}", 0, "surrogate");
  CORRUPT("{\"a\":\"\xc3\x28\"}", 0, "invalid UTF-8");
  CORRUPT("{\"a\":tru}", 0, "expected a value");
  /* Trailing bytes in the header that are not whitespace. */
  CORRUPT("{}xyz", 0, "unexpected 'x' after the JSON value");
  const char *p = tmp_path("nul.safetensors");
  write_st(p, 8, "{}\0\0\0\0\0\0", 8, NULL, 0);
  EXPECT_CORRUPT(p, "unexpected byte 0x00 after the JSON value");
  /* Nesting: 16 levels are fine for JSON (then the schema says no), 17 are not. */
  char deep[128] = "{\"__metadata__\":";
  size_t k = strlen(deep);
  for (int i = 0; i < 16; i++) deep[k++] = '[';
  for (int i = 0; i < 16; i++) deep[k++] = ']';
  deep[k++] = '}';
  deep[k] = 0;
  CORRUPT(deep, 0, "nesting deeper than 16");
  /* A header of thousands of empty arrays trips the value budget before any schema check. */
  char *many = malloc(4000 * 3 + 64);
  size_t m = (size_t)sprintf(many, "{\"__metadata__\":{\"k\":[");
  for (int i = 0; i < 4000; i++) m += (size_t)sprintf(many + m, i ? ",[]" : "[]");
  strcpy(many + m, "]}}");
  CORRUPT(many, 0, "too many");
  free(many);
}

TEST(corrupt_schema) {
  CORRUPT("{\"w\":{\"dtype\":\"XYZ\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
          "tensor 'w' has unsupported dtype 'XYZ' (expected one of F32");
  CORRUPT("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, "unsupported dtype 'F8_E4M3'");
  CORRUPT("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unsupported dtype 'f32'");
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2,3],\"data_offsets\":[0,4]}}", 4,
          "tensor 'w': shape entry 0 is -2, expected a non-negative integer");
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,2.5],\"data_offsets\":[0,4]}}", 4, "shape entry 1 is a non-integer or out-of-range number (2.5)");
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, "shape entry 0 is a string");
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[1e2],\"data_offsets\":[0,4]}}", 4, "shape entry 0 is a non-integer or out-of-range number (100)");
  CORRUPT("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
          "shape of 9 dims, more than the 8");
  CORRUPT("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 2, "must be [begin, end], got an array of 3");
  CORRUPT("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 2, "data_offsets entry 0 is -1");
  CORRUPT("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}", 2,
          "data_offsets entry 1 is a non-integer or out-of-range number (1e+20)");
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "tensor 'w' has no \"data_offsets\"");
  CORRUPT("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "has no \"dtype\"");
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "has no \"shape\"");
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"extra\":1}}", 8, "unexpected field 'extra'");
  CORRUPT("{\"w\":[1,2]}", 0, "tensor 'w': expected an object with dtype, shape and data_offsets, got an array");
  CORRUPT("{\"__metadata__\":{\"k\":1}}", 0, "\"__metadata__\" value of key 'k' must be a string, got a number");
  CORRUPT("{\"__metadata__\":[]}", 0, "\"__metadata__\" must be an object");
  CORRUPT("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "NUL byte");
  /* Duplicate names, also when a second copy hides behind an escape. */
  CORRUPT("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
          "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "duplicate key \"w\"");
  CORRUPT("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
          "\"\\u0077\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "duplicate key \"w\"");
}

TEST(corrupt_offsets) {
  /* The example from the issue. */
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", 12,
          "tensor 'w' data_offsets [0, 12] hold 12 bytes but shape [2, 3] f32 needs 24");
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
          "tensor 'w' data_offsets [0, 16] run past the end of the data section (8 bytes)");
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "end before they begin");
  CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
          "tensors 'a' data_offsets [0, 8] and 'b' [4, 12] overlap");
  CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "overlap");
  CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}", 20,
          "bytes [8, 12) of the data section belong to no tensor");
  CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "bytes [0, 4) of the data section");
  CORRUPT("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 11,
          "the data section is 11 bytes but the tensors cover only the first 8");
  CORRUPT("{}", 3, "the data section is 3 bytes");
  /* A lying shape whose byte count overflows 64 bits must not wrap to a small size. */
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,0]}}", 0,
          "tensor 'w' has shape [4611686018427387904, 4], too large to index");
  /* Empty (a zero dim) but with strides that would overflow: still refused. */
  CORRUPT("{\"w\":{\"dtype\":\"U8\",\"shape\":[0,10000000000,10000000000],\"data_offsets\":[0,0]}}", 0,
          "too large to index");
  CORRUPT("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0, "needs more than 2^64");
}

/* Every truncation and many single-byte corruptions of a valid file: load
 * either fails with a load: message or succeeds; it never crashes or leaks. */
TEST(mutated_files_never_crash) {
  const int64_t shape[] = {2, 3};
  em_tensor *t = patterned(2, shape, EM_F32, 7);
  em_tensor *u = patterned(1, shape, EM_U8, 8);
  const char *names[] = {"weight", "b"};
  em_tensor *ts[] = {t, u};
  const char *k[] = {"format"}, *v[] = {"pt"};
  const char *p = tmp_path("valid.safetensors"), *q = tmp_path("mutant.safetensors");
  CHECK(em_st_save(p, 2, names, ts, 1, k, v) == 0);
  size_t len = 0;
  unsigned char *raw = read_bytes(p, &len);
  int wrong = 0, ok = 0;
  for (size_t cut = 0; cut < len; cut++) {
    write_bytes(q, raw, cut);
    char **ln; em_tensor **lt;
    int n = em_st_load(q, &ln, &lt, NULL, NULL, NULL);
    if (n >= 0) { wrong++; free_loaded(n, ln, lt, 0, NULL, NULL); }
    else if (strncmp(em_last_error(), "load: corrupt safetensors file", 30) != 0) wrong++;
  }
  CHECK(wrong == 0);
  const unsigned char subst[] = {0, '"', '{', '}', '[', ']', ',', ':', '-', '9', 'e', '\\', 0xff, ' '};
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | raw[i];
  for (size_t pos = 0; pos < 8 + hlen; pos++)
    for (size_t s = 0; s < sizeof subst; s++) {
      unsigned char saved = raw[pos];
      raw[pos] = subst[s];
      write_bytes(q, raw, len);
      raw[pos] = saved;
      char **ln; em_tensor **lt;
      int n = em_st_load(q, &ln, &lt, NULL, NULL, NULL);
      if (n >= 0) { ok++; free_loaded(n, ln, lt, 0, NULL, NULL); }
      else if (strncmp(em_last_error(), "load: ", 6) != 0) wrong++;
    }
  CHECK(wrong == 0);
  CHECK(ok > 0);            /* e.g. a space in padding, or a digit that keeps the meaning */
  free(raw);
  em_tensor_release(t);
  em_tensor_release(u);
}

TEST(missing_file_and_directory) {
  const char *p = tmp_path("does-not-exist.safetensors");
  char **ln; em_tensor **lt;
  char want[300];
  snprintf(want, sizeof want, "load: cannot open '%s': No such file or directory", p);
  CHECK_ERR_CONTAINS(em_st_load(p, &ln, &lt, NULL, NULL, NULL) < 0, want);
  CHECK(em_last_error_code() == EM_ERR_IO);
  CHECK_ERR_CONTAINS(em_st_load(tmpdir, &ln, &lt, NULL, NULL, NULL) < 0, "Is a directory");
}

TEST(save_rejects_bad_arguments_and_leaves_no_files) {
  clear_dir();
  const int64_t two = 2;
  em_tensor *t = em_zeros(1, &two, EM_F32, em_cpu());
  em_tensor *ts[] = {t, t};
  const char *dup[] = {"w", "w"};
  const char *p = tmp_path("bad.safetensors");
  CHECK_ERR_CONTAINS(em_st_save(p, 2, dup, ts, 0, NULL, NULL) < 0, "save: duplicate tensor name 'w'");
  const char *reserved[] = {"__metadata__"};
  CHECK_ERR_CONTAINS(em_st_save(p, 1, reserved, ts, 0, NULL, NULL) < 0, "reserved for metadata");
  const char *badutf[] = {"\xff"};
  CHECK_ERR_CONTAINS(em_st_save(p, 1, badutf, ts, 0, NULL, NULL) < 0, "not valid UTF-8");
  const char *ok[] = {"w"};
  const char *mk[] = {"k", "k"}, *mv[] = {"1", "2"};
  CHECK_ERR_CONTAINS(em_st_save(p, 1, ok, ts, 2, mk, mv) < 0, "save: duplicate metadata key 'k'");
  em_tensor *nulls[] = {NULL};
  CHECK_ERR_CONTAINS(em_st_save(p, 1, ok, nulls, 0, NULL, NULL) < 0, "save: tensor 'w' is NULL");
  CHECK(count_dir_entries() == 0);
  /* A directory that does not exist: an I/O error naming the path, nothing left behind. */
  char missing[300];
  snprintf(missing, sizeof missing, "%s/no/such/dir/x.safetensors", tmpdir);
  CHECK_ERR_CONTAINS(em_st_save(missing, 1, ok, ts, 0, NULL, NULL) < 0, "save: cannot create");
  CHECK(strstr(em_last_error(), "No such file or directory") != NULL);
  CHECK(em_last_error_code() == EM_ERR_IO);
  CHECK(count_dir_entries() == 0);
  em_tensor_release(t);
}

TEST(save_replaces_atomically) {
  clear_dir();
  const char *p = tmp_path("model.safetensors");
  write_bytes(p, "old contents", 12);
  const int64_t three = 3;
  em_tensor *t = em_full(1, &three, 7.0, EM_I32, em_cpu());
  const char *names[] = {"x"};
  CHECK(em_st_save(p, 1, names, &t, 0, NULL, NULL) == 0);
  CHECK(count_dir_entries() == 1);                 /* no PATH.tmp.<pid> left */
  char **ln; em_tensor **lt;
  int n = em_st_load(p, &ln, &lt, NULL, NULL, NULL);
  CHECK(n == 1 && ((int32_t *)em_data_ptr(lt[0]))[2] == 7);
  if (n >= 0) free_loaded(n, ln, lt, 0, NULL, NULL);
  em_tensor_release(t);
}

int main(void) {
  if (tmpdir_create("ember_st_")) return 2;
  RUN(json_min_parses_strictly);
  RUN(round_trips_every_dtype_bit_exact);
  RUN(saves_non_contiguous_views);
  RUN(metadata_round_trips_with_escapes);
  RUN(golden_hf_file_loads_and_saves_byte_exact);
  RUN(golden_hf_empty_file_with_metadata);
  RUN(golden_torch_style_file_with_two_dtypes);
  RUN(scalar_and_empty_tensors);
  RUN(corrupt_length_prefix);
  RUN(corrupt_json);
  RUN(corrupt_schema);
  RUN(corrupt_offsets);
  RUN(mutated_files_never_crash);
  RUN(missing_file_and_directory);
  RUN(save_rejects_bad_arguments_and_leaves_no_files);
  RUN(save_replaces_atomically);
  clear_dir();
  rmdir(tmpdir);
  TEST_MAIN_END();
}
