/* index.h - the shared KV index: thread-safe event application and prefix queries.
 *
 * Design (concurrency):
 *
 *     writer thread(s) ──apply_batch──▶ [ write lock, <= max_hold work units ] ─┐
 *                                        [ release, let waiting readers in   ]  │ repeat
 *     reader threads ──find_matches──▶  [ read lock | walk tree | unlock ]      │
 *     dump ──────────────────────────▶  [ read lock | <= dump_chunk blocks | unlock ] repeat
 *
 * Kinds: RADIX (exact tree), CKF (compact cuckoo-filter lanes, kvr/ckf_index.h), BOTH (both fed
 * by the same events; queries from the tree, lane depths from the CKF on request).
 *
 * One kvr_radix_t (and/or kvr_ckf_index_t) behind a writer-preferring reader-writer spin lock
 * (engine/src/rwlock.h: waiters spin, then yield; a futex sleep per hand-off would cost
 * more than the critical sections). Readers hold the read lock only inside one call
 * (find_matches: a walk of microseconds, never allocating). Writers apply events in bounded
 * holds: the write lock is released after at most `max_hold_blocks` work units (one unit ~ one
 * block stored, one table entry deleted, one table slot scanned, one node freed; kvr/radix.h):
 *   - a store is applied as chained sub-stores that fit the hold;
 *   - a removal, a `cleared`, kvr_index_remove_rank and kvr_index_remove_worker run as bounded
 *     tree jobs (kvr_radix_step), and a subtree unlinked by them is freed in later holds;
 * so no reader waits behind a long write. Between holds the writer lets in the readers that were
 * waiting when it released (not those arriving later; a bounded spin, no yield), then takes the
 * lock back. Events of one rank must be applied in order by one writer at a time (callers shard
 * writers by worker_id); apply calls from several threads are serialised.
 *
 * What a reader concurrent with writes sees: each hold's changes entirely or not at all. An
 * event in progress can be seen partly applied: a store's first sub-stores, some of a removal's
 * or clear's blocks already gone (a rank being cleared may be seen partly cleared). Every such
 * state holds only blocks the rank held before the event or stored by it, so a query may
 * undercount, never overcount (index.md §3, §7).
 *
 * Remaining long steps (not split): growing or shrinking one rank's external-hash table rehashes
 * it whole (O(the rank's blocks), amortised over as many stores/removals); a CKF event is applied
 * whole. Both are charged to the hold, which ends right after.
 *
 * Dumps read the tree in chunks of about `dump_chunk_blocks` emitted blocks, releasing the read
 * lock between chunks, so a writer waiting behind a dump (and, with writer preference, the readers
 * behind it) waits one chunk, not the whole dump. Consistency: kvr_index_dump_ex reports `exact`
 * when no write hold happened between the first and last chunk (the dump is then an exact cut:
 * it replays to identical early_exit = false scores). Otherwise the dump is a fuzzy snapshot
 * (kvr/radix.h "incremental dump"): each event states blocks its rank held at the moment its
 * chunk was read; replaying the dump and then every event applied after the dump began
 * converges to the live index; replaying the dump alone gives blocks each rank held at some
 * point during the dump (it may still show blocks removed while the dump ran).
 *
 * Error accounting: every event error is counted by kind (kvr_index_counters) and returned.
 */
#ifndef KVR_INDEX_H
#define KVR_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/ckf_index.h"
#include "kvr/event.h"
#include "kvr/match.h"
#include "kvr/radix.h"

typedef struct kvr_index kvr_index_t;

enum kvr_index_kind {
    KVR_INDEX_RADIX = 1, /* exact compressed radix tree (default) */
    KVR_INDEX_CKF = 2,   /* cuckoo-filter lanes (compact, may overcount) */
    KVR_INDEX_BOTH = 3,  /* both fed; queries answered by the radix tree */
};

struct kvr_index_config {
    int kind;                               /* enum kvr_index_kind; 0 means KVR_INDEX_RADIX */
    uint32_t max_hold_blocks;               /* work units per write-lock hold; 0 means 256 */
    const struct kvr_ckf_index_config *ckf; /* CKF settings (CKF/BOTH); NULL = defaults */
    uint64_t dump_chunk_blocks;             /* blocks emitted per dump read hold; 0 = max_hold */
};

/* Event results. In BOTH mode they count the radix tree's results (what apply returns); the
 * CKF's own outcome is in kvr_index_stats.ckf (err_parent, err_block, omissions, invariant,
 * err_nomem). */
