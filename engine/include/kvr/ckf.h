/* ckf.h - the cuckoo-filter residency index ("CKF"): addressing, buckets, one filter lane.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Design (spec/ckf.md §3-§6). A CKF lane is a lossy set of SEQUENCE hashes (hashing.md §3): each
 * hash leaves a 16-bit fingerprint in one of two candidate buckets. A bucket is one u64 holding
 * four u16 slots; fingerprint 0 marks an empty slot.
 *
 *   address(seq):                                  bucket (u64, little-endian slots)
 *     mixed = xxh3(le64(seq), seed)                 63         47         31         15        0
 *     fp    = mixed & 0xFFFF   (0 -> 1)             +----------+----------+----------+----------+
 *     a     = (mixed >> 16) & mask                  |  slot 3  |  slot 2  |  slot 1  |  slot 0  |
 *     b     = a ^ delta(fp)                         +----------+----------+----------+----------+
 *     delta(f) = xxh3(le16(f), seed ^ 0x9E3779B97F4A7C15) & mask   (0 -> 1)
 *
 *   alt(alt(x)) = x and a != b: a fingerprint found in one bucket knows its other bucket, which
 *   is what lets insertion relocate ("kick") fingerprints without knowing their full hashes.
 *
 * Membership is SWAR: x = word ^ (fp * 0x0001000100010001); a slot matches iff its u16 of x is
 * zero; ((x - LO) & ~x & HI) flags matching slots exactly in its lowest flagged slot (a borrow can
 * also flag a slot ABOVE a true match), so "which slot" always takes the lowest flag.
 *
 * Storage is always a "view": a lane of a possibly transposed table of relaxed-atomic u64 words,
 *
 *   word[bucket * stride + lane]      stride = 1 for a plain filter (kvr_ckf_t),
 *                                     stride = D for a D-lane consumer table (ckf_search.h),
 *
 * so the same insert/kick/rollback/remove code serves the producer's plain filter, the index
 * mode's lanes and snapshot installation. Readers may load words concurrently with one writer:
 * every word is written with a single relaxed atomic store (ckf.md §9: no seqlocks).
 *
 * Insertion (ckf.md §6): first empty slot of a, else of b; else up to max_kicks relocations from a
 * random one of a/b (SplitMix64 choices), each logged as (bucket, old word); if no chain ends in
 * an empty slot, the log is replayed newest-first and every bucket is byte-identical to before:
 * capacity exhaustion is an omission, never a partial state. Removal zeroes the first slot equal
 * to fp in a, else in b, and touches nothing else.
 *
 * Sizing (gen A): buckets = next_pow2(max(2, ceil(5 × expected / 16))) (80% target load at four
 * slots per bucket; 2.5 bytes per block at that load).
 */
#ifndef KVR_CKF_H
#define KVR_CKF_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kvr/alloc.h"

#define KVR_CKF_DEFAULT_SEED 0x5DEECE66D1B54A33ULL /* cuckoo.rs default */
#define KVR_CKF_DELTA_SALT 0x9E3779B97F4A7C15ULL   /* XORed into the seed for delta(fp) */
#define KVR_CKF_SLOTS 4u                           /* slots per bucket */
#define KVR_CKF_FP_BITS 16u                        /* fingerprint width */
#define KVR_CKF_MAX_KICKS 500u                     /* default relocation budget */
#define KVR_CKF_MAX_KICKS_LIMIT 4096u              /* largest accepted max_kicks */
#define KVR_CKF_WINDOW 8u                          /* default (and largest) verification window */
#define KVR_CKF_LANES_MAX 16u                      /* lanes in one transposed table */

#define KVR_CKF_SWAR_LO 0x0001000100010001ULL
#define KVR_CKF_SWAR_HI 0x8000800080008000ULL

/* ==== addressing ============================================================================ */

/* The mask-independent part of an address: computed once per hash, reusable for any table
 * size with the same seed. */
struct kvr_ckf_key {
    uint64_t mixed;     /* xxh3(le64(seq), seed) */
    uint64_t delta_raw; /* xxh3(le16(fp), seed ^ KVR_CKF_DELTA_SALT), before masking */
    uint16_t fp;        /* non-zero fingerprint */
};

struct kvr_ckf_addr {
    uint64_t a;  /* primary bucket */
    uint64_t b;  /* alternate bucket (a ^ delta(fp)) */
    uint16_t fp; /* non-zero fingerprint */
};

/* Computes the key of a sequence hash. Pure, thread-safe. */
void kvr_ckf_key_make(uint64_t seq, uint64_t seed, struct kvr_ckf_key *out);

/* Masked delta: delta_raw & mask, or 1 when that is 0. */
static inline uint64_t kvr_ckf_delta_masked(uint64_t delta_raw, uint64_t mask)
{
    uint64_t d = delta_raw & mask;
    return d != 0 ? d : 1;
}

/* Buckets of a key in a table of mask + 1 buckets (mask = power of two - 1, >= 1). */
static inline void kvr_ckf_key_addr(const struct kvr_ckf_key *k, uint64_t mask,
                                    struct kvr_ckf_addr *out)
{
    out->fp = k->fp;
    out->a = (k->mixed >> 16) & mask;
    out->b = out->a ^ kvr_ckf_delta_masked(k->delta_raw, mask);
}

