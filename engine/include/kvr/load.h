/* load.h - per-rank active load (Dynamo's ActiveSequences, spec/scheduling.md §6).
 * SPDX-License-Identifier: Apache-2.0
 *
 * What it tracks: for every rank (worker_id, dp_rank), the requests the router has sent there and
 * not yet seen finish, and from them the three load terms every policy uses:
 *
 *   active prefill tokens  Σ prefill tokens of requests whose first token has not come back
 *                          (each request: max(0, isl - overlap_blocks × block_size), or 0 when
 *                          prefill tracking is off for it)
 *   active (decode) blocks |unique sequence hashes held by the rank's active requests|
 *   active requests        number of active requests
 *
 *   kvr_load_t
 *    ├─ requests: request_id -> { rank, prefill tokens left, added_ms, seq hashes[] }
 *    └─ ranks[]:  (worker_id, dp_rank) -> { prefill tokens, requests, blocks: seq hash -> refs }
 *
 * Lifecycle of a request:  add ──▶ first_token ──▶ release
 *                                 (prefill done)   (implies first_token; drops its block refs,
 *                                                   blocks left with no ref leave the rank)
 * Forgotten requests: a request older than expiry_ms (300 s) is force-released, checked at most
 * every expiry_check_ms (30 s), lazily inside kvr_load_add (as Dynamo does) or on demand with
 * kvr_load_expire. Time is always passed in by the caller (milliseconds on any monotonic clock),
 * so tests are deterministic and no call reads a clock.
 *
 * Worked example (block size 4; after each step: (active blocks, active prefill tokens)):
 *   r1 [1,2,3] isl 12 -> (3, 12); r2 [4] isl 4 -> (4, 16); r3 [1,2,3,4] isl 16 overlap 4 ->
 *   (4, 16); release r2 -> (4, 12); release r3 -> (3, 12); release r1 -> (0, 0).
 *
 * Not implemented (Dynamo options off by default): output-block growth with fractional decay
 * (router_track_output_blocks), so active blocks are |unique blocks| exactly.
 *
 * Replica sync hook: every add, first token, release and expiry is reported to an optional
 * observer callback (server/src/replica.c publishes them to the other router replicas).
 * Requests received from replicas are applied with the same calls and carry a non-zero
 * `origin` (a small id the caller assigns to each remote replica; 0 = this process): the
 * observer sees them too, with op->origin set, so a publisher forwards origin 0 only.
 * kvr_load_release_origin drops everything a replica booked (it died or resynced) and
 * kvr_load_origin_foreach lists it (to publish a full state on demand).
 *
 * Thread-safety: every function is thread-safe. One mutex per tracker, held for the duration of
 * one call (a hash-map update or lookup per block; no allocation while holding it except the
 * request's own record and map growth). The observer runs under that mutex, in operation order:
 * it must be short (e.g. push to a queue) and must not call back into the tracker.
 * Allocation failure: calls return KVR_ENOMEM and leave the tracker unchanged.
 */
#ifndef KVR_LOAD_H
#define KVR_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/alloc.h"

typedef struct kvr_load kvr_load_t;

enum kvr_load_op_kind {
    KVR_LOAD_OP_ADD = 1,         /* request added */
    KVR_LOAD_OP_FIRST_TOKEN = 2, /* prefill completed (first output token) */
    KVR_LOAD_OP_RELEASE = 3,     /* request freed by the caller */
    KVR_LOAD_OP_EXPIRE = 4,      /* request force-freed by expiry */
};

/* What the observer receives (all pointers borrowed for the duration of the callback). */
struct kvr_load_op {
    int kind;                   /* enum kvr_load_op_kind */
    uint32_t dp_rank;           /* the request's rank */
    uint64_t worker_id;         /* the request's worker */
    uint64_t request_id;        /* the request */
    uint64_t now_ms;            /* the caller's time for this operation */
    uint32_t isl_tokens;        /* ADD: input length in tokens; else 0 */
    uint32_t overlap_blocks;    /* ADD: overlap the router assumed; else 0 */
    uint32_t track_prefill;     /* ADD: 1 if prefill tokens are tracked */
    uint32_t origin;            /* who booked it: 0 = this process, else a remote replica */
    uint64_t prefill_tokens;    /* ADD: prefill tokens counted on the rank (0 once done) */
    const uint64_t *seq_hashes; /* ADD: the request's sequence hashes; else NULL */
    size_t n_hashes;            /* ADD: number of seq_hashes */
};

typedef void (*kvr_load_observer_fn)(void *ctx, const struct kvr_load_op *op);

struct kvr_load_config {
    uint32_t block_size;           /* tokens per block, > 1; 0 means 16 */
    uint32_t pad_;                 /* zero */
    uint64_t expiry_ms;            /* force-release requests older than this; 0 means 300000 */
    uint64_t expiry_check_ms;      /* lazy expiry scan at most this often; 0 means 30000 */
    kvr_load_observer_fn observer; /* optional; see the header comment */
    void *observer_ctx;            /* passed to observer (borrowed) */
};

/* A request as added (arrays borrowed; the tracker copies what it keeps). */
struct kvr_load_request {
    uint64_t request_id; /* unique among active requests */
    uint64_t worker_id;  /* the chosen rank */
    uint32_t dp_rank;
    uint32_t isl_tokens;        /* input length in tokens */
    uint32_t overlap_blocks;    /* blocks the rank already had cached (from the index) */
    uint32_t track_prefill;     /* non-zero: count prefill tokens (Dynamo default: true) */
    uint32_t origin;            /* 0 = booked by this process; else the remote replica's id */
    uint32_t pad_;              /* zero */
    const uint64_t *seq_hashes; /* sequence hashes of the request's complete blocks (or random
                                   values when no reuse is assumed); may be NULL if n == 0 */
    size_t n_hashes;
};

