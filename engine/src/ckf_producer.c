/* ckf_producer.c - exact ownership, refcounts, dirty buckets and batch publication
 * (kvr/ckf_producer.h). SPDX-License-Identifier: Apache-2.0 */
#include "kvr/ckf_producer.h"

#include <stdlib.h>
#include <string.h>

#include "ckf_map.h"
#include "kvr/ckf_frame.h"
#include "kvr/err.h"

struct member {
    uint64_t worker_id;
    uint32_t dp_rank;
    struct ckf_map owned; /* hash -> 1 */
};

struct kvr_ckf_producer {
    kvr_alloc_t alloc; /* owns this struct and the whole exact side */
    kvr_ckf_t *filter; /* the published single-lane filter (own allocator) */
    uint64_t dc_worker_id;
    struct member *members;
    size_t n_members, cap_members;
    struct ckf_map refcount; /* hash -> owning members (> 0) */
    uint64_t *dirty_bits;    /* one bit per bucket */
    uint64_t *dirty;         /* dirty bucket list (unsorted until a delta) */
    size_t n_dirty, cap_dirty;
    uint64_t *scratch; /* max_kicks + 1 dirty buckets of one insertion */
    uint64_t epoch;
    uint64_t omissions;
    uint64_t edges;
};

void kvr_ckf_producer_config_init(struct kvr_ckf_producer_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    kvr_ckf_config_init(&cfg->filter);
}

int kvr_ckf_producer_new(const struct kvr_ckf_producer_config *cfg, kvr_ckf_producer_t **out)
{
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    kvr_ckf_producer_t *p = kvr_calloc(&a, 1, sizeof(*p));
    if (p == NULL)
        return KVR_ENOMEM;
    int rc = kvr_ckf_new(&cfg->filter, &p->filter);
    if (rc != KVR_OK) {
        kvr_free(&a, p);
        return rc;
    }
    uint64_t nb = kvr_ckf_buckets(p->filter);
    p->dirty_bits = kvr_calloc(&a, (size_t)((nb + 63) / 64), sizeof(uint64_t));
    p->scratch = kvr_malloc(&a, (kvr_ckf_max_kicks(p->filter) + 1) * sizeof(uint64_t));
    if (p->dirty_bits == NULL || p->scratch == NULL) {
        kvr_free(&a, p->dirty_bits);
        kvr_free(&a, p->scratch);
        kvr_ckf_free(p->filter);
        kvr_free(&a, p);
        return KVR_ENOMEM;
    }
    p->dc_worker_id = cfg->dc_worker_id;
    p->alloc = a;
    ckf_map_init(&p->refcount, &p->alloc);
    *out = p;
    return KVR_OK;
}

void kvr_ckf_producer_free(kvr_ckf_producer_t *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->n_members; i++)
        ckf_map_free(&p->members[i].owned);
    ckf_map_free(&p->refcount);
    kvr_ckf_free(p->filter);
    kvr_alloc_t a = p->alloc;
    kvr_free(&a, p->members);
    kvr_free(&a, p->dirty_bits);
    kvr_free(&a, p->dirty);
    kvr_free(&a, p->scratch);
    kvr_free(&a, p);
}

kvr_alloc_t *kvr_ckf_producer_allocator(kvr_ckf_producer_t *p)
{
    return &p->alloc;
}

const kvr_ckf_t *kvr_ckf_producer_filter(const kvr_ckf_producer_t *p)
{
    return p->filter;
}

/* ==== members ================================================================================= */

static struct member *find_member(const kvr_ckf_producer_t *p, uint64_t worker_id, uint32_t dp_rank)
{
    for (size_t i = 0; i < p->n_members; i++)
        if (p->members[i].worker_id == worker_id && p->members[i].dp_rank == dp_rank)
            return &p->members[i];
    return NULL;
}

