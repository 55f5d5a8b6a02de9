/* approx.h - approximate mode: an index fed by the router's own routing decisions.
 *
 * For models whose workers publish no KV events (index.md §10): after routing a request to a
 * rank, the router records the request's complete blocks as held by that rank, each with a TTL.
 * The blocks go into an ordinary kvr_index_t (tokens_hash = local hash, block_hash = the
 * router's sequence hash), so queries and policies see them like event-fed blocks.
 *
 *   record(rank, locals, now) ──▶ index: stored event (root chain of sequence hashes)
 *                             └──▶ timers: (expiry = now + ttl, depth, rank, seq hash)
 *   expire(now)               ──▶ pop due timers; a timer whose block was re-recorded since is
 *                                 stale and skipped; others remove the block from the index
 *   size > max_blocks         ──▶ prune: pop earliest expiry first, deepest first among equals
 *                                 (leaves before parents), until size <= floor(max * ratio)
 *
 * Thread-safety: every function may be called from any thread; an internal mutex serialises
 * them, and index updates take the index's own lock (order: approx, then index).
 */
#ifndef KVR_APPROX_H
#define KVR_APPROX_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/index.h"

typedef struct kvr_approx kvr_approx_t;

/* Told of every successful kvr_approx_record (not of kvr_approx_record_quiet), under the
 * recorder's mutex: must be short and must not call back into the recorder. `locals` is
 * borrowed for the call. Replica sync (server/src/replica.c) forwards them to the other
 * replicas, which apply them with kvr_approx_record_quiet. */
typedef void (*kvr_approx_observer_fn)(void *ctx, uint64_t worker_id, uint32_t dp_rank,
                                       const uint64_t *locals, size_t n, uint64_t now_ms);

struct kvr_approx_config {
    uint64_t ttl_ms;                 /* block lifetime since its last recording; 0 = 120,000 */
    size_t max_blocks;               /* prune above this many (block, rank) entries; 0 = 2^20 */
    double prune_ratio;              /* prune down to floor(max_blocks * ratio); 0 means 0.8 */
    kvr_approx_observer_fn observer; /* optional */
    void *observer_ctx;              /* passed to observer (borrowed) */
};

struct kvr_approx_stats {
    uint64_t recorded_blocks; /* blocks recorded (re-recordings included) */
    uint64_t expired_blocks;  /* removed because their TTL passed */
    uint64_t pruned_blocks;   /* removed by the size limit */
    size_t tracked;           /* (block, rank) pairs with a live timer */
};

/* Creates an approximate-mode recorder over idx (borrowed; must outlive it). cfg may be NULL.
 * Returns KVR_OK, KVR_EINVAL or KVR_ENOMEM. */
int kvr_approx_new(kvr_index_t *idx, const struct kvr_approx_config *cfg, kvr_approx_t **out);
void kvr_approx_free(kvr_approx_t *a);

/* Records that rank (worker, dp) now holds the n blocks of local hashes `locals` (borrowed): stores
 * them in the index and (re)starts their timers at now_ms. Expires due timers first. Returns
 * KVR_OK, or the index's error, or KVR_ENOMEM. */
int kvr_approx_record(kvr_approx_t *a, uint64_t worker_id, uint32_t dp_rank, const uint64_t *locals,
                      size_t n, uint64_t now_ms);

/* The same, without telling the observer (for recordings received from another replica). */
int kvr_approx_record_quiet(kvr_approx_t *a, uint64_t worker_id, uint32_t dp_rank,
                            const uint64_t *locals, size_t n, uint64_t now_ms);

/* Removes every block whose timer is due at now_ms. Returns the number removed. */
size_t kvr_approx_expire(kvr_approx_t *a, uint64_t now_ms);

/* Forgets a worker's timers (call after removing the worker from the index). */
void kvr_approx_forget_worker(kvr_approx_t *a, uint64_t worker_id);

void kvr_approx_stats(kvr_approx_t *a, struct kvr_approx_stats *out);

#endif
