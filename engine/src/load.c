/* load.c - per-rank active load tracking (ActiveSequences; see kvr/load.h for the design).
 * SPDX-License-Identifier: Apache-2.0 */
#include "kvr/load.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "u64map.h"

#define DEFAULT_BLOCK_SIZE 16u
#define DEFAULT_EXPIRY_MS 300000u
#define DEFAULT_CHECK_MS 30000u

struct rank {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t live;            /* 0 once removed by kvr_load_remove_worker (slot reusable) */
    uint64_t prefill_tokens;  /* active prefill tokens */
    uint64_t requests;        /* active requests */
    struct kvr_u64map blocks; /* sequence hash -> references from active requests */
};

/* One active request; on the tracker's list in add order (for expiry scans). */
/* Intrusive list link; first member of struct req (which ends in a flexible array, so the list
 * sentinel is a bare link rather than a struct req). */
struct link {
    struct link *prev, *next;
};

struct req {
    struct link l;
    uint64_t id;
    uint64_t added_ms;
    uint64_t prefill; /* prefill tokens still counted on the rank (0 once done) */
    uint32_t rank;    /* index into ranks[] */
    uint32_t done;    /* 1 once the first token came back */
    uint32_t origin;  /* 0 = this process; else the remote replica that booked it */
    uint32_t pad_;
    size_t n;          /* sequence hashes */
    uint64_t hashes[]; /* n hashes */
};

struct kvr_load {
    pthread_mutex_t mu;
    kvr_alloc_t alloc;
    struct kvr_load_config cfg;
    struct rank *ranks; /* ranks[0..n_ranks) */
    size_t n_ranks, cap_ranks;
    struct kvr_u64map rank_ix; /* rank key -> index (collisions fall back to a scan) */
    struct kvr_u64map reqs;    /* request id -> struct req * */
    struct link head;          /* list sentinel (oldest first) */
    uint64_t last_check_ms;
    struct kvr_load_stats st; /* counters (ranks/active/bytes filled on read) */
};

/* ==== ranks ================================================================================== */

static uint64_t rank_key(uint64_t worker_id, uint32_t dp_rank)
{
    return worker_id * 0x9E3779B97F4A7C15ull ^ ((uint64_t)dp_rank + 1) * 0xC2B2AE3D27D4EB4Full;
}

static long rank_find(const struct kvr_load *ld, uint64_t worker_id, uint32_t dp_rank)
{
    const uint64_t *ix = kvr_u64map_get(&ld->rank_ix, rank_key(worker_id, dp_rank));
    if (ix != NULL) {
        const struct rank *r = &ld->ranks[*ix];
        if (r->live && r->worker_id == worker_id && r->dp_rank == dp_rank)
            return (long)*ix;
    }
    for (size_t i = 0; i < ld->n_ranks; i++) /* key collision (or absent): exact scan */
        if (ld->ranks[i].live && ld->ranks[i].worker_id == worker_id &&
            ld->ranks[i].dp_rank == dp_rank)
            return (long)i;
    return -1;
}

/* Finds or creates a rank; *created tells whether it is new (so a failed add can drop it). */
static int rank_get(struct kvr_load *ld, uint64_t worker_id, uint32_t dp_rank, size_t *out,
                    int *created)
{
    long f = rank_find(ld, worker_id, dp_rank);
    *created = 0;
    if (f >= 0) {
        *out = (size_t)f;
        return KVR_OK;
    }
    size_t slot = ld->n_ranks;
    for (size_t i = 0; i < ld->n_ranks; i++)
        if (!ld->ranks[i].live) {
            slot = i;
            break;
        }
    if (slot == ld->n_ranks && ld->n_ranks == ld->cap_ranks) {
        size_t cap = ld->cap_ranks ? ld->cap_ranks * 2 : 8;
        struct rank *r = kvr_realloc(&ld->alloc, ld->ranks, cap * sizeof(*r));
        if (r == NULL)
            return KVR_ENOMEM;
        ld->ranks = r;
        ld->cap_ranks = cap;
    }
    uint64_t key = rank_key(worker_id, dp_rank);
    if (kvr_u64map_get(&ld->rank_ix, key) == NULL &&
        kvr_u64map_put(&ld->rank_ix, key, slot) != KVR_OK)
        return KVR_ENOMEM;
    struct rank *r = &ld->ranks[slot];
    memset(r, 0, sizeof(*r));
    r->worker_id = worker_id;
    r->dp_rank = dp_rank;
    r->live = 1;
    kvr_u64map_init(&r->blocks, &ld->alloc);
    if (slot == ld->n_ranks)
        ld->n_ranks++;
    *out = slot;
    *created = 1;
    return KVR_OK;
}

