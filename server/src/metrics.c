/* metrics.c - GET /metrics (Prometheus text), GET /healthz, GET /readyz, GET /v1/models.
 *
 * Families (all prefixed kvrouter_): per-thread counters and histograms are summed at scrape
 * time; per-worker, per-model and per-source values come from their objects. The full list with
 * types and labels is in docs/SERVER.md ("Metrics").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "clock.h"
#include "jsonw.h"
#include "kvr/err.h"
#include "kvr/event_msgpack.h"
#include "kvr/kv_subscriber.h"
#include "nats_events.h"
#include "policy.h"
#include "replica.h"
#include "prom.h"
#include "server.h"

static uint64_t sum_threads(struct srv *s, size_t offset)
{
    uint64_t acc = 0;
    for (uint32_t k = 0; k < s->n_threads; k++)
        acc += srv_stat_get((const _Atomic uint64_t *)((const char *)&s->threads[k].st + offset));
    return acc;
}

#define SUM(s, field) sum_threads((s), offsetof(struct srv_tstats, field))

static void hist_sum(struct srv *s, size_t offset, struct srv_hist_snap *out)
{
    memset(out, 0, sizeof(*out));
    for (uint32_t k = 0; k < s->n_threads; k++)
        srv_hist_read((const struct srv_hist *)((const char *)&s->threads[k].st + offset), out);
}

static void counter(struct srv_prom *p, const char *name, const char *help, uint64_t v)
{
    srv_prom_counter(p, name, help, v);
}

static void gauge(struct srv_prom *p, const char *name, const char *help, double v)
{
    srv_prom_header(p, name, "gauge", help);
    srv_prom_dbl(p, name, NULL, 0, v);
}

/* ==== per-worker families ===================================================================== */

enum wfam {
    WF_DECISIONS,
    WF_OK,
    WF_FAILED,
    WF_RETRIED,
    WF_IN_FLIGHT,
    WF_HEALTHY,
    WF_BREAKER,
    WF_BREAKER_OPENS,
    WF_HC_OK,
    WF_HC_FAILED,
};

struct wctx {
    struct srv_prom *p;
    struct srv *s;
    const char *name;
    int fam;
};

static void worker_sample(void *ctx, struct srv_worker *w)
{
    struct wctx *c = ctx;
    char id[24];
    snprintf(id, sizeof(id), "%llu", (unsigned long long)w->id);
    struct srv_prom_label l[2] = {{"model", w->model->key}, {"worker_id", id}};
    uint64_t v = 0;
    switch (c->fam) {
    case WF_DECISIONS:
        v = atomic_load(&w->decisions);
        break;
    case WF_OK:
        v = atomic_load(&w->ok);
        break;
    case WF_FAILED:
        v = atomic_load(&w->failed);
        break;
    case WF_RETRIED:
        v = atomic_load(&w->retried);
        break;
    case WF_IN_FLIGHT:
        v = atomic_load(&w->in_flight);
        break;
    case WF_HEALTHY:
        v = atomic_load(&w->health_state) == SRV_HEALTH_HEALTHY;
        break;
    case WF_BREAKER:
        pthread_mutex_lock(&w->mu);
        v = (uint64_t)srv_breaker_state(&w->breaker, &c->s->workers.brk, srv_now_ms());
        pthread_mutex_unlock(&w->mu);
        break;
    case WF_BREAKER_OPENS:
        pthread_mutex_lock(&w->mu);
        v = w->breaker.opens;
        pthread_mutex_unlock(&w->mu);
        break;
    case WF_HC_OK:
        v = atomic_load(&w->hc_ok);
        break;
    case WF_HC_FAILED:
        v = atomic_load(&w->hc_failed);
        break;
    }
    srv_prom_u64(c->p, c->name, l, 2, v);
}

static void worker_family(struct srv_prom *p, struct srv *s, const char *name, const char *type,
                          const char *help, int fam)
{
    struct wctx c = {p, s, name, fam};
    srv_prom_header(p, name, type, help);
    srv_workers_foreach(&s->workers, worker_sample, &c);
}

/* KV-event subscriber sources */
struct sctx {
    struct srv_prom *p;
    const char *name;
    size_t field; /* offset in struct kvr_kvsub_stats */
};

