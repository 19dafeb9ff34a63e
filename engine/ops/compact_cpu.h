/* Stream compaction on the CPU (compact_cpu.c): masked_select's values and
 * nonzero's coordinates from a contiguous "keep" array (a bool mask, or x
 * itself), in parallel, the same result at any thread count. */
#ifndef EMBER_COMPACT_CPU_H
#define EMBER_COMPACT_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The number of kept elements among n elements of kes bytes (1, 2, 4 or 8;
 * is_float: the sign bit does not count), and in *offs (malloc'd, the
 * caller frees it) each block's output offset for the two calls below; -1
 * when out of memory. */
int64_t em_cpu_compact_count(const void *keep, size_t kes, bool is_float, int64_t n, int64_t **offs);

/* out (count elements of es bytes) = the elements of x (n of es bytes) where the bool mask is true
 * (offs: em_cpu_compact_count's of the mask). */
void em_cpu_compact_select(const uint8_t *mask, int64_t n, const int64_t *offs, const void *x, size_t es,
                           void *out);

/* out (count x nd) = the coordinates in (nd, shape) of the kept elements, in order. */
void em_cpu_compact_coords(const void *keep, size_t kes, bool is_float, int64_t n, const int64_t *offs, int nd,
                           const int64_t *shape, int64_t *out);

#endif
