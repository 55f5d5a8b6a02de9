/* ckf_frame.h - CKF1 snapshot/delta frames and the frame-fed multi-lane consumer
 * (spec/ckf.md §9, §10; byte layout in docs/CKF_FORMAT.md).
 * SPDX-License-Identifier: Apache-2.0
 *
 * Frame = 48-byte header + body, all little-endian, body checksummed (low 32 bits of
 * xxh3(body, 0)):
 *
 *   0      4    6     8  9  10   12          20             28             36        44     48
 *   +------+----+-----+--+--+----+-----------+--------------+--------------+---------+------+
 *   | CKF1 | v1 |flags|16| 4| 0  |   seed    | num_buckets  | dc_worker_id |  epoch  | csum |
 *   +------+----+-----+--+--+----+-----------+--------------+--------------+---------+------+
 *   flags 1 = delta:          body = base_epoch u64 | count u32 | count × (bucket u32, 4 × u16)
 *   flags 2 = snapshot chunk: body = chunk_index u32 | chunk_count u32 | bucket_offset u64 |
 *                                    buckets of the chunk × (4 × u16)
 *
 * A snapshot of B buckets is ceil(B / 524288) chunks (4 MiB of buckets each) sent in order; it is
 * tagged with the producer's current epoch N (the number of batches published so far). A delta
 * N -> N+1 carries ABSOLUTE images of the buckets its batch dirtied (a bucket that went back to
 * its old value still appears; a bucket emptied by a removal appears as an explicit zero).
 *
 * Consumer lane state machine (one per lane; `epoch` = installed sequence):
 *
 *               bind(lane, producer)                snapshot chunk 0 (epoch E)
 *     UNBOUND ─────────────────────▶ AWAITING ─────────────────────────▶ LOADING
 *                                      ▲  ▲                                │ chunks 1..k-1 in
 *                     retire: gap,     │  │ retire: bad chunk order,       │ order, same header
 *                     bad checksum,    │  └─ malformed / mismatched ◀──────┤
 *                     seed/shape       │                                   ▼ last chunk
 *                     mismatch ────────┴───────────────────────────────  READY (epoch = E)
 *                                                                          │ delta E -> E+1:
 *                                                                          └─ apply, epoch++
 *   In READY: a delta with base_epoch > epoch is a GAP (a dropped or reordered delta): the lane
 *   retires to AWAITING and needs a new snapshot. A delta with base_epoch < epoch is ignored
 *   only if it is a re-delivery of one of the last 16 deltas applied (same base epoch, same body
 *   checksum); any other delta from behind retires the lane ("producer restarted?"): a producer
 *   that restarted counts epochs from 0 again, and its deltas must never be applied on top of
 *   the old table. A snapshot chunk 0 restarts LOADING (resynchronisation); if its epoch is
 *   behind the highest epoch installed from this producer, the producer restarted (or the
 *   snapshot is very late): the lane is retired with "producer restarted? ..." as its error,
 *   the restart is counted, and the snapshot is loaded (outcome KVR_CKF_FEED_RESTARTED).
 *   The frame format carries no producer generation; epochs going backwards are the signal.
 *   A frame from another producer (dc_worker_id) is ignored, never applied.
 *   Readiness is published with release semantics and read once per query with acquire
 *   semantics; LOADING and AWAITING lanes are invisible to queries (they answer depth 0).
 *
 * Thread-safety: frames are fed by ONE writer thread; any number of threads may search
 * concurrently (bucket words are relaxed atomics, ckf.md §9: no seqlocks, a query may see a mix of
 * old and new buckets of one delta).
 */
#ifndef KVR_CKF_FRAME_H
#define KVR_CKF_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "kvr/ckf.h"
#include "kvr/ckf_search.h"

#define KVR_CKF_FRAME_VERSION 1u
#define KVR_CKF_FRAME_DELTA 1u
#define KVR_CKF_FRAME_SNAPSHOT 2u
#define KVR_CKF_FRAME_HEADER_LEN 48u
#define KVR_CKF_CHUNK_BUCKETS 524288u /* 4 MiB / 8 */
#define KVR_CKF_SNAPSHOT_BODY_FIXED 16u
#define KVR_CKF_DELTA_BODY_FIXED 12u
#define KVR_CKF_DELTA_ENTRY_LEN 12u