/* delta(fp) for a table of mask + 1 buckets. Pure, thread-safe. */
uint64_t kvr_ckf_delta(uint16_t fp, uint64_t seed, uint64_t mask);

/* Full address of a sequence hash (ckf.md §3). Pure, thread-safe. */
void kvr_ckf_address(uint64_t seq, uint64_t seed, uint64_t mask, struct kvr_ckf_addr *out);

/* ==== gen B addressing (reference) =========================================================== */

/* Gen B ("CKF1" filter.rs @4708833, ckf.md §6), for interoperability checks only: kvrouter's
 * filters, producer, consumer and index mode all use the gen A addressing above. The CKF1
 * frames carry bucket images, not hashes, so they are the same for either addressing; a
 * consumer of a gen B producer's frames would have to probe with these addresses.
 *   mix(x, s) = x ^= s; x *= 0xff51afd7ed558ccd; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53;
 *               x ^= x >> 33
 *   fp = (u16)(mix(h, seed) >> 48) (0 -> 1);  a = mix(h, seed ^ 0xD1B54A32D192ED03) & mask;
 *   b = a ^ ((mix(fp, seed) & mask) | 1) */
#define KVR_CKF_GENB_INDEX_SALT 0xD1B54A32D192ED03ULL

uint64_t kvr_ckf_genb_mix(uint64_t x, uint64_t s);

/* Gen B address of hash h in a table of mask + 1 buckets. Pure, thread-safe. */
void kvr_ckf_genb_address(uint64_t h, uint64_t seed, uint64_t mask, struct kvr_ckf_addr *out);

/* ==== SWAR bucket operations ================================================================= */

/* Flag word: bit 16s+15 set for matching slots (exact in the lowest set flag only). */
static inline uint64_t kvr_ckf_swar_flags(uint64_t word, uint16_t fp)
{
    uint64_t x = word ^ ((uint64_t)fp * KVR_CKF_SWAR_LO);
    return (x - KVR_CKF_SWAR_LO) & ~x & KVR_CKF_SWAR_HI;
}

/* 1 if some slot of word holds fp (exact), else 0. fp = 0 asks for an empty slot. */
static inline int kvr_ckf_word_has(uint64_t word, uint16_t fp)
{
    return kvr_ckf_swar_flags(word, fp) != 0;
}

/* Lowest slot holding fp (0..3), or -1. */
static inline int kvr_ckf_word_first(uint64_t word, uint16_t fp)
{
    uint64_t f = kvr_ckf_swar_flags(word, fp);
    if (f == 0)
        return -1;
    return (int)((unsigned)__builtin_ctzll(f) >> 4);
}

static inline uint16_t kvr_ckf_word_slot(uint64_t word, unsigned slot)
{
    return (uint16_t)(word >> (16u * slot));
}

static inline uint64_t kvr_ckf_word_set(uint64_t word, unsigned slot, uint16_t fp)
{
    unsigned sh = 16u * slot;
    return (word & ~((uint64_t)0xFFFF << sh)) | ((uint64_t)fp << sh);
}

/* Number of non-empty slots in a word. */
static inline unsigned kvr_ckf_word_used(uint64_t word)
{
    unsigned n = 0;
    for (unsigned s = 0; s < KVR_CKF_SLOTS; s++)
        n += kvr_ckf_word_slot(word, s) != 0;
    return n;
}

/* ==== SplitMix64 ============================================================================= */

struct kvr_ckf_rng {
    uint64_t state;
};

