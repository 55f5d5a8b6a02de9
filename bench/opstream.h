/* opstream.h - op-stream files (spec/opstream.md) loaded whole into memory for replay.
 *
 * An op stream is JSON lines, in order:
 *     {"event": RouterEvent}
 *     {"match": [local hash, ...], "expect": {"<worker_id>": blocks, ...}}
 * Loading parses every line once (kvr_json_scan + json-c + the RouterEvent decoder, so hashes
 * are exact u64) into a compact form, so that a replay measures the index and nothing else:
 *
 *     ops[]      one per non-blank line, in file order: (kind, line, index)
 *                    │ kind EVENT                │ kind MATCH
 *                    ▼                           ▼
 *     events     kvr_event_list          queries[i]: hashes[off .. off+n), expects[eoff .. eoff+ne)
 *                                        expects sorted by worker_id, zeros absent
 *
 * The first malformed line stops the load with a message naming the line and the field:
 *     line 12: event.event.data.stored.blocks[3].block_hash: expected an unsigned 64-bit
 *     integer, got 1.5
 *
 * Not thread-safe to load; a loaded stream is read-only and may be shared by threads.
 */
#ifndef KVR_BENCH_OPSTREAM_H
#define KVR_BENCH_OPSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/event.h"

enum kvr_opstream_kind {
    KVR_OPSTREAM_EVENT = 1,
    KVR_OPSTREAM_MATCH = 2,
};

/* One line of the stream. */
struct kvr_opstream_op {
    uint32_t kind;  /* enum kvr_opstream_kind */
    uint32_t line;  /* 1-based line number in the file */
    uint32_t index; /* into events.ev[] or queries[] */
};

/* One expected overlap (dp_rank 0). */
struct kvr_opstream_expect {
    uint64_t worker_id;
    uint32_t blocks; /* > 0 */
    uint32_t pad_;
};

/* One match line. */
struct kvr_opstream_query {
    size_t hash_off;   /* first hash in hashes[] */
    size_t expect_off; /* first entry in expects[] */
    uint32_t n;        /* query length in blocks */
    uint32_t n_expect; /* entries, sorted by worker_id */
};

struct kvr_opstream {
    struct kvr_event_list events; /* event lines, in order (owned) */
    struct kvr_opstream_op *ops;  /* ops[0..n_ops) (owned) */
    size_t n_ops;
    struct kvr_opstream_query *queries; /* queries[0..n_queries) (owned) */
    size_t n_queries;
    uint64_t *hashes; /* all query hashes (owned) */
    size_t n_hashes;
    struct kvr_opstream_expect *expects; /* all expectations (owned) */
    size_t n_expects;
    /* Totals, in the units of spec/opstream.md §5 and of `kvtrace.py stats`. */
    uint64_t stored;                                          /* stored events */
    uint64_t stored_blocks;                                   /* blocks in stored events */
    uint64_t removed;                                         /* removed events */
    uint64_t removed_blocks;                                  /* hashes in removed events */
    uint64_t cleared;                                         /* cleared events */
    uint64_t match_blocks;                                    /* hashes in match lines */
    uint64_t expected_hits;                                   /* sum of every expect value */
    size_t cap_ops_, cap_queries_, cap_hashes_, cap_expects_; /* internal */
};

/* Initialises an empty stream. */
void kvr_opstream_init(struct kvr_opstream *s);

/* Frees everything the stream owns; it stays initialised (empty). */
void kvr_opstream_free(struct kvr_opstream *s);

/* Loads the file at path (borrowed) into s (initialised, empty). Returns KVR_OK; KVR_EIO (file
 * cannot be opened or read); KVR_ECORRUPT (a malformed line: loading stops there); or KVR_ENOMEM.
 * On failure err (may be NULL) receives a NUL-terminated message, cut to err_len, and s holds
 * the lines before the failure. */
int kvr_opstream_load(const char *path, struct kvr_opstream *s, char *err, size_t err_len);

/* The hashes of query q (borrowed from s). */
static inline const uint64_t *kvr_opstream_query_hashes(const struct kvr_opstream *s,
                                                        const struct kvr_opstream_query *q)
{
    return s->hashes + q->hash_off;
}

/* The expectations of query q (borrowed from s). */
static inline const struct kvr_opstream_expect *
kvr_opstream_query_expects(const struct kvr_opstream *s, const struct kvr_opstream_query *q)
{
    return s->expects + q->expect_off;
}

#endif
