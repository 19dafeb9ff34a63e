/* Byte-level BPE tokenizer (GPT-2 semantics): text is split at special tokens,
 * each piece is cut into pre-tokens by a regular expression (GPT-2's by
 * default, through PCRE2), and each pre-token's bytes are merged pair by pair
 * in the order the merges were learnt. Ids name byte strings; a trained
 * tokenizer has ids 0..255 for the bytes, then one id per merge, then the
 * special tokens. Loaded GPT-2 files keep their own ids.
 *
 * Ownership: every em_tokenizer * is the caller's (em_tokenizer_free); output
 * arrays are malloc'd and the caller's to free. Errors follow the engine's
 * contract: NULL or a negative status, with the message naming the function
 * ("tokenizer.train: ...") and, for files, the file, the line or key and what
 * was expected. A tokenizer may be used by one thread at a time (encode keeps
 * a cache); training and encode_file run their own worker threads inside. */
#ifndef EMBER_TOKENIZER_H
#define EMBER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_tokenizer em_tokenizer;

/* GPT-2's pre-tokenisation pattern (PCRE2 syntax, matched in UTF + UCP mode). */
#define EM_GPT2_PATTERN "'(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef struct {
  int vocab_size;                  /* ids in all: 256 bytes + merges + special tokens */
  int n_special;
  const char *const *special;      /* NUL-terminated, valid UTF-8, distinct, non-empty */
  int threads;                     /* pre-tokenisation workers; 0: one per online core */
  const char *pattern;             /* NULL: EM_GPT2_PATTERN */
} em_bpe_train_options;

/* Train on n documents held in memory (doc i: docs[i], lens[i] bytes). */
em_tokenizer *em_tokenizer_train(int n, const char *const *docs, const size_t *lens,
                                 const em_bpe_train_options *o);
/* Train on n files, each read whole and treated as one document. */
em_tokenizer *em_tokenizer_train_files(int n, const char *const *paths, const em_bpe_train_options *o);
/* Release a tokenizer (NULL is fine). */
void em_tokenizer_free(em_tokenizer *t);

/* Number of ids (the largest id + 1). */
int em_tokenizer_vocab_size(const em_tokenizer *t);
/* Number of merges (ranks 0..n-1). */
int em_tokenizer_n_merges(const em_tokenizer *t);
/* Merge of rank r: *a, *b are the ids merged, *out the id made. 0 or -1. */
int em_tokenizer_merge(const em_tokenizer *t, int r, int32_t *a, int32_t *b, int32_t *out);
/* Number of special tokens; their ids in order of em_tokenizer_special(t, i). */
int em_tokenizer_n_special(const em_tokenizer *t);
int32_t em_tokenizer_special(const em_tokenizer *t, int i);
/* The bytes of id (borrowed, len in *len), or NULL with the error set. */
const char *em_tokenizer_token(const em_tokenizer *t, int32_t id, size_t *len);
/* The id whose bytes are s[0..len), or -1 (no error set: absence is an answer). */
int32_t em_tokenizer_id(const em_tokenizer *t, const char *s, size_t len);
/* Whether id is a special token. */
bool em_tokenizer_is_special(const em_tokenizer *t, int32_t id);
/* The pre-tokenisation pattern (borrowed). */
const char *em_tokenizer_pattern(const em_tokenizer *t);

/* Encode len bytes: count of ids (>= 0, *ids malloc'd, NULL when 0) or a negative status. */
int64_t em_tokenizer_encode(em_tokenizer *t, const char *text, size_t len, int32_t **ids);
/* Bound the pre-token -> ids cache (entries; 0 turns it off; default 65536); returns the previous bound. */
size_t em_tokenizer_set_cache(em_tokenizer *t, size_t max_entries);
/* Decode n ids to bytes: length (*out malloc'd, NUL-terminated) or a negative status. */
int64_t em_tokenizer_decode(const em_tokenizer *t, const int32_t *ids, size_t n, char **out);
/* Python's bytes.decode("utf-8", errors="replace"): each maximal invalid subpart
 * becomes U+FFFD. Returns a malloc'd NUL-terminated string (length in *out_len) or NULL (OOM). */
char *em_utf8_replace(const char *s, size_t len, size_t *out_len);

/* Split text into pre-tokens with pattern (NULL: GPT-2's), special tokens
 * first (each special becomes its own piece). Calls fn(piece, len, is_special, u)
 * in order; the pieces tile the text. 0 or a negative status. */
int em_tokenizer_pretokenize(const char *pattern, int n_special, const char *const *special,
                             const char *text, size_t len,
                             void (*fn)(const char *piece, size_t n, bool is_special, void *u), void *u);

typedef struct {
  size_t chunk_bytes;              /* bytes read per worker per round; 0: 4 MiB */
  int threads;                     /* encoders; 0: one per online core */
  /* Called after each round; a non-zero return stops with an error. May be NULL. */
  int (*progress)(void *u, uint64_t bytes_done, uint64_t bytes_total, int64_t tokens);
  void *progress_u;
} em_bpe_file_options;

/* Stream in_path through the encoder into a 1-D .npy of uint16 ids (vocab <=
 * 65536) or int32 ids, cutting the text only at special tokens or where a
 * non-space byte meets a space (so the ids equal encoding the whole text).
 * Returns the token count or a negative status. o may be NULL. */
int64_t em_tokenizer_encode_file(em_tokenizer *t, const char *in_path, const char *out_path,
                                 const em_bpe_file_options *o);

/* Ember's JSON format (pattern, vocab, merges, special tokens). Atomic. */
int em_tokenizer_save(const em_tokenizer *t, const char *path);
em_tokenizer *em_tokenizer_load(const char *path);
/* GPT-2's vocab.json + merges.txt (bytes through GPT-2's bytes_to_unicode). */
int em_tokenizer_save_gpt2(const em_tokenizer *t, const char *vocab_path, const char *merges_path);
em_tokenizer *em_tokenizer_load_gpt2(const char *vocab_path, const char *merges_path);

#ifdef __cplusplus
}
#endif
#endif
