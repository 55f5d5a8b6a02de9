/* ckf_producer.h - a pool's exact CKF producer: ownership, refcounts, publication
 * (spec/ckf.md §7, §9).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design. A pool (a site, a replica set, ...) has members = ranks (worker_id, dp_rank). The
 * producer keeps the EXACT truth and derives one single-lane filter from it:
 *
 *     member (7,0) ─┐  owned = {h1, h2}          refcount[h1] = 2 ──▶ one fingerprint of h1
 *     member (8,0) ─┘  owned = {h1}              refcount[h2] = 1 ──▶ one fingerprint of h2
 *
 *   store(m, h):  (m, h) already owned → no-op. Else refcount 0 → 1 inserts ONE fingerprint;
 *                 n → n+1 changes nothing in the filter.
 *   remove(m, h): (m, h) not owned → idempotent no-op (counted as unknown). Else n → n-1; 1 → 0
 *                 removes one fingerprint BY FULL HASH (never by fingerprint alone).
 *   capacity exhaustion on 0 → 1 is an OMISSION: no ownership edge, no refcount, no dirty
 *                 bucket, the table byte-identical (a stable false negative, counted); a later
 *                 removal of it is an unknown no-op; a later store may succeed.
 *   clear(m):     decrement every hash m owns (fingerprints reaching 0 are removed); m stays.
 *   The blocks of one call apply independently; the first error is returned.
 *
 * Keys are canonical sequence hashes (hashing.md §3): feed Dynamo-canonical block_hash values,
 * or translate engine hashes first (kvr/ckf_index.h does that translation for the index mode).
 *
 * Publication. Every bucket a mutation touches is marked dirty (bitmap + list). A BATCH is cut by
 * kvr_ckf_producer_delta(): it encodes the CURRENT (absolute) images of the dirty buckets as a
 * CKF1 delta epoch -> epoch + 1, clears the dirty set and advances the epoch; an empty batch is a
 * valid heartbeat that lets consumers notice a lost final delta. Sequences count batches, never
 * events: call delta() only between complete calls. kvr_ckf_producer_snapshot() encodes the table
 * tagged with the current epoch; it is a barrier and refuses (KVR_EBUSY) while a batch is pending.
 *
 * Memory: the filter counts as the compact index (kvr_ckf_table_bytes); the exact side (member
 * sets, refcounts, dirty tracking) is reported separately (stats.exact_bytes).
 * Thread-safety: none; one writer. Frames it returns are plain bytes for any transport.
 */
#ifndef KVR_CKF_PRODUCER_H
#define KVR_CKF_PRODUCER_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/alloc.h"
#include "kvr/ckf.h"
#include "kvr/event.h"

typedef struct kvr_ckf_producer kvr_ckf_producer_t;

struct kvr_ckf_producer_config {
    struct kvr_ckf_config filter; /* shape, seed, kicks of the published filter */
    uint64_t dc_worker_id;        /* producer identity written into every frame */
};

/* Defaults: kvr_ckf_config_init for the filter, dc_worker_id 0. */
void kvr_ckf_producer_config_init(struct kvr_ckf_producer_config *cfg);

/* Per-call outcome counters (all fields are added to, so one struct can sum several calls). */
struct kvr_ckf_apply_result {
    uint64_t edges_added;   /* (member, hash) ownership edges created */
    uint64_t edges_removed; /* edges dropped */
    uint64_t duplicates;    /* stores of an already-owned (member, hash) */
    uint64_t unknown;       /* removals of a (member, hash) not owned: no-ops */
    uint64_t inserted;      /* fingerprints inserted (refcount 0 -> 1) */
    uint64_t deleted;       /* fingerprints removed (refcount 1 -> 0) */
    uint64_t omitted;       /* capacity omissions */
    uint64_t invariant;     /* 1 -> 0 whose fingerprint was missing (IndexerInvariantViolation) */
};

struct kvr_ckf_producer_stats {
    uint64_t members;   /* registered members */
    uint64_t edges;     /* (member, hash) ownership edges */
    uint64_t distinct;  /* hashes with refcount > 0 = fingerprints in the filter */
    uint64_t omissions; /* capacity omissions so far */
    uint64_t epoch;     /* batches published */
    uint64_t pending;   /* dirty buckets awaiting the next delta */
    uint64_t num_buckets;
    size_t filter_bytes; /* bucket array (the compact index) */
    size_t exact_bytes;  /* everything else the producer holds (kvr_alloc accounting) */
};

