/* u64map.h - internal open-addressing map from u64 keys to u64 values (load tracking).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design: linear probing over a power-of-two table of (key, value) pairs, at most 3/4 full,
 * backward-shift deletion (no tombstones, so lookups never degrade after churn). The key 0 marks
 * an empty slot; a real key 0 is kept out of band (has_zero). Keys are mixed with the SplitMix64
 * finalizer, so sequential ids spread as well as random hashes do.
 *
 *   keys[] : k0 . . k3 k4 . k6 ...      values[] parallel; cap = 2^b, n <= 3/4 cap
 *
 * All memory goes through the kvr_alloc_t given at init. Thread-safety: none (callers lock).
 * Not part of the public API (engine/src only).
 */
#ifndef KVR_U64MAP_H
#define KVR_U64MAP_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/alloc.h"

struct kvr_u64map {
    uint64_t *keys;    /* cap slots; 0 = empty */
    uint64_t *vals;    /* cap slots */
    size_t cap;        /* power of two, or 0 before the first insert */
    size_t n;          /* keys stored in the table (excluding key 0) */
    int has_zero;      /* key 0 present */
    uint64_t zero_val; /* its value */
    kvr_alloc_t *a;    /* borrowed allocator */
};

/* Initialises an empty map (no allocation). a is borrowed and must outlive the map. */
void kvr_u64map_init(struct kvr_u64map *m, kvr_alloc_t *a);
/* Frees the table; the map is empty and reusable afterwards. */
void kvr_u64map_destroy(struct kvr_u64map *m);

/* Number of keys. */
static inline size_t kvr_u64map_size(const struct kvr_u64map *m)
{
    return m->n + (m->has_zero ? 1u : 0u);
}

/* Returns a pointer to the value of key (valid until the next insert or delete), or NULL. */
uint64_t *kvr_u64map_get(const struct kvr_u64map *m, uint64_t key);

/* Inserts or overwrites key -> val. KVR_OK or KVR_ENOMEM (map unchanged). */
int kvr_u64map_put(struct kvr_u64map *m, uint64_t key, uint64_t val);

/* Makes room for `extra` more keys without rehashing. KVR_OK or KVR_ENOMEM (map unchanged). */
int kvr_u64map_reserve(struct kvr_u64map *m, size_t extra);

/* Deletes key; returns 1 if it was present, else 0. Never allocates. */
int kvr_u64map_del(struct kvr_u64map *m, uint64_t key);

/* Iteration: *pos starts at 0; returns 1 and the next (key, value), or 0 at the end. The map must
 * not change during an iteration (delete-while-iterating: collect keys first). */
int kvr_u64map_next(const struct kvr_u64map *m, size_t *pos, uint64_t *key, uint64_t *val);

#endif
