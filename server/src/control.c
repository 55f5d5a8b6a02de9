/* control.c - the control thread: active health checks, approximate/load expiry, graveyard
 * sweeps, periodic snapshots, and admin jobs posted by HTTP threads (see thread.h).
 *
 * Health checks: every worker with an HTTP URL gets GET {url}{health path} every interval, on a
 * keep-alive connection of the control thread's own event base, with the health timeout as the
 * connection timeout. 2xx passes; anything else (status, refused, timeout) fails. The worker's
 * thresholds (breaker.h) turn results into healthy/unhealthy; transitions are logged.
 */
#include <event2/buffer.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "kvr/err.h"
#include "policy.h"
#include "snapshots.h"
#include "thread.h"

#define TICK_MS 200
#define LOAD_EXPIRY_MS 30000
#define SWEEP_MS 5000

struct hc {
    struct srv_control *c;
    struct srv_worker *w; /* referenced */
    struct evhttp_connection *evcon;
    struct evhttp_request *req; /* in flight, or NULL */
    uint64_t next_ms;
    int seen; /* still registered at the last sync */
};

struct srv_control {
    struct srv *s;
    pthread_t tid;
    int started;
    struct event_base *base;
    struct evdns_base *dns;
    struct srv_mq mq;
    struct event *ev_tick;
    struct event *ev_snap;
    struct hc **hcs;
    size_t n_hc, cap_hc;
    uint64_t ws_version; /* registry version at the last sync */
    uint64_t next_expiry_ms;
    uint64_t next_sweep_ms;
};

struct srv *srv_control_server(struct srv_control *c)
{
    return c->s;
}

/* ==== health checks =========================================================================== */

static void hc_done(struct evhttp_request *req, void *arg)
{
    struct hc *h = arg;
    struct srv *s = h->c->s;
    h->req = NULL;
    int code = req != NULL ? evhttp_request_get_response_code(req) : 0;
    int ok = code >= 200 && code < 300;
    if (srv_worker_health_report(&s->workers, h->w, ok))
        srv_logf(s->log, ok ? SRV_LOG_INFO : SRV_LOG_WARN, "health",
                 "worker %llu (%s, %s) is now %s%s", (unsigned long long)h->w->id, h->w->url,
                 h->w->model->key, ok ? "healthy" : "UNHEALTHY",
                 ok     ? ""
                 : code ? " (bad status)"
                        : " (no answer)");
}

static void hc_free(struct hc *h)
{
    if (h->req != NULL) {
        evhttp_cancel_request(h->req);
        h->req = NULL;
    }
    if (h->evcon != NULL)
        evhttp_connection_free(h->evcon);
    srv_worker_unref(h->w);
    free(h);
}

static void hc_send(struct srv_control *c, struct hc *h)
{
    const struct srv_config *cfg = c->s->cfg;
    if (h->evcon == NULL) {
        h->evcon = evhttp_connection_base_new(c->base, c->dns, h->w->host, h->w->port);
        if (h->evcon == NULL)
            return;
        struct timeval tv = {(time_t)(cfg->health_timeout_ms / 1000),
                             (suseconds_t)(cfg->health_timeout_ms % 1000) * 1000};
        evhttp_connection_set_timeout_tv(h->evcon, &tv);
        evhttp_connection_set_retries(h->evcon, 0);
    }
    struct evhttp_request *req = evhttp_request_new(hc_done, h);
    if (req == NULL)
        return;
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host", h->w->hostport);
    char uri[600];
    snprintf(uri, sizeof(uri), "%s%s", h->w->prefix, cfg->health_path);
    h->req = req;
    if (evhttp_make_request(h->evcon, req, EVHTTP_REQ_GET, uri) != 0)
        h->req = NULL;
}

struct sync_ctx {
    struct srv_control *c;
    int oom;
};

static void sync_one(void *ctx, struct srv_worker *w)
{
    struct sync_ctx *x = ctx;
    struct srv_control *c = x->c;
    if (w->url == NULL)
        return;
    for (size_t k = 0; k < c->n_hc; k++)
        if (c->hcs[k]->w == w) {
            c->hcs[k]->seen = 1;
            return;
        }
    if (c->n_hc == c->cap_hc) {
        size_t cap = c->cap_hc ? c->cap_hc * 2 : 16;
        struct hc **v = realloc(c->hcs, cap * sizeof(*v));
        if (v == NULL) {
            x->oom = 1;
            return;
        }
        c->hcs = v;
        c->cap_hc = cap;
    }
    struct hc *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        x->oom = 1;
        return;
    }
    h->c = c;
    h->w = w;
    h->seen = 1;
    h->next_ms = srv_now_ms(); /* first check right away */
    srv_worker_ref(w);
    c->hcs[c->n_hc++] = h;
}