/* Creates a producer. *out owned (kvr_ckf_producer_free). KVR_OK, KVR_EINVAL or KVR_ENOMEM. */
int kvr_ckf_producer_new(const struct kvr_ckf_producer_config *cfg, kvr_ckf_producer_t **out);
void kvr_ckf_producer_free(kvr_ckf_producer_t *p);
/* The exact side's allocator (failure injection, bytes). Borrowed. */
kvr_alloc_t *kvr_ckf_producer_allocator(kvr_ckf_producer_t *p);
/* The filter (borrowed; read-only use: views, contains). */
const kvr_ckf_t *kvr_ckf_producer_filter(const kvr_ckf_producer_t *p);

/* Stores n canonical hashes (borrowed) for a member (registered on first use). Each hash applies
 * independently. Returns KVR_OK or the first error: KVR_ECAPACITY (omission), KVR_ENOMEM (that
 * hash skipped, nothing half-applied). res may be NULL. */
int kvr_ckf_producer_store(kvr_ckf_producer_t *p, uint64_t worker_id, uint32_t dp_rank,
                           const uint64_t *hashes, size_t n, struct kvr_ckf_apply_result *res);
/* Removes n hashes of a member; unknown ones are no-ops. Returns KVR_OK, or KVR_ECORRUPT if a
 * fingerprint believed resident was missing (counted; the exact side still drops it). */
int kvr_ckf_producer_remove(kvr_ckf_producer_t *p, uint64_t worker_id, uint32_t dp_rank,
                            const uint64_t *hashes, size_t n, struct kvr_ckf_apply_result *res);
/* Drops everything the member owns; it stays registered. KVR_OK, KVR_ENOTFOUND (unknown member),
 * KVR_ENOMEM (nothing changed) or KVR_ECORRUPT (as remove). */
int kvr_ckf_producer_clear_member(kvr_ckf_producer_t *p, uint64_t worker_id, uint32_t dp_rank,
                                  struct kvr_ckf_apply_result *res);
/* Clears and unregisters every member of a worker. KVR_ENOTFOUND if it has none. */
int kvr_ckf_producer_remove_worker(kvr_ckf_producer_t *p, uint64_t worker_id,
                                   struct kvr_ckf_apply_result *res);

/* Applies a RouterEvent (borrowed) whose block_hash values are canonical sequence hashes: stored
 * → store (parent_hash unused), removed → remove, cleared → clear_member (KVR_OK if the member
 * is unknown). Returns as the call above. */
int kvr_ckf_producer_apply(kvr_ckf_producer_t *p, const struct kvr_event *ev,
                           struct kvr_ckf_apply_result *res);

/* 1 if the member owns hash, else 0. */
int kvr_ckf_producer_owns(const kvr_ckf_producer_t *p, uint64_t worker_id, uint32_t dp_rank,
                          uint64_t hash);
/* Number of members owning hash. */
uint64_t kvr_ckf_producer_refcount(const kvr_ckf_producer_t *p, uint64_t hash);

void kvr_ckf_producer_stats(const kvr_ckf_producer_t *p, struct kvr_ckf_producer_stats *out);

/* ---- publication ---- */

/* Bytes the next delta frame needs. */
size_t kvr_ckf_producer_delta_len(const kvr_ckf_producer_t *p);
/* Cuts the pending batch into a delta frame in out[0..cap): base = epoch, header epoch =
 * epoch + 1; then clears the dirty set and advances the epoch. KVR_OK, KVR_ERANGE (cap too small;
 * nothing changed) or KVR_EINVAL (SequenceExhausted: epoch == UINT64_MAX, or a table too large for
 * u32 bucket indices). */
int kvr_ckf_producer_delta(kvr_ckf_producer_t *p, uint8_t *out, size_t cap, size_t *len);
/* Number of chunks of a snapshot and the length of chunk i. */
uint32_t kvr_ckf_producer_snapshot_chunks(const kvr_ckf_producer_t *p);
size_t kvr_ckf_producer_snapshot_len(const kvr_ckf_producer_t *p, uint32_t chunk);
/* Encodes snapshot chunk i tagged with the current epoch. KVR_OK, KVR_EBUSY (a batch is pending:
 * publish the delta first), KVR_EINVAL (no such chunk) or KVR_ERANGE. Chunks of one snapshot
 * must be taken with no mutation in between. */
int kvr_ckf_producer_snapshot(const kvr_ckf_producer_t *p, uint32_t chunk, uint8_t *out, size_t cap,
                              size_t *len);

#endif
