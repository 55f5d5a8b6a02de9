/* approx.c - approximate mode: TTL timers and size pruning over an index (see kvr/approx.h). */
#include "kvr/approx.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "kvr/hash.h"

#define DEFAULT_TTL_MS 120000u
#define DEFAULT_MAX ((size_t)1 << 20)
#define DEFAULT_RATIO 0.8

struct key {
    uint64_t worker;
    uint64_t ext;
    uint32_t dp;
    uint32_t used; /* map: 1 = occupied */
};

struct timer {
    uint64_t expiry;
    uint32_t depth;
    uint32_t dp;
    uint64_t worker;
    uint64_t ext;
};

struct slot {
    struct key k;
    uint64_t expiry; /* the block's current expiry; timers with another expiry are stale */
};

struct kvr_approx {
    pthread_mutex_t mu;
    kvr_index_t *idx;
    uint64_t ttl;
    size_t max_blocks;
    size_t target;
    struct slot *map; /* open addressing, linear probing */
    size_t map_cap, map_n;
    struct timer *heap; /* binary min-heap: earliest expiry, then deepest */
    size_t heap_n, heap_cap;
    struct kvr_approx_stats st;
    kvr_approx_observer_fn observer; /* optional (borrowed ctx below) */
    void *observer_ctx;
};

/* ==== map (worker, dp, ext) -> current expiry ============================================== */

static uint64_t key_hash(uint64_t worker, uint32_t dp, uint64_t ext)
{
    uint64_t x = ext ^ (worker * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)dp << 47);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int key_eq(const struct key *k, uint64_t worker, uint32_t dp, uint64_t ext)
{
    return k->worker == worker && k->dp == dp && k->ext == ext;
}

static struct slot *map_find(struct kvr_approx *a, uint64_t worker, uint32_t dp, uint64_t ext)
{
    if (a->map_cap == 0)
        return NULL;
    size_t i = key_hash(worker, dp, ext) & (a->map_cap - 1);
    while (a->map[i].k.used) {
        if (key_eq(&a->map[i].k, worker, dp, ext))
            return &a->map[i];
        i = (i + 1) & (a->map_cap - 1);
    }
    return NULL;
}

static void map_place(struct slot *m, size_t cap, const struct slot *s)
{
    size_t i = key_hash(s->k.worker, s->k.dp, s->k.ext) & (cap - 1);
    while (m[i].k.used)
        i = (i + 1) & (cap - 1);
    m[i] = *s;
}

static int map_reserve(struct kvr_approx *a, size_t extra)
{
    if ((a->map_n + extra) * 4 <= a->map_cap * 3)
        return KVR_OK;
    size_t cap = a->map_cap ? a->map_cap : 64;
    while ((a->map_n + extra) * 4 > cap * 3)
        cap *= 2;
    struct slot *m = calloc(cap, sizeof(*m));
    if (m == NULL)
        return KVR_ENOMEM;
    for (size_t i = 0; i < a->map_cap; i++)
        if (a->map[i].k.used)
            map_place(m, cap, &a->map[i]);
    free(a->map);
    a->map = m;
    a->map_cap = cap;
    return KVR_OK;
}

static void map_del(struct kvr_approx *a, struct slot *s)
{
    size_t i = (size_t)(s - a->map), mask = a->map_cap - 1, j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!a->map[j].k.used)
            break;
        size_t home = key_hash(a->map[j].k.worker, a->map[j].k.dp, a->map[j].k.ext) & mask;
        int stays = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            a->map[i] = a->map[j];
            i = j;
        }
    }
    a->map[i].k.used = 0;
    a->map_n--;
}

/* ==== timer heap ============================================================================ */

static int before(const struct timer *x, const struct timer *y)
{
    if (x->expiry != y->expiry)
        return x->expiry < y->expiry;
    return x->depth > y->depth;
}

