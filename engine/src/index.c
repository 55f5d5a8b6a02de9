/* index.c - the thread-safe index: a radix tree behind a writer-preferring rwlock, with event
 * application in bounded lock holds (see kvr/index.h for the design). */
#include "kvr/index.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kvr/err.h"
#include "rwlock.h"

#define DEFAULT_MAX_HOLD 256u

struct kvr_index {
    struct kvr_rwlock lock;
    kvr_radix_t *radix;   /* NULL for a CKF-only index */
    kvr_ckf_index_t *ckf; /* NULL for a radix-only index */
    int kind;
    uint32_t max_hold;
    size_t dump_chunk; /* blocks per dump read hold */
    atomic_ullong queries;
    struct kvr_index_counters c; /* written under the write lock */
    /* The current write hold (under the write lock). */
    uint64_t hold_work0; /* kvr_radix_work at the start of the hold */
    uint64_t hold_extra; /* units charged besides the tree's own (CKF events, re-stores) */
};

int kvr_index_new(const struct kvr_index_config *cfg, kvr_index_t **out)
{
    struct kvr_index_config def = {.kind = KVR_INDEX_RADIX, .max_hold_blocks = DEFAULT_MAX_HOLD};
    if (cfg == NULL)
        cfg = &def;
    int kind = cfg->kind ? cfg->kind : KVR_INDEX_RADIX;
    if (kind != KVR_INDEX_RADIX && kind != KVR_INDEX_CKF && kind != KVR_INDEX_BOTH)
        return KVR_EINVAL;
    if (cfg->dump_chunk_blocks > (uint64_t)SIZE_MAX)
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
    idx->dump_chunk = cfg->dump_chunk_blocks ? (size_t)cfg->dump_chunk_blocks : idx->max_hold;
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

/* ==== locking and hold accounting ============================================================
 *
 * A write hold lasts from taking the write lock to the next release (kvr_rwlock_breathe or
 * unlock). Its work is what the tree counted (kvr_radix_work) plus what is charged apart (CKF
 * events, which the filter applies whole). When it reaches max_hold, the writer breathes: it
 * releases the lock, lets the readers that were waiting in, and takes the lock back. */

static uint64_t radix_work(const struct kvr_index *idx)
{
    return idx->radix != NULL ? kvr_radix_work(idx->radix) : 0;
}

static void hold_begin(struct kvr_index *idx)
{
    idx->hold_work0 = radix_work(idx);
    idx->hold_extra = 0;
}

static uint64_t hold_used(const struct kvr_index *idx)
{
    return radix_work(idx) - idx->hold_work0 + idx->hold_extra;
}

static void hold_end(struct kvr_index *idx)
{
    uint64_t used = hold_used(idx);
    if (used > idx->c.max_hold_work)
        idx->c.max_hold_work = used;
    idx->c.write_holds++; /* a dump spanning no write hold is an exact cut */
}

static void wlock(struct kvr_index *idx)
{
    kvr_rwlock_wrlock(&idx->lock);
    hold_begin(idx);
}

static void wunlock(struct kvr_index *idx)
{
    hold_end(idx);
    kvr_rwlock_wrunlock(&idx->lock);
}

/* Between bounded holds: lets waiting readers in, then takes the lock back. */
static void wbreathe(struct kvr_index *idx)
{
    hold_end(idx);
    kvr_rwlock_breathe(&idx->lock);
    hold_begin(idx);
}

/* Units the current hold may still spend (at least 1), breathing first if it has none left. */
static uint64_t hold_room(struct kvr_index *idx)
{
    uint64_t used = hold_used(idx);
    if (used >= idx->max_hold) {
        wbreathe(idx);
        used = 0;
    }
    return idx->max_hold - used;
}

/* Runs the tree's current job (and the frees it left) to the end in bounded holds. */
static void run_job(struct kvr_index *idx)
{
    while (kvr_radix_step(idx->radix, hold_room(idx)))
        ;
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
    case KVR_ECAPACITY:
        c->err_capacity++;
        break;
    default:
        c->err_other++;
        break;
    }
}

/* Applies one event under the write lock (held on entry and exit), releasing it whenever the
 * current hold has done max_hold work units. */
