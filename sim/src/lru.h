/* lru.h - one simulated worker's prefix cache: an LRU of KV blocks that emits KV events.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design. A worker caches KV blocks keyed by their sequence hash (hashing.md: the chain of the
 * request's local hashes, so one key names a block AND its whole prefix). Capacity is in blocks.
 *
 *   MRU ─▶ [root of last request] ⇄ [..] ⇄ [its tail] ⇄ [older blocks] ⇄ ... ◀─ LRU (evicted first)
 *
 * Every store touches the request's blocks TAIL FIRST, so a block is always at least as recent
 * as each of its descendants: eviction always takes leaves and the cache never holds a block
 * without its parent (no holes; the same rule as tools/kvtrace.py and spec/opstream.md §2). So
 * the cached set is prefix-closed and `prefix` is simply the leading run of present blocks.
 *
 * Events (spec/index.md §2, the same RouterEvents a vLLM worker would publish), handed to a sink
 * in this order by kvr_sim_lru_store:
 *   stored  {parent_hash: seq[q-1] or null, blocks[q..n) = (block_hash = seq, tokens_hash = local)}
 *           where q = the blocks already cached (none stored when q == n);
 *   removed {block_hashes: the evicted blocks, oldest first}, one event, only if any was evicted
 *           (it may span several sequences, and may include this request's own tail when the
 *           request is longer than the cache).
 * worker_id is the cache's, dp_rank 0, tier device, event_id counts from 0 per cache.
 *
 * Not modelled: blocks pinned by running requests (a real engine cannot evict them); the cache
 * models prefix reuse, not memory admission.
 * Not thread-safe (one simulation runs on one thread).
 */
#ifndef KVR_SIM_LRU_H
#define KVR_SIM_LRU_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/event.h"
#include "u64tab.h"

/* Receives each event (borrowed for the call). */
struct kvr_sim_sink {
    void (*fn)(void *ctx, const struct kvr_event *ev);
    void *ctx;
};

struct kvr_sim_lru_node {
    uint64_t key;  /* sequence hash */
    uint32_t prev; /* towards MRU; NIL at the MRU end */
    uint32_t next; /* towards LRU; NIL at the LRU end; free-list link when unused */
};

struct kvr_sim_lru {
    uint64_t worker_id;             /* events' worker_id */
    uint64_t capacity;              /* blocks kept after each store */
    uint64_t size;                  /* blocks cached */
    uint64_t next_event_id;         /* event_id of the next event */
    struct kvr_sim_lru_node *nodes; /* node pool (owned) */
    uint32_t cap_nodes;             /* slots in nodes */
    uint32_t used_nodes;            /* slots ever handed out (high-water mark) */
    uint32_t free_head;             /* free list through next; NIL = empty */
    uint32_t mru, lru;              /* list ends; NIL when empty */
    struct kvr_sim_u64tab tab;      /* key -> node */
    struct kvr_block *blocks;       /* scratch for stored events (owned) */
    uint64_t *hashes;               /* scratch for removed events (owned) */
    uint32_t *slots;                /* scratch: node of each block of the request (owned) */
    size_t cap_blocks, cap_hashes;  /* scratch capacities */
    size_t cap_slots;
    uint64_t stored_events, stored_blocks, removed_events, removed_blocks; /* totals */
};

#define KVR_SIM_LRU_NIL UINT32_MAX

/* Initialises an empty cache of `capacity` blocks for worker_id (no allocation yet). */
void kvr_sim_lru_init(struct kvr_sim_lru *l, uint64_t worker_id, uint64_t capacity);
/* Frees everything the cache owns; it is empty afterwards (no events). */
void kvr_sim_lru_free(struct kvr_sim_lru *l);

/* Number of leading blocks of seq[0..n) (borrowed) the cache holds. Read-only. */
size_t kvr_sim_lru_prefix(const struct kvr_sim_lru *l, const uint64_t *seq, size_t n);

/* Makes the cached blocks among seq[0..n) most recent, tail first (a cache hit being used).
 * Blocks not cached are skipped. No events. */
void kvr_sim_lru_touch(struct kvr_sim_lru *l, const uint64_t *seq, size_t n);

/* A cache hit being used: the cached prefix of seq[0..n) (its length is returned) is made most
 * recent, tail first, in one pass (kvr_sim_lru_prefix + kvr_sim_lru_touch). No events. */
size_t kvr_sim_lru_hit(struct kvr_sim_lru *l, const uint64_t *seq, size_t n);

/* Stores a computed request: seq[0..n) and local[0..n) (borrowed) become cached and most recent
 * (tail first), then the least recent blocks are evicted down to the capacity. Emits the stored
 * and removed events described above to sink (borrowed; its fn may be NULL). *evicted (may be
 * NULL) receives the number of blocks evicted. KVR_OK or KVR_ENOMEM (the cache may then hold
 * part of the request, still prefix-closed; no event was emitted for the failed part). */
int kvr_sim_lru_store(struct kvr_sim_lru *l, const uint64_t *seq, const uint64_t *local, size_t n,
                      const struct kvr_sim_sink *sink, size_t *evicted);

/* Writes up to cap keys from the LRU end (oldest first) to out; returns how many. For tests. */
size_t kvr_sim_lru_oldest(const struct kvr_sim_lru *l, uint64_t *out, size_t cap);

#endif
