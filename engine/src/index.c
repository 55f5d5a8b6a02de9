/* index.c - the thread-safe index: a radix tree behind a writer-preferring rwlock, with event
 * application in bounded lock holds (see kvr/index.h for the design). */
#include "kvr/index.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "rwlock.h"

#define DEFAULT_MAX_HOLD 1024u

struct kvr_index {
    struct kvr_rwlock lock;
    kvr_radix_t *radix;   /* NULL for a CKF-only index */
    kvr_ckf_index_t *ckf; /* NULL for a radix-only index */
    int kind;
    uint32_t max_hold;
    atomic_ullong queries;
    struct kvr_index_counters c; /* written under the write lock */
};

int kvr_index_new(const struct kvr_index_config *cfg, kvr_index_t **out)
{
    struct kvr_index_config def = {.kind = KVR_INDEX_RADIX, .max_hold_blocks = DEFAULT_MAX_HOLD};
    if (cfg == NULL)
        cfg = &def;
    int kind = cfg->kind ? cfg->kind : KVR_INDEX_RADIX;
    if (kind != KVR_INDEX_RADIX && kind != KVR_INDEX_CKF && kind != KVR_INDEX_BOTH)
        return KVR_EINVAL;
    struct kvr_index *idx = calloc(1, sizeof(*idx));
    if (idx == NULL)
        return KVR_ENOMEM;
    if (kvr_rwlock_init(&idx->lock) != 0) {
        free(idx);
        return KVR_ENOMEM;
    }
    int rc = KVR_OK;
    if (kind != KVR_INDEX_CKF)
        rc = kvr_radix_new(&idx->radix);
    if (rc == KVR_OK && kind != KVR_INDEX_RADIX)
        rc = kvr_ckf_index_new(cfg->ckf, &idx->ckf);
    if (rc != KVR_OK) {
        kvr_radix_free(idx->radix);
        kvr_rwlock_destroy(&idx->lock);
        free(idx);
        return rc;
    }
    idx->kind = kind;
    idx->max_hold = cfg->max_hold_blocks ? cfg->max_hold_blocks : DEFAULT_MAX_HOLD;
    atomic_init(&idx->queries, 0);
    *out = idx;
    return KVR_OK;
}

void kvr_index_free(kvr_index_t *idx)
{
    if (idx == NULL)
        return;
    kvr_radix_free(idx->radix);
    kvr_ckf_index_free(idx->ckf);
    kvr_rwlock_destroy(&idx->lock);
    free(idx);
}

kvr_radix_t *kvr_index_radix(kvr_index_t *idx)
{
    return idx->radix;
}

kvr_ckf_index_t *kvr_index_ckf(kvr_index_t *idx)
{
    return idx->ckf;
}

int kvr_index_kind(const kvr_index_t *idx)
{
    return idx->kind;
}

/* ==== locking =============================================================================== */

static void wlock(struct kvr_index *idx)
{
    kvr_rwlock_wrlock(&idx->lock);
}

static void wunlock(struct kvr_index *idx)
{
    kvr_rwlock_wrunlock(&idx->lock);
}

/* Between bounded holds: lets waiting readers in, then takes the lock back. */
static void wbreathe(struct kvr_index *idx)
{
    kvr_rwlock_breathe(&idx->lock);
}

static void rlock(struct kvr_index *idx)
{
    kvr_rwlock_rdlock(&idx->lock);
}

static void runlock(struct kvr_index *idx)
{
    kvr_rwlock_rdunlock(&idx->lock);
}

/* ==== event application ===================================================================== */

static void count_result(struct kvr_index_counters *c, int rc, size_t not_found)
{
    switch (rc) {
    case KVR_OK:
        break;
    case KVR_EPARENT:
        c->err_parent++;
        break;
    case KVR_ENOBLOCK:
        c->err_block += not_found ? not_found : 1;
        break;
    case KVR_EINVALSEQ:
        c->err_invalid_seq++;
        break;
    case KVR_ENOMEM:
        c->err_nomem++;
        break;
    default:
        c->err_other++;
        break;
    }
}

