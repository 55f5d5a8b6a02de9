/* u64tab.h - internal open-addressing table from u64 keys to u32 values (LRU index, seen sets).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design: linear probing over a power-of-two array of (key, value + 1) slots, at most 3/4 full;
 * a stored value of 0 marks an empty slot, so every u64 key (0 included) is a valid key and
 * values are limited to 0 .. UINT32_MAX - 1. Deletion shifts the following run back (no
 * tombstones: lookups never degrade after churn). Keys are mixed with the SplitMix64 finalizer,
 * so small sequential ids spread as well as hashes do.
 *
 *   slots[]:  (k0,v0+1) (0,0) (k2,v2+1) (k3,v3+1) (0,0) ...     cap = 2^b, n <= 3/4 cap
 *
 * Not thread-safe. Memory: malloc/realloc (the simulator is a tool, not the engine).
 */
#ifndef KVR_SIM_U64TAB_H
#define KVR_SIM_U64TAB_H

#include <stddef.h>
#include <stdint.h>

struct kvr_sim_u64slot {
    uint64_t key;  /* valid iff val1 != 0 */
    uint32_t val1; /* value + 1; 0 = empty */
    uint32_t pad_; /* zero */
};

struct kvr_sim_u64tab {
    struct kvr_sim_u64slot *slots; /* cap slots (owned) */
    size_t cap;                    /* power of two, 0 before the first insert */
    size_t n;                      /* keys stored */
};

/* Initialises an empty table (no allocation). */
void kvr_sim_u64tab_init(struct kvr_sim_u64tab *t);
/* Frees the slots; the table is empty and reusable. */
void kvr_sim_u64tab_free(struct kvr_sim_u64tab *t);
/* Drops every key, keeps the slots. */
void kvr_sim_u64tab_clear(struct kvr_sim_u64tab *t);

/* Returns 1 and sets *val (may be NULL) when key is present, else 0. */
int kvr_sim_u64tab_get(const struct kvr_sim_u64tab *t, uint64_t key, uint32_t *val);

/* Inserts or overwrites key -> val (val < UINT32_MAX). KVR_OK, KVR_EINVAL (val too large) or
 * KVR_ENOMEM (the table is unchanged). */
int kvr_sim_u64tab_put(struct kvr_sim_u64tab *t, uint64_t key, uint32_t val);

/* Removes key; returns 1 if it was present, else 0. */
int kvr_sim_u64tab_del(struct kvr_sim_u64tab *t, uint64_t key);

#endif