static void source_sample(void *ctx, struct srv_worker *w)
{
    struct sctx *c = ctx;
    struct srv_model *m = w->model;
    for (size_t k = 0; k < w->n_ranks; k++) {
        if (!w->ranks[k].subscribed || m->sub == NULL)
            continue;
        struct kvr_kvsub_stats st;
        if (kvr_kvsub_stats(m->sub, w->ranks[k].sub_id, &st) != KVR_OK)
            continue;
        char id[24], rank[16];
        snprintf(id, sizeof(id), "%llu", (unsigned long long)w->id);
        snprintf(rank, sizeof(rank), "%u", w->ranks[k].rank);
        struct srv_prom_label l[3] = {{"model", m->key}, {"worker_id", id}, {"dp_rank", rank}};
        srv_prom_u64(c->p, c->name, l, 3, *(const uint64_t *)((const char *)&st + c->field));
    }
}

static void source_family(struct srv_prom *p, struct srv *s, const char *name, const char *help,
                          size_t field)
{
    struct sctx c = {p, name, field};
    srv_prom_header(p, name, "counter", help);
    srv_workers_foreach(&s->workers, source_sample, &c);
}

/* Per-source families with an extra label: events by kind, decode errors by kind, dialects seen,
 * the last sequence number. One pass per family over the sources (scrapes are rare). */
enum source_extra {
    SX_EVENTS,
    SX_DECODE_ERRORS,
    SX_DECODE_DIALECT,
    SX_TIERS,
    SX_DIALECTS,
    SX_LAST_SEQ
};

struct sxctx {
    struct srv_prom *p;
    const char *name;
    enum source_extra what;
};

static void source_extra_sample(void *ctx, struct srv_worker *w)
{
    static const char *const kinds[4] = {"other", "stored", "removed", "cleared"};
    static const char *const dialects[3] = {"A", "B", "C"};
    struct sxctx *c = ctx;
    struct srv_model *m = w->model;
    for (size_t k = 0; k < w->n_ranks; k++) {
        if (!w->ranks[k].subscribed || m->sub == NULL)
            continue;
        struct kvr_kvsub_stats st;
        if (kvr_kvsub_stats(m->sub, w->ranks[k].sub_id, &st) != KVR_OK)
            continue;
        char id[24], rank[16];
        snprintf(id, sizeof(id), "%llu", (unsigned long long)w->id);
        snprintf(rank, sizeof(rank), "%u", w->ranks[k].rank);
        struct srv_prom_label l[4] = {
            {"model", m->key}, {"worker_id", id}, {"dp_rank", rank}, {NULL, NULL}};
        switch (c->what) {
        case SX_EVENTS:
            for (int e = 1; e < 4; e++) {
                l[3].name = "kind";
                l[3].value = kinds[e];
                srv_prom_u64(c->p, c->name, l, 4, st.events[e]);
            }
            break;
        case SX_DECODE_ERRORS:
            for (int e = 1; e < KVR_EMP_E_COUNT_; e++) {
                l[3].name = "kind";
                l[3].value = kvr_emp_error_name(e);
                srv_prom_u64(c->p, c->name, l, 4, st.dec.errors[e]);
            }
            break;
        case SX_DECODE_DIALECT: {
            /* failed_by_dialect: [0] before any dialect could be told, [1..3] A, B, C */
            static const char *const fd[4] = {"unknown", "A", "B", "C"};
            for (int d = 0; d < 4; d++) {
                l[3].name = "dialect";
                l[3].value = fd[d];
                srv_prom_u64(c->p, c->name, l, 4, st.dec.failed_by_dialect[d]);
            }
            break;
        }
        case SX_TIERS:
            for (int t = 0; t < KVR_TIER_COUNT_; t++) {
                l[3].name = "tier";
                l[3].value = kvr_tier_name(t);
                srv_prom_u64(c->p, c->name, l, 4, st.conv.tier[t]);
            }
            break;
        case SX_DIALECTS:
            for (int d = 0; d < 3; d++) {
                l[3].name = "dialect";
                l[3].value = dialects[d];
                srv_prom_u64(c->p, c->name, l, 4, (st.dialects >> d) & 1u);
            }
            break;
        case SX_LAST_SEQ:
            if (st.has_seq)
                srv_prom_u64(c->p, c->name, l, 3, st.last_seq);
            break;
        }
    }
}

static void source_extra_family(struct srv_prom *p, struct srv *s, const char *name,
                                const char *type, const char *help, enum source_extra what)
{
    struct sxctx c = {p, name, what};
    srv_prom_header(p, name, type, help);
    srv_workers_foreach(&s->workers, source_extra_sample, &c);
}

/* ==== per-model families ====================================================================== */