static void rank_drop(struct kvr_load *ld, size_t i)
{
    struct rank *r = &ld->ranks[i];
    uint64_t key = rank_key(r->worker_id, r->dp_rank);
    const uint64_t *ix = kvr_u64map_get(&ld->rank_ix, key);
    if (ix != NULL && *ix == i)
        kvr_u64map_del(&ld->rank_ix, key);
    kvr_u64map_destroy(&r->blocks);
    r->live = 0;
    if (i + 1 == ld->n_ranks)
        ld->n_ranks--;
}

/* ==== requests =============================================================================== */

static void notify(struct kvr_load *ld, int kind, const struct req *q, uint64_t now_ms)
{
    if (ld->cfg.observer == NULL)
        return;
    const struct rank *r = &ld->ranks[q->rank];
    struct kvr_load_op op = {.kind = kind,
                             .dp_rank = r->dp_rank,
                             .worker_id = r->worker_id,
                             .request_id = q->id,
                             .now_ms = now_ms,
                             .origin = q->origin};
    ld->cfg.observer(ld->cfg.observer_ctx, &op);
}

static void prefill_done(struct kvr_load *ld, struct req *q)
{
    ld->ranks[q->rank].prefill_tokens -= q->prefill;
    q->prefill = 0;
}

/* Unlinks and frees a request, dropping its references. */
static void req_drop(struct kvr_load *ld, struct req *q)
{
    struct rank *r = &ld->ranks[q->rank];
    prefill_done(ld, q);
    for (size_t i = 0; i < q->n; i++) {
        uint64_t *refs = kvr_u64map_get(&r->blocks, q->hashes[i]);
        KVR_ASSERT(refs != NULL && *refs > 0);
        if (--*refs == 0)
            kvr_u64map_del(&r->blocks, q->hashes[i]);
    }
    r->requests--;
    kvr_u64map_del(&ld->reqs, q->id);
    q->l.prev->next = q->l.next;
    q->l.next->prev = q->l.prev;
    kvr_free(&ld->alloc, q);
}

/* Ends a request: tells the observer (kind), drops it, counts it in *count. */
static void req_end(struct kvr_load *ld, struct req *q, int kind, uint64_t now_ms, uint64_t *count)
{
    notify(ld, kind, q, now_ms);
    req_drop(ld, q);
    (*count)++;
}

static struct req *req_find(const struct kvr_load *ld, uint64_t id)
{
    const uint64_t *p = kvr_u64map_get(&ld->reqs, id);
    return p ? (struct req *)(uintptr_t)*p : NULL;
}

static size_t expire_locked(struct kvr_load *ld, uint64_t now_ms)
{
    size_t n = 0;
    ld->last_check_ms = now_ms;
    for (struct link *it = ld->head.next, *next; it != &ld->head; it = next) {
        struct req *q = (struct req *)it;
        next = it->next;
        if (now_ms >= q->added_ms && now_ms - q->added_ms >= ld->cfg.expiry_ms) {
            req_end(ld, q, KVR_LOAD_OP_EXPIRE, now_ms, &ld->st.expired);
            n++;
        }
    }
    return n;
}

/* ==== public API ============================================================================= */

