/* ckf_index.h - the CKF-backed index mode: one CKF lane per rank, fed by RouterEvents,
 * answering find_matches like the radix index (spec/ckf.md §1, §2, §7, §8; index.md §3).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design. Ranks (worker_id, dp_rank) are bound to lanes of GROUPS of up to 16 lanes; a group is
 * a stack of transposed tables ("levels") that all its lanes share. A group starts with one lane
 * and doubles its lanes (copying every column) when a rank needs one, up to lanes_per_table, so
 * a model with few ranks pays only for its ranks:
 *
 *   group 0: ranks (1,0) (2,0) ... (16,0)        group 1: ranks 17.. (more than 16 ranks)
 *   ┌ level 0: kvr_ckf_table, B0 buckets ┐       ┌ level 0 ┐
 *   └ level 1: B1 buckets (top-up)       ┘       └─────────┘
 *
 *   probe(pos) = OR over levels of table_probe(level, seq[pos])  -> lane mask
 *   find_matches(locals) = chain(locals) -> per group: prefix search (gallop + binary +
 *                          verification window W) -> kvr_match for every lane with depth > 0
 *
 * Sizing and growth (a documented policy; the addressing of every level is exactly ckf.md §3).
 * cap(B) = the lane fingerprints a level of B buckets takes: ceil(4 × B × max_load_pct / 100).
 * layout(n) = the group's table sizes for n blocks per lane:
 *   KVR_CKF_SIZING_COMPACT (default), max_levels 2: B0 = the largest power of two with
 *     cap(B0) <= n, B1 = the smallest power of two with cap(B1) >= n - cap(B0) (no level 1 if
 *     nothing is left): the total overshoots only by a power-of-two rounding of the remainder
 *     (2.2-3 bytes per block once full);
 *   COMPACT with max_levels 1: one level, the smallest power of two with cap(B) >= n;
 *   KVR_CKF_SIZING_GEN_A: one level of kvr_ckf_buckets_for(n) (ckf.md §5 gen A: <= 80% load,
 *     2.5-5 bytes per block, the fewest false positives).
 * A group starts with level 0 of layout(expected_blocks_per_rank). An insertion tries the
 * levels in order, skipping those where the lane holds cap(B) already, and takes the first that
 * accepts it (kick/rollback). When none does, the group GROWS to layout(largest lane + 1),
 * enlarged until it holds more than before: a level whose size is unchanged is kept, every other
 * one is a new table into which its fingerprints are re-inserted from the exact side (own holds
 * every canonical hash and its level). Keeping level 0 means only level 1 is rebuilt; a new B0
 * rebuilds the group. Each rebuild at least doubles what it rebuilds, so the work is amortised
 * O(1) per block, but one rebuild is O(fingerprints of the group) under the writer's lock:
 * size E from the real per-rank block count to avoid them. A rebuild is all or nothing (on
 * ENOMEM the old tables stay; if re-insertion finds no room the next larger layout is tried);
 * past that the block is a capacity OMISSION (counted; a possible undercount, like any CKF
 * omission). A removal goes to the level recorded for that hash. Levels are never shrunk.
 * Every level adds its own false-positive rate (a probe ORs the levels): see
 * kvr_ckf_index_rank_fpr.
 *
 * Exact side (per rank, not part of the compact index; reported as exact_bytes):
 *   own:  canonical seq -> (refcount << 8 | level)     fingerprint inserted on 0 -> 1, removed on
 *                                                      1 -> 0; unknown removals are no-ops
 *   ext:  engine hash -> canonical seq                 translate mode only (ckf.md §2)
 * Canonical mode (translate = 0): block_hash IS the Dynamo sequence hash (Dynamo-hashing engines,
 * op streams); parent_hash is not needed. Translate mode (translate = 1, for vLLM/SGLang native
 * hashes): seq = chain(parent's canonical seq, tokens_hash) with the parent resolved through the
 * rank's ext map (unknown parent: ParentBlockNotFound, whole event skipped); removals translate
 * through the same map. A capacity-omitted block records neither ownership nor lineage.
 *
 * Results: scores in blocks; lanes of score 0 absent; never BELOW the exact prefix of what the
 * rank holds (barring omissions); may be above it through a false positive or a hole deeper than
 * the window. `cleared` clears exactly the emitting rank (index.md §2.1). early_exit is ignored
 * (the CKF computes every lane at once).
 *
 * Thread-safety: like kvr_radix_t: one thread at a time, or under kvr_index's rwlock (reads:
 * find_matches, stats; writes: everything else). find_matches never uses the index allocator.
 */