static int heap_reserve(struct kvr_approx *a, size_t extra)
{
    if (a->heap_n + extra <= a->heap_cap)
        return KVR_OK;
    size_t cap = a->heap_cap ? a->heap_cap : 64;
    while (cap < a->heap_n + extra)
        cap *= 2;
    struct timer *h = realloc(a->heap, cap * sizeof(*h));
    if (h == NULL)
        return KVR_ENOMEM;
    a->heap = h;
    a->heap_cap = cap;
    return KVR_OK;
}

static void heap_push(struct kvr_approx *a, struct timer t)
{
    size_t i = a->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&t, &a->heap[p]))
            break;
        a->heap[i] = a->heap[p];
        i = p;
    }
    a->heap[i] = t;
}

static struct timer heap_pop(struct kvr_approx *a)
{
    struct timer top = a->heap[0], last = a->heap[--a->heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= a->heap_n)
            break;
        if (c + 1 < a->heap_n && before(&a->heap[c + 1], &a->heap[c]))
            c++;
        if (!before(&a->heap[c], &last))
            break;
        a->heap[i] = a->heap[c];
        i = c;
    }
    if (a->heap_n > 0)
        a->heap[i] = last;
    return top;
}

/* ==== core ================================================================================== */

int kvr_approx_new(kvr_index_t *idx, const struct kvr_approx_config *cfg, kvr_approx_t **out)
{
    struct kvr_approx_config c = {0};
    if (cfg != NULL)
        c = *cfg;
    if (c.prune_ratio < 0 || c.prune_ratio > 1 || idx == NULL)
        return KVR_EINVAL;
    struct kvr_approx *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return KVR_ENOMEM;
    if (pthread_mutex_init(&a->mu, NULL) != 0) {
        free(a);
        return KVR_ENOMEM;
    }
    a->idx = idx;
    a->observer = c.observer;
    a->observer_ctx = c.observer_ctx;
    a->ttl = c.ttl_ms ? c.ttl_ms : DEFAULT_TTL_MS;
    a->max_blocks = c.max_blocks ? c.max_blocks : DEFAULT_MAX;
    a->target =
        (size_t)floor((double)a->max_blocks * (c.prune_ratio > 0 ? c.prune_ratio : DEFAULT_RATIO));
    *out = a;
    return KVR_OK;
}

void kvr_approx_free(kvr_approx_t *a)
{
    if (a == NULL)
        return;
    pthread_mutex_destroy(&a->mu);
    free(a->map);
    free(a->heap);
    free(a);
}

/* Removes the block a (current) timer names from the index and the map. */
static void drop_block(struct kvr_approx *a, const struct timer *t, struct slot *s)
{
    struct kvr_event ev = {.worker_id = t->worker,
                           .dp_rank = t->dp,
                           .kind = KVR_EVENT_REMOVED,
                           .n = 1,
                           .hashes = (uint64_t *)&t->ext};
    (void)kvr_index_apply(a->idx, &ev); /* BlockNotFound is fine: an ancestor went first */
    map_del(a, s);
}

/* Pops the earliest timer; returns 1 if it was current (block removed), 0 if stale. */
static int pop_one(struct kvr_approx *a)
{
    struct timer t = heap_pop(a);
    struct slot *s = map_find(a, t.worker, t.dp, t.ext);
    if (s == NULL || s->expiry != t.expiry)
        return 0;
    drop_block(a, &t, s);
    return 1;
}

static size_t expire_locked(struct kvr_approx *a, uint64_t now)
{
    size_t n = 0;
    while (a->heap_n > 0 && a->heap[0].expiry <= now)
        n += (size_t)pop_one(a);
    a->st.expired_blocks += n;
    return n;
}

/* (block, rank) pairs in the index (a CKF-only index has no tree: its ownership entries). */
static size_t index_size(struct kvr_approx *a)
{
    return kvr_index_block_ranks(a->idx);
}