/* Applies one event under the write lock (held on entry and exit), releasing it between chunks
 * of at most max_hold block operations. *budget counts operations since the last release. */
static int apply_locked(struct kvr_index *idx, const struct kvr_event *ev, uint32_t *budget)
{
    struct kvr_index_counters *c = &idx->c;
    int rc = KVR_OK;
    if (ev->kind >= KVR_EVENT_STORED && ev->kind <= KVR_EVENT_CLEARED)
        c->events[ev->kind]++;
    else
        c->events[0]++;
    if (ev->tier != KVR_TIER_DEVICE) {
        c->non_device++;
        return KVR_OK;
    }
    if (ev->domain > KVR_DOMAIN_CACHE_OWNER) {
        c->err_other++;
        return KVR_EDOMAIN;
    }
    if (idx->ckf != NULL) {
        /* The CKF takes the whole event at once (its per-block work is a few probes). */
        int crc = kvr_ckf_index_apply(idx->ckf, ev);
        *budget += ev->n;
        if (idx->radix == NULL) {
            if (ev->kind == KVR_EVENT_STORED)
                c->blocks_stored += ev->n;
            else if (ev->kind == KVR_EVENT_REMOVED)
                c->blocks_removed += ev->n;
            count_result(c, crc, 0);
            return crc;
        }
    }
    switch (ev->kind) {
    case KVR_EVENT_STORED: {
        size_t done = 0;
        uint64_t parent = ev->parent_hash;
        int has_parent = ev->has_parent;
        if (ev->n == 0) {
            c->err_other++;
            return KVR_EINVAL;
        }
        while (done < ev->n) {
            if (*budget >= idx->max_hold) {
                wbreathe(idx);
                *budget = 0;
            }
            size_t chunk = ev->n - done;
            if (chunk > idx->max_hold)
                chunk = idx->max_hold;
            rc = kvr_radix_store(idx->radix, ev->worker_id, ev->dp_rank,
                                 has_parent ? &parent : NULL, ev->blocks + done, chunk);
            *budget += (uint32_t)chunk;
            if (rc != KVR_OK)
                break;
            parent = ev->blocks[done + chunk - 1].block_hash;
            has_parent = 1;
            done += chunk;
        }
        c->blocks_stored += done;
        count_result(c, rc, 0);
        return rc;
    }
    case KVR_EVENT_REMOVED: {
        size_t done = 0, missing = 0;
        while (done < ev->n) {
            if (*budget >= idx->max_hold) {
                wbreathe(idx);
                *budget = 0;
            }
            size_t chunk = ev->n - done;
            if (chunk > idx->max_hold)
                chunk = idx->max_hold;
            size_t nf = 0;
            int r = kvr_radix_remove(idx->radix, ev->worker_id, ev->dp_rank, ev->hashes + done,
                                     chunk, &nf);
            missing += nf;
            if (r != KVR_OK && rc == KVR_OK)
                rc = r;
            *budget += (uint32_t)chunk;
            done += chunk;
        }
        c->blocks_removed += ev->n;
        count_result(c, rc, missing);
        return rc;
    }
    case KVR_EVENT_CLEARED:
        rc = kvr_radix_clear_rank(idx->radix, ev->worker_id, ev->dp_rank);
        *budget += idx->max_hold; /* a clear walks a whole rank: release right after */
        count_result(c, rc, 0);
        return rc;
    default:
        c->err_other++;
        return KVR_EINVAL;
    }
}

int kvr_index_apply(kvr_index_t *idx, const struct kvr_event *ev)
{
    uint32_t budget = 0;
    wlock(idx);
    int rc = apply_locked(idx, ev, &budget);
    wunlock(idx);
    return rc;
}