static inline uint64_t kvr_ckf_rng_next(struct kvr_ckf_rng *r)
{
    r->state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = r->state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Per-lane generator: state = one next() on seed ^ ((lane + 1) * 0x9E3779B97F4A7C15). */
void kvr_ckf_rng_seed_lane(struct kvr_ckf_rng *r, uint64_t seed, uint32_t lane);

/* ==== sizing ================================================================================= */

/* Gen A sizing: next_pow2(max(2, floor((5 × expected + 15) / 16))); saturates at 2^62. */
uint64_t kvr_ckf_buckets_for(uint64_t expected);

/* 1 if n is a power of two >= 2. */
static inline int kvr_ckf_buckets_valid(uint64_t n)
{
    return n >= 2 && (n & (n - 1)) == 0;
}

/* ==== views and the lane algorithms =========================================================== */

/* One lane of bucket words. Borrowed pointers: a view never owns its words. */
struct kvr_ckf_view {
    _Atomic uint64_t *words; /* word of bucket i: words[i * stride + lane] */
    uint64_t mask;           /* num_buckets - 1 */
    uint64_t seed;           /* addressing seed */
    uint32_t stride;         /* lanes per bucket row (1 = plain filter) */
    uint32_t lane;           /* this lane's column */
};

static inline uint64_t kvr_ckf_view_get(const struct kvr_ckf_view *v, uint64_t bucket)
{
    return atomic_load_explicit(&v->words[bucket * v->stride + v->lane], memory_order_relaxed);
}

static inline void kvr_ckf_view_put(const struct kvr_ckf_view *v, uint64_t bucket, uint64_t word)
{
    atomic_store_explicit(&v->words[bucket * v->stride + v->lane], word, memory_order_relaxed);
}

/* 1 if the lane holds the fingerprint of `key` in either of its buckets (may be a false
 * positive), else 0 (authoritative). Read-only; safe concurrently with one writer. */
int kvr_ckf_view_contains_key(const struct kvr_ckf_view *v, const struct kvr_ckf_key *key);

/* The relocation log of one insertion: (bucket, word before the kick). Caller-owned scratch of
 * at least max_kicks entries (see kvr_ckf_kicker). */
struct kvr_ckf_kick {
    uint64_t bucket;
    uint64_t old;
};

/* What an insertion needs besides the view: its RNG, budget and scratch. Borrowed. */
struct kvr_ckf_kicker {
    struct kvr_ckf_rng *rng;
    struct kvr_ckf_kick *log; /* max_kicks entries */
    uint32_t max_kicks;       /* 1..KVR_CKF_MAX_KICKS_LIMIT */
};

/* Inserts the fingerprint of `key` (ckf.md §6). On success writes the distinct dirty buckets
 * (sorted ascending; at most max_kicks + 1) to dirty[] when dirty != NULL (capacity
 * max_kicks + 1) and their number to *n_dirty (may be NULL).
 * Returns KVR_OK, or KVR_ECAPACITY after rolling every touched bucket back to its previous word
 * (the lane is byte-identical to before). Single writer per lane. */
int kvr_ckf_view_insert(const struct kvr_ckf_view *v, const struct kvr_ckf_kicker *k,
                        const struct kvr_ckf_key *key, uint64_t *dirty, size_t *n_dirty);

/* Removes one copy of the fingerprint of `key`: the first equal slot of bucket a, else of b.
 * Returns 1 and sets *bucket (may be NULL) to the changed bucket, or 0 if neither bucket holds
 * it (the lane is unchanged). Single writer per lane. */
int kvr_ckf_view_remove(const struct kvr_ckf_view *v, const struct kvr_ckf_key *key,
                        uint64_t *bucket);

/* Zeroes every bucket of the lane. Single writer per lane. */
void kvr_ckf_view_clear(const struct kvr_ckf_view *v);

/* Non-empty slots in the lane (O(buckets)). */
uint64_t kvr_ckf_view_count(const struct kvr_ckf_view *v);

/* ==== kvr_ckf_t: a plain single-lane filter (the producer's table) ============================ */

typedef struct kvr_ckf kvr_ckf_t;

struct kvr_ckf_config {
    uint64_t num_buckets; /* power of two >= 2; 0 = kvr_ckf_buckets_for(expected) */
    uint64_t expected;    /* used when num_buckets == 0; must then be > 0 */
    uint64_t seed;        /* addressing seed (kvr_ckf_config_init: KVR_CKF_DEFAULT_SEED) */
    uint32_t max_kicks;   /* 1..KVR_CKF_MAX_KICKS_LIMIT (default 500) */
    uint32_t lane;        /* lane number for the RNG seed (kvr_ckf_rng_seed_lane) */
};

/* Fills the defaults: seed KVR_CKF_DEFAULT_SEED, max_kicks 500, expected 1, lane 0. */
void kvr_ckf_config_init(struct kvr_ckf_config *cfg);

/* Creates an empty filter. *out owned (free with kvr_ckf_free). Returns KVR_OK, KVR_EINVAL
 * (bad config) or KVR_ENOMEM. */
int kvr_ckf_new(const struct kvr_ckf_config *cfg, kvr_ckf_t **out);
void kvr_ckf_free(kvr_ckf_t *f);

/* The filter's allocator (byte counts, failure injection). Borrowed. */
kvr_alloc_t *kvr_ckf_allocator(kvr_ckf_t *f);

/* A view of the filter's words (valid until kvr_ckf_free). */
void kvr_ckf_view(const kvr_ckf_t *f, struct kvr_ckf_view *out);

/* Inserts / removes / tests one sequence hash; as the view functions. insert: dirty[] needs
 * max_kicks + 1 entries. remove returns 1/0. contains returns 1/0. */
int kvr_ckf_insert(kvr_ckf_t *f, uint64_t seq, uint64_t *dirty, size_t *n_dirty);
int kvr_ckf_remove(kvr_ckf_t *f, uint64_t seq, uint64_t *bucket);
int kvr_ckf_contains(const kvr_ckf_t *f, uint64_t seq);

uint64_t kvr_ckf_buckets(const kvr_ckf_t *f);
uint32_t kvr_ckf_max_kicks(const kvr_ckf_t *f);
/* Fingerprints currently stored (maintained incrementally; O(1)). */
uint64_t kvr_ckf_count(const kvr_ckf_t *f);
/* Bytes of the bucket array alone (num_buckets × 8). */
size_t kvr_ckf_table_bytes(const kvr_ckf_t *f);

#endif