static int get_member(kvr_ckf_producer_t *p, uint64_t worker_id, uint32_t dp_rank,
                      struct member **out)
{
    struct member *m = find_member(p, worker_id, dp_rank);
    if (m == NULL) {
        if (p->n_members == p->cap_members) {
            size_t cap = p->cap_members ? p->cap_members * 2 : 4;
            struct member *ms = kvr_realloc(&p->alloc, p->members, cap * sizeof(*ms));
            if (ms == NULL)
                return KVR_ENOMEM;
            p->members = ms;
            p->cap_members = cap;
        }
        m = &p->members[p->n_members++];
        m->worker_id = worker_id;
        m->dp_rank = dp_rank;
        ckf_map_init(&m->owned, &p->alloc);
    }
    *out = m;
    return KVR_OK;
}

/* ==== dirty tracking ========================================================================== */

static int dirty_reserve(kvr_ckf_producer_t *p, size_t extra)
{
    if (p->cap_dirty - p->n_dirty >= extra)
        return KVR_OK;
    size_t cap = p->cap_dirty ? p->cap_dirty : 64;
    while (cap - p->n_dirty < extra)
        cap *= 2;
    uint64_t *d = kvr_realloc(&p->alloc, p->dirty, cap * sizeof(*d));
    if (d == NULL)
        return KVR_ENOMEM;
    p->dirty = d;
    p->cap_dirty = cap;
    return KVR_OK;
}

/* Marks a bucket dirty; room must have been reserved. */
static void dirty_mark(kvr_ckf_producer_t *p, uint64_t b)
{
    uint64_t bit = (uint64_t)1 << (b & 63);
    if (p->dirty_bits[b >> 6] & bit)
        return;
    p->dirty_bits[b >> 6] |= bit;
    p->dirty[p->n_dirty++] = b;
}

/* ==== mutations =============================================================================== */

static int keep_first(int first, int rc)
{
    return first != KVR_OK ? first : rc;
}

/* 1 -> 0 or n -> n-1 for one owned hash whose edge is being dropped. */
static int unref(kvr_ckf_producer_t *p, uint64_t h, struct kvr_ckf_apply_result *res)
{
    uint64_t *rc = ckf_map_ref(&p->refcount, h);
    KVR_ASSERT(rc != NULL && *rc > 0);
    if (--*rc > 0)
        return KVR_OK;
    ckf_map_del(&p->refcount, h, NULL);
    uint64_t bucket;
    if (kvr_ckf_remove(p->filter, h, &bucket)) {
        dirty_mark(p, bucket);
        res->deleted++;
        return KVR_OK;
    }
    res->invariant++;
    return KVR_ECORRUPT;
}

static int store_one(kvr_ckf_producer_t *p, struct member *m, uint64_t h,
                     struct kvr_ckf_apply_result *res)
{
    if (ckf_map_get(&m->owned, h, NULL)) {
        res->duplicates++;
        return KVR_OK;
    }
    /* reserve everything first: after the filter changes nothing may fail */
    uint32_t kicks = kvr_ckf_max_kicks(p->filter);
    if (ckf_map_reserve(&m->owned, 1) != KVR_OK || ckf_map_reserve(&p->refcount, 1) != KVR_OK ||
        dirty_reserve(p, kicks + 1) != KVR_OK)
        return KVR_ENOMEM;
    uint64_t *rc = ckf_map_ref(&p->refcount, h);
    if (rc != NULL) {
        ++*rc;
    } else {
        size_t nd = 0;
        if (kvr_ckf_insert(p->filter, h, p->scratch, &nd) != KVR_OK) {
            p->omissions++;
            res->omitted++;
            return KVR_ECAPACITY;
        }
        for (size_t i = 0; i < nd; i++)
            dirty_mark(p, p->scratch[i]);
        res->inserted++;
        KVR_ASSERT(ckf_map_put(&p->refcount, h, 1) == KVR_OK);
    }
    KVR_ASSERT(ckf_map_put(&m->owned, h, 1) == KVR_OK);
    p->edges++;
    res->edges_added++;
    return KVR_OK;
}