static void prune_locked(struct kvr_approx *a)
{
    size_t size = index_size(a);
    if (size <= a->max_blocks)
        return;
    while (size > a->target && a->heap_n > 0) {
        if (pop_one(a)) {
            a->st.pruned_blocks++;
            size = index_size(a);
        }
    }
}

static int record(kvr_approx_t *a, uint64_t worker_id, uint32_t dp_rank, const uint64_t *locals,
                  size_t n, uint64_t now_ms, int notify)
{
    if (n == 0)
        return KVR_OK;
    if (n > UINT32_MAX / 2)
        return KVR_EINVAL;
    struct kvr_block *b = malloc(n * sizeof(*b));
    if (b == NULL)
        return KVR_ENOMEM;
    uint64_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        prev = i == 0 ? locals[0] : kvr_hash_seq_next(prev, locals[i]);
        b[i].tokens_hash = locals[i];
        b[i].block_hash = prev;
    }
    pthread_mutex_lock(&a->mu);
    expire_locked(a, now_ms);
    int rc = KVR_ENOMEM;
    if (map_reserve(a, n) == KVR_OK && heap_reserve(a, n) == KVR_OK) {
        struct kvr_event ev = {.worker_id = worker_id,
                               .dp_rank = dp_rank,
                               .kind = KVR_EVENT_STORED,
                               .n = (uint32_t)n,
                               .blocks = b};
        rc = kvr_index_apply(a->idx, &ev);
        if (rc == KVR_OK) {
            uint64_t expiry = now_ms + a->ttl;
            for (size_t i = 0; i < n; i++) {
                struct slot *s = map_find(a, worker_id, dp_rank, b[i].block_hash);
                if (s == NULL) {
                    struct slot ns = {
                        .k = {
                            .worker = worker_id, .ext = b[i].block_hash, .dp = dp_rank, .used = 1}};
                    map_place(a->map, a->map_cap, &ns);
                    a->map_n++;
                    s = map_find(a, worker_id, dp_rank, b[i].block_hash);
                }
                s->expiry = expiry;
                heap_push(a, (struct timer){.expiry = expiry,
                                            .depth = (uint32_t)i,
                                            .dp = dp_rank,
                                            .worker = worker_id,
                                            .ext = b[i].block_hash});
            }
            a->st.recorded_blocks += n;
            prune_locked(a);
            if (notify && a->observer != NULL)
                a->observer(a->observer_ctx, worker_id, dp_rank, locals, n, now_ms);
        }
    }
    pthread_mutex_unlock(&a->mu);
    free(b);
    return rc;
}

int kvr_approx_record(kvr_approx_t *a, uint64_t worker_id, uint32_t dp_rank, const uint64_t *locals,
                      size_t n, uint64_t now_ms)
{
    return record(a, worker_id, dp_rank, locals, n, now_ms, 1);
}

int kvr_approx_record_quiet(kvr_approx_t *a, uint64_t worker_id, uint32_t dp_rank,
                            const uint64_t *locals, size_t n, uint64_t now_ms)
{
    return record(a, worker_id, dp_rank, locals, n, now_ms, 0);
}

size_t kvr_approx_expire(kvr_approx_t *a, uint64_t now_ms)
{
    pthread_mutex_lock(&a->mu);
    size_t n = expire_locked(a, now_ms);
    pthread_mutex_unlock(&a->mu);
    return n;
}

void kvr_approx_forget_worker(kvr_approx_t *a, uint64_t worker_id)
{
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->map_cap;) {
        if (a->map[i].k.used && a->map[i].k.worker == worker_id)
            map_del(a, &a->map[i]); /* an entry may shift into i: look at i again */
        else
            i++;
    }
    pthread_mutex_unlock(&a->mu);
}

void kvr_approx_stats(kvr_approx_t *a, struct kvr_approx_stats *out)
{
    pthread_mutex_lock(&a->mu);
    *out = a->st;
    out->tracked = a->map_n;
    pthread_mutex_unlock(&a->mu);
}
