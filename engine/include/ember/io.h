/* Files: safetensors (engine/io/safetensors.c) and .npy (engine/io/npy.c).
 * Readers validate everything before trusting it: a corrupt or hostile file
 * is an error with a message naming the file and the problem, never a crash.
 * Writers write to PATH.tmp.<pid>, fsync, then rename: a crash never leaves a
 * half-written file under the real name. */
#ifndef EMBER_IO_H
#define EMBER_IO_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Header of a safetensors file, parsed and validated. */
typedef struct {
  char *name;
  em_dtype dtype;
  int ndim;
  int64_t shape[EM_MAX_DIMS];
  uint64_t begin, end;          /* byte offsets into the data section */
} em_st_entry;

typedef struct {
  int n;
  em_st_entry *entries;         /* in file (offset) order */
  int n_meta;
  char **meta_keys, **meta_values;  /* __metadata__ (string -> string) */
  uint64_t header_len;          /* the JSON header's length in bytes */
} em_st_header;

/* Parse and validate a header held in memory: buf holds the whole file (len
 * bytes); path only names it in messages. Checks: length prefix within bounds
 * (header <= 100 MB and inside the file), JSON well formed (strict: UTF-8, no
 * duplicate keys, nesting <= 16, only whitespace after it), known dtypes,
 * shapes of <= 8 non-negative integers, offsets inside the data section,
 * end-begin == numel * dtype size, and the tensors tiling the data section
 * exactly (no overlap, hole or trailing bytes, as HF's reader requires).
 * Errors read "load: corrupt safetensors file 'PATH': <problem>". On success
 * out->entries are sorted by offset; free with em_st_header_free. */
int em_st_parse(const uint8_t *buf, uint64_t len, const char *path, em_st_header *out);
void em_st_header_free(em_st_header *h);

/* Load every tensor of a file (CPU, f32 etc. as stored). Returns the count
 * (or a negative status with the error set; outputs are then NULL / 0);
 * *names / *tensors are malloc'd arrays of n entries in file-offset order the
 * caller frees (free each name, release each tensor, free both arrays). The
 * metadata outputs may all be NULL (metadata discarded); otherwise free each
 * key and value and both arrays (NULL when the file has none). */
int em_st_load(const char *path, char ***names, em_tensor ***tensors,
               int *n_meta, char ***meta_keys, char ***meta_values);
/* Save n tensors (any device, any strides; copied to a contiguous host
 * buffer one at a time) in the order given, with optional metadata (string ->
 * string; NULL arrays when n_meta is 0). The header is padded with spaces to a
 * multiple of 8 as HF's writer does. Names must be unique, valid UTF-8 and not
 * "__metadata__". Atomic. Returns 0 or a negative status ("save: ..."). */
int em_st_save(const char *path, int n, const char *const *names, em_tensor *const *tensors,
               int n_meta, const char *const *meta_keys, const char *const *meta_values);

/* .npy v1/v2/v3: little-endian <f4 <f8 <f2 <i4 <i8 <u2 |u1 |b1 (also <u1),
 * C order (fortran_order only for 0/1-dim arrays, where it is the same).
 * mmap: map the file read-only and return a tensor whose storage is the
 * mapping (EM_STORAGE_READONLY; unmapped when the last view is released);
 * the data must be aligned to the dtype size, as numpy's files are.
 * Save writes numpy.save's v1.0 header byte for byte (64-byte aligned);
 * bf16 has no .npy dtype and is refused. Errors start "load:" / "save:". */
em_tensor *em_npy_load(const char *path, bool mmap);
int em_npy_save(const char *path, em_tensor *t);

/* A 1-D .npy written as it grows (token ids of a corpus larger than memory):
 * open writes a header with room for any length, append adds elements, close
 * writes the final length into the header and renames atomically; abort (or
 * any failure) leaves no file. Same header bytes as em_npy_save. */
typedef struct em_npy_writer em_npy_writer;
/* Start PATH.tmp.<pid> for a 1-D array of dtype. NULL + error ("save: ..."). */
em_npy_writer *em_npy_writer_open(const char *path, em_dtype dtype);
/* Append n elements (n * dtype size bytes at data). 0 or a negative status (the writer is then aborted). */
int em_npy_writer_append(em_npy_writer *w, const void *data, int64_t n);
/* Write the length, fsync and rename over PATH; frees w. 0 or a negative status. */
int em_npy_writer_close(em_npy_writer *w);
/* Remove the temporary; frees w (NULL is fine). */
void em_npy_writer_abort(em_npy_writer *w);

#ifdef __cplusplus
}
#endif
#endif