#ifndef KVR_CKF_INDEX_H
#define KVR_CKF_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/alloc.h"
#include "kvr/event.h"
#include "kvr/match.h"

typedef struct kvr_ckf_index kvr_ckf_index_t;

#define KVR_CKF_INDEX_LEVELS_MAX 2u

enum kvr_ckf_sizing {
    KVR_CKF_SIZING_COMPACT = 0, /* level 0 rounded down, top-up levels (memory first) */
    KVR_CKF_SIZING_GEN_A = 1,   /* level 0 = ckf.md §5 gen A (false-positive rate first) */
};

struct kvr_ckf_index_config {
    uint64_t expected_blocks_per_rank; /* sizes level 0 (gen A); > 0; default 16384 */
    uint64_t seed;                     /* addressing seed; default KVR_CKF_DEFAULT_SEED */
    uint32_t max_kicks;                /* 1..4096; default 500 */
    uint32_t window;                   /* verification window 1..8; default 8 */
    uint32_t lanes_per_table;          /* ranks per group, 1..16; default 16 */
    uint32_t max_load_pct;             /* per-level lane fill before moving on, 50..100; 90 */
    uint32_t max_levels;               /* tables per group, 1..2; default 2 (see the layouts) */
    int sizing;                        /* enum kvr_ckf_sizing; default KVR_CKF_SIZING_COMPACT */
    int translate;                     /* 0 canonical block_hash; 1 translate engine hashes */
};

struct kvr_ckf_index_stats {
    uint64_t ranks;        /* registered ranks */
    uint64_t groups;       /* 16-lane groups */
    uint64_t levels;       /* tables over all groups */
    uint64_t blocks;       /* (rank, canonical hash) ownership entries */
    uint64_t fingerprints; /* fingerprints stored (= blocks in canonical mode) */
    uint64_t slots;        /* fingerprint slots of all lanes of all tables */
    size_t filter_bytes;   /* bucket words of every table: the compact index */
    size_t exact_bytes;    /* ownership and translation maps, bookkeeping (kvr_alloc) */
    uint64_t growths;      /* layout changes after level 0 (a level added or rebuilt larger) */
    uint64_t rebuilds;     /* growths that re-inserted fingerprints from the exact side */
    uint64_t moved;        /* fingerprints re-inserted by rebuilds */
    uint64_t omissions;    /* capacity omissions */
    uint64_t duplicates;   /* stores of a hash the rank already held */
    uint64_t err_parent;   /* ParentBlockNotFound (translate mode) */
    uint64_t err_block;    /* BlockNotFound: removals of hashes the rank does not hold */
    uint64_t invariant;    /* fingerprints missing on 1 -> 0 (IndexerInvariantViolation) */
    uint64_t err_nomem;    /* events cut short by an allocation failure (index consistent) */
};

/* Fills the defaults listed above. */
void kvr_ckf_index_config_init(struct kvr_ckf_index_config *cfg);

/* Creates an empty index (cfg may be NULL for defaults). *out owned (kvr_ckf_index_free).
 * KVR_OK, KVR_EINVAL (bad config) or KVR_ENOMEM. */
int kvr_ckf_index_new(const struct kvr_ckf_index_config *cfg, kvr_ckf_index_t **out);
void kvr_ckf_index_free(kvr_ckf_index_t *idx);
/* The exact side's allocator (failure injection, bytes). Borrowed. */
kvr_alloc_t *kvr_ckf_index_allocator(kvr_ckf_index_t *idx);

