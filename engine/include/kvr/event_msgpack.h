/* event_msgpack.h - engine KV-event batches (vLLM / SGLang msgpack) decoded and encoded.
 *
 * Design: an inference engine publishes one msgpack `KVEventBatch` per ZMQ message (frame 3 of
 * [topic, seq, payload]; spec/engine-events.md §2, §4). kvr_emp_decode() turns one payload frame
 * into an "engine batch": a faithful, wire-independent copy of what the engine said (its opaque
 * hashes, token ids, block size, LoRA name, medium ...). Nothing router-specific happens here;
 * kvr/event_convert.h turns an engine batch into index events (struct kvr_event).
 *
 *   payload ──kvr_emp_decode──▶ struct kvr_emp_batch ──kvr_convert_batch──▶ struct kvr_event[]
 *                    ▲                                                     (kvr/event_convert.h)
 *   struct kvr_emp_batch ──kvr_emp_encode──┘ (mock worker, tests: vLLM-format payloads)
 *
 * Encodings accepted, in any combination (spec §4):
 *
 *   era | outer batch                          | events
 *   ----+--------------------------------------+-------------------------------------
 *    A  | [ts, events] / [ts, events, rank]    | positional arrays, tag first
 *    B  | [ts, events, data_parallel_rank]     | maps with "type" (any key order)
 *    C  | {"ts", "events", "data_parallel_rank"} | maps
 *
 * - integers of any width (fixint ... cf/d3); floats as float32 or float64 (ts also accepts int);
 * - hashes as unsigned int, negative int (two's-complement bits) or bytes (last 8 bytes,
 *   big-endian; 1..64 bytes), spec §5;
 * - unknown event tags: the event is skipped and counted, the batch kept; unknown map keys and
 *   extra trailing array elements: ignored;
 * - legacy traps decided by msgpack type: positional index 7 is lora_name (str/nil) or SGLang's
 *   metadata map {"cache_salt": ...}; index 9 is group_idx (int/nil) or Dynamo's block_mm_infos
 *   (array);
 * - medium -> storage tier (spec §6; nil or unknown -> device, unknown counted);
 *   locality "REMOTE" or an unknown value -> the event is dropped and counted.
 * - token_ids as ints, or as 2-element int arrays per token (SGLang EAGLE bigram; token_width 2).
 *
 * Failure is all-or-nothing: a malformed batch yields KVR_ECORRUPT, an error kind, a message with
 * the path of the offending item (e.g. `events[1].block_hashes[0]: expected int or bytes`) and an
 * empty batch. The payload must be consumed exactly: trailing bytes are an error. Declared array
 * and string sizes are checked against the bytes left and against kvr_emp_limits BEFORE anything
 * is allocated, so an oversized array is an error, never an allocation.
 *
 * Memory: a batch owns its arrays and strings (copied out of the payload, which may be freed right
 * after decoding) in an arena allocated through the batch's kvr_alloc_t; decoding again reuses it.
 * Thread-safety: none; one batch per thread. Functions with different batches are independent.
 */
#ifndef KVR_EVENT_MSGPACK_H
#define KVR_EVENT_MSGPACK_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/alloc.h"
#include "kvr/event.h"

/* ==== limits ================================================================================== */

#define KVR_EMP_DEFAULT_MAX_EVENTS 65536u   /* events per batch */
#define KVR_EMP_DEFAULT_MAX_HASHES 65536u   /* block hashes per event */
#define KVR_EMP_DEFAULT_MAX_TOKENS 4194304u /* token ids per event (4 Mi) */
#define KVR_EMP_DEFAULT_MAX_STR 4096u       /* bytes per string field */

/* Hard limits against hostile input; a zero field means its default. */
struct kvr_emp_limits {
    uint32_t max_events; /* events in one batch */
    uint32_t max_hashes; /* block_hashes (and extra_keys / mm entries) in one event */
    uint32_t max_tokens; /* token_ids in one event */
    uint32_t max_str;    /* bytes in one string */
};

/* ==== decode errors and counters ============================================================== */