static void model_families(struct srv_prom *p, struct srv *s)
{
    size_t n = srv_models_count(&s->models);
    struct kvr_index_stats *st = calloc(n ? n : 1, sizeof(*st));
    if (st == NULL) {
        p->err = KVR_ENOMEM;
        return;
    }
    for (size_t k = 0; k < n; k++)
        kvr_index_stats(srv_models_at(&s->models, k)->index, &st[k]);
    static const char *const kinds[4] = {"other", "stored", "removed", "cleared"};
    srv_prom_header(p, "kvrouter_index_events_total", "counter",
                    "KV events applied to a model's index (ZMQ and HTTP), by kind.");
    for (size_t k = 0; k < n; k++)
        for (int e = 1; e < 4; e++) {
            struct srv_prom_label l[2] = {{"model", srv_models_at(&s->models, k)->key},
                                          {"kind", kinds[e]}};
            srv_prom_u64(p, "kvrouter_index_events_total", l, 2, st[k].counters.events[e]);
        }
    srv_prom_header(p, "kvrouter_index_event_errors_total", "counter",
                    "KV events (or blocks) the index rejected, by error kind.");
    for (size_t k = 0; k < n; k++) {
        const struct kvr_index_counters *c = &st[k].counters;
        const char *names[] = {"ParentBlockNotFound", "BlockNotFound",    "InvalidBlockSequence",
                               "AllocationFailed",    "CapacityOmission", "Other"};
        uint64_t v[] = {c->err_parent, c->err_block,    c->err_invalid_seq,
                        c->err_nomem,  c->err_capacity, c->err_other};
        for (int e = 0; e < 6; e++) {
            struct srv_prom_label l[2] = {{"model", srv_models_at(&s->models, k)->key},
                                          {"error", names[e]}};
            srv_prom_u64(p, "kvrouter_index_event_errors_total", l, 2, v[e]);
        }
    }
    struct {
        const char *name, *type, *help;
        size_t which;
    } fams[] = {
        {"kvrouter_index_blocks", "gauge", "Blocks in the model's radix tree.", 0},
        {"kvrouter_index_block_ranks", "gauge", "(block, rank) ownership entries.", 1},
        {"kvrouter_index_nodes", "gauge", "Radix tree nodes.", 2},
        {"kvrouter_index_ranks", "gauge", "Ranks known to the index.", 3},
        {"kvrouter_index_bytes", "gauge", "Bytes held by the index.", 4},
        {"kvrouter_index_queries_total", "counter", "Prefix queries answered.", 5},
        {"kvrouter_index_non_device_events_total", "counter",
         "Events of another storage tier (not in the device index).", 6},
    };
    for (size_t f = 0; f < sizeof(fams) / sizeof(fams[0]); f++) {
        srv_prom_header(p, fams[f].name, fams[f].type, fams[f].help);
        for (size_t k = 0; k < n; k++) {
            struct srv_prom_label l[1] = {{"model", srv_models_at(&s->models, k)->key}};
            uint64_t v = 0;
            switch (fams[f].which) {
            case 0:
                v = st[k].radix.blocks ? st[k].radix.blocks : st[k].ckf.blocks;
                break;
            case 1:
                v = st[k].radix.block_ranks;
                break;
            case 2:
                v = st[k].radix.nodes;
                break;
            case 3:
                v = st[k].radix.ranks;
                break;
            case 4:
                v = st[k].radix.bytes + st[k].ckf.filter_bytes + st[k].ckf.exact_bytes;
                break;
            case 5:
                v = st[k].counters.queries;
                break;
            default:
                v = st[k].counters.non_device;
            }
            srv_prom_u64(p, fams[f].name, l, 1, v);
        }
    }
    free(st);

    srv_prom_header(p, "kvrouter_route_decisions_total", "counter", "Routing decisions, by model.");
    for (size_t k = 0; k < n; k++) {
        struct srv_model *m = srv_models_at(&s->models, k);
        struct srv_prom_label l[1] = {{"model", m->key}};
        srv_prom_u64(p, "kvrouter_route_decisions_total", l, 1, atomic_load(&m->route_decisions));
    }
    srv_prom_header(p, "kvrouter_kv_batches_total", "counter",
                    "KV-event batches applied from ZMQ, by model.");
    for (size_t k = 0; k < n; k++) {
        struct srv_model *m = srv_models_at(&s->models, k);
        struct srv_prom_label l[1] = {{"model", m->key}};
        srv_prom_u64(p, "kvrouter_kv_batches_total", l, 1, atomic_load(&m->sink_batches));
    }
    srv_prom_header(p, "kvrouter_http_events_applied_total", "counter",
                    "Events applied from POST /v1/events, by model.");
    for (size_t k = 0; k < n; k++) {
        struct srv_model *m = srv_models_at(&s->models, k);
        struct srv_prom_label l[1] = {{"model", m->key}};
        srv_prom_u64(p, "kvrouter_http_events_applied_total", l, 1, atomic_load(&m->http_events));
    }

    /* load (ActiveSequences) per rank */
    const char *lnames[3] = {"kvrouter_load_active_requests", "kvrouter_load_prefill_tokens",
                             "kvrouter_load_decode_blocks"};
    const char *lhelp[3] = {"Requests booked on a rank and not yet freed.",
                            "Active prefill tokens of a rank (requests before their first token).",
                            "Active decode blocks of a rank (unique blocks of its requests)."};
    for (int f = 0; f < 3; f++) {
        srv_prom_header(p, lnames[f], "gauge", lhelp[f]);
        for (size_t k = 0; k < n; k++) {
            struct srv_model *m = srv_models_at(&s->models, k);
            struct kvr_load_rank lr[256];
            size_t nr = 0;
            kvr_load_ranks(m->load, lr, 256, &nr);
            if (nr > 256)
                nr = 256;
            for (size_t r = 0; r < nr; r++) {
                char id[24], rank[16];
                snprintf(id, sizeof(id), "%llu", (unsigned long long)lr[r].worker_id);
                snprintf(rank, sizeof(rank), "%u", lr[r].dp_rank);
                struct srv_prom_label l[3] = {
                    {"model", m->key}, {"worker_id", id}, {"dp_rank", rank}};
                uint64_t v = f == 0   ? lr[r].requests
                             : f == 1 ? lr[r].prefill_tokens
                                      : lr[r].active_blocks;
                srv_prom_u64(p, lnames[f], l, 3, v);
            }
        }
    }
    srv_prom_header(p, "kvrouter_load_expired_total", "counter",
                    "Booked requests force-freed after 300 s without a release.");
    for (size_t k = 0; k < n; k++) {
        struct srv_model *m = srv_models_at(&s->models, k);
        struct kvr_load_stats ls;
        kvr_load_stats(m->load, &ls);
        struct srv_prom_label l[1] = {{"model", m->key}};
        srv_prom_u64(p, "kvrouter_load_expired_total", l, 1, ls.expired);
    }
    const char *anames[3] = {"kvrouter_approx_blocks", "kvrouter_approx_expired_blocks_total",
                             "kvrouter_approx_pruned_blocks_total"};
    const char *atypes[3] = {"gauge", "counter", "counter"};
    const char *ahelp[3] = {"(block, rank) pairs tracked by approximate mode.",
                            "Approximate-mode blocks removed by their TTL.",
                            "Approximate-mode blocks removed by the size limit."};
    for (int f = 0; f < 3; f++) {
        srv_prom_header(p, anames[f], atypes[f], ahelp[f]);
        for (size_t k = 0; k < n; k++) {
            struct srv_model *m = srv_models_at(&s->models, k);
            if (m->approx == NULL)
                continue;
            struct kvr_approx_stats as;
            kvr_approx_stats(m->approx, &as);
            struct srv_prom_label l[1] = {{"model", m->key}};
            srv_prom_u64(p, anames[f], l, 1,
                         f == 0   ? as.tracked
                         : f == 1 ? as.expired_blocks
                                  : as.pruned_blocks);
        }
    }
}