static int apply_locked(struct kvr_index *idx, const struct kvr_event *ev)
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
        (void)hold_room(idx);
        size_t nf = 0; /* BOTH: the CKF's own outcome is counted in its stats (stats.ckf) */
        int crc = kvr_ckf_index_apply_counted(idx->ckf, ev, &nf);
        idx->hold_extra += ev->n ? ev->n : 1u;
        if (idx->radix == NULL) {
            if (ev->kind == KVR_EVENT_STORED)
                c->blocks_stored += ev->n;
            else if (ev->kind == KVR_EVENT_REMOVED)
                c->blocks_removed += ev->n;
            count_result(c, crc, nf);
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
        /* Chained sub-stores, each fitting the room left in the current hold. */
        while (done < ev->n) {
            uint64_t room = hold_room(idx);
            size_t chunk = ev->n - done;
            if (chunk > room)
                chunk = (size_t)room;
            rc = kvr_radix_store(idx->radix, ev->worker_id, ev->dp_rank,
                                 has_parent ? &parent : NULL, ev->blocks + done, chunk);
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
        size_t missing = 0;
        rc = kvr_radix_remove_begin(idx->radix, ev->worker_id, ev->dp_rank, ev->hashes, ev->n);
        if (rc == KVR_OK) {
            run_job(idx);
            rc = kvr_radix_job_result(idx->radix, &missing);
        }
        c->blocks_removed += ev->n;
        count_result(c, rc, missing);
        return rc;
    }
    case KVR_EVENT_CLEARED:
        rc = kvr_radix_clear_begin(idx->radix, ev->worker_id, ev->dp_rank);
        if (rc == KVR_OK) {
            run_job(idx);
            rc = kvr_radix_job_result(idx->radix, NULL);
        }
        count_result(c, rc, 0);
        return rc;
    default:
        c->err_other++;
        return KVR_EINVAL;
    }
}

int kvr_index_apply(kvr_index_t *idx, const struct kvr_event *ev)
{
    wlock(idx);
    int rc = apply_locked(idx, ev);
    wunlock(idx);
    return rc;
}

size_t kvr_index_apply_batch(kvr_index_t *idx, const struct kvr_event *ev, size_t n, int *results)
{
    size_t failed = 0;
    wlock(idx);
    for (size_t i = 0; i < n; i++) {
        int rc = apply_locked(idx, &ev[i]);
        if (results != NULL)
            results[i] = rc;
        failed += rc != KVR_OK;
    }
    wunlock(idx);
    return failed;
}

/* Worker or rank removal: the tree's part as a bounded job, the CKF's at once. */
static int remove_ranks(kvr_index_t *idx, uint64_t worker_id, uint32_t dp_rank, int whole)
{
    int rc = KVR_ENOTFOUND, crc = KVR_ENOTFOUND;
    wlock(idx);
    if (idx->radix != NULL) {
        rc = whole ? kvr_radix_remove_worker_begin(idx->radix, worker_id)
                   : kvr_radix_remove_rank_begin(idx->radix, worker_id, dp_rank);
        if (rc == KVR_OK) {
            run_job(idx);
            rc = kvr_radix_job_result(idx->radix, NULL);
        }
    }
    if (idx->ckf != NULL) {
        (void)hold_room(idx);
        crc = whole ? kvr_ckf_index_remove_worker(idx->ckf, worker_id)
                    : kvr_ckf_index_remove_rank(idx->ckf, worker_id, dp_rank);
        idx->hold_extra += idx->max_hold; /* a CKF lane removal is whole: release right after */
    }
    wunlock(idx);
    return idx->radix != NULL ? rc : crc;
}

int kvr_index_remove_worker(kvr_index_t *idx, uint64_t worker_id)
{
    return remove_ranks(idx, worker_id, 0, 1);
}

int kvr_index_remove_rank(kvr_index_t *idx, uint64_t worker_id, uint32_t dp_rank)
{
    return remove_ranks(idx, worker_id, dp_rank, 0);
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

size_t kvr_index_block_ranks(kvr_index_t *idx)
{
    rlock(idx);
    size_t n;
    if (idx->radix != NULL) {
        struct kvr_radix_stats st;
        kvr_radix_stats(idx->radix, &st);
        n = st.block_ranks;
    } else {
        n = (size_t)kvr_ckf_index_blocks(idx->ckf);
    }
    runlock(idx);
    return n;
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

int kvr_index_dump_ex(kvr_index_t *idx, struct kvr_event_list *out,
                      struct kvr_index_dump_info *info)
{
    struct kvr_index_dump_info local;
    if (info == NULL)
        info = &local;
    memset(info, 0, sizeof(*info));
    if (idx->radix == NULL)
        return KVR_ESTATE;
    kvr_radix_dump_t *d = NULL;
    int done = 0;
    rlock(idx);
    uint64_t holds0 = idx->c.write_holds;
    int rc = kvr_radix_dump_begin(idx->radix, &d);
    /* the first chunk in the same hold as the start; then one hold per chunk */
    while (rc == KVR_OK && !done) {
        rc = kvr_radix_dump_step(idx->radix, d, out, idx->dump_chunk, &done);
        info->exact = idx->c.write_holds == holds0;
        info->chunks++;
        if (rc == KVR_OK && !done) {
            runlock(idx);
            rlock(idx);
        }
    }
    runlock(idx);
    if (d != NULL)
        kvr_radix_dump_end(idx->radix, d);
    return rc;
}

int kvr_index_dump(kvr_index_t *idx, struct kvr_event_list *out)
{
    return kvr_index_dump_ex(idx, out, NULL);
}