enum kvr_emp_error {
    KVR_EMP_E_NONE = 0,
    KVR_EMP_E_TRUNCATED = 1, /* input ends inside an item (or declares more than it holds) */
    KVR_EMP_E_TRAILING = 2,  /* bytes left after the batch */
    KVR_EMP_E_TYPE = 3,      /* a field of the wrong msgpack type */
    KVR_EMP_E_LIMIT = 4,     /* an array or string above kvr_emp_limits */
    KVR_EMP_E_MISSING = 5,   /* a required field is absent */
    KVR_EMP_E_VALUE = 6,     /* right type, bad value (block_size 0, token > u32, dup key, 0xc1) */
    KVR_EMP_E_NOMEM = 7,     /* allocation failed */
    KVR_EMP_E_COUNT_ = 8
};

/* Encoding generation ("dialect") bits; a batch may show A and B at once (mixed events). */
#define KVR_EMP_DIALECT_A 1u /* positional events */
#define KVR_EMP_DIALECT_B 2u /* outer array, map events */
#define KVR_EMP_DIALECT_C 4u /* outer map */

/* Cumulative decoder statistics; kvr_emp_decode adds to them (never resets). */
struct kvr_emp_counters {
    uint64_t batches;                  /* decoded successfully */
    uint64_t failed;                   /* rejected batches */
    uint64_t errors[KVR_EMP_E_COUNT_]; /* rejected batches by enum kvr_emp_error */
    uint64_t failed_by_dialect[4];     /* [0] unknown, [1] A, [2] B, [3] C (first bit seen) */
    uint64_t dialect[4];               /* decoded batches: [1] A, [2] B, [3] C (bits set) */
    uint64_t events[4];                /* decoded events by enum kvr_event_kind */
    uint64_t unknown_tag;              /* events skipped: unknown "type"/tag */
    uint64_t locality_dropped;         /* events dropped: locality REMOTE or unknown */
    uint64_t unknown_medium;           /* events whose medium was not recognised (-> device) */
    uint64_t tier[KVR_TIER_COUNT_];    /* decoded store/remove events by tier */
};

/* ==== the engine batch ======================================================================== */

/* A string field: p == NULL means nil/absent; otherwise len bytes plus a NUL (owned by the batch).
 */
struct kvr_emp_str {
    const char *p;
    uint32_t len;
};

enum kvr_emp_mm_source {
    KVR_EMP_MM_NONE = 0,
    KVR_EMP_MM_EXTRA_KEYS = 1, /* 64-hex-char identifiers or typed {"type":"mm"} in extra_keys */
    KVR_EMP_MM_BLOCK_INFOS = 2 /* Dynamo block_mm_infos (legacy index 9 / "block_mm_infos") */
};

struct kvr_emp_event {
    uint8_t kind;          /* enum kvr_event_kind */
    uint8_t tier;          /* enum kvr_tier, from medium */
    uint8_t has_parent;    /* stored: parent_block_hash was non-nil */
    uint8_t token_width;   /* 1; 2 = SGLang bigram pairs (token_ids holds 2 * n_tokens values) */
    uint8_t has_lora_id;   /* lora_id was an int */
    uint8_t has_group_idx; /* group_idx was an int */
    uint8_t has_sliding_window;
    uint8_t mm_source;      /* enum kvr_emp_mm_source */
    uint32_t block_size;    /* stored: engine block size (> 0) */
    uint32_t event_version; /* 1 unless the engine said otherwise */
    uint32_t n_hashes;      /* block_hashes */
    uint32_t n_tokens;      /* tokens (pairs when token_width == 2) */
    uint64_t parent_hash;   /* valid iff has_parent; engine hash mapped to u64 (spec §5) */
    uint64_t *hashes;       /* n_hashes engine hashes mapped to u64 */
    uint32_t *token_ids;    /* n_tokens * token_width token ids */
    int64_t lora_id;        /* deprecated; informative */
    int64_t group_idx;      /* hybrid KV group; valid iff has_group_idx */
    int64_t sliding_window;
    struct kvr_emp_str medium;     /* raw medium string (nil = absent) */
    struct kvr_emp_str lora_name;  /* LoRA adapter name: salts the local hash */
    struct kvr_emp_str cache_salt; /* namespace (SGLang field, legacy index-7 map, typed key) */
    struct kvr_emp_str spec_kind;  /* kv_cache_spec_kind */
    struct kvr_emp_str locality;   /* informative (REMOTE/unknown events never get here) */
    /* multimodal: block k (< n_mm_blocks) carries mm_hashes[mm_off[k] .. mm_off[k + 1]) */
    uint32_t n_mm_blocks;
    uint32_t *mm_off; /* n_mm_blocks + 1 offsets */
    uint64_t *mm_hashes;
};