/* ==== GET /metrics ============================================================================ */

void srv_api_metrics(struct srv_hreq *h)
{
    struct srv *s = h->t->srv;
    struct kvr_buf *o = &h->t->out;
    struct srv_prom p;
    kvr_buf_reset(o);
    srv_prom_init(&p, o);

    srv_prom_header(&p, "kvrouter_http_requests_total", "counter",
                    "HTTP requests answered, by route and status (499: the client left).");
    for (int r = 0; r < SRV_R_COUNT_; r++)
        for (int c = 0; c < SRV_NCODES; c++) {
            uint64_t v = 0;
            for (uint32_t k = 0; k < s->n_threads; k++)
                v += srv_stat_get(&s->threads[k].st.req[r][c]);
            if (v == 0)
                continue;
            struct srv_prom_label l[2] = {{"route", srv_route_name(r)}, {"code", srv_code_name(c)}};
            srv_prom_u64(&p, "kvrouter_http_requests_total", l, 2, v);
        }
    srv_prom_header(&p, "kvrouter_http_request_duration_seconds", "histogram",
                    "Time from request arrival to the end of the reply, by route.");
    for (int r = 0; r < SRV_R_COUNT_; r++) {
        struct srv_hist_snap hs;
        memset(&hs, 0, sizeof(hs));
        for (uint32_t k = 0; k < s->n_threads; k++)
            srv_hist_read(&s->threads[k].st.lat[r], &hs);
        uint64_t total = 0;
        for (size_t b = 0; b <= srv_hist_latency()->n; b++)
            total += hs.count[b];
        if (total == 0)
            continue;
        struct srv_prom_label l[1] = {{"route", srv_route_name(r)}};
        srv_prom_hist(&p, "kvrouter_http_request_duration_seconds", l, 1, srv_hist_latency(), &hs);
    }
    uint64_t conns = 0, inflight = 0;
    for (uint32_t k = 0; k < s->n_threads; k++) {
        conns += atomic_load(&s->threads[k].n_conns);
        inflight += atomic_load(&s->threads[k].inflight);
    }
    gauge(&p, "kvrouter_http_connections", "Open client connections.", (double)conns);
    gauge(&p, "kvrouter_http_requests_in_flight", "Requests not yet answered.", (double)inflight);
    counter(&p, "kvrouter_http_connections_accepted_total", "Client connections accepted.",
            SUM(s, conns_accepted));
    counter(&p, "kvrouter_http_accept_pauses_total",
            "Times a thread paused accepting at the connection cap.", SUM(s, accept_pauses));
    counter(&p, "kvrouter_http_slow_clients_total",
            "Connections closed (408) because a request's headers or body did not arrive within "
            "--header-timeout / --body-timeout.",
            SUM(s, slow_clients));

    counter(&p, "kvrouter_route_no_worker_total",
            "Routing requests with no registered or eligible worker (503).",
            SUM(s, route_no_worker));
    counter(&p, "kvrouter_approx_recorded_total",
            "Routing decisions recorded into an approximate-mode index.", SUM(s, approx_recorded));
    struct srv_hist_snap hs;
    srv_prom_header(&p, "kvrouter_route_overlap_blocks", "histogram",
                    "Overlap (cached blocks) of the chosen worker per routing decision.");
    hist_sum(s, offsetof(struct srv_tstats, overlap), &hs);
    srv_prom_hist(&p, "kvrouter_route_overlap_blocks", NULL, 0, srv_hist_blocks(), &hs);
    srv_prom_header(&p, "kvrouter_route_hit_ratio", "histogram",
                    "Overlap / request blocks of the chosen worker per routing decision.");
    hist_sum(s, offsetof(struct srv_tstats, hit_ratio), &hs);
    srv_prom_hist(&p, "kvrouter_route_hit_ratio", NULL, 0, srv_hist_ratio(), &hs);
    srv_prom_header(&p, "kvrouter_route_decision_duration_seconds", "histogram",
                    "Time to decide (candidates, index query, load, policy).");
    hist_sum(s, offsetof(struct srv_tstats, decision), &hs);
    srv_prom_hist(&p, "kvrouter_route_decision_duration_seconds", NULL, 0, srv_hist_latency(), &hs);

    counter(&p, "kvrouter_policy_decisions_total", "Policy calls.", SUM(s, policy_calls));
    counter(&p, "kvrouter_policy_fallbacks_total",
            "Decisions made by the built-in policy after a policy failure.",
            SUM(s, policy_fallbacks));
    counter(&p, "kvrouter_policy_errors_total", "Policy calls that raised an error.",
            SUM(s, policy_errors));
    counter(&p, "kvrouter_policy_timeouts_total", "Policy calls over their time budget.",
            SUM(s, policy_timeouts));
    srv_policy_metrics(s->policy, &p);
    srv_replica_metrics(s->replica, &p);
    srv_nats_events_metrics(s->nats_events, &p);
    if (s->cfg->peers != NULL) {
        srv_prom_header(&p, "kvrouter_bootstrap_dump_events", "gauge",
                        "Events applied from a peer's dump at start (--peers).");
        srv_prom_u64(&p, "kvrouter_bootstrap_dump_events", NULL, 0, atomic_load(&s->boot_events));
    }

    counter(&p, "kvrouter_proxy_attempts_total", "Requests sent to workers (retries included).",
            SUM(s, proxy_attempts));
    counter(&p, "kvrouter_proxy_retries_total",
            "Retries after a failure before the first byte reached the client.",
            SUM(s, proxy_retries));
    counter(&p, "kvrouter_proxy_streams_total", "Responses streamed through (SSE or chunked).",
            SUM(s, proxy_streams));
    counter(&p, "kvrouter_proxy_client_disconnects_total",
            "Proxied requests whose client left before the end.", SUM(s, proxy_client_gone));
    counter(&p, "kvrouter_proxy_backpressure_pauses_total",
            "Times a stream stopped reading its worker until a slow client caught up.",
            SUM(s, proxy_pauses));
    srv_prom_header(&p, "kvrouter_proxy_upstream_errors_total", "counter",
                    "Worker failures, by kind.");
    for (int e = 0; e < SRV_UPERR_COUNT_; e++) {
        uint64_t v = 0;
        for (uint32_t k = 0; k < s->n_threads; k++)
            v += srv_stat_get(&s->threads[k].st.upstream_errors[e]);
        struct srv_prom_label l[1] = {{"kind", srv_uperr_name(e)}};
        srv_prom_u64(&p, "kvrouter_proxy_upstream_errors_total", l, 1, v);
    }
    srv_prom_header(&p, "kvrouter_proxy_ttft_seconds", "histogram",
                    "Time from sending to a worker to its first body byte.");
    hist_sum(s, offsetof(struct srv_tstats, ttft), &hs);
    srv_prom_hist(&p, "kvrouter_proxy_ttft_seconds", NULL, 0, srv_hist_latency(), &hs);
    srv_prom_header(&p, "kvrouter_proxy_upstream_duration_seconds", "histogram",
                    "Time from sending to a worker to the end of its response.");
    hist_sum(s, offsetof(struct srv_tstats, upstream), &hs);
    srv_prom_hist(&p, "kvrouter_proxy_upstream_duration_seconds", NULL, 0, srv_hist_latency(), &hs);
    srv_prom_header(&p, "kvrouter_tokenize_total", "counter",
                    "Text prompts tokenized, by source and result.");
    {
        struct srv_prom_label l1[2] = {{"source", "worker"}, {"result", "ok"}};
        struct srv_prom_label l2[2] = {{"source", "worker"}, {"result", "failed"}};
        struct srv_prom_label l3[2] = {{"source", "bytes"}, {"result", "ok"}};
        srv_prom_u64(&p, "kvrouter_tokenize_total", l1, 2, SUM(s, tokenize_worker_ok));
        srv_prom_u64(&p, "kvrouter_tokenize_total", l2, 2, SUM(s, tokenize_worker_failed));
        srv_prom_u64(&p, "kvrouter_tokenize_total", l3, 2, SUM(s, tokenize_bytes));
    }
    srv_prom_header(&p, "kvrouter_http_events_total", "counter",
                    "Events received on POST /v1/events, by result.");
    {
        struct srv_prom_label l1[1] = {{"result", "applied"}};
        struct srv_prom_label l2[1] = {{"result", "rejected"}};
        srv_prom_u64(&p, "kvrouter_http_events_total", l1, 1, SUM(s, events_applied));
        srv_prom_u64(&p, "kvrouter_http_events_total", l2, 1, SUM(s, events_rejected));
    }
    srv_prom_header(&p, "kvrouter_control_jobs_total", "counter",
                    "Requests whose work ran on the control thread so the HTTP thread kept "
                    "serving, by kind (large /v1/events bodies, /dump; admin actions are not "
                    "counted here).");
    {
        struct srv_prom_label l1[1] = {{"kind", "events"}};
        struct srv_prom_label l2[1] = {{"kind", "dump"}};
        srv_prom_u64(&p, "kvrouter_control_jobs_total", l1, 1, SUM(s, jobs_events));
        srv_prom_u64(&p, "kvrouter_control_jobs_total", l2, 1, SUM(s, jobs_dump));
    }

    model_families(&p, s);

    worker_family(&p, s, "kvrouter_worker_decisions_total", "counter",
                  "Routing decisions that chose the worker.", WF_DECISIONS);
    worker_family(&p, s, "kvrouter_worker_requests_ok_total", "counter",
                  "Proxied requests the worker completed.", WF_OK);
    worker_family(&p, s, "kvrouter_worker_requests_failed_total", "counter",
                  "Proxied attempts that failed on the worker (connect, timeout, 5xx).", WF_FAILED);
    worker_family(&p, s, "kvrouter_worker_retries_total", "counter",
                  "Attempts on the worker retried elsewhere.", WF_RETRIED);
    worker_family(&p, s, "kvrouter_worker_in_flight", "gauge",
                  "Proxied requests in progress on the worker.", WF_IN_FLIGHT);
    worker_family(&p, s, "kvrouter_worker_healthy", "gauge",
                  "1 if the worker passes its active health checks.", WF_HEALTHY);
    worker_family(&p, s, "kvrouter_worker_breaker_state", "gauge",
                  "Circuit breaker: 0 closed, 1 half-open, 2 open.", WF_BREAKER);
    worker_family(&p, s, "kvrouter_worker_breaker_opens_total", "counter",
                  "Times the worker's circuit breaker opened.", WF_BREAKER_OPENS);
    worker_family(&p, s, "kvrouter_worker_health_checks_ok_total", "counter",
                  "Active health checks passed.", WF_HC_OK);
    worker_family(&p, s, "kvrouter_worker_health_checks_failed_total", "counter",
                  "Active health checks failed.", WF_HC_FAILED);

    source_family(&p, s, "kvrouter_kv_source_batches_total",
                  "KV-event batches delivered by a ZMQ source (live and replayed).",
                  offsetof(struct kvr_kvsub_stats, batches));
    source_family(&p, s, "kvrouter_kv_source_gaps_total", "Sequence gaps detected.",
                  offsetof(struct kvr_kvsub_stats, gaps));
    source_family(&p, s, "kvrouter_kv_source_lost_batches_total",
                  "Batches never received (gap without successful replay).",
                  offsetof(struct kvr_kvsub_stats, lost_batches));
    source_family(&p, s, "kvrouter_kv_source_decode_errors_total",
                  "Batches the msgpack decoder rejected.",
                  offsetof(struct kvr_kvsub_stats, decode_errors));
    source_family(&p, s, "kvrouter_kv_source_restarts_total",
                  "Publisher restarts (sequence went back, or the stream did not continue after a "
                  "reconnect); the rank was cleared.",
                  offsetof(struct kvr_kvsub_stats, restarts));
    source_family(&p, s, "kvrouter_kv_source_disconnects_total",
                  "Connections to the publisher lost (socket monitor; heartbeat timeouts too).",
                  offsetof(struct kvr_kvsub_stats, disconnects));
    source_family(&p, s, "kvrouter_kv_source_restart_probes_total",
                  "Reconnect probes sent to the replay endpoint (same publisher or a restart?).",
                  offsetof(struct kvr_kvsub_stats, restart_probes));
    source_family(&p, s, "kvrouter_kv_source_replay_requests_total",
                  "Replay requests sent to the worker's replay socket after a gap.",
                  offsetof(struct kvr_kvsub_stats, replay_requests));
    source_family(&p, s, "kvrouter_kv_source_replayed_batches_total",
                  "Batches recovered from replay replies.",
                  offsetof(struct kvr_kvsub_stats, replayed_batches));
    source_extra_family(&p, s, "kvrouter_kv_source_events_total", "counter",
                        "Index events delivered by a ZMQ source, by kind.", SX_EVENTS);
    source_extra_family(&p, s, "kvrouter_kv_source_decode_errors_by_kind_total", "counter",
                        "Batches the msgpack decoder rejected, by error kind.", SX_DECODE_ERRORS);
    source_extra_family(&p, s, "kvrouter_kv_source_decode_errors_by_dialect_total", "counter",
                        "Batches the msgpack decoder rejected, by the dialect seen before the "
                        "error (unknown: none could be told yet).",
                        SX_DECODE_DIALECT);
    source_extra_family(&p, s, "kvrouter_kv_source_tier_events_total", "counter",
                        "Stored and removed index events converted from a ZMQ source, by storage "
                        "tier (medium); only device events feed the primary index.",
                        SX_TIERS);
    source_extra_family(&p, s, "kvrouter_kv_source_dialect_seen", "gauge",
                        "1 once the source has sent a batch in this msgpack dialect "
                        "(A positional, B map events, C map batch).",
                        SX_DIALECTS);
    source_extra_family(&p, s, "kvrouter_kv_source_last_seq", "gauge",
                        "Last sequence number received from the source.", SX_LAST_SEQ);

    pthread_mutex_lock(&s->snap.mu);
    uint64_t sn_count = s->snap.count, sn_fail = s->snap.failures;
    uint64_t sn_unix = s->snap.last_unix_ms, sn_ms = s->snap.last_ms;
    uint64_t sn_bytes = s->snap.last_bytes;
    pthread_mutex_unlock(&s->snap.mu);
    counter(&p, "kvrouter_snapshot_writes_total", "Snapshots written.", sn_count);
    counter(&p, "kvrouter_snapshot_failures_total", "Snapshot writes that failed.", sn_fail);
    gauge(&p, "kvrouter_snapshot_last_success_timestamp_seconds",
          "Unix time of the last successful snapshot (0 = none).", (double)sn_unix / 1000.0);
    gauge(&p, "kvrouter_snapshot_last_duration_seconds", "Duration of the last snapshot write.",
          (double)sn_ms / 1000.0);
    gauge(&p, "kvrouter_snapshot_last_bytes", "Size of the last snapshot file.", (double)sn_bytes);

    gauge(&p, "kvrouter_uptime_seconds", "Seconds since the router started.",
          (double)(srv_now_ms() - s->start_ms) / 1000.0);
    gauge(&p, "kvrouter_threads", "HTTP threads.", (double)s->n_threads);
    srv_prom_header(&p, "kvrouter_build_info", "gauge", "Build information.");
    struct srv_prom_label bl[1] = {{"version", "0.1.0"}};
    srv_prom_u64(&p, "kvrouter_build_info", bl, 1, 1);

    if (p.err != KVR_OK) {
        kvr_buf_reset(o);
        srv_reply_error(h, 503, "out of memory while building the metrics");
        return;
    }
    srv_reply(h, 200, "text/plain; version=0.0.4; charset=utf-8", o->data, o->len);
    kvr_buf_reset(o);
}