struct kvr_index_counters {
    uint64_t events[4];       /* by kind: [KVR_EVENT_STORED], [REMOVED], [CLEARED]; [0] = other */
    uint64_t blocks_stored;   /* blocks in applied store events */
    uint64_t blocks_removed;  /* hashes in applied removal events */
    uint64_t err_parent;      /* ParentBlockNotFound */
    uint64_t err_block;       /* BlockNotFound (per missing hash) */
    uint64_t err_invalid_seq; /* InvalidBlockSequence */
    uint64_t err_nomem;       /* AllocationFailed */
    uint64_t err_capacity;    /* CKF capacity omissions (an event with a block left out) */
    uint64_t err_other;       /* anything else (invalid arguments) */
    uint64_t non_device;      /* events of another storage tier (not in the device index) */
    uint64_t queries;         /* find_matches calls */
    uint64_t write_holds;     /* write-lock holds so far */
    uint64_t max_hold_work;   /* most work units done in one write hold (the bound under test) */
};

struct kvr_index_stats {
    int kind;                       /* enum kvr_index_kind */
    struct kvr_radix_stats radix;   /* zeros without a radix tree */
    struct kvr_ckf_index_stats ckf; /* zeros without a CKF */
    struct kvr_index_counters counters;
};

/* Creates an index (cfg may be NULL for defaults). *out owned; free with kvr_index_free.
 * Returns KVR_OK, KVR_EINVAL (bad config) or KVR_ENOMEM. */
int kvr_index_new(const struct kvr_index_config *cfg, kvr_index_t **out);
void kvr_index_free(kvr_index_t *idx);

/* Applies one event (borrowed). Device-tier events go to the tree; others are counted and
 * ignored by the device index. Returns the event's result code (KVR_OK, KVR_EPARENT, ...).
 * Thread-safe (takes the write lock, in bounded holds). */
int kvr_index_apply(kvr_index_t *idx, const struct kvr_event *ev);

/* Applies n events in order under one write lock, released every max_hold_blocks work units.
 * results (may be NULL) receives each event's code. Returns the number of events that failed
 * (0 = all applied). Thread-safe. */
size_t kvr_index_apply_batch(kvr_index_t *idx, const struct kvr_event *ev, size_t n, int *results);

/* Worker / rank removal (write lock, in bounded holds). KVR_ENOTFOUND when the index knows no
 * such rank. */
int kvr_index_remove_worker(kvr_index_t *idx, uint64_t worker_id);
int kvr_index_remove_rank(kvr_index_t *idx, uint64_t worker_id, uint32_t dp_rank);

/* Prefix overlap of n local hashes; as kvr_radix_find_matches (never allocates). Answered by the
 * radix tree when the index has one (RADIX, BOTH), else by the CKF (which may overcount, never
 * undercount what it tracks). Thread-safe (read lock). */
int kvr_index_find_matches(kvr_index_t *idx, const uint64_t *locals, size_t n, unsigned flags,
                           struct kvr_match *out, size_t cap, size_t *n_out);

/* Snapshot of sizes and counters (read lock). */
void kvr_index_stats(kvr_index_t *idx, struct kvr_index_stats *out);

/* (block, rank) ownership entries: the tree's block_ranks when the index has one (RADIX, BOTH),
 * else the CKF's ownership entries (kvr_ckf_index_stats.blocks). O(1), unlike kvr_index_stats
 * (read lock). */
size_t kvr_index_block_ranks(kvr_index_t *idx);

/* Per-rank block counts (read lock); as kvr_radix_rank_blocks. */
int kvr_index_rank_blocks(kvr_index_t *idx, struct kvr_rank_blocks *out, size_t cap, size_t *n_out);

/* CKF lane depths for n local hashes (CKF or BOTH): as kvr_ckf_index_find_matches. KVR_ESTATE
 * when the index has no CKF. Thread-safe (read lock). */
int kvr_index_find_matches_ckf(kvr_index_t *idx, const uint64_t *locals, size_t n,
                               struct kvr_match *out, size_t cap, size_t *n_out);

struct kvr_index_dump_info {
    uint64_t chunks; /* read holds the dump took */
    int exact;       /* 1: no write between the first and the last chunk (an exact cut) */
};

/* Dumps the index as stored events (kvr/radix.h), in chunks of dump_chunk_blocks under the read
 * lock, released between chunks (see the design above for the consistency this gives). Appends
 * to *out (owned by the caller); info (may be NULL) receives the chunk count and whether the dump
 * is an exact cut. Returns KVR_OK, KVR_ENOMEM (events already appended stay) or KVR_ESTATE for a
 * CKF-only index (a filter cannot be dumped as events). Thread-safe. */
int kvr_index_dump_ex(kvr_index_t *idx, struct kvr_event_list *out,
                      struct kvr_index_dump_info *info);
/* kvr_index_dump_ex without info. */
int kvr_index_dump(kvr_index_t *idx, struct kvr_event_list *out);

/* The radix tree / CKF behind the index, for single-threaded tools and tests (no locking).
 * Borrowed; NULL when the index has none. */
kvr_radix_t *kvr_index_radix(kvr_index_t *idx);
kvr_ckf_index_t *kvr_index_ckf(kvr_index_t *idx);

/* The index kind (enum kvr_index_kind). */
int kvr_index_kind(const kvr_index_t *idx);

#endif