static void health_tick(struct srv_control *c, uint64_t now)
{
    struct srv *s = c->s;
    uint64_t v = atomic_load(&s->workers.version);
    if (v != c->ws_version) {
        for (size_t k = 0; k < c->n_hc; k++)
            c->hcs[k]->seen = 0;
        struct sync_ctx x = {c, 0};
        srv_workers_foreach(&s->workers, sync_one, &x);
        for (size_t k = 0; k < c->n_hc;) {
            if (!c->hcs[k]->seen) {
                hc_free(c->hcs[k]);
                c->hcs[k] = c->hcs[--c->n_hc];
            } else {
                k++;
            }
        }
        if (!x.oom)
            c->ws_version = v;
    }
    uint64_t every = s->cfg->health_interval_ms;
    if (every == 0)
        return;
    for (size_t k = 0; k < c->n_hc; k++) {
        struct hc *h = c->hcs[k];
        if (h->req == NULL && now >= h->next_ms) {
            h->next_ms = now + every;
            hc_send(c, h);
        }
    }
}

/* ==== timers ================================================================================== */

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct srv_control *c = arg;
    struct srv *s = c->s;
    (void)fd;
    (void)what;
    uint64_t now = srv_now_ms();
    health_tick(c, now);
    srv_policy_tick(s->policy); /* the stuck-call watchdog, --policy-dev */
    if (now >= c->next_expiry_ms) {
        size_t n = srv_models_count(&s->models);
        for (size_t k = 0; k < n; k++) {
            struct srv_model *m = srv_models_at(&s->models, k);
            if (m->approx != NULL)
                kvr_approx_expire(m->approx, now);
        }
        c->next_expiry_ms = now + 1000;
    }
    static const uint64_t load_every = LOAD_EXPIRY_MS;
    if (now >= c->next_sweep_ms) {
        srv_workers_sweep(&s->workers, now);
        size_t n = srv_models_count(&s->models);
        for (size_t k = 0; k < n; k++)
            kvr_load_expire(srv_models_at(&s->models, k)->load, now);
        c->next_sweep_ms = now + (SWEEP_MS < load_every ? SWEEP_MS : load_every);
    }
}

static void on_snapshot(evutil_socket_t fd, short what, void *arg)
{
    struct srv_control *c = arg;
    char err[256];
    (void)fd;
    (void)what;
    srv_snapshot_write(c->s, c->s->cfg->snapshot_path, NULL, NULL, err, sizeof(err));
}

/* ==== lifecycle =============================================================================== */

