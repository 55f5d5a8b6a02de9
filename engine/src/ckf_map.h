/* ckf_map.h - internal u64 -> u64 hash map for the CKF's exact side (ownership, refcounts,
 * external-to-canonical translation). Not a public header.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design: open addressing with linear probing and backward-shift deletion (no tombstones), so a
 * long-lived map with churn never degrades. Capacity is a power of two, load <= 3/4. Keys are
 * arbitrary u64 (engine hashes can be small or structured, e.g. i * 100), so slots are chosen
 * by a 64-bit finaliser of the key. Occupancy lives in a separate byte array because every key
 * and value is legal.
 *
 *   slot i:  keys[i] (u64) | vals[i] (u64) | used[i] (u8)        17 bytes per slot
 *
 * Memory goes through the owner's kvr_alloc_t (borrowed; must outlive the map).
 * Thread-safety: none (the owner's writer).
 */
#ifndef KVR_CKF_MAP_H
#define KVR_CKF_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/alloc.h"

struct ckf_map {
    kvr_alloc_t *alloc; /* borrowed */
    uint64_t *keys;
    uint64_t *vals;
    uint8_t *used;
    size_t cap; /* slots (power of two) or 0 */
    size_t n;   /* live entries */
};

/* Initialises an empty map (allocates nothing). */
void ckf_map_init(struct ckf_map *m, kvr_alloc_t *alloc);
/* Frees the arrays; the map is empty and reusable. */
void ckf_map_free(struct ckf_map *m);
/* Drops every entry, keeping capacity. */
void ckf_map_clear(struct ckf_map *m);

/* 1 and *val (may be NULL) if key is present, else 0. */
int ckf_map_get(const struct ckf_map *m, uint64_t key, uint64_t *val);
/* Pointer to the value of key, or NULL (valid until the next put/del). */
uint64_t *ckf_map_ref(const struct ckf_map *m, uint64_t key);
/* Sets key to val (insert or overwrite). KVR_OK or KVR_ENOMEM (map unchanged). */
int ckf_map_put(struct ckf_map *m, uint64_t key, uint64_t val);
/* Ensures room for `extra` more inserts without growing. KVR_OK or KVR_ENOMEM. */
int ckf_map_reserve(struct ckf_map *m, size_t extra);
/* Removes key; returns 1 (and *val, may be NULL) or 0 if absent. */
int ckf_map_del(struct ckf_map *m, uint64_t key, uint64_t *val);

/* Iteration by slot: for (i = 0; ckf_map_next(m, &i, &k, &v); ) { ... } (no mutation inside). */
int ckf_map_next(const struct ckf_map *m, size_t *pos, uint64_t *key, uint64_t *val);
/* The value of the entry the last ckf_map_next(m, &pos, ...) returned, pos as that call left it:
 * an in-place update without a second probe (valid until the next put/del). */
static inline uint64_t *ckf_map_next_val(struct ckf_map *m, size_t pos)
{
    return &m->vals[pos - 1];
}

/* Bytes held by the arrays. */
size_t ckf_map_bytes(const struct ckf_map *m);

#endif