/* A decoded frame. `payload` borrows the input buffer (valid while it lives). */
struct kvr_ckf_frame {
    uint16_t flags; /* KVR_CKF_FRAME_DELTA or KVR_CKF_FRAME_SNAPSHOT */
    uint64_t seed;
    uint64_t num_buckets;
    uint64_t dc_worker_id; /* producer identity */
    uint64_t epoch;        /* snapshot: tagged sequence; delta: base_epoch + 1 */
    uint32_t checksum;
    /* snapshot chunk */
    uint32_t chunk_index;
    uint32_t chunk_count;
    uint64_t bucket_offset;
    uint64_t chunk_buckets; /* buckets in this chunk */
    /* delta */
    uint64_t base_epoch;
    uint32_t count;         /* entries */
    const uint8_t *payload; /* snapshot: chunk_buckets × 8 bytes; delta: count × 12 bytes */
};

/* Decodes and validates one frame. Returns KVR_OK, or KVR_ECORRUPT with a static reason in *why
 * (may be NULL): wrong magic / version / fingerprint bits / slots / reserved field / flags,
 * non-power-of-two or < 2 buckets, checksum mismatch, body length != declared content, chunk
 * index/count/offset inconsistent with num_buckets, delta epoch != base_epoch + 1, bucket index
 * out of range or not strictly increasing. Pure; borrows buf. */
int kvr_ckf_frame_decode(const uint8_t *buf, size_t len, struct kvr_ckf_frame *out,
                         const char **why);

/* Word i of a decoded snapshot chunk (bucket bucket_offset + i). */
uint64_t kvr_ckf_frame_chunk_word(const struct kvr_ckf_frame *f, uint64_t i);
/* Entry i of a decoded delta. */
void kvr_ckf_frame_delta_entry(const struct kvr_ckf_frame *f, uint32_t i, uint32_t *bucket,
                               uint64_t *word);

/* Number of chunks of a snapshot of num_buckets buckets. */
uint32_t kvr_ckf_frame_chunk_count(uint64_t num_buckets);
/* Length of snapshot chunk `chunk_index`, or 0 if it does not exist. */
size_t kvr_ckf_frame_snapshot_len(uint64_t num_buckets, uint32_t chunk_index);
/* Length of a delta frame with `count` entries. */
size_t kvr_ckf_frame_delta_len(size_t count);

/* Encodes snapshot chunk `chunk_index` of the lane `v` (borrowed) tagged with `epoch` into
 * out[0..cap). *len = bytes written. KVR_OK, KVR_EINVAL (no such chunk) or KVR_ERANGE (cap too
 * small; nothing useful written). Reads the lane with relaxed loads. */
int kvr_ckf_frame_encode_snapshot(const struct kvr_ckf_view *v, uint64_t dc_worker_id,
                                  uint64_t epoch, uint32_t chunk_index, uint8_t *out, size_t cap,
                                  size_t *len);

/* Encodes a delta base_epoch -> base_epoch + 1 with the CURRENT images of buckets[0..n)
 * (borrowed; strictly increasing, < num_buckets, num_buckets <= 2^32). KVR_OK, KVR_EINVAL (bad
 * bucket list, base_epoch == UINT64_MAX, or too many buckets for u32 indices) or KVR_ERANGE. */
int kvr_ckf_frame_encode_delta(const struct kvr_ckf_view *v, uint64_t dc_worker_id,
                               uint64_t base_epoch, const uint64_t *buckets, size_t n, uint8_t *out,
                               size_t cap, size_t *len);

/* ==== consumer ================================================================================ */

typedef struct kvr_ckf_consumer kvr_ckf_consumer_t;

enum kvr_ckf_lane_state {
    KVR_CKF_LANE_UNBOUND = 0,  /* no producer bound */
    KVR_CKF_LANE_AWAITING = 1, /* bound or retired: waits for a snapshot */
    KVR_CKF_LANE_LOADING = 2,  /* snapshot chunks arriving */
    KVR_CKF_LANE_READY = 3,    /* queryable; accepts contiguous deltas */
};

