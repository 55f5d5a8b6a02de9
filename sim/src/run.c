/* run.c - one simulation: a trace through one policy against simulated workers (kvr_sim_run).
 * SPDX-License-Identifier: Apache-2.0
 *
 * The model is described in kvr/sim.h; this file is its event loop:
 *
 *   next arrival a_i  vs  earliest scheduled event (PREFILL_DONE / DONE)
 *   ─ the event wins ties (a completion at t frees a slot and fills the cache before an
 *     arrival at t is routed)
 *   arrival       route (router.c), book the load, FIFO-enqueue at the worker, try to start
 *   start         hit = cached prefix, touch it, schedule PREFILL_DONE after the prefill time
 *   PREFILL_DONE  store the blocks (KV events into the index and the policy), first token,
 *                 schedule DONE after the decode time, try to start the next request
 *   DONE          release the load, on_response, try to start the next request
 *
 * A request's hashes live only while it is in flight (allocated at arrival, freed at DONE).
 * Static helpers borrow every pointer they take. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blocks.h"
#include "kvr/err.h"
#include "kvr/index.h"
#include "kvr/load.h"
#include "kvr/sim.h"
#include "lru.h"
#include "metrics.h"
#include "router.h"
#include "sched.h"

enum { EV_PREFILL_DONE = 1, EV_DONE = 2 };

#define NONE UINT32_MAX

struct sreq {
    uint64_t arrival; /* scaled arrival (µs) */
    uint64_t start;   /* prefill start */
    uint64_t first;   /* first token */
    uint64_t end;     /* last token */
    uint64_t *hashes; /* local[nb] then seq[nb] while in flight (owned) */
    uint32_t nb;      /* blocks */
    uint32_t worker;  /* index of the chosen worker */
    uint32_t overlap; /* index overlap of the chosen worker at routing */
    uint32_t hit;     /* cached blocks at prefill start */
    uint32_t next;    /* FIFO link */
    uint32_t pad_;
};

struct sworker {
    struct kvr_sim_lru lru;
    uint32_t head, tail; /* FIFO of waiting requests (NONE = empty) */
    uint32_t running;    /* in prefill or decode */
    uint32_t prefilling; /* in prefill */
};

struct run {
    const struct kvr_sim_config *cfg;
    const struct kvr_sim_trace *t;
    struct kvr_sim_result *res;
    kvr_index_t *idx;
    kvr_load_t *load;
    struct kvr_sim_router *router;
    struct kvr_sim_hasher hasher;
    struct kvr_sim_sched sched;
    struct kvr_sim_load_series series;
    struct kvr_sim_sink sink;
    struct sworker *w;
    struct sreq *rq;
    struct kvr_ffi_candidate *cands;
    uint32_t *best; /* per request, in ids */
    uint64_t now;
    uint64_t rng;    /* SplitMix64 state (service-time jitter) */
    uint32_t expand; /* blocks per id */
    int failed;      /* KVR_ENOMEM seen inside a callback */
    uint64_t last_done;
    uint64_t out_tokens;
};

