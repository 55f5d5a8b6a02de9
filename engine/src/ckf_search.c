/* ckf_search.c - transposed multi-lane CKF table, probes and the prefix search
 * (kvr/ckf_search.h). SPDX-License-Identifier: Apache-2.0 */
#include "kvr/ckf_search.h"

#include <string.h>

#include "kvr/err.h"

#define ROW_ALIGN 64u

struct kvr_ckf_table {
    kvr_alloc_t alloc;       /* owns this struct and raw */
    void *raw;               /* allocation behind words (over-allocated for alignment) */
    _Atomic uint64_t *words; /* buckets × lanes, 64-byte aligned */
    uint64_t num_buckets;
    uint64_t seed;
    uint32_t lanes;
};

/* ==== table ================================================================================== */

int kvr_ckf_table_new(uint32_t lanes, uint64_t num_buckets, uint64_t seed, kvr_ckf_table_t **out)
{
    if (lanes == 0 || lanes > KVR_CKF_LANES_MAX || !kvr_ckf_buckets_valid(num_buckets) ||
        num_buckets > (SIZE_MAX - ROW_ALIGN) / sizeof(uint64_t) / lanes)
        return KVR_EINVAL;
    kvr_alloc_t a;
    kvr_alloc_init(&a);
    kvr_ckf_table_t *t = kvr_malloc(&a, sizeof(*t));
    if (t == NULL)
        return KVR_ENOMEM;
    size_t bytes = (size_t)num_buckets * lanes * sizeof(uint64_t);
    t->raw = kvr_calloc(&a, 1, bytes + ROW_ALIGN);
    if (t->raw == NULL) {
        kvr_free(&a, t);
        return KVR_ENOMEM;
    }
    uintptr_t p = ((uintptr_t)t->raw + ROW_ALIGN - 1) & ~(uintptr_t)(ROW_ALIGN - 1);
    t->words = (_Atomic uint64_t *)p;
    t->num_buckets = num_buckets;
    t->seed = seed;
    t->lanes = lanes;
    t->alloc = a;
    *out = t;
    return KVR_OK;
}

void kvr_ckf_table_free(kvr_ckf_table_t *t)
{
    if (t == NULL)
        return;
    kvr_alloc_t a = t->alloc;
    kvr_free(&a, t->raw);
    kvr_free(&a, t);
}

kvr_alloc_t *kvr_ckf_table_allocator(kvr_ckf_table_t *t)
{
    return &t->alloc;
}

uint32_t kvr_ckf_table_lanes(const kvr_ckf_table_t *t)
{
    return t->lanes;
}

uint64_t kvr_ckf_table_buckets(const kvr_ckf_table_t *t)
{
    return t->num_buckets;
}

uint64_t kvr_ckf_table_seed(const kvr_ckf_table_t *t)
{
    return t->seed;
}

size_t kvr_ckf_table_words_bytes(const kvr_ckf_table_t *t)
{
    return (size_t)t->num_buckets * t->lanes * sizeof(uint64_t);
}

void kvr_ckf_table_view(const kvr_ckf_table_t *t, uint32_t lane, struct kvr_ckf_view *out)
{
    KVR_ASSERT(lane < t->lanes);
    out->words = t->words;
    out->mask = t->num_buckets - 1;
    out->seed = t->seed;
    out->stride = t->lanes;
    out->lane = lane;
}

uint16_t kvr_ckf_table_probe(const kvr_ckf_table_t *t, uint64_t a, uint64_t b, uint16_t fp)
{
    const uint32_t d = t->lanes;
    _Atomic uint64_t *ra = t->words + a * d, *rb = t->words + b * d;
    for (uint32_t off = 0; off < d; off += ROW_ALIGN / sizeof(uint64_t)) {
        __builtin_prefetch((const void *)(ra + off));
        __builtin_prefetch((const void *)(rb + off));
    }
    uint16_t mask = 0;
    for (uint32_t l = 0; l < d; l++) {
        uint64_t wa = atomic_load_explicit(&ra[l], memory_order_relaxed);
        uint64_t wb = atomic_load_explicit(&rb[l], memory_order_relaxed);
        if ((kvr_ckf_swar_flags(wa, fp) | kvr_ckf_swar_flags(wb, fp)) != 0)
            mask |= (uint16_t)(1u << l);
    }
    return mask;
}

uint16_t kvr_ckf_table_probe_key(const kvr_ckf_table_t *t, const struct kvr_ckf_key *key)
{
    struct kvr_ckf_addr ad;
    kvr_ckf_key_addr(key, t->num_buckets - 1, &ad);
    return kvr_ckf_table_probe(t, ad.a, ad.b, ad.fp);
}

/* ==== prefix search =========================================================================== */

#define FOREACH_LANE(l, mask)                                                                      \
    for (uint32_t m_ = (mask), l = 0; m_ != 0; m_ &= m_ - 1)                                       \
        if ((l = (uint32_t)__builtin_ctz(m_)), 1)