struct kvr_emp_batch {
    double ts;           /* seconds since the epoch (engine clock) */
    uint8_t has_dp_rank; /* data_parallel_rank was non-nil */
    uint8_t pad_[3];
    uint32_t dp_rank; /* valid iff has_dp_rank */
    unsigned dialect; /* KVR_EMP_DIALECT_* bits of this batch */
    uint32_t n;       /* events */
    struct kvr_emp_event *ev;
    uint32_t skipped; /* events skipped (unknown tags, dropped locality) */
    /* internal */
    kvr_alloc_t *alloc;
    struct kvr_emp_chunk *arena;
    size_t ev_cap;
};

/* Prepares an empty batch whose memory comes from `alloc` (borrowed; must outlive the batch). */
void kvr_emp_batch_init(struct kvr_emp_batch *b, kvr_alloc_t *alloc);

/* Frees everything the batch owns; it is re-initialised (still bound to its allocator). */
void kvr_emp_batch_free(struct kvr_emp_batch *b);

/* Decodes one payload frame (`len` bytes at `payload`, borrowed) into *b, replacing its previous
 * contents. limits may be NULL (defaults); counters may be NULL. On failure, `err` (if non-NULL,
 * `err_cap` bytes) receives a NUL-terminated message with the path of the bad item, *kind (if
 * non-NULL) the enum kvr_emp_error, and *b holds no events.
 * Returns KVR_OK, KVR_ECORRUPT (malformed; kind says why) or KVR_ENOMEM. */
int kvr_emp_decode(struct kvr_emp_batch *b, const void *payload, size_t len,
                   const struct kvr_emp_limits *limits, struct kvr_emp_counters *counters,
                   int *kind, char *err, size_t err_cap);

/* Static names: "truncated", "trailing", ... ("none" for 0, "?" when out of range). */
const char *kvr_emp_error_name(int kind);

/* Maps a medium string to an enum kvr_tier (spec §6, case-insensitive). Returns 1 when the
 * medium is known, 0 when not (then *tier = KVR_TIER_DEVICE). NULL/0-length = nil -> device, 1. */
int kvr_emp_medium_tier(const char *s, size_t len, int *tier);

/* The u64 key of a hash given as bytes (spec §5): the last min(len, 8) bytes, big-endian. */
uint64_t kvr_emp_hash_from_bytes(const uint8_t *p, size_t len);

/* ==== encoding (event_msgpack_enc.c) ========================================================== */

enum kvr_emp_era {
    KVR_EMP_ERA_B = 0, /* [ts, [map events], rank|nil]: current vLLM (default) */
    KVR_EMP_ERA_A = 1, /* [ts, [positional events], rank|nil]: legacy array_like */
    KVR_EMP_ERA_C = 2, /* {"ts", "events", "data_parallel_rank"} with map events */
};

/* Encodes *b (borrowed) the way msgspec does: smallest integer forms, float64 ts, map events with
 * "type" first, every field without a default, then defaulted fields only when they differ from
 * the default (extra_keys, group_idx, kv_cache_spec_*); positional events carry every field up
 * to the last one that is set. cache_salt goes into the map as "cache_salt" (SGLang) or, in era
 * A, as the index-7 metadata map when lora_name is nil. mm hashes (any source) are written as
 * extra_keys of 64-hex-char identifiers whose first 16 hex digits are the hash.
 * On success *out is owned (free with kvr_free(alloc, *out)) and *out_len its size.
 * Returns KVR_OK, KVR_EINVAL (bad era or kind, arrays missing, or in era A an event with both a
 * lora_name and a cache_salt, which the positional layout cannot carry) or KVR_ENOMEM. */
int kvr_emp_encode(const struct kvr_emp_batch *b, int era, kvr_alloc_t *alloc, uint8_t **out,
                   size_t *out_len);

#endif
