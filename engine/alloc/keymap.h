/* A small hash map from a key of four 64-bit words to an int64, for the
 * snapshot writers: interned-string pointers to string-table indices, event
 * contexts to pickle memo ids, addresses to open allocations. Open
 * addressing, grows at 1/2 load, no deletion (writers overwrite values).
 * Not public API. */
#ifndef EMBER_KEYMAP_H
#define EMBER_KEYMAP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint64_t k[4]; int64_t v; bool used; } em_km_slot;
typedef struct { em_km_slot *slots; int64_t cap, n; } em_keymap;

static inline uint64_t em_km_hash(const uint64_t k[4]) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 4; i++) { h ^= k[i]; h *= 0xff51afd7ed558ccdull; h ^= h >> 32; }
  return h;
}

/* The value slot of key, inserted with value `def` when absent (*found
 * false); NULL when out of memory. */
static inline int64_t *em_km_get(em_keymap *m, const uint64_t k[4], int64_t def, bool *found) {
  if ((m->n + 1) * 2 > m->cap) {
    int64_t cap = m->cap ? m->cap * 2 : 256;
    em_km_slot *s = (em_km_slot *)calloc((size_t)cap, sizeof *s);
    if (!s) return NULL;
    for (int64_t i = 0; i < m->cap; i++) {
      if (!m->slots[i].used) continue;
      int64_t j = (int64_t)(em_km_hash(m->slots[i].k) & (uint64_t)(cap - 1));
      while (s[j].used) j = (j + 1) & (cap - 1);
      s[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = s;
    m->cap = cap;
  }
  int64_t j = (int64_t)(em_km_hash(k) & (uint64_t)(m->cap - 1));
  for (; m->slots[j].used; j = (j + 1) & (m->cap - 1))
    if (!memcmp(m->slots[j].k, k, sizeof m->slots[j].k)) { *found = true; return &m->slots[j].v; }
  memcpy(m->slots[j].k, k, sizeof m->slots[j].k);
  m->slots[j].v = def;
  m->slots[j].used = true;
  m->n++;
  *found = false;
  return &m->slots[j].v;
}

static inline void em_km_free(em_keymap *m) { free(m->slots); m->slots = NULL; m->cap = m->n = 0; }

#endif
