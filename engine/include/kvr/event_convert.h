/* event_convert.h - engine batches (kvr/event_msgpack.h) -> index events (kvr/event.h).
 *
 * Design (spec/engine-events.md §7, Dynamo zmq_wire/convert.rs semantics):
 *
 *   engine batch (seq)                       index events (all with event_id = seq)
 *   ─────────────────                        ──────────────────────────────────────
 *   rank = batch.data_parallel_rank if non-nil, else the registered dp_rank
 *   BlockStored(hashes, parent, tokens)  ──▶ stored {parent_hash, blocks[(engine hash i,
 *                                               router local hash of block i's tokens)]}
 *   BlockStored with a repeated hash     ──▶ removed {} (empty: a no-op, never a clear)
 *   BlockRemoved(hashes)                 ──▶ removed {hashes}
 *   AllBlocksCleared                     ──▶ cleared (that rank only)
 *
 * The router re-hashes every stored block itself (spec/hashing.md §1): block i covers tokens
 * [i*bs, i*bs + w), w = bs (+1 with Eagle), hashed with seed salt(cache_salt, lora_name), where
 * an event without lora_name takes the caller's default (the worker's registered LoRA). The
 * engine's hashes are opaque external ids, used only to link a store to its parent and to name
 * removals. Conversion stops at the first block whose tokens are short, and stores nothing when
 * the event's block_size differs from the index's (earlier blocks kept; both counted as
 * warnings, which callers log at most 3 times). Multimodal: with image_token_id set, runs of that
 * token are replaced by pad_value(mm hash k) and the block is hashed without mm info (038eab2);
 * otherwise per-block mm hashes are appended to the block bytes (hashing.md §4). SGLang bigram
 * token pairs [t_i, t_i+1] are read as the token sequence t_0 .. t_n (an assumed mapping; the
 * real Eagle bigram semantics are unconfirmed).
 *
 * Thread-safety: pure apart from the output list and counters the caller passes; scratch memory
 * comes from the batch's allocator, so one batch is converted by one thread at a time.
 */
#ifndef KVR_EVENT_CONVERT_H
#define KVR_EVENT_CONVERT_H

#include <stdint.h>

#include "kvr/event.h"
#include "kvr/event_msgpack.h"

struct kvr_convert_opts {
    uint64_t worker_id;        /* the registered worker */
    uint32_t dp_rank;          /* registered rank; a non-nil batch rank overrides it */
    uint32_t block_size;       /* the index's block size (> 0) */
    int eagle;                 /* non-zero: Eagle windows of block_size + 1 tokens (default off) */
    int no_namespace;          /* non-zero: ignore cache_salt (the query path must agree) */
    int has_image_token_id;    /* non-zero: replace image-token runs by mm pad values */
    uint32_t image_token_id;   /* valid iff has_image_token_id */
    int has_group_filter;      /* non-zero: convert only events whose group_idx is nil or equal */
    int64_t group_idx;         /* valid iff has_group_filter */
    const char *default_lora;  /* LoRA of stores whose event has no (or an empty) lora_name, e.g.
                                * SGLang or pre-#27577 vLLM (borrowed; NULL = none) */
    uint32_t default_lora_len; /* bytes of default_lora */
};

/* Cumulative; kvr_convert_batch adds to them. */
struct kvr_convert_counters {
    uint64_t events[4];             /* index events emitted, by enum kvr_event_kind */
    uint64_t blocks;                /* stored blocks emitted */
    uint64_t tier[KVR_TIER_COUNT_]; /* stored/removed events emitted, by tier */
    uint64_t self_ref;              /* stores turned into an empty removal */
    uint64_t block_size_mismatch;   /* stores dropped: event block size != index block size */
    uint64_t short_tokens;          /* stores cut at a block with too few tokens */
    uint64_t extra_tokens;          /* stores with more tokens than their blocks use (kept) */
    uint64_t mm_invalid;            /* stores cut at a block with > 64 mm hashes */
    uint64_t blocks_dropped;        /* blocks lost to the four rules above */
    uint64_t empty_stores;          /* stores that produced no block (not emitted) */
    uint64_t group_filtered;        /* events of another KV cache group (not emitted) */
};

/* The warnings among the counters (block size mismatch, short tokens, mm invalid): callers log
 * the first few of these. */
static inline uint64_t kvr_convert_warnings(const struct kvr_convert_counters *c)
{
    return c->block_size_mismatch + c->short_tokens + c->mm_invalid;
}

/* Appends the index events of batch *b (borrowed; received with sequence number seq) to *out.
 * Every event gets event_id = seq, worker_id and the rank rule above. Scratch memory comes from
 * b's allocator and is released before returning. counters may be NULL.
 * Returns KVR_OK, KVR_EINVAL (o->block_size == 0) or KVR_ENOMEM; on failure *out is as before. */
int kvr_convert_batch(const struct kvr_emp_batch *b, uint64_t seq, const struct kvr_convert_opts *o,
                      struct kvr_event_list *out, struct kvr_convert_counters *counters);

#endif