void kvr_ckf_prefix_search(size_t n, uint16_t initial, unsigned window, kvr_ckf_probe_fn probe,
                           void *ctx, uint32_t depths[KVR_CKF_LANES_MAX])
{
    memset(depths, 0, KVR_CKF_LANES_MAX * sizeof(*depths));
    if (window == 0 || window > KVR_CKF_WINDOW)
        window = KVR_CKF_WINDOW;
    if (n == 0)
        return;
    uint16_t active = initial & probe(ctx, 0);
    if (active == 0)
        return;
    size_t lower[KVR_CKF_LANES_MAX], upper[KVR_CKF_LANES_MAX];
    FOREACH_LANE(l, active)
    {
        lower[l] = 0;
        upper[l] = n;
    }

    /* gallop: 1, 2, 4, 8, ... while some lane keeps hitting */
    uint16_t sampling = active;
    for (size_t pos = 1; pos < n && sampling != 0; pos *= 2) {
        uint16_t h = probe(ctx, pos);
        FOREACH_LANE(l, sampling & h)
        lower[l] = pos;
        FOREACH_LANE(l, sampling & (uint16_t)~h)
        upper[l] = pos;
        sampling &= h;
        if (pos > SIZE_MAX / 2)
            break;
    }

    /* batched binary search: lanes sharing a midpoint share its probe */
    for (;;) {
        size_t mids[KVR_CKF_LANES_MAX];
        uint16_t groups[KVR_CKF_LANES_MAX];
        unsigned ng = 0;
        FOREACH_LANE(l, active)
        {
            if (upper[l] - lower[l] <= 1)
                continue;
            size_t mid = lower[l] + (upper[l] - lower[l]) / 2;
            unsigned g = 0;
            while (g < ng && mids[g] != mid)
                g++;
            if (g == ng) {
                mids[ng] = mid;
                groups[ng++] = 0;
            }
            groups[g] |= (uint16_t)(1u << l);
        }
        if (ng == 0)
            break;
        for (unsigned g = 0; g < ng; g++) {
            uint16_t h = probe(ctx, mids[g]);
            FOREACH_LANE(l, groups[g])
            {
                if (h & (1u << l))
                    lower[l] = mids[g];
                else
                    upper[l] = mids[g];
            }
        }
    }

    /* verification: each lane re-checks only its own window [depth - W, depth), ascending */
    size_t lo[KVR_CKF_LANES_MAX], hi[KVR_CKF_LANES_MAX];
    FOREACH_LANE(l, active)
    {
        depths[l] = (uint32_t)upper[l];
        hi[l] = upper[l];
        lo[l] = upper[l] > window ? upper[l] - window : 0;
    }
    uint16_t verifying = active;
    size_t p = SIZE_MAX;
    FOREACH_LANE(l, verifying)
    if (lo[l] < p)
        p = lo[l];
    while (verifying != 0) {
        uint16_t tested = 0;
        FOREACH_LANE(l, verifying)
        if (lo[l] <= p && p < hi[l])
            tested |= (uint16_t)(1u << l);
        if (tested != 0) {
            uint16_t h = probe(ctx, p);
            FOREACH_LANE(l, tested & (uint16_t)~h)
            {
                depths[l] = (uint32_t)p;
                verifying &= (uint16_t) ~(1u << l);
            }
        }
        /* next position of the union of the remaining windows */
        size_t next = SIZE_MAX;
        FOREACH_LANE(l, verifying)
        {
            size_t q = lo[l] > p + 1 ? lo[l] : p + 1;
            if (q < hi[l] && q < next)
                next = q;
        }
        if (next == SIZE_MAX)
            break;
        p = next;
    }
}

void kvr_ckf_prefix_linear(size_t n, uint16_t initial, kvr_ckf_probe_fn probe, void *ctx,
                           uint32_t depths[KVR_CKF_LANES_MAX])
{
    memset(depths, 0, KVR_CKF_LANES_MAX * sizeof(*depths));
    uint16_t mask = initial;
    for (size_t i = 0; i < n && mask != 0; i++) {
        uint16_t next = mask & probe(ctx, i);
        FOREACH_LANE(l, mask & (uint16_t)~next)
        depths[l] = (uint32_t)i;
        mask = next;
    }
    FOREACH_LANE(l, mask)
    depths[l] = (uint32_t)n;
}

/* Probe context over a table and a sequence, with a small memo of masks per position (the
 * verification pass re-probes positions the gallop or binary search already saw). */
#define MEMO 32u
struct table_ctx {
    const kvr_ckf_table_t *t;
    const uint64_t *seq;
    size_t memo_pos[MEMO];
    uint16_t memo_mask[MEMO];
};

static uint16_t table_probe_pos(void *vctx, size_t pos)
{
    struct table_ctx *c = vctx;
    size_t slot = pos % MEMO;
    if (c->memo_pos[slot] == pos)
        return c->memo_mask[slot];
    struct kvr_ckf_key key;
    kvr_ckf_key_make(c->seq[pos], c->t->seed, &key);
    uint16_t m = kvr_ckf_table_probe_key(c->t, &key);
    c->memo_pos[slot] = pos;
    c->memo_mask[slot] = m;
    return m;
}

static void table_ctx_init(struct table_ctx *c, const kvr_ckf_table_t *t, const uint64_t *seq)
{
    c->t = t;
    c->seq = seq;
    for (unsigned i = 0; i < MEMO; i++)
        c->memo_pos[i] = SIZE_MAX;
}

static uint16_t lanes_of(const kvr_ckf_table_t *t, uint16_t lanes)
{
    return t->lanes >= 16 ? lanes : (uint16_t)(lanes & ((1u << t->lanes) - 1));
}

void kvr_ckf_table_search(const kvr_ckf_table_t *t, const uint64_t *seq, size_t n, uint16_t lanes,
                          unsigned window, uint32_t depths[KVR_CKF_LANES_MAX])
{
    struct table_ctx c;
    table_ctx_init(&c, t, seq);
    kvr_ckf_prefix_search(n, lanes_of(t, lanes), window, table_probe_pos, &c, depths);
}

void kvr_ckf_table_search_linear(const kvr_ckf_table_t *t, const uint64_t *seq, size_t n,
                                 uint16_t lanes, uint32_t depths[KVR_CKF_LANES_MAX])
{
    struct table_ctx c;
    table_ctx_init(&c, t, seq);
    kvr_ckf_prefix_linear(n, lanes_of(t, lanes), table_probe_pos, &c, depths);
}
