/* events.c - op-stream replay through a policy (see events.h).
 * SPDX-License-Identifier: Apache-2.0 */
#include "events.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvr/err.h"
#include "kvr/hash.h"
#include "kvr/index.h"
#include "kvr/load.h"
#include "metrics.h"
#include "router.h"
#include "u64tab.h"

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int kvr_sim_events_workers(const struct kvr_opstream *ops, uint64_t **ids, size_t *n)
{
    size_t cap = ops->events.n + ops->n_expects;
    uint64_t *v = malloc((cap ? cap : 1) * sizeof(*v));
    if (v == NULL)
        return KVR_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < ops->events.n; i++)
        v[k++] = ops->events.ev[i].worker_id;
    for (size_t i = 0; i < ops->n_expects; i++)
        v[k++] = ops->expects[i].worker_id;
    qsort(v, k, sizeof(*v), cmp_u64);
    size_t m = 0;
    for (size_t i = 0; i < k; i++)
        if (m == 0 || v[m - 1] != v[i])
            v[m++] = v[i];
    *ids = v;
    *n = m;
    return KVR_OK;
}

struct erun {
    const struct kvr_sim_config *cfg;
    const struct kvr_opstream *ops;
    struct kvr_sim_result *res;
    kvr_index_t *idx;
    kvr_load_t *load;
    struct kvr_sim_router *router;
    struct kvr_sim_load_series series;
    struct kvr_sim_u64tab seen; /* sequence hashes of earlier queries (best achievable) */
    struct kvr_sim_u64tab slot; /* worker id -> candidate index */
    const uint64_t *wid;
    size_t nw;
    struct kvr_ffi_candidate *cands;
    struct kvr_match *m; /* match scratch */
    size_t cap_m;
    uint64_t *seq; /* sequence-hash scratch */
    size_t cap_seq;
    uint32_t *ring; /* candidate index of the last `inflight` queries (+1; 0 = none) */
};

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return KVR_OK;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need)
        ncap *= 2;
    void *np = realloc(*p, ncap * size);
    if (np == NULL)
        return KVR_ENOMEM;
    *p = np;
    *cap = ncap;
    return KVR_OK;
}

/* Index answer for the query: the overlaps into e->m, *nm entries. */
static int match(struct erun *e, const uint64_t *h, size_t n, size_t *nm)
{
    int rc = kvr_index_find_matches(e->idx, h, n, 0, e->m, e->cap_m, nm);
    if (rc == KVR_ERANGE) {
        if (grow((void **)&e->m, &e->cap_m, *nm, sizeof(*e->m)) != KVR_OK)
            return KVR_ENOMEM;
        rc = kvr_index_find_matches(e->idx, h, n, 0, e->m, e->cap_m, nm);
    }
    return rc;
}

/* 1 if the index answer (dp_rank 0) equals the expectation. */
static int agrees(const struct erun *e, const struct kvr_opstream_query *q, size_t nm)
{
    const struct kvr_opstream_expect *x = kvr_opstream_query_expects(e->ops, q);
    size_t got = 0;
    for (size_t i = 0; i < nm; i++) {
        if (e->m[i].dp_rank != 0)
            return 0;
        got++;
        int found = 0;
        for (uint32_t k = 0; k < q->n_expect && !found; k++)
            found = x[k].worker_id == e->m[i].worker_id && x[k].blocks == e->m[i].blocks;
        if (!found)
            return 0;
    }
    return got == q->n_expect;
}