/* Stores a chain of n blocks (borrowed) for a rank (registered on first store). Canonical mode:
 * each block_hash is inserted independently (parent unused). Translate mode: parent (NULL = root)
 * must be known to the rank. Returns KVR_OK or the first error: KVR_EPARENT (nothing applied),
 * KVR_ECAPACITY (omission; siblings applied), KVR_ENOMEM (that block and, in translate mode, the
 * rest of the chain skipped; the index consistent), KVR_EINVAL (n == 0). */
int kvr_ckf_index_store(kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank,
                        const uint64_t *parent, const struct kvr_block *blocks, size_t n);
/* Removes n external hashes (borrowed, any order). Unknown ones are no-ops counted in
 * *not_found (may be NULL). KVR_OK, KVR_ENOBLOCK (some not found) or KVR_ECORRUPT (invariant). */
int kvr_ckf_index_remove(kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank,
                         const uint64_t *hashes, size_t n, size_t *not_found);
/* `cleared`: drops all the rank holds; it stays registered. KVR_OK (also for unknown ranks). */
int kvr_ckf_index_clear_rank(kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank);
/* Drops and unregisters one rank / every rank of a worker; its lane is zeroed and reusable.
 * KVR_ENOTFOUND if unknown. */
int kvr_ckf_index_remove_rank(kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank);
int kvr_ckf_index_remove_worker(kvr_ckf_index_t *idx, uint64_t worker_id);

/* Applies one event (stored / removed / cleared); the tier is not checked here. Returns the
 * event's code (as store / remove / clear_rank; KVR_EINVAL for another kind). */
int kvr_ckf_index_apply(kvr_ckf_index_t *idx, const struct kvr_event *ev);
/* As kvr_ckf_index_apply; a removal also reports its unknown hashes in *not_found (0 for other
 * kinds; may be NULL), so callers can count BlockNotFound per hash. */
int kvr_ckf_index_apply_counted(kvr_ckf_index_t *idx, const struct kvr_event *ev,
                                size_t *not_found);

/* Prefix overlap of n local hashes (borrowed): chains them into sequence hashes and searches
 * every group. Writes up to cap results and *n_out = ranks scored; KVR_ERANGE if cap was too
 * small (out holds the first cap), KVR_ENOMEM if the scratch for a query longer than 512 blocks
 * could not be allocated. Read-only on the index. */
int kvr_ckf_index_find_matches(const kvr_ckf_index_t *idx, const uint64_t *locals, size_t n,
                               unsigned flags, struct kvr_match *out, size_t cap, size_t *n_out);

/* As find_matches for already chained sequence hashes. */
int kvr_ckf_index_find_matches_seq(const kvr_ckf_index_t *idx, const uint64_t *seq, size_t n,
                                   struct kvr_match *out, size_t cap, size_t *n_out);

/* 1 if the rank owns canonical hash seq (exact side), else 0. */
int kvr_ckf_index_owns(const kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank,
                       uint64_t seq);

/* The expected number of false hits of one probe of a hash the rank does not hold: the
 * occupied slots of the two candidate buckets summed over the group's levels, over 65535
 * fingerprint values = sum over levels of 8 x load / 65535 (spec/ckf.md §11). A query
 * overcounts a rank mainly through a false hit at the rank's first missing position, so this
 * is the rank's per-query overcount probability to first order. KVR_ENOTFOUND if unknown. */
int kvr_ckf_index_rank_fpr(const kvr_ckf_index_t *idx, uint64_t worker_id, uint32_t dp_rank,
                           double *fpr);

/* (rank, canonical hash) ownership entries, as kvr_ckf_index_stats.blocks, in O(1). */
uint64_t kvr_ckf_index_blocks(const kvr_ckf_index_t *idx);

void kvr_ckf_index_stats(const kvr_ckf_index_t *idx, struct kvr_ckf_index_stats *out);

#endif