size_t kvr_index_apply_batch(kvr_index_t *idx, const struct kvr_event *ev, size_t n, int *results)
{
    uint32_t budget = 0;
    size_t failed = 0;
    wlock(idx);
    for (size_t i = 0; i < n; i++) {
        int rc = apply_locked(idx, &ev[i], &budget);
        if (results != NULL)
            results[i] = rc;
        failed += rc != KVR_OK;
    }
    wunlock(idx);
    return failed;
}

int kvr_index_remove_worker(kvr_index_t *idx, uint64_t worker_id)
{
    int rc = KVR_ENOTFOUND, crc = KVR_ENOTFOUND;
    wlock(idx);
    if (idx->radix != NULL)
        rc = kvr_radix_remove_worker(idx->radix, worker_id);
    if (idx->ckf != NULL)
        crc = kvr_ckf_index_remove_worker(idx->ckf, worker_id);
    wunlock(idx);
    return idx->radix != NULL ? rc : crc;
}

int kvr_index_remove_rank(kvr_index_t *idx, uint64_t worker_id, uint32_t dp_rank)
{
    int rc = KVR_ENOTFOUND, crc = KVR_ENOTFOUND;
    wlock(idx);
    if (idx->radix != NULL)
        rc = kvr_radix_remove_rank(idx->radix, worker_id, dp_rank);
    if (idx->ckf != NULL)
        crc = kvr_ckf_index_remove_rank(idx->ckf, worker_id, dp_rank);
    wunlock(idx);
    return idx->radix != NULL ? rc : crc;
}

/* ==== queries =============================================================================== */

int kvr_index_find_matches(kvr_index_t *idx, const uint64_t *locals, size_t n, unsigned flags,
                           struct kvr_match *out, size_t cap, size_t *n_out)
{
    atomic_fetch_add_explicit(&idx->queries, 1, memory_order_relaxed);
    rlock(idx);
    int rc = idx->radix != NULL
                 ? kvr_radix_find_matches(idx->radix, locals, n, flags, out, cap, n_out)
                 : kvr_ckf_index_find_matches(idx->ckf, locals, n, flags, out, cap, n_out);
    runlock(idx);
    return rc;
}

int kvr_index_find_matches_ckf(kvr_index_t *idx, const uint64_t *locals, size_t n,
                               struct kvr_match *out, size_t cap, size_t *n_out)
{
    *n_out = 0;
    if (idx->ckf == NULL)
        return KVR_ESTATE;
    atomic_fetch_add_explicit(&idx->queries, 1, memory_order_relaxed);
    rlock(idx);
    int rc = kvr_ckf_index_find_matches(idx->ckf, locals, n, 0, out, cap, n_out);
    runlock(idx);
    return rc;
}

void kvr_index_stats(kvr_index_t *idx, struct kvr_index_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->kind = idx->kind;
    rlock(idx);
    if (idx->radix != NULL)
        kvr_radix_stats(idx->radix, &out->radix);
    if (idx->ckf != NULL)
        kvr_ckf_index_stats(idx->ckf, &out->ckf);
    out->counters = idx->c;
    runlock(idx);
    out->counters.queries = atomic_load_explicit(&idx->queries, memory_order_relaxed);
}

int kvr_index_rank_blocks(kvr_index_t *idx, struct kvr_rank_blocks *out, size_t cap, size_t *n_out)
{
    *n_out = 0;
    if (idx->radix == NULL)
        return KVR_ESTATE;
    rlock(idx);
    int rc = kvr_radix_rank_blocks(idx->radix, out, cap, n_out);
    runlock(idx);
    return rc;
}

int kvr_index_dump(kvr_index_t *idx, struct kvr_event_list *out)
{
    if (idx->radix == NULL)
        return KVR_ESTATE;
    rlock(idx);
    int rc = kvr_radix_dump(idx->radix, out);
    runlock(idx);
    return rc;
}