int srv_control_new(struct srv *s, struct srv_control **out)
{
    struct srv_control *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return KVR_ENOMEM;
    c->s = s;
    c->base = event_base_new();
    if (c->base == NULL)
        goto fail;
    c->dns = evdns_base_new(c->base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
    if (c->dns == NULL)
        c->dns = evdns_base_new(c->base, 0);
    if (srv_mq_init(&c->mq, c->base, c) != KVR_OK)
        goto fail;
    c->ev_tick = event_new(c->base, -1, EV_PERSIST, on_tick, c);
    if (c->ev_tick == NULL)
        goto fail;
    struct timeval tv = {0, TICK_MS * 1000};
    event_add(c->ev_tick, &tv);
    uint64_t period = s->cfg->snapshot_period_ms;
    if (period > 0 && s->cfg->snapshot_path != NULL) {
        c->ev_snap = event_new(c->base, -1, EV_PERSIST, on_snapshot, c);
        if (c->ev_snap == NULL)
            goto fail;
        struct timeval sp = {(time_t)(period / 1000), (suseconds_t)(period % 1000) * 1000};
        event_add(c->ev_snap, &sp);
    }
    *out = c;
    return KVR_OK;
fail:
    srv_control_free(c);
    return KVR_ENOMEM;
}

static void *control_main(void *arg)
{
    struct srv_control *c = arg;
    event_base_dispatch(c->base);
    return NULL;
}

int srv_control_start(struct srv_control *c)
{
    if (pthread_create(&c->tid, NULL, control_main, c) != 0)
        return KVR_EIO;
    c->started = 1;
    return KVR_OK;
}

static void stop_msg(void *ctx, void *arg)
{
    struct srv_control *c = ctx;
    (void)arg;
    if (!srv_mq_closing(&c->mq))
        event_base_loopexit(c->base, NULL);
}

void srv_control_stop(struct srv_control *c)
{
    if (c == NULL || !c->started)
        return;
    if (srv_mq_post(&c->mq, stop_msg, NULL) != KVR_OK)
        event_base_loopbreak(c->base);
    pthread_join(c->tid, NULL);
    c->started = 0;
}

void srv_control_free(struct srv_control *c)
{
    if (c == NULL)
        return;
    for (size_t k = 0; k < c->n_hc; k++)
        hc_free(c->hcs[k]);
    free(c->hcs);
    if (c->base != NULL) {
        if (c->mq.ev != NULL)
            srv_mq_close(&c->mq);
        if (c->ev_tick != NULL)
            event_free(c->ev_tick);
        if (c->ev_snap != NULL)
            event_free(c->ev_snap);
        if (c->dns != NULL)
            evdns_base_free(c->dns, 0);
        event_base_free(c->base);
    }
    free(c);
}

int srv_control_post(struct srv_control *c, void (*fn)(void *ctl, void *arg), void *arg)
{
    return srv_mq_post(&c->mq, fn, arg);
}

/* ==== admin jobs ============================================================================== */

struct srv_job *srv_job_new(const char *arg, size_t arg_len)
{
    struct srv_job *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    kvr_buf_init(&j->body, NULL);
    if (arg != NULL || arg_len > 0) {
        j->arg = malloc(arg_len + 1);
        if (j->arg == NULL) {
            free(j);
            return NULL;
        }
        if (arg != NULL)
            memcpy(j->arg, arg, arg_len);
        j->arg[arg_len] = '\0';
        j->arg_len = arg_len;
    }
    return j;
}

void srv_job_free(struct srv_job *j)
{
    kvr_buf_free(&j->body);
    free(j->arg);
    free(j);
}

static void job_gone(struct srv_conn_watch *w)
{
    struct srv_job *j = (struct srv_job *)((char *)w - offsetof(struct srv_job, watch));
    srv_hreq_gone(&j->h);
    j->gone = 1; /* freed when the answer comes back */
}

static void job_kill(struct srv_live *l)
{
    struct srv_job *j = (struct srv_job *)((char *)l - offsetof(struct srv_job, live));
    srv_unwatch(&j->h);
    j->h.req = NULL; /* evhttp_free releases it */
    j->gone = 1;
}

/* Bodies from this size on leave as a reference to the job's buffer (no copy on the HTTP
 * thread); the job is freed when libevent has sent them. */
#define JOB_REF_BYTES (64u << 10)

static void job_body_sent(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    srv_job_free(arg);
}

/* Replies with j->body moved into the reply (j is then owned by the output buffer). 0, or -1
 * if it could not (nothing sent; j still ours). */
static int job_reply_by_ref(struct srv_job *j)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL)
        return -1;
    if (evbuffer_add_reference(b, j->body.data, j->body.len, job_body_sent, j) != 0) {
        evbuffer_free(b);
        return -1;
    }
    srv_reply_header(&j->h, "Content-Type", "application/json");
    srv_reply_evbuf(&j->h, j->status, NULL, b); /* moves the reference out of b */
    evbuffer_free(b); /* empty now; a reference still in it would be released here */
    return 0;
}

/* Back on the requesting thread. */
static void job_answer(void *ctx, void *arg)
{
    struct srv_job *j = arg;
    (void)ctx;
    srv_live_del(&j->live);
    if (j->done != NULL)
        j->done(j->h.t, j);
    if (!j->gone && !srv_mq_closing(&j->h.t->mq)) {
        srv_unwatch(&j->h);
        if (j->status >= 400 && j->body.len == 0) {
            srv_reply_error(&j->h, j->status, "admin action failed");
        } else if (j->body.len >= JOB_REF_BYTES) {
            if (job_reply_by_ref(j) == 0)
                return; /* freed once sent */
            srv_reply_error(&j->h, 503, "out of memory");
        } else {
            srv_reply(&j->h, j->status, NULL, j->body.data, j->body.len);
        }
    }
    srv_job_free(j);
}

/* On the control thread. */
static void job_run(void *ctx, void *arg)
{
    struct srv_control *c = ctx;
    struct srv_job *j = arg;
    if (!srv_mq_closing(&c->mq))
        j->run(c, j);
    else
        j->status = 503;
    if (srv_mq_post(&j->h.t->mq, job_answer, j) != KVR_OK) {
        /* cannot answer: the HTTP thread's queue is out of memory; leak nothing we can */
        j->status = 503;
    }
}

void srv_job_submit(struct srv_hreq *h, struct srv_job *j)
{
    struct srv_thread *t = h->t;
    j->h = *h;
    j->live.kill = job_kill;
    j->watch.gone = job_gone;
    if (srv_control_post(t->srv->ctl, job_run, j) != KVR_OK) {
        srv_job_free(j);
        srv_reply_error(h, 503, "out of memory");
        return;
    }
    srv_live_add(t, &j->live);
    srv_watch(&j->h, &j->watch);
    h->req = NULL; /* the job answers */
}