/* ==== health, readiness, models =============================================================== */

void srv_api_healthz(struct srv_hreq *h)
{
    srv_reply(h, 200, NULL, "{\"status\":\"ok\"}", 15);
}

struct count_ctx {
    struct srv_model *m;
    uint64_t workers;
    uint64_t healthy;
};

static void count_one(void *ctx, struct srv_worker *w)
{
    struct count_ctx *c = ctx;
    if (c->m != NULL && w->model != c->m)
        return;
    c->workers++;
    c->healthy += atomic_load(&w->health_state) == SRV_HEALTH_HEALTHY;
}

void srv_api_readyz(struct srv_hreq *h)
{
    struct srv *s = h->t->srv;
    int policy_ok = srv_policy_ready(s->policy); /* no thread stuck in one policy call */
    int ready = atomic_load(&s->ready) && !atomic_load(&s->draining) && policy_ok;
    struct count_ctx c = {NULL, 0, 0};
    srv_workers_foreach(&s->workers, count_one, &c);
    const char *status = ready                            ? "ready"
                         : !policy_ok                     ? "policy_stuck"
                         : atomic_load(&s->draining)      ? "draining"
                         : atomic_load(&s->bootstrapping) ? "bootstrapping"
                                                          : "starting";
    struct srv_jw w;
    kvr_buf_reset(&h->t->out);
    srv_jw_init(&w, &h->t->out);
    srv_jw_raw(&w, "{\"status\":");
    srv_jw_cstr(&w, status);
    srv_jw_raw(&w, ",\"models\":");
    srv_jw_u64(&w, srv_models_count(&s->models));
    srv_jw_raw(&w, ",\"workers\":");
    srv_jw_u64(&w, c.workers);
    srv_jw_raw(&w, ",\"healthy_workers\":");
    srv_jw_u64(&w, c.healthy);
    if (s->replica != NULL) { /* degraded replica sync is reported, not fatal: still ready */
        srv_jw_raw(&w, ",\"replicas\":");
        srv_replica_ready_detail(s->replica, &w);
    }
    srv_jw_char(&w, '}');
    srv_reply_out(h, ready ? 200 : 503, w.err);
}

