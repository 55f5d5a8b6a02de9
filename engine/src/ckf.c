/* ckf.c - CKF addressing, lane insert/kick/rollback/remove and the plain filter (kvr/ckf.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "kvr/ckf.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kvr/err.h"

_Static_assert(sizeof(_Atomic uint64_t) == sizeof(uint64_t), "atomic u64 must be plain-sized");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "lock-free 64-bit atomics required");

/* ==== addressing ============================================================================ */

void kvr_ckf_key_make(uint64_t seq, uint64_t seed, struct kvr_ckf_key *out)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(seq >> (8 * i));
    uint64_t mixed = XXH3_64bits_withSeed(b, sizeof(b), seed);
    uint16_t fp = (uint16_t)(mixed & 0xFFFFu);
    if (fp == 0)
        fp = 1;
    unsigned char f[2] = {(unsigned char)fp, (unsigned char)(fp >> 8)};
    out->mixed = mixed;
    out->fp = fp;
    out->delta_raw = XXH3_64bits_withSeed(f, sizeof(f), seed ^ KVR_CKF_DELTA_SALT);
}

uint64_t kvr_ckf_delta(uint16_t fp, uint64_t seed, uint64_t mask)
{
    unsigned char f[2] = {(unsigned char)fp, (unsigned char)(fp >> 8)};
    return kvr_ckf_delta_masked(XXH3_64bits_withSeed(f, sizeof(f), seed ^ KVR_CKF_DELTA_SALT),
                                mask);
}

void kvr_ckf_address(uint64_t seq, uint64_t seed, uint64_t mask, struct kvr_ckf_addr *out)
{
    struct kvr_ckf_key k;
    kvr_ckf_key_make(seq, seed, &k);
    kvr_ckf_key_addr(&k, mask, out);
}