int kvr_ckf_producer_store(kvr_ckf_producer_t *p, uint64_t worker_id, uint32_t dp_rank,
                           const uint64_t *hashes, size_t n, struct kvr_ckf_apply_result *res)
{
    struct kvr_ckf_apply_result dummy;
    if (res == NULL) {
        memset(&dummy, 0, sizeof(dummy));
        res = &dummy;
    }
    struct member *m;
    int rc = get_member(p, worker_id, dp_rank, &m);
    if (rc != KVR_OK)
        return rc;
    int first = KVR_OK;
    for (size_t i = 0; i < n; i++)
        first = keep_first(first, store_one(p, m, hashes[i], res));
    return first;
}

int kvr_ckf_producer_remove(kvr_ckf_producer_t *p, uint64_t worker_id, uint32_t dp_rank,
                            const uint64_t *hashes, size_t n, struct kvr_ckf_apply_result *res)
{
    struct kvr_ckf_apply_result dummy;
    if (res == NULL) {
        memset(&dummy, 0, sizeof(dummy));
        res = &dummy;
    }
    struct member *m = find_member(p, worker_id, dp_rank);
    int first = KVR_OK;
    for (size_t i = 0; i < n; i++) {
        if (m == NULL || !ckf_map_get(&m->owned, hashes[i], NULL)) {
            res->unknown++;
            continue;
        }
        if (dirty_reserve(p, 1) != KVR_OK) {
            first = keep_first(first, KVR_ENOMEM);
            continue;
        }
        ckf_map_del(&m->owned, hashes[i], NULL);
        p->edges--;
        res->edges_removed++;
        first = keep_first(first, unref(p, hashes[i], res));
    }
    return first;
}

static int clear_member(kvr_ckf_producer_t *p, struct member *m, struct kvr_ckf_apply_result *res)
{
    if (dirty_reserve(p, m->owned.n) != KVR_OK)
        return KVR_ENOMEM;
    int first = KVR_OK;
    size_t pos = 0;
    uint64_t h, one;
    while (ckf_map_next(&m->owned, &pos, &h, &one)) {
        p->edges--;
        res->edges_removed++;
        first = keep_first(first, unref(p, h, res));
    }
    ckf_map_clear(&m->owned);
    return first;
}

int kvr_ckf_producer_clear_member(kvr_ckf_producer_t *p, uint64_t worker_id, uint32_t dp_rank,
                                  struct kvr_ckf_apply_result *res)
{
    struct kvr_ckf_apply_result dummy;
    memset(&dummy, 0, sizeof(dummy));
    struct member *m = find_member(p, worker_id, dp_rank);
    if (m == NULL)
        return KVR_ENOTFOUND;
    return clear_member(p, m, res != NULL ? res : &dummy);
}

int kvr_ckf_producer_remove_worker(kvr_ckf_producer_t *p, uint64_t worker_id,
                                   struct kvr_ckf_apply_result *res)
{
    struct kvr_ckf_apply_result dummy;
    memset(&dummy, 0, sizeof(dummy));
    if (res == NULL)
        res = &dummy;
    int found = 0, first = KVR_OK;
    for (size_t i = 0; i < p->n_members;) {
        struct member *m = &p->members[i];
        if (m->worker_id != worker_id) {
            i++;
            continue;
        }
        found = 1;
        int rc = clear_member(p, m, res);
        if (rc == KVR_ENOMEM)
            return rc;
        first = keep_first(first, rc);
        ckf_map_free(&m->owned);
        p->members[i] = p->members[--p->n_members];
    }
    return found ? first : KVR_ENOTFOUND;
}