void srv_api_models(struct srv_hreq *h)
{
    struct srv *s = h->t->srv;
    struct srv_jw w;
    kvr_buf_reset(&h->t->out);
    srv_jw_init(&w, &h->t->out);
    srv_jw_raw(&w, "{\"object\":\"list\",\"data\":[");
    size_t n = srv_models_count(&s->models);
    for (size_t k = 0; k < n; k++) {
        struct srv_model *m = srv_models_at(&s->models, k);
        struct count_ctx c = {m, 0, 0};
        srv_workers_foreach(&s->workers, count_one, &c);
        if (k > 0)
            srv_jw_char(&w, ',');
        srv_jw_raw(&w, "{\"id\":");
        srv_jw_cstr(&w, m->name);
        srv_jw_raw(&w, ",\"object\":\"model\",\"created\":");
        srv_jw_u64(&w, m->created_unix);
        srv_jw_raw(&w, ",\"owned_by\":\"kvrouter\",\"root\":");
        srv_jw_cstr(&w, m->key);
        srv_jw_raw(&w, ",\"tenant\":");
        srv_jw_cstr(&w, m->tenant);
        srv_jw_raw(&w, ",\"block_size\":");
        srv_jw_u64(&w, m->block_size);
        srv_jw_raw(&w, ",\"kind\":");
        srv_jw_cstr(&w, srv_kind_name(m->kind));
        srv_jw_raw(&w, ",\"tokenizer\":");
        srv_jw_cstr(&w, srv_tokenizer_name(m->tokenizer));
        srv_jw_raw(&w, ",\"workers\":");
        srv_jw_u64(&w, c.workers);
        srv_jw_raw(&w, ",\"healthy_workers\":");
        srv_jw_u64(&w, c.healthy);
        srv_jw_char(&w, '}');
    }
    srv_jw_raw(&w, "]}");
    srv_reply_out(h, 200, w.err);
}