int kvr_load_new(const struct kvr_load_config *cfg, kvr_load_t **out)
{
    struct kvr_load_config c = {0};
    if (cfg != NULL)
        c = *cfg;
    if (c.block_size == 0)
        c.block_size = DEFAULT_BLOCK_SIZE;
    if (c.block_size < 2)
        return KVR_EINVAL; /* Dynamo asserts block_size > 1 */
    if (c.expiry_ms == 0)
        c.expiry_ms = DEFAULT_EXPIRY_MS;
    if (c.expiry_check_ms == 0)
        c.expiry_check_ms = DEFAULT_CHECK_MS;
    struct kvr_load *ld = calloc(1, sizeof(*ld));
    if (ld == NULL)
        return KVR_ENOMEM;
    if (pthread_mutex_init(&ld->mu, NULL) != 0) {
        free(ld);
        return KVR_ENOMEM;
    }
    kvr_alloc_init(&ld->alloc);
    ld->cfg = c;
    kvr_u64map_init(&ld->rank_ix, &ld->alloc);
    kvr_u64map_init(&ld->reqs, &ld->alloc);
    ld->head.next = ld->head.prev = &ld->head;
    *out = ld;
    return KVR_OK;
}

void kvr_load_free(kvr_load_t *ld)
{
    if (ld == NULL)
        return;
    for (struct link *it = ld->head.next, *next; it != &ld->head; it = next) {
        struct req *q = (struct req *)it;
        next = it->next;
        kvr_free(&ld->alloc, q);
    }
    for (size_t i = 0; i < ld->n_ranks; i++)
        kvr_u64map_destroy(&ld->ranks[i].blocks);
    kvr_free(&ld->alloc, ld->ranks);
    kvr_u64map_destroy(&ld->rank_ix);
    kvr_u64map_destroy(&ld->reqs);
    pthread_mutex_destroy(&ld->mu);
    free(ld);
}

kvr_alloc_t *kvr_load_allocator(kvr_load_t *ld)
{
    return &ld->alloc;
}

int kvr_load_add(kvr_load_t *ld, const struct kvr_load_request *rq, uint64_t now_ms)
{
    if (rq->n_hashes > 0 && rq->seq_hashes == NULL)
        return KVR_EINVAL;
    if (rq->n_hashes > (SIZE_MAX - sizeof(struct req)) / sizeof(uint64_t))
        return KVR_ENOMEM;
    pthread_mutex_lock(&ld->mu);
    int rc = KVR_OK;
    if (now_ms >= ld->last_check_ms && now_ms - ld->last_check_ms >= ld->cfg.expiry_check_ms)
        expire_locked(ld, now_ms);
    if (req_find(ld, rq->request_id) != NULL) {
        ld->st.duplicates++;
        rc = KVR_EEXIST;
        goto out;
    }
    /* Everything that can fail comes first, so a failure changes nothing. */
    struct req *q = kvr_malloc(&ld->alloc, sizeof(*q) + rq->n_hashes * sizeof(uint64_t));
    if (q == NULL || kvr_u64map_reserve(&ld->reqs, 1) != KVR_OK) {
        kvr_free(&ld->alloc, q);
        rc = KVR_ENOMEM;
        goto out;
    }
    size_t ri;
    int created;
    if (rank_get(ld, rq->worker_id, rq->dp_rank, &ri, &created) != KVR_OK) {
        kvr_free(&ld->alloc, q);
        rc = KVR_ENOMEM;
        goto out;
    }
    struct rank *r = &ld->ranks[ri];
    if (kvr_u64map_reserve(&r->blocks, rq->n_hashes) != KVR_OK) {
        if (created)
            rank_drop(ld, ri);
        kvr_free(&ld->alloc, q);
        rc = KVR_ENOMEM;
        goto out;
    }
    uint64_t cached = (uint64_t)rq->overlap_blocks * ld->cfg.block_size;
    q->id = rq->request_id;
    q->added_ms = now_ms;
    q->prefill = rq->track_prefill && rq->isl_tokens > cached ? rq->isl_tokens - cached : 0;
    q->rank = (uint32_t)ri;
    q->done = 0;
    q->origin = rq->origin;
    q->pad_ = 0;
    q->n = rq->n_hashes;
    if (q->n > 0)
        memcpy(q->hashes, rq->seq_hashes, q->n * sizeof(uint64_t));
    for (size_t i = 0; i < q->n; i++) {
        uint64_t *refs = kvr_u64map_get(&r->blocks, q->hashes[i]);
        if (refs != NULL)
            (*refs)++;
        else
            KVR_ASSERT(kvr_u64map_put(&r->blocks, q->hashes[i], 1) == KVR_OK); /* reserved */
    }
    KVR_ASSERT(kvr_u64map_put(&ld->reqs, q->id, (uint64_t)(uintptr_t)q) == KVR_OK);
    q->l.prev = ld->head.prev;
    q->l.next = &ld->head;
    ld->head.prev->next = &q->l;
    ld->head.prev = &q->l;
    r->prefill_tokens += q->prefill;
    r->requests++;
    ld->st.added++;
    if (ld->cfg.observer != NULL) {
        struct kvr_load_op op = {.kind = KVR_LOAD_OP_ADD,
                                 .dp_rank = rq->dp_rank,
                                 .worker_id = rq->worker_id,
                                 .request_id = rq->request_id,
                                 .now_ms = now_ms,
                                 .isl_tokens = rq->isl_tokens,
                                 .overlap_blocks = rq->overlap_blocks,
                                 .track_prefill = rq->track_prefill ? 1u : 0u,
                                 .origin = q->origin,
                                 .prefill_tokens = q->prefill,
                                 .seq_hashes = q->hashes,
                                 .n_hashes = q->n};
        ld->cfg.observer(ld->cfg.observer_ctx, &op);
    }
out:
    pthread_mutex_unlock(&ld->mu);
    return rc;
}

