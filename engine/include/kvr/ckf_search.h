/* ckf_search.h - the multi-lane CKF table and the prefix search (spec/ckf.md §4, §8).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design. A consumer holds D <= 16 lanes of identical shape (bucket count, seed). They are stored
 * TRANSPOSED, bucket-major and lane-minor, so one probe reads two contiguous rows:
 *
 *     row of bucket i (D × 8 bytes, 64-byte aligned table):
 *     +---------+---------+-----+-----------+
 *     | lane 0  | lane 1  | ... | lane D-1  |   word[i * D + l], relaxed atomic u64
 *     +---------+---------+-----+-----------+
 *
 *     probe(a, b, fp) = { l : lane l holds fp in word[a*D+l] or word[b*D+l] }   (u16 lane mask)
 *
 * Prefix search (find_prefix_depths): given a request's sequence hashes seq[0..n), the depth of
 * lane l is the number of leading positions it (probably) holds. A miss is authoritative, a hit
 * may be a false positive. The search costs O(log n + W) probes for all lanes together:
 *
 *   1. active = initial & probe(0)                       (nothing: all depths 0)
 *   2. gallop at 1, 2, 4, 8, ...: hits raise lower[l], the first miss sets upper[l]
 *   3. batched binary search on (lower, upper): lanes that share a midpoint share its probe
 *   4. depth[l] = upper[l]; then VERIFY each lane's own window [depth - W, depth) ascending; a
 *      position tests only lanes whose own window contains it; the first miss lowers the depth
 *      to that position.
 *
 *   lane 0:  ████████████████████▒▒▒▒        gallop 1,2,4,8,16 hit, binary search -> 24
 *   lane 1:  █████·                          miss at 8, binary 4 hit, 6 miss, 5 miss -> 5
 *            0    5   8         16    24     verify: lane 0 tests [16,24), lane 1 tests [0,5)
 *
 * A linear reference (AND the probes position by position) exists for tests and benches.
 *
 * Thread-safety: the table's words are relaxed atomics; one writer per lane may update while any
 * number of readers probe and search (they may see a mix of old and new buckets; ckf.md §9 says
 * that is by design). kvr_ckf_table_new/free are not concurrent with anything.
 */
#ifndef KVR_CKF_SEARCH_H
#define KVR_CKF_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/alloc.h"
#include "kvr/ckf.h"

typedef struct kvr_ckf_table kvr_ckf_table_t;

/* Creates a zeroed table of `lanes` (1..16) lanes of num_buckets (power of two >= 2) buckets.
 * *out owned (free with kvr_ckf_table_free). KVR_OK, KVR_EINVAL or KVR_ENOMEM. */
int kvr_ckf_table_new(uint32_t lanes, uint64_t num_buckets, uint64_t seed, kvr_ckf_table_t **out);
void kvr_ckf_table_free(kvr_ckf_table_t *t);
/* The table's allocator (bytes). Borrowed. */
kvr_alloc_t *kvr_ckf_table_allocator(kvr_ckf_table_t *t);

uint32_t kvr_ckf_table_lanes(const kvr_ckf_table_t *t);
uint64_t kvr_ckf_table_buckets(const kvr_ckf_table_t *t);
uint64_t kvr_ckf_table_seed(const kvr_ckf_table_t *t);
/* Bytes of bucket words: buckets × lanes × 8. */
size_t kvr_ckf_table_words_bytes(const kvr_ckf_table_t *t);

/* A view of lane `lane` (< lanes), valid until kvr_ckf_table_free. */
void kvr_ckf_table_view(const kvr_ckf_table_t *t, uint32_t lane, struct kvr_ckf_view *out);

/* Lane mask of the lanes holding fp in bucket a or b (both < buckets). Prefetches both rows. */
uint16_t kvr_ckf_table_probe(const kvr_ckf_table_t *t, uint64_t a, uint64_t b, uint16_t fp);
/* probe() for a precomputed key. */
uint16_t kvr_ckf_table_probe_key(const kvr_ckf_table_t *t, const struct kvr_ckf_key *key);

/* ==== prefix search =========================================================================== */

/* probe(ctx, pos) -> lane mask of the lanes (probably) holding position pos. */
typedef uint16_t (*kvr_ckf_probe_fn)(void *ctx, size_t pos);

/* The search of ckf.md §8 over n positions (n may be 0) with an initial lane mask and window W
 * (1..8; 0 means 8). Writes depths[0..16) (0 for lanes never active). Pure: calls probe only. */
void kvr_ckf_prefix_search(size_t n, uint16_t initial, unsigned window, kvr_ckf_probe_fn probe,
                           void *ctx, uint32_t depths[KVR_CKF_LANES_MAX]);

/* Linear reference: mask = initial; for i in 0..n: mask &= probe(i); a lane leaving at i gets
 * depth i; survivors get n. */
void kvr_ckf_prefix_linear(size_t n, uint16_t initial, kvr_ckf_probe_fn probe, void *ctx,
                           uint32_t depths[KVR_CKF_LANES_MAX]);

/* Both searches on a table for sequence hashes seq[0..n) (borrowed). `lanes` masks the lanes
 * to consider. Read-only; safe concurrently with lane writers. */
void kvr_ckf_table_search(const kvr_ckf_table_t *t, const uint64_t *seq, size_t n, uint16_t lanes,
                          unsigned window, uint32_t depths[KVR_CKF_LANES_MAX]);
void kvr_ckf_table_search_linear(const kvr_ckf_table_t *t, const uint64_t *seq, size_t n,
                                 uint16_t lanes, uint32_t depths[KVR_CKF_LANES_MAX]);

#endif