enum kvr_ckf_feed_outcome {
    KVR_CKF_FEED_APPLIED = 0,   /* chunk stored, snapshot completed or delta applied */
    KVR_CKF_FEED_IGNORED = 1,   /* stale, foreign or premature traffic; lane unchanged */
    KVR_CKF_FEED_RETIRED = 2,   /* the lane was retired (see its error) */
    KVR_CKF_FEED_RESTARTED = 3, /* a snapshot from behind (producer restarted?): the lane was
                                   retired and this chunk started its reload (see its error) */
};

struct kvr_ckf_lane_info {
    int state;             /* enum kvr_ckf_lane_state */
    uint64_t dc_worker_id; /* bound producer */
    uint64_t epoch;        /* installed sequence (valid in READY) */
    uint64_t retirements;  /* times this lane was retired */
    uint64_t restarts;     /* snapshots whose epoch went backwards (producer restarts) */
    uint64_t applied;      /* frames applied */
    uint64_t ignored;      /* frames ignored */
    const char *error;     /* last retirement reason ("" if none); valid until the next feed */
};

/* Creates a consumer of `lanes` (1..16) lanes, all of num_buckets buckets and `seed` (frames of
 * another shape or seed retire their lane). *out owned (kvr_ckf_consumer_free).
 * KVR_OK, KVR_EINVAL or KVR_ENOMEM. */
int kvr_ckf_consumer_new(uint32_t lanes, uint64_t num_buckets, uint64_t seed,
                         kvr_ckf_consumer_t **out);
void kvr_ckf_consumer_free(kvr_ckf_consumer_t *c);

/* Binds a lane to a producer identity (a new lease): the lane becomes AWAITING (invisible to
 * queries) until a complete snapshot arrives. KVR_OK or KVR_EINVAL. Writer thread. */
int kvr_ckf_consumer_bind(kvr_ckf_consumer_t *c, uint32_t lane, uint64_t dc_worker_id);

/* Feeds one frame (borrowed) to a lane. Sets *outcome (may be NULL). Returns KVR_OK when applied
 * (also a restart's first snapshot chunk) or ignored; when the lane was retired returns
 * KVR_ECORRUPT (malformed frame, bad checksum) or KVR_ESTATE (gap, delta from behind, seed or
 * shape mismatch, chunk out of order) and the lane's error string says which. KVR_EINVAL for a
 * bad lane number. Writer thread. */
int kvr_ckf_consumer_feed(kvr_ckf_consumer_t *c, uint32_t lane, const uint8_t *buf, size_t len,
                          int *outcome);

/* Lane status (writer thread, or any thread for a racy snapshot of the numbers). */
int kvr_ckf_consumer_lane_info(const kvr_ckf_consumer_t *c, uint32_t lane,
                               struct kvr_ckf_lane_info *out);

/* Mask of READY lanes (acquire load). Any thread. */
uint16_t kvr_ckf_consumer_ready(const kvr_ckf_consumer_t *c);

/* Prefix depth per lane of the sequence hashes seq[0..n) (borrowed), READY lanes only, window W
 * (0 = 8). Any thread, concurrently with the writer. */
void kvr_ckf_consumer_search(const kvr_ckf_consumer_t *c, const uint64_t *seq, size_t n,
                             unsigned window, uint32_t depths[KVR_CKF_LANES_MAX]);

/* As kvr_ckf_consumer_search for a request's LOCAL hashes locals[0..n) (borrowed), chained into
 * sequence hashes first (hashing.md §3). KVR_OK, or KVR_ENOMEM when a query longer than 512
 * blocks cannot get its scratch (depths then all 0). Any thread. */
int kvr_ckf_consumer_search_locals(const kvr_ckf_consumer_t *c, const uint64_t *locals, size_t n,
                                   unsigned window, uint32_t depths[KVR_CKF_LANES_MAX]);

/* The table behind the consumer (borrowed), e.g. to compare images in tests. */
const kvr_ckf_table_t *kvr_ckf_consumer_table(const kvr_ckf_consumer_t *c);

#endif
