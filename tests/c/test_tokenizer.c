/* The tokenizer's C API (engine/data): train -> encode -> decode, the
 * streaming .npy writer it uses, and the errors of the options check. The
 * behaviour in depth (reference trainer, files, streaming) is in
 * tests/lua/tokenizer_spec.lua; this checks the C contract the bindings rely
 * on: ownership, return values, messages. */
#include <stdlib.h>
#include <unistd.h>
#include "test.h"
#include "test_files.h"

static const char *CORPUS =
  "the cat sat on the mat. the hat is on the cat! <|endoftext|> it's 2024, the end.\n\n"
  "naïve café 東京 🙂 the the the";

TEST(trains_encodes_and_decodes) {
  const char *special[] = {"<|endoftext|>"};
  em_bpe_train_options o = {.vocab_size = 280, .n_special = 1, .special = special, .threads = 2};
  size_t len = strlen(CORPUS);
  em_tokenizer *t = em_tokenizer_train(1, &CORPUS, &len, &o);
  CHECK(t != NULL);
  if (!t) return;
  CHECK(em_tokenizer_vocab_size(t) <= 280);
  CHECK(em_tokenizer_n_special(t) == 1);
  int32_t eot = em_tokenizer_id(t, "<|endoftext|>", 13);
  CHECK(eot == em_tokenizer_vocab_size(t) - 1 && em_tokenizer_is_special(t, eot));
  int32_t *ids;
  int64_t n = em_tokenizer_encode(t, CORPUS, len, &ids);
  CHECK(n > 0 && n < (int64_t)len);
  char *back;
  int64_t m = em_tokenizer_decode(t, ids, (size_t)n, &back);
  CHECK(m == (int64_t)len && memcmp(back, CORPUS, len) == 0);
  free(back);
  ids[0] = 99999;
  CHECK_ERR_CONTAINS(em_tokenizer_decode(t, ids, 1, &back) < 0, "tokenizer.decode: expected ids in [0,");
  free(ids);
  em_tokenizer_free(t);
}

TEST(refuses_bad_options) {
  size_t len = 3;
  const char *doc = "abc";
  const char *special[] = {"<|a|>", "<|a|>"};
  em_bpe_train_options o = {.vocab_size = 100};
  CHECK_ERR_CONTAINS(!em_tokenizer_train(1, &doc, &len, &o), "expected vocab_size >= 256 + #special_tokens (256), got 100");
  o = (em_bpe_train_options){.vocab_size = 300, .n_special = 2, .special = special};
  CHECK_ERR_CONTAINS(!em_tokenizer_train(1, &doc, &len, &o), "special token '<|a|>' is given twice");
  o = (em_bpe_train_options){.vocab_size = 300, .pattern = "(unclosed"};
  CHECK_ERR_CONTAINS(!em_tokenizer_train(1, &doc, &len, &o), "cannot compile the pre-tokenisation pattern");
}

TEST(npy_writer_streams_a_1d_array) {
  const char *p = tmp_path("ids.npy");
  em_npy_writer *w = em_npy_writer_open(p, EM_U16);
  CHECK(w != NULL);
  uint16_t a[3] = {1, 2, 65535}, b[2] = {7, 8};
  CHECK(em_npy_writer_append(w, a, 3) == 0);
  CHECK(em_npy_writer_append(w, b, 2) == 0);
  CHECK(em_npy_writer_close(w) == 0);
  em_tensor *t = em_npy_load(p, false);
  CHECK(t && t->ndim == 1 && t->shape[0] == 5 && t->dtype == EM_U16);
  if (t) {
    const uint16_t *d = em_data_ptr(t);
    CHECK(d[0] == 1 && d[2] == 65535 && d[4] == 8);
    em_tensor_release(t);
  }
  w = em_npy_writer_open(tmp_path("gone.npy"), EM_I32);
  em_npy_writer_abort(w);
  CHECK(access(tmp_path("gone.npy"), F_OK) != 0);
  unlink(p);
}

int main(void) {
  if (tmpdir_create("ember_tok_")) return 2;
  RUN(trains_encodes_and_decodes);
  RUN(refuses_bad_options);
  RUN(npy_writer_streams_a_1d_array);
  int leftovers = clear_dir();
  rmdir(tmpdir);
  CHECK(leftovers == 0);
  TEST_MAIN_END();
}