static int query(struct erun *e, uint32_t qi)
{
    const struct kvr_sim_config *cfg = e->cfg;
    struct kvr_sim_result *res = e->res;
    const struct kvr_opstream_query *q = &e->ops->queries[qi];
    const uint64_t *h = kvr_opstream_query_hashes(e->ops, q);
    size_t n = q->n, nm = 0;
    if (grow((void **)&e->seq, &e->cap_seq, n ? n : 1, sizeof(*e->seq)) != KVR_OK)
        return KVR_ENOMEM;
    kvr_hash_chain(h, n, e->seq);
    int rc = match(e, h, n, &nm);
    if (rc != KVR_OK)
        return rc;
    if (!agrees(e, q, nm))
        res->expect_mismatches++;
    uint32_t oracle = 0;
    for (size_t i = 0; i < nm; i++) {
        uint32_t ci;
        if (e->m[i].dp_rank == 0 && kvr_sim_u64tab_get(&e->slot, e->m[i].worker_id, &ci) &&
            e->m[i].blocks > oracle)
            oracle = e->m[i].blocks;
    }
    size_t best = 0;
    while (best < n && kvr_sim_u64tab_get(&e->seen, e->seq[best], NULL))
        best++;
    for (size_t k = best; k < n; k++)
        if (kvr_sim_u64tab_put(&e->seen, e->seq[k], 0) != KVR_OK)
            return KVR_ENOMEM;
    struct kvr_ffi_request req;
    memset(&req, 0, sizeof(req));
    req.model = "sim";
    req.model_len = 3;
    req.local_hashes = h;
    req.seq_hashes = e->seq;
    req.request_id = (uint64_t)qi + 1;
    req.overlap_weight = -1;
    req.temperature = -1;
    req.blocks = (uint32_t)n;
    req.tokens = (uint32_t)(n * cfg->block_size);
    req.block_size = cfg->block_size;
    for (size_t k = 0; k < e->nw; k++) {
        struct kvr_ffi_candidate *c = &e->cands[k];
        memset(c, 0, sizeof(*c));
        c->worker_id = e->wid[k];
        c->kv_usage = -1;
        c->weight = 1;
        c->healthy = 1;
    }
    uint32_t pick = 0;
    if ((rc = kvr_sim_router_select(e->router, &req, e->cands, e->nw, &pick)) != KVR_OK)
        return rc;
    if (pick >= e->nw)
        pick = 0;
    /* The query `inflight` places back leaves the window. */
    uint32_t w_slot = qi % cfg->inflight;
    if (e->ring[w_slot] != 0) {
        kvr_load_release(e->load, (uint64_t)qi + 1 - cfg->inflight, qi);
        kvr_sim_load_change(&e->series, e->ring[w_slot] - 1, qi, -1);
    }
    e->ring[w_slot] = pick + 1;
    uint32_t ov = e->cands[pick].overlap;
    struct kvr_sim_worker_stats *ws = &res->workers[pick];
    ws->requests++;
    ws->blocks += n;
    ws->cached_blocks += ov;
    res->requests++;
    res->blocks += n;
    res->cached_blocks += ov;
    res->routed_overlap += ov;
    res->oracle_blocks += oracle;
    res->best_blocks += best;
    uint32_t b = kvr_sim_bucket_of(qi, e->series.width, e->series.n_buckets);
    res->bucket_blocks[b] += n;
    res->bucket_cached[b] += ov;
    res->bucket_best[b] += best;
    struct kvr_load_request lr = {.request_id = (uint64_t)qi + 1,
                                  .worker_id = e->wid[pick],
                                  .isl_tokens = req.tokens,
                                  .overlap_blocks = ov,
                                  .track_prefill = 1,
                                  .seq_hashes = n ? e->seq : NULL,
                                  .n_hashes = n};
    if (kvr_load_add(e->load, &lr, qi) == KVR_ENOMEM)
        return KVR_ENOMEM;
    kvr_sim_load_change(&e->series, pick, qi, +1);
    return KVR_OK;
}

static int replay(struct erun *e)
{
    const struct kvr_opstream *ops = e->ops;
    for (size_t i = 0; i < ops->n_ops; i++) {
        const struct kvr_opstream_op *op = &ops->ops[i];
        if (op->kind == KVR_OPSTREAM_EVENT) {
            const struct kvr_event *ev = &ops->events.ev[op->index];
            if (kvr_index_apply(e->idx, ev) == KVR_ENOMEM)
                return KVR_ENOMEM;
            kvr_sim_router_on_event(e->router, ev);
        } else {
            int rc = query(e, op->index);
            if (rc != KVR_OK)
                return rc;
        }
    }
    return KVR_OK;
}