uint64_t kvr_ckf_genb_mix(uint64_t x, uint64_t s)
{
    x ^= s;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

void kvr_ckf_genb_address(uint64_t h, uint64_t seed, uint64_t mask, struct kvr_ckf_addr *out)
{
    uint16_t fp = (uint16_t)(kvr_ckf_genb_mix(h, seed) >> 48);
    if (fp == 0)
        fp = 1;
    out->fp = fp;
    out->a = kvr_ckf_genb_mix(h, seed ^ KVR_CKF_GENB_INDEX_SALT) & mask;
    out->b = out->a ^ ((kvr_ckf_genb_mix(fp, seed) & mask) | 1);
}

void kvr_ckf_rng_seed_lane(struct kvr_ckf_rng *r, uint64_t seed, uint32_t lane)
{
    struct kvr_ckf_rng s = {seed ^ (((uint64_t)lane + 1) * 0x9E3779B97F4A7C15ULL)};
    r->state = kvr_ckf_rng_next(&s);
}

uint64_t kvr_ckf_buckets_for(uint64_t expected)
{
    const uint64_t cap = (uint64_t)1 << 62;
    /* floor((5e + 15) / 16) without overflow: 5e/16 = e/16*5 + (e%16)*5/16 */
    uint64_t q = expected / 16, r = expected % 16;
    uint64_t want = (q > cap / 5) ? cap : q * 5 + (r * 5 + 15) / 16;
    if (want < 2)
        want = 2;
    if (want >= cap)
        return cap;
    uint64_t n = 2;
    while (n < want)
        n <<= 1;
    return n;
}

/* ==== lane algorithms ======================================================================== */

int kvr_ckf_view_contains_key(const struct kvr_ckf_view *v, const struct kvr_ckf_key *key)
{
    struct kvr_ckf_addr ad;
    kvr_ckf_key_addr(key, v->mask, &ad);
    return kvr_ckf_word_has(kvr_ckf_view_get(v, ad.a), ad.fp) ||
           kvr_ckf_word_has(kvr_ckf_view_get(v, ad.b), ad.fp);
}

/* Puts fp into the first empty slot of bucket; returns 1, or 0 when the bucket is full. */
static int place(const struct kvr_ckf_view *v, uint64_t bucket, uint16_t fp)
{
    uint64_t w = kvr_ckf_view_get(v, bucket);
    int s = kvr_ckf_word_first(w, 0);
    if (s < 0)
        return 0;
    kvr_ckf_view_put(v, bucket, kvr_ckf_word_set(w, (unsigned)s, fp));
    return 1;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

/* Writes the distinct buckets of log[0..n) plus `last`, sorted, to dirty; returns the count. */
static size_t dirty_set(const struct kvr_ckf_kick *log, size_t n, uint64_t last, uint64_t *dirty)
{
    for (size_t i = 0; i < n; i++)
        dirty[i] = log[i].bucket;
    dirty[n] = last;
    qsort(dirty, n + 1, sizeof(*dirty), cmp_u64);
    size_t m = 1;
    for (size_t i = 1; i <= n; i++)
        if (dirty[i] != dirty[m - 1])
            dirty[m++] = dirty[i];
    return m;
}

int kvr_ckf_view_insert(const struct kvr_ckf_view *v, const struct kvr_ckf_kicker *k,
                        const struct kvr_ckf_key *key, uint64_t *dirty, size_t *n_dirty)
{
    struct kvr_ckf_addr ad;
    kvr_ckf_key_addr(key, v->mask, &ad);
    uint64_t bucket;
    size_t n = 0;
    if (place(v, ad.a, ad.fp)) {
        bucket = ad.a;
        goto done;
    }
    if (place(v, ad.b, ad.fp)) {
        bucket = ad.b;
        goto done;
    }
    bucket = (kvr_ckf_rng_next(k->rng) & 1) == 0 ? ad.a : ad.b;
    uint16_t f = ad.fp;
    for (uint32_t i = 0; i < k->max_kicks; i++) {
        unsigned slot = (unsigned)(kvr_ckf_rng_next(k->rng) & 3);
        uint64_t w = kvr_ckf_view_get(v, bucket);
        k->log[n].bucket = bucket;
        k->log[n].old = w;
        n++;
        uint16_t evicted = kvr_ckf_word_slot(w, slot);
        kvr_ckf_view_put(v, bucket, kvr_ckf_word_set(w, slot, f));
        f = evicted;
        bucket ^= kvr_ckf_delta(f, v->seed, v->mask); /* the evictee's other bucket */
        if (place(v, bucket, f))
            goto done;
    }
    /* Capacity exhausted: restore newest first, so a bucket logged twice ends at its oldest. */
    while (n > 0) {
        n--;
        kvr_ckf_view_put(v, k->log[n].bucket, k->log[n].old);
    }
    if (n_dirty != NULL)
        *n_dirty = 0;
    return KVR_ECAPACITY;
done:
    if (dirty != NULL) {
        size_t m = dirty_set(k->log, n, bucket, dirty);
        if (n_dirty != NULL)
            *n_dirty = m;
    } else if (n_dirty != NULL) {
        *n_dirty = 0;
    }
    return KVR_OK;
}

int kvr_ckf_view_remove(const struct kvr_ckf_view *v, const struct kvr_ckf_key *key,
                        uint64_t *bucket)
{
    struct kvr_ckf_addr ad;
    kvr_ckf_key_addr(key, v->mask, &ad);
    uint64_t cand[2] = {ad.a, ad.b};
    for (int i = 0; i < 2; i++) {
        uint64_t w = kvr_ckf_view_get(v, cand[i]);
        int s = kvr_ckf_word_first(w, ad.fp);
        if (s >= 0) {
            kvr_ckf_view_put(v, cand[i], kvr_ckf_word_set(w, (unsigned)s, 0));
            if (bucket != NULL)
                *bucket = cand[i];
            return 1;
        }
    }
    return 0;
}

void kvr_ckf_view_clear(const struct kvr_ckf_view *v)
{
    for (uint64_t b = 0; b <= v->mask; b++)
        kvr_ckf_view_put(v, b, 0);
}

uint64_t kvr_ckf_view_count(const struct kvr_ckf_view *v)
{
    uint64_t n = 0;
    for (uint64_t b = 0; b <= v->mask; b++)
        n += kvr_ckf_word_used(kvr_ckf_view_get(v, b));
    return n;
}

/* ==== the plain filter ======================================================================= */

struct kvr_ckf {
    kvr_alloc_t alloc;        /* owns this struct, words and log */
    _Atomic uint64_t *words;  /* num_buckets words */
    struct kvr_ckf_kick *log; /* max_kicks entries of kick scratch */
    struct kvr_ckf_rng rng;   /* SplitMix64 kick choices */
    uint64_t num_buckets;
    uint64_t seed;
    uint64_t count; /* stored fingerprints */
    uint32_t max_kicks;
};

void kvr_ckf_config_init(struct kvr_ckf_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->expected = 1;
    cfg->seed = KVR_CKF_DEFAULT_SEED;
    cfg->max_kicks = KVR_CKF_MAX_KICKS;
}

int kvr_ckf_new(const struct kvr_ckf_config *cfg, kvr_ckf_t **out)
{
    uint64_t nb = cfg->num_buckets;
    if (nb == 0) {
        if (cfg->expected == 0)
            return KVR_EINVAL;
        nb = kvr_ckf_buckets_for(cfg->expected);
    }
    if (!kvr_ckf_buckets_valid(nb) || nb > SIZE_MAX / sizeof(uint64_t) || cfg->max_kicks == 0 ||
        cfg->max_kicks > KVR_CKF_MAX_KICKS_LIMIT)
        return KVR_EINVAL;
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    kvr_ckf_t *f = kvr_malloc(&a, sizeof(*f));
    if (f == NULL)
        return KVR_ENOMEM;
    f->words = kvr_calloc(&a, (size_t)nb, sizeof(*f->words));
    f->log = kvr_malloc(&a, cfg->max_kicks * sizeof(*f->log));
    if (f->words == NULL || f->log == NULL) {
        kvr_free(&a, f->words);
        kvr_free(&a, f->log);
        kvr_free(&a, f);
        return KVR_ENOMEM;
    }
    f->num_buckets = nb;
    f->seed = cfg->seed;
    f->count = 0;
    f->max_kicks = cfg->max_kicks;
    kvr_ckf_rng_seed_lane(&f->rng, cfg->seed, cfg->lane);
    f->alloc = a;
    *out = f;
    return KVR_OK;
}

void kvr_ckf_free(kvr_ckf_t *f)
{
    if (f == NULL)
        return;
    kvr_alloc_t a = f->alloc;
    kvr_free(&a, f->words);
    kvr_free(&a, f->log);
    kvr_free(&a, f);
}

kvr_alloc_t *kvr_ckf_allocator(kvr_ckf_t *f)
{
    return &f->alloc;
}

void kvr_ckf_view(const kvr_ckf_t *f, struct kvr_ckf_view *out)
{
    out->words = f->words;
    out->mask = f->num_buckets - 1;
    out->seed = f->seed;
    out->stride = 1;
    out->lane = 0;
}

int kvr_ckf_insert(kvr_ckf_t *f, uint64_t seq, uint64_t *dirty, size_t *n_dirty)
{
    struct kvr_ckf_view v;
    struct kvr_ckf_key key;
    struct kvr_ckf_kicker k = {&f->rng, f->log, f->max_kicks};
    kvr_ckf_view(f, &v);
    kvr_ckf_key_make(seq, f->seed, &key);
    int rc = kvr_ckf_view_insert(&v, &k, &key, dirty, n_dirty);
    if (rc == KVR_OK)
        f->count++;
    return rc;
}

int kvr_ckf_remove(kvr_ckf_t *f, uint64_t seq, uint64_t *bucket)
{
    struct kvr_ckf_view v;
    struct kvr_ckf_key key;
    kvr_ckf_view(f, &v);
    kvr_ckf_key_make(seq, f->seed, &key);
    int rc = kvr_ckf_view_remove(&v, &key, bucket);
    f->count -= (uint64_t)rc;
    return rc;
}

int kvr_ckf_contains(const kvr_ckf_t *f, uint64_t seq)
{
    struct kvr_ckf_view v;
    struct kvr_ckf_key key;
    kvr_ckf_view(f, &v);
    kvr_ckf_key_make(seq, f->seed, &key);
    return kvr_ckf_view_contains_key(&v, &key);
}

uint64_t kvr_ckf_buckets(const kvr_ckf_t *f)
{
    return f->num_buckets;
}

uint32_t kvr_ckf_max_kicks(const kvr_ckf_t *f)
{
    return f->max_kicks;
}

uint64_t kvr_ckf_count(const kvr_ckf_t *f)
{
    return f->count;
}

size_t kvr_ckf_table_bytes(const kvr_ckf_t *f)
{
    return (size_t)f->num_buckets * sizeof(uint64_t);
}