int kvr_load_first_token(kvr_load_t *ld, uint64_t request_id, uint64_t now_ms)
{
    pthread_mutex_lock(&ld->mu);
    struct req *q = req_find(ld, request_id);
    int rc = KVR_OK;
    if (q == NULL) {
        ld->st.unknown++;
        rc = KVR_ENOTFOUND;
    } else if (!q->done) {
        prefill_done(ld, q);
        q->done = 1;
        ld->st.first_tokens++;
        notify(ld, KVR_LOAD_OP_FIRST_TOKEN, q, now_ms);
    }
    pthread_mutex_unlock(&ld->mu);
    return rc;
}

int kvr_load_release(kvr_load_t *ld, uint64_t request_id, uint64_t now_ms)
{
    pthread_mutex_lock(&ld->mu);
    struct req *q = req_find(ld, request_id);
    int rc = KVR_OK;
    if (q == NULL) {
        ld->st.unknown++;
        rc = KVR_ENOTFOUND;
    } else {
        req_end(ld, q, KVR_LOAD_OP_RELEASE, now_ms, &ld->st.released);
    }
    pthread_mutex_unlock(&ld->mu);
    return rc;
}

size_t kvr_load_expire(kvr_load_t *ld, uint64_t now_ms)
{
    pthread_mutex_lock(&ld->mu);
    size_t n = expire_locked(ld, now_ms);
    pthread_mutex_unlock(&ld->mu);
    return n;
}

size_t kvr_load_release_origin(kvr_load_t *ld, uint32_t origin, uint64_t now_ms)
{
    size_t n = 0;
    pthread_mutex_lock(&ld->mu);
    for (struct link *it = ld->head.next, *next; it != &ld->head; it = next) {
        struct req *q = (struct req *)it;
        next = it->next;
        if (q->origin == origin) {
            req_end(ld, q, KVR_LOAD_OP_RELEASE, now_ms, &ld->st.released);
            n++;
        }
    }
    pthread_mutex_unlock(&ld->mu);
    return n;
}

size_t kvr_load_origin_foreach(kvr_load_t *ld, uint32_t origin,
                               void (*fn)(void *ctx, const struct kvr_load_op *op), void *ctx)
{
    size_t n = 0;
    pthread_mutex_lock(&ld->mu);
    for (struct link *it = ld->head.next; it != &ld->head; it = it->next) {
        const struct req *q = (const struct req *)it;
        if (q->origin != origin)
            continue;
        const struct rank *r = &ld->ranks[q->rank];
        struct kvr_load_op op = {.kind = KVR_LOAD_OP_ADD,
                                 .dp_rank = r->dp_rank,
                                 .worker_id = r->worker_id,
                                 .request_id = q->id,
                                 .now_ms = q->added_ms,
                                 .isl_tokens =
                                     q->prefill > UINT32_MAX ? UINT32_MAX : (uint32_t)q->prefill,
                                 .overlap_blocks = 0,
                                 .track_prefill = 1,
                                 .origin = q->origin,
                                 .prefill_tokens = q->prefill,
                                 .seq_hashes = q->n ? q->hashes : NULL,
                                 .n_hashes = q->n};
        fn(ctx, &op);
        n++;
    }
    pthread_mutex_unlock(&ld->mu);
    return n;
}