static void finish(struct erun *e)
{
    struct kvr_sim_result *res = e->res;
    res->hit_ratio = res->blocks ? (double)res->cached_blocks / (double)res->blocks : 0;
    res->best_hit_ratio = res->blocks ? (double)res->best_blocks / (double)res->blocks : 0;
    res->imbalance = kvr_sim_imbalance(&res->workers[0].requests, e->nw, sizeof(res->workers[0]));
    res->imbalance_blocks =
        kvr_sim_imbalance(&res->workers[0].blocks, e->nw, sizeof(res->workers[0]));
    kvr_sim_load_finish(&e->series, e->series.window);
    for (size_t w = 0; w < e->nw; w++) {
        struct kvr_sim_worker_stats *ws = &res->workers[w];
        ws->worker_id = e->wid[w];
        ws->max_inflight = e->series.max[w];
        ws->mean_inflight = e->series.total[w] / (double)e->series.window;
        for (uint32_t b = 0; b < res->n_buckets; b++)
            res->inflight[w * res->n_buckets + b] = kvr_sim_load_mean(&e->series, (uint32_t)w, b);
    }
    res->bucket_us = e->series.width;
    res->imbalance_inflight =
        kvr_sim_imbalance_series(res->inflight, res->n_workers, res->n_buckets);
    kvr_sim_router_counts(e->router, &res->policy);
    struct kvr_index_stats st;
    kvr_index_stats(e->idx, &st);
    res->index_stored_events = st.counters.events[KVR_EVENT_STORED];
    res->index_stored_blocks = st.counters.blocks_stored;
    res->index_removed_events = st.counters.events[KVR_EVENT_REMOVED];
    res->index_removed_blocks = st.counters.blocks_removed;
    res->index_errors = st.counters.err_parent + st.counters.err_block +
                        st.counters.err_invalid_seq + st.counters.err_nomem + st.counters.err_other;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int kvr_sim_events_run(const struct kvr_sim_config *cfg, const struct kvr_opstream *ops,
                       const struct kvr_sim_policy *p, const uint64_t *worker_ids, size_t n_workers,
                       struct kvr_sim_result *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", p->name);
    out->origin = p->origin;
    out->mode = KVR_SIM_MODE_EVENTS;
    if (n_workers == 0 || n_workers > 4096 || cfg->inflight == 0 || cfg->block_size < 2 ||
        ops->n_queries >= UINT32_MAX) {
        snprintf(out->error, sizeof(out->error),
                 "need 1..4096 workers, inflight >= 1, block size >= 2 (the stream has %zu "
                 "worker(s))",
                 n_workers);
        return KVR_EINVAL;
    }
    struct erun e;
    memset(&e, 0, sizeof(e));
    e.cfg = cfg;
    e.ops = ops;
    e.res = out;
    e.wid = worker_ids;
    e.nw = n_workers;
    kvr_sim_u64tab_init(&e.seen);
    kvr_sim_u64tab_init(&e.slot);
    uint32_t nb = cfg->buckets ? cfg->buckets : 1;
    int rc = KVR_ENOMEM;
    out->n_workers = (uint32_t)n_workers;
    out->n_buckets = nb;
    out->workers = calloc(n_workers, sizeof(*out->workers));
    out->bucket_blocks = calloc(nb, sizeof(uint64_t));
    out->bucket_cached = calloc(nb, sizeof(uint64_t));
    out->bucket_best = calloc(nb, sizeof(uint64_t));
    out->inflight = calloc(n_workers * nb, sizeof(double));
    e.cands = calloc(n_workers, sizeof(*e.cands));
    e.ring = calloc(cfg->inflight, sizeof(*e.ring));
    if (out->workers == NULL || out->bucket_blocks == NULL || out->bucket_cached == NULL ||
        out->bucket_best == NULL || out->inflight == NULL || e.cands == NULL || e.ring == NULL ||
        kvr_sim_load_init(&e.series, (uint32_t)n_workers, nb,
                          ops->n_queries ? ops->n_queries : 1) != KVR_OK)
        goto out;
    for (size_t k = 0; k < n_workers; k++)
        if (kvr_sim_u64tab_put(&e.slot, worker_ids[k], (uint32_t)k) != KVR_OK)
            goto out;
    struct kvr_load_config lc = {.block_size = cfg->block_size};
    if ((rc = kvr_index_new(NULL, &e.idx)) != KVR_OK || (rc = kvr_load_new(&lc, &e.load)) != KVR_OK)
        goto out;
    rc = kvr_sim_router_new(cfg, p, e.idx, e.load, &e.router, out->error, sizeof(out->error));
    if (rc == KVR_EINVAL) {
        rc = KVR_OK; /* refused policy: reported, not fatal */
        goto out;
    }
    if (rc != KVR_OK)
        goto out;
    double t0 = now_s();
    rc = replay(&e);
    out->wall_s = now_s() - t0;
    out->decisions_per_s = out->wall_s > 0 ? (double)out->requests / out->wall_s : 0;
    if (rc != KVR_OK)
        goto out;
    finish(&e);
    out->ok = 1;
out:
    if (rc != KVR_OK && out->error[0] == '\0')
        snprintf(out->error, sizeof(out->error), "replay failed: %s", kvr_strerror(rc));
    kvr_sim_router_free(e.router);
    kvr_load_free(e.load);
    kvr_index_free(e.idx);
    kvr_sim_load_free(&e.series);
    kvr_sim_u64tab_free(&e.seen);
    kvr_sim_u64tab_free(&e.slot);
    free(e.cands);
    free(e.ring);
    free(e.m);
    free(e.seq);
    return rc;
}