/* Load of one rank. */
struct kvr_load_rank {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t pad_;
    uint64_t prefill_tokens; /* active prefill tokens */
    uint64_t active_blocks;  /* unique blocks of active requests */
    uint64_t requests;       /* active requests */
};

/* One candidate of a batched query: in worker_id/dp_rank, out the load terms plus new_blocks =
 * how many of the query's sequence hashes the rank's active requests do not already hold (the
 * decode blocks the request would add: spec/scheduling.md §3 `new_blocks`). */
struct kvr_load_query {
    uint64_t worker_id;      /* in */
    uint32_t dp_rank;        /* in */
    uint32_t known;          /* out: 1 if the tracker has seen the rank */
    uint64_t prefill_tokens; /* out */
    uint64_t active_blocks;  /* out */
    uint64_t requests;       /* out */
    uint64_t new_blocks;     /* out (= n_seq for an unknown rank) */
};

struct kvr_load_stats {
    uint64_t ranks;        /* ranks known */
    uint64_t active;       /* active requests */
    uint64_t added;        /* successful adds */
    uint64_t duplicates;   /* adds ignored because the id was active */
    uint64_t first_tokens; /* first_token calls that completed a prefill */
    uint64_t released;     /* releases by the caller */
    uint64_t expired;      /* force-released by expiry */
    uint64_t unknown;      /* first_token/release of an unknown id */
    size_t bytes;          /* memory held (kvr_alloc accounting) */
};

/* Creates an empty tracker (cfg may be NULL for defaults). *out owned; free with kvr_load_free.
 * KVR_OK, KVR_EINVAL (block_size 1) or KVR_ENOMEM. */
int kvr_load_new(const struct kvr_load_config *cfg, kvr_load_t **out);
/* Frees the tracker and every request it holds (no observer calls). NULL is fine. */
void kvr_load_free(kvr_load_t *ld);

/* The tracker's allocator (failure injection in tests). Borrowed; use only while no other thread
 * calls the tracker. */
kvr_alloc_t *kvr_load_allocator(kvr_load_t *ld);

/* Adds a request (borrowed; hashes copied). Runs the lazy expiry first. Returns KVR_OK,
 * KVR_EEXIST (the id is already active: ignored, counted), KVR_EINVAL (NULL hashes with
 * n_hashes > 0) or KVR_ENOMEM (nothing changed). */
int kvr_load_add(kvr_load_t *ld, const struct kvr_load_request *rq, uint64_t now_ms);

/* Marks the request's prefill complete (its first output token arrived): its prefill tokens leave
 * the rank's active prefill tokens, once (a repeated call is a no-op returning KVR_OK). Returns
 * KVR_OK or KVR_ENOTFOUND (unknown id; counted). */
int kvr_load_first_token(kvr_load_t *ld, uint64_t request_id, uint64_t now_ms);

/* Frees a finished request: implies first_token, drops its block references. KVR_OK or
 * KVR_ENOTFOUND (unknown or already released/expired; counted). */
int kvr_load_release(kvr_load_t *ld, uint64_t request_id, uint64_t now_ms);

/* Force-releases every request added before now_ms - expiry_ms (now, regardless of the check
 * interval). Returns the number expired. */
size_t kvr_load_expire(kvr_load_t *ld, uint64_t now_ms);

/* Drops every request of every rank of a worker and forgets those ranks (no observer calls).
 * Returns the number of requests dropped. */
size_t kvr_load_remove_worker(kvr_load_t *ld, uint64_t worker_id);

/* Releases every active request booked with this origin (a remote replica that died, or whose
 * full state is about to replace what we hold of it); the observer sees a RELEASE for each.
 * origin 0 releases this process's own requests. Returns the number released. */
size_t kvr_load_release_origin(kvr_load_t *ld, uint32_t origin, uint64_t now_ms);

/* Calls fn(ctx, op) for every active request of this origin, oldest first, under the tracker's
 * mutex (fn must be short and must not call back into the tracker). Each op is ADD-shaped:
 * kind KVR_LOAD_OP_ADD, the rank, request id, added time (now_ms), prefill_tokens still counted
 * (0 once the first token came), track_prefill 1, isl_tokens = prefill_tokens,
 * overlap_blocks 0 (so adding it elsewhere reproduces the same load), and its sequence hashes
 * (borrowed for the call). Returns the number listed. */
size_t kvr_load_origin_foreach(kvr_load_t *ld, uint32_t origin,
                               void (*fn)(void *ctx, const struct kvr_load_op *op), void *ctx);

/* Load of one rank: returns 1 and fills *out, or 0 if the tracker has never seen the rank
 * (*out then holds zeros). */
int kvr_load_rank_get(kvr_load_t *ld, uint64_t worker_id, uint32_t dp_rank,
                      struct kvr_load_rank *out);

/* Load of every known rank, written to out[0..cap); *n_out = number of ranks. KVR_OK or
 * KVR_ERANGE (cap too small; out holds the first cap). Order: first-seen order. */
int kvr_load_ranks(kvr_load_t *ld, struct kvr_load_rank *out, size_t cap, size_t *n_out);

/* Fills the out fields of q[0..n_q) for the sequence hashes seq[0..n_seq) (borrowed), all under
 * one lock hold (a consistent cut). O(n_q × n_seq) lookups. */
void kvr_load_query(kvr_load_t *ld, const uint64_t *seq, size_t n_seq, struct kvr_load_query *q,
                    size_t n_q);

/* Counters and sizes. */
void kvr_load_stats(kvr_load_t *ld, struct kvr_load_stats *out);

#endif