size_t kvr_load_remove_worker(kvr_load_t *ld, uint64_t worker_id)
{
    size_t n = 0;
    pthread_mutex_lock(&ld->mu);
    for (struct link *it = ld->head.next, *next; it != &ld->head; it = next) {
        struct req *q = (struct req *)it;
        next = it->next;
        if (ld->ranks[q->rank].worker_id == worker_id) {
            req_drop(ld, q);
            n++;
        }
    }
    for (size_t i = ld->n_ranks; i-- > 0;)
        if (ld->ranks[i].live && ld->ranks[i].worker_id == worker_id)
            rank_drop(ld, i);
    pthread_mutex_unlock(&ld->mu);
    return n;
}

static void fill_rank(const struct rank *r, struct kvr_load_rank *out)
{
    out->worker_id = r->worker_id;
    out->dp_rank = r->dp_rank;
    out->pad_ = 0;
    out->prefill_tokens = r->prefill_tokens;
    out->active_blocks = kvr_u64map_size(&r->blocks);
    out->requests = r->requests;
}

int kvr_load_rank_get(kvr_load_t *ld, uint64_t worker_id, uint32_t dp_rank,
                      struct kvr_load_rank *out)
{
    pthread_mutex_lock(&ld->mu);
    long i = rank_find(ld, worker_id, dp_rank);
    if (i >= 0) {
        fill_rank(&ld->ranks[i], out);
    } else {
        memset(out, 0, sizeof(*out));
        out->worker_id = worker_id;
        out->dp_rank = dp_rank;
    }
    pthread_mutex_unlock(&ld->mu);
    return i >= 0;
}

int kvr_load_ranks(kvr_load_t *ld, struct kvr_load_rank *out, size_t cap, size_t *n_out)
{
    size_t n = 0;
    pthread_mutex_lock(&ld->mu);
    for (size_t i = 0; i < ld->n_ranks; i++) {
        if (!ld->ranks[i].live)
            continue;
        if (n < cap)
            fill_rank(&ld->ranks[i], &out[n]);
        n++;
    }
    pthread_mutex_unlock(&ld->mu);
    *n_out = n;
    return n <= cap ? KVR_OK : KVR_ERANGE;
}

void kvr_load_query(kvr_load_t *ld, const uint64_t *seq, size_t n_seq, struct kvr_load_query *q,
                    size_t n_q)
{
    pthread_mutex_lock(&ld->mu);
    for (size_t k = 0; k < n_q; k++) {
        long i = rank_find(ld, q[k].worker_id, q[k].dp_rank);
        if (i < 0) {
            q[k].known = 0;
            q[k].prefill_tokens = q[k].active_blocks = q[k].requests = 0;
            q[k].new_blocks = n_seq;
            continue;
        }
        const struct rank *r = &ld->ranks[i];
        uint64_t fresh = 0;
        for (size_t j = 0; j < n_seq; j++)
            fresh += kvr_u64map_get(&r->blocks, seq[j]) == NULL;
        q[k].known = 1;
        q[k].prefill_tokens = r->prefill_tokens;
        q[k].active_blocks = kvr_u64map_size(&r->blocks);
        q[k].requests = r->requests;
        q[k].new_blocks = fresh;
    }
    pthread_mutex_unlock(&ld->mu);
}

void kvr_load_stats(kvr_load_t *ld, struct kvr_load_stats *out)
{
    pthread_mutex_lock(&ld->mu);
    *out = ld->st;
    out->ranks = 0;
    for (size_t i = 0; i < ld->n_ranks; i++)
        out->ranks += ld->ranks[i].live;
    out->active = kvr_u64map_size(&ld->reqs);
    out->bytes = ld->alloc.live_bytes;
    pthread_mutex_unlock(&ld->mu);
}