int kvr_ckf_producer_apply(kvr_ckf_producer_t *p, const struct kvr_event *ev,
                           struct kvr_ckf_apply_result *res)
{
    switch (ev->kind) {
    case KVR_EVENT_STORED: {
        int first = KVR_OK;
        for (uint32_t i = 0; i < ev->n; i++)
            first = keep_first(first, kvr_ckf_producer_store(p, ev->worker_id, ev->dp_rank,
                                                             &ev->blocks[i].block_hash, 1, res));
        return first;
    }
    case KVR_EVENT_REMOVED:
        return kvr_ckf_producer_remove(p, ev->worker_id, ev->dp_rank, ev->hashes, ev->n, res);
    case KVR_EVENT_CLEARED: {
        int rc = kvr_ckf_producer_clear_member(p, ev->worker_id, ev->dp_rank, res);
        return rc == KVR_ENOTFOUND ? KVR_OK : rc;
    }
    default:
        return KVR_EINVAL;
    }
}

int kvr_ckf_producer_owns(const kvr_ckf_producer_t *p, uint64_t worker_id, uint32_t dp_rank,
                          uint64_t hash)
{
    const struct member *m = find_member(p, worker_id, dp_rank);
    return m != NULL && ckf_map_get(&m->owned, hash, NULL);
}

uint64_t kvr_ckf_producer_refcount(const kvr_ckf_producer_t *p, uint64_t hash)
{
    uint64_t rc = 0;
    ckf_map_get(&p->refcount, hash, &rc);
    return rc;
}

void kvr_ckf_producer_stats(const kvr_ckf_producer_t *p, struct kvr_ckf_producer_stats *out)
{
    out->members = p->n_members;
    out->edges = p->edges;
    out->distinct = p->refcount.n;
    out->omissions = p->omissions;
    out->epoch = p->epoch;
    out->pending = p->n_dirty;
    out->num_buckets = kvr_ckf_buckets(p->filter);
    out->filter_bytes = kvr_ckf_table_bytes(p->filter);
    out->exact_bytes = p->alloc.live_bytes;
}

/* ==== publication ============================================================================= */

size_t kvr_ckf_producer_delta_len(const kvr_ckf_producer_t *p)
{
    return kvr_ckf_frame_delta_len(p->n_dirty);
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

int kvr_ckf_producer_delta(kvr_ckf_producer_t *p, uint8_t *out, size_t cap, size_t *len)
{
    if (cap < kvr_ckf_frame_delta_len(p->n_dirty))
        return KVR_ERANGE;
    if (p->n_dirty > 1)
        qsort(p->dirty, p->n_dirty, sizeof(*p->dirty), cmp_u64);
    struct kvr_ckf_view v;
    kvr_ckf_view(p->filter, &v);
    int rc = kvr_ckf_frame_encode_delta(&v, p->dc_worker_id, p->epoch, p->dirty, p->n_dirty, out,
                                        cap, len);
    if (rc != KVR_OK)
        return rc;
    for (size_t i = 0; i < p->n_dirty; i++)
        p->dirty_bits[p->dirty[i] >> 6] = 0;
    p->n_dirty = 0;
    p->epoch++;
    return KVR_OK;
}

uint32_t kvr_ckf_producer_snapshot_chunks(const kvr_ckf_producer_t *p)
{
    return kvr_ckf_frame_chunk_count(kvr_ckf_buckets(p->filter));
}

size_t kvr_ckf_producer_snapshot_len(const kvr_ckf_producer_t *p, uint32_t chunk)
{
    return kvr_ckf_frame_snapshot_len(kvr_ckf_buckets(p->filter), chunk);
}

int kvr_ckf_producer_snapshot(const kvr_ckf_producer_t *p, uint32_t chunk, uint8_t *out, size_t cap,
                              size_t *len)
{
    if (p->n_dirty > 0)
        return KVR_EBUSY;
    struct kvr_ckf_view v;
    kvr_ckf_view(p->filter, &v);
    return kvr_ckf_frame_encode_snapshot(&v, p->dc_worker_id, p->epoch, chunk, out, cap, len);
}