static double uniform(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* A service time in µs: base × (1 ± jitter), rounded, at least 0. */
static uint64_t service_us(struct run *r, double base)
{
    if (r->cfg->jitter > 0)
        base *= 1.0 + r->cfg->jitter * (2.0 * uniform(&r->rng) - 1.0);
    return base > 0 ? (uint64_t)llround(base) : 0;
}

static uint64_t *locals_of(const struct sreq *q)
{
    return q->hashes;
}

static uint64_t *seqs_of(const struct sreq *q)
{
    return q->hashes + q->nb;
}

/* The KV-event path the server uses: index first, then the policy's hooks. */
static void on_event(void *ctx, const struct kvr_event *ev)
{
    struct run *r = ctx;
    int rc = kvr_index_apply(r->idx, ev);
    if (rc == KVR_ENOMEM)
        r->failed = KVR_ENOMEM;
    kvr_sim_router_on_event(r->router, ev);
}

/* The ffi request of trace request i (hashes borrowed from q). */
static void ffi_request(const struct run *r, size_t i, const struct sreq *q,
                        struct kvr_ffi_request *req)
{
    const struct kvr_sim_request *tr = &r->t->req[i];
    memset(req, 0, sizeof(*req));
    req->model = "sim";
    req->model_len = 3;
    req->local_hashes = locals_of(q);
    req->seq_hashes = seqs_of(q);
    req->request_id = (uint64_t)i + 1;
    req->overlap_weight = -1;
    req->temperature = -1;
    req->tokens = tr->input_tokens;
    req->blocks = q->nb;
    req->block_size = r->cfg->block_size;
}

static void init_candidates(const struct run *r)
{
    for (uint32_t w = 0; w < r->cfg->workers; w++) {
        struct kvr_ffi_candidate *c = &r->cands[w];
        memset(c, 0, sizeof(*c));
        c->worker_id = r->cfg->worker_base + w;
        c->kv_usage = -1;
        c->weight = 1;
        c->healthy = 1;
    }
}

/* ==== worker side ============================================================================ */

static int try_start(struct run *r, uint32_t wi)
{
    struct sworker *w = &r->w[wi];
    const struct kvr_sim_config *cfg = r->cfg;
    while (w->head != NONE && w->running < cfg->slots &&
           (cfg->prefill_lanes == 0 || w->prefilling < cfg->prefill_lanes)) {
        uint32_t i = w->head;
        struct sreq *q = &r->rq[i];
        w->head = q->next;
        if (w->head == NONE)
            w->tail = NONE;
        q->start = r->now;
        q->hit = (uint32_t)kvr_sim_lru_hit(&w->lru, seqs_of(q), q->nb);
        uint64_t isl = r->t->req[i].input_tokens;
        uint64_t cached_tokens = (uint64_t)q->hit * cfg->block_size;
        uint64_t fresh = isl > cached_tokens ? isl - cached_tokens : 0;
        struct kvr_sim_worker_stats *ws = &r->res->workers[wi];
        ws->cached_blocks += q->hit;
        ws->prefill_tokens += fresh;
        r->res->cached_blocks += q->hit;
        uint32_t b = kvr_sim_bucket_of(q->arrival, r->series.width, r->series.n_buckets);
        r->res->bucket_cached[b] += q->hit;
        double p = cfg->prefill_overhead_us + (double)fresh * cfg->prefill_us_per_token;
        if (kvr_sim_sched_push(&r->sched, r->now + service_us(r, p), EV_PREFILL_DONE, i) != KVR_OK)
            return KVR_ENOMEM;
        w->running++;
        w->prefilling++;
    }
    return KVR_OK;
}

static int prefill_done(struct run *r, uint32_t i)
{
    struct sreq *q = &r->rq[i];
    struct sworker *w = &r->w[q->worker];
    w->prefilling--;
    q->first = r->now;
    if (kvr_sim_lru_store(&w->lru, seqs_of(q), locals_of(q), q->nb, &r->sink, NULL) != KVR_OK)
        return KVR_ENOMEM;
    kvr_load_first_token(r->load, (uint64_t)i + 1, r->now / 1000);
    uint32_t out = r->t->req[i].output_tokens;
    double d = (double)(out > 0 ? out - 1 : 0) * r->cfg->decode_us_per_token;
    if (kvr_sim_sched_push(&r->sched, r->now + service_us(r, d), EV_DONE, i) != KVR_OK)
        return KVR_ENOMEM;
    return try_start(r, q->worker);
}

static int done(struct run *r, uint32_t i)
{
    struct sreq *q = &r->rq[i];
    struct sworker *w = &r->w[q->worker];
    w->running--;
    q->end = r->now;
    kvr_load_release(r->load, (uint64_t)i + 1, r->now / 1000);
    struct kvr_ffi_request req;
    ffi_request(r, i, q, &req);
    struct kvr_ffi_outcome oc = {.ttft_ms = (double)(q->first - q->arrival) / 1000.0,
                                 .latency_ms = (double)(r->now - q->arrival) / 1000.0,
                                 .status = 200,
                                 .output_tokens = r->t->req[i].output_tokens};
    kvr_sim_router_on_response(r->router, &req, &r->cands[q->worker], &oc);
    kvr_sim_load_change(&r->series, q->worker, r->now, -1);
    free(q->hashes);
    q->hashes = NULL;
    r->res->completed++;
    r->last_done = r->now;
    r->out_tokens += r->t->req[i].output_tokens;
    return try_start(r, q->worker);
}

/* ==== router side ============================================================================ */

static int arrive(struct run *r, uint32_t i)
{
    const struct kvr_sim_request *tr = &r->t->req[i];
    struct sreq *q = &r->rq[i];
    q->nb = tr->n_ids * r->expand;
    q->hashes = malloc(2 * (size_t)(q->nb ? q->nb : 1) * sizeof(uint64_t));
    if (q->hashes == NULL)
        return KVR_ENOMEM;
    kvr_sim_hasher_blocks(&r->hasher, r->t->ids + tr->ids_off, tr->n_ids, locals_of(q), seqs_of(q));
    struct kvr_ffi_request req;
    ffi_request(r, i, q, &req);
    init_candidates(r);
    uint32_t pick = 0;
    int rc = kvr_sim_router_select(r->router, &req, r->cands, r->cfg->workers, &pick);
    if (rc != KVR_OK)
        return rc;
    if (pick >= r->cfg->workers)
        pick = 0; /* the runtime guarantees a valid index; stay safe */
    q->worker = pick;
    q->overlap = r->cands[pick].overlap;
    struct kvr_sim_result *res = r->res;
    struct kvr_sim_worker_stats *ws = &res->workers[pick];
    ws->requests++;
    ws->blocks += q->nb;
    res->requests++;
    res->blocks += q->nb;
    res->routed_overlap += q->overlap;
    uint64_t best = (uint64_t)r->best[i] * r->expand;
    res->best_blocks += best;
    uint32_t b = kvr_sim_bucket_of(q->arrival, r->series.width, r->series.n_buckets);
    res->bucket_blocks[b] += q->nb;
    res->bucket_best[b] += best;
    /* Book it as the server does (route.c srv_route_book): the overlap the policy saw. */
    struct kvr_load_request lr = {.request_id = (uint64_t)i + 1,
                                  .worker_id = r->cands[pick].worker_id,
                                  .isl_tokens = tr->input_tokens,
                                  .overlap_blocks = q->overlap,
                                  .track_prefill = 1,
                                  .seq_hashes = q->nb ? seqs_of(q) : NULL,
                                  .n_hashes = q->nb};
    rc = kvr_load_add(r->load, &lr, r->now / 1000);
    if (rc == KVR_ENOMEM)
        return rc;
    kvr_sim_load_change(&r->series, pick, r->now, +1);
    struct sworker *w = &r->w[pick];
    q->next = NONE;
    if (w->tail == NONE)
        w->head = i;
    else
        r->rq[w->tail].next = i;
    w->tail = i;
    return try_start(r, pick);
}

/* ==== setup, loop, figures =================================================================== */

void kvr_sim_result_free(struct kvr_sim_result *r)
{
    free(r->workers);
    free(r->bucket_blocks);
    free(r->bucket_cached);
    free(r->bucket_best);
    free(r->inflight);
    free(r->ttft_us);
    memset(r, 0, sizeof(*r));
}

static int check_config(const struct kvr_sim_config *cfg, char *err, size_t err_len)
{
    if (cfg->workers == 0 || cfg->workers > 4096) {
        snprintf(err, err_len, "workers must be in 1..4096");
        return KVR_EINVAL;
    }
    if (cfg->block_size < 2 || kvr_sim_expand(cfg) == 0) {
        snprintf(err, err_len, "block size %u must be >= 2 and divide the trace block (%u tokens)",
                 cfg->block_size, cfg->trace_block_tokens);
        return KVR_EINVAL;
    }
    if (cfg->slots == 0) {
        snprintf(err, err_len, "slots must be >= 1");
        return KVR_EINVAL;
    }
    if (!(cfg->time_scale > 0) || !isfinite(cfg->time_scale) || !(cfg->prefill_us_per_token >= 0) ||
        !(cfg->prefill_overhead_us >= 0) || !(cfg->decode_us_per_token >= 0) ||
        !(cfg->jitter >= 0 && cfg->jitter < 1)) {
        snprintf(err, err_len, "time scale must be > 0, service times >= 0, jitter in [0, 1)");
        return KVR_EINVAL;
    }
    return KVR_OK;
}

static int alloc_result(struct kvr_sim_result *res, uint32_t nw, uint32_t nb)
{
    res->n_workers = nw;
    res->n_buckets = nb;
    res->workers = calloc(nw, sizeof(*res->workers));
    res->bucket_blocks = calloc(nb, sizeof(uint64_t));
    res->bucket_cached = calloc(nb, sizeof(uint64_t));
    res->bucket_best = calloc(nb, sizeof(uint64_t));
    res->inflight = calloc((size_t)nw * nb, sizeof(double));
    if (res->workers == NULL || res->bucket_blocks == NULL || res->bucket_cached == NULL ||
        res->bucket_best == NULL || res->inflight == NULL)
        return KVR_ENOMEM;
    return KVR_OK;
}

static uint64_t scaled(const struct kvr_sim_config *cfg, uint64_t us)
{
    return (uint64_t)llround((double)us * cfg->time_scale);
}

static int loop(struct run *r)
{
    size_t n = r->t->n;
    if (r->cfg->limit > 0 && r->cfg->limit < n)
        n = (size_t)r->cfg->limit;
    size_t next = 0;
    int rc = KVR_OK;
    while (rc == KVR_OK && r->failed == KVR_OK) {
        struct kvr_sim_ev ev;
        int have = kvr_sim_sched_peek(&r->sched, &ev);
        if (next < n && (!have || ev.time_us > r->rq[next].arrival)) {
            r->now = r->rq[next].arrival;
            rc = arrive(r, (uint32_t)next++);
            continue;
        }
        if (!have)
            break;
        kvr_sim_sched_pop(&r->sched, &ev);
        r->now = ev.time_us;
        rc = ev.kind == EV_PREFILL_DONE ? prefill_done(r, ev.arg) : done(r, ev.arg);
    }
    return rc != KVR_OK ? rc : r->failed;
}

static int figures(struct run *r, size_t n)
{
    struct kvr_sim_result *res = r->res;
    const struct kvr_sim_config *cfg = r->cfg;
    res->hit_ratio = res->blocks ? (double)res->cached_blocks / (double)res->blocks : 0;
    res->best_hit_ratio = res->blocks ? (double)res->best_blocks / (double)res->blocks : 0;
    res->imbalance =
        kvr_sim_imbalance(&res->workers[0].requests, cfg->workers, sizeof(res->workers[0]));
    res->imbalance_blocks =
        kvr_sim_imbalance(&res->workers[0].blocks, cfg->workers, sizeof(res->workers[0]));
    res->imbalance_prefill =
        kvr_sim_imbalance(&res->workers[0].prefill_tokens, cfg->workers, sizeof(res->workers[0]));
    /* Latencies of the requests (all complete: the loop drains the queue), sorted. */
    uint64_t *q = malloc((n ? n : 1) * sizeof(*q));
    uint64_t *e = malloc((n ? n : 1) * sizeof(*e));
    if (q != NULL && e != NULL) {
        for (size_t i = 0; i < n; i++) {
            const struct sreq *s = &r->rq[i];
            res->ttft_us[i] = s->first - s->arrival;
            q[i] = s->start - s->arrival;
            e[i] = s->end - s->arrival;
        }
        res->n_ttft = n;
        kvr_sim_sort_u64(res->ttft_us, n);
        kvr_sim_dist_ms(res->ttft_us, n, &res->ttft_ms);
        kvr_sim_sort_u64(q, n);
        kvr_sim_dist_ms(q, n, &res->queue_ms);
        kvr_sim_sort_u64(e, n);
        kvr_sim_dist_ms(e, n, &res->e2e_ms);
    }
    int rc = q != NULL && e != NULL ? KVR_OK : KVR_ENOMEM;
    free(q);
    free(e);
    uint64_t first = n > 0 ? r->rq[0].arrival : 0;
    uint64_t span = r->last_done > first ? r->last_done - first : 0;
    res->makespan_s = (double)span / 1e6;
    res->throughput_rps = span ? (double)res->completed / res->makespan_s : 0;
    res->output_tps = span ? (double)r->out_tokens / res->makespan_s : 0;
    for (uint32_t w = 0; w < cfg->workers; w++) {
        struct kvr_sim_worker_stats *ws = &res->workers[w];
        ws->worker_id = cfg->worker_base + w;
        ws->max_inflight = r->series.max[w];
        ws->mean_inflight = r->series.total[w] / (double)r->series.window;
        for (uint32_t b = 0; b < res->n_buckets; b++)
            res->inflight[(size_t)w * res->n_buckets + b] = kvr_sim_load_mean(&r->series, w, b);
    }
    res->bucket_us = r->series.width;
    res->imbalance_inflight =
        kvr_sim_imbalance_series(res->inflight, res->n_workers, res->n_buckets);
    kvr_sim_router_counts(r->router, &res->policy);
    struct kvr_index_stats st;
    kvr_index_stats(r->idx, &st);
    res->index_stored_events = st.counters.events[KVR_EVENT_STORED];
    res->index_stored_blocks = st.counters.blocks_stored;
    res->index_removed_events = st.counters.events[KVR_EVENT_REMOVED];
    res->index_removed_blocks = st.counters.blocks_removed;
    res->index_errors = st.counters.err_parent + st.counters.err_block +
                        st.counters.err_invalid_seq + st.counters.err_nomem + st.counters.err_other;
    struct kvr_load_stats ls;
    kvr_load_stats(r->load, &ls);
    res->load_expired = ls.expired;
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int kvr_sim_run(const struct kvr_sim_config *cfg, const struct kvr_sim_trace *t,
                const struct kvr_sim_policy *p, struct kvr_sim_result *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", p->name);
    out->origin = p->origin;
    out->mode = KVR_SIM_MODE_TRACE;
    int rc = check_config(cfg, out->error, sizeof(out->error));
    if (rc != KVR_OK)
        return rc;
    size_t n = t->n;
    if (cfg->limit > 0 && cfg->limit < n)
        n = (size_t)cfg->limit;
    if (n >= UINT32_MAX) {
        snprintf(out->error, sizeof(out->error), "too many requests");
        return KVR_EINVAL;
    }
    struct run r;
    memset(&r, 0, sizeof(r));
    r.cfg = cfg;
    r.t = t;
    r.res = out;
    r.expand = kvr_sim_expand(cfg);
    r.rng = cfg->seed ^ 0x73696d756c61746fULL; /* "simulato" */
    r.sink = (struct kvr_sim_sink){on_event, &r};
    kvr_sim_sched_init(&r.sched);
    uint64_t window = n > 0 ? scaled(cfg, t->req[n - 1].arrival_us) + 1 : 1;
    rc = KVR_ENOMEM;
    if (alloc_result(out, cfg->workers, cfg->buckets ? cfg->buckets : 1) != KVR_OK ||
        kvr_sim_load_init(&r.series, cfg->workers, out->n_buckets, window) != KVR_OK ||
        kvr_sim_hasher_init(&r.hasher, t, cfg->block_size, r.expand) != KVR_OK)
        goto out;
    r.w = calloc(cfg->workers, sizeof(*r.w));
    r.rq = calloc(n ? n : 1, sizeof(*r.rq));
    r.cands = calloc(cfg->workers, sizeof(*r.cands));
    r.best = calloc(t->n ? t->n : 1, sizeof(*r.best));
    out->ttft_us = calloc(n ? n : 1, sizeof(*out->ttft_us));
    if (r.w == NULL || r.rq == NULL || r.cands == NULL || r.best == NULL || out->ttft_us == NULL)
        goto out;
    if ((rc = kvr_sim_trace_best(t, r.best)) != KVR_OK)
        goto out;
    for (uint32_t w = 0; w < cfg->workers; w++) {
        kvr_sim_lru_init(&r.w[w].lru, cfg->worker_base + w, cfg->cache_blocks);
        r.w[w].head = r.w[w].tail = NONE;
    }
    for (size_t i = 0; i < n; i++)
        r.rq[i].arrival = scaled(cfg, t->req[i].arrival_us);
    struct kvr_load_config lc = {.block_size = cfg->block_size};
    if ((rc = kvr_index_new(NULL, &r.idx)) != KVR_OK || (rc = kvr_load_new(&lc, &r.load)) != KVR_OK)
        goto out;
    rc = kvr_sim_router_new(cfg, p, r.idx, r.load, &r.router, out->error, sizeof(out->error));
    if (rc == KVR_EINVAL) { /* refused policy: reported, not fatal */
        out->ok = 0;
        rc = KVR_OK;
        goto out;
    }
    if (rc != KVR_OK)
        goto out;
    double t0 = now_s();
    rc = loop(&r);
    out->wall_s = now_s() - t0;
    out->decisions_per_s = out->wall_s > 0 ? (double)out->requests / out->wall_s : 0;
    if (rc != KVR_OK) {
        snprintf(out->error, sizeof(out->error), "simulation failed: %s", kvr_strerror(rc));
        goto out;
    }
    kvr_sim_load_finish(&r.series, r.now > window ? r.now : window);
    if ((rc = figures(&r, n)) != KVR_OK)
        goto out;
    out->ok = 1;
out:
    if (rc == KVR_ENOMEM && out->error[0] == '\0')
        snprintf(out->error, sizeof(out->error), "out of memory");
    kvr_sim_router_free(r.router);
    kvr_load_free(r.load);
    kvr_index_free(r.idx);
    if (r.w != NULL)
        for (uint32_t w = 0; w < cfg->workers; w++)
            kvr_sim_lru_free(&r.w[w].lru);
    if (r.rq != NULL)
        for (size_t i = 0; i < n; i++)
            free(r.rq[i].hashes);
    free(r.w);
    free(r.rq);
    free(r.cands);
    free(r.best);
    kvr_sim_hasher_free(&r.hasher);
    kvr_sim_sched_free(&r.sched);
    kvr_sim_load_free(&r.series);
    return rc;
}
