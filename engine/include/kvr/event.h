/* event.h - the index's input: RouterEvents (Dynamo-compatible KV cache events).
 *
 * Design: one flat struct per event, decoded from any wire form (JSON RouterEvent, engine msgpack,
 * dumps). Arrays are borrowed: they live in the kvr_event_list (or caller buffer) that produced
 * the event. Hash values are exact u64 (spec/index.md §2.3).
 *
 *   RouterEvent: worker_id, storage_tier, (residency_domain), event
 *     event: event_id, dp_rank, data
 *       data: stored  {parent_hash?, blocks[(block_hash, tokens_hash)]}
 *           | removed {block_hashes[]}
 *           | cleared
 *
 * A rank is (worker_id, dp_rank): the unit of ownership everywhere.
 *   block_hash / parent_hash / removed hashes : external hashes (opaque, per rank)
 *   tokens_hash                               : local block hash (router-computed, spec/hashing.md)
 *
 * kvr_event_list owns a growable array of events and one arena for their block/hash arrays; the
 * events it holds borrow from that arena and die with kvr_event_list_free.
 */
#ifndef KVR_EVENT_H
#define KVR_EVENT_H

#include <stddef.h>
#include <stdint.h>

enum kvr_event_kind {
    KVR_EVENT_STORED = 1,
    KVR_EVENT_REMOVED = 2,
    KVR_EVENT_CLEARED = 3,
};

/* storage_tier; only DEVICE feeds the primary overlap index. */
enum kvr_tier {
    KVR_TIER_DEVICE = 0,
    KVR_TIER_HOST_PINNED = 1,
    KVR_TIER_DISK = 2,
    KVR_TIER_EXTERNAL = 3,
    KVR_TIER_COUNT_ = 4
};

/* residency_domain; absent = WORKER. */
enum kvr_domain {
    KVR_DOMAIN_WORKER = 0,
    KVR_DOMAIN_CACHE_OWNER = 1,
};

struct kvr_block {
    uint64_t block_hash;  /* external hash (engine's, opaque) */
    uint64_t tokens_hash; /* local block hash */
};

struct kvr_event {
    uint64_t worker_id;
    uint64_t event_id;    /* informative only; never used to reorder */
    uint64_t parent_hash; /* valid iff has_parent */
    uint32_t dp_rank;
    uint32_t start_position; /* valid iff has_start_position */
    uint8_t kind;            /* enum kvr_event_kind */
    uint8_t tier;            /* enum kvr_tier */
    uint8_t domain;          /* enum kvr_domain */
    uint8_t has_parent;      /* stored: 0 = chain starts at the root */
    uint8_t has_start_position;
    uint8_t pad_[3];
    uint32_t n;               /* stored: number of blocks; removed: number of hashes */
    struct kvr_block *blocks; /* stored: n blocks (borrowed) */
    uint64_t *hashes;         /* removed: n external hashes (borrowed) */
};

/* Names for logs and JSON ("stored", "device", ...). Static strings; NULL for invalid values. */
const char *kvr_event_kind_name(int kind);
const char *kvr_tier_name(int tier);
/* Parses a tier name; returns 1 and sets *out, or 0 if unknown. */
int kvr_tier_parse(const char *s, size_t len, int *out);

/* ---- kvr_event_list: an owning list of events ------------------------------------------------ */

struct kvr_event_list {
    struct kvr_event *ev; /* ev[0..n) */
    size_t n;
    size_t cap;
    struct kvr_arena_chunk *arena; /* storage for blocks/hashes arrays (internal) */
};

void kvr_event_list_init(struct kvr_event_list *l);
/* Frees every event and array the list owns; the list is re-initialised (reusable). */
void kvr_event_list_free(struct kvr_event_list *l);
/* Drops all events but keeps capacity (arena memory is released). */
void kvr_event_list_reset(struct kvr_event_list *l);

/* Appends a copy of *ev (its arrays are copied into the list's arena; ev keeps ownership of its
 * own). Returns KVR_OK or KVR_ENOMEM (list unchanged). */
int kvr_event_list_push(struct kvr_event_list *l, const struct kvr_event *ev);

/* Appends a new event whose array of `n` blocks (kind STORED) or hashes (kind REMOVED) is
 * allocated uninitialised in the arena; *out points at the list slot (valid until the next push).
 * Returns KVR_OK or KVR_ENOMEM (list unchanged). */
int kvr_event_list_emplace(struct kvr_event_list *l, int kind, uint32_t n, struct kvr_event **out);

/* Removes the last event (its arena space is not reclaimed until reset/free). */
void kvr_event_list_pop(struct kvr_event_list *l);

#endif
